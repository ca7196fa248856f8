//! The reverse leaky bucket.
//!
//! A bucket holds *debt*: every admitted packet adds its cost, and debt
//! drains at the configured rate. A packet that would push debt above the
//! bucket size (the burst) is dropped. Drain is computed lazily from the
//! timestamp of the next packet, so nothing sweeps the table, and a bucket
//! at zero debt is identical to no bucket at all: evicting it loses nothing.
//!
//! Representation: debt is kept as the time at which it will have drained
//! to zero ("theoretical arrival time", `tat`), in units of 2^-shift ns.
//! That makes the whole state one `u64` a CPU can compare-and-swap, and the
//! per-packet path needs only a shift, a multiply and additions — no
//! division. Debt = `tat - now` when positive, else zero.
//!
//! The unit is per rule (`shift`): fine enough that the cost of one packet
//! has many units even at 100 Mpps or 400 Gbit/s, coarse enough that the
//! largest bucket (burst 10^9 at 1 pps) still fits in 61 bits. `now` in
//! those units wraps modulo 2^64; all comparisons are wrapping differences,
//! which stay exact because debt is bounded far below 2^63.

/// Nanoseconds per second.
pub const NS_PER_SEC: u64 = 1_000_000_000;
/// Finest time unit: 2^-16 ns. Coarser units are picked when a bucket is
/// so large that it would not fit in [`MAX_LIMIT`].
pub const MAX_SHIFT: u32 = 16;
/// Extra fraction bits of the per-byte cost, so that one byte at
/// 400 Gbit/s (0.02 ns) still has a precise cost.
pub const BYTE_FRAC_BITS: u32 = 16;
const BYTE_FRAC_MASK: u64 = (1 << BYTE_FRAC_BITS) - 1;
/// Largest bucket size (debt limit) in time units. Debt plus one packet's
/// cost then always fits in 63 bits: no overflow is possible.
pub const MAX_LIMIT: u64 = 1 << 61;
/// Largest cost of one packet in time units.
pub const MAX_PKT_COST: u64 = 1 << 61;
/// Frames are charged for at most this many bytes (an XDP frame is far
/// smaller; the cap bounds the multiply below).
pub const MAX_FRAME_LEN: u32 = 65_535;
/// Largest per-byte cost, so `MAX_FRAME_LEN * byte_cost` fits in 62 bits.
pub const MAX_BYTE_COST: u64 = (1 << 62) / MAX_FRAME_LEN as u64;
/// A wrapped difference `tat - now` this large cannot be debt (debt is at
/// most [`MAX_LIMIT`]): the bucket is so old that `now` went round the
/// clock past it. It is treated as drained.
pub const STALE: u64 = 1 << 62;

/// Rates and bursts accepted by the constructors (see README).
pub const MIN_RATE_PPS: u64 = 1;
pub const MAX_RATE_PPS: u64 = 100_000_000;
pub const MIN_RATE_BPS: u64 = 1_000;
pub const MAX_RATE_BPS: u64 = 400_000_000_000;
pub const MAX_BURST: u64 = 1_000_000_000;

impl core::fmt::Display for Action {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a rule does with the sources it matches. Stored as `u32` in
/// [`Rule::action`] so the kernel value has no implicit padding.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize, clap::ValueEnum))]
#[cfg_attr(feature = "user", serde(rename_all = "lowercase"))]
pub enum Action {
    /// Drop what exceeds the bucket.
    Police = 0,
    /// Pass everything, count what would have been dropped.
    Monitor = 1,
    /// Never police.
    Allow = 2,
    /// Drop everything.
    Deny = 3,
}

impl Action {
    /// Whether the action uses a bucket (and so needs a rate).
    pub const fn polices(self) -> bool {
        matches!(self, Action::Police | Action::Monitor)
    }

    /// The name operators write (config file, CLI).
    pub const fn name(self) -> &'static str {
        match self {
            Action::Police => "police",
            Action::Monitor => "monitor",
            Action::Allow => "allow",
            Action::Deny => "deny",
        }
    }

    pub const fn from_u32(v: u32) -> Option<Action> {
        match v {
            0 => Some(Action::Police),
            1 => Some(Action::Monitor),
            2 => Some(Action::Allow),
            3 => Some(Action::Deny),
            _ => None,
        }
    }
}

/// A rule as the kernel sees it: the value of the LPM tries.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// Debt added per packet, in time units (2^-shift ns). Zero in byte mode.
    pub pkt_cost: u64,
    /// Debt added per byte, in 2^-(shift + BYTE_FRAC_BITS) ns. Zero in
    /// packet mode.
    pub byte_cost: u64,
    /// Bucket size: the most debt a bucket may hold, in time units.
    pub limit: u64,
    /// Mask applied to the source address to form the bucket key (network
    /// order; the first `key_len` bits set).
    pub key_mask: [u8; 16],
    /// Time unit of this rule's buckets: 2^-shift ns.
    pub shift: u32,
    /// An [`Action`] as `u32`.
    pub action: u32,
    /// How many leading bits of the source form one bucket.
    pub key_len: u32,
    /// Identifies this version of the rule in buckets: user space gives
    /// every change a new id.
    pub rule_id: u32,
    /// Slot of this rule's counters in `RULE_COUNTERS` (kept across
    /// changes to the same prefix).
    pub counter_slot: u32,
    /// [`stamp`]`(limit, shift)`: what the buckets this rule charges
    /// remember of it, so a change of size or unit can be detected and the
    /// fill carried over ([`Rule::rescale`]).
    pub stamp: u32,
}

/// Why a rate or burst cannot make a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RuleError {
    RateOutOfRange,
    BurstOutOfRange,
    KeyLenOutOfRange,
}

impl core::fmt::Display for RuleError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RuleError::RateOutOfRange => write!(
                f,
                "rate out of range ({MIN_RATE_PPS} pps ..= {MAX_RATE_PPS} pps, \
                 {MIN_RATE_BPS} bit/s ..= {MAX_RATE_BPS} bit/s)"
            ),
            RuleError::BurstOutOfRange => write!(f, "burst out of range (1 ..= {MAX_BURST})"),
            RuleError::KeyLenOutOfRange => {
                write!(f, "key length out of range (1..=32 for IPv4, 1..=128 for IPv6)")
            }
        }
    }
}

/// `ceil(a * 2^s / b)` without overflow; host side only (the kernel never
/// divides).
const fn ceil_scaled(a: u64, s: u32, b: u64) -> u128 {
    let n = (a as u128) << s;
    n.div_ceil(b as u128)
}

impl Rule {
    /// A rule that charges one unit per packet: `rate_pps` packets per
    /// second, `burst` packets back to back from an empty bucket.
    pub fn packets(rate_pps: u64, burst: u64) -> Result<Rule, RuleError> {
        if !(MIN_RATE_PPS..=MAX_RATE_PPS).contains(&rate_pps) {
            return Err(RuleError::RateOutOfRange);
        }
        if !(1..=MAX_BURST).contains(&burst) {
            return Err(RuleError::BurstOutOfRange);
        }
        let mut shift = MAX_SHIFT;
        loop {
            // Rounding the cost up means the bucket never admits more than
            // the rate; the error is below one unit in the cost's units.
            let cost = ceil_scaled(NS_PER_SEC, shift, rate_pps);
            let limit = cost * burst as u128;
            if limit <= MAX_LIMIT as u128 && cost <= MAX_PKT_COST as u128 {
                return Ok(Rule::raw(cost as u64, 0, limit as u64, shift));
            }
            if shift == 0 {
                return Err(RuleError::BurstOutOfRange);
            }
            shift -= 1;
        }
    }

    /// A rule that charges by frame length: `rate_bps` bits per second and
    /// `burst_bytes` bytes back to back from an empty bucket.
    pub fn bytes(rate_bps: u64, burst_bytes: u64) -> Result<Rule, RuleError> {
        if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&rate_bps) {
            return Err(RuleError::RateOutOfRange);
        }
        if !(1..=MAX_BURST).contains(&burst_bytes) {
            return Err(RuleError::BurstOutOfRange);
        }
        let mut shift = MAX_SHIFT;
        loop {
            // ns per byte = 8e9 / bps.
            let byte_cost = ceil_scaled(8 * NS_PER_SEC, shift + BYTE_FRAC_BITS, rate_bps);
            let limit = (byte_cost * burst_bytes as u128) >> BYTE_FRAC_BITS;
            if limit <= MAX_LIMIT as u128 && byte_cost <= MAX_BYTE_COST as u128 {
                return Ok(Rule::raw(0, byte_cost as u64, limit as u64, shift));
            }
            if shift == 0 {
                return Err(RuleError::BurstOutOfRange);
            }
            shift -= 1;
        }
    }

    const fn raw(pkt_cost: u64, byte_cost: u64, limit: u64, shift: u32) -> Rule {
        Rule {
            pkt_cost,
            byte_cost,
            limit,
            key_mask: [0xff; 16],
            shift,
            action: Action::Police as u32,
            key_len: 128,
            rule_id: 0,
            counter_slot: 0,
            stamp: stamp(limit, shift),
        }
    }

    /// Sets how many leading bits of the source address form one bucket.
    pub fn with_key_len(mut self, key_len: u32, ipv6: bool) -> Result<Rule, RuleError> {
        let max = if ipv6 { 128 } else { 32 };
        if key_len == 0 || key_len > max {
            return Err(RuleError::KeyLenOutOfRange);
        }
        self.key_len = key_len;
        self.key_mask = prefix_mask(key_len);
        Ok(self)
    }

    pub const fn with_action(mut self, action: Action) -> Rule {
        self.action = action as u32;
        self
    }

    pub const fn with_id(mut self, rule_id: u32) -> Rule {
        self.rule_id = rule_id;
        self
    }

    pub const fn with_counter_slot(mut self, slot: u32) -> Rule {
        self.counter_slot = slot;
        self
    }

    /// The debt one frame of `frame_len` bytes adds, in time units.
    #[inline(always)]
    pub fn cost(&self, frame_len: u32) -> u64 {
        let len = if frame_len > MAX_FRAME_LEN { MAX_FRAME_LEN } else { frame_len } as u64;
        // Clamps make any value written into the map safe, not only the
        // ones the constructors make: the sum below cannot overflow.
        let byte_cost = min(self.byte_cost, MAX_BYTE_COST);
        let scaled = len * byte_cost;
        // Round up: a frame never costs less than its exact share.
        let bytes = (scaled >> BYTE_FRAC_BITS) + ((scaled & BYTE_FRAC_MASK != 0) as u64);
        min(self.pkt_cost, MAX_PKT_COST) + bytes
    }

    #[inline(always)]
    fn shift(&self) -> u32 {
        min(self.shift as u64, MAX_SHIFT as u64) as u32
    }

    #[inline(always)]
    fn limit(&self) -> u64 {
        min(self.limit, MAX_LIMIT)
    }

    /// Debt in time units a bucket holds at `now` (0 when drained).
    #[inline(always)]
    fn debt(tat: u64, now: u64) -> u64 {
        let d = tat.wrapping_sub(now);
        // `d` as i64 <= 0: tat is in the past, the bucket is empty.
        if (d as i64) <= 0 || d >= STALE { 0 } else { d }
    }

    /// The `tat` of a bucket with no debt at `now_ns`: what a new bucket
    /// starts from.
    #[inline(always)]
    pub fn empty_tat(&self, now_ns: u64) -> u64 {
        now_ns.wrapping_shl(self.shift())
    }

    /// The verdict for one frame of `frame_len` bytes at `now_ns`, given
    /// the bucket's `tat` (use [`Rule::empty_tat`] for a new bucket).
    ///
    /// Returns the bucket's new `tat` when the frame is admitted, `None`
    /// when it must be dropped. A dropped frame leaves the bucket as it
    /// was, so the drop path never writes.
    #[inline(always)]
    pub fn admit(&self, tat: u64, now_ns: u64, frame_len: u32) -> Option<u64> {
        let now = now_ns.wrapping_shl(self.shift());
        let limit = self.limit();
        let debt = Rule::debt(tat, now);
        // More debt than the bucket holds only happens when the clock
        // stepped back: keep the bucket (never create budget) and drop.
        if debt > limit {
            return None;
        }
        let new_debt = debt + self.cost(frame_len);
        if new_debt > limit { None } else { Some(now.wrapping_add(new_debt)) }
    }

    /// Whether a frame is refused at every instant of `[lo_ns, hi_ns]`:
    /// then it can be dropped without knowing the time more exactly (see
    /// [`crate::clock`]). `false` means the clock must be read, not that
    /// the frame would be admitted.
    ///
    /// Checking both ends is enough: across a window of at most
    /// [`crate::clock::MAX_WINDOW_NS`] the debt only falls as time goes on,
    /// except where it crosses the stale boundary, and there the two ends
    /// differ.
    #[inline(always)]
    pub fn refuses_within(&self, tat: u64, lo_ns: u64, hi_ns: u64, frame_len: u32) -> bool {
        if hi_ns < lo_ns || hi_ns - lo_ns > crate::clock::MAX_WINDOW_NS {
            return false;
        }
        // `admit` refuses at `t` exactly when the debt at `t` exceeds the
        // room the bucket has for this frame (none: refused even empty).
        let Some(room) = self.limit().checked_sub(self.cost(frame_len)) else {
            return true;
        };
        // The debt at `t` is d(t) = tat - t (in units) when 0 < d(t) <
        // STALE, else 0. With d = d(hi), d(lo) = d + span: refused at both
        // ends exactly when room < d and d + span < STALE. (span < 2^46
        // and room <= MAX_LIMIT = 2^61, so nothing wraps.) Only the last
        // two comparisons wait for `tat`, the one value read from the
        // table: everything else is worked out while that read is on its
        // way.
        let shift = self.shift();
        let span = (hi_ns - lo_ns) << shift;
        let d = tat.wrapping_sub(hi_ns.wrapping_shl(shift));
        d > room && d < STALE - span
    }

    /// Debt of a bucket at `now_ns`, in nanoseconds.
    pub fn debt_ns(&self, tat: u64, now_ns: u64) -> u64 {
        let now = now_ns.wrapping_shl(self.shift());
        Rule::debt(tat, now) >> self.shift()
    }

    /// Carries a bucket over to this rule from the rule that last charged
    /// it (the prefix's rule changed size or unit, or the source now falls
    /// under another prefix whose does: the bucket's stamp differs). The bucket keeps its *fill*: a full bucket stays full and a
    /// half-drained one stays half-drained, so a rule change never hands out
    /// a burst and never takes one away. Returns the new `tat`.
    ///
    /// Only integer shifts, multiplies and one division: this runs in the
    /// kernel, but only on the first packet after a change.
    #[inline(always)]
    pub fn rescale(&self, old: &Bucket, now_ns: u64) -> u64 {
        let (old_limit, old_shift) = unstamp(old.stamp());
        let debt = min(Rule::debt(old.tat, now_ns.wrapping_shl(old_shift)), old_limit);
        let new_limit = self.limit();
        // fill = debt / old_limit as a 16-bit fraction. debt <= 2^61, so
        // `debt << 16` would overflow: shift the divisor instead when large.
        let fill = if old_limit == 0 {
            0
        } else if debt <= u64::MAX >> 16 {
            (debt << 16).checked_div(old_limit).unwrap_or(0)
        } else {
            debt.checked_div(old_limit >> 16).unwrap_or(0)
        };
        let fill = min(fill, 1 << 16);
        let new_debt = (new_limit >> 16) * fill + (((new_limit & 0xffff) * fill) >> 16);
        self.empty_tat(now_ns).wrapping_add(min(new_debt, new_limit))
    }

    /// The bucket this rule leaves after admitting to `tat`.
    #[inline(always)]
    pub fn bucket(&self, tat: u64) -> Bucket {
        Bucket { tat, meta: self.stamp as u64 & STAMP_MASK }
    }
}

#[inline(always)]
const fn min(a: u64, b: u64) -> u64 {
    if a < b { a } else { b }
}

/// The first `bits` bits set, network order.
pub const fn prefix_mask(bits: u32) -> [u8; 16] {
    let mut m = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        let lo = (i * 8) as u32;
        m[i] = if bits >= lo + 8 {
            0xff
        } else if bits <= lo {
            0
        } else {
            0xffu8 << (8 - (bits - lo))
        };
        i += 1;
    }
    m
}

/// Bits of [`Bucket::meta`] that hold the stamp; the bits above count drops.
pub const STAMP_BITS: u32 = 24;
pub const STAMP_MASK: u64 = (1 << STAMP_BITS) - 1;
/// One drop, as added to [`Bucket::meta`] (atomically, by the kernel).
pub const DROP_ONE: u64 = 1 << STAMP_BITS;
/// Significant bits of a bucket size kept in a stamp.
const STAMP_MANT_BITS: u32 = 13;
/// Bits of the shift in a stamp (a shift is at most [`MAX_SHIFT`] = 16).
const STAMP_SHIFT_BITS: u32 = 5;
/// Bits of the size's exponent in a stamp (sizes are below 2^62).
const STAMP_EXP_BITS: u32 = 6;

/// What a bucket remembers of the rule that last charged it: the time unit
/// (`shift`) exactly and the size (`limit`) rounded to 13 significant bits,
/// in [`STAMP_BITS`] bits. That is all [`Rule::rescale`] needs: a change of
/// rule carries the fill over to within 1/8192 of the bucket. Two rules with
/// the same stamp read a bucket's `tat` alike (their sizes differ by less
/// than 1/4096), so no rescale is needed between them.
pub const fn stamp(limit: u64, shift: u32) -> u32 {
    let limit = min(limit, MAX_LIMIT);
    let shift = min(shift as u64, MAX_SHIFT as u64) as u32;
    let bits = 64 - limit.leading_zeros();
    let mut exp = bits.saturating_sub(STAMP_MANT_BITS);
    // Rounded to nearest, so the fill carried over is as likely a hair
    // high as low.
    let mut mant = if exp == 0 { limit } else { (limit + (1 << (exp - 1))) >> exp };
    if mant == 1 << STAMP_MANT_BITS {
        mant >>= 1;
        exp += 1;
    }
    shift | (exp << STAMP_SHIFT_BITS) | ((mant as u32) << (STAMP_SHIFT_BITS + STAMP_EXP_BITS))
}

/// The bucket size (to 13 significant bits) and time unit a stamp stands
/// for. Any 32-bit value decodes to a size within
/// [`MAX_LIMIT`] and a shift within [`MAX_SHIFT`].
#[inline(always)]
pub const fn unstamp(stamp: u32) -> (u64, u32) {
    let shift = min((stamp & ((1 << STAMP_SHIFT_BITS) - 1)) as u64, MAX_SHIFT as u64) as u32;
    let exp = (stamp >> STAMP_SHIFT_BITS) & ((1 << STAMP_EXP_BITS) - 1);
    let mant = ((stamp >> (STAMP_SHIFT_BITS + STAMP_EXP_BITS)) & ((1 << STAMP_MANT_BITS) - 1)) as u64;
    let limit = if exp > 64 - STAMP_MANT_BITS { MAX_LIMIT } else { min(mant << exp, MAX_LIMIT) };
    (limit, shift)
}

/// The value of the bucket map: 16 bytes, so that a hash table element
/// (the kernel's 48-byte header, the key, the value) stays small; a lookup
/// costs cache misses per line it touches.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Bucket {
    /// When the debt will have drained, in 2^-shift ns (see module doc).
    /// Updated with compare-and-swap.
    pub tat: u64,
    /// Low [`STAMP_BITS`]: the [`stamp`] of the rule that last charged the
    /// bucket (a mismatch triggers [`Rule::rescale`]). Above: frames this
    /// source had dropped (or would have, under monitor) since its bucket
    /// was created, what `policer top` ranks by; 2^40 of them before the
    /// count wraps (to zero, never into the stamp).
    pub meta: u64,
}

impl Bucket {
    /// The stamp of the rule that last charged this bucket.
    pub const fn stamp(&self) -> u32 {
        (self.meta & STAMP_MASK) as u32
    }

    /// Frames dropped from this source since the bucket was created.
    pub const fn drops(&self) -> u64 {
        self.meta >> STAMP_BITS
    }

    /// Debt at `now_ns` in this bucket's own units (what its size is in).
    pub fn debt(&self, now_ns: u64) -> u64 {
        let (_, shift) = unstamp(self.stamp());
        Rule::debt(self.tat, now_ns.wrapping_shl(shift))
    }

    /// Debt at `now_ns` as ns of drain time.
    pub fn debt_ns(&self, now_ns: u64) -> u64 {
        self.debt(now_ns) >> unstamp(self.stamp()).1
    }

    /// Debt as a fraction of the bucket size, in 1/65536 (65536 = full).
    pub fn fill_q16(&self, now_ns: u64) -> u64 {
        let (limit, _) = unstamp(self.stamp());
        let debt = min(self.debt(now_ns), limit);
        if limit == 0 {
            0
        } else if debt <= u64::MAX >> 16 {
            ((debt << 16) / limit).min(1 << 16)
        } else {
            (debt / (limit >> 16).max(1)).min(1 << 16)
        }
    }
}

#[cfg(test)]
mod tests;
