//! Tier 3, classes (issue 17) on real traffic: the real `policer` daemon
//! and CLI as separate processes (`ip netns exec`), rules with classes set
//! with exactly the CLI of the issue, real frames of every shape sent over
//! a veth pair from another namespace, and what arrives counted on the
//! receiving side, independently of policer's own counters.
//!
//! - a SYN flood at 10x a SYN class is held to its budget (+-1 %) while the
//!   same source's ACKs all pass; DNS at 10x a `udp --dport 53` class
//!   likewise while the source's other UDP passes;
//! - `--total-rate` over 100 sources that together send 4x the total is
//!   held to the total (+-2 %), and `stats --json` says the aggregate
//!   dropped;
//! - a `--dst` rule applies to its destination only;
//! - IPv6 extension headers (hop-by-hop, destination options, a fragment
//!   header at offset 0) before TCP/UDP, and one and two VLAN tags, reach
//!   the port classes;
//! - fragments: a first fragment matches a port class, later fragments of
//!   the same source do not (the class-less rule takes them), and a
//!   port-less `--proto udp` class does take them;
//! - bad class input is refused with a clear message and changes nothing.
//!
//! Budgets: what an exact policer admits of the frames as really sent
//! (the host model of the bucket over the send times), within 0.5 %; and
//! when the sender kept its pace, rate x T + burst within the issue's
//! bound.

use std::{net::IpAddr, time::Duration};

use policer_common::{
    Rule,
    class::{TCP_ACK, TCP_SYN},
    rate::Rate,
};
use policer_tests::{
    daemon::{Daemon, cli, scrape, succeeds},
    frame::{Ext, FrameSpec},
    netns::{Sandbox, ip as ip_cmd},
    privileged,
    traffic::{self, RunOptions, SMOOTH_TRIES, SendReport, SpecFlow},
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

const DST4: &str = "198.19.255.1";
const DST6: &str = "2001:db8:ffff::1";

/// `policer rule set ARGS` in the sandbox: must succeed.
fn rule_set(sb: &Sandbox, args: &[&str]) {
    let mut v = vec!["rule", "set"];
    v.extend_from_slice(args);
    let out = cli(sb, &v);
    assert!(
        out.status.success(),
        "policer {}: {}{}",
        v.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A daemon with a generous default rule (far above anything a test
/// sends from one source), no counter lines.
fn daemon(sb: &Sandbox) -> Daemon {
    Daemon::attach(sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0", "--max-sources", "65536"])
}

/// The burst of a policed class whose count a test holds to rate x T +
/// burst: 100 ms at its 1000 pps. The sender keeps an absolute schedule
/// and sends what a stall held back at once after it, so a bucket whose
/// burst outlasts the stall banks it; this VM's host stalls a sender up to
/// ~45 ms at a time for tens of seconds now and then (see the veth tier's
/// heavy_hitter_gets_rate_times_t_plus_burst).
const BURST: u64 = 100;
const BURST_ARG: &str = "100";

fn pps(rate: u64, burst: u64) -> Rule {
    Rate::Pps(rate).rule(burst).unwrap()
}

/// How a policed flow came out.
struct Outcome {
    admitted: f64,
    exact: f64,
    ideal: f64,
    smooth: bool,
}

/// Flow `i` against one bucket of `rule` (`rate` pps, `burst`): admitted
/// on the receiving side, the exact policer over its real send times, and
/// rate x T + burst over its span.
fn outcome(sent: &SendReport, got: &traffic::Received, i: usize, rule: &Rule, rate: f64, burst: f64) -> Outcome {
    let admitted = got.per_flow[i] as f64;
    let exact = traffic::exact_admitted_flow(sent, rule, i, 64) as f64;
    let ideal = rate * sent.span_secs(i) + burst;
    Outcome { admitted, exact, ideal, smooth: (exact - ideal).abs() <= 0.002 * ideal }
}

/// The policer is exact for what was really sent (0.5 % + 2 frames).
fn assert_exact(o: &Outcome, what: &str) {
    assert!(
        (o.admitted - o.exact).abs() <= o.exact * 0.005 + 2.0,
        "{what}: admitted {}, an exact policer over the real send times {} (rate x T + burst {:.1})",
        o.admitted,
        o.exact,
        o.ideal
    );
}

/// Every frame of flow `i` arrived.
fn assert_all_passed(sent: &SendReport, got: &traffic::Received, i: usize, what: &str) {
    assert!(sent.sent[i] > 0, "{what}: nothing sent");
    assert_eq!(
        got.per_flow[i],
        sent.sent[i],
        "{what}: lost {} of {} frames",
        sent.sent[i] - got.per_flow[i],
        sent.sent[i]
    );
}

/// A flood of one class at 10x its rate beside the same source's other
/// traffic, which a generous rule lets through: the flood gets rate x T +
/// burst within 1 %, the other traffic all. `flood(src)` and
/// `other(src)` build the frames; up to SMOOTH_TRIES tries with a fresh source
/// each, as the veth tier's accuracy test does, a try counting only when
/// the generator kept its pace.
fn class_flood_beside_other_traffic(
    tag: &str,
    class_args: &[&str],
    shown: &str,
    flood: impl Fn(IpAddr) -> FrameSpec,
    other: impl Fn(IpAddr) -> FrameSpec,
) {
    let sb = Sandbox::new(tag);
    let _d = daemon(&sb);
    // The prefix's own generous class-less rule, and the class.
    rule_set(&sb, &["198.18.0.0/24", "--rate", "20kpps", "--burst", "200"]);
    let mut args = vec!["198.18.0.0/24"];
    args.extend_from_slice(class_args);
    args.extend_from_slice(&["--rate", "1000pps", "--burst", BURST_ARG]);
    rule_set(&sb, &args);
    let rule = pps(1000, BURST);
    for attempt in 1..=SMOOTH_TRIES {
        traffic::settle_disk();
        let src = ip(&format!("198.18.0.{attempt}"));
        let flows = [SpecFlow { spec: flood(src), pps: 10_000.0 }, SpecFlow { spec: other(src), pps: 1_000.0 }];
        let before = stats(&sb);
        let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(5), &RunOptions::default());
        assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
        // The class's own counters (stats --json, the rule shown with its
        // class): what it passed arrived, what it dropped did not; the
        // other traffic is the class-less rule's.
        let after = stats(&sb);
        let delta = |prefix: &str, class: &str, keys: &[&str]| {
            let now = rule_entries(&after, prefix, class);
            assert_eq!(now.len(), 1, "stats --json: one entry for {prefix} '{class}': {}", after["rules"]);
            field(now[0], keys) - rule_entries(&before, prefix, class).first().map_or(0, |w| field(w, keys))
        };
        let passed = ["passed_packets", "passed_pkts"];
        let dropped = ["dropped_packets", "dropped_pkts"];
        assert_eq!(delta("198.18.0.0/24", shown, &passed), got.per_flow[0], "{tag}: the class's passed count");
        assert_eq!(
            delta("198.18.0.0/24", shown, &dropped),
            sent.sent[0] - got.per_flow[0],
            "{tag}: the class's dropped count"
        );
        assert_eq!(delta("198.18.0.0/24", "-", &passed), got.per_flow[1], "{tag}: the class-less rule's passed count");
        let o = outcome(&sent, &got, 0, &rule, 1000.0, BURST as f64);
        eprintln!(
            "{tag} try {attempt}: flood sent {}, admitted {}, exact {}, rate x T + burst {:.1}; other traffic {}/{}",
            sent.sent[0], o.admitted, o.exact, o.ideal, got.per_flow[1], sent.sent[1]
        );
        assert_exact(&o, &format!("{tag}: the flood"));
        assert_all_passed(&sent, &got, 1, &format!("{tag}: the same source's other traffic"));
        if o.smooth {
            assert!(sent.sent[0] >= 49_000, "generator fell short: {}", sent.sent[0]);
            assert!(
                (o.admitted - o.ideal).abs() <= o.ideal * 0.01,
                "{tag}: admitted {}, expected {:.1} +-1 %",
                o.admitted,
                o.ideal
            );
            return;
        }
        assert!(
            attempt < SMOOTH_TRIES,
            "the generator could not send smoothly in {SMOOTH_TRIES} tries: machine overloaded"
        );
    }
}

/// Issue 17: a SYN flood at 10x a SYN class (`--proto tcp --tcp-flags
/// syn,!ack`) is held to its budget (+-1 %) while the same source's ACKs
/// all pass.
#[test]
fn syn_flood_is_policed_and_acks_pass() {
    if !privileged("classes tier") {
        return;
    }
    let d = ip(DST4);
    class_flood_beside_other_traffic(
        "syn",
        &["--proto", "tcp", "--tcp-flags", "syn,!ack"],
        "tcp flags syn,!ack",
        |s| FrameSpec::tcp(s, d, 64, 40000, 80, TCP_SYN),
        |s| FrameSpec::tcp(s, d, 64, 40001, 80, TCP_ACK),
    );
}

/// Issue 17: DNS at 10x a `--proto udp --dport 53` class is held to its
/// budget (+-1 %) while the same source's other UDP (port 123) passes in
/// full.
#[test]
fn dns_flood_is_policed_and_other_udp_passes() {
    if !privileged("classes tier") {
        return;
    }
    let d = ip(DST4);
    class_flood_beside_other_traffic(
        "dns",
        &["--proto", "udp", "--dport", "53"],
        "udp dport 53",
        |s| FrameSpec::udp_to(s, d, 64, 53),
        |s| FrameSpec::udp_to(s, d, 64, 123),
    );
}

fn stats(sb: &Sandbox) -> serde_json::Value {
    serde_json::from_str(&succeeds(&cli(sb, &["stats", "--json"]))).expect("stats --json is JSON")
}

/// A number of a rule's entry in `stats --json` under the first of
/// `keys` it has.
fn field(r: &serde_json::Value, keys: &[&str]) -> u64 {
    keys.iter()
        .find_map(|k| r.get(*k).and_then(|v| v.as_u64()))
        .unwrap_or_else(|| panic!("none of {keys:?} in the rule's counters: {r}"))
}

/// The entries of `stats --json`'s rules for `prefix` and `class` (as
/// shown: `udp dport 27015`).
fn rule_entries<'a>(s: &'a serde_json::Value, prefix: &str, class: &str) -> Vec<&'a serde_json::Value> {
    s["rules"]
        .as_array()
        .expect("stats --json has rules")
        .iter()
        .filter(|r| r["prefix"] == prefix && r["class"] == class)
        .collect()
}

/// Issue 17: a `--total-rate` rule over 100 sources that together send 4x
/// the total is held to the total (+-2 %); per-rule counters say the
/// aggregate dropped.
#[test]
fn total_rate_holds_a_hundred_sources_to_the_total() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("tot");
    let _d = daemon(&sb);
    // Per source 1000 pps (never reached: each sends 80), all together
    // 2000 pps, burst 20.
    rule_set(
        &sb,
        &[
            "198.18.0.0/16",
            "--proto",
            "udp",
            "--dport",
            "27015",
            "--rate",
            "1000pps",
            "--burst",
            "100",
            "--total-rate",
            "2000pps",
            "--total-burst",
            "200",
        ],
    );
    // 100 ms of the total: it banks the sender's stalls (see BURST).
    let total = pps(2000, 200);
    let d = ip(DST4);
    for attempt in 1..=SMOOTH_TRIES {
        traffic::settle_disk();
        let before = stats(&sb);
        let flows: Vec<SpecFlow> = (0..100)
            .map(|i| SpecFlow {
                spec: FrameSpec::udp_to(ip(&format!("198.18.{attempt}.{}", i + 1)), d, 64, 27015),
                pps: 80.0,
            })
            .collect();
        let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(5), &RunOptions::default());
        assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
        let first = *sent.first_ns.iter().min().unwrap();
        let last = *sent.last_ns.iter().max().unwrap();
        let span = (last - first) as f64 / 1e9;
        let ideal = 2000.0 * span + 200.0;
        let exact = traffic::exact_admitted_shared(&sent, &total, 64) as f64;
        let offered: u64 = sent.sent.iter().sum();
        let admitted: u64 = got.per_flow.iter().sum();
        let starved = got.per_flow.iter().filter(|&&n| n == 0).count();
        eprintln!(
            "total try {attempt}: 100 sources offered {offered}, admitted {admitted}, total x T + burst {ideal:.1} \
             (T = {span:.3} s), exact aggregate over the real send times {exact}; sources with nothing: {starved}"
        );
        assert!(offered as f64 >= 3.8 * ideal, "offered {offered}: not 4x the total {ideal:.0}");
        let a = admitted as f64;
        assert!((a - exact).abs() <= exact * 0.01 + 2.0, "admitted {admitted}, exact aggregate {exact}");
        // (How the total is shared among the sources is not asserted: an
        // aggregate promises no fairness, and perfectly paced senders can
        // phase-lock with its refill.)
        let smooth = (exact - ideal).abs() <= 0.005 * ideal;
        if smooth {
            assert!((a - ideal).abs() <= ideal * 0.02, "admitted {admitted}, total x T + burst {ideal:.1} +-2 %");
            // stats --json: this rule passed what arrived and its drops
            // were the aggregate's.
            let s = stats(&sb);
            let now = rule_entries(&s, "198.18.0.0/16", "udp dport 27015");
            let was = rule_entries(&before, "198.18.0.0/16", "udp dport 27015");
            assert_eq!(now.len(), 1, "stats --json: one entry for the class rule: {}", s["rules"]);
            let delta = |keys: &[&str]| field(now[0], keys) - was.first().map_or(0, |w| field(w, keys));
            let passed = delta(&["passed_packets", "passed_pkts"]);
            let dropped = delta(&["dropped_packets", "dropped_pkts"]);
            let by_total = delta(&["total_dropped_packets", "total_dropped_pkts"]);
            eprintln!("stats: passed {passed}, dropped {dropped}, of which by the aggregate {by_total}");
            assert_eq!(passed, admitted, "the rule's passed count vs what arrived");
            assert_eq!(dropped, offered - admitted, "the rule's dropped count vs what did not arrive");
            assert_eq!(by_total, dropped, "every drop was the aggregate's (no source was over its own rate)");
            return;
        }
        assert!(
            attempt < SMOOTH_TRIES,
            "the generator could not send smoothly in {SMOOTH_TRIES} tries: machine overloaded"
        );
    }
}

/// Issue 17: a `--dst` rule applies only to its destination: two
/// destinations in the receiving namespace, one source sending 5x the
/// class's rate to each; the rule's destination gets the budget, the other
/// everything. A `--total-rate`-only rule (no per-source rate) on a third
/// destination holds two sources together to its total.
#[test]
fn dst_rule_applies_only_to_its_destination() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("dst");
    for a in ["198.19.255.1/32", "198.19.255.2/32", "198.19.255.3/32"] {
        ip_cmd(&["-n", &sb.rx_ns, "addr", "add", a, "dev", &sb.rx_if]);
    }
    let _d = daemon(&sb);
    rule_set(&sb, &["198.18.0.0/24", "--dst", "198.19.255.1", "--rate", "1000pps", "--burst", "10"]);
    rule_set(
        &sb,
        &[
            "198.18.0.0/24",
            "--dst",
            "198.19.255.3/32",
            "--proto",
            "udp",
            "--dport",
            "27015",
            "--total-rate",
            "500pps",
            "--total-burst",
            "5",
        ],
    );
    let s = ip("198.18.0.7");
    let flows = [
        SpecFlow { spec: FrameSpec::udp_to(s, ip("198.19.255.1"), 64, 9), pps: 5000.0 },
        SpecFlow { spec: FrameSpec::udp_to(s, ip("198.19.255.2"), 64, 9), pps: 5000.0 },
        SpecFlow { spec: FrameSpec::udp_to(ip("198.18.0.8"), ip("198.19.255.3"), 64, 27015), pps: 1000.0 },
        SpecFlow { spec: FrameSpec::udp_to(ip("198.18.0.9"), ip("198.19.255.3"), 64, 27015), pps: 1000.0 },
    ];
    let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(3), &RunOptions::default());
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    let o = outcome(&sent, &got, 0, &pps(1000, 10), 1000.0, 10.0);
    eprintln!(
        "dst: to .1 sent {}, admitted {} (exact {}, rate x T + burst {:.1}); to .2 {}/{}; total-only to .3: {}+{} of {}",
        sent.sent[0],
        o.admitted,
        o.exact,
        o.ideal,
        got.per_flow[1],
        sent.sent[1],
        got.per_flow[2],
        got.per_flow[3],
        sent.sent[2] + sent.sent[3]
    );
    assert_exact(&o, "to the rule's destination");
    assert!(o.admitted < 0.4 * sent.sent[0] as f64, "the --dst rule did not police its destination");
    assert_all_passed(&sent, &got, 1, "the same source to the other destination");
    // The total-only rule: both sources together, one aggregate.
    let shared = traffic::exact_model_of_flows(&sent, &pps(500, 5), &[2, 3]) as f64;
    let both = (got.per_flow[2] + got.per_flow[3]) as f64;
    assert!(
        (both - shared).abs() <= shared * 0.01 + 2.0,
        "total-only rule: admitted {both}, an exact aggregate over both sources {shared}"
    );
}

/// Sends `flows` for 3 s. A class's flow (`true`) gets its class's budget
/// (an exact policer, 1000 pps burst 10, over the flow's real send times,
/// within 0.5 % + 2 frames). The other flows fall to the prefix's
/// class-less rule (every caller's is 20 kpps burst 200, a bucket per
/// source): together per source they get what an exact policer of that
/// rule admits over their real send times: everything when the sender
/// kept its pace, less only when a stalled sender caught up in a burst
/// beyond 200 frames (a loaded host), which the rule rightly cuts.
fn shapes(tag: &str, sb: &Sandbox, flows: &[(&str, SpecFlow, bool)]) {
    let specs: Vec<SpecFlow> = flows.iter().map(|f| f.1.clone()).collect();
    let (sent, got) = traffic::run_specs(sb, &specs, Duration::from_secs(3), &RunOptions::default());
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    let rule = pps(1000, 10);
    let classless = pps(20_000, 200);
    let mut fails = Vec::new();
    for (i, (what, f, policed)) in flows.iter().enumerate() {
        if *policed {
            let o = outcome(&sent, &got, i, &rule, 1000.0, 10.0);
            eprintln!(
                "{tag}: {what}: sent {} at {} pps, arrived {} (exact class budget {})",
                sent.sent[i], f.pps, got.per_flow[i], o.exact
            );
            if (o.admitted - o.exact).abs() > o.exact * 0.005 + 2.0 {
                fails.push(format!(
                    "{what}: arrived {} of {} sent, want the class budget {} (+-0.5 %)",
                    got.per_flow[i], sent.sent[i], o.exact
                ));
            }
            continue;
        }
        // The first class-less flow of its source judges them all.
        let src = f.spec.src;
        if flows[..i].iter().any(|g| !g.2 && g.1.spec.src == src) {
            continue;
        }
        let group: Vec<usize> = (0..flows.len()).filter(|&j| !flows[j].2 && flows[j].1.spec.src == src).collect();
        let sum = |v: &Vec<u64>| group.iter().map(|&j| v[j]).sum::<u64>();
        let (s, a) = (sum(&sent.sent), sum(&got.per_flow));
        let exact = traffic::exact_model_of_flows(&sent, &classless, &group);
        let names: Vec<&str> = group.iter().map(|&j| flows[j].0).collect();
        let names = names.join(" + ");
        eprintln!("{tag}: {names}: sent {s}, arrived {a} (the class-less rule admits {exact} of them exactly)");
        let ok =
            s > 0 && if exact == s { a == s } else { (a as f64 - exact as f64).abs() <= exact as f64 * 0.005 + 2.0 };
        if !ok {
            fails.push(format!("{names}: arrived {a} of {s} sent, want {exact} (the class-less rule, exact)"));
        }
    }
    assert!(fails.is_empty(), "{tag}:\n{}", fails.join("\n"));
}

/// Issue 17: IPv6 with extension headers (hop-by-hop + destination
/// options, a fragment header at offset 0, AH and routing) before TCP/UDP
/// reaches the port classes; the same chains to other ports do not.
#[test]
fn ipv6_extension_headers_reach_the_port_class() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("ext6");
    let _d = daemon(&sb);
    rule_set(&sb, &["2001:db8:1::/48", "--rate", "20kpps", "--burst", "200"]);
    rule_set(&sb, &["2001:db8:1::/48", "--proto", "udp", "--dport", "53", "--rate", "1000pps", "--burst", "10"]);
    rule_set(&sb, &["2001:db8:1::/48", "--proto", "tcp", "--dport", "80", "--rate", "1000pps", "--burst", "10"]);
    let d = ip(DST6);
    // Buckets are per /64 by default: a /64 per flow.
    let src = |n: u32| ip(&format!("2001:db8:1:{n:x}::1"));
    let with = |mut s: FrameSpec, e: &[Ext]| {
        s.ipv6_ext = e.to_vec();
        s
    };
    let udp = |n, port| FrameSpec::udp_to(src(n), d, 100, port);
    let tcp = |n, port| FrameSpec::tcp(src(n), d, 100, 40000, port, TCP_ACK);
    let hd = [Ext::HopByHop, Ext::DestOpts];
    let frag0 = [Ext::Fragment { offset: 0, more: true }];
    let long = [Ext::HopByHop, Ext::Routing, Ext::Ah, Ext::Fragment { offset: 0, more: true }, Ext::DestOpts];
    let f = |spec, pps| SpecFlow { spec, pps };
    shapes(
        "ipv6 ext",
        &sb,
        &[
            ("UDP 53 after hop-by-hop + dest options", f(with(udp(1, 53), &hd), 3000.0), true),
            ("UDP 53 after a fragment header at offset 0", f(with(udp(2, 53), &frag0), 3000.0), true),
            ("TCP 80 after hop-by-hop + dest options", f(with(tcp(3, 80), &hd), 3000.0), true),
            (
                "TCP 80 after hop-by-hop, routing, AH, fragment 0, dest options",
                f(with(tcp(4, 80), &long), 3000.0),
                true,
            ),
            ("UDP 54 after hop-by-hop + dest options (no class)", f(with(udp(5, 54), &hd), 3000.0), false),
            ("TCP 81 after a fragment header (no class)", f(with(tcp(6, 81), &frag0), 3000.0), false),
        ],
    );
}

/// Issue 17: VLAN-tagged frames (one 802.1Q tag, and 802.1ad + 802.1Q)
/// match classes like untagged ones.
#[test]
fn vlan_tagged_frames_match_classes() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("vlan");
    let _d = daemon(&sb);
    rule_set(&sb, &["198.18.0.0/24", "--rate", "20kpps", "--burst", "200"]);
    rule_set(&sb, &["198.18.0.0/24", "--proto", "udp", "--dport", "53", "--rate", "1000pps", "--burst", "10"]);
    rule_set(
        &sb,
        &["198.18.0.0/24", "--proto", "tcp", "--tcp-flags", "syn,!ack", "--rate", "1000pps", "--burst", "10"],
    );
    let d = ip(DST4);
    let tag = |mut s: FrameSpec, tags: &[(u16, u16)]| {
        s.vlans = tags.to_vec();
        s
    };
    let one = [(0x8100, 10)];
    let two = [(0x88a8, 100), (0x8100, 200)];
    let s = |n: u32| ip(&format!("198.18.0.{n}"));
    let f = |spec, pps| SpecFlow { spec, pps };
    shapes(
        "vlan",
        &sb,
        &[
            ("802.1Q, UDP 53", f(tag(FrameSpec::udp_to(s(1), d, 64, 53), &one), 3000.0), true),
            ("802.1ad + 802.1Q, UDP 53", f(tag(FrameSpec::udp_to(s(2), d, 64, 53), &two), 3000.0), true),
            ("802.1Q, bare SYN", f(tag(FrameSpec::tcp(s(3), d, 64, 1, 80, TCP_SYN), &one), 3000.0), true),
            ("802.1ad + 802.1Q, bare SYN", f(tag(FrameSpec::tcp(s(4), d, 64, 1, 80, TCP_SYN), &two), 3000.0), true),
            ("802.1Q, UDP 54 (no class)", f(tag(FrameSpec::udp_to(s(5), d, 64, 54), &one), 3000.0), false),
            (
                "802.1ad + 802.1Q, ACK (no class)",
                f(tag(FrameSpec::tcp(s(6), d, 64, 1, 80, TCP_ACK), &two), 3000.0),
                false,
            ),
        ],
    );
}

/// Issue 17: fragments as documented. A first fragment (offset 0) carries
/// the port and matches the port class; the later fragments of the same
/// source carry no port (their data starts with a port-53 look-alike) and
/// fall to the prefix's class-less rule; a `--proto udp` class without a
/// port does take later fragments. IPv4 and IPv6.
#[test]
fn fragments_match_as_documented() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("frag");
    let _d = daemon(&sb);
    for (p, default) in
        [("198.18.0.0/24", true), ("198.18.1.0/24", false), ("2001:db8:1::/48", true), ("2001:db8:2::/48", false)]
    {
        rule_set(&sb, &[p, "--rate", "20kpps", "--burst", "200"]);
        if default {
            rule_set(&sb, &[p, "--proto", "udp", "--dport", "53", "--rate", "1000pps", "--burst", "10"]);
        } else {
            rule_set(&sb, &[p, "--proto", "udp", "--rate", "1000pps", "--burst", "10"]);
        }
    }
    let (d4, d6) = (ip(DST4), ip(DST6));
    let v4 = |src: &str, off: u16, more: bool| {
        let mut s = FrameSpec::udp_to(ip(src), d4, 64, 53);
        s.ipv4_frag = Some((off, more));
        s
    };
    let v6 = |src: &str, off: u16, more: bool| {
        let mut s = FrameSpec::udp_to(ip(src), d6, 100, 53);
        s.ipv6_ext = vec![Ext::Fragment { offset: off, more }];
        s
    };
    let f = |spec, pps| SpecFlow { spec, pps };
    shapes(
        "fragments",
        &sb,
        &[
            ("IPv4 first fragments, UDP 53: the port class", f(v4("198.18.0.1", 0, true), 3000.0), true),
            ("IPv4 later fragments, same source: class-less", f(v4("198.18.0.1", 185, true), 3000.0), false),
            ("IPv4 last fragments, same source: class-less", f(v4("198.18.0.1", 370, false), 2000.0), false),
            ("IPv4 later fragments: the port-less UDP class", f(v4("198.18.1.1", 185, true), 3000.0), true),
            ("IPv6 first fragments, UDP 53: the port class", f(v6("2001:db8:1:1::1", 0, true), 3000.0), true),
            ("IPv6 later fragments, same source: class-less", f(v6("2001:db8:1:1::1", 181, false), 3000.0), false),
            ("IPv6 later fragments: the port-less UDP class", f(v6("2001:db8:2:1::1", 181, false), 3000.0), true),
        ],
    );
}

/// `rule ls --json` and the config file, to compare before and after.
fn state(sb: &Sandbox) -> (String, Vec<u8>) {
    (succeeds(&cli(sb, &["rule", "ls", "--json"])), std::fs::read(&sb.config).unwrap_or_default())
}

/// Issue 17 point 6: bad class input is refused with a clear message
/// (exit != 0, no panic, the message names the problem) and changes
/// nothing: `rule ls --json` and the config file are as before.
#[test]
fn bad_class_input_changes_nothing() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("cbad");
    let _d = daemon(&sb);
    // Rules in force, with classes, for the tie cases.
    rule_set(&sb, &["198.18.0.0/24", "--proto", "udp", "--dport", "1000-1999", "--rate", "1kpps", "--burst", "10"]);
    rule_set(&sb, &["198.18.0.0/24", "--proto", "tcp", "--tcp-flags", "syn", "--rate", "1kpps", "--burst", "10"]);
    let (ls, _) = state(&sb);
    assert!(ls.contains("1000-1999") && ls.contains("syn"), "rule ls --json does not show the classes: {ls}");
    let p = "198.18.0.0/24";
    let rate: &[&str] = &["--rate", "1kpps", "--burst", "10"];
    // (arguments after `rule set CIDR` / `rule rm CIDR`, any of these in the message)
    let cases: &[(&str, &[&str], &[&str])] = &[
        ("set", &["--proto", "foo"], &["unknown protocol"]),
        ("set", &["--proto", "256"], &["0 to 255", "out of range"]),
        ("set", &["--proto", "-1"], &["unknown protocol", "0 to 255", "out of range", "unexpected argument"]),
        ("set", &["--proto", "udp", "--dport", "65536"], &["out of range"]),
        ("set", &["--proto", "udp", "--dport", "70000-70001"], &["out of range"]),
        ("set", &["--proto", "udp", "--dport", "2000-1000"], &["below LOW", "HIGH"]),
        ("set", &["--proto", "udp", "--dport", "fifty"], &["not a port"]),
        ("set", &["--proto", "udp", "--dport", ""], &["not a port", "--dport"]),
        ("set", &["--dport", "53"], &["--dport needs a protocol"]),
        ("set", &["--proto", "icmp", "--dport", "53"], &["--dport needs a protocol"]),
        ("set", &["--proto", "47", "--dport", "53"], &["--dport needs a protocol"]),
        ("set", &["--tcp-flags", "syn"], &["--tcp-flags needs --proto tcp"]),
        ("set", &["--proto", "udp", "--tcp-flags", "syn"], &["--tcp-flags needs --proto tcp"]),
        ("set", &["--proto", "tcp", "--tcp-flags", "syn,bogus"], &["unknown flag"]),
        ("set", &["--proto", "tcp", "--tcp-flags", "syn,!syn"], &["twice"]),
        ("set", &["--icmp-type", "8"], &["--icmp-type needs --proto"]),
        ("set", &["--proto", "tcp", "--icmp-type", "8"], &["--icmp-type needs --proto"]),
        ("set", &["--proto", "icmp", "--icmp-type", "256"], &["ICMP type"]),
        ("set", &["--proto", "icmpv6"], &["icmpv6", "IPv6"]),
        ("set", &["--dst", "2001:db8::/32"], &["destination", "--dst"]),
        ("set", &["--dst", "198.19.0.0/33"], &["--dst"]),
        ("set", &["--proto", "udp", "--dport", "53", "--total-burst", "10"], &["--total-burst", "--total-rate"]),
        ("set", &["--proto", "udp", "--dport", "53", "--total-rate", "fast"], &["--total-rate", "unit", "number"]),
        // Ties with the rules in force: same order, one frame matches both.
        ("set", &["--proto", "udp", "--dport", "1500-2499"], &["tie"]),
        ("set", &["--proto", "tcp", "--tcp-flags", "ack"], &["tie"]),
        // Removing a class that has no rule.
        ("rm", &["--proto", "udp", "--dport", "53"], &["no rule", "not found", "no such"]),
        ("rm", &["--proto", "bogus"], &["unknown protocol"]),
    ];
    let mut fails = Vec::new();
    for (verb, args, needles) in cases {
        let before = state(&sb);
        let mut v = vec!["rule", verb, p];
        v.extend_from_slice(args);
        // `set` gets a valid per-source rate: the case's own fault is the
        // only one.
        if *verb == "set" {
            v.extend_from_slice(rate);
        }
        let out = cli(&sb, &v);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let what = v.join(" ");
        eprintln!("`{what}`: exit {:?}: {}", out.status.code(), err.trim());
        if out.status.success() {
            fails.push(format!("`{what}` succeeded: {}", String::from_utf8_lossy(&out.stdout)));
        } else if err.contains("panicked") {
            fails.push(format!("`{what}` panicked: {err}"));
        } else if !needles.iter().any(|n| err.to_lowercase().contains(&n.to_lowercase())) {
            fails.push(format!("`{what}`: the message names none of {needles:?}: {}", err.trim()));
        }
        if state(&sb) != before {
            fails.push(format!("`{what}` changed rule ls --json or the config file"));
        }
    }
    assert!(fails.is_empty(), "{} of {} bad inputs:\n{}", fails.len(), cases.len(), fails.join("\n"));
}

/// `rule rm CIDR` with a class removes that rule only, on real traffic:
/// its class stops policing at once, the prefix's other class and its
/// class-less rule stay, and `rule ls --json` shows it gone.
#[test]
fn removing_a_class_stops_only_that_class() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("crm");
    let _d = daemon(&sb);
    rule_set(&sb, &["198.18.0.0/24", "--rate", "20kpps", "--burst", "200"]);
    rule_set(
        &sb,
        &["198.18.0.0/24", "--proto", "tcp", "--tcp-flags", "syn,!ack", "--rate", "1000pps", "--burst", "10"],
    );
    rule_set(&sb, &["198.18.0.0/24", "--proto", "udp", "--dport", "53", "--rate", "1000pps", "--burst", "10"]);
    let d = ip(DST4);
    let round = |n: u32, syn_policed: bool| {
        let s = ip(&format!("198.18.0.{n}"));
        let f = |spec, pps| SpecFlow { spec, pps };
        shapes(
            "rm",
            &sb,
            &[
                ("bare SYN", f(FrameSpec::tcp(s, d, 64, 1, 80, TCP_SYN), 3000.0), syn_policed),
                ("UDP 53", f(FrameSpec::udp_to(s, d, 64, 53), 3000.0), true),
                ("ACK", f(FrameSpec::tcp(s, d, 64, 1, 80, TCP_ACK), 3000.0), false),
            ],
        );
    };
    round(1, true);
    let out = cli(&sb, &["rule", "rm", "198.18.0.0/24", "--proto", "tcp", "--tcp-flags", "syn,!ack"]);
    succeeds(&out);
    let ls = succeeds(&cli(&sb, &["rule", "ls", "--json"]));
    let rules: serde_json::Value = serde_json::from_str(&ls).unwrap();
    let classes: Vec<&str> = rules
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["prefix"] == "198.18.0.0/24")
        .map(|r| r["class"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(classes.len(), 2, "198.18.0.0/24 after rm: {classes:?}");
    assert!(classes.contains(&"udp dport 53") && !classes.iter().any(|c| c.contains("syn")), "{classes:?}");
    round(2, false);
}

/// A DNS flood at 10x a `udp --dport 53` class (1000 pps, burst BURST) from
/// `src`, beside the same source's other UDP (port 123, 1000 pps), for
/// `secs`: the flood gets what an exact policer admits (0.5 % + 2), and
/// rate x T + burst +-1 % when the sender kept its pace; the other UDP
/// all. Returns whether the sender kept its pace (a try to repeat if not).
fn dns_round(sb: &Sandbox, what: &str, src: IpAddr, secs: u64) -> bool {
    let d = ip(DST4);
    let flows = [
        SpecFlow { spec: FrameSpec::udp_to(src, d, 64, 53), pps: 10_000.0 },
        SpecFlow { spec: FrameSpec::udp_to(src, d, 64, 123), pps: 1_000.0 },
    ];
    let (sent, got) = traffic::run_specs(sb, &flows, Duration::from_secs(secs), &RunOptions::default());
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    let o = outcome(&sent, &got, 0, &pps(1000, BURST), 1000.0, BURST as f64);
    eprintln!(
        "{what}: DNS sent {}, admitted {}, exact {}, rate x T + burst {:.1}; other UDP {}/{}",
        sent.sent[0], o.admitted, o.exact, o.ideal, got.per_flow[1], sent.sent[1]
    );
    assert_exact(&o, &format!("{what}: the DNS flood"));
    assert_all_passed(&sent, &got, 1, &format!("{what}: the same source's other UDP"));
    if o.smooth {
        assert!(sent.sent[0] as f64 >= 9_800.0 * secs as f64, "generator fell short: {}", sent.sent[0]);
        assert!(
            (o.admitted - o.ideal).abs() <= o.ideal * 0.01,
            "{what}: admitted {}, expected {:.1} +-1 %",
            o.admitted,
            o.ideal
        );
    }
    o.smooth
}

/// The classes of `prefix` in `rule ls --json`.
fn classes_of(sb: &Sandbox, prefix: &str) -> Vec<String> {
    let ls = succeeds(&cli(sb, &["rule", "ls", "--json"]));
    let rules: serde_json::Value = serde_json::from_str(&ls).expect("rule ls --json is JSON");
    rules
        .as_array()
        .expect("rule ls --json is an array")
        .iter()
        .filter(|r| r["prefix"] == prefix)
        .map(|r| r["class"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// Issue 17 with the Lifecycle section: a daemon with a DNS class and a
/// class-less rule, started with `--persist`, is killed with -9. While no
/// daemon runs, the kernel still holds a DNS flood to the class's budget
/// and lets the source's other UDP through; a second daemon on the same
/// config adopts the program, `rule ls --json` shows the class rule, and
/// the class is still in force (+-1 %) with the other UDP passing in full.
#[test]
fn adoption_keeps_classes_in_force() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("cadopt");
    let args = ["--rate", "100kpps", "--burst", "1000", "--interval", "0", "--max-sources", "65536", "--persist"];
    let mut a = Daemon::attach(&sb, &args);
    rule_set(&sb, &["198.18.0.0/24", "--rate", "20kpps", "--burst", "200"]);
    rule_set(&sb, &["198.18.0.0/24", "--proto", "udp", "--dport", "53", "--rate", "1000pps", "--burst", BURST_ARG]);
    let id_a: u32 = sb.rx_xdp().expect("no XDP program attached").parse().unwrap();
    // Under the first daemon (a source of its own), so buckets and
    // counters hold something when it dies.
    dns_round(&sb, "daemon A", ip("198.18.0.1"), 1);
    a.stop_with(libc::SIGKILL);
    assert_eq!(sb.rx_xdp().map(|s| s.parse::<u32>().unwrap()), Some(id_a), "program gone after kill -9");
    let out = cli(&sb, &["rule", "ls"]);
    assert!(!out.status.success(), "rule ls answered with no daemon: {}", String::from_utf8_lossy(&out.stdout));

    // No daemon: the kernel enforces the class alone.
    let mut smooth = false;
    for n in 2..=6 {
        traffic::settle_disk();
        smooth = dns_round(&sb, "no daemon", ip(&format!("198.18.0.{n}")), 3);
        if smooth {
            break;
        }
    }
    assert!(smooth, "the generator could not send smoothly in five tries: machine overloaded");
    assert_eq!(sb.rx_xdp().map(|s| s.parse::<u32>().unwrap()), Some(id_a), "the orphaned program changed");

    // A second daemon on the same config adopts it.
    let mut b = Daemon::attach(&sb, &args);
    eprintln!("daemon B said:\n{}", b.stdout());
    assert!(
        b.stdout().contains(&format!("adopting the policer already running (program {id_a})")),
        "did not adopt program {id_a}:\n{}",
        b.stdout()
    );
    let mut classes = classes_of(&sb, "198.18.0.0/24");
    classes.sort();
    assert_eq!(classes, ["-", "udp dport 53"], "rule ls --json after the adoption");
    let ls: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["rule", "ls", "--json"]))).unwrap();
    let dns = ls.as_array().unwrap().iter().find(|r| r["class"] == "udp dport 53").unwrap();
    assert_eq!(dns["burst"], BURST, "the class rule's burst after the adoption: {dns}");
    assert!(dns["rate"].to_string().contains("1000") || dns["rate"].to_string().contains("1k"), "{dns}");
    let mut smooth = false;
    for n in 7..=11 {
        traffic::settle_disk();
        smooth = dns_round(&sb, "daemon B", ip(&format!("198.18.0.{n}")), 5);
        if smooth {
            break;
        }
    }
    assert!(smooth, "the generator could not send smoothly in five tries: machine overloaded");
    // The adopted daemon's own counters see the class.
    let s = stats(&sb);
    let e = rule_entries(&s, "198.18.0.0/24", "udp dport 53");
    assert_eq!(e.len(), 1, "stats --json after the adoption: {}", s["rules"]);
    assert!(field(e[0], &["dropped_packets", "dropped_pkts"]) > 0, "no drops counted for the class: {}", e[0]);
    assert!(b.stop_with(libc::SIGTERM));
    // --persist leaves it attached; detach to leave the sandbox clean.
    succeeds(&cli(&sb, &["detach", &sb.rx_if]));
}

/// The entries of `top --json`'s `list` (`by_debt`, `by_drops`) whose
/// source starts with `src`: (rule, fill, drops).
fn top_entries(top: &serde_json::Value, list: &str, src: &str) -> Vec<(String, f64, u64)> {
    top[list]
        .as_array()
        .unwrap_or_else(|| panic!("top --json has no {list}: {top}"))
        .iter()
        .filter(|e| e["source"].as_str().is_some_and(|s| s.starts_with(src)))
        .map(|e| {
            (
                e["rule"].as_str().unwrap_or("?").to_string(),
                e["fill"].as_f64().unwrap_or(-1.0),
                e["drops"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Issue 17 point 5: `policer top --json` shows a class bucket with its
/// class rule (`198.18.0.0/24 [udp dport 53]`), apart from the same
/// source's class-less bucket (`198.18.0.0/24`), for IPv4 and IPv6
/// sources: during a DNS flood the class bucket is the one at 100 % fill,
/// and after it the one with the drops.
#[test]
fn top_shows_class_buckets_with_their_class_rule() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("ctop");
    let _d = daemon(&sb);
    for p in ["198.18.0.0/24", "2001:db8:1::/48"] {
        rule_set(&sb, &[p, "--rate", "20kpps", "--burst", "200"]);
        // A 1 s bucket (100 pps, burst 100): under a 5 kpps flood its debt
        // stays within 10 ms of full, whatever gap a loaded sender leaves.
        rule_set(&sb, &[p, "--proto", "udp", "--dport", "53", "--rate", "100pps", "--burst", "100"]);
    }
    let (s4, s6) = (ip("198.18.0.5"), ip("2001:db8:1:5::1"));
    let (d4, d6) = (ip(DST4), ip(DST6));
    let flows = [
        SpecFlow { spec: FrameSpec::udp_to(s4, d4, 64, 53), pps: 5000.0 },
        SpecFlow { spec: FrameSpec::udp_to(s4, d4, 64, 123), pps: 500.0 },
        SpecFlow { spec: FrameSpec::udp_to(s6, d6, 100, 53), pps: 5000.0 },
        SpecFlow { spec: FrameSpec::udp_to(s6, d6, 100, 123), pps: 500.0 },
    ];
    let (during, (sent, got)) = std::thread::scope(|sc| {
        let h = sc.spawn(|| traffic::run_specs(&sb, &flows, Duration::from_secs(3), &RunOptions::default()));
        std::thread::sleep(Duration::from_millis(1500));
        let top: serde_json::Value =
            serde_json::from_str(&succeeds(&cli(&sb, &["top", "-n", "50", "--json"]))).expect("top --json is JSON");
        (top, h.join().unwrap())
    });
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    eprintln!("sent {:?}, arrived {:?}", sent.sent, got.per_flow);
    // The floods were policed, the other UDP was not (so the buckets are
    // what the test says they are).
    for i in [0, 2] {
        assert!(got.per_flow[i] < sent.sent[i] / 3, "flow {i}: the DNS flood was not policed");
    }
    assert_all_passed(&sent, &got, 1, "IPv4 other UDP");
    assert_all_passed(&sent, &got, 3, "IPv6 other UDP");
    let after: serde_json::Value =
        serde_json::from_str(&succeeds(&cli(&sb, &["top", "-n", "50", "--json"]))).expect("top --json is JSON");
    eprintln!("top during the flood: {during}\ntop after it: {after}");
    let mut fails = Vec::new();
    for (src, prefix) in [("198.18.0.5", "198.18.0.0/24"), ("2001:db8:1:5:", "2001:db8:1::/48")] {
        let class_rule = format!("{prefix} [udp dport 53]");
        // During the flood: the class bucket is full; the class-less one
        // (500 pps against 20 kpps: each frame's 50 µs of debt drains long
        // before the next) has no debt to list, or is listed under its own
        // rule without drops. `inspect` lists it after the flood (below).
        let now = top_entries(&during, "by_debt", src);
        match now.iter().find(|e| e.0 == class_rule) {
            Some(e) if e.1 >= 0.9 => {}
            Some(e) => fails.push(format!("{src}: the class bucket at {} fill during the flood", e.1)),
            None => fails.push(format!("{src}: no by_debt entry with rule '{class_rule}' during the flood: {now:?}")),
        }
        if let Some(e) = now.iter().find(|e| e.0 == prefix)
            && e.2 != 0
        {
            fails.push(format!("{src}: the class-less bucket with {} drops", e.2));
        }
        if now.iter().any(|e| e.0 != class_rule && e.0 != prefix) {
            fails.push(format!("{src}: entries with another rule: {now:?}"));
        }
        // After it: the drops are the class bucket's.
        let then = top_entries(&after, "by_drops", src);
        match then.iter().find(|e| e.0 == class_rule) {
            Some(e) if e.2 > 0 => {}
            other => fails.push(format!("{src}: by_drops has no class bucket with drops: {other:?} of {then:?}")),
        }
        if then.iter().any(|e| e.0 == prefix && e.2 > 0) {
            fails.push(format!("{src}: drops on the class-less bucket: {then:?}"));
        }
    }
    // Every bucket of the source, each under its rule: the class-less one
    // without drops, the class one with them.
    for (src, prefix) in [("198.18.0.5", "198.18.0.0/24"), ("2001:db8:1:5::1", "2001:db8:1::/48")] {
        let i: serde_json::Value =
            serde_json::from_str(&succeeds(&cli(&sb, &["inspect", src, "--json"]))).expect("inspect --json is JSON");
        let buckets = i["buckets"].as_array().cloned().unwrap_or_default();
        let of = |rule: &str| buckets.iter().find(|b| b["rule"] == rule).map(|b| b["drops"].as_u64().unwrap_or(0));
        match (of(prefix), of(&format!("{prefix} [udp dport 53]"))) {
            (Some(0), Some(d)) if d > 0 => {}
            other => fails.push(format!("{src}: inspect's buckets (class-less, class drops) {other:?}: {i}")),
        }
    }
    assert!(fails.is_empty(), "top --json / inspect --json:\n{}", fails.join("\n"));
}

/// The value of the sample `name` (no labels) in a `/metrics` text.
fn sample(text: &str, name: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
        .trim()
        .parse::<f64>()
        .unwrap() as u64
}

/// Issue 17's limits: at most 8 classes (of a prefix and the shorter
/// prefixes it falls to) can compete for one frame. Eight nested UDP port
/// ranges on a /24 are taken; a ninth, or one class on a /25 without a
/// class-less rule (it falls to the /24's eight), is refused saying "at
/// most 8", and `rule ls --json` and the config file are unchanged; once
/// the /25 has a class-less rule its class no longer competes with the
/// /24's and is taken. Then on real traffic: frames a class matched are
/// counted in `policer_class_matched_total` and `stats --json`'s
/// `class_matched`, one for one, and frames no class matched are not.
#[test]
fn class_limits_refuse_and_class_matched_counts() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("clim");
    let _d = Daemon::attach(
        &sb,
        &["--rate", "100kpps", "--burst", "1000", "--interval", "0", "--max-sources", "65536", "--metrics", "9464"],
    );
    let p = "198.18.0.0/24";
    // 50-60 (the narrowest, so the one a port-55 frame gets) .. 43-67.
    for i in 0..8u16 {
        let ports = format!("{}-{}", 50 - i, 60 + i);
        rule_set(&sb, &[p, "--proto", "udp", "--dport", &ports, "--rate", "1000pps", "--burst", "10"]);
    }
    assert_eq!(classes_of(&sb, p).len(), 8, "eight classes installed");
    let refused = |args: &[&str]| {
        let before = state(&sb);
        let mut v = vec!["rule", "set"];
        v.extend_from_slice(args);
        v.extend_from_slice(&["--rate", "1000pps", "--burst", "10"]);
        let out = cli(&sb, &v);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        eprintln!("`{}`: exit {:?}: {}", v.join(" "), out.status.code(), err.trim());
        assert!(!out.status.success(), "`{}` succeeded", v.join(" "));
        assert!(err.contains("at most 8") && !err.contains("panicked"), "`{}`: {err}", v.join(" "));
        assert!(state(&sb) == before, "`{}` changed rule ls --json or the config file", v.join(" "));
    };
    // A ninth nested range on the same prefix.
    refused(&[p, "--proto", "udp", "--dport", "42-68"]);
    // A ninth that matches every UDP frame (no port).
    refused(&[p, "--proto", "udp"]);
    // A class on a longer prefix with no class-less rule of its own falls
    // to the /24's classes: nine compete.
    refused(&["198.18.0.0/25", "--proto", "udp", "--dport", "55"]);
    // With a class-less rule that stops inheritance (issue 43 point 6:
    // else the /24's classes apply under it too) the /25's frames never
    // reach the /24's classes: its class is taken.
    rule_set(&sb, &["198.18.0.0/25", "--rate", "20kpps", "--burst", "200", "--no-inherit"]);
    rule_set(&sb, &["198.18.0.0/25", "--proto", "udp", "--dport", "55", "--rate", "1000pps", "--burst", "10"]);
    assert_eq!(classes_of(&sb, "198.18.0.0/25").len(), 2, "the /25's rules");

    // class_matched on real traffic: port 55 from the /24 (a class
    // matches: the narrowest, 1000 pps), port 123 from it (none does: the
    // default rule), port 55 from the /25 (its own class), port 123 from
    // the /25 (its class-less rule).
    let d = ip(DST4);
    let (s24, s25) = (ip("198.18.0.200"), ip("198.18.0.7"));
    let flows = [
        SpecFlow { spec: FrameSpec::udp_to(s24, d, 64, 55), pps: 3000.0 },
        SpecFlow { spec: FrameSpec::udp_to(s24, d, 64, 123), pps: 1000.0 },
        SpecFlow { spec: FrameSpec::udp_to(s25, d, 64, 55), pps: 2000.0 },
        SpecFlow { spec: FrameSpec::udp_to(s25, d, 64, 123), pps: 1000.0 },
    ];
    let m0 = sample(&scrape(&sb.rx_ns, 9464), "policer_class_matched_total");
    let s0 = field(&stats(&sb)["totals"], &["class_matched"]);
    let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(3), &RunOptions::default());
    assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
    let m1 = sample(&scrape(&sb.rx_ns, 9464), "policer_class_matched_total");
    let s1 = field(&stats(&sb)["totals"], &["class_matched"]);
    eprintln!(
        "sent {:?}, arrived {:?}; class_matched: /metrics {m0} -> {m1}, stats {s0} -> {s1}",
        sent.sent, got.per_flow
    );
    let matched = sent.sent[0] + sent.sent[2];
    assert_eq!(m1 - m0, matched, "policer_class_matched_total: frames a class matched ({matched})");
    assert_eq!(s1 - s0, matched, "stats --json totals.class_matched: frames a class matched ({matched})");
    // And the classes policed what they matched; the rest passed.
    assert_exact(&outcome(&sent, &got, 0, &pps(1000, 10), 1000.0, 10.0), "port 55 from the /24");
    assert_exact(&outcome(&sent, &got, 2, &pps(1000, 10), 1000.0, 10.0), "port 55 from the /25");
    assert_all_passed(&sent, &got, 1, "port 123 from the /24");
    assert_all_passed(&sent, &got, 3, "port 123 from the /25");
}

/// The sender kept its pace: the exact policer over the real send times
/// within 0.2 % (at least two frames: at 100 pps 0.2 % is under one) of
/// rate x T + burst.
fn kept_pace(o: &Outcome) -> bool {
    (o.exact - o.ideal).abs() <= (0.002 * o.ideal).max(2.0)
}

/// Issue 43 point 6, the case: a `0.0.0.0/0 udp dport 53` class at
/// 300 pps, then `rule set 198.18.0.0/24 --rate 100pps`: the reply and its
/// dry run say the /0's class still applies under the /24; `inspect` gives
/// the /24's DNS to that class; on the wire the /24's DNS is held to the
/// class's budget and its other UDP to the /24's, each exact against the
/// frames as really sent (counted on the receiving side). `--no-inherit`
/// restores the /24's own rule for its DNS (the behaviour before), and its
/// reply says what it hides.
#[test]
fn a_longer_prefix_keeps_the_classes_of_shorter_ones_unless_it_opts_out() {
    if !privileged("classes tier") {
        return;
    }
    let sb = Sandbox::new("inherit");
    let _d = daemon(&sb);
    // Bursts of 100 ms at each rate: they bank the sender's stalls (BURST).
    rule_set(&sb, &["0.0.0.0/0", "--proto", "udp", "--dport", "53", "--rate", "300pps", "--burst", "30"]);
    let set24 = ["rule", "set", "198.18.0.0/24", "--rate", "100pps", "--burst", "10"];
    let dry = succeeds(&cli(&sb, &[&set24[..], &["--dry-run"]].concat()));
    let said = |out: &str, what: &str| {
        assert!(out.contains("0.0.0.0/0 [udp dport 53]") && out.contains(what), "{what}: {out}");
    };
    said(&dry, "still apply to its sources");
    let out = succeeds(&cli(&sb, &set24));
    said(&out, "still apply to its sources");
    // inspect reads the program's maps: the /24's DNS goes to the class.
    let insp = succeeds(&cli(&sb, &["inspect", "198.18.0.1", "--proto", "udp", "--dport", "53", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&insp).expect("inspect --json is JSON");
    assert_eq!(v["class"], "udp dport 53", "inspect: {insp}");
    let d = ip(DST4);
    let mut done = false;
    for attempt in 1..=SMOOTH_TRIES {
        traffic::settle_disk();
        let src = ip(&format!("198.18.0.{attempt}"));
        let flows = [
            SpecFlow { spec: FrameSpec::udp_to(src, d, 64, 53), pps: 1_000.0 },
            SpecFlow { spec: FrameSpec::udp_to(src, d, 64, 123), pps: 400.0 },
        ];
        let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(4), &RunOptions::default());
        assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
        let dns = outcome(&sent, &got, 0, &pps(300, 30), 300.0, 30.0);
        let other = outcome(&sent, &got, 1, &pps(100, 10), 100.0, 10.0);
        eprintln!(
            "inherit try {attempt}: DNS sent {} admitted {} exact (class 300 pps) {}; other UDP sent {} admitted {} \
             exact (/24 100 pps) {}",
            sent.sent[0], dns.admitted, dns.exact, sent.sent[1], other.admitted, other.exact
        );
        assert_exact(&dns, "the /24's DNS under the /0's class");
        assert_exact(&other, "the /24's other UDP under its own rule");
        if kept_pace(&dns) && kept_pace(&other) {
            done = true;
            break;
        }
    }
    assert!(done, "the generator could not send smoothly in {SMOOTH_TRIES} tries: machine overloaded");
    // The opt-out: the /24's own rule for all of its traffic again.
    let out = succeeds(&cli(&sb, &["rule", "set", "198.18.0.0/24", "--no-inherit"]));
    said(&out, "no longer apply to its sources");
    let insp = succeeds(&cli(&sb, &["inspect", "198.18.0.9", "--proto", "udp", "--dport", "53", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&insp).expect("inspect --json is JSON");
    assert_eq!(v["class"], "-", "inspect after --no-inherit: {insp}");
    for attempt in 1..=SMOOTH_TRIES {
        traffic::settle_disk();
        let src = ip(&format!("198.18.0.{}", 10 + attempt));
        let flows = [SpecFlow { spec: FrameSpec::udp_to(src, d, 64, 53), pps: 1_000.0 }];
        let (sent, got) = traffic::run_specs(&sb, &flows, Duration::from_secs(4), &RunOptions::default());
        assert_eq!(got.socket_drops, 0, "receive socket lost frames: counts not trustworthy");
        let dns = outcome(&sent, &got, 0, &pps(100, 10), 100.0, 10.0);
        eprintln!(
            "no-inherit try {attempt}: DNS sent {} admitted {} exact (/24 100 pps) {}",
            sent.sent[0], dns.admitted, dns.exact
        );
        assert_exact(&dns, "the /24's DNS under its own rule after --no-inherit");
        if kept_pace(&dns) {
            return;
        }
    }
    panic!("the generator could not send smoothly in {SMOOTH_TRIES} tries: machine overloaded");
}
