//! The control plane, measured the way a user runs it: the real `policer`
//! binary, daemon and CLI as separate processes under `ip netns exec`.

use std::{
    fmt::Write as _,
    net::Ipv4Addr,
    os::linux::fs::MetadataExt,
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use policer_user::{
    control::{Reply, Request},
    rules::{BurstValue, RuleConfig},
};
use serde::{Deserialize, Serialize};

use super::{
    Stat,
    accuracy::paced,
    generator::Generator,
    say,
    sys::{Net, bench_cpu, rss_kib},
};
use crate::{
    daemon::{Daemon, cli},
    traffic::{Flow, epoch_ns},
};

pub const RULES: u32 = 100_000;

/// One measured quantity: a statistic, or why it was not measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Measure {
    pub key: String,
    pub label: String,
    pub unit: String,
    pub value: Option<Stat>,
    pub note: String,
}

fn m(key: &str, label: &str, unit: &str, v: &[f64], note: impl Into<String>) -> Measure {
    Measure { key: key.into(), label: label.into(), unit: unit.into(), value: Some(Stat::of(v)), note: note.into() }
}

fn not_measured(key: &str, label: &str, unit: &str, why: impl Into<String>) -> Measure {
    Measure { key: key.into(), label: label.into(), unit: unit.into(), value: None, note: why.into() }
}

/// The n-th rule prefix of the big rule set: host routes in 100.64.0.0/10.
fn prefix(i: u32) -> String {
    format!("{}/32", Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i))
}

/// A config file with the default rule and `n` more rules.
fn config(n: u32, rate: &str) -> String {
    let mut s = String::with_capacity(n as usize * 64);
    s.push_str("[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1Mpps\"\nburst = 1000\n\n");
    for i in 0..n {
        let _ = write!(s, "[[rule]]\nprefix = \"{}\"\nrate = \"{rate}\"\nburst = 50\n\n", prefix(i));
    }
    s
}

/// A config file with the default rule and `n` manual bans (host routes,
/// as [`prefix`]), ending far in the future: the bulk way to make them
/// (`policer ban` writes the file once per ban).
fn config_bans(n: u32) -> String {
    let mut s = String::with_capacity(n as usize * 72);
    s.push_str("[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1Mpps\"\nburst = 1000\n\n");
    for i in 0..n {
        let _ = write!(s, "[[rule]]\nprefix = \"{}\"\nban = true\nexpires = \"2099-01-01T00:00:00Z\"\n\n", prefix(i));
    }
    s
}

/// One `/metrics` scrape from the daemon's namespace, ms (NaN if it failed).
fn timed_scrape(net: &Net, port: u16) -> f64 {
    let t0 = Instant::now();
    let ns = net.sb.rx_ns.clone();
    let ok = std::panic::catch_unwind(|| crate::daemon::scrape(&ns, port)).is_ok_and(|text| text.ends_with("# EOF\n"));
    if ok { t0.elapsed().as_secs_f64() * 1e3 } else { f64::NAN }
}

fn start(net: &Net, args: &[&str]) -> (Daemon, f64) {
    start_with(net, RULES, args)
}

/// [`start`] with room for `rules` rules (and the 1 000 the runs add).
fn start_with(net: &Net, rules: u32, args: &[&str]) -> (Daemon, f64) {
    let max_rules = (rules + 1_000).to_string();
    let mut v = vec!["--mode", "native", "--interval", "0", "--max-rules", &max_rules];
    v.extend_from_slice(args);
    let t0 = Instant::now();
    let d = Daemon::attach(&net.sb, &v);
    (d, t0.elapsed().as_secs_f64() * 1e3)
}

/// Runs a CLI verb in the daemon's namespace; returns (ms, stdout).
fn timed_cli(net: &Net, args: &[&str]) -> Result<(f64, String)> {
    let t0 = Instant::now();
    let out = cli(&net.sb, args);
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        bail!("policer {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok((ms, String::from_utf8_lossy(&out.stdout).into_owned()))
}

/// One request on the daemon's control socket, from this process (no
/// process start): the socket of the receiving namespace, found by its
/// inode as the CLI does.
fn request(net: &Net, req: &Request) -> Result<Reply> {
    let ino = std::fs::metadata(format!("/run/netns/{}", net.sb.rx_ns))?.st_ino();
    let path = format!("{}/ns-{ino}.sock", policer_user::control::RUN_DIR);
    policer_user::control::call_at(std::path::Path::new(&path), req, Duration::from_secs(60))
        .with_context(|| format!("request to {path}"))
}

fn rule_set(i: u32, rate: &str) -> Request {
    Request::RuleSet {
        rule: RuleConfig {
            prefix: prefix(i),
            rate: Some(rate.into()),
            burst: Some(BurstValue::Count(50)),
            ..RuleConfig::default()
        },
        runtime: false,
        replace: false,
        force: false,
    }
}

fn rss_mib(d: &Daemon) -> f64 {
    rss_kib(d.pid()).map(|k| k as f64 / 1024.0).unwrap_or(f64::NAN)
}

/// The daemon's peak RSS so far (VmHWM), MiB.
fn peak_mib(d: &Daemon) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid())).unwrap_or_default();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).and_then(|v| v.split_whitespace().next());
    kib.and_then(|k| k.parse::<f64>().ok()).map_or(f64::NAN, |k| k / 1024.0)
}

/// The CPU time the daemon has used so far (user and system, all its
/// threads), ms.
fn cpu_ms(d: &Daemon) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", d.pid())).unwrap_or_default();
    // After the command's closing parenthesis: field 3 on; utime and stime
    // are fields 14 and 15, in clock ticks.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i - 3).and_then(|v| v.parse::<f64>().ok()).unwrap_or(f64::NAN);
    // SAFETY: sysconf reads a constant of the system.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    (ticks(14) + ticks(15)) * 1e3 / hz
}

/// A writer of `path` that syncs every 64 KiB it writes (as `dd
/// oflag=dsync` does), until `stop`: the slow disk of a shared host.
fn dsync_writer(path: std::path::PathBuf, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::{io::Write as _, os::unix::fs::OpenOptionsExt as _, sync::atomic::Ordering};
    let mut written = 0u64;
    let block = vec![0x5au8; 64 << 10];
    while !stop.load(Ordering::SeqCst) {
        let Ok(mut f) =
            std::fs::OpenOptions::new().create(true).write(true).truncate(true).custom_flags(libc::O_DSYNC).open(&path)
        else {
            return written;
        };
        // 16 MiB a file, then it starts again (the disk's room stays as it was).
        for _ in 0..256 {
            if stop.load(Ordering::SeqCst) || f.write_all(&block).is_err() {
                break;
            }
            written += block.len() as u64;
        }
    }
    let _ = std::fs::remove_file(&path);
    written
}

/// `rule set` requests, one after another from 4 clients, with 100 000
/// rules loaded while a writer beside the config file syncs every 64 KiB
/// it writes: each request's time, and the owner's record of how long a
/// request waited in its queue and a write of the file took.
fn dsync(net: &Net, quick: bool) -> Result<Vec<Measure>> {
    use std::sync::atomic::{AtomicBool, Ordering};
    say("control: rule set while another writer syncs the disk");
    std::fs::write(&net.sb.config, config(RULES, "500pps"))?;
    let (d, _) = start(net, &[]);
    let dir = std::path::Path::new(&net.sb.config).parent().unwrap_or(std::path::Path::new("/tmp")).to_path_buf();
    let stop = AtomicBool::new(false);
    let per = if quick { 25 } else { 100 };
    let (mut each, written, secs) = std::thread::scope(|s| {
        let w = s.spawn(|| dsync_writer(dir.join(".policer-bench-dsync"), &stop));
        std::thread::sleep(Duration::from_millis(500));
        let t0 = Instant::now();
        let hs: Vec<_> = (0..4u32)
            .map(|c| {
                s.spawn(move || {
                    (0..per)
                        .map(|i| {
                            let rate = if i % 2 == 0 { "730pps" } else { "740pps" };
                            let t = Instant::now();
                            let ok = request(net, &rule_set((c * per + i) * 131 % RULES, rate)).is_ok();
                            if ok { t.elapsed().as_secs_f64() * 1e3 } else { f64::NAN }
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        let each: Vec<f64> = hs.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect();
        let secs = t0.elapsed().as_secs_f64();
        stop.store(true, Ordering::SeqCst);
        (each, w.join().unwrap_or(0), secs)
    });
    let record = timed_cli(net, &["status", "--json"])
        .ok()
        .and_then(|(_, out)| serde_json::from_str::<serde_json::Value>(&out).ok())
        .map(|v| v["config_status"].clone())
        .unwrap_or_default();
    drop(d);
    let failed = each.iter().filter(|x| x.is_nan()).count();
    each.retain(|x| !x.is_nan());
    each.sort_by(f64::total_cmp);
    let pct = |q: f64| each.get(((each.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied();
    let f = |k: &str| record[k].as_f64().unwrap_or(f64::NAN);
    let note = format!(
        "{} requests ({failed} failed) from 4 clients, median {:.1} ms, max {:.1} ms; the other writer wrote {:.0} MB/s \
         in O_DSYNC blocks of 64 KiB beside the config file; the owner's record: the longest a write of the file took \
         {:.0} ms, {} requests waited over 100 ms in its queue",
        each.len(),
        pct(0.5).unwrap_or(f64::NAN),
        each.last().copied().unwrap_or(f64::NAN),
        written as f64 / 1e6 / secs,
        f("longest_write_ms"),
        f("waits_over_100ms"),
    );
    Ok(vec![
        m(
            "rule_set_dsync_p99",
            "`rule set` with 100 000 rules loaded while another writer syncs the disk: p99",
            "ms",
            &pct(0.99).into_iter().collect::<Vec<_>>(),
            note,
        ),
        m(
            "owner_wait_dsync_max",
            "the longest a request waited in the owner's queue meanwhile (the owner's record)",
            "ms",
            &[f("longest_wait_ms")],
            "target ≤ 100 ms: no request waits behind a write of the file",
        ),
    ])
}

/// A start with 1 000 000 rules in the config file: until policing, its
/// peak RSS and its CPU time (issue 43, point 14: ≤ 3 s, ≤ 1 GiB).
fn million(net: &Net, reps: usize) -> Result<Vec<Measure>> {
    say("control: daemon start-up with 1 000 000 rules");
    std::fs::write(&net.sb.config, config(MILLION, "500pps"))?;
    let (mut ms, mut peak, mut cpu) = (vec![], vec![], vec![]);
    for _ in 0..reps {
        let (mut d, t) = start_with(net, MILLION, &[]);
        ms.push(t);
        peak.push(peak_mib(&d));
        cpu.push(cpu_ms(&d));
        d.stop_with(libc::SIGTERM);
    }
    Ok(vec![
        m(
            "start_1m",
            "`policer attach`, 1 000 000 rules in the config file (65 MB): start until policing",
            "ms",
            &ms,
            format!("target ≤ 3 s; the daemon's CPU time until then (all threads) {:.0} ms", Stat::of(&cpu).median),
        ),
        m("peak_rss_1m", "daemon peak RSS (VmHWM) of that start, 1 000 000 rules", "MiB", &peak, "target ≤ 1024 MiB"),
    ])
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ControlResults {
    pub rules: u32,
    pub rows: Vec<Measure>,
}

pub fn run(quick: bool, reps: usize) -> Result<ControlResults> {
    let mut rows = Vec::new();
    let net = Net::new("ct")?;
    let big = config(RULES, "500pps");

    // 1. Start-up, default rules only, and with 100 000 rules in the file.
    say("control: daemon start-up");
    let (mut base, mut with, mut rss0, mut rss1) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        std::fs::write(&net.sb.config, config(0, "500pps"))?;
        let (mut d, ms) = start(&net, &[]);
        base.push(ms);
        rss0.push(rss_mib(&d));
        d.stop_with(libc::SIGTERM);
        std::fs::write(&net.sb.config, &big)?;
        let (mut d, ms) = start(&net, &[]);
        with.push(ms);
        rss1.push(rss_mib(&d));
        d.stop_with(libc::SIGTERM);
    }
    let extra: Vec<f64> = with.iter().zip(&base).map(|(a, b)| a - b).collect();
    rows.push(m(
        "start_default",
        "`policer attach`, 1 rule: start until policing",
        "ms",
        &base,
        "includes the 1 048 576-entry bucket table",
    ));
    rows.push(m(
        "start_100k",
        "`policer attach`, 100 000 rules in the config file: start until policing",
        "ms",
        &with,
        "",
    ));
    rows.push(m(
        "load_100k",
        "loading 100 000 rules at start-up (difference of the two)",
        "ms",
        &extra,
        "target ≤ 500 ms",
    ));
    rows.push(m("rss_default", "daemon RSS (VmRSS), 1 rule", "MiB", &rss0, ""));
    rows.push(m("rss_100k", "daemon RSS (VmRSS), 100 000 rules", "MiB", &rss1, ""));
    rows.extend(million(&net, if quick { 1 } else { reps.min(3) })?);

    // 2. With 100 000 rules loaded: reload with every rule changed, rule ls,
    // single rule changes through the CLI.
    say("control: 100 000 rules: reload, ls, rule set");
    std::fs::write(&net.sb.config, &big)?;
    let (d, _) = start(&net, &[]);
    let (mut reload, mut ls, mut set, mut stats_big) = (vec![], vec![], vec![], vec![]);
    for k in 0..reps {
        std::fs::write(&net.sb.config, config(RULES, if k % 2 == 0 { "600pps" } else { "500pps" }))?;
        reload.push(timed_cli(&net, &["reload"])?.0);
        ls.push(timed_cli(&net, &["rule", "ls", "--json"])?.0);
        stats_big.push(timed_cli(&net, &["stats", "--json"]).map(|x| x.0).unwrap_or(f64::NAN));
    }
    let n_set = if quick { 5 } else { 20 };
    for i in 0..n_set {
        let rate = if i % 2 == 0 { "700pps" } else { "800pps" };
        set.push(timed_cli(&net, &["rule", "set", &prefix(i * 997 % RULES), "--rate", rate, "--burst", "50"])?.0);
    }
    // 1 000 changes from 10 clients at once (each a connection of its own
    // on the control socket, one request after another): what a SOAR or a
    // feed scripting the daemon sees; changes queued together share one
    // write of the file (group commit).
    let per = if quick { 20 } else { 100 };
    let t0 = Instant::now();
    let mut each: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..10u32)
            .map(|c| {
                let net = &net;
                s.spawn(move || {
                    let mut v = Vec::with_capacity(per as usize);
                    for i in 0..per {
                        let rate = if i % 2 == 0 { "710pps" } else { "720pps" };
                        let t = Instant::now();
                        let ok = request(net, &rule_set((c * per + i) * 89 % RULES, rate)).is_ok();
                        v.push(if ok { t.elapsed().as_secs_f64() * 1e3 } else { f64::NAN });
                    }
                    v
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    let total = t0.elapsed().as_secs_f64() * 1e3;
    let failed = each.iter().filter(|x| x.is_nan()).count();
    each.retain(|x| !x.is_nan());
    each.sort_by(f64::total_cmp);
    let pct = |q: f64| each.get(((each.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied();
    let writes = timed_cli(&net, &["status", "--json"])
        .ok()
        .and_then(|(_, out)| serde_json::from_str::<serde_json::Value>(&out).ok())
        .map(|v| {
            format!(
                "; the daemon counted {} changes in {} writes of the file since its start",
                v["config_status"]["changes_written"], v["config_status"]["writes"]
            )
        })
        .unwrap_or_default();
    rows.push(m(
        "rule_set_10_clients_p99",
        "1 000 `rule set` requests from 10 concurrent clients, 100 000 rules loaded: p99",
        "ms",
        &pct(0.99).into_iter().collect::<Vec<_>>(),
        format!(
            "{} requests in {total:.0} ms ({failed} failed); median {:.1} ms, max {:.1} ms; each client a control \
             socket connection of its own, request after request{writes}",
            each.len(),
            pct(0.5).unwrap_or(f64::NAN),
            each.last().copied().unwrap_or(f64::NAN)
        ),
    ));
    rows.push(m(
        "reload_100k",
        "`policer reload`, 100 000 rules all changed",
        "ms",
        &reload,
        "the CLI call: parse, validate, apply, reply",
    ));
    rows.push(m(
        "rule_set_cli_100k",
        "one `policer rule set` with 100 000 rules loaded (CLI process, start to exit)",
        "ms",
        &set,
        "includes `ip netns exec`; the config file's text is edited where that rule is (and the file replaced)",
    ));
    rows.push(m("rule_ls_100k", "`policer rule ls --json`, 100 000 rules", "ms", &ls, ""));
    rows.push(m(
        "stats_100k_rules",
        "`policer stats --json`, 100 000 rules",
        "ms",
        &stats_big,
        "per-rule counters for every rule",
    ));
    drop(d);

    // 2a. Changes while another writer syncs the same disk (issue 43,
    // point 14): what a request waits, and the owner's own record.
    rows.extend(dsync(&net, quick)?);

    // 2b. With 100 000 manual bans (issue 32: reads that do not grow with
    // the bans): a scrape and `stats` read kept counts, `ban ls` streams.
    say("control: 100 000 manual bans: /metrics, stats, ban ls");
    std::fs::write(&net.sb.config, config_bans(RULES))?;
    let port = "9479";
    let (d, _) = start(&net, &["--metrics", port]);
    let (mut scrape_ms, mut stats_bans, mut ban_ls) = (vec![], vec![], vec![]);
    for _ in 0..reps {
        // /metrics renders are paced (a render rests as long as it took
        // before the next): a scrape a second apart pays its own render.
        std::thread::sleep(Duration::from_secs(1));
        scrape_ms.push(timed_scrape(&net, port.parse()?));
        stats_bans.push(timed_cli(&net, &["stats", "--json"]).map(|x| x.0).unwrap_or(f64::NAN));
        ban_ls.push(timed_cli(&net, &["ban", "ls", "--json"]).map(|x| x.0).unwrap_or(f64::NAN));
    }
    rows.push(m(
        "metrics_100k_bans",
        "`/metrics` with 100 000 bans",
        "ms",
        &scrape_ms,
        "ms per scrape (connect to the last byte); target ≤ 50 ms; manual bans from the config file",
    ));
    rows.push(m(
        "stats_100k_bans",
        "`policer stats --json` with 100 000 bans",
        "ms",
        &stats_bans,
        "CLI process, start to exit; the ban counts are kept, not read",
    ));
    rows.push(m(
        "ban_ls_100k",
        "`policer ban ls --json`, 100 000 bans",
        "ms",
        &ban_ls,
        "CLI process, start to exit; streamed: rows print as the daemon reads them",
    ));
    drop(d);

    // 3. Rule changes through the control socket, one after another, from
    // a daemon with only the default rule.
    say("control: rule set requests through the control socket");
    std::fs::write(&net.sb.config, config(0, "500pps"))?;
    let (d, _) = start(&net, &[]);
    let k = if quick { 300 } else { 2000 };
    let t0 = Instant::now();
    let mut each = Vec::with_capacity(k as usize);
    for i in 0..k {
        let t = Instant::now();
        request(&net, &rule_set(i, "500pps"))?;
        each.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let total = t0.elapsed().as_secs_f64() * 1e3;
    rows.push(m(
        "rule_set_socket",
        &format!("one `rule set` request on the control socket (the first {k} rules, one after another)"),
        "ms",
        &each,
        format!("{k} requests took {total:.0} ms in all; each rewrites the config file"),
    ));
    drop(d);

    // 4. Rule-change latency: a paced source, its rule flipped between deny
    // and the default (1 Mpps) with the CLI; when do its frames stop / resume?
    say("control: rule-change latency");
    std::fs::write(&net.sb.config, config(0, "500pps"))?;
    let (d, _) = start(&net, &[]);
    let pps = 20_000.0;
    let src = Ipv4Addr::new(10, 4, 0, 1);
    let flows = [Flow { src: src.into(), pps, len: 64 }];
    let events = if quick { 4 } else { 10 };
    let mut marks: Vec<(bool, u64)> = vec![];
    let mut cli_ms = vec![];
    let (_, got) = paced(&net, &flows, Duration::from_millis(300 * (events as u64 + 2)), || {
        for e in 0..events {
            std::thread::sleep(Duration::from_millis(300));
            let deny = e % 2 == 0;
            let args: Vec<&str> = if deny {
                vec!["rule", "set", "10.4.0.1/32", "--action", "deny"]
            } else {
                vec!["rule", "rm", "10.4.0.1/32"]
            };
            let t = Instant::now();
            let out = cli(&net.sb, &args);
            let at = epoch_ns();
            cli_ms.push(t.elapsed().as_secs_f64() * 1e3);
            if out.status.success() {
                marks.push((deny, at));
            }
        }
    })?;
    // Signed: negative means the change was visible before the command
    // returned. Frames arrive every 1/pps s, which bounds the resolution.
    let (mut stop_ms, mut resume_ms) = (vec![], vec![]);
    let window = 250_000_000;
    for (i, &(deny, at)) in marks.iter().enumerate() {
        let prev = if i > 0 { marks[i - 1].1 } else { 0 };
        if deny {
            // The last frame admitted around the change.
            let last = got.arrivals0.iter().filter(|&&t| t + window >= at && t < at + window).max().copied();
            stop_ms.push(last.map(|t| (t as f64 - at as f64) / 1e6).unwrap_or(f64::NAN));
        } else {
            // The first frame admitted after the previous change (a deny).
            let first = got.arrivals0.iter().find(|&&t| t > prev + 1_000_000).copied();
            resume_ms.push(first.map(|t| (t as f64 - at as f64) / 1e6).unwrap_or(f64::NAN));
        }
    }
    rows.push(m(
        "change_to_deny",
        "rule change → enforced: last frame admitted, relative to `rule set … --action deny` returning",
        "ms",
        &stop_ms,
        format!(
            "negative: enforced before the command returned; source paced at {pps:.0} pps ({:.2} ms apart)",
            1e3 / pps
        ),
    ));
    rows.push(m(
        "change_to_allow",
        "rule change → enforced: first frame admitted again, relative to `rule rm` returning",
        "ms",
        &resume_ms,
        format!("negative: before the command returned; includes up to one frame gap ({:.2} ms)", 1e3 / pps),
    ));
    rows.push(m(
        "rule_cli",
        "the `policer rule set/rm` CLI calls of that test",
        "ms",
        &cli_ms,
        "process start to exit",
    ));
    drop(d);

    // 5. stats and top with 1 000 000 live buckets.
    say("control: stats and top with 1 000 000 live buckets");
    std::fs::write(&net.sb.config, config(0, "500pps"))?;
    let (d, _) = start(&net, &[]);
    let verbs =
        cli(&net.sb, &["stats", "--json"]).status.success() && cli(&net.sb, &["top", "--json"]).status.success();
    if verbs {
        let g = Generator::new(net.tx_index, net.rx_mac, 1_000_000, Ipv4Addr::new(10, 8, 0, 0), false)?;
        // Two passes over the million sources.
        g.flood(&net.sb.tx_ns, bench_cpu(), Duration::ZERO, 2_000_000)?;
        let (mut stats, mut top, mut live) = (vec![], vec![], vec![]);
        for _ in 0..reps {
            stats.push(timed_cli(&net, &["stats", "--json"])?.0);
            let (ms, out) = timed_cli(&net, &["top", "--json"])?;
            top.push(ms);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
            live.push(v["live"].as_f64().unwrap_or(f64::NAN));
        }
        let live_note = format!("`top` read {:.0} live buckets", Stat::of(&live).median);
        rows.push(m("stats_1m", "`policer stats --json`, 1 000 000 live buckets", "ms", &stats, "target ≤ 1 000 ms"));
        rows.push(m(
            "top_1m",
            "`policer top --json`, 1 000 000 live buckets",
            "ms",
            &top,
            format!("target ≤ 1 000 ms; {live_note}"),
        ));
        rows.push(m("live_buckets", "live buckets during those calls", "buckets", &live, ""));
        rows.push(m("rss_1m", "daemon RSS (VmRSS) after `top` over 1 000 000 buckets", "MiB", &[rss_mib(&d)], ""));
    } else {
        for (key, label) in [
            ("stats_1m", "`policer stats --json`, 1 000 000 live buckets"),
            ("top_1m", "`policer top --json`, 1 000 000 live buckets"),
        ] {
            rows.push(not_measured(key, label, "ms", "not measured: verb not available"));
        }
    }
    drop(d);
    rows.extend(import_rows(&net, reps)?);
    rows.extend(feed_rows_or_why(&net, reps));
    rows.extend(feed_million_rows(&net, 1)?);
    rows.extend(replay_rows(reps)?);
    Ok(ControlResults { rules: RULES, rows })
}

/// Frames in the replay row's capture.
pub const REPLAY_FRAMES: u64 = 1_000_000;

/// `policer replay` (issue 31): a capture of [`REPLAY_FRAMES`] 64-byte
/// IPv4 frames from 1 000 sources, 1 µs apart (a new clock value every
/// frame), against `--rate 1kpps`: the frames per second it reports (the
/// batches of test runs, the capture read and the tallies; not the
/// program's load), and the process's peak RSS. Beside it, what one test
/// run a frame would allow at most (replay's method before batches).
fn replay_rows(reps: usize) -> Result<Vec<Measure>> {
    say("control: policer replay of a 1M-frame capture");
    let dir = tempfile_dir()?;
    let pcap = dir.join("replay.pcap");
    let mut w = crate::capture::PcapWriter::create(&pcap)?;
    let mut frame = crate::frame::FrameSpec::udp("10.0.0.1".parse()?, "198.19.0.1".parse()?, 64).build(None);
    for i in 0..REPLAY_FRAMES {
        let s = u32::from(Ipv4Addr::new(10, 0, 0, 0)) + (i % 1000) as u32;
        frame[26..30].copy_from_slice(&s.to_be_bytes());
        w.write(1_750_000_000_000_000_000 + i * 1_000, &frame)?;
    }
    w.finish()?;
    let (mut fps, mut rss) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        let out = std::process::Command::new(crate::daemon::policer_bin())
            .args(["replay", &pcap.display().to_string(), "--rate", "1kpps", "--json"])
            .output()?;
        if !out.status.success() {
            bail!("policer replay: {}", String::from_utf8_lossy(&out.stderr));
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        fps.push(v["frames_per_sec"].as_f64().context("frames_per_sec")?);
        // SAFETY: reads this process's children's usage; no preconditions.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
        rss.push(ru.ru_maxrss as f64 / 1024.0);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let floor: Vec<f64> = (0..reps).map(|_| test_run_floor(&frame)).collect::<Result<_>>()?;
    Ok(vec![
        m(
            "replay_floor_fps",
            "BPF_PROG_TEST_RUN, one call a frame, of the xdp_pass floor",
            "calls/s",
            &floor,
            "one test run a frame could replay no more; replay judges up to 34 frames a run",
        ),
        m(
            "replay_fps",
            "`policer replay`, 1 000 000 frames, a new timestamp each",
            "frames/s",
            &fps,
            "target ≥ 1 000 000",
        ),
        m("replay_rss", "peak RSS of the largest child so far (the replays among them)", "MiB", &rss, ""),
    ])
}

/// Calls per second of BPF_PROG_TEST_RUN on the xdp_pass floor with
/// `frame` behind 16 bytes of metadata, an `xdp_md` and the frame copied
/// back, one call after another on one thread: what each of `policer
/// replay`'s frames costs before the policer's program runs at all.
fn test_run_floor(frame: &[u8]) -> Result<f64> {
    use aya::programs::{TestRun, TestRunOptions, Xdp};
    const CALLS: u32 = 200_000;
    let mut e = crate::kernel::reference("xdp_pass", 0, 1, 0)?;
    let x: &mut Xdp = e.program_mut("xdp_pass").context("xdp_pass")?.try_into()?;
    let mut data = vec![0u8; 16];
    data.extend_from_slice(frame);
    let mut out = vec![0u8; data.len()];
    // struct xdp_md: data, data_end (offsets into data_in), then zeros.
    let mut ctx = [0u8; 24];
    ctx[0..4].copy_from_slice(&16u32.to_ne_bytes());
    ctx[4..8].copy_from_slice(&(data.len() as u32).to_ne_bytes());
    let t = Instant::now();
    for _ in 0..CALLS {
        x.test_run(TestRunOptions {
            data_in: Some(&data),
            data_out: Some(&mut out),
            ctx_in: Some(&ctx),
            ..Default::default()
        })
        .context("test run")?;
    }
    Ok(f64::from(CALLS) / t.elapsed().as_secs_f64())
}

/// A fresh directory under the temporary directory.
fn tempfile_dir() -> Result<std::path::PathBuf> {
    let d = std::env::temp_dir().join(format!("policer-bench-replay-{}", std::process::id()));
    std::fs::create_dir_all(&d)?;
    Ok(d)
}

/// Only the CrowdSec feed rows (`policer-bench --only crowdsec`).
pub fn run_feed(reps: usize) -> Result<ControlResults> {
    let net = Net::new("cf")?;
    let mut rows = feed_rows_or_why(&net, reps);
    rows.extend(feed_million_rows(&net, 1)?);
    Ok(ControlResults { rules: RULES, rows })
}

/// Decisions the feed rows start with, and the delta added to them.
const FEED_DECISIONS: u32 = 100_000;
const FEED_DELTA: u32 = 10_000;

/// A CSV for `cscli decisions import` of `n` /32s from 10.16.0.0 + `first`.
fn decisions_csv(first: u32, n: u32) -> String {
    let mut s = String::with_capacity(n as usize * 24 + 32);
    s.push_str("value,duration,reason\n");
    for i in first..first + n {
        let _ = writeln!(s, "{},4h,bench", Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 16, 0, 0)) + i));
    }
    s
}

/// Waits until the daemon's log says the feed's set holds `n` prefixes;
/// the time it took, ms, and the line.
fn wait_feed_line(d: &Daemon, n: u32, limit: Duration) -> Option<(f64, String)> {
    let needle = format!(": {n} prefixes from the CrowdSec Local API");
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(l) = d.stdout().lines().find(|l| l.contains(&needle)) {
            return Some((t0.elapsed().as_secs_f64() * 1e3, l.to_string()));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// The seconds a log line ends with (`... in 0.12 s`).
fn secs_at_end(line: &str) -> Option<f64> {
    line.trim_end().strip_suffix(" s")?.rsplit(' ').next()?.parse().ok()
}

/// The rows of [`feed_rows`]: key, label, unit.
const FEED_LABELS: [(&str, &str, &str); 4] = [
    ("crowdsec_startup_100k", "CrowdSec feed: 100 000 decisions in force after a start (start to set written)", "ms"),
    ("crowdsec_delta_10k", "CrowdSec feed: 10 000 new decisions in force after `cscli decisions import` returns", "ms"),
    ("crowdsec_apply_10k", "CrowdSec feed: the set's change for those 10 000 (the daemon's import)", "ms"),
    ("crowdsec_rss_100k", "daemon RSS growth with 100 000 CrowdSec decisions in force", "MiB"),
];

/// [`feed_rows`], or its rows not measured, saying why: the real Local
/// API's failures (sqlite's "database is locked" under load) do not keep
/// the million rows, which do not use it, from being measured.
fn feed_rows_or_why(net: &Net, reps: usize) -> Vec<Measure> {
    crate::unpanic(|| feed_rows(net, reps)).unwrap_or_else(|e| {
        say(&format!("control: the CrowdSec feed's 100 000 rows not measured: {e:#}"));
        FEED_LABELS.iter().map(|(k, l, u)| not_measured(k, l, u, format!("not measured: {e:#}"))).collect()
    })
}

/// Section 7, the CrowdSec feed (issue 30), against a real Local API
/// (Debian's crowdsec, started here) holding 100 000 decisions: a daemon
/// started against it, from its "policing" line until the set holds all
/// of them (the startup pull, its parse and the set's import); then 10 000
/// more added with `cscli decisions import`, from cscli's return until the
/// set holds them (up to one poll of `update_frequency = "1s"` of that is
/// waiting), and the daemon's own part of it (the set's import, from its
/// log); the daemon's RSS growth.
fn feed_rows(net: &Net, reps: usize) -> Result<Vec<Measure>> {
    let labels = FEED_LABELS;
    if !crate::lapi::available("bench: the CrowdSec feed") {
        return Ok(labels
            .iter()
            .map(|(k, l, u)| {
                not_measured(k, l, u, "not measured: the CrowdSec binaries are missing (`cargo xtask setup`)")
            })
            .collect());
    }
    say("control: the CrowdSec feed, 100 000 decisions and a delta of 10 000");
    let lapi = crate::lapi::Lapi::start(&net.sb.rx_ns, 18_499);
    let key = lapi.bouncer_key("policer-bench");
    let t = Instant::now();
    let n = lapi.import_csv(&decisions_csv(0, FEED_DECISIONS), &[]);
    if n != FEED_DECISIONS as usize {
        bail!("cscli imported {n} decisions, not {FEED_DECISIONS}");
    }
    say(&format!("control: cscli imported {n} decisions in {:.1} s", t.elapsed().as_secs_f64()));
    let state = crate::daemon::state_dir_of(&net.sb.config);
    let (mut startup, mut delta, mut apply, mut rss) = (vec![], vec![], vec![], vec![]);
    let mut held = FEED_DECISIONS;
    for _ in 0..reps {
        // A cold start: no saved set, no feed state.
        let _ = std::fs::remove_dir_all(&state);
        std::fs::write(
            &net.sb.config,
            format!(
                "[crowdsec]\nlapi_url = \"{}\"\napi_key = \"{key}\"\nupdate_frequency = \"1s\"\nfull_sync_every = \"5s\"\n\n{}",
                lapi.url(),
                config(0, "500pps")
            ),
        )?;
        let (mut d, _) = start(net, &[]);
        let rss0 = rss_mib(&d);
        let Some((ms, _)) = wait_feed_line(&d, held, Duration::from_secs(60)) else {
            bail!("the feed did not put {held} decisions in force in 60 s:\n{}", d.stdout());
        };
        startup.push(ms);
        rss.push(rss_mib(&d) - rss0);
        let first = 1_000_000 + held;
        let n = lapi.import_csv(&decisions_csv(first, FEED_DELTA), &[]);
        held += n as u32;
        let Some((ms, line)) = wait_feed_line(&d, held, Duration::from_secs(30)) else {
            bail!("the feed did not put {held} decisions in force in 30 s:\n{}", d.stdout());
        };
        delta.push(ms);
        apply.push(secs_at_end(&line).map_or(f64::NAN, |s| s * 1e3));
        d.stop_with(libc::SIGTERM);
    }
    let _ = std::fs::remove_dir_all(&state);
    let [a, b, c, e] = labels;
    Ok(vec![
        m(a.0, a.1, a.2, &startup, "target ≤ 2 000 ms; includes the Local API answering 100 000 decisions"),
        m(
            b.0,
            b.1,
            b.2,
            &delta,
            "includes waiting up to 1 s for the next poll (update_frequency = \"1s\"), and when the Local API left \
             some out of the pulls of changes, up to 5 s for the whole pull that brings them (full_sync_every = \"5s\")",
        ),
        m(c.0, c.1, c.2, &apply, "target ≤ 1 000 ms; from the daemon's log"),
        m(e.0, e.1, e.2, &rss, "the decisions (with their ends), the set and its state file's buffers"),
    ])
}

/// Decisions of the million rows.
const MILLION: u32 = 1_000_000;

/// A bench-only stand-in for the Local API's decision stream: a small
/// HTTP/1.1 server in the daemon's namespace answering
/// `GET /v1/decisions/stream` with the answers queued ([`StreamServer::queue`],
/// then `{"new":null,"deleted":null}`), and any other request (the start's
/// check of the key) with `null`. The real LAPI (Debian's 1.4.6, sqlite)
/// takes many minutes to hold and serve a million decisions; the rows
/// measure the daemon, so this one serves the same protocol at once.
struct StreamServer {
    port: u16,
    queue: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<std::sync::Arc<Vec<u8>>>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StreamServer {
    fn start(ns: &str, port: u16) -> Result<StreamServer> {
        use std::{
            io::{Read, Write},
            sync::{Arc, Mutex, atomic::AtomicBool},
        };
        let queue: Arc<Mutex<std::collections::VecDeque<Arc<Vec<u8>>>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (q, st, ns) = (queue.clone(), stop.clone(), ns.to_string());
        let (tx, rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let l = crate::netns::enter(&ns)
                .and_then(|()| std::net::TcpListener::bind(("127.0.0.1", port)))
                .and_then(|l| l.set_nonblocking(true).map(|()| l));
            let l = match l {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            while !st.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((mut c, _)) = l.accept() else {
                    std::thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let _ = c.set_nonblocking(false);
                let mut head = Vec::new();
                let mut b = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match c.read(&mut b) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => head.extend_from_slice(&b[..n]),
                    }
                }
                let stream = head.starts_with(b"GET /v1/decisions/stream");
                let body = if stream {
                    q.lock()
                        .ok()
                        .and_then(|mut q| q.pop_front())
                        .unwrap_or_else(|| Arc::new(br#"{"new":null,"deleted":null}"#.to_vec()))
                } else {
                    Arc::new(b"null".to_vec())
                };
                let h = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                );
                let _ = c.write_all(h.as_bytes()).and_then(|()| c.write_all(&body));
            }
        });
        rx.recv()?.map_err(|e| anyhow::anyhow!("the stream server cannot listen on {port}: {e}"))?;
        Ok(StreamServer { port, queue, stop, thread: Some(thread) })
    }

    fn queue(&self, body: Vec<u8>) {
        if let Ok(mut q) = self.queue.lock() {
            q.push_back(std::sync::Arc::new(body));
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }
}

impl Drop for StreamServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The i-th decision of the million rows: a /32 from 10.32.0.0.
fn million_addr(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 32, 0, 0)) + i)
}

/// The stream's answer: `new` the decisions `ids` (each `duration`),
/// `deleted` those of `gone` by id and of `gone_by_value` by value alone.
fn stream_answer(
    ids: std::ops::Range<u32>,
    duration: &str,
    gone: std::ops::Range<u32>,
    gone_by_value: std::ops::Range<u32>,
) -> Vec<u8> {
    let mut s = String::with_capacity(ids.len() * 140 + 64);
    s.push_str("{\"new\":[");
    for (k, i) in ids.enumerate() {
        if k > 0 {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"duration\":\"{duration}\",\"id\":{i},\"origin\":\"lists\",\"scenario\":\"bench/list\",\"scope\":\"Ip\",\
             \"type\":\"ban\",\"value\":\"{}\"}}",
            million_addr(i)
        );
    }
    s.push_str("],\"deleted\":[");
    let mut first = true;
    for i in gone.clone() {
        if !std::mem::take(&mut first) {
            s.push(',');
        }
        let _ = write!(
            s,
            "{{\"duration\":\"-1s\",\"id\":{i},\"scope\":\"Ip\",\"type\":\"ban\",\"value\":\"{}\"}}",
            million_addr(i)
        );
    }
    for i in gone_by_value {
        if !std::mem::take(&mut first) {
            s.push(',');
        }
        let _ =
            write!(s, "{{\"duration\":\"-1s\",\"scope\":\"Ip\",\"type\":\"ban\",\"value\":\"{}\"}}", million_addr(i));
    }
    s.push_str("]}");
    s.into_bytes()
}

/// `rule ls` on the control socket every 20 ms until `stop`: each
/// request's latency, ms (NaN if it failed).
fn probe(net: &Net, stop: &std::sync::atomic::AtomicBool) -> Vec<f64> {
    let mut v = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let t0 = Instant::now();
        let ok = request(net, &Request::RuleLs).is_ok();
        v.push(if ok { t0.elapsed().as_secs_f64() * 1e3 } else { f64::NAN });
        std::thread::sleep(Duration::from_millis(20));
    }
    v
}

/// A change meanwhile: `policer rule set 198.51.100.N/32 --rate R
/// --runtime` on the control socket every 20 ms until `stop`, N going
/// round the /24 and R flipping between 100pps and 101pps each round (so
/// each request changes what is in force and goes through the owner, as
/// `policer ban` does), going on from `k` (where the last probe stopped).
/// Each request's wait, ms, answered or not (a failure after a long wait
/// is a long wait); how many failed or were refused, and the first one's
/// words.
fn probe_change(net: &Net, stop: &std::sync::atomic::AtomicBool, k: &mut u32) -> (Vec<f64>, usize, Option<String>) {
    let (mut v, mut failed, mut why) = (Vec::new(), 0, None);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let req = Request::RuleSet {
            rule: RuleConfig {
                prefix: format!("198.51.100.{}/32", *k % 256),
                rate: Some(if (*k / 256).is_multiple_of(2) { "100pps" } else { "101pps" }.into()),
                ..RuleConfig::default()
            },
            runtime: true,
            replace: false,
            force: false,
        };
        *k = k.wrapping_add(1);
        let t0 = Instant::now();
        let ok = match request(net, &req) {
            Ok(Reply::Done { .. }) => true,
            Ok(other) => {
                why.get_or_insert_with(|| format!("{other:?}"));
                false
            }
            Err(e) => {
                why.get_or_insert_with(|| format!("{e:#}"));
                false
            }
        };
        v.push(t0.elapsed().as_secs_f64() * 1e3);
        failed += usize::from(!ok);
        std::thread::sleep(Duration::from_millis(20));
    }
    (v, failed, why)
}

/// The 99th percentile of `v` (NaN if empty; a failed request counts as
/// the slowest).
fn p99(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().map(|x| if x.is_finite() { *x } else { f64::INFINITY }).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() as f64 * 0.99).ceil() as usize).clamp(1, s.len()) - 1]
}

/// The slowest of `v` (a failed request is infinitely slow).
fn slowest(v: &[f64]) -> f64 {
    v.iter().map(|x| if x.is_finite() { *x } else { f64::INFINITY }).fold(0.0, f64::max)
}

/// What [`probed`] saw on the control socket meanwhile: `rule ls` (a
/// read, answered from a snapshot) and `rule set --runtime` (a change,
/// through the owner).
struct Probes {
    ls_p99: f64,
    ls_max: f64,
    set_p99: f64,
    set_max: f64,
    set_n: usize,
    set_failed: usize,
    set_why: Option<String>,
}

/// Runs `f` while [`probe`] reads and [`probe_change`] changes (from its
/// `k`-th request on) on the control socket: what `f` gave, and both
/// probes' p99 and max.
fn probed<T>(net: &Net, k: &mut u32, f: impl FnOnce() -> Result<T>) -> Result<(T, Probes)> {
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (r, ls, (set, set_failed, set_why)) = std::thread::scope(|s| {
        let h = s.spawn(|| probe(net, &stop));
        let hc = s.spawn(|| probe_change(net, &stop, k));
        let r = f();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (r, h.join().unwrap_or_default(), hc.join().unwrap_or_default())
    });
    let p = Probes {
        ls_p99: p99(&ls),
        ls_max: slowest(&ls),
        set_p99: p99(&set),
        set_max: slowest(&set),
        set_n: set.len(),
        set_failed,
        set_why,
    };
    Ok((r?, p))
}

/// Issue 41, points 2 and 8: a feed of a million decisions. A daemon
/// started against [`StreamServer`] with a startup answer of 1 000 000
/// decisions (~140 MB): start to the set holding them; then a delta
/// deleting 100 000 by id and 1 000 by value alone; then the million's
/// own ends (all at once, 60 s after the pull). Throughout, `rule ls` on
/// the control socket every 20 ms (a read) and `rule set … --runtime`
/// every 20 ms (a change, through the owner that also applies the feed):
/// their p99 and max while each runs.
fn feed_million_rows(net: &Net, reps: usize) -> Result<Vec<Measure>> {
    const BY_ID: u32 = 100_000;
    const BY_VALUE: u32 = 1_000;
    let note = "a bench-only server of the stream protocol (the real LAPI cannot hold a million decisions in a bench's \
                time); rule ls and rule set --runtime every 20 ms meanwhile";
    say("control: the CrowdSec feed, 1 000 000 decisions (pull, delete, expire) and control requests meanwhile");
    let server = StreamServer::start(&net.sb.rx_ns, 18_498)?;
    let state = crate::daemon::state_dir_of(&net.sb.config);
    // Per phase (pull, delete, expire): its time, and the probes' p99 and
    // max for each run.
    #[derive(Default)]
    struct Phase {
        ms: Vec<f64>,
        ls_p99: Vec<f64>,
        ls_max: f64,
        set_p99: Vec<f64>,
        set_max: Vec<f64>,
        set_n: usize,
        set_failed: usize,
        set_why: Option<String>,
    }
    impl Phase {
        fn add(&mut self, ms: f64, p: Probes) {
            self.ms.push(ms);
            self.ls_p99.push(p.ls_p99);
            self.ls_max = self.ls_max.max(p.ls_max);
            self.set_p99.push(p.set_p99);
            self.set_max.push(p.set_max);
            self.set_n += p.set_n;
            self.set_failed += p.set_failed;
            if self.set_why.is_none() {
                self.set_why = p.set_why;
            }
        }
    }
    let (mut pull, mut del, mut exp) = (Phase::default(), Phase::default(), Phase::default());
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&state);
        std::fs::write(
            &net.sb.config,
            format!(
                "[crowdsec]\nlapi_url = \"{}\"\napi_key = \"bench\"\nupdate_frequency = \"1s\"\n\n{}",
                server.url(),
                config(0, "500pps")
            ),
        )?;
        server.queue(stream_answer(0..MILLION, "60s", 0..0, 0..0));
        // The changes' requests, counted over the three phases: each is a
        // change (a rule added, or its rate flipped), never "unchanged".
        let mut k = 0;
        let t_pull = Instant::now();
        // Probed from the daemon's start (its control socket up) until the
        // set holds the million: the pull runs from the start on.
        let (mut d, _) = start(net, &[]);
        let (ms, p) = probed(net, &mut k, || {
            if wait_feed_line(&d, MILLION, Duration::from_secs(300)).is_none() {
                bail!("the feed did not put {MILLION} decisions in force in 300 s:\n{}", d.stdout());
            }
            Ok(t_pull.elapsed().as_secs_f64() * 1e3)
        })?;
        pull.add(ms, p);
        let left = MILLION - BY_ID - BY_VALUE;
        server.queue(stream_answer(0..0, "60s", 0..BY_ID, BY_ID..BY_ID + BY_VALUE));
        let (ms, p) = probed(net, &mut k, || {
            let t0 = Instant::now();
            let Some(_) = wait_feed_line(&d, left, Duration::from_secs(120)) else {
                bail!("the feed did not delete {} decisions in 120 s:\n{}", BY_ID + BY_VALUE, d.stdout());
            };
            Ok(t0.elapsed().as_secs_f64() * 1e3)
        })?;
        del.add(ms, p);
        // The ends: 60 s after the pull (± the pull's own time).
        let end = t_pull + Duration::from_secs(60);
        std::thread::sleep(end.saturating_duration_since(Instant::now()).saturating_sub(Duration::from_secs(2)));
        let (ms, p) = probed(net, &mut k, || {
            let Some(_) = wait_feed_line(&d, 0, Duration::from_secs(180)) else {
                bail!("the million's ends did not empty the set in 180 s:\n{}", d.stdout());
            };
            Ok(Instant::now().saturating_duration_since(end).as_secs_f64() * 1e3)
        })?;
        exp.add(ms, p);
        d.stop_with(libc::SIGTERM);
    }
    let _ = std::fs::remove_dir_all(&state);
    drop(server);
    let worst = pull.ls_max.max(del.ls_max).max(exp.ls_max);
    let mut rows = vec![];
    for (ph, key, label, ms_note, ls_label, ls_note, while_) in [
        (
            &pull,
            "crowdsec_pull_1m",
            "CrowdSec feed: 1 000 000 decisions in force after a start (start to set written)",
            note,
            "control request (rule ls) p99 while 1 000 000 decisions are pulled",
            format!("target ≤ 100 ms; the slowest of all runs {worst:.1} ms"),
            "while 1 000 000 decisions are pulled",
        ),
        (
            &del,
            "crowdsec_delete_1m",
            "CrowdSec feed: 100 000 deletions by id and 1 000 by value over 1 000 000, in force",
            "includes waiting up to 1 s for the next poll",
            "control request (rule ls) p99 while they are applied",
            "target ≤ 100 ms".to_string(),
            "while 101 000 of them are deleted",
        ),
        (
            &exp,
            "crowdsec_expire_1m",
            "CrowdSec feed: 1 000 000 decisions ending at once, from their end to the set emptied",
            "decisions end within a second of their end (checked once a second)",
            "control request (rule ls) p99 while they end",
            "target ≤ 100 ms".to_string(),
            "while they end",
        ),
    ] {
        rows.push(m(key, label, "ms", &ph.ms, ms_note));
        rows.push(m(&format!("{key}_control_p99"), ls_label, "ms", &ph.ls_p99, ls_note));
        let failed = match (&ph.set_why, ph.set_failed) {
            (_, 0) => String::new(),
            (Some(w), n) => format!("; {n} failed or were refused (each counted as its wait), the first: {w}"),
            (None, n) => format!("; {n} failed (each counted as its wait)"),
        };
        rows.push(m(
            &format!("{key}_change_p99"),
            &format!("control change (`rule set 198.51.100.N/32 --rate 100pps --runtime`) p99 {while_}"),
            "ms",
            &ph.set_p99,
            format!(
                "target ≤ 100 ms; a change goes through the owner, which also applies the feed; {} requests, one \
                 every 20 ms after the last answer (a client blocked for seconds is one of them: see the longest \
                 wait){failed}",
                ph.set_n
            ),
        ));
        rows.push(m(
            &format!("{key}_change_max"),
            &format!("control change (`rule set … --runtime`): the longest wait {while_}"),
            "ms",
            &ph.set_max,
            "target ≤ 100 ms (issue 41, point 2: no control request waits longer)",
        ));
    }
    Ok(rows)
}

/// Only the import rows (`policer-bench --only import`).
pub fn run_import(reps: usize) -> Result<ControlResults> {
    let net = Net::new("ci")?;
    Ok(ControlResults { rules: RULES, rows: import_rows(&net, reps)? })
}

/// A list file of `n` /32s from `first` on.
fn list_file(path: &std::path::Path, first: u32, n: u32) -> Result<()> {
    let mut s = String::with_capacity(n as usize * 14);
    for i in first..first + n {
        let _ = writeln!(s, "{}", Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)) + i));
    }
    std::fs::write(path, s).with_context(|| path.display().to_string())
}

/// Slab memory of the kernel (kB), from /proc/meminfo.
fn slab_kib() -> f64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines().find(|l| l.starts_with("Slab:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(f64::NAN)
}

/// Section 6, bulk import (issue 18): `policer rule import` of 1 000 000
/// /32 into a set, then the set replaced by a file 10 % different
/// (100 000 out, 100 000 in), each timed as the CLI command, end to end.
fn import_rows(net: &Net, reps: usize) -> Result<Vec<Measure>> {
    say("control: import of 1 000 000 /32, and a 10 % different replace");
    let dir = std::env::temp_dir();
    let (a, b) = (dir.join("policer-bench-import-a.txt"), dir.join("policer-bench-import-b.txt"));
    list_file(&a, 0, 1_000_000)?;
    list_file(&b, 100_000, 1_000_000)?;
    let sets = crate::daemon::state_dir_of(&net.sb.config);
    let (mut import, mut replace, mut rss, mut slab) = (vec![], vec![], vec![], vec![]);
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&sets);
        std::fs::write(&net.sb.config, config(0, "500pps"))?;
        let (mut d, _) = start(net, &[]);
        let (rss0, slab0) = (rss_mib(&d), slab_kib());
        let (ms, _) = timed_cli(net, &["rule", "import", a.to_str().unwrap(), "--action", "deny", "--set", "feed"])?;
        import.push(ms);
        rss.push(rss_mib(&d) - rss0);
        slab.push((slab_kib() - slab0) / 1024.0);
        let (ms, _) = timed_cli(net, &["rule", "import", b.to_str().unwrap(), "--action", "deny", "--set", "feed"])?;
        replace.push(ms);
        d.stop_with(libc::SIGTERM);
    }
    let _ = std::fs::remove_dir_all(&sets);
    let _ = std::fs::remove_file(&a);
    let _ = std::fs::remove_file(&b);
    Ok(vec![
        m(
            "import_1m",
            "`policer rule import` of 1 000 000 /32 (a new set; CLI process, start to exit)",
            "ms",
            &import,
            "target ≤ 1 000 ms; includes `ip netns exec`, parsing the 15 MB file, the state file",
        ),
        m(
            "replace_1m",
            "`policer rule import --set` replacing that set by a file 10 % different (100 000 out, 100 000 in)",
            "ms",
            &replace,
            "target ≤ 1 000 ms",
        ),
        m("import_rss_1m", "daemon RSS growth with a set of 1 000 000 /32", "MiB", &rss, ""),
        m(
            "import_slab_1m",
            "kernel slab growth with a set of 1 000 000 /32 (rule trie nodes)",
            "MiB",
            &slab,
            "/proc/meminfo Slab; other kernel activity adds noise",
        ),
    ])
}
