//! `policer`: per-source packet-rate policing in XDP.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use policer_common::{DEFAULT_MAX_SOURCES, rate::Rate};
use policer_user::{Mode, attach};

#[derive(Parser)]
#[command(
    name = "policer",
    version,
    about = "Per-source packet-rate policer in XDP"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Police every source IP on the interfaces, in the foreground.
    Attach {
        /// Interfaces to attach to.
        #[arg(required = true, value_name = "IFACE")]
        ifaces: Vec<String>,
        /// Rate per source: 500pps, 10kpps, 1.5Mpps, or a bit rate (64kbit, 10gbit).
        #[arg(long, value_parser = parse_rate, allow_hyphen_values = true)]
        rate: Rate,
        /// Burst per source: packets (200), or bytes for a bit rate (1500b, 64kb).
        /// Default: 1/50 s worth of the rate.
        #[arg(long, allow_hyphen_values = true)]
        burst: Option<String>,
        /// XDP mode: auto tries native, then skb.
        #[arg(long, value_enum, default_value_t = Mode::Auto)]
        mode: Mode,
        /// Sources tracked at once (bucket table size).
        #[arg(long, default_value_t = DEFAULT_MAX_SOURCES)]
        max_sources: u32,
        /// Seconds between counter lines (0: off).
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    Rate::parse(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Attach {
            ifaces,
            rate,
            burst,
            mode,
            max_sources,
            interval,
        } => {
            let burst = match burst {
                Some(b) => rate
                    .parse_burst(&b)
                    .map_err(|e| anyhow::anyhow!("invalid --burst '{b}': {e}"))?,
                None => rate.default_burst(),
            };
            let args = attach::AttachArgs {
                ifaces,
                rate,
                burst,
                mode,
                max_sources,
                interval,
            };
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(attach::run(args))?;
            Ok(())
        }
    }
}
