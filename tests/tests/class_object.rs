//! Tier 2, classes (issue 17): the real compiled XDP object under
//! BPF_PROG_TEST_RUN with class rules compiled by the daemon's own
//! compiler (`policer_user::compile::compile`) and written into its maps.
//!
//! - a table of frames x class rules: for each frame the verdict, the rule
//!   it is counted on (its counter slot moves by exactly one), and that
//!   rule is the one the daemon's reference resolver names;
//! - with a clock the test controls: a source's class buckets are separate
//!   from its default bucket and from other sources'; an aggregate
//!   (`--total-rate`) holds all sources together to its budget, with and
//!   without a per-source rate, and its drops are counted as such.

use std::net::IpAddr;

use policer_common::{
    BucketKey, FAMILY_V4, Rule,
    bucket::Action,
    class::{TCP_ACK, TCP_RST, TCP_SYN},
    rate::Rate,
};
use policer_tests::{
    classes::{install, kernel_rule, with_total},
    frame::{Ext, FrameSpec, L4},
    privileged,
    reference::{self, Expect},
};
use policer_user::{LoadOptions, Policer, compile::KernelRule, resolve::Resolver};

const PASS: u32 = 2;
const DROP: u32 = 1;
const SEC: u64 = 1_000_000_000;
const T0: u64 = 50 * SEC;

fn load() -> Policer {
    let mut p =
        Policer::load(&LoadOptions { max_sources: 4096, test_clock: true, ..Default::default() }).expect("load object");
    p.set_clock(T0).unwrap();
    p
}

fn run(p: &mut Policer, frame: &[u8]) -> u32 {
    policer_tests::test_run(p, frame)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn police(rate: &str, burst: u64, v6: bool) -> Rule {
    let r = Rate::parse(rate).unwrap().rule(burst).unwrap();
    r.with_key_len(if v6 { 64 } else { 32 }, v6).unwrap()
}

fn act(a: Action, v6: bool) -> Rule {
    police("1pps", 1, v6).with_action(a)
}

fn slot_passed_dropped(p: &Policer, slot: u32) -> (u64, u64) {
    let v = p.shared_maps().unwrap().rule_counters(slot).unwrap();
    (v.iter().map(|c| c.passed_pkts).sum(), v.iter().map(|c| c.dropped_pkts).sum())
}

// The table's rules. Every class denies or allows, so the verdict shows at
// once whether a class or the class-less rule (police, a large burst) took
// the frame; the counter slot says which one.
const A_DEFAULT: u32 = 2;
const A_SYN: u32 = 3;
const A_DNS: u32 = 4;
const A_RANGE: u32 = 5;
const A_MDNS: u32 = 6;
const A_ECHO: u32 = 7;
const A_DST: u32 = 8;
const A_GRE: u32 = 9;
const B_UDP: u32 = 10;
const C_DEFAULT: u32 = 11;
const C_HTTP: u32 = 12;
const V6_DEFAULT: u32 = 13;
const V6_DNS: u32 = 14;
const V6_SYN: u32 = 15;
const V6_ECHO: u32 = 16;
const A_NTP: u32 = 17;
const A_TLS: u32 = 18;
const V6_SDNS: u32 = 19;
const ANY: u32 = 1;
const D_DEFAULT: u32 = 20;
const E_DEFAULT: u32 = 21;
const E_DNS: u32 = 22;

fn table_rules() -> Vec<KernelRule> {
    use Action::{Allow, Deny};
    vec![
        kernel_rule("0.0.0.0/0", "", act(Allow, false), ANY),
        // A: 10/8, a class-less rule and classes.
        kernel_rule("10.0.0.0/8", "", police("1Mpps", 100_000, false), A_DEFAULT),
        kernel_rule("10.0.0.0/8", "proto=tcp tcp-flags=syn,!ack", act(Deny, false), A_SYN),
        kernel_rule("10.0.0.0/8", "proto=udp dport=53", act(Deny, false), A_DNS),
        kernel_rule("10.0.0.0/8", "proto=udp dport=5000-5999", act(Deny, false), A_RANGE),
        kernel_rule("10.0.0.0/8", "proto=udp dport=5353", act(Allow, false), A_MDNS),
        kernel_rule("10.0.0.0/8", "proto=icmp icmp-type=8", act(Deny, false), A_ECHO),
        kernel_rule("10.0.0.0/8", "dst=192.0.2.0/24", act(Deny, false), A_DST),
        kernel_rule("10.0.0.0/8", "proto=47", act(Deny, false), A_GRE),
        // Source ports (issue 46): alone, and with a destination port.
        kernel_rule("10.0.0.0/8", "proto=udp sport=123", act(Deny, false), A_NTP),
        kernel_rule("10.0.0.0/8", "proto=tcp sport=1024-65535 dport=8443", act(Deny, false), A_TLS),
        // B: 10.1/16, one port-less class and no class-less rule (falls to A).
        kernel_rule("10.1.0.0/16", "proto=udp", act(Deny, false), B_UDP),
        // C: 10.2/16, its own class-less rule that says `inherit = false`
        // (stops the fall to A's classes).
        KernelRule { inherit: false, ..kernel_rule("10.2.0.0/16", "", act(Allow, false), C_DEFAULT) },
        kernel_rule("10.2.0.0/16", "proto=tcp dport=80", act(Deny, false), C_HTTP),
        // D: 10.3/16, a class-less rule alone: A's classes apply under it
        // (issue 43 point 6), its own rule takes the rest.
        kernel_rule("10.3.0.0/16", "", act(Allow, false), D_DEFAULT),
        // E: 10.4/16, its own class-less rule and a DNS class of its own:
        // A's DNS class is shadowed, A's other classes apply.
        kernel_rule("10.4.0.0/16", "", act(Allow, false), E_DEFAULT),
        kernel_rule("10.4.0.0/16", "proto=udp dport=53", act(Allow, false), E_DNS),
        kernel_rule("2001:db8::/32", "", police("1Mpps", 100_000, true), V6_DEFAULT),
        kernel_rule("2001:db8::/32", "proto=udp dport=53", act(Deny, true), V6_DNS),
        kernel_rule("2001:db8::/32", "proto=tcp tcp-flags=syn", act(Deny, true), V6_SYN),
        kernel_rule("2001:db8::/32", "proto=icmpv6 icmp-type=128", act(Deny, true), V6_ECHO),
        kernel_rule("2001:db8::/32", "proto=udp sport=53", act(Deny, true), V6_SDNS),
    ]
}

/// Frames x class rules: verdict, the rule counted, and the reference
/// resolver's agreement, row by row.
#[test]
fn class_frame_table() {
    if !privileged("object tier") {
        return;
    }
    let mut p = load();
    let rules = table_rules();
    install(&mut p, &rules, &[], T0);
    let (d4, d4x, d6) = (ip("198.19.0.1"), ip("192.0.2.1"), ip("2001:db8:ffff::1"));
    let tcp = |src: &str, dport: u16, flags: u8| FrameSpec::tcp(ip(src), d4, 80, 40000, dport, flags);
    let udp = |src: &str, dport: u16| FrameSpec::udp_to(ip(src), d4, 64, dport);
    let tagged = |mut s: FrameSpec, tags: &[(u16, u16)]| {
        s.vlans = tags.to_vec();
        s
    };
    let frag4 = |mut s: FrameSpec, off: u16, more: bool| {
        s.ipv4_frag = Some((off, more));
        s
    };
    let from = |src: &str, sport: u16, dport: u16| udp(src, dport).with_l4(L4::Udp { sport, dport });
    let tcp6 = |dport: u16, flags: u8| FrameSpec::tcp(ip("2001:db8::1"), d6, 100, 40000, dport, flags);
    let udp6 = |dport: u16| FrameSpec::udp_to(ip("2001:db8::1"), d6, 100, dport);
    let from6 = |sport: u16, dport: u16| udp6(dport).with_l4(L4::Udp { sport, dport });
    let ext = |mut s: FrameSpec, e: &[Ext]| {
        s.ipv6_ext = e.to_vec();
        s
    };
    let mut echo_reply = FrameSpec::echo(ip("10.0.0.1"), d4, 64);
    echo_reply.l4 = L4::Icmp { typ: 0, code: 0 };
    let mut echo6_reply = FrameSpec::echo(ip("2001:db8::1"), d6, 100);
    echo6_reply.l4 = L4::Icmp { typ: 129, code: 0 };
    let (qinq, dot1q) = (&[(0x88a8, 100), (0x8100, 200)][..], &[(0x8100, 300)][..]);
    let frag_first = Ext::Fragment { offset: 0, more: true };
    let frag_later = Ext::Fragment { offset: 181, more: false };
    // (what, frame, expected rule slot, verdict)
    let table: Vec<(&str, FrameSpec, u32, u32)> = vec![
        ("bare SYN: the SYN class", tcp("10.0.0.1", 22, TCP_SYN), A_SYN, DROP),
        ("SYN+ACK: not a bare SYN, class-less", tcp("10.0.0.1", 22, TCP_SYN | TCP_ACK), A_DEFAULT, PASS),
        ("ACK: class-less", tcp("10.0.0.1", 22, TCP_ACK), A_DEFAULT, PASS),
        ("RST: class-less", tcp("10.0.0.1", 22, TCP_RST), A_DEFAULT, PASS),
        ("UDP 53: the DNS class", udp("10.0.0.1", 53), A_DNS, DROP),
        ("UDP 54: class-less", udp("10.0.0.1", 54), A_DEFAULT, PASS),
        ("UDP 52: class-less", udp("10.0.0.1", 52), A_DEFAULT, PASS),
        ("UDP 5000: range start", udp("10.0.0.1", 5000), A_RANGE, DROP),
        ("UDP 5999: range end", udp("10.0.0.1", 5999), A_RANGE, DROP),
        ("UDP 6000: past the range", udp("10.0.0.1", 6000), A_DEFAULT, PASS),
        ("UDP 4999: before the range", udp("10.0.0.1", 4999), A_DEFAULT, PASS),
        ("UDP 5353: one port beats the range around it", udp("10.0.0.1", 5353), A_MDNS, PASS),
        ("TCP 53: the DNS class is UDP only", tcp("10.0.0.1", 53, TCP_ACK), A_DEFAULT, PASS),
        ("ICMP echo request: the echo class", FrameSpec::echo(ip("10.0.0.1"), d4, 64), A_ECHO, DROP),
        ("ICMP echo reply: class-less", echo_reply, A_DEFAULT, PASS),
        ("to 192.0.2.1, UDP 54: the --dst class", FrameSpec::udp_to(ip("10.0.0.1"), d4x, 64, 54), A_DST, DROP),
        (
            "to 192.0.2.1, UDP 53: two fields beat --dst alone",
            FrameSpec::udp_to(ip("10.0.0.1"), d4x, 64, 53),
            A_DNS,
            DROP,
        ),
        (
            "to 192.0.2.1, UDP 5353: (allow) two fields beat --dst",
            FrameSpec::udp_to(ip("10.0.0.1"), d4x, 64, 5353),
            A_MDNS,
            PASS,
        ),
        ("to 192.0.2.1, TCP ACK: --dst", FrameSpec::tcp(ip("10.0.0.1"), d4x, 80, 1, 22, TCP_ACK), A_DST, DROP),
        ("GRE: the protocol class", udp("10.0.0.1", 53).with_l4(L4::Other(47)), A_GRE, DROP),
        ("802.1Q, UDP 53", tagged(udp("10.0.0.1", 53), dot1q), A_DNS, DROP),
        ("802.1Q, UDP 54", tagged(udp("10.0.0.1", 54), dot1q), A_DEFAULT, PASS),
        ("QinQ, bare SYN", tagged(tcp("10.0.0.1", 22, TCP_SYN), qinq), A_SYN, DROP),
        ("QinQ, ACK", tagged(tcp("10.0.0.1", 22, TCP_ACK), qinq), A_DEFAULT, PASS),
        ("IPv4 first fragment, UDP 53", frag4(udp("10.0.0.1", 53), 0, true), A_DNS, DROP),
        (
            "IPv4 later fragment (port-53 look-alike): no port, class-less",
            frag4(udp("10.0.0.1", 53), 185, true),
            A_DEFAULT,
            PASS,
        ),
        (
            "IPv4 last fragment (SYN look-alike): class-less",
            frag4(tcp("10.0.0.1", 22, TCP_SYN), 185, false),
            A_DEFAULT,
            PASS,
        ),
        ("B: UDP 53, the longer prefix's UDP class wins", udp("10.1.0.1", 53), B_UDP, DROP),
        ("B: IPv4 later fragment, UDP class without port matches", frag4(udp("10.1.0.1", 53), 185, false), B_UDP, DROP),
        ("B: first fragment", frag4(udp("10.1.0.1", 9), 0, true), B_UDP, DROP),
        ("B: bare SYN falls to A's SYN class", tcp("10.1.0.1", 22, TCP_SYN), A_SYN, DROP),
        ("B: ACK falls to A's class-less rule", tcp("10.1.0.1", 22, TCP_ACK), A_DEFAULT, PASS),
        ("C: bare SYN stops at C's class-less rule", tcp("10.2.0.1", 22, TCP_SYN), C_DEFAULT, PASS),
        ("C: TCP 80", tcp("10.2.0.1", 80, TCP_ACK), C_HTTP, DROP),
        ("C: later fragment (port-80 look-alike)", frag4(tcp("10.2.0.1", 80, TCP_ACK), 100, false), C_DEFAULT, PASS),
        ("no prefix with classes", tcp("192.168.0.1", 22, TCP_SYN), ANY, PASS),
        ("D: bare SYN, A's SYN class applies under D (inherited)", tcp("10.3.0.1", 22, TCP_SYN), A_SYN, DROP),
        ("D: UDP 53, A's DNS class (inherited)", udp("10.3.0.1", 53), A_DNS, DROP),
        ("D: ACK, D's own class-less rule", tcp("10.3.0.1", 22, TCP_ACK), D_DEFAULT, PASS),
        ("D: UDP 54, D's own class-less rule", udp("10.3.0.1", 54), D_DEFAULT, PASS),
        ("E: UDP 53, E's own DNS class shadows A's", udp("10.4.0.1", 53), E_DNS, PASS),
        ("E: bare SYN, A's SYN class (inherited)", tcp("10.4.0.1", 22, TCP_SYN), A_SYN, DROP),
        ("E: UDP 5000, A's range class (inherited)", udp("10.4.0.1", 5000), A_RANGE, DROP),
        ("E: ACK, E's own class-less rule", tcp("10.4.0.1", 22, TCP_ACK), E_DEFAULT, PASS),
        ("IPv6 UDP 53", udp6(53), V6_DNS, DROP),
        ("IPv6 UDP 54", udp6(54), V6_DEFAULT, PASS),
        ("IPv6 hop-by-hop + dest options, UDP 53", ext(udp6(53), &[Ext::HopByHop, Ext::DestOpts]), V6_DNS, DROP),
        ("IPv6 hop-by-hop + dest options, UDP 54", ext(udp6(54), &[Ext::HopByHop, Ext::DestOpts]), V6_DEFAULT, PASS),
        ("IPv6 fragment header offset 0, UDP 53", ext(udp6(53), &[frag_first]), V6_DNS, DROP),
        ("IPv6 later fragment (port-53 look-alike)", ext(udp6(53), &[frag_later]), V6_DEFAULT, PASS),
        (
            "IPv6 hop-by-hop, routing, AH, fragment 0, dest options, SYN",
            ext(tcp6(22, TCP_SYN), &[Ext::HopByHop, Ext::Routing, Ext::Ah, frag_first, Ext::DestOpts]),
            V6_SYN,
            DROP,
        ),
        ("IPv6 seven dest options, UDP 53", ext(udp6(53), &[Ext::DestOpts; 7]), V6_DNS, DROP),
        ("IPv6 SYN+ACK (syn: others don't care)", tcp6(22, TCP_SYN | TCP_ACK), V6_SYN, DROP),
        ("IPv6 ACK", tcp6(22, TCP_ACK), V6_DEFAULT, PASS),
        ("ICMPv6 echo request", FrameSpec::echo(ip("2001:db8::1"), d6, 100), V6_ECHO, DROP),
        ("ICMPv6 echo reply", echo6_reply, V6_DEFAULT, PASS),
        ("IPv6 QinQ, UDP 53", tagged(udp6(53), qinq), V6_DNS, DROP),
        ("UDP from 123: the source-port class", from("10.0.0.1", 123, 40000), A_NTP, DROP),
        ("UDP from 124: class-less", from("10.0.0.1", 124, 40000), A_DEFAULT, PASS),
        ("UDP from 123 to 53: the destination port's class wins a tie", from("10.0.0.1", 123, 53), A_DNS, DROP),
        ("UDP from 123 to 5353: (allow) the destination port's class", from("10.0.0.1", 123, 5353), A_MDNS, PASS),
        ("UDP from 123 to 5000: one source port beats a range of 1000", from("10.0.0.1", 123, 5000), A_NTP, DROP),
        (
            "TCP from 123: the NTP class is UDP only",
            FrameSpec::tcp(ip("10.0.0.1"), d4, 80, 123, 22, TCP_ACK),
            A_DEFAULT,
            PASS,
        ),
        ("TCP 40000 to 8443: source and destination port", tcp("10.0.0.1", 8443, TCP_ACK), A_TLS, DROP),
        (
            "TCP 80 to 8443: the source port below the range",
            FrameSpec::tcp(ip("10.0.0.1"), d4, 80, 80, 8443, TCP_ACK),
            A_DEFAULT,
            PASS,
        ),
        ("IPv4 first fragment from 123", frag4(from("10.0.0.1", 123, 40000), 0, true), A_NTP, DROP),
        (
            "IPv4 later fragment (from-123 look-alike): class-less",
            frag4(from("10.0.0.1", 123, 40000), 185, true),
            A_DEFAULT,
            PASS,
        ),
        ("B: UDP from 123, the longer prefix's UDP class wins", from("10.1.0.1", 123, 40000), B_UDP, DROP),
        ("C: UDP from 123 stops at C's class-less rule", from("10.2.0.1", 123, 40000), C_DEFAULT, PASS),
        ("IPv6 UDP from 53: the source-port class", from6(53, 40000), V6_SDNS, DROP),
        ("IPv6 UDP from 53 to 53: the destination port's class", from6(53, 53), V6_DNS, DROP),
        ("IPv6 UDP from 54: class-less", from6(54, 40000), V6_DEFAULT, PASS),
        ("IPv6 first fragment from 53", ext(from6(53, 40000), &[frag_first]), V6_SDNS, DROP),
        ("IPv6 later fragment (from-53 look-alike)", ext(from6(53, 40000), &[frag_later]), V6_DEFAULT, PASS),
        ("IPv6 802.1Q, hop-by-hop, SYN", tagged(ext(tcp6(443, TCP_SYN), &[Ext::HopByHop]), dot1q), V6_SYN, DROP),
    ];
    let mut class_hits = 0;
    let mut fails = Vec::new();
    for (what, spec, slot, verdict) in &table {
        let f = spec.build(None);
        // The reference resolver agrees with the table (else the row is wrong).
        let Expect::Ip { l4, .. } = reference::parse(&f) else { panic!("{what}: not IP") };
        let r = Resolver::new(&rules[..], &[], &[]).resolve(spec.src, Some(&l4)).entry().expect("a rule").key.clone();
        assert_eq!(r.rule.counter_slot, *slot, "{what}: the reference resolver picks {} '{}'", r.net, r.class);
        class_hits += u64::from(!r.class.is_none());
        let before = slot_passed_dropped(&p, *slot);
        let got = run(&mut p, &f);
        let after = slot_passed_dropped(&p, *slot);
        let moved = (after.0 - before.0, after.1 - before.1);
        let want_moved = if *verdict == PASS { (1, 0) } else { (0, 1) };
        if got != *verdict || moved != want_moved {
            fails.push(format!(
                "{what}: verdict {got} (want {verdict}), slot {slot} moved (passed, dropped) {moved:?} (want {want_moved:?})"
            ));
        }
    }
    assert!(fails.is_empty(), "{} of {} rows wrong:\n{}", fails.len(), table.len(), fails.join("\n"));
    let c = p.counters().unwrap();
    assert_eq!(c.class_matched, class_hits, "class_matched counter");
    assert_eq!(c.passed_pkts + c.dropped_pkts, table.len() as u64);
}

fn v4_key(src: &str, class: u32) -> BucketKey {
    let mut addr = [0u8; 16];
    addr[..4].copy_from_slice(&src.parse::<std::net::Ipv4Addr>().unwrap().octets());
    BucketKey { addr, family: FAMILY_V4, key_len: 32, class }
}

/// Sends `n` copies of `spec` at the current clock; how many passed.
fn passed_of(p: &mut Policer, spec: &FrameSpec, n: usize) -> usize {
    let f = spec.build(None);
    (0..n).filter(|_| run(p, &f) == PASS).count()
}

/// A source's SYN bucket is its own: separate from the same source's
/// default bucket and from another source's SYN bucket; the class buckets
/// are keyed by (source, class).
#[test]
fn class_buckets_are_per_source_and_class() {
    if !privileged("object tier") {
        return;
    }
    let mut p = load();
    let rules = vec![
        kernel_rule("0.0.0.0/0", "", police("1000pps", 5, false), 1),
        kernel_rule("0.0.0.0/0", "proto=tcp tcp-flags=syn,!ack", police("100pps", 3, false), 2),
        kernel_rule("0.0.0.0/0", "proto=udp dport=53", police("100pps", 2, false), 3),
    ];
    install(&mut p, &rules, &[], T0);
    let d = ip("198.19.0.1");
    let syn = |s: &str| FrameSpec::tcp(ip(s), d, 80, 1, 80, TCP_SYN);
    let ack = |s: &str| FrameSpec::tcp(ip(s), d, 80, 1, 80, TCP_ACK);
    let dns = |s: &str| FrameSpec::udp_to(ip(s), d, 64, 53);
    assert_eq!(passed_of(&mut p, &syn("198.18.0.1"), 10), 3, "SYN burst 3");
    assert_eq!(passed_of(&mut p, &ack("198.18.0.1"), 10), 5, "the same source's ACKs: its default bucket, burst 5");
    assert_eq!(passed_of(&mut p, &dns("198.18.0.1"), 10), 2, "its DNS: a third bucket, burst 2");
    assert_eq!(passed_of(&mut p, &syn("198.18.0.2"), 10), 3, "another source's SYNs: its own bucket");
    // 10 ms at 100 pps: one more SYN; 1000 pps: ten more ACKs (burst 5).
    p.set_clock(T0 + 10_000_000).unwrap();
    assert_eq!(passed_of(&mut p, &syn("198.18.0.1"), 10), 1, "SYN refill");
    assert_eq!(passed_of(&mut p, &ack("198.18.0.1"), 10), 5, "ACK refill");
    for (k, what) in [
        (v4_key("198.18.0.1", 0), "default"),
        (v4_key("198.18.0.1", 2), "SYN class"),
        (v4_key("198.18.0.1", 3), "DNS class"),
        (v4_key("198.18.0.2", 2), "SYN class, second source"),
    ] {
        assert!(p.bucket(&k).unwrap().is_some(), "no {what} bucket under {k:?}");
    }
    assert!(p.bucket(&v4_key("198.18.0.2", 0)).unwrap().is_none(), "a default bucket for a source that sent only SYNs");
    let rc: std::collections::HashMap<u32, _> = p.rule_counters().unwrap().into_iter().collect();
    assert_eq!((rc[&2].passed_pkts, rc[&2].dropped_pkts), (7, 23), "SYN class counters");
    assert_eq!((rc[&1].passed_pkts, rc[&1].dropped_pkts), (10, 10), "default counters");
}

/// `--total-rate`: all sources of a rule together get the aggregate's
/// budget, charged after their own bucket admits; a rule may have only a
/// total. Drops by the aggregate are counted as such.
#[test]
fn aggregate_bucket_holds_all_sources() {
    if !privileged("object tier") {
        return;
    }
    let mut p = load();
    let dns = with_total(police("100pps", 5, false), true);
    let game = with_total(police("1pps", 1, false), false);
    let rules = vec![
        kernel_rule("0.0.0.0/0", "", police("1000pps", 1000, false), 1),
        kernel_rule("0.0.0.0/0", "proto=udp dport=53", dns, 2),
        kernel_rule("0.0.0.0/0", "proto=udp dport=27015 dst=192.0.2.10/32", game, 3),
    ];
    // Totals: DNS 1000 pps burst 12; the game port 2000 pps burst 30.
    let totals = [(2, Rate::Pps(1000).rule(12).unwrap()), (3, Rate::Pps(2000).rule(30).unwrap())];
    install(&mut p, &rules, &totals, T0);
    let d = ip("198.19.0.1");
    let dns_from = |i: usize| FrameSpec::udp_to(ip(&format!("198.18.0.{}", i + 1)), d, 64, 53);
    // Four sources, 10 frames each, each source's bucket admitting 5: the
    // first two get 5 each, the third the 2 left of the total's 12, the
    // fourth none.
    let got: Vec<usize> = (0..4).map(|i| passed_of(&mut p, &dns_from(i), 10)).collect();
    assert_eq!(got, vec![5, 5, 2, 0], "per source 5, all together 12");
    let rc: std::collections::HashMap<u32, _> = p.rule_counters().unwrap().into_iter().collect();
    // Dropped: 5 + 5 by the sources' buckets (sources 0, 1), then sources 2
    // and 3 each had 5 admitted by their bucket: 3 + 5 by the total, and 5
    // + 5 by their buckets.
    assert_eq!((rc[&2].passed_pkts, rc[&2].dropped_pkts, rc[&2].total_dropped_pkts), (12, 28, 8), "DNS counters");
    assert_eq!(p.counters().unwrap().total_drops, 8, "interface total_drops");
    // 1 ms at 1000 pps: one more frame for everyone together.
    p.set_clock(T0 + 1_000_000).unwrap();
    let got: usize = (4..10).map(|i| passed_of(&mut p, &dns_from(i), 3)).sum();
    assert_eq!(got, 1, "one frame of aggregate budget after 1 ms");
    // Only a total (no per-source rate): 40 sources x 2 frames against a
    // burst of 30; the class's --dst too (another destination: default).
    let g = |i: usize, dst: &str| FrameSpec::udp_to(ip(&format!("198.18.1.{}", i + 1)), ip(dst), 64, 27015);
    let got: usize = (0..40).map(|i| passed_of(&mut p, &g(i, "192.0.2.10"), 2)).sum();
    assert_eq!(got, 30, "a total-only rule admits its total burst over 40 sources");
    let got: usize = (0..40).map(|i| passed_of(&mut p, &g(i, "192.0.2.11"), 2)).sum();
    assert_eq!(got, 80, "another destination: the default rule, not the total");
    let rc: std::collections::HashMap<u32, _> = p.rule_counters().unwrap().into_iter().collect();
    assert_eq!((rc[&3].passed_pkts, rc[&3].total_dropped_pkts), (30, 50), "game counters");
}
