//! Building test frames: Ethernet, 802.1Q/802.1ad tags, IPv4 (with
//! options, fragments), IPv6 (with extension headers, fragments), UDP, TCP
//! (ports, flags), ICMP/ICMPv6, and a payload marker the receiver
//! recognises.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub const MARKER: [u8; 4] = *b"PLCR";
/// Marker (4) + run id (4) + flow index (4) + sequence (4).
pub const MARK_LEN: usize = 16;

#[derive(Clone, Debug)]
pub struct FrameSpec {
    pub src: IpAddr,
    pub dst: IpAddr,
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    /// Outer first: (TPID, VLAN id).
    pub vlans: Vec<(u16, u16)>,
    /// IPv4 options bytes (multiple of 4, at most 40).
    pub ipv4_options: Vec<u8>,
    /// Total frame length wanted (padded with zeros); at least the headers.
    pub len: usize,
    /// The layer-4 header (default: UDP 40000 -> 9).
    pub l4: L4,
    /// IPv6 extension headers between the IPv6 header and layer 4, in order.
    pub ipv6_ext: Vec<Ext>,
    /// IPv4 fragment: (offset in 8-byte units, more fragments). None: an
    /// unfragmented datagram (DF set).
    pub ipv4_frag: Option<(u16, bool)>,
}

/// A layer-4 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    Udp {
        sport: u16,
        dport: u16,
    },
    Tcp {
        sport: u16,
        dport: u16,
        flags: u8,
    },
    /// ICMP (IPv4) or ICMPv6 (IPv6), by the frame's family: type and code,
    /// then identifier and sequence (an echo's layout).
    Icmp {
        typ: u8,
        code: u8,
    },
    /// Another IP protocol: no header of its own, the payload follows the
    /// IP header.
    Other(u8),
}

impl L4 {
    /// The IP protocol number, for a frame of family `v6`.
    pub fn proto(&self, v6: bool) -> u8 {
        match self {
            L4::Udp { .. } => 17,
            L4::Tcp { .. } => 6,
            L4::Icmp { .. } => {
                if v6 {
                    58
                } else {
                    1
                }
            }
            L4::Other(p) => *p,
        }
    }

    /// The header, for `l4_len` bytes of header and payload together.
    pub fn header(&self, l4_len: usize) -> Vec<u8> {
        match *self {
            L4::Udp { sport, dport } => {
                let mut h = Vec::with_capacity(8);
                h.extend_from_slice(&sport.to_be_bytes());
                h.extend_from_slice(&dport.to_be_bytes());
                h.extend_from_slice(&(l4_len.min(65535) as u16).to_be_bytes());
                h.extend_from_slice(&[0, 0]); // no checksum (the receiver counts raw frames)
                h
            }
            L4::Tcp { sport, dport, flags } => {
                let mut h = vec![0u8; 20];
                h[0..2].copy_from_slice(&sport.to_be_bytes());
                h[2..4].copy_from_slice(&dport.to_be_bytes());
                h[4..8].copy_from_slice(&1u32.to_be_bytes()); // sequence
                h[12] = 5 << 4; // data offset: 20 bytes
                h[13] = flags;
                h[14..16].copy_from_slice(&65535u16.to_be_bytes()); // window
                h
            }
            L4::Icmp { typ, code } => vec![typ, code, 0, 0, 0x12, 0x34, 0, 1],
            L4::Other(_) => vec![],
        }
    }
}

/// An IPv6 extension header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ext {
    /// Hop-by-hop options (8 bytes: one PadN).
    HopByHop,
    /// Destination options (8 bytes: one PadN).
    DestOpts,
    /// Routing header (8 bytes, type 253, no segments left).
    Routing,
    /// Authentication header (16 bytes).
    Ah,
    /// Fragment header: offset in 8-byte units, more fragments.
    Fragment { offset: u16, more: bool },
}

impl Ext {
    /// The next-header code that announces this header.
    pub fn code(&self) -> u8 {
        match self {
            Ext::HopByHop => 0,
            Ext::Routing => 43,
            Ext::Fragment { .. } => 44,
            Ext::Ah => 51,
            Ext::DestOpts => 60,
        }
    }

    /// The header's bytes, followed by header `next`.
    pub fn bytes(&self, next: u8) -> Vec<u8> {
        match *self {
            Ext::HopByHop | Ext::DestOpts => vec![next, 0, 1, 4, 0, 0, 0, 0],
            Ext::Routing => vec![next, 0, 253, 0, 0, 0, 0, 0],
            Ext::Ah => {
                let mut h = vec![next, 2, 0, 0];
                h.extend_from_slice(&0x1000u32.to_be_bytes()); // SPI
                h.extend_from_slice(&1u32.to_be_bytes()); // sequence
                h.extend_from_slice(&[0; 4]); // ICV
                h
            }
            Ext::Fragment { offset, more } => {
                let mut h = vec![next, 0];
                h.extend_from_slice(&((offset << 3) | more as u16).to_be_bytes());
                h.extend_from_slice(&0x0c1a_55e5u32.to_be_bytes()); // identification
                h
            }
        }
    }
}

impl FrameSpec {
    pub fn udp(src: IpAddr, dst: IpAddr, len: usize) -> FrameSpec {
        FrameSpec {
            src,
            dst,
            src_mac: [0x02, 0, 0, 0, 0, 0xb],
            dst_mac: [0x02, 0, 0, 0, 0, 0xa],
            vlans: vec![],
            ipv4_options: vec![],
            len,
            l4: L4::Udp { sport: 40000, dport: 9 },
            ipv6_ext: vec![],
            ipv4_frag: None,
        }
    }

    /// The same frame with layer 4 `l4`.
    pub fn with_l4(mut self, l4: L4) -> FrameSpec {
        self.l4 = l4;
        self
    }

    /// A TCP frame: ports and flags (`policer_common::class::TCP_*`).
    pub fn tcp(src: IpAddr, dst: IpAddr, len: usize, sport: u16, dport: u16, flags: u8) -> FrameSpec {
        FrameSpec::udp(src, dst, len).with_l4(L4::Tcp { sport, dport, flags })
    }

    /// A UDP frame to `dport`.
    pub fn udp_to(src: IpAddr, dst: IpAddr, len: usize, dport: u16) -> FrameSpec {
        FrameSpec::udp(src, dst, len).with_l4(L4::Udp { sport: 40000, dport })
    }

    /// An ICMP (IPv4) or ICMPv6 (IPv6) echo request.
    pub fn echo(src: IpAddr, dst: IpAddr, len: usize) -> FrameSpec {
        let typ = if src.is_ipv6() { 128 } else { 8 };
        FrameSpec::udp(src, dst, len).with_l4(L4::Icmp { typ, code: 0 })
    }

    /// Whether this is a fragment other than the first (no layer-4 header:
    /// the bytes where one would be are data).
    pub fn later_fragment(&self) -> bool {
        self.ipv4_frag.is_some_and(|(off, _)| off != 0)
            || self.ipv6_ext.iter().any(|e| matches!(e, Ext::Fragment { offset, .. } if *offset != 0))
    }

    /// The frame with `mark` (run id, flow, sequence) in the UDP payload.
    pub fn build(&self, mark: Option<(u32, u32, u32)>) -> Vec<u8> {
        let mut f = Vec::with_capacity(self.len.max(64));
        f.extend_from_slice(&self.dst_mac);
        f.extend_from_slice(&self.src_mac);
        for &(tpid, vid) in &self.vlans {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&vid.to_be_bytes());
        }
        let l3 = f.len() + 2;
        let mut payload = Vec::new();
        if let Some((run, flow, seq)) = mark {
            payload.extend_from_slice(&MARKER);
            payload.extend_from_slice(&run.to_be_bytes());
            payload.extend_from_slice(&flow.to_be_bytes());
            payload.extend_from_slice(&seq.to_be_bytes());
        }
        // A later fragment carries data where layer 4 would be; the data
        // here starts with the same bytes as the header would (a decoy: a
        // parser that reads ports from a later fragment is caught).
        let v6 = self.src.is_ipv6();
        let proto = self.l4.proto(v6);
        let l4_min = self.l4.header(0).len() + payload.len();
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                let hl = 20 + self.ipv4_options.len();
                let ip_hdr_end = l3 + hl;
                let total = self.len.max(ip_hdr_end + l4_min) - l3;
                let total = total.min(65535);
                let mut h = ipv4_header(s, d, hl, total, &self.ipv4_options);
                h[9] = proto;
                if let Some((off, more)) = self.ipv4_frag {
                    h[6..8].copy_from_slice(&((off & 0x1fff) | if more { 0x2000 } else { 0 }).to_be_bytes());
                }
                h[10..12].copy_from_slice(&[0, 0]);
                let sum = checksum(&h);
                h[10..12].copy_from_slice(&sum.to_be_bytes());
                f.extend_from_slice(&h);
                f.extend_from_slice(&self.l4.header(total - hl));
                f.extend_from_slice(&payload);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&0x86DDu16.to_be_bytes());
                let mut ext = Vec::new();
                for (i, e) in self.ipv6_ext.iter().enumerate() {
                    let next = self.ipv6_ext.get(i + 1).map_or(proto, Ext::code);
                    ext.extend_from_slice(&e.bytes(next));
                }
                let plen = self.len.max(l3 + 40 + ext.len() + l4_min) - l3 - 40;
                let mut h = ipv6_header(s, d, plen);
                h[6] = self.ipv6_ext.first().map_or(proto, Ext::code);
                f.extend_from_slice(&h);
                f.extend_from_slice(&ext);
                f.extend_from_slice(&self.l4.header(plen - ext.len()));
                f.extend_from_slice(&payload);
            }
            _ => panic!("mixed address families"),
        }
        f.resize(self.len.max(f.len()), 0);
        f
    }
}

pub fn ipv4_header(s: Ipv4Addr, d: Ipv4Addr, hl: usize, total: usize, opts: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 20];
    h[0] = 0x40 | (hl / 4) as u8;
    h[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    h[6] = 0x40; // DF
    h[8] = 64;
    h[9] = 17;
    h[12..16].copy_from_slice(&s.octets());
    h[16..20].copy_from_slice(&d.octets());
    h.extend_from_slice(opts);
    let sum = checksum(&h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    h
}

pub fn ipv6_header(s: Ipv6Addr, d: Ipv6Addr, payload_len: usize) -> Vec<u8> {
    let mut h = vec![0u8; 40];
    h[0] = 0x60;
    h[4..6].copy_from_slice(&(payload_len as u16).to_be_bytes());
    h[6] = 17;
    h[7] = 64;
    h[8..24].copy_from_slice(&s.octets());
    h[24..40].copy_from_slice(&d.octets());
    h
}

pub fn checksum(b: &[u8]) -> u16 {
    let mut s: u32 = 0;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    !(s as u16)
}

/// The marker of a received frame: (run id, flow, sequence), found by
/// scanning for the marker (headers vary with tags and options).
pub fn find_mark(frame: &[u8]) -> Option<(u32, u32, u32)> {
    let at = frame.windows(4).position(|w| w == MARKER)?;
    let m = frame.get(at..at + MARK_LEN)?;
    let u = |i: usize| u32::from_be_bytes([m[i], m[i + 1], m[i + 2], m[i + 3]]);
    Some((u(4), u(8), u(12)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v4_frame_layout() {
        let f = FrameSpec::udp("198.18.0.1".parse().unwrap(), "198.19.0.1".parse().unwrap(), 64).build(Some((7, 3, 9)));
        assert_eq!(f.len(), 64);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        assert_eq!(&f[26..30], &[198, 18, 0, 1]);
        assert_eq!(checksum(&f[14..34]), 0);
        assert_eq!(find_mark(&f), Some((7, 3, 9)));
    }

    #[test]
    fn v6_and_vlan_layout() {
        let mut s = FrameSpec::udp("2001:db8::1".parse().unwrap(), "2001:db8:ffff::1".parse().unwrap(), 100);
        s.vlans = vec![(0x88a8, 5), (0x8100, 7)];
        let f = s.build(Some((1, 2, 3)));
        assert_eq!(f.len(), 100);
        assert_eq!(&f[12..14], &[0x88, 0xa8]);
        assert_eq!(&f[20..22], &[0x86, 0xdd]);
        assert_eq!(f[22] >> 4, 6);
        assert_eq!(find_mark(&f), Some((1, 2, 3)));
    }

    #[test]
    fn tcp_icmp_and_fragments_layout() {
        let (s4, d4): (IpAddr, IpAddr) = ("198.18.0.1".parse().unwrap(), "198.19.0.1".parse().unwrap());
        // Headers and marker need 70 bytes: the frame grows past 64.
        let f = FrameSpec::tcp(s4, d4, 64, 1234, 80, 0x12).build(Some((1, 2, 3)));
        assert_eq!(f.len(), 70);
        assert_eq!(f[23], 6);
        assert_eq!(checksum(&f[14..34]), 0);
        assert_eq!(&f[34..38], &[0x04, 0xd2, 0, 80]);
        assert_eq!(f[34 + 13], 0x12);
        assert_eq!(f[34 + 12] >> 4, 5);
        assert_eq!(&f[54..58], &MARKER);
        let f = FrameSpec::echo(s4, d4, 64).build(None);
        assert_eq!((f[23], f[34]), (1, 8));
        let f = FrameSpec::udp_to(s4, d4, 64, 53).build(None);
        assert_eq!((f[23], &f[36..38]), (17, &[0u8, 53][..]));
        // A later IPv4 fragment: offset, no DF, the decoy header.
        let mut s = FrameSpec::udp_to(s4, d4, 64, 53);
        s.ipv4_frag = Some((185, false));
        assert!(s.later_fragment());
        let f = s.build(None);
        assert_eq!(u16::from_be_bytes([f[20], f[21]]), 185);
        assert_eq!(checksum(&f[14..34]), 0);
        s.ipv4_frag = Some((0, true));
        assert!(!s.later_fragment());
        let f = s.build(None);
        assert_eq!(u16::from_be_bytes([f[20], f[21]]), 0x2000);

        let (s6, d6): (IpAddr, IpAddr) = ("2001:db8::1".parse().unwrap(), "2001:db8:ffff::1".parse().unwrap());
        let f = FrameSpec::echo(s6, d6, 90).build(None);
        assert_eq!((f[20], f[54]), (58, 128));
        let mut s = FrameSpec::tcp(s6, d6, 140, 5, 443, 0x02);
        s.ipv6_ext = vec![Ext::HopByHop, Ext::Routing, Ext::DestOpts, Ext::Ah, Ext::Fragment { offset: 0, more: true }];
        let f = s.build(Some((4, 5, 6)));
        assert_eq!(f.len(), 140);
        assert_eq!(f[20], 0); // hop-by-hop first
        let chain: Vec<u8> = [54, 62, 70, 78, 94].iter().map(|&o| f[o]).collect();
        assert_eq!(chain, vec![43, 60, 51, 44, 6]);
        assert_eq!(u16::from_be_bytes([f[18], f[19]]) as usize, 140 - 54);
        assert_eq!(&f[102..106], &[0, 5, 0x01, 0xbb]);
        assert_eq!(f[102 + 13], 0x02);
        assert_eq!(find_mark(&f), Some((4, 5, 6)));
        s.ipv6_ext = vec![Ext::Fragment { offset: 3, more: false }];
        assert!(s.later_fragment());
        let f = s.build(None);
        assert_eq!((f[20], f[54], u16::from_be_bytes([f[56], f[57]])), (44, 6, 3 << 3));
    }
}
