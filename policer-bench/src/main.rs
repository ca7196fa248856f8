//! `cargo xtask bench`: measures policer against XDP floors, nftables and
//! iptables hashlimit on this machine and writes BENCHMARKS.md,
//! bench/results.json and bench/*.png. See the library (policer-bench/src/lib.rs).
use std::{path::PathBuf, process::ExitCode};

use clap::Parser;
use policer_bench::{Options, run, say};

#[derive(Parser)]
#[command(name = "policer-bench", about = "Benchmark policer against XDP floors and the kernel's per-source limiters")]
struct Args {
    /// Smoke run (about a minute).
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
    /// Where the paragraphs the report shortens go in full (a generated
    /// section of this file).
    #[arg(long, default_value = "docs/performance.md")]
    analysis: PathBuf,
    /// Instead of the benchmark: write the report again from --results
    /// (an earlier run's), with this build's text and targets. Measures
    /// nothing, needs no root.
    #[arg(long, conflicts_with_all = ["quick", "only", "save_object", "ab", "ab_veth"])]
    render: bool,
    /// Only these experiments (comma-separated): kernel, veth (the IPv4
    /// rows on veth), ipv6 (the IPv6 rows on veth, beside the IPv4 floor,
    /// policer, reference and nftables), classes (the class rows: the
    /// dropping policer with 16 class rules that do not match the flood
    /// beside the source-only one, and a UDP/53 flood against a class
    /// rule, nftables and iptables-legacy hashlimit; beside the IPv4 floor
    /// and dropping policer), pressure (population and spoofed floods),
    /// accuracy, control, import (the import rows of control alone),
    /// crowdsec (the CrowdSec feed rows of control alone), global (the
    /// fleet budgets' lease traffic and Redis CPU at 3 nodes × 100 global
    /// rules; only when named, into its own report: bench/fleet.md, or
    /// --report when given), syn (CPU per SYN of a spoofed SYN flood: the
    /// policer's cookies in XDP, the kernel's own, nftables synproxy; part
    /// of the full run; named alone, into its own report: bench/syn.md and
    /// bench/syn.json, or --report and --results when given).
    #[arg(long, value_delimiter = ',', value_parser = ["kernel", "veth", "ipv6", "classes", "pressure", "accuracy", "control", "import", "crowdsec", "global", "syn"])]
    only: Vec<String>,
    /// Instead of the benchmark: compare policer objects by PROG_TEST_RUN,
    /// side by side in one run (comma-separated ELF files; `built` is the
    /// object built into this binary). Prints a table; writes nothing.
    #[arg(long, value_delimiter = ',', value_name = "OBJECTS", conflicts_with_all = ["quick", "only", "save_object"])]
    ab: Vec<String>,
    /// Repetitions of an `--ab` run.
    #[arg(long, default_value_t = 11, value_parser = clap::value_parser!(u32).range(1..=1000), requires = "ab")]
    ab_reps: u32,
    /// Frames per repetition of an `--ab` run (5 000 000 or more: below
    /// that the test run's wall time comes in jiffy-sized steps).
    #[arg(long, default_value_t = 5_000_000, value_parser = clap::value_parser!(u32).range(1..), requires = "ab")]
    ab_repeat: u32,
    /// Write the object built into this binary to this file (to compare
    /// it with a later build by `--ab`), and exit.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["quick", "only"])]
    save_object: Option<PathBuf>,
    /// Instead of the benchmark: the live drop path of `policer` binaries
    /// side by side on veth (comma-separated paths), each as the
    /// benchmark's dropping policer row, beside the xdp_drop floor,
    /// repetitions interleaved and compared pair by pair. Prints a table;
    /// writes nothing.
    /// `PATH:N` runs that binary with `--max-sources N` (default: the
    /// benchmark's table capacity).
    #[arg(long, value_delimiter = ',', value_name = "BINARIES", conflicts_with_all = ["quick", "only", "save_object", "ab"])]
    ab_veth: Vec<policer_bench::veth::AbBinary>,
    /// Repetitions (of one second each) of an `--ab-veth` run.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000), requires = "ab_veth")]
    ab_veth_reps: u32,
    /// Sources in the flood of an `--ab-veth` run (each at 1 pps).
    #[arg(long, default_value_t = policer_bench::veth::SOURCES, value_parser = clap::value_parser!(u32).range(1..=16_777_216), requires = "ab_veth")]
    ab_veth_sources: u32,
    /// Address family of an `--ab-veth` run's flood: 4, or 6 (each source
    /// its own /64, as in the benchmark's IPv6 rows).
    #[arg(long, default_value = "4", value_parser = ["4", "6"], requires = "ab_veth")]
    ab_veth_family: String,
    /// Random sources instead of in turn (a spoofed flood: with
    /// `--ab-veth-sources` well above `--max-sources`, most frames miss
    /// the table, as in the benchmark's spoofed rows).
    #[arg(long, requires = "ab_veth")]
    ab_veth_random: bool,
    /// Each binary also with the benchmark's 16 class rules installed (on
    /// 0.0.0.0/0, none matching the flood: UDP to port 9), beside its
    /// source-only row: the class rows' A/B.
    /// (IPv4 floods only.)
    #[arg(long, requires = "ab_veth")]
    ab_veth_classes: bool,
    /// Each binary also with N single addresses spread over the IPv4 space
    /// (none in the flood's 10.0.0.0/8) in its rule trie: manual bans, and
    /// for the first binary (the build before, which has no bans) deny
    /// rules, its row the reference of the bans rows. (IPv4 floods only.)
    #[arg(long, value_name = "N", default_value_t = 0, requires = "ab_veth")]
    ab_veth_bans: u32,
    /// Each binary but the first also with its dropping rule banning
    /// (`--ban-for 1d`): after its first refusal every source of the flood
    /// is banned, so the row measures a banned source's drop.
    #[arg(long, requires = "ab_veth")]
    ab_veth_banned: bool,
    /// Each binary but the first also with a `policer capture` of its
    /// drops running, sampling one in N (`1/1000`): the drop path's cost
    /// while a capture runs.
    #[arg(long, value_name = "1/N", requires = "ab_veth")]
    ab_veth_capture: Option<String>,
    /// Each binary but the first also with the reference xdp_pass in slot
    /// 0 of its chain (policer_common::chain): the drop path's cost with a
    /// program behind policer (drops never enter the chain).
    #[arg(long, requires = "ab_veth")]
    ab_veth_chain: bool,
}

/// `--ab-veth`.
fn ab_veth(a: &Args) -> anyhow::Result<()> {
    for b in &a.ab_veth {
        if !b.path.is_file() {
            anyhow::bail!("{}: no such policer binary", b.path.display());
        }
    }
    use policer_bench::{peers::Family, veth::AbFlood};
    let family = if a.ab_veth_family == "6" { Family::V6 } else { Family::V4 };
    if a.ab_veth_classes && family == Family::V6 {
        anyhow::bail!("--ab-veth-classes: the class rules are on 0.0.0.0/0, for an IPv4 flood (--ab-veth-family 4)");
    }
    if a.ab_veth_bans > 0 && family == Family::V6 {
        anyhow::bail!("--ab-veth-bans: the bans are IPv4 addresses, for an IPv4 flood (--ab-veth-family 4)");
    }
    let flood = AbFlood { sources: a.ab_veth_sources, family, random: a.ab_veth_random };
    // A binary that is not a policer fails to start: an error, not a panic
    // (the namespaces are removed either way).
    let rows = policer_bench::unpanic(|| {
        policer_bench::veth::ab(
            &a.ab_veth,
            a.ab_veth_reps as usize,
            std::time::Duration::from_secs(1),
            flood,
            &policer_bench::veth::AbVariants {
                classes: a.ab_veth_classes,
                bans: a.ab_veth_bans,
                banned: a.ab_veth_banned,
                capture: a.ab_veth_capture.as_deref(),
                chain: a.ab_veth_chain,
            },
        )
    })?;
    println!(
        "CPU ns per received packet on veth ({} {} sources{}, 1 pps each, UDP to port {}), {} repetitions",
        a.ab_veth_sources,
        family.name(),
        if a.ab_veth_random { " at random" } else { " in turn" },
        policer_tests::bench::generator::FLOOD_DPORT,
        a.ab_veth_reps
    );
    let w = rows.iter().map(|r| r.label.chars().count()).max().unwrap_or(0);
    println!("{:w$} {:>22} {:>22} {:>22}", "", "ns median (min-max)", "x floor", "x first binary");
    for r in rows {
        let f = |s: &policer_bench::Stat, d: usize| format!("{:.d$} ({:.d$}-{:.d$})", s.median, s.min, s.max, d = d);
        println!("{:w$} {:>22} {:>22} {:>22}", r.label, f(&r.cpu_ns, 0), f(&r.vs_floor, 2), f(&r.vs_first, 3));
    }
    Ok(())
}

/// `--save-object` and `--ab`.
fn objects(a: &Args) -> anyhow::Result<()> {
    use anyhow::Context;
    if let Some(p) = &a.save_object {
        std::fs::write(p, policer_bench::BENCH_OBJECT).with_context(|| format!("writing {}", p.display()))?;
        say(&format!("wrote the built object to {}", p.display()));
        return Ok(());
    }
    let mut objects = Vec::new();
    for name in &a.ab {
        let bytes = if name == "built" {
            policer_bench::BENCH_OBJECT.to_vec()
        } else {
            std::fs::read(name).with_context(|| format!("reading {name}"))?
        };
        objects.push((name.clone(), bytes));
    }
    let rows = policer_bench::kernel::ab(&objects, a.ab_reps as usize, a.ab_repeat)?;
    println!("wall ns per packet over {} repetitions of {} frames", a.ab_reps, a.ab_repeat);
    println!("{:56} {:>8} {:>8} {:>8}", "", "min", "q25", "median");
    for r in rows {
        println!("{:56} {:8.1} {:8.1} {:8.1}", r.label, r.min, r.q25, r.median);
    }
    Ok(())
}

/// `--only syn` alone: its own report, bench/syn.md, and results,
/// bench/syn.json (or --report and --results when given).
fn syn_alone(a: &Args) -> anyhow::Result<()> {
    let named = |p: &PathBuf, default: &str, own: &str| {
        if p.as_path() == std::path::Path::new(default) { PathBuf::from(own) } else { p.clone() }
    };
    let report = named(&a.report, "BENCHMARKS.md", "bench/syn.md");
    let results = named(&a.results, "bench/results.json", "bench/syn.json");
    let s = policer_bench::unpanic(|| policer_bench::syn::run(a.quick, policer_bench::syn::reps(a.quick)))?;
    let date = policer_tests::bench::sys::run("date", &["-u", "+%Y-%m-%d %H:%M"]).unwrap_or_default();
    let md = policer_bench::syn::report(
        &s,
        date.trim(),
        &policer_bench::head_commit(),
        &policer_tests::bench::sys::machine(),
    );
    std::fs::write(&report, md)?;
    std::fs::write(&results, serde_json::to_string_pretty(&s)? + "\n")?;
    say(&format!("wrote {} and {}", report.display(), results.display()));
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
    if a.render {
        let o = Options {
            quick: false,
            report: a.report,
            analysis: a.analysis,
            results: a.results,
            plots: a.plots,
            only: a.only,
        };
        return match policer_bench::render(&o) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                say(&format!("error: {e:#}"));
                ExitCode::FAILURE
            }
        };
    }
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
    if a.save_object.is_some() || !a.ab.is_empty() || !a.ab_veth.is_empty() {
        let r = if a.ab_veth.is_empty() { objects(&a) } else { ab_veth(&a) };
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                say(&format!("error: {e:#}"));
                ExitCode::FAILURE
            }
        };
    }
    let mut a = a;
    if a.only.iter().any(|o| o == "global") {
        let report = if a.report.as_path() == std::path::Path::new("BENCHMARKS.md") {
            PathBuf::from("bench/fleet.md")
        } else {
            a.report.clone()
        };
        let (secs, reps) = if a.quick { (3, 1) } else { (10, 3) };
        if let Err(e) = policer_bench::fleet::run(&report, secs, reps) {
            say(&format!("error: global: {e:#}"));
            return ExitCode::FAILURE;
        }
        a.only.retain(|o| o != "global");
        if a.only.is_empty() {
            return ExitCode::SUCCESS;
        }
    }
    if a.only == ["syn"] {
        return match syn_alone(&a) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                say(&format!("error: syn: {e:#}"));
                ExitCode::FAILURE
            }
        };
    }
    let o = Options {
        quick: a.quick,
        report: a.report,
        analysis: a.analysis,
        results: a.results,
        plots: a.plots,
        only: a.only,
    };
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
