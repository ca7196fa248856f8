//! Bans and expiries on the owner thread: `policer ban` and `unban`, the
//! periodic tick that removes expired rules and bans, and the log of
//! automatic bans (which the program starts itself, in the `BANS` store).
//!
//! A manual ban is an entry of the rule set ([`RuleKey::ban`]): it takes a
//! counter slot, is written to the config file with its absolute expiry,
//! and is compiled into the tries as a deny that overrides every rule under
//! its prefix (see [`crate::compile::compile`]). It is in force when the
//! change returns, like any rule change.

use std::{
    collections::HashMap,
    net::IpAddr,
    path::Path,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ipnet::IpNet;
use policer_common::{BucketKey, BucketKeyV6, RuleCounters, ban::Ban};

use super::{audit::Audit, monotonic_ns, ruleset::RuleSet};
use crate::{
    config::ConfigFile,
    duration,
    error::{Error, Result},
    loader::Policer,
    rules::{RuleConfig, RuleKey, RuleSpec},
};

/// How often the automatic bans are read (to log their starts and ends,
/// and forget those whose escalation window is over).
const SCAN_EVERY: Duration = Duration::from_secs(1);
/// The same with `[crowdsec] publish = true`.
const SCAN_EVERY_PUBLISHING: Duration = Duration::from_millis(250);

/// Log lines about automatic bans per scan at most; the rest are counted
/// in one line (a flood of bans must not flood the log).
const LOG_LINES_PER_SCAN: usize = 10;

/// Writes of expiries that failed (a full disk) are tried again after this,
/// twice as long after each failure up to [`CATCH_UP_MAX`]: a
/// format-preserving write of a large config is not free, and a disk stays
/// full for hours.
const CATCH_UP_EVERY: Duration = Duration::from_secs(1);
const CATCH_UP_MAX: Duration = Duration::from_secs(60);

/// The bans' owner: what the daemon remembers of automatic bans between
/// scans (the program starts them itself, in the `BANS` store), and of
/// expiries its files do not show yet. Manual bans are rule-set entries
/// ([`RuleSet`]): a ban is planned here ([`plan_ban`], [`plan_unban`]) and
/// made by the owner as any change of the rules (`owner.rs`).
#[derive(Default)]
pub(super) struct Bans {
    /// Bans seen in force: their start and end (program clock, ns).
    seen: HashMap<BucketKeyV6, (u64, u64)>,
    last_scan: Option<Instant>,
    /// Entries the store held at the last scan (None: not read yet, as at
    /// a start that adopted a store): read while it holds any, so they are
    /// forgotten after their window even with no rule banning.
    stored: Option<usize>,
    /// When an expiry last failed (logged once a minute at most).
    expiry_failed: Option<Instant>,
    /// The config file still holds rules or bans that ended while it could
    /// not be written (a full disk): written again until it lands.
    file_behind: bool,
    /// Sets that ended whose state file could not be removed: removed
    /// again until it goes.
    set_files_behind: Vec<String>,
    last_catch_up: Option<Instant>,
    /// How long after the last catch-up the next is tried (0: at once).
    catch_up_wait: Duration,
    /// The automatic bans' counts, as the last scan found them (shared
    /// with the views).
    tally: Arc<BanTally>,
    /// Where automatic bans go to be published (`[crowdsec] publish`).
    publish: Option<tokio::sync::mpsc::Sender<AutoBan>>,
}

/// An automatic ban for the fleet: its prefix, length and why (what
/// the ban owner hands `[crowdsec] publish`, `crowdsec.rs`).
#[derive(Clone, Debug)]
pub struct AutoBan {
    pub net: IpNet,
    pub secs: u64,
    pub rule: String,
    pub count: u32,
}

/// The automatic bans' counts the views read (`stats`, `status`,
/// `/metrics`), kept by the owner: each scan of the store (once a second,
/// [`SCAN_EVERY`]) sets them, an `unban` takes off what it lifted. A read
/// then costs the same at 100 000 bans as at none, and is at most one
/// scan stale (a ban the program started or ended since is counted at the
/// next). The manual bans' count is exact: the owner publishes their
/// counter slots with each snapshot ([`manual_ban_slots`]).
#[derive(Debug, Default)]
pub struct BanTally {
    /// Automatic bans in force.
    active: AtomicU64,
    /// Entries of the store: bans in force and those in their escalation
    /// window.
    stored: AtomicU64,
}

impl BanTally {
    /// (automatic bans in force, entries of the store).
    pub fn get(&self) -> (u64, u64) {
        (self.active.load(Ordering::Relaxed), self.stored.load(Ordering::Relaxed))
    }

    /// What a scan of the store found.
    fn scanned(&self, active: u64, stored: u64) {
        self.active.store(active, Ordering::Relaxed);
        self.stored.store(stored, Ordering::Relaxed);
    }

    /// `n` automatic bans in force were lifted (their entries deleted). A
    /// ban the last scan did not see yet cannot take the counts below zero.
    fn lifted(&self, n: u64) {
        for c in [&self.active, &self.stored] {
            let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v.saturating_sub(n)));
        }
    }
}

/// What a scan counts of the store at `now_ns`: (bans in force, entries
/// left once the `forgotten` ones are deleted).
fn tally_of(bans: &[(BucketKeyV6, Ban)], forgotten: usize, now_ns: u64) -> (u64, u64) {
    let active = bans.iter().filter(|(_, b)| b.end_ns > now_ns).count();
    (active as u64, bans.len().saturating_sub(forgotten) as u64)
}

/// The frames the manual bans dropped: their slots' counters, found in one
/// walk of both sorted lists (the rule counters come in slot order from
/// the array): what `stats` reads of the counters anyway, not a lookup
/// per ban.
pub(super) fn manual_dropped(counters: &[(u32, RuleCounters)], slots: &[u32]) -> u64 {
    let (mut sum, mut i) = (0, 0);
    for (slot, c) in counters {
        while i < slots.len() && slots[i] < *slot {
            i += 1;
        }
        if i == slots.len() {
            break;
        }
        if slots[i] == *slot {
            sum += c.dropped_pkts;
        }
    }
    sum
}

/// The source (or source prefix) of a ban's key, as an address and length.
pub(crate) fn key_net(k: &BucketKeyV6) -> Option<IpNet> {
    let b = BucketKey::from(*k);
    let addr: IpAddr = if b.family == policer_common::FAMILY_V4 {
        std::net::Ipv4Addr::new(b.addr[0], b.addr[1], b.addr[2], b.addr[3]).into()
    } else {
        std::net::Ipv6Addr::from(b.addr).into()
    };
    IpNet::new(addr, b.key_len as u8).ok()
}

/// A ban key as text: the source, or its prefix when the rule groups sources.
pub(crate) fn key_text(k: &BucketKeyV6) -> String {
    match key_net(k) {
        Some(n) if n.prefix_len() == n.max_prefix_len() => n.addr().to_string(),
        Some(n) => n.to_string(),
        None => "?".into(),
    }
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Who makes an automatic ban, in the audit trail: the program bans (the
/// daemon learns of it within a second, when it scans the bans store).
const AUTO: &str = "the program (automatic ban)";

/// A manual ban, planned: the edit of the rule set that makes it, what the
/// change answers, and the log line said once it is in force.
#[derive(Debug)]
pub(super) struct BanPlan {
    pub edit: (RuleKey, Option<RuleSpec>),
    pub message: String,
    pub log_line: String,
}

/// Plans `policer ban PREFIX --for DURATION [--reason TEXT]` (pure): the
/// ban checked and made a rule-set entry. `in_force`: whether a ban of that
/// key is in force (as the changes before it leave the rules).
pub(super) fn plan_ban(
    rc: &RuleConfig,
    runtime: bool,
    force: bool,
    in_force: impl FnOnce(&RuleKey) -> bool,
) -> Result<BanPlan> {
    if rc.ttl.is_none() {
        return Err(Error::Invalid(format!("ban {}: a ban needs a duration (--for)", rc.prefix)));
    }
    rc.check_reason()?;
    let mut rc = rc.clone();
    rc.ban = Some(true);
    let spec = rc.validate()?;
    if !force {
        crate::rules::refuse_everyone(&spec.net, "a ban of")?;
    }
    let key = spec.key();
    let replaced = in_force(&key);
    let until = spec.expires.map(duration::rfc3339).unwrap_or_default();
    let what = if replaced { "ban replaced" } else { "banned" };
    let note = if runtime { " (runtime only: not written to the config file)" } else { "" };
    let why = spec.ban().cloned().flatten().map(|r| format!(": {r}")).unwrap_or_default();
    let log_line = format!("policer: manual ban of {} until {until}{why}", key.net);
    let message = format!("{what}: {} until {until} ({} from now){note}", key.net, rc.ttl.as_deref().unwrap_or(""));
    Ok(BanPlan { edit: (key, Some(spec)), message, log_line })
}

/// An unban, planned: the manual ban to remove (its key), and the
/// automatic bans to lift.
#[derive(Debug, PartialEq)]
pub(super) struct UnbanPlan {
    pub net: IpNet,
    pub manual: Option<RuleKey>,
    pub autos: Vec<BucketKeyV6>,
}

/// Plans `policer unban PREFIX` (pure): the manual ban of exactly `net`
/// (when `manual`: one is in force or in the file), and every automatic
/// ban in force at `now_ns` among `bans` (the store) of a source in `net`
/// (or of a source prefix that holds it), but those an unban before it in
/// the same group lifts already (`pending`). Nothing to lift is an error.
pub(super) fn plan_unban(
    net: IpNet,
    manual: bool,
    bans: &[(BucketKeyV6, Ban)],
    now_ns: u64,
    pending: impl Fn(&BucketKeyV6) -> bool,
) -> Result<UnbanPlan> {
    let autos: Vec<BucketKeyV6> = bans
        .iter()
        .filter(|(k, b)| b.end_ns > now_ns && key_net(k).is_some_and(|n| overlaps(&n, &net)))
        .map(|(k, _)| *k)
        .filter(|k| !pending(k))
        .collect();
    if !manual && autos.is_empty() {
        return Err(Error::Invalid(format!("no ban for {net} (see `policer ban ls`)")));
    }
    let manual = manual.then(|| RuleKey::new(net, Default::default(), true));
    Ok(UnbanPlan { net, manual, autos })
}

/// The manual bans and rules whose end has come at `now_ms`, as the edits
/// that end them (pure): each removed, or the rule it temporarily replaced
/// put back ([`RuleSet::back_at_end`]: the config file's, or the one a
/// `rule set … --ttl` changed).
pub(super) fn plan_expiry(rs: &RuleSet, now_ms: u64) -> Vec<(RuleKey, Option<RuleSpec>)> {
    rs.ended(now_ms)
        .into_iter()
        .map(|k| {
            let back = if k.ban { None } else { rs.back_at_end(&k, now_ms) };
            (k, back)
        })
        .collect()
}

impl Bans {
    /// The automatic bans' counts, shared with the views.
    pub(super) fn tally(&self) -> Arc<BanTally> {
        self.tally.clone()
    }

    /// Automatic bans that start go to `tx` (`[crowdsec] publish`).
    pub(super) fn publish_to(&mut self, tx: tokio::sync::mpsc::Sender<AutoBan>) {
        self.publish = Some(tx);
    }

    /// Whether automatic bans are published (they are then read sooner).
    pub(super) fn publishing(&self) -> bool {
        self.publish.is_some()
    }

    /// Lifts the automatic bans `autos` in `policer`: how many were in force.
    pub(super) fn lift(&mut self, policer: &mut Policer, autos: &[BucketKeyV6]) -> Result<u64> {
        let mut lifted = 0;
        for k in autos {
            if policer.lift_ban(k)? {
                lifted += 1;
                self.seen.remove(k);
            }
        }
        self.tally.lifted(lifted);
        Ok(lifted)
    }

    /// An expiry could not be written to the config file, and was made in
    /// the kernel only: the file is written again until it lands.
    pub(super) fn file_behind(&mut self) {
        self.file_behind = true;
    }

    /// An expiry failed: said once a minute at most.
    pub(super) fn expiry_failed(&mut self, e: &Error) {
        if self.expiry_failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            self.expiry_failed = Some(Instant::now());
            say_err!("policer: removing expired entries failed (tried again): {e}");
        }
    }

    /// The state file of the ended set `name` could not be removed: it is
    /// removed again until it goes.
    pub(super) fn set_file_behind(&mut self, name: String) {
        self.set_files_behind.push(name);
    }

    /// The set `name` is made again: its state file is its own once more.
    pub(super) fn set_file_back(&mut self, name: &str) {
        self.set_files_behind.retain(|n| n != name);
    }

    /// Writes what ended but its files still show: the config `file`
    /// without the rules and bans that ended while it could not be written
    /// (`rs` holds what is in force), and the removal of ended sets' state
    /// files in `sets_dir`. Once a second at most, until each lands (a
    /// restart would skip what ended anyway, but the file is what an
    /// operator reads). True when the file's rules changed.
    pub(super) fn catch_up(&mut self, rs: &mut RuleSet, file: &mut ConfigFile, sets_dir: &Path) -> bool {
        if !self.file_behind && self.set_files_behind.is_empty() {
            return false;
        }
        let wait = self.catch_up_wait;
        if self.last_catch_up.is_some_and(|t| t.elapsed() < wait) {
            return false;
        }
        self.last_catch_up = Some(Instant::now());
        // Until what is tried here lands: twice the wait, up to a minute.
        self.catch_up_wait = (wait * 2).clamp(CATCH_UP_EVERY, CATCH_UP_MAX);
        let mut failed = None;
        self.set_files_behind.retain(|name| match crate::sets::remove(sets_dir, name) {
            Ok(()) => {
                say!("policer: the state file of the ended set '{name}' is removed now");
                false
            }
            Err(e) => {
                failed = Some(e);
                true
            }
        });
        if let Some(e) = failed
            && self.expiry_failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            self.expiry_failed = Some(Instant::now());
            say_err!("policer: removing an ended set's state file failed again (tried again): {e}");
        }
        if !self.file_behind {
            if self.set_files_behind.is_empty() {
                self.catch_up_wait = Duration::ZERO;
            }
            return false;
        }
        let now = duration::unix_ms();
        let mut specs = rs.file_specs();
        let before = specs.len();
        // What the kernel still holds is the ordinary expiry's (this tick's
        // or the next); what it does not and has ended, the file's only.
        specs.retain(|k, s| rs.rules().contains_key(k) || s.expires.is_none_or(|e| e > now));
        let ended = before - specs.len();
        // Nothing left to write (a reload or a later write took it), or
        // nothing the daemon may write.
        if ended == 0 || file.read_only() {
            self.file_behind = false;
            self.catch_up_wait = Duration::ZERO;
            return false;
        }
        match file.apply_rules(&specs) {
            Ok(()) => {
                rs.set_file_rules(specs);
                self.file_behind = false;
                self.catch_up_wait = Duration::ZERO;
                say!(
                    "policer: {} caught up: {ended} expired rules and bans that it still held are removed from it",
                    file.path().display()
                );
                true
            }
            Err(e) => {
                if self.expiry_failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    self.expiry_failed = Some(Instant::now());
                    say_err!("policer: writing the config file after an expiry failed again (tried again): {e}");
                }
                false
            }
        }
    }

    /// Once a second (or sooner when publishing): reads the automatic
    /// bans ([`scan`](Self::scan)); a failure is a warning.
    pub(super) fn scan_if_due(&mut self, rs: &RuleSet, policer: &mut Policer, audit: &Audit) {
        // Publishing to a fleet: bans travel sooner (they reach the other
        // nodes within the scan and one poll of theirs).
        let every = if self.publishing() { SCAN_EVERY_PUBLISHING } else { SCAN_EVERY };
        if self.last_scan.is_none_or(|t| t.elapsed() >= every) {
            self.last_scan = Some(Instant::now());
            if let Err(e) = self.scan(rs, policer, audit) {
                log::warn!("reading the automatic bans: {e}");
            }
        }
    }

    /// Logs automatic bans that started or ended since the last scan
    /// (bounded), and forgets those past their escalation window.
    fn scan(&mut self, rs: &RuleSet, policer: &mut Policer, audit: &Audit) -> Result<()> {
        let any_rule = rs.rules().values().any(|i| i.spec.auto_ban().is_some());
        if !any_rule && self.seen.is_empty() && self.stored == Some(0) {
            return Ok(());
        }
        let now = monotonic_ns();
        let bans: Vec<(BucketKeyV6, Ban)> = policer.reader().bans()?;
        let (mut started, mut ended) = (Vec::new(), Vec::new());
        for (k, b) in &bans {
            if b.end_ns > now && self.seen.get(k).map(|s| s.0) != Some(b.start_ns) {
                self.seen.insert(*k, (b.start_ns, b.end_ns));
                started.push((*k, *b));
            }
        }
        let live: HashMap<BucketKeyV6, u64> = bans.iter().map(|(k, b)| (*k, b.end_ns)).collect();
        self.seen.retain(|k, (_, end)| {
            // A ban made longer by another start is seen again above.
            let end = live.get(k).copied().unwrap_or(*end);
            if end <= now {
                ended.push(*k);
                false
            } else {
                true
            }
        });
        if let Some(tx) = &self.publish {
            for (k, b) in &started {
                let Some(net) = key_net(k) else { continue };
                let ban = AutoBan {
                    net,
                    secs: Duration::from_nanos(b.len_ns).as_secs().max(1),
                    rule: rule_of_slot(rs, b.rule_slot),
                    count: b.count,
                };
                if tx.try_send(ban).is_err() {
                    log::warn!("crowdsec: the queue of automatic bans to publish is full; one not published");
                }
            }
        }
        for (i, (k, b)) in started.iter().enumerate() {
            if i == LOG_LINES_PER_SCAN {
                audit.record(AUTO, &format!("... and {} more automatic bans started", started.len() - i));
                break;
            }
            audit.record(
                AUTO,
                &format!(
                    "banned {} for {} (rule {}; ban #{} of this source)",
                    key_text(k),
                    duration::format(Duration::from_nanos(b.len_ns)),
                    rule_of_slot(rs, b.rule_slot),
                    b.count
                ),
            );
        }
        for (i, k) in ended.iter().enumerate() {
            if i == LOG_LINES_PER_SCAN {
                audit.record(AUTO, &format!("... and {} more automatic bans ended", ended.len() - i));
                break;
            }
            audit.record(AUTO, &format!("the automatic ban of {} ended", key_text(k)));
        }
        let forgotten = policer.expire_bans(now)?.len();
        self.stored = Some(bans.len().saturating_sub(forgotten));
        let (active, stored) = tally_of(&bans, forgotten, now);
        self.tally.scanned(active, stored);
        Ok(())
    }
}

/// The rule a counter slot belongs to, as text.
fn rule_of_slot(rs: &RuleSet, slot: u32) -> String {
    rs.rules().iter().find(|(_, i)| i.slot == slot).map_or_else(|| format!("slot {slot}"), |(k, _)| k.to_string())
}

/// The automatic bans a daemon that detaches keeps for the next start
/// (issue 43, point 1): the program and its ban store go with a plain exit
/// (no `--persist`), so the store is written here, `STATE_DIR/auto-bans.json`,
/// and a start with a fresh program puts it back. A start that adopts a
/// program keeps that program's store instead (and removes a file left by
/// an older exit).
pub(super) fn kept_bans_file(sets_dir: &Path) -> std::path::PathBuf {
    sets_dir.parent().map_or_else(|| std::path::PathBuf::from("auto-bans.json"), |p| p.join("auto-bans.json"))
}

/// One entry of the ban store as a restart keeps it: its times on the
/// wall clock (the program's clock starts again at boot), its rules by
/// key (counter slots are given anew at each start).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct KeptBan {
    /// The store's key: the masked source (16 bytes, hex) and its length
    /// as the store holds them.
    pub addr: String,
    pub key_len: u32,
    /// The class rule whose bucket is banned (none: a class-less one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_rule: Option<String>,
    /// The rule whose bucket the source exceeded.
    pub rule: String,
    pub start_unix_ms: u64,
    pub end_unix_ms: u64,
    pub len_ns: u64,
    pub count: u32,
    pub drops: u64,
}

/// Writes `kept` to `file` whole ([`crate::files::replace_json`]).
pub(super) fn write_kept_bans(file: &Path, kept: &[KeptBan]) -> std::io::Result<()> {
    crate::files::replace_json(file, &kept)
}

/// The bans a plain exit kept in `file`; none when there is no file.
pub(super) fn read_kept_bans(file: &Path) -> std::result::Result<Vec<KeptBan>, String> {
    match std::fs::read(file) {
        Ok(b) => serde_json::from_slice(&b).map_err(|e| format!("{}: {e}", file.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("{}: {e}", file.display())),
    }
}

/// `ns` of the program's clock on the wall clock, given both now.
fn wall_ms(ns: u64, now_ns: u64, now_ms: u64) -> u64 {
    let d = (ns as i128 - now_ns as i128) / 1_000_000;
    (now_ms as i128 + d).max(0) as u64
}

/// `ms` of the wall clock on the program's clock, given both now.
fn clock_ns(ms: u64, now_ns: u64, now_ms: u64) -> u64 {
    let d = (ms as i128 - now_ms as i128) * 1_000_000;
    (now_ns as i128 + d).max(0) as u64
}

/// The store's entries worth keeping at `now_ns` (bans in force, and those
/// still in their escalation window), with their rules' keys (`slots`:
/// counter slot → rule key); entries of a rule no longer known are left.
pub(super) fn keep_bans(
    store: &[(BucketKeyV6, Ban)],
    slots: &HashMap<u32, String>,
    now_ns: u64,
    now_ms: u64,
) -> Vec<KeptBan> {
    store
        .iter()
        .filter(|(_, b)| !policer_common::ban::forgettable(b, now_ns))
        .filter_map(|(k, b)| {
            let class_rule = match k.class {
                0 => None,
                c => Some(slots.get(&c)?.clone()),
            };
            Some(KeptBan {
                addr: k.addr.iter().map(|b| format!("{b:02x}")).collect(),
                key_len: k.key_len,
                class_rule,
                rule: slots.get(&b.rule_slot)?.clone(),
                start_unix_ms: wall_ms(b.start_ns, now_ns, now_ms),
                end_unix_ms: wall_ms(b.end_ns, now_ns, now_ms),
                len_ns: b.len_ns,
                count: b.count,
                drops: b.drops,
            })
        })
        .collect()
}

/// The kept bans back as store entries at `now_ns` (`slots`: rule key →
/// its counter slot now): those whose escalation window is over, or whose
/// rules are gone, are left out (counted in the second value).
pub(super) fn restore_bans(
    kept: &[KeptBan],
    slots: &HashMap<String, u32>,
    now_ns: u64,
    now_ms: u64,
) -> (Vec<(BucketKeyV6, Ban)>, usize) {
    let mut left = 0;
    let mut out = Vec::new();
    for k in kept {
        let addr = (0..16).map(|i| k.addr.get(2 * i..2 * i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()));
        let addr: Option<Vec<u8>> = addr.collect();
        let class = match &k.class_rule {
            None => Some(0),
            Some(r) => slots.get(r).copied(),
        };
        let (Some(addr), Some(class), Some(rule_slot)) = (addr, class, slots.get(&k.rule).copied()) else {
            left += 1;
            continue;
        };
        let mut a = [0u8; 16];
        a.copy_from_slice(&addr);
        let ban = Ban {
            end_ns: clock_ns(k.end_unix_ms, now_ns, now_ms),
            len_ns: k.len_ns,
            start_ns: clock_ns(k.start_unix_ms, now_ns, now_ms),
            drops: k.drops,
            rule_slot,
            count: k.count,
        };
        if policer_common::ban::forgettable(&ban, now_ns) {
            left += 1;
            continue;
        }
        out.push((BucketKeyV6 { addr: a, key_len: k.key_len, class }, ban));
    }
    (out, left)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u8) -> BucketKeyV6 {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&[10, 0, 0, i]);
        BucketKeyV6 { addr, key_len: 128, class: 0 }
    }

    fn ban(end_ns: u64) -> Ban {
        Ban { end_ns, ..Default::default() }
    }

    fn ban_rc(prefix: &str, ttl: Option<&str>) -> RuleConfig {
        RuleConfig {
            prefix: prefix.into(),
            ttl: ttl.map(Into::into),
            reason: Some("scan".into()),
            ..Default::default()
        }
    }

    /// A ban is planned as a rule-set entry of its own key (a ban), with
    /// the answer and log line it will give; a ban with no duration, or of
    /// everyone without force, is refused before anything is planned.
    #[test]
    fn a_ban_is_planned_as_a_rule_set_entry() {
        let p = plan_ban(&ban_rc("192.0.2.0/24", Some("10m")), false, false, |_| false).unwrap();
        let (key, spec) = &p.edit;
        assert!(key.ban);
        assert_eq!(key.net, "192.0.2.0/24".parse::<IpNet>().unwrap());
        assert_eq!(spec.as_ref().map(|s| s.key()), Some(key.clone()));
        assert!(p.message.starts_with("banned: 192.0.2.0/24 until "), "{}", p.message);
        assert!(p.message.ends_with("(10m from now)"), "{}", p.message);
        assert!(p.log_line.starts_with("policer: manual ban of 192.0.2.0/24 until "), "{}", p.log_line);
        assert!(p.log_line.ends_with(": scan"), "{}", p.log_line);
        let p = plan_ban(&ban_rc("192.0.2.0/24", Some("10m")), true, false, |k| k.ban).unwrap();
        assert!(p.message.starts_with("ban replaced: "), "{}", p.message);
        assert!(p.message.ends_with("(runtime only: not written to the config file)"), "{}", p.message);
        let e = plan_ban(&ban_rc("192.0.2.0/24", None), false, false, |_| false).unwrap_err();
        assert!(e.to_string().contains("a ban needs a duration"), "{e}");
        assert!(plan_ban(&ban_rc("0.0.0.0/0", Some("10m")), false, false, |_| false).is_err());
        assert!(plan_ban(&ban_rc("0.0.0.0/0", Some("10m")), false, true, |_| false).is_ok());
    }

    /// An unban lifts the automatic bans in force that overlap its prefix,
    /// not those an unban before it in the group lifts already; with no
    /// manual ban and none of those, it is refused.
    #[test]
    fn an_unban_plans_the_automatic_bans_it_lifts() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        // As the program keys an IPv4 source: mapped, in the last 4 bytes.
        let v4 = |a: [u8; 4]| {
            let mut addr = [0; 16];
            addr[12..].copy_from_slice(&a);
            BucketKeyV6 { addr, key_len: 32 | policer_common::KEY_LEN_V4_MAPPED, class: 0 }
        };
        let key = |i: u8| v4([10, 0, 0, i]);
        let outside = v4([198, 51, 100, 1]);
        assert_eq!(key_net(&key(1)), Some(net("10.0.0.1/32")));
        let store = [(key(1), ban(100)), (key(2), ban(100)), (key(3), ban(50)), (outside, ban(100))];
        let p = plan_unban(net("10.0.0.0/24"), false, &store, 60, |_| false).unwrap();
        assert_eq!(p, UnbanPlan { net: net("10.0.0.0/24"), manual: None, autos: vec![key(1), key(2)] });
        let p = plan_unban(net("10.0.0.0/24"), true, &store, 60, |k| *k == key(1)).unwrap();
        let manual = Some(RuleKey::new(net("10.0.0.0/24"), Default::default(), true));
        assert_eq!(p, UnbanPlan { net: net("10.0.0.0/24"), manual, autos: vec![key(2)] });
        // A source prefix that holds the unbanned one is lifted too.
        let p = plan_unban(net("10.0.0.2/32"), false, &store, 60, |_| false).unwrap();
        assert_eq!(p.autos, vec![key(2)]);
        let e = plan_unban(net("10.0.0.0/24"), false, &store, 100, |_| false).unwrap_err();
        assert_eq!(e.to_string(), "no ban for 10.0.0.0/24 (see `policer ban ls`)");
    }

    /// A scan counts the bans in force now, and the entries the store
    /// keeps once the forgotten ones are gone.
    #[test]
    fn a_scan_counts_bans_in_force_and_entries_kept() {
        let bans = [(key(1), ban(100)), (key(2), ban(200)), (key(3), ban(50)), (key(4), ban(10))];
        assert_eq!(tally_of(&bans, 0, 99), (2, 4));
        // Ending exactly now is over (the program's `end_ns > now`).
        assert_eq!(tally_of(&bans, 1, 100), (1, 3));
        assert_eq!(tally_of(&bans, 2, 300), (0, 2));
        assert_eq!(tally_of(&[], 0, 300), (0, 0));
    }

    /// Lifting takes off what was lifted, never below zero (a ban started
    /// since the last scan), and the next scan sets the counts again.
    #[test]
    fn the_tally_follows_scans_and_unbans() {
        let t = BanTally::default();
        assert_eq!(t.get(), (0, 0));
        t.scanned(5, 8);
        assert_eq!(t.get(), (5, 8));
        t.lifted(2);
        assert_eq!(t.get(), (3, 6));
        t.lifted(4);
        assert_eq!(t.get(), (0, 2));
        t.lifted(9);
        assert_eq!(t.get(), (0, 0));
        t.scanned(1, 1);
        assert_eq!(t.get(), (1, 1));
    }

    /// The manual bans' slots, sorted, and their drops summed in one walk
    /// of the slot-ordered counters (slots without counters, counters of
    /// other rules, a ban's slot past the last counter).
    #[test]
    fn manual_bans_are_counted_from_their_slots() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        let rules: std::collections::BTreeMap<RuleKey, u32> = [
            (RuleKey::new(net("10.0.0.0/8"), Default::default(), false), 1),
            (RuleKey::new(net("10.0.0.0/8"), Default::default(), true), 9),
            (RuleKey::new(net("192.0.2.0/24"), Default::default(), true), 4),
            (RuleKey::new(net("2001:db8::/32"), Default::default(), true), 40),
            (RuleKey::new(net("198.51.100.0/24"), Default::default(), false), 5),
        ]
        .into();
        let slots = super::super::ruleset::manual_ban_slots(rules.iter(), |s| *s);
        assert_eq!(*slots, vec![4, 9, 40]);
        let c = |d: u64| RuleCounters { dropped_pkts: d, passed_pkts: 1000, ..Default::default() };
        let counters: Vec<(u32, RuleCounters)> = (0..=20).map(|s| (s, c(u64::from(s) * 10))).collect();
        // Slots 4 and 9; 40 has no counters here.
        assert_eq!(manual_dropped(&counters, &slots), 40 + 90);
        assert_eq!(manual_dropped(&counters, &[]), 0);
        assert_eq!(manual_dropped(&[], &slots), 0);
        let all: Vec<u32> = (0..=20).collect();
        assert_eq!(manual_dropped(&counters, &all), (0..=20).map(|s| s * 10).sum::<u64>());
    }

    #[test]
    fn kept_bans_come_back_with_their_wall_clock_ends_and_new_slots() {
        use policer_common::{BucketKeyV6, ban::Ban};
        let key = BucketKeyV6 { addr: [0xff; 16], key_len: 32 | 0x100, class: 7 };
        let ban = Ban {
            end_ns: 70_000_000_000,
            len_ns: 60_000_000_000,
            start_ns: 10_000_000_000,
            drops: 5,
            rule_slot: 3,
            count: 2,
        };
        // Ended long ago: forgotten, not kept.
        let old = Ban { end_ns: 1_000_000_000, len_ns: 1_000_000_000, ..ban };
        let slots: std::collections::HashMap<u32, String> =
            [(3, "10.0.0.0/8".to_string()), (7, "10.0.0.0/8 [udp dport 53]".to_string())].into();
        // The old daemon's clock: 20 s since boot, at wall clock 1e12 ms.
        let kept = super::keep_bans(&[(key, ban), (key, old)], &slots, 20_000_000_000, 1_000_000_000_000);
        assert_eq!(kept.len(), 1);
        assert_eq!((kept[0].end_unix_ms, kept[0].start_unix_ms), (1_000_000_050_000, 999_999_990_000));
        // A reboot later: 5 s since boot, 30 s of wall clock later; the
        // rules have other slots now.
        let slots: std::collections::HashMap<String, u32> =
            [("10.0.0.0/8".to_string(), 11), ("10.0.0.0/8 [udp dport 53]".to_string(), 12)].into();
        let (back, left) = super::restore_bans(&kept, &slots, 5_000_000_000, 1_000_000_030_000);
        assert_eq!(left, 0);
        let (k, b) = back[0];
        assert_eq!((k.addr, k.key_len, k.class), ([0xff; 16], 32 | 0x100, 12));
        // 20 s left of the ban, on the new clock.
        assert_eq!((b.end_ns, b.start_ns, b.rule_slot, b.count, b.drops), (25_000_000_000, 0, 11, 2, 5));
        // Its rule gone: left out.
        let (back, left) =
            super::restore_bans(&kept, &std::collections::HashMap::new(), 5_000_000_000, 1_000_000_030_000);
        assert_eq!((back.len(), left), (0, 1));
    }
}
