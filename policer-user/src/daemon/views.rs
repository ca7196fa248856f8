//! Read-only views of the running policer: `stats`, `top`, `rule ls`,
//! `status`, `/metrics` and `/healthz`.
//!
//! They never go through the owner thread: the kernel's maps are read
//! through the loader's [`MapReader`] (its own file descriptors), and what
//! only the daemon knows (interfaces, rules, their counter slots) comes from
//! the last [`Snapshot`] the owner published. A table read of a second
//! holds up no rule change, and a rule change holds up no read.

use std::{
    collections::BTreeMap,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use policer_common::{
    BucketKey, Counters, FAMILY_V4, FAMILY_V6, MAX_IFACE_SLOTS, Rule, RuleCounters,
    bucket::Action,
    class::{ClassFilter, ClassList, ClassLookups, FrameL4},
};
use serde::Serialize;
use tokio::sync::watch;

use super::monotonic_ns;
use crate::{
    control::{
        BanView, CountersView, IfaceStats, InspectCover, InspectFrame, InspectView, RuleStats, RuleView, StatsView,
        StatusView, TableStats, TopEntry, TopView,
    },
    error::{Error, Result},
    loader::MapReader,
    netlink,
    protect::protected_rule,
    resolve::{self, Answer, By, Cover, Resolver, SetList},
    rules::{RuleKey, RuleSpec},
};

/// How old the live-bucket count on /metrics may be: counting reads the
/// whole table (≈ 0.3 s at 1 000 000 buckets), so scrapes share one count.
const LIVE_COUNT_MAX_AGE: Duration = Duration::from_secs(5);

/// An interface the daemon polices.
#[derive(Clone, Debug)]
pub struct IfaceRef {
    pub name: String,
    pub index: u32,
    /// `native` or `skb`.
    pub mode: &'static str,
    /// Since when (Unix ms) the program is found gone from this hook
    /// (`hook.rs`); none while it polices.
    pub lost_since: Option<u64>,
    /// Member mode (`--join`): the root's slot policer runs in.
    pub join: Option<crate::member::Join>,
}

/// What the owner thread publishes after every change.
#[derive(Clone, Debug)]
pub struct Snapshot {
    pub ifaces: Vec<IfaceRef>,
    /// Shared with the owner's rule set: published without a copy.
    pub rules: super::Rules,
    /// Rules the config file holds that are not in force (removed with
    /// `rule rm --runtime`).
    pub removed_at_runtime: Vec<RuleSpec>,
    pub config: String,
    pub persist: bool,
    pub program_id: u32,
    pub config_status: crate::control::ConfigStatus,
    /// Named sets (`rule import`), each as one rule.
    pub sets: Vec<SetRow>,
    /// Where `/metrics` is served.
    pub metrics: Option<std::net::SocketAddr>,
    /// The protected prefixes (`protect` in [daemon]).
    pub protect: Vec<ipnet::IpNet>,
    /// Why the daemon leaves on its own (`--on-detach exit`).
    pub exit: Option<String>,
    /// The manual bans' counter slots, sorted: their count and drops for
    /// `stats` and `/metrics` without a walk of the rules.
    pub manual_ban_slots: Arc<Vec<u32>>,
    /// The config's `[[chain]]` tables (where a slot's program came from).
    pub chains: Vec<crate::chain::ChainConfig>,
}

/// A named set: its `rule ls` row, counter slot, rule and entries.
#[derive(Clone, Debug)]
pub struct SetRow {
    pub view: RuleView,
    pub slot: u32,
    pub spec4: RuleSpec,
    pub spec6: RuleSpec,
    pub entries: Arc<Vec<ipnet::IpNet>>,
    /// What put each entry in (a MaxMind DB set's country or AS).
    pub labels: Option<Arc<crate::mmdb::Labels>>,
}

/// The sets' rows for `rule ls`, `stats`, `inspect` (the snapshot).
pub(super) fn set_rows(sets: &BTreeMap<String, super::sets::SetState>) -> Vec<SetRow> {
    sets.values()
        .map(|s| SetRow {
            view: s.view(),
            slot: s.slot,
            spec4: s.spec4.clone(),
            spec6: s.spec6.clone(),
            entries: s.entries.clone(),
            labels: s.header.labels.clone(),
        })
        .collect()
}

impl SetRow {
    /// `set:NAME (ENTRY)`, with what put the entry in when the set knows
    /// (`set:geo (192.0.2.0/24, country DE)`).
    pub fn entry_name(&self, n: &ipnet::IpNet) -> String {
        match self.labels.as_ref().and_then(|l| l.get(n)) {
            Some(l) => format!("{} ({n}, {l})", self.view.prefix),
            None => format!("{} ({n})", self.view.prefix),
        }
    }

    /// The longest entry that holds `addr`: a lookup per prefix length.
    pub fn entry_for(&self, addr: IpAddr) -> Option<ipnet::IpNet> {
        self.entries_over(addr).next()
    }

    /// Every entry that holds `addr`, longest first.
    pub fn entries_over(&self, addr: IpAddr) -> impl Iterator<Item = ipnet::IpNet> + '_ {
        let max = if addr.is_ipv4() { 32 } else { 128 };
        (0..=max).rev().filter_map(move |len| {
            let n = ipnet::IpNet::new(addr, len).ok()?.trunc();
            self.entries.binary_search(&n).is_ok().then_some(n)
        })
    }
}

/// The rules in force as the resolver reads them: the keys of one prefix
/// are a range of the map (a key orders by prefix first).
impl crate::resolve::RuleSource for super::Rules {
    type Key = RuleKey;

    fn nets(&self) -> impl Iterator<Item = ipnet::IpNet> + '_ {
        self.keys().map(|k| k.net)
    }

    fn at<'s>(&'s self, net: ipnet::IpNet, out: &mut Vec<crate::resolve::Entry<'s, RuleKey>>) {
        let first = RuleKey::new(net, crate::classes::Class::default(), false);
        for (k, i) in self.range(first..).take_while(|(k, _)| k.net == net) {
            let Ok(value) = i.spec.kernel(i.id) else { continue };
            let value = value.with_counter_slot(i.slot);
            out.push(crate::resolve::Entry {
                net,
                class: k.class(),
                value,
                ban: k.ban,
                inherit: i.spec.inherits(),
                key: k,
            });
        }
    }
}

/// The read side of the daemon, shared by every connection.
pub struct Views {
    reader: Arc<MapReader>,
    snapshot: watch::Receiver<Arc<Snapshot>>,
    /// The last count of the bucket table: when, live buckets, evicted.
    live_count: Mutex<Option<(Instant, u64, u64)>>,
    /// The audit trail (the last changes are in `stats`).
    audit: super::audit::Audit,
    /// When the daemon began serving (`status`'s uptime).
    started: Instant,
    /// The decision feeds' statuses (`[crowdsec]`).
    feeds: Mutex<Vec<Arc<Mutex<crate::control::FeedStatus>>>>,
    /// The fleet budgets' lease thread's status (`[global]`, `fleet.rs`).
    fleet: std::sync::OnceLock<Arc<Mutex<crate::control::FleetStatus>>>,
    /// `policer capture`'s hub (set once serving starts).
    capture: std::sync::OnceLock<Arc<super::capture::Hub>>,
    /// The automatic bans' counts the owner keeps.
    tally: Arc<super::bans::BanTally>,
}

/// `/healthz`: whether the program is attached to every interface the
/// daemon polices.
#[derive(Clone, Debug, Serialize)]
pub struct Health {
    pub healthy: bool,
    pub program_id: u32,
    pub interfaces: Vec<IfaceHealth>,
}

#[derive(Clone, Debug, Serialize)]
pub struct IfaceHealth {
    pub name: String,
    /// Whether our program (not another, not none) is attached.
    pub attached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Views {
    pub fn new(
        reader: Arc<MapReader>,
        snapshot: watch::Receiver<Arc<Snapshot>>,
        audit: super::audit::Audit,
        tally: Arc<super::bans::BanTally>,
    ) -> Views {
        Views {
            tally,
            reader,
            snapshot,
            live_count: Mutex::new(None),
            audit,
            started: Instant::now(),
            feeds: Mutex::new(Vec::new()),
            fleet: std::sync::OnceLock::new(),
            capture: std::sync::OnceLock::new(),
        }
    }

    /// The map reader (a dry run's table reads).
    pub fn reader(&self) -> Arc<MapReader> {
        self.reader.clone()
    }

    /// Registers the capture hub (its counts go to `stats` and `/metrics`).
    pub fn set_capture(&self, hub: Arc<super::capture::Hub>) {
        let _ = self.capture.set(hub);
    }

    /// The names a capture writes: each rule's prefix and `rule ls` name
    /// (with its class; `ban PREFIX` for a manual ban) by counter slot,
    /// each interface's by index.
    pub fn capture_names(&self) -> super::capture::Names {
        let snap = self.snap();
        let mut rules = BTreeMap::new();
        for r in snap.rules.values() {
            let prefix = r.spec.net.to_string();
            let class = r.spec.class().to_string();
            // A ban is named as `rule ls` and `replay` name it: the frame it
            // dropped is the ban's, not a rule's at the same prefix.
            let name = if r.spec.ban().is_some() {
                format!("ban {prefix}")
            } else if class == "-" || class.is_empty() {
                prefix.clone()
            } else {
                format!("{prefix} ({class})")
            };
            rules.insert(r.slot, (prefix, name));
        }
        for set in &snap.sets {
            rules.insert(set.slot, (set.view.prefix.clone(), set.view.prefix.clone()));
        }
        let ifaces = snap.ifaces.iter().map(|i| (i.index, i.name.clone())).collect();
        super::capture::Names { rules, ifaces }
    }

    /// The audit trail, to record a change in.
    pub fn audit(&self) -> &super::audit::Audit {
        &self.audit
    }

    /// A receiver of the owner's snapshots: its `changed()` fails once the
    /// owner thread is gone (it ended, or panicked).
    pub fn subscribe(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.snapshot.clone()
    }

    fn snap(&self) -> Arc<Snapshot> {
        self.snapshot.borrow().clone()
    }

    /// Counters summed over interfaces and CPUs (the counter lines).
    pub fn counters(&self) -> Result<Counters> {
        self.reader.counters()
    }

    pub fn rules(&self) -> Vec<RuleView> {
        let snap = self.snap();
        let view = |s: &RuleSpec, persisted: bool, in_force: bool| {
            let t = s.class().text();
            RuleView {
                prefix: s.net.to_string(),
                class: s.class().to_string(),
                proto: t.proto,
                dport: t.dport,
                sport: t.sport,
                tcp_flags: t.tcp_flags,
                icmp_type: t.icmp_type,
                dst: t.dst,
                total_rate: s.total().map(|(r, _)| r.to_string()),
                total_burst: s.total().map(|(_, b)| b),
                global: s.global().map(str::to_string),
                syn_cookies: s.syn().map(|y| y.mode.name().to_string()),
                syn_ack_rate: s.syn().map(|y| y.syn_ack_pps),
                action: s.action.to_string(),
                rate: s.rate.map(|r| r.to_string()),
                burst: s.rate.map(|_| s.burst),
                unit: if s.rate.is_some_and(|r| r.is_bytes()) { "bytes" } else { "packets" }.into(),
                key_len: s.key_len,
                persisted,
                in_force,
                ban: s.ban().is_some(),
                reason: s.ban().cloned().flatten(),
                ban_for: s.auto_ban().map(|b| crate::duration::format(b.ban_for)),
                ban_after: s.auto_ban().map(|b| b.ban_after),
                ban_max: s.auto_ban().and_then(|b| b.ban_max).map(crate::duration::format),
                ban_within: s.auto_ban().and_then(|b| b.ban_within).map(crate::duration::format),
                expires: s.expires.map(crate::duration::rfc3339),
                set: None,
                entries: None,
                origin: None,
            }
        };
        let mut out: Vec<RuleView> = snap.rules.values().map(|r| view(&r.spec, r.persisted, true)).collect();
        out.extend(snap.removed_at_runtime.iter().map(|s| view(s, true, false)));
        out.extend(snap.sets.iter().map(|s| s.view.clone()));
        out
    }

    /// `policer rule ls --set NAME`: the set as the owner last published
    /// it (its entries shared, not copied), for the connection to stream.
    pub fn set(&self, name: &str) -> Result<SetRow> {
        let snap = self.snap();
        if let Some(s) = snap.sets.iter().find(|s| s.view.set.as_deref() == Some(name)) {
            return Ok(s.clone());
        }
        Err(super::sets::unknown_set(name, snap.sets.iter().filter_map(|s| s.view.set.as_deref())))
    }

    /// The daemon now.
    pub fn status(&self) -> StatusView {
        let s = self.snap();
        StatusView {
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
            uptime_seconds: Some(self.started.elapsed().as_secs_f64()),
            interface_modes: s
                .ifaces
                .iter()
                .map(|i| crate::control::IfaceMode {
                    name: i.name.clone(),
                    mode: i.mode.to_string(),
                    attached: Some(i.lost_since.is_none()),
                    detached_since: i.lost_since.map(crate::duration::rfc3339),
                })
                .collect(),
            sets: Some(
                s.sets
                    .iter()
                    .map(|r| crate::control::SetStatus {
                        name: r.view.set.clone().unwrap_or_else(|| r.view.prefix.clone()),
                        action: r.view.action.clone(),
                        entries: r.entries.len() as u64,
                        origin: r.view.origin.clone(),
                    })
                    .collect(),
            ),
            // Kept counts, not a read of the bans (`bans.rs`, BanTally).
            bans: Some(crate::control::BanCounts { manual: s.manual_ban_slots.len() as u64, auto: self.tally.get().0 }),
            metrics: s.metrics.map(|a| a.to_string()),
            pid: std::process::id(),
            interfaces: s.ifaces.iter().map(|i| i.name.clone()).collect(),
            config: s.config.clone(),
            // The rules, as the reload guard counts them: the manual bans
            // are `bans.manual`.
            rules: s.rules.keys().filter(|k| !k.ban).count(),
            runtime_rules: s.rules.values().filter(|r| !r.persisted).count() + s.removed_at_runtime.len(),
            persist: s.persist,
            program_id: s.program_id,
            config_status: Some(s.config_status.clone()),
            feeds: self.feeds(),
            fleet: self.fleet(),
            protect: Some(s.protect.iter().map(|p| p.to_string()).collect()),
            captures: Some(self.capture.get().map_or(0, |h| h.active())),
            chains: self.chain_ls(None).ok(),
            syn_cookies: self.syn_status(&s),
            syn_cookie_warnings: if s.rules.values().any(|r| r.spec.syn().is_some()) {
                crate::syncookies::HostTcp::read()
                    .preflight()
                    .into_iter()
                    .filter(|(ok, _)| !ok)
                    .map(|(_, m)| m)
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    /// The rules with SYN cookies and their counters (`status`).
    fn syn_status(&self, s: &Snapshot) -> Vec<crate::control::SynStatus> {
        let counters: BTreeMap<u32, policer_common::syn::SynCounters> =
            self.reader.syn_counters().unwrap_or_default().into_iter().collect();
        s.rules
            .iter()
            .filter_map(|(k, r)| {
                let y = r.spec.syn()?;
                let c = counters.get(&r.slot).copied().unwrap_or_default();
                Some(crate::control::SynStatus {
                    rule: k.to_string(),
                    counters: crate::control::SynStatsView { mode: y.mode.name().to_string(), counters: c },
                })
            })
            .collect()
    }

    /// The decision feeds as their tasks last reported.
    pub fn feeds(&self) -> Vec<crate::control::FeedStatus> {
        self.feeds
            .lock()
            .map(|f| f.iter().map(|f| f.lock().map(|s| s.clone()).unwrap_or_default()).collect())
            .unwrap_or_default()
    }

    /// The fleet budgets as the lease thread last reported (none without
    /// `[global]`).
    pub fn fleet(&self) -> Option<crate::control::FleetStatus> {
        self.fleet.get().and_then(|f| f.lock().ok().map(|s| s.clone()))
    }

    /// Registers the lease thread's status (it updates it in place).
    pub fn set_fleet(&self, status: Arc<Mutex<crate::control::FleetStatus>>) {
        let _ = self.fleet.set(status);
    }

    /// Registers a feed's status (its task updates it in place).
    pub fn add_feed(&self, status: Arc<Mutex<crate::control::FeedStatus>>) {
        if let Ok(mut f) = self.feeds.lock() {
            f.push(status);
        }
    }

    /// Each policed interface's chain (`iface`: that one alone), with its
    /// counters.
    pub fn chain_ls(&self, iface: Option<&str>) -> Result<Vec<crate::control::ChainView>> {
        use policer_common::chain::CHAIN_SLOTS;
        let snap = self.snap();
        if let Some(n) = iface
            && !snap.ifaces.iter().any(|i| i.name == n)
        {
            return Err(crate::Error::Invalid(format!("{n} is not policed by this daemon")));
        }
        let counts = self.reader.chain_counters()?;
        let mut out = Vec::new();
        for i in snap.ifaces.iter().filter(|i| iface.is_none_or(|n| n == i.name)) {
            let c = counts.iter().find(|(s, _)| *s == i.index % MAX_IFACE_SLOTS).map(|x| x.1).unwrap_or_default();
            // A member's chain: the root's slots behind policer's own.
            if let Some(j) = &i.join {
                let mut slots = crate::chain::slots_in(&j.path, j.slot + 1..j.slot + 1 + CHAIN_SLOTS)?;
                for s in slots.iter_mut() {
                    s.from = "the root's array, behind policer (member mode)".into();
                }
                out.push(crate::control::ChainView {
                    interface: i.name.clone(),
                    pinned: j.path.display().to_string(),
                    handed_packets: c.handed_pkts,
                    empty_packets: c.empty_pkts,
                    slots,
                });
                continue;
            }
            out.push(crate::control::ChainView {
                interface: i.name.clone(),
                pinned: policer_common::chain::pin_path(&i.name).display().to_string(),
                handed_packets: c.handed_pkts,
                empty_packets: c.empty_pkts,
                slots: super::chain::listed(&i.name, &snap.chains)?,
            });
        }
        Ok(out)
    }

    /// One sample of every counter.
    pub fn stats(&self) -> Result<StatsView> {
        let snap = self.snap();
        let time_ns = monotonic_ns();
        let slots = self.reader.iface_counters()?;
        let mut total = Counters::default();
        for (_, c) in &slots {
            total.add(c);
        }
        let chain = self.reader.chain_counters()?;
        let mut chain_total = policer_common::chain::ChainCounters::default();
        for (_, c) in &chain {
            chain_total.add(c);
        }
        let interfaces = snap
            .ifaces
            .iter()
            .map(|i| {
                let at = i.index % MAX_IFACE_SLOTS;
                let c = slots.iter().find(|(s, _)| *s == at).map(|x| x.1).unwrap_or_default();
                let ch = chain.iter().find(|(s, _)| *s == at).map(|x| x.1).unwrap_or_default();
                IfaceStats {
                    detached_since: i.lost_since.map(crate::duration::rfc3339),
                    chain_handed_packets: ch.handed_pkts,
                    chain_empty_packets: ch.empty_pkts,
                    ..iface_stats(&i.name, i.index, &c)
                }
            })
            .collect();
        let counters = self.reader.rule_counters()?;
        let syn: BTreeMap<u32, policer_common::syn::SynCounters> = self.reader.syn_counters()?.into_iter().collect();
        let bans = self.ban_stats(&snap, &counters, &total);
        let rc: BTreeMap<u32, RuleCounters> = counters.into_iter().collect();
        // Manual bans are not rows here: their count and drops are in
        // `bans`, each one's in `ban ls` (100 000 bans would be 100 000
        // rows, and as many series on /metrics).
        let rules = snap
            .rules
            .iter()
            .filter(|(key, _)| !key.ban)
            .map(|(key, r)| RuleStats {
                prefix: key.net.to_string(),
                class: key.class().to_string(),
                action: r.spec.action.to_string(),
                counters: CountersView::from(&rc.get(&r.slot).copied().unwrap_or_default()),
                syn: r.spec.syn().map(|y| crate::control::SynStatsView {
                    mode: y.mode.name().to_string(),
                    counters: syn.get(&r.slot).copied().unwrap_or_default(),
                }),
                rates: None,
            })
            .chain(snap.sets.iter().map(|s| RuleStats {
                prefix: s.view.prefix.clone(),
                class: String::new(),
                action: s.view.action.clone(),
                counters: CountersView::from(&rc.get(&s.slot).copied().unwrap_or_default()),
                syn: None,
                rates: None,
            }))
            .collect();
        let fill = self.reader.recall_fill(time_ns)?;
        let table = TableStats {
            capacity: self.reader.max_sources() as u64,
            created: total.buckets_created,
            live: None,
            insert_failures: total.bucket_insert_failed,
            recall_capacity: fill.capacity,
            recall_live: fill.live,
        };
        Ok(StatsView {
            time_ns,
            totals: IfaceStats {
                chain_handed_packets: chain_total.handed_pkts,
                chain_empty_packets: chain_total.empty_pkts,
                ..iface_stats("total", 0, &total)
            },
            interfaces,
            rules,
            table,
            config: snap.config_status.clone(),
            bans,
            recent_changes: self.audit.recent(),
            feeds: self.feeds(),
            fleet: self.fleet(),
            capture: self.capture.get().and_then(|h| h.status()),
        })
    }

    /// The bans' counts: kept by the owner (the manual bans' slots in the
    /// snapshot, the automatic bans' [`super::bans::BanTally`]), so this
    /// reads neither the ban store nor a row per ban.
    fn ban_stats(
        &self,
        snap: &Snapshot,
        counters: &[(u32, RuleCounters)],
        total: &Counters,
    ) -> crate::control::BanStats {
        let (auto_active, auto_stored) = self.tally.get();
        crate::control::BanStats {
            manual_active: snap.manual_ban_slots.len() as u64,
            manual_dropped_packets: super::bans::manual_dropped(counters, &snap.manual_ban_slots),
            auto_active,
            auto_started: total.bans_started,
            auto_dropped_packets: total.ban_drops,
            auto_refused_full: total.bans_refused_full,
            auto_capacity: self.reader.ban_capacity() as u64,
            auto_stored,
        }
    }

    /// `policer ban ls`: manual bans (from the rules in force) and the
    /// automatic bans in force (from the program's store), soonest end
    /// first; for `top` and `inspect` (the control socket streams `ban ls`
    /// through [`Views::ban_ls`] instead, unsorted).
    pub fn bans(&self) -> Result<Vec<BanView>> {
        let ls = self.ban_ls()?;
        let mut out: Vec<BanView> = ls.manual().collect();
        out.extend(self.auto_bans(&ls)?.into_iter().map(|(_, b)| b));
        out.sort_by(|a, b| a.left_seconds.total_cmp(&b.left_seconds).then_with(|| a.prefix.cmp(&b.prefix)));
        Ok(out)
    }

    /// What `ban ls` rows are made from: the snapshot's manual bans and
    /// every rule slot's drops (one read of the rule counters). Blocking.
    pub fn ban_ls(&self) -> Result<BanLs> {
        let snap = self.snap();
        let mut dropped = Vec::new();
        // Only a manual ban's drops are read from the rule counters (every
        // rule slot on every CPU): with none, nothing is read.
        let counters = if snap.manual_ban_slots.is_empty() { Vec::new() } else { self.reader.rule_counters()? };
        for (slot, c) in counters {
            let i = slot as usize;
            if dropped.len() <= i {
                dropped.resize(i + 1, 0);
            }
            dropped[i] = c.dropped_pkts;
        }
        // The rules automatic bans name, by slot (a manual ban makes none).
        let rules = snap.rules.iter().filter(|(k, _)| !k.ban).map(|(k, r)| (r.slot, k.to_string())).collect();
        Ok(BanLs { snap, dropped, rules })
    }

    /// The map reader (`ban ls` walks the ban store through it).
    pub fn map_reader(&self) -> &Arc<MapReader> {
        &self.reader
    }

    /// The automatic bans in force, each with its bucket key.
    fn auto_bans(&self, ls: &BanLs) -> Result<Vec<(BucketKey, BanView)>> {
        let (now_ms, now_ns) = (crate::duration::unix_ms(), monotonic_ns());
        Ok(self
            .reader
            .bans()?
            .iter()
            .filter_map(|(k, b)| ls.auto(k, b, now_ms, now_ns).map(|v| (BucketKey::from(*k), v)))
            .collect())
    }

    /// The `n` sources with the most debt and the most drops.
    pub fn top(&self, n: usize) -> Result<TopView> {
        let snap = self.snap();
        let t0 = Instant::now();
        let now = monotonic_ns();
        struct Row {
            key: BucketKey,
            fill: u64,
            debt_ns: u64,
            drops: u64,
            /// The counter slot of the rule that dropped `drops`.
            by: Option<u32>,
        }
        let mut rows = Vec::new();
        // Each bucket judged at the clock read just after its batch of
        // slots was copied (see `MapReader::for_each_bucket_read`): a
        // clock older than the copy would count the walk (a quarter of a
        // second over a 1M-slot table) as debt.
        self.reader.for_each_bucket_read(|k, b, read_ns, by| {
            rows.push(Row {
                key: *k,
                fill: b.fill_q16(read_ns),
                debt_ns: b.shown_debt_ns(read_ns),
                drops: b.drops(),
                by,
            })
        })?;
        let live = rows.len() as u64;
        let idle = rows.iter().filter(|r| r.debt_ns == 0).count() as u64;
        let read_ms = t0.elapsed().as_secs_f64() * 1e3;
        let entry = |r: &Row| {
            let rule = rule_for(&snap, &r.key);
            // A set's entry more specific than that rule charges the
            // bucket (police and monitor sets have buckets).
            let set = (r.key.class == 0 && !snap.sets.is_empty())
                .then(|| set_over(&snap, key_addr(&r.key)))
                .flatten()
                .filter(|(n, _)| rule.as_ref().is_none_or(|k| n.prefix_len() > k.net.prefix_len()));
            let label = match set {
                Some((n, s)) => format!("{} ({n})", s.view.prefix),
                None => rule.as_ref().map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            };
            TopEntry {
                source: bucket_source(&r.key),
                dropped_by: dropped_by(
                    &snap,
                    &r.key,
                    r.drops,
                    r.by,
                    match set {
                        Some((_, s)) => Some(s.slot),
                        None => rule.as_ref().and_then(|k| snap.rules.get(k)).map(|row| row.slot),
                    },
                ),
                rule: label,
                class: rule.as_ref().map(|n| n.class().to_string()).unwrap_or_else(|| "-".into()),
                debt_ns: r.debt_ns,
                fill: r.fill as f64 / 65536.0,
                drops: r.drops,
                drops_margin: sampled_margin(r.drops),
                action: match set {
                    Some((_, s)) => s.view.action.clone(),
                    None => {
                        rule.and_then(|k| snap.rules.get(&k)).map(|row| row.spec.action.to_string()).unwrap_or_default()
                    }
                },
            }
        };
        let mut pick = |key: &dyn Fn(&Row) -> (u64, u64)| -> Vec<TopEntry> {
            let k = n.min(rows.len());
            if k == 0 {
                return vec![];
            }
            rows.select_nth_unstable_by(k - 1, |a, b| key(b).cmp(&key(a)));
            let mut top: Vec<&Row> = rows[..k].iter().filter(|r| key(r) != (0, 0)).collect();
            top.sort_by_key(|r| std::cmp::Reverse(key(r)));
            top.into_iter().map(entry).collect()
        };
        let by_debt = pick(&|r| (r.fill, r.debt_ns));
        let by_drops = pick(&|r| (r.drops, r.fill));
        let mut bans = self.bans()?;
        let bans_total = bans.len();
        bans.truncate(n);
        let not_attached = not_attached(&snap);
        Ok(TopView { time_ns: now, live, idle, read_ms, by_debt, by_drops, bans, bans_total, not_attached })
    }

    /// `policer inspect ADDR [--proto … --dport … …]`: the rule the
    /// program gives a frame from `addr` (read from its own maps: the
    /// tries or the fast path, then the class choice of
    /// `policer_common::class::select`), and that rule's bucket. Without
    /// frame fields the frame matches no class (the prefix's fallback), and
    /// every bucket the source has is listed beside. `covering` lists
    /// everything over the source, which of it applies and why.
    pub fn inspect(&self, addr: IpAddr, frame: &InspectFrame) -> Result<InspectView> {
        let snap = self.snap();
        let auto: Vec<(BucketKey, BanView)> =
            self.auto_bans(&self.ban_ls()?)?.into_iter().filter(|(k, _)| key_covers(k, addr)).collect();
        let sets = set_lists(&snap);
        let resolver = Resolver::new(&snap.rules, &sets, &snap.protect);
        let covers = resolver.covering(addr);
        let answer = resolver.answer(addr, &covers, None);
        let (mut v, applied) = self.judge(&snap, addr, frame, &auto, &covers, &answer)?;
        v.covering = self.covering(&snap, (&resolver, &covers), addr, !frame.is_empty(), &applied, auto)?;
        v.not_attached = not_attached(&snap);
        // SYN cookies: whether the source proved its address (only said
        // while a rule has them).
        if snap.rules.values().any(|r| r.spec.syn().is_some()) {
            v.syn_verified = self.reader.syn_verified(addr)?;
        }
        Ok(v)
    }

    /// [`Views::inspect`] but `covering`: the view, and what the program
    /// applies (`covers` and `answer`: the resolver's, which decides a
    /// manual ban; the rest is read from the program's maps).
    fn judge(
        &self,
        snap: &Snapshot,
        addr: IpAddr,
        frame: &InspectFrame,
        auto: &[(BucketKey, BanView)],
        covers: &[Cover<'_, RuleKey>],
        answer: &Answer<'_, RuleKey>,
    ) -> Result<(InspectView, InspectApplied)> {
        let now = monotonic_ns();
        let mut v = InspectView {
            time_ns: now,
            address: addr.to_string(),
            now: "pass".into(),
            verdict: "pass".into(),
            ..Default::default()
        };
        let l4 = frame_l4(addr, frame)?;
        if frame.is_empty() {
            v.buckets = self.buckets_of(snap, addr)?;
        }
        // The longest protected prefix over the source: it passes its
        // sources over any ban (`Protect::apply`).
        let protected = covers.iter().find_map(|c| if let Cover::Protect(p) = c { Some(*p) } else { None });
        // A manual ban over it overrides every rule and set entry under
        // the ban's prefix.
        if let By::Ban(e) = answer.by {
            return self.judge_manual_ban(v, e.key);
        }
        // The program's own choice, from its maps.
        let Some((rule, action)) = self.program_choice(addr, l4)? else {
            return Ok((v, InspectApplied::Rule { slot: None, banned: None }));
        };
        // The protected prefix's own value (`protect::protected_rule`:
        // counter slot 0, which no rule owns).
        if let Some(p) = protected
            && rule.counter_slot == 0
        {
            v.rule = Some(format!("protect {p}"));
            v.class = Some("-".into());
            v.action = Some(action.to_string());
            v.next_admit_ns = Some(0);
            return Ok((v, InspectApplied::Protect(p)));
        }
        let (label, class, spec) = rule_of_slot(snap, addr, rule.counter_slot);
        v.rule = Some(label);
        v.class = Some(class);
        v.action = Some(action.to_string());
        v.total_rate = spec.and_then(|s| s.total()).map(|(r, _)| r.to_string());
        v.global = spec.and_then(|s| s.global()).map(str::to_string);
        let key = rule_bucket_key(addr, &rule);
        let mut applied = InspectApplied::Rule { slot: Some(rule.counter_slot), banned: None };
        v.key = Some(bucket_source(&key));
        match action {
            Action::Allow => {
                v.next_admit_ns = Some(0);
                return Ok((v, applied));
            }
            Action::Deny => {
                v.now = "drop".into();
                v.verdict = "drop".into();
                return Ok((v, applied));
            }
            Action::Police | Action::Monitor => {}
        }
        let refusal = if action == Action::Police { "drop" } else { "would drop" };
        // An automatic ban of its bucket key: dropped until it ends.
        if spec.is_none_or(|s| s.auto_ban().is_some())
            && let Some((_, b)) = auto.iter().find(|(k, _)| *k == key)
        {
            v.next_admit_ns = Some((b.left_seconds * 1e9) as u64);
            v.ban = Some(b.clone());
            v.now = if action == Action::Police { "drop" } else { "pass" }.into();
            v.verdict = refusal.into();
            applied = InspectApplied::Rule { slot: Some(rule.counter_slot), banned: Some(key) };
            return Ok((v, applied));
        }
        // Byte mode: a full-size frame unless told (a 64-byte one is
        // admitted long before the frames a flow really sends).
        v.frame_bytes = if rule.byte_cost != 0 { frame.bytes.unwrap_or(FULL_FRAME_BYTES) } else { 0 };
        let refused = self.judge_bucket(&mut v, &rule, &key)?;
        v.now = if refused && action == Action::Police { "drop" } else { "pass" }.into();
        v.verdict = if refused { refusal } else { "pass" }.into();
        Ok((v, applied))
    }

    /// The view of a source under the manual ban of key `k`: dropped, over
    /// every rule and set entry under the ban's prefix.
    fn judge_manual_ban(&self, mut v: InspectView, k: &RuleKey) -> Result<(InspectView, InspectApplied)> {
        let net = k.net.to_string();
        v.ban = self.bans()?.into_iter().find(|b| b.origin == "manual" && b.prefix == net);
        v.rule = Some(k.to_string());
        v.action = Some("deny".into());
        v.now = "drop".into();
        v.verdict = "drop".into();
        Ok((v, InspectApplied::Ban(k.net)))
    }

    /// The program's own choice for a frame from `addr` (`l4`: its fields,
    /// if given), from its maps: the prefix's rule, or the class of it that
    /// takes the frame, and its action; none when no rule applies.
    fn program_choice(&self, addr: IpAddr, l4: Option<FrameL4>) -> Result<Option<(Rule, Action)>> {
        let Some(prefix_rule) = self.reader.prefix_rule(addr)? else {
            return Ok(None);
        };
        let rule = match l4 {
            Some(f) => {
                let filter = self.reader.class_filter(prefix_rule.classes)?;
                let list = match prefix_rule.classes {
                    0 => None,
                    g => self.reader.class_list(policer_common::class::index_key(g, f.proto, f.dport))?,
                };
                let mut l = Fetched { frame: f, filter: filter.as_ref(), list: list.as_ref() };
                policer_common::class::select(&prefix_rule, f.proto, &mut l).copied().unwrap_or(prefix_rule)
            }
            None => prefix_rule,
        };
        if rule.action == policer_common::ACTION_NONE {
            return Ok(None);
        }
        Ok(Action::from_u32(rule.action).map(|action| (rule, action)))
    }

    /// A police or monitor rule's bucket of `key` as the program reads it
    /// for the frame (with no bucket, the recall, then the rule's
    /// new-source limiter), into `v`: whether the frame is refused now.
    fn judge_bucket(&self, v: &mut InspectView, rule: &Rule, key: &BucketKey) -> Result<bool> {
        let bucket = self.reader.bucket(key)?;
        // The clock after the copy (see `top`).
        let now = monotonic_ns();
        v.time_ns = now;
        v.has_bucket = bucket.is_some();
        if let Some(b) = &bucket {
            v.debt_ns = b.shown_debt_ns(now);
            v.fill = b.fill_q16(now) as f64 / 65536.0;
            v.drops = b.drops();
            v.drops_margin = sampled_margin(v.drops);
        }
        // No bucket: the recall (policer_common::recall) decides before the
        // limiter. A recalled debt is judged as a bucket of that debt.
        let mut resumed = None;
        if bucket.is_none() {
            match self.reader.recalled(key, now)? {
                Some(debt) => {
                    v.new_source = Some("recalled".into());
                    let resumed_bucket = rule.bucket(rule.resumed_tat(now, debt));
                    v.debt_ns = resumed_bucket.shown_debt_ns(now);
                    v.fill = resumed_bucket.fill_q16(now) as f64 / 65536.0;
                    resumed = Some(resumed_bucket);
                }
                None => {
                    let ns = self.reader.new_sources(rule.counter_slot)?.unwrap_or_default();
                    let open = ns.enabled == 0 || ns.limiter().admit(ns.tat, now, 0).is_some();
                    v.new_source = Some(if open { "accepted" } else { "limited" }.into());
                }
            }
        }
        let wait = rule.wait_ns(bucket.as_ref().or(resumed.as_ref()), now, v.frame_bytes.max(64));
        v.next_admit_ns = (wait != u64::MAX).then_some(wait);
        Ok(wait != 0 || v.new_source.as_deref() == Some("limited"))
    }

    /// Everything over `addr`, most specific first, each saying whether
    /// the program applies it (`applied`, read from its maps) and why, or
    /// why not: a protected prefix over everything, then a manual ban over
    /// the rules and sets under it, then the longest prefix, a shared set
    /// entry's value being its set of highest precedence, then among the
    /// prefix's classes the frame's. `framed`: frame options were given.
    fn covering(
        &self,
        snap: &Snapshot,
        (resolver, covers): (&Resolver<'_, super::Rules>, &[Cover<'_, RuleKey>]),
        addr: IpAddr,
        framed: bool,
        applied: &InspectApplied,
        auto: Vec<(BucketKey, BanView)>,
    ) -> Result<Vec<InspectCover>> {
        let cands = self.candidates(snap, covers, addr, auto)?;
        let weighing = Weighing::new(snap, resolver, &cands, applied, framed);
        Ok(cands.iter().map(|c| weighing.cover(c)).collect())
    }

    /// What `covering` weighs: the resolver's `covers` over `addr` and the
    /// automatic bans of its buckets (`auto`), most specific first; at one
    /// prefix, in the order the program weighs them.
    fn candidates(
        &self,
        snap: &Snapshot,
        covers: &[Cover<'_, RuleKey>],
        addr: IpAddr,
        auto: Vec<(BucketKey, BanView)>,
    ) -> Result<Vec<Cand>> {
        let mut cands: Vec<Cand> = Vec::new();
        let manual = if covers.iter().any(|c| c.kind() == resolve::Kind::Ban) { self.bans()? } else { vec![] };
        for c in covers {
            match c {
                Cover::Protect(p) => {
                    cands.push(Cand::new(CoverKind::Protect, *p, format!("protect {p}"), "allow".into()))
                }
                Cover::Ban(e) | Cover::Rule(e) => {
                    let (k, Some(r)) = (e.key, snap.rules.get(e.key)) else { continue };
                    let kind = if k.ban { CoverKind::Ban } else { CoverKind::Rule };
                    let mut c = Cand::new(kind, k.net, k.to_string(), r.spec.action.to_string());
                    c.slot = Some(r.slot);
                    if k.ban {
                        let net = k.net.to_string();
                        c.cover.action = "deny".into();
                        c.cover.ban = manual.iter().find(|b| b.origin == "manual" && b.prefix == net).cloned();
                    } else {
                        c.cover.class = Some(k.class().to_string());
                        c.class_rule = !k.class().is_none();
                        c.stops = !e.inherit;
                        c.bucket = self.has_bucket(addr, &r.spec, r.slot)?;
                    }
                    cands.push(c);
                }
                Cover::Set { set, entry: n } => {
                    let s = &snap.sets[*set];
                    let spec = if addr.is_ipv4() { &s.spec4 } else { &s.spec6 };
                    let mut c = Cand::new(CoverKind::Set, *n, s.entry_name(n), s.view.action.clone());
                    c.slot = Some(s.slot);
                    c.bucket = self.has_bucket(addr, spec, s.slot)?;
                    cands.push(c);
                }
            }
        }
        for (k, b) in auto {
            let net = ipnet::IpNet::new(key_addr(&k), k.key_len as u8).unwrap_or_else(|_| ipnet::IpNet::from(addr));
            let mut c = Cand::new(CoverKind::AutoBan, net, b.rule.clone().unwrap_or_else(|| "-".into()), "deny".into());
            c.cover.prefix = b.prefix.clone();
            c.cover.ban = Some(b);
            c.key = Some(k);
            cands.push(c);
        }
        // Most specific first; at one prefix, in the order the program
        // weighs them.
        cands.sort_by_key(|c| (std::cmp::Reverse(c.net.prefix_len()), c.kind));
        Ok(cands)
    }

    /// For a police or monitor rule (or set): whether `addr` has a bucket
    /// of it.
    fn has_bucket(&self, addr: IpAddr, spec: &RuleSpec, slot: u32) -> Result<Option<bool>> {
        if !spec.action.polices() {
            return Ok(None);
        }
        let Ok(rule) = spec.kernel(slot) else { return Ok(None) };
        let mut key = rule_bucket_key(addr, &rule);
        if !spec.class().is_none() {
            key.class = slot;
        }
        Ok(Some(self.reader.bucket(&key)?.is_some()))
    }

    /// Every bucket `addr` has: its class-less bucket and one per class of
    /// the prefixes over it (each class's buckets are per source and
    /// class), read at the clock after each copy. A bucket two rules or
    /// sets could charge is named by the one that does: the longest
    /// prefix, then the set of highest precedence.
    fn buckets_of(&self, snap: &Snapshot, addr: IpAddr) -> Result<Vec<TopEntry>> {
        let mut out = Vec::new();
        // (label, class, spec, slot, which names a shared bucket first).
        type Row<'a> = (String, String, &'a RuleSpec, u32, (u8, u8, std::cmp::Reverse<&'a str>));
        let mut rows: Vec<Row> = snap
            .rules
            .iter()
            .filter(|(k, r)| !k.ban && k.net.contains(&addr) && r.spec.action.polices())
            .map(|(k, r)| {
                (k.to_string(), k.class().to_string(), &*r.spec, r.slot, (k.net.prefix_len(), 0, std::cmp::Reverse("")))
            })
            .collect();
        for s in &snap.sets {
            if let Some(n) = s.entry_for(addr) {
                let spec = if addr.is_ipv4() { &s.spec4 } else { &s.spec6 };
                if spec.action.polices() {
                    let (rank, name) = set_precedence(s);
                    rows.push((
                        format!("{} ({n})", s.view.prefix),
                        "-".into(),
                        spec,
                        s.slot,
                        (n.prefix_len(), rank, name),
                    ));
                }
            }
        }
        rows.sort_by(|a, b| b.4.cmp(&a.4));
        let mut seen = std::collections::BTreeSet::new();
        for (label, class, spec, slot, _) in rows {
            let Ok(rule) = spec.kernel(slot) else { continue };
            let mut key = rule_bucket_key(addr, &rule);
            // A class's buckets are per source and class (its slot); the
            // compiler sets the flag the program reads, not `kernel`.
            if !spec.class().is_none() {
                key.class = slot;
            }
            if !seen.insert((key.addr, key.key_len, key.class)) {
                continue;
            }
            if let Some((b, by)) = self.reader.bucket_dropped_by(&key)? {
                let at = monotonic_ns();
                out.push(TopEntry {
                    source: bucket_source(&key),
                    dropped_by: dropped_by(snap, &key, b.drops(), by, Some(slot)),
                    rule: label,
                    class,
                    debt_ns: b.shown_debt_ns(at),
                    fill: b.fill_q16(at) as f64 / 65536.0,
                    drops: b.drops(),
                    drops_margin: sampled_margin(b.drops()),
                    action: spec.action.to_string(),
                });
            }
        }
        Ok(out)
    }

    /// (live buckets, buckets evicted so far): a count at most
    /// [`LIVE_COUNT_MAX_AGE`] old. `created` is the buckets-created counter
    /// read just before. Concurrent scrapes wait for one count and share it.
    fn live_buckets(&self, created: u64) -> (u64, u64) {
        let mut guard = self.live_count.lock().unwrap_or_else(|p| p.into_inner());
        let prev = *guard;
        if let Some((at, live, evicted)) = prev
            && at.elapsed() < LIVE_COUNT_MAX_AGE
        {
            return (live, evicted);
        }
        let mut live = 0;
        let _ = self.reader.for_each_bucket(|_, _| live += 1);
        // Evicted = created - live. Buckets made while the table was read
        // can make one count low; the counter never goes back.
        let evicted = created.saturating_sub(live).max(prev.map_or(0, |p| p.2));
        *guard = Some((Instant::now(), live, evicted));
        (live, evicted)
    }

    /// The `/metrics` exposition. Scrapes share renders through
    /// `serve::render::Shared`: this is one render.
    pub fn metrics(&self) -> Result<bytes::Bytes> {
        let s = self.stats()?;
        let (live, evicted) = self.live_buckets(s.table.created);
        let attached: Vec<(String, bool)> =
            self.health().interfaces.into_iter().map(|i| (i.name, i.attached)).collect();
        Ok(bytes::Bytes::from(crate::metrics::render(&s, live, evicted, &attached)))
    }

    /// `/healthz`: our program attached to every interface we police.
    pub fn health(&self) -> Health {
        let snap = self.snap();
        let interfaces: Vec<IfaceHealth> = snap
            .ifaces
            .iter()
            .map(|i| match i.join.as_ref().map(|j| j.held()) {
                // Member mode: the root's slot is policer's hook.
                Some(Ok(held)) => IfaceHealth {
                    name: i.name.clone(),
                    attached: held == Some(snap.program_id),
                    error: (held != Some(snap.program_id)).then(|| match held {
                        Some(id) => format!(
                            "another program ({id}) is in {}",
                            i.join.as_ref().map(|j| j.describe()).unwrap_or_default()
                        ),
                        None => format!("{} is empty", i.join.as_ref().map(|j| j.describe()).unwrap_or_default()),
                    }),
                },
                Some(Err(e)) => IfaceHealth { name: i.name.clone(), attached: false, error: Some(e.to_string()) },
                None => match netlink::query(i.index) {
                    Ok(Some(st)) => IfaceHealth {
                        name: i.name.clone(),
                        attached: st.prog_id == snap.program_id,
                        error: (st.prog_id != snap.program_id)
                            .then(|| format!("another XDP program ({}) is attached", st.prog_id)),
                    },
                    Ok(None) => IfaceHealth {
                        name: i.name.clone(),
                        attached: false,
                        error: Some("no XDP program is attached".into()),
                    },
                    Err(e) => IfaceHealth { name: i.name.clone(), attached: false, error: Some(e.to_string()) },
                },
            })
            .collect();
        let healthy = !interfaces.is_empty() && interfaces.iter().all(|i| i.attached);
        Health { healthy, program_id: snap.program_id, interfaces }
    }
}

/// The rows of `ban ls` ([`Views::ban_ls`]): made one at a time, so the
/// connection writes each as it comes and holds no list of them.
pub struct BanLs {
    snap: Arc<Snapshot>,
    /// Frames each rule slot dropped.
    dropped: Vec<u64>,
    /// The rules by slot (an automatic ban's rule).
    rules: std::collections::HashMap<u32, String>,
}

impl BanLs {
    /// The manual bans, by prefix.
    pub fn manual(&self) -> impl Iterator<Item = BanView> + '_ {
        let now_ms = crate::duration::unix_ms();
        self.snap.rules.iter().filter(|(k, _)| k.ban).map(move |(k, r)| {
            let expires = r.spec.expires.unwrap_or(now_ms);
            BanView {
                prefix: k.net.to_string(),
                origin: "manual".into(),
                rule: None,
                reason: r.spec.ban().cloned().flatten(),
                expires: crate::duration::rfc3339(expires),
                left_seconds: expires.saturating_sub(now_ms) as f64 / 1000.0,
                dropped_pkts: self.dropped.get(r.slot as usize).copied().unwrap_or(0),
                // A manual ban's drops are its rule's counter: exact.
                drops_margin: 0,
                count: None,
                length_seconds: None,
            }
        })
    }

    /// An entry of the ban store as a row, if the ban is in force at
    /// `now_ns` (`now_ms` the same instant, Unix ms).
    pub fn auto(
        &self,
        k: &policer_common::BucketKeyV6,
        b: &policer_common::ban::Ban,
        now_ms: u64,
        now_ns: u64,
    ) -> Option<BanView> {
        if b.end_ns <= now_ns {
            return None;
        }
        let left_ns = b.end_ns - now_ns;
        Some(BanView {
            prefix: super::bans::key_text(k),
            origin: "auto".into(),
            rule: self.rules.get(&b.rule_slot).cloned(),
            reason: None,
            expires: crate::duration::rfc3339(now_ms + left_ns / 1_000_000),
            left_seconds: left_ns as f64 / 1e9,
            dropped_pkts: b.drops,
            drops_margin: sampled_margin(b.drops),
            count: Some(b.count),
            length_seconds: Some(b.len_ns as f64 / 1e9),
        })
    }
}

/// What the program applies to the frame `inspect` judges.
#[derive(Clone, Copy, Debug)]
enum InspectApplied {
    /// A protected prefix's own allow.
    Protect(ipnet::IpNet),
    /// A manual ban of this prefix.
    Ban(ipnet::IpNet),
    /// The rule or set of this counter slot (none: no rule), and the
    /// automatic ban of its bucket when one refuses the frame.
    Rule { slot: Option<u32>, banned: Option<BucketKey> },
}

/// The kinds of things over a source, in the order the program weighs
/// them at one prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum CoverKind {
    Protect,
    Ban,
    AutoBan,
    Set,
    Rule,
}

impl CoverKind {
    fn name(self) -> &'static str {
        match self {
            CoverKind::Protect => "protect",
            CoverKind::Ban => "ban",
            CoverKind::AutoBan => "auto ban",
            CoverKind::Set => "set",
            CoverKind::Rule => "rule",
        }
    }
}

/// One thing over the source, as `covering` weighs it.
struct Cand {
    kind: CoverKind,
    net: ipnet::IpNet,
    slot: Option<u32>,
    /// An automatic ban's bucket key.
    key: Option<BucketKey>,
    class_rule: bool,
    /// A rule of its prefix says `inherit = false`.
    stops: bool,
    bucket: Option<bool>,
    cover: InspectCover,
}

impl Cand {
    fn new(kind: CoverKind, net: ipnet::IpNet, rule: String, action: String) -> Cand {
        Cand {
            kind,
            net,
            slot: None,
            key: None,
            class_rule: false,
            stops: false,
            bucket: None,
            cover: InspectCover {
                kind: kind.name().into(),
                prefix: net.to_string(),
                rule,
                action,
                ..Default::default()
            },
        }
    }

    /// Whether the program applies it: `applied_net` is the prefix of the
    /// rule or set entry that applies (a set's shorter entries do not).
    fn applies(&self, applied: &InspectApplied, applied_net: Option<ipnet::IpNet>) -> bool {
        match (self.kind, applied) {
            (CoverKind::Protect, InspectApplied::Protect(p)) | (CoverKind::Ban, InspectApplied::Ban(p)) => {
                *p == self.net
            }
            (CoverKind::Rule | CoverKind::Set, InspectApplied::Rule { slot: Some(s), .. }) => {
                self.slot == Some(*s) && applied_net.is_none_or(|n| n == self.net)
            }
            (CoverKind::AutoBan, InspectApplied::Rule { banned: Some(k), .. }) => self.key == Some(*k),
            _ => false,
        }
    }
}

/// What `covering` weighs each thing over the source against: what the
/// program applies, and the prefixes over the source.
struct Weighing<'a> {
    snap: &'a Snapshot,
    resolver: &'a Resolver<'a, super::Rules>,
    /// Everything over the source, most specific first.
    cands: &'a [Cand],
    applied: &'a InspectApplied,
    /// Frame options were given.
    framed: bool,
    /// The longest prefix the tries hold over the source, and the longest
    /// rule's (where classes are looked for).
    longest: Option<ipnet::IpNet>,
    longest_rule: Option<ipnet::IpNet>,
    /// The prefix of the rule or set entry that applies, and its label.
    applied_net: Option<ipnet::IpNet>,
    applied_label: Option<String>,
}

impl<'a> Weighing<'a> {
    /// The weighing of `cands` (most specific first) against `applied`;
    /// `framed`: frame options were given.
    fn new(
        snap: &'a Snapshot,
        resolver: &'a Resolver<'a, super::Rules>,
        cands: &'a [Cand],
        applied: &'a InspectApplied,
        framed: bool,
    ) -> Self {
        let longest = cands.iter().filter(|c| c.kind != CoverKind::AutoBan).map(|c| c.net).next();
        let longest_rule = cands.iter().filter(|c| c.kind == CoverKind::Rule).map(|c| c.net).next();
        let applied_net: Option<ipnet::IpNet> = match applied {
            InspectApplied::Protect(p) | InspectApplied::Ban(p) => Some(*p),
            InspectApplied::Rule { slot: Some(slot), .. } => cands
                .iter()
                .find(|c| matches!(c.kind, CoverKind::Rule | CoverKind::Set) && c.slot == Some(*slot))
                .map(|c| c.net),
            InspectApplied::Rule { slot: None, .. } => None,
        };
        let applied_label = cands
            .iter()
            .find(|c| {
                Some(c.net) == applied_net
                    && matches!(c.kind, CoverKind::Rule | CoverKind::Set)
                    && c.applies(applied, None)
            })
            .map(|c| c.cover.rule.clone());
        Weighing { snap, resolver, cands, applied, framed, longest, longest_rule, applied_net, applied_label }
    }

    /// `c` as `covering` lists it: whether the program applies it, and why
    /// (or why not).
    fn cover(&self, c: &Cand) -> InspectCover {
        let mut cover = c.cover.clone();
        cover.has_bucket = c.bucket;
        cover.applies = c.applies(self.applied, self.applied_net);
        cover.why = self.why(c, cover.applies);
        cover
    }

    /// Why the program applies `c` (`applies`), or why not.
    fn why(&self, c: &Cand, applies: bool) -> String {
        const RANK: &str = "deny > police > monitor > allow, then the name that sorts first";
        match (c.kind, self.applied) {
            (CoverKind::Protect, _) if applies => {
                "a protected prefix (protect in [daemon]): its sources pass whatever rule, set or ban covers them"
                    .into()
            }
            (_, InspectApplied::Protect(p)) => {
                format!(
                    "the protected prefix {p} (protect in [daemon]) passes every source in it, over any rule, set or ban"
                )
            }
            (CoverKind::Ban, _) if applies => {
                "a manual ban: drops every source in it, over the rules and set entries under it".into()
            }
            (CoverKind::AutoBan, InspectApplied::Ban(b)) => {
                format!("the manual ban of {b} drops the source before any bucket is charged")
            }
            (_, InspectApplied::Ban(b)) if b.contains(&c.net) => {
                format!("the manual ban of {b} drops every source in it, over the rules and set entries under it")
            }
            (_, InspectApplied::Ban(b)) => more_specific(*b),
            (CoverKind::AutoBan, _) if applies => "bans the bucket this frame charges: refused until it ends".into(),
            (CoverKind::AutoBan, InspectApplied::Rule { .. }) => self.why_auto_ban_elsewhere(c),
            (CoverKind::Set, _) if applies => match self.winner(c) {
                Some(w) if self.resolver.sets().iter().filter(|s| s.holds(&c.net)).count() > 1 => {
                    format!(
                        "the longest prefix over the source; {} is in several sets and {} wins ({RANK})",
                        c.net, w.view.prefix
                    )
                }
                _ => "the longest prefix over the source".into(),
            },
            (_, _) if applies && c.class_rule => "the frame is of its class".into(),
            (_, _) if applies => match self.longest_rule {
                Some(l) if l != c.net && self.longest == Some(l) => {
                    format!("the frame matches no class of {l}, so it falls to this class-less rule")
                }
                _ => "the longest prefix over the source".into(),
            },
            (CoverKind::Set, InspectApplied::Rule { .. }) if self.applied_net == Some(c.net) => match self.winner(c) {
                Some(w) => format!("{} is in several sets: {} wins ({RANK})", c.net, w.view.prefix),
                None => "another set holds this prefix".into(),
            },
            (CoverKind::Rule, InspectApplied::Rule { .. }) if c.class_rule => self.why_class_not_taken(c),
            (CoverKind::Rule, InspectApplied::Rule { .. })
                if self.applied_net.is_some_and(|a| a.prefix_len() < c.net.prefix_len()) =>
            {
                format!(
                    "the frame is of a class of {}, which applies under this prefix too (it defines no class of \
                     that match; --no-inherit stops it)",
                    self.applied_net.map(|a| a.to_string()).unwrap_or_default()
                )
            }
            (_, InspectApplied::Rule { .. }) => match self.applied_net.or(self.longest) {
                Some(a) if a.prefix_len() > c.net.prefix_len() => more_specific(a),
                _ => "not in force for this source".into(),
            },
        }
    }

    /// The set of highest precedence among those holding `c.net`.
    fn winner(&self, c: &Cand) -> Option<&'a SetRow> {
        self.resolver.set_winner(&c.net).map(|i| &self.snap.sets[i])
    }

    /// Why an automatic ban `c` of another bucket of the source does not
    /// refuse this frame.
    fn why_auto_ban_elsewhere(&self, c: &Cand) -> String {
        let of = c.cover.ban.as_ref().and_then(|b| b.rule.clone()).unwrap_or_else(|| "another rule".into());
        match (c.key.map_or(0, |k| k.class), &self.applied_label) {
            (1.., _) if !self.framed => format!(
                "bans the source's bucket of {of}, a class: only frames of that class (give --proto … to \
                 judge one)"
            ),
            (_, Some(a)) => format!("bans the source's bucket of {of}; this frame charges {a}'s"),
            (_, None) => format!("bans the source's bucket of {of}; this frame charges no bucket"),
        }
    }

    /// Why the class rule `c` does not take this frame.
    fn why_class_not_taken(&self, c: &Cand) -> String {
        // The classes of the longest rule prefix, then of each shorter
        // one up to a prefix that says `inherit = false`.
        let stop = self
            .cands
            .iter()
            .filter(|o| o.kind == CoverKind::Rule && o.stops && o.net.prefix_len() > c.net.prefix_len())
            .map(|o| o.net)
            .next_back();
        match (self.longest, stop) {
            (Some(l), _) if self.longest_rule != Some(l) && l.prefix_len() > c.net.prefix_len() => more_specific(l),
            (_, Some(s)) => format!("{s} says inherit = false: a shorter prefix's classes do not reach past it"),
            _ if self.framed => "the frame is not of its class, or a more specific class takes it".into(),
            _ => {
                let class = c.cover.class.clone().unwrap_or_default();
                format!("only frames of its class ({class}): give --proto … to judge one")
            }
        }
    }
}

/// Why a shorter prefix loses to `a`, a more specific one over the source.
fn more_specific(a: ipnet::IpNet) -> String {
    format!("{a} is more specific (the longest prefix wins)")
}

/// The snapshot's sets as the resolver takes them, in its order (a
/// [`Cover::Set`]'s index is the snapshot's).
fn set_lists(snap: &Snapshot) -> Vec<SetList> {
    let value = |spec: &RuleSpec, slot| spec.kernel(0).map_or(protected_rule(), |r| r.with_counter_slot(slot));
    snap.sets
        .iter()
        .map(|s| SetList {
            name: s.view.set.clone().unwrap_or_else(|| s.view.prefix.clone()),
            action: s.spec4.action,
            v4: value(&s.spec4, s.slot),
            v6: value(&s.spec6, s.slot),
            entries: s.entries.clone(),
        })
        .collect()
}

/// Whether the bucket key `k` is `addr`'s (its family, and `addr` masked
/// to its length).
fn key_covers(k: &BucketKey, addr: IpAddr) -> bool {
    let mut masked = bucket_key(addr, k.key_len);
    masked.class = k.class;
    masked == *k
}

/// A set's precedence where several hold one prefix (`resolve::precedence`).
fn set_precedence(s: &SetRow) -> (u8, std::cmp::Reverse<&str>) {
    crate::resolve::precedence(s.spec4.action, s.view.set.as_deref().unwrap_or(&s.view.prefix))
}

/// The set entry the tries hold over `addr` among the sets: the longest,
/// and of the sets holding it the one of highest precedence (its value is
/// the tries').
fn set_over(snap: &Snapshot, addr: IpAddr) -> Option<(ipnet::IpNet, &SetRow)> {
    snap.sets
        .iter()
        .filter_map(|s| s.entry_for(addr).map(|n| (n, s)))
        .max_by(|(n, a), (m, b)| (n.prefix_len(), set_precedence(a)).cmp(&(m.prefix_len(), set_precedence(b))))
}

/// The rule that charges a bucket now: a class's (by its counter slot),
/// or the longest class-less prefix its source falls under.
fn rule_for(snap: &Snapshot, k: &BucketKey) -> Option<RuleKey> {
    if k.class != 0 {
        return snap
            .rules
            .iter()
            .find(|(key, r)| !key.class().is_none() && r.slot == k.class)
            .map(|(key, _)| key.clone());
    }
    let addr = key_addr(k);
    snap.rules
        .keys()
        .filter(|key| key.class().is_none() && !key.ban && key.net.contains(&addr))
        .max_by_key(|key| key.net.prefix_len())
        .cloned()
}

/// The rule that dropped a bucket's `drops` (the counter slot `by` its drop
/// word names), when it is not the one of counter slot `now` (the rule
/// `top` shows the bucket under): the rule as `rule ls` names it, a set's
/// entry, or a rule removed since.
fn dropped_by(snap: &Snapshot, k: &BucketKey, drops: u64, by: Option<u32>, now: Option<u32>) -> Option<String> {
    let slot = by.filter(|&b| drops > 0 && Some(b) != now)?;
    Some(if snap.rules.values().any(|r| r.slot == slot) || snap.sets.iter().any(|s| s.slot == slot) {
        rule_of_slot(snap, key_addr(k), slot).0
    } else {
        format!("a rule removed since (counter slot {slot})")
    })
}

/// How far a per-source drop count (sampled, one drop in 64 counted as
/// 64: the program's `DROP_SAMPLE_SHIFT`) may be from the truth.
fn sampled_margin(n: u64) -> u64 {
    policer_common::table::drop_count_margin(n, policer_common::table::DROP_SAMPLE_SHIFT)
}

/// The interfaces whose hook lost the program, as `IFACE since TIME`.
fn not_attached(snap: &Snapshot) -> Vec<String> {
    snap.ifaces
        .iter()
        .filter_map(|i| i.lost_since.map(|t| format!("{} since {}", i.name, crate::duration::rfc3339(t))))
        .collect()
}

fn iface_stats(name: &str, ifindex: u32, c: &Counters) -> IfaceStats {
    IfaceStats {
        name: name.into(),
        ifindex,
        detached_since: None,
        counters: CountersView::from(&c.verdicts()),
        chain_handed_packets: 0,
        chain_empty_packets: 0,
        unmatched_packets: c.unmatched_pkts,
        non_ip_packets: c.non_ip_pkts,
        malformed_packets: c.malformed_pkts,
        fragment_packets: c.fragment_pkts,
        bucket_insert_failures: c.bucket_insert_failed,
        cas_retries: c.cas_retries,
        cas_exhausted: c.cas_exhausted,
        new_sources_limited: c.new_sources_limited,
        recall_known: c.recall_known,
        recall_debt_drops: c.recall_debt_drops,
        recall_stored: c.recall_stored,
        class_matched: c.class_matched,
        rates: None,
    }
}

fn key_addr(k: &BucketKey) -> IpAddr {
    if k.family == FAMILY_V4 {
        std::net::Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3]).into()
    } else {
        std::net::Ipv6Addr::from(k.addr).into()
    }
}

/// The bucket key of `addr` under a rule of `key_len` bits: the masked
/// address (as the program forms it).
fn bucket_key(addr: IpAddr, key_len: u32) -> BucketKey {
    let (mut bytes, family, full) = match addr {
        IpAddr::V4(a) => {
            let mut b = [0u8; 16];
            b[..4].copy_from_slice(&a.octets());
            (b, FAMILY_V4, 32)
        }
        IpAddr::V6(a) => (a.octets(), FAMILY_V6, 128),
    };
    let key_len = key_len.min(full);
    let mask = policer_common::bucket::prefix_mask(key_len);
    for (b, m) in bytes.iter_mut().zip(mask) {
        *b &= m;
    }
    BucketKey { addr: bytes, family, key_len, class: 0 }
}

/// A bucket's key as text: the address, or a prefix when sources are grouped.
fn bucket_source(k: &BucketKey) -> String {
    let a = key_addr(k);
    let full = if a.is_ipv4() { 32 } else { 128 };
    if k.key_len >= full { a.to_string() } else { format!("{a}/{}", k.key_len) }
}

/// The frame size `policer inspect` judges a byte-mode rule with unless
/// told: a full Ethernet payload, what bulk flows send.
const FULL_FRAME_BYTES: u32 = 1500;

/// The frame `inspect` judges, as the program reads it (`None`: no frame
/// fields given, the frame matches no class).
fn frame_l4(addr: IpAddr, f: &InspectFrame) -> Result<Option<FrameL4>> {
    use policer_common::class::{IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, PROTOS_WITH_PORTS, PROTOS_WITH_SPORTS};
    if let Some(b) = f.bytes
        && !(64..=policer_common::bucket::MAX_FRAME_LEN).contains(&b)
    {
        return Err(Error::Invalid(format!("--frame-bytes {b}: a frame is 64 to 65535 bytes")));
    }
    let g = InspectFrame { bytes: None, ..f.clone() };
    if g.is_empty() {
        return Ok(None);
    }
    let Some(proto) = f.proto.as_deref() else {
        return Err(Error::Invalid(
            "--dport, --sport, --tcp-flags, --icmp-type and --dst need --proto (the frame's protocol)".into(),
        ));
    };
    let proto = crate::classes::parse_proto(proto)?;
    if f.dport.is_some() && !PROTOS_WITH_PORTS.contains(&proto) {
        return Err(Error::Invalid("--dport needs a protocol with ports: --proto tcp, udp, sctp or udplite".into()));
    }
    if f.sport.is_some() && !PROTOS_WITH_SPORTS.contains(&proto) {
        return Err(Error::Invalid("--sport needs --proto tcp or udp".into()));
    }
    let tcp_flags = match f.tcp_flags.as_deref() {
        Some(t) if proto == IPPROTO_TCP => {
            let (mask, set) = crate::classes::parse_flags(t)?;
            if mask != set {
                return Err(Error::Invalid(format!(
                    "--tcp-flags '{t}': name the flags the frame has set ('!' is for rules)"
                )));
            }
            set
        }
        Some(_) => return Err(Error::Invalid("--tcp-flags needs --proto tcp".into())),
        None => 0,
    };
    if f.icmp_type.is_some() && !matches!(proto, IPPROTO_ICMP | IPPROTO_ICMPV6) {
        return Err(Error::Invalid("--icmp-type needs --proto icmp or icmpv6".into()));
    }
    let dst = match f.dst {
        Some(d) if d.is_ipv4() != addr.is_ipv4() => {
            return Err(Error::Invalid(format!("--dst {d}: not of the source's family ({addr})")));
        }
        Some(IpAddr::V4(d)) => policer_common::class::mapped_v4(d.octets()),
        Some(IpAddr::V6(d)) => d.octets(),
        // The program reads a destination from every frame; unnamed, it
        // is the unspecified address, which no --dst class holds.
        None if addr.is_ipv4() => policer_common::class::mapped_v4([0; 4]),
        None => [0; 16],
    };
    Ok(Some(FrameL4 {
        proto,
        has_l4: true,
        dport: f.dport.unwrap_or(0),
        sport: f.sport.unwrap_or(0),
        tcp_flags,
        icmp_type: f.icmp_type.unwrap_or(0),
        dst,
    }))
}

/// The class maps as the program read them for one frame (fetched before
/// the choice: the filter of the prefix's group, the index entry of the
/// frame's protocol and port).
struct Fetched<'a> {
    frame: FrameL4,
    filter: Option<&'a ClassFilter>,
    list: Option<&'a ClassList>,
}

impl<'a> ClassLookups<'a> for Fetched<'a> {
    fn l4(&mut self, proto: u8) -> FrameL4 {
        FrameL4 { proto, dst: [0; 16], ..self.frame }
    }

    fn filter(&mut self, _group: u32) -> Option<&'a ClassFilter> {
        self.filter
    }

    fn dst(&mut self) -> Option<[u8; 16]> {
        Some(self.frame.dst)
    }

    fn index(&mut self, _key: [u8; policer_common::class::INDEX_KEY_BYTES]) -> Option<&'a ClassList> {
        self.list
    }
}

/// The rule (or set) a counter slot belongs to: its label, its class and
/// its spec.
fn rule_of_slot(snap: &Snapshot, addr: IpAddr, slot: u32) -> (String, String, Option<&RuleSpec>) {
    if let Some((k, r)) = snap.rules.iter().find(|(_, r)| r.slot == slot) {
        return (k.to_string(), k.class().to_string(), Some(&r.spec));
    }
    if let Some(s) = snap.sets.iter().find(|s| s.slot == slot) {
        let label = match s.entry_for(addr) {
            Some(n) => s.entry_name(&n),
            None => s.view.prefix.clone(),
        };
        return (label, "-".into(), Some(if addr.is_ipv4() { &s.spec4 } else { &s.spec6 }));
    }
    // A default rule the program holds by itself.
    (format!("rule slot {slot}"), "-".into(), None)
}

/// The bucket a frame from `addr` charges under `rule`: its source masked
/// to the rule's key, and for a class's rule, the class (its slot).
fn rule_bucket_key(addr: IpAddr, rule: &Rule) -> BucketKey {
    let mut k = bucket_key(addr, rule.key_len);
    if rule.flags & policer_common::class::RULE_CLASS != 0 {
        k.class = rule.counter_slot;
    }
    k
}

#[cfg(test)]
mod tests {
    use policer_common::class::{IPPROTO_ICMP, IPPROTO_TCP, TCP_ACK, TCP_SYN, mapped_v4};

    use super::*;

    fn frame(f: impl FnOnce(&mut InspectFrame)) -> InspectFrame {
        let mut x = InspectFrame::default();
        f(&mut x);
        x
    }

    fn err(addr: &str, f: impl FnOnce(&mut InspectFrame)) -> String {
        frame_l4(addr.parse().unwrap(), &frame(f)).unwrap_err().to_string()
    }

    /// `inspect`'s frame options become the frame the program would read.
    #[test]
    fn frame_options_become_the_programs_frame() {
        let v4: IpAddr = "198.18.0.5".parse().unwrap();
        // None: no class matches; a length alone is no frame either.
        assert_eq!(frame_l4(v4, &InspectFrame::default()).unwrap(), None);
        assert_eq!(frame_l4(v4, &frame(|f| f.bytes = Some(1042))).unwrap(), None);
        let f = frame_l4(
            v4,
            &frame(|f| {
                f.proto = Some("udp".into());
                f.dport = Some(53);
                f.sport = Some(40_000);
            }),
        )
        .unwrap()
        .unwrap();
        assert_eq!((f.proto, f.dport, f.sport, f.tcp_flags, f.has_l4), (17, 53, 40_000, 0, true));
        // Unnamed, the destination is the unspecified address (no --dst
        // class holds it), mapped for IPv4 as the program reads it.
        assert_eq!(f.dst, mapped_v4([0; 4]));
        let f = frame_l4(
            v4,
            &frame(|f| {
                f.proto = Some("tcp".into());
                f.tcp_flags = Some("syn,ack".into());
                f.dst = Some("198.19.0.1".parse().unwrap());
            }),
        )
        .unwrap()
        .unwrap();
        assert_eq!((f.proto, f.tcp_flags, f.dst), (IPPROTO_TCP, TCP_SYN | TCP_ACK, mapped_v4([198, 19, 0, 1])));
        let f = frame_l4(
            v4,
            &frame(|f| {
                f.proto = Some("1".into());
                f.icmp_type = Some(8);
            }),
        )
        .unwrap()
        .unwrap();
        assert_eq!((f.proto, f.icmp_type), (IPPROTO_ICMP, 8));
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let f = frame_l4(
            v6,
            &frame(|f| {
                f.proto = Some("icmpv6".into());
                f.dst = Some("2001:db8::2".parse().unwrap());
            }),
        )
        .unwrap()
        .unwrap();
        assert_eq!(f.dst, "2001:db8::2".parse::<std::net::Ipv6Addr>().unwrap().octets());
        assert_eq!(frame_l4(v6, &frame(|f| f.proto = Some("udp".into()))).unwrap().unwrap().dst, [0; 16]);
    }

    /// Each bad combination is refused with what to give instead.
    #[test]
    fn bad_frame_options_are_refused_with_the_reason() {
        let a = "198.18.0.5";
        for (e, want) in [
            (err(a, |f| f.dport = Some(53)), "need --proto"),
            (err(a, |f| f.bytes = Some(63)), "--frame-bytes 63: a frame is 64 to 65535 bytes"),
            (err(a, |f| f.bytes = Some(65_536)), "--frame-bytes 65536"),
            (err(a, |f| f.proto = Some("nope".into())), "nope"),
            (
                err(a, |f| {
                    f.proto = Some("icmp".into());
                    f.dport = Some(53);
                }),
                "--dport needs a protocol with ports",
            ),
            (
                err(a, |f| {
                    f.proto = Some("sctp".into());
                    f.sport = Some(53);
                }),
                "--sport needs --proto tcp or udp",
            ),
            (err(a, |f| f.sport = Some(53)), "need --proto"),
            (
                err(a, |f| {
                    f.proto = Some("udp".into());
                    f.tcp_flags = Some("syn".into());
                }),
                "--tcp-flags needs --proto tcp",
            ),
            (
                err(a, |f| {
                    f.proto = Some("tcp".into());
                    f.tcp_flags = Some("syn,!ack".into());
                }),
                "name the flags the frame has set",
            ),
            (
                err(a, |f| {
                    f.proto = Some("tcp".into());
                    f.tcp_flags = Some("syn,bogus".into());
                }),
                "bogus",
            ),
            (
                err(a, |f| {
                    f.proto = Some("udp".into());
                    f.icmp_type = Some(8);
                }),
                "--icmp-type needs --proto icmp or icmpv6",
            ),
            (
                err(a, |f| {
                    f.proto = Some("udp".into());
                    f.dst = Some("2001:db8::1".parse().unwrap());
                }),
                "--dst 2001:db8::1: not of the source's family (198.18.0.5)",
            ),
        ] {
            assert!(e.contains(want), "{e:?} does not say {want:?}");
        }
    }
}
