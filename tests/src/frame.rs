//! Building test frames: Ethernet, 802.1Q/802.1ad tags, IPv4 (with
//! options), IPv6, UDP, and a payload marker the receiver recognises.

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
        }
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
        match (self.src, self.dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) => {
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                let hl = 20 + self.ipv4_options.len();
                let ip_hdr_end = l3 + hl;
                let total = self.len.max(ip_hdr_end + 8 + payload.len()) - l3;
                let total = total.min(65535);
                f.extend_from_slice(&ipv4_header(s, d, hl, total, &self.ipv4_options));
                push_udp(&mut f, total - hl, &payload);
            }
            (IpAddr::V6(s), IpAddr::V6(d)) => {
                f.extend_from_slice(&0x86DDu16.to_be_bytes());
                let plen = self.len.max(l3 + 40 + 8 + payload.len()) - l3 - 40;
                f.extend_from_slice(&ipv6_header(s, d, plen));
                push_udp(&mut f, plen, &payload);
            }
            _ => panic!("mixed address families"),
        }
        f.resize(self.len.max(f.len()), 0);
        f
    }
}

fn push_udp(f: &mut Vec<u8>, udp_len: usize, payload: &[u8]) {
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&9u16.to_be_bytes()); // discard
    f.extend_from_slice(&(udp_len as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no checksum (IPv4 allows it; receiver counts raw frames)
    f.extend_from_slice(payload);
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
}
