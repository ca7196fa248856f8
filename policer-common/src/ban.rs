//! Automatic bans (`--ban-for`): the store, the slot's cache of a ban, and
//! the escalation arithmetic. One definition for the program and user
//! space.
//!
//! **The store** (`BANS`, [`crate::MAP_BANS`]) is a preallocated hash (not
//! LRU) keyed by the bucket key as [`BucketKeyV6`]: an IPv6 source or a
//! class bucket as the keyed table knows it, a plain IPv4 source as
//! `::ffff:a.b.c.d` with [`crate::KEY_LEN_V4_MAPPED`] ([`key_v4`]).
//! A flood of new sources cannot push a ban out: the kernel never evicts
//! from it. When it is full the program makes no new ban (the source stays
//! policed by its bucket) and counts it (`bans_refused_full`); entries are
//! removed only by user space, once a ban's escalation window is over
//! ([`forgettable`]) or when an operator lifts it. Each entry costs the
//! kernel's preallocated element: a 48-byte header, the 24-byte key and the
//! 40-byte [`Ban`], about 112 bytes (29 MiB at [`DEFAULT_MAX_BANS`]).
//!
//! **The slot's cache.** A banned source's slot in the bucket table says
//! so in its stamp ([`STAMP_BANNED`]: a stamp's low 5 bits are a rule's time
//! shift, at most 16, so 31 and 30 never come from a rule) and holds the
//! ban's end (ns) where the bucket's `tat` was: a frame of a banned source
//! found in the table is dropped from the slot it had to read anyway, with
//! no clock read while the clock's cheap upper bound is before the end. Only
//! the frame after the end reads the clock; it gives the source a fresh
//! bucket (its full burst) and is judged by it. A source with no slot (its
//! slot evicted by a flood) is looked up in the store before it may have a
//! new one, so eviction cannot lift a ban. Rules without bans never look.
//!
//! **Counting in a window** (`--ban-after N --ban-within W`, fail2ban's
//! maxretry and findtime): refusals are counted in a map of their own
//! (`BAN_WINDOWS`, an LRU keyed as the store), admissions or not, from the
//! first refusal of a window for `W` ([`window_refusal`]); the N-th within
//! it starts the ban, and the next refusal after `W` starts a new window.
//! The slot stays the rule's (no counting stamp). Rules without
//! `--ban-within` count as below.
//!
//! **Counting** (`--ban-after N > 1`): refusals since the source was last
//! admitted are counted in the stamp ([`STAMP_COUNTING`], the count in its
//! upper 19 bits) until the N-th starts the ban; an admission ends the
//! count. While counting, the stamp of the rule is not in the slot: a rule
//! change in that window is not carried over (the bucket is judged by the
//! new rule as it stands: at most one burst of difference, once).

use crate::{BucketKeyV6, KEY_LEN_V4_MAPPED, mapped_v4};

// The store's values and the rules' parameters are map values, defined
// with the other keys and values in `maps`; they keep their paths here.
pub use crate::{Ban, BanParams, BanWindow};

/// Rule flag ([`crate::Rule::flags`]): the rule bans sources (its
/// [`BanParams`] are in `BAN_PARAMS` at its counter slot).
pub const RULE_BAN: u32 = 8;
/// Entries of the store unless the loader is told otherwise.
pub const DEFAULT_MAX_BANS: u32 = 262_144;
/// Low 5 bits of a slot stamp that caches a ban (the `tat` word is the
/// ban's end, ns).
pub const STAMP_BANNED: u32 = 31;
/// Low 5 bits of a slot stamp that counts refusals (the count above).
pub const STAMP_COUNTING: u32 = 30;
/// Bits of the refusal count in a counting stamp (a stamp has 24).
const COUNT_BITS: u32 = 19;
/// The largest `--ban-after`.
pub const MAX_BAN_AFTER: u32 = (1 << COUNT_BITS) - 1;

/// What a slot's stamp says of bans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotBan {
    /// A rule's stamp: no ban, no count.
    None,
    /// Banned: the slot's `tat` is the end, ns.
    Banned,
    /// Counting refusals: this many so far.
    Counting(u32),
}

/// Reads a slot's stamp ([`crate::table::Slot::stamp`]).
#[inline(always)]
pub const fn slot_ban(stamp: u32) -> SlotBan {
    match stamp & 31 {
        STAMP_BANNED => SlotBan::Banned,
        STAMP_COUNTING => SlotBan::Counting((stamp >> 5) & MAX_BAN_AFTER),
        _ => SlotBan::None,
    }
}

/// The stamp of a slot that has counted `n` refusals.
#[inline(always)]
pub const fn counting_stamp(n: u32) -> u32 {
    STAMP_COUNTING | ((if n > MAX_BAN_AFTER { MAX_BAN_AFTER } else { n }) << 5)
}

/// Whether a ban starting at `now_ns` follows `prev` closely enough to
/// grow from it: within twice its length after it ended.
#[inline(always)]
const fn grows_from(prev: &Ban, now_ns: u64) -> bool {
    now_ns < prev.end_ns.saturating_add(prev.len_ns.saturating_mul(2))
}

/// The length of a ban that starts at `now_ns`, given the key's entry in
/// the store (`prev`): twice the last one when the last one ended within
/// twice its length and the rule lets bans grow (capped at `ban_max_ns`,
/// never below `ban_for_ns`); else `ban_for_ns`.
#[inline(always)]
pub const fn ban_length(prev: Option<&Ban>, now_ns: u64, p: &BanParams) -> u64 {
    let base = p.ban_for_ns;
    match prev {
        Some(prev) if p.ban_max_ns != 0 && grows_from(prev, now_ns) => {
            let grown = prev.len_ns.saturating_mul(2);
            let capped = if grown > p.ban_max_ns { p.ban_max_ns } else { grown };
            if capped < base { base } else { capped }
        }
        _ => base,
    }
}

/// The ban that starts at `now_ns` for a key whose entry is `prev`.
#[inline(always)]
pub const fn start(prev: Option<&Ban>, now_ns: u64, p: &BanParams, rule_slot: u32) -> Ban {
    let len = ban_length(prev, now_ns, p);
    let count = match prev {
        Some(b) if p.ban_max_ns != 0 && grows_from(b, now_ns) => b.count.saturating_add(1),
        _ => 1,
    };
    Ban { end_ns: now_ns.saturating_add(len), len_ns: len, start_ns: now_ns, drops: 0, rule_slot, count }
}

/// A refusal at `now_ns` of a source whose window (`--ban-within`) is
/// `prev`: the window after it, and whether it starts the ban (the
/// `ban_after`-th refusal within `ban_within_ms` of the window's first). A
/// window that is over (or none) starts again with this refusal; a ban
/// starts the next window afresh (the caller removes the entry).
#[inline(always)]
pub const fn window_refusal(prev: Option<&BanWindow>, now_ns: u64, p: &BanParams) -> (BanWindow, bool) {
    let within_ns = p.ban_within_ms as u64 * 1_000_000;
    let w = match prev {
        Some(w) if now_ns >= w.start_ns && now_ns - w.start_ns < within_ns => {
            BanWindow { start_ns: w.start_ns, count: w.count.saturating_add(1), _pad: 0 }
        }
        _ => BanWindow { start_ns: now_ns, count: 1, _pad: 0 },
    };
    let ban = w.count >= p.ban_after;
    (w, ban)
}

/// Whether user space may remove an entry at `now_ns`: its ban ended and
/// a new one could no longer grow from it (twice its length has passed).
pub const fn forgettable(b: &Ban, now_ns: u64) -> bool {
    now_ns >= b.end_ns.saturating_add(b.len_ns.saturating_mul(2))
}

/// The store's key of a plain IPv4 source (masked to `key_len` bits).
#[inline(always)]
pub const fn key_v4(addr: [u8; 4], key_len: u32) -> BucketKeyV6 {
    BucketKeyV6 { addr: mapped_v4(addr), key_len: key_len | KEY_LEN_V4_MAPPED, class: 0 }
}

/// The store's key of an IPv4 table slot's key word
/// ([`crate::table::slot_key_word`]).
#[inline(always)]
pub const fn key_of_v4_word(word: u64) -> BucketKeyV6 {
    key_v4((word as u32).to_ne_bytes(), ((word >> 32) & 0x3f) as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bucket::{MAX_SHIFT, stamp};

    const S: u64 = 1_000_000_000;

    fn p(ban_for: u64, ban_max: u64) -> BanParams {
        BanParams { ban_for_ns: ban_for * S, ban_max_ns: ban_max * S, ban_after: 1, ban_within_ms: 0 }
    }

    #[test]
    fn no_rule_stamp_reads_as_a_ban_or_a_count() {
        for shift in 0..=MAX_SHIFT {
            for limit in [0u64, 1, 2, 1000, 1 << 20, 1 << 40, u64::MAX] {
                assert_eq!(slot_ban(stamp(limit, shift)), SlotBan::None, "limit {limit} shift {shift}");
            }
        }
        assert_eq!(slot_ban(STAMP_BANNED), SlotBan::Banned);
        for n in [0, 1, 2, 1000, MAX_BAN_AFTER] {
            assert_eq!(slot_ban(counting_stamp(n)), SlotBan::Counting(n));
            assert!(counting_stamp(n) as u64 <= crate::bucket::STAMP_MASK, "fits a slot's stamp");
        }
        assert_eq!(slot_ban(counting_stamp(u32::MAX)), SlotBan::Counting(MAX_BAN_AFTER));
    }

    #[test]
    fn bans_grow_within_twice_their_length_up_to_the_max_and_reset_after() {
        let p = p(3, 20);
        let first = start(None, 100 * S, &p, 7);
        assert_eq!((first.end_ns, first.len_ns, first.count, first.rule_slot), (103 * S, 3 * S, 1, 7));
        // Banned again 5 s after it ended (within 6 s): twice as long.
        let second = start(Some(&first), 108 * S, &p, 7);
        assert_eq!((second.len_ns, second.count), (6 * S, 2));
        let third = start(Some(&second), second.end_ns + 11 * S, &p, 7);
        assert_eq!((third.len_ns, third.count), (12 * S, 3));
        // Capped at the max.
        let fourth = start(Some(&third), third.end_ns, &p, 7);
        assert_eq!((fourth.len_ns, fourth.count), (20 * S, 4));
        let fifth = start(Some(&fourth), fourth.end_ns + S, &p, 7);
        assert_eq!((fifth.len_ns, fifth.count), (20 * S, 5));
        // Quiet for twice the last length: back to the start.
        let later = start(Some(&fifth), fifth.end_ns + 40 * S, &p, 7);
        assert_eq!((later.len_ns, later.count), (3 * S, 1));
        assert!(forgettable(&fifth, fifth.end_ns + 40 * S));
        assert!(!forgettable(&fifth, fifth.end_ns + 40 * S - 1));
    }

    /// `--ban-after 20 --ban-within 60s`: a source refused 100 times a
    /// second (admitted 5 times a second between) is banned at its 20th
    /// refusal, 0.19 s in; one refused 19 times a minute never is; a
    /// window that is over starts again.
    #[test]
    fn refusals_are_counted_in_their_window_admissions_or_not() {
        let p = BanParams { ban_for_ns: 600 * S, ban_max_ns: 0, ban_after: 20, ban_within_ms: 60_000 };
        let mut w = None;
        let mut banned_at = None;
        for i in 0..100u64 {
            let (next, ban) = window_refusal(w.as_ref(), i * S / 100, &p);
            if ban {
                banned_at = Some(i);
                break;
            }
            w = Some(next);
        }
        assert_eq!(banned_at, Some(19), "the 20th refusal");
        let mut w = None;
        for i in 0..200u64 {
            // 19 refusals a minute, spread evenly.
            let (next, ban) = window_refusal(w.as_ref(), i * 60 * S / 19 + S, &p);
            assert!(!ban, "refusal {i}: 19 a minute never reach 20 in 60 s");
            w = Some(next);
        }
        let first = BanWindow { start_ns: 10 * S, count: 19, _pad: 0 };
        assert!(window_refusal(Some(&first), 69 * S, &p).1, "the 20th within 60 s");
        let (again, ban) = window_refusal(Some(&first), 70 * S, &p);
        assert_eq!((again.start_ns, again.count, ban), (70 * S, 1, false), "the window is over: it starts again");
        // A clock before the window's start (another CPU's earlier
        // reading): a new window, never a negative span.
        assert_eq!(window_refusal(Some(&first), 9 * S, &p).0.count, 1);
    }

    #[test]
    fn without_a_max_bans_do_not_grow() {
        let p = p(3, 0);
        let first = start(None, 0, &p, 1);
        let again = start(Some(&first), first.end_ns + S, &p, 1);
        assert_eq!((again.len_ns, again.count), (3 * S, 1));
    }

    #[test]
    fn ipv4_keys_are_the_mapped_form_the_keyed_table_uses() {
        let k = key_v4([192, 0, 2, 7], 32);
        assert_eq!(k.key_len, 32 | KEY_LEN_V4_MAPPED);
        assert_eq!(&k.addr[10..], &[0xff, 0xff, 192, 0, 2, 7]);
        let word = crate::table::slot_key_word(u32::from_ne_bytes([192, 0, 2, 7]), 32);
        assert_eq!(key_of_v4_word(word), k);
        let b = crate::BucketKey::from(k);
        assert_eq!((b.family, b.key_len, &b.addr[..4]), (crate::FAMILY_V4, 32, &[192u8, 0, 2, 7][..]));
    }
}
