//! The one definition of `policer suggest`'s numbers: a source's peak
//! rate over sliding windows, the nearest-rank percentile of a
//! population of them, and the rate and burst proposed from those.
//!
//! Time is cut into bins of [`BIN_NS`] (100 ms) from the start of the
//! observation; a window of `w` bins slides one bin at a time, and only
//! windows that lie wholly inside the observation count (a 10 s window
//! needs 10 s observed). A source's peak over a window length is the most
//! frames any such window holds. Streaming: a source keeps the counts of
//! its last [`RING`] bins, so memory is per source, not per frame.

/// The width of a bin: the windows slide by this much.
pub const BIN_NS: u64 = 100_000_000;
/// Bins per second.
pub const BINS_PER_S: u64 = 1_000_000_000 / BIN_NS;
/// The windows, in bins: 100 ms, 1 s, 10 s.
pub const WINDOWS: [u64; 3] = [1, BINS_PER_S, 10 * BINS_PER_S];
/// Bins a source remembers: the longest window.
const RING: usize = 10 * BINS_PER_S as usize;

/// One source's frame counts over its last bins, and its peaks so far.
#[derive(Clone, Debug)]
pub struct Peaks {
    ring: Box<[u32; RING]>,
    /// The bin of the source's latest frame.
    last: u64,
    /// Most frames in a window of each of [`WINDOWS`] seen so far (only
    /// windows that ended before `last`'s are in; see [`Peaks::close`]).
    peak: [u64; 3],
    frames: u64,
}

impl Peaks {
    /// A source whose first frame is in `bin`.
    pub fn new(bin: u64) -> Peaks {
        let mut p = Peaks { ring: Box::new([0; RING]), last: bin, peak: [0; 3], frames: 0 };
        p.add(bin);
        p
    }

    /// A frame in `bin`. A frame older than the latest (a capture slightly
    /// out of order) counts in the latest bin: bins are never reopened.
    pub fn add(&mut self, bin: u64) {
        let bin = bin.max(self.last);
        if bin > self.last {
            self.close(bin);
            for b in (self.last + 1).max(bin.saturating_sub(RING as u64 - 1))..=bin {
                self.ring[(b % RING as u64) as usize] = 0;
            }
            self.last = bin;
        }
        let c = &mut self.ring[(bin % RING as u64) as usize];
        *c = c.saturating_add(1);
        self.frames += 1;
    }

    /// Takes into the peaks each window that ends at or after `last` and
    /// before `end` (exclusive) and holds `last`: the window ending at
    /// `last`, or, when `last` is earlier than a window's length, the
    /// observation's first window. Later windows hold only fewer of these
    /// frames (the bins after `last` are empty up to `end`), and earlier
    /// ones were taken before.
    fn close(&mut self, end: u64) {
        for (i, w) in WINDOWS.iter().enumerate() {
            let e = self.last.max(w - 1);
            if e < end {
                let from = (e + 1).saturating_sub(*w);
                let sum: u64 = (from..=self.last).map(|b| u64::from(self.ring[(b % RING as u64) as usize])).sum();
                self.peak[i] = self.peak[i].max(sum);
            }
        }
    }

    /// The peaks at the end of an observation of `bins` bins (every frame
    /// added was in a bin before it): the most frames in a window of each
    /// of [`WINDOWS`], `None` for a window longer than the observation.
    pub fn finish(mut self, bins: u64) -> ([Option<u64>; 3], u64) {
        self.close(bins.max(self.last + 1));
        let mut out = [None; 3];
        for (i, w) in WINDOWS.iter().enumerate() {
            out[i] = (bins >= *w).then_some(self.peak[i]);
        }
        (out, self.frames)
    }
}

/// A share of sources, in parts per million (99.9 % is 999 000).
pub type Ppm = u64;

/// `--keep`: `99.9%`, `99.9` (a percentage), up to four decimals, more
/// than 0 and at most 100.
pub fn parse_keep(s: &str) -> Result<Ppm, String> {
    let t = s.trim().trim_end_matches('%').trim();
    let bad = || format!("--keep {s:?}: a share of sources in percent, more than 0 and at most 100 (99.9%)");
    let (int, frac) = t.split_once('.').unwrap_or((t, ""));
    if int.is_empty() || frac.len() > 4 || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let int: u64 = int.parse().map_err(|_| bad())?;
    let frac: u64 = format!("{frac:0<4}").parse().map_err(|_| bad())?;
    let ppm = int.checked_mul(10_000).and_then(|v| v.checked_add(frac)).ok_or_else(bad)?;
    if ppm == 0 || ppm > 1_000_000 { Err(bad()) } else { Ok(ppm) }
}

/// The nearest-rank percentile of `sorted` (ascending): the value at rank
/// ⌈share × n⌉ (at least the first); `None` for no values. Every value
/// is one a source had: no interpolation.
pub fn percentile(sorted: &[u64], share: Ppm) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (share as u128 * sorted.len() as u128).div_ceil(1_000_000).max(1) as usize;
    Some(sorted[rank.min(sorted.len()) - 1])
}

/// A rate in frames per second from a count over a window of `w` bins.
pub fn per_s(count: u64, w: u64) -> f64 {
    count as f64 * BINS_PER_S as f64 / w as f64
}

/// The kept share's peaks, as counts over each of [`WINDOWS`] (the 10 s
/// one `None` when less than 10 s was observed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    pub ms100: u64,
    pub s1: u64,
    pub s10: Option<u64>,
}

/// The rate (frames per second) and burst (frames) proposed for a kept
/// share's peaks: the rate is the 10 s peak's rate, rounded up (the 1 s
/// peak's when less than 10 s was observed), at least 1; the burst is what
/// the bucket must hold beyond the rate for the 1 s peak and for the
/// 100 ms peak (a bucket of rate R and burst B admits R·T + B frames in
/// any T), and at least a tenth of a second at the rate, and 1.
pub fn propose(k: Kept) -> (u64, u64) {
    let rate = match k.s10 {
        Some(c) => c.div_ceil(10),
        None => k.s1,
    }
    .max(1);
    let tenth = rate / BINS_PER_S;
    let burst = k.s1.saturating_sub(rate).max(k.ms100.saturating_sub(tenth)).max(rate.div_ceil(BINS_PER_S)).max(1);
    (rate, burst)
}

/// Whether a source with these peaks stays within `rate` and `burst` by
/// the windows [`propose`] sizes them by.
pub fn within(peaks: &[Option<u64>; 3], rate: u64, burst: u64) -> bool {
    let [ms100, s1, s10] = *peaks;
    ms100.is_none_or(|c| c <= rate / BINS_PER_S + burst)
        && s1.is_none_or(|c| c <= rate + burst)
        && s10.is_none_or(|c| c <= 10 * rate + burst)
}

#[cfg(test)]
mod tests;
