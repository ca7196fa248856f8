//! A real CrowdSec Local API (Debian's crowdsec 1.4.6), started by a test
//! inside one of its network namespaces, and the `cscli` calls that feed it.
//!
//! The binaries come from the Debian package unpacked (not installed) by
//! `cargo xtask setup` into `target/tools/crowdsec/` ([`crowdsec_dir`]);
//! [`available`] says whether a test can run. [`Lapi::start`] writes a
//! config of its own in a temporary directory (no online API, sqlite and
//! data under that directory, an empty hub index, listening on
//! `0.0.0.0:PORT` of the namespace), registers a machine (a watcher:
//! [`Lapi::machine`]), runs `crowdsec -c CFG -no-cs` (the Local API alone)
//! with `ip netns exec NS` and waits until `GET /health` answers. Every
//! `cscli` runs in the same namespace. Dropping it kills the LAPI and
//! removes the directory.
//!
//! A daemon in the same namespace reaches it at [`Lapi::url`]
//! (`http://127.0.0.1:PORT/`); one in another namespace joined by
//! [`link_namespaces`] at [`Lapi::url_at`] with the LAPI side's address.
//!
//! What 1.4.6 does, measured (see tests/tests/feeds.rs for the checks):
//! - `GET /v1/decisions/stream?startup=true|false` with `X-Api-Key` replies
//!   `{"deleted": [...] | null, "new": [...] | null}`; each decision has
//!   `id` (number), `value`, `scope` (`Ip`, `Range`), `type` (`ban`,
//!   `captcha`, ...), `duration` (Go's format of the time left:
//!   `"59m59.2s"`, `"1h59m58.9s"`, negative in `deleted`), `origin`
//!   (`cscli`, `cscli-import`, or what a watcher's alert said) and
//!   `scenario` (the reason). A delete shows in `deleted` of the next
//!   non-startup pulls (more than once), and in a startup pull's `deleted`.
//! - `POST /v1/watchers/login` needs a `User-Agent` of the form
//!   `NAME/VERSION` (exactly one `/`): without one, 401 as for a wrong
//!   password (the LAPI logs "bad user agent").
//! - `cscli decisions list` and `cscli alerts list` ask for
//!   `include_capi=false` unless given `--all` (`GET
//!   /v1/alerts?has_active_decision=true&include_capi=false&limit=100`,
//!   `?include_capi=false&limit=50`), and 1.4.6 then returns only alerts
//!   with a decision of origin `crowdsec` or `cscli`: an alert whose
//!   decisions are of origin `policer` (or `cscli-import`) is served to
//!   bouncers and listed by neither command without `--all` or
//!   `--origin`. `-o json` prints the alerts (`null` when none), each
//!   with `source`, `scenario`, `message`, `machine_id` and `decisions`.
//! - `cscli decisions import` ignores the CSV's `origin` (always
//!   `cscli-import`) and `scope` columns: a CIDR imported with
//!   `scope=range` (or `--scope range`) comes back with scope `Ip` and the
//!   CIDR as its value.

use std::{
    io::{Read, Write},
    net::{IpAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
    thread,
    time::{Duration, Instant},
};

/// Where `cargo xtask setup` unpacks CrowdSec's Debian package:
/// `$POLICER_CROWDSEC_DIR`, else `$CARGO_TARGET_DIR/tools/crowdsec`, else
/// the workspace's `target/tools/crowdsec`.
pub fn crowdsec_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("POLICER_CROWDSEC_DIR") {
        return d.into();
    }
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        return PathBuf::from(t).join("tools/crowdsec");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/crowdsec")
}

/// True when a test with a real LAPI can run here (root, and the CrowdSec
/// binaries unpacked); otherwise says why, and under CI fails
/// ([`crate::skip`]).
pub fn available(tier: &str) -> bool {
    if !crate::privileged(tier) {
        return false;
    }
    let bin = crowdsec_dir().join("usr/bin");
    if bin.join("crowdsec").exists() && bin.join("cscli").exists() {
        return true;
    }
    crate::skip(&format!(
        "{tier}: skipped: CrowdSec's binaries are not in {}: run `cargo xtask setup` (as root)",
        bin.display()
    ));
    false
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A running CrowdSec Local API in a network namespace; killed (and its
/// directory removed) on drop.
pub struct Lapi {
    ns: String,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    login: String,
    password: String,
    /// A bouncer key of the harness's own, for reading the whole answer
    /// around an import (made at the first import).
    check_key: std::sync::OnceLock<String>,
}

impl Lapi {
    /// Starts a fresh LAPI in namespace `ns` listening on `0.0.0.0:port`
    /// there, with one machine registered; returns once it answers.
    pub fn start(ns: &str, port: u16) -> Lapi {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("policer-lapi-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("data")).expect("create the LAPI's data dir");
        std::fs::create_dir_all(dir.join("hub")).expect("create the LAPI's hub dir");
        std::fs::write(dir.join("hub/.index.json"), "{}").expect("write the hub index");
        std::fs::write(dir.join("config.yaml"), config_yaml(&dir, port)).expect("write the LAPI config");
        let login = format!("policer-test-{n}");
        let mut lapi = Lapi {
            ns: ns.into(),
            port,
            dir,
            child: None,
            login,
            password: String::new(),
            check_key: Default::default(),
        };
        let creds = lapi.dir.join("local_api_credentials.yaml");
        let creds = creds.to_str().expect("a UTF-8 path").to_string();
        let login = lapi.login.clone();
        lapi.cscli(&["machines", "add", &login, "--auto", "-f", &creds]);
        let text = std::fs::read_to_string(&creds).expect("read the machine's credentials");
        lapi.password = text
            .lines()
            .find_map(|l| l.strip_prefix("password:"))
            .map(|p| p.trim().to_string())
            .unwrap_or_else(|| panic!("no password in {creds}: {text}"));
        lapi.spawn();
        lapi
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("lapi.log"))
            .expect("open the LAPI's log");
        // `ip netns exec` execs crowdsec itself: the child is the LAPI.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(crowdsec_dir().join("usr/bin/crowdsec"))
            .arg("-c")
            .arg(self.dir.join("config.yaml"))
            .arg("-no-cs")
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup the log"))
            .stderr(log)
            .spawn()
            .expect("spawn crowdsec");
        self.child = Some(child);
        let t0 = Instant::now();
        loop {
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                panic!("crowdsec exited ({st}) before answering:\n{}", self.log());
            }
            if self.try_http("GET", "/health", &[], None).is_some_and(|(code, _)| code == 200) {
                return;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "the LAPI did not answer in 20 s:\n{}", self.log());
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// The LAPI's URL from its own namespace: `http://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// Its URL at `addr` (an address of its namespace, e.g. the one
    /// [`link_namespaces`] gave it, for a daemon in the other namespace).
    pub fn url_at(&self, addr: IpAddr) -> String {
        match addr {
            IpAddr::V4(a) => format!("http://{a}:{}/", self.port),
            IpAddr::V6(a) => format!("http://[{a}]:{}/", self.port),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }

    /// The registered machine's (watcher's) login and password, for
    /// `POST /v1/watchers/login`.
    pub fn machine(&self) -> (String, String) {
        (self.login.clone(), self.password.clone())
    }

    /// The LAPI's own output so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("lapi.log")).unwrap_or_default()
    }

    /// Its temporary directory (config.yaml, data/crowdsec.db, the log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `cscli -c CFG ARGS` in the LAPI's namespace; its stdout, panicking
    /// with its output on failure.
    pub fn cscli(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(crowdsec_dir().join("usr/bin/cscli"))
            .arg("-c")
            .arg(self.dir.join("config.yaml"))
            .args(["--color", "no"])
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run cscli");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "cscli {}: {}\n{}", args.join(" "), stdout, String::from_utf8_lossy(&out.stderr));
        stdout
    }

    /// A new bouncer's API key (`cscli bouncers add NAME -o raw`).
    pub fn bouncer_key(&self, name: &str) -> String {
        let key = self.cscli(&["bouncers", "add", name, "-o", "raw"]).trim().to_string();
        assert!(!key.is_empty() && !key.contains(char::is_whitespace), "not a key: {key:?}");
        key
    }

    /// `cscli decisions add --ip IP --duration D` (a ban, origin `cscli`).
    pub fn add_ip(&self, ip: &str, duration: &str) {
        self.add_decision(&["--ip", ip, "--duration", duration]);
    }

    /// `cscli decisions add --range CIDR --duration D`.
    pub fn add_range(&self, cidr: &str, duration: &str) {
        self.add_decision(&["--range", cidr, "--duration", duration]);
    }

    /// `cscli decisions add ARGS` (e.g. `--type captcha`, `--reason R`).
    pub fn add_decision(&self, args: &[&str]) {
        let mut v = vec!["decisions", "add"];
        v.extend_from_slice(args);
        self.cscli(&v);
    }

    /// `cscli decisions delete --ip IP`.
    pub fn delete_ip(&self, ip: &str) {
        self.cscli(&["decisions", "delete", "--ip", ip]);
    }

    /// Writes `csv` (a header line, then rows; 1.4.6 reads the columns
    /// `value`, `duration`, `reason`, `type`, and ignores `origin` and
    /// `scope`: see the module doc) and runs `cscli decisions import -i
    /// FILE ARGS`; returns how many it says it imported.
    ///
    /// The LAPI's sqlite (WAL) refuses a write that meets another one
    /// ("database is locked", not waited for: a daemon's pull writes the
    /// bouncer's last pull while a long import runs; one CI run in many).
    /// An import refused so is not all or nothing (its decisions are
    /// written in batches), so it is taken again for the rows whose value
    /// the LAPI's whole answer did not hold before the import and does not
    /// hold yet, at most four times; the count returned is then of this
    /// CSV's rows the LAPI came to hold (a row whose value it held before
    /// counts only when an attempt says it imported it).
    pub fn import_csv(&self, csv: &str, args: &[&str]) -> usize {
        let before = self.held_values();
        let mut imported = 0;
        let mut todo = csv.to_string();
        for attempt in 1.. {
            match self.import_once(&todo, args) {
                Ok(n) => return imported + n,
                Err(said) if said.contains("database is locked") && attempt < 5 => {
                    eprintln!(
                        "cscli decisions import, attempt {attempt}: database is locked; again for what is missing"
                    );
                    std::thread::sleep(std::time::Duration::from_millis(500));
                    let held = self.held_values();
                    let mut lines = todo.lines();
                    let header = lines.next().unwrap_or_default();
                    let col = header.split(',').position(|c| c.trim() == "value").unwrap_or(0);
                    let rows: Vec<&str> = lines.filter(|l| !l.trim().is_empty()).collect();
                    let missing: Vec<&str> = rows
                        .iter()
                        .copied()
                        .filter(|l| {
                            l.split(',').nth(col).is_none_or(|v| before.contains(v.trim()) || !held.contains(v.trim()))
                        })
                        .collect();
                    imported += rows.len() - missing.len();
                    if missing.is_empty() {
                        return imported;
                    }
                    todo = std::iter::once(header).chain(missing).collect::<Vec<_>>().join("\n");
                }
                Err(said) => panic!("{said}"),
            }
        }
        unreachable!()
    }

    /// The values of every decision in the LAPI's whole answer, read with
    /// a key of the harness's own (no test's key's last pull moves).
    fn held_values(&self) -> std::collections::HashSet<String> {
        let key = self.check_key.get_or_init(|| self.bouncer_key("harness-import-check"));
        let whole = self.stream(key, true);
        whole["new"]
            .as_array()
            .map(|a| a.iter().filter_map(|d| d["value"].as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }

    fn import_once(&self, csv: &str, args: &[&str]) -> Result<usize, String> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let file = self.dir.join(format!("import-{n}.csv"));
        std::fs::write(&file, csv).expect("write the CSV");
        let file_s = file.to_str().expect("a UTF-8 path").to_string();
        let mut v = vec!["decisions", "import", "-i", &file_s];
        v.extend_from_slice(args);
        // cscli logs to stderr; run it here to read that line.
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(crowdsec_dir().join("usr/bin/cscli"))
            .arg("-c")
            .arg(self.dir.join("config.yaml"))
            .args(&v)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .expect("run cscli");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_file(&file);
        if !out.status.success() {
            return Err(format!("cscli {}: {said}", v.join(" ")));
        }
        // `... msg="3 decisions successfully imported"`
        Ok(said
            .split_once(" decisions successfully imported")
            .and_then(|(before, _)| before.rsplit(['"', ' ']).next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("cscli did not say how many it imported: {said}")))
    }

    /// SIGKILL: the LAPI stops answering at once, its database as it was.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again (killing it first if it runs): same database, same
    /// port, same machine and bouncers; returns once it answers.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Whether the LAPI process is running.
    pub fn running(&mut self) -> bool {
        self.child.as_mut().is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// A raw `GET /v1/decisions/stream?startup=...` with the bouncer key;
    /// panics unless it answers 200 with JSON.
    pub fn stream(&self, key: &str, startup: bool) -> serde_json::Value {
        let path = format!("/v1/decisions/stream?startup={startup}");
        let (code, body) = self.http("GET", &path, &[("X-Api-Key", key)], None);
        assert_eq!(code, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }

    /// One HTTP/1.1 request to the LAPI from inside its namespace: the
    /// status and the (de-chunked) body. Panics if it cannot connect.
    pub fn http(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Option<&str>) -> (u16, String) {
        self.try_http(method, path, headers, body)
            .unwrap_or_else(|| panic!("{method} {path}: the LAPI does not answer:\n{}", self.log()))
    }

    fn try_http(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> Option<(u16, String)> {
        http_in(&self.ns, ([127, 0, 0, 1], self.port).into(), method, path, headers, body)
    }
}

impl Drop for Lapi {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The config: the package's `etc/crowdsec/config.yaml` made local. No
/// `online_client` (offline; nothing registers), no acquisition (`-no-cs`
/// runs the API alone), no Prometheus listener, logs to stdout, sqlite
/// (with WAL) and every path under `dir`; the package's profiles and
/// simulation files.
fn config_yaml(dir: &Path, port: u16) -> String {
    let d = dir.display();
    let etc = crowdsec_dir().join("etc/crowdsec");
    let etc = etc.display();
    format!(
        "common:
  daemonize: false
  log_media: stdout
  log_level: info
  working_dir: .
config_paths:
  config_dir: {d}/
  data_dir: {d}/data/
  simulation_path: {etc}/simulation.yaml
  hub_dir: {d}/hub/
  index_path: {d}/hub/.index.json
  notification_dir: {d}/notifications/
  plugin_dir: {d}/plugins/
crowdsec_service:
  acquisition_path: {d}/acquis.yaml
cscli:
  output: human
  color: \"no\"
db_config:
  log_level: info
  type: sqlite
  use_wal: true
  db_path: {d}/data/crowdsec.db
  flush:
    max_items: 5000
    max_age: 7d
api:
  client:
    insecure_skip_verify: false
    credentials_path: {d}/local_api_credentials.yaml
  server:
    log_level: info
    listen_uri: 0.0.0.0:{port}
    profiles_path: {etc}/profiles.yaml
    console_path: {d}/console.yaml
    trusted_ips:
      - 127.0.0.1
      - ::1
prometheus:
  enabled: false
"
    )
}

/// The `User-Agent` [`http_in`] sends unless told another: 1.4.6 refuses a
/// watcher's login (401, "bad user agent") unless it is `NAME/VERSION`
/// (exactly one `/`); bouncers' pulls only draw a warning.
pub const USER_AGENT: &str = "policer-tests/0.1";

/// One HTTP/1.1 request (`Connection: close`) to `addr` from inside
/// namespace `ns` (a thread of its own enters it): the status and the
/// body, de-chunked. `None` if it cannot connect or the reply is cut.
/// Sends [`USER_AGENT`] unless `headers` has a `User-Agent`.
pub fn http_in(
    ns: &str,
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&str>,
) -> Option<(u16, String)> {
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("user-agent")) {
        req.push_str(&format!("User-Agent: {USER_AGENT}\r\n"));
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if let Some(b) = body {
        req.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()));
    }
    req.push_str("\r\n");
    if let Some(b) = body {
        req.push_str(b);
    }
    let ns = ns.to_string();
    thread::spawn(move || -> Option<(u16, String)> {
        crate::netns::enter(&ns).ok()?;
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        s.write_all(req.as_bytes()).ok()?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).ok()?;
        parse_response(&raw)
    })
    .join()
    .ok()
    .flatten()
}

/// Status and body of a whole HTTP/1.1 response (`Content-Length`,
/// chunked, or up to the close).
fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..split]).ok()?;
    let mut rest = &raw[split + 4..];
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    if !chunked {
        return Some((code, String::from_utf8_lossy(rest).into_owned()));
    }
    let mut body = Vec::new();
    loop {
        let eol = rest.windows(2).position(|w| w == b"\r\n")?;
        let size = std::str::from_utf8(&rest[..eol]).ok()?.split(';').next()?.trim();
        let size = usize::from_str_radix(size, 16).ok()?;
        rest = &rest[eol + 2..];
        if size == 0 {
            return Some((code, String::from_utf8_lossy(&body).into_owned()));
        }
        body.extend_from_slice(rest.get(..size)?);
        rest = rest.get(size + 2..)?;
    }
}

/// A peer that stands where the LAPI is and answers like a broken one: a
/// small HTTP/1.1 server in the namespace that passes each request to the
/// real LAPI ([`Proxy::pass`], as it starts) or answers with a status and
/// a body of the test's choosing ([`Proxy::answer`]: a `{"message":
/// "maintenance"}` with 200, as a LAPI behind a maintenance page does).
/// Stopped on drop.
pub struct Proxy {
    ns: String,
    port: u16,
    canned: std::sync::Arc<std::sync::Mutex<Option<(u16, String)>>>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
    /// Requests answered so far.
    served: std::sync::Arc<AtomicU32>,
}

impl Proxy {
    /// Listens on `127.0.0.1:port` of `ns`, passing requests to the LAPI
    /// on `127.0.0.1:upstream` of the same namespace.
    pub fn start(ns: &str, port: u16, upstream: u16) -> Proxy {
        use std::sync::{Arc, Mutex, atomic::AtomicBool};
        let canned: Arc<Mutex<Option<(u16, String)>>> = Arc::new(Mutex::new(None));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU32::new(0));
        let (tx, rx) = std::sync::mpsc::channel();
        let (c, st, sv, nsn) = (canned.clone(), stop.clone(), served.clone(), ns.to_string());
        let thread = thread::spawn(move || {
            let listener = crate::netns::enter(&nsn)
                .and_then(|()| std::net::TcpListener::bind(("127.0.0.1", port)))
                .and_then(|l| l.set_nonblocking(true).map(|()| l));
            let listener = match listener {
                Ok(l) => {
                    let _ = tx.send(Ok(()));
                    l
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                    return;
                }
            };
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let reply = c.lock().map(|g| g.clone()).unwrap_or(None);
                        Proxy::serve(conn, upstream, reply);
                        sv.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        rx.recv().expect("the proxy's thread").unwrap_or_else(|e| panic!("the proxy cannot listen on {port}: {e}"));
        Proxy { ns: ns.into(), port, canned, stop, thread: Some(thread), served }
    }

    fn serve(mut conn: TcpStream, upstream: u16, reply: Option<(u16, String)>) {
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_secs(5)));
        // The request's head (the feed's requests are GETs: no body).
        let mut head = Vec::new();
        let mut b = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut b) {
                Ok(0) | Err(_) => return,
                Ok(n) => head.extend_from_slice(&b[..n]),
            }
        }
        match reply {
            Some((code, body)) => {
                let _ = conn.write_all(
                    format!(
                        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
            None => {
                // Passed on with `Connection: close`, so the LAPI closes
                // after its answer and the copy ends.
                let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else { return };
                let mut req = head[..end + 2].to_vec();
                req.extend_from_slice(b"Connection: close\r\n\r\n");
                req.extend_from_slice(&head[end + 4..]);
                let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)) else { return };
                let _ = up.set_read_timeout(Some(Duration::from_secs(30)));
                if up.write_all(&req).is_ok() {
                    let _ = std::io::copy(&mut up, &mut conn);
                }
            }
        }
    }

    /// `http://127.0.0.1:PORT/`, for the daemon's `lapi_url`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    /// From now on, answers every request with `code` and `body`.
    pub fn answer(&self, code: u16, body: &str) {
        *self.canned.lock().expect("the proxy's reply") = Some((code, body.to_string()));
    }

    /// From now on, passes every request to the LAPI.
    pub fn pass(&self) {
        *self.canned.lock().expect("the proxy's reply") = None;
    }

    /// Requests answered so far.
    pub fn served(&self) -> u32 {
        self.served.load(Ordering::Relaxed)
    }

    pub fn ns(&self) -> &str {
        &self.ns
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

static LINKS: AtomicU32 = AtomicU32::new(0);

/// Joins namespaces `a_ns` and `b_ns` with a veth pair of their own and
/// addresses `10.250.X.Y/30` on each end (unique in this process): the
/// addresses of the `a` and the `b` end. Nothing to clean up: deleting
/// either namespace (a [`crate::netns::Sandbox`] does on drop) deletes
/// the pair.
pub fn link_namespaces(a_ns: &str, b_ns: &str) -> (IpAddr, IpAddr) {
    use crate::netns::{ip, ip_out};
    let n = LINKS.fetch_add(1, Ordering::Relaxed);
    assert!(n < 64 * 256, "too many links");
    let (x, y) = (n / 64, (n % 64) * 4);
    let a: IpAddr = format!("10.250.{x}.{}", y + 1).parse().unwrap();
    let b: IpAddr = format!("10.250.{x}.{}", y + 2).parse().unwrap();
    let tag = format!("{}{n}", std::process::id() % 100_000);
    let (a_if, b_if) = (format!("plka{tag}"), format!("plkb{tag}"));
    // A leftover of an interrupted run in one of them would make `add` fail.
    let _ = ip_out(&["-n", a_ns, "link", "del", &a_if]);
    ip(&["link", "add", &a_if, "netns", a_ns, "type", "veth", "peer", "name", &b_if, "netns", b_ns]);
    for (ns, ifc, addr) in [(a_ns, &a_if, a), (b_ns, &b_if, b)] {
        ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", ifc]);
        ip(&["-n", ns, "link", "set", ifc, "up"]);
        ip(&["-n", ns, "link", "set", "lo", "up"]);
    }
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::parse_response;

    #[test]
    fn responses_parse_plain_and_chunked() {
        let plain = b"HTTP/1.1 200 OK\r\nContent-Length: 15\r\n\r\n{\"status\":\"up\"}";
        assert_eq!(parse_response(plain), Some((200, "{\"status\":\"up\"}".into())));
        let chunked =
            b"HTTP/1.1 403 Forbidden\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked), Some((403, "{\"a\":1}".into())));
        assert_eq!(parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"), None, "cut");
        assert_eq!(parse_response(b"garbage"), None);
    }
}
