//! Scratch (not committed): are decisions lost between delta pulls?
use policer_tests::{daemon::Daemon, lapi::Lapi, netns::Sandbox};
use std::{
    fmt::Write,
    net::Ipv4Addr,
    time::{Duration, Instant},
};

fn csv(first: u32, n: u32) -> String {
    let mut s = String::from("value,duration,reason\n");
    for i in first..first + n {
        let _ = writeln!(s, "{},4h,bench", Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 16, 0, 0)) + i));
    }
    s
}

#[test]
fn delta() {
    let sb = Sandbox::new("zzl");
    let lapi = Lapi::start(&sb.rx_ns, 18_477);
    let key = lapi.bouncer_key("zz");
    let base: u32 = std::env::var("BASE").ok().and_then(|v| v.parse().ok()).unwrap_or(100_000);
    let delta: u32 = std::env::var("DELTA").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000);
    assert_eq!(lapi.import_csv(&csv(0, base), &[]), base as usize);
    std::fs::write(&sb.config, format!("[crowdsec]\nlapi_url = \"{}\"\napi_key = \"{key}\"\nupdate_frequency = \"1s\"\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"500pps\"\n", lapi.url())).unwrap();
    let d = Daemon::attach(&sb, &["--interval", "0"]);
    let t = Instant::now();
    while !d.stdout().contains(&format!("{base} decisions in force")) && t.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let n = lapi.import_csv(&csv(1_000_000, delta), &[]);
    eprintln!("imported {n}");
    std::thread::sleep(Duration::from_secs(8));
    let full = lapi.stream(&key, true);
    eprintln!("LAPI startup stream: {} new", full["new"].as_array().map_or(0, |a| a.len()));
    let list = lapi.cscli(&["decisions", "list", "-o", "json", "--limit", "0"]);
    let v: serde_json::Value = serde_json::from_str(&list).unwrap_or_default();
    let count: usize =
        v.as_array().map_or(0, |a| a.iter().map(|al| al["decisions"].as_array().map_or(0, |d| d.len())).sum());
    eprintln!("cscli decisions list: {count}");
    for l in d.stdout().lines().filter(|l| l.contains("crowdsec")) {
        eprintln!("{l}");
    }
}
