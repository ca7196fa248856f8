//! A host-side reference parser for the differential tests: what the XDP
//! program must decide for a frame, written independently from the
//! description of the parser in docs/packet-path.md (not from the eBPF code).
//!
//! It also reads what a frame offers to class matching (issue 17), as the
//! README ("Classes"), docs/design.md ("Classes") and `policer_common::class`
//! describe it: the protocol (IPv6: the header after the extension headers),
//! and from the layer-4 header the
//! destination port (TCP, UDP, SCTP, UDP-Lite), the TCP flags, the ICMP
//! type. A non-first fragment, a header cut short, or an IPv6 chain the
//! walk does not finish (it looks at 8 headers: 8 extension headers leave
//! the layer-4 header after them unread; or past byte 512) has no layer 4
//! to read.

pub use policer_common::class::FrameL4;

/// What the policer must make of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Passes, counted as non-IP.
    NonIp,
    /// Dropped, counted as malformed.
    Malformed,
    /// Policed by source; `fragment` also counted; `l4` is what class
    /// matching sees (`dst` as the program compares it: IPv4 as
    /// `::ffff:a.b.c.d`).
    Ip { v6: bool, src: [u8; 16], fragment: bool, l4: FrameL4 },
}

fn be16(f: &[u8], at: usize) -> usize {
    u16::from_be_bytes([f[at], f[at + 1]]) as usize
}

pub fn parse(f: &[u8]) -> Expect {
    let len = f.len();
    if len < 14 {
        return Expect::NonIp;
    }
    let mut proto = be16(f, 12);
    let mut off = 14;
    // Up to two 802.1Q / 802.1ad tags.
    for _ in 0..2 {
        if proto != 0x8100 && proto != 0x88a8 {
            break;
        }
        if off + 4 > len {
            return Expect::Malformed;
        }
        proto = be16(f, off + 2);
        off += 4;
    }
    match proto {
        0x0800 => {
            if off + 20 > len {
                return Expect::Malformed;
            }
            let version = f[off] >> 4;
            let ihl = (f[off] & 0xf) as usize * 4;
            let total = be16(f, off + 2);
            if version != 4 || ihl < 20 || off + ihl > len || total < ihl || off + total > len {
                return Expect::Malformed;
            }
            let mut src = [0u8; 16];
            src[..4].copy_from_slice(&f[off + 12..off + 16]);
            let frag = be16(f, off + 6);
            let fragment = frag & 0x3fff != 0;
            let mut dst = [0u8; 16];
            dst[10] = 0xff;
            dst[11] = 0xff;
            dst[12..].copy_from_slice(&f[off + 16..off + 20]);
            // Only the fragment at offset 0 carries the layer-4 header.
            let at = (frag & 0x1fff == 0).then_some(off + ihl);
            Expect::Ip { v6: false, src, fragment, l4: layer4(f, f[off + 9], at, dst) }
        }
        0x86dd => {
            if off + 40 > len || f[off] >> 4 != 6 {
                return Expect::Malformed;
            }
            let payload = be16(f, off + 4);
            if off + 40 + payload > len {
                return Expect::Malformed;
            }
            let mut src = [0u8; 16];
            src.copy_from_slice(&f[off + 8..off + 24]);
            let mut next = f[off + 6];
            let mut p = off + 40;
            let mut fragment = false;
            let mut later = false;
            let mut l4_at = None;
            for _ in 0..8 {
                let hl = match next {
                    0 | 43 | 60 | 51 => {
                        if p + 2 > len {
                            return Expect::Malformed;
                        }
                        let hl = if next == 51 { (f[p + 1] as usize + 2) * 4 } else { (f[p + 1] as usize + 1) * 8 };
                        next = f[p];
                        hl
                    }
                    44 => {
                        if p + 8 > len {
                            return Expect::Malformed;
                        }
                        fragment = true;
                        later |= be16(f, p + 2) >> 3 != 0;
                        next = f[p];
                        8
                    }
                    _ => {
                        l4_at = Some(p);
                        break;
                    }
                };
                if p + hl > len {
                    return Expect::Malformed;
                }
                p += hl;
                if p > 512 {
                    break;
                }
            }
            let mut dst = [0u8; 16];
            dst.copy_from_slice(&f[off + 24..off + 40]);
            let at = if later { None } else { l4_at };
            Expect::Ip { v6: true, src, fragment, l4: layer4(f, next, at, dst) }
        }
        _ => Expect::NonIp,
    }
}

/// What class matching reads of a layer-4 header of protocol `proto` at
/// `at` (None: nothing to read). A header the frame cuts short reads as
/// none.
fn layer4(f: &[u8], proto: u8, at: Option<usize>, dst: [u8; 16]) -> FrameL4 {
    let mut l4 = FrameL4 { proto, has_l4: false, dport: 0, sport: 0, tcp_flags: 0, icmp_type: 0, dst };
    let Some(p) = at else {
        return l4;
    };
    let have = |n: usize| p + n <= f.len();
    match proto {
        6 => {
            if have(14) {
                l4.sport = be16(f, p) as u16;
                l4.dport = be16(f, p + 2) as u16;
                l4.tcp_flags = f[p + 13];
                l4.has_l4 = true;
            }
        }
        1 | 58 => {
            if have(2) {
                l4.icmp_type = f[p];
                l4.has_l4 = true;
            }
        }
        17 | 132 | 136 => {
            if have(4) {
                l4.sport = be16(f, p) as u16;
                l4.dport = be16(f, p + 2) as u16;
                l4.has_l4 = true;
            }
        }
        _ => l4.has_l4 = true,
    }
    l4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameSpec;

    #[test]
    fn reference_basics() {
        let f = FrameSpec::udp("198.18.0.1".parse().unwrap(), "198.19.0.1".parse().unwrap(), 64).build(None);
        assert!(matches!(parse(&f), Expect::Ip { v6: false, fragment: false, .. }));
        assert_eq!(parse(&f[..30]), Expect::Malformed);
        assert_eq!(parse(&f[..14]), Expect::Malformed);
        let mut arp = f.clone();
        arp[12] = 0x08;
        arp[13] = 0x06;
        assert_eq!(parse(&arp), Expect::NonIp);
    }

    fn l4_of(f: &[u8]) -> FrameL4 {
        match parse(f) {
            Expect::Ip { l4, .. } => l4,
            e => panic!("not IP: {e:?}"),
        }
    }

    #[test]
    fn reference_layer4() {
        use crate::frame::{Ext, FrameSpec};
        let (s4, d4) = ("198.18.0.1".parse().unwrap(), "198.19.0.1".parse().unwrap());
        let l = l4_of(&FrameSpec::tcp(s4, d4, 64, 1000, 80, 0x12).build(None));
        assert_eq!((l.proto, l.has_l4, l.dport, l.tcp_flags), (6, true, 80, 0x12));
        assert_eq!(&l.dst[10..], &[0xff, 0xff, 198, 19, 0, 1]);
        let l = l4_of(&FrameSpec::echo(s4, d4, 64).build(None));
        assert_eq!((l.proto, l.has_l4, l.icmp_type), (1, true, 8));
        let mut s = FrameSpec::udp_to(s4, d4, 64, 53);
        s.ipv4_frag = Some((0, true));
        let l = l4_of(&s.build(None));
        assert_eq!((l.proto, l.has_l4, l.dport), (17, true, 53));
        s.ipv4_frag = Some((8, true));
        let l = l4_of(&s.build(None));
        assert_eq!((l.proto, l.has_l4, l.dport), (17, false, 0));
        // IPv6: the chain is walked to the port; a later fragment has none.
        let (s6, d6) = ("2001:db8::1".parse().unwrap(), "2001:db8:ffff::1".parse().unwrap());
        let mut s = FrameSpec::udp_to(s6, d6, 120, 53);
        s.ipv6_ext = vec![Ext::HopByHop, Ext::DestOpts, Ext::Fragment { offset: 0, more: true }];
        let l = l4_of(&s.build(None));
        assert_eq!((l.proto, l.has_l4, l.dport), (17, true, 53));
        s.ipv6_ext = vec![Ext::HopByHop, Ext::Fragment { offset: 2, more: false }];
        let l = l4_of(&s.build(None));
        assert_eq!((l.proto, l.has_l4, l.dport), (17, false, 0));
        // The walk looks at 8 headers: 8 extension headers use them all,
        // and the layer-4 header after them is not reached; 7 leave one.
        s.ipv6_ext = vec![Ext::DestOpts; 8];
        let l = l4_of(&s.build(None));
        assert!(!l.has_l4, "{l:?}");
        s.ipv6_ext = vec![Ext::DestOpts; 7];
        let l = l4_of(&s.build(None));
        assert_eq!((l.proto, l.has_l4, l.dport), (17, true, 53));
        // A TCP header cut short reads as none.
        let f = FrameSpec::tcp(s4, d4, 64, 1000, 80, 0x02).build(None);
        let mut cut = f[..34 + 13].to_vec();
        cut[16..18].copy_from_slice(&((34 + 13 - 14) as u16).to_be_bytes());
        let l = l4_of(&cut);
        assert_eq!((l.proto, l.has_l4), (6, false));
    }
}
