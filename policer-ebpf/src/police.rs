//! Policing a source in its family's set-associative table
//! (policer_common::table): the source's slot looked for in its two sets,
//! judged by [`slot_admit`] when found (ready, restamped after a rule
//! change, banned, counting refusals: policer_common::slot::found); on a
//! miss the miss policy (the ban store, the recall, the rule's new-source
//! limiter: policer_common::slot::miss) decides whether it gets a slot,
//! and [`claim`] takes one, sending the source it evicts to the recall.
//! Drops are counted per slot, sampled ([`count_drop`]).

use core::intrinsics::{AtomicOrdering, atomic_or, atomic_xadd};

use aya_ebpf::programs::XdpContext;
use policer_common::{
    BucketKeyV6, Counters, Rule, RuleCounters,
    ban::RULE_BAN,
    recall,
    slot::{self, Found, Miss},
    table::{self, Geometry, KEY_MASK, Set, Slot, WAYS},
};

use crate::{
    bans::{banned, count_slot_ban_drop, refused},
    buckets::{carry_over, cas, judge, new_source_allowed},
    clock::Clock,
    maps::{
        BUCKETS_V4, BUCKETS_V4_DROP, BUCKETS_V4_USED, BUCKETS_V6, BUCKETS_V6_DROP, BUCKETS_V6_KEYS, BUCKETS_V6_USED,
        DROP_SAMPLE_SHIFT, RECALL, Table, TableDrops,
    },
    verifier::launder,
};

/// Where a drop is counted for the source.
pub(crate) enum DropAt {
    Nowhere,
    /// A table's drop array: IPv6 or not, set, way.
    Slot(bool, u32, usize),
}

/// What `police` decided, and where to count a drop.
pub(crate) struct Judged {
    pub(crate) admit: bool,
    pub(crate) drop_at: DropAt,
}

impl Judged {
    pub(crate) const fn new_bucket(admit: bool) -> Judged {
        Judged { admit, drop_at: DropAt::Nowhere }
    }
}

/// The family's table and its drop counts.
#[inline(always)]
fn table_of<const V6: bool>() -> (&'static Table, &'static TableDrops) {
    if V6 { (&BUCKETS_V6, &BUCKETS_V6_DROP) } else { (&BUCKETS_V4, &BUCKETS_V4_DROP) }
}

/// Judges a frame against its source's slot in the family's
/// set-associative table (see policer_common::table): looked for in its
/// first set, then its second; on a miss the recall (policer_common::recall)
/// and the new-source limiter decide. `key` is the source's key word
/// without a stamp, `index` its two sets, `v6_key` the IPv6 source (written
/// beside the slot it claims).
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined glue: the frame's parsed fields, passed as the verifier tracks them"
)]
pub(crate) fn police_table<const V6: bool>(
    ctx: &XdpContext,
    g: &Geometry,
    key: u64,
    index: [u32; 2],
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    len: u32,
    c: &mut Counters,
    rc: &mut RuleCounters,
) -> Judged {
    let (table, _) = table_of::<V6>();
    let Some(first) = table.get_ptr_mut(index[0]) else {
        // No table (not set up by the loader): police nothing.
        c.bucket_insert_failed += 1;
        return Judged::new_bucket(true);
    };
    // SAFETY: `first` and `second` point into the array's values, live for
    // this program run; slots are read with volatile loads because other
    // CPUs write them.
    unsafe {
        // The second set only when the first does not hold the source: a
        // new source, or one whose first set was full when it came (rare).
        // Under a flood of new sources this is a second read, which the
        // benchmark's table-overflow rows measured as no slower.
        let (second, index1) = match table.get_ptr_mut(index[1]) {
            Some(s) if index[1] != index[0] => (s, index[1]),
            _ => (first, index[0]),
        };
        let found = match find(first, key) {
            Some((w, word)) => Some((first, index[0], w, word)),
            None if index1 != index[0] => find(second, key).map(|(w, word)| (second, index1, w, word)),
            None => None,
        };
        if let Some((set, at, w, word)) = found {
            // One place that judges a found slot, whichever set and way
            // (laundered: the verifier walks it once, not per way).
            let w = launder(w as u64) as usize % WAYS;
            let slot = (&raw mut (*set).ways as *mut Slot).add(w);
            let admit = slot_admit::<V6>(ctx, slot, word, v6_key, rule, clock, len, c);
            return Judged { admit, drop_at: DropAt::Slot(V6, at, w) };
        }
        // Not in the table: the miss policy (policer_common::slot::miss)
        // decides whether it gets a slot.
        let (tat, now, returned) = match slot::miss(rule, len, &mut TableMiss::<V6> { g, key, v6_key, rule, clock, c })
        {
            Miss::Take { tat, now_ns, returned } => (tat, now_ns, returned),
            Miss::Banned | Miss::Refused => return Judged::new_bucket(false),
            Miss::DebtDrop => {
                c.recall_debt_drops += 1;
                return Judged::new_bucket(false);
            }
            Miss::Limited => {
                c.new_sources_limited += 1;
                return Judged::new_bucket(false);
            }
        };
        if returned {
            c.recall_known += 1;
        }
        claim::<V6>(
            ctx,
            g,
            [first, second],
            [index[0], index1],
            key,
            v6_key,
            rule,
            clock,
            len,
            c,
            rc,
            tat,
            now,
            returned,
        )
    }
}

/// Claims a slot for a new source the miss policy let in (`tat`, `now`
/// and `returned` its answer): the victim of the source's two sets
/// (`sets`, at `at` in the table; policer_common::table::victim_code),
/// taken by compare-and-swap. The evicted source goes to the recall. When
/// another CPU took the slot for this same source meanwhile, the frame is
/// judged by that bucket.
///
/// # Safety
/// `sets` must point into the family's table, live map values.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined glue: police_table's state at a miss, passed as the verifier tracks it"
)]
unsafe fn claim<const V6: bool>(
    ctx: &XdpContext,
    g: &Geometry,
    sets: [*mut Set; 2],
    at: [u32; 2],
    key: u64,
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    len: u32,
    c: &mut Counters,
    rc: &mut RuleCounters,
    tat: u64,
    now: u64,
    returned: bool,
) -> Judged {
    let (_, drops) = table_of::<V6>();
    // SAFETY: the caller's contract; slots are read with volatile loads
    // because other CPUs write them.
    unsafe {
        let (w0, w1) = (&raw mut (*sets[0]).ways as *mut Slot, &raw mut (*sets[1]).ways as *mut Slot);
        let mut slots = [[Slot::default(); WAYS]; 2];
        for w in 0..WAYS {
            slots[0][w] = core::ptr::read_volatile(w0.add(w));
            slots[1][w] = core::ptr::read_volatile(w1.add(w));
        }
        // The victim as a number the verifier cannot know (else it walks
        // the rest of this path once for each of the eight slots).
        let code = launder(table::victim_code(&slots, now)) & 7;
        let (i, v) = ((code >> 2) as usize, (code & 3) as usize);
        let (ways, index) = if i == 0 { (w0, at[0]) } else { (w1, at[1]) };
        let slot = ways.add(v);
        let old = core::ptr::read_volatile(slot);
        let returned = if returned { table::KEY_RETURNED } else { 0 };
        let seen = cas(&raw mut (*slot).key, old.key, table::stamped(key | returned, rule.stamp));
        if seen == old.key {
            // Ours: the new bucket replaces whatever the slot held, and
            // its drop count starts at zero.
            core::ptr::write_volatile(&raw mut (*slot).tat, tat);
            if let Some(d) = drops.get_ptr_mut(index) {
                core::ptr::write_volatile((&raw mut (*d).ways as *mut u64).add(v), 0);
            }
            if V6 && let Some(k) = BUCKETS_V6_KEYS.get_ptr_mut(index) {
                core::ptr::write_volatile((&raw mut (*k).ways as *mut BucketKeyV6).add(v), *v6_key);
            }
            c.buckets_created += 1;
            rc.buckets_created += 1;
            mark_used::<V6>(index);
            remember::<V6>(g, &old, now, c);
            return Judged::new_bucket(true);
        }
        if seen & KEY_MASK == key {
            // Another CPU made this source's bucket meanwhile: judge by it.
            let admit = slot_admit::<V6>(ctx, slot, seen, v6_key, rule, clock, len, c);
            return Judged { admit, drop_at: DropAt::Slot(V6, index, v) };
        }
    }
    // Lost the slot to another new source: rare; admitted, and counted.
    c.bucket_insert_failed += 1;
    Judged::new_bucket(true)
}

/// Marks set `index` of the family's table as used (a bit of its
/// used-sets bitmap, policer_common::table::used_bit), once: only a new
/// bucket comes here, and only the first in a set writes. An atomic OR
/// (`lock or`): another CPU marking a set of the same word at once cannot
/// cost a mark, as the two compare-and-swap tries before could (a set's
/// sources were then missing from `top` until it was marked again).
#[inline(always)]
fn mark_used<const V6: bool>(index: u32) {
    let (w, bit) = table::used_bit(index);
    let used = if V6 { &BUCKETS_V6_USED } else { &BUCKETS_V4_USED };
    let Some(p) = used.get_ptr_mut(w) else {
        return;
    };
    // SAFETY: a live array value, changed only by atomic operations.
    unsafe {
        if core::ptr::read_volatile(p) & bit == 0 {
            atomic_or::<u64, u64, { AtomicOrdering::SeqCst }>(p, bit);
        }
    }
}

/// What the miss policy reads for a source the table does not hold: the
/// ban store (a banned source whose slot went to a flood of new sources,
/// or that was banned while it had none), the recall, the rule's
/// new-source limiter, the clock.
struct TableMiss<'a, const V6: bool> {
    g: &'a Geometry,
    /// The source's key word (no stamp).
    key: u64,
    v6_key: &'a BucketKeyV6,
    rule: &'a Rule,
    clock: &'a mut Clock,
    c: &'a mut Counters,
}

impl<const V6: bool> slot::MissLookups for TableMiss<'_, V6> {
    #[inline(always)]
    fn banned(&mut self) -> bool {
        banned::<V6>(self.key, self.v6_key, self.clock, self.c)
    }

    /// Read with the time's upper bound when the jiffies give one (a window
    /// of ticks is nothing against the recall's window), so a refused new
    /// source still costs no clock read.
    #[inline(always)]
    fn recalled(&mut self) -> Option<u64> {
        let (rset, fp) = recall::locate(self.g.seed, self.g.sets, self.key, V6);
        RECALL.get(rset).and_then(|s| recall::recall(s, fp, self.clock.approx()))
    }

    #[inline(always)]
    fn new_source_allowed(&mut self) -> bool {
        new_source_allowed(self.rule, self.clock)
    }

    #[inline(always)]
    fn now(&mut self) -> u64 {
        self.clock.now()
    }
}

/// Writes an evicted slot into the recall (policer_common::recall), marked
/// *once* when it had drained and its source had not come back.
#[inline(always)]
fn remember<const V6: bool>(g: &Geometry, old: &Slot, now: u64, c: &mut Counters) {
    if old.key & table::KEY_VALID == 0 {
        return;
    }
    let debt = table::slot_debt_ns(old, now);
    let once = policer_common::flat::is_zero(debt) & (((old.key & table::KEY_RETURNED) >> 39) ^ 1);
    let (rset, fp) = recall::locate(g.seed, g.sets, old.key, V6);
    let Some(s) = RECALL.get_ptr_mut(rset) else {
        return;
    };
    // SAFETY: a live array value; entries are whole words, written plainly
    // (two CPUs placing entries at once can lose one: a source forgotten,
    // judged as new).
    unsafe {
        let set = core::ptr::read_volatile(s);
        let i = launder(recall::place(&set, fp, now) as u64) as usize % recall::RECALL_WAYS;
        core::ptr::write_volatile((&raw mut (*s).entries as *mut u64).add(i), recall::entry(fp, now, debt, once));
    }
    c.recall_stored += 1;
}

/// The way of the set at `set` that holds the source `key`, and its key
/// word as read.
///
/// # Safety
/// `set` must point into a live map value.
#[inline(always)]
unsafe fn find(set: *mut Set, key: u64) -> Option<(usize, u64)> {
    // SAFETY: the caller's contract.
    unsafe {
        let ways = &raw mut (*set).ways as *mut Slot;
        for w in 0..WAYS {
            let word = core::ptr::read_volatile(&(*ways.add(w)).key);
            if word & KEY_MASK == key {
                return Some((w, word));
            }
        }
    }
    None
}

/// Charges a frame to a slot whose key word was read as `word`, carrying
/// the bucket over first if its rule changed size or unit, and marking the
/// source as come back (once per slot). A slot that caches a ban or counts
/// refusals (policer_common::ban) is handled here too, off the path of a
/// slot whose word is already what the rule wants.
///
/// # Safety
/// `slot` must point into a live map value.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined glue: the found slot and the frame, passed as the verifier tracks them"
)]
unsafe fn slot_admit<const V6: bool>(
    // The frame: what the kernel log was given here (a lost
    // compare-and-swap race); kept in the signature of the inlined glue.
    _ctx: &XdpContext,
    slot: *mut Slot,
    word: u64,
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    len: u32,
    c: &mut Counters,
) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        let want = slot::wanted(word, rule);
        // All but Ready are rare (the source's second frame, the first
        // after a rule change, a banned source, a count of refusals).
        match slot::found(word, rule) {
            Found::Ready => {}
            Found::Banned => {
                let end = core::ptr::read_volatile(&(*slot).tat);
                if slot::in_force(end, clock.approx()) || slot::in_force(end, clock.now()) {
                    c.ban_drops += 1;
                    count_slot_ban_drop::<V6>(word, v6_key, clock);
                    return false;
                }
                // The ban is over: a fresh bucket, its full burst.
                let fresh = slot::unbanned(word, rule, clock.now());
                if cas(&raw mut (*slot).key, word, fresh.key) == word {
                    core::ptr::write_volatile(&raw mut (*slot).tat, fresh.tat);
                }
            }
            Found::Counting(n) => {
                if judge(&raw mut (*slot).tat, rule, clock, len, c) {
                    cas(&raw mut (*slot).key, word, want);
                    return true;
                }
                refused::<V6>(slot, word, n + 1, v6_key, rule, clock, c);
                return false;
            }
            Found::Restamp { carry } => {
                if carry {
                    let old = Slot { key: word, tat: core::ptr::read_volatile(&(*slot).tat) };
                    carry_over(&raw mut (*slot).tat, &old.bucket(0), rule, clock);
                }
                cas(&raw mut (*slot).key, word, want);
            }
        }
        let admit = judge(&raw mut (*slot).tat, rule, clock, len, c);
        if !admit && rule.flags & RULE_BAN != 0 {
            refused::<V6>(slot, want, 1, v6_key, rule, clock, c);
        }
        admit
    }
}

/// Counts a drop on its source, sampled (DROP_SAMPLE_SHIFT), to the rule
/// of counter slot `rule_slot` that dropped it: added while the slot's drop
/// word counts that rule's drops (atomic, other CPUs may count drops on
/// the same source), else begun anew with that rule's slot
/// (policer_common::table::drop_word). Only the sampled drop reads the
/// word: the drop path is as it was.
#[inline(always)]
pub(crate) fn count_drop(at: &DropAt, rule_slot: u32, clock: &mut Clock) {
    let DropAt::Slot(v6, set, way) = *at else {
        return;
    };
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let shift = unsafe { core::ptr::read_volatile(&DROP_SAMPLE_SHIFT) } & 15;
    if !clock.sample(shift) {
        return;
    }
    let d = if v6 { BUCKETS_V6_DROP.get_ptr_mut(set) } else { BUCKETS_V4_DROP.get_ptr_mut(set) };
    if let Some(d) = d {
        // SAFETY: live map value; `way` < WAYS.
        unsafe {
            let word = (&raw mut (*d).ways as *mut u64).add(way % WAYS);
            if table::same_dropper(core::ptr::read_volatile(word), rule_slot) {
                atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(word, 1u64 << shift);
            } else {
                // Another rule dropped the count so far: this one's starts.
                // Two CPUs at once may each write theirs; one count is
                // lost, rare and bounded.
                core::ptr::write_volatile(word, table::drop_word(rule_slot, 1u64 << shift));
            }
        }
    }
}
