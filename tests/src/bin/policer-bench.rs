//! `cargo xtask bench`: measures policer against XDP floors, nftables and
//! iptables hashlimit on this machine and writes BENCHMARKS.md,
//! bench/results.json and bench/*.png. See tests/src/bench/.
use std::{path::PathBuf, process::ExitCode};

use clap::Parser;
use policer_tests::bench::{Options, run, say};

#[derive(Parser)]
#[command(name = "policer-bench", about = "Benchmark policer against XDP floors and the kernel's per-source limiters")]
struct Args {
    /// Smoke run (about 3 minutes).
    #[arg(long)]
    quick: bool,
    /// The Markdown report to write.
    #[arg(long, default_value = "BENCHMARKS.md")]
    report: PathBuf,
    /// Machine-readable results.
    #[arg(long, default_value = "bench/results.json")]
    results: PathBuf,
    /// Directory for the PNG plots.
    #[arg(long, default_value = "bench")]
    plots: PathBuf,
    /// Only these experiments: kernel, veth, accuracy, control (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

fn main() -> ExitCode {
    let a = Args::parse();
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        say("needs root: it creates network namespaces and loads XDP programs (run `cargo xtask bench`)");
        return ExitCode::FAILURE;
    }
    // Highest CPU weight for this process and every thread and daemon it
    // starts: other work on the machine then delays the paced sender and
    // the generator as little as possible. (Per-thread on Linux: set
    // before any thread exists.)
    // SAFETY: plain syscall.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -20) };
    let o = Options { quick: a.quick, report: a.report, results: a.results, plots: a.plots, only: a.only };
    match run(&o) {
        Ok(r) if r.errors.is_empty() => ExitCode::SUCCESS,
        Ok(_) => {
            say("some experiments were not measured (see above); the report says which");
            ExitCode::SUCCESS
        }
        Err(e) => {
            say(&format!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}
