//! Knowing the time well enough without reading the clock.
//!
//! `bpf_ktime_get_ns` is a helper call the verifier does not inline; on a
//! VM with retpolines and return thunks it costs 25-45 ns, a third of the
//! program. `bpf_jiffies64` is inlined (one load). So each CPU remembers
//! its last clock reading and the jiffies it saw just before; from the
//! jiffies now, the time lies in a [`ClockWindow`]. A frame whose bucket
//! refuses it at *every* instant of that window is dropped without reading
//! the clock ([`crate::Rule::refuses_within`]): the verdict is the one the
//! clock would have given. Everything else (admissions, new buckets, rule
//! changes) reads the clock, so nothing is ever admitted on an estimate.
//!
//! The window assumes jiffies count ticks of `tick_ns` and lag the clock
//! by at most [`LAG_TICKS`] ticks. Should jiffies lag more (a long stall of
//! the CPU that keeps time), the window ends too early and a frame can be
//! dropped that the clock would have admitted one tick later; the bucket
//! is not charged, so its budget goes to the next frame. It never admits
//! more.

/// Nanoseconds per second.
pub const NS_PER_SEC: u64 = 1_000_000_000;
/// Ticks of lag allowed between jiffies and the clock.
pub const LAG_TICKS: u64 = 2;
/// Widest window used; longer since the last reading, the clock is read.
pub const MAX_WINDOW_NS: u64 = 1_000_000_000;
/// Ticks since the last reading beyond which the clock is read (bounds the
/// multiplication; with any tick ≥ 4 ms this is past [`MAX_WINDOW_NS`]).
pub const MAX_WINDOW_TICKS: u64 = 256;
/// Longest tick accepted from the loader (HZ = 10).
pub const MAX_TICK_NS: u64 = 100_000_000;

/// Per-CPU scratch of the XDP program (not shared with user space beyond
/// its layout).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuScratch {
    /// Sequence for the bench-only source variation.
    pub bench_seq: u64,
    /// This CPU's last clock reading (0: none yet).
    pub clock_ns: u64,
    /// Jiffies read before that clock reading.
    pub clock_jiffies: u64,
    /// State of this CPU's xorshift, for sampling drops (0: not seeded).
    pub rng: u64,
    /// A word the program writes and reads back so the verifier sees a
    /// value it cannot know (see `launder` in the program).
    pub opaque: u64,
    /// The key and value of a ban being looked up or started (see
    /// [`crate::ban`]): here rather than on the program's stack, which is
    /// nearly full.
    pub ban_key: crate::BucketKeyV6,
    pub ban: crate::Ban,
}

/// An interval the clock is known to lie in, in ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockWindow {
    pub lo: u64,
    pub hi: u64,
}

impl CpuScratch {
    /// Where the clock is now, given the jiffies read now and the length of
    /// a tick; `None` when there is no usable reading (none yet, ticks
    /// unknown, or too long ago).
    #[inline(always)]
    pub fn window(&self, jiffies: u64, tick_ns: u64) -> Option<ClockWindow> {
        if self.clock_ns == 0 || tick_ns == 0 || tick_ns > MAX_TICK_NS {
            return None;
        }
        let ticks = jiffies.wrapping_sub(self.clock_jiffies);
        if ticks > MAX_WINDOW_TICKS {
            return None;
        }
        // Jiffies read before the reading: at most `ticks + 1` whole ticks
        // have passed since, plus the lag allowed.
        let span = (ticks + 1 + LAG_TICKS) * tick_ns;
        if span > MAX_WINDOW_NS {
            return None;
        }
        Some(ClockWindow { lo: self.clock_ns, hi: self.clock_ns.checked_add(span)? })
    }

    /// The next pseudo-random number of this CPU (xorshift64; never 0).
    #[inline(always)]
    pub fn next_random(&mut self) -> u64 {
        let mut x = if self.rng == 0 { 0x9e37_79b9_7f4a_7c15 ^ self.clock_ns } else { self.rng };
        if x == 0 {
            x = 0x9e37_79b9_7f4a_7c15;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }

    /// Remembers a clock reading and the jiffies read before it.
    #[inline(always)]
    pub fn record(&mut self, now_ns: u64, jiffies: u64) {
        self.clock_ns = now_ns;
        self.clock_jiffies = jiffies;
    }

    /// A time no later than now for what a tick or two cannot change (the
    /// SYN path's reflection cap and the SYN-ACK's timestamp): this CPU's
    /// last reading while the jiffies have moved at most one tick since
    /// the jiffies read before it (so it is at most about two ticks old);
    /// `None`: read the clock (and [`CpuScratch::record`] it).
    #[inline(always)]
    pub fn recent(&self, jiffies: u64, tick_ns: u64) -> Option<u64> {
        if self.clock_ns == 0 || tick_ns == 0 || tick_ns > MAX_TICK_NS {
            return None;
        }
        if jiffies.wrapping_sub(self.clock_jiffies) > 1 {
            return None;
        }
        Some(self.clock_ns)
    }
}

/// The length of a tick for a kernel built with `CONFIG_HZ=hz`.
pub const fn tick_ns(hz: u64) -> u64 {
    if hz == 0 { 0 } else { NS_PER_SEC.div_ceil(hz) }
}

#[cfg(test)]
mod tests;
