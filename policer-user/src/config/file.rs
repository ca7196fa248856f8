//! The config file as the daemon keeps it: what it last read or wrote, and
//! changes made to the text the operator wrote.
//!
//! **Hand edits are refused, not merged.** Before every write the daemon
//! compares the file on disk with the text it last read or wrote (all of
//! it, byte for byte: no clock granularity or `touch` to fool). If they
//! differ, someone edited the file and has not run `policer reload` yet;
//! the write is refused with [`Error::ConfigChanged`], the file is left as
//! they wrote it, and the caller undoes its change. Merging would have to
//! guess which of two conflicting rules for one prefix wins, and would put
//! half-finished edits into force without the whole-file validation that
//! `reload` gives. The check runs again just before the rename, so the
//! window in which an edit can still be overwritten is the rename itself.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
};

use super::{
    Config,
    edit::{self, Change},
    splice::{self, RuleLayout},
    write::{self, DirSync},
};
use crate::{
    error::{Error, Result},
    files::{self, ReadError},
    rules::{RuleKey, RuleSpec, SpecMap},
};

/// The file's content as the daemon last saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum LastSeen {
    /// There was no file.
    Missing,
    Text(String),
}

/// A config file read from disk and validated; not yet what the daemon
/// runs from until [`ConfigFile::accept`]ed.
#[derive(Clone, Debug)]
pub struct FileSnapshot {
    pub config: Config,
    pub rules: BTreeMap<RuleKey, RuleSpec>,
    seen: LastSeen,
    /// Where the text's `[[rule]]` headers start, if its reader found them.
    headers: super::Headers,
}

/// What `policer check` says of a valid file's `text` that does not end
/// with a newline: a followed update of it would be refused
/// ([`FileSnapshot::check_whole`]); `None` when it does (or is empty).
pub fn final_newline_warning(text: &str) -> Option<String> {
    (!text.is_empty() && !text.ends_with('\n')).then(|| {
        "it does not end with a newline: the daemon refuses a followed update of a file like this (a write cut \
         inside a line leaves none), and one that would remove most rules or every ban; end it with a newline \
         (a Kubernetes ConfigMap: `policer.toml: |`, not `|-`)"
            .to_string()
    })
}

impl FileSnapshot {
    /// Whether the file ends with a newline, as most editors and tools
    /// write it and a write cut inside a line never leaves it.
    fn ends_with_newline(&self) -> bool {
        matches!(&self.seen, LastSeen::Text(t) if t.ends_with('\n'))
    }

    /// Refuses a reload of this file that a writer killed mid-file could
    /// have left (the file at `path`, read whole and valid). A *followed*
    /// reload (the file was closed after writing or renamed into place,
    /// which a killed writer's file is too) needs the file to end as a
    /// whole file does: with a newline, so a cut inside a line (`burst =
    /// 1` of `burst = 100`, half a rule) is never applied. Any reload that
    /// is `drastic` (what it would do: remove most rules, lift every ban)
    /// needs it too. An explicit `policer reload` or SIGHUP of an ordinary
    /// change does not: the operator says the file is finished (a killed
    /// writer sends no reload).
    ///
    /// A cut exactly at a line's end leaves a shorter file that ends as a
    /// whole one does; it is applied only if valid as a whole (a rule cut
    /// before its `rate` is not), and one that removes most rules or every
    /// ban is logged loudly. Nothing in the bytes tells it from a file
    /// written that way.
    pub fn check_whole(&self, path: &Path, followed: bool, drastic: Option<&str>) -> Result<()> {
        if self.ends_with_newline() || matches!(self.seen, LastSeen::Missing) {
            return Ok(());
        }
        let path = path.display();
        match (drastic, followed) {
            (Some(what), _) => Err(Error::Invalid(format!(
                "{path} would {what}, and it does not end with a newline, as a file cut inside a line by an \
                 interrupted write would not (most editors end a file with one; some do not, nor does a Kubernetes \
                 ConfigMap value written with `|-`); nothing changed: if the file is whole, end it with a newline"
            ))),
            (None, true) => Err(Error::Invalid(format!(
                "{path} does not end with a newline, as a file cut inside a line by an interrupted write would \
                 not (most editors end a file with one; some do not, nor does a Kubernetes ConfigMap value written \
                 with `|-`); nothing changed: if the file is whole, end it with a newline (or apply it as it is \
                 with `policer reload`)"
            ))),
            (None, false) => Ok(()),
        }
    }
}

/// A new version of the file, written under a temporary name and not yet
/// in place ([`ConfigFile::stage`]); dropping it removes the temporary.
#[derive(Debug)]
pub struct Pending {
    staged: Option<write::Staged>,
    text: String,
    after: After,
    /// The text's sha256, if worked out already.
    sha: Option<String>,
}

/// A staged version on its way to the disk ([`ConfigFile::stage_rules_begin`]).
#[derive(Debug)]
pub struct Staging(StagingState);

#[derive(Debug)]
enum StagingState {
    /// Staged already (or nothing to write).
    Ready(Box<Pending>),
    /// Being written and synced on a thread of its own.
    Writing { thread: std::thread::JoinHandle<WriteDone>, after: After },
}

/// What a write's thread gives back: the staged file, the text, its sha256.
type WriteDone = (Result<write::Staged>, String, Option<String>);

impl Staging {
    /// Whether [`wait`](Self::wait) would not wait.
    pub fn is_finished(&self) -> bool {
        match &self.0 {
            StagingState::Ready(_) => true,
            StagingState::Writing { thread, .. } => thread.is_finished(),
        }
    }

    /// The staged version, once written and synced (or why not).
    pub fn wait(self) -> Result<Pending> {
        match self.0 {
            StagingState::Ready(p) => Ok(*p),
            StagingState::Writing { thread, after } => match thread.join() {
                Ok((staged, text, sha)) => Ok(Pending { staged: Some(staged?), text, after, sha }),
                Err(_) => Err(Error::Invalid("the thread writing the config file ended abnormally".into())),
            },
        }
    }
}

/// What the file says after a staged change.
#[derive(Debug)]
enum After {
    /// Read from the whole document (`edit.rs`).
    Whole(Box<Config>),
    /// What it said before with these rules' edits (`splice.rs`).
    Edits(Vec<splice::Op>),
    /// What it said before with these interfaces; the `[daemon]` table's
    /// text `[from, to)` is now `len` bytes.
    Interfaces { names: Vec<String>, from: usize, to: usize, len: usize },
}

/// The daemon's config file.
#[derive(Clone, Debug)]
pub struct ConfigFile {
    path: PathBuf,
    config: Config,
    seen: LastSeen,
    /// Where the rules of `seen` are (`None`: the text is not laid out for
    /// `splice.rs`). `config.rules` is then not kept: the layout and the
    /// owner's rules say all a change needs (a whole-document edit reads
    /// the text again).
    layout: Option<RuleLayout>,
    /// The sha256 of `seen`, once asked for (every snapshot of the daemon
    /// asks: hashing 6 MB each time would cost more than a change).
    sha: std::sync::OnceLock<String>,
    /// The file on disk as last found to hold `seen`, when that alone
    /// tells an edit since ([`Stamp`]): the hand-edit check then needs no
    /// read of the whole file.
    stamp: std::cell::Cell<Option<Stamp>>,
    /// The file system gives each change after a `stat` a timestamp of its
    /// own ([`fine_timestamps`]): a stamp tells edits from when it is taken.
    /// Measured when first needed (a daemon that never checks for a hand
    /// edit writes no probe).
    fine: std::sync::OnceLock<bool>,
}

/// What `stat` says of a file: an edit since changes some of it, as long
/// as its timestamps had moved on from the last change when it was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// How far a file system's timestamps may lag the clock: they are taken
/// from a clock read once per scheduler tick (every 10 ms at the lowest
/// tick rate), so two changes within one tick may share a timestamp.
const STAMP_GRAIN: std::time::Duration = std::time::Duration::from_millis(20);

impl Stamp {
    /// The file's stamp now (`None`: no file, or not a regular file).
    fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some(Stamp {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }

    /// Whether an edit made after `taken` (when the stamp was taken) would
    /// change the stamp: the file's last change is a tick older than that,
    /// and its file system keeps timestamps to the tick (not FAT's two
    /// seconds, nor a server's clock).
    fn tells_edits_after(&self, taken: std::time::SystemTime, path: &Path) -> bool {
        let ctime = std::time::UNIX_EPOCH + std::time::Duration::new(self.ctime.0.max(0) as u64, self.ctime.1 as u32);
        taken.duration_since(ctime).is_ok_and(|d| d >= STAMP_GRAIN) && local_timestamps(path)
    }
}

/// Whether the file system of `dir` gives a change made after a `stat` a
/// timestamp of its own, finer than the scheduler tick (multigrain
/// timestamps: Linux 6.13 and later on ext4, XFS, Btrfs and tmpfs), so that
/// a stamp tells any edit after it at once. Measured three times by two
/// writes of a scratch file with a `stat` between; `false` where the
/// directory cannot be written (a ConfigMap: nothing is written there).
fn fine_timestamps(dir: &Path) -> bool {
    use std::{io::Write, os::unix::fs::MetadataExt};
    let probe = dir.join(format!(".policer-stamp-probe-{}", std::process::id()));
    // One a daemon of this pid left behind (killed in the moment between).
    let _ = std::fs::remove_file(&probe);
    let fine = (|| -> io::Result<bool> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(&probe)?;
        let ns = |m: &std::fs::Metadata| i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec());
        for _ in 0..3 {
            f.write_all(b"a")?;
            let a = ns(&f.metadata()?);
            f.write_all(b"b")?;
            let b = ns(&f.metadata()?);
            // A tick is at least a millisecond (1000 Hz); half of it is finer.
            if !(b > a && b - a < 500_000) {
                return Ok(false);
            }
        }
        Ok(true)
    })();
    let _ = std::fs::remove_file(&probe);
    fine.unwrap_or(false) && local_timestamps(dir)
}

/// Whether the file system of `path` stamps changes with this machine's
/// clock to the scheduler tick: ext4, XFS, Btrfs, tmpfs and overlayfs over
/// them (a container's root).
fn local_timestamps(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    const KNOWN: [i64; 5] = [0xEF53, 0x5846_5342, 0x9123_683E, 0x0102_1994, 0x794C_7630];
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else { return false };
    // SAFETY: statfs writes into the zeroed struct it is given; the path is
    // a valid C string.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    (unsafe { libc::statfs(c.as_ptr(), &mut st) } == 0) && KNOWN.contains(&(st.f_type as i64))
}

impl ConfigFile {
    /// Reads and validates `path` (a missing file is an empty config) and
    /// takes it as what the daemon runs from.
    pub fn open(path: &Path) -> Result<(ConfigFile, BTreeMap<RuleKey, RuleSpec>)> {
        ConfigFile::open_from(path, bytes(path)?)
    }

    /// The bytes of the file at `path` as [`open`](Self::open) reads them
    /// (`None`: there is none), for [`open_from`](Self::open_from): a
    /// start reads its config once.
    pub fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>> {
        bytes(path)
    }

    /// [`open`](Self::open) of `bytes`, read from `path` by
    /// [`read_bytes`](Self::read_bytes).
    pub fn open_from(path: &Path, bytes: Option<Vec<u8>>) -> Result<(ConfigFile, BTreeMap<RuleKey, RuleSpec>)> {
        let FileSnapshot { config, rules, seen, headers } = snapshot(path, bytes)?;
        // The rules are the caller's (not a copy: 1 000 000 of them are
        // a few hundred MB).
        let snap = FileSnapshot { config, rules: BTreeMap::new(), seen, headers };
        let mut file = ConfigFile {
            path: path.to_path_buf(),
            config: Config::default(),
            seen: LastSeen::Missing,
            layout: None,
            sha: std::sync::OnceLock::new(),
            stamp: std::cell::Cell::new(None),
            fine: std::sync::OnceLock::new(),
        };
        file.accept(snap);
        Ok((file, rules))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The config as last read or written.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Reads and validates the file as it is now; changes nothing. For
    /// `policer reload`: apply `snapshot.rules`, and [`accept`](Self::accept)
    /// the snapshot only once they are in force.
    pub fn read(&self) -> Result<FileSnapshot> {
        read(&self.path)
    }

    /// The file's bytes now; `None`: there is none. [`Error::ConfigRead`]:
    /// it is there but cannot be read now (no fd left, EIO, ...).
    pub fn bytes_on_disk(&self) -> Result<Option<Vec<u8>>> {
        bytes(&self.path)
    }

    /// Validates `bytes` (from [`bytes_on_disk`](Self::bytes_on_disk)) as
    /// the file's content, for a reload: a `max_sources` whose tables this
    /// machine could not hold is refused too (the next start would fail);
    /// changes nothing.
    pub fn snapshot(&self, bytes: Option<Vec<u8>>) -> Result<FileSnapshot> {
        self.snapshot_named(None, bytes)
    }

    /// [`snapshot`](Self::snapshot) of a candidate's bytes, its messages
    /// naming `named` (else the file's path).
    pub fn snapshot_named(&self, named: Option<&Path>, bytes: Option<Vec<u8>>) -> Result<FileSnapshot> {
        let path = named.unwrap_or(&self.path);
        let snap = snapshot(path, bytes)?;
        if let Some(n) = snap.config.daemon.max_sources {
            crate::loader::check_sources_here(n, "daemon.max_sources")
                .map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
        }
        Ok(snap)
    }

    /// The sha256 (hex) of the file as last read or written; of no bytes
    /// when there was no file.
    pub fn sha256(&self) -> String {
        self.sha
            .get_or_init(|| match &self.seen {
                LastSeen::Missing => sha256_hex(b""),
                LastSeen::Text(t) => sha256_hex(t.as_bytes()),
            })
            .clone()
    }

    /// Takes `seen` as the file's text (and forgets the hash of the last).
    fn set_seen(&mut self, seen: LastSeen) {
        self.seen = seen;
        self.sha = std::sync::OnceLock::new();
        self.stamp.set(None);
    }

    /// The sha256 (hex) of the file on disk now; `None`: there is none.
    /// [`Error::ConfigRead`]: it cannot be read now.
    pub fn sha256_on_disk(&self) -> Result<Option<String>> {
        Ok(self.bytes_on_disk()?.map(|b| sha256_hex(&b)))
    }

    /// Whether the daemon cannot write the file (a read-only mount such as
    /// a ConfigMap volume, no write bit, or a directory it cannot write):
    /// rule changes are then refused unless `--runtime`. A missing file is
    /// writable if its directory is.
    pub fn read_only(&self) -> bool {
        read_only(&self.path)
    }

    /// Takes `snap` as what the daemon runs from: later writes edit it.
    pub fn accept(&mut self, snap: FileSnapshot) {
        self.set_seen(snap.seen);
        self.take_config(snap.config, snap.headers);
    }

    /// Takes `config`, what the text now says: its layout found, its rules
    /// let go (100 000 rules as written are 50 MB the daemon has in
    /// another form).
    fn take_config(&mut self, mut config: Config, headers: super::Headers) {
        self.layout = match &self.seen {
            LastSeen::Text(t) => RuleLayout::of(t, &config.rules, headers),
            LastSeen::Missing => None,
        };
        if self.layout.is_some() {
            config.rules = Vec::new();
        }
        self.config = config;
    }

    /// The config with its rules as written (read again if let go).
    fn whole_config(&self) -> Result<std::borrow::Cow<'_, Config>> {
        match (&self.seen, &self.layout) {
            (LastSeen::Text(t), Some(_)) => Ok(std::borrow::Cow::Owned(Config::parse(t, &self.path)?.0)),
            _ => Ok(std::borrow::Cow::Borrowed(&self.config)),
        }
    }

    /// Whether the file on disk differs from what the daemon last read or
    /// wrote (a hand edit not yet reloaded).
    pub fn changed_on_disk(&self) -> Result<bool> {
        Ok(!self.unchanged()?)
    }

    /// Writes `rules` as the file's rule set (`config/edit.rs` says what is
    /// kept of what the operator wrote).
    pub fn apply_rules(&mut self, rules: &BTreeMap<RuleKey, RuleSpec>) -> Result<()> {
        // The tests' edits go the way of a change of a few rules where they
        // can, which checks that way against this one (`spliced`).
        #[cfg(test)]
        if let LastSeen::Text(t) = &self.seen
            && let Ok((_, before)) = Config::parse(t, &self.path)
        {
            let mut edits: Vec<(RuleKey, Option<RuleSpec>)> =
                before.keys().filter(|k| !rules.contains_key(k)).map(|k| (k.clone(), None)).collect();
            edits.extend(
                rules.iter().filter(|(k, v)| before.get(k) != Some(v)).map(|(k, v)| (k.clone(), Some(v.clone()))),
            );
            if !edits.is_empty() {
                let pending = self.stage_rules(&before, &edits)?;
                return self.commit(pending);
            }
        }
        self.update(Change { rules: Some(rules), interfaces: None, chains: None })
    }

    /// Writes `names` as `daemon.interfaces`.
    pub fn set_interfaces(&mut self, names: &[String]) -> Result<()> {
        self.update(Change { rules: None, interfaces: Some(names), chains: None })
    }

    /// Writes `chains` as the file's `[[chain]]` tables (`policer chain
    /// add/rm`), in one atomic write as every change.
    pub fn set_chains(&mut self, chains: &[crate::chain::ChainConfig]) -> Result<()> {
        self.update(Change { rules: None, interfaces: None, chains: Some(chains) })
    }

    /// Makes `change` in the file in one atomic write. Refused with
    /// [`Error::ConfigChanged`] when the file changed by hand since it was
    /// last read; [`Error::ConfigWrite`] when it cannot be written. Either
    /// way the file is as it was. A change that changes nothing writes
    /// nothing.
    pub fn update(&mut self, change: Change<'_>) -> Result<()> {
        let pending = self.stage(change)?;
        self.commit(pending)
    }

    /// Gives the memory of an edit back to the system. A format-preserving
    /// edit of a 100 000-rule file builds a document of a few hundred MB
    /// for a moment; without this the daemon would keep that much resident.
    pub fn release_memory() {
        #[cfg(target_env = "gnu")]
        // SAFETY: malloc_trim only returns free heap memory to the system.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// The first half of [`update`](Self::update): checks for a hand edit,
    /// edits and writes the new version under a temporary name. Nothing is
    /// changed until [`commit`](Self::commit); dropping the result removes
    /// the temporary file. So a caller can stage the file, make its change
    /// elsewhere (the kernel), and only then put the file in place.
    pub fn stage(&mut self, change: Change<'_>) -> Result<Pending> {
        if let (None, Some(names)) = (change.rules, change.interfaces)
            && let Some((text, from, to, len)) = self.spliced_interfaces(names)?
        {
            let after = After::Interfaces { names: names.to_vec(), from, to, len };
            let staged = match self.seen_text() == Some(text.as_str()) {
                true => None,
                false => Some(write::stage(&self.path, text.as_bytes())?),
            };
            return Ok(Pending { staged, text, after, sha: None });
        }
        let (text, config) = self.edited(change)?;
        let old = self.seen_text();
        // Nothing to say that the file (or its absence) does not say already.
        if old == Some(text.as_str()) || (old.is_none() && config == Config::default()) {
            return Ok(Pending { staged: None, text, after: After::Whole(Box::new(config)), sha: None });
        }
        let staged = write::stage(&self.path, text.as_bytes())?;
        Ok(Pending { staged: Some(staged), text, after: After::Whole(Box::new(config)), sha: None })
    }

    /// [`stage`](Self::stage) for a change of a few rules: `edits` (each
    /// key once; `None` removes the rule) made to `before`, the rules the
    /// file holds. Only those rules' text is parsed and rewritten
    /// (`splice.rs`), so the cost does not grow with the file; a layout it
    /// does not handle is edited whole, as [`stage`](Self::stage) does.
    pub fn stage_rules(&mut self, before: &dyn SpecMap, edits: &[(RuleKey, Option<RuleSpec>)]) -> Result<Pending> {
        self.check_unchanged()?;
        match self.spliced(before, edits) {
            Some((text, ops)) => {
                if self.seen_text() == Some(text.as_str()) {
                    return Ok(Pending { staged: None, text, after: After::Edits(ops), sha: None });
                }
                // The new text's sha256 (`status`, the follower) is worked
                // out on another CPU while the write waits for the disk.
                let (staged, sha) = std::thread::scope(|s| {
                    let sha = s.spawn(|| sha256_hex(text.as_bytes()));
                    (write::stage(&self.path, text.as_bytes()), sha.join().ok())
                });
                Ok(Pending { staged: Some(staged?), text, after: After::Edits(ops), sha })
            }
            None => self.stage(Change { rules: Some(&with_edits(before, edits)), interfaces: None, chains: None }),
        }
    }

    /// [`stage_rules`](Self::stage_rules) with the write (and its sync)
    /// on a thread of its own: the owner goes on while the disk works,
    /// and takes the staged file with [`Staging::wait`]. The text is made
    /// (and the file checked for a hand edit) here, by `splice.rs` or, for
    /// a layout it does not handle, the whole document's edit.
    pub fn stage_rules_begin(
        &mut self,
        before: &dyn SpecMap,
        edits: &[(RuleKey, Option<RuleSpec>)],
    ) -> Result<Staging> {
        self.check_unchanged()?;
        let (text, after) = match self.spliced(before, edits) {
            Some((text, ops)) => (text, After::Edits(ops)),
            None => {
                let (text, config) =
                    self.edited(Change { rules: Some(&with_edits(before, edits)), interfaces: None, chains: None })?;
                (text, After::Whole(Box::new(config)))
            }
        };
        let old = self.seen_text();
        // Nothing to say that the file (or its absence) does not say already.
        let nothing = match &after {
            After::Whole(c) => old.is_none() && **c == Config::default(),
            _ => false,
        };
        if old == Some(text.as_str()) || nothing {
            return Ok(Staging(StagingState::Ready(Box::new(Pending { staged: None, text, after, sha: None }))));
        }
        let path = self.path.clone();
        #[cfg(test)]
        let fault = write::FAULT.with(|f| f.get());
        let thread = std::thread::Builder::new().name("policer-write".into()).spawn(move || {
            #[cfg(test)]
            write::FAULT.with(|f| f.set(fault));
            // The sha256 (`status`, the follower) on another CPU while
            // the write waits for the disk.
            let (staged, sha) = std::thread::scope(|s| {
                let sha = s.spawn(|| sha256_hex(text.as_bytes()));
                (write::stage(&path, text.as_bytes()), sha.join().ok())
            });
            (staged, text, sha)
        });
        match thread {
            Ok(thread) => Ok(Staging(StagingState::Writing { thread, after })),
            // No thread to be had: written here.
            Err(_) => self.stage_rules(before, edits).map(|p| Staging(StagingState::Ready(Box::new(p)))),
        }
    }

    /// What [`stage_rules`](Self::stage_rules) checks, with nothing
    /// written: a dry run's.
    pub fn check_stage_rules(&mut self, before: &dyn SpecMap, edits: &[(RuleKey, Option<RuleSpec>)]) -> Result<()> {
        self.check_unchanged()?;
        match self.spliced(before, edits) {
            Some(_) => Ok(()),
            None => {
                self.check_stage(Change { rules: Some(&with_edits(before, edits)), interfaces: None, chains: None })
            }
        }
    }

    /// The file's text with `daemon.interfaces` set by `splice.rs` (after
    /// the check for a hand edit); `None` when it is not for it.
    fn spliced_interfaces(&self, names: &[String]) -> Result<Option<(String, usize, usize, usize)>> {
        let LastSeen::Text(text) = &self.seen else { return Ok(None) };
        if self.layout.is_none() {
            return Ok(None);
        }
        self.check_unchanged()?;
        let Some(out) = splice::splice_interfaces(text, &self.config.daemon, names) else { return Ok(None) };
        #[cfg(test)]
        {
            let whole = edit::edit(
                Some(text),
                &*self.whole_config()?,
                Change { rules: None, interfaces: Some(names), chains: None },
                &self.path,
            );
            assert_eq!(whole.map(|(t, _)| t).ok().as_deref(), Some(out.0.as_str()), "splice.rs and edit.rs disagree");
            SPLICED.with(|n| n.set(n.get() + 1));
        }
        Ok(Some(out))
    }

    /// The file's text with `edits` made by `splice.rs`; `None` when they
    /// are not for it.
    fn spliced(
        &mut self,
        before: &dyn SpecMap,
        edits: &[(RuleKey, Option<RuleSpec>)],
    ) -> Option<(String, Vec<splice::Op>)> {
        let (LastSeen::Text(text), Some(layout)) = (&self.seen, &self.layout) else { return None };
        // What makes the text say exactly what was wanted without a parse
        // of the whole of it: the argument in `splice.rs`'s doc (places cut
        // at outside every string, pieces parsed alone).
        let (out, ops) = splice::splice(text, layout, before, edits)?;
        // The tests make every such edit the whole-document way too: the
        // same bytes, or this path is wrong (an oracle for the tests, not
        // the guard: the guard is the argument above, which costs a few
        // rules' text, where a parse of the whole text costs a second at
        // 100 000 rules).
        #[cfg(test)]
        {
            let whole = edit::edit(
                Some(text),
                &*self.whole_config().ok()?,
                Change { rules: Some(&with_edits(before, edits)), interfaces: None, chains: None },
                &self.path,
            );
            // Line for line, blank lines aside: where a removed rule sat
            // between comment paragraphs, the two may keep a different
            // number of blank lines there (no meaning; both parse to the
            // same document, which the tests check on the file written).
            let lines = |t: &str| t.lines().filter(|l| !l.trim().is_empty()).map(str::to_owned).collect::<Vec<_>>();
            assert_eq!(whole.map(|(t, _)| lines(&t)).ok(), Some(lines(&out)), "splice.rs and edit.rs disagree:\n{out}");
            SPLICED.with(|n| n.set(n.get() + 1));
        }
        Some((out, ops))
    }

    /// What [`ConfigFile::stage`] checks (the file as last read, the
    /// edit), with nothing written: a dry run's.
    pub fn check_stage(&mut self, change: Change<'_>) -> Result<()> {
        self.edited(change).map(|_| ())
    }

    /// The file as last read with `change` made, after the check for a
    /// hand edit: what [`ConfigFile::stage`] writes and a dry run checks.
    fn edited(&mut self, change: Change<'_>) -> Result<(String, Config)> {
        self.check_unchanged()?;
        let whole = self.whole_config()?;
        let edited = edit::edit(self.seen_text(), &whole, change, &self.path);
        Self::release_memory();
        edited
    }

    /// The file's text as last read; `None`: there was none.
    fn seen_text(&self) -> Option<&str> {
        match &self.seen {
            LastSeen::Missing => None,
            LastSeen::Text(t) => Some(t.as_str()),
        }
    }

    /// Puts a staged version in place.
    pub fn commit(&mut self, pending: Pending) -> Result<()> {
        self.commit_begin(pending).map(|sync| sync.map_or((), DirSync::sync))
    }

    /// [`commit`](Self::commit) up to the directory's sync, which is left
    /// to the caller ([`DirSync::sync`], on a thread of its own if it
    /// likes): the new version is in place, and what the daemon knows of
    /// the file follows it, when this returns.
    pub(crate) fn commit_begin(&mut self, pending: Pending) -> Result<Option<DirSync>> {
        let Pending { staged, text, after, sha } = pending;
        let Some(staged) = staged else {
            return Ok(None);
        };
        // Again, now that the new version is ready: an edit saved while we
        // worked must not be overwritten either. Dropping `staged` removes it.
        self.check_unchanged()?;
        let sync = staged.rename()?;
        self.set_seen(LastSeen::Text(text));
        // What was just put in place, stamped now: with fine timestamps an
        // edit from here on changes the stamp.
        if self.fine() {
            self.stamp.set(Stamp::of(&self.path));
        }
        if let Some(sha) = sha {
            let _ = self.sha.set(sha);
        }
        match after {
            After::Whole(config) => self.take_config(*config, None),
            After::Edits(ops) => {
                if let Some(l) = &mut self.layout {
                    ops.iter().for_each(|op| l.apply(op));
                }
            }
            After::Interfaces { names, from, to, len } => {
                self.config.daemon.interfaces = names;
                if let Some(l) = &mut self.layout {
                    l.shift(from, to, len);
                }
            }
        }
        Ok(Some(sync))
    }

    /// The file's bytes now; `None`: there is none.
    fn current(&self) -> Result<Option<Vec<u8>>> {
        match files::read_regular(&self.path, files::CONFIG) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(Error::ConfigWrite {
                path: self.path.clone(),
                what: "reading it to check for edits made by hand".into(),
                source: match e {
                    ReadError::Io(source) => source,
                    other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
                },
            }),
        }
    }

    /// Whether the config's file system timestamps each change on its own
    /// ([`fine_timestamps`], measured once in its directory).
    fn fine(&self) -> bool {
        *self.fine.get_or_init(|| {
            fine_timestamps(self.path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")))
        })
    }

    /// Tests: whether the next hand-edit check goes by the stamp alone.
    #[cfg(test)]
    pub(super) fn stamped(&self) -> bool {
        self.stamp.get().is_some()
    }

    /// Whether the file on disk holds what the daemon last read or wrote:
    /// its stamp as when it last did (and that stamp would have shown an
    /// edit since), or else its bytes, read and compared (then its stamp
    /// is kept for the next check).
    fn unchanged(&self) -> Result<bool> {
        let known = self.stamp.get();
        let taken = std::time::SystemTime::now();
        let stamp = Stamp::of(&self.path);
        if known.is_some() && stamp == known {
            return Ok(true);
        }
        let now = self.current()?;
        let same = match &self.seen {
            LastSeen::Missing => now.is_none(),
            LastSeen::Text(t) => now.as_deref() == Some(t.as_bytes()),
        };
        // Taken before the read: an edit after it changes the stamp (or
        // the bytes just read).
        if same && let Some(s) = stamp.filter(|s| self.fine() || s.tells_edits_after(taken, &self.path)) {
            self.stamp.set(Some(s));
        }
        Ok(same)
    }

    fn check_unchanged(&self) -> Result<()> {
        if self.unchanged()? { Ok(()) } else { Err(Error::ConfigChanged { path: self.path.clone() }) }
    }
}

#[cfg(test)]
thread_local! {
    /// Changes this thread made by `splice.rs`.
    pub(super) static SPLICED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// `before` with `edits` made.
fn with_edits(before: &dyn SpecMap, edits: &[(RuleKey, Option<RuleSpec>)]) -> BTreeMap<RuleKey, RuleSpec> {
    let mut want = before.specs();
    crate::rules::edit_rules(&mut want, edits);
    want
}

fn read(path: &Path) -> Result<FileSnapshot> {
    snapshot(path, bytes(path)?)
}

/// The file's bytes (a regular file of at most [`files::CONFIG`]'s bound,
/// read without blocking: see `files.rs`); `None`: there is none.
fn bytes(path: &Path) -> Result<Option<Vec<u8>>> {
    match files::read_regular(path, files::CONFIG) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(ReadError::Io(source)) => Err(Error::ConfigRead { path: path.to_path_buf(), source }),
        // What the file is, not a failure to read it: not tried again
        // until it changes.
        Err(e) => Err(Error::Invalid(format!("{} {e}", path.display()))),
    }
}

fn snapshot(path: &Path, bytes: Option<Vec<u8>>) -> Result<FileSnapshot> {
    let Some(bytes) = bytes else {
        return Ok(FileSnapshot {
            config: Config::default(),
            rules: BTreeMap::new(),
            seen: LastSeen::Missing,
            headers: None,
        });
    };
    let text = String::from_utf8(bytes).map_err(|e| {
        Error::Invalid(format!("{}: not UTF-8 text (byte {})", path.display(), e.utf8_error().valid_up_to()))
    })?;
    let (config, rules, headers) = Config::parse_headed(&text, path)?;
    Ok(FileSnapshot { config, rules, seen: LastSeen::Text(text), headers })
}

/// Lower-case hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn read_only(path: &Path) -> bool {
    use std::{ffi::CString, os::unix::ffi::OsStrExt, os::unix::fs::PermissionsExt};
    let writable = |p: &Path| {
        let Ok(c) = CString::new(p.as_os_str().as_bytes()) else { return false };
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
    };
    let (file, exists) = match fs::canonicalize(path) {
        Ok(p) => (p, true),
        Err(_) => (path.to_path_buf(), false),
    };
    if exists {
        // Root passes access(2) on a file without write bits: the mode says
        // what the operator meant. A read-only mount fails access(2) anyway.
        let no_bits = fs::metadata(&file).map(|m| m.permissions().mode() & 0o222 == 0).unwrap_or(false);
        if no_bits || !writable(&file) {
            return true;
        }
    }
    let dir = file.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    dir.exists() && !writable(dir)
}
