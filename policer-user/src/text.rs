//! Text operators type or feed in, shown back to them: free text the
//! daemon keeps (a ban's reason) must read as it will be shown, and a
//! line quoted in an error must not flood the terminal or hide in it.

/// Characters that change how the text around them is shown without
/// being seen: bidi embeddings, overrides and isolates (U+202A–U+202E,
/// U+2066–U+2069) and marks (U+200E, U+200F, U+061C), which can make
/// `policer ban ls` show a reason, or what follows it, in another order
/// than it was written; line and paragraph separators (U+2028, U+2029),
/// which break a line without being a control character; and the byte
/// order mark / zero-width no-break space (U+FEFF).
pub fn invisible(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}' | '\u{200E}' | '\u{200F}' | '\u{061C}')
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{FEFF}')
}

/// What `c` is, for an error: "U+202E (a bidi override)".
fn describe(c: char) -> String {
    let what = match c {
        '\u{202A}' | '\u{202B}' => "a bidi embedding",
        '\u{202C}' => "a bidi pop",
        '\u{202D}' | '\u{202E}' => "a bidi override",
        '\u{2066}'..='\u{2069}' => "a bidi isolate",
        '\u{200E}' | '\u{200F}' | '\u{061C}' => "a bidi mark",
        '\u{2028}' => "a line separator",
        '\u{2029}' => "a paragraph separator",
        '\u{FEFF}' => "a byte order mark",
        _ => "a control character",
    };
    format!("U+{:04X} ({what})", c as u32)
}

/// Refuses text that would not show as it reads: control characters
/// (newlines, escapes, ...) and the [`invisible`] ones. `what` names the
/// text in the error ("the reason").
pub fn check_plain(what: &str, s: &str) -> std::result::Result<(), String> {
    match s.char_indices().find(|(_, c)| c.is_control() || invisible(*c)) {
        None => Ok(()),
        Some((at, c)) => Err(format!(
            "{what} has {} at character {}: it would not show as it reads; write it as plain text on one line",
            describe(c),
            s[..at].chars().count() + 1
        )),
    }
}

/// The most characters of a quoted line that an error shows.
pub const EXCERPT_CHARS: usize = 80;

/// `s` as an error quotes it: control and [`invisible`] characters
/// escaped (`\u{feff}`), and a long one cut to its first
/// [`EXCERPT_CHARS`] characters followed by `…(N bytes)`.
pub fn excerpt(s: &str) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == EXCERPT_CHARS {
            out.push_str(&format!("…({} bytes)", s.len()));
            break;
        }
        escape_into(&mut out, c);
    }
    out
}

/// The first `shown` of `items` joined by commas, then how many more
/// (`a, b, and 3 more`): a list in a message that stays one line.
pub fn first_few(items: impl ExactSizeIterator<Item = String>, shown: usize) -> String {
    let n = items.len();
    let mut s: Vec<String> = items.take(shown).collect();
    if n > shown {
        s.push(format!("and {} more", n - shown));
    }
    s.join(", ")
}

/// `s` with control and [`invisible`] characters escaped, whole: one log
/// line that reads as it is (no text can start a line of its own).
pub fn escaped(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    s.chars().for_each(|c| escape_into(&mut out, c));
    out
}

fn escape_into(out: &mut String, c: char) {
    if c.is_control() || invisible(c) {
        out.extend(c.escape_unicode());
    } else {
        out.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_few_then_how_many_more() {
        let v = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        assert_eq!(first_few(v(0).into_iter(), 2), "");
        assert_eq!(first_few(v(2).into_iter(), 2), "0, 1");
        assert_eq!(first_few(v(5).into_iter(), 2), "0, 1, and 3 more");
    }

    #[test]
    fn plain_text_passes_and_tricks_are_named() {
        check_plain("the reason", "scanner from AS64500 — ticket #42, 日本語, عربى").unwrap();
        check_plain("the reason", "").unwrap();
        for (s, want) in [
            ("abc\u{202E}gnp.exe", "U+202E (a bidi override) at character 4"),
            ("x\u{2028}y", "U+2028 (a line separator) at character 2"),
            ("\u{2029}", "U+2029 (a paragraph separator) at character 1"),
            ("a\u{2066}b\u{2069}", "U+2066 (a bidi isolate) at character 2"),
            ("a\u{202A}", "U+202A (a bidi embedding)"),
            ("two\nlines", "U+000A (a control character) at character 4"),
            ("\u{1b}[31mred", "U+001B (a control character) at character 1"),
            ("\u{200F}", "U+200F (a bidi mark)"),
            ("\u{feff}x", "U+FEFF (a byte order mark)"),
        ] {
            let e = check_plain("the reason", s).unwrap_err();
            assert!(e.starts_with("the reason has ") && e.contains(want), "{s:?}: {e}");
        }
    }

    #[test]
    fn excerpts_are_short_and_visible() {
        assert_eq!(excerpt("10.0.0.300"), "10.0.0.300");
        assert_eq!(excerpt("\u{feff}10.0.0.1"), "\\u{feff}10.0.0.1");
        assert_eq!(excerpt("a\u{1b}b"), "a\\u{1b}b");
        let long = "x".repeat(10 << 20);
        let e = excerpt(&long);
        assert_eq!(e, format!("{}…(10485760 bytes)", "x".repeat(80)));
        assert_eq!(excerpt(&"é".repeat(81)), format!("{}…(162 bytes)", "é".repeat(80)));
        assert_eq!(excerpt(&"é".repeat(80)), "é".repeat(80));
    }
}
