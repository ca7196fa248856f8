//! `policer replay FILE [--config FILE] [--state-dir DIR] [--rate RATE [--burst N]] [--json] [--top N]`.

use std::path::PathBuf;

use policer_common::rate::Rate;

use crate::replay;

#[derive(clap::Args)]
pub struct Args {
    /// The capture: pcap or pcapng, Ethernet or Linux cooked (SLL, SLL2).
    file: PathBuf,
    /// The rules to replay with: a config file as the daemon reads it
    /// (rules with their classes and automatic bans, manual bans, named
    /// sets ([[set]], read from their files) and `protect`; a [crowdsec]
    /// feed's set is its saved set in --state-dir: live decisions are not
    /// fetched).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The daemon's state directory (as `policer attach --state-dir`, whose
    /// default is the same): its saved sets (DIR/sets/NAME.set: `rule
    /// import`'s, the [crowdsec] feed's) are installed as a start installs
    /// them (a [[set]] of the config of the same name replaces one, ended
    /// ones are left out). A directory that does not exist holds none.
    #[arg(long, value_name = "DIR", default_value = crate::sets::DEFAULT_STATE_DIR)]
    state_dir: PathBuf,
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
    let Args { file, config, state_dir, rate, burst, top, json } = a;
    let r = replay::replay(&replay::Options { capture: file, config, state_dir, rate, burst, top, json })?;
    if json {
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else {
        print!("{}", replay::text(&r));
    }
    Ok(())
}
