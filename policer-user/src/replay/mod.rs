//! `policer replay`: a capture's frames through the real XDP program
//! (BPF_PROG_TEST_RUN), the capture's own timestamps as the program's clock,
//! with the rules, classes, bans and sets of a config file (or
//! `--rate/--burst`), and the sets saved in the state directory (`rule
//! import`'s, the `[crowdsec]` feed's), installed as a start installs them
//! ([`crate::daemon::read_offline`], [`crate::daemon::install_offline`]).
//!
//! Frames go in batches (`policer_common::replay`): up to 2 048 records in
//! an mmapped array, judged by the object's replay entry up to 34 to a test
//! run (the policer's own function on each, then a tail call to the next):
//! the frame's time goes in its metadata (the test clock reads it there,
//! `policer_common::verdict`'s `TEST_META_*`), and the program writes back
//! the counter slot of the rule that judged it and its verdict (pass,
//! would-drop, drop). That is counted
//! for the frame's source and for that rule (or set). Nothing is attached;
//! the program and its maps go away at the end.

pub mod pcap;

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::Instant,
};

use aya::programs::{TestRun, TestRunOptions};
use policer_common::{
    DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES,
    replay::{REPLAY_HEAD, REPLAY_MIN_LEN, REPLAY_NOT_RUN, ReplayCtl, ReplayFrame},
    verdict::{TEST_META_LEN, Verdict, from_test_meta_code},
};
use serde::Serialize;

use crate::{
    config::Config,
    daemon::{LeftOut, OfflineRule, OfflineSet, OfflineSets, SetSource, default_rules, install_offline, read_offline},
    error::{Error, Result},
    loader::{LoadOptions, Policer},
    rules::{RuleKey, RuleSpec},
};
use pcap::Capture;

/// XDP verdicts (`enum xdp_action`).
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// The program's clock at the capture's first frame: the time since boot
/// of a machine up for a while, so that nothing the program computes back
/// from "now" (a full bucket, a limiter's window) runs into zero.
const CLOCK_START_NS: u64 = 1_000_000_000_000;

/// What to replay, against which rules: a config file's (its `[[rule]]`s
/// and `protect`), with `--rate/--burst` for the default rules over them,
/// as `policer attach` takes them, and the sets saved in a state
/// directory (`policer attach --state-dir`).
#[derive(Clone, Debug)]
pub struct Options {
    pub capture: PathBuf,
    pub config: Option<PathBuf>,
    /// The daemon's state directory: its saved sets are installed as a
    /// start installs them (none when it does not exist).
    pub state_dir: PathBuf,
    pub rate: Option<policer_common::rate::Rate>,
    pub burst: Option<String>,
    /// Dropped sources listed (0: every source tracked).
    pub top: usize,
    /// The report is JSON (no progress bar).
    pub json: bool,
}

/// Frames and bytes, by what the program did with them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Tally {
    pub frames: u64,
    pub bytes: u64,
    pub admitted_frames: u64,
    pub admitted_bytes: u64,
    pub dropped_frames: u64,
    pub dropped_bytes: u64,
    /// Admitted under a `monitor` rule that would have dropped them.
    pub would_drop_frames: u64,
    pub would_drop_bytes: u64,
    /// The capture's time (ns since the Unix epoch) of the first and last
    /// frame dropped (or, under `monitor`, that would have been).
    pub first_drop_ns: Option<u64>,
    pub last_drop_ns: Option<u64>,
}

/// One frame's fate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Admitted,
    Dropped,
    WouldDrop,
}

impl Tally {
    fn add(&mut self, fate: Fate, len: u32, ts_ns: u64) {
        let len = u64::from(len);
        self.frames += 1;
        self.bytes += len;
        match fate {
            Fate::Admitted | Fate::WouldDrop => {
                self.admitted_frames += 1;
                self.admitted_bytes += len;
            }
            Fate::Dropped => {
                self.dropped_frames += 1;
                self.dropped_bytes += len;
            }
        }
        if fate == Fate::WouldDrop {
            self.would_drop_frames += 1;
            self.would_drop_bytes += len;
        }
        if fate != Fate::Admitted {
            self.first_drop_ns.get_or_insert(ts_ns);
            self.last_drop_ns = Some(ts_ns);
        }
    }
}

/// A rule's line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct RuleReport {
    /// As `rule ls` names it (`10.0.0.0/8`, `ban 192.0.2.0/24`).
    pub rule: String,
    pub action: String,
    pub rate: Option<String>,
    pub burst: u64,
    #[serde(flatten)]
    pub tally: Tally,
}

/// A source's line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct SourceReport {
    pub source: IpAddr,
    /// The rule (or `set NAME`, `protect`) of its last frame, as the
    /// program reported it; `None`: no rule covers it.
    pub rule: Option<String>,
    /// Counted from its first frame. `false`: it was first counted after
    /// the source table let records go, so frames of it may be missing.
    pub exact: bool,
    #[serde(flatten)]
    pub tally: Tally,
}

/// A named set the replay installed, and where it was read.
#[derive(Clone, Debug, Serialize)]
pub struct SetReport {
    pub name: String,
    /// `config` (a `[[set]]`: its list file), `saved` (a `rule import`'s
    /// state file in the state directory) or `feed` (the `[crowdsec]`
    /// feed's set as saved there).
    pub source: SetSource,
    pub file: PathBuf,
    pub entries: u64,
    pub action: String,
    pub rate: Option<String>,
}

/// The `[crowdsec]` feed's set in the replay: its saved set, or empty.
#[derive(Clone, Debug, Serialize)]
pub struct FeedReport {
    pub set: String,
    /// Its state file in the state directory.
    pub file: PathBuf,
    /// A saved set was found and installed; `false`: the set is empty.
    pub saved: bool,
    pub entries: u64,
    /// Always `false`: a replay never asks the Local API.
    pub live_decisions_fetched: bool,
}

/// What a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub capture: PathBuf,
    /// The state directory whose saved sets were read, and whether it
    /// exists (when not: no saved sets).
    pub state_dir: PathBuf,
    pub state_dir_exists: bool,
    /// The named sets installed, in the order a start installs them.
    pub sets: Vec<SetReport>,
    /// Saved sets a start would leave out (ended, or replaced by a
    /// config set of their name), so the replay did.
    pub sets_left_out: Vec<LeftOut>,
    /// With a `[crowdsec]` config: the feed's set.
    pub feed: Option<FeedReport>,
    /// Every frame of the capture.
    #[serde(flatten)]
    pub total: Tally,
    /// Frames without an IPv4 or IPv6 source (ARP, ...): the program
    /// passes them; they are in the totals, under no rule or source.
    pub not_ip_frames: u64,
    /// Frames longer than a test run takes, replayed clipped (their
    /// headers intact; a byte-mode rule saw the clipped length).
    pub clipped_frames: u64,
    /// Frames of an IP source that no rule covers (passed).
    pub no_rule_frames: u64,
    /// Rules with SYN cookies (`--syn-cookies`), replayed as without them:
    /// the replay answers no SYN (docs/syn-cookies.md).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syn_cookies_not_replayed: Vec<String>,
    /// The capture's first and last timestamps (ns since the Unix epoch).
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// Distinct sources seen; `None` when the source table let records go
    /// (more sources than it holds: see `sources_let_go`).
    pub sources: Option<u64>,
    /// Sources in the table at the end (at most [`SOURCE_TABLE`], or twice
    /// `--top`).
    pub sources_tracked: u64,
    /// Source records let go to keep the table bounded (those with the
    /// fewest drops). Their frames are in the totals and the rules' lines.
    pub sources_let_go: u64,
    pub rules: Vec<RuleReport>,
    /// The sources with the most drops (then would-drops), most first,
    /// among those tracked.
    pub top_dropped: Vec<SourceReport>,
    /// Wall time of the replay, and frames per second of it.
    pub elapsed_secs: f64,
    pub frames_per_sec: f64,
}

/// The most sources the per-source table holds (or twice `--top`, if
/// more): about 120 bytes each (address, tally, the hash table's slack),
/// so some 8 MiB whatever the capture holds. When it is full, the half
/// with the fewest drops is let go ([`Sources::evict`]): the heaviest
/// droppers stay, and the report says how many records were let go.
pub const SOURCE_TABLE: usize = 1 << 16;

/// The per-source tally, bounded ([`SOURCE_TABLE`]).
struct Sources {
    map: HashMap<IpAddr, SourceTally>,
    capacity: usize,
    /// Records let go to stay within `capacity`.
    evicted: u64,
}

/// A source's tally, and whether it has been counted since its first frame.
#[derive(Clone, Copy)]
struct SourceTally {
    /// The counter slot of the rule of its last frame (`None`: no rule).
    slot: Option<u32>,
    /// Tracked from its first frame: nothing of it was let go before.
    exact: bool,
    tally: Tally,
}

/// How a source ranks for the top list: drops, then would-drops.
fn weight(t: &Tally) -> (u64, u64) {
    (t.dropped_frames, t.would_drop_frames)
}

impl Sources {
    fn new(top: usize) -> Sources {
        let capacity = SOURCE_TABLE.max(top.saturating_mul(2));
        Sources { map: HashMap::with_capacity(capacity.min(SOURCE_TABLE)), capacity, evicted: 0 }
    }

    /// The tally of `src` (a new record when it has none).
    fn get(&mut self, src: IpAddr) -> &mut SourceTally {
        if self.map.len() >= self.capacity && !self.map.contains_key(&src) {
            self.evict();
        }
        // A source first seen after a record was let go may be one of them.
        let exact = self.evicted == 0;
        self.map.entry(src).or_insert(SourceTally { slot: None, exact, tally: Tally::default() })
    }

    /// Lets go of the half of the records with the fewest drops (then
    /// would-drops, then frames): amortised, a record costs O(log n).
    fn evict(&mut self) {
        let mut w: Vec<(u64, u64, u64)> =
            self.map.values().map(|s| (weight(&s.tally).0, weight(&s.tally).1, s.tally.frames)).collect();
        let mid = w.len() / 2;
        let (_, cut, _) = w.select_nth_unstable(mid);
        let cut = *cut;
        let before = self.map.len();
        // Strictly below the median first; ties at it go until half is free.
        self.map.retain(|_, s| (weight(&s.tally).0, weight(&s.tally).1, s.tally.frames) >= cut);
        let mut excess = self.map.len().saturating_sub(self.capacity / 2);
        if excess > 0 {
            self.map.retain(|_, s| {
                if excess > 0 && (weight(&s.tally).0, weight(&s.tally).1, s.tally.frames) == cut {
                    excess -= 1;
                    false
                } else {
                    true
                }
            });
        }
        self.evicted += (before - self.map.len()) as u64;
    }
}

/// What a replay installs, read and checked before anything is loaded.
struct Inputs {
    specs: BTreeMap<RuleKey, RuleSpec>,
    cfg: Config,
    sets: OfflineSets,
}

/// The rules to install: the config's, and `--rate/--burst` over its
/// default rules; the named sets: the state directory's saved sets (the
/// feed's among them) and the config's `[[set]]`s. Bad input is refused
/// here, before anything is loaded.
fn inputs(o: &Options) -> Result<Inputs> {
    let Options { config, rate, burst, state_dir, .. } = o;
    let (cfg, mut specs) = match config {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|source| Error::ConfigRead { path: p.clone(), source })?;
            Config::parse(&text, p)?
        }
        None => (Config::default(), BTreeMap::new()),
    };
    match rate {
        Some(rate) => {
            for s in default_rules(*rate, burst)? {
                specs.insert(s.key(), s);
            }
        }
        None if burst.is_some() => return Err(Error::Invalid("--burst needs --rate".into())),
        None => {}
    }
    // The feed's set is replayed as saved: its name and action only (no
    // secret is read, no Local API asked).
    let feed = cfg.crowdsec.as_ref().map(|c| c.feed_set()).transpose()?;
    let config_path = config.clone().unwrap_or_default();
    let sets = read_offline(state_dir, &config_path, &cfg.sets, feed, crate::duration::unix_ms())?;
    if specs.is_empty() && sets.is_empty() && sets.feed.is_none() {
        return Err(Error::Invalid(format!(
            "nothing to replay against: give --config FILE with rules, or --rate (and --burst); the state \
             directory {} holds no saved set{}",
            state_dir.display(),
            if sets.state_dir_exists { "" } else { " (it does not exist)" }
        )));
    }
    Ok(Inputs { specs, cfg, sets })
}

/// The program's clock for a frame at `ts_ns`, the first at `first_ns`.
fn clock(first_ns: u64, ts_ns: u64) -> u64 {
    // A frame older than the first (a capture merged out of order) sets the
    // clock back, as a clock read on another CPU can: the program handles it.
    // Never 0: the program reads 0 in the metadata as "no time given".
    (i128::from(CLOCK_START_NS) + i128::from(ts_ns) - i128::from(first_ns)).clamp(1, i128::from(u64::MAX)) as u64
}

/// The source address of an Ethernet frame (after up to two VLAN tags), as
/// the program parses it; `None` for anything but IPv4 and IPv6.
pub fn source_of(f: &[u8]) -> Option<IpAddr> {
    let mut off = 12;
    let mut ethertype = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
    for _ in 0..2 {
        if ethertype != 0x8100 && ethertype != 0x88a8 {
            break;
        }
        off += 4;
        ethertype = u16::from_be_bytes([*f.get(off)?, *f.get(off + 1)?]);
    }
    let ip = off + 2;
    match ethertype {
        0x0800 => {
            let a: [u8; 4] = f.get(ip + 12..ip + 16)?.try_into().ok()?;
            Some(IpAddr::V4(Ipv4Addr::from(a)))
        }
        0x86dd => {
            let a: [u8; 16] = f.get(ip + 8..ip + 24)?.try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(a)))
        }
        _ => None,
    }
}

/// A batch of frames (policer_common::replay): the records in the mmapped
/// frames map, filled here, judged in test runs of up to
/// `REPLAY_FRAMES_PER_RUN` frames and read back after the last, and each
/// frame's capture time beside them.
struct Batch {
    frames: Mapping<ReplayFrame>,
    ctl: Mapping<ReplayCtl>,
    ts: Vec<u64>,
    /// The test run's frame at the start of a run (metadata, then a
    /// minimal Ethernet frame; the program sizes it for each frame).
    data: Vec<u8>,
    ctx: [u8; 24],
}

/// A shared mapping of an mmapable array map's `len` entries, unmapped on
/// drop. The kernel and this process both write it, never at once: the
/// program runs only inside a test run.
struct Mapping<T> {
    base: *mut T,
    len: usize,
    bytes: usize,
}

impl<T> Mapping<T> {
    fn new(p: &Policer, name: &'static str, len: usize) -> Result<Mapping<T>> {
        let fd = crate::loader::map_fd(&p.ebpf, name)?;
        let bytes = (len * size_of::<T>()).next_multiple_of(4096);
        // SAFETY: a shared mapping of a BPF_F_MMAPABLE array map of at least
        // `len` entries of `T` (sized so at load), checked below.
        let base = unsafe {
            libc::mmap(std::ptr::null_mut(), bytes, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0)
        };
        if base == libc::MAP_FAILED {
            return Err(Error::kernel(format!("mapping {name}"))(std::io::Error::last_os_error()));
        }
        Ok(Mapping { base: base.cast(), len, bytes })
    }

    fn get(&mut self) -> &mut [T] {
        // SAFETY: `len` entries in the mapping, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.base, self.len) }
    }

    /// Reads entry `i` as the kernel last wrote it.
    fn read(&self, i: usize) -> T {
        assert!(i < self.len);
        // SAFETY: in the mapping.
        unsafe { std::ptr::read_volatile(self.base.add(i)) }
    }
}

impl<T> Drop for Mapping<T> {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        unsafe { libc::munmap(self.base.cast(), self.bytes) };
    }
}

impl Batch {
    fn new(p: &Policer) -> Result<Batch> {
        use policer_common::replay::{MAP_REPLAY_CTL, MAP_REPLAY_FRAMES, REPLAY_BATCH};
        let frames = Mapping::new(p, MAP_REPLAY_FRAMES, REPLAY_BATCH as usize)?;
        let ctl = Mapping::new(p, MAP_REPLAY_CTL, 1)?;
        let mut data = vec![0u8; TEST_META_LEN + 60];
        // An IPv4 EtherType (the program reads nothing of it before the
        // first frame's bytes replace it).
        data[TEST_META_LEN + 12] = 0x08;
        let mut ctx = [0u8; 24];
        // struct xdp_md { data, data_end, data_meta, ingress_ifindex,
        // rx_queue_index, egress_ifindex }: offsets into data_in; data_meta
        // must be 0, the metadata is what lies before `data`.
        ctx[0..4].copy_from_slice(&(TEST_META_LEN as u32).to_ne_bytes());
        ctx[4..8].copy_from_slice(&(data.len() as u32).to_ne_bytes());
        Ok(Batch { frames, ctl, ts: Vec::with_capacity(REPLAY_BATCH as usize), data, ctx })
    }

    fn full(&self) -> bool {
        self.ts.len() == self.frames.len
    }

    /// Adds a frame (at least REPLAY_MIN_LEN long) at `now_ns` on the
    /// program's clock.
    fn push(&mut self, frame: &[u8], now_ns: u64, ts_ns: u64) {
        let i = self.ts.len();
        let r = &mut self.frames.get()[i];
        let head = frame.len().min(REPLAY_HEAD);
        r.now = now_ns;
        r.len = frame.len() as u32;
        r.head_len = head as u32;
        r.ret = REPLAY_NOT_RUN;
        r.slot = u32::MAX;
        r.verdict = u32::MAX;
        r.head[..head].copy_from_slice(&frame[..head]);
        self.ts.push(ts_ns);
    }

    /// Runs the batch and counts each frame's verdict, in order.
    fn flush(&mut self, p: &mut Policer, count: &mut Counting) -> Result<()> {
        use policer_common::replay::REPLAY_PROGRAM;
        let n = self.ts.len() as u32;
        if n == 0 {
            return Ok(());
        }
        self.ctl.get()[0] = ReplayCtl { next: 0, count: n };
        let prog: &mut aya::programs::Xdp = p
            .ebpf
            .program_mut(REPLAY_PROGRAM)
            .and_then(|p| p.try_into().ok())
            .ok_or(Error::Missing("replay program"))?;
        // Each test run judges up to REPLAY_FRAMES_PER_RUN frames (one
        // per tail call) from the cursor on; `repeat` stays 1 (a repeat
        // swaps the program into the kernel's XDP dispatcher and out again,
        // each a synchronize_rcu: milliseconds).
        let mut done = 0;
        while done < n {
            let run = prog.test_run(TestRunOptions {
                data_in: Some(&self.data),
                ctx_in: Some(&self.ctx),
                ..Default::default()
            });
            let next = self.ctl.read(0).next;
            if next <= done {
                return Err(match run {
                    Err(e) => Error::Program(Box::new(e)),
                    Ok(_) => Error::Invalid(format!("the replay program stopped at frame {next} of a batch")),
                });
            }
            done = next;
        }
        let ts = std::mem::take(&mut self.ts);
        for (r, &ts_ns) in self.frames.get().iter().zip(&ts) {
            if r.ret == REPLAY_NOT_RUN {
                return Err(Error::Invalid(
                    "the replay program could not make a frame of the batch (adjust_tail or store_bytes refused it)"
                        .into(),
                ));
            }
            let judged = from_test_meta_code(r.verdict).map(|v| (r.slot, v));
            count.count(ts_ns, r.len, &r.head[..r.head_len as usize], r.ret, judged)?;
        }
        self.ts = ts;
        self.ts.clear();
        Ok(())
    }
}

/// A progress bar on stderr while the capture is read (by bytes of the
/// file), when both stdout and stderr are terminals and the report is
/// not JSON; otherwise nothing.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new(show: bool, len: u64) -> Progress {
        use std::io::IsTerminal;
        if !show || !std::io::stderr().is_terminal() || !std::io::stdout().is_terminal() {
            return Progress(None);
        }
        let bar = indicatif::ProgressBar::with_draw_target(Some(len), indicatif::ProgressDrawTarget::stderr());
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{bytes}/{total_bytes} [{bar:40}] {percent}% {binary_bytes_per_sec}, {msg} (eta {eta})",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        Progress(Some(bar))
    }

    fn set(&self, bytes: u64, frames: u64) {
        if let Some(b) = &self.0 {
            b.set_position(bytes);
            b.set_message(format!("{frames} frames"));
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}

/// What a rule slot is, for the report: the rule, or the set, it is.
fn slot_names(installed: &[OfflineRule], sets: &[OfflineSet]) -> HashMap<u32, String> {
    let mut m: HashMap<u32, String> = installed.iter().map(|i| (i.slot, i.key.to_string())).collect();
    for s in sets {
        m.insert(s.slot, format!("set {}", s.name));
    }
    m
}

/// The report as the frames' verdicts come back, in capture order.
struct Counting {
    r: Report,
    per_rule: Vec<Tally>,
    sources: Sources,
}

impl Counting {
    /// Nothing counted yet, of the capture at `capture`, with `slots` rule
    /// slots and the per-source table for `--top` `top`.
    fn new(capture: PathBuf, slots: usize, top: usize) -> Counting {
        let r = Report {
            capture,
            state_dir: PathBuf::new(),
            state_dir_exists: false,
            sets: Vec::new(),
            sets_left_out: Vec::new(),
            feed: None,
            total: Tally::default(),
            not_ip_frames: 0,
            clipped_frames: 0,
            no_rule_frames: 0,
            syn_cookies_not_replayed: Vec::new(),
            first_ns: None,
            last_ns: None,
            sources: None,
            sources_tracked: 0,
            sources_let_go: 0,
            rules: Vec::new(),
            top_dropped: Vec::new(),
            elapsed_secs: 0.0,
            frames_per_sec: 0.0,
        };
        Counting { r, per_rule: vec![Tally::default(); slots], sources: Sources::new(top) }
    }

    /// Counts a frame (`head`: at least its first bytes, for its source)
    /// that the program returned `ret` for, judged by `judged`'s rule slot.
    fn count(&mut self, ts_ns: u64, len: u32, head: &[u8], ret: u32, judged: Option<(u32, Verdict)>) -> Result<()> {
        let fate = match (ret, judged) {
            (XDP_DROP | XDP_PASS, Some((_, Verdict::Drop))) => Fate::Dropped,
            (XDP_PASS, Some((_, Verdict::WouldDrop))) => Fate::WouldDrop,
            (XDP_DROP, _) => Fate::Dropped,
            (XDP_PASS, _) => Fate::Admitted,
            (other, _) => {
                return Err(Error::Invalid(format!("the program returned {other} for a frame (not pass or drop)")));
            }
        };
        let r = &mut self.r;
        r.total.add(fate, len, ts_ns);
        let Some(src) = source_of(head) else {
            r.not_ip_frames += 1;
            return Ok(());
        };
        let slot = match judged {
            Some((slot, _)) => {
                if let Some(t) = self.per_rule.get_mut(slot as usize).filter(|_| slot != 0) {
                    t.add(fate, len, ts_ns);
                }
                Some(slot)
            }
            None => {
                r.no_rule_frames += 1;
                None
            }
        };
        let s = self.sources.get(src);
        s.slot = slot;
        s.tally.add(fate, len, ts_ns);
        Ok(())
    }
}

/// Replays the capture; see the module's comment.
pub fn replay(o: &Options) -> Result<Report> {
    let Inputs { specs, cfg, sets } = inputs(o)?;
    let mut cap = Capture::open(&o.capture)?;
    let size = std::fs::metadata(&o.capture).map(|m| m.len()).unwrap_or(0);
    let mut p = load(&specs, &cfg, sets.len())?;
    let protect = crate::protect::Protect::parse(&cfg.daemon.protect)?;
    let (state_dir, state_dir_exists) = (sets.state_dir.clone(), sets.state_dir_exists);
    let (left_out, feed) = (sets.left_out.clone(), sets.feed.clone());
    let installed = install_offline(&mut p, &specs, &protect, sets, CLOCK_START_NS)?;
    let names = slot_names(&installed.rules, &installed.sets);
    let slots = names.keys().copied().max().unwrap_or(0) as usize + 1;
    let mut count = Counting::new(o.capture.clone(), slots, o.top);
    count.r.syn_cookies_not_replayed =
        specs.iter().filter(|(_, s)| s.syn().is_some()).map(|(k, _)| k.to_string()).collect();
    count.r.state_dir = state_dir;
    count.r.state_dir_exists = state_dir_exists;
    count.r.sets = installed.sets.iter().map(set_report).collect();
    count.r.sets_left_out = left_out;
    count.r.feed = feed.map(|f| FeedReport {
        set: f.set,
        file: f.file,
        saved: f.saved,
        entries: f.entries as u64,
        live_decisions_fetched: false,
    });
    let progress = Progress::new(!o.json, size);
    let mut batch = Batch::new(&p)?;
    let started = Instant::now();
    judge_all(&mut cap, &mut p, &mut batch, &mut count, &progress)?;
    let Counting { mut r, per_rule, sources } = count;
    progress.finish();
    r.elapsed_secs = started.elapsed().as_secs_f64();
    r.frames_per_sec = if r.elapsed_secs > 0.0 { r.total.frames as f64 / r.elapsed_secs } else { 0.0 };
    r.sources_tracked = sources.map.len() as u64;
    r.sources_let_go = sources.evicted;
    r.sources = (sources.evicted == 0).then_some(sources.map.len() as u64);
    r.rules = rule_reports(&installed.rules, &installed.sets, &per_rule);
    r.top_dropped = top_dropped(sources, o.top, &names);
    Ok(r)
}

/// The program loaded for a replay of `specs` and `sets` named sets (on
/// the test clock, at [`CLOCK_START_NS`]); nothing is attached.
fn load(specs: &BTreeMap<RuleKey, RuleSpec>, cfg: &Config, sets: usize) -> Result<Policer> {
    let opts = LoadOptions {
        max_sources: cfg.daemon.max_sources.unwrap_or(DEFAULT_MAX_SOURCES),
        max_rules: cfg.daemon.max_rules.unwrap_or(DEFAULT_MAX_RULES).max(specs.len() as u32 + sets as u32),
        test_clock: true,
        // No clock window: the program reads the (test) clock for every
        // frame that needs it.
        tick_ns: Some(0),
        replay_batch: policer_common::replay::REPLAY_BATCH,
        ..Default::default()
    };
    let mut p = Policer::load(&opts).map_err(|e| match e {
        // Measured: the load needs these three, and no more (nothing is attached).
        Error::NotRoot(_) => Error::Invalid(
            "permission denied: replay loads the XDP program, which needs CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN \
             (root, or e.g. `setpriv --inh-caps=+bpf,+perfmon,+net_admin --ambient-caps=+bpf,+perfmon,+net_admin`)"
                .into(),
        ),
        e => e,
    })?;
    p.set_jiffies(0)?;
    p.set_clock(CLOCK_START_NS)?;
    Ok(p)
}

/// Every frame of `cap` through the program, in batches, counted in
/// `count` in capture order.
fn judge_all(
    cap: &mut Capture,
    p: &mut Policer,
    batch: &mut Batch,
    count: &mut Counting,
    progress: &Progress,
) -> Result<()> {
    let mut frame = Vec::with_capacity(pcap::MAX_FRAME);
    while let Some(f) = cap.next(&mut frame)? {
        let first = *count.r.first_ns.get_or_insert(f.ts_ns);
        count.r.last_ns = Some(f.ts_ns);
        count.r.clipped_frames += u64::from(f.clipped);
        if f.len < REPLAY_MIN_LEN {
            // Not an Ethernet frame: the program passes it unread (and a
            // test run refuses it). Counted in its place.
            batch.flush(p, count)?;
            count.count(f.ts_ns, f.len, &frame, XDP_PASS, None)?;
            continue;
        }
        batch.push(&frame, clock(first, f.ts_ns), f.ts_ns);
        if batch.full() {
            batch.flush(p, count)?;
            progress.set(cap.bytes_read(), count.r.total.frames);
        }
    }
    batch.flush(p, count)
}

/// A set's line of the report's list of sets.
fn set_report(s: &OfflineSet) -> SetReport {
    SetReport {
        name: s.name.clone(),
        source: s.source,
        file: s.file.clone(),
        entries: s.entries as u64,
        action: s.spec.action.to_string(),
        rate: s.spec.rate.map(|r| r.to_string()),
    }
}

/// The report's line of each rule, then of each set, from the tallies by
/// rule slot.
fn rule_reports(installed: &[OfflineRule], sets: &[OfflineSet], per_rule: &[Tally]) -> Vec<RuleReport> {
    installed
        .iter()
        .map(|i| RuleReport {
            rule: i.key.to_string(),
            action: i.spec.action.to_string(),
            rate: i.spec.rate.map(|r| r.to_string()),
            burst: i.spec.burst,
            tally: per_rule[i.slot as usize],
        })
        .chain(sets.iter().map(|s| RuleReport {
            rule: format!("set {}", s.name),
            action: s.spec.action.to_string(),
            rate: s.spec.rate.map(|r| r.to_string()),
            burst: s.spec.burst,
            tally: per_rule[s.slot as usize],
        }))
        .collect()
}

/// The sources with the most drops (then would-drops), most first: the
/// first `top` of those that had any (`top` 0: every source tracked), each
/// with the rule of its last frame as `names` names its slot.
fn top_dropped(sources: Sources, top: usize, names: &HashMap<u32, String>) -> Vec<SourceReport> {
    let name = |slot: u32| names.get(&slot).cloned().or_else(|| (slot == 0).then(|| "protect".to_string()));
    let mut dropped: Vec<(IpAddr, SourceTally)> = sources
        .map
        .into_iter()
        .filter(|(_, s)| top == 0 || s.tally.dropped_frames + s.tally.would_drop_frames > 0)
        .collect();
    dropped.sort_by(|a, b| (weight(&b.1.tally), a.0).cmp(&(weight(&a.1.tally), b.0)));
    if top != 0 {
        dropped.truncate(top);
    }
    dropped
        .into_iter()
        .map(|(source, s)| SourceReport { source, rule: s.slot.and_then(name), exact: s.exact, tally: s.tally })
        .collect()
}

/// A time of the capture as the time since its first frame: `+12.345678s`.
fn since(first: Option<u64>, t: Option<u64>) -> String {
    match (first, t) {
        (Some(f), Some(t)) => format!("+{:.6}s", t.saturating_sub(f) as f64 / 1e9),
        _ => "-".into(),
    }
}

/// The report as text: totals, the rules, the top dropped sources.
pub fn text(r: &Report) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let t = &r.total;
    let _ = writeln!(
        out,
        "{}: {} frames ({} bytes) over {:.3} s: {} admitted, {} dropped, {} would drop (monitor); {} sources, {} \
         not IP, {} under no rule{}",
        r.capture.display(),
        t.frames,
        t.bytes,
        match (r.first_ns, r.last_ns) {
            (Some(a), Some(b)) => b.saturating_sub(a) as f64 / 1e9,
            _ => 0.0,
        },
        t.admitted_frames,
        t.dropped_frames,
        t.would_drop_frames,
        match r.sources {
            Some(n) => n.to_string(),
            None => format!("over {} (the source table let {} go)", r.sources_tracked, r.sources_let_go),
        },
        r.not_ip_frames,
        r.no_rule_frames,
        if r.clipped_frames > 0 {
            format!(", {} clipped to {} bytes", r.clipped_frames, pcap::MAX_FRAME)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "replayed in {:.3} s ({:.0} frames/s)", r.elapsed_secs, r.frames_per_sec);
    if !r.syn_cookies_not_replayed.is_empty() {
        let _ = writeln!(
            out,
            "syn cookies are not replayed: the frames of {} are judged as if the rule had none",
            r.syn_cookies_not_replayed.join(", ")
        );
    }
    sets_text(&mut out, r);
    let head =
        ["RULE", "ACTION", "FRAMES", "ADMITTED", "DROPPED", "WOULD_DROP", "DROPPED_BYTES", "FIRST_DROP", "LAST_DROP"];
    let mut tab = crate::report::table(&head, 2);
    for x in &r.rules {
        let mut row = vec![x.rule.clone(), x.action.clone()];
        row.extend(tally_cells(&x.tally, r.first_ns));
        tab.add_row(row);
    }
    let _ = writeln!(out, "{tab}");
    if r.top_dropped.is_empty() {
        let _ = writeln!(out, "\nno source was dropped");
        return out;
    }
    let _ = writeln!(
        out,
        "\ntop dropped sources{}:",
        if r.sources_let_go > 0 {
            " (of the sources tracked; * counted only from when it was tracked, some of its frames are missing)"
        } else {
            ""
        }
    );
    let head =
        ["SOURCE", "RULE", "FRAMES", "ADMITTED", "DROPPED", "WOULD_DROP", "DROPPED_BYTES", "FIRST_DROP", "LAST_DROP"];
    let mut tab = crate::report::table(&head, 2);
    for s in &r.top_dropped {
        let mark = if s.exact { "" } else { "*" };
        let mut row = vec![format!("{}{mark}", s.source), s.rule.clone().unwrap_or_else(|| "-".into())];
        row.extend(tally_cells(&s.tally, r.first_ns));
        tab.add_row(row);
    }
    let _ = writeln!(out, "{tab}");
    out
}

/// The report's header on the sets: the state directory, the feed's set,
/// the saved sets left out, and each set installed with where it was read.
fn sets_text(out: &mut String, r: &Report) {
    use std::fmt::Write;
    let saved = r.sets.iter().filter(|s| s.source != SetSource::Config).count()
        + r.sets_left_out.iter().filter(|l| l.source != SetSource::Config).count();
    let _ = writeln!(
        out,
        "state directory {}: {}",
        r.state_dir.display(),
        match (r.state_dir_exists, saved) {
            (false, _) => "does not exist: no saved sets".to_string(),
            (true, 0) => "no saved sets".to_string(),
            (true, 1) => "1 saved set".to_string(),
            (true, n) => format!("{n} saved sets"),
        }
    );
    if let Some(f) = &r.feed {
        let _ = if f.saved {
            writeln!(
                out,
                "[crowdsec] feed: the set '{}' is the feed's saved set ({} entries, {}); live decisions are not \
                 fetched",
                f.set,
                f.entries,
                f.file.display()
            )
        } else {
            writeln!(
                out,
                "[crowdsec] feed: the set '{}' is empty: no saved set ({} is not there); live decisions are not \
                 fetched",
                f.set,
                f.file.display()
            )
        };
    }
    for l in &r.sets_left_out {
        let _ = writeln!(out, "left out: set {} ({}, {}): {}", l.name, l.source, l.file.display(), l.why);
    }
    let _ = writeln!(out);
    if r.sets.is_empty() {
        return;
    }
    let mut tab = crate::report::table(&["SET", "FROM", "ENTRIES", "ACTION", "FILE"], 5);
    for s in &r.sets {
        let action = match &s.rate {
            Some(rate) => format!("{} {rate}", s.action),
            None => s.action.clone(),
        };
        tab.add_row(vec![
            s.name.clone(),
            s.source.to_string(),
            s.entries.to_string(),
            action,
            s.file.display().to_string(),
        ]);
    }
    let _ = writeln!(out, "{tab}\n");
}

/// A tally's cells after the row's own: frames, admitted, dropped,
/// would-drop, dropped bytes, first and last drop.
fn tally_cells(t: &Tally, first_ns: Option<u64>) -> [String; 7] {
    [
        t.frames.to_string(),
        t.admitted_frames.to_string(),
        t.dropped_frames.to_string(),
        t.would_drop_frames.to_string(),
        t.dropped_bytes.to_string(),
        since(first_ns, t.first_drop_ns),
        since(first_ns, t.last_drop_ns),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_counts_monitor_frames_as_admitted_and_would_drop() {
        let mut t = Tally::default();
        t.add(Fate::Admitted, 100, 5);
        t.add(Fate::WouldDrop, 60, 7);
        t.add(Fate::Dropped, 64, 9);
        assert_eq!((t.frames, t.bytes), (3, 224));
        assert_eq!((t.admitted_frames, t.admitted_bytes), (2, 160));
        assert_eq!((t.would_drop_frames, t.would_drop_bytes), (1, 60));
        assert_eq!((t.dropped_frames, t.dropped_bytes), (1, 64));
        assert_eq!((t.first_drop_ns, t.last_drop_ns), (Some(7), Some(9)));
    }

    #[test]
    fn the_clock_starts_at_the_first_frame_and_may_go_back() {
        assert_eq!(clock(5_000, 5_000), CLOCK_START_NS);
        assert_eq!(clock(5_000, 6_500), CLOCK_START_NS + 1_500);
        assert_eq!(clock(5_000, 4_000), CLOCK_START_NS - 1_000);
        // Never 0: the program takes 0 in the metadata as "no time given".
        assert_eq!(clock(u64::MAX, 0), 1);
    }

    #[test]
    fn the_source_table_is_bounded_and_keeps_the_heaviest_droppers() {
        let mut t = Sources::new(10);
        let addr = |i: u32| IpAddr::V4(Ipv4Addr::from(i));
        // 100 heavy droppers first, then a flood of single-frame sources.
        for i in 0..100 {
            for _ in 0..(i + 1) {
                t.get(addr(i)).tally.add(Fate::Dropped, 64, 1);
            }
        }
        for i in 100..(4 * SOURCE_TABLE as u32) {
            t.get(addr(i)).tally.add(Fate::Admitted, 64, 1);
            assert!(t.map.len() <= SOURCE_TABLE);
        }
        assert!(t.evicted > 0);
        for i in 0..100 {
            let s = &t.map[&addr(i)];
            assert_eq!(s.tally.dropped_frames, u64::from(i) + 1, "a dropper is never let go before a passer");
            assert!(s.exact);
        }
        // A source first seen after the table let records go may have lost some.
        assert!(!t.get(addr(u32::MAX)).exact);
        assert_eq!(Sources::new(SOURCE_TABLE).capacity, 2 * SOURCE_TABLE);
    }

    #[test]
    fn sources_are_read_past_vlan_tags() {
        let mut v4 = vec![0u8; 12];
        v4.extend_from_slice(&[0x81, 0x00, 0, 5, 0x08, 0x00]);
        let mut ip = vec![0x45u8; 20];
        ip[12..16].copy_from_slice(&[192, 0, 2, 7]);
        v4.extend_from_slice(&ip);
        assert_eq!(source_of(&v4), Some("192.0.2.7".parse().unwrap()));
        let mut v6 = vec![0u8; 12];
        v6.extend_from_slice(&[0x86, 0xdd]);
        let mut ip6 = vec![0u8; 40];
        ip6[8..24].copy_from_slice(&"2001:db8::9".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&ip6);
        assert_eq!(source_of(&v6), Some("2001:db8::9".parse().unwrap()));
        assert_eq!(source_of(&v6[..30]), None, "truncated");
        let mut arp = vec![0u8; 12];
        arp.extend_from_slice(&[0x08, 0x06, 0, 1]);
        assert_eq!(source_of(&arp), None);
    }
}
