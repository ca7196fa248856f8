//! `policer attach`: run the daemon in the foreground.

use std::path::PathBuf;

use policer_common::rate::Rate;

use crate::{
    Mode,
    config::DEFAULT_PATH,
    daemon::{Daemon, DaemonArgs},
};

#[derive(clap::Args)]
pub struct Args {
    /// Interfaces (default: `daemon.interfaces` from the config file);
    /// `@default-route` is the interface of the default route.
    #[arg(value_name = "IFACE")]
    ifaces: Vec<String>,
    /// Default rate per source (rule for 0.0.0.0/0 and ::/0): 500pps,
    /// 10kpps, 1.5Mpps, or a bit rate (64kbit, 10gbit) for byte mode.
    #[arg(long, value_parser = parse_rate, allow_hyphen_values = true)]
    rate: Option<Rate>,
    /// Default burst per source: packets (200), or bytes for a bit rate
    /// (1500b, 64kb). Default: 1/50 s worth of the rate, at least 5 packets (a TCP
    /// handshake and its request) or 1500 bytes.
    #[arg(long, allow_hyphen_values = true)]
    burst: Option<String>,
    /// XDP mode: auto tries native, then skb.
    #[arg(long, value_enum)]
    mode: Option<Mode>,
    /// Sources tracked at once (bucket table size; default 1048576).
    #[arg(long)]
    max_sources: Option<u32>,
    /// Rules the daemon holds, each with its own counters and new-source
    /// limiter (default 16384; kernel memory: 56 bytes per rule and CPU).
    #[arg(long)]
    max_rules: Option<u32>,
    /// Seconds between counter lines (0: off).
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Config file (rules; written after every change). It may be
    /// read-only (a Kubernetes ConfigMap): changes then last until the
    /// daemon stops, and sets keep their state in --state-dir.
    #[arg(long, default_value = DEFAULT_PATH)]
    config: PathBuf,
    /// Writable directory for the daemon's state: the imported sets
    /// (DIR/sets/NAME.set, read at start). Sets kept beside the config by
    /// older releases (policer.sets/) are copied here at the first start.
    /// Two daemons (in two network namespaces) need two directories.
    #[arg(long, value_name = "DIR", default_value = crate::sets::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
    /// On exit leave the program attached and policing; a later
    /// `policer attach` adopts it, `policer detach` removes it.
    #[arg(long)]
    persist: bool,
    /// Serve Prometheus /metrics and /healthz: PORT or :PORT (127.0.0.1), or ADDRESS:PORT.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// When the program is removed from an interface from outside (`ip
    /// link set dev IFACE xdp off`, another loader, a driver reset), found
    /// within a tenth of a second and logged: `reattach` puts the same
    /// program back onto the empty hook (buckets, bans and counters kept;
    /// a program someone else attached is never replaced, only named),
    /// `exit` ends the daemon with status 1, `stay` keeps it running, not
    /// policing there. `status` shows NOT ATTACHED meanwhile.
    #[arg(long, value_enum, default_value_t = crate::daemon::hook::OnDetach::Reattach)]
    on_detach: crate::daemon::hook::OnDetach,
    /// Member mode: another root owns the hook (a Katran-style root that
    /// tail-calls into a pinned program array); policer puts its program in
    /// slot --slot of the array pinned at BPFFS_PATH, not onto the hook, and
    /// hands what it passes to the slots behind its own. One interface.
    /// Detach empties only that slot.
    #[arg(long, value_name = "BPFFS_PATH", requires = "slot")]
    join: Option<PathBuf>,
    /// The slot of the --join array policer runs in.
    #[arg(long, value_name = "N", requires = "join")]
    slot: Option<u32>,
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    Rate::parse(s).map_err(|e| e.to_string())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let Args {
        ifaces,
        rate,
        burst,
        mode,
        max_sources,
        max_rules,
        interval,
        config,
        state_dir,
        persist,
        metrics,
        on_detach,
        join,
        slot,
    } = a;
    let args = DaemonArgs {
        ifaces,
        rate,
        burst,
        mode,
        max_sources,
        max_rules,
        interval,
        config,
        state_dir,
        persist,
        metrics,
        on_detach,
        join: join.zip(slot),
    };
    // Start before any thread exists: adopting a running program uses a
    // private mount namespace for this process.
    let r = Daemon::start(&args).and_then(|d| d.run());
    // The daemon's last lines (queued) are written before the process ends.
    crate::daemon::output::flush(std::time::Duration::from_secs(2));
    r?;
    Ok(())
}
