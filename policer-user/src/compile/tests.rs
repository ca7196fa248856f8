use policer_common::class::{TCP_ACK, TCP_RST, TCP_SYN, mapped_v4};

use super::*;
use crate::classes::tests::{class, text};

#[test]
fn port_ranges_become_aligned_blocks() {
    assert_eq!(blocks(0, 65535), vec![(0, 16)]);
    assert_eq!(blocks(53, 53), vec![(53, 0)]);
    assert_eq!(blocks(8000, 8999).iter().map(|(_, b)| 1u32 << b).sum::<u32>(), 1000);
    for (lo, hi) in [(1, 65535), (100, 200), (1023, 1025), (65535, 65535)] {
        let b = blocks(lo, hi);
        assert_eq!(b.first().unwrap().0, lo);
        let mut at = lo;
        for (s, bits) in b {
            assert_eq!(s, at);
            assert_eq!(s % (1 << bits), 0, "aligned");
            at += 1 << bits;
        }
        assert_eq!(at, hi + 1);
    }
}

/// A small deterministic generator (xorshift).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

/// The compiled maps, looked up as the program does, give every frame the
/// rule the rules themselves give it: random rule sets (prefixes nested
/// and not, with and without class-less rules) and random frames.
#[test]
fn the_compiled_index_agrees_with_the_rules() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let nets = ["0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "192.0.2.0/24"];
    let protos = [None, Some("tcp"), Some("udp"), Some("icmp"), Some("47")];
    let ports = [None, Some("53"), Some("50-59"), Some("0-1023"), Some("1024-65535"), Some("80"), Some("443")];
    let dsts = [None, Some("198.51.100.0/24"), Some("198.51.100.7")];
    let mut checked = 0;
    for round in 0..300 {
        let mut rules: Vec<KernelRule> = Vec::new();
        let mut slot = 1;
        for _ in 0..(rng.next() % 12 + 1) {
            let net: IpNet = rng.pick(&nets).parse().unwrap();
            let proto = rng.pick(&protos);
            let has_ports = matches!(proto, Some("tcp") | Some("udp"));
            let dport = if has_ports { rng.pick(&ports) } else { None };
            let flags =
                if proto == Some("tcp") { rng.pick(&[None, Some("syn"), Some("syn,!ack"), Some("rst")]) } else { None };
            let icmp = if proto == Some("icmp") { rng.pick(&[None, Some("8"), Some("0")]) } else { None };
            let dst = rng.pick(&dsts);
            let class = if rng.next().is_multiple_of(4) {
                Class::default()
            } else {
                Class::parse(&text(proto, dport, flags, icmp, dst), false).unwrap()
            };
            if rules.iter().any(|r| r.net == net && r.class == class) {
                continue;
            }
            let mut candidate = rules.clone();
            let rule = Rule::packets(100, 10).unwrap().with_counter_slot(slot);
            candidate.push(KernelRule { net, class, rule, ban: false });
            if check_ties(candidate.iter().map(|r| (&r.net, &r.class))).is_err() {
                continue;
            }
            rules = candidate;
            slot += 1;
        }
        let mut groups = Groups::default();
        let compiled = match compile(&rules, &mut groups) {
            Ok(c) => c,
            Err(e) => {
                assert!(e.to_string().contains("at most"), "round {round}: {e}");
                continue;
            }
        };
        for _ in 0..200 {
            let src: IpAddr =
                rng.pick(&["10.1.2.3", "10.1.9.9", "10.9.9.9", "192.0.2.1", "203.0.113.1"]).parse().unwrap();
            let dst = rng.pick(&[[198, 51, 100, 7], [198, 51, 100, 8], [203, 0, 113, 9]]);
            let proto = rng.pick(&[6u8, 17, 1, 47, 50]);
            let f = FrameL4 {
                proto,
                has_l4: !rng.next().is_multiple_of(5),
                dport: rng.pick(&[53u16, 55, 80, 443, 1023, 1024, 5000, 65535]),
                tcp_flags: rng.pick(&[TCP_SYN, TCP_SYN | TCP_ACK, TCP_ACK, TCP_RST]),
                icmp_type: rng.pick(&[8u8, 0, 3]),
                dst: mapped_v4(dst),
            };
            let f = if f.has_l4 { f } else { FrameL4 { dport: 0, tcp_flags: 0, icmp_type: 0, ..f } };
            let want = resolve(&rules, src, &f).map(|r| r.rule.counter_slot);
            let got = lookup(&compiled, src, &f).map(|r| r.counter_slot);
            let shown: Vec<String> =
                rules.iter().map(|r| format!("{} [{}] #{}", r.net, r.class, r.rule.counter_slot)).collect();
            assert_eq!(got, want, "round {round}: {src} {f:?}\nrules: {shown:#?}");
            checked += 1;
        }
    }
    assert!(checked > 20_000, "{checked}");
}

#[test]
fn the_fallback_is_the_next_shorter_prefix_and_class_buckets_are_marked() {
    let r = |net: &str, class: Class, slot| KernelRule {
        net: net.parse().unwrap(),
        class,
        rule: Rule::packets(100, 10).unwrap().with_counter_slot(slot),
        ban: false,
    };
    let rules = vec![r("0.0.0.0/0", Class::default(), 1), r("10.0.0.0/8", class("udp 53 _ _ _"), 2)];
    let c = compile(&rules, &mut Groups::default()).unwrap();
    let p = c.prefixes[&"10.0.0.0/8".parse::<IpNet>().unwrap()];
    assert_eq!((p.counter_slot, p.flags & RULE_CLASS), (1, 0), "falls to 0.0.0.0/0's rule");
    assert_ne!(p.classes, 0);
    let dns = FrameL4 { proto: 17, has_l4: true, dport: 53, ..FrameL4::default() };
    let hit = lookup(&c, "10.0.0.1".parse().unwrap(), &dns).unwrap();
    assert_eq!((hit.counter_slot, hit.flags & RULE_CLASS), (2, RULE_CLASS));
    // No fallback at all: no rule.
    let c = compile(&rules[1..], &mut Groups::default()).unwrap();
    assert!(lookup(&c, "10.0.0.1".parse().unwrap(), &FrameL4 { dport: 54, ..dns }).is_none());
    // More than MAX_CANDIDATES classes for one frame: refused.
    let many: Vec<KernelRule> =
        (0..9).map(|i| r("10.0.0.0/8", class(&format!("udp {}-{} _ _ _", 50 - i, 60 + i)), i + 1)).collect();
    let e = compile(&many, &mut Groups::default()).unwrap_err().to_string();
    assert!(e.contains("at most 8"), "{e}");
}

#[test]
fn a_manual_ban_overrides_every_rule_under_it_and_gives_them_back() {
    let rule = |net: &str, class: Class, slot: u32, ban: bool| KernelRule {
        net: net.parse().unwrap(),
        class,
        rule: if ban {
            Rule::packets(1, 1).unwrap().with_action(policer_common::bucket::Action::Deny).with_counter_slot(slot)
        } else {
            Rule::packets(100, 10).unwrap().with_counter_slot(slot)
        },
        ban,
    };
    let rules = vec![
        rule("0.0.0.0/0", Class::default(), 1, false),
        rule("10.0.0.0/8", Class::default(), 2, false),
        rule("10.1.0.0/16", class("udp 53 _ _ _"), 3, false),
        rule("10.1.2.0/24", Class::default(), 4, false),
        rule("2001:db8::/32", Class::default(), 5, false),
    ];
    let before = compile(&rules, &mut Groups::default()).unwrap();
    let mut banned = rules.clone();
    banned.push(rule("10.1.0.0/16", Class::default(), 6, true));
    banned.push(rule("10.1.2.3/32", Class::default(), 7, true));
    let mut groups = Groups::default();
    let c = compile(&banned, &mut groups).unwrap();
    let slot = |n: &str| c.prefixes[&n.parse::<IpNet>().unwrap()].counter_slot;
    // Outside the ban: as before. Under it: the ban's deny, classes gone.
    assert_eq!(slot("0.0.0.0/0"), 1);
    assert_eq!(slot("10.0.0.0/8"), 2);
    assert_eq!(slot("2001:db8::/32"), 5);
    assert_eq!(slot("10.1.0.0/16"), 6);
    assert_eq!(slot("10.1.2.0/24"), 6, "a more specific rule under the ban takes the ban's value");
    assert_eq!(slot("10.1.2.3/32"), 7, "a ban inside a ban is its own");
    for n in ["10.1.0.0/16", "10.1.2.0/24", "10.1.2.3/32"] {
        let v = c.prefixes[&n.parse::<IpNet>().unwrap()];
        assert_eq!((v.action, v.classes), (policer_common::bucket::Action::Deny as u32, 0), "{n}");
    }
    assert!(c.index.is_empty() && c.filters.is_empty(), "the covered prefix's classes are not compiled");
    // The ban ends: everything as it was.
    let after = compile(&rules, &mut groups).unwrap();
    assert_eq!(after.prefixes.len(), before.prefixes.len());
    for (n, v) in &before.prefixes {
        assert_eq!(after.prefixes[n].counter_slot, v.counter_slot, "{n}");
    }
    assert_eq!(after.index.len(), before.index.len());
}
