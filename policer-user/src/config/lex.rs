//! What each line of a TOML text is at the top level of the document, read
//! with its strings: a line inside a multi-line string (`"""`, `'''`) or a
//! value spread over lines (an array) is no table header, comment or blank
//! line, whatever it starts with, and a header or key written with escapes
//! (`[["ru\u006ce"]]`, `"d\u0061emon" = {}`) is told apart from a plain one.
//!
//! This is what `splice.rs` finds tables with: it reads every byte that can
//! open or close a string or a value (`"`, `'`, `\`, `#`, brackets), so a
//! line it calls a header starts outside every string and value. It is not
//! a TOML parser: it assumes text that parses (`Config::parse` read it, or
//! a piece is parsed alone besides), and gives up (`None`) on what it does
//! not read as such, which makes its callers leave the change to the
//! whole-document edit.

/// What a line is, read from the state at its start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Line<'a> {
    /// Whitespace only, outside every string and value.
    Blank,
    /// A comment only, outside every string and value.
    Comment,
    /// A table header, `[a.b]` or `[[a.b]]`.
    Header(TableHeader<'a>),
    /// A `key = value` line at the top level: its key's first part
    /// (`None`: a quoted part with escapes, not decoded here).
    Key(Option<&'a str>),
    /// A line that starts inside a multi-line string or a value spread
    /// over lines: content, whatever it looks like.
    Inside,
}

/// A table header's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct TableHeader<'a> {
    /// `[[...]]`: an element of an array of tables.
    pub array: bool,
    /// The dotted key's first part, unquoted; `None` when a part is a
    /// quoted key with escapes (not decoded here: it may spell any name).
    pub first: Option<&'a str>,
    /// How many parts the key has.
    pub parts: usize,
}

impl TableHeader<'_> {
    /// Whether it is exactly the plain header of the table `name`
    /// (`[name]`, or `[[name]]` if `array`; quoted without escapes, spaces
    /// and a comment allowed).
    pub fn is(&self, array: bool, name: &str) -> bool {
        self.array == array && self.parts == 1 && self.first == Some(name)
    }

    /// Whether it may name the table `name` or one under it.
    pub fn may_be(&self, name: &str) -> bool {
        self.first.is_none_or(|f| f == name)
    }
}

/// The state between lines: open value brackets, and the multi-line string
/// being read (by its quote).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Lexer {
    depth: u32,
    string: Option<u8>,
}

impl Lexer {
    /// Whether the next line starts outside every string and value.
    pub fn at_top(&self) -> bool {
        self.depth == 0 && self.string.is_none()
    }

    /// What `line` (one line, with its newline if it has one) is, and the
    /// state moved past it; `None`: not a line of TOML as this reads it.
    pub fn line<'a>(&mut self, line: &'a str) -> Option<Line<'a>> {
        if !self.at_top() {
            self.scan(line.as_bytes(), 0)?;
            return Some(Line::Inside);
        }
        let t = line.trim_start_matches([' ', '\t']);
        let start = line.len() - t.len();
        if t.trim_end_matches(['\n', '\r', ' ', '\t']).is_empty() {
            return Some(Line::Blank);
        }
        if t.starts_with('#') {
            return Some(Line::Comment);
        }
        if t.starts_with('[') {
            // A header opens nothing that goes on past its line.
            return header(t).map(Line::Header);
        }
        let (first, _) = key_part(line, start)?;
        self.scan(line.as_bytes(), start)?;
        Some(Line::Key(first))
    }

    /// Moves past the bytes of one line from `i`.
    fn scan(&mut self, b: &[u8], mut i: usize) -> Option<()> {
        while i < b.len() {
            // Bytes that open, close or escape nothing, passed in one go.
            if let Some(n) = b[i..].iter().position(|c| SPECIAL[*c as usize]) {
                i += n;
            } else {
                return Some(());
            }
            if let Some(q) = self.string {
                match b[i] {
                    b'\\' if q == b'"' => i += 2,
                    c if c == q && b[i..].starts_with(&[q, q, q]) => {
                        // Up to two quotes more are the string's own.
                        let run = b[i..].iter().take_while(|&&c| c == q).count();
                        if run > 5 {
                            return None;
                        }
                        i += run;
                        self.string = None;
                    }
                    _ => i += 1,
                }
                continue;
            }
            match b[i] {
                b'#' => return Some(()),
                q @ (b'"' | b'\'') => {
                    if b[i..].starts_with(&[q, q, q]) {
                        self.string = Some(q);
                        i += 3;
                    } else {
                        i = string_end(b, i)?;
                    }
                }
                b'[' | b'{' => {
                    self.depth += 1;
                    i += 1;
                }
                b']' | b'}' => {
                    self.depth = self.depth.checked_sub(1)?;
                    i += 1;
                }
                _ => i += 1,
            }
        }
        Some(())
    }
}

/// The bytes `Lexer::scan` looks at: all others are passed over.
const SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let special = *b"\"'\\#[]{}";
    let mut i = 0;
    while i < special.len() {
        t[special[i] as usize] = true;
        i += 1;
    }
    t
};

/// Past the one-line string opening at `b[i]`; `None`: it does not end on
/// its line.
fn string_end(b: &[u8], i: usize) -> Option<usize> {
    let q = b[i];
    let mut j = i + 1;
    while j < b.len() {
        match b[j] {
            b'\\' if q == b'"' => j += 2,
            b'\n' => return None,
            c if c == q => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// One part of a dotted key at `b[i]`: its name (`None`: quoted with
/// escapes) and where it ends.
fn key_part(s: &str, i: usize) -> Option<(Option<&str>, usize)> {
    let b = s.as_bytes();
    let bare = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    match b.get(i)? {
        q @ (b'"' | b'\'') => {
            let end = string_end(b, i)?;
            let inner = s.get(i + 1..end - 1)?;
            let plain = *q == b'\'' || !inner.contains('\\');
            Some((plain.then_some(inner), end))
        }
        c if bare(*c) => {
            let end = i + b[i..].iter().take_while(|&&c| bare(c)).count();
            Some((s.get(i..end), end))
        }
        _ => None,
    }
}

/// The header of line `b` (from its `[`): its name; `None` when it is not a
/// header as this reads one.
fn header(s: &str) -> Option<TableHeader<'_>> {
    let b = s.as_bytes();
    let array = b.starts_with(b"[[");
    let mut i = if array { 2 } else { 1 };
    let ws = |b: &[u8], mut i: usize| {
        while b.get(i).is_some_and(|c| *c == b' ' || *c == b'\t') {
            i += 1;
        }
        i
    };
    let (mut first, mut parts, mut escaped) = (None, 0, false);
    loop {
        i = ws(b, i);
        let (part, end) = key_part(s, i)?;
        if parts == 0 {
            first = part;
        }
        escaped |= part.is_none();
        parts += 1;
        i = ws(b, end);
        match b.get(i)? {
            b'.' => i += 1,
            b']' => break,
            _ => return None,
        }
    }
    let close: &[u8] = if array { b"]]" } else { b"]" };
    if !b[i..].starts_with(close) {
        return None;
    }
    i = ws(b, i + close.len());
    match b.get(i) {
        None | Some(b'\n' | b'#') => {}
        Some(b'\r') if b.get(i + 1).is_none_or(|c| *c == b'\n') => {}
        _ => return None,
    }
    Some(TableHeader { array, first: first.filter(|_| !escaped), parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(text: &str) -> Option<Vec<Line<'_>>> {
        let mut lx = Lexer::default();
        let v = text.split_inclusive('\n').map(|l| lx.line(l)).collect::<Option<Vec<_>>>()?;
        lx.at_top().then_some(v)
    }

    fn h(array: bool, first: Option<&str>, parts: usize) -> Line<'_> {
        Line::Header(TableHeader { array, first, parts })
    }

    #[test]
    fn lines_inside_strings_are_content() {
        use Line::*;
        let text = "# top\n[[rule]]\nprefix = \"10.0.0.0/8\" # c\nreason = \"\"\"\n[INC-4711] scanner\n[[rule]]\n# not a comment\n\n\\\"\"\"\"\n\nx = '''\n[daemon]\n#4711'''\ny = [\n  # in an array\n  [1, 2],\n]\n[ \"ru\\u006ce\" . x ]  # c\n[['rule']]\n";
        assert_eq!(
            kinds(text).unwrap(),
            vec![
                Comment,
                h(true, Some("rule"), 1),
                Key(Some("prefix")),
                Key(Some("reason")),
                Inside,
                Inside,
                Inside,
                Inside,
                Inside,
                Blank,
                Key(Some("x")),
                Inside,
                Inside,
                Key(Some("y")),
                Inside,
                Inside,
                Inside,
                h(false, None, 2),
                h(true, Some("rule"), 1),
            ]
        );
        assert_eq!(kinds("\"d\\u0061emon\" = {}\n").unwrap(), vec![Key(None)]);
        assert_eq!(kinds("'d\\u0061emon' = {}\n").unwrap(), vec![Key(Some("d\\u0061emon"))]);
        assert_eq!(kinds("[daemon . x]\n").unwrap(), vec![h(false, Some("daemon"), 2)]);
        // Left open at the end, or not TOML: nothing.
        assert!(kinds("a = \"\"\"\nb\n").is_none());
        assert!(kinds("a = \"b\n").is_none());
        assert!(kinds("[[rule] ]\n").is_none());
        assert!(kinds("= 1\n").is_none());
    }
}
