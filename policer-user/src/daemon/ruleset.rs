//! The rule set: reconciling rules into the kernel's maps (counter slots,
//! new-source limiters, the default-rules fast path) and into the config
//! file. Only the owner thread calls these.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use ipnet::IpNet;
use policer_common::{NewSources, Rule, rate::Rate};

use super::{Daemon, Installed, monotonic_ns};
use crate::{
    config::Change,
    error::{Error, Result},
    loader::Policer,
    netlink,
    rules::{RuleConfig, RuleKey, RuleSpec},
};

/// Allocates rule counter slots; slot 0 is shared by rules past the last.
pub(super) struct Slots {
    /// Slots 1..=capacity not in use, lowest first.
    free: std::collections::BTreeSet<u32>,
    capacity: u32,
}

impl Slots {
    /// Slots 1..=capacity (the program's rule limit), all free.
    pub fn new(capacity: u32) -> Slots {
        Slots { free: (1..=capacity).collect(), capacity }
    }

    /// The lowest free slot; an error at the rule limit.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn take(&mut self) -> Result<u32> {
        self.free.pop_first().ok_or_else(|| {
            Error::Invalid(format!(
                "rule limit reached: this policer holds {} rules (`--max-rules`, or `max_rules` in \
                 [daemon]; a larger limit replaces the program at the next start, its buckets starting empty)",
                self.capacity
            ))
        })
    }

    /// Marks a slot an adopted rule already uses; false when the slot is
    /// not one of ours (0, or past the limit): the rule needs a new one.
    pub fn mark_used(&mut self, s: u32) -> bool {
        self.free.remove(&s)
    }

    pub fn free(&mut self, s: u32) {
        if s != 0 {
            self.free.insert(s);
        }
    }
}

impl Daemon {
    /// Whether every rule is for 0.0.0.0/0 or ::/0.
    fn only_defaults(&self) -> bool {
        self.rules.keys().all(|k| k.net.prefix_len() == 0) && !self.has_set_entries()
    }

    /// Turns the default-rules fast path on (with the current default rules)
    /// when only default rules exist, off otherwise. The rules go into the
    /// pair not in use, then one u32 write switches readers over, so no
    /// packet sees a rule half written; switches are at least 1 ms apart so
    /// a reader of the pair before last (a program run lasts microseconds)
    /// is long gone before that pair is rewritten.
    pub(super) fn sync_fast_path(&mut self) -> Result<()> {
        if !self.only_defaults() {
            if self.fast != 0 {
                self.policer.set_fast_path(0)?;
                self.fast = 0;
            }
            return Ok(());
        }
        // The compiled values: with the group of the prefix's classes.
        let rule = |d: &Daemon, net: &str| -> Option<Rule> {
            let net: IpNet = net.parse().expect("literal");
            d.compiled.prefixes.get(&net).copied()
        };
        let (v4, v6) = (rule(self, "0.0.0.0/0"), rule(self, "::/0"));
        let next = if self.fast == 1 { 2 } else { 1 };
        if let Some(t) = self.last_flip {
            let since = t.elapsed();
            if since < Duration::from_millis(1) {
                std::thread::sleep(Duration::from_millis(1) - since);
            }
        }
        self.policer.set_default_rules(next - 1, v4, v6)?;
        self.policer.set_fast_path(next)?;
        self.fast = next;
        self.last_flip = Some(Instant::now());
        Ok(())
    }

    /// The rules in force in the kernel.
    pub(super) fn specs(&self) -> BTreeMap<RuleKey, RuleSpec> {
        self.rules.iter().map(|(n, i)| (*n, i.spec.clone())).collect()
    }

    /// A rule is persisted when the config file holds it as it is in force.
    pub(super) fn mark_persisted(&mut self) {
        for (net, i) in self.rules.iter_mut() {
            i.persisted = self.file_rules.get(net) == Some(&i.spec);
        }
    }

    /// Applies `want` (already validated) to the kernel: changed and new
    /// prefixes first, removed ones last, each one atomic for its prefix.
    pub(super) fn apply(&mut self, want: &BTreeMap<RuleKey, RuleSpec>) -> Result<()> {
        // A more specific prefix is about to exist: back to the tries first,
        // so no packet is judged by a default rule it no longer falls under.
        if self.fast != 0 && want.keys().any(|k| k.net.prefix_len() != 0) {
            self.policer.set_fast_path(0)?;
            self.fast = 0;
        }
        let bans = self.ban_values();
        let r = self.apply_rules(want).and_then(|()| self.follow_bans(&bans));
        // Whatever happened, the fast path follows the rules now in force.
        self.sync_fast_path()?;
        r
    }

    fn apply_rules(&mut self, want: &BTreeMap<RuleKey, RuleSpec>) -> Result<()> {
        if want.len() > self.slots.capacity() as usize {
            return Err(Error::Invalid(format!(
                "rule limit reached: {} rules, more than this policer's limit of {} (`--max-rules`, or max_rules in [daemon]; \
                 a larger limit replaces the program at the next start, its buckets starting empty)",
                want.len(),
                self.slots.capacity()
            )));
        }
        // The rules as they will be: kept ones as they are, changed ones
        // with a new id in their slot, new ones in a free slot (at the
        // limit, one a removed rule frees).
        let mut gone: Vec<u32> =
            self.rules.iter().filter(|(k, _)| !want.contains_key(k)).map(|(_, i)| i.slot).collect();
        let mut taken: Vec<u32> = Vec::new();
        let mut reused: Vec<u32> = Vec::new();
        let mut next: BTreeMap<RuleKey, Installed> = BTreeMap::new();
        let mut id = self.next_id;
        let r = (|| -> Result<()> {
            for (key, spec) in want {
                let inst = match self.rules.get(key) {
                    Some(i) if &i.spec == spec => i.clone(),
                    Some(i) => {
                        id += 1;
                        Installed { spec: spec.clone(), id, slot: i.slot, persisted: false }
                    }
                    None => {
                        let slot = match self.slots.take() {
                            Ok(s) => {
                                taken.push(s);
                                s
                            }
                            Err(e) => {
                                let s = gone.pop().ok_or(e)?;
                                reused.push(s);
                                s
                            }
                        };
                        id += 1;
                        Installed { spec: spec.clone(), id, slot, persisted: false }
                    }
                };
                next.insert(*key, inst);
            }
            Ok(())
        })();
        let undo_slots = |d: &mut Daemon, taken: &[u32]| {
            for s in taken {
                d.slots.free(*s);
            }
        };
        if let Err(e) = r {
            undo_slots(self, &taken);
            return Err(e);
        }
        // Everything the kernel will hold, worked out before anything is
        // written: a tie or too many classes changes nothing.
        let mut groups = self.groups.clone();
        let compiled = next
            .iter()
            .map(|(k, i)| {
                Ok(crate::compile::KernelRule {
                    net: k.net,
                    class: k.class,
                    rule: i.spec.kernel(i.id)?.with_counter_slot(i.slot),
                    ban: k.ban,
                })
            })
            .collect::<Result<Vec<_>>>()
            .and_then(|rules| crate::compile::compile(&rules, &mut groups));
        let compiled = match compiled {
            Ok(c) => c,
            Err(e) => {
                undo_slots(self, &taken);
                return Err(e);
            }
        };
        // Counters, new-source limiters and totals of new and changed rules.
        let r = (|| -> Result<()> {
            for (key, i) in &next {
                let old = self.rules.get(key);
                if old.is_some_and(|o| o.id == i.id) {
                    continue;
                }
                if old.is_none() {
                    self.policer.reset_rule_counters(i.slot)?;
                }
                prepare(&mut self.policer, &i.spec, i.slot)?;
                if old.is_none_or(|o| o.spec.total != i.spec.total) {
                    let total = i.spec.total_limiter()?.map(|limiter| policer_common::class::Total {
                        tat: limiter.empty_tat(monotonic_ns()),
                        limiter,
                    });
                    self.policer.set_total(i.slot, total.as_ref())?;
                }
            }
            self.policer.sync_rules_from(&self.compiled, &compiled)
        })();
        if let Err(e) = r {
            undo_slots(self, &taken);
            // The maps may hold part of the change: what they hold is read
            // back, so that putting the rules back diffs against it.
            match self.policer.kernel_compiled() {
                Ok(now) => self.compiled = self.without_set_entries(now),
                Err(k) => log::warn!("reading the rule maps back after a failed change: {k}"),
            }
            return Err(e);
        }
        for s in gone {
            self.slots.free(s);
        }
        let _ = reused;
        self.next_id = id + 1;
        self.rules = next;
        self.groups = groups;
        self.compiled = compiled;
        Ok(())
    }

    /// `policer rule set`: in the kernel, then in the file (unless
    /// `runtime`); if the file cannot be written the kernel change is
    /// undone.
    pub(super) fn rule_set(&mut self, rc: &RuleConfig, runtime: bool) -> Result<String> {
        let spec = rc.validate()?;
        let key = spec.key();
        self.change(runtime, |want| {
            want.insert(key, spec.clone());
        })?;
        let existed_note = if runtime { " (runtime only: not written to the config file)" } else { "" };
        Ok(format!("set the rule for {key}{existed_note}"))
    }

    /// `policer rule rm`. Without `runtime` it also takes a prefix the
    /// file has but the kernel no longer does (removed earlier with
    /// `--runtime`), so that removal can be made to stick.
    pub(super) fn rule_rm(&mut self, rule: &RuleConfig, runtime: bool) -> Result<String> {
        let key = rule.key()?;
        let in_file = !runtime && self.file_rules.contains_key(&key);
        if !self.rules.contains_key(&key) && !in_file {
            return Err(Error::Invalid(format!("no rule for {key} (see `policer rule ls`)")));
        }
        self.change(runtime, |want| {
            want.remove(&key);
        })?;
        let note = if runtime { " (runtime only: the config file still has it)" } else { "" };
        Ok(format!("removed the rule for {key}{note}"))
    }

    /// One change of the rules: `edit` applied to the kernel's rules and,
    /// unless `runtime`, to the file's. All or nothing, in an order that
    /// keeps it so: the new file is staged (a hand edit, a full disk or a
    /// read-only file refuses the change before the kernel is touched),
    /// then the kernel changes, then the file is put in place.
    pub(super) fn change(&mut self, runtime: bool, edit: impl Fn(&mut BTreeMap<RuleKey, RuleSpec>)) -> Result<()> {
        if !runtime && self.file.read_only() {
            return Err(Error::Invalid(format!(
                "{} is read-only (a ConfigMap or a read-only mount: change the file at its source, \
                 the daemon follows it); nothing changed (`--runtime` applies the change to the kernel only, \
                 not persisted)",
                self.file.path().display()
            )));
        }
        let before = self.specs();
        let mut want = before.clone();
        edit(&mut want);
        self.refuse_set_prefixes(&want)?;
        // Classes that tie or crowd a frame: refused before anything is
        // staged or written.
        crate::compile::check_rules(want.values())?;
        let staged = if runtime {
            None
        } else {
            let mut file = self.file_rules.clone();
            edit(&mut file);
            let pending = self.file.stage(Change { rules: Some(&file), interfaces: None }).map_err(|e| {
                if e.is_config_not_written() {
                    Error::Invalid(format!(
                        "{e}; nothing changed (`--runtime` applies the change to the kernel only, not persisted)"
                    ))
                } else {
                    e
                }
            })?;
            Some((pending, file))
        };
        if let Err(e) = self.apply(&want) {
            // Back to what was in force (apply_rules stops at the first
            // failure); the staged file is dropped, and so removed.
            return Err(self.undo(&before, e));
        }
        if let Some((pending, file)) = staged {
            if let Err(e) = self.file.commit(pending) {
                return Err(self.undo(&before, e));
            }
            self.file_rules = file;
        }
        self.mark_persisted();
        Ok(())
    }

    /// Puts the rules in force back to `before` after `e`; the error to
    /// report (saying so if putting them back failed too).
    fn undo(&mut self, before: &BTreeMap<RuleKey, RuleSpec>, e: Error) -> Error {
        let r = self.apply(before);
        self.mark_persisted();
        match r {
            Ok(()) => e,
            Err(u) => {
                Error::Invalid(format!("{e}; and putting the rules back failed too: {u} (see `policer rule ls`)"))
            }
        }
    }

    /// Re-reads the config file; applies it only if all of it is valid.
    /// Rules set with `--runtime` give way to the file's.
    pub(super) fn reload(&mut self) -> Result<String> {
        let r = self.reload_file();
        self.reload_ok = r.is_ok();
        self.reload_at = super::unix_now();
        match &r {
            Ok(_) => self.refused_sha = None,
            Err(_) => self.refused_sha = self.file.sha256_on_disk(),
        }
        r
    }

    /// The config file's directory changed: reloads when the file's bytes
    /// differ from those in force and from a file already refused. An
    /// empty message: nothing to do (the daemon's own write, a touch, a
    /// file next to it).
    pub(super) fn follow(&mut self) -> Result<String> {
        let Some(now) = self.file.sha256_on_disk() else {
            // Gone (between two steps of a swap, or removed): keep running.
            return Ok(String::new());
        };
        if now == self.file.sha256() {
            if self.reload_ok {
                return Ok(String::new());
            }
            // Back to the file in force after a refused one.
            self.reload_ok = true;
            self.reload_at = super::unix_now();
            self.refused_sha = None;
            return Ok(format!("{} is the file in force again", self.file.path().display()));
        }
        if self.refused_sha.as_deref() == Some(now.as_str()) {
            return Ok(String::new());
        }
        self.reload()
    }

    fn reload_file(&mut self) -> Result<String> {
        let snap = self.file.read()?;
        let mut want = snap.rules.clone();
        super::bans::drop_expired(&mut want);
        self.refuse_set_prefixes(&want)?;
        if want.is_empty() {
            return Err(Error::Invalid(format!("{}: no rules; nothing changed", self.file.path().display())));
        }
        let before = self.specs();
        if let Err(e) = self.apply(&want) {
            let _ = self.apply(&before);
            return Err(e);
        }
        let note = if snap.config.daemon != self.file.config().daemon {
            " ([daemon] settings apply at the next start)"
        } else {
            ""
        };
        // Only now that its rules are in force is the file what we run from.
        self.file.accept(snap);
        self.file_rules = want.clone();
        self.mark_persisted();
        Ok(format!("reloaded {}: {} rules{note}", self.file.path().display(), want.len()))
    }

    /// Detaches `name`; true when no interface is left.
    pub(super) fn detach(&mut self, name: &str) -> Result<bool> {
        let pos = self
            .ifaces
            .iter()
            .position(|i| i.name == name)
            .ok_or_else(|| Error::Invalid(format!("{name} is not policed by this daemon")))?;
        let fd = self.policer.prog_fd()?;
        let i = &self.ifaces[pos];
        netlink::set(i.index, -1, i.mode_flags, Some(fd))
            .map_err(|source| Error::Netlink { iface: name.into(), source })?;
        self.ifaces.remove(pos);
        let left: Vec<String> = self.file.config().daemon.interfaces.iter().filter(|n| *n != name).cloned().collect();
        if let Err(e) = self.file.set_interfaces(&left) {
            log::warn!("{name} detached, but the config file still lists it: {e}");
        }
        Ok(self.ifaces.is_empty())
    }
}

/// Sets the new-source limiter of the rule's counter slot.
pub(super) fn prepare(p: &mut Policer, spec: &RuleSpec, slot: u32) -> Result<()> {
    // Rate and burst in the same unit: packets, or bytes in byte mode.
    let rate = match (spec.action.polices(), spec.rate) {
        (true, Some(Rate::Pps(r))) => Some(r),
        (true, Some(Rate::Bps(b))) => Some(b / 8),
        _ => None,
    };
    let ns = match rate {
        Some(r) => NewSources::for_rule(r, spec.burst, p.max_sources()?, monotonic_ns()),
        None => NewSources::default(),
    };
    p.set_new_sources(slot, &ns)?;
    p.set_ban_params(slot, spec.ban_params().as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first_and_end_at_the_limit() {
        let mut s = Slots::new(8);
        assert!(s.mark_used(1));
        assert!(!s.mark_used(0), "slot 0 is never a rule's");
        assert!(!s.mark_used(9), "past the limit");
        assert_eq!(s.take().unwrap(), 2);
        assert_eq!(s.take().unwrap(), 3);
        s.free(2);
        assert_eq!(s.take().unwrap(), 2);
        for _ in 4..=8 {
            s.take().unwrap();
        }
        let e = s.take().unwrap_err().to_string();
        assert!(e.contains("rule limit reached") && e.contains("8 rules"), "{e}");
        s.free(0);
        assert!(s.take().is_err(), "slot 0 is never handed out");
    }
}
