//! `cargo xtask soak`: floods the real policer for minutes while a driver
//! changes rules, reloads, scrapes `/metrics` and runs `top`; grades exact
//! counters, RSS growth and control-request waits, and writes its section
//! of BENCHMARKS.md. See tests/src/soak.rs.
use std::{path::PathBuf, process::ExitCode};

use anyhow::Context;
use clap::Parser;
use policer_tests::{
    readable,
    soak::{self, with_soak_section},
};

#[derive(Parser)]
#[command(name = "policer-soak", about = "Soak the policer under a flood while rules change")]
struct Args {
    /// Minutes of traffic (the first minute, or a fifth of a shorter run, is warm-up).
    #[arg(long, default_value_t = 10.0)]
    minutes: f64,
    /// The report whose soak section to replace (or append).
    #[arg(long, default_value = "BENCHMARKS.md")]
    report: PathBuf,
    /// Where the paragraphs the report shortens go in full (a generated
    /// section of this file).
    #[arg(long, default_value = "docs/performance.md")]
    analysis: PathBuf,
    /// Spoofed frames per second.
    #[arg(long, default_value_t = soak::FLOOD_PPS)]
    flood_pps: u32,
    /// `--max-sources` of the daemon.
    #[arg(long, default_value_t = soak::MAX_SOURCES)]
    max_sources: u32,
}

fn say(m: &str) {
    eprintln!("policer-soak: {m}");
}

fn main() -> ExitCode {
    let a = Args::parse();
    if !(a.minutes > 0.0 && a.minutes <= 24.0 * 60.0) {
        say("--minutes must be in (0, 1440]");
        return ExitCode::FAILURE;
    }
    let mut o = soak::Options::minutes(a.minutes);
    o.flood_pps = a.flood_pps;
    o.max_sources = a.max_sources;
    let r = match soak::run(&o, &say) {
        Ok(r) => r,
        Err(e) => {
            say(&format!("error: {e:#}"));
            return ExitCode::FAILURE;
        }
    };
    let section = r.markdown();
    print!("{section}");
    let old = std::fs::read_to_string(&a.report).unwrap_or_default();
    // Long paragraphs cut to their lead; whole in docs/performance.md,
    // beside the benchmark's (kept: its headings are the rest of the report).
    let (short, notes) = readable::split_long(&section);
    let md = with_soak_section(&old, &short);
    let others: Vec<String> =
        readable::headings(&md).into_iter().filter(|h| !readable::headings(&short).contains(h)).collect();
    if let Err(e) = readable::publish(&a.report, &md, &a.analysis, notes, &others, "the last soak")
        .with_context(|| format!("writing {} and {}", a.report.display(), a.analysis.display()))
    {
        say(&format!("error: {e:#}"));
        return ExitCode::FAILURE;
    }
    say(&format!("wrote the soak section of {}", a.report.display()));
    if r.passed_all() {
        say("all criteria met");
        ExitCode::SUCCESS
    } else {
        say("some criteria not met (see the section)");
        ExitCode::FAILURE
    }
}
