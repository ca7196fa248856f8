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
const TOOLCHAIN: &str = env!("POLICER_TOOLCHAIN");
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
    // `tcpdump -r`, to read back what `policer capture` writes (tests/tests/capture.rs).
    "tcpdump",
    // The shells whose completion scripts the observe tier sources and asks
    // (bash is there already).
    "zsh",
    "fish",
    // The chain tier (tests/tests/chain.rs): an unmodified xdp-filter and
    // its objects behind policer, and bpftool to put a pinned program in.
    "xdp-tools",
    "bpftool",
    // The fleet tier (tests/tests/fleet.rs): the Redis the fleet budgets
    // lease from (redis-server and redis-cli; the tests start it).
    "redis-server",
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
    /// A static (musl) `policer` and a Debian package holding it, the
    /// systemd unit, the default config, man pages and completions, in
    /// `target/dist/`.
    Dist,
    /// A FROM-scratch container image (buildah) with the static binary and
    /// the default config: `localhost/policer:VERSION` and `:latest`.
    Image,
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
        Cmd::Setup => setup()
            .and_then(|()| setup_feed_tools())
            .and_then(|()| setup_observe_tools())
            .and_then(|()| setup_mmdb_tools()),
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
        Cmd::Dist => dist().map(|_| ()),
        Cmd::Image => image(),
        Cmd::Lint => {
            setup()?;
            sh(cargo().args(["fmt", "--all", "--check"]))?;
            sh(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
            // The test hooks are compiled only with their feature.
            sh(cargo()
                .args(["clippy", "-p", "policer-user", "--all-targets", "--features", "test-hooks", "--"])
                .args(["-D", "warnings"]))
        }
    }
}

/// Man pages and completions, generated by the installed binary itself,
/// where `man` and the shells look under `root`.
fn install_docs(bin: &Path, root: &Path) -> Result<()> {
    let man = root.join("share/man/man8");
    sh(Command::new(bin).arg("man").arg("--out").arg(&man))?;
    let man5 = root.join("share/man/man5");
    std::fs::create_dir_all(&man5)?;
    std::fs::rename(man.join("policer.toml.5"), man5.join("policer.toml.5"))?;
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
        for p in ["policer-user", "policer-tests", "policer-bench"] {
            sh(cargo().args(["test", "-p", p, "--lib", "--bins"]).env("AYA_BUILD_SKIP", "1"))?;
        }
        return Ok(());
    }
    sh(cargo().args(["test", "-p", "policer-tests", "-p", "policer-bench", "--lib", "--bins"]))?;
    sh(cargo().args(["test", "-p", "policer-user"]))?;
    // The binary the tiers run carries the test hooks (lifecycle steers
    // starts with them); built after `cargo test -p policer-user`, which
    // leaves one without them at the same path.
    sh(cargo().args(["build", "-p", "policer-user", "--bin", "policer", "--features", "test-hooks"]))?;
    let bin = target_dir().join("debug/policer");
    // Tier 2: the real object under PROG_TEST_RUN.
    say("tier 2: PROG_TEST_RUN of the real XDP object");
    for t in ["object", "kernel", "class_object", "ban_object", "replay"] {
        sh(cargo().args(["test", "-p", "policer-tests", "--test", t]).env("POLICER_BIN", &bin))?;
    }
    // Tier 3: real binary, real frames over veth. One test at a time: they
    // measure rates on a 2-core machine. `dist` tests the package and the
    // image built here, and the Kubernetes manifests (kubernetes-validate).
    setup_fleet_tools()?;
    setup_feed_tools()?;
    setup_observe_tools()?;
    setup_mmdb_tools()?;
    image()?; // builds the package (dist) first
    // `dist` also checks that a release build carries no test hooks.
    sh(cargo().args(["build", "--release", "-p", "policer-user", "--bin", "policer"]))?;
    say("tier 3: the policer binary on real veth traffic");
    for t in [
        "dist",
        "veth",
        "control",
        "config",
        "lifecycle",
        "observe",
        "attack",
        "serve",
        "soak",
        "classes",
        "sport",
        "bans",
        "import",
        "feeds",
        "crowdsec",
        "mmdb",
        "alerts",
        "dryrun",
        "capture",
        "suggest",
        "chain",
        "fleet",
        "syn",
    ] {
        // Built first and the build's writes put on disk before the tier
        // runs: written back later, in the middle of its first tests, they
        // stall the timed senders and control calls of a 2-core machine.
        sh(cargo().args(["test", "-p", "policer-tests", "--test", t, "--no-run"]))?;
        sh(&mut Command::new("sync"))?;
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
    sh(cargo().args(["build", "--release", "-p", "policer-user", "-p", "policer-bench", "--bins"]))?;
    let mut c = Command::new(target_dir().join("release/policer-bench"));
    c.args(["--report", "BENCHMARKS.md", "--results", "bench/results.json", "--plots", "bench"])
        .env("POLICER_BIN", target_dir().join("release/policer"));
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
    sh(Command::new(target_dir().join("release/policer-soak"))
        .args(["--minutes", &minutes.to_string(), "--report", "BENCHMARKS.md"])
        .env("POLICER_BIN", target_dir().join("release/policer")))
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
    sh(Command::new(target_dir().join("debug/policer-demo"))
        .args(["--seconds", &seconds.to_string()])
        .env("POLICER_BIN", target_dir().join("debug/policer")))
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

/// The cargo target directory (`CARGO_TARGET_DIR`, else `target/`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace().join("target"), PathBuf::from)
}

const MUSL: &str = "x86_64-unknown-linux-musl";
const VERSION: &str = env!("CARGO_PKG_VERSION");

/// `cargo xtask dist`: the static binary and the Debian package, in
/// `target/dist/`. Returns the package's path.
fn dist() -> Result<PathBuf> {
    setup()?;
    // The musl target of the pinned toolchain; Debian's gcc links it (aya
    // needs no C library), so no musl-tools.
    let have = output("rustup", &["target", "list", "--installed", "--toolchain", TOOLCHAIN])
        .is_some_and(|s| s.lines().any(|l| l.trim() == MUSL));
    if !have {
        say(&format!("adding the {MUSL} target to Rust {TOOLCHAIN}"));
        sh(Command::new("rustup").args(["target", "add", MUSL, "--toolchain", TOOLCHAIN]))?;
    }
    // The dist profile (Cargo.toml): release, LTO, one codegen unit.
    sh(cargo().args([
        "build",
        "--profile",
        "dist",
        "--locked",
        "-p",
        "policer-user",
        "--bin",
        "policer",
        "--target",
        MUSL,
    ]))?;
    let target = target_dir();
    let bin = target.join(MUSL).join("dist/policer");
    let ldd = Command::new("ldd").arg(&bin).output().context("ldd")?;
    let ldd_says = format!("{}{}", String::from_utf8_lossy(&ldd.stdout), String::from_utf8_lossy(&ldd.stderr));
    if !ldd_says.contains("not a dynamic executable") && !ldd_says.contains("statically linked") {
        bail!("{} is not static: ldd says {ldd_says}", bin.display());
    }
    let out = target.join("dist");
    std::fs::create_dir_all(&out)?;
    let dist_bin = out.join("policer");
    std::fs::copy(&bin, &dist_bin).context("copy the static binary")?;
    // Shipped without its symbol table (as Debian ships binaries): a
    // quarter smaller, so the image stays under 10 MB. The XDP object it
    // carries is data, not symbols: untouched.
    sh(Command::new("strip").arg("--strip-all").arg(&dist_bin))?;
    let deb = build_deb(&dist_bin, &out)?;
    say(&format!("dist: {} and {}", out.join("policer").display(), deb.display()));
    Ok(deb)
}

/// Maintainer scripts. Every one is a no-op for systemd when `DPKG_ROOT`
/// is set (dpkg `--root` with `--force-script-chrootless`: an install into
/// another root, where the host's systemd has no business) or when systemd
/// is not running (a container, a chroot).
const POSTINST: &str = r#"#!/bin/sh
# policer postinst. The unit runs `policer attach --persist`: a restart
# leaves the XDP program attached and the new daemon adopts it (rules,
# buckets, counters), so an upgrade restarts a running policer instead of
# stopping it first; nothing is ever unpoliced. A first install enables
# the unit but starts nothing: review /etc/policer/policer.toml (its
# interfaces), then `systemctl start policer`.
set -e
[ -z "$DPKG_ROOT" ] || exit 0
[ -d /run/systemd/system ] || exit 0
if [ "$1" = configure ]; then
    systemctl daemon-reload || true
    if [ -z "$2" ]; then
        systemctl enable policer.service || true
        echo "policer: enabled, not started: check /etc/policer/policer.toml, then systemctl start policer"
    else
        # Only if it runs; with --persist the restart keeps enforcement.
        systemctl try-restart policer.service || true
    fi
fi
exit 0
"#;

const PRERM: &str = r#"#!/bin/sh
# policer prerm. On upgrade: nothing (postinst restarts the new binary,
# which adopts the attached program). On remove: stop the daemon, then
# detach what it left attached (--persist keeps the program on a stop).
set -e
[ -z "$DPKG_ROOT" ] || exit 0
if [ "$1" = remove ]; then
    if [ -d /run/systemd/system ]; then
        systemctl stop policer.service || true
    fi
    for iface in $(ip -o link show 2>/dev/null | awk -F': ' '/prog\/xdp|xdp/ {print $2}' | cut -d@ -f1); do
        # policer detach refuses a program that is not policer's.
        /usr/bin/policer detach "$iface" >/dev/null 2>&1 || true
    done
fi
exit 0
"#;

const POSTRM: &str = r#"#!/bin/sh
# policer postrm: forget the unit on removal; purge leaves no
# /etc/policer behind (dpkg removes the conffile itself), nor an
# /etc/fail2ban made only for policer's action (fail2ban's own, with its
# files, is not empty and stays).
set -e
if [ "$1" = purge ]; then
    rmdir "$DPKG_ROOT/etc/policer" 2>/dev/null || true
    rmdir "$DPKG_ROOT/etc/fail2ban/action.d" "$DPKG_ROOT/etc/fail2ban" 2>/dev/null || true
fi
[ -z "$DPKG_ROOT" ] || exit 0
if [ -d /run/systemd/system ]; then
    if [ "$1" = remove ] || [ "$1" = purge ]; then
        systemctl disable policer.service >/dev/null 2>&1 || true
        systemctl daemon-reload || true
    fi
fi
exit 0
"#;

/// Where the package puts fail2ban's policer action.
const FAIL2BAN_ACTION: &str = "etc/fail2ban/action.d/policer.conf";

/// The Debian package, staged in `out/deb` and built with `dpkg-deb`.
fn build_deb(bin: &Path, out: &Path) -> Result<PathBuf> {
    let stage = out.join("deb");
    if stage.exists() {
        std::fs::remove_dir_all(&stage)?;
    }
    let put = |rel: &str, data: &[u8], mode: u32| -> Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let p = stage.join(rel);
        std::fs::create_dir_all(p.parent().expect("a directory"))?;
        std::fs::write(&p, data).with_context(|| format!("write {}", p.display()))?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    let ws = workspace();
    put("usr/bin/policer", &std::fs::read(bin)?, 0o755)?;
    // The XDP object the binary carries, as a file for libbpf tools
    // (bpftool, xdp-loader): written by the binary itself.
    let object = stage.join("usr/lib/policer/policer.bpf.o");
    std::fs::create_dir_all(object.parent().expect("a directory"))?;
    sh(Command::new(bin).arg("object").arg("--write").arg(&object))?;
    // The repository's unit runs the `cargo xtask install` binary; the
    // package's runs its own.
    let unit = std::fs::read_to_string(ws.join("deploy/policer.service"))?;
    if !unit.contains("/usr/local/bin/policer") {
        bail!("deploy/policer.service no longer runs /usr/local/bin/policer: update xtask dist");
    }
    let unit = unit
        .replace(
            "Install the binary with `cargo xtask install`\n# (/usr/local/bin/policer), put",
            "Installed by the policer Debian package. Put",
        )
        .replace("/usr/local/bin/policer", "/usr/bin/policer");
    put("lib/systemd/system/policer.service", unit.as_bytes(), 0o644)?;
    put("etc/policer/policer.toml", &std::fs::read(ws.join("deploy/policer.toml"))?, 0o644)?;
    // fail2ban's action, where fail2ban looks for actions: a jail's
    // `action = policer` works as installed (a conffile, so an operator's
    // edits survive upgrades). Harmless without fail2ban.
    put(FAIL2BAN_ACTION, &std::fs::read(ws.join("deploy/fail2ban/action.d/policer.conf"))?, 0o644)?;
    // Man pages (gzipped, as Debian ships them) and completions, generated
    // by the binary itself.
    let man = stage.join("usr/share/man/man8");
    sh(Command::new(bin).arg("man").arg("--out").arg(&man))?;
    // policer.toml(5) in section 5.
    let man5 = stage.join("usr/share/man/man5");
    std::fs::create_dir_all(&man5)?;
    std::fs::rename(man.join("policer.toml.5"), man5.join("policer.toml.5"))?;
    for dir in [&man, &man5] {
        for e in std::fs::read_dir(dir)? {
            sh(Command::new("gzip").args(["-9n"]).arg(e?.path()))?;
        }
    }
    for (shell, path) in [
        ("bash", "usr/share/bash-completion/completions/policer"),
        ("zsh", "usr/share/zsh/vendor-completions/_policer"),
        ("fish", "usr/share/fish/vendor_completions.d/policer.fish"),
    ] {
        let o = Command::new(bin).args(["completions", shell]).output().context("policer completions")?;
        if !o.status.success() {
            bail!("policer completions {shell} failed");
        }
        put(path, &o.stdout, 0o644)?;
    }
    // The operator's manual and the design notes.
    put("usr/share/doc/policer/README.md", &std::fs::read(ws.join("README.md"))?, 0o644)?;
    for e in std::fs::read_dir(ws.join("docs"))? {
        let p = e?.path();
        if p.extension().is_some_and(|x| x == "md") {
            let name = p.file_name().and_then(|n| n.to_str()).context("a UTF-8 file name")?;
            put(&format!("usr/share/doc/policer/docs/{name}"), &std::fs::read(&p)?, 0o644)?;
        }
    }
    // The alert rules and the dashboard, where Debian keeps examples: an
    // operator loads them into their own Prometheus and Grafana.
    for (from, to) in [
        ("deploy/prometheus/alerts.yaml", "usr/share/doc/policer/examples/prometheus-alerts.yaml"),
        ("deploy/grafana-dashboard.json", "usr/share/doc/policer/examples/grafana-dashboard.json"),
    ] {
        put(to, &std::fs::read(ws.join(from))?, 0o644)?;
    }
    put(
        "usr/share/doc/policer/copyright",
        b"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n\
          Upstream-Name: policer\n\nFiles: *\nLicense: MIT or Apache-2.0\n",
        0o644,
    )?;
    let size_kib = output("du", &["-sk", stage.to_str().context("a UTF-8 path")?])
        .and_then(|s| s.split_whitespace().next().and_then(|n| n.parse::<u64>().ok()))
        .unwrap_or(0);
    let control = format!(
        "Package: policer\n\
         Version: {VERSION}\n\
         Architecture: amd64\n\
         Maintainer: policer developers <policer@localhost>\n\
         Section: net\n\
         Priority: optional\n\
         Installed-Size: {size_kib}\n\
         Depends: iproute2\n\
         Suggests: fail2ban\n\
         Description: per-source packet-rate policer in XDP\n \
         policer attaches an XDP program that gives every source address its\n \
         own token bucket (GCRA) and drops what exceeds its rule's rate.\n \
         The binary is static (musl); the unit runs it with --persist, so a\n \
         restart or an upgrade keeps the program attached and policing.\n"
    );
    put("DEBIAN/control", control.as_bytes(), 0o644)?;
    put("DEBIAN/conffiles", format!("/etc/policer/policer.toml\n/{FAIL2BAN_ACTION}\n").as_bytes(), 0o644)?;
    put("DEBIAN/postinst", POSTINST.as_bytes(), 0o755)?;
    put("DEBIAN/prerm", PRERM.as_bytes(), 0o755)?;
    put("DEBIAN/postrm", POSTRM.as_bytes(), 0o755)?;
    let deb = out.join(format!("policer_{VERSION}_amd64.deb"));
    sh(Command::new("dpkg-deb").args(["--root-owner-group", "--build"]).arg(&stage).arg(&deb))?;
    Ok(deb)
}

/// What the fleet tests need: `kubernetes-validate` (PyPI; it bundles
/// the Kubernetes schemas, so validation is offline) in a venv under the
/// target directory.
fn setup_fleet_tools() -> Result<()> {
    // buildah builds the image; podman and runc run it (this VM's crun
    // rejects podman's hybrid cgroups, so the test asks for runc).
    let missing = missing_packages(&["buildah", "podman", "runc"]);
    if !missing.is_empty() && is_root() {
        apt_install(&missing)?;
    }
    let venv = target_dir().join("tools/venv");
    let kv = venv.join("bin/kubernetes-validate");
    if kv.exists() {
        return Ok(());
    }
    pip_venv(&venv, &["kubernetes-validate"])
}

/// A venv at `venv` (Debian's python3-venv installed first when missing)
/// with the PyPI packages `pkgs` installed into it.
fn pip_venv(venv: &Path, pkgs: &[&str]) -> Result<()> {
    let missing = missing_packages(&["python3-venv"]);
    if !missing.is_empty() {
        if !is_root() {
            bail!("missing packages {missing:?}: run as root, or `sudo apt-get install {}`", missing.join(" "));
        }
        apt_install(&missing)?;
    }
    say(&format!("installing {} (PyPI) into a venv", pkgs.join(", ")));
    // Debian's python3, not whatever `python3` a PATH finds first.
    sh(Command::new("/usr/bin/python3").args(["-m", "venv"]).arg(venv))?;
    sh(Command::new(venv.join("bin/pip")).args(["install", "-q"]).args(pkgs))
}

/// What the MMDB tests write their databases with (tests/tests/mmdb.rs):
/// PyPI's `mmdb-writer` and `netaddr`, pinned, in a venv under the target
/// directory (Debian ships no writer of MaxMind DB files). Idempotent.
fn setup_mmdb_tools() -> Result<()> {
    let venv = target_dir().join("tools/mmdb-venv");
    let ok = venv.join("lib").read_dir().ok().and_then(|mut d| d.next()).and_then(|e| e.ok()).is_some_and(|py| {
        py.path().join("site-packages/mmdb_writer").exists() && py.path().join("site-packages/netaddr").exists()
    });
    if ok {
        return Ok(());
    }
    pip_venv(&venv, &["mmdb-writer==0.2.7", "netaddr==1.3.0"])
}

/// What the feeds tests run (tests/tests/feeds.rs): fail2ban, the Debian
/// package (the tests start their own `fail2ban-server` with their own
/// config, socket and pid file), and CrowdSec's binaries, `crowdsec` and
/// `cscli`, taken from the Debian package without installing it (its
/// post-install registers with CrowdSec's online API, fails offline and
/// leaves dpkg half-configured): `apt-get download` and `dpkg-deb -x` into
/// `target/tools/crowdsec/`. Idempotent.
fn setup_feed_tools() -> Result<()> {
    let missing = missing_packages(&["fail2ban"]);
    if !missing.is_empty() {
        if !is_root() {
            bail!("missing packages {missing:?}: run as root, or `sudo apt-get install {}`", missing.join(" "));
        }
        say("installing fail2ban (the feeds tests run their own fail2ban-server)");
        apt_install(&missing)?;
        quiet_system_fail2ban()?;
    }
    unpack_deb("crowdsec", &["usr/bin/crowdsec", "usr/bin/cscli"])
}

/// What the observability tests run (tests/tests/alerts.rs): `promtool`
/// (checks and unit-tests deploy/prometheus/alerts.yaml) and `prometheus`
/// (scrapes a daemon, evaluates the alert rules and every dashboard query),
/// taken from Debian's `prometheus` package without installing it (its
/// post-install starts a system Prometheus on :9090). Idempotent.
fn setup_observe_tools() -> Result<()> {
    unpack_deb("prometheus", &["usr/bin/prometheus", "usr/bin/promtool"])
}

/// The files `want` of the Debian package `pkg`, unpacked (not installed)
/// into `target/tools/PKG/`: `apt-get download` and `dpkg-deb -x`.
/// Idempotent; an interrupted run leaves nothing taken for done.
fn unpack_deb(pkg: &str, want: &[&str]) -> Result<()> {
    let tools = target_dir().join("tools");
    let dir = tools.join(pkg);
    if want.iter().all(|f| dir.join(f).exists()) {
        return Ok(());
    }
    say(&format!("unpacking {want:?} from Debian's {pkg} package into target/tools/{pkg} (not installed)"));
    std::fs::create_dir_all(&tools)?;
    let prefix = format!("{pkg}_");
    let debs = |tools: &Path| -> Result<Vec<PathBuf>> {
        let mut v = Vec::new();
        for e in std::fs::read_dir(tools)? {
            let p = e?.path();
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.starts_with(&prefix) && name.ends_with(".deb") {
                v.push(p);
            }
        }
        Ok(v)
    };
    for old in debs(&tools)? {
        std::fs::remove_file(old)?;
    }
    let download = |tools: &Path| Command::new("apt-get").args(["download", "-q", pkg]).current_dir(tools).status();
    if !download(&tools).is_ok_and(|s| s.success()) {
        // A fresh machine may have no package lists yet.
        if is_root() {
            sh(Command::new("apt-get").args(["update", "-q"]))?;
        }
        if !download(&tools).is_ok_and(|s| s.success()) {
            bail!("`apt-get download {pkg}` failed (is `apt-get update` needed?)");
        }
    }
    let deb = match &debs(&tools)?[..] {
        [deb] => deb.clone(),
        other => bail!("expected one {pkg}_*.deb in {} after the download, found {other:?}", tools.display()),
    };
    // Unpacked beside, then renamed: an interrupted run leaves no
    // half-unpacked tree that the check above would take for done.
    let part = tools.join(format!("{pkg}.part"));
    if part.exists() {
        std::fs::remove_dir_all(&part)?;
    }
    sh(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&part))?;
    if let Some(f) = want.iter().find(|f| !part.join(f).exists()) {
        bail!("{} holds no {f}", deb.display());
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir)?;
    }
    std::fs::rename(&part, &dir)?;
    std::fs::remove_file(&deb)?;
    say(&format!("{pkg}'s binaries in {}", dir.join("usr/bin").display()));
    Ok(())
}

/// Installing fail2ban starts its system service where systemd runs (or
/// where its init script may run: no `policy-rc.d` forbids it), with the
/// sshd jail of Debian's defaults banning in the host's firewall. The tests
/// never use that service: a machine that had no fail2ban before `setup`
/// gets none running after it. An operator's own fail2ban (installed
/// before) is never touched.
fn quiet_system_fail2ban() -> Result<()> {
    if Path::new("/run/systemd/system").exists() {
        say("stopping and disabling the fail2ban service the package started (the tests run their own)");
        return sh(Command::new("systemctl").args(["disable", "--now", "fail2ban.service"]));
    }
    if Path::new("/run/fail2ban/fail2ban.sock").exists() {
        say("stopping the fail2ban server the package's init script started (the tests run their own)");
        sh(Command::new("fail2ban-client").arg("stop"))?;
        let _ = Command::new("update-rc.d").args(["fail2ban", "disable"]).output();
    }
    Ok(())
}

/// `cargo xtask image`: FROM scratch, the static binary and the default
/// config; no registry needed (buildah, Debian's package).
fn image() -> Result<()> {
    dist()?;
    if output("buildah", &["--version"]).is_none() {
        if !is_root() {
            bail!("buildah missing: run as root, or `sudo apt-get install buildah`");
        }
        apt_install(&["buildah"])?;
    }
    let bin = target_dir().join("dist/policer");
    let ws = workspace();
    let ctr = output("buildah", &["from", "scratch"]).context("buildah from scratch")?.trim().to_string();
    let built = (|| -> Result<()> {
        sh(Command::new("buildah").args(["copy", &ctr]).arg(&bin).arg("/usr/bin/policer"))?;
        sh(Command::new("buildah")
            .args(["copy", &ctr])
            .arg(ws.join("deploy/policer.toml"))
            .arg("/etc/policer/policer.toml"))?;
        sh(Command::new("buildah").args([
            "config",
            "--env",
            "PATH=/usr/bin",
            "--entrypoint",
            r#"["/usr/bin/policer"]"#,
            "--cmd",
            r#"["attach", "--config", "/etc/policer/policer.toml", "--persist"]"#,
            "--label",
            &format!("org.opencontainers.image.version={VERSION}"),
            "--label",
            "org.opencontainers.image.title=policer",
            &ctr,
        ]))?;
        sh(Command::new("buildah").args(["commit", "-q", &ctr, &format!("localhost/policer:{VERSION}")]))?;
        sh(Command::new("buildah").args(["tag", &format!("localhost/policer:{VERSION}"), "localhost/policer:latest"]))
    })();
    let _ = Command::new("buildah").args(["rm", &ctr]).output();
    built?;
    say(&format!("image: localhost/policer:{VERSION} and localhost/policer:latest"));
    Ok(())
}
