//! Tier 3, `policer suggest`: a rule in monitor mode on real veth traffic
//! from a population of sources at known rates (10 to 200 pps) and two at
//! 2 000 pps; the suggestion watched from the daemon and the one from a
//! capture of the same traffic (`policer capture -w`) both keep every
//! source of the population and cut the heavy ones; the printed line is
//! accepted by `rule set`, and its dry run with `--action police` names
//! the heavy sources among the ones it would drop.

use std::{
    collections::BTreeSet,
    net::IpAddr,
    process::{Child, Command, Stdio},
    time::Duration,
};

use policer_tests::{
    daemon::{Daemon, cli, fails_with, policer_bin, succeeds},
    netns::Sandbox,
    privileged,
    traffic::{self, Flow},
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// `policer ARGS` in the daemon's namespace, in the background.
fn spawn(sb: &Sandbox, args: &[&str]) -> Child {
    Command::new("ip")
        .args(["netns", "exec", &sb.rx_ns])
        .arg(policer_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn policer")
}

fn finish(c: Child) -> (String, String) {
    let out = c.wait_with_output().expect("wait");
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(out.status.success(), "failed: {e}\n{o}");
    (o, e)
}

const HEAVY: [&str; 2] = ["198.18.9.1", "198.18.9.2"];

/// 20 sources at 10, 20, … 200 pps and the two heavy ones at 2 000.
fn flows() -> Vec<Flow> {
    let mut v: Vec<Flow> =
        (1..=20).map(|i| Flow { src: ip(&format!("198.18.1.{i}")), pps: 10.0 * i as f64, len: 64 }).collect();
    for h in HEAVY {
        v.push(Flow { src: ip(h), pps: 2000.0, len: 64 });
    }
    v
}

/// The suggestion for the rule: it saw every source, kept the population
/// (all 20 within it) and cut exactly the heavy ones; its rate is at least
/// the fastest of the population's and well under the heavy ones'.
fn check(report: &serde_json::Value, what: &str) -> String {
    let rules = report["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1, "{what}: {report:#}");
    let r = &rules[0];
    assert_eq!(r["rule"], "198.18.0.0/16", "{what}");
    assert_eq!(r["sources"], 22, "{what}: {r:#}");
    assert_eq!(r["within"], 20, "{what}: {r:#}");
    let cut: BTreeSet<&str> = r["cut"].as_array().unwrap().iter().map(|c| c["source"].as_str().unwrap()).collect();
    assert_eq!(cut, HEAVY.into_iter().collect(), "{what}: {r:#}");
    let rate = r["suggested_rate_pps"].as_u64().unwrap();
    assert!((195..=400).contains(&rate), "{what}: suggested {rate} pps: {r:#}");
    let burst = r["suggested_burst"].as_u64().unwrap();
    assert!(burst >= rate / 10 && burst < 1000, "{what}: burst {burst}: {r:#}");
    // The distribution: the median source sends 110 pps, the heavy 2 000.
    let p50 = r["peak_10s"]["p50"].as_f64().unwrap();
    assert!((100.0..=125.0).contains(&p50), "{what}: 10 s p50 {p50}: {r:#}");
    let max = r["peak_1s"]["max"].as_f64().unwrap();
    assert!((1900.0..=2400.0).contains(&max), "{what}: 1 s max {max}: {r:#}");
    assert!(r["peak_10s"]["p99.9"].as_f64().unwrap() >= 1900.0, "{what}: {r:#}");
    let observed = report["observed_s"].as_f64().unwrap();
    assert!((9.5..=11.0).contains(&observed), "{what}: observed {observed} s");
    let notes = report["notes"].as_array().unwrap();
    assert!(notes.is_empty(), "{what}: {notes:?}");
    r["command"].as_str().unwrap().to_string()
}

#[test]
fn suggest_keeps_the_population_and_cuts_the_heavy_sources() {
    if !privileged("suggest tier") {
        return;
    }
    let sb = Sandbox::new("sug");
    let _d = Daemon::attach(&sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0"]);
    succeeds(&cli(&sb, &["rule", "set", "198.18.0.0/16", "--rate", "50pps", "--burst", "10", "--action", "monitor"]));
    // Bad input is refused before anything is watched.
    fails_with(&cli(&sb, &["suggest"]), "--watch");
    fails_with(&cli(&sb, &["suggest", "--watch", "10s", "--keep", "101%"]), "--keep");
    fails_with(&cli(&sb, &["suggest", "--watch", "0s"]), "--watch");
    fails_with(&cli(&sb, &["suggest", "--pcap", "/nonexistent.pcap"]), "--config");
    fails_with(&cli(&sb, &["suggest", "--watch", "2s", "--rule", "10.0.0.0/8"]), "no rule");

    let traffic = traffic::run_bg(&sb, &flows(), Duration::from_secs(15));
    std::thread::sleep(Duration::from_millis(500));
    let dir = std::env::temp_dir().join(format!("policer-sug-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("all.pcapng").display().to_string();
    // Both at once over the same traffic: the daemon watched, and a
    // capture of every judged frame for the capture path.
    let watch = spawn(&sb, &["suggest", "--watch", "10s", "--keep", "90%", "--json"]);
    let capture = spawn(&sb, &["capture", "-w", &pcap, "--all", "--max-pps", "100000", "--duration", "10s"]);
    let (out, _) = finish(watch);
    let (_, cap_err) = finish(capture);
    let live = json(&out);
    assert!(live["from"].as_str().unwrap().contains("daemon"), "{live:#}");
    let command = check(&live, "--watch");

    // What it would have dropped: its dry run as a police rule, live, names
    // the heavy sources and no other.
    let mut args: Vec<&str> = command.split_whitespace().skip(1).collect();
    args.extend(["--action", "police", "--dry-run", "--json"]);
    let dry = json(&succeeds(&cli(&sb, &args)));
    let (sent, _) = traffic.join().unwrap();
    assert!(sent.sent.iter().all(|n| *n > 0), "{:?}", sent.sent);
    let dropped: BTreeSet<&str> =
        dry["live"]["pass_to_drop_top"].as_array().unwrap().iter().map(|s| s["source"].as_str().unwrap()).collect();
    // The heavy sources are among them. Not "only them": the dry run
    // measures a source's rate over one second from its bucket and its
    // drops, and the drops (here the 50 pps monitor rule's would-drops)
    // are counted one in 64: a population source over 50 pps reads up to
    // 64 frames a second per sampled drop off (seen: 343 pps for a 200 pps
    // source). docs/suggest.md says so.
    assert!(HEAVY.iter().all(|h| dropped.contains(h)), "{dry:#}\nlate sends: {} > 1 ms", sent.late_1ms);

    // The same from the capture, with the daemon's config file.
    assert!(cap_err.contains("0 over the rate bound"), "{cap_err}");
    let out = succeeds(&cli(&sb, &["suggest", "--pcap", &pcap, "--config", &sb.config, "--keep", "90%", "--json"]));
    let offline = json(&out);
    let offline_command = check(&offline, "--pcap");
    assert!(offline["from"].as_str().unwrap().contains("all.pcapng"));
    // Text: the table and the line.
    let text = succeeds(&cli(&sb, &["suggest", "--pcap", &pcap, "--config", &sb.config, "--keep", "90%"]));
    assert!(text.contains("over 10 s") && text.contains("cut: 198.18.9."), "{text}");
    assert!(text.lines().any(|l| l == offline_command), "{text}");

    // The printed line applies: `rule set` accepts it as printed, and the
    // rule has that rate and burst (and is still in monitor mode).
    let args: Vec<&str> = command.split_whitespace().skip(1).collect();
    succeeds(&cli(&sb, &args));
    let ls = json(&succeeds(&cli(&sb, &["rule", "ls", "--json"])));
    let rule = ls.as_array().unwrap().iter().find(|r| r["prefix"] == "198.18.0.0/16").expect("the rule").clone();
    let rate = live["rules"][0]["suggested_rate_pps"].as_u64().unwrap();
    assert_eq!(rule["burst"], live["rules"][0]["suggested_burst"], "{rule:#}");
    assert_eq!(rule["action"], "monitor");
    assert!(rule["rate"].as_str().unwrap().ends_with("pps"), "{rule:#}");
    assert!(command.contains(&format!("--rate {rate}pps")));
    let _ = std::fs::remove_dir_all(&dir);
}
