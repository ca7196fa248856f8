//! The control channel between the CLI and the running daemon: a Unix
//! socket under /run (shared by every `ip netns exec`, unlike /sys), one
//! per network namespace, mode 0600 so only root may change rules. One
//! JSON request per connection, one JSON response.

use std::{
    io::{BufRead, BufReader, Write},
    os::{linux::fs::MetadataExt, unix::net::UnixStream},
    path::PathBuf,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    rules::RuleConfig,
};

pub const RUN_DIR: &str = "/run/policer";

/// Identifies the caller's network namespace: a daemon and the CLIs that
/// talk to it must be in the same one (`ip netns exec NS policer ...`).
pub fn netns_id() -> Result<u64> {
    Ok(std::fs::metadata("/proc/self/ns/net")?.st_ino())
}

pub fn socket_path() -> Result<PathBuf> {
    Ok(PathBuf::from(RUN_DIR).join(format!("ns-{}.sock", netns_id()?)))
}

pub fn lock_path() -> Result<PathBuf> {
    Ok(PathBuf::from(RUN_DIR).join(format!("ns-{}.lock", netns_id()?)))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    RuleSet { rule: RuleConfig },
    RuleRm { prefix: String },
    RuleLs,
    Detach { iface: String },
    Reload,
    Status,
    Stats,
    Top { n: usize },
}

/// Packet counters as `stats --json` shows them (stable field names).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CountersView {
    pub passed_packets: u64,
    pub passed_bytes: u64,
    pub dropped_packets: u64,
    pub dropped_bytes: u64,
    pub would_drop_packets: u64,
    pub would_drop_bytes: u64,
    pub buckets_created: u64,
}

impl From<&policer_common::RuleCounters> for CountersView {
    fn from(c: &policer_common::RuleCounters) -> CountersView {
        CountersView {
            passed_packets: c.passed_pkts,
            passed_bytes: c.passed_bytes,
            dropped_packets: c.dropped_pkts,
            dropped_bytes: c.dropped_bytes,
            would_drop_packets: c.would_drop_pkts,
            would_drop_bytes: c.would_drop_bytes,
            buckets_created: c.buckets_created,
        }
    }
}

/// Per-interface view: verdicts plus parse outcomes and table events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IfaceStats {
    pub name: String,
    pub ifindex: u32,
    #[serde(flatten)]
    pub counters: CountersView,
    pub unmatched_packets: u64,
    pub non_ip_packets: u64,
    pub malformed_packets: u64,
    pub fragment_packets: u64,
    pub bucket_insert_failures: u64,
    pub cas_retries: u64,
    /// Frames dropped because every compare-and-swap round was lost.
    pub cas_exhausted: u64,
    /// Sources refused a fresh bucket by their rule's new-source limiter
    /// (table pressure): the frame was dropped and no bucket made.
    pub new_sources_limited: u64,
    /// Per-second rates since the previous sample (`--watch` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates: Option<RateView>,
}

/// Per-second rates between two samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RateView {
    pub passed_pps: f64,
    pub dropped_pps: f64,
    pub would_drop_pps: f64,
    pub passed_bps: f64,
    pub dropped_bps: f64,
}

impl RateView {
    /// Rates from `prev` to `now` over `secs`.
    pub fn between(now: &CountersView, prev: &CountersView, secs: f64) -> RateView {
        let r = |a: u64, b: u64| if secs > 0.0 { a.saturating_sub(b) as f64 / secs } else { 0.0 };
        RateView {
            passed_pps: r(now.passed_packets, prev.passed_packets),
            dropped_pps: r(now.dropped_packets, prev.dropped_packets),
            would_drop_pps: r(now.would_drop_packets, prev.would_drop_packets),
            passed_bps: 8.0 * r(now.passed_bytes, prev.passed_bytes),
            dropped_bps: 8.0 * r(now.dropped_bytes, prev.dropped_bytes),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleStats {
    pub prefix: String,
    pub action: String,
    #[serde(flatten)]
    pub counters: CountersView,
    /// Per-second rates since the previous sample (`--watch` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates: Option<RateView>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableStats {
    /// Capacity of the bucket table (--max-sources).
    pub capacity: u64,
    /// Buckets created since the table was created.
    pub created: u64,
    /// Buckets live now (only counted by `top` and /metrics, which read
    /// the table; null in `stats`).
    #[serde(default)]
    pub live: Option<u64>,
    /// Inserts the kernel refused.
    pub insert_failures: u64,
}

/// `policer stats --json`: one sample.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatsView {
    /// CLOCK_MONOTONIC at the sample, ns (the kernel's bpf_ktime_get_ns).
    pub time_ns: u64,
    pub totals: IfaceStats,
    pub interfaces: Vec<IfaceStats>,
    pub rules: Vec<RuleStats>,
    pub table: TableStats,
}

/// One source in `policer top`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopEntry {
    /// The bucket's key: an address, or a prefix when --key-len groups sources.
    pub source: String,
    /// The rule that charges it.
    pub rule: String,
    /// Debt now, in ns of drain time.
    pub debt_ns: u64,
    /// Debt as a fraction of the bucket size (1.0 = full: dropping).
    pub fill: f64,
    /// Frames dropped (or would-drop) since the bucket was created.
    pub drops: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopView {
    pub time_ns: u64,
    /// Live buckets read.
    pub live: u64,
    /// Milliseconds the table read took.
    pub read_ms: f64,
    pub by_debt: Vec<TopEntry>,
    pub by_drops: Vec<TopEntry>,
}

/// A rule with every default filled in, as `rule ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleView {
    pub prefix: String,
    pub action: String,
    /// None for allow/deny rules without a rate.
    pub rate: Option<String>,
    pub burst: Option<u64>,
    /// "packets" or "bytes".
    pub unit: String,
    pub key_len: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatusView {
    pub pid: u32,
    pub interfaces: Vec<String>,
    pub config: String,
    pub rules: usize,
    pub persist: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<StatsView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top: Option<TopView>,
}

impl Response {
    pub fn ok(message: impl Into<String>) -> Response {
        Response { ok: true, message: Some(message.into()), ..Default::default() }
    }

    pub fn err(e: impl std::fmt::Display) -> Response {
        Response { ok: false, error: Some(e.to_string()), ..Default::default() }
    }
}

/// Sends one request to the daemon of this network namespace.
pub fn call(req: &Request) -> Result<Response> {
    let path = socket_path()?;
    let stream = UnixStream::connect(&path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => Error::NoDaemon,
        Some(libc::EACCES) | Some(libc::EPERM) => Error::NotRoot("talking to the policer daemon"),
        _ => Error::Io(e),
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut w = &stream;
    let mut line = serde_json::to_string(req).map_err(|e| Error::Invalid(e.to_string()))?;
    line.push('\n');
    w.write_all(line.as_bytes())?;
    let mut resp = String::new();
    BufReader::with_capacity(1 << 20, &stream).read_line(&mut resp)?;
    serde_json::from_str(&resp).map_err(|e| Error::Invalid(format!("bad reply from the daemon: {e}")))
}
