//! The library's one error type. Binaries wrap it in `anyhow`.

use std::io;

use aya::{EbpfError, maps::MapError, programs::ProgramError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("unknown interface '{0}' (see `ip link`)")]
    UnknownInterface(String),
    #[error("interface '{0}' is given twice")]
    DuplicateInterface(String),
    #[error("permission denied: {0} needs root (CAP_BPF and CAP_NET_ADMIN); try `sudo policer ...`")]
    NotRoot(&'static str),
    #[error(
        "{iface}: another XDP program is already attached; policer will not replace it \
         (inspect with `ip link show dev {iface}`, remove with `ip link set dev {iface} xdp off`)"
    )]
    AlreadyAttached { iface: String },
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
    #[error("the XDP object has no {0}")]
    Missing(&'static str),
    #[error("{0}")]
    Invalid(String),
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
    #[error(
        "the daemon did not answer within {secs:.1} s{}",
        if *may_apply { "; the change may still be applied: check with `policer rule ls` / `policer status`" } else { "" }
    )]
    Timeout { secs: f64, may_apply: bool },
    #[error("{iface}: {source}")]
    Netlink {
        iface: String,
        #[source]
        source: crate::netlink::NlError,
    },
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl Error {
    pub(crate) fn map(map: &'static str) -> impl FnOnce(MapError) -> Error {
        move |source| Error::Map { map, source: Box::new(source) }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
