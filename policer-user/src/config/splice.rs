//! Changing a few rules of a big file without parsing the whole of it.
//!
//! `edit.rs` parses the whole document, edits it and parses the result
//! back: right for any layout, but a 100 000-rule file costs about a
//! second per `policer rule set`. Here a change of a few rules touches
//! only their text: the file's `[[rule]]` headers are found once by a scan
//! of the whole text ([`RuleLayout`], checked against the rules the file was
//! read to hold), kept up to date as rules are changed, removed and added,
//! and each change parses and writes only the rule it is about. Whatever
//! is not laid out as this expects (rules in an inline array, a rule's
//! text that does not parse alone, edits next to each other, the first
//! table of the file, a header or top-level key written with escapes) is
//! left to `edit.rs`.
//!
//! **Why the text written says what was wanted**, without parsing it
//! whole (a 100 000-rule file costs a second to parse, a change here
//! ~18 ms). Lines are read by `lex.rs`, which follows strings (multi-line
//! basic and literal ones, escapes) and values spread over lines, so a
//! line starting inside one is never taken for a header, a comment or a
//! blank line. Call a place *at the top level* when it is the start of a
//! line outside every string and value.
//!
//! 1. [`RuleLayout::of`] reads the whole text once: every `[[rule]]` header it
//!    keeps is at the top level, there is one per rule of the file, and no
//!    header or top-level key might name `rule` otherwise (`[rule.x]`,
//!    `[["ru\u006ce"]]` give no layout). So the k-th header starts the
//!    k-th rule's table, which runs to the next header.
//! 2. Each edit's region is read forward from a place known to be at the
//!    top level (the rule's header; for the comments above it, the header
//!    before, or the start of the text): so its ends, a header and the end
//!    of a table's last value line, are at the top level too, and the
//!    region is whole lines of one rule's table (and the comment and blank
//!    lines above it, or after it up to the next header).
//! 3. Each piece put in its place is read the same way on its own: it
//!    starts and ends at the top level, ends with a newline, and holds one
//!    header, a plain `[[rule]]`, with only comments and blank lines before
//!    it (a removal's kept comments hold none); parsed alone it is exactly
//!    the rule wanted.
//!
//! Cutting a text at top-level places and joining such pieces leaves every
//! other line what it was (in or out of a string, and in the same table),
//! so the new text's tables are the old ones with the edited rules'
//! replaced by the pieces: it parses, and says the wanted rules and the
//! rest as before. Anything this cannot show gives `None`, and `edit.rs`
//! makes the change (parsing the result whole). The `[daemon]` table's
//! edits ([`splice_interfaces`]) are shown the same way.
//!
//! The result is what `edit.rs` would write, line for line (the tests
//! make every edit both ways and compare; where a removed rule sat between
//! comment paragraphs the two may keep a different number of blank lines
//! there): a changed rule keeps its
//! comments and the keys whose meaning did not change; a removed rule goes
//! with the comment lines directly above it, and a comment paragraph set
//! off from it by a blank line stays; a new rule is appended after the
//! last one in canonical form.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};

use toml_edit::{ArrayOfTables, DocumentMut, Item, Table};

use super::{
    Config, edit,
    lex::{Lexer, Line, TableHeader},
};
use crate::rules::{RuleConfig, RuleKey, RuleSpec, SpecMap};

/// Edits in one change past which the whole document is edited instead
/// (each edit here moves the text after it).
pub(super) const MAX_EDITS: usize = 64;

/// Where the `[[rule]]` tables of a text start.
#[derive(Clone, Debug, Default)]
pub(super) struct RuleLayout {
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

impl RuleLayout {
    fn slot(&self, key: &RuleKey) -> Option<usize> {
        self.index.get(&self.hasher.hash_one(key)).map(|&i| i as usize)
    }
}

/// Reads the lines of `text[from..to]`, `from` at the top level, with
/// `f` (each line's start, the line, and what it is); `None`: a line this
/// does not read, or `to` not at the top level.
fn lines(text: &str, from: usize, to: usize, mut f: impl FnMut(usize, &str, &Line) -> Option<()>) -> Option<()> {
    let mut lx = Lexer::default();
    let mut at = from;
    for l in text.get(from..to)?.split_inclusive('\n') {
        f(at, l, &lx.line(l)?)?;
        at += l.len();
    }
    lx.at_top().then_some(())
}

/// Whether `piece`, put between two places at the top level, leaves them
/// so: it starts and ends at the top level, ends with a newline (or is
/// empty), and holds no header but one for which `header` says yes, with
/// only comments and blank lines before it (`None`: no header at all).
fn whole_lines(piece: &str, header: Option<fn(&TableHeader) -> bool>) -> bool {
    let mut seen = false;
    let ok = lines(piece, 0, piece.len(), |_, _, l| match l {
        Line::Header(h) if !seen && header.is_some_and(|f| f(h)) => {
            seen = true;
            Some(())
        }
        Line::Header(_) => None,
        Line::Blank | Line::Comment => Some(()),
        Line::Key(_) | Line::Inside if seen => Some(()),
        Line::Key(_) | Line::Inside => None,
    });
    ok.is_some() && seen == header.is_some() && (piece.is_empty() || piece.ends_with('\n'))
}

/// A plain `[[rule]]` header.
fn rule_table(h: &TableHeader) -> bool {
    h.is(true, "rule")
}

/// A plain `[daemon]` header.
fn daemon_table(h: &TableHeader) -> bool {
    h.is(false, "daemon")
}

/// Where the first table that may hold rules starts in `text` (its end:
/// none); `None` when the text up to there is not read (see `lex.rs`).
/// The lines after it are not read (a start's early look at a
/// 1 000 000-rule file reads its head only).
pub(super) fn first_rule_header(text: &str) -> Option<usize> {
    let mut lx = Lexer::default();
    let mut at = 0;
    for l in text.split_inclusive('\n') {
        if let Line::Header(h) = lx.line(l)?
            && h.may_be("rule")
        {
            return Some(at);
        }
        at += l.len();
    }
    lx.at_top().then_some(text.len())
}

/// Where the `[[rule]]` headers of `text` start, each at the top level;
/// `None` when a header or a top-level key might name `rule` otherwise, or
/// `lex.rs` does not read a line.
fn rule_headers(text: &str) -> Option<Vec<usize>> {
    let mut headers = Vec::new();
    // Before the first header, a key is the document's own.
    let mut root = true;
    lines(text, 0, text.len(), |at, line, l| {
        match l {
            // Spelled as `edit.rs` writes it (a quoted or spaced name
            // is not kept by the whole-document edit).
            Line::Header(h) if rule_table(h) && line.trim_start().starts_with("[[rule]]") => headers.push(at),
            // `[rule.x]`, `[["ru\u006ce"]]`, `[[ "rule" ]]`: not laid
            // out as this expects.
            Line::Header(h) if h.may_be("rule") => return None,
            Line::Key(k) if root && k.as_deref().is_none_or(|k| k == "rule") => return None,
            _ => {}
        }
        root &= !matches!(l, Line::Header(_));
        Some(())
    })?;
    Some(headers)
}

impl RuleLayout {
    /// The layout of `text`, whose rules are `rules` in file order; `None`
    /// when its top-level `[[rule]]` headers are not exactly one per rule
    /// (rules in an inline array), a header or a top-level key might name
    /// `rule` otherwise, or `lex.rs` does not read a line.
    ///
    /// `found`: the headers as the chunked reader found them (`read/chunks.rs`:
    /// by the same lexer, each a plain `[[rule]]` at the top level, no other
    /// header that may name `rule`, the whole text read): then only the
    /// lines before the first are read here, for the root's keys.
    pub(super) fn of(text: &str, rules: &[RuleConfig], found: Option<Vec<usize>>) -> Option<RuleLayout> {
        let headers = match found {
            Some(headers) => {
                // Before the first header, a key is the document's own.
                let head = headers.first().copied().unwrap_or(text.len());
                let mut root = true;
                lines(text, 0, head, |_, _, l| {
                    match l {
                        Line::Key(k) if root && k.as_deref().is_none_or(|k| k == "rule") => return None,
                        Line::Header(_) => root = false,
                        _ => {}
                    }
                    Some(())
                })?;
                // The tests find them both ways.
                #[cfg(test)]
                assert_eq!(Some(&headers), rule_headers(text).as_ref(), "{text}");
                headers
            }
            None => rule_headers(text)?,
        };
        RuleLayout::indexed(headers, rules)
    }

    /// The layout of rules whose headers are `headers`, one each.
    fn indexed(headers: Vec<usize>, rules: &[RuleConfig]) -> Option<RuleLayout> {
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
        Some(RuleLayout { headers, index, hasher })
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
            RuleEdit::Replace { i } => {
                self.headers[i + 1..].iter_mut().for_each(shift);
            }
            RuleEdit::Remove { i, key } => {
                self.headers.remove(*i);
                self.index.remove(&self.hasher.hash_one(key));
                for v in self.index.values_mut() {
                    if *v as usize > *i {
                        *v -= 1;
                    }
                }
                self.headers[*i..].iter_mut().for_each(shift);
            }
            RuleEdit::Push { key, header } => {
                // `splice` adds no key whose hash a rule of the file has.
                self.index.insert(self.hasher.hash_one(key), self.headers.len() as u32);
                self.headers.push(*header);
            }
        }
    }
}

/// What an edit did to the rules, for [`RuleLayout::apply`] and the config's
/// rule list.
#[derive(Clone, Debug)]
pub(super) enum RuleEdit {
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
    pub kind: RuleEdit,
    from: usize,
    to: usize,
    new_len: usize,
}

/// The end of the table whose header line starts at `h` (at the top
/// level): past its last line that is neither blank nor a comment (what
/// follows belongs to the next table or the end of the file); and where
/// the next header is. `None`: not read.
fn table_end(text: &str, h: usize) -> Option<(usize, Option<usize>)> {
    let mut lx = Lexer::default();
    let mut at = h;
    let mut end = None;
    for l in text.get(h..)?.split_inclusive('\n') {
        match (end, lx.line(l)?) {
            (None, Line::Header(_)) => end = Some(at + l.len()),
            (None, _) => return None,
            (Some(end), Line::Header(_)) => return Some((end, Some(at))),
            (Some(_), Line::Blank | Line::Comment) => {}
            (Some(_), Line::Key(_) | Line::Inside) => end = Some(at + l.len()),
        }
        at += l.len();
    }
    lx.at_top().then_some((end?, None))
}

/// Where the run of blank and comment lines directly above `h` starts,
/// read from `from` (at the top level, before `h`); `None` when it reaches
/// the start of the text, or the lines are not read.
fn decor_start(text: &str, from: usize, h: usize) -> Option<usize> {
    let mut run = None;
    lines(text, from, h, |at, _, l| {
        match l {
            Line::Blank | Line::Comment => {
                run.get_or_insert(at);
            }
            _ => run = None,
        }
        Some(())
    })?;
    Some(run.unwrap_or(h)).filter(|p| *p != 0)
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
    layout: &RuleLayout,
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
    let (at, new) = sorted(layout, before, edits)?;
    let last = layout.headers.len() - 1;
    // An addition goes after the last rule: not with an edit of it.
    if !new.is_empty() && at.last().is_some_and(|(i, ..)| *i == last) {
        return None;
    }
    let (ops, floor) = regions(text, layout, before, at)?;
    // Additions: after the last rule, each as `edit.rs` appends one.
    let (insert, pushes) = if new.is_empty() {
        (None, Vec::new())
    } else {
        let (insert, pushes) = additions(text, layout.headers[last], floor, &new)?;
        (Some(insert), pushes)
    };
    let out = joined(text, &ops, insert.as_ref());
    Some((out, placed(ops, pushes)))
}

/// An edit of a rule the file has: its place in the layout, its key, and
/// the rule it becomes (`None`: removed).
type InPlace<'e> = (usize, &'e RuleKey, Option<&'e RuleSpec>);

/// `edits` sorted: the changes and removals of rules the file has, by
/// place, and the additions, in the order of their keys; `None` when a
/// key comes twice, or the layout and the rules disagree about one.
fn sorted<'e>(
    layout: &RuleLayout,
    before: &dyn SpecMap,
    edits: &'e [(RuleKey, Option<RuleSpec>)],
) -> Option<(Vec<InPlace<'e>>, Vec<&'e RuleSpec>)> {
    // Changes and removals of rules the file has, by place; additions.
    let mut at: Vec<InPlace<'e>> = Vec::new();
    let mut new: Vec<&RuleSpec> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (k, want) in edits {
        if !seen.insert(k.clone()) {
            return None;
        }
        // A key found by hash is checked against the rule there
        // ([`regions`]).
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
    // Appended in the order of their keys, as `edit.rs` appends them.
    new.sort_by_cached_key(|s| s.key());
    Some((at, new))
}

/// Each edit's region of `text` and what goes in its place, in file
/// order, and where the text after the last region starts (past the
/// blank and comment lines up to the next header); `None` when a region
/// is not as this expects or runs into the one before.
fn regions(
    text: &str,
    layout: &RuleLayout,
    before: &dyn SpecMap,
    at: Vec<InPlace<'_>>,
) -> Option<(Vec<(Op, String)>, usize)> {
    // Each edit's region, checked apart from its neighbours', then made
    // from the last to the first so the places before each stay valid.
    let mut ops: Vec<(Op, String)> = Vec::new();
    let mut floor = 0;
    for (i, key, want) in at {
        let h = layout.headers[i];
        let (end, next) = table_end(text, h)?;
        let old = one_rule(&text[h..end])?;
        if old.key() != *key || Some(&old) != before.spec(key) {
            return None;
        }
        let (op, with) = match want {
            Some(new) => replacement(text, i, h..end, &old, new)?,
            None => removal(text, layout, i, key, end, next)?,
        };
        if op.from < floor {
            return None;
        }
        floor = op.to.max(next.unwrap_or(op.to));
        ops.push((op, with));
    }
    Some((ops, floor))
}

/// Rule `i`, whose table `text[span]` says `old`, rewritten to say `new`
/// as `edit.rs` rewrites it (its comments and the keys whose meaning did
/// not change kept): the edit and the table's new text; `None` when the
/// rewritten table, read alone, does not say `new` or is not whole lines.
fn replacement(
    text: &str,
    i: usize,
    span: std::ops::Range<usize>,
    old: &RuleSpec,
    new: &RuleSpec,
) -> Option<(Op, String)> {
    let mut doc: DocumentMut = text[span.clone()].parse().ok()?;
    edit::update(table(&mut doc)?, old, new);
    let mut out = doc.to_string();
    if one_rule(&out).as_ref() != Some(new) {
        edit::write_params(table(&mut doc)?, &new.config());
        out = doc.to_string();
        if one_rule(&out).as_ref() != Some(new) {
            return None;
        }
    }
    if !whole_lines(&out, Some(rule_table)) {
        return None;
    }
    Some((Op { kind: RuleEdit::Replace { i }, from: span.start, to: span.end, new_len: out.len() }, out))
}

/// Rule `i` (key `key`; its table ends at `end`, the next header is at
/// `next`) removed with the comment lines directly above it: the edit and
/// what stays in its place; `None` when what stays is not whole lines.
fn removal(
    text: &str,
    layout: &RuleLayout,
    i: usize,
    key: &RuleKey,
    end: usize,
    next: Option<usize>,
) -> Option<(Op, String)> {
    let h = layout.headers[i];
    // The comment block above: its paragraphs set off by a
    // blank line stay (with the next table, blank lines at
    // its top trimmed), its last one goes with the rule.
    let p = decor_start(text, if i == 0 { 0 } else { layout.headers[i - 1] }, h)?;
    let prefix = &text[p..h];
    let d = p + edit::split_detached(prefix).0.len();
    Some(if !text[p..d].contains('#') {
        (Op { kind: RuleEdit::Remove { i, key: key.clone() }, from: p, to: end, new_len: 0 }, String::new())
    } else if let Some(next) = next {
        let after = &text[end..next];
        let trimmed = after.len() - edit::trim_blank_lines(after).len();
        (Op { kind: RuleEdit::Remove { i, key: key.clone() }, from: d, to: end + trimmed, new_len: 0 }, String::new())
    } else {
        let kept = format!("{}\n", text[p..d].trim_end_matches('\n'));
        if !whole_lines(&kept, None) {
            return None;
        }
        (Op { kind: RuleEdit::Remove { i, key: key.clone() }, from: p, to: end, new_len: kept.len() }, kept)
    })
}

/// The rules `new` added after the last rule (whose header is at `last`),
/// each as `edit.rs` appends one: where they go in `text` and their text,
/// and an edit for each for the layout; `None` when that place runs into
/// an edit's region (`floor`) or a new rule's text, read alone, does not
/// say the rule or is not whole lines.
fn additions(text: &str, last: usize, floor: usize, new: &[&RuleSpec]) -> Option<((usize, String), Vec<Op>)> {
    let (end, _) = table_end(text, last)?;
    if end < floor {
        return None;
    }
    let mut added = String::new();
    let mut pushes = Vec::new();
    for &s in new {
        let mut t = Table::new();
        t.decor_mut().set_prefix("\n");
        edit::fill(&mut t, s);
        let mut one = ArrayOfTables::new();
        one.push(t);
        let mut d = DocumentMut::new();
        d.insert("rule", Item::ArrayOfTables(one));
        let out = d.to_string();
        if one_rule(&out).as_ref() != Some(s) || !whole_lines(&out, Some(rule_table)) {
            return None;
        }
        // Its header's place in the text the edits before it leave.
        let header = end + added.len() + out.find("[[")?;
        pushes.push(Op { kind: RuleEdit::Push { key: s.key(), header }, from: end, to: end, new_len: 0 });
        added.push_str(&out);
    }
    Some(((end, added), pushes))
}

/// `text` with each edit's region replaced by its text, in file order,
/// and `insert`'s text put at its place.
fn joined(text: &str, ops: &[(Op, String)], insert: Option<&(usize, String)>) -> String {
    let grow: usize = ops.iter().map(|(_, w)| w.len()).sum::<usize>() + insert.map_or(0, |(_, a)| a.len());
    let mut out = String::with_capacity(text.len() + grow);
    let mut pos = 0;
    for (op, with) in ops {
        out.push_str(&text[pos..op.from]);
        out.push_str(with);
        pos = op.to;
    }
    if let Some((at, added)) = insert {
        out.push_str(&text[pos..*at]);
        out.push_str(added);
        pos = *at;
    }
    out.push_str(&text[pos..]);
    out
}

/// For the layout, in file order: each edit's place and rule index in
/// the text the edits before it left (`ops`, then the additions'
/// `pushes`).
fn placed(ops: Vec<(Op, String)>, pushes: Vec<Op>) -> Vec<Op> {
    let mut done = Vec::with_capacity(ops.len() + pushes.len());
    let (mut moved, mut removed) = (0isize, 0usize);
    for (mut op, _) in ops {
        op.from = op.from.wrapping_add_signed(moved);
        op.to = op.to.wrapping_add_signed(moved);
        moved += op.new_len as isize - (op.to - op.from) as isize;
        match &mut op.kind {
            RuleEdit::Replace { i } => *i -= removed,
            RuleEdit::Remove { i, .. } => {
                *i -= removed;
                removed += 1;
            }
            RuleEdit::Push { .. } => {}
        }
        done.push(op);
    }
    for mut op in pushes {
        if let RuleEdit::Push { header, .. } = &mut op.kind {
            *header = header.wrapping_add_signed(moved);
        }
        done.push(op);
    }
    done
}

/// `text` with `daemon.interfaces` set to `names`, where `daemon` is what
/// its `[daemon]` table says: only that table is parsed and rewritten (as
/// `edit.rs` would). The text and the span `[from, to)` it replaced
/// with how many bytes; `None` when the text has no one `[daemon]` table
/// laid out as this expects (a header or a top-level key that might name
/// `daemon` otherwise: `[daemon.x]`, `daemon.mode = ...`,
/// `"d\u0061emon" = {}`), or a line `lex.rs` does not read.
pub(super) fn splice_interfaces(
    text: &str,
    daemon: &super::DaemonConfig,
    names: &[String],
) -> Option<(String, usize, usize, usize)> {
    if !text.ends_with('\n') || text.starts_with('\u{feff}') {
        return None;
    }
    let (mut found, mut last, mut root) = (None, None, true);
    lines(text, 0, text.len(), |at, line, l| {
        match l {
            Line::Header(h) if daemon_table(h) && line.trim_start().starts_with("[daemon]") => {
                if found.replace(at).is_some() {
                    return None;
                }
            }
            Line::Header(h) if h.may_be("daemon") => return None,
            Line::Key(k) if root && k.as_deref().is_none_or(|k| k == "daemon") => return None,
            _ => {}
        }
        if let Line::Header(_) = l {
            root = false;
            last = Some(at);
        }
        Some(())
    })?;
    let Some(h) = found else { return add_daemon(text, daemon, names, last?) };
    let (end, _) = table_end(text, h)?;
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
    if new.daemon != (super::DaemonConfig { interfaces: names.to_vec(), ..daemon.clone() })
        || !whole_lines(&out, Some(daemon_table))
    {
        return None;
    }
    let len = out.len();
    Some((format!("{}{out}{}", &text[..h], &text[end..]), h, end, len))
}

/// `text`, which has no `[daemon]` table nor any key that might name one
/// (`splice_interfaces` read it), with one holding `interfaces` after its
/// last table, whose header is at `last` (as `edit.rs` adds it); `None`
/// when its daemon settings are not the defaults.
fn add_daemon(
    text: &str,
    daemon: &super::DaemonConfig,
    names: &[String],
    last: usize,
) -> Option<(String, usize, usize, usize)> {
    if *daemon != super::DaemonConfig::default() {
        return None;
    }
    let (end, _) = table_end(text, last)?;
    let mut t = Table::new();
    t.decor_mut().set_prefix("\n");
    t.insert("interfaces", Item::Value(toml_edit::Value::Array(names.iter().collect())));
    let mut doc = DocumentMut::new();
    doc.insert("daemon", Item::Table(t));
    let out = doc.to_string();
    let (new, rules) = Config::parse(&out, std::path::Path::new("-")).ok()?;
    if !rules.is_empty()
        || new.daemon != (super::DaemonConfig { interfaces: names.to_vec(), ..Default::default() })
        || !whole_lines(&out, Some(daemon_table))
    {
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
        let layout = RuleLayout::of(TEXT, &cfg.rules, None).unwrap();
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
