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
//!   mode and symlinks, and leaves no temporary file behind.

mod edit;
mod file;
mod write;

#[cfg(test)]
mod tests;

pub use edit::Change;
pub use file::{ConfigFile, Snapshot};
pub use write::NEW_FILE_MODE;

use std::{collections::BTreeMap, fs, path::Path};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::{
    error::{Error, Result},
    loader::Mode,
    rules::{RuleConfig, RuleSpec},
};

pub const DEFAULT_PATH: &str = "/etc/policer/policer.toml";

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
# Written by the policer daemon after every change; edit by hand and run
# `policer reload` (or send SIGHUP) to apply: nothing is applied unless the
# whole file is valid.
";

impl Config {
    /// Parses and validates the whole text; on any error nothing is used.
    pub fn parse(text: &str, origin: &Path) -> Result<(Config, BTreeMap<IpNet, RuleSpec>)> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| Error::Invalid(format!("{}: {}", origin.display(), e.to_string().trim())))?;
        let rules = cfg.validate().map_err(|e| Error::Invalid(format!("{}: {e}", origin.display())))?;
        Ok((cfg, rules))
    }

    /// Validates every rule; prefixes must be unique.
    pub fn validate(&self) -> Result<BTreeMap<IpNet, RuleSpec>> {
        let mut out = BTreeMap::new();
        for (i, r) in self.rules.iter().enumerate() {
            let spec = r.validate().map_err(|e| Error::Invalid(format!("rule #{} ({}): {e}", i + 1, r.prefix)))?;
            if out.insert(spec.net, spec.clone()).is_some() {
                return Err(Error::Invalid(format!(
                    "rule #{} ({}): prefix {} appears twice",
                    i + 1,
                    r.prefix,
                    spec.net
                )));
            }
        }
        if let Some(0) = self.daemon.max_sources {
            return Err(Error::Invalid("daemon.max_sources must be at least 1".into()));
        }
        Ok(out)
    }

    /// Reads `path`; a missing file is an empty config.
    pub fn load(path: &Path) -> Result<(Config, BTreeMap<IpNet, RuleSpec>)> {
        match fs::read_to_string(path) {
            Ok(text) => Config::parse(&text, path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((Config::default(), BTreeMap::new())),
            Err(e) => Err(Error::Invalid(format!("{}: {e}", path.display()))),
        }
    }

    /// The config with `rules` as its rule list (sorted by prefix).
    pub fn with_rules(&self, rules: &BTreeMap<IpNet, RuleSpec>) -> Config {
        Config { daemon: self.daemon.clone(), rules: rules.values().map(RuleSpec::config).collect() }
    }

    pub fn to_text(&self) -> String {
        format!("{HEADER}\n{}", toml::to_string_pretty(self).expect("config serializes"))
    }

    /// Writes the whole file from this config, atomically, keeping the old
    /// file's owner and mode (see [`write`]). Comments are not kept: the
    /// daemon changes its file through [`ConfigFile`] instead.
    pub fn save(&self, path: &Path) -> Result<()> {
        write::write_atomic(path, self.to_text().as_bytes())
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

    #[test]
    fn parses_and_round_trips() {
        let (cfg, rules) = Config::parse(GOOD, Path::new("t.toml")).unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(cfg.daemon.mode, Some(Mode::Native));
        let text = cfg.with_rules(&rules).to_text();
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
    fn saves_atomically() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("sub/policer.toml");
        let (cfg, rules) = Config::parse(GOOD, Path::new("t.toml")).unwrap();
        cfg.with_rules(&rules).save(&p).unwrap();
        let (_, back) = Config::load(&p).unwrap();
        assert_eq!(back, rules);
        assert_eq!(std::fs::read_dir(p.parent().unwrap()).unwrap().count(), 1, "temporary file left behind");
    }
}

#[cfg(test)]
mod shipped {
    /// The documented example config parses and validates.
    #[test]
    fn deploy_example_is_valid() {
        let text = include_str!("../../../deploy/policer.toml");
        let (cfg, rules) = super::Config::parse(text, std::path::Path::new("deploy/policer.toml")).unwrap();
        assert_eq!(rules.len(), 7);
        assert_eq!(cfg.daemon.interfaces, vec!["eth0".to_string()]);
    }
}
