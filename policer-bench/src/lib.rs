//! The benchmark (`cargo xtask bench`, the `policer-bench` binary): kernel
//! cost by PROG_TEST_RUN, per-packet cost on veth against XDP floors and
//! the kernel's own per-source limiters, accuracy under paced traffic, the
//! control plane; a Markdown report, JSON results and PNG plots.
//!
//! Everything runs inside network namespaces named `pb-*` that are removed
//! when each experiment ends. Nothing asserts a timing: it only reports.
//!
//! A crate of its own so that the tests crate does not carry the plotting
//! and the report; it runs on the tests crate's support code (namespaces,
//! frames, daemons, the paced sender and the live-frames generator).

pub mod accuracy;
pub mod control;
pub mod fleet;
pub mod kernel;
pub mod peers;
pub mod plot;
pub mod pressure;
pub mod report;
pub mod syn;
pub mod veth;

/// The policer's program built with its `bench` feature (the BENCH_SOURCES
/// global: synthetic sources), by build.rs: what the benchmark's kernel
/// rows and `--ab` load. The `policer` binary carries no such build.
pub static BENCH_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/policer"));

// The tests crate's support code, named at the root so that the modules
// above reach it as they did while they lived in that crate
// (`crate::netns`, `super::generator`). The generator and `sys` are shared
// with the attack and soak tiers, hence in `policer_tests::bench`.
use policer_tests::{
    REFERENCE_OBJECT,
    bench::{generator, sys},
    capture, classes, daemon, frame, lapi, netns, packet, traffic,
};

use std::{
    panic::{AssertUnwindSafe, catch_unwind},
    path::PathBuf,
    time::Instant,
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

/// Median with min–max over repetitions.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct Stat {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Stat {
    pub fn of(v: &[f64]) -> Stat {
        let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        if s.is_empty() {
            return Stat { median: f64::NAN, min: f64::NAN, max: f64::NAN, n: 0 };
        }
        s.sort_by(|a, b| a.total_cmp(b));
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Stat { median, min: s[0], max: s[n - 1], n }
    }
}

/// Progress on stderr.
pub fn say(msg: &str) {
    eprintln!("policer-bench: {msg}");
}

/// Everything one run measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub date: String,
    pub commit: String,
    pub machine: String,
    pub quick: bool,
    pub seconds: f64,
    pub kernel: Option<kernel::KernelResults>,
    pub veth: Option<veth::VethResults>,
    pub pressure: Option<pressure::PressureResults>,
    pub accuracy: Option<accuracy::AccuracyResults>,
    pub control: Option<control::ControlResults>,
    /// `--only syn` (absent from the results of runs before it).
    #[serde(default)]
    pub syn: Option<syn::SynResults>,
    pub targets: Vec<report::Target>,
    /// Experiments that failed, and why.
    pub errors: Vec<String>,
}

pub struct Options {
    pub quick: bool,
    pub report: PathBuf,
    /// docs/performance.md: where the paragraphs the report shortens go in
    /// full (its generated section).
    pub analysis: PathBuf,
    pub results: PathBuf,
    pub plots: PathBuf,
    /// Only these experiments (kernel, veth, ipv6, classes, pressure,
    /// accuracy, control, syn); all if empty.
    pub only: Vec<String>,
}

/// `f`, with a panic (the test-support helpers panic when a daemon does
/// not start) turned into an error carrying the first lines of its message.
pub fn unpanic<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(anyhow::anyhow!("panicked: {}", msg.lines().take(3).collect::<Vec<_>>().join(" ")))
        }
    }
}

/// Runs one experiment; a failure (error or panic) is recorded, not fatal.
fn guarded<T>(name: &str, errors: &mut Vec<String>, f: impl FnOnce() -> Result<T>) -> Option<T> {
    say(&format!("{name}: start"));
    let t0 = Instant::now();
    let r = match unpanic(f) {
        Ok(v) => Some(v),
        Err(e) => {
            errors.push(format!("{name}: {e:#}"));
            None
        }
    };
    say(&format!("{name}: done in {:.1} s", t0.elapsed().as_secs_f64()));
    r
}

pub fn run(o: &Options) -> Result<Results> {
    let t0 = Instant::now();
    let want = |x: &str| o.only.is_empty() || o.only.iter().any(|w| w == x);
    let reps = if o.quick { 2 } else { 5 };
    let mut errors = vec![];
    let kernel = if want("kernel") { guarded("kernel cost", &mut errors, || kernel::run(o.quick, reps)) } else { None };
    // The veth rows are the noisiest (a 2-vCPU VM shares its host): fifteen
    // repetitions (about 5 minutes), so a burst of someone else's load
    // cannot move a median.
    let veth_reps = if o.quick { reps } else { 15 };
    // The IPv4, IPv6 and class rows in one run of repetitions, so that
    // their ratios are within a run.
    let groups = veth::Groups { ipv4: want("veth"), ipv6: want("ipv6"), classes: want("classes") };
    let veth = if groups.ipv4 || groups.ipv6 || groups.classes {
        guarded("veth cost", &mut errors, || veth::run(o.quick, veth_reps, groups))
    } else {
        None
    };
    if let Some(e) = veth.as_ref().and_then(|v| v.class_error.as_ref()) {
        errors.push(format!("veth cost, class rows: {e}"));
    }
    // Floods that outnumber the table: their own floors, fewer repetitions
    // (their comparisons are by factors, not percent).
    let pressure = if want("pressure") {
        guarded("table pressure", &mut errors, || pressure::run(o.quick, if o.quick { reps } else { 7 }))
    } else {
        None
    };
    let accuracy = if want("accuracy") {
        guarded("accuracy", &mut errors, || accuracy::run(o.quick, if o.quick { 1 } else { 2 }))
    } else {
        None
    };
    let control = if want("control") {
        guarded("control plane", &mut errors, || control::run(o.quick, if o.quick { 2 } else { 3 }))
    } else if o.only.iter().any(|w| w == "import") {
        // The import rows alone (they are part of `control`).
        guarded("control plane: import", &mut errors, || control::run_import(if o.quick { 2 } else { 3 }))
    } else if o.only.iter().any(|w| w == "crowdsec") {
        // The CrowdSec feed rows alone (part of `control`).
        guarded("control plane: crowdsec", &mut errors, || control::run_feed(if o.quick { 1 } else { 3 }))
    } else {
        None
    };
    let syn =
        if want("syn") { guarded("syn cookies", &mut errors, || syn::run(o.quick, syn::reps(o.quick))) } else { None };
    let date = sys::run("date", &["-u", "+%Y-%m-%d %H:%M"]).unwrap_or_default().trim().to_string();
    let commit = head_commit();

    let mut r = Results {
        date,
        commit,
        machine: sys::machine(),
        quick: o.quick,
        seconds: 0.0,
        kernel,
        veth,
        pressure,
        accuracy,
        control,
        syn,
        targets: vec![],
        errors,
    };
    r.targets = report::targets(&r);
    std::fs::create_dir_all(&o.plots).with_context(|| format!("{}", o.plots.display()))?;
    let mut plot_errors = vec![];
    if let Some(v) = &r.veth
        && let Err(e) = plot::veth_cost(v, &o.plots.join("veth-cost.png"))
    {
        plot_errors.push(format!("plot veth-cost.png: {e:#}"));
    }
    if let Some(k) = &r.kernel
        && let Err(e) = plot::kernel_cost(k, &o.plots.join("kernel-cost.png"))
    {
        plot_errors.push(format!("plot kernel-cost.png: {e:#}"));
    }
    if let Some(a) = &r.accuracy
        && let Err(e) = plot::accuracy(a, &o.plots.join("accuracy.png"))
    {
        plot_errors.push(format!("plot accuracy.png: {e:#}"));
    }
    r.errors.extend(plot_errors);
    r.seconds = t0.elapsed().as_secs_f64();
    if let Some(dir) = o.results.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&o.results, serde_json::to_string_pretty(&r)? + "\n")?;
    publish(&r, o, None)?;
    say(&format!(
        "wrote {}, {} and plots in {} ({:.1} min)",
        o.report.display(),
        o.results.display(),
        o.plots.display(),
        r.seconds / 60.0
    ));
    for e in &r.errors {
        say(&format!("not measured: {e}"));
    }
    Ok(r)
}

/// Writes BENCHMARKS.md from `r`, readable in two minutes (long paragraphs
/// cut, whole in the generated section of docs/performance.md: see
/// `policer_tests::readable`), keeping the soak's section and its notes.
/// `rendered`: the commit that renders again the results of an earlier run.
pub fn publish(r: &Results, o: &Options, rendered: Option<&str>) -> Result<()> {
    use policer_tests::{readable, soak};
    let mut md = report::markdown(r);
    if let Some(c) = rendered {
        // After the paragraph that names the run.
        let at = md.find("Written by").and_then(|w| md[w..].find("\n\n").map(|i| w + i + 2)).unwrap_or(md.len());
        md.insert_str(
            at,
            &format!(
                "Rendered again at commit `{c}` from the results of that run (`policer-bench --render`): the numbers \
                 are the run's, the text is this commit's.\n\n"
            ),
        );
    }
    let (mut md, notes) = readable::split_long(&md);
    // The soak's section (`cargo xtask soak`) is not this run's: keep it,
    // and its notes.
    let mut others = Vec::new();
    let mut notes = notes;
    if let Some(s) = std::fs::read_to_string(&o.report).ok().as_deref().and_then(soak::soak_section) {
        // A soak section written before paragraphs were cut is cut now
        // (its notes then replace the soak's old ones).
        let (s, soak_notes) = readable::split_long(s);
        if soak_notes.is_empty() {
            others = readable::headings(&s);
        }
        notes.extend(soak_notes);
        md = soak::with_soak_section(&md, &s);
    }
    let from = format!("the benchmark run of {} (commit {})", r.date, r.commit);
    readable::publish(&o.report, &md, &o.analysis, notes, &others, &from)
        .with_context(|| format!("writing {} and {}", o.report.display(), o.analysis.display()))
}

/// Renders the report again from `o.results` (an earlier run's), with the
/// targets judged by this build: nothing is measured.
pub fn render(o: &Options) -> Result<()> {
    let text = std::fs::read_to_string(&o.results).with_context(|| format!("{}", o.results.display()))?;
    let mut r: Results = serde_json::from_str(&text).with_context(|| format!("parsing {}", o.results.display()))?;
    r.targets = report::targets(&r);
    publish(&r, o, Some(&head_commit()))?;
    say(&format!("rendered {} from {}", o.report.display(), o.results.display()));
    Ok(())
}

/// `git rev-parse --short HEAD`, marked when the tree has changes.
pub fn head_commit() -> String {
    let mut commit = sys::run("git", &["rev-parse", "--short", "HEAD"]).unwrap_or_default().trim().to_string();
    if sys::run("git", &["status", "--porcelain", "--untracked-files=no"]).is_ok_and(|s| !s.trim().is_empty()) {
        commit.push_str(" + uncommitted changes");
    }
    commit
}

/// An f64 of bench/results.json: JSON has no NaN nor infinity, and
/// serde_json writes them as `null`; read back, `null` is NaN (an
/// unmeasured value, or a target with no bound: [`report::targets`] judges
/// them again anyway).
pub(crate) fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}
