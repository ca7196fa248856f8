//! `policer reload`: re-read the config file.

use super::{call, done};
use crate::control::Request;

pub fn run() -> anyhow::Result<()> {
    println!("policer: {}", done(call(Request::Reload)?));
    Ok(())
}
