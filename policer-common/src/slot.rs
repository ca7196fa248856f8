//! The policy of a source's slot: what the program does with a slot it
//! found (the slot/ban state machine of [`crate::ban`]) and with a source
//! the table does not hold (the miss policy of [`crate::table`]), as pure
//! functions of the state, the rule's parameters and the time.
//!
//! The program keeps only the glue: the loads, the compare-and-swaps that
//! move a slot from one state to the next, the map lookups and the counts.
//! Between them it asks these functions what to do. [`step`] composes them
//! the way the program does for one frame on one CPU, so the host tests
//! (and the property tests below) check the decisions the kernel makes.
//!
//! A found slot is in one of four states, read from its key word
//! ([`found`]): the rule's own word (*ready*: charge the bucket), a word of
//! another rule or of a source seen once (*restamp*: carry the bucket over
//! if the rule changed, then take the rule's word), a ban (the slot's `tat`
//! is its end) or a count of refusals. A refusal by a rule with bans counts
//! or bans ([`refusal`]); a ban that is over gives a fresh bucket
//! ([`unbanned`]): the full burst.

use crate::{
    Rule,
    ban::{self, Ban, BanParams, RULE_BAN, SlotBan},
    bucket::STAMP_MASK,
    table::{self, SLOT_STAMP_SHIFT, Slot},
};

/// What a found slot's key word asks for before its bucket is charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Found {
    /// The word is already [`wanted`]: charge the bucket.
    Ready,
    /// The source is banned until the slot's `tat` (ns).
    Banned,
    /// This many refusals since the source was last admitted: charge the
    /// bucket as it stands (the count took the rule's stamp's place, so
    /// there is nothing to carry over); an admission ends the count, a
    /// refusal is the next one ([`refusal`]).
    Counting(u32),
    /// The word is not the rule's yet (the source's second frame, or the
    /// first after a rule change): carry the bucket over to the rule first
    /// when `carry` (the rule changed size or unit), then swap in
    /// [`wanted`].
    Restamp { carry: bool },
}

/// The key word a slot whose word is `word` should have under `rule`: its
/// source, the rule's stamp, and marked as come back.
#[inline(always)]
pub const fn wanted(word: u64, rule: &Rule) -> u64 {
    table::stamped(word, rule.stamp) | table::KEY_RETURNED
}

/// The state of a found slot whose key word is `word`, for `rule`.
#[inline(always)]
pub const fn found(word: u64, rule: &Rule) -> Found {
    if word == wanted(word, rule) {
        return Found::Ready;
    }
    match ban::slot_ban((word >> SLOT_STAMP_SHIFT) as u32) {
        SlotBan::Banned => Found::Banned,
        SlotBan::Counting(n) => Found::Counting(n),
        SlotBan::None => Found::Restamp { carry: word >> SLOT_STAMP_SHIFT != rule.stamp as u64 & STAMP_MASK },
    }
}

/// Whether a ban that ends at `end_ns` is in force at `now_ns`.
#[inline(always)]
pub const fn in_force(end_ns: u64, now_ns: u64) -> bool {
    now_ns < end_ns
}

/// The slot a source gets back when its ban is over at `now_ns`: the
/// rule's word and an empty bucket (its full burst).
#[inline(always)]
pub fn unbanned(word: u64, rule: &Rule, now_ns: u64) -> Slot {
    Slot { key: wanted(word, rule), tat: rule.empty_tat(now_ns) }
}

/// What a refusal does to a slot of a rule with bans.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The rule makes no bans (its `ban_for` is 0): nothing.
    Ignore,
    /// Counted: the slot's new key word.
    Count(u64),
    /// The count reached `--ban-after`: a ban starts; the slot's new key
    /// word (its `tat` becomes the ban's end).
    Ban(u64),
}

/// The `n`-th refusal since the source was last admitted, of a slot whose
/// key word is `word`, under a rule's ban parameters `p`.
#[inline(always)]
pub const fn refusal(word: u64, n: u32, p: &BanParams) -> Refusal {
    if p.ban_for_ns == 0 {
        Refusal::Ignore
    } else if n < p.ban_after {
        Refusal::Count(table::stamped(word, ban::counting_stamp(n)))
    } else {
        Refusal::Ban(table::stamped(word, ban::STAMP_BANNED))
    }
}

/// The ban a refusal starts at `now_ns` given the store's entry for the
/// key (`prev`): `None` when that entry is in force already (another CPU
/// started it, or the slot was made after it began): the slot caches it.
#[inline(always)]
pub const fn ban_to_start(prev: Option<&Ban>, now_ns: u64, p: &BanParams, rule_slot: u32) -> Option<Ban> {
    match prev {
        Some(b) if in_force(b.end_ns, now_ns) => None,
        _ => Some(ban::start(prev, now_ns, p, rule_slot)),
    }
}

/// What the program decides for a frame whose source the table does not
/// hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Miss {
    /// Banned in the store: dropped, no slot (eviction never lifts a ban).
    Banned,
    /// The recall knows it in debt, and the debt refuses the frame:
    /// dropped, no slot.
    DebtDrop,
    /// A new source the rule's new-source limiter refuses: dropped.
    Limited,
    /// A new source whose fresh bucket refuses the frame (a rule whose
    /// burst is below one frame's cost): dropped, no slot.
    Refused,
    /// Admitted: a slot is taken with this `tat` at `now_ns`, marked as come
    /// back ([`table::KEY_RETURNED`]) when the recall knew the source.
    Take { tat: u64, now_ns: u64, returned: bool },
}

/// The lookups a miss may need, in the order [`miss`] makes them: each only
/// when the answers before it leave the frame undecided.
pub trait MissLookups {
    /// Whether the store holds a ban in force for the source (asked only
    /// for rules with bans).
    fn banned(&mut self) -> bool;
    /// The debt (ns) the recall remembers the source with, if it does.
    fn recalled(&mut self) -> Option<u64>;
    /// Takes one new source from the rule's limiter: whether it had one.
    fn new_source_allowed(&mut self) -> bool;
    /// The time, ns.
    fn now(&mut self) -> u64;
}

/// The miss policy of the table: the store's bans first (so a flood that
/// evicts a banned source's slot cannot lift its ban), then the recall (a
/// known source resumes its debt and skips the limiter), then the
/// new-source limiter, then the fresh bucket.
#[inline(always)]
pub fn miss(rule: &Rule, len: u32, l: &mut impl MissLookups) -> Miss {
    if rule.flags & RULE_BAN != 0 && l.banned() {
        return Miss::Banned;
    }
    match l.recalled() {
        Some(debt) => {
            let now = l.now();
            match rule.admit(rule.resumed_tat(now, debt), now, len) {
                Some(tat) => Miss::Take { tat, now_ns: now, returned: true },
                None => Miss::DebtDrop,
            }
        }
        None => {
            if !l.new_source_allowed() {
                return Miss::Limited;
            }
            let now = l.now();
            match rule.admit(rule.empty_tat(now), now, len) {
                Some(tat) => Miss::Take { tat, now_ns: now, returned: false },
                None => Miss::Refused,
            }
        }
    }
}

/// What one frame did to a found slot ([`step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The bucket admitted it.
    Admitted,
    /// The bucket refused it (counted towards a ban, or starting one).
    Refused,
    /// The source is banned: dropped without charging anything.
    BanDrop,
}

/// One frame's effect on a found slot ([`step`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    pub outcome: Outcome,
    /// The slot after the frame.
    pub slot: Slot,
    /// The ban this frame started, to write into the store.
    pub started: Option<Ban>,
}

/// The slot/ban state machine for one frame of `len` bytes at `now_ns`,
/// on one CPU: what the program does to a found slot `slot` under `rule`
/// (with ban parameters `p`; `store`: the ban store's entry for the
/// source), as one pure function. The program makes the same decisions
/// ([`found`], [`refusal`], [`ban_to_start`], [`unbanned`],
/// [`Rule::admit`], [`Rule::rescale`]) with a compare-and-swap between
/// each; a store that is full (no ban written) is not modelled here.
pub fn step(slot: Slot, store: Option<&Ban>, rule: &Rule, p: &BanParams, now_ns: u64, len: u32) -> Step {
    let want = wanted(slot.key, rule);
    let mut s = slot;
    match found(slot.key, rule) {
        Found::Ready => {}
        Found::Banned => {
            if in_force(s.tat, now_ns) {
                return Step { outcome: Outcome::BanDrop, slot: s, started: None };
            }
            s = unbanned(s.key, rule, now_ns);
        }
        Found::Counting(n) => {
            return match rule.admit(s.tat, now_ns, len) {
                Some(tat) => Step { outcome: Outcome::Admitted, slot: Slot { key: want, tat }, started: None },
                None => refuse(s, s.key, n.saturating_add(1), store, rule, p, now_ns),
            };
        }
        Found::Restamp { carry } => {
            if carry {
                s.tat = rule.rescale(&s.bucket(0), now_ns);
            }
            s.key = want;
        }
    }
    match rule.admit(s.tat, now_ns, len) {
        Some(tat) => Step { outcome: Outcome::Admitted, slot: Slot { key: s.key, tat }, started: None },
        None if rule.flags & RULE_BAN != 0 => refuse(s, want, 1, store, rule, p, now_ns),
        None => Step { outcome: Outcome::Refused, slot: s, started: None },
    }
}

/// [`step`] for the `n`-th refusal of a slot whose word is `word`.
fn refuse(s: Slot, word: u64, n: u32, store: Option<&Ban>, rule: &Rule, p: &BanParams, now_ns: u64) -> Step {
    let refused = |slot, started| Step { outcome: Outcome::Refused, slot, started };
    match refusal(word, n, p) {
        Refusal::Ignore => refused(s, None),
        Refusal::Count(key) => refused(Slot { key, tat: s.tat }, None),
        Refusal::Ban(key) => {
            let started = ban_to_start(store, now_ns, p, rule.counter_slot);
            // A ban in force already: the slot caches its end.
            let end = match (&started, store) {
                (Some(b), _) | (None, Some(b)) => b.end_ns,
                (None, None) => now_ns,
            };
            refused(Slot { key, tat: end }, started)
        }
    }
}

#[cfg(test)]
mod tests;
