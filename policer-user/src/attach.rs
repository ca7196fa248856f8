//! Counter lines printed by the daemon.

use std::time::Duration;

use policer_common::Counters;

/// One counters line; rates are per second since the previous sample.
pub fn format_line(elapsed: Duration, now: &Counters, prev: &Counters, dt: f64) -> String {
    let r = |a: u64, b: u64| {
        if dt > 0.0 { (a.saturating_sub(b)) as f64 / dt } else { 0.0 }
    };
    format!(
        "[{:>8.1}s] passed {} pkts ({:.0}/s)  dropped {} pkts ({:.0}/s)  would-drop {}  \
         sources {}  unmatched {}  non-ip {}  malformed {}",
        elapsed.as_secs_f64(),
        now.passed_pkts,
        r(now.passed_pkts, prev.passed_pkts),
        now.dropped_pkts,
        r(now.dropped_pkts, prev.dropped_pkts),
        now.would_drop_pkts,
        now.buckets_created,
        now.unmatched_pkts,
        now.non_ip_pkts,
        now.malformed_pkts,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_line_rates() {
        let prev = Counters { passed_pkts: 100, dropped_pkts: 10, ..Default::default() };
        let now = Counters { passed_pkts: 300, dropped_pkts: 1010, ..Default::default() };
        let l = format_line(Duration::from_secs(3), &now, &prev, 2.0);
        assert!(l.contains("passed 300 pkts (100/s)"), "{l}");
        assert!(l.contains("dropped 1010 pkts (500/s)"), "{l}");
    }
}
