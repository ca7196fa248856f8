//! `policer detach IFACE`: through the daemon, or directly when none runs.

use crate::daemon::detach_orphan;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// The interface to stop policing.
    iface: String,
    /// With programs in the interface's chain: attach the first one in
    /// policer's place (atomically), so it runs alone on the interface.
    #[arg(long, conflicts_with = "force")]
    hand_over: bool,
    /// With programs in the interface's chain: detach anyway, emptying
    /// the chain (they stop running).
    #[arg(long)]
    force: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match super::daemon().and_then(|d| d.detach(a.iface.clone(), a.hand_over, a.force)) {
        Ok(m) => println!("policer: {m}"),
        Err(crate::Error::NoDaemon) => println!("policer: {}", detach_orphan(&a.iface)?),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
