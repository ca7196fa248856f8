//! `policer attach`: the daemon.
//!
//! Lifecycle (see README, "Lifecycle"):
//! - start ([`start`]): read and validate the config file, take the
//!   per-namespace lock, look at each interface. A policer program already
//!   attached (left by a daemon that exited with `--persist`, crashed, or
//!   was killed) is *adopted* ([`adopt`]): the new program reuses its maps
//!   — rules, buckets, counters — and replaces it atomically
//!   (`XDP_FLAGS_REPLACE`). Any other XDP program is left alone and
//!   attaching fails.
//! - run ([`Daemon::run`]): one owner thread holds the kernel state and
//!   applies changes in order ([`owner`]); the control socket and
//!   `/metrics` serve each connection in its own task with deadlines
//!   ([`crate::serve`]); reads go straight to the maps ([`views`]); this
//!   loop prints counters and handles signals.
//! - exit (SIGINT/SIGTERM): detach, unless `--persist`, in which case the
//!   kernel keeps policing with the last rules until a new daemon adopts
//!   the program or `policer detach` removes it. A killed daemon leaves
//!   the program attached and policing, as with `--persist`.
//!
//! Output: every line goes through [`output`] (`say!`, `say_err!`), which
//! never panics: a closed stdout or terminal never ends the daemon.

// The daemon's lines never go through the macros that panic on a failed write.
#![deny(clippy::print_stdout, clippy::print_stderr)]

#[macro_use]
pub(crate) mod output;
mod adopt;
mod aside;
mod audit;
mod bans;
mod capture;
mod chain;
mod crowdsec;
mod dryrun;
mod fleet;
mod follow;
pub mod hook;
mod offline;
mod owner;
mod plan;
mod reload;
mod ruleset;
mod serve;
mod sets;
mod start;
mod statebans;
mod views;

use std::{
    collections::BTreeMap,
    os::unix::net::UnixListener,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

pub use adopt::{attached_programs, detach_orphan};
pub(crate) use dryrun::{Preview, WINDOW as DRY_RUN_WINDOW, judge_live};
pub use offline::{Offline, OfflineRule, install_offline};
pub use output::init_log;
pub use owner::{Command, Outcome, Owner, Response};
use policer_common::rate::Rate;
pub use serve::{Caps, fit as fit_connection_caps};
pub use sets::{FeedSet, LeftOut, OfflineSet, OfflineSets, SetSource, read_offline};
pub use sets::{Import, read_import};
pub use start::default_rules;
use tokio::{
    signal::unix::{SignalKind, signal},
    sync::watch,
};
pub use views::{Health, Snapshot, Views};

use crate::{
    config::ConfigFile,
    error::{Error, Result},
    loader::{Mode, Policer},
    netlink,
    report::format_line,
    rules::RuleKey,
    rules::RuleSpec,
};

#[derive(Clone, Debug)]
pub struct DaemonArgs {
    /// Interfaces; empty means the config file's `daemon.interfaces`.
    pub ifaces: Vec<String>,
    /// Default rule (0.0.0.0/0 and ::/0), written into the config.
    pub rate: Option<Rate>,
    pub burst: Option<String>,
    pub mode: Option<Mode>,
    pub max_sources: Option<u32>,
    /// Rules the program holds (each with its own counters and limiter).
    pub max_rules: Option<u32>,
    pub interval: f64,
    pub config: PathBuf,
    /// Where the sets' state files live (`DIR/sets/`): writable, unlike a
    /// config that may be read-only (a Kubernetes ConfigMap).
    pub state_dir: PathBuf,
    pub persist: bool,
    /// Serve Prometheus /metrics here (`9100` = 127.0.0.1:9100).
    pub metrics: Option<String>,
    /// What to do when the program is removed from outside.
    pub on_detach: hook::OnDetach,
    /// Member mode (`--join PATH --slot N`, crate::member): policer runs
    /// in slot N of another root's pinned program array, not on the hook.
    pub join: Option<(PathBuf, u32)>,
}

/// A rule as installed in the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed {
    /// Shared with the config file's rules when the file holds it as it
    /// is in force (one copy of a rule, not two).
    pub spec: std::sync::Arc<RuleSpec>,
    /// Changes with every change of the rule (buckets rescale on it).
    pub id: u32,
    /// Counter slot; kept while the prefix has a rule.
    pub slot: u32,
    /// Whether the config file holds the rule as it is in force.
    pub persisted: bool,
}

/// One global rule's aggregate bucket for the next lease period
/// (`fleet.rs` asks, the owner writes: [`Daemon::lease`] in `owner.rs`).
#[derive(Clone, Debug)]
pub struct LeaseWrite {
    pub key: crate::rules::RuleKey,
    pub slot: u32,
    /// The budget it was leased for: the rule must still name it.
    pub name: String,
    pub limiter: policer_common::Rule,
}

/// The rules in force, by key: a persistent map (`imbl`), so that a change
/// of a few rules makes a new map sharing all the rest with the one before
/// (which the views' snapshot may still hold), at a cost that does not
/// grow with the rule count.
pub type Rules = imbl::OrdMap<crate::rules::RuleKey, Installed>;

struct Iface {
    name: String,
    index: u32,
    mode_flags: u32,
    /// Since when (Unix ms) the program is found gone from the hook
    /// (`hook.rs`); none while it polices.
    lost_since: Option<u64>,
    /// Member mode: the root's slot policer runs in instead of the hook.
    join: Option<crate::member::Join>,
}

impl Iface {
    /// Takes policer off the interface: off the hook (netlink, only if the
    /// program there is `fd`), or, in member mode, out of its slot of the
    /// root's array (only if the slot holds program `id`).
    fn take_off(&self, fd: i32, id: u32) -> Result<()> {
        match &self.join {
            Some(j) => j.clear_if(id).map(|_| ()),
            None => netlink::set(self.index, -1, self.mode_flags, Some(fd))
                .map_err(|source| Error::Netlink { iface: self.name.clone(), source }),
        }
    }
}

/// The daemon's state. After [`Daemon::start`] it belongs to the owner
/// thread alone.
pub struct Daemon {
    policer: Policer,
    program_id: u32,
    ifaces: Vec<Iface>,
    /// The rules: the one record of what is in force (`ruleset.rs`).
    rs: ruleset::RuleSet,
    /// The config file, as last read or written.
    file: ConfigFile,
    persist: bool,
    interval: f64,
    socket: PathBuf,
    listener: Option<UnixListener>,
    metrics: Option<std::net::TcpListener>,
    /// Held (and the file removed) for as long as the daemon lives.
    _lock: crate::lockfile::LockFile,
    /// Set once [`Daemon::finish`] ran.
    finished: bool,
    /// How the last reload went.
    reload: reload::Reload,
    /// Whether a tick changed the rules (the snapshot is then published).
    changed: bool,
    /// Automatic bans and what expiries left to catch up (`bans.rs`).
    bans: bans::Bans,
    /// Named sets (`rule import`, `[[set]]`, the feed's), their state
    /// files; their entries are in the tries but not in `compiled`
    /// (`sets.rs`).
    sets: sets::Sets,
    /// Manual bans kept in the state directory, not the config file
    /// (`ban --state`, fail2ban's action: `statebans.rs`).
    state_bans: statebans::StateBans,
    /// The audit trail, shared with the views and the connections.
    audit: audit::Audit,
    /// Where `/metrics` is served (the listener itself goes to the server).
    metrics_addr: Option<std::net::SocketAddr>,
    /// `[crowdsec]` as checked at start (its task starts with the server).
    feed: Option<crate::crowdsec::Settings>,
    /// `[global]` as checked at start: its lease thread starts with the
    /// server (`fleet.rs`); a rule naming a budget needs it.
    global: Option<crate::fleet::Settings>,
    /// Set while a `--dry-run` is handled: the change stops before its
    /// first write and leaves what it planned here (`dryrun.rs`).
    dry: Option<dryrun::PreviewCapture>,
    /// Set while the owner handles a group of changes whose file writes
    /// are made as one, and while such a group's write is on its way
    /// (`owner.rs`, [`Group`](owner::Group)).
    groups: owner::Groups,
    /// What to do when the program is removed from outside (`hook.rs`).
    on_detach: hook::OnDetach,
    /// Why the daemon leaves on its own (`--on-detach exit`): published,
    /// and the event loop exits non-zero with it.
    exit: Option<String>,
}

/// The writes every change ends in (rules, the set entries that follow
/// the bans, the fast path), for the owner's changes and the start.
impl Daemon {
    /// [`RuleSet::sync_fast_path`](ruleset::RuleSet::sync_fast_path) of the
    /// rules and sets in force.
    fn sync_fast_path(&mut self) -> Result<()> {
        let set_entries = self.sets.has_entries();
        self.rs.sync_fast_path(&mut self.policer, set_entries)
    }

    /// Back to the tries ([`RuleSet::fast_path_off`](ruleset::RuleSet::fast_path_off)).
    fn fast_path_off(&mut self) -> Result<()> {
        self.rs.fast_path_off(&mut self.policer)
    }

    /// The manual bans in force: each prefix and the value the tries hold
    /// there.
    fn ban_values(&self) -> Vec<(ipnet::IpNet, policer_common::Rule)> {
        sets::ban_values(&self.rs)
    }

    /// Applies `want` (already validated) to the kernel: plans it, then
    /// writes the plan.
    fn apply(&mut self, want: &BTreeMap<RuleKey, RuleSpec>) -> Result<()> {
        let plan = self.rs.plan(want)?;
        self.apply_plan(plan)
    }

    /// Writes `plan` to the kernel (changed and new prefixes first, removed
    /// ones last, each one atomic for its prefix) and takes it as the rules
    /// in force; set entries under bans that came or went follow.
    fn apply_plan(&mut self, plan: plan::Plan) -> Result<()> {
        if plan.adds_longer_prefix() {
            self.fast_path_off()?;
        }
        // Set entries follow the bans: only when there are sets, and a ban
        // may have changed.
        let bans_may_change = plan.delta.as_ref().is_none_or(|d| d.keys.iter().any(|k| k.ban));
        let bans = if self.sets.is_empty() || !bans_may_change { None } else { Some(self.ban_values()) };
        let r = self
            .write_plan(plan)
            .and_then(|()| bans.map_or(Ok(()), |b| self.sets.follow_bans(&mut self.rs, &self.policer, &b)));
        // Whatever happened, the fast path follows the rules now in force.
        self.sync_fast_path()?;
        r
    }

    /// The one writer of a plan after the start: counters of new slots,
    /// limiters, totals, then the rule maps. On failure the maps are read
    /// back, so that putting the rules back diffs against what they hold.
    fn write_plan(&mut self, plan: plan::Plan) -> Result<()> {
        // The slots a rule in force reads until the rule maps change: those
        // the change rewrites in place, and those of rules it removes that
        // it gives to new ones (at the rule limit). What they hold now is
        // put back if the change fails after them (the rule maps are read
        // back, so the rules in force keep their own limiter, ban
        // parameters, aggregate bucket, SYN settings and counts). A slot
        // taken from the free ones is read by no rule until the rule maps
        // point to it.
        let free: std::collections::HashSet<u32> = plan.taken.iter().copied().collect();
        let held: Vec<u32> =
            plan.writes.iter().filter(|w| !w.fresh || !free.contains(&w.slot)).map(|w| w.slot).collect();
        let saved = self.policer.save_slots(&held)?;
        let mut zeroed = Vec::new();
        let r = (|| -> Result<()> {
            for w in plan.writes.iter().filter(|w| w.fresh) {
                if !free.contains(&w.slot) {
                    zeroed.push((w.slot, self.policer.slot_counters(w.slot)?));
                }
                self.policer.reset_rule_counters(w.slot)?;
            }
            let slots = plan.writes.iter().map(|w| (w.slot, &*plan.rules[&w.key].spec, w.total));
            ruleset::prepare_slots(&mut self.policer, slots, monotonic_ns(), false)?;
            start::hooks::rule_maps_write()?;
            match &plan.delta {
                Some(d) => self.policer.write_rule_prefixes(&d.prefixes),
                None => self.policer.sync_rules_from(self.rs.compiled(), &plan.compiled),
            }
        })();
        if let Err(e) = r {
            if let Err(k) = self.policer.restore_slots(&saved) {
                log::warn!("putting back the slots of {} rules after a failed change: {k}", held.len());
            }
            for (slot, old) in &zeroed {
                if let Err(k) = self.policer.add_back_rule_counters(*slot, old) {
                    log::warn!("putting back the counters of slot {slot} after a failed change: {k}");
                }
            }
            match self.policer.kernel_compiled() {
                Ok(now) => {
                    let now = self.sets.without_entries(now);
                    self.rs.read_back(now);
                }
                Err(k) => log::warn!("reading the rule maps back after a failed change: {k}"),
            }
            return Err(e);
        }
        self.rs.commit(plan);
        Ok(())
    }

    /// Detaches `name`; true when no interface is left.
    /// An interface whose hook is no longer ours (handed over to the
    /// chain's first program): forgotten, and gone from the file's
    /// interfaces. True: none is left.
    fn forget_iface(&mut self, name: &str) -> bool {
        self.ifaces.retain(|i| i.name != name);
        let left: Vec<String> = self.file.config().daemon.interfaces.iter().filter(|n| *n != name).cloned().collect();
        if let Err(e) = self.file.set_interfaces(&left) {
            log::warn!("{name} handed over, but the config file still lists it: {e}");
        }
        self.ifaces.is_empty()
    }

    fn detach(&mut self, name: &str) -> Result<bool> {
        let pos = self
            .ifaces
            .iter()
            .position(|i| i.name == name)
            .ok_or_else(|| Error::Invalid(format!("{name} is not policed by this daemon")))?;
        let fd = self.policer.prog_fd()?;
        let i = &self.ifaces[pos];
        // Removed from outside already (`hook.rs`): nothing to take off
        // the hook (whatever is there now is not ours).
        if i.lost_since.is_none() {
            i.take_off(fd, self.program_id)?;
        }
        self.ifaces.remove(pos);
        let left: Vec<String> = self.file.config().daemon.interfaces.iter().filter(|n| *n != name).cloned().collect();
        if let Err(e) = self.file.set_interfaces(&left) {
            log::warn!("{name} detached, but the config file still lists it: {e}");
        }
        Ok(self.ifaces.is_empty())
    }
}

impl Daemon {
    /// Runs until SIGINT/SIGTERM (or the last interface is detached), then
    /// leaves as configured. Errors on the way still detach (or persist).
    pub fn run(mut self) -> Result<()> {
        // From here on a line never waits for a stream nobody reads.
        output::start();
        // Blocking threads (map reads for stats, top, /metrics) are kept for
        // the daemon's life once made, and bounded: a pool that grows and
        // shrinks with the load would make new threads for ever. The views
        // take them through shared renders and lanes of a few permits each
        // (`serve`), so no storm of one kind holds them all.
        // One malloc arena per thread would grow the daemon's memory as
        // threads come and go; two are plenty for its allocations.
        #[cfg(target_env = "gnu")]
        // SAFETY: mallopt only tunes the allocator, before other threads.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .max_blocking_threads(serve::BLOCKING_THREADS)
            .thread_keep_alive(Duration::from_secs(365 * 24 * 3600))
            .thread_name("policer-io")
            .enable_all()
            .build()?;
        let listener = self.listener.take().expect("bound at start");
        let metrics = self.metrics.take();
        let r = rt.block_on(serve(self, listener, metrics));
        // Connections still open (a client that never reads) are dropped
        // here, not waited for.
        rt.shutdown_timeout(Duration::from_millis(200));
        let (result, owner) = r;
        if let Some(h) = owner {
            let _ = h.join();
        }
        result
    }

    /// Leaves: detaches from every interface, or with `--persist` leaves the
    /// program policing. Runs once.
    fn finish(&mut self) -> Result<String> {
        if self.finished {
            return Ok("already stopped".into());
        }
        self.finished = true;
        // Where the program was removed from outside (`hook.rs`), nothing
        // is detached, and nothing is said to stay.
        let (attached, lost): (Vec<&Iface>, Vec<&Iface>) = self.ifaces.iter().partition(|i| i.lost_since.is_none());
        let names = attached.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ");
        let lost = match lost.len() {
            0 => String::new(),
            _ => format!(
                "; not attached to {} (removed from outside)",
                lost.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
            ),
        };
        if attached.is_empty() {
            return Ok(format!("no interface left; exiting{lost}"));
        }
        if self.persist {
            return Ok(format!(
                "exiting; XDP stays attached on {names} and keeps policing (`policer detach IFACE` removes it){lost}"
            ));
        }
        let kept = self.keep_bans();
        let fd = self.policer.prog_fd()?;
        let mut failed = Vec::new();
        for i in attached {
            match i.take_off(fd, self.program_id) {
                Err(e) => failed.push(format!("{}: cannot detach: {e}", i.name)),
                // Policer's own chain, empty: its pin goes with policer.
                Ok(()) if i.join.is_none() => chain::unpin_if_empty(&i.name),
                Ok(()) => {}
            }
        }
        if failed.is_empty() {
            Ok(format!("detached from {names}{lost}{kept}"))
        } else {
            Err(crate::Error::Invalid(failed.join("; ")))
        }
    }
}

impl Daemon {
    /// Before a plain exit takes the program and its ban store away: the
    /// automatic bans in force (and in their escalation window) written to
    /// the state directory, for the next start ([`bans::KeptBan`]). What
    /// the exit line adds about them.
    fn keep_bans(&self) -> String {
        let store = match self.policer.reader().bans() {
            Ok(s) => s,
            Err(e) => return format!("; the automatic bans could not be read, and are not kept: {e}"),
        };
        let file = bans::kept_bans_file(self.sets.dir());
        if store.is_empty() {
            let _ = std::fs::remove_file(&file);
            return String::new();
        }
        let slots: std::collections::HashMap<u32, String> =
            self.rs.rules().iter().map(|(k, i)| (i.slot, k.to_string())).collect();
        let kept = bans::keep_bans(&store, &slots, monotonic_ns(), crate::duration::unix_ms());
        match bans::write_kept_bans(&file, &kept) {
            Ok(()) => format!("; {} automatic bans kept for the next start ({})", kept.len(), file.display()),
            Err(e) => format!("; the automatic bans could not be kept ({}: {e})", file.display()),
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // A daemon dropped without a shutdown (an error on the way) leaves
        // as a stopped one would.
        if !self.finished
            && let Err(e) = self.finish()
        {
            say_err!("policer: {e}");
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// How long leaving waits for the owner thread.
const SHUTDOWN_DEADLINE: Duration = Duration::from_millis(700);

/// The event loop: hands the daemon to its owner thread, serves, ticks,
/// and on a signal asks the owner to leave.
async fn serve(
    mut d: Daemon,
    listener: UnixListener,
    metrics: Option<std::net::TcpListener>,
) -> (Result<()>, Option<std::thread::JoinHandle<()>>) {
    // The capture maps go to the capture hub, their one writer.
    let capture_maps = d.policer.take_capture();
    let interval = d.interval;
    let reader = d.policer.reader();
    if let Some(filter) = d.policer.seen_filter() {
        spawn_seen_filter(filter);
    }
    let audit = d.audit.clone();
    let tally = d.bans.tally();
    let (snap_tx, snap_rx) = watch::channel(d.snapshot());
    let feed = d.feed.take();
    // Kept by the owner too: `rule set --global` needs the table.
    let global = d.global.clone();
    let persist = d.persist;
    let publish_rx = match feed.as_ref().and_then(|f| f.publish.as_ref()) {
        Some(_) => {
            let (tx, rx) = tokio::sync::mpsc::channel(crowdsec::PUBLISH_QUEUE);
            d.bans.publish_to(tx);
            Some(rx)
        }
        None => None,
    };
    let feeds_dir = crate::sets::feeds_dir_of(d.sets.dir());
    let (owner, handle) = match owner::spawn(d, snap_tx) {
        Ok(x) => x,
        Err(e) => return (Err(e), None),
    };
    let config = PathBuf::from(&snap_rx.borrow().config);
    let views = Arc::new(Views::new(reader, snap_rx, audit, tally));
    let hub = capture::Hub::start(capture_maps);
    views.set_capture(hub.clone());
    if let Some(settings) = feed {
        crowdsec::spawn(crowdsec::Feed {
            settings,
            owner: owner.clone(),
            views: views.clone(),
            dir: feeds_dir,
            publish: publish_rx,
        });
    }
    let leases = global.and_then(|settings| fleet::spawn(settings, owner.clone(), views.clone()));
    follow::start(owner.clone(), &config);
    let r = event_loop(owner.clone(), views, hub, listener, metrics, interval).await;
    // Whatever ended the loop, the owner leaves as configured: ahead of
    // queued changes, and within the second SIGTERM is given.
    match owner.shutdown(SHUTDOWN_DEADLINE).await {
        Some(Outcome { result: Ok(m), .. }) => {
            say!("policer: {}", m.message());
            // Detached (not `--persist`): nothing here admits the fleet's
            // budgets any more, so the node leaves them at once. Otherwise
            // (the program policing on) its registration runs out.
            if let Some(l) = leases.filter(|_| !persist) {
                tokio::task::spawn_blocking(move || l.leave(fleet::LEAVE_WAIT)).await.ok();
            }
        }
        Some(Outcome { result: Err(e), .. }) => say_err!("policer: {e}"),
        None => {
            say_err!(
                "policer: the owner thread did not answer within {} ms; exiting without it \
                 (the program stays attached and policing, as with --persist)",
                SHUTDOWN_DEADLINE.as_millis()
            );
            return (r, None);
        }
    }
    (r, Some(handle))
}

/// Keeps the SYN path's filter of verified sources useful over a long run
/// (`syncookies::SeenFilter`): a look every
/// [`SEEN_CHECK`](crate::syncookies::SEEN_CHECK) on a thread of its own
/// (a rebuild reads up to 262 144 sources: never on the owner's path),
/// each rebuild said, a failure said once until a look succeeds again.
fn spawn_seen_filter(filter: crate::syncookies::SeenFilter) {
    let run = move || {
        let mut failing = false;
        loop {
            std::thread::sleep(crate::syncookies::SEEN_CHECK);
            match filter.refresh() {
                Ok(Some(r)) => {
                    failing = false;
                    let full = |bits: u64| bits as f64 * 100.0 / (f64::from(policer_common::syn::SEEN_WORDS) * 64.0);
                    say!(
                        "policer: SYN cookies: the filter in front of the verified sources was {:.1} % full, much of it \
                         sources the verified set let go; rebuilt from the {} sources verified now ({:.1} % full)",
                        full(r.before),
                        r.sources,
                        full(r.after)
                    );
                }
                Ok(None) => failing = false,
                Err(e) if !failing => {
                    failing = true;
                    log::warn!("SYN cookies: the filter in front of the verified sources could not be rebuilt: {e}");
                }
                Err(_) => {}
            }
        }
    };
    if let Err(e) = std::thread::Builder::new().name("policer-synseen".into()).spawn(run) {
        log::warn!("SYN cookies: no thread to keep the filter of verified sources ({e}): it is never rebuilt");
    }
}

async fn event_loop(
    owner: Owner,
    views: Arc<Views>,
    hub: Arc<capture::Hub>,
    listener: UnixListener,
    metrics: Option<std::net::TcpListener>,
    interval: f64,
) -> Result<()> {
    let (stop_tx, mut stop_rx) = watch::channel(false);
    // The fds open now are the daemon's own (maps, programs, listeners,
    // the config's watch): the connection caps fit beside them.
    let caps = serve::caps(metrics.is_some());
    let ctx = Arc::new(serve::Ctx::new(owner.clone(), views.clone(), hub, stop_tx, caps));
    listener.set_nonblocking(true)?;
    tokio::spawn(serve::control::run(tokio::net::UnixListener::from_std(listener)?, ctx.clone()));
    if let Some(m) = metrics {
        m.set_nonblocking(true)?;
        tokio::spawn(serve::http::run(tokio::net::TcpListener::from_std(m)?, ctx.clone()));
    }
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    // Held back since the start committed (this is the main thread).
    start::unblock_signals();
    let started = Instant::now();
    let period = if interval > 0.0 { interval } else { 3600.0 };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(period));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let counters = |v: &Views| match v.counters() {
        Ok(c) => Some(c),
        Err(e) => {
            say_err!("policer: cannot read the counters: {e}");
            None
        }
    };
    let mut prev = counters(&views).unwrap_or_default();
    let mut prev_at = Instant::now();
    let mut owner_alive = views.subscribe();
    // Expiries and automatic bans: a tick 10 times a second, dropped
    // while the owner is busy (it comes back when it is not).
    let mut expiry = tokio::time::interval(Duration::from_millis(100));
    expiry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = expiry.tick() => owner.tick(),
            r = owner_alive.changed() => if r.is_err() {
                // The owner thread ended without being asked (a panic): its
                // state went with it, and `Daemon`'s drop detached (or left
                // the program policing under --persist). Exit non-zero.
                return Err(crate::Error::Invalid("the owner thread ended unexpectedly; exiting".into()));
            } else if let Some(why) = owner_alive.borrow_and_update().exit.clone() {
                // `--on-detach exit`: the program was removed from outside.
                return Err(crate::Error::Invalid(why));
            },
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = stop_rx.changed() => break,
            _ = sighup.recv() => {
                let o = owner.clone();
                let audit = views.audit().clone();
                tokio::spawn(async move {
                    match o.ask(Command::Reload { discard_runtime: false, candidate: None }).await.result {
                        Ok(r) => audit.record("SIGHUP", r.message()),
                        Err(e) => say_err!("policer: SIGHUP: reload refused, nothing changed: {e}"),
                    }
                });
            }
            _ = tick.tick(), if interval > 0.0 => {
                if let Some(now) = counters(&views) {
                    say!("{}", format_line(started.elapsed(), &now, &prev, prev_at.elapsed().as_secs_f64()));
                    prev = now;
                    prev_at = Instant::now();
                }
            }
        }
    }
    if let Some(last) = counters(&views) {
        say!("{}", format_line(started.elapsed(), &last, &prev, prev_at.elapsed().as_secs_f64()));
    }
    Ok(())
}

/// Now, in Unix seconds.
pub(crate) fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

pub use crate::duration::monotonic_ns;
