use super::*;
use proptest::prelude::*;

extern crate std;
use std::vec::Vec;

/// Runs a stream of (time, length) frames through one bucket; returns which
/// frames were admitted.
fn run(rule: &Rule, frames: &[(u64, u32)]) -> Vec<bool> {
    let mut tat = rule.empty_tat(frames.first().map_or(0, |f| f.0));
    frames
        .iter()
        .map(|&(t, len)| match rule.admit(tat, t, len) {
            Some(new) => {
                tat = new;
                true
            }
            None => false,
        })
        .collect()
}

#[test]
fn burst_then_rate() {
    let rule = Rule::packets(1000, 10).unwrap();
    // 20 frames at the same instant: exactly the burst passes.
    let frames: Vec<_> = (0..20).map(|_| (5_000_000_000, 60)).collect();
    assert_eq!(run(&rule, &frames).iter().filter(|a| **a).count(), 10);
    // 10x the rate for 5 s: burst + rate * T.
    let frames: Vec<_> = (0..50_000u64).map(|i| (1_000 + i * 100_000, 60)).collect();
    let admitted = run(&rule, &frames).iter().filter(|a| **a).count();
    // T = 49_999 * 100 us = 4.9999 s -> 4999.9 drained, + 10 burst.
    assert!((5_008..=5_010).contains(&admitted), "{admitted}");
}

#[test]
fn under_rate_loses_nothing() {
    let rule = Rule::packets(1000, 1).unwrap();
    let frames: Vec<_> = (0..10_000u64).map(|i| (i * 1_000_000, 1500)).collect();
    assert!(run(&rule, &frames).iter().all(|a| *a));
}

#[test]
fn byte_mode_charges_length() {
    // 8 kbit/s = 1000 B/s, burst 1500 B.
    let rule = Rule::bytes(8_000, 1_500).unwrap();
    assert!(rule.pkt_cost == 0 && rule.byte_cost > 0);
    let t = 1_000_000_000;
    let tat = rule.empty_tat(t);
    let tat = rule.admit(tat, t, 1000).unwrap();
    assert_eq!(rule.admit(tat, t, 501), None);
    let tat = rule.admit(tat, t, 500).unwrap();
    // Half a second later 500 bytes have drained.
    assert_eq!(rule.admit(tat, t + 499_000_000, 500), None);
    assert!(rule.admit(tat, t + 500_000_000, 500).is_some());
}

#[test]
fn actions_round_trip() {
    for a in [Action::Police, Action::Monitor, Action::Allow, Action::Deny] {
        assert_eq!(Action::from_u32(a as u32), Some(a));
    }
    assert_eq!(Action::from_u32(4), None);
}

#[test]
fn constructor_ranges() {
    assert_eq!(Rule::packets(0, 1), Err(RuleError::RateOutOfRange));
    assert_eq!(Rule::packets(MAX_RATE_PPS + 1, 1), Err(RuleError::RateOutOfRange));
    assert_eq!(Rule::packets(1, 0), Err(RuleError::BurstOutOfRange));
    assert_eq!(Rule::packets(1, MAX_BURST + 1), Err(RuleError::BurstOutOfRange));
    assert_eq!(Rule::bytes(999, 1), Err(RuleError::RateOutOfRange));
    assert_eq!(Rule::bytes(MAX_RATE_BPS + 1, 1), Err(RuleError::RateOutOfRange));
    for (rate, burst) in [(1, 1), (1, MAX_BURST), (MAX_RATE_PPS, 1), (MAX_RATE_PPS, MAX_BURST)] {
        let r = Rule::packets(rate, burst).unwrap();
        assert!(r.limit <= MAX_LIMIT && r.limit >= r.pkt_cost);
    }
    for (rate, burst) in [(1_000, 1), (1_000, MAX_BURST), (MAX_RATE_BPS, 1), (MAX_RATE_BPS, MAX_BURST)] {
        let r = Rule::bytes(rate, burst).unwrap();
        assert!(r.limit <= MAX_LIMIT && r.byte_cost <= MAX_BYTE_COST);
    }
    // The finest unit where it fits: 100 Mpps costs exactly 10 ns.
    let r = Rule::packets(100_000_000, 10).unwrap();
    assert_eq!((r.shift, r.pkt_cost), (MAX_SHIFT, 10 << MAX_SHIFT));
}

#[test]
fn key_masks() {
    assert_eq!(prefix_mask(0), [0; 16]);
    assert_eq!(prefix_mask(128), [0xff; 16]);
    let m = prefix_mask(20);
    assert_eq!(&m[..4], &[0xff, 0xff, 0xf0, 0]);
    let r = Rule::packets(1, 1).unwrap();
    assert!(r.with_key_len(0, false).is_err());
    assert!(r.with_key_len(33, false).is_err());
    assert!(r.with_key_len(129, true).is_err());
    assert_eq!(r.with_key_len(64, true).unwrap().key_mask, prefix_mask(64));
}

#[test]
fn rescale_keeps_the_fill() {
    let now = 7_000_000_000;
    // A full bucket at 1 pps / burst 10^9 (shift 0) ...
    let coarse = Rule::packets(1, MAX_BURST).unwrap().with_id(1);
    let full = coarse.bucket(coarse.empty_tat(now).wrapping_add(coarse.limit));
    // ... stays full under a fine-grained rule: not one packet passes.
    let fine = Rule::packets(1000, 10).unwrap().with_id(2);
    assert!(coarse.shift < fine.shift);
    let moved = fine.rescale(&full, now);
    assert_eq!(fine.admit(moved, now, 64), None);
    assert!(fine.admit(moved, now + 1_000_000, 64).is_some());
    // Half full at 1000 pps burst 10 -> half full at 100 pps burst 100.
    let mut tat = fine.empty_tat(now);
    for _ in 0..5 {
        tat = fine.admit(tat, now, 64).unwrap();
    }
    let slow = Rule::packets(100, 100).unwrap().with_id(3);
    let moved = slow.rescale(&fine.bucket(tat), now);
    let mut n = 0;
    let mut t = moved;
    while let Some(new) = slow.admit(t, now, 64) {
        t = new;
        n += 1;
    }
    assert_eq!(n, 50);
    // An empty bucket stays empty.
    let empty = fine.bucket(fine.empty_tat(now));
    assert_eq!(slow.debt_ns(slow.rescale(&empty, now + 5), now + 5), 0);
}

#[test]
fn stamps_round_trip() {
    // Small sizes are exact; shifts always are.
    for limit in [0, 1, 2, 4095, 8191] {
        for shift in [0, 7, MAX_SHIFT] {
            assert_eq!(unstamp(stamp(limit, shift)), (limit, shift));
        }
    }
    // Larger sizes to 13 significant bits, rounded to nearest.
    for limit in [8192, 8193, 16_383, 1 << 40, (1 << 40) + (1 << 27), 655_360_000_000, MAX_LIMIT - 1, MAX_LIMIT] {
        let (back, shift) = unstamp(stamp(limit, 3));
        assert_eq!(shift, 3);
        assert!(back.abs_diff(limit) <= limit >> 13, "{limit} -> {back}");
    }
    // Out-of-range fields are clamped, and the stamp fits its bits.
    assert_eq!(unstamp(stamp(u64::MAX, 99)), (MAX_LIMIT, MAX_SHIFT));
    assert_eq!(stamp(u64::MAX, 99) as u64 & !STAMP_MASK, 0);
    // A rule's stamp is its own size and unit, whatever its id.
    let r = Rule::packets(1000, 10).unwrap();
    assert_eq!(r.with_id(5).stamp, stamp(r.limit, r.shift));
    assert_ne!(Rule::packets(1000, 11).unwrap().stamp, r.stamp);
    assert_ne!(Rule::packets(100_000, 100).unwrap().stamp, r.stamp);
    // 100 kpps with a burst of 1000 drains in the same 10 ms as 1000 pps
    // with 10: the same size in the same unit, so a bucket means the same.
    assert_eq!(Rule::packets(100_000, 1000).unwrap().stamp, r.stamp);
}

#[test]
fn drops_count_above_the_stamp() {
    let r = Rule::packets(1000, 10).unwrap();
    let mut b = r.bucket(r.empty_tat(5));
    assert_eq!((b.stamp(), b.drops()), (r.stamp, 0));
    b.meta += 3 * DROP_ONE;
    assert_eq!((b.stamp(), b.drops()), (r.stamp, 3));
    // The count wraps to zero, never into the stamp.
    b.meta = b.meta.wrapping_add(((1 << (64 - STAMP_BITS)) - 3) * DROP_ONE);
    assert_eq!((b.stamp(), b.drops()), (r.stamp, 0));
}

/// Any rule the constructors can make, packet or byte mode.
fn any_rule() -> impl Strategy<Value = Rule> {
    prop_oneof![
        (MIN_RATE_PPS..=MAX_RATE_PPS, 1..=MAX_BURST).prop_map(|(r, b)| Rule::packets(r, b).unwrap()),
        (1..=100_000u64, 1..=1_000u64).prop_map(|(r, b)| Rule::packets(r, b).unwrap()),
        (MIN_RATE_BPS..=MAX_RATE_BPS, 1..=MAX_BURST).prop_map(|(r, b)| Rule::bytes(r, b).unwrap()),
        (8_000..=10_000_000u64, 64..=100_000u64).prop_map(|(r, b)| Rule::bytes(r, b).unwrap()),
    ]
}

/// The exact rate of a rule, as (units admitted per second, burst units,
/// whether a unit is a byte). Recovered from the constructor inputs.
#[derive(Debug, Clone, Copy)]
struct Spec {
    rate: u64,
    burst: u64,
    bytes: bool,
}

fn any_spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (1..=2_000u64, 1..=50u64).prop_map(|(rate, burst)| Spec { rate, burst, bytes: false }),
        (1..=MAX_RATE_PPS, 1..=MAX_BURST).prop_map(|(rate, burst)| Spec { rate, burst, bytes: false }),
        (MIN_RATE_BPS..=100_000u64, 1..=20_000u64).prop_map(|(rate, burst)| Spec { rate, burst, bytes: true }),
        (MIN_RATE_BPS..=MAX_RATE_BPS, 1..=MAX_BURST).prop_map(|(rate, burst)| Spec { rate, burst, bytes: true }),
    ]
}

impl Spec {
    fn rule(&self) -> Rule {
        if self.bytes {
            Rule::bytes(self.rate, self.burst).unwrap()
        } else {
            Rule::packets(self.rate, self.burst).unwrap()
        }
    }

    /// `admitted <= burst + rate * T`, in exact integers.
    fn within(&self, admitted_units: u128, span_ns: u64) -> bool {
        if self.bytes {
            // bytes * 8e9 <= burst * 8e9 + span * bps
            admitted_units * 8 * NS_PER_SEC as u128
                <= self.burst as u128 * 8 * NS_PER_SEC as u128 + span_ns as u128 * self.rate as u128
        } else {
            admitted_units * NS_PER_SEC as u128
                <= self.burst as u128 * NS_PER_SEC as u128 + span_ns as u128 * self.rate as u128
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Over any window [t_i, t_j] of a monotonic stream, admitted units
    /// never exceed burst + rate * (t_j - t_i).
    #[test]
    fn never_more_than_rate_times_t_plus_burst(
        spec in any_spec(),
        base in any::<u64>(),
        gaps in prop::collection::vec((0..5_000_000u64, 40..=9_000u32), 1..150),
    ) {
        let rule = spec.rule();
        let mut t = base;
        let frames: Vec<(u64, u32)> = gaps.iter().map(|&(g, len)| { t = t.wrapping_add(g); (t, len) }).collect();
        let admitted = run(&rule, &frames);
        let units = |i: usize| if spec.bytes { frames[i].1 as u128 } else { 1 };
        for i in 0..frames.len() {
            if !admitted[i] { continue; }
            let mut sum = 0u128;
            for j in i..frames.len() {
                if admitted[j] { sum += units(j); }
                let span = frames[j].0.wrapping_sub(frames[i].0);
                prop_assert!(spec.within(sum, span), "window {i}..={j}: {sum} units in {span} ns");
            }
        }
    }

    /// A clock that goes backwards never creates budget: whatever the
    /// order of timestamps, what is admitted fits burst + rate * (latest
    /// time seen - time of the first admission).
    #[test]
    fn clock_going_backwards_never_creates_budget(
        spec in any_spec(),
        base in 0..u64::MAX / 2,
        steps in prop::collection::vec((-2_000_000_000i64..2_000_000_000i64, 40..=1_500u32), 1..200),
    ) {
        let rule = spec.rule();
        let mut t = base + (1 << 40);
        let frames: Vec<(u64, u32)> = steps.iter().map(|&(d, len)| { t = t.saturating_add_signed(d); (t, len) }).collect();
        let admitted = run(&rule, &frames);
        let mut first = None;
        let mut latest = 0u64;
        let mut sum = 0u128;
        for (i, &(ts, len)) in frames.iter().enumerate() {
            latest = latest.max(ts);
            if admitted[i] {
                let first = *first.get_or_insert(ts);
                sum += if spec.bytes { len as u128 } else { 1 };
                prop_assert!(spec.within(sum, latest - first), "{sum} units by {i}");
            }
        }
    }

    /// No overflow or panic for any rule, any bucket state and any time —
    /// including values no constructor makes (the map is writable by root).
    #[test]
    fn no_panic_anywhere(
        rule in any_rule(),
        raw in (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()),
        tat in any::<u64>(),
        now in any::<u64>(),
        len in any::<u32>(),
    ) {
        for r in [rule, Rule { pkt_cost: raw.0, byte_cost: raw.1, limit: raw.2, shift: raw.3, ..rule }] {
            let _ = r.admit(tat, now, len);
            let _ = r.debt_ns(tat, now);
            let _ = r.rescale(&Bucket { tat, meta: raw.0 }, now);
            let b = Bucket { tat, meta: raw.1 };
            let _ = (b.debt_ns(now), b.fill_q16(now), b.drops());
            let _ = r.cost(len);
        }
    }

    /// A bucket at zero debt behaves like no bucket: once drained, an old
    /// bucket and a fresh one give the same verdicts.
    #[test]
    fn drained_bucket_equals_fresh(spec in any_spec(), t in 0..u64::MAX / 4, n in 1..50usize) {
        let rule = spec.rule();
        let mut tat = rule.empty_tat(t);
        for _ in 0..n {
            if let Some(new) = rule.admit(tat, t, 64) { tat = new; }
        }
        let later = t + rule.debt_ns(tat, t) + 1;
        prop_assert_eq!(rule.debt_ns(tat, later), 0);
        prop_assert_eq!(rule.admit(tat, later, 64), rule.admit(rule.empty_tat(later), later, 64));
    }

    /// At 10x the rate for T, a source gets burst + rate * T, minus at most
    /// the rounding of one cost unit per packet. (With burst 1 a bucket
    /// must drain completely between packets, so admissions snap to the
    /// arrival grid and the rate is met only to within one arrival gap:
    /// the same as any policer with no tolerance.)
    #[test]
    fn accurate_at_ten_times_the_rate(rate in 10..=100_000u64, burst in 2..=1_000u64) {
        let rule = Rule::packets(rate, burst).unwrap();
        let gap = NS_PER_SEC / (10 * rate);
        let n = 10 * rate * 2; // two seconds
        let frames: Vec<_> = (0..n).map(|i| (1_000_000 + i * gap, 64)).collect();
        let admitted = run(&rule, &frames).iter().filter(|a| **a).count() as u64;
        let span = (n - 1) * gap;
        // A burst larger than what two seconds at 10x bring is never
        // exhausted: then every frame is admitted.
        let expected = (burst + span * rate / NS_PER_SEC).min(n);
        prop_assert!(admitted <= expected + 1 && admitted + 1 + expected / 1000 >= expected,
            "admitted {admitted}, expected {expected}");
    }
}

#[test]
fn bucket_debt_and_fill() {
    let r = Rule::packets(1000, 10).unwrap().with_id(1);
    let t = 3_000_000_000;
    let mut tat = r.empty_tat(t);
    for _ in 0..5 {
        tat = r.admit(tat, t, 64).unwrap();
    }
    let b = r.bucket(tat);
    assert_eq!(b.debt_ns(t), 5_000_000);
    // The bucket knows its size to 13 significant bits (see `stamp`).
    assert!(b.fill_q16(t).abs_diff(1 << 15) <= (1 << 16) >> 13, "{}", b.fill_q16(t));
    assert_eq!(b.fill_q16(t + 10_000_000), 0);
    let full = r.bucket(r.empty_tat(t).wrapping_add(r.limit)).fill_q16(t);
    assert!(full.abs_diff(1 << 16) <= (1 << 16) >> 13, "{full}");
}

#[test]
fn new_source_limiter() {
    use crate::maps::NewSources;
    let t = 9_000_000_000;
    // 1000 pps, burst 10, table of 256: 25 600 fresh buckets/s, bursts of 256.
    let ns = NewSources::for_rule(1000, 10, 256, t);
    assert_eq!(ns.enabled, 1);
    let l = ns.limiter();
    let mut tat = ns.tat;
    let mut n = 0;
    while let Some(new) = l.admit(tat, t, 0) {
        tat = new;
        n += 1;
    }
    assert_eq!(n, 256);
    // Over the next second, offered every microsecond: 25 600 more.
    let mut m = 0;
    for us in 1..=1_000_000u64 {
        if let Some(new) = l.admit(tat, t + us * 1000, 0) {
            tat = new;
            m += 1;
        }
    }
    assert!((25_599..=25_601).contains(&m), "{m}");
    // Too high to matter: off.
    assert_eq!(NewSources::for_rule(100_000_000, 1, 1 << 20, t).enabled, 0);
}

/// The small-rate corner of `accurate_at_ten_times_the_rate`, swept
/// exhaustively: bursts bigger than the offered load admit every frame,
/// smaller ones admit burst + rate * T.
#[test]
fn accurate_at_ten_times_small_rates_every_burst() {
    for rate in [10u64, 11, 17, 50] {
        for burst in 2..=1_000u64 {
            let rule = Rule::packets(rate, burst).unwrap();
            let gap = NS_PER_SEC / (10 * rate);
            let n = 10 * rate * 2;
            let frames: Vec<_> = (0..n).map(|i| (1_000_000 + i * gap, 64)).collect();
            let admitted = run(&rule, &frames).iter().filter(|a| **a).count() as u64;
            let expected = (burst + (n - 1) * gap * rate / NS_PER_SEC).min(n);
            assert!(
                admitted <= expected + 1 && admitted + 1 >= expected,
                "rate {rate} burst {burst}: {admitted} vs {expected}"
            );
        }
    }
}

/// Bucket states that sit on the edges `refuses_within` must get right:
/// just around either end of the window, around the stale boundary and
/// around the last debt that still admits.
fn edge_tat(rule: Rule, lo: u64, hi: u64) -> impl Strategy<Value = u64> {
    let s = rule.shift();
    let (lo, hi) = (lo.wrapping_shl(s), hi.wrapping_shl(s));
    let room = rule.limit().saturating_sub(rule.pkt_cost);
    let bases = [lo, hi, lo.wrapping_add(STALE), hi.wrapping_add(STALE), lo.wrapping_add(room), hi.wrapping_add(room)];
    prop_oneof![
        any::<u64>(),
        (prop::sample::select(bases.to_vec()), -(1i64 << 20)..(1i64 << 20)).prop_map(|(b, d)| b.wrapping_add_signed(d)),
        (prop::sample::select(bases.to_vec()), any::<i64>().prop_map(|d| d >> 16))
            .prop_map(|(b, d)| b.wrapping_add_signed(d)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// Dropping without reading the clock gives the clock's verdict: a
    /// frame refused within a window is refused at every instant in it.
    #[test]
    fn refused_within_a_window_is_refused_throughout(
        (rule, lo, width, tat, len, picks) in (
            prop_oneof![
                4 => any_rule(),
                1 => (any::<u64>(), any::<u64>(), any::<u64>(), 0..=MAX_SHIFT)
                    .prop_map(|(p, b, l, s)| Rule { pkt_cost: p, byte_cost: b, limit: l, shift: s, ..Rule::packets(1, 1).unwrap() }),
            ],
            any::<u64>(),
            prop_oneof![Just(0u64), 0..=crate::clock::MAX_WINDOW_NS, 0..=1_000_000u64],
        )
            .prop_flat_map(|(rule, lo, width)| {
                let hi = lo.saturating_add(width);
                (Just(rule), Just(lo), Just(hi - lo), edge_tat(rule, lo, hi), 0..=9_000u32,
                 prop::collection::vec(any::<prop::sample::Index>(), 8))
            })
    ) {
        let hi = lo + width;
        if rule.refuses_within(tat, lo, hi, len) {
            let mut nows = std::vec![lo, hi, lo.saturating_add(1).min(hi), hi.saturating_sub(1).max(lo)];
            nows.extend(picks.iter().map(|i| lo + i.index(width as usize + 1) as u64));
            for now in nows {
                prop_assert_eq!(rule.admit(tat, now, len), None, "admitted at {} in [{}, {}]", now, lo, hi);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// `refuses_within` is exactly "refused at both ends" (of a window no
    /// wider than allowed): it only saves working out the cost twice.
    #[test]
    fn refused_within_is_refused_at_both_ends(
        (rule, lo, width, tat, len) in (
            prop_oneof![
                4 => any_rule(),
                1 => (any::<u64>(), any::<u64>(), any::<u64>(), 0..=MAX_SHIFT)
                    .prop_map(|(p, b, l, s)| Rule { pkt_cost: p, byte_cost: b, limit: l, shift: s, ..Rule::packets(1, 1).unwrap() }),
            ],
            any::<u64>(),
            prop_oneof![Just(0u64), 0..=crate::clock::MAX_WINDOW_NS],
        )
            .prop_flat_map(|(rule, lo, width)| {
                let hi = lo.saturating_add(width);
                (Just(rule), Just(lo), Just(hi - lo), edge_tat(rule, lo, hi), 0..=70_000u32)
            })
    ) {
        let hi = lo + width;
        let both = rule.admit(tat, lo, len).is_none() && rule.admit(tat, hi, len).is_none();
        prop_assert_eq!(rule.refuses_within(tat, lo, hi, len), both);
    }
}

#[test]
fn a_bucket_with_debt_beyond_the_window_is_refused_without_the_clock() {
    // 1 pps, burst 1: one frame leaves a second of debt.
    let r = Rule::packets(1, 1).unwrap();
    let t = 5 * NS_PER_SEC;
    let tat = r.admit(r.empty_tat(t), t, 64).unwrap();
    let window = 12_000_000;
    assert!(r.refuses_within(tat, t + 100_000_000, t + 100_000_000 + window, 64));
    // The window reaches past the end of the debt: the clock decides.
    assert!(!r.refuses_within(tat, t + NS_PER_SEC - window / 2, t + NS_PER_SEC + window / 2, 64));
    // An empty bucket is never refused on an estimate.
    assert!(!r.refuses_within(r.empty_tat(t), t, t + window, 64));
    // Nor with a window wider than allowed, or reversed.
    assert!(!r.refuses_within(tat, t, t + crate::clock::MAX_WINDOW_NS + 1, 64));
    assert!(!r.refuses_within(tat, t + 1, t, 64));
}
