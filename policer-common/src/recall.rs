//! The recall: what the bucket tables forget when they evict, kept in fixed
//! memory so that a source coming back is judged by its past.
//!
//! A reverse bucket at zero debt is no bucket, so under pressure the table
//! evicts a drained source first, and an evicted source that comes back
//! looks new. New sources are rationed by their rule's new-source limiter
//! (see [`crate::NewSources`]), and under a population attack the limiter
//! is spent by attackers: a legitimate low-rate source, evicted between its
//! packets, was refused with them (1 frame of 59 got through in a trial).
//! And an attacker evicted in debt lost that debt.
//!
//! So an eviction writes the evicted source into the recall: a fingerprint
//! of its key and the time its debt ends (the eviction time when it had
//! none). On a table miss the program reads the source's recall set, one
//! cache line of [`RECALL_WAYS`] entries:
//! - **recalled, in debt**: the source resumes that debt (at most its
//!   rule's bucket). A frame the debt refuses is dropped without taking a
//!   slot, so a population of attackers larger than the table cannot churn
//!   it; one it admits takes a slot with the resumed bucket.
//! - **recalled, no debt**, evicted within [`RECALL_WINDOW_NS`]: a known
//!   source. It gets a slot without asking the new-source limiter.
//! - **not recalled**: a new source, rationed by the limiter as before.
//!
//! Every eviction is written, marked *once* when the bucket had drained
//! and its source had not come back ([`crate::table::KEY_RETURNED`]): a
//! spoofed flood is made of such sources, and so is a legitimate client
//! whose bucket was taken after its first frame (under a population attack
//! the drained go first). A set gives up an empty entry first, then the
//! oldest *once* entry, then the oldest of the others: a flood's sources
//! wash out only each other, never a debt or a source that keeps coming
//! back.
//!
//! # What the recall can get wrong, and by how much
//! An entry is a 19-bit fingerprint, the once bit and a 44-bit time; a set
//! holds 8, and a new entry takes the place of the same fingerprint, else
//! as above. So:
//! - **A source forgotten** (its entry pushed out by newer ones: more
//!   evictions worth remembering than the recall holds within the window)
//!   is a new source again: the limiter judges it, as before the recall.
//! - **A false recall** (another source's entry with the same fingerprint
//!   in the same set: about 8 in 2^19 per lookup of a full set) lets a new
//!   source past the limiter, and can give it that other source's debt,
//!   capped at one bucket of its own rule: stricter by at most its burst,
//!   never more permissive than a fresh bucket.
//! - **Rounding**: the time is kept in units of 2^12 ns (4.1 µs), rounded
//!   up where it ends a debt: a resumed debt is at most 4.1 µs more.
//! - **Wrap**: the time wraps every 2^56 ns (834 days). An entry left
//!   untouched in its set for a multiple of that can read as recent again:
//!   at worst the same as a false recall.
//! - Debts longer than 2^54 ns (208 days) are remembered as 208 days.
//!
//! Memory: one 64-byte set per table set ([`crate::table::Geometry::sets`]):
//! 4 entries per source the tables are sized for, 32 bytes per source,
//! shared by both families.

use crate::{bucket::NS_PER_SEC, flat, table::fmix64};

/// Entries per recall set (one cache line).
pub const RECALL_WAYS: usize = 8;
/// The recall's time unit: 2^12 ns.
pub const UNIT_SHIFT: u32 = 12;
/// Bits of an entry that hold the time (in units).
pub const TIME_BITS: u32 = 44;
const TIME_MASK: u64 = (1 << TIME_BITS) - 1;
/// An entry's *once* bit: the source had drained and had not come back.
pub const ONCE: u64 = 1 << TIME_BITS;
/// Where an entry's fingerprint starts, and its bits.
pub const FP_SHIFT: u32 = TIME_BITS + 1;
pub const FP_BITS: u32 = 64 - FP_SHIFT;
/// How long after its eviction (or the end of its debt) a source is still
/// known: it gets a bucket again without asking the new-source limiter.
/// Longer than the gaps of any source worth keeping (a client that sends
/// once a minute is rarely more than a new source); the recall's size, not
/// this window, is what bounds it under a flood.
pub const RECALL_WINDOW_NS: u64 = 120 * NS_PER_SEC;
const WINDOW_UNITS: i64 = (RECALL_WINDOW_NS >> UNIT_SHIFT) as i64;
/// The longest debt kept, in ns (a quarter of the time's range, so the
/// signed reading below never wraps a debt into the past).
pub const MAX_DEBT_NS: u64 = 1 << (TIME_BITS - 2 + UNIT_SHIFT);

/// One set of the recall: [`RECALL_WAYS`] entries, each
/// `fingerprint << FP_SHIFT | once << TIME_BITS | time`; 0 is an empty
/// entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecallSet {
    pub entries: [u64; RECALL_WAYS],
}

/// Where a table's key word is recalled: (set index, fingerprint), for a
/// recall of `sets` sets. `v6` keeps the families' words apart.
#[inline(always)]
pub fn locate(seed: u64, sets: u64, word: u64, v6: bool) -> (u32, u64) {
    let h = fmix64((word & crate::table::KEY_MASK) ^ seed.rotate_left(29) ^ ((v6 as u64) << 63));
    let sets = if sets > u32::MAX as u64 { u32::MAX as u64 } else { sets };
    let fp = h & ((1 << FP_BITS) - 1);
    ((((h >> 32) * sets) >> 32) as u32, if fp == 0 { 1 } else { fp })
}

/// The time `t` (in units) minus `now` (in units), read as a signed number
/// of [`TIME_BITS`] bits.
#[inline(always)]
const fn since(t: u64, now: u64) -> i64 {
    ((t.wrapping_sub(now) << (64 - TIME_BITS)) as i64) >> (64 - TIME_BITS)
}

/// What the recall says of the source with fingerprint `fp` at `now_ns`:
/// `None` if it is not recalled (never evicted, forgotten, or evicted
/// longer than [`RECALL_WINDOW_NS`] ago with no debt left), else the debt
/// in ns it still owes (0: known, no debt). A set holds a fingerprint
/// once ([`place`] reuses its entry): the first fresh entry is the one.
#[inline(always)]
pub fn recall(set: &RecallSet, fp: u64, now_ns: u64) -> Option<u64> {
    let now = now_ns >> UNIT_SHIFT;
    let mut i = 0;
    while i < RECALL_WAYS {
        let e = set.entries[i];
        if e >> FP_SHIFT == fp {
            let d = since(e & TIME_MASK, now);
            if d >= -WINDOW_UNITS {
                return Some(if d > 0 { (d as u64) << UNIT_SHIFT } else { 0 });
            }
        }
        i += 1;
    }
    None
}

/// The entry recording that the source with fingerprint `fp` was evicted
/// at `now_ns` owing `debt_ns`: the time its debt ends, rounded up, and at
/// least `now_ns`; `once` (0 or 1): drained and never come back.
#[inline(always)]
pub fn entry(fp: u64, now_ns: u64, debt_ns: u64, once: u64) -> u64 {
    let debt = if debt_ns > MAX_DEBT_NS { MAX_DEBT_NS } else { debt_ns };
    let end = now_ns.wrapping_add(debt);
    let t = (end >> UNIT_SHIFT) + ((end & ((1 << UNIT_SHIFT) - 1) != 0) as u64);
    (fp << FP_SHIFT) | ((once & 1) << TIME_BITS) | (t & TIME_MASK)
}

/// Where the entry of `fp` goes in `set` at `now_ns`: the entry it already
/// has, else the first empty one, else the oldest *once* entry, else the
/// oldest (the one whose time is furthest in the past). Branch-free.
#[inline(always)]
pub fn place(set: &RecallSet, fp: u64, now_ns: u64) -> usize {
    let now = now_ns >> UNIT_SHIFT;
    let mut best = 1u64 << 62;
    let mut i = 0;
    while i < RECALL_WAYS {
        let e = set.entries[i];
        // Older is lower: `since` is in [-2^43, 2^43).
        let age = (since(e & TIME_MASK, now) + (1 << (TIME_BITS - 1))) as u64;
        let kept = ((e >> TIME_BITS) & 1) ^ 1;
        let score =
            flat::pick(flat::eq(e >> FP_SHIFT, fp), 0, flat::pick(flat::is_zero(e), 1, 2 + age + (kept << TIME_BITS)));
        best = flat::min(best, (score << 3) | i as u64);
        i += 1;
    }
    (best & 7) as usize
}

/// Entries of `set` that would recall a source at `now_ns` (what `stats`
/// reports as the recall's fill).
pub fn live(set: &RecallSet, now_ns: u64) -> usize {
    let now = now_ns >> UNIT_SHIFT;
    set.entries.iter().filter(|&&e| e != 0 && since(e & TIME_MASK, now) >= -WINDOW_UNITS).count()
}

#[cfg(test)]
mod tests;
