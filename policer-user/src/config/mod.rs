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
//! - [`ConfigFile`] (`file.rs`): what the daemon holds; changes the file the
//!   operator wrote (`edit.rs`: comments and layout kept) and refuses to
//!   overwrite a hand edit not yet reloaded.
//! - `write.rs`: the atomic replacement of the file that keeps its owner,
//!   mode and symlinks, and leaves no temporary file behind (a write
//!   killed midway does; the next start removes it).

mod edit;
mod file;
mod write;

#[cfg(test)]
mod tests;

pub use edit::Change;
pub use file::{ConfigFile, Pending, Snapshot, sha256_hex};
pub use write::NEW_FILE_MODE;
pub(crate) use write::remove_leftovers;

use std::{collections::BTreeMap, path::Path};

use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    loader::Mode,
    rules::{RuleConfig, RuleKey, RuleSpec},
};

pub const DEFAULT_PATH: &str = "/etc/policer/policer.toml";

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
}

pub(crate) const HEADER: &str = "\
# policer configuration (see README, \"Config file\").
# Written by the policer daemon after every change. A running daemon
# follows edits by hand (as `policer reload` or SIGHUP do): nothing is
# applied unless the whole file is valid.
";

impl Config {
    /// Parses and validates the whole text; on any error nothing is used.
    pub fn parse(text: &str, origin: &Path) -> Result<(Config, BTreeMap<RuleKey, RuleSpec>)> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| Error::Invalid(format!("{}: {}", origin.display(), e.to_string().trim())))?;
        let rules = cfg.validate().map_err(|e| Error::Invalid(format!("{}: {e}", origin.display())))?;
        Ok((cfg, rules))
    }

    /// Validates every rule; prefixes must be unique. The first problem
    /// is the error (see [`Config::problems`] for all of them).
    pub fn validate(&self) -> Result<BTreeMap<RuleKey, RuleSpec>> {
        let (rules, problems) = self.problems(None);
        match problems.into_iter().next() {
            Some(p) => Err(Error::Invalid(p.message)),
            None => Ok(rules),
        }
    }

    /// Every problem of the config, each with the line of its `[[rule]]`
    /// table when `text` (the file it came from) is given; and the rules
    /// that are valid.
    pub fn problems(&self, text: Option<&str>) -> (BTreeMap<RuleKey, RuleSpec>, Vec<Problem>) {
        // Lines of the `[[rule]]` headers, in order (1-based); when the
        // count does not match (rules written as an inline array), none.
        let heads: Vec<usize> = text
            .map(|t| {
                t.lines()
                    .enumerate()
                    .filter(|(_, l)| l.trim_start().starts_with("[[rule]]"))
                    .map(|(n, _)| n + 1)
                    .collect()
            })
            .unwrap_or_default();
        let line_of = |i: usize| (heads.len() == self.rules.len()).then(|| heads[i]);
        let mut out = BTreeMap::new();
        let mut problems = Vec::new();
        let protect = crate::protect::Protect::parse(&self.daemon.protect).unwrap_or_else(|e| {
            problems.push(Problem { line: None, message: e.to_string() });
            Default::default()
        });
        for (i, r) in self.rules.iter().enumerate() {
            let at = |m: String| Problem { line: line_of(i), message: format!("rule #{} ({}): {m}", i + 1, r.prefix) };
            if r.ttl.is_some() {
                problems.push(at("`ttl` is for the command line (every reload would restart it); write \
                     expires = \"2026-11-25T01:02:03Z\" (UTC) instead"
                    .into()));
                continue;
            }
            match r.validate() {
                Ok(spec) => {
                    if let Err(e) = protect.refuse_rule(&spec) {
                        problems.push(at(e.to_string().replace("; nothing changed", "")));
                        continue;
                    }
                    if out.insert(spec.key(), spec.clone()).is_some() {
                        let what = if spec.class.is_none() {
                            format!("prefix {}", spec.net)
                        } else {
                            format!("the rule {}", spec.key())
                        };
                        problems.push(at(format!("{what} appears twice")));
                    }
                }
                Err(e) => problems.push(at(e.to_string())),
            }
        }
        // Classes that tie, or too many for one frame: what the daemon's
        // compiler would refuse.
        if let Err(e) = crate::compile::check_rules(out.values()) {
            problems.push(Problem { line: None, message: e.to_string() });
        }
        let d = &self.daemon;
        if let Some(0) = d.max_sources {
            problems.push(Problem { line: None, message: "daemon.max_sources must be at least 1".into() });
        }
        if let Some(m) = d.max_rules
            && !(1..=policer_common::MAX_RULES).contains(&m)
        {
            problems.push(Problem {
                line: None,
                message: format!("daemon.max_rules must be 1 ..= {}", policer_common::MAX_RULES),
            });
        }
        (out, problems)
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
        let cfg: Config = match toml::from_str(text) {
            Ok(c) => c,
            Err(e) => {
                // toml says where: the line of the span's start.
                let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
                return Err(vec![Problem { line, message: e.message().trim().to_string() }]);
            }
        };
        let (rules, mut problems) = cfg.problems(Some(text));
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
        let c = Config { daemon: cfg.daemon.clone(), rules: rules.values().map(RuleSpec::config).collect() };
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
            ("[daemon]\ncolour = 1\n", "unknown field"),
            ("[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\nburst = 5\nfoo = 1\n", "unknown field"),
            ("[[rule]]\nprefix = 10\n", "invalid type"),
            ("[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = 1000\n", "invalid type"),
            (
                "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\n[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"2kpps\"\n",
                "appears twice",
            ),
            ("[[rule]]\nprefix = \"10.0.0.1/8\"\nrate = \"1kpps\"\n", "host bits"),
            ("[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kbps\"\n", "unknown unit"),
            ("[[rule]]\nprefix = \"10.0.0.0/8\"\n", "needs a rate"),
            ("[daemon]\nmax_sources = 0\n", "max_sources"),
            ("[daemon]\nmode = \"turbo\"\n", "unknown variant"),
            ("this is not toml", "t.toml"),
        ] {
            let e = Config::parse(bad, Path::new("t.toml")).unwrap_err().to_string();
            assert!(e.contains(needle), "{bad:?}: {e}");
        }
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
