//! Tier 3, chain: policer and an unmodified xdp-filter on one interface
//! (docs/chain.md). Debian's xdp-tools object `xdpfilt_dny_udp.o` sits in
//! slot 0 of policer's chain with its maps pinned at /sys/fs/bpf/xdp-filter,
//! so the unmodified `xdp-filter port` and `xdp-filter status` drive and
//! read it. Real frames over veth, counted on the receiving side. The
//! daemon runs under `nsenter --net` (the host's mounts, so its pins and
//! xdp-filter's are the same bpffs: docs/platform.md); the CLI as a user
//! runs it.
//!
//! xdpfilt_dny_udp is xdp-filter's `--policy deny` program for UDP: the
//! ports `xdp-filter port` lists pass, every other UDP frame is dropped.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use policer_tests::{
    daemon::{Daemon, cli, fails_with, policer_bin, succeeds},
    frame::FrameSpec,
    netns::{Sandbox, ip_out},
    privileged, skip,
    traffic::{self, RunOptions, SpecFlow},
};

const XDPFILT: &str = "/usr/lib/x86_64-linux-gnu/bpf/xdpfilt_dny_udp.o";
const FILTER_PINS: &str = "/sys/fs/bpf/xdp-filter";
const RATE: f64 = 1000.0;
const BURST: f64 = 50.0;
const HEAVY: &str = "10.9.0.1";
const IN_PROFILE: &str = "10.9.0.2";
const DST: &str = "10.9.9.9";
const SECS: f64 = 3.0;

/// Whether the tools this tier drives are here (`cargo xtask setup`
/// installs them); says why not.
fn tools() -> bool {
    if !privileged("chain") {
        return false;
    }
    for (what, ok) in [
        ("xdp-filter (Debian xdp-tools)", which("xdp-filter")),
        ("bpftool", which("bpftool")),
        ("llvm-mc-22 (llvm-22)", which("llvm-mc-22")),
        (XDPFILT, Path::new(XDPFILT).exists()),
    ] {
        if !ok {
            skip(&format!("chain: skipped: {what} is missing; `cargo xtask setup` installs it"));
            return false;
        }
    }
    true
}

fn which(tool: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {tool}")]).output().is_ok_and(|o| o.status.success())
}

/// The pins this tier makes in the host's bpffs, removed at its end.
struct Pins(String);

impl Drop for Pins {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(FILTER_PINS);
        let _ = std::fs::remove_dir_all(format!("/sys/fs/bpf/policer/{}", self.0));
    }
}

fn sandbox() -> (Sandbox, Pins) {
    let sb = Sandbox::new("chain");
    let _ = std::fs::remove_dir_all(FILTER_PINS);
    let pins = Pins(sb.rx_if.clone());
    std::fs::write(&sb.config, format!("[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"{RATE}pps\"\nburst = {BURST}\n"))
        .unwrap();
    (sb, pins)
}

fn start(sb: &Sandbox) -> Daemon {
    let args = ["attach", sb.rx_if.as_str(), "--config", sb.config.as_str(), "--interval", "0", "--mode", "native"];
    match Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args) {
        Ok(d) => d,
        Err(e) => panic!("policer did not start ({}):\n{}\n{}", e.status, e.stdout, e.stderr),
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// The heavy source to UDP/9999 at 4× the rate; the in-profile one to
/// UDP/9999 and UDP/7777, 200 pps each.
fn flows() -> Vec<SpecFlow> {
    let to = |src: &str, port: u16, pps: f64| SpecFlow { spec: FrameSpec::udp_to(ip(src), ip(DST), 64, port), pps };
    vec![to(HEAVY, 9999, 4.0 * RATE), to(IN_PROFILE, 9999, 200.0), to(IN_PROFILE, 7777, 200.0)]
}

/// What arrived of each flow of [`flows`] in a run of [`SECS`] (and what
/// was sent).
fn run(sb: &Sandbox) -> (Vec<u64>, Vec<u64>) {
    let (sent, got) =
        traffic::run_specs(sb, &flows(), Duration::from_secs_f64(SECS), &RunOptions { ..Default::default() });
    assert_eq!(got.socket_drops, 0, "the receiving socket lost frames: counts cannot be trusted");
    (sent.sent, got.per_flow)
}

/// What the heavy source may get through policer in a run: its rate over
/// the run and its burst, with room for a loaded machine's pacing.
fn heavy_admitted_ok(arrived: u64, sent: u64) {
    let want = RATE * SECS + BURST;
    assert!(
        (arrived as f64) > 0.8 * want && (arrived as f64) < 1.2 * want,
        "heavy source: {arrived} of {sent} arrived, want about {want} (policer's rate): machine overloaded?"
    );
}

/// Both enforcing: the heavy source cut to its rate by policer; the
/// in-profile source's UDP/9999 (listed in xdp-filter) all arriving, its
/// UDP/7777 all dropped by xdp-filter.
fn both_enforce(sb: &Sandbox, when: &str) {
    let (sent, got) = run(sb);
    heavy_admitted_ok(got[0], sent[0]);
    assert_eq!(got[1], sent[1], "{when}: in-profile UDP/9999 (listed in xdp-filter) must all arrive");
    assert_eq!(got[2], 0, "{when}: in-profile UDP/7777 must all be dropped by xdp-filter ({} sent)", sent[2]);
}

/// xdp-filter's own counters (`xdp-filter status`): frames it dropped and
/// passed.
fn filter_counts() -> (u64, u64) {
    let out = Command::new("xdp-filter").arg("status").output().expect("xdp-filter status");
    let text = String::from_utf8_lossy(&out.stdout);
    let count = |action: &str| -> u64 {
        let line = text.lines().find(|l| l.trim_start().starts_with(action)).unwrap_or_else(|| panic!("{text}"));
        line.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
    };
    (count("XDP_DROP"), count("XDP_PASS"))
}

/// The chain counters of the interface, from `policer stats --json`.
fn chain_counts(sb: &Sandbox) -> (u64, u64, u64) {
    let out = succeeds(&cli(sb, &["stats", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let i = &v["interfaces"][0];
    let n = |k: &str| i[k].as_u64().unwrap_or_else(|| panic!("{k} in {i}"));
    (n("chain_handed_packets"), n("chain_empty_packets"), n("dropped_packets"))
}

fn xdp_filter(args: &[&str]) {
    let out = Command::new("xdp-filter").args(args).output().expect("xdp-filter");
    assert!(out.status.success(), "xdp-filter {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// The name of the XDP program on the sandbox's receiving interface.
fn hook_program(sb: &Sandbox) -> String {
    let out = ip_out(&["-n", &sb.rx_ns, "link", "show", &sb.rx_if]);
    out.split_whitespace().skip_while(|w| *w != "name").nth(1).unwrap_or_default().to_string()
}

#[test]
fn xdp_filter_behind_policer() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let mut d = start(&sb);
    let ls = succeeds(&cli(&sb, &["chain", "ls"]));
    assert!(ls.contains("empty"), "{ls}");
    let added = succeeds(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT, "--pin-maps", FILTER_PINS]));
    assert!(added.contains("slot 0") && added.contains("xdpfilt_dny_udp"), "{added}");
    assert!(Path::new(FILTER_PINS).join("filter_ports").exists(), "xdp-filter's maps pinned where it looks");
    let file = std::fs::read_to_string(&sb.config).unwrap();
    assert!(file.contains("[[chain]]") && file.contains(XDPFILT), "the table is written: {file}");
    // The unmodified xdp-filter drives the program in the chain.
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);

    // xdp-filter sees exactly what policer handed on: not the heavy
    // source's dropped frames.
    let (fd0, fp0) = filter_counts();
    let (h0, _, dropped0) = chain_counts(&sb);
    both_enforce(&sb, "policer and xdp-filter");
    let (fd1, fp1) = filter_counts();
    let (h1, _, dropped1) = chain_counts(&sb);
    assert!(dropped1 - dropped0 > 1000, "policer dropped the heavy source's excess");
    assert_eq!((fd1 - fd0) + (fp1 - fp0), h1 - h0, "xdp-filter counted exactly the frames policer handed on");
    let ls = succeeds(&cli(&sb, &["chain", "ls", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(v[0]["slots"][0]["name"], "xdpfilt_dny_udp", "{ls}");
    assert_eq!(v[0]["slots"][0]["from"], XDPFILT, "{ls}");

    // kill -9 of the daemon: the hook (netlink) and the chain (pinned)
    // keep enforcing.
    d.stop_with(libc::SIGKILL);
    both_enforce(&sb, "after kill -9 of the daemon");

    // A restart adopts the program and keeps the chain as it runs.
    let mut d = start(&sb);
    assert!(d.stdout().contains("keeping program"), "the chain adopted: {}", d.stdout());
    both_enforce(&sb, "after the restart");

    // detach refuses while the chain holds a program, and names it.
    fails_with(&cli(&sb, &["detach", &sb.rx_if]), "xdpfilt_dny_udp");
    assert_eq!(hook_program(&sb), "policer");
    // --hand-over: xdp-filter's program alone on the interface, enforcing.
    let said = succeeds(&cli(&sb, &["detach", &sb.rx_if, "--hand-over"]));
    assert!(said.contains("handed"), "{said}");
    assert_eq!(hook_program(&sb), "xdpfilt_dny_udp", "xdp-filter's program in policer's place");
    // No interface left: the daemon leaves.
    let t0 = std::time::Instant::now();
    while d.try_wait().is_none() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (sent, got) = run(&sb);
    assert_eq!(got[0], sent[0], "policer gone: the heavy source all arrives");
    assert_eq!(got[2], 0, "xdp-filter alone still drops UDP/7777");
    let _ = Command::new("ip").args(["-n", &sb.rx_ns, "link", "set", "dev", &sb.rx_if, "xdp", "off"]).status();
}

#[test]
fn chain_rm_takes_the_program_out() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    succeeds(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT, "--pin-maps", FILTER_PINS, "--slot", "3"]));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    both_enforce(&sb, "in slot 3");
    let said = succeeds(&cli(&sb, &["chain", "rm", &sb.rx_if, "--slot", "3"]));
    assert!(said.contains("removed"), "{said}");
    assert!(!std::fs::read_to_string(&sb.config).unwrap().contains("[[chain]]"), "the table is gone");
    let (sent, got) = run(&sb);
    heavy_admitted_ok(got[0], sent[0]);
    assert_eq!((got[1], got[2]), (sent[1], sent[2]), "chain rm: UDP/7777 arrives again");
    let (h, e, _) = chain_counts(&sb);
    assert!(e > 0 && h > 0, "counted handed while it held one, then passed with it empty: {h} {e}");
    // Detach with an empty chain is as before.
    succeeds(&cli(&sb, &["detach", &sb.rx_if]));
}

/// Assembles a one-instruction program (`r0 = 2; exit`) in `section`.
fn object(dir: &Path, name: &str, section: &str) -> PathBuf {
    let src = dir.join(format!("{name}.s"));
    let obj = dir.join(format!("{name}.o"));
    std::fs::write(
        &src,
        format!(
            "\t.section \"{section}\",\"ax\",@progbits\n\t.globl {name}\n\t.type {name},@function\n{name}:\n\
             \tr0 = 2\n\texit\n\t.size {name}, .-{name}\n\t.section license,\"aw\",@progbits\n\t.asciz \"GPL\"\n"
        ),
    )
    .unwrap();
    let ok = Command::new("llvm-mc-22")
        .args(["-triple", "bpfel", "-filetype=obj"])
        .arg(&src)
        .arg("-o")
        .arg(&obj)
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "llvm-mc-22 {}", src.display());
    obj
}

#[test]
fn objects_that_cannot_join_are_refused() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    let dir = tempdir();
    let frags = object(&dir, "pass_frags", "xdp.frags");
    let socket = object(&dir, "socket_prog", "socket");
    let before = std::fs::read(&sb.config).unwrap();
    let add = |obj: &Path, extra: &[&str]| {
        let mut args = vec!["chain", "add", sb.rx_if.as_str(), obj.to_str().unwrap()];
        args.extend_from_slice(extra);
        cli(&sb, &args)
    };
    fails_with(&add(&frags, &[]), "xdp.frags");
    fails_with(&add(&socket, &[]), "not an XDP program");
    // pin-by-name maps somewhere that is not a bpffs.
    fails_with(&add(Path::new(XDPFILT), &["--pin-maps", dir.to_str().unwrap()]), "not in a bpffs");
    fails_with(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT, "--slot", "8"]), "slots 0 to 7");
    // Nothing changed: the chain is empty, the file as it was.
    let ls = succeeds(&cli(&sb, &["chain", "ls", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(v[0]["slots"].as_array().map(Vec::len), Some(0), "{ls}");
    assert_eq!(std::fs::read(&sb.config).unwrap(), before, "the config file is unchanged");
    // The plain program of section "xdp" joins.
    let pass = object(&dir, "pass_plain", "xdp");
    let said = succeeds(&add(&pass, &[]));
    assert!(said.contains("slot 0"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("policer-chain-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}
