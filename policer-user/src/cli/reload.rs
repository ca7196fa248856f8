//! `policer reload`: re-read the config file.

use super::daemon;

pub fn run() -> anyhow::Result<()> {
    println!("policer: {}", daemon()?.reload()?);
    Ok(())
}
