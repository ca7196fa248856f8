//! `cargo xtask`: set up the toolchain, build, test, demo, install.
//!
//! Every verb that needs the eBPF toolchain runs `setup` first; `setup` is
//! idempotent and says what it does.

use std::{
    path::{Path, PathBuf},
    process::{Command, ExitCode},
};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

/// The pinned toolchain (must match policer-user/build.rs and the
/// workspace's `rust-version`). Not in a `rust-toolchain.toml`: with one,
/// rustup must have that toolchain before `cargo` can even build xtask, and
/// where rustup does not install toolchains by itself
/// (`RUSTUP_AUTO_INSTALL=0`) the first `cargo xtask` fails. So xtask builds
/// with whatever toolchain is the default, installs the pinned one, and
/// runs every cargo of its own with it ([`cargo`]).
const TOOLCHAIN: &str = "1.98.0";
/// The LLVM major of that toolchain; bpf-linker must link the same one.
const LLVM_MAJOR: u32 = 22;
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages: LLVM for bpf-linker, and what the tests and demo run.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "libzstd-dev",
    "zlib1g-dev",
    "iproute2",
    "util-linux",
    "procps",
    // `man`, for the test that renders the generated man pages with it.
    "man-db",
    // The Prometheus project's OpenMetrics parser, to check /metrics in the tests.
    "python3-prometheus-client",
];

#[derive(Parser)]
#[command(name = "xtask")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install what a fresh Debian machine lacks (toolchain, LLVM, bpf-linker).
    Setup,
    /// Build everything (the XDP object is embedded in `policer`).
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Run every test tier: host, object (PROG_TEST_RUN), veth (real traffic).
    Test {
        /// Only the host tier (no root needed).
        #[arg(long)]
        host_only: bool,
    },
    /// Police real traffic in a sandbox of two namespaces, with live counters.
    Demo {
        /// Seconds of traffic.
        #[arg(long, default_value_t = 10)]
        seconds: u32,
    },
    /// Measure against nftables, iptables hashlimit and XDP floors; writes
    /// BENCHMARKS.md, bench/results.json and bench/*.png.
    Bench {
        /// Smoke run (about a minute once built) instead of the full one.
        #[arg(long)]
        quick: bool,
    },
    /// Flood the policer for minutes while rules change, the config is
    /// reloaded, `/metrics` is scraped and `top` runs; grade exact counters,
    /// RSS growth and control-request waits; write the soak section of
    /// BENCHMARKS.md.
    Soak {
        /// Minutes of traffic.
        #[arg(long, default_value_t = 10)]
        minutes: u32,
    },
    /// Build in release mode and install `policer` (default /usr/local/bin).
    Install {
        #[arg(long, default_value = "/usr/local")]
        root: PathBuf,
    },
    /// cargo fmt --check and cargo clippy -D warnings.
    Lint,
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf()
}

fn say(msg: &str) {
    eprintln!("xtask: {msg}");
}

/// Runs a command from the workspace root, failing on a non-zero exit.
fn sh(cmd: &mut Command) -> Result<()> {
    cmd.current_dir(workspace());
    let st = cmd.status().with_context(|| format!("cannot run {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed ({st})");
    }
    Ok(())
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(cmd).args(args).output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

/// `cargo` of the pinned toolchain (rustup's proxy, told which toolchain),
/// not the cargo that built xtask.
fn cargo() -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(workspace()).env("RUSTUP_TOOLCHAIN", TOOLCHAIN).env_remove("RUSTC").env_remove("RUSTDOC");
    c
}

fn run(cli: Cli) -> Result<()> {
    match cli.cmd {
        Cmd::Setup => setup(),
        Cmd::Build { release } => {
            setup()?;
            let mut c = cargo();
            c.args(["build", "--workspace", "--bins"]);
            if release {
                c.arg("--release");
            }
            sh(&mut c)
        }
        Cmd::Test { host_only } => test(host_only),
        Cmd::Demo { seconds } => demo(seconds),
        Cmd::Bench { quick } => bench(quick),
        Cmd::Soak { minutes } => soak(minutes),
        Cmd::Install { root } => {
            setup()?;
            sh(cargo().args(["install", "--locked", "--path", "policer-user", "--root"]).arg(&root))?;
            let bin = root.join("bin/policer");
            say(&format!("installed {}", bin.display()));
            install_docs(&bin, &root)
        }
        Cmd::Lint => {
            setup()?;
            sh(cargo().args(["fmt", "--all", "--check"]))?;
            sh(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))
        }
    }
}

/// Man pages and completions, generated by the installed binary itself,
/// where `man` and the shells look under `root`.
fn install_docs(bin: &Path, root: &Path) -> Result<()> {
    let man = root.join("share/man/man8");
    sh(Command::new(bin).arg("man").arg("--out").arg(&man))?;
    for (shell, path) in [
        ("bash", "share/bash-completion/completions/policer"),
        ("zsh", "share/zsh/site-functions/_policer"),
        ("fish", "share/fish/vendor_completions.d/policer.fish"),
    ] {
        let out = Command::new(bin).args(["completions", shell]).output().context("policer completions")?;
        if !out.status.success() {
            bail!("policer completions {shell} failed");
        }
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().expect("a directory"))?;
        std::fs::write(&path, out.stdout)?;
    }
    say(&format!("installed man pages in {} (`man policer`) and bash, zsh and fish completions", man.display()));
    Ok(())
}

fn is_root() -> bool {
    output("id", &["-u"]).is_some_and(|s| s.trim() == "0")
}

/// The Debian packages of `pkgs` that are not installed.
fn missing_packages<'a>(pkgs: &[&'a str]) -> Vec<&'a str> {
    pkgs.iter()
        .copied()
        .filter(|p| {
            !output("dpkg-query", &["-W", "-f=${Status}", p]).is_some_and(|s| s.contains("install ok installed"))
        })
        .collect()
}

fn apt_install(pkgs: &[&str]) -> Result<()> {
    sh(Command::new("apt-get").args(["update", "-q"]))?;
    sh(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(pkgs)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn setup() -> Result<()> {
    let debian = Path::new("/etc/debian_version").exists();
    // 1. Debian packages.
    let missing = missing_packages(APT_PACKAGES);
    if !missing.is_empty() {
        if !debian {
            bail!(
                "not a Debian system: install by hand LLVM {LLVM_MAJOR} development files (llvm-config, \
                 libLLVM, Polly), zstd and zlib development files, iproute2 and util-linux; then \
                 `LLVM_PREFIX=<llvm {LLVM_MAJOR} prefix> cargo +{TOOLCHAIN} install bpf-linker@{BPF_LINKER_VERSION} \
                 --no-default-features --features llvm-{LLVM_MAJOR}` and rerun"
            );
        }
        if !is_root() {
            bail!("missing packages {missing:?}: run as root, or `sudo apt-get install {}`", missing.join(" "));
        }
        say(&format!("installing Debian packages: {}", missing.join(" ")));
        apt_install(&missing)?;
    }
    // 2. The pinned toolchain with rust-src (for -Z build-std=core).
    setup_rust()?;
    // 3. bpf-linker, linked against the same LLVM major as rustc.
    setup_bpf_linker()
}

/// The pinned toolchain with rust-src (for -Z build-std=core), rustfmt
/// and clippy.
fn setup_rust() -> Result<()> {
    let have = output("rustup", &["component", "list", "--installed", "--toolchain", TOOLCHAIN])
        .is_some_and(|s| ["rust-src", "rustfmt", "clippy"].iter().all(|c| s.lines().any(|l| l.starts_with(c))));
    if !have {
        say(&format!("installing Rust {TOOLCHAIN} with rust-src"));
        sh(Command::new("rustup").args([
            "toolchain",
            "install",
            TOOLCHAIN,
            "--profile",
            "minimal",
            "--component",
            "rust-src,rustfmt,clippy",
        ]))?;
    }
    Ok(())
}

/// bpf-linker, linked against the same LLVM major as rustc.
fn setup_bpf_linker() -> Result<()> {
    let llvm_ok = output("sh", &["-c", "ldd \"$(command -v bpf-linker)\""]).is_some_and(|s| {
        s.contains(&format!("libLLVM.so.{LLVM_MAJOR}")) || s.contains(&format!("libLLVM-{LLVM_MAJOR}"))
    });
    let version_ok = output("bpf-linker", &["--version"]).is_some_and(|s| s.contains(BPF_LINKER_VERSION));
    if !(llvm_ok && version_ok) {
        say(&format!("building bpf-linker {BPF_LINKER_VERSION} against LLVM {LLVM_MAJOR} (about a minute)"));
        sh(Command::new("rustup")
            .args(["run", TOOLCHAIN, "cargo", "install", "--force", "--locked"])
            .arg(format!("bpf-linker@{BPF_LINKER_VERSION}"))
            .args(["--no-default-features", "--features", &format!("llvm-{LLVM_MAJOR}")])
            .env("LLVM_PREFIX", format!("/usr/lib/llvm-{LLVM_MAJOR}")))?;
    }
    if output("bpf-linker", &["--version"]).is_none() {
        bail!("bpf-linker is installed but not on PATH: add ~/.cargo/bin to PATH");
    }
    say("setup: toolchain, LLVM and bpf-linker are in place");
    Ok(())
}

fn test(host_only: bool) -> Result<()> {
    if host_only {
        setup_rust()?;
    } else {
        setup()?;
    }
    // Tier 1: host unit and property tests (no root, no kernel).
    say("tier 1: host unit and property tests");
    sh(cargo().args(["test", "-p", "policer-common", "--features", "std"]))?;
    if host_only {
        // No bpf-linker needed: the daemon library and the test crate's
        // own units build without the XDP objects (AYA_BUILD_SKIP).
        for p in ["policer-user", "policer-tests"] {
            sh(cargo().args(["test", "-p", p, "--lib", "--bins"]).env("AYA_BUILD_SKIP", "1"))?;
        }
        return Ok(());
    }
    sh(cargo().args(["test", "-p", "policer-tests", "--lib", "--bins"]))?;
    sh(cargo().args(["test", "-p", "policer-user"]))?;
    sh(cargo().args(["build", "-p", "policer-user", "--bin", "policer"]))?;
    let bin = workspace().join("target/debug/policer");
    // Tier 2: the real object under PROG_TEST_RUN.
    say("tier 2: PROG_TEST_RUN of the real XDP object");
    for t in ["object", "kernel"] {
        sh(cargo().args(["test", "-p", "policer-tests", "--test", t]).env("POLICER_BIN", &bin))?;
    }
    // Tier 3: real binary, real frames over veth. One test at a time: they
    // measure rates on a 2-core machine.
    say("tier 3: the policer binary on real veth traffic");
    for t in ["veth", "control", "config", "lifecycle", "observe", "attack", "serve", "soak"] {
        sh(cargo()
            .args(["test", "-p", "policer-tests", "--test", t, "--", "--test-threads=1"])
            .env("POLICER_BIN", &bin))?;
    }
    say("all tiers passed");
    Ok(())
}

/// Peers the benchmark runs side by side with policer, ethtool (GRO on the
/// benchmark's veths) and the font its plots are drawn with.
const BENCH_PACKAGES: &[&str] = &["nftables", "iptables", "ethtool", "fonts-dejavu-core"];

fn bench(quick: bool) -> Result<()> {
    setup()?;
    if !is_root() {
        bail!("the benchmark attaches XDP, nftables and iptables rules in namespaces: run it as root");
    }
    let missing = missing_packages(BENCH_PACKAGES);
    if !missing.is_empty() {
        say(&format!("installing the benchmark's peers: {}", missing.join(" ")));
        apt_install(&missing)?;
    }
    sh(cargo().args(["build", "--release", "-p", "policer-user", "-p", "policer-tests", "--bins"]))?;
    let root = workspace();
    let mut c = Command::new(root.join("target/release/policer-bench"));
    c.args(["--report", "BENCHMARKS.md", "--results", "bench/results.json", "--plots", "bench"])
        .env("POLICER_BIN", root.join("target/release/policer"));
    if quick {
        c.arg("--quick");
    }
    sh(&mut c)
}

fn soak(minutes: u32) -> Result<()> {
    setup()?;
    if !is_root() {
        bail!("the soak creates network namespaces and attaches XDP: run it as root");
    }
    if minutes == 0 {
        bail!("--minutes must be at least 1");
    }
    // Release binaries, as the benchmark measures them.
    sh(cargo().args(["build", "--release", "-p", "policer-user", "-p", "policer-tests", "--bins"]))?;
    let root = workspace();
    sh(Command::new(root.join("target/release/policer-soak"))
        .args(["--minutes", &minutes.to_string(), "--report", "BENCHMARKS.md"])
        .env("POLICER_BIN", root.join("target/release/policer")))
}

fn demo(seconds: u32) -> Result<()> {
    setup()?;
    sh(cargo().args(["build", "-p", "policer-user", "-p", "policer-tests", "--bins"]))?;
    if !is_root() {
        bail!("the demo creates network namespaces and attaches XDP: run it as root");
    }
    // The demo handles Ctrl-C itself (stops traffic, detaches, removes the
    // sandbox); xtask only waits for it.
    // SAFETY: setting a signal disposition for this process.
    unsafe { libc_ignore_sigint() };
    let root = workspace();
    sh(Command::new(root.join("target/debug/policer-demo"))
        .args(["--seconds", &seconds.to_string()])
        .env("POLICER_BIN", root.join("target/debug/policer")))
}

/// SIG_IGN for SIGINT in this process only; the demo re-installs its own
/// handler (an ignored signal would otherwise be inherited across exec).
unsafe fn libc_ignore_sigint() {
    unsafe extern "C" {
        fn signal(sig: i32, handler: usize) -> usize;
    }
    const SIGINT: i32 = 2;
    const SIG_IGN: usize = 1;
    // SAFETY: plain libc call.
    unsafe { signal(SIGINT, SIG_IGN) };
}
