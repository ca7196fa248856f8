//! The policer daemon and CLI as a library; `main.rs` and each subcommand
//! are thin wrappers.

pub mod attach;
pub mod error;
pub mod loader;

pub use error::{Error, Result};
pub use loader::{EBPF_OBJECT, LoadOptions, Mode, Policer};
