//! Files the daemon reads and writes beside the operator's: the config
//! file, the sets' state files, and the lists `policer rule import` reads.
//! One definition of how each is opened.
//!
//! **Reading.** A file is what it claims, of a bounded size: the path is
//! looked at first (a FIFO or a device is refused without being opened:
//! opening a FIFO blocks until a writer comes, and some devices act on an
//! open), then opened with `O_NONBLOCK` and looked at again through the fd
//! (the name may have been swapped in between), and read through
//! `take(max + 1)`: a file that grows while it is read, or one the size
//! lies about, still cannot make the reader take more than its bound.
//!
//! **Writing.** A new version goes to a temporary file beside its final
//! name, `.NAME.<16 hex digits>.tmp`, created with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`: a name planted in advance, symlink or not,
//! makes the create fail (and another random name is tried) instead of
//! redirecting the write. The writer holds an `flock(2)` on it until it is
//! renamed or removed, so the daemon's start, which removes the
//! temporaries of writes killed midway ([`remove_leftovers`]), never takes
//! one another process is still writing.

use std::{
    fs::{self, File, OpenOptions},
    io::{self, Read},
    os::{
        fd::AsRawFd,
        unix::fs::{FileTypeExt, OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

/// What a file is read as: its name in messages and the most bytes read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limit {
    /// "a config file", "a set's state file", "an import list".
    pub what: &'static str,
    pub max_bytes: u64,
}

/// The mode of a config file the daemon creates (and of a set's state
/// file when there is no config file): rules name the operator's
/// networks, which are nobody else's business.
pub const NEW_FILE_MODE: u32 = 0o600;

/// A config file: 256 MiB, room for the most rules a program holds
/// (1 048 576, ~100 bytes each) with their comments.
pub const CONFIG: Limit = Limit { what: "a config file", max_bytes: 256 << 20 };

/// A list `policer rule import` reads: 1 GiB (a million IPv6 prefixes
/// with comments are ~60 MB).
pub const IMPORT: Limit = Limit { what: "an import list", max_bytes: 1 << 30 };

/// A set's state file: the list as imported plus one header line (a name
/// of at most 64 characters and the set's rule).
pub const SET_STATE: Limit = Limit { what: "a set's state file", max_bytes: IMPORT.max_bytes + (64 << 10) };

/// A secret (`api_key_file`, `password_file`): one line.
pub const SECRET: Limit = Limit { what: "a secret's file", max_bytes: 64 << 10 };

/// The CrowdSec feed's state file: 100 000 decisions are ~7 MB.
pub const FEED_STATE: Limit = Limit { what: "a feed's state file", max_bytes: 1 << 30 };

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The system call's error (not found, no permission, EIO, ...).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// "is a FIFO, not a regular file".
    #[error("is {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("is larger than {}, the most policer reads of {}", size(.0.max_bytes), .0.what)]
    TooLarge(Limit),
}

impl ReadError {
    /// Whether there is no such file (for callers that take that as empty).
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Io(e) if e.kind() == io::ErrorKind::NotFound)
    }
}

/// A size as people write it: "256 MiB", "1 GiB", "1024 bytes".
fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 30 => format!("{:.1} GiB ({b} bytes)", b as f64 / (1u64 << 30) as f64),
        b => format!("{b} bytes"),
    }
}

/// What a file that is not a regular one is, as an article and a noun.
pub fn kind_of(t: &fs::FileType) -> &'static str {
    if t.is_file() {
        "a regular file"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_symlink() {
        "a symlink"
    } else {
        "not a file"
    }
}

/// Reads `path` (symlinks followed) if it is a regular file of at most
/// `limit.max_bytes` bytes; never blocks on a FIFO, never reads more than
/// the bound plus one byte.
pub fn read_regular(path: &Path, limit: Limit) -> Result<Vec<u8>, ReadError> {
    // Looked at before it is opened: a FIFO or a device is not opened at all.
    let t = fs::metadata(path)?.file_type();
    if !t.is_file() {
        return Err(ReadError::NotRegular(kind_of(&t)));
    }
    let mut f = OpenOptions::new()
        .read(true)
        // open(2): O_NONBLOCK opens a FIFO without waiting for a writer, in
        // case the name became one since it was looked at; no effect on a
        // regular file's reads.
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return Err(ReadError::NotRegular(kind_of(&m.file_type())));
    }
    if m.len() > limit.max_bytes {
        return Err(ReadError::TooLarge(limit));
    }
    let mut buf = Vec::with_capacity(m.len() as usize);
    (&mut f).take(limit.max_bytes + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit.max_bytes {
        return Err(ReadError::TooLarge(limit));
    }
    Ok(buf)
}

/// Names tried when a random name is taken (only a planted file can make
/// that happen: 64 random bits).
const NAME_TRIES: usize = 8;

#[cfg(test)]
thread_local! {
    /// The random part of this thread's next temporary name, to plant a file at it.
    pub(crate) static NEXT_NAME: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// Writes `value` as JSON to `file`, whole or not at all: a temporary file
/// beside it ([`create_temp`], mode [`NEW_FILE_MODE`]), synced, renamed
/// into place; on a failure the temporary goes and `file` is as it was.
pub fn replace_json(file: &Path, value: &impl serde::Serialize) -> io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("/"));
    fs::create_dir_all(dir)?;
    let stem = file.file_name().and_then(|n| n.to_str()).unwrap_or("state.json");
    let (tmp, f) = create_temp(dir, stem, NEW_FILE_MODE)?;
    let written = (|| {
        let mut w = io::BufWriter::new(f);
        serde_json::to_writer(&mut w, value).map_err(io::Error::other)?;
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        fs::rename(&tmp, file)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// A temporary file beside `stem`'s final name in `dir`:
/// `.STEM.<16 hex digits>.tmp`, new (`O_CREAT|O_EXCL|O_NOFOLLOW`), of mode
/// `mode` less the umask, locked (`flock`) for as long as the returned
/// file is open. The caller renames or removes it.
pub fn create_temp(dir: &Path, stem: &str, mode: u32) -> io::Result<(PathBuf, File)> {
    let mut tries = 0;
    loop {
        let tmp = dir.join(format!(".{stem}.{:016x}.tmp", random_u64()?));
        let opened = OpenOptions::new()
            .write(true)
            // O_CREAT|O_EXCL: never an existing file, and never through a
            // symlink (open(2): "O_EXCL ... symbolic links are not followed").
            .create_new(true)
            .mode(mode & 0o777)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp);
        match opened {
            Ok(f) => {
                // Not blocking: nobody else can have a file we just created
                // open, but for the start's cleanup racing this very line.
                // SAFETY: flock(2) on an fd we own.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                    let e = io::Error::last_os_error();
                    drop(f);
                    let _ = fs::remove_file(&tmp);
                    return Err(e);
                }
                return Ok((tmp, f));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < NAME_TRIES => tries += 1,
            Err(e) => return Err(e),
        }
    }
}

/// The stem of a name [`create_temp`] makes: `.STEM.<16 hex>.tmp` → STEM.
pub fn temp_stem(name: &str) -> Option<&str> {
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (stem, hex) = inner.rsplit_once('.')?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()) && !stem.is_empty()).then_some(stem)
}

/// Removes the regular files in `dir` whose name `ours` accepts and that
/// no writer holds (its `flock`): the temporaries of writes killed midway.
/// What was removed, and what could not be (with why). A missing `dir` has
/// none.
pub fn remove_leftovers(dir: &Path, ours: impl Fn(&str) -> bool) -> (Vec<PathBuf>, Vec<(PathBuf, io::Error)>) {
    let (mut removed, mut failed) = (Vec::new(), Vec::new());
    let Ok(entries) = fs::read_dir(dir) else {
        return (removed, failed);
    };
    for ent in entries.flatten() {
        let name = ent.file_name();
        let Some(name) = name.to_str() else { continue };
        // file_type() is lstat's: a symlink at such a name is left alone.
        if !ours(name) || !ent.file_type().is_ok_and(|t| t.is_file()) {
            continue;
        }
        let p = ent.path();
        let r = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(&p)
            .and_then(|f| {
                // SAFETY: flock(2) on an fd we own.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                // Removed while locked: no writer can take it meanwhile.
                fs::remove_file(&p)
            });
        match r {
            Ok(()) => removed.push(p),
            // A writer holds it: a write in progress, not a leftover.
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => failed.push((p, e)),
        }
    }
    removed.sort();
    (removed, failed)
}

/// 64 random bits from getrandom(2).
pub fn random_u64() -> io::Result<u64> {
    #[cfg(test)]
    if let Some(n) = NEXT_NAME.with(|c| c.take()) {
        return Ok(n);
    }
    let mut b = [0u8; 8];
    // SAFETY: getrandom(2) writes at most b.len() bytes into b, which we own.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(if n < 0 { io::Error::last_os_error() } else { io::Error::from_raw_os_error(libc::EIO) });
    }
    Ok(u64::from_ne_bytes(b))
}

#[cfg(test)]
mod tests;
