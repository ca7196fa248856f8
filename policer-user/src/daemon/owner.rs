//! The one owner of the kernel state: a thread that receives commands on a
//! channel and applies them in order, so rule changes stay serialized and
//! nothing else writes the maps. Connections wait for their answer on a
//! oneshot channel; a slow client holds only its own task, never the owner.
//!
//! It composes the owner types — [`RuleSet`](super::ruleset::RuleSet),
//! [`Bans`](super::bans::Bans), [`Reload`](super::reload::Reload) — and
//! dispatches: a change is planned by its type's pure planner
//! (`plan.rs`, `bans::plan_ban`, `reload::plan`, ...), and this file
//! decides what becomes of the plan ([`Daemon::change`]): previewed
//! (`--dry-run`), joined to a group of changes written to the config file
//! once ([`Group`]), or written now.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use tokio::sync::{mpsc, oneshot, watch};

use ipnet::IpNet;
use policer_common::Rule;

use super::{
    Daemon,
    aside::{Aside, Guard, Nothing},
    bans,
    dryrun::{Preview, PreviewCapture, World},
    plan::Plan,
    reload::{self, FollowStep},
    ruleset::{WhenWritten, not_written, prepare},
    sets::{self, SetState},
    views::{IfaceRef, Snapshot},
};
use crate::{
    error::{Error, Result},
    rules::{RuleConfig, RuleKey, RuleSpec},
    trie::TrieWriter,
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
        /// `reload --dry-run FILE`: the file judged in the config's place.
        candidate: Option<std::path::PathBuf>,
    },
    /// The config file's directory changed: reload if the file's bytes
    /// differ from those in force (and from a file already refused).
    Follow,
    Detach {
        iface: String,
        hand_over: bool,
        force: bool,
    },
    /// `policer chain add` (crate::chain).
    ChainAdd {
        chain: crate::chain::ChainConfig,
        slot: Option<u32>,
    },
    ChainRm {
        iface: String,
        slot: u32,
    },
    /// `policer ban`: a manual ban (the rule config of one).
    Ban {
        rule: RuleConfig,
        runtime: bool,
        force: bool,
        /// Kept in the state directory (`statebans.rs`), not the file.
        state: bool,
    },
    Unban {
        prefix: String,
        runtime: bool,
    },
    /// Periodic: removes what expired, and follows automatic bans (logs
    /// their starts and ends, forgets those past their escalation window).
    Tick,
    /// The fleet budgets' aggregates for the next lease period
    /// (`fleet.rs`): the newest the lease thread left in the slot
    /// ([`Owner::lease`]), written where the rule still names its budget.
    Lease(LeaseSlot),
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

/// A change request as the owner's command: the one place a request
/// becomes a command. Not a command: the reads (served from the snapshot
/// and the maps), an import (its file is read off the owner first, then
/// it is [`Command::Import`]) and a dry run (its change, in
/// [`Command::Preview`]); those come back as they were.
impl TryFrom<crate::control::Request> for Command {
    type Error = crate::control::Request;

    fn try_from(r: crate::control::Request) -> std::result::Result<Command, crate::control::Request> {
        use crate::control::Request;
        Ok(match r {
            Request::RuleSet { rule, runtime, replace, force } => Command::RuleSet { rule, runtime, replace, force },
            Request::RuleRm { rule, runtime } => Command::RuleRm { rule, runtime },
            Request::Reload { discard_runtime, candidate } => Command::Reload { discard_runtime, candidate },
            Request::Detach { iface, hand_over, force } => Command::Detach { iface, hand_over, force },
            Request::ChainAdd { chain, slot } => Command::ChainAdd { chain, slot },
            Request::ChainRm { iface, slot } => Command::ChainRm { iface, slot },
            Request::Ban { rule, runtime, force, state } => Command::Ban { rule, runtime, force, state },
            Request::Unban { prefix, runtime } => Command::Unban { prefix, runtime },
            Request::SetRm { name } => Command::SetRm { name },
            other => return Err(other),
        })
    }
}

/// The owner's answer: what the command did or why it was refused (a
/// typed error), and whether the daemon should now exit (its last
/// interface was detached).
#[derive(Debug)]
pub struct Outcome {
    pub result: Result<Response>,
    pub exit: bool,
}

/// What a command that went through answers, by kind of command.
#[derive(Debug)]
pub enum Response {
    /// What changed (or that nothing did), in a line; empty: nothing was
    /// done (a tick, a followed file that did not change).
    Done(String),
    /// `rule import` (and a feed's delta): the line, and the counts
    /// (`rule import --json`, the feed's status).
    Imported { message: String, counts: Box<crate::control::ImportCounts> },
    /// `Command::Preview`: the dry run's plan, which the connection's task
    /// judges against live sources.
    Previewed(Box<super::Preview>),
}

impl Response {
    /// The line of a change (for the audit trail and the log); empty for
    /// a preview.
    pub fn message(&self) -> &str {
        match self {
            Response::Done(m) | Response::Imported { message: m, .. } => m,
            Response::Previewed(_) => "",
        }
    }
}

impl Outcome {
    /// An answer that leaves the daemon running.
    fn of(result: Result<Response>) -> Outcome {
        Outcome { result, exit: false }
    }

    /// A change's line (or its refusal), the daemon running on.
    fn done(result: Result<String>) -> Outcome {
        Outcome::of(result.map(Response::Done))
    }
}

struct Job {
    cmd: Command,
    reply: oneshot::Sender<Outcome>,
    /// When it was queued: how long it waited for the owner is recorded
    /// ([`Reload::waited`](super::reload::Reload::waited)).
    queued: std::time::Instant,
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
    /// The lease thread's newest aggregates, not yet written.
    lease: LeaseSlot,
}

/// The fleet budgets' newest aggregates, waiting for the owner: one queued
/// [`Command::Lease`] at a time takes whatever is newest when it is
/// handled, so leases never pile up in the queue behind a long change
/// (a period each: 256 of them would have filled it, refusing every
/// request as busy, then been written one after the other, all stale).
pub type LeaseSlot = Arc<std::sync::Mutex<Option<Vec<super::LeaseWrite>>>>;

/// Takes the newest aggregates from `slot` (none: already written).
fn take_lease(slot: &LeaseSlot) -> Vec<super::LeaseWrite> {
    slot.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take().unwrap_or_default()
}

/// Commands waiting for the owner at most; past that a request is refused
/// at once ("busy") rather than queued without bound.
const QUEUE: usize = 256;

/// Changes written to the config file in one write at most.
const GROUP: usize = 64;

/// Changes handled together whose file writes are one write (group
/// commit): what arrives while a write is in flight waits for the next
/// one write, not one each. Nothing of a group reaches the kernel before
/// its file is written ([`Daemon::end_group`]): each change is judged and
/// planned on the rules as the group's changes before it leave them, and
/// the group is staged in the file, then made in the kernel, then put in
/// place — as a change on its own is.
#[derive(Debug, Default)]
pub(super) struct Group {
    /// What the group's changes do so far: each key as the last of them
    /// left it (`None`: removed).
    pending: BTreeMap<RuleKey, Option<RuleSpec>>,
    /// The plan of all of `pending` made to the rules in force.
    plan: Option<Plan>,
    /// The changes that wait for the write.
    changes: u64,
    /// The change handled last waits for the write.
    wrote: bool,
    /// The file was checked for a hand edit.
    checked: bool,
    /// What the changes do once the write is done (log lines, automatic
    /// bans an `unban` lifts): nothing of it if the write fails.
    after: Vec<WhenWritten>,
    /// The generation of the rules `plan` was made on
    /// ([`RuleSet::generation`](super::ruleset::RuleSet::generation));
    /// `None`: made on a group being written (its changes taken as made),
    /// so made again once that group is in force.
    made_on: Option<u64>,
    /// Why none of the group's changes can be made: the group it was
    /// judged on (being written when its changes were handled) failed.
    failed: Option<String>,
}

/// The groups of changes not yet in force: the one the owner is taking
/// changes into, and the one whose write is on its way to the disk.
#[derive(Debug, Default)]
pub(super) struct Groups {
    pub(super) open: Option<Group>,
    /// Its changes are judged on by those of `open` ([`run_groups`]).
    pub(super) writing: Option<Group>,
}

/// A group's write on its way ([`Daemon::begin_write`]): the file's new
/// version being staged on a thread of its own.
pub(super) struct Write {
    staging: Option<crate::config::Staging>,
    /// The group's changes, each key once.
    edits: Vec<(RuleKey, Option<RuleSpec>)>,
    /// Those the file's rules change by.
    file_edits: Vec<(RuleKey, Option<RuleSpec>)>,
    since: std::time::Instant,
}

impl Write {
    /// Whether the new version is staged (written and synced, or failed):
    /// the kernel and the rename may follow without waiting.
    fn staged(&self) -> bool {
        self.staging.as_ref().is_none_or(crate::config::Staging::is_finished)
    }
}

impl Command {
    /// A change of rules or manual bans written to the config file: such
    /// changes queued together are written as one (group commit).
    fn writes_rules_to_file(&self) -> bool {
        matches!(
            self,
            Command::RuleSet { runtime: false, .. }
                | Command::RuleRm { runtime: false, .. }
                | Command::Ban { runtime: false, state: false, .. }
                | Command::Unban { runtime: false, .. }
        )
    }
}

impl Owner {
    /// Asks the owner and waits for its answer.
    pub async fn ask(&self, cmd: Command) -> Outcome {
        let (reply, rx) = oneshot::channel();
        if let Err(e) = self.tx.try_send(Job { cmd, reply, queued: std::time::Instant::now() }) {
            let e = match e {
                mpsc::error::TrySendError::Full(_) => Error::ChangesQueued,
                mpsc::error::TrySendError::Closed(_) => Error::ShuttingDown { note: "" },
            };
            return Outcome::of(Err(e));
        }
        rx.await.unwrap_or(Outcome::of(Err(Error::ShuttingDown { note: "" })))
    }

    /// Queues a [`Command::Tick`] unless the owner is busy (a tick then
    /// comes later; ticks never pile up behind a long change).
    pub fn tick(&self) {
        if self.tick_pending.swap(true, Ordering::SeqCst) {
            return;
        }
        let (reply, _) = oneshot::channel();
        if self.tx.try_send(Job { cmd: Command::Tick, reply, queued: std::time::Instant::now() }).is_err() {
            self.tick_pending.store(false, Ordering::SeqCst);
        }
    }

    /// Leaves the fleet budgets' aggregates for the next period to the
    /// owner without waiting (the lease thread never waits for it): in
    /// place of any not yet written, with one [`Command::Lease`] queued for
    /// them. False when the queue is full or the owner gone (that period
    /// keeps the last).
    pub fn lease(&self, writes: Vec<super::LeaseWrite>) -> bool {
        let waiting = self.lease.lock().unwrap_or_else(std::sync::PoisonError::into_inner).replace(writes).is_some();
        if waiting {
            return true;
        }
        let (reply, _) = oneshot::channel();
        let job = Job { cmd: Command::Lease(self.lease.clone()), reply, queued: std::time::Instant::now() };
        if self.tx.try_send(job).is_ok() {
            return true;
        }
        take_lease(&self.lease);
        false
    }

    /// Whether the owner thread is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Asks the owner to leave, ahead of any queued change, and waits at
    /// most `deadline` for it; `None` when it did not answer in time (it
    /// is stuck in a system call: the program stays attached, as after
    /// `--persist`).
    pub async fn shutdown(&self, deadline: Duration) -> Option<Outcome> {
        self.stopping.store(true, Ordering::SeqCst);
        let (reply, rx) = oneshot::channel();
        let ask = async {
            self.tx.send(Job { cmd: Command::Shutdown, reply, queued: std::time::Instant::now() }).await.ok()?;
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
                    mode: if i.join.is_some() { "member" } else { crate::loader::Mode::flag_name(i.mode_flags) },
                    lost_since: i.lost_since,
                    join: i.join.clone(),
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
            sets: super::views::set_rows(&self.sets),
            manual_ban_slots: self.rs.ban_slots(),
            chains: self.file.config().chains.clone(),
            protect: self.rs.protect().nets().to_vec(),
            exit: self.exit.clone(),
            metrics: self.metrics_addr,
        })
    }

    /// Writes what the start changed (rules from `--rate`, the interfaces)
    /// into the config file. A failure is a warning: policing runs from the
    /// command line, the file keeps what it says, and `rule ls` shows the
    /// difference.
    /// `rate_changes`: what `--rate/--burst` changed in the file's rules,
    /// said and audited once written (a tuned default rule is never
    /// rewritten silently).
    pub(super) fn write_start_config(&mut self, names: &[String], rules_changed: bool, rate_changes: &[String]) {
        // Rules the file already holds (no `--rate`) are not written
        // again: only the interfaces then (the [daemon] table alone,
        // `config/splice.rs`); the file's rules stay what they are.
        if !rules_changed {
            if let Err(e) =
                self.file.update(crate::config::Change { rules: None, interfaces: Some(names), chains: None })
            {
                say!("policer: warning: {e}");
            }
            return;
        }
        let rules = self.rs.specs();
        if let Err(e) =
            self.file.update(crate::config::Change { rules: Some(&rules), interfaces: Some(names), chains: None })
        {
            say!("policer: warning: {e}");
            self.rs.set_file_rules(self.file.read().map(|s| s.rules).unwrap_or_default());
        } else {
            self.rs.set_file_rules(rules);
            if !rate_changes.is_empty() {
                let msg = format!(
                    "--rate/--burst changed the rules of {}: {}",
                    self.file.path().display(),
                    rate_changes.join("; ")
                );
                // Said ("change by policer attach: ...") and kept in the
                // audit trail as any change.
                self.audit.record("policer attach", &msg);
            }
        }
    }

    /// `policer ban`: planned in `bans.rs` ([`bans::plan_ban`]), made as a
    /// change of the rules.
    fn ban(&mut self, rc: &RuleConfig, runtime: bool, force: bool, state: bool) -> Result<String> {
        if state {
            return self.state_ban(rc, runtime, force);
        }
        let plan = bans::plan_ban(rc, runtime, force, |k| self.rule_in_force(k).is_some())?;
        self.change(runtime, std::slice::from_ref(&plan.edit))?;
        // A ban of a prefix the state directory kept is the file's now.
        if !runtime && !self.dry() && self.state_bans.contains(&plan.edit.0.net) {
            self.when_written(WhenWritten::ForgetStateBan(plan.edit.0.net));
        }
        self.changed = true;
        if !self.dry() {
            // Said once the ban is in force: in a group, after its write.
            self.when_written(WhenWritten::Say(plan.log_line));
        }
        Ok(plan.message)
    }

    /// `policer ban --state`: a manual ban in force as a runtime one, and
    /// kept in the state directory (`statebans.rs`) for the next start,
    /// not in the config file. Handled alone (not in a group of file
    /// writes): in force in the kernel, then written to its file, undone
    /// in the kernel when that write fails.
    fn state_ban(&mut self, rc: &RuleConfig, runtime: bool, force: bool) -> Result<String> {
        if runtime {
            return Err(Error::Invalid(
                "ban: --state keeps the ban in the state directory, --runtime keeps it nowhere: one or the other; \
                 nothing changed"
                    .into(),
            ));
        }
        let plan = bans::plan_ban(rc, false, force, |k| self.rule_in_force(k).is_some())?;
        let (key, spec) = (&plan.edit.0, plan.edit.1.as_ref());
        if self.in_file(key) {
            return Err(Error::Invalid(format!(
                "ban {}: the config file holds a ban of it; lift that one (`policer unban {}`) to keep the ban in \
                 the state directory instead; nothing changed",
                key.net, key.net
            )));
        }
        let before = self.rule_in_force(key).map(|s| (*s).clone());
        self.change(true, std::slice::from_ref(&plan.edit))?;
        if self.dry() {
            return Ok(plan.message);
        }
        if let Err(e) = self.state_bans.change(spec, &[]) {
            let undone = self.change(true, &[(key.clone(), before)]);
            return Err(Error::Invalid(match undone {
                Ok(()) => format!("{e}; nothing changed"),
                Err(u) => format!("{e}; and undoing the ban in the kernel failed: {u}"),
            }));
        }
        self.changed = true;
        self.when_written(WhenWritten::Say(plan.log_line));
        Ok(format!("{} (kept in {}, not in the config file)", plan.message, self.state_bans.path().display()))
    }

    /// `policer unban PREFIX`: the manual ban of exactly that prefix, and
    /// every automatic ban of a source in it (or of a source prefix that
    /// holds it), planned in `bans.rs` ([`bans::plan_unban`]). Nothing to
    /// lift is an error.
    fn unban(&mut self, prefix: &str, runtime: bool) -> Result<String> {
        let net = crate::prefix::parse_prefix(prefix)?;
        let key = RuleKey::new(net, Default::default(), true);
        let manual = self.rule_in_force(&key).is_some() || (!runtime && self.in_file(&key));
        let now = super::monotonic_ns();
        let store = self.policer.reader().bans()?;
        let plan = bans::plan_unban(net, manual, &store, now, |k| self.lift_pending(k))?;
        let mut parts = Vec::new();
        if let Some(key) = plan.manual {
            self.change(runtime, &[(key, None)])?;
            parts.push(format!("lifted the ban of {net}"));
            // Gone from the state directory too, once lifted.
            if !self.dry() && self.state_bans.contains(&net) {
                self.when_written(WhenWritten::ForgetStateBan(net));
            }
            self.when_written(WhenWritten::Say(format!("policer: the manual ban of {net} was lifted")));
        }
        // With a manual ban in a group, the automatic ones are lifted with
        // it, after the group's write: a write that fails lifts neither.
        let lifted = if self.write_pending() {
            let n = plan.autos.len() as u64;
            self.when_written(WhenWritten::Lift(plan.autos));
            n
        } else {
            self.bans.lift(&mut self.policer, &plan.autos)?
        };
        if lifted > 0 {
            parts.push(format!("lifted {lifted} automatic ban{}", if lifted == 1 { "" } else { "s" }));
        }
        self.changed = true;
        Ok(parts.join("; "))
    }

    /// Does what a change left for after its write ([`WhenWritten`]).
    pub(super) fn done_after(&mut self, a: WhenWritten) {
        match a {
            WhenWritten::Say(line) => say!("{line}"),
            WhenWritten::Lift(autos) => {
                if let Err(e) = self.bans.lift(&mut self.policer, &autos) {
                    say_err!("policer: lifting {} automatic ban(s) failed: {e}", autos.len());
                }
                self.changed = true;
            }
            WhenWritten::ForgetStateBan(net) => self.forget_state_bans(&[net]),
        }
    }

    /// Leaves the bans of `nets` out of the state directory's file (lifted,
    /// ended, or now the config file's). A write that fails is said and
    /// tried again every 10 s (`catch_up_state_bans`, at each tick); a start
    /// before it lands puts the ban back until its end.
    pub(super) fn forget_state_bans(&mut self, nets: &[ipnet::IpNet]) {
        if let Err(e) = self.state_bans.forget(nets) {
            say_err!(
                "policer: {e}; the ban is lifted, and the file is written again every 10 s until it lands (a start \
                 before then puts the ban back until its end)"
            );
        }
    }

    /// The state directory's file of bans, written again when a forget
    /// left it behind; said when it lands.
    fn catch_up_state_bans(&mut self) {
        if let Some(Ok(())) = self.state_bans.catch_up(std::time::Instant::now()) {
            say!("policer: {} written: the bans lifted or ended since are out of it", self.state_bans.path().display());
        }
    }

    /// Whether the last tick changed what the views show (then cleared).
    fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The periodic work: the hooks, expiries, then (once a second)
    /// automatic bans.
    fn tick(&mut self) -> Result<()> {
        self.watch_hooks();
        self.expire();
        self.catch_up_state_bans();
        for m in self.expire_sets(super::unix_now()) {
            self.audit.record("expiry", &m);
        }
        if self.bans.catch_up(&mut self.rs, &mut self.file, self.sets.dir()) {
            self.changed = true;
        }
        self.bans.scan_if_due(&self.rs, &mut self.policer, &self.audit);
        Ok(())
    }

    /// Looks at each interface's XDP hook: the program removed from
    /// outside is said, shown, and dealt with as `--on-detach` says
    /// (`hook.rs`: [`hook::judge`](super::hook::judge)).
    fn watch_hooks(&mut self) {
        use super::hook::{Act, Seen, judge};
        let Ok(fd) = self.policer.prog_fd() else { return };
        for i in 0..self.ifaces.len() {
            let (name, index, flags, lost, join) = {
                let f = &self.ifaces[i];
                (f.name.clone(), f.index, f.mode_flags, f.lost_since.is_some(), f.join.clone())
            };
            // Member mode: the root's slot is policer's hook.
            let held = match &join {
                Some(j) => j.held().map(|id| id.map(|id| (id, 0))).map_err(|_| ()),
                None => crate::netlink::query(index).map(|st| st.map(|st| (st.prog_id, st.mode_flags))).map_err(|_| ()),
            };
            let seen = match held {
                Ok(Some((id, _))) if id == self.program_id => Seen::Ours,
                Ok(Some((id, flags))) => Seen::Other(super::adopt::describe_program(id, flags)),
                Ok(None) => Seen::Empty,
                // Not known this time (the interface went?): next tick.
                Err(()) => continue,
            };
            let lose = |d: &mut Daemon| {
                if d.ifaces[i].lost_since.is_none() {
                    d.ifaces[i].lost_since = Some(crate::duration::unix_ms());
                    d.changed = true;
                }
            };
            match judge(&name, &seen, lost, self.on_detach) {
                Act::Nothing => {}
                Act::Back => {
                    self.ifaces[i].lost_since = None;
                    self.changed = true;
                    say!(
                        "policer: {name}: the policer program is attached again (program {}); policing",
                        self.program_id
                    );
                }
                Act::PutBack { first } => {
                    use crate::loader::Mode;
                    let mode = if flags & crate::netlink::XDP_FLAGS_SKB_MODE != 0 { Mode::Skb } else { Mode::Native };
                    let put = match &join {
                        Some(j) => j.put(fd).map(|()| 0),
                        None => super::adopt::attach_fresh(&name, index, fd, mode),
                    };
                    match put {
                        Ok(_) => {
                            self.ifaces[i].lost_since = None;
                            self.changed = true;
                            say_err!(
                                "policer: {name}: the policer program was removed from outside (`ip link set dev \
                                 {name} xdp off`, another loader, a driver reset); put back (program {}: its \
                                 buckets, bans and counters kept; --on-detach reattach)",
                                self.program_id
                            );
                        }
                        Err(e) => {
                            if first {
                                say_err!(
                                    "policer: {name}: the policer program was removed from outside and cannot be \
                                     put back: {e}; NOT policing {name} (tried again every tenth of a second)"
                                );
                            }
                            lose(self);
                        }
                    }
                }
                Act::Lost { why } => {
                    say_err!("policer: {why}");
                    lose(self);
                }
                Act::Exit { why } => {
                    say_err!("policer: {why}");
                    lose(self);
                    self.exit = Some(why);
                }
            }
        }
    }

    /// Removes rules and manual bans whose expiry has come
    /// ([`bans::plan_expiry`]), in one change (kernel and file; the kernel
    /// only when the file is read-only).
    pub(super) fn expire(&mut self) {
        let edit = bans::plan_expiry(&self.rs, crate::duration::unix_ms());
        if edit.is_empty() {
            return;
        }
        // An end is kept even when the file cannot be written (a full disk):
        // then in the kernel only, and the next write of the file (or the
        // next start, which skips what ended) catches up.
        let r = match self.change(self.file.read_only(), &edit) {
            Err(e) if !self.file.read_only() => {
                say_err!(
                    "policer: writing the config file after an expiry failed ({e}); removed in the kernel only, \
                     the file is written again until it lands"
                );
                let r = self.change(true, &edit);
                if r.is_ok() {
                    self.bans.file_behind();
                }
                r
            }
            r => r,
        };
        match r {
            Ok(()) => {
                self.changed = true;
                let kept: Vec<ipnet::IpNet> = edit
                    .iter()
                    .filter(|(k, _)| k.ban && self.state_bans.contains(&k.net))
                    .map(|(k, _)| k.net)
                    .collect();
                if !kept.is_empty() {
                    self.forget_state_bans(&kept);
                }
                for (k, back) in &edit {
                    if k.ban {
                        self.audit.record("expiry", &format!("the ban of {} ended (expired)", k.net));
                    } else if let Some(b) = back {
                        let m = format!(
                            "the rule for {k} expired; the rule it replaced is back: {}",
                            crate::rules::summary(b)
                        );
                        self.audit.record("expiry", &m);
                    } else {
                        self.audit.record("expiry", &format!("the rule for {k} expired and was removed"));
                    }
                }
            }
            Err(e) => self.bans.expiry_failed(&e),
        }
    }

    /// Re-reads the config file; applies it only if all of it is valid.
    /// What was changed with `--runtime` (rules and bans set, file rules
    /// removed) stays in force over the new file, unless `discard_runtime`
    /// (`policer reload --discard-runtime`): on a read-only ConfigMap a
    /// runtime ban is the only ban there is, and an unrelated edit of the
    /// file must not lift it. The file is read once: what is judged is what
    /// a refusal remembers.
    fn reload(&mut self, discard_runtime: bool, candidate: Option<&std::path::Path>) -> Result<String> {
        let Some(candidate) = candidate else { return self.reload_as(discard_runtime, false) };
        // `reload --dry-run FILE`: the file judged as if it were the config
        // file (its [[set]] files found from the config's directory, where
        // it is to go), before it is moved into place.
        if !self.dry() {
            return Err(Error::Invalid(format!(
                "{} is previewed only (`policer reload --dry-run FILE`); to apply it, move it into place as {} \
                 (the daemon follows the file) or reload; nothing changed",
                candidate.display(),
                self.file.path().display()
            )));
        }
        // As the config file is read: a regular file within the bound, never
        // a FIFO or a device that would hold the owner.
        let bytes = crate::files::read_regular(candidate, crate::files::CONFIG).map_err(|e| {
            let sep = if matches!(e, crate::files::ReadError::Io(_)) { ":" } else { "" };
            Error::Invalid(format!("{}{sep} {e}; nothing changed", candidate.display()))
        })?;
        self.reload_file(Some(bytes), discard_runtime, false, Some(candidate))
    }

    /// [`reload`](Self::reload); `followed`: the follower asks, so the file
    /// must end as a whole file does (`FileSnapshot::check_whole`).
    fn reload_as(&mut self, discard_runtime: bool, followed: bool) -> Result<String> {
        let bytes = self.file.bytes_on_disk();
        let judged = bytes.as_ref().ok().map(|b| crate::config::sha256_hex(b.as_deref().unwrap_or_default()));
        let r = bytes.and_then(|b| self.reload_file(b, discard_runtime, followed, None));
        // A dry run is no reload: `status` keeps the last real one's.
        if !self.dry() {
            self.reload.record(&r, judged);
        }
        r
    }

    /// A name on the config's path was finished (closed after writing,
    /// renamed into place, linked): reloads when the file's bytes differ
    /// from those in force and from a file already refused
    /// ([`reload::Reload::follow_step`]). An empty message: nothing to do
    /// (the daemon's own write, a file put back as it was, no file).
    /// [`Error::ConfigRead`]: the file could not be read, and the follower
    /// tries again.
    fn follow(&mut self) -> Result<String> {
        let now = match self.file.sha256_on_disk() {
            Ok(Some(now)) => now,
            // Gone (between two steps of a swap, or removed): keep running.
            Ok(None) => return Ok(String::new()),
            Err(e) => {
                let r = Err(e);
                self.reload.record(&r, None);
                return r;
            }
        };
        // The file in force, and a set of it read from a MaxMind DB file:
        // the event may be the database's (the follower watches it too), so
        // the sets are read again; a set whose database did not change is
        // left as it is (`Sets::plan_config`), and a database cut short or
        // empty refuses the reload, which changes nothing.
        if now == self.file.sha256() && self.sets.has_config_databases() {
            return self.reload_as(false, true);
        }
        match self.reload.follow_step(&now, &self.file.sha256()) {
            FollowStep::Nothing => Ok(String::new()),
            FollowStep::BackInForce => {
                // Back to the file in force after a refused one.
                self.reload.record(&Ok(String::new()), None);
                Ok(format!("{} is the file in force again", self.file.path().display()))
            }
            FollowStep::Reload => self.reload_as(false, true),
        }
    }

    /// A reload of the file's `bytes`: planned by [`reload::plan`] (the
    /// rules) and `Sets::plan_config` (its sets, every list file
    /// read and checked), then made by `Daemon::apply_with_config_sets`.
    /// `named`: the candidate file they are from (`reload --dry-run
    /// FILE`), which messages name.
    fn reload_file(
        &mut self,
        bytes: Option<Vec<u8>>,
        discard_runtime: bool,
        followed: bool,
        named: Option<&std::path::Path>,
    ) -> Result<String> {
        let snap = self.file.snapshot_named(named, bytes)?;
        let path = named.unwrap_or(self.file.path()).display().to_string();
        let before = self.rs.specs();
        let kept = self.state_bans.specs(crate::duration::unix_ms());
        let plan = reload::plan(&path, &snap.rules, &before, &self.rs.file_specs(), discard_runtime, &kept)?;
        // A file a killed writer cut short: never applied when followed
        // (refused before the sets' files are read, and said as itself).
        snap.check_whole(named.unwrap_or(self.file.path()), followed, plan.drastic.as_deref())?;
        let want = &plan.want;
        // A budget leased from the fleet's Redis needs the leases, which
        // start with the daemon: without them each node would hold the
        // whole budget.
        if self.global.is_none()
            && let Some(spec) = want.values().find(|s| s.global().is_some())
        {
            return Err(Error::Invalid(format!(
                "{path}: {}: global = \"{}\": this daemon was started without a [global] table, and the \
                 fleet's leases start with the daemon (restart it to lease the budget; until then each node would \
                 hold the whole budget); nothing changed",
                spec.net,
                spec.global().unwrap_or_default()
            )));
        }
        if let Some(g) = &self.global
            && let Some(why) = want.values().find_map(|s| s.fleet_refusal(g.period))
        {
            return Err(Error::Invalid(format!("{path}: {why}; nothing changed")));
        }
        // The new file's protected prefixes apply with its rules and sets.
        let protect = crate::protect::Protect::parse(&snap.config.daemon.protect)?;
        // The config's sets: every list file read and checked against the
        // new rules before the kernel is touched (a bad line or a conflict
        // refuses the whole reload). List files are not followed (`policer
        // reload` rereads them); MaxMind DB files are (`Daemon::follow`).
        let config_sets = self.sets.plan_config(self.file.path(), &snap.config.sets, want, &protect)?;
        let changing = config_sets.names();
        self.sets.refuse_set_prefixes_but(want, &changing)?;
        let old_protect = self.rs.protect().clone();
        self.rs.set_protect(protect);
        if let Err(e) = self.sets.refuse_protected_entries(self.rs.protect(), &changing) {
            self.rs.set_protect(old_protect);
            return Err(e);
        }
        let sets_summary = config_sets.summary();
        let counts = plan.diff.counts();
        if self.dry() {
            // The preview judges sources against the file's protect (in
            // force until the preview is planned).
            let r = self.sets.preview_config(&config_sets, &self.rs, want);
            let protect = self.rs.protect().clone();
            self.rs.set_protect(old_protect);
            let (rules, after) = r?;
            self.dry =
                Some(PreviewCapture { rules: Some(rules), protect: Some(protect), ..PreviewCapture::of_sets(after) });
            let changes = plan.changes_text(&before);
            return Ok(format!("reloaded {path}: {} rules ({counts}){changes}{sets_summary}", want.len()));
        }
        if let Err(e) = self.apply_with_config_sets(config_sets, want, &before) {
            self.rs.set_protect(old_protect);
            return Err(e);
        }
        if let Some(what) = &plan.drastic {
            say!("policer: warning: the config reload from {path} did {what}: removed {}", plan.diff.removed_list());
        }
        // A protected prefix the feed's set lists: those entries leave it.
        let feed_note = match self.refilter_feed_set() {
            None => String::new(),
            Some(Ok(msg)) => {
                say!("policer: {msg}");
                format!("; {msg}")
            }
            Some(Err(e)) => {
                say_err!("policer: the feed's set could not leave out the newly protected prefixes: {e}");
                format!("; warning: the feed's set still holds entries inside the protected prefixes: {e}")
            }
        };
        let note = at_next_start(&snap.config, self.file.config());
        // Only now that its rules are in force is the file what we run from.
        let old_chains = self.file.config().chains.clone();
        self.file.accept(snap);
        let mut chain_note = self.empty_gone_chains(&old_chains);
        chain_note.push_str(&self.fill_chains());
        let n = want.len();
        let kept = plan.kept_text();
        let changes = plan.changes_text(&before);
        self.rs.set_file_rules(plan.file);
        Ok(format!("reloaded {path}: {n} rules ({counts}){changes}{sets_summary}{kept}{note}{feed_note}{chain_note}"))
    }

    /// One change of the rules: `edits` (each key once: `Some` sets the
    /// rule, `None` removes it) made to the kernel's rules and, unless
    /// `runtime`, to the file's. All or nothing, in an order that keeps it
    /// so: the new file is staged (a hand edit, a full disk or a read-only
    /// file refuses the change before the kernel is touched), then the
    /// kernel changes, then the file is put in place. The file's text is
    /// edited only where those rules are (`config/splice.rs`).
    pub(super) fn change(&mut self, runtime: bool, edits: &[(RuleKey, Option<RuleSpec>)]) -> Result<()> {
        if !runtime && self.file.read_only() {
            return Err(Error::Invalid(format!(
                "{} is read-only (a ConfigMap or a read-only mount: change the file at its source, \
                 the daemon follows it); nothing changed (`--runtime` applies the change to the kernel only, \
                 not persisted)",
                self.file.path().display()
            )));
        }
        // What to put back if the change fails (last edit of a key first).
        let undo: Vec<(RuleKey, Option<RuleSpec>)> =
            edits.iter().rev().map(|(k, _)| (k.clone(), self.rs.rules().get(k).map(|i| (*i.spec).clone()))).collect();
        self.sets.refuse_set_prefixes_of(edits.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| k))?;
        if !runtime && self.groups.open.is_some() && !self.dry() {
            return self.change_in_group(edits);
        }
        // Planned (and compiled) once, before anything is staged or
        // written: the rule limit, or classes that tie or crowd a frame,
        // refuse the change here. At a cost that grows with the edits, not
        // the rules, where it can (`plan_edits`).
        let plan = self.rs.plan_edits(edits)?;
        let staged = if runtime {
            None
        } else {
            let before = self.rs.file_rules();
            // The file's rules change only where they differ from the edit.
            let file_edits: Vec<(RuleKey, Option<RuleSpec>)> =
                edits.iter().filter(|(k, v)| before.get(k).map(|s| &**s) != v.as_ref()).cloned().collect();
            // A dry run checks what staging checks and writes nothing.
            let pending = if file_edits.is_empty() {
                Ok(None)
            } else if self.dry() {
                self.file.check_stage_rules(&before, &file_edits).map(|()| None)
            } else {
                self.file.stage_rules(&before, &file_edits).map(Some)
            };
            let pending = pending.map_err(|e| {
                if e.is_config_not_written() {
                    Error::Invalid(format!(
                        "{e}; nothing changed (`--runtime` applies the change to the kernel only, not persisted)"
                    ))
                } else {
                    e
                }
            })?;
            pending.map(|p| (p, file_edits))
        };
        if let Some(d) = self.dry.as_mut() {
            d.rules = Some(plan.rules);
            return Ok(());
        }
        if let Err(e) = self.apply_plan(plan) {
            // Back to what was in force (the write stops at the first
            // failure); the staged file is dropped, and so removed.
            return Err(self.undo_edits(&undo, e));
        }
        if let Some((pending, file_edits)) = staged {
            if let Err(e) = self.file.commit(pending) {
                return Err(self.undo_edits(&undo, e));
            }
            self.rs.edit_file_rules(&file_edits);
        }
        Ok(())
    }

    /// A change of a group: judged and planned now, on the rules in force
    /// with the group's changes before it made; made in the file and then
    /// in the kernel with the rest of the group ([`Daemon::end_group`]).
    fn change_in_group(&mut self, edits: &[(RuleKey, Option<RuleSpec>)]) -> Result<()> {
        let before = self.rs.file_rules();
        let file_changes = edits.iter().any(|(k, v)| {
            let now = match self.pending(k) {
                Some(p) => p.as_ref(),
                None => before.get(k).map(|s| &**s),
            };
            now != v.as_ref()
        });
        if file_changes {
            self.group_check().map_err(not_written)?;
        }
        let g = self.groups.open.as_ref().expect("in a group");
        // Judged on the group being written too, its changes taken as
        // made (they reach the kernel before this group's).
        let writing = self.groups.writing.iter().flat_map(|w| w.pending.iter());
        let all: Vec<(RuleKey, Option<RuleSpec>)> =
            writing.chain(g.pending.iter()).map(|(k, v)| (k.clone(), v.clone())).chain(edits.iter().cloned()).collect();
        // The rule limit, or classes that tie or crowd a frame, refuse
        // this change here, and the group's others stand.
        let plan = self.rs.plan_edits(&all)?;
        let made_on = if self.groups.writing.is_some() { None } else { Some(self.rs.generation()) };
        let g = self.groups.open.as_mut().expect("in a group");
        for (k, v) in edits {
            g.pending.insert(k.clone(), v.clone());
        }
        g.plan = Some(plan);
        g.made_on = made_on;
        g.changes += 1;
        g.wrote = true;
        Ok(())
    }

    /// The rule in force for `key` as the changes of the group handled so
    /// far leave it (they reach the kernel after their write).
    pub(super) fn rule_in_force(&self, key: &RuleKey) -> Option<std::sync::Arc<RuleSpec>> {
        match self.pending(key) {
            Some(p) => p.clone().map(std::sync::Arc::new),
            None => self.rs.rules().get(key).map(|i| i.spec.clone()),
        }
    }

    /// Whether the config file holds a rule for `key`, the group's changes
    /// handled so far made.
    pub(super) fn in_file(&self, key: &RuleKey) -> bool {
        match self.pending(key) {
            Some(p) => p.is_some(),
            None => self.rs.file_rules().contains_key(key),
        }
    }

    /// Whether an `unban` of the group handled so far lifts the automatic
    /// ban `k` once the group is written (to a later change, it is lifted).
    pub(super) fn lift_pending(&self, k: &policer_common::BucketKeyV6) -> bool {
        [&self.groups.open, &self.groups.writing]
            .into_iter()
            .flatten()
            .any(|g| g.after.iter().any(|a| matches!(a, WhenWritten::Lift(l) if l.contains(k))))
    }

    /// Whether a rule or ban whose end has come by `now_ms` is one the
    /// open group changes ([`handle_between`]).
    fn ends_pending(&self, now_ms: u64) -> bool {
        let Some(g) = self.groups.open.as_ref() else { return false };
        self.rs.ended(now_ms).iter().any(|k| g.pending.contains_key(k))
    }

    /// What the groups not yet in force (the open one, then the one being
    /// written) leave `key` at; `None`: neither changes it.
    fn pending(&self, key: &RuleKey) -> Option<&Option<RuleSpec>> {
        self.groups
            .open
            .as_ref()
            .and_then(|g| g.pending.get(key))
            .or_else(|| self.groups.writing.as_ref()?.pending.get(key))
    }

    /// Whether the change just handled waits for a group's write.
    pub(super) fn write_pending(&self) -> bool {
        self.groups.open.as_ref().is_some_and(|g| g.wrote)
    }

    /// Does `a` once the change just handled is written: at once outside
    /// a group (or when the change wrote nothing), after the group's write
    /// in a group, and never if that write fails.
    pub(super) fn when_written(&mut self, a: WhenWritten) {
        match self.groups.open.as_mut() {
            Some(g) if g.wrote => g.after.push(a),
            _ => self.done_after(a),
        }
    }

    /// Checks, once per group, what staging the file checks first: the
    /// file as the daemon last wrote it (not edited by hand since).
    fn group_check(&mut self) -> Result<()> {
        if self.groups.open.as_ref().is_some_and(|g| g.checked) {
            return Ok(());
        }
        if self.file.changed_on_disk()? {
            return Err(Error::ConfigChanged { path: self.file.path().to_path_buf() });
        }
        if let Some(g) = self.groups.open.as_mut() {
            g.checked = true;
        }
        Ok(())
    }

    /// Starts a group of changes (`owner.rs`): until [`end_group`], a
    /// change is made in the kernel at once and in the file once for all.
    ///
    /// [`end_group`]: Self::end_group
    pub(super) fn begin_group(&mut self) {
        self.groups.open = Some(Group::default());
    }

    /// Whether the change just handled waits for the group's write (then
    /// cleared for the next).
    pub(super) fn take_group_wrote(&mut self) -> bool {
        self.groups.open.as_mut().is_some_and(|g| std::mem::take(&mut g.wrote))
    }

    /// Writes the group's changes into the file in one atomic write, then
    /// makes them in the kernel, then puts the file in place (the order of
    /// [`Daemon::change`]): a write that fails (a full disk) leaves the
    /// kernel as it was, and the error is every one of the changes'.
    pub(super) fn end_group(&mut self) -> Result<()> {
        let Some(w) = self.begin_write()? else { return Ok(()) };
        if let Some(sync) = self.apply_write(w)? {
            sync.sync();
        }
        Ok(())
    }

    /// The first half of [`end_group`](Self::end_group): the file's new
    /// version staged on a thread of its own (its text made here); the
    /// group is then the one being written, which the changes handled
    /// meanwhile are judged on. `None`: nothing to write or make.
    pub(super) fn begin_write(&mut self) -> Result<Option<Write>> {
        let Some(g) = self.groups.open.take() else { return Ok(None) };
        if let Some(why) = g.failed {
            say_err!("policer: {} change(s) refused: {why}", g.changes);
            return Err(Error::Invalid(why));
        }
        if g.plan.is_none() {
            return Ok(None);
        }
        let edits: Vec<(RuleKey, Option<RuleSpec>)> = g.pending.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        let before = self.rs.file_rules();
        let file_edits: Vec<(RuleKey, Option<RuleSpec>)> =
            edits.iter().filter(|(k, v)| before.get(k).map(|s| &**s) != v.as_ref()).cloned().collect();
        // Staged first: nothing reaches the kernel before the file is written.
        let since = std::time::Instant::now();
        let staging = if file_edits.is_empty() {
            None
        } else {
            match self.file.stage_rules_begin(&before, &file_edits) {
                Ok(s) => Some(s),
                Err(e) => return Err(self.not_staged(g.changes, e)),
            }
        };
        self.groups.writing = Some(g);
        Ok(Some(Write { staging, edits, file_edits, since }))
    }

    /// A group's staging failed: said in the log too, nothing of the group
    /// took effect.
    fn not_staged(&mut self, changes: u64, e: Error) -> Error {
        let e = not_written(e);
        say_err!(
            "policer: writing {changes} change(s) to {} failed ({e}); none of them took effect",
            self.file.path().display()
        );
        self.fail_next(&e);
        e
    }

    /// The second half of [`end_group`](Self::end_group), once `w` is
    /// staged (it waits for that otherwise): the group's changes made in
    /// the kernel (planned again if the rules changed since its plan),
    /// the file put in place, what waited for the write done. What is
    /// left: the directory's sync, before the changes are answered.
    pub(super) fn apply_write(&mut self, w: Write) -> Result<Option<crate::config::DirSync>> {
        let g = self.groups.writing.take().expect("a group being written");
        let staged = match w.staging.map(crate::config::Staging::wait).transpose() {
            Ok(p) => p,
            Err(e) => return Err(self.not_staged(g.changes, e)),
        };
        let mut writing = w.since.elapsed();
        let plan = match (g.plan, g.made_on) {
            (Some(p), Some(made_on)) if made_on == self.rs.generation() => Ok(p),
            _ => self.rs.plan_edits(&w.edits),
        };
        // What to put back if the kernel or the rename fails.
        let undo: Vec<(RuleKey, Option<RuleSpec>)> =
            w.edits.iter().map(|(k, _)| (k.clone(), self.rs.rules().get(k).map(|i| (*i.spec).clone()))).collect();
        // The staged file is dropped, and so removed, on a failure.
        if let Err(e) = plan.and_then(|p| self.apply_plan(p)) {
            say_err!("policer: making {} change(s) in the kernel failed ({e}); none of them took effect", g.changes);
            let e = self.undo_edits(&undo, e);
            self.fail_next(&e);
            return Err(e);
        }
        let mut sync = None;
        if let Some(p) = staged {
            let t1 = std::time::Instant::now();
            let committed = self.file.commit_begin(p);
            writing += t1.elapsed();
            self.reload.wrote(writing);
            match committed {
                Ok(s) => sync = s,
                Err(e) => {
                    let e = not_written(e);
                    say_err!(
                        "policer: writing {} change(s) to {} failed ({e}); they are undone in the kernel",
                        g.changes,
                        self.file.path().display()
                    );
                    let e = self.undo_edits(&undo, e);
                    self.fail_next(&e);
                    return Err(e);
                }
            }
            self.rs.edit_file_rules(&w.file_edits);
            self.reload.group_written(g.changes);
        }
        for a in g.after {
            self.done_after(a);
        }
        Ok(sync)
    }

    /// The group being written failed with `e`: the open group, judged on
    /// its changes, takes effect in none of its own either.
    fn fail_next(&mut self, e: &Error) {
        if let Some(next) = self.groups.open.as_mut().filter(|g| g.made_on.is_none() && g.plan.is_some()) {
            next.failed = Some(format!(
                "the change(s) written just before this one, which it was judged on, failed ({e}); nothing of it \
                 changed"
            ));
        }
    }

    /// Whether the change being handled is a dry run (nothing is written).
    pub(super) fn dry(&self) -> bool {
        self.dry.is_some()
    }

    /// Runs `cmd` as a dry run: the same checks and plan, nothing written
    /// (kernel, config file, state files, audit trail, reload status).
    pub(super) fn preview(&mut self, cmd: Command) -> Outcome {
        let Some(verb) = verb(&cmd) else {
            return Outcome::of(Err(crate::Error::Invalid(
                "--dry-run is for rule set, rule rm, rule import, ban and reload".into(),
            )));
        };
        let changed = self.changed;
        self.dry = Some(PreviewCapture::default());
        let r = match cmd {
            Command::Import(imp) => self.import(*imp, &mut Nothing).map(|(m, _)| m),
            cmd => self.handle(cmd).result.map(|r| r.message().to_string()),
        };
        let capture = self.dry.take().unwrap_or_default();
        self.changed = changed;
        let message = match r {
            Ok(m) => m,
            Err(e) => return Outcome::of(Err(e)),
        };
        let before = World::new(self.rs.rules().clone(), &self.sets, self.rs.protect());
        let rules = capture.rules.unwrap_or_else(|| self.rs.rules().clone());
        let sets = capture.sets.as_ref().unwrap_or(&self.sets);
        let after = World::new(rules, sets, capture.protect.as_ref().unwrap_or(self.rs.protect()));
        let preview = Preview { verb, message, before, after, set_changes: capture.set_changes };
        Outcome::of(Ok(Response::Previewed(Box::new(preview))))
    }

    /// `policer rule import` (and a feed's delta, an import of its set):
    /// planned in `sets.rs` ([`Sets::plan_import`](sets::Sets::plan_import)), then previewed or
    /// written.
    pub(super) fn import(
        &mut self,
        imp: super::sets::Import,
        aside: &mut dyn Aside,
    ) -> Result<(String, crate::control::ImportCounts)> {
        let plan = self.sets.plan_import(imp, &self.rs, &self.policer, self.file.path())?;
        if !self.dry() {
            return self.write_import(plan, aside);
        }
        let (msg, after) = self.sets.preview_import(plan, &self.rs)?;
        self.dry = Some(PreviewCapture::of_sets(after));
        Ok((msg, crate::control::ImportCounts::default()))
    }

    pub(super) fn handle(&mut self, cmd: Command) -> Outcome {
        self.handle_aside(cmd, &mut Nothing)
    }

    /// [`handle`](Self::handle), with what a long import lets the owner
    /// serve meanwhile (`aside`).
    fn handle_aside(&mut self, cmd: Command, aside: &mut dyn Aside) -> Outcome {
        let done = Outcome::done;
        match cmd {
            Command::Ban { rule, runtime, force, state } => done(self.ban(&rule, runtime, force, state)),
            Command::Unban { prefix, runtime } => done(self.unban(&prefix, runtime)),
            Command::Tick => done(self.tick().map(|_| String::new())),
            Command::Lease(slot) => done(self.lease(&take_lease(&slot)).map(|_| String::new())),
            Command::RuleSet { rule, runtime, replace, force } => done(self.rule_set(&rule, runtime, replace, force)),
            Command::RuleRm { rule, runtime } => done(self.rule_rm(&rule, runtime)),
            Command::Reload { discard_runtime, candidate } => done(self.reload(discard_runtime, candidate.as_deref())),
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
            Command::Detach { iface, hand_over, force } => match self.detach_chained(&iface, hand_over, force) {
                Ok((said, true)) => Outcome {
                    result: Ok(Response::Done(format!("{said}; no interface left, the daemon exits"))),
                    exit: true,
                },
                Ok((said, false)) => done(Ok(said)),
                Err(e) => done(Err(e)),
            },
            Command::ChainAdd { chain, slot } => done(self.chain_add(chain, slot)),
            Command::ChainRm { iface, slot } => {
                let r = self
                    .policed(&iface)
                    .and_then(|()| self.not_member(&iface))
                    .and_then(|()| super::chain::rm(&mut self.file, &iface, slot));
                if let Ok(m) = &r {
                    self.audit.record("chain rm", m);
                }
                done(r)
            }
            Command::Import(imp) => match self.import(*imp, aside) {
                Ok((message, c)) => Outcome::of(Ok(Response::Imported { message, counts: Box::new(c) })),
                Err(e) => done(Err(e)),
            },
            Command::SetRm { name } => done(self.set_rm(&name)),
            Command::Shutdown => done(self.finish().map(|m| m.to_string())),
            Command::Preview(cmd) => self.preview(*cmd),
        }
    }

    /// What the classes of shorter prefixes do under `key`'s prefix once
    /// `spec` is its rule (issue 43 point 6): from the rules in force at the
    /// prefix and over it, with `spec` in place of the rule it sets.
    fn inheritance(&self, key: &RuleKey, spec: &crate::rules::RuleSpec) -> crate::resolve::Inheritance {
        use crate::resolve::RuleSource;
        let net = key.net;
        let mut at = Vec::new();
        for len in 0..=net.prefix_len() {
            let Ok(over) = ipnet::IpNet::new(net.addr(), len) else { continue };
            self.rs.rules().at(over.trunc(), &mut at);
        }
        let mut rules: Vec<(ipnet::IpNet, crate::classes::Class, bool)> =
            at.iter().filter(|e| !e.ban && *e.key != *key).map(|e| (e.net, e.class, e.inherit)).collect();
        rules.push((net, spec.class(), spec.inherits()));
        crate::resolve::Inheritance::of(net, &rules)
    }

    /// `policer rule set`: in the kernel, then in the file (unless
    /// `runtime`); if the file cannot be written the kernel change is
    /// undone. The given fields are laid over the rule in force for the
    /// prefix and class, if any (`replace`: the given fields alone); the
    /// reply names every field that changed, old → new.
    /// Writes each global rule's aggregate for the next lease period, its
    /// fill carried over ([`policer_common::Rule::rescale`]), where the
    /// rule at the key still has that slot and names that budget (a rule
    /// changed since the lease thread read the snapshot is left alone).
    pub(super) fn lease(&mut self, writes: &[super::LeaseWrite]) -> Result<()> {
        let now = super::monotonic_ns();
        for w in writes {
            let ours = self
                .rs
                .rules()
                .get(&w.key)
                .is_some_and(|i| i.slot == w.slot && i.spec.global() == Some(w.name.as_str()));
            if !ours {
                continue;
            }
            let tat = match self.policer.total(w.slot)? {
                Some(old) if old.limiter.limit != 0 => w.limiter.rescale(&old.limiter.bucket(old.tat), now),
                _ => w.limiter.empty_tat(now),
            };
            self.policer.set_total(w.slot, Some(&policer_common::class::Total { tat, limiter: w.limiter }))?;
        }
        Ok(())
    }

    pub(super) fn rule_set(&mut self, rc: &RuleConfig, runtime: bool, replace: bool, force: bool) -> Result<String> {
        let key = rc.key()?;
        let given_ttl = rc.ttl.is_some() || rc.expires.is_some();
        let old = self.rule_in_force(&key);
        let mut rc = match &old {
            Some(old) if !replace => crate::rules::merge(old, rc),
            _ => rc.clone(),
        };
        // Judged on the rule as it will be (an existing deny given a rate
        // is still a deny).
        let mut warnings = Vec::new();
        let action = rc.action.unwrap_or(policer_common::bucket::Action::Police);
        if !action.polices() && rc.rate.is_some() {
            warnings.push(format!(
                "--rate (and --burst) ignored: a {action} rule has no bucket (it {} every frame)",
                if action == policer_common::bucket::Action::Deny { "drops" } else { "passes" }
            ));
            (rc.rate, rc.burst) = (None, None);
        }
        let spec = rc.validate()?;
        if let Some(g) = &self.global
            && let Some(why) = spec.fleet_refusal(g.period)
        {
            return Err(Error::Invalid(format!("{why}; nothing changed")));
        }
        if let (Some(name), None) = (spec.global(), &self.global) {
            return Err(Error::Invalid(format!(
                "{}: --global {name}: the config has no [global] table (the Redis the fleet's budgets are leased \
                 from; docs/fleet.md); nothing changed",
                spec.net
            )));
        }
        if spec.action == policer_common::bucket::Action::Deny && spec.class().is_none() && !force {
            crate::rules::refuse_everyone(&spec.net, "a deny of")?;
        }
        if spec.rate.is_some_and(|r| r.is_bytes()) && spec.burst < 1500 {
            warnings.push(format!(
                "a burst of {} bytes is less than one 1500-byte frame: full-size frames are never admitted",
                spec.burst
            ));
        }
        // A temporary change (`--ttl`) of a rule without an end: that rule
        // comes back when it ends, and the config file keeps it (the
        // change is made in the kernel only; issue 43 point 7).
        let back = match &old {
            Some(o) if given_ttl && o.expires.is_none() && spec.expires.is_some() => Some(o.clone()),
            _ => None,
        };
        // Made in the kernel at once, that change would land before the
        // rule's change being written (or grouped), which would then undo
        // it: refused rather, until that change is in force.
        if back.is_some() && self.pending(&key).is_some() {
            return Err(Error::Invalid(format!(
                "{key}: a change of this rule is being written to the config file, and a temporary change (--ttl) \
                 is made on the rule in force; nothing changed: try again once that change is answered"
            )));
        }
        let runtime = runtime || back.is_some();
        self.change(runtime, &[(key.clone(), Some(spec.clone()))])?;
        if let Some(b) = &back
            && !self.dry()
        {
            self.rs.restore_at_end(&key, b.clone());
        }
        let note = match &back {
            Some(b) => format!(
                "; temporary: at its end the rule comes back ({}); the config file keeps that rule, and a \
                 restart before the end brings it back early",
                crate::rules::summary(b)
            ),
            None if runtime => " (runtime only: not written to the config file)".to_string(),
            None => String::new(),
        };
        let what = match &old {
            None => format!("added the rule for {key}: {}", crate::rules::summary(&spec)),
            Some(old) => match crate::rules::changes(old, &spec) {
                c if c.is_empty() => format!("the rule for {key} is unchanged"),
                c => format!("changed the rule for {key}: {}", c.join(", ")),
            },
        };
        let warn: String = warnings.iter().map(|w| format!("; warning: {w}")).collect();
        let classes = self.inheritance(&key, &spec).note();
        Ok(format!("{what}{note}{classes}{warn}"))
    }

    /// `policer rule rm`. Without `runtime` it also takes a prefix the
    /// file has but the kernel no longer does (removed earlier with
    /// `--runtime`), so that removal can be made to stick.
    pub(super) fn rule_rm(&mut self, rule: &RuleConfig, runtime: bool) -> Result<String> {
        let key = rule.key()?;
        let in_file = !runtime && self.in_file(&key);
        if self.rule_in_force(&key).is_none() && !in_file {
            return Err(Error::Invalid(format!("no rule for {key} (see `policer rule ls`)")));
        }
        self.change(runtime, &[(key.clone(), None)])?;
        let note = if runtime { " (runtime only: the config file still has it)" } else { "" };
        Ok(format!("removed the rule for {key}{note}"))
    }

    /// Puts the rules a change edited back (`undo`: each edited key as it
    /// was) after `e`; the error to report.
    pub(super) fn undo_edits(&mut self, undo: &[(RuleKey, Option<RuleSpec>)], e: Error) -> Error {
        match self.rs.plan_edits(undo).and_then(|p| self.apply_plan(p)) {
            Ok(()) => e,
            Err(u) => {
                Error::Invalid(format!("{e}; and putting the rules back failed too: {u} (see `policer rule ls`)"))
            }
        }
    }
}

/// How the owner writes a set's change: the sets (`sets.rs`: `Sets`)
/// plan and record it, the owner sequences the kernel's writes, the
/// slots and the fast path, and serves what may be served meanwhile.
impl Daemon {
    /// Writes an import's plan (`Sets::plan_import`) in one change, all
    /// or nothing: the set's state file staged, the tries written in steps,
    /// the file put in place.
    ///
    /// Its long steps (the state file, the kernel's writes) run beside the
    /// owner, which serves `aside` meanwhile the changes that cannot meet
    /// the set's prefixes ([`Guard`]): a million entries take the kernel
    /// seconds, a `rule set` elsewhere is answered in milliseconds.
    pub(super) fn write_import(
        &mut self,
        plan: sets::ImportPlan,
        aside: &mut dyn Aside,
    ) -> Result<(String, crate::control::ImportCounts)> {
        let fds = self.policer.trie_writer()?;
        let w = self.sets.writing(plan, &mut self.rs)?;
        let guard = w.guard();
        // The state file first (a full disk refuses the import before the
        // kernel is touched), put in place once the kernel took the change.
        // Not written beside the kernel writes: on two CPUs it slows them
        // more than it saves.
        let staged = if w.runtime() {
            None
        } else {
            let (dir, mode) = (self.sets.dir().to_path_buf(), crate::sets::file_mode(self.file.path()));
            match self.beside(aside, &guard, || w.stage(&dir, mode)) {
                Ok(s) => Some(s),
                Err(e) => return Err(w.unstaged(&mut self.rs, e)),
            }
        };
        let t_staged = w.t0.elapsed();
        let r = (|| -> Result<usize> {
            if w.new_slot {
                self.policer.reset_rule_counters(w.next.slot)?;
            }
            if !w.same_rule {
                prepare(&mut self.policer, &w.next.spec4, w.next.slot)?;
            }
            // A set's prefixes are not default rules: the tries decide.
            if !w.next.entries.is_empty() {
                self.fast_path_off()?;
            }
            self.import_transition(fds, w.old.as_ref(), &w.next, aside, &guard)
        })();
        let t_written = w.t0.elapsed();
        let r = r.and_then(|shadowed| staged.map_or(Ok(()), crate::sets::Staged::commit).map(|()| shadowed));
        log::debug!(
            "import of set '{}': checked {:?}, staged {t_staged:?}, written {t_written:?}, committed {:?}",
            w.next.header.name,
            w.checked(),
            w.t0.elapsed()
        );
        let shadowed = match r {
            Ok(n) => n,
            Err(e) => return Err(self.undo_import(fds, e, &w)),
        };
        let answer = w.answer(shadowed);
        // A state file of this name now is the new set's, not an ended
        // one's still to remove.
        if w.next.origin == sets::Origin::Saved {
            self.bans.set_file_back(&w.next.header.name);
        }
        self.sets.put(w.next);
        self.changed = true;
        // The fast path follows the rules and sets now in force (a ban
        // that ended mid-import left it off).
        self.sync_fast_path()?;
        Ok(answer)
    }

    /// Puts a failed import back: the set as it was in the tries, its
    /// limiter, its slot.
    fn undo_import(&mut self, fds: TrieWriter, e: Error, w: &sets::Writing) -> Error {
        let name = w.next.header.name.clone();
        let undo = (|| -> Result<()> {
            self.sets.transition(&self.rs, fds, Some(&w.next), w.old.as_ref())?;
            if let Some(o) = &w.old
                && !w.same_rule
            {
                prepare(&mut self.policer, &o.spec4, o.slot)?;
            }
            Ok(())
        })();
        if w.new_slot {
            self.rs.free_slot(w.next.slot);
        }
        let _ = self.sync_fast_path();
        match undo {
            Ok(()) => Error::Invalid(format!("{e}; nothing imported")),
            Err(u) => Error::Invalid(format!(
                "{e}; and putting set '{name}' back failed too: {u} (see `policer rule ls --set {name}`)"
            )),
        }
    }

    /// `Sets::transition` to `new` for an import, its bulk written in
    /// steps with the ends that came due honoured before each: a million
    /// entries take the kernel seconds, and a ban ends on time meanwhile
    /// (the owner's tick waits for the import; issue 41). Between two steps
    /// the state is whole: the sets in force, and a prefix of the bulk
    /// written with the new set's value.
    ///
    /// Each step runs beside the owner, which serves `aside` meanwhile
    /// what `guard` allows; so do the removals, in steps too (with the
    /// ends that came due honoured before each).
    fn import_transition(
        &mut self,
        fds: TrieWriter,
        old: Option<&SetState>,
        new: &SetState,
        aside: &mut dyn Aside,
        guard: &Guard<'_>,
    ) -> Result<usize> {
        let w = {
            let name = new.header.name.as_str();
            let others: Vec<&SetState> = self.sets.values().filter(|s| s.header.name != name).collect();
            sets::plan_writes(&others, old, Some(new))?
        };
        let values = new.values()?;
        for (i, step) in w.bulk.chunks(sets::IMPORT_STEP).enumerate() {
            self.end_due_mid_import(fds, &w.bulk[..i * sets::IMPORT_STEP], Some(values))?;
            self.beside(aside, guard, || sets::write(fds, step, values))?;
        }
        self.end_due_mid_import(fds, &w.bulk, Some(values))?;
        sets::write_pairs(fds, &w.pairs)?;
        let bans = self.ban_values();
        if !bans.is_empty() {
            let mut touched: Vec<IpNet> = w.bulk.iter().copied().chain(w.pairs.iter().map(|p| p.0)).collect();
            touched.sort_unstable();
            sets::write_pairs(fds, &sets::banned(&touched, &bans, self.rs.protect()))?;
        }
        for (i, step) in w.delete.chunks(sets::IMPORT_STEP).enumerate() {
            self.end_due_mid_import(fds, &w.delete[..i * sets::IMPORT_STEP], None)?;
            let gone = sets::not_rules(&self.rs, step);
            self.beside(aside, guard, || sets::delete(fds, &gone))?;
        }
        self.end_due_mid_import(fds, &w.delete, None)?;
        Ok(w.shadowed)
    }

    /// Runs `work` on a thread of its own while the owner serves `aside`
    /// what `guard` allows (every millisecond); what `work` gave, once
    /// done. Without anything aside ([`Nothing`]), just `work`.
    fn beside<T: Send>(&mut self, aside: &mut dyn Aside, guard: &Guard<'_>, work: impl FnOnce() -> T + Send) -> T {
        if !aside.serves() {
            return work();
        }
        std::thread::scope(|s| {
            let h = s.spawn(work);
            while !h.is_finished() {
                aside.serve(self, guard);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    /// Mid-import: removes the rules and bans whose end has come (as the
    /// tick does). Entries of the import already written (`done`) under a
    /// ban that ended were given back the value of the sets in force
    /// before the import (`Sets::follow_bans`): they take the new set's
    /// value (`values`), or, of the removals (`None`), leave again —
    /// unless another ban still holds them.
    fn end_due_mid_import(&mut self, fds: TrieWriter, done: &[IpNet], values: Option<(Rule, Rule)>) -> Result<()> {
        if self.rs.ended(crate::duration::unix_ms()).is_empty() {
            return Ok(());
        }
        let before = self.ban_values();
        self.expire();
        // The expiry's plan turned the fast path on if only default rules
        // are left, but the set being written is not in `self.sets` yet:
        // back to the tries (the import's end derives it from the sets
        // then in force).
        self.fast_path_off()?;
        let after = self.ban_values();
        let ended: Vec<(IpNet, Rule)> = before.into_iter().filter(|b| !after.contains(b)).collect();
        if ended.is_empty() || done.is_empty() {
            return Ok(());
        }
        let protect = crate::protect::Protect::default();
        let under: Vec<IpNet> = sets::banned(done, &ended, &protect).into_iter().map(|(n, _)| n).collect();
        let still: std::collections::BTreeSet<IpNet> =
            sets::banned(&under, &after, self.rs.protect()).into_iter().map(|(n, _)| n).collect();
        let free: Vec<IpNet> = under.into_iter().filter(|n| !still.contains(n)).collect();
        match values {
            Some(v) => sets::write(fds, &free, v),
            None => sets::delete(fds, &free),
        }
    }

    /// `policer rule rm --set NAME`.
    pub(super) fn set_rm(&mut self, name: &str) -> Result<String> {
        let s = self.sets.removable(name, self.file.path())?;
        self.remove_set(&s)?;
        Ok(format!("removed set '{name}' ({} prefixes)", s.entries.len()))
    }

    /// Takes `s` out (`Sets::remove`); the fast path follows.
    fn remove_set(&mut self, s: &SetState) -> Result<()> {
        self.sets.remove(s, &mut self.rs, &self.policer, &mut self.bans)?;
        self.changed = true;
        self.sync_fast_path()
    }

    /// Removes the sets whose expiry has come (each in one change); the
    /// messages for the log. Called by the tick.
    pub fn expire_sets(&mut self, now_unix: f64) -> Vec<String> {
        let mut out = Vec::new();
        for s in self.sets.due(now_unix) {
            out.push(match self.remove_set(&s) {
                Ok(()) => format!("set '{}' expired: {} prefixes removed", s.header.name, s.entries.len()),
                Err(e) => format!("set '{}' expired, but removing it failed (tried again): {e}", s.header.name),
            });
        }
        out
    }

    /// After `protect` changed: the feed's set without the entries now
    /// inside a protected prefix (`Sets::feed_refilter`), imported in one
    /// change. `None`: nothing to leave out.
    pub(super) fn refilter_feed_set(&mut self) -> Option<Result<String>> {
        let imp = self.sets.feed_refilter(&self.rs)?;
        Some(self.import(imp, &mut Nothing).map(|(msg, _)| msg))
    }

    /// Writes a reload: the sets' removals (entries that go, values that
    /// change), then the rules (`want`), then the sets' additions; all or
    /// nothing (a failure puts sets and rules back). In that order a prefix
    /// that passes from a set to a rule, or back, is never deleted after
    /// it was written.
    pub(super) fn apply_with_config_sets(
        &mut self,
        plan: sets::ConfigSets,
        want: &BTreeMap<RuleKey, RuleSpec>,
        before: &BTreeMap<RuleKey, RuleSpec>,
    ) -> Result<()> {
        let mut w = sets::ConfigWrite::default();
        let r = (|| -> Result<()> {
            self.sets.config_removals(&plan, &mut self.rs, &mut self.policer, &mut w)?;
            self.apply(want)?;
            if self.sets.config_slots(&plan, &mut self.rs, &mut self.policer, &mut w)? {
                self.fast_path_off()?;
            }
            self.sets.config_additions(&self.rs, &self.policer, &mut w)
        })();
        if let Err(e) = r {
            return Err(self.undo_config_sets(w, before, e));
        }
        self.sets.config_done(plan, &mut self.rs);
        self.changed = true;
        self.sync_fast_path()
    }

    /// Puts a failed reload's sets and rules back, last step first: the
    /// additions, the rules (`before`), the removals.
    fn undo_config_sets(&mut self, w: sets::ConfigWrite, before: &BTreeMap<RuleKey, RuleSpec>, e: Error) -> Error {
        let (removals, additions) = w.split();
        let mut failed = Vec::new();
        self.sets.undo_config(additions, &mut self.rs, &mut self.policer, &mut failed);
        if let Err(u) = self.apply(before) {
            failed.push(u.to_string());
        }
        self.sets.undo_config(removals, &mut self.rs, &mut self.policer, &mut failed);
        let _ = self.sync_fast_path();
        if failed.is_empty() {
            Error::Invalid(format!("{e}; nothing changed"))
        } else {
            Error::Invalid(format!(
                "{e}; and putting the rules and sets back failed too: {} (see `policer rule ls`)",
                failed.join("; ")
            ))
        }
    }
}

impl Daemon {
    /// Refused unless this daemon polices `iface`.
    fn policed(&self, iface: &str) -> Result<()> {
        match self.ifaces.iter().any(|i| i.name == iface) {
            true => Ok(()),
            false => Err(Error::Invalid(format!("{iface} is not policed by this daemon"))),
        }
    }

    /// Refuses a change of policer's own chain on an interface where
    /// policer is a member of another root's array (`--join`): that array
    /// is the chain, and its slots are the root's to give.
    fn not_member(&self, iface: &str) -> Result<()> {
        match self.ifaces.iter().find(|i| i.name == iface).and_then(|i| i.join.as_ref()) {
            None => Ok(()),
            Some(j) => Err(Error::Invalid(format!(
                "policer runs in {} on {iface} (member mode, --join): that array is the chain; put programs behind \
                 policer in its slots {} and up with the root's tool (`bpftool map update pinned {} key {} 0 0 0 \
                 value pinned PROG`); nothing changed",
                j.describe(),
                j.slot + 1,
                j.path.display(),
                j.slot + 1
            ))),
        }
    }

    /// The file's `[[chain]]` tables into the empty slots they name (start
    /// and reload; `chain::fill`); what was loaded, each said. Returns
    /// what a reload's answer adds: the slots filled now.
    pub(super) fn fill_chains(&mut self) -> String {
        // A member's chain is the root's array (`not_member`).
        let names: Vec<String> = self.ifaces.iter().filter(|i| i.join.is_none()).map(|i| i.name.clone()).collect();
        let base = self.file.path().parent().map(std::path::Path::to_path_buf).unwrap_or_default();
        let mut filled = Vec::new();
        for line in super::chain::fill(&self.file.config().chains, &names, &base) {
            say!("policer: {line}");
            if !line.starts_with("keeping") {
                filled.push(line);
            }
        }
        filled.iter().map(|l| format!("; {l}")).collect()
    }

    /// At reload: the slots whose `[[chain]]` table the new file no longer
    /// has, emptied and said (`chain::empty_gone`); what the answer adds.
    fn empty_gone_chains(&mut self, old: &[crate::chain::ChainConfig]) -> String {
        let names: Vec<String> = self.ifaces.iter().filter(|i| i.join.is_none()).map(|i| i.name.clone()).collect();
        let mut note = String::new();
        for line in super::chain::empty_gone(old, &self.file.config().chains, &names) {
            say!("policer: {line}");
            self.audit.record("chain rm", &line);
            note.push_str(&format!("; {line}"));
        }
        note
    }

    /// `policer chain add`: into `slot`, else the first free one.
    fn chain_add(&mut self, mut c: crate::chain::ChainConfig, slot: Option<u32>) -> Result<String> {
        self.policed(&c.interface)?;
        self.not_member(&c.interface)?;
        c.slot = match slot {
            Some(s) => crate::chain::check_slot(s)?,
            None => crate::chain::first_free(&c.interface)?,
        };
        let m = super::chain::add(&mut self.file, c)?;
        self.audit.record("chain add", &m);
        Ok(m)
    }

    /// `detach`, with what the chain holds dealt with first
    /// (`chain::before_detach`): refused, handed over, or emptied. True:
    /// no interface is left.
    fn detach_chained(&mut self, iface: &str, hand_over: bool, force: bool) -> Result<(String, bool)> {
        self.policed(iface)?;
        let i = self.ifaces.iter().find(|i| i.name == iface).map(|i| (i.index, i.mode_flags));
        let ours = self.policer.prog_fd()?;
        let replace = |fd: &aya::programs::ProgramFd| -> Result<()> {
            use std::os::fd::{AsFd, AsRawFd};
            let (index, flags) = i.ok_or_else(|| Error::Invalid(format!("{iface} is not policed by this daemon")))?;
            crate::netlink::set(index, fd.as_fd().as_raw_fd(), flags, Some(ours))
                .map_err(|source| Error::Netlink { iface: iface.into(), source })
        };
        // A member's chain is the root's array: its slots are not policer's.
        let member = self.ifaces.iter().find(|i| i.name == iface).and_then(|i| i.join.as_ref().map(|j| j.describe()));
        let (said, handed) = match &member {
            Some(_) => (String::new(), false),
            None => super::chain::before_detach(iface, hand_over, force, replace)?,
        };
        if !said.is_empty() {
            let left: Vec<_> = self.file.config().chains.iter().filter(|c| c.interface != iface).cloned().collect();
            if let Err(e) = self.file.set_chains(&left) {
                log::warn!("{said}, but the config file still has its [[chain]] tables: {e}");
            }
        }
        let index = self.ifaces.iter().find(|i| i.name == iface).map(|i| i.index);
        let last = if handed { self.forget_iface(iface) } else { self.detach(iface)? };
        // Policer's own chain, empty now: its pin goes with policer.
        if member.is_none() {
            // The interface's dispatcher leaves CHAINS (the program polices
            // others still): nothing holds its chain open for it.
            if let (Some(index), false) = (index, last)
                && let Err(e) = self.policer.chain_maps().and_then(|(c, _)| crate::chain::forget_dispatcher(c, index))
            {
                log::warn!("{iface}'s chain dispatcher stays: {e}");
            }
            super::chain::unpin_if_empty(iface);
        }
        let said = match (said.is_empty(), handed) {
            _ if member.is_some() => format!("left {} on {iface} (member mode)", member.unwrap_or_default()),
            (_, true) => said,
            (true, false) => format!("detached from {iface}"),
            (false, false) => format!("{said}; detached from {iface}"),
        };
        self.audit.record("detach", &said);
        Ok((said, last))
    }
}

/// What a reload from `old` to `new` leaves for the next start, for its
/// reply: ` ([daemon] settings, [global] apply at the next start)`, or
/// empty.
fn at_next_start(new: &crate::config::Config, old: &crate::config::Config) -> String {
    let tables: Vec<&str> = [
        (new.daemon.differs_at_start(&old.daemon), "[daemon] settings"),
        (new.crowdsec != old.crowdsec, "[crowdsec]"),
        (new.global != old.global, "[global]"),
    ]
    .into_iter()
    .filter_map(|(differs, name)| differs.then_some(name))
    .collect();
    match tables.as_slice() {
        [] => String::new(),
        [one] if !one.ends_with('s') => format!(" ({one} applies at the next start)"),
        [one] => format!(" ({one} apply at the next start)"),
        [first @ .., last] => format!(" ({} and {last} apply at the next start)", first.join(", ")),
    }
}

/// The verb of a change a dry run may preview.
fn verb(cmd: &Command) -> Option<&'static str> {
    Some(match cmd {
        Command::RuleSet { .. } => "rule set",
        Command::RuleRm { .. } => "rule rm",
        Command::Import(_) => "rule import",
        Command::Ban { .. } => "ban",
        Command::Reload { .. } => "reload",
        _ => return None,
    })
}

/// Starts the owner thread with `daemon`; every change is published on
/// `snapshot`. The thread ends after [`Command::Shutdown`] (or when every
/// [`Owner`] is gone, which also shuts down).
pub fn spawn(mut daemon: Daemon, snapshot: watch::Sender<Arc<Snapshot>>) -> Result<(Owner, thread::JoinHandle<()>)> {
    let (tx, rx) = mpsc::channel::<Job>(QUEUE);
    let stopping = Arc::new(AtomicBool::new(false));
    let stop = stopping.clone();
    let tick_pending = Arc::new(AtomicBool::new(false));
    let pending = tick_pending.clone();
    let handle = thread::Builder::new().name("policer-owner".into()).spawn(move || {
        let mut queue = Queue { rx, later: VecDeque::new() };
        // Memory a group of changes freed goes back to the system at the
        // next tick (within 100 ms), not after each group: a burst of
        // changes does not wait behind it.
        let mut trim = false;
        loop {
            let Some(job) = queue.next() else { break };
            if !matches!(job.cmd, Command::Shutdown) && stop.load(Ordering::SeqCst) {
                refuse_stopping(job);
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
                    match queue.try_next() {
                        Some(j) if j.cmd.writes_rules_to_file() && !stop.load(Ordering::SeqCst) => group.push(j),
                        Some(j) => {
                            queue.later.push_front(j);
                            break;
                        }
                        None => break,
                    }
                }
                run_groups(&mut daemon, group, &mut queue, &snapshot, (&stop, &pending));
                trim = true;
                continue;
            }
            let Job { cmd, reply, queued } = job;
            let last = matches!(cmd, Command::Shutdown);
            let tick = matches!(cmd, Command::Tick);
            // The owner's record of waits is the control requests' (a
            // tick and a followed edit are the daemon's own).
            if !tick && !matches!(cmd, Command::Follow) {
                daemon.reload.waited(queued.elapsed());
            }
            if tick {
                pending.store(false, Ordering::SeqCst);
            }
            // A dry run changes nothing: nothing to publish.
            let quiet = tick || matches!(cmd, Command::Preview(_) | Command::Lease(_));
            let outcome = {
                let mut aside = Serve { queue: &mut queue, snapshot: &snapshot, stop: &stop };
                daemon.handle_aside(cmd, &mut aside)
            };
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
    Ok((Owner { tx, stopping, tick_pending, lease: Default::default() }, handle))
}

/// Where the owner takes its next job: those it put off while an import
/// ran ([`Serve`]), in the order they came, then the channel.
struct Queue {
    rx: mpsc::Receiver<Job>,
    later: VecDeque<Job>,
}

impl Queue {
    fn next(&mut self) -> Option<Job> {
        self.later.pop_front().or_else(|| self.rx.blocking_recv())
    }

    fn try_next(&mut self) -> Option<Job> {
        self.later.pop_front().or_else(|| self.rx.try_recv().ok())
    }
}

fn refuse_stopping(job: Job) {
    let _ = job.reply.send(Outcome::of(Err(Error::ShuttingDown { note: "; nothing changed" })));
}

/// Changes that write the config file, handled as one group (see
/// [`Group`]): each judged and planned in turn, the file written once,
/// then the kernel; the new state published, then each answered.
fn run_group(daemon: &mut Daemon, group: Vec<Job>, snapshot: &watch::Sender<Arc<Snapshot>>) {
    daemon.begin_group();
    let answers: Vec<Answer> = group.into_iter().map(|j| handle_in_group(daemon, j)).collect();
    let written = daemon.end_group();
    snapshot.send_replace(daemon.snapshot());
    answer(answers, &written);
}

/// A change's answer, and whether it waits for its group's write.
type Answer = (Outcome, bool, oneshot::Sender<Outcome>);

/// Handles a change of a group; its answer, sent once the group is written.
fn handle_in_group(daemon: &mut Daemon, job: Job) -> Answer {
    let Job { cmd, reply, queued } = job;
    daemon.reload.waited(queued.elapsed());
    let outcome = daemon.handle(cmd);
    (outcome, daemon.take_group_wrote(), reply)
}

/// Answers a group's changes, `written` being its write's end.
fn answer(answers: Vec<Answer>, written: &Result<()>) {
    for (mut outcome, waited, reply) in answers {
        if waited && let Err(e) = written {
            outcome.result = Err(e.for_each_waiter());
        }
        let _ = reply.send(outcome);
    }
}

/// Groups of changes that write the config file (see [`Group`]), one
/// after another, `first` the first: while a group's write is on its way
/// to the disk (the new version's write and sync, then the directory's
/// sync), the owner takes the changes queued meanwhile into the next
/// group, judged and planned on the changes being written, so that none
/// waits in the queue behind the disk. Each group is made in the kernel
/// once its file is staged and answered once the file is in place.
///
/// What is not such a change ends the taking (the order of the queue is
/// kept): it waits for the write's end, then is handled. A tick, a lease
/// and a followed edit are put aside rather, handled after the write
/// (`handle_between`).
fn run_groups(
    daemon: &mut Daemon,
    first: Vec<Job>,
    queue: &mut Queue,
    snapshot: &watch::Sender<Arc<Snapshot>>,
    (stop, tick_pending): (&AtomicBool, &AtomicBool),
) {
    daemon.begin_group();
    let mut answers: Vec<Answer> = first.into_iter().map(|j| handle_in_group(daemon, j)).collect();
    // Something put aside came back to the queue's front: the next taking
    // takes nothing, so that it is handled right after the next write.
    let mut postponed = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            // The daemon is leaving: a group not yet written is refused
            // whole (none of it is in the kernel or the file), rather than
            // a second write the exit would wait for.
            refuse_group(daemon, answers);
            return;
        }
        let mut next = Vec::new();
        let mut held = Vec::new();
        let written = match daemon.begin_write() {
            Err(e) => Err(e),
            Ok(None) => Ok(()),
            Ok(Some(w)) => {
                daemon.begin_group();
                let mut taking =
                    Taking { queue: &mut *queue, stop, next: &mut next, held: &mut held, blocked: postponed };
                taking.until(daemon, || w.staged());
                match daemon.apply_write(w) {
                    Err(e) => Err(e),
                    Ok(None) => Ok(()),
                    Ok(Some(sync)) => {
                        let spare = sync.clone();
                        match thread::Builder::new().name("policer-dirsync".into()).spawn(move || sync.sync()) {
                            Ok(h) => {
                                taking.until(daemon, || h.is_finished());
                                let _ = h.join();
                            }
                            Err(_) => spare.sync(),
                        }
                        Ok(())
                    }
                }
            }
        };
        snapshot.send_replace(daemon.snapshot());
        answer(std::mem::take(&mut answers), &written);
        if let Err(e) = &written {
            // The next group was judged on this one, which failed: its
            // refusals too ("no rule for X" where X is still in force), not
            // only the changes that waited (`fail_next`).
            for (outcome, waited, _) in &mut next {
                if !*waited && outcome.result.is_err() {
                    outcome.result = Err(e.for_each_waiter());
                }
            }
        }
        // Before the next group's write, what was put aside: a stream of
        // changes must not keep the ticks (expiries, bans, the hook's
        // watch) waiting.
        postponed = handle_between(daemon, held, queue, snapshot, (stop, tick_pending));
        if next.is_empty() {
            // Nothing came meanwhile: the group opened for it goes.
            daemon.groups.open = None;
            return;
        }
        answers = next;
    }
}

/// What the owner takes from its queue while a group's write is on its
/// way: changes of the next group, until one that is not (`blocked`).
struct Taking<'a> {
    queue: &'a mut Queue,
    stop: &'a AtomicBool,
    next: &'a mut Vec<Answer>,
    /// Ticks, leases and followed edits met meanwhile, handled after the
    /// write (`handle_between`).
    held: &'a mut Vec<Job>,
    blocked: bool,
}

/// Handles the ticks, leases and followed edits put aside during a write,
/// once it is answered, the next group (taken meanwhile, not yet written)
/// set aside too: as the owner's loop handles them, that group planned
/// again if they changed the rules. A followed hand edit of the file that
/// the daemon takes up refuses that group if it holds changes: they were
/// judged on the file before the edit, and written now they would be
/// spliced into it (a database's new version only plans it again). A tick goes back
/// to the queue's front when a rule or ban it would end is one that
/// group changes: the change was judged on the rule as it was before its
/// end (a change of a temporary rule keeps its end, and the rule it
/// replaced comes back at that end), so the end comes after it, as if the
/// change had come first; it is handled right after that group's write
/// (true: the next taking takes nothing). Once the daemon is leaving,
/// what was put aside is refused, as the owner's loop refuses it.
fn handle_between(
    daemon: &mut Daemon,
    held: Vec<Job>,
    queue: &mut Queue,
    snapshot: &watch::Sender<Arc<Snapshot>>,
    (stop, ticks): (&AtomicBool, &AtomicBool),
) -> bool {
    if held.is_empty() {
        return false;
    }
    let next_writes = daemon.groups.open.as_ref().is_some_and(|g| g.plan.is_some());
    let ends_pending = next_writes && daemon.ends_pending(crate::duration::unix_ms());
    let (back, held): (Vec<Job>, Vec<Job>) =
        held.into_iter().partition(|j| ends_pending && matches!(j.cmd, Command::Tick));
    let postponed = !back.is_empty();
    for j in back.into_iter().rev() {
        queue.later.push_front(j);
    }
    let mut open = daemon.groups.open.take();
    for job in held {
        if stop.load(Ordering::SeqCst) {
            refuse_stopping(job);
            continue;
        }
        let Job { cmd, reply, .. } = job;
        let tick = matches!(cmd, Command::Tick);
        if tick {
            ticks.store(false, Ordering::SeqCst);
        }
        let quiet = tick || matches!(cmd, Command::Lease(_));
        let file_before = matches!(cmd, Command::Follow).then(|| daemon.file.sha256());
        let outcome = daemon.handle(cmd);
        if let Some(before) = file_before
            && let Some(g) = open.as_mut().filter(|g| g.plan.is_some())
            && daemon.file.sha256() != before
        {
            g.failed = Some(format!(
                "{} changed on disk (edited, and followed) while this change waited to be written; nothing of it \
                 changed",
                daemon.file.path().display()
            ));
        }
        if !quiet || daemon.take_changed() {
            snapshot.send_replace(daemon.snapshot());
        }
        let _ = reply.send(outcome);
    }
    daemon.groups.open = open;
    postponed
}

/// Refuses a group not yet written (the daemon leaving): the changes that
/// wait for its write are told nothing changed; what a change did at once
/// (a `--ttl` in the kernel, lifted automatic bans) is answered as it is.
fn refuse_group(daemon: &mut Daemon, answers: Vec<Answer>) {
    daemon.groups.open = None;
    for (mut outcome, waited, reply) in answers {
        if waited {
            outcome.result = Err(Error::ShuttingDown { note: "; nothing changed" });
        }
        let _ = reply.send(outcome);
    }
}

impl Taking<'_> {
    /// Takes changes into the next group until `done`.
    fn until(&mut self, daemon: &mut Daemon, done: impl Fn() -> bool) {
        while !done() {
            if !self.blocked && self.next.len() < GROUP {
                match self.queue.try_next() {
                    Some(j) if j.cmd.writes_rules_to_file() => {
                        if self.stop.load(Ordering::SeqCst) {
                            refuse_stopping(j);
                        } else {
                            self.next.push(handle_in_group(daemon, j));
                        }
                        continue;
                    }
                    // A tick or a lease does what is due whenever it comes;
                    // a followed edit (the file watcher sees this very write
                    // too) is read after the write (`handle_between`).
                    Some(j) if matches!(j.cmd, Command::Tick | Command::Follow | Command::Lease(_)) => {
                        self.held.push(j);
                        continue;
                    }
                    Some(j) => {
                        self.queue.later.push_front(j);
                        self.blocked = true;
                    }
                    None => {}
                }
            }
            // The disk answers in milliseconds at best: a look at the
            // queue every half of one costs nothing and delays nothing;
            // when nothing more is taken, only the write's end is waited
            // for, and more slowly.
            let taking = !self.blocked && self.next.len() < GROUP;
            thread::sleep(Duration::from_micros(if taking { 500 } else { 2000 }));
        }
    }
}

/// The owner's loop aside an import: the changes queued meanwhile that
/// cannot meet the import are served (answered in milliseconds, not
/// after the import's seconds); the others wait for its end, in order.
struct Serve<'a> {
    queue: &'a mut Queue,
    snapshot: &'a watch::Sender<Arc<Snapshot>>,
    stop: &'a AtomicBool,
}

impl Aside for Serve<'_> {
    fn serve(&mut self, d: &mut Daemon, guard: &Guard<'_>) {
        // What is put off stays bounded as the channel is: past that,
        // requests wait in the channel (and new ones are told "busy").
        while self.queue.later.len() < QUEUE {
            let Ok(job) = self.queue.rx.try_recv() else { return };
            if self.stop.load(Ordering::SeqCst) && !matches!(job.cmd, Command::Shutdown) {
                refuse_stopping(job);
                continue;
            }
            if !apart(&job.cmd, guard) {
                self.queue.later.push_back(job);
                continue;
            }
            if job.cmd.writes_rules_to_file() {
                run_group(d, vec![job], self.snapshot);
            } else {
                let Job { cmd, reply, queued } = job;
                d.reload.waited(queued.elapsed());
                let dry = matches!(cmd, Command::Preview(_));
                let outcome = d.handle(cmd);
                if !dry {
                    self.snapshot.send_replace(d.snapshot());
                }
                let _ = reply.send(outcome);
            }
            // The change's plan may have turned the fast path on (only
            // default rules and the sets in force, not the one being
            // written): the tries decide while the import writes them.
            if guard.tries
                && let Err(e) = d.fast_path_off()
            {
                log::warn!("aside an import: {e}");
            }
        }
    }
}

/// A change that cannot meet an import of `guard`'s prefixes: a rule,
/// ban or unban (or its dry run) whose prefix neither holds nor lies
/// inside one of them. A prefix that does not parse is refused at once by
/// the change itself. Anything else (a reload, another import, a set's
/// removal, a tick: the import honours ends itself) waits.
fn apart(cmd: &Command, guard: &Guard<'_>) -> bool {
    let prefix = match cmd {
        Command::RuleSet { rule, .. } | Command::RuleRm { rule, .. } | Command::Ban { rule, .. } => &rule.prefix,
        Command::Unban { prefix, .. } => prefix,
        Command::Preview(c) => return apart(c, guard),
        _ => return false,
    };
    crate::prefix::parse_prefix(prefix).map_or(true, |net| !guard.meets(net))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn lease_of(slot: u32) -> Vec<super::super::LeaseWrite> {
        let key = crate::rules::RuleKey::new("0.0.0.0/0".parse().unwrap(), Default::default(), false);
        let limiter = policer_common::Rule::packets(100, 10).unwrap();
        vec![super::super::LeaseWrite { key, slot, name: "svc".into(), limiter }]
    }

    /// The lease thread's aggregates never pile up in the owner's queue:
    /// one job waits for the newest, however many periods the owner is
    /// busy; a queue full of other work refuses the lease and keeps none
    /// waiting.
    #[test]
    fn leases_never_pile_up_in_the_queue() {
        let (tx, mut rx) = mpsc::channel::<Job>(4);
        let owner =
            Owner { tx, stopping: Default::default(), tick_pending: Default::default(), lease: Default::default() };
        for slot in 0..1000 {
            assert!(owner.lease(lease_of(slot)));
        }
        let Ok(Job { cmd: Command::Lease(slot), .. }) = rx.try_recv() else { panic!("no lease queued") };
        assert!(rx.try_recv().is_err(), "more than one lease queued");
        assert_eq!(take_lease(&slot).iter().map(|w| w.slot).collect::<Vec<_>>(), [999], "not the newest");
        assert!(take_lease(&slot).is_empty(), "taken twice");
        // Taken: the next period queues one again.
        assert!(owner.lease(lease_of(1000)));
        assert!(matches!(rx.try_recv(), Ok(Job { cmd: Command::Lease(_), .. })));
        take_lease(&owner.lease);
        // A queue full of other work: refused, none left waiting.
        for _ in 0..4 {
            owner.tick_pending.store(false, Ordering::SeqCst);
            owner.tick();
        }
        assert!(!owner.lease(lease_of(1001)));
        assert!(owner.lease.lock().unwrap().is_none());
    }

    /// A reload's reply names each table it read but leaves for the next
    /// start, `[global]` among them (the fleet's leases start with the
    /// daemon).
    #[test]
    fn a_reload_says_which_tables_wait_for_the_next_start() {
        let old = Config::default();
        let mut new = Config::default();
        assert_eq!(super::at_next_start(&new, &old), "");
        new.global = Some(Default::default());
        assert_eq!(super::at_next_start(&new, &old), " ([global] applies at the next start)");
        new.crowdsec = Some(Default::default());
        assert_eq!(super::at_next_start(&new, &old), " ([crowdsec] and [global] apply at the next start)");
        new.daemon.max_rules = Some(7);
        assert_eq!(
            super::at_next_start(&new, &old),
            " ([daemon] settings, [crowdsec] and [global] apply at the next start)"
        );
        new.global = None;
        new.crowdsec = None;
        assert_eq!(super::at_next_start(&new, &old), " ([daemon] settings apply at the next start)");
    }
}
