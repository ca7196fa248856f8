//! Tier 3, fleet: the Debian package `cargo xtask dist` builds (installed
//! into a scratch root with dpkg, never the host's database) and the
//! Kubernetes manifests in deploy/kubernetes (validated offline with
//! kubernetes-validate, which bundles the schemas; the oldest Kubernetes
//! supported, 1.27). `cargo xtask test` builds the package and installs
//! kubernetes-validate before this tier; missing either is a skip, and a
//! failure under CI.

use std::{
    fs,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use policer_tests::{daemon::policer_bin, privileged, skip};

const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The oldest Kubernetes the manifests are validated against.
const KUBERNETES: &str = "1.27.0";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| workspace().join("target"), PathBuf::from)
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

/// The package `cargo xtask dist` built, if any.
fn deb() -> Option<PathBuf> {
    let p = target_dir().join(format!("dist/policer_{VERSION}_amd64.deb"));
    if p.exists() {
        Some(p)
    } else {
        skip(&format!("dist: skipped: {} missing: run `cargo xtask dist`", p.display()));
        None
    }
}

/// A scratch root with an empty dpkg database.
struct Root(PathBuf);

impl Root {
    fn new(name: &str) -> Root {
        let dir = std::env::temp_dir().join(format!("policer-dist-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        for d in ["var/lib/dpkg/info", "var/lib/dpkg/updates"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        fs::write(dir.join("var/lib/dpkg/status"), "").unwrap();
        Root(dir)
    }

    /// `dpkg --root=DIR` with the maintainer scripts run outside a chroot
    /// (the scratch root has no shell) and `DPKG_ROOT` set, which the
    /// scripts honour by leaving the host's systemd alone; the log goes
    /// nowhere, so the host's /var/log/dpkg.log is untouched. The scratch
    /// root has no iproute2, hence `--force-depends`.
    fn dpkg(&self, args: &[&str]) -> Output {
        let mut c = Command::new("dpkg");
        c.arg(format!("--root={}", self.0.display()))
            .args(["--force-script-chrootless", "--force-depends", "--log=/dev/null"])
            .args(args);
        run(&mut c)
    }

    /// Every path under the root outside dpkg's own directories.
    fn files(&self) -> Vec<String> {
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                let rel = p.strip_prefix(base).unwrap().to_string_lossy().into_owned();
                if rel.starts_with("var") {
                    continue;
                }
                if p.is_dir() && !p.is_symlink() {
                    walk(base, &p, out);
                }
                out.push(rel);
            }
        }
        let mut out = Vec::new();
        walk(&self.0, &self.0, &mut out);
        out.sort();
        out
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Installs, checks what is installed, purges: nothing is left.
#[test]
fn deb_installs_into_a_scratch_root_and_purges_cleanly() {
    if !privileged("dist") {
        return;
    }
    let Some(deb) = deb() else { return };
    let root = Root::new("install");
    root.dpkg(&["-i", deb.to_str().unwrap()]);
    let status = run(Command::new("dpkg-query")
        .arg(format!("--admindir={}", root.0.join("var/lib/dpkg").display()))
        .args(["-W", "-f=${Status} ${Version}", "policer"]));
    assert_eq!(text(&status), format!("install ok installed {VERSION}"));

    let files: Vec<String> = root.files().into_iter().filter(|f| !Path::new(&root.0.join(f)).is_dir()).collect();
    let mut want: Vec<String> = [
        "etc/fail2ban/action.d/policer.conf",
        "etc/policer/policer.toml",
        "lib/systemd/system/policer.service",
        "usr/bin/policer",
        "usr/lib/policer/policer.bpf.o",
        "usr/share/bash-completion/completions/policer",
        "usr/share/doc/policer/copyright",
        "usr/share/doc/policer/examples/grafana-dashboard.json",
        "usr/share/doc/policer/examples/prometheus-alerts.yaml",
        "usr/share/fish/vendor_completions.d/policer.fish",
        "usr/share/zsh/vendor-completions/_policer",
    ]
    .map(String::from)
    .to_vec();
    let pages: Vec<&String> = files.iter().filter(|f| f.starts_with("usr/share/man/man8/")).collect();
    assert!(pages.iter().any(|f| *f == "usr/share/man/man8/policer.8.gz"), "no policer(8): {files:?}");
    assert!(pages.iter().any(|f| *f == "usr/share/man/man8/policer-attach.8.gz"), "no policer-attach(8): {files:?}");
    assert!(pages.iter().all(|f| f.ends_with(".8.gz")), "{pages:?}");
    want.extend(pages.iter().map(|s| s.to_string()));
    want.push("usr/share/man/man5/policer.toml.5.gz".into());
    // The README and every design note.
    want.push("usr/share/doc/policer/README.md".into());
    for e in fs::read_dir(workspace().join("docs")).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            want.push(format!("usr/share/doc/policer/docs/{name}"));
        }
    }
    want.sort();
    assert_eq!(files, want);

    // The default config is a conffile and valid as shipped, and polices
    // every source and nothing else: the two default rules, the examples
    // commented out.
    let shipped = fs::read_to_string(root.0.join("etc/policer/policer.toml")).unwrap();
    let rules: Vec<&str> = shipped.lines().filter(|l| l.trim_start().starts_with("prefix =")).collect();
    assert_eq!(rules, ["prefix = \"0.0.0.0/0\"", "prefix = \"::/0\""], "{shipped}");
    let conffiles = fs::read_to_string(root.0.join("var/lib/dpkg/info/policer.conffiles")).unwrap();
    assert_eq!(conffiles.trim(), "/etc/policer/policer.toml\n/etc/fail2ban/action.d/policer.conf");
    // fail2ban's action as the repository has it (tested in feeds).
    assert_eq!(
        fs::read(root.0.join("etc/fail2ban/action.d/policer.conf")).unwrap(),
        fs::read(workspace().join("deploy/fail2ban/action.d/policer.conf")).unwrap()
    );
    // The XDP object as a file: the binary's own, an ELF for BPF.
    let object = fs::read(root.0.join("usr/lib/policer/policer.bpf.o")).unwrap();
    assert_eq!(&object[..4], b"\x7fELF", "the object is an ELF file");
    assert_eq!(u16::from_le_bytes([object[18], object[19]]), 247, "e_machine EM_BPF");
    run(Command::new(root.0.join("usr/bin/policer"))
        .args(["check", "--config"])
        .arg(root.0.join("etc/policer/policer.toml")));
    // The unit runs the packaged binary, with --persist (so postinst may
    // restart it on upgrade without an unpoliced window).
    let unit = fs::read_to_string(root.0.join("lib/systemd/system/policer.service")).unwrap();
    let exec = unit.lines().find(|l| l.starts_with("ExecStart=")).unwrap();
    assert!(exec.starts_with("ExecStart=/usr/bin/policer attach "), "{exec}");
    assert!(exec.contains("--persist"), "{exec}");
    assert!(!unit.contains("/usr/local"), "{unit}");

    root.dpkg(&["-P", "policer"]);
    assert_eq!(root.files(), Vec::<String>::new(), "left behind after purge");
    let status = Command::new("dpkg-query")
        .arg(format!("--admindir={}", root.0.join("var/lib/dpkg").display()))
        .args(["-W", "policer"])
        .output()
        .unwrap();
    assert!(!status.status.success(), "still known to dpkg: {}", text(&status));
}

/// What only the tests and the benchmark may carry: the daemon's
/// `POLICER_TEST_*` variables (policer-user's `test-hooks` feature) and the
/// XDP object's `BENCH_SOURCES` (the benchmark's own build of the object).
/// The product has neither, not even as a string. (lifecycle finds the
/// first in the binary the tiers run, so the search itself can succeed.)
const HOOKS: [&str; 2] = ["POLICER_TEST_", "BENCH_SOURCES"];

/// The hooks `bin` carries.
fn hooks_in(bin: &Path) -> Vec<&'static str> {
    HOOKS.into_iter().filter(|h| policer_tests::file_contains(bin, h.as_bytes())).collect()
}

/// The packaged binary is static (musl), runs, and carries no test or
/// bench hooks; nor does the static build (the dist profile) it was
/// stripped from.
#[test]
fn deb_binary_is_static_runs_and_carries_no_hooks() {
    if !privileged("dist") {
        return;
    }
    let Some(deb) = deb() else { return };
    let root = Root::new("static");
    // Unpacking alone (dpkg-deb -x) is enough to look at the binary.
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root.0));
    let bin = root.0.join("usr/bin/policer");
    let v = run(Command::new(&bin).arg("--version"));
    assert_eq!(text(&v).trim(), format!("policer {VERSION}"));
    // ldd exits non-zero on a static binary: "not a dynamic executable"
    // for a static one, "statically linked" for a static PIE (what Rust's
    // musl target links).
    let ldd = Command::new("ldd").arg(&bin).output().unwrap();
    let says = text(&ldd);
    assert!(says.contains("not a dynamic executable") || says.contains("statically linked"), "ldd says: {says}");
    assert!(!says.contains("=>"), "ldd lists libraries: {says}");
    assert_eq!(hooks_in(&bin), Vec::<&str>::new(), "the packaged {} carries hooks", bin.display());
    let unstripped = target_dir().join("x86_64-unknown-linux-musl/dist/policer");
    assert!(unstripped.exists(), "{} missing, though `cargo xtask dist` built the package", unstripped.display());
    assert_eq!(hooks_in(&unstripped), Vec::<&str>::new(), "{} carries hooks", unstripped.display());
}

/// A release build of `policer` (what `cargo xtask install` installs and
/// the benchmark and soak measure) carries no test or bench hooks: no
/// workspace member turns policer-user's `test-hooks` feature on.
#[test]
fn release_binary_carries_no_test_or_bench_hooks() {
    let bin = target_dir().join("release/policer");
    if !bin.exists() {
        skip(&format!("dist: skipped: {} missing: `cargo build --release -p policer-user`", bin.display()));
        return;
    }
    assert_eq!(hooks_in(&bin), Vec::<&str>::new(), "{} carries hooks", bin.display());
}

/// The maintainer scripts are POSIX shell and never stop a running
/// policer on upgrade.
#[test]
fn deb_maintainer_scripts_keep_policing_on_upgrade() {
    if !privileged("dist") {
        return;
    }
    let Some(deb) = deb() else { return };
    let root = Root::new("scripts");
    run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(root.0.join("DEBIAN")));
    for s in ["postinst", "prerm", "postrm"] {
        let p = root.0.join("DEBIAN").join(s);
        run(Command::new("sh").arg("-n").arg(&p));
        let body = fs::read_to_string(&p).unwrap();
        assert!(body.contains("[ -z \"$DPKG_ROOT\" ] || exit 0"), "{s} ignores DPKG_ROOT");
    }
    // Run as dpkg runs them on a systemd host, in a private mount namespace
    // whose /run has /run/systemd/system, with `systemctl` and `ip` replaced
    // by stubs that log their arguments: what an upgrade, a first install and
    // a removal do. (The detach on removal calls /usr/bin/policer, not
    // stubbed: it refuses programs that are not policer's.)
    let stubs = root.0.join("stubs");
    fs::create_dir_all(&stubs).unwrap();
    let log = root.0.join("calls.log");
    for (name, extra) in [
        ("systemctl", ""),
        // One interface with a policer program attached.
        ("ip", "echo '2: eth9: <BROADCAST,UP> mtu 1500 xdp/id:42 qdisc noqueue'\n"),
    ] {
        let stub = stubs.join(name);
        fs::write(&stub, format!("#!/bin/sh\necho \"{name} $*\" >> {}\n{extra}", log.display())).unwrap();
        run(Command::new("chmod").arg("755").arg(&stub));
    }
    let scripts = root.0.join("DEBIAN");
    let calls = |script: &str, args: &str| -> String {
        let _ = fs::remove_file(&log);
        let inner = format!(
            "mount -t tmpfs none /run && mkdir -p /run/systemd/system && PATH={stubs}:/usr/bin:/bin DPKG_ROOT= sh {script} {args}",
            stubs = stubs.display(),
            script = scripts.join(script).display(),
        );
        // A new network namespace too: whatever the scripts run touches no host interface.
        run(Command::new("unshare").args(["-m", "-n", "--propagation", "private", "sh", "-c", &inner]));
        fs::read_to_string(&log).unwrap_or_default()
    };
    // An upgrade: postinst restarts a running daemon (which adopts the
    // attached program), prerm does nothing; nothing is stopped.
    let upgrade = calls("prerm", "upgrade 0.0.9") + &calls("postinst", "configure 0.0.9");
    assert!(upgrade.contains("systemctl try-restart policer.service"), "{upgrade}");
    assert!(
        !upgrade.contains(" stop") && !upgrade.contains("policer detach"),
        "an upgrade stopped policing: {upgrade}"
    );
    // A first install enables, starts nothing.
    let first = calls("postinst", "configure");
    assert!(first.contains("systemctl enable policer.service"), "{first}");
    assert!(!first.contains("start") && !first.contains("restart"), "{first}");
    // A removal stops the daemon, and looks for what --persist left.
    let remove = calls("prerm", "remove");
    assert!(remove.contains("systemctl stop policer.service"), "{remove}");
    assert!(remove.contains("ip -o link show"), "{remove}");
}

fn kubernetes() -> PathBuf {
    workspace().join("deploy/kubernetes")
}

/// kubernetes-validate: `KUBERNETES_VALIDATE`, the venv `cargo xtask test`
/// installs, or the PATH.
fn kubernetes_validate() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KUBERNETES_VALIDATE") {
        return Some(p.into());
    }
    let venv = target_dir().join("tools/venv/bin/kubernetes-validate");
    if venv.exists() {
        return Some(venv);
    }
    if Command::new("kubernetes-validate").arg("--version").output().is_ok_and(|o| o.status.success()) {
        return Some("kubernetes-validate".into());
    }
    skip("kubernetes: skipped: no kubernetes-validate (`cargo xtask test` installs it)");
    None
}

/// The Kubernetes manifests with a bundled schema (all but the PodMonitor,
/// a CRD kubernetes-validate has no schema for).
const MANIFESTS: &[&str] = &["namespace.yaml", "configmap.yaml", "daemonset.yaml"];

#[test]
fn kubernetes_manifests_validate_strictly() {
    let Some(kv) = kubernetes_validate() else { return };
    let mut c = Command::new(&kv);
    c.args(["--strict", "-k", KUBERNETES]).args(MANIFESTS.iter().map(|m| kubernetes().join(m)));
    let o = run(&mut c);
    let out = text(&o);
    for m in MANIFESTS {
        assert!(out.contains(&format!("{m} passed")), "{m} not validated: {out}");
    }
    // And --strict does refuse a field the schema lacks (so a pass means
    // something): the DaemonSet with a misspelt container field.
    let dir = std::env::temp_dir().join(format!("policer-k8s-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("daemonset.yaml");
    let ds = fs::read_to_string(kubernetes().join("daemonset.yaml")).unwrap();
    fs::write(&bad, ds.replacen("imagePullPolicy:", "imagePulPolicy:", 1)).unwrap();
    let o = Command::new(&kv).args(["--strict", "-k", KUBERNETES]).arg(&bad).output().unwrap();
    let _ = fs::remove_dir_all(&dir);
    assert!(!o.status.success(), "a misspelt field passed: {}", text(&o));
}

/// The ConfigMap's `policer.toml` block, dedented.
fn configmap_config() -> String {
    let yaml = fs::read_to_string(kubernetes().join("configmap.yaml")).unwrap();
    let mut lines = yaml.lines().skip_while(|l| l.trim_end() != "  policer.toml: |").skip(1);
    let mut out = String::new();
    for l in lines.by_ref() {
        if l.is_empty() {
            out.push('\n');
        } else if let Some(rest) = l.strip_prefix("    ") {
            out.push_str(rest);
            out.push('\n');
        } else {
            break;
        }
    }
    assert!(out.contains("[[rule]]"), "no config in configmap.yaml");
    out
}

#[test]
fn kubernetes_configmap_config_passes_check() {
    let dir = std::env::temp_dir().join(format!("policer-k8s-cfg-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("policer.toml");
    fs::write(&cfg, configmap_config()).unwrap();
    let o = Command::new(policer_bin()).args(["check", "--config"]).arg(&cfg).output().unwrap();
    let _ = fs::remove_dir_all(&dir);
    assert!(o.status.success(), "policer check refused the ConfigMap's config: {}", text(&o));
    let config = configmap_config();
    let rules: Vec<&str> = config.lines().filter(|l| l.trim_start().starts_with("prefix =")).collect();
    assert_eq!(rules, ["prefix = \"0.0.0.0/0\"", "prefix = \"::/0\""], "the ConfigMap polices, nothing else");
}

/// What the DaemonSet promises: not privileged, the needed capabilities
/// only, metrics on the node's address, probes on /healthz, the config as a
/// directory (no subPath), the socket on the host.
#[test]
fn kubernetes_daemonset_shape() {
    let ds = fs::read_to_string(kubernetes().join("daemonset.yaml")).unwrap();
    let yaml: Vec<&str> = ds.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    let has = |s: &str| yaml.iter().any(|l| l.contains(s));
    assert!(!has("subPath"), "subPath mounts never update");
    assert!(has("privileged: false") && !has("privileged: true"));
    assert!(has(r#"drop: ["ALL"]"#));
    assert!(has(r#"add: ["BPF", "NET_ADMIN", "SYS_ADMIN"]"#));
    assert!(has("type: RuntimeDefault"));
    assert!(has("hostNetwork: true"));
    assert!(has("priorityClassName: system-node-critical"));
    assert!(has("- operator: Exists"));
    assert!(has("maxUnavailable: 1"));
    assert!(has("fieldPath: status.hostIP"));
    assert!(has("- $(HOST_IP):9477"));
    assert!(has("- --persist"));
    assert_eq!(yaml.iter().filter(|l| l.contains("path: /healthz")).count(), 2, "liveness and readiness");
    assert!(has("path: /run/policer"));
    assert!(has("mountPath: /etc/policer"));
    // The port the probes, the annotation and the PodMonitor use is the
    // one --metrics binds.
    assert!(has(r#"prometheus.io/port: "9477""#) && has("containerPort: 9477"));
    let pm = fs::read_to_string(kubernetes().join("podmonitor.yaml")).unwrap();
    assert!(pm.contains("kind: PodMonitor") && pm.contains("- port: metrics"));
}

/// The unit's LimitNOFILE holds both full connection caps beside the
/// daemon's own fds (about 50 at start; 200 allowed here), so the daemon
/// lowers no cap under systemd.
#[test]
fn the_units_fd_limit_holds_the_connection_caps() {
    let unit = fs::read_to_string(workspace().join("deploy/policer.service")).unwrap();
    let n: u64 = unit.lines().find_map(|l| l.strip_prefix("LimitNOFILE=")).expect("LimitNOFILE").parse().unwrap();
    let (caps, why) = policer_user::daemon::fit_connection_caps(n, 200, true);
    assert!(why.is_none(), "LimitNOFILE={n}: {why:?}");
    assert_eq!(caps, policer_user::daemon::Caps { control: 512, http: 512 });
}

/// `cargo xtask image`: FROM scratch, the static binary and the default
/// config, entrypoint policer, at most 10 MB. (Not run with podman here:
/// the image's files are checked through `buildah mount`.)
#[test]
fn image_is_scratch_small_and_runs_policer() {
    if !privileged("image") {
        return;
    }
    let Some(_) = Command::new("buildah").arg("--version").output().ok().filter(|o| o.status.success()) else {
        skip("image: skipped: no buildah (`cargo xtask test` installs it)");
        return;
    };
    let name = format!("localhost/policer:{VERSION}");
    let list = Command::new("buildah").args(["images", "--json", &name]).output().unwrap();
    if !list.status.success() {
        skip(&format!("image: skipped: no {name}: run `cargo xtask image`"));
        return;
    }
    let images: serde_json::Value = serde_json::from_slice(&list.stdout).unwrap();
    let img = &images[0];
    let names: Vec<&str> = img["names"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert!(names.contains(&name.as_str()) && names.contains(&"localhost/policer:latest"), "{names:?}");
    // "11.1 MB": buildah's decimal units. Under 12 MB: the Redis client (fleet budgets) and the SYN program took it past 10.
    let size = img["size"].as_str().unwrap();
    let (n, unit) = size.split_once(' ').unwrap();
    let bytes = n.parse::<f64>().unwrap()
        * match unit {
            "B" => 1.0,
            "kB" => 1e3,
            "MB" => 1e6,
            other => panic!("image of {n} {other}"),
        };
    assert!(bytes <= 12e6, "image is {size}");
    let entry = run(Command::new("buildah").args([
        "inspect",
        "--type",
        "image",
        "--format",
        "{{.OCIv1.Config.Entrypoint}}",
        &name,
    ]));
    assert_eq!(text(&entry).trim(), "[/usr/bin/policer]");

    let ctr = text(&run(Command::new("buildah").args(["from", &name]))).trim().to_string();
    let mnt = Command::new("buildah").args(["mount", &ctr]).output().unwrap();
    let result = std::panic::catch_unwind(|| {
        let root = PathBuf::from(text(&mnt).trim());
        let mut files = Vec::new();
        fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(base, &p, out);
                } else {
                    out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
                }
            }
        }
        walk(&root, &root, &mut files);
        files.sort();
        assert_eq!(files, ["etc/policer/policer.toml", "usr/bin/policer"], "FROM scratch: only these");
        let v = run(Command::new(root.join("usr/bin/policer")).arg("--version"));
        assert_eq!(text(&v).trim(), format!("policer {VERSION}"));
        run(Command::new(root.join("usr/bin/policer"))
            .args(["check", "--config"])
            .arg(root.join("etc/policer/policer.toml")));
    });
    let _ = Command::new("buildah").args(["umount", &ctr]).output();
    let _ = Command::new("buildah").args(["rm", &ctr]).output();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// The image under podman as the DaemonSet runs it: not privileged, every
/// capability dropped but BPF, NET_ADMIN and SYS_ADMIN, the default
/// seccomp profile, the host's /run/policer. It attaches, the CLI outside
/// the container reaches it through the socket, and a stop detaches
/// (no --persist here). This VM's podman quirks: `--runtime runc` (crun
/// rejects its hybrid cgroups) and ulimits no higher than the host's.
#[test]
fn image_runs_under_podman_with_three_capabilities() {
    if !privileged("image") {
        return;
    }
    if !Command::new("podman").arg("--version").output().is_ok_and(|o| o.status.success()) {
        skip("image: skipped: no podman (`cargo xtask test` installs it)");
        return;
    }
    let name = format!("localhost/policer:{VERSION}");
    if !Command::new("podman").args(["image", "exists", &name]).status().unwrap().success() {
        skip(&format!("image: skipped: no {name}: run `cargo xtask image`"));
        return;
    }
    let id = std::process::id();
    let ns = format!("pol-pod-{id}");
    let ctr = format!("policer-test-{id}");
    let dir = std::env::temp_dir().join(format!("policer-pod-{id}"));
    fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("policer.toml");
    fs::write(
        &cfg,
        "[daemon]\ninterfaces = [\"pa\"]\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1000pps\"\nburst = 10\n",
    )
    .unwrap();
    run(Command::new("ip").args(["netns", "add", &ns]));
    let cleanup = || {
        let _ = Command::new("podman").args(["rm", "-f", "-t", "0", &ctr]).output();
        let _ = Command::new("ip").args(["netns", "del", &ns]).output();
        let _ = fs::remove_dir_all(&dir);
    };
    let result = std::panic::catch_unwind(|| {
        run(Command::new("ip").args(["-n", &ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"]));
        run(Command::new("ip").args(["-n", &ns, "link", "set", "pa", "up"]));
        run(Command::new("ip").args(["-n", &ns, "link", "set", "pb", "up"]));
        fs::create_dir_all("/run/policer").unwrap();
        run(Command::new("podman")
            .args(["run", "-d", "--name", &ctr, "--runtime", "runc"])
            .args(["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"])
            .arg(format!("--network=ns:/run/netns/{ns}"))
            .args(["--cap-drop", "ALL", "--cap-add", "BPF,NET_ADMIN,SYS_ADMIN", "--read-only"])
            .arg("-v")
            .arg(format!("{}:/etc/policer:ro", dir.display()))
            .args(["-v", "/run/policer:/run/policer", &name])
            .args(["attach", "--config", "/etc/policer/policer.toml", "--interval", "0"]));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let attached = || {
            let o = Command::new("ip").args(["-n", &ns, "-d", "link", "show", "pa"]).output().unwrap();
            String::from_utf8_lossy(&o.stdout).contains("prog/xdp")
        };
        while !attached() {
            let logs = Command::new("podman").args(["logs", &ctr]).output().unwrap();
            assert!(std::time::Instant::now() < deadline, "not attached in 20 s: {}", text(&logs));
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        // The CLI on the host, in the same network namespace, reaches the
        // daemon in the container through the shared /run/policer.
        let status = run(Command::new("ip").args(["netns", "exec", &ns]).arg(policer_bin()).arg("status"));
        assert!(text(&status).contains("interfaces: pa (native)"), "{}", text(&status));
        run(Command::new("podman").args(["stop", "-t", "10", &ctr]));
        let logs = run(Command::new("podman").args(["logs", &ctr]));
        assert!(text(&logs).contains("detached from pa"), "{}", text(&logs));
        assert!(!attached(), "still attached after the container stopped");
    });
    cleanup();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}

/// The image polices real traffic, counted on the receiving side, and a
/// second container adopts the first one's buckets: the first runs with
/// `--persist` and is stopped, the program stays attached and policing,
/// the second finds it and takes its maps over. One source at 20x a rule
/// of 10 pps, burst 100 (a full bucket is 10 s of debt): through the first
/// container it gets rate x T + burst; after the hand-over only what its
/// bucket drained in between, where a fresh bucket would hand it another
/// burst of 100.
#[test]
fn image_polices_traffic_and_a_second_container_adopts_the_buckets() {
    use policer_tests::{netns::Sandbox, traffic};
    if !privileged("image") {
        return;
    }
    if !Command::new("podman").arg("--version").output().is_ok_and(|o| o.status.success()) {
        skip("image: skipped: no podman (`cargo xtask test` installs it)");
        return;
    }
    let name = format!("localhost/policer:{VERSION}");
    if !Command::new("podman").args(["image", "exists", &name]).status().unwrap().success() {
        skip(&format!("image: skipped: no {name}: run `cargo xtask image`"));
        return;
    }
    let sb = Sandbox::new("pod");
    let id = std::process::id();
    let (a, b) = (format!("policer-a-{id}"), format!("policer-b-{id}"));
    let dir = std::env::temp_dir().join(format!("policer-adopt-{id}"));
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("policer.toml"),
        format!(
            "[daemon]\ninterfaces = [\"{}\"]\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"10pps\"\nburst = 100\n",
            sb.rx_if
        ),
    )
    .unwrap();
    fs::create_dir_all("/run/policer").unwrap();
    let start = |ctr: &str, persist: bool| {
        let mut c = Command::new("podman");
        c.args(["run", "-d", "--name", ctr, "--runtime", "runc"])
            .args(["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"])
            .arg(format!("--network=ns:/run/netns/{}", sb.rx_ns))
            .args(["--cap-drop", "ALL", "--cap-add", "BPF,NET_ADMIN,SYS_ADMIN", "--read-only"])
            .arg("-v")
            .arg(format!("{}:/etc/policer:ro", dir.display()))
            .args(["-v", "/run/policer:/run/policer", &name])
            .args(["attach", "--config", "/etc/policer/policer.toml", "--interval", "0"]);
        if persist {
            c.arg("--persist");
        }
        run(&mut c);
        // Policing once the daemon answers on its socket.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let st = Command::new("ip").args(["netns", "exec", &sb.rx_ns]).arg(policer_bin()).arg("status").output();
            if st.is_ok_and(|o| o.status.success() && text(&o).contains(&sb.rx_if)) {
                break;
            }
            let logs = Command::new("podman").args(["logs", ctr]).output().unwrap();
            assert!(std::time::Instant::now() < deadline, "{ctr} not policing in 20 s: {}", text(&logs));
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let cleanup = || {
        for c in [&a, &b] {
            let _ = Command::new("podman").args(["rm", "-f", "-t", "0", c]).output();
        }
        let _ = fs::remove_dir_all(&dir);
    };
    let result = std::panic::catch_unwind(|| {
        let src: std::net::IpAddr = "198.18.7.1".parse().unwrap();
        let flows = [traffic::Flow { src, pps: 200.0, len: 64 }];
        start(&a, true);
        let (sent1, got1) = traffic::run(&sb, &flows, std::time::Duration::from_secs(2));
        assert_eq!(got1.socket_drops, 0);
        let budget1 = 10.0 * sent1.span_secs(0) + 100.0;
        eprintln!("container A: sent {}, admitted {}, budget {budget1:.0}", sent1.sent[0], got1.per_flow[0]);
        assert!((got1.per_flow[0] as f64 - budget1).abs() <= 3.0, "admitted {}, budget {budget1:.0}", got1.per_flow[0]);
        // Hand over: A stops (the program stays: --persist), B adopts.
        let t = std::time::Instant::now();
        run(Command::new("podman").args(["stop", "-t", "10", &a]));
        assert!(sb.rx_xdp().is_some(), "--persist: still attached after the container stopped");
        start(&b, false);
        let logs = run(Command::new("podman").args(["logs", &b]));
        assert!(text(&logs).contains("adopting the policer already running"), "{}", text(&logs));
        let (sent2, got2) = traffic::run(&sb, &flows, std::time::Duration::from_secs(2));
        let gap = t.elapsed().as_secs_f64() - sent2.span_secs(0);
        assert_eq!(got2.socket_drops, 0);
        // The adopted bucket: full at the hand-over, drained 10 per second
        // since; a fresh one would admit 100 more.
        let adopted = 10.0 * (gap + sent2.span_secs(0));
        eprintln!(
            "container B (adopted): sent {}, admitted {}, at most {adopted:.0} with the adopted bucket, {:.0} with a fresh one \
             (hand-over {gap:.1} s)",
            sent2.sent[0],
            got2.per_flow[0],
            100.0 + 10.0 * sent2.span_secs(0)
        );
        assert!(gap < 8.0, "the hand-over took {gap:.1} s: the bucket drained too far to tell");
        // (+5: the receiver's grace after phase 1 drains a little more.)
        assert!(got2.per_flow[0] as f64 <= adopted + 5.0, "admitted {}: a fresh bucket, not adopted", got2.per_flow[0]);
        run(Command::new("podman").args(["stop", "-t", "10", &b]));
        assert!(sb.rx_xdp().is_none(), "the second container (no --persist) detached on stop");
    });
    cleanup();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
}
