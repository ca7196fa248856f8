//! `policer reload`: re-read the config file.

use super::daemon;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also drop the rules and bans set with `--runtime` (and bring back file rules removed with `--runtime`):
    /// the rules in force become exactly the file's. Without it they are kept over the file.
    #[arg(long)]
    pub discard_runtime: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    println!("policer: {}", daemon()?.reload(a.discard_runtime)?);
    Ok(())
}
