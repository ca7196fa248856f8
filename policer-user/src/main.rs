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
            println!("{}", serde_json::json!({ "error": usage_error(&text), "exit": Cli::EXIT_USAGE }));
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

/// clap's usage error as one line: its message and what it names on the
/// lines below it (the missing arguments, the value it refused), without
/// the usage and the "--help" hint that follow a blank line.
fn usage_error(text: &str) -> String {
    let head = text.split("\n\n").next().unwrap_or_default();
    let words: Vec<&str> = head.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    words.join(" ").trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_usage_error_in_json_names_what_is_missing() {
        let clap = "error: the following required arguments were not provided:\n  <CIDR>\n\nUsage: policer rule set <CIDR>\n\nFor more information, try '--help'.\n";
        assert_eq!(super::usage_error(clap), "the following required arguments were not provided: <CIDR>");
        assert_eq!(super::usage_error("error: unexpected argument '--x' found\n"), "unexpected argument '--x' found");
    }
}
