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
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::Arc,
    time::Duration,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Where the bouncer's decisions go unless `set` says otherwise.
pub const DEFAULT_SET: &str = "crowdsec";
/// How often the stream is pulled unless `update_frequency` says otherwise.
pub const DEFAULT_UPDATE_FREQUENCY: Duration = Duration::from_secs(10);
/// How often a whole pull (`startup=true`) replaces what the pulls of
/// changes built, unless `full_sync_every` says otherwise. The Local API
/// answers a pull of changes with what was written since its last answer
/// to this key: a decision written while it answered one is in neither
/// that answer nor the next (measured on Debian's crowdsec: 40 000
/// decisions imported across two pulls, 50 of them in no pull of
/// changes). Only a whole pull brings such a decision in.
pub const DEFAULT_FULL_SYNC_EVERY: Duration = Duration::from_secs(600);
/// Ranges wider than these are refused (counted `too_wide`): a decision of
/// `0.0.0.0/0` must not drop the world. `min_prefix_len` changes them.
pub const DEFAULT_MIN_PREFIX_V4: u8 = 8;
pub const DEFAULT_MIN_PREFIX_V6: u8 = 32;
/// What a feed may cover in all, per family, as a prefix length: at most
/// as many addresses as one prefix of it (`max_cover_v4`/`_v6`). By
/// default a /7's worth of IPv4 (0.8 % of it) and a /31's worth of IPv6,
/// or twice the widest range a decision may have where `min_prefix_len`
/// allows wider ones (`min_prefix_len - 1`): a feed holding the widest
/// decision allowed and as much again is taken, 256 `/8`s (all of IPv4)
/// are not. A stricter `min_prefix_len` (24) does not shrink it: the
/// bound is on the feed, not on one decision. A pull beyond it is refused
/// whole.
pub fn default_max_cover_v4(min_prefix_len: u8) -> u8 {
    min_prefix_len.saturating_sub(1).min(DEFAULT_MIN_PREFIX_V4 - 1)
}

/// [`default_max_cover_v4`] for IPv6: at most a /31's worth.
pub fn default_max_cover_v6(min_prefix_len: u8) -> u8 {
    min_prefix_len.saturating_sub(1).min(DEFAULT_MIN_PREFIX_V6 - 1)
}

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
    /// How often a whole pull replaces what the pulls of changes built
    /// (`10m` by default, `0s` never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub full_sync_every: Option<String>,
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
    /// What all the decisions may cover, per family, as a prefix length:
    /// at most as many addresses as one such prefix (default /7 and /31,
    /// or `min_prefix_len - 1` where that is wider). A pull beyond it is
    /// refused whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cover_v4: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cover_v6: Option<u8>,
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
    /// A MaxMind DB Country file: `Country` decisions are applied as its
    /// networks of that country (without it they are counted and skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country_mmdb: Option<String>,
    /// A MaxMind DB ASN file: `AS` decisions are applied as its networks of
    /// that AS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asn_mmdb: Option<String>,
}

impl std::fmt::Debug for CrowdsecConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key and the password stay out of every log line.
        f.debug_struct("CrowdsecConfig")
            .field("lapi_url", &self.lapi_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "(hidden)"))
            .field("api_key_file", &self.api_key_file)
            .field("update_frequency", &self.update_frequency)
            .field("full_sync_every", &self.full_sync_every)
            .field("set", &self.set)
            .field("publish", &self.publish)
            .field("machine_id", &self.machine_id)
            .finish_non_exhaustive()
    }
}

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
    /// A whole pull this often (None: only at a start and after a failed
    /// pull).
    pub full_every: Option<Duration>,
    pub origins: Vec<String>,
    pub scopes: Vec<String>,
    pub scenarios_containing: Vec<String>,
    pub scenarios_not_containing: Vec<String>,
    pub types: Vec<String>,
    pub action: policer_common::bucket::Action,
    pub set: String,
    pub min_v4: u8,
    pub min_v6: u8,
    /// What all the decisions may cover: as many addresses as one prefix
    /// of this length, per family.
    pub max_cover_v4: u8,
    pub max_cover_v6: u8,
    /// machine id and password, with `publish`.
    pub publish: Option<(String, String)>,
    /// What a start, a reload and `check` warn of: a secret's file that
    /// others than its owner may read.
    pub warnings: Vec<String>,
    /// `country_mmdb`, `asn_mmdb`: where they are (relative to the config's
    /// directory) and, once read ([`Settings::load_mmdb`]), their networks
    /// by country and by AS.
    pub country_mmdb: Option<std::path::PathBuf>,
    pub asn_mmdb: Option<std::path::PathBuf>,
    pub scoped: Arc<Scoped>,
}

/// The networks of each country and AS of `country_mmdb` and `asn_mmdb`:
/// what a `Country` or `AS` decision stands for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scoped {
    pub country: Option<HashMap<String, Vec<IpNet>>>,
    pub asn: Option<HashMap<u32, Vec<IpNet>>>,
}

impl Scoped {
    /// The networks a scoped value stands for (sorted); none when its
    /// database is not read.
    pub fn networks(&self, l: &crate::mmdb::Label) -> Option<&[IpNet]> {
        use crate::mmdb::Label;
        static NONE: Vec<IpNet> = Vec::new();
        match l {
            Label::Country(c) => self.country.as_ref().map(|m| m.get(c).unwrap_or(&NONE).as_slice()),
            Label::As(a) => self.asn.as_ref().map(|m| m.get(a).unwrap_or(&NONE).as_slice()),
        }
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings").field("url", &self.url_text).field("set", &self.set).finish_non_exhaustive()
    }
}

fn lower(v: &[String]) -> Vec<String> {
    v.iter().map(|s| s.to_ascii_lowercase()).collect()
}

/// A secret given inline or in a file (the file's first line, trimmed);
/// a file others than its owner may read adds a warning to `warnings`
/// (policer.toml(5): mode 0600). Warned of, not refused: a key file that
/// worked must not fail the next start after an upgrade.
fn secret(
    inline: &Option<String>,
    file: &Option<String>,
    what: &str,
    base: &std::path::Path,
    warnings: &mut Vec<String>,
) -> Result<String> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(Error::Invalid(format!("crowdsec: give {what} or {what}_file, not both"))),
        (Some(k), None) if !k.trim().is_empty() => Ok(k.trim().to_string()),
        (None, Some(f)) => {
            let p = base.join(f);
            let bytes = crate::files::read_regular(&p, crate::files::SECRET)
                .map_err(|e| Error::Invalid(format!("crowdsec.{what}_file: cannot read {}: {e}", p.display())))?;
            if let Ok(m) = std::fs::metadata(&p) {
                use std::os::unix::fs::PermissionsExt;
                let mode = m.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    warnings.push(format!(
                        "crowdsec.{what}_file: {} is mode {mode:04o}: others than its owner may read the secret; \
                         `chmod 600 {}`",
                        p.display(),
                        p.display()
                    ));
                }
            }
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
    /// The feed's set: its name (`set`, default `crowdsec`) and what it
    /// does (`action`, default `deny`), checked; no secret is read
    /// (`policer replay` installs the set without a Local API).
    pub fn feed_set(&self) -> Result<(String, policer_common::bucket::Action)> {
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
        Ok((set, action))
    }

    /// `update_frequency`, checked.
    fn every(&self) -> Result<Duration> {
        Ok(match &self.update_frequency {
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
        })
    }

    /// `full_sync_every`, checked against `every` (None: never).
    fn full_every(&self, every: Duration) -> Result<Option<Duration>> {
        Ok(match &self.full_sync_every {
            None => Some(DEFAULT_FULL_SYNC_EVERY.max(every)),
            Some(t) if matches!(t.trim(), "0" | "0s") => None,
            Some(t) => {
                let d = crate::duration::parse(t)
                    .map_err(|e| Error::Invalid(format!("crowdsec.full_sync_every: {e}; write \"10m\" or \"0s\"")))?;
                if d < every || d > Duration::from_secs(86_400) {
                    return Err(Error::Invalid(format!(
                        "crowdsec.full_sync_every: {t:?} is not between update_frequency ({} s) and 24h; write \"10m\", \
                         or \"0s\" for never",
                        every.as_secs()
                    )));
                } else {
                    Some(d)
                }
            }
        })
    }

    /// Checks every value and reads the secrets' files (relative paths are
    /// from `base`, the config file's directory). The errors never quote a
    /// secret.
    pub fn settings(&self, base: &std::path::Path) -> Result<Settings> {
        let url = Url::parse(&self.lapi_url)?;
        let mut warnings = Vec::new();
        let api_key = secret(&self.api_key, &self.api_key_file, "api_key", base, &mut warnings)?;
        if api_key.contains(|c: char| c.is_control() || c == ' ') {
            return Err(Error::Invalid("crowdsec: the API key holds spaces or control characters".into()));
        }
        let every = self.every()?;
        let full_every = self.full_every(every)?;
        let path = |p: &Option<String>| p.as_ref().map(|p| base.join(p));
        let (country_mmdb, asn_mmdb) = (path(&self.country_mmdb), path(&self.asn_mmdb));
        let mut known = vec!["ip", "range"];
        known.extend(country_mmdb.as_ref().map(|_| "country"));
        known.extend(asn_mmdb.as_ref().map(|_| "as"));
        let scopes =
            if self.scopes.is_empty() { known.iter().map(|s| s.to_string()).collect() } else { lower(&self.scopes) };
        if let Some(s) = scopes.iter().find(|s| !known.contains(&s.as_str())) {
            let hint = match s.as_str() {
                "country" => " (Country decisions need country_mmdb, a MaxMind DB Country file)",
                "as" => " (AS decisions need asn_mmdb, a MaxMind DB ASN file)",
                _ => "",
            };
            return Err(Error::Invalid(format!(
                "crowdsec.scopes: {s:?} is not a scope policer enforces{hint}; write scopes = [\"ip\", \"range\"]"
            )));
        }
        let types = if self.types.is_empty() { vec!["ban".into()] } else { lower(&self.types) };
        let (set, action) = self.feed_set()?;
        let min_v4 = self.min_prefix_len_v4.unwrap_or(DEFAULT_MIN_PREFIX_V4);
        let min_v6 = self.min_prefix_len_v6.unwrap_or(DEFAULT_MIN_PREFIX_V6);
        if min_v4 > 32 || min_v6 > 128 {
            return Err(Error::Invalid("crowdsec: min_prefix_len_v4 is at most 32, min_prefix_len_v6 128".into()));
        }
        let max_cover_v4 = self.max_cover_v4.unwrap_or_else(|| default_max_cover_v4(min_v4));
        let max_cover_v6 = self.max_cover_v6.unwrap_or_else(|| default_max_cover_v6(min_v6));
        if max_cover_v4 > 32 {
            return Err(Error::Invalid(
                "crowdsec: max_cover_v4 is a prefix length of at most 32; write max_cover_v4 = 7".into(),
            ));
        }
        if max_cover_v6 > 128 {
            return Err(Error::Invalid(
                "crowdsec: max_cover_v6 is a prefix length of at most 128; write max_cover_v6 = 31".into(),
            ));
        }
        let publish = if self.publish {
            let id = self
                .machine_id
                .clone()
                .filter(|m| !m.trim().is_empty())
                .ok_or_else(|| Error::Invalid("crowdsec: publish = true needs machine_id (and password)".into()))?;
            Some((id, secret(&self.password, &self.password_file, "password", base, &mut warnings)?))
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
            full_every,
            origins: self.origins.clone(),
            scopes,
            scenarios_containing: self.scenarios.iter().chain(&self.scenarios_containing).cloned().collect(),
            scenarios_not_containing: self.scenarios_not_containing.clone(),
            types,
            action,
            set,
            min_v4,
            min_v6,
            max_cover_v4,
            max_cover_v6,
            publish,
            warnings,
            country_mmdb,
            asn_mmdb,
            scoped: Arc::default(),
        })
    }
}

impl Settings {
    /// Reads `country_mmdb` and `asn_mmdb` into [`Settings::scoped`]. A
    /// database that does not read leaves its scope out (its decisions
    /// are counted and skipped, as without it): the warnings say why.
    pub fn load_mmdb(&mut self) -> Vec<String> {
        use crate::mmdb::Label;
        let mut warnings = Vec::new();
        let mut scoped = Scoped::default();
        for (path, country) in [(&self.country_mmdb, true), (&self.asn_mmdb, false)] {
            let Some(p) = path else { continue };
            let shown = p.display().to_string();
            let key = if country { "country_mmdb" } else { "asn_mmdb" };
            match crate::mmdb::open(p, &shown).and_then(|db| db.by_label(country)) {
                Ok(m) => {
                    if country {
                        scoped.country = Some(
                            m.into_iter()
                                .filter_map(|(l, v)| if let Label::Country(c) = l { Some((c, v)) } else { None })
                                .collect(),
                        );
                    } else {
                        scoped.asn = Some(
                            m.into_iter()
                                .filter_map(|(l, v)| if let Label::As(a) = l { Some((a, v)) } else { None })
                                .collect(),
                        );
                    }
                }
                Err(e) => {
                    warnings.push(format!("crowdsec.{key}: {e}: its decisions are counted and skipped"));
                    let scope = if country { "country" } else { "as" };
                    self.scopes.retain(|s| s != scope);
                }
            }
        }
        self.scoped = Arc::new(scoped);
        warnings
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
/// a decision that cannot be read is counted, never applied. The answer
/// is read a decision at a time ([`parse_stream`]), never whole as a tree.
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

/// What a decision applies to: a prefix (the Ip and Range scopes), or a
/// country or AS (the Country and AS scopes, with `country_mmdb` and
/// `asn_mmdb`: the networks the database gives it). Prefixes sort first.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Value {
    Net(IpNet),
    Scope(crate::mmdb::Label),
}

impl Value {
    /// The scope it counts under in the feed's metrics: `ip` (a host),
    /// `range`, `country`, `as`.
    pub fn scope(&self) -> &'static str {
        match self {
            Value::Net(n) if n.prefix_len() == n.max_prefix_len() => "ip",
            Value::Net(_) => "range",
            Value::Scope(crate::mmdb::Label::Country(_)) => "country",
            Value::Scope(crate::mmdb::Label::As(_)) => "as",
        }
    }
}

/// A decision of `new` that is applied: its value, what is left of it and
/// its origin (shared: a feed has a handful of origins, not one a
/// decision).
#[derive(Clone, Debug, PartialEq)]
pub struct New {
    pub id: Option<i64>,
    pub value: Value,
    pub ms_left: u64,
    pub origin: Arc<str>,
}

/// A decision of `deleted`: by its id, or by its value when it has none.
#[derive(Clone, Debug, PartialEq)]
pub enum Gone {
    Id(i64),
    Value(Value),
}

/// One answer of the stream, read: the decisions to apply (checked under
/// the settings, each in a few bytes) and those not applied, counted by
/// reason.
#[derive(Debug, Default)]
pub struct Pull {
    pub new: Vec<New>,
    pub deleted: Vec<Gone>,
    /// Decisions in `new`, applied or not.
    pub received: u64,
    /// Not applied, by reason ([`Skip`]'s text).
    pub skipped: BTreeMap<String, u64>,
    /// The first few not applied for their value, to log.
    pub examples: Vec<(Skip, String)>,
}

/// Examples of refused values kept per pull (the rest are counted).
const EXAMPLES: usize = 5;

/// Reads an answer of the stream from `r`, a decision at a time (the peak
/// is the decisions to apply, a few bytes each, not the answer as a tree).
/// The answer must be the stream's object with both `new` and `deleted`
/// (the Local API sends both, `null` when empty): anything else — a
/// `{"message": "maintenance"}` answered with a 200 — is an error, so the
/// pull fails and changes nothing.
pub fn parse_stream<R: std::io::Read>(s: &Settings, r: R) -> serde_json::Result<Pull> {
    use serde::de::DeserializeSeed;
    let mut de = serde_json::Deserializer::from_reader(r);
    let mut r = StreamReader { s, pull: Pull::default(), origins: BTreeMap::new() };
    Top(&mut r).deserialize(&mut de)?;
    de.end()?;
    Ok(r.pull)
}

struct StreamReader<'s> {
    s: &'s Settings,
    pull: Pull,
    origins: BTreeMap<String, Arc<str>>,
}

impl StreamReader<'_> {
    fn skip(&mut self, why: Skip, value: Option<&str>) {
        if matches!(why, Skip::InvalidValue | Skip::TooWide | Skip::HostBits) && self.pull.examples.len() < EXAMPLES {
            let v: String = value.unwrap_or("(none)").chars().take(64).collect();
            self.pull.examples.push((why.clone(), crate::text::escaped(&v)));
        }
        *self.pull.skipped.entry(why.to_string()).or_insert(0) += 1;
    }

    fn new_decision(&mut self, d: Decision) {
        self.pull.received += 1;
        let secs = d.duration.as_deref().and_then(go_duration);
        let (net, secs) = match (Store::admit(self.s, &d), secs) {
            (Err(why), _) => return self.skip(why, d.value.as_deref()),
            (Ok(_), None) => return self.skip(Skip::InvalidValue, d.duration.as_deref()),
            (Ok(_), Some(t)) if t <= 0.0 => return self.skip(Skip::Over, None),
            (Ok(n), Some(t)) => (n, t),
        };
        let w = word(d.origin.as_deref().unwrap_or(""));
        let origin = match self.origins.get(&w) {
            Some(o) => o.clone(),
            None => {
                let o: Arc<str> = Arc::from(w.as_str());
                self.origins.insert(w, o.clone());
                o
            }
        };
        self.pull.new.push(New { id: d.id, value: net, ms_left: (secs * 1000.0) as u64, origin });
    }

    fn deleted_decision(&mut self, d: Decision) {
        match d.id {
            Some(id) => self.pull.deleted.push(Gone::Id(id)),
            // Without an id, by its value (a value that names no prefix
            // names nothing held).
            None => {
                if let Ok(v) = scoped_value(d.scope.as_deref().unwrap_or(""), d.value.as_deref().unwrap_or("")) {
                    self.pull.deleted.push(Gone::Value(v));
                }
            }
        }
    }
}

/// The answer's object: `new` and `deleted` read in place, any other key
/// skipped, both required.
struct Top<'r, 's>(&'r mut StreamReader<'s>);

impl<'de> serde::de::DeserializeSeed<'de> for Top<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Top<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("the decision stream, an object with \"new\" and \"deleted\"")
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> std::result::Result<(), A::Error> {
        use serde::de::Error as _;
        let r = self.0;
        let (mut new, mut deleted) = (false, false);
        while let Some(k) = m.next_key::<String>()? {
            match k.as_str() {
                "new" | "deleted" if (k == "new" && new) || (k == "deleted" && deleted) => {
                    return Err(A::Error::custom(format!("\"{k}\" given twice")));
                }
                "new" => {
                    m.next_value_seed(DecisionList { r: &mut *r, deleted: false })?;
                    new = true;
                }
                "deleted" => {
                    m.next_value_seed(DecisionList { r: &mut *r, deleted: true })?;
                    deleted = true;
                }
                _ => {
                    m.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        if !(new && deleted) {
            return Err(A::Error::custom(format!(
                "not a decision stream: no \"{}\" (the Local API sends \"new\" and \"deleted\", null when empty)",
                if new { "deleted" } else { "new" }
            )));
        }
        Ok(())
    }
}

/// `new` or `deleted`: `null`, or a list read a decision at a time.
struct DecisionList<'r, 's> {
    r: &'r mut StreamReader<'s>,
    deleted: bool,
}

impl<'de> serde::de::DeserializeSeed<'de> for DecisionList<'_, '_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de> serde::de::Visitor<'de> for DecisionList<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of decisions, or null")
    }
    fn visit_none<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_some<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_seq(self)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<(), A::Error> {
        while let Some(d) = seq.next_element::<Decision>()? {
            if self.deleted {
                self.r.deleted_decision(d);
            } else {
                self.r.new_decision(d);
            }
        }
        Ok(())
    }
}

/// A value as the prefix it names: an address (a host), or a prefix with
/// no host bits (`cscli decisions import` stores a CIDR under the Ip
/// scope, and a Range may be written as a host); `::ffff:a.b.c.d` is the
/// IPv4 source it names. A prefix with host bits (`10.214.0.0/8`) is
/// refused, as `rule import` refuses it: widening it silently would drop
/// what the decision did not name.
pub fn value_net(value: &str) -> std::result::Result<IpNet, Skip> {
    // The one parser of prefixes; a refusal is told apart here: host bits
    // (a prefix that parses, not truncated) or anything else.
    crate::prefix::parse_prefix(value).map_err(|_| match value.trim().parse::<IpNet>() {
        Ok(n) if n != n.trunc() => Skip::HostBits,
        _ => Skip::InvalidValue,
    })
}

/// A decision's value under its scope: a country code (Country), an AS
/// number (AS, `64500` or `AS64500`), else a prefix ([`value_net`]).
pub fn scoped_value(scope: &str, value: &str) -> std::result::Result<Value, Skip> {
    if scope.eq_ignore_ascii_case("country") {
        return crate::mmdb::country(value)
            .map(|c| Value::Scope(crate::mmdb::Label::Country(c)))
            .map_err(|_| Skip::InvalidValue);
    }
    if scope.eq_ignore_ascii_case("as") {
        return crate::mmdb::asn(value)
            .map(|a| Value::Scope(crate::mmdb::Label::As(a)))
            .map_err(|_| Skip::InvalidValue);
    }
    value_net(value).map(Value::Net)
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
pub const SKIP_REASONS: &[&str] = &["origin", "scenario", "invalid_value", "host_bits", "too_wide", "over"];

/// The `kind`s of errors that do not depend on the answer (`http_NNN`
/// does), shown from the start at 0 for the same reason.
pub const ERROR_KINDS: &[&str] =
    &["connect", "timeout", "body", "parse", "cover", "shrink", "apply", "save", "login", "publish", "publish_dropped"];

/// Why a decision was not applied.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    Type(String),
    Scope(String),
    Origin,
    Scenario,
    InvalidValue,
    /// A prefix with host bits (`10.214.0.0/8`): not widened.
    HostBits,
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
            Skip::HostBits => f.write_str("host_bits"),
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
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub value: Value,
    /// Unix ms.
    pub until_ms: u64,
    pub origin: Arc<str>,
}

/// Why a state file is not restored.
#[derive(Debug, PartialEq)]
pub enum Restore {
    /// Not the feed's state file.
    Unreadable(String),
    /// Its decisions cover more than `max_cover_v4`/`_v6` (why).
    Cover(String),
}

/// What one pull changed.
#[derive(Debug, Default, PartialEq)]
pub struct Applied {
    pub added: usize,
    pub deleted: usize,
    /// The set's prefixes changed (an import is due).
    pub changed: bool,
    /// A whole answer removing most of what was held, taken after whole
    /// answers had said so for this long.
    pub doubted_ms: Option<u64>,
    /// A whole answer removing most of what is held, not taken (yet).
    pub doubt: Option<Doubt>,
}

/// The decisions in force, by id (a decision without an id is keyed by a
/// number of its own, below zero), indexed by value and by end, with the
/// distinct values counted by prefix length as they change: a pull, a
/// deletion by value and an end cost what they change, not what is held.
#[derive(Debug, Clone)]
pub struct Store {
    held: HashMap<i64, Held>,
    by_value: BTreeSet<(Value, i64)>,
    /// Decisions in force by scope (`ip`, `range`, `country`, `as`).
    by_scope: BTreeMap<&'static str, u64>,
    by_end: BTreeSet<(u64, i64)>,
    by_origin: BTreeMap<Arc<str>, u64>,
    /// Distinct values by prefix length: IPv4 0..=32, IPv6 0..=128.
    lens4: [u64; 33],
    lens6: [u64; 129],
    values: usize,
    /// A value came or went since this was last taken.
    values_changed: bool,
    anon: i64,
    /// Since when (ms) whole answers have said to remove most of what is
    /// held, refused until they have said so for [`SHRINK_CONFIRM_MS`].
    shrink_since: Option<u64>,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            held: HashMap::new(),
            by_value: BTreeSet::new(),
            by_scope: BTreeMap::new(),
            by_end: BTreeSet::new(),
            by_origin: BTreeMap::new(),
            lens4: [0; 33],
            lens6: [0; 129],
            values: 0,
            values_changed: false,
            anon: 0,
            shrink_since: None,
        }
    }
}

/// A whole answer removing at least this many decisions, and more than
/// half of those held, is taken only when whole answers have said so for
/// [`SHRINK_CONFIRM_MS`].
pub const SHRINK_MIN: usize = 10;

/// How long whole answers must keep saying to remove most of what is held
/// before it is taken.
pub const SHRINK_CONFIRM_MS: u64 = 60_000;

/// A whole answer that would remove more than half of what is held (and
/// at least [`SHRINK_MIN`]): an empty answer from a Local API whose
/// database is not there yet, or a glitch of one answer, must not lift a
/// blocklist. What it adds is taken, what it leaves out stays, until whole
/// answers have said so for [`SHRINK_CONFIRM_MS`]; `for_ms` is how long
/// they have so far.
#[derive(Debug, PartialEq)]
pub struct Doubt {
    pub deleted: usize,
    pub held: usize,
    pub for_ms: u64,
}

impl std::fmt::Display for Doubt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the whole answer would remove {} of the {} decisions in force: they stay until whole answers have said \
             so for {} s ({} s so far); what it adds is taken",
            self.deleted,
            self.held,
            SHRINK_CONFIRM_MS / 1000,
            self.for_ms / 1000
        )
    }
}

impl PartialEq for Store {
    fn eq(&self, o: &Self) -> bool {
        self.held == o.held
    }
}

/// Addresses of `count` prefixes of `len` in a family of `bits`
/// (saturating: the whole IPv6 space is `u128::MAX`).
fn addresses(count: u64, len: usize, bits: usize) -> u128 {
    1u128.checked_shl((bits - len) as u32).unwrap_or(u128::MAX).saturating_mul(count as u128)
}

#[cfg(test)]
thread_local! {
    /// Entries of the store's indexes walked on this thread: what tests
    /// count as the work of a pull (what it matches, not what is held).
    static WALKED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// `x`, an entry of an index walked (counted in tests).
#[inline]
fn walked<T>(x: T) -> T {
    #[cfg(test)]
    WALKED.with(|w| w.set(w.get() + 1));
    x
}

/// `max_cover` as addresses.
fn bound(len: u8, bits: usize) -> u128 {
    addresses(1, usize::from(len).min(bits), bits)
}

impl Store {
    /// The value of `d` if it is applied under `s`, else why not.
    pub fn admit(s: &Settings, d: &Decision) -> std::result::Result<Value, Skip> {
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
        let v = scoped_value(&scope, d.value.as_deref().unwrap_or(""))?;
        if let Value::Net(net) = &v {
            let min = if net.addr().is_ipv4() { s.min_v4 } else { s.min_v6 };
            if net.prefix_len() < min {
                return Err(Skip::TooWide);
            }
        }
        Ok(v)
    }

    /// Decisions in force.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Distinct values in force (the set's entries).
    pub fn values(&self) -> usize {
        self.values
    }

    fn has_value(&self, v: &Value) -> bool {
        self.by_value.range((v.clone(), i64::MIN)..=(v.clone(), i64::MAX)).next().map(walked).is_some()
    }

    fn count_value(&mut self, v: &Value, came: bool) {
        let lens = match v {
            Value::Net(net @ IpNet::V4(_)) => Some(&mut self.lens4[usize::from(net.prefix_len())]),
            Value::Net(net) => Some(&mut self.lens6[usize::from(net.prefix_len())]),
            // A country's or an AS's cover is its networks' ([`Store::cover_in`]).
            Value::Scope(_) => None,
        };
        if came {
            if let Some(n) = lens {
                *n += 1;
            }
            self.values += 1;
        } else {
            if let Some(n) = lens {
                *n -= 1;
            }
            self.values -= 1;
        }
        self.values_changed = true;
    }

    /// Holds `h` under `id`; what it held there before.
    fn insert(&mut self, id: i64, h: Held) -> Option<Held> {
        let old = self.remove(id);
        if !self.has_value(&h.value) {
            self.count_value(&h.value, true);
        }
        *self.by_scope.entry(h.value.scope()).or_insert(0) += 1;
        self.by_value.insert((h.value.clone(), id));
        self.by_end.insert((h.until_ms, id));
        *self.by_origin.entry(h.origin.clone()).or_insert(0) += 1;
        self.held.insert(id, h);
        old
    }

    fn remove(&mut self, id: i64) -> Option<Held> {
        let h = self.held.remove(&id)?;
        self.by_value.remove(&(h.value.clone(), id));
        if !self.has_value(&h.value) {
            self.count_value(&h.value, false);
        }
        if let Some(n) = self.by_scope.get_mut(h.value.scope()) {
            *n -= 1;
            if *n == 0 {
                self.by_scope.remove(h.value.scope());
            }
        }
        self.by_end.remove(&(h.until_ms, id));
        if let Some(n) = self.by_origin.get_mut(&h.origin) {
            *n -= 1;
            if *n == 0 {
                self.by_origin.remove(&h.origin);
            }
        }
        Some(h)
    }

    fn add(&mut self, n: &New, now_ms: u64) -> (i64, Option<Held>) {
        let id = n.id.unwrap_or_else(|| {
            self.anon -= 1;
            self.anon
        });
        let h = Held { value: n.value.clone(), until_ms: now_ms.saturating_add(n.ms_left), origin: n.origin.clone() };
        (id, self.insert(id, h))
    }

    /// Addresses covered, IPv4 and IPv6: the sum over the distinct values
    /// (overlapping values count twice: never less than what is covered).
    pub fn cover(&self) -> (u128, u128) {
        let sum = |lens: &[u64], bits: usize| {
            lens.iter().enumerate().fold(0u128, |acc, (len, &c)| acc.saturating_add(addresses(c, len, bits)))
        };
        (sum(&self.lens4, 32), sum(&self.lens6, 128))
    }

    /// [`Store::cover`] with each country and AS held counted as its
    /// networks in `scoped` (the sum of their addresses, per family): a
    /// country's cover is the address space the database gives it.
    pub fn cover_in(&self, scoped: &Scoped) -> (u128, u128) {
        let (mut c4, mut c6) = self.cover();
        for l in self.scope_values() {
            for n in scoped.networks(l).unwrap_or_default() {
                match n {
                    IpNet::V4(_) => c4 = c4.saturating_add(addresses(1, n.prefix_len().into(), 32)),
                    IpNet::V6(_) => c6 = c6.saturating_add(addresses(1, n.prefix_len().into(), 128)),
                }
            }
        }
        (c4, c6)
    }

    /// The countries and ASes held, each once.
    fn scope_values(&self) -> impl Iterator<Item = &crate::mmdb::Label> + '_ {
        let first = Value::Scope(crate::mmdb::Label::Country(String::new()));
        let mut last = None;
        self.by_value.range((first, i64::MIN)..).filter_map(move |(v, _)| match v {
            Value::Scope(l) if last.replace(l) != Some(l) => Some(l),
            _ => None,
        })
    }

    /// Whether what is held fits `max_cover_v4`/`_v6`; why not.
    pub fn check_cover(&self, s: &Settings) -> std::result::Result<(), String> {
        let (c4, c6) = self.cover_in(&s.scoped);
        for (fam, c, len, bits, key) in
            [("IPv4", c4, s.max_cover_v4, 32, "max_cover_v4"), ("IPv6", c6, s.max_cover_v6, 128, "max_cover_v6")]
        {
            if c > bound(len, bits) {
                return Err(format!(
                    "the decisions would cover {} {fam} addresses, more than {key} = {len} allows (a /{len}'s worth, \
                     {})",
                    if c == u128::MAX { "all".to_string() } else { c.to_string() },
                    bound(len, bits)
                ));
            }
        }
        Ok(())
    }

    /// Applies a pull received at `now_ms`, all or nothing. A startup pull
    /// replaces what is held; a later one removes its `deleted` (by id; by
    /// value when the id is missing) and adds its `new`. A pull after
    /// which the decisions would cover more than `max_cover_v4`/`_v6` is
    /// refused whole (the error says why) and nothing changes. A whole
    /// answer that would remove most of what is held is doubted
    /// ([`Doubt`]): what it adds is taken, what it leaves out stays, until
    /// whole answers have said so for [`SHRINK_CONFIRM_MS`].
    pub fn apply(
        &mut self,
        s: &Settings,
        pull: &Pull,
        startup: bool,
        now_ms: u64,
    ) -> std::result::Result<Applied, String> {
        if startup {
            let mut fresh = Store { anon: self.anon, ..Store::default() };
            for n in &pull.new {
                fresh.add(n, now_ms);
            }
            fresh.check_cover(s).map_err(|e| format!("{e}: the pull is refused whole"))?;
            let changed = !self.same_values(&fresh);
            // What the whole answer changes, decision by decision: a
            // whole pull that agrees with what is held adds and deletes
            // nothing (and counts nothing as deleted by the feed).
            let added = fresh.held.keys().filter(|id| !self.held.contains_key(id)).count();
            let deleted = self.held.keys().filter(|id| !fresh.held.contains_key(id)).count();
            let held = self.held.len();
            let mut doubted_ms = None;
            if deleted >= SHRINK_MIN && deleted * 2 > held {
                let since = *self.shrink_since.get_or_insert(now_ms);
                let for_ms = now_ms.saturating_sub(since);
                if for_ms < SHRINK_CONFIRM_MS {
                    let mut a = self.merge(s, pull, now_ms)?;
                    a.doubt = Some(Doubt { deleted, held, for_ms });
                    return Ok(a);
                }
                doubted_ms = Some(for_ms);
            }
            let a = Applied { added, deleted, changed, doubted_ms, doubt: None };
            *self = fresh;
            self.values_changed = false;
            return Ok(a);
        }
        self.values_changed = false;
        let mut undo: Vec<(i64, Option<Held>)> = Vec::new();
        let mut a = Applied::default();
        for g in &pull.deleted {
            match *g {
                Gone::Id(id) => {
                    if let Some(h) = self.remove(id) {
                        undo.push((id, Some(h)));
                        a.deleted += 1;
                    }
                }
                // Every decision of that value, found by the index: what
                // it matches, not what is held.
                Gone::Value(ref v) => {
                    let ids: Vec<i64> = self
                        .by_value
                        .range((v.clone(), i64::MIN)..=(v.clone(), i64::MAX))
                        .map(|(_, id)| walked(*id))
                        .collect();
                    for id in ids {
                        if let Some(h) = self.remove(id) {
                            undo.push((id, Some(h)));
                            a.deleted += 1;
                        }
                    }
                }
            }
        }
        for n in &pull.new {
            undo.push(self.add(n, now_ms));
            a.added += 1;
        }
        self.cover_or_undo(s, undo)?;
        a.changed = std::mem::take(&mut self.values_changed);
        Ok(a)
    }

    /// A doubted whole answer: its decisions added (those held renewed),
    /// none removed. One without an id is added only when its value is not
    /// held: each whole answer would otherwise add it again.
    fn merge(&mut self, s: &Settings, pull: &Pull, now_ms: u64) -> std::result::Result<Applied, String> {
        self.values_changed = false;
        let mut undo: Vec<(i64, Option<Held>)> = Vec::new();
        let mut a = Applied::default();
        for n in &pull.new {
            let held = match n.id {
                Some(id) => self.held.contains_key(&id),
                None => self.by_value.range((n.value.clone(), i64::MIN)..=(n.value.clone(), i64::MAX)).next().is_some(),
            };
            if n.id.is_none() && held {
                continue;
            }
            undo.push(self.add(n, now_ms));
            a.added += usize::from(!held);
        }
        self.cover_or_undo(s, undo)?;
        a.changed = std::mem::take(&mut self.values_changed);
        Ok(a)
    }

    /// Refuses what was just done (`undo`, in order) when the decisions now
    /// cover more than `max_cover_v4`/`_v6`: everything put back.
    fn cover_or_undo(&mut self, s: &Settings, undo: Vec<(i64, Option<Held>)>) -> std::result::Result<(), String> {
        let Err(e) = self.check_cover(s) else {
            return Ok(());
        };
        for (id, prev) in undo.into_iter().rev() {
            match prev {
                Some(h) => {
                    self.insert(id, h);
                }
                None => {
                    self.remove(id);
                }
            }
        }
        self.values_changed = false;
        Err(format!("{e}: the pull is refused whole"))
    }

    /// The decisions of a previous run's state file (`text`) still in
    /// force at `now_ms`, and how many ended while it was stopped. A file
    /// whose decisions cover more than `max_cover_v4`/`_v6` (written before
    /// the bound, or under a wider one) is refused as a pull beyond it is:
    /// [`Restore::Cover`], and the daemon starts empty.
    pub fn restore(text: &[u8], s: &Settings, now_ms: u64) -> std::result::Result<(Store, usize), Restore> {
        let mut st = serde_json::from_slice::<Store>(text).map_err(|e| Restore::Unreadable(e.to_string()))?;
        let (ended, _) = st.expire(now_ms);
        st.check_cover(s).map_err(Restore::Cover)?;
        Ok((st, ended))
    }

    /// Whether both hold the same values.
    fn same_values(&self, o: &Store) -> bool {
        self.values == o.values && self.value_iter().eq(o.value_iter())
    }

    fn value_iter(&self) -> impl Iterator<Item = &Value> + '_ {
        let mut last = None;
        self.by_value.iter().map(walked).filter_map(move |(v, _)| (last.replace(v) != Some(v)).then_some(v))
    }

    /// Removes the decisions whose end has come (the soonest first, by the
    /// index): how many, and whether the set's values changed.
    pub fn expire(&mut self, now_ms: u64) -> (usize, bool) {
        self.values_changed = false;
        let mut n = 0;
        while let Some(&(until, id)) = self.by_end.first().map(walked) {
            if until > now_ms {
                break;
            }
            self.remove(id);
            n += 1;
        }
        (n, std::mem::take(&mut self.values_changed))
    }

    /// The next end of a decision, Unix ms.
    pub fn next_end(&self) -> Option<u64> {
        self.by_end.first().map(|(t, _)| *t)
    }

    /// The prefixes of the Ip and Range decisions in force, each once,
    /// sorted.
    pub fn prefixes(&self) -> Vec<IpNet> {
        let mut v = Vec::with_capacity(self.values);
        v.extend(self.value_iter().filter_map(|v| if let Value::Net(n) = v { Some(*n) } else { None }));
        v
    }

    /// The set's entries: the prefixes of the Ip and Range decisions, and
    /// the networks of each country and AS held (from `scoped`), each
    /// once, sorted; with what put each network of a country or AS there
    /// (none when no country nor AS is held).
    pub fn entries(&self, scoped: &Scoped) -> (Vec<IpNet>, Option<crate::mmdb::Labels>) {
        let mut v = self.prefixes();
        let mut labels = Vec::new();
        for l in self.scope_values() {
            for n in scoped.networks(l).unwrap_or_default() {
                labels.push((*n, l.clone()));
            }
        }
        if labels.is_empty() {
            return (v, None);
        }
        v.extend(labels.iter().map(|p| p.0));
        v.sort_unstable();
        v.dedup();
        (v, Some(crate::mmdb::Labels::new(labels)))
    }

    /// Decisions in force by scope (`ip`, `range`, `country`, `as`).
    pub fn by_scope(&self) -> BTreeMap<String, u64> {
        self.by_scope.iter().map(|(s, n)| (s.to_string(), *n)).collect()
    }

    pub fn by_origin(&self) -> BTreeMap<String, u64> {
        self.by_origin.iter().map(|(o, n)| (o.to_string(), *n)).collect()
    }
}

/// The feed's state file: `{"held": {"ID": {"net", "until_ms", "origin"}}}`.
impl Serialize for Store {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        #[derive(Serialize)]
        struct Out<'a> {
            #[serde(skip_serializing_if = "Option::is_none")]
            net: Option<IpNet>,
            #[serde(skip_serializing_if = "Option::is_none")]
            country: Option<&'a str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            asn: Option<u32>,
            until_ms: u64,
            origin: &'a str,
        }
        struct Map<'a>(&'a HashMap<i64, Held>);
        impl Serialize for Map<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                use crate::mmdb::Label;
                s.collect_map(self.0.iter().map(|(id, h)| {
                    let (net, country, asn) = match &h.value {
                        Value::Net(n) => (Some(*n), None, None),
                        Value::Scope(Label::Country(c)) => (None, Some(c.as_str()), None),
                        Value::Scope(Label::As(a)) => (None, None, Some(*a)),
                    };
                    (id, Out { net, country, asn, until_ms: h.until_ms, origin: &h.origin })
                }))
            }
        }
        let mut st = s.serialize_struct("Store", 1)?;
        st.serialize_field("held", &Map(&self.held))?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for Store {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Store, D::Error> {
        #[derive(Deserialize)]
        struct In {
            #[serde(default)]
            net: Option<IpNet>,
            #[serde(default)]
            country: Option<String>,
            #[serde(default)]
            asn: Option<u32>,
            until_ms: u64,
            origin: String,
        }
        #[derive(Deserialize)]
        struct File {
            held: HashMap<i64, In>,
        }
        let f = File::deserialize(d)?;
        let mut st = Store::default();
        let mut origins: BTreeMap<String, Arc<str>> = BTreeMap::new();
        for (id, h) in f.held {
            let origin = origins.entry(h.origin).or_insert_with_key(|k| Arc::from(k.as_str())).clone();
            use crate::mmdb::Label;
            let value = match (h.net, h.country, h.asn) {
                (Some(n), _, _) => Value::Net(n),
                (None, Some(c), _) => Value::Scope(Label::Country(c)),
                (None, None, Some(a)) => Value::Scope(Label::As(a)),
                (None, None, None) => {
                    return Err(serde::de::Error::custom(format!("decision {id}: no net, country or asn")));
                }
            };
            st.insert(id, Held { value, until_ms: h.until_ms, origin });
            // Ids of its own below those held: a restored store never
            // gives a new decision the id of one it holds.
            st.anon = st.anon.min(id);
        }
        st.values_changed = false;
        Ok(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    #[test]
    fn the_fixed_skip_reasons_are_those_skips_print() {
        let fixed = [Skip::Origin, Skip::Scenario, Skip::InvalidValue, Skip::HostBits, Skip::TooWide, Skip::Over];
        let names: Vec<String> = fixed.iter().map(Skip::to_string).collect();
        assert_eq!(names, SKIP_REASONS);
    }

    fn settings() -> Settings {
        CrowdsecConfig { lapi_url: "http://127.0.0.1:8080/".into(), api_key: Some("k".into()), ..Default::default() }
            .settings(std::path::Path::new("/"))
            .unwrap()
    }

    fn d(id: i64, scope: &str, value: &str, kind: &str, duration: &str) -> Decision {
        Decision {
            id: Some(id),
            origin: Some("cscli".into()),
            kind: Some(kind.to_string()),
            scope: Some(scope.to_string()),
            value: Some(value.to_string()),
            duration: Some(duration.to_string()),
            scenario: Some("manual".into()),
        }
    }

    /// A decision as the stream sends it.
    fn dj(id: i64, scope: &str, value: &str, kind: &str, duration: &str) -> Value {
        json!({"id": id, "origin": "cscli", "type": kind, "scope": scope, "value": value, "duration": duration,
               "scenario": "manual"})
    }

    fn pull(s: &Settings, new: Vec<Value>, deleted: Vec<Value>) -> Pull {
        parse_stream(s, json!({"new": new, "deleted": deleted}).to_string().as_bytes()).unwrap()
    }

    fn net(v: &str) -> IpNet {
        v.parse().unwrap()
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
        assert_eq!(s.full_every, Some(DEFAULT_FULL_SYNC_EVERY));
        let never = CrowdsecConfig { full_sync_every: Some("0s".into()), ..ok.clone() };
        assert_eq!(never.settings(std::path::Path::new("/")).unwrap().full_every, None);
        let hourly = CrowdsecConfig { full_sync_every: Some("1h".into()), ..ok.clone() };
        assert_eq!(hourly.settings(std::path::Path::new("/")).unwrap().full_every, Some(Duration::from_secs(3600)));
        // Slow pulls of changes: the default whole pull is never more often.
        let slow = CrowdsecConfig { update_frequency: Some("1h".into()), ..ok.clone() };
        assert_eq!(slow.settings(std::path::Path::new("/")).unwrap().full_every, Some(Duration::from_secs(3600)));
        for bad in [
            CrowdsecConfig { full_sync_every: Some("5s".into()), ..ok.clone() },
            CrowdsecConfig { full_sync_every: Some("2d".into()), ..ok.clone() },
            CrowdsecConfig { full_sync_every: Some("often".into()), ..ok.clone() },
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
        // Readable by others (as `tee` leaves it under umask 022): taken,
        // and warned of; 0600: no warning.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.join("key"), std::fs::Permissions::from_mode(0o644)).unwrap();
        let s = f.settings(&dir).unwrap();
        assert_eq!(s.api_key, "fromfile");
        assert_eq!(s.warnings.len(), 1, "{:?}", s.warnings);
        assert!(s.warnings[0].contains("is mode 0644") && s.warnings[0].contains("chmod 600"), "{:?}", s.warnings);
        assert!(!s.warnings[0].contains("fromfile"), "the warning quotes the secret");
        std::fs::set_permissions(dir.join("key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(f.settings(&dir).unwrap().warnings.is_empty());
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
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.7", "ban", "1h")), Ok(super::Value::Net(net("192.0.2.7/32"))));
        assert_eq!(
            Store::admit(&s, &d(1, "Ip", "2001:db8::1", "ban", "1h")),
            Ok(super::Value::Net(net("2001:db8::1/128")))
        );
        assert_eq!(
            Store::admit(&s, &d(1, "Range", "198.51.100.0/24", "ban", "1h")),
            Ok(super::Value::Net(net("198.51.100.0/24")))
        );
        assert_eq!(Store::admit(&s, &d(1, "Range", "198.51.100.9/24", "ban", "1h")), Err(Skip::HostBits));
        assert_eq!(
            Store::admit(&s, &d(1, "Ip", "::ffff:192.0.2.8", "ban", "1h")),
            Ok(super::Value::Net(net("192.0.2.8/32")))
        );
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.7", "captcha", "1h")), Err(Skip::Type("captcha".into())));
        assert_eq!(Store::admit(&s, &d(1, "Country", "FR", "ban", "1h")), Err(Skip::Scope("country".into())));
        assert_eq!(Store::admit(&s, &d(1, "Ip", "192.0.2.300", "ban", "1h")), Err(Skip::InvalidValue));
        assert_eq!(
            Store::admit(&s, &d(1, "Ip", "192.0.2.0/24", "ban", "1h")),
            Ok(super::Value::Net(net("192.0.2.0/24")))
        );
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

    /// Values through the one prefix parser, told apart as before.
    #[test]
    fn values_are_parsed_by_the_prefix_parser_and_classified() {
        for (v, want) in [
            (" 192.0.2.7 ", Ok(net("192.0.2.7/32"))),
            ("2001:db8::/48", Ok(net("2001:db8::/48"))),
            ("::ffff:192.0.2.0/120", Ok(net("192.0.2.0/24"))),
            ("::ffff:192.0.2.9", Ok(net("192.0.2.9/32"))),
            ("192.0.2.9/24", Err(Skip::HostBits)),
            ("::ffff:192.0.2.9/120", Err(Skip::HostBits)),
            ("2001:db8::1/32", Err(Skip::HostBits)),
            // A mapped block shorter than /8 names no IPv4 prefix taken.
            ("::ffff:0:0/96", Err(Skip::InvalidValue)),
            ("192.0.2.0/33", Err(Skip::InvalidValue)),
            ("bogus", Err(Skip::InvalidValue)),
            ("", Err(Skip::InvalidValue)),
        ] {
            assert_eq!(value_net(v), want, "{v:?}");
        }
    }

    #[test]
    fn a_value_with_host_bits_is_refused_counted_and_logged_not_widened() {
        let s = settings();
        let p = pull(
            &s,
            vec![dj(1, "Range", "10.214.0.0/8", "ban", "1h"), dj(2, "Range", "2001:db8::1/32", "ban", "1h")],
            vec![],
        );
        assert!(p.new.is_empty(), "{p:?}");
        assert_eq!((p.received, p.skipped.get("host_bits")), (2, Some(&2)));
        assert_eq!(p.examples[0], (Skip::HostBits, "10.214.0.0/8".to_string()));
        let mut st = Store::default();
        st.apply(&s, &p, true, 0).unwrap();
        assert!(st.prefixes().is_empty(), "a value with host bits was widened into the set");
    }

    #[test]
    fn startup_replaces_deltas_add_and_delete_and_each_decision_ends_at_its_end() {
        let s = settings();
        let mut st = Store::default();
        let p = pull(
            &s,
            vec![
                dj(1, "Ip", "192.0.2.1", "ban", "10s"),
                dj(2, "Ip", "192.0.2.1", "ban", "20s"),
                dj(3, "Range", "198.51.100.0/24", "ban", "30s"),
                dj(4, "Ip", "192.0.2.9", "captcha", "30s"),
                dj(5, "Ip", "bogus", "ban", "30s"),
                dj(6, "Ip", "192.0.2.6", "ban", "-1s"),
            ],
            vec![],
        );
        assert_eq!((p.received, p.skipped.values().sum::<u64>()), (6, 3));
        let a = st.apply(&s, &p, true, 1_000_000).unwrap();
        assert_eq!((a.added, a.changed), (3, true));
        assert_eq!((st.prefixes().len(), st.values()), (2, 2));
        assert_eq!(st.next_end(), Some(1_010_000));
        // Id 1 ends; the value stays while id 2 is in force: no change.
        assert_eq!(st.expire(1_010_000), (1, false));
        assert_eq!(st.prefixes().len(), 2);
        assert_eq!(st.expire(1_020_000), (1, true));
        assert_eq!(st.prefixes(), vec![net("198.51.100.0/24")]);
        // A delta: delete 3, add 7 (IPv6).
        let p = pull(
            &s,
            vec![dj(7, "Ip", "2001:db8::7", "ban", "1h")],
            vec![dj(3, "Range", "198.51.100.0/24", "ban", "-5s")],
        );
        let a = st.apply(&s, &p, false, 1_021_000).unwrap();
        assert_eq!((a.added, a.deleted, a.changed), (1, 1, true));
        assert_eq!(st.prefixes(), vec![net("2001:db8::7/128")]);
        // Nothing new: no change, no import.
        let a = st.apply(&s, &pull(&s, vec![], vec![]), false, 1_022_000).unwrap();
        assert!(!a.changed);
        // A decision renewed under a new id for a value held: no change.
        let a =
            st.apply(&s, &pull(&s, vec![dj(9, "Ip", "2001:db8::7", "ban", "2h")], vec![]), false, 1_023_000).unwrap();
        assert_eq!((a.added, a.changed), (1, false));
        // A startup pull is the whole truth.
        let a = st.apply(&s, &pull(&s, vec![dj(8, "Ip", "192.0.2.8", "ban", "1h")], vec![]), true, 1).unwrap();
        assert!(a.changed);
        assert_eq!(a.deleted, 2);
        assert_eq!(st.len(), 1);
        assert_eq!(st.by_origin().get("cscli"), Some(&1));
        // The same startup again: nothing to write, nothing added or
        // deleted (a whole pull that agrees with what is held).
        let a = st.apply(&s, &pull(&s, vec![dj(8, "Ip", "192.0.2.8", "ban", "1h")], vec![]), true, 2).unwrap();
        assert!(!a.changed);
        assert_eq!((a.added, a.deleted), (0, 0));
        // One the pulls of changes missed: one added, none deleted.
        let both = vec![dj(8, "Ip", "192.0.2.8", "ban", "1h"), dj(10, "Ip", "192.0.2.10", "ban", "1h")];
        let a = st.apply(&s, &pull(&s, both, vec![]), true, 3).unwrap();
        assert_eq!((a.added, a.deleted, a.changed), (1, 0, true));
    }

    /// A valid but empty (or much shorter) whole answer does not lift a
    /// blocklist at once: what it leaves out stays (what it adds is taken)
    /// until whole answers have said so for a minute; one that agrees
    /// with what is held ends the doubt.
    #[test]
    fn a_whole_answer_removing_most_is_taken_only_once_said_for_a_minute() {
        let s = settings();
        let hosts = |from: i64, n: i64| -> Vec<Value> {
            (from..from + n).map(|i| dj(i, "Ip", &format!("192.0.2.{i}"), "ban", "1h")).collect()
        };
        let empty = || pull(&s, vec![], vec![]);
        let mut st = Store::default();
        st.apply(&s, &pull(&s, hosts(1, 40), vec![]), true, 0).unwrap();
        let before = st.clone();
        // Empty: doubted, nothing removed, said with the numbers; and
        // again while whole answers have said so for less than a minute.
        let a = st.apply(&s, &empty(), true, 1_000).unwrap();
        assert_eq!(a.doubt, Some(Doubt { deleted: 40, held: 40, for_ms: 0 }));
        assert_eq!((a.added, a.deleted, a.changed), (0, 0, false));
        assert!(a.doubt.unwrap().to_string().contains("remove 40 of the 40 decisions in force"));
        let a = st.apply(&s, &empty(), true, 1_000 + SHRINK_CONFIRM_MS - 1).unwrap();
        assert_eq!(a.doubt, Some(Doubt { deleted: 40, held: 40, for_ms: SHRINK_CONFIRM_MS - 1 }));
        assert_eq!(st, before);
        assert_eq!(st.prefixes(), before.prefixes());
        // Said for a minute: taken, and said so.
        let a = st.apply(&s, &empty(), true, 1_000 + SHRINK_CONFIRM_MS).unwrap();
        assert_eq!((a.deleted, a.doubted_ms, a.doubt, st.len()), (40, Some(SHRINK_CONFIRM_MS), None, 0));
        // A doubted answer's new decisions are taken at once; an id-less
        // one once, however many doubted answers repeat it.
        st.apply(&s, &pull(&s, hosts(1, 40), vec![]), true, 100_000).unwrap();
        let mut anon = dj(0, "Ip", "198.51.100.1", "ban", "1h");
        if let Value::Object(m) = &mut anon {
            m.remove("id");
        }
        let mut short = hosts(41, 3);
        short.push(anon);
        for t in [101_000, 102_000] {
            let a = st.apply(&s, &pull(&s, short.clone(), vec![]), true, t).unwrap();
            assert!(a.doubt.is_some(), "{a:?}");
            assert_eq!(a.added, if t == 101_000 { 4 } else { 0 });
            assert_eq!(st.len(), 44);
        }
        // An answer that agrees with what is held ends the doubt: a later
        // shrinking one is doubted anew.
        let mut all = hosts(1, 43);
        all.push(short[3].clone());
        let a = st.apply(&s, &pull(&s, all, vec![]), true, 103_000).unwrap();
        assert_eq!((a.doubt, st.len()), (None, 44));
        let a = st.apply(&s, &empty(), true, 200_000).unwrap();
        assert_eq!(a.doubt.map(|d| d.for_ms), Some(0));
        assert_eq!(st.len(), 44);
        // Half or less, or fewer than SHRINK_MIN: taken at once.
        let a = st.apply(&s, &pull(&s, hosts(1, 22), vec![]), true, 201_000).unwrap();
        assert_eq!((a.deleted, a.doubted_ms, a.doubt), (22, None, None));
        assert_eq!(st.apply(&s, &pull(&s, hosts(1, 13), vec![]), true, 202_000).unwrap().deleted, 9);
        assert!(st.apply(&s, &empty(), true, 203_000).unwrap().doubt.is_some());
        let mut small = Store::default();
        small.apply(&s, &pull(&s, hosts(1, 9), vec![]), true, 0).unwrap();
        assert_eq!(small.apply(&s, &empty(), true, 1).unwrap().deleted, 9);
        // Deletions named one by one (a pull of changes) are not doubted.
        let mut st = Store::default();
        st.apply(&s, &pull(&s, hosts(1, 40), vec![]), true, 0).unwrap();
        assert_eq!(st.apply(&s, &pull(&s, vec![], hosts(1, 40)), false, 1).unwrap().deleted, 40);
    }

    #[test]
    fn null_lists_are_empty_and_unknown_fields_ignored() {
        let s = settings();
        let p = parse_stream(&s, &br#"{"new":null,"deleted":null}"#[..]).unwrap();
        assert!(p.new.is_empty() && p.deleted.is_empty());
        let text = r#"{"deleted":null,"new":[{"duration":"3h59m59s","id":1,"origin":"cscli","scenario":"x","scope":"Ip","type":"ban","value":"1.2.3.4","extra":{"a":[1]}}],"more":1}"#;
        let p = parse_stream(&s, text.as_bytes()).unwrap();
        assert_eq!(p.new.len(), 1);
        assert_eq!(p.new[0].value, super::Value::Net(net("1.2.3.4/32")));
        assert_eq!(&*p.new[0].origin, "cscli");
    }

    #[test]
    fn an_answer_that_is_not_the_stream_is_refused_and_changes_nothing() {
        let s = settings();
        for bad in [
            r#"{"message":"maintenance"}"#,
            r#"{"new":[]}"#,
            r#"{"deleted":null}"#,
            r#"{}"#,
            r#"[]"#,
            r#"null"#,
            r#"{"new":{"a":1},"deleted":null}"#,
            r#"{"new":null,"deleted":null,"new":null}"#,
            r#"{"new":null,"deleted":null} x"#,
            r#"{"new":[{"id":1,"type":"ban","scope":"Ip","value":"1.2.3.4","duration":"1h"}"#,
        ] {
            assert!(parse_stream(&s, bad.as_bytes()).is_err(), "{bad} was taken as a stream");
        }
        let e = parse_stream(&s, &br#"{"message":"maintenance"}"#[..]).unwrap_err().to_string();
        assert!(e.contains("not a decision stream"), "{e}");
    }

    #[test]
    fn id_less_deletions_remove_their_value_and_cost_what_they_match() {
        let s = settings();
        let mut st = Store::default();
        let n = 200_000u32;
        let new: Vec<New> = (0..n)
            .map(|i| New {
                id: Some(i64::from(i)),
                value: super::Value::Net(IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(
                    0x0a00_0000 + i,
                )))),
                ms_left: 3_600_000,
                origin: Arc::from("cscli"),
            })
            .collect();
        let mut p = Pull { new, ..Pull::default() };
        // Two decisions of one value, and a range that starts at an
        // address deleted by value (not deleted with it).
        p.new.push(New { id: Some(-7), ..p.new[5].clone() });
        p.new.push(New { id: Some(1_000_000), value: super::Value::Net(net("10.0.0.8/29")), ..p.new[5].clone() });
        st.apply(&s, &p, true, 0).unwrap();
        assert_eq!((st.len(), st.values()), (n as usize + 2, n as usize + 1));
        let gone = |v: &str| json!({"type": "ban", "scope": "Ip", "value": v, "duration": "-1s"});
        let a = st.apply(&s, &pull(&s, vec![], vec![gone("10.0.0.5"), gone("10.0.0.8")]), false, 1).unwrap();
        assert_eq!((a.deleted, a.changed), (3, true));
        assert!(st.prefixes().contains(&net("10.0.0.8/29")));
        assert!(!st.prefixes().contains(&net("10.0.0.5/32")));
        // 200 deletions by value over 200 000 held: each a lookup of the
        // entries it matches, not a scan of every value held (200 x 200 000
        // entries). The work is counted, not timed: a busy host cannot fail it.
        let dels: Vec<Value> =
            (1000..1200u32).map(|i| gone(&std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string())).collect();
        let p = pull(&s, vec![], dels);
        let walked = || WALKED.with(std::cell::Cell::get);
        let w0 = walked();
        let a = st.apply(&s, &p, false, 2).unwrap();
        let took = walked() - w0;
        assert_eq!(a.deleted, 200);
        assert!(took <= 2 * 200, "200 deletions by value walked {took} entries of the indexes");
        // A delta with no change walks nothing of what is held.
        let w0 = walked();
        let a = st.apply(&s, &pull(&s, vec![], vec![]), false, 3).unwrap();
        assert!(!a.changed && walked() == w0, "an empty delta walked {} entries", walked() - w0);
        // The counter sees a walk of what is held: listing the set's
        // entries walks each of them.
        let w0 = walked();
        assert_eq!(st.prefixes().len(), st.values());
        assert!(walked() - w0 >= st.values() as u64);
    }

    #[test]
    fn a_pull_beyond_max_cover_is_refused_whole_and_what_was_in_force_stays() {
        let s = settings();
        assert_eq!((s.max_cover_v4, s.max_cover_v6), (7, 31));
        let mut st = Store::default();
        let first =
            pull(&s, vec![dj(1, "Ip", "192.0.2.1", "ban", "1h"), dj(2, "Range", "10.0.0.0/8", "ban", "1h")], vec![]);
        st.apply(&s, &first, true, 0).unwrap();
        let before = st.clone();
        // Two /8s and a host: more than a /7's worth.
        let more = pull(&s, vec![dj(3, "Range", "11.0.0.0/8", "ban", "1h")], vec![]);
        let e = st.apply(&s, &more, false, 1).unwrap_err();
        assert!(e.contains("max_cover_v4 = 7") && e.contains("refused"), "{e}");
        // Said once: the daemon's log adds what stays in force.
        assert!(e.matches("refused").count() == 1 && !e.contains("in force"), "{e}");
        assert_eq!(st, before, "a refused delta changed what is held");
        assert_eq!(st.prefixes(), before.prefixes());
        assert_eq!(st.cover(), before.cover());
        // 256 /8s: all of IPv4, refused as a startup pull; nothing changes.
        let all: Vec<Value> = (0..256).map(|i| dj(10 + i, "Range", &format!("{i}.0.0.0/8"), "ban", "1h")).collect();
        let e = st.apply(&s, &pull(&s, all, vec![]), true, 2).unwrap_err();
        assert!(e.contains("4294967296 IPv4 addresses"), "{e}");
        assert_eq!(st, before);
        // Within the bound: taken (the /8 replaced by another and a host).
        let ok =
            pull(&s, vec![dj(3, "Range", "11.0.0.0/8", "ban", "1h")], vec![dj(2, "Range", "10.0.0.0/8", "ban", "-1s")]);
        assert!(st.apply(&s, &ok, false, 3).unwrap().changed);
        assert_eq!(st.cover().0, (1 << 24) + 1);
        // IPv6: three /32s are more than a /31's worth.
        let v6: Vec<Value> = (0..3).map(|i| dj(400 + i, "Range", &format!("2001:db{i}::/32"), "ban", "1h")).collect();
        assert!(st.apply(&s, &pull(&s, v6, vec![]), false, 4).is_err());
        // Configurable; a bound that is no prefix length is refused.
        let base = CrowdsecConfig {
            lapi_url: "http://127.0.0.1:8080/".into(),
            api_key: Some("k".into()),
            ..Default::default()
        };
        let wide =
            CrowdsecConfig { max_cover_v4: Some(0), ..base.clone() }.settings(std::path::Path::new("/")).unwrap();
        let all: Vec<Value> = (0..256).map(|i| dj(10 + i, "Range", &format!("{i}.0.0.0/8"), "ban", "1h")).collect();
        assert!(st.apply(&wide, &pull(&wide, all, vec![]), true, 5).is_ok());
        for bad in [
            CrowdsecConfig { max_cover_v4: Some(33), ..base.clone() },
            CrowdsecConfig { max_cover_v6: Some(129), ..base },
        ] {
            let e = bad.settings(std::path::Path::new("/")).unwrap_err().to_string();
            assert!(e.contains("max_cover"), "{e}");
            // The example is of the key that is wrong.
            let (key, other) = if bad.max_cover_v6.is_some() { ("v6 = 31", "v4") } else { ("v4 = 7", "v6") };
            assert!(e.contains(&format!("max_cover_{key}")) && !e.contains(&format!("max_cover_{other}")), "{e}");
        }
    }

    /// A stricter `min_prefix_len` bounds each decision, not the feed: the
    /// default cover stays a /7's (a /31's) worth, and a feed of a few
    /// thousand hosts is taken (a default of `min_prefix_len - 1`, /23,
    /// refused any feed of more than 512 hosts).
    #[test]
    fn a_stricter_min_prefix_len_does_not_shrink_the_default_cover() {
        let with = |v4: u8, v6: u8| {
            CrowdsecConfig {
                lapi_url: "http://127.0.0.1:8080/".into(),
                api_key: Some("k".into()),
                min_prefix_len_v4: Some(v4),
                min_prefix_len_v6: Some(v6),
                ..Default::default()
            }
            .settings(std::path::Path::new("/"))
            .unwrap()
        };
        let s = with(24, 64);
        assert_eq!((s.max_cover_v4, s.max_cover_v6), (7, 31));
        // Wider single decisions allowed: twice the widest.
        let wide = with(4, 16);
        assert_eq!((wide.max_cover_v4, wide.max_cover_v6), (3, 15));
        let hosts: Vec<Value> = (0..2000u32)
            .map(|i| dj(i64::from(i), "Ip", &std::net::Ipv4Addr::from(0x0a00_0000 + i).to_string(), "ban", "1h"))
            .chain((0..2000u32).map(|i| dj(10_000 + i64::from(i), "Ip", &format!("2001:db8::{i:x}"), "ban", "1h")))
            .collect();
        let mut st = Store::default();
        let a = st.apply(&s, &pull(&s, hosts, vec![]), true, 0).unwrap();
        assert_eq!((a.added, st.values()), (4000, 4000));
        // The bound still holds: 33 /8s are more than a /3's worth.
        let eights: Vec<Value> =
            (0..33).map(|i| dj(20_000 + i, "Range", &format!("{}.0.0.0/8", 100 + i), "ban", "1h")).collect();
        let e = st.apply(&wide, &pull(&wide, eights, vec![]), true, 1).unwrap_err();
        assert!(e.contains("max_cover_v4 = 3"), "{e}");
    }

    /// A restart must not bring back what a pull would be refused: a state
    /// file beyond `max_cover` (written before the bound, or under a wider
    /// one) is refused, one within it restored less what ended.
    #[test]
    fn a_state_file_beyond_max_cover_is_not_restored() {
        let s = settings();
        let beyond = r#"{"held":{"1":{"net":"10.0.0.0/8","until_ms":9000,"origin":"cscli"},
                                 "2":{"net":"11.0.0.0/8","until_ms":9000,"origin":"cscli"},
                                 "3":{"net":"192.0.2.1/32","until_ms":9000,"origin":"cscli"}}}"#;
        match Store::restore(beyond.as_bytes(), &s, 10) {
            Err(Restore::Cover(why)) => assert!(why.contains("max_cover_v4 = 7"), "{why}"),
            other => panic!("a state file beyond max_cover was taken: {other:?}"),
        }
        // The same file once one /8 has ended: within the bound.
        let some_ended = beyond.replacen(r#""until_ms":9000"#, r#""until_ms":5"#, 1);
        let (st, ended) = Store::restore(some_ended.as_bytes(), &s, 10).unwrap();
        assert_eq!((st.len(), ended), (2, 1));
        assert!(matches!(Store::restore(b"{}", &s, 10), Err(Restore::Unreadable(_))));
    }

    #[test]
    fn the_state_file_round_trips_and_old_files_read() {
        let s = settings();
        let mut st = Store::default();
        let p = parse_stream(
            &s,
            br#"{"new":[{"type":"ban","scope":"Ip","value":"192.0.2.1","duration":"1h","origin":"cscli"},
                        {"id":5,"type":"ban","scope":"Range","value":"2001:db8::/48","duration":"1h","origin":"lists"}],
                 "deleted":null}"#
                .as_slice(),
        )
        .unwrap();
        st.apply(&s, &p, true, 10).unwrap();
        let text = serde_json::to_string(&st).unwrap();
        let back: Store = serde_json::from_str(&text).unwrap();
        assert_eq!(back, st);
        assert_eq!((back.values(), back.prefixes(), back.next_end()), (st.values(), st.prefixes(), st.next_end()));
        assert_eq!(back.by_origin(), st.by_origin());
        // A new decision without an id after a restore takes an id not held.
        let mut back = back;
        let p = parse_stream(
            &s,
            br#"{"new":[{"type":"ban","scope":"Ip","value":"192.0.2.2","duration":"1h"}],"deleted":null}"#.as_slice(),
        )
        .unwrap();
        back.apply(&s, &p, false, 11).unwrap();
        assert_eq!(back.len(), 3);
        // The file of the version before.
        let old = r#"{"held":{"7":{"net":"198.51.100.0/24","until_ms":99,"origin":"cscli"}}}"#;
        let st: Store = serde_json::from_str(old).unwrap();
        assert_eq!((st.len(), st.prefixes(), st.next_end()), (1, vec![net("198.51.100.0/24")], Some(99)));
    }

    /// `country_mmdb` and `asn_mmdb` of the host tests' databases
    /// (`policer-user/testdata/`, written by mmdb-writer).
    fn scoped_settings(max_cover_v4: Option<u8>) -> Settings {
        let data = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata");
        let mut s = CrowdsecConfig {
            lapi_url: "http://127.0.0.1:8080/".into(),
            api_key: Some("k".into()),
            country_mmdb: Some("country.mmdb".into()),
            asn_mmdb: Some("asn.mmdb".into()),
            max_cover_v4,
            ..Default::default()
        }
        .settings(&data)
        .unwrap();
        assert_eq!(s.load_mmdb(), Vec::<String>::new());
        s
    }

    #[test]
    fn country_and_as_decisions_are_their_networks_counted_by_scope_and_bounded_by_cover() {
        use crate::mmdb::Label;
        let s = scoped_settings(None);
        assert_eq!(s.stream_path(true), "/v1/decisions/stream?startup=true&scopes=ip%2Crange%2Ccountry%2Cas");
        assert_eq!(
            Store::admit(&s, &d(1, "Country", "fr", "ban", "1h")),
            Ok(super::Value::Scope(Label::Country("FR".into())))
        );
        assert_eq!(Store::admit(&s, &d(1, "AS", "AS64501", "ban", "1h")), Ok(super::Value::Scope(Label::As(64501))));
        assert_eq!(Store::admit(&s, &d(1, "Country", "France", "ban", "1h")), Err(Skip::InvalidValue));
        let p = pull(
            &s,
            vec![
                dj(1, "Country", "DE", "ban", "1h"),
                dj(2, "AS", "64501", "ban", "1h"),
                dj(3, "Ip", "192.0.2.9", "ban", "1h"),
            ],
            vec![],
        );
        let mut st = Store::default();
        st.apply(&s, &p, true, 0).unwrap();
        let (entries, labels) = st.entries(&s.scoped);
        let labels = labels.unwrap();
        // DE: 10.1.0.0/16, 192.0.2.0/24, 2001:db8:1::/48; AS64501: 10.1.0.0/16, 2001:db8::/32.
        let want: Vec<IpNet> = ["10.1.0.0/16", "192.0.2.0/24", "192.0.2.9/32", "2001:db8::/32", "2001:db8:1::/48"]
            .iter()
            .map(|n| net(n))
            .collect();
        assert_eq!(entries, want);
        assert_eq!(labels.get(&net("192.0.2.0/24")), Some(&Label::Country("DE".into())));
        assert_eq!(labels.get(&net("2001:db8::/32")), Some(&Label::As(64501)));
        assert_eq!(labels.get(&net("192.0.2.9/32")), None);
        assert_eq!(st.by_scope(), [("as".to_string(), 1), ("country".to_string(), 1), ("ip".to_string(), 1)].into());
        // A country's cover is its networks' addresses: DE's and AS64501's
        // 10.1.0.0/16 count twice, plus the /24 and the host.
        assert_eq!(st.cover_in(&s.scoped).0, 2 * 65536 + 256 + 1);
        // The state file keeps them; a restart reads them back.
        let text = serde_json::to_vec(&st).unwrap();
        let (back, _) = Store::restore(&text, &s, 0).unwrap();
        assert_eq!(back, st);
        // Ended at their end.
        let (n, changed) = st.expire(3_600_000);
        assert_eq!((n, changed), (3, true));
        assert_eq!(st.entries(&s.scoped), (vec![], None));
        // A country bigger than max_cover_v4 is refused whole: FR holds
        // most of 10.0.0.0/8 (more than a /9's worth with 198.51.100.0/24).
        let tight = scoped_settings(Some(9));
        let mut st = Store::default();
        let e = st
            .apply(&tight, &pull(&tight, vec![dj(1, "Country", "FR", "ban", "1h")], vec![]), true, 0)
            .unwrap_err()
            .to_string();
        assert!(e.contains("max_cover_v4 = 9"), "{e}");
        assert!(st.is_empty());
        // A deletion without an id, by its value.
        let mut st = Store::default();
        st.apply(&s, &pull(&s, vec![dj(1, "Country", "DE", "ban", "1h")], vec![]), true, 0).unwrap();
        let gone = json!({"type": "ban", "scope": "Country", "value": "de", "duration": "-1s"});
        let a = st.apply(&s, &pull(&s, vec![], vec![gone]), false, 0).unwrap();
        assert!(a.changed && st.is_empty());
    }

    #[test]
    fn without_their_database_country_and_as_scopes_are_refused_and_skipped() {
        let e = CrowdsecConfig {
            lapi_url: "http://127.0.0.1:8080/".into(),
            api_key: Some("k".into()),
            scopes: vec!["ip".into(), "country".into()],
            ..Default::default()
        }
        .settings(std::path::Path::new("/"))
        .unwrap_err()
        .to_string();
        assert!(e.contains("country_mmdb"), "{e}");
        let mut s = CrowdsecConfig {
            lapi_url: "http://127.0.0.1:8080/".into(),
            api_key: Some("k".into()),
            country_mmdb: Some("/nonexistent/country.mmdb".into()),
            ..Default::default()
        }
        .settings(std::path::Path::new("/"))
        .unwrap();
        let w = s.load_mmdb();
        assert!(w.len() == 1 && w[0].contains("/nonexistent/country.mmdb") && w[0].contains("skipped"), "{w:?}");
        assert_eq!(Store::admit(&s, &d(1, "Country", "FR", "ban", "1h")), Err(Skip::Scope("country".into())));
    }
}
