//! `policer reload`: re-read the config file.

use super::daemon;

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// Also drop the rules and bans set with `--runtime` (and bring back file rules removed with `--runtime`):
    /// the rules in force become exactly the file's. Without it they are kept over the file.
    #[arg(long)]
    pub discard_runtime: bool,
    /// Show what the reload would do, and change nothing: the rules and
    /// [[set]]s added, changed (field by field) and removed, and which
    /// sources live in the bucket table now would go from pass to drop or
    /// back (their rate measured over one second). A file the reload would
    /// refuse is refused the same way. See docs/dry-run.md.
    #[arg(long)]
    pub dry_run: bool,
    /// With --dry-run: print it as JSON (docs/json.md).
    #[arg(long, requires = "dry_run")]
    pub json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.dry_run {
        let req = crate::control::Request::Reload { discard_runtime: a.discard_runtime };
        return super::dryrun::print(&super::daemon()?.dry_run(req)?, a.json);
    }
    println!("policer: {}", daemon()?.reload(a.discard_runtime)?);
    Ok(())
}
