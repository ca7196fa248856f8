//! Running the real `policer` binary as a separate process, the way a
//! user does: `ip netns exec NS policer ...`.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Output, Stdio},
    sync::{Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

/// The `policer` binary under test: `$POLICER_BIN`, else the workspace's
/// debug build (`cargo xtask test` builds it first).
pub fn policer_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("POLICER_BIN") {
        return p.into();
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/debug/policer");
    assert!(p.exists(), "{} missing: build it first (`cargo xtask test` does)", p.display());
    p
}

/// Runs `policer ARGS` inside `ns` to completion.
pub fn policer_in(ns: &str, args: &[&str]) -> Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(policer_bin())
        .args(with_state_dir(args))
        .stdin(Stdio::null())
        .output()
        .expect("run policer")
}

/// The state directory tests give a daemon of config `config`: beside it,
/// `X.toml` → `X.state` (never the shared default, /var/lib/policer).
pub fn state_dir_of(config: &str) -> std::path::PathBuf {
    std::path::Path::new(config).with_extension("state")
}

/// Where that daemon keeps its sets' state files.
pub fn sets_dir_of(config: &str) -> std::path::PathBuf {
    state_dir_of(config).join("sets")
}

/// `attach ... --config C` without `--state-dir` gets `--state-dir` of C.
fn with_state_dir(args: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if args.first() == Some(&"attach")
        && !args.iter().any(|a| a.starts_with("--state-dir"))
        && let Some(i) = args.iter().position(|a| *a == "--config")
        && let Some(c) = args.get(i + 1)
    {
        v.push("--state-dir".into());
        v.push(state_dir_of(c).display().to_string());
    }
    v
}

/// How a `policer attach` that never started policing ended.
#[derive(Debug)]
pub struct Exited {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

/// A running `policer attach`; killed on drop if still running.
pub struct Daemon {
    child: Child,
    pub out: Arc<Mutex<Vec<String>>>,
    pub err: Arc<Mutex<Vec<String>>>,
}

fn collect(r: impl std::io::Read + Send + 'static, into: Arc<Mutex<Vec<String>>>) {
    thread::spawn(move || {
        for line in BufReader::new(r).lines().map_while(Result::ok) {
            into.lock().unwrap().push(line);
        }
    });
}

impl Daemon {
    /// Starts `policer ARGS` in `ns` and waits until it reports that it is
    /// policing; panics with its output if it exits first.
    pub fn start(ns: &str, args: &[&str]) -> Daemon {
        Daemon::start_bin(&policer_bin(), ns, args)
    }

    /// [`Daemon::start`] with another `policer` binary.
    pub fn start_bin(bin: &std::path::Path, ns: &str, args: &[&str]) -> Daemon {
        match Daemon::try_start(bin, ns, args, &[]) {
            Ok(d) => d,
            Err(e) => panic!("policer exited ({}) before policing:\n{}\n{}", e.status, e.stdout, e.stderr),
        }
    }

    /// Starts `policer ARGS` in `ns` with extra environment variables:
    /// the daemon once it reports that it is policing, or how it exited
    /// before (a start expected to fail).
    pub fn try_start(bin: &std::path::Path, ns: &str, args: &[&str], envs: &[(&str, &str)]) -> Result<Daemon, Exited> {
        let mut enter = Command::new("ip");
        enter.args(["netns", "exec", ns]);
        Daemon::try_start_with(enter, bin, args, envs)
    }

    /// [`Daemon::try_start`] through `nsenter --net`: the network namespace
    /// alone, the host's mounts kept (bpffs pins shared with the host and
    /// its tools, as on a real host; `ip netns exec` gives each process a
    /// /sys of its own: docs/platform.md), with extra environment variables.
    pub fn try_start_nsenter(
        bin: &std::path::Path,
        ns: &str,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Daemon, Exited> {
        let mut enter = Command::new("nsenter");
        enter.arg(format!("--net=/run/netns/{ns}"));
        Daemon::try_start_with(enter, bin, args, envs)
    }

    fn try_start_with(
        mut enter: Command,
        bin: &std::path::Path,
        args: &[&str],
        envs: &[(&str, &str)],
    ) -> Result<Daemon, Exited> {
        // An older build (an upgrade test) knows no --state-dir.
        let args =
            if bin == policer_bin() { with_state_dir(args) } else { args.iter().map(|a| a.to_string()).collect() };
        let mut child = enter
            .arg(bin)
            .args(&args)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn policer");
        let out = Arc::new(Mutex::new(Vec::new()));
        let err = Arc::new(Mutex::new(Vec::new()));
        collect(child.stdout.take().unwrap(), out.clone());
        collect(child.stderr.take().unwrap(), err.clone());
        Daemon::wait_until_policing(Daemon { child, out, err }, Instant::now())
    }

    fn wait_until_policing(mut d: Daemon, t0: Instant) -> Result<Daemon, Exited> {
        loop {
            if d.stdout().contains("policer: policing") {
                return Ok(d);
            }
            if let Ok(Some(status)) = d.child.try_wait() {
                // Let the readers take the last lines.
                thread::sleep(Duration::from_millis(100));
                return Err(Exited { status, stdout: d.stdout(), stderr: d.stderr() });
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "policer did not start:\n{}", d.stdout());
            thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stdout(&self) -> String {
        self.out.lock().unwrap().join("\n")
    }

    pub fn stderr(&self) -> String {
        self.err.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` and waits for the exit; returns whether it exited 0.
    /// Its exit status once it has exited (after its last lines are read).
    pub fn try_wait(&mut self) -> Option<std::process::ExitStatus> {
        let st = self.child.try_wait().ok().flatten()?;
        thread::sleep(Duration::from_millis(100));
        Some(st)
    }

    pub fn stop_with(&mut self, sig: i32) -> bool {
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(self.pid(), sig) };
        let t0 = Instant::now();
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                thread::sleep(Duration::from_millis(100));
                return st.success();
            }
            if t0.elapsed() > Duration::from_secs(10) {
                let _ = self.child.kill();
                return false;
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Daemon {
    /// `policer attach RX_IF --config SANDBOX_CONFIG ARGS...` in the
    /// sandbox's receiving namespace.
    pub fn attach(sb: &crate::netns::Sandbox, args: &[&str]) -> Daemon {
        Daemon::attach_bin(&policer_bin(), sb, args)
    }

    /// [`Daemon::attach`] with another `policer` binary.
    pub fn attach_bin(bin: &std::path::Path, sb: &crate::netns::Sandbox, args: &[&str]) -> Daemon {
        let mut v = vec!["attach", sb.rx_if.as_str(), "--config", sb.config.as_str()];
        v.extend_from_slice(args);
        Daemon::start_bin(bin, &sb.rx_ns, &v)
    }
}

/// `policer ARGS` in the sandbox's receiving namespace (CLI verbs).
pub fn cli(sb: &crate::netns::Sandbox, args: &[&str]) -> Output {
    policer_in(&sb.rx_ns, args)
}

/// Asserts `out` failed cleanly with `needle` in its message.
pub fn fails_with(out: &Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure ({needle}), got success: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(err.contains(needle), "stderr lacks '{needle}': {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

/// Asserts `out` succeeded; returns its stdout.
pub fn succeeds(out: &Output) -> String {
    assert!(out.status.success(), "failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// GET http://127.0.0.1:PORT/metrics from inside `ns` (a daemon started
/// with `--metrics PORT`); the body, after checking the status is 200.
pub fn scrape(ns: &str, port: u16) -> String {
    use std::io::{Read, Write};
    let ns = ns.to_string();
    std::thread::spawn(move || {
        crate::netns::enter(&ns).unwrap();
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).unwrap();
        let (head, body) = body.split_once("\r\n\r\n").expect("HTTP response");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        body.to_string()
    })
    .join()
    .unwrap()
}

/// `name{labels} value` lines of an exposition, keyed by `name{labels}`.
pub fn samples(text: &str) -> std::collections::HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' ').map(|(k, v)| (k.to_string(), v.parse().unwrap())))
        .collect()
}
