//! Manual bans kept in the state directory (`policer ban --state`, what
//! fail2ban's action asks for), not in the config file: bans another
//! program manages come and go by the thousand, and the hand-managed
//! policer.toml is not the place for them (issue 43, point 15).
//!
//! They are manual bans like the others in every other respect: in force
//! in the kernel as a ban of the config file is (a runtime change the
//! file does not hold), listed by `ban ls` and counted by `status` and
//! `stats`, lifted by `policer unban` or at their end. What makes them
//! last is `STATE_DIR/bans.json`, written whole (beside the sets' `sets/`)
//! at each change: the next start puts the bans of the file that have not
//! ended back, and a `reload --discard-runtime` keeps them.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use ipnet::IpNet;

use crate::{
    error::{Error, Result},
    rules::{RuleConfig, RuleKey, RuleSpec},
};

/// The bans kept in the state directory, by prefix, and their file.
#[derive(Debug, Default)]
pub(super) struct StateBans {
    file: PathBuf,
    bans: BTreeMap<IpNet, RuleSpec>,
}

/// `STATE_DIR/bans.json`, beside the sets' directory `sets_dir`.
pub(super) fn file_of(sets_dir: &Path) -> PathBuf {
    sets_dir.parent().map_or_else(|| PathBuf::from("bans.json"), |p| p.join("bans.json"))
}

impl StateBans {
    /// The bans of `STATE_DIR/bans.json` (none without the file); a file
    /// that does not read, or a ban in it that is not one, is an error
    /// that names it (read by the start before the kernel changes: such a
    /// file fails it, changing nothing).
    pub(super) fn read(sets_dir: &Path) -> Result<StateBans> {
        let file = file_of(sets_dir);
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(StateBans { file, bans: BTreeMap::new() }),
            Err(e) => return Err(Error::Invalid(format!("{}: {e}", file.display()))),
        };
        let rules: Vec<RuleConfig> =
            serde_json::from_slice(&bytes).map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
        let mut bans = BTreeMap::new();
        for rc in rules {
            let spec = rc.validate().map_err(|e| Error::Invalid(format!("{}: {e}", file.display())))?;
            if spec.ban().is_none() || spec.expires.is_none() {
                return Err(Error::Invalid(format!("{}: {} is not a ban with an end", file.display(), rc.prefix)));
            }
            bans.insert(spec.net, spec);
        }
        Ok(StateBans { file, bans })
    }

    /// The file they are kept in.
    pub(super) fn path(&self) -> &Path {
        &self.file
    }

    pub(super) fn contains(&self, net: &IpNet) -> bool {
        self.bans.contains_key(net)
    }

    #[cfg(test)]
    fn is_empty(&self) -> bool {
        self.bans.is_empty()
    }

    /// The bans that have not ended at `now_ms`, as the edits that put
    /// them in force.
    pub(super) fn edits(&self, now_ms: u64) -> Vec<(RuleKey, Option<RuleSpec>)> {
        self.bans
            .values()
            .filter(|s| s.expires.is_some_and(|e| e > now_ms))
            .map(|s| (s.key(), Some(s.clone())))
            .collect()
    }

    /// The bans that have not ended at `now_ms`, by key (a reload lays
    /// them over the file, `--discard-runtime` or not).
    pub(super) fn specs(&self, now_ms: u64) -> BTreeMap<RuleKey, RuleSpec> {
        self.edits(now_ms).into_iter().filter_map(|(k, s)| Some((k, s?))).collect()
    }

    /// With the ban `spec` (added, or replacing the one of its prefix) and
    /// without those of `gone`, written to the file; as it was when the
    /// write fails.
    pub(super) fn change(&mut self, spec: Option<&RuleSpec>, gone: &[IpNet]) -> Result<()> {
        let mut next = self.bans.clone();
        for n in gone {
            next.remove(n);
        }
        if let Some(s) = spec {
            next.insert(s.net, s.clone());
        }
        if next == self.bans {
            return Ok(());
        }
        let rules: Vec<RuleConfig> = next.values().map(RuleSpec::config).collect();
        crate::files::replace_json(&self.file, &rules)
            .map_err(|e| Error::Invalid(format!("writing {}: {e}", self.file.display())))?;
        self.bans = next;
        Ok(())
    }

    /// Leaves out the bans that ended by `now_ms` (written when any did).
    pub(super) fn drop_ended(&mut self, now_ms: u64) -> Result<()> {
        let ended: Vec<IpNet> =
            self.bans.iter().filter(|(_, s)| s.expires.is_none_or(|e| e <= now_ms)).map(|(n, _)| *n).collect();
        self.change(None, &ended)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban(prefix: &str, ttl: &str, reason: &str) -> RuleSpec {
        RuleConfig {
            prefix: prefix.into(),
            ban: Some(true),
            ttl: Some(ttl.into()),
            reason: Some(reason.into()),
            ..RuleConfig::default()
        }
        .validate()
        .unwrap()
    }

    #[test]
    fn bans_are_kept_whole_in_the_file_and_read_back() {
        let dir = std::env::temp_dir().join(format!("policer-statebans-{}", std::process::id()));
        let sets = dir.join("sets");
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = StateBans::read(&sets).unwrap();
        assert!(s.is_empty());
        assert_eq!(s.path(), dir.join("bans.json"));
        let a = ban("10.0.0.5", "1h", "fail2ban:sshd");
        let b = ban("2001:db8::/64", "10m", "fail2ban:web");
        s.change(Some(&a), &[]).unwrap();
        s.change(Some(&b), &[]).unwrap();
        let back = StateBans::read(&sets).unwrap();
        assert_eq!(back.bans, s.bans);
        let now = crate::duration::unix_ms();
        assert_eq!(back.edits(now).len(), 2);
        assert!(back.contains(&a.net) && back.contains(&b.net));
        // Lifted: gone from the file too.
        s.change(None, &[a.net]).unwrap();
        let back = StateBans::read(&sets).unwrap();
        assert!(!back.contains(&a.net) && back.contains(&b.net));
        // Ended: left out of what a start puts back, and dropped.
        assert!(back.edits(now + 3_600_000).is_empty());
        s.drop_ended(now + 3_600_000).unwrap();
        assert!(StateBans::read(&sets).unwrap().is_empty());
        // A file that is not a list of bans is refused, naming it.
        std::fs::write(dir.join("bans.json"), br#"[{"prefix":"10.0.0.1","rate":"10pps"}]"#).unwrap();
        let e = StateBans::read(&sets).unwrap_err().to_string();
        assert!(e.contains("bans.json") && e.contains("not a ban"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
