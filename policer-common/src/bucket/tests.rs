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
    // The coarsest unit in which a packet still costs 2^16 units: 100 Mpps
    // costs 10 ns, 81 920 units of 2^-13 ns (4096 at 2^-12 would be short).
    let r = Rule::packets(100_000_000, 10).unwrap();
    assert_eq!((r.shift, r.pkt_cost), (13, 10 << 13));
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
    // ... stays full under a fine-grained rule (100 kpps: shift 3): not one
    // packet passes.
    let fine = Rule::packets(100_000, 100).unwrap().with_id(2);
    assert!(coarse.shift < fine.shift);
    let moved = fine.rescale(&full, now);
    assert_eq!(fine.admit(moved, now, 64), None);
    assert!(fine.admit(moved, now + 1_000_000, 64).is_some());
    // Half full at 100 kpps burst 100 -> half full at 100 pps burst 100.
    let mut tat = fine.empty_tat(now);
    for _ in 0..50 {
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
    // 2000 pps with a burst of 20 drains in the same 10 ms as 1000 pps
    // with 10, in the same unit (shift 0 for both): the same size in the
    // same unit, so a bucket means the same. (100 kpps with 1000 drains in
    // 10 ms too, but in a finer unit: its stamp differs, and a bucket is
    // rescaled between them.)
    assert_eq!(Rule::packets(2_000, 20).unwrap().stamp, r.stamp);
    assert_ne!(Rule::packets(100_000, 1000).unwrap().stamp, r.stamp);
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
    /// time seen - time of the first admission). Backwards by at most
    /// SKEW_ALLOWANCE_NS behind the latest time seen: a bucket read from
    /// farther back cannot be told from a stale one (module doc), and the
    /// kernel's clock is monotonic.
    #[test]
    fn clock_going_backwards_never_creates_budget(
        spec in any_spec(),
        base in 0..u64::MAX / 2,
        steps in prop::collection::vec(
            (prop_oneof![
                3 => -2_000_000_000i64..2_000_000_000i64,
                1 => -(SKEW_ALLOWANCE_NS as i64 + 5_000_000_000)..0,
            ], 40..=1_500u32),
            1..200,
        ),
    ) {
        let rule = spec.rule();
        let mut t = base + (1 << 40);
        let mut seen = t;
        let frames: Vec<(u64, u32)> = steps
            .iter()
            .map(|&(d, len)| {
                t = t.saturating_add_signed(d).max(seen - SKEW_ALLOWANCE_NS);
                seen = seen.max(t);
                (t, len)
            })
            .collect();
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

/// What `policer top` shows of a bucket: read against a clock older than
/// its last charge (a table walk that read the clock before copying the
/// bucket), the debt would exceed the bucket; it is shown as the bucket,
/// and fill never passes 100 %. Read against the clock of the copy, a
/// source at half its rate shows about half a bucket at most.
#[test]
fn shown_debt_never_exceeds_the_bucket() {
    // 1000 pps, burst 100: a 100 ms bucket.
    let r = Rule::packets(1000, 100).unwrap().with_id(1);
    let depth_ns = r.limit >> r.shift;
    assert_eq!(depth_ns, 100_000_000);
    let t0 = 5_000_000_000;
    // Half the rate for 10 s: a frame every 2 ms.
    let mut tat = r.empty_tat(t0);
    let mut t = t0;
    while t < t0 + 10_000_000_000 {
        tat = r.admit(tat, t, 64).unwrap();
        t += 2_000_000;
    }
    let last = t - 2_000_000;
    let b = r.bucket(tat);
    // Read at the clock of the copy (or later): one frame's debt.
    assert!(b.shown_debt_ns(last) <= 1_000_000, "{}", b.shown_debt_ns(last));
    assert!(b.fill_q16(last) <= (1 << 16) / 50, "{}", b.fill_q16(last));
    // Read against a clock 250 ms older than the copy: the walk counted as
    // debt, capped at the bucket.
    let stale = last - 250_000_000;
    assert!(b.debt_ns(stale) > depth_ns, "uncapped: {}", b.debt_ns(stale));
    // The bucket knows its size to 13 significant bits (see `stamp`).
    assert!(b.shown_debt_ns(stale).abs_diff(depth_ns) <= depth_ns >> 12, "{}", b.shown_debt_ns(stale));
    assert!(b.fill_q16(stale) <= 1 << 16);
}

proptest! {
    /// Whatever the bucket and the clock, what is shown stays within the
    /// bucket, and below the uncapped debt.
    #[test]
    fn shown_debt_bounded(rate in 1u64..1_000_000, burst in 1u64..10_000, tat in any::<u64>(), now in any::<u64>()) {
        let r = Rule::packets(rate, burst).unwrap().with_id(1);
        let b = r.bucket(tat);
        let (limit, shift) = unstamp(b.stamp());
        prop_assert!(b.shown_debt_ns(now) <= limit >> shift);
        prop_assert!(b.shown_debt_ns(now) <= b.debt_ns(now));
        prop_assert!(b.fill_q16(now) <= 1 << 16);
    }
}

#[test]
fn new_source_limiter() {
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
    let bound = rule.debt_bound();
    let bases = [lo, hi, lo.wrapping_add(bound), hi.wrapping_add(bound), lo.wrapping_add(room), hi.wrapping_add(room)];
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

// Time across wraps: the invariant and the alias windows of the module doc.

/// Rates and bursts spread over their orders of magnitude alike, so that
/// every shift the constructors pick is drawn (a uniform draw of a rate up
/// to 100 Mpps is nearly always above 1 Mpps).
fn log_uniform(lo: u64, hi: u64) -> impl Strategy<Value = u64> {
    (lo.ilog2()..=hi.ilog2()).prop_flat_map(move |b| (1u64 << b).max(lo)..=((2u64 << b) - 1).min(hi))
}

/// Any rule the constructors make, every unit alike: 1 pps ..= 100 Mpps
/// and 1 kbit/s ..= 400 Gbit/s, bursts 1 ..= 10^9.
fn wide_spec() -> impl Strategy<Value = Spec> {
    prop_oneof![
        (log_uniform(MIN_RATE_PPS, MAX_RATE_PPS), log_uniform(1, MAX_BURST)).prop_map(|(rate, burst)| Spec {
            rate,
            burst,
            bytes: false
        }),
        (log_uniform(MIN_RATE_BPS, MAX_RATE_BPS), log_uniform(1, MAX_BURST)).prop_map(|(rate, burst)| Spec {
            rate,
            burst,
            bytes: true
        }),
    ]
}

fn in_alias_window(rule: &Rule, d0: u64, gap_ns: u64) -> bool {
    rule.gap_may_alias(d0, gap_ns)
}

/// Frames of `len` admitted back to back at `t` from `tat`, up to `cap`.
fn burst_at(rule: &Rule, mut tat: u64, t: u64, len: u32, cap: usize) -> usize {
    let mut n = 0;
    while n < cap {
        match rule.admit(tat, t, len) {
            Some(new) => tat = new,
            None => break,
        }
        n += 1;
    }
    n
}

/// A bucket of `rule` charged to `fill`/1024 of its size at `t0`.
fn filled(rule: &Rule, t0: u64, fill: u64) -> (u64, u64) {
    let d0 = (rule.limit() as u128 * fill as u128 / 1024) as u64;
    (rule.empty_tat(t0).wrapping_add(d0), d0)
}

/// The rule an older build's constructors made for `spec`: the one unit
/// every rule had before units were chosen per rate (shift 16, a period of
/// 2^48 ns = 78.2 h), coarser only where the bucket would not fit.
fn in_the_old_unit(spec: Spec) -> Rule {
    let mut shift = MAX_SHIFT;
    loop {
        if spec.bytes {
            let byte_cost = ceil_scaled(8 * NS_PER_SEC, shift + BYTE_FRAC_BITS, spec.rate);
            let limit = (byte_cost * spec.burst as u128) >> BYTE_FRAC_BITS;
            if limit <= MAX_LIMIT as u128 && byte_cost <= MAX_BYTE_COST as u128 {
                return Rule::raw(0, byte_cost as u64, limit as u64, shift);
            }
        } else {
            let cost = ceil_scaled(NS_PER_SEC, shift, spec.rate);
            let limit = cost * spec.burst as u128;
            if limit <= MAX_LIMIT as u128 && cost <= MAX_PKT_COST as u128 {
                return Rule::raw(cost as u64, 0, limit as u64, shift);
            }
        }
        shift -= 1;
    }
}

#[test]
fn the_coarsest_precise_unit() {
    // One packet costs 2^16 units or more, in the coarsest unit that does.
    for (rate, shift) in [(1, 0), (1000, 0), (15_259, 0), (15_260, 1), (1_000_000, 7), (MAX_RATE_PPS, 13)] {
        let r = Rule::packets(rate, 1).unwrap();
        assert_eq!(r.shift, shift, "{rate} pps");
        assert!(r.pkt_cost >= 1 << COST_PRECISION_BITS);
    }
    // Byte mode: a 64-byte frame does.
    for (bps, shift) in [
        (MIN_RATE_BPS, 0),
        (7_812_500, 0),
        (7_812_501, 1),
        (10_000_000_000, 11),
        (256_000_000_000, 15),
        (256_000_010_000, 16),
        (MAX_RATE_BPS, 16),
    ] {
        let r = Rule::bytes(bps, 1500).unwrap();
        assert_eq!(r.shift, shift, "{bps} bit/s");
        assert!(r.cost(64) >= 1 << COST_PRECISION_BITS);
    }
    // The periods the module doc quotes.
    let years = |r: Rule| r.period_ns() as f64 / (365.25 * 86_400e9);
    assert_eq!(Rule::packets(1000, 1).unwrap().period_ns(), u64::MAX);
    assert!((years(Rule::packets(1_000_000, 1).unwrap()) - 4.57).abs() < 0.01);
    let days = Rule::packets(MAX_RATE_PPS, 1).unwrap().period_ns() as f64 / 86_400e9;
    assert!((days - 26.06).abs() < 0.01, "{days}");
    let hours = Rule::bytes(MAX_RATE_BPS, 1500).unwrap().period_ns() as f64 / 3_600e9;
    assert!((hours - 78.19).abs() < 0.01, "{hours}");
    // The largest bucket still fits, at the coarsest unit.
    let r = Rule::packets(1, MAX_BURST).unwrap();
    assert_eq!((r.shift, r.limit), (0, MAX_BURST * NS_PER_SEC));
}

/// The reported case: a rule in the old unit (shift 16, period 78.19 h),
/// and a source idle for 60 h. `tat - now` wrapped to ~18 h of "debt",
/// which was read as a clock that stepped back: every frame dropped, for
/// hours, and `policer top` showed the bucket full. It is a stale bucket:
/// drained, the full burst passes, and the next frame is refused. Likewise
/// for every gap from 58.6 h up to the alias window at 78.19 h.
#[test]
fn a_bucket_idle_for_60_hours_in_the_old_unit_is_drained() {
    let r = in_the_old_unit(Spec { rate: 1000, burst: 5, bytes: false }).with_id(1);
    assert_eq!(r.period_ns(), 1 << 48);
    let t0 = 123 * NS_PER_SEC;
    let mut tat = r.empty_tat(t0);
    for _ in 0..5 {
        tat = r.admit(tat, t0, 64).unwrap();
    }
    assert_eq!(r.admit(tat, t0, 64), None);
    let hour = 3_600 * NS_PER_SEC;
    let t = t0 + 60 * hour;
    assert_eq!(r.debt_ns(tat, t), 0);
    assert_eq!(burst_at(&r, tat, t, 64, 100), 5);
    let b = r.bucket(tat);
    assert_eq!((b.debt_ns(t), b.fill_q16(t)), (0, 0));
    // Every 6 minutes from 58.6 h until the window before 2^48 ns.
    let mut gap = 58 * hour + 36 * 60 * NS_PER_SEC;
    while gap < (1 << 48) - 25 * NS_PER_SEC {
        assert!(!in_alias_window(&r, r.limit, gap));
        assert_eq!(burst_at(&r, tat, t0 + gap, 64, 100), 5, "after {} s", gap / NS_PER_SEC);
        gap += 360 * NS_PER_SEC;
    }
    // Within the window: stricter, never more permissive.
    assert!(in_alias_window(&r, r.limit, (1 << 48) - NS_PER_SEC));
    assert_eq!(burst_at(&r, tat, t0 + (1 << 48) - NS_PER_SEC, 64, 100), 0);
    assert_eq!(burst_at(&r, tat, t0 + (1 << 48) + 6 * NS_PER_SEC / 1000, 64, 100), 5);
    // The same rule in its own unit (shift 0) meets no window for 584 years.
    let own = Rule::packets(1000, 5).unwrap();
    assert_eq!(own.shift, 0);
    let tat = own.empty_tat(t0).wrapping_add(own.limit);
    for gap in [60 * hour, 1 << 48, 365 * 24 * hour, 10 * 365 * 24 * hour] {
        assert!(!in_alias_window(&own, own.limit, gap));
        assert_eq!(burst_at(&own, tat, t0 + gap, 64, 100), 5);
    }
}

/// A clock that steps back by up to the allowance is a clock that stepped
/// back, not a stale bucket: a full bucket stays full, and the existing
/// debt is kept (the object tier steps the clock back 10 s).
#[test]
fn a_clock_back_by_the_allowance_is_not_a_stale_bucket() {
    for r in [
        Rule::packets(1000, 3).unwrap(),
        Rule::packets(MAX_RATE_PPS, 1).unwrap(),
        Rule::bytes(MAX_RATE_BPS, 64).unwrap(),
    ] {
        let t0 = 1 << 50;
        let tat = r.empty_tat(t0).wrapping_add(r.limit);
        for back in [1, 10 * NS_PER_SEC, SKEW_ALLOWANCE_NS] {
            assert_eq!(r.admit(tat, t0 - back, 64), None, "shift {} back {back}", r.shift);
            assert!(r.debt_ns(tat, t0 - back) >= r.limit >> r.shift);
        }
        // Farther back than the bound it reads as stale: the kernel's
        // clock never does that.
        let far = (r.debt_bound() >> r.shift) + 1;
        assert_eq!(r.debt_ns(tat, t0 - (far - (r.limit >> r.shift))), 0);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// The constructors pick the coarsest unit in which one packet (a
    /// 64-byte frame) costs at least 2^16 units, or MAX_SHIFT.
    #[test]
    fn the_unit_is_the_coarsest_precise_one(spec in wide_spec()) {
        let r = spec.rule();
        let unit = |shift: u32| if spec.bytes {
            (ceil_scaled(8 * NS_PER_SEC, shift + BYTE_FRAC_BITS, spec.rate) * UNIT_FRAME_BYTES as u128) >> BYTE_FRAC_BITS
        } else {
            ceil_scaled(NS_PER_SEC, shift, spec.rate)
        };
        prop_assert!(unit(r.shift) >= 1 << COST_PRECISION_BITS || r.shift == MAX_SHIFT);
        prop_assert!(r.shift == 0 || unit(r.shift - 1) < 1 << COST_PRECISION_BITS);
        prop_assert!(r.limit <= MAX_LIMIT);
    }

    /// Idle gaps over several periods, for every unit the constructors
    /// pick. Outside the alias windows a bucket reads its true debt: once
    /// the gap covers it, drained — a full burst passes and the next frame
    /// is refused, exactly as from a fresh bucket. Inside one it reads at
    /// most the bound, and is never more permissive than a fresh bucket.
    #[test]
    fn idle_gaps_across_wraps(
        spec in wide_spec(),
        t0 in any::<u64>(),
        fill in 0..=1024u64,
        k in 0..6u64,
        at in 0..5u8,
        frac in any::<u64>(),
    ) {
        let rule = spec.rule();
        let s = rule.shift;
        let (tat, d0) = filled(&rule, t0, fill);
        let p = 1u128 << (64 - s);
        let near = ((rule.debt_bound() >> s) as u128 * 2 + 2).min(p);
        let off = match at {
            0 => frac as u128 % p,
            1 => frac as u128 % near,
            2 => p - 1 - frac as u128 % near,
            3 => ((d0 >> s) as u128 + frac as u128 % 4).min(p - 1),
            _ => frac as u128 % ((d0 >> s) as u128 + 1),
        };
        let gap = k as u128 * p + off;
        prop_assume!(gap <= u64::MAX as u128);
        let gap = gap as u64;
        let t = t0.wrapping_add(gap);
        let fresh = rule.empty_tat(t);
        let read = Rule::debt(tat, t.wrapping_shl(s), rule.debt_bound());
        let (n, n_fresh) = (burst_at(&rule, tat, t, 64, 3000), burst_at(&rule, fresh, t, 64, 3000));
        if !in_alias_window(&rule, d0, gap) {
            let true_debt = (d0 as u128).saturating_sub((gap as u128) << s) as u64;
            prop_assert_eq!(read, true_debt);
            if true_debt == 0 {
                prop_assert_eq!(rule.admit(tat, t, 64), rule.admit(fresh, t, 64));
                prop_assert_eq!(n, n_fresh);
                if !spec.bytes && spec.burst < 3000 {
                    prop_assert_eq!(n as u64, spec.burst);
                }
            }
        } else {
            prop_assert!(read <= rule.debt_bound());
            prop_assert!(n <= n_fresh);
        }
    }

    /// Read from up to SKEW_ALLOWANCE_NS before it was charged (a clock
    /// that stepped back, or a CPU whose reading came before another's),
    /// a bucket is never emptier than it was: no budget is created.
    #[test]
    fn a_clock_back_within_the_allowance_creates_no_budget(
        spec in wide_spec(),
        t0 in any::<u64>(),
        fill in 0..=1024u64,
        back in prop_oneof![0..=SKEW_ALLOWANCE_NS, SKEW_ALLOWANCE_NS - 1000..=SKEW_ALLOWANCE_NS],
    ) {
        let rule = spec.rule();
        let (tat, d0) = filled(&rule, t0, fill);
        let t = t0.wrapping_sub(back);
        prop_assert!(Rule::debt(tat, t.wrapping_shl(rule.shift), rule.debt_bound()) >= d0);
        prop_assert!(burst_at(&rule, tat, t, 64, 3000) <= burst_at(&rule, tat, t0, 64, 3000));
        if back > 0 && fill == 1024 {
            prop_assert_eq!(rule.admit(tat, t, 64), None);
        }
    }

    /// The new-source limiter is a bucket of the same arithmetic: emptied
    /// at t0, after any gap outside its alias windows that covers its debt
    /// it lets a table's worth of new sources through again, then refuses.
    #[test]
    fn the_new_source_limiter_across_wraps(
        rate in log_uniform(1, MAX_RATE_PPS),
        burst in log_uniform(1, MAX_BURST),
        capacity in 1..=2048u32,
        t0 in any::<u64>(),
        k in 0..4u64,
        frac in any::<u64>(),
    ) {
        let ns = NewSources::for_rule(rate, burst, capacity, t0);
        prop_assume!(ns.enabled == 1);
        let l = ns.limiter();
        let mut tat = ns.tat;
        for _ in 0..capacity {
            tat = l.admit(tat, t0, 0).unwrap();
        }
        prop_assert_eq!(l.admit(tat, t0, 0), None);
        let d0 = tat.wrapping_sub(l.empty_tat(t0));
        let gap = (k as u128 * (1u128 << (64 - l.shift)) + frac as u128 % (1u128 << (64 - l.shift))).min(u64::MAX as u128) as u64;
        let t = t0.wrapping_add(gap);
        if !in_alias_window(&l, d0, gap) && (gap as u128) << l.shift >= d0 as u128 {
            prop_assert_eq!(burst_at(&l, tat, t, 0, 3000), capacity as usize);
        }
    }
}

/// Buckets an older daemon's rules charged in the old unit (shift 16)
/// carry over to the same rates in their new units through the stamp and
/// `rescale`, as a rule change does: a full bucket stays full, a half-full
/// one half full, and one idle for 60 h — which the old unit read as full —
/// starts empty.
#[test]
fn buckets_in_the_old_unit_carry_over() {
    let t0 = 40 * NS_PER_SEC;
    for spec in [
        Spec { rate: 1000, burst: 10, bytes: false },
        Spec { rate: 1_000_000, burst: 10, bytes: false },
        Spec { rate: 10_000_000_000, burst: 15_100, bytes: true },
    ] {
        let new = spec.rule().with_id(2);
        let old = in_the_old_unit(spec).with_id(1);
        assert_ne!(old.stamp, new.stamp, "a new unit is a new stamp");
        let len = if new.byte_cost == 0 { 64 } else { 1500 };
        let mut tat = old.empty_tat(t0);
        let mut n = 0;
        while let Some(next) = old.admit(tat, t0, len) {
            tat = next;
            n += 1;
        }
        assert_eq!(n, 10);
        let b = old.bucket(tat);
        assert_eq!(burst_at(&new, new.rescale(&b, t0), t0, len, 100), 0, "full stays full");
        let half = old.bucket(old.empty_tat(t0).wrapping_add(old.limit / 2));
        assert_eq!(burst_at(&new, new.rescale(&half, t0), t0, len, 100), 5, "half stays half");
        let t = t0 + 60 * 3_600 * NS_PER_SEC;
        assert_eq!(burst_at(&new, new.rescale(&b, t), t, len, 100), 10, "stale starts empty");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// A bucket carried over from one rule to another (any units, the old
    /// fixed one included) after any idle gap keeps its true fill outside
    /// the old rule's alias windows (to the stamp's 13 bits), and is never
    /// emptier inside them.
    #[test]
    fn rescale_across_wraps(
        old in wide_spec(),
        legacy in any::<bool>(),
        new in wide_spec(),
        t0 in any::<u64>(),
        fill in 0..=1024u64,
        gap in prop_oneof![any::<u64>(), 0..1u64 << 52, 0..1u64 << 36],
    ) {
        let old = if legacy { in_the_old_unit(old) } else { old.rule() }.with_id(1);
        let new = new.rule().with_id(2);
        let (tat, d0) = filled(&old, t0, fill);
        let t = t0.wrapping_add(gap);
        let moved = new.rescale(&old.bucket(tat), t);
        let new_debt = Rule::debt(moved, t.wrapping_shl(new.shift), new.debt_bound());
        prop_assert!(new_debt <= new.limit);
        let got = new_debt as f64 / new.limit.max(1) as f64;
        let (limit, shift) = unstamp(old.stamp);
        let seen = Rule { limit, shift, ..old };
        let true_debt = (d0 as u128).saturating_sub((gap as u128) << old.shift) as f64;
        let want = (true_debt / old.limit as f64).min(1.0);
        // The fill is carried to 13 bits, and the new debt rounded down to
        // a unit: with shift 0 a small bucket has few units (a 1-byte burst
        // at 4 Mbit/s holds 1973 ns), each a visible step.
        let tolerance = 1.0 / 2048.0 + 1.0 / new.limit.max(1) as f64;
        if !seen.gap_may_alias(d0, gap) {
            prop_assert!((got - want).abs() <= tolerance, "fill {got} for {want}");
        } else {
            prop_assert!(got >= want - tolerance, "fill {got} for {want}");
        }
    }
}

proptest! {
    /// `wait_ns` is exactly when `admit` starts admitting again: refused a
    /// nanosecond before, admitted at it.
    #[test]
    fn wait_is_when_admit_says_yes(
        spec in wide_spec(),
        t0 in 0..1u64 << 60,
        fill in 0..=1024u64,
        len in 64..1500u32,
    ) {
        let rule = spec.rule().with_id(1);
        let (tat, _) = filled(&rule, t0, fill);
        let wait = rule.wait_ns(Some(&rule.bucket(tat)), t0, len);
        if rule.cost(len) > rule.limit() {
            prop_assert_eq!(wait, u64::MAX);
            return Ok(());
        }
        prop_assert!(rule.admit(tat, t0 + wait, len).is_some(), "refused at the wait {wait}");
        if wait > 0 {
            prop_assert!(rule.admit(tat, t0 + wait - 1, len).is_none(), "admitted before the wait {wait}");
        }
        // No bucket: admitted now.
        prop_assert_eq!(rule.wait_ns(None, t0, len), 0);
    }
}

#[test]
fn wait_after_a_burst_is_one_frame_at_the_rate() {
    // 1000 pps, burst 10: ten frames back to back fill it; the next one
    // waits one packet's time, 1 ms.
    let rule = Rule::packets(1000, 10).unwrap().with_id(1);
    let t = 5 * NS_PER_SEC;
    let mut tat = rule.empty_tat(t);
    for _ in 0..10 {
        tat = rule.admit(tat, t, 64).unwrap();
    }
    assert_eq!(rule.wait_ns(Some(&rule.bucket(tat)), t, 64), 1_000_000);
    assert_eq!(rule.wait_ns(Some(&rule.bucket(tat)), t + 400_000, 64), 600_000);
    assert_eq!(rule.wait_ns(Some(&rule.bucket(tat)), t + 2_000_000, 64), 0);
}

#[test]
fn frames_admitted_between_two_reads_of_a_bucket() {
    // 1000 pps, burst 10: a frame costs 1 ms.
    let r = Rule::packets(1000, 10).unwrap();
    let ms = 1_000_000u64;
    let t0 = 1_000 * ms;
    // One frame at t0 + 2 ms on a drained bucket, read at t0 + 2.5 ms.
    let mut tat = r.empty_tat(t0);
    let before = tat;
    tat = r.admit(tat, t0 + 2 * ms, 64).unwrap();
    assert_eq!(r.admitted_between(before, t0, tat, t0 + 2 * ms + ms / 2, 64), 1);
    // Nothing moved: none.
    assert_eq!(r.admitted_between(tat, t0, tat, t0 + 3 * ms, 64), 0);
    // Five frames close together (in debt throughout), read before it drains.
    let (p, pt) = (tat, t0 + 2 * ms + ms / 2);
    for k in 0..5 {
        tat = r.admit(tat, pt + k * 10_000, 64).unwrap();
    }
    assert_eq!(r.admitted_between(p, pt, tat, pt + 100_000, 64), 5);
    // Drained between the reads, then three frames at once: its debt.
    let p = tat;
    let later = pt + 50 * ms;
    for k in 0..3 {
        tat = r.admit(tat, later + k, 64).unwrap();
    }
    assert_eq!(r.admitted_between(p, pt + 100_000, tat, later + 10, 64), 3);
}
