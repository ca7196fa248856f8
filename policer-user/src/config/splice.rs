//! Changing a few rules of a big file without parsing the whole of it.
//!
//! `edit.rs` parses the whole document, edits it and parses the result
//! back: right for any layout, but a 100 000-rule file costs about a
//! second per `policer rule set`. Here a change of a few rules touches
//! only their text: the file's `[[rule]]` headers are found once by a scan
//! of its lines ([`Layout`], checked against the rules the file was read
//! to hold), kept up to date as rules are changed, removed and added, and
//! each change parses and writes only the rule it is about. Whatever is
//! not laid out as this expects (rules in an inline array, a rule's text
//! that does not parse alone, edits next to each other, the first table
//! of the file) is left to `edit.rs`.
//!
//! The result is what `edit.rs` would write, byte for byte (the tests
//! make every edit both ways and compare): a changed rule keeps its
//! comments and the keys whose meaning did not change; a removed rule goes
//! with the comment lines directly above it, and a comment paragraph set
//! off from it by a blank line stays; a new rule is appended after the
//! last one in canonical form.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use super::{Config, edit};
use crate::rules::{RuleConfig, RuleKey, RuleSpec, SpecMap};

/// Edits in one change past which the whole document is edited instead
/// (each edit here moves the text after it).
pub(super) const MAX_EDITS: usize = 64;

/// Where the `[[rule]]` tables of a text start.
#[derive(Clone, Debug, Default)]
pub(super) struct Layout {
    /// The byte offset of each rule's header line, in file order.
    headers: Vec<usize>,
    /// Each rule's place in `headers`, by a 64-bit hash of its key
    /// (`hasher`'s): a quarter of the memory of the keys themselves (2 MB
    /// for 100 000 rules, not 8.5). A place found by hash is of that key
    /// only if the rule there says so, which [`splice`] checks before it
    /// edits; two of the file's keys with one hash make no layout (the
    /// whole-document edit then takes every change).
    index: HashMap<u64, u32>,
    hasher: RandomState,
}

impl Layout {
    fn slot(&self, key: &RuleKey) -> Option<usize> {
        self.index.get(&self.hasher.hash_one(key)).map(|&i| i as usize)
    }
}

/// One line of a text: `[start, end)`, `end` past its newline.
#[derive(Clone, Copy, Debug)]
struct Line {
    start: usize,
    end: usize,
}

/// Whether `line` is blank (whitespace only).
fn blank(line: &str) -> bool {
    line.trim().is_empty()
}

/// Whether `line` holds a comment only.
fn comment(line: &str) -> bool {
    line.trim_start().starts_with('#')
}

/// Whether `line` starts a table (or is the line of a value spread over
/// lines that starts with `[`: a boundary either way, and a rule cut there
/// does not parse alone, so `edit.rs` takes it).
fn boundary(line: &str) -> bool {
    line.trim_start().starts_with('[')
}

/// Whether `line` is a `[[rule]]` header (spaces and quotes allowed, a
/// comment after it).
pub(super) fn rule_header(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix("[[") else { return false };
    let Some((name, after)) = rest.split_once("]]") else { return false };
    let after = after.trim();
    (after.is_empty() || after.starts_with('#')) && matches!(name.trim(), "rule" | "\"rule\"" | "'rule'")
}

impl Layout {
    /// The layout of `text`, whose rules are `rules` in file order; `None`
    /// when its `[[rule]]` headers are not exactly one per rule (rules in
    /// an inline array, a header-like line inside a string).
    pub(super) fn of(text: &str, rules: &[RuleConfig]) -> Option<Layout> {
        let mut headers = Vec::with_capacity(rules.len());
        let mut at = 0;
        for line in text.split_inclusive('\n') {
            if line.trim_start().starts_with("[[") && rule_header(line) {
                headers.push(at);
            }
            at += line.len();
        }
        if headers.len() != rules.len() {
            return None;
        }
        let hasher = RandomState::new();
        let mut index = HashMap::with_capacity(rules.len());
        for (i, r) in rules.iter().enumerate() {
            if index.insert(hasher.hash_one(r.key().ok()?), u32::try_from(i).ok()?).is_some() {
                return None;
            }
        }
        Some(Layout { headers, index, hasher })
    }

    /// Takes an edit of `[from, to)` into `new_len` bytes that holds no
    /// rule (the `[daemon]` table's).
    pub(super) fn shift(&mut self, from: usize, to: usize, new_len: usize) {
        for h in self.headers.iter_mut().filter(|h| **h >= to) {
            *h = (*h + new_len).wrapping_sub(to - from);
        }
    }

    /// Takes `op`, made to the text this layout was of.
    pub(super) fn apply(&mut self, op: &Op) {
        let shift = |h: &mut usize| *h = (*h + op.new_len).wrapping_sub(op.to - op.from);
        match &op.kind {
            Kind::Replace { i } => {
                self.headers[i + 1..].iter_mut().for_each(shift);
            }
            Kind::Remove { i, key } => {
                self.headers.remove(*i);
                self.index.remove(&self.hasher.hash_one(key));
                for v in self.index.values_mut() {
                    if *v as usize > *i {
                        *v -= 1;
                    }
                }
                self.headers[*i..].iter_mut().for_each(shift);
            }
            Kind::Push { key, header } => {
                // `splice` adds no key whose hash a rule of the file has.
                self.index.insert(self.hasher.hash_one(key), self.headers.len() as u32);
                self.headers.push(*header);
            }
        }
    }
}

/// What an edit did to the rules, for [`Layout::apply`] and the config's
/// rule list.
#[derive(Clone, Debug)]
pub(super) enum Kind {
    /// Rule `i` was rewritten.
    Replace {
        i: usize,
    },
    Remove {
        i: usize,
        key: RuleKey,
    },
    /// A new last rule, its header at `header`.
    Push {
        key: RuleKey,
        header: usize,
    },
}

/// One edit of the text: `[from, to)` replaced by `new_len` bytes.
#[derive(Clone, Debug)]
pub(super) struct Op {
    pub kind: Kind,
    from: usize,
    to: usize,
    new_len: usize,
}

/// The lines of `text` from `at` on, up to (not including) the next
/// boundary line.
fn lines_from(text: &str, at: usize) -> impl Iterator<Item = Line> + '_ {
    let mut pos = at;
    text[at..].split_inclusive('\n').map(move |l| {
        let line = Line { start: pos, end: pos + l.len() };
        pos += l.len();
        line
    })
}

/// The end of the table whose header line starts at `h`: past its last
/// line that is neither blank nor a comment (what follows belongs to the
/// next table or the end of the file); and where the next boundary is.
fn table_end(text: &str, h: usize) -> (usize, Option<usize>) {
    let mut lines = lines_from(text, h);
    let first = lines.next().map_or(text.len(), |l| l.end);
    let mut end = first;
    for l in lines {
        let s = &text[l.start..l.end];
        if boundary(s) {
            return (end, Some(l.start));
        }
        if !blank(s) && !comment(s) {
            end = l.end;
        }
    }
    (end, None)
}

/// Where the run of blank and comment lines directly above `h` starts;
/// `None` when it reaches the start of the text.
fn decor_start(text: &str, h: usize) -> Option<usize> {
    let mut start = h;
    for l in text[..h].split_inclusive('\n').rev() {
        if !(blank(l) || comment(l)) {
            return Some(start);
        }
        start -= l.len();
    }
    None
}

/// Parses `chunk` (one `[[rule]]` table) alone: the rule it says.
fn one_rule(chunk: &str) -> Option<RuleSpec> {
    let (cfg, rules) = Config::parse(chunk, std::path::Path::new("-")).ok()?;
    if cfg.rules.len() != 1 || rules.len() != 1 || cfg.sets.len() + usize::from(cfg.crowdsec.is_some()) != 0 {
        return None;
    }
    rules.into_values().next()
}

/// The one table of a one-rule document.
fn table(doc: &mut DocumentMut) -> Option<&mut Table> {
    match doc.get_mut("rule")? {
        Item::ArrayOfTables(a) if a.len() == 1 => a.get_mut(0),
        _ => None,
    }
}

/// `text` with `edits` made (each key once: `Some` sets the rule, `None`
/// removes it), where `before` are the rules `text` holds and `layout`
/// where they are; `None` when the edits are not for this path (then
/// `edit.rs` makes them).
pub(super) fn splice(
    text: &str,
    layout: &Layout,
    before: &dyn SpecMap,
    edits: &[(RuleKey, Option<RuleSpec>)],
) -> Option<(String, Vec<Op>)> {
    // A byte order mark is dropped by a write (`edit.rs`).
    if edits.is_empty()
        || edits.len() > MAX_EDITS
        || !text.ends_with('\n')
        || text.starts_with('\u{feff}')
        || layout.headers.is_empty()
    {
        return None;
    }
    // Changes and removals of rules the file has, by place; additions.
    let mut at: Vec<(usize, &RuleKey, Option<&RuleSpec>)> = Vec::new();
    let mut new: Vec<&RuleSpec> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, want) in edits {
        if !seen.insert(k.clone()) {
            return None;
        }
        // A key found by hash is checked below against the rule there.
        match (layout.slot(k), before.spec(k), want) {
            (Some(_), Some(old), Some(w)) if old == w => {}
            (Some(i), Some(_), w) => at.push((i, k, w.as_ref())),
            (None, None, Some(w)) => new.push(w),
            (None, None, None) => {}
            // The layout and the rules disagree: not for this path.
            _ => return None,
        }
    }
    at.sort_by_key(|(i, ..)| *i);
    let last = layout.headers.len() - 1;
    // An addition goes after the last rule: not with an edit of it.
    if !new.is_empty() && at.last().is_some_and(|(i, ..)| *i == last) {
        return None;
    }

    // Each edit's region, checked apart from its neighbours', then made
    // from the last to the first so the places before each stay valid.
    let mut ops: Vec<(Op, String)> = Vec::new();
    let mut floor = 0;
    for (i, key, want) in at {
        let h = layout.headers[i];
        let (end, next) = table_end(text, h);
        let old = one_rule(&text[h..end])?;
        if old.key() != *key || Some(&old) != before.spec(key) {
            return None;
        }
        let (op, with) = match want {
            Some(new) => {
                let mut doc: DocumentMut = text[h..end].parse().ok()?;
                edit::update(table(&mut doc)?, &old, new);
                let mut out = doc.to_string();
                if one_rule(&out).as_ref() != Some(new) {
                    edit::write_params(table(&mut doc)?, &new.config());
                    out = doc.to_string();
                    if one_rule(&out).as_ref() != Some(new) {
                        return None;
                    }
                }
                (Op { kind: Kind::Replace { i }, from: h, to: end, new_len: out.len() }, out)
            }
            None => {
                // The comment block above: its paragraphs set off by a
                // blank line stay (with the next table, blank lines at
                // its top trimmed), its last one goes with the rule.
                let p = decor_start(text, h)?;
                let prefix = &text[p..h];
                let d = p + edit::split_detached(prefix).0.len();
                if !text[p..d].contains('#') {
                    (Op { kind: Kind::Remove { i, key: key.clone() }, from: p, to: end, new_len: 0 }, String::new())
                } else if let Some(next) = next {
                    let after = &text[end..next];
                    let trimmed = after.len() - edit::trim_blank_lines(after).len();
                    (
                        Op { kind: Kind::Remove { i, key: key.clone() }, from: d, to: end + trimmed, new_len: 0 },
                        String::new(),
                    )
                } else {
                    let kept = format!("{}\n", text[p..d].trim_end_matches('\n'));
                    (Op { kind: Kind::Remove { i, key: key.clone() }, from: p, to: end, new_len: kept.len() }, kept)
                }
            }
        };
        if op.from < floor {
            return None;
        }
        floor = op.to.max(next.unwrap_or(op.to));
        ops.push((op, with));
    }
    // Additions: after the last rule, each as `edit.rs` appends one.
    let mut insert: Option<(usize, String)> = None;
    let mut pushes = Vec::new();
    if !new.is_empty() {
        let (end, _) = table_end(text, layout.headers[last]);
        if end < floor {
            return None;
        }
        let mut added = String::new();
        for s in new {
            let mut t = Table::new();
            t.decor_mut().set_prefix("\n");
            edit::fill(&mut t, s);
            let mut one = ArrayOfTables::new();
            one.push(t);
            let mut d = DocumentMut::new();
            d.insert("rule", Item::ArrayOfTables(one));
            let out = d.to_string();
            if one_rule(&out).as_ref() != Some(s) {
                return None;
            }
            // Its header's place in the text the edits before it leave.
            let header = end + added.len() + out.find("[[")?;
            pushes.push(Op { kind: Kind::Push { key: s.key(), header }, from: end, to: end, new_len: 0 });
            added.push_str(&out);
        }
        insert = Some((end, added));
    }

    let grow: usize = ops.iter().map(|(_, w)| w.len()).sum::<usize>() + insert.as_ref().map_or(0, |(_, a)| a.len());
    let mut out = String::with_capacity(text.len() + grow);
    let mut pos = 0;
    for (op, with) in &ops {
        out.push_str(&text[pos..op.from]);
        out.push_str(with);
        pos = op.to;
    }
    if let Some((at, added)) = &insert {
        out.push_str(&text[pos..*at]);
        out.push_str(added);
        pos = *at;
    }
    out.push_str(&text[pos..]);

    // For the layout, in file order: each edit's place and rule index in
    // the text the edits before it left.
    let mut done = Vec::with_capacity(ops.len() + pushes.len());
    let (mut moved, mut removed) = (0isize, 0usize);
    for (mut op, _) in ops {
        op.from = op.from.wrapping_add_signed(moved);
        op.to = op.to.wrapping_add_signed(moved);
        moved += op.new_len as isize - (op.to - op.from) as isize;
        match &mut op.kind {
            Kind::Replace { i } => *i -= removed,
            Kind::Remove { i, .. } => {
                *i -= removed;
                removed += 1;
            }
            Kind::Push { .. } => {}
        }
        done.push(op);
    }
    for mut op in pushes {
        if let Kind::Push { header, .. } = &mut op.kind {
            *header = header.wrapping_add_signed(moved);
        }
        done.push(op);
    }
    Some((out, done))
}

/// Whether `line` is the `[daemon]` header.
fn daemon_header(line: &str) -> bool {
    let Some(rest) = line.trim_start().strip_prefix('[') else { return false };
    let Some((name, after)) = rest.split_once(']') else { return false };
    let after = after.trim();
    (after.is_empty() || after.starts_with('#')) && matches!(name.trim(), "daemon" | "\"daemon\"" | "'daemon'")
}

/// `text` with `daemon.interfaces` set to `names`, where `daemon` is what
/// its `[daemon]` table says: only that table is parsed and rewritten (as
/// `edit.rs` would). The text and the span `[from, to)` it replaced
/// with how many bytes; `None` when the text has no one `[daemon]` table
/// laid out as this expects.
pub(super) fn splice_interfaces(
    text: &str,
    daemon: &super::DaemonConfig,
    names: &[String],
) -> Option<(String, usize, usize, usize)> {
    if !text.ends_with('\n') || text.starts_with('\u{feff}') {
        return None;
    }
    let (mut at, mut found) = (0, None);
    for line in text.split_inclusive('\n') {
        if daemon_header(line) {
            if found.is_some() {
                return None;
            }
            found = Some(at);
        }
        at += line.len();
    }
    let Some(h) = found else { return add_daemon(text, daemon, names) };
    let (end, _) = table_end(text, h);
    let read = |chunk: &str| Config::parse(chunk, std::path::Path::new("-")).ok().filter(|(_, r)| r.is_empty());
    let (old, _) = read(&text[h..end])?;
    if old.daemon != *daemon {
        return None;
    }
    let mut doc: DocumentMut = text[h..end].parse().ok()?;
    let t = doc.get_mut("daemon")?.as_table_like_mut()?;
    edit::set(t, "interfaces", Some(toml_edit::Value::Array(names.iter().collect())));
    let out = doc.to_string();
    let (new, _) = read(&out)?;
    if new.daemon != (super::DaemonConfig { interfaces: names.to_vec(), ..daemon.clone() }) {
        return None;
    }
    let len = out.len();
    Some((format!("{}{out}{}", &text[..h], &text[end..]), h, end, len))
}

/// `text`, which has no `[daemon]` table, with one holding `interfaces`
/// after its last table (as `edit.rs` adds it); `None` when the text
/// might say something of `daemon` elsewhere (a dotted key, a subtable),
/// has no table, or its daemon settings are not the defaults.
fn add_daemon(text: &str, daemon: &super::DaemonConfig, names: &[String]) -> Option<(String, usize, usize, usize)> {
    if *daemon != super::DaemonConfig::default() {
        return None;
    }
    let mut last = None;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let t = line.trim_start().trim_start_matches(['[', '"', '\'']);
        if t.starts_with("daemon") {
            return None;
        }
        if boundary(line) {
            last = Some(at);
        }
        at += line.len();
    }
    let (end, _) = table_end(text, last?);
    let mut t = Table::new();
    t.decor_mut().set_prefix("\n");
    t.insert("interfaces", Item::Value(toml_edit::Value::Array(names.iter().collect())));
    let mut doc = DocumentMut::new();
    doc.insert("daemon", Item::Table(t));
    let out = doc.to_string();
    let (new, rules) = Config::parse(&out, std::path::Path::new("-")).ok()?;
    if !rules.is_empty() || new.daemon != (super::DaemonConfig { interfaces: names.to_vec(), ..Default::default() }) {
        return None;
    }
    let len = out.len();
    Some((format!("{}{out}{}", &text[..end], &text[end..]), end, end, len))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\n\n[[rule]]\nprefix = \"192.0.2.0/24\"\nrate = \"2kpps\"\n";

    fn spec(prefix: &str, rate: &str) -> RuleSpec {
        RuleConfig { prefix: prefix.into(), rate: Some(rate.into()), ..RuleConfig::default() }.validate().unwrap()
    }

    /// The index holds hashes of keys, not keys: a place it gives is
    /// edited only when the rule found there has the key, so a hash that
    /// leads to another rule (two keys with one hash) makes the change go
    /// the whole-document way, never edits the wrong rule.
    #[test]
    fn a_hash_that_leads_to_another_rule_is_not_followed() {
        let (cfg, before) = Config::parse(TEXT, std::path::Path::new("-")).unwrap();
        let layout = Layout::of(TEXT, &cfg.rules).unwrap();
        let a = spec("10.0.0.0/8", "5kpps");
        let (out, _) = splice(TEXT, &layout, &before, &[(a.key(), Some(a.clone()))]).unwrap();
        assert!(out.contains("rate = \"5kpps\"") && out.contains("rate = \"2kpps\""), "{out}");

        // The key of the first rule leads to the second.
        let mut forged = layout.clone();
        forged.index.insert(forged.hasher.hash_one(a.key()), 1);
        assert!(splice(TEXT, &forged, &before, &[(a.key(), Some(a.clone()))]).is_none());
        assert!(splice(TEXT, &forged, &before, &[(a.key(), None)]).is_none());

        // A new key whose hash a rule of the file has is not added here.
        let c = spec("198.51.100.0/24", "1kpps");
        let mut forged = layout.clone();
        forged.index.insert(forged.hasher.hash_one(c.key()), 0);
        assert!(splice(TEXT, &forged, &before, &[(c.key(), Some(c.clone()))]).is_none());
        assert!(splice(TEXT, &layout, &before, &[(c.key(), Some(c))]).is_some());
    }
}
