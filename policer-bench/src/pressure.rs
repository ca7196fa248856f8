//! Table pressure on veth (`--only pressure`): floods that outnumber the
//! table, measured like the veth rows (generator and receiver on one CPU,
//! cost per received frame, repetitions interleaved), each beside an
//! xdp_drop floor fed the same flood.
//!
//! - **Population flood**: more over-rate sources than the table holds
//!   ([`POPULATION_SOURCES`] in turn against `--max-sources`
//!   [`POPULATION_CAPACITY`]), each coming back long after the table had
//!   to give its place to others. What counts is the share of the sources'
//!   summed budget that got through (admitted / Σ (rate · T + burst)):
//!   above 1, evicted sources came back to fresh buckets; below 1, sources
//!   were refused buckets they were owed.
//! - **Spoofed flood**: random sources, [`SPOOF_FACTOR`]× the table, at the
//!   generator's full speed, against the policer and against nftables with
//!   a dynamic set of the same size: cost per packet side by side, and
//!   what each admitted.
//!
//! Both for IPv4 and IPv6 (a source per /64). The rows know nothing of how
//! the policer keeps its table: they measure whatever build runs.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Result;
use serde::{Deserialize, Serialize};

use super::{
    Stat,
    generator::Generator,
    peers::{Family, Installed, TABLE_CAPACITY, attach_reference, nft_set, policer},
    say,
    sys::{Net, bench_cpu},
    veth::{DROP_LIMIT, Sample, flood, measure},
};

/// `--max-sources` of the population rows.
pub const POPULATION_CAPACITY: u32 = 16_384;
/// Sources of the population flood: 4× `--max-sources`. (The IPv4 table
/// has two slots per source of capacity, so 2× would only fill it.)
pub const POPULATION_SOURCES: u32 = 4 * POPULATION_CAPACITY;
/// `--max-sources` of the policer and size of nftables' set in the spoofed
/// rows: the capacity every veth row has.
pub const SPOOF_CAPACITY: u32 = TABLE_CAPACITY;
/// Random sources per table entry in the spoofed flood.
pub const SPOOF_FACTOR: u32 = 16;
pub const SPOOF_SOURCES: u32 = SPOOF_FACTOR * SPOOF_CAPACITY;

// The floods outnumber the tables as the report says, and the IPv4
// spoofed sources (from 10.1.0.0) stay in 10/8.
const _: () = assert!(POPULATION_SOURCES > 2 * POPULATION_CAPACITY);
const _: () = assert!(SPOOF_SOURCES >= 10 * SPOOF_CAPACITY);
const _: () = assert!(SPOOF_SOURCES as u64 + (1 << 16) <= 1 << 24);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flood {
    Population,
    Spoofed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Who {
    /// xdp_drop fed the same flood.
    Floor,
    Policer,
    Nft,
}

/// One row to measure.
struct Spec {
    flood: Flood,
    family: Family,
    who: Who,
}

impl Spec {
    fn sources(&self) -> u32 {
        match self.flood {
            Flood::Population => POPULATION_SOURCES,
            Flood::Spoofed => SPOOF_SOURCES,
        }
    }

    fn capacity(&self) -> u32 {
        match (self.who, self.flood) {
            (Who::Floor, _) => 0,
            (_, Flood::Population) => POPULATION_CAPACITY,
            (_, Flood::Spoofed) => SPOOF_CAPACITY,
        }
    }

    fn key(&self) -> String {
        let flood = match self.flood {
            Flood::Population => "population",
            Flood::Spoofed => "spoofed",
        };
        let who = match self.who {
            Who::Floor => "xdp_drop",
            Who::Policer => "policer",
            Who::Nft => "nft_dynset",
        };
        let family = match self.family {
            Family::V4 => "v4",
            Family::V6 => "v6",
        };
        format!("{flood}_{who}_{family}")
    }

    fn label(&self) -> String {
        let who = match (self.who, self.family) {
            (Who::Floor, _) => "xdp_drop (floor)".to_string(),
            (Who::Policer, _) => format!("policer, --max-sources {}", self.capacity()),
            (Who::Nft, Family::V4) => format!("nftables, ip saddr dynamic set of {} + limit", self.capacity()),
            (Who::Nft, Family::V6) => format!("nftables, ip6 saddr dynamic set of {} + limit", self.capacity()),
        };
        let flood = match self.flood {
            Flood::Population => format!("{} sources in turn", self.sources()),
            Flood::Spoofed => format!("{} random sources", self.sources()),
        };
        format!("{}, {flood}: {who}", self.family.name())
    }

    /// Namespace tag: short, unique among the rows.
    fn tag(&self) -> String {
        let f = match self.flood {
            Flood::Population => 'q',
            Flood::Spoofed => 'z',
        };
        let w = match self.who {
            Who::Floor => 'f',
            Who::Policer => 'p',
            Who::Nft => 'n',
        };
        let n = if self.family == Family::V4 { '4' } else { '6' };
        format!("{f}{w}{n}")
    }
}

/// The rows, in run order: per family, the population flood (floor,
/// policer), then the spoofed flood (floor, policer, nftables).
fn specs() -> Vec<Spec> {
    let mut v = vec![];
    for family in [Family::V4, Family::V6] {
        for who in [Who::Floor, Who::Policer] {
            v.push(Spec { flood: Flood::Population, family, who });
        }
        for who in [Who::Floor, Who::Policer, Who::Nft] {
            v.push(Spec { flood: Flood::Spoofed, family, who });
        }
    }
    v
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PressureRow {
    pub key: String,
    pub label: String,
    pub flood: Flood,
    pub family: Family,
    pub who: Who,
    /// Sources in the flood.
    pub sources: u32,
    /// Random sources (else in turn).
    pub random: bool,
    /// `--max-sources` or the set's size (0 for the floor).
    pub capacity: u32,
    /// CPU ns per received frame (as the veth rows).
    pub cpu_ns: Stat,
    pub cpu_reps: Vec<f64>,
    /// Against the floor fed the same flood, repetition by repetition.
    pub vs_floor: Stat,
    pub mpps: Stat,
    /// Share of received frames that reached the UDP layer.
    pub admitted: Stat,
    /// Frames that reached the UDP layer, per second of flood (thousands).
    pub admitted_kpps: Stat,
    /// Population rows: admitted / Σ over sources (rate · T + burst), T the
    /// repetition's flood time. Every source offers far more than its rate,
    /// so a perfect per-source policer admits 1.0.
    pub budget_share: Option<Stat>,
    pub received: u64,
    pub lost: u64,
    /// Seconds of flood over the measured repetitions (whole generator
    /// calls: a slow row floods longer than the repetition's nominal time).
    pub flood_seconds: f64,
    /// The policer's own totals (`policer stats --json`) over the measured
    /// repetitions: every numeric field, after minus before.
    pub counters: BTreeMap<String, i64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PressureResults {
    pub reps: usize,
    pub seconds_per_rep: f64,
    pub cpu: usize,
    pub limit_pps: u64,
    pub burst: u64,
    pub rows: Vec<PressureRow>,
}

impl PressureResults {
    pub fn row(&self, flood: Flood, family: Family, who: Who) -> Option<&PressureRow> {
        self.rows.iter().find(|r| r.flood == flood && r.family == family && r.who == who)
    }
}

/// The numeric fields of `policer stats --json`'s totals.
fn totals(net: &Net) -> BTreeMap<String, i64> {
    let out = crate::daemon::cli(&net.sb, &["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut m = BTreeMap::new();
    if let Some(o) = v["totals"].as_object() {
        for (k, x) in o {
            if let Some(n) = x.as_i64()
                && k != "ifindex"
            {
                m.insert(k.clone(), n);
            }
        }
    }
    m
}

pub fn run(quick: bool, reps: usize) -> Result<PressureResults> {
    let dur = Duration::from_millis(if quick { 600 } else { 2000 });
    let cpu = bench_cpu();
    let limit = DROP_LIMIT;
    let specs = specs();
    let mut setups: Vec<(String, Net, Installed, Generator)> = vec![];
    for s in &specs {
        let label = s.label();
        say(&format!("pressure: setting up {label}"));
        let net = Net::new(&s.tag())?;
        let inst = match s.who {
            Who::Floor => Installed::Xdp(Box::new(attach_reference(&net, "xdp_drop")?)),
            Who::Policer => {
                let capacity = s.capacity().to_string();
                Installed::Daemon(Box::new(policer(&net, limit, &["--max-sources", &capacity])))
            }
            Who::Nft => {
                nft_set(&net, limit, s.family, s.capacity())?;
                Installed::Netfilter
            }
        };
        let g = flood(&net, s.sources(), s.family, s.flood == Flood::Spoofed)?;
        setups.push((label, net, inst, g));
    }
    let runs: Vec<(&str, &Net, &Generator)> = setups.iter().map(|(l, n, _, g)| (l.as_str(), n, g)).collect();
    // The policer's own counters over the measured repetitions: read
    // after a warm-up of our own (which fills every table: the population
    // flood goes round its sources many times, the spoofed flood fills a
    // table of 262 144 in a fraction of it) and after the repetitions.
    let warm = Duration::from_millis(if quick { 300 } else { 1000 });
    for (label, net, g) in &runs {
        say(&format!("pressure: warm-up {label}"));
        g.flood(&net.sb.tx_ns, cpu, warm, super::generator::CHUNK)?;
    }
    let daemons: Vec<Option<&Net>> =
        specs.iter().zip(&setups).map(|(s, (_, net, ..))| (s.who == Who::Policer).then_some(net)).collect();
    let c0: Vec<BTreeMap<String, i64>> = daemons.iter().map(|n| n.map(totals).unwrap_or_default()).collect();
    let samples = measure(&runs, cpu, dur, Duration::ZERO, reps)?;
    let c1: Vec<BTreeMap<String, i64>> = daemons.iter().map(|n| n.map(totals).unwrap_or_default()).collect();
    let floor_of = |flood: Flood, family: Family| {
        specs.iter().position(|s| s.flood == flood && s.family == family && s.who == Who::Floor)
    };
    let mut rows = vec![];
    for (i, s) in specs.iter().enumerate() {
        let ss: &[Sample] = &samples[i];
        if let Installed::Daemon(d) = &setups[i].2
            && !d.stderr().is_empty()
        {
            say(&format!("pressure: {} daemon said: {}", setups[i].0, d.stderr()));
        }
        let v = |f: &dyn Fn(&Sample) -> f64| Stat::of(&ss.iter().map(f).collect::<Vec<_>>());
        let floor = floor_of(s.flood, s.family).map(|f| &samples[f]);
        let vs_floor = match floor {
            Some(f) => Stat::of(&ss.iter().zip(f).map(|(a, b)| a.cpu / b.cpu).collect::<Vec<_>>()),
            None => Stat::of(&[]),
        };
        let budget_share = (s.flood == Flood::Population && s.who != Who::Floor).then(|| {
            v(&|x: &Sample| {
                let t = x.wall * x.received as f64 / 1e9;
                let budget = f64::from(s.sources()) * (limit.pps as f64 * t + limit.burst as f64);
                x.admitted_frames as f64 / budget
            })
        });
        let counters =
            c1[i].iter().map(|(k, b)| (k.clone(), b - c0[i].get(k).copied().unwrap_or(0))).collect::<BTreeMap<_, _>>();
        rows.push(PressureRow {
            key: s.key(),
            label: s.label(),
            flood: s.flood,
            family: s.family,
            who: s.who,
            sources: s.sources(),
            random: s.flood == Flood::Spoofed,
            capacity: s.capacity(),
            cpu_ns: v(&|x: &Sample| x.cpu),
            cpu_reps: ss.iter().map(|x| x.cpu).collect(),
            vs_floor,
            mpps: v(&|x: &Sample| x.mpps),
            admitted: v(&|x: &Sample| x.admitted),
            admitted_kpps: v(&|x: &Sample| x.admitted_frames as f64 / (x.wall * x.received as f64) * 1e6),
            budget_share,
            received: ss.iter().map(|x| x.received).sum(),
            lost: ss.iter().map(|x| x.lost).sum(),
            flood_seconds: ss.iter().map(|x| x.wall * x.received as f64 / 1e9).sum(),
            counters,
        });
    }
    Ok(PressureResults {
        reps,
        seconds_per_rep: dur.as_secs_f64(),
        cpu,
        limit_pps: limit.pps,
        burst: limit.burst,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_have_unique_keys_and_short_tags() {
        let specs = specs();
        let keys: std::collections::HashSet<String> = specs.iter().map(Spec::key).collect();
        let tags: std::collections::HashSet<String> = specs.iter().map(Spec::tag).collect();
        assert_eq!((keys.len(), tags.len()), (specs.len(), specs.len()));
        // Interface names are "pbr" + tag and "pbt" + tag (IFNAMSIZ 16).
        assert!(specs.iter().all(|s| s.tag().len() + 3 <= 15));
        // Every policer and nftables row has a floor fed the same flood.
        for s in specs.iter().filter(|s| s.who != Who::Floor) {
            assert!(specs.iter().any(|f| f.who == Who::Floor && f.flood == s.flood && f.family == s.family));
        }
    }
}
