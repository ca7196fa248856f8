//! Named sets of prefixes (`policer rule import`): the list file format,
//! the diff that makes a set equal a file, and the state files that keep
//! sets across restarts. Pure functions; the daemon applies them
//! (`daemon/sets.rs`).
//!
//! A set is one rule (one action, rate, counter slot) over many prefixes:
//! feeds of a million addresses are a list, not a million rules.

use std::{
    fs,
    io::Write,
    net::{IpAddr, Ipv4Addr},
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    files,
    rules::{RuleConfig, RuleSpec},
    text::excerpt,
};

/// The longest set name.
pub const MAX_NAME: usize = 64;

/// Refuses names that would not make a plain file name (state files are
/// `NAME.set`) or that read badly in a table.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && !name.starts_with(['.', '-'])
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-:".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "set name '{}': 1 to {MAX_NAME} letters, digits, '.', '_', '-' or ':', not starting with '.' or '-'",
            excerpt(name)
        )))
    }
}

/// A parsed list: its prefixes sorted, each once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct List {
    pub entries: Vec<IpNet>,
    /// Lines that repeated an earlier prefix (kept once; not an error:
    /// feeds often repeat).
    pub duplicates: usize,
    /// Lines written as IPv4-mapped IPv6 (`::ffff:a.b.c.d`), taken as the
    /// IPv4 prefix they mean ([`crate::prefix::unmap`]).
    pub mapped: usize,
}

/// The UTF-8 byte order mark some editors put at the start of a file.
pub const BOM: &[u8] = b"\xef\xbb\xbf";

/// One line's prefix: an address (a host) or `ADDR/LEN` with no host bits
/// set, the same rules as [`crate::prefix::parse_prefix`] but without its
/// allocations on the fast path (a million lines). The bool: it was
/// written IPv4-mapped.
fn parse_entry(s: &str) -> std::result::Result<(IpNet, bool), String> {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let a: IpAddr = addr.parse().map_err(|_| format!("'{}' is not an IP address", excerpt(addr)))?;
    let max = if a.is_ipv4() { 32 } else { 128 };
    let len = match len {
        None => max,
        Some(l) => l
            .parse::<u8>()
            .ok()
            .filter(|l| *l <= max)
            .ok_or_else(|| format!("prefix length '/{}' must be 0 to {max}", excerpt(l)))?,
    };
    let (net, mapped) = match (a, crate::prefix::unmap(a, len)?) {
        (_, Some((v4, len))) => (IpNet::V4(Ipv4Net::new(v4, len).map_err(|e| e.to_string())?), true),
        (IpAddr::V4(v4), None) => (IpNet::V4(Ipv4Net::new(v4, len).map_err(|e| e.to_string())?), false),
        (IpAddr::V6(v6), None) => (IpNet::V6(Ipv6Net::new(v6, len).map_err(|e| e.to_string())?), false),
    };
    if net.trunc() != net {
        return Err(format!("'{s}' has host bits set; did you mean {}?", net.trunc()));
    }
    Ok((net, mapped))
}

/// A line without its comment: `#` or `;` starts one, a whole line or
/// after the prefix (Spamhaus DROP lists are `1.2.3.0/24 ; SBL123` under
/// `;` header lines).
fn uncommented(raw: &[u8]) -> &[u8] {
    let line = match raw.iter().position(|b| *b == b'#' || *b == b';') {
        Some(p) => &raw[..p],
        None => raw,
    };
    line.trim_ascii()
}

/// Parses a list file: one prefix per line; `#` and `;` start a comment (a
/// whole line or after the prefix); blank lines, surrounding spaces and
/// CRLF line ends are fine, and so is a UTF-8 byte order mark at the start.
/// All or nothing: the first bad line is an error naming `file` and the
/// line number (1-based), quoting at most 80 characters of it.
pub fn parse(text: &[u8], file: &str) -> Result<List> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    let mut entries = Vec::with_capacity(text.len() / 12);
    let mut mapped = 0;
    for (i, raw) in text.split(|b| *b == b'\n').enumerate() {
        let line = uncommented(raw);
        if line.is_empty() {
            continue;
        }
        let bad = |why: String| Error::Invalid(format!("{file}:{}: {why}; nothing imported", i + 1));
        let s = std::str::from_utf8(line).map_err(|_| bad("not UTF-8 text".into()))?;
        if s.contains(char::is_whitespace) {
            return Err(bad(format!("'{}': one prefix per line", excerpt(s))));
        }
        let (net, m) = parse_entry(s).map_err(bad)?;
        entries.push(net);
        mapped += usize::from(m);
    }
    entries.sort_unstable();
    let before = entries.len();
    entries.dedup();
    Ok(List { duplicates: before - entries.len(), entries, mapped })
}

/// The line (1-based) of `text` that holds `net`, for an error that names
/// where a conflicting entry is (only ever on an error path: a rescan).
pub fn line_of(text: &[u8], net: IpNet) -> Option<usize> {
    let text = text.strip_prefix(BOM).unwrap_or(text);
    text.split(|b| *b == b'\n')
        .position(|raw| {
            std::str::from_utf8(uncommented(raw)).ok().and_then(|s| parse_entry(s).ok()).is_some_and(|(n, _)| n == net)
        })
        .map(|i| i + 1)
}

/// The most entries a replacement (`rule import FILE --set NAME`) may
/// remove from a set: a share of its entries or a count
/// (`--max-remove 50%`, `--max-remove 1000`). A feed cut short or a failed
/// download would otherwise empty a blocklist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum MaxRemove {
    /// Hundredths of a percent of the set's entries (5000: 50 %).
    Share(u32),
    Count(u64),
}

impl Default for MaxRemove {
    fn default() -> Self {
        MaxRemove::Share(5000)
    }
}

impl std::str::FromStr for MaxRemove {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let bad = || {
            format!(
                "--max-remove '{}': a share of the set's entries (50%, 12.5%: 0 to 100) or a count of entries (1000)",
                excerpt(s)
            )
        };
        let t = s.trim();
        match t.strip_suffix('%') {
            Some(p) => {
                let p = p.trim();
                let (whole, frac) = p.split_once('.').unwrap_or((p, ""));
                let digits = |d: &str| d.bytes().all(|b| b.is_ascii_digit());
                if whole.is_empty() || whole.len() > 3 || frac.len() > 2 || !digits(whole) || !digits(frac) {
                    return Err(bad());
                }
                let hundredths = whole.parse::<u32>().map_err(|_| bad())? * 100
                    + format!("{frac:0<2}").parse::<u32>().map_err(|_| bad())?;
                if hundredths > 10_000 {
                    return Err(bad());
                }
                Ok(MaxRemove::Share(hundredths))
            }
            None if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) => {
                t.parse().map(MaxRemove::Count).map_err(|_| bad())
            }
            None => Err(bad()),
        }
    }
}

impl std::fmt::Display for MaxRemove {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MaxRemove::Share(h) if h % 100 == 0 => write!(f, "{}%", h / 100),
            MaxRemove::Share(h) => write!(f, "{}.{:02}%", h / 100, h % 100),
            MaxRemove::Count(n) => write!(f, "{n}"),
        }
    }
}

impl TryFrom<String> for MaxRemove {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        s.parse()
    }
}

impl From<MaxRemove> for String {
    fn from(m: MaxRemove) -> String {
        m.to_string()
    }
}

impl MaxRemove {
    /// Whether removing `removed` of a set's `old` entries is within the
    /// bound.
    pub fn allows(self, removed: usize, old: usize) -> bool {
        match self {
            MaxRemove::Count(n) => removed as u64 <= n,
            MaxRemove::Share(h) => removed as u128 * 10_000 <= u128::from(h) * old as u128,
        }
    }
}

/// What makes a set go from `old` to `new` (both sorted, each entry once).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Diff {
    pub add: Vec<IpNet>,
    pub keep: Vec<IpNet>,
    pub remove: Vec<IpNet>,
}

pub fn diff(old: &[IpNet], new: &[IpNet]) -> Diff {
    let mut d = Diff::default();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if o == n => {
                d.keep.push(*o);
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if o < n => {
                d.remove.push(*o);
                i += 1;
            }
            (Some(_), Some(n)) | (None, Some(n)) => {
                d.add.push(*n);
                j += 1;
            }
            (Some(o), None) => {
                d.remove.push(*o);
                i += 1;
            }
            (None, None) => unreachable!("loop condition"),
        }
    }
    d
}

/// The first entry both sorted lists hold.
pub fn first_common(a: &[IpNet], b: &[IpNet]) -> Option<IpNet> {
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Equal => return Some(a[i]),
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
        }
    }
    None
}

/// Whether `p` overlaps an entry of sorted, canonical `list`: an entry
/// holds `p`, or lies inside it (either may be the other). A look of
/// `p`'s length at most, whatever the list's: what the owner asks of a
/// change that arrives while a long import runs (`daemon/owner.rs`).
pub fn overlaps(list: &[IpNet], p: IpNet) -> bool {
    let p = p.trunc();
    // Entries inside `p` (or at its address, holding it) are one run of
    // the sorted list: those whose address is in p's range.
    let start = IpNet::new(p.network(), 0).unwrap_or(p);
    let lo = list.partition_point(|e| *e < start);
    if list.get(lo).is_some_and(|e| e.addr() >= p.network() && e.addr() <= p.broadcast()) {
        return true;
    }
    // Entries holding `p` from below its address: one per shorter length.
    (0..p.prefix_len()).any(|l| IpNet::new(p.addr(), l).is_ok_and(|s| list.binary_search(&s.trunc()).is_ok()))
}

/// The implicit set of an import without `--set`: one per action and rate,
/// only growing (`deny`, `allow`, `police-100pps`).
pub fn implicit_name(rule: &RuleConfig) -> String {
    let action = rule.action.unwrap_or(policer_common::bucket::Action::Police).to_string();
    match &rule.rate {
        // Canonical (`10 kpps` and `10000pps` are one set).
        Some(r) => match policer_common::rate::Rate::parse(r) {
            Ok(r) => format!("{action}-{r}"),
            Err(_) => format!("{action}-{}", r.replace(|c: char| !c.is_ascii_alphanumeric(), "")),
        },
        None => action,
    }
}

/// What a state file says of its set besides the entries (its first line,
/// JSON after `#policer-set `).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Header {
    pub name: String,
    /// action, rate, burst, key_len as given (prefix unused).
    pub rule: RuleConfig,
    /// When the set is removed, Unix ms (absolute, so a restart neither
    /// revives nor forgets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
    /// A set taken from a MaxMind DB file (`rule import --mmdb`, a
    /// `[[set]]` with `mmdb`): the file and what was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmdb: Option<MmdbSource>,
    /// What put each entry in such a set (its country or AS): `inspect`
    /// names it. Not in the header line: the state file keeps it as each
    /// line's comment ([`crate::mmdb::Labels::from_text`]).
    #[serde(skip)]
    pub labels: Option<std::sync::Arc<crate::mmdb::Labels>>,
    /// The state file's lines carry their labels (set when it is staged
    /// with them: the feed's Country and AS decisions).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub labeled: bool,
}

/// Where a set of a MaxMind DB file comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MmdbSource {
    pub file: String,
    #[serde(flatten)]
    pub query: crate::mmdb::Query,
}

const MAGIC: &str = "#policer-set ";

/// The default state directory (`policer attach --state-dir`).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/policer";

/// Where the sets' state files are in a state directory.
pub fn sets_dir(state_dir: &Path) -> PathBuf {
    state_dir.join("sets")
}

/// Where a state directory keeps the feeds' state (`[crowdsec]`: the
/// decisions in force, `SET.json`), beside the sets' directory.
pub fn feeds_dir_of(sets_dir: &Path) -> PathBuf {
    sets_dir.parent().map_or_else(|| PathBuf::from("feeds"), |p| p.join("feeds"))
}

/// The temporary files of feed state writes killed midway
/// (`.SET.json.<16 hex>.tmp`, [`files::create_temp`]).
pub fn remove_feed_leftovers(dir: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, std::io::Error)>) {
    let ours = |n: &str| {
        files::temp_stem(n).and_then(|s| s.strip_suffix(".json")).is_some_and(|name| check_name(name).is_ok())
    };
    files::remove_leftovers(dir, ours)
}

/// Where releases before `--state-dir` kept the sets: beside the config
/// file, `policer.toml` → `policer.sets/`. Read once, by [`migrate`].
pub fn legacy_dir(config: &Path) -> PathBuf {
    let stem = config.file_stem().map_or_else(|| "policer".into(), |s| s.to_string_lossy().into_owned());
    config.with_file_name(format!("{stem}.sets"))
}

/// What [`migrate`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub enum Migrated {
    /// Nothing to do: no old directory, or the new one exists already.
    #[default]
    Nothing,
    /// These sets were copied from the old directory into the new.
    Copied(Vec<String>),
}

/// The upgrade from sets kept beside the config: when `dir` (the sets'
/// directory in the state directory) does not exist yet and `legacy` holds
/// state files, they are copied into `dir` (each staged and synced, then
/// renamed: a start killed midway leaves no half file, and copies again).
/// Only ever once: once `dir` exists the old directory is not read, so a
/// set removed later does not come back from it. The old directory is left
/// for the caller to remove once the start commits ([`remove_legacy`]); on
/// a read-only config it stays, unread.
pub fn migrate(legacy: &Path, dir: &Path, mode: u32) -> Result<Migrated> {
    if dir.exists() {
        return Ok(Migrated::Nothing);
    }
    let old = read_all(legacy)?;
    if old.is_empty() {
        return Ok(Migrated::Nothing);
    }
    let err = |e: std::io::Error| {
        Error::Invalid(format!(
            "cannot copy the sets of {} to the state directory {}: {e} (give `--state-dir` a writable directory)",
            legacy.display(),
            dir.display()
        ))
    };
    // Into a temporary directory first, renamed into place whole: a start
    // that fails midway leaves `dir` absent, so the next one copies again.
    let parent = dir.parent().unwrap_or(Path::new("."));
    fs::DirBuilder::new().recursive(true).mode(dir_mode(mode)).create(parent).map_err(err)?;
    let tmp = parent.join(format!(".sets.migrating.{}", std::process::id()));
    let _ = fs::remove_dir_all(&tmp);
    fs::DirBuilder::new().mode(dir_mode(mode)).create(&tmp).map_err(err)?;
    let mut names = Vec::new();
    let r = (|| -> std::io::Result<()> {
        for (h, _) in &old {
            let from = state_path(legacy, &h.name);
            let to = state_path(&tmp, &h.name);
            fs::copy(&from, &to)?;
            fs::set_permissions(&to, fs::Permissions::from_mode(mode))?;
            fs::File::open(&to)?.sync_all()?;
            names.push(h.name.clone());
        }
        fs::File::open(&tmp)?.sync_all()?;
        fs::rename(&tmp, dir)?;
        if let Ok(f) = fs::File::open(parent) {
            let _ = f.sync_all();
        }
        Ok(())
    })();
    if let Err(e) = r {
        let _ = fs::remove_dir_all(&tmp);
        return Err(err(e));
    }
    Ok(Migrated::Copied(names))
}

/// Removes the old sets directory beside the config after [`migrate`]
/// copied it (its state files, then the directory if it is empty then).
pub fn remove_legacy(legacy: &Path, names: &[String]) -> std::io::Result<()> {
    for n in names {
        match fs::remove_file(state_path(legacy, n)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    match fs::remove_dir(legacy) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound && e.kind() != std::io::ErrorKind::DirectoryNotEmpty => {
            Err(e)
        }
        _ => Ok(()),
    }
}

fn state_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.set"))
}

/// The state file of set `name` in the sets' directory `dir`.
pub fn sets_dir_file(dir: &Path, name: &str) -> PathBuf {
    state_path(dir, name)
}

/// The mode of a set's state file: the config file's (`path`, its
/// symlinks followed) without execute bits, so a 0600 config keeps its
/// sets as private as its rules; 0600 when there is no config file yet.
pub fn file_mode(config: &Path) -> u32 {
    fs::metadata(config).map_or(files::NEW_FILE_MODE, |m| m.mode() & 0o666)
}

/// The state directory's mode for files of `mode`: search where read
/// (0600 → 0700, 0644 → 0755).
fn dir_mode(mode: u32) -> u32 {
    mode | (mode & 0o444) >> 2
}

/// A state file written beside its final name, not yet in place.
pub struct Staged {
    tmp: PathBuf,
    path: PathBuf,
    /// Open (and so locked) until renamed or removed: a starting daemon's
    /// cleanup of leftovers leaves it alone (`files.rs`).
    file: fs::File,
    done: bool,
}

impl Staged {
    /// Puts the file in place (atomic rename) and syncs the directory.
    pub fn commit(mut self) -> Result<()> {
        fs::rename(&self.tmp, &self.path)
            .map_err(|e| Error::Invalid(format!("cannot put the set's state {} in place: {e}", self.path.display())))?;
        self.done = true;
        if let Some(d) = self.path.parent()
            && let Ok(f) = fs::File::open(d)
        {
            let _ = f.sync_all();
        }
        Ok(())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// What a state file holds after its header.
pub enum Body<'a> {
    /// The list file as imported (a set that is the file): written as is,
    /// no formatting of a million prefixes.
    Text(&'a [u8]),
    Entries(&'a [IpNet]),
}

/// Writes a set's state file to a temporary name (new, random, never
/// through a link: [`files::create_temp`]) of mode `mode`
/// ([`file_mode`]), and syncs it.
pub fn stage(dir: &Path, mode: u32, h: &Header, body: Body<'_>) -> Result<Staged> {
    let path = state_path(dir, &h.name);
    let err = |e: std::io::Error| Error::Invalid(format!("cannot write the set's state {}: {e}", path.display()));
    fs::DirBuilder::new().recursive(true).mode(dir_mode(mode)).create(dir).map_err(err)?;
    let mut buf = Vec::with_capacity(256);
    buf.extend_from_slice(MAGIC.as_bytes());
    let labels = h.labels.as_deref().filter(|l| !l.is_empty());
    let h = &Header { labeled: labels.is_some(), ..h.clone() };
    serde_json::to_writer(&mut buf, h).map_err(|e| Error::Invalid(e.to_string()))?;
    buf.push(b'\n');
    let (tmp, f) = files::create_temp(dir, &format!("{}.set", h.name), mode).map_err(err)?;
    let mut staged = Staged { tmp, path: path.clone(), file: f, done: false };
    let f = &mut staged.file;
    // Exactly `mode`, whatever the umask took from the create's.
    f.set_permissions(fs::Permissions::from_mode(mode)).map_err(err)?;
    f.write_all(&buf).map_err(err)?;
    match body {
        Body::Text(t) => {
            f.write_all(t).map_err(err)?;
            if !t.ends_with(b"\n") {
                f.write_all(b"\n").map_err(err)?;
            }
        }
        Body::Entries(entries) => {
            let mut w = std::io::BufWriter::with_capacity(1 << 20, &mut *f);
            for e in entries {
                match labels.and_then(|l| l.get(e)) {
                    Some(l) => writeln!(w, "{e} # {l}"),
                    None => writeln!(w, "{e}"),
                }
                .map_err(err)?;
            }
            w.flush().map_err(err)?;
        }
    }
    f.sync_all().map_err(err)?;
    Ok(staged)
}

/// Removes a set's state file.
pub fn remove(dir: &Path, name: &str) -> Result<()> {
    match fs::remove_file(state_path(dir, name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(Error::Invalid(format!("{}: {e}", state_path(dir, name).display())))
        }
        _ => Ok(()),
    }
}

/// Removes the temporary state files of writes killed midway that no
/// writer holds (`.NAME.set.<16 hex>.tmp`, and an older policer's
/// `.NAME.set.tmp`): what was removed, and what could not be.
pub fn remove_leftovers(dir: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, std::io::Error)>) {
    let ours = |n: &str| {
        let fixed = n.strip_prefix('.').and_then(|n| n.strip_suffix(".set.tmp"));
        let random = files::temp_stem(n).and_then(|s| s.strip_suffix(".set"));
        fixed.or(random).is_some_and(|name| check_name(name).is_ok())
    };
    files::remove_leftovers(dir, ours)
}

/// Reads every set's state file in `dir` (none when it does not exist).
/// Each must be a regular file of at most [`files::SET_STATE`]'s bound: a
/// FIFO, a device or a directory named `*.set` fails the start, named.
pub fn read_all(dir: &Path) -> Result<Vec<(Header, List)>> {
    let rd = match fs::read_dir(dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(Error::Invalid(format!("{}: {e}", dir.display()))),
    };
    let mut out = Vec::new();
    for ent in rd {
        let ent = ent.map_err(|e| Error::Invalid(format!("{}: {e}", dir.display())))?;
        let p = ent.path();
        let name = ent.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".set") {
            continue;
        }
        let text = files::read_regular(&p, files::SET_STATE).map_err(|e| {
            Error::Invalid(match e {
                files::ReadError::Io(e) => format!("set state file {}: {e}", p.display()),
                e => format!("set state file {} {e}", p.display()),
            })
        })?;
        let text = text.strip_prefix(BOM).unwrap_or(&text);
        let first = text.split(|b| *b == b'\n').next().unwrap_or_default();
        let mut h: Header = std::str::from_utf8(first)
            .ok()
            .and_then(|l| l.strip_prefix(MAGIC))
            .and_then(|j| serde_json::from_str(j).ok())
            .ok_or_else(|| Error::Invalid(format!("{}:1: not a policer set file", p.display())))?;
        let list = parse(text, &p.display().to_string())?;
        if h.mmdb.is_some() || h.labeled {
            h.labels = Some(std::sync::Arc::new(crate::mmdb::Labels::from_text(text)));
        }
        out.push((h, list));
    }
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    Ok(out)
}

/// A test helper and the benchmark's: `n` distinct /32s from 10.0.0.0 on
/// (skipping nothing; n ≤ 2^24).
pub fn hosts(n: u32) -> impl Iterator<Item = Ipv4Addr> {
    (0..n).map(|i| Ipv4Addr::from(0x0a00_0000u32 + i))
}

/// The unspecified address of a family, as a /0 (the prefix of a set's
/// rule spec: sets have no prefix of their own).
pub fn family_any(v6: bool) -> IpNet {
    if v6 { "::/0".parse().expect("literal") } else { "0.0.0.0/0".parse().expect("literal") }
}

/// The set's rule for one family: the rule options over a /0. Errors name
/// the set, not the /0 it is validated over.
pub fn family_spec(name: &str, rule: &RuleConfig, v6: bool) -> Result<RuleSpec> {
    let any = family_any(v6).to_string();
    let rc = RuleConfig { prefix: any.clone(), ttl: None, expires: None, ..rule.clone() };
    rc.validate().map_err(|e| match e {
        Error::Invalid(m) => match m.strip_prefix(&format!("{any}: ")) {
            Some(rest) => Error::Invalid(format!("set '{name}': {rest}")),
            None => Error::Invalid(format!("set '{name}': {m}")),
        },
        e => e,
    })
}

/// The set's rule per family (action, rate, burst, key_len of `rule`),
/// validated against its entries (`entries` sorted, IPv4 first): a police
/// set needs a rate, a key length fits the family, a key is no shorter
/// than an entry. Errors name the set.
pub fn specs(name: &str, rule: &RuleConfig, entries: &[IpNet]) -> Result<(RuleSpec, RuleSpec)> {
    let (v4, v6) = entries.split_at(entries.partition_point(|n| n.addr().is_ipv4()));
    let action = rule.action.unwrap_or(policer_common::bucket::Action::Police);
    if action.polices() && rule.rate.is_none() {
        return Err(Error::Invalid(format!(
            "set '{name}': a {action} set needs a rate per source (--rate 500pps, 10kpps, 64kbit; `rate` in a \
             [[set]] table); nothing imported"
        )));
    }
    // A key length given for one family must not fail the other when
    // the set has none of it.
    let spec = |v6: bool, any: bool| -> Result<RuleSpec> {
        match family_spec(name, rule, v6) {
            Err(_) if !any && rule.key_len.is_some() => {
                family_spec(name, &RuleConfig { key_len: None, ..rule.clone() }, v6)
            }
            r => r,
        }
    };
    if let Some(k) = rule.key_len
        && k > 32
        && !v4.is_empty()
    {
        return Err(Error::Invalid(format!(
            "--key-len {k} is an IPv6 key length, and the list has IPv4 prefixes too ({}): a set has one key \
             length; import IPv4 and IPv6 into separate sets, or leave --key-len out (32 and 64); nothing imported",
            v4[0]
        )));
    }
    let (s4, s6) = (spec(false, !v4.is_empty())?, spec(true, !v6.is_empty())?);
    if s4.total().is_some() || s4.auto_ban().is_some() {
        return Err(Error::Invalid("a set takes --action, --rate, --burst and --key-len".into()));
    }
    // Buckets are keyed by the source masked to the key length: a key
    // shorter than an entry would share buckets across rules.
    if s4.action.polices() {
        for (list, s) in [(v4, &s4), (v6, &s6)] {
            if let Some(n) = list.iter().find(|n| u32::from(n.prefix_len()) > s.key_len) {
                return Err(Error::Invalid(format!(
                    "{n} is longer than the key length {} of a {} set: give --key-len {} (or more); nothing imported",
                    s.key_len,
                    s.action,
                    n.prefix_len()
                )));
            }
        }
    }
    Ok((s4, s6))
}

/// No entry is a rule's prefix (`rules`: each non-ban rule's prefix and
/// how to name it; a set entry and a rule would fight for one trie key),
/// and no entry of a set that does not allow lies inside a protected
/// prefix (`protect` in [daemon]). The error names where the entry is
/// (`locate`: `FILE:LINE`). An entry may be in several sets (precedence
/// decides, `daemon/sets.rs`).
pub fn check_conflicts(
    entries: &[IpNet],
    action: policer_common::bucket::Action,
    rules: impl Iterator<Item = (IpNet, String)>,
    protect: &crate::protect::Protect,
    locate: impl Fn(IpNet) -> String,
) -> Result<()> {
    if !protect.is_empty()
        && let Some((n, e)) = entries.iter().find_map(|n| protect.refuse_entry(n, action).err().map(|e| (*n, e)))
    {
        return Err(Error::Invalid(format!("{}: {e}", locate(n))));
    }
    // A manual ban may share an entry's prefix: it wins while it lasts.
    for (net, key) in rules {
        if entries.binary_search(&net).is_ok() {
            return Err(Error::Invalid(format!(
                "{}: {net} is the prefix of the rule {key}: a prefix has a rule or is an entry of a set, not both \
                 (remove one); nothing imported",
                locate(net)
            )));
        }
    }
    Ok(())
}

/// A `[[set]]` table: a named set (as `policer rule import FILE --set
/// NAME` makes one) declared in the config. Its entries are the lines of
/// `file`, read at start and at every `policer reload`; its rule is the
/// keys an import takes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetConfig {
    pub name: String,
    /// The list file; a relative path is relative to the config file's
    /// directory. Empty with `mmdb`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    /// A MaxMind DB file (Country or ASN) instead of a list: the set is
    /// its networks of `country` and `asn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mmdb: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub country: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asn: Vec<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<policer_common::bucket::Action>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<crate::rules::BurstValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_len: Option<u32>,
}

impl SetConfig {
    /// The set's rule (action, rate, burst, key_len; no prefix), as an
    /// import's. A set that names no action denies (as `rule import` does, and as
    /// policer.toml(5) says), unless it gives a rate: then it polices at it.
    pub fn rule(&self) -> RuleConfig {
        RuleConfig {
            action: self.action.or(self.rate.is_none().then_some(policer_common::bucket::Action::Deny)),
            rate: self.rate.clone(),
            burst: self.burst.clone(),
            key_len: self.key_len,
            ..RuleConfig::default()
        }
    }

    /// Where the list file (or the database) is: as written when
    /// absolute, else in the config file's directory.
    pub fn path(&self, config: &Path) -> PathBuf {
        let f = Path::new(self.mmdb.as_deref().unwrap_or(&self.file));
        if f.is_absolute() {
            return f.to_path_buf();
        }
        match config.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.join(f),
            _ => f.to_path_buf(),
        }
    }
}

/// A `[[set]]`'s list file as read and parsed: where it is, its bytes, its
/// list.
#[derive(Clone, Debug)]
pub struct ConfigList {
    pub path: PathBuf,
    pub text: Vec<u8>,
    pub list: List,
    /// A set of a MaxMind DB file: where it comes from, what put each
    /// entry in.
    pub mmdb: Option<(MmdbSource, std::sync::Arc<crate::mmdb::Labels>)>,
}

impl ConfigList {
    /// The header of the set it makes (`rule`: the set's rule).
    pub fn header(&self, name: &str, rule: RuleConfig) -> Header {
        Header {
            name: name.to_string(),
            rule,
            expires_ms: None,
            mmdb: self.mmdb.as_ref().map(|m| m.0.clone()),
            labels: self.mmdb.as_ref().map(|m| m.1.clone()),
            labeled: false,
        }
    }
}

/// Reads and parses the list file of `set` (a `[[set]]` of the config
/// `config`): a regular file of at most [`files::IMPORT`]'s bound, read
/// without blocking (`files.rs`). A list with no entries is refused, as an
/// import's is: an empty feed is a failed download far more often than a
/// wish. Errors name the file (and the line).
pub fn read_config_list(config: &Path, set: &SetConfig) -> Result<ConfigList> {
    if set.mmdb.is_some() {
        return read_config_mmdb(config, set);
    }
    let path = set.path(config);
    let file = path.display().to_string();
    let mut text = files::read_regular(&path, files::IMPORT).map_err(|e| {
        Error::Invalid(match e {
            files::ReadError::Io(e) => format!("set '{}': its file {file}: {e}", set.name),
            e => format!("set '{}': its file {file} {e}", set.name),
        })
    })?;
    if text.starts_with(BOM) {
        text.drain(..BOM.len());
    }
    let list = parse(&text, &file).map_err(|e| match e {
        Error::Invalid(m) => Error::Invalid(m.replace("; nothing imported", "")),
        e => e,
    })?;
    if list.entries.is_empty() {
        return Err(Error::Invalid(format!(
            "set '{}': {file} has no entries ({} bytes: empty, or only comments and blank lines; a failed \
             download?); remove the [[set]] table to remove the set",
            set.name,
            text.len()
        )));
    }
    Ok(ConfigList { path, text, list, mmdb: None })
}

/// [`read_config_list`] of a `[[set]]` with `mmdb`: the database's
/// networks of its `country` and `asn` ([`crate::mmdb::read`]). A database
/// that does not open, holds no network, is cut short, or has none of
/// them is refused, naming the set and why.
fn read_config_mmdb(config: &Path, set: &SetConfig) -> Result<ConfigList> {
    let path = set.path(config);
    let file = path.display().to_string();
    let query = crate::mmdb::Query { country: set.country.clone(), asn: set.asn.clone() };
    let named = |e: Error| match e {
        Error::Invalid(m) => Error::Invalid(format!("set '{}': {m}", set.name)),
        e => e,
    };
    query.check().map_err(named)?;
    let sel = crate::mmdb::read(&path, &file, &query).map_err(named)?;
    let text = sel.text();
    let list = List { entries: sel.entries, duplicates: 0, mapped: sel.mapped };
    let source = MmdbSource { file, query };
    Ok(ConfigList { path, text, list, mmdb: Some((source, sel.labels)) })
}

#[cfg(test)]
mod tests;
