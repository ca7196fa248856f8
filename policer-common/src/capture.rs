//! `policer capture`: which judged frames the program hands to the daemon
//! through a ring buffer, and how fast. One definition for the program
//! (which only loads, compares-and-swaps and copies) and for the daemon and
//! the host tests.
//!
//! A capture is a *lane* ([`CaptureLane`], one of [`MAX_CAPTURES`]): its
//! filter (verdicts, rules, source prefix), its sampling (one frame in N)
//! and its rate bound (P frames per second with a burst, a GCRA charged
//! under compare-and-swap, so all CPUs together never exceed it). The
//! policer's program reads one word per judged frame ([`MAP_CAPTURE_ON`]:
//! the lanes in use and the verdicts they want); 0, the branch not taken,
//! is the whole cost of capture when none runs. A frame some capture wants
//! goes by a tail call to the capture program ([`CAPTURE_PROGRAM`]), which
//! runs the lanes and returns the verdict's action. A frame that some lane
//! takes is written to the ring once, with the mask of the lanes that took
//! it ([`CaptureRecord`]); the daemon hands it to each of those captures.
//!
//! What "exact" means with several captures: each lane is bounded on its
//! own, in the kernel, so each capture gets at most its own P per second
//! plus its burst; the ring carries at most the sum of the lanes' bounds.

use crate::verdict::Verdict;

/// The captures in use: `Array<u64>`, one entry ([`on_word`]: the mask of
/// the lanes in use, above it the verdicts some lane wants, and in the high
/// half the smallest `sample_every` of those lanes). 0: no capture runs
/// (the one word the program reads per judged frame).
///
/// It is the program's `.bss` section (the program's one zero-initialised
/// global, `CAPTURE_ON`), which the loader makes an `Array<u64>` of one
/// entry: a map by that name, so the daemon writes it as any other, while
/// the program reads it with one load (no lookup).
pub const MAP_CAPTURE_ON: &str = ".bss";
/// `ProgramArray`, one entry: the capture program ([`CAPTURE_PROGRAM`]),
/// reached by a tail call from the policer's verdict.
pub const MAP_CAPTURE_PROG: &str = "CAPTURE_PROG";
/// The XDP program that runs the lanes, loaded beside the policer's and
/// put in [`MAP_CAPTURE_PROG`]: a tail call gives it a stack of its own (the
/// policer's frame leaves too little of the 512 bytes for the lanes).
pub const CAPTURE_PROGRAM: &str = "policer_capture";
/// Where the verdict bits start in the [`MAP_CAPTURE_ON`] word.
pub const ON_VERDICT_SHIFT: u32 = 8;
/// The lanes' bits of the [`MAP_CAPTURE_ON`] word.
pub const ON_LANES: u32 = (1 << MAX_CAPTURES) - 1;
/// `Array<CaptureLane>`, [`MAX_CAPTURES`] entries.
pub const MAP_CAPTURE_LANES: &str = "CAPTURE_LANES";
/// `Array<u32>` at the rules' counter slots (max_rules + 1 entries): the
/// mask of the lanes that capture that rule's frames (lanes with
/// [`CaptureLane::all_rules`] do not look).
pub const MAP_CAPTURE_RULES: &str = "CAPTURE_RULES";
/// `PerCpuArray<CaptureCounters>`, one per lane.
pub const MAP_CAPTURE_COUNTERS: &str = "CAPTURE_COUNTERS";
/// The ring buffer of [`CaptureRecord`]s.
pub const MAP_CAPTURE_RING: &str = "CAPTURE_RING";
/// Bytes of the ring: about 7 000 records, 70 ms at the largest bound.
pub const CAPTURE_RING_BYTES: u32 = 2 << 20;

/// Captures running at once (lanes).
pub const MAX_CAPTURES: usize = 8;
/// Bytes of each frame kept (the rest is counted in the original length).
pub const SNAP_BYTES: usize = 256;
/// The largest rate bound a capture may ask for, frames per second.
pub const MAX_CAPTURE_PPS: u64 = 100_000;

/// Verdict bits of [`CaptureLane::verdicts`].
pub const CAPTURE_PASSED: u32 = 1;
pub const CAPTURE_DROPPED: u32 = 2;
pub const CAPTURE_WOULD_DROP: u32 = 4;

/// One capture's filter, sampling and rate bound, as the program reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureLane {
    /// The bound's theoretical arrival time (ns, the program's clock):
    /// changed only by compare-and-swap.
    pub tat_ns: u64,
    /// 1e9 / P: the time one frame costs.
    pub interval_ns: u64,
    /// How far ahead of now `tat_ns` may be: (burst − 1) · interval.
    pub tolerance_ns: u64,
    /// The source prefix (network order, IPv4 in the first 4 bytes),
    /// already masked, and its mask.
    pub src: [u8; 16],
    pub src_mask: [u8; 16],
    /// 0: any source; [`crate::FAMILY_V4`] or [`crate::FAMILY_V6`].
    pub src_family: u32,
    /// [`CAPTURE_PASSED`] | [`CAPTURE_DROPPED`] | [`CAPTURE_WOULD_DROP`].
    pub verdicts: u32,
    /// One frame in N is taken (1: every frame).
    pub sample_every: u32,
    /// Non-zero: frames of every rule; 0: only the rules whose
    /// [`MAP_CAPTURE_RULES`] entry has this lane's bit.
    pub all_rules: u32,
}

/// A lane's counts, per CPU (the daemon sums them; they only grow, so a
/// capture's share is the difference between its end and its start).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureCounters {
    /// Frames that passed the filter and the sampling.
    pub matched: u64,
    /// Of those, refused by the rate bound.
    pub rate_bounded: u64,
    /// Of those, lost because the ring was full.
    pub ring_full: u64,
    /// Written to the ring.
    pub captured: u64,
}

impl CaptureCounters {
    pub fn add(&mut self, o: &CaptureCounters) {
        self.matched += o.matched;
        self.rate_bounded += o.rate_bounded;
        self.ring_full += o.ring_full;
        self.captured += o.captured;
    }

    pub fn since(&self, before: &CaptureCounters) -> CaptureCounters {
        CaptureCounters {
            matched: self.matched.saturating_sub(before.matched),
            rate_bounded: self.rate_bounded.saturating_sub(before.rate_bounded),
            ring_full: self.ring_full.saturating_sub(before.ring_full),
            captured: self.captured.saturating_sub(before.captured),
        }
    }
}

/// Where the smallest sample of the lanes in use starts in the
/// [`MAP_CAPTURE_ON`] word ([`presampled`]).
pub const ON_SAMPLE_SHIFT: u32 = 32;

/// The [`MAP_CAPTURE_ON`] word for the lanes in use, given as (lane number,
/// its [`CaptureLane::verdicts`], its [`CaptureLane::sample_every`]): their
/// bits, the union of their verdicts above [`ON_VERDICT_SHIFT`] (a frame no
/// capture wants by its verdict costs no tail call), and the smallest of
/// their samples above [`ON_SAMPLE_SHIFT`] (a frame no capture would sample
/// costs no tail call either: [`presampled`]).
pub fn on_word(lanes: impl IntoIterator<Item = (usize, u32, u32)>) -> u64 {
    let mut w = 0u64;
    let mut least = u32::MAX;
    for (i, v, every) in lanes.into_iter().filter(|(i, _, _)| *i < MAX_CAPTURES) {
        w |= (1 << i) | (u64::from(v & 7) << ON_VERDICT_SHIFT);
        least = least.min(every.max(1));
    }
    if w == 0 { 0 } else { w | (u64::from(least) << ON_SAMPLE_SHIFT) }
}

/// Whether the program hands a frame of verdict bit `verdict` to the
/// capture program, given the [`MAP_CAPTURE_ON`] word `on` (non-zero).
#[inline(always)]
pub const fn wanted(on: u64, verdict: u32) -> bool {
    on & ((verdict as u64) << ON_VERDICT_SHIFT) != 0
}

/// The smallest `sample_every` of the lanes in use (1: some lane takes
/// every frame).
#[inline(always)]
pub const fn least_sample(on: u64) -> u32 {
    (on >> ON_SAMPLE_SHIFT) as u32
}

/// The first of two sampling steps, in the policer's program: with
/// `random` uniform over u32, true with probability 1/n (n the smallest
/// sample of the lanes in use), so that a capture of one frame in 1 000
/// costs the other 999 one random number, not a tail call. Each lane then
/// takes the frame with probability n/N ([`sampled`]): 1/N in all.
#[inline(always)]
pub const fn presampled(on: u64, random: u32) -> bool {
    let n = least_sample(on) as u64;
    n <= 1 || (random as u64 * n) >> 32 == 0
}

/// What the program carries from one lane to the next while it looks at a
/// frame, kept in a per-CPU map value (`CAPTURE_SCRATCH`) rather than in
/// registers: the verifier then sees the same state at every lane and
/// walks the loop once, not once per combination of lanes' outcomes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureScratch {
    /// The clock, read once (0: not yet).
    pub now_ns: u64,
    /// The frame's source, read once (family 0: not yet, or not IP).
    pub src: [u8; 16],
    pub family: u32,
    /// Whether `src` was read.
    pub have_src: u32,
    /// The lanes that took the frame.
    pub took: u32,
    /// Handed from the policer's program to the capture program with the
    /// tail call: the frame's verdict bit and its rule's counter slot.
    pub verdict: u32,
    pub slot: u32,
    pub _pad: u32,
}

/// The header of a ring record; [`SNAP_BYTES`] of the frame follow it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureHeader {
    /// The program's clock (CLOCK_MONOTONIC, ns) when the frame was judged.
    pub time_ns: u64,
    /// The frame's length as received, and the bytes of it that follow.
    pub len: u32,
    pub caplen: u32,
    pub ifindex: u32,
    /// The rule's counter slot (what `rule ls` names).
    pub rule_slot: u32,
    /// One of the verdict bits.
    pub verdict: u32,
    /// The lanes that took the frame.
    pub lanes: u32,
}

/// One ring record: a fixed size (a ring reservation's size is a constant
/// for the verifier).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CaptureRecord {
    pub header: CaptureHeader,
    pub data: [u8; SNAP_BYTES],
}

impl CaptureRecord {
    /// Reads a record the ring handed over (user space); `None` for a
    /// record of another size or a caplen past the snapshot.
    pub fn parse(bytes: &[u8]) -> Option<(CaptureHeader, &[u8])> {
        if bytes.len() < core::mem::size_of::<CaptureRecord>() {
            return None;
        }
        let word = |i: usize| u32::from_ne_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let mut t = [0u8; 8];
        t.copy_from_slice(&bytes[..8]);
        let h = CaptureHeader {
            time_ns: u64::from_ne_bytes(t),
            len: word(8),
            caplen: word(12),
            ifindex: word(16),
            rule_slot: word(20),
            verdict: word(24),
            lanes: word(28),
        };
        let hl = core::mem::size_of::<CaptureHeader>();
        let n = h.caplen as usize;
        if n > SNAP_BYTES {
            return None;
        }
        Some((h, &bytes[hl..hl + n]))
    }
}

/// The verdict bit of `v`.
#[inline(always)]
pub const fn verdict_bit(v: Verdict) -> u32 {
    match v {
        Verdict::Pass => CAPTURE_PASSED,
        Verdict::Drop => CAPTURE_DROPPED,
        Verdict::WouldDrop => CAPTURE_WOULD_DROP,
    }
}

/// Whether the source `src` (network order, IPv4 in the first 4 bytes) of
/// family `family` is inside the lane's prefix.
#[inline(always)]
pub fn source_matches(lane: &CaptureLane, family: u32, src: &[u8; 16]) -> bool {
    if lane.src_family == 0 {
        return true;
    }
    if lane.src_family != family {
        return false;
    }
    let mut diff = 0u8;
    let mut i = 0;
    while i < 16 {
        diff |= (src[i] & lane.src_mask[i]) ^ lane.src[i];
        i += 1;
    }
    diff == 0
}

/// Whether the lane's filter takes a frame of verdict bit `verdict`, of
/// the rule whose [`MAP_CAPTURE_RULES`] entry is `rule_lanes`, as lane
/// number `lane_no`; the source is checked apart ([`source_matches`]: it is
/// read from the frame only when a lane asks for it).
#[inline(always)]
pub fn filter_takes(lane: &CaptureLane, lane_no: u32, verdict: u32, rule_lanes: u32) -> bool {
    lane.verdicts & verdict != 0 && (lane.all_rules != 0 || rule_lanes & (1 << (lane_no & 31)) != 0)
}

/// Whether the sampling takes a frame the policer's program handed over
/// ([`presampled`] with `least`, the smallest sample of the lanes in use):
/// with probability `least / sample_every`, so 1 / `sample_every` in all.
/// `random` is this frame's random number (independent of the one
/// [`presampled`] drew), looked at differently for each lane so that two
/// lanes sample independently enough.
#[inline(always)]
pub fn sampled(sample_every: u32, least: u32, random: u64, lane_no: u32) -> bool {
    let least = if least == 0 { 1 } else { least };
    if sample_every <= least {
        return true;
    }
    let r = random.rotate_right((lane_no & 7) * 8) as u32;
    u64::from(r) * u64::from(sample_every) < u64::from(least) << 32
}

/// The rate bound: the new theoretical arrival time if a frame at `now`
/// fits, `None` when it is over the bound. A GCRA: at most
/// `burst + (t1 − t0) / interval` frames in any span [t0, t1]. A stamp far
/// in the past (idle) gives no more than the burst; a clock that goes
/// backwards never adds room.
#[inline(always)]
pub fn admit(tat_ns: u64, now_ns: u64, interval_ns: u64, tolerance_ns: u64) -> Option<u64> {
    let base = if tat_ns > now_ns { tat_ns } else { now_ns };
    if base - now_ns > tolerance_ns {
        return None;
    }
    Some(base.saturating_add(interval_ns))
}

/// The bound's burst for `pps` frames per second: a tenth of a second's
/// worth, at least 1 and at most 1 000 frames.
pub const fn burst_for(pps: u64) -> u64 {
    let b = pps / 10;
    if b < 1 {
        1
    } else if b > 1000 {
        1000
    } else {
        b
    }
}

impl CaptureLane {
    /// A lane bounded to `pps` frames per second (1 ..= [`MAX_CAPTURE_PPS`])
    /// with [`burst_for`]'s burst, taking one frame in `sample_every`.
    pub fn bounded(pps: u64, sample_every: u32) -> CaptureLane {
        let pps = pps.clamp(1, MAX_CAPTURE_PPS);
        let interval_ns = 1_000_000_000 / pps;
        CaptureLane {
            interval_ns,
            tolerance_ns: (burst_for(pps) - 1) * interval_ns,
            sample_every: sample_every.max(1),
            ..CaptureLane::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{FAMILY_V4, FAMILY_V6};

    fn lane_for(prefix: [u8; 4], len: u32) -> CaptureLane {
        let mut l = CaptureLane::bounded(1000, 1);
        l.src_family = FAMILY_V4;
        for (i, p) in prefix.iter().enumerate() {
            let bits = len.saturating_sub(i as u32 * 8).min(8);
            l.src_mask[i] = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
            l.src[i] = p & l.src_mask[i];
        }
        l
    }

    fn v4(a: [u8; 4]) -> [u8; 16] {
        let mut s = [0; 16];
        s[..4].copy_from_slice(&a);
        s
    }

    #[test]
    fn the_source_filter_is_a_prefix_of_one_family() {
        let l = lane_for([10, 1, 0, 0], 16);
        assert!(source_matches(&l, FAMILY_V4, &v4([10, 1, 200, 3])));
        assert!(!source_matches(&l, FAMILY_V4, &v4([10, 2, 0, 1])));
        assert!(!source_matches(&l, FAMILY_V6, &v4([10, 1, 0, 1])));
        let any = CaptureLane::bounded(10, 1);
        assert!(source_matches(&any, FAMILY_V6, &[0xfe; 16]));
        let host = lane_for([192, 0, 2, 7], 32);
        assert!(source_matches(&host, FAMILY_V4, &v4([192, 0, 2, 7])));
        assert!(!source_matches(&host, FAMILY_V4, &v4([192, 0, 2, 8])));
    }

    #[test]
    fn the_filter_takes_its_verdicts_and_rules() {
        let mut l = CaptureLane::bounded(10, 1);
        l.verdicts = CAPTURE_DROPPED;
        l.all_rules = 1;
        assert!(filter_takes(&l, 3, CAPTURE_DROPPED, 0));
        assert!(!filter_takes(&l, 3, CAPTURE_PASSED, 0));
        assert!(!filter_takes(&l, 3, CAPTURE_WOULD_DROP, u32::MAX));
        l.all_rules = 0;
        assert!(!filter_takes(&l, 3, CAPTURE_DROPPED, 0b0111));
        assert!(filter_takes(&l, 3, CAPTURE_DROPPED, 0b1000));
        assert_eq!(verdict_bit(Verdict::Drop), CAPTURE_DROPPED);
        assert_eq!(verdict_bit(Verdict::WouldDrop), CAPTURE_WOULD_DROP);
        assert_eq!(verdict_bit(Verdict::Pass), CAPTURE_PASSED);
    }

    #[test]
    fn sampling_in_two_steps_takes_about_one_in_n() {
        let mut scratch = crate::CpuScratch::default();
        let mut other = crate::CpuScratch::default();
        // Another stream for the first step (the kernel's prandom).
        other.next_random();
        other.next_random();
        for (n, least) in [(1u32, 1u32), (2, 2), (10, 1), (1000, 1000), (1000, 10), (7, 3)] {
            let on = on_word([(0, CAPTURE_DROPPED, least)]);
            assert_eq!(least_sample(on), least);
            for lane in [0u32, 5] {
                let draws = 400_000;
                let got = (0..draws)
                    .filter(|_| presampled(on, other.next_random() as u32))
                    .filter(|_| sampled(n, least, scratch.next_random(), lane))
                    .count() as f64;
                let want = draws as f64 / n as f64;
                // Four standard deviations of a binomial count.
                assert!((got - want).abs() <= 4.0 * want.sqrt() + 1.0, "1/{n} (least {least}) lane {lane}: {got}");
            }
        }
        // The first step alone: exactly the share of u32s, 1/n.
        let on = on_word([(0, CAPTURE_DROPPED, 4)]);
        assert!(presampled(on, 0) && presampled(on, (1 << 30) - 1) && !presampled(on, 1 << 30));
        assert!(presampled(on_word([(0, CAPTURE_DROPPED, 1)]), u32::MAX));
    }

    /// The bound over a flood: in every window of a second at most P plus
    /// the burst, and P per second in the long run.
    #[test]
    fn the_rate_bound_is_p_per_second_plus_the_burst() {
        for pps in [1u64, 7, 100, 1000, 50_000] {
            let l = CaptureLane::bounded(pps, 1);
            let mut tat = 0u64;
            let mut taken = std::vec::Vec::new();
            // A frame every 13 µs for 5 s, starting at a large clock.
            let start = 1u64 << 40;
            let mut t = start;
            while t < start + 5_000_000_000 {
                if let Some(n) = admit(tat, t, l.interval_ns, l.tolerance_ns) {
                    tat = n;
                    taken.push(t);
                }
                t += 13_000;
            }
            let burst = burst_for(pps) as usize;
            assert!(taken.len() as u64 <= 5 * pps + burst as u64, "{pps}: {}", taken.len());
            assert!(taken.len() as u64 >= 5 * pps - 1, "{pps}: {}", taken.len());
            // Two pointers: the frames in [taken[i], taken[i] + 1 s).
            let mut end = 0;
            for (i, &t0) in taken.iter().enumerate() {
                while end < taken.len() && taken[end] < t0 + 1_000_000_000 {
                    end += 1;
                }
                assert!(end - i <= pps as usize + burst, "{pps}: {} in a second", end - i);
            }
        }
    }

    #[test]
    fn the_bound_gives_no_room_for_a_clock_that_goes_back_or_an_idle_span() {
        let l = CaptureLane::bounded(10, 1);
        // Idle for years: only the burst.
        let mut tat = 5;
        let now = 1u64 << 62;
        let mut n = 0;
        while let Some(t) = admit(tat, now, l.interval_ns, l.tolerance_ns) {
            tat = t;
            n += 1;
        }
        assert_eq!(n, burst_for(10));
        // Backwards: still refused.
        assert_eq!(admit(tat, now - 1_000_000_000, l.interval_ns, l.tolerance_ns), None);
        // Saturates instead of wrapping.
        assert_eq!(admit(u64::MAX - 1, u64::MAX - 1, 5, 0), Some(u64::MAX));
    }

    #[test]
    fn a_record_reads_back() {
        let mut r = CaptureRecord { header: CaptureHeader::default(), data: [0; SNAP_BYTES] };
        r.header = CaptureHeader { time_ns: 77, len: 1500, caplen: 3, ifindex: 4, rule_slot: 9, verdict: 2, lanes: 5 };
        r.data[..3].copy_from_slice(&[1, 2, 3]);
        // SAFETY: a plain repr(C) value without padding, read as bytes.
        let bytes = unsafe {
            core::slice::from_raw_parts(&r as *const CaptureRecord as *const u8, core::mem::size_of::<CaptureRecord>())
        };
        let (h, d) = CaptureRecord::parse(bytes).unwrap();
        assert_eq!(h, r.header);
        assert_eq!(d, &[1, 2, 3]);
        assert!(CaptureRecord::parse(&bytes[..10]).is_none());
        let mut bad = bytes.to_vec();
        bad[12..16].copy_from_slice(&(SNAP_BYTES as u32 + 1).to_ne_bytes());
        assert!(CaptureRecord::parse(&bad).is_none());
    }

    #[test]
    fn bursts() {
        assert_eq!(burst_for(1), 1);
        assert_eq!(burst_for(100), 10);
        assert_eq!(burst_for(100_000), 1000);
        let l = CaptureLane::bounded(0, 0);
        assert_eq!((l.interval_ns, l.sample_every), (1_000_000_000, 1));
    }

    #[test]
    fn the_on_word_carries_the_lanes_and_the_verdicts_they_want() {
        assert_eq!(on_word([]), 0);
        let w = on_word([(0, CAPTURE_DROPPED, 1000), (3, CAPTURE_PASSED, 10)]);
        assert_eq!(least_sample(w), 10);
        assert_eq!(w & ON_LANES as u64, 0b1001);
        assert!(wanted(w, CAPTURE_DROPPED) && wanted(w, CAPTURE_PASSED));
        assert!(!wanted(w, CAPTURE_WOULD_DROP));
        // A lane past the last one is ignored, not wrapped into another's bit.
        assert_eq!(on_word([(MAX_CAPTURES, CAPTURE_PASSED, 1)]), 0);
        let all = on_word([(7, CAPTURE_PASSED | CAPTURE_DROPPED | CAPTURE_WOULD_DROP, 1)]);
        assert_eq!(all & ON_LANES as u64, 0x80);
        assert_eq!(least_sample(all), 1);
        assert!(wanted(all, CAPTURE_WOULD_DROP));
    }
}
