//! The hand-off to the chain (policer_common::chain): a frame the verdict
//! passed goes to the first filled slot of `CHAIN`, as Katran's root hands
//! frames on. Only the passing verdicts reach it: the drop path is not
//! one instruction longer.

use aya_ebpf::{
    bindings::{xdp_action, xdp_md},
    programs::XdpContext,
};
use policer_common::MAX_IFACE_SLOTS;

use crate::maps::{CHAIN, CHAIN_COUNTERS};

/// Hands the frame on, counting it first (a tail call that succeeds does
/// not return): handed, or passed because every slot is empty.
///
/// A function of its own (a BPF-to-BPF call) so that its stack (the
/// counter's key) is not added to the attached entry's frame, under the
/// policer's own deep call chain: the verifier allows 512 bytes for the
/// deepest chain, which the policer's code nearly fills.
#[inline(never)]
pub(crate) fn hand_to_chain(md: *mut xdp_md) -> u32 {
    let ctx = &XdpContext::new(md);
    // SAFETY: reading the ingress ifindex from the context.
    let slot = unsafe { (*ctx.ctx).ingress_ifindex } % MAX_IFACE_SLOTS;
    let c = CHAIN_COUNTERS.get_ptr_mut(slot);
    if let Some(c) = c {
        // SAFETY: per-CPU slot, only this CPU writes it while we run.
        unsafe { (*c).handed_pkts += 1 };
    }
    // One call per slot with a constant index: the JIT patches each into
    // a direct jump (or a fall-through while the slot is empty), so an
    // empty chain costs a few instructions. A call that returns found its
    // slot empty.
    // SAFETY: tail calls from this program's own context.
    unsafe {
        CHAIN.tail_call(ctx, 0);
        CHAIN.tail_call(ctx, 1);
        CHAIN.tail_call(ctx, 2);
        CHAIN.tail_call(ctx, 3);
        CHAIN.tail_call(ctx, 4);
        CHAIN.tail_call(ctx, 5);
        CHAIN.tail_call(ctx, 6);
        CHAIN.tail_call(ctx, 7);
    }
    if let Some(c) = c {
        // SAFETY: as above; the frame was counted as handed, and was not.
        unsafe {
            (*c).handed_pkts -= 1;
            (*c).empty_pkts += 1;
        }
    }
    xdp_action::XDP_PASS
}
