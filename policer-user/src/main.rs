//! `policer`: per-source packet-rate policing in XDP.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use policer_common::rate::Rate;
use policer_user::{
    Mode,
    config::DEFAULT_PATH,
    control::{self, Request, Response, RuleView},
    daemon::{self, Daemon, DaemonArgs},
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
        Cmd::Attach { ifaces, rate, burst, mode, max_sources, interval, config, persist } => {
            let args = DaemonArgs { ifaces, rate, burst, mode, max_sources, interval, config, persist };
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
