use super::*;
use crate::classes::tests::class;

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

#[test]
fn the_fallback_is_the_next_shorter_prefix_and_class_buckets_are_marked() {
    let r = |net: &str, class: Class, slot| KernelRule {
        net: net.parse().unwrap(),
        class,
        rule: Rule::packets(100, 10).unwrap().with_counter_slot(slot),
        ban: false,
        inherit: true,
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
        inherit: true,
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

/// Source-port classes: their ports in the filter's source lanes (a frame
/// from another port skips the index), their range matched by the
/// candidate, and a destination-port class that equals one in all else
/// winning a frame both match.
#[test]
fn source_port_classes_compile_to_the_filter_and_candidates() {
    let r = |net: &str, class: Class, slot| KernelRule {
        net: net.parse().unwrap(),
        class,
        rule: Rule::packets(100, 10).unwrap().with_counter_slot(slot),
        ban: false,
        inherit: true,
    };
    let sport = |s: &str, p: &str| Class {
        sport: Some(match p.split_once('-') {
            Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
            None => (p.parse().unwrap(), p.parse().unwrap()),
        }),
        ..class(s)
    };
    let rules = vec![
        r("0.0.0.0/0", Class::default(), 1),
        r("0.0.0.0/0", sport("udp _ _ _ _", "53"), 2),
        r("0.0.0.0/0", sport("udp _ _ _ _", "123"), 3),
        r("0.0.0.0/0", class("udp 53 _ _ _"), 4),
        r("0.0.0.0/0", sport("tcp 443 _ _ _", "1024-65535"), 5),
    ];
    let c = compile(&rules, &mut Groups::default()).unwrap();
    let g = c.prefixes[&"0.0.0.0/0".parse::<IpNet>().unwrap()].classes;
    let f = c.filters[&g];
    assert!(f.may_match(17, true, 40_000, 53) && f.may_match(17, true, 40_000, 123));
    assert!(!f.may_match(17, true, 40_000, 124), "from another port, to another port: no lookup");
    assert!(f.may_match(6, true, 443, 80), "tcp to 443 is looked up (its source checked by the candidate)");
    assert!(!f.may_match(6, true, 80, 1024), "a source port of a class with a destination port: not a lane");
    let src = "192.0.2.1".parse().unwrap();
    let slot = |sport, dport, proto| {
        let f = FrameL4 { proto, has_l4: true, sport, dport, ..FrameL4::default() };
        lookup(&c, src, &f).map(|r| r.counter_slot)
    };
    assert_eq!(slot(53, 40_000, 17), Some(2), "a DNS reply");
    assert_eq!(slot(123, 40_000, 17), Some(3), "an NTP reply");
    assert_eq!(slot(124, 40_000, 17), Some(1), "neither: the class-less rule");
    assert_eq!(slot(40_000, 53, 17), Some(4), "a DNS query");
    assert_eq!(slot(53, 53, 17), Some(4), "from 53 to 53: the destination port's class");
    assert_eq!(slot(123, 53, 17), Some(4), "to 53 from 123: equal, the destination's");
    assert_eq!(slot(40_000, 443, 6), Some(5));
    assert_eq!(slot(80, 443, 6), Some(1), "a source port below the range");
    let later = FrameL4 { proto: 17, has_l4: false, ..FrameL4::default() };
    assert_eq!(lookup(&c, src, &later).map(|r| r.counter_slot), Some(1), "a later fragment: no port class");
    // Source-port classes are candidates for every port of their protocol.
    let many: Vec<KernelRule> =
        (0..9).map(|i| r("10.0.0.0/8", sport("udp _ _ _ _", &(100 + i).to_string()), i + 1)).collect();
    let e = compile(&many, &mut Groups::default()).unwrap_err().to_string();
    assert!(e.contains("at most 8") && e.contains("--sport"), "{e}");
}

/// Issue 43 point 6: the classes of a covering prefix apply under a
/// class-less longer one (which shares its group, its own rule the
/// fallback), a class of the same match at the longer prefix shadows the
/// shorter one's, and `inherit = false` stops them.
#[test]
fn classes_of_covering_prefixes_apply_under_longer_ones_unless_stopped() {
    let r = |net: &str, class: Class, slot, inherit| KernelRule {
        net: net.parse().unwrap(),
        class,
        rule: Rule::packets(100, 10).unwrap().with_counter_slot(slot),
        ban: false,
        inherit,
    };
    let dns = FrameL4 { proto: 17, has_l4: true, dport: 53, ..FrameL4::default() };
    let ntp = FrameL4 { dport: 123, ..dns };
    let slot = |c: &Compiled, src: &str, f: &FrameL4| lookup(c, src.parse().unwrap(), f).map(|r| r.counter_slot);
    let rules = vec![
        r("0.0.0.0/0", Class::default(), 1, true),
        r("0.0.0.0/0", class("udp 53 _ _ _"), 2, true),
        r("203.0.113.0/24", Class::default(), 3, true),
        r("198.51.100.0/24", Class::default(), 4, true),
        r("198.51.100.0/24", class("udp 53 _ _ _"), 5, true),
        r("192.0.2.0/24", Class::default(), 6, false),
        r("192.0.2.128/25", Class::default(), 7, true),
    ];
    let c = compile(&rules, &mut Groups::default()).unwrap();
    // Inherited: the /24's DNS to the /0's class, the rest to its own rule.
    assert_eq!(slot(&c, "203.0.113.1", &dns), Some(2));
    assert_eq!(slot(&c, "203.0.113.1", &ntp), Some(3));
    let g = |n: &str| c.prefixes[&n.parse::<IpNet>().unwrap()].classes;
    assert_eq!(g("203.0.113.0/24"), g("0.0.0.0/0"), "the same chain: the same group");
    // Shadowed: its own DNS class.
    assert_eq!(slot(&c, "198.51.100.1", &dns), Some(5));
    // Stopped, also for the longer prefix under the stop.
    assert_eq!(slot(&c, "192.0.2.1", &dns), Some(6));
    assert_eq!(slot(&c, "192.0.2.200", &dns), Some(7));
    assert_eq!(g("192.0.2.0/24"), 0);
    assert_eq!(g("192.0.2.128/25"), 0);
}
