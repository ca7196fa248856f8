//! CrowdSec's Local API as a decision feed: what `[crowdsec]` in the
//! config says, and the decisions in force — a pure state machine, tested
//! without a network. The daemon's side (pulling the stream, applying the
//! set, publishing automatic bans) is `daemon/crowdsec.rs`.
//!
//! The stream (`GET /v1/decisions/stream?startup=true|false`, header
//! `X-Api-Key`) answers `{"new": [...], "deleted": [...]}`, each decision
//! `{"id", "origin", "type", "scope", "value", "duration", "scenario"}`;
//! `duration` is what is left of it, in Go's notation (`3h59m58.9s`).
//! A startup pull is the whole truth and replaces what is held; later
//! pulls are the changes since the last one. Each decision ends at its own
//! end, whatever the feed says later; a value is in the set while any of
//! its decisions is in force.

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    time::Duration,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where the bouncer's decisions go unless `set` says otherwise.
pub const DEFAULT_SET: &str = "crowdsec";
/// How often the stream is pulled unless `update_frequency` says otherwise.
pub const DEFAULT_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
/// Ranges wider than these are refused (counted `too_wide`): a decision of
/// `0.0.0.0/0` must not drop the world. `min_prefix_len` changes them.
pub const DEFAULT_MIN_PREFIX_V4: u8 = 8;
pub const DEFAULT_MIN_PREFIX_V6: u8 = 32;

/// `[crowdsec]`: the Local API to pull decisions from (and, with
/// `publish`, to post automatic bans to).
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CrowdsecConfig {
    /// `http://127.0.0.1:8080/` (plain HTTP: a Local API on the node, or
    /// reached through a tunnel or proxy that does TLS).
    pub lapi_url: String,
    /// The bouncer key (`cscli bouncers add NAME -o raw`), or a file that
    /// holds it (read at start; the key never appears in logs or views).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_file: Option<String>,
    /// `10s` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update_frequency: Option<String>,
    /// Decisions of these origins only (`crowdsec`, `cscli`, `lists`, ...);
    /// empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub origins: Vec<String>,
    /// `ip` and `range` (the default: both); other scopes are counted and
    /// skipped.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// Decisions whose scenario contains one of these (`scenarios` is the
    /// same list under a shorter name; both may be given).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios_containing: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scenarios_not_containing: Vec<String>,
    /// Decision types applied (default `["ban"]`); others (`captcha`,
    /// `throttle`) are counted and skipped, never dropped silently.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// What the set does to them: `deny` (default) or `monitor` (counts
    /// what would be dropped, drops nothing).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<String>,
    /// The set's name (default `crowdsec`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set: Option<String>,
    /// The shortest prefix a range may have, per family (default 8 and 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_prefix_len_v4: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_prefix_len_v6: Option<u8>,
    /// Post this daemon's automatic bans to the Local API as alerts, so
    /// every bouncer of the fleet enforces them; needs a machine's login.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub publish: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
}

impl std::fmt::Debug for CrowdsecConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key and the password stay out of every log line.
        f.debug_struct("CrowdsecConfig")
            .field("lapi_url", &self.lapi_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "(hidden)"))
            .field("api_key_file", &self.api_key_file)
            .field("update_frequency", &self.update_frequency)
            .field("set", &self.set)
            .field("publish", &self.publish)
            .field("machine_id", &self.machine_id)
            .finish_non_exhaustive()
    }
}

/// The keys of `[crowdsec]`, for messages.
pub const KEYS: &str = "lapi_url, api_key, api_key_file, update_frequency, origins, scopes, scenarios, scenarios_containing, \
                        scenarios_not_containing, types, action, set, min_prefix_len_v4, min_prefix_len_v6, \
                        publish, machine_id, password, password_file";

/// A parsed `lapi_url`: host, port and the path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub host: String,
    pub port: u16,
    /// Ends with `/`.
    pub base: String,
}

impl Url {
    pub fn parse(s: &str) -> Result<Url> {
        let bad = |why: &str| {
            Error::Invalid(format!(
                "crowdsec.lapi_url: {:?} {why}; write lapi_url = \"http://127.0.0.1:8080/\"",
                crate::text::escaped(s)
            ))
        };
        if s.starts_with("https://") {
            return Err(bad("is HTTPS, which policer does not speak: use the Local API on the node, or a local TLS \
                 proxy or tunnel to a remote one"));
        }
        let rest = s.strip_prefix("http://").ok_or_else(|| bad("is not an http:// URL"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("has no host (or has credentials in it)"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6.split_once(']').ok_or_else(|| bad("has an unclosed '['"))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| bad("has a bad port"))?,
                None if after.is_empty() => 80,
                None => return Err(bad("has a bad port")),
            };
            (h.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p.parse().map_err(|_| bad("has a bad port"))?),
                None => (authority.to_string(), 80),
            }
        };
        if host.is_empty() || path.contains(['?', '#']) {
            return Err(bad("has no host, or a query"));
        }
        let base = if path.ends_with('/') { path.to_string() } else { format!("{path}/") };
        Ok(Url { host, port, base })
    }

    /// `host:port` to connect to, and the Host header.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// `[crowdsec]` checked and with its defaults: what the daemon runs.
#[derive(Clone, PartialEq, Eq)]
pub struct Settings {
    pub url: Url,
    pub url_text: String,
    pub api_key: String,
    pub every: Duration,
    pub origins: Vec<String>,
    pub scopes: Vec<String>,
    pub scenarios_containing: Vec<String>,
    pub scenarios_not_containing: Vec<String>,
    pub types: Vec<String>,
    pub action: policer_common::bucket::Action,
    pub set: String,
    pub min_v4: u8,
    pub min_v6: u8,
    /// machine id and password, with `publish`.
    pub publish: Option<(String, String)>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings").field("url", &self.url_text).field("set", &self.set).finish_non_exhaustive()
    }
}

fn lower(v: &[String]) -> Vec<String> {
    v.iter().map(|s| s.to_ascii_lowercase()).collect()
}

/// A secret given inline or in a file (the file's first line, trimmed).
fn secret(inline: &Option<String>, file: &Option<String>, what: &str, base: &std::path::Path) -> Result<String> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(Error::Invalid(format!("crowdsec: give {what} or {what}_file, not both"))),
        (Some(k), None) if !k.trim().is_empty() => Ok(k.trim().to_string()),
        (None, Some(f)) => {
            let p = base.join(f);
            let bytes = crate::files::read_regular(&p, crate::files::SECRET)
                .map_err(|e| Error::Invalid(format!("crowdsec.{what}_file: cannot read {}: {e}", p.display())))?;
            let text = String::from_utf8_lossy(&bytes);
            let k = text.lines().next().unwrap_or("").trim().to_string();
            if k.is_empty() {
                return Err(Error::Invalid(format!("crowdsec.{what}_file: {} is empty", p.display())));
            }
            Ok(k)
        }
        _ => Err(Error::Invalid(format!("crowdsec: {what} (or {what}_file) is needed"))),
    }
}

impl CrowdsecConfig {
    /// Checks every value and reads the secrets' files (relative paths are
    /// from `base`, the config file's directory). The errors never quote a
    /// secret.
    pub fn settings(&self, base: &std::path::Path) -> Result<Settings> {
        let url = Url::parse(&self.lapi_url)?;
        let api_key = secret(&self.api_key, &self.api_key_file, "api_key", base)?;
        if api_key.contains(|c: char| c.is_control() || c == ' ') {
            return Err(Error::Invalid("crowdsec: the API key holds spaces or control characters".into()));
        }
        let every = match &self.update_frequency {
            None => DEFAULT_UPDATE_FREQUENCY,
            Some(t) => {
                let d = crate::duration::parse(t)
                    .map_err(|e| Error::Invalid(format!("crowdsec.update_frequency: {e}; write \"10s\"")))?;
                if d < Duration::from_secs(1) || d > Duration::from_secs(3600) {
                    return Err(Error::Invalid(format!(
                        "crowdsec.update_frequency: {t:?} is not between 1s and 1h; write \"10s\""
                    )));
                }
                d
            }
        };
        let scopes = if self.scopes.is_empty() { vec!["ip".into(), "range".into()] } else { lower(&self.scopes) };
        if let Some(s) = scopes.iter().find(|s| !["ip", "range"].contains(&s.as_str())) {
            return Err(Error::Invalid(format!(
                "crowdsec.scopes: {s:?} is not a scope policer enforces; write scopes = [\"ip\", \"range\"]"
            )));
        }
        let types = if self.types.is_empty() { vec!["ban".into()] } else { lower(&self.types) };
        use policer_common::bucket::Action;
        let action = match self.action.as_deref().unwrap_or("deny") {
            "deny" => Action::Deny,
            "monitor" => Action::Monitor,
            other => {
                return Err(Error::Invalid(format!(
                    "crowdsec.action: {other:?} is not deny or monitor; write action = \"deny\""
                )));
            }
        };
        let set = self.set.clone().unwrap_or_else(|| DEFAULT_SET.into());
        crate::sets::check_name(&set).map_err(|e| Error::Invalid(format!("crowdsec.set: {e}")))?;
        let min_v4 = self.min_prefix_len_v4.unwrap_or(DEFAULT_MIN_PREFIX_V4);
        let min_v6 = self.min_prefix_len_v6.unwrap_or(DEFAULT_MIN_PREFIX_V6);
        if min_v4 > 32 || min_v6 > 128 {
            return Err(Error::Invalid("crowdsec: min_prefix_len_v4 is at most 32, min_prefix_len_v6 128".into()));
        }
        let publish = if self.publish {
            let id = self
                .machine_id
                .clone()
                .filter(|m| !m.trim().is_empty())
                .ok_or_else(|| Error::Invalid("crowdsec: publish = true needs machine_id (and password)".into()))?;
            Some((id, secret(&self.password, &self.password_file, "password", base)?))
        } else {
            if self.machine_id.is_some() || self.password.is_some() || self.password_file.is_some() {
                return Err(Error::Invalid(
                    "crowdsec: machine_id and password are for publish = true; set it, or remove them".into(),
                ));
            }
            None
        };
        Ok(Settings {
            url,
            url_text: self.lapi_url.clone(),
            api_key,
            every,
            origins: self.origins.clone(),
            scopes,
            scenarios_containing: self.scenarios.iter().chain(&self.scenarios_containing).cloned().collect(),
            scenarios_not_containing: self.scenarios_not_containing.clone(),
            types,
            action,
            set,
            min_v4,
            min_v6,
            publish,
        })
    }
}

/// Percent-encodes a query value (RFC 3986 unreserved kept).
fn enc(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl Settings {
    /// The stream's path and query: the filters go to the Local API too
    /// (it sends less), and are checked again here.
    pub fn stream_path(&self, startup: bool) -> String {
        let mut q =
            format!("{}v1/decisions/stream?startup={startup}&scopes={}", self.url.base, enc(&self.scopes.join(",")));
        for (k, v) in [
            ("origins", &self.origins),
            ("scenarios_containing", &self.scenarios_containing),
            ("scenarios_not_containing", &self.scenarios_not_containing),
        ] {
            if !v.is_empty() {
                q.push_str(&format!("&{k}={}", enc(&v.join(","))));
            }
        }
        q
    }
}

/// One decision as the stream sends it. Every field may be missing or odd:
/// a decision that cannot be read is counted, never applied.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Decision {
    #[serde(default)]
    pub id: Option<i64>,
    #[serde(default)]
    pub origin: Option<String>,
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub value: Option<String>,
    #[serde(default)]
    pub duration: Option<String>,
    #[serde(default)]
    pub scenario: Option<String>,
}

/// The stream's reply; `null` lists are empty.
#[derive(Debug, Default, Deserialize)]
pub struct StreamReply {
    #[serde(default, deserialize_with = "null_is_empty")]
    pub new: Vec<Decision>,
    #[serde(default, deserialize_with = "null_is_empty")]
    pub deleted: Vec<Decision>,
}

fn null_is_empty<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Vec<Decision>, D::Error> {
    Ok(Option::<Vec<Decision>>::deserialize(d)?.unwrap_or_default())
}

/// Go's `time.Duration` text (`3h59m58.123s`, `-1.5s`, `250ms`, `0s`):
/// seconds, negative for a decision already over.
pub fn go_duration(s: &str) -> Option<f64> {
    let (neg, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Some(0.0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if n == 0 {
            return None;
        }
        let v: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" | "μs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        rest = &rest[u..];
        total += v * unit;
    }
    Some(if neg { -total } else { total })
}

/// The `reason`s of skipped decisions that do not depend on what a feed
/// sends (`type:X` and `scope:X` do): `/metrics` shows each from the start,
/// at 0, so a `rate()` of them has a series before the first skip.
pub const SKIP_REASONS: &[&str] = &["origin", "scenario", "invalid_value", "too_wide", "over"];

/// The `kind`s of errors that do not depend on the answer (`http_NNN`
/// does), shown from the start at 0 for the same reason.
pub const ERROR_KINDS: &[&str] =
    &["connect", "timeout", "body", "parse", "apply", "save", "login", "publish", "publish_dropped"];

/// Why a decision was not applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    Type(String),
    Scope(String),
    Origin,
    Scenario,
    InvalidValue,
    TooWide,
    /// Its duration was over (or unreadable) when it arrived.
    Over,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Skip::Type(t) => write!(f, "type:{t}"),
            Skip::Scope(s) => write!(f, "scope:{s}"),
            Skip::Origin => f.write_str("origin"),
            Skip::Scenario => f.write_str("scenario"),
            Skip::InvalidValue => f.write_str("invalid_value"),
            Skip::TooWide => f.write_str("too_wide"),
            Skip::Over => f.write_str("over"),
        }
    }
}

/// A label-safe short form of a feed's word (a type or a scope).
fn word(s: &str) -> String {
    let w: String = s.chars().take(32).filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-').collect();
    if w.is_empty() { "unknown".into() } else { w.to_ascii_lowercase() }
}

/// A decision in force.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub net: IpNet,
    /// Unix ms.
    pub until_ms: u64,
    pub origin: String,
}

/// What one pull changed.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    pub added: usize,
    pub deleted: usize,
    pub skipped: Vec<(Skip, Option<String>)>,
    /// The set's prefixes changed (an import is due).
    pub changed: bool,
}

/// The decisions in force, by id (a decision without an id is keyed by a
/// number of its own, below zero).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Store {
    pub held: HashMap<i64, Held>,
    #[serde(skip)]
    anon: i64,
}

impl Store {
    /// The value of `d` if it is applied under `s`, else why not.
    pub fn admit(s: &Settings, d: &Decision) -> std::result::Result<IpNet, Skip> {
        let kind = d.kind.as_deref().unwrap_or("").to_ascii_lowercase();
        if !s.types.contains(&kind) {
            return Err(Skip::Type(word(&kind)));
        }
        let scope = d.scope.as_deref().unwrap_or("").to_ascii_lowercase();
        if !s.scopes.contains(&scope) {
            return Err(Skip::Scope(word(&scope)));
        }
        let origin = d.origin.as_deref().unwrap_or("");
        if !s.origins.is_empty() && !s.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            return Err(Skip::Origin);
        }
        let scenario = d.scenario.as_deref().unwrap_or("");
        if (!s.scenarios_containing.is_empty() && !s.scenarios_containing.iter().any(|c| scenario.contains(c.as_str())))
            || s.scenarios_not_containing.iter().any(|c| scenario.contains(c.as_str()))
        {
            return Err(Skip::Scenario);
        }
        let value = d.value.as_deref().unwrap_or("").trim();
        // An address, or a prefix: `cscli decisions import` stores a
        // CIDR under the Ip scope, and a Range may be written as a host.
        let net = match value.parse::<IpAddr>() {
            Ok(a) => IpNet::from(a),
            Err(_) => value.parse::<IpNet>().map_err(|_| Skip::InvalidValue)?.trunc(),
        };
        // `::ffff:a.b.c.d` is the IPv4 source it names.
        let net = match crate::prefix::unmap(net.addr(), net.prefix_len()) {
            Ok(Some((v4, len))) => IpNet::V4(ipnet::Ipv4Net::new(v4, len).map_err(|_| Skip::InvalidValue)?),
            Ok(None) => net,
            Err(_) => return Err(Skip::InvalidValue),
        };
        let min = if net.addr().is_ipv4() { s.min_v4 } else { s.min_v6 };
        if net.prefix_len() < min {
            return Err(Skip::TooWide);
        }
        Ok(net)
    }

    /// Applies a pull received at `now_ms`. A startup pull replaces what is
    /// held; a later one removes its `deleted` (by id; by value when the
    /// id is missing) and adds its `new`.
    pub fn apply(&mut self, s: &Settings, reply: &StreamReply, startup: bool, now_ms: u64) -> Applied {
        let before = self.prefixes();
        let mut a = Applied::default();
        if startup {
            a.deleted = self.held.len();
            self.held.clear();
        } else {
            for d in &reply.deleted {
                match d.id {
                    Some(id) => a.deleted += usize::from(self.held.remove(&id).is_some()),
                    None => {
                        let v = d.value.as_deref().unwrap_or("");
                        let n = self.held.len();
                        self.held.retain(|_, h| h.net.to_string() != v && h.net.addr().to_string() != v);
                        a.deleted += n - self.held.len();
                    }
                }
            }
        }
        for d in &reply.new {
            let secs = d.duration.as_deref().and_then(go_duration);
            let net = match (Store::admit(s, d), secs) {
                (Err(why), _) => {
                    a.skipped.push((why, d.value.clone()));
                    continue;
                }
                (Ok(_), None) => {
                    a.skipped.push((Skip::InvalidValue, d.duration.clone()));
                    continue;
                }
                (Ok(_), Some(t)) if t <= 0.0 => {
                    a.skipped.push((Skip::Over, None));
                    continue;
                }
                (Ok(n), Some(_)) => n,
            };
            let until_ms = now_ms.saturating_add((secs.unwrap_or(0.0) * 1000.0) as u64);
            let id = d.id.unwrap_or_else(|| {
                self.anon -= 1;
                self.anon
            });
            let origin = word(d.origin.as_deref().unwrap_or(""));
            self.held.insert(id, Held { net, until_ms, origin });
            a.added += 1;
        }
        a.changed = self.prefixes() != before;
        a
    }

    /// Removes the decisions whose end has come; how many.
    pub fn expire(&mut self, now_ms: u64) -> usize {
        let n = self.held.len();
        self.held.retain(|_, h| h.until_ms > now_ms);
        n - self.held.len()
    }

    /// The next end of a decision, Unix ms.
    pub fn next_end(&self) -> Option<u64> {
        self.held.values().map(|h| h.until_ms).min()
    }

    /// The set's entries: each value in force once, sorted.
    pub fn prefixes(&self) -> Vec<IpNet> {
        let mut v: Vec<IpNet> = self.held.values().map(|h| h.net).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    pub fn by_origin(&self) -> BTreeMap<String, u64> {
        let mut m = BTreeMap::new();
        for h in self.held.values() {
            *m.entry(h.origin.clone()).or_insert(0) += 1;
        }
        m
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn the_fixed_skip_reasons_are_those_skips_print() {
        let fixed = [Skip::Origin, Skip::Scenario, Skip::InvalidValue, Skip::TooWide, Skip::Over];
        let names: Vec<String> = fixed.iter().map(Skip::to_string).collect();
        assert_eq!(names, SKIP_REASONS);
    }

    use super::*;

    fn settings() -> Settings {
        CrowdsecConfig { lapi_url: "http://127.0.0.1:8080/".into(), api_key: Some("k".into()), ..Default::default() }
            .settings(std::path::Path::new("/"))
            .unwrap()
    }

    fn d(id: i64, scope: &str, value: &str, kind: &str, duration: &str) -> Decision {
        Decision {
            id: Some(id),
            origin: Some("cscli".into()),
            kind: Some(kind.into()),
            scope: Some(scope.into()),
            value: Some(value.into()),
            duration: Some(duration.into()),
            scenario: Some("manual".into()),
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("3h59m58.5s"), Some(3.0 * 3600.0 + 59.0 * 60.0 + 58.5));
        assert_eq!(go_duration("250ms"), Some(0.25));
        assert_eq!(go_duration("-1.5s"), Some(-1.5));
        assert_eq!(go_duration("0s"), Some(0.0));
        assert_eq!(go_duration("0"), Some(0.0));
        assert_eq!(go_duration("1h0m0s"), Some(3600.0));
        for bad in ["", "h", "1x", "1.2.3s", "-", "s1"] {
            assert_eq!(go_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn urls() {
        let u = Url::parse("http://127.0.0.1:8080/").unwrap();
        assert_eq!((u.host.as_str(), u.port, u.base.as_str()), ("127.0.0.1", 8080, "/"));
        let u = Url::parse("http://[::1]:81/lapi").unwrap();
        assert_eq!((u.authority().as_str(), u.base.as_str()), ("[::1]:81", "/lapi/"));
        assert_eq!(Url::parse("http://lapi").unwrap().port, 80);
        for bad in ["https://x/", "ftp://x", "http://", "http://u:p@x/", "http://x:99999/", "http://x/?a=1"] {
            assert!(Url::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_check_values_and_hide_secrets() {
        let base = CrowdsecConfig { lapi_url: "http://127.0.0.1:8080/".into(), ..Default::default() };
        assert!(base.settings(std::path::Path::new("/")).is_err(), "a key is needed");
        let both = CrowdsecConfig { api_key: Some("k".into()), api_key_file: Some("f".into()), ..base.clone() };
        assert!(both.settings(std::path::Path::new("/")).is_err());
        let ok = CrowdsecConfig { api_key: Some("s3cret".into()), ..base.clone() };
        assert!(!format!("{ok:?}").contains("s3cret"));
        let s = ok.settings(std::path::Path::new("/")).unwrap();
        assert!(!format!("{s:?}").contains("s3cret"));
        assert_eq!(s.every, DEFAULT_UPDATE_FREQUENCY);
        for bad in [
            CrowdsecConfig { update_frequency: Some("0s".into()), ..ok.clone() },
            CrowdsecConfig { scopes: vec!["country".into()], ..ok.clone() },
            CrowdsecConfig { action: Some("allow".into()), ..ok.clone() },
            CrowdsecConfig { set: Some("bad name".into()), ..ok.clone() },
            CrowdsecConfig { publish: true, ..ok.clone() },
            CrowdsecConfig { machine_id: Some("m".into()), ..ok.clone() },
        ] {
            let e = bad.settings(std::path::Path::new("/")).unwrap_err().to_string();
            assert!(!e.contains("s3cret"), "{e}");
        }
        let dir = std::env::temp_dir().join(format!("policer-cs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("key"), "fromfile\n").unwrap();
        let f = CrowdsecConfig { api_key_file: Some("key".into()), ..base };
        assert_eq!(f.settings(&dir).unwrap().api_key, "fromfile");
        // A FIFO where the key should be: refused at once, not waited on.
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) on a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = CrowdsecConfig { api_key_file: Some("fifo".into()), ..f.clone() }.settings(&dir).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_stream_path_carries_the_filters() {
        let mut s = settings();
        assert_eq!(s.stream_path(true), "/v1/decisions/stream?startup=true&scopes=ip%2Crange");
        s.origins = vec!["crowdsec".into(), "lists".into()];
        s.scenarios_not_containing = vec!["http probing".into()];
        assert_eq!(
            s.stream_path(false),
            "/v1/decisions/stream?startup=false&scopes=ip%2Crange&origins=crowdsec%2Clists\
             &scenarios_not_containing=http%20probing"
        );
    }

    #[test]
    fn decisions_are_admitted_or_counted_never_dropped_silently() {
        let s = settings();
        let net = |v: &str| v.parse::<IpNet>().unwrap();
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.7", "ban", "1h")), Ok(net("192.0.2.7/32")));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "2001:db8::1", "ban", "1h")), Ok(net("2001:db8::1/128")));
        assert_eq!(Store::admit(&s, &d(1, "Range", "198.51.100.0/24", "ban", "1h")), Ok(net("198.51.100.0/24")));
        assert_eq!(Store::admit(&s, &d(1, "Range", "198.51.100.9/24", "ban", "1h")), Ok(net("198.51.100.0/24")));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "::ffff:192.0.2.8", "ban", "1h")), Ok(net("192.0.2.8/32")));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.7", "captcha", "1h")), Err(Skip::Type("captcha".into())));
        assert_eq!(Store::admit(&s, &d(1, "Country", "FR", "ban", "1h")), Err(Skip::Scope("country".into())));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.300", "ban", "1h")), Err(Skip::InvalidValue));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.0/24", "ban", "1h")), Ok(net("192.0.2.0/24")));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.0/33", "ban", "1h")), Err(Skip::InvalidValue));
        assert_eq!(Store::admit(&s, &d(1, "Range", "0.0.0.0/0", "ban", "1h")), Err(Skip::TooWide));
        assert_eq!(Store::admit(&s, &d(1, "Range", "2000::/3", "ban", "1h")), Err(Skip::TooWide));
        let mut only = settings();
        only.origins = vec!["crowdsec".into()];
        assert_eq!(Store::admit(&only, &d(1, "Ip", "192.0.2.7", "ban", "1h")), Err(Skip::Origin));
        only.origins.clear();
        only.scenarios_not_containing = vec!["man".into()];
        assert_eq!(Store::admit(&only, &d(1, "Ip", "192.0.2.7", "ban", "1h")), Err(Skip::Scenario));
    }

    #[test]
    fn startup_replaces_deltas_add_and_delete_and_each_decision_ends_at_its_end() {
        let s = settings();
        let mut st = Store::default();
        let r = StreamReply {
            new: vec![
                d(1, "Ip", "192.0.2.1", "ban", "10s"),
                d(2, "Ip", "192.0.2.1", "ban", "20s"),
                d(3, "Range", "198.51.100.0/24", "ban", "30s"),
                d(4, "Ip", "192.0.2.9", "captcha", "30s"),
                d(5, "Ip", "bogus", "ban", "30s"),
                d(6, "Ip", "192.0.2.6", "ban", "-1s"),
            ],
            deleted: vec![],
        };
        let a = st.apply(&s, &r, true, 1_000_000);
        assert_eq!((a.added, a.skipped.len(), a.changed), (3, 3, true));
        assert_eq!(st.prefixes().len(), 2);
        assert_eq!(st.next_end(), Some(1_010_000));
        // Id 1 ends; the value stays while id 2 is in force.
        assert_eq!(st.expire(1_010_000), 1);
        assert_eq!(st.prefixes().len(), 2);
        assert_eq!(st.expire(1_020_000), 1);
        assert_eq!(st.prefixes(), vec!["198.51.100.0/24".parse::<IpNet>().unwrap()]);
        // A delta: delete 3, add 7 (IPv6).
        let r = StreamReply {
            new: vec![d(7, "Ip", "2001:db8::7", "ban", "1h")],
            deleted: vec![d(3, "Range", "198.51.100.0/24", "ban", "-5s")],
        };
        let a = st.apply(&s, &r, false, 1_021_000);
        assert_eq!((a.added, a.deleted, a.changed), (1, 1, true));
        assert_eq!(st.prefixes(), vec!["2001:db8::7/128".parse::<IpNet>().unwrap()]);
        // Nothing new: no change, no import.
        let a = st.apply(&s, &StreamReply::default(), false, 1_022_000);
        assert!(!a.changed);
        // A startup pull is the whole truth.
        let a =
            st.apply(&s, &StreamReply { new: vec![d(8, "Ip", "192.0.2.8", "ban", "1h")], deleted: vec![] }, true, 1);
        assert!(a.changed);
        assert_eq!(st.held.len(), 1);
        assert_eq!(st.by_origin().get("cscli"), Some(&1));
    }

    #[test]
    fn null_lists_are_empty() {
        let r: StreamReply = serde_json::from_str(r#"{"new":null,"deleted":null}"#).unwrap();
        assert!(r.new.is_empty() && r.deleted.is_empty());
        let r: StreamReply = serde_json::from_str(
            r#"{"new":[{"duration":"3h59m59s","id":1,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"1.2.3.4","extra":1}]}"#,
        )
        .unwrap();
        assert_eq!(r.new[0].value.as_deref(), Some("1.2.3.4"));
    }
}
