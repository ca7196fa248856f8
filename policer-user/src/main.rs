//! `policer`: per-source packet-rate policing in XDP.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use policer_common::rate::Rate;
use policer_user::{
    Mode,
    config::DEFAULT_PATH,
    control::{self, Request, Response, RuleView},
    daemon::{self, Daemon, DaemonArgs},
    report,
    rules::{ActionName, BurstValue, RuleConfig},
};

#[derive(Parser)]
#[command(name = "policer", version, about = "Per-source packet-rate policer in XDP")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon: attach to the interfaces and police every source.
    Attach {
        /// Interfaces (default: `daemon.interfaces` from the config file).
        #[arg(value_name = "IFACE")]
        ifaces: Vec<String>,
        /// Default rate per source (rule for 0.0.0.0/0 and ::/0): 500pps,
        /// 10kpps, 1.5Mpps, or a bit rate (64kbit, 10gbit) for byte mode.
        #[arg(long, value_parser = parse_rate, allow_hyphen_values = true)]
        rate: Option<Rate>,
        /// Default burst per source: packets (200), or bytes for a bit rate
        /// (1500b, 64kb). Default: 1/50 s worth of the rate.
        #[arg(long, allow_hyphen_values = true)]
        burst: Option<String>,
        /// XDP mode: auto tries native, then skb.
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Sources tracked at once (bucket table size; default 1048576).
        #[arg(long)]
        max_sources: Option<u32>,
        /// Seconds between counter lines (0: off).
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
        /// Config file (rules; written after every change).
        #[arg(long, default_value = DEFAULT_PATH)]
        config: PathBuf,
        /// On exit leave the program attached and policing; a later
        /// `policer attach` adopts it, `policer detach` removes it.
        #[arg(long)]
        persist: bool,
        /// Serve Prometheus metrics: PORT or :PORT (127.0.0.1), or ADDRESS:PORT.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
    },
    /// Detach from an interface (through the daemon, or directly if none runs).
    Detach { iface: String },
    /// Change the running daemon's rules.
    Rule {
        #[command(subcommand)]
        cmd: RuleCmd,
    },
    /// Re-read the config file; applied only if all of it is valid.
    Reload,
    /// The running daemon: interfaces, config, rules.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Counters: totals, per interface, per rule (exact, summed over CPUs).
    Stats {
        /// One JSON object (per sample with --watch); see README for the schema.
        #[arg(long)]
        json: bool,
        /// Repeat every SECS seconds, with rates between samples.
        #[arg(long, value_name = "SECS")]
        watch: Option<f64>,
    },
    /// The sources with the most debt and the most drops right now.
    Top {
        /// How many sources in each list.
        #[arg(short = 'n', long = "count", default_value_t = 10)]
        n: usize,
        #[arg(long)]
        json: bool,
        /// Repeat every SECS seconds.
        #[arg(long, value_name = "SECS")]
        watch: Option<f64>,
    },
}

fn watch_period(w: Option<f64>) -> anyhow::Result<Option<std::time::Duration>> {
    match w {
        None => Ok(None),
        Some(s) if (0.1..=3600.0).contains(&s) => Ok(Some(std::time::Duration::from_secs_f64(s))),
        Some(s) => anyhow::bail!("--watch {s}: must be 0.1 ..= 3600 seconds"),
    }
}

#[derive(Subcommand)]
enum RuleCmd {
    /// Add or replace the rule for a prefix (longest prefix wins).
    Set {
        /// 203.0.113.0/24, 2001:db8::/48, or one address.
        cidr: String,
        /// Rate per source (or per --key-len group): 500pps, 10kpps, 64kbit, 10gbit.
        #[arg(long, allow_hyphen_values = true)]
        rate: Option<String>,
        /// Burst: packets, or bytes for a bit rate (1500b, 64kb).
        #[arg(long, allow_hyphen_values = true)]
        burst: Option<String>,
        #[arg(long, value_enum, default_value_t = ActionName::Police)]
        action: ActionName,
        /// Leading source bits that form one bucket (default 32 IPv4, 64 IPv6).
        #[arg(long, allow_hyphen_values = true)]
        key_len: Option<String>,
    },
    /// Remove the rule for a prefix.
    Rm { cidr: String },
    /// List the rules.
    Ls {
        #[arg(long)]
        json: bool,
    },
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    Rate::parse(s).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Warnings (including sampled kernel events) to stderr; RUST_LOG overrides.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Sends a request; a refused request is an error (non-zero exit).
fn call(req: Request) -> anyhow::Result<Response> {
    let r = control::call(&req)?;
    if !r.ok {
        anyhow::bail!("{}", r.error.unwrap_or_else(|| "refused".into()));
    }
    Ok(r)
}

fn print_rules(rules: &[RuleView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rules)?);
        return Ok(());
    }
    println!("{:<44} {:<8} {:>12} {:>14} {:>7}", "PREFIX", "ACTION", "RATE", "BURST", "KEY-LEN");
    for r in rules {
        let burst = r.burst.map(|b| format!("{b} {}", if r.unit == "bytes" { "B" } else { "pkt" }));
        println!(
            "{:<44} {:<8} {:>12} {:>14} {:>7}",
            r.prefix,
            r.action,
            r.rate.as_deref().unwrap_or("-"),
            burst.as_deref().unwrap_or("-"),
            r.key_len
        );
    }
    Ok(())
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.cmd {
        Cmd::Attach { ifaces, rate, burst, mode, max_sources, interval, config, persist, metrics } => {
            let args = DaemonArgs { ifaces, rate, burst, mode, max_sources, interval, config, persist, metrics };
            // Start before any thread exists: adopting a running program
            // uses a private mount namespace for this process.
            let d = Daemon::start(&args)?;
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(d.serve())?;
        }
        Cmd::Detach { iface } => match control::call(&Request::Detach { iface: iface.clone() }) {
            Ok(r) if r.ok => println!("policer: {}", r.message.unwrap_or_default()),
            Ok(r) => anyhow::bail!("{}", r.error.unwrap_or_default()),
            Err(policer_user::Error::NoDaemon) => {
                println!("policer: {}", daemon::detach_orphan(&iface)?)
            }
            Err(e) => return Err(e.into()),
        },
        Cmd::Rule { cmd: RuleCmd::Set { cidr, rate, burst, action, key_len } } => {
            let key_len = match key_len {
                Some(k) => Some(
                    k.parse::<u32>().map_err(|_| anyhow::anyhow!("invalid --key-len '{k}': not a number of bits"))?,
                ),
                None => None,
            };
            let rule =
                RuleConfig { prefix: cidr, rate, burst: burst.map(BurstValue::Text), action: Some(action), key_len };
            // Validate here too, so bad input fails even with no daemon.
            rule.validate()?;
            let r = call(Request::RuleSet { rule })?;
            println!("policer: {}", r.message.unwrap_or_default());
        }
        Cmd::Rule { cmd: RuleCmd::Rm { cidr } } => {
            policer_user::rules::parse_prefix(&cidr)?;
            let r = call(Request::RuleRm { prefix: cidr })?;
            println!("policer: {}", r.message.unwrap_or_default());
        }
        Cmd::Rule { cmd: RuleCmd::Ls { json } } => {
            let r = call(Request::RuleLs)?;
            print_rules(&r.rules, json)?;
        }
        Cmd::Reload => {
            let r = call(Request::Reload)?;
            println!("policer: {}", r.message.unwrap_or_default());
        }
        Cmd::Stats { json, watch } => {
            let period = watch_period(watch)?;
            let mut prev: Option<control::StatsView> = None;
            loop {
                let mut s = call(Request::Stats)?.stats.unwrap_or_default();
                if let Some(p) = &prev {
                    report::add_rates(&mut s, p);
                }
                if json {
                    // One object per line in watch mode.
                    println!(
                        "{}",
                        if period.is_some() { serde_json::to_string(&s)? } else { serde_json::to_string_pretty(&s)? }
                    );
                } else {
                    print!("{}", report::stats_text(&s));
                    if period.is_some() {
                        println!();
                    }
                }
                let Some(p) = period else { break };
                prev = Some(s);
                std::thread::sleep(p);
            }
        }
        Cmd::Top { n, json, watch } => {
            if n == 0 || n > 100_000 {
                anyhow::bail!("-n {n}: must be 1 ..= 100000");
            }
            let period = watch_period(watch)?;
            loop {
                let t = call(Request::Top { n })?.top.unwrap_or_default();
                if json {
                    println!(
                        "{}",
                        if period.is_some() { serde_json::to_string(&t)? } else { serde_json::to_string_pretty(&t)? }
                    );
                } else {
                    print!("{}", report::top_text(&t));
                    if period.is_some() {
                        println!();
                    }
                }
                let Some(p) = period else { break };
                std::thread::sleep(p);
            }
        }
        Cmd::Status { json } => {
            let r = call(Request::Status)?;
            let s = r.status.unwrap_or_default();
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                println!(
                    "policer daemon pid {} on {}; {} rules from {}; {}",
                    s.pid,
                    s.interfaces.join(", "),
                    s.rules,
                    s.config,
                    if s.persist { "persists on exit" } else { "detaches on exit" }
                );
            }
        }
    }
    Ok(())
}
