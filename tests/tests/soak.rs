//! Tier 3, the soak's 30-second version (`cargo xtask soak` runs it for
//! minutes): a spoofed flood, a heavy hitter and in-profile sources while
//! rules change, the config is reloaded, `/metrics` is scraped and `top`
//! and `stats` run every second. Afterwards the policer's passed count
//! equals what the receiving side counted, the daemon's RSS grew at most
//! 1 MB after the warm-up, and no control request waited more than 100 ms
//! beyond the same call with no load (see `policer_tests::soak`).

use policer_tests::{
    privileged,
    soak::{MAX_RSS_GROWTH_BYTES, MAX_WAIT_MS, Options, run},
};

#[test]
fn soak_short() {
    if !privileged("soak tier") {
        return;
    }
    let r = run(&Options::short(), &|m| eprintln!("soak: {m}")).expect("soak");
    // The figures first, so a failure shows all of them.
    eprintln!("{}", r.markdown());
    assert!(r.errors.is_empty(), "{} calls failed: {:#?}", r.errors.len(), r.errors);
    assert_eq!(r.socket_drops, 0, "the receiving socket lost frames: its count cannot be trusted");
    assert_eq!(r.other_outcomes, 0, "frames counted outside passed/dropped");
    assert_eq!(r.passed, r.received(), "the policer's passed count against the frames the receiving side counted");
    assert!(
        r.accounted(),
        "sent {} + {}, judged {} + {}, veth drops {}",
        r.paced_sent,
        r.flood_sent,
        r.passed,
        r.dropped,
        r.veth_dropped
    );
    assert_eq!(r.metrics_passed, Some(r.passed), "/metrics disagrees with stats --json");
    assert!(
        r.rss_ok(),
        "daemon RSS grew {} bytes after the warm-up (first third median {} KiB, last third least {} KiB), limit {MAX_RSS_GROWTH_BYTES}",
        r.rss_growth_bytes(),
        r.rss_warm_kib,
        r.rss_end_kib
    );
    let (call, ms) = r.worst_wait();
    assert!(
        r.waits_ok(),
        "`{call}` waited {ms:.1} ms beyond its no-load median (limit {MAX_WAIT_MS} ms); every call: {:#?}",
        r.calls.iter().map(|c| (c.call.as_str(), c.waited_p99(), c.waited_max())).collect::<Vec<_>>()
    );
    assert!(r.sigterm_clean, "the daemon did not exit cleanly on SIGTERM");
}
