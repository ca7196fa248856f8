//! `--only syn` (issue 45, docs/syn-cookies.md): the CPU each system spends
//! per SYN of one spoofed SYN flood (random sources of 100.64.0.0/10, to a
//! kernel TCP server's port), and whether real kernel clients still
//! connect through it:
//!
//! - **floor**: the reference `xdp_drop` on the receiving veth (the
//!   flood's own cost: the raw-socket sender, the veth, an empty program);
//! - **policer, cookies in XDP**: `--syn-cookies always` (each SYN answered
//!   by a SYN-ACK from XDP, `XDP_TX`);
//! - **kernel SYN cookies**: policer attached with the TCP class allowed
//!   (it passes the SYNs), the kernel answering each with its own cookie
//!   (`net.ipv4.tcp_syncookies = 2`);
//! - **nftables synproxy**: no XDP program; the SYNs untracked in raw
//!   prerouting and answered by `synproxy` in the input hook;
//! - **the hand-off alone**: the reference `xdp_reflect` sends each SYN
//!   straight back (`XDP_TX`, addresses swapped, nothing else done): what
//!   one frame back per SYN costs on the veth, before any of an answer's
//!   own work (no cookie, no socket lookup, no policing).
//!
//! The flood comes from a raw socket (the live-frames generator sends
//! again, within one call, the pages the policer rewrote into SYN-ACKs:
//! docs/syn-cookies.md, "Redirected frames on veth") on
//! one CPU, which also runs the receiving veth's softirq and the
//! SYN-ACKs' way back into the sending namespace; its cost is that
//! thread's CPU time plus the CPU's ksoftirqd, per SYN the veth took. A
//! system's cost per SYN is that less the floor's in the same repetition,
//! and the headline ratio is the policer's against the kernel's, taken
//! repetition by repetition. The SYN-ACKs of every system go back over the
//! veth (the receiving side routes the flood's sources there) and are
//! dropped by an XDP program on the sending veth, as they would leave the
//! host for the forged sources: each row pays the same for them, the
//! veth's hand-off and one XDP drop. (Until 2026-11-29 the sending side's
//! stack took each of them, about 1 µs of the same CPU per SYN in every
//! row but the floor's, which diluted the ratio.)

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};
use policer_tests::syn::{self as rig, CLIENTS, PORT, RX4, TX4};
use serde::{Deserialize, Serialize};

use crate::{
    Stat,
    daemon::{Daemon, cli},
    netns::{Sandbox, ip, ip_out},
    say,
    sys::{bench_cpu, run_in, settle},
};

/// The systems, in the order measured within a repetition.
const SYSTEMS: [(&str, &str); 5] = [
    ("floor", "xdp_drop (floor)"),
    ("policer", "policer, cookies in XDP (--syn-cookies always)"),
    ("kernel", "kernel SYN cookies (policer passing the SYNs)"),
    ("synproxy", "nftables synproxy"),
    ("handoff", "XDP_TX of each SYN straight back (the hand-off alone)"),
];

/// One system's row.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SynRow {
    pub key: String,
    pub label: String,
    /// CPU ns per SYN, the flood's own cost included.
    pub gross_ns: Stat,
    /// CPU ns per SYN less the floor's (same repetition); none for the
    /// floor.
    pub net_ns: Option<Stat>,
    /// SYNs a second the flood reached (the sender's pace with this system
    /// on its CPU).
    pub syns_per_s: Stat,
    /// Frames the sending side received per SYN (the SYN-ACKs: 1 when
    /// every SYN was answered, 0 for the floor).
    #[serde(default)]
    pub back_per_syn: Stat,
    /// Real connections (kernel clients, data both ways) that completed
    /// during a flood, of `connects_tried`.
    pub connects_ok: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SynResults {
    pub rows: Vec<SynRow>,
    pub reps: usize,
    pub secs: f64,
    pub connects_tried: u64,
    /// The policer's net cost per SYN / the kernel's, repetition by
    /// repetition.
    pub policer_vs_kernel: Stat,
    /// The policer's / synproxy's.
    pub policer_vs_synproxy: Stat,
    /// The hand-off alone (a frame sent back per SYN by `XDP_TX`) / the
    /// kernel's cookies: what any answer from XDP pays on this rig before
    /// its own work.
    #[serde(default)]
    pub handoff_vs_kernel: Stat,
    /// What the policer's SYN path counted over the run (SYNs, cookies):
    /// that every SYN was answered from XDP.
    pub policer_syns: u64,
    pub policer_cookies: u64,
}

/// One system's rig: a sandbox serving TCP, and what defends it.
/// (Fields drop in order: the daemon and the program before the sandbox.)
struct Rig {
    key: &'static str,
    _daemon: Option<Daemon>,
    _xdp: Option<aya::Ebpf>,
    stop: Arc<AtomicBool>,
    server: Option<thread::JoinHandle<()>>,
    sb: Sandbox,
    frames: Vec<Vec<u8>>,
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.server.take() {
            let _ = h.join();
        }
    }
}

/// The flood's frames for `sb`: from the sending veth's own MAC, so that
/// the SYN-ACKs (MACs swapped by the policer, routed by the kernel) are
/// the sending side's frames, each the same way back.
fn frames(sb: &Sandbox) -> Vec<Vec<u8>> {
    let out = ip_out(&["-n", &sb.tx_ns, "-o", "link", "show", &sb.tx_if]);
    let mac: Vec<u8> = out
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .map(|m| m.split(':').filter_map(|p| u8::from_str_radix(p, 16).ok()).collect())
        .unwrap_or_default();
    let mut f = rig::syn_frames(65_536, 0x5eed, rig::spoofed_v4, RX4.parse().unwrap(), PORT, sb.rx_mac());
    if mac.len() == 6 {
        for x in &mut f {
            x[6..12].copy_from_slice(&mac);
        }
    }
    f
}

fn rig_for(key: &'static str, i: usize) -> Result<Rig> {
    let sb = rig::sandbox(Sandbox::named(
        &format!("pb-syn{i}-rx"),
        &format!("pb-syn{i}-tx"),
        &format!("pbrsyn{i}"),
        &format!("pbtsyn{i}"),
    ));
    // The flood's sources are routed back to the sending side: the
    // kernel's and synproxy's SYN-ACKs leave as the policer's do.
    ip(&["-n", &sb.rx_ns, "route", "add", "default", "via", TX4]);
    rig::sink_replies_to(&sb, std::net::Ipv4Addr::new(100, 64, 0, 0), 10);
    for k in ["all", "default", sb.rx_if.as_str()] {
        run_in(&sb.rx_ns, "sysctl", &["-qw", &format!("net.ipv4.conf.{k}.rp_filter=0")])?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let server = Some(rig::server(&sb.rx_ns, stop.clone()));
    let (mut daemon, mut xdp) = (None, None);
    match key {
        "floor" => {
            xdp = Some(crate::peers::attach_reference_in(&sb.rx_ns, &sb.rx_if, "xdp_drop", 1024)?);
        }
        "handoff" => {
            xdp = Some(crate::peers::attach_reference_in(&sb.rx_ns, &sb.rx_if, "xdp_reflect", 1024)?);
        }
        "policer" | "kernel" => {
            let d = Daemon::attach(
                &sb,
                &[
                    "--rate",
                    "100kpps",
                    "--burst",
                    "1000",
                    "--mode",
                    "native",
                    "--interval",
                    "0",
                    "--max-sources",
                    "262144",
                ],
            );
            let rule: &[&str] = if key == "policer" {
                &["rule", "set", "0.0.0.0/0", "--proto", "tcp", "--rate", "20kpps", "--syn-cookies", "always"]
            } else {
                &["rule", "set", "0.0.0.0/0", "--proto", "tcp", "--action", "allow"]
            };
            let out = cli(&sb, rule);
            if !out.status.success() {
                bail!("{key}: {}", String::from_utf8_lossy(&out.stderr));
            }
            daemon = Some(d);
        }
        _ => synproxy(&sb)?,
    }
    let frames = frames(&sb);
    Ok(Rig { key, _daemon: daemon, _xdp: xdp, stop, server, sb, frames })
}

/// nftables synproxy in front of the server's port (the nftables wiki's
/// ruleset): SYNs untracked in raw prerouting, then answered by `synproxy`
/// in input; invalid packets dropped. Conntrack must not pick up
/// connections from a bare ACK (`nf_conntrack_tcp_loose = 0`).
fn synproxy(sb: &Sandbox) -> Result<()> {
    let rules = format!(
        "table ip pbsyn {{
  chain pre {{
    type filter hook prerouting priority raw; policy accept;
    tcp dport {PORT} tcp flags & (fin|syn|rst|ack) == syn notrack
  }}
  chain inp {{
    type filter hook input priority filter; policy accept;
    tcp dport {PORT} ct state invalid,untracked synproxy mss 1460 wscale 7 timestamp sack-perm
    ct state invalid drop
  }}
}}\n"
    );
    crate::sys::run_in_stdin(&sb.rx_ns, "nft", &["-f", "-"], &rules).context("nft synproxy ruleset")?;
    run_in(&sb.rx_ns, "sysctl", &["-qw", "net.netfilter.nf_conntrack_tcp_loose=0"])?;
    Ok(())
}

/// Frames the sending veth dropped so far (the receiving side's ring full).
fn tx_dropped(sb: &Sandbox) -> u64 {
    let out = ip_out(&["-n", &sb.tx_ns, "-s", "-j", "link", "show", "dev", &sb.tx_if]);
    serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v[0]["stats64"]["tx"]["dropped"].as_u64())
        .unwrap_or(0)
}

/// Frames the sending veth received so far (the SYN-ACKs back).
fn tx_received(sb: &Sandbox) -> u64 {
    crate::sys::link_stats(&sb.tx_ns, &sb.tx_if).map_or(0, |s| s.rx_packets)
}

/// One flood of `secs` at `rig`: (CPU ns per SYN taken, SYNs a second,
/// frames back to the sending side per SYN taken, the share of the SYNs
/// sent that the veth dropped, its ring full).
fn measure(rig: &Rig, cpu: usize, secs: f64) -> Result<(f64, f64, f64, f64)> {
    settle();
    let (d0, b0) = (tx_dropped(&rig.sb), tx_received(&rig.sb));
    let stop = Arc::new(AtomicBool::new(false));
    let f = rig::flood(&rig.sb, rig.frames.clone(), cpu, stop, Duration::from_secs_f64(secs))
        .join()
        .map_err(|_| anyhow::anyhow!("{}: the flood panicked", rig.key))?;
    let taken = f.sent.saturating_sub(tx_dropped(&rig.sb) - d0);
    if taken == 0 {
        bail!("{}: no SYN reached the receiving side", rig.key);
    }
    let back = tx_received(&rig.sb).saturating_sub(b0) as f64 / taken as f64;
    let lost = 1.0 - taken as f64 / f.sent.max(1) as f64;
    Ok((f.own_ns as f64 / taken as f64, taken as f64 / (f.wall_ns as f64 / 1e9), back, lost))
}

/// Real connections through a flood at `rig`: how many of `n` completed.
fn connects(rig: &Rig, cpu: usize, other: usize, n: u64) -> u64 {
    let stop = Arc::new(AtomicBool::new(false));
    let h = rig::flood(&rig.sb, rig.frames.clone(), cpu, stop.clone(), Duration::from_secs(60));
    thread::sleep(Duration::from_millis(300));
    let from = (0..CLIENTS).map(rig::client4).collect();
    let ok = rig::connect_many_on(&rig.sb.tx_ns, from, SocketAddr::new(RX4.parse().unwrap(), PORT), n, Some(other));
    stop.store(true, Ordering::Relaxed);
    let _ = h.join();
    ok
}

fn syn_counters(rig: &Rig) -> (u64, u64) {
    let out = cli(&rig.sb, &["stats", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let row = v["rules"].as_array().and_then(|r| r.iter().find(|r| r["class"] == "tcp").cloned()).unwrap_or_default();
    let g = |k: &str| row["syn"][k].as_u64().unwrap_or(0);
    (g("syns"), g("cookies_sent"))
}

/// Repetitions of the group: ten (about two and a half minutes of
/// floods), a multiple of the systems' five so that the rotated order
/// puts each system in each place equally often. Its ratio is taken
/// repetition by repetition, each a difference of two differences on a
/// shared VM: with five, one rep's burst of someone else's load moved the
/// median by 0.05 (one binary's medians 0.33 and 0.47 an hour apart on
/// 2026-11-30).
pub fn reps(quick: bool) -> usize {
    if quick { 2 } else { 10 }
}

/// Runs the group: `reps` repetitions of `secs` per system, interleaved
/// in an order rotated each repetition, then `connects` real connections
/// through a flood at each.
pub fn run(quick: bool, reps: usize) -> Result<SynResults> {
    let secs = if quick { 1.0 } else { 2.0 };
    let tried: u64 = if quick { 50 } else { 200 };
    let cpu = bench_cpu();
    let other = if cpu == 0 { 1 } else { 0 };
    let mut rigs = Vec::new();
    let set_up = std::time::Instant::now();
    for (i, (key, _)) in SYSTEMS.iter().enumerate() {
        rigs.push(rig_for(key, i).with_context(|| format!("setting up {key}"))?);
    }
    // What a flood meets after its first two minutes: for that long after
    // its rule gets SYN cookies the policer looks each SYN's listener up
    // by the SYN's own tuple (policer_common::syn::EXACT_NS), a miss in the
    // kernel's table of connections per forged source; then by its
    // destination alone.
    let exact = Duration::from_nanos(policer_common::syn::EXACT_NS);
    if let Some(wait) = exact.checked_sub(set_up.elapsed()) {
        say(&format!("syn: {:.0} s until the SYN path's first two minutes are over", wait.as_secs_f64()));
        thread::sleep(wait + Duration::from_secs(1));
    }
    let mut gross = vec![Vec::new(); rigs.len()];
    let mut rate = vec![Vec::new(); rigs.len()];
    let mut back = vec![Vec::new(); rigs.len()];
    let mut lost = vec![0.0; rigs.len()];
    for rep in 0..reps {
        // The order rotates each repetition, so that no system always
        // follows the same one (ten repetitions: each system twice in each
        // place).
        for k in 0..rigs.len() {
            let i = (k + rep) % rigs.len();
            let r = &rigs[i];
            let (ns, pps, b, l) = measure(r, cpu, secs)?;
            lost[i] = l;
            gross[i].push(ns);
            rate[i].push(pps);
            back[i].push(b);
        }
        say(&format!(
            "syn: repetition {}/{reps}: {}",
            rep + 1,
            rigs.iter()
                .enumerate()
                .map(|(i, r)| format!("{} {:.0} ns ({:.1} % lost)", r.key, gross[i][rep], 100.0 * lost[i]))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let (policer_syns, policer_cookies) = syn_counters(&rigs[1]);
    let oks: Vec<u64> = rigs
        .iter()
        .map(|r| if matches!(r.key, "floor" | "handoff") { 0 } else { connects(r, cpu, other, tried) })
        .collect();
    let net = |i: usize| -> Vec<f64> { gross[i].iter().zip(&gross[0]).map(|(a, f)| a - f).collect() };
    let ratio =
        |a: usize, b: usize| -> Stat { Stat::of(&net(a).iter().zip(net(b)).map(|(x, y)| x / y).collect::<Vec<_>>()) };
    let rows = SYSTEMS
        .iter()
        .enumerate()
        .map(|(i, (key, label))| SynRow {
            key: key.to_string(),
            label: label.to_string(),
            gross_ns: Stat::of(&gross[i]),
            net_ns: (i > 0).then(|| Stat::of(&net(i))),
            syns_per_s: Stat::of(&rate[i]),
            back_per_syn: Stat::of(&back[i]),
            connects_ok: oks[i],
        })
        .collect();
    Ok(SynResults {
        rows,
        reps,
        secs,
        connects_tried: tried,
        policer_vs_kernel: ratio(1, 2),
        policer_vs_synproxy: ratio(1, 3),
        handoff_vs_kernel: ratio(4, 2),
        policer_syns,
        policer_cookies,
    })
}

/// The target, from a run's rows (not measured without them).
pub fn target(s: Option<&SynResults>) -> crate::report::Target {
    crate::report::target(
        "syn_vs_kernel",
        "SYN cookies in XDP: CPU per SYN of a spoofed flood ≤ 0.3× the kernel's own SYN cookies (each less the \
         xdp_drop floor)",
        "ratio",
        0.3,
        s.map(|s| s.policer_vs_kernel),
        || {
            "the SYN path's cost per SYN (its helpers: the socket lookup, the kernel's cookie, the frame rewritten \
             and sent back) against the kernel's, both measured on the same flood; see SYN floods below"
                .into()
        },
    )
}

fn stat_ns(s: &Stat) -> String {
    if s.n == 0 || !s.median.is_finite() {
        return "–".into();
    }
    format!("{:.0} ({:.0}–{:.0})", s.median, s.min, s.max)
}

/// The group's section of a report.
pub fn section(w: &mut String, s: &SynResults) {
    use std::fmt::Write as _;
    let _ = writeln!(w, "## SYN floods: CPU per SYN (`--only syn`)\n");
    let _ = writeln!(
        w,
        "One spoofed SYN flood (64-byte SYNs from random sources of 100.64.0.0/10, 65 536 frames in turn, to a kernel \
         TCP server's port) sent from a raw socket on one CPU into a veth whose peer serves TCP; that CPU also runs \
         the receiving softirq and the SYN-ACKs' way back. **CPU ns / SYN** = the sending thread's CPU time + that \
         CPU's ksoftirqd, per SYN the veth took; **less the floor** = the same less the xdp_drop row's, repetition by \
         repetition: what answering a SYN costs. {} repetitions of {:.0} s, systems interleaved in an order rotated each \
         repetition, after the policer's first two minutes of SYN cookies (until then it finds each SYN's listener by \
         the SYN's own tuple: docs/syn-cookies.md, \"The listener's lookup\"). **Connected**: real \
         kernel clients (on the other CPU; a connection counts when data went both ways) through the same flood. \
         The kernel is set for cookies (`tcp_syncookies = 2`, `tcp_timestamps = 2`); every SYN-ACK goes back to \
         the sending veth (its sources routed there) and is dropped there by an XDP program, as it would leave \
         the host for the forged source: each row pays the same for them. Generator: a raw socket, \
         not the live-frames generator (docs/syn-cookies.md, \"Open\").\n",
        s.reps, s.secs
    );
    let _ = writeln!(w, "| system | CPU ns / SYN | less the floor | SYNs/s reached | frames back / SYN | connected |");
    let _ = writeln!(w, "|---|---|---|---|---|---|");
    for r in &s.rows {
        let net = r.net_ns.as_ref().map_or("–".to_string(), stat_ns);
        let conn = if matches!(r.key.as_str(), "floor" | "handoff") {
            "–".to_string()
        } else {
            format!(
                "{} / {} ({:.1} %)",
                r.connects_ok,
                s.connects_tried,
                100.0 * r.connects_ok as f64 / s.connects_tried.max(1) as f64
            )
        };
        let _ = writeln!(
            w,
            "| {} | {} | {} | {:.0} | {:.2} | {conn} |",
            r.label,
            stat_ns(&r.gross_ns),
            net,
            r.syns_per_s.median,
            r.back_per_syn.median
        );
    }
    let f = |x: &Stat| {
        if x.n == 0 { "–".to_string() } else { format!("{:.2}× ({:.2}–{:.2})", x.median, x.min, x.max) }
    };
    let _ = writeln!(
        w,
        "\nThe policer's cost per SYN against the kernel's own cookies: **{}** (target ≤ 0.3×); against nftables \
         synproxy: {}. Its SYN path counted {} SYNs and answered {} with cookies over the run (the rest: the reflection \
         cap, or none).\n",
        f(&s.policer_vs_kernel),
        f(&s.policer_vs_synproxy),
        s.policer_syns,
        s.policer_cookies
    );
    if s.handoff_vs_kernel.n > 0 {
        let _ = writeln!(
            w,
            "The hand-off alone (each SYN sent straight back by `XDP_TX`, nothing else done: no socket lookup, no \
             cookie, no policing) costs {} the kernel's own cookies on this rig: any answer from XDP pays that \
             before its own work, so of a 0.3× budget it leaves the answer's own work the rest. A NIC's `XDP_TX` \
             (no peer to hand the frame to) would cost less.\n",
            f(&s.handoff_vs_kernel)
        );
    }
}

/// `--only syn`'s own report (bench/syn.md): the section and its target,
/// with the run's date, commit and machine.
pub fn report(s: &SynResults, date: &str, commit: &str, machine: &str) -> String {
    use std::fmt::Write as _;
    let mut w = String::new();
    let _ = writeln!(w, "# SYN cookies: cost per SYN (issue 45)\n");
    let _ = writeln!(
        w,
        "Written by `policer-bench --only syn` from one run: {date} (UTC), commit `{commit}`, {machine}. A full \
         `cargo xtask bench` puts the same section and target in BENCHMARKS.md.\n"
    );
    let t = target(Some(s));
    let m = if t.met == Some(true) {
        "**met**"
    } else if t.met == Some(false) {
        "**not met**"
    } else {
        "not measured"
    };
    let _ = writeln!(w, "| target | measured | |\n|---|---|---|");
    let _ = writeln!(
        w,
        "| {} | {:.2}× ({:.2}–{:.2}) | {m} |\n",
        t.what, s.policer_vs_kernel.median, s.policer_vs_kernel.min, s.policer_vs_kernel.max
    );
    section(&mut w, s);
    w
}
