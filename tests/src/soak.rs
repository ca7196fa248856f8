//! The soak (`cargo xtask soak`, and a 30-second version in the test
//! tier): the real `policer` daemon polices a spoofed random-source flood,
//! a heavy hitter and in-profile sources while a driver, once a second,
//! changes a rule (`policer rule set` / `rule rm`) or edits the config file
//! and runs `policer reload`, scrapes `/metrics` and runs `policer top` and
//! `policer stats`, all as a user would: separate processes under
//! `ip netns exec`, HTTP from inside the namespace.
//!
//! Three criteria, graded at the end:
//! - the policer's passed count for the veth (`stats --json`, read after
//!   the traffic has stopped) equals what the receiving side counted;
//! - the daemon's RSS (VmRSS) grew at most 1 MB after a warm-up: the
//!   least sample of the last third of the run against the median of the
//!   first third after the warm-up. Single samples swing by up to a
//!   megabyte above the level (a render's buffers) and dip by megabytes
//!   below it (malloc giving pages back); a leak raises the level, so even
//!   the last third's least sample ends above where the first third sat;
//! - no control request waited more than 100 ms. A CLI call is a process
//!   of its own (`ip netns exec`, exec, connect, request, reply, exit), and
//!   on a loaded 2-vCPU machine most of its time is that, not the daemon.
//!   So each kind of call is first measured with the daemon up but no
//!   traffic (the baseline), and what it waited under the soak is its
//!   latency minus the baseline's median for the same call.

use std::{
    fmt::Write as _,
    io::{Read, Write},
    net::{Ipv4Addr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::{
    bench::{
        generator::Generator,
        sys::{if_index, rss_kib},
    },
    daemon::{Daemon, cli},
    netns::{Sandbox, enter},
    traffic::{self, Flow, Received, SendReport},
};

/// What a soak does; [`Options::short`] is the test tier's version.
#[derive(Clone, Debug)]
pub struct Options {
    pub duration: Duration,
    /// RSS is measured from the end of the warm-up (the table fills, the
    /// allocator reaches its working set).
    pub warmup: Duration,
    /// Spoofed frames per second, sent by the live-frames generator in
    /// bursts of [`FLOOD_BURST`].
    pub flood_pps: u32,
    /// `--max-sources` of the daemon: the flood churns this table.
    pub max_sources: u32,
}

/// "release" or "debug": which build of `policer` the soak runs (a debug
/// build answers more slowly), from its path.
fn build_of_policer() -> String {
    let p = crate::daemon::policer_bin();
    if p.components().any(|c| c.as_os_str() == "release") { "release" } else { "debug" }.into()
}

impl Options {
    /// `cargo xtask soak --minutes N`: a minute of warm-up (a fifth of
    /// shorter runs).
    pub fn minutes(n: f64) -> Options {
        let duration = Duration::from_secs_f64(n * 60.0);
        Options {
            duration,
            warmup: Duration::from_secs(60).min(duration / 5),
            flood_pps: FLOOD_PPS,
            max_sources: MAX_SOURCES,
        }
    }

    /// The test tier's 30 seconds, 10 of them warm-up.
    pub fn short() -> Options {
        Options {
            duration: Duration::from_secs(30),
            warmup: Duration::from_secs(10),
            flood_pps: FLOOD_PPS,
            max_sources: MAX_SOURCES,
        }
    }
}

/// Spoofed frames per second: a flood the receiving AF_PACKET socket can
/// still count frame by frame on a shared 2-vCPU machine (every spoofed
/// source is new, so nearly all of it is admitted and must be counted).
pub const FLOOD_PPS: u32 = 50_000;
/// Frames per live-frames test run (each call costs an RCU sync).
pub const FLOOD_BURST: u32 = 1000;
pub const MAX_SOURCES: u32 = 16_384;
/// The default rule: 100 pps, burst 10 per source.
const RATE: &str = "100pps";
const BURST: &str = "10";
/// The heavy hitter at 10x the default rate, in-profile sources at a tenth.
const HEAVY_PPS: f64 = 1000.0;
const IN_PROFILE: u32 = 20;
const IN_PROFILE_PPS: f64 = 10.0;
const METRICS_PORT: u16 = 9464;
/// The no-load baseline: this many times the driver's whole cycle (six rounds).
const BASELINE_CYCLES: usize = 10;
/// The criteria.
pub const MAX_WAIT_MS: f64 = 100.0;
pub const MAX_RSS_GROWTH_BYTES: i64 = 1_000_000;

/// The RSS levels of a run from its samples (s since the traffic started,
/// KiB): the median of the first third after the warm-up (a dip does not
/// move it), the least sample of the last third (a swing above the level
/// does not move it; a leak does), and the peak after the warm-up. Zeros
/// when a third is empty.
pub fn rss_levels(samples: &[(f64, u64)], warmup: f64, end: f64) -> (u64, u64, u64) {
    let third = (end - warmup).max(0.0) / 3.0;
    let sorted = |from: f64, to: f64| {
        let mut v: Vec<u64> = samples.iter().filter(|x| x.0 >= from && x.0 <= to).map(|x| x.1).collect();
        v.sort_unstable();
        v
    };
    let first = sorted(warmup, warmup + third);
    let last = sorted(end - third, end);
    let peak = samples.iter().filter(|x| x.0 >= warmup).map(|x| x.1).max().unwrap_or(0);
    (first.get(first.len() / 2).copied().unwrap_or(0), last.first().copied().unwrap_or(0), peak)
}

/// The soak's section of BENCHMARKS.md lies between these markers: `cargo
/// xtask soak` writes only that section, and the benchmark (policer-bench),
/// which rewrites the rest of the file, carries it over.
pub const SOAK_BEGIN: &str = "<!-- soak:begin -->";
pub const SOAK_END: &str = "<!-- soak:end -->";

/// The soak's section of `doc`, markers included (with its line end).
pub fn soak_section(doc: &str) -> Option<&str> {
    let start = doc.find(SOAK_BEGIN)?;
    let end = start + doc[start..].find(SOAK_END)? + SOAK_END.len();
    let end = if doc[end..].starts_with('\n') { end + 1 } else { end };
    Some(&doc[start..end])
}

/// `doc` with its soak section replaced by `section` (markers included),
/// or with `section` appended when it has none. Nothing else changes.
pub fn with_soak_section(doc: &str, section: &str) -> String {
    let mut section = section.to_string();
    if !section.ends_with('\n') {
        section.push('\n');
    }
    match soak_section(doc) {
        Some(old) => {
            let start = doc.find(SOAK_BEGIN).unwrap_or(0);
            format!("{}{section}{}", &doc[..start], &doc[start + old.len()..])
        }
        None if doc.is_empty() => section,
        None => {
            let sep = if doc.ends_with("\n\n") {
                ""
            } else if doc.ends_with('\n') {
                "\n"
            } else {
                "\n\n"
            };
            format!("{doc}{sep}{section}")
        }
    }
}

/// Latencies of one kind of call, ms.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Calls {
    pub call: String,
    pub baseline: Vec<f64>,
    pub load: Vec<f64>,
}

/// Percentile `p` (0..=1, nearest rank) of `v`; NaN when empty.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(f64::total_cmp);
    let rank = ((p * s.len() as f64).ceil() as usize).clamp(1, s.len());
    s[rank - 1]
}

impl Calls {
    pub fn base_median(&self) -> f64 {
        percentile(&self.baseline, 0.5)
    }

    /// The longest wait under the soak: max latency minus the no-load median.
    pub fn waited_max(&self) -> f64 {
        percentile(&self.load, 1.0) - self.base_median()
    }

    pub fn waited_p99(&self) -> f64 {
        percentile(&self.load, 0.99) - self.base_median()
    }
}

/// Everything one soak measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SoakReport {
    pub date: String,
    pub commit: String,
    pub build: String,
    pub seconds: f64,
    pub warmup_seconds: f64,
    pub max_sources: u32,
    pub flood_pps: u32,
    /// The XDP mode the daemon reported attaching in.
    pub xdp_mode: String,
    /// Frames sent: paced (heavy hitter and in-profile) and spoofed.
    pub paced_sent: u64,
    pub flood_sent: u64,
    /// Frames the receiving side counted: marked paced frames and the rest
    /// (the spoofed flood; nothing else crosses the sandbox's veth).
    pub received_paced: u64,
    pub received_other: u64,
    pub socket_drops: u64,
    /// The policer's counters for the veth, read after the traffic stopped.
    pub passed: u64,
    pub dropped: u64,
    /// Frames outside passed/dropped (unmatched, non-IP, malformed,
    /// fragments): zero here, every frame is IPv4 or IPv6 UDP under a rule.
    pub other_outcomes: u64,
    pub metrics_passed: Option<u64>,
    /// Frames the veth pair dropped before XDP saw them (its ring full when
    /// a burst of the flood arrived): the receiving veth's rx_dropped (the
    /// sending veth's tx_dropped counts the same frames again).
    pub veth_dropped: u64,
    pub buckets_created: u64,
    /// (seconds since the traffic started, VmRSS KiB), one a second.
    pub rss: Vec<(f64, u64)>,
    pub rss_warm_kib: u64,
    pub rss_end_kib: u64,
    pub rss_peak_kib: u64,
    pub calls: Vec<Calls>,
    pub scrape: Calls,
    /// The five longest waits: (s since the traffic started, call, ms).
    pub longest_waits: Vec<(f64, String, f64)>,
    pub ticks: u64,
    /// Calls that failed (must be none).
    pub errors: Vec<String>,
    pub sigterm_exit_ms: f64,
    pub sigterm_clean: bool,
}

impl SoakReport {
    pub fn received(&self) -> u64 {
        self.received_paced + self.received_other
    }

    pub fn counters_exact(&self) -> bool {
        self.socket_drops == 0 && self.passed == self.received() && self.other_outcomes == 0
    }

    /// Every frame sent was judged by the policer or dropped by the veth
    /// before it: offered = passed + dropped + veth drops.
    pub fn accounted(&self) -> bool {
        self.paced_sent + self.flood_sent == self.passed + self.dropped + self.veth_dropped
    }

    pub fn rss_growth_bytes(&self) -> i64 {
        (self.rss_end_kib as i64 - self.rss_warm_kib as i64) * 1024
    }

    pub fn rss_ok(&self) -> bool {
        self.rss_warm_kib > 0 && self.rss_end_kib > 0 && self.rss_growth_bytes() <= MAX_RSS_GROWTH_BYTES
    }

    /// The call that waited longest, and how long (ms).
    pub fn worst_wait(&self) -> (String, f64) {
        self.calls
            .iter()
            .map(|c| (c.call.clone(), c.waited_max()))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap_or_default()
    }

    pub fn waits_ok(&self) -> bool {
        let (_, w) = self.worst_wait();
        w.is_finite() && w <= MAX_WAIT_MS && self.calls.iter().all(|c| !c.load.is_empty())
    }

    pub fn passed_all(&self) -> bool {
        self.counters_exact() && self.accounted() && self.rss_ok() && self.waits_ok() && self.errors.is_empty()
    }

    /// The report's section, between the markers.
    pub fn markdown(&self) -> String {
        let mut w = String::new();
        let met = |b: bool| if b { "met" } else { "**not met**" };
        let _ = writeln!(w, "{SOAK_BEGIN}");
        let _ = writeln!(w, "## Soak\n");
        let _ = writeln!(
            w,
            "Run of {} (commit {}, {} build): {:.0} s of traffic, RSS measured after {:.0} s of warm-up. Written by \
             `cargo xtask soak [--minutes N]`, which replaces only this section (the benchmark keeps it).\n",
            self.date, self.commit, self.build, self.seconds, self.warmup_seconds
        );
        let _ = writeln!(
            w,
            "The real `policer` daemon on a veth ({} XDP, `--rate {RATE} --burst {BURST} --max-sources {}`, \
             `/metrics` on) receives a spoofed flood of random IPv4 sources in 10.0.0.0/8 ({} frames/s asked, {:.0} \
             sent, from the XDP live-frames generator in bursts of {FLOOD_BURST}), a heavy hitter at {HEAVY_PPS:.0} pps and \
             {IN_PROFILE} in-profile IPv4 and IPv6 sources at {IN_PROFILE_PPS:.0} pps (paced AF_PACKET). Once a \
             second a driver changes one thing in turn (`rule set` of a police rule and of a deny rule, a config \
             edit plus `policer reload` adding a monitor rule, the two `rule rm`, a config edit plus `reload` \
             removing it), scrapes `/metrics` and runs `policer top -n 10 --json` and `policer stats --json`: \
             {} rounds. Every CLI call is timed as a whole process (`ip netns exec` to exit); before the traffic \
             starts, the same cycle runs {BASELINE_CYCLES} times with no traffic (the machine is shared: \
             other work may load either phase; the disks' pending writes are written out before each, `sync`). A call \
             *waited* its latency minus the median of the same call in that baseline.\n",
            self.xdp_mode,
            self.max_sources,
            self.flood_pps,
            self.flood_sent as f64 / self.seconds.max(1e-9),
            self.ticks
        );
        let _ = writeln!(w, "| criterion | measured | |");
        let _ = writeln!(w, "|---|---|---|");
        let _ = writeln!(
            w,
            "| the policer's passed count for the veth equals the frames the receiving side counted | {} passed, {} \
             received ({} paced + {} spoofed), receive-socket drops {}, unmatched/non-IP/malformed/fragments {} | {} |",
            self.passed,
            self.received(),
            self.received_paced,
            self.received_other,
            self.socket_drops,
            self.other_outcomes,
            met(self.counters_exact())
        );
        let _ = writeln!(
            w,
            "| (a check of the sending side) every frame sent was judged by the policer or dropped by the veth \
             before it | {} + {} sent = {} passed + {} dropped + {} veth drops | {} |",
            self.paced_sent,
            self.flood_sent,
            self.passed,
            self.dropped,
            self.veth_dropped,
            met(self.accounted())
        );
        let _ = writeln!(
            w,
            "| daemon RSS grew ≤ 1 MB after the warm-up (a sample a second: the least of the last third of the run \
             against the median of the first third after {:.0} s of warm-up) | {:+} KiB ({} KiB, then {} KiB; peak {} \
             KiB) | {} |",
            self.warmup_seconds,
            self.rss_end_kib as i64 - self.rss_warm_kib as i64,
            self.rss_warm_kib,
            self.rss_end_kib,
            self.rss_peak_kib,
            met(self.rss_ok())
        );
        let (worst, ms) = self.worst_wait();
        let _ = writeln!(
            w,
            "| no control request waited > {MAX_WAIT_MS:.0} ms | longest wait {ms:.1} ms (`{worst}`) | {} |",
            met(self.waits_ok())
        );
        if !self.errors.is_empty() {
            let _ = writeln!(w, "| every call succeeded | {} failed: {} | **not met** |", self.errors.len(), {
                let mut e = self.errors.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
                e = e.replace('|', "/").replace('\n', " ");
                e
            });
        }
        let _ = writeln!(w);
        let _ = writeln!(
            w,
            "| call | no load: n, median / p99 / max (ms) | under the soak: n, median / p99 / max (ms) | waited: p99 / \
             max (ms) |"
        );
        let _ = writeln!(w, "|---|---|---|---|");
        let f = |v: &[f64]| {
            format!("{}, {:.1} / {:.1} / {:.1}", v.len(), percentile(v, 0.5), percentile(v, 0.99), percentile(v, 1.0))
        };
        for c in self.calls.iter().chain(std::iter::once(&self.scrape)) {
            let _ = writeln!(
                w,
                "| `{}` | {} | {} | {:.1} / {:.1} |",
                c.call,
                f(&c.baseline),
                f(&c.load),
                c.waited_p99(),
                c.waited_max()
            );
        }
        let _ = writeln!(w);
        if !self.longest_waits.is_empty() {
            let list: Vec<String> =
                self.longest_waits.iter().map(|(at, call, ms)| format!("{ms:.0} ms `{call}` at {at:.0} s")).collect();
            let _ = writeln!(w, "The longest waits, and when (seconds into the traffic): {}.\n", list.join("; "));
        }
        let _ = writeln!(w, "{WAITS_TRACED}\n");
        let _ = writeln!(
            w,
            "The `/metrics` scrape is an HTTP request from a thread inside the namespace (connect to the end of the \
             body), shown for comparison and not graded. Buckets created: {}; `/metrics` read after the traffic: {} passed. SIGTERM ended the \
             daemon in {:.0} ms ({}).",
            self.buckets_created,
            self.metrics_passed.map(|v| v.to_string()).unwrap_or_else(|| "–".into()),
            self.sigterm_exit_ms,
            if self.sigterm_clean { "exit 0" } else { "not cleanly" }
        );
        let _ = writeln!(w, "\n{SOAK_END}");
        w
    }
}

/// Measured apart from the soak (the commit is named): what the longest
/// waits were.
const WAITS_TRACED: &str = "Traced apart from this run (a 3-minute soak of commit 65a8d19 with `perf trace -e \
     fsync,fdatasync,rename --duration 30` on the daemon): each `rule set`/`rule rm` that waited more than 100 ms \
     coincided, to the second, with the daemon's synchronous write of the config file — an fsync of 106, 133 and \
     137 ms, a rename of 268 ms — on the root ext4 file system shared with other builds; the call waited that \
     long and a few ms more. A second traced run (commit 03ae679, every daemon system call over 40 ms): the same, \
     with fsyncs of 231 and 312 ms behind waits of 239 and 336 ms. In both, `reload` (which does not write the \
     file), `top`, `stats` and `/metrics` stayed under 100 ms, and a `reload` that waited 86 ms made no daemon \
     system call over 40 ms: what else a call waits for, in a run on this machine shared with other builds and \
     tests, was not traced.";

/// Writes out what the machine has pending for its disks before a phase is
/// timed. The daemon's `rule set`/`rule rm` fsync the config file, and on
/// ext4 an fsync commits the journal, which first writes the dirty data of
/// every file: right after a build (CI compiles the tests just before
/// this tier) that is hundreds of MB, written back 30 s after it was
/// dirtied — in the middle of the soak. One such fsync made a `rule rm`
/// wait 1.85 s (1.5 GB written without fsync just before the soak); with
/// the backlog written first, the calls wait for the daemon's own write.
fn settle_disk(say: &dyn Fn(&str)) {
    let ms = crate::traffic::settle_disk().as_secs_f64() * 1e3;
    if ms > 50.0 {
        say(&format!("the machine's pending disk writes took {ms:.0} ms to write out"));
    }
}

/// Sets the flag when dropped: the traffic threads stop even when the
/// driver panics, before the sandbox they run in is deleted.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

/// One timed CLI call; a failure is recorded, not fatal.
fn timed(sb: &Sandbox, args: &[&str], into: &mut Vec<f64>, errors: &mut Vec<String>) -> Option<String> {
    let t0 = Instant::now();
    let out = cli(sb, args);
    into.push(ms_since(t0));
    if !out.status.success() {
        errors.push(format!("policer {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()));
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// GET /metrics from inside `ns`: (ms from connect to the end of the body,
/// body). Bounded by socket timeouts.
fn scrape(ns: &str) -> Result<(f64, String)> {
    let ns = ns.to_string();
    thread::spawn(move || -> Result<(f64, String)> {
        enter(&ns).context("enter the namespace")?;
        let t0 = Instant::now();
        let mut s = TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, METRICS_PORT).into(), Duration::from_secs(10))
            .context("connect to /metrics")?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.set_write_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let ms = ms_since(t0);
        let (head, body) = resp.split_once("\r\n\r\n").context("not an HTTP response")?;
        if !head.starts_with("HTTP/1.1 200") {
            bail!("/metrics: {}", head.lines().next().unwrap_or(""));
        }
        Ok((ms, body.to_string()))
    })
    .join()
    .map_err(|_| anyhow::anyhow!("scrape thread panicked"))?
}

/// The value of sample `key` (`name{labels}`) in an exposition.
fn sample(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse::<f64>().ok().map(|v| v as u64))
}

/// Prefixes the driver changes: the paced sources' /16, each half of the
/// spoofed flood's /8.
const POLICED: &str = "198.18.0.0/16";
const DENIED: &str = "10.0.0.0/9";
const RELOADED: &str = "10.128.0.0/9";

/// `text` without the `[[rule]]` table of `prefix` (tables run from a line
/// starting with `[` to the next).
fn without_rule(text: &str, prefix: &str) -> String {
    let needle = format!("prefix=\"{prefix}\"");
    let mut out = String::new();
    let mut chunk = String::new();
    let flush = |chunk: &mut String, out: &mut String| {
        let is_it = chunk.trim_start().starts_with("[[rule]]")
            && chunk.lines().any(|l| l.split('#').next().unwrap_or("").replace([' ', '\t'], "") == needle);
        if !is_it {
            out.push_str(chunk);
        }
        chunk.clear();
    };
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with('[') {
            flush(&mut chunk, &mut out);
        }
        chunk.push_str(line);
    }
    flush(&mut chunk, &mut out);
    out
}

/// The calls the driver makes, in the order of [`Calls`] in the report.
const CALLS: [&str; 8] = [
    "rule set 198.18.0.0/16 --rate 200pps --burst 20",
    "rule set 10.0.0.0/9 --action deny",
    "reload (a monitor rule added to the file)",
    "rule rm 198.18.0.0/16",
    "rule rm 10.0.0.0/9",
    "reload (that rule removed from the file)",
    "top -n 10 --json",
    "stats --json",
];

/// One round of the driver: the change of round `k`, a scrape, `top`,
/// `stats`. Every call is timed into `calls` (indexed as [`CALLS`]).
fn round(sb: &Sandbox, k: usize, calls: &mut [Vec<f64>], scrapes: &mut Vec<f64>, errors: &mut Vec<String>) {
    let phase = k % 6;
    let edit = |add: bool| -> Result<()> {
        let text = std::fs::read_to_string(&sb.config).context("read the config file")?;
        let mut text = without_rule(&text, RELOADED);
        if add {
            text.push_str(&format!(
                "\n[[rule]]\nprefix = \"{RELOADED}\"\naction = \"monitor\"\nrate = \"5kpps\"\nburst = 100\nkey_len = 16\n"
            ));
        }
        std::fs::write(&sb.config, text).context("write the config file")
    };
    let change: &[&str] = match phase {
        0 => &["rule", "set", POLICED, "--rate", "200pps", "--burst", "20"],
        1 => &["rule", "set", DENIED, "--action", "deny"],
        3 => &["rule", "rm", POLICED],
        4 => &["rule", "rm", DENIED],
        _ => &["reload"],
    };
    if (phase == 2 || phase == 5)
        && let Err(e) = edit(phase == 2)
    {
        errors.push(format!("{e:#}"));
    }
    timed(sb, change, &mut calls[phase], errors);
    match scrape(&sb.rx_ns) {
        Ok((ms, body)) => {
            scrapes.push(ms);
            if !body.contains("policer_packets_total") {
                errors.push("/metrics: no policer_packets_total".into());
            }
        }
        Err(e) => errors.push(format!("/metrics: {e:#}")),
    }
    if let Some(out) = timed(sb, &["top", "-n", "10", "--json"], &mut calls[6], errors)
        && serde_json::from_str::<serde_json::Value>(&out).is_err()
    {
        errors.push(format!("top --json: not JSON: {}", out.chars().take(200).collect::<String>()));
    }
    if let Some(out) = timed(sb, &["stats", "--json"], &mut calls[7], errors)
        && serde_json::from_str::<serde_json::Value>(&out).is_err()
    {
        errors.push(format!("stats --json: not JSON: {}", out.chars().take(200).collect::<String>()));
    }
}

/// The paced flows: a heavy hitter at 10x the default rate (flow 0) and
/// in-profile IPv4 and IPv6 sources.
fn paced_flows() -> Vec<Flow> {
    let mut flows = vec![Flow { src: "198.18.0.1".parse().unwrap(), pps: HEAVY_PPS, len: 64 }];
    for i in 1..=IN_PROFILE {
        let src = if i % 2 == 1 { format!("198.18.1.{i}") } else { format!("2001:db8:1:{i:x}::1") };
        flows.push(Flow { src: src.parse().unwrap(), pps: IN_PROFILE_PPS, len: 80 });
    }
    flows
}

/// The spoofed flood, from a thread inside the transmit namespace, until
/// `until` or `stop`: bursts of [`FLOOD_BURST`] random 10.0.0.0/8 sources,
/// paced to `pps`. Returns the frames sent.
fn flood(sb: &Sandbox, pps: u32, until: Instant, stop: Arc<AtomicBool>) -> thread::JoinHandle<Result<u64>> {
    let (ns, ifc, mac) = (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_mac());
    thread::spawn(move || {
        let tx_index = if_index(&ns, &ifc)?;
        enter(&ns).context("enter the transmit namespace")?;
        let g = Generator::new(tx_index, mac, 1 << 24, Ipv4Addr::new(10, 0, 0, 0), true)?;
        let period = Duration::from_secs_f64(f64::from(FLOOD_BURST) / f64::from(pps.max(1)));
        let t0 = Instant::now();
        let mut sent = 0u64;
        let mut k = 0u32;
        while !stop.load(Ordering::Relaxed) && Instant::now() < until {
            g.burst(FLOOD_BURST)?;
            sent += u64::from(FLOOD_BURST);
            k += 1;
            if let Some(wait) = (t0 + period * k).checked_duration_since(Instant::now()) {
                thread::sleep(wait);
            }
        }
        Ok(sent)
    })
}

/// The `dir` ("rx" or "tx") dropped count of `ifc` in `ns`.
fn link_dropped(ns: &str, ifc: &str, dir: &str) -> Result<u64> {
    let out = crate::netns::ip_out(&["-n", ns, "-s", "-j", "link", "show", "dev", ifc]);
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -s -j link")?;
    v[0]["stats64"][dir]["dropped"].as_u64().context("dropped count")
}

fn stats_json(sb: &Sandbox) -> Result<serde_json::Value> {
    let out = cli(sb, &["stats", "--json"]);
    if !out.status.success() {
        bail!("policer stats --json: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    serde_json::from_slice(&out.stdout).context("stats --json")
}

/// Runs a soak in a fresh sandbox; returns its figures (the caller grades
/// them). Errors are for a soak that could not run at all.
pub fn run(o: &Options, say: &dyn Fn(&str)) -> Result<SoakReport> {
    let sb = Sandbox::new("soak");
    let max_sources = o.max_sources.to_string();
    let port = METRICS_PORT.to_string();
    let mut d = Daemon::attach(
        &sb,
        &["--rate", RATE, "--burst", BURST, "--max-sources", &max_sources, "--metrics", &port, "--interval", "1"],
    );
    let pid = d.pid();
    let out = d.stdout();
    let xdp_mode = out.split_once(" mode)").and_then(|(a, _)| a.rsplit('(').next()).unwrap_or("unknown").to_string();
    let mut r = SoakReport {
        date: crate::bench::sys::run("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default().trim().into(),
        commit: crate::bench::sys::run("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_default().trim().into(),
        build: build_of_policer(),
        seconds: o.duration.as_secs_f64(),
        warmup_seconds: o.warmup.as_secs_f64(),
        max_sources: o.max_sources,
        flood_pps: o.flood_pps,
        xdp_mode,
        ..Default::default()
    };
    let mut base: Vec<Vec<f64>> = vec![vec![]; CALLS.len()];
    let mut load: Vec<Vec<f64>> = vec![vec![]; CALLS.len()];
    let (mut base_scrape, mut load_scrape) = (vec![], vec![]);

    settle_disk(say);
    say(&format!("baseline: {BASELINE_CYCLES} times the driver's cycle of six rounds, with no traffic"));
    for k in 0..BASELINE_CYCLES * 6 {
        round(&sb, k, &mut base, &mut base_scrape, &mut r.errors);
    }

    settle_disk(say);
    say(&format!(
        "traffic for {:.0} s ({} spoofed frames/s, heavy hitter, {IN_PROFILE} in-profile sources)",
        o.duration.as_secs_f64(),
        o.flood_pps
    ));
    let stop = Arc::new(AtomicBool::new(false));
    let _stop_guard = StopOnDrop(stop.clone());
    let flows = paced_flows();
    let paced = {
        let (tx_ns, tx_if, rx_ns, rx_if, mac) =
            (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_ns.clone(), sb.rx_if.clone(), sb.rx_mac());
        let (flows, duration, stop) = (flows.clone(), o.duration, stop.clone());
        thread::spawn(move || -> (SendReport, Received) {
            traffic::run_in(&tx_ns, &tx_if, &rx_ns, &rx_if, mac, &flows, duration, Some(stop))
        })
    };
    let t0 = Instant::now();
    // The flood ends a little before the paced sender, so the receiver
    // (which stops after the paced sender and a quiet moment) counts all of it.
    let flooder = flood(&sb, o.flood_pps, t0 + o.duration.saturating_sub(Duration::from_millis(200)), stop.clone());
    // (round start, s since the traffic started; call; ms) of every call.
    let mut timeline: Vec<(f64, usize, f64)> = vec![];
    let mut k = 0usize;
    let mut next_say = Duration::from_secs(60);
    while t0.elapsed() < o.duration {
        let round_at = t0.elapsed().as_secs_f64();
        let before: Vec<usize> = load.iter().map(Vec::len).collect();
        round(&sb, k, &mut load, &mut load_scrape, &mut r.errors);
        for (i, v) in load.iter().enumerate() {
            timeline.extend(v[before[i]..].iter().map(|&ms| (round_at, i, ms)));
        }
        let at = t0.elapsed();
        match rss_kib(pid) {
            Some(kib) => r.rss.push((at.as_secs_f64(), kib)),
            None => {
                r.errors.push(format!("the daemon is gone at {:.1} s:\n{}", at.as_secs_f64(), d.stderr()));
                break;
            }
        }
        if at >= next_say {
            next_say += Duration::from_secs(60);
            let (_, kib) = r.rss.last().copied().unwrap_or_default();
            say(&format!("{:.0} s: {} rounds, RSS {kib} KiB, {} errors", at.as_secs_f64(), k + 1, r.errors.len()));
        }
        k += 1;
        if let Some(wait) = (t0 + Duration::from_secs(k as u64)).checked_duration_since(Instant::now()) {
            thread::sleep(wait.min(o.duration.saturating_sub(t0.elapsed())));
        }
    }
    r.ticks = k as u64;
    (r.rss_warm_kib, r.rss_end_kib, r.rss_peak_kib) =
        rss_levels(&r.rss, o.warmup.as_secs_f64(), t0.elapsed().as_secs_f64());

    let flood_result = flooder.join().map_err(|_| anyhow::anyhow!("flood thread panicked"))?;
    let (sent, got) = paced.join().map_err(|_| anyhow::anyhow!("paced traffic thread panicked"))?;
    r.flood_sent = flood_result.context("the spoofed flood")?;
    r.paced_sent = sent.sent.iter().sum();
    r.received_paced = got.per_flow.iter().sum();
    r.received_other = got.foreign;
    r.socket_drops = got.socket_drops;

    // The counters, now that nothing moves.
    let s = stats_json(&sb)?;
    let i = s["interfaces"].as_array().and_then(|a| a.iter().find(|i| i["name"] == sb.rx_if.as_str())).cloned();
    let i = i.context("the veth in stats --json")?;
    let n = |k: &str| i[k].as_u64().unwrap_or(u64::MAX);
    r.passed = n("passed_packets");
    r.dropped = n("dropped_packets");
    r.other_outcomes = ["unmatched_packets", "non_ip_packets", "malformed_packets", "fragment_packets"]
        .iter()
        .map(|k| n(k))
        .fold(0u64, u64::saturating_add);
    r.buckets_created = s["table"]["created"].as_u64().unwrap_or(0);
    r.veth_dropped = link_dropped(&sb.rx_ns, &sb.rx_if, "rx")?;
    r.metrics_passed = scrape(&sb.rx_ns).ok().and_then(|(_, body)| {
        sample(&body, &format!("policer_packets_total{{iface=\"{}\",verdict=\"passed\"}}", sb.rx_if))
    });

    r.calls = CALLS
        .iter()
        .zip(base.into_iter().zip(load))
        .map(|(c, (baseline, load))| Calls { call: format!("policer {c}"), baseline, load })
        .collect();
    let mut waits: Vec<(f64, String, f64)> =
        timeline.iter().map(|&(at, i, ms)| (at, r.calls[i].call.clone(), ms - r.calls[i].base_median())).collect();
    waits.sort_by(|a, b| b.2.total_cmp(&a.2));
    r.longest_waits = waits.into_iter().take(5).collect();
    r.scrape = Calls { call: "GET /metrics".into(), baseline: base_scrape, load: load_scrape };

    let t = Instant::now();
    r.sigterm_clean = d.stop_with(libc::SIGTERM);
    r.sigterm_exit_ms = ms_since(t);
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soak_section_is_replaced_appended_and_carried_over() {
        let a = format!("{SOAK_BEGIN}\n## Soak\nold\n{SOAK_END}\n");
        let b = format!("{SOAK_BEGIN}\n## Soak\nnew\n{SOAK_END}\n");
        let doc = format!("# Benchmarks\n\ntext\n\n{a}\nafter\n");
        assert_eq!(soak_section(&doc), Some(a.as_str()));
        // Replaced in place; what surrounds it is untouched.
        assert_eq!(with_soak_section(&doc, &b), format!("# Benchmarks\n\ntext\n\n{b}\nafter\n"));
        // Appended to a report without one (as the benchmark writes it).
        assert_eq!(with_soak_section("# Benchmarks\n", &b), format!("# Benchmarks\n\n{b}"));
        assert_eq!(with_soak_section("", &b), b);
        assert_eq!(soak_section("# Benchmarks\n"), None);
    }

    #[test]
    fn removes_only_that_rule() {
        let text = "[daemon]\nmode = \"auto\"\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100pps\"\n\n[[rule]]\n\
                    prefix = \"10.128.0.0/9\" # soak\naction = \"monitor\"\n\n[[rule]]\nprefix = \"::/0\"\n";
        let out = without_rule(text, "10.128.0.0/9");
        assert_eq!(
            out,
            "[daemon]\nmode = \"auto\"\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100pps\"\n\n[[rule]]\nprefix = \"::/0\"\n"
        );
        assert_eq!(without_rule(&out, "10.128.0.0/9"), out);
    }

    #[test]
    fn rss_levels_see_a_leak_and_not_the_swings() {
        let series = |f: &dyn Fn(u64) -> u64| (0..30u64).map(|i| (i as f64 + 1.0, f(i))).collect::<Vec<_>>();
        // A flat level with a render's swing every third second and malloc
        // giving back pages at the warm-up's end (the sample that made a
        // single-point reading fail): no growth.
        let flat = series(&|i| match i {
            9 => 22_024,
            _ if i % 3 == 2 => 26_100,
            _ => 25_430,
        });
        let (warm, end, peak) = rss_levels(&flat, 10.0, 30.0);
        assert_eq!((warm, end, peak), (25_430, 25_430, 26_100));
        // A step of the render's swing sitting on the medians' side (two
        // high samples in three): the least sample still reads the level.
        let swing = series(&|i| if i % 3 == 0 { 25_150 } else { 25_830 });
        let (warm, end, _) = rss_levels(&swing, 10.0, 30.0);
        assert!(end <= warm, "{warm} -> {end}");
        // 100 KiB a second from the warm-up on: 1.3 MB between the medians.
        let leak = series(&|i| 25_000 + 100 * i.saturating_sub(9) + if i % 3 == 2 { 700 } else { 0 });
        let (warm, end, _) = rss_levels(&leak, 10.0, 30.0);
        assert!((end - warm) * 1024 > MAX_RSS_GROWTH_BYTES as u64, "{warm} -> {end}");
        // No samples after the warm-up: no reading (and not met).
        assert_eq!(rss_levels(&flat[..5], 10.0, 30.0), (0, 0, 0));
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((percentile(&v, 0.5), percentile(&v, 0.99), percentile(&v, 1.0)), (50.0, 99.0, 100.0));
        assert!(percentile(&[], 0.5).is_nan());
    }
}
