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
    /// A forget's write failed (a full disk): the bans are gone here, the
    /// file still holds them; written again from this time on.
    behind: Option<std::time::Instant>,
}

/// How often a file left behind by a failed forget is written again.
const RETRY: std::time::Duration = std::time::Duration::from_secs(10);

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
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(StateBans { file, ..StateBans::default() });
            }
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
        Ok(StateBans { file, bans, behind: None })
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
        if next == self.bans && self.behind.is_none() {
            return Ok(());
        }
        write(&self.file, &next)?;
        self.bans = next;
        self.behind = None;
        Ok(())
    }

    /// Without the bans of `gone` (lifted, ended, or now the config
    /// file's): gone here at once, whatever the write does. A write that
    /// fails leaves the file behind: [`StateBans::catch_up`] writes it
    /// again (so does any later change) until it lands.
    pub(super) fn forget(&mut self, gone: &[IpNet]) -> Result<()> {
        let held = self.bans.len();
        for n in gone {
            self.bans.remove(n);
        }
        if self.bans.len() == held && self.behind.is_none() {
            return Ok(());
        }
        let r = write(&self.file, &self.bans);
        self.behind = r.is_err().then(|| std::time::Instant::now() + RETRY);
        r
    }

    /// The file written again when a forget left it behind and its time
    /// has come: `None` when nothing was tried.
    pub(super) fn catch_up(&mut self, now: std::time::Instant) -> Option<Result<()>> {
        if self.behind.is_none_or(|at| now < at) {
            return None;
        }
        let r = write(&self.file, &self.bans);
        self.behind = r.is_err().then(|| now + RETRY);
        Some(r)
    }

    /// Leaves out the bans that ended by `now_ms` (written when any did).
    pub(super) fn drop_ended(&mut self, now_ms: u64) -> Result<()> {
        let ended: Vec<IpNet> =
            self.bans.iter().filter(|(_, s)| s.expires.is_none_or(|e| e <= now_ms)).map(|(n, _)| *n).collect();
        self.forget(&ended)
    }
}

/// `bans` written whole to `file`.
fn write(file: &Path, bans: &BTreeMap<IpNet, RuleSpec>) -> Result<()> {
    let rules: Vec<RuleConfig> = bans.values().map(RuleSpec::config).collect();
    crate::files::replace_json(file, &rules).map_err(|e| Error::Invalid(format!("writing {}: {e}", file.display())))
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

    /// A lift whose write fails (here the file's place is taken by a
    /// directory; in production a full disk) is a lift all the same, and
    /// the file is written again until it lands: a start after that does
    /// not bring the lifted ban back.
    #[test]
    fn a_forget_whose_write_fails_is_written_again_until_it_lands() {
        let dir = std::env::temp_dir().join(format!("policer-statebans-behind-{}", std::process::id()));
        let sets = dir.join("sets");
        let _ = std::fs::remove_dir_all(&dir);
        let mut s = StateBans::read(&sets).unwrap();
        let (a, b) = (ban("10.0.0.5", "1h", "fail2ban:sshd"), ban("10.0.0.6", "1h", "fail2ban:sshd"));
        s.change(Some(&a), &[]).unwrap();
        s.change(Some(&b), &[]).unwrap();
        let file = dir.join("bans.json");
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir_all(file.join("in-the-way")).unwrap();
        let t0 = std::time::Instant::now();
        assert!(s.forget(&[a.net]).is_err());
        assert!(!s.contains(&a.net) && s.contains(&b.net), "lifted here whatever the write did");
        assert!(s.catch_up(t0).is_none(), "tried again before its time");
        assert!(s.catch_up(t0 + RETRY * 2).is_some_and(|r| r.is_err()));
        std::fs::remove_dir_all(&file).unwrap();
        assert!(s.catch_up(t0 + RETRY * 2).is_none(), "the failed retry set the next time");
        assert!(s.catch_up(t0 + RETRY * 4).is_some_and(|r| r.is_ok()));
        assert!(s.catch_up(t0 + RETRY * 8).is_none(), "nothing behind any more");
        let back = StateBans::read(&sets).unwrap();
        assert!(!back.contains(&a.net) && back.contains(&b.net));
        // A forget of nothing new while behind writes too; so does a ban.
        std::fs::remove_file(&file).unwrap();
        std::fs::create_dir_all(file.join("in-the-way")).unwrap();
        assert!(s.forget(&[b.net]).is_err());
        std::fs::remove_dir_all(&file).unwrap();
        s.change(Some(&a), &[]).unwrap();
        let back = StateBans::read(&sets).unwrap();
        assert!(back.contains(&a.net) && !back.contains(&b.net));
        assert!(s.catch_up(t0 + RETRY * 100).is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
