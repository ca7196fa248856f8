//! Reading a big file in chunks: its `[[rule]]` tables a few thousand at a
//! time, so that a 1 000 000-rule file (65 MB) is never one parse tree
//! (toml's spanned tree of it, its tokens and its events were 2.3 GB).
//!
//! **Why a chunked read says what the whole read says.** The text's lines
//! are read by `lex.rs` (strings, multi-line ones, values spread over
//! lines): a *run* is a stretch of lines from a plain `[[rule]]` header up
//! to the next header that is not one (or the end); any other header that
//! may name `rule` (`[rule.x]`, `[["ru\u006ce"]]`, `[[ rule ]]`) gives no
//! chunked read. The *skeleton* is the text with each run's lines replaced
//! by as many empty lines (every other line keeps its number), and each
//! run is cut at its headers into chunks of at most `per` rules. Then:
//!
//! - the skeleton and every chunk parse alone, without an error (else the
//!   whole text is read, which says every syntax error as it always did);
//! - each piece starts at a line's start, so the text is the pieces' TOML
//!   expressions in order: it parses, into the same tables;
//! - a chunk's headers are all `[[rule]]`: each appends a table to the
//!   `rule` array, its keys are that table's, and the skeleton's root holds
//!   no `rule` (checked), so nothing of a chunk meets the skeleton's;
//! - the skeleton's keys after a run begin with a header (the run ended at
//!   one), so each lands in the table it did.
//!
//! The rules are read in file order, numbered and lined as in the file,
//! and the root's keys in toml's order (by name, `rule` among them), so
//! the result is the whole read's: the tests read every text both ways
//! (and cut into chunks of one and of three rules) and compare.

use toml::de::DeTable;

use super::super::lex::{Lexer, Line};
use super::{Read, Reader};

/// Rules a chunk holds (and a file holds more of, to be read in chunks).
pub(super) const CHUNK: usize = 4096;

/// Where a text's `[[rule]]` runs are: each run's start and end, and the
/// start of every `[[rule]]` header in file order.
struct Runs {
    runs: Vec<(usize, usize)>,
    headers: Vec<usize>,
}

/// The runs of `text`; `None` when a header may name `rule` but is no
/// plain `[[rule]]`, or `lex.rs` does not read a line.
fn runs(text: &str) -> Option<Runs> {
    let mut out = Runs { runs: Vec::new(), headers: Vec::new() };
    let mut open: Option<usize> = None;
    let mut lx = Lexer::default();
    let mut at = 0;
    for l in text.split_inclusive('\n') {
        if let Line::Header(h) = lx.line(l)? {
            if h.is(true, "rule") && l.trim_start().starts_with("[[rule]]") {
                out.headers.push(at);
                open.get_or_insert(at);
            } else if h.may_be("rule") {
                return None;
            } else if let Some(s) = open.take() {
                out.runs.push((s, at));
            }
        }
        at += l.len();
    }
    if !lx.at_top() {
        return None;
    }
    if let Some(s) = open {
        out.runs.push((s, text.len()));
    }
    Some(out)
}

/// `text` read in chunks of at most `per` rules; `None` when it holds no
/// more than `per` rules, or is not laid out for it (see the module's
/// comment), or has a syntax error: then it is read whole.
pub(super) fn read(text: &str, per: usize) -> Option<Read> {
    let Runs { runs, headers } = runs(text)?;
    let headers = &headers[..];
    if headers.len() <= per {
        return None;
    }
    let mut skeleton = String::with_capacity(text.len() - runs.iter().map(|(s, e)| e - s).sum::<usize>());
    let mut from = 0;
    for &(s, e) in &runs {
        skeleton.push_str(&text[from..s]);
        let lines = text.as_bytes()[s..e].iter().filter(|b| **b == b'\n').count();
        skeleton.extend(std::iter::repeat_n('\n', lines));
        from = e;
    }
    skeleton.push_str(&text[from..]);
    let (root, errors) = DeTable::parse_recoverable(&skeleton);
    if !errors.is_empty() || root.get_ref().contains_key("rule") {
        return None;
    }
    let mut r = Reader::of(&skeleton, 0);
    let mut out = Read::default();
    let mut rules_read = false;
    for (key, value) in root.get_ref().iter() {
        if !rules_read && &**key.get_ref() > "rule" {
            rules_in_chunks(text, &runs, headers, per, &mut r, &mut out)?;
            rules_read = true;
        }
        r.root_entry(key, value, &[], &mut out);
    }
    if !rules_read {
        rules_in_chunks(text, &runs, headers, per, &mut r, &mut out)?;
    }
    out.problems = std::mem::take(&mut r.problems);
    out.headers = Some(headers.to_vec());
    Some(out)
}

/// A chunk of a run: its bytes `[from, to)`, the file's lines before it and
/// the rules before it.
struct Chunk {
    from: usize,
    to: usize,
    lines_before: usize,
    rules_before: usize,
}

/// What a chunk holds: its rules as read and their problems (`None`: it
/// does not parse alone without an error).
type ChunkRead = Option<(Vec<super::RuleRead>, Vec<super::Problem>)>;

/// Reads one chunk of `text`.
fn read_chunk(text: &str, c: &Chunk) -> ChunkRead {
    let chunk = &text[c.from..c.to];
    let (root, errors) = DeTable::parse_recoverable(chunk);
    if !errors.is_empty() {
        return None;
    }
    let value = root.get_ref().get("rule")?;
    let mut r = Reader::of(chunk, c.lines_before);
    let reads = r.rule_reads(value, &[], c.rules_before);
    Some((reads, r.problems))
}

/// The rules of every run, a chunk of at most `per` at a time, into `out`
/// (their problems into `r`'s); `None` at a chunk that does not parse.
/// One thread: a second one reading every other chunk took no CPU time
/// off, and its heap raised the start's peak RSS by ~45 MiB at 1 000 000
/// rules (1 028 against 985 MiB).
fn rules_in_chunks(
    text: &str,
    runs: &[(usize, usize)],
    headers: &[usize],
    per: usize,
    r: &mut Reader,
    out: &mut Read,
) -> Option<()> {
    let mut chunks = Vec::with_capacity(headers.len() / per + runs.len());
    let (mut done, mut line_at, mut lines_before) = (0, 0, 0);
    for &(s, e) in runs {
        let mine = &headers[headers.partition_point(|h| *h < s)..headers.partition_point(|h| *h < e)];
        for cut in mine.chunks(per) {
            let from = cut[0];
            let to = headers.get(done + cut.len()).copied().filter(|h| *h < e).unwrap_or(e);
            lines_before += text.as_bytes()[line_at..from].iter().filter(|b| **b == b'\n').count();
            line_at = from;
            chunks.push(Chunk { from, to, lines_before, rules_before: done });
            done += cut.len();
        }
    }
    for c in &chunks {
        let (reads, mut problems) = read_chunk(text, c)?;
        for read in reads {
            out.take_rule(read);
        }
        r.problems.append(&mut problems);
    }
    Some(())
}

/// The tests' check of every text read: read in chunks of one and of
/// three rules, it reads as `whole` does (when it is read in chunks).
/// The headers it found, if it was.
#[cfg(test)]
pub(super) fn check_same_as_whole(text: &str, whole: &Read) -> Option<Vec<usize>> {
    let rules = whole.config.rules.len();
    let sizes: &[usize] = if rules < 2_000 { &[3, 1] } else { &[CHUNK] };
    let mut headers = None;
    for &per in sizes {
        if let Some(c) = read(text, per) {
            assert_eq!(shown(&c), shown(whole), "read in chunks of {per}: {text:?}");
            headers = c.headers;
        }
    }
    headers
}

/// A read as text, for the comparison: what it holds, and the rules as
/// checked.
#[cfg(test)]
fn shown(r: &Read) -> String {
    let checked = r.checker.clone().map(|c| c.finish(&r.config.daemon));
    format!("{:?}\n{:?}\n{:?}\n{:?}\n{:?}", r.config, r.problems, r.crowdsec_line, r.set_origins, checked)
}

#[cfg(test)]
mod tests {
    use super::super::read_whole;
    use super::*;

    /// Texts a chunked read must read as the whole read does, or leave
    /// to it: strings holding headers, tables between runs, bad values,
    /// unknown keys, a rule twice, `rule` named otherwise, syntax errors.
    #[test]
    fn chunked_reads_are_whole_reads() {
        let rule = |i: u32| format!("[[rule]]\nprefix = \"10.0.{i}.0/24\"\nrate = \"{}pps\"\nburst = 5\n\n", 100 + i);
        let rules = |n: u32| (0..n).map(rule).collect::<String>();
        let texts = [
            rules(7),
            format!("# head\n[daemon]\nmode = \"native\"\n\n{}", rules(5)),
            format!(
                "{}[daemon]\nmode = \"skb\"\n{}[[set]]\nname = \"s\"\nfile = \"s.txt\"\n{}",
                rules(3),
                rules(4),
                rules(2)
            ),
            format!(
                "{}[[rule]]\nprefix = \"10.9.0.0/16\"\nrate = \"1kpps\"\nreason = \"\"\"\n[[rule]]\n[daemon]\n\"\"\"\n{}",
                rules(3),
                rules(3)
            ),
            format!("{}[[rule]]\nprefix = \"10.9.0.0/16\"\nrate = 5\ncolour = 1\n{}", rules(3), rules(3)),
            format!("{}{}", rules(4), rules(2)),
            format!("{}[rule.x]\na = 1\n{}", rules(3), rules(3)),
            format!("rule = 1\n{}", rules(4)),
            format!("{}[[rule]]\nprefix = \"10.9.0.0/16\"\nrate = \"1kpps\n{}", rules(3), rules(3)),
            format!("{}[crowdsec]\nurl = 5\n[zebra]\n{}", rules(3), rules(3)),
            format!("[aardvark]\n{}[[ rule ]]\nprefix = \"10.9.0.0/16\"\nrate = \"1kpps\"\n", rules(4)),
            format!("{}[[rule]]\nprefix = \"10.9.0.0/16\"\nrate = \"1kpps\"\nrate = \"2kpps\"\n{}", rules(3), rules(3)),
        ];
        let mut chunked = 0;
        for t in &texts {
            let whole = read_whole(t);
            for per in [1, 2, 3] {
                if let Some(c) = read(t, per) {
                    assert_eq!(shown(&c), shown(&whole), "in chunks of {per}: {t}");
                    chunked += 1;
                }
            }
        }
        // Most of them are read in chunks (the others are left whole).
        assert!(chunked >= 15, "{chunked}");
        // Not laid out for it, or a syntax error: left to the whole read.
        for t in [&texts[6], &texts[7], &texts[8], &texts[10], &texts[11]] {
            assert!(read(t, 1).is_none(), "{t}");
        }
    }
}
