//! `policer`: per-source packet-rate policing in XDP. Everything lives in
//! the library; see `policer_user::cli`.

use std::process::ExitCode;

use clap::Parser;
use policer_user::cli::Cli;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        // Help and version are printed as asked; a usage error too, unless
        // the command line asked for JSON: then it is JSON on stdout.
        Err(e) if e.use_stderr() && std::env::args_os().any(|a| a == "--json") => {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default().trim_start_matches("error: ");
            println!("{}", serde_json::json!({ "error": first, "exit": Cli::EXIT_USAGE }));
            return ExitCode::from(Cli::EXIT_USAGE);
        }
        Err(e) => e.exit(),
    };
    // Warnings (including sampled kernel events) to stderr, through the
    // daemon's voice (never blocking it; the journal's priorities under
    // systemd); RUST_LOG overrides.
    policer_user::daemon::init_log();
    let json = cli.json();
    match cli.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let status = Cli::exit_status(&e);
            if e.is::<policer_user::cli::Quiet>() {
            } else if json {
                println!("{}", serde_json::json!({ "error": format!("{e:#}"), "exit": status }));
            } else {
                // Not eprintln!: a closed stderr (a closed terminal) must
                // not turn the exit status into a panic's.
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "policer: error: {e:#}");
            }
            ExitCode::from(status)
        }
    }
}
