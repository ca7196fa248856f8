//! The daemon follows its config file, and applies it only once it is
//! whole.
//!
//! **What counts as "written".** A write in place (`IN_MODIFY`) is never a
//! reason to read the file: a writer that pauses (a slow editor, an scp over
//! a bad link) would have its first half applied. The follower reacts to
//! the file's name being *finished*: closed after writing
//! (`IN_CLOSE_WRITE`), renamed into place (an editor's or `install`'s
//! rename, the kubelet's `..data` swap), created as a symlink, or removed.
//! A writer killed midway also closes the file, so a followed reload adds
//! a second guard: the file must end as a whole file does, with a newline
//! (`FileSnapshot::check_whole` in `config/file.rs`, which says what a cut at
//! a line's end leaves). A file refused is logged once and looked at again
//! when it changes.
//!
//! **Which names.** Every symlink on the way from the config's path to the
//! file is resolved, and the directory holding each link and the file is
//! watched (`config.toml -> ..data/config.toml`, `..data -> ..2026_…`, or a
//! config linked into a release directory). Only events on those names
//! count: a file saved next to the config never makes it re-read mid-edit.
//! The watches are re-armed after every event, so a swap of a link moves
//! them to the new directory.
//!
//! **Failures.** A read that fails (no fd left, EIO) is retried with
//! backoff until it succeeds, logged each time, and shown as
//! `policer_config_last_reload_success 0` with the reason in `status`.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet, VecDeque},
    ffi::OsString,
    path::{Component, Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use notify::{
    EventKind, Watcher,
    event::{AccessKind, AccessMode, ModifyKind, RenameMode},
};
use tokio::{sync::mpsc, time::Instant};

use super::{Command, Owner};
use crate::error::Error;

/// Quiet time after the last event before the file is looked at: an
/// editor's or the kubelet's steps land together.
const DEBOUNCE: Duration = Duration::from_millis(250);
/// A directory that never goes quiet (another program writing there all
/// the time) still has the config looked at this often.
const DEBOUNCE_MAX: Duration = Duration::from_secs(2);
/// A failed reload is tried again after this, doubling up to
/// [`RETRY_MAX`], until it is applied or refused for its content.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);
/// Symlinks followed on the way to the file at most (the kernel's own
/// limit for a path lookup is 40).
const MAX_LINKS: usize = 40;

/// The names whose change can change what reading `config` yields: each
/// symlink on the way and the file itself, as (directory, name) with the
/// directory resolved. A name that does not exist (yet) ends the walk: its
/// directory is watched for its creation.
fn chain(config: &Path) -> Vec<(PathBuf, OsString)> {
    let abs = if config.is_absolute() {
        config.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")).join(config)
    };
    let mut names = Vec::new();
    let mut at = PathBuf::from("/");
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_front(&mut todo, &abs);
    let mut links = 0;
    while let Some(c) = todo.pop_front() {
        match c.to_str() {
            Some(".") => continue,
            Some("..") => {
                at.pop();
                continue;
            }
            _ => {}
        }
        let next = at.join(&c);
        match std::fs::symlink_metadata(&next) {
            Ok(m) if m.file_type().is_symlink() => {
                names.push((at.clone(), c));
                links += 1;
                let Ok(target) = std::fs::read_link(&next) else { break };
                if links > MAX_LINKS {
                    break;
                }
                if target.is_absolute() {
                    at = PathBuf::from("/");
                }
                push_front(&mut todo, &target);
            }
            Ok(_) if !todo.is_empty() => at = next,
            _ => {
                // The file itself, or a name missing on the way.
                names.push((at.clone(), c));
                break;
            }
        }
    }
    names
}

/// Puts `path`'s components (without the root) in front of `todo`.
fn push_front(todo: &mut VecDeque<OsString>, path: &Path) {
    let parts: Vec<OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            Component::CurDir => Some(".".into()),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    for p in parts.into_iter().rev() {
        todo.push_front(p);
    }
}

/// Whether an event's kind can change what the config's path reads. Bare
/// writes, opens, reads and attribute changes never do.
fn finishing(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Create(_)
            | EventKind::Remove(_)
    )
}

/// What the watcher hands the follower: a finishing event's paths, or
/// "look anyway" (the kernel's queue overflowed, or the watcher failed).
enum WatchEvent {
    Paths(EventKind, Vec<PathBuf>),
    Rescan,
}

/// What an event asks of the follower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Want {
    /// Nothing: not the config's.
    Nothing,
    /// The chain may have changed (a name on it went, or a file was created
    /// and is still being written): move the watches, read nothing.
    Rearm,
    /// A name on the chain now holds something whole: read the file.
    Look,
}

/// The watched names and directories, kept in step with the chain.
struct Watches {
    config: PathBuf,
    names: HashSet<(PathBuf, OsString)>,
    /// Each watched directory with its (device, inode): a directory
    /// replaced under the same path is watched again.
    dirs: BTreeMap<PathBuf, (u64, u64)>,
}

/// A directory's (device, inode).
fn identity(dir: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

impl Watches {
    /// Re-resolves the chain and moves the watches to its directories (and
    /// to a directory now standing where a watched one stood); says what
    /// cannot be watched.
    fn rearm(&mut self, w: &mut impl Watcher) {
        let mut names: HashSet<_> = chain(&self.config).into_iter().collect();
        // The MaxMind DB files of its `[[set]]`s too: a new database is read
        // as a new config is (`Daemon::follow` reloads the sets).
        for db in databases(&self.config) {
            names.extend(chain(&db));
        }
        let wanted: BTreeSet<PathBuf> = names.iter().map(|(d, _)| d.clone()).collect();
        let mut kept = BTreeMap::new();
        for (d, id) in std::mem::take(&mut self.dirs) {
            if wanted.contains(&d) && identity(&d) == Some(id) {
                kept.insert(d, id);
            } else {
                // Gone, moved away, or replaced: its watch (on the old
                // inode) goes; often it went with its directory already.
                let _ = w.unwatch(&d);
            }
        }
        for d in wanted {
            if kept.contains_key(&d) {
                continue;
            }
            let id = identity(&d);
            match (w.watch(&d, notify::RecursiveMode::NonRecursive), id) {
                (Ok(()), Some(id)) => {
                    kept.insert(d, id);
                }
                (Ok(()), None) => {
                    let _ = w.unwatch(&d);
                }
                (Err(e), _) => say!(
                    "policer: warning: cannot watch {} ({e}); changes of {} there need `policer reload` or SIGHUP",
                    d.display(),
                    self.config.display()
                ),
            }
        }
        self.names = names;
        self.dirs = kept;
    }

    fn on_chain(&self, p: &Path) -> bool {
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else { return false };
        self.names.contains(&(dir.to_path_buf(), name.to_os_string()))
    }

    /// What `seen` asks for: a name of the chain finished (closed after
    /// writing, renamed into place, linked, a directory made), a watched
    /// directory itself moved or gone (one may stand in its place), or a
    /// rescan: look. A name of the chain removed or renamed away, or a
    /// regular file just created under it (its close says when it is
    /// whole): move the watches only, for what comes next is a new file
    /// being written.
    fn wants(&self, seen: &WatchEvent) -> Want {
        let WatchEvent::Paths(kind, paths) = seen else { return Want::Look };
        if paths.iter().any(|p| self.dirs.contains_key(p)) {
            return Want::Look;
        }
        let on = |p: Option<&PathBuf>| p.is_some_and(|p| self.on_chain(p));
        match kind {
            EventKind::Access(_) if on(paths.first()) => Want::Look,
            // A rename's event names its source first and its target last.
            EventKind::Modify(ModifyKind::Name(RenameMode::From)) if on(paths.first()) => Want::Rearm,
            EventKind::Modify(ModifyKind::Name(_)) if on(paths.last()) => Want::Look,
            EventKind::Modify(ModifyKind::Name(_)) if on(paths.first()) => Want::Rearm,
            EventKind::Create(_) if on(paths.first()) => {
                let whole = paths.first().and_then(|p| std::fs::symlink_metadata(p).ok());
                if whole.is_some_and(|m| m.file_type().is_symlink() || m.is_dir()) { Want::Look } else { Want::Rearm }
            }
            EventKind::Remove(_) if on(paths.first()) => Want::Rearm,
            _ => Want::Nothing,
        }
    }
}

/// The MaxMind DB files the `[[set]]`s of `config` read: its `mmdb = "…"`
/// lines, found by a scan of its lines (no parse: this runs on the
/// runtime, at every re-arm). Read as the owner reads the config, a
/// regular file only (a FIFO or a device put in its place is not opened:
/// `files::read_regular`), and only up to a size a hand-written config
/// has; none when it does not read. A line that is not a `[[set]]`'s only
/// adds a name to watch.
fn databases(config: &Path) -> Vec<PathBuf> {
    const SMALL: crate::files::Limit = crate::files::Limit { what: "a config file", max_bytes: 4 << 20 };
    let Ok(text) = crate::files::read_regular(config, SMALL) else { return Vec::new() };
    let dir = config.parent().filter(|d| !d.as_os_str().is_empty());
    text.split(|b| *b == b'\n')
        .filter_map(|line| {
            let line = std::str::from_utf8(line).ok()?.trim();
            let rest = line.strip_prefix("mmdb")?.trim_start().strip_prefix('=')?.trim();
            let path = rest.strip_prefix('"')?.split('"').next()?;
            let p = Path::new(path);
            Some(if p.is_absolute() { p.to_path_buf() } else { dir.map_or_else(|| p.to_path_buf(), |d| d.join(p)) })
        })
        .collect()
}

/// Starts following `config`; the watcher lives as long as the task. A
/// directory that cannot be watched is a warning: `policer reload` and
/// SIGHUP still work.
pub(super) fn start(owner: Owner, config: &Path) {
    let (tx, mut rx) = mpsc::channel::<WatchEvent>(1024);
    // Set when an event found the queue full: the follower is behind, and
    // what it missed may have been the config's; it looks once it catches up.
    let missed = Arc::new(AtomicBool::new(false));
    let missed_w = missed.clone();
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let seen = match ev {
            Ok(e) if e.need_rescan() => WatchEvent::Rescan,
            Ok(e) if finishing(&e.kind) => WatchEvent::Paths(e.kind, e.paths),
            Ok(_) => return,
            Err(_) => WatchEvent::Rescan,
        };
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(seen) {
            missed_w.store(true, Ordering::SeqCst);
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            say!(
                "policer: warning: cannot follow {} ({e}); config changes need `policer reload` or SIGHUP",
                config.display()
            );
            return;
        }
    };
    let mut watches = Watches { config: config.to_path_buf(), names: HashSet::new(), dirs: BTreeMap::new() };
    watches.rearm(&mut watcher);
    tokio::spawn(async move {
        // A read that failed is tried again at `retry_at`, after `backoff`.
        let mut backoff = Duration::ZERO;
        let mut retry_at: Option<Instant> = None;
        loop {
            // Wait for an event, or for the time to try a failed read again.
            let want = match retry_at {
                Some(at) => tokio::select! {
                    s = rx.recv() => match s { Some(s) => watches.wants(&s), None => return },
                    () = tokio::time::sleep_until(at) => Want::Look,
                },
                None => match rx.recv().await {
                    Some(s) => watches.wants(&s),
                    None => return,
                },
            };
            let want = if missed.swap(false, Ordering::SeqCst) { Want::Look } else { want };
            match want {
                Want::Nothing => continue,
                Want::Rearm => {
                    watches.rearm(&mut watcher);
                    continue;
                }
                Want::Look => {}
            }
            // Debounce: until quiet for a while (or for long enough).
            let until = Instant::now() + DEBOUNCE_MAX;
            loop {
                let quiet = (Instant::now() + DEBOUNCE).min(until);
                match tokio::time::timeout_at(quiet, rx.recv()).await {
                    Ok(Some(_)) if Instant::now() < until => {}
                    Ok(None) => return,
                    _ => break,
                }
            }
            watches.rearm(&mut watcher);
            match owner.ask(Command::Follow).await.result {
                // Logged by the owner, as a change (`audit.rs`).
                Ok(_) => (backoff, retry_at) = (Duration::ZERO, None),
                // The file could not be read: tried again until it can.
                Err(e @ Error::ConfigRead { .. }) => {
                    backoff = if backoff.is_zero() { RETRY_MIN } else { (backoff * 2).min(RETRY_MAX) };
                    retry_at = Some(Instant::now() + backoff);
                    say!(
                        "policer: config file changed: not applied, the running rules stay: {e} (looking again in {} s)",
                        backoff.as_secs()
                    );
                }
                // Refused for what it says: looked at again when it changes.
                Err(e) => {
                    (backoff, retry_at) = (Duration::ZERO, None);
                    say!("policer: config file changed: not applied, the running rules stay: {e}");
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("policer-follow-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d.canonicalize().unwrap()
    }

    #[test]
    fn a_plain_file_is_its_own_name() {
        let d = tmp("plain");
        std::fs::write(d.join("config.toml"), "").unwrap();
        assert_eq!(chain(&d.join("config.toml")), vec![(d.clone(), "config.toml".into())]);
        // Missing: its directory is watched for its creation.
        assert_eq!(chain(&d.join("nope.toml")), vec![(d.clone(), "nope.toml".into())]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn every_link_of_a_configmap_and_a_release_dir_is_watched() {
        let d = tmp("links");
        // The kubelet's layout.
        std::fs::create_dir(d.join("..2026_1")).unwrap();
        std::fs::write(d.join("..2026_1/config.toml"), "").unwrap();
        symlink("..2026_1", d.join("..data")).unwrap();
        symlink("..data/config.toml", d.join("config.toml")).unwrap();
        assert_eq!(
            chain(&d.join("config.toml")),
            vec![
                (d.clone(), "config.toml".into()),
                (d.clone(), "..data".into()),
                (d.join("..2026_1"), "config.toml".into()),
            ]
        );
        // A config linked into a release directory elsewhere, through an
        // absolute `current` link and a relative `..`.
        let etc = d.join("etc");
        std::fs::create_dir_all(d.join("releases/v2/conf")).unwrap();
        std::fs::create_dir(&etc).unwrap();
        std::fs::write(d.join("releases/v2/conf/p.toml"), "").unwrap();
        symlink(d.join("releases/v2"), d.join("releases/current")).unwrap();
        symlink("../releases/current/conf/../conf/p.toml", etc.join("policer.toml")).unwrap();
        assert_eq!(
            chain(&etc.join("policer.toml")),
            vec![
                (etc.clone(), "policer.toml".into()),
                (d.join("releases"), "current".into()),
                (d.join("releases/v2/conf"), "p.toml".into()),
            ]
        );
        // A loop ends the walk instead of spinning.
        symlink("b", d.join("a")).unwrap();
        symlink("a", d.join("b")).unwrap();
        assert!(chain(&d.join("a")).len() <= MAX_LINKS + 2);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn only_finished_names_of_the_chain_are_read() {
        let d = tmp("concerns");
        std::fs::write(d.join("config.toml"), "").unwrap();
        std::fs::write(d.join("other.toml"), "").unwrap();
        let names: HashSet<_> = chain(&d.join("config.toml")).into_iter().collect();
        let dirs = [(d.clone(), identity(&d).unwrap())].into();
        let w = Watches { config: d.join("config.toml"), dirs, names };
        let ev = |kind, p: &[&str]| WatchEvent::Paths(kind, p.iter().map(|p| d.join(p)).collect());
        let close = EventKind::Access(AccessKind::Close(AccessMode::Write));
        let rename = |m| EventKind::Modify(ModifyKind::Name(m));
        assert_eq!(w.wants(&ev(close, &["config.toml"])), Want::Look);
        assert_eq!(w.wants(&ev(close, &["other.toml"])), Want::Nothing, "a file next to it");
        assert!(!finishing(&EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any))), "a bare write");
        let created = EventKind::Create(notify::event::CreateKind::File);
        assert_eq!(
            w.wants(&ev(created, &["config.toml"])),
            Want::Rearm,
            "a regular file just created is being written"
        );
        assert_eq!(w.wants(&ev(rename(RenameMode::To), &["config.toml"])), Want::Look, "renamed into place");
        assert_eq!(w.wants(&ev(rename(RenameMode::Both), &["x.tmp", "config.toml"])), Want::Look);
        // Renamed or removed away: what comes next is a new file being
        // written, read only once it is closed or renamed in.
        assert_eq!(w.wants(&ev(rename(RenameMode::From), &["config.toml"])), Want::Rearm);
        assert_eq!(w.wants(&ev(rename(RenameMode::Both), &["config.toml", "config.bak"])), Want::Rearm);
        let removed = EventKind::Remove(notify::event::RemoveKind::File);
        assert_eq!(w.wants(&ev(removed, &["config.toml"])), Want::Rearm);
        // The watched directory itself moved or gone: another may stand there.
        assert_eq!(w.wants(&WatchEvent::Paths(rename(RenameMode::From), vec![d.clone()])), Want::Look);
        assert_eq!(w.wants(&WatchEvent::Rescan), Want::Look);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
