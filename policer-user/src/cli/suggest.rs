//! `policer suggest (--watch DURATION | --pcap FILE --config FILE)
//! [--keep SHARE] [--rule CIDR…] [--max-pps P] [--json]`.

use std::path::PathBuf;

use policer_common::capture::MAX_CAPTURE_PPS;

use super::{Usage, daemon};
use crate::suggest::{self, peaks};

#[derive(clap::Args)]
#[command(after_help = "Prints, per rule, the per-source peak rates it saw (over 100 ms, 1 s and 10 s \
    windows: p50, p90, p99, p99.9, max), the rate and burst that --keep of the sources stay within, the \
    sources that would be cut, and the `policer rule set` lines that apply it: run them with --dry-run \
    first to see which live sources they would drop. docs/suggest.md has the math.")]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// Watch the running daemon's judged frames for this long (`60s`,
    /// `10m`): each frame counted under the rule that judged it. At least
    /// 10 s for a rate from 10 s windows.
    #[arg(long, value_name = "DURATION", conflicts_with = "pcap")]
    watch: Option<String>,
    /// Count a capture's frames instead (pcap or pcapng, as `policer
    /// replay` reads it), on its own timestamps; needs --config.
    #[arg(long, value_name = "FILE", requires = "config")]
    pcap: Option<PathBuf>,
    /// The rules a --pcap is counted for: a config file as the daemon reads
    /// it (each frame under the class-less rule whose prefix is the longest
    /// over its source, its sources keyed by the rule's key_len).
    #[arg(long, value_name = "FILE", requires = "pcap")]
    config: Option<PathBuf>,
    /// The share of each rule's sources the proposal keeps within it
    /// (nearest rank: no source's numbers are interpolated).
    #[arg(long, value_name = "PERCENT", default_value = "99.9%", value_parser = peaks::parse_keep)]
    keep: peaks::Ppm,
    /// Only these rules, by prefix (repeat or list them).
    #[arg(long = "rule", value_name = "CIDR", num_args = 1.., value_delimiter = ',')]
    rules: Vec<String>,
    /// With --watch: the capture's bound, frames per second in all (frames
    /// past it are not seen, and the report says how many).
    #[arg(long, value_name = "P", default_value_t = MAX_CAPTURE_PPS)]
    max_pps: u64,
    /// Print JSON (fields: docs/json.md, and the man page).
    #[arg(long)]
    pub(super) json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let mut only = Vec::new();
    for r in &a.rules {
        only.push(crate::prefix::parse_prefix(r)?);
    }
    let report = match (&a.watch, &a.pcap, &a.config) {
        (Some(w), None, _) => {
            let d = crate::duration::parse(w).map_err(|e| anyhow::anyhow!("--watch {w}: {e}"))?;
            if d < std::time::Duration::from_secs(1) || d > std::time::Duration::from_secs(24 * 3600) {
                anyhow::bail!("--watch {w}: from 1s to 24h");
            }
            if !(1..=MAX_CAPTURE_PPS).contains(&a.max_pps) {
                anyhow::bail!("--max-pps {}: 1 to {MAX_CAPTURE_PPS}", a.max_pps);
            }
            eprintln!("policer: watching the daemon's judged frames for {} ...", crate::duration::format(d));
            suggest::live::watch(&daemon()?, d, &only, a.max_pps, a.keep)?
        }
        (None, Some(p), Some(c)) => suggest::from_capture(p, c, &only, a.keep)?,
        _ => {
            return Err(Usage(
                "policer suggest: give --watch DURATION (the daemon's traffic) or --pcap FILE --config FILE (a \
                 capture)"
                    .into(),
            )
            .into());
        }
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", suggest::text(&report));
    }
    Ok(())
}
