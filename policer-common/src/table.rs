//! The IPv4 bucket table: a set-associative cache in a BPF array.
//!
//! A kernel hash table costs a function call and two dependent cache misses
//! per lookup (the bucket head, then the element), and those misses were
//! most of the policer's cost per packet. Here a source hashes to a
//! [`Set`] of [`WAYS`] 16-byte slots: 64 bytes, one cache line of an array
//! whose lookup the verifier inlines. One miss, no call, and a table half
//! the size of one with 32-byte slots, so fewer pages to miss in the TLB.
//!
//! Two choices: a source may live in either of two sets
//! ([`Geometry::sets_of`]). It is looked for in its first set, and only if
//! absent there in its second; a new source goes to its first set when that
//! has room, else to its second. Nearly every source sits in its first set
//! (one miss per lookup), and a set is full only when both of a source's
//! sets are: with one choice, a few sets of a table loaded to a quarter
//! already hold more sources than ways (22 of 131 072 sets for 65 536
//! sources), and the sources of such a set evict each other on every
//! frame, each getting a fresh bucket and passing at the rate it offers.
//!
//! A slot is two words: the key word (source, key length, and the stamp of
//! the rule that last charged it, see [`crate::bucket::stamp`]) and the
//! bucket's `tat`. What a source has dropped is counted beside the table,
//! in [`SetDrops`], by sampling (see [`DROP_SAMPLE_SHIFT`]), so the drop
//! path does not write the table at all.
//!
//! Eviction is where the reversed bucket pays off: a slot whose bucket has
//! drained holds nothing worth keeping (a *stale* one too, idle so long that
//! its rule's clock wrapped past it: see [`crate::bucket`]), so a new
//! source takes an empty or drained slot first, in its first set, then in its second ([`victim`]).
//! Only when every slot of both sets is in debt does it take the one with
//! the least debt, and only while its rule's new-source limiter allows (as
//! with a full LRU table): a heavy hitter, whose bucket is full, is the
//! last to go. The hash is keyed with a random seed drawn at load, so
//! sources cannot be picked to collide.
//!
//! Compatibility: a source's first set is the one set earlier builds used,
//! so a table they filled is read correctly. An earlier build adopting this
//! build's table would not look in second sets: a source there would get a
//! fresh bucket once.
//!
//! Concurrency: a slot is claimed with a compare-and-swap of its key word,
//! then its `tat` is written. Two CPUs creating the same source both pick
//! the same slot from the same set state, so one claim fails and that CPU
//! finds the key the other wrote. A CPU that races a claim on the same slot
//! can charge one frame against the state being replaced: bounded, rare,
//! as with a hash table that reuses an element. Two CPUs creating the same
//! source while its first set fills up can put it in both sets: it is then
//! charged in its first set, and the second copy drains and is reused.

use crate::{
    Bucket, BucketKeyV4,
    bucket::{STAMP_BITS, STAMP_MASK},
};

/// Slots per set.
pub const WAYS: usize = 4;
/// A slot's key word has this bit set once claimed (0 = never used).
pub const KEY_VALID: u64 = 1 << 38;
/// The bits of a key word that name the source (address, key length,
/// valid bit); the stamp sits above them.
pub const KEY_MASK: u64 = (1 << 39) - 1;
/// Where the stamp of the rule that last charged the slot starts.
pub const SLOT_STAMP_SHIFT: u32 = 64 - STAMP_BITS;

/// One source's bucket and who it belongs to.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot {
    /// [`slot_key`] of the source | the rule's stamp << [`SLOT_STAMP_SHIFT`];
    /// 0 while the slot was never used.
    pub key: u64,
    /// The bucket's state (see [`crate::bucket`]); compare-and-swap.
    pub tat: u64,
}

impl Slot {
    /// The source part of the key word.
    #[inline(always)]
    pub const fn source(&self) -> u64 {
        self.key & KEY_MASK
    }

    /// The stamp of the rule that last charged this slot.
    #[inline(always)]
    pub const fn stamp(&self) -> u32 {
        (self.key >> SLOT_STAMP_SHIFT) as u32
    }

    /// The slot as a [`Bucket`], with `drops` frames dropped.
    pub const fn bucket(&self, drops: u64) -> Bucket {
        Bucket { tat: self.tat, meta: self.stamp() as u64 | (drops << STAMP_BITS) }
    }
}

/// The key word of `source` ([`slot_key`]) charged by a rule with `stamp`.
#[inline(always)]
pub const fn stamped(source: u64, stamp: u32) -> u64 {
    (source & KEY_MASK) | ((stamp as u64 & STAMP_MASK) << SLOT_STAMP_SHIFT)
}

/// The value of the IPv4 bucket array: the slots one hash value selects,
/// one cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Set {
    pub ways: [Slot; WAYS],
}

/// Drops counted for each slot of a set (the array beside the table,
/// same index). Sampled: see [`DROP_SAMPLE_SHIFT`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetDrops {
    pub ways: [u64; WAYS],
}

/// One drop in 2^this is counted, as 2^this drops, at a random drop (a
/// per-CPU xorshift): touching the drops array on every drop would cost a
/// cache miss per dropped frame, the most common frame under attack.
/// Measured by PROG_TEST_RUN at 65 536 sources: counting every 16th drop
/// still cost 9 ns a frame, every 64th 3 ns. A source's count is an
/// unbiased estimate with a standard deviation of sqrt(64 n): within 5 %
/// once it has dropped 25 000 frames, within 1 % at 700 000. The loader
/// can set 0 (exact) for tests.
pub const DROP_SAMPLE_SHIFT: u32 = 6;

/// The table's shape and hash, in a one-entry array map kept with the
/// table (a program that takes the table over must hash alike).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geometry {
    /// Key of the hash (random per table).
    pub seed: u64,
    /// Sets in the table (entries of the array map).
    pub sets: u64,
}

/// The key word of a source: masked address, key length, valid bit.
#[inline(always)]
pub const fn slot_key(addr: [u8; 4], key_len: u32) -> u64 {
    slot_key_word(u32::from_ne_bytes(addr), key_len)
}

/// [`slot_key`] of an address already read as a word (`from_ne_bytes` of
/// its network-order bytes).
#[inline(always)]
pub const fn slot_key_word(addr: u32, key_len: u32) -> u64 {
    addr as u64 | ((key_len as u64 & 0x3f) << 32) | KEY_VALID
}

/// The source a key word stands for (`None` for an unused slot).
pub const fn key_of(key: u64) -> Option<BucketKeyV4> {
    if key & KEY_VALID == 0 {
        return None;
    }
    Some(BucketKeyV4 { addr: (key as u32).to_ne_bytes(), key_len: ((key >> 32) & 0x3f) as u32 })
}

/// Slots per source the table is sized for. Sources do not spread evenly
/// over sets: with one choice of set and one slot per source a full table
/// would hold only ~80 % of them at once (a set gets 4 on average, and
/// more than 4 often); with two slots ~96 %; with two slots and two choices
/// of set ~99.6 %, and at a quarter of its capacity a source without a
/// slot of its own is a rarity (2 in 40 placements of 65 536 in the tests,
/// against ~20 per placement with one choice).
pub const SLOTS_PER_SOURCE: u32 = 2;

/// Sets needed for `capacity` sources.
pub const fn sets_for(capacity: u32) -> u32 {
    let s = (capacity as u64 * SLOTS_PER_SOURCE as u64).div_ceil(WAYS as u64);
    if s == 0 {
        1
    } else if s > u32::MAX as u64 {
        u32::MAX
    } else {
        s as u32
    }
}

impl Geometry {
    /// A table of `sets` sets hashed with `seed`.
    pub const fn new(seed: u64, sets: u32) -> Geometry {
        Geometry { seed, sets: sets as u64 }
    }

    /// The two sets a key word may live in: the key mixed with the seed
    /// (the 64-bit finalizer of MurmurHash3: every input bit moves every
    /// output bit), its high 32 bits scaled to the number of sets (no
    /// division, any number of sets) for the first, which is the one set
    /// of earlier builds, then its low 32 bits alike for the second (the
    /// same set again when there is only one).
    #[inline(always)]
    pub fn sets_of(&self, key: u64) -> [u32; 2] {
        let mut h = key ^ self.seed;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        let sets = if self.sets > u32::MAX as u64 { u32::MAX as u64 } else { self.sets };
        [(((h >> 32) * sets) >> 32) as u32, (((h & 0xffff_ffff) * sets) >> 32) as u32]
    }
}

/// The slot a new source takes at `now_ns`, given its two sets (first,
/// second), as (which set, way): in the first set, the first never-used
/// slot, else the first whose bucket has drained (or is stale, read as
/// drained by [`Bucket::debt`]); then the same in the
/// second set; else, of the two sets, the slot with the least debt (in ns
/// of drain time), the first set's on a tie. Free slots of the first set
/// go first, so that sources stay where they are found with one read.
#[inline(always)]
pub fn victim(sets: &[[Slot; WAYS]; 2], now_ns: u64) -> (usize, usize) {
    let (w0, d0) = victim_in(&sets[0], now_ns);
    if d0 == 0 {
        return (0, w0);
    }
    let (w1, d1) = victim_in(&sets[1], now_ns);
    if d1 < d0 { (1, w1) } else { (0, w0) }
}

/// Within one set: the first never-used slot, else the first drained one,
/// else the one with the least debt; and that debt (0: free).
#[inline(always)]
fn victim_in(slots: &[Slot; WAYS], now_ns: u64) -> (usize, u64) {
    let mut best = 0;
    let mut best_debt = u64::MAX;
    for (w, slot) in slots.iter().enumerate() {
        if slot.key == 0 {
            return (w, 0);
        }
        let d = slot.bucket(0).debt_ns(now_ns);
        if d < best_debt {
            best = w;
            best_debt = d;
        }
    }
    (best, best_debt)
}

#[cfg(test)]
mod tests;
