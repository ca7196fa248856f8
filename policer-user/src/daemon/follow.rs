//! The daemon follows its config file: it watches the file's directory
//! (inotify through `notify`), so it sees an edit in place, an editor's
//! rename over the file, and the kubelet's swap of a ConfigMap volume
//! (`config.toml -> ..data/config.toml`; a new timestamped directory, then
//! `..data_tmp` renamed over `..data`). Events are debounced; the owner
//! then compares the file's sha256 with the one in force and reloads only
//! when it differs, exactly as `policer reload` does (all of it valid, or
//! nothing changes and the running rules stay). The daemon's own writes
//! (`rule set`) leave the hashes equal, so they reload nothing.

use std::{path::Path, time::Duration};

use notify::Watcher;
use tokio::sync::mpsc;

use super::{Command, Owner};

/// Quiet time after the last event before the file is looked at: an
/// editor's or the kubelet's steps land together.
const DEBOUNCE: Duration = Duration::from_millis(250);

/// Starts following `config`; the watcher lives as long as the task. A
/// directory that cannot be watched is a warning: `policer reload` and
/// SIGHUP still work.
pub(super) fn start(owner: Owner, config: &Path) {
    let dir = match config.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => std::path::PathBuf::from("."),
    };
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let watcher = notify::recommended_watcher(move |ev: notify::Result<notify::Event>| {
        // Only "something happened" matters; a full channel already says so.
        if ev.map(|e| !e.kind.is_access()).unwrap_or(true) {
            let _ = tx.try_send(());
        }
    })
    .and_then(|mut w| w.watch(&dir, notify::RecursiveMode::NonRecursive).map(|()| w));
    let watcher = match watcher {
        Ok(w) => w,
        Err(e) => {
            println!(
                "policer: warning: cannot watch {} ({e}); config changes need `policer reload` or SIGHUP",
                dir.display()
            );
            return;
        }
    };
    tokio::spawn(async move {
        let _watcher = watcher;
        while rx.recv().await.is_some() {
            // Debounce: wait until the directory has been quiet for a while.
            while let Ok(Some(())) = tokio::time::timeout(DEBOUNCE, rx.recv()).await {}
            match owner.ask(Command::Follow).await.result {
                Ok(m) if m.is_empty() => {}
                Ok(m) => println!("policer: config file changed: {m}"),
                Err(e) => println!("policer: config file changed: not applied, the running rules stay: {e}"),
            }
        }
    });
}
