//! Tier 3, source-port classes (issue 46, point 1) on real traffic: the
//! real `policer` daemon and CLI as separate processes, rules set with the
//! CLI of the issue (`--proto udp --sport 53 --rate …`, `--sport 123
//! --total-rate …`), a reflection flood sent over a veth pair from another
//! namespace, and what arrives counted on the receiving side.
//!
//! - a reflection flood, IPv4 and IPv6: many reflectors sending UDP from
//!   port 53 (a bucket per reflector) and from port 123 (one aggregate for
//!   all of them), each exact to the bucket math over the frames' real send
//!   times; the same sources' other traffic (UDP to port 53, TCP from port
//!   53) untouched; `rule ls --json`, `inspect`, `/metrics` and `policer
//!   check` name the classes;
//! - `policer replay` of the frames as sent, with the daemon's own config,
//!   admits what the exact bucket admits, frame for frame, and what the
//!   kernel admitted live;
//! - fragments: a first fragment from port 53 is the class's, a later
//!   fragment of the same source (whose data looks like a port-53 header)
//!   is not;
//! - a `--dry-run` lowering a source-port class's rate names exactly the
//!   reflectors that go pass → drop, and the real change makes exactly
//!   those lose frames.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    path::PathBuf,
    process::Command,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use policer_common::{Rule, class::TCP_ACK, rate::Rate};
use policer_tests::{
    daemon::{Daemon, cli, fails_with, policer_bin, samples, scrape, succeeds},
    frame::{Ext, FrameSpec, L4},
    netns::Sandbox,
    privileged,
    traffic::{self, RunOptions, SendReport, SpecFlow},
};
use serde_json::Value;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const DST4: &str = "198.19.255.1";
const DST6: &str = "2001:db8:ffff::1";
const METRICS: u16 = 9466;

fn pps(rate: u64, burst: u64) -> Rule {
    Rate::Pps(rate).rule(burst).unwrap()
}

/// `policer rule set ARGS` in the sandbox: must succeed.
fn rule_set(sb: &Sandbox, args: &[&str]) {
    let mut v = vec!["rule", "set"];
    v.extend_from_slice(args);
    succeeds(&cli(sb, &v));
}

/// A daemon with a generous default rule, no counter lines, /metrics.
fn daemon(sb: &Sandbox) -> Daemon {
    Daemon::attach(
        sb,
        &[
            "--rate",
            "100kpps",
            "--burst",
            "1000",
            "--interval",
            "0",
            "--max-sources",
            "65536",
            "--metrics",
            &METRICS.to_string(),
        ],
    )
}

/// A UDP frame from `sport` to `dport`.
fn udp(src: IpAddr, sport: u16, dport: u16) -> FrameSpec {
    let (d, len) = if src.is_ipv4() { (ip(DST4), 64) } else { (ip(DST6), 100) };
    FrameSpec::udp(src, d, len).with_l4(L4::Udp { sport, dport })
}

/// A TCP ACK from `sport` to `dport`.
fn tcp(src: IpAddr, sport: u16, dport: u16) -> FrameSpec {
    let (d, len) = if src.is_ipv4() { (ip(DST4), 64) } else { (ip(DST6), 100) };
    FrameSpec::tcp(src, d, len, sport, dport, TCP_ACK)
}

/// What a flow of the flood is.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// UDP from port 53: the per-reflector class (200 pps, burst 10).
    Dns,
    /// UDP from port 123: the aggregate of all reflectors (1000 pps,
    /// burst 20).
    Ntp,
    /// The same sources' other traffic: the prefix's class-less rule.
    Other,
}

const DNS_RULE: (u64, u64) = (200, 10);
const NTP_TOTAL: (u64, u64) = (1000, 20);
const CLASSLESS: (u64, u64) = (20_000, 200);

/// The reflection flood's flows: 6 DNS reflectors at 1000 pps (5x their
/// class), 12 NTP reflectors at 300 pps (together 3.6x the aggregate), and
/// beside them UDP to port 53 from three DNS reflectors and TCP from port
/// 53 from three NTP reflectors.
fn reflection_flows(v6: bool) -> Vec<(Kind, SpecFlow)> {
    let src = |group: u32, n: u32| {
        if v6 { ip(&format!("2001:db8:1:{:x}::1", group * 256 + n)) } else { ip(&format!("198.18.{group}.{n}")) }
    };
    let mut flows = Vec::new();
    for n in 1..=6 {
        flows.push((Kind::Dns, SpecFlow { spec: udp(src(1, n), 53, 40_000 + n as u16), pps: 1000.0 }));
    }
    for n in 1..=12 {
        flows.push((Kind::Ntp, SpecFlow { spec: udp(src(2, n), 123, 123), pps: 300.0 }));
    }
    for n in 1..=3 {
        flows.push((Kind::Other, SpecFlow { spec: udp(src(1, n), 40_000, 53), pps: 300.0 }));
        flows.push((Kind::Other, SpecFlow { spec: tcp(src(2, n), 53, 443), pps: 300.0 }));
    }
    flows
}

/// The rules of the flood's prefix, as an operator sets them.
fn reflection_rules(sb: &Sandbox, prefix: &str) {
    rule_set(sb, &[prefix, "--rate", "20kpps", "--burst", "200"]);
    rule_set(sb, &[prefix, "--proto", "udp", "--sport", "53", "--rate", "200pps", "--burst", "10"]);
    rule_set(sb, &[prefix, "--proto", "udp", "--sport", "123", "--total-rate", "1000pps", "--total-burst", "20"]);
}

/// Within 0.5 % + 2 frames of `want`.
fn near(got: u64, want: u64) -> bool {
    (got as f64 - want as f64).abs() <= want as f64 * 0.005 + 2.0
}

/// Checks a run of the flood against the bucket math over the frames'
/// real send times: each DNS reflector its own bucket, the NTP reflectors
/// one aggregate, the other traffic of each source the class-less rule's
/// (all of it, unless a stalled sender's catch-up burst went past 200).
fn check_flood(tag: &str, flows: &[(Kind, SpecFlow)], sent: &SendReport, got: &traffic::Received) {
    let mut fails = Vec::new();
    let of = |k: Kind| (0..flows.len()).filter(|&i| flows[i].0 == k).collect::<Vec<_>>();
    for i in of(Kind::Dns) {
        let exact = traffic::exact_admitted_flow(sent, &pps(DNS_RULE.0, DNS_RULE.1), i, 64);
        eprintln!("{tag}: DNS reflector {i}: sent {}, arrived {}, exact {exact}", sent.sent[i], got.per_flow[i]);
        if !near(got.per_flow[i], exact) || got.per_flow[i] * 2 > sent.sent[i] {
            fails.push(format!("DNS reflector {i}: arrived {} of {}, exact {exact}", got.per_flow[i], sent.sent[i]));
        }
    }
    let ntp = of(Kind::Ntp);
    let exact = traffic::exact_model_of_flows(sent, &pps(NTP_TOTAL.0, NTP_TOTAL.1), &ntp);
    let (s, a) = (ntp.iter().map(|&i| sent.sent[i]).sum::<u64>(), ntp.iter().map(|&i| got.per_flow[i]).sum::<u64>());
    eprintln!("{tag}: {} NTP reflectors together: sent {s}, arrived {a}, exact aggregate {exact}", ntp.len());
    if (a as f64 - exact as f64).abs() > exact as f64 * 0.01 + 2.0 || a * 2 > s {
        fails.push(format!("NTP reflectors: arrived {a} of {s}, exact aggregate {exact}"));
    }
    for i in of(Kind::Other) {
        let exact = traffic::exact_admitted_flow(sent, &pps(CLASSLESS.0, CLASSLESS.1), i, 64);
        eprintln!("{tag}: other traffic {i}: sent {}, arrived {}", sent.sent[i], got.per_flow[i]);
        let ok = if exact == sent.sent[i] { got.per_flow[i] == exact } else { near(got.per_flow[i], exact) };
        if !ok || sent.sent[i] == 0 {
            fails.push(format!("other traffic {i}: arrived {} of {}, want {exact}", got.per_flow[i], sent.sent[i]));
        }
    }
    assert!(fails.is_empty(), "{tag}:\n{}", fails.join("\n"));
}

/// The rules of `rule ls --json` for `prefix`: class → the entry.
fn listed(sb: &Sandbox, prefix: &str) -> BTreeMap<String, Value> {
    let v: Value = serde_json::from_str(&succeeds(&cli(sb, &["rule", "ls", "--json"]))).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .filter(|r| r["prefix"] == prefix)
        .map(|r| (r["class"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

/// The reflection flood of one family: policed per reflector and in
/// aggregate, exact; the CLI's views name the classes; a replay of the
/// frames as sent agrees with the exact bucket and with the kernel.
fn reflection(tag: &str, v6: bool) {
    let sb = Sandbox::new(tag);
    let _d = daemon(&sb);
    let prefix = if v6 { "2001:db8:1::/48" } else { "198.18.0.0/16" };
    reflection_rules(&sb, prefix);
    // rule ls --json: the classes and their fields as written.
    let ls = listed(&sb, prefix);
    assert_eq!(ls.keys().collect::<Vec<_>>(), ["-", "udp sport 123", "udp sport 53"], "{ls:?}");
    assert_eq!((ls["udp sport 53"]["sport"].as_str(), ls["udp sport 53"]["proto"].as_str()), (Some("53"), Some("udp")));
    assert_eq!(ls["udp sport 123"]["total_rate"].as_str(), Some("1kpps"), "{:?}", ls["udp sport 123"]);
    assert!(ls["udp sport 53"].get("dport").is_none());
    let text = succeeds(&cli(&sb, &["rule", "ls"]));
    assert!(text.contains("udp sport 53") && text.contains("udp sport 123"), "{text}");

    let flows = reflection_flows(v6);
    let specs: Vec<SpecFlow> = flows.iter().map(|f| f.1.clone()).collect();
    let (sent, got) = traffic::run_specs(&sb, &specs, Duration::from_secs(4), &RunOptions::default());
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    check_flood(tag, &flows, &sent, &got);

    // inspect: a DNS reply from a reflector is its sport-53 class's, a
    // query from the same source its class-less rule's.
    let refl = flows[0].1.spec.src.to_string();
    let inspect = |args: &[&str]| -> Value {
        let mut v = vec!["inspect", refl.as_str(), "--json"];
        v.extend_from_slice(args);
        serde_json::from_str(&succeeds(&cli(&sb, &v))).unwrap()
    };
    let reply = inspect(&["--proto", "udp", "--sport", "53", "--dport", "40001"]);
    assert_eq!(reply["class"], "udp sport 53", "{reply:#}");
    assert_eq!(reply["rule"].as_str(), Some(format!("{prefix} [udp sport 53]").as_str()), "{reply:#}");
    let query = inspect(&["--proto", "udp", "--sport", "40000", "--dport", "53"]);
    assert_eq!(query["class"], "-", "{query:#}");
    fails_with(&cli(&sb, &["inspect", &refl, "--proto", "icmp", "--sport", "53"]), "--sport needs --proto tcp or udp");

    // /metrics: the classes' counters under their labels, what they passed
    // what arrived.
    let m = samples(&scrape(&sb.rx_ns, METRICS));
    let passed = |class: &str| {
        let k = format!(
            "policer_rule_packets_total{{rule=\"{prefix}\",class=\"{class}\",action=\"police\",verdict=\"passed\"}}"
        );
        *m.get(&k).unwrap_or_else(|| panic!("/metrics has no {k}"))
    };
    let arrived = |k: Kind| flows.iter().zip(&got.per_flow).filter(|(f, _)| f.0 == k).map(|(_, n)| n).sum::<u64>();
    assert_eq!(passed("udp sport 53") as u64, arrived(Kind::Dns), "/metrics: the DNS class's passed frames");
    assert_eq!(passed("udp sport 123") as u64, arrived(Kind::Ntp), "/metrics: the NTP class's passed frames");

    replay_agrees(tag, &sb, &flows, &sent, &got);
}

/// Issue 46: a DNS and NTP reflection flood from many IPv4 sources,
/// policed by source-port classes per reflector and in aggregate.
#[test]
fn reflection_flood_is_policed_by_source_port() {
    if !privileged("sport tier") {
        return;
    }
    reflection("refl4", false);
}

/// Issue 46: the same flood from IPv6 reflectors (a bucket per /64).
#[test]
fn reflection_flood_is_policed_by_source_port_ipv6() {
    if !privileged("sport tier") {
        return;
    }
    reflection("refl6", true);
}

/// A classic pcap of `frames` (time since the capture's start in ns,
/// frame), nanosecond timestamps.
fn write_pcap(path: &std::path::Path, frames: &[(u64, Vec<u8>)]) {
    const EPOCH_NS: u64 = 1_750_000_000_000_000_000;
    let mut b = Vec::new();
    b.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes());
    b.extend_from_slice(&2u16.to_le_bytes());
    b.extend_from_slice(&4u16.to_le_bytes());
    b.extend_from_slice(&[0; 8]);
    b.extend_from_slice(&65535u32.to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    for (t, f) in frames {
        let ts = EPOCH_NS + t;
        b.extend_from_slice(&((ts / 1_000_000_000) as u32).to_le_bytes());
        b.extend_from_slice(&((ts % 1_000_000_000) as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(&(f.len() as u32).to_le_bytes());
        b.extend_from_slice(f);
    }
    std::fs::write(path, b).unwrap();
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("policer-sport-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"))
}

/// `policer replay` of the frames as they were sent (at their send times),
/// with the daemon's own config file: per source, the rule that judged it
/// and what it admitted. The DNS reflectors' frames are admitted exactly
/// as their bucket admits them over those times, the NTP reflectors' as
/// the aggregate, the other traffic whole; and each agrees with what the
/// kernel admitted live (0.5 % + 2 frames: the kernel saw the frames
/// microseconds after they were sent).
fn replay_agrees(tag: &str, sb: &Sandbox, flows: &[(Kind, SpecFlow)], sent: &SendReport, got: &traffic::Received) {
    let frames: Vec<(u64, Vec<u8>)> =
        sent.frames.iter().map(|&(t, i)| (t, flows[i as usize].1.spec.build(None))).collect();
    let pcap = tmp(&format!("{tag}.pcap"));
    write_pcap(&pcap, &frames);
    let out = Command::new(policer_bin())
        .args(["replay", pcap.to_str().unwrap(), "--config", &sb.config, "--json", "--top", "0"])
        .arg("--state-dir")
        .arg(tmp("no-state-dir"))
        .output()
        .expect("run policer replay");
    assert!(out.status.success(), "policer replay: {}", String::from_utf8_lossy(&out.stderr));
    let r: Value = serde_json::from_slice(&out.stdout).expect("replay --json");
    let by_source: BTreeMap<IpAddr, (u64, u64, String)> = r["top_dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let src = s["source"].as_str().unwrap().parse().unwrap();
            (src, (num(s, "frames"), num(s, "admitted_frames"), s["rule"].as_str().unwrap_or("-").to_string()))
        })
        .collect();
    let times = |flow: usize| sent.frames.iter().filter(move |f| f.1 as usize == flow).map(|&(t, _)| (t, 64));
    let prefix = if flows[0].1.spec.src.is_ipv4() { "198.18.0.0/16" } else { "2001:db8:1::/48" };
    let mut ntp = (0, 0, 0);
    for (i, (kind, f)) in flows.iter().enumerate() {
        if *kind != Kind::Dns {
            continue;
        }
        let (n, admitted, rule) = &by_source[&f.spec.src];
        // The same source's other traffic is replayed too (the class-less
        // rule admits all of it, as it did live); the source's row names
        // one of its rules.
        let want = traffic::exact_admitted_at(&pps(DNS_RULE.0, DNS_RULE.1), times(i)).0;
        eprintln!(
            "{tag} replay: DNS reflector {i}: {n} frames, admitted {admitted} ({rule}); exact {want}, live {}",
            got.per_flow[i]
        );
        let others: u64 = flows
            .iter()
            .enumerate()
            .filter(|(j, g)| g.0 == Kind::Other && g.1.spec.src == f.spec.src && *j != i)
            .map(|(j, _)| sent.sent[j])
            .sum();
        if others == 0 {
            assert_eq!(rule, &format!("{prefix} [udp sport 53]"), "the reflector's rule in the replay");
        }
        assert_eq!((*n, *admitted), (sent.sent[i] + others, want + others), "{tag}: replay of DNS reflector {i}");
        assert!(near(*admitted - others, got.per_flow[i]), "{tag}: replay {admitted} vs live {}", got.per_flow[i]);
    }
    let ntp_flows: Vec<usize> = (0..flows.len()).filter(|&i| flows[i].0 == Kind::Ntp).collect();
    for &i in &ntp_flows {
        let (n, admitted, rule) = &by_source[&flows[i].1.spec.src];
        let others: u64 = flows
            .iter()
            .enumerate()
            .filter(|(j, g)| g.0 == Kind::Other && g.1.spec.src == flows[i].1.spec.src && *j != i)
            .map(|(j, _)| sent.sent[j])
            .sum();
        if others == 0 {
            assert_eq!(rule, &format!("{prefix} [udp sport 123]"), "an NTP reflector's rule in the replay");
        }
        ntp = (ntp.0 + n - others, ntp.1 + admitted - others, ntp.2 + got.per_flow[i]);
    }
    let all = sent.frames.iter().filter(|f| ntp_flows.contains(&(f.1 as usize))).map(|&(t, _)| (t, 64));
    let want = traffic::exact_admitted_at(&pps(NTP_TOTAL.0, NTP_TOTAL.1), all).0;
    eprintln!("{tag} replay: NTP reflectors: {} frames, admitted {}; exact {want}, live {}", ntp.0, ntp.1, ntp.2);
    assert_eq!(ntp.1, want, "{tag}: the replay's NTP aggregate vs the exact aggregate");
    assert!((ntp.1 as f64 - ntp.2 as f64).abs() <= ntp.2 as f64 * 0.01 + 2.0, "{tag}: replay vs live aggregate");
    // The per-rule lines name the classes as rule ls does.
    let rules: Vec<&str> = r["rules"].as_array().unwrap().iter().filter_map(|l| l["rule"].as_str()).collect();
    for want in [format!("{prefix} [udp sport 53]"), format!("{prefix} [udp sport 123]")] {
        assert!(rules.contains(&want.as_str()), "replay's rules lack {want}: {rules:?}");
    }
}

/// Issue 46: a first fragment carries the source port and is the class's;
/// a later fragment of the same source (its data starting with a port-53
/// look-alike) has no port and is the class-less rule's. IPv4 and IPv6.
#[test]
fn a_first_fragment_matches_a_source_port_class_and_a_later_one_does_not() {
    if !privileged("sport tier") {
        return;
    }
    let sb = Sandbox::new("sfrag");
    let _d = daemon(&sb);
    for p in ["198.18.0.0/24", "2001:db8:1::/48"] {
        rule_set(&sb, &[p, "--rate", "20kpps", "--burst", "200"]);
        rule_set(&sb, &[p, "--proto", "udp", "--sport", "53", "--rate", "1000pps", "--burst", "10"]);
    }
    let frag = |src: &str, off: u16, more: bool| {
        let mut s = udp(ip(src), 53, 40_000);
        if s.src.is_ipv4() {
            s.ipv4_frag = Some((off, more));
        } else {
            s.ipv6_ext = vec![Ext::Fragment { offset: off, more }];
        }
        s
    };
    let flows = [
        SpecFlow { spec: frag("198.18.0.1", 0, true), pps: 3000.0 },
        SpecFlow { spec: frag("198.18.0.1", 185, true), pps: 3000.0 },
        SpecFlow { spec: frag("2001:db8:1:1::1", 0, true), pps: 3000.0 },
        SpecFlow { spec: frag("2001:db8:1:1::1", 181, false), pps: 3000.0 },
    ];
    let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(3), &RunOptions::default());
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    let mut fails = Vec::new();
    for (i, first) in [(0, true), (1, false), (2, true), (3, false)] {
        let rule = if first { pps(1000, 10) } else { pps(CLASSLESS.0, CLASSLESS.1) };
        let exact = traffic::exact_admitted_flow(&sent, &rule, i, 64);
        eprintln!(
            "fragments: flow {i} (first: {first}): sent {}, arrived {}, exact {exact}",
            sent.sent[i], got.per_flow[i]
        );
        let ok = if first {
            near(got.per_flow[i], exact) && got.per_flow[i] * 2 < sent.sent[i]
        } else if exact == sent.sent[i] {
            got.per_flow[i] == exact
        } else {
            near(got.per_flow[i], exact)
        };
        if !ok {
            fails.push(format!(
                "flow {i} (first fragment: {first}): arrived {} of {}, want {exact}",
                got.per_flow[i], sent.sent[i]
            ));
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// Per flow, (sent, arrived) of the frames sent in `[from, to)` (ns since
/// `traffic::epoch_ns`).
fn window(sent: &SendReport, got: &traffic::Received, from: u64, to: u64) -> Vec<(u64, u64)> {
    let (s1, a1) = traffic::since(sent, got, from);
    let (s2, a2) = traffic::since(sent, got, to);
    (0..s1.len()).map(|i| (s1[i] - s2[i], a1[i] - a2[i])).collect()
}

/// Issue 46: a dry run that lowers a source-port class's rate, with
/// reflectors live: it names exactly the reflectors that go pass → drop
/// (over the new rate, under the old), not the one within it nor the
/// heavy one (dropping either way) nor a reflector's other traffic; the
/// real change then makes exactly those lose frames on the wire.
#[test]
fn a_dry_run_of_a_source_port_class_names_the_reflectors_it_would_cut() {
    if !privileged("sport tier") {
        return;
    }
    let sb = Sandbox::new("sdry");
    let _d = daemon(&sb);
    let p = "198.18.0.0/16";
    rule_set(&sb, &[p, "--rate", "20kpps", "--burst", "200"]);
    rule_set(&sb, &[p, "--proto", "udp", "--sport", "53", "--rate", "100pps", "--burst", "20"]);
    let srcs = ["198.18.0.1", "198.18.0.2", "198.18.0.3", "198.18.0.4"];
    let rates = [400.0, 70.0, 15.0, 70.0];
    let mut flows: Vec<SpecFlow> =
        srcs.iter().zip(rates).map(|(s, pps)| SpecFlow { spec: udp(ip(s), 53, 33_000), pps }).collect();
    // Reflector .3's own queries (to port 53): the class-less rule's.
    flows.push(SpecFlow { spec: udp(ip("198.18.0.3"), 33_000, 53), pps: 70.0 });
    let stop = Arc::new(AtomicBool::new(false));
    let opts = RunOptions { keep_marks: true, stop: Some(stop.clone()), ..Default::default() };
    traffic::epoch_ns();
    let (sent, got, [t0, t1, t2]) = std::thread::scope(|scope| {
        let run = scope.spawn(|| traffic::run_specs(&sb, &flows, Duration::from_secs(30), &opts));
        std::thread::sleep(Duration::from_secs(3));
        let dry = &[p, "--proto", "udp", "--sport", "53", "--rate", "40pps", "--dry-run", "--json"];
        let mut args = vec!["rule", "set"];
        args.extend_from_slice(dry);
        let v: Value = serde_json::from_str(&succeeds(&cli(&sb, &args))).unwrap();
        let named = |dir: &str| {
            let mut s: Vec<String> =
                v["live"][dir].as_array().unwrap().iter().map(|s| s["source"].as_str().unwrap().to_string()).collect();
            s.sort();
            s
        };
        assert_eq!(named("pass_to_drop_top"), ["198.18.0.2", "198.18.0.4"], "{v:#}");
        assert!(named("drop_to_pass_top").is_empty(), "{v:#}");
        let t0 = traffic::epoch_ns();
        rule_set(&sb, &[p, "--proto", "udp", "--sport", "53", "--rate", "40pps"]);
        let t1 = traffic::epoch_ns();
        std::thread::sleep(Duration::from_secs(5));
        let t2 = traffic::epoch_ns();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (sent, got) = run.join().unwrap();
        (sent, got, [t0, t1, t2])
    });
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    let before = window(&sent, &got, 1_000_000_000, t0);
    for i in 1..5 {
        assert_eq!(before[i].0, before[i].1, "flow {i} lost frames before the change: {before:?}");
    }
    assert!(before[0].1 < before[0].0 / 2, "the heavy reflector is policed: {before:?}");
    // From 1.5 s after the change (the bursts spent): exactly the named
    // reflectors (and the heavy one) lose frames.
    let lowered = window(&sent, &got, t1 + 1_500_000_000, t2);
    for (i, (s, a)) in lowered.iter().enumerate() {
        let cut = i == 0 || i == 1 || i == 3;
        assert_eq!(a < s, cut, "flow {i}: sent {s}, arrived {a} under 40 pps ({lowered:?})");
    }
}

/// Issue 46: `policer check` validates `sport` in the config as the CLI
/// does, naming the key; a valid one passes.
#[test]
fn check_validates_sport_in_the_config() {
    if !privileged("sport tier") {
        return;
    }
    let path = tmp("check.toml");
    let check = |text: &str| {
        std::fs::write(&path, text).unwrap();
        Command::new(policer_bin()).args(["check", "--config", path.to_str().unwrap()]).output().unwrap()
    };
    let good = "[[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\nsport = 53\nrate = \"100pps\"\n\n\
                [[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\nsport = \"123\"\ntotal_rate = \"5kpps\"\n\n\
                [[rule]]\nprefix = \"::/0\"\nproto = \"tcp\"\nsport = \"1024-65535\"\ndport = 443\nrate = \"1kpps\"\n";
    let out = check(good);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    for (text, want) in [
        ("[[rule]]\nprefix = \"0.0.0.0/0\"\nsport = 53\nrate = \"1kpps\"\n", "sport needs"),
        ("[[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"icmp\"\nsport = 53\nrate = \"1kpps\"\n", "sport needs"),
        ("[[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\nsport = 70000\nrate = \"1kpps\"\n", "sport"),
        ("[[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\nsport = \"9-1\"\nrate = \"1kpps\"\n", "below LOW"),
        ("[[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\nsport = true\nrate = \"1kpps\"\n", "sport"),
    ] {
        let out = check(text);
        let msg = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(!out.status.success() && msg.contains(want), "{text}: want {want:?}, got: {msg}");
        assert!(!msg.contains("panicked"), "{msg}");
    }
}
