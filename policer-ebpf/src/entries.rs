//! The object's three entries (see the crate doc): `policer`, the program
//! the daemon attaches; `policer_replay`, `policer replay`'s batch entry;
//! `policer_capture`, reached only by the policer's tail call while a
//! capture runs. Each is a few lines around the code of its module.

use aya_ebpf::{
    bindings::{xdp_action, xdp_md},
    macros::xdp,
    programs::XdpContext,
};
use policer_common::{
    capture::{CAPTURE_DROPPED, ON_LANES, least_sample},
    syn::{SYN_PATH, SYN_POLICE},
};

use crate::{
    capture::capture,
    chain::hand_to_chain,
    frame::try_policer,
    maps::{CAPTURE_ON, CAPTURE_SCRATCH, REPLAY_PROG, SYN_PROG, TEST_CLOCK},
    replay::{replay_finish, replay_prepare},
    syn::{handed_back, syn_path},
};

/// The attached program: each frame the interface receives. What the
/// verdict passes goes on to the chain (`chain`); a drop ends here.
#[xdp]
pub fn policer(ctx: XdpContext) -> u32 {
    let mut action = judge_frame::<true>(ctx.ctx);
    if action & SYN_PATH != 0 {
        // A frame of a rule with SYN cookies (crate::syn), its slot in the
        // answer: answered there, or policed as without cookies by the
        // same code without the SYN path (`policer_syn_police`, a tail
        // call: calling the policer's code a second time here would double
        // what the verifier walks).
        action = syn_path(ctx.ctx, action & !SYN_PATH);
        if action == SYN_POLICE {
            // SAFETY: a tail call from this program's own context.
            unsafe { SYN_PROG.tail_call(&ctx, 0) };
            // No program in the array (the daemon gone without a pin):
            // the kernel has the frame, as without the policer.
            action = xdp_action::XDP_PASS;
        }
    }
    if action == xdp_action::XDP_PASS { hand_to_chain(&ctx) } else { action }
}

/// The attached program's code without the SYN path: what polices a frame
/// the SYN path handed back. Never attached: reached only by the tail
/// call above (`SYN_PROG`).
#[xdp]
pub fn policer_syn_police(ctx: XdpContext) -> u32 {
    let action = judge_frame::<false>(ctx.ctx);
    // The frame was counted (its class, a fragment) before the SYN path.
    handed_back(ctx.ctx);
    if action == xdp_action::XDP_PASS { hand_to_chain(&ctx) } else { action }
}

/// The policer's code on a frame: the attached program's body (`SYN`: with
/// the SYN path's hand-over), and what `policer_replay` runs for each frame
/// of a batch.
#[inline(never)]
fn judge_frame<const SYN: bool>(md: *mut xdp_md) -> u32 {
    try_policer::<SYN>(&XdpContext::new(md))
}

/// `policer replay`'s batch entry (policer_common::replay): run with a
/// test run's `repeat`, each run makes the test frame the batch's next
/// frame and judges it with the code above. Test clock only (the product
/// never loads it; without the test clock it does nothing).
#[xdp]
pub fn policer_replay(ctx: XdpContext) -> u32 {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } == 0 {
        return xdp_action::XDP_ABORTED;
    }
    // Each step is a function of its own and this one keeps only
    // registers, so that the policer's code has as much of the stack as in
    // the attached program (the verifier allows 512 bytes for the deepest
    // chain of calls), and is the attached program's own function.
    let i = replay_prepare(ctx.ctx);
    if i < 0 {
        return xdp_action::XDP_ABORTED;
    }
    // SYN cookies are not replayed: their rules' frames are policed as
    // without them (docs/syn-cookies.md).
    let ret = judge_frame::<false>(ctx.ctx);
    replay_finish(ctx.ctx, i as u32, ret);
    // The next frame, in the same test run: a tail call starts afresh
    // (stack and all); after the kernel's limit (33 in a row) it fails
    // and the run ends here.
    // SAFETY: a tail call from this program's own context.
    unsafe { REPLAY_PROG.tail_call(&ctx, 0) };
    ret
}

/// The capture program: the lanes for the frame the policer's verdict
/// handed over (verdict and slot in the CPU's scratch), then that
/// verdict's action. Never attached: reached only by the tail call.
#[xdp]
pub fn policer_capture(ctx: XdpContext) -> u32 {
    let Some(sc) = CAPTURE_SCRATCH.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's slot, written by the policer's program just
    // before the tail call (see `capture::hand_to_capture`).
    let (verdict, slot) = unsafe { (core::ptr::read_volatile(&(*sc).verdict), core::ptr::read_volatile(&(*sc).slot)) };
    // SAFETY: as in `frame::verdict`.
    let on = unsafe { core::ptr::read_volatile(&raw const CAPTURE_ON) };
    let lanes = on as u32 & ON_LANES;
    if lanes != 0 {
        let len = (ctx.data_end() - ctx.data()) as u32;
        capture(&ctx, sc, lanes, least_sample(on), verdict, slot, len);
    }
    // Reached by a tail call from the policer's code (`judge_frame`, a
    // BPF-to-BPF callee of the attached entry): this verdict returns into
    // the entry as `judge_frame`'s, and the entry hands a pass to the
    // chain. Handing it on here too would chain it twice.
    if verdict == CAPTURE_DROPPED { xdp_action::XDP_DROP } else { xdp_action::XDP_PASS }
}
