//! Prometheus `/metrics`, built with prometheus-client from one sample of
//! the kernel's counters at each scrape (so values are exact, not
//! re-counted). Names and labels are documented in the README.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use prometheus_client::{
    encoding::{EncodeLabelSet, text::encode},
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::{
    control::{CountersView, StatsView},
    error::{Error, Result},
};

/// Parses `--metrics`: `9100` or `:9100` bind to 127.0.0.1; anything else
/// (`0.0.0.0:9100`, `[::1]:9100`) is taken as told.
pub fn parse_addr(s: &str) -> Result<SocketAddr> {
    let t = s.trim().trim_start_matches(':');
    if let Ok(port) = t.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.trim().parse().map_err(|_| Error::Invalid(format!("--metrics '{s}': expected PORT, :PORT or ADDRESS:PORT")))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Verdict {
    iface: String,
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct IfaceLabel {
    iface: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    iface: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BanOrigin {
    origin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleVerdict {
    rule: String,
    /// The rule's class (`udp dport 53`; `-` for none): one value per rule,
    /// never per packet.
    class: String,
    action: String,
    verdict: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ConfigLabel {
    sha256: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabel {
    rule: String,
    class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SynLabel {
    rule: String,
    class: String,
    event: String,
}

fn verdicts(c: &CountersView) -> [(&'static str, u64, u64); 3] {
    [
        ("passed", c.passed_packets, c.passed_bytes),
        ("dropped", c.dropped_packets, c.dropped_bytes),
        ("would_drop", c.would_drop_packets, c.would_drop_bytes),
    ]
}

/// The exposition text for one sample; `live` is the number of buckets
/// in the table and `evicted` the buckets evicted so far, both from the
/// daemon's last count of the table; `attached`, for each interface
/// policed, whether our program is the one attached to it now.
pub fn render(s: &StatsView, live: u64, evicted: u64, attached: &[(String, bool)]) -> String {
    let mut reg = Registry::with_prefix("policer");
    // The families are written in the order they are registered.
    interface_metrics(&mut reg, s, attached);
    rule_metrics(&mut reg, s);
    table_metrics(&mut reg, s, live, evicted);
    ban_metrics(&mut reg, &s.bans);
    config_metrics(&mut reg, &s.config);
    if let Some(f) = s.feeds.iter().find(|f| f.kind == "crowdsec") {
        feed_metrics(&mut reg, f);
    }
    if let Some(c) = &s.capture {
        capture_metrics(&mut reg, c);
    }
    if let Some(f) = &s.fleet {
        fleet_metrics(&mut reg, f);
    }
    let mut out = String::new();
    encode(&mut out, &reg).expect("writing to a String cannot fail");
    out
}

/// A counter that reads `v`.
fn counter(v: u64) -> Counter {
    let c: Counter = Counter::default();
    c.inc_by(v);
    c
}

/// A gauge that reads `v`.
fn gauge(v: u64) -> Gauge {
    let g: Gauge = Gauge::default();
    g.set(v as i64);
    g
}

/// `policer_interface_attached`, and each interface's verdicts and parse
/// outcomes (`policer_packets`, `policer_bytes`, `policer_parse_packets`).
fn interface_metrics(reg: &mut Registry, s: &StatsView, attached: &[(String, bool)]) {
    let on = Family::<IfaceLabel, Gauge>::default();
    for (iface, yes) in attached {
        on.get_or_create(&IfaceLabel { iface: iface.clone() }).set(i64::from(*yes));
    }
    reg.register(
        "interface_attached",
        "1 when our program is the one attached to the interface (as /healthz checks it), 0 when it was detached or \
         replaced",
        on,
    );
    let pkts = Family::<Verdict, Counter>::default();
    let bytes = Family::<Verdict, Counter>::default();
    let parse = Family::<OutcomeLabel, Counter>::default();
    for i in &s.interfaces {
        for (v, p, b) in verdicts(&i.counters) {
            let l = Verdict { iface: i.name.clone(), verdict: v.into() };
            pkts.get_or_create(&l).inc_by(p);
            bytes.get_or_create(&l).inc_by(b);
        }
        for (o, n) in [
            ("unmatched", i.unmatched_packets),
            ("non_ip", i.non_ip_packets),
            ("malformed", i.malformed_packets),
            ("fragment", i.fragment_packets),
        ] {
            parse.get_or_create(&OutcomeLabel { iface: i.name.clone(), outcome: o.into() }).inc_by(n);
        }
    }
    let chain = Family::<OutcomeLabel, Counter>::default();
    for i in &s.interfaces {
        for (o, n) in [("handed", i.chain_handed_packets), ("empty", i.chain_empty_packets)] {
            chain.get_or_create(&OutcomeLabel { iface: i.name.clone(), outcome: o.into() }).inc_by(n);
        }
    }
    reg.register(
        "chain_packets",
        "Frames the verdict passed on to the chain: handed to a program of it, or passed because it was empty",
        chain,
    );
    reg.register("packets", "Frames judged by a rule, by interface and verdict", pkts);
    reg.register("bytes", "Bytes of frames judged by a rule, by interface and verdict", bytes);
    reg.register(
        "parse_packets",
        "Frames by parse outcome (unmatched, non_ip and fragment pass; malformed is dropped)",
        parse,
    );
}

/// `policer_rule_*`: each rule's verdicts, sources and aggregate drops.
fn rule_metrics(reg: &mut Registry, s: &StatsView) {
    let rpkts = Family::<RuleVerdict, Counter>::default();
    let rbytes = Family::<RuleVerdict, Counter>::default();
    let rsources = Family::<RuleLabel, Counter>::default();
    let rtotal = Family::<RuleLabel, Counter>::default();
    let rsyn = Family::<SynLabel, Counter>::default();
    for r in &s.rules {
        if let Some(y) = &r.syn {
            let class = if r.class.is_empty() { "-".to_string() } else { r.class.clone() };
            for (event, n) in [
                ("syn", y.counters.syns),
                ("cookie_sent", y.counters.cookies_sent),
                ("ack_accepted", y.counters.acks_accepted),
                ("ack_refused", y.counters.acks_refused),
                ("source_verified", y.counters.sources_verified),
                ("synack_capped", y.counters.synacks_capped),
                ("no_listener", y.counters.no_listener),
                ("no_cookie", y.counters.no_cookie),
                ("syn_passed", y.counters.syns_passed),
            ] {
                let l = SynLabel { rule: r.prefix.clone(), class: class.clone(), event: event.into() };
                rsyn.get_or_create(&l).inc_by(n);
            }
        }
        let class = if r.class.is_empty() { "-".to_string() } else { r.class.clone() };
        for (v, p, b) in verdicts(&r.counters) {
            let l = RuleVerdict {
                rule: r.prefix.clone(),
                class: class.clone(),
                action: r.action.clone(),
                verdict: v.into(),
            };
            rpkts.get_or_create(&l).inc_by(p);
            rbytes.get_or_create(&l).inc_by(b);
        }
        let l = RuleLabel { rule: r.prefix.clone(), class };
        rsources.get_or_create(&l).inc_by(r.counters.buckets_created);
        rtotal.get_or_create(&l).inc_by(r.counters.total_dropped_packets);
    }
    reg.register(
        "rule_total_dropped_packets",
        "Frames of each rule its aggregate bucket (--total-rate) dropped, after their source's bucket admitted them",
        rtotal,
    );
    reg.register(
        "rule_syn_cookie_events",
        "SYN cookies of each rule with --syn-cookies, by event: syn (of an unverified source), cookie_sent, \
         ack_accepted, ack_refused, source_verified, synack_capped (reflection cap), no_listener, no_cookie, \
         syn_passed (flood mode: within the SYN budget, to the kernel)",
        rsyn,
    );
    reg.register("rule_packets", "Frames judged by each rule, by verdict", rpkts);
    reg.register("rule_bytes", "Bytes judged by each rule, by verdict", rbytes);
    reg.register("rule_buckets_created", "Buckets (sources) created under each rule", rsources);
}

/// The bucket table, the recall, the new-source limiter and the totals of
/// all rules (`policer_buckets_created` ... `policer_rules`).
fn table_metrics(reg: &mut Registry, s: &StatsView, live: u64, evicted: u64) {
    reg.register("buckets_created", "Buckets created in the table", counter(s.table.created));
    reg.register(
        "bucket_evictions",
        "Buckets evicted from the bucket tables to make room (created minus live)",
        counter(evicted),
    );
    reg.register("bucket_insert_failures", "Bucket inserts the kernel refused", counter(s.table.insert_failures));
    reg.register("cas_retries", "Compare-and-swap rounds lost to another CPU", counter(s.totals.cas_retries));
    reg.register(
        "new_sources_limited",
        "Sources refused a fresh bucket under table pressure (the frame dropped, no bucket made)",
        counter(s.totals.new_sources_limited),
    );
    reg.register(
        "recall_known",
        "Sources without a bucket the recall knew (evicted recently or in debt), let past the new-source limiter",
        counter(s.totals.recall_known),
    );
    reg.register(
        "recall_debt_drops",
        "Frames dropped on a debt the recall kept for an evicted source",
        counter(s.totals.recall_debt_drops),
    );
    reg.register("recall_stored", "Evicted buckets written to the recall", counter(s.totals.recall_stored));
    reg.register(
        "total_drops",
        "Frames the aggregate buckets (--total-rate) dropped, all rules",
        counter(s.totals.counters.total_dropped_packets),
    );
    reg.register(
        "class_matched",
        "Frames whose source prefix has classes that one of them matched",
        counter(s.totals.class_matched),
    );
    reg.register("recall_capacity", "Entries the recall holds", gauge(s.table.recall_capacity));
    reg.register("recall_live", "Entries of the recall that would recall a source now", gauge(s.table.recall_live));
    reg.register(
        "cas_exhausted",
        "Frames dropped because every compare-and-swap round was lost",
        counter(s.totals.cas_exhausted),
    );
    reg.register("bucket_table_capacity", "Capacity of the bucket table (--max-sources)", gauge(s.table.capacity));
    reg.register("bucket_table_live", "Buckets in the table now", gauge(live));
    reg.register(
        "rules",
        "Rules and sets installed (manual bans are in policer_bans_active)",
        gauge(s.rules.len() as u64),
    );
}

/// `policer_bans_*`, `policer_ban_*`: manual and automatic bans.
fn ban_metrics(reg: &mut Registry, b: &crate::control::BanStats) {
    let by_origin = |manual: u64, auto: u64| {
        let f = Family::<BanOrigin, Gauge>::default();
        f.get_or_create(&BanOrigin { origin: "manual".into() }).set(manual as i64);
        f.get_or_create(&BanOrigin { origin: "auto".into() }).set(auto as i64);
        f
    };
    reg.register(
        "bans_active",
        "Bans in force, by origin (manual: `policer ban`, exact; auto: --ban-for, as the daemon's last scan of the \
         ban store found them, at most a scan (1 s) stale)",
        by_origin(b.manual_active, b.auto_active),
    );
    let dropped = Family::<BanOrigin, Counter>::default();
    dropped.get_or_create(&BanOrigin { origin: "manual".into() }).inc_by(b.manual_dropped_packets);
    dropped.get_or_create(&BanOrigin { origin: "auto".into() }).inc_by(b.auto_dropped_packets);
    reg.register("ban_dropped_packets", "Frames dropped by bans, by origin", dropped);
    reg.register("bans_started", "Automatic bans started", counter(b.auto_started));
    reg.register(
        "bans_refused_full",
        "Automatic bans not made because the ban store was full (the source stays policed)",
        counter(b.auto_refused_full),
    );
    reg.register("ban_store_capacity", "Entries the automatic-ban store holds at most", gauge(b.auto_capacity));
    reg.register(
        "ban_store_entries",
        "Entries in the automatic-ban store (bans in force and those in their escalation window) at the daemon's \
         last scan of it (at most 1 s stale)",
        gauge(b.auto_stored),
    );
}

/// `policer_config_*`: the config file in force, its reloads and writes.
fn config_metrics(reg: &mut Registry, c: &crate::control::ConfigStatus) {
    let info = Family::<ConfigLabel, Gauge>::default();
    info.get_or_create(&ConfigLabel { sha256: c.sha256.clone() }).set(1);
    reg.register("config_info", "The config file in force, by the sha256 of its bytes", info);
    reg.register(
        "config_last_reload_success",
        "Whether the last reload of the config file applied it (1) or was refused (0)",
        gauge(c.last_reload_success as u64),
    );
    reg.register(
        "config_writes",
        "Writes of the config file by rule and ban changes (changes that arrive together share one write)",
        counter(c.writes),
    );
    reg.register(
        "config_changes_written",
        "Rule and ban changes written to the config file; divided by policer_config_writes_total: changes per write",
        counter(c.changes_written),
    );
    let at: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    at.set(c.last_reload_timestamp_seconds);
    reg.register(
        "config_last_reload_timestamp_seconds",
        "When the config file was last reloaded or refused (or the daemon started), Unix time",
        at,
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Label {
    origin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ScopeLabel {
    scope: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Reason {
    reason: String,
}

/// `policer_capture_*`: `policer capture` (docs/capture.md).
fn capture_metrics(reg: &mut Registry, c: &crate::capture::CaptureStatus) {
    let cap = reg.sub_registry_with_prefix("capture");
    let counter = |v: u64| {
        let k: Counter = Counter::default();
        k.inc_by(v);
        k
    };
    let active: Gauge = Gauge::default();
    active.set(c.active as i64);
    cap.register("active", "Captures running now", active);
    cap.register("frames", "Frames the program handed to captures through the ring buffer", counter(c.frames));
    cap.register(
        "rate_bounded",
        "Frames a capture's filter took that its rate bound (--max-pps, in the kernel) refused",
        counter(c.rate_bounded),
    );
    cap.register("ring_full", "Frames lost because the capture ring buffer was full", counter(c.ring_full));
    cap.register(
        "slow_reader",
        "Frames the daemon dropped because a capture's client read too slowly",
        counter(c.slow_reader),
    );
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GlobalLabel {
    global: String,
}

/// `policer_global_*`: the fleet budgets (`[global]`, docs/fleet.md).
fn fleet_metrics(reg: &mut Registry, f: &crate::control::FleetStatus) {
    let g = reg.sub_registry_with_prefix("global");
    g.register(
        "backend_up",
        "Whether the last lease round trip to Redis succeeded within a lease period (1) or not (0: the global rules \
         run on their fallback)",
        gauge(u64::from(f.backend_up)),
    );
    g.register(
        "node_id_clash",
        "1 while Redis finds another daemon leasing as this node id round after round (two nodes given one node_id)",
        gauge(u64::from(f.node_id_clash)),
    );
    g.register("lease_rounds", "Lease round trips tried", counter(f.rounds));
    g.register("lease_failures", "Lease round trips that failed or answered later than a period", counter(f.failures));
    type Gauges = Family<GlobalLabel, Gauge>;
    type Counters = Family<GlobalLabel, Counter>;
    let (fallback, live, budget, rate) = (Gauges::default(), Gauges::default(), Gauges::default(), Gauges::default());
    let (asked, granted, used) = (Counters::default(), Counters::default(), Counters::default());
    for b in &f.budgets {
        let l = GlobalLabel { global: b.name.clone() };
        fallback.get_or_create(&l).set(i64::from(b.fallback));
        live.get_or_create(&l).set(b.live_nodes as i64);
        budget.get_or_create(&l).set(b.budget_pps as i64);
        rate.get_or_create(&l).set(b.rate_pps as i64);
        asked.get_or_create(&l).inc_by(b.asked_total);
        granted.get_or_create(&l).inc_by(b.granted_total);
        used.get_or_create(&l).inc_by(b.used_total);
    }
    g.register("fallback", "1 while the budget runs on its fallback on this node", fallback);
    g.register("live_nodes", "Nodes live in the budget at the last lease (the last known in fallback)", live);
    g.register("budget_pps", "The whole fleet's rate of the budget, packets/s", budget);
    g.register("rate_pps", "The rate this node's share runs at now, packets/s", rate);
    g.register("asked_packets", "Tokens this node asked for", asked);
    g.register("granted_packets", "Tokens granted to this node (or taken by its fallback)", granted);
    g.register("used_packets", "Frames the budget's aggregate admitted on this node", used);
}

/// `policer_crowdsec_*`: the feed from CrowdSec's Local API.
fn feed_metrics(reg: &mut Registry, f: &crate::control::FeedStatus) {
    let gauge = |v: u64| {
        let g: Gauge = Gauge::default();
        g.set(v as i64);
        g
    };
    let counter = |v: u64| {
        let c: Counter = Counter::default();
        c.inc_by(v);
        c
    };
    let cs = reg.sub_registry_with_prefix("crowdsec");
    cs.register(
        "last_sync_success",
        "Whether the last pull of the Local API's decisions succeeded (1) or failed (0)",
        gauge(f.last_sync_success as u64),
    );
    let at: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    at.set(f.last_sync_timestamp_seconds);
    cs.register("last_sync_timestamp_seconds", "When the last pull was tried, Unix time", at);
    let ok: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    ok.set(f.last_success_timestamp_seconds);
    cs.register("last_success_timestamp_seconds", "When a pull last succeeded, Unix time (0: never)", ok);
    let by = Family::<Label, Gauge>::default();
    for (o, n) in &f.decisions_by_origin {
        by.get_or_create(&Label { origin: o.clone() }).set(*n as i64);
    }
    cs.register("decisions", "Decisions in force, by origin", by);
    let by_scope = Family::<ScopeLabel, Gauge>::default();
    for sc in ["ip", "range", "country", "as"] {
        let _ = by_scope.get_or_create(&ScopeLabel { scope: sc.into() });
    }
    for (sc, n) in &f.decisions_by_scope {
        by_scope.get_or_create(&ScopeLabel { scope: sc.clone() }).set(*n as i64);
    }
    cs.register("scope_decisions", "Decisions in force, by scope (ip, range, country, as)", by_scope);
    cs.register("prefixes", "Distinct prefixes the decisions in force make", gauge(f.prefixes));
    cs.register("decisions_received", "Decisions received from the Local API", counter(f.received));
    cs.register("decisions_deleted", "Decisions the Local API deleted", counter(f.deleted));
    cs.register("decisions_expired", "Decisions that ended at their own end", counter(f.expired));
    let skipped = Family::<Reason, Counter>::default();
    for r in crate::crowdsec::SKIP_REASONS {
        let _ = skipped.get_or_create(&Reason { reason: (*r).into() });
    }
    for (r, n) in &f.skipped {
        skipped.get_or_create(&Reason { reason: r.clone() }).inc_by(*n);
    }
    cs.register("decisions_skipped", "Decisions received and not applied, by reason", skipped);
    let left = Family::<Reason, Gauge>::default();
    left.get_or_create(&Reason { reason: "protected".into() }).set(f.left_out_protected as i64);
    left.get_or_create(&Reason { reason: "rule_prefix".into() }).set(f.left_out_rule_prefix as i64);
    cs.register("left_out", "Prefixes in force left out of the set now (protected, or a rule's prefix)", left);
    let errors = Family::<KindLabel, Counter>::default();
    for k in crate::crowdsec::ERROR_KINDS {
        let _ = errors.get_or_create(&KindLabel { kind: (*k).into() });
    }
    for (k, n) in &f.errors {
        errors.get_or_create(&KindLabel { kind: k.clone() }).inc_by(*n);
    }
    cs.register("errors", "Failed requests to the Local API and failed applies, by kind", errors);
    cs.register("published_bans", "Automatic bans posted to the Local API (publish = true)", counter(f.published));
    cs.register("publish_pending", "Automatic bans waiting to be posted", gauge(f.publish_pending));
}

/// The content type of what [`render`] returns: OpenMetrics text, as
/// prometheus-client's encoder writes it (counter families are named
/// without `_total`, their samples with it; the text ends with `# EOF`).
/// Prometheus asks for it first when it scrapes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{IfaceStats, RuleStats, TableStats};

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("9100").unwrap().to_string(), "127.0.0.1:9100");
        assert_eq!(parse_addr(":9100").unwrap().to_string(), "127.0.0.1:9100");
        assert_eq!(parse_addr("0.0.0.0:9100").unwrap().to_string(), "0.0.0.0:9100");
        assert_eq!(parse_addr("[::1]:9100").unwrap().to_string(), "[::1]:9100");
        assert!(parse_addr("localhost").is_err());
        assert!(parse_addr("99999").is_err());
    }

    #[test]
    fn renders_names_and_labels() {
        let c = CountersView { passed_packets: 5, dropped_packets: 7, dropped_bytes: 448, ..Default::default() };
        let s = StatsView {
            interfaces: vec![IfaceStats {
                name: "eth0".into(),
                counters: c.clone(),
                malformed_packets: 2,
                ..Default::default()
            }],
            rules: vec![RuleStats {
                prefix: "0.0.0.0/0".into(),
                class: "udp dport 53".into(),
                action: "police".into(),
                counters: c,
                syn: Some(crate::control::SynStatsView {
                    mode: "always".into(),
                    counters: policer_common::syn::SynCounters { syns: 9, cookies_sent: 7, ..Default::default() },
                }),
                rates: None,
            }],
            table: TableStats { capacity: 1024, created: 10, live: None, insert_failures: 0, ..Default::default() },
            config: crate::control::ConfigStatus {
                sha256: "ab12".into(),
                last_reload_success: true,
                last_reload_timestamp_seconds: 1_700_000_000.5,
                last_reload_error: None,
                read_only: false,
                writes: 3,
                changes_written: 7,
                ..Default::default()
            },
            ..Default::default()
        };
        let text = render(&s, 4, 6, &[("eth0".into(), true), ("eth1".into(), false)]);
        for line in [
            "policer_packets_total{iface=\"eth0\",verdict=\"dropped\"} 7",
            "policer_bytes_total{iface=\"eth0\",verdict=\"dropped\"} 448",
            "policer_parse_packets_total{iface=\"eth0\",outcome=\"malformed\"} 2",
            "policer_rule_packets_total{rule=\"0.0.0.0/0\",class=\"udp dport 53\",action=\"police\",verdict=\"passed\"} 5",
            "policer_bucket_evictions_total 6",
            "policer_rule_syn_cookie_events_total{rule=\"0.0.0.0/0\",class=\"udp dport 53\",event=\"cookie_sent\"} 7",
            "policer_rule_syn_cookie_events_total{rule=\"0.0.0.0/0\",class=\"udp dport 53\",event=\"syn\"} 9",
            "policer_interface_attached{iface=\"eth0\"} 1",
            "policer_interface_attached{iface=\"eth1\"} 0",
            "policer_bucket_table_capacity 1024",
            "policer_bucket_table_live 4",
            "policer_config_info{sha256=\"ab12\"} 1",
            "policer_config_last_reload_success 1",
            "policer_config_writes_total 3",
            "policer_config_changes_written_total 7",
            "policer_config_last_reload_timestamp_seconds 1700000000.5",
            "# TYPE policer_packets counter",
            "# HELP policer_packets Frames judged",
            "# TYPE policer_bucket_table_live gauge",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
    }

    /// The shipped Grafana dashboard only queries metrics that exist.
    #[test]
    fn dashboard_uses_real_metrics() {
        let dash: serde_json::Value =
            serde_json::from_str(include_str!("../../deploy/grafana-dashboard.json")).unwrap();
        let s = StatsView {
            interfaces: vec![IfaceStats { name: "eth0".into(), ..Default::default() }],
            rules: vec![RuleStats {
                prefix: "0.0.0.0/0".into(),
                action: "police".into(),
                syn: Some(crate::control::SynStatsView { mode: "always".into(), ..Default::default() }),
                ..Default::default()
            }],
            feeds: vec![crate::control::FeedStatus {
                kind: "crowdsec".into(),
                decisions_by_origin: [("cscli".to_string(), 1)].into(),
                skipped: [("type:captcha".to_string(), 1)].into(),
                errors: [("connect".to_string(), 1)].into(),
                ..Default::default()
            }],
            fleet: Some(crate::control::FleetStatus {
                budgets: vec![crate::control::GlobalStatus { name: "svc".into(), ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let text = render(&s, 0, 0, &[("eth0".into(), true)]);
        // Sample names, as queries use them (`policer_packets_total`).
        let names: Vec<&str> =
            text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split(['{', ' ']).next()).collect();
        let mut checked = 0;
        for p in dash["panels"].as_array().unwrap() {
            if p["type"] != "row" {
                let d = p["description"].as_str().unwrap_or("");
                assert!(d.len() > 20, "panel {} has no description", p["title"]);
            }
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap();
                for (i, _) in expr.match_indices("policer_") {
                    let name: String =
                        expr[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    assert!(names.contains(&name.as_str()), "dashboard uses unknown metric {name}");
                    checked += 1;
                }
            }
        }
        assert!(checked >= 10);
    }
}
