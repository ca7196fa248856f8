//! Rendering counters for people: the daemon's counter lines, `policer
//! stats` and `policer top`.

use std::{fmt::Write as _, time::Duration};

use policer_common::Counters;

use crate::control::{CountersView, IfaceStats, RateView, StatsView, TopEntry, TopView};

fn rate(r: &Option<RateView>, f: impl Fn(&RateView) -> f64) -> String {
    r.as_ref().map(|r| format!("{:.0}/s", f(r))).unwrap_or_default()
}

fn iface_row(out: &mut String, i: &IfaceStats) {
    let c = &i.counters;
    let _ = writeln!(
        out,
        "{:<16} {:>14} {:>10} {:>14} {:>10} {:>12} {:>9} {:>9} {:>9} {:>9}",
        i.name,
        c.passed_packets,
        rate(&i.rates, |r| r.passed_pps),
        c.dropped_packets,
        rate(&i.rates, |r| r.dropped_pps),
        c.would_drop_packets,
        i.unmatched_packets,
        i.non_ip_packets,
        i.malformed_packets,
        i.fragment_packets,
    );
}

/// The text form of one stats sample.
pub fn stats_text(s: &StatsView) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:>14} {:>10} {:>14} {:>10} {:>12} {:>9} {:>9} {:>9} {:>9}",
        "INTERFACE", "PASSED", "", "DROPPED", "", "WOULD-DROP", "UNMATCHED", "NON-IP", "MALFORMED", "FRAGMENTS"
    );
    for i in &s.interfaces {
        iface_row(&mut out, i);
    }
    iface_row(&mut out, &s.totals);
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<44} {:<8} {:>14} {:>10} {:>14} {:>10} {:>12} {:>10}",
        "RULE", "ACTION", "PASSED", "", "DROPPED", "", "WOULD-DROP", "SOURCES"
    );
    for r in &s.rules {
        let c: &CountersView = &r.counters;
        let _ = writeln!(
            out,
            "{:<44} {:<8} {:>14} {:>10} {:>14} {:>10} {:>12} {:>10}",
            r.prefix,
            r.action,
            c.passed_packets,
            rate(&r.rates, |r| r.passed_pps),
            c.dropped_packets,
            rate(&r.rates, |r| r.dropped_pps),
            c.would_drop_packets,
            c.buckets_created
        );
    }
    let _ = writeln!(
        out,
        "\nbucket table: capacity {}, buckets created {}, insert failures {}, compare-and-swap retries {}",
        s.table.capacity, s.table.created, s.table.insert_failures, s.totals.cas_retries
    );
    out
}

fn top_rows(out: &mut String, title: &str, rows: &[TopEntry]) {
    let _ = writeln!(out, "{title}");
    let _ = writeln!(out, "  {:<44} {:<44} {:>8} {:>12} {:>12}", "SOURCE", "RULE", "FILL", "DEBT", "DROPS");
    for e in rows {
        let _ = writeln!(
            out,
            "  {:<44} {:<44} {:>7.1}% {:>10.3}ms {:>12}",
            e.source,
            e.rule,
            e.fill * 100.0,
            e.debt_ns as f64 / 1e6,
            e.drops
        );
    }
    if rows.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
}

pub fn top_text(t: &TopView) -> String {
    let mut out = String::new();
    top_rows(&mut out, "most debt now (fill of the bucket; 100% = dropping):", &t.by_debt);
    let _ = writeln!(out);
    top_rows(&mut out, "most drops (since each bucket was created):", &t.by_drops);
    let _ = writeln!(out, "\n{} live sources read in {:.1} ms", t.live, t.read_ms);
    out
}

/// Fills per-second rates in `now` from `prev`.
pub fn add_rates(now: &mut StatsView, prev: &StatsView) {
    let secs = now.time_ns.saturating_sub(prev.time_ns) as f64 / 1e9;
    now.totals.rates = Some(RateView::between(&now.totals.counters, &prev.totals.counters, secs));
    for i in &mut now.interfaces {
        if let Some(p) = prev.interfaces.iter().find(|p| p.name == i.name) {
            i.rates = Some(RateView::between(&i.counters, &p.counters, secs));
        }
    }
    for r in &mut now.rules {
        if let Some(p) = prev.rules.iter().find(|p| p.prefix == r.prefix) {
            r.rates = Some(RateView::between(&r.counters, &p.counters, secs));
        }
    }
}

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
