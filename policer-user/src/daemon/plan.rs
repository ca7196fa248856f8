//! Planning a change of the rules, without touching the kernel.
//!
//! From the rules held now (in force, or at a start those an adopted
//! program's maps hold) and the rules wanted, [`plan`] works out which
//! rules keep their id and counter slot, which get a new id (their buckets
//! rescale) or a new slot, which slots are taken and freed, and what the
//! rule maps will hold (the compiled tries, class index and filters). It
//! is a pure function: a plan that fails (the rule limit, classes that tie)
//! changes nothing, and it is tested on the host.
//!
//! The start and every change (`rule set`/`rm`, `ban`, a reload, an
//! expiry) plan here; the plan is then written to the kernel in one place
//! (`Daemon::write_plan`, or the start's transaction with its undo log) and
//! taken as the rule set in force by `RuleSet::commit`.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use policer_common::{Rule, bucket::Action};

use super::{Installed, Rules};
use crate::{
    classes::Class,
    compile::{Compiled, Groups, KernelRule, compile},
    error::{Error, Result},
    protect::Protect,
    rules::{RuleKey, RuleSpec},
};

/// What is known of a rule held now.
#[derive(Clone, Debug)]
pub(super) enum Form<'a> {
    /// A rule in force: its spec.
    Spec(&'a RuleSpec),
    /// A rule an adopted program holds: only its kernel form.
    Kernel(Rule),
}

/// A rule held now, with its id and counter slot.
#[derive(Clone, Debug)]
pub(super) struct HeldRule<'a> {
    pub id: u32,
    pub slot: u32,
    pub form: Form<'a>,
}

impl HeldRule<'_> {
    /// Whether `want` polices exactly as this rule does (it then keeps its
    /// id, and so its buckets).
    fn same(&self, want: &RuleSpec) -> Result<bool> {
        Ok(match &self.form {
            Form::Spec(s) => *s == want,
            Form::Kernel(k) => same_params(k, &want.kernel(0)?),
        })
    }

    /// Whether `want` has the same aggregate bucket (`--total-rate`) as
    /// this rule; unknown for an adopted rule, so no.
    fn same_total(&self, want: &RuleSpec) -> bool {
        matches!(&self.form, Form::Spec(s) if s.total() == want.total())
    }
}

impl<'a> From<&'a Installed> for HeldRule<'a> {
    fn from(i: &'a Installed) -> HeldRule<'a> {
        HeldRule { id: i.id, slot: i.slot, form: Form::Spec(&i.spec) }
    }
}

/// Whether two kernel rules police alike (ids, slots and what the class
/// compiler adds aside).
fn same_params(a: &Rule, b: &Rule) -> bool {
    let plain = |r: &Rule| Rule {
        rule_id: 0,
        counter_slot: 0,
        classes: 0,
        class_protos: 0,
        flags: r.flags & !policer_common::class::RULE_CLASS,
        ..*r
    };
    plain(a) == plain(b)
}

/// A new or changed rule: its counter slot's new-source limiter, ban
/// parameters and (if `total`) aggregate bucket are written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Write {
    pub key: RuleKey,
    pub slot: u32,
    /// The slot is new to this rule: its counters start at zero.
    pub fresh: bool,
    /// The aggregate bucket changed (or is not known to be the same).
    pub total: bool,
}

/// What a change does to the rules.
#[derive(Debug)]
pub(super) struct Plan {
    /// The rules in force after it.
    pub rules: super::Rules,
    /// The slots to write, in key order.
    pub writes: Vec<Write>,
    /// Slots taken from the free ones, and slots given back.
    pub taken: Vec<u32>,
    pub freed: Vec<u32>,
    /// What the rule maps hold after it, and the class groups. Empty when
    /// `delta` is given: the maps are then the ones in force with it made.
    pub compiled: Compiled,
    /// A plan of a few edits ([`plan_edits`]): the edited keys, and the
    /// prefixes of the tries whose value changes (`None`: removed).
    pub delta: Option<Delta>,
    pub groups: Groups,
    /// The next rule id not yet used.
    pub next_id: u32,
}

/// What a plan of a few edits changes of the rule maps, and which rules.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Delta {
    /// The edited rules' keys, in order.
    pub keys: Vec<RuleKey>,
    /// The tries' prefixes whose value changes, in order (`None`: removed).
    pub prefixes: Vec<(IpNet, Option<Rule>)>,
}

impl Plan {
    /// What the rule maps hold after the plan, the maps in force holding
    /// `now` (tests: a plan of edits against the whole plan).
    #[cfg(test)]
    pub fn compiled_after(&self, now: &Compiled) -> Compiled {
        let Some(d) = &self.delta else { return self.compiled.clone() };
        let mut c = now.clone();
        for (net, v) in &d.prefixes {
            match v {
                Some(r) => c.prefixes.insert(*net, *r),
                None => c.prefixes.remove(net),
            };
        }
        c
    }

    /// Whether the tries hold a prefix longer than /0 after the plan (the
    /// default rules' fast path must be off before it is written). For a
    /// delta, only what it adds: the maps in force are the rest.
    pub fn adds_longer_prefix(&self) -> bool {
        match &self.delta {
            Some(d) => d.prefixes.iter().any(|(n, v)| v.is_some() && n.prefix_len() != 0),
            None => self.compiled.prefixes.keys().any(|n| n.prefix_len() != 0),
        }
    }
}

/// Plans bringing the rules `held` to `want` (already validated).
///
/// A rule that polices as it did keeps its id and slot; a changed one keeps
/// its slot with a new id; a new one takes the lowest free slot or, at the
/// rule limit, one a removed rule gives up in the same change. `free` lists
/// the slots not held; `capacity` is the rule limit. A rule that would do
/// anything but allow inside a `protect`ed prefix fails the plan, and the
/// protected prefixes allow in the tries over any ban ([`Protect`]).
pub(super) fn plan(
    held: &BTreeMap<RuleKey, HeldRule<'_>>,
    want: &BTreeMap<RuleKey, RuleSpec>,
    protect: &Protect,
    free: impl IntoIterator<Item = u32>,
    capacity: u32,
    groups: &Groups,
    next_id: u32,
) -> Result<Plan> {
    // Nothing but allow inside a protected prefix, whatever asks for it.
    for spec in want.values() {
        protect.refuse_rule(spec)?;
    }
    if want.len() > capacity as usize {
        return Err(limit(format!("{} rules, more than this policer's limit of {capacity}", want.len())));
    }
    let mut free = free.into_iter();
    let mut gone: Vec<u32> = held.iter().filter(|(k, _)| !want.contains_key(k)).map(|(_, h)| h.slot).collect();
    let (mut rules, mut writes, mut taken) = (Vec::with_capacity(want.len()), Vec::new(), Vec::new());
    let mut id = next_id;
    let mut new_id = || {
        id += 1;
        id - 1
    };
    for (key, spec) in want {
        let (inst, write) = match held.get(key) {
            Some(h) if h.same(spec)? => {
                (Installed { spec: std::sync::Arc::new(spec.clone()), id: h.id, slot: h.slot, persisted: false }, None)
            }
            Some(h) => {
                let w = Write { key: key.clone(), slot: h.slot, fresh: false, total: !h.same_total(spec) };
                (
                    Installed { spec: std::sync::Arc::new(spec.clone()), id: new_id(), slot: h.slot, persisted: false },
                    Some(w),
                )
            }
            None => {
                let slot = match free.next() {
                    Some(s) => {
                        taken.push(s);
                        s
                    }
                    None => gone.pop().ok_or_else(|| limit(format!("this policer holds {capacity} rules")))?,
                };
                let w = Write { key: key.clone(), slot, fresh: true, total: true };
                (Installed { spec: std::sync::Arc::new(spec.clone()), id: new_id(), slot, persisted: false }, Some(w))
            }
        };
        writes.extend(write);
        rules.push((key.clone(), inst));
    }
    let rules = packed(rules);
    let next_id = id;
    let mut groups = groups.clone();
    // Sized at once: a collect through `Result` grows by doubling (at
    // 1 000 000 rules, twice the room, and a copy, at the start's peak).
    let mut list = Vec::with_capacity(rules.len());
    for (k, i) in rules.iter() {
        list.push(KernelRule {
            net: k.net,
            class: k.class(),
            rule: i.spec.kernel(i.id)?.with_counter_slot(i.slot),
            ban: k.ban,
            inherit: i.spec.inherits(),
        });
    }
    let mut compiled = compile(&list, &mut groups)?;
    // Protected prefixes allow, over any ban covering them.
    protect.apply(&mut compiled.prefixes);
    Ok(Plan { rules, writes, taken, freed: gone, compiled, delta: None, groups, next_id })
}

/// The rules in force from `sorted` (in key order), with full leaves.
/// `imbl` builds a map by inserts, and inserts in key order leave every
/// leaf it splits half full (16 entries a leaf: 12 500 leaves of 1.3 KB
/// for 100 000 rules, measured with heaptrack). Inserting every other key
/// first, then the ones between, fills each of those half-full leaves with
/// the keys that fall in it: about half the leaves, the same map.
fn packed(sorted: Vec<(RuleKey, Installed)>) -> Rules {
    let mut rules = Rules::new();
    let mut between = Vec::with_capacity(sorted.len() / 2);
    for (i, (k, v)) in sorted.into_iter().enumerate() {
        if i % 2 == 1 {
            rules.insert(k, v);
        } else {
            between.push((k, v));
        }
    }
    for (k, v) in between {
        rules.insert(k, v);
    }
    rules
}

/// What [`plan_edits`] starts from: the rules in force and what the rule
/// maps hold for them.
pub(super) struct InForce<'a> {
    pub rules: &'a Rules,
    pub compiled: &'a Compiled,
    /// How many class rules each prefix has.
    pub class_nets: &'a BTreeMap<IpNet, u32>,
    pub groups: &'a Groups,
    pub protect: &'a Protect,
    pub capacity: u32,
    pub next_id: u32,
}

/// The most class prefixes [`plan_edits`] looks through for one under an
/// edited prefix; more, and the whole plan is made.
const MAX_CLASS_NETS_SCANNED: usize = 4096;

/// Plans `edits` (each key once, in key order; `None` removes the rule)
/// made to the rules in force: the plan [`plan`] makes of the whole rule
/// set with the edits made — the same rules, ids, slots and writes, and
/// the same rule maps after it — at a cost that grows with the edits, not
/// with the rules. `None` when the edits are not of that kind: a rule with
/// a class, or a prefix with a class rule at, under or over an edited one
/// (the class chains and groups are compiled as a whole), or a ban of a /0;
/// the whole plan is made then. Tests check every such plan against the
/// whole one (`RuleSet::plan_edits`).
pub(super) fn plan_edits(
    now: &InForce<'_>,
    edits: &BTreeMap<RuleKey, Option<RuleSpec>>,
    free: impl IntoIterator<Item = u32>,
) -> Result<Option<Plan>> {
    if !edits_plannable(now, edits)? {
        return Ok(None);
    }
    let added = edits.iter().filter(|(k, v)| v.is_some() && !now.rules.contains_key(*k)).count();
    let removed = edits.iter().filter(|(k, v)| v.is_none() && now.rules.contains_key(*k)).count();
    let len = now.rules.len() + added - removed;
    if len > now.capacity as usize {
        return Err(limit(format!("{len} rules, more than this policer's limit of {}", now.capacity)));
    }
    // Slots and ids as the whole plan gives them: in key order, new rules
    // the lowest free slots, then (at the limit) the removed rules' slots.
    let mut free = free.into_iter();
    let mut gone: Vec<u32> =
        edits.iter().filter(|(_, v)| v.is_none()).filter_map(|(k, _)| now.rules.get(k).map(|h| h.slot)).collect();
    let (mut writes, mut taken) = (Vec::new(), Vec::new());
    let mut rules = now.rules.clone();
    let mut id = now.next_id;
    let mut new_id = || {
        id += 1;
        id - 1
    };
    for (key, spec) in edits {
        let Some(spec) = spec else {
            rules.remove(key);
            continue;
        };
        let inst = match now.rules.get(key) {
            Some(h) if *h.spec == *spec => continue,
            Some(h) => {
                writes.push(Write {
                    key: key.clone(),
                    slot: h.slot,
                    fresh: false,
                    total: h.spec.total() != spec.total(),
                });
                Installed { spec: std::sync::Arc::new(spec.clone()), id: new_id(), slot: h.slot, persisted: false }
            }
            None => {
                let slot = match free.next() {
                    Some(s) => {
                        taken.push(s);
                        s
                    }
                    None => gone.pop().ok_or_else(|| limit(format!("this policer holds {} rules", now.capacity)))?,
                };
                writes.push(Write { key: key.clone(), slot, fresh: true, total: true });
                Installed { spec: std::sync::Arc::new(spec.clone()), id: new_id(), slot, persisted: false }
            }
        };
        rules.insert(key.clone(), inst);
    }
    let next_id = id;
    let prefixes = changed_prefixes(now, edits, &rules)?;
    let mut groups = now.groups.clone();
    groups.settle();
    Ok(Some(Plan {
        rules,
        writes,
        taken,
        freed: gone,
        compiled: Compiled::default(),
        delta: Some(Delta { keys: edits.keys().cloned().collect(), prefixes }),
        groups,
        next_id,
    }))
}

/// Whether [`plan_edits`] plans `edits` on their own: no rule with a
/// class, no ban of a /0, and no class rule at, under or over an edited prefix
/// (among at most [`MAX_CLASS_NETS_SCANNED`] class prefixes). Refuses a
/// rule over a protected prefix first.
fn edits_plannable(now: &InForce<'_>, edits: &BTreeMap<RuleKey, Option<RuleSpec>>) -> Result<bool> {
    for (key, spec) in edits {
        if !key.class().is_none() || (key.ban && key.net.prefix_len() == 0) {
            return Ok(false);
        }
        if let Some(spec) = spec {
            now.protect.refuse_rule(spec)?;
        }
    }
    if !now.class_nets.is_empty() {
        if now.class_nets.len() > MAX_CLASS_NETS_SCANNED {
            return Ok(false);
        }
        // A class prefix under an edited one, or over it (a class-less
        // prefix under one with classes inherits its chain).
        if edits.keys().any(|k| now.class_nets.keys().any(|c| k.net.contains(c) || c.contains(&k.net))) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// The tries' prefixes whose value `edits` change, in order, each with
/// its value under `rules` (the rules after the edits; `None`: removed).
fn changed_prefixes(
    now: &InForce<'_>,
    edits: &BTreeMap<RuleKey, Option<RuleSpec>>,
    rules: &Rules,
) -> Result<Vec<(IpNet, Option<Rule>)>> {
    // The prefixes whose value may change: each edited one, and under an
    // edited ban every prefix with a rule.
    let mut nets: BTreeSet<IpNet> = edits.keys().map(|k| k.net).collect();
    for key in edits.keys().filter(|k| k.ban) {
        let from = RuleKey::new(key.net, Class::default(), false);
        for (k, _) in rules.range(from..) {
            if k.net.addr() > key.net.broadcast() || k.net.addr().is_ipv6() != key.net.addr().is_ipv6() {
                break;
            }
            if key.net.contains(&k.net) {
                nets.insert(k.net);
            }
        }
    }
    let mut prefixes = Vec::new();
    for net in nets {
        let value = value_at(rules, net, now.protect)?;
        if now.compiled.prefixes.get(&net) != value.as_ref() {
            prefixes.push((net, value));
        }
    }
    Ok(prefixes)
}

/// The tries' value at `net` under `rules`, as [`compile`] and
/// [`Protect::apply`] make it, for a prefix with no class rule at or
/// under it: the most specific ban over it, or its class-less rule;
/// protected, allow.
fn value_at(rules: &Rules, net: IpNet, protect: &Protect) -> Result<Option<Rule>> {
    let at = |net: IpNet, ban: bool| rules.get(&RuleKey::new(net, Class::default(), ban));
    let kernel = |i: &Installed| -> Result<Rule> { Ok(i.spec.kernel(i.id)?.with_counter_slot(i.slot)) };
    let own = at(net, false);
    let value = if own.is_some() || at(net, true).is_some() {
        let mut ban = None;
        for len in (0..=net.prefix_len()).rev() {
            let over = IpNet::new(net.addr(), len).map_err(|e| Error::Invalid(e.to_string()))?.trunc();
            if let Some(b) = at(over, true) {
                ban = Some(b);
                break;
            }
        }
        match ban.or(own) {
            Some(i) => Some(kernel(i)?),
            None => None,
        }
    } else {
        None
    };
    Ok(match value {
        Some(r) if (r.action != Action::Allow as u32 || r.classes != 0) && protect.holding(&net).is_some() => {
            Some(crate::protect::protected_rule())
        }
        None if protect.nets().contains(&net) => Some(crate::protect::protected_rule()),
        v => v,
    })
}

/// The rule limit's error: `what` says by how much.
pub(super) fn limit(what: String) -> Error {
    Error::Invalid(format!(
        "rule limit reached: {what} (`--max-rules`, or `max_rules` in [daemon]; a larger limit replaces the \
         program at the next start, its buckets starting empty)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleConfig;

    fn spec(prefix: &str, rate: &str) -> RuleSpec {
        RuleConfig { prefix: prefix.into(), rate: Some(rate.into()), ..Default::default() }.validate().unwrap()
    }

    fn ban(prefix: &str) -> RuleSpec {
        RuleConfig { prefix: prefix.into(), ban: Some(true), ttl: Some("1h".into()), ..Default::default() }
            .validate()
            .unwrap()
    }

    fn want(specs: &[RuleSpec]) -> BTreeMap<RuleKey, RuleSpec> {
        specs.iter().map(|s| (s.key(), s.clone())).collect()
    }

    fn held(p: &Plan) -> BTreeMap<RuleKey, HeldRule<'_>> {
        p.rules.iter().map(|(k, i)| (k.clone(), HeldRule::from(i))).collect()
    }

    /// Plans `w` after `before` with slots 1..=cap of which `before` holds some.
    fn after(before: &Plan, w: &BTreeMap<RuleKey, RuleSpec>, cap: u32) -> Result<Plan> {
        let used: Vec<u32> = before.rules.values().map(|i| i.slot).collect();
        let free = (1..=cap).filter(|s| !used.contains(s));
        plan(&held(before), w, &Protect::default(), free, cap, &before.groups, before.next_id)
    }

    fn first(w: &BTreeMap<RuleKey, RuleSpec>, cap: u32) -> Plan {
        plan(&BTreeMap::new(), w, &Protect::default(), 1..=cap, cap, &Groups::default(), 1).unwrap()
    }

    #[test]
    fn unchanged_rules_keep_id_and_slot_changed_ones_their_slot() {
        let (a, b) = (spec("10.0.0.0/8", "1kpps"), spec("192.0.2.0/24", "100pps"));
        let p = first(&want(&[a.clone(), b.clone()]), 8);
        assert_eq!(p.taken, vec![1, 2]);
        assert_eq!(p.writes.iter().map(|w| (w.slot, w.fresh)).collect::<Vec<_>>(), vec![(1, true), (2, true)]);
        let b2 = spec("192.0.2.0/24", "200pps");
        let q = after(&p, &want(&[a.clone(), b2]), 8).unwrap();
        let (pa, qa) = (&p.rules[&a.key()], &q.rules[&a.key()]);
        assert_eq!((qa.id, qa.slot), (pa.id, pa.slot), "unchanged: same id and slot");
        let (pb, qb) = (&p.rules[&b.key()], &q.rules[&b.key()]);
        assert_eq!(qb.slot, pb.slot, "changed: same slot");
        assert_ne!(qb.id, pb.id, "changed: new id (its buckets rescale)");
        assert!(qb.id >= p.next_id, "ids are never reused");
        assert_eq!(q.writes, vec![Write { key: b.key(), slot: pb.slot, fresh: false, total: false }]);
        assert!(q.taken.is_empty() && q.freed.is_empty());
        // The compiled values carry id and slot.
        let r = q.compiled.prefixes[&b.key().net];
        assert_eq!((r.rule_id, r.counter_slot), (qb.id, qb.slot));
    }

    #[test]
    fn removed_rules_free_their_slot_and_the_limit_reuses_it() {
        let (a, b, c) = (spec("10.0.0.0/8", "1kpps"), spec("10.1.0.0/16", "1kpps"), spec("10.2.0.0/16", "1kpps"));
        let p = first(&want(&[a.clone(), b.clone()]), 2);
        // At the limit of 2: a third rule is refused...
        let e = after(&p, &want(&[a.clone(), b.clone(), c.clone()]), 2).unwrap_err().to_string();
        assert!(e.contains("rule limit reached") && e.contains("limit of 2"), "{e}");
        // ...but one replacing a removed rule in the same change takes its slot.
        let q = after(&p, &want(&[a.clone(), c.clone()]), 2).unwrap();
        assert_eq!(q.rules[&c.key()].slot, p.rules[&b.key()].slot);
        assert!(q.writes.iter().any(|w| w.key == c.key() && w.fresh), "a reused slot starts at zero");
        assert!(q.freed.is_empty() && q.taken.is_empty());
        // Removing without replacing frees it.
        let r = after(&p, &want(std::slice::from_ref(&a)), 2).unwrap();
        assert_eq!(r.freed, vec![p.rules[&b.key()].slot]);
        assert!(!r.compiled.prefixes.contains_key(&b.key().net));
    }

    #[test]
    fn an_adopted_rule_keeps_its_id_when_it_polices_alike() {
        let a = spec("10.0.0.0/8", "1kpps");
        let k = a.kernel(41).unwrap().with_counter_slot(3);
        let h: BTreeMap<_, _> = [(a.key(), HeldRule { id: 41, slot: 3, form: Form::Kernel(k) })].into();
        let p = plan(&h, &want(std::slice::from_ref(&a)), &Protect::default(), [1, 2, 4], 4, &Groups::default(), 42)
            .unwrap();
        assert_eq!((p.rules[&a.key()].id, p.rules[&a.key()].slot), (41, 3));
        assert!(p.writes.is_empty() && p.taken.is_empty());
        // Another rate: same slot, a new id, its limiter and total written.
        let a2 = spec("10.0.0.0/8", "2kpps");
        let p = plan(&h, &want(std::slice::from_ref(&a2)), &Protect::default(), [1, 2, 4], 4, &Groups::default(), 42)
            .unwrap();
        assert_eq!((p.rules[&a2.key()].id, p.rules[&a2.key()].slot), (42, 3));
        assert_eq!(p.writes, vec![Write { key: a2.key(), slot: 3, fresh: false, total: true }]);
        assert_eq!(p.next_id, 43);
    }

    #[test]
    fn a_ban_overrides_the_rules_under_it_and_takes_a_slot_of_its_own() {
        let (a, b) = (spec("10.0.0.0/8", "1kpps"), spec("10.1.0.0/16", "1kpps"));
        let p = first(&want(&[a.clone(), b.clone(), ban("10.0.0.0/12")]), 8);
        let banned = p.compiled.prefixes[&"10.0.0.0/12".parse().unwrap()];
        let under = p.compiled.prefixes[&b.key().net];
        assert_eq!(under, banned, "a rule under the ban takes the ban's value");
        assert_ne!(p.compiled.prefixes[&a.key().net], banned, "the rule above it stays");
        let slots: std::collections::BTreeSet<u32> = p.rules.values().map(|i| i.slot).collect();
        assert_eq!(slots.len(), 3, "each rule and the ban its own slot");
    }

    #[test]
    fn classes_that_tie_refuse_the_plan_and_same_rules_plan_no_writes() {
        let udp = |p: &str, ports: &str| {
            RuleConfig {
                prefix: p.into(),
                rate: Some("1kpps".into()),
                proto: Some("udp".into()),
                dport: Some(crate::rules::PortValue::Text(ports.into())),
                ..Default::default()
            }
            .validate()
            .unwrap()
        };
        let base = first(&want(&[udp("10.0.0.0/8", "50-59")]), 8);
        assert!(!base.compiled.filters.is_empty(), "classes are compiled");
        let e = after(&base, &want(&[udp("10.0.0.0/8", "50-59"), udp("10.0.0.0/8", "55-64")]), 8).unwrap_err();
        assert!(e.to_string().contains("tie"), "{e}");
        // The same rules again: nothing to write, the same maps.
        let again = after(&base, &want(&[udp("10.0.0.0/8", "50-59")]), 8).unwrap();
        assert_eq!(again.compiled.prefixes, base.compiled.prefixes);
        assert!(again.writes.is_empty() && again.taken.is_empty());
    }

    #[test]
    fn a_protected_prefix_passes_under_a_forced_ban_of_everyone_and_refuses_a_deny_inside() {
        let protect = Protect::parse(&["192.0.2.0/24".into()]).unwrap();
        let (all, inside) = (ban("0.0.0.0/0"), ban("192.0.2.5"));
        let p = plan(&BTreeMap::new(), &want(std::slice::from_ref(&all)), &protect, 1..=8, 8, &Groups::default(), 1)
            .unwrap();
        let net = |s: &str| s.parse::<ipnet::IpNet>().unwrap();
        assert_eq!(p.compiled.prefixes[&net("192.0.2.0/24")], crate::protect::protected_rule());
        assert_eq!(p.compiled.prefixes[&net("0.0.0.0/0")].action, policer_common::bucket::Action::Deny as u32);
        let e = plan(&BTreeMap::new(), &want(&[all, inside]), &protect, 1..=8, 8, &Groups::default(), 1).unwrap_err();
        assert!(e.to_string().contains("inside the protected prefix 192.0.2.0/24"), "{e}");
    }
}
