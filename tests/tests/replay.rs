//! `policer replay`: the real binary on captures this test writes (pcap and
//! pcapng, jittered timestamps, IPv4 and IPv6), checked frame for frame
//! against an exact token bucket computed on the same timestamps.

use std::{collections::BTreeMap, net::IpAddr, path::Path, process::Command};

use policer_common::rate::Rate;
use policer_tests::{
    daemon::{Daemon, cli, policer_bin, state_dir_of, succeeds},
    frame::FrameSpec,
    lapi::Proxy,
    netns::Sandbox,
    privileged, rng,
    traffic::{self, Flow, exact_admitted_at},
};
use serde_json::Value;

const SEC: u64 = 1_000_000_000;
/// The capture's first timestamp: a date, as a real capture has.
const EPOCH_NS: u64 = 1_750_000_000 * SEC;

/// One frame of the capture.
struct Captured {
    ts_ns: u64,
    frame: Vec<u8>,
    src: Option<IpAddr>,
}

/// `n` frames of `src` spaced `gap_ns` apart, each moved by up to
/// ±`jitter_ns`, from `start_ns` on.
fn flow(src: &str, gap_ns: u64, jitter_ns: u64, n: u64, seed: u64) -> Vec<Captured> {
    let src: IpAddr = src.parse().unwrap();
    let dst: IpAddr = if src.is_ipv4() { "198.19.0.1".parse().unwrap() } else { "2001:db8:ffff::1".parse().unwrap() };
    let mut state = seed;
    (0..n)
        .map(|i| {
            let j = rng(&mut state) % (2 * jitter_ns + 1);
            let ts_ns = EPOCH_NS + jitter_ns + i * gap_ns + j - jitter_ns;
            let len = 64 + (rng(&mut state) % 200) as usize;
            Captured { ts_ns, frame: FrameSpec::udp(src, dst, len).build(None), src: Some(src) }
        })
        .collect()
}

/// A heavy source at 10× the rate and an in-profile one at half of it, in
/// each family, and a few ARP frames; in time order.
fn traffic(rate_gap_ns: u64, secs: u64) -> Vec<Captured> {
    let n = |gap: u64| secs * SEC / gap;
    let (heavy, light) = (rate_gap_ns / 10, rate_gap_ns * 2);
    let mut all = Vec::new();
    all.extend(flow("192.0.2.10", heavy, heavy / 2, n(heavy), 1));
    all.extend(flow("192.0.2.20", light, light / 4, n(light), 2));
    all.extend(flow("2001:db8:1::10", heavy, heavy / 2, n(heavy), 3));
    all.extend(flow("2001:db8:2::20", light, light / 4, n(light), 4));
    let mut arp = vec![0xffu8; 6];
    arp.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0x08, 0x06]);
    arp.resize(60, 0);
    for i in 0..3 {
        all.push(Captured { ts_ns: EPOCH_NS + i * SEC / 2 + 7, frame: arp.clone(), src: None });
    }
    all.sort_by_key(|c| c.ts_ns);
    all
}

/// A pcap with nanosecond timestamps (magic a1b23c4d), Ethernet.
fn write_pcap(path: &Path, frames: &[Captured]) {
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for c in frames {
        b.extend_from_slice(&((c.ts_ns / SEC) as u32).to_le_bytes());
        b.extend_from_slice(&((c.ts_ns % SEC) as u32).to_le_bytes());
        b.extend_from_slice(&(c.frame.len() as u32).to_le_bytes());
        b.extend_from_slice(&(c.frame.len() as u32).to_le_bytes());
        b.extend_from_slice(&c.frame);
    }
    std::fs::write(path, b).unwrap();
}

/// A pcapng: a section, one Ethernet interface with nanosecond timestamps
/// (if_tsresol 9), an Enhanced Packet Block per frame.
fn write_pcapng(path: &Path, frames: &[Captured]) {
    fn block(b: &mut Vec<u8>, kind: u32, body: &[u8]) {
        let pad = (4 - body.len() % 4) % 4;
        let len = (12 + body.len() + pad) as u32;
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(&len.to_le_bytes());
        b.extend_from_slice(body);
        b.extend_from_slice(&vec![0; pad]);
        b.extend_from_slice(&len.to_le_bytes());
    }
    let mut b = Vec::new();
    let mut shb = 0x1a2b_3c4du32.to_le_bytes().to_vec();
    shb.extend_from_slice(&1u16.to_le_bytes());
    shb.extend_from_slice(&0u16.to_le_bytes());
    shb.extend_from_slice(&(-1i64).to_le_bytes());
    block(&mut b, 0x0a0d_0d0a, &shb);
    let mut idb = 1u16.to_le_bytes().to_vec();
    idb.extend_from_slice(&[0, 0]);
    idb.extend_from_slice(&65535u32.to_le_bytes());
    // if_tsresol (code 9, length 1) = 9: ns; then opt_endofopt.
    idb.extend_from_slice(&[9, 0, 1, 0, 9, 0, 0, 0, 0, 0, 0, 0]);
    block(&mut b, 1, &idb);
    for c in frames {
        let mut epb = 0u32.to_le_bytes().to_vec();
        epb.extend_from_slice(&((c.ts_ns >> 32) as u32).to_le_bytes());
        epb.extend_from_slice(&(c.ts_ns as u32).to_le_bytes());
        epb.extend_from_slice(&(c.frame.len() as u32).to_le_bytes());
        epb.extend_from_slice(&(c.frame.len() as u32).to_le_bytes());
        epb.extend_from_slice(&c.frame);
        epb.resize(20 + c.frame.len().div_ceil(4) * 4, 0);
        block(&mut b, 6, &epb);
    }
    std::fs::write(path, b).unwrap();
}

/// `policer replay ARGS`; without `--state-dir`, one that does not exist
/// (never the shared default, /var/lib/policer, whose saved sets would
/// change what is replayed).
fn replay(args: &[&str]) -> std::process::Output {
    let mut c = Command::new(policer_bin());
    c.arg("replay").args(args);
    if !args.contains(&"--state-dir") {
        c.arg("--state-dir").arg(tmp("no-state-dir"));
    }
    c.output().expect("run policer replay")
}

fn replay_json(args: &[&str]) -> Value {
    let out = replay(args);
    assert!(out.status.success(), "policer replay {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("policer-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// (frames, admitted frames, admitted bytes) of the exact bucket for each source.
fn model(frames: &[Captured], rule: &policer_common::Rule) -> BTreeMap<IpAddr, (u64, u64, u64)> {
    let mut by_src: BTreeMap<IpAddr, Vec<(u64, u32)>> = BTreeMap::new();
    for c in frames {
        if let Some(s) = c.src {
            by_src.entry(s).or_default().push((c.ts_ns - EPOCH_NS, c.frame.len() as u32));
        }
    }
    by_src
        .into_iter()
        .map(|(s, f)| {
            let (n, bytes) = exact_admitted_at(rule, f.iter().copied());
            (s, (f.len() as u64, n, bytes))
        })
        .collect()
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// Each source's admitted frames and bytes are the exact bucket's, frame
/// for frame, from a pcap and from a pcapng of the same traffic.
#[test]
fn replay_admits_what_an_exact_bucket_admits() {
    if !privileged("replay tier") {
        return;
    }
    let frames = traffic(SEC / 1000, 2);
    let rule = Rate::parse("1000pps").unwrap().rule(5).unwrap();
    let want = model(&frames, &rule);
    // The test's own check of its traffic: the heavy sources lose most,
    // the in-profile ones nothing.
    for (s, (n, admitted, _)) in &want {
        if s.to_string().ends_with("10") {
            assert!(*admitted < n / 5, "{s}: the model admits {admitted} of {n}");
        } else {
            assert_eq!(admitted, n, "{s}: in profile");
        }
    }
    let (pcap, pcapng) = (tmp("t.pcap"), tmp("t.pcapng"));
    write_pcap(&pcap, &frames);
    write_pcapng(&pcapng, &frames);
    for path in [&pcap, &pcapng] {
        let r = replay_json(&[path.to_str().unwrap(), "--rate", "1000pps", "--burst", "5", "--json", "--top", "0"]);
        assert_eq!(u(&r, "frames"), frames.len() as u64, "{}", path.display());
        assert_eq!(u(&r, "not_ip_frames"), 3);
        assert_eq!(u(&r, "sources"), 4);
        assert_eq!(u(&r, "sources_let_go"), 0);
        let got: BTreeMap<IpAddr, (u64, u64, u64)> = r["top_dropped"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["source"].as_str().unwrap().parse().unwrap(),
                    (u(s, "frames"), u(s, "admitted_frames"), u(s, "admitted_bytes")),
                )
            })
            .collect();
        assert_eq!(got, want, "{}: per source (frames, admitted, admitted bytes)", path.display());
        // The rules' lines add up their sources'; drops have their times.
        for (rule_name, family_v4) in [("0.0.0.0/0", true), ("::/0", false)] {
            let line = r["rules"].as_array().unwrap().iter().find(|l| l["rule"] == rule_name).expect("rule line");
            let (n, a) =
                want.iter().filter(|(s, _)| s.is_ipv4() == family_v4).fold((0, 0), |(n, a), (_, w)| (n + w.0, a + w.1));
            assert_eq!(
                (u(line, "frames"), u(line, "admitted_frames"), u(line, "dropped_frames")),
                (n, a, n - a),
                "{rule_name}"
            );
            assert!(u(line, "first_drop_ns") >= EPOCH_NS && u(line, "last_drop_ns") > u(line, "first_drop_ns"));
        }
        let total_admitted: u64 = want.values().map(|w| w.1).sum::<u64>() + 3;
        assert_eq!(u(&r, "admitted_frames"), total_admitted);
    }
}

/// A `monitor` rule of a config file admits everything and counts as
/// would-drop exactly what the bucket refuses; text output names the rule.
#[test]
fn replay_with_a_config_counts_monitor_would_drops() {
    if !privileged("replay tier") {
        return;
    }
    let mut frames = flow("198.51.100.7", SEC / 5000, SEC / 20000, 5000, 9);
    frames.extend(flow("192.0.2.30", SEC / 5000, SEC / 20000, 5000, 10));
    frames.sort_by_key(|c| c.ts_ns);
    let config = tmp("policer.toml");
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"198.51.100.0/24\"\nrate = \"1000pps\"\nburst = 5\naction = \"monitor\"\n\n\
         [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"2000pps\"\nburst = 10\n",
    )
    .unwrap();
    let pcap = tmp("m.pcap");
    write_pcap(&pcap, &frames);
    let r = replay_json(&[pcap.to_str().unwrap(), "--config", config.to_str().unwrap(), "--json"]);
    let mon = model(&frames[..], &Rate::parse("1000pps").unwrap().rule(5).unwrap());
    let pol = model(&frames[..], &Rate::parse("2000pps").unwrap().rule(10).unwrap());
    let (n, a, _) = mon[&"198.51.100.7".parse::<IpAddr>().unwrap()];
    let (n2, a2, _) = pol[&"192.0.2.30".parse::<IpAddr>().unwrap()];
    let line =
        |name: &str| r["rules"].as_array().unwrap().iter().find(|l| l["rule"] == name).expect("rule line").clone();
    let m = line("198.51.100.0/24");
    assert_eq!(m["action"], "monitor");
    assert_eq!((u(&m, "frames"), u(&m, "admitted_frames"), u(&m, "dropped_frames")), (n, n, 0));
    assert_eq!(u(&m, "would_drop_frames"), n - a);
    let d = line("0.0.0.0/0");
    assert_eq!((u(&d, "frames"), u(&d, "admitted_frames"), u(&d, "dropped_frames")), (n2, a2, n2 - a2));
    // Top: the policed source (dropped) before the monitored one.
    let top = r["top_dropped"].as_array().unwrap();
    assert_eq!(top[0]["source"], "192.0.2.30");
    assert_eq!(top[1]["source"], "198.51.100.7");
    let text = replay(&[pcap.to_str().unwrap(), "--config", config.to_str().unwrap()]);
    assert!(text.status.success());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("198.51.100.0/24") && text.contains("top dropped sources"), "{text}");
}

/// Bad input: a clear error, exit status 1 (no root needed: refused
/// before the program is loaded).
#[test]
fn replay_refuses_bad_input_clearly() {
    let not_capture = tmp("not-a-capture");
    std::fs::write(&not_capture, "hello\n").unwrap();
    let classes = tmp("classes.toml");
    std::fs::write(&classes, "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = 53\n")
        .unwrap();
    let empty_pcap = tmp("sll3.pcap");
    let mut b = 0xa1b2_c3d4u32.to_le_bytes().to_vec();
    b.extend_from_slice(&[2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0]);
    b.extend_from_slice(&105u32.to_le_bytes()); // IEEE 802.11
    std::fs::write(&empty_pcap, b).unwrap();
    let p = |x: &std::path::PathBuf| x.to_str().unwrap().to_string();
    for (args, want) in [
        (vec![p(&not_capture), "--rate".into(), "1kpps".into()], "neither pcap nor pcapng"),
        (vec![p(&empty_pcap), "--rate".into(), "1kpps".into()], "only Ethernet and Linux cooked"),
        (vec![p(&not_capture)], "give --config FILE with rules, or --rate"),
        (vec![p(&not_capture), "--burst".into(), "5".into()], "--burst needs --rate"),
        (vec![p(&not_capture), "--config".into(), p(&classes)], "neither pcap nor pcapng"),
        (vec!["/nonexistent.pcap".into(), "--rate".into(), "1kpps".into()], "cannot read /nonexistent.pcap"),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = replay(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// An exact token bucket, the test's own (not policer-common's): the
/// reverse leaky bucket of the design (docs/design.md) on whole
/// nanoseconds, for rates that divide a second exactly. A source's first
/// frame finds its bucket full; a frame is admitted when the debt it leaves
/// (the time the bucket owes, `tat - now`) is at most `burst` intervals.
fn gcra(rate_pps: u64, burst: u64, times: impl Iterator<Item = u64>) -> u64 {
    assert_eq!(1_000_000_000 % rate_pps, 0, "the model takes exact intervals");
    let t = 1_000_000_000 / rate_pps;
    let mut tat: Option<u64> = None;
    let mut admitted = 0;
    for now in times {
        let debt = tat.map_or(0, |tat| tat.saturating_sub(now));
        if debt + t <= burst * t {
            tat = Some(now + debt + t);
            admitted += 1;
        }
    }
    admitted
}

/// `n` frames from `src` spaced `gap_ns` (jittered ±`jitter_ns`), each made
/// by `frame`.
fn flow_of(
    src: &str,
    gap_ns: u64,
    jitter_ns: u64,
    n: u64,
    seed: u64,
    frame: impl Fn(IpAddr) -> Vec<u8>,
) -> Vec<Captured> {
    let src: IpAddr = src.parse().unwrap();
    let mut state = seed;
    (0..n)
        .map(|i| {
            let j = rng(&mut state) % (2 * jitter_ns + 1);
            Captured { ts_ns: EPOCH_NS + jitter_ns + i * gap_ns + j - jitter_ns, frame: frame(src), src: Some(src) }
        })
        .collect()
}

fn dst(src: IpAddr) -> IpAddr {
    if src.is_ipv4() { "198.19.0.1".parse().unwrap() } else { "2001:db8:ffff::1".parse().unwrap() }
}

fn dns(src: IpAddr) -> Vec<u8> {
    FrameSpec::udp_to(src, dst(src), 90, 53).build(None)
}

fn other(src: IpAddr) -> Vec<u8> {
    FrameSpec::udp_to(src, dst(src), 120, 9).build(None)
}

fn by_source(r: &Value) -> BTreeMap<IpAddr, (u64, u64, String)> {
    r["top_dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["source"].as_str().unwrap().parse().unwrap(),
                (u(s, "frames"), u(s, "admitted_frames"), s["rule"].as_str().unwrap_or("-").to_string()),
            )
        })
        .collect()
}

/// A config with a traffic class (UDP to port 53, per family): a heavy
/// source at 10× the default rate, in-profile sources, and a DNS flood
/// at 10× the class's rate, in IPv4 and IPv6, jittered: each source's
/// admitted frames are the test's own exact bucket's, frame for frame, and
/// the class rule's line is named as `rule ls` names it.
#[test]
fn replay_with_classes_is_exact_per_source_and_rule() {
    if !privileged("replay tier") {
        return;
    }
    let ms = SEC / 1000;
    let mut frames = Vec::new();
    // Default rules: 1000 pps, burst 5 (1 ms apart); class: 500 pps, burst 10.
    frames.extend(flow_of("192.0.2.10", ms / 10, ms / 20, 20_000, 1, other));
    frames.extend(flow_of("192.0.2.20", 2 * ms, ms / 2, 1_000, 2, other));
    frames.extend(flow_of("2001:db8:1::10", ms / 10, ms / 20, 20_000, 3, other));
    frames.extend(flow_of("2001:db8:2::20", 2 * ms, ms / 2, 1_000, 4, other));
    frames.extend(flow_of("203.0.113.53", ms / 5, ms / 10, 10_000, 5, dns));
    frames.extend(flow_of("2001:db8:53::53", ms / 5, ms / 10, 10_000, 6, dns));
    // An in-profile DNS client: its class bucket never runs dry.
    frames.extend(flow_of("192.0.2.30", 4 * ms, ms, 500, 7, dns));
    frames.sort_by_key(|c| c.ts_ns);
    let config = tmp("classes-exact.toml");
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1000pps\"\nburst = 5\n\n\
         [[rule]]\nprefix = \"::/0\"\nrate = \"1000pps\"\nburst = 5\n\n\
         [[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\ndport = 53\nrate = \"500pps\"\nburst = 10\n\n\
         [[rule]]\nprefix = \"::/0\"\nproto = \"udp\"\ndport = 53\nrate = \"500pps\"\nburst = 10\n",
    )
    .unwrap();
    let pcap = tmp("classes-exact.pcap");
    write_pcap(&pcap, &frames);
    let r = replay_json(&[pcap.to_str().unwrap(), "--config", config.to_str().unwrap(), "--json", "--top", "0"]);
    let got = by_source(&r);
    let mut class_rules = std::collections::BTreeSet::new();
    for (src, (n, admitted, rule)) in &got {
        let mine: Vec<u64> = frames.iter().filter(|c| c.src == Some(*src)).map(|c| c.ts_ns).collect();
        let is_dns = matches!(src.to_string().as_str(), "203.0.113.53" | "2001:db8:53::53" | "192.0.2.30");
        let want = if is_dns { gcra(500, 10, mine.iter().copied()) } else { gcra(1000, 5, mine.iter().copied()) };
        assert_eq!((*n, *admitted), (mine.len() as u64, want), "{src} (rule {rule})");
        if is_dns {
            assert!(rule.contains("udp") && rule.contains("53"), "{src}: judged by {rule}, not the class");
            class_rules.insert(rule.clone());
        } else {
            assert!(rule == "0.0.0.0/0" || rule == "::/0", "{src}: {rule}");
        }
    }
    assert_eq!(got.len(), 7);
    assert_eq!(class_rules.len(), 2, "one class rule per family: {class_rules:?}");
    // The floods lose most; the in-profile sources nothing.
    for s in ["192.0.2.20", "2001:db8:2::20", "192.0.2.30"] {
        let (n, a, _) = &got[&s.parse::<IpAddr>().unwrap()];
        assert_eq!(n, a, "{s} is in profile");
    }
    // Each rule's line is the sum of its sources.
    for line in r["rules"].as_array().unwrap() {
        let name = line["rule"].as_str().unwrap();
        let (n, a) = got.values().filter(|g| g.2 == name).fold((0, 0), |(n, a), g| (n + g.0, a + g.1));
        assert_eq!((u(line, "frames"), u(line, "admitted_frames"), u(line, "dropped_frames")), (n, a, n - a), "{name}");
    }
}

/// A manual ban, a named set (its list file beside the config) and an
/// automatic ban, from the config: the banned prefix and the set's deny
/// entries lose every frame, the set's rate-limited entries get their
/// set's bucket, and the automatic ban drops its source for `ban_for` on
/// the capture's clock, then lets it back.
#[test]
fn replay_with_a_ban_and_sets() {
    if !privileged("replay tier") {
        return;
    }
    let ms = SEC / 1000;
    let mut frames = Vec::new();
    frames.extend(flow_of("198.51.100.7", ms, ms / 4, 2_000, 1, other)); // banned prefix
    frames.extend(flow_of("203.0.113.9", ms, ms / 4, 2_000, 2, other)); // deny set
    frames.extend(flow_of("2001:db8:bad::1", ms, ms / 4, 2_000, 3, other)); // deny set (IPv6)
    frames.extend(flow_of("192.0.2.99", ms / 2, ms / 8, 4_000, 4, other)); // limited set: 200 pps
    frames.extend(flow_of("192.0.2.20", 2 * ms, ms / 2, 1_000, 5, other)); // in profile of the default
    frames.sort_by_key(|c| c.ts_ns);
    let dir = tmp("sets");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("deny.txt"), "203.0.113.0/24\n2001:db8:bad::/48\n").unwrap();
    std::fs::write(dir.join("slow.txt"), "# slow clients\n192.0.2.99\n").unwrap();
    let config = dir.join("policer.toml");
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1000pps\"\nburst = 5\n\n\
         [[rule]]\nprefix = \"::/0\"\nrate = \"1000pps\"\nburst = 5\n\n\
         [[rule]]\nprefix = \"198.51.100.0/24\"\nban = true\nexpires = \"2099-01-01T00:00:00Z\"\n\n\
         [[set]]\nname = \"deny\"\nfile = \"deny.txt\"\naction = \"deny\"\n\n\
         [[set]]\nname = \"slow\"\nfile = \"slow.txt\"\nrate = \"200pps\"\nburst = 4\n",
    )
    .unwrap();
    let pcap = tmp("sets.pcap");
    write_pcap(&pcap, &frames);
    let r = replay_json(&[pcap.to_str().unwrap(), "--config", config.to_str().unwrap(), "--json", "--top", "0"]);
    let got = by_source(&r);
    let src = |s: &str| got[&s.parse::<IpAddr>().unwrap()].clone();
    assert_eq!(src("198.51.100.7"), (2000, 0, "ban 198.51.100.0/24".into()));
    assert_eq!(src("203.0.113.9"), (2000, 0, "set deny".into()));
    assert_eq!(src("2001:db8:bad::1"), (2000, 0, "set deny".into()));
    let slow: Vec<u64> =
        frames.iter().filter(|c| c.src == Some("192.0.2.99".parse().unwrap())).map(|c| c.ts_ns).collect();
    assert_eq!(src("192.0.2.99"), (4000, gcra(200, 4, slow.into_iter()), "set slow".into()));
    assert_eq!(src("192.0.2.20"), (1000, 1000, "0.0.0.0/0".into()));
    let line = |name: &str| r["rules"].as_array().unwrap().iter().find(|l| l["rule"] == name).expect(name).clone();
    assert_eq!(u(&line("set deny"), "dropped_frames"), 4000);
    assert_eq!(u(&line("ban 198.51.100.0/24"), "dropped_frames"), 2000);

    // An automatic ban: 5 refusals in a row ban the source for 1 s of
    // capture time (an admission resets the count).
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1000pps\"\nburst = 5\nban_after = 5\nban_for = \"1s\"\n",
    )
    .unwrap();
    // 3 s at 10× the rate: 9 refusals between admissions without the ban.
    let heavy = flow_of("192.0.2.50", ms / 10, ms / 40, 30_000, 8, other);
    let pcap = tmp("autoban.pcap");
    write_pcap(&pcap, &heavy);
    let r = replay_json(&[pcap.to_str().unwrap(), "--config", config.to_str().unwrap(), "--json", "--top", "0"]);
    let (n, admitted, _) = by_source(&r)[&"192.0.2.50".parse::<IpAddr>().unwrap()].clone();
    let plain = gcra(1000, 5, heavy.iter().map(|c| c.ts_ns));
    assert_eq!(n, 30_000);
    assert!(plain > 3000, "{plain}");
    // Each second of capture time: the full burst (5), 5 refusals, banned
    // for 1 s; the frame after the ban's end finds a fresh bucket. Three
    // such rounds in 3 s: the ban runs on the capture's clock.
    assert_eq!(admitted, 15, "{plain} admitted without bans");
}

/// A replay's exit status, its peak memory (KiB) and its output.
fn run_measured(args: &[&str]) -> (i32, u64, Vec<u8>) {
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut child = Command::new(policer_bin())
        .arg("replay")
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .expect("run policer replay");
    // The peak is the child's own address space's high-water mark
    // (`VmHWM`), read while it runs. Not `wait4`'s `ru_maxrss`: Linux
    // carries the spawning process's mark across `exec` into it, so a test
    // process that once grew (a panic's backtrace reads the debug info)
    // would be measured instead. The replay's memory plateaus early (its
    // table is bounded), so reading every 5 ms misses nothing of it.
    let status_file = format!("/proc/{}/status", child.id());
    let done = std::sync::Arc::new(AtomicBool::new(false));
    let poller = {
        let done = done.clone();
        std::thread::spawn(move || {
            let mut peak = 0u64;
            while !done.load(Ordering::Relaxed) {
                let Ok(s) = std::fs::read_to_string(&status_file) else { break };
                let hwm = s.lines().find_map(|l| l.strip_prefix("VmHWM:"));
                match hwm.and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
                    Some(kib) => peak = peak.max(kib),
                    None => break, // exiting: its memory is gone
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            peak
        })
    };
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let status = child.wait().expect("wait for policer replay");
    done.store(true, Ordering::Relaxed);
    let peak = poller.join().unwrap();
    assert!(peak > 0, "never read the replay's VmHWM");
    (status.code().unwrap_or(-1), peak, out)
}

/// A 1 GiB capture of 300 000 distinct sources (more than the source
/// table holds), replayed in bounded memory: the replay's peak RSS stays
/// under 100 MiB (measured: ~46 MiB for the debug binary; the table is at
/// most 65 536 sources, ~8 MiB, the reader holds one 256 KiB buffer and
/// one frame), the counts add up, and the report says how many source
/// records it let go.
#[test]
fn replay_of_a_gigabyte_capture_in_bounded_memory() {
    if !privileged("replay tier") {
        return;
    }
    let pcap = tmp("big.pcap");
    let mut w = policer_tests::capture::PcapWriter::create(&pcap).unwrap();
    let mut frame = FrameSpec::udp("10.0.0.1".parse().unwrap(), "198.19.0.1".parse().unwrap(), 1400).build(None);
    let (sources, mut n) = (300_000u32, 0u64);
    while w.bytes < 1 << 30 {
        // IPv4 source at 14 + 12: 10.(n mod sources); the program reads no checksum.
        let s = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 0)) + (n % u64::from(sources)) as u32;
        frame[26..30].copy_from_slice(&s.to_be_bytes());
        w.write(EPOCH_NS + n * 1_000, &frame).unwrap();
        n += 1;
    }
    w.finish().unwrap();
    let size = std::fs::metadata(&pcap).unwrap().len();
    let none = tmp("no-state-dir");
    let args =
        [pcap.to_str().unwrap(), "--rate", "100pps", "--burst", "2", "--json", "--state-dir", none.to_str().unwrap()];
    let (code, maxrss_kib, out) = run_measured(&args);
    std::fs::remove_file(&pcap).unwrap();
    assert_eq!(code, 0);
    let r: Value = serde_json::from_slice(&out).expect("JSON");
    assert!(size >= 1 << 30);
    assert_eq!(u(&r, "frames"), n);
    assert!(r["sources"].is_null(), "more sources than the table: no exact count");
    assert!(u(&r, "sources_tracked") <= 65_536 && u(&r, "sources_let_go") > 0, "{}", r["sources_let_go"]);
    let line = &r["rules"].as_array().unwrap().iter().find(|l| l["rule"] == "0.0.0.0/0").unwrap().clone();
    assert_eq!(u(line, "frames"), n);
    assert_eq!(u(line, "admitted_frames") + u(line, "dropped_frames"), n);
    eprintln!("1 GiB replay: {n} frames, peak RSS {} MiB, {:.0} frames/s", maxrss_kib / 1024, r["frames_per_sec"]);
    assert!(maxrss_kib < 100 * 1024, "peak RSS {maxrss_kib} KiB");
}

/// An Ethernet + IPv6 frame from `src` whose UDP header (to port 53) sits
/// `ext` bytes of extension headers (hop-by-hop, then destination
/// options, Pad1-filled) after the IPv6 header, `len` bytes in all.
fn deep_dns_v6(src: IpAddr, ext: [usize; 2], len: usize) -> Vec<u8> {
    let IpAddr::V6(s) = src else { panic!("an IPv6 source") };
    let mut f = vec![2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x86, 0xdd];
    f.extend_from_slice(&[0x60, 0, 0, 0]);
    f.extend_from_slice(&((len - 14 - 40) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 64]); // next header: hop-by-hop options
    f.extend_from_slice(&s.octets());
    f.extend_from_slice(&"2001:db8:ffff::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    for (i, bytes) in ext.into_iter().enumerate() {
        assert!(bytes % 8 == 0 && bytes >= 8);
        let next = if i == 0 { 60 } else { 17 }; // destination options, then UDP
        f.extend_from_slice(&[next, (bytes / 8 - 1) as u8]);
        f.resize(f.len() + bytes - 2, 0);
    }
    f.extend_from_slice(&4000u16.to_be_bytes());
    f.extend_from_slice(&53u16.to_be_bytes());
    f.extend_from_slice(&((len - f.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    assert!(f.len() <= len);
    f.resize(len, 0xab);
    f
}

/// Replay runs frames in batches (one test run judges many, each frame's
/// first bytes copied into the run's frame, its length made by the
/// program): lengths from runts to past what a test run takes, under a
/// byte-rate rule, are admitted byte for byte as the test's bucket does;
/// a DNS flood whose UDP header sits past 500 bytes of IPv6 extension
/// headers (frames longer than the copied head) is judged by the class
/// rule, exact against the test's `gcra`; runts (shorter than Ethernet)
/// are counted as not IP, as the program passes them.
#[test]
fn replay_in_batches_keeps_lengths_and_deep_headers() {
    if !privileged("replay tier") {
        return;
    }
    // IPv4: 10 000 frames of 60 .. 3 700 bytes at 5 000 frames/s (about
    // 75 Mbit/s) against 8 Mbit/s; some clipped to the 3 520 a run takes
    // (replayed at that length, their IP length made to fit it).
    let v4: IpAddr = "192.0.2.30".parse().unwrap();
    let mut state = 7;
    let mut frames: Vec<Captured> = (0..10_000u64)
        .map(|i| {
            let len = 60 + (rng(&mut state) % 3_641) as usize;
            let j = rng(&mut state) % 100_000;
            let f = FrameSpec::udp(v4, dst(v4), len).build(None);
            Captured { ts_ns: EPOCH_NS + i * 200_000 + j, frame: f, src: Some(v4) }
        })
        .collect();
    // IPv6: a DNS flood at 10× the class's 500 pps, the UDP header at 478
    // and at 510 bytes (frames of 550 and 600 bytes).
    let v6: IpAddr = "2001:db8:7::1".parse().unwrap();
    frames.extend((0..5_000u64).map(|i| {
        let f = if i % 2 == 0 { deep_dns_v6(v6, [216, 208], 550) } else { deep_dns_v6(v6, [216, 240], 600) };
        Captured { ts_ns: EPOCH_NS + i * 200_000 + 50_000 + (i * 7_919) % 90_000, frame: f, src: Some(v6) }
    }));
    for i in 0..5u64 {
        frames.push(Captured { ts_ns: EPOCH_NS + i * 100_000_000 + 3, frame: vec![0x11; 10], src: None });
    }
    frames.sort_by_key(|c| c.ts_ns);
    let clipped = frames.iter().filter(|c| c.frame.len() > 3_520).count() as u64;
    assert!(clipped > 0);
    let path = tmp("batches.pcap");
    write_pcap(&path, &frames);
    let config = tmp("batches.toml");
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"8mbit\"\nburst = 20000\n\n\
         [[rule]]\nprefix = \"::/0\"\nrate = \"1000pps\"\nburst = 5\n\n\
         [[rule]]\nprefix = \"::/0\"\nproto = \"udp\"\ndport = 53\nrate = \"500pps\"\nburst = 10\n",
    )
    .unwrap();
    let r = replay_json(&[path.to_str().unwrap(), "--config", config.to_str().unwrap(), "--json", "--top", "0"]);
    assert_eq!(u(&r, "frames"), frames.len() as u64);
    assert_eq!(u(&r, "not_ip_frames"), 5, "{r}");
    assert_eq!(u(&r, "clipped_frames"), clipped, "{r}");
    // The byte bucket on the lengths the program saw (clipped at 3 520).
    let rule = Rate::parse("8mbit").unwrap().rule(20_000).unwrap();
    let (want_n, want_bytes) = exact_admitted_at(
        &rule,
        frames.iter().filter(|c| c.src == Some(v4)).map(|c| (c.ts_ns - EPOCH_NS, c.frame.len().min(3_520) as u32)),
    );
    let sources = by_source(&r);
    let src4 = r["top_dropped"].as_array().unwrap().iter().find(|s| s["source"] == "192.0.2.30").expect("IPv4 source");
    assert_eq!(u(src4, "frames"), 10_000);
    assert_eq!((u(src4, "admitted_frames"), u(src4, "admitted_bytes")), (want_n, want_bytes), "{src4}");
    assert!(want_n < 5_000, "the byte rule must drop ({want_n} admitted)");
    let t6: Vec<u64> = frames.iter().filter(|c| c.src == Some(v6)).map(|c| c.ts_ns).collect();
    let (n6, admitted6, rule6) = &sources[&v6];
    assert_eq!(*n6, 5_000);
    assert_eq!(rule6, "::/0 [udp dport 53]", "the class rule judges the deep DNS frames");
    assert_eq!(*admitted6, gcra(500, 10, t6.into_iter()), "{r}");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&config);
}

/// The frames `traffic::run` sent (`sent.frames`: when, which flow), as a
/// capture of them: each flow's UDP frames of `len` bytes, at the capture
/// time of their sending.
fn as_sent(sent: &traffic::SendReport, flows: &[Flow]) -> Vec<Captured> {
    sent.frames
        .iter()
        .map(|&(t, i)| {
            let src = flows[i as usize].src;
            Captured {
                ts_ns: EPOCH_NS + t,
                frame: FrameSpec::udp(src, dst(src), flows[i as usize].len).build(None),
                src: Some(src),
            }
        })
        .collect()
}

fn live_flow(src: &str) -> Flow {
    Flow { src: src.parse().unwrap(), pps: 200.0, len: 64 }
}

fn write_list(name: &str, text: &str) -> String {
    let p = tmp(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

/// The sets a real daemon saved in its state directory (`policer rule
/// import` of a daemon in a namespace) replayed with `--state-dir`, as a
/// start installs them: a deny set and a rate-limited one judge the frames
/// of their entries (the deny set every frame, as the daemon did to the
/// same traffic over veth; the limited one exactly as the test's bucket),
/// a source outside them is admitted (as the daemon did), a saved set that
/// ended since is left out, and a config `[[set]]` of a saved set's name
/// replaces it; the report (JSON and text) says which sets were installed,
/// from where, with their entry counts, and which were left out.
#[test]
fn replay_installs_the_daemons_saved_sets_as_a_start_does() {
    if !privileged("replay tier") {
        return;
    }
    let sb = Sandbox::new("rpsaved");
    let defaults = "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100kpps\"\nburst = 1000\n\n\
                    [[rule]]\nprefix = \"::/0\"\nrate = \"100kpps\"\nburst = 1000\n";
    std::fs::write(&sb.config, defaults).unwrap();
    let state = state_dir_of(&sb.config);
    let mut d = Daemon::attach(&sb, &["--interval", "0"]);
    let deny = write_list("saved-deny.txt", "203.0.113.0/24\n2001:db8:bad::/48\n");
    let slow = write_list("saved-slow.txt", "192.0.2.99\n");
    let swap = write_list("saved-swap.txt", "192.0.2.77\n");
    let gone = write_list("saved-gone.txt", "198.51.100.0/24\n");
    for args in [
        vec!["rule", "import", &deny, "--set", "deny", "--action", "deny"],
        vec!["rule", "import", &slow, "--set", "slow", "--action", "police", "--rate", "200pps", "--burst", "4"],
        vec!["rule", "import", &swap, "--set", "swap", "--action", "deny"],
    ] {
        succeeds(&cli(&sb, &args));
    }
    // What the daemon does: the deny set's entry and the swap set's lose
    // every frame, a source outside the sets none.
    let live = [live_flow("203.0.113.9"), live_flow("192.0.2.20"), live_flow("192.0.2.77")];
    let (sent, got) = traffic::run(&sb, &live, std::time::Duration::from_secs(1));
    assert_eq!(got.socket_drops, 0);
    assert!(sent.sent.iter().all(|n| *n > 100), "{:?}", sent.sent);
    assert_eq!(got.per_flow, vec![0, sent.sent[1], 0], "the daemon's verdicts (sent {:?})", sent.sent);
    // A set that ends 3 s from now, saved with its end; the daemon stops
    // before it (a start after it leaves the set out).
    let t_gone = std::time::Instant::now();
    succeeds(&cli(&sb, &["rule", "import", &gone, "--set", "gone", "--action", "deny", "--ttl", "3s"]));
    assert!(d.stop_with(libc::SIGTERM), "{}", d.stderr());
    for n in ["deny", "slow", "swap", "gone"] {
        assert!(state.join(format!("sets/{n}.set")).exists(), "the daemon saved no {n}");
    }
    std::thread::sleep(std::time::Duration::from_millis(3500).saturating_sub(t_gone.elapsed()));
    // The config now declares a set of a saved set's name: it replaces it.
    let swap2 = write_list("config-swap.txt", "192.0.2.88\n");
    std::fs::write(
        &sb.config,
        format!("{defaults}\n[[set]]\nname = \"swap\"\nfile = \"{swap2}\"\naction = \"deny\"\n"),
    )
    .unwrap();

    // The capture: the traffic the daemon judged, then more of each set.
    let ms = SEC / 1000;
    let mut frames = as_sent(&sent, &live);
    let after = EPOCH_NS + 2 * SEC;
    let later = |c: Vec<Captured>| c.into_iter().map(|c| Captured { ts_ns: c.ts_ns + 2 * SEC, ..c });
    frames.extend(later(flow_of("192.0.2.99", 2 * ms, ms / 2, 1_000, 11, other))); // slow: 500 pps against 200
    frames.extend(later(flow_of("198.51.100.7", 5 * ms, ms, 200, 12, other))); // the ended set's
    frames.extend(later(flow_of("192.0.2.88", 5 * ms, ms, 200, 13, other))); // the config's swap
    frames.extend(later(flow_of("2001:db8:bad::1", 5 * ms, ms, 200, 14, other))); // deny, IPv6
    frames.sort_by_key(|c| c.ts_ns);
    assert!(frames.iter().filter(|c| c.ts_ns >= after).count() == 1_600);
    let pcap = tmp("saved-sets.pcap");
    write_pcap(&pcap, &frames);
    let args = [
        pcap.to_str().unwrap(),
        "--config",
        &sb.config,
        "--state-dir",
        state.to_str().unwrap(),
        "--json",
        "--top",
        "0",
    ];
    let r = replay_json(&args);
    let got_r = by_source(&r);
    let src = |s: &str| got_r[&s.parse::<IpAddr>().unwrap()].clone();
    // As the daemon did to the same frames.
    assert_eq!(src("203.0.113.9"), (sent.sent[0], got.per_flow[0], "set deny".into()));
    assert_eq!(src("192.0.2.20"), (sent.sent[1], got.per_flow[1], "0.0.0.0/0".into()));
    // The saved swap gave way to the config's: its entry is not dropped,
    // the config's is.
    assert_eq!(src("192.0.2.77"), (sent.sent[2], sent.sent[2], "0.0.0.0/0".into()));
    assert_eq!(src("192.0.2.88"), (200, 0, "set swap".into()));
    let slow_ts: Vec<u64> =
        frames.iter().filter(|c| c.src == Some("192.0.2.99".parse().unwrap())).map(|c| c.ts_ns).collect();
    let want_slow = gcra(200, 4, slow_ts.into_iter());
    assert!(want_slow < 600, "{want_slow}");
    assert_eq!(src("192.0.2.99"), (1_000, want_slow, "set slow".into()));
    assert_eq!(src("198.51.100.7"), (200, 200, "0.0.0.0/0".into()), "the ended set is left out");
    assert_eq!(src("2001:db8:bad::1"), (200, 0, "set deny".into()));
    // What was installed, from where, with how many entries.
    assert_eq!(r["state_dir"], state.to_str().unwrap());
    assert_eq!(r["state_dir_exists"], true);
    let sets: Vec<(String, String, u64, String)> = r["sets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let name = s["name"].as_str().unwrap().to_string();
            (name, s["source"].as_str().unwrap().to_string(), u(s, "entries"), s["file"].as_str().unwrap().to_string())
        })
        .collect();
    let saved = |n: &str| state.join(format!("sets/{n}.set")).display().to_string();
    assert_eq!(
        sets,
        vec![
            ("deny".into(), "saved".into(), 2, saved("deny")),
            ("slow".into(), "saved".into(), 1, saved("slow")),
            ("swap".into(), "config".into(), 1, swap2.clone()),
        ]
    );
    let left: Vec<(String, String)> = r["sets_left_out"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| (l["name"].as_str().unwrap().to_string(), l["why"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
    assert!(left.iter().any(|(n, why)| n == "gone" && why.contains("expired")), "{left:?}");
    assert!(
        left.iter().any(|(n, why)| n == "swap" && why.contains("replaced by the config's [[set]] swap")),
        "{left:?}"
    );
    assert!(r["feed"].is_null());
    // The text says it too.
    let out = replay(&args[..args.len() - 3]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        format!("state directory {}: 4 saved sets", state.display()),
        format!("left out: set gone (saved, {})", saved("gone")),
        format!("left out: set swap (saved, {}): replaced by the config's [[set]] swap", saved("swap")),
    ] {
        assert!(text.contains(&want), "{want:?} not in:\n{text}");
    }
    let row =
        |name: &str| text.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_default().to_string();
    assert!(
        row("deny").contains("saved") && row("deny").contains(" 2 ") && row("deny").contains(&saved("deny")),
        "{text}"
    );
    assert!(row("slow").contains("police 200pps"), "{text}");
    assert!(row("swap").contains("config") && row("swap").contains(&swap2), "{text}");
}

/// A config with `[crowdsec]` replays with the feed's set as the daemon
/// saved it: a real daemon's feed pulls two decisions (from a stand-in
/// Local API in its namespace) into its set, drops their sources' traffic,
/// and saves the set; the replay of that traffic with the config and the
/// state directory drops them too, under `set crowdsec`, and says the set
/// is the feed's saved one and that live decisions are not fetched.
/// Without a saved set the feed's set is empty, and the replay says so.
#[test]
fn replay_of_a_crowdsec_config_uses_the_feeds_saved_set() {
    if !privileged("replay tier") {
        return;
    }
    let sb = Sandbox::new("rpfeed");
    // Every request answered with the stream of two decisions (nothing
    // listens on the upstream port: nothing is passed on).
    let lapi = Proxy::start(&sb.rx_ns, 8080, 9);
    lapi.answer(
        200,
        r#"{"deleted": null, "new": [
            {"duration": "3h59m59.5s", "id": 1, "origin": "cscli", "scenario": "test", "scope": "Ip", "type": "ban", "value": "203.0.113.9"},
            {"duration": "3h59m59.5s", "id": 2, "origin": "cscli", "scenario": "test", "scope": "Range", "type": "ban", "value": "198.51.100.0/24"}
        ]}"#,
    );
    std::fs::write(
        &sb.config,
        format!(
            "[crowdsec]\nlapi_url = \"{}\"\napi_key = \"key\"\nupdate_frequency = \"1h\"\n\n\
             [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100kpps\"\nburst = 1000\n",
            lapi.url()
        ),
    )
    .unwrap();
    let state = state_dir_of(&sb.config);
    let saved = state.join("sets/crowdsec.set");
    let mut d = Daemon::attach(&sb, &["--interval", "0"]);
    let t0 = std::time::Instant::now();
    // The feed writes its set file first and then commits the set in the
    // daemon (plan, write, commit): wait for both, not the file alone.
    loop {
        let ls = cli(&sb, &["rule", "ls", "--set", "crowdsec"]);
        let rows = String::from_utf8_lossy(&ls.stdout).into_owned();
        if saved.exists() && ls.status.success() && rows.contains("203.0.113.9") && rows.contains("198.51.100.0/24") {
            break;
        }
        assert!(t0.elapsed().as_secs() < 20, "the feed saved no set: {rows}\n{}\n{}", d.stdout(), d.stderr());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let live = [live_flow("203.0.113.9"), live_flow("198.51.100.7"), live_flow("192.0.2.20")];
    let (sent, got) = traffic::run(&sb, &live, std::time::Duration::from_secs(1));
    assert_eq!(got.socket_drops, 0);
    assert!(sent.sent.iter().all(|n| *n > 100), "{:?}", sent.sent);
    assert_eq!(got.per_flow, vec![0, 0, sent.sent[2]], "the daemon's verdicts (sent {:?})", sent.sent);
    assert!(d.stop_with(libc::SIGTERM), "{}", d.stderr());
    drop(lapi);

    let frames = as_sent(&sent, &live);
    let pcap = tmp("feed.pcap");
    write_pcap(&pcap, &frames);
    let p = pcap.to_str().unwrap();
    let args = [p, "--config", &sb.config, "--state-dir", state.to_str().unwrap(), "--json", "--top", "0"];
    let r = replay_json(&args);
    let got_r = by_source(&r);
    let src = |s: &str| got_r[&s.parse::<IpAddr>().unwrap()].clone();
    assert_eq!(src("203.0.113.9"), (sent.sent[0], got.per_flow[0], "set crowdsec".into()));
    assert_eq!(src("198.51.100.7"), (sent.sent[1], got.per_flow[1], "set crowdsec".into()));
    assert_eq!(src("192.0.2.20"), (sent.sent[2], got.per_flow[2], "0.0.0.0/0".into()));
    let f = &r["feed"];
    assert_eq!((f["set"].as_str(), f["saved"].as_bool(), u(f, "entries")), (Some("crowdsec"), Some(true), 2), "{f}");
    assert_eq!(f["file"], saved.to_str().unwrap());
    assert_eq!(f["live_decisions_fetched"], false);
    let set = &r["sets"][0];
    assert_eq!((set["name"].as_str(), set["source"].as_str(), u(set, "entries")), (Some("crowdsec"), Some("feed"), 2));
    let out = replay(&args[..args.len() - 3]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("the set 'crowdsec' is the feed's saved set (2 entries")
            && text.contains("live decisions are not fetched"),
        "{text}"
    );

    // No saved set: the feed's set is empty, and said to be.
    let none = tmp("feed-no-state");
    let args = [p, "--config", &sb.config, "--state-dir", none.to_str().unwrap(), "--json", "--top", "0"];
    let r = replay_json(&args);
    let f = &r["feed"];
    assert_eq!((f["saved"].as_bool(), u(f, "entries")), (Some(false), 0), "{f}");
    assert_eq!(r["sets"].as_array().unwrap().len(), 0);
    for (s, (n, admitted, _)) in by_source(&r) {
        assert_eq!(n, admitted, "{s}: dropped with the feed's set empty");
    }
    let out = replay(&args[..args.len() - 3]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("does not exist: no saved sets")
            && text.contains("the set 'crowdsec' is empty")
            && text.contains("live decisions are not fetched"),
        "{text}"
    );
}

/// A state directory that does not exist holds no saved set, and the
/// report says so; a state file that does not read is an error naming it,
/// before anything is loaded (so without privileges).
#[test]
fn replay_says_a_missing_state_dir_and_names_a_bad_state_file() {
    let not_capture = tmp("bad-state-not-a-capture");
    std::fs::write(&not_capture, "hello\n").unwrap();
    let header = "#policer-set {\"name\":\"ok\",\"rule\":{\"prefix\":\"\",\"action\":\"deny\"}}\n";
    for (tag, file, text, want) in [
        ("junk", "junk.set", "hello\n".to_string(), ":1: not a policer set file"),
        ("entry", "ok.set", format!("{header}192.0.2.1\nnot-a-prefix\n"), ":3: "),
    ] {
        let dir = tmp(&format!("bad-state-{tag}"));
        std::fs::create_dir_all(dir.join("sets")).unwrap();
        let path = dir.join("sets").join(file);
        std::fs::write(&path, text).unwrap();
        let out = replay(&[not_capture.to_str().unwrap(), "--rate", "1kpps", "--state-dir", dir.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{tag}: {err}");
        let want = format!("{}{want}", path.display());
        assert!(err.contains(&want), "{tag}: {want:?} not in {err}");
    }
    // A directory named as a state file.
    let dir = tmp("bad-state-dir");
    std::fs::create_dir_all(dir.join("sets/odd.set")).unwrap();
    let out = replay(&[not_capture.to_str().unwrap(), "--rate", "1kpps", "--state-dir", dir.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains(&dir.join("sets/odd.set").display().to_string()), "{err}");

    if !privileged("replay tier") {
        return;
    }
    let frames = flow("192.0.2.10", SEC / 100, SEC / 400, 100, 1);
    let pcap = tmp("no-state.pcap");
    write_pcap(&pcap, &frames);
    let none = tmp("really-no-state-dir");
    let p = pcap.to_str().unwrap();
    let r = replay_json(&[p, "--rate", "1kpps", "--state-dir", none.to_str().unwrap(), "--json"]);
    assert_eq!(r["state_dir"], none.to_str().unwrap());
    assert_eq!(r["state_dir_exists"], false);
    assert_eq!(r["sets"].as_array().map(Vec::len), Some(0));
    assert_eq!(u(&r, "frames"), 100);
    let out = replay(&[p, "--rate", "1kpps", "--state-dir", none.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(&format!("state directory {}: does not exist: no saved sets", none.display())), "{text}");
}
