//! `policer stats [--json] [--watch SECS]`.

use super::{daemon, show, watch_period};
use crate::{control::StatsView, report};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// One JSON object (per sample with --watch); see docs/json.md for the schema.
    #[arg(long)]
    pub(super) json: bool,
    /// Repeat every SECS seconds, with rates between samples.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let period = watch_period(a.watch)?;
    let mut prev: Option<StatsView> = None;
    loop {
        let mut s = daemon()?.stats()?;
        if let Some(p) = &prev {
            report::add_rates(&mut s, p);
        }
        show(&s, a.json, period.is_some(), report::stats_text)?;
        let Some(p) = period else { break };
        prev = Some(s);
        std::thread::sleep(p);
    }
    Ok(())
}
