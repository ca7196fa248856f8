//! Rules as operators write them (CLI and config file), validated into
//! what the kernel needs. One place decides what is a valid rule.

use ipnet::IpNet;
use policer_common::{
    Rule,
    bucket::Action,
    rate::Rate,
    wire::{DEFAULT_KEY_LEN_V4, DEFAULT_KEY_LEN_V6},
};
use serde::{Deserialize, Serialize};

use crate::{
    classes::{Class, ClassText},
    error::{Error, Result},
    prefix::parse_prefix,
};

/// A burst as written in TOML: a number of packets, or a size string.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum BurstValue {
    Count(u64),
    Text(String),
}

/// A rule as written: in the config file (`[[rule]]`) and on the wire
/// between CLI and daemon.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleConfig {
    pub prefix: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<BurstValue>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<Action>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_len: Option<u32>,
    /// The class (see [`crate::classes`]): `tcp`, `udp`, `icmp`, `icmpv6`,
    /// `sctp`, `udplite` or a number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proto: Option<String>,
    /// Destination port or `LOW-HIGH` (a number or a string in TOML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dport: Option<PortValue>,
    /// Source port or `LOW-HIGH` (TCP and UDP; a number or a string in
    /// TOML).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sport: Option<PortValue>,
    /// `syn`, `syn,!ack`, `rst`, ...
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tcp_flags: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub icmp_type: Option<u32>,
    /// Destination prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// Aggregate rate of the whole rule (all its sources together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_rate: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_burst: Option<BurstValue>,
    /// The fleet budget this rule's total is a node's share of
    /// (`--global NAME`, `[global]`: docs/fleet.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<String>,
    /// SYN cookies (a TCP class): `off`, `flood` or `always`
    /// (docs/syn-cookies.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_cookies: Option<String>,
    /// The reflection cap: SYN-ACKs a second toward one /24 (IPv6: /48).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_ack_rate: Option<String>,
    /// Automatic bans: a source whose bucket refuses `ban_after` frames
    /// (default 1) since it was last admitted, or within `ban_within`, is
    /// banned this long
    /// ([`crate::duration`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_for: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_after: Option<u32>,
    /// The longest a repeated ban grows to (doubling); none: no growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_max: Option<String>,
    /// `ban_after` refusals within this window start a ban, admissions or
    /// not (fail2ban's findtime); none: refusals since the last admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban_within: Option<String>,
    /// Whether the classes of shorter (covering) prefixes apply under this
    /// rule's prefix where it defines no class of its own (default true;
    /// `false`: this prefix's own rules alone, the behaviour before issue
    /// 43; see [`crate::classes`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherit: Option<bool>,
    /// A manual ban (`policer ban`): every frame from the prefix is
    /// dropped, whatever rule a more specific prefix has, until `expires`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ban: Option<bool>,
    /// Why (a manual ban), as the operator wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the entry ends and is removed (RFC 3339 UTC, as written by
    /// [`crate::duration::rfc3339`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires: Option<String>,
    /// On the wire only (`--ttl`, `ban --for`): the daemon turns it into
    /// `expires` when the request arrives. Refused in the config file,
    /// where every reload would restart it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
}

/// A port as written in TOML: `53` or `"8000-8999"`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PortValue {
    Number(u32),
    Text(String),
}

impl PortValue {
    fn text(&self) -> String {
        match self {
            PortValue::Number(n) => n.to_string(),
            PortValue::Text(t) => t.clone(),
        }
    }
}

/// What identifies a rule: its source prefix and its class; a manual
/// ban of a prefix is an entry of its own beside the prefix's rule.
///
/// Ordered by prefix, class, ban: the class-less rule is a class's least
/// value, so `None` before any class orders as the class itself would.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RuleKey {
    pub net: IpNet,
    /// None: the prefix's class-less rule (`Class::default()`). Boxed: few
    /// rules have a class, and a key is held two or three times for each
    /// of 100 000 rules (32 bytes here against 52 inline).
    class: Option<Box<Class>>,
    pub ban: bool,
}

impl RuleKey {
    pub fn new(net: IpNet, class: Class, ban: bool) -> RuleKey {
        RuleKey { net, class: (!class.is_none()).then(|| Box::new(class)), ban }
    }

    /// Which of the prefix's traffic (none: all of it).
    pub fn class(&self) -> Class {
        self.class.as_deref().copied().unwrap_or_default()
    }
}

impl std::fmt::Display for RuleKey {
    /// `10.0.0.0/8`, `10.0.0.0/8 [udp dport 53]`, or `ban 10.0.0.0/8`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.ban {
            write!(f, "ban {}", self.net)
        } else if self.class.is_none() {
            write!(f, "{}", self.net)
        } else {
            write!(f, "{} [{}]", self.net, self.class())
        }
    }
}

/// A rule's automatic bans (`--ban-for`, `--ban-after`, `--ban-max`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BanPolicy {
    pub ban_for: std::time::Duration,
    pub ban_after: u32,
    /// The longest a repeated ban grows to; None: no growth.
    pub ban_max: Option<std::time::Duration>,
    /// `--ban-within`: `ban_after` refusals within this window ban
    /// (fail2ban's findtime); None: refusals since the last admission.
    pub ban_within: Option<std::time::Duration>,
}

/// When a rule answers SYNs with cookies (`--syn-cookies`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SynMode {
    /// Only while the rule's SYNs of unverified sources exceed its total.
    Flood,
    /// Every SYN of an unverified source.
    Always,
}

impl SynMode {
    /// `off` (None), `flood` or `always`.
    pub fn parse(s: &str) -> Result<Option<SynMode>> {
        match s {
            "off" => Ok(None),
            "flood" => Ok(Some(SynMode::Flood)),
            "always" => Ok(Some(SynMode::Always)),
            _ => Err(Error::Invalid(format!("--syn-cookies '{s}': off, flood or always"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynMode::Flood => "flood",
            SynMode::Always => "always",
        }
    }

    /// The kernel's `SynConf::mode`.
    pub fn kernel(self) -> u32 {
        match self {
            SynMode::Flood => policer_common::syn::SYN_FLOOD,
            SynMode::Always => policer_common::syn::SYN_ALWAYS,
        }
    }
}

/// A rule's SYN cookies: when, and the reflection cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynPolicy {
    pub mode: SynMode,
    /// SYN-ACKs a second toward one /24 (IPv6: /48).
    pub syn_ack_pps: u64,
}

/// `--syn-ack-rate`: packets a second (`500pps`, `2kpps`, or a number).
pub fn parse_syn_ack_rate(s: &str) -> Result<u64> {
    use policer_common::bucket::{MAX_RATE_PPS, MIN_RATE_PPS};
    let bad = || Error::Invalid(format!("--syn-ack-rate '{s}': a packet rate like 500pps or 2kpps"));
    let r = if s.bytes().all(|b| b.is_ascii_digit()) { Rate::parse(&format!("{s}pps")) } else { Rate::parse(s) };
    match r.map_err(|_| bad())? {
        // Above the range the cap's interval would round to 0 ns: no cap at all.
        Rate::Pps(n) if (MIN_RATE_PPS..=MAX_RATE_PPS).contains(&n) => Ok(n),
        Rate::Pps(_) => Err(Error::Invalid(format!(
            "--syn-ack-rate '{s}': out of range ({MIN_RATE_PPS} pps to {MAX_RATE_PPS} pps)"
        ))),
        _ => Err(bad()),
    }
}

/// The longest reason a manual ban keeps.
pub const MAX_REASON: usize = 200;

/// A validated rule.
///
/// What most rules have is inline; what few have (a class, a total,
/// automatic bans, a manual ban) is in one box, none for most rules: a
/// rule is held once for each of 100 000 rules, so its size is the
/// daemon's memory (80 bytes here against 192 with every field inline).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    pub net: IpNet,
    /// None for allow/deny rules written without a rate, and for rules
    /// with only a total.
    pub rate: Option<Rate>,
    /// Packets, or bytes for a bit rate.
    pub burst: u64,
    pub action: Action,
    pub key_len: u32,
    /// When the entry is removed (Unix ms); None: never.
    pub expires: Option<u64>,
    /// None exactly when every field of [`Rare`] is its default (so that
    /// equal rules compare equal).
    rare: Option<Box<Rare>>,
}

/// The fields of a rule that few rules have.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Rare {
    /// Which of the prefix's traffic (none: all of it).
    class: Class,
    /// The aggregate bucket of the whole rule: rate and burst (packets, or
    /// bytes for a bit rate).
    total: Option<(Rate, u64)>,
    /// The fleet budget the total is shared through (`--global NAME`).
    global: Option<String>,
    /// Automatic bans of the rule's sources.
    auto_ban: Option<BanPolicy>,
    /// SYN cookies.
    syn: Option<SynPolicy>,
    /// A manual ban (a deny entry that overrides the rules of every prefix
    /// under it), with its reason.
    ban: Option<Option<String>>,
    /// `inherit = false`: the classes of shorter prefixes stop here.
    no_inherit: bool,
}

impl RuleSpec {
    /// Which of the prefix's traffic (none: all of it).
    pub fn class(&self) -> Class {
        self.rare.as_ref().map_or_else(Class::default, |r| r.class)
    }

    /// The aggregate bucket of the whole rule: rate and burst (packets, or
    /// bytes for a bit rate).
    pub fn total(&self) -> Option<(Rate, u64)> {
        self.rare.as_ref().and_then(|r| r.total)
    }

    /// The fleet budget the total is shared through (`--global NAME`):
    /// the total is then the whole fleet's (docs/fleet.md).
    pub fn global(&self) -> Option<&str> {
        self.rare.as_ref().and_then(|r| r.global.as_deref())
    }

    /// Why this rule's fleet budget cannot be leased in periods of
    /// `period` ([`crate::fleet::budget_too_small`]), naming the rule;
    /// `None` for a rule without `global`, or one that can be.
    pub fn fleet_refusal(&self, period: std::time::Duration) -> Option<String> {
        let name = self.global()?;
        match self.total()? {
            (Rate::Pps(p), _) => {
                crate::fleet::budget_too_small(p, period).map(|why| format!("{}: --global {name}: {why}", self.net))
            }
            _ => None,
        }
    }

    pub fn set_global(&mut self, global: Option<String>) {
        self.with_rare(|r| r.global = global);
    }

    /// Automatic bans of the rule's sources.
    pub fn auto_ban(&self) -> Option<BanPolicy> {
        self.rare.as_ref().and_then(|r| r.auto_ban)
    }

    /// SYN cookies (`--syn-cookies`), if the rule answers with them.
    pub fn syn(&self) -> Option<SynPolicy> {
        self.rare.as_ref().and_then(|r| r.syn)
    }

    pub fn set_syn(&mut self, syn: Option<SynPolicy>) {
        self.with_rare(|r| r.syn = syn);
    }

    /// A manual ban (a deny entry that overrides the rules of every prefix
    /// under it), with its reason.
    pub fn ban(&self) -> Option<&Option<String>> {
        self.rare.as_ref().and_then(|r| r.ban.as_ref())
    }

    pub fn set_class(&mut self, class: Class) {
        self.with_rare(|r| r.class = class);
    }

    pub fn set_total(&mut self, total: Option<(Rate, u64)>) {
        self.with_rare(|r| r.total = total);
    }

    pub fn set_auto_ban(&mut self, auto_ban: Option<BanPolicy>) {
        self.with_rare(|r| r.auto_ban = auto_ban);
    }

    pub fn set_ban(&mut self, ban: Option<Option<String>>) {
        self.with_rare(|r| r.ban = ban);
    }

    /// Whether the classes of shorter prefixes apply under this rule's
    /// prefix (`inherit`, default true).
    pub fn inherits(&self) -> bool {
        !self.rare.as_ref().is_some_and(|r| r.no_inherit)
    }

    pub fn set_inherit(&mut self, inherit: bool) {
        self.with_rare(|r| r.no_inherit = !inherit);
    }

    /// Changes the rare fields, keeping `rare` None when all are defaults.
    fn with_rare(&mut self, f: impl FnOnce(&mut Rare)) {
        let mut r = self.rare.take().unwrap_or_default();
        f(&mut r);
        if *r != Rare::default() {
            self.rare = Some(r);
        }
    }
}

fn burst_of(r: &Rate, b: &Option<BurstValue>, what: &str) -> Result<u64> {
    match b {
        Some(BurstValue::Count(n)) => {
            r.parse_burst(&n.to_string()).map_err(|e| Error::Invalid(format!("{what} '{n}': {e}")))
        }
        Some(BurstValue::Text(t)) => r.parse_burst(t).map_err(|e| Error::Invalid(format!("{what} '{t}': {e}"))),
        None => Ok(r.default_burst()),
    }
}

impl RuleConfig {
    /// The class fields as written.
    pub fn class_text(&self) -> ClassText {
        ClassText {
            proto: self.proto.clone(),
            dport: self.dport.as_ref().map(PortValue::text),
            sport: self.sport.as_ref().map(PortValue::text),
            tcp_flags: self.tcp_flags.clone(),
            icmp_type: self.icmp_type.map(|t| t.to_string()),
            dst: self.dst.clone(),
        }
    }

    /// Sets the class fields from their written form.
    pub fn with_class_text(mut self, t: ClassText) -> RuleConfig {
        self.proto = t.proto;
        self.dport = t.dport.map(PortValue::Text);
        self.sport = t.sport.map(PortValue::Text);
        self.tcp_flags = t.tcp_flags;
        self.icmp_type = None;
        self.dst = t.dst;
        if let Some(i) = t.icmp_type {
            match i.parse::<u32>() {
                Ok(n) => self.icmp_type = Some(n),
                // Kept as written for validate() to refuse: as a number
                // no ICMP type has.
                Err(_) => self.icmp_type = Some(u32::MAX),
            }
        }
        self
    }

    /// The rule's identity, validated.
    pub fn key(&self) -> Result<RuleKey> {
        let net = parse_prefix(&self.prefix)?;
        Ok(RuleKey::new(net, Class::parse(&self.class_text(), net.addr().is_ipv6())?, self.ban == Some(true)))
    }

    /// The expiry as Unix ms: `expires` as written, or `ttl` from now; or
    /// the problem, with the key it is about.
    fn expiry(&self) -> std::result::Result<Option<u64>, KeyProblem> {
        match (&self.ttl, &self.expires) {
            (Some(_), Some(_)) => Err(KeyProblem::new(
                "ttl",
                Error::Invalid(format!("{}: give a ttl or an expiry, not both", self.prefix)),
            )),
            (Some(t), None) => {
                let d = crate::duration::parse(t).map_err(|e| KeyProblem::new("ttl", e))?;
                Ok(Some(crate::duration::unix_ms().saturating_add(d.as_millis() as u64)))
            }
            (None, Some(e)) => Ok(Some(crate::duration::parse_rfc3339(e).map_err(|e| KeyProblem::new("expires", e))?)),
            (None, None) => Ok(None),
        }
    }

    /// `--ban-for`, `--ban-after`, `--ban-max`, checked together, against
    /// the rule's action and whether it has a per-source rate (`None`:
    /// not known). `None`: a problem, or what it depends on is not known.
    fn ban_policy(
        &self,
        action: Option<Action>,
        rate: Option<bool>,
        p: &mut Problems<'_>,
    ) -> Option<Option<BanPolicy>> {
        let Some(f) = &self.ban_for else {
            if p.broken("ban_for") {
                return None;
            }
            if self.ban_after.is_some() || self.ban_max.is_some() || self.ban_within.is_some() {
                let key = match () {
                    _ if self.ban_after.is_some() => "ban_after",
                    _ if self.ban_max.is_some() => "ban_max",
                    _ => "ban_within",
                };
                p.push(
                    key,
                    format!("{}: --ban-after and --ban-max need --ban-for (and so does --ban-within)", self.prefix),
                );
                return None;
            }
            return Some(None);
        };
        let action = action?;
        if action != Action::Police {
            p.push(
                "ban_for",
                format!("{}: --ban-for needs a police rule (a {action} rule has no bucket that refuses)", self.prefix),
            );
            return None;
        }
        if !rate? {
            p.push(
                "ban_for",
                format!(
                    "{}: --ban-for needs a per-source rate (--rate): a source is banned when its bucket refuses",
                    self.prefix
                ),
            );
            return None;
        }
        let ban_for = p.take("ban_for", crate::duration::parse(f));
        let said = p.said();
        let ban_after = self.ban_after.unwrap_or(1);
        if ban_after == 0 {
            p.push(
                "ban_after",
                format!("{}: --ban-after must be at least 1 (refused frames before a ban)", self.prefix),
            );
        } else if ban_after > policer_common::ban::MAX_BAN_AFTER {
            p.push(
                "ban_after",
                format!("{}: --ban-after must be at most {}", self.prefix, policer_common::ban::MAX_BAN_AFTER),
            );
        }
        let ban_within = if p.broken("ban_within") {
            None
        } else {
            p.take("ban_within", self.ban_within.as_deref().map(check_within).transpose())
        };
        let ban_max = if p.broken("ban_max") {
            None
        } else {
            p.take("ban_max", self.ban_max.as_deref().map(crate::duration::parse).transpose())
        };
        if let (Some(f), Some(Some(m))) = (ban_for, ban_max)
            && m < f
        {
            p.push(
                "ban_max",
                format!(
                    "{}: --ban-max ({}) is shorter than --ban-for ({})",
                    self.prefix,
                    crate::duration::format(m),
                    crate::duration::format(f)
                ),
            );
        }
        if p.said() > said || p.broken("ban_after") {
            return None;
        }
        Some(Some(BanPolicy { ban_for: ban_for?, ban_after, ban_max: ban_max?, ban_within: ban_within? }))
    }

    /// A manual ban: a deny entry, with an expiry and perhaps a reason
    /// (`net`, `expires`: `None` when not known).
    fn validate_ban(&self, net: Option<IpNet>, expires: Option<Option<u64>>, p: &mut Problems<'_>) -> Option<RuleSpec> {
        let said = p.said();
        let name = net.map_or_else(|| self.prefix.clone(), |n| n.to_string());
        let extra = self.rate.is_some()
            || self.burst.is_some()
            || self.key_len.is_some()
            || self.class_text() != ClassText::default()
            || self.total_rate.is_some()
            || self.total_burst.is_some()
            || self.global.is_some()
            || self.syn_cookies.is_some()
            || self.syn_ack_rate.is_some()
            || self.ban_for.is_some()
            || self.ban_after.is_some()
            || self.ban_max.is_some()
            || self.ban_within.is_some()
            || self.inherit.is_some();
        if extra || self.action.is_some_and(|a| a != Action::Deny) {
            p.push(
                "ban",
                format!(
                    "ban {name}: a ban drops all of the prefix's traffic; it takes a duration and a reason, nothing else"
                ),
            );
        }
        if expires == Some(None) {
            p.push("ban", format!("ban {name}: a ban needs a duration (--for)"));
        }
        if let Some(r) = &self.reason
            && r.chars().count() > MAX_REASON
        {
            p.push("reason", format!("ban {name}: the reason must be one line of at most {MAX_REASON} characters"));
        }
        if p.said() > said || p.broken("action") {
            return None;
        }
        let (net, expires) = (net?, expires??);
        let mut spec = RuleSpec {
            net,
            rate: None,
            burst: 1,
            action: Action::Deny,
            key_len: default_key_len(&net),
            expires: Some(expires),
            rare: None,
        };
        spec.set_ban(Some(self.reason.clone().filter(|r| !r.is_empty())));
        Some(spec)
    }

    /// A ban's reason as typed (`policer ban --reason`): plain text that
    /// reads as it will be shown (`ban ls`, the log). Checked on input
    /// only: a file an older build wrote is still read, and its reason is
    /// shown escaped ([`crate::text::escaped`]).
    pub fn check_reason(&self) -> Result<()> {
        match &self.reason {
            Some(r) => crate::text::check_plain("the reason", r)
                .map_err(|e| Error::Invalid(format!("ban {}: {e}", self.prefix))),
            None => Ok(()),
        }
    }

    /// The fields that can be checked without the rule they change (`rule
    /// set` of some fields of a rule in force): the prefix and class, the
    /// key length, the total rate, the durations. The merged rule is
    /// validated in full by the daemon.
    pub fn check_fields(&self) -> Result<()> {
        let net = parse_prefix(&self.prefix)?;
        self.expiry().map_err(|p| p.error)?;
        Class::parse(&self.class_text(), net.addr().is_ipv6())?;
        if let Some(k) = self.key_len {
            check_key_len(k, &net)?;
        }
        if let Some(t) = &self.total_rate {
            let r = Rate::parse(t).map_err(|e| Error::Invalid(format!("total rate '{t}': {e}")))?;
            burst_of(&r, &self.total_burst, "total burst")?;
        }
        if let Some(m) = &self.syn_cookies {
            SynMode::parse(m)?;
        }
        if let Some(r) = &self.syn_ack_rate {
            parse_syn_ack_rate(r)?;
        }
        for d in [&self.ban_for, &self.ban_max].into_iter().flatten() {
            crate::duration::parse(d)?;
        }
        if let Some(w) = &self.ban_within {
            check_within(w)?;
        }
        if self.ban_after == Some(0) {
            return Err(Error::Invalid(format!("{}: --ban-after must be at least 1", self.prefix)));
        }
        Ok(())
    }

    /// The rule, validated; else its first problem (as [`RuleConfig::checked`]
    /// meets them).
    pub fn validate(&self) -> Result<RuleSpec> {
        match self.checked(&[]) {
            (_, mut found) if !found.is_empty() => Err(found.swap_remove(0).error),
            (Some(spec), _) => Ok(spec),
            (None, _) => Err(Error::Invalid(format!("{}: not a valid rule", self.prefix))),
        }
    }

    /// Every problem of the rule, each with the key it is about, in the
    /// order [`RuleConfig::validate`] meets them (its first is
    /// validate's); and the rule when it has none.
    ///
    /// `broken`: keys given whose values could not be read (a config
    /// file's `rate = 5`), unset here, their problems said already. What
    /// follows only from them is not said again: no "a burst needs a
    /// rate" after a rate that is not one, no "needs a rate" after an
    /// action that is not one. With any, no rule is given.
    pub fn checked(&self, broken: &[&str]) -> (Option<RuleSpec>, Vec<KeyProblem>) {
        let mut p = Problems { found: Vec::new(), broken };
        let spec = self.check_into(&mut p).filter(|_| broken.is_empty() && p.found.is_empty());
        (spec, p.found)
    }

    /// [`RuleConfig::checked`]'s work: every problem into `p`, and the
    /// rule when all it needs is known. A value is `None` here when it is
    /// not known (broken, or refused); `Some(None)`, known to be unset.
    fn check_into(&self, p: &mut Problems<'_>) -> Option<RuleSpec> {
        let net = if p.broken("prefix") { None } else { p.take("prefix", parse_prefix(&self.prefix)) };
        let expires = match () {
            _ if p.broken("ttl") || p.broken("expires") => None,
            _ => self.expiry().map_err(|e| p.found.push(e)).ok(),
        };
        if p.broken("ban") {
            // Whether it is a ban or a rule is not known.
            return None;
        }
        if self.ban == Some(true) {
            return self.validate_ban(net, expires, p);
        }
        if self.reason.is_some() {
            let name = net.map_or_else(|| self.prefix.clone(), |n| n.to_string());
            p.push("reason", format!("{name}: a reason belongs to a ban (`policer ban`)"));
        }
        let v6 = net.map(|n| n.addr().is_ipv6());
        let class = {
            let mut found = Vec::new();
            let class = Class::checked(&self.class_text(), v6, p.broken, &mut found);
            p.found.extend(found.into_iter().map(|(key, error)| KeyProblem { key, error }));
            class
        };
        let action = if p.broken("action") { None } else { Some(self.action.unwrap_or(Action::Police)) };
        let total = self.check_total(p);
        if let (Some(Some(_)), Some(action)) = (total, action)
            && !action.polices()
        {
            p.push("total_rate", format!("{}: --total-rate needs a police or monitor rule, not {action}", self.prefix));
        }
        let rate: Option<Option<Rate>> = match &self.rate {
            Some(r) => p.take("rate", Rate::parse(r).map_err(|e| Error::Invalid(format!("rate '{r}': {e}")))).map(Some),
            None if p.broken("rate") => None,
            None => match (action, total) {
                (Some(action), Some(None)) if action.polices() => {
                    p.push(
                        "rate",
                        format!(
                            "{}: a {action} rule needs a rate (--rate), a total (--total-rate), or both",
                            self.prefix
                        ),
                    );
                    None
                }
                _ => Some(None),
            },
        };
        let syn = self.check_syn(class.as_ref(), action, total, p);
        let burst = self.check_burst(rate, p);
        let key_len = match net {
            Some(net) if !p.broken("key_len") => {
                let k = self.key_len.unwrap_or(default_key_len(&net));
                p.take("key_len", check_key_len(k, &net)).map(|()| k)
            }
            _ => None,
        };
        let auto_ban = self.ban_policy(action, rate.map(|r| r.is_some()), p);
        let mut spec = RuleSpec {
            net: net?,
            rate: rate?,
            burst: burst?,
            action: action?,
            key_len: key_len?,
            expires: expires?,
            rare: None,
        };
        spec.set_class(class?);
        let global = self.check_global(total, p);
        spec.set_total(total?);
        spec.set_global(global?);
        spec.set_auto_ban(auto_ban?);
        spec.set_inherit(self.inherit.unwrap_or(true));
        spec.set_syn(syn?);
        if p.found.is_empty() {
            let key = if self.burst.is_some() { "burst" } else { "rate" };
            p.take(key, spec.kernel(0))?;
        }
        Some(spec)
    }

    /// `total_rate` and `total_burst`: `None` when not known (a problem,
    /// or a broken key), `Some(None)` when not given.
    fn check_total(&self, p: &mut Problems<'_>) -> Option<Option<(Rate, u64)>> {
        match (&self.total_rate, &self.total_burst) {
            (Some(t), b) => {
                let r =
                    p.take("total_rate", Rate::parse(t).map_err(|e| Error::Invalid(format!("total rate '{t}': {e}"))));
                match r {
                    Some(r) if !p.broken("total_burst") => {
                        p.take("total_burst", burst_of(&r, b, "total burst")).map(|b| Some((r, b)))
                    }
                    _ => None,
                }
            }
            (None, _) if p.broken("total_rate") => None,
            (None, Some(_)) => {
                p.push("total_burst", format!("{}: --total-burst needs --total-rate", self.prefix));
                None
            }
            (None, None) => Some(None),
        }
    }

    /// `global`: a name ([`crate::fleet::check_name`]) on a rule with a
    /// total (`None`: not known).
    fn check_global(&self, total: Option<Option<(Rate, u64)>>, p: &mut Problems<'_>) -> Option<Option<String>> {
        let Some(name) = &self.global else { return Some(None) };
        let name = p.take("global", crate::fleet::check_name(name))?;
        match total {
            Some(Some((r, _))) if r.is_bytes() => {
                p.push(
                    "global",
                    format!("{}: --global shares a packet rate; --total-rate {r} is a bit rate", self.prefix),
                );
                None
            }
            Some(Some(_)) => Some(Some(name)),
            Some(None) => {
                p.push("global", format!("{}: --global needs --total-rate (the fleet's budget)", self.prefix));
                None
            }
            None => None,
        }
    }

    /// `syn_cookies` and `syn_ack_rate` for the class, action and total as
    /// checked: `None` when not known, `Some(None)` when off.
    fn check_syn(
        &self,
        class: Option<&Class>,
        action: Option<Action>,
        total: Option<Option<(Rate, u64)>>,
        p: &mut Problems<'_>,
    ) -> Option<Option<SynPolicy>> {
        let said = p.said();
        let mode = match &self.syn_cookies {
            Some(m) => p.take("syn_cookies", SynMode::parse(m))?,
            None => None,
        };
        let cap = match &self.syn_ack_rate {
            Some(r) => Some(p.take("syn_ack_rate", parse_syn_ack_rate(r))?),
            None => None,
        };
        let Some(mode) = mode else {
            if cap.is_some() {
                p.push("syn_ack_rate", format!("{}: --syn-ack-rate needs --syn-cookies flood or always", self.prefix));
                return None;
            }
            return Some(None);
        };
        if class.is_some_and(|c| c.proto != Some(policer_common::class::IPPROTO_TCP)) {
            p.push("syn_cookies", format!("{}: --syn-cookies needs a TCP class (--proto tcp)", self.prefix));
        }
        if action.is_some_and(|a| a != Action::Police) {
            p.push("syn_cookies", format!("{}: --syn-cookies needs a police rule", self.prefix));
        }
        if mode == SynMode::Flood && total == Some(None) {
            p.push(
                "syn_cookies",
                format!(
                    "{}: --syn-cookies flood needs --total-rate (the SYN rate above which it answers)",
                    self.prefix
                ),
            );
        }
        if p.said() > said {
            return None;
        }
        let syn_ack_pps = cap.unwrap_or(policer_common::syn::DEFAULT_SYN_ACK_RATE_PPS);
        Some(Some(SynPolicy { mode, syn_ack_pps }))
    }

    /// `burst`, for the rate as checked (`None`: not known).
    fn check_burst(&self, rate: Option<Option<Rate>>, p: &mut Problems<'_>) -> Option<u64> {
        match (rate, &self.burst) {
            (None, _) => None,
            (Some(_), _) if p.broken("burst") => None,
            (Some(Some(r)), Some(BurstValue::Count(n))) => {
                p.take("burst", r.parse_burst(&n.to_string()).map_err(|e| Error::Invalid(format!("burst '{n}': {e}"))))
            }
            (Some(Some(r)), Some(BurstValue::Text(t))) => {
                p.take("burst", r.parse_burst(t).map_err(|e| Error::Invalid(format!("burst '{t}': {e}"))))
            }
            (Some(Some(r)), None) => Some(r.default_burst()),
            (Some(None), Some(_)) => {
                p.push("burst", format!("{}: a burst needs a rate", self.prefix));
                None
            }
            (Some(None), None) => Some(1),
        }
    }
}

/// A problem of a rule, with the key it is about (as the config file names
/// it: `total_rate`).
#[derive(Debug)]
pub struct KeyProblem {
    pub key: &'static str,
    pub error: Error,
}

impl KeyProblem {
    fn new(key: &'static str, error: Error) -> KeyProblem {
        KeyProblem { key, error }
    }
}

/// What [`RuleConfig::checked`] found so far, and the keys it was told are
/// broken.
struct Problems<'b> {
    found: Vec<KeyProblem>,
    broken: &'b [&'b str],
}

impl Problems<'_> {
    fn broken(&self, key: &str) -> bool {
        self.broken.contains(&key)
    }

    /// How many problems were said: a step compares it before and after.
    fn said(&self) -> usize {
        self.found.len()
    }

    fn push(&mut self, key: &'static str, message: String) {
        self.found.push(KeyProblem::new(key, Error::Invalid(message)));
    }

    /// `r`'s value, or `None` and its error noted against `key`.
    fn take<T>(&mut self, key: &'static str, r: Result<T>) -> Option<T> {
        r.map_err(|e| self.found.push(KeyProblem::new(key, e))).ok()
    }
}

/// The fields `policer rule set` gave, laid over the rule already in
/// force for the same prefix and class (`old`): what was not given keeps
/// its value (`--replace` takes the given fields alone). A new rate of the
/// other unit (packets/bytes) without a burst takes that rate's default
/// burst; an allow or deny keeps no rate, burst or automatic bans unless
/// given (and then `validate` says why they do not fit).
pub fn merge(old: &RuleSpec, given: &RuleConfig) -> RuleConfig {
    let mut m = old.config();
    let unit = |r: &Option<String>| r.as_deref().and_then(|r| Rate::parse(r).ok()).map(|r| r.is_bytes());
    if let Some(a) = given.action {
        m.action = Some(a);
    }
    let keeps_bucket = m.action.unwrap_or(Action::Police).polices();
    if given.rate.is_some() {
        if given.burst.is_none() && unit(&given.rate) != unit(&m.rate) {
            m.burst = None;
        }
        m.rate = given.rate.clone();
    } else if !keeps_bucket {
        (m.rate, m.burst) = (None, None);
    }
    if given.burst.is_some() {
        m.burst = given.burst.clone();
    }
    if given.key_len.is_some() {
        m.key_len = given.key_len;
    }
    if !keeps_bucket && given.total_rate.is_none() {
        (m.total_rate, m.total_burst, m.global) = (None, None, None);
    }
    if given.global.is_some() {
        m.global = given.global.clone();
    }
    if given.total_rate.is_some() {
        if given.total_burst.is_none() && unit(&given.total_rate) != unit(&m.total_rate) {
            m.total_burst = None;
        }
        m.total_rate = given.total_rate.clone();
    }
    if given.total_burst.is_some() {
        m.total_burst = given.total_burst.clone();
    }
    match given.syn_cookies.as_deref() {
        Some("off") => (m.syn_cookies, m.syn_ack_rate) = (None, None),
        Some(mode) => m.syn_cookies = Some(mode.to_string()),
        None => {}
    }
    if given.syn_ack_rate.is_some() {
        m.syn_ack_rate = given.syn_ack_rate.clone();
    }
    if given.ban_for.is_some() || given.ban_after.is_some() || given.ban_max.is_some() || given.ban_within.is_some() {
        m.ban_for = given.ban_for.clone().or(m.ban_for);
        m.ban_after = given.ban_after.or(m.ban_after);
        m.ban_max = given.ban_max.clone().or(m.ban_max);
        m.ban_within = given.ban_within.clone().or(m.ban_within);
    } else if m.action.unwrap_or(Action::Police) != Action::Police {
        (m.ban_for, m.ban_after, m.ban_max, m.ban_within) = (None, None, None, None);
    }
    if given.ttl.is_some() {
        (m.ttl, m.expires) = (given.ttl.clone(), None);
    }
    if given.inherit.is_some() {
        m.inherit = given.inherit;
    }
    m
}

/// A rule's fields as `rule set` names them, defaults included (so that
/// `burst 50 → 20` says what a bucket had even where the file would not).
fn shown(s: &RuleSpec) -> std::collections::BTreeMap<String, String> {
    let mut c = s.config();
    c.key_len = Some(s.key_len);
    c.action = Some(s.action);
    if s.rate.is_some_and(|r| !r.is_bytes()) {
        c.burst = Some(BurstValue::Count(s.burst));
    }
    match serde_json::to_value(&c) {
        Ok(serde_json::Value::Object(o)) => o
            .into_iter()
            .filter(|(k, _)| k != "prefix")
            .map(|(k, v)| (k.replace('_', "-"), v.as_str().map_or_else(|| v.to_string(), str::to_string)))
            .collect(),
        _ => Default::default(),
    }
}

/// A rule in a line: `action police, burst 50, key-len 32, rate 1kpps`.
pub fn summary(s: &RuleSpec) -> String {
    shown(s).into_iter().map(|(k, v)| format!("{k} {v}")).collect::<Vec<_>>().join(", ")
}

/// What a change did to a rule, field by field, as `rate 1kpps → 2kpps`
/// (in the written form: what the config file says).
pub fn changes(old: &RuleSpec, new: &RuleSpec) -> Vec<String> {
    field_changes(old, new)
        .into_iter()
        .map(|(k, a, b)| format!("{k} {} → {}", a.as_deref().unwrap_or("none"), b.as_deref().unwrap_or("none")))
        .collect()
}

/// [`changes`] as data: each field that differs, with its old and new
/// value as the config file writes them (`None`: not set), by field name.
pub fn field_changes(old: &RuleSpec, new: &RuleSpec) -> Vec<(String, Option<String>, Option<String>)> {
    let (a, b) = (shown(old), shown(new));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), a.get(k).cloned(), b.get(k).cloned()))
        .collect()
}

/// A rule's fields as the config file writes them, by name.
pub fn fields(s: &RuleSpec) -> std::collections::BTreeMap<String, String> {
    shown(s)
}

/// Refuses `what` (`a deny of`, `a ban of`) a whole address family
/// unless forced: it drops every source, the operator's own SSH and BGP
/// sessions included.
pub fn refuse_everyone(net: &IpNet, what: &str) -> Result<()> {
    if net.prefix_len() != 0 {
        return Ok(());
    }
    let family = if net.addr().is_ipv6() { "IPv6" } else { "IPv4" };
    Err(Error::Invalid(format!(
        "{what} {net} drops every {family} source, your own sessions (SSH, BGP) included; nothing changed \
         (--force if that is what you mean)"
    )))
}

/// A `--ban-within` window: a duration of 1 ms up to 49 days (the
/// kernel keeps it in milliseconds, a `u32`).
fn check_within(w: &str) -> Result<std::time::Duration> {
    let d = crate::duration::parse(w)?;
    if d.as_millis() == 0 || d.as_millis() > u128::from(u32::MAX) {
        return Err(Error::Invalid(format!("--ban-within '{w}': a window of 1ms up to 49d")));
    }
    Ok(d)
}

/// A key length `net`'s rule may have: 1 up to the family's bits, and not
/// shorter than the prefix (buckets are keyed by masked source and key
/// length: a shorter key could share a bucket with a shorter rule's).
fn check_key_len(k: u32, net: &IpNet) -> Result<()> {
    let max = if net.addr().is_ipv6() { 128 } else { 32 };
    if k == 0 || k > max {
        return Err(Error::Invalid(format!("key length {k} out of range 1 to {max}")));
    }
    if k < u32::from(net.prefix_len()) {
        return Err(Error::Invalid(format!(
            "key length {k} is shorter than the prefix {net}; use {} for one bucket for the whole prefix",
            net.prefix_len()
        )));
    }
    Ok(())
}

/// The key length of a rule that names none: a bucket per host for IPv4,
/// per /64 for IPv6 (a host rotates its interface id inside its /64), and
/// the prefix's own length when it is longer (a rule for `2001:db8::1` is
/// one host's, with one bucket).
pub fn default_key_len(net: &IpNet) -> u32 {
    let d = if net.addr().is_ipv6() { DEFAULT_KEY_LEN_V6 } else { DEFAULT_KEY_LEN_V4 };
    d.max(u32::from(net.prefix_len()))
}

impl RuleSpec {
    /// The kernel's value for this rule, tagged with `rule_id`.
    pub fn kernel(&self, rule_id: u32) -> Result<Rule> {
        let base = match self.rate {
            Some(r) => r.rule(self.burst).map_err(|e| Error::Invalid(e.to_string()))?,
            // allow/deny without a rate, or a total only: the bucket
            // fields are never used.
            None => Rule::packets(1, 1).expect("valid"),
        };
        let v6 = self.net.addr().is_ipv6();
        let mut rule = base
            .with_key_len(self.key_len, v6)
            .map_err(|e| Error::Invalid(e.to_string()))?
            .with_action(self.action)
            .with_id(rule_id);
        if self.total().is_some() {
            rule.flags |= policer_common::class::RULE_TOTAL;
            if self.rate.is_none() {
                rule.flags |= policer_common::class::RULE_NO_SOURCE;
            }
        }
        if self.auto_ban().is_some() {
            rule.flags |= policer_common::ban::RULE_BAN;
        }
        if self.syn().is_some() {
            rule.flags |= policer_common::syn::RULE_SYN;
        }
        Ok(rule)
    }

    /// The rule's identity.
    pub fn key(&self) -> RuleKey {
        RuleKey::new(self.net, self.class(), self.ban().is_some())
    }

    /// The kernel's parameters of this rule's automatic bans.
    pub fn ban_params(&self) -> Option<policer_common::ban::BanParams> {
        self.auto_ban().map(|b| policer_common::ban::BanParams {
            ban_for_ns: b.ban_for.as_nanos() as u64,
            ban_max_ns: b.ban_max.map_or(0, |m| m.as_nanos() as u64),
            ban_after: b.ban_after,
            ban_within_ms: b.ban_within.map_or(0, |w| w.as_millis() as u32),
        })
    }

    /// The arithmetic of the rule's aggregate bucket, if it has one.
    pub fn total_limiter(&self) -> Result<Option<Rule>> {
        self.total().map(|(r, b)| r.rule(b).map_err(|e| Error::Invalid(format!("total: {e}")))).transpose()
    }

    /// Back to the written form (canonical: what the daemon writes).
    pub fn config(&self) -> RuleConfig {
        let default_key = default_key_len(&self.net);
        RuleConfig {
            prefix: self.net.to_string(),
            rate: self.rate.map(|r| r.to_string()),
            burst: self.rate.map(|r| {
                if r.is_bytes() { BurstValue::Text(format!("{}b", self.burst)) } else { BurstValue::Count(self.burst) }
            }),
            action: (self.action != Action::Police).then_some(self.action),
            key_len: (self.key_len != default_key).then_some(self.key_len),
            proto: None,
            dport: None,
            sport: None,
            tcp_flags: None,
            icmp_type: None,
            dst: None,
            total_rate: self.total().map(|(r, _)| r.to_string()),
            total_burst: self
                .total()
                .map(|(r, b)| if r.is_bytes() { BurstValue::Text(format!("{b}b")) } else { BurstValue::Count(b) }),
            global: self.global().map(str::to_string),
            syn_cookies: self.syn().map(|s| s.mode.name().to_string()),
            syn_ack_rate: self
                .syn()
                .map(|s| s.syn_ack_pps)
                .filter(|r| *r != policer_common::syn::DEFAULT_SYN_ACK_RATE_PPS)
                .map(|r| format!("{r}pps")),
            ban_for: self.auto_ban().map(|b| crate::duration::format(b.ban_for)),
            ban_after: self.auto_ban().map(|b| b.ban_after).filter(|n| *n != 1),
            ban_max: self.auto_ban().and_then(|b| b.ban_max).map(crate::duration::format),
            ban_within: self.auto_ban().and_then(|b| b.ban_within).map(crate::duration::format),
            inherit: (!self.inherits()).then_some(false),
            ban: self.ban().is_some().then_some(true),
            reason: self.ban().cloned().flatten(),
            expires: self.expires.map(crate::duration::rfc3339),
            ttl: None,
        }
        .with_class_text(self.class().text())
        .with_dport_number()
    }
}

impl RuleConfig {
    /// A single port as a TOML number (`dport = 53`, `sport = 123`), a
    /// range as text.
    fn with_dport_number(mut self) -> RuleConfig {
        for ports in [&mut self.dport, &mut self.sport] {
            if let Some(PortValue::Text(t)) = ports
                && let Ok(n) = t.parse::<u32>()
            {
                *ports = Some(PortValue::Number(n));
            }
        }
        self
    }
}

/// Makes `edits` in `rules` (each key once: `Some` sets the rule, `None`
/// removes it): one change of a rule set, as the owner and the config
/// file's writer both take it.
/// Rules by key, as a config file holds them: looked up one by one (a
/// change's few), or copied whole (a whole-document edit). The daemon's
/// keeps its specs shared with the rules in force.
pub trait SpecMap {
    fn spec(&self, k: &RuleKey) -> Option<&RuleSpec>;
    fn specs(&self) -> std::collections::BTreeMap<RuleKey, RuleSpec>;
}

impl SpecMap for std::collections::BTreeMap<RuleKey, RuleSpec> {
    fn spec(&self, k: &RuleKey) -> Option<&RuleSpec> {
        self.get(k)
    }

    fn specs(&self) -> std::collections::BTreeMap<RuleKey, RuleSpec> {
        self.clone()
    }
}

impl SpecMap for std::collections::BTreeMap<RuleKey, std::sync::Arc<RuleSpec>> {
    fn spec(&self, k: &RuleKey) -> Option<&RuleSpec> {
        self.get(k).map(|s| &**s)
    }

    fn specs(&self) -> std::collections::BTreeMap<RuleKey, RuleSpec> {
        self.iter().map(|(k, s)| (k.clone(), (**s).clone())).collect()
    }
}

pub fn edit_rules(rules: &mut std::collections::BTreeMap<RuleKey, RuleSpec>, edits: &[(RuleKey, Option<RuleSpec>)]) {
    for (k, v) in edits {
        match v {
            Some(s) => rules.insert(k.clone(), s.clone()),
            None => rules.remove(k),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc(prefix: &str, rate: Option<&str>, burst: Option<BurstValue>) -> RuleConfig {
        RuleConfig { prefix: prefix.into(), rate: rate.map(Into::into), burst, ..RuleConfig::default() }
    }

    #[test]
    fn rules_validate() {
        let s = rc("10.0.0.0/8", Some("1kpps"), Some(BurstValue::Count(50))).validate().unwrap();
        assert_eq!((s.burst, s.key_len, s.action), (50, 32, Action::Police));
        assert_eq!(s.config(), rc("10.0.0.0/8", Some("1kpps"), Some(BurstValue::Count(50))));
        let s = rc("2001:db8::/32", Some("64kbit"), Some(BurstValue::Text("64kb".into()))).validate().unwrap();
        assert_eq!((s.burst, s.key_len), (65536, 64));
        let mut deny = rc("198.51.100.0/24", None, None);
        deny.action = Some(Action::Deny);
        assert!(deny.validate().is_ok());
        assert!(rc("10.0.0.0/8", None, None).validate().is_err(), "police without rate");
        let mut k = rc("10.0.0.0/8", Some("1kpps"), None);
        k.key_len = Some(4);
        assert!(k.validate().is_err(), "key shorter than prefix");
        k.key_len = Some(33);
        assert!(k.validate().is_err());
        k.key_len = Some(24);
        assert_eq!(k.validate().unwrap().kernel(7).unwrap().rule_id, 7);
    }

    /// A SYN-ACK cap above the rate range would be an interval of 0 ns,
    /// which the program reads as no cap: refused, as `--rate` is.
    #[test]
    fn syn_ack_rate_is_bounded_like_a_rate() {
        assert_eq!(parse_syn_ack_rate("500pps").unwrap(), 500);
        assert_eq!(parse_syn_ack_rate("2000").unwrap(), 2000);
        assert_eq!(parse_syn_ack_rate("100Mpps").unwrap(), 100_000_000);
        for bad in ["0", "0pps", "2Gpps", "5000000000", "1mbit", "fast"] {
            let e = parse_syn_ack_rate(bad).unwrap_err().to_string();
            assert!(e.contains("--syn-ack-rate"), "{bad}: {e}");
        }
        assert!(parse_syn_ack_rate("2Gpps").unwrap_err().to_string().contains("out of range"));
    }

    fn spec_of(f: impl FnOnce(&mut RuleConfig)) -> RuleSpec {
        let mut r = rc("10.0.0.0/8", Some("1kpps"), Some(BurstValue::Count(50)));
        f(&mut r);
        r.validate().unwrap()
    }

    /// `rule set` keeps what was not given: the README's sequence (a burst
    /// of 50 and automatic bans, then a new rate) keeps both, and says only
    /// what changed.
    #[test]
    fn rule_set_merges_into_the_rule_in_force() {
        let old = spec_of(|r| r.ban_for = Some("1m".into()));
        let given = RuleConfig { prefix: "10.0.0.0/8".into(), rate: Some("2kpps".into()), ..Default::default() };
        let new = merge(&old, &given).validate().unwrap();
        assert_eq!((new.burst, new.auto_ban().is_some()), (50, true));
        assert_eq!(changes(&old, &new), ["rate 1kpps → 2kpps"]);
        // The other unit: that rate's default burst, not 50 bytes.
        let given = RuleConfig { prefix: "10.0.0.0/8".into(), rate: Some("10mbit".into()), ..Default::default() };
        let new = merge(&old, &given).validate().unwrap();
        assert!(new.burst > 1500, "{}", new.burst);
        // A deny drops the bucket and the bans; the change says so.
        let given = RuleConfig { prefix: "10.0.0.0/8".into(), action: Some(Action::Deny), ..Default::default() };
        let new = merge(&old, &given).validate().unwrap();
        assert_eq!((new.action, new.rate, new.auto_ban()), (Action::Deny, None, None));
        let c = changes(&old, &new);
        assert!(
            c.contains(&"action police → deny".to_string()) && c.iter().any(|c| c.starts_with("rate 1kpps → none")),
            "{c:?}"
        );
        // A deny of a rule with a total drops the total too.
        let totals = spec_of(|r| r.total_rate = Some("50kpps".into()));
        let given = RuleConfig { prefix: "10.0.0.0/8".into(), action: Some(Action::Deny), ..Default::default() };
        assert_eq!(merge(&totals, &given).validate().unwrap().total(), None);
        // Nothing given: nothing changes.
        let given = RuleConfig { prefix: "10.0.0.0/8".into(), ..Default::default() };
        assert!(changes(&old, &merge(&old, &given).validate().unwrap()).is_empty());
        // An expiry stays unless --ttl is given.
        let mut exp = old.clone();
        exp.expires = Some(4_000_000_000_000);
        let new = merge(&exp, &RuleConfig { burst: Some(BurstValue::Count(9)), ..given }).validate().unwrap();
        assert_eq!((new.expires, new.burst), (exp.expires, 9));
    }

    /// A rule longer than /64 keys by its own length unless told; a deny
    /// of one IPv6 host needs no `--key-len`; the written form round-trips.
    #[test]
    fn ipv6_rules_longer_than_64_key_by_their_prefix() {
        let mut host = rc("2001:db8:5::1", None, None);
        host.action = Some(Action::Deny);
        let s = host.validate().unwrap();
        assert_eq!((s.net.prefix_len(), s.key_len), (128, 128));
        assert_eq!(s.config().key_len, None, "the default is not written");
        assert_eq!(s.config().validate().unwrap(), s);
        let s = rc("2001:db8:5::/96", Some("10pps"), None).validate().unwrap();
        assert_eq!(s.key_len, 96);
        assert_eq!(rc("2001:db8::/32", Some("10pps"), None).validate().unwrap().key_len, 64);
        let mut short = rc("2001:db8:5::/96", Some("10pps"), None);
        short.key_len = Some(64);
        let e = short.validate().unwrap_err().to_string();
        assert!(e.contains("shorter than the prefix"), "{e}");
    }

    /// A ban's reason is shown back as it reads: no control characters,
    /// bidi overrides or isolates, or line and paragraph separators.
    #[test]
    fn ban_reasons_are_plain_text() {
        let ban = |reason: &str| RuleConfig {
            prefix: "203.0.113.0/24".into(),
            ban: Some(true),
            ttl: Some("1h".into()),
            reason: Some(reason.into()),
            ..RuleConfig::default()
        };
        let s = ban("scanner, ticket #42 — 日本語").validate().unwrap();
        assert_eq!(s.ban().cloned(), Some(Some("scanner, ticket #42 — 日本語".into())));
        for (reason, want) in [
            ("abuse\u{202E}gnp.exe", "U+202E (a bidi override) at character 6"),
            ("a\u{2028}b", "U+2028 (a line separator)"),
            ("a\u{2029}b", "U+2029 (a paragraph separator)"),
            ("\u{2067}x", "U+2067 (a bidi isolate)"),
            ("two\nlines", "U+000A (a control character)"),
        ] {
            let e = ban(reason).check_reason().unwrap_err().to_string();
            assert!(ban(reason).validate().is_ok(), "a file holding {reason:?} still reads");
            assert!(e.starts_with("ban 203.0.113.0/24: the reason has ") && e.contains(want), "{reason:?}: {e}");
        }
        let e = ban(&"x".repeat(201)).validate().unwrap_err().to_string();
        assert!(e.contains("at most 200 characters"), "{e}");
    }

    fn class_rule(prefix: &str, set: impl FnOnce(&mut RuleConfig)) -> RuleConfig {
        let mut r = rc(prefix, Some("10pps"), None);
        set(&mut r);
        r
    }

    /// The error of `r`, which must be refused.
    fn refused(r: &RuleConfig) -> String {
        match r.validate() {
            Ok(s) => panic!("{r:?} accepted as {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn class_rules_validate() {
        let s = class_rule("0.0.0.0/0", |r| {
            r.proto = Some("udp".into());
            r.dport = Some(PortValue::Number(53));
        })
        .validate()
        .unwrap();
        assert_eq!(s.class().to_string(), "udp dport 53");
        assert_eq!(s.key().to_string(), "0.0.0.0/0 [udp dport 53]");
        let k = s.kernel(3).unwrap();
        assert_eq!(k.flags & (policer_common::class::RULE_TOTAL | policer_common::class::RULE_NO_SOURCE), 0);

        let syn = class_rule("10.0.0.0/8", |r| {
            r.proto = Some("tcp".into());
            r.tcp_flags = Some("syn,!ack".into());
        })
        .validate()
        .unwrap();
        assert_eq!(syn.class().to_string(), "tcp flags syn,!ack");
        let echo = class_rule("2001:db8::/32", |r| {
            r.proto = Some("icmpv6".into());
            r.icmp_type = Some(128);
        })
        .validate()
        .unwrap();
        assert!(!echo.class().is_none());

        // Bad input, each with a message that names what is wrong.
        let cases: Vec<(RuleConfig, &str)> = vec![
            (class_rule("0.0.0.0/0", |r| r.proto = Some("tpc".into())), "tpc"),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("udp".into());
                    r.dport = Some(PortValue::Number(70000));
                }),
                "out of range",
            ),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("udp".into());
                    r.dport = Some(PortValue::Text("90-80".into()));
                }),
                "below LOW",
            ),
            (class_rule("0.0.0.0/0", |r| r.dport = Some(PortValue::Number(53))), "--dport"),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("icmp".into());
                    r.dport = Some(PortValue::Number(53));
                }),
                "--dport",
            ),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("udp".into());
                    r.tcp_flags = Some("syn".into());
                }),
                "--tcp-flags needs --proto tcp",
            ),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("tcp".into());
                    r.tcp_flags = Some("syn,bogus".into());
                }),
                "bogus",
            ),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("udp".into());
                    r.icmp_type = Some(8);
                }),
                "--icmp-type needs --proto icmp",
            ),
            (
                class_rule("::/0", |r| {
                    r.proto = Some("icmp".into());
                    r.icmp_type = Some(8);
                }),
                "",
            ),
            (
                class_rule("0.0.0.0/0", |r| {
                    r.proto = Some("icmp".into());
                    r.icmp_type = Some(300);
                }),
                "--icmp-type",
            ),
            (class_rule("0.0.0.0/0", |r| r.dst = Some("2001:db8::/32".into())), "--dst"),
            (class_rule("0.0.0.0/0", |r| r.dst = Some("192.0.2.5/24".into())), "--dst"),
            (
                class_rule("0.0.0.0/0", |r| r.total_burst = Some(BurstValue::Count(100))),
                "--total-burst needs --total-rate",
            ),
            (class_rule("0.0.0.0/0", |r| r.total_rate = Some("fast".into())), "total rate"),
        ];
        for (r, want) in cases {
            let e = refused(&r);
            assert!(e.contains(want), "{r:?}: '{e}' does not say '{want}'");
        }
    }

    /// `checked` finds every problem of a rule, each with its key, and
    /// validate's error is the first of them; a key said to be broken
    /// (its value unread, its problem said) has none of its consequences
    /// said.
    #[test]
    fn every_problem_of_a_rule_with_its_key() {
        let r = class_rule("10.0.0.0/16", |r| {
            r.proto = Some("foo".into());
            r.tcp_flags = Some("syn,syn".into());
            r.key_len = Some(8);
            r.ban_for = Some("1h".into());
            r.ban_max = Some("1m".into());
            r.reason = Some("x".into());
        });
        let (spec, found) = r.checked(&[]);
        assert!(spec.is_none());
        let keys: Vec<&str> = found.iter().map(|p| p.key).collect();
        assert_eq!(keys, ["reason", "proto", "tcp_flags", "key_len", "ban_max"], "{found:?}");
        assert_eq!(refused(&r), found[0].error.to_string());
        // A rate that could not be read: its burst, its bans and the
        // "needs a rate" are not said; the rest is.
        let r = class_rule("10.0.0.0/16", |r| {
            r.rate = None;
            r.burst = Some(BurstValue::Count(10));
            r.ban_for = Some("1m".into());
            r.dport = Some(PortValue::Number(53));
        });
        let (_, found) = r.checked(&["rate"]);
        let keys: Vec<&str> = found.iter().map(|p| p.key).collect();
        assert_eq!(keys, ["dport"], "{found:?}");
        // Without that, the missing rate is said, once (not its burst).
        let (_, found) = r.checked(&[]);
        let keys: Vec<&str> = found.iter().map(|p| p.key).collect();
        assert_eq!(keys, ["dport", "rate"], "{found:?}");
        // An action that could not be read: nothing that depends on it.
        let r = class_rule("10.0.0.0/16", |r| {
            r.rate = None;
            r.total_rate = Some("1kpps".into());
            r.ban_for = Some("1m".into());
        });
        assert_eq!(r.checked(&["action"]).1.len(), 0);
        assert!(r.checked(&["action"]).0.is_none(), "no rule with a key unread");
        // A prefix that could not be read: what needs its family is not
        // checked, the rest is.
        let r = RuleConfig {
            prefix: String::new(),
            rate: Some("1kpps".into()),
            proto: Some("icmpv6".into()),
            icmp_type: Some(300),
            ..RuleConfig::default()
        };
        let keys: Vec<&str> = r.checked(&["prefix"]).1.iter().map(|p| p.key).collect();
        assert_eq!(keys, ["icmp_type"]);
        // A valid rule: the rule, nothing found.
        let (spec, found) = rc("10.0.0.0/8", Some("1kpps"), None).checked(&[]);
        assert!(spec.is_some() && found.is_empty());
    }

    #[test]
    fn totals_set_the_kernel_flags() {
        use policer_common::class::{RULE_NO_SOURCE, RULE_TOTAL};
        // A total only: no per-source bucket.
        let mut only = class_rule("0.0.0.0/0", |r| {
            r.rate = None;
            r.dst = Some("192.0.2.10/32".into());
            r.proto = Some("udp".into());
            r.dport = Some(PortValue::Number(27015));
            r.total_rate = Some("50kpps".into());
        });
        let s = only.validate().unwrap();
        assert_eq!(s.rate, None);
        assert_eq!(s.total().map(|(r, _)| r.to_string()), Some("50kpps".into()));
        let k = s.kernel(1).unwrap();
        assert_eq!(k.flags & (RULE_TOTAL | RULE_NO_SOURCE), RULE_TOTAL | RULE_NO_SOURCE);
        assert!(s.total_limiter().unwrap().is_some());
        // Both: a per-source bucket and the total.
        only.rate = Some("100pps".into());
        only.total_burst = Some(BurstValue::Count(500));
        let s = only.validate().unwrap();
        assert_eq!(s.total().map(|(_, b)| b), Some(500));
        assert_eq!(s.kernel(1).unwrap().flags & (RULE_TOTAL | RULE_NO_SOURCE), RULE_TOTAL);
        // Neither: a police (or monitor) rule still needs one of them.
        only.rate = None;
        only.total_rate = None;
        only.total_burst = None;
        assert!(refused(&only).contains("needs a rate"), "{}", refused(&only));
        only.action = Some(Action::Monitor);
        assert!(only.validate().is_err());
        // A total on allow/deny means nothing: refused, not ignored.
        let mut deny = rc("0.0.0.0/0", None, None);
        deny.action = Some(Action::Deny);
        deny.total_rate = Some("1kpps".into());
        assert!(refused(&deny).contains("--total-rate"));
    }

    /// What the daemon writes reads back as the same rule (the class and
    /// the total included), through TOML.
    #[test]
    fn class_rules_round_trip() {
        let rules = [
            class_rule("0.0.0.0/0", |r| {
                r.proto = Some("udp".into());
                r.dport = Some(PortValue::Text("8000-8999".into()));
                r.total_rate = Some("1mbit".into());
                r.total_burst = Some(BurstValue::Text("64kb".into()));
            }),
            class_rule("10.0.0.0/8", |r| {
                r.proto = Some("tcp".into());
                r.tcp_flags = Some("syn,!ack".into());
                r.dst = Some("192.0.2.0/24".into());
            }),
            class_rule("2001:db8::/32", |r| {
                r.proto = Some("icmpv6".into());
                r.icmp_type = Some(128);
                r.key_len = Some(48);
            }),
            class_rule("0.0.0.0/0", |r| {
                r.rate = None;
                r.proto = Some("17".into());
                r.dport = Some(PortValue::Number(27015));
                r.total_rate = Some("50kpps".into());
            }),
        ];
        for r in rules {
            let s = r.validate().unwrap();
            let c = s.config();
            let text = toml::to_string(&c).unwrap();
            let back: RuleConfig = toml::from_str(&text).unwrap();
            assert_eq!(back, c, "{text}");
            assert_eq!(back.validate().unwrap(), s, "{text}");
            assert_eq!(back.key().unwrap(), s.key());
        }
        // icmp_type is a number in TOML; a port a number or a range text.
        let r: RuleConfig =
            toml::from_str("prefix = \"0.0.0.0/0\"\nrate = \"5pps\"\nproto = \"icmp\"\nicmp_type = 8\n").unwrap();
        assert_eq!(r.validate().unwrap().class().to_string(), "icmp type 8");
        let r: RuleConfig =
            toml::from_str("prefix = \"0.0.0.0/0\"\nrate = \"5pps\"\nproto = \"udp\"\ndport = 53\n").unwrap();
        assert_eq!(r.validate().unwrap().class().to_string(), "udp dport 53");
    }

    /// One prefix, several rules: each (prefix, class) its own.
    #[test]
    fn rule_identity_is_prefix_and_class() {
        let plain = rc("10.0.0.0/8", Some("1kpps"), None).validate().unwrap();
        let dns = class_rule("10.0.0.0/8", |r| {
            r.proto = Some("udp".into());
            r.dport = Some(PortValue::Number(53));
        })
        .validate()
        .unwrap();
        let syn = class_rule("10.0.0.0/8", |r| {
            r.proto = Some("tcp".into());
            r.tcp_flags = Some("syn".into());
        })
        .validate()
        .unwrap();
        let mut set = std::collections::BTreeMap::new();
        for s in [&plain, &dns, &syn] {
            assert!(set.insert(s.key(), s.clone()).is_none(), "{} collided", s.key());
        }
        // rm names the prefix and the class: only that rule goes.
        let rm = RuleConfig { prefix: "10.0.0.0/8".into(), ..RuleConfig::default() }.with_class_text(ClassText {
            proto: Some("udp".into()),
            dport: Some("53".into()),
            ..ClassText::default()
        });
        assert_eq!(set.remove(&rm.key().unwrap()).map(|s| s.key()), Some(dns.key()));
        assert_eq!(set.keys().cloned().collect::<Vec<_>>(), {
            let mut v = vec![plain.key(), syn.key()];
            v.sort();
            v
        });
        // Without class options rm names the class-less rule.
        let rm = RuleConfig { prefix: "10.0.0.0/8".into(), ..RuleConfig::default() };
        assert_eq!(rm.key().unwrap(), plain.key());
        // The same class written differently is the same rule.
        let again = class_rule("10.0.0.0/8", |r| {
            r.proto = Some("6".into());
            r.tcp_flags = Some("syn".into());
        });
        assert_eq!(again.key().unwrap(), syn.key());
    }

    /// A key orders as (prefix, class, ban) with the class inline did: the
    /// rules in force, the file's and the plans walk keys in this order.
    #[test]
    fn keys_order_by_prefix_class_ban() {
        let classes = ["", "udp", "udp dport 53", "tcp flags syn", "icmp type 8", "udp dport 53 dst 192.0.2.0/24"];
        let mut keys = Vec::new();
        for p in ["10.0.0.0/8", "10.0.0.0/16", "192.0.2.0/24", "0.0.0.0/0"] {
            let net = parse_prefix(p).unwrap();
            for c in classes {
                let mut t = ClassText::default();
                let mut w = c.split_whitespace();
                while let Some(f) = w.next() {
                    match f {
                        "udp" | "tcp" | "icmp" => t.proto = Some(f.into()),
                        "dport" => t.dport = w.next().map(Into::into),
                        "flags" => t.tcp_flags = w.next().map(Into::into),
                        "type" => t.icmp_type = w.next().map(Into::into),
                        "dst" => t.dst = w.next().map(Into::into),
                        _ => unreachable!(),
                    }
                }
                let class = Class::parse(&t, false).unwrap();
                assert_eq!(class.is_none(), c.is_empty());
                for ban in [false, true] {
                    keys.push(RuleKey::new(net, class, ban));
                }
            }
        }
        let mut inline: Vec<_> = keys.iter().map(|k| (k.net, k.class(), k.ban)).collect();
        inline.sort();
        keys.reverse();
        keys.sort();
        assert_eq!(keys.iter().map(|k| (k.net, k.class(), k.ban)).collect::<Vec<_>>(), inline);
        assert_eq!(std::mem::size_of::<RuleKey>(), 32);
        assert_eq!(std::mem::size_of::<RuleSpec>(), 80);
    }
}
