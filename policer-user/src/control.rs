//! The control channel between the CLI and the running daemon: a Unix
//! socket under /run (shared by every `ip netns exec`, unlike /sys), one
//! per network namespace, mode 0600 so only root may change rules. One
//! JSON request per connection ([`Envelope`]: the protocol version and a
//! [`Request`]), one typed [`Reply`]. This module is the protocol and the
//! client; the daemon's side is `daemon::serve::control`.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    os::{linux::fs::MetadataExt, unix::net::UnixStream},
    path::{Path, PathBuf},
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

/// Version of the request/reply format. A CLI and a daemon of different
/// versions refuse each other plainly instead of misreading fields.
/// 3: rules have classes (rule rm names one, views show them).
/// 4: bans (ban, unban, ban ls), rules with ban options and expiries.
pub const PROTOCOL: u32 = 4;

/// The largest request the daemon reads (a rule is a few hundred bytes).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// What the CLI asks; one per connection, one JSON line.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    RuleSet {
        rule: RuleConfig,
        /// Apply to the kernel only, without writing the config file.
        #[serde(default)]
        runtime: bool,
        /// The given fields alone, not laid over the rule in force.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replace: bool,
        /// A deny of a whole family (`0.0.0.0/0`, `::/0`) is meant.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    RuleRm {
        /// The prefix and the class fields of the rule to remove (the rest
        /// is ignored).
        rule: RuleConfig,
        #[serde(default)]
        runtime: bool,
    },
    RuleLs,
    Detach {
        iface: String,
        /// With programs in the chain: attach slot 0's in policer's place.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        hand_over: bool,
        /// With programs in the chain: detach anyway, emptying it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
    },
    /// `policer chain add`: the table to add (its slot: `slot`, else the
    /// first free one).
    ChainAdd {
        chain: crate::chain::ChainConfig,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        slot: Option<u32>,
    },
    /// `policer chain rm IFACE --slot N`.
    ChainRm {
        iface: String,
        slot: u32,
    },
    /// `policer chain ls [IFACE]`.
    ChainLs {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        iface: Option<String>,
    },
    Reload {
        /// Drop what was changed with `--runtime` instead of keeping it
        /// over the file (sent only when set: older daemons drop it anyway).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        discard_runtime: bool,
        /// A candidate file judged in the config file's place (`reload
        /// --dry-run FILE`: a dry run only), an absolute path.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        candidate: Option<std::path::PathBuf>,
    },
    Status,
    Stats,
    Top {
        n: usize,
    },
    Inspect {
        addr: std::net::IpAddr,
        /// The frame to judge (`policer inspect --proto … --dport …`).
        #[serde(default, skip_serializing_if = "InspectFrame::is_empty")]
        frame: InspectFrame,
    },
    /// `policer ban`: the prefix, `ttl` (the duration) and the reason.
    Ban {
        rule: RuleConfig,
        #[serde(default)]
        runtime: bool,
        /// A ban of a whole family (`0.0.0.0/0`, `::/0`) is meant.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
        /// Kept in the state directory, not the config file (`--state`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        state: bool,
    },
    Unban {
        prefix: String,
        #[serde(default)]
        runtime: bool,
    },
    BanLs,
    /// `policer rule import FILE`: the daemon reads the file (`path`,
    /// absolute: the CLI resolves it against its own directory), so a
    /// million lines never cross the socket as JSON.
    Import {
        path: String,
        /// The file as the user named it, for messages.
        #[serde(default)]
        shown: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<String>,
        /// action, rate, burst, key_len, ttl (the prefix is unused).
        rule: RuleConfig,
        /// With `set`: the most entries the replacement may remove
        /// (`--max-remove`); none: the default, half the set.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_remove: Option<crate::sets::MaxRemove>,
        /// `--force`: the replacement may remove any number of entries.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        force: bool,
        /// `--runtime`: in force until the daemon stops, no state file.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        runtime: bool,
        /// `--skip-protected`: entries inside a protected prefix are left
        /// out (counted and named), not a refusal of the whole file.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        skip_protected: bool,
        /// `--mmdb`: `path` is a MaxMind DB file, and the set its networks
        /// of these countries and ASes.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mmdb: Option<crate::mmdb::Query>,
    },
    /// `policer rule ls --set NAME`.
    SetLs {
        name: String,
    },
    /// `policer rule rm --set NAME`.
    SetRm {
        name: String,
    },
    /// `--dry-run` of a change (`rule set`, `rule rm`, `rule import`,
    /// `ban`, `reload`): judged and planned as that change would be,
    /// nothing written; answered with [`Reply::DryRun`], or refused as the
    /// change would be.
    DryRun {
        change: Box<Request>,
    },
    /// `policer capture`: answered by a [`Reply::Capturing`] line, then
    /// the capture's chunks (`crate::capture`) until it ends.
    Capture {
        spec: crate::capture::CaptureSpec,
    },
}

impl Request {
    /// Whether the request changes state (a timeout then leaves it unknown
    /// whether the change was applied).
    pub fn changes(&self) -> bool {
        matches!(
            self,
            Request::RuleSet { .. }
                | Request::RuleRm { .. }
                | Request::Detach { .. }
                | Request::ChainAdd { .. }
                | Request::ChainRm { .. }
                | Request::Reload { .. }
                | Request::Ban { .. }
                | Request::Unban { .. }
                | Request::Import { .. }
                | Request::SetRm { .. }
        )
    }
}

/// A request on the wire: the protocol version, then the request.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Envelope {
    pub protocol: u32,
    #[serde(flatten)]
    pub request: Request,
}

/// The daemon's answer: one typed reply per kind of request, or a refusal.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum Reply {
    /// A change was made (rule set/rm, reload, detach).
    Done {
        message: String,
        /// An import's counts (absent for other changes, and from older
        /// daemons).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        counts: Option<Box<ImportCounts>>,
    },
    Rules {
        rules: Vec<RuleView>,
    },
    Status(Box<StatusView>),
    Stats(Box<StatsView>),
    Top(Box<TopView>),
    Inspect(Box<InspectView>),
    Bans {
        bans: Vec<BanView>,
    },
    Set(Box<SetView>),
    /// `policer chain ls`: each interface's chain.
    Chains {
        chains: Vec<ChainView>,
    },
    /// What a change would do (`--dry-run`): nothing changed.
    DryRun(Box<DryRunView>),
    /// A capture started; its chunks follow on the connection.
    Capturing {
        message: String,
    },
    /// Refused: nothing changed.
    Refused {
        error: String,
        /// Set when the daemon shed the connection at its cap, before
        /// reading the request (`error` says the same in words, for a CLI
        /// that does not know this field).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        busy: Option<Busy>,
    },
}

/// What `policer rule import` did to its set (`rule import --json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImportCounts {
    pub set: String,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    /// The set's entries after the import.
    pub entries: u64,
    pub added: u64,
    /// Kept entries whose value changed (a new action or rate).
    pub changed: u64,
    pub removed: u64,
    pub unchanged: u64,
    /// Lines that repeated an earlier prefix (kept once).
    pub duplicates: u64,
    /// Lines written IPv4-mapped (`::ffff:a.b.c.d`), taken as IPv4.
    pub mapped: u64,
    /// Entries another set of higher precedence holds too: its value is
    /// in force there.
    pub shadowed: u64,
    /// Whether the set has a state file (false: `--runtime`).
    pub saved: bool,
    /// Entries left out (a feed's set only): inside a protected prefix or
    /// the prefix of a rule.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_protected: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub refused_rule_prefix: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a change would do (`--dry-run`; docs/dry-run.md, docs/json.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DryRunView {
    /// Always true: nothing was changed.
    pub dry_run: bool,
    /// The verb previewed: `rule set`, `rule rm`, `rule import`, `ban`, `reload`.
    pub verb: String,
    /// What the change would say it did.
    pub message: String,
    pub rules_added: Vec<DryRule>,
    pub rules_changed: Vec<DryRuleChange>,
    pub rules_removed: Vec<DryRule>,
    /// Named sets whose entries or rule would change.
    pub sets: Vec<DrySet>,
    /// The sources live in the bucket table whose verdict would change.
    pub live: DryLive,
}

/// A rule added or removed: its key (`10.0.0.0/8`, `10.0.0.0/8 udp
/// dport 53`, `ban 192.0.2.0/24`) and its fields as the config writes them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DryRule {
    pub rule: String,
    pub fields: BTreeMap<String, String>,
}

/// A rule changed: each field that differs, old → new.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DryRuleChange {
    pub rule: String,
    pub changes: Vec<FieldChange>,
}

/// One field of a rule, before and after (absent: not set).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FieldChange {
    pub field: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<String>,
}

/// A named set's change: entry counts, and the first entries in and out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrySet {
    pub set: String,
    /// `added`, `changed` or `removed` (the whole set).
    pub change: String,
    pub entries_before: u64,
    pub entries_after: u64,
    pub entries_in: u64,
    pub entries_out: u64,
    /// The set's rule changes (a new action or rate), field by field.
    pub rule_changes: Vec<FieldChange>,
    /// The first entries in and out, in order ([`DRY_SAMPLE`] at most).
    pub sample_in: Vec<String>,
    pub sample_out: Vec<String>,
}

/// How many entries of a set, and sources of each direction, are listed.
pub const DRY_SAMPLE: usize = 20;

/// The live sources whose verdict would change (see docs/dry-run.md).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DryLive {
    /// How long the table was watched to measure each source's rate.
    pub window_ms: u64,
    /// Buckets in the table, and those judged (a class bucket whose
    /// class goes is not: its frames fall to a rule only a frame tells).
    pub sources: u64,
    pub judged: u64,
    pub pass_to_drop: u64,
    pub drop_to_pass: u64,
    /// The first of each by rate, highest first ([`DRY_SAMPLE`] at most).
    pub pass_to_drop_top: Vec<DrySource>,
    pub drop_to_pass_top: Vec<DrySource>,
    /// Judged sources that sent nothing while watched: no verdict of
    /// theirs changes now, so none is listed.
    #[serde(default)]
    pub idle: u64,
    /// Each rule with a total (`--total-rate`) the change adds, changes or
    /// removes: what its sources send together against the total.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aggregates: Vec<DryAggregate>,
    /// Why the table could not be read (the diff still stands).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A rule's aggregate in a dry run: what all the sources it covers send
/// together, against its total now and after.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DryAggregate {
    pub rule: String,
    /// Frames per second its sources sent together while watched (none:
    /// not measured, `measured_by` says why).
    pub rate_pps: Option<f64>,
    /// How: `the rule's counters` (a rule in force), `the buckets of N
    /// sources` (a new rule: the sources under it with a bucket now), or
    /// why it could not be measured.
    pub measured_by: String,
    /// Its total now and after (frames per second; of 1500-byte frames for
    /// a bit rate); none: no total.
    pub total_now_pps: Option<f64>,
    pub total_after_pps: Option<f64>,
    /// About how many frames per second the total drops, now and after
    /// (which sources lose them is first come, first served).
    pub drop_now_pps: f64,
    pub drop_after_pps: f64,
}

/// One source (a bucket's key) whose verdict would change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DrySource {
    /// The address, or the prefix when its rule groups sources.
    pub source: String,
    /// Its class, `-` for none.
    pub class: String,
    /// The rule (or set entry) that judges it now, and after.
    pub rule_now: String,
    pub rule_after: String,
    /// What it sent while watched: frames per second, admitted and
    /// dropped together.
    pub rate_pps: f64,
    pub now: String,
    pub after: String,
    /// Why, in words (`sends 250 pps, over the rule's 100 pps`).
    pub why: String,
}

/// The control socket was full: `in_use` of `cap` connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Busy {
    pub in_use: usize,
    pub cap: usize,
}

impl Reply {
    /// The reply as its line on the socket: JSON, then a newline.
    pub fn line(&self) -> Vec<u8> {
        let mut text =
            serde_json::to_vec(self).unwrap_or_else(|_| b"{\"reply\":\"refused\",\"error\":\"internal\"}".to_vec());
        text.push(b'\n');
        text
    }

    /// A refusal of a request: nothing changed.
    pub fn refused(error: impl Into<String>) -> Reply {
        Reply::Refused { error: error.into(), busy: None }
    }

    /// The answer to a connection shed at the cap.
    pub fn busy(in_use: usize, cap: usize) -> Reply {
        Reply::Refused { error: Error::Busy { in_use, cap }.to_string(), busy: Some(Busy { in_use, cap }) }
    }
}

impl Reply {
    fn kind(&self) -> &'static str {
        match self {
            Reply::Done { .. } => "done",
            Reply::Rules { .. } => "rules",
            Reply::Status(_) => "status",
            Reply::Stats(_) => "stats",
            Reply::Top(_) => "top",
            Reply::Inspect(_) => "inspect",
            Reply::Bans { .. } => "bans",
            Reply::Set(_) => "set",
            Reply::Chains { .. } => "chains",
            Reply::DryRun(_) => "dry_run",
            Reply::Capturing { .. } => "capturing",
            Reply::Refused { .. } => "refused",
        }
    }
}

/// A ban in force, as `policer ban ls` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BanView {
    /// The banned prefix (a manual ban) or source key (an automatic one).
    pub prefix: String,
    /// `manual` or `auto`.
    pub origin: String,
    /// The rule whose bucket the source exceeded (automatic bans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the ban ends (RFC 3339 UTC) and the seconds left.
    pub expires: String,
    pub left_seconds: f64,
    /// Frames dropped while banned: exact for a manual ban; for an
    /// automatic ban an estimate from sampled counts.
    pub dropped_pkts: u64,
    /// How far that sampled count (an automatic ban's) may be from the truth (two standard
    /// deviations: the truth is within it 19 times in 20); 0: exact.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drops_margin: u64,
    /// How many times this source was banned in a row (escalation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// The length of this ban, seconds (automatic bans).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub length_seconds: Option<f64>,
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
    /// Of the dropped (or would-drop) frames, those the rule's aggregate
    /// bucket refused (`--total-rate`); the rest their source's bucket did.
    #[serde(default)]
    pub total_dropped_packets: u64,
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
            total_dropped_packets: c.total_dropped_pkts,
        }
    }
}

/// One interface's chain (`policer chain ls`, `status`): its filled
/// slots, and the frames handed to it (all to the first filled slot) or
/// passed with it empty.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChainView {
    pub interface: String,
    /// Where it is pinned.
    pub pinned: String,
    pub handed_packets: u64,
    pub empty_packets: u64,
    pub slots: Vec<crate::chain::SlotView>,
}

/// Per-interface view: verdicts plus parse outcomes and table events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IfaceStats {
    pub name: String,
    pub ifindex: u32,
    /// Since when the program is NOT on this interface's hook (removed
    /// from outside; `--on-detach`): its frames pass unjudged meanwhile.
    /// None while it polices (and for the totals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached_since: Option<String>,
    #[serde(flatten)]
    pub counters: CountersView,
    /// Frames the verdict passed that a program of the chain took
    /// (policer_common::chain).
    #[serde(default)]
    pub chain_handed_packets: u64,
    /// Frames the verdict passed while the chain was empty (passed).
    #[serde(default)]
    pub chain_empty_packets: u64,
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
    /// Sources without a bucket that the recall knew (evicted recently, or
    /// in debt): let past the new-source limiter.
    #[serde(default)]
    pub recall_known: u64,
    /// Frames dropped on a debt the recall kept for an evicted source (no
    /// bucket made).
    #[serde(default)]
    pub recall_debt_drops: u64,
    /// Evicted buckets written to the recall (in debt, or a source that
    /// came back).
    #[serde(default)]
    pub recall_stored: u64,
    /// Frames whose prefix has classes that one of them matched.
    #[serde(default)]
    pub class_matched: u64,
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
    /// The class (`udp dport 53`; `-` for the prefix's class-less rule).
    #[serde(default)]
    pub class: String,
    pub action: String,
    #[serde(flatten)]
    pub counters: CountersView,
    /// SYN cookies' counters (a rule with `--syn-cookies`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn: Option<SynStatsView>,
    /// Per-second rates since the previous sample (`--watch` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates: Option<RateView>,
}

/// A rule's SYN cookies as `stats --json` shows them: its mode and the
/// kernel's counters, summed over CPUs, as they are.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynStatsView {
    /// `flood` or `always`.
    pub mode: String,
    #[serde(flatten)]
    pub counters: policer_common::syn::SynCounters,
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
    /// Entries the recall holds (4 per source of capacity).
    #[serde(default)]
    pub recall_capacity: u64,
    /// Entries of the recall that would recall a source now (estimated
    /// from 1024 sets spread over it when it has more).
    #[serde(default)]
    pub recall_live: u64,
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
    /// The config file in force and how its last reload went.
    #[serde(default)]
    pub config: ConfigStatus,
    #[serde(default)]
    pub bans: BanStats,
    /// The last changes to what the daemon enforces, oldest first (at
    /// most 20; each is also a line of the daemon's log). Empty from a
    /// daemon older than this field.
    #[serde(default)]
    pub recent_changes: Vec<ChangeRecord>,
    /// The decision feeds the daemon pulls (`[crowdsec]`): empty when none
    /// is configured (or from a daemon older than this field).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feeds: Vec<FeedStatus>,
    /// `policer capture`: captures running and the kernel's counts (none
    /// from a daemon older than this field, or whose program has no
    /// capture maps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<crate::capture::CaptureStatus>,
    /// The fleet budgets (`[global]`, `--global`): none when the config
    /// has no `[global]` table.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetStatus>,
}

/// The fleet budgets as the lease thread last saw them (`[global]`,
/// docs/fleet.md): `stats --json`'s and `status --json`'s `fleet`, and
/// `policer_global_*` on /metrics. Never holds the Redis password.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetStatus {
    /// `HOST:PORT` of the Redis.
    pub redis: String,
    pub node_id: String,
    pub lease_period_ms: u64,
    /// `share` or `local`.
    pub fallback: String,
    /// Whether the last lease round trip succeeded in time.
    pub backend_up: bool,
    /// Why the last one failed (none while up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When `backend_up` last changed (the first round's end at the
    /// start), Unix ms: the end of the round that failed or came back.
    pub changed_unix_ms: u64,
    /// Lease rounds tried and failed since the start.
    pub rounds: u64,
    pub failures: u64,
    /// Whether Redis finds another daemon leasing as this node round after
    /// round (two nodes given one `node_id`: they share one node's place in
    /// every budget).
    #[serde(default)]
    pub node_id_clash: bool,
    /// Each budget the rules in force name.
    pub budgets: Vec<GlobalStatus>,
}

/// One fleet budget on this node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GlobalStatus {
    /// The budget's name (`--global NAME`).
    pub name: String,
    /// The rule(s) in force that name it.
    pub rules: Vec<String>,
    /// The whole fleet's rate, packets/s (the rules' `--total-rate`).
    pub budget_pps: u64,
    /// Whether this node runs on its fallback now (Redis not answering
    /// in time, or refusing).
    pub fallback: bool,
    /// Nodes live at the last lease (this one included; while in fallback,
    /// the last known).
    pub live_nodes: u64,
    /// When `live_nodes` last changed, Unix ms (the end of that lease).
    #[serde(default)]
    pub live_changed_unix_ms: u64,
    /// The last period: tokens asked, granted (or the fallback's), and
    /// frames that reached the aggregate and that it admitted.
    pub asked: u64,
    pub granted: u64,
    pub demand: u64,
    pub used: u64,
    /// The rate the aggregate runs at now, packets/s.
    pub rate_pps: u64,
    /// Since the start: tokens asked and granted, frames admitted.
    pub asked_total: u64,
    pub granted_total: u64,
    pub used_total: u64,
}

/// A decision feed (CrowdSec's Local API) as the daemon last saw it:
/// `stats --json`'s `feeds`, `status`, and `policer_crowdsec_*` on /metrics.
/// Never holds the API key or the machine password.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FeedStatus {
    /// `crowdsec`.
    pub kind: String,
    /// The Local API's base URL.
    pub url: String,
    /// The set its decisions are in (`policer rule ls --set NAME`).
    pub set: String,
    /// Whether the last pull succeeded (and its decisions were applied).
    pub last_sync_success: bool,
    /// When the last pull was tried, and when one last succeeded, Unix
    /// seconds (0: never).
    pub last_sync_timestamp_seconds: f64,
    pub last_success_timestamp_seconds: f64,
    /// Why the last pull failed; after a success, none, or the note of a
    /// whole answer doubted (it would remove most of what is in force).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// Decisions in force (each until its own end), by origin, and the
    /// distinct prefixes they make (the set's entries before any refused).
    pub decisions: u64,
    pub decisions_by_origin: BTreeMap<String, u64>,
    /// Decisions in force by scope: `ip`, `range`, and with `country_mmdb`
    /// and `asn_mmdb`, `country` and `as`.
    #[serde(default)]
    pub decisions_by_scope: BTreeMap<String, u64>,
    pub prefixes: u64,
    /// Decisions received since the start, and those that ended by a
    /// deletion from the feed or by their own duration.
    pub received: u64,
    pub deleted: u64,
    pub expired: u64,
    /// Decisions received but not applied, by reason (`type:captcha`,
    /// `scope:country`, `invalid_value`, `host_bits`, `too_wide`, `over`, `origin`,
    /// `scenario`).
    pub skipped: BTreeMap<String, u64>,
    /// Prefixes in force but left out of the set now: inside a protected
    /// prefix, or the prefix of a rule.
    pub left_out_protected: u64,
    pub left_out_rule_prefix: u64,
    /// Failed pulls and pushes by kind (`connect`, `timeout`, `http_403`,
    /// `parse`, `cover`, `shrink`, `apply`, `login`, `publish`).
    pub errors: BTreeMap<String, u64>,
    /// Automatic bans posted to the Local API (`publish = true`), and
    /// those waiting to be posted.
    pub published: u64,
    pub publish_pending: u64,
    /// Whether this daemon publishes its automatic bans.
    pub publish: bool,
}

/// One change in the audit trail (`stats --json`'s `recent_changes`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeRecord {
    /// When, RFC 3339 UTC, and the same in Unix milliseconds.
    pub time: String,
    pub unix_ms: u64,
    /// Who: `uid 0 pid 4242` (the control socket's peer), `SIGHUP`, `the
    /// config file (followed)`, `expiry`, `the program (automatic ban)`.
    pub who: String,
    /// What the change did, old → new where there was an old value.
    pub what: String,
}

/// Bans now and since the program was loaded (`policer_ban*` on /metrics).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BanStats {
    /// Manual bans in force, and the frames they dropped.
    pub manual_active: u64,
    pub manual_dropped_packets: u64,
    /// Automatic bans in force, started, the frames they dropped (exact),
    /// and bans not made because the store was full.
    pub auto_active: u64,
    pub auto_started: u64,
    pub auto_dropped_packets: u64,
    pub auto_refused_full: u64,
    /// Entries the automatic-ban store holds at most (live bans and those
    /// in their escalation window).
    pub auto_capacity: u64,
    pub auto_stored: u64,
}

/// The config file the daemon runs from (`policer_config_*` on /metrics).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigStatus {
    /// sha256 of the file's bytes as last read or written.
    pub sha256: String,
    /// Whether the last reload (followed, `policer reload` or SIGHUP)
    /// applied the file; true at start.
    pub last_reload_success: bool,
    /// When that reload was tried (or the daemon started), Unix seconds.
    pub last_reload_timestamp_seconds: f64,
    /// Why that reload was not applied (the file could not be read, or was
    /// refused); none when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reload_error: Option<String>,
    /// The daemon cannot write the file: rule changes need `--runtime`.
    pub read_only: bool,
    /// Writes of the file by rule and ban changes since the start, and the
    /// changes they wrote: changes that arrive together share one write.
    #[serde(default)]
    pub writes: u64,
    #[serde(default)]
    pub changes_written: u64,
    /// The owner's own record since the start: the longest a control
    /// request (a change, a reload, a dry run) waited in its queue before
    /// it was taken, ms; how many waited over 100 ms; the longest a write
    /// of the file by a group of changes took, ms (the owner takes the
    /// changes that come meanwhile into the next group).
    #[serde(default)]
    pub longest_wait_ms: f64,
    #[serde(default)]
    pub waits_over_100ms: u64,
    #[serde(default)]
    pub longest_write_ms: f64,
}

/// One source in `policer top`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopEntry {
    /// The bucket's key: an address, or a prefix when --key-len groups sources.
    pub source: String,
    /// The rule that charges it: `10.0.0.0/8`, or `10.0.0.0/8 [udp dport 53]`
    /// for a bucket of one source's frames of a class.
    pub rule: String,
    /// The class of that rule (`udp dport 53`; `-` for a class-less rule).
    #[serde(default)]
    pub class: String,
    /// Debt now, in ns of drain time.
    pub debt_ns: u64,
    /// Debt as a fraction of the bucket size (1.0 = full: dropping).
    pub fill: f64,
    /// Frames dropped (or would-drop) since the bucket was created:
    /// sampled, an estimate (`drops_margin`).
    pub drops: u64,
    /// How far that sampled count may be from the truth (two standard
    /// deviations: the truth is within it 19 times in 20); 0: exact.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drops_margin: u64,
    /// The action of that rule (`police`, `monitor`): a monitor rule's
    /// refusals are would-drops, its frames pass.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub action: String,
    /// The rule that dropped `drops`, when not `rule`: the source's drops
    /// are credited to the rule that dropped them (a count is one rule's:
    /// it starts over when another rule drops the source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropped_by: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TopView {
    pub time_ns: u64,
    /// Buckets read (every source the table holds a bucket for).
    pub live: u64,
    /// Of those, drained ones: no debt, kept until their slot is needed
    /// (a source seen once an hour ago is one).
    #[serde(default)]
    pub idle: u64,
    /// Milliseconds the table read took.
    pub read_ms: f64,
    pub by_debt: Vec<TopEntry>,
    pub by_drops: Vec<TopEntry>,
    /// Bans in force, soonest end first (at most as many as asked for),
    /// and how many there are in all.
    #[serde(default)]
    pub bans: Vec<BanView>,
    #[serde(default)]
    pub bans_total: usize,
    /// The interfaces whose hook has lost the program (removed from
    /// outside), each `IFACE since TIME`: their sources are not judged.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_attached: Vec<String>,
}

fn yes() -> bool {
    true
}

/// The frame `policer inspect` judges: its layer-4 fields and size, as the
/// operator wrote them (the daemon parses them, as it does a class).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InspectFrame {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_flags: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<std::net::IpAddr>,
    /// The frame's length in bytes (byte-mode rules); default 1500.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u32>,
}

impl InspectFrame {
    pub fn is_empty(&self) -> bool {
        *self == InspectFrame::default()
    }
}

/// `policer inspect ADDR`: what the policer knows of one source now.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InspectView {
    /// CLOCK_MONOTONIC of the reading, ns.
    pub time_ns: u64,
    pub address: String,
    /// The rule in force for it (longest prefix); null: none matches, its
    /// frames pass unpoliced.
    pub rule: Option<String>,
    pub action: Option<String>,
    /// The rule's aggregate: its `--total-rate`, and the fleet budget it
    /// shares it through (`--global`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<String>,
    /// Its bucket's key: the address, or the masked prefix (--key-len).
    pub key: Option<String>,
    /// Whether the table holds a bucket for it. No bucket means no debt
    /// (drained and evicted, or never seen): its next frame starts one.
    pub has_bucket: bool,
    /// Debt now, in ns of drain time (0 without a bucket).
    pub debt_ns: u64,
    /// Debt as a fraction of the bucket size (1.0: full).
    pub fill: f64,
    /// Nanoseconds until a frame would be admitted (0: now); null: never
    /// (a deny rule, or a frame costs more than the bucket holds). A
    /// frame is one packet, or in byte mode `frame_bytes` bytes.
    pub next_admit_ns: Option<u64>,
    pub frame_bytes: u32,
    /// What a frame would get now: "pass" or "drop" ("pass" under
    /// monitor, which counts a would-drop instead).
    pub now: String,
    /// What a frame would be counted as now: "pass", "drop", or "would
    /// drop" (a monitor rule's refusal: the frame passes).
    #[serde(default)]
    pub verdict: String,
    /// The class of the rule that judges the frame (`udp dport 53`; `-`
    /// for a class-less rule); null without a rule.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// Without frame options: every bucket the source has, one per rule
    /// that charges it (its class-less rule and each class of the
    /// prefixes over it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buckets: Vec<TopEntry>,
    /// Frames dropped from it since its bucket was made (sampled: see
    /// README, top).
    pub drops: u64,
    /// With a rule that has SYN cookies: whether this source proved its
    /// address (its SYNs are policed by its bucket; else they get cookies).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_verified: Option<bool>,
    /// How far `drops` may be from the truth (two standard deviations);
    /// 0: exact.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub drops_margin: u64,
    /// Without a bucket: "recalled" if the recall remembers it (evicted
    /// recently or in debt: it skips the limiter, and `debt_ns` is the debt
    /// it resumes), else whether its rule's new-source limiter would give
    /// it one now ("accepted") or refuse it under table pressure
    /// ("limited"); null with a bucket or for allow/deny rules.
    pub new_source: Option<String>,
    /// The ban the source is under, if any: a manual ban of a prefix that
    /// holds it, or an automatic ban of its bucket key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban: Option<BanView>,
    /// Everything that holds a prefix over the source or bans one of its
    /// buckets (protected prefixes, manual and automatic bans, set
    /// entries, rules and their classes), most specific first: which one
    /// the program applies, and why each other one does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub covering: Vec<InspectCover>,
    /// The interfaces whose hook has lost the program (removed from
    /// outside), each `IFACE since TIME`: there every frame passes, whatever
    /// `now` and `verdict` say the program would do.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_attached: Vec<String>,
}

/// One entry of `inspect`'s `covering`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct InspectCover {
    /// `protect`, `ban` (manual), `auto ban`, `set` or `rule`.
    pub kind: String,
    /// The prefix it holds (an automatic ban: its bucket key).
    pub prefix: String,
    /// As `rule` names it: `10.0.0.0/8`, `10.0.0.0/8 [udp dport 53]`,
    /// `set:feed (10.0.100.0/24)`, `ban 10.63.0.9/32`, `protect
    /// 192.0.2.0/24`; an automatic ban: the rule whose bucket it bans.
    pub rule: String,
    /// A rule's class (`-` for none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    pub action: String,
    /// Whether the program applies it to the frame judged (without frame
    /// options: a frame of no class).
    pub applies: bool,
    /// Why it applies, or why it does not.
    pub why: String,
    /// A police or monitor rule's or set's: whether the source has a
    /// bucket of it now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub has_bucket: Option<bool>,
    /// A ban's details (as in `ban ls`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban: Option<BanView>,
}

/// A rule with every default filled in, as `rule ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleView {
    pub prefix: String,
    /// The class as one text (`udp dport 53`, `udp sport 123`, `tcp flags
    /// syn,!ack`; `-` for none), then its fields as written.
    #[serde(default)]
    pub class: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_flags: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// The aggregate bucket of the whole rule (`--total-rate`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_burst: Option<u64>,
    /// The fleet budget the total is shared through (`--global NAME`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<String>,
    /// SYN cookies (`--syn-cookies`): `flood` or `always`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_cookies: Option<String>,
    /// Their reflection cap, SYN-ACKs a second toward one /24 or /48.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_ack_rate: Option<u64>,
    pub action: String,
    /// None for allow/deny rules without a rate.
    pub rate: Option<String>,
    pub burst: Option<u64>,
    /// "packets" or "bytes".
    pub unit: String,
    pub key_len: u32,
    /// Whether the config file holds this rule as shown (false: applied
    /// with `--runtime`, gone at the next start or reload).
    pub persisted: bool,
    /// Whether the rule is in force (false: the file has it, but it was
    /// removed with `rule rm --runtime`; back at the next start or reload).
    #[serde(default = "yes")]
    pub in_force: bool,
    /// A manual ban (`policer ban`), not a rule.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ban: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Automatic bans (`--ban-for`, `--ban-after`, `--ban-max`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_for: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_after: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_max: Option<String>,
    /// `--ban-within`: the window `ban_after` refusals are counted in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_within: Option<String>,
    /// When the entry is removed (RFC 3339 UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// A named set (`policer rule import`): its name, and its entries'
    /// count; the prefix is then `set:NAME`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entries: Option<u64>,
    /// A set's origin: "saved" (`rule import`), "runtime" (`rule import
    /// --runtime`) or "config" (a `[[set]]` of the config file).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// `policer rule ls --set NAME`: the set's rule and its entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetView {
    pub rule: RuleView,
    pub entries: Vec<String>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatusView {
    pub pid: u32,
    pub interfaces: Vec<String>,
    pub config: String,
    pub rules: usize,
    /// Rules where the kernel and the file differ through `--runtime`
    /// (set in the kernel only, or removed from the kernel only).
    pub runtime_rules: usize,
    pub persist: bool,
    /// The policer program's id (`bpftool prog show id N`).
    pub program_id: u32,
    /// The config file in force and how its last reload went (none from a
    /// daemon older than this field: nothing is known then, not a failure).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_status: Option<ConfigStatus>,
    // What follows is absent from a daemon older than these fields (an
    // empty or none value: not known, not "none").
    /// The daemon's version (the `policer` build it runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Seconds since the daemon started serving.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uptime_seconds: Option<f64>,
    /// Each interface and its XDP mode (`native`, `skb`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interface_modes: Vec<IfaceMode>,
    /// The named sets (`policer rule import`), each with its action and
    /// entries' count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sets: Option<Vec<SetStatus>>,
    /// Bans in force now: manual (`policer ban`) and automatic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bans: Option<BanCounts>,
    /// Where `/metrics` is served (none: not served).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// The decision feeds (`[crowdsec]`), as in `stats --json`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub feeds: Vec<FeedStatus>,
    /// The fleet budgets (`[global]`), as in `stats --json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetStatus>,
    /// The protected prefixes (`protect` in [daemon]): never dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protect: Option<Vec<String>>,
    /// `policer capture`s running now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub captures: Option<u32>,
    /// Each interface's chain (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chains: Option<Vec<ChainView>>,
    /// The rules with SYN cookies, each with its counters and what the
    /// kernel's settings make of them (docs/syn-cookies.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syn_cookies: Vec<SynStatus>,
    /// The kernel settings SYN cookies need that are not as they should
    /// be (empty when all are, or no rule has them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syn_cookie_warnings: Vec<String>,
}

/// A rule with SYN cookies, in `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynStatus {
    pub rule: String,
    #[serde(flatten)]
    pub counters: SynStatsView,
}

/// An interface and its XDP mode, in `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IfaceMode {
    pub name: String,
    pub mode: String,
    /// Whether the policer program is on the interface's hook now (none
    /// from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attached: Option<bool>,
    /// Since when it is not (removed from outside; `--on-detach`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detached_since: Option<String>,
}

/// A named set in `status`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetStatus {
    pub name: String,
    pub action: String,
    pub entries: u64,
    /// "saved", "runtime" or "config" (none from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// The bans in force, in `status`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BanCounts {
    pub manual: u64,
    pub auto: u64,
}

/// How long the CLI waits for an answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// Connects within `timeout`: a hung daemon whose listen backlog is full
/// blocks connect(2) itself, so it runs on a thread of its own.
fn connect(path: &Path, timeout: Duration) -> Result<UnixStream> {
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.to_path_buf();
    std::thread::spawn(move || {
        let _ = tx.send(UnixStream::connect(p));
    });
    match rx.recv_timeout(timeout) {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => Err(match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => Error::NoDaemon,
            Some(libc::EACCES) | Some(libc::EPERM) => Error::NotRoot("talking to the policer daemon"),
            // The listen queue is full, or the daemon is closing it.
            Some(libc::EAGAIN) | Some(libc::ECONNRESET) => {
                Error::Invalid(format!("daemon busy: its control socket takes no connection now ({e}); try again"))
            }
            _ => Error::Io(e),
        }),
        // Not connected, so not sent: nothing can have been applied.
        Err(_) => Err(Error::Timeout { secs: timeout.as_secs_f64(), may_apply: false }),
    }
}

/// Sends one request to the daemon listening on `path`; a refusal is
/// [`Error::Refused`]. [`Client`] takes the reply apart by request.
pub fn call_at(path: &Path, req: &Request, timeout: Duration) -> Result<Reply> {
    call_reader(path, req, timeout).map(|(r, _)| r)
}

/// Connects and writes the request. A daemon at its cap answers "busy"
/// and closes without reading: the write may then fail (EPIPE,
/// ECONNRESET), but its answer is there to read, ahead of the reset; that
/// failure comes back beside the stream.
fn send(path: &Path, req: &Request, timeout: Duration) -> Result<(UnixStream, std::io::Result<()>)> {
    let stream = connect(path, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut w = &stream;
    let env = Envelope { protocol: PROTOCOL, request: req.clone() };
    let mut line = serde_json::to_string(&env).map_err(|e| Error::Invalid(e.to_string()))?;
    line.push('\n');
    let sent = w.write_all(line.as_bytes());
    if let Err(e) = sent {
        if !closed(&e) {
            return Err(match e.kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                    Error::Timeout { secs: timeout.as_secs_f64(), may_apply: req.changes() }
                }
                _ => Error::Io(e),
            });
        }
        return Ok((stream, Err(e)));
    }
    Ok((stream, Ok(())))
}

/// [`call_at`], and the connection after the reply's line, for an answer
/// that goes on (`capture`): the reader holds what came after the line.
/// Its read timeout stays `timeout`.
pub fn call_reader(path: &Path, req: &Request, timeout: Duration) -> Result<(Reply, BufReader<UnixStream>)> {
    let (stream, sent) = send(path, req, timeout)?;
    let timed_out = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            Error::Timeout { secs: timeout.as_secs_f64(), may_apply: req.changes() }
        }
        _ => Error::Io(e),
    };
    let mut resp = String::new();
    let mut reader = BufReader::with_capacity(1 << 20, stream);
    let read = reader.read_line(&mut resp);
    let gone = |e: &std::io::Error| {
        Error::Invalid(format!(
            "the daemon closed the connection without answering ({e}): it may be busy or exiting; try again"
        ))
    };
    match read {
        // A whole line came before the reset.
        _ if resp.ends_with('\n') => {}
        Err(e) if closed(&e) => return Err(gone(&e)),
        Err(e) => return Err(timed_out(e)),
        Ok(_) => match sent {
            Err(e) => return Err(gone(&e)),
            Ok(()) if resp.is_empty() => {
                return Err(Error::Invalid("the daemon closed the connection without answering".into()));
            }
            // Part of a line, then the end: an answer cut short (a streamed
            // set the daemon gave up on), not another version's.
            Ok(()) => {
                return Err(Error::Invalid(format!(
                    "the daemon's answer was cut short after {} bytes (a client that reads too slowly is dropped); \
                     try again",
                    resp.len()
                )));
            }
        },
    }
    let reply: Reply = serde_json::from_str(&resp).map_err(|e| {
        Error::Invalid(format!(
            "the daemon's reply is not understood ({e}): is it another version of policer? \
             restart it with this one"
        ))
    })?;
    match reply {
        Reply::Refused { busy: Some(Busy { in_use, cap }), .. } => Err(Error::Busy { in_use, cap }),
        Reply::Refused { error, .. } => Err(Error::Refused(error)),
        r => Ok((r, reader)),
    }
}

/// The daemon closed the connection (after a "busy", or exiting).
fn closed(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET))
}

/// `ban ls` on the daemon listening on `path`: each row goes to `each` as
/// it is read off the connection, not once the whole reply is in (the
/// daemon streams it: 100 000 bans are never one list, on either side).
/// The reply is `Reply::Bans`'s JSON line, read by a deserializer that
/// hands its array's elements on one by one; any other reply (a refusal)
/// is taken whole. Returns the rows' count.
pub fn call_bans(path: &Path, timeout: Duration, each: &mut dyn FnMut(BanView) -> std::io::Result<()>) -> Result<u64> {
    let req = Request::BanLs;
    let (stream, sent) = send(path, &req, timeout)?;
    let mut read = Counted { r: BufReader::with_capacity(1 << 16, stream), n: 0 };
    let mut failed = None;
    let got = {
        let mut de = serde_json::Deserializer::from_reader(&mut read);
        serde::de::DeserializeSeed::deserialize(bans_stream::ReplySeed { each, failed: &mut failed }, &mut de)
    };
    if let Some(e) = failed {
        return Err(Error::Io(e));
    }
    let got = got.map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Io => match e.io_error_kind() {
                Some(std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    Error::Timeout { secs: timeout.as_secs_f64(), may_apply: false }
                }
                _ if read.n == 0 => Error::Invalid(format!(
                    "the daemon closed the connection without answering ({e}): it may be busy or exiting; try again"
                )),
                _ => Error::Invalid(format!("reading the daemon's answer: {e}")),
            },
            Category::Eof if read.n == 0 => match &sent {
                Err(e) => Error::Invalid(format!(
                    "the daemon closed the connection without answering ({e}): it may be busy or exiting; try again"
                )),
                Ok(()) => Error::Invalid("the daemon closed the connection without answering".into()),
            },
            Category::Eof => Error::Invalid(format!(
                "the daemon's answer was cut short after {} bytes (a client that reads too slowly is dropped, and \
                 a read of the ban store that fails midway ends it); try again",
                read.n
            )),
            _ => Error::Invalid(format!(
                "the daemon's reply is not understood ({e}): is it another version of policer? restart it with this one"
            )),
        }
    })?;
    match got {
        bans_stream::Got::Rows(n) => Ok(n),
        bans_stream::Got::Other(Reply::Refused { busy: Some(Busy { in_use, cap }), .. }) => {
            Err(Error::Busy { in_use, cap })
        }
        bans_stream::Got::Other(Reply::Refused { error, .. }) => Err(Error::Refused(error)),
        bans_stream::Got::Other(r) => Err(Error::UnexpectedReply { want: "bans", got: r.kind() }),
    }
}

/// A reader that counts what it gave (to tell "no answer" from "cut short").
struct Counted<R> {
    r: R,
    n: u64,
}

impl<R: std::io::Read> std::io::Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.r.read(buf)?;
        self.n += n as u64;
        Ok(n)
    }
}

/// The deserializer of a streamed `Reply::Bans` ([`call_bans`]).
mod bans_stream {
    use std::fmt;

    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::BanView;

    pub enum Got {
        /// A bans reply: how many rows it had.
        Rows(u64),
        /// Another reply, whole.
        Other(super::Reply),
    }

    /// The reply: `{"reply": KIND, ...}`, KIND first (the daemon writes
    /// it so, as serde writes every tagged reply).
    pub struct ReplySeed<'a> {
        pub each: &'a mut dyn FnMut(BanView) -> std::io::Result<()>,
        /// Where a failure of `each` (stdout closed) is left.
        pub failed: &'a mut Option<std::io::Error>,
    }

    impl<'de> DeserializeSeed<'de> for ReplySeed<'_> {
        type Value = Got;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Got, D::Error> {
            d.deserialize_map(self)
        }
    }

    /// The rest of a reply that is not `bans`, as the reply it is.
    fn whole<'de, A: MapAccess<'de>>(
        mut rest: serde_json::Map<String, serde_json::Value>,
        mut map: A,
    ) -> Result<Got, A::Error> {
        while let Some((k, v)) = map.next_entry::<String, serde_json::Value>()? {
            rest.insert(k, v);
        }
        serde::Deserialize::deserialize(serde_json::Value::Object(rest)).map(Got::Other).map_err(de::Error::custom)
    }

    impl<'de> Visitor<'de> for ReplySeed<'_> {
        type Value = Got;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a reply object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Got, A::Error> {
            let mut rest = serde_json::Map::new();
            let Some(k) = map.next_key::<String>()? else { return Err(de::Error::missing_field("reply")) };
            let v: serde_json::Value = map.next_value()?;
            let bans = k == "reply" && v == "bans";
            rest.insert(k, v);
            if !bans {
                return whole(rest, map);
            }
            let mut n = 0;
            while let Some(k) = map.next_key::<String>()? {
                if k == "bans" {
                    n = map.next_value_seed(Rows { each: &mut *self.each, failed: &mut *self.failed })?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(Got::Rows(n))
        }
    }

    /// The `bans` array, each element handed on as it is parsed.
    struct Rows<'a> {
        each: &'a mut dyn FnMut(BanView) -> std::io::Result<()>,
        failed: &'a mut Option<std::io::Error>,
    }

    impl<'de> DeserializeSeed<'de> for Rows<'_> {
        type Value = u64;
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
            d.deserialize_seq(self)
        }
    }

    impl<'de> Visitor<'de> for Rows<'_> {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a list of bans")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u64, A::Error> {
            let mut n = 0;
            while let Some(b) = seq.next_element::<BanView>()? {
                if let Err(e) = (self.each)(b) {
                    *self.failed = Some(e);
                    return Err(de::Error::custom("stopped"));
                }
                n += 1;
            }
            Ok(n)
        }
    }
}

/// The daemon as the CLI talks to it: a method per request, each returning
/// that request's reply, so no caller matches on [`Reply`]. A reply of
/// another kind (a daemon of another build) is [`Error::UnexpectedReply`].
#[derive(Clone, Debug)]
pub struct Client {
    path: PathBuf,
    timeout: Duration,
}

/// One arm per request kind: the reply it takes, or the reply back.
macro_rules! take {
    ($reply:expr, $pat:pat => $out:expr) => {
        match $reply {
            $pat => Ok($out),
            other => Err(other),
        }
    };
}

impl Client {
    /// The daemon of this network namespace ([`socket_path`]).
    pub fn new(timeout: Duration) -> Result<Client> {
        Ok(Client::at(socket_path()?, timeout))
    }

    /// The daemon listening on `path`.
    pub fn at(path: PathBuf, timeout: Duration) -> Client {
        Client { path, timeout }
    }

    fn ask<T>(&self, req: Request, want: &'static str, take: impl FnOnce(Reply) -> Result<T, Reply>) -> Result<T> {
        take(call_at(&self.path, &req, self.timeout)?).map_err(|got| Error::UnexpectedReply { want, got: got.kind() })
    }

    /// A change: the daemon's message of what it did.
    fn change(&self, req: Request) -> Result<String> {
        self.ask(req, "done", |r| take!(r, Reply::Done { message, .. } => message))
    }

    /// `replace`: the given fields alone, not laid over the rule in force.
    /// Starts a capture: the daemon's message and the connection its
    /// chunks come on (`crate::capture::read_chunk`), with no read timeout
    /// (a capture may wait long for a frame).
    pub fn capture(&self, spec: crate::capture::CaptureSpec) -> Result<(String, BufReader<UnixStream>)> {
        let (reply, reader) = call_reader(&self.path, &Request::Capture { spec }, self.timeout)?;
        match reply {
            Reply::Capturing { message } => {
                reader.get_ref().set_read_timeout(None)?;
                Ok((message, reader))
            }
            got => Err(Error::UnexpectedReply { want: "capturing", got: got.kind() }),
        }
    }

    pub fn rule_set(&self, rule: RuleConfig, runtime: bool, replace: bool, force: bool) -> Result<String> {
        self.change(Request::RuleSet { rule, runtime, replace, force })
    }

    pub fn rule_rm(&self, rule: RuleConfig, runtime: bool) -> Result<String> {
        self.change(Request::RuleRm { rule, runtime })
    }

    pub fn detach(&self, iface: String, hand_over: bool, force: bool) -> Result<String> {
        self.change(Request::Detach { iface, hand_over, force })
    }

    pub fn chain_add(&self, chain: crate::chain::ChainConfig, slot: Option<u32>) -> Result<String> {
        self.change(Request::ChainAdd { chain, slot })
    }

    pub fn chain_rm(&self, iface: String, slot: u32) -> Result<String> {
        self.change(Request::ChainRm { iface, slot })
    }

    pub fn chain_ls(&self, iface: Option<String>) -> Result<Vec<ChainView>> {
        self.ask(Request::ChainLs { iface }, "chains", |r| take!(r, Reply::Chains { chains } => chains))
    }

    pub fn reload(&self, discard_runtime: bool) -> Result<String> {
        self.change(Request::Reload { discard_runtime, candidate: None })
    }

    pub fn ban(&self, rule: RuleConfig, runtime: bool, force: bool, state: bool) -> Result<String> {
        self.change(Request::Ban { rule, runtime, force, state })
    }

    pub fn unban(&self, prefix: String, runtime: bool) -> Result<String> {
        self.change(Request::Unban { prefix, runtime })
    }

    /// `policer rule import` (`req`: a [`Request::Import`], one field per
    /// flag of the verb).
    pub fn import(&self, req: Request) -> Result<(String, Option<Box<ImportCounts>>)> {
        self.ask(req, "done", |r| take!(r, Reply::Done { message, counts } => (message, counts)))
    }

    pub fn set_rm(&self, name: String) -> Result<String> {
        self.change(Request::SetRm { name })
    }

    pub fn set_ls(&self, name: String) -> Result<SetView> {
        self.ask(Request::SetLs { name }, "set", |r| take!(r, Reply::Set(v) => *v))
    }

    pub fn rule_ls(&self) -> Result<Vec<RuleView>> {
        self.ask(Request::RuleLs, "rules", |r| take!(r, Reply::Rules { rules } => rules))
    }

    pub fn ban_ls(&self) -> Result<Vec<BanView>> {
        let mut out = Vec::new();
        self.ban_ls_each(&mut |b| {
            out.push(b);
            Ok(())
        })?;
        Ok(out)
    }

    /// `ban ls`, each row to `each` as it arrives ([`call_bans`]); how many.
    pub fn ban_ls_each(&self, each: &mut dyn FnMut(BanView) -> std::io::Result<()>) -> Result<u64> {
        call_bans(&self.path, self.timeout, each)
    }

    pub fn status(&self) -> Result<StatusView> {
        self.ask(Request::Status, "status", |r| take!(r, Reply::Status(v) => *v))
    }

    pub fn stats(&self) -> Result<StatsView> {
        self.ask(Request::Stats, "stats", |r| take!(r, Reply::Stats(v) => *v))
    }

    pub fn top(&self, n: usize) -> Result<TopView> {
        self.ask(Request::Top { n }, "top", |r| take!(r, Reply::Top(v) => *v))
    }

    /// `--dry-run` of `change`: what it would do, or its refusal.
    pub fn dry_run(&self, change: Request) -> Result<DryRunView> {
        self.ask(Request::DryRun { change: Box::new(change) }, "dry_run", |r| take!(r, Reply::DryRun(v) => *v))
    }

    pub fn inspect(&self, addr: std::net::IpAddr, frame: InspectFrame) -> Result<InspectView> {
        self.ask(Request::Inspect { addr, frame }, "inspect", |r| take!(r, Reply::Inspect(v) => *v))
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Read, os::unix::net::UnixListener};

    use super::*;

    /// A daemon that answers one connection with `reply`, and hands back
    /// the request line it read.
    fn one_answer(reply: &'static str) -> (Client, std::thread::JoinHandle<String>, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let l = UnixListener::bind(&path).expect("bind");
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().expect("accept");
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).expect("request");
            (&s).write_all(reply.as_bytes()).expect("reply");
            let _ = (&s).read(&mut [0u8; 1]);
            line
        });
        (Client::at(path, Duration::from_secs(5)), h, dir)
    }

    #[test]
    fn each_request_gets_its_own_reply_type() {
        let (c, h, _d) = one_answer("{\"reply\":\"done\",\"message\":\"rule set\"}\n");
        assert_eq!(c.reload(false).unwrap(), "rule set");
        let sent: serde_json::Value = serde_json::from_str(&h.join().unwrap()).unwrap();
        assert_eq!(sent["op"], "reload", "the wire format is as before: {sent}");
        assert_eq!(sent["protocol"], PROTOCOL);
        let (c, h, _d) = one_answer("{\"reply\":\"rules\",\"rules\":[]}\n");
        assert!(c.rule_ls().unwrap().is_empty());
        h.join().unwrap();
    }

    /// A daemon at its cap answers "busy" and closes without reading the
    /// request (the client then sees a reset, or a broken pipe when it
    /// writes late): the CLI says busy, with the cap, not the errno.
    #[test]
    fn a_shed_connection_says_busy() {
        for late in [false, true] {
            let dir = tempfile::tempdir().expect("tempdir");
            let path = dir.path().join("s.sock");
            let l = UnixListener::bind(&path).expect("bind");
            let h = std::thread::spawn(move || {
                let (s, _) = l.accept().expect("accept");
                // Late, the request is in: closing with it unread resets
                // the connection. Early, the CLI's write may come after
                // the close (a broken pipe).
                if late {
                    std::thread::sleep(Duration::from_millis(100));
                }
                let mut line = serde_json::to_vec(&Reply::busy(512, 512)).unwrap();
                line.push(b'\n');
                (&s).write_all(&line).expect("busy");
            });
            let e = Client::at(path, Duration::from_secs(5)).stats().unwrap_err();
            assert!(matches!(e, Error::Busy { in_use: 512, cap: 512 }), "{e:?}");
            assert_eq!(e.to_string(), "daemon busy: 512 of 512 control connections in use; try again");
            h.join().unwrap();
        }
        // An older CLI reads a plain refusal with the same words.
        let v: serde_json::Value = serde_json::to_value(Reply::busy(7, 8)).unwrap();
        assert_eq!(v["reply"], "refused");
        assert_eq!(v["error"], "daemon busy: 7 of 8 control connections in use; try again");
    }

    /// `ban ls` hands each row on as it is parsed, from the `Reply::Bans`
    /// line the daemon streams; a refusal, a busy daemon, a reply of
    /// another kind and an answer cut short are the errors they are.
    #[test]
    fn ban_ls_rows_come_one_at_a_time() {
        let bans: Vec<BanView> = (0..3)
            .map(|i| BanView {
                prefix: format!("10.0.0.{i}/32"),
                origin: if i == 0 { "manual" } else { "auto" }.into(),
                rule: (i > 0).then(|| "0.0.0.0/0".into()),
                reason: None,
                expires: "2026-01-01T00:00:00.000Z".into(),
                left_seconds: 1.5,
                dropped_pkts: i,
                drops_margin: 0,
                count: (i > 0).then_some(1),
                length_seconds: (i > 0).then_some(60.0),
            })
            .collect();
        let mut line = serde_json::to_string(&Reply::Bans { bans: bans.clone() }).unwrap();
        line.push('\n');
        let (c, h, _d) = one_answer(Box::leak(line.into_boxed_str()));
        let mut got = Vec::new();
        let n = c
            .ban_ls_each(&mut |b| {
                got.push(b);
                Ok(())
            })
            .unwrap();
        assert_eq!((n, got), (3, bans.clone()));
        let sent: serde_json::Value = serde_json::from_str(&h.join().unwrap()).unwrap();
        assert_eq!(sent["op"], "ban_ls", "{sent}");
        let (c, h, _d) = one_answer("{\"reply\":\"bans\",\"bans\":[]}\n");
        assert!(c.ban_ls().unwrap().is_empty());
        h.join().unwrap();
        let (c, h, _d) = one_answer("{\"reply\":\"refused\",\"error\":\"no map\"}\n");
        assert!(matches!(c.ban_ls(), Err(Error::Refused(m)) if m == "no map"));
        h.join().unwrap();
        let (c, h, _d) =
            one_answer("{\"reply\":\"refused\",\"error\":\"daemon busy\",\"busy\":{\"in_use\":4,\"cap\":4}}\n");
        assert!(matches!(c.ban_ls(), Err(Error::Busy { in_use: 4, cap: 4 })));
        h.join().unwrap();
        let (c, h, _d) = one_answer("{\"reply\":\"rules\",\"rules\":[]}\n");
        assert!(matches!(c.ban_ls(), Err(Error::UnexpectedReply { want: "bans", got: "rules" })));
        h.join().unwrap();
        // The rows that came are handed on; then the error says it was cut.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let l = UnixListener::bind(&path).expect("bind");
        let part = format!("{{\"reply\":\"bans\",\"bans\":[{},", serde_json::to_string(&bans[0]).unwrap());
        let h = std::thread::spawn(move || {
            let (s, _) = l.accept().expect("accept");
            BufReader::new(&s).read_line(&mut String::new()).expect("request");
            (&s).write_all(part.as_bytes()).expect("reply");
        });
        let mut got = 0;
        let e = Client::at(path, Duration::from_secs(5))
            .ban_ls_each(&mut |_| {
                got += 1;
                Ok(())
            })
            .unwrap_err();
        assert_eq!(got, 1);
        assert!(e.to_string().contains("cut short"), "{e}");
        h.join().unwrap();
    }

    #[test]
    fn a_reply_of_another_kind_is_a_typed_error() {
        let (c, h, _d) = one_answer("{\"reply\":\"rules\",\"rules\":[]}\n");
        let e = c.status().unwrap_err();
        assert!(matches!(e, Error::UnexpectedReply { want: "status", got: "rules" }), "{e:?}");
        assert!(e.to_string().contains("another version of policer"), "{e}");
        h.join().unwrap();
        let (c, h, _d) = one_answer("{\"reply\":\"refused\",\"error\":\"no such rule\"}\n");
        assert!(matches!(c.rule_rm(RuleConfig::default(), false), Err(Error::Refused(m)) if m == "no such rule"));
        h.join().unwrap();
    }
}
