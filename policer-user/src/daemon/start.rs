//! Starting the daemon: validate, lock, look at the interfaces, load (or
//! adopt), install the rules, attach.

use std::{
    collections::BTreeMap,
    fs,
    io::Write,
    os::{
        fd::{AsFd, AsRawFd, RawFd},
        unix::{fs::PermissionsExt, net::UnixListener},
    },
    path::Path,
};

use aya::{maps::MapData, programs::ProgramFd};
use ipnet::IpNet;
use policer_common::{
    DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES, MAP_BUCKETS_V6, MAP_RULE_COUNTERS, MAX_RULES, Rule, SHARED_MAPS, rate::Rate,
};

use super::{
    Daemon, DaemonArgs, Iface, Installed,
    adopt::{Existing, PrivateBpffs, attach_fresh, find, inspect},
    ruleset::{Slots, prepare},
};
use crate::{
    config::{Change, ConfigFile},
    control,
    error::{Error, Result},
    loader::{LoadOptions, Mode, Policer, if_index, is_root},
    lockfile::LockFile,
    netlink,
    rules::{BurstValue, RuleConfig, RuleSpec},
};

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
pub(super) fn default_rules(rate: Rate, burst: &Option<String>) -> Result<Vec<RuleSpec>> {
    let burst = burst.as_ref().map(|b| BurstValue::Text(b.clone()));
    ["0.0.0.0/0", "::/0"]
        .iter()
        .map(|p| {
            RuleConfig {
                prefix: p.to_string(),
                rate: Some(rate.to_string()),
                burst: burst.clone(),
                action: None,
                key_len: None,
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

pub(super) fn same_params(a: &Rule, b: &Rule) -> bool {
    Rule { rule_id: 0, counter_slot: 0, ..*a } == Rule { rule_id: 0, counter_slot: 0, ..*b }
}

impl Daemon {
    /// Everything up to and including attaching; runs before any thread.
    /// On error nothing stays changed: not the interfaces, not the file.
    pub fn start(args: &DaemonArgs) -> Result<Daemon> {
        let (mut file, mut specs) = ConfigFile::open(&args.config)?;
        let cfg = file.config().clone();
        if let Some(rate) = args.rate {
            for s in default_rules(rate, &args.burst)? {
                specs.insert(s.net, s);
            }
        } else if args.burst.is_some() {
            return Err(Error::Invalid("--burst needs --rate".into()));
        }
        if specs.is_empty() {
            return Err(Error::Invalid(format!(
                "nothing to police: give --rate (and --burst), or rules in {}",
                args.config.display()
            )));
        }
        let names = if args.ifaces.is_empty() { cfg.daemon.interfaces.clone() } else { args.ifaces.clone() };
        if names.is_empty() {
            return Err(Error::Invalid(format!("no interface given, and none in {}", args.config.display())));
        }
        let mut seen = std::collections::HashSet::new();
        let mut indexes = Vec::new();
        for n in &names {
            if !seen.insert(n) {
                return Err(Error::DuplicateInterface(n.clone()));
            }
            indexes.push(if_index(n)?);
        }
        let mode = args.mode.or(cfg.daemon.mode).unwrap_or(Mode::Auto);
        let max_sources = args.max_sources.or(cfg.daemon.max_sources).unwrap_or(DEFAULT_MAX_SOURCES);
        let max_rules = args.max_rules.or(cfg.daemon.max_rules).unwrap_or(DEFAULT_MAX_RULES);
        if !(1..=MAX_RULES).contains(&max_rules) {
            return Err(Error::Invalid(format!("--max-rules must be 1 ..= {MAX_RULES}")));
        }
        if specs.len() > max_rules as usize {
            return Err(Error::Invalid(format!(
                "{} rules, more than the limit of {max_rules}: raise --max-rules (or max_rules in [daemon])",
                specs.len()
            )));
        }
        if max_sources == 0 {
            return Err(Error::Invalid("--max-sources must be at least 1".into()));
        }
        if !(args.interval == 0.0 || (0.05..=3600.0).contains(&args.interval)) {
            return Err(Error::Invalid("--interval must be 0 (off) or 0.05 ..= 3600 seconds".into()));
        }
        let metrics_addr = args.metrics.as_deref().map(crate::metrics::parse_addr).transpose()?;
        if !is_root() {
            return Err(Error::NotRoot("attaching XDP"));
        }
        fs::create_dir_all(control::RUN_DIR)?;
        if let Err(e) = crate::lockfile::remove_stale(Path::new(control::RUN_DIR)) {
            log::warn!("cannot clear stale lock files in {}: {e}", control::RUN_DIR);
        }
        let lock = LockFile::acquire(&control::lock_path()?)?;
        // Bind before attaching: a taken port must fail with nothing changed.
        let metrics = match metrics_addr {
            Some(a) => Some(
                std::net::TcpListener::bind(a)
                    .map_err(|e| Error::Invalid(format!("--metrics {a}: cannot listen: {e}")))?,
            ),
            None => None,
        };

        // What is on the interfaces now.
        let mut existing = Vec::new();
        for (n, &i) in names.iter().zip(&indexes) {
            existing.push(inspect(n, i)?);
        }
        let adopt_from = existing.iter().find_map(|e| match e {
            Existing::Ours { prog_id, .. } => Some(*prog_id),
            Existing::None => None,
        });
        let mut out = std::io::stdout().lock();

        // Load, reusing an adopted program's maps.
        let mut opts = LoadOptions { max_sources, max_rules, ..Default::default() };
        let mut _bpffs = None;
        let mut old_fds: BTreeMap<u32, ProgramFd> = BTreeMap::new();
        if let Some(id) = adopt_from {
            let found = find(id).ok_or(Error::Invalid(format!("policer program {id} went away while adopting")))?;
            let fs_ = PrivateBpffs::mount()?;
            for name in SHARED_MAPS {
                let (map_id, max) = found.maps[name];
                let path = fs_.dir.join(name);
                MapData::from_id(map_id)
                    .map_err(Error::map(name))?
                    .pin(&path)
                    .map_err(|e| Error::Invalid(format!("cannot pin adopted map {name}: {e}")))?;
                if name == MAP_BUCKETS_V6 && max != max_sources {
                    if args.max_sources.is_some() || cfg.daemon.max_sources.is_some() {
                        let _ = writeln!(
                            out,
                            "policer: keeping the running table of {max} sources (not {max_sources}): \
                             resizing needs `policer detach` first"
                        );
                    }
                    opts.max_sources = max;
                }
                // Counter slots 1..=max_rules: the adopted size stays.
                if name == MAP_RULE_COUNTERS && max.saturating_sub(1) != max_rules {
                    if args.max_rules.is_some() || cfg.daemon.max_rules.is_some() {
                        let _ = writeln!(
                            out,
                            "policer: keeping the running program's limit of {} rules (not {max_rules}): \
                             resizing needs `policer detach` first",
                            max.saturating_sub(1)
                        );
                    }
                    opts.max_rules = max.saturating_sub(1).max(1);
                }
                opts.reuse.push((name, path));
            }
            let _ = writeln!(
                out,
                "policer: adopting the policer already running (program {id}): its rules, buckets and counters carry over"
            );
            old_fds.insert(id, found.prog_fd);
            _bpffs = Some(fs_);
        }
        let mut policer = Policer::load(&opts)?;
        drop(_bpffs);
        for (e, n) in existing.iter().zip(&names) {
            if let Existing::Ours { prog_id, .. } = e
                && !old_fds.contains_key(prog_id)
            {
                let f = find(*prog_id).ok_or(Error::AlreadyAttached { iface: n.clone() })?;
                old_fds.insert(*prog_id, f.prog_fd);
            }
        }

        // Bring the kernel's rules to the config's, keeping the id (and so
        // the buckets' state) of every rule that did not change.
        let kernel: BTreeMap<IpNet, Rule> = policer.kernel_rules()?.into_iter().collect();
        let mut next_id = kernel.values().map(|r| r.rule_id).max().unwrap_or(0) + 1;
        let mut slots = Slots::new(policer.max_rules()?);
        // Rules that stay keep their counter slot (an older build's shared
        // slot 0, or one past the limit, is not a slot: such a rule gets one).
        let mut kept: BTreeMap<IpNet, u32> = BTreeMap::new();
        for (net, k) in &kernel {
            if specs.contains_key(net) && slots.mark_used(k.counter_slot) {
                kept.insert(*net, k.counter_slot);
            }
        }
        let mut rules = BTreeMap::new();
        // New and changed rules, installed together in one batch below.
        let mut pending: Vec<(IpNet, Rule)> = Vec::new();
        for (net, spec) in &specs {
            let fresh = spec.kernel(0)?;
            let inst = match (kernel.get(net), kept.get(net)) {
                (Some(k), Some(&slot)) if same_params(k, &fresh) => {
                    Installed { spec: spec.clone(), id: k.rule_id, slot, persisted: true }
                }
                (Some(_), Some(&slot)) => {
                    let inst = Installed { spec: spec.clone(), id: next_id, slot, persisted: true };
                    next_id += 1;
                    pending.push((*net, prepare(&mut policer, spec, inst.id, inst.slot)?));
                    inst
                }
                _ => {
                    let slot = slots.take()?;
                    // A fresh program's counters are zero; an adopted one's
                    // slot may hold a removed rule's counts.
                    if adopt_from.is_some() {
                        policer.reset_rule_counters(slot)?;
                    }
                    let inst = Installed { spec: spec.clone(), id: next_id, slot, persisted: true };
                    next_id += 1;
                    pending.push((*net, prepare(&mut policer, spec, inst.id, slot)?));
                    inst
                }
            };
            rules.insert(*net, inst);
        }
        policer.set_rules(&pending)?;
        for net in kernel.keys() {
            if !specs.contains_key(net) {
                policer.remove_rule(*net)?;
            }
        }

        // Attach: replace an adopted program atomically, else attach fresh.
        let new_fd = policer.prog_fd()?;
        let mut ifaces: Vec<Iface> = Vec::new();
        let mut undo: Vec<(u32, u32, Option<RawFd>)> = Vec::new();
        let result = (|| -> Result<()> {
            for ((name, &index), e) in names.iter().zip(&indexes).zip(&existing) {
                match e {
                    Existing::Ours { prog_id, mode_flags } => {
                        let old = old_fds[prog_id].as_fd().as_raw_fd();
                        netlink::set(index, new_fd, *mode_flags, Some(old))
                            .map_err(|source| Error::Netlink { iface: name.clone(), source })?;
                        undo.push((index, *mode_flags, Some(old)));
                        let _ = writeln!(
                            out,
                            "policer: replaced program {prog_id} on {name} ({} mode)",
                            Mode::flag_name(*mode_flags)
                        );
                        ifaces.push(Iface { name: name.clone(), index, mode_flags: *mode_flags });
                    }
                    Existing::None => {
                        let flags = attach_fresh(name, index, new_fd, mode)?;
                        undo.push((index, flags, None));
                        let _ = writeln!(out, "policer: attached to {name} ({} mode)", Mode::flag_name(flags));
                        ifaces.push(Iface { name: name.clone(), index, mode_flags: flags });
                    }
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            // Put every interface back as it was.
            for (index, flags, old) in undo.into_iter().rev() {
                match old {
                    Some(old) => {
                        let _ = netlink::set(index, old, flags, Some(new_fd));
                    }
                    None => {
                        let _ = netlink::set(index, -1, flags, Some(new_fd));
                    }
                }
            }
            return Err(e);
        }

        // Rewrite the file only if this start changed what it says (the
        // default rules from --rate, or the interfaces).
        let changed = args.rate.is_some() || cfg.daemon.interfaces != names;
        let mut file_rules = specs.clone();
        if changed && let Err(e) = file.update(Change { rules: Some(&specs), interfaces: Some(&names) }) {
            // Policing runs from the command line's rules; the file keeps
            // what it says, and `rule ls` shows the difference.
            let _ = writeln!(out, "policer: warning: {e}");
            file_rules = file.read().map(|s| s.rules).unwrap_or_default();
        }

        let socket = control::socket_path()?;
        let listener = bind_private(&socket)?;
        if let Some(m) = &metrics
            && let Ok(a) = m.local_addr()
        {
            let _ = writeln!(out, "policer: serving Prometheus metrics on http://{a}/metrics");
        }
        let _ = writeln!(
            out,
            "policer: policing on {} with {} rules from {}; {}",
            names.join(", "),
            rules.len(),
            args.config.display(),
            if args.persist { "exiting leaves it attached and policing" } else { "Ctrl-C detaches" }
        );
        let _ = out.flush();
        let program_id = policer.program_id()?;
        let mut d = Daemon {
            program_id,
            policer,
            ifaces,
            file_rules,
            rules,
            slots,
            fast: 0,
            last_flip: None,
            file,
            next_id,
            persist: args.persist,
            interval: args.interval,
            socket,
            listener: Some(listener),
            metrics,
            _lock: lock,
            finished: false,
        };
        d.sync_fast_path()?;
        Ok(d)
    }
}
