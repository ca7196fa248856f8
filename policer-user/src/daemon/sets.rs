//! Named sets (`policer rule import`): many prefixes under one rule. The
//! set's entries go straight into the rule tries, each with the set's
//! compiled rule as its value; they are not in [`RuleSet::compiled`] (a
//! million entries there would make every `rule set` diff a million), so
//! a rule change never touches them, and a set change touches only them.
//! See the README (`policer rule import`) and docs/design.md ("Sets").

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use ipnet::IpNet;
use policer_common::Rule;

use super::{
    aside::Guard,
    bans::Bans,
    ruleset::{RuleSet, prepare},
};
use crate::{
    compile::Compiled,
    control::RuleView,
    error::{Error, Result},
    loader::Policer,
    protect::Protect,
    rules::{RuleConfig, RuleKey, RuleSpec},
    sets::{self, Header, List, MaxRemove},
    trie::{CHUNK, TrieWriter},
};

/// A set in force.
#[derive(Clone, Debug)]
pub(crate) struct SetState {
    pub header: Header,
    /// The rule of the set's IPv4 and IPv6 entries (prefix /0: a set has
    /// no prefix of its own; the key length differs by family).
    pub spec4: RuleSpec,
    pub spec6: RuleSpec,
    pub id: u32,
    pub slot: u32,
    /// Sorted, each once; IPv4 first. Shared with the snapshot
    /// (`inspect`), never changed in place.
    pub entries: Arc<Vec<IpNet>>,
    /// Where the set comes from, and so what a restart keeps of it.
    pub origin: Origin,
}

/// Where a set comes from: what a restart and a reload do with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    /// `rule import`: its state file in the state directory; a restart
    /// reads it back.
    Saved,
    /// `rule import --runtime`: in force until the daemon stops; a state
    /// file of the same name (an earlier saved import) is left as it was,
    /// and a restart brings that back.
    Runtime,
    /// A `[[set]]` table of the config: read from its file at start and
    /// at every reload; no state file.
    Config,
}

/// Which set's value a prefix in several sets holds: the higher of
/// (action, name) — deny over police over monitor over allow, and between
/// sets of one action the name that sorts first. The blocklist wins over
/// the allowlist; two police sets do not depend on the order of imports.
/// The resolver's order ([`crate::resolve::precedence`]), one for the
/// kernel's writes and the host's answers.
fn rank(s: &SetState) -> (u8, std::cmp::Reverse<&str>) {
    crate::resolve::precedence(s.spec4.action, &s.header.name)
}

/// For each of sorted `nets` that a set of `others` holds too, the one of
/// them of highest [`rank`]. A merge per other set: linear in the lists.
fn held_by<'a>(nets: &[IpNet], others: &[&'a SetState]) -> BTreeMap<IpNet, &'a SetState> {
    let mut out: BTreeMap<IpNet, &SetState> = BTreeMap::new();
    for o in others {
        let (mut i, mut j) = (0, 0);
        let b = &o.entries[..];
        while i < nets.len() && j < b.len() {
            match nets[i].cmp(&b[j]) {
                std::cmp::Ordering::Equal => {
                    let e = out.entry(nets[i]).or_insert(o);
                    if rank(o) > rank(e) {
                        *e = o;
                    }
                    i += 1;
                    j += 1;
                }
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
            }
        }
    }
    out
}

/// What the tries must do for one set going from `old` to `new` (either
/// absent) beside `others`: a pure function, tested without a kernel.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Writes {
    /// Entries that take `new`'s value (written as one batch per family).
    pub bulk: Vec<IpNet>,
    /// Entries that take another set's value (it outranks `new` there, or
    /// `new` no longer holds them).
    pub pairs: Vec<(IpNet, Rule)>,
    /// Entries no set holds any more.
    pub delete: Vec<IpNet>,
    /// Entries of `new` another set outranks.
    pub shadowed: usize,
}

pub(crate) fn plan_writes(others: &[&SetState], old: Option<&SetState>, new: Option<&SetState>) -> Result<Writes> {
    let none: &[IpNet] = &[];
    let old_e = old.map_or(none, |o| &o.entries[..]);
    let new_e = new.map_or(none, |n| &n.entries[..]);
    let d = sets::diff(old_e, new_e);
    let same = match (old, new) {
        (Some(o), Some(n)) => o.values()? == n.values()?,
        _ => false,
    };
    let mut w = Writes::default();
    if let Some(n) = new {
        let held = held_by(new_e, others);
        let wins = |e: &IpNet| held.get(e).is_none_or(|o| rank(n) > rank(o));
        // Kept entries hold `new`'s value already when the rule is the same.
        let touched: &[IpNet] = if same { &d.add } else { new_e };
        w.bulk = if held.is_empty() { touched.to_vec() } else { touched.iter().filter(|e| wins(e)).copied().collect() };
        for (e, o) in &held {
            if !wins(e) {
                w.shadowed += 1;
                // Where `old` won, the other's value goes back.
                let old_won = old.is_some_and(|old| old_e.binary_search(e).is_ok() && rank(old) > rank(o));
                if old_won {
                    w.pairs.push((*e, o.value_for(e)?));
                }
            }
        }
    }
    let held = held_by(&d.remove, others);
    for e in &d.remove {
        match held.get(e) {
            Some(o) => w.pairs.push((*e, o.value_for(e)?)),
            None => w.delete.push(*e),
        }
    }
    Ok(w)
}

impl SetState {
    /// The trie values of the set's entries (IPv4, IPv6).
    pub(super) fn values(&self) -> Result<(Rule, Rule)> {
        Ok((
            self.spec4.kernel(self.id)?.with_counter_slot(self.slot),
            self.spec6.kernel(self.id)?.with_counter_slot(self.slot),
        ))
    }

    /// The trie value of one of its entries.
    fn value_for(&self, e: &IpNet) -> Result<Rule> {
        let (v4, v6) = self.values()?;
        Ok(if e.addr().is_ipv4() { v4 } else { v6 })
    }

    /// A row of `rule ls`: the set as one rule.
    pub fn view(&self) -> RuleView {
        let s = &self.spec4;
        RuleView {
            prefix: format!("set:{}", self.header.name),
            class: String::new(),
            proto: None,
            dport: None,
            sport: None,
            tcp_flags: None,
            icmp_type: None,
            dst: None,
            total_rate: None,
            total_burst: None,
            global: None,
            syn_cookies: None,
            syn_ack_rate: None,
            action: s.action.to_string(),
            rate: s.rate.map(|r| r.to_string()),
            burst: s.rate.map(|_| s.burst),
            unit: if s.rate.is_some_and(|r| r.is_bytes()) { "bytes" } else { "packets" }.into(),
            key_len: s.key_len,
            persisted: self.origin != Origin::Runtime,
            in_force: true,
            ban: false,
            reason: None,
            ban_for: None,
            ban_after: None,
            ban_max: None,
            ban_within: None,
            expires: self.header.expires_ms.map(crate::duration::rfc3339),
            set: Some(self.header.name.clone()),
            entries: Some(self.entries.len() as u64),
            origin: Some(
                match self.origin {
                    Origin::Saved => "saved",
                    Origin::Runtime => "runtime",
                    Origin::Config => "config",
                }
                .into(),
            ),
        }
    }
}

/// What `policer rule import` asks for.
#[derive(Clone, Debug)]
pub struct Import {
    /// The file as given (for messages), its bytes and its parsed list.
    pub file: String,
    pub text: Vec<u8>,
    pub list: List,
    /// `--set NAME`; none: the implicit set of the action and rate, which
    /// only grows.
    pub set: Option<String>,
    /// action, rate, burst, key_len, ttl.
    pub rule: RuleConfig,
    /// The most a replacement (`set`) may remove (`--max-remove`), unless
    /// `force`.
    pub max_remove: MaxRemove,
    pub force: bool,
    /// `--runtime`: in force until the daemon stops, no state file.
    pub runtime: bool,
    /// A feed's set (`[crowdsec]`): entries inside a protected prefix or
    /// that are a rule's prefix are left out and counted, not a refusal of
    /// the whole list (a feed cannot be told to fix one line).
    pub feed: bool,
    /// `--skip-protected`: entries inside a protected prefix are left out,
    /// counted and named, not a refusal of the whole list.
    pub skip_protected: bool,
    /// `--mmdb FILE --country … --asn …`: the database and what was taken
    /// (the list is its networks, `text` them with their labels).
    pub mmdb: Option<sets::MmdbSource>,
    /// What put each entry in (a database's country or AS; the feed's
    /// Country and AS decisions).
    pub labels: Option<Arc<crate::mmdb::Labels>>,
}

fn split(nets: &[IpNet]) -> (&[IpNet], &[IpNet]) {
    nets.split_at(nets.partition_point(|n| n.addr().is_ipv4()))
}

/// Writes sorted `nets` with the value of their family.
pub(super) fn write(fds: TrieWriter, nets: &[IpNet], values: (Rule, Rule)) -> Result<()> {
    let (v4, v6) = split(nets);
    write_parallel(fds, false, v4, &values.0)?;
    write_parallel(fds, true, v6, &values.1)
}

/// Threads that write one family at once: on 6.18 two writers of a
/// million /32s take 0.5 s where one takes 1.2 s (the copies and node
/// allocations around the trie's lock overlap); more than the CPUs gain
/// nothing.
fn writers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get()).min(4)
}

fn write_parallel(fds: TrieWriter, v6: bool, nets: &[IpNet], value: &Rule) -> Result<()> {
    let n = writers();
    if n <= 1 || nets.len() < 2 * CHUNK {
        return fds.write_all(v6, nets, value);
    }
    let per = nets.len().div_ceil(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = nets.chunks(per).map(|part| s.spawn(move || fds.write_all(v6, part, value))).collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or_else(|_| Err(Error::Invalid("a writer panicked".into()))))
    })
}

/// The entries of sorted `list` under a manual ban, each with the value of
/// the longest ban over it: a ban drops all of a prefix's traffic, set
/// entries under it included (as `compile::compile` does for rules).
pub(super) fn banned(list: &[IpNet], bans: &[(IpNet, Rule)], protect: &Protect) -> Vec<(IpNet, Rule)> {
    let mut out: BTreeMap<IpNet, (u8, Rule)> = BTreeMap::new();
    for (p, value) in bans {
        let (v4, v6) = split(list);
        let fam = if p.addr().is_ipv4() { v4 } else { v6 };
        let lo = fam.partition_point(|e| e.network() < p.network());
        let hi = fam.partition_point(|e| e.network() <= p.broadcast());
        // An entry inside a protected prefix (an allow set's) keeps its
        // value under any ban: the tries' longest match gives it.
        for e in fam[lo..hi].iter().filter(|e| p.contains(*e) && protect.holding(e).is_none()) {
            let longer = out.get(e).is_none_or(|(len, _)| *len < p.prefix_len());
            if longer {
                out.insert(*e, (p.prefix_len(), *value));
            }
        }
    }
    out.into_iter().map(|(e, (_, v))| (e, v)).collect()
}

/// A few entries, each with its own value.
pub(super) fn write_pairs(fds: TrieWriter, pairs: &[(IpNet, Rule)]) -> Result<()> {
    for (n, v) in pairs {
        fds.set(*n, Some(v))?;
    }
    Ok(())
}

pub(super) fn delete(fds: TrieWriter, nets: &[IpNet]) -> Result<()> {
    let (v4, v6) = split(nets);
    fds.delete_all(false, v4)?;
    fds.delete_all(true, v6)
}

/// An import, planned ([`Sets::plan_import`]): the set as it will be,
/// what changes, and what the answer and the timings need.
pub(super) struct ImportPlan {
    imp: Import,
    /// `--set` was given (the set becomes the list, not the union).
    explicit: bool,
    name: String,
    header: Header,
    spec4: RuleSpec,
    spec6: RuleSpec,
    entries: Vec<IpNet>,
    d: sets::Diff,
    /// A feed's entries left out: (inside a protected prefix, a rule's prefix).
    refused: (usize, usize),
    /// With `--skip-protected`: each entry left out, and the protected
    /// prefix that holds it.
    skipped: Vec<(IpNet, IpNet)>,
    t0: Instant,
    t_checked: std::time::Duration,
}

/// The first few entries `--skip-protected` left out, each with the
/// protected prefix that holds it; then how many more.
fn skipped_text(skipped: &[(IpNet, IpNet)]) -> String {
    crate::text::first_few(skipped.iter().map(|(e, p)| format!("{e} in {p}")), 5)
}

/// Sorted union of two sorted lists.
fn union(a: &[IpNet], b: &[IpNet]) -> Vec<IpNet> {
    let mut out = Vec::with_capacity(a.len() + b.len());
    out.extend_from_slice(a);
    out.extend_from_slice(b);
    out.sort_unstable();
    out.dedup();
    out
}

/// The named sets in force, where their state files live, and which one
/// the CrowdSec feed writes: the owner of what `rule import`, the
/// config's `[[set]]` tables and the feed change. Its methods take what
/// else they need — the rules ([`RuleSet`]), the program ([`Policer`]),
/// the bans' bookkeeping — as arguments; the owner (`owner.rs`) plans with
/// them and sequences the writes. Read as the map of the sets by name
/// (`Deref`); changed only through its methods.
pub(super) struct Sets {
    by_name: BTreeMap<String, SetState>,
    /// `STATE_DIR/sets/`.
    dir: PathBuf,
    /// The set the feed writes (`[crowdsec] set`): no one else does.
    feed: Option<String>,
}

impl std::ops::Deref for Sets {
    type Target = BTreeMap<String, SetState>;
    fn deref(&self) -> &Self::Target {
        &self.by_name
    }
}

/// What a dry run of a set change leaves for the preview (`dryrun.rs`
/// judges it): the sets after, and each set's change (before, after).
pub(super) struct SetsAfter {
    pub sets: BTreeMap<String, SetState>,
    pub changes: Vec<(Option<SetState>, Option<SetState>)>,
}

impl Sets {
    /// No sets yet; their state files in `dir`; `feed`: the feed's set.
    pub(super) fn new(dir: PathBuf, feed: Option<String>) -> Sets {
        Sets { by_name: BTreeMap::new(), dir, feed }
    }

    /// Where the sets' state files are (`STATE_DIR/sets/`).
    pub(super) fn dir(&self) -> &Path {
        &self.dir
    }

    /// `s` in force from now on, in place of a set of its name.
    pub(super) fn put(&mut self, s: SetState) {
        self.by_name.insert(s.header.name.clone(), s);
    }

    /// Plans `policer rule import`: the set becomes the file (`--set`), or
    /// the implicit set grows by it. Judged whole (name, the feed's set,
    /// `--max-remove`, conflicts with the rules of `rs` and bans, the room
    /// in `policer`'s tries); nothing written. The owner previews it or
    /// writes it (`owner.rs`: `Daemon::import`).
    pub(super) fn plan_import(
        &self,
        mut imp: Import,
        rs: &RuleSet,
        policer: &Policer,
        config: &Path,
    ) -> Result<ImportPlan> {
        let t0 = Instant::now();
        let explicit = imp.set.is_some();
        let expires_ms = match &imp.rule.ttl {
            Some(t) => Some(crate::duration::unix_ms().saturating_add(crate::duration::parse(t)?.as_millis() as u64)),
            None => None,
        };
        let name = import_name(&imp, expires_ms);
        sets::check_name(&name)?;
        if !imp.feed && self.feed.as_deref() == Some(name.as_str()) {
            return Err(feed_owns(&name, config));
        }
        let rule = RuleConfig {
            prefix: String::new(),
            action: imp.rule.action,
            rate: imp.rule.rate.clone(),
            burst: imp.rule.burst.clone(),
            key_len: imp.rule.key_len,
            ..RuleConfig::default()
        };
        let old = self.by_name.get(&name);
        let entries = if explicit {
            std::mem::take(&mut imp.list.entries)
        } else {
            union(old.map_or(&[][..], |s| &s.entries), &imp.list.entries)
        };
        // A feed's list, less what it may not drop; with --skip-protected,
        // less what lies inside a protected prefix (named in the answer).
        let action = rule.action.unwrap_or(policer_common::bucket::Action::Police);
        let (entries, refused, skipped) = if imp.feed {
            let (entries, refused) = feed_entries(rs, entries, action);
            (entries, refused, Vec::new())
        } else if imp.skip_protected {
            let (entries, skipped) = unprotected(rs.protect(), entries, action);
            (entries, (skipped.len(), 0), skipped)
        } else {
            (entries, (0, 0), Vec::new())
        };
        let old_entries = old.map_or(&[][..], |o| &o.entries[..]);
        let d = sets::diff(old_entries, &entries);
        // A feed cut short or a failed download must not open a blocklist.
        if !imp.force && !imp.max_remove.allows(d.remove.len(), old_entries.len()) {
            return Err(too_many_removed(&imp, &name, d.remove.len(), old_entries.len()));
        }
        if let Some(o) = old
            && o.origin == Origin::Config
        {
            return Err(Error::Invalid(format!(
                "set '{name}' is declared in the config ([[set]] in {}): change its file or its table, then \
                 `policer reload`; nothing imported",
                config.display()
            )));
        }
        let (spec4, spec6) = sets::specs(&name, &rule, &entries)?;
        check_set_conflicts(rs, &entries, spec4.action, |n| where_in(&imp.file, &imp.text, n))?;
        self.check_capacity(rs, policer, &name, &entries)?;
        let header = Header {
            name: name.clone(),
            rule,
            expires_ms,
            mmdb: imp.mmdb.clone(),
            labels: imp.labels.clone(),
            labeled: false,
        };
        let t_checked = t0.elapsed();
        Ok(ImportPlan { imp, explicit, name, header, spec4, spec6, entries, d, refused, skipped, t0, t_checked })
    }

    /// An import's plan made ready to write: the set as it will be, with
    /// its counter slot (taken from `rs` for a new set) and its rule id (a
    /// new one when its rule changes).
    pub(super) fn writing(&self, plan: ImportPlan, rs: &mut RuleSet) -> Result<Writing> {
        let old = self.by_name.get(&plan.name).cloned();
        let (slot, new_slot) = match &old {
            Some(o) => (o.slot, false),
            None => (rs.take_slot()?, true),
        };
        let same_rule = old.as_ref().is_some_and(|o| o.spec4 == plan.spec4 && o.spec6 == plan.spec6);
        let id = match &old {
            Some(o) if same_rule => o.id,
            _ => rs.new_id(),
        };
        let ImportPlan { imp, explicit, header, spec4, spec6, entries, d, refused, skipped, t0, t_checked, .. } = plan;
        let origin = if imp.runtime { Origin::Runtime } else { Origin::Saved };
        let next = SetState { header, spec4, spec6, id, slot, entries: Arc::new(entries), origin };
        Ok(Writing { imp, explicit, d, refused, skipped, t0, t_checked, old, next, new_slot, same_rule })
    }

    /// A dry run's import, once checked as the real one is: a slot for a
    /// new set, the sets after and the set's change (what the owner keeps
    /// for the preview); nothing written.
    pub(super) fn preview_import(&self, plan: ImportPlan, rs: &RuleSet) -> Result<(String, SetsAfter)> {
        let ImportPlan { imp, header, spec4, spec6, entries, d, skipped, .. } = plan;
        let name = header.name.clone();
        let old = self.by_name.get(&name).cloned();
        if old.is_none() && rs.free_slot_count() == 0 {
            return Err(super::plan::limit(format!("this policer holds {} rules", rs.capacity())));
        }
        let (id, slot) = old.as_ref().map_or((0, 0), |o| (o.id, o.slot));
        let origin = if imp.runtime { Origin::Runtime } else { Origin::Saved };
        let next = SetState { header, spec4, spec6, id, slot, entries: Arc::new(entries), origin };
        let same_rule = old.as_ref().is_some_and(|o| o.spec4 == next.spec4 && o.spec6 == next.spec6);
        let changed = if same_rule { 0 } else { d.keep.len() };
        let msg = format!(
            "set '{name}' ({}): {} prefixes from {}: {} added, {changed} changed, {} removed{}{}",
            describe(&next.spec4),
            next.entries.len(),
            imp.file,
            d.add.len(),
            d.remove.len(),
            notes(&imp.list),
            if skipped.is_empty() {
                String::new()
            } else {
                format!(
                    "; left out (--skip-protected): {} inside a protected prefix ({})",
                    skipped.len(),
                    skipped_text(&skipped)
                )
            },
        );
        let mut sets = self.by_name.clone();
        sets.insert(name, next.clone());
        Ok((msg, SetsAfter { sets, changes: vec![(old, Some(next))] }))
    }

    /// Writes a set's change from `old` to `new` (either absent) into the
    /// tries: each entry holds the value of the set of highest [`rank`]
    /// holding it, or of the longest manual ban of `rs` over it; entries no
    /// set holds any more leave (unless a rule holds the prefix). Adds and
    /// rewrites first, removes last. Returns how many of `new`'s entries
    /// another set outranks.
    pub(super) fn transition(
        &self,
        rs: &RuleSet,
        fds: TrieWriter,
        old: Option<&SetState>,
        new: Option<&SetState>,
    ) -> Result<usize> {
        transition(fds, &self.by_name, rs, old, new)
    }

    /// The tries' room: what they hold after the change, per family.
    fn check_capacity(&self, rs: &RuleSet, policer: &Policer, name: &str, entries: &[IpNet]) -> Result<()> {
        let (c4, c6) = policer.rule_trie_capacity()?;
        let count = |v6: bool| {
            let rules = rs.compiled().prefixes.keys().filter(|n| n.addr().is_ipv6() == v6).count();
            let sets: usize = self
                .by_name
                .iter()
                .filter(|(n, _)| n.as_str() != name)
                .map(|(_, s)| s.entries.iter().filter(|n| n.addr().is_ipv6() == v6).count())
                .sum();
            rules + sets + entries.iter().filter(|n| n.addr().is_ipv6() == v6).count()
        };
        for (v6, cap) in [(false, c4), (true, c6)] {
            let n = count(v6);
            if n > cap as usize {
                return Err(Error::Invalid(format!(
                    "the {} rule trie holds {cap} prefixes; this import needs {n} (a program loaded by an older \
                     policer keeps its size: `policer detach`, then start again, for {}); nothing imported",
                    if v6 { "IPv6" } else { "IPv4" },
                    crate::loader::TRIE_PREFIXES
                )));
            }
        }
        Ok(())
    }

    /// `policer rule rm --set NAME`, judged: the set to remove, unless it
    /// is the feed's or the config's (`config`: the config file's path).
    pub(super) fn removable(&self, name: &str, config: &Path) -> Result<SetState> {
        let s = self.by_name.get(name).cloned().ok_or_else(|| self.unknown_set(name))?;
        if self.feed.as_deref() == Some(name) {
            return Err(feed_owns(name, config));
        }
        if s.origin == Origin::Config {
            return Err(Error::Invalid(format!(
                "set '{name}' is declared in the config ([[set]] in {}): remove its table, then `policer reload`; \
                 nothing changed",
                config.display()
            )));
        }
        Ok(s)
    }

    /// Takes `s` out of the tries (all or nothing), frees its slot in
    /// `rs`, and removes its state file (a file that stays is handed to
    /// the bans' catch-up, which tries again).
    pub(super) fn remove(&mut self, s: &SetState, rs: &mut RuleSet, policer: &Policer, bans: &mut Bans) -> Result<()> {
        let fds = policer.trie_writer()?;
        if let Err(e) = self.transition(rs, fds, Some(s), None) {
            let undo = self.transition(rs, fds, None, Some(s));
            return Err(match undo {
                Ok(_) => Error::Invalid(format!("{e}; nothing changed")),
                Err(u) => Error::Invalid(format!("{e}; and putting it back failed too: {u}")),
            });
        }
        self.by_name.remove(&s.header.name);
        rs.free_slot(s.slot);
        if let Err(e) = sets::remove(&self.dir, &s.header.name) {
            say_err!("policer: set '{}' removed, but not its state file (tried again): {e}", s.header.name);
            bans.set_file_behind(s.header.name.clone());
        }
        Ok(())
    }

    pub(super) fn unknown_set(&self, name: &str) -> Error {
        unknown_set(name, self.by_name.keys().map(String::as_str))
    }

    /// The sets whose expiry has come by `now_unix`.
    pub(super) fn due(&self, now_unix: f64) -> Vec<SetState> {
        let now_ms = (now_unix * 1000.0) as u64;
        self.by_name.values().filter(|s| s.header.expires_ms.is_some_and(|e| e <= now_ms)).cloned().collect()
    }

    /// Refuses rules at a prefix a set holds (a reload), but for the sets
    /// named in `skip` (a reload's changed config sets, checked against
    /// their new lists).
    pub(super) fn refuse_set_prefixes_but(&self, want: &BTreeMap<RuleKey, RuleSpec>, skip: &[String]) -> Result<()> {
        self.refuse_set_prefixes_in(want.keys(), skip)
    }

    /// Refuses rules at a prefix a set holds, for the rules of `keys` only
    /// (a change's new and changed rules: the others were checked when
    /// they came).
    pub(super) fn refuse_set_prefixes_of<'a>(&self, keys: impl Iterator<Item = &'a RuleKey>) -> Result<()> {
        if self.by_name.is_empty() {
            return Ok(());
        }
        self.refuse_set_prefixes_in(keys, &[])
    }

    fn refuse_set_prefixes_in<'a>(&self, keys: impl Iterator<Item = &'a RuleKey>, skip: &[String]) -> Result<()> {
        for key in keys.filter(|k| !k.ban) {
            for (name, s) in self.by_name.iter().filter(|(n, _)| !skip.contains(n)) {
                if s.entries.binary_search(&key.net).is_ok() {
                    return Err(Error::Invalid(format!(
                        "{} is an entry of set '{name}': a prefix has a rule or is an entry of a set, not both \
                         (`policer rule ls --set {name}`); nothing changed",
                        key.net
                    )));
                }
            }
        }
        Ok(())
    }

    /// Refuses when a set holds an entry inside a prefix of `protect` that
    /// it would not allow (the tries' longest match would give the entry).
    /// A feed's set is not refused: its entries inside are left out
    /// ([`Sets::feed_refilter`]), as its syncs leave them out.
    pub(super) fn refuse_protected_entries(&self, protect: &Protect, skip: &[String]) -> Result<()> {
        if protect.is_empty() {
            return Ok(());
        }
        let feed = self.feed.as_deref();
        for (name, s) in self.by_name.iter().filter(|(n, _)| !skip.contains(n) && Some(n.as_str()) != feed) {
            for net in s.entries.iter() {
                protect.refuse_entry(net, s.spec4.action).map_err(|e| Error::Invalid(format!("set '{name}': {e}")))?;
            }
        }
        Ok(())
    }

    /// After `protect` changed: the import that leaves out of the feed's
    /// set the entries now inside a protected prefix (or a rule's prefix)
    /// of `rs`, in one change, as a sync of the feed would leave them out.
    /// A feed cannot be told to fix a decision, and an operator protecting
    /// its own network must not be refused because a feed listed it.
    /// `None`: nothing to leave out.
    pub(super) fn feed_refilter(&self, rs: &RuleSet) -> Option<Import> {
        let name = self.feed.clone()?;
        let s = self.by_name.get(&name)?;
        let action = s.spec4.action;
        let entries = s.entries.to_vec();
        let (kept, (protected, _)) = feed_entries(rs, entries.clone(), action);
        if kept.len() == entries.len() {
            return None;
        }
        Some(Import {
            file: format!("the feed's set '{name}' ({protected} entries now inside a protected prefix left out)"),
            text: Vec::new(),
            list: crate::sets::List { entries, duplicates: 0, mapped: 0 },
            set: Some(name),
            rule: RuleConfig { action: Some(action), ..RuleConfig::default() },
            max_remove: Default::default(),
            force: true,
            runtime: false,
            feed: true,
            skip_protected: false,
            mmdb: None,
            labels: s.header.labels.clone(),
        })
    }

    /// Leaves out of `c` (read back from the kernel) the sets' entries,
    /// which [`RuleSet::compiled`] does not hold.
    pub(super) fn without_entries(&self, mut c: Compiled) -> Compiled {
        strip(&mut c, &self.by_name);
        c
    }

    /// After a change of the rules of `rs`: set entries under a ban that
    /// came, went or changed (`before`: the bans before) get the value they
    /// now have (the ban's, or their set's). Cheap when the bans did not
    /// change (the usual case).
    pub(super) fn follow_bans(&self, rs: &mut RuleSet, policer: &Policer, before: &[(IpNet, Rule)]) -> Result<()> {
        let after = ban_values(rs);
        let protect = rs.protect().clone();
        if self.by_name.is_empty() || (after == before && *rs.entries_protect() == protect) {
            rs.set_entries_protect(protect);
            return Ok(());
        }
        let fds = policer.trie_writer()?;
        let all: Vec<&SetState> = self.by_name.values().collect();
        // What was under the old bans gets its winning set's value back,
        // then what is under the new ones the ban's.
        let mut pairs: BTreeMap<IpNet, Rule> = BTreeMap::new();
        for s in &all {
            for (n, _) in banned(&s.entries, before, &Protect::default()) {
                if let std::collections::btree_map::Entry::Vacant(v) = pairs.entry(n) {
                    let w = all.iter().filter(|o| o.entries.binary_search(&n).is_ok()).max_by_key(|o| rank(o));
                    if let Some(w) = w {
                        v.insert(w.value_for(&n)?);
                    }
                }
            }
        }
        for s in &all {
            pairs.extend(banned(&s.entries, &after, &protect));
        }
        write_pairs(fds, &pairs.into_iter().collect::<Vec<_>>())?;
        rs.set_entries_protect(protect);
        Ok(())
    }

    /// Whether any set holds an entry (the fast path is off then).
    pub(super) fn has_entries(&self) -> bool {
        self.by_name.values().any(|s| !s.entries.is_empty())
    }

    /// Whether a `[[set]]` of the config is read from a MaxMind DB file
    /// (the follower watches those files: a new database is a reload).
    pub(super) fn has_config_databases(&self) -> bool {
        self.by_name.values().any(|s| s.origin == Origin::Config && s.header.mmdb.is_some())
    }
}

/// The set an import writes: `--set NAME`, or the implicit set of the
/// action and rate, which only grows; with a ttl, one of its own per end
/// (to the second), so entries given a ttl go when it ends and no others
/// do.
fn import_name(imp: &Import, expires_ms: Option<u64>) -> String {
    imp.set.clone().unwrap_or_else(|| match expires_ms {
        Some(e) => {
            let end: String =
                crate::duration::rfc3339(e / 1000 * 1000).chars().filter(|c| *c != '-' && *c != ':').collect();
            format!("{}-until-{end}", sets::implicit_name(&imp.rule))
        }
        None => sets::implicit_name(&imp.rule),
    })
}

/// The refusal of an import that would remove more than `--max-remove`.
fn too_many_removed(imp: &Import, name: &str, removed: usize, had: usize) -> Error {
    Error::Invalid(format!(
        "{} would remove {removed} of the {had} entries of set '{name}' ({:.1} %), more than --max-remove {} allows \
         (a feed cut short or a failed download?); nothing changed: check the file, or give --force \
         (or a larger --max-remove) if the set is to shrink that much",
        imp.file,
        removed as f64 * 100.0 / had.max(1) as f64,
        imp.max_remove
    ))
}

/// The refusal of a change by hand to the feed's set (`config`: the
/// config file's path).
fn feed_owns(name: &str, config: &Path) -> Error {
    Error::Invalid(format!(
        "set '{name}' is the CrowdSec feed's ([crowdsec] in {}): it follows the Local API (`cscli decisions \
         add/delete` change it); nothing changed",
        config.display()
    ))
}

/// No entry is a prefix of a rule of `rs` (a set entry and a rule would
/// fight for one trie key): refused before anything is written, naming
/// where the entry is (`locate`: `FILE:LINE`) and the rule. An entry may
/// be in several sets ([`rank`] decides). No entry of a set that does not
/// allow lies inside a protected prefix (`protect` in [daemon]).
fn check_set_conflicts(
    rs: &RuleSet,
    entries: &[IpNet],
    action: policer_common::bucket::Action,
    locate: impl Fn(IpNet) -> String,
) -> Result<()> {
    let rules = rs.rules().keys().filter(|k| !k.ban).map(|k| (k.net, k.to_string()));
    sets::check_conflicts(entries, action, rules, rs.protect(), locate)
}

/// A feed's `entries` without those it may not hold: inside a protected
/// prefix of `rs` (unless it allows), or a rule's prefix. With how many of
/// each were left out.
fn feed_entries(
    rs: &RuleSet,
    entries: Vec<IpNet>,
    action: policer_common::bucket::Action,
) -> (Vec<IpNet>, (usize, usize)) {
    let protect = rs.protect();
    let rules: std::collections::BTreeSet<IpNet> = rs.rules().keys().filter(|k| !k.ban).map(|k| k.net).collect();
    let (mut protected, mut rule) = (0, 0);
    let kept = entries
        .into_iter()
        .filter(|n| {
            if !protect.is_empty() && protect.refuse_entry(n, action).is_err() {
                protected += 1;
                false
            } else if rules.contains(n) {
                rule += 1;
                false
            } else {
                true
            }
        })
        .collect();
    (kept, (protected, rule))
}

/// `entries` without those inside a prefix of `protect` (a set that does
/// `action` may not hold them, unless it allows): what is kept, and each
/// left out with the protected prefix that holds it.
fn unprotected(
    protect: &Protect,
    entries: Vec<IpNet>,
    action: policer_common::bucket::Action,
) -> (Vec<IpNet>, Vec<(IpNet, IpNet)>) {
    if protect.is_empty() || action == policer_common::bucket::Action::Allow {
        return (entries, Vec::new());
    }
    let mut skipped = Vec::new();
    let kept = entries
        .into_iter()
        .filter(|n| match protect.holding(n) {
            Some(p) => {
                skipped.push((*n, *p));
                false
            }
            None => true,
        })
        .collect();
    (kept, skipped)
}

/// An import as it is written ([`Sets::writing`]): the set as it will be,
/// the set as it was, and what the answer and an undo need.
pub(super) struct Writing {
    imp: Import,
    explicit: bool,
    d: sets::Diff,
    refused: (usize, usize),
    skipped: Vec<(IpNet, IpNet)>,
    pub t0: Instant,
    t_checked: std::time::Duration,
    pub old: Option<SetState>,
    pub next: SetState,
    /// The set is new: its slot was taken for it.
    pub new_slot: bool,
    /// Its rule is the one in force (its limiter and id stay).
    pub same_rule: bool,
}

impl Writing {
    /// `rule import --runtime`: no state file.
    pub(super) fn runtime(&self) -> bool {
        self.imp.runtime
    }

    /// What the owner may serve while this import writes: the changes
    /// that meet neither the old nor the new entries.
    pub(super) fn guard(&self) -> Guard<'_> {
        Guard {
            lists: [self.old.as_ref().map_or(&[][..], |o| &o.entries[..]), &self.next.entries[..]],
            tries: !self.next.entries.is_empty(),
        }
    }

    /// Stages the set's state file in `dir` (mode `mode`): the file as
    /// imported, unless entries were left out of it: then what is
    /// imported (a restart reads back what is in force).
    pub(super) fn stage(&self, dir: &Path, mode: u32) -> Result<sets::Staged> {
        let body = if self.explicit && !self.imp.feed && self.skipped.is_empty() {
            sets::Body::Text(&self.imp.text)
        } else {
            sets::Body::Entries(&self.next.entries)
        };
        sets::stage(dir, mode, &self.next.header, body)
    }

    /// The state file could not be staged: the slot back to `rs`, and the
    /// refusal.
    pub(super) fn unstaged(&self, rs: &mut RuleSet, e: Error) -> Error {
        if self.new_slot {
            rs.free_slot(self.next.slot);
        }
        Error::Invalid(format!(
            "{e}; nothing imported (the state directory is `policer attach --state-dir`; \
             `rule import --runtime` imports without saving)"
        ))
    }

    /// How long it was checking the plan (for the log).
    pub(super) fn checked(&self) -> std::time::Duration {
        self.t_checked
    }

    /// The answer to a written import (`shadowed`: entries another set
    /// outranks): the line, and the counts (`--json`).
    pub(super) fn answer(&self, shadowed: usize) -> (String, crate::control::ImportCounts) {
        let (imp, d, next, name) = (&self.imp, &self.d, &self.next, &self.next.header.name);
        let changed = if self.same_rule { 0 } else { d.keep.len() };
        let expires = next.header.expires_ms.map(crate::duration::rfc3339);
        let saved = match (&next.origin, self.old.as_ref().map(|o| &o.origin)) {
            (Origin::Runtime, Some(Origin::Saved)) => {
                "; runtime only: the saved set of this name returns at a restart".to_string()
            }
            (Origin::Runtime, _) => "; runtime only: gone at a restart".to_string(),
            _ => String::new(),
        };
        let msg = format!(
            "set '{name}' ({}): {} prefixes from {}: {} added, {} changed, {} removed{}{}{}{saved} in {:.2} s",
            describe(&next.spec4),
            next.entries.len(),
            imp.file,
            d.add.len(),
            changed,
            d.remove.len(),
            notes(&imp.list),
            if shadowed > 0 {
                format!("; {shadowed} also in a set that takes precedence there (deny > police > monitor > allow)")
            } else {
                String::new()
            },
            expires.as_ref().map(|e| format!("; expires {e}")).unwrap_or_default(),
            self.t0.elapsed().as_secs_f64()
        );
        let msg = match self.refused {
            (0, 0) => msg,
            (p, 0) if !self.skipped.is_empty() => format!(
                "{msg}; left out (--skip-protected): {p} inside a protected prefix ({})",
                skipped_text(&self.skipped)
            ),
            (p, r) => format!(
                "{msg}; left out: {p} inside a protected prefix, {r} the prefix of a rule (`policer inspect ADDR` \
                 says which)"
            ),
        };
        let counts = crate::control::ImportCounts {
            set: name.clone(),
            action: next.spec4.action.to_string(),
            rate: next.spec4.rate.map(|r| r.to_string()),
            entries: next.entries.len() as u64,
            added: d.add.len() as u64,
            changed: changed as u64,
            removed: d.remove.len() as u64,
            unchanged: (d.keep.len() - changed) as u64,
            duplicates: imp.list.duplicates as u64,
            mapped: imp.list.mapped as u64,
            shadowed: shadowed as u64,
            saved: next.origin == Origin::Saved,
            expires,
            refused_protected: self.refused.0 as u64,
            refused_rule_prefix: self.refused.1 as u64,
        };
        (msg, counts)
    }
}

/// A reload's change of the config's `[[set]]`s: each set that is added,
/// changed or removed, read and checked, nothing written yet.
#[derive(Default)]
pub(super) struct ConfigSets {
    /// (in force, wanted): `None` in force: added; `None` wanted: removed.
    /// The wanted set's id and slot are given when it is applied.
    changes: Vec<(Option<SetState>, Option<SetState>)>,
}

impl ConfigSets {
    /// The names of the sets that change (their old lists are not checked
    /// against the new rules: the new ones are).
    pub fn names(&self) -> Vec<String> {
        self.changes.iter().filter_map(|(o, n)| o.as_ref().or(n.as_ref())).map(|s| s.header.name.clone()).collect()
    }

    /// "; sets: added a; changed b; removed c", or nothing.
    pub fn summary(&self) -> String {
        let pick = |f: fn(&(Option<SetState>, Option<SetState>)) -> bool| {
            self.changes
                .iter()
                .filter(|c| f(c))
                .filter_map(|(o, n)| o.as_ref().or(n.as_ref()))
                .map(|s| format!("{} ({} entries)", s.header.name, n_entries(s)))
                .collect::<Vec<_>>()
        };
        let mut parts = Vec::new();
        for (what, names) in [
            ("added", pick(|c| c.0.is_none())),
            ("changed", pick(|c| c.0.is_some() && c.1.is_some())),
            ("removed", pick(|c| c.1.is_none())),
        ] {
            if !names.is_empty() {
                parts.push(format!("{what} {}", names.join(", ")));
            }
        }
        if parts.is_empty() { String::new() } else { format!("; config sets: {}", parts.join("; ")) }
    }
}

fn n_entries(s: &SetState) -> usize {
    s.entries.len()
}

/// One step of a reload's set change, for its undo: the set from `before`
/// to `after`, and whether `after` took a new slot.
pub(super) struct SetStep {
    before: Option<SetState>,
    after: Option<SetState>,
    new_slot: bool,
    /// Written after the rules (an addition).
    late: bool,
}

/// Sorted entries both sorted lists hold.
fn common(a: &[IpNet], b: &[IpNet]) -> Vec<IpNet> {
    sets::diff(a, b).keep
}

/// A reload's set change as it is written ([`Sets::config_removals`],
/// [`Sets::config_slots`], [`Sets::config_additions`]): the steps done,
/// for the undo, and the sets as they end.
#[derive(Default)]
pub(super) struct ConfigWrite {
    steps: Vec<SetStep>,
    /// (the set between the removals and the additions, the set as it
    /// ends).
    finals: Vec<(Option<SetState>, SetState)>,
}

impl ConfigWrite {
    /// The steps done, the removals' (written before the rules) apart from
    /// the additions' (after): an undo puts the additions back, then the
    /// rules, then the removals.
    pub(super) fn split(self) -> (Vec<SetStep>, Vec<SetStep>) {
        self.steps.into_iter().partition(|s| !s.late)
    }
}

impl Sets {
    /// Reads and checks the config's `[[set]]`s for a reload (`config`:
    /// the config file's path, their list files relative to it), against
    /// the rules and protected prefixes it will put in force: every list
    /// file read and parsed, each set's rule against its entries, no entry
    /// a rule's prefix or inside a protected prefix (named `FILE:LINE`).
    /// The kernel is not touched.
    pub(super) fn plan_config(
        &self,
        config: &Path,
        declared: &[sets::SetConfig],
        want: &BTreeMap<RuleKey, RuleSpec>,
        protect: &Protect,
    ) -> Result<ConfigSets> {
        let mut plan = ConfigSets::default();
        for sc in declared {
            let l = sets::read_config_list(config, sc)?;
            let rule = sc.rule();
            let (spec4, spec6) = sets::specs(&sc.name, &rule, &l.list.entries)?;
            let file = l.path.display().to_string();
            let keys = want.keys().filter(|k| !k.ban).map(|k| (k.net, k.to_string()));
            sets::check_conflicts(&l.list.entries, spec4.action, keys, protect, |n| where_in(&file, &l.text, n))
                .map_err(|e| {
                    Error::Invalid(format!("set '{}': {}", sc.name, e.to_string().replace("; nothing imported", "")))
                })?;
            let old = self.by_name.get(&sc.name);
            if let Some(o) = old
                && o.origin == Origin::Config
                && o.header.rule == rule
                && o.entries[..] == l.list.entries[..]
                && o.header.labels.as_deref() == l.mmdb.as_ref().map(|m| &*m.1)
            {
                continue;
            }
            let header = l.header(&sc.name, rule);
            let new = SetState {
                header,
                spec4,
                spec6,
                id: 0,
                slot: 0,
                entries: Arc::new(l.list.entries),
                origin: Origin::Config,
            };
            plan.changes.push((old.cloned(), Some(new)));
        }
        for s in self.by_name.values().filter(|s| s.origin == Origin::Config) {
            if !declared.iter().any(|d| d.name == s.header.name) {
                plan.changes.push((Some(s.clone()), None));
            }
        }
        Ok(plan)
    }

    /// A dry run's reload: the rules of `rs` planned to `want` (with the
    /// new protected prefixes, already set), a slot for each added set as
    /// the real reload takes one, and the sets after (what the owner keeps
    /// for the preview); nothing written.
    pub(super) fn preview_config(
        &self,
        plan: &ConfigSets,
        rs: &RuleSet,
        want: &BTreeMap<RuleKey, RuleSpec>,
    ) -> Result<(super::Rules, SetsAfter)> {
        let rules = rs.plan(want)?;
        let free = rs.free_slot_count() + rules.freed.len() - rules.taken.len();
        let added = plan.changes.iter().filter(|(o, n)| o.is_none() && n.is_some()).count();
        if added > free {
            return Err(super::plan::limit(format!("this policer holds {} rules", rs.capacity())));
        }
        let mut sets = self.by_name.clone();
        for (old, new) in &plan.changes {
            match (old, new) {
                (Some(o), None) => {
                    sets.remove(&o.header.name);
                }
                (o, Some(n)) => {
                    let (id, slot) = o.as_ref().map_or((0, 0), |o| (o.id, o.slot));
                    sets.insert(n.header.name.clone(), SetState { id, slot, ..n.clone() });
                }
                (None, None) => {}
            }
        }
        Ok((rules.rules, SetsAfter { sets, changes: plan.changes.clone() }))
    }

    /// A reload's first writes, before the rules: of each set that changes
    /// or goes, the entries that go, and the new values of those kept (a
    /// changed rule: its limiter in `policer`, a new id from `rs`). Each
    /// step is recorded in `w` before it is written.
    pub(super) fn config_removals(
        &mut self,
        plan: &ConfigSets,
        rs: &mut RuleSet,
        policer: &mut Policer,
        w: &mut ConfigWrite,
    ) -> Result<()> {
        for (old, new) in &plan.changes {
            let Some(o) = old else { continue };
            let mut same = true;
            let mid = match new {
                Some(n) => {
                    same = o.spec4 == n.spec4 && o.spec6 == n.spec6;
                    let id = if same { o.id } else { rs.new_id() };
                    let full = SetState { id, slot: o.slot, ..n.clone() };
                    let mid = SetState { entries: Arc::new(common(&o.entries, &n.entries)), ..full.clone() };
                    w.finals.push((Some(mid.clone()), full));
                    Some(mid)
                }
                None => None,
            };
            w.steps.push(SetStep { before: Some(o.clone()), after: mid.clone(), new_slot: false, late: false });
            if let Some(m) = &mid
                && !same
            {
                prepare(policer, &m.spec4, o.slot)?;
            }
            let fds = policer.trie_writer()?;
            self.transition(rs, fds, Some(o), mid.as_ref())?;
            match mid {
                Some(m) => self.put(m),
                None => {
                    self.by_name.remove(&o.header.name);
                }
            }
        }
        Ok(())
    }

    /// After the rules: each added set's slot (from `rs`), counters and
    /// limiter. Whether a set of the reload will hold entries (the fast
    /// path must be off before they are written).
    pub(super) fn config_slots(
        &mut self,
        plan: &ConfigSets,
        rs: &mut RuleSet,
        policer: &mut Policer,
        w: &mut ConfigWrite,
    ) -> Result<bool> {
        for (old, new) in &plan.changes {
            if old.is_none()
                && let Some(n) = new
            {
                let slot = rs.take_slot()?;
                let full = SetState { id: rs.new_id(), slot, ..n.clone() };
                w.steps.push(SetStep { before: None, after: Some(full.clone()), new_slot: true, late: true });
                policer.reset_rule_counters(slot)?;
                prepare(policer, &full.spec4, slot)?;
                w.finals.push((None, full));
            }
        }
        Ok(w.finals.iter().any(|(_, f)| !f.entries.is_empty()))
    }

    /// The reload's last writes: every changed or added set's entries as
    /// they end.
    pub(super) fn config_additions(&mut self, rs: &RuleSet, policer: &Policer, w: &mut ConfigWrite) -> Result<()> {
        let fds = policer.trie_writer()?;
        for (mid, full) in &w.finals {
            if mid.is_some() {
                w.steps.push(SetStep { before: mid.clone(), after: Some(full.clone()), new_slot: false, late: true });
            }
            self.transition(rs, fds, mid.as_ref(), Some(full))?;
            self.put(full.clone());
        }
        Ok(())
    }

    /// A reload's sets written: removed sets' slots are free now (in
    /// `rs`); a replaced saved set's state file, which would bring it back
    /// at a restart, goes.
    pub(super) fn config_done(&self, plan: ConfigSets, rs: &mut RuleSet) {
        for (old, new) in &plan.changes {
            if let Some(o) = old {
                if new.is_none() {
                    rs.free_slot(o.slot);
                }
                if o.origin == Origin::Saved
                    && let Err(e) = sets::remove(&self.dir, &o.header.name)
                {
                    say_err!("policer: set '{}' replaced, but not its state file: {e}", o.header.name);
                }
            }
        }
    }

    /// Puts the sets of a failed reload's `steps` back, last step first
    /// (`failed`: what could not be put back).
    pub(super) fn undo_config(
        &mut self,
        steps: Vec<SetStep>,
        rs: &mut RuleSet,
        policer: &mut Policer,
        failed: &mut Vec<String>,
    ) {
        for st in steps.into_iter().rev() {
            let r = (|| -> Result<()> {
                let fds = policer.trie_writer()?;
                self.transition(rs, fds, st.after.as_ref(), st.before.as_ref())?;
                if let Some(b) = &st.before
                    && st.after.as_ref().is_some_and(|a| a.spec4 != b.spec4)
                {
                    prepare(policer, &b.spec4, b.slot)?;
                }
                Ok(())
            })();
            if let Err(u) = r {
                failed.push(u.to_string());
            }
            let name = st.after.as_ref().or(st.before.as_ref()).map(|s| s.header.name.clone()).unwrap_or_default();
            match st.before {
                Some(b) => {
                    self.by_name.insert(name, b);
                }
                None => {
                    self.by_name.remove(&name);
                }
            }
            if st.new_slot
                && let Some(a) = &st.after
            {
                rs.free_slot(a.slot);
            }
        }
    }
}

/// "no set NAME", naming the sets there are (`rule ls --set` answers it
/// from the snapshot, off the owner).
pub(super) fn unknown_set<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> Error {
    let known: Vec<&str> = known.collect();
    Error::Invalid(if known.is_empty() {
        format!("no set '{name}': there are no sets (`policer rule import FILE --set {name}` makes one)")
    } else {
        format!("no set '{name}'; the sets are: {}", known.join(", "))
    })
}

fn strip(c: &mut Compiled, sets: &BTreeMap<String, SetState>) {
    for s in sets.values() {
        for n in s.entries.iter() {
            c.prefixes.remove(n);
        }
    }
}

/// `FILE:LINE` of `net` in a list's text, or `FILE` when not found.
fn where_in(file: &str, text: &[u8], net: IpNet) -> String {
    match sets::line_of(text, net) {
        Some(l) => format!("{file}:{l}"),
        None => file.to_string(),
    }
}

/// What an import's message adds about the lines: repeats, and entries
/// written IPv4-mapped.
fn notes(list: &List) -> String {
    let mut out = String::new();
    if list.duplicates > 0 {
        out.push_str(&format!(" ({} repeated lines kept once)", list.duplicates));
    }
    if list.mapped > 0 {
        out.push_str(&format!(
            " ({} IPv4-mapped IPv6 entries, ::ffff:a.b.c.d, taken as the IPv4 addresses they are)",
            list.mapped
        ));
    }
    out
}

/// `deny`, `police 100pps`.
fn describe(s: &RuleSpec) -> String {
    match s.rate {
        Some(r) => format!("{} {r}", s.action),
        None => s.action.to_string(),
    }
}

/// The sets read at start, to be installed once the rules are.
pub(super) struct StartSets {
    pub sets: Vec<(Header, List)>,
    /// The kernel's value at each set's first entry (an adopted program).
    kernel: Vec<Option<Rule>>,
    /// What an adopted program's tries hold at each set's entries, per set:
    /// what a failed start puts back.
    old: Vec<BTreeMap<IpNet, Rule>>,
    /// The sets declared in the config (`[[set]]`), by name: their list
    /// files.
    config: BTreeMap<String, std::path::PathBuf>,
    /// Saved sets a config set of the same name replaces: their state
    /// files go once the start commits.
    pub replaced: Vec<String>,
}

/// What a start records before it changes an adopted program's maps for
/// a set, so that a failed start can put them back (`daemon::start`'s
/// undo log). Each call may fail the start (a test hook).
pub(super) trait SetUndo {
    /// Before the counters of `slot` are zeroed.
    fn zeroing_counters(&mut self, p: &mut crate::loader::Policer, slot: u32) -> Result<()>;
    /// Before the new-source limiter and ban parameters of `slot` are set.
    fn limiter(&mut self, slot: u32) -> Result<()>;
    /// Before `written` (sorted) are written or removed; `old` is what the
    /// tries held at them (an entry not in it was not there).
    fn entries(&mut self, written: Arc<Vec<IpNet>>, old: BTreeMap<IpNet, Rule>) -> Result<()>;
}

impl StartSets {
    /// The counter slots the adopted program's sets count into.
    pub(super) fn kernel_slots(&self) -> impl Iterator<Item = u32> + '_ {
        self.kernel.iter().flatten().map(|r| r.counter_slot).filter(|s| *s != 0)
    }
}

impl StartSets {
    /// Reads the state directory; a set file that does not read is an
    /// error (the start fails rather than policing without a feed).
    pub fn read(dir: &std::path::Path) -> Result<StartSets> {
        Ok(StartSets {
            sets: sets::read_all(dir)?,
            kernel: Vec::new(),
            old: Vec::new(),
            config: BTreeMap::new(),
            replaced: Vec::new(),
        })
    }

    /// Adds the config's `[[set]]`s (`config`: the config file's path),
    /// each read from its list file now; a saved set of the same name is
    /// replaced. A file that does not read or parse fails the start.
    pub fn add_config(&mut self, config: &std::path::Path, declared: &[sets::SetConfig]) -> Result<()> {
        for sc in declared {
            let l = sets::read_config_list(config, sc)?;
            if let Some(i) = self.sets.iter().position(|(h, _)| h.name == sc.name) {
                self.sets.remove(i);
                self.replaced.push(sc.name.clone());
            }
            let header = l.header(&sc.name, sc.rule());
            self.sets.push((header, l.list));
            self.config.insert(sc.name.clone(), l.path);
        }
        self.sets.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        Ok(())
    }

    /// Leaves the sets' entries out of what the kernel holds, so the
    /// start's sync of the rules keeps them (they are rewritten after), and
    /// keeps what the kernel held there.
    pub fn strip(&mut self, c: &mut Compiled) {
        // A set's rule in the kernel is read at an entry no other set
        // holds (at a shared one, another set's value may be in force).
        let lists: Vec<&[IpNet]> = self.sets.iter().map(|(_, l)| &l.entries[..]).collect();
        self.kernel = lists
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let own = |n: &&IpNet| lists.iter().enumerate().all(|(j, o)| j == i || o.binary_search(n).is_err());
                l.iter().find(own).and_then(|n| c.prefixes.get(n)).copied()
            })
            .collect();
        self.old =
            lists.iter().map(|l| l.iter().filter_map(|n| c.prefixes.get(n).map(|r| (*n, *r))).collect()).collect();
        for l in &lists {
            for n in l.iter() {
                c.prefixes.remove(n);
            }
        }
    }
}

/// The tries' writes for one set going from `old` to `new` beside the
/// other sets of `sets` (see [`Sets::transition`]): one definition for
/// the daemon and `policer replay` ([`install_offline`]).
fn transition(
    fds: TrieWriter,
    sets: &BTreeMap<String, SetState>,
    rs: &super::ruleset::RuleSet,
    old: Option<&SetState>,
    new: Option<&SetState>,
) -> Result<usize> {
    let name = new.or(old).map_or("", |s| s.header.name.as_str());
    let others: Vec<&SetState> = sets.values().filter(|s| s.header.name != name).collect();
    let w = plan_writes(&others, old, new)?;
    if let Some(n) = new {
        write(fds, &w.bulk, n.values()?)?;
    }
    write_pairs(fds, &w.pairs)?;
    let bans = ban_values(rs);
    if !bans.is_empty() {
        let mut touched: Vec<IpNet> = w.bulk.iter().copied().chain(w.pairs.iter().map(|p| p.0)).collect();
        touched.sort_unstable();
        write_pairs(fds, &banned(&touched, &bans, rs.protect()))?;
    }
    delete(fds, &not_rules(rs, &w.delete))?;
    Ok(w.shadowed)
}

/// Entries an import writes between two looks at the ends that came due
/// (`owner.rs`: `Daemon::import_transition`): two writers' batches, a quarter of a
/// second or so.
pub(super) const IMPORT_STEP: usize = 2 * CHUNK;

/// The manual bans of `rs`: each prefix and the value the tries hold there.
pub(super) fn ban_values(rs: &super::ruleset::RuleSet) -> Vec<(IpNet, Rule)> {
    rs.rules()
        .keys()
        .filter(|k| k.ban)
        .filter_map(|k| rs.compiled().prefixes.get(&k.net).map(|r| (k.net, *r)))
        .collect()
}

/// `nets` but those the rules of `rs` hold too (a manual ban at an entry's
/// prefix): removing the entry leaves the ban's trie entry alone.
pub(super) fn not_rules<'a>(rs: &super::ruleset::RuleSet, nets: &'a [IpNet]) -> std::borrow::Cow<'a, [IpNet]> {
    let bans: Vec<IpNet> = rs.rules().keys().filter(|k| k.ban).map(|k| k.net).collect();
    if bans.iter().all(|b| nets.binary_search(b).is_err()) {
        return std::borrow::Cow::Borrowed(nets);
    }
    std::borrow::Cow::Owned(nets.iter().filter(|n| !bans.contains(n)).copied().collect())
}

/// Where a set `policer replay` installs comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SetSource {
    /// A `[[set]]` table of the config: its list file.
    Config,
    /// A set saved in the state directory (`rule import`): its state file.
    Saved,
    /// The `[crowdsec]` feed's set, as saved in the state directory.
    Feed,
}

impl std::fmt::Display for SetSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SetSource::Config => "config",
            SetSource::Saved => "saved",
            SetSource::Feed => "feed",
        })
    }
}

/// A named set as [`install_offline`] wrote it.
#[derive(Clone, Debug)]
pub struct OfflineSet {
    pub name: String,
    /// Its rule (the IPv4 one: both families share action, rate and burst).
    pub spec: RuleSpec,
    /// The counter slot its entries count into.
    pub slot: u32,
    pub source: SetSource,
    /// Where it was read: the config's list file, or the state file.
    pub file: PathBuf,
    pub entries: usize,
}

/// A set a start would not install, and why.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LeftOut {
    pub name: String,
    pub source: SetSource,
    pub file: PathBuf,
    pub why: String,
}

/// The `[crowdsec]` feed's set in a replay: its saved set, or none.
#[derive(Clone, Debug, serde::Serialize)]
pub struct FeedSet {
    pub set: String,
    /// Its state file in the state directory (read when `saved`).
    pub file: PathBuf,
    /// A saved set of the feed was found (and installed); `false`: the
    /// feed's set is empty in the replay.
    pub saved: bool,
    pub entries: usize,
}

/// The sets `policer replay` installs, read (and checked as far as they
/// can be without a program) before anything is loaded: the saved sets
/// of the state directory and the config's `[[set]]`s, as a start reads
/// them ([`StartSets::read`], [`StartSets::add_config`]).
pub struct OfflineSets {
    /// In the order a start installs them (by name), each with where it
    /// comes from and the file it was read from.
    sets: Vec<(Header, List, SetSource, PathBuf)>,
    /// The state directory given, and whether it exists.
    pub state_dir: PathBuf,
    pub state_dir_exists: bool,
    /// The saved sets found (the feed's included), before any was left out.
    pub saved: usize,
    /// Saved sets a start leaves out: ended while the daemon was stopped,
    /// or replaced by a config set of their name.
    pub left_out: Vec<LeftOut>,
    /// With `[crowdsec]`: the feed's set.
    pub feed: Option<FeedSet>,
}

impl OfflineSets {
    /// No set at all (nothing to install).
    pub fn is_empty(&self) -> bool {
        self.sets.is_empty()
    }

    pub fn len(&self) -> usize {
        self.sets.len()
    }
}

/// Reads what [`install_offline`] installs: the sets saved in `state_dir`
/// (`DIR/sets/NAME.set`; a directory that does not exist holds none, one
/// that does not read, or a state file that does not, is an error naming
/// it), then the config's `[[set]]`s (their files relative to `config`;
/// a saved set of the same name gives way, as at a start). A saved set
/// that ended by `now_ms` is left out, as a start leaves it out. `feed`:
/// the `[crowdsec]` feed's set name and action; its saved set takes the
/// feed's action, as the feed's first write at a start gives it.
pub fn read_offline(
    state_dir: &Path,
    config: &Path,
    declared: &[sets::SetConfig],
    feed: Option<(String, policer_common::bucket::Action)>,
    now_ms: u64,
) -> Result<OfflineSets> {
    let state_dir_exists = match std::fs::metadata(state_dir) {
        Ok(_) => true,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
        Err(e) => return Err(Error::Invalid(format!("the state directory {}: {e}", state_dir.display()))),
    };
    let dir = sets::sets_dir(state_dir);
    // A state directory that does not exist has no `sets/` either: none.
    let mut loaded = StartSets::read(&dir)?;
    let saved = loaded.sets.len();
    let saved_file = |name: &str| sets::sets_dir_file(&dir, name);
    loaded.add_config(config, declared)?;
    let mut left_out: Vec<LeftOut> = loaded
        .replaced
        .iter()
        .map(|n| LeftOut {
            name: n.clone(),
            source: SetSource::Saved,
            file: saved_file(n),
            why: format!("replaced by the config's [[set]] {n}"),
        })
        .collect();
    let feed_name = feed.as_ref().map(|(n, _)| n.as_str());
    let mut out = Vec::new();
    for (mut h, l) in loaded.sets {
        let (source, file) = match loaded.config.get(&h.name) {
            Some(f) => (SetSource::Config, f.clone()),
            None if Some(h.name.as_str()) == feed_name => (SetSource::Feed, saved_file(&h.name)),
            None => (SetSource::Saved, saved_file(&h.name)),
        };
        if let Some(e) = h.expires_ms.filter(|e| *e <= now_ms) {
            left_out.push(LeftOut {
                name: h.name.clone(),
                source,
                file,
                why: format!("expired at {} (a start removes it)", crate::duration::rfc3339(e)),
            });
            continue;
        }
        if let (SetSource::Feed, Some((_, action))) = (source, &feed) {
            h.rule.action = Some(*action);
        }
        out.push((h, l, source, file));
    }
    let feed = feed.map(|(set, _)| {
        let found = out.iter().find(|(h, _, s, _)| *s == SetSource::Feed && h.name == set);
        FeedSet {
            file: saved_file(&set),
            saved: found.is_some(),
            entries: found.map_or(0, |(_, l, _, _)| l.entries.len()),
            set,
        }
    });
    Ok(OfflineSets { sets: out, state_dir: state_dir.to_path_buf(), state_dir_exists, saved, left_out, feed })
}

/// Installs the sets of [`read_offline`] into a fresh program that no
/// interface runs (`policer replay`), after the rules of `rs`, as a start
/// installs them ([`Sets::install`]): each checked against the rules and
/// `protect` ([`sets::specs`], the conflicts), given a slot, its limiter
/// set on the program's clock at `now_ns`, its entries written beside the
/// sets before it ([`transition`]: the same precedence where sets share
/// an entry).
pub(super) fn install_offline(
    p: &mut crate::loader::Policer,
    rs: &mut super::ruleset::RuleSet,
    loaded: OfflineSets,
    now_ns: u64,
) -> Result<Vec<OfflineSet>> {
    let mut states: BTreeMap<String, SetState> = BTreeMap::new();
    let mut out = Vec::new();
    for (h, l, source, file) in loaded.sets {
        let (spec4, spec6) = sets::specs(&h.name, &h.rule, &l.entries)?;
        let rules = rs.rules().keys().filter(|k| !k.ban).map(|k| (k.net, k.to_string()));
        sets::check_conflicts(&l.entries, spec4.action, rules, rs.protect(), |n| {
            let text = std::fs::read(&file).unwrap_or_default();
            where_in(&file.display().to_string(), &text, n)
        })?;
        let slot = rs.take_slot()?;
        let id = rs.new_id();
        let origin = if source == SetSource::Config { Origin::Config } else { Origin::Saved };
        let entries = l.entries.len();
        let s = SetState { header: h, spec4, spec6, id, slot, entries: Arc::new(l.entries), origin };
        super::ruleset::prepare_at(p, &s.spec4, slot, now_ns)?;
        transition(p.trie_writer()?, &states, rs, None, Some(&s))?;
        out.push(OfflineSet { name: s.header.name.clone(), spec: s.spec4.clone(), slot, source, file, entries });
        states.insert(s.header.name.clone(), s);
    }
    Ok(out)
}

impl Sets {
    /// Installs the sets read at start: each keeps the counter slot its
    /// entries have in the kernel (an adopted program), or takes one. What
    /// it changes in an adopted program is recorded in `undo` first. The
    /// sets that expired while the daemon was down are left out (and their
    /// entries removed); their names are returned, for the start to remove
    /// their files once it commits (a failed start leaves them).
    pub(super) fn install(
        &mut self,
        loaded: StartSets,
        rs: &mut RuleSet,
        policer: &mut Policer,
        undo: &mut impl SetUndo,
    ) -> Result<Vec<String>> {
        let mut expired = Vec::new();
        let now = crate::duration::unix_ms();
        let config = loaded.config;
        let kernel = loaded.kernel.into_iter().chain(std::iter::repeat(None));
        let old = loaded.old.into_iter().chain(std::iter::repeat_with(BTreeMap::new));
        // The expired first: what they remove, a live set holding the same
        // prefix writes back after.
        let (dead, live): (Vec<_>, Vec<_>) = loaded
            .sets
            .into_iter()
            .zip(kernel)
            .zip(old)
            .partition(|(((h, _), _), _)| h.expires_ms.is_some_and(|e| e <= now));
        for (((h, l), k), old) in dead.into_iter().chain(live) {
            if h.expires_ms.is_some_and(|e| e <= now) {
                // Expired while the daemon was down: gone, not revived; its
                // entries leave an adopted program's tries too (they were
                // kept out of the rules' sync).
                // Not a prefix the rules now hold (a manual ban or a rule
                // at an entry's prefix: the rules' sync wrote it again).
                let held = &rs.compiled().prefixes;
                let old: BTreeMap<IpNet, Rule> = old.into_iter().filter(|(n, _)| !held.contains_key(n)).collect();
                if !old.is_empty() {
                    let gone: Vec<IpNet> = old.keys().copied().collect();
                    undo.entries(Arc::new(gone.clone()), old)?;
                    delete(policer.trie_writer()?, &gone)?;
                }
                expired.push(h.name);
                continue;
            }
            let (spec4, spec6) = sets::specs(&h.name, &h.rule, &l.entries)?;
            let from_config = config.get(&h.name);
            let file = from_config.cloned().unwrap_or_else(|| sets::sets_dir_file(&self.dir, &h.name));
            check_set_conflicts(rs, &l.entries, spec4.action, |n| {
                let text = std::fs::read(&file).unwrap_or_default();
                where_in(&file.display().to_string(), &text, n)
            })?;
            let slot = match k {
                Some(r) if rs.mark_slot_used(r.counter_slot) => r.counter_slot,
                _ => {
                    let s = rs.take_slot()?;
                    undo.zeroing_counters(policer, s)?;
                    s
                }
            };
            let id = rs.new_id();
            let origin = if from_config.is_some() { Origin::Config } else { Origin::Saved };
            let mut s = SetState { header: h, spec4, spec6, id, slot, entries: Arc::new(l.entries), origin };
            // The same rule as the kernel's keeps its id (its buckets go on).
            if let Some(r) = k {
                let v4 = s.spec4.kernel(r.rule_id)?.with_counter_slot(slot);
                let v6 = s.spec6.kernel(r.rule_id)?.with_counter_slot(slot);
                if v4 == r || v6 == r {
                    s.id = r.rule_id;
                }
            }
            undo.limiter(slot)?;
            prepare(policer, &s.spec4, slot)?;
            undo.entries(s.entries.clone(), old)?;
            self.transition(rs, policer.trie_writer()?, None, Some(&s))?;
            self.put(s);
        }
        Ok(expired)
    }

    /// Removes the state files of sets that expired while the daemon was
    /// down (see [`Sets::install`]).
    pub(super) fn remove_expired(&self, names: &[String], out: &mut impl std::io::Write) {
        for n in names {
            match sets::remove(&self.dir, n) {
                Ok(()) => {
                    let _ = writeln!(out, "policer: set '{n}' expired while the daemon was stopped; removed");
                }
                Err(e) => {
                    let _ = writeln!(out, "policer: warning: set '{n}' expired while the daemon was stopped: {e}");
                }
            }
        }
    }
}

/// Removes the temporary files of writes killed midway (`files.rs`): the
/// config file's, the sets' state files' and the feeds' state files',
/// each named in the log. Run at start, once this namespace's lock is held.
pub(super) fn remove_leftovers(config: &std::path::Path, sets_dir: &std::path::Path) {
    let (mut removed, mut failed) = crate::config::remove_leftovers(config);
    // The automatic bans a plain exit keeps (`bans.rs`), beside `sets/`.
    let kept = super::bans::kept_bans_file(sets_dir);
    let kept_leftovers = match kept.parent() {
        Some(dir) if dir.is_dir() => {
            // And the bans it keeps (`ban --state`, `statebans.rs`).
            crate::files::remove_leftovers(dir, |n| {
                matches!(crate::files::temp_stem(n), Some("auto-bans.json" | "bans.json"))
            })
        }
        _ => (Vec::new(), Vec::new()),
    };
    for (r, f) in
        [sets::remove_leftovers(sets_dir), sets::remove_feed_leftovers(&sets::feeds_dir_of(sets_dir)), kept_leftovers]
    {
        removed.extend(r);
        failed.extend(f);
    }
    for p in removed {
        say!("policer: removed {}, the temporary file of a write that did not finish", p.display());
    }
    for (p, e) in failed {
        say!(
            "policer: warning: cannot remove {}, a temporary file left by a write that did not finish: {e}",
            p.display()
        );
    }
}

/// Reads and parses an import's file (on a blocking thread, not the
/// owner): a regular file of at most [`crate::files::IMPORT`]'s bound, read
/// without blocking (`files.rs`); a UTF-8 byte order mark at its start is
/// dropped. A list with no entries is refused: an empty feed is a failed
/// download far more often than a wish (`rule rm --set` removes a set).
/// Errors name the file as the user gave it.
pub fn read_import(
    path: &str,
    shown: &str,
    set: Option<String>,
    rule: RuleConfig,
    max_remove: Option<MaxRemove>,
    force: bool,
    mmdb: Option<crate::mmdb::Query>,
) -> Result<Import> {
    let file = if shown.is_empty() { path.to_string() } else { shown.to_string() };
    if let Some(n) = &set {
        sets::check_name(n)?;
    }
    if let Some(q) = mmdb {
        return read_mmdb_import(path, &file, set, rule, max_remove, force, q);
    }
    let mut text = crate::files::read_regular(std::path::Path::new(path), crate::files::IMPORT).map_err(|e| {
        Error::Invalid(match e {
            crate::files::ReadError::Io(e) => format!("{file}: {e}; nothing imported"),
            e => format!("{file} {e}; nothing imported"),
        })
    })?;
    if text.starts_with(sets::BOM) {
        // Not kept in the state file either (it holds the list as read).
        text.drain(..sets::BOM.len());
    }
    let list = sets::parse(&text, &file)?;
    if list.entries.is_empty() {
        let rm = match &set {
            Some(n) => format!(" (`policer rule rm --set {n}` removes the set)"),
            None => String::new(),
        };
        return Err(Error::Invalid(format!(
            "{file} has no entries ({} bytes: empty, or only comments and blank lines; a failed download?); \
             nothing changed{rm}",
            text.len()
        )));
    }
    Ok(Import {
        file,
        text,
        list,
        set,
        rule,
        max_remove: max_remove.unwrap_or_default(),
        force,
        runtime: false,
        feed: false,
        skip_protected: false,
        mmdb: None,
        labels: None,
    })
}

/// [`read_import`] of `--mmdb FILE --country … --asn …`: the set is the
/// database's networks of those countries and ASes, each labelled with
/// what put it there. Only into a named set (`--set`): the database is
/// the set's whole truth, replaced as a list file replaces its set. A
/// database that does not open, holds nothing, is cut short or has none
/// of them changes nothing.
fn read_mmdb_import(
    path: &str,
    file: &str,
    set: Option<String>,
    rule: RuleConfig,
    max_remove: Option<MaxRemove>,
    force: bool,
    q: crate::mmdb::Query,
) -> Result<Import> {
    let nothing = |e: Error| match e {
        Error::Invalid(m) => Error::Invalid(format!("{m}; nothing imported")),
        e => e,
    };
    if set.is_none() {
        return Err(Error::Invalid("--mmdb needs --set NAME: the database is the whole of that set".into()));
    }
    q.check().map_err(nothing)?;
    let sel = crate::mmdb::read(std::path::Path::new(path), file, &q).map_err(nothing)?;
    let text = sel.text();
    let shown = format!(
        "{file} ({}, {} of its {} networks: {})",
        sel.database_type,
        sel.entries.len(),
        sel.networks,
        q.describe()
    );
    Ok(Import {
        file: shown,
        text,
        list: List { entries: sel.entries, duplicates: 0, mapped: sel.mapped },
        set,
        rule,
        max_remove: max_remove.unwrap_or_default(),
        force,
        runtime: false,
        feed: false,
        skip_protected: false,
        mmdb: Some(sets::MmdbSource { file: path.to_string(), query: q }),
        labels: Some(sel.labels),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sets::family_spec;

    fn nets(v: &[&str]) -> Vec<IpNet> {
        let mut v: Vec<IpNet> = v.iter().map(|s| s.parse().unwrap()).collect();
        v.sort();
        v
    }

    fn rule(id: u32) -> Rule {
        Rule::packets(1, 1).unwrap().with_id(id)
    }

    /// Entries under bans get the longest ban's value; an entry that holds
    /// a ban (shorter) or sits beside it does not.
    #[test]
    fn entries_under_bans() {
        let list = nets(&[
            "10.0.0.0/8",
            "10.1.0.0/16",
            "10.1.2.3/32",
            "10.1.255.255/32",
            "10.2.0.1/32",
            "2001:db8::1/128",
            "2001:db8:1::/48",
        ]);
        let bans = [
            ("10.1.0.0/16".parse().unwrap(), rule(1)),
            ("10.1.2.0/24".parse().unwrap(), rule(2)),
            ("2001:db8::/64".parse().unwrap(), rule(3)),
        ];
        let got: Vec<(String, u32)> =
            banned(&list, &bans, &Protect::default()).into_iter().map(|(n, r)| (n.to_string(), r.rule_id)).collect();
        assert_eq!(
            got,
            vec![
                ("10.1.0.0/16".to_string(), 1),
                ("10.1.2.3/32".to_string(), 2),
                ("10.1.255.255/32".to_string(), 1),
                ("2001:db8::1/128".to_string(), 3),
            ]
        );
        assert!(banned(&list, &[], &Protect::default()).is_empty());
    }

    fn set(name: &str, action: &str, rate: Option<&str>, id: u32, list: &[&str]) -> SetState {
        let rule = RuleConfig {
            action: Some(<policer_common::bucket::Action as clap::ValueEnum>::from_str(action, false).unwrap()),
            rate: rate.map(str::to_string),
            ..RuleConfig::default()
        };
        SetState {
            header: Header { name: name.into(), rule: rule.clone(), expires_ms: None, ..Header::default() },
            spec4: family_spec(name, &rule, false).unwrap(),
            spec6: family_spec(name, &rule, true).unwrap(),
            id,
            slot: id,
            entries: Arc::new(nets(list)),
            origin: Origin::Saved,
        }
    }

    /// deny > police > monitor > allow; one action: the name sorting first.
    #[test]
    fn precedence_of_sets() {
        let deny = set("z-drop", "deny", None, 1, &[]);
        let police = set("a-slow", "police", Some("10pps"), 2, &[]);
        let monitor = set("a-watch", "monitor", Some("10pps"), 3, &[]);
        let allow = set("a-ok", "allow", None, 4, &[]);
        let police_b = set("b-slow", "police", Some("1pps"), 5, &[]);
        assert!(rank(&deny) > rank(&police) && rank(&police) > rank(&monitor) && rank(&monitor) > rank(&allow));
        assert!(rank(&police) > rank(&police_b), "a-slow sorts before b-slow");
    }

    /// What an import, a replacement and a removal write where sets
    /// overlap: the winner's value everywhere, nothing deleted that
    /// another set holds.
    #[test]
    fn writes_where_sets_overlap() {
        let v = |s: &SetState, n: &str| s.value_for(&n.parse().unwrap()).unwrap();
        let feed = set("feed", "deny", None, 1, &["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32"]);
        let ok = set("a-ok", "allow", None, 2, &["10.0.0.2/32", "10.0.0.9/32"]);
        // The allowlist imported beside the blocklist: 10.0.0.2 stays denied.
        let w = plan_writes(&[&feed], None, Some(&ok)).unwrap();
        assert_eq!((w.bulk, w.pairs.len(), w.delete.len(), w.shadowed), (nets(&["10.0.0.9/32"]), 0, 0, 1));
        // The blocklist imported beside the allowlist: all of it written.
        let w = plan_writes(&[&ok], None, Some(&feed)).unwrap();
        assert_eq!((w.bulk, w.shadowed), (feed.entries.to_vec(), 0));
        // The blocklist drops 10.0.0.2: the allowlist's value goes back
        // there, not a delete; 10.0.0.3 goes.
        let smaller = set("feed", "deny", None, 1, &["10.0.0.1/32"]);
        let w = plan_writes(&[&ok], Some(&feed), Some(&smaller)).unwrap();
        assert!(w.bulk.is_empty(), "same rule, nothing added");
        assert_eq!(w.pairs, vec![("10.0.0.2/32".parse().unwrap(), v(&ok, "10.0.0.2/32"))]);
        assert_eq!(w.delete, nets(&["10.0.0.3/32"]));
        // The blocklist removed: the same.
        let w = plan_writes(&[&ok], Some(&feed), None).unwrap();
        assert_eq!((w.pairs.len(), w.delete.clone()), (1, nets(&["10.0.0.1/32", "10.0.0.3/32"])));
        // The blocklist turned into an allow set: "a-ok" sorts first, so
        // it wins at 10.0.0.2 now, and its value goes back there.
        let relaxed = set("feed", "allow", None, 3, &["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32"]);
        let w = plan_writes(&[&ok], Some(&feed), Some(&relaxed)).unwrap();
        assert_eq!(w.bulk, nets(&["10.0.0.1/32", "10.0.0.3/32"]));
        assert_eq!((w.pairs, w.shadowed), (vec![("10.0.0.2/32".parse().unwrap(), v(&ok, "10.0.0.2/32"))], 1));
        // Three sets: the best of the others is the one that goes back.
        let police = set("slow", "police", Some("5pps"), 4, &["10.0.0.2/32"]);
        let w = plan_writes(&[&ok, &police], Some(&feed), None).unwrap();
        assert!(w.pairs.contains(&("10.0.0.2/32".parse().unwrap(), v(&police, "10.0.0.2/32"))));
    }

    #[test]
    fn union_and_split() {
        let a = nets(&["10.0.0.1/32", "2001:db8::/32"]);
        let b = nets(&["10.0.0.1/32", "10.0.0.2/32"]);
        assert_eq!(union(&a, &b), nets(&["10.0.0.1/32", "10.0.0.2/32", "2001:db8::/32"]));
        let u = union(&a, &b);
        let (v4, v6) = split(&u);
        assert_eq!((v4.len(), v6.len()), (2, 1));
    }

    /// What a replay reads of a state directory (`read_offline`): the
    /// saved sets as a start reads them (state files written by the
    /// daemon's own writer), a config set of a saved set's name in its
    /// place, an ended set left out, the feed's set named with the feed's
    /// action; a missing directory holds none; a bad state file is an
    /// error naming it.
    #[test]
    fn a_replay_reads_the_saved_sets_as_a_start_does() {
        use policer_common::bucket::Action;
        let tmp = tempfile::tempdir().unwrap();
        let state = tmp.path().join("state");
        let config = tmp.path().join("policer.toml");
        let none = read_offline(&state, &config, &[], None, 1_000).unwrap();
        assert!(!none.state_dir_exists && none.is_empty() && none.saved == 0);
        let dir = sets::sets_dir(&state);
        let save = |name: &str, action: Action, expires_ms: Option<u64>, list: &[&str]| {
            let rule = RuleConfig { action: Some(action), ..RuleConfig::default() };
            let h = Header { name: name.into(), rule, expires_ms, ..Header::default() };
            sets::stage(&dir, 0o600, &h, sets::Body::Entries(&nets(list))).unwrap().commit().unwrap();
        };
        save("crowdsec", Action::Deny, None, &["192.0.2.1/32", "192.0.2.2/32"]);
        save("deny", Action::Deny, None, &["203.0.113.0/24"]);
        save("ended", Action::Deny, Some(999), &["198.51.100.0/24"]);
        save("swap", Action::Deny, Some(5_000), &["192.0.2.77/32"]);
        std::fs::write(tmp.path().join("swap.txt"), "192.0.2.88\n").unwrap();
        let declared = [sets::SetConfig { name: "swap".into(), file: "swap.txt".into(), ..sets::SetConfig::default() }];
        let r = read_offline(&state, &config, &declared, Some(("crowdsec".into(), Action::Monitor)), 1_000).unwrap();
        assert!(r.state_dir_exists);
        assert_eq!(r.saved, 4);
        let got: Vec<(&str, SetSource, usize, Option<Action>)> =
            r.sets.iter().map(|(h, l, s, _)| (h.name.as_str(), *s, l.entries.len(), h.rule.action)).collect();
        assert_eq!(
            got,
            vec![
                ("crowdsec", SetSource::Feed, 2, Some(Action::Monitor)),
                ("deny", SetSource::Saved, 1, Some(Action::Deny)),
                ("swap", SetSource::Config, 1, Some(Action::Deny)),
            ]
        );
        assert_eq!(r.sets[2].3, tmp.path().join("swap.txt"));
        assert_eq!(r.sets[0].3, dir.join("crowdsec.set"));
        let left: Vec<(&str, &str)> = r.left_out.iter().map(|l| (l.name.as_str(), l.why.as_str())).collect();
        assert_eq!(left.len(), 2);
        assert!(left.contains(&("swap", "replaced by the config's [[set]] swap")), "{left:?}");
        assert!(left.iter().any(|(n, why)| *n == "ended" && why.starts_with("expired at 1970-01-01T00:00:00.999Z")));
        let f = r.feed.unwrap();
        assert_eq!((f.set.as_str(), f.saved, f.entries), ("crowdsec", true, 2));
        // A feed without a saved set: empty.
        let r = read_offline(&state, &config, &[], Some(("other".into(), Action::Deny)), 1_000).unwrap();
        let f = r.feed.unwrap();
        assert_eq!((f.saved, f.entries, f.file), (false, 0, dir.join("other.set")));
        // A state file that does not read: named.
        std::fs::write(dir.join("bad.set"), "not a set\n").unwrap();
        let e = read_offline(&state, &config, &[], None, 1_000).err().unwrap().to_string();
        assert!(e.contains(&format!("{}:1: not a policer set file", dir.join("bad.set").display())), "{e}");
    }
}
