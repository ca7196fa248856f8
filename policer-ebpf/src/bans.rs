//! Automatic bans (policer_common::ban): a rule with `--ban-after` counts
//! a source's refusals in its slot and, at the count, starts a ban in the
//! ban store (`BANS`, by the source's key), which its slot then caches. A
//! source the table does not hold is looked up in the store on a miss.
//! With `--ban-within` the refusals are counted in a window instead
//! (`BAN_WINDOWS`), admissions or not.
//! A banned source's drops are counted in its ban's entry, sampled.

use core::intrinsics::{AtomicOrdering, atomic_xadd};

use policer_common::{
    BucketKeyV6, Counters, Rule,
    ban::{self, Ban, BanParams},
    class,
    slot::{self, Refusal},
    table::Slot,
};

use crate::{
    buckets::cas,
    clock::Clock,
    maps::{BAN_PARAMS, BAN_WINDOWS, BANS, DROP_SAMPLE_SHIFT},
};

/// A rule with bans refused the source's `n`-th frame since it was last
/// admitted: the slot (whose word is `word`) counts it, or at the rule's
/// `--ban-after` the ban starts (policer_common::ban).
///
/// # Safety
/// `slot` must point into a live map value.
#[inline(always)]
pub(crate) unsafe fn refused<const V6: bool>(
    slot: *mut Slot,
    word: u64,
    n: u32,
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    c: &mut Counters,
) {
    let Some(p) = BAN_PARAMS.get_ptr(rule.counter_slot) else {
        return;
    };
    // SAFETY: the caller's contract; `p` is a live array value.
    unsafe {
        // With `--ban-within` the refusals are counted in the window's map
        // (policer_common::ban), never in the slot.
        let windowed = (*p).ban_within_ms != 0;
        let n = if windowed {
            let Some(key) = ban_key::<V6>(clock, word, v6_key) else {
                return;
            };
            window_count(&*key, clock.now(), &*p)
        } else {
            n
        };
        let banned = match slot::refusal(word, n, &*p) {
            Refusal::Ignore => return,
            Refusal::Count(counted) => {
                if !windowed {
                    cas(&raw mut (*slot).key, word, counted);
                }
                return;
            }
            Refusal::Ban(banned) => banned,
        };
        let Some(key) = ban_key::<V6>(clock, word, v6_key) else {
            return;
        };
        let now = clock.now();
        let prev = BANS.get_ptr_mut(&*key);
        let end = match slot::ban_to_start(prev.map(|b| &*b), now, &*p, rule.counter_slot) {
            // Banned already (another CPU started it, or the slot was made
            // after the ban began): the slot caches it.
            None => prev.map_or(now, |b| core::ptr::read_volatile(&(*b).end_ns)),
            Some(start) => {
                let ban = &raw mut (*clock.scratch).ban;
                *ban = start;
                if BANS.insert(&*key, &*ban, 0).is_err() {
                    c.bans_refused_full += 1;
                    return;
                }
                c.bans_started += 1;
                (*ban).end_ns
            }
        };
        // The word first, then the end: a CPU between the two sees a ban
        // until the bucket's old `tat` (units far past any ns): a drop.
        if cas(&raw mut (*slot).key, word, banned) == word {
            core::ptr::write_volatile(&raw mut (*slot).tat, end);
        }
    }
}

/// A refusal at `now` of the source `key` by a rule with a window
/// (`--ban-within`): the refusals in its window with this one
/// (policer_common::ban::window_refusal). At the rule's `--ban-after` the
/// window is written empty: the next refusal starts a new one. A function
/// of its own (a BPF call), so that its branches are not the caller's.
#[inline(never)]
fn window_count(key: &BucketKeyV6, now: u64, p: &BanParams) -> u32 {
    // SAFETY: a live map value, copied at once (a race of two CPUs loses
    // at most a count).
    let prev = unsafe { BAN_WINDOWS.get(key).copied() };
    let (mut w, ban) = ban::window_refusal(prev.as_ref(), now, p);
    let n = w.count;
    if ban {
        w.count = 0;
    }
    let _ = BAN_WINDOWS.insert(key, &w, 0);
    n
}

/// The store's key of the source (the keyed table's key, or for the IPv4
/// table the mapped form of its key word `word`), written into the CPU's
/// scratch: a pointer to it, for map lookups. None without a scratch.
#[inline(always)]
fn ban_key<const V6: bool>(clock: &Clock, word: u64, v6_key: &BucketKeyV6) -> Option<*mut BucketKeyV6> {
    if clock.scratch.is_null() {
        return None;
    }
    // SAFETY: the scratch is this CPU's live array value.
    unsafe {
        let k = &raw mut (*clock.scratch).ban_key;
        if V6 {
            *k = *v6_key;
        } else {
            // ::ffff:a.b.c.d (policer_common::ban::key_v4), field by field.
            let a = &raw mut (*k).addr as *mut u32;
            a.write(0);
            a.add(1).write(0);
            a.add(2).write(u32::from_ne_bytes([0, 0, 0xff, 0xff]));
            a.add(3).write(word as u32);
            (*k).key_len = ((word >> 32) & 0x3f) as u32 | class::KEY_LEN_V4_MAPPED;
            (*k).class = 0;
        }
        Some(k)
    }
}

/// Whether the source of a table miss is banned (the store's entry for its
/// key has not ended): counted as a ban drop.
#[inline(always)]
pub(crate) fn banned<const V6: bool>(key: u64, v6_key: &BucketKeyV6, clock: &mut Clock, c: &mut Counters) -> bool {
    let Some(k) = ban_key::<V6>(clock, key, v6_key) else {
        return false;
    };
    // SAFETY: `k` is the scratch's key.
    let Some(b) = BANS.get_ptr_mut(unsafe { &*k }) else {
        return false;
    };
    // SAFETY: a live map value; its words change whole.
    let end = unsafe { core::ptr::read_volatile(&(*b).end_ns) };
    if slot::in_force(end, clock.approx()) || slot::in_force(end, clock.now()) {
        c.ban_drops += 1;
        count_ban_drop(b, clock);
        return true;
    }
    false
}

/// Counts a banned source's drop in its ban's entry `b`, sampled as
/// [`crate::police::count_drop`] samples.
#[inline(always)]
fn count_ban_drop(b: *mut Ban, clock: &mut Clock) {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let shift = unsafe { core::ptr::read_volatile(&DROP_SAMPLE_SHIFT) } & 15;
    if clock.sample(shift) {
        // SAFETY: a live map value; other CPUs add to it atomically too.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*b).drops, 1u64 << shift) };
    }
}

/// [`count_ban_drop`] for a banned slot's drop: its entry looked up only
/// when the drop is sampled.
#[inline(always)]
pub(crate) fn count_slot_ban_drop<const V6: bool>(word: u64, v6_key: &BucketKeyV6, clock: &mut Clock) {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let shift = unsafe { core::ptr::read_volatile(&DROP_SAMPLE_SHIFT) } & 15;
    if !clock.sample(shift) {
        return;
    }
    let Some(k) = ban_key::<V6>(clock, word, v6_key) else {
        return;
    };
    // SAFETY: `k` is the scratch's key.
    if let Some(b) = BANS.get_ptr_mut(unsafe { &*k }) {
        // SAFETY: a live map value; other CPUs add to it atomically too.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*b).drops, 1u64 << shift) };
    }
}
