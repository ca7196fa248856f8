//! The SYN-ACK against an independent reference: SYNs made by etherparse
//! (its TCP option writer), answers parsed and checksummed by etherparse.

use etherparse::{Ipv4Header, Ipv6Header, TcpHeader, TcpOptionElement as O};
use proptest::prelude::*;
use std::{vec, vec::Vec};

use super::*;

/// A SYN's IP and TCP headers as the program copies them out, written
/// by etherparse: (ip, tcp, tcp_len).
fn syn(v6: bool, opts: &[O], ecn: bool, seq: u32) -> ([u8; IP_MAX], [u8; 64], usize) {
    let mut t = TcpHeader::new(40000, 443, seq, 64240);
    t.syn = true;
    t.ece = ecn;
    t.cwr = ecn;
    t.set_options(opts).unwrap();
    let mut ip = [0u8; IP_MAX];
    let mut raw = Vec::new();
    if v6 {
        let h = Ipv6Header {
            payload_length: t.header_len() as u16,
            next_header: etherparse::IpNumber::TCP,
            hop_limit: 64,
            source: [0x20, 1, 0xd, 0xb8, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7],
            destination: [0x20, 1, 0xd, 0xb8, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            ..Default::default()
        };
        t.checksum = t.calc_checksum_ipv6(&h, &[]).unwrap();
        h.write(&mut raw).unwrap();
    } else {
        let h = Ipv4Header::new(t.header_len() as u16, 64, etherparse::IpNumber::TCP, [198, 51, 100, 7], [10, 0, 0, 1])
            .unwrap();
        t.checksum = t.calc_checksum_ipv4(&h, &[]).unwrap();
        h.write(&mut raw).unwrap();
    }
    ip[ip_at(v6)..ip_at(v6) + raw.len()].copy_from_slice(&raw);
    let mut tcp = [0u8; 64];
    let th = t.to_bytes();
    tcp[..th.len()].copy_from_slice(&th);
    (ip, tcp, th.len())
}

/// The SYN-ACK for a SYN, parsed by etherparse with its checksums checked
/// there: (its TCP header, its options).
fn answer(v6: bool, ip: &[u8; IP_MAX], tcp: &[u8; 64], tcp_len: usize, p: &SynAckParams) -> (TcpHeader, Vec<O>) {
    // Last use's bytes in the buffers (the program's per-CPU scratch is
    // not zeroed between SYNs): the answer must not depend on them.
    let (mut ip_out, mut tcp_out) = ([0xa5u8; IP_MAX], [0x5au8; 64]);
    let n = build_synack(ip, tcp, &parse_syn(tcp, tcp_len), v6, p, &mut ip_out, &mut tcp_out);
    let (t, rest) = TcpHeader::from_slice(&tcp_out[..n]).unwrap();
    assert!(rest.is_empty());
    if v6 {
        let (h, _) = Ipv6Header::from_slice(&ip_out[ip_at(true)..]).unwrap();
        let (s, _) = Ipv6Header::from_slice(&ip[ip_at(true)..]).unwrap();
        assert_eq!((h.source, h.destination), (s.destination, s.source));
        assert_eq!(h.payload_length as usize, n);
        assert_eq!(t.calc_checksum_ipv6(&h, &[]).unwrap(), t.checksum, "TCP checksum (IPv6)");
    } else {
        let (h, _) = Ipv4Header::from_slice(&ip_out[ip_at(false)..]).unwrap();
        let (s, _) = Ipv4Header::from_slice(&ip[ip_at(false)..]).unwrap();
        assert_eq!((h.source, h.destination), (s.destination, s.source));
        assert_eq!(h.total_len as usize, 20 + n);
        assert_eq!(h.calc_header_checksum(), h.header_checksum, "IPv4 header checksum");
        assert!(h.dont_fragment);
        assert_eq!(t.calc_checksum_ipv4(&h, &[]).unwrap(), t.checksum, "TCP checksum (IPv4)");
    }
    let opts = t.options_iterator().map(|o| o.unwrap()).collect();
    (t, opts)
}

const P: SynAckParams = SynAckParams { cookie: 0xdead_beef, mss: 1460, wscale: 7, now_ms: 1_000_000 };

fn ts_of(opts: &[O]) -> Option<(u32, u32)> {
    opts.iter().find_map(|o| if let O::Timestamp(a, b) = o { Some((*a, *b)) } else { None })
}

#[test]
fn linux_syn_gets_every_option_back_both_families() {
    let linux = [
        O::MaximumSegmentSize(1460),
        O::SelectiveAcknowledgementPermitted,
        O::Timestamp(77, 0),
        O::Noop,
        O::WindowScale(9),
    ];
    for v6 in [false, true] {
        let (ip, tcp, len) = syn(v6, &linux, false, 1000);
        assert_eq!(parse_syn(&tcp, len), SynOpts { wscale: Some(9), sack: true, tsval: Some(77), ecn: false });
        let (t, opts) = answer(v6, &ip, &tcp, len, &P);
        assert!(t.syn && t.ack && !t.ece && !t.rst && !t.fin);
        assert_eq!((t.source_port, t.destination_port), (443, 40000));
        assert_eq!((t.sequence_number, t.acknowledgment_number), (0xdead_beef, 1001));
        assert!(opts.contains(&O::MaximumSegmentSize(1460)));
        assert!(opts.contains(&O::SelectiveAcknowledgementPermitted));
        assert!(opts.contains(&O::WindowScale(7)));
        let (tsval, tsecr) = ts_of(&opts).unwrap();
        assert_eq!(tsecr, 77);
        // The low bits: wscale 9, SACK; at or before now.
        assert_eq!(tsval & 0x3f, 9 | TS_OPT_SACK);
        assert!(tsval <= P.now_ms && P.now_ms - tsval < 64);
        // Whole segments of 1448 (1460 less the timestamp).
        assert_eq!(t.window_size, 65535 / 1448 * 1448);
    }
}

#[test]
fn without_timestamps_only_mss() {
    // Windows' SYN: MSS, NOP, WS, NOP, NOP, SACK-permitted, no timestamps.
    let win = [
        O::MaximumSegmentSize(1460),
        O::Noop,
        O::WindowScale(8),
        O::Noop,
        O::Noop,
        O::SelectiveAcknowledgementPermitted,
    ];
    for v6 in [false, true] {
        let (ip, tcp, len) = syn(v6, &win, true, u32::MAX);
        let (t, opts) = answer(v6, &ip, &tcp, len, &P);
        assert_eq!(opts, vec![O::MaximumSegmentSize(1460)]);
        assert_eq!(t.acknowledgment_number, 0, "seq + 1 wraps");
        assert!(!t.ece, "ECN needs the timestamp to be remembered");
    }
}

#[test]
fn ecn_and_no_wscale_are_encoded() {
    let (ip, tcp, len) = syn(false, &[O::MaximumSegmentSize(1400), O::Noop, O::Noop, O::Timestamp(5, 0)], true, 1);
    let (t, opts) = answer(false, &ip, &tcp, len, &P);
    assert!(t.ece);
    assert!(!opts.iter().any(|o| matches!(o, O::WindowScale(_) | O::SelectiveAcknowledgementPermitted)));
    assert_eq!(ts_of(&opts).unwrap().0 & 0x3f, TS_OPT_WSCALE_MASK | TS_OPT_ECN);
}

#[test]
fn the_socket_tuple_is_where_the_headers_put_it() {
    // As the program's scratch holds them: the IP header at ip_at, the TCP
    // header right after the 40 bytes.
    for v6 in [false, true] {
        let (ip, tcp, _) = syn(v6, &[O::MaximumSegmentSize(1460)], false, 1);
        let run: Vec<u8> = ip.iter().chain(tcp.iter()).copied().collect();
        let (at, alen) = if v6 { (TUPLE_AT_V6, 16) } else { (TUPLE_AT_V4, 4) };
        let t = &run[at..at + 2 * alen + 4];
        let (src, dst) = if v6 {
            let (h, _) = Ipv6Header::from_slice(&ip[ip_at(true)..]).unwrap();
            (h.source.to_vec(), h.destination.to_vec())
        } else {
            let (h, _) = Ipv4Header::from_slice(&ip[ip_at(false)..]).unwrap();
            (h.source.to_vec(), h.destination.to_vec())
        };
        assert_eq!(&t[..alen], &src[..]);
        assert_eq!(&t[alen..2 * alen], &dst[..]);
        assert_eq!(&t[2 * alen..], &[0x9c, 0x40, 0x01, 0xbb], "ports 40000 and 443");
    }
}

#[test]
fn cap_allows_its_burst_then_its_rate() {
    let c = SynConf::default().with_cap(100, 5);
    let mut tat = 0;
    let mut sent = 0;
    for _ in 0..20 {
        if let Some(t) = cap_admit(tat, 1_000_000_000, &c) {
            tat = t;
            sent += 1;
        }
    }
    assert_eq!(sent, 5);
    // 10 ms later, one more.
    assert!(cap_admit(tat, 1_010_000_000, &c).is_some());
}

#[test]
fn a_network_has_one_cap_slot_and_networks_spread_over_them() {
    // Every address of a /24 (a /48) charges one slot; the next network
    // another.
    let v4 = |a: u8, b: u8, c: u8, d: u8| crate::mapped_v4([a, b, c, d]);
    let s = cap_slot(&v4(198, 51, 100, 7), false);
    assert!(s < CAP_SLOTS);
    assert_eq!(cap_slot(&v4(198, 51, 100, 255), false), s);
    assert_ne!(cap_slot(&v4(198, 51, 101, 7), false), s);
    let mut a = [0x20, 1, 0xd, 0xb8, 0xaa, 0xbb, 0xcc, 1, 0, 0, 0, 0, 0, 0, 0, 1];
    let s6 = cap_slot(&a, true);
    a[6..].copy_from_slice(&[0xff; 10]);
    assert_eq!(cap_slot(&a, true), s6);
    a[5] ^= 1;
    assert_ne!(cap_slot(&a, true), s6);
    // The /24s of a /10 (a spoofed flood's sources, 16 384 networks) and
    // of a /8 (65 536): each slot holds few, none many.
    for (first, nets) in [(0x6440u32, 1u32 << 14), (0x0a00, 1 << 16)] {
        let mut load = std::collections::HashMap::<u32, u32>::new();
        for n in 0..nets {
            let net = (first << 8) + n;
            let slot = cap_slot(&v4((net >> 16) as u8, (net >> 8) as u8, net as u8, 1), false);
            assert!(slot < CAP_SLOTS);
            *load.entry(slot).or_default() += 1;
        }
        let most = load.values().max().copied().unwrap_or(0);
        assert!(most <= 3, "{nets} networks: a slot holds {most}");
        assert!(load.len() as u32 >= nets.min(CAP_SLOTS) * 3 / 4, "{nets} networks on {} slots", load.len());
    }
}

proptest! {
    /// Any options etherparse writes: the answer parses, its checksums
    /// hold, and what it offers follows what was asked.
    #[test]
    fn any_syn_any_family(v6 in any::<bool>(), mss in 536u16..9000, ws in proptest::option::of(0u8..20),
                          sack in any::<bool>(), ts in proptest::option::of(any::<u32>()), ecn in any::<bool>(),
                          nops in 0usize..4, seq in any::<u32>(), now in 64u32.., cookie in any::<u32>()) {
        let mut opts = vec![O::Noop; nops];
        opts.push(O::MaximumSegmentSize(mss));
        if sack { opts.push(O::SelectiveAcknowledgementPermitted); }
        if let Some(t) = ts { opts.push(O::Timestamp(t, 0)); }
        if let Some(w) = ws { opts.push(O::WindowScale(w)); }
        let (ip, tcp, len) = syn(v6, &opts, ecn, seq);
        let p = SynAckParams { cookie, mss: 1440, wscale: 7, now_ms: now };
        let (t, got) = answer(v6, &ip, &tcp, len, &p);
        prop_assert_eq!(t.sequence_number, cookie);
        prop_assert_eq!(t.acknowledgment_number, seq.wrapping_add(1));
        prop_assert_eq!(ts_of(&got).map(|x| x.1), ts);
        prop_assert_eq!(got.contains(&O::WindowScale(7)), ts.is_some() && ws.is_some());
        prop_assert_eq!(got.contains(&O::SelectiveAcknowledgementPermitted), ts.is_some() && sack);
        if let Some((tsval, _)) = ts_of(&got) {
            let bits = tsval & 0x3f;
            prop_assert_eq!(bits & TS_OPT_WSCALE_MASK, ws.map_or(15, |w| w.min(14) as u32));
            prop_assert_eq!(bits & TS_OPT_SACK != 0, sack);
            prop_assert_eq!(bits & TS_OPT_ECN != 0, ecn);
            prop_assert!(tsval <= now && now - tsval < 64);
        }
    }
}

/// Distinct filter bits `n` sources take, against the expectation for
/// random ones (`m (1 - e^(-n/m))`, m the filter's bits).
fn spread(srcs: impl Iterator<Item = [u8; 16]>) -> (usize, f64) {
    let mut bits = std::collections::BTreeSet::new();
    let mut n = 0usize;
    for s in srcs {
        let (w, b) = seen_bit(&s);
        assert!(w < SEEN_WORDS && b.count_ones() == 1);
        bits.insert(w as u64 * 64 + u64::from(b.trailing_zeros()));
        n += 1;
    }
    let m = f64::from(SEEN_WORDS) * 64.0;
    (bits.len(), m * (1.0 - (-(n as f64) / m).exp()))
}

#[test]
fn the_verified_filter_spreads_neighbours_like_random_sources() {
    // A /16 of IPv4 sources, in turn.
    let (got, want) = spread((0..65_536u32).map(|i| crate::mapped_v4((0x0a00_0000 | i).to_be_bytes())));
    assert!(got as f64 >= 0.98 * want, "IPv4 /16: {got} bits, random sources take {want:.0}");
    // IPv6 sources of one /64 that differ in their last two bytes, and
    // /64s of one /48.
    let v6 = |hi: u16, lo: u16| {
        let mut a = [0x20, 0x01, 0x0d, 0xb8, 0, 0x70, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        a[6..8].copy_from_slice(&hi.to_be_bytes());
        a[14..16].copy_from_slice(&lo.to_be_bytes());
        a
    };
    let (got, want) = spread((0..=u16::MAX).map(|i| v6(0, i)));
    assert!(got as f64 >= 0.98 * want, "one /64: {got} bits, random sources take {want:.0}");
    let (got, want) = spread((0..=u16::MAX).map(|i| v6(i, 1)));
    assert!(got as f64 >= 0.98 * want, "one /48: {got} bits, random sources take {want:.0}");
    // The same source, the same bit; another family's twin, another bit.
    let a = crate::mapped_v4([192, 0, 2, 1]);
    assert_eq!(seen_bit(&a), seen_bit(&a));
    let mut b = [0u8; 16];
    b[12..].copy_from_slice(&[192, 0, 2, 1]);
    assert_ne!(seen_bit(&a), seen_bit(&b));
}

#[test]
fn a_rebuilt_filter_holds_the_sources_it_is_made_of_and_is_not_stale() {
    let mut words = vec![0u64; SEEN_WORDS as usize];
    let srcs: Vec<[u8; 16]> = (0..MAX_VERIFIED).map(|i| crate::mapped_v4((0x0a00_0000 | i).to_be_bytes())).collect();
    for s in &srcs {
        mark_seen(&mut words, s);
    }
    // Every source's bit is set, as the program would test it.
    for s in &srcs {
        let (w, b) = seen_bit(s);
        assert_ne!(words[w as usize] & b, 0);
    }
    let set: u64 = words.iter().map(|w| u64::from(w.count_ones())).sum();
    assert!(set <= u64::from(MAX_VERIFIED));
    // A full verified set rebuilt is never due for another rebuild.
    assert!(!seen_is_stale(set), "{set} bits");
    assert!(!seen_is_stale(u64::from(MAX_VERIFIED)));
    // A filter three eighths full is due; the whole of it, too.
    assert!(seen_is_stale(u64::from(SEEN_WORDS) * 64 * 3 / 8 + 1));
    assert!(seen_is_stale(u64::from(SEEN_WORDS) * 64));
}
