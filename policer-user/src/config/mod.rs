//! The config file: TOML, read at start and on `policer reload` / SIGHUP,
//! and changed by the daemon after every `policer rule set/rm`.
//!
//! ```toml
//! [daemon]
//! interfaces = ["eth0"]      # used when `policer attach` names none
//! mode = "auto"              # auto | native | skb
//! max_sources = 1048576
//!
//! [[rule]]
//! prefix = "0.0.0.0/0"
//! rate = "10kpps"
//! burst = 200
//!
//! [[rule]]
//! prefix = "203.0.113.0/24"
//! rate = "500pps"
//! burst = 50
//! action = "police"          # police | monitor | allow | deny
//! key_len = 32               # leading source bits per bucket
//! ```
//!
//! - [`Config`]: parsing and strict validation (unknown keys refused).
//! - [`schema`]: every key of every table, with its kind, default and
//!   help: what the reader (`read.rs`) dispatches on and what
//!   policer.toml(5) lists.
//! - [`ConfigFile`] (`file.rs`): what the daemon holds; changes the file the
//!   operator wrote (`edit.rs`: comments and layout kept) and refuses to
//!   overwrite a hand edit not yet reloaded.
//! - `write.rs`: the atomic replacement of the file that keeps its owner,
//!   mode and symlinks, and leaves no temporary file behind (a write
//!   killed midway does; the next start removes it).

mod edit;
mod file;
mod lex;
mod read;
pub mod schema;
mod splice;
mod write;

#[cfg(test)]
mod tests;

pub use crate::sets::SetConfig;
pub use edit::Change;
#[cfg(test)]
use file::SPLICED;
pub use file::{ConfigFile, FileSnapshot, Pending, Staging, final_newline_warning, sha256_hex};
pub use write::NEW_FILE_MODE;
pub(crate) use write::{DirSync, remove_leftovers};

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    loader::{Mode, check_max_sources},
    rules::{RuleConfig, RuleKey, RuleSpec},
};

pub const DEFAULT_PATH: &str = "/etc/policer/policer.toml";

/// Where each `[[rule]]` header of a text starts, when its reader found
/// them.
pub(super) type Headers = Option<Vec<usize>>;

/// One problem of a config file, as `policer check` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// 1-based line, where the problem has one.
    pub line: Option<usize>,
    pub message: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DaemonConfig {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<Mode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sources: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rules: Option<u32>,
    /// Prefixes no rule, ban, set or feed may drop ([`crate::protect`]).
    /// Unlike the other keys, a reload applies it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub protect: Vec<String>,
}

impl DaemonConfig {
    /// Whether the settings that apply only at a start differ.
    pub fn differs_at_start(&self, other: &DaemonConfig) -> bool {
        let start_only = |d: &DaemonConfig| DaemonConfig { protect: Vec::new(), ..d.clone() };
        start_only(self) != start_only(other)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub daemon: DaemonConfig,
    #[serde(default, rename = "rule", skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleConfig>,
    /// `[[set]]` tables: named sets whose entries are a file's lines,
    /// loaded at start and at every reload.
    #[serde(default, rename = "set", skip_serializing_if = "Vec::is_empty")]
    pub sets: Vec<SetConfig>,
    /// `[crowdsec]`: decisions pulled from CrowdSec's Local API into a set
    /// (and automatic bans published to it); read at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crowdsec: Option<crate::crowdsec::CrowdsecConfig>,
    /// `[[chain]]` tables: the programs behind policer (docs/chain.md).
    #[serde(default, rename = "chain", skip_serializing_if = "Vec::is_empty")]
    pub chains: Vec<crate::chain::ChainConfig>,
    /// `[global]`: the Redis of the fleet budgets (docs/fleet.md); read
    /// at start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global: Option<crate::fleet::GlobalConfig>,
}

pub(crate) const HEADER: &str = "\
# policer configuration (see README, \"Service and config file\", and
# policer.toml(5)).
# Written by the policer daemon after every change. A running daemon
# follows edits by hand (as `policer reload` or SIGHUP do): nothing is
# applied unless the whole file is valid.
";

/// The `[daemon]` table of `text` where it comes before the first
/// `[[rule]]` table (as the daemon writes it), read from that part alone:
/// a start loads the program with its sizes while the whole text is read
/// and validated. A `[daemon]` table after a rule is not seen (the
/// default's is given); `None` when that part has a problem.
pub fn daemon_before_rules(text: &str) -> Option<DaemonConfig> {
    let at = splice::first_rule_header(text)?;
    let r = read::read(&text[..at]);
    r.problems.is_empty().then_some(r.config.daemon)
}

impl Config {
    /// Parses and validates the whole text; on any error nothing is used.
    /// The error is the first problem, with its line; `policer check`
    /// lists them all.
    pub fn parse(text: &str, origin: &Path) -> Result<(Config, BTreeMap<RuleKey, RuleSpec>)> {
        Config::parse_headed(text, origin).map(|(c, r, _)| (c, r))
    }

    /// [`Config::parse`], and where each `[[rule]]` header starts when the
    /// reader found them (a big file, read in chunks): the file's layout
    /// for `splice.rs` needs no other pass over the text.
    pub(super) fn parse_headed(text: &str, origin: &Path) -> Result<(Config, BTreeMap<RuleKey, RuleSpec>, Headers)> {
        let (cfg, rules, problems, headers) = Config::check_headed(text, None);
        if problems.is_empty() {
            return Ok((cfg, rules, headers));
        }
        Err({
            let more = problems.len().saturating_sub(1);
            let first = problems.into_iter().next().map_or_else(String::new, |p| match p.line {
                Some(l) => format!("line {l}: {}", p.message),
                None => p.message,
            });
            let more = match more {
                0 => String::new(),
                1 => " (and 1 more problem: `policer check --config FILE` lists them all)".into(),
                n => format!(" (and {n} more problems: `policer check --config FILE` lists them all)"),
            };
            Error::Invalid(format!("{}: {first}{more}", origin.display()))
        })
    }

    /// Every problem of `text` (syntax, keys and values, rules, sets' keys),
    /// each with its line where it has one; or the config and its rules.
    /// With `sets_from` (the config file's path), each `[[set]]`'s list file
    /// is read and checked too (its lines, its rule against its entries,
    /// conflicts with the rules and the protected prefixes).
    pub(crate) fn check_all(
        text: &str,
        sets_from: Option<&Path>,
    ) -> (Config, BTreeMap<RuleKey, RuleSpec>, Vec<Problem>) {
        let (cfg, rules, problems, _) = Config::check_headed(text, sets_from);
        (cfg, rules, problems)
    }

    /// [`Config::check_all`], and the rules' headers if found.
    fn check_headed(
        text: &str,
        sets_from: Option<&Path>,
    ) -> (Config, BTreeMap<RuleKey, RuleSpec>, Vec<Problem>, Headers) {
        let mut read = read::read(text);
        let checker = read.checker.take().unwrap_or_else(|| RuleChecker::new(&read.config.daemon));
        let (rules, semantic) = checker.finish(&read.config.daemon);
        let global = read.global_problems(&rules, sets_from);
        let mut problems = read.problems;
        // The rules' own checks speak of the command line's options; in
        // a file, the keys are what the operator wrote.
        problems.extend(semantic.into_iter().map(|p| Problem { message: as_keys(&p.message), ..p }));
        problems.extend(read.config.set_problems(&read.set_origins, &rules, sets_from));
        // The feed's values (and, given the file's path, its secrets' files).
        if let Some(c) = &read.config.crowdsec {
            let base = sets_from.and_then(Path::parent).unwrap_or(Path::new("/nonexistent"));
            let checked = match sets_from {
                Some(_) => c.settings(base).map(|_| ()),
                // Without the file's place, a secret's file cannot be read.
                None => crate::crowdsec::CrowdsecConfig {
                    api_key_file: None,
                    password_file: None,
                    api_key: Some("x".into()),
                    password: c.publish.then(|| "x".into()),
                    ..c.clone()
                }
                .settings(base)
                .map(|_| ()),
            };
            if let Err(e) = checked {
                problems.push(Problem { line: read.crowdsec_line, message: e.to_string() });
            }
        }
        problems.extend(global);
        // In the order of the file; the file-wide ones last.
        problems.sort_by_key(|p| p.line.unwrap_or(usize::MAX));
        (read.config, rules, problems, read.headers)
    }

    /// The problems of the `[[set]]` tables beyond a key's own value (see
    /// [`Config::check_all`]), each at its table's line.
    fn set_problems(
        &self,
        origins: &[read::TableOrigin],
        rules: &BTreeMap<RuleKey, RuleSpec>,
        sets_from: Option<&Path>,
    ) -> Vec<Problem> {
        let mut problems = Vec::new();
        let protect = crate::protect::Protect::parse(&self.daemon.protect).unwrap_or_default();
        for (s, o) in self.sets.iter().zip(origins) {
            let at = |m: String| {
                let m = m.replace("; nothing imported", "");
                let m = m.strip_prefix(&format!("set '{}': ", s.name)).map_or(m.clone(), str::to_string);
                Problem { line: o.line, message: format!("set {} (name {}): {}", o.number, s.name, as_keys(&m)) }
            };
            // Every problem of the set's rule (issue 43 point 15), not the
            // first: those of the values it gives, as a rule's; then the
            // rest judged as if those were good ones (its key length
            // against its entries, its entries against the rules).
            let any = crate::sets::family_any(false).to_string();
            let (_, found) = crate::rules::RuleConfig { prefix: any.clone(), ..s.rule() }.checked(&[]);
            let mut clean = s.clone();
            for p in &found {
                let m = p.error.to_string();
                let m = m.strip_prefix(&format!("{any}: ")).map_or(m.clone(), str::to_string);
                match p.key {
                    "rate" if s.rate.is_some() => clean.rate = Some("1pps".into()),
                    "burst" if s.burst.is_some() => clean.burst = None,
                    "action" => clean.action = Some(policer_common::bucket::Action::Deny),
                    _ => continue,
                }
                problems.push(at(m));
            }
            let s = &clean;
            let Some(config) = sets_from else {
                if let Err(e) = crate::sets::specs(&s.name, &s.rule(), &[]) {
                    problems.push(at(e.to_string()));
                }
                continue;
            };
            let l = match crate::sets::read_config_list(config, s) {
                Ok(l) => l,
                Err(e) => {
                    problems.push(at(e.to_string()));
                    continue;
                }
            };
            let (spec4, _) = match crate::sets::specs(&s.name, &s.rule(), &l.list.entries) {
                Ok(x) => x,
                Err(e) => {
                    problems.push(at(e.to_string()));
                    continue;
                }
            };
            let file = l.path.display().to_string();
            let keys = rules.keys().filter(|k| !k.ban).map(|k| (k.net, k.to_string()));
            if let Err(e) = crate::sets::check_conflicts(&l.list.entries, spec4.action, keys, &protect, |n| {
                match crate::sets::line_of(&l.text, n) {
                    Some(line) => format!("{file}:{line}"),
                    None => file.clone(),
                }
            }) {
                problems.push(at(e.to_string()));
            }
        }
        problems
    }

    /// Validates every rule; prefixes must be unique. The first problem
    /// is the error (see [`Config::check`] for all of them).
    pub fn validate(&self) -> Result<BTreeMap<RuleKey, RuleSpec>> {
        let reads: Vec<read::RuleRead> =
            self.rules.iter().enumerate().map(|(i, r)| read::RuleRead::given(i + 1, r)).collect();
        let (rules, problems) = self.problems_at(&reads);
        match problems.into_iter().next() {
            Some(p) => Err(Error::Invalid(p.message)),
            None => Ok(rules),
        }
    }

    /// Every problem of the rules and the daemon table that needs more
    /// than one key to see (`reads`: the rule tables, in the file's
    /// order), each at the line of the key it is about (else its rule's);
    /// and the rules that are valid (see [`RuleChecker`]).
    fn problems_at(&self, reads: &[read::RuleRead]) -> (BTreeMap<RuleKey, RuleSpec>, Vec<Problem>) {
        let mut c = RuleChecker::new(&self.daemon);
        for r in reads {
            c.check(r);
        }
        c.finish(&self.daemon)
    }

    /// `policer check`: the whole file's problems, all of them, each with
    /// its line where it has one; or the config and its rules. `max_rules`
    /// is the limit the file will run under (`--max-rules`; else the
    /// file's `daemon.max_rules`, else the default): more rules than that
    /// is a problem too. (The daemon checks the count against the limit in
    /// force, which only it knows.)
    pub fn check(
        text: &str,
        max_rules: Option<u32>,
    ) -> std::result::Result<(Config, BTreeMap<RuleKey, RuleSpec>), Vec<Problem>> {
        Config::check_at(text, max_rules, None)
    }

    /// [`Config::check`], and each `[[set]]`'s list file read and checked
    /// too (`path`: the config file, whose directory relative `file`s are
    /// in): `FILE:LINE` of a bad line, or of an entry that is a rule's
    /// prefix or inside a protected prefix.
    pub fn check_at(
        text: &str,
        max_rules: Option<u32>,
        path: Option<&Path>,
    ) -> std::result::Result<(Config, BTreeMap<RuleKey, RuleSpec>), Vec<Problem>> {
        let (cfg, rules, mut problems) = Config::check_all(text, path);
        let limit = max_rules.or(cfg.daemon.max_rules).unwrap_or(policer_common::DEFAULT_MAX_RULES);
        if cfg.rules.len() > limit as usize {
            problems.push(Problem {
                line: None,
                message: format!(
                    "{} rules, more than the limit of {limit} (--max-rules, or daemon.max_rules)",
                    cfg.rules.len()
                ),
            });
        }
        if problems.is_empty() { Ok((cfg, rules)) } else { Err(problems) }
    }
}

/// The checks of the rules that need more than one key to see, a rule at
/// a time in the file's order (a file's rules are read a chunk at a time,
/// and each rule as read is let go once checked): each problem at the
/// line of the key it is about (else its rule's), and the rules that are
/// valid. A rule the reader found a problem in is checked for what its
/// other keys say (with nothing said that only follows from the keys it
/// could not read), not taken.
#[derive(Clone)]
struct RuleChecker {
    out: BTreeMap<RuleKey, RuleSpec>,
    /// Every rule's identity seen, valid or not: the same rule twice is
    /// said whatever else is wrong with either. A valid rule's identity is
    /// a key of `out` (one search of it a rule), the others' are here.
    seen: std::collections::BTreeSet<RuleKey>,
    protect: crate::protect::Protect,
    problems: Vec<Problem>,
}

impl RuleChecker {
    fn new(daemon: &DaemonConfig) -> RuleChecker {
        let mut problems = Vec::new();
        let protect = crate::protect::Protect::parse(&daemon.protect).unwrap_or_else(|e| {
            problems.push(Problem { line: None, message: e.to_string() });
            Default::default()
        });
        RuleChecker { out: BTreeMap::new(), seen: std::collections::BTreeSet::new(), protect, problems }
    }

    /// Checks one rule as read.
    fn check(&mut self, read: &read::RuleRead) {
        if read.cut {
            return;
        }
        let Self { out, seen, protect, problems } = self;
        let r = &read.rule;
        // Made only for a message, not for every rule.
        let head = std::fmt::from_fn(|f| match &read.shown {
            Some(p) => write!(f, "rule {} (prefix {})", read.origin.number, crate::text::escaped(p)),
            None => write!(f, "rule {}", read.origin.number),
        });
        let mut broken = read.broken.clone();
        if r.ttl.is_some() && !broken.contains(&"ttl") {
            problems.push(Problem {
                line: read.line_of("ttl"),
                message: format!(
                    "{head}: `ttl` is for the command line (every reload would restart it); write \
                     expires = \"2026-11-25T01:02:03Z\" (UTC) instead"
                ),
            });
            broken.push("ttl");
        }
        let (spec, found) = r.checked(&broken);
        let identity = ["prefix", "proto", "dport", "sport", "tcp_flags", "icmp_type", "dst", "ban"];
        let known = |k: &str| !broken.contains(&k) && !found.iter().any(|p| p.key == k);
        let key = match &spec {
            Some(s) => Some(s.key()),
            None if identity.iter().all(|k| known(k)) => r.key().ok(),
            None => None,
        };
        for p in &found {
            problems.push(Problem { line: read.line_of(p.key), message: format!("{head}: {}", keyed(r, p)) });
        }
        let twice = |key: &RuleKey| Problem {
            line: read.origin.line,
            message: if key.class().is_none() {
                format!("{head}: prefix {} appears twice", key.net)
            } else {
                format!("{head}: the rule {key} appears twice")
            },
        };
        let (spec, key) = match (spec.filter(|_| !read.flawed), key) {
            (Some(spec), Some(key)) => (spec, key),
            (_, key) => {
                if let Some(key) = key
                    && (out.contains_key(&key) || !seen.insert(key.clone()))
                {
                    problems.push(twice(&key));
                }
                return;
            }
        };
        if seen.contains(&key) {
            problems.push(twice(&key));
            return;
        }
        if let Err(e) = protect.refuse_rule(&spec) {
            let e = e.to_string().replace("; nothing changed", "");
            problems.push(Problem { line: read.origin.line, message: format!("{head}: {e}") });
            seen.insert(key);
            return;
        }
        match out.entry(key) {
            std::collections::btree_map::Entry::Occupied(o) => problems.push(twice(o.key())),
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(spec);
            }
        }
    }

    /// The valid rules and every problem, with those of the rules as a
    /// whole and of the daemon table's limits.
    fn finish(self, d: &DaemonConfig) -> (BTreeMap<RuleKey, RuleSpec>, Vec<Problem>) {
        let Self { out, mut problems, .. } = self;
        // Classes that tie, or too many for one frame: what the daemon's
        // compiler would refuse.
        if let Err(e) = crate::compile::check_rules(out.values()) {
            problems.push(Problem { line: None, message: e.to_string() });
        }
        if let Some(n) = d.max_sources
            && let Err(e) = check_max_sources(n, "daemon.max_sources")
        {
            problems.push(Problem { line: None, message: e });
        }
        if let Some(m) = d.max_rules
            && !(1..=policer_common::MAX_RULES).contains(&m)
        {
            problems.push(Problem {
                line: None,
                message: format!("daemon.max_rules must be 1 to {}", policer_common::MAX_RULES),
            });
        }
        (out, problems)
    }
}

/// A rule's problem as its line in a file says it (after `rule N (prefix
/// P): `): the key it is about first, unless its words begin with it; the
/// rule's own name (`10.0.0.0/8: `, `ban 10.0.0.0/8: `) left out, the
/// line's head says it; the command line's options named as the keys.
fn keyed(r: &RuleConfig, p: &crate::rules::KeyProblem) -> String {
    let mut m = p.error.to_string();
    let canonical = crate::prefix::parse_prefix(&r.prefix).map(|n| n.to_string()).ok();
    // (A prefix that could not be read is empty here: `: ...`.)
    for name in [Some(r.prefix.clone()), canonical].into_iter().flatten() {
        for head in [format!("ban {name}: "), format!("{name}: ")] {
            if let Some(rest) = m.strip_prefix(&head) {
                m = rest.to_string();
            }
        }
    }
    let m = as_keys(&m);
    let named = m.strip_prefix(p.key).is_some_and(|rest| rest.starts_with([' ', ':', '\'']));
    if named { m } else { format!("{}: {m}", p.key) }
}

/// `message` with the command line's options (`--total-rate`) named as
/// the config file's keys (`total_rate`).
fn as_keys(message: &str) -> String {
    // Longest first: `--total-rate` before `--rate`.
    const OPTIONS: [(&str, &str); 20] = [
        ("--no-inherit", "inherit = false"),
        ("--ban-within", "ban_within"),
        ("--syn-ack-rate", "syn_ack_rate"),
        ("--syn-cookies", "syn_cookies"),
        ("--total-burst", "total_burst"),
        ("--total-rate", "total_rate"),
        ("--tcp-flags", "tcp_flags"),
        ("--icmp-type", "icmp_type"),
        ("--ban-after", "ban_after"),
        ("--ban-for", "ban_for"),
        ("--ban-max", "ban_max"),
        ("--key-len", "key_len"),
        ("--action", "action"),
        ("--proto", "proto"),
        ("--dport", "dport"),
        ("--sport", "sport"),
        ("--dst", "dst"),
        ("--global", "global"),
        ("--burst", "burst"),
        ("--rate", "rate"),
    ];
    let mut m = message.to_string();
    for (option, key) in OPTIONS {
        m = m.replace(option, key);
    }
    m
}

#[cfg(test)]
mod parse_tests {
    use super::*;

    const GOOD: &str = r#"
[daemon]
interfaces = ["eth0"]
mode = "native"

[[rule]]
prefix = "0.0.0.0/0"
rate = "10kpps"
burst = 200

[[rule]]
prefix = "2001:db8::/32"
rate = "100mbit"
burst = "64kb"
key_len = 48

[[rule]]
prefix = "198.51.100.0/24"
action = "deny"
"#;

    /// The config with `rules` as its rule list, as text: what the
    /// constructors of a rule read back as.
    fn text_of(cfg: &Config, rules: &BTreeMap<RuleKey, RuleSpec>) -> String {
        let c = Config {
            daemon: cfg.daemon.clone(),
            rules: rules.values().map(RuleSpec::config).collect(),
            sets: cfg.sets.clone(),
            crowdsec: cfg.crowdsec.clone(),
            chains: cfg.chains.clone(),
            global: cfg.global.clone(),
        };
        toml::to_string_pretty(&c).expect("config serializes")
    }

    #[test]
    fn parses_and_round_trips() {
        let (cfg, rules) = Config::parse(GOOD, Path::new("t.toml")).unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(cfg.daemon.mode, Some(Mode::Native));
        let text = text_of(&cfg, &rules);
        let (_, again) = Config::parse(&text, Path::new("t.toml")).unwrap();
        assert_eq!(rules, again);
    }

    #[test]
    fn refuses_bad_files() {
        for (bad, needle) in [
            ("[daemon]\ncolour = 1\n", "line 2: daemon: unknown key `colour`"),
            ("[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\nburst = 5\nfoo = 1\n", "unknown key"),
            (
                "[[rule]]\nprefix = 10\nrate = \"1kpps\"\n",
                "rule 1: prefix: 10 is not a prefix; write prefix = \"10.0.0.0/8\"",
            ),
            (
                "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = 1000\n",
                "line 3: rule 1 (prefix 10.0.0.0/8): rate: 1000 is not a rate",
            ),
            (
                "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\n[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"2kpps\"\n",
                "appears twice",
            ),
            ("[[rule]]\nprefix = \"10.0.0.1/8\"\nrate = \"1kpps\"\n", "host bits"),
            (
                "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kbps\"\n",
                "rate: \"1kbps\" is not a rate; write rate = \"10kpps\"",
            ),
            ("[[rule]]\nprefix = \"10.0.0.0/8\"\n", "needs a rate"),
            ("[daemon]\nmax_sources = 0\n", "max_sources"),
            ("[daemon]\nmode = \"turbo\"\n", "daemon.mode: \"turbo\" is not a mode; write mode = \"auto\""),
            ("this is not toml", "t.toml"),
        ] {
            let e = Config::parse(bad, Path::new("t.toml")).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
    }

    /// Issue 41, point 10: a `max_sources` no start can load (its tables
    /// preallocated: 4294967295 sources would take ~704 GiB) is refused
    /// where the file is read, saying the bound and what it would take,
    /// as the loader refuses it from the command line; the bound itself
    /// passes.
    #[test]
    fn max_sources_is_bounded_by_what_a_start_can_load() {
        let max = policer_common::MAX_SOURCES;
        let e = Config::parse("[daemon]\nmax_sources = 4294967295\n", Path::new("t.toml")).unwrap_err().to_string();
        assert!(e.contains(&format!("daemon.max_sources must be 1 to {max}")) && e.contains("MiB"), "{e}");
        assert!(e.contains("4294967295 would take 720896 MiB"), "{e}");
        let e = Config::check(&format!("[daemon]\nmax_sources = {}\n", max + 1), None).unwrap_err();
        assert!(e[0].message.starts_with("daemon.max_sources must be 1 to "), "{e:?}");
        assert!(Config::parse(&format!("[daemon]\nmax_sources = {max}\n"), Path::new("t.toml")).is_ok());
        assert_eq!(policer_common::layout::source_tables_bytes(max).div_ceil(1 << 20), 2816);
        let e = check_max_sources(0, "--max-sources").unwrap_err();
        assert!(e.starts_with("--max-sources must be 1 to ") && !e.contains("would take"), "{e}");
    }

    /// Issue 41, point 10 (review): what a start will need of the
    /// machine: source tables past its MemTotal are refused with the
    /// numbers, past half of it warned of, below that nothing said.
    #[test]
    fn max_sources_is_checked_against_the_machines_memory() {
        use crate::loader::check_sources_memory;
        let need = policer_common::layout::source_tables_bytes(1 << 20);
        assert_eq!(need, 176 << 20);
        let e = check_sources_memory(1 << 20, need - 1, "daemon.max_sources").unwrap_err();
        assert!(
            e.starts_with("daemon.max_sources = 1048576: the source tables take 176 MiB")
                && e.contains("more than this machine's 176 MiB (MemTotal)")
                && e.contains("nothing changed"),
            "{e}"
        );
        assert!(check_sources_memory(1 << 20, 100 << 20, "--max-sources").unwrap_err().contains("100 MiB"));
        let w = check_sources_memory(1 << 20, need, "--max-sources").unwrap().unwrap();
        assert!(w.contains("176 MiB") && w.contains("over half of this machine's 176 MiB"), "{w}");
        let w = check_sources_memory(1 << 20, 2 * need - 1, "--max-sources").unwrap().unwrap();
        assert!(w.contains("over half of"), "{w}");
        assert_eq!(check_sources_memory(1 << 20, 2 * need, "--max-sources"), Ok(None));
        assert_eq!(check_sources_memory(policer_common::MAX_SOURCES, 64 << 30, "--max-sources"), Ok(None));
        // This machine's MemTotal reads (Linux).
        assert!(crate::loader::mem_total().is_some_and(|m| m > 1 << 20));
    }

    /// `policer check` warns of a valid file without a final newline: a
    /// followed update of it would be refused.
    #[test]
    fn check_warns_of_a_missing_final_newline() {
        let w = super::final_newline_warning("[daemon]\nmode = \"auto\"").unwrap();
        assert!(w.starts_with("it does not end with a newline") && w.contains("|-"), "{w}");
        assert_eq!(super::final_newline_warning("[daemon]\nmode = \"auto\"\n"), None);
        assert_eq!(super::final_newline_warning(""), None);
    }

    #[test]
    fn deploy_example_is_valid() {
        let text = include_str!("../../../deploy/policer.toml");
        let (cfg, rules) = super::Config::parse(text, std::path::Path::new("deploy/policer.toml")).unwrap();
        // As shipped: the two default rules, the examples commented out.
        assert_eq!(rules.len(), 2);
        assert_eq!(cfg.daemon.interfaces, vec!["eth0".to_string()]);
    }
}
