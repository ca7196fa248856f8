//! Rendering counters for people: the daemon's counter lines, `policer
//! stats` and `policer top`.

use std::{fmt::Write as _, time::Duration};

use policer_common::Counters;

use crate::control::{CountersView, IfaceStats, RateView, StatsView, TopEntry, TopView};

fn rate(r: &Option<RateView>, f: impl Fn(&RateView) -> f64) -> String {
    r.as_ref().map(|r| format!("{:.0}/s", f(r))).unwrap_or_default()
}

/// A plain table (no borders, columns padded, numbers right-aligned):
/// easy to read and to cut with awk.
pub fn table(headers: &[&str], numeric_from: usize) -> comfy_table::Table {
    let mut t = comfy_table::Table::new();
    t.load_style(comfy_table::presets::NOTHING).set_header(headers.iter().copied());
    for i in numeric_from..headers.len() {
        if let Some(c) = t.column_mut(i) {
            c.set_cell_alignment(comfy_table::CellAlignment::Right);
        }
    }
    t
}

fn iface_row(t: &mut comfy_table::Table, i: &IfaceStats) {
    let c = &i.counters;
    t.add_row(vec![
        i.name.clone(),
        c.passed_packets.to_string(),
        rate(&i.rates, |r| r.passed_pps),
        c.dropped_packets.to_string(),
        rate(&i.rates, |r| r.dropped_pps),
        c.would_drop_packets.to_string(),
        i.unmatched_packets.to_string(),
        i.non_ip_packets.to_string(),
        i.malformed_packets.to_string(),
        i.fragment_packets.to_string(),
    ]);
}

/// The fleet budgets (`[global]`): the backend's state, then a line per
/// budget with its last period (`status` and `stats`).
pub fn fleet_lines(f: &crate::control::FleetStatus) -> Vec<String> {
    let state = if f.backend_up {
        "up".to_string()
    } else {
        format!("DOWN ({}): global rules on their fallback", f.last_error.as_deref().unwrap_or("no answer yet"))
    };
    let mut out = vec![format!(
        "fleet: node {} leasing from Redis {} every {} ms (fallback {}): backend {state}; {} rounds, {} failed",
        f.node_id, f.redis, f.lease_period_ms, f.fallback, f.rounds, f.failures
    )];
    if f.node_id_clash {
        out.push(format!(
            "  WARNING: another daemon leases as node {} too: the two share one node's place in every budget; give \
             each node its own node_id in [global]",
            f.node_id
        ));
    }
    for b in &f.budgets {
        out.push(format!(
            "  global {}: budget {} pps over {} live nodes; last period asked {}, granted {}{} ({} pps), used {} of \
             {} offered; rules {}",
            b.name,
            b.budget_pps,
            b.live_nodes,
            b.asked,
            b.granted,
            if b.fallback { " by FALLBACK" } else { "" },
            b.rate_pps,
            b.used,
            b.demand,
            b.rules.join(", ")
        ));
    }
    out
}

/// The text form of one stats sample.
pub fn stats_text(s: &StatsView) -> String {
    let mut out = String::new();
    let mut t = table(
        &["INTERFACE", "PASSED", "", "DROPPED", "", "WOULD-DROP", "UNMATCHED", "NON-IP", "MALFORMED", "FRAGMENTS"],
        1,
    );
    for i in &s.interfaces {
        iface_row(&mut t, i);
    }
    iface_row(&mut t, &s.totals);
    let _ = writeln!(out, "{t}\n");
    for i in s.interfaces.iter().filter(|i| i.detached_since.is_some()) {
        let _ = writeln!(
            out,
            "warning: {}: the program is NOT ATTACHED since {} (removed from outside): its frames pass unjudged, \
             not counted here\n",
            i.name,
            i.detached_since.as_deref().unwrap_or_default()
        );
    }
    let mut t =
        table(&["RULE", "CLASS", "ACTION", "PASSED", "", "DROPPED", "", "BY-TOTAL", "WOULD-DROP", "SOURCES"], 3);
    for r in &s.rules {
        let c: &CountersView = &r.counters;
        t.add_row(vec![
            r.prefix.clone(),
            if r.class.is_empty() { "-".into() } else { r.class.clone() },
            r.action.clone(),
            c.passed_packets.to_string(),
            rate(&r.rates, |r| r.passed_pps),
            c.dropped_packets.to_string(),
            rate(&r.rates, |r| r.dropped_pps),
            c.total_dropped_packets.to_string(),
            c.would_drop_packets.to_string(),
            c.buckets_created.to_string(),
        ]);
    }
    let _ = writeln!(out, "{t}");
    for r in &s.rules {
        if let Some(y) = &r.syn {
            let _ = writeln!(
                out,
                "syn cookies of {} [{}] ({}): {} SYNs of unverified sources, {} answered with cookies, {} held back by \
                 the reflection cap, {} passed to the kernel within the flood budget; cookie ACKs {} accepted, {} \
                 refused; {} sources verified; {} SYNs to no listener, {} without a cookie from the kernel",
                r.prefix,
                r.class,
                y.mode,
                y.counters.syns,
                y.counters.cookies_sent,
                y.counters.synacks_capped,
                y.counters.syns_passed,
                y.counters.acks_accepted,
                y.counters.acks_refused,
                y.counters.sources_verified,
                y.counters.no_listener,
                y.counters.no_cookie
            );
        }
    }
    let _ = writeln!(
        out,
        "\nbucket table: capacity {}, buckets created {}, insert failures {}, compare-and-swap retries {}",
        s.table.capacity, s.table.created, s.table.insert_failures, s.totals.cas_retries
    );
    for l in s.interfaces.iter().map(chain_line) {
        let _ = writeln!(out, "{l}");
    }
    let _ = writeln!(
        out,
        "table pressure: new sources limited {}, recall: {} of {} entries live, {} stored, {} known sources let in, \
         {} frames dropped on a recalled debt",
        s.totals.new_sources_limited,
        s.table.recall_live,
        s.table.recall_capacity,
        s.totals.recall_stored,
        s.totals.recall_known,
        s.totals.recall_debt_drops
    );
    for l in s.fleet.iter().flat_map(fleet_lines) {
        let _ = writeln!(out, "{l}");
    }
    let b = &s.bans;
    let _ = writeln!(
        out,
        "bans: {} manual in force ({} frames dropped); {} automatic in force, {} started, {} frames dropped, \
         store {} of {} entries ({} bans not made: store full)",
        b.manual_active,
        b.manual_dropped_packets,
        b.auto_active,
        b.auto_started,
        b.auto_dropped_packets,
        b.auto_stored,
        b.auto_capacity,
        b.auto_refused_full
    );
    out
}

/// An interface's chain hand-offs, for `stats`.
fn chain_line(i: &crate::control::IfaceStats) -> String {
    format!(
        "chain on {}: {} frames handed on, {} passed with the chain empty",
        i.name, i.chain_handed_packets, i.chain_empty_packets
    )
}

/// A count as it was counted: `1984`, or a sampled one `~1984 ±838` (its
/// margin: two standard deviations).
pub fn estimate(n: u64, margin: u64) -> String {
    if margin == 0 { n.to_string() } else { format!("~{n} ±{margin}") }
}

pub(crate) fn top_rows(out: &mut String, title: &str, rows: &[TopEntry]) {
    let _ = writeln!(out, "{title}");
    if rows.is_empty() {
        let _ = writeln!(out, "  (none)");
        return;
    }
    let mut t = table(&["SOURCE", "RULE", "FILL", "DEBT", "DROPS"], 2);
    for e in rows {
        t.add_row(vec![
            e.source.clone(),
            e.rule.clone(),
            format!("{:.1}%", e.fill * 100.0),
            format!("{:.3}ms", e.debt_ns as f64 / 1e6),
            // A monitor rule drops nothing: its refusals would-drop. Drops
            // another rule made are credited to it.
            match (e.action == "monitor", &e.dropped_by) {
                (_, Some(by)) => format!("{} (by {by})", estimate(e.drops, e.drops_margin)),
                (true, None) => format!("{} (would drop)", estimate(e.drops, e.drops_margin)),
                (false, None) => estimate(e.drops, e.drops_margin),
            },
        ]);
    }
    let _ = writeln!(out, "{t}");
}

pub fn top_text(t: &TopView) -> String {
    let mut out = String::new();
    for n in &t.not_attached {
        let _ = writeln!(
            out,
            "warning: the program is NOT ATTACHED on {n} (removed from outside): frames pass unjudged there\n"
        );
    }
    top_rows(&mut out, "most debt now (fill of the bucket; 100% = dropping, or would drop under monitor):", &t.by_debt);
    let _ = writeln!(out);
    top_rows(&mut out, "most drops (since each bucket was created):", &t.by_drops);
    let _ = writeln!(out);
    let _ = writeln!(out, "banned now ({} in all; soonest end first):", t.bans_total);
    if t.bans.is_empty() {
        let _ = writeln!(out, "  (none)");
    } else {
        let mut bt = table(&["SOURCE", "ORIGIN", "LEFT", "DROPPED"], 2);
        for b in &t.bans {
            let origin = match &b.rule {
                Some(r) => format!("{} ({r})", b.origin),
                None => b.origin.clone(),
            };
            bt.add_row(vec![
                b.prefix.clone(),
                origin,
                format!("{:.1}s", b.left_seconds),
                estimate(b.dropped_pkts, b.drops_margin),
            ]);
        }
        let _ = writeln!(out, "{bt}");
    }
    let _ = writeln!(
        out,
        "\n{} sources hold a bucket ({} in debt, {} idle: drained, kept until the slot is needed), read in {:.1} ms",
        t.live,
        t.live - t.idle.min(t.live),
        t.idle,
        t.read_ms
    );
    out
}

pub fn add_rates(now: &mut StatsView, prev: &StatsView) {
    let secs = now.time_ns.saturating_sub(prev.time_ns) as f64 / 1e9;
    now.totals.rates = Some(RateView::between(&now.totals.counters, &prev.totals.counters, secs));
    for i in &mut now.interfaces {
        if let Some(p) = prev.interfaces.iter().find(|p| p.name == i.name) {
            i.rates = Some(RateView::between(&i.counters, &p.counters, secs));
        }
    }
    for r in &mut now.rules {
        // A rule is its prefix and its class: a prefix's rules each have
        // their own counters.
        if let Some(p) = prev.rules.iter().find(|p| p.prefix == r.prefix && p.class == r.class) {
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
