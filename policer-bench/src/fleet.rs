//! `--only global`: the fleet budgets' lease traffic (docs/fleet.md) at 3
//! nodes × 100 global rules against one Debian redis-server (the rig of
//! `policer_tests::fleet`): requests and bytes per node per rule, and
//! Redis's CPU, from Redis's own counters (`INFO`) over a measured window.
//! Written to its own report (`bench/fleet.md`), not BENCHMARKS.md.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use policer_tests::fleet::{Fleet, REDIS_IP};

use crate::say;

/// Global rules per node.
pub const RULES: usize = 100;
const NODES: usize = 3;

/// Redis's counters at one instant.
#[derive(Clone, Copy, Debug, Default)]
struct Info {
    evalsha: u64,
    eval: u64,
    commands: u64,
    net_in: u64,
    net_out: u64,
    cpu_s: f64,
}

fn info(ns: &str, port: u16) -> Result<Info> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "redis-cli", "-h", REDIS_IP, "-p", &port.to_string(), "info", "all"])
        .stdin(Stdio::null())
        .output()
        .context("redis-cli")?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut i = Info::default();
    for l in text.lines() {
        let Some((k, v)) = l.trim().split_once(':') else { continue };
        let num = |v: &str| v.parse::<f64>().unwrap_or(0.0);
        let calls = |v: &str| v.split(',').find_map(|f| f.strip_prefix("calls=")).map_or(0, |c| c.parse().unwrap_or(0));
        match k {
            "cmdstat_evalsha" => i.evalsha = calls(v),
            "cmdstat_eval" => i.eval = calls(v),
            "total_commands_processed" => i.commands = num(v) as u64,
            "total_net_input_bytes" => i.net_in = num(v) as u64,
            "total_net_output_bytes" => i.net_out = num(v) as u64,
            "used_cpu_sys" | "used_cpu_user" => i.cpu_s += num(v),
            _ => {}
        }
    }
    if i.commands == 0 {
        bail!("redis-cli info answered nothing: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(i)
}

/// One measured window: what Redis served per node and per rule.
pub struct Row {
    pub secs: f64,
    pub requests_per_node_rule: f64,
    pub bytes_in_per_node_rule: f64,
    pub bytes_out_per_node_rule: f64,
    pub redis_cpu_pct: f64,
    pub commands_per_s: f64,
    pub rounds: u64,
    pub failures: u64,
}

/// Runs the rig for `secs` (after a settling second) `reps` times and
/// writes the report to `report`.
pub fn run(report: &Path, secs: u64, reps: usize) -> Result<()> {
    let mut rules = String::new();
    for r in 0..RULES {
        let _ = write!(
            rules,
            "[[rule]]\nprefix = \"10.{}.{}.0/24\"\ntotal_rate = \"30kpps\"\nglobal = \"g{r}\"\n\n",
            r / 256,
            r % 256
        );
    }
    let f = Fleet::new("fbench", &rules);
    std::thread::sleep(Duration::from_secs(1));
    let mut rows = Vec::new();
    for rep in 0..reps {
        let rounds0: Vec<(u64, u64)> = (0..NODES).map(|n| rounds(&f, n)).collect();
        let a = info(&f.ctl, 6379)?;
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_secs(secs));
        let b = info(&f.ctl, 6379)?;
        let dt = t0.elapsed().as_secs_f64();
        let rounds1: Vec<(u64, u64)> = (0..NODES).map(|n| rounds(&f, n)).collect();
        let per = (NODES * RULES) as f64 * dt;
        let row = Row {
            secs: dt,
            requests_per_node_rule: ((b.evalsha + b.eval) - (a.evalsha + a.eval)) as f64 / per,
            bytes_in_per_node_rule: (b.net_in - a.net_in) as f64 / per,
            bytes_out_per_node_rule: (b.net_out - a.net_out) as f64 / per,
            redis_cpu_pct: (b.cpu_s - a.cpu_s) / dt * 100.0,
            commands_per_s: (b.commands - a.commands) as f64 / dt,
            rounds: rounds1.iter().zip(&rounds0).map(|(x, y)| x.0 - y.0).sum(),
            failures: rounds1.iter().zip(&rounds0).map(|(x, y)| x.1 - y.1).sum(),
        };
        say(&format!(
            "global rep {rep}: {:.2} requests/s and {:.0} B/s in, {:.0} B/s out per node per rule; Redis CPU {:.1} %",
            row.requests_per_node_rule, row.bytes_in_per_node_rule, row.bytes_out_per_node_rule, row.redis_cpu_pct
        ));
        rows.push(row);
    }
    std::fs::write(report, render(&rows, secs))?;
    say(&format!("wrote {}", report.display()));
    Ok(())
}

/// A node's lease rounds and failures so far.
fn rounds(f: &Fleet, n: usize) -> (u64, u64) {
    let (s, _) = f.fleet(n);
    (s["rounds"].as_u64().unwrap_or(0), s["failures"].as_u64().unwrap_or(0))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn render(rows: &[Row], secs: u64) -> String {
    let cpu = crate::sys::run("sh", &["-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"]).unwrap_or_default();
    let date = crate::sys::run("date", &["-u", "+%Y-%m-%d %H:%M"]).unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().next().unwrap_or("?").to_string();
    let redis = crate::sys::run("redis-server", &["--version"]).unwrap_or_default();
    let m = |f: fn(&Row) -> f64| median(rows.iter().map(f).collect());
    let mut out = format!(
        "# Fleet budgets: lease traffic and Redis CPU\n\n\
         `policer-bench --only global` ({}; {}; {}): {NODES} nodes (each its own namespace and \
         `policer` daemon) × {RULES} global rules (`--total-rate 30kpps --global gN`, one budget each), \
         the default lease period of 100 ms, one Debian redis-server on a bridge in a control namespace. \
         Counted by Redis itself (`INFO`: the EVALSHA/EVAL calls, network bytes, CPU) over {} windows of \
         {secs} s; medians. No traffic: a rule's lease is the same script call whatever its demand \
         (docs/fleet.md). Redis's figures do not depend on how `policer` was built; its lease thread's rounds \
         (failed or late: later than a period) do, and on what else the machine runs (load average {}).\n\n",
        date.trim(),
        cpu.trim(),
        redis.trim(),
        rows.len(),
        load
    );
    out.push_str("| per node per rule | requests/s | bytes/s to Redis | bytes/s from Redis |\n|---|---|---|---|\n");
    let _ = writeln!(
        out,
        "| lease (one script call a period, pipelined) | {:.2} | {:.0} | {:.0} |",
        m(|r| r.requests_per_node_rule),
        m(|r| r.bytes_in_per_node_rule),
        m(|r| r.bytes_out_per_node_rule)
    );
    let _ = writeln!(
        out,
        "\n| whole fleet ({NODES} × {RULES}) | value |\n|---|---|\n\
         | Redis CPU (user + sys, % of one core) | {:.1} |\n| Redis commands/s (each script's calls inside counted) | {:.0} |\n\
         | script calls/s | {:.0} |\n| lease rounds (all nodes, per window) | {} |\n| rounds failed or late | {} |",
        m(|r| r.redis_cpu_pct),
        m(|r| r.commands_per_s),
        m(|r| r.requests_per_node_rule) * (NODES * RULES) as f64,
        rows.iter().map(|r| r.rounds).sum::<u64>() / rows.len().max(1) as u64,
        rows.iter().map(|r| r.failures).sum::<u64>(),
    );
    let _ = writeln!(
        out,
        "\nEach window: {}",
        rows.iter().map(|r| format!("{:.1} s", r.secs)).collect::<Vec<_>>().join(", ")
    );
    out
}
