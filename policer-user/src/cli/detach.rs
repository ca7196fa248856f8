//! `policer detach IFACE`: through the daemon, or directly when none runs.

use super::{done, request};
use crate::{control::Request, daemon};

#[derive(clap::Args)]
pub struct Args {
    iface: String,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    match request(&Request::Detach { iface: a.iface.clone() }) {
        Ok(r) => println!("policer: {}", done(r)),
        Err(crate::Error::NoDaemon) => println!("policer: {}", daemon::detach_orphan(&a.iface)?),
        Err(e) => return Err(e.into()),
    }
    Ok(())
}
