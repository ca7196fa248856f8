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
    Bucket, BucketKeyV4, BucketKeyV6,
    bucket::{STAMP_BITS, STAMP_MASK},
    flat,
};

/// Slots per set.
pub const WAYS: usize = 4;
/// A slot's key word has this bit set once claimed (0 = never used).
pub const KEY_VALID: u64 = 1 << 38;
/// The bits of a key word that name the source (address, key length,
/// valid bit); the stamp sits above them.
pub const KEY_MASK: u64 = (1 << 39) - 1;
/// A slot's key word has this bit set once its source has come back: it
/// was found in the table after the frame that created its bucket, or it
/// was let in by the recall (see [`crate::recall`]). Among drained slots
/// the eviction takes one without it first: a source seen once (the mark
/// of a spoofed flood) goes before one that keeps coming back.
pub const KEY_RETURNED: u64 = 1 << 39;
/// The bits of an IPv6 key word's fingerprint (see [`Geometry::hash_v6`]).
pub const FINGERPRINT_MASK: u64 = (1 << 38) - 1;
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

    /// Whether the source came back since its bucket was made
    /// ([`KEY_RETURNED`]).
    #[inline(always)]
    pub const fn returned(&self) -> bool {
        self.key & KEY_RETURNED != 0
    }

    /// The stamp of the rule that last charged this slot.
    #[inline(always)]
    pub const fn stamp(&self) -> u32 {
        (self.key >> SLOT_STAMP_SHIFT) as u32
    }

    /// The slot as a [`Bucket`], with the drops its drop word
    /// ([`SetDrops`]) counts.
    pub const fn bucket(&self, drop_word: u64) -> Bucket {
        Bucket { tat: self.tat, meta: self.stamp() as u64 | (drop_count(drop_word) << STAMP_BITS) }
    }
}

/// The key word of `source` ([`slot_key`], and [`KEY_RETURNED`] if set)
/// charged by a rule with `stamp`.
#[inline(always)]
pub const fn stamped(source: u64, stamp: u32) -> u64 {
    (source & (KEY_MASK | KEY_RETURNED)) | ((stamp as u64 & STAMP_MASK) << SLOT_STAMP_SHIFT)
}

/// The value of the IPv4 bucket array: the slots one hash value selects,
/// one cache line.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Set {
    pub ways: [Slot; WAYS],
}

/// Drops counted for each slot of a set (the array beside the table,
/// same index), each a drop word ([`drop_word`]: the count and the rule
/// that dropped them). Sampled: see [`DROP_SAMPLE_SHIFT`].
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

/// How far a sampled drop count `n` (one drop in 2^`shift` counted, as
/// 2^`shift`) may be from the true count: two standard deviations,
/// 2·sqrt(2^shift · n), which holds the truth 19 times in 20 (issue 43,
/// point 3: an estimate is shown as one). 0 when every drop is counted.
pub const fn drop_count_margin(n: u64, shift: u32) -> u64 {
    if shift == 0 || n == 0 {
        return 0;
    }
    2 * n.saturating_mul(1 << shift).isqrt()
}

/// The words of a table's used-sets bitmap (the array beside it,
/// [`crate::MAP_BUCKETS_V4_USED`]) for `sets` sets: a bit a set. The
/// program sets a set's bit when it claims a slot of it, and never clears
/// it (a drained slot stays its set's), so a reader of the table (`policer
/// top`, the live count) can read only the sets marked: its cost follows
/// the sets a table has used, not its size (issue 43, point 3: a `top`
/// of four sources read the whole table, 0.35–1 s of the daemon's CPU).
pub const fn used_words(sets: u32) -> u32 {
    let w = sets.div_ceil(64);
    if w == 0 { 1 } else { w }
}

/// Where set `set`'s bit is in the used-sets bitmap: (word, bit).
#[inline(always)]
pub const fn used_bit(set: u32) -> (u32, u64) {
    (set / 64, 1u64 << (set % 64))
}

/// The sets a used-sets bitmap marks, in order.
pub fn used_sets(words: &[u64]) -> impl Iterator<Item = u32> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        let mut bits = w;
        core::iter::from_fn(move || {
            if bits == 0 {
                return None;
            }
            let b = bits.trailing_zeros();
            bits &= bits - 1;
            Some(i as u32 * 64 + b)
        })
    })
}

/// The bits of a drop word that count drops; above them, the counter slot
/// of the rule that dropped them. 2^40 drops of one source before the count
/// would reach the slot's bits, as [`Bucket::drops`] has.
pub const DROP_COUNT_BITS: u32 = 40;
/// A drop word's count.
pub const DROP_COUNT_MASK: u64 = (1 << DROP_COUNT_BITS) - 1;
/// The counter slots a drop word holds (every rule slot: at most
/// `MAX_RULES` + 1 of them).
pub const DROP_SLOT_MASK: u64 = (1 << (64 - DROP_COUNT_BITS)) - 1;

/// A slot's drop word: `n` drops, all by the rule of counter slot
/// `rule_slot`. A source's drops are credited to the rule that dropped
/// them, not to whichever covers it when they are read (issue 43, point
/// 3): the program keeps counting while the same rule drops
/// ([`same_dropper`]) and starts a new count, with the new rule's slot,
/// when another does. So a count is always one rule's.
#[inline(always)]
pub const fn drop_word(rule_slot: u32, n: u64) -> u64 {
    ((rule_slot as u64 & DROP_SLOT_MASK) << DROP_COUNT_BITS) | (n & DROP_COUNT_MASK)
}

/// Whether the drops of the word `word` are the rule of `rule_slot`'s
/// (a drop of it then adds to the count).
#[inline(always)]
pub const fn same_dropper(word: u64, rule_slot: u32) -> bool {
    word >> DROP_COUNT_BITS == rule_slot as u64 & DROP_SLOT_MASK
}

/// The drops a drop word counts.
#[inline(always)]
pub const fn drop_count(word: u64) -> u64 {
    word & DROP_COUNT_MASK
}

/// The counter slot of the rule whose drops a drop word counts; none when
/// it counts none, or the word was written by a build before the slot was
/// recorded (slot 0 is no rule's).
pub const fn dropped_by(word: u64) -> Option<u32> {
    let slot = (word >> DROP_COUNT_BITS) as u32;
    if slot == 0 || drop_count(word) == 0 { None } else { Some(slot) }
}

/// The IPv6 sources of one set, beside the IPv6 table (same index): the
/// table's slots hold a fingerprint of the source ([`Geometry::hash_v6`]);
/// the address is written here when a slot is claimed, for user space
/// (`policer top`, `inspect`) and never read by the program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetKeys {
    pub ways: [BucketKeyV6; WAYS],
}

/// The tables' shape and hash, in a one-entry array map kept with them (a
/// program that takes the tables over must hash alike). Both families'
/// tables, and the recall, have `sets` sets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Geometry {
    /// Key of the hash (random per table).
    pub seed: u64,
    /// Sets in each table (entries of the array maps).
    pub sets: u64,
    /// Sources each table is sized for (`--max-sources`).
    pub capacity: u64,
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

/// The 64-bit finalizer of MurmurHash3: every input bit moves every
/// output bit.
#[inline(always)]
pub const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

impl Geometry {
    /// Tables for `capacity` sources ([`sets_for`] sets) hashed with `seed`.
    pub const fn new(seed: u64, capacity: u32) -> Geometry {
        Geometry { seed, sets: sets_for(capacity) as u64, capacity: capacity as u64 }
    }

    /// `h`'s high 32 bits, then its low 32 bits, each scaled to the number
    /// of sets (no division, any number of sets).
    #[inline(always)]
    pub fn sets_of_hash(&self, h: u64) -> [u32; 2] {
        let sets = if self.sets > u32::MAX as u64 { u32::MAX as u64 } else { self.sets };
        [(((h >> 32) * sets) >> 32) as u32, (((h & 0xffff_ffff) * sets) >> 32) as u32]
    }

    /// A keyed-table source's hash: the masked address (network order, as
    /// two words read with `from_ne_bytes`), key length (up to 9 bits) and
    /// class, mixed with the seed. Its sets are [`Geometry::sets_of_hash`] of it, its key word
    /// [`v6_key_word`] of it.
    #[inline(always)]
    pub fn hash_v6(&self, hi: u64, lo: u64, key_len: u32, class: u32) -> u64 {
        let h = fmix64(hi ^ self.seed ^ 0x6a09_e667_f3bc_c908);
        fmix64(h ^ lo ^ ((key_len as u64) << 52 | key_len as u64 | (class as u64) << 16))
    }

    /// [`Geometry::hash_v6`] of a key of the keyed table.
    #[inline(always)]
    pub fn hash_key(&self, k: &BucketKeyV6) -> u64 {
        let a = &k.addr;
        let hi = u64::from_ne_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]);
        let lo = u64::from_ne_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]);
        self.hash_v6(hi, lo, k.key_len, k.class)
    }

    /// The two sets a key word may live in: the key mixed with the seed
    /// (the 64-bit finalizer of MurmurHash3: every input bit moves every
    /// output bit), its high 32 bits scaled to the number of sets (no
    /// division, any number of sets) for the first, which is the one set
    /// of earlier builds, then its low 32 bits alike for the second (the
    /// same set again when there is only one).
    #[inline(always)]
    pub fn sets_of(&self, key: u64) -> [u32; 2] {
        self.sets_of_hash(fmix64(key ^ self.seed))
    }
}

/// The key word of an IPv6 source whose [`Geometry::hash_v6`] is `h`: 38
/// bits of fingerprint, mixed again so they are independent of the bits
/// that chose the sets, and the valid bit. An IPv6 key (up to 128 bits and
/// its length) does not fit in a slot beside the bucket, so the slot keeps
/// the fingerprint and the address goes to [`SetKeys`]. Two sources are
/// confused only if they share a set *and* 38 bits of fingerprint: about
/// 8 in 2^38 per lookup of a source that is not in the table, and the
/// seed is secret, so nobody can aim for it. The cost is the same for
/// every key length: two hash rounds, and a write of the address when a
/// slot is claimed.
#[inline(always)]
pub const fn v6_key_word(h: u64) -> u64 {
    (fmix64(h ^ 0xbb67_ae85_84ca_a73b) & FINGERPRINT_MASK) | KEY_VALID
}

/// The slot a new source takes at `now_ns`, given its two sets (first,
/// second), as (which set, way): the lowest [`rank`], the first set's and
/// then the lowest way on a tie. So a free slot (never used, or drained
/// and seen once) of the first set first, so that sources stay where they
/// are found with one read; then one of the second; then a drained slot
/// whose source came back ([`KEY_RETURNED`]); then the least debt (in ns
/// of drain time): zero debt before any debt, as always, and a heavy
/// hitter's full bucket last. Branch-free (see [`crate::flat`]).
#[inline(always)]
pub fn victim(sets: &[[Slot; WAYS]; 2], now_ns: u64) -> (usize, usize) {
    let code = victim_code(sets, now_ns);
    ((code >> 2) as usize & 1, code as usize & 3)
}

/// [`victim`] as one number: set * [`WAYS`] + way.
#[inline(always)]
pub fn victim_code(sets: &[[Slot; WAYS]; 2], now_ns: u64) -> u64 {
    let mut best = 1u64 << 62;
    let mut s = 0;
    while s < 2 {
        let mut w = 0;
        while w < WAYS {
            let r = rank(&sets[s][w], now_ns);
            best = flat::min(best, (r << 3) | (s * WAYS + w) as u64);
            w += 1;
        }
        s += 1;
    }
    best & 7
}

/// [`rank`] of a free slot: never used, or drained and seen once.
pub const RANK_FREE: u64 = 0;
/// [`rank`] of a drained slot whose source came back.
pub const RANK_DRAINED_RETURNED: u64 = 1;
/// Debts above this many ns (9 years) rank alike.
const RANK_MAX_DEBT_NS: u64 = 1 << 58;

/// How readily a slot is given up (lower first): [`RANK_FREE`],
/// [`RANK_DRAINED_RETURNED`], else 2 + its debt in ns. Branch-free.
#[inline(always)]
pub fn rank(slot: &Slot, now_ns: u64) -> u64 {
    let debt = flat::min(slot_debt_ns(slot, now_ns), RANK_MAX_DEBT_NS);
    let returned = (slot.key >> 39) & 1;
    let used = flat::is_zero(slot.key) ^ 1;
    used * flat::pick(flat::is_zero(debt), returned, debt + 2)
}

/// A slot's debt at `now_ns` in ns of drain time: what
/// `slot.bucket(0).debt_ns(now_ns)` reads (see [`Bucket::debt`]) for every
/// stamp a rule makes, worked out without a branch (a stamp no rule makes
/// reads as a size of at most 2^62).
#[inline(always)]
pub fn slot_debt_ns(slot: &Slot, now_ns: u64) -> u64 {
    use crate::bucket::{MAX_LIMIT, MAX_SHIFT, SKEW_ALLOWANCE_NS};
    let stamp = slot.stamp() as u64;
    let shift = flat::min(stamp & 31, MAX_SHIFT as u64);
    let exp = flat::min((stamp >> 5) & 63, 49);
    let mant = (stamp >> 11) & 0x1fff;
    let limit = flat::min(mant << exp, MAX_LIMIT);
    let bound = limit + (limit >> 11) + (SKEW_ALLOWANCE_NS << shift);
    let d = slot.tat.wrapping_sub(now_ns.wrapping_shl(shift as u32));
    // Debt when d < 2^62 and d <= bound (bound < 2^62), else drained.
    let ok = flat::is_zero(d >> 62) & (flat::lt(bound, d & ((1 << 62) - 1)) ^ 1);
    (d & ok.wrapping_neg()) >> shift
}

#[cfg(test)]
mod tests;
