//! `policer capture` on the packet path (policer_common::capture). While
//! no capture runs, its whole cost is the read of `CAPTURE_ON` in
//! `frame::verdict`. While one runs, a frame whose verdict some lane wants
//! and that passes the first sampling step goes by a tail call to the
//! capture program (`policer_capture`, in `entries`), which runs each
//! lane's filter, source prefix, sampling and rate bound, and puts the
//! frame's head in the ring once for all the lanes that took it.

use aya_ebpf::{
    helpers::{bpf_get_prandom_u32, bpf_ktime_get_ns, generated::bpf_xdp_load_bytes},
    programs::XdpContext,
};
use network_types::eth::EthHdr;
use policer_common::{
    capture::{self, CaptureCounters, CaptureRecord, CaptureScratch, MAX_CAPTURES, SNAP_BYTES},
    wire::{ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, MAX_VLAN_TAGS, VLAN_HLEN},
};

use crate::{
    buckets::{CAS_ROUNDS, cas},
    maps::{
        CAPTURE_COUNTERS, CAPTURE_LANES, CAPTURE_PROG, CAPTURE_RING, CAPTURE_RULES, CAPTURE_SCRATCH, CLOCK,
        CPU_SCRATCH, TEST_CLOCK,
    },
    parse::ptr_at,
};

/// With a capture running: a frame whose verdict some capture wants goes
/// to the capture program by a tail call, which does not come back (that
/// program ends with this verdict's action). When the call fails (the
/// array empty: the daemon that filled it is gone) this returns and the
/// caller returns the verdict itself.
#[inline(always)]
pub(crate) fn hand_to_capture(ctx: &XdpContext, on: u64, verdict: u32, slot: u32) {
    if !capture::wanted(on, verdict) {
        return;
    }
    // The first sampling step: a frame no lane could sample costs one
    // random number (this CPU's xorshift: no helper call), not the tail
    // call.
    if capture::least_sample(on) > 1 {
        let random = match CPU_SCRATCH.get_ptr_mut(0) {
            // SAFETY: this CPU's slot; only this CPU touches it while we run.
            Some(s) => unsafe { (*s).next_random() },
            None => 0,
        };
        if !capture::presampled(on, (random >> 32) as u32) {
            return;
        }
    }
    let Some(sc) = CAPTURE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot: an XDP program and the program it tail-calls
    // run on one CPU without preemption, so nobody else touches it between.
    unsafe {
        (*sc).verdict = verdict;
        (*sc).slot = slot;
        CAPTURE_PROG.tail_call(ctx, 0);
    }
}

/// The program's clock (the test clock under tests), for captured frames.
#[inline(always)]
fn capture_now() -> u64 {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } != 0 {
        CLOCK.get(0).copied().unwrap_or(0)
    } else {
        // SAFETY: BPF helper with no preconditions.
        unsafe { bpf_ktime_get_ns() }
    }
}

/// The frame's source, read again from the frame (only for a lane with a
/// source filter) into `addr` (IPv4 in the first 4 bytes): its family, 0
/// when not IP.
#[inline(always)]
fn capture_source(ctx: &XdpContext, addr: *mut [u8; 16]) -> u32 {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return 0;
    };
    // SAFETY: bounds checked by ptr_at.
    let mut proto = u16::from_be(unsafe { (*eth).ether_type });
    let mut off = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let Some(inner) = ptr_at::<[u8; 2]>(ctx, off + VLAN_HLEN - 2) else {
            return 0;
        };
        // SAFETY: bounds checked by ptr_at.
        proto = u16::from_be_bytes(unsafe { *inner });
        off += VLAN_HLEN;
    }
    // SAFETY (the copies): bounds checked by ptr_at; `addr` is the
    // scratch's, 16 bytes.
    if proto == ETH_P_IP {
        if let Some(a) = ptr_at::<u32>(ctx, off + 12) {
            unsafe {
                let w = addr as *mut u32;
                w.write_unaligned(core::ptr::read_unaligned(a));
                w.add(1).write_unaligned(0);
                w.add(2).write_unaligned(0);
                w.add(3).write_unaligned(0);
            }
            return policer_common::FAMILY_V4;
        }
    } else if proto == ETH_P_IPV6
        && let Some(a) = ptr_at::<[u32; 4]>(ctx, off + 8)
    {
        unsafe {
            let w = addr as *mut u32;
            let a = a as *const u32;
            for k in 0..4 {
                w.add(k).write_unaligned(core::ptr::read_unaligned(a.add(k)));
            }
        }
        return policer_common::FAMILY_V6;
    }
    0
}

/// Hands a judged frame to the captures that take it (policer_common::
/// capture: filter, sampling, the rate bound under compare-and-swap), as
/// one ring record carrying the mask of those lanes.
#[inline(always)]
pub(crate) fn capture(
    ctx: &XdpContext,
    sc: *mut CaptureScratch,
    on: u32,
    least: u32,
    verdict: u32,
    slot: u32,
    len: u32,
) {
    // SAFETY: this CPU's slot; only this CPU touches it while we run.
    unsafe {
        (*sc).now_ns = 0;
        (*sc).have_src = 0;
        (*sc).took = 0;
    }
    let rule_lanes = match CAPTURE_RULES.get_ptr(slot) {
        // SAFETY: a live map value.
        Some(r) => unsafe { core::ptr::read_volatile(r) },
        None => 0,
    };
    // The lanes' random number: the kernel's, a stream apart from the
    // xorshift the first sampling step drew from.
    // SAFETY: BPF helper with no preconditions.
    let random = unsafe { (u64::from(bpf_get_prandom_u32()) << 32) | u64::from(bpf_get_prandom_u32()) };
    for i in 0..MAX_CAPTURES as u32 {
        if on & (1 << i) != 0 {
            capture_lane(ctx, sc, i, least, verdict, rule_lanes, random);
        }
    }
    // SAFETY: as above.
    let took = unsafe { core::ptr::read_volatile(&(*sc).took) };
    if took == 0 {
        return;
    }
    let Some(mut entry) = CAPTURE_RING.reserve_untyped::<CaptureRecord>(0) else {
        count_lanes(took, |cc| cc.ring_full += 1);
        return;
    };
    let caplen = if len as usize > SNAP_BYTES { SNAP_BYTES as u32 } else { len };
    let rec = entry.as_mut_ptr();
    // SAFETY: the reservation is ours until submitted; the frame's bytes go
    // straight into it (the helper checks the offset and length against
    // the frame, the verifier the length against the buffer).
    let copied = unsafe {
        // Field by field, straight into the ring: no copy on the stack.
        let h = &raw mut (*rec).header;
        (*h).time_ns = core::ptr::read_volatile(&(*sc).now_ns);
        (*h).len = len;
        (*h).caplen = caplen;
        (*h).ifindex = (*ctx.ctx).ingress_ifindex;
        (*h).rule_slot = slot;
        (*h).verdict = verdict;
        (*h).lanes = took;
        // Read back and bounded as the verifier tracks it (an AND, then
        // +1: 1 ..= SNAP_BYTES), whatever the compiler kept of the min.
        let n = core::ptr::read_volatile(&raw const (*rec).header.caplen);
        n != 0
            && bpf_xdp_load_bytes(
                ctx.ctx,
                0,
                (&raw mut (*rec).data) as *mut core::ffi::c_void,
                ((n - 1) & (SNAP_BYTES as u32 - 1)) + 1,
            ) == 0
    };
    if !copied {
        entry.discard(0);
        return;
    }
    entry.submit(0);
    count_lanes(took, |cc| cc.captured += 1);
}

/// Whether lane `i` takes the frame: its filter, its source prefix, its
/// sampling, then its rate bound (compare-and-swap); a taken frame sets
/// the lane's bit in the scratch's `took`.
#[inline(always)]
fn capture_lane(
    ctx: &XdpContext,
    sc: *mut CaptureScratch,
    i: u32,
    least: u32,
    verdict: u32,
    rule_lanes: u32,
    random: u64,
) {
    let Some(lane) = CAPTURE_LANES.get_ptr_mut(i) else {
        return;
    };
    // SAFETY: a live map value; only `tat_ns` changes while a lane is in
    // use, and only by compare-and-swap.
    let l = unsafe { &*lane };
    if !capture::filter_takes(l, i, verdict, rule_lanes) {
        return;
    }
    // SAFETY (the scratch): this CPU's slot, as in `capture`.
    if l.src_family != 0 {
        unsafe {
            if core::ptr::read_volatile(&(*sc).have_src) == 0 {
                (*sc).family = capture_source(ctx, &raw mut (*sc).src);
                (*sc).have_src = 1;
            }
            let family = core::ptr::read_volatile(&(*sc).family);
            if !capture::source_matches(l, family, &(*sc).src) {
                return;
            }
        }
    }
    if !capture::sampled(l.sample_every, least, random, i) {
        return;
    }
    let Some(cc) = CAPTURE_COUNTERS.get_ptr_mut(i) else {
        return;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    let cc = unsafe { &mut *cc };
    cc.matched += 1;
    // SAFETY: the scratch, as above.
    let now = unsafe {
        let mut now = core::ptr::read_volatile(&(*sc).now_ns);
        if now == 0 {
            now = capture_now();
            (*sc).now_ns = now;
        }
        now
    };
    // SAFETY: a live map value, changed by other CPUs only by CAS.
    let tat_ptr = unsafe { &raw mut (*lane).tat_ns };
    // SAFETY: as above.
    let mut old = unsafe { core::ptr::read_volatile(tat_ptr) };
    for _ in 0..CAS_ROUNDS {
        let Some(new) = capture::admit(old, now, l.interval_ns, l.tolerance_ns) else {
            break;
        };
        // SAFETY: as above.
        let seen = unsafe { cas(tat_ptr, old, new) };
        if seen == old {
            // SAFETY: the scratch, as above.
            unsafe { (*sc).took |= 1 << i };
            return;
        }
        old = seen;
    }
    // Over the bound, or every round lost to CPUs that took it.
    cc.rate_bounded += 1;
}

/// Applies `f` to the counters of each lane in `lanes`.
#[inline(always)]
fn count_lanes(lanes: u32, f: impl Fn(&mut CaptureCounters)) {
    for i in 0..MAX_CAPTURES as u32 {
        if lanes & (1 << i) != 0
            && let Some(cc) = CAPTURE_COUNTERS.get_ptr_mut(i)
        {
            // SAFETY: per-CPU slot, only this CPU writes it while we run.
            f(unsafe { &mut *cc });
        }
    }
}
