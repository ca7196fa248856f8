use super::*;

/// A source's frames at these bins, the observation `bins` long.
fn peaks_of(frames: &[u64], bins: u64) -> ([Option<u64>; 3], u64) {
    let mut p = Peaks::new(frames[0]);
    for b in &frames[1..] {
        p.add(*b);
    }
    p.finish(bins)
}

#[test]
fn a_steady_source_peaks_at_its_rate() {
    // 5 frames in each of 200 bins (50 pps for 20 s).
    let frames: Vec<u64> = (0..200).flat_map(|b| [b; 5]).collect();
    assert_eq!(peaks_of(&frames, 200), ([Some(5), Some(50), Some(500)], 1000));
}

#[test]
fn windows_slide_by_one_bin() {
    // 7 frames in bin 9 and 8 in bin 10: a tumbling 1 s window (bins 0-9,
    // 10-19) would see 7 and 8; the sliding one sees both together.
    let mut frames = vec![9; 7];
    frames.extend([10; 8]);
    assert_eq!(peaks_of(&frames, 30), ([Some(8), Some(15), None], 15));
}

#[test]
fn a_burst_then_silence() {
    // 30 frames in bin 3, 1 in bin 150; 200 bins observed.
    let mut frames = vec![3; 30];
    frames.push(150);
    assert_eq!(peaks_of(&frames, 200), ([Some(30), Some(30), Some(30)], 31));
    // Bins 3 and 95 are 92 bins apart: one 10 s window holds both.
    let mut frames = vec![3; 30];
    frames.extend([95; 4]);
    assert_eq!(peaks_of(&frames, 200), ([Some(30), Some(30), Some(34)], 34));
    // 100 apart: never in one window.
    let mut frames = vec![3; 30];
    frames.extend([103; 4]);
    assert_eq!(peaks_of(&frames, 200), ([Some(30), Some(30), Some(30)], 34));
}

#[test]
fn late_frames_and_short_observations() {
    // A frame older than the latest counts in the latest bin.
    assert_eq!(peaks_of(&[5, 7, 6, 6], 20), ([Some(3), Some(4), None], 4));
    // Less than a window observed: that window has no peak; a source seen
    // only at the end of the first second is in the first 1 s window.
    assert_eq!(peaks_of(&[0, 9], 10), ([Some(1), Some(2), None], 2));
    assert_eq!(peaks_of(&[0], 5), ([Some(1), None, None], 1));
    // The first window holds every frame before its end, whenever the
    // source began.
    assert_eq!(peaks_of(&[2, 2, 8, 12], 100), ([Some(2), Some(3), Some(4)], 4));
}

#[test]
fn gaps_longer_than_the_ring_forget_the_old_bins() {
    // 1000 frames in bin 0, then one frame 250 bins later: every slot of
    // the ring is cleared, the old count not carried into later windows.
    let mut frames = vec![0; 1000];
    frames.push(250);
    frames.extend([350; 3]);
    assert_eq!(peaks_of(&frames, 400), ([Some(1000), Some(1000), Some(1000)], 1004));
    let mut frames = vec![0; 2];
    frames.extend([250, 350, 350]);
    assert_eq!(peaks_of(&frames, 400), ([Some(2), Some(2), Some(2)], 5));
}

#[test]
fn percentiles_are_nearest_rank() {
    let v: Vec<u64> = (1..=1000).collect();
    assert_eq!(percentile(&v, 500_000), Some(500));
    assert_eq!(percentile(&v, 900_000), Some(900));
    assert_eq!(percentile(&v, 990_000), Some(990));
    assert_eq!(percentile(&v, 999_000), Some(999));
    assert_eq!(percentile(&v, 1_000_000), Some(1000));
    assert_eq!(percentile(&v, 1), Some(1));
    // 23 values: 99.9 % is rank ⌈22.977⌉ = 23, 90 % rank ⌈20.7⌉ = 21.
    let v: Vec<u64> = (1..=23).map(|i| i * 10).collect();
    assert_eq!(percentile(&v, 999_000), Some(230));
    assert_eq!(percentile(&v, 900_000), Some(210));
    assert_eq!(percentile(&v, 869_565), Some(200));
    assert_eq!(percentile(&[], 500_000), None);
    assert_eq!(percentile(&[7], 1), Some(7));
}

#[test]
fn keep_parses_percentages() {
    assert_eq!(parse_keep("99.9%"), Ok(999_000));
    assert_eq!(parse_keep("99.9"), Ok(999_000));
    assert_eq!(parse_keep("100%"), Ok(1_000_000));
    assert_eq!(parse_keep("50"), Ok(500_000));
    assert_eq!(parse_keep("99.9999%"), Ok(999_999));
    assert_eq!(parse_keep(" 0.0001 % "), Ok(1));
    for bad in ["0", "0%", "100.1", "101%", "99.99999", "-5", "abc", "", "%", ".5", "1e2"] {
        assert!(parse_keep(bad).is_err(), "{bad}");
    }
    // The message names the value as written.
    assert!(parse_keep("x").unwrap_err().contains("\"x\""));
}

#[test]
fn proposals_cover_the_kept_peaks() {
    // 200 pps steady: 20 per 100 ms, 200 per 1 s, 2000 per 10 s.
    assert_eq!(propose(Kept { ms100: 20, s1: 200, s10: Some(2000) }), (200, 20));
    // Jitter: 202 in a second, 24 in 100 ms: the burst takes the larger
    // of 2 and 4, and at least a tenth of a second (20).
    assert_eq!(propose(Kept { ms100: 24, s1: 202, s10: Some(2001) }), (201, 21));
    // Bursty: 600 in one second, 1000 over 10 s: rate 100, burst 500.
    assert_eq!(propose(Kept { ms100: 300, s1: 600, s10: Some(1000) }), (100, 500));
    // Less than 10 s observed: the 1 s peak is the rate.
    assert_eq!(propose(Kept { ms100: 7, s1: 30, s10: None }), (30, 4));
    // A quiet population: at least 1 and 1.
    assert_eq!(propose(Kept { ms100: 0, s1: 0, s10: Some(0) }), (1, 1));
    for k in [
        Kept { ms100: 20, s1: 200, s10: Some(2000) },
        Kept { ms100: 300, s1: 600, s10: Some(1000) },
        Kept { ms100: 7, s1: 30, s10: None },
    ] {
        let (r, b) = propose(k);
        assert!(within(&[Some(k.ms100), Some(k.s1), k.s10], r, b), "{k:?}");
    }
    assert!(within(&[Some(20), Some(200), Some(2000)], 200, 20));
    assert!(!within(&[Some(200), Some(2000), Some(20000)], 200, 20));
    assert!(!within(&[Some(41), Some(200), Some(2000)], 200, 20));
    assert!(within(&[Some(1), None, None], 1, 1));
}
