//! `cargo xtask demo`: the real policer on real traffic in a sandbox.
//!
//! Two namespaces joined by a veth pair; `policer attach` runs in one
//! (its live counter lines are shown as they come), and the other sends a
//! flood from thousands of sources plus one heavy hitter. Ends with what
//! each group got against what was configured. Ctrl-C stops early; the
//! sandbox is removed either way.

use std::{
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::Duration,
};

use clap::Parser;
use policer_tests::{
    daemon::Daemon,
    netns::Sandbox,
    traffic::{self, Flow},
};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value_t = 10)]
    seconds: u32,
    /// Per-source rate given to the policer, packets per second.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    #[arg(long, default_value_t = 100)]
    burst: u32,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: i32) {
    STOP.store(true, Ordering::Relaxed);
}

fn main() {
    let a = Args::parse();
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_sigint as *const () as libc::sighandler_t);
    }
    println!("demo: creating the sandbox (namespaces policer-demo-rx / policer-demo-tx)");
    let sb = Sandbox::named("policer-demo-rx", "policer-demo-tx", "pdemo-rx", "pdemo-tx");
    let rate = format!("{}pps", a.rate);
    let burst = a.burst.to_string();
    println!(
        "demo: sudo ip netns exec {} policer attach {} --config {} --rate {rate} --burst {burst}",
        sb.rx_ns, sb.rx_if, sb.config
    );
    let mut d = Daemon::attach(&sb, &["--rate", &rate, "--burst", &burst]);
    println!("{}", d.stdout());
    // Echo the policer's live counter lines while traffic runs.
    let out = d.out.clone();
    let echo_stop = Arc::new(AtomicBool::new(false));
    let es = echo_stop.clone();
    let echo = thread::spawn(move || {
        let mut shown = out.lock().unwrap().len();
        while !es.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(100));
            let lines = out.lock().unwrap();
            for l in &lines[shown..] {
                println!("  policer | {l}");
            }
            shown = lines.len();
        }
    });

    // Groups: one heavy hitter at 20x the rate, 20 abusers at 2x, and 2000
    // well-behaved sources at 1 % of it, IPv4 and IPv6.
    let r = a.rate as f64;
    let mut flows = vec![Flow { src: "198.18.0.1".parse().unwrap(), pps: 20.0 * r, len: 64 }];
    let abusers = 1..21;
    for i in abusers.clone() {
        flows.push(Flow { src: format!("198.18.1.{i}").parse().unwrap(), pps: 2.0 * r, len: 64 });
    }
    let normal = flows.len()..flows.len() + 2000;
    for i in 0..2000u32 {
        let src: IpAddr = if i % 4 == 3 {
            format!("2001:db8:{}:{}::1", i / 256, i % 256).parse().unwrap()
        } else {
            format!("198.18.{}.{}", 16 + i / 250, 1 + i % 250).parse().unwrap()
        };
        flows.push(Flow { src, pps: r / 100.0, len: 64 });
    }
    let offered: f64 = flows.iter().map(|f| f.pps).sum();
    println!("demo: sending {:.0} pps for {} s from {} sources (Ctrl-C stops early)", offered, a.seconds, flows.len());
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = stop.clone();
    let watcher = thread::spawn(move || {
        while !STOP.load(Ordering::Relaxed) && !s2.load(Ordering::Relaxed) {
            thread::sleep(Duration::from_millis(50));
        }
        s2.store(true, Ordering::Relaxed);
    });
    let (sent, got) = traffic::run_in(
        &sb.tx_ns,
        &sb.tx_if,
        &sb.rx_ns,
        &sb.rx_if,
        sb.rx_mac(),
        &flows,
        Duration::from_secs(a.seconds.into()),
        Some(stop.clone()),
    );
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    thread::sleep(Duration::from_millis(1100));
    echo_stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    let clean = d.stop_with(libc::SIGTERM);
    for l in d.stdout().lines().rev().take(2).collect::<Vec<_>>().into_iter().rev() {
        println!("  policer | {l}");
    }

    println!("\ndemo: summary (counted on the receiving side, per source)");
    println!("  {:<28} {:>8} {:>12} {:>12} {:>12}", "group", "sources", "sent", "admitted", "expected");
    let row = |name: &str, idx: std::ops::Range<usize>| {
        let s: u64 = idx.clone().map(|i| sent.sent[i]).sum();
        let g: u64 = idx.clone().map(|i| got.per_flow[i]).sum();
        // Each source may have rate*T + burst, or everything it sent if less.
        let e: f64 = idx.clone().map(|i| (r * sent.span_secs(i) + a.burst as f64).min(sent.sent[i] as f64)).sum();
        println!("  {name:<28} {:>8} {s:>12} {g:>12} {e:>12.0}", idx.len());
    };
    row(&format!("heavy hitter ({}x rate)", 20), 0..1);
    row("abusers (2x rate)", abusers);
    row("well-behaved (1% of rate)", normal);
    println!("  configured: {rate} per source, burst {burst}; expected = min(sent, rate x T + burst) per source");
    if got.socket_drops > 0 {
        println!("  note: the receiving socket itself lost {} frames", got.socket_drops);
    }
    println!("demo: policer {}; removing the sandbox", if clean { "detached cleanly" } else { "was killed" });
    drop(d);
    drop(sb);
}
