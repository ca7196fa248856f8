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
//! division. Debt = `tat - now`, a wrapping difference, read as described
//! below.
//!
//! The unit is per rule (`shift`): the *coarsest* unit in which the cost of
//! one packet (byte mode: of a 64-byte frame) still has at least
//! 2^[`COST_PRECISION_BITS`] units, so rounding it up costs at most 2^-16 of
//! the rate; coarser still if the bucket would not fit in [`MAX_LIMIT`]. A
//! coarse unit makes the clock in units wrap seldom: `now << shift` wraps
//! every 2^(64 - shift) ns, the rule's *period* ([`Rule::period_ns`]).
//! Packet rules up to ~15 kpps and byte rules up to ~7.8 Mbit/s get shift 0
//! (a period of 584 years), 1 Mpps shift 7 (4.6 years), 100 Mpps shift 13
//! (26 days), byte rules above 256 Gbit/s shift 16 (78 hours).
//!
//! # Time that cannot wrap into harm
//!
//! The invariant: **with a monotonic clock, a real debt never exceeds
//! [`debt_bound`]`(limit, shift) = limit + limit / 2^11 + (20 s << shift)`**,
//! all in the rule's units (20 s is [`SKEW_ALLOWANCE_NS`]). Every write leaves at most
//! `limit` ([`Rule::admit`] admits only to `limit`, [`Rule::rescale`] caps
//! at it, a new bucket starts at zero); after that the debt only falls.
//! What a reader can see above `limit`:
//! - another CPU admitted with a clock reading taken after ours (between
//!   our reading and our compare-and-swap), and the jiffies window of
//!   [`crate::clock`], whose low end is up to [`crate::clock::MAX_WINDOW_NS`]
//!   old: both well inside the allowance;
//! - a rule with the same [`stamp`] but a limit up to 2^-12 smaller than
//!   the one that charged the bucket (a stamp keeps 13 significant bits):
//!   the `limit / 2^11` term, twice that;
//! - a clock that stepped back (the test clock, or user space reading with
//!   its own clock): by up to the allowance it is still recognised.
//!
//! So a wrapped difference `d = tat - now` is read as:
//! - `d <= bound`: debt `d`; above `limit` it is a clock that stepped back,
//!   and [`Rule::admit`] drops without writing (a clock that goes back never
//!   creates budget);
//! - `d > bound`, including every "negative" `d`: the bucket is drained.
//!   Either `tat` is in the past, or it is so far in the past that `now`
//!   went round the period past it: a *stale* bucket, not a clock that
//!   stepped back.
//!
//! That one comparison, `d <= bound`, is all a reader needs: the debt of
//! [`Rule::admit`], [`Rule::refuses_within`], [`Rule::rescale`],
//! [`Bucket::debt`] (eviction and `policer top`) and the new-source limiter
//! ([`NewSources`]) are all read through it. `bound` depends only on
//! the rule, so the program works it out while the bucket is being read.
//!
//! **The alias windows, the weakness that remains.** The state keeps the
//! time modulo the period P, so a gap G since a bucket's last write of
//! debt `d0` (`0 <= d0 <= limit`) cannot be told from `G mod P`. The read
//! is exact (zero once drained) for every G except those within the bound
//! of a whole number of periods: `k·P - (bound - d0) <= G <= k·P + d0`
//! (converted to ns), `k >= 1` — one window of `bound` (≈ limit + 20 s) per
//! period. A gap inside one reads as *phantom* debt of at most `bound`:
//! above `limit` the source is refused (for at most `bound - limit` =
//! `limit / 2^11 + 20 s`, since the read debt falls as time goes on, and a
//! drop writes nothing); at or below it the source is admitted against at
//! most one bucket of phantom debt, which drains at the rule's rate like
//! any debt. Stricter, never more permissive ([`Rule::gap_may_alias`]
//! states the windows as code; the property tests check both sides). How
//! often a source can meet one depends on the period: never within 584
//! years for shift 0; at 100 Mpps one window of ~limit + 20 s in every
//! 26 days; byte rules above 256 Gbit/s one in every 78 h.

pub use crate::clock::NS_PER_SEC;

/// Finest time unit: 2^-16 ns. The constructors pick the coarsest unit that
/// keeps [`COST_PRECISION_BITS`] (see the module doc), and coarser still
/// when a bucket is so large that it would not fit in [`MAX_LIMIT`].
pub const MAX_SHIFT: u32 = 16;
/// The constructors pick a unit in which one packet (byte mode: one frame
/// of [`UNIT_FRAME_BYTES`]) costs at least 2^this units, unless that needs
/// a shift above [`MAX_SHIFT`]: the cost is rounded up by less than one
/// unit, so a rule admits at most 2^-16 below its rate.
pub const COST_PRECISION_BITS: u32 = 16;
/// The frame whose cost sets a byte-mode rule's unit: the smallest
/// Ethernet frame (without its FCS), the costliest to be exact about.
pub const UNIT_FRAME_BYTES: u64 = 64;
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
/// How far above a bucket's limit its debt may still be read as debt, not
/// as a stale bucket (see the module doc): cross-CPU clock readings, the
/// jiffies window (at most [`crate::clock::MAX_WINDOW_NS`] wide) and a
/// clock that stepped back by up to this much. 20 s: far above what the
/// kernel's monotonic clock can show (microseconds between CPUs, a second
/// of window), and above the 10 s step back the object tests make; small
/// against the shortest period (78 h), so the alias windows stay narrow.
pub const SKEW_ALLOWANCE_NS: u64 = 20 * NS_PER_SEC;
/// Significant bits of a bucket size a [`stamp`] keeps, less one: a rule
/// with the same stamp as the one that charged a bucket may have a limit
/// smaller by up to 2^-12 of it; [`debt_bound`] allows twice that.
const STAMP_SLACK_SHIFT: u32 = 11;

/// The most debt, in units of 2^-`shift` ns, a bucket of size `limit` can
/// really hold when it is read (the invariant of the module doc): a
/// wrapped `tat - now` above this is a stale bucket, drained.
///
/// `limit + limit / 2^11 + SKEW_ALLOWANCE_NS << shift`, with both clamped as
/// everywhere (`limit <= 2^61`, `shift <= 16`): below 2^62, so it never
/// overflows and every "negative" difference (2^63 and above) is beyond it.
#[inline(always)]
pub const fn debt_bound(limit: u64, shift: u32) -> u64 {
    let limit = min(limit, MAX_LIMIT);
    let shift = min(shift as u64, MAX_SHIFT as u64) as u32;
    limit + (limit >> STAMP_SLACK_SHIFT) + (SKEW_ALLOWANCE_NS << shift)
}

const _: () = {
    // The jiffies window fits in the allowance, so `refuses_within`'s
    // `bound - span` cannot wrap.
    assert!(crate::clock::MAX_WINDOW_NS < SKEW_ALLOWANCE_NS);
    // The bound stays far below the "negative" half of the wrapping clock.
    assert!(debt_bound(u64::MAX, u32::MAX) < 1 << 62);
};

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
    /// A prefix's rule in the tries: non-zero when the prefix has rules
    /// with a class, the group whose entries in `CLASS_INDEX` hold them
    /// (see [`crate::class`]). This rule is then the fallback: what a frame
    /// that matches none of the classes falls to ([`crate::ACTION_NONE`]:
    /// to no rule).
    pub classes: u32,
    /// [`crate::class::RULE_CLASS`], [`crate::class::RULE_TOTAL`],
    /// [`crate::class::RULE_NO_SOURCE`].
    pub flags: u32,
    /// With `classes`: bit `p % 64` set for every IP protocol `p` one of the
    /// classes names (all bits when one names none): frames of other
    /// protocols skip the class lookup.
    pub class_protos: u64,
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
                "rate out of range ({MIN_RATE_PPS} pps to {MAX_RATE_PPS} pps, \
                 {MIN_RATE_BPS} bit/s ..= {MAX_RATE_BPS} bit/s)"
            ),
            RuleError::BurstOutOfRange => write!(f, "burst out of range (1 to {MAX_BURST})"),
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

/// The smallest shift at which `cost_at(shift)`, the cost of one packet in
/// units of 2^-shift ns, has at least 2^[`COST_PRECISION_BITS`] units
/// ([`MAX_SHIFT`] if none has): the coarsest unit that is still precise,
/// so that the clock in units wraps as seldom as it can (module doc).
fn precise_shift(cost_at: impl Fn(u32) -> u128) -> u32 {
    let mut shift = 0;
    while shift < MAX_SHIFT && cost_at(shift) < 1 << COST_PRECISION_BITS {
        shift += 1;
    }
    shift
}

impl Rule {
    /// A rule that charges one unit per packet: `rate_pps` packets per
    /// second, `burst` packets back to back from an empty bucket. Its unit
    /// is the coarsest in which one packet costs 2^16 units or more.
    pub fn packets(rate_pps: u64, burst: u64) -> Result<Rule, RuleError> {
        if !(MIN_RATE_PPS..=MAX_RATE_PPS).contains(&rate_pps) {
            return Err(RuleError::RateOutOfRange);
        }
        if !(1..=MAX_BURST).contains(&burst) {
            return Err(RuleError::BurstOutOfRange);
        }
        let cost_at = |shift| ceil_scaled(NS_PER_SEC, shift, rate_pps);
        let mut shift = precise_shift(cost_at);
        loop {
            // Rounding the cost up means the bucket never admits more than
            // the rate; the error is below one unit in the cost's units.
            let cost = cost_at(shift);
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
    /// `burst_bytes` bytes back to back from an empty bucket. Its unit is
    /// the coarsest in which a 64-byte frame costs 2^16 units or more.
    pub fn bytes(rate_bps: u64, burst_bytes: u64) -> Result<Rule, RuleError> {
        if !(MIN_RATE_BPS..=MAX_RATE_BPS).contains(&rate_bps) {
            return Err(RuleError::RateOutOfRange);
        }
        if !(1..=MAX_BURST).contains(&burst_bytes) {
            return Err(RuleError::BurstOutOfRange);
        }
        // ns per byte = 8e9 / bps.
        let byte_cost_at = |shift| ceil_scaled(8 * NS_PER_SEC, shift + BYTE_FRAC_BITS, rate_bps);
        let mut shift = precise_shift(|shift| (byte_cost_at(shift) * UNIT_FRAME_BYTES as u128) >> BYTE_FRAC_BITS);
        loop {
            let byte_cost = byte_cost_at(shift);
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
            classes: 0,
            flags: 0,
            class_protos: 0,
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

    /// The most debt this rule's buckets can really hold: [`debt_bound`].
    #[inline(always)]
    pub fn debt_bound(&self) -> u64 {
        debt_bound(self.limit, self.shift)
    }

    /// How often this rule's clock in units wraps, in ns: 2^(64 - shift)
    /// (`u64::MAX` for shift 0, 584 years). See the alias windows in the
    /// module doc.
    pub fn period_ns(&self) -> u64 {
        1u64.checked_shl(64 - self.shift()).unwrap_or(u64::MAX)
    }

    /// Whether an idle gap of `gap_ns` since this rule left a bucket with
    /// `debt` units falls in an alias window of the module doc, where the
    /// bucket may read phantom debt:
    /// `k·P - (bound - debt) <= gap <= k·P + debt` for some `k >= 1`, in ns,
    /// widened by a ns on each side for the rounding of units to ns.
    /// Outside them, the bucket reads its true debt. For tests and
    /// diagnostics (never on the packet path).
    pub fn gap_may_alias(&self, debt: u64, gap_ns: u64) -> bool {
        let s = self.shift();
        let p = 1u128 << (64 - s);
        let before = (self.debt_bound().saturating_sub(debt) >> s) as u128 + 1;
        let after = (debt >> s) as u128 + 1;
        let (g, m) = (gap_ns as u128, gap_ns as u128 % p);
        m + before >= p || (g >= p && m <= after)
    }

    /// Debt in time units a bucket holds at `now` (0 when drained), given
    /// its [`debt_bound`]: a wrapped `tat - now` beyond it, "negative" ones
    /// included, is a drained bucket (module doc).
    #[inline(always)]
    fn debt(tat: u64, now: u64, bound: u64) -> u64 {
        let d = tat.wrapping_sub(now);
        if d <= bound { d } else { 0 }
    }

    /// The `tat` of a bucket with no debt at `now_ns`: what a new bucket
    /// starts from.
    #[inline(always)]
    pub fn empty_tat(&self, now_ns: u64) -> u64 {
        now_ns.wrapping_shl(self.shift())
    }

    /// The `tat` of a bucket owing `debt_ns` at `now_ns`, capped at one
    /// bucket: what a source the recall remembers in debt resumes from
    /// (see [`crate::recall`]).
    #[inline(always)]
    pub fn resumed_tat(&self, now_ns: u64, debt_ns: u64) -> u64 {
        let shift = self.shift();
        let limit = self.limit();
        let debt = if debt_ns > (limit >> shift) { limit } else { min(debt_ns << shift, limit) };
        self.empty_tat(now_ns).wrapping_add(debt)
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
        let debt = Rule::debt(tat, now, self.debt_bound());
        // More debt than the bucket holds, but within the bound, only
        // happens when the clock stepped back (or another CPU's reading was
        // later than ours): keep the bucket (never create budget) and drop.
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
    /// Checking both ends is enough: `admit` refuses at `t` exactly when the
    /// wrapped `d(t) = tat - t` lies in `(room, bound]`, one interval that
    /// does not wrap; across a window of at most
    /// [`crate::clock::MAX_WINDOW_NS`], `d(t)` runs down one interval of the
    /// same length from `d(lo)` to `d(hi)`, so if both ends lie in
    /// `(room, bound]` so does all of it. Where the window crosses the stale
    /// boundary (`bound`), the ends differ.
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
        // The debt at `t` is d(t) = tat - t (in units) when d(t) <= bound,
        // else 0, and refused means debt > room (room < limit < bound).
        // With d = d(hi), d(lo) = d + span: refused at both ends exactly
        // when room < d and d + span <= bound. (span < 2^46 <= the
        // allowance in `bound`, and bound < 2^62, so nothing wraps.) Only
        // the last two comparisons wait for `tat`, the one value read from
        // the table: everything else is worked out while that read is on
        // its way.
        let shift = self.shift();
        let span = (hi_ns - lo_ns) << shift;
        let d = tat.wrapping_sub(hi_ns.wrapping_shl(shift));
        d > room && d <= self.debt_bound() - span
    }

    /// How long from `now_ns` until this rule would admit a frame of
    /// `frame_len` bytes from a source whose bucket is `bucket` (`None`: it
    /// has none — drained or evicted — so a frame would start a fresh one):
    /// 0 when it would be admitted now, `u64::MAX` never (one frame costs
    /// more than the bucket holds). A bucket last charged by another rule
    /// is read as this rule would carry it over ([`Rule::rescale`]).
    /// Host side (`policer inspect`); rounded up to whole ns, so the frame
    /// is admitted at `now_ns + wait` and not a nanosecond before.
    pub fn wait_ns(&self, bucket: Option<&Bucket>, now_ns: u64, frame_len: u32) -> u64 {
        let tat = match bucket {
            None => return if self.cost(frame_len) > self.limit() { u64::MAX } else { 0 },
            Some(b) if b.stamp() as u64 == self.stamp as u64 & STAMP_MASK => b.tat,
            Some(b) => self.rescale(b, now_ns),
        };
        let shift = self.shift();
        let now = now_ns.wrapping_shl(shift);
        let debt = Rule::debt(tat, now, self.debt_bound());
        let Some(need) = (debt + self.cost(frame_len)).checked_sub(self.limit()) else {
            return 0;
        };
        if self.cost(frame_len) > self.limit() {
            return u64::MAX;
        }
        // `need` units must drain: round up to whole ns.
        (need >> shift) + u64::from(need & ((1u64 << shift) - 1) != 0)
    }

    /// Debt of a bucket at `now_ns`, in nanoseconds.
    pub fn debt_ns(&self, tat: u64, now_ns: u64) -> u64 {
        let now = now_ns.wrapping_shl(self.shift());
        Rule::debt(tat, now, self.debt_bound()) >> self.shift()
    }

    /// The frames of `frame_len` bytes this rule admitted between two reads
    /// of one bucket: `tat` `prev_tat` at `prev_ns`, then `tat` at `now_ns`
    /// (the user side's measure of a source's rate, `--dry-run`). Exact
    /// while the bucket stayed in debt from one read to the next (each
    /// frame adds its cost then); otherwise it drained between the reads
    /// and the frames since are those its debt now holds, at least one
    /// when `tat` moved (exact when the reads come faster than the frames).
    pub fn admitted_between(&self, prev_tat: u64, prev_ns: u64, tat: u64, now_ns: u64, frame_len: u32) -> u64 {
        if tat == prev_tat {
            return 0;
        }
        let cost = self.cost(frame_len).max(1);
        if self.debt_ns(prev_tat, prev_ns) >= now_ns.saturating_sub(prev_ns) {
            // In debt throughout: every frame added its cost.
            let moved = tat.wrapping_sub(prev_tat);
            if moved <= self.debt_bound() {
                return ((moved + cost / 2) / cost).max(1);
            }
        }
        let frame_ns = (cost >> self.shift()).max(1);
        self.debt_ns(tat, now_ns).div_ceil(frame_ns).max(1)
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
        let (old_limit, _) = unstamp(old.stamp());
        // Read as its old rule would (the stamp keeps enough of it for the
        // bound): a stale bucket carries over empty, debt above the old
        // limit as a full bucket.
        let debt = min(old.debt(now_ns), old_limit);
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

    /// Debt at `now_ns` in this bucket's own units (what its size is in),
    /// read with the [`debt_bound`] of the size and unit its stamp records:
    /// 0 for a stale bucket, so eviction ([`crate::table::victim`]) takes it
    /// as drained and `policer top` shows it empty.
    pub fn debt(&self, now_ns: u64) -> u64 {
        let (limit, shift) = unstamp(self.stamp());
        Rule::debt(self.tat, now_ns.wrapping_shl(shift), debt_bound(limit, shift))
    }

    /// Debt at `now_ns` as ns of drain time.
    pub fn debt_ns(&self, now_ns: u64) -> u64 {
        self.debt(now_ns) >> unstamp(self.stamp()).1
    }

    /// Debt at `now_ns` as ns of drain time, never more than the bucket
    /// holds: what `policer top` and `policer inspect` show. [`debt_bound`]
    /// reads debt up to the skew allowance above the size (a clock read
    /// on another CPU, a bucket read against a clock older than its last
    /// charge); a bucket cannot really hold more than its size, so more is
    /// never shown. [`Bucket::debt_ns`] stays uncapped: it is what the
    /// program and eviction rank by.
    pub fn shown_debt_ns(&self, now_ns: u64) -> u64 {
        let (limit, shift) = unstamp(self.stamp());
        min(self.debt(now_ns), limit) >> shift
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

/// The new-source limiter of one rule: an aggregate bucket, scaled to the
/// table, charged by sources that cannot get or keep a bucket of their own.
///
/// A source with no bucket (new, or evicted from a full table) gets a
/// fresh, empty one only while its rule's limiter has budget; each fresh
/// bucket costs one `burst`'s worth of the rule's budget. The limiter
/// refills at `capacity x rate / burst` fresh buckets per second, in
/// bursts of `capacity`: as much fresh budget as a full table of sources
/// at the rule's rate could use. Legitimate churn stays far below that.
/// A population of sources larger than the table, each losing its bucket
/// before it returns, reaches it; from then on such sources are dropped
/// (no bucket is created, so they cause no further evictions) until the
/// limiter refills. Sources holding a bucket, and other rules' sources,
/// are unaffected.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NewSources {
    /// Limiter state, as a bucket's (compare-and-swap).
    pub tat: u64,
    /// Cost of one new source, in 2^-shift ns.
    pub cost: u64,
    /// Limiter size, in 2^-shift ns.
    pub limit: u64,
    pub shift: u32,
    /// Zero: no limit (allow/deny rules, or a limit too high to matter).
    pub enabled: u32,
}

impl NewSources {
    /// The limiter as a packet-mode rule (one "packet" per new source): its
    /// state is read like any bucket's, so a limiter idle for longer than
    /// its period reads as drained, not as a clock that stepped back (see
    /// the module doc).
    #[inline(always)]
    pub fn limiter(&self) -> Rule {
        Rule {
            pkt_cost: self.cost,
            byte_cost: 0,
            limit: self.limit,
            key_mask: [0; 16],
            shift: self.shift,
            action: 0,
            key_len: 0,
            rule_id: 0,
            counter_slot: 0,
            stamp: 0,
            classes: 0,
            flags: 0,
            class_protos: 0,
        }
    }

    /// The limiter for a rule of `rate` units per second and `burst` units
    /// (packets, or bytes in byte mode) in a table of `capacity` buckets,
    /// starting empty at `now_ns`. Its unit is chosen as for any packet
    /// rule ([`Rule::packets`]).
    pub fn for_rule(rate: u64, burst: u64, capacity: u32, now_ns: u64) -> NewSources {
        let rate = (rate as u128 * capacity as u128 / burst.max(1) as u128).clamp(1, u64::MAX as u128) as u64;
        let burst = (capacity as u64).clamp(1, MAX_BURST);
        match Rule::packets(rate, burst) {
            Ok(r) => {
                NewSources { tat: r.empty_tat(now_ns), cost: r.pkt_cost, limit: r.limit, shift: r.shift, enabled: 1 }
            }
            Err(_) => NewSources::default(),
        }
    }
}

#[cfg(test)]
mod tests;
