//! The audit trail: every change to what the daemon enforces is one line
//! in its log, `policer: change by WHO: WHAT`, and the last few are kept
//! for `policer stats --json` (`recent_changes`).
//!
//! WHO is the peer of the control socket (`uid 0 pid 4242`: the socket is
//! root's only, but root is many people), `SIGHUP`, `the config file
//! (followed)`, `expiry`, or `the program (automatic ban)`; WHAT is what
//! the change did, old → new where it has an old value.
//!
//! Shared between the owner thread (reloads, expiries, automatic bans) and
//! the connections' tasks (changes made through the socket, recorded with
//! their peer): a short lock around a bounded queue.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use crate::control::ChangeRecord;

/// How many changes `stats --json` lists.
pub const KEPT: usize = 20;

/// The log of changes. Cheap to clone; every clone is the same log.
#[derive(Clone, Default)]
pub struct Audit {
    recent: Arc<Mutex<VecDeque<ChangeRecord>>>,
}

impl Audit {
    /// Logs a change (one line) and keeps it among the last [`KEPT`].
    /// Control characters are shown escaped: a line is one line.
    pub fn record(&self, who: &str, what: &str) {
        let (who, what) = (crate::text::escaped(who), crate::text::escaped(what));
        say!("policer: change by {who}: {what}");
        let unix_ms = crate::duration::unix_ms();
        let r = ChangeRecord { time: crate::duration::rfc3339(unix_ms), unix_ms, who, what };
        // A panic elsewhere while holding the lock leaves the queue whole.
        let mut q = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() == KEPT {
            q.pop_front();
        }
        q.push_back(r);
    }

    /// The last changes, oldest first.
    pub fn recent(&self) -> Vec<ChangeRecord> {
        self.recent.lock().unwrap_or_else(|e| e.into_inner()).iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_changes_in_order_with_who_and_what() {
        let a = Audit::default();
        let b = a.clone();
        for i in 0..KEPT + 5 {
            b.record("uid 0 pid 7", &format!("change {i}"));
        }
        a.record("expiry", "the rule for 10.0.0.0/8 expired\nand was removed");
        let r = a.recent();
        assert_eq!(r.len(), KEPT);
        assert_eq!(r[0].what, "change 6");
        let last = r.last().unwrap();
        assert_eq!(
            (last.who.as_str(), last.what.as_str()),
            ("expiry", "the rule for 10.0.0.0/8 expired\\u{a}and was removed")
        );
        assert!(last.time.ends_with('Z') && last.unix_ms > 0, "{last:?}");
    }
}
