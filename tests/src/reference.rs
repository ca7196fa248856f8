//! A host-side reference parser for the differential tests: what the XDP
//! program must decide for a frame, written independently from the README's
//! description of the parser (not from the eBPF code).

/// What the policer must make of a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// Passes, counted as non-IP.
    NonIp,
    /// Dropped, counted as malformed.
    Malformed,
    /// Policed by source; `fragment` also counted.
    Ip { v6: bool, src: [u8; 16], fragment: bool },
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
            let fragment = be16(f, off + 6) & 0x3fff != 0;
            Expect::Ip { v6: false, src, fragment }
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
                        next = f[p];
                        8
                    }
                    _ => break,
                };
                if p + hl > len {
                    return Expect::Malformed;
                }
                p += hl;
                if p > 512 {
                    break;
                }
            }
            Expect::Ip { v6: true, src, fragment }
        }
        _ => Expect::NonIp,
    }
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
}
