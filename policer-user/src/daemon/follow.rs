//! The daemon follows its config file, and applies it only once it is
//! whole.
//!
//! **What counts as "written".** A write in place (`IN_MODIFY`) is never a
//! reason to read the file: a writer that pauses (a slow editor, an scp over
//! a bad link) would have its first half applied. The follower reacts to
//! the file's name being *finished*: closed after writing
//! (`IN_CLOSE_WRITE`), renamed into place (an editor's or `install`'s
//! rename, the kubelet's `..data` swap), created as a symlink, or removed.
//! A writer killed midway also closes the file, so the owner's reload adds
//! a second guard: a reload that would remove most rules or every ban
//! needs the file to end with a newline (see `ruleset.rs`).
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
    collections::{BTreeSet, HashSet, VecDeque},
    ffi::OsString,
    path::{Component, Path, PathBuf},
    time::Duration,
};

use notify::{
    EventKind, Watcher,
    event::{AccessKind, AccessMode, ModifyKind},
};
use tokio::{sync::mpsc, time::Instant};

use super::{Command, Owner};

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
pub(crate) fn chain(config: &Path) -> Vec<(PathBuf, OsString)> {
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

/// Whether an event's kind can mean the file's name now holds a finished
/// file (see the module's doc). Bare writes, opens, reads and attribute
/// changes never do.
fn finishing(kind: &EventKind) -> bool {
    matches!(
        kind,
        EventKind::Access(AccessKind::Close(AccessMode::Write))
            | EventKind::Modify(ModifyKind::Name(_))
            | EventKind::Create(_)
            | EventKind::Remove(_)
            | EventKind::Other
    )
}

/// What the watcher hands the follower: a finishing event's paths, or
/// "look anyway" (the kernel's queue overflowed, or the watcher failed).
enum Seen {
    Paths(EventKind, Vec<PathBuf>),
    Rescan,
}

/// The watched names and directories, kept in step with the chain.
struct Watches {
    config: PathBuf,
    names: HashSet<(PathBuf, OsString)>,
    dirs: BTreeSet<PathBuf>,
}

impl Watches {
    /// Re-resolves the chain and moves the watches to its directories;
    /// says (once per directory) what cannot be watched.
    fn rearm(&mut self, w: &mut impl Watcher) {
        let names: HashSet<_> = chain(&self.config).into_iter().collect();
        let dirs: BTreeSet<PathBuf> = names.iter().map(|(d, _)| d.clone()).collect();
        for gone in self.dirs.difference(&dirs) {
            // Already gone with its directory, often: nothing to say.
            let _ = w.unwatch(gone);
        }
        let mut kept = BTreeSet::new();
        for d in &dirs {
            if self.dirs.contains(d) {
                kept.insert(d.clone());
                continue;
            }
            match w.watch(d, notify::RecursiveMode::NonRecursive) {
                Ok(()) => {
                    kept.insert(d.clone());
                }
                Err(e) => println!(
                    "policer: warning: cannot watch {} ({e}); changes of {} there need `policer reload` or SIGHUP",
                    d.display(),
                    self.config.display()
                ),
            }
        }
        self.names = names;
        self.dirs = kept;
    }

    /// Whether `seen` concerns the config: an event on one of its names, a
    /// watched directory itself going, or a rescan.
    fn concerns(&self, seen: &Seen) -> bool {
        let Seen::Paths(kind, paths) = seen else { return true };
        paths.iter().any(|p| {
            if self.dirs.contains(p) {
                return true;
            }
            let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else { return false };
            if !self.names.contains(&(dir.to_path_buf(), name.to_os_string())) {
                return false;
            }
            // A regular file created under the name is still being written:
            // its close says when it is done. A link or a directory is whole.
            !matches!(kind, EventKind::Create(_))
                || std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink() || m.is_dir())
        })
    }
}

/// Starts following `config`; the watcher lives as long as the task. A
/// directory that cannot be watched is a warning: `policer reload` and
/// SIGHUP still work.
pub(super) fn start(owner: Owner, config: &Path) {
    let (tx, mut rx) = mpsc::channel::<Seen>(1024);
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        let seen = match ev {
            Ok(e) if e.need_rescan() => Seen::Rescan,
            Ok(e) if finishing(&e.kind) => Seen::Paths(e.kind, e.paths),
            Ok(_) => return,
            Err(_) => Seen::Rescan,
        };
        // A full queue: the follower is behind; a rescan says "look".
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(seen) {
            let _ = tx.try_send(Seen::Rescan);
        }
    });
    let mut watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            println!(
                "policer: warning: cannot follow {} ({e}); config changes need `policer reload` or SIGHUP",
                config.display()
            );
            return;
        }
    };
    let mut watches = Watches { config: config.to_path_buf(), names: HashSet::new(), dirs: BTreeSet::new() };
    watches.rearm(&mut watcher);
    tokio::spawn(async move {
        let mut retry: Option<Duration> = None;
        loop {
            // Wait for a finishing event on the config's names, or for the
            // time to try a failed reload again.
            let woke = match retry {
                Some(after) => tokio::select! {
                    s = rx.recv() => s.map(Some),
                    () = tokio::time::sleep(after) => Some(None),
                },
                None => rx.recv().await.map(Some),
            };
            let Some(seen) = woke else { return };
            if let Some(seen) = seen {
                if !watches.concerns(&seen) {
                    continue;
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
            }
            watches.rearm(&mut watcher);
            match owner.ask(Command::Follow).await.result {
                Ok(m) => {
                    retry = None;
                    if !m.is_empty() {
                        println!("policer: config file changed: {m}");
                    }
                }
                Err(e) => {
                    let after = retry.map_or(RETRY_MIN, |r| (r * 2).min(RETRY_MAX));
                    println!(
                        "policer: config file changed: not applied, the running rules stay: {e} (looking again in {} s)",
                        after.as_secs()
                    );
                    retry = Some(after);
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
    fn only_finished_names_of_the_chain_concern_the_config() {
        let d = tmp("concerns");
        std::fs::write(d.join("config.toml"), "").unwrap();
        std::fs::write(d.join("other.toml"), "").unwrap();
        let names: HashSet<_> = chain(&d.join("config.toml")).into_iter().collect();
        let w = Watches { config: d.join("config.toml"), dirs: [d.clone()].into(), names };
        let ev = |kind, p: &str| Seen::Paths(kind, vec![d.join(p)]);
        let close = EventKind::Access(AccessKind::Close(AccessMode::Write));
        assert!(w.concerns(&ev(close, "config.toml")));
        assert!(!w.concerns(&ev(close, "other.toml")), "a file next to it");
        assert!(!finishing(&EventKind::Modify(ModifyKind::Data(notify::event::DataChange::Any))), "a bare write");
        let created = EventKind::Create(notify::event::CreateKind::File);
        assert!(!w.concerns(&ev(created, "config.toml")), "a regular file just created is still being written");
        assert!(w.concerns(&ev(EventKind::Modify(ModifyKind::Name(notify::event::RenameMode::To)), "config.toml")));
        assert!(w.concerns(&Seen::Rescan));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
