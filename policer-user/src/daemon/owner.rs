//! The one owner of the kernel state: a thread that receives commands on a
//! channel and applies them in order, so rule changes stay serialized and
//! nothing else writes the maps. Connections wait for their answer on a
//! oneshot channel; a slow client holds only its own task, never the owner.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use tokio::sync::{mpsc, oneshot, watch};

use super::{
    Daemon,
    views::{IfaceRef, Snapshot},
};
use crate::{
    error::{Error, Result},
    rules::RuleConfig,
};

/// What the owner is asked to do.
#[derive(Debug)]
pub enum Command {
    RuleSet {
        rule: RuleConfig,
        runtime: bool,
        replace: bool,
        force: bool,
    },
    RuleRm {
        rule: RuleConfig,
        runtime: bool,
    },
    /// `policer reload` (and SIGHUP): `discard_runtime` drops what was
    /// changed with `--runtime` instead of keeping it over the file.
    Reload {
        discard_runtime: bool,
    },
    /// The config file's directory changed: reload if the file's bytes
    /// differ from those in force (and from a file already refused).
    Follow,
    Detach {
        iface: String,
    },
    /// `policer ban`: a manual ban (the rule config of one).
    Ban {
        rule: RuleConfig,
        runtime: bool,
        force: bool,
    },
    Unban {
        prefix: String,
        runtime: bool,
    },
    /// Periodic: removes what expired, and follows automatic bans (logs
    /// their starts and ends, forgets those past their escalation window).
    Tick,
    /// `policer rule import` (the file already read and parsed).
    Import(Box<super::sets::Import>),
    SetRm {
        name: String,
    },
    /// Leave: detach (unless --persist) and end the thread.
    Shutdown,
    /// `--dry-run` of a change: judged and planned, nothing written; the
    /// plan comes back in [`Outcome::preview`].
    Preview(Box<Command>),
}

/// The owner's answer: a message or an error, and whether the daemon
/// should now exit (its last interface was detached).
#[derive(Debug)]
pub struct Outcome {
    pub result: Result<String>,
    pub exit: bool,
    /// An import's counts (`rule import --json`).
    pub counts: Option<Box<crate::control::ImportCounts>>,
    /// A dry run's plan (`Command::Preview`).
    pub preview: Option<Box<super::Preview>>,
}

struct Job {
    cmd: Command,
    reply: oneshot::Sender<Outcome>,
}

/// How connections reach the owner. Cheap to clone.
#[derive(Clone)]
pub struct Owner {
    tx: mpsc::Sender<Job>,
    /// Set when the daemon is leaving: queued changes are refused, not
    /// applied, so the shutdown does not wait behind them.
    stopping: Arc<AtomicBool>,
    /// A tick is queued and not yet handled.
    tick_pending: Arc<AtomicBool>,
}

/// Commands waiting for the owner at most; past that a request is refused
/// at once ("busy") rather than queued without bound.
const QUEUE: usize = 256;

/// Changes written to the config file in one write at most.
const GROUP: usize = 64;

impl Command {
    /// A change of rules or manual bans written to the config file: such
    /// changes queued together are written as one (group commit).
    fn writes_rules_to_file(&self) -> bool {
        matches!(
            self,
            Command::RuleSet { runtime: false, .. }
                | Command::RuleRm { runtime: false, .. }
                | Command::Ban { runtime: false, .. }
                | Command::Unban { runtime: false, .. }
        )
    }
}

impl Owner {
    /// Asks the owner and waits for its answer.
    pub async fn ask(&self, cmd: Command) -> Outcome {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.tx.try_send(Job { cmd, reply }) {
            let why = match e {
                mpsc::error::TrySendError::Full(_) => "the daemon is busy (too many changes queued); try again",
                mpsc::error::TrySendError::Closed(_) => "the daemon is shutting down",
            };
            return Outcome { result: Err(Error::Invalid(why.into())), exit: false, counts: None, preview: None };
        }
        rx.await.unwrap_or(Outcome {
            result: Err(Error::Invalid("the daemon is shutting down".into())),
            exit: false,
            counts: None,
            preview: None,
        })
    }

    /// Queues a [`Command::Tick`] unless the owner is busy (a tick then
    /// comes later; ticks never pile up behind a long change).
    pub fn tick(&self) {
        if self.tick_pending.swap(true, Ordering::SeqCst) {
            return;
        }
        let (reply, _) = oneshot::channel();
        if self.tx.try_send(Job { cmd: Command::Tick, reply }).is_err() {
            self.tick_pending.store(false, Ordering::SeqCst);
        }
    }

    /// Asks the owner to leave, ahead of any queued change, and waits at
    /// most `deadline` for it; `None` when it did not answer in time (it
    /// is stuck in a system call: the program stays attached, as after
    /// `--persist`).
    pub async fn shutdown(&self, deadline: Duration) -> Option<Outcome> {
        self.stopping.store(true, Ordering::SeqCst);
        let (reply, rx) = oneshot::channel();
        let ask = async {
            self.tx.send(Job { cmd: Command::Shutdown, reply }).await.ok()?;
            rx.await.ok()
        };
        tokio::time::timeout(deadline, ask).await.ok().flatten()
    }
}

impl Daemon {
    /// What the read-only views need to know of the daemon now.
    pub(super) fn snapshot(&self) -> Arc<Snapshot> {
        let now_ms = crate::duration::unix_ms();
        Arc::new(Snapshot {
            ifaces: self
                .ifaces
                .iter()
                .map(|i| IfaceRef {
                    name: i.name.clone(),
                    index: i.index,
                    mode: crate::loader::Mode::flag_name(i.mode_flags),
                })
                .collect(),
            rules: self.rs.shared_rules(),
            // Not what ended while the file could not be written (a full
            // disk): that is gone, and the file catches up (`bans.rs`).
            removed_at_runtime: self
                .rs
                .removed_at_runtime()
                .filter(|s| s.expires.is_none_or(|e| e > now_ms))
                .cloned()
                .collect(),
            config: self.file.path().display().to_string(),
            persist: self.persist,
            program_id: self.program_id,
            config_status: self.reload.status(self.file.sha256(), self.file.read_only()),
            sets: self.set_rows(),
            manual_ban_slots: self.rs.ban_slots(),
            protect: self.rs.protect().nets().to_vec(),
            metrics: self.metrics_addr,
        })
    }

    /// Writes what the start changed (rules from `--rate`, the interfaces)
    /// into the config file. A failure is a warning: policing runs from the
    /// command line, the file keeps what it says, and `rule ls` shows the
    /// difference.
    pub(super) fn write_start_config(&mut self, names: &[String], rules_changed: bool) {
        // Rules the file already holds (no `--rate`) are not written
        // again: only the interfaces then (the [daemon] table alone,
        // `config/splice.rs`); the file's rules stay what they are.
        if !rules_changed {
            if let Err(e) = self.file.update(crate::config::Change { rules: None, interfaces: Some(names) }) {
                say!("policer: warning: {e}");
            }
            return;
        }
        let rules = self.rs.specs();
        if let Err(e) = self.file.update(crate::config::Change { rules: Some(&rules), interfaces: Some(names) }) {
            say!("policer: warning: {e}");
            self.rs.set_file_rules(self.file.read().map(|s| s.rules).unwrap_or_default());
        } else {
            self.rs.set_file_rules(rules);
        }
    }

    pub(super) fn handle(&mut self, cmd: Command) -> Outcome {
        let done = |result| Outcome { result, exit: false, counts: None, preview: None };
        match cmd {
            Command::Ban { rule, runtime, force } => done(self.ban(&rule, runtime, force)),
            Command::Unban { prefix, runtime } => done(self.unban(&prefix, runtime)),
            Command::Tick => done(self.tick().map(|_| String::new())),
            Command::RuleSet { rule, runtime, replace, force } => done(self.rule_set(&rule, runtime, replace, force)),
            Command::RuleRm { rule, runtime } => done(self.rule_rm(&rule, runtime)),
            Command::Reload { discard_runtime } => done(self.reload(discard_runtime)),
            Command::Follow => {
                let r = self.follow();
                // An empty message: nothing was done.
                if let Ok(m) = &r
                    && !m.is_empty()
                {
                    self.audit.record("the config file (followed)", m);
                }
                done(r)
            }
            Command::Detach { iface } => match self.detach(&iface) {
                Ok(true) => Outcome {
                    result: Ok(format!("detached from {iface}; no interface left, the daemon exits")),
                    exit: true,
                    counts: None,
                    preview: None,
                },
                Ok(false) => done(Ok(format!("detached from {iface}"))),
                Err(e) => done(Err(e)),
            },
            Command::Import(imp) => match self.import(*imp) {
                Ok((m, c)) => Outcome { result: Ok(m), exit: false, counts: Some(Box::new(c)), preview: None },
                Err(e) => done(Err(e)),
            },
            Command::SetRm { name } => done(self.set_rm(&name)),
            Command::Shutdown => done(self.finish().map(|m| m.to_string())),
            Command::Preview(cmd) => self.preview(*cmd),
        }
    }
}

/// Starts the owner thread with `daemon`; every change is published on
/// `snapshot`. The thread ends after [`Command::Shutdown`] (or when every
/// [`Owner`] is gone, which also shuts down).
pub fn spawn(mut daemon: Daemon, snapshot: watch::Sender<Arc<Snapshot>>) -> Result<(Owner, thread::JoinHandle<()>)> {
    let (tx, mut rx) = mpsc::channel::<Job>(QUEUE);
    let stopping = Arc::new(AtomicBool::new(false));
    let stop = stopping.clone();
    let tick_pending = Arc::new(AtomicBool::new(false));
    let pending = tick_pending.clone();
    let handle = thread::Builder::new().name("policer-owner".into()).spawn(move || {
        let mut next: Option<Job> = None;
        // Memory a group of changes freed goes back to the system at the
        // next tick (within 100 ms), not after each group: a burst of
        // changes does not wait behind it.
        let mut trim = false;
        loop {
            let Some(job) = next.take().or_else(|| rx.blocking_recv()) else { break };
            if !matches!(job.cmd, Command::Shutdown) && stop.load(Ordering::SeqCst) {
                let _ = job.reply.send(Outcome {
                    result: Err(Error::Invalid("the daemon is shutting down; nothing changed".into())),
                    exit: false,
                    counts: None,
                    preview: None,
                });
                continue;
            }
            if job.cmd.writes_rules_to_file() {
                // Group commit: this change and those queued behind it are
                // judged and planned one by one, written to the file once,
                // then made in the kernel (never before the write: a full
                // disk refuses them all and nothing took effect); each is
                // answered when that is done.
                let mut group = vec![job];
                while group.len() < GROUP {
                    match rx.try_recv() {
                        Ok(j) if j.cmd.writes_rules_to_file() && !stop.load(Ordering::SeqCst) => group.push(j),
                        Ok(j) => {
                            next = Some(j);
                            break;
                        }
                        Err(_) => break,
                    }
                }
                daemon.begin_group();
                let mut answers = Vec::with_capacity(group.len());
                for Job { cmd, reply } in group {
                    let outcome = daemon.handle(cmd);
                    answers.push((outcome, daemon.take_group_wrote(), reply));
                }
                let written = daemon.end_group();
                snapshot.send_replace(daemon.snapshot());
                for (mut outcome, waited, reply) in answers {
                    if waited && let Err(e) = &written {
                        outcome.result = Err(Error::Invalid(e.to_string()));
                    }
                    let _ = reply.send(outcome);
                }
                trim = true;
                continue;
            }
            let Job { cmd, reply } = job;
            let last = matches!(cmd, Command::Shutdown);
            let tick = matches!(cmd, Command::Tick);
            if tick {
                pending.store(false, Ordering::SeqCst);
            }
            // A dry run changes nothing: nothing to publish.
            let quiet = tick || matches!(cmd, Command::Preview(_));
            let outcome = daemon.handle(cmd);
            // A tick that changed nothing publishes nothing.
            if !quiet || daemon.take_changed() {
                snapshot.send_replace(daemon.snapshot());
                trim = true;
            }
            // A change on its own (a reload, an import) gives its memory
            // back at once; a tick, what the groups since left.
            if trim && (tick || !quiet) {
                crate::config::ConfigFile::release_memory();
                trim = false;
            }
            let _ = reply.send(outcome);
            if last {
                return;
            }
        }
        // Every sender gone without a shutdown: still leave cleanly.
        if let Err(e) = daemon.finish() {
            say_err!("policer: {e}");
        }
    })?;
    Ok((Owner { tx, stopping, tick_pending }, handle))
}
