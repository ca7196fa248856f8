//! `policer suggest`: per rule, the rate and burst that a share of its
//! sources stays within, from what they sent — a capture's frames
//! ([`from_capture`], through replay's reader) or the daemon's judged
//! frames watched live ([`live::watch`], through a capture of every
//! verdict) — with the distribution it is based on, and the `policer rule
//! set` lines that apply it. The numbers are [`peaks`]'s, one definition.

pub mod live;
pub mod peaks;

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
    path::Path,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::{
    config::Config,
    error::{Error, Result},
    replay::{pcap::Capture, source_of},
};
use peaks::{BIN_NS, Kept, Peaks, Ppm, WINDOWS, per_s, percentile};

/// The sources tracked at most (each keeps 10 s of 100 ms counts: 400
/// bytes); frames of sources past it are counted, and said so.
pub const MAX_SOURCES: usize = 262_144;
/// The sources a suggestion would cut, listed per rule (the most first).
const CUT_LISTED: usize = 10;

/// A rule whose sources are counted: how `rule set` names it, and how its
/// sources are keyed.
#[derive(Clone, Debug)]
pub struct Target {
    /// As `policer rule ls` shows it: `10.0.0.0/8`, `10.0.0.0/8 [udp dport 53]`.
    pub rule: String,
    pub net: IpNet,
    /// Leading source bits that form one bucket: a source is a key.
    pub key_len: u32,
    /// The `rule set` options that name its class (`--proto`, `udp`).
    pub class_args: Vec<(&'static str, String)>,
    pub action: String,
    /// Its rate and burst now.
    pub rate: Option<String>,
    pub burst: Option<u64>,
}

/// The frames of an observation, per rule and source.
pub struct Observer {
    targets: Vec<Target>,
    sources: Vec<HashMap<IpNet, Peaks>>,
    tracked: usize,
    /// The first frame's time (a capture) or the watch's start.
    start_ns: Option<u64>,
    last_bin: u64,
    frames: u64,
    unmatched: u64,
    untracked: u64,
}

impl Observer {
    /// `start_ns`: when the observation began (`None`: at its first frame).
    pub fn new(targets: Vec<Target>, start_ns: Option<u64>) -> Observer {
        let sources = targets.iter().map(|_| HashMap::new()).collect();
        Observer { targets, sources, tracked: 0, start_ns, last_bin: 0, frames: 0, unmatched: 0, untracked: 0 }
    }

    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// A frame from `src` at `ts_ns` (ns since the epoch) that `target`'s
    /// rule judged.
    pub fn frame(&mut self, target: usize, src: IpAddr, ts_ns: u64) {
        let start = *self.start_ns.get_or_insert(ts_ns);
        let bin = ts_ns.saturating_sub(start) / BIN_NS;
        self.last_bin = self.last_bin.max(bin);
        self.frames += 1;
        let t = &self.targets[target];
        let full = if src.is_ipv4() { 32 } else { 128 };
        let key = IpNet::new(src, t.key_len.min(full) as u8).map(|n| n.trunc()).unwrap_or_else(|_| IpNet::from(src));
        match self.sources[target].get_mut(&key) {
            Some(p) => p.add(bin),
            None if self.tracked < MAX_SOURCES => {
                self.sources[target].insert(key, Peaks::new(bin));
                self.tracked += 1;
            }
            None => self.untracked += 1,
        }
    }

    /// A frame no rule of the observation judged.
    pub fn unmatched(&mut self) {
        self.unmatched += 1;
    }

    /// The report: `observed_ns` is the observation's length when known
    /// (a watch), else from its first frame to its last.
    pub fn finish(self, from: String, observed_ns: Option<u64>, keep: Ppm, mut notes: Vec<String>) -> Report {
        let bins = (self.last_bin + 1).max(observed_ns.unwrap_or(0) / BIN_NS);
        let bins = if self.frames == 0 { observed_ns.unwrap_or(0) / BIN_NS } else { bins };
        if self.untracked > 0 {
            notes.push(format!(
                "{} frames of sources past the first {MAX_SOURCES} were not counted: the percentiles are of those \
                 counted",
                self.untracked
            ));
        }
        if bins < WINDOWS[2] {
            notes.push(
                "less than 10 s observed: no 10 s peaks, the rate is the 1 s peaks' (observe longer for a rate that \
                 bursts do not set)"
                    .into(),
            );
        }
        let mut rules = Vec::new();
        let mut unseen = Vec::new();
        for (t, sources) in self.targets.into_iter().zip(self.sources) {
            if sources.is_empty() {
                unseen.push(t.rule);
            } else {
                rules.push(rule_report(t, sources, bins, keep));
            }
        }
        Report {
            from,
            observed_s: bins as f64 * BIN_NS as f64 / 1e9,
            keep_percent: keep as f64 / 10_000.0,
            frames: self.frames,
            unmatched_frames: self.unmatched,
            rules,
            unseen_rules: unseen,
            notes,
        }
    }
}

/// The percentiles of a window's per-source peaks, in frames per second.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dist {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    #[serde(rename = "p99.9")]
    pub p99_9: f64,
    pub max: f64,
}

impl Dist {
    /// Of `counts` (sorted) over windows of `w` bins.
    fn of(counts: &[u64], w: u64) -> Dist {
        let at = |share| per_s(percentile(counts, share).unwrap_or(0), w);
        Dist { p50: at(500_000), p90: at(900_000), p99: at(990_000), p99_9: at(999_000), max: at(1_000_000) }
    }
}

/// A source the suggestion would cut, with its peaks (frames per second).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cut {
    pub source: String,
    pub peak_1s: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_10s: Option<f64>,
}

/// One rule's suggestion and what it is based on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleReport {
    pub rule: String,
    pub action: String,
    /// The rule's rate and burst now.
    pub rate: Option<String>,
    pub burst: Option<u64>,
    pub key_len: u32,
    /// Sources (bucket keys) seen, and their frames.
    pub sources: u64,
    pub frames: u64,
    /// Per-source peak rates over sliding windows of 100 ms, 1 s and 10 s
    /// (none when less than 10 s was observed).
    pub peak_100ms: Dist,
    pub peak_1s: Dist,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peak_10s: Option<Dist>,
    /// The proposal: a rate in frames per second, a burst in frames.
    pub suggested_rate_pps: u64,
    pub suggested_burst: u64,
    /// Sources whose peaks stay within it.
    pub within: u64,
    /// The sources it would cut, highest 1 s peak first (at most 10).
    pub cut: Vec<Cut>,
    /// The line that applies it.
    pub command: String,
}

/// `policer suggest`'s answer (`--json`: docs/json.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// What was observed: `capture FILE`, or `daemon`.
    pub from: String,
    /// How long, in seconds (whole 100 ms bins).
    pub observed_s: f64,
    pub keep_percent: f64,
    /// Frames counted, and frames no rule of the suggestion judged.
    pub frames: u64,
    pub unmatched_frames: u64,
    pub rules: Vec<RuleReport>,
    /// Rules that had no frame.
    pub unseen_rules: Vec<String>,
    /// What limits the numbers (frames not seen, a short observation).
    pub notes: Vec<String>,
}

fn rule_report(t: Target, sources: HashMap<IpNet, Peaks>, bins: u64, keep: Ppm) -> RuleReport {
    let mut rows: Vec<(IpNet, [Option<u64>; 3])> = Vec::with_capacity(sources.len());
    let mut frames = 0;
    for (k, p) in sources {
        let (peaks, n) = p.finish(bins);
        frames += n;
        rows.push((k, peaks));
    }
    let sorted = |i: usize| {
        let mut v: Vec<u64> = rows.iter().filter_map(|r| r.1[i]).collect();
        v.sort_unstable();
        v
    };
    let (ms100, s1, s10) = (sorted(0), sorted(1), sorted(2));
    let kept = Kept {
        ms100: percentile(&ms100, keep).unwrap_or(0),
        s1: percentile(&s1, keep).unwrap_or(0),
        s10: percentile(&s10, keep),
    };
    let (rate, burst) = peaks::propose(kept);
    let within = rows.iter().filter(|r| peaks::within(&r.1, rate, burst)).count() as u64;
    let mut cut: Vec<&(IpNet, [Option<u64>; 3])> = rows.iter().filter(|r| !peaks::within(&r.1, rate, burst)).collect();
    cut.sort_by_key(|r| (std::cmp::Reverse(r.1[1]), r.0));
    let full = |k: &IpNet| if k.prefix_len() == k.max_prefix_len() { k.addr().to_string() } else { k.to_string() };
    let cut = cut
        .into_iter()
        .take(CUT_LISTED)
        .map(|r| Cut {
            source: full(&r.0),
            peak_1s: per_s(r.1[1].unwrap_or(0), WINDOWS[1]),
            peak_10s: r.1[2].map(|c| per_s(c, WINDOWS[2])),
        })
        .collect();
    RuleReport {
        command: command(&t, rate, burst),
        rule: t.rule,
        action: t.action,
        rate: t.rate,
        burst: t.burst,
        key_len: t.key_len,
        sources: rows.len() as u64,
        frames,
        peak_100ms: Dist::of(&ms100, WINDOWS[0]),
        peak_1s: Dist::of(&s1, WINDOWS[1]),
        peak_10s: (!s10.is_empty()).then(|| Dist::of(&s10, WINDOWS[2])),
        suggested_rate_pps: rate,
        suggested_burst: burst,
        within,
        cut,
    }
}

/// `policer rule set PREFIX [class options] --rate Rpps --burst B`: the
/// other fields of the rule keep their values (its action too: a monitor
/// rule stays one until `--action police`).
fn command(t: &Target, rate: u64, burst: u64) -> String {
    let mut s = format!("policer rule set {}", t.net);
    for (opt, v) in &t.class_args {
        s.push_str(&format!(" {opt} {}", shell_word(v)));
    }
    s.push_str(&format!(" --rate {rate}pps --burst {burst}"));
    s
}

/// `v` as one shell word: as it is when it holds nothing a shell reads,
/// else in single quotes.
fn shell_word(v: &str) -> String {
    if !v.is_empty() && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"./:,_-".contains(&b)) {
        v.to_string()
    } else {
        format!("'{}'", v.replace('\'', r"'\''"))
    }
}

/// The rules of a config file whose sources a capture is counted for: its
/// class-less rules with a rate that police or monitor (`only`: those of
/// these prefixes), and how many class rules are left out.
fn config_targets(config: &Path, only: &[IpNet]) -> Result<(Vec<Target>, usize)> {
    let text = std::fs::read_to_string(config).map_err(|source| Error::ConfigRead { path: config.into(), source })?;
    let (_, specs) = Config::parse(&text, config)?;
    let mut targets = Vec::new();
    let mut classes = 0;
    for (key, s) in &specs {
        if key.ban || s.ban().is_some() || !s.action.polices() || s.rate.is_none() {
            continue;
        }
        if !only.is_empty() && !only.contains(&s.net) {
            continue;
        }
        if !s.class().is_none() {
            classes += 1;
            continue;
        }
        targets.push(Target {
            rule: key.to_string(),
            net: s.net,
            key_len: s.key_len,
            class_args: vec![],
            action: s.action.to_string(),
            rate: s.rate.map(|r| r.to_string()),
            burst: Some(s.burst),
        });
    }
    Ok((targets, classes))
}

/// Longest-prefix match of a source among the targets' prefixes.
struct Lookup {
    /// Prefix length (longest first) → prefix → target.
    by_len: BTreeMap<std::cmp::Reverse<u8>, HashMap<IpNet, usize>>,
}

impl Lookup {
    fn new(targets: &[Target]) -> Lookup {
        let mut by_len: BTreeMap<_, HashMap<_, _>> = BTreeMap::new();
        for (i, t) in targets.iter().enumerate() {
            by_len.entry(std::cmp::Reverse(t.net.prefix_len())).or_default().insert(t.net, i);
        }
        Lookup { by_len }
    }

    fn find(&self, a: IpAddr) -> Option<usize> {
        let full = if a.is_ipv4() { 32 } else { 128 };
        self.by_len.iter().filter(|(l, _)| l.0 <= full).find_map(|(l, m)| {
            let n = IpNet::new(a, l.0).ok()?.trunc();
            m.get(&n).copied()
        })
    }
}

/// The suggestion from a capture's frames, each counted under the
/// class-less rule of `config` whose prefix is the longest over its
/// source, on the capture's own timestamps.
pub fn from_capture(file: &Path, config: &Path, only: &[IpNet], keep: Ppm) -> Result<Report> {
    let (targets, classes) = config_targets(config, only)?;
    if targets.is_empty() {
        return Err(Error::Invalid(format!(
            "{}: no rule to suggest for (rules that police or monitor with a rate, no class{})",
            config.display(),
            if only.is_empty() { "" } else { ", of the prefixes given with --rule" }
        )));
    }
    let lookup = Lookup::new(&targets);
    let mut obs = Observer::new(targets, None);
    let mut cap = Capture::open(file)?;
    let mut buf = Vec::new();
    while let Some(meta) = cap.next(&mut buf)? {
        match source_of(&buf).and_then(|a| lookup.find(a).map(|i| (a, i))) {
            Some((a, i)) => obs.frame(i, a, meta.ts_ns),
            None => obs.unmatched(),
        }
    }
    let mut notes = Vec::new();
    if classes > 0 {
        notes.push(format!(
            "{classes} class rule(s) left out: from a capture each frame counts under its prefix's class-less rule \
             (policer suggest --watch counts each under the rule that judged it)"
        ));
    }
    Ok(obs.finish(format!("capture {}", file.display()), None, keep, notes))
}

/// The report as text: per rule, the distribution, the proposal and the
/// line that applies it.
pub fn text(r: &Report) -> String {
    let mut s = format!(
        "policer suggest: {}, {:.1} s observed, {} frames; keeping {}% of each rule's sources\n",
        r.from, r.observed_s, r.frames, r.keep_percent
    );
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    for rr in &r.rules {
        let now = match (&rr.rate, rr.burst) {
            (Some(rate), Some(b)) => format!("{rate} burst {b}"),
            _ => "no rate".into(),
        };
        s.push_str(&format!(
            "\nrule {} ({}, now {now}, key /{}): {} sources, {} frames\n",
            rr.rule, rr.action, rr.key_len, rr.sources, rr.frames
        ));
        s.push_str(&format!(
            "  {:<24}{:>8} {:>8} {:>8} {:>8} {:>8}\n",
            "peak per source (pps)", "p50", "p90", "p99", "p99.9", "max"
        ));
        let row = |name: &str, d: &Dist| {
            format!("  over {name:<19}{:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1}\n", d.p50, d.p90, d.p99, d.p99_9, d.max)
        };
        s.push_str(&row("100 ms", &rr.peak_100ms));
        s.push_str(&row("1 s", &rr.peak_1s));
        if let Some(d) = &rr.peak_10s {
            s.push_str(&row("10 s", d));
        }
        s.push_str(&format!(
            "  suggested: {} pps, burst {}: {} of {} sources within it\n",
            rr.suggested_rate_pps, rr.suggested_burst, rr.within, rr.sources
        ));
        for c in &rr.cut {
            let ten = c.peak_10s.map(|p| format!(", {p:.1} pps over 10 s")).unwrap_or_default();
            s.push_str(&format!("  cut: {} ({:.1} pps over 1 s{ten})\n", c.source, c.peak_1s));
        }
        if rr.sources - rr.within > rr.cut.len() as u64 {
            s.push_str(&format!("  cut: and {} more\n", rr.sources - rr.within - rr.cut.len() as u64));
        }
    }
    if !r.unseen_rules.is_empty() {
        s.push_str(&format!("\nno frames for: {}\n", r.unseen_rules.join(", ")));
    }
    if !r.rules.is_empty() {
        s.push_str(
            "\n# To apply (first with --dry-run, and --action police for a rule in monitor mode, to see which live \
             sources each would drop):\n",
        );
        for rr in &r.rules {
            s.push_str(&rr.command);
            s.push('\n');
        }
    }
    s
}

#[cfg(test)]
mod tests;
