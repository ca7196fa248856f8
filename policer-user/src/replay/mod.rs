//! `policer replay`: a capture's frames through the real XDP program
//! (BPF_PROG_TEST_RUN), the capture's own timestamps as the program's clock,
//! with the rules of a config file (or `--rate/--burst`) installed as a
//! start installs them ([`crate::daemon::install_offline`]).
//!
//! Each frame is one test run: the clock is set to the frame's time (when
//! it moved), the program judges the frame, and its verdict is counted for
//! the frame's source and for the rule the program found for it. Nothing is
//! attached; the program and its maps go away at the end.

pub mod capture;

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::Instant,
};

use aya::{
    maps::{MapData, PerCpuArray},
    programs::{TestRun, TestRunOptions},
};
use policer_common::{DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES, MAP_RULE_COUNTERS, RuleCounters, bucket::Action};
use serde::Serialize;

use crate::{
    config::Config,
    daemon::{OfflineRule, default_rules, install_offline},
    error::{Error, Result},
    loader::{LoadOptions, Policer},
    rules::{RuleKey, RuleSpec},
};
use capture::Capture;

/// XDP verdicts (`enum xdp_action`).
const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

/// The program's clock at the capture's first frame: the time since boot
/// of a machine up for a while, so that nothing the program computes back
/// from "now" (a full bucket, a limiter's window) runs into zero.
const CLOCK_START_NS: u64 = 1_000_000_000_000;

/// What to replay, against which rules: a config file's (its `[[rule]]`s
/// and `protect`), with `--rate/--burst` for the default rules over them,
/// as `policer attach` takes them.
#[derive(Clone, Debug)]
pub struct Options {
    pub capture: PathBuf,
    pub config: Option<PathBuf>,
    pub rate: Option<policer_common::rate::Rate>,
    pub burst: Option<String>,
    /// Dropped sources listed (0: every source).
    pub top: usize,
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
    /// The rule the program found for it; `None`: no rule covers it.
    pub rule: Option<String>,
    #[serde(flatten)]
    pub tally: Tally,
}

/// What a replay found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub capture: PathBuf,
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
    /// The capture's first and last timestamps (ns since the Unix epoch).
    pub first_ns: Option<u64>,
    pub last_ns: Option<u64>,
    /// Distinct sources seen.
    pub sources: u64,
    pub rules: Vec<RuleReport>,
    /// The sources with the most drops (then would-drops), most first.
    pub top_dropped: Vec<SourceReport>,
    /// Wall time of the replay, and frames per second of it.
    pub elapsed_secs: f64,
    pub frames_per_sec: f64,
}

/// What is known of a source.
struct Source {
    /// Its rule's counter slot (0: no rule covers it).
    slot: u32,
    monitor: bool,
    tally: Tally,
}

/// The rules to install: the config's, and `--rate/--burst` over its
/// default rules; refused here (before anything is loaded) what the replay
/// does not do yet.
fn rules(o: &Options) -> Result<(BTreeMap<RuleKey, RuleSpec>, Config)> {
    let Options { config, rate, burst, .. } = o;
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
    if specs.is_empty() {
        return Err(Error::Invalid(
            "nothing to replay against: give --config FILE with rules, or --rate (and --burst)".into(),
        ));
    }
    let not_yet = |what: &str| {
        Error::Invalid(format!(
            "{what}: `policer replay` does not replay these yet (plain prefix rules and manual bans only)"
        ))
    };
    if let Some(k) = specs.keys().find(|k| !k.class.is_none()) {
        return Err(not_yet(&format!("rule {k} has a traffic class")));
    }
    if let Some((k, _)) = specs.iter().find(|(_, s)| s.auto_ban.is_some()) {
        return Err(not_yet(&format!("rule {k} bans automatically (ban_for)")));
    }
    if !cfg.sets.is_empty() {
        return Err(not_yet("the config has named sets ([[set]])"));
    }
    if cfg.crowdsec.is_some() {
        return Err(not_yet("the config has a [crowdsec] feed"));
    }
    Ok((specs, cfg))
}

/// The program's clock for a frame at `ts_ns`, the first at `first_ns`.
fn clock(first_ns: u64, ts_ns: u64) -> u64 {
    // A frame older than the first (a capture merged out of order) sets the
    // clock back, as a clock read on another CPU can: the program handles it.
    (i128::from(CLOCK_START_NS) + i128::from(ts_ns) - i128::from(first_ns)).clamp(0, i128::from(u64::MAX)) as u64
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

/// Would-drops a rule slot has counted (summed over CPUs).
fn would_drops(p: &Policer, slot: u32) -> Result<u64> {
    let m: PerCpuArray<&MapData, RuleCounters> =
        PerCpuArray::try_from(p.ebpf.map(MAP_RULE_COUNTERS).ok_or(Error::Missing(MAP_RULE_COUNTERS))?)
            .map_err(Error::map(MAP_RULE_COUNTERS))?;
    let v = m.get(&slot, 0).map_err(Error::map(MAP_RULE_COUNTERS))?;
    Ok(v.iter().map(|c| c.would_drop_pkts).sum())
}

/// Replays the capture; see the module's comment.
pub fn replay(o: &Options) -> Result<Report> {
    let (specs, cfg) = rules(o)?;
    let mut cap = Capture::open(&o.capture)?;
    let mut frame = Vec::with_capacity(capture::MAX_FRAME);
    let opts = LoadOptions {
        max_sources: cfg.daemon.max_sources.unwrap_or(DEFAULT_MAX_SOURCES),
        max_rules: cfg.daemon.max_rules.unwrap_or(DEFAULT_MAX_RULES).max(specs.len() as u32),
        test_clock: true,
        // No clock window: the program reads the (test) clock for every
        // frame that needs it.
        tick_ns: Some(0),
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
    let protect = crate::protect::Protect::parse(&cfg.daemon.protect)?;
    let installed: Vec<OfflineRule> = install_offline(&mut p, &specs, &protect, CLOCK_START_NS)?;
    let reader = p.reader();
    let slots = installed.iter().map(|r| r.slot).max().unwrap_or(0) as usize + 1;
    let mut per_rule = vec![Tally::default(); slots];
    let mut monitor_seen = vec![0u64; slots];
    let mut sources: HashMap<IpAddr, Source> = HashMap::new();
    let mut r = Report {
        capture: o.capture.clone(),
        total: Tally::default(),
        not_ip_frames: 0,
        clipped_frames: 0,
        no_rule_frames: 0,
        first_ns: None,
        last_ns: None,
        sources: 0,
        rules: Vec::new(),
        top_dropped: Vec::new(),
        elapsed_secs: 0.0,
        frames_per_sec: 0.0,
    };
    let started = Instant::now();
    let mut now = CLOCK_START_NS;
    while let Some(f) = cap.next(&mut frame)? {
        let first = *r.first_ns.get_or_insert(f.ts_ns);
        r.last_ns = Some(f.ts_ns);
        r.clipped_frames += u64::from(f.clipped);
        let t = clock(first, f.ts_ns);
        if t != now {
            p.set_clock(t)?;
            now = t;
        }
        let verdict = p
            .program()
            .test_run(TestRunOptions { data_in: Some(&frame), ..Default::default() })
            .map_err(|e| Error::Program(Box::new(e)))?
            .return_value;
        let Some(src) = source_of(&frame) else {
            r.not_ip_frames += 1;
            r.total.add(if verdict == XDP_DROP { Fate::Dropped } else { Fate::Admitted }, f.len, f.ts_ns);
            continue;
        };
        let s = match sources.get_mut(&src) {
            Some(s) => s,
            None => {
                let rule = reader.prefix_rule(src)?;
                let slot = rule.map_or(0, |r| r.counter_slot);
                let monitor = rule.is_some_and(|r| r.action == Action::Monitor as u32);
                sources.entry(src).or_insert(Source { slot, monitor, tally: Tally::default() })
            }
        };
        let fate = match verdict {
            XDP_DROP => Fate::Dropped,
            XDP_PASS if s.monitor => {
                // Did the rule count this frame as one it would drop?
                let n = would_drops(&p, s.slot)?;
                let seen = &mut monitor_seen[s.slot as usize];
                let fate = if n > *seen { Fate::WouldDrop } else { Fate::Admitted };
                *seen = n;
                fate
            }
            XDP_PASS => Fate::Admitted,
            other => {
                return Err(Error::Invalid(format!("the program returned {other} for a frame (not pass or drop)")));
            }
        };
        s.tally.add(fate, f.len, f.ts_ns);
        r.total.add(fate, f.len, f.ts_ns);
        match per_rule.get_mut(s.slot as usize) {
            Some(t) if s.slot != 0 => t.add(fate, f.len, f.ts_ns),
            _ => r.no_rule_frames += 1,
        }
    }
    r.elapsed_secs = started.elapsed().as_secs_f64();
    r.frames_per_sec = if r.elapsed_secs > 0.0 { r.total.frames as f64 / r.elapsed_secs } else { 0.0 };
    r.sources = sources.len() as u64;
    let name = |slot: u32| installed.iter().find(|i| i.slot == slot).map(|i| i.key.to_string());
    r.rules = installed
        .iter()
        .map(|i| RuleReport {
            rule: i.key.to_string(),
            action: i.spec.action.to_string(),
            rate: i.spec.rate.map(|r| r.to_string()),
            burst: i.spec.burst,
            tally: per_rule[i.slot as usize],
        })
        .collect();
    let mut dropped: Vec<(IpAddr, Source)> = sources
        .into_iter()
        .filter(|(_, s)| o.top == 0 || s.tally.dropped_frames + s.tally.would_drop_frames > 0)
        .collect();
    dropped.sort_by(|a, b| {
        (b.1.tally.dropped_frames, b.1.tally.would_drop_frames, a.0).cmp(&(
            a.1.tally.dropped_frames,
            a.1.tally.would_drop_frames,
            b.0,
        ))
    });
    if o.top != 0 {
        dropped.truncate(o.top);
    }
    r.top_dropped = dropped
        .into_iter()
        .map(|(source, s)| SourceReport { source, rule: if s.slot == 0 { None } else { name(s.slot) }, tally: s.tally })
        .collect();
    Ok(r)
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
        r.sources,
        r.not_ip_frames,
        r.no_rule_frames,
        if r.clipped_frames > 0 {
            format!(", {} clipped to {} bytes", r.clipped_frames, capture::MAX_FRAME)
        } else {
            String::new()
        }
    );
    let _ = writeln!(out, "replayed in {:.3} s ({:.0} frames/s)\n", r.elapsed_secs, r.frames_per_sec);
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
    let _ = writeln!(out, "\ntop dropped sources:");
    let head =
        ["SOURCE", "RULE", "FRAMES", "ADMITTED", "DROPPED", "WOULD_DROP", "DROPPED_BYTES", "FIRST_DROP", "LAST_DROP"];
    let mut tab = crate::report::table(&head, 2);
    for s in &r.top_dropped {
        let mut row = vec![s.source.to_string(), s.rule.clone().unwrap_or_else(|| "-".into())];
        row.extend(tally_cells(&s.tally, r.first_ns));
        tab.add_row(row);
    }
    let _ = writeln!(out, "{tab}");
    out
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
        assert_eq!(clock(u64::MAX, 0), 0);
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
