//! The parser: Ethernet, up to two VLAN tags, IPv4 or IPv6 (the
//! extension headers walked for a fragment header and the layer-4
//! header's offset), each read bounds-checked against the frame
//! (policer_common::wire). What the policer needs of a frame: its source,
//! whether it is a fragment, and where its layer-4 header is (read only
//! for a prefix with classes).

use core::mem;

use aya_ebpf::programs::XdpContext;
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};
use policer_common::wire::{
    ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IPPROTO_AH, IPPROTO_DSTOPTS, IPPROTO_FRAGMENT, IPPROTO_HOPOPTS,
    IPPROTO_ROUTING, IPV4_MIN_HLEN, IPV6_HLEN, MAX_EXT_HEADERS, MAX_EXT_OFFSET, MAX_VLAN_TAGS, VLAN_HLEN,
};

/// One bounds-checked read of a `T` at `off` bytes into the frame.
#[inline(always)]
pub(crate) fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + mem::size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *const T)
}

pub(crate) enum Parsed {
    NonIp,
    Malformed,
    /// The source address as it sits in the header (network order).
    V4 {
        src: [u8; 4],
        fragment: bool,
        l4: L4At,
    },
    V6 {
        src: [u8; 16],
        fragment: bool,
        l4: L4At,
    },
}

/// Where the layer-4 header is, read only if the source's prefix has
/// classes: packed in one word, so that it costs one register (or one
/// spill) on the path of every frame.
#[derive(Clone, Copy)]
pub(crate) struct L4At(u64);

impl L4At {
    /// `ip`: offset of the IP header (its destination is read from there,
    /// for classes only); `off`: offset of the layer-4 header, 0 for none
    /// to read (a non-first fragment, or an IPv6 extension chain longer
    /// than the walk).
    #[inline(always)]
    pub(crate) fn new(ip: usize, proto: u8, off: usize) -> L4At {
        L4At((off as u64 & 0xffff) | (proto as u64) << 16 | (ip as u64 & 0xff) << 24)
    }

    #[inline(always)]
    pub(crate) fn ip(self) -> usize {
        ((self.0 >> 24) & 0xff) as usize
    }

    #[inline(always)]
    pub(crate) fn proto(self) -> u8 {
        (self.0 >> 16) as u8
    }

    #[inline(always)]
    pub(crate) fn off(self) -> usize {
        (self.0 & 0xffff) as usize
    }
}

#[inline(always)]
pub(crate) fn parse(ctx: &XdpContext) -> Parsed {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return Parsed::NonIp;
    };
    // SAFETY: bounds checked by ptr_at.
    let mut proto = u16::from_be(unsafe { (*eth).ether_type });
    let mut off = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        // The inner ethertype sits in the last two bytes of the tag.
        let Some(inner) = ptr_at::<[u8; 2]>(ctx, off + VLAN_HLEN - 2) else {
            return Parsed::Malformed;
        };
        // SAFETY: bounds checked by ptr_at.
        proto = u16::from_be_bytes(unsafe { *inner });
        off += VLAN_HLEN;
    }
    let frame_len = ctx.data_end() - ctx.data();
    match proto {
        ETH_P_IP => {
            let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, off) else {
                return Parsed::Malformed;
            };
            // SAFETY: bounds checked by ptr_at.
            let ip = unsafe { &*ip };
            let hlen = ((ip.vihl & 0xf) as usize) * 4;
            let tot_len = u16::from_be_bytes(ip.tot_len) as usize;
            // Version 4, IHL >= 5, options inside the frame, and a total
            // length that covers the header and fits in the frame (shorter
            // is fine: Ethernet pads small frames).
            if ip.vihl >> 4 != 4
                || hlen < IPV4_MIN_HLEN
                || off + hlen > frame_len
                || tot_len < hlen
                || off + tot_len > frame_len
            {
                return Parsed::Malformed;
            }
            // More-fragments flag or a fragment offset.
            let frags = u16::from_be_bytes(ip.frags);
            let fragment = frags & 0x3fff != 0;
            // Only a first fragment (offset 0) carries the layer-4 header.
            let l4 = L4At::new(off, ip.proto as u8, if frags & 0x1fff == 0 { off + hlen } else { 0 });
            Parsed::V4 { src: ip.src_addr, fragment, l4 }
        }
        ETH_P_IPV6 => {
            let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, off) else {
                return Parsed::Malformed;
            };
            // SAFETY: bounds checked by ptr_at.
            let ip = unsafe { &*ip };
            let payload = u16::from_be_bytes(ip.payload_len) as usize;
            // Payload length 0 is a jumbogram (or unknown): not checked.
            if ip.vcf[0] >> 4 != 6 || off + IPV6_HLEN + payload > frame_len {
                return Parsed::Malformed;
            }
            parse_v6_ext(ctx, ip, off, frame_len)
        }
        _ => Parsed::NonIp,
    }
}

/// The rest of [`parse`] for the IPv6 header `ip` at `off` (checked
/// already): walk the extension headers to find a fragment header and the
/// layer-4 header; a header cut off by the end of the frame is malformed.
/// A function of its own so that `parse` stays under 100 lines (issue 42);
/// inlined, it compiles to the instructions of the walk written inside
/// `parse` (bench/ab-veth-parse.md).
#[inline(always)]
fn parse_v6_ext(ctx: &XdpContext, ip: &Ipv6Hdr, off: usize, frame_len: usize) -> Parsed {
    let mut nh = ip.next_hdr;
    let mut p = off + IPV6_HLEN;
    // Declared before `fragment`: in the other order, the function compiles
    // to other instructions than the walk did inside `parse` (a spill and an
    // add swap places; bench/ab-veth-parse.md).
    let mut later_fragment = false;
    let mut fragment = false;
    // The header after the chain, once found (stays 0 for a chain the walk
    // does not finish, and for a non-first fragment).
    let mut l4_off = 0;
    for _ in 0..MAX_EXT_HEADERS {
        let len = match nh {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH => {
                let Some(h) = ptr_at::<[u8; 2]>(ctx, p) else {
                    return Parsed::Malformed;
                };
                // SAFETY: bounds checked by ptr_at.
                let h = unsafe { *h };
                let len = if nh == IPPROTO_AH { (h[1] as usize + 2) * 4 } else { (h[1] as usize + 1) * 8 };
                nh = h[0];
                len
            }
            IPPROTO_FRAGMENT => {
                // The whole (fixed, 8-byte) header; a one-byte read
                // gets a bounds check the verifier cannot follow.
                let Some(h) = ptr_at::<[u8; 8]>(ctx, p) else {
                    return Parsed::Malformed;
                };
                fragment = true;
                // SAFETY: bounds checked by ptr_at.
                let h = unsafe { *h };
                nh = h[0];
                later_fragment |= u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0;
                8
            }
            _ => {
                l4_off = p;
                break;
            }
        };
        if p + len > frame_len {
            return Parsed::Malformed;
        }
        p += len;
        // Bounded: past this, the rest of the chain is not read.
        if p > MAX_EXT_OFFSET {
            break;
        }
    }
    let l4 = L4At::new(off, nh, if later_fragment { 0 } else { l4_off });
    Parsed::V6 { src: ip.src_addr, fragment, l4 }
}
