//! No top-level module of a crate uses a module that uses it (issue 27):
//! a cycle is what let `classes` and `rules` grow into each other, and
//! what keeps a reader from understanding one without the other.
//!
//! The check reads the sources, not the compiler's view: every path that
//! starts at `crate`, `super` or `self` (in `use` lines and in code) is
//! resolved to the top-level module it names, through the crate root's
//! `pub use` re-exports. Comments and string literals are skipped. Paths
//! through other crates do not count.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

/// An edge: `from` uses `to`, first seen at `at` (file:line).
type Edges = BTreeMap<(String, String), String>;

/// The source with comments, string and char literals blanked (newlines
/// kept, so line numbers hold).
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, b[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_char(prev(&b, i)) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < b.len() && !(b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#'))) {
                blank(&mut out, b[j]);
                j += 1;
            }
            i = j + 1 + hashes;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                if let Some(&c) = b.get(i) {
                    blank(&mut out, c);
                }
                i += 1;
            }
            i += 1;
        } else if c == '\'' && (b.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A char literal ('x', '\n', '\''); a lifetime has no closing quote.
            i += 2;
            while i < b.len() && b[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev(b: &[char], i: usize) -> char {
    if i == 0 { ' ' } else { b[i - 1] }
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Tokens: identifiers, `::`, and single punctuation; with their line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let b: Vec<char> = code.chars().collect();
    let (mut out, mut i, mut line) = (Vec::new(), 0, 1);
    while i < b.len() {
        let c = b[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if ident_char(c) {
            let s = i;
            while i < b.len() && ident_char(b[i]) {
                i += 1;
            }
            out.push((b[s..i].iter().collect(), line));
        } else if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(("::".into(), line));
            i += 2;
        } else {
            out.push((c.to_string(), line));
            i += 1;
        }
    }
    out
}

/// A crate's sources: (module path, file).
fn files(src: &Path) -> Vec<(Vec<String>, PathBuf)> {
    let mut out = Vec::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(src).expect("under src").with_extension("");
                let mut m: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
                if m.last().is_some_and(|l| l == "mod") {
                    m.pop();
                }
                if m == ["lib"] || m == ["main"] {
                    m.clear();
                }
                out.push((m, p));
            }
        }
    }
    out.sort();
    out
}

/// The crate root's modules and what its `pub use` lines re-export: a name
/// at the root and the module it comes from. A glob (`pub use maps::*`)
/// re-exports the `pub` items of that module's file.
fn root(src: &Path) -> (BTreeSet<String>, BTreeMap<String, String>) {
    let lib = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let t = tokens(&code_only(&lib));
    let word = |i: usize| t.get(i).map_or("", |(s, _)| s.as_str());
    let (mut mods, mut names) = (BTreeSet::new(), BTreeMap::new());
    for i in 0..t.len() {
        if word(i) == "mod" && word(i + 2) == ";" {
            mods.insert(word(i + 1).to_string());
        }
    }
    for i in 0..t.len() {
        if !(word(i) == "pub" && word(i + 1) == "use" && mods.contains(word(i + 2)) && word(i + 3) == "::") {
            continue;
        }
        let m = word(i + 2).to_string();
        // Each item ends at `,`, `}` or `;`; its name is its last word
        // (`a::B` gives `B`, `B as C` gives `C`).
        let mut last: Option<&str> = None;
        for j in i + 4..t.len() {
            match word(j) {
                "*" => {
                    let file = [src.join(format!("{m}.rs")), src.join(&m).join("mod.rs")]
                        .into_iter()
                        .find(|p| p.exists())
                        .expect("the glob's module file");
                    let ft = tokens(&code_only(&fs::read_to_string(file).expect("module file")));
                    let item = ["const", "static", "struct", "enum", "union", "fn", "type", "trait", "mod"];
                    for w in ft.windows(3) {
                        if w[0].0 == "pub" && item.contains(&w[1].0.as_str()) {
                            names.insert(w[2].0.clone(), m.clone());
                        }
                    }
                }
                "," | "}" | ";" => {
                    if let Some(n) = last.take().filter(|n| *n != "self") {
                        names.insert(n.to_string(), m.clone());
                    }
                }
                w if w.starts_with(|c: char| c.is_alphabetic() || c == '_') && w != "as" => last = Some(w),
                _ => {}
            }
            if word(j) == ";" {
                break;
            }
        }
    }
    (mods, names)
}

/// Which top-level module uses which, with where.
fn edges(src: &Path) -> Edges {
    let (mods, reexported) = root(src);
    let top_of = |name: &str| -> Option<String> {
        if mods.contains(name) { Some(name.to_string()) } else { reexported.get(name).cloned() }
    };
    let mut out = Edges::new();
    for (file_mod, path) in files(src) {
        let Some(from) = file_mod.first().cloned() else { continue };
        let t = tokens(&code_only(&fs::read_to_string(&path).expect("source")));
        let word = |i: usize| t.get(i).map_or("", |(s, _)| s.as_str());
        // Inline modules (`mod tests { ... }`) change what `super` means.
        let mut inline: Vec<(String, i32)> = Vec::new();
        let mut depth = 0;
        let mut i = 0;
        while i < t.len() {
            match word(i) {
                "{" => depth += 1,
                "}" => {
                    depth -= 1;
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                }
                "mod" if word(i + 2) == "{" => inline.push((word(i + 1).to_string(), depth)),
                _ => {}
            }
            let w = word(i);
            let starts =
                matches!(w, "crate" | "super" | "self") && word(i + 1) == "::" && word(i.wrapping_sub(1)) != "::";
            if !starts || (i > 0 && word(i - 1) == "$") {
                i += 1;
                continue;
            }
            let mut at: Vec<String> = file_mod.clone();
            at.extend(inline.iter().map(|(n, _)| n.clone()));
            let mut j = i;
            // Leading crate/super/self segments.
            loop {
                match word(j) {
                    "crate" => at.clear(),
                    "super" => {
                        at.pop();
                    }
                    "self" => {}
                    _ => break,
                }
                if word(j + 1) != "::" {
                    break;
                }
                j += 2;
            }
            let mut named: Vec<String> = Vec::new();
            if let Some(first) = at.first() {
                named.push(first.clone());
            } else if word(j) == "{" {
                // crate::{a, b::c, d as e}: the first word of each item.
                let mut d = 0;
                let mut expect_item = true;
                while j < t.len() {
                    match word(j) {
                        "{" => {
                            d += 1;
                            expect_item = d == 1;
                        }
                        "}" => {
                            d -= 1;
                            if d == 0 {
                                break;
                            }
                        }
                        "," if d == 1 => expect_item = true,
                        w if expect_item && d == 1 => {
                            named.extend(top_of(w));
                            expect_item = false;
                        }
                        _ => {}
                    }
                    j += 1;
                }
            } else {
                named.extend(top_of(word(j)));
            }
            for to in named {
                if to != from {
                    let line = t[i].1;
                    let rel = path.strip_prefix(src).unwrap_or(&path).display().to_string();
                    out.entry((from.clone(), to)).or_insert_with(|| format!("{rel}:{line}"));
                }
            }
            i += 1;
        }
    }
    out
}

/// Every pair of top-level modules that reach each other, with the first
/// use each way (a pair is enough to show a cycle of any length: each
/// module of a longer cycle reaches the others).
fn cycles(src: &Path) -> Vec<String> {
    let e = edges(src);
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (a, b) in e.keys() {
        next.entry(a).or_default().insert(b);
    }
    let reach = |a: &str| -> BTreeSet<&str> {
        let (mut seen, mut todo) = (BTreeSet::new(), vec![a]);
        while let Some(x) = todo.pop() {
            for y in next.get(x).into_iter().flatten() {
                if seen.insert(*y) {
                    todo.push(y);
                }
            }
        }
        seen
    };
    let mut out = Vec::new();
    for a in next.keys() {
        let ra = reach(a);
        for b in ra.iter().filter(|b| *a < **b) {
            if reach(b).contains(a) {
                let via = |x: &str, y: &str| {
                    e.get(&(x.to_string(), y.to_string())).map_or_else(|| "through others".into(), |s| s.clone())
                };
                out.push(format!("{a} -> {b} ({}), {b} -> {a} ({})", via(a, b), via(b, a)));
            }
        }
    }
    out
}

fn crate_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name).join("src")
}

#[test]
fn no_top_level_module_of_policer_user_uses_one_that_uses_it() {
    let c = cycles(&crate_src("policer-user"));
    assert!(c.is_empty(), "top-level module cycles in policer-user:\n{}", c.join("\n"));
}

#[test]
fn the_check_finds_a_cycle_through_braces_super_and_reexports() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    let w = |p: &str, s: &str| {
        let p = src.join(p);
        fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        fs::write(p, s).expect("write");
    };
    w("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub use c::{Thing as Other, Item};\n");
    w("a.rs", "//! crate::c in a comment\nuse crate::{b::X, Other};\nconst S: &str = \"crate::c\";\n");
    w("b/mod.rs", "mod inner;\n");
    w("b/inner.rs", "fn f() { let _ = super::super::Item; }\n");
    w("c.rs", "pub struct Thing; pub struct Item;\nmod tests { use super::*; }\n");
    let e = edges(src);
    let pairs: Vec<(&str, &str)> = e.keys().map(|(a, b)| (a.as_str(), b.as_str())).collect();
    assert_eq!(pairs, [("a", "b"), ("a", "c"), ("b", "c")], "comments and strings do not count");
    assert!(cycles(src).is_empty());
    w("c.rs", "pub struct Thing; pub struct Item;\nmod tests { fn t() { crate::a::f(); } }\n");
    let c = cycles(src);
    assert_eq!(c.len(), 3, "a, b and c all reach each other: {c:?}");
    assert_eq!(c[1], "a -> c (a.rs:2), c -> a (c.rs:2)");
}

/// policer-common's modules form layers (its crate doc lists them): none
/// uses one that uses it either.
#[test]
fn no_top_level_module_of_policer_common_uses_one_that_uses_it() {
    let c = cycles(&crate_src("policer-common"));
    assert!(c.is_empty(), "top-level module cycles in policer-common:\n{}", c.join("\n"));
}
