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
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use ipnet::IpNet;
use policer_common::{BucketKey, BucketKeyV6, RuleCounters, ban::Ban};

use super::{Daemon, monotonic_ns};
use crate::{
    duration,
    error::{Error, Result},
    prefix::parse_prefix,
    rules::{RuleConfig, RuleKey},
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

/// What the daemon remembers of automatic bans between scans, and of
/// expiries its files do not show yet.
#[derive(Default)]
pub(super) struct BanLog {
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
    pub(super) set_files_behind: Vec<String>,
    last_catch_up: Option<Instant>,
    /// How long after the last catch-up the next is tried (0: at once).
    catch_up_wait: Duration,
    /// The automatic bans' counts, as the last scan found them (shared
    /// with the views).
    pub(super) tally: Arc<BanTally>,
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

/// The counter slots of the manual bans among `rules`, sorted: the owner
/// publishes them with each snapshot (once per change, not per read).
pub(super) fn manual_ban_slots<'a, V: 'a>(
    rules: impl Iterator<Item = (&'a RuleKey, &'a V)>,
    slot: impl Fn(&V) -> u32,
) -> Arc<Vec<u32>> {
    let mut slots: Vec<u32> = rules.filter(|(k, _)| k.ban).map(|(_, v)| slot(v)).collect();
    slots.sort_unstable();
    Arc::new(slots)
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

/// Leaves out the rules and bans whose expiry has passed.
pub(super) fn drop_expired(specs: &mut std::collections::BTreeMap<RuleKey, crate::rules::RuleSpec>) {
    let now = duration::unix_ms();
    specs.retain(|_, s| s.expires.is_none_or(|e| e > now));
}

fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// What a change does once it is written (in a group of changes, after
/// the group's one write; never if that write fails).
#[derive(Debug)]
pub(super) enum After {
    /// A line of the log.
    Say(String),
    /// Automatic bans an `unban` lifts with a manual ban.
    Lift(Vec<BucketKeyV6>),
}

/// Who makes an automatic ban, in the audit trail: the program bans (the
/// daemon learns of it within a second, when it scans the bans store).
const AUTO: &str = "the program (automatic ban)";

impl Daemon {
    /// `policer ban PREFIX --for DURATION [--reason TEXT]`.
    pub(super) fn ban(&mut self, rc: &RuleConfig, runtime: bool, force: bool) -> Result<String> {
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
        let replaced = self.rule_in_force(&key).is_some();
        self.change(runtime, &[(key.clone(), Some(spec.clone()))])?;
        self.changed = true;
        let until = spec.expires.map(duration::rfc3339).unwrap_or_default();
        let what = if replaced { "ban replaced" } else { "banned" };
        let note = if runtime { " (runtime only: not written to the config file)" } else { "" };
        let why = spec.ban().cloned().flatten().map(|r| format!(": {r}")).unwrap_or_default();
        if !self.dry() {
            // Said once the ban is in force: in a group, after its write.
            self.when_written(After::Say(format!("policer: manual ban of {} until {until}{why}", key.net)));
        }
        Ok(format!("{what}: {} until {until} ({} from now){note}", key.net, rc.ttl.as_deref().unwrap_or("")))
    }

    /// `policer unban PREFIX`: the manual ban of exactly that prefix, and
    /// every automatic ban of a source in it (or of a source prefix that
    /// holds it). Nothing to lift is an error.
    pub(super) fn unban(&mut self, prefix: &str, runtime: bool) -> Result<String> {
        let net = parse_prefix(prefix)?;
        let key = RuleKey::new(net, Default::default(), true);
        let manual = self.rule_in_force(&key).is_some() || (!runtime && self.in_file(&key));
        let now = monotonic_ns();
        let autos: Vec<BucketKeyV6> = self
            .policer
            .reader()
            .bans()?
            .into_iter()
            .filter(|(k, b)| b.end_ns > now && key_net(k).is_some_and(|n| overlaps(&n, &net)))
            .map(|(k, _)| k)
            // Not those an unban before it in the same group lifts.
            .filter(|k| !self.lift_pending(k))
            .collect();
        if !manual && autos.is_empty() {
            return Err(Error::Invalid(format!("no ban for {net} (see `policer ban ls`)")));
        }
        let mut parts = Vec::new();
        if manual {
            self.change(runtime, &[(key, None)])?;
            parts.push(format!("lifted the ban of {net}"));
            self.when_written(After::Say(format!("policer: the manual ban of {net} was lifted")));
        }
        // With a manual ban in a group, the automatic ones are lifted with
        // it, after the group's write: a write that fails lifts neither.
        let lifted = if self.write_pending() {
            let n = autos.len() as u64;
            self.when_written(After::Lift(autos));
            n
        } else {
            self.lift_autos(&autos)?
        };
        if lifted > 0 {
            parts.push(format!("lifted {lifted} automatic ban{}", if lifted == 1 { "" } else { "s" }));
        }
        self.changed = true;
        Ok(parts.join("; "))
    }

    /// Lifts the automatic bans `autos`: how many were in force.
    fn lift_autos(&mut self, autos: &[BucketKeyV6]) -> Result<u64> {
        let mut lifted = 0;
        for k in autos {
            if self.policer.lift_ban(k)? {
                lifted += 1;
                self.ban_log.seen.remove(k);
            }
        }
        self.ban_log.tally.lifted(lifted);
        Ok(lifted)
    }

    /// Does what a change left for after its write ([`After`]).
    pub(super) fn done_after(&mut self, a: After) {
        match a {
            After::Say(line) => say!("{line}"),
            After::Lift(autos) => {
                if let Err(e) = self.lift_autos(&autos) {
                    say_err!("policer: lifting {} automatic ban(s) failed: {e}", autos.len());
                }
                self.changed = true;
            }
        }
    }

    /// Whether the last tick changed what the views show (then cleared).
    pub(super) fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The periodic work: expiries, then (once a second) automatic bans.
    pub(super) fn tick(&mut self) -> Result<()> {
        self.expire();
        for m in self.expire_sets(super::unix_now()) {
            self.audit.record("expiry", &m);
        }
        self.catch_up();
        // Publishing to a fleet: bans travel sooner (they reach the other
        // nodes within the scan and one poll of theirs).
        let every = if self.publish.is_some() { SCAN_EVERY_PUBLISHING } else { SCAN_EVERY };
        if self.ban_log.last_scan.is_none_or(|t| t.elapsed() >= every) {
            self.ban_log.last_scan = Some(Instant::now());
            if let Err(e) = self.scan_bans() {
                log::warn!("reading the automatic bans: {e}");
            }
        }
        Ok(())
    }

    /// Removes rules and manual bans whose expiry has come, in one change
    /// (kernel and file; the kernel only when the file is read-only).
    pub(super) fn expire(&mut self) {
        let now = duration::unix_ms();
        let due: Vec<RuleKey> = self.rs.ended(now);
        if due.is_empty() {
            return;
        }
        let edit: Vec<(RuleKey, Option<crate::rules::RuleSpec>)> = due.iter().map(|k| (k.clone(), None)).collect();
        // An end is kept even when the file cannot be written (a full disk):
        // then in the kernel only, and the next write of the file (or the
        // next start, which skips what ended) catches up.
        let r = match self.change(self.file.read_only(), &edit) {
            Err(e) if !self.file.read_only() => {
                say_err!(
                    "policer: writing the config file after an expiry failed ({e}); removed in the kernel only, \
                     the file is written again until it lands"
                );
                let r = self.change(true, &edit);
                self.ban_log.file_behind |= r.is_ok();
                r
            }
            r => r,
        };
        match r {
            Ok(()) => {
                self.changed = true;
                for k in &due {
                    if k.ban {
                        self.audit.record("expiry", &format!("the ban of {} ended (expired)", k.net));
                    } else {
                        self.audit.record("expiry", &format!("the rule for {k} expired and was removed"));
                    }
                }
            }
            Err(e) => {
                if self.ban_log.expiry_failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    self.ban_log.expiry_failed = Some(Instant::now());
                    say_err!("policer: removing expired entries failed (tried again): {e}");
                }
            }
        }
    }

    /// Writes what ended but its files still show: the config file without
    /// the rules and bans that ended while it could not be written, and
    /// the removal of ended sets' state files. Once a second at most,
    /// until each lands (a restart would skip what ended anyway, but the
    /// file is what an operator reads).
    fn catch_up(&mut self) {
        if !self.ban_log.file_behind && self.ban_log.set_files_behind.is_empty() {
            return;
        }
        let wait = self.ban_log.catch_up_wait;
        if self.ban_log.last_catch_up.is_some_and(|t| t.elapsed() < wait) {
            return;
        }
        self.ban_log.last_catch_up = Some(Instant::now());
        // Until what is tried here lands: twice the wait, up to a minute.
        self.ban_log.catch_up_wait = (wait * 2).clamp(CATCH_UP_EVERY, CATCH_UP_MAX);
        let dir = self.sets_dir.clone();
        let mut failed = None;
        self.ban_log.set_files_behind.retain(|name| match crate::sets::remove(&dir, name) {
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
            && self.ban_log.expiry_failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            self.ban_log.expiry_failed = Some(Instant::now());
            say_err!("policer: removing an ended set's state file failed again (tried again): {e}");
        }
        if !self.ban_log.file_behind {
            if self.ban_log.set_files_behind.is_empty() {
                self.ban_log.catch_up_wait = Duration::ZERO;
            }
            return;
        }
        let now = duration::unix_ms();
        let mut file = self.rs.file_specs();
        let before = file.len();
        // What the kernel still holds is the ordinary expiry's (this tick's
        // or the next); what it does not and has ended, the file's only.
        file.retain(|k, s| self.rs.rules().contains_key(k) || s.expires.is_none_or(|e| e > now));
        let ended = before - file.len();
        // Nothing left to write (a reload or a later write took it), or
        // nothing the daemon may write.
        if ended == 0 || self.file.read_only() {
            self.ban_log.file_behind = false;
            self.ban_log.catch_up_wait = Duration::ZERO;
            return;
        }
        match self.file.apply_rules(&file) {
            Ok(()) => {
                self.rs.set_file_rules(file);
                self.ban_log.file_behind = false;
                self.ban_log.catch_up_wait = Duration::ZERO;
                self.changed = true;
                say!(
                    "policer: {} caught up: {ended} expired rules and bans that it still held are removed from it",
                    self.file.path().display()
                );
            }
            Err(e) => {
                if self.ban_log.expiry_failed.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                    self.ban_log.expiry_failed = Some(Instant::now());
                    say_err!("policer: writing the config file after an expiry failed again (tried again): {e}");
                }
            }
        }
    }

    /// The rule a counter slot belongs to, as text.
    fn rule_of_slot(&self, slot: u32) -> String {
        self.rs
            .rules()
            .iter()
            .find(|(_, i)| i.slot == slot)
            .map_or_else(|| format!("slot {slot}"), |(k, _)| k.to_string())
    }

    /// Logs automatic bans that started or ended since the last scan
    /// (bounded), and forgets those past their escalation window.
    fn scan_bans(&mut self) -> Result<()> {
        let any_rule = self.rs.rules().values().any(|i| i.spec.auto_ban().is_some());
        if !any_rule && self.ban_log.seen.is_empty() && self.ban_log.stored == Some(0) {
            return Ok(());
        }
        let now = monotonic_ns();
        let bans: Vec<(BucketKeyV6, Ban)> = self.policer.reader().bans()?;
        let (mut started, mut ended) = (Vec::new(), Vec::new());
        for (k, b) in &bans {
            if b.end_ns > now && self.ban_log.seen.get(k).map(|s| s.0) != Some(b.start_ns) {
                self.ban_log.seen.insert(*k, (b.start_ns, b.end_ns));
                started.push((*k, *b));
            }
        }
        let live: HashMap<BucketKeyV6, u64> = bans.iter().map(|(k, b)| (*k, b.end_ns)).collect();
        self.ban_log.seen.retain(|k, (_, end)| {
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
                let ban = super::crowdsec::AutoBan {
                    net,
                    secs: Duration::from_nanos(b.len_ns).as_secs().max(1),
                    rule: self.rule_of_slot(b.rule_slot),
                    count: b.count,
                };
                if tx.try_send(ban).is_err() {
                    log::warn!("crowdsec: the queue of automatic bans to publish is full; one not published");
                }
            }
        }
        for (i, (k, b)) in started.iter().enumerate() {
            if i == LOG_LINES_PER_SCAN {
                self.audit.record(AUTO, &format!("... and {} more automatic bans started", started.len() - i));
                break;
            }
            self.audit.record(
                AUTO,
                &format!(
                    "banned {} for {} (rule {}; ban #{} of this source)",
                    key_text(k),
                    duration::format(Duration::from_nanos(b.len_ns)),
                    self.rule_of_slot(b.rule_slot),
                    b.count
                ),
            );
        }
        for (i, k) in ended.iter().enumerate() {
            if i == LOG_LINES_PER_SCAN {
                self.audit.record(AUTO, &format!("... and {} more automatic bans ended", ended.len() - i));
                break;
            }
            self.audit.record(AUTO, &format!("the automatic ban of {} ended", key_text(k)));
        }
        let forgotten = self.policer.expire_bans(now)?.len();
        self.ban_log.stored = Some(bans.len().saturating_sub(forgotten));
        let (active, stored) = tally_of(&bans, forgotten, now);
        self.ban_log.tally.scanned(active, stored);
        Ok(())
    }
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
        let slots = manual_ban_slots(rules.iter(), |s| *s);
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
}
