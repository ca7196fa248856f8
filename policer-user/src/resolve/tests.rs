use std::collections::BTreeMap;

use policer_common::class::{TCP_ACK, TCP_RST, TCP_SYN, mapped_v4};

use super::*;
use crate::{
    classes::{ClassText, check_ties, tests::text},
    compile::{Compiled, Groups, compile, lookup},
    protect::Protect,
};

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
    fn one_in(&mut self, n: u64) -> bool {
        self.next().is_multiple_of(n)
    }
}

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

const NETS: [&str; 10] = [
    "0.0.0.0/0",
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.0/24",
    "10.1.2.0/25",
    "10.1.2.3/32",
    "192.0.2.0/24",
    "192.0.2.128/25",
    "2001:db8::/32",
    "2001:db8:1::/48",
];
const ENTRIES: [&str; 8] = [
    "10.1.2.0/25",
    "10.9.0.0/16",
    "192.0.2.0/25",
    "10.1.2.3/32",
    "2001:db8:1:2::/64",
    "203.0.113.0/24",
    "::/0",
    "10.0.0.0/8",
];
const PROTECT: [&str; 4] = ["10.1.0.0/16", "192.0.2.128/25", "10.1.2.0/24", "2001:db8:1::/48"];
const ACTIONS: [Action; 4] = [Action::Police, Action::Allow, Action::Deny, Action::Monitor];

/// A random world the daemon would accept: rules without ties, nothing but
/// plain allow rules and allow sets' entries inside a protected prefix, no
/// ban inside one, no set entry at a rule's prefix.
struct World {
    rules: Vec<KernelRule>,
    sets: Vec<SetList>,
    protect: Vec<IpNet>,
}

fn world(rng: &mut Rng) -> World {
    let protect: Vec<IpNet> = (0..rng.next() % 3).map(|_| net(rng.pick(&PROTECT))).collect();
    let guard = Protect::from_nets(protect.iter().copied());
    let protect = guard.nets().to_vec();
    let mut rules: Vec<KernelRule> = Vec::new();
    let mut slot = 1;
    for _ in 0..(rng.next() % 10 + 1) {
        let n = net(rng.pick(&NETS));
        let v6 = n.addr().is_ipv6();
        let proto = rng.pick(&[None, Some("tcp"), Some("udp"), Some("icmp")]);
        let proto = if v6 && proto == Some("icmp") { Some("icmpv6") } else { proto };
        let ports = matches!(proto, Some("tcp") | Some("udp"));
        let dport = if ports { rng.pick(&[None, Some("53"), Some("50-59"), Some("1024-65535")]) } else { None };
        let sport = if ports { rng.pick(&[None, None, Some("53"), Some("123"), Some("1024-65535")]) } else { None };
        let flags = if proto == Some("tcp") { rng.pick(&[None, Some("syn"), Some("syn,!ack")]) } else { None };
        let dst = if v6 { None } else { rng.pick(&[None, Some("198.51.100.0/24")]) };
        let class = if rng.one_in(3) {
            Class::default()
        } else {
            Class::parse(&ClassText { sport: sport.map(Into::into), ..text(proto, dport, flags, None, dst) }, v6)
                .unwrap()
        };
        let action = rng.pick(&ACTIONS);
        let inside = guard.holding(&n).is_some();
        if inside && (action != Action::Allow || !class.is_none()) {
            continue;
        }
        if rules.iter().any(|r| r.net == n && r.class == class && !r.ban) {
            continue;
        }
        let rule = Rule::packets(100, 10).unwrap().with_action(action).with_counter_slot(slot);
        let mut candidate = rules.clone();
        candidate.push(KernelRule { net: n, class, rule, ban: false, inherit: !rng.one_in(4) });
        if check_ties(candidate.iter().filter(|r| !r.ban).map(|r| (&r.net, &r.class))).is_err() {
            continue;
        }
        rules = candidate;
        slot += 1;
    }
    for _ in 0..(rng.next() % 3) {
        let n = net(rng.pick(&NETS));
        if guard.holding(&n).is_some() || rules.iter().any(|r| r.ban && r.net == n) {
            continue;
        }
        let rule = Rule::packets(1, 1).unwrap().with_action(Action::Deny).with_counter_slot(slot);
        rules.push(KernelRule { net: n, class: Class::default(), rule, ban: true, inherit: true });
        slot += 1;
    }
    let mut sets = Vec::new();
    for name in ["a", "b", "c"].into_iter().take((rng.next() % 4) as usize) {
        let action = rng.pick(&ACTIONS);
        let mut entries: Vec<IpNet> = (0..rng.next() % 5)
            .map(|_| net(if rng.one_in(2) { rng.pick(&ENTRIES) } else { rng.pick(&NETS) }))
            .filter(|e| !rules.iter().any(|r| !r.ban && r.net == *e))
            .filter(|e| action == Action::Allow || guard.holding(e).is_none())
            // An allow set's entry at a protected prefix itself holds
            // whichever of the two was written last: not generated.
            .filter(|e| !protect.contains(e))
            .collect();
        entries.sort_unstable();
        entries.dedup();
        let v = |n| Rule::packets(50, 5).unwrap().with_action(action).with_counter_slot(slot).with_id(n);
        sets.push(SetList { name: name.into(), action, v4: v(4), v6: v(6), entries: Arc::new(entries) });
        slot += 1;
    }
    World { rules, sets, protect }
}

/// The tries as their writers leave them: the compiled rules and bans
/// with the protected prefixes applied (the daemon's rule plan), then each
/// set entry no rule holds: the longest ban's value over it unless a
/// protected prefix holds it, else its winning set's (`daemon/sets.rs`).
fn tries(w: &World) -> Option<Compiled> {
    let mut c = match compile(&w.rules, &mut Groups::default()) {
        Ok(c) => c,
        Err(e) => {
            assert!(e.to_string().contains("at most"), "{e}");
            return None;
        }
    };
    let guard = Protect::from_nets(w.protect.iter().copied());
    guard.apply(&mut c.prefixes);
    let mut entries: Vec<IpNet> = w.sets.iter().flat_map(|s| s.entries.iter().copied()).collect();
    entries.sort_unstable();
    entries.dedup();
    let mut writes = BTreeMap::new();
    for e in entries {
        if c.prefixes.contains_key(&e) {
            continue;
        }
        let ban = w.rules.iter().filter(|r| r.ban && r.net.contains(&e)).max_by_key(|r| r.net.prefix_len());
        let value = match ban {
            Some(b) if guard.holding(&e).is_none() => c.prefixes[&b.net],
            _ => {
                let s = w.sets.iter().filter(|s| s.holds(&e)).max_by_key(|s| s.rank()).unwrap();
                s.value(e.addr().is_ipv6())
            }
        };
        writes.insert(e, value);
    }
    c.prefixes.extend(writes);
    Some(c)
}

fn frame(rng: &mut Rng, v6: bool) -> FrameL4 {
    let dst = if v6 {
        [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9]
    } else {
        mapped_v4(rng.pick(&[[198, 51, 100, 7], [203, 0, 113, 9]]))
    };
    let icmp = if v6 { 58 } else { 1 };
    let f = FrameL4 {
        proto: rng.pick(&[6u8, 17, icmp, 47]),
        has_l4: !rng.one_in(5),
        dport: rng.pick(&[53u16, 55, 80, 1023, 1024, 65535]),
        sport: rng.pick(&[53u16, 123, 124, 1023, 1024, 40_000]),
        tcp_flags: rng.pick(&[TCP_SYN, TCP_SYN | TCP_ACK, TCP_ACK, TCP_RST]),
        icmp_type: rng.pick(&[8u8, 128]),
        dst,
    };
    if f.has_l4 { f } else { FrameL4 { dport: 0, sport: 0, tcp_flags: 0, icmp_type: 0, ..f } }
}

const SOURCES: [&str; 14] = [
    "10.1.2.3",
    "10.1.2.4",
    "10.1.2.200",
    "10.1.9.9",
    "10.9.9.9",
    "10.200.0.1",
    "192.0.2.1",
    "192.0.2.130",
    "203.0.113.1",
    "198.18.0.1",
    "2001:db8:1:2::5",
    "2001:db8:1::9",
    "2001:db8:ffff::1",
    "2001:dead::1",
];

/// Random rule/ban/set/protect worlds and random sources and frames: what
/// the resolver answers equals what the tries the writers leave give —
/// the longest prefix, its value (counter slot, action, whether it has
/// classes), and after the program's class choice on the compiled index,
/// the frame's rule.
#[test]
fn the_resolver_answers_as_the_compiled_tries() {
    let mut rng = Rng(0x5eed_0f0e_0042_0003);
    let (mut checked, mut classes, mut bans, mut sets, mut protected) = (0, 0, 0, 0, 0);
    for round in 0..1500 {
        let w = world(&mut rng);
        let Some(tries) = tries(&w) else { continue };
        let r = Resolver::new(&w.rules[..], &w.sets, &w.protect);
        for _ in 0..40 {
            let src: IpAddr = rng.pick(&SOURCES).parse().unwrap();
            let shown = || {
                let rules: Vec<String> = w
                    .rules
                    .iter()
                    .map(|r| {
                        format!(
                            "{}{} [{}] #{} {}",
                            if r.ban { "ban " } else { "" },
                            r.net,
                            r.class,
                            r.rule.counter_slot,
                            r.rule.action
                        )
                    })
                    .collect();
                let sets: Vec<String> = w
                    .sets
                    .iter()
                    .map(|s| format!("{} {} #{} {:?}", s.name, s.action, s.v4.counter_slot, s.entries))
                    .collect();
                format!("round {round}, {src}\nrules: {rules:#?}\nsets: {sets:#?}\nprotect: {:?}", w.protect)
            };
            // What else covers it: every entry whose prefix holds it.
            let covers = r.covering(src);
            let all = w.protect.iter().filter(|p| p.contains(&src)).count()
                + w.rules.iter().filter(|k| k.net.contains(&src)).count()
                + w.sets.iter().map(|s| s.entries.iter().filter(|e| e.contains(&src)).count()).sum::<usize>();
            assert_eq!(covers.len(), all, "{}", shown());
            assert!(covers.windows(2).all(|c| c[0].net().prefix_len() >= c[1].net().prefix_len()), "{}", shown());
            // The tries' longest match, and its value.
            let want = tries.prefixes.iter().filter(|(n, _)| n.contains(&src)).max_by_key(|(n, _)| n.prefix_len());
            let a = r.resolve(src, None);
            let got_trie = a.trie.map(|v| (v.counter_slot, v.action, a.classes()));
            let want_trie = want.map(|(_, v)| (v.counter_slot, v.action, v.classes != 0));
            assert_eq!((a.prefix, got_trie), (want.map(|w| *w.0), want_trie), "{}\n{a:?}", shown());
            classes += usize::from(a.classes());
            bans += usize::from(matches!(a.by, By::Ban(_)));
            sets += usize::from(matches!(a.by, By::Set { .. }));
            protected += usize::from(matches!(a.by, By::Protect(_)));
            // A frame: the program's class choice on the compiled index.
            for _ in 0..4 {
                let f = frame(&mut rng, src.is_ipv6());
                let got = r.resolve(src, Some(&f)).rule().map(|v| (v.counter_slot, v.action, v.flags & RULE_CLASS));
                let want = lookup(&tries, src, &f).map(|v| (v.counter_slot, v.action, v.flags & RULE_CLASS));
                assert_eq!(got, want, "{}\n{f:?}", shown());
                checked += 1;
            }
        }
    }
    // The worlds reached every way the tries decide.
    assert!(checked > 100_000, "{checked}");
    for (n, what) in [(classes, "classes"), (bans, "bans"), (sets, "sets"), (protected, "protect")] {
        assert!(n > 500, "{what}: {n}");
    }
}

/// The oracle's way: the rule a frame gets, by the rules alone.
#[test]
fn a_frame_falls_through_the_classes_to_the_class_less_rule() {
    let r = |n: &str, class: &str, slot| KernelRule {
        net: net(n),
        class: crate::classes::tests::class(class),
        rule: Rule::packets(100, 10).unwrap().with_counter_slot(slot),
        ban: false,
        inherit: true,
    };
    let rules = [
        KernelRule { class: Class::default(), ..r("0.0.0.0/0", "udp _ _ _ _", 1) },
        r("10.0.0.0/8", "udp 53 _ _ _", 2),
        r("10.1.0.0/16", "tcp _ syn _ _", 3),
    ];
    let res = Resolver::new(&rules[..], &[], &[]);
    let src: IpAddr = "10.1.0.1".parse().unwrap();
    let dns = FrameL4 { proto: 17, has_l4: true, dport: 53, ..FrameL4::default() };
    let slot = |f: &FrameL4| res.resolve(src, Some(f)).entry().map(|e| e.key.rule.counter_slot);
    assert_eq!(slot(&dns), Some(2), "a shorter prefix's class");
    assert_eq!(slot(&FrameL4 { dport: 54, ..dns }), Some(1), "the fallback");
    let a = res.resolve(src, None);
    assert_eq!((a.prefix, a.classes(), a.rule().map(|r| r.counter_slot)), (Some(net("10.1.0.0/16")), true, Some(1)));
    // Without a class-less rule anywhere: no rule.
    let res = Resolver::new(&rules[1..], &[], &[]);
    assert!(res.resolve(src, Some(&FrameL4 { dport: 54, ..dns })).rule().is_none());
    assert!(res.resolve("192.0.2.1".parse().unwrap(), None).prefix.is_none());
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
    let sports = [None, None, None, Some("53"), Some("123"), Some("0-1023"), Some("1024-65535")];
    let mut checked = 0;
    for round in 0..300 {
        let mut rules: Vec<KernelRule> = Vec::new();
        let mut slot = 1;
        for _ in 0..(rng.next() % 12 + 1) {
            let net: IpNet = rng.pick(&nets).parse().unwrap();
            let proto = rng.pick(&protos);
            let has_ports = matches!(proto, Some("tcp") | Some("udp"));
            let dport = if has_ports { rng.pick(&ports) } else { None };
            let sport = if has_ports { rng.pick(&sports) } else { None };
            let flags =
                if proto == Some("tcp") { rng.pick(&[None, Some("syn"), Some("syn,!ack"), Some("rst")]) } else { None };
            let icmp = if proto == Some("icmp") { rng.pick(&[None, Some("8"), Some("0")]) } else { None };
            let dst = rng.pick(&dsts);
            let class = if rng.next().is_multiple_of(4) {
                Class::default()
            } else {
                Class::parse(&ClassText { sport: sport.map(Into::into), ..text(proto, dport, flags, icmp, dst) }, false)
                    .unwrap()
            };
            if rules.iter().any(|r| r.net == net && r.class == class) {
                continue;
            }
            let mut candidate = rules.clone();
            let rule = Rule::packets(100, 10).unwrap().with_counter_slot(slot);
            candidate.push(KernelRule { net, class, rule, ban: false, inherit: !rng.next().is_multiple_of(4) });
            if check_ties(candidate.iter().map(|r| (&r.net, &r.class))).is_err() {
                continue;
            }
            rules = candidate;
            slot += 1;
        }
        let compiled = match compile(&rules, &mut Groups::default()) {
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
                sport: rng.pick(&[53u16, 123, 80, 1023, 1024, 40_000]),
                tcp_flags: rng.pick(&[TCP_SYN, TCP_SYN | TCP_ACK, TCP_ACK, TCP_RST]),
                icmp_type: rng.pick(&[8u8, 0, 3]),
                dst: mapped_v4(dst),
            };
            let f = if f.has_l4 { f } else { FrameL4 { dport: 0, sport: 0, tcp_flags: 0, icmp_type: 0, ..f } };
            let want = Resolver::new(&rules[..], &[], &[]).resolve(src, Some(&f)).rule().map(|r| r.counter_slot);
            let got = lookup(&compiled, src, &f).map(|r| r.counter_slot);
            let shown: Vec<String> =
                rules.iter().map(|r| format!("{} [{}] #{}", r.net, r.class, r.rule.counter_slot)).collect();
            assert_eq!(got, want, "round {round}: {src} {f:?}\nrules: {shown:#?}");
            checked += 1;
        }
    }
    assert!(checked > 20_000, "{checked}");
}

/// What `rule set` says a rule inherits, overrides and hides.
#[test]
fn inheritance_names_what_a_prefix_inherits_shadows_and_hides() {
    let dns = crate::classes::tests::class("udp 53 _ _ _");
    let syn = crate::classes::tests::class("tcp _ syn _ _");
    let rules = [
        (net("0.0.0.0/0"), Class::default(), true),
        (net("0.0.0.0/0"), dns, true),
        (net("10.0.0.0/8"), dns, true),
        (net("10.0.0.0/8"), syn, true),
    ];
    let with = |extra: &[(IpNet, Class, bool)]| [&rules[..], extra].concat();
    let i = Inheritance::of(net("10.1.0.0/16"), &with(&[(net("10.1.0.0/16"), Class::default(), true)]));
    assert_eq!(i.inherited, vec![(net("10.0.0.0/8"), dns), (net("10.0.0.0/8"), syn)], "the /8's DNS shadows the /0's");
    let i = Inheritance::of(net("10.1.0.0/16"), &with(&[(net("10.1.0.0/16"), dns, true)]));
    assert_eq!((i.inherited, i.shadowed), (vec![(net("10.0.0.0/8"), syn)], vec![(net("10.0.0.0/8"), dns)]));
    let i = Inheritance::of(net("10.1.0.0/16"), &with(&[(net("10.1.0.0/16"), Class::default(), false)]));
    assert_eq!((i.inherited.len(), i.hidden.len()), (0, 2));
    assert!(i.note().contains("no longer apply"), "{}", i.note());
    // A stop between: nothing from above it.
    let i = Inheritance::of(
        net("10.1.2.0/24"),
        &with(&[(net("10.1.0.0/16"), Class::default(), false), (net("10.1.2.0/24"), Class::default(), true)]),
    );
    assert_eq!(i, Inheritance::default());
}
