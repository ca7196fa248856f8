//! `policer attach`: the daemon.
//!
//! Lifecycle (see README, "Lifecycle"):
//! - start: read and validate the config file, take the per-namespace
//!   lock, look at each interface. A policer program already attached
//!   (left by a daemon that exited with `--persist`, crashed, or was
//!   killed) is *adopted*: the new program reuses its maps — rules,
//!   buckets, counters — and replaces it atomically
//!   (`XDP_FLAGS_REPLACE`). Any other XDP program is left alone and
//!   attaching fails.
//! - run: serve the control socket, print counters, reload on SIGHUP.
//! - exit (SIGINT/SIGTERM): detach, unless `--persist`, in which case the
//!   kernel keeps policing with the last rules until a new daemon adopts
//!   the program or `policer detach` removes it. A killed daemon leaves
//!   the program attached and policing, as with `--persist`.

use std::{
    collections::BTreeMap,
    fs::{self, File},
    io::{BufRead, BufReader, Write},
    os::{
        fd::{AsFd, AsRawFd, OwnedFd, RawFd},
        unix::{fs::PermissionsExt, net::UnixListener},
    },
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::{
    maps::{MapData, MapInfo},
    programs::{ProgramFd, loaded_programs},
};
use ipnet::IpNet;
use policer_common::{
    BucketKey, Counters, DEFAULT_MAX_SOURCES, FAMILY_V4, MAP_BUCKETS_V6, MAX_IFACE_SLOTS, MAX_RULE_SLOTS, NewSources,
    PROGRAM_NAME, Rule, RuleCounters, SHARED_MAP_LAYOUT, SHARED_MAPS, rate::Rate,
};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    config::Config,
    control::{
        self, CountersView, IfaceStats, Request, Response, RuleStats, RuleView, StatsView, StatusView, TableStats,
        TopEntry, TopView,
    },
    error::{Error, Result},
    loader::{LoadOptions, Mode, Policer, if_index, is_root},
    netlink::{self, XDP_FLAGS_UPDATE_IF_NOEXIST},
    report::format_line,
    rules::{BurstValue, RuleConfig, RuleSpec},
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
    pub interval: f64,
    pub config: PathBuf,
    pub persist: bool,
    /// Serve Prometheus /metrics here (`9100` = 127.0.0.1:9100).
    pub metrics: Option<String>,
}

/// A rule as installed in the kernel.
#[derive(Clone, Debug)]
struct Installed {
    spec: RuleSpec,
    /// Changes with every change of the rule (buckets rescale on it).
    id: u32,
    /// Counter slot; kept while the prefix has a rule.
    slot: u32,
}

/// Allocates rule counter slots; slot 0 is shared by rules past the last.
struct Slots {
    /// Slots 1.. not in use, lowest first.
    free: std::collections::BTreeSet<u32>,
}

impl Default for Slots {
    fn default() -> Slots {
        Slots { free: (1..MAX_RULE_SLOTS).collect() }
    }
}

impl Slots {
    /// The lowest free slot, or the shared slot 0 when all are taken.
    fn take(&mut self) -> u32 {
        self.free.pop_first().unwrap_or(0)
    }

    /// Marks a slot an adopted rule already uses.
    fn mark_used(&mut self, s: u32) {
        self.free.remove(&s);
    }

    fn free(&mut self, s: u32) {
        if s != 0 {
            self.free.insert(s);
        }
    }
}

struct Iface {
    name: String,
    index: u32,
    mode_flags: u32,
}

/// How old the live-bucket count on /metrics may be.
const LIVE_COUNT_MAX_AGE: Duration = Duration::from_secs(5);

pub struct Daemon {
    policer: Policer,
    ifaces: Vec<Iface>,
    /// The rules in force, with their kernel id and counter slot.
    rules: BTreeMap<IpNet, Installed>,
    slots: Slots,
    /// Default-rules fast path: 0 off, else the pair of DEFAULT_RULES in use.
    fast: u32,
    last_flip: Option<Instant>,
    /// The last count of the bucket table for /metrics: when it was taken,
    /// live buckets, buckets evicted by then. Counting reads the whole table
    /// (≈ 0.3 s at 1 000 000 buckets), during which the daemon answers
    /// nothing else, so scrapes share one count for [`LIVE_COUNT_MAX_AGE`].
    live_count: std::cell::Cell<Option<(Instant, u64, u64)>>,
    cfg: Config,
    config_path: PathBuf,
    next_id: u32,
    persist: bool,
    interval: f64,
    socket: PathBuf,
    listener: Option<UnixListener>,
    metrics: Option<std::net::TcpListener>,
    _lock: File,
}

/// A running policer program found on an interface.
struct Found {
    prog_id: u32,
    prog_fd: ProgramFd,
    /// name -> (map id, max_entries)
    maps: BTreeMap<String, (u32, u32)>,
}

/// What is on an interface now.
enum Existing {
    None,
    Ours { prog_id: u32, mode_flags: u32 },
}

fn inspect(iface: &str, index: u32) -> Result<Existing> {
    let st = netlink::query(index).map_err(|source| Error::Netlink { iface: iface.into(), source })?;
    let Some(st) = st else {
        return Ok(Existing::None);
    };
    match find(st.prog_id) {
        Some(_) => Ok(Existing::Ours { prog_id: st.prog_id, mode_flags: st.mode_flags }),
        None => Err(Error::AlreadyAttached { iface: iface.into() }),
    }
}

/// The policer program with `prog_id` and its maps; None if that program
/// is not a policer (another name, or not our maps).
fn find(prog_id: u32) -> Option<Found> {
    let info = loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == prog_id)?;
    if info.name_as_str() != Some(PROGRAM_NAME) {
        return None;
    }
    let mut maps = BTreeMap::new();
    for id in info.map_ids().ok()??.into_iter() {
        let Ok(m) = MapInfo::from_id(id) else {
            continue;
        };
        if let Some(n) = m.name_as_str().filter(|n| SHARED_MAPS.contains(n)) {
            // A build whose maps have another layout is not ours to adopt:
            // its rules, buckets or counters would be misread.
            if SHARED_MAP_LAYOUT.iter().any(|&(name, key, value)| {
                name == n && (m.key_size() as usize != key || m.value_size() as usize != value)
            }) {
                return None;
            }
            maps.insert(n.to_string(), (id, m.max_entries()));
        }
    }
    if maps.len() != SHARED_MAPS.len() {
        return None;
    }
    let prog_fd = info.fd().ok()?;
    Some(Found { prog_id, prog_fd, maps })
}

/// A bpffs mounted in a mount namespace of this thread's own, so pins of
/// adopted maps (needed to hand them to the loader) are invisible to
/// everyone else and vanish with the process. Must run before any thread
/// is started.
struct PrivateBpffs {
    dir: PathBuf,
}

impl PrivateBpffs {
    fn mount() -> Result<PrivateBpffs> {
        let dir = PathBuf::from(control::RUN_DIR).join(format!("adopt-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
        let dir_c = c(&dir);
        // SAFETY: plain syscalls with valid C strings.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error().into());
            }
            if libc::mount(c"bpf".as_ptr(), dir_c.as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        Ok(PrivateBpffs { dir })
    }
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        if let Ok(c) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Takes the per-namespace lock: one daemon per network namespace.
fn lock() -> Result<File> {
    fs::create_dir_all(control::RUN_DIR)?;
    let path = control::lock_path()?;
    let mut f = fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path)?;
    // SAFETY: flock on an fd we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let pid = fs::read_to_string(&path).unwrap_or_default();
        return Err(Error::DaemonRunning(pid.trim().to_string()));
    }
    f.set_len(0)?;
    writeln!(f, "{}", std::process::id())?;
    Ok(f)
}

/// The default rules `--rate/--burst` stand for.
fn default_rules(rate: Rate, burst: &Option<String>) -> Result<Vec<RuleSpec>> {
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

fn same_params(a: &Rule, b: &Rule) -> bool {
    Rule { rule_id: 0, counter_slot: 0, ..*a } == Rule { rule_id: 0, counter_slot: 0, ..*b }
}

impl Daemon {
    /// Everything up to and including attaching; runs before any thread.
    /// On error nothing stays changed: not the interfaces, not the file.
    pub fn start(args: &DaemonArgs) -> Result<Daemon> {
        let (mut cfg, mut specs) = Config::load(&args.config)?;
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
        let mode = args.mode.or(cfg.daemon.mode.map(Into::into)).unwrap_or(Mode::Auto);
        let max_sources = args.max_sources.or(cfg.daemon.max_sources).unwrap_or(DEFAULT_MAX_SOURCES);
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
        let lock = lock()?;
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
        let mut opts = LoadOptions { max_sources, ..Default::default() };
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
        let mut slots = Slots::default();
        for (net, k) in &kernel {
            if specs.contains_key(net) && k.counter_slot != 0 {
                slots.mark_used(k.counter_slot);
            }
        }
        let mut rules = BTreeMap::new();
        // New and changed rules, installed together in one batch below.
        let mut pending: Vec<(IpNet, Rule)> = Vec::new();
        for (net, spec) in &specs {
            let fresh = spec.kernel(0)?;
            let inst = match kernel.get(net) {
                Some(k) if same_params(k, &fresh) => {
                    Installed { spec: spec.clone(), id: k.rule_id, slot: k.counter_slot }
                }
                Some(k) => {
                    let inst = Installed { spec: spec.clone(), id: next_id, slot: k.counter_slot };
                    next_id += 1;
                    pending.push((*net, prepare(&mut policer, spec, inst.id, inst.slot)?));
                    inst
                }
                None => {
                    let slot = slots.take();
                    // A fresh program's counters are zero; an adopted one's
                    // slot may hold a removed rule's counts.
                    if slot != 0 && adopt_from.is_some() {
                        policer.reset_rule_counters(slot)?;
                    }
                    let inst = Installed { spec: spec.clone(), id: next_id, slot };
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
        cfg.daemon.interfaces = names.clone();
        let cfg = cfg.with_rules(&specs);
        if changed && let Err(e) = cfg.save(&args.config) {
            let _ = writeln!(out, "policer: warning: cannot write {}: {e}", args.config.display());
        }

        let socket = control::socket_path()?;
        let _ = fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket)?;
        fs::set_permissions(&socket, fs::Permissions::from_mode(0o600))?;
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
        let mut d = Daemon {
            policer,
            ifaces,
            rules,
            slots,
            fast: 0,
            last_flip: None,
            live_count: std::cell::Cell::new(None),
            cfg,
            config_path: args.config.clone(),
            next_id,
            persist: args.persist,
            interval: args.interval,
            socket,
            listener: Some(listener),
            metrics,
            _lock: lock,
        };
        d.sync_fast_path()?;
        Ok(d)
    }

    /// Whether every rule is for 0.0.0.0/0 or ::/0.
    fn only_defaults(&self) -> bool {
        self.rules.keys().all(|n| n.prefix_len() == 0)
    }

    /// Turns the default-rules fast path on (with the current default rules)
    /// when only default rules exist, off otherwise. The rules go into the
    /// pair not in use, then one u32 write switches readers over, so no
    /// packet sees a rule half written; switches are at least 1 ms apart so
    /// a reader of the pair before last (a program run lasts microseconds)
    /// is long gone before that pair is rewritten.
    fn sync_fast_path(&mut self) -> Result<()> {
        if !self.only_defaults() {
            if self.fast != 0 {
                self.policer.set_fast_path(0)?;
                self.fast = 0;
            }
            return Ok(());
        }
        let rule = |d: &Daemon, net: &str| -> Result<Option<Rule>> {
            let net: IpNet = net.parse().expect("literal");
            d.rules.get(&net).map(|i| Ok(i.spec.kernel(i.id)?.with_counter_slot(i.slot))).transpose()
        };
        let (v4, v6) = (rule(self, "0.0.0.0/0")?, rule(self, "::/0")?);
        let next = if self.fast == 1 { 2 } else { 1 };
        if let Some(t) = self.last_flip {
            let since = t.elapsed();
            if since < Duration::from_millis(1) {
                std::thread::sleep(Duration::from_millis(1) - since);
            }
        }
        self.policer.set_default_rules(next - 1, v4, v6)?;
        self.policer.set_fast_path(next)?;
        self.fast = next;
        self.last_flip = Some(Instant::now());
        Ok(())
    }

    fn views(&self) -> Vec<RuleView> {
        self.rules
            .values()
            .map(|Installed { spec: s, .. }| RuleView {
                prefix: s.net.to_string(),
                action: s.action.to_string(),
                rate: s.rate.map(|r| r.to_string()),
                burst: s.rate.map(|_| s.burst),
                unit: if s.rate.is_some_and(|r| r.is_bytes()) { "bytes" } else { "packets" }.into(),
                key_len: s.key_len,
            })
            .collect()
    }

    fn specs(&self) -> BTreeMap<IpNet, RuleSpec> {
        self.rules.iter().map(|(n, i)| (*n, i.spec.clone())).collect()
    }

    /// Writes the config; on failure the caller undoes its change.
    fn persist_config(&mut self, specs: &BTreeMap<IpNet, RuleSpec>) -> Result<()> {
        let cfg = self.cfg.with_rules(specs);
        cfg.save(&self.config_path)
            .map_err(|e| Error::Invalid(format!("cannot write {}: {e}; change undone", self.config_path.display())))?;
        self.cfg = cfg;
        Ok(())
    }

    /// Applies `want` (already validated) to the kernel: changed and new
    /// prefixes first, removed ones last, each one atomic for its prefix.
    fn apply(&mut self, want: &BTreeMap<IpNet, RuleSpec>) -> Result<()> {
        // A more specific prefix is about to exist: back to the tries first,
        // so no packet is judged by a default rule it no longer falls under.
        if self.fast != 0 && want.keys().any(|n| n.prefix_len() != 0) {
            self.policer.set_fast_path(0)?;
            self.fast = 0;
        }
        let r = self.apply_rules(want);
        // Whatever happened, the fast path follows the rules now in force.
        self.sync_fast_path()?;
        r
    }

    fn apply_rules(&mut self, want: &BTreeMap<IpNet, RuleSpec>) -> Result<()> {
        for (net, spec) in want {
            let slot = match self.rules.get(net) {
                Some(i) if &i.spec == spec => continue,
                Some(i) => i.slot,
                None => {
                    let slot = self.slots.take();
                    if slot != 0
                        && let Err(e) = self.policer.reset_rule_counters(slot)
                    {
                        self.slots.free(slot);
                        return Err(e);
                    }
                    slot
                }
            };
            let id = self.next_id;
            if let Err(e) = install(&mut self.policer, *net, spec, id, slot) {
                if !self.rules.contains_key(net) && slot != 0 {
                    self.slots.free(slot);
                }
                return Err(e);
            }
            self.next_id += 1;
            self.rules.insert(*net, Installed { spec: spec.clone(), id, slot });
        }
        let gone: Vec<IpNet> = self.rules.keys().filter(|n| !want.contains_key(n)).copied().collect();
        for net in gone {
            self.policer.remove_rule(net)?;
            if let Some(i) = self.rules.remove(&net)
                && i.slot != 0
            {
                self.slots.free(i.slot);
            }
        }
        Ok(())
    }

    fn rule_set(&mut self, rc: &RuleConfig) -> Result<String> {
        let spec = rc.validate()?;
        let before = self.specs();
        let mut want = before.clone();
        let net = spec.net;
        let existed = want.insert(net, spec).is_some();
        self.apply(&want)?;
        if let Err(e) = self.persist_config(&want) {
            self.apply(&before)?;
            return Err(e);
        }
        Ok(format!("{} rule for {net}", if existed { "replaced the" } else { "added a" }))
    }

    fn rule_rm(&mut self, prefix: &str) -> Result<String> {
        let net = crate::rules::parse_prefix(prefix)?;
        let before = self.specs();
        let mut want = before.clone();
        if want.remove(&net).is_none() {
            return Err(Error::Invalid(format!("no rule for {net} (see `policer rule ls`)")));
        }
        self.apply(&want)?;
        if let Err(e) = self.persist_config(&want) {
            self.apply(&before)?;
            return Err(e);
        }
        Ok(format!("removed the rule for {net}"))
    }

    /// Re-reads the config file; applies it only if all of it is valid.
    fn reload(&mut self) -> Result<String> {
        let (cfg, want) = Config::parse(
            &fs::read_to_string(&self.config_path)
                .map_err(|e| Error::Invalid(format!("{}: {e}", self.config_path.display())))?,
            &self.config_path,
        )?;
        if want.is_empty() {
            return Err(Error::Invalid(format!("{}: no rules; nothing changed", self.config_path.display())));
        }
        let before = self.specs();
        if let Err(e) = self.apply(&want) {
            let _ = self.apply(&before);
            return Err(e);
        }
        let note = if cfg.daemon != self.cfg.daemon { " ([daemon] settings apply at the next start)" } else { "" };
        self.cfg = cfg;
        Ok(format!("reloaded {}: {} rules{note}", self.config_path.display(), want.len()))
    }

    /// Detaches `name`; true when no interface is left.
    fn detach(&mut self, name: &str) -> Result<bool> {
        let pos = self
            .ifaces
            .iter()
            .position(|i| i.name == name)
            .ok_or_else(|| Error::Invalid(format!("{name} is not policed by this daemon")))?;
        let fd = self.policer.prog_fd()?;
        let i = &self.ifaces[pos];
        netlink::set(i.index, -1, i.mode_flags, Some(fd))
            .map_err(|source| Error::Netlink { iface: name.into(), source })?;
        self.ifaces.remove(pos);
        self.cfg.daemon.interfaces.retain(|n| n != name);
        let specs = self.specs();
        let _ = self.persist_config(&specs);
        Ok(self.ifaces.is_empty())
    }

    /// One sample of every counter.
    pub fn stats(&self) -> Result<StatsView> {
        let time_ns = monotonic_ns();
        let slots = self.policer.iface_counters()?;
        let mut total = Counters::default();
        for (_, c) in &slots {
            total.add(c);
        }
        let interfaces = self
            .ifaces
            .iter()
            .map(|i| {
                let c = slots.iter().find(|(s, _)| *s == i.index % MAX_IFACE_SLOTS).map(|x| x.1).unwrap_or_default();
                iface_stats(&i.name, i.index, &c)
            })
            .collect();
        let rc: BTreeMap<u32, RuleCounters> = self.policer.rule_counters()?.into_iter().collect();
        let rules = self
            .rules
            .iter()
            .map(|(net, i)| {
                let c = rc.get(&i.slot).copied().unwrap_or_default();
                RuleStats {
                    prefix: net.to_string(),
                    action: i.spec.action.to_string(),
                    counters: CountersView::from(&c),
                    rates: None,
                }
            })
            .collect();
        let table = TableStats {
            capacity: self.policer.max_sources()? as u64,
            created: total.buckets_created,
            live: None,
            insert_failures: total.bucket_insert_failed,
        };
        Ok(StatsView { time_ns, totals: iface_stats("total", 0, &total), interfaces, rules, table })
    }

    /// The `n` sources with the most debt and the most drops.
    pub fn top(&self, n: usize) -> Result<TopView> {
        let t0 = Instant::now();
        let now = monotonic_ns();
        struct Row {
            key: BucketKey,
            fill: u64,
            debt_ns: u64,
            drops: u64,
        }
        let mut rows = Vec::new();
        self.policer.for_each_bucket(|k, b| {
            rows.push(Row { key: *k, fill: b.fill_q16(now), debt_ns: b.debt_ns(now), drops: b.drops() })
        })?;
        let live = rows.len() as u64;
        let read_ms = t0.elapsed().as_secs_f64() * 1e3;
        let entry = |r: &Row| TopEntry {
            source: bucket_source(&r.key),
            rule: self.rule_for(&r.key).map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            debt_ns: r.debt_ns,
            fill: r.fill as f64 / 65536.0,
            drops: r.drops,
        };
        let mut pick = |key: &dyn Fn(&Row) -> (u64, u64)| -> Vec<TopEntry> {
            let k = n.min(rows.len());
            if k == 0 {
                return vec![];
            }
            rows.select_nth_unstable_by(k - 1, |a, b| key(b).cmp(&key(a)));
            let mut top: Vec<&Row> = rows[..k].iter().filter(|r| key(r) != (0, 0)).collect();
            top.sort_by_key(|r| std::cmp::Reverse(key(r)));
            top.into_iter().map(entry).collect()
        };
        let by_debt = pick(&|r| (r.fill, r.debt_ns));
        let by_drops = pick(&|r| (r.drops, r.fill));
        Ok(TopView { time_ns: now, live, read_ms, by_debt, by_drops })
    }

    /// The rule (longest prefix) a bucket's source falls under now.
    fn rule_for(&self, k: &BucketKey) -> Option<IpNet> {
        let addr = key_addr(k);
        self.rules.keys().filter(|n| n.contains(&addr)).max_by_key(|n| n.prefix_len()).copied()
    }

    fn handle(&mut self, req: Request) -> (Response, bool) {
        let r = match req {
            Request::RuleSet { rule } => self.rule_set(&rule).map(Response::ok),
            Request::RuleRm { prefix } => self.rule_rm(&prefix).map(Response::ok),
            Request::RuleLs => Ok(Response { ok: true, rules: self.views(), ..Default::default() }),
            Request::Reload => self.reload().map(Response::ok),
            Request::Status => Ok(Response {
                ok: true,
                status: Some(StatusView {
                    pid: std::process::id(),
                    interfaces: self.ifaces.iter().map(|i| i.name.clone()).collect(),
                    config: self.config_path.display().to_string(),
                    rules: self.rules.len(),
                    persist: self.persist,
                }),
                ..Default::default()
            }),
            Request::Stats => self.stats().map(|s| Response { ok: true, stats: Some(s), ..Default::default() }),
            Request::Top { n } => self.top(n).map(|t| Response { ok: true, top: Some(t), ..Default::default() }),
            Request::Detach { iface } => match self.detach(&iface) {
                Ok(last) => {
                    let msg = if last {
                        format!("detached from {iface}; no interface left, the daemon exits")
                    } else {
                        format!("detached from {iface}")
                    };
                    return (Response::ok(msg), last);
                }
                Err(e) => Err(e),
            },
        };
        (r.unwrap_or_else(Response::err), false)
    }

    /// Runs until SIGINT/SIGTERM (or the last interface is detached).
    pub async fn serve(mut self) -> Result<()> {
        // Rare kernel events (sampled in the program) go to the log.
        match aya_log::EbpfLogger::init(&mut self.policer.ebpf) {
            Ok(logger) => {
                // SAFETY: the logger owns its ring buffer fd and flushing
                // neither closes nor replaces it.
                match unsafe { tokio::io::unix::AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) }
                {
                    Ok(mut fd) => {
                        tokio::spawn(async move {
                            while let Ok(mut guard) = fd.readable_mut().await {
                                guard.get_inner_mut().flush();
                                guard.clear_ready();
                            }
                        });
                    }
                    Err(e) => log::warn!("kernel event log unavailable: {e}"),
                }
            }
            Err(e) => log::warn!("kernel event log unavailable: {e}"),
        }
        let listener = self.listener.take().expect("bound at start");
        listener.set_nonblocking(true)?;
        let listener = tokio::net::UnixListener::from_std(listener)?;
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let mut sighup = signal(SignalKind::hangup())?;
        let started = Instant::now();
        let period = if self.interval > 0.0 { self.interval } else { 3600.0 };
        let mut tick = tokio::time::interval(Duration::from_secs_f64(period));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut prev = self.policer.counters()?;
        let mut prev_at = Instant::now();
        let mut last_detached = false;
        let metrics = match self.metrics.take() {
            Some(m) => {
                m.set_nonblocking(true)?;
                Some(tokio::net::TcpListener::from_std(m)?)
            }
            None => None,
        };
        loop {
            tokio::select! {
                conn = async { metrics.as_ref().expect("guarded").accept().await }, if metrics.is_some() => {
                    if let Ok((stream, _)) = conn {
                        self.serve_metrics(stream).await;
                    }
                }
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
                _ = sighup.recv() => match self.reload() {
                    Ok(m) => println!("policer: SIGHUP: {m}"),
                    Err(e) => println!("policer: SIGHUP: reload refused, nothing changed: {e}"),
                },
                conn = listener.accept() => {
                    let Ok((stream, _)) = conn else { continue };
                    let Ok(stream) = stream.into_std() else { continue };
                    if self.serve_one(stream) {
                        last_detached = true;
                        break;
                    }
                }
                _ = tick.tick(), if self.interval > 0.0 => {
                    let now = self.policer.counters()?;
                    let dt = prev_at.elapsed().as_secs_f64();
                    println!("{}", format_line(started.elapsed(), &now, &prev, dt));
                    prev = now;
                    prev_at = Instant::now();
                }
            }
        }
        let last = self.policer.counters()?;
        println!("{}", format_line(started.elapsed(), &last, &prev, prev_at.elapsed().as_secs_f64()));
        let _ = fs::remove_file(&self.socket);
        if last_detached {
            println!("policer: no interface left; exiting");
        } else if self.persist {
            println!(
                "policer: exiting; XDP stays attached on {} and keeps policing (`policer detach IFACE` removes it)",
                self.ifaces.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
            );
        } else {
            let fd = self.policer.prog_fd()?;
            for i in &self.ifaces {
                if let Err(e) = netlink::set(i.index, -1, i.mode_flags, Some(fd)) {
                    eprintln!("policer: {}: cannot detach: {e}", i.name);
                }
            }
            println!(
                "policer: detached from {}",
                self.ifaces.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(", ")
            );
        }
        Ok(())
    }

    /// (live buckets, buckets evicted so far): a count at most
    /// [`LIVE_COUNT_MAX_AGE`] old (taking one reads the table whole).
    /// `created` is the buckets-created counter read just before.
    fn live_buckets(&self, created: u64) -> (u64, u64) {
        let prev = self.live_count.get();
        if let Some((at, live, evicted)) = prev
            && at.elapsed() < LIVE_COUNT_MAX_AGE
        {
            return (live, evicted);
        }
        let mut live = 0;
        let _ = self.policer.for_each_bucket(|_, _| live += 1);
        // Evicted = created - live. Buckets made while the table was read
        // can make one count low; the counter never goes back.
        let evicted = created.saturating_sub(live).max(prev.map_or(0, |p| p.2));
        self.live_count.set(Some((Instant::now(), live, evicted)));
        (live, evicted)
    }

    /// One HTTP exchange on the metrics port.
    async fn serve_metrics(&self, mut stream: tokio::net::TcpStream) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 4096];
        let mut got = 0;
        let read = tokio::time::timeout(Duration::from_secs(5), async {
            while got < buf.len() {
                match stream.read(&mut buf[got..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        got += n;
                        if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                            break;
                        }
                    }
                }
            }
        })
        .await;
        if read.is_err() {
            return;
        }
        let req = String::from_utf8_lossy(&buf[..got]);
        let mut parts = req.split_whitespace();
        let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        let (status, ctype, body) = if method != "GET" {
            ("405 Method Not Allowed", "text/plain", "only GET\n".to_string())
        } else if path != "/metrics" && !path.starts_with("/metrics?") {
            ("404 Not Found", "text/plain", "see /metrics\n".to_string())
        } else {
            match self.stats() {
                Ok(s) => {
                    let (live, evicted) = self.live_buckets(s.table.created);
                    ("200 OK", crate::metrics::CONTENT_TYPE, crate::metrics::render(&s, live, evicted))
                }
                Err(e) => ("500 Internal Server Error", "text/plain", format!("{e}\n")),
            }
        };
        let head = format!(
            "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = stream.write_all(head.as_bytes()).await;
        let _ = stream.write_all(body.as_bytes()).await;
        let _ = stream.shutdown().await;
    }

    /// One control request; true when the daemon should exit.
    fn serve_one(&mut self, stream: std::os::unix::net::UnixStream) -> bool {
        let _ = stream.set_nonblocking(false);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
        let mut line = String::new();
        if BufReader::new(&stream).read_line(&mut line).is_err() {
            return false;
        }
        let (resp, exit) = match serde_json::from_str::<Request>(&line) {
            Ok(req) => self.handle(req),
            Err(e) => (Response::err(format!("bad request: {e}")), false),
        };
        let mut w = &stream;
        let mut text = serde_json::to_string(&resp).unwrap_or_else(|_| "{\"ok\":false}".into());
        text.push('\n');
        let _ = w.write_all(text.as_bytes());
        exit
    }
}

/// Installs a rule (one atomic update of its prefix), after setting the
/// new-source limiter of its counter slot.
fn install(p: &mut Policer, net: IpNet, spec: &RuleSpec, id: u32, slot: u32) -> Result<()> {
    let rule = prepare(p, spec, id, slot)?;
    p.set_rule(net, &rule)
}

/// Sets the new-source limiter of the rule's counter slot; returns the
/// kernel value of the rule, ready to install.
fn prepare(p: &mut Policer, spec: &RuleSpec, id: u32, slot: u32) -> Result<Rule> {
    // Rate and burst in the same unit: packets, or bytes in byte mode.
    let rate = match (spec.action.polices(), spec.rate) {
        (true, Some(Rate::Pps(r))) => Some(r),
        (true, Some(Rate::Bps(b))) => Some(b / 8),
        _ => None,
    };
    let ns = match rate {
        Some(r) => NewSources::for_rule(r, spec.burst, p.max_sources()?, monotonic_ns()),
        None => NewSources::default(),
    };
    // Rules past the last counter slot share slot 0 and its limiter: set
    // it once, not once per rule (100 000 rules would mean 96 000 writes).
    if slot != 0 || !p.shared_slot_set {
        p.set_new_sources(slot, &ns)?;
        p.shared_slot_set |= slot == 0;
    }
    Ok(spec.kernel(id)?.with_counter_slot(slot))
}

/// CLOCK_MONOTONIC in ns: the clock `bpf_ktime_get_ns` reads.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn iface_stats(name: &str, ifindex: u32, c: &Counters) -> IfaceStats {
    IfaceStats {
        name: name.into(),
        ifindex,
        counters: CountersView::from(&c.verdicts()),
        unmatched_packets: c.unmatched_pkts,
        non_ip_packets: c.non_ip_pkts,
        malformed_packets: c.malformed_pkts,
        fragment_packets: c.fragment_pkts,
        bucket_insert_failures: c.bucket_insert_failed,
        cas_retries: c.cas_retries,
        cas_exhausted: c.cas_exhausted,
        new_sources_limited: c.new_sources_limited,
        rates: None,
    }
}

fn key_addr(k: &BucketKey) -> std::net::IpAddr {
    if k.family == FAMILY_V4 {
        std::net::Ipv4Addr::new(k.addr[0], k.addr[1], k.addr[2], k.addr[3]).into()
    } else {
        std::net::Ipv6Addr::from(k.addr).into()
    }
}

/// A bucket's key as text: the address, or a prefix when sources are grouped.
fn bucket_source(k: &BucketKey) -> String {
    let a = key_addr(k);
    let full = if a.is_ipv4() { 32 } else { 128 };
    if k.key_len >= full { a.to_string() } else { format!("{a}/{}", k.key_len) }
}

/// Attaches fresh (never over another program), trying modes in order.
fn attach_fresh(name: &str, index: u32, fd: RawFd, mode: Mode) -> Result<u32> {
    let mut last = None;
    for &m in mode.tries() {
        match netlink::set(index, fd, XDP_FLAGS_UPDATE_IF_NOEXIST | m, None) {
            Ok(()) => return Ok(m),
            Err(e) => match e.errno {
                libc::EBUSY | libc::EEXIST => {
                    return Err(Error::AlreadyAttached { iface: name.into() });
                }
                libc::EPERM | libc::EACCES => return Err(Error::NotRoot("attaching XDP")),
                libc::EOPNOTSUPP | libc::EINVAL => {
                    last = Some(Error::ModeUnsupported { iface: name.into(), mode: Mode::flag_name(m) });
                }
                _ => {
                    return Err(Error::Netlink { iface: name.into(), source: e });
                }
            },
        }
    }
    Err(last.expect("at least one mode"))
}

/// `policer detach IFACE` with no daemon running: remove the policer
/// program left attached (never another program).
pub fn detach_orphan(name: &str) -> Result<String> {
    if !is_root() {
        return Err(Error::NotRoot("detaching XDP"));
    }
    let index = if_index(name)?;
    let st = netlink::query(index).map_err(|source| Error::Netlink { iface: name.into(), source })?;
    let Some(st) = st else {
        return Err(Error::Invalid(format!("no XDP program is attached to {name}")));
    };
    let found = find(st.prog_id)
        .ok_or_else(|| Error::Invalid(format!("the XDP program on {name} is not policer's; leaving it alone")))?;
    let fd: OwnedFd = found.prog_fd.as_fd().try_clone_to_owned()?;
    netlink::set(index, -1, st.mode_flags, Some(fd.as_raw_fd()))
        .map_err(|source| Error::Netlink { iface: name.into(), source })?;
    Ok(format!("detached policer (program {}) from {name}", found.prog_id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_reused_lowest_first_and_overflow_to_zero() {
        let mut s = Slots::default();
        s.mark_used(1);
        assert_eq!(s.take(), 2);
        assert_eq!(s.take(), 3);
        s.free(2);
        assert_eq!(s.take(), 2);
        for _ in 4..MAX_RULE_SLOTS {
            assert_ne!(s.take(), 0);
        }
        assert_eq!(s.take(), 0);
        s.free(0);
        assert_eq!(s.take(), 0, "slot 0 is shared, never handed out as free");
    }
}
