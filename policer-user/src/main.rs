//! `policer`: per-source packet-rate policing in XDP. Everything lives in
//! the library; see `policer_user::cli`.

use std::process::ExitCode;

use clap::Parser;
use policer_user::cli::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Warnings (including sampled kernel events) to stderr; RUST_LOG overrides.
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let json = cli.json();
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<policer_user::cli::Quiet>() => ExitCode::FAILURE,
        Err(e) if json => {
            println!("{}", serde_json::json!({ "error": format!("{e:#}") }));
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("policer: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
