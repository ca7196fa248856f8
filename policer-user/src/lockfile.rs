//! The per-namespace lock file: one daemon per network namespace, and no
//! lock files left behind.
//!
//! The lock is `flock(2)` on a file in [`crate::control::RUN_DIR`]: the
//! kernel drops it when the holder dies, however it dies, so a file left by
//! a killed daemon is simply reused. A daemon that exits removes its file
//! while it still holds the lock, and [`remove_stale`] removes the files of
//! namespaces whose daemon died (`kill -9`) and that nobody holds.
//!
//! Removing a lock file is safe only with the check [`LockFile::acquire`]
//! makes: after locking, the path must still name the file it locked. A
//! process that opened the file just before its holder removed it, and got
//! the lock on the removed file, sees the mismatch and starts over, so two
//! daemons never both think they hold the lock.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read, Write},
    os::{
        fd::AsRawFd,
        unix::fs::{MetadataExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
    thread,
    time::Duration,
};

use crate::error::{Error, Result};

/// Attempts when the path keeps naming another file than the one locked
/// (each one means another process removed it at just that moment).
const ATTEMPTS: usize = 16;

/// How long a lock held only briefly (by [`remove_stale`] in another
/// daemon) is waited for before it counts as held by a daemon.
const BRIEF_HOLD: Duration = Duration::from_millis(100);
const POLL: Duration = Duration::from_millis(5);

/// A held lock; dropping it removes the file, then releases the lock.
#[derive(Debug)]
pub struct LockFile {
    path: PathBuf,
    file: File,
}

impl LockFile {
    /// Takes the lock at `path`, creating the file (and reusing one left by
    /// a daemon that died); writes our pid into it. Held by a live process:
    /// [`Error::DaemonRunning`] with the pid its file names.
    pub fn acquire(path: &Path) -> Result<LockFile> {
        for _ in 0..ATTEMPTS {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)?;
            if !lock_waiting_briefly(&file)? {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                return Err(Error::DaemonRunning(pid.trim().to_string()));
            }
            if !names(path, &file)? {
                // Removed (or replaced) by its holder between our open and our
                // lock: this lock protects nothing; take the new file's.
                continue;
            }
            file.set_len(0)?;
            writeln!(file, "{}", std::process::id())?;
            return Ok(LockFile { path: path.to_path_buf(), file });
        }
        Err(Error::Invalid(format!("{}: removed and recreated {ATTEMPTS} times while locking it", path.display())))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Still locked while it goes: whoever opened it meanwhile will see
        // that the path no longer names it.
        if names(&self.path, &self.file).unwrap_or(false)
            && let Err(e) = fs::remove_file(&self.path)
        {
            log::warn!("cannot remove the lock file {}: {e}", self.path.display());
        }
    }
}

/// Removes the lock files in `dir` (names ending in `.lock`) that no process
/// holds: those of namespaces whose daemon was killed. Returns how many.
pub fn remove_stale(dir: &Path) -> Result<usize> {
    let entries = match fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut removed = 0;
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "lock") {
            continue;
        }
        let Ok(file) = OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC).open(&path)
        else {
            continue;
        };
        // Held: a live daemon's. Not held: ours now, for the moment it takes
        // to remove it (a daemon starting there waits BRIEF_HOLD for that).
        if try_lock(&file)? && names(&path, &file)? && fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}

/// `flock(LOCK_EX|LOCK_NB)`: whether we got it.
fn try_lock(file: &File) -> Result<bool> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) { Ok(false) } else { Err(e.into()) }
}

fn lock_waiting_briefly(file: &File) -> Result<bool> {
    let mut waited = Duration::ZERO;
    loop {
        if try_lock(file)? {
            return Ok(true);
        }
        if waited >= BRIEF_HOLD {
            return Ok(false);
        }
        thread::sleep(POLL);
        waited += POLL;
    }
}

/// Whether `path` still names the file `file` is open on.
fn names(path: &Path, file: &File) -> Result<bool> {
    let open = file.metadata()?;
    match fs::symlink_metadata(path) {
        Ok(now) => Ok(now.dev() == open.dev() && now.ino() == open.ino()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_holder_and_no_file_left() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ns-1.lock");
        let held = LockFile::acquire(&p).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), format!("{}\n", std::process::id()));
        // flock conflicts between open files, even in one process.
        match LockFile::acquire(&p) {
            Err(Error::DaemonRunning(pid)) => assert_eq!(pid, std::process::id().to_string()),
            other => panic!("second holder: {other:?}"),
        }
        assert_eq!(remove_stale(d.path()).unwrap(), 0, "a held lock is not stale");
        drop(held);
        assert!(!p.exists(), "lock file left behind");
        drop(LockFile::acquire(&p).unwrap());
    }

    #[test]
    fn file_of_a_killed_daemon_is_reused_or_removed() {
        let d = tempfile::tempdir().unwrap();
        // What `kill -9` leaves: the file, its pid, no lock.
        let p = d.path().join("ns-2.lock");
        fs::write(&p, "999999\n").unwrap();
        let held = LockFile::acquire(&p).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), format!("{}\n", std::process::id()));
        drop(held);

        fs::write(d.path().join("ns-3.lock"), "999999\n").unwrap();
        fs::write(d.path().join("ns-3.sock"), "").unwrap();
        let live = LockFile::acquire(&d.path().join("ns-4.lock")).unwrap();
        assert_eq!(remove_stale(d.path()).unwrap(), 1);
        assert!(!d.path().join("ns-3.lock").exists());
        assert!(d.path().join("ns-3.sock").exists(), "not a lock file");
        assert!(live.path().exists(), "a live daemon's lock file was removed");
    }

    #[test]
    fn a_lock_on_a_removed_file_is_not_taken() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("ns-5.lock");
        // Someone opened the file, then it was removed and recreated before
        // they locked it: the path no longer names what they would lock.
        let early = File::create(&p).unwrap();
        fs::remove_file(&p).unwrap();
        let held = LockFile::acquire(&p).unwrap();
        assert!(try_lock(&early).unwrap(), "the old file is a different lock");
        assert!(!names(&p, &early).unwrap(), "so acquire() would start over");
        assert!(names(&p, &held.file).unwrap());
    }
}
