use super::*;

fn cand(needs: u8) -> ClassCand {
    ClassCand {
        rule: Rule::packets(10, 1).unwrap(),
        dst: [0; 16],
        dst_mask: [0; 16],
        needs,
        tcp_mask: 0,
        tcp_flags: 0,
        icmp_type: 0,
        sport_lo: 0,
        sport_hi: 0,
    }
}

fn frame(proto: u8) -> FrameL4 {
    FrameL4 { proto, has_l4: true, ..FrameL4::default() }
}

#[test]
fn index_keys_sort_as_the_trie_matches() {
    assert_eq!(index_key(1, 17, 53), [0, 0, 0, 1, 17, 0, 53, 0]);
    assert_eq!(index_key(0x0102_0304, 6, 0x1bb), [1, 2, 3, 4, 6, 1, 0xbb, 0]);
    assert_eq!(INDEX_PORT_BITS, INDEX_PROTO_BITS + 16);
}

#[test]
fn tcp_flags_match_under_their_mask() {
    // syn,!ack: a bare SYN.
    let mut c = cand(NEEDS_L4 | NEEDS_TCP_FLAGS);
    (c.tcp_mask, c.tcp_flags) = (TCP_SYN | TCP_ACK, TCP_SYN);
    let f = |flags| FrameL4 { tcp_flags: flags, ..frame(IPPROTO_TCP) };
    assert!(c.matches(&f(TCP_SYN)));
    assert!(c.matches(&f(TCP_SYN | TCP_ECE | TCP_CWR)));
    assert!(!c.matches(&f(TCP_SYN | TCP_ACK)), "a SYN-ACK is not a bare SYN");
    assert!(!c.matches(&f(TCP_ACK)));
    // syn: SYN set, the rest unlooked at.
    (c.tcp_mask, c.tcp_flags) = (TCP_SYN, TCP_SYN);
    assert!(c.matches(&f(TCP_SYN | TCP_ACK)));
    assert!(!c.matches(&f(TCP_RST)));
}

#[test]
fn a_frame_without_layer_4_matches_only_classes_that_read_none() {
    let no_l4 = FrameL4 { has_l4: false, ..frame(IPPROTO_UDP) };
    assert!(cand(0).matches(&no_l4), "protocol (and destination) only");
    assert!(!cand(NEEDS_L4).matches(&no_l4), "a port class");
    assert!(!cand(NEEDS_L4 | NEEDS_ICMP_TYPE).matches(&no_l4));
}

#[test]
fn icmp_types_and_destinations() {
    let mut c = cand(NEEDS_L4 | NEEDS_ICMP_TYPE);
    c.icmp_type = 8;
    assert!(c.matches(&FrameL4 { icmp_type: 8, ..frame(IPPROTO_ICMP) }));
    assert!(!c.matches(&FrameL4 { icmp_type: 0, ..frame(IPPROTO_ICMP) }));
    let mut d = cand(NEEDS_DST);
    d.dst = mapped_v4([192, 0, 2, 0]);
    d.dst_mask = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0];
    let to = |a| FrameL4 { dst: mapped_v4(a), ..frame(IPPROTO_UDP) };
    assert!(d.matches(&to([192, 0, 2, 10])));
    assert!(!d.matches(&to([192, 0, 3, 10])));
}

#[test]
fn source_ports_match_their_range_and_need_layer_4() {
    let mut c = cand(NEEDS_L4 | NEEDS_SPORT);
    (c.sport_lo, c.sport_hi) = (53, 53);
    let from = |p| FrameL4 { sport: p, dport: 40_000, ..frame(IPPROTO_UDP) };
    assert!(c.matches(&from(53)));
    assert!(!c.matches(&from(54)) && !c.matches(&from(52)));
    assert!(!c.matches(&FrameL4 { has_l4: false, ..from(53) }), "a later fragment has no source port");
    (c.sport_lo, c.sport_hi) = (1000, 2000);
    assert!(c.matches(&from(1000)) && c.matches(&from(2000)) && c.matches(&from(1500)));
    assert!(!c.matches(&from(999)) && !c.matches(&from(2001)));
    // The source port is not the destination port.
    assert!(!c.matches(&FrameL4 { sport: 9, dport: 1500, ..frame(IPPROTO_UDP) }));
}

#[test]
fn the_filter_passes_a_source_port_a_class_names() {
    let mut f = ClassFilter::default();
    f.set_sports(IPPROTO_UDP, 123, 123);
    assert!(f.may_match(IPPROTO_UDP, true, 40_000, 123), "from 123, to any port");
    assert!(!f.may_match(IPPROTO_UDP, true, 123, 40_000), "to 123 is not from 123");
    assert!(!f.may_match(IPPROTO_TCP, true, 40_000, 123), "another protocol's lane");
    assert!(!f.may_match(IPPROTO_UDP, false, 0, 123), "no layer 4");
    f.set_ports(IPPROTO_UDP, 53, 53);
    assert!(f.may_match(IPPROTO_UDP, true, 53, 9) && f.may_match(IPPROTO_UDP, true, 9, 123));
    assert!(!f.may_match(IPPROTO_UDP, true, 9, 9));
    let mut g = ClassFilter::default();
    g.set_sports(IPPROTO_TCP, 0, 1023);
    assert!((0..512).all(|p| g.may_match(IPPROTO_TCP, true, 9, p)), "a range of 512 ports or more: every bit");
    g.set_sports(132, 9, 9);
    assert!(g.may_match(132, true, 0, 0), "a protocol without a lane: every frame");
    let u = ClassFilter::default().union(&f);
    assert!(u.may_match(IPPROTO_UDP, true, 40_000, 123));
}

#[test]
fn the_first_match_wins_and_the_length_bounds_the_scan() {
    let mut l = ClassList { len: 2, _pad: 0, cands: [cand(NEEDS_L4); MAX_CANDIDATES] };
    l.cands[0].needs = NEEDS_L4 | NEEDS_ICMP_TYPE;
    l.cands[0].icmp_type = 3;
    let f = FrameL4 { icmp_type: 8, ..frame(IPPROTO_ICMP) };
    assert_eq!(l.first_match(&f), Some(1));
    assert_eq!(l.first_match(&FrameL4 { icmp_type: 3, ..f }), Some(0));
    assert_eq!(l.first_match(&FrameL4 { has_l4: false, ..f }), None);
    l.len = 0;
    assert_eq!(l.first_match(&f), None);
}

#[test]
fn the_filter_passes_what_a_class_can_match() {
    let mut f = ClassFilter::default();
    f.set_ports(IPPROTO_UDP, 53, 53);
    f.set_ports(IPPROTO_TCP, 8000, 8999);
    f.set_any(IPPROTO_ICMP);
    assert!(f.may_match(IPPROTO_UDP, true, 53, 0));
    assert!(!f.may_match(IPPROTO_UDP, true, 9, 0), "another port");
    assert!(f.may_match(IPPROTO_UDP, true, 53 + 512, 0), "a port sharing the bit: looked up, the index decides");
    assert!(!f.may_match(IPPROTO_UDP, false, 53, 0), "no layer 4: port classes cannot match");
    assert!(f.may_match(IPPROTO_TCP, true, 8500, 0));
    assert!(f.may_match(IPPROTO_ICMP, false, 0, 0));
    assert!(!f.may_match(47, true, 0, 0), "a protocol no class names");
    let mut g = ClassFilter::default();
    g.set_ports(IPPROTO_UDP, 1000, 2000);
    assert!((0..512).all(|p| g.may_match(IPPROTO_UDP, true, p, 0)), "a range of 512 ports or more: every bit");
    g.set_ports(132, 5000, 5000);
    assert!(g.may_match(132, false, 0, 0), "a protocol without a lane: every frame");
    let u = f.union(&g);
    assert!(
        u.may_match(132, true, 1, 0) && u.may_match(IPPROTO_ICMP, true, 0, 0) && u.may_match(IPPROTO_UDP, true, 9, 0)
    );
}

/// One group's maps, as [`select`] reads them, recording what it read.
struct Maps<'m> {
    filter: &'m ClassFilter,
    list: &'m ClassList,
    frame: FrameL4,
    read: u32,
}

impl<'m> ClassLookups<'m> for Maps<'m> {
    fn l4(&mut self, proto: u8) -> FrameL4 {
        self.read |= 1;
        FrameL4 { proto, dst: [0; 16], ..self.frame }
    }
    fn filter(&mut self, group: u32) -> Option<&'m ClassFilter> {
        self.read |= 2;
        assert_eq!(group, 7);
        Some(self.filter)
    }
    fn dst(&mut self) -> Option<[u8; 16]> {
        self.read |= 4;
        Some(self.frame.dst)
    }
    fn index(&mut self, key: [u8; INDEX_KEY_BYTES]) -> Option<&'m ClassList> {
        self.read |= 8;
        assert_eq!(key, index_key(7, self.frame.proto, self.frame.dport));
        Some(self.list)
    }
}

#[test]
fn select_reads_only_what_the_choice_needs_and_picks_the_first_match() {
    let mut prefix = Rule::packets(10, 1).unwrap();
    prefix.classes = 7;
    prefix.class_protos = 1 << IPPROTO_UDP;
    let mut filter = ClassFilter::default();
    filter.set_ports(IPPROTO_UDP, 53, 53);
    let (mut a, mut b) = (cand(NEEDS_L4 | NEEDS_DST), cand(NEEDS_L4));
    (a.dst[15], a.dst_mask[15], a.rule.counter_slot) = (9, 0xff, 2);
    b.rule.counter_slot = 3;
    let mut list = ClassList { len: 2, _pad: 0, cands: [cand(0); MAX_CANDIDATES] };
    (list.cands[0], list.cands[1]) = (a, b);
    let mut maps = Maps { filter: &filter, list: &list, frame: FrameL4 { dport: 53, ..frame(IPPROTO_UDP) }, read: 0 };
    let slot = |m: &mut Maps, prefix: &Rule, proto| {
        m.read = 0;
        m.frame.proto = proto;
        select(prefix, proto, m).map(|r| r.counter_slot)
    };
    // Another destination: the second candidate.
    assert_eq!(slot(&mut maps, &prefix, IPPROTO_UDP), Some(3));
    assert_eq!(maps.read, 15);
    maps.frame.dst[15] = 9;
    assert_eq!(slot(&mut maps, &prefix, IPPROTO_UDP), Some(2));
    // A protocol no class names: nothing read.
    assert_eq!(slot(&mut maps, &prefix, IPPROTO_TCP), None);
    assert_eq!(maps.read, 0);
    // A port the filter rules out: no destination, no index.
    maps.frame.dport = 54;
    assert_eq!(slot(&mut maps, &prefix, IPPROTO_UDP), None);
    assert_eq!(maps.read, 3);
    // No layer 4: the filter's ports cannot match either.
    (maps.frame.dport, maps.frame.has_l4) = (53, false);
    assert_eq!(slot(&mut maps, &prefix, IPPROTO_UDP), None);
    // A prefix without classes never looks.
    prefix.classes = 0;
    maps.frame.has_l4 = true;
    assert_eq!(slot(&mut maps, &prefix, IPPROTO_UDP), None);
    assert_eq!(maps.read, 0);
}
