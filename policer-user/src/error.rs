//! The library's one error type. Binaries wrap it in `anyhow`.

use std::{io, path::PathBuf};

use aya::{EbpfError, maps::MapError, programs::ProgramError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown interface '{0}' (see `ip link`)")]
    UnknownInterface(String),
    #[error("interface '{0}' is given twice")]
    DuplicateInterface(String),
    #[error("permission denied: {0} needs root (CAP_BPF and CAP_NET_ADMIN); try `sudo policer ...`")]
    NotRoot(&'static str),
    /// `what`: the program there, as [`crate::daemon::describe_program`]
    /// names it.
    #[error(
        "{iface}: another XDP program is already attached: {what}. policer neither replaces nor removes a program \
         it did not load, and an interface takes one XDP program (policer cannot join a libxdp dispatcher yet): \
         police another interface, or have that program's owner move it (`bpftool prog show id ID` says more)"
    )]
    AlreadyAttached { iface: String, what: String },
    #[error("{iface}: the driver does not support {mode} XDP (try --mode skb)")]
    ModeUnsupported { iface: String, mode: &'static str },
    #[error("cannot load the XDP program: {0}")]
    Load(#[source] Box<EbpfError>),
    #[error("cannot prepare the XDP program: {0}")]
    Program(#[source] Box<ProgramError>),
    #[error("map {map}: {source}")]
    Map {
        map: &'static str,
        #[source]
        source: Box<MapError>,
    },
    /// A system call on a map or a program failed: what was being done,
    /// and the kernel's error, whose errno callers match on
    /// ([`Error::errno`]), never its text.
    #[error("{what}: {source}")]
    Kernel {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("the XDP object has no {0}")]
    Missing(&'static str),
    #[error("{0}")]
    Invalid(String),
    /// The owner's queue of changes is full: the change was not queued.
    #[error("the daemon is busy (too many changes queued); try again")]
    ChangesQueued,
    /// The daemon is leaving: `note` says whether anything was done.
    #[error("the daemon is shutting down{note}")]
    ShuttingDown { note: &'static str },
    #[error(
        "no policer daemon is running in this network namespace \
         (start one with `policer attach IFACE --rate RATE`)"
    )]
    NoDaemon,
    #[error(
        "a policer daemon is already running in this network namespace (pid {0}); change it with `policer rule ...`, or stop it first"
    )]
    DaemonRunning(String),
    #[error("{0}")]
    Refused(String),
    /// The daemon shed the connection at its cap, before reading the
    /// request: nothing changed.
    #[error("daemon busy: {in_use} of {cap} control connections in use; try again")]
    Busy { in_use: usize, cap: usize },
    /// The daemon answered a request with a reply of another kind: a
    /// daemon of another build speaking the same protocol version.
    #[error("the daemon answered '{got}' to a request for '{want}': is it another version of policer?")]
    UnexpectedReply { want: &'static str, got: &'static str },
    #[error(
        "the daemon did not answer within {secs:.1} s{}",
        if *may_apply { "; the change may still be applied: check with `policer rule ls` / `policer status`" } else { "" }
    )]
    Timeout { secs: f64, may_apply: bool },
    #[error("{iface}: {source}")]
    Netlink {
        iface: String,
        #[source]
        source: NlError,
    },
    /// The config file could not be written; the file is as it was (and
    /// no temporary file is left). Apart from a bad rule ([`Error::Invalid`]),
    /// so the daemon can tell "not persisted" from "not valid".
    #[error("cannot write {}: {what}: {source}; the file was left as it was", path.display())]
    ConfigWrite {
        path: PathBuf,
        /// The step that failed, e.g. "creating a temporary file in /etc/policer".
        what: String,
        #[source]
        source: io::Error,
    },
    /// The config file changed on disk since the daemon last read or wrote
    /// it (a hand edit not yet reloaded): the daemon refuses to overwrite it.
    #[error(
        "{} changed on disk since policer last read it (edited by hand?); nothing was written. \
         Run `policer reload` to apply the file as it is now (or undo the edit), then retry",
        path.display()
    )]
    ConfigChanged { path: PathBuf },
    /// The config file is there but cannot be read now (no fd left, EIO):
    /// a followed reload tries again.
    #[error("cannot read {}: {source}", path.display())]
    ConfigRead { path: PathBuf, source: io::Error },
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Error {
    /// Whether this is "the config file was not written" (it could not be,
    /// or it changed by hand since it was read), as opposed to a bad rule
    /// or a kernel error: what `--runtime` would fall back on.
    pub fn is_config_not_written(&self) -> bool {
        matches!(self, Error::ConfigWrite { .. } | Error::ConfigChanged { .. })
    }

    /// The same error again, for each of several waiters (a group's file
    /// write failed once for all its changes): the config file's errors
    /// keep their kind and errno, so "not persisted" stays apart from "not
    /// valid"; any other keeps its text.
    pub(crate) fn for_each_waiter(&self) -> Error {
        let io = |e: &io::Error| match e.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(e.kind(), e.to_string()),
        };
        match self {
            Error::ConfigWrite { path, what, source } => {
                Error::ConfigWrite { path: path.clone(), what: what.clone(), source: io(source) }
            }
            Error::ConfigChanged { path } => Error::ConfigChanged { path: path.clone() },
            Error::ConfigRead { path, source } => Error::ConfigRead { path: path.clone(), source: io(source) },
            other => Error::Invalid(other.to_string()),
        }
    }

    /// The kernel's errno behind this error, if a system call failed.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Kernel { source, .. } | Error::ConfigRead { source, .. } | Error::Io(source) => {
                source.raw_os_error()
            }
            _ => None,
        }
    }

    /// A failed system call, for `map_err`: `what` says what was being
    /// done ("the rule for 10.0.0.0/8", "reading POLICER_CLASS_FILTER").
    pub(crate) fn kernel(what: impl Into<String>) -> impl FnOnce(io::Error) -> Error {
        let what = what.into();
        move |source| Error::Kernel { what, source }
    }

    pub(crate) fn map(map: &'static str) -> impl FnOnce(MapError) -> Error {
        move |source| Error::Map { map, source: Box::new(source) }
    }
}

/// An rtnetlink error: errno and the kernel's extended-ack message.
#[derive(Debug)]
pub struct NlError {
    pub errno: i32,
    pub msg: Option<String>,
}

impl std::fmt::Display for NlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", io::Error::from_raw_os_error(self.errno))?;
        if let Some(m) = &self.msg {
            write!(f, " ({m})")?;
        }
        Ok(())
    }
}

impl std::error::Error for NlError {}

pub type Result<T, E = Error> = std::result::Result<T, E>;
