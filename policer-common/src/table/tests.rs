use super::*;
use crate::Rule;

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

/// A table sized for N sources holds at least 95 % of N distinct sources
/// at once, sequential or random, for any seed the loader may draw.
#[test]
fn a_full_table_holds_its_sources() {
    let mut x = 0x1234_5678_9abc_def1u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for n in [4096u32, 65_536, 1 << 20] {
        for _ in 0..3 {
            let g = Geometry::new(rnd(), sets_for(n));
            for random in [false, true] {
                let mut load = vec![0u8; g.sets as usize];
                let mut held = 0u32;
                for i in 0..n {
                    let a = if random { rnd() as u32 } else { 0x0a00_0000 + i };
                    let s = &mut load[g.set_of(slot_key(a.to_be_bytes(), 32)) as usize];
                    if (*s as usize) < WAYS {
                        *s += 1;
                        held += 1;
                    }
                }
                assert!(held as f64 >= 0.95 * n as f64, "{n} sources (random {random}): {held} held");
            }
        }
    }
}

#[test]
fn hash_stays_in_range_and_spreads() {
    for sets in [1u32, 3, 1000, 1 << 18, u32::MAX] {
        let g = Geometry::new(0x9e37_79b9_7f4a_7c15, sets);
        for i in 0..10_000u32 {
            assert!(g.set_of(slot_key(i.to_be_bytes(), 32)) < sets);
        }
    }
    // 65 536 sequential sources over 16 384 sets: no set gets many more
    // than its share (4), whatever the seed.
    for seed in [0, 1, 0x9e37_79b9_7f4a_7c15, 0xdead_beef_0bad_cafe, 0xbf58_476d_1ce4_e5b9] {
        let g = Geometry::new(seed, 16_384);
        let mut load = vec![0u32; 16_384];
        for i in 0..65_536u32 {
            load[g.set_of(slot_key((0x0a01_0000 + i).to_be_bytes(), 32)) as usize] += 1;
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
    // A never-used slot first.
    assert_eq!(victim(&[s(1, 9), unused, s(3, 9), unused], now), 1);
    // Else the first drained one.
    assert_eq!(victim(&[s(1, 9), s(2, 5), s(3, 0), s(4, 0)], now), 2);
    // Else the least debt: a full bucket (a heavy hitter) goes last.
    assert_eq!(victim(&[s(1, 10), s(2, 3), s(3, 10), s(4, 2)], now), 3);
    // Drained by the time asked.
    assert_eq!(victim(&[s(1, 10), s(2, 3), s(3, 10), s(4, 2)], now + 10_000_000), 0);
}
