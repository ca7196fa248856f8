//! Reloads (`policer reload`, SIGHUP, a followed edit of the config file):
//! the reload's own state ([`Reload`]: how the last one went, what `status`
//! and `/metrics` show, the file a followed reload already refused) and
//! its pure planning ([`plan`]: the file's rules with the runtime changes
//! laid over them, what that changes, whether it is drastic, and what the
//! answer says). The owner reads the file and writes the plan
//! (`owner.rs`: `reload`, `follow`; the rules and sets are made by
//! `Daemon::reload_file`).

use std::collections::BTreeMap;

use super::ruleset::drop_expired;
use crate::{
    error::{Error, Result},
    rules::{RuleKey, RuleSpec},
};

/// How the last reload went: what `status` and /metrics show, and the file
/// a followed reload already refused.
pub(super) struct Reload {
    /// Whether the last reload applied the file (true at start), and when
    /// it was tried (Unix seconds).
    ok: bool,
    at: f64,
    /// Why it was not applied.
    error: Option<String>,
    /// The sha256 of the bytes a reload refused for what they say: not
    /// tried again until the file changes. Never set when the file could
    /// not be read (then it is tried again).
    refused_sha: Option<String>,
    /// Group writes of the file by changes (`end_group`), and the changes
    /// they wrote: their ratio is how many changes share a write.
    writes: u64,
    changes_written: u64,
    /// The longest a request waited in the owner's queue before the owner
    /// took it, and how many waited over 100 ms (since the start).
    longest_wait: std::time::Duration,
    waits_over_100ms: u64,
    /// The longest a group's write of the file held the owner (written
    /// and synced beside it, renamed, the directory synced).
    longest_write: std::time::Duration,
}

/// What a followed edit of the config file calls for ([`Reload::follow_step`]).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum FollowStep {
    /// Nothing: the file in force, or a file already refused.
    Nothing,
    /// The file in force is back after a refused one.
    BackInForce,
    /// New bytes: reload them.
    Reload,
}

impl Reload {
    /// At start: the file just read is in force.
    pub fn new() -> Reload {
        Reload {
            ok: true,
            at: super::unix_now(),
            error: None,
            refused_sha: None,
            writes: 0,
            changes_written: 0,
            longest_wait: std::time::Duration::ZERO,
            waits_over_100ms: 0,
            longest_write: std::time::Duration::ZERO,
        }
    }

    /// Records a reload's outcome; `judged` is the sha256 of the bytes it
    /// judged (none if it could not read them).
    pub fn record(&mut self, r: &Result<String>, judged: Option<String>) {
        self.ok = r.is_ok();
        self.at = super::unix_now();
        self.error = r.as_ref().err().map(|e| e.to_string());
        self.refused_sha = match r {
            Err(Error::ConfigRead { .. }) | Ok(_) => None,
            Err(_) => judged,
        };
    }

    /// A request waited `d` in the owner's queue before it was taken.
    pub fn waited(&mut self, d: std::time::Duration) {
        self.longest_wait = self.longest_wait.max(d);
        self.waits_over_100ms += u64::from(d > std::time::Duration::from_millis(100));
    }

    /// A group's write of the file held the owner `d`.
    pub fn wrote(&mut self, d: std::time::Duration) {
        self.longest_write = self.longest_write.max(d);
    }

    /// A group's one write of the file took `changes` changes.
    pub fn group_written(&mut self, changes: u64) {
        self.writes += 1;
        self.changes_written += changes;
    }

    /// What a followed edit calls for, the file's bytes on disk hashing to
    /// `on_disk` and those in force to `in_force` (pure).
    pub fn follow_step(&self, on_disk: &str, in_force: &str) -> FollowStep {
        if on_disk == in_force {
            if self.ok { FollowStep::Nothing } else { FollowStep::BackInForce }
        } else if self.refused_sha.as_deref() == Some(on_disk) {
            FollowStep::Nothing
        } else {
            FollowStep::Reload
        }
    }

    /// For `status` and /metrics.
    pub fn status(&self, sha256: String, read_only: bool) -> crate::control::ConfigStatus {
        crate::control::ConfigStatus {
            sha256,
            last_reload_success: self.ok,
            last_reload_timestamp_seconds: self.at,
            last_reload_error: self.error.clone(),
            read_only,
            writes: self.writes,
            changes_written: self.changes_written,
            longest_wait_ms: self.longest_wait.as_secs_f64() * 1e3,
            waits_over_100ms: self.waits_over_100ms,
            longest_write_ms: self.longest_write.as_secs_f64() * 1e3,
        }
    }
}

/// A reload, planned: what the rules become and what that changes.
pub(super) struct ReloadPlan {
    /// The file's rules (what ended left out).
    pub file: BTreeMap<RuleKey, RuleSpec>,
    /// The runtime changes kept over it.
    pub overlay: Overlay,
    /// The rules wanted in force: the file's with the overlay laid over.
    pub want: BTreeMap<RuleKey, RuleSpec>,
    pub diff: RuleDiff,
    /// What makes the reload drastic ([`RuleDiff::drastic`]), if anything.
    pub drastic: Option<String>,
}

/// Plans a reload of the rules `file_rules` read from `path` (pure): with
/// `before` in force and `file_before` the file's rules so far, what is in
/// force after. The runtime changes stay over the new file unless
/// `discard_runtime`, but for the bans the state directory keeps
/// (`kept`, `ban --state`), which a reload never lifts. A file with no
/// rules (once what ended is left out) is refused.
pub(super) fn plan(
    path: &str,
    file_rules: &BTreeMap<RuleKey, RuleSpec>,
    before: &BTreeMap<RuleKey, RuleSpec>,
    file_before: &BTreeMap<RuleKey, RuleSpec>,
    discard_runtime: bool,
    kept: &BTreeMap<RuleKey, RuleSpec>,
) -> Result<ReloadPlan> {
    let mut file = file_rules.clone();
    drop_expired(&mut file);
    if file.is_empty() {
        return Err(Error::Invalid(format!("{path}: no rules; nothing changed")));
    }
    let mut overlay = if discard_runtime { Overlay::new() } else { overlay(before, file_before) };
    for (k, s) in kept {
        overlay.entry(k.clone()).or_insert_with(|| Some(s.clone()));
    }
    let want = with_overlay(file.clone(), &overlay);
    let diff = RuleDiff::of(before, &want);
    // What is in force and not yet expired (a ban past its end waits
    // for the next tick): an ended ban is not one the file lifts.
    let mut live = before.clone();
    drop_expired(&mut live);
    let drastic = diff.drastic(&live, &want);
    Ok(ReloadPlan { file, overlay, want, diff, drastic })
}

impl ReloadPlan {
    /// What the reload did, rule by rule, the first 20 then how many more:
    /// the answer's part after the counts.
    pub fn changes_text(&self, before: &BTreeMap<RuleKey, RuleSpec>) -> String {
        let changes = changes(before, &self.want);
        match changes.len() {
            0 => String::new(),
            n if n > 20 => format!(": {}; and {} more", changes[..20].join("; "), n - 20),
            _ => format!(": {}", changes.join("; ")),
        }
    }

    /// The runtime changes kept over the file, as the answer says them.
    pub fn kept_text(&self) -> String {
        let kept = kept_over(&self.overlay, &self.file);
        if kept.is_empty() {
            String::new()
        } else {
            format!(
                "; kept {} runtime change{} over the file's ({}; `policer reload --discard-runtime` drops them)",
                kept.len(),
                if kept.len() == 1 { "" } else { "s" },
                list(&kept)
            )
        }
    }
}

/// What was changed at runtime (`--runtime`), as what differs between
/// the rules in force and the file's: a key set (or set otherwise) at
/// runtime holds its spec, a file rule removed at runtime holds `None`.
/// Derived, not kept: every change keeps the rules in force equal to the
/// file's with this laid over, so there is nothing to keep in step.
pub(super) type Overlay = BTreeMap<RuleKey, Option<RuleSpec>>;

/// The runtime changes of `in_force` over `file` (what ended aside: an
/// ended ban is not a change to keep).
pub(super) fn overlay(in_force: &BTreeMap<RuleKey, RuleSpec>, file: &BTreeMap<RuleKey, RuleSpec>) -> Overlay {
    let (mut in_force, mut file) = (in_force.clone(), file.clone());
    drop_expired(&mut in_force);
    drop_expired(&mut file);
    let mut o: Overlay =
        in_force.iter().filter(|(k, s)| file.get(k) != Some(*s)).map(|(k, s)| (k.clone(), Some(s.clone()))).collect();
    o.extend(file.keys().filter(|k| !in_force.contains_key(k)).map(|k| (k.clone(), None)));
    o
}

/// `file` with the runtime changes laid over it.
pub(super) fn with_overlay(mut file: BTreeMap<RuleKey, RuleSpec>, overlay: &Overlay) -> BTreeMap<RuleKey, RuleSpec> {
    for (k, v) in overlay {
        match v {
            Some(s) => file.insert(k.clone(), s.clone()),
            None => file.remove(k),
        };
    }
    file
}

/// The runtime changes that still differ from the new `file` (one the
/// file now says too is the file's from now on).
fn kept_over(overlay: &Overlay, file: &BTreeMap<RuleKey, RuleSpec>) -> Vec<String> {
    overlay
        .iter()
        .filter(|(k, v)| file.get(k) != v.as_ref())
        .map(|(k, v)| match v {
            Some(_) if k.ban => format!("ban of {}", k.net),
            Some(_) => format!("rule for {k}"),
            None => format!("{k} removed"),
        })
        .collect()
}

/// What a reload did, rule by rule: `+10.0.0.0/8 (action police, rate
/// 1kpps, …)`, `203.0.113.0/24: rate 500pps → 750pps`, `-198.51.100.0/24`
/// (the audit trail's old → new).
fn changes(before: &BTreeMap<RuleKey, RuleSpec>, want: &BTreeMap<RuleKey, RuleSpec>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, new) in want {
        match before.get(k) {
            None => out.push(format!("+{k} ({})", crate::rules::summary(new))),
            Some(old) if old != new => out.push(format!("{k}: {}", crate::rules::changes(old, new).join(", "))),
            Some(_) => {}
        }
    }
    out.extend(before.keys().filter(|k| !want.contains_key(k)).map(|k| format!("-{k}")));
    out
}

/// The first 20 of `items`, then how many more.
fn list(items: &[String]) -> String {
    crate::text::first_few(items.iter().cloned(), 20)
}

/// What a reload changes in the rules in force.
pub(super) struct RuleDiff {
    pub added: usize,
    pub changed: usize,
    pub removed: Vec<RuleKey>,
}

impl RuleDiff {
    pub fn of(before: &BTreeMap<RuleKey, RuleSpec>, want: &BTreeMap<RuleKey, RuleSpec>) -> RuleDiff {
        RuleDiff {
            added: want.keys().filter(|k| !before.contains_key(k)).count(),
            changed: want.iter().filter(|(k, s)| before.get(k).is_some_and(|b| b != *s)).count(),
            removed: before.keys().filter(|k| !want.contains_key(k)).cloned().collect(),
        }
    }

    /// What makes a reload drastic, said as "remove 442 of 443 rules and
    /// every ban (3)": more than half of the rules in force go, or every
    /// ban in force does. `None`: an ordinary change.
    pub fn drastic(&self, before: &BTreeMap<RuleKey, RuleSpec>, want: &BTreeMap<RuleKey, RuleSpec>) -> Option<String> {
        let bans = |m: &BTreeMap<RuleKey, RuleSpec>| m.keys().filter(|k| k.ban).count();
        let (bans_before, bans_after) = (bans(before), bans(want));
        let rules_before = before.len() - bans_before;
        let rules_removed = self.removed.iter().filter(|k| !k.ban).count();
        let most = rules_removed * 2 > rules_before && rules_removed > 0;
        let every_ban = bans_before > 0 && bans_after == 0;
        let what = match (most, every_ban) {
            (false, false) => return None,
            (true, false) => format!("remove {rules_removed} of {rules_before} rules"),
            (false, true) => format!("lift every ban ({bans_before})"),
            (true, true) => {
                format!("remove {rules_removed} of {rules_before} rules and lift every ban ({bans_before})")
            }
        };
        Some(what)
    }

    /// "2 added, 1 changed, 3 removed".
    pub fn counts(&self) -> String {
        format!("{} added, {} changed, {} removed", self.added, self.changed, self.removed.len())
    }

    /// The removed rules, the first 20 by name.
    pub fn removed_list(&self) -> String {
        list(&self.removed.iter().map(|k| k.to_string()).collect::<Vec<_>>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(prefix: &str, rate: &str) -> RuleSpec {
        crate::rules::RuleConfig { prefix: prefix.into(), rate: Some(rate.into()), ..Default::default() }
            .validate()
            .unwrap()
    }

    fn ban(prefix: &str, ttl: &str) -> RuleSpec {
        crate::rules::RuleConfig { prefix: prefix.into(), ban: Some(true), ttl: Some(ttl.into()), ..Default::default() }
            .validate()
            .unwrap()
    }

    fn map(specs: &[&RuleSpec]) -> BTreeMap<RuleKey, RuleSpec> {
        specs.iter().map(|s| (s.key(), (*s).clone())).collect()
    }

    /// A followed edit reloads new bytes, once: bytes refused for what
    /// they say are not tried again until they change; bytes that could
    /// not be read are; the file in force coming back after a refusal is
    /// said once.
    #[test]
    fn a_followed_edit_reloads_new_bytes_once() {
        let mut r = Reload::new();
        assert_eq!(r.follow_step("a", "a"), FollowStep::Nothing);
        assert_eq!(r.follow_step("b", "a"), FollowStep::Reload);
        r.record(&Err(Error::Invalid("bad".into())), Some("b".into()));
        assert_eq!(r.follow_step("b", "a"), FollowStep::Nothing);
        assert_eq!(r.follow_step("c", "a"), FollowStep::Reload);
        assert_eq!(r.follow_step("a", "a"), FollowStep::BackInForce);
        r.record(&Ok(String::new()), None);
        assert_eq!(r.follow_step("a", "a"), FollowStep::Nothing);
        let unread = Error::ConfigRead { path: "x".into(), source: std::io::ErrorKind::NotFound.into() };
        r.record(&Err(unread), Some("d".into()));
        assert_eq!(r.follow_step("d", "a"), FollowStep::Reload);
        r.group_written(3);
        let s = r.status("a".into(), false);
        assert_eq!((s.writes, s.changes_written, s.last_reload_success), (1, 3, false));
    }

    /// A reload's plan: the file's rules with the runtime changes over
    /// them (or not, `discard_runtime`), what that changes and says; a file
    /// without rules is refused.
    #[test]
    fn a_reload_plan_lays_the_runtime_changes_over_the_file() {
        let (all, lab, lab2, other) =
            (spec("0.0.0.0/0", "1kpps"), spec("10.0.0.0/8", "5pps"), spec("10.0.0.0/8", "9pps"), spec("::/0", "1kpps"));
        let file_before = map(&[&all, &lab]);
        // At runtime: the lab's rule changed.
        let before = map(&[&all, &lab2]);
        let new = map(&[&all, &lab, &other]);
        let p = plan("f.toml", &new, &before, &file_before, false, &BTreeMap::new()).unwrap();
        assert_eq!(p.want, map(&[&all, &lab2, &other]));
        assert_eq!(p.diff.counts(), "1 added, 0 changed, 0 removed");
        assert_eq!(p.drastic, None);
        assert_eq!(p.changes_text(&before), format!(": +::/0 ({})", crate::rules::summary(&other)));
        assert!(p.kept_text().starts_with("; kept 1 runtime change over the file's (rule for 10.0.0.0/8;"));
        let p = plan("f.toml", &map(&[&other]), &before, &file_before, true, &BTreeMap::new()).unwrap();
        assert_eq!(p.want, map(&[&other]));
        assert_eq!(p.drastic.as_deref(), Some("remove 2 of 2 rules"));
        assert_eq!(p.kept_text(), "");
        // The bans the state directory keeps stay, --discard-runtime too.
        let b = ban("198.18.0.0/24", "1h");
        let kept = map(&[&b]);
        let p = plan("f.toml", &map(&[&other]), &map(&[&all, &lab2, &b]), &file_before, true, &kept).unwrap();
        assert_eq!(p.want, map(&[&other, &b]));
        let e = plan("f.toml", &BTreeMap::new(), &before, &file_before, false, &BTreeMap::new()).err().unwrap();
        assert_eq!(e.to_string(), "f.toml: no rules; nothing changed");
    }

    /// What `--runtime` changed is what differs from the file; laid over a
    /// new file it keeps those changes and takes the file's for the rest.
    #[test]
    fn runtime_changes_are_laid_over_a_new_file() {
        let (all, lab, lab2, other) =
            (spec("0.0.0.0/0", "1kpps"), spec("10.0.0.0/8", "5pps"), spec("10.0.0.0/8", "9pps"), spec("::/0", "1kpps"));
        let b = ban("198.18.0.0/24", "1h");
        // Runtime: a ban added, the lab's rule changed, `::/0` removed.
        let file = map(&[&all, &lab, &other]);
        let in_force = map(&[&all, &lab2, &b]);
        let o = overlay(&in_force, &file);
        assert_eq!(o.len(), 3);
        assert_eq!(o[&b.key()], Some(b.clone()));
        assert_eq!(o[&lab.key()], Some(lab2.clone()));
        assert_eq!(o[&other.key()], None);
        // Nothing runtime: nothing to lay over.
        assert!(overlay(&file, &file).is_empty());

        // A new file changes the default rule and, itself, drops `::/0`.
        let all2 = spec("0.0.0.0/0", "2kpps");
        let new = map(&[&all2, &lab]);
        let want = with_overlay(new.clone(), &o);
        assert_eq!(want, map(&[&all2, &lab2, &b]));
        // `::/0` is gone from the file too: no longer a runtime change.
        let kept = kept_over(&o, &new);
        assert_eq!(kept, ["rule for 10.0.0.0/8", "ban of 198.18.0.0/24"], "{kept:?}");
    }

    /// An ended ban is not a runtime change to keep, in force or in the file.
    #[test]
    fn ended_bans_are_not_runtime_changes() {
        let all = spec("0.0.0.0/0", "1kpps");
        let mut ended = ban("198.18.0.0/24", "1h");
        ended.expires = Some(1);
        assert!(overlay(&map(&[&all, &ended]), &map(&[&all])).is_empty());
        assert!(overlay(&map(&[&all]), &map(&[&all, &ended])).is_empty());
    }
}
