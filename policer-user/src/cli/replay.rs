//! `policer replay FILE [--config FILE] [--rate RATE [--burst N]] [--json] [--top N]`.

use std::path::PathBuf;

use policer_common::rate::Rate;

use crate::replay;

#[derive(clap::Args)]
pub struct Args {
    /// The capture: pcap or pcapng, Ethernet or Linux cooked (SLL, SLL2).
    file: PathBuf,
    /// The rules to replay with: a config file as the daemon reads it
    /// (rules with their classes and automatic bans, manual bans, named
    /// sets ([[set]], read from their files) and `protect`; not a
    /// [crowdsec] feed).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Default rate per source (the rules for 0.0.0.0/0 and ::/0), over the
    /// config's default rules if both are given.
    #[arg(long, value_parser = parse_rate, allow_hyphen_values = true)]
    rate: Option<Rate>,
    /// Default burst per source, as `attach --burst`.
    #[arg(long, allow_hyphen_values = true)]
    burst: Option<String>,
    /// How many dropped sources to list, most drops first (0: every source
    /// tracked). The source table holds 65 536 sources (or twice --top):
    /// past that, those with the fewest drops are let go, and said so.
    #[arg(long, default_value_t = 10)]
    top: usize,
    /// Print the report as JSON (per rule, per source, totals).
    #[arg(long)]
    pub(super) json: bool,
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    Rate::parse(s).map_err(|e| e.to_string())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let Args { file, config, rate, burst, top, json } = a;
    let r = replay::replay(&replay::Options { capture: file, config, rate, burst, top, json })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", replay::text(&r));
    }
    Ok(())
}
