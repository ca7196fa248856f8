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
    /// With --dry-run: judge this candidate file in the config file's
    /// place, before it is moved there (its [[set]] files are found from the
    /// config file's directory, where it is to go). The daemon reads it.
    #[arg(value_name = "FILE", requires = "dry_run", value_hint = clap::ValueHint::FilePath)]
    pub file: Option<std::path::PathBuf>,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if a.dry_run {
        // The daemon reads it: a path from here is made absolute here.
        let candidate = match a.file {
            Some(f) => {
                Some(std::path::absolute(&f).map_err(|e| anyhow::anyhow!("{}: {e}; nothing changed", f.display()))?)
            }
            None => None,
        };
        let req = crate::control::Request::Reload { discard_runtime: a.discard_runtime, candidate };
        return super::dryrun::print(&super::daemon()?.dry_run(req)?, a.json);
    }
    println!("policer: {}", daemon()?.reload(a.discard_runtime)?);
    Ok(())
}
