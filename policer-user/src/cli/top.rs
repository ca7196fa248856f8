//! `policer top [-n N] [--json] [--watch SECS]`.

use super::{daemon, show, watch_period};
use crate::report;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// How many sources in each list.
    #[arg(short = 'n', long = "count", default_value_t = 10)]
    n: usize,
    /// Print JSON (fields: docs/json.md, and the man page).
    #[arg(long)]
    pub(super) json: bool,
    /// Repeat every SECS seconds.
    #[arg(long, value_name = "SECS")]
    watch: Option<f64>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.n == 0 || a.n > 100_000 {
        anyhow::bail!("-n {}: must be 1 to 100000", a.n);
    }
    let period = watch_period(a.watch)?;
    loop {
        let t = daemon()?.top(a.n)?;
        show(&t, a.json, period.is_some(), report::top_text)?;
        let Some(p) = period else { break };
        std::thread::sleep(p);
    }
    Ok(())
}
