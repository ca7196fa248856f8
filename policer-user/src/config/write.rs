//! Replacing the config file safely.
//!
//! The new text goes to a temporary file in the directory of the file it
//! replaces (`rename(2)` is atomic only within one filesystem), made by
//! [`files::create_temp`] (a random name, `O_CREAT|O_EXCL|O_NOFOLLOW`: a
//! name planted in advance, symlink or not, makes the create fail instead
//! of redirecting the write). The temporary file gets the old file's owner and mode (a new
//! file: 0600, owned by the daemon's user), is written and fsynced, renamed
//! over the target, and the directory is fsynced so the rename survives a
//! crash. A symlinked config is written through to the file the link
//! finally points at; the link itself is left alone.
//!
//! On any error before the rename the temporary file is removed (by
//! [`Staged`]'s `Drop`) and the target is untouched.

use std::{
    fs::{self, File},
    io::{self, Write},
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
};

use crate::{
    error::{Error, Result},
    files,
};

pub use crate::files::NEW_FILE_MODE;

/// Symlinks followed at most, as the kernel's MAXSYMLINKS.
const MAX_LINKS: usize = 40;

/// The steps of a write, for fault injection in tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Create,
    Own,
    Write,
    Sync,
    Rename,
}

#[cfg(test)]
thread_local! {
    /// A step that fails, with an errno, in this thread's next writes.
    pub(crate) static FAULT: std::cell::Cell<Option<(Step, i32)>> = const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn fault(step: Step) -> io::Result<()> {
    match FAULT.with(|f| f.get()) {
        Some((s, errno)) if s == step => Err(io::Error::from_raw_os_error(errno)),
        _ => Ok(()),
    }
}

#[cfg(not(test))]
#[inline(always)]
fn fault(_: Step) -> io::Result<()> {
    Ok(())
}

/// A new version of a file, written and synced under a temporary name;
/// [`Staged::commit`] puts it in place, dropping it removes it.
#[derive(Debug)]
pub(crate) struct Staged {
    /// The path as the operator gave it (in messages).
    shown: PathBuf,
    /// The file the path resolves to: what gets replaced.
    target: PathBuf,
    dir: PathBuf,
    /// The temporary file, until it is renamed.
    tmp: Option<PathBuf>,
    /// Open (and so locked: [`files::create_temp`]) until then, so a
    /// starting daemon's cleanup does not take it for a leftover.
    file: File,
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Some(tmp) = self.tmp.take()
            && let Err(e) = fs::remove_file(&tmp)
        {
            log::warn!("cannot remove the temporary file {}: {e}", tmp.display());
        }
    }
}

/// Writes `data` under a temporary name beside the file `path` resolves to.
pub(crate) fn stage(path: &Path, data: &[u8]) -> Result<Staged> {
    let fail = |what: String| move |source| Error::ConfigWrite { path: path.to_path_buf(), what, source };
    let target = resolve(path).map_err(fail("following its symlinks".into()))?;
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "policer.toml".into());
    let old = match fs::metadata(&target) {
        Ok(m) if !m.is_file() => {
            let what = files::kind_of(&m.file_type());
            return Err(fail(format!("{} is {what}, not a regular file", target.display()))(
                io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        Ok(m) => Some(m),
        Err(e) if missing(&e) => {
            fs::create_dir_all(&dir).map_err(fail(format!("creating the directory {}", dir.display())))?;
            None
        }
        Err(e) => return Err(fail(format!("reading the attributes of {}", target.display()))(e)),
    };
    let mode = old.as_ref().map_or(NEW_FILE_MODE, |m| m.mode() & 0o7777);

    let creating = format!("creating a temporary file in {}", dir.display());
    let (tmp, file) =
        fault(Step::Create).and_then(|()| files::create_temp(&dir, &name, mode)).map_err(fail(creating))?;
    // From here on, dropping `staged` removes the temporary file.
    let mut staged = Staged { shown: path.to_path_buf(), target, dir, tmp: Some(tmp), file };
    let file = &mut staged.file;

    // Owner first: chown(2) clears set-id bits, the mode restores them.
    if let Some(m) = &old {
        let (uid, gid) = (m.uid(), m.gid());
        fault(Step::Own)
            .and_then(|()| std::os::unix::fs::fchown(&file, Some(uid), Some(gid)))
            .map_err(fail(format!("giving the new file the owner {uid}:{gid} of the old one")))?;
    }
    // Exactly the old mode, whatever the umask took from the create's.
    fault(Step::Own)
        .and_then(|()| file.set_permissions(fs::Permissions::from_mode(mode)))
        .map_err(fail(format!("giving the new file the mode {mode:04o}")))?;
    fault(Step::Write).and_then(|()| file.write_all(data)).map_err(fail("writing the temporary file".into()))?;
    slow_disk();
    fault(Step::Sync).and_then(|()| file.sync_all()).map_err(fail("syncing the temporary file to disk".into()))?;
    Ok(staged)
}

/// Tests only (policer-user's `test-hooks` feature, like the start's
/// hooks in `daemon/start/hooks.rs`): each sync of a new version of the
/// file, and of its directory after the rename, takes
/// `POLICER_TEST_SLOW_SYNC_MS` longer, a slow disk's, so the tiers can
/// check that no request waits behind it.
#[cfg(feature = "test-hooks")]
fn slow_disk() {
    if let Some(ms) = std::env::var("POLICER_TEST_SLOW_SYNC_MS").ok().and_then(|v| v.parse::<u64>().ok()) {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
fn slow_disk() {}

impl Staged {
    /// Renames the temporary file over the target and syncs the directory.
    #[cfg(test)]
    pub(crate) fn commit(self) -> Result<()> {
        self.rename().map(DirSync::sync)
    }

    /// Renames the temporary file over the target: the new content is in
    /// place. What is left is to sync the directory ([`DirSync::sync`]) so
    /// that the rename survives a power cut.
    pub(crate) fn rename(mut self) -> Result<DirSync> {
        let tmp = self.tmp.clone().expect("staged until committed");
        fault(Step::Rename).and_then(|()| fs::rename(&tmp, &self.target)).map_err(|source| Error::ConfigWrite {
            path: self.shown.clone(),
            what: format!("renaming the new version over {}", self.target.display()),
            source,
        })?;
        self.tmp = None;
        Ok(DirSync { shown: self.shown.clone(), dir: self.dir.clone() })
    }
}

/// The directory of a file just renamed into place, to be synced.
#[derive(Clone, Debug)]
pub(crate) struct DirSync {
    shown: PathBuf,
    dir: PathBuf,
}

impl DirSync {
    /// Syncs the directory. The new content is in place whatever happens
    /// now; a failed sync only means the rename may not survive a power
    /// cut, not a reason to call the change failed (and undo it in the
    /// kernel while the file keeps it): it is said, not returned.
    pub(crate) fn sync(self) {
        slow_disk();
        if let Err(e) = File::open(&self.dir).and_then(|d| d.sync_all()) {
            log::warn!("{}: cannot sync the directory {}: {e}", self.shown.display(), self.dir.display());
        }
    }
}

/// Removes the temporary files of writes of `path` killed midway
/// (`.NAME.<16 hex digits>.tmp` beside the file it resolves to) that no
/// writer holds: what was removed, and what could not be.
pub(crate) fn remove_leftovers(path: &Path) -> (Vec<PathBuf>, Vec<(PathBuf, io::Error)>) {
    let Ok(target) = resolve(path) else { return (Vec::new(), Vec::new()) };
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else { return (Vec::new(), Vec::new()) };
    let dir = if dir.as_os_str().is_empty() { Path::new(".") } else { dir };
    let name = name.to_string_lossy();
    files::remove_leftovers(dir, |n| files::temp_stem(n) == Some(&name))
}

/// The file `path` finally names: its symlinks followed (relative ones from
/// the link's directory), even when the last one dangles (a config to be
/// created).
pub(crate) fn resolve(path: &Path) -> io::Result<PathBuf> {
    let mut p = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        match fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                let to = fs::read_link(&p)?;
                p = match p.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            Ok(_) => return Ok(p),
            Err(e) if missing(&e) => return Ok(p),
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ELOOP))
}

/// No such file: not there, or a directory on the way is not one (then
/// creating the directory says what is wrong).
fn missing(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}
