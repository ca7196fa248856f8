//! What the docs point to exists (issue 43, point 15): every README
//! section, docs file, heading and man page that the README, docs/*.md,
//! CONTRIBUTING.md, BENCHMARKS.md, the files under deploy/, the header
//! of the config file the daemon writes and the man pages name.
//!
//! A reference is one of:
//! - `README, "Section"` (also `README: "…"`, `README's "…"`, `**README**
//!   "…"`, with the section in quotes or backquotes): a heading of
//!   README.md;
//! - `FILE.md, "Section"` or `[…](FILE.md), "Section"`: a heading of
//!   that file;
//! - `see "Section"`, `"Section" below` / `above` in a markdown file: a
//!   heading of that file;
//! - `docs/NAME.md`, and the target of a markdown link (`[…](PATH)`,
//!   `[…](PATH#anchor)`): a file that exists (and a heading with that
//!   anchor);
//! - `policer…(N)`: a man page `policer man` writes.
//!
//! A section is named by its heading, or by the heading's words before a
//! colon ("Serving" for "Serving: no client stalls the daemon").

use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace").to_path_buf()
}

/// A text the references are read from: where it is (relative to the
/// workspace), and its words with line breaks and comment marks made
/// spaces (a reference may run over two lines of a comment).
struct Text {
    path: PathBuf,
    flat: String,
}

fn flat(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let l = line.trim_start();
        let l = l.trim_start_matches("//").trim_start_matches('#').trim_start();
        // A markdown heading stays a heading: only comment marks of code
        // and config lines are dropped (the words are what is read).
        out.push_str(l);
        out.push(' ');
    }
    out
}

/// The headings of a markdown text, outside its code blocks, without
/// their markup.
fn headings(md: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let t = line.trim_start_matches('#');
        if t.len() < line.len() && t.starts_with(' ') {
            out.push(t.trim().replace(['`', '*'], ""));
        }
    }
    out
}

/// GitHub's anchor of a heading.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn names_a_heading(headings: &[String], section: &str) -> bool {
    headings.iter().any(|h| h == section || h.split_once(": ").is_some_and(|(short, _)| short == section))
}

/// The quoted words at the start of `rest` (after spaces, a comma or a
/// colon): `"Section"`, or with `code`, `` `Section` `` too.
fn quoted(rest: &str, code: bool) -> Option<&str> {
    let rest = rest.trim_start_matches("**").trim_start_matches("'s");
    let rest = rest.trim_start_matches([',', ':']).trim_start();
    let close = match rest.chars().next()? {
        '"' => '"',
        '`' if code => '`',
        _ => return None,
    };
    let inner = &rest[1..];
    let end = inner.find(close)?;
    Some(&inner[..end]).filter(|s| s.len() < 80)
}

/// The references of `text`: how many, each that names nothing said into
/// `dangling`.
fn check(text: &Text, pages: &[String], dangling: &mut Vec<String>) -> usize {
    let ws = workspace();
    let here = ws.join(&text.path);
    let dir = here.parent().expect("a directory").to_path_buf();
    let md_headings = |p: &Path| std::fs::read_to_string(p).ok().map(|t| headings(&t));
    let own = if text.path.extension().is_some_and(|e| e == "md") { md_headings(&here) } else { None };
    let f = &text.flat;
    let mut found = 0;
    let mut say = |what: String| dangling.push(format!("{}: {what}", text.path.display()));
    // README sections.
    for (i, _) in f.match_indices("README") {
        if let Some(section) = quoted(&f[i + "README".len()..], true) {
            found += 1;
            let readme = md_headings(&ws.join("README.md")).unwrap_or_default();
            if !names_a_heading(&readme, section) {
                say(format!("README, \"{section}\": no such section"));
            }
        }
    }
    // Files: docs/NAME.md as words, and markdown link targets.
    let mut files: Vec<(PathBuf, Option<String>, usize)> = Vec::new();
    for (i, _) in f.match_indices("docs/") {
        // A link's target is read below; a path that only ends in docs/
        // is not the workspace's.
        let before = f[..i].chars().next_back();
        if f[..i].ends_with("](") || before.is_some_and(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '-' | '_')) {
            continue;
        }
        let name: String =
            f[i..].chars().take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '-' | '_')).collect();
        let name = name.trim_end_matches('.');
        if name.ends_with(".md") {
            files.push((ws.join(name), None, i + name.len()));
        }
    }
    for (i, _) in f.match_indices("](") {
        let target: String = f[i + 2..].chars().take_while(|c| *c != ')').collect();
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, frag) = match target.split_once('#') {
            Some((p, a)) => (p.to_string(), Some(a.to_string())),
            None => (target.clone(), None),
        };
        let path = if path.is_empty() { here.clone() } else { dir.join(&path) };
        files.push((path, frag, i + 2 + target.len() + 1));
    }
    for (path, frag, end) in files {
        found += 1;
        let shown = path.strip_prefix(&ws).unwrap_or(&path).display().to_string();
        if !path.exists() {
            say(format!("{shown}: no such file"));
            continue;
        }
        let hs = if path.extension().is_some_and(|e| e == "md") { md_headings(&path) } else { None };
        if let (Some(a), Some(hs)) = (&frag, &hs)
            && !hs.iter().any(|h| anchor(h) == *a)
        {
            say(format!("{shown}#{a}: no such heading"));
        }
        // `FILE.md, "Section"` (the name may be code: `` `FILE.md`, "…" ``).
        let after = f[end.min(f.len())..].strip_prefix('`').unwrap_or(&f[end.min(f.len())..]);
        if let (Some(section), Some(hs)) = (quoted(after, false), &hs)
            && !names_a_heading(hs, section)
        {
            say(format!("{shown}, \"{section}\": no such section"));
        }
    }
    // This file's own sections.
    if let Some(hs) = &own {
        let mut sections: Vec<&str> = Vec::new();
        for (i, _) in f.match_indices("see \"") {
            sections.extend(quoted(&f[i + 4..], false));
        }
        for (i, _) in f.match_indices('"') {
            let rest = &f[i + 1..];
            let Some(end) = rest.find('"') else { continue };
            if [" below", " above"].iter().any(|w| rest[end + 1..].starts_with(w)) {
                sections.push(&rest[..end]);
            }
        }
        for s in sections {
            found += 1;
            if !names_a_heading(hs, s) {
                say(format!("\"{s}\": no such section here"));
            }
        }
    }
    // Man pages.
    for (i, _) in f.match_indices("policer") {
        let name: String = f[i..].chars().take_while(|c| c.is_ascii_lowercase() || matches!(c, '-' | '.')).collect();
        let rest = &f[i + name.len()..];
        let Some(sec) = rest.strip_prefix('(').and_then(|r| r.chars().next()).filter(char::is_ascii_digit) else {
            continue;
        };
        if !rest[2..].starts_with(')') {
            continue;
        }
        found += 1;
        let page = format!("{name}.{sec}");
        if !pages.contains(&page) {
            say(format!("{name}({sec}): no such man page"));
        }
    }
    found
}

/// The texts: the markdown files, deploy/'s, the written config's header
/// and the man pages (`man_dir`: where `policer man` wrote them).
fn texts(man_dir: &Path) -> Vec<Text> {
    let ws = workspace();
    let mut paths: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "BENCHMARKS.md"].iter().map(PathBuf::from).collect();
    let mut dirs = vec![ws.join("docs"), ws.join("deploy")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if std::fs::read_to_string(&p).is_ok() {
                paths.push(p.strip_prefix(&ws).unwrap().to_path_buf());
            }
        }
    }
    paths.sort();
    let mut out: Vec<Text> = paths
        .into_iter()
        .map(|p| {
            let t = std::fs::read_to_string(ws.join(&p)).unwrap();
            Text { flat: flat(&t), path: p }
        })
        .collect();
    // The header of a config the daemon writes: as if it were the
    // example's (its place: deploy/policer.toml's).
    out.push(Text { path: PathBuf::from("deploy/policer.toml"), flat: flat(crate::config::HEADER) });
    for e in std::fs::read_dir(man_dir).unwrap() {
        let p = e.unwrap().path();
        let roff = std::fs::read_to_string(&p).unwrap();
        let plain = roff.replace("\\-", "-").replace("\\fB", "").replace("\\fI", "").replace("\\fR", "");
        out.push(Text { path: PathBuf::from("man").join(p.file_name().unwrap()), flat: flat(&plain) });
    }
    out
}

/// Issue 43, point 15: no reference of the docs dangles.
#[test]
fn every_reference_names_what_exists() {
    let man = tempfile::tempdir().unwrap();
    let pages: Vec<String> = super::docs::write_all(man.path())
        .unwrap()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut dangling = Vec::new();
    let mut found = 0;
    for t in texts(man.path()) {
        found += check(&t, &pages, &mut dangling);
    }
    assert!(dangling.is_empty(), "references to what does not exist:\n{}", dangling.join("\n"));
    // It reads them: the README names its docs, the docs name sections.
    assert!(found > 200, "only {found} references read");
}

/// The reader of references finds each kind, and what is not there.
#[test]
fn dangling_references_are_found() {
    let pages = vec!["policer.8".to_string(), "policer.toml.5".to_string()];
    let t = |path: &str, text: &str| Text { path: PathBuf::from(path), flat: flat(text) };
    let cases = [
        t("docs/json.md", "see README,\n\"Config file\""),
        t("docs/json.md", "// see README, \"Table pressure\""),
        t("docs/x.md", "the **README** `Nothing`"),
        t("docs/json.md", "([daemon.md](daemon.md), \"Serving under pressure\")"),
        t("docs/json.md", "docs/design.md, \"Nope\""),
        t("docs/json.md", "see \"Not here\""),
        t("docs/json.md", "(\"Not here\" below)"),
        t("README.md", "[x](docs/none.md)"),
        t("README.md", "[x](#no-such-heading)"),
        t("README.md", "see docs/none.md."),
        t("deploy/policer.toml", "# policer-nothing(8)"),
        t("deploy/policer.toml", "# policer.conf(5)"),
    ];
    for c in &cases {
        let mut dangling = Vec::new();
        assert_eq!(check(c, &pages, &mut dangling), 1, "{}", c.flat);
        assert_eq!(dangling.len(), 1, "{}: {dangling:?}", c.flat);
    }
    let good = [
        t("docs/json.md", "the README, \"Service and config file\"; README, \"Lifecycle\""),
        t("docs/json.md", "([daemon.md](daemon.md), \"Serving under load\")"),
        t("docs/design.md", "see \"Table pressure: the recall\""),
        t("README.md", "[k](#kubernetes), docs/json.md, policer.toml(5), policer(8)"),
    ];
    for c in &good {
        let mut dangling = Vec::new();
        assert!(check(c, &pages, &mut dangling) > 0, "{}", c.flat);
        assert!(dangling.is_empty(), "{}: {dangling:?}", c.flat);
    }
}
