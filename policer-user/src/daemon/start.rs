//! Starting the daemon: validate, lock, look at the interfaces, load (or
//! adopt), then, as one transaction, install the rules and attach.
//!
//! A start that fails leaves the kernel as it found it: every change from
//! the first one on is logged in an [`Undo`] before it is made, and put
//! back when the start does not commit (an error, or a panic).
//! - Nothing adopted (fresh maps, which no running program reads): the
//!   rules go in first, then the program is attached (or replaces a
//!   policer of another layout atomically), so its first frame is policed
//!   by the config's rules.
//! - Adopting a running program's maps: the new program replaces the old
//!   one on every interface first, policing with the rules already in the
//!   maps; only once every interface is attached do the config's rules
//!   replace them, each overwritten entry saved first (rules, new-source
//!   limiters, counter slots that are zeroed).
//!
//! The config file is written only after the start committed.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    io::Write,
    os::{
        fd::{AsFd, AsRawFd, OwnedFd},
        unix::{fs::PermissionsExt, net::UnixListener},
    },
    path::Path,
};

use aya::{
    maps::{MapData, PerCpuValues},
    programs::ProgramFd,
};
use policer_common::{
    DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES, MAP_BUCKETS_V4_GEOMETRY, MAP_RULE_COUNTERS, NewSources, RuleCounters,
    SHARED_MAPS, rate::Rate,
};

use super::{
    Daemon, DaemonArgs, Iface,
    adopt::{Existing, Layout, PrivateBpffs, attach_fresh, find, inspect, inspect_slot},
    plan::{Form, HeldRule, Plan},
    ruleset::{RuleSet, Slots},
};
use crate::{
    config::ConfigFile,
    control,
    error::{Error, Result},
    loader::{LoadOptions, Mode, Policer, SharedMaps, if_index, is_root},
    lockfile::LockFile,
    netlink,
    rules::{BurstValue, RuleConfig, RuleKey, RuleSpec},
};

pub(super) mod hooks;

/// Binds the control socket with mode 0600 from the moment it exists (a
/// umask around bind(2); start runs before any other thread, so no one
/// else's file is created under it). A stale socket of a daemon that died
/// is replaced: the per-namespace lock is already ours.
fn bind_private(path: &Path) -> Result<UnixListener> {
    let _ = fs::remove_file(path);
    // SAFETY: umask only changes this process's file-creation mask.
    let old = unsafe { libc::umask(0o177) };
    let r = UnixListener::bind(path);
    // SAFETY: as above, restoring it.
    unsafe { libc::umask(old) };
    let l = r?;
    // Belt and braces: the mode is what we say even under an odd umask.
    fs::set_permissions(path, fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// The default rules `--rate/--burst` stand for.
pub fn default_rules(rate: Rate, burst: &Option<String>) -> Result<Vec<RuleSpec>> {
    let burst = burst.as_ref().map(|b| BurstValue::Text(b.clone()));
    ["0.0.0.0/0", "::/0"]
        .iter()
        .map(|p| {
            RuleConfig {
                prefix: p.to_string(),
                rate: Some(rate.to_string()),
                burst: burst.clone(),
                ..RuleConfig::default()
            }
            .validate()
            .map_err(|e| match (&e, burst.as_ref()) {
                (Error::Invalid(m), Some(BurstValue::Text(b))) if m.starts_with("burst") => {
                    Error::Invalid(format!("invalid --burst '{b}': {}", m.split_once(": ").map_or(m.as_str(), |x| x.1)))
                }
                _ => e,
            })
        })
        .collect()
}

/// What the start is asked to do, resolved from the command line and the
/// config file; nothing is changed yet.
struct StartSettings {
    file: ConfigFile,
    /// Whether the start changes what the file says (the default rules from
    /// `--rate`, or the interfaces): it is rewritten once the start commits.
    changes_file: bool,
    /// Whether the rules it writes differ from the file's (`--rate`).
    changes_rules: bool,
    /// What `--rate/--burst` change in the file's rules, each as a reload
    /// says a change (`0.0.0.0/0: rate 100pps → 200pps`).
    rate_changes: Vec<String>,
    /// The rules to police with.
    specs: BTreeMap<RuleKey, RuleSpec>,
    ifaces: Interfaces,
    max_sources: u32,
    max_rules: u32,
    /// Whether `--max-sources` / `--max-rules` (or the file) asked for a size.
    sized_sources: bool,
    sized_rules: bool,
    metrics_addr: Option<std::net::SocketAddr>,
    layout_version: Option<u32>,
    /// `protect` in [daemon].
    protect: crate::protect::Protect,
    /// `[crowdsec]`, checked (and its key tried against the Local API).
    crowdsec: Option<crate::crowdsec::Settings>,
    /// `[global]`, checked (docs/fleet.md).
    global: Option<crate::fleet::Settings>,
}

/// The interfaces to police.
struct Interfaces {
    /// As given (what the file keeps: `@default-route` stays a token), then
    /// as attached, with their indexes.
    given: Vec<String>,
    names: Vec<String>,
    indexes: Vec<u32>,
    mode: Mode,
    /// Member mode (`--join`): the root's slot, checked.
    join: Option<crate::member::Join>,
}

/// What holds this daemon's place: the lock, and the metrics port.
struct Claim {
    lock: LockFile,
    metrics: Option<std::net::TcpListener>,
}

/// What is on the interfaces now, and the policer program to adopt.
struct Survey {
    existing: Vec<Existing>,
    adopt_from: Option<u32>,
}

/// The program loaded (reusing an adopted program's maps), and a
/// descriptor of every program it replaces.
struct LoadedProgram {
    policer: Policer,
    old_fds: BTreeMap<u32, ProgramFd>,
}

/// The rules planned against what the loaded maps hold.
struct Planned {
    /// What the loaded maps hold (`rs.compiled()`), and the plan from it.
    rs: RuleSet,
    plan: Plan,
    sets: super::sets::StartSets,
    sets_dir: std::path::PathBuf,
    /// The sets copied from beside the config (an upgrade), whose old
    /// files go once the start commits.
    migrated: Vec<String>,
}

impl Daemon {
    /// Everything up to and including attaching; runs before any thread.
    /// On error nothing stays changed: not the interfaces, not the rules,
    /// limiters or counters, not the file (see the module's comment).
    pub fn start(args: &DaemonArgs) -> Result<Daemon> {
        super::serve::raise_nofile();
        // The config is read once: its `[daemon]` table for the early load,
        // the whole of it for the settings.
        let bytes = ConfigFile::read_bytes(&args.config);
        // The chain's pin needs a bpffs at /sys/fs/bpf, mounted before the
        // load (which pins) and before a private mount namespace (adopting).
        if is_root() && crate::chain::ensure_bpffs()? {
            say!(
                "policer: mounted a bpffs at {} (none was mounted), for the chain's pin",
                policer_common::chain::BPFFS
            );
        }
        // The chains' pins before this start: a start that fails removes
        // only the (empty) chains and dispatchers' pins it made itself.
        let pinned_before = crate::chain::pins_now();
        let early = early_load(args, bytes.as_ref().ok().map(Option::as_deref));
        // The interface whose dispatchers' pin the early load makes.
        let early_iface = early.as_ref().and_then(Early::iface);
        // A start that fails leaves no empty chain or dispatchers' pin of
        // its own making behind (a chain holding programs stays; pins that
        // were there before, another daemon's included, stay).
        let unpin = |ifaces: &[String]| {
            ifaces.iter().chain(&early_iface).for_each(|i| crate::chain::unpin_made(i, &pinned_before));
        };
        let ready = (|| -> Result<_> {
            let s = settings(args, bytes?)?;
            let claim = claim(&s)?;
            super::sets::remove_leftovers(&args.config, &crate::sets::sets_dir(&args.state_dir));
            let survey = survey(&s)?;
            Ok((s, claim, survey))
        })();
        let (s, claim, survey) = match ready {
            Ok(r) => r,
            Err(e) => {
                // The early load pins as it loads: done first, then undone.
                if let Some(early) = early {
                    let _ = early.load.join();
                }
                unpin(&[]);
                return Err(e);
            }
        };
        let chained: Vec<String> = if s.ifaces.join.is_none() { s.ifaces.names.clone() } else { Vec::new() };
        // The start's report, in the daemon's voice (`output.rs`).
        let mut out = super::output::Voice::new(super::output::Stream::Out);
        let loaded = load(&s, &survey, early, &mut out).inspect_err(|_| unpin(&chained))?;
        let planned = plan_rules(&loaded.policer, &s, survey.adopt_from.is_some(), args, &mut out)
            .inspect_err(|_| unpin(&chained))?;
        let d =
            Daemon::transaction(args, s, claim, survey, loaded, planned, &mut out).inspect_err(|_| unpin(&chained))?;
        let _ = out.flush();
        Ok(d)
    }

    /// The transaction: from its first kernel change on, every `?` puts
    /// everything back (see the module's comment for the order).
    fn transaction(
        args: &DaemonArgs,
        s: StartSettings,
        claim: Claim,
        survey: Survey,
        loaded: LoadedProgram,
        planned: Planned,
        out: &mut impl Write,
    ) -> Result<Daemon> {
        let LoadedProgram { mut policer, old_fds } = loaded;
        let Planned { rs, plan, sets, sets_dir, migrated } = planned;
        let state_bans = super::statebans::StateBans::read(&sets_dir)?;
        // The last step that can fail before the kernel changes.
        let socket = control::socket_path()?;
        let listener = bind_private(&socket)?;
        let program_id = policer.program_id()?;
        let new_fd = policer.prog_fd()?;
        let shared = survey.adopt_from.is_some();
        let new_prog = policer.prog_fd_owned()?;
        let maps = if shared { Some(policer.shared_maps()?) } else { None };
        let metrics_addr = claim.metrics.as_ref().and_then(|m| m.local_addr().ok());
        let mut d = Daemon {
            program_id,
            policer,
            ifaces: Vec::new(),
            rs,
            file: s.file,
            persist: args.persist,
            interval: args.interval,
            socket,
            listener: Some(listener),
            metrics: claim.metrics,
            _lock: claim.lock,
            // Until the start commits, a failure is undone by `undo` (dropped
            // before `d`, so while the lock is still held), not by leaving
            // as a stopped daemon would.
            finished: true,
            reload: super::reload::Reload::new(),
            changed: false,
            bans: Default::default(),
            audit: Default::default(),
            metrics_addr,
            sets: super::sets::Sets::new(sets_dir, s.crowdsec.as_ref().map(|c| c.set.clone())),
            state_bans,
            dry: None,
            groups: Default::default(),
            feed: s.crowdsec.clone(),
            global: s.global.clone(),
            on_detach: args.on_detach,
            exit: None,
        };
        let mut undo = Undo::new(new_prog, maps)?;
        let replaced = sets.replaced.clone();
        let mut rules = Some((plan, sets));
        let mut expired = Vec::new();
        // Fresh maps, which no running program reads: the rules first, then
        // the bans a plain exit kept. Adopted maps: the old program's SYN
        // settings (carry_syn_slots). Each before the first frame.
        if !shared && let Some((plan, sets)) = rules.take() {
            expired = d.install(&mut undo, plan, sets)?;
            d.restore_kept_bans(out)?;
        } else if let Some(id) = survey.adopt_from {
            d.carry_syn_slots(id, out);
        }
        // One program polices every interface, each with a chain of its
        // own behind it: the arrays and their dispatchers, in place before
        // the program's first frame.
        if s.ifaces.join.is_none() {
            d.dispatch_chains(&s.ifaces, out)?;
        }
        d.attach_all(&s.ifaces, &survey, &old_fds, new_fd, &mut undo, out)?;
        // Adopted maps: the rules once every interface runs the new program.
        if let Some((plan, sets)) = rules.take() {
            expired = d.install(&mut undo, plan, sets)?;
        }
        d.sync_fast_path()?;
        undo.commit()?;
        d.finished = false;
        d.sets.remove_expired(&expired, out);
        // Taken (or an older exit's, under an adopted program): gone.
        let _ = std::fs::remove_file(super::bans::kept_bans_file(d.sets.dir()));
        d.remove_replaced_state_files(&replaced, out);
        d.rs.set_file_rules(s.specs);
        d.remove_legacy_sets_dir(&args.config, &migrated, out);

        // Before saying "policing", so whoever reads the file next sees it.
        if s.changes_file {
            d.write_start_config(&s.ifaces.given, s.changes_rules, &s.rate_changes);
        }
        // Not before: that write takes the rules in force as the file's.
        d.restore_state_bans(out);
        // What reading and planning the rules held for a moment (the
        // file's parse tree, the plan) goes back to the system.
        crate::config::ConfigFile::release_memory();
        // The programs behind policer: the file's [[chain]] tables into
        // the empty slots (an adopted chain keeps its programs).
        d.fill_chains();
        d.announce(args, &s.ifaces.names, &replaced, out);
        Ok(d)
    }

    /// Writes the SYN cookies' settings and SYN budgets of the adopted
    /// program `prog_id` into the new program's own maps, before it is
    /// attached ([`super::adopt::syn_slots`]; the start writes the rules'
    /// own after the attach). Only the new program's maps change: nothing
    /// to undo. A failure is said and the start goes on, as before this
    /// existed: the SYNs of the moment between the attach and the rules
    /// are policed as if the rules had no SYN cookies.
    fn carry_syn_slots(&mut self, prog_id: u32, out: &mut impl Write) {
        let capacity = self.rs.capacity();
        let carried = super::adopt::syn_slots(prog_id).map_err(Error::from).and_then(|(mut conf, mut totals)| {
            conf.retain(|e| e.0 <= capacity);
            totals.retain(|e| e.0 <= capacity);
            if conf.is_empty() { Ok(()) } else { self.policer.set_syn_slots(&conf, &totals) }
        });
        if let Err(e) = carried {
            let _ = writeln!(
                out,
                "policer: warning: the running program's SYN cookie settings were not carried over ({e}): \
                 until its rules are written, the new program polices SYNs without cookies"
            );
        }
    }

    /// Puts the bans the state directory keeps (`statebans.rs`) that have
    /// not ended back in force, as runtime bans over the config's rules,
    /// saying how many; those that ended leave its file. Once the start
    /// has committed: a failure is said, and the daemon polices without
    /// them.
    fn restore_state_bans(&mut self, out: &mut impl Write) {
        let now = crate::duration::unix_ms();
        let edits = self.state_bans.edits(now);
        let file = self.state_bans.path().display().to_string();
        if !edits.is_empty() {
            let _ = match self.change(true, &edits) {
                Ok(()) => writeln!(out, "policer: {} bans kept in {file} back in force", edits.len()),
                Err(e) => {
                    writeln!(out, "policer: warning: the {} bans kept in {file} are not in force: {e}", edits.len())
                }
            };
        }
        if let Err(e) = self.state_bans.drop_ended(now) {
            let _ = writeln!(out, "policer: warning: {e}");
        }
    }

    /// Puts the automatic bans a plain exit kept ([`super::bans::KeptBan`])
    /// into the fresh program's store, saying how many (a file that does
    /// not read is said and left out; it goes once the start commits).
    fn restore_kept_bans(&mut self, out: &mut impl Write) -> Result<()> {
        let file = super::bans::kept_bans_file(self.sets.dir());
        let kept = match super::bans::read_kept_bans(&file) {
            Ok(k) => k,
            Err(e) => {
                let _ = writeln!(
                    out,
                    "policer: warning: the automatic bans kept by the last exit do not read ({e}); not restored"
                );
                return Ok(());
            }
        };
        if kept.is_empty() {
            return Ok(());
        }
        let slots: std::collections::HashMap<String, u32> =
            self.rs.rules().iter().map(|(k, i)| (k.to_string(), i.slot)).collect();
        let (back, left) = super::bans::restore_bans(&kept, &slots, super::monotonic_ns(), crate::duration::unix_ms());
        // A store that takes fewer now (`--max-bans`) or refuses one does
        // not fail the start: what went in is said, and why the rest did not.
        let mut put = 0;
        let mut failed = None;
        for (k, b) in &back {
            match self.policer.put_ban(k, b) {
                Ok(()) => put += 1,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        let left = match left {
            0 => String::new(),
            n => format!(" ({n} ended meanwhile or of a rule no longer in force, left out)"),
        };
        let _ = match failed {
            None => writeln!(out, "policer: {put} automatic bans restored from {}{left}", file.display()),
            Some(e) => writeln!(
                out,
                "policer: warning: {put} of {} automatic bans restored from {}, the rest refused: {e}{left}",
                back.len(),
                file.display()
            ),
        };
        Ok(())
    }

    /// A config set replaced the saved set of its name: its state file
    /// would bring it back at a restart without the [[set]] table.
    fn remove_replaced_state_files(&self, replaced: &[String], out: &mut impl Write) {
        for n in replaced {
            if let Err(e) = crate::sets::remove(self.sets.dir(), n) {
                let _ = writeln!(out, "policer: warning: the saved set '{n}' is replaced, but not its state file: {e}");
            }
        }
    }

    /// Once sets were copied from beside `config` (`migrated`, an
    /// upgrade), removes their old place, saying so.
    fn remove_legacy_sets_dir(&self, config: &Path, migrated: &[String], out: &mut impl Write) {
        if !migrated.is_empty() {
            let legacy = crate::sets::legacy_dir(config);
            let _ = match crate::sets::remove_legacy(&legacy, migrated) {
                Ok(()) => writeln!(out, "policer: removed {}, the sets' old place", legacy.display()),
                Err(e) => writeln!(
                    out,
                    "policer: {} is no longer read (its sets are in {} now) and could not be removed: {e}",
                    legacy.display(),
                    self.sets.dir().display()
                ),
            };
        }
    }

    /// Says that the daemon polices (on `names`), and where it serves
    /// metrics; `replaced`: the saved sets the config's replace.
    fn announce(&self, args: &DaemonArgs, names: &[String], replaced: &[String], out: &mut impl Write) {
        if let Some(m) = &self.metrics
            && let Ok(a) = m.local_addr()
        {
            let _ = writeln!(out, "policer: serving Prometheus metrics on http://{a}/metrics");
        }
        let _ = writeln!(
            out,
            "policer: policing on {} with {} rules from {}{}{}; {}",
            names.join(", "),
            self.rs.rules().len(),
            args.config.display(),
            self.beyond_defaults(),
            replaced
                .iter()
                .map(|n| format!("; the config's set '{n}' replaces the saved set of that name"))
                .collect::<String>(),
            if args.persist { "exiting leaves it attached and policing" } else { "Ctrl-C detaches" }
        );
    }

    /// Each interface's chain and its dispatcher (`chain::dispatch_all`),
    /// said.
    fn dispatch_chains(&mut self, ifaces: &Interfaces, out: &mut impl Write) -> Result<()> {
        let named: Vec<(String, u32)> = ifaces.names.iter().cloned().zip(ifaces.indexes.iter().copied()).collect();
        let (chains, counters) = self.policer.chain_maps()?;
        for line in crate::chain::dispatch_all(&named, chains, counters)? {
            let _ = writeln!(out, "{line}");
        }
        Ok(())
    }

    /// Attaches the new program to every interface: replacing a policer
    /// program atomically (ours or of another layout), or fresh.
    fn attach_all(
        &mut self,
        ifaces: &Interfaces,
        survey: &Survey,
        old_fds: &BTreeMap<u32, ProgramFd>,
        new_fd: i32,
        undo: &mut Undo,
        out: &mut impl Write,
    ) -> Result<()> {
        if let (Some(j), [name], [index], [e]) =
            (&ifaces.join, ifaces.names.as_slice(), ifaces.indexes.as_slice(), survey.existing.as_slice())
        {
            return self.join_slot(j, name, *index, e, old_fds, new_fd, undo, out);
        }
        let config = self.file.path().to_path_buf();
        for ((name, &index), e) in ifaces.names.iter().zip(&ifaces.indexes).zip(&survey.existing) {
            match e {
                Existing::Ours { prog_id, mode_flags } | Existing::OtherLayout { prog_id, mode_flags, .. } => {
                    if let Existing::OtherLayout { layout, .. } = e {
                        let _ = writeln!(
                            out,
                            "policer: replacing policer program {prog_id} of {} on {name}: buckets start empty \
                             and counters at zero, the rules come from {}",
                            layout.describe(),
                            config.display()
                        );
                    }
                    // The undo log's own descriptor of the old program, taken
                    // before the change, so that recording it cannot fail.
                    let old = old_fds[prog_id].as_fd().try_clone_to_owned()?;
                    netlink::set(index, new_fd, *mode_flags, Some(old.as_raw_fd()))
                        .map_err(|source| Error::Netlink { iface: name.clone(), source })?;
                    let _ = writeln!(
                        out,
                        "policer: replaced program {prog_id} on {name} ({} mode)",
                        Mode::flag_name(*mode_flags)
                    );
                    self.ifaces.push(Iface {
                        name: name.clone(),
                        index,
                        mode_flags: *mode_flags,
                        lost_since: None,
                        join: None,
                    });
                    undo.attached(name, index, *mode_flags, Some((*prog_id, old)))?;
                }
                Existing::None => {
                    let flags = attach_fresh(name, index, new_fd, ifaces.mode)?;
                    let _ = writeln!(out, "policer: attached to {name} ({} mode)", Mode::flag_name(flags));
                    self.ifaces.push(Iface {
                        name: name.clone(),
                        index,
                        mode_flags: flags,
                        lost_since: None,
                        join: None,
                    });
                    undo.attached(name, index, flags, None)?;
                }
            }
        }
        Ok(())
    }

    /// Member mode (`--join`): the new program into the root's slot,
    /// replacing a policer program there (adopted, or of another layout)
    /// in one step, or into the empty slot. The hook is the root's.
    #[expect(clippy::too_many_arguments, reason = "attach_all's own arguments, for its member case")]
    fn join_slot(
        &mut self,
        j: &crate::member::Join,
        name: &str,
        index: u32,
        e: &Existing,
        old_fds: &BTreeMap<u32, ProgramFd>,
        new_fd: i32,
        undo: &mut Undo,
        out: &mut impl Write,
    ) -> Result<()> {
        let old = match e {
            Existing::Ours { prog_id, .. } | Existing::OtherLayout { prog_id, .. } => {
                if let Existing::OtherLayout { layout, .. } = e {
                    let _ = writeln!(
                        out,
                        "policer: replacing policer program {prog_id} of {} in {}: buckets start empty and \
                         counters at zero",
                        layout.describe(),
                        j.describe()
                    );
                }
                Some((*prog_id, old_fds[prog_id].as_fd().try_clone_to_owned()?))
            }
            Existing::None => None,
        };
        j.put(new_fd)?;
        let _ = match &old {
            Some((id, _)) => writeln!(out, "policer: replaced program {id} in {} ({name})", j.describe()),
            None => writeln!(
                out,
                "policer: joined {} on {name} (member mode: the root owns the hook and hands frames to policer; \
                 policer hands what it passes to the slots behind its own)",
                j.describe()
            ),
        };
        self.ifaces.push(Iface { name: name.into(), index, mode_flags: 0, lost_since: None, join: Some(j.clone()) });
        undo.push(StartStep::Joined { join: j.clone(), new_id: self.program_id, old })
    }

    /// Writes the planned rules (each new or changed rule's limiter, total
    /// and counter slot, then the rule maps: see `Policer::sync_rules`, new
    /// entries first, removed ones last, so no frame falls into a gap
    /// between a rule and its replacement), takes them as the rules in
    /// force, then installs the named sets (returning those that expired
    /// while the daemon was down). With adopted maps, what is overwritten
    /// is saved in `undo` first.
    fn install(&mut self, undo: &mut Undo, plan: Plan, sets: super::sets::StartSets) -> Result<Vec<String>> {
        // What the maps hold now: the loaded program's (its sets' entries aside).
        let (p, have) = (&mut self.policer, self.rs.compiled());
        for w in &plan.writes {
            // A fresh program's counters are zero; an adopted one's slot may
            // hold a removed rule's counts.
            if w.fresh && undo.maps.is_some() {
                let old = undo.save_rule_counters(w.slot)?;
                p.reset_rule_counters(w.slot)?;
                // Recorded once zeroed: putting it back adds what was counted
                // since (see `rollback`), which must not count `old` twice.
                if let Some(old) = old {
                    undo.zeroed_rule_counters(w.slot, old)?;
                }
            }
            undo.new_sources(w.slot)?;
            undo.total(w.slot)?;
        }
        // Every slot's limiter, ban parameters and aggregate bucket, in a
        // few batch calls (what they held is in `undo`).
        let slots = plan.writes.iter().map(|w| (w.slot, &*plan.rules[&w.key].spec, true));
        if undo.maps.is_none() {
            // Fresh maps, which no program reads yet: no order between the
            // slots and the rule maps to keep, so the tries are written on
            // a thread of their own while the slots are (a 1 000 000-rule
            // start: about 2 s each, one after the other before).
            let (fds, compiled) = (p.rule_fds()?, &plan.compiled);
            std::thread::scope(|s| {
                let tries = std::thread::Builder::new()
                    .name("policer-tries".into())
                    .spawn_scoped(s, || crate::loader::sync_maps(&fds, have, compiled));
                let slots = super::ruleset::prepare_slots(p, slots, super::monotonic_ns(), true);
                let tries = match tries {
                    Ok(t) => t
                        .join()
                        .unwrap_or_else(|_| Err(Error::Invalid("the thread writing the rule tries panicked".into()))),
                    // No thread to be had (a process at its limit): the
                    // tries are written here, after the slots, as before.
                    Err(_) if slots.is_ok() => crate::loader::sync_maps(&fds, have, compiled),
                    Err(_) => Ok(()),
                };
                slots.and(tries)
            })?;
        } else {
            super::ruleset::prepare_slots(p, slots, super::monotonic_ns(), false)?;
            undo.rules(have, &plan.compiled)?;
            p.sync_rules_from(have, &plan.compiled)?;
        }
        self.rs.commit(plan);
        self.sets.install(sets, &mut self.rs, &mut self.policer, undo)
    }
}

impl Daemon {
    /// What is in force besides the default rules (`0.0.0.0/0`, `::/0`),
    /// for the start line: ` (beyond the defaults: rules 2 police, 1 allow;
    /// 3 bans; sets feed, drop)`; empty when nothing is.
    fn beyond_defaults(&self) -> String {
        let mut per_action: BTreeMap<String, usize> = BTreeMap::new();
        let mut bans = 0;
        for (k, i) in self.rs.rules() {
            if k.ban {
                bans += 1;
            } else if k.net.prefix_len() != 0 || !k.class().is_none() {
                *per_action.entry(i.spec.action.to_string()).or_default() += 1;
            }
        }
        let mut parts = Vec::new();
        if !per_action.is_empty() {
            let a: Vec<String> = per_action.iter().map(|(a, n)| format!("{n} {a}")).collect();
            parts.push(format!("rules {}", a.join(", ")));
        }
        if bans > 0 {
            parts.push(format!("{bans} ban{}", if bans == 1 { "" } else { "s" }));
        }
        if !self.sets.is_empty() {
            let names: Vec<String> = self
                .sets
                .iter()
                .map(|(n, s)| if s.origin == super::sets::Origin::Config { format!("{n} (config)") } else { n.clone() })
                .collect();
            parts.push(format!("sets {}", names.join(", ")));
        }
        let protect = self.rs.protect().nets();
        if !protect.is_empty() {
            let p: Vec<String> = protect.iter().map(|n| n.to_string()).collect();
            parts.push(format!("protected {}", p.join(", ")));
        }
        if parts.is_empty() { String::new() } else { format!(" (beyond the defaults: {})", parts.join("; ")) }
    }
}

/// Resolves the settings: the config file and its rules, `--rate`, the
/// interfaces, sizes and limits. Reads files and interface names only.
fn settings(args: &DaemonArgs, bytes: Option<Vec<u8>>) -> Result<StartSettings> {
    let (file, mut specs) = ConfigFile::open_from(&args.config, bytes)?;
    // What reading the file freed (in the reading threads' heaps too) goes
    // back before the plan's peak (a 1 000 000-rule file: a GiB in all).
    ConfigFile::release_memory();
    // Rules and bans that expired while no daemon ran stay expired (the
    // next write of the file drops them).
    super::ruleset::drop_expired(&mut specs);
    let cfg = file.config();
    let rate_changes = rate_changes(args, &mut specs)?;
    if specs.is_empty() {
        return Err(Error::Invalid(format!(
            "nothing to police: give --rate (and --burst), or rules in {}",
            args.config.display()
        )));
    }
    let ifaces = interfaces(args, cfg)?;
    let max_sources = args.max_sources.or(cfg.daemon.max_sources).unwrap_or(DEFAULT_MAX_SOURCES);
    let max_rules = args.max_rules.or(cfg.daemon.max_rules).unwrap_or(DEFAULT_MAX_RULES);
    if specs.len() > max_rules as usize {
        return Err(Error::Invalid(format!(
            "{} rules, more than the limit of {max_rules}: raise --max-rules (or max_rules in [daemon])",
            specs.len()
        )));
    }
    // What the operator gives is checked (an adopted program keeps its own
    // size, whatever its build allowed): the bound, and this machine's
    // memory.
    let what = if args.max_sources.is_some() { "--max-sources" } else { "daemon.max_sources" };
    if (args.max_sources.is_some() || cfg.daemon.max_sources.is_some())
        && let Some(warning) = crate::loader::check_sources_here(max_sources, what).map_err(Error::Invalid)?
    {
        say!("policer: {warning}");
    }
    if !(args.interval == 0.0 || (0.05..=3600.0).contains(&args.interval)) {
        return Err(Error::Invalid("--interval must be 0 (off) or 0.05 to 3600 seconds".into()));
    }
    let metrics_addr = args.metrics.as_deref().map(crate::metrics::parse_addr).transpose()?;
    let layout_version = hooks::layout_version()?;
    let sized_sources = args.max_sources.is_some() || cfg.daemon.max_sources.is_some();
    let sized_rules = args.max_rules.is_some() || cfg.daemon.max_rules.is_some();
    let changes_file = args.rate.is_some() || cfg.daemon.interfaces != ifaces.given;
    let protect = crate::protect::Protect::parse(&cfg.daemon.protect)?;
    let crowdsec = crowdsec_settings(args, cfg)?;
    let base = args.config.parent().unwrap_or(std::path::Path::new("/"));
    let global = cfg.global.as_ref().map(|g| g.settings(base)).transpose()?;
    Ok(StartSettings {
        file,
        changes_file,
        changes_rules: args.rate.is_some(),
        rate_changes,
        specs,
        ifaces,
        max_sources,
        max_rules,
        sized_sources,
        sized_rules,
        metrics_addr,
        layout_version,
        protect,
        crowdsec,
        global,
    })
}

/// Puts the default rules of `--rate/--burst` in `specs`; what they change
/// in the file's rules (issue 43, point 9): said and audited once the
/// start has written them.
fn rate_changes(args: &DaemonArgs, specs: &mut BTreeMap<RuleKey, RuleSpec>) -> Result<Vec<String>> {
    let mut rate_changes = Vec::new();
    if let Some(rate) = args.rate {
        for s in default_rules(rate, &args.burst)? {
            let k = s.key();
            match specs.get(&k) {
                None => rate_changes.push(format!("+{k} ({})", crate::rules::summary(&s))),
                Some(old) if *old != s => {
                    rate_changes.push(format!("{k}: {}", crate::rules::changes(old, &s).join(", ")))
                }
                Some(_) => {}
            }
            specs.insert(k, s);
        }
    } else if args.burst.is_some() {
        return Err(Error::Invalid("--burst needs --rate".into()));
    }
    Ok(rate_changes)
}

/// The interfaces to police (the command line's, or the file's), each
/// resolved to its name and index once, and the attach mode.
fn interfaces(args: &DaemonArgs, cfg: &crate::config::Config) -> Result<Interfaces> {
    let given = if args.ifaces.is_empty() { cfg.daemon.interfaces.clone() } else { args.ifaces.clone() };
    if given.is_empty() {
        return Err(Error::Invalid(format!("no interface given, and none in {}", args.config.display())));
    }
    let names = netlink::resolve_interfaces(&given)?;
    let mut seen = std::collections::HashSet::new();
    let mut indexes = Vec::new();
    for n in &names {
        if !seen.insert(n) {
            return Err(Error::DuplicateInterface(n.clone()));
        }
        indexes.push(if_index(n)?);
    }
    let mode = args.mode.or(cfg.daemon.mode).unwrap_or(Mode::Auto);
    let join = match &args.join {
        Some((path, slot)) => {
            if names.len() != 1 {
                return Err(Error::Invalid(format!(
                    "--join runs policer in one slot of one root: name one interface (not {})",
                    names.join(", ")
                )));
            }
            Some(crate::member::Join::open(path, *slot)?)
        }
        None => None,
    };
    Ok(Interfaces { given, names, indexes, mode, join })
}

/// `[crowdsec]`, checked, its warnings said (and its key tried against the
/// Local API); none without the table.
fn crowdsec_settings(args: &DaemonArgs, cfg: &crate::config::Config) -> Result<Option<crate::crowdsec::Settings>> {
    let Some(c) = &cfg.crowdsec else { return Ok(None) };
    let base = args.config.parent().unwrap_or(std::path::Path::new("/"));
    let mut s = c.settings(base)?;
    // Country and AS decisions stand for the networks of these databases.
    let loaded = s.load_mmdb();
    for w in s.warnings.iter().chain(&loaded) {
        say_err!("policer: warning: {w}");
    }
    if let Some(warning) = super::crowdsec::check_at_start(&s)? {
        say!("policer: {warning}");
    }
    Ok(Some(s))
}

/// Takes this namespace's lock and the metrics port: a second daemon, or a
/// taken port, fails here with nothing changed.
fn claim(s: &StartSettings) -> Result<Claim> {
    if !is_root() {
        return Err(Error::NotRoot("attaching XDP"));
    }
    fs::create_dir_all(control::RUN_DIR)?;
    if let Err(e) = crate::lockfile::remove_stale(Path::new(control::RUN_DIR)) {
        log::warn!("cannot clear stale lock files in {}: {e}", control::RUN_DIR);
    }
    let lock = LockFile::acquire(&control::lock_path()?)?;
    let metrics = match s.metrics_addr {
        Some(a) => Some(
            std::net::TcpListener::bind(a).map_err(|e| Error::Invalid(format!("--metrics {a}: cannot listen: {e}")))?,
        ),
        None => None,
    };
    Ok(Claim { lock, metrics })
}

/// What is on the interfaces now; the policer program of this layout to
/// adopt, if any. One with too few rule slots for this start is replaced
/// rather than adopted (its buckets start empty).
fn survey(s: &StartSettings) -> Result<Survey> {
    let mut existing = Vec::new();
    for (n, &i) in s.ifaces.names.iter().zip(&s.ifaces.indexes) {
        existing.push(match &s.ifaces.join {
            Some(j) => inspect_slot(j)?,
            None => inspect(n, i)?,
        });
    }
    let needs = if s.sized_rules { s.max_rules } else { s.specs.len() as u32 };
    for e in existing.iter_mut() {
        if let Existing::Ours { prog_id, mode_flags } = *e
            && let Some(f) = find(prog_id)
            && let Some(&(_, entries)) = f.maps.get(MAP_RULE_COUNTERS)
            && entries.saturating_sub(1) < needs
        {
            let layout = Layout::RuleLimit { has: entries.saturating_sub(1), needs };
            *e = Existing::OtherLayout { prog_id, mode_flags, layout };
        }
    }
    let adopt_from = existing.iter().find_map(|e| match e {
        Existing::Ours { prog_id, .. } => Some(*prog_id),
        Existing::OtherLayout { .. } | Existing::None => None,
    });
    Ok(Survey { existing, adopt_from })
}

/// Config files larger than this (about 15 000 plain rules, read in a
/// few tenths of a second) are read while the early load verifies the
/// tail calls' programs at a lower priority (`LoadOptions::reading_beside`).
/// Measured at 1 000 000 rules (63 MB) on two cores: the start 1-2 s
/// slower with them verified beside the attached one at the same
/// priority, 1-2 s faster at the lower one than one after the other. A
/// smaller config's reading is over before the verifier's: no reason to
/// yield (on a host whose CPUs are all busy, a niced thread is slow).
const LARGE_CONFIG_BYTES: usize = 1 << 20;

/// A load of the program begun before the config is read: the options it
/// was given, and the thread making it.
struct Early {
    opts: LoadOptions,
    load: std::thread::JoinHandle<Result<Policer>>,
}

impl Early {
    /// The interface whose dispatchers' pin this load makes.
    fn iface(&self) -> Option<String> {
        let pin = self.opts.chain_pin.as_ref()?;
        Some(pin.parent()?.file_name()?.to_str()?.to_string())
    }
}

/// Begins loading the program on another thread, with the sizes the
/// command line and the config's `[daemon]` table give (read from the text
/// before its rules): the load (the verifier's work, most of a start) then
/// runs while the whole file is read and validated (100 000 rules: 0.4 s).
/// [`load`] takes it only where its own options are the same (a start
/// that adopts a running program, or whose sizes the whole file changes,
/// loads again). `text`: the config's bytes (`Some(None)`: no file);
/// `None` or a text that does not read: none begun (the settings say why).
fn early_load(args: &DaemonArgs, text: Option<Option<&[u8]>>) -> Option<Early> {
    // A member's chain is the root's array, checked first: no early load
    // (it would pin a chain of policer's own).
    if args.join.is_some() {
        return None;
    }
    let daemon = match text? {
        Some(bytes) => crate::config::daemon_before_rules(std::str::from_utf8(bytes).ok()?)?,
        None => Default::default(),
    };
    let size = text.flatten().map_or(0, <[u8]>::len);
    let max_sources = args.max_sources.or(daemon.max_sources).unwrap_or(DEFAULT_MAX_SOURCES);
    // Past the bound or the machine: not begun (the settings refuse it).
    crate::loader::check_sources_here(max_sources, "").ok()?;
    let opts = LoadOptions {
        max_sources,
        max_rules: args.max_rules.or(daemon.max_rules).unwrap_or(DEFAULT_MAX_RULES),
        layout_version: hooks::layout_version().ok()?,
        // The first interface's chain, as `load` will ask (a name to resolve,
        // `@default-route`, is left to it).
        chain_pin: args
            .ifaces
            .first()
            .or(daemon.interfaces.first())
            .filter(|n| !n.starts_with('@'))
            .map(|n| policer_common::chain::dispatch_pin_path(n)),
        // Reading a file this large is the start's critical path.
        reading_beside: size > LARGE_CONFIG_BYTES,
        ..Default::default()
    };
    let o = opts.clone();
    // Made with the start's signals blocked, which it keeps: they reach
    // the start's thread alone ([`Signals`]).
    let held = Signals::block();
    let load = std::thread::Builder::new().name("policer-load".into()).spawn(move || Policer::load(&o)).ok();
    drop(held);
    Some(Early { opts, load: load? })
}

/// Loads the program, reusing the adopted program's shared maps (pinned
/// for a moment in a private bpffs), and takes a descriptor of every
/// program it will replace.
fn load(s: &StartSettings, survey: &Survey, early: Option<Early>, out: &mut impl Write) -> Result<LoadedProgram> {
    let mut opts = LoadOptions {
        max_sources: s.max_sources,
        max_rules: s.max_rules,
        layout_version: s.layout_version,
        chain_pin: match &s.ifaces.join {
            Some(j) => Some(j.path.clone()),
            None => s.ifaces.names.first().map(|n| policer_common::chain::dispatch_pin_path(n)),
        },
        chain_from: s.ifaces.join.as_ref().map_or(0, |j| j.slot + 1),
        ..Default::default()
    };
    let mut bpffs = None;
    let mut old_fds: BTreeMap<u32, ProgramFd> = BTreeMap::new();
    if let Some(id) = survey.adopt_from {
        let found = find(id).ok_or(Error::Invalid(format!("policer program {id} went away while adopting")))?;
        let fs_ = PrivateBpffs::mount()?;
        for name in SHARED_MAPS {
            let (map_id, max) = found.maps[name];
            let path = fs_.dir.join(name);
            MapData::from_id(map_id)
                .map_err(Error::map(name))?
                .pin(&path)
                .map_err(|e| Error::Invalid(format!("cannot pin adopted map {name}: {e}")))?;
            // The tables' capacity is in their geometry.
            let max = if name == MAP_BUCKETS_V4_GEOMETRY { adopted_capacity(&path)? } else { max };
            if name == MAP_BUCKETS_V4_GEOMETRY && max != s.max_sources {
                if s.sized_sources {
                    let _ = writeln!(
                        out,
                        "policer: keeping the running table of {max} sources (not {}): resizing needs \
                         `policer detach` first",
                        s.max_sources
                    );
                }
                opts.max_sources = max;
            }
            // Counter slots 1..=max_rules: the adopted size stays.
            if name == MAP_RULE_COUNTERS && max.saturating_sub(1) != s.max_rules {
                if s.sized_rules {
                    let _ = writeln!(
                        out,
                        "policer: keeping the running program's limit of {} rules (not {}): resizing needs \
                         `policer detach` first",
                        max.saturating_sub(1),
                        s.max_rules
                    );
                }
                opts.max_rules = max.saturating_sub(1).max(1);
            }
            opts.reuse.push((name, path));
        }
        let _ = writeln!(
            out,
            "policer: adopting the policer already running (program {id}): its rules, buckets and counters \
             carry over (a class rule's start anew)"
        );
        old_fds.insert(id, found.prog_fd);
        bpffs = Some(fs_);
    }
    let same = |e: &LoadOptions| {
        (e.max_sources, e.max_rules, e.layout_version) == (opts.max_sources, opts.max_rules, opts.layout_version)
            && (e.chain_pin.as_ref(), e.chain_from) == (opts.chain_pin.as_ref(), opts.chain_from)
            && opts.reuse.is_empty()
    };
    let policer = match early.filter(|e| same(&e.opts)).map(|e| e.load.join()) {
        Some(Ok(Ok(p))) => p,
        // Not begun, other options, or it failed: loaded here (and a
        // failure says why here).
        _ => Policer::load(&opts)?,
    };
    // Tries of a program loaded by an older build keep their size when
    // adopted: imports past it are refused; say so once, here.
    if survey.adopt_from.is_some()
        && let Ok((v4, v6)) = policer.rule_trie_capacity()
        && v4.min(v6) < crate::loader::TRIE_PREFIXES
    {
        let _ = writeln!(
            out,
            "policer: the adopted program's rule tries hold {} prefixes per family (this build: {}); \
             `policer detach`, then start again, for imports of more",
            v4.min(v6),
            crate::loader::TRIE_PREFIXES
        );
    }
    drop(bpffs);
    for (e, n) in survey.existing.iter().zip(&s.ifaces.names) {
        let (Existing::Ours { prog_id, .. } | Existing::OtherLayout { prog_id, .. }) = e else {
            continue;
        };
        if !old_fds.contains_key(prog_id) {
            let f = find(*prog_id).ok_or_else(|| Error::AlreadyAttached {
                iface: n.clone(),
                what: super::adopt::describe_program(*prog_id, 0),
            })?;
            old_fds.insert(*prog_id, f.prog_fd);
        }
    }
    Ok(LoadedProgram { policer, old_fds })
}

/// Plans the config's rules against what the loaded maps hold, keeping the
/// id (and so the buckets' state) and counter slot of every class-less rule
/// that did not change. Written in the transaction.
fn plan_rules(
    policer: &Policer,
    s: &StartSettings,
    adopting: bool,
    args: &DaemonArgs,
    out: &mut impl Write,
) -> Result<Planned> {
    let mut have = policer.kernel_compiled()?;
    // Ids of set entries too: a new rule must not take an id a set keeps.
    let next_id = have.prefixes.values().map(|r| r.rule_id).max().unwrap_or(0) + 1;
    // Named sets: their entries stay in the tries through the sync of the
    // rules, and are rewritten after it.
    let sets_dir = crate::sets::sets_dir(&args.state_dir);
    let legacy = crate::sets::legacy_dir(&args.config);
    let migrated = match crate::sets::migrate(&legacy, &sets_dir, crate::sets::file_mode(&args.config))? {
        crate::sets::Migrated::Copied(names) => {
            let _ = writeln!(
                out,
                "policer: copied {} set(s) from {} to the state directory {}",
                names.len(),
                legacy.display(),
                sets_dir.display()
            );
            names
        }
        crate::sets::Migrated::Nothing => Vec::new(),
    };
    // SYN cookies: the kernel settings they need, said at the start.
    for w in crate::syncookies::warnings(s.specs.values()) {
        let _ = writeln!(out, "policer: warning: {w}");
    }
    let mut loaded = super::sets::StartSets::read(&sets_dir)?;
    // The config's [[set]]s, from their files now (a saved set of the same
    // name gives way).
    loaded.add_config(&args.config, &s.file.config().sets)?;
    loaded.strip(&mut have);
    let mut slots = Slots::new(policer.max_rules()?);
    // What an adopted program holds of the wanted class-less rules, with
    // the counter slot it keeps (an older build's shared slot 0, or one
    // past the limit, is not a slot: such a rule gets one). Shorter
    // prefixes first: a prefix with classes holds a copy of the rule it
    // falls to, slot and all, which is not its own. Rules with classes get
    // fresh slots (their buckets and counters start anew at a restart).
    let mut held: BTreeMap<RuleKey, HeldRule> = BTreeMap::new();
    if adopting {
        let mut order: Vec<&RuleKey> = s.specs.keys().filter(|k| k.class().is_none()).collect();
        order.sort_by_key(|k| (k.net.prefix_len(), *k));
        for key in order {
            if let Some(k) = have.prefixes.get(&key.net)
                && slots.mark_used(k.counter_slot)
            {
                held.insert(key.clone(), HeldRule { id: k.rule_id, slot: k.counter_slot, form: Form::Kernel(*k) });
            }
        }
    }
    // Prefixes keep the group ids the maps give them, and ids that go rest
    // a change, as for any change of the rules.
    let mut groups = crate::compile::Groups::default();
    groups.adopt(have.prefixes.iter().map(|(n, r)| (*n, r.classes)));
    // The slots the adopted sets' entries count into stay theirs: a new
    // rule in one would rewrite its limiter under the set's entries.
    let reserved: BTreeSet<u32> = loaded.kernel_slots().collect();
    let free = slots.free_slots().filter(|s| !reserved.contains(s));
    let plan = super::plan::plan(&held, &s.specs, &s.protect, free, slots.capacity(), &groups, next_id)?;
    let mut rs = RuleSet::new(slots, groups, have, next_id);
    rs.set_protect(s.protect.clone());
    rs.set_entries_protect(s.protect.clone());
    Ok(Planned { rs, plan, sets: loaded, sets_dir, migrated })
}

/// One kernel change of a start, with what it replaced.
enum StartStep {
    /// The new program was attached to an interface, replacing `old`
    /// (program id and a descriptor of it) or nothing.
    Attached { iface: String, index: u32, mode_flags: u32, old: Option<(u32, OwnedFd)> },
    /// Member mode: the new program (`new_id`) was put in a root's slot,
    /// replacing `old` or nothing.
    Joined { join: crate::member::Join, new_id: u32, old: Option<(u32, OwnedFd)> },
    /// The adopted rule maps (tries, class index and filter), from `old`
    /// to `new`.
    Rules { old: Box<crate::compile::Compiled>, new: Box<crate::compile::Compiled> },
    /// An adopted total (aggregate bucket) slot.
    Total { slot: u32, old: policer_common::class::Total },
    /// An adopted new-source limiter slot, and the slot's ban parameters.
    /// (The slot's SYN settings and SYN budget are not recorded: those
    /// maps are each program's own, never the adopted program's, so a
    /// failed start leaves the running program's untouched.)
    NewSources { slot: u32, old: NewSources, old_bans: policer_common::ban::BanParams },
    /// An adopted rule counter slot, per CPU, before it was zeroed.
    RuleCounters { slot: u32, old: PerCpuValues<RuleCounters> },
    /// A set's entries written into (or removed from) adopted tries, and
    /// what the tries held there before.
    SetEntries { written: std::sync::Arc<Vec<ipnet::IpNet>>, old: BTreeMap<ipnet::IpNet, policer_common::Rule> },
}

impl super::sets::SetUndo for Undo {
    fn zeroing_counters(&mut self, p: &mut Policer, slot: u32) -> Result<()> {
        let old = self.save_rule_counters(slot)?;
        p.reset_rule_counters(slot)?;
        match old {
            Some(old) => self.zeroed_rule_counters(slot, old),
            None => Ok(()),
        }
    }

    fn limiter(&mut self, slot: u32) -> Result<()> {
        self.new_sources(slot)
    }

    fn entries(
        &mut self,
        written: std::sync::Arc<Vec<ipnet::IpNet>>,
        old: BTreeMap<ipnet::IpNet, policer_common::Rule>,
    ) -> Result<()> {
        if self.maps.is_none() {
            return Ok(());
        }
        self.push(StartStep::SetEntries { written, old })
    }
}

/// The undo log of a start. Each change is recorded before it is made (or,
/// for an attachment and a zeroed counter slot, as soon as it is made), so
/// a change that then fails is put back harmlessly. Dropped without [`Undo::commit`] it puts every
/// recorded change back, last first, and says so.
struct Undo {
    /// The new program: the one expected on an interface that is put back.
    new_prog: OwnedFd,
    /// The adopted maps the start writes into (None: fresh maps, which no
    /// running program reads, need no undo).
    maps: Option<SharedMaps>,
    steps: Vec<StartStep>,
    /// Slots already saved: the first value seen is the one to restore.
    saved_limiters: BTreeSet<u32>,
    saved_counters: BTreeSet<u32>,
    saved_totals: BTreeSet<u32>,
    committed: bool,
    /// Restores the signal mask when the log goes (see [`Signals`]); a
    /// field, so it is dropped after the rollback. Taken at the commit:
    /// the signals then stay held back until the event loop listens for
    /// them ([`unblock_signals`]).
    signals: Option<Signals>,
    /// Tests only: where to fail or pause (nothing without `test-hooks`).
    hooks: hooks::Steps,
}

/// SIGINT, SIGTERM and SIGHUP are held back for the length of the
/// transaction: by default they end the process, which mid-way would leave
/// a half-made start behind. One of the first two pending at the commit
/// aborts the start instead (everything is put back); a SIGHUP then is
/// dropped (the start has just read the config). The start's one other
/// thread (its early load) is made with them blocked, so this thread's
/// mask is the process's. SIGKILL cannot be held back: a start killed
/// mid-way is not undone.
struct Signals {
    old: libc::sigset_t,
}

impl Signals {
    fn set() -> libc::sigset_t {
        // SAFETY: sigemptyset/sigaddset initialise and fill a local set.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            set
        }
    }

    fn block() -> Signals {
        // SAFETY: valid sets; only this thread's mask changes.
        unsafe {
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, &Signals::set(), &mut old);
            Signals { old }
        }
    }

    /// Takes the held-back signals; true if SIGINT or SIGTERM was among them.
    fn take_pending() -> bool {
        let set = Signals::set();
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let mut stop = false;
        loop {
            // SAFETY: valid set and timeout; the info pointer may be null.
            let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &zero) };
            if sig <= 0 {
                return stop;
            }
            stop |= sig != libc::SIGHUP;
        }
    }
}

/// Lets SIGINT, SIGTERM and SIGHUP through again, on the calling thread:
/// the event loop, once its handlers are in place (a signal held back
/// since the start's commit is delivered to them now). Threads started
/// meanwhile keep them blocked, so they reach this one.
pub(super) fn unblock_signals() {
    // SAFETY: a valid set; only this thread's mask changes.
    unsafe {
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &Signals::set(), std::ptr::null_mut());
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        // SAFETY: restores the mask saved in `block`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

impl Undo {
    fn new(new_prog: OwnedFd, maps: Option<SharedMaps>) -> Result<Undo> {
        let hooks = hooks::Steps::from_env()?;
        Ok(Undo {
            new_prog,
            maps,
            steps: Vec::new(),
            saved_limiters: BTreeSet::new(),
            saved_counters: BTreeSet::new(),
            saved_totals: BTreeSet::new(),
            committed: false,
            signals: Some(Signals::block()),
            hooks,
        })
    }

    fn push(&mut self, step: StartStep) -> Result<()> {
        self.steps.push(step);
        self.hooks.after_change(self.steps.len())
    }

    fn attached(&mut self, iface: &str, index: u32, mode_flags: u32, old: Option<(u32, OwnedFd)>) -> Result<()> {
        self.push(StartStep::Attached { iface: iface.into(), index, mode_flags, old })
    }

    fn rules(&mut self, old: &crate::compile::Compiled, new: &crate::compile::Compiled) -> Result<()> {
        if self.maps.is_none() {
            return Ok(());
        }
        self.push(StartStep::Rules { old: Box::new(old.clone()), new: Box::new(new.clone()) })
    }

    fn total(&mut self, slot: u32) -> Result<()> {
        let Some(m) = &self.maps else {
            return Ok(());
        };
        if !self.saved_totals.insert(slot) {
            return Ok(());
        }
        let old = m.total(slot)?;
        self.push(StartStep::Total { slot, old })
    }

    fn new_sources(&mut self, slot: u32) -> Result<()> {
        let Some(m) = &self.maps else {
            return Ok(());
        };
        if !self.saved_limiters.insert(slot) {
            return Ok(());
        }
        let old = m.new_sources(slot)?;
        let old_bans = m.ban_params(slot)?;
        self.push(StartStep::NewSources { slot, old, old_bans })
    }

    /// A counter slot's values before it is zeroed (None: nothing to save,
    /// fresh maps or saved already).
    fn save_rule_counters(&mut self, slot: u32) -> Result<Option<PerCpuValues<RuleCounters>>> {
        let Some(m) = &self.maps else {
            return Ok(None);
        };
        if self.saved_counters.contains(&slot) {
            return Ok(None);
        }
        Ok(Some(m.rule_counters(slot)?))
    }

    fn zeroed_rule_counters(&mut self, slot: u32, old: PerCpuValues<RuleCounters>) -> Result<()> {
        self.saved_counters.insert(slot);
        self.push(StartStep::RuleCounters { slot, old })
    }

    /// Ends the transaction, unless SIGINT or SIGTERM came meanwhile: then
    /// the start is abandoned (and undone when `self` is dropped).
    fn commit(mut self) -> Result<()> {
        if Signals::take_pending() {
            return Err(Error::Invalid("interrupted by a signal while starting; nothing changed".into()));
        }
        self.committed = true;
        // Still held back: a SIGTERM between "policing" and the event
        // loop's handlers would otherwise end the process by default,
        // leaving the program attached without a word. The loop takes it.
        if let Some(s) = self.signals.take() {
            std::mem::forget(s);
        }
        Ok(())
    }

    /// Puts back every recorded change, last first; reports what it did
    /// and anything it could not put back.
    fn rollback(&mut self) {
        let mut done = Vec::new();
        let (mut rules, mut limiters, mut counters, mut sets) = (0usize, 0usize, 0usize, 0usize);
        let new = self.new_prog.as_raw_fd();
        while let Some(step) = self.steps.pop() {
            let r = match step {
                StartStep::Attached { iface, index, mode_flags, old } => {
                    let (fd, what) = match &old {
                        Some((id, fd)) => (fd.as_raw_fd(), format!("program {id} back on {iface}")),
                        None => (-1, format!("detached from {iface}")),
                    };
                    let r = netlink::set(index, fd, mode_flags, Some(new))
                        .map_err(|source| Error::Netlink { iface: iface.clone(), source });
                    if r.is_ok() {
                        done.push(what.clone());
                    }
                    r.map_err(|e| (what, e))
                }
                StartStep::Joined { join, new_id, old } => {
                    let (r, what) = match &old {
                        Some((id, fd)) => {
                            (join.put(fd.as_raw_fd()), format!("program {id} back in {}", join.describe()))
                        }
                        None => (join.clear_if(new_id).map(|_| ()), format!("left {}", join.describe())),
                    };
                    if r.is_ok() {
                        done.push(what.clone());
                    }
                    r.map_err(|e| (what, e))
                }
                StartStep::Rules { old, new } => {
                    rules += old.prefixes.len();
                    let m = self.maps.as_mut().expect("recorded only with maps");
                    m.sync_rules(&new, &old).map_err(|e| ("the rules".to_string(), e))
                }
                StartStep::Total { slot, old } => {
                    limiters += 1;
                    let m = self.maps.as_mut().expect("recorded only with maps");
                    m.set_total(slot, &old).map_err(|e| (format!("the total of slot {slot}"), e))
                }
                StartStep::NewSources { slot, old, old_bans } => {
                    limiters += 1;
                    let m = self.maps.as_mut().expect("recorded only with maps");
                    m.set_new_sources(slot, &old)
                        .and_then(|()| m.set_ban_params(slot, &old_bans))
                        .map_err(|e| (format!("the new-source limiter and bans of slot {slot}"), e))
                }
                StartStep::SetEntries { written, old } => {
                    sets += 1;
                    let m = self.maps.as_mut().expect("recorded only with maps");
                    m.restore_entries(&written, &old).map_err(|e| ("a set's entries".to_string(), e))
                }
                StartStep::RuleCounters { slot, old } => {
                    counters += 1;
                    let m = self.maps.as_mut().expect("recorded only with maps");
                    // What was there plus what was counted since it was
                    // zeroed (a removed rule that still used the slot until
                    // now): no frame the running program counted is lost.
                    let merged = m.rule_counters(slot).and_then(|now| crate::loader::merged_counters(&old, &now));
                    merged
                        .and_then(|v| m.set_rule_counters(slot, v))
                        .map_err(|e| (format!("the counters of slot {slot}"), e))
                }
            };
            if let Err((what, e)) = r {
                say_err!("policer: start failed, and putting back {what} failed too: {e}");
            }
        }
        let restored: Vec<String> = [
            (rules, "rule entry", "rule entries"),
            (limiters, "new-source limiter", "new-source limiters"),
            (counters, "counter slot", "counter slots"),
            (sets, "set", "sets"),
        ]
        .into_iter()
        .filter(|&(k, ..)| k > 0)
        .map(|(k, one, many)| format!("{k} {}", if k == 1 { one } else { many }))
        .collect();
        if !restored.is_empty() {
            done.push(format!("restored {}", restored.join(", ")));
        }
        if !done.is_empty() {
            say_err!("policer: start failed; undone: {}", done.join("; "));
        }
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.committed {
            self.rollback();
            // The start fails with its own error; a signal held back
            // meanwhile would end the process before it is said.
            if Signals::take_pending() {
                say_err!("policer: interrupted by a signal while starting");
            }
        }
    }
}

/// The `--max-sources` of an adopted program's tables: the capacity in
/// their geometry map (pinned at `path`).
fn adopted_capacity(path: &std::path::Path) -> Result<u32> {
    let bad = |e: String| Error::Invalid(format!("reading the adopted {MAP_BUCKETS_V4_GEOMETRY}: {e}"));
    let data = MapData::from_pin(path).map_err(|e| bad(e.to_string()))?;
    let g: Option<policer_common::table::Geometry> = {
        use std::os::fd::{AsFd, AsRawFd};
        crate::batch::lookup(data.fd().as_fd().as_raw_fd(), &0u32).map_err(|e| bad(e.to_string()))?
    };
    match g {
        Some(g) if g.capacity > 0 && g.capacity <= u32::MAX as u64 => Ok(g.capacity as u32),
        _ => Err(bad("no capacity recorded".into())),
    }
}
