//! Reference XDP programs for the benchmark (`cargo xtask bench`): floors
//! measured in the same run as the policer, and the live-frames traffic
//! generator. Not part of the product.
//!
//! - `xdp_pass`, `xdp_drop`: the floors.
//! - `parse_lookup`: the minimal work a per-source policer cannot avoid —
//!   parse Ethernet + IPv4, build the same 8-byte key as the policer, one
//!   LRU hash lookup (insert on a miss, as the policer's first packet does)
//!   and a read of the 16-byte value. With `REF_SOURCES` = N it replaces the
//!   source with synthetic sources 10.x.y.z cycling 0..N exactly as the
//!   policer's bench variant does, so both touch the same number of entries.
//!   `REF_STEPS` adds, one bit each, the policer's other per-packet work so
//!   its cost can be broken down: 1 = the LPM-trie rule lookup, 2 =
//!   `bpf_ktime_get_ns`, 4 = the two per-CPU counter blocks (interface and
//!   rule), 8 = an atomic add on the bucket's value.
//! - `parse_lookup6`: the same minimal work for IPv6 — parse Ethernet +
//!   IPv6, build the policer's IPv6 key (the source masked to its /64, the
//!   default key length, and that length), one LRU hash lookup of
//!   `REF_TABLE6` (insert on a miss) and a read of the value; drops every
//!   IPv6 frame. A program of its own, so that `parse_lookup`, the kernel
//!   benchmark's IPv4 reference, stays exactly what it was.
//! - `xdp_sink`: drops IPv4 frames to one network, passes the rest (the
//!   SYN-cookie rig's client side: the answers to a spoofed flood).
//! - `xdp_gen`: run with `BPF_F_TEST_XDP_LIVE_FRAMES`, rewrites each frame's
//!   IPv4 source (GEN_BASE + 0..GEN_SOURCES, in turn or at random), fixes the
//!   header checksum and redirects the frame into `GEN_IFINDEX`.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics), allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod programs {
    use core::intrinsics::{AtomicOrdering, atomic_xadd};

    use aya_ebpf::{
        bindings::{BPF_NOEXIST, xdp_action},
        helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, bpf_redirect},
        macros::{map, xdp},
        maps::{LpmTrie, LruHashMap, PerCpuArray, lpm_trie::Key},
        programs::XdpContext,
    };
    use policer_common::{Bucket, BucketKeyV4, Counters, DEFAULT_MAX_RULES, MAX_IFACE_SLOTS, Rule, RuleCounters};

    /// Resized by the benchmark loader.
    #[map]
    static REF_TABLE: LruHashMap<BucketKeyV4, Bucket> = LruHashMap::with_max_entries(1024, 0);
    /// An IPv6 bucket key as the policer's LRU table had it (the masked
    /// source, then its key length): defined here so the reference stays
    /// what it is whatever the policer's own IPv6 table becomes.
    #[repr(C)]
    struct RefKeyV6 {
        addr: [u8; 16],
        key_len: u32,
    }

    /// `parse_lookup6`'s table; resized by the benchmark loader.
    #[map]
    static REF_TABLE6: LruHashMap<RefKeyV6, Bucket> = LruHashMap::with_max_entries(1024, 0);
    #[map]
    static REF_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
    #[map]
    static GEN_SEQ: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);
    #[map]
    static REF_RULES: LpmTrie<[u8; 4], Rule> = LpmTrie::with_max_entries(DEFAULT_MAX_RULES, 0);
    #[map]
    static REF_COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(MAX_IFACE_SLOTS, 0);
    #[map]
    static REF_RULE_COUNTERS: PerCpuArray<RuleCounters> = PerCpuArray::with_max_entries(DEFAULT_MAX_RULES + 1, 0);

    /// Synthetic sources for `parse_lookup` (0 = the frame's own source).
    #[unsafe(no_mangle)]
    static REF_SOURCES: u32 = 0;
    /// Extra steps of `parse_lookup` (bits, see the module doc).
    #[unsafe(no_mangle)]
    static REF_STEPS: u32 = 0;
    /// Where `xdp_gen` redirects its frames.
    #[unsafe(no_mangle)]
    static GEN_IFINDEX: u32 = 0;
    /// Number of sources `xdp_gen` cycles through (at least 1).
    #[unsafe(no_mangle)]
    static GEN_SOURCES: u32 = 1;
    /// First source address, host order.
    #[unsafe(no_mangle)]
    static GEN_BASE: u32 = 0x0a00_0000;
    /// Non-zero: pick sources at random instead of in turn.
    #[unsafe(no_mangle)]
    static GEN_RANDOM: u32 = 0;

    const ETH_HLEN: usize = 14;
    const IPV4_HLEN: usize = 20;
    const IPV6_HLEN: usize = 40;
    /// The policer's default key length for IPv6: one bucket per /64.
    const V6_KEY_LEN: u32 = 64;

    #[xdp]
    pub fn xdp_pass(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_PASS
    }

    #[xdp]
    pub fn xdp_drop(_ctx: XdpContext) -> u32 {
        xdp_action::XDP_DROP
    }

    #[inline(always)]
    fn ro(v: &u32) -> u32 {
        // SAFETY: a read of a plain static the loader may rewrite before load.
        unsafe { core::ptr::read_volatile(v) }
    }

    #[xdp]
    pub fn parse_lookup(ctx: XdpContext) -> u32 {
        let data = ctx.data();
        if data + ETH_HLEN + IPV4_HLEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let (proto, vihl, src) = unsafe {
            let p = data as *const u8;
            (
                u16::from_be_bytes([*p.add(12), *p.add(13)]),
                *p.add(ETH_HLEN),
                [*p.add(26), *p.add(27), *p.add(28), *p.add(29)],
            )
        };
        if proto != 0x0800 || vihl >> 4 != 4 || vihl & 0xf < 5 {
            return xdp_action::XDP_PASS;
        }
        let mut key = BucketKeyV4 { addr: src, key_len: 32 };
        let n = ro(&REF_SOURCES);
        if n != 0
            && let Some(seq) = REF_SEQ.get_ptr_mut(0)
        {
            // SAFETY: per-CPU slot. The same arithmetic as the policer's
            // bench variant (a 64-bit modulo).
            let i = unsafe {
                let v = *seq;
                *seq = v + 1;
                (v % n as u64) as u32
            };
            key.addr[0] = 10;
            key.addr[1] = (i >> 16) as u8;
            key.addr[2] = (i >> 8) as u8;
            key.addr[3] = i as u8;
        }
        let steps = ro(&REF_STEPS);
        let len = (ctx.data_end() - data) as u64;
        let mut slot = 0;
        if steps & 1 != 0 {
            let a = [key.addr[0], key.addr[1], key.addr[2], key.addr[3]];
            match REF_RULES.get(&Key::new(32, a)) {
                Some(r) => slot = r.counter_slot % (DEFAULT_MAX_RULES + 1),
                None => return xdp_action::XDP_PASS,
            }
        }
        // SAFETY: helper with no preconditions.
        let now = if steps & 2 != 0 { unsafe { bpf_ktime_get_ns() } } else { 0 };
        if steps & 4 != 0 {
            // SAFETY: reading the ingress ifindex from the context.
            let ifslot = unsafe { (*ctx.ctx).ingress_ifindex } % MAX_IFACE_SLOTS;
            if let (Some(c), Some(rc)) = (REF_COUNTERS.get_ptr_mut(ifslot), REF_RULE_COUNTERS.get_ptr_mut(slot)) {
                // SAFETY: per-CPU slots, only this CPU writes them while we run.
                unsafe {
                    (*c).dropped_pkts += 1;
                    (*c).dropped_bytes += len;
                    (*rc).dropped_pkts += 1;
                    (*rc).dropped_bytes += len;
                }
            }
        }
        match REF_TABLE.get_ptr_mut(&key) {
            Some(v) => {
                // SAFETY: a live map value; read like the policer reads `tat`.
                let tat = unsafe { core::ptr::read_volatile(&(*v).tat) };
                if steps & 8 != 0 {
                    // SAFETY: a live map value; other CPUs may add too.
                    unsafe {
                        atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                            &raw mut (*v).meta,
                            policer_common::bucket::DROP_ONE,
                        )
                    };
                }
                if tat == u64::MAX || (now != 0 && tat > now) { xdp_action::XDP_PASS } else { xdp_action::XDP_DROP }
            }
            None => {
                // SAFETY: Bucket is plain data; all zeroes is a valid value.
                let b: Bucket = unsafe { core::mem::zeroed() };
                let _ = REF_TABLE.insert(&key, &b, BPF_NOEXIST as u64);
                xdp_action::XDP_DROP
            }
        }
    }

    #[xdp]
    pub fn parse_lookup6(ctx: XdpContext) -> u32 {
        let data = ctx.data();
        if data + ETH_HLEN + IPV6_HLEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let (proto, version) = unsafe {
            let p = data as *const u8;
            (u16::from_be_bytes([*p.add(12), *p.add(13)]), *p.add(ETH_HLEN) >> 4)
        };
        if proto != 0x86dd || version != 6 {
            return xdp_action::XDP_PASS;
        }
        let mut key = RefKeyV6 { addr: [0; 16], key_len: V6_KEY_LEN };
        // The source's first 64 bits (IPv6 header offset 8); the rest of
        // the key stays zero, as the policer masks it.
        // SAFETY: bounds checked above.
        unsafe {
            let src = (data + ETH_HLEN + 8) as *const [u8; 8];
            key.addr[..8].copy_from_slice(&core::ptr::read_unaligned(src));
        }
        match REF_TABLE6.get_ptr_mut(&key) {
            Some(v) => {
                // SAFETY: a live map value; read like the policer reads `tat`.
                let tat = unsafe { core::ptr::read_volatile(&(*v).tat) };
                if tat == u64::MAX { xdp_action::XDP_PASS } else { xdp_action::XDP_DROP }
            }
            None => {
                // SAFETY: Bucket is plain data; all zeroes is a valid value.
                let b: Bucket = unsafe { core::mem::zeroed() };
                let _ = REF_TABLE6.insert(&key, &b, BPF_NOEXIST as u64);
                xdp_action::XDP_DROP
            }
        }
    }

    #[xdp]
    pub fn xdp_gen(ctx: XdpContext) -> u32 {
        let data = ctx.data();
        if data + ETH_HLEN + IPV4_HLEN > ctx.data_end() {
            return xdp_action::XDP_ABORTED;
        }
        let n = ro(&GEN_SOURCES).max(1);
        let i = if ro(&GEN_RANDOM) != 0 {
            // SAFETY: helper with no preconditions.
            (unsafe { bpf_get_prandom_u32() }) % n
        } else {
            let Some(seq) = GEN_SEQ.get_ptr_mut(0) else {
                return xdp_action::XDP_ABORTED;
            };
            // SAFETY: per-CPU slot, only this CPU writes it while we run.
            unsafe {
                let v = *seq;
                *seq = if v + 1 >= n { 0 } else { v + 1 };
                v
            }
        };
        let src = ro(&GEN_BASE).wrapping_add(i).to_be_bytes();
        // SAFETY: bounds checked above; the frame is ours to rewrite.
        unsafe {
            let ip = (data + ETH_HLEN) as *mut u8;
            for (k, b) in src.iter().enumerate() {
                *ip.add(12 + k) = *b;
            }
            *ip.add(10) = 0;
            *ip.add(11) = 0;
            let mut sum: u32 = 0;
            for w in 0..IPV4_HLEN / 2 {
                sum += u32::from(u16::from_be_bytes([*ip.add(2 * w), *ip.add(2 * w + 1)]));
            }
            sum = (sum & 0xffff) + (sum >> 16);
            sum = (sum & 0xffff) + (sum >> 16);
            let c = (!(sum as u16)).to_be_bytes();
            *ip.add(10) = c[0];
            *ip.add(11) = c[1];
        }
        // SAFETY: helper with no preconditions.
        unsafe { bpf_redirect(ro(&GEN_IFINDEX), 0) as u32 }
    }

    /// The network `xdp_sink` drops frames to (host order) and its mask.
    #[unsafe(no_mangle)]
    static SINK_NET: u32 = 0;
    #[unsafe(no_mangle)]
    static SINK_MASK: u32 = 0xffff_ffff;

    /// Drops IPv4 frames whose destination is in `SINK_NET`/`SINK_MASK`,
    /// passes every other frame: on a client's side of the SYN-cookie rig,
    /// the SYN-ACKs answering a spoofed flood go nowhere, as they would go
    /// out to the forged sources' networks, not into the clients' stack.
    #[xdp]
    pub fn xdp_sink(ctx: XdpContext) -> u32 {
        let data = ctx.data();
        if data + ETH_HLEN + IPV4_HLEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        let (ethertype, dst) = unsafe {
            let p = data as *const u8;
            (
                u16::from_be_bytes([*p.add(12), *p.add(13)]),
                u32::from_be_bytes([*p.add(30), *p.add(31), *p.add(32), *p.add(33)]),
            )
        };
        if ethertype == 0x0800 && dst & ro(&SINK_MASK) == ro(&SINK_NET) {
            xdp_action::XDP_DROP
        } else {
            xdp_action::XDP_PASS
        }
    }

    /// Sends every IPv4 frame straight back where it came from (`XDP_TX`),
    /// its Ethernet and IPv4 addresses swapped and nothing else touched
    /// (the IPv4 checksum holds: the sum does not depend on the order). The
    /// SYN-cookie benchmark's hand-off row: what the veth costs for one
    /// frame sent back per SYN, as each SYN-ACK from XDP is, without any
    /// of an answer's own work. Other frames pass.
    #[xdp]
    pub fn xdp_reflect(ctx: XdpContext) -> u32 {
        let data = ctx.data();
        if data + ETH_HLEN + IPV4_HLEN > ctx.data_end() {
            return xdp_action::XDP_PASS;
        }
        // SAFETY: bounds checked above.
        unsafe {
            let p = data as *mut u8;
            if u16::from_be_bytes([*p.add(12), *p.add(13)]) != 0x0800 {
                return xdp_action::XDP_PASS;
            }
            for i in 0..6 {
                core::ptr::swap(p.add(i), p.add(6 + i));
            }
            for i in 0..4 {
                core::ptr::swap(p.add(ETH_HLEN + 12 + i), p.add(ETH_HLEN + 16 + i));
            }
        }
        xdp_action::XDP_TX
    }

    #[panic_handler]
    fn panic(_info: &core::panic::PanicInfo) -> ! {
        loop {}
    }

    #[unsafe(link_section = "license")]
    #[unsafe(no_mangle)]
    static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
}

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("reference XDP programs for the benchmark; built for bpfel-unknown-none by the tests crate");
}
