//! `policer detach IFACE`: through the daemon, or directly when none runs.

use crate::daemon::detach_orphan;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// The interface to stop policing.
    iface: String,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match super::daemon().and_then(|d| d.detach(a.iface.clone())) {
        Ok(m) => println!("policer: {m}"),
        Err(crate::Error::NoDaemon) => println!("policer: {}", detach_orphan(&a.iface)?),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
