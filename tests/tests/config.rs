//! Tier 3, the config file as the daemon and the CLI (separate processes)
//! leave it: mode, owner and comments kept across `rule set` / `rule rm`;
//! a symlinked config written through; a hand edit not yet reloaded is not
//! overwritten; a file that cannot be written (a read-only mount) refuses
//! the change cleanly, `--runtime` applies it to the kernel only, and
//! traffic shows which rules are in force; a ConfigMap-style directory
//! (the kubelet's `..data` swap) is followed, an invalid file refused; a
//! config or a set's state file that is not a regular file (a FIFO, a link
//! to /dev/zero) is refused at once, at start and when followed, and
//! neither blocks the daemon nor grows it; state files are as private as
//! the config; what killed writes left is removed at start; an expiry the
//! file could not take (a full disk) lands once there is room.

use std::{
    net::IpAddr,
    os::unix::fs::{MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use policer_tests::{
    daemon::{Daemon, cli, fails_with, scrape, succeeds},
    netns::Sandbox,
    privileged,
    traffic::{self, Flow},
};

const CONFIG: &str = "\
# Edge policy, kept by hand. Comments must survive the daemon.
[daemon]
mode = \"native\"   # veth has native XDP

# Everyone.
[[rule]]
prefix = \"0.0.0.0/0\"
rate = \"1kpps\"
burst = 100

# The lab.
[[rule]]
prefix = \"203.0.113.0/24\"
rate = \"500pps\"
burst = 50   # small bursts only
";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn rules(sb: &Sandbox) -> serde_json::Value {
    serde_json::from_str(&succeeds(&cli(sb, &["rule", "ls", "--json"]))).unwrap()
}

fn rule<'a>(all: &'a serde_json::Value, prefix: &str) -> Option<&'a serde_json::Value> {
    all.as_array().unwrap().iter().find(|r| r["prefix"] == prefix)
}

/// A temporary directory removed on drop (unmounting what the test mounted).
struct Dir {
    path: PathBuf,
    mounted: bool,
}

impl Dir {
    fn new(tag: &str) -> Dir {
        let path = std::env::temp_dir().join(format!("policer-cfg-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Dir { path, mounted: false }
    }

    fn mount_tmpfs(&mut self) {
        let st = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"]).arg(&self.path).status();
        assert!(st.unwrap().success(), "mount tmpfs");
        self.mounted = true;
    }

    fn remount(&self, opt: &str) {
        let st = Command::new("mount").args(["-o", &format!("remount,{opt}")]).arg(&self.path).status();
        assert!(st.unwrap().success(), "remount {opt}");
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.path).status();
        }
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Waits up to 3 s for `ok`.
fn wait_for(ok: impl FnMut() -> bool, what: &str) {
    wait_within(3, ok, what);
}

/// Waits up to `secs` for `ok`.
fn wait_within(secs: u64, mut ok: impl FnMut() -> bool, what: &str) {
    let until = Instant::now() + Duration::from_secs(secs);
    while !ok() {
        assert!(Instant::now() < until, "not within {secs} s: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn attach(sb: &Sandbox, config: &Path) -> Daemon {
    let c = config.to_str().unwrap();
    Daemon::start(&sb.rx_ns, &["attach", &sb.rx_if, "--config", c, "--interval", "0"])
}

#[test]
fn the_config_keeps_its_mode_owner_and_comments() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfg");
    let dir = Dir::new("keep");
    // The operator's file lives elsewhere; the daemon is pointed at a link.
    let real = dir.path.join("edge.toml");
    std::fs::write(&real, CONFIG).unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(&real, Some(4242), Some(4343)).unwrap();
    let link = dir.path.join("policer.toml");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let _d = attach(&sb, &link);

    succeeds(&cli(&sb, &["rule", "set", "198.51.100.0/24", "--action", "deny"]));
    succeeds(&cli(&sb, &["rule", "set", "203.0.113.0/24", "--rate", "800pps", "--burst", "50"]));
    succeeds(&cli(&sb, &["rule", "rm", "198.51.100.0/24"]));

    assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link stays a link");
    let meta = std::fs::metadata(&real).unwrap();
    assert_eq!(meta.mode() & 0o777, 0o640, "mode kept");
    assert_eq!((meta.uid(), meta.gid()), (4242, 4343), "owner kept");
    let text = std::fs::read_to_string(&real).unwrap();
    for kept in ["# Edge policy, kept by hand.", "# Everyone.", "# The lab.", "# small bursts only", "# veth has"] {
        assert!(text.contains(kept), "lost {kept:?}:\n{text}");
    }
    assert!(text.contains("rate = \"800pps\""), "the change is in the file:\n{text}");
    assert!(!text.contains("198.51.100.0/24"), "the removed rule is gone:\n{text}");
    let leftovers: Vec<_> = std::fs::read_dir(&dir.path)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");

    // A hand edit is followed (the daemon watches the directory) and is
    // not overwritten: a change is refused until it is in force, never
    // written over it.
    let edited = text.replace("burst = 100", "burst = 120");
    std::fs::write(&real, &edited).unwrap();
    let out = cli(&sb, &["rule", "set", "192.0.2.0/24", "--action", "deny"]);
    if !out.status.success() {
        fails_with(&out, "policer reload");
        assert!(rule(&rules(&sb), "192.0.2.0/24").is_none(), "a refused change is not in force either");
        wait_for(|| rule(&rules(&sb), "0.0.0.0/0").unwrap()["burst"] == 120, "the hand edit followed");
        succeeds(&cli(&sb, &["rule", "set", "192.0.2.0/24", "--action", "deny"]));
    }
    let text = std::fs::read_to_string(&real).unwrap();
    assert!(text.contains("burst = 120") && text.contains("192.0.2.0/24"), "{text}");

    // An editor's save: a new file renamed over the old one, followed.
    let tmp = dir.path.join(".edge.toml.swp");
    std::fs::write(&tmp, text.replace("burst = 120", "burst = 130")).unwrap();
    std::fs::rename(&tmp, &real).unwrap();
    wait_for(|| rule(&rules(&sb), "0.0.0.0/0").unwrap()["burst"] == 130, "the renamed-over file followed");
}

#[test]
fn a_read_only_config_refuses_changes_and_runtime_applies_them() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("rof");
    let mut dir = Dir::new("ro");
    dir.mount_tmpfs();
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let _d = attach(&sb, &config);
    // (The start wrote the interface into the file.)
    let before = std::fs::read_to_string(&config).unwrap();
    dir.remount("ro");

    // The emergency deny: refused clearly with the file as it was...
    let out = cli(&sb, &["rule", "set", "198.18.0.0/24", "--action", "deny"]);
    fails_with(&out, "--runtime");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_none(), "a refused change is not in force");
    // ...and applied to the kernel with --runtime.
    succeeds(&cli(&sb, &["rule", "set", "198.18.0.0/24", "--action", "deny", "--runtime"]));
    let all = rules(&sb);
    assert_eq!(rule(&all, "198.18.0.0/24").unwrap()["persisted"], false);
    assert_eq!(rule(&all, "0.0.0.0/0").unwrap()["persisted"], true);
    let status: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    assert_eq!(status["runtime_rules"], 1);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), before, "the file is as it was");

    // On the wire: the runtime deny drops, the default rule still polices.
    let denied = Flow { src: ip("198.18.0.7"), pps: 200.0, len: 64 };
    let other = Flow { src: ip("198.19.0.7"), pps: 200.0, len: 64 };
    let (sent, got) = traffic::run(&sb, &[denied, other], Duration::from_secs(1));
    assert_eq!(got.per_flow[0], 0, "the runtime deny let frames through");
    assert_eq!(got.per_flow[1], sent.sent[1], "an in-profile source lost frames");

    // A runtime removal of a saved rule: shown as not in force.
    succeeds(&cli(&sb, &["rule", "rm", "203.0.113.0/24", "--runtime"]));
    let lab = rule(&rules(&sb), "203.0.113.0/24").cloned().expect("the file's rule is still listed");
    assert_eq!((lab["in_force"].clone(), lab["persisted"].clone()), (false.into(), true.into()), "{lab}");
    let status: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    assert_eq!(status["runtime_rules"], 2);
    // Writable again: the removal can be made to stick.
    dir.remount("rw");
    succeeds(&cli(&sb, &["rule", "rm", "203.0.113.0/24"]));
    assert!(!std::fs::read_to_string(&config).unwrap().contains("203.0.113.0/24"));
    assert!(rule(&rules(&sb), "203.0.113.0/24").is_none());
    // A reload keeps the runtime deny over the file, and says so...
    let said = succeeds(&cli(&sb, &["reload"]));
    assert!(said.contains("kept 1 runtime change over the file's (rule for 198.18.0.0/24;"), "{said}");
    assert_eq!(rule(&rules(&sb), "198.18.0.0/24").unwrap()["persisted"], false);
    // ...and `--discard-runtime` goes back to the file: the runtime deny goes.
    succeeds(&cli(&sb, &["reload", "--discard-runtime"]));
    let all = rules(&sb);
    assert!(rule(&all, "198.18.0.0/24").is_none(), "reload --discard-runtime drops runtime-only rules");
    assert!(all.as_array().unwrap().iter().all(|r| r["persisted"] == true && r["in_force"] == true));
}

fn stats(sb: &Sandbox) -> serde_json::Value {
    serde_json::from_str(&succeeds(&cli(sb, &["stats", "--json"]))).unwrap()
}

/// A kubelet-style ConfigMap volume: `config.toml -> ..data/config.toml`,
/// `..data -> ..TIMESTAMP`, read-only files.
struct ConfigMap {
    dir: Dir,
    n: u32,
}

impl ConfigMap {
    fn new(tag: &str, text: &str) -> ConfigMap {
        let mut m = ConfigMap { dir: Dir::new(tag), n: 0 };
        m.swap(text);
        std::os::unix::fs::symlink("..data/config.toml", m.config()).unwrap();
        m
    }

    fn config(&self) -> PathBuf {
        self.dir.path.join("config.toml")
    }

    /// What the kubelet does on an update: a new timestamped directory,
    /// `..data_tmp` pointing at it, renamed over `..data`; the old one goes.
    fn swap(&mut self, text: &str) {
        let old = format!("..2026_11_23_20_00_{:02}.{}", self.n, self.n);
        self.n += 1;
        let name = format!("..2026_11_23_20_00_{:02}.{}", self.n, self.n);
        let ts = self.dir.path.join(&name);
        std::fs::create_dir(&ts).unwrap();
        let file = ts.join("config.toml");
        std::fs::write(&file, text).unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
        std::fs::set_permissions(&ts, std::fs::Permissions::from_mode(0o555)).unwrap();
        let tmp = self.dir.path.join("..data_tmp");
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path.join("..data")).unwrap();
        let _ = std::fs::remove_dir_all(self.dir.path.join(old));
    }
}

/// The daemon follows a ConfigMap volume: the kubelet's swap puts new rules
/// in force on the wire within 3 s; an invalid file swapped in changes
/// nothing and says so in `stats --json` (and /metrics).
#[test]
fn a_configmap_swap_is_followed_and_a_bad_one_keeps_the_rules() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cmap");
    let mut cm = ConfigMap::new("cmap", CONFIG);
    let c = cm.config();
    let d = Daemon::start(
        &sb.rx_ns,
        &["attach", &sb.rx_if, "--config", c.to_str().unwrap(), "--interval", "0", "--metrics", "9471"],
    );
    let src = Flow { src: ip("198.18.0.7"), pps: 200.0, len: 64 };
    let (sent, got) = traffic::run(&sb, std::slice::from_ref(&src), Duration::from_millis(500));
    assert_eq!(got.per_flow[0], sent.sent[0], "an in-profile source lost frames");
    let first = stats(&sb)["config"].clone();
    assert_eq!(first["last_reload_success"], true, "{first}");
    assert_eq!(first["read_only"], true, "{first}");

    // The swap: a deny for the source's prefix.
    let deny = format!("{CONFIG}\n[[rule]]\nprefix = \"198.18.0.0/24\"\naction = \"deny\"\n");
    let swapped = Instant::now();
    cm.swap(&deny);
    loop {
        let (sent, got) = traffic::run(&sb, std::slice::from_ref(&src), Duration::from_millis(300));
        if sent.sent[0] > 0 && got.per_flow[0] == 0 {
            break;
        }
        assert!(swapped.elapsed() < Duration::from_secs(3), "the swapped-in deny is not enforced within 3 s");
    }
    let after = stats(&sb)["config"].clone();
    assert_eq!(after["last_reload_success"], true, "{after}");
    assert_ne!(after["sha256"], first["sha256"], "{after}");

    // An invalid file: the deny stays, and the failure shows.
    cm.swap(&format!("{deny}\n[[rule]]\nprefix = \"198.19.0.0/24\"\nrate = \"1kpps\"\ncolour = \"red\"\n"));
    wait_for(|| stats(&sb)["config"]["last_reload_success"] == false, "the refused reload shows");
    let said = d.stdout();
    assert!(said.contains("not applied, the running rules stay") && said.contains("unknown key `colour`"), "{said}");
    let (sent, got) = traffic::run(&sb, std::slice::from_ref(&src), Duration::from_millis(500));
    assert_eq!((got.per_flow[0], sent.sent[0] > 0), (0, true), "a refused file lifted the deny");
    assert_eq!(stats(&sb)["config"]["sha256"], after["sha256"], "the hash in force is the applied file's");
    let m = scrape(&sb.rx_ns, 9471);
    let sha = after["sha256"].as_str().unwrap();
    for line in ["policer_config_last_reload_success 0", &format!("policer_config_info{{sha256=\"{sha}\"}} 1")] {
        assert!(m.lines().any(|l| l == line), "/metrics lacks {line:?}:\n{m}");
    }
    assert!(m.contains("policer_config_last_reload_timestamp_seconds "), "{m}");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_some());
}

/// A read-only config (a ConfigMap): `rule set` refuses, naming the file;
/// `--runtime` applies it.
#[test]
fn rule_set_on_a_read_only_config_needs_runtime() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cmro");
    let cm = ConfigMap::new("cmro", CONFIG);
    let _d = attach(&sb, &cm.config());
    let out = cli(&sb, &["rule", "set", "198.18.0.0/24", "--action", "deny"]);
    fails_with(&out, &format!("{} is read-only", cm.config().display()));
    fails_with(&out, "--runtime");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_none());
    fails_with(&cli(&sb, &["rule", "rm", "203.0.113.0/24"]), "is read-only");
    succeeds(&cli(&sb, &["rule", "set", "198.18.0.0/24", "--action", "deny", "--runtime"]));
    assert_eq!(rule(&rules(&sb), "198.18.0.0/24").unwrap()["persisted"], false);
    let (sent, got) =
        traffic::run(&sb, &[Flow { src: ip("198.18.0.7"), pps: 200.0, len: 64 }], Duration::from_millis(500));
    assert_eq!((got.per_flow[0], sent.sent[0] > 0), (0, true), "the runtime deny let frames through");
}

/// On a read-only ConfigMap `--runtime` is the only way to ban: an
/// unrelated swap of the file (a comment added) keeps the runtime ban and a
/// runtime removal in force, on the wire, and the log says so; a file that
/// comes to say the same is the file's from then on; `reload
/// --discard-runtime` goes back to the file.
#[test]
fn runtime_bans_survive_a_followed_reload() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cmrt");
    let mut cm = ConfigMap::new("cmrt", CONFIG);
    let d = attach(&sb, &cm.config());
    assert!(
        d.stdout().contains("with 2 rules from") && d.stdout().contains("(beyond the defaults: rules 1 police)"),
        "{}",
        d.stdout()
    );
    succeeds(&cli(&sb, &["ban", "198.18.0.0/24", "--for", "3650d", "--reason", "abuse", "--runtime"]));
    succeeds(&cli(&sb, &["rule", "rm", "203.0.113.0/24", "--runtime"]));
    let banned = Flow { src: ip("198.18.0.7"), pps: 200.0, len: 64 };
    // Over the removed rule's 500pps, under the default rule's 1kpps.
    let freed = Flow { src: ip("203.0.113.9"), pps: 700.0, len: 64 };
    let check = |why: &str| {
        let (sent, got) = traffic::run(&sb, &[banned.clone(), freed.clone()], Duration::from_millis(500));
        assert_eq!((got.per_flow[0], sent.sent[0] > 0), (0, true), "{why}: the runtime ban let frames through");
        assert_eq!(got.per_flow[1], sent.sent[1], "{why}: the rule removed at runtime policed again");
    };
    check("before");

    let sha = stats(&sb)["config"]["sha256"].clone();
    cm.swap(&format!("{CONFIG}# an unrelated comment\n"));
    wait_for(|| stats(&sb)["config"]["sha256"] != sha, "the swapped file is reloaded");
    assert_eq!(stats(&sb)["config"]["last_reload_success"], true);
    let said = d.stdout();
    assert!(
        said.contains("reloaded") && said.contains("0 added, 0 changed, 0 removed); kept 2 runtime changes"),
        "{said}"
    );
    assert!(said.contains("ban of 198.18.0.0/24") && said.contains("203.0.113.0/24 removed"), "{said}");
    check("after a followed reload");
    let all: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["ban", "ls", "--json"]))).unwrap();
    assert!(all.to_string().contains("198.18.0.0/24"), "ban ls lost the runtime ban: {all}");

    // The file drops the rule too: the removal is the file's from now on.
    let without = CONFIG.replace("[[rule]]\nprefix = \"203.0.113.0/24\"", "[[rule]]\nprefix = \"203.0.114.0/24\"");
    assert_ne!(without, CONFIG, "the test's config has the 203.0.113.0/24 rule");
    let sha = stats(&sb)["config"]["sha256"].clone();
    cm.swap(&without);
    wait_for(|| stats(&sb)["config"]["sha256"] != sha, "the second swap is reloaded");
    let said = d.stdout();
    assert!(said.contains("kept 1 runtime change over the file's (ban of 198.18.0.0/24;"), "{said}");
    check("after the file agreed");

    // Back to the file: the ban is lifted.
    succeeds(&cli(&sb, &["reload", "--discard-runtime"]));
    let (sent, got) = traffic::run(&sb, std::slice::from_ref(&banned), Duration::from_millis(500));
    assert!(sent.sent[0] > 0 && got.per_flow[0] > 0, "reload --discard-runtime kept the runtime ban");
}

/// `interfaces = ["@default-route"]` picks the default route's interface
/// (netlink), keeps the token in the file, and says clearly when there is
/// no default route.
#[test]
fn default_route_picks_the_interface() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("dfr");
    let dir = Dir::new("dfr");
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG.replace("[daemon]\n", "[daemon]\ninterfaces = [\"@default-route\"]\n")).unwrap();
    let c = config.to_str().unwrap();
    let args = ["attach", "--config", c, "--interval", "0"];
    let e = Daemon::try_start(&policer_tests::daemon::policer_bin(), &sb.rx_ns, &args, &[])
        .err()
        .expect("a start without a default route fails");
    assert!(e.stderr.contains("@default-route: no default route"), "{}{}", e.stdout, e.stderr);
    policer_tests::netns::ip(&["-n", &sb.rx_ns, "route", "add", "default", "dev", &sb.rx_if]);
    let _d = Daemon::start(&sb.rx_ns, &args);
    let status: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    assert_eq!(status["interfaces"], serde_json::json!([sb.rx_if]), "{status}");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("interfaces = [\"@default-route\"]"), "the token stays in the file:\n{text}");
}

/// `policer check FILE` as an unprivileged user (nobody), no daemon.
fn check_as_nobody(file: &Path, json: bool) -> std::process::Output {
    let mut c = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(policer_tests::daemon::policer_bin());
        c
    } else {
        Command::new(policer_tests::daemon::policer_bin())
    };
    c.args(["check", "--config"]).arg(file);
    if json {
        c.arg("--json");
    }
    c.output().expect("run policer check")
}

/// Review of issue 41, point 5: `policer check` warns of a valid file
/// without its final newline (the daemon refuses a followed update of
/// such a file), exit 0; the JSON says it in "warnings"; a file with its
/// newline has none.
#[test]
fn check_warns_of_a_file_without_its_final_newline() {
    let dir = Dir::new("checknl");
    std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path.join("cm.toml");
    std::fs::write(&file, CONFIG.trim_end_matches('\n')).unwrap();
    let out = check_as_nobody(&file, false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains(&format!("{}: warning: it does not end with a newline", file.display())), "{err}");
    let out = check_as_nobody(&file, true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true);
    assert!(v["warnings"][0].as_str().unwrap().starts_with("it does not end with a newline"), "{v}");
    std::fs::write(&file, CONFIG).unwrap();
    let out = check_as_nobody(&file, true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["warnings"], serde_json::json!([]), "{v}");
    assert!(check_as_nobody(&file, false).stderr.is_empty());
}

#[test]
fn check_validates_a_file_without_root_or_daemon() {
    let dir = Dir::new("check");
    // nobody must be able to read it.
    std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let good = dir.path.join("good.toml");
    std::fs::write(&good, format!("{CONFIG}\n[[rule]]\nprefix = \"2001:db8::/32\"\nrate = \"10mbit\"\n")).unwrap();
    let out = check_as_nobody(&good, false);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("ok: 3 rules (2 IPv4, 1 IPv6)"), "{stdout}");

    // Every problem, each with its line; exit 1. Every problem of a rule
    // too (rule 3: its rate, its protocol and its key length; not its
    // burst, which only lacks the rate that is not one).
    let bad = dir.path.join("bad.toml");
    std::fs::write(
        &bad,
        "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\n\n\
         [[rule]]\nprefix = \"10.0.0.1/8\"\nrate = \"1kpps\"\n\n\
         [[rule]]\nprefix = \"192.0.2.0/24\"\nrate = \"fast\"\nburst = 10\nproto = \"bogus\"\nkey_len = 8\n\n\
         [[rule]]\nprefix = \"0.0.0.0/0\"\naction = \"deny\"\n\n\
         [[rule]]\nprefix = \"10.0.0.0/8\"\nrate = 1kpps\n\
         [[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\nburst = \"abc\"\n",
    )
    .unwrap();
    let out = check_as_nobody(&bad, false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    // `policer check FILE` is the same.
    let positional = Command::new(policer_tests::daemon::policer_bin()).arg("check").arg(&bad).output().unwrap();
    assert_eq!((positional.status.code(), String::from_utf8_lossy(&positional.stderr)), (Some(1), err.clone()));
    let b = bad.display();
    for want in [
        format!("{b}:6: rule 2 (prefix 10.0.0.1/8): prefix: '10.0.0.1/8' has host bits set"),
        format!("{b}:11: rule 3 (prefix 192.0.2.0/24): rate: \"fast\" is not a rate; write rate = \"10kpps\""),
        format!("{b}:13: rule 3 (prefix 192.0.2.0/24): proto 'bogus': unknown protocol"),
        format!("{b}:14: rule 3 (prefix 192.0.2.0/24): key_len: key length 8 is shorter than the prefix 192.0.2.0/24"),
        format!("{b}:16: rule 4 (prefix 0.0.0.0/0): prefix 0.0.0.0/0 appears twice"),
        format!("{b}:22: not valid TOML"),
        format!("{b}:26: rule 6 (prefix 10.0.0.0/8): burst: \"abc\" is not a burst; write a count like burst = 50"),
    ] {
        assert!(err.contains(&want), "missing {want:?} in:\n{err}");
    }
    assert_eq!(
        err.lines().count(),
        7,
        "one line a problem, in the file's order, no noise from the rule cut short nor from a rate that is not one:\n{err}"
    );
    let lines: Vec<usize> =
        err.lines().filter_map(|l| l.strip_prefix(&format!("{b}:"))?.split(':').next()?.parse().ok()).collect();
    assert_eq!(lines, [6, 11, 13, 14, 16, 22, 26], "{err}");
    assert!(!err.contains("panicked"));
    // A syntax error names its line; JSON says the same.
    std::fs::write(&bad, "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = 1kpps\n").unwrap();
    let out = check_as_nobody(&bad, true);
    assert_eq!(out.status.code(), Some(1));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    assert_eq!(v["problems"][0]["line"], 3, "{v}");
    // A file nobody may read is a problem, not a panic.
    let out = check_as_nobody(&dir.path.join("missing.toml"), false);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read it"));
}

/// Eight rules, one of them a deny for the test's source.
fn eight_rules() -> String {
    let mut t = format!("{CONFIG}\n[[rule]]\nprefix = \"198.18.0.0/24\"\naction = \"deny\"\n");
    for i in 1..=5 {
        t.push_str(&format!("\n[[rule]]\nprefix = \"198.19.{i}.0/24\"\nrate = \"{i}kpps\"\nburst = 100\n"));
    }
    t
}

fn ban_count(sb: &Sandbox) -> usize {
    let v: serde_json::Value = serde_json::from_str(&succeeds(&cli(sb, &["ban", "ls", "--json"]))).unwrap();
    v.as_array().unwrap().len()
}

/// The denied source's frames that arrive in half a second (0: the deny
/// is in force).
fn denied_through(sb: &Sandbox) -> u64 {
    let src = Flow { src: ip("198.18.0.7"), pps: 160.0, len: 64 };
    let (sent, got) = traffic::run(sb, std::slice::from_ref(&src), Duration::from_millis(500));
    assert!(sent.sent[0] > 0, "nothing sent");
    got.per_flow[0]
}

/// Issue 26, point 1: a file is applied only once it is whole. A writer
/// that pauses mid-file (a slow editor, an scp over a bad link) has
/// nothing applied until it closes the file; a file cut short (`burst =
/// 100` cut to `burst = 1`, valid TOML that drops 7 of 8 rules and every
/// ban) is refused, the running rules and bans stay, and `status` and
/// /metrics say why; the whole file written back is the file in force.
#[test]
fn a_slow_writer_and_a_cut_file_are_not_applied() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgcut");
    let dir = Dir::new("cut");
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, eight_rules()).unwrap();
    let c = config.to_str().unwrap();
    let d = Daemon::start(&sb.rx_ns, &["attach", &sb.rx_if, "--config", c, "--interval", "0", "--metrics", "9472"]);
    succeeds(&cli(&sb, &["ban", "203.0.113.77/32", "--for", "3650d", "--reason", "ten years"]));
    let whole = std::fs::read_to_string(&config).unwrap();
    assert!(whole.contains("ten years"), "the ban is in the file:\n{whole}");
    let (n_rules, n_bans) = (rules(&sb).as_array().unwrap().len(), ban_count(&sb));
    assert_eq!(n_bans, 1);
    assert_eq!(denied_through(&sb), 0);

    // A slow writer, in place: the first part, a pause far past the
    // follower's debounce, then the rest. Nothing changes until it closes.
    let edited = whole.replace("burst = 50", "burst = 40");
    assert_ne!(edited, whole);
    let cut_at = edited.find("burst = 100").unwrap() + "burst = 1".len();
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&config).unwrap();
        f.write_all(&edited.as_bytes()[..cut_at]).unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        assert_eq!(rules(&sb).as_array().unwrap().len(), n_rules, "a half-written file was applied");
        assert_eq!(ban_count(&sb), n_bans, "a half-written file lifted a ban");
        assert_eq!(denied_through(&sb), 0, "a half-written file opened the deny");
        f.write_all(&edited.as_bytes()[cut_at..]).unwrap();
    }
    wait_for(|| rule(&rules(&sb), "203.0.113.0/24").is_some_and(|r| r["burst"] == 40), "the whole file applied");
    assert_eq!((rules(&sb).as_array().unwrap().len(), ban_count(&sb)), (n_rules, n_bans));

    // A writer killed mid-file: the cut file is closed, so it is read; it
    // would remove most rules and the ban, and it does not end with a
    // newline: refused, said, shown.
    std::fs::write(&config, &edited.as_bytes()[..cut_at]).unwrap();
    let status = || -> serde_json::Value { serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap() };
    wait_for(|| status()["config_status"]["last_reload_success"] == false, "the refused cut file shows");
    let why = status()["config_status"]["last_reload_error"].as_str().unwrap().to_string();
    assert!(why.contains("remove 7 of 8 rules and lift every ban (1)") && why.contains("newline"), "{why}");
    // `status` counts the rules as the guard does: 8 rules, the ban apart.
    assert_eq!((status()["rules"].as_u64(), status()["bans"]["manual"].as_u64()), (Some(8), Some(1)));
    assert!(succeeds(&cli(&sb, &["status"])).contains("; 8 rules"), "`status` counts 8 rules");
    assert!(succeeds(&cli(&sb, &["status"])).contains("not applied"), "`status` says it");
    assert!(d.stdout().contains("not applied, the running rules stay"), "{}", d.stdout());
    assert!(scrape(&sb.rx_ns, 9472).lines().any(|l| l == "policer_config_last_reload_success 0"));
    assert_eq!((rules(&sb).as_array().unwrap().len(), ban_count(&sb)), (n_rules, n_bans), "the cut file took rules");
    assert_eq!(denied_through(&sb), 0, "the cut file opened the deny");
    // `policer reload` applies the same rule.
    fails_with(&cli(&sb, &["reload"]), "does not end with a newline");

    // The whole file back: in force again, and said so.
    std::fs::write(&config, &edited).unwrap();
    wait_for(|| status()["config_status"]["last_reload_success"] == true, "the whole file is in force again");
    assert!(status()["config_status"].get("last_reload_error").is_none());
    assert!(d.stdout().contains("is the file in force again"), "{}", d.stdout());

    // A deliberate drastic change (a whole file) is applied, and logged
    // loudly with what it removed.
    let two = format!("{CONFIG}\n[[rule]]\nprefix = \"198.18.0.0/24\"\naction = \"deny\"\n");
    std::fs::write(&config, &two).unwrap();
    wait_for(|| rules(&sb).as_array().unwrap().len() == 3, "a whole drastic file applied");
    assert_eq!(ban_count(&sb), 0);
    let said = d.stdout();
    assert!(
        said.contains("policer: warning: the config reload from")
            && said.contains("remove 5 of 8 rules and lift every ban (1)")
            && said.contains("ban 203.0.113.77/32")
            && said.contains("198.19.5.0/24"),
        "{said}"
    );
    assert!(said.contains("(0 added, 1 changed, 6 removed)"), "{said}");
}

/// A config reached through symlinks (linked into a release directory,
/// whose `current` link is swapped) is followed through edits in place of
/// the file, a swap of `current`, and edits of the new target; an edit of
/// the old release's file is no longer the config's.
#[test]
fn a_symlinked_config_is_followed_through_edits_and_swaps() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfglink");
    let dir = Dir::new("link");
    let (etc, rel) = (dir.path.join("etc"), dir.path.join("releases"));
    for d in [&etc, &rel.join("v1"), &rel.join("v2")] {
        std::fs::create_dir_all(d).unwrap();
    }
    std::fs::write(rel.join("v1/policer.toml"), CONFIG).unwrap();
    std::os::unix::fs::symlink(rel.join("v1"), rel.join("current")).unwrap();
    let config = etc.join("policer.toml");
    std::os::unix::fs::symlink("../releases/current/policer.toml", &config).unwrap();
    let _d = attach(&sb, &config);
    assert!(denied_through(&sb) > 0);

    // Edit the file in place through its real path.
    let v1 = std::fs::read_to_string(rel.join("v1/policer.toml")).unwrap();
    std::fs::write(
        rel.join("v1/policer.toml"),
        format!("{v1}\n[[rule]]\nprefix = \"198.18.0.0/24\"\naction = \"deny\"\n"),
    )
    .unwrap();
    wait_for(|| rule(&rules(&sb), "198.18.0.0/24").is_some(), "an edit in place of the linked file");
    assert_eq!(denied_through(&sb), 0);

    // Swap the release: `current` now points at v2 (an atomic rename).
    std::fs::write(
        rel.join("v2/policer.toml"),
        format!("{CONFIG}\n[[rule]]\nprefix = \"198.19.0.0/24\"\nrate = \"2kpps\"\n"),
    )
    .unwrap();
    std::os::unix::fs::symlink(rel.join("v2"), rel.join("current.tmp")).unwrap();
    std::fs::rename(rel.join("current.tmp"), rel.join("current")).unwrap();
    wait_for(
        || {
            let r = rules(&sb);
            rule(&r, "198.19.0.0/24").is_some() && rule(&r, "198.18.0.0/24").is_none()
        },
        "the swapped-in release",
    );
    assert!(denied_through(&sb) > 0);

    // The new release's file is followed (the watches moved with the swap);
    // the old one's is not the config any more.
    std::fs::write(
        rel.join("v1/policer.toml"),
        format!("{v1}\n[[rule]]\nprefix = \"198.21.0.0/24\"\naction = \"deny\"\n"),
    )
    .unwrap();
    let v2 = std::fs::read_to_string(rel.join("v2/policer.toml")).unwrap();
    std::fs::write(
        rel.join("v2/policer.toml"),
        format!("{v2}\n[[rule]]\nprefix = \"198.20.0.0/24\"\naction = \"deny\"\n"),
    )
    .unwrap();
    wait_for(|| rule(&rules(&sb), "198.20.0.0/24").is_some(), "an edit of the new release's file");
    assert!(rule(&rules(&sb), "198.21.0.0/24").is_none(), "the old release's file was applied");
}

/// A followed reload whose read fails is not dropped: it is logged and
/// tried again until it works. The daemon at its fd limit (EMFILE, which
/// 512 HTTP and 512 control connections reach under systemd's default of
/// 1 024) cannot read the new file; once fds are free again it is applied.
/// A config name that cannot be read as a file (a directory) shows in
/// `status` and /metrics with the reason.
#[test]
fn a_failed_read_is_retried_logged_and_shown() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgfd");
    let dir = Dir::new("emfile");
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let c = config.to_str().unwrap();
    let d = Daemon::start(&sb.rx_ns, &["attach", &sb.rx_if, "--config", c, "--interval", "0", "--metrics", "9473"]);
    let text = std::fs::read_to_string(&config).unwrap();

    // Hold the daemon past its fd limit: its soft RLIMIT_NOFILE lowered.
    let pid = d.pid();
    let set_soft = |soft: u64| -> u64 {
        let mut cur = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: plain syscalls on valid pointers; root may change another
        // process's limits.
        assert_eq!(unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut cur) }, 0);
        let new = libc::rlimit { rlim_cur: soft, rlim_max: cur.rlim_max };
        assert_eq!(unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &new, std::ptr::null_mut()) }, 0);
        cur.rlim_cur
    };
    // Serving (its runtime and the follower are up; they were started
    // after "policing" was said), then below the fds it holds: every new
    // fd fails with EMFILE, whatever closes.
    succeeds(&cli(&sb, &["status"]));
    let before = set_soft(8);
    std::fs::write(&config, format!("{text}\n[[rule]]\nprefix = \"198.18.0.0/24\"\naction = \"deny\"\n")).unwrap();
    let until = Instant::now() + Duration::from_secs(6);
    while d.stdout().matches("Too many open files").count() < 2 {
        assert!(Instant::now() < until, "the failed read is not logged and retried:\n{}", d.stdout());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(d.stdout().contains("looking again in"), "{}", d.stdout());
    set_soft(before);
    // Applied at the next try (at most 4 s after the second).
    let until = Instant::now() + Duration::from_secs(6);
    while rule(&rules(&sb), "198.18.0.0/24").is_none() {
        assert!(Instant::now() < until, "not applied once fds were free:\n{}", d.stdout());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(denied_through(&sb), 0);
    let st: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    assert_eq!(st["config_status"]["last_reload_success"], true, "{st}");

    // Not a file: shown with the reason until a file is back.
    std::fs::remove_file(&config).unwrap();
    std::fs::create_dir(&config).unwrap();
    let status = || -> serde_json::Value { serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap() };
    wait_for(|| status()["config_status"]["last_reload_success"] == false, "an unreadable config shows");
    let why = status()["config_status"]["last_reload_error"].as_str().unwrap().to_string();
    assert!(why.contains(&format!("{c} is a directory, not a regular file")), "{why}");
    assert!(scrape(&sb.rx_ns, 9473).lines().any(|l| l == "policer_config_last_reload_success 0"));
    assert_eq!(denied_through(&sb), 0, "the rules in force stay");
    std::fs::remove_dir(&config).unwrap();
    std::fs::write(&config, &text).unwrap();
    wait_for(|| status()["config_status"]["last_reload_success"] == true, "a file back is applied");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_none());
}

/// A config removed (or renamed away) and then written anew by a slow
/// writer is read only once the new file is closed; a config directory
/// replaced under the same path (`mv etc etc.old; mv etc.new etc`) is
/// followed into the new directory, and edits there after it.
#[test]
fn a_removed_config_rewritten_slowly_and_a_replaced_directory_are_followed() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgrm");
    let dir = Dir::new("rm");
    let etc = dir.path.join("etc");
    std::fs::create_dir(&etc).unwrap();
    let config = etc.join("policer.toml");
    std::fs::write(&config, eight_rules()).unwrap();
    let _d = attach(&sb, &config);
    let n_rules = rules(&sb).as_array().unwrap().len();
    assert_eq!(denied_through(&sb), 0);

    // Removed, then a new file written slowly: its first part (valid TOML,
    // a line boundary, most rules gone) is never applied.
    let text = std::fs::read_to_string(&config).unwrap();
    let edited = text.replace("burst = 50", "burst = 40");
    let cut_at = edited.find("[[rule]]\nprefix = \"198.18.0.0/24\"").unwrap();
    std::fs::remove_file(&config).unwrap();
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&config).unwrap();
        f.write_all(&edited.as_bytes()[..cut_at]).unwrap();
        std::thread::sleep(Duration::from_millis(1200));
        assert_eq!(rules(&sb).as_array().unwrap().len(), n_rules, "a half-written new file was applied");
        assert_eq!(denied_through(&sb), 0, "a half-written new file opened the deny");
        f.write_all(&edited.as_bytes()[cut_at..]).unwrap();
    }
    wait_for(|| rule(&rules(&sb), "203.0.113.0/24").is_some_and(|r| r["burst"] == 40), "the whole new file applied");
    assert_eq!(rules(&sb).as_array().unwrap().len(), n_rules);

    // The directory replaced under the same path.
    let new = dir.path.join("etc.new");
    std::fs::create_dir(&new).unwrap();
    std::fs::write(
        new.join("policer.toml"),
        format!("{CONFIG}\n[[rule]]\nprefix = \"198.19.0.0/24\"\nrate = \"2kpps\"\n"),
    )
    .unwrap();
    std::fs::rename(&etc, dir.path.join("etc.old")).unwrap();
    std::fs::rename(&new, &etc).unwrap();
    wait_for(
        || {
            let r = rules(&sb);
            rule(&r, "198.19.0.0/24").is_some() && rule(&r, "198.18.0.0/24").is_none()
        },
        "the replaced directory's config",
    );
    assert!(denied_through(&sb) > 0);
    // Edits in the new directory are followed; the old one's are not.
    std::fs::write(dir.path.join("etc.old/policer.toml"), eight_rules()).unwrap();
    let now = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("{now}\n[[rule]]\nprefix = \"198.20.0.0/24\"\naction = \"deny\"\n")).unwrap();
    wait_for(|| rule(&rules(&sb), "198.20.0.0/24").is_some(), "an edit in the new directory");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_none(), "the old directory's file was applied");
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

/// A start that must fail: how it ended, and how long it took.
fn failed_start(sb: &Sandbox, config: &Path) -> (policer_tests::daemon::Exited, Duration) {
    let t = Instant::now();
    let c = config.to_str().unwrap();
    let args = ["attach", &sb.rx_if, "--config", c, "--interval", "0"];
    match Daemon::try_start(&policer_tests::daemon::policer_bin(), &sb.rx_ns, &args, &[]) {
        Ok(d) => panic!("started with {}:\n{}", config.display(), d.stdout()),
        Err(e) => (e, t.elapsed()),
    }
}

/// Review of issue 41, point 10: a start given `--max-sources` outside
/// 1 ..= 16777216 fails at once with the one message of the bound (0 said
/// "must be at least 1" before; too large names what it would take), and
/// attaches nothing.
#[test]
fn a_start_refuses_a_max_sources_outside_the_bound() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgmaxs");
    let dir = Dir::new("maxs");
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let c = config.to_str().unwrap();
    for (n, would) in [("0", None), ("16777217", Some("16777217 would take 2817 MiB"))] {
        let args = ["attach", &sb.rx_if, "--config", c, "--interval", "0", "--max-sources", n];
        let e = match Daemon::try_start(&policer_tests::daemon::policer_bin(), &sb.rx_ns, &args, &[]) {
            Ok(d) => panic!("started with --max-sources {n}:\n{}", d.stdout()),
            Err(e) => e,
        };
        assert!(e.stderr.contains("--max-sources must be 1 to 16777216 (the source tables"), "{}", e.stderr);
        assert_eq!(e.stderr.contains("would take"), would.is_some(), "{}", e.stderr);
        if let Some(w) = would {
            assert!(e.stderr.contains(w), "{}", e.stderr);
        }
        assert_eq!(sb.rx_xdp(), None);
    }
}

/// Review of issue 41, point 10: the loader does not bound the table's
/// size itself. A start adopting a running program loads with that
/// program's size, which an older build may have made past today's bound
/// (its maps are reused); refusing it there named a flag nobody gave and
/// made such a box impossible to adopt. The bound is the operator's
/// values' (`a_start_refuses_a_max_sources_outside_the_bound`).
#[test]
fn the_loader_takes_a_size_past_the_bound_as_an_adopted_program_has_it() {
    if !privileged("config tier") {
        return;
    }
    use policer_user::loader::{LoadOptions, Policer};
    let n = policer_common::MAX_SOURCES + 1;
    let p = Policer::load(&LoadOptions { max_sources: n, ..Default::default() }).expect("a size past the bound");
    assert_eq!(p.max_sources().unwrap(), n);
}

/// The peak resident memory of a process, in kB (VmHWM).
fn peak_rss_kb(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Issue 26, point 2: a config that is a FIFO, or a link to /dev/zero,
/// and a set's state file that is a FIFO, fail the start at once, named
/// (not a start that hangs in open(2), or reads without end); nothing is
/// attached.
#[test]
fn a_config_or_set_file_that_is_not_a_file_fails_the_start_at_once() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgfifo");
    let dir = Dir::new("fifo");
    let config = dir.path.join("policer.toml");
    mkfifo(&config);
    let (e, took) = failed_start(&sb, &config);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(!e.status.success());
    let want = format!("{} is a FIFO, not a regular file", config.display());
    assert!(e.stderr.contains(&want), "{}\n{}", e.stdout, e.stderr);
    assert_eq!(sb.rx_xdp(), None);

    std::fs::remove_file(&config).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &config).unwrap();
    let (e, took) = failed_start(&sb, &config);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let want = format!("{} is a character device, not a regular file", config.display());
    assert!(e.stderr.contains(&want), "{}\n{}", e.stdout, e.stderr);
    assert_eq!(sb.rx_xdp(), None);

    // A good config, and a FIFO where a set's state file would be.
    std::fs::remove_file(&config).unwrap();
    std::fs::write(&config, CONFIG).unwrap();
    let sets = dir.path.join("policer.sets");
    std::fs::create_dir(&sets).unwrap();
    mkfifo(&sets.join("feed.set"));
    let (e, took) = failed_start(&sb, &config);
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let want = format!("set state file {} is a FIFO, not a regular file", sets.join("feed.set").display());
    assert!(e.stderr.contains(&want), "{}\n{}", e.stdout, e.stderr);
    assert_eq!(sb.rx_xdp(), None);
    assert_eq!(std::fs::read_to_string(&config).unwrap(), CONFIG);
}

/// A followed config replaced by a FIFO does not block the owner: `rule
/// set` answers (refused for the file, applied with --runtime), status
/// says why, and SIGTERM still detaches. Replaced by a link to /dev/zero:
/// refused, and the daemon's memory does not grow.
#[test]
fn a_followed_config_replaced_by_a_fifo_or_dev_zero_blocks_nothing() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgfifo2");
    let dir = Dir::new("fifo2");
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let mut d = attach(&sb, &config);
    let c = config.to_str().unwrap();
    let status = || -> serde_json::Value { serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap() };

    std::fs::remove_file(&config).unwrap();
    mkfifo(&config);
    // Nothing finished writing a FIFO, so the follower does not look; a
    // reload and a change do, and answer at once.
    let t = Instant::now();
    fails_with(&cli(&sb, &["--timeout", "5", "reload"]), &format!("{c} is a FIFO, not a regular file"));
    let why = status()["config_status"]["last_reload_error"].as_str().unwrap().to_string();
    assert!(why.contains(&format!("{c} is a FIFO, not a regular file")), "{why}");
    let out = cli(&sb, &["--timeout", "5", "rule", "set", "198.51.100.0/24", "--action", "deny"]);
    fails_with(&out, "is a FIFO, not a regular file");
    fails_with(&out, "nothing changed");
    succeeds(&cli(&sb, &["--timeout", "5", "rule", "set", "198.51.100.0/24", "--action", "deny", "--runtime"]));
    assert!(t.elapsed() < Duration::from_secs(4), "rule set took {:?}", t.elapsed());
    assert!(rule(&rules(&sb), "198.51.100.0/24").is_some());

    // A link to /dev/zero (a finished name: the follower reads it):
    // refused, no memory taken reading it.
    let before = peak_rss_kb(d.pid());
    std::fs::remove_file(&config).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &config).unwrap();
    wait_for(
        || status()["config_status"]["last_reload_error"].as_str().is_some_and(|e| e.contains("character device")),
        "the link to /dev/zero shows in status",
    );
    fails_with(&cli(&sb, &["--timeout", "5", "reload"]), "is a character device, not a regular file");
    std::thread::sleep(Duration::from_millis(500));
    let after = peak_rss_kb(d.pid());
    assert!(after < before + 16 * 1024, "peak RSS grew from {before} kB to {after} kB");

    // SIGTERM still stops it, detached (no --persist).
    assert!(d.stop_with(libc::SIGTERM), "{}", d.stdout());
    assert_eq!(sb.rx_xdp(), None, "the program stayed attached");
}

/// Issue 26: a ban that ends while the config file cannot be written (a
/// full disk) ends in the kernel at once; `rule ls` shows it neither in
/// force nor as "removed at runtime"; and the file catches up once there
/// is room, without another change to carry it.
#[test]
fn an_expiry_on_a_full_disk_lands_in_the_file_once_there_is_room() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgfull");
    let mut dir = Dir::new("full");
    dir.mount_tmpfs();
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let d = attach(&sb, &config);
    succeeds(&cli(&sb, &["ban", "198.18.0.0/24", "--for", "2s", "--reason", "short"]));
    assert!(std::fs::read_to_string(&config).unwrap().contains("198.18.0.0/24"));
    assert!(denied_through(&sb) == 0, "the ban is not in force");
    // Fill the filesystem.
    {
        use std::io::Write;
        let mut f = std::fs::File::create(dir.path.join("filler")).unwrap();
        let block = vec![0u8; 64 << 10];
        while f.write_all(&block).is_ok() {}
        while f.write_all(&block[..512]).is_ok() {}
        let _ = f.sync_all();
    }
    // The ban ends: in the kernel now, the file keeps it for lack of room.
    wait_for(|| denied_through(&sb) > 0, "the ended ban no longer drops");
    let all = rules(&sb);
    assert!(rule(&all, "198.18.0.0/24").is_none(), "the ended ban is listed: {all}");
    let st: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    assert_eq!(st["runtime_rules"], 0, "{st}");
    assert!(std::fs::read_to_string(&config).unwrap().contains("198.18.0.0/24"), "written with no room?");
    assert!(d.stderr().contains("removed in the kernel only"), "{}", d.stderr());
    // A change while the disk is full: refused with the reason, never in
    // force, and the log says it took no effect.
    let on_disk = std::fs::read_to_string(&config).unwrap();
    let out = cli(&sb, &["rule", "set", "198.18.0.0/24", "--action", "deny"]);
    fails_with(&out, "nothing changed");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_none(), "a refused change is in force");
    assert!(denied_through(&sb) > 0, "the refused deny drops frames");
    assert!(d.stderr().contains("none of them took effect"), "{}", d.stderr());
    assert_eq!(std::fs::read_to_string(&config).unwrap(), on_disk, "the file changed");
    // Room again: the file catches up by itself (tries back off from 1 s,
    // doubling: the disk was full for a few seconds, so within 10 s).
    std::fs::remove_file(dir.path.join("filler")).unwrap();
    wait_within(10, || !std::fs::read_to_string(&config).unwrap().contains("198.18.0.0/24"), "the file caught up");
    assert!(std::fs::read_to_string(&config).unwrap().contains("203.0.113.0/24"), "the other rules stay");
    // Said once the file is in place: a moment after it lands.
    wait_within(5, || d.stdout().contains("caught up"), "the log says the file caught up");
    assert!(rule(&rules(&sb), "198.18.0.0/24").is_none());
}

/// Issue 41, point 1: a hand-written last rule whose reason is a multi-line
/// string holding a line that starts with `[`. `rule set … --action deny`
/// and a ban answered, and were written inside the string: gone after a
/// restart. Now they land after it: still in force after a restart, and
/// `policer check` counts them.
#[test]
fn a_change_after_a_multi_line_reason_survives_a_restart() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgmlstr");
    let dir = Dir::new("mlstr");
    let config = dir.path.join("policer.toml");
    let text = format!(
        "{CONFIG}\n[[rule]]\nprefix = \"198.51.100.7\"\nban = true\nexpires = \"2099-01-01T00:00:00Z\"\n\
         reason = \"\"\"\n[INC-4711] scanner\n\"\"\"\n"
    );
    std::fs::write(&config, &text).unwrap();
    let mut d = attach(&sb, &config);
    succeeds(&cli(&sb, &["rule", "set", "10.77.0.0/16", "--action", "deny"]));
    succeeds(&cli(&sb, &["ban", "192.0.2.0/24", "--for", "1h"]));
    let written = std::fs::read_to_string(&config).unwrap();
    assert!(written.contains("[INC-4711] scanner\n\"\"\"\n"), "the string stays as it was:\n{written}");
    let check =
        || succeeds(&policer_tests::daemon::policer_in(&sb.rx_ns, &["check", "--config", config.to_str().unwrap()]));
    assert!(check().contains("ok: 5 rules"), "{}\n{written}", check());
    assert!(d.stop_with(libc::SIGTERM), "{}", d.stdout());

    let _d = attach(&sb, &config);
    let all = rules(&sb);
    assert_eq!(rule(&all, "10.77.0.0/16").map(|r| r["action"].clone()), Some("deny".into()), "{all}");
    assert_eq!(ban_count(&sb), 2, "{all}");
    assert!(check().contains("ok: 5 rules"), "{}", check());
}

/// Issue 41, point 5: a writer killed mid-file. A cut that lifts three
/// denies (valid TOML, an ordinary change: 4 of 12 rules go) and one that
/// leaves `burst = 1` of `burst = 100`, each closed without its final
/// newline: neither is followed, the kernel keeps the rules in force (the
/// deny still drops real frames), each is logged once, and the whole file
/// written back is applied. An explicit `policer reload` of such an
/// ordinary change applies it (the operator says the file is finished).
#[test]
fn a_followed_cut_file_without_its_newline_changes_nothing() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgcut2");
    let dir = Dir::new("cut2");
    let config = dir.path.join("policer.toml");
    let mut whole = CONFIG.to_string();
    for i in 1..=5 {
        whole.push_str(&format!("\n[[rule]]\nprefix = \"198.19.{i}.0/24\"\nrate = \"{i}kpps\"\nburst = 100\n"));
    }
    for i in [3, 2, 1, 0] {
        whole.push_str(&format!("\n[[rule]]\nprefix = \"198.18.{i}.0/24\"\naction = \"deny\"\n"));
    }
    whole.push_str("\n[[rule]]\nprefix = \"198.20.0.0/24\"\nrate = \"1kpps\"\nburst = 100\n");
    std::fs::write(&config, &whole).unwrap();
    let d = attach(&sb, &config);
    let n = rules(&sb).as_array().unwrap().len();
    assert_eq!(n, 12);
    assert_eq!(denied_through(&sb), 0);
    let refused = |why: &str| wait_for(|| d.stdout().contains(why), why);

    // Cut after the first deny: the three after it (198.18.0.0/24 with
    // them) would be lifted.
    let lifts = whole.find("action = \"deny\"").unwrap() + "action = \"deny\"".len();
    std::fs::write(&config, &whole[..lifts]).unwrap();
    refused("does not end with a newline");
    assert_eq!(rules(&sb).as_array().unwrap().len(), n, "the cut lifted denies");
    assert_eq!(denied_through(&sb), 0, "the cut opened a deny");

    // Cut inside the last value: `burst = 1`.
    let one = whole.len() - "00\n".len();
    assert!(whole[..one].ends_with("burst = 1"));
    std::fs::write(&config, &whole[..one]).unwrap();
    wait_for(|| d.stdout().matches("does not end with a newline").count() == 2, "the second cut refused");
    assert_eq!(rule(&rules(&sb), "198.20.0.0/24").unwrap()["burst"], 100, "the cut's burst was applied");
    // The same cut closed again: not looked at again, not logged again
    // (asserted once the next write is applied: the daemon handles the
    // file's events in order, so this one was handled before it).
    std::fs::write(&config, &whole[..one]).unwrap();

    // The whole file back, with a change: applied.
    let edited = whole.replace(
        "prefix = \"198.20.0.0/24\"\nrate = \"1kpps\"\nburst = 100",
        "prefix = \"198.20.0.0/24\"\nrate = \"1kpps\"\nburst = 90",
    );
    std::fs::write(&config, &edited).unwrap();
    wait_for(|| rule(&rules(&sb), "198.20.0.0/24").is_some_and(|r| r["burst"] == 90), "the whole file applied");
    assert_eq!(d.stdout().matches("does not end with a newline").count(), 2, "{}", d.stdout());
    assert_eq!(rules(&sb).as_array().unwrap().len(), n);
    assert_eq!(denied_through(&sb), 0);

    // An explicit reload of an ordinary change without the newline: applied.
    std::fs::write(&config, edited.trim_end_matches('\n').replace("burst = 90", "burst = 80")).unwrap();
    wait_for(|| d.stdout().matches("does not end with a newline").count() == 3, "followed: refused");
    succeeds(&cli(&sb, &["reload"]));
    assert_eq!(rule(&rules(&sb), "198.20.0.0/24").unwrap()["burst"], 80);
}

/// Review of issue 41, point 5: a followed file cut without its final
/// newline is refused as such before its sets' list files are read: a set
/// whose file is missing does not mask the refusal (nor cost the reads).
/// The same file whole is refused for the set, which shows the set error
/// was there to mask it.
#[test]
fn a_followed_cut_file_is_refused_before_its_sets_are_read() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgcut3");
    let dir = Dir::new("cut3");
    let config = dir.path.join("policer.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let d = attach(&sb, &config);
    let n = rules(&sb).as_array().unwrap().len();
    let with_set = format!("{CONFIG}\n[[set]]\nname = \"deny\"\nfile = \"missing-list.txt\"\naction = \"deny\"\n");
    std::fs::write(&config, with_set.trim_end_matches('\n')).unwrap();
    wait_for(|| d.stdout().contains("does not end with a newline"), "the cut refused as a cut");
    assert!(!d.stdout().contains("missing-list.txt"), "the set's error masked the cut:\n{}", d.stdout());
    std::fs::write(&config, &with_set).unwrap();
    wait_for(|| d.stdout().contains("missing-list.txt"), "the whole file refused for its set");
    assert_eq!(rules(&sb).as_array().unwrap().len(), n);
}

/// Issue 41, point 10: `max_sources = 4294967295` passed `policer check`
/// and a reload, and the next start failed with ENOMEM. `check` refuses it
/// with the bound and what it would take; a size at the bound passes.
#[test]
fn check_refuses_a_max_sources_no_start_can_load() {
    let dir = Dir::new("maxsrc");
    std::fs::set_permissions(&dir.path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path.join("big.toml");
    std::fs::write(&file, CONFIG.replace("[daemon]\n", "[daemon]\nmax_sources = 4294967295\n")).unwrap();
    let out = check_as_nobody(&file, false);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("daemon.max_sources must be 1 to 16777216") && err.contains("4294967295 would take 720896 MiB"),
        "{err}"
    );
    std::fs::write(&file, CONFIG.replace("[daemon]\n", "[daemon]\nmax_sources = 16777216\n")).unwrap();
    let out = check_as_nobody(&file, false);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Issue 43, point 9: `attach --rate/--burst` over a config with tuned
/// default rules says what it changed (old → new), in the log and the
/// audit trail, as any other change does; the same flags again change
/// nothing and say nothing. On traffic: the default rule in force is the
/// flags' (a source at 400 pps passes whole under 1000pps, where the file's
/// 100pps dropped most of it).
#[test]
fn attach_rate_over_a_tuned_config_says_what_it_changed() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("cfgrate");
    let dir = Dir::new("rate");
    let config = dir.path.join("policer.toml");
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100pps\"\nburst = 50\n\n[[rule]]\nprefix = \"::/0\"\nrate = \
         \"100pps\"\nburst = 50\n\n[[rule]]\nprefix = \"192.0.2.0/24\"\naction = \"deny\"\n",
    )
    .unwrap();
    let c = config.to_str().unwrap();
    let args = ["attach", &sb.rx_if, "--config", c, "--interval", "0", "--rate", "1000pps", "--burst", "100"];
    let mut d = Daemon::start(&sb.rx_ns, &args);
    let said = |d: &Daemon| d.stdout().lines().filter(|l| l.contains("--rate/--burst changed")).count();
    wait_for(|| said(&d) == 1, "the start says what --rate changed");
    let out = d.stdout();
    let line = out.lines().find(|l| l.contains("--rate/--burst changed")).unwrap();
    assert!(line.contains("change by policer attach"), "{line}");
    for want in ["0.0.0.0/0: burst 50 → 100, rate 100pps → 1kpps", "::/0: burst 50 → 100, rate 100pps → 1kpps"]
    {
        assert!(line.contains(want), "lacks '{want}': {line}");
    }
    assert!(!line.contains("192.0.2.0/24"), "a rule --rate does not touch is not a change: {line}");
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("rate = \"1kpps\"") && text.contains("192.0.2.0/24"), "{text}");
    let flows = [Flow { src: ip("198.18.0.9"), pps: 400.0, len: 64 }];
    let (sent, got) = traffic::run(&sb, &flows, Duration::from_secs(1));
    assert!(sent.sent[0] > 300, "sent {:?}", sent.sent);
    assert_eq!(got.per_flow[0], sent.sent[0], "the flags' 1000pps is in force");
    // The file's other rules stand (and `inspect` speaks English: issue
    // 43, point 15).
    let i = succeeds(&cli(&sb, &["inspect", "192.0.2.7"]));
    assert!(i.contains("(a deny rule has no bucket)"), "{i}");
    d.stop_with(libc::SIGTERM);
    // The same flags over the file they wrote: nothing to say.
    // (Said before "policing", which `start` waits for.)
    let d = Daemon::start(&sb.rx_ns, &args);
    assert_eq!(said(&d), 0, "a start that changes nothing said it changed something:\n{}", d.stdout());
}

/// Issue 43, point 15: a CrowdSec key file others may read is warned of,
/// as policer.toml(5) says (mode 0600), by `policer check` (and at a
/// start); not refused (a key that worked must not fail the next start);
/// at 0600, no warning. The secret is never quoted.
#[test]
fn check_warns_of_a_crowdsec_key_file_others_may_read() {
    let dir = Dir::new("cskey");
    let key = dir.path.join("crowdsec.key");
    std::fs::write(&key, "s3cretkey\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let file = dir.path.join("policer.toml");
    std::fs::write(
        &file,
        format!("{CONFIG}\n[crowdsec]\nlapi_url = \"http://127.0.0.1:8080/\"\napi_key_file = \"crowdsec.key\"\n"),
    )
    .unwrap();
    let check = || Command::new(policer_tests::daemon::policer_bin()).args(["check", "--config"]).arg(&file).output();
    let out = check().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let want = format!("warning: crowdsec.api_key_file: {} is mode 0644", key.display());
    assert!(err.contains(&want) && err.contains("chmod 600"), "{err}");
    assert!(!err.contains("s3cretkey"), "{err}");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = check().unwrap();
    assert!(out.status.success() && out.stderr.is_empty(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A budget leased from the fleet's Redis (`global = "…"`) added by a
/// reload to a daemon started without `[global]`: refused whole, nothing
/// changed. The leases start with the daemon; before, the reload took the
/// rule and each node held the whole budget, silently.
#[test]
fn a_reload_adding_a_fleet_budget_to_a_daemon_without_leases_is_refused() {
    if !privileged("config tier") {
        return;
    }
    let sb = Sandbox::new("glob");
    let plain = "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1000pps\"\n\n";
    std::fs::write(&sb.config, plain).unwrap();
    let _d = Daemon::attach(&sb, &["--interval", "0"]);
    let before = rules(&sb);
    let fleet = "[global]\nredis_url = \"redis://127.0.0.1:6379/0\"\nnode_id = \"edge1\"\n\n";
    let budget = "[[rule]]\nprefix = \"198.18.0.0/16\"\nproto = \"udp\"\nrate = \"100pps\"\ntotal_rate = \"5kpps\"\n\
                  global = \"dns\"\n";
    std::fs::write(&sb.config, format!("{fleet}{plain}{budget}")).unwrap();
    let out = cli(&sb, &["reload"]);
    fails_with(&out, "198.18.0.0/16: global = \"dns\": this daemon was started without a [global] table");
    fails_with(&out, "nothing changed");
    assert_eq!(rules(&sb), before, "a refused reload changed the rules");
    // Without the budget's rule, the file reloads.
    std::fs::write(&sb.config, format!("{fleet}{plain}")).unwrap();
    succeeds(&cli(&sb, &["reload"]));
}
