//! The rule set: the owner's one record of the rules in force, and
//! reconciling rules into the kernel's maps (counter slots, new-source
//! limiters, totals, the default-rules fast path) and into the config
//! file. Only the owner thread calls these.
//!
//! Every change is "want → plan → write → commit": [`RuleSet::plan`] (pure,
//! `plan.rs`) works out the change, [`Daemon::apply_plan`] writes it to the
//! kernel, and [`RuleSet::commit`] takes it as the state in force. Nothing
//! else writes the rule state.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::{Duration, Instant},
};

use ipnet::IpNet;
use policer_common::{NewSources, Rule, rate::Rate};

use super::{
    monotonic_ns,
    plan::{HeldRule, Plan},
};
use crate::{
    compile::{Compiled, Groups},
    error::{Error, Result},
    loader::Policer,
    protect::Protect,
    rules::{RuleKey, RuleSpec},
};

/// Allocates rule counter slots; slot 0 is shared by rules past the last.
pub(super) struct Slots {
    /// Slots 1..=capacity not in use, lowest first.
    free: BTreeSet<u32>,
    capacity: u32,
}

impl Slots {
    /// Slots 1..=capacity (the program's rule limit), all free.
    pub fn new(capacity: u32) -> Slots {
        Slots { free: (1..=capacity).collect(), capacity }
    }

    /// The rule limit.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// The lowest free slot; an error at the rule limit.
    pub fn take(&mut self) -> Result<u32> {
        self.free.pop_first().ok_or_else(|| super::plan::limit(format!("this policer holds {} rules", self.capacity)))
    }

    /// Marks a slot an adopted rule already uses; false when the slot is
    /// not one of ours (0, or past the limit) or already used: the rule
    /// needs a new one.
    pub fn mark_used(&mut self, s: u32) -> bool {
        self.free.remove(&s)
    }

    pub fn free(&mut self, s: u32) {
        if s != 0 && s <= self.capacity {
            self.free.insert(s);
        }
    }

    /// How many slots are free.
    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    /// The free slots, lowest first.
    pub fn free_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.free.iter().copied()
    }
}

/// The owner's rule state: the rules in force with their kernel ids and
/// counter slots, the rules the config file holds, the slots, the class
/// groups, what the rule maps hold, and the default-rules fast path.
/// Changed only through its methods.
pub(super) struct RuleSet {
    /// Shared with the views' snapshot (a persistent map: published
    /// without a copy); a change plans a new map and takes it whole.
    rules: super::Rules,
    /// The rules the config file holds (as last read or written): where
    /// they differ from the rules in force.
    file_rules: FileRules,
    /// How many class rules each prefix has (`plan_edits` plans around
    /// them).
    class_nets: BTreeMap<IpNet, u32>,
    /// Kept as the rules change, so that no change or view walks them all:
    /// the file's rules not in force (removed with `--runtime`), the
    /// manual bans' counter slots (sorted), and the rules that end, by
    /// when.
    removed_at_runtime: BTreeMap<RuleKey, RuleSpec>,
    ban_slots: std::sync::Arc<Vec<u32>>,
    expiring: std::collections::BTreeSet<(u64, RuleKey)>,
    slots: Slots,
    /// The group ids of prefixes with classes.
    groups: Groups,
    /// What the kernel's rule maps hold for the rules (set entries aside).
    compiled: Compiled,
    /// The next rule id not yet used.
    next_id: u32,
    /// Default-rules fast path: 0 off, else the pair of DEFAULT_RULES in use.
    fast: u32,
    last_flip: Option<Instant>,
    /// Prefixes no rule may drop (`protect` in [daemon]).
    protect: Protect,
    /// The protected prefixes the set entries under manual bans were last
    /// written for (a reload that changes `protect` rewrites them).
    entries_protect: Protect,
    /// A temporary change's rule to come back (`rule set P … --ttl` over a
    /// rule without an end), by key, for a rule the config file does not
    /// hold (the file's rule comes back where it holds one: see
    /// [`RuleSet::back_at_end`]). Kept while that key's rule in force has
    /// an end.
    restore: BTreeMap<RuleKey, std::sync::Arc<RuleSpec>>,
    /// Counts the changes of what a plan is made against (rules, slots,
    /// ids, groups, protected prefixes, the rule maps): a plan made at
    /// another generation is made again before it is written.
    generation: u64,
}

impl RuleSet {
    /// No rule in force yet; the kernel's rule maps hold `compiled` (an
    /// adopted program's), `slots` has what they hold marked used.
    pub fn new(slots: Slots, groups: Groups, compiled: Compiled, next_id: u32) -> RuleSet {
        RuleSet {
            rules: Default::default(),
            file_rules: FileRules::default(),
            class_nets: BTreeMap::new(),
            removed_at_runtime: BTreeMap::new(),
            ban_slots: Default::default(),
            expiring: Default::default(),
            restore: BTreeMap::new(),
            slots,
            groups,
            compiled,
            next_id,
            fast: 0,
            last_flip: None,
            protect: Protect::default(),
            entries_protect: Protect::default(),
            generation: 0,
        }
    }

    /// What a plan made now is made against ([`RuleSet::generation`]'s
    /// field): equal later, the plan still holds.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Plans bringing the rules in force to `want` (see `plan.rs`).
    pub fn plan(&self, want: &BTreeMap<RuleKey, RuleSpec>) -> Result<Plan> {
        let held: BTreeMap<RuleKey, HeldRule<'_>> =
            self.rules.iter().map(|(k, i)| (k.clone(), HeldRule::from(i))).collect();
        super::plan::plan(
            &held,
            want,
            &self.protect,
            self.slots.free_slots(),
            self.slots.capacity(),
            &self.groups,
            self.next_id,
        )
    }

    /// Plans `edits` (`Some` sets the rule, `None` removes it; a key may
    /// come more than once, the last counts) made to the rules in force:
    /// at a cost that grows with the edits ([`super::plan::plan_edits`])
    /// where it can, else by the whole plan of the rules with the edits.
    pub fn plan_edits(&self, edits: &[(RuleKey, Option<RuleSpec>)]) -> Result<Plan> {
        let last: BTreeMap<RuleKey, Option<RuleSpec>> = edits.iter().cloned().collect();
        let now = super::plan::InForce {
            rules: &self.rules,
            compiled: &self.compiled,
            class_nets: &self.class_nets,
            groups: &self.groups,
            protect: &self.protect,
            capacity: self.slots.capacity(),
            next_id: self.next_id,
        };
        let planned = super::plan::plan_edits(&now, &last, self.slots.free_slots());
        #[cfg(test)]
        self.check_plan_edits(edits, &planned);
        match planned? {
            Some(plan) => Ok(plan),
            None => {
                let mut want = self.specs();
                edit_rules(&mut want, edits);
                self.plan(&want)
            }
        }
    }

    /// Tests: a plan of edits is the whole plan of the rules with the edits
    /// made — the same rules, ids, slots, writes and groups, and the rule
    /// maps in force with its delta made are the whole plan's (or both
    /// fail alike).
    #[cfg(test)]
    fn check_plan_edits(&self, edits: &[(RuleKey, Option<RuleSpec>)], planned: &Result<Option<Plan>>) {
        let mut want = self.specs();
        edit_rules(&mut want, edits);
        let whole = self.plan(&want);
        let plan = match (planned, whole) {
            (Ok(None), _) => return,
            (Err(a), Err(b)) => {
                assert_eq!(a.to_string(), b.to_string(), "a plan of edits fails as the whole plan does");
                return;
            }
            (Ok(Some(p)), Ok(w)) => {
                PLANNED_EDITS.with(|n| n.set(n.get() + 1));
                let rows = |r: &super::Rules| -> Vec<(RuleKey, RuleSpec, u32, u32)> {
                    r.iter().map(|(k, i)| (k.clone(), (*i.spec).clone(), i.id, i.slot)).collect()
                };
                assert_eq!(rows(&p.rules), rows(&w.rules), "the rules");
                assert_eq!((&p.writes, &p.taken, &p.freed, p.next_id), (&w.writes, &w.taken, &w.freed, w.next_id));
                assert_eq!(p.groups, w.groups, "the class groups");
                (p, w)
            }
            (a, b) => panic!("a plan of edits {:?} where the whole plan {:?}", a.as_ref().map(|_| ()), b.map(|_| ())),
        };
        let (p, w) = plan;
        assert!(p.delta.is_some(), "a plan of edits has a delta");
        assert_eq!(p.compiled_after(&self.compiled), w.compiled, "the rule maps after the delta");
    }

    /// Tests: what is kept as the rules change is what a walk of them all
    /// finds.
    #[cfg(test)]
    fn check_kept(&self) {
        let expiring: std::collections::BTreeSet<(u64, RuleKey)> =
            self.rules.iter().filter_map(|(k, i)| i.spec.expires.map(|e| (e, k.clone()))).collect();
        assert_eq!(self.expiring, expiring, "the rules that end");
        assert_eq!(self.ban_slots, manual_ban_slots(self.rules.iter(), |i| i.slot), "the ban slots");
        assert_eq!(self.removed_at_runtime, removed_at_runtime(&self.file_rules, &self.rules), "removed at runtime");
        for (k, i) in &self.rules {
            assert_eq!(i.persisted, !self.file_rules.differs.contains_key(k), "{k} persisted");
        }
        // Only differences are kept: no file rule equal to the rule in
        // force, no absence of a rule not in force.
        for (k, f) in &self.file_rules.differs {
            let now = self.rules.get(k).map(|i| &*i.spec);
            assert_ne!(f.as_deref(), now, "{k}: kept as a difference, the same as in force");
        }
    }

    /// How many counter slots are free (a dry run's check for a new set).
    pub fn free_slot_count(&self) -> usize {
        self.slots.free_count()
    }

    /// The rule limit.
    pub fn capacity(&self) -> u32 {
        self.slots.capacity()
    }

    /// The protected prefixes plans keep.
    pub fn protect(&self) -> &Protect {
        &self.protect
    }

    /// Sets the protected prefixes of the next plans (a reload's new list).
    pub fn set_protect(&mut self, p: Protect) {
        self.generation += 1;
        self.protect = p;
    }

    /// The protected prefixes the set entries under bans were written for.
    pub fn entries_protect(&self) -> &Protect {
        &self.entries_protect
    }

    pub fn set_entries_protect(&mut self, p: Protect) {
        self.entries_protect = p;
    }

    /// Takes `plan` as the state in force, once the kernel holds it.
    pub fn commit(&mut self, plan: Plan) {
        self.generation += 1;
        for s in &plan.taken {
            self.slots.mark_used(*s);
        }
        for s in &plan.freed {
            self.slots.free(*s);
        }
        let mut rules = plan.rules;
        match plan.delta {
            Some(delta) => {
                // Only the edited rules are new: the rest keep what they had.
                for k in &delta.keys {
                    // What the file holds for `k` does not change: kept
                    // against the new rule in force.
                    let file = self.file_rules.get(&self.rules, k).cloned();
                    self.file_rules.set(&rules, k, file);
                    if let Some(i) = rules.get_mut(k) {
                        i.persisted = !self.file_rules.differs.contains_key(k);
                    }
                    let (old, new) = (self.rules.get(k), rules.get(k));
                    if let Some(e) = old.and_then(|i| i.spec.expires) {
                        self.expiring.remove(&(e, k.clone()));
                    }
                    if let Some(e) = new.and_then(|i| i.spec.expires) {
                        self.expiring.insert((e, k.clone()));
                    }
                    if k.ban && old.map(|i| i.slot) != new.map(|i| i.slot) {
                        let slots = std::sync::Arc::make_mut(&mut self.ban_slots);
                        if let Some(at) = old.and_then(|i| slots.binary_search(&i.slot).ok()) {
                            slots.remove(at);
                        }
                        if let Some(i) = new {
                            let at = slots.binary_search(&i.slot).unwrap_or_else(|at| at);
                            slots.insert(at, i.slot);
                        }
                    }
                    runtime_removal(&mut self.removed_at_runtime, &self.file_rules, &rules, k);
                }
                for (net, v) in delta.prefixes {
                    match v {
                        Some(r) => self.compiled.prefixes.insert(net, r),
                        None => self.compiled.prefixes.remove(&net),
                    };
                }
            }
            None => {
                self.file_rules.rebase(&self.rules, &rules);
                mark_persisted(&mut rules, &self.file_rules);
                self.compiled = plan.compiled;
                self.class_nets = BTreeMap::new();
                for k in rules.keys().filter(|k| !k.class().is_none()) {
                    *self.class_nets.entry(k.net).or_default() += 1;
                }
                self.expiring = rules.iter().filter_map(|(k, i)| i.spec.expires.map(|e| (e, k.clone()))).collect();
                self.ban_slots = manual_ban_slots(rules.iter(), |i| i.slot);
                self.removed_at_runtime = removed_at_runtime(&self.file_rules, &rules);
            }
        }
        self.rules = rules;
        self.groups = plan.groups;
        self.next_id = plan.next_id;
        // A rule to come back is kept while a temporary one is in force
        // at its key.
        if !self.restore.is_empty() {
            let rules = &self.rules;
            self.restore.retain(|k, _| rules.get(k).is_some_and(|i| i.spec.expires.is_some()));
        }
    }

    /// `spec` comes back at `key` when the temporary rule about to be put
    /// there ends (`rule set … --ttl` over a rule without an end). A
    /// temporary change of a temporary change keeps the first rule to come
    /// back.
    pub fn restore_at_end(&mut self, key: &RuleKey, spec: std::sync::Arc<RuleSpec>) {
        self.restore.entry(key.clone()).or_insert(spec);
    }

    /// What comes back at `key` when its rule ends at `now_ms`: the config
    /// file's rule for it (unless that one has ended too), else the rule
    /// a temporary change replaced ([`RuleSet::restore_at_end`]), else
    /// nothing (the key's rule goes).
    pub fn back_at_end(&self, key: &RuleKey, now_ms: u64) -> Option<RuleSpec> {
        let in_file = self.file_rules().get(key).map(|s| (**s).clone());
        match in_file {
            Some(f) if f.expires.is_none_or(|e| e > now_ms) => Some(f),
            _ => self.restore.get(key).map(|s| (**s).clone()),
        }
    }

    /// The rules in force, to share with the views.
    pub fn shared_rules(&self) -> super::Rules {
        self.rules.clone()
    }

    /// The rules in force.
    pub fn rules(&self) -> &super::Rules {
        &self.rules
    }

    /// The rules in force, as specs.
    pub fn specs(&self) -> BTreeMap<RuleKey, RuleSpec> {
        self.rules.iter().map(|(n, i)| (n.clone(), (*i.spec).clone())).collect()
    }

    /// The rules the config file holds.
    pub fn file_rules(&self) -> FileView<'_> {
        FileView { rules: &self.rules, file: &self.file_rules }
    }

    /// The rules the config file holds, as specs of their own (a reload's
    /// comparison, a catch-up write).
    pub fn file_specs(&self) -> BTreeMap<RuleKey, RuleSpec> {
        crate::rules::SpecMap::specs(&self.file_rules())
    }

    /// The config file now holds `rules`.
    pub fn set_file_rules(&mut self, rules: BTreeMap<RuleKey, RuleSpec>) {
        self.generation += 1;
        // Both in key order: one walk of each, no lookups (a start's
        // 100 000 rules).
        let mut differs = Vec::new();
        let mut now = self.rules.iter().peekable();
        for (k, s) in rules {
            while let Some((n, _)) = now.next_if(|(n, _)| **n < k) {
                differs.push((n.clone(), None));
            }
            match now.next_if(|(n, _)| **n == k) {
                Some((_, i)) if *i.spec == s => {}
                _ => differs.push((k, Some(std::sync::Arc::new(s)))),
            }
        }
        differs.extend(now.map(|(n, _)| (n.clone(), None)));
        self.file_rules = FileRules { differs: differs.into_iter().collect() };
        self.mark_persisted();
        self.removed_at_runtime = removed_at_runtime(&self.file_rules, &self.rules);
    }

    /// The file's rules not in force (removed with `--runtime`).
    pub fn removed_at_runtime(&self) -> impl Iterator<Item = &RuleSpec> {
        self.removed_at_runtime.values()
    }

    /// The manual bans' counter slots, sorted.
    pub fn ban_slots(&self) -> std::sync::Arc<Vec<u32>> {
        self.ban_slots.clone()
    }

    /// The rules and bans whose end has come by `now_ms`.
    pub fn ended(&self, now_ms: u64) -> Vec<RuleKey> {
        self.expiring.iter().take_while(|(e, _)| *e <= now_ms).map(|(_, k)| k.clone()).collect()
    }

    /// The config file now holds its rules with `edits` made.
    pub fn edit_file_rules(&mut self, edits: &[(RuleKey, Option<RuleSpec>)]) {
        self.generation += 1;
        for (k, v) in edits {
            self.file_rules.set(&self.rules, k, v.clone().map(std::sync::Arc::new));
        }
        for (k, _) in edits {
            let persisted = !self.file_rules.differs.contains_key(k);
            if let Some(i) = self.rules.get_mut(k)
                && i.persisted != persisted
            {
                i.persisted = persisted;
            }
            runtime_removal(&mut self.removed_at_runtime, &self.file_rules, &self.rules, k);
        }
    }

    /// A rule is persisted when the config file holds it as it is in force.
    fn mark_persisted(&mut self) {
        mark_persisted(&mut self.rules, &self.file_rules);
    }

    /// What the rule maps hold for the rules.
    pub fn compiled(&self) -> &Compiled {
        &self.compiled
    }

    /// What the rule maps were read back to hold after a failed write.
    pub fn read_back(&mut self, compiled: Compiled) {
        self.generation += 1;
        self.compiled = compiled;
    }

    /// A counter slot for a set; an error at the rule limit.
    pub fn take_slot(&mut self) -> Result<u32> {
        self.generation += 1;
        self.slots.take()
    }

    /// Marks a slot an adopted set already uses (see [`Slots::mark_used`]).
    pub fn mark_slot_used(&mut self, s: u32) -> bool {
        self.generation += 1;
        self.slots.mark_used(s)
    }

    pub fn free_slot(&mut self, s: u32) {
        self.generation += 1;
        self.slots.free(s);
    }

    /// A rule id never used before (a set's).
    pub fn new_id(&mut self) -> u32 {
        self.generation += 1;
        self.next_id += 1;
        self.next_id - 1
    }

    /// The DEFAULT_RULES pair to write the default rules into (the one not
    /// in use), once the pair before last is surely not read any more:
    /// switches are at least 1 ms apart, and a program run lasts microseconds.
    fn next_fast_pair(&self) -> u32 {
        if let Some(t) = self.last_flip {
            let since = t.elapsed();
            if since < Duration::from_millis(1) {
                std::thread::sleep(Duration::from_millis(1) - since);
            }
        }
        if self.fast == 1 { 2 } else { 1 }
    }

    /// The program now reads the fast path's pair `pair` (0: off).
    fn fast_path_is(&mut self, pair: u32) {
        if pair != 0 {
            self.last_flip = Some(Instant::now());
        }
        self.fast = pair;
    }

    /// Whether the tries hold /0 prefixes only (no rule of a longer one,
    /// no protected prefix): the default rules' fast path may judge.
    pub fn only_defaults(&self) -> bool {
        self.compiled.prefixes.keys().all(|n| n.prefix_len() == 0)
    }
}

#[cfg(test)]
thread_local! {
    /// Plans of edits checked against the whole plan (tests).
    pub(super) static PLANNED_EDITS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The file's rules not in force.
fn removed_at_runtime(file: &FileRules, rules: &super::Rules) -> BTreeMap<RuleKey, RuleSpec> {
    let file = file.differs.iter().filter_map(|(k, f)| f.as_ref().map(|s| (k, s)));
    file.filter(|(k, _)| !rules.contains_key(*k)).map(|(k, s)| (k.clone(), (**s).clone())).collect()
}

/// The rules a config file holds, kept as where they differ from the
/// rules in force: a file mostly holds the rules in force as they are,
/// and a map of its own would hold every key and spec pointer again (6 MB
/// at 100 000 rules). A rule the file holds as it is in force is then one
/// copy by construction.
#[derive(Debug, Default)]
pub(super) struct FileRules {
    /// Where the file differs from the rules in force: `Some`, the file's
    /// rule (the rule in force differs, or is not in force: removed at
    /// runtime); `None`, the file has no rule for a key in force (added at
    /// runtime). Never the rule in force itself, never `None` for a key
    /// not in force.
    differs: BTreeMap<RuleKey, Option<std::sync::Arc<RuleSpec>>>,
}

impl FileRules {
    /// The file's rule for `k`, with `rules` in force.
    fn get<'a>(&'a self, rules: &'a super::Rules, k: &RuleKey) -> Option<&'a std::sync::Arc<RuleSpec>> {
        match self.differs.get(k) {
            Some(f) => f.as_ref(),
            None => rules.get(k).map(|i| &i.spec),
        }
    }

    /// The file's rule for `k` is `f`, with `rules` in force.
    fn set(&mut self, rules: &super::Rules, k: &RuleKey, f: Option<std::sync::Arc<RuleSpec>>) {
        if rules.get(k).map(|i| &*i.spec) == f.as_deref() {
            self.differs.remove(k);
        } else {
            self.differs.insert(k.clone(), f);
        }
    }

    /// The same file, kept against `new` in force where it was kept
    /// against `old` (a whole plan taken).
    fn rebase(&mut self, old: &super::Rules, new: &super::Rules) {
        let mut differs = Vec::new();
        for (k, i) in new {
            let f = match self.differs.get(k) {
                Some(f) => f.clone(),
                None => old.get(k).map(|o| o.spec.clone()),
            };
            if f.as_ref().is_none_or(|f| !std::sync::Arc::ptr_eq(f, &i.spec) && **f != *i.spec) {
                differs.push((k.clone(), f));
            }
        }
        // Keys not in force now that the file holds.
        for (k, o) in old {
            if !new.contains_key(k) && !self.differs.contains_key(k) {
                differs.push((k.clone(), Some(o.spec.clone())));
            }
        }
        for (k, f) in &self.differs {
            if !new.contains_key(k) && f.is_some() {
                differs.push((k.clone(), f.clone()));
            }
        }
        self.differs = differs.into_iter().collect();
    }
}

/// The rules the config file holds: the rules in force where the file
/// holds them as they are, and the differences.
pub(super) struct FileView<'a> {
    rules: &'a super::Rules,
    file: &'a FileRules,
}

impl<'a> FileView<'a> {
    pub fn get(&self, k: &RuleKey) -> Option<&'a std::sync::Arc<RuleSpec>> {
        self.file.get(self.rules, k)
    }

    pub fn contains_key(&self, k: &RuleKey) -> bool {
        self.get(k).is_some()
    }
}

impl crate::rules::SpecMap for FileView<'_> {
    fn spec(&self, k: &RuleKey) -> Option<&RuleSpec> {
        self.get(k).map(|s| &**s)
    }

    fn specs(&self) -> BTreeMap<RuleKey, RuleSpec> {
        let mut m: BTreeMap<RuleKey, RuleSpec> = self
            .rules
            .iter()
            .filter(|(k, _)| !self.file.differs.contains_key(*k))
            .map(|(k, i)| (k.clone(), (*i.spec).clone()))
            .collect();
        m.extend(self.file.differs.iter().filter_map(|(k, f)| f.as_ref().map(|s| (k.clone(), (**s).clone()))));
        m
    }
}

/// Keeps `removed` the file's rules not in force, for the key `k`.
fn runtime_removal(removed: &mut BTreeMap<RuleKey, RuleSpec>, file: &FileRules, rules: &super::Rules, k: &RuleKey) {
    match file.differs.get(k) {
        Some(Some(s)) if !rules.contains_key(k) => removed.insert(k.clone(), (**s).clone()),
        _ => removed.remove(k),
    };
}

/// Marks the rules the config file holds as they are in force.
fn mark_persisted(rules: &mut super::Rules, file: &FileRules) {
    // In place (nodes no one else holds are not copied), and only where
    // the mark changes.
    let keys: Vec<RuleKey> =
        rules.iter().filter(|(k, i)| i.persisted == file.differs.contains_key(*k)).map(|(k, _)| k.clone()).collect();
    for k in keys {
        if let Some(i) = rules.get_mut(&k) {
            i.persisted = !i.persisted;
        }
    }
}

use crate::rules::edit_rules;

/// A change the config file could not take: nothing changed, and
/// `--runtime` is the way to make it anyway.
pub(super) fn not_written(e: Error) -> Error {
    if e.is_config_not_written() {
        Error::Invalid(format!(
            "{e}; nothing changed (`--runtime` applies the change to the kernel only, not persisted)"
        ))
    } else {
        e
    }
}

impl RuleSet {
    /// Turns the default-rules fast path of `policer` on (with the current
    /// default rules) when only default rules exist and no set holds an
    /// entry (`set_entries`), off otherwise. The rules go into the pair not
    /// in use, then one u32 write switches readers over, so no packet sees
    /// a rule half written; switches are at least 1 ms apart so a reader of
    /// the pair before last (a program run lasts microseconds) is long gone
    /// before that pair is rewritten.
    pub(super) fn sync_fast_path(&mut self, policer: &mut Policer, set_entries: bool) -> Result<()> {
        if !self.only_defaults() || set_entries {
            return self.fast_path_off(policer);
        }
        // The compiled values: with the group of the prefix's classes.
        let rule = |rs: &RuleSet, net: &str| -> Option<Rule> {
            let net: IpNet = net.parse().expect("literal");
            rs.compiled.prefixes.get(&net).copied()
        };
        let (v4, v6) = (rule(self, "0.0.0.0/0"), rule(self, "::/0"));
        let next = self.next_fast_pair();
        policer.set_default_rules(next - 1, v4, v6)?;
        policer.set_fast_path(next)?;
        self.fast_path_is(next);
        Ok(())
    }

    /// Back to the tries (before a prefix that is not a default rule goes
    /// in, so no frame is judged by a default rule it no longer falls under).
    pub(super) fn fast_path_off(&mut self, policer: &mut Policer) -> Result<()> {
        if self.fast != 0 {
            policer.set_fast_path(0)?;
            self.fast_path_is(0);
        }
        Ok(())
    }
}

/// What a change does once it is written (in a group of changes, after
/// the group's one write; never if that write fails).
#[derive(Debug)]
pub(super) enum WhenWritten {
    /// A line of the log.
    Say(String),
    /// Automatic bans an `unban` lifts with a manual ban.
    Lift(Vec<policer_common::BucketKeyV6>),
    /// A ban the state directory keeps (`statebans.rs`), lifted, or the
    /// config file's now.
    ForgetStateBan(ipnet::IpNet),
}

/// The counter slots of the manual bans among `rules`, sorted: the owner
/// publishes them with each snapshot (once per change, not per read).
pub(super) fn manual_ban_slots<'a, V: 'a>(
    rules: impl Iterator<Item = (&'a RuleKey, &'a V)>,
    slot: impl Fn(&V) -> u32,
) -> std::sync::Arc<Vec<u32>> {
    let mut slots: Vec<u32> = rules.filter(|(k, _)| k.ban).map(|(_, v)| slot(v)).collect();
    slots.sort_unstable();
    std::sync::Arc::new(slots)
}

/// Leaves out the rules and bans whose expiry has passed.
pub(super) fn drop_expired(specs: &mut BTreeMap<RuleKey, RuleSpec>) {
    let now = crate::duration::unix_ms();
    specs.retain(|_, s| s.expires.is_none_or(|e| e > now));
}

/// The aggregate bucket of a rule (`--total-rate`), starting full, on the
/// program's clock at `now_ns` (a replay's is the capture's).
fn total_at(spec: &RuleSpec, now_ns: u64) -> Result<Option<policer_common::class::Total>> {
    Ok(spec.total_limiter()?.map(|limiter| policer_common::class::Total { tat: limiter.empty_tat(now_ns), limiter }))
}

/// Sets the new-source limiter of the rule's counter slot.
pub(super) fn prepare(p: &mut Policer, spec: &RuleSpec, slot: u32) -> Result<()> {
    prepare_at(p, spec, slot, monotonic_ns())
}

/// [`prepare`] on the program's clock at `now_ns`.
pub(super) fn prepare_at(p: &mut Policer, spec: &RuleSpec, slot: u32, now_ns: u64) -> Result<()> {
    let ns = new_sources(spec, p.max_sources()?, now_ns);
    p.set_new_sources(slot, &ns)?;
    p.set_ban_params(slot, spec.ban_params().as_ref())?;
    p.set_syn_slots(&[(slot, crate::syncookies::HostTcp::read().conf(spec.syn()))], &[])
}

/// The new-source limiter of a rule, for a table of `max_sources`.
fn new_sources(spec: &RuleSpec, max_sources: u32, now_ns: u64) -> NewSources {
    // Rate and burst in the same unit: packets, or bytes in byte mode.
    let rate = match (spec.action.polices(), spec.rate) {
        (true, Some(Rate::Pps(r))) => Some(r),
        (true, Some(Rate::Bps(b))) => Some(b / 8),
        _ => None,
    };
    match rate {
        Some(r) => NewSources::for_rule(r, spec.burst, max_sources, now_ns),
        None => NewSources::default(),
    }
}

/// [`prepare_at`] of many slots at once (a start, a reload: a few batch
/// calls, not three system calls a rule), and with `total` each slot's
/// aggregate bucket, starting full (none: cleared).
///
/// `fresh`: the maps were just made (every value zero) and no program
/// reads them yet, so what a slot needs only where the rule has it: ban
/// parameters only for a rule that bans (zero is "never bans"), SYN
/// settings only for a rule with SYN cookies (zero is "off"), aggregate
/// buckets only for a rule with one (the program reads a slot's only
/// where the rule's flags say it has one: `RULE_TOTAL`, `RULE_SYN`). At a
/// 1 000 000-rule start that is one array written instead of five.
pub(super) fn prepare_slots<'a>(
    p: &mut Policer,
    slots: impl IntoIterator<Item = (u32, &'a RuleSpec, bool)>,
    now_ns: u64,
    fresh: bool,
) -> Result<()> {
    /// Slots written at a time: the batches' buffers stay small (a
    /// 1 000 000-rule start's were 150 MB at once, at its peak).
    const AT_ONCE: usize = 8192;
    let max_sources = p.max_sources()?;
    let (mut limiters, mut bans, mut totals) = (Vec::new(), Vec::new(), Vec::new());
    // SYN cookies: each slot's settings (off for most), and the `flood`
    // mode's SYN budget beside the aggregate bucket.
    let host = crate::syncookies::HostTcp::read();
    let (mut syn, mut syn_totals) = (Vec::new(), Vec::new());
    let mut slots = slots.into_iter().peekable();
    while slots.peek().is_some() {
        for (slot, spec, total) in slots.by_ref().take(AT_ONCE) {
            limiters.push((slot, new_sources(spec, max_sources, now_ns)));
            let ban = spec.ban_params();
            if !(fresh && ban.is_none()) {
                bans.push((slot, ban.unwrap_or_default()));
            }
            let cookies = spec.syn();
            if !(fresh && cookies.is_none()) {
                syn.push((slot, host.conf(cookies)));
            }
            if total {
                let t = total_at(spec, now_ns)?;
                if !(fresh && t.is_none()) {
                    let t = t.unwrap_or_else(crate::loader::no_total);
                    totals.push((slot, t));
                    syn_totals.push((slot, t));
                }
            }
        }
        // A slot is read only once a rule map points to it (written
        // after): the order of these writes does not matter.
        p.set_slots(&limiters, &bans, &totals)?;
        p.set_syn_slots(&syn, &syn_totals)?;
        limiters.clear();
        bans.clear();
        totals.clear();
        syn.clear();
        syn_totals.clear();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(prefix: &str, rate: &str) -> RuleSpec {
        crate::rules::RuleConfig { prefix: prefix.into(), rate: Some(rate.into()), ..Default::default() }
            .validate()
            .unwrap()
    }

    fn map(specs: &[&RuleSpec]) -> BTreeMap<RuleKey, RuleSpec> {
        specs.iter().map(|s| (s.key(), (*s).clone())).collect()
    }

    /// Random changes of a rule set with rules of every length of both
    /// families, bans over and under them, class rules and protected
    /// prefixes: every change planned by its edits is checked against the
    /// whole plan (`RuleSet::check_plan_edits`: the same rules, ids, slots,
    /// writes, groups and rule maps), and most are planned so.
    #[test]
    fn plans_of_edits_are_the_whole_plans() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut rs = RuleSet::new(Slots::new(400), Groups::default(), Compiled::default(), 1);
        rs.set_protect(crate::protect::Protect::parse(&["10.9.0.0/16".into(), "2001:db8:9::/48".into()]).unwrap());
        let first = map(&[&spec("0.0.0.0/0", "1kpps"), &spec("::/0", "1kpps"), &spec("10.1.0.0/16", "5pps")]);
        let plan = rs.plan(&first).unwrap();
        rs.commit(plan);
        let before = PLANNED_EDITS.with(|n| n.get());
        let mut refused = 0;
        // What the config file holds, as its writer would have it.
        let mut file: BTreeMap<RuleKey, RuleSpec> = BTreeMap::new();
        for round in 0..1500 {
            let mut edits = Vec::new();
            for _ in 0..1 + rnd(3) {
                // A prefix among few, so that changes meet: 10.x.y.z/len or 2001:db8:x::/len.
                let (a, b) = (rnd(12), rnd(4));
                let net = if rnd(4) == 0 {
                    let len = [32, 48, 56, 64, 128][rnd(5) as usize];
                    format!("2001:db8:{a:x}:{b:x}::/{len}")
                } else {
                    let len = [8, 16, 24, 28, 32][rnd(5) as usize];
                    format!("10.{a}.{b}.{}/{len}", rnd(3) * 16)
                };
                let mut rc = crate::rules::RuleConfig { prefix: net, ..Default::default() };
                match rnd(10) {
                    0..=4 => rc.rate = Some(format!("{}pps", 1 + rnd(5))),
                    5 => {
                        rc.ban = Some(true);
                        rc.ttl = Some("1h".into());
                    }
                    6 if round % 5 == 0 => {
                        rc.rate = Some("3pps".into());
                        rc.proto = Some(["udp", "tcp"][rnd(2) as usize].into());
                    }
                    7 => rc.action = Some(policer_common::bucket::Action::Allow),
                    _ => {
                        // A removal of whatever is there, rule or ban.
                        let Ok(s) = crate::rules::RuleConfig { rate: Some("1pps".into()), ..rc.clone() }.validate()
                        else {
                            continue;
                        };
                        let key = if rnd(3) == 0 { RuleKey::new(s.net, s.class(), true) } else { s.key() };
                        edits.push((key, None));
                        continue;
                    }
                }
                let Ok(s) = rc.validate() else { continue };
                edits.push((s.key(), Some(s)));
            }
            match rs.plan_edits(&edits) {
                Ok(p) => {
                    rs.commit(p);
                    // Most changes are written to the file too; some are
                    // `--runtime`.
                    if rnd(4) != 0 {
                        rs.edit_file_rules(&edits);
                        edit_rules(&mut file, &edits);
                    }
                }
                Err(_) => refused += 1,
            }
            if round % 97 == 0 {
                // The file read again as it is.
                rs.set_file_rules(file.clone());
            }
            if round % 131 == 0 {
                // A whole plan of the rules in force (a reload that keeps them).
                let p = rs.plan(&rs.specs()).unwrap();
                rs.commit(p);
            }
            rs.check_kept();
            assert_eq!(rs.file_specs(), file, "the file's rules");
        }
        let planned = PLANNED_EDITS.with(|n| n.get()) - before;
        assert!(planned > 900, "{planned} of 1500 changes planned by their edits ({refused} refused)");
        assert!(rs.rules().len() > 50, "{} rules at the end", rs.rules().len());
    }

    /// The file's rules are kept as where they differ from the rules in
    /// force: whole plans that change, remove and add rules at runtime
    /// (the file unwritten) leave the file's rules as they were.
    #[test]
    fn the_file_stays_what_it_was_through_runtime_changes() {
        let (a, a2, b, c) = (
            spec("10.0.0.0/8", "5pps"),
            spec("10.0.0.0/8", "9pps"),
            spec("::/0", "1kpps"),
            spec("192.0.2.0/24", "1pps"),
        );
        let mut rs = RuleSet::new(Slots::new(16), Groups::default(), Compiled::default(), 1);
        let file = map(&[&a, &b]);
        for want in [map(&[&a, &b]), map(&[&a2, &b]), map(&[&b]), map(&[&b, &c]), map(&[&a2, &c]), map(&[&a, &b])] {
            let p = rs.plan(&want).unwrap();
            rs.commit(p);
            if rs.file_specs().is_empty() {
                rs.set_file_rules(file.clone());
            }
            rs.check_kept();
            assert_eq!(rs.file_specs(), file);
            let removed: Vec<RuleKey> = rs.removed_at_runtime().map(|s| s.key()).collect();
            assert_eq!(removed, file.keys().filter(|k| !want.contains_key(k)).cloned().collect::<Vec<_>>());
        }
        assert!(rs.file_rules.differs.is_empty(), "the rules in force are the file's again");
    }

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
