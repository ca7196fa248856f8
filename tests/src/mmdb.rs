//! MaxMind DB files the tests write themselves, with PyPI's `mmdb-writer`
//! (and `netaddr`), which `cargo xtask setup` installs into a venv under
//! the target directory (`tools/mmdb-venv`). The writer is driven by
//! `tests/mmdb/write_mmdb.py`, which also prints the writer's own list of
//! the networks it put in the file: what a reader of the whole tree must
//! find.

use std::path::{Path, PathBuf};

/// The venv's python: `$CARGO_TARGET_DIR/tools/mmdb-venv`, else the
/// workspace's `target/tools/mmdb-venv`.
pub fn python() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"), PathBuf::from);
    target.join("tools/mmdb-venv/bin/python")
}

/// True when the tests can write databases here; otherwise says why, and
/// under CI fails ([`crate::skip`]).
pub fn available(tier: &str) -> bool {
    if !crate::privileged(tier) {
        return false;
    }
    if python().exists() {
        return true;
    }
    crate::skip(&format!(
        "{tier}: skipped: mmdb-writer is not installed in {}: run `cargo xtask setup`",
        python().display()
    ));
    false
}

/// Writes `out` from `networks` ([network, record], inserted in order: a
/// network inside an earlier one splits it), an IPv6 database whose IPv4
/// networks are at `::/96` (a network under `::ffff:0:0/96` stays there);
/// returns the writer's list of (network, record), IPv4 as IPv4, each
/// once, sorted.
pub fn write(out: &Path, database_type: &str, networks: &serde_json::Value) -> Vec<(String, serde_json::Value)> {
    let spec = out.with_extension("json");
    let body = serde_json::json!({"ip_version": 6, "database_type": database_type, "networks": networks});
    std::fs::write(&spec, body.to_string()).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("mmdb/write_mmdb.py");
    let o = std::process::Command::new(python()).arg(&script).arg(&spec).arg(out).output().unwrap();
    let _ = std::fs::remove_file(&spec);
    assert!(o.status.success(), "write_mmdb.py: {}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}
