//! `policer attach`: load, install the default rule, attach, report,
//! detach on SIGINT/SIGTERM.

use std::{
    collections::HashSet,
    io::Write,
    time::{Duration, Instant},
};

use ipnet::IpNet;
use policer_common::{
    Counters,
    rate::Rate,
    wire::{DEFAULT_KEY_LEN_V4, DEFAULT_KEY_LEN_V6},
};
use tokio::signal::unix::{SignalKind, signal};

use crate::{
    error::{Error, Result},
    loader::{LoadOptions, Mode, Policer, if_index, is_root},
};

#[derive(Clone, Debug)]
pub struct AttachArgs {
    pub ifaces: Vec<String>,
    pub rate: Rate,
    /// Packets, or bytes for a bit rate.
    pub burst: u64,
    pub mode: Mode,
    pub max_sources: u32,
    /// Seconds between counter lines; 0 turns them off.
    pub interval: f64,
}

/// Everything checked before anything in the kernel changes.
pub fn validate(args: &AttachArgs) -> Result<()> {
    if args.ifaces.is_empty() {
        return Err(Error::Invalid("no interface given".into()));
    }
    let mut seen = HashSet::new();
    for i in &args.ifaces {
        if !seen.insert(i) {
            return Err(Error::DuplicateInterface(i.clone()));
        }
        if_index(i)?;
    }
    if !(args.interval == 0.0 || (0.05..=3600.0).contains(&args.interval)) {
        return Err(Error::Invalid(
            "--interval must be 0 (off) or 0.05 ..= 3600 seconds".into(),
        ));
    }
    args.rate
        .rule(args.burst)
        .map_err(|e| Error::Invalid(format!("--rate/--burst: {e}")))?;
    if !is_root() {
        return Err(Error::NotRoot("attaching XDP"));
    }
    Ok(())
}

/// Loads, configures and attaches; on any error, nothing stays attached
/// (the partially attached policer is dropped, which detaches it).
pub fn start(args: &AttachArgs) -> Result<Policer> {
    validate(args)?;
    let mut p = Policer::load(&LoadOptions {
        max_sources: args.max_sources,
        test_clock: false,
    })?;
    let rule = args
        .rate
        .rule(args.burst)
        .map_err(|e| Error::Invalid(e.to_string()))?;
    let v4 = rule
        .with_key_len(DEFAULT_KEY_LEN_V4, false)
        .expect("valid key length");
    let v6 = rule
        .with_key_len(DEFAULT_KEY_LEN_V6, true)
        .expect("valid key length");
    p.set_rule("0.0.0.0/0".parse::<IpNet>().expect("literal"), &v4)?;
    p.set_rule("::/0".parse::<IpNet>().expect("literal"), &v6)?;
    let mut out = std::io::stdout().lock();
    for iface in &args.ifaces {
        let (_, mode) = p.attach(iface, args.mode)?;
        let _ = writeln!(
            out,
            "policer: attached to {iface} ({} mode)",
            Mode::name(mode)
        );
    }
    let unit = if args.rate.is_bytes() {
        "bytes"
    } else {
        "packets"
    };
    let _ = writeln!(
        out,
        "policer: policing every source at {} with a burst of {} {unit}; Ctrl-C detaches",
        args.rate, args.burst
    );
    let _ = out.flush();
    Ok(p)
}

/// One counters line; rates are per second since the previous sample.
pub fn format_line(elapsed: Duration, now: &Counters, prev: &Counters, dt: f64) -> String {
    let r = |a: u64, b: u64| {
        if dt > 0.0 {
            (a.saturating_sub(b)) as f64 / dt
        } else {
            0.0
        }
    };
    format!(
        "[{:>8.1}s] passed {} pkts ({:.0}/s)  dropped {} pkts ({:.0}/s)  would-drop {}  \
         sources {}  unmatched {}  non-ip {}  malformed {}",
        elapsed.as_secs_f64(),
        now.passed_pkts,
        r(now.passed_pkts, prev.passed_pkts),
        now.dropped_pkts,
        r(now.dropped_pkts, prev.dropped_pkts),
        now.would_drop_pkts,
        now.buckets_created,
        now.unmatched_pkts,
        now.non_ip_pkts,
        now.malformed_pkts,
    )
}

/// Runs in the foreground until SIGINT or SIGTERM.
pub async fn run(args: AttachArgs) -> Result<()> {
    let p = start(&args)?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    let started = Instant::now();
    let period = if args.interval > 0.0 {
        args.interval
    } else {
        3600.0
    };
    let mut tick = tokio::time::interval(Duration::from_secs_f64(period));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut prev = p.counters()?;
    let mut prev_at = Instant::now();
    loop {
        tokio::select! {
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = tick.tick(), if args.interval > 0.0 => {
                let now = p.counters()?;
                let dt = prev_at.elapsed().as_secs_f64();
                println!("{}", format_line(started.elapsed(), &now, &prev, dt));
                prev = now;
                prev_at = Instant::now();
            }
        }
    }
    let last = p.counters()?;
    println!(
        "{}",
        format_line(
            started.elapsed(),
            &last,
            &prev,
            prev_at.elapsed().as_secs_f64()
        )
    );
    drop(p);
    println!("policer: detached from {}", args.ifaces.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(ifaces: &[&str]) -> AttachArgs {
        AttachArgs {
            ifaces: ifaces.iter().map(|s| s.to_string()).collect(),
            rate: Rate::Pps(1000),
            burst: 10,
            mode: Mode::Auto,
            max_sources: 1024,
            interval: 1.0,
        }
    }

    #[test]
    fn validation_refuses_before_touching_the_kernel() {
        assert!(matches!(validate(&args(&[])), Err(Error::Invalid(_))));
        assert!(matches!(
            validate(&args(&["lo", "lo"])),
            Err(Error::DuplicateInterface(_))
        ));
        assert!(matches!(
            validate(&args(&["nosuch0"])),
            Err(Error::UnknownInterface(_))
        ));
        let mut a = args(&["lo"]);
        a.interval = 0.001;
        assert!(matches!(validate(&a), Err(Error::Invalid(_))));
        let mut a = args(&["lo"]);
        a.burst = 0;
        assert!(matches!(validate(&a), Err(Error::Invalid(_))));
    }

    #[test]
    fn counter_line_rates() {
        let prev = Counters {
            passed_pkts: 100,
            dropped_pkts: 10,
            ..Default::default()
        };
        let now = Counters {
            passed_pkts: 300,
            dropped_pkts: 1010,
            ..Default::default()
        };
        let l = format_line(Duration::from_secs(3), &now, &prev, 2.0);
        assert!(l.contains("passed 300 pkts (100/s)"), "{l}");
        assert!(l.contains("dropped 1010 pkts (500/s)"), "{l}");
    }
}
