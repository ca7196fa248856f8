use super::*;
use crate::Rule;
use proptest::prelude::*;

extern crate std;
use std::vec;

#[test]
fn keys_round_trip() {
    for (addr, len) in [([10, 1, 2, 3], 32), ([0, 0, 0, 0], 1), ([255, 255, 255, 255], 32), ([192, 0, 2, 0], 24)] {
        let k = slot_key(addr, len);
        assert_ne!(k, 0);
        assert_eq!(key_of(k), Some(BucketKeyV4 { addr, key_len: len }));
    }
    assert_eq!(key_of(0), None);
    // The key length is part of the key.
    assert_ne!(slot_key([10, 0, 0, 0], 24), slot_key([10, 0, 0, 0], 32));
}

#[test]
fn stamps_sit_above_the_source() {
    let r = Rule::packets(1000, 10).unwrap();
    for (addr, len) in [([255, 255, 255, 255], 32), ([0, 0, 0, 0], 1), ([192, 0, 2, 0], 24)] {
        let k = slot_key(addr, len);
        assert_eq!(k & !KEY_MASK, 0, "the source fits below the stamp");
        for stamp in [0, 1, r.stamp, crate::bucket::STAMP_MASK as u32, u32::MAX] {
            let s = Slot { key: stamped(k, stamp), tat: 7 };
            assert_eq!(s.source(), k);
            assert_eq!(s.stamp() as u64, stamp as u64 & crate::bucket::STAMP_MASK);
            assert_eq!(key_of(s.key), Some(BucketKeyV4 { addr, key_len: len }));
            let b = s.bucket(42);
            assert_eq!((b.tat, b.stamp() as u64, b.drops()), (7, stamp as u64 & crate::bucket::STAMP_MASK, 42));
        }
    }
}

#[test]
fn sets_cover_the_capacity() {
    assert_eq!(sets_for(0), 1);
    assert_eq!(sets_for(1), 1);
    assert_eq!(sets_for(2), 1);
    assert_eq!(sets_for(3), 2);
    assert_eq!(sets_for(1 << 20), 1 << 19);
    assert_eq!(sets_for(u32::MAX), u32::MAX / 2 + 1);
}

/// Places `n` sources as the program does (first set while it has room,
/// else the second; never evicting) and returns how many found a slot.
fn place(g: &Geometry, sources: impl Iterator<Item = u32>) -> u32 {
    let mut load = vec![0u8; g.sets as usize];
    let mut held = 0u32;
    for a in sources {
        let [s0, s1] = g.sets_of(slot_key(a.to_be_bytes(), 32));
        for s in [s0, s1] {
            if (load[s as usize] as usize) < WAYS {
                load[s as usize] += 1;
                held += 1;
                break;
            }
        }
    }
    held
}

fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// A table sized for N sources holds 99.5 % of N distinct sources at once
/// (measured ~99.6 %, sequential or random, for any seed the loader may
/// draw); with one choice of set it held ~96 %.
#[test]
fn a_full_table_holds_its_sources() {
    let mut rnd = xorshift(0x1234_5678_9abc_def1);
    for n in [4096u32, 65_536, 1 << 20] {
        for _ in 0..3 {
            let g = geom(rnd(), sets_for(n));
            let seq = place(&g, (0..n).map(|i| 0x0a00_0000 + i));
            let random: std::vec::Vec<u32> = (0..n).map(|_| rnd() as u32).collect();
            let ran = place(&g, random.into_iter());
            for (what, held) in [("sequential", seq), ("random", ran)] {
                assert!(held as f64 >= 0.995 * n as f64, "{n} {what} sources: {held} held");
            }
        }
    }
}

/// The benchmark's case: 65 536 sources in a table for 262 144. With one
/// choice, ~20 sets per seed had more sources than ways, and their sources
/// evicted each other on every frame, each passing at the rate it offered.
/// With two, a source is left without a slot of its own only when both its
/// sets are full: measured 2 sources in 40 placements of 65 536.
#[test]
fn a_quarter_full_table_leaves_hardly_a_source_out() {
    let mut rnd = xorshift(0x0bad_5eed_1234_5678);
    let (mut two, mut one) = (0, 0);
    for _ in 0..20 {
        let g = geom(rnd(), sets_for(262_144));
        let random: std::vec::Vec<u32> = (0..65_536).map(|_| rnd() as u32).collect();
        for sources in [(0..65_536u32).map(|i| 0x0a01_0000 + i).collect(), random] {
            let out = 65_536 - place(&g, sources.iter().copied());
            assert!(out <= 2, "{out} sources left out");
            two += out;
            // The same sources with the first choice only.
            let mut load = vec![0u8; g.sets as usize];
            for a in &sources {
                let s = &mut load[g.sets_of(slot_key(a.to_be_bytes(), 32))[0] as usize];
                if (*s as usize) < WAYS {
                    *s += 1;
                } else {
                    one += 1;
                }
            }
        }
    }
    assert!(two <= 6, "{two} left out in 40 placements");
    assert!(one >= 100 * two.max(1), "one choice left out {one}, two {two}");
}

/// The first choice is the one set of earlier builds (a table they filled
/// reads the same: these values were printed by the one-choice build,
/// commit e54ba64), and the second is another set nearly always.
#[test]
fn two_choices_first_is_the_old_set() {
    let golden: [(u64, u32, [u8; 4], u32, u32); 12] = [
        (0x9e37_79b9_7f4a_7c15, 131_072, [10, 0, 0, 1], 32, 4679),
        (0x9e37_79b9_7f4a_7c15, 131_072, [203, 0, 113, 7], 32, 108_462),
        (0x9e37_79b9_7f4a_7c15, 131_072, [100, 64, 0, 0], 24, 121_202),
        (0x9e37_79b9_7f4a_7c15, 131_072, [255, 255, 255, 255], 32, 4370),
        (0x0123_4567_89ab_cdef, 32, [10, 0, 0, 1], 32, 24),
        (0x0123_4567_89ab_cdef, 32, [203, 0, 113, 7], 32, 13),
        (0x0123_4567_89ab_cdef, 32, [100, 64, 0, 0], 24, 4),
        (0x0123_4567_89ab_cdef, 32, [255, 255, 255, 255], 32, 22),
        (7, 1_000_003, [10, 0, 0, 1], 32, 88_800),
        (7, 1_000_003, [203, 0, 113, 7], 32, 171_128),
        (7, 1_000_003, [100, 64, 0, 0], 24, 911_621),
        (7, 1_000_003, [255, 255, 255, 255], 32, 881_028),
    ];
    for (seed, sets, addr, len, old) in golden {
        assert_eq!(geom(seed, sets).sets_of(slot_key(addr, len))[0], old, "{seed:#x} {sets} {addr:?}/{len}");
    }
    let g = geom(0x9e37_79b9_7f4a_7c15, 1 << 17);
    let mut same = 0;
    for i in 0..100_000u32 {
        let [a, b] = g.sets_of(slot_key((0x0a00_0000 + i).to_be_bytes(), 32));
        assert!(a < 1 << 17 && b < 1 << 17);
        same += (a == b) as u32;
    }
    assert!(same < 10, "{same} sources with one set twice");
    // One set: both choices are it.
    assert_eq!(geom(5, 1).sets_of(slot_key([10, 0, 0, 1], 32)), [0, 0]);
}

#[test]
fn hash_stays_in_range_and_spreads() {
    for sets in [1u32, 3, 1000, 1 << 18, u32::MAX] {
        let g = geom(0x9e37_79b9_7f4a_7c15, sets);
        for i in 0..10_000u32 {
            assert!(g.sets_of(slot_key(i.to_be_bytes(), 32)).iter().all(|&s| s < sets));
        }
    }
    // 65 536 sequential sources over 16 384 sets: no set gets many more
    // than its share (4), whatever the seed.
    for seed in [0, 1, 0x9e37_79b9_7f4a_7c15, 0xdead_beef_0bad_cafe, 0xbf58_476d_1ce4_e5b9] {
        let g = geom(seed, 16_384);
        let mut load = vec![0u32; 16_384];
        for i in 0..65_536u32 {
            load[g.sets_of(slot_key((0x0a01_0000 + i).to_be_bytes(), 32))[0] as usize] += 1;
        }
        let max = *load.iter().max().unwrap();
        assert!(max <= 16, "seed {seed:#x}: a set got {max} sources");
    }
}

#[test]
fn victims_empty_then_drained_then_least_debt() {
    let r = Rule::packets(1000, 10).unwrap();
    let now = 5_000_000_000;
    // Source i with n packets of debt, charged by `r`.
    let s = |i: u32, n: u64| {
        let mut tat = r.empty_tat(now);
        for _ in 0..n {
            tat = r.admit(tat, now, 64).unwrap();
        }
        Slot { key: stamped(slot_key(i.to_be_bytes(), 32), r.stamp), tat }
    };
    let unused = Slot::default();
    let one = |a: [Slot; WAYS]| [a, [s(9, 10); WAYS]];
    // A never-used slot first.
    assert_eq!(victim(&one([s(1, 9), unused, s(3, 9), unused]), now), (0, 1));
    // Else the first drained one.
    assert_eq!(victim(&one([s(1, 9), s(2, 5), s(3, 0), s(4, 0)]), now), (0, 2));
    // Else the least debt: a full bucket (a heavy hitter) goes last.
    assert_eq!(victim(&one([s(1, 10), s(2, 3), s(3, 10), s(4, 2)]), now), (0, 3));
    // Drained by the time asked.
    assert_eq!(victim(&one([s(1, 10), s(2, 3), s(3, 10), s(4, 2)]), now + 10_000_000), (0, 0));
    // Two sets: a free slot of the first set before any of the second ...
    let full = [s(1, 9), s(2, 9), s(3, 9), s(4, 9)];
    assert_eq!(victim(&[[s(1, 9), s(2, 0), s(3, 9), s(4, 9)], [unused; WAYS]], now), (0, 1));
    // ... then a never-used or drained slot of the second ...
    assert_eq!(victim(&[full, [s(5, 9), unused, s(7, 9), s(8, 9)]], now), (1, 1));
    assert_eq!(victim(&[full, [s(5, 9), s(6, 9), s(7, 0), s(8, 9)]], now), (1, 2));
    // ... else the least debt of the two, the first set's on a tie.
    assert_eq!(victim(&[full, [s(5, 9), s(6, 9), s(7, 4), s(8, 9)]], now), (1, 2));
    assert_eq!(victim(&[[s(1, 9), s(2, 4), s(3, 9), s(4, 9)], [s(5, 9), s(6, 9), s(7, 4), s(8, 9)]], now), (0, 1));
}

/// The reported case for eviction: eight sources whose rule had the old
/// unit (shift 16, period 78.19 h), charged full, then 60 h of silence.
/// `tat - now` wrapped to hours of "debt", so every slot looked like a
/// heavy hitter in debt and the one source active again — really in debt —
/// was evicted first as the least. Stale slots are drained: the first one
/// goes, and the active source keeps its slot.
#[test]
fn a_stale_slot_is_free() {
    let r = Rule::packets(1000, 2).unwrap();
    let (up, limit) = (crate::bucket::MAX_SHIFT - r.shift, r.limit << (crate::bucket::MAX_SHIFT - r.shift));
    let old = Rule {
        pkt_cost: r.pkt_cost << up,
        limit,
        shift: crate::bucket::MAX_SHIFT,
        stamp: crate::bucket::stamp(limit, crate::bucket::MAX_SHIFT),
        ..r
    };
    let t0 = 5_000_000_000;
    let full = |i: u32, rule: &Rule, t: u64| Slot {
        key: stamped(slot_key(i.to_be_bytes(), 32), rule.stamp),
        tat: rule.empty_tat(t).wrapping_add(rule.limit),
    };
    let mut sets = [[Slot::default(); WAYS]; 2];
    for (i, slot) in sets.iter_mut().flatten().enumerate() {
        *slot = full(i as u32, &old, t0);
    }
    let t = t0 + 60 * 3_600_000_000_000;
    assert!(sets.iter().flatten().all(|s| s.bucket(0).debt_ns(t) == 0 && s.bucket(0).fill_q16(t) == 0));
    assert_eq!(victim(&sets, t), (0, 0));
    // Source 0 is back and in debt (in its rule's own unit now): it stays.
    sets[0][0] = full(0, &r, t);
    assert_eq!(victim(&sets, t), (0, 1));
    sets[0] = [full(0, &r, t), full(1, &r, t), full(2, &r, t), full(3, &r, t)];
    assert_eq!(victim(&sets, t), (1, 0));
}

/// A rule any constructor makes, every unit alike (log-uniform rates and
/// bursts, packet and byte mode).
fn wide_rule() -> impl Strategy<Value = Rule> {
    let log = |lo: u64, hi: u64| {
        (lo.ilog2()..=hi.ilog2()).prop_flat_map(move |b| (1u64 << b).max(lo)..=((2u64 << b) - 1).min(hi))
    };
    use crate::bucket::{MAX_BURST, MAX_RATE_BPS, MAX_RATE_PPS, MIN_RATE_BPS};
    prop_oneof![
        (log(1, MAX_RATE_PPS), log(1, MAX_BURST)).prop_map(|(r, b)| Rule::packets(r, b).unwrap()),
        (log(MIN_RATE_BPS, MAX_RATE_BPS), log(1, MAX_BURST)).prop_map(|(r, b)| Rule::bytes(r, b).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Eviction across wraps: slots charged at t0 by rules of every unit,
    /// read after a gap that covers their debt and falls outside their
    /// alias windows, are drained: the first slot of the first set is
    /// taken, and a source charged again at that time is never the victim
    /// while a drained slot is left.
    #[test]
    fn stale_slots_are_free_across_wraps(
        rules in prop::collection::vec((wide_rule(), 0..=1024u64), 2 * WAYS),
        t0 in any::<u64>(),
        gap in prop_oneof![any::<u64>(), 0..1u64 << 52],
        hot in 0..2 * WAYS,
    ) {
        let mut sets = [[Slot::default(); WAYS]; 2];
        let mut stale = true;
        for (i, (r, fill)) in rules.iter().enumerate() {
            let d0 = (r.limit as u128 * *fill as u128 / 1024) as u64;
            sets[i / WAYS][i % WAYS] =
                Slot { key: stamped(slot_key((i as u32).to_be_bytes(), 32), r.stamp), tat: r.empty_tat(t0).wrapping_add(d0) };
            // Judged by what the slot remembers of its rule (its stamp),
            // as eviction reads it.
            let (limit, shift) = crate::bucket::unstamp(r.stamp);
            let seen = Rule { limit, shift, ..*r };
            stale &= !seen.gap_may_alias(d0, gap) && (gap as u128) << r.shift >= d0 as u128;
        }
        prop_assume!(stale);
        let t = t0.wrapping_add(gap);
        prop_assert!(sets.iter().flatten().all(|s| s.bucket(0).debt_ns(t) == 0));
        prop_assert_eq!(victim(&sets, t), (0, 0));
        // The hot source is charged again at t and in debt.
        let r = rules[hot].0;
        if let Some(tat) = r.admit(r.empty_tat(t), t, 64) && tat != r.empty_tat(t) {
            sets[hot / WAYS][hot % WAYS].tat = tat;
            let v = victim(&sets, t);
            prop_assert_ne!(v, (hot / WAYS, hot % WAYS));
            prop_assert_eq!(sets[v.0][v.1].bucket(0).debt_ns(t), 0);
        }
    }
}

/// A geometry of `sets` sets hashed with `seed`.
fn geom(seed: u64, sets: u32) -> Geometry {
    Geometry { seed, sets: sets as u64, capacity: 0 }
}

/// A source seen once goes before a drained source that came back, both
/// before any debt; across sets, a drained returned slot of the first set
/// goes only when the second has nothing better.
#[test]
fn drained_sources_seen_once_go_first() {
    let r = Rule::packets(1000, 10).unwrap();
    let now = 5_000_000_000;
    let s = |i: u32, n: u64, returned: bool| {
        let mut tat = r.empty_tat(now);
        for _ in 0..n {
            tat = r.admit(tat, now, 64).unwrap();
        }
        let key = stamped(slot_key(i.to_be_bytes(), 32), r.stamp) | if returned { KEY_RETURNED } else { 0 };
        Slot { key, tat }
    };
    assert!(s(1, 0, true).returned() && !s(1, 0, false).returned());
    // The returned bit survives a change of stamp.
    assert!(Slot { key: stamped(s(1, 0, true).key, 77), tat: 0 }.returned());
    let debt = [s(11, 3, true), s(12, 3, true), s(13, 3, true), s(14, 3, true)];
    assert_eq!(victim(&[[s(1, 0, true), s(2, 0, false), s(3, 5, true), s(4, 0, true)], debt], now), (0, 1));
    assert_eq!(victim(&[[s(1, 0, true), s(2, 1, false), s(3, 5, true), s(4, 0, true)], debt], now), (0, 0));
    // The second set's once-seen drained slot before the first's returned one.
    assert_eq!(
        victim(
            &[
                [s(1, 0, true), s(2, 9, true), s(3, 9, true), s(4, 9, true)],
                [s(5, 9, true), s(6, 0, false), s(7, 9, true), s(8, 9, true)]
            ],
            now
        ),
        (1, 1)
    );
    // Zero debt before any debt, returned or not.
    assert_eq!(victim(&[[s(1, 1, false), s(2, 9, false), s(3, 9, false), s(4, 0, true)], debt], now), (0, 3));
}

/// IPv6 sources: the key word is a fingerprint with the valid bit, below
/// the stamp and the returned bit; the key length is part of the hash,
/// and the sets are in range.
#[test]
fn ipv6_key_words() {
    let g = geom(0x1234_5678, 1 << 17);
    let mut words = std::collections::HashSet::new();
    for i in 0..50_000u64 {
        let hi = (0x2001_0db8_0000_0000u64 + i).to_be();
        let h = g.hash_v6(hi, 0, 64, 0);
        let w = v6_key_word(h);
        assert_eq!(w & !KEY_MASK, 0);
        assert!(w & KEY_VALID != 0);
        let [a, b] = g.sets_of_hash(h);
        assert!(a < 1 << 17 && b < 1 << 17);
        words.insert(w);
        assert_ne!(h, g.hash_v6(hi, 0, 48, 0));
    }
    assert_eq!(words.len(), 50_000);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// The branch-free debt of eviction reads what the bucket reads, for
    /// every rule's stamp, any state and any time.
    #[test]
    fn branch_free_debt_is_the_buckets(r in wide_rule(), tat in any::<u64>(), now in any::<u64>(), near in 0..1u64 << 40) {
        let slot = Slot { key: stamped(slot_key([10, 0, 0, 1], 32), r.stamp), tat };
        prop_assert_eq!(slot_debt_ns(&slot, now), slot.bucket(0).debt_ns(now));
        // States near now too (any u64 is nearly always stale).
        let slot = Slot { tat: r.empty_tat(now).wrapping_add(near), ..slot };
        prop_assert_eq!(slot_debt_ns(&slot, now), slot.bucket(0).debt_ns(now));
    }
}

#[test]
fn a_sampled_count_carries_its_margin() {
    use super::drop_count_margin as m;
    assert_eq!(m(0, 6), 0);
    assert_eq!(m(1000, 0), 0);
    // sqrt(64 * 2751) = 419.6: within 2 sigma, 838.
    assert_eq!(m(2751, 6), 838);
    // 5 % once it has dropped 25 000 frames (the constant's doc): 2 sigma 2 528.
    assert_eq!(m(25_000, 6), 2528);
}

/// A set's bit in the used-sets bitmap, and the sets a bitmap marks.
#[test]
fn the_used_sets_bitmap_marks_a_bit_a_set() {
    use super::{used_bit, used_sets, used_words};
    assert_eq!((used_words(0), used_words(1), used_words(64), used_words(65)), (1, 1, 1, 2));
    assert_eq!(used_words(super::sets_for(crate::maps::DEFAULT_MAX_SOURCES)), 8192);
    let mut words = vec![0u64; used_words(200) as usize];
    for s in [0, 63, 64, 130, 199] {
        let (w, bit) = used_bit(s);
        words[w as usize] |= bit;
    }
    assert_eq!(used_sets(&words).collect::<std::vec::Vec<_>>(), [0, 63, 64, 130, 199]);
    assert_eq!(used_sets(&[0, 0]).count(), 0);
}

/// A drop word keeps one rule's count: the same rule adds, another starts
/// over with its own slot; a word of an earlier build (no slot) names none.
#[test]
fn a_drop_word_counts_one_rules_drops() {
    use super::{DROP_COUNT_MASK, drop_count, drop_word, dropped_by, same_dropper};
    let w = drop_word(7, 64);
    assert_eq!((drop_count(w), dropped_by(w)), (64, Some(7)));
    assert!(same_dropper(w, 7) && !same_dropper(w, 8) && !same_dropper(w, 0));
    assert_eq!(drop_count(w + 64), 128);
    assert_eq!(dropped_by(w + 64), Some(7));
    // The largest rule slot and count stay apart.
    let big = drop_word(super::DROP_SLOT_MASK as u32, DROP_COUNT_MASK);
    assert_eq!((drop_count(big), dropped_by(big)), (DROP_COUNT_MASK, Some(super::DROP_SLOT_MASK as u32)));
    assert!(u64::from(crate::maps::MAX_RULES) < super::DROP_SLOT_MASK);
    // An earlier build's word: a count, no slot.
    assert_eq!((drop_count(640), dropped_by(640)), (640, None));
    assert_eq!(dropped_by(drop_word(3, 0)), None);
    // A slot's bucket reads the count alone.
    let slot = super::Slot { key: 0, tat: 0 };
    assert_eq!(slot.bucket(w).drops(), 64);
}
