//! BENCHMARKS.md readable in two minutes: the benchmark and the soak write
//! their full explanations (the method of each experiment, the analysis of
//! each target not met, with this run's numbers), and before the file is
//! written every prose paragraph longer than [`SHORT`] characters is cut to
//! its leading sentences, with a link; the whole paragraph goes to the
//! generated section of docs/performance.md, under the heading it was
//! under ([`with_notes`]). Tables, headings, code and images stay as they
//! are.

/// The longest paragraph BENCHMARKS.md keeps whole.
pub const SHORT: usize = 600;
/// What a cut paragraph keeps: whole sentences up to about this many
/// characters (at least one).
const KEEP: usize = 320;

/// Where docs/performance.md's generated section starts and ends.
pub const NOTES_BEGIN: &str =
    "<!-- bench-notes:begin (written by `cargo xtask bench` and `cargo xtask soak`; do not edit) -->";
pub const NOTES_END: &str = "<!-- bench-notes:end -->";
/// The anchor of that section's heading.
pub const NOTES_ANCHOR: &str = "docs/performance.md#the-last-runs-explanations-in-full";

/// A paragraph moved out whole: the heading it was under, and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    pub heading: String,
    pub text: String,
}

/// Whether a paragraph is prose (not a table, heading, code, image, quote
/// or marker).
fn prose(p: &str) -> bool {
    let t = p.trim_start();
    !(t.starts_with('|')
        || t.starts_with('#')
        || t.starts_with("```")
        || t.starts_with('>')
        || t.starts_with("![")
        || t.starts_with("<!--"))
}

/// The leading sentences of `text`: whole sentences while they fit in
/// [`KEEP`] characters (at least the first). A sentence ends at ". ",
/// "; " is not an end; decimals (`1.8×`) have no space after the point.
fn lead(text: &str) -> &str {
    let mut end = 0;
    let b = text.as_bytes();
    for i in 0..b.len().saturating_sub(2) {
        if b[i] == b'.' && b[i + 1] == b' ' && (b[i + 2].is_ascii_uppercase() || b"(`*".contains(&b[i + 2])) {
            let cut = i + 1;
            if end == 0 || cut <= KEEP {
                end = cut;
            }
            if cut > KEEP {
                break;
            }
        }
    }
    if end == 0 || end >= text.len() { text } else { &text[..end] }
}

/// `md` with every long prose paragraph cut ([`lead`] and a link), and the
/// paragraphs cut, whole, in order.
pub fn split_long(md: &str) -> (String, Vec<Note>) {
    let mut out = Vec::new();
    let mut notes = Vec::new();
    let mut heading = String::new();
    let mut in_code = false;
    for para in md.split("\n\n") {
        let first = para.lines().next().unwrap_or("");
        if let Some(h) = para.lines().rev().find(|l| l.starts_with('#')) {
            heading = h.trim_start_matches('#').trim().to_string();
        }
        // A code block may hold blank lines: its paragraphs stay.
        let fences = para.matches("```").count();
        let code = in_code || first.trim_start().starts_with("```");
        if fences % 2 == 1 {
            in_code = !in_code;
        }
        if code || !prose(para) || para.len() <= SHORT {
            out.push(para.to_string());
            continue;
        }
        // A list item keeps its lead-in (`- **target** — `).
        let (head, body) = match para.find(" — ") {
            Some(i) if para.starts_with("- ") => para.split_at(i + " — ".len()),
            _ => ("", para),
        };
        let kept = lead(body).trim_end();
        if kept.len() >= body.trim_end().len() {
            out.push(para.to_string());
            continue;
        }
        let more = if heading.is_empty() { String::new() } else { format!(" ({heading})") };
        out.push(format!("{head}{kept} [In full{more}]({NOTES_ANCHOR})."));
        notes.push(Note { heading: heading.clone(), text: para.trim_end().to_string() });
    }
    (out.join("\n\n"), notes)
}

/// docs/performance.md (`doc`) with its generated section holding `notes`
/// (replaced, or appended when it has none); the rest is left as it is.
/// `from` names the run.
pub fn with_notes(doc: &str, notes: &[Note], from: &str) -> String {
    let mut section = format!(
        "{NOTES_BEGIN}\n## The last run's explanations in full\n\nThe paragraphs BENCHMARKS.md shortens, whole, as {from} \
         wrote them, under the heading each was under.\n"
    );
    let mut last = "";
    for n in notes {
        if n.heading != last {
            section.push_str(&format!("\n### {}\n", n.heading));
            last = &n.heading;
        }
        section.push_str(&format!("\n{}\n", n.text));
    }
    section.push_str(&format!("\n{NOTES_END}\n"));
    match (doc.find(NOTES_BEGIN), doc.find(NOTES_END)) {
        (Some(a), Some(b)) if b > a => {
            let end = b + NOTES_END.len();
            let end = if doc[end..].starts_with('\n') { end + 1 } else { end };
            format!("{}{section}{}", &doc[..a], &doc[end..])
        }
        _ => {
            let sep = if doc.ends_with("\n\n") || doc.is_empty() {
                ""
            } else if doc.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{doc}{sep}{section}")
        }
    }
}

/// The notes of the section under `heading` prefix kept by another writer:
/// the soak and the benchmark each write their own notes and keep the
/// other's (`keep(old_notes)` says which to keep).
pub fn notes_in(doc: &str) -> Vec<Note> {
    let (Some(a), Some(b)) = (doc.find(NOTES_BEGIN), doc.find(NOTES_END)) else { return Vec::new() };
    if b <= a {
        return Vec::new();
    }
    let mut notes = Vec::new();
    let mut heading = String::new();
    for para in doc[a..b].split("\n\n").skip(1) {
        let para = para.trim();
        if let Some(h) = para.strip_prefix("### ") {
            heading = h.to_string();
            continue;
        }
        if para.is_empty() || para.starts_with("<!--") || para.starts_with("The paragraphs BENCHMARKS.md") {
            continue;
        }
        notes.push(Note { heading: heading.clone(), text: para.to_string() });
    }
    notes
}

/// The headings of `md`, without their `#`s.
pub fn headings(md: &str) -> Vec<String> {
    md.lines().filter(|l| l.starts_with('#')).map(|l| l.trim_start_matches('#').trim().to_string()).collect()
}

/// Writes `report` (the shortened BENCHMARKS.md) and the generated section
/// of `analysis` (docs/performance.md): `notes` are this writer's, and the
/// notes already there under headings `others` holds (the other writer's
/// part of the report) are kept before them. `from` names the run.
pub fn publish(
    report: &std::path::Path,
    md: &str,
    analysis: &std::path::Path,
    notes: Vec<Note>,
    others: &[String],
    from: &str,
) -> std::io::Result<()> {
    let old = std::fs::read_to_string(analysis).unwrap_or_default();
    let mut all: Vec<Note> = notes_in(&old).into_iter().filter(|n| others.contains(&n.heading)).collect();
    all.extend(notes);
    // In the report's order.
    let order = headings(md);
    all.sort_by_key(|n| order.iter().position(|h| *h == n.heading).unwrap_or(usize::MAX));
    std::fs::write(analysis, with_notes(&old, &all, from))?;
    std::fs::write(report, md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn long(n: usize) -> String {
        (0..n).map(|i| format!("Sentence {i} says 1.8× of 65 536 sources.")).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn long_prose_is_cut_to_its_lead_and_kept_whole_in_the_notes() {
        let body = long(30);
        let md = format!("# B\n\n## Targets\n\n| a | b |\n|---|---|\n\n{body}\n\nshort one.\n\n```\n{body}\n```\n");
        let (out, notes) = split_long(&md);
        assert_eq!(notes.len(), 1);
        assert_eq!(notes[0], Note { heading: "Targets".into(), text: body.clone() });
        let cut = out.split("\n\n").find(|p| p.starts_with("Sentence 0")).unwrap();
        assert!(cut.len() < SHORT && cut.contains(NOTES_ANCHOR) && cut.contains("1.8×"), "{cut}");
        assert!(out.contains("| a | b |") && out.contains("short one.") && out.contains(&format!("```\n{body}\n```")));
        // Every paragraph of the result is short, but code and tables.
        for p in out.split("\n\n").filter(|p| prose(p) && !p.starts_with("```") && !p.starts_with("Sentence 0 says")) {
            assert!(p.len() <= SHORT, "{p}");
        }
    }

    #[test]
    fn a_list_item_keeps_its_lead_in() {
        let md = format!("## Targets\n\n- **drop path ≤ 1.8×** — {}", long(30));
        let (out, notes) = split_long(&md);
        assert!(out.contains("- **drop path ≤ 1.8×** — Sentence 0 says"), "{out}");
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn the_notes_section_is_replaced_and_the_rest_of_the_doc_kept() {
        let n = vec![Note { heading: "Targets".into(), text: "Whole.".into() }];
        let doc = with_notes("# Perf\n\nhand-written\n", &n, "the run of x");
        assert!(doc.starts_with("# Perf\n\nhand-written\n\n<!-- bench-notes:begin"), "{doc}");
        assert_eq!(notes_in(&doc), n);
        let again = with_notes(&format!("{doc}\nafter\n"), &[], "the run of y");
        assert!(again.contains("hand-written") && again.contains("after") && !again.contains("Whole."), "{again}");
        assert_eq!(again.matches(NOTES_BEGIN).count(), 1);
    }
}
