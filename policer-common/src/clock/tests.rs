use super::*;
use proptest::prelude::*;

/// Jiffies as the kernel keeps them: whole ticks since boot, possibly
/// behind by up to `lag` ticks.
fn jiffies_at(t: u64, tick: u64, lag: u64, offset: u64) -> u64 {
    (t / tick).saturating_sub(lag).wrapping_add(offset)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4096, ..ProptestConfig::default() })]

    /// With jiffies lagging by up to LAG_TICKS ticks (at the reading and
    /// now), the time now always lies in the window; and the SYN path's
    /// recent time is never after now, nor more than two ticks (and the
    /// jiffies' lag) before it.
    #[test]
    fn the_window_holds_the_time_and_the_recent_time_is_at_most_two_ticks_old(
        hz in prop::sample::select(std::vec![100u64, 250, 300, 1000]),
        t0 in 1u64..1 << 62,
        elapsed in prop_oneof![0u64..10_000_000, 0u64..30_000_000, 0u64..2_000_000_000],
        lag0 in 0..=LAG_TICKS,
        lag1 in 0..=LAG_TICKS,
        offset in any::<u64>(),
    ) {
        let tick = tick_ns(hz);
        let t1 = t0 + elapsed;
        let mut s = CpuScratch::default();
        // Jiffies are read before the clock, and never go back.
        let j0 = jiffies_at(t0, tick, lag0, offset);
        s.record(t0, j0);
        let j1 = jiffies_at(t1, tick, lag1, offset);
        let now_j = if j1.wrapping_sub(offset) < j0.wrapping_sub(offset) { j0 } else { j1 };
        if let Some(w) = s.window(now_j, tick) {
            prop_assert!(w.lo <= t1 && t1 <= w.hi, "{t1} not in {w:?}");
            prop_assert!(w.hi - w.lo <= MAX_WINDOW_NS);
        }
        if let Some(t) = s.recent(now_j, tick) {
            prop_assert!(t <= t1);
            prop_assert!(t1 - t <= (2 + LAG_TICKS) * tick, "{} ns old", t1 - t);
        } else {
            prop_assert!(elapsed > tick / 2 || lag1 < lag0, "no recent time {elapsed} ns after the reading");
        }
    }
}

#[test]
fn no_window_without_a_reading_or_a_tick() {
    let s = CpuScratch::default();
    assert_eq!(s.window(5, tick_ns(250)), None);
    let mut s = CpuScratch::default();
    s.record(1_000_000_000, 100);
    assert_eq!(s.window(100, 0), None);
    assert_eq!(s.window(100, MAX_TICK_NS + 1), None);
    // Too many ticks since: read the clock.
    assert_eq!(s.window(100 + MAX_WINDOW_TICKS + 1, tick_ns(250)), None);
    // Jiffies behind the reading (another CPU's, or wrapped): a huge
    // difference, so no window.
    assert_eq!(s.window(99, tick_ns(250)), None);
    assert_eq!(
        s.window(101, tick_ns(250)),
        Some(ClockWindow { lo: 1_000_000_000, hi: 1_000_000_000 + (2 + LAG_TICKS) * 4_000_000 })
    );
}

#[test]
fn ticks() {
    assert_eq!(tick_ns(250), 4_000_000);
    assert_eq!(tick_ns(1000), 1_000_000);
    assert_eq!(tick_ns(300), 3_333_334);
    assert_eq!(tick_ns(0), 0);
}
