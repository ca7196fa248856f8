use super::*;
use crate::Rule;
use proptest::prelude::*;

extern crate std;

const S: u64 = NS_PER_SEC;

fn set_with(entries: &[u64]) -> RecallSet {
    let mut s = RecallSet::default();
    s.entries[..entries.len()].copy_from_slice(entries);
    s
}

#[test]
fn a_debt_is_recalled_until_it_ends_then_the_source_is_known_for_the_window() {
    let now = 1_000 * S;
    let set = set_with(&[entry(7, now, 3 * S, 0)]);
    // Rounded up to a unit, never down.
    let d = recall(&set, 7, now).unwrap();
    assert!((3 * S..3 * S + (1 << UNIT_SHIFT)).contains(&d), "{d}");
    assert!(recall(&set, 7, now + 2 * S).unwrap().abs_diff(S) < 1 << UNIT_SHIFT);
    // Debt over: known, no debt, for the window after it ended.
    assert_eq!(recall(&set, 7, now + 4 * S), Some(0));
    assert_eq!(recall(&set, 7, now + 3 * S + RECALL_WINDOW_NS - S), Some(0));
    assert_eq!(recall(&set, 7, now + 3 * S + RECALL_WINDOW_NS + S), None);
    // Another fingerprint is not recalled.
    assert_eq!(recall(&set, 8, now), None);
    // An empty set recalls nothing (fingerprints are never 0).
    assert_eq!(recall(&RecallSet::default(), 1, now), None);
}

#[test]
fn fingerprints_are_never_zero_and_sets_in_range() {
    for sets in [1u64, 2, 3, 1000, 1 << 19] {
        for w in 0..2000u64 {
            for v6 in [false, true] {
                let (i, fp) = locate(0x1234, sets, (w * 0x9e37_79b9) | crate::table::KEY_VALID, v6);
                assert!((i as u64) < sets);
                assert!(fp != 0 && fp < 1 << FP_BITS);
            }
        }
    }
    // The families are kept apart.
    let w = crate::table::slot_key([10, 0, 0, 1], 32);
    assert_ne!(locate(1, 1 << 19, w, false), locate(1, 1 << 19, w, true));
}

#[test]
fn place_reuses_the_source_then_an_empty_then_the_oldest() {
    let now = 500 * S;
    let mut set = set_with(&[entry(1, now - 10 * S, 0, 0), entry(2, now - 50 * S, 0, 0), entry(3, now, 5 * S, 0)]);
    assert_eq!(place(&set, 2, now), 1);
    assert_eq!(place(&set, 9, now), 3);
    for (i, fp) in (3..RECALL_WAYS).zip(10u64..) {
        set.entries[i] = entry(fp, now - S, 0, 0);
    }
    // Full: the oldest (fingerprint 2, 50 s ago) goes.
    assert_eq!(place(&set, 99, now), 1);
    // A source seen once goes before any other, however young.
    set.entries[6] = entry(77, now, 0, 1);
    assert_eq!(place(&set, 99, now), 6);
    set.entries[6] = entry(77, now, 0, 0);
    // A debt that ends later counts as younger than a plain eviction now.
    set.entries[1] = entry(2, now, 0, 0);
    set.entries[0] = entry(1, now - 100 * S, 0, 0);
    assert_eq!(place(&set, 99, now), 0);
}

#[test]
fn live_counts_entries_within_the_window() {
    let now = 1_000 * S;
    let set = set_with(&[entry(1, now, 0, 0), entry(2, now - RECALL_WINDOW_NS - S, 0, 0), entry(3, now, S, 0)]);
    assert_eq!(live(&set, now), 2);
    assert_eq!(live(&set, now + RECALL_WINDOW_NS + 2 * S), 0);
}

#[test]
fn long_debts_are_capped() {
    let now = 7 * S;
    let set = set_with(&[entry(5, now, u64::MAX, 0)]);
    let d = recall(&set, 5, now).unwrap();
    assert!((MAX_DEBT_NS..=MAX_DEBT_NS + (1 << UNIT_SHIFT)).contains(&d), "{d}");
}

proptest! {
    /// Across the clock's whole range (the unit time wraps): a debt is
    /// recalled as itself (within a unit, never less), a plain eviction as
    /// known within the window, and a resumed bucket never holds more than
    /// one bucket of the rule it resumes under: a false recall (another
    /// source's entry) is stricter by at most one burst.
    #[test]
    fn recalled_debts_are_exact_and_capped(
        now in any::<u64>(),
        debt in 0..MAX_DEBT_NS,
        later in 0..RECALL_WINDOW_NS,
        fp in 1..(1u64 << FP_BITS),
        rate in 1..1_000_000u64,
        burst in 1..10_000u64,
    ) {
        let set = set_with(&[entry(fp, now, debt, 0)]);
        let d = recall(&set, fp, now).unwrap();
        prop_assert!(d >= debt && d - debt < 2 << UNIT_SHIFT, "debt {} read {}", debt, d);
        let t = now.wrapping_add(debt).wrapping_add(later);
        prop_assert_eq!(recall(&set, fp, t), Some(0));
        let r = Rule::packets(rate, burst).unwrap();
        let tat = r.resumed_tat(now, d);
        let held = r.debt_ns(tat, now);
        prop_assert!(held <= (r.limit >> r.shift) + 1);
        prop_assert!(held + 1 >= d.min(r.limit >> r.shift));
    }
}

/// Measured: a recall full of sources in debt, asked about a million
/// sources it never saw. A false recall needs one of the set's 8 entries
/// to carry the same 19-bit fingerprint (8 in 2^19: ~15 per million), and
/// each one is at most one bucket of the asking rule's debt.
#[test]
fn false_recalls_are_rare_and_capped() {
    let now = 3_600 * S;
    let sets = 4096u64;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut recall_sets = std::vec![RecallSet::default(); sets as usize];
    // Full: 8 entries a set, each a source owing up to 10 s.
    for (i, s) in recall_sets.iter_mut().enumerate() {
        for e in 0..RECALL_WAYS {
            let (_, fp) = locate(7, sets, next() | crate::table::KEY_VALID, false);
            s.entries[e] = entry(fp, now - (e as u64) * S, next() % (10 * S), (i % 2) as u64);
        }
    }
    let r = Rule::packets(100, 5).unwrap();
    let burst_ns = r.limit >> r.shift;
    let (mut asked, mut false_hits) = (0u64, 0u64);
    for _ in 0..1_000_000 {
        let (i, fp) = locate(7, sets, (next() & crate::table::KEY_MASK) | crate::table::KEY_VALID, false);
        asked += 1;
        if let Some(debt) = recall(&recall_sets[i as usize], fp, now) {
            false_hits += 1;
            let held = r.debt_ns(r.resumed_tat(now, debt), now);
            assert!(held <= burst_ns + 1, "a false recall holds {held} ns, the bucket {burst_ns}");
        }
    }
    let expected = asked as f64 * RECALL_WAYS as f64 / (1u64 << FP_BITS) as f64;
    std::eprintln!("false recalls: {false_hits} of {asked} unseen sources (expected about {expected:.0})");
    assert!((false_hits as f64) < 3.0 * expected + 10.0, "{false_hits} false recalls, expected about {expected:.0}");
}
