//! The control channel between the CLI and the running daemon: a Unix
//! socket under /run (shared by every `ip netns exec`, unlike /sys), one
//! per network namespace, mode 0600 so only root may change rules. One
//! JSON request per connection, one JSON response.

use std::{
    io::{BufRead, BufReader, Write},
    os::{linux::fs::MetadataExt, unix::net::UnixStream},
    path::PathBuf,
    time::Duration,
};

use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    rules::RuleConfig,
};

pub const RUN_DIR: &str = "/run/policer";

/// Identifies the caller's network namespace: a daemon and the CLIs that
/// talk to it must be in the same one (`ip netns exec NS policer ...`).
pub fn netns_id() -> Result<u64> {
    Ok(std::fs::metadata("/proc/self/ns/net")?.st_ino())
}

pub fn socket_path() -> Result<PathBuf> {
    Ok(PathBuf::from(RUN_DIR).join(format!("ns-{}.sock", netns_id()?)))
}

pub fn lock_path() -> Result<PathBuf> {
    Ok(PathBuf::from(RUN_DIR).join(format!("ns-{}.lock", netns_id()?)))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    RuleSet { rule: RuleConfig },
    RuleRm { prefix: String },
    RuleLs,
    Detach { iface: String },
    Reload,
    Status,
}

/// A rule with every default filled in, as `rule ls` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleView {
    pub prefix: String,
    pub action: String,
    /// None for allow/deny rules without a rate.
    pub rate: Option<String>,
    pub burst: Option<u64>,
    /// "packets" or "bytes".
    pub unit: String,
    pub key_len: u32,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StatusView {
    pub pid: u32,
    pub interfaces: Vec<String>,
    pub config: String,
    pub rules: usize,
    pub persist: bool,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleView>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<StatusView>,
}

impl Response {
    pub fn ok(message: impl Into<String>) -> Response {
        Response { ok: true, message: Some(message.into()), ..Default::default() }
    }

    pub fn err(e: impl std::fmt::Display) -> Response {
        Response { ok: false, error: Some(e.to_string()), ..Default::default() }
    }
}

/// Sends one request to the daemon of this network namespace.
pub fn call(req: &Request) -> Result<Response> {
    let path = socket_path()?;
    let stream = UnixStream::connect(&path).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) | Some(libc::ECONNREFUSED) => Error::NoDaemon,
        Some(libc::EACCES) | Some(libc::EPERM) => Error::NotRoot("talking to the policer daemon"),
        _ => Error::Io(e),
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut w = &stream;
    let mut line = serde_json::to_string(req).map_err(|e| Error::Invalid(e.to_string()))?;
    line.push('\n');
    w.write_all(line.as_bytes())?;
    let mut resp = String::new();
    BufReader::new(&stream).read_line(&mut resp)?;
    serde_json::from_str(&resp).map_err(|e| Error::Invalid(format!("bad reply from the daemon: {e}")))
}
