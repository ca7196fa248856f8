//! The hand-off to the chain (policer_common::chain): a frame the verdict
//! passed goes to the first filled slot of its interface's chain (through
//! that interface's dispatcher in `CHAINS`), or, as a member of another
//! root, of that root's `CHAIN`, as Katran's root hands frames on. Only the passing verdicts reach it: the drop path is not
//! one instruction longer.

use aya_ebpf::{
    bindings::{xdp_action, xdp_md},
    programs::XdpContext,
};
use policer_common::MAX_IFACE_SLOTS;

use crate::maps::{CHAIN, CHAIN_COUNTERS, CHAIN_FROM, CHAINS};

/// Hands the frame on, counting it first (a tail call that succeeds does
/// not return): handed, or passed because every slot is empty.
///
/// Inlined into the program's entry: the tail calls must be made from the
/// entry itself, for the chain's verdict to be the program's. (From a
/// BPF-to-BPF callee the target returns into the caller, and the compiler,
/// seeing a callee that always returns XDP_PASS, would use that constant.)
/// The counting is in callees of their own (`count`), so that the
/// counter's key is not on the entry's stack, under the policer's own
/// deep call chain (the verifier allows 512 bytes for the deepest one).
#[inline(always)]
pub(crate) fn hand_to_chain(ctx: &XdpContext) -> u32 {
    count(ctx.ctx, HANDED);
    // `CHAIN_FROM` is a constant of the load (read-only data): the
    // verifier drops the branch not taken, and the calls before it.
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let from = unsafe { core::ptr::read_volatile(&CHAIN_FROM) };
    if from == 0 {
        // On the hook: the interface's own chain, through its dispatcher
        // in `CHAINS` (policer_common::chain::MAP_CHAINS), which tail-calls
        // the chain's slots and counts a frame that found them all empty.
        // An empty entry (no dispatcher: a program loaded without the
        // daemon) returns here.
        // SAFETY: reading the ingress ifindex from the context; a tail
        // call from the entry's own context.
        unsafe {
            let at = (*ctx.ctx).ingress_ifindex % MAX_IFACE_SLOTS;
            let _ = CHAINS.tail_call(ctx, at);
        }
    } else {
        // A member, in slot `from - 1` of another root's array (`CHAIN`):
        // the slots behind its own. One call per slot with a constant
        // index: the JIT patches each into a direct jump (or a
        // fall-through while the slot is empty). A call that returns found
        // its slot empty.
        // SAFETY: tail calls from the entry's own context.
        unsafe {
            if from <= 1 {
                let _ = CHAIN.tail_call(ctx, 1);
            }
            if from <= 2 {
                let _ = CHAIN.tail_call(ctx, 2);
            }
            if from <= 3 {
                let _ = CHAIN.tail_call(ctx, 3);
            }
            if from <= 4 {
                let _ = CHAIN.tail_call(ctx, 4);
            }
            if from <= 5 {
                let _ = CHAIN.tail_call(ctx, 5);
            }
            if from <= 6 {
                let _ = CHAIN.tail_call(ctx, 6);
            }
            if from <= 7 {
                let _ = CHAIN.tail_call(ctx, 7);
            }
        }
    }
    count(ctx.ctx, EMPTY);
    xdp_action::XDP_PASS
}

/// A frame handed on.
const HANDED: u32 = 0;
/// A frame counted as handed that found every slot empty.
const EMPTY: u32 = 1;

/// Counts a frame of the interface `md` came on: handed, or moved from
/// handed to passed with the chain empty.
#[inline(never)]
fn count(md: *mut xdp_md, what: u32) {
    // SAFETY: reading the ingress ifindex from the context.
    let slot = unsafe { (*md).ingress_ifindex } % MAX_IFACE_SLOTS;
    let Some(c) = CHAIN_COUNTERS.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    unsafe {
        if what == HANDED {
            (*c).handed_pkts += 1;
        } else {
            (*c).handed_pkts -= 1;
            (*c).empty_pkts += 1;
        }
    }
}
