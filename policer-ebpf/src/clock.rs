//! The clock (policer_common::clock): the time read at most once per
//! frame, and only when a verdict needs it; between readings, the jiffies
//! bound it to a window that decides most refusals without a read. Under
//! the test clock (`TEST_CLOCK`), the time is `CLOCK`'s, or the one a test
//! run gives in the frame's metadata.

use aya_ebpf::{
    helpers::{bpf_jiffies64, bpf_ktime_get_ns},
    programs::XdpContext,
};
use policer_common::{
    ClockWindow, CpuScratch, Rule,
    verdict::{self, Verdict},
};

use crate::maps::{CLOCK, CPU_SCRATCH, TEST_CLOCK, TICK_NS};

/// The time, read at most once per frame and only when a verdict needs it.
pub(crate) struct Clock {
    pub(crate) scratch: *mut CpuScratch,
    jiffies: u64,
    /// Where the time is known to lie without reading the clock.
    window: Option<ClockWindow>,
    now: Option<u64>,
}

impl Clock {
    #[inline(always)]
    pub(crate) fn new(ctx: &XdpContext) -> Clock {
        let scratch = CPU_SCRATCH.get_ptr_mut(0).unwrap_or(core::ptr::null_mut());
        // SAFETY: plain statics the loader may rewrite before load.
        let (test, tick) = unsafe { (core::ptr::read_volatile(&TEST_CLOCK) != 0, core::ptr::read_volatile(&TICK_NS)) };
        let jiffies = if test {
            // A time in the frame's metadata (`policer replay`) is the
            // clock from this frame on, as if written into `CLOCK`.
            let meta_now = test_meta_now(ctx);
            if meta_now != 0
                && let Some(t) = CLOCK.get_ptr_mut(0)
            {
                // SAFETY: an array slot; tests run one frame at a time.
                unsafe { *t = meta_now };
            }
            CLOCK.get(1).copied().unwrap_or(0)
        } else {
            // SAFETY: BPF helper with no preconditions (inlined by the verifier).
            unsafe { bpf_jiffies64() }
        };
        let window = if scratch.is_null() || (test && jiffies == 0) {
            None
        } else {
            // SAFETY: this CPU's slot; only this CPU touches it while we run.
            unsafe { (*scratch).window(jiffies, tick) }
        };
        Clock { scratch, jiffies, window, now: None }
    }

    /// Whether `rule` refuses the frame at every instant the time can be,
    /// so it can be dropped without reading the clock.
    #[inline(always)]
    pub(crate) fn refuses(&self, rule: &Rule, tat: u64, len: u32) -> bool {
        match self.window {
            Some(w) if self.now.is_none() => rule.refuses_within(tat, w.lo, w.hi, len),
            _ => false,
        }
    }

    /// The time, or the upper end of the window it is known to lie in
    /// (no clock read), for decisions a few ticks cannot change.
    #[inline(always)]
    pub(crate) fn approx(&mut self) -> u64 {
        match self.window {
            Some(w) if self.now.is_none() => w.hi,
            _ => self.now(),
        }
    }

    /// Whether to count this drop (one in 2^`shift`, at random).
    #[inline(always)]
    pub(crate) fn sample(&mut self, shift: u32) -> bool {
        if shift == 0 || self.scratch.is_null() {
            return true;
        }
        // SAFETY: as in `new`.
        let r = unsafe { (*self.scratch).next_random() };
        r & ((1u64 << (shift & 31)) - 1) == 0
    }

    #[inline(always)]
    pub(crate) fn now(&mut self) -> u64 {
        if let Some(now) = self.now {
            return now;
        }
        // SAFETY: a read of a plain static the loader may rewrite before load.
        let now = if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } != 0 {
            CLOCK.get(0).copied().unwrap_or(0)
        } else {
            // SAFETY: BPF helper with no preconditions.
            unsafe { bpf_ktime_get_ns() }
        };
        if !self.scratch.is_null() {
            // SAFETY: as in `new`.
            unsafe { (*self.scratch).record(now, self.jiffies) };
        }
        self.now = Some(now);
        now
    }
}

/// Test clock only: the time a test run gives in the frame's metadata
/// (policer_common::verdict::TEST_META_LEN), 0 when it gives none.
#[inline(always)]
fn test_meta_now(ctx: &XdpContext) -> u64 {
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_NOW + 8 > ctx.data() {
        return 0;
    }
    // SAFETY: bounds checked against `data` above (metadata lies before it).
    unsafe { core::ptr::read_unaligned((meta + verdict::TEST_META_NOW) as *const u64) }
}

/// Test clock only: writes which rule slot judged the frame, and how, into
/// its metadata when the test run gave room for it.
#[inline(always)]
pub(crate) fn test_meta_report(ctx: &XdpContext, slot: u32, v: Verdict) {
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_LEN > ctx.data() {
        return;
    }
    // SAFETY: bounds checked against `data` above; XDP may write metadata.
    unsafe {
        core::ptr::write_unaligned((meta + verdict::TEST_META_SLOT) as *mut u32, slot);
        core::ptr::write_unaligned((meta + verdict::TEST_META_VERDICT) as *mut u32, verdict::test_meta_code(v));
    }
}
