//! `policer replay`'s side of the object (policer_common::replay): before
//! each frame of a batch, make the test run's frame that frame (its bytes,
//! its length, its time in the metadata); after the policer's code judged
//! it, write back what it made of it. The entry, `policer_replay`, is in
//! `entries`.

use aya_ebpf::{
    bindings::xdp_md,
    helpers::generated::{bpf_xdp_adjust_tail, bpf_xdp_store_bytes},
    programs::XdpContext,
};
use policer_common::{
    replay::{REPLAY_HEAD, REPLAY_MIN_LEN},
    verdict,
};

use crate::maps::{REPLAY_CTL, REPLAY_FRAMES};

/// Makes the test run's frame the batch's next frame (its length, its
/// head, its time in the metadata); the frame's index, -1 past the
/// batch's end or when the frame cannot be made (a scalar: an `Option`
/// would come back through the caller's stack).
#[inline(never)]
pub(crate) fn replay_prepare(md: *mut xdp_md) -> i64 {
    replay_make(md).map_or(-1, i64::from)
}

#[inline(always)]
fn replay_make(md: *mut xdp_md) -> Option<u32> {
    let ctx = XdpContext::new(md);
    let ctl = REPLAY_CTL.get_ptr_mut(0)?;
    // SAFETY: the map's one entry; a test run runs on one CPU, and replay
    // writes it only between runs.
    let ctl = unsafe { &mut *ctl };
    let i = ctl.next;
    if i >= ctl.count {
        return None;
    }
    ctl.next = i + 1;
    let f = REPLAY_FRAMES.get_ptr_mut(i)?;
    // SAFETY: an entry of the batch, written by replay before the run.
    let f = unsafe { &mut *f };
    let len = f.len;
    if len < REPLAY_MIN_LEN {
        return None;
    }
    // The head is copied whole (a constant size, as the verifier wants it):
    // the frame is made at least that long for the copy, then cut to its
    // length.
    let copy_len = if (len as usize) < REPLAY_HEAD { REPLAY_HEAD as u32 } else { len };
    let delta = copy_len as i64 - (ctx.data_end() - ctx.data()) as i64;
    // SAFETY: helpers on this program's own context; packet pointers are
    // read again from the context after them.
    unsafe {
        if delta != 0 && bpf_xdp_adjust_tail(md, delta as i32) != 0 {
            return None;
        }
        if bpf_xdp_store_bytes(md, 0, f.head.as_mut_ptr().cast(), REPLAY_HEAD as u32) != 0 {
            return None;
        }
        if copy_len != len && bpf_xdp_adjust_tail(md, len as i32 - copy_len as i32) != 0 {
            return None;
        }
    }
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_LEN > ctx.data() {
        return None;
    }
    // SAFETY: bounds checked against `data` above; XDP may write metadata.
    unsafe {
        core::ptr::write_unaligned((meta + verdict::TEST_META_NOW) as *mut u64, f.now);
        core::ptr::write_unaligned((meta + verdict::TEST_META_SLOT) as *mut u32, u32::MAX);
        core::ptr::write_unaligned((meta + verdict::TEST_META_VERDICT) as *mut u32, u32::MAX);
    }
    Some(i)
}

/// Writes what the policer's code made of frame `i` back into its record.
#[inline(never)]
pub(crate) fn replay_finish(md: *mut xdp_md, i: u32, ret: u32) {
    let ctx = XdpContext::new(md);
    let Some(f) = REPLAY_FRAMES.get_ptr_mut(i) else {
        return;
    };
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_LEN > ctx.data() {
        return;
    }
    // SAFETY: bounds checked against `data` above; `f` an entry of the batch.
    unsafe {
        (*f).slot = core::ptr::read_unaligned((meta + verdict::TEST_META_SLOT) as *const u32);
        (*f).verdict = core::ptr::read_unaligned((meta + verdict::TEST_META_VERDICT) as *const u32);
        (*f).ret = ret;
    }
}
