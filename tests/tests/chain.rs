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
const XDPFILT_ALW: &str = "/usr/lib/x86_64-linux-gnu/bpf/xdpfilt_alw_udp.o";
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
    // The host's bpffs, where the tests pin before any daemon runs (a bare
    // VM's init mounts none; the daemon mounts it the same way).
    policer_user::chain::ensure_bpffs().expect("mounting a bpffs at /sys/fs/bpf");
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
    start_with(sb, &[])
}

/// `policer attach` of the sandbox's interface with `extra` arguments,
/// under nsenter (the host's bpffs).
fn try_start(bin: &Path, sb: &Sandbox, extra: &[&str]) -> Result<Daemon, policer_tests::daemon::Exited> {
    try_start_env(bin, sb, extra, &[])
}

/// [`try_start`] with extra environment variables (the test hooks).
fn try_start_env(
    bin: &Path,
    sb: &Sandbox,
    extra: &[&str],
    envs: &[(&str, &str)],
) -> Result<Daemon, policer_tests::daemon::Exited> {
    let mut args = vec!["attach", sb.rx_if.as_str(), "--config", sb.config.as_str(), "--interval", "0"];
    if !extra.contains(&"--join") {
        args.extend_from_slice(&["--mode", "native"]);
    }
    args.extend_from_slice(extra);
    Daemon::try_start_nsenter(bin, &sb.rx_ns, &args, envs)
}

fn start_with(sb: &Sandbox, extra: &[&str]) -> Daemon {
    match try_start(&policer_bin(), sb, extra) {
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
    run_for(sb, SECS)
}

/// [`run`] for `secs` seconds.
fn run_for(sb: &Sandbox, secs: f64) -> (Vec<u64>, Vec<u64>) {
    let (sent, got) =
        traffic::run_specs(sb, &flows(), Duration::from_secs_f64(secs), &RunOptions { ..Default::default() });
    assert_eq!(got.socket_drops, 0, "the receiving socket lost frames: counts cannot be trusted");
    (sent.sent, got.per_flow)
}

/// What the heavy source may get through policer in a run: its rate over
/// the run and its burst, with room for a loaded machine's pacing.
fn heavy_admitted_ok(arrived: u64, sent: u64) {
    heavy_admitted_ok_for(arrived, sent, SECS);
}

/// [`heavy_admitted_ok`] for a run of `secs` seconds.
fn heavy_admitted_ok_for(arrived: u64, sent: u64, secs: f64) {
    let want = RATE * secs + BURST;
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

/// A directory of this test's own in the host's bpffs, removed on drop.
struct BpfDir(PathBuf);

impl BpfDir {
    fn new(tag: &str) -> BpfDir {
        let d = PathBuf::from(format!("/sys/fs/bpf/policer-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        BpfDir(d)
    }
}

impl Drop for BpfDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The Katran-style root of the tests' own (tests/src/root.rs), pinned
/// under `dir` and attached to the sandbox's interface (native mode).
fn attach_root(sb: &Sandbox, dir: &Path) -> policer_tests::root::Root {
    use std::os::fd::AsRawFd;
    let root = policer_tests::root::Root::create(dir).expect("make the root");
    let (ns, ifc, fd) = (sb.rx_ns.clone(), sb.rx_if.clone(), root.prog.as_raw_fd());
    std::thread::spawn(move || {
        policer_tests::netns::enter(&ns).unwrap();
        let idx = policer_user::loader::if_index(&ifc).unwrap();
        policer_user::netlink::set(idx, fd, policer_user::netlink::XDP_FLAGS_DRV_MODE, None).expect("attach the root");
    })
    .join()
    .unwrap();
    root
}

/// The program ids in the slots of the array pinned at `path` (bpftool's
/// view).
fn slot_ids(path: &Path) -> Vec<(u32, u32)> {
    let out = Command::new("bpftool").args(["-j", "map", "dump", "pinned"]).arg(path).output().expect("bpftool");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut ids = Vec::new();
    for e in v.as_array().into_iter().flatten() {
        let word = |k: &str| -> u32 {
            let bytes: Vec<u8> = e[k]
                .as_array()
                .map(|a| {
                    a.iter().filter_map(|b| u8::from_str_radix(b.as_str()?.trim_start_matches("0x"), 16).ok()).collect()
                })
                .unwrap_or_default();
            bytes.get(..4).map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        ids.push((word("key"), word("value")));
    }
    ids
}

/// Loads the unmodified xdp-filter object `obj` with aya (its maps pinned
/// by name under FILTER_PINS, where `xdp-filter` looks) and pins its
/// program at `at`, for a root's tool to put in a slot.
fn load_filter(obj: &str, program: &str, at: &Path) {
    std::fs::create_dir_all(FILTER_PINS).unwrap();
    let mut ebpf = aya::EbpfLoader::new()
        .default_map_pin_directory(Path::new(FILTER_PINS))
        .load_file(obj)
        .expect("load xdp-filter");
    let prog: &mut aya::programs::Xdp = ebpf.program_mut(program).unwrap().try_into().unwrap();
    prog.load().expect("xdp-filter's program loads");
    prog.pin(at).expect("pin xdp-filter's program");
}

fn bpftool_put(array: &Path, slot: u32, prog: &Path) {
    let out = Command::new("bpftool")
        .args(["map", "update", "pinned"])
        .arg(array)
        .arg("key")
        .args(slot.to_le_bytes().map(|b| b.to_string()))
        .args(["value", "pinned"])
        .arg(prog)
        .output()
        .expect("bpftool");
    assert!(out.status.success(), "bpftool map update: {}", String::from_utf8_lossy(&out.stderr));
}

/// Member mode: a root of the tests' own owns the hook; policer joins its
/// array in slot 1 (`attach --join`) and polices through it, xdp-filter in
/// slot 2 behind policer. Refusals first: nothing changes.
#[test]
fn policer_joins_a_katran_style_root() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let dir = BpfDir::new("root");
    let _root = attach_root(&sb, &dir.0);
    let root_id = sb.rx_xdp().expect("the root is attached");
    let progs = dir.0.join("progs");
    let progs_s = progs.to_str().unwrap();
    let before = std::fs::read(&sb.config).unwrap();

    // Refused, and nothing changes: the hook, the slots, the file.
    let not_bpffs = tempdir().join("progs");
    std::fs::write(&not_bpffs, "").unwrap();
    policer_tests::root::pin_plain_array(&dir.0.join("plain")).unwrap();
    let occupant = policer_tests::root::load_pass("occupant").unwrap();
    {
        use std::os::fd::AsRawFd;
        policer_tests::root::put(_root.array.as_raw_fd(), 3, occupant.as_raw_fd()).unwrap();
    }
    let slots_before = slot_ids(&progs);
    let (plain, root_pin) = (dir.0.join("plain"), dir.0.join("root"));
    let refused: [(&[&str], &str); 5] = [
        (&["--join", not_bpffs.to_str().unwrap(), "--slot", "1"], "not in a bpffs"),
        (&["--join", plain.to_str().unwrap(), "--slot", "1"], "not a program array"),
        (&["--join", root_pin.to_str().unwrap(), "--slot", "1"], "not a map"),
        (&["--join", progs_s, "--slot", "8"], "slots 0 to 7"),
        (&["--join", progs_s, "--slot", "3"], "is taken by"),
    ];
    for (args, why) in refused {
        match try_start(&policer_bin(), &sb, args) {
            Ok(_) => panic!("attach {args:?} started"),
            Err(e) => assert!(e.stderr.contains(why), "attach {args:?}: want '{why}' in:\n{}", e.stderr),
        }
        assert_eq!(sb.rx_xdp().as_deref(), Some(root_id.as_str()), "the root stays on the hook");
        assert_eq!(slot_ids(&progs), slots_before, "the root's slots are unchanged");
        assert_eq!(std::fs::read(&sb.config).unwrap(), before, "the config file is unchanged");
    }
    drop(occupant);
    let _ = Command::new("bpftool").args(["map", "delete", "pinned", progs_s, "key", "3", "0", "0", "0"]).status();

    // Joined: the root keeps the hook, policer is in slot 1.
    let mut d = start_with(&sb, &["--join", progs_s, "--slot", "1"]);
    assert!(d.stdout().contains("joined slot 1"), "{}", d.stdout());
    assert_eq!(sb.rx_xdp().as_deref(), Some(root_id.as_str()), "the root keeps the hook");
    let held = slot_ids(&progs);
    assert_eq!(held.len(), 1, "{held:?}");
    let info = policer_user::chain::program_info(held[0].1).expect("policer's program");
    assert_eq!((held[0].0, info.name_as_str()), (1, Some("policer")));
    // xdp-filter's deny program behind policer, put there by the root's
    // tool (bpftool): policer hands it what it passes.
    load_filter(XDPFILT, "xdpfilt_dny_udp", &dir.0.join("filter"));
    bpftool_put(&progs, 2, &dir.0.join("filter"));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    let ls = succeeds(&cli(&sb, &["chain", "ls", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(v[0]["slots"][0]["slot"], 2, "{ls}");
    assert_eq!(v[0]["slots"][0]["name"], "xdpfilt_dny_udp", "{ls}");
    both_enforce(&sb, "policer in the root's slot 1, xdp-filter in slot 2");
    fails_with(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT]), "member mode");

    // detach: policer's slot is emptied, nothing else; the root and
    // xdp-filter keep running.
    let said = succeeds(&cli(&sb, &["detach", &sb.rx_if]));
    assert!(said.contains("left slot 1"), "{said}");
    let t0 = std::time::Instant::now();
    while d.try_wait().is_none() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let held = slot_ids(&progs);
    assert_eq!(held.iter().map(|h| h.0).collect::<Vec<_>>(), [2], "only xdp-filter's slot is left: {held:?}");
    assert_eq!(sb.rx_xdp().as_deref(), Some(root_id.as_str()), "the root keeps the hook");
    let (sent, got) = run(&sb);
    assert_eq!(got[0], sent[0], "policer gone: the heavy source all arrives");
    assert_eq!(got[2], 0, "xdp-filter behind the root still drops UDP/7777");
}

/// Member mode through a crash: `kill -9` of the daemon joined to a root
/// leaves policer's program in the root's slot and xdp-filter's behind it,
/// both enforcing on real traffic; a restart with the same `--join`
/// adopts the slot (the program's maps) and puts its new program there in
/// one map update, xdp-filter's slot untouched.
#[test]
fn kill_9_of_a_member_keeps_enforcing_and_a_restart_adopts_its_slot() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let dir = BpfDir::new("member");
    let _root = attach_root(&sb, &dir.0);
    let root_id = sb.rx_xdp().expect("the root is attached");
    let progs = dir.0.join("progs");
    let join = ["--join", progs.to_str().unwrap(), "--slot", "1"];
    let mut d = start_with(&sb, &join);
    load_filter(XDPFILT, "xdpfilt_dny_udp", &dir.0.join("filter"));
    bpftool_put(&progs, 2, &dir.0.join("filter"));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    both_enforce(&sb, "a member, before kill -9");
    let held = slot_ids(&progs);
    assert_eq!(held.iter().map(|h| h.0).collect::<Vec<_>>(), [1, 2], "{held:?}");
    let (policer_id, filter_id) = (held[0].1, held[1].1);

    d.stop_with(libc::SIGKILL);
    assert_eq!(slot_ids(&progs), held, "kill -9 leaves policer in slot 1 and xdp-filter in slot 2");
    both_enforce(&sb, "after kill -9 of the member's daemon");

    let d = start_with(&sb, &join);
    let said = d.stdout();
    assert!(said.contains(&format!("adopting the policer already running (program {policer_id})")), "{said}");
    assert!(said.contains(&format!("replaced program {policer_id} in")), "{said}");
    let after = slot_ids(&progs);
    assert_eq!(after.iter().map(|h| h.0).collect::<Vec<_>>(), [1, 2], "{after:?}");
    assert_ne!(after[0].1, policer_id, "the restart's program in slot 1");
    let info = policer_user::chain::program_info(after[0].1).expect("policer's program");
    assert_eq!(info.name_as_str(), Some("policer"));
    assert_eq!(after[1].1, filter_id, "xdp-filter's program stays in slot 2");
    assert_eq!(sb.rx_xdp().as_deref(), Some(root_id.as_str()), "the root keeps the hook");
    both_enforce(&sb, "after the member's restart");
    let said = succeeds(&cli(&sb, &["detach", &sb.rx_if]));
    assert!(said.contains("left slot 1"), "{said}");
}

/// The object as a file attached by libxdp's loader, unmodified Debian
/// xdp-tools: `xdp-loader load -m skb IFACE FILE`. This kernel refuses
/// libxdp's dispatcher (freplace), so libxdp falls back to attaching the
/// one program; it runs: with no rules every frame passes (unmatched) and
/// its own counters count them.
#[test]
fn xdp_loader_attaches_the_object_file() {
    if !tools() {
        return;
    }
    let dir = tempdir();
    let object = dir.join("policer-xdp-loader.bpf.o");
    let out = Command::new(policer_bin()).args(["object", "--write"]).arg(&object).output().unwrap();
    assert!(out.status.success(), "policer object: {}", String::from_utf8_lossy(&out.stderr));
    let (sb, _pins) = sandbox();
    // Under nsenter --net: the host's bpffs, where libxdp looks first.
    let loader = |args: &[&str]| {
        let out = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", sb.rx_ns))
            .arg("xdp-loader")
            .args(args)
            .output()
            .expect("xdp-loader");
        (
            out.status.success(),
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)),
        )
    };
    let (ok, said) = loader(&["load", "-v", "-m", "skb", &sb.rx_if, object.to_str().unwrap()]);
    assert!(ok, "xdp-loader load: {said}");
    assert!(said.contains("Falling back to loading single prog"), "libxdp's fallback to the one program: {said}");
    assert_eq!(hook_program(&sb), "policer", "policer's program alone on the hook");
    let (ok, status) = loader(&["status", &sb.rx_if]);
    assert!(ok && status.contains("policer") && status.contains("skb"), "xdp-loader status: {status}");
    let id: u32 = sb.rx_xdp().expect("attached").parse().unwrap();
    let before = policer_tests::kstate::read(id).counters;
    let (sent, got) = run(&sb);
    assert_eq!(got, sent, "no rules: every frame passes");
    let after = policer_tests::kstate::read(id).counters;
    let counted = after.unmatched_pkts - before.unmatched_pkts;
    assert!(counted >= sent.iter().sum::<u64>(), "the program counted {counted} unmatched frames of {sent:?} sent");
    let (ok, said) = loader(&["unload", &sb.rx_if, "--all"]);
    assert!(ok, "xdp-loader unload: {said}");
    assert!(sb.rx_xdp().is_none(), "unloaded");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `policer ARGS` of binary `bin` in the sandbox's namespace, as a user
/// runs it.
fn cli_bin(bin: &Path, sb: &Sandbox, args: &[&str]) -> std::process::Output {
    Command::new("ip").args(["netns", "exec", &sb.rx_ns]).arg(bin).args(args).output().expect("run policer")
}

/// The program id in `slot` of the chain pinned for the interface.
fn chain_slot(sb: &Sandbox, slot: u32) -> Option<u32> {
    slot_ids(&policer_common::chain::pin_path(&sb.rx_if)).into_iter().find(|s| s.0 == slot).map(|s| s.1)
}

/// `detach --force` with a program in the chain: policer leaves the
/// interface, the chain is emptied, its pin goes, the tables leave the
/// file; every frame arrives (nothing is on the hook).
#[test]
fn detach_force_empties_the_chain() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let mut d = start(&sb);
    succeeds(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT, "--pin-maps", FILTER_PINS]));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    both_enforce(&sb, "before detach --force");
    fails_with(&cli(&sb, &["detach", &sb.rx_if]), "xdpfilt_dny_udp");
    let said = succeeds(&cli(&sb, &["detach", &sb.rx_if, "--force"]));
    assert!(said.contains("emptied") && said.contains("xdpfilt_dny_udp"), "{said}");
    let t0 = std::time::Instant::now();
    while d.try_wait().is_none() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(sb.rx_xdp().is_none(), "nothing on the hook");
    let pin = policer_common::chain::pin_path(&sb.rx_if);
    assert!(!pin.parent().unwrap().exists(), "the chain's pin directory is removed: {}", pin.display());
    assert!(!std::fs::read_to_string(&sb.config).unwrap().contains("[[chain]]"), "the tables are gone");
    let (sent, got) = run(&sb);
    assert_eq!(got, sent, "policer and the chain gone: every frame arrives");
}

/// A plain detach with an empty chain removes the chain's pin directory.
#[test]
fn detach_with_an_empty_chain_removes_its_pin() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    let pin = policer_common::chain::pin_path(&sb.rx_if);
    assert!(pin.exists(), "pinned at attach: {}", pin.display());
    succeeds(&cli(&sb, &["detach", &sb.rx_if]));
    assert!(!pin.parent().unwrap().exists(), "the pin directory is removed: {}", pin.display());
}

/// A program another tool puts in the pinned chain (`bpftool map update
/// pinned …/chain key 0 0 0 0 value pinned PROG`, Katran's way) runs
/// behind policer and is listed by `chain ls` as from outside policer.
#[test]
fn a_program_bpftool_puts_in_the_chain_joins() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    let dir = BpfDir::new("bpftool");
    std::fs::create_dir_all(&dir.0).unwrap();
    load_filter(XDPFILT, "xdpfilt_dny_udp", &dir.0.join("filter"));
    bpftool_put(&policer_common::chain::pin_path(&sb.rx_if), 0, &dir.0.join("filter"));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    let ls = succeeds(&cli(&sb, &["chain", "ls", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(v[0]["slots"][0]["name"], "xdpfilt_dny_udp", "{ls}");
    assert!(v[0]["slots"][0]["from"].as_str().unwrap_or_default().contains("outside policer"), "{ls}");
    both_enforce(&sb, "a program bpftool put in slot 0");
}

/// xdp-filter's allow-policy program (`xdpfilt_alw_udp.o`, unmodified:
/// the ports `xdp-filter port` lists are dropped, the rest pass), its maps
/// pinned where xdp-filter pins them: UDP/7777 listed and dropped behind
/// policer, UDP/9999 arriving, the heavy source cut by policer; counted on
/// the receiving side, and xdp-filter counts what policer handed on.
#[test]
fn xdp_filter_allow_policy_behind_policer() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    let added = succeeds(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT_ALW, "--pin-maps", FILTER_PINS]));
    assert!(added.contains("xdpfilt_alw_udp"), "{added}");
    xdp_filter(&["port", "7777", "--mode", "dst", "--proto", "udp"]);
    let (fd0, fp0) = filter_counts();
    let (h0, _, dropped0) = chain_counts(&sb);
    both_enforce(&sb, "xdpfilt_alw_udp listing UDP/7777");
    let (fd1, fp1) = filter_counts();
    let (h1, _, dropped1) = chain_counts(&sb);
    assert!(dropped1 - dropped0 > 1000, "policer dropped the heavy source's excess");
    assert_eq!((fd1 - fd0) + (fp1 - fp0), h1 - h0, "xdp-filter counted exactly the frames policer handed on");
}

/// An upgrade from an older build (POLICER_OLD_BIN, with the chain):
/// [`upgrade_keeps_the_chain`] with that build as the old one. Runs where
/// one is given; CI, which has only this build, runs the two upgrades
/// below.
#[test]
fn an_upgrade_keeps_the_chain() {
    if !tools() {
        return;
    }
    let Some(old) = std::env::var_os("POLICER_OLD_BIN").map(PathBuf::from) else {
        eprintln!(
            "chain: the upgrade from an older build not run: set POLICER_OLD_BIN to an older policer build with \
             the chain (the upgrades of this build over itself and over another layout run without it)"
        );
        return;
    };
    upgrade_keeps_the_chain(&old, &[], "an older build");
}

/// An upgrade as every start over a running policer makes it, this build
/// over a program of its own layout: the new program is loaded with the
/// running one's maps and the pinned chain, and replaces it on the hook
/// (`XDP_FLAGS_REPLACE`). The same mechanism as an upgrade from an older
/// build of the same layout: no older build needed.
#[test]
fn an_upgrade_over_the_same_layout_keeps_the_chain() {
    if !tools() {
        return;
    }
    upgrade_keeps_the_chain(&policer_bin(), &[], "the same layout");
}

/// An upgrade over a program of another layout: this build plays the
/// older one (its program stamped with the layout version before this
/// one's, the test hook lifecycle's layout tests use); the new program
/// takes fresh maps but the same pinned chain, and replaces the old one
/// (`XDP_FLAGS_REPLACE`).
#[test]
fn an_upgrade_over_another_layout_keeps_the_chain() {
    if !tools() {
        return;
    }
    let older = (policer_common::LAYOUT_VERSION - 1).to_string();
    upgrade_keeps_the_chain(&policer_bin(), &[("POLICER_TEST_LAYOUT_VERSION", &older)], "another layout");
}

/// Seconds of traffic across an upgrade; the new daemon starts after
/// [`UPGRADE_AFTER`] of them.
const UPGRADE_SECS: f64 = 8.0;
const UPGRADE_AFTER: Duration = Duration::from_millis(1500);

/// An upgrade: `old` (another build, or this one with the test hooks
/// `envs`) runs with xdp-filter in its chain and exits leaving it policing
/// (--persist, as the package's unit runs it); this build starts while
/// traffic flows and takes over: a new program replaces the old one on
/// the hook (XDP_FLAGS_REPLACE), the chain's program stays in its slot,
/// and through the whole run no frame passed unchained (UDP/7777: none
/// arrives) or unpoliced (the heavy source: its rate).
fn upgrade_keeps_the_chain(old: &Path, envs: &[(&str, &str)], what: &str) {
    let (sb, _pins) = sandbox();
    let mut d = match try_start_env(old, &sb, &["--persist"], envs) {
        Ok(d) => d,
        Err(e) => panic!("the old policer ({what}) did not start ({}):\n{}\n{}", e.status, e.stdout, e.stderr),
    };
    let added = cli_bin(old, &sb, &["chain", "add", &sb.rx_if, XDPFILT, "--pin-maps", FILTER_PINS]);
    assert!(added.status.success(), "old chain add: {}", String::from_utf8_lossy(&added.stderr));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    both_enforce(&sb, &format!("the old program ({what})"));
    let member = chain_slot(&sb, 0).expect("xdp-filter in slot 0");
    let old_id = sb.rx_xdp().expect("the old program on the hook");
    assert!(d.stop_with(libc::SIGTERM), "the old daemon exits");
    assert_eq!(chain_slot(&sb, 0), Some(member), "a --persist exit keeps the chain");
    assert_eq!(sb.rx_xdp().as_deref(), Some(old_id.as_str()), "a --persist exit keeps the program");

    let (d, (sent, got)) = std::thread::scope(|s| {
        let traffic = s.spawn(|| run_for(&sb, UPGRADE_SECS));
        std::thread::sleep(UPGRADE_AFTER);
        let d = start(&sb);
        (d, traffic.join().expect("the traffic"))
    });
    let said = d.stdout();
    assert!(said.contains(&format!("replaced program {old_id} on {}", sb.rx_if)), "{what}: {said}");
    assert!(said.contains("keeping program"), "{what}: the chain is kept: {said}");
    if !envs.is_empty() {
        // The program of another layout is replaced, not adopted.
        assert!(said.contains(&format!("replacing policer program {old_id} of")), "{what}: {said}");
    }
    let new_id = sb.rx_xdp().expect("a program on the hook");
    assert_ne!(new_id, old_id, "{what}: a new program on the hook");
    assert_eq!(hook_program(&sb), "policer");
    assert_eq!(chain_slot(&sb, 0), Some(member), "{what}: the same program in slot 0 after the upgrade");
    // Across the replace: never unchained, never unpoliced.
    assert_eq!(got[2], 0, "{what}: UDP/7777 arrived during the upgrade: the chain was skipped ({} sent)", sent[2]);
    assert_eq!(got[1], sent[1], "{what}: in-profile UDP/9999 must all arrive during the upgrade");
    heavy_admitted_ok_for(got[0], sent[0], UPGRADE_SECS);
    both_enforce(&sb, &format!("after the upgrade over {what}"));
    let ls = succeeds(&cli(&sb, &["chain", "ls", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(v[0]["slots"][0]["program_id"], member, "{ls}");
}

/// A `[[chain]]` table deleted from the file by hand: the reload empties
/// its slot and says so.
#[test]
fn a_table_deleted_by_hand_empties_its_slot_at_reload() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    succeeds(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT, "--pin-maps", FILTER_PINS, "--slot", "2"]));
    assert!(chain_slot(&sb, 2).is_some());
    let text = std::fs::read_to_string(&sb.config).unwrap();
    let at = text.find("[[chain]]").expect("the table");
    std::fs::write(&sb.config, &text[..at]).unwrap();
    let said = succeeds(&cli(&sb, &["reload"]));
    assert!(said.contains("emptied slot 2") && said.contains("gone from the file"), "{said}");
    assert_eq!(chain_slot(&sb, 2), None, "the slot is empty");
}

/// The object as a file (`policer object --write`) loads with libbpf
/// (`bpftool prog loadall`, which refuses legacy map definitions), and
/// every map of the attached program that the kernel can type carries its
/// BTF key and value types (arrays, per-CPU arrays, hashes, tries; a
/// program array, the ring buffer and the global data sections cannot).
#[test]
fn the_object_and_every_map_carry_btf() {
    if !tools() {
        return;
    }
    let dir = tempdir();
    let object = dir.join("policer.bpf.o");
    let out = Command::new(policer_bin()).args(["object", "--write"]).arg(&object).output().unwrap();
    assert!(out.status.success(), "policer object: {}", String::from_utf8_lossy(&out.stderr));
    let pins = BpfDir::new("loadall");
    let out = Command::new("bpftool").args(["prog", "loadall"]).arg(&object).arg(&pins.0).output().unwrap();
    assert!(out.status.success(), "bpftool prog loadall: {}", String::from_utf8_lossy(&out.stderr));
    assert!(pins.0.join("policer").exists(), "the policer program pinned by bpftool");
    drop(pins);

    let (sb, _pins) = sandbox();
    let _d = start(&sb);
    let id = sb.rx_xdp().expect("attached");
    let out = Command::new("bpftool").args(["-j", "prog", "show", "id", &id]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<u32> = v["map_ids"].as_array().unwrap().iter().map(|m| m.as_u64().unwrap() as u32).collect();
    assert!(ids.len() > 20, "the program's maps: {v}");
    const TYPED: [u32; 4] = [1, 2, 6, 11]; // hash, array, per-CPU array, LPM trie
    let mut untyped = Vec::new();
    let mut typed = 0;
    for m in ids {
        let info = policer_tests::root::map_btf(m).unwrap();
        if !TYPED.contains(&info.map_type) || info.name.ends_with(".rodata") || info.name.ends_with(".bss") {
            continue;
        }
        typed += 1;
        if info.btf_id == 0 || info.key_type_id == 0 || info.value_type_id == 0 {
            untyped.push(format!(
                "{} (type {}, btf {}, key {}, value {})",
                info.name, info.map_type, info.btf_id, info.key_type_id, info.value_type_id
            ));
        }
    }
    assert!(typed > 20, "{typed} maps checked");
    assert!(untyped.is_empty(), "maps without BTF key and value types: {untyped:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A second veth pair between the sandbox's namespaces, as a sandbox of
/// its own for the traffic helpers (its namespaces are `sb`'s: never
/// dropped, `sb` deletes them).
fn second_pair(sb: &Sandbox) -> std::mem::ManuallyDrop<Sandbox> {
    let (rx, tx) = (format!("{}b", sb.rx_if), format!("{}b", sb.tx_if));
    policer_tests::netns::ip(&[
        "link", "add", &rx, "netns", &sb.rx_ns, "type", "veth", "peer", "name", &tx, "netns", &sb.tx_ns,
    ]);
    for (ns, ifc) in [(&sb.rx_ns, &rx), (&sb.tx_ns, &tx)] {
        policer_tests::netns::ip(&["-n", ns, "link", "set", ifc, "up"]);
    }
    std::mem::ManuallyDrop::new(Sandbox {
        config: sb.config.clone(),
        rx_ns: sb.rx_ns.clone(),
        tx_ns: sb.tx_ns.clone(),
        rx_if: rx,
        tx_if: tx,
    })
}

/// The id of the map pinned at `path` (bpftool's view).
fn pinned_map_id(path: &Path) -> u64 {
    let out = Command::new("bpftool").args(["-j", "map", "show", "pinned"]).arg(path).output().expect("bpftool");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["id"].as_u64().unwrap_or_else(|| panic!("no map pinned at {}: {v}", path.display()))
}

/// One daemon polices two interfaces, and each has a chain of its own: a
/// program in one interface's chain acts on that interface's frames only,
/// each chain is its own array at its own pin, and each interface's chain
/// counters are its own (docs/chain.md, "Several interfaces").
#[test]
fn each_interface_has_a_chain_of_its_own() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let b = second_pair(&sb);
    let _pins_b = Pins(b.rx_if.clone());
    let args = ["attach", &sb.rx_if, &b.rx_if, "--config", &sb.config, "--interval", "0", "--mode", "native"];
    let _d = Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[])
        .unwrap_or_else(|e| panic!("policer did not start ({}):\n{}\n{}", e.status, e.stdout, e.stderr));
    let (pin_a, pin_b) = (policer_common::chain::pin_path(&sb.rx_if), policer_common::chain::pin_path(&b.rx_if));
    assert_ne!(pinned_map_id(&pin_a), pinned_map_id(&pin_b), "each interface's chain is an array of its own");
    succeeds(&cli(&sb, &["chain", "add", &sb.rx_if, XDPFILT, "--pin-maps", FILTER_PINS]));
    xdp_filter(&["port", "9999", "--mode", "dst", "--proto", "udp"]);
    let ls = succeeds(&cli(&sb, &["chain", "ls", &b.rx_if, "--json"]));
    let v: serde_json::Value = serde_json::from_str(&ls).unwrap();
    assert_eq!(v[0]["slots"].as_array().map(Vec::len), Some(0), "the second interface's chain is empty: {ls}");

    // The first interface: policer, then xdp-filter.
    both_enforce(&sb, "the first interface");
    // The second: policer alone (xdp-filter would drop UDP/7777).
    let (sent, got) = run(&b);
    heavy_admitted_ok(got[0], sent[0]);
    assert_eq!((got[1], got[2]), (sent[1], sent[2]), "the second interface's chain is empty: all in-profile arrive");
    let out = succeeds(&cli(&sb, &["stats", "--json"]));
    let st: serde_json::Value = serde_json::from_str(&out).unwrap();
    let of = |name: &str, k: &str| -> u64 {
        let i =
            st["interfaces"].as_array().unwrap().iter().find(|i| i["name"] == name).unwrap_or_else(|| panic!("{st}"));
        i[k].as_u64().unwrap_or_else(|| panic!("{k} in {i}"))
    };
    assert!(of(&sb.rx_if, "chain_handed_packets") > 0, "{st}");
    assert_eq!(of(&b.rx_if, "chain_handed_packets"), 0, "nothing handed on the second interface: {st}");
    assert!(of(&b.rx_if, "chain_empty_packets") >= sent[1] + sent[2], "{st}");

    // A program bpftool puts in the second interface's pin joins there only.
    let dir = BpfDir::new("ifaces");
    std::fs::create_dir_all(&dir.0).unwrap();
    let dropper = dir.0.join("drop");
    let fd = policer_tests::root::load_xdp(&[0x0000_0001_0000_00b7, 0x95], "drop_all").unwrap();
    policer_tests::root::pin(std::os::fd::AsRawFd::as_raw_fd(&fd), &dropper).unwrap();
    bpftool_put(&pin_b, 0, &dropper);
    let (sent, got) = run(&b);
    assert!(
        sent[1] > 0 && got.iter().sum::<u64>() == 0,
        "the second interface's chain drops all it is handed: {got:?}"
    );
    both_enforce(&sb, "the first interface, beside the second's program");

    // The second detached while the daemon polices the first: its
    // dispatcher leaves CHAINS (holding its chain open for nothing), and
    // its emptied chain's pins go.
    let dispatch = policer_common::chain::dispatch_pin_path(&sb.rx_if);
    let link = Command::new("ip").args(["-n", &b.rx_ns, "-j", "link", "show", "dev", &b.rx_if]).output().unwrap();
    let link: serde_json::Value = serde_json::from_slice(&link.stdout).unwrap();
    let slot = link[0]["ifindex"].as_u64().unwrap() as u32 % policer_common::MAX_IFACE_SLOTS;
    let key: Vec<String> = slot.to_le_bytes().iter().map(|b| b.to_string()).collect();
    let lookup = || {
        let mut c = Command::new("bpftool");
        c.args(["map", "lookup", "pinned"]).arg(&dispatch).arg("key").args(&key);
        c.output().unwrap().status.success()
    };
    assert!(lookup(), "the second interface's dispatcher is in CHAINS at {slot}");
    let said = succeeds(&cli(&sb, &["detach", &b.rx_if, "--force"]));
    assert!(said.contains("detached from"), "{said}");
    assert!(!lookup(), "the detached interface's dispatcher is still in CHAINS at {slot}");
    assert!(!pin_b.exists(), "the detached interface's emptied chain is still pinned");
    both_enforce(&sb, "the first interface, after the second's detach");
}

/// A build before this one pinned one chain under every interface's name:
/// a start gives each interface a copy of its own, with the programs in
/// it, before it attaches (no frame passes unchained); then removing the
/// program from one interface's chain leaves the other's.
#[test]
fn a_chain_an_older_build_shared_is_split_at_start() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let b = second_pair(&sb);
    let _pins_b = Pins(b.rx_if.clone());
    let (pin_a, pin_b) = (policer_common::chain::pin_path(&sb.rx_if), policer_common::chain::pin_path(&b.rx_if));
    std::fs::create_dir_all(pin_a.parent().unwrap()).unwrap();
    std::fs::create_dir_all(pin_b.parent().unwrap()).unwrap();
    // As the older build left it: one array under both names, a program
    // (dropping all it is handed) in slot 2.
    let array = policer_tests::root::map_create(3, 8, "CHAIN").unwrap();
    let dropper = policer_tests::root::load_xdp(&[0x0000_0001_0000_00b7, 0x95], "drop_all").unwrap();
    use std::os::fd::AsRawFd;
    policer_tests::root::put(array.as_raw_fd(), 2, dropper.as_raw_fd()).unwrap();
    policer_tests::root::pin(array.as_raw_fd(), &pin_a).unwrap();
    policer_tests::root::pin(array.as_raw_fd(), &pin_b).unwrap();
    drop((array, dropper));
    let args = ["attach", &sb.rx_if, &b.rx_if, "--config", &sb.config, "--interval", "0", "--mode", "native"];
    let d = Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[])
        .unwrap_or_else(|e| panic!("policer did not start ({}):\n{}\n{}", e.status, e.stdout, e.stderr));
    assert!(d.stdout().contains(&format!("{} has a chain of its own now", b.rx_if)), "said: {}", d.stdout());
    assert_ne!(pinned_map_id(&pin_a), pinned_map_id(&pin_b), "split into two arrays");
    for s in [&sb as &Sandbox, &b] {
        let (sent, got) = run(s);
        assert!(sent[0] > 0 && got.iter().sum::<u64>() == 0, "{}: the copied program drops all: {got:?}", s.rx_if);
    }
    let said = succeeds(&cli(&sb, &["chain", "rm", &b.rx_if, "--slot", "2"]));
    assert!(said.contains("removed"), "{said}");
    let (sent, got) = run(&b);
    heavy_admitted_ok(got[0], sent[0]);
    assert_eq!((got[1], got[2]), (sent[1], sent[2]), "the second interface's chain is empty now");
    let (sent, got) = run(&sb);
    assert!(sent[0] > 0 && got.iter().sum::<u64>() == 0, "the first's keeps its program: {got:?}");
}

/// What is pinned where an interface's chain goes, when it is not one
/// (another tool's map, a hand-made pin): the start refuses it by name and
/// leaves it alone. And a start that fails after its first kernel change
/// (test hooks), or that its config refuses, leaves no chain or
/// dispatchers' pin of its own making; a second daemon refused on the same
/// interface leaves the running one's pins.
#[test]
fn a_foreign_map_at_the_chain_pin_is_refused_and_a_failed_start_pins_nothing() {
    if !tools() {
        return;
    }
    let (sb, _pins) = sandbox();
    let pin = policer_common::chain::pin_path(&sb.rx_if);
    let dir = pin.parent().unwrap().to_path_buf();
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::fd::AsRawFd;
    // A hash map (BPF_MAP_TYPE_HASH) where the chain goes.
    let foreign = policer_tests::root::map_create(1, 8, "not_a_chain").unwrap();
    policer_tests::root::pin(foreign.as_raw_fd(), &pin).unwrap();
    let id = pinned_map_id(&pin);
    let args = ["attach", &sb.rx_if, "--config", &sb.config, "--interval", "0", "--mode", "native"];
    let e = match Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[]) {
        Ok(_) => panic!("policer started over a hash map pinned as its chain"),
        Err(e) => e,
    };
    let said = format!("{} is not a policer chain (a program array of 8 slots) but Hash", pin.display());
    assert!(e.stderr.contains(&said), "{}\n{}", e.stdout, e.stderr);
    assert!(!e.stderr.contains("panicked"), "{}", e.stderr);
    assert_eq!(pinned_map_id(&pin), id, "the foreign map's pin is left as it was");
    assert!(sb.rx_xdp().is_none(), "nothing attached");
    std::fs::remove_file(&pin).unwrap();
    std::fs::remove_dir(&dir).unwrap();
    drop(foreign);

    if !policer_tests::file_contains(&policer_bin(), b"POLICER_TEST_FAIL_AT") {
        eprintln!("{} has no test hooks: the failed start's pins are not checked", policer_bin().display());
        return;
    }
    let e = match Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[("POLICER_TEST_FAIL_AT", "1")]) {
        Ok(_) => panic!("the start did not fail on purpose"),
        Err(e) => e,
    };
    assert!(e.stderr.contains("failing on purpose after kernel change 1 "), "{}\n{}", e.stdout, e.stderr);
    assert!(sb.rx_xdp().is_none(), "undone: nothing attached");
    assert!(!dir.exists(), "a failed start left {}: {:?}", dir.display(), std::fs::read_dir(&dir).map(|d| d.count()));
    // A start refused before its transaction (a rule of the file that does
    // not hold), while its early load pinned the dispatchers' array: no
    // pin left either.
    let good = std::fs::read(&sb.config).unwrap();
    std::fs::write(&sb.config, "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"fast\"\n").unwrap();
    let e = match Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[]) {
        Ok(_) => panic!("policer started with a rate of \"fast\""),
        Err(e) => e,
    };
    assert!(e.stderr.contains("fast"), "{}\n{}", e.stdout, e.stderr);
    assert!(!dir.exists(), "a start refused by its config left {}: {:?}", dir.display(), std::fs::read_dir(&dir));
    std::fs::write(&sb.config, good).unwrap();
    // And a start that succeeds pins both.
    let mut d = Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[])
        .unwrap_or_else(|e| panic!("policer did not start ({}):\n{}\n{}", e.status, e.stdout, e.stderr));
    let dispatch = policer_common::chain::dispatch_pin_path(&sb.rx_if);
    assert!(pin.exists() && dispatch.exists());
    let ids = (pinned_map_id(&pin), pinned_map_id(&dispatch));
    // A second daemon on the same interface is refused, and leaves the
    // running one's pins as they are.
    let e = match Daemon::try_start_nsenter(&policer_bin(), &sb.rx_ns, &args, &[]) {
        Ok(_) => panic!("a second daemon started on {}", sb.rx_if),
        Err(e) => e,
    };
    assert!(!e.stderr.contains("panicked"), "{}", e.stderr);
    assert_eq!((pinned_map_id(&pin), pinned_map_id(&dispatch)), ids, "a refused start touched the running pins");
    assert!(d.stop_with(libc::SIGTERM));
    assert!(!dir.exists(), "a detach with the chain empty leaves no pins");
}
