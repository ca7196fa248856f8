//! Per received packet on veth: the live-frames generator and the
//! receiving veth's NAPI on one CPU, 64-byte UDP from 65 536 sources, every
//! system in its own pair of namespaces, repetitions interleaved so drift
//! hits every system alike. Cost = busy time of that CPU / frames the
//! receiving veth received.
//!
//! Two groups of rows: the IPv4 rows (`--only veth`) and the IPv6 rows
//! (`--only ipv6`: the floor, the dropping policer, the reference lookup
//! and nftables fed an IPv6 flood of as many sources, each its own /64).
//! The IPv6 rows are compared with the IPv4 ones repetition by
//! repetition, so the IPv6 group alone still measures the IPv4 floor,
//! dropping policer, reference and nftables beside it.

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::Duration,
};

use anyhow::{Context, Result};
use policer_common::table;
use serde::{Deserialize, Serialize};

use super::{
    Stat,
    generator::{CHUNK, Generator},
    peers::{Family, Installed, Limit, System, install},
    say,
    sys::{Net, bench_cpu, settle},
};

pub const SOURCES: u32 = 65_536;

/// Fewer active sources for the dropping policer, same table and limit:
/// how its cost grows with the part of the table the flood touches.
pub const SWEEP_SOURCES: [u32; 3] = [1, 4_096, 16_384];

/// The dropping policer's `--max-sources` for the full flood in a table
/// sized to it: as many sources as the flood has (two slots a source),
/// 2 MiB of sets instead of 8.
pub const SIZED_CAPACITY: u32 = SOURCES;

pub const SYSTEMS: [System; 8] = [
    System::XdpDrop,
    System::PolicerDrop,
    System::RefLookup,
    System::PolicerAdmit,
    System::XdpPass,
    System::Nft,
    System::IptLegacy,
    System::IptNft,
];

/// The IPv6 rows (`--only ipv6`), each beside its IPv4 counterpart.
pub const SYSTEMS_V6: [System; 4] = [System::XdpDrop6, System::PolicerDrop6, System::RefLookup6, System::Nft6];

/// The IPv4 rows the IPv6 rows are compared with, when the IPv6 group
/// runs without the IPv4 one.
const SYSTEMS_V4_FOR_V6: [System; 4] = [System::XdpDrop, System::PolicerDrop, System::RefLookup, System::Nft];

/// The class rows (`--only classes`, issue 17): the dropping policer with
/// 16 class rules that do not match the flood (A/B against the dropping
/// policer row, the source-only rule set), and the class-matching flood
/// (UDP to port 53) against the policer's class rule, nftables and
/// iptables-legacy hashlimit matching the same.
pub const SYSTEMS_CLASSES: [System; 4] =
    [System::PolicerClasses, System::PolicerDns, System::NftDns, System::IptLegacyDns];

/// The rows the class rows are compared with, when the class group runs
/// without the IPv4 one: the floor and the source-only dropping policer.
const SYSTEMS_FOR_CLASSES: [System; 2] = [System::XdpDrop, System::PolicerDrop];

/// First source of the IPv6 floods: source i is 3fff:XXXX:0100:0000+i::1
/// (see [`Generator::new_v6`]), its own /64, so the policer's default key
/// length (/64) gives every source its own bucket, as in the IPv4 flood.
pub const V6_BASE: Ipv6Addr = Ipv6Addr::new(0x3fff, 0, 0x0100, 0, 0, 0, 0, 1);

/// Which groups of veth rows to measure.
#[derive(Clone, Copy, Debug)]
pub struct Groups {
    /// The IPv4 rows, the sweep by active sources and the sized table.
    pub ipv4: bool,
    /// The IPv6 rows.
    pub ipv6: bool,
    /// The class rows (issue 17).
    pub classes: bool,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VethRow {
    pub system: System,
    pub key: String,
    pub label: String,
    /// The flood's family.
    pub family: Family,
    /// CPU ns per received frame: the generator thread (which runs the
    /// receiving softirq) + ksoftirqd of that CPU. The headline.
    pub cpu_ns: Stat,
    /// Busy ns of the shared CPU per received frame (/proc/stat; counts
    /// anything else that ran on that CPU too).
    pub busy_ns: Stat,
    /// `cpu_ns` per repetition (in run order).
    pub cpu_reps: Vec<f64>,
    /// Wall ns per received frame.
    pub wall_ns: Stat,
    /// Received frames per second (millions).
    pub mpps: Stat,
    /// Fraction of received frames that reached the UDP layer.
    pub admitted: Stat,
    /// `cpu_ns` divided by the floor's (the xdp_drop row of the same
    /// family) in the same repetition.
    pub vs_floor: Stat,
    /// `vs_floor` per repetition (in run order).
    pub vs_floor_reps: Vec<f64>,
    /// Generated frames that the receiving veth did not count.
    pub lost: u64,
    pub received: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct VethResults {
    pub sources: u32,
    pub frame_bytes: u32,
    pub seconds_per_rep: f64,
    pub reps: usize,
    pub cpu: usize,
    pub drop_limit_pps: u64,
    pub rows: Vec<VethRow>,
    /// The dropping policer by active sources (SWEEP_SOURCES, then the
    /// dropping row's SOURCES), measured in the same repetitions (with the
    /// IPv4 group only).
    pub by_sources: Vec<SweepRow>,
    /// The full flood again, the table sized to it (SIZED_CAPACITY; with
    /// the IPv4 group only).
    pub sized: Option<SizedRow>,
    /// Whether the IPv4 group was measured (else only the IPv4 rows the
    /// IPv6 ones are compared with).
    pub ipv4: bool,
    /// Whether the IPv6 group was measured.
    pub ipv6: bool,
    /// The class rows (with the class group).
    pub classes: Option<ClassResults>,
    /// Why the class rows were not measured (with the class group).
    pub class_error: Option<String>,
}

/// The class rows (issue 17, point 8), measured in the same repetitions as
/// the other veth rows.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ClassResults {
    /// UDP destination port of the flood the source-only and the class
    /// rule sets are compared under (matched by none of the classes).
    pub flood_dport: u16,
    /// UDP destination port of the class-matching flood.
    pub dns_dport: u16,
    /// The source prefix of the class rules.
    pub prefix: String,
    /// The 16 class rules of `policer_drop_classes`, as given to `policer
    /// rule set PREFIX …` (each with the dropping limit).
    pub rules: Vec<String>,
    /// The class rule of `policer_dns` (the class-less rule admits all).
    pub dns_rule: String,
    /// The class rows (`policer_drop_classes`, `policer_dns`,
    /// `nft_dynset_dns`, `iptables_legacy_hashlimit_dns`); × floor is
    /// against the xdp_drop row.
    pub rows: Vec<VethRow>,
    /// `policer_drop_classes` / `policer_drop` (the source-only rule set),
    /// repetition by repetition: the A/B.
    pub classes_vs_source_only: Stat,
    pub classes_vs_source_only_reps: Vec<f64>,
    /// The class-matching flood: the policer against each peer,
    /// repetition by repetition.
    pub dns_vs_nft: Stat,
    pub dns_vs_iptables_legacy: Stat,
    /// Generated frames of the class rows that the receiving veth did not
    /// count.
    pub lost: u64,
    pub received: u64,
}

/// The dropping policer with the full flood in a table sized to it: what
/// a table whose footprint follows the live population, rather than its
/// capacity, would bring with the same slots.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SizedRow {
    pub sources: u32,
    /// Its `--max-sources`.
    pub capacity: u32,
    /// Bytes of sets in its table.
    pub table_bytes: u64,
    /// Bytes of sets in the dropping row's table (TABLE_CAPACITY).
    pub full_table_bytes: u64,
    pub cpu_ns: Stat,
    /// Against the floor, repetition by repetition.
    pub vs_floor: Stat,
    /// Against the dropping row (table for TABLE_CAPACITY), repetition by
    /// repetition.
    pub vs_full: Stat,
    pub admitted: Stat,
}

/// The dropping policer with `sources` active sources.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SweepRow {
    pub sources: u32,
    pub cpu_ns: Stat,
    /// Against the floor, repetition by repetition.
    pub vs_floor: Stat,
    /// Fraction of received frames that reached the UDP layer.
    pub admitted: Stat,
}

/// One system's repetition.
pub(super) struct Sample {
    pub cpu: f64,
    pub busy: f64,
    pub wall: f64,
    pub mpps: f64,
    /// Share of received frames that reached the UDP layer.
    pub admitted: f64,
    /// Frames that reached the UDP layer.
    pub admitted_frames: u64,
    pub lost: u64,
    pub received: u64,
}

pub fn run(quick: bool, reps: usize, groups: Groups) -> Result<VethResults> {
    let dur = Duration::from_millis(if quick { 600 } else { 2000 });
    let cpu = bench_cpu();
    // ≈ 99 % dropped: every source offers ~100 pps at these rates.
    let drop_limit = DROP_LIMIT;
    let admit_limit = Limit { pps: 100_000_000, burst: 1_000_000 };
    let mut systems: Vec<System> = if groups.ipv4 {
        SYSTEMS.to_vec()
    } else if groups.ipv6 {
        SYSTEMS_V4_FOR_V6.to_vec()
    } else {
        SYSTEMS_FOR_CLASSES.to_vec()
    };
    if groups.ipv6 {
        systems.extend(SYSTEMS_V6);
    }
    if groups.classes {
        // The class rules' row runs right after its A, the source-only
        // dropping policer, in every repetition (the order rotates as a
        // whole), so that the pair is as close in time as two rows can be.
        let at = systems.iter().position(|s| *s == System::PolicerDrop).map_or(systems.len(), |i| i + 1);
        systems.insert(at, System::PolicerClasses);
        systems.extend(SYSTEMS_CLASSES.iter().filter(|s| **s != System::PolicerClasses));
    }
    let mut setups = Vec::new();
    // A class row that cannot be set up (a policer without classes, say)
    // costs the class rows, not the others.
    let mut class_error = None;
    for sys in systems {
        if sys.is_class_row() && class_error.is_some() {
            continue;
        }
        say(&format!("veth: setting up {}", sys.label()));
        let set_up = || -> Result<_> {
            let net = Net::new(sys.tag())?;
            let inst = install(sys, &net, drop_limit, admit_limit)?;
            let g = flood(&net, SOURCES, sys.family(), false)?.with_dport(sys.dport())?;
            Ok((sys, net, inst, g))
        };
        match super::unpanic(set_up) {
            Ok(s) => setups.push(s),
            Err(e) if sys.is_class_row() => {
                say(&format!("veth: the class rows are not measured: {}: {e:#}", sys.label()));
                class_error = Some(format!("{}: {e:#}", sys.label()));
                setups.retain(|(s, ..)| !s.is_class_row());
            }
            Err(e) => return Err(e),
        }
    }
    let mut sweep = Vec::new();
    let mut sized_setup = None;
    if groups.ipv4 {
        for n in SWEEP_SOURCES {
            say(&format!("veth: setting up the dropping policer for {n} sources"));
            let net = Net::new(&format!("s{n}"))?;
            let inst = install(System::PolicerDrop, &net, drop_limit, admit_limit)?;
            let g = flood_of(&net, n)?;
            sweep.push((n, format!("policer, dropping, {n} sources"), net, inst, g));
        }
        say(&format!("veth: setting up the dropping policer with a table for {SIZED_CAPACITY} sources"));
        let net = Net::new("sized")?;
        let capacity = SIZED_CAPACITY.to_string();
        let inst = Installed::Daemon(Box::new(super::peers::policer(&net, drop_limit, &["--max-sources", &capacity])));
        let g = flood_of(&net, SOURCES)?;
        sized_setup = Some((format!("policer, dropping, table for {SIZED_CAPACITY}"), net, inst, g));
    }
    let mut runs: Vec<(&str, &Net, &Generator)> = setups.iter().map(|(s, n, _, g)| (s.label(), n, g)).collect();
    runs.extend(sweep.iter().map(|(_, l, n, _, g)| (l.as_str(), n, g)));
    let sized_at = runs.len();
    if let Some((l, n, _, g)) = &sized_setup {
        runs.push((l.as_str(), n, g));
    }
    let samples = measure(&runs, cpu, dur, Duration::from_millis(if quick { 200 } else { 500 }), reps)?;
    let cpu_of = |i: usize| samples[i].iter().map(|s| s.cpu).collect::<Vec<f64>>();
    let floor_of = |family: Family| {
        let floor = if family == Family::V4 { System::XdpDrop } else { System::XdpDrop6 };
        setups
            .iter()
            .position(|(s, ..)| *s == floor)
            .map(cpu_of)
            .ok_or_else(|| anyhow::anyhow!("no {} floor in the veth systems", family.name()))
    };
    let floor = floor_of(Family::V4)?;
    let floor6 = if groups.ipv6 { floor_of(Family::V6)? } else { vec![] };
    let per_rep = |ss: &[Sample], f: &[f64]| ss.iter().zip(f).map(|(s, f)| s.cpu / f).collect::<Vec<_>>();
    let vs_floor = |ss: &[Sample]| Stat::of(&per_rep(ss, &floor));
    let full: Vec<f64> = setups
        .iter()
        .position(|(s, ..)| *s == System::PolicerDrop)
        .map(cpu_of)
        .ok_or_else(|| anyhow::anyhow!("no dropping policer row in the veth systems"))?;
    let table_bytes = |capacity: u32| table::sets_for(capacity) as u64 * size_of::<table::Set>() as u64;
    let sized = sized_setup.as_ref().map(|_| {
        let sized_samples = &samples[sized_at];
        SizedRow {
            sources: SOURCES,
            capacity: SIZED_CAPACITY,
            table_bytes: table_bytes(SIZED_CAPACITY),
            full_table_bytes: table_bytes(super::peers::TABLE_CAPACITY),
            cpu_ns: Stat::of(&sized_samples.iter().map(|s| s.cpu).collect::<Vec<_>>()),
            vs_floor: vs_floor(sized_samples),
            vs_full: Stat::of(&sized_samples.iter().zip(&full).map(|(s, f)| s.cpu / f).collect::<Vec<_>>()),
            admitted: Stat::of(&sized_samples.iter().map(|s| s.admitted).collect::<Vec<_>>()),
        }
    });
    let mut by_sources: Vec<SweepRow> = sweep
        .iter()
        .zip(&samples[setups.len()..sized_at])
        .map(|((n, ..), ss)| SweepRow {
            sources: *n,
            cpu_ns: Stat::of(&ss.iter().map(|s| s.cpu).collect::<Vec<_>>()),
            vs_floor: vs_floor(ss),
            admitted: Stat::of(&ss.iter().map(|s| s.admitted).collect::<Vec<_>>()),
        })
        .collect();
    let sweep_daemons = sweep.iter().map(|(_, label, _, inst, _)| (label, inst));
    for (label, inst) in sweep_daemons.chain(sized_setup.as_ref().map(|(l, _, i, _)| (l, i))) {
        if let Installed::Daemon(d) = inst
            && !d.stderr().is_empty()
        {
            say(&format!("veth: {label} daemon said: {}", d.stderr()));
        }
    }
    let mut rows = Vec::new();
    let mut class_rows = Vec::new();
    for ((sys, _, inst, _), ss) in setups.iter().zip(&samples) {
        if let Installed::Daemon(d) = inst
            && !d.stderr().is_empty()
        {
            say(&format!("veth: {} daemon said: {}", sys.label(), d.stderr()));
        }
        let v = |f: fn(&Sample) -> f64| Stat::of(&ss.iter().map(f).collect::<Vec<_>>());
        let vs_floor_reps = per_rep(ss, if sys.family() == Family::V4 { &floor } else { &floor6 });
        if *sys == System::PolicerDrop && groups.ipv4 {
            by_sources.push(SweepRow {
                sources: SOURCES,
                cpu_ns: v(|s| s.cpu),
                vs_floor: Stat::of(&vs_floor_reps),
                admitted: v(|s| s.admitted),
            });
        }
        let into = if sys.is_class_row() { &mut class_rows } else { &mut rows };
        into.push(VethRow {
            system: *sys,
            key: sys.key().into(),
            label: sys.label().into(),
            family: sys.family(),
            cpu_ns: v(|s| s.cpu),
            cpu_reps: ss.iter().map(|s| s.cpu).collect(),
            busy_ns: v(|s| s.busy),
            wall_ns: v(|s| s.wall),
            mpps: v(|s| s.mpps),
            admitted: v(|s| s.admitted),
            vs_floor: Stat::of(&vs_floor_reps),
            vs_floor_reps,
            lost: ss.iter().map(|s| s.lost).sum(),
            received: ss.iter().map(|s| s.received).sum(),
        });
    }
    let classes = if groups.classes && class_error.is_none() { Some(class_results(&rows, class_rows)?) } else { None };
    Ok(VethResults {
        sources: SOURCES,
        frame_bytes: 64,
        seconds_per_rep: dur.as_secs_f64(),
        reps,
        cpu,
        drop_limit_pps: drop_limit.pps,
        rows,
        by_sources,
        sized,
        ipv4: groups.ipv4,
        ipv6: groups.ipv6,
        classes,
        class_error,
    })
}

/// The class rows' results from their rows and the other veth rows (the
/// source-only dropping policer is the A of the A/B).
pub(crate) fn class_results(rows: &[VethRow], class_rows: Vec<VethRow>) -> Result<ClassResults> {
    let find = |rs: &[VethRow], s: System| {
        rs.iter().find(|r| r.system == s).cloned().ok_or_else(|| anyhow::anyhow!("no {} row", s.key()))
    };
    let (a, b) = (find(rows, System::PolicerDrop)?, find(&class_rows, System::PolicerClasses)?);
    let dns = find(&class_rows, System::PolicerDns)?;
    let (nft, ipt) = (find(&class_rows, System::NftDns)?, find(&class_rows, System::IptLegacyDns)?);
    let reps: Vec<f64> = b.cpu_reps.iter().zip(&a.cpu_reps).map(|(x, y)| x / y).collect();
    let text = |c: &[&str]| c.join(" ");
    Ok(ClassResults {
        flood_dport: System::PolicerClasses.dport(),
        dns_dport: System::PolicerDns.dport(),
        prefix: super::peers::CLASS_PREFIX.into(),
        rules: super::peers::CLASS_RULES.iter().map(|c| text(c)).collect(),
        dns_rule: text(super::peers::DNS_RULE),
        classes_vs_source_only: Stat::of(&reps),
        classes_vs_source_only_reps: reps,
        dns_vs_nft: ratio(&dns, &nft),
        dns_vs_iptables_legacy: ratio(&dns, &ipt),
        lost: class_rows.iter().map(|r| r.lost).sum(),
        received: class_rows.iter().map(|r| r.received).sum(),
        rows: class_rows,
    })
}

/// The benchmark's flood into `net`: 64-byte UDP from `sources` sources
/// (SOURCES for the headline rows), 10.1.0.0 on, in turn.
fn flood_of(net: &Net, sources: u32) -> Result<Generator> {
    flood(net, sources, Family::V4, false)
}

/// A flood into `net` of `family`: 64-byte UDP from `sources` sources, in
/// turn or at random. IPv4: 10.1.0.0 + i (at most 2^24 - 2^16 sources stay
/// in 10/8); IPv6: one /64 per source from [`V6_BASE`].
pub(super) fn flood(net: &Net, sources: u32, family: Family, random: bool) -> Result<Generator> {
    match family {
        Family::V4 => Generator::new(net.tx_index, net.rx_mac, sources, Ipv4Addr::new(10, 1, 0, 0), random),
        Family::V6 => Generator::new_v6(net.tx_index, net.rx_mac, sources, V6_BASE, random),
    }
}

/// The dropping rows' limit: every source offers ~100 pps, so ≈ 99 % of
/// frames are dropped.
pub(super) const DROP_LIMIT: Limit = Limit { pps: 1, burst: 1 };

/// Floods every `(label, net, generator)` in turn, `reps` times for `dur`
/// each (after a warm-up of `warm` each: every source seen, every table
/// filled; none if `warm` is zero); the samples of each, in run order.
pub(super) fn measure(
    runs: &[(&str, &Net, &Generator)],
    cpu: usize,
    dur: Duration,
    warm: Duration,
    reps: usize,
) -> Result<Vec<Vec<Sample>>> {
    // (A zero `warm`: the caller warmed up.)
    for (label, net, g) in runs.iter().filter(|_| !warm.is_zero()) {
        say(&format!("veth: warm-up {label}"));
        g.flood(&net.sb.tx_ns, cpu, warm, CHUNK)?;
    }
    let mut samples: Vec<Vec<Sample>> = runs.iter().map(|_| Vec::new()).collect();
    for rep in 0..reps {
        say(&format!("veth: repetition {}/{reps}", rep + 1));
        // Rotate the order so no system always runs first.
        for k in 0..runs.len() {
            let i = (k + rep) % runs.len();
            let (_, net, g) = runs[i];
            settle();
            let (s0, u0) = (net.rx_stats()?, net.udp_in()?);
            let f = g.flood(&net.sb.tx_ns, cpu, dur, CHUNK)?;
            let (s1, u1) = (net.rx_stats()?, net.udp_in()?);
            let rx = (s1.rx_packets - s0.rx_packets).max(1);
            samples[i].push(Sample {
                cpu: f.own_ns as f64 / rx as f64,
                busy: f.busy_ns as f64 / rx as f64,
                wall: f.wall_ns as f64 / rx as f64,
                mpps: rx as f64 / f.wall_ns as f64 * 1e3,
                admitted: (u1 - u0) as f64 / rx as f64,
                admitted_frames: u1 - u0,
                lost: f.frames.saturating_sub(rx),
                received: rx,
            });
        }
    }
    Ok(samples)
}

/// A `policer` binary of an [`ab`] run and the `--max-sources` it runs
/// with: `PATH` (the benchmark's TABLE_CAPACITY) or `PATH:N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbBinary {
    pub path: std::path::PathBuf,
    pub max_sources: u32,
}

impl std::str::FromStr for AbBinary {
    type Err = String;

    fn from_str(s: &str) -> Result<AbBinary, String> {
        let (path, max_sources) = match s.rsplit_once(':') {
            // A file named like `PATH:N` is that file.
            _ if std::path::Path::new(s).is_file() => (s, super::peers::TABLE_CAPACITY),
            Some((p, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                let n: u32 = n.parse().map_err(|_| format!("{s}: --max-sources {n} is out of range"))?;
                if n == 0 {
                    return Err(format!("{s}: --max-sources must be at least 1"));
                }
                (p, n)
            }
            _ => (s, super::peers::TABLE_CAPACITY),
        };
        if path.is_empty() {
            return Err(format!("{s}: no binary named"));
        }
        Ok(AbBinary { path: path.into(), max_sources })
    }
}

impl std::fmt::Display for AbBinary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} --max-sources {}", self.path.display(), self.max_sources)
    }
}

/// One row of [`ab`].
pub struct AbVethRow {
    pub label: String,
    /// CPU ns per received frame.
    pub cpu_ns: Stat,
    /// Against the floor, repetition by repetition.
    pub vs_floor: Stat,
    /// Against the first binary's row, repetition by repetition.
    pub vs_first: Stat,
}

/// The rows an [`ab`] run measures besides each binary's plain one.
#[derive(Clone, Copy, Debug, Default)]
pub struct AbVariants<'a> {
    /// With the benchmark's 16 class rules (none matching the flood).
    pub classes: bool,
    /// With this many single addresses in the rule trie (bans; deny rules
    /// for the first binary).
    pub bans: u32,
    /// Each binary but the first with its dropping rule banning.
    pub banned: bool,
    /// Each binary but the first with a capture of its drops running,
    /// sampling `1/N`.
    pub capture: Option<&'a str>,
    /// Each binary but the first with xdp_pass in slot 0 of its chain.
    pub chain: bool,
}

/// The flood of an [`ab`] run.
#[derive(Clone, Copy, Debug)]
pub struct AbFlood {
    /// Sources (SOURCES in the benchmark's rows), each at 1 pps.
    pub sources: u32,
    pub family: Family,
    /// Random sources (a spoofed flood) instead of in turn.
    pub random: bool,
}

/// The dropping policer of each `policer` binary in `bins`, beside the
/// xdp_drop floor, measured as the benchmark's veth rows are (`flood`: the
/// benchmark's drop row is SOURCES IPv4 sources in turn, 1 pps each, one
/// CPU), repetitions interleaved: how two builds compare on the live drop
/// path, paired repetition by repetition, which is what a change of a few
/// ns needs on a noisy host. The floor gets the same flood.
///
/// With `classes`, each binary is measured a second time with the
/// benchmark's 16 class rules installed ([`CLASS_RULES`](super::peers::CLASS_RULES),
/// none matching the flood), right after its source-only row.
pub fn ab(bins: &[AbBinary], reps: usize, dur: Duration, flood_: AbFlood, v: &AbVariants) -> Result<Vec<AbVethRow>> {
    let AbVariants { classes, bans, banned, capture, chain } = *v;
    let cpu = bench_cpu();
    let mut setups = Vec::new();
    let mut captures = Captures(Vec::new());
    let floor = Net::new("abf")?;
    let floor_xdp = install(System::XdpDrop, &floor, DROP_LIMIT, DROP_LIMIT)?;
    let g = flood(&floor, flood_.sources, flood_.family, flood_.random)?;
    setups.push(("xdp_drop (floor)".to_string(), floor, floor_xdp, g));
    for (i, bin) in bins.iter().enumerate() {
        say(&format!("veth: setting up the dropping policer of {bin}"));
        let net = Net::new(&format!("ab{i}"))?;
        let capacity = bin.max_sources.to_string();
        let d = super::peers::policer_bin(&bin.path, &net, DROP_LIMIT, &["--max-sources", &capacity]);
        let g = flood(&net, flood_.sources, flood_.family, flood_.random)?;
        setups.push((bin.to_string(), net, Installed::Daemon(Box::new(d)), g));
        if classes {
            say(&format!("veth: setting up the dropping policer of {bin} with 16 class rules"));
            let net = Net::new(&format!("abc{i}"))?;
            super::peers::class_config(&net, &super::peers::CLASS_RULES, DROP_LIMIT)?;
            let d = super::peers::policer_bin(&bin.path, &net, DROP_LIMIT, &["--max-sources", &capacity]);
            super::peers::check_rules(&d, super::peers::CLASS_RULES.len() + 2)?;
            let g = flood(&net, flood_.sources, flood_.family, flood_.random)?;
            setups.push((format!("{bin} + 16 class rules"), net, Installed::Daemon(Box::new(d)), g));
        }
        if bans > 0 {
            // The same single addresses in the rule trie: for the build
            // before, as deny rules (what it can express); for the others,
            // as manual bans. Like is compared with like: a trie that
            // holds entries costs one lookup per frame either way.
            let what = if i == 0 { "deny rules" } else { "bans" };
            say(&format!("veth: setting up the dropping policer of {bin} with {bans} {what}"));
            let net = Net::new(&format!("abb{i}"))?;
            std::fs::write(&net.sb.config, ban_toml(bans, i > 0))
                .with_context(|| format!("write {}", net.sb.config))?;
            let max_rules = (bans + 16).to_string();
            let d = super::peers::policer_bin(
                &bin.path,
                &net,
                DROP_LIMIT,
                &["--max-sources", &capacity, "--max-rules", &max_rules],
            );
            super::peers::check_rules(&d, bans as usize + 2)?;
            let g = flood(&net, flood_.sources, flood_.family, flood_.random)?;
            setups.push((format!("{bin} + {bans} {what}"), net, Installed::Daemon(Box::new(d)), g));
        }
        if banned && i > 0 {
            say(&format!("veth: setting up the dropping policer of {bin} banning every source"));
            let net = Net::new(&format!("abn{i}"))?;
            let rule = |p: &str| {
                format!(
                    "[[rule]]\nprefix = \"{p}\"\nrate = \"{}pps\"\nburst = {}\nban_for = \"1d\"\n\n",
                    DROP_LIMIT.pps, DROP_LIMIT.burst
                )
            };
            std::fs::write(&net.sb.config, rule("0.0.0.0/0") + &rule("::/0"))
                .with_context(|| format!("write {}", net.sb.config))?;
            let d = crate::daemon::Daemon::attach_bin(
                &bin.path,
                &net.sb,
                &["--mode", "native", "--interval", "0", "--max-sources", &capacity],
            );
            let g = flood(&net, flood_.sources, flood_.family, flood_.random)?;
            setups.push((format!("{bin} banning (--ban-for 1d)"), net, Installed::Daemon(Box::new(d)), g));
        }
        if chain && i > 0 {
            say(&format!("veth: setting up the dropping policer of {bin} with xdp_pass in its chain"));
            let net = Net::new(&format!("abh{i}"))?;
            let d = super::peers::policer_bin(&bin.path, &net, DROP_LIMIT, &["--max-sources", &capacity]);
            chain_pass(&bin.path, &net.sb.rx_ns, &net.sb.rx_if)?;
            let g = flood(&net, flood_.sources, flood_.family, flood_.random)?;
            setups.push((format!("{bin} + xdp_pass in the chain"), net, Installed::Daemon(Box::new(d)), g));
        }
        if let Some(sample) = capture
            && i > 0
        {
            say(&format!("veth: setting up the dropping policer of {bin} with a capture of its drops, {sample}"));
            let net = Net::new(&format!("abk{i}"))?;
            let d = super::peers::policer_bin(&bin.path, &net, DROP_LIMIT, &["--max-sources", &capacity]);
            captures.start(&bin.path, &net.sb.rx_ns, sample)?;
            let g = flood(&net, flood_.sources, flood_.family, flood_.random)?;
            setups.push((
                format!("{bin} capturing (--dropped --sample {sample})"),
                net,
                Installed::Daemon(Box::new(d)),
                g,
            ));
        }
    }
    let runs: Vec<(&str, &Net, &Generator)> = setups.iter().map(|(l, n, _, g)| (l.as_str(), n, g)).collect();
    let samples = measure(&runs, cpu, dur, Duration::from_millis(500), reps)?;
    let cpu_of = |i: usize| samples[i].iter().map(|s| s.cpu).collect::<Vec<_>>();
    let ratio = |a: &[f64], b: &[f64]| Stat::of(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>());
    let floor = cpu_of(0);
    // Each row against the first binary's row of the same kind (its
    // label's suffix: plain, with class rules, with bans or deny rules),
    // else its plain row.
    let first_label = bins.first().map(|b| b.to_string()).unwrap_or_default();
    let kind =
        |label: &str, bin: &str| label.strip_prefix(bin).unwrap_or("").replace(" deny rules", " bans").to_string();
    let reference = |i: usize| -> usize {
        let bin = bins.iter().map(|b| b.to_string()).find(|b| setups[i].0.starts_with(b.as_str())).unwrap_or_default();
        let k = kind(&setups[i].0, &bin);
        (1..setups.len())
            .find(|&j| setups[j].0.starts_with(&first_label) && kind(&setups[j].0, &first_label) == k)
            .unwrap_or(1.min(setups.len() - 1))
    };
    Ok((0..setups.len())
        .map(|i| AbVethRow {
            label: setups[i].0.clone(),
            cpu_ns: Stat::of(&cpu_of(i)),
            vs_floor: ratio(&cpu_of(i), &floor),
            vs_first: ratio(&cpu_of(i), &cpu_of(reference(i))),
        })
        .collect())
}

/// Puts the reference xdp_pass in slot 0 of the chain of the daemon of
/// namespace `ns` on its interface `iface` (`bin status --json` names its
/// program; the chain is found through that program's maps, as the
/// daemon's pins are in its own mount namespace, which `ip netns exec`
/// gave it): the array of the interface's dispatcher in `CHAINS`, or in a
/// build from before dispatchers the program's one `CHAIN`.
fn chain_pass(bin: &std::path::Path, ns: &str, iface: &str) -> Result<()> {
    use aya::{
        maps::{Map, MapData, MapInfo, ProgramArray},
        programs::{Xdp, loaded_programs},
    };
    use policer_common::chain::{MAP_CHAIN, MAP_CHAINS};
    let out =
        std::process::Command::new("ip").args(["netns", "exec", ns]).arg(bin).args(["status", "--json"]).output()?;
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).context("policer status --json")?;
    let id = status["program_id"].as_u64().context("status: program_id")? as u32;
    let program_maps = |id: u32| -> Result<Vec<(u32, String)>> {
        let info = loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == id).context("a program")?;
        Ok(info
            .map_ids()?
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| Some((m, MapInfo::from_id(m).ok()?.name_as_str()?.to_string())))
            .collect())
    };
    let maps = program_maps(id)?;
    let chain = match maps.iter().find(|(_, n)| n == MAP_CHAINS) {
        Some((chains, _)) => {
            let index = policer_common::MAX_IFACE_SLOTS;
            let link = std::process::Command::new("ip").args(["-n", ns, "-j", "link", "show", iface]).output()?;
            let ifindex = serde_json::from_slice::<serde_json::Value>(&link.stdout)
                .ok()
                .and_then(|v| v[0]["ifindex"].as_u64())
                .context("the interface's index")? as u32;
            use std::os::fd::{AsFd, AsRawFd};
            let chains = MapData::from_id(*chains)?;
            let d: u32 = policer_user::batch::lookup(chains.fd().as_fd().as_raw_fd(), &(ifindex % index))?
                .context("no dispatcher for the interface")?;
            program_maps(d)?.into_iter().find(|(_, n)| n == MAP_CHAIN).context("the dispatcher's chain")?.0
        }
        None => {
            maps.iter().find(|(_, n)| n == MAP_CHAIN).context("the program has no chain (a build from before it)")?.0
        }
    };
    let mut arr = ProgramArray::try_from(Map::ProgramArray(MapData::from_id(chain)?))?;
    let pass = super::kernel::reference("xdp_pass", 0, 1, 0)?;
    let x: &Xdp = pass.program("xdp_pass").context("xdp_pass")?.try_into()?;
    arr.set(0, x.fd()?, 0)?;
    Ok(())
}

/// The `policer capture` clients of an [`ab`] run, ended when it ends.
struct Captures(Vec<std::process::Child>);

impl Captures {
    /// `BIN capture -w /dev/null --dropped --sample SAMPLE` against the
    /// daemon of namespace `ns` (its rate bound far above what the sample
    /// takes, so the row measures the path, not the bound); returns once
    /// the daemon says the capture runs.
    fn start(&mut self, bin: &std::path::Path, ns: &str, sample: &str) -> Result<()> {
        let child = std::process::Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(bin)
            .args(["capture", "-w", "/dev/null", "--dropped", "--sample", sample, "--max-pps", "100000"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start policer capture")?;
        self.0.push(child);
        let t0 = std::time::Instant::now();
        loop {
            let out = std::process::Command::new("ip")
                .args(["netns", "exec", ns])
                .arg(bin)
                .args(["stats", "--json"])
                .output()?;
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            if v["capture"]["active"].as_u64().unwrap_or(0) > 0 {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(10) {
                anyhow::bail!("the capture did not start within 10 s: {}", String::from_utf8_lossy(&out.stdout));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Captures {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` single IPv4 addresses spread over the whole address space (a threat
/// feed's shape), none of them in the flood's 10.0.0.0/8: as manual bans
/// ending in 2099 (`bans`), else as deny rules.
pub fn ban_toml(n: u32, bans: bool) -> String {
    let mut out = String::with_capacity(n as usize * 96);
    let mut x: u32 = 0x9e37_79b9;
    let mut seen = std::collections::HashSet::new();
    while seen.len() < n as usize {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        let a = std::net::Ipv4Addr::from(x);
        if a.octets()[0] == 10 || a.is_unspecified() || !seen.insert(x) {
            continue;
        }
        let ban = if bans { "ban = true\nexpires = \"2099-01-01T00:00:00Z\"\n" } else { "" };
        out.push_str(&format!("[[rule]]\nprefix = \"{a}/32\"\naction = \"deny\"\n{ban}\n"));
    }
    out
}

/// Ratio of two rows' CPU ns per frame, repetition by repetition.
pub fn ratio(a: &VethRow, b: &VethRow) -> Stat {
    let r: Vec<f64> = a.cpu_reps.iter().zip(&b.cpu_reps).map(|(x, y)| x / y).collect();
    Stat::of(&r)
}

#[cfg(test)]
mod tests {
    use super::AbBinary;

    #[test]
    fn ab_binary_takes_an_optional_max_sources() {
        let b: AbBinary = "target/release/policer".parse().unwrap();
        assert_eq!(b.path, std::path::Path::new("target/release/policer"));
        assert_eq!(b.max_sources, super::super::peers::TABLE_CAPACITY);
        let b: AbBinary = "/tmp/old:policer:32768".parse().unwrap();
        assert_eq!((b.path.to_str().unwrap(), b.max_sources), ("/tmp/old:policer", 32_768));
        // A suffix that is not a number is part of the path.
        let b: AbBinary = "/tmp/a:b".parse().unwrap();
        assert_eq!((b.path.to_str().unwrap(), b.max_sources), ("/tmp/a:b", 262_144));
        assert!("p:0".parse::<AbBinary>().is_err());
        assert!("p:99999999999".parse::<AbBinary>().is_err());
        assert!(":5".parse::<AbBinary>().is_err());
        assert_eq!("p:7".parse::<AbBinary>().unwrap().to_string(), "p --max-sources 7");
    }
}
