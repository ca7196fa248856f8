//! Changing the config document the operator wrote, keeping everything the
//! change does not touch: comments, blank lines, key order, quoting and the
//! way each untouched rule is written.
//!
//! - A rule whose prefix is still wanted with the same meaning is left as
//!   written (`burst = 200` stays `burst = 200`, `"203.0.113.7"` stays a
//!   bare address, an explicit default `key_len` stays).
//! - A changed rule is edited in place: only the keys whose meaning changed
//!   are rewritten (each keeping the comment at the end of its line); the
//!   comments above and inside its table stay.
//! - A removed rule's table goes with the comment lines directly above it;
//!   comment paragraphs set off from it by a blank line are about more than
//!   that rule (the file's preamble, "One [[rule]] per prefix..."), so they
//!   move to whatever followed the rule.
//! - A new rule is appended after the last one, in the daemon's canonical
//!   form ([`RuleSpec::config`]).
//!
//! Rules may be written as `[[rule]]` tables or as an inline array
//! `rule = [{ ... }]`; both are edited. The result is parsed back and must
//! say exactly what was asked, or nothing is written.

use std::{collections::BTreeMap, path::Path};

use toml_edit::{Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table, TableLike, Value};

use super::{Config, HEADER};
use crate::{
    error::{Error, Result},
    rules::{BurstValue, PortValue, RuleConfig, RuleKey, RuleSpec},
};

/// What the daemon changes; `None` leaves that part of the file alone.
#[derive(Clone, Copy, Debug, Default)]
pub struct Change<'a> {
    /// The whole rule set, as it should be in force.
    pub rules: Option<&'a BTreeMap<RuleKey, RuleSpec>>,
    /// `daemon.interfaces`.
    pub interfaces: Option<&'a [String]>,
    /// Every `[[chain]]` table, as it should be.
    pub chains: Option<&'a [crate::chain::ChainConfig]>,
}

/// `text` (the file as it is; `None`: there is none) with `change` made,
/// and what it says. `origin` names the file in errors.
pub(crate) fn edit(
    text: Option<&str>,
    current: &Config,
    change: Change<'_>,
    origin: &Path,
) -> Result<(String, Config)> {
    // `current` is what `text` says (the caller read it from that text and
    // checked the file still is that text): no second parse of it.
    let (cfg, mut doc) = match text {
        Some(t) => {
            let doc = t.parse::<DocumentMut>().map_err(|e| invalid(origin, e.to_string().trim()))?;
            (current.clone(), doc)
        }
        None => (Config::default(), DocumentMut::new()),
    };
    if let Some(names) = change.interfaces
        && cfg.daemon.interfaces != names
    {
        set_interfaces(&mut doc, names, text.is_none(), origin)?;
    }
    if let Some(want) = change.rules {
        let have = cfg.rules.iter().map(RuleConfig::validate).collect::<Result<Vec<_>>>()?;
        set_rules(&mut doc, &have, want, origin)?;
    }
    if let Some(want) = change.chains
        && cfg.chains != want
    {
        set_chains(&mut doc, want);
    }
    let out = match text {
        Some(_) => doc.to_string(),
        None => format!("{HEADER}\n{}", doc.to_string().trim_start_matches('\n')),
    };

    // The edit must say exactly what was asked, and nothing else changed.
    let (got, rules) = Config::parse(&out, origin)
        .map_err(|e| invalid(origin, &format!("internal error: the edited file does not parse: {e}")))?;
    let rules_ok = change.rules.is_none_or(|want| &rules == want);
    let ifaces_ok = change.interfaces.is_none_or(|n| got.daemon.interfaces == n);
    let rest_ok = got.daemon.mode == cfg.daemon.mode && got.daemon.max_sources == cfg.daemon.max_sources;
    let chains_ok =
        change.chains.is_none_or(|c| got.chains == c) && (change.chains.is_some() || got.chains == cfg.chains);
    if !(rules_ok && ifaces_ok && rest_ok && chains_ok) {
        return Err(invalid(origin, "internal error: the edited file does not say what was asked; nothing written"));
    }
    Ok((out, got))
}

/// Writes every `[[chain]]` table anew, after the file's other tables
/// (the tables of one array stay together; a comment inside one is not
/// kept).
fn set_chains(doc: &mut DocumentMut, want: &[crate::chain::ChainConfig]) {
    doc.remove("chain");
    if want.is_empty() {
        return;
    }
    let mut tables = toml_edit::ArrayOfTables::new();
    for c in want {
        let mut t = Table::new();
        t.insert("interface", toml_edit::value(c.interface.as_str()));
        t.insert("slot", toml_edit::value(i64::from(c.slot)));
        for (k, v) in [("object", &c.object), ("program", &c.program), ("pin_maps", &c.pin_maps), ("pinned", &c.pinned)]
        {
            if let Some(v) = v {
                t.insert(k, toml_edit::value(v.as_str()));
            }
        }
        t.decor_mut().set_prefix("\n");
        tables.push(t);
    }
    doc.insert("chain", Item::ArrayOfTables(tables));
}

fn invalid(origin: &Path, msg: &str) -> Error {
    Error::Invalid(format!("{}: {msg}", origin.display()))
}

fn set_interfaces(doc: &mut DocumentMut, names: &[String], new_file: bool, origin: &Path) -> Result<()> {
    if doc.get("daemon").is_none() {
        let mut t = Table::new();
        if new_file {
            // A file of its own: [daemon] first, as in the example config.
            t.set_position(Some(0));
        } else {
            // After the last table (before the comments that end the file).
            let last = doc
                .iter()
                .flat_map(|(_, item)| match item {
                    Item::Table(t) => vec![t.position()],
                    Item::ArrayOfTables(a) => a.iter().map(Table::position).collect(),
                    _ => vec![],
                })
                .flatten()
                .max();
            t.set_position(last.map(|p| p + 1));
            t.decor_mut().set_prefix("\n");
        }
        doc.insert("daemon", Item::Table(t));
    }
    let daemon = doc
        .get_mut("daemon")
        .and_then(Item::as_table_like_mut)
        .ok_or_else(|| invalid(origin, "`daemon` is not a table"))?;
    set(daemon, "interfaces", Some(Value::Array(names.iter().collect::<Array>())));
    Ok(())
}

/// Sets `key` to `v` (or removes it), keeping the old value's surrounding
/// whitespace and end-of-line comment.
pub(super) fn set(t: &mut dyn TableLike, key: &str, v: Option<Value>) {
    match v {
        None => {
            t.remove(key);
        }
        Some(mut v) => match t.get_mut(key).and_then(Item::as_value_mut) {
            Some(old) => {
                *v.decor_mut() = old.decor().clone();
                *old = v;
            }
            None => {
                t.insert(key, Item::Value(v));
            }
        },
    }
}

/// The rules of a document, however they are written.
enum RuleArray<'a> {
    Tables(&'a mut ArrayOfTables),
    Inline(&'a mut Array),
}

impl RuleArray<'_> {
    fn len(&self) -> usize {
        match self {
            RuleArray::Tables(a) => a.len(),
            RuleArray::Inline(a) => a.len(),
        }
    }

    fn get_mut(&mut self, i: usize) -> Option<&mut dyn TableLike> {
        match self {
            RuleArray::Tables(a) => a.get_mut(i).map(|t| t as &mut dyn TableLike),
            RuleArray::Inline(a) => a.get_mut(i).and_then(Value::as_inline_table_mut).map(|t| t as &mut dyn TableLike),
        }
    }

    fn push(&mut self, spec: &RuleSpec) {
        match self {
            RuleArray::Tables(a) => {
                let mut t = Table::new();
                t.decor_mut().set_prefix("\n");
                fill(&mut t, spec);
                a.push(t);
            }
            RuleArray::Inline(a) => {
                let mut t = InlineTable::new();
                fill(&mut t, spec);
                let mut v = Value::InlineTable(t);
                // Laid out like the rule before it (one per line, or not).
                if let Some(last) = a.iter().last() {
                    *v.decor_mut() = last.decor().clone();
                    let trailing = a.trailing().as_str().unwrap_or("").to_string();
                    let indent = last.decor().prefix().and_then(|p| p.as_str()).and_then(|p| p.rsplit_once('\n'));
                    if let (Some((_, indent)), Some((line, rest))) = (indent, trailing.split_once('\n')) {
                        // What follows the last comma up to the line's end
                        // (a comment) stays with the rule it follows.
                        v.decor_mut().set_prefix(format!("{line}\n{indent}"));
                        a.set_trailing(if rest.contains('\n') { rest.to_string() } else { format!("\n{rest}") });
                    }
                }
                a.push_formatted(v);
            }
        }
    }

    /// The rule at `i` as it reads now.
    fn spec(&self, i: usize, origin: &Path) -> Result<RuleSpec> {
        let mut d = DocumentMut::new();
        match self {
            RuleArray::Tables(a) => {
                let mut one = ArrayOfTables::new();
                one.push(a.get(i).cloned().unwrap_or_default());
                d.insert("rule", Item::ArrayOfTables(one));
            }
            RuleArray::Inline(a) => {
                let one: Array = a.get(i).cloned().into_iter().collect();
                d.insert("rule", Item::Value(Value::Array(one)));
            }
        }
        let (_, rules) = Config::parse(&d.to_string(), origin)?;
        rules.into_values().next().ok_or_else(|| invalid(origin, "internal error: a rule vanished"))
    }
}

fn rules_mut<'a>(doc: &'a mut DocumentMut, origin: &Path) -> Result<Option<RuleArray<'a>>> {
    Ok(match doc.get_mut("rule") {
        None => None,
        Some(Item::ArrayOfTables(a)) => Some(RuleArray::Tables(a)),
        Some(Item::Value(Value::Array(a))) => Some(RuleArray::Inline(a)),
        Some(_) => return Err(invalid(origin, "`rule` is neither [[rule]] tables nor an array of tables")),
    })
}

/// Writes `spec` in canonical form into an empty table.
pub(super) fn fill(t: &mut dyn TableLike, spec: &RuleSpec) {
    let c = spec.config();
    t.insert("prefix", Item::Value(c.prefix.as_str().into()));
    write_params(t, &c);
}

/// Sets every key but the prefix to `c`'s canonical form.
pub(super) fn write_params(t: &mut dyn TableLike, c: &RuleConfig) {
    write_class(t, c);
    set(t, "rate", c.rate.clone().map(Value::from));
    set(t, "burst", c.burst.as_ref().map(burst_value));
    set(t, "action", c.action.map(|a| Value::from(a.to_string())));
    set(t, "key_len", c.key_len.map(|k| Value::from(i64::from(k))));
    write_total(t, c);
    write_bans(t, c);
}

/// Automatic bans, the manual ban mark, its reason, and the expiry.
fn write_bans(t: &mut dyn TableLike, c: &RuleConfig) {
    set(t, "ban_for", c.ban_for.clone().map(Value::from));
    set(t, "ban_after", c.ban_after.map(|n| Value::from(i64::from(n))));
    set(t, "ban_max", c.ban_max.clone().map(Value::from));
    set(t, "ban_within", c.ban_within.clone().map(Value::from));
    set(t, "inherit", c.inherit.map(Value::from));
    set(t, "ban", c.ban.map(Value::from));
    set(t, "reason", c.reason.clone().map(Value::from));
    set(t, "expires", c.expires.clone().map(Value::from));
}

/// The class fields (what identifies the rule with its prefix).
fn write_class(t: &mut dyn TableLike, c: &RuleConfig) {
    set(t, "proto", c.proto.clone().map(Value::from));
    let port = |p: &PortValue| match p {
        PortValue::Number(n) => Value::from(i64::from(*n)),
        PortValue::Text(s) => Value::from(s.as_str()),
    };
    set(t, "dport", c.dport.as_ref().map(port));
    set(t, "sport", c.sport.as_ref().map(port));
    set(t, "tcp_flags", c.tcp_flags.clone().map(Value::from));
    set(t, "icmp_type", c.icmp_type.map(|n| Value::from(i64::from(n))));
    set(t, "dst", c.dst.clone().map(Value::from));
}

fn write_total(t: &mut dyn TableLike, c: &RuleConfig) {
    set(t, "total_rate", c.total_rate.clone().map(Value::from));
    set(t, "total_burst", c.total_burst.as_ref().map(burst_value));
    set(t, "global", c.global.clone().map(Value::from));
    set(t, "syn_cookies", c.syn_cookies.clone().map(Value::from));
    set(t, "syn_ack_rate", c.syn_ack_rate.clone().map(Value::from));
}

fn burst_value(b: &BurstValue) -> Value {
    match b {
        // Bursts are far below i64::MAX; saturate rather than panic.
        BurstValue::Count(n) => Value::from(i64::try_from(*n).unwrap_or(i64::MAX)),
        BurstValue::Text(s) => Value::from(s.as_str()),
    }
}

/// Rewrites only the keys whose meaning changed from `old` to `new`.
pub(super) fn update(t: &mut dyn TableLike, old: &RuleSpec, new: &RuleSpec) {
    let c = new.config();
    let rate_changed = old.rate != new.rate;
    if rate_changed {
        set(t, "rate", c.rate.clone().map(Value::from));
    }
    // An absent burst is the rate's default, which moves with the rate; a
    // written one means packets or bytes according to the rate's kind.
    let kind = |s: &RuleSpec| s.rate.map(|r| r.is_bytes());
    if old.burst != new.burst || kind(old) != kind(new) || (rate_changed && !t.contains_key("burst")) {
        set(t, "burst", c.burst.as_ref().map(burst_value));
    }
    if old.action != new.action {
        set(t, "action", c.action.map(|a| Value::from(a.to_string())));
    }
    if old.key_len != new.key_len {
        set(t, "key_len", Some(Value::from(i64::from(new.key_len))));
        if c.key_len.is_none() {
            // The default again: say nothing, as a new rule would.
            set(t, "key_len", None);
        }
    }
    if old.total() != new.total() || old.global() != new.global() {
        write_total(t, &c);
    }
    if old.auto_ban() != new.auto_ban() || old.ban() != new.ban() || old.expires != new.expires {
        write_bans(t, &c);
    }
}

fn set_rules(
    doc: &mut DocumentMut,
    have: &[RuleSpec],
    want: &BTreeMap<RuleKey, RuleSpec>,
    origin: &Path,
) -> Result<()> {
    // Changed rules, in place; a rule whose keys could not be kept as
    // written (the verification below says so) is rewritten whole.
    if let Some(mut rules) = rules_mut(doc, origin)? {
        if rules.len() != have.len() {
            return Err(invalid(origin, "internal error: rules and document disagree"));
        }
        for (i, old) in have.iter().enumerate() {
            let Some(new) = want.get(&old.key()).filter(|new| *new != old) else { continue };
            let t = rules.get_mut(i).ok_or_else(|| invalid(origin, "a rule is not a table"))?;
            update(t, old, new);
            if rules.spec(i, origin).ok().as_ref() != Some(new) {
                let t = rules.get_mut(i).ok_or_else(|| invalid(origin, "a rule is not a table"))?;
                write_params(t, &new.config());
            }
        }
    }

    // Removed rules, last first so the indices hold.
    for (i, old) in have.iter().enumerate().rev() {
        if !want.contains_key(&old.key()) {
            remove_rule(doc, i, origin)?;
        }
    }

    // New rules, at the end.
    // A set: files of 100 000 rules are edited too.
    let known: std::collections::HashSet<RuleKey> = have.iter().map(|s| s.key()).collect();
    let new: Vec<&RuleSpec> = want.values().filter(|s| !known.contains(&s.key())).collect();
    if !new.is_empty() && doc.get("rule").is_none() {
        doc.insert("rule", Item::ArrayOfTables(ArrayOfTables::new()));
    }
    if let Some(mut rules) = rules_mut(doc, origin)? {
        for s in new {
            rules.push(s);
        }
        if rules.len() == 0 {
            doc.remove("rule");
        }
    }
    Ok(())
}

fn remove_rule(doc: &mut DocumentMut, i: usize, origin: &Path) -> Result<()> {
    let removed = match rules_mut(doc, origin)? {
        Some(RuleArray::Tables(a)) => a.remove(i),
        Some(RuleArray::Inline(a)) => {
            let gone = a.remove(i);
            // The comment after a rule's comma is the start of the next
            // one's prefix: keep the previous rule's, drop the removed one's.
            if i > 0 {
                let before = gone.decor().prefix().and_then(|p| p.as_str()).unwrap_or("");
                if let Some(next) = a.get_mut(i) {
                    let after = next.decor().prefix().and_then(|p| p.as_str()).unwrap_or("").to_string();
                    next.decor_mut().set_prefix(keep_first_line(before, &after));
                } else {
                    let after = a.trailing().as_str().unwrap_or("").to_string();
                    a.set_trailing(keep_first_line(before, &after));
                }
            }
            return Ok(());
        }
        None => return Err(invalid(origin, "internal error: no rules to remove")),
    };
    let prefix = removed.decor().prefix().and_then(|p| p.as_str()).unwrap_or("");
    let (detached, _own) = split_detached(prefix);
    if !detached.contains('#') {
        return Ok(());
    }
    let Some(pos) = removed.position() else { return Ok(()) };
    match next_table(doc, pos) {
        Some(t) => {
            let next = t.decor().prefix().and_then(|p| p.as_str()).unwrap_or("").to_string();
            t.decor_mut().set_prefix(format!("{detached}{}", trim_blank_lines(&next)));
        }
        None => {
            let trailing = doc.trailing().as_str().unwrap_or("").to_string();
            doc.set_trailing(format!("{}{}", detached.trim_end_matches('\n'), format_args!("\n{trailing}")));
        }
    }
    Ok(())
}

/// `to` with its first line (the removed element's own) replaced by the
/// first line of `from` (the element before it's).
fn keep_first_line(from: &str, to: &str) -> String {
    match from.split_once('\n') {
        Some((line, _)) if line.contains('#') => {
            let rest = to.split_once('\n').map_or(to, |(_, rest)| rest);
            format!("{line}\n{rest}")
        }
        _ => to.to_string(),
    }
}

/// Splits the comment block above a table header at its last blank line:
/// what comes before is set off from the table, what comes after is its own.
pub(super) fn split_detached(prefix: &str) -> (&str, &str) {
    let mut split = 0;
    let mut off = 0;
    for line in prefix.split_inclusive('\n') {
        off += line.len();
        if line.ends_with('\n') && line.trim().is_empty() {
            split = off;
        }
    }
    prefix.split_at(split)
}

pub(super) fn trim_blank_lines(s: &str) -> &str {
    let mut rest = s;
    while let Some((line, tail)) = rest.split_once('\n') {
        if !line.trim().is_empty() {
            break;
        }
        rest = tail;
    }
    rest
}

/// The top-level table (or array-of-tables element) laid out first after
/// `pos`.
fn next_table(doc: &mut DocumentMut, pos: isize) -> Option<&mut Table> {
    let after = |t: &Table| t.position().filter(|p| *p > pos);
    let mut best: Option<(isize, String, Option<usize>)> = None;
    for (k, item) in doc.iter() {
        let mut consider = |p: isize, i: Option<usize>| {
            if best.as_ref().is_none_or(|(b, ..)| p < *b) {
                best = Some((p, k.to_string(), i));
            }
        };
        match item {
            Item::Table(t) => after(t).into_iter().for_each(|p| consider(p, None)),
            Item::ArrayOfTables(a) => {
                for (i, t) in a.iter().enumerate() {
                    after(t).into_iter().for_each(|p| consider(p, Some(i)));
                }
            }
            _ => {}
        }
    }
    let (_, key, i) = best?;
    match (doc.get_mut(&key)?, i) {
        (Item::Table(t), None) => Some(t),
        (Item::ArrayOfTables(a), Some(i)) => a.get_mut(i),
        _ => None,
    }
}
