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
    rules::{RuleConfig, RuleSpec},
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

    pub fn is_empty(&self) -> bool {
        self.free.is_empty()
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
        self.rules.keys().all(|n| n.prefix_len() == 0)
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
        let rule = |d: &Daemon, net: &str| -> Result<Option<Rule>> {
            let net: IpNet = net.parse().expect("literal");
            d.rules.get(&net).map(|i| Ok(i.spec.kernel(i.id)?.with_counter_slot(i.slot))).transpose()
        };
        let (v4, v6) = (rule(self, "0.0.0.0/0")?, rule(self, "::/0")?);
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
    pub(super) fn specs(&self) -> BTreeMap<IpNet, RuleSpec> {
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
    pub(super) fn apply(&mut self, want: &BTreeMap<IpNet, RuleSpec>) -> Result<()> {
        // A more specific prefix is about to exist: back to the tries first,
        // so no packet is judged by a default rule it no longer falls under.
        if self.fast != 0 && want.keys().any(|n| n.prefix_len() != 0) {
            self.policer.set_fast_path(0)?;
            self.fast = 0;
        }
        let r = self.apply_rules(want);
        // Whatever happened, the fast path follows the rules now in force.
        self.sync_fast_path()?;
        r
    }

    fn apply_rules(&mut self, want: &BTreeMap<IpNet, RuleSpec>) -> Result<()> {
        if want.len() > self.slots.capacity() as usize {
            return Err(Error::Invalid(format!(
                "rule limit reached: {} rules, more than this policer's limit of {} (`--max-rules`, or max_rules in [daemon]; \
                 a larger limit replaces the program at the next start, its buckets starting empty)",
                want.len(),
                self.slots.capacity()
            )));
        }
        // Prefixes this change removes. They go last (no frame falls to a
        // shorter prefix before its new rule is in), except when the limit
        // is reached: then one goes first to make room for a new one.
        let mut gone: Vec<IpNet> = self.rules.keys().filter(|n| !want.contains_key(n)).copied().collect();
        for (net, spec) in want {
            let slot = match self.rules.get(net) {
                Some(i) if &i.spec == spec => continue,
                Some(i) => i.slot,
                None => {
                    if self.slots.is_empty()
                        && let Some(g) = gone.pop()
                    {
                        self.remove_one(g)?;
                    }
                    let slot = self.slots.take()?;
                    if let Err(e) = self.policer.reset_rule_counters(slot) {
                        self.slots.free(slot);
                        return Err(e);
                    }
                    slot
                }
            };
            let id = self.next_id;
            if let Err(e) = install(&mut self.policer, *net, spec, id, slot) {
                if !self.rules.contains_key(net) {
                    self.slots.free(slot);
                }
                return Err(e);
            }
            self.next_id += 1;
            self.rules.insert(*net, Installed { spec: spec.clone(), id, slot, persisted: false });
        }
        for net in gone {
            self.remove_one(net)?;
        }
        Ok(())
    }

    fn remove_one(&mut self, net: IpNet) -> Result<()> {
        self.policer.remove_rule(net)?;
        if let Some(i) = self.rules.remove(&net) {
            self.slots.free(i.slot);
        }
        Ok(())
    }

    /// `policer rule set`: in the kernel, then in the file (unless
    /// `runtime`); if the file cannot be written the kernel change is
    /// undone.
    pub(super) fn rule_set(&mut self, rc: &RuleConfig, runtime: bool) -> Result<String> {
        let spec = rc.validate()?;
        let net = spec.net;
        self.change(runtime, |want| {
            want.insert(net, spec.clone());
        })?;
        let existed_note = if runtime { " (runtime only: not written to the config file)" } else { "" };
        Ok(format!("set the rule for {net}{existed_note}"))
    }

    /// `policer rule rm`. Without `runtime` it also takes a prefix the
    /// file has but the kernel no longer does (removed earlier with
    /// `--runtime`), so that removal can be made to stick.
    pub(super) fn rule_rm(&mut self, prefix: &str, runtime: bool) -> Result<String> {
        let net = crate::rules::parse_prefix(prefix)?;
        let in_file = !runtime && self.file_rules.contains_key(&net);
        if !self.rules.contains_key(&net) && !in_file {
            return Err(Error::Invalid(format!("no rule for {net} (see `policer rule ls`)")));
        }
        self.change(runtime, |want| {
            want.remove(&net);
        })?;
        let note = if runtime { " (runtime only: the config file still has it)" } else { "" };
        Ok(format!("removed the rule for {net}{note}"))
    }

    /// One change of the rules: `edit` applied to the kernel's rules and,
    /// unless `runtime`, to the file's. All or nothing, in an order that
    /// keeps it so: the new file is staged (a hand edit, a full disk or a
    /// read-only file refuses the change before the kernel is touched),
    /// then the kernel changes, then the file is put in place.
    fn change(&mut self, runtime: bool, edit: impl Fn(&mut BTreeMap<IpNet, RuleSpec>)) -> Result<()> {
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
    fn undo(&mut self, before: &BTreeMap<IpNet, RuleSpec>, e: Error) -> Error {
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
        let want = snap.rules.clone();
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

/// Installs a rule (one atomic update of its prefix), after setting the
/// new-source limiter of its counter slot.
fn install(p: &mut Policer, net: IpNet, spec: &RuleSpec, id: u32, slot: u32) -> Result<()> {
    let rule = prepare(p, spec, id, slot)?;
    p.set_rule(net, &rule)
}

/// Sets the new-source limiter of the rule's counter slot; returns the
/// kernel value of the rule, ready to install.
pub(super) fn prepare(p: &mut Policer, spec: &RuleSpec, id: u32, slot: u32) -> Result<Rule> {
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
    Ok(spec.kernel(id)?.with_counter_slot(slot))
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
