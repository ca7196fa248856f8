//! SYN cookies (policer_common::syn, docs/syn-cookies.md): the policer's
//! code hands a frame of a rule with `--syn-cookies` here first (its
//! answer `SYN_PATH` with the rule's slot); [`syn_path`] answers a SYN of an unverified source for a
//! local listener with the kernel's cookie (`XDP_TX`), marks a source
//! verified when the kernel accepts its cookie ACK (or holds a connection
//! of it), passes a `flood` rule's SYNs that are within its SYN budget,
//! and hands everything else back to policing (`SYN_POLICE`). A
//! function of its own, called from the entry: its stack is not added to
//! the policer's.

use core::intrinsics::{AtomicOrdering, atomic_or};

use aya_ebpf::{
    bindings::{bpf_sock, bpf_sock_tuple, tcphdr, xdp_action, xdp_md},
    helpers::{
        bpf_jiffies64, bpf_ktime_get_ns, bpf_sk_release, bpf_skc_lookup_tcp, bpf_tcp_check_syncookie,
        bpf_tcp_gen_syncookie, bpf_xdp_adjust_tail, bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    programs::XdpContext,
};
use policer_common::{
    MAX_IFACE_SLOTS,
    syn::{self, SYN_FLOOD, SYN_POLICE, SynAckParams, SynCounters, SynScratch},
};

use crate::{
    buckets::{CAS_ROUNDS, Charge, cas, charge},
    clock::Clock,
    maps::{
        COUNTERS, CPU_SCRATCH, SYN_CAP, SYN_CONF, SYN_COUNTERS, SYN_EXACT, SYN_SCRATCH, SYN_SEEN, SYN_TOTALS,
        SYN_VERIFIED, TEST_CLOCK, TICK_NS,
    },
    parse::{L4At, Parsed, parse, ptr_at},
    verifier::launder,
};

const TCP_LISTEN: u32 = 10;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
const TCP_FIN: u8 = 0x01;

/// `n` (1..=64) as a helper's size argument: a range the verifier knows
/// (laundered first: the compiler would drop a mask it can prove idle).
#[inline(always)]
fn size_1_to_64(n: u32) -> u32 {
    (((launder(n as u64) as u32).wrapping_sub(1)) & 63) + 1
}

/// After the policing of a frame the SYN path handed back: the attached
/// entry counted its class (and a fragment) already, and the policing
/// again; taken back, so that each frame counts once.
#[inline(never)]
pub(crate) fn handed_back(md: *mut xdp_md) {
    let ctx = XdpContext::new(md);
    // SAFETY: reading the ingress ifindex from the context.
    let at = unsafe { (*md).ingress_ifindex } % MAX_IFACE_SLOTS;
    let Some(c) = COUNTERS.get_ptr_mut(at) else {
        return;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    let c = unsafe { &mut *c };
    c.class_matched = c.class_matched.saturating_sub(1);
    if let Parsed::V4 { fragment: true, .. } | Parsed::V6 { fragment: true, .. } = parse(&ctx) {
        c.fragment_pkts = c.fragment_pkts.saturating_sub(1);
    }
}

/// The SYN path for a frame of the rule at `slot` (with `RULE_SYN`): an
/// XDP action, or `SYN_POLICE`.
#[inline(never)]
pub(crate) fn syn_path(md: *mut xdp_md, slot: u32) -> u32 {
    let ctx = XdpContext::new(md);
    let Some(s) = SYN_SCRATCH.get_ptr_mut(0) else {
        return SYN_POLICE;
    };
    // SAFETY: this CPU's slot; only this CPU touches it while we run.
    let s = unsafe { &mut *s };
    s.slot = slot;
    let (Some(conf), Some(sc)) = (SYN_CONF.get(slot), SYN_COUNTERS.get_ptr_mut(slot)) else {
        return SYN_POLICE;
    };
    if conf.mode == 0 {
        return SYN_POLICE;
    }
    // SAFETY: per-CPU slot.
    let sc = unsafe { &mut *sc };
    // The frame parsed again (the policer's code hands over only the
    // slot): TCP with its header, or policed.
    let (l4, v6) = match parse(&ctx) {
        Parsed::V4 { l4, .. } => (l4, false),
        Parsed::V6 { l4, .. } => (l4, true),
        _ => return SYN_POLICE,
    };
    if l4.proto() != 6 || l4.off() == 0 {
        return SYN_POLICE;
    }
    s.ip_off = l4.ip() as u32;
    s.l4_off = l4.off() as u32;
    s.v6 = v6 as u32;
    let Some(tcp_len) = copy_headers(&ctx, md, s, v6, &l4) else {
        return SYN_POLICE;
    };

    let src = if v6 {
        let mut a = [0u8; 16];
        a.copy_from_slice(&s.ip[8..24]);
        a
    } else {
        // `::ffff:a.b.c.d` as two words (policer_common::mapped_v4 is an
        // array of bytes with ten zeros: a byte loop in the program).
        const S: usize = syn::TUPLE_AT_V4;
        let w = u32::from_be_bytes([s.ip[S], s.ip[S + 1], s.ip[S + 2], s.ip[S + 3]]);
        (0xffff_u128 << 32 | w as u128).to_be_bytes()
    };
    let flags = s.tcp[13];
    let syn = flags & (TCP_SYN | TCP_ACK | TCP_RST | TCP_FIN) == TCP_SYN;
    let ack = flags & (TCP_SYN | TCP_ACK | TCP_RST) == TCP_ACK;
    // A SYN's reflection cap slot is read here, beside the filter's word
    // below: for a flood's SYN each is a miss in a random place, and
    // issued together they are waited for once, not one after the other
    // (the value read is where the compare-and-swap starts).
    let cap = if syn { SYN_CAP.get_ptr_mut(syn::cap_slot(&src, v6)) } else { None };
    // SAFETY: a live array value; other CPUs change it only by CAS.
    let cap_old = cap.map_or(0, |p| unsafe { core::ptr::read_volatile(p) });
    // The filter first: a forged source's bit is clear (an array word,
    // inlined), and only a set one costs the hash lookup.
    let seen = seen(&src);
    if seen && SYN_VERIFIED.get_ptr(&src).is_some() {
        return SYN_POLICE;
    }
    if syn {
        sc.syns += 1;
        // `flood`: a SYN within the rule's SYN budget goes to the kernel
        // as it is, judged by that budget alone: no bucket for its source
        // (unverified), and not charged to the rule's total, which is
        // the verified sources' (docs/syn-cookies.md).
        if conf.mode == SYN_FLOOD && !flooding(&ctx, slot) {
            sc.syns_passed += 1;
            return xdp_action::XDP_PASS;
        }
        let Some(cap) = cap else {
            return SYN_POLICE;
        };
        answer_syn(&ctx, s, sc, conf, (cap, cap_old), (v6, seen), tcp_len)
    } else if ack {
        check_ack(&ctx, s, sc, &src, v6, tcp_len)
    } else {
        SYN_POLICE
    }
}

/// A pointer `at` bytes into the scratch's run of IP and TCP headers
/// (`ip` then `tcp`, adjacent: policer_common::syn), for the helpers.
#[inline(always)]
fn headers_at(s: &mut SynScratch, at: usize) -> *mut u8 {
    // SAFETY: within the scratch (`at` below IP_MAX + 64 at every caller).
    unsafe { (&raw mut s.ip).cast::<u8>().add(at) }
}

/// Copies the IP header (IPv4: its first 20 bytes) to `ip_at` and the TCP
/// header after it: one copy when they are adjacent in the frame (no IPv4
/// options, no IPv6 extension headers), else two. The TCP header's length.
#[inline(always)]
fn copy_headers(ctx: &XdpContext, md: *mut xdp_md, s: &mut SynScratch, v6: bool, l4: &L4At) -> Option<u32> {
    // The TCP header's length from the frame itself (the parse saw its
    // ports only).
    let off = ptr_at::<u8>(ctx, l4.off() + 12)?;
    // SAFETY: bounds checked by ptr_at.
    let len = ((unsafe { *off } >> 4) as u32) * 4;
    if len < 20 {
        return None;
    }
    let tcp_len = size_1_to_64(len);
    let (ip_off, l4_off) = (s.ip_off, s.l4_off);
    // SAFETY: helpers writing into this CPU's map value: the IP header's
    // bytes end where `tcp` starts, which takes at most 64.
    let r = unsafe {
        if v6 && l4_off == ip_off + 40 {
            bpf_xdp_load_bytes(md, ip_off, headers_at(s, syn::ip_at(true)).cast(), 40 + tcp_len)
        } else if !v6 && l4_off == ip_off + 20 {
            bpf_xdp_load_bytes(md, ip_off, headers_at(s, syn::ip_at(false)).cast(), 20 + tcp_len)
        } else {
            let r = if v6 {
                bpf_xdp_load_bytes(md, ip_off, headers_at(s, syn::ip_at(true)).cast(), 40)
            } else {
                bpf_xdp_load_bytes(md, ip_off, headers_at(s, syn::ip_at(false)).cast(), 20)
            };
            if r == 0 { bpf_xdp_load_bytes(md, l4_off, s.tcp.as_mut_ptr().cast(), tcp_len) } else { r }
        }
    };
    (r == 0).then_some(len)
}

/// `flood` mode: whether the rule's SYNs of unverified sources are over
/// its SYN budget (`SYN_TOTALS`: the `--total-rate`'s arithmetic, a
/// bucket of its own beside the rule's total; this SYN charged to it).
#[inline(always)]
fn flooding(ctx: &XdpContext, slot: u32) -> bool {
    let Some(t) = SYN_TOTALS.get_ptr_mut(slot) else {
        return true;
    };
    let mut clock = Clock::new(ctx);
    let mut retries = 0;
    // SAFETY: a live array value; `tat` only changed by compare-and-swap.
    unsafe { !matches!(charge(&raw mut (*t).tat, &(*t).limiter, &mut clock, 60, &mut retries), Charge::Admitted) }
}

/// The listener a SYN of a source never seen reaches, once the SYN path has
/// been on for a while (policer_common::syn::EXACT_NS): looked up by the
/// SYN's destination with no source (its tuple's source address and port
/// zeroed for the lookup, then put back), whose bucket in the kernel's
/// table of connections is the same for every SYN and so stays in the
/// cache, where each forged source's own bucket is a miss. The listener
/// found is the one its own tuple finds (a reuseport group shares its
/// cookies' state).
#[inline(always)]
fn listener(ctx: &XdpContext, s: &mut SynScratch, v6: bool) -> *mut bpf_sock {
    let sport = [s.tcp[0], s.tcp[1]];
    (s.tcp[0], s.tcp[1]) = (0, 0);
    let sk = if v6 {
        let at = syn::TUPLE_AT_V6;
        let mut saddr = [0u8; 16];
        saddr.copy_from_slice(&s.ip[at..at + 16]);
        s.ip[at..at + 16].fill(0);
        let sk = lookup(ctx, s, true);
        s.ip[at..at + 16].copy_from_slice(&saddr);
        sk
    } else {
        let at = syn::TUPLE_AT_V4;
        let saddr = [s.ip[at], s.ip[at + 1], s.ip[at + 2], s.ip[at + 3]];
        s.ip[at..at + 4].fill(0);
        let sk = lookup(ctx, s, false);
        s.ip[at..at + 4].copy_from_slice(&saddr);
        sk
    };
    (s.tcp[0], s.tcp[1]) = (sport[0], sport[1]);
    sk
}

/// The listening (or connected) socket the frame's tuple reaches, if any.
#[inline(always)]
fn lookup(ctx: &XdpContext, s: &mut SynScratch, v6: bool) -> *mut bpf_sock {
    // The tuple is the headers' addresses and ports, back to back where
    // they were copied.
    let (at, size) = if v6 { (syn::TUPLE_AT_V6, 36) } else { (syn::TUPLE_AT_V4, 12) };
    let t = headers_at(s, at).cast::<bpf_sock_tuple>();
    // SAFETY: the tuple is in this CPU's map value; BPF_F_CURRENT_NETNS.
    unsafe { bpf_skc_lookup_tcp(ctx.ctx.cast(), t, size, u64::MAX, 0) }
}

/// A SYN of an unverified source: the kernel's cookie in a SYN-ACK sent
/// back out of the interface, unless no one listens (policed), the kernel
/// makes no cookie (policed), or the reflection cap holds it back
/// (dropped).
#[inline(always)]
fn answer_syn(
    ctx: &XdpContext,
    s: &mut SynScratch,
    sc: &mut SynCounters,
    conf: &syn::SynConf,
    cap: (*mut u64, u64),
    (v6, seen): (bool, bool),
    tcp_len: u32,
) -> u32 {
    let now = recent_time();
    // By its own tuple while the SYN path is new, or for a source the
    // filter has seen (it may hold a connection or a TIME_WAIT): the
    // kernel answers a SYN of those itself.
    let exact = seen || SYN_EXACT.get(0).is_none_or(|until| now < *until);
    let sk = if exact { lookup(ctx, s, v6) } else { listener(ctx, s, v6) };
    if sk.is_null() {
        sc.no_listener += 1;
        return SYN_POLICE;
    }
    // SAFETY: a socket the lookup returned, released on every path below.
    let state = unsafe { core::ptr::read_volatile(&(*sk).state) };
    if state != TCP_LISTEN {
        // SAFETY: as above.
        unsafe { bpf_sk_release(sk.cast()) };
        return SYN_POLICE;
    }
    if !cap_admits(cap, now, conf) {
        // SAFETY: as above.
        unsafe { bpf_sk_release(sk.cast()) };
        sc.synacks_capped += 1;
        return xdp_action::XDP_DROP;
    }
    let iplen = if v6 { 40 } else { 20 };
    // SAFETY: the socket and the headers copied into this CPU's map value.
    let r = unsafe {
        let r = bpf_tcp_gen_syncookie(
            sk.cast(),
            headers_at(s, syn::ip_at(v6)).cast(),
            iplen,
            s.tcp.as_mut_ptr().cast::<tcphdr>(),
            size_1_to_64(tcp_len),
        );
        bpf_sk_release(sk.cast());
        r
    };
    if r < 0 {
        sc.no_cookie += 1;
        return SYN_POLICE;
    }
    let mss = if v6 { conf.mss_v6 } else { conf.mss_v4 };
    let p =
        SynAckParams { cookie: r as u32, mss: mss as u16, wscale: conf.wscale as u8, now_ms: (now / 1_000_000) as u32 };
    let o = syn::parse_syn_with(&s.tcp, tcp_len as usize, launder);
    let n = syn::build_synack(&s.ip, &s.tcp, &o, v6, &p, &mut s.ip_out, &mut s.tcp_out) as u32;
    if send(ctx, s, iplen, n) {
        sc.cookies_sent += 1;
        xdp_action::XDP_TX
    } else {
        xdp_action::XDP_DROP
    }
}

/// The reflection cap's slot of the SYN's network (`p`, its value read
/// as `old`): whether one more SYN-ACK may go toward it now (charged if
/// so), by compare-and-swap, so two CPUs never send the same allowance
/// twice. Lost rounds hold the SYN-ACK back, as a bucket's do.
#[inline(always)]
fn cap_admits((p, mut old): (*mut u64, u64), now: u64, conf: &syn::SynConf) -> bool {
    for _ in 0..CAS_ROUNDS {
        let Some(new) = syn::cap_admit(old, now, conf) else {
            return false;
        };
        // SAFETY: a live array value; other CPUs change it only by CAS.
        let seen = unsafe { cas(p, old, new) };
        if seen == old {
            return true;
        }
        old = seen;
    }
    false
}

/// The time for the reflection cap and the SYN-ACK's timestamp, neither
/// of which a tick or two changes: this CPU's last clock reading while it
/// is that recent (policer_common::CpuScratch::recent), else a reading
/// (recorded for the next SYNs and the policing alike). A flood's SYNs
/// read the clock once a tick per CPU, not each. Under the test clock, the
/// kernel's as before.
#[inline(always)]
fn recent_time() -> u64 {
    // SAFETY: plain statics the loader may rewrite before load.
    let (test, tick) = unsafe { (core::ptr::read_volatile(&TEST_CLOCK) != 0, core::ptr::read_volatile(&TICK_NS)) };
    if !test && let Some(c) = CPU_SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; only this CPU touches it while we run.
        // BPF helpers with no preconditions.
        unsafe {
            let jiffies = bpf_jiffies64();
            if let Some(t) = (*c).recent(jiffies, tick) {
                return t;
            }
            let now = bpf_ktime_get_ns();
            (*c).record(now, jiffies);
            return now;
        }
    }
    // SAFETY: BPF helper with no preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// Makes the frame the SYN-ACK built in the scratch: its length, the MACs
/// swapped (VLAN tags kept), the IP and TCP headers written.
#[inline(always)]
fn send(ctx: &XdpContext, s: &mut SynScratch, iplen: u32, n: u32) -> bool {
    // Laundered: else the compiler folds it into arithmetic on the packet
    // end pointer, which the verifier refuses.
    let len = launder((ctx.data_end() - ctx.data()) as u64) as i64;
    let want = (s.ip_off + iplen + n) as i64;
    // SAFETY: the context; packet pointers are read again after it.
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, (want - len) as i32) } != 0 {
        return false;
    }
    let Some(eth) = ptr_at::<[u8; 12]>(ctx, 0) else {
        return false;
    };
    // SAFETY: bounds checked by ptr_at.
    unsafe {
        let e = *eth;
        let out = &mut *(eth as *mut [u8; 12]);
        out[0..6].copy_from_slice(&e[6..12]);
        out[6..12].copy_from_slice(&e[0..6]);
    }
    let n = size_1_to_64(n);
    // SAFETY: a helper reading this CPU's map value: the IP header's bytes
    // end where `tcp_out` starts, of which at most 64 are read.
    unsafe {
        let out = (&raw mut s.ip_out).cast::<u8>();
        let r = if iplen == 40 {
            bpf_xdp_store_bytes(ctx.ctx, s.ip_off, out.add(syn::ip_at(true)).cast(), 40 + n)
        } else {
            bpf_xdp_store_bytes(ctx.ctx, s.ip_off, out.add(syn::ip_at(false)).cast(), 20 + n)
        };
        r == 0
    }
}

/// An ACK of an unverified source: the source is verified when the kernel
/// holds a connection (or a request) of its tuple, or accepts its cookie;
/// an ACK to a listener with a cookie it refuses is dropped.
#[inline(always)]
fn check_ack(
    ctx: &XdpContext,
    s: &mut SynScratch,
    sc: &mut SynCounters,
    src: &[u8; 16],
    v6: bool,
    tcp_len: u32,
) -> u32 {
    let sk = lookup(ctx, s, v6);
    if sk.is_null() {
        return SYN_POLICE;
    }
    // SAFETY: a socket the lookup returned, released on every path below.
    let state = unsafe { core::ptr::read_volatile(&(*sk).state) };
    let ok = state != TCP_LISTEN || {
        let iplen = if v6 { 40 } else { 20 };
        // SAFETY: the listener and the headers in this CPU's map value.
        let r = unsafe {
            bpf_tcp_check_syncookie(
                sk.cast(),
                headers_at(s, syn::ip_at(v6)).cast(),
                iplen,
                s.tcp.as_mut_ptr().cast::<tcphdr>(),
                size_1_to_64(tcp_len),
            )
        };
        if r == 0 {
            sc.acks_accepted += 1;
        } else {
            sc.acks_refused += 1;
        }
        r == 0
    };
    // SAFETY: as above.
    unsafe { bpf_sk_release(sk.cast()) };
    if !ok {
        return xdp_action::XDP_DROP;
    }
    // SAFETY: BPF helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if SYN_VERIFIED.insert(src, &now, 0).is_ok() {
        sc.sources_verified += 1;
        mark_seen(src);
    }
    SYN_POLICE
}

/// Whether `src`'s bit of the verified-sources filter is set (maybe
/// verified; clear: never verified).
#[inline(always)]
fn seen(src: &[u8; 16]) -> bool {
    let (w, bit) = syn::seen_bit(src);
    // Out of range cannot happen (the word is below SEEN_WORDS): then the
    // exact set decides.
    SYN_SEEN.get(w).is_none_or(|v| v & bit != 0)
}

/// Sets `src`'s bit of the filter (an atomic OR: other CPUs set bits of
/// the same word).
#[inline(always)]
fn mark_seen(src: &[u8; 16]) {
    let (w, bit) = syn::seen_bit(src);
    if let Some(p) = SYN_SEEN.get_ptr_mut(w) {
        // SAFETY: a live array value, changed only by atomic operations.
        unsafe { atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(p, bit) };
    }
}
