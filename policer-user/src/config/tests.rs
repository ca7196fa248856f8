//! Tests of writing the config: writes that keep the file's owner and mode
//! and leave nothing behind on error. Failures are injected (the tests run
//! as root, for whom a read-only directory is writable).

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt, symlink},
    path::{Path, PathBuf},
};

use ipnet::IpNet;

use super::write::{FAULT, NEXT_NAME, Step};
use crate::{error::Error, rules::RuleSpec};

const EXAMPLE: &str = include_str!("../../../deploy/policer.toml");

fn without(mut rules: BTreeMap<IpNet, RuleSpec>, prefix: &str) -> BTreeMap<IpNet, RuleSpec> {
    rules.remove(&prefix.parse::<IpNet>().unwrap()).expect("rule exists");
    rules
}

/// Files in `dir` other than `keep`: temporary files left behind.
fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

fn example_in(dir: &Path) -> PathBuf {
    let p = dir.join("policer.toml");
    fs::write(&p, EXAMPLE).unwrap();
    p
}

#[test]
fn directory_that_cannot_be_created_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("etc"), "a file, not a directory").unwrap();
    let p = d.path().join("etc/policer/policer.toml");
    let e = super::write::write_atomic(&p, b"[daemon]\n").unwrap_err();
    assert!(matches!(e, Error::ConfigWrite { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("creating the directory") && msg.contains("Not a directory"), "{msg}");
    assert!(leftovers(d.path(), &["etc"]).is_empty());
    assert_eq!(fs::read_to_string(d.path().join("etc")).unwrap(), "a file, not a directory");
}

#[test]
fn config_save_keeps_mode_too() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    let (cfg, rules) = super::Config::load(&p).unwrap();
    cfg.with_rules(&rules).save(&p).unwrap();
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
    assert!(leftovers(d.path(), &["policer.toml"]).is_empty());
}

#[test]
fn config_save_fails_cleanly_and_never_follows_a_planted_name() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (cfg, rules) = super::Config::load(&p).unwrap();
    let cfg = cfg.with_rules(&without(rules, "10.0.0.0/8"));

    FAULT.with(|c| c.set(Some((Step::Write, libc::ENOSPC))));
    let e = cfg.save(&p).unwrap_err();
    FAULT.with(|c| c.set(None));
    assert!(matches!(e, Error::ConfigWrite { .. }), "{e:?}");
    assert_eq!(fs::read_to_string(&p).unwrap(), EXAMPLE);
    assert!(leftovers(d.path(), &["policer.toml"]).is_empty());

    let victim = d.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    let planted = d.path().join(format!(".policer.toml.{:016x}.tmp", 0xbad_u64));
    symlink(&victim, &planted).unwrap();
    NEXT_NAME.with(|c| c.set(Some(0xbad)));
    cfg.save(&p).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(super::Config::load(&p).unwrap().0.rules, cfg.rules);
}
