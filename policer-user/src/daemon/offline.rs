//! `policer replay`'s program, written as a start writes a daemon's: the
//! rules through the rule set ([`RuleSet`]), then the named sets
//! (`sets.rs`). Above both, so that neither needs the other's offline
//! half (issue 42: `ruleset.rs` and `sets.rs` no longer use each other).

use std::collections::BTreeMap;

use ipnet::IpNet;
use policer_common::Rule;

use super::{
    ruleset::{RuleSet, Slots, prepare_slots},
    sets::{self, OfflineSet, OfflineSets},
};
use crate::{
    compile::{Compiled, Groups},
    error::Result,
    loader::Policer,
    protect::Protect,
    rules::{RuleKey, RuleSpec},
};

/// A rule as [`install_offline`] wrote it.
#[derive(Clone, Debug)]
pub struct OfflineRule {
    pub key: RuleKey,
    pub spec: RuleSpec,
    /// Its counter slot (`Rule::counter_slot` of what the tries hold).
    pub slot: u32,
}

/// What [`install_offline`] wrote: the rules, and the named sets.
#[derive(Clone, Debug)]
pub struct Offline {
    pub rules: Vec<OfflineRule>,
    pub sets: Vec<OfflineSet>,
}

/// Writes `specs` into a freshly loaded program that no interface runs
/// (`policer replay`) as a start writes them into fresh maps: planned by
/// the daemon's [`super::plan::plan`], each rule's new-source limiter, ban
/// parameters and aggregate bucket at its slot on the program's clock at
/// `now_ns`, then the rule maps, then the named sets (`sets`, read by
/// [`sets::read_offline`]: the state directory's saved sets and the
/// config's `[[set]]`s; [`sets::install_offline`]), then the default
/// rules' fast path when only default rules exist (as
/// `Daemon::sync_fast_path` does).
pub fn install_offline(
    p: &mut Policer,
    specs: &BTreeMap<RuleKey, RuleSpec>,
    protect: &Protect,
    sets: OfflineSets,
    now_ns: u64,
) -> Result<Offline> {
    // A fresh program's maps hold nothing: the first rule id is 1, as
    // `plan_rules` finds at a start with nothing adopted.
    let mut rs = RuleSet::new(Slots::new(p.max_rules()?), Groups::default(), Compiled::default(), 1);
    rs.set_protect(protect.clone());
    let plan = rs.plan(specs)?;
    prepare_slots(p, plan.writes.iter().map(|w| (w.slot, &*plan.rules[&w.key].spec, true)), now_ns, false)?;
    p.sync_rules_from(&Compiled::default(), &plan.compiled)?;
    let rules =
        plan.rules.iter().map(|(k, i)| OfflineRule { key: k.clone(), spec: (*i.spec).clone(), slot: i.slot }).collect();
    rs.commit(plan);
    rs.set_entries_protect(protect.clone());
    let sets = sets::install_offline(p, &mut rs, sets, now_ns)?;
    if rs.only_defaults() && sets.is_empty() {
        let rule = |net: &str| -> Option<Rule> { rs.compiled().prefixes.get(&net.parse::<IpNet>().ok()?).copied() };
        p.set_default_rules(0, rule("0.0.0.0/0"), rule("::/0"))?;
        p.set_fast_path(1)?;
    }
    Ok(Offline { rules, sets })
}
