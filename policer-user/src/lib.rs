//! The policer daemon and CLI as a library; `main.rs` and each subcommand
//! are thin wrappers.

pub mod batch;
pub mod capture;
pub mod chain;
pub mod classes;
pub mod cli;
pub mod compile;
pub mod config;
pub mod control;
pub mod crowdsec;
pub mod daemon;
pub mod duration;
pub mod error;
pub mod files;
pub mod fleet;
#[cfg(test)]
mod layering;
pub mod loader;
pub mod lockfile;
pub mod member;
pub mod metrics;
pub mod mmdb;
pub mod netlink;
pub mod prefix;
pub mod protect;
pub mod replay;
pub mod report;
pub mod resolve;
pub mod rules;
pub mod sets;
pub mod suggest;
pub mod syncookies;
pub mod text;
pub mod trie;

pub use error::{Error, Result};
pub use loader::{EBPF_OBJECT, LoadOptions, Mode, Policer};
