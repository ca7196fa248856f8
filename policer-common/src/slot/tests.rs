extern crate std;
use std::{vec, vec::Vec};

use proptest::prelude::*;

use super::*;
use crate::{bucket::Action, table::slot_key};

const S: u64 = 1_000_000_000;
/// A time far from 0, so that a bucket's debt never reaches back before it.
const T0: u64 = 1_000 * S;

/// `rate_pps`, `burst`, banning for `ban_for` s after `ban_after`
/// refusals (0: no bans).
fn banning(rate_pps: u64, burst: u64, ban_for: u64, ban_after: u32) -> (Rule, BanParams) {
    let mut r = Rule::packets(rate_pps, burst).unwrap().with_key_len(32, false).unwrap().with_action(Action::Police);
    if ban_for != 0 {
        r.flags |= RULE_BAN;
    }
    let p = BanParams { ban_for_ns: ban_for * S, ban_max_ns: 0, ban_after, ban_within_ms: 0 };
    (r, p)
}

/// A new source's slot as the miss left it, under `rule`, at `now`.
fn fresh(rule: &Rule, now: u64) -> Slot {
    let key = table::stamped(slot_key([192, 0, 2, 1], 32) | table::KEY_VALID, rule.stamp);
    Slot { key, tat: rule.admit(rule.empty_tat(now), now, 64).unwrap() }
}

/// Runs `n` frames at `now` through [`step`], keeping the store as the
/// program does; the verdicts.
fn frames(slot: &mut Slot, store: &mut Option<Ban>, r: &Rule, p: &BanParams, now: u64, n: u64) -> Vec<Outcome> {
    (0..n)
        .map(|_| {
            let s = step(*slot, store.as_ref(), r, p, now, 64);
            *slot = s.slot;
            if let Some(b) = s.started {
                *store = Some(b);
            }
            s.outcome
        })
        .collect()
}

#[test]
fn a_slot_already_the_rules_is_ready_and_its_second_frame_restamps() {
    let (r, _) = banning(10, 5, 0, 1);
    let s = fresh(&r, T0);
    // The miss does not mark it as come back: its second frame does.
    assert_eq!(found(s.key, &r), Found::Restamp { carry: false });
    assert_eq!(found(wanted(s.key, &r), &r), Found::Ready);
    let (other, _) = banning(20, 5, 0, 1);
    assert_eq!(found(s.key, &other), Found::Restamp { carry: true });
}

#[test]
fn refusals_count_then_ban_and_a_rule_without_bans_ignores_them() {
    let word = wanted(slot_key([192, 0, 2, 1], 32) | table::KEY_VALID, &banning(10, 5, 0, 1).0);
    let p = BanParams { ban_for_ns: S, ban_max_ns: 0, ban_after: 3, ban_within_ms: 0 };
    assert_eq!(refusal(word, 1, &p), Refusal::Count(table::stamped(word, ban::counting_stamp(1))));
    assert_eq!(refusal(word, 2, &p), Refusal::Count(table::stamped(word, ban::counting_stamp(2))));
    assert_eq!(refusal(word, 3, &p), Refusal::Ban(table::stamped(word, ban::STAMP_BANNED)));
    assert_eq!(refusal(word, 3, &BanParams { ban_for_ns: 0, ..p }), Refusal::Ignore);
    // A refusal keeps the source: only the stamp changes.
    let Refusal::Count(w) = refusal(word, 1, &p) else { unreachable!() };
    assert_eq!(w & table::KEY_MASK, word & table::KEY_MASK);
}

#[test]
fn a_ban_in_force_in_the_store_is_cached_not_restarted() {
    let p = BanParams { ban_for_ns: 10 * S, ban_max_ns: 0, ban_after: 1, ban_within_ms: 0 };
    let running = ban::start(None, T0, &p, 3);
    assert_eq!(ban_to_start(Some(&running), T0 + S, &p, 3), None);
    let after = ban_to_start(Some(&running), running.end_ns, &p, 3).expect("over: a new one");
    assert_eq!(after.start_ns, running.end_ns);
    // A ban ends at its end, not a nanosecond later.
    assert!(in_force(running.end_ns, running.end_ns - 1));
    assert!(!in_force(running.end_ns, running.end_ns));
}

/// A miss's lookups, scripted: which were asked, in order.
struct Script {
    banned: bool,
    recalled: Option<u64>,
    allowed: bool,
    now: u64,
    asked: Vec<&'static str>,
}

impl MissLookups for Script {
    fn banned(&mut self) -> bool {
        self.asked.push("banned");
        self.banned
    }
    fn recalled(&mut self) -> Option<u64> {
        self.asked.push("recalled");
        self.recalled
    }
    fn new_source_allowed(&mut self) -> bool {
        self.asked.push("limiter");
        self.allowed
    }
    fn now(&mut self) -> u64 {
        self.asked.push("now");
        self.now
    }
}

fn script(banned: bool, recalled: Option<u64>, allowed: bool) -> Script {
    Script { banned, recalled, allowed, now: T0, asked: vec![] }
}

#[test]
fn the_miss_policy_asks_the_store_then_the_recall_then_the_limiter() {
    let (r, _) = banning(10, 5, 60, 1);
    let (plain, _) = banning(10, 5, 0, 1);
    // A ban in the store: dropped before anything else is read.
    let mut l = script(true, None, true);
    assert_eq!(miss(&r, 64, &mut l), Miss::Banned);
    assert_eq!(l.asked, ["banned"]);
    // Rules without bans never look in the store.
    let mut l = script(true, None, true);
    assert!(matches!(miss(&plain, 64, &mut l), Miss::Take { returned: false, .. }));
    assert_eq!(l.asked, ["recalled", "limiter", "now"]);
    // Known to the recall: no limiter, and marked as come back.
    let mut l = script(false, Some(0), false);
    assert!(matches!(miss(&r, 64, &mut l), Miss::Take { returned: true, now_ns: T0, .. }));
    assert_eq!(l.asked, ["banned", "recalled", "now"]);
    // Known in debt up to the whole bucket: its debt refuses the frame.
    let mut l = script(false, Some(u64::MAX), true);
    assert_eq!(miss(&r, 64, &mut l), Miss::DebtDrop);
    // New, and the limiter has none left: no clock read.
    let mut l = script(false, None, false);
    assert_eq!(miss(&r, 64, &mut l), Miss::Limited);
    assert_eq!(l.asked, ["banned", "recalled", "limiter"]);
}

#[test]
fn a_fresh_bucket_has_the_full_burst() {
    let (r, _) = banning(1, 4, 0, 1);
    let mut l = script(false, None, true);
    let Miss::Take { tat, .. } = miss(&r, 64, &mut l) else { panic!("a new source is taken") };
    let mut slot = Slot { key: table::stamped(slot_key([192, 0, 2, 1], 32) | table::KEY_VALID, r.stamp), tat };
    let v = frames(&mut slot, &mut None, &r, &BanParams::default(), T0, 4);
    assert_eq!(v, [Outcome::Admitted, Outcome::Admitted, Outcome::Admitted, Outcome::Refused]);
}

proptest! {
    /// While a ban is in force, no frame is admitted, whatever the rule
    /// (the same, or one changed meanwhile), the frame and the time; and
    /// the slot is not touched.
    #[test]
    fn a_ban_never_admits(
        rate in 1u64..1_000_000,
        burst in 1u64..1_000,
        ban_for in 1u64..3_600,
        ban_after in 1u32..50,
        into in 0u64..3_600 * S,
        len in 0u32..9_000,
        other_rate in 1u64..1_000_000,
    ) {
        let (r, p) = banning(rate, burst, ban_for, ban_after);
        let mut slot = fresh(&r, T0);
        let mut store = None;
        // Refuse until banned: the burst is spent by then.
        let v = frames(&mut slot, &mut store, &r, &p, T0, burst + ban_after as u64 + 1);
        prop_assert_eq!(v.last(), Some(&Outcome::BanDrop));
        let ban = store.expect("a ban started");
        let now = T0 + into % (ban_for * S);
        prop_assert!(now < ban.end_ns);
        for rule in [r, banning(other_rate, burst, ban_for, ban_after).0] {
            let s = step(slot, Some(&ban), &rule, &p, now, len);
            prop_assert_eq!(s.outcome, Outcome::BanDrop);
            prop_assert_eq!(s.slot, slot);
            prop_assert_eq!(s.started, None);
        }
    }

    /// Refusals with no admission between them count up, and the
    /// `--ban-after`-th starts the ban, for the rule's `--ban-for`: not
    /// one before.
    #[test]
    fn the_count_reaches_ban_after_and_bans(
        rate in 1u64..1_000,
        burst in 1u64..100,
        ban_for in 1u64..3_600,
        ban_after in 1u32..200,
    ) {
        let (r, p) = banning(rate, burst, ban_for, ban_after);
        let mut slot = fresh(&r, T0);
        let mut store = None;
        // The rest of the burst (the miss admitted the first frame).
        let admitted = frames(&mut slot, &mut store, &r, &p, T0, burst - 1);
        prop_assert!(admitted.iter().all(|v| *v == Outcome::Admitted));
        for n in 1..ban_after {
            let s = step(slot, store.as_ref(), &r, &p, T0, 64);
            prop_assert_eq!(s.outcome, Outcome::Refused);
            prop_assert_eq!(s.started, None);
            prop_assert_eq!(found(s.slot.key, &r), Found::Counting(n));
            slot = s.slot;
        }
        let s = step(slot, store.as_ref(), &r, &p, T0, 64);
        prop_assert_eq!(s.outcome, Outcome::Refused);
        let ban = s.started.expect("the ban-after-th refusal bans");
        prop_assert_eq!((ban.start_ns, ban.end_ns, ban.rule_slot), (T0, T0 + ban_for * S, r.counter_slot));
        prop_assert_eq!(found(s.slot.key, &r), Found::Banned);
        prop_assert_eq!(s.slot.tat, ban.end_ns);
        prop_assert_eq!(s.slot.source(), slot.source());
    }

    /// An admission ends the count: the next refusals count from one.
    #[test]
    fn an_admission_restarts_the_count(
        rate in 1u64..1_000,
        burst in 1u64..100,
        ban_after in 3u32..200,
        refusals in 1u32..200,
    ) {
        let refusals = refusals % (ban_after - 1) + 1;
        let (r, p) = banning(rate, burst, 60, ban_after);
        let mut slot = fresh(&r, T0);
        let mut store = None;
        frames(&mut slot, &mut store, &r, &p, T0, burst - 1 + refusals as u64);
        prop_assert_eq!(found(slot.key, &r), Found::Counting(refusals));
        // Long enough later, the bucket has room again.
        let later = T0 + 10 * S * burst;
        let s = step(slot, None, &r, &p, later, 64);
        prop_assert_eq!(s.outcome, Outcome::Admitted);
        prop_assert_eq!(found(s.slot.key, &r), Found::Ready);
    }

    /// The frame after a ban's end gets a fresh bucket: `burst` frames at
    /// that instant are admitted, the next is refused.
    #[test]
    fn expiry_restores_the_full_burst(
        rate in 1u64..1_000,
        burst in 1u64..200,
        ban_for in 1u64..3_600,
        ban_after in 1u32..20,
        after in 0u64..3_600 * S,
    ) {
        let (r, p) = banning(rate, burst, ban_for, ban_after);
        let mut slot = fresh(&r, T0);
        let mut store = None;
        frames(&mut slot, &mut store, &r, &p, T0, burst - 1 + ban_after as u64);
        let ban = store.expect("banned");
        let end = ban.end_ns + after;
        let v = frames(&mut slot, &mut store, &r, &p, end, burst + 1);
        prop_assert!(v[..burst as usize].iter().all(|v| *v == Outcome::Admitted), "{v:?}");
        prop_assert_eq!(v[burst as usize], Outcome::Refused);
    }

    /// Without bans, a refusal leaves the bucket as it was: the drop path
    /// writes nothing.
    #[test]
    fn without_bans_a_refusal_writes_nothing(rate in 1u64..1_000, burst in 1u64..100, len in 0u32..9_000) {
        let (r, p) = banning(rate, burst, 0, 1);
        let mut slot = fresh(&r, T0);
        frames(&mut slot, &mut None, &r, &p, T0, burst - 1);
        let s = step(slot, None, &r, &p, T0, len);
        prop_assert_eq!(s.outcome, Outcome::Refused);
        prop_assert_eq!(s.slot.tat, slot.tat);
        // The word the rule wants (a source's second frame swaps it in,
        // admitted or not): from then on, nothing changes.
        prop_assert_eq!(found(s.slot.key, &r), Found::Ready);
        prop_assert_eq!(step(s.slot, None, &r, &p, T0, len).slot, s.slot);
    }
}
