//! Tier 3: no client can stall the daemon. Real sockets against the real
//! `policer` binary: idle and trickling clients on the control socket and
//! on `/metrics`, clients that never read a large answer, oversized and
//! malformed requests — while `policer rule set` and `policer stats` run as
//! separate processes and must take at most 100 ms longer than without
//! them, counter lines keep their period, and SIGTERM ends the daemon
//! within a second.

use std::{
    fmt::Write as _,
    io::{ErrorKind, Read, Write},
    net::{Ipv4Addr, TcpStream},
    os::{linux::fs::MetadataExt, unix::net::UnixStream},
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use policer_tests::{
    daemon::{Daemon, cli, succeeds},
    netns::{Sandbox, enter},
    privileged,
};

const PORT: u16 = 9471;
/// Rules in the config: enough that `/metrics` is over 10 MB.
const RULES: u32 = 18_000;
const CLIENTS: usize = 100;
const INTERVAL_S: f64 = 0.5;

fn socket_of(sb: &Sandbox) -> PathBuf {
    let ino = std::fs::metadata(format!("/run/netns/{}", sb.rx_ns)).unwrap().st_ino();
    PathBuf::from(format!("/run/policer/ns-{ino}.sock"))
}

fn big_config(path: &str) {
    let mut s = String::from("[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nburst = 100\n\n");
    for i in 0..RULES {
        let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i);
        let _ = write!(s, "[[rule]]\nprefix = \"{a}/32\"\nrate = \"500pps\"\nburst = 50\n\n");
    }
    std::fs::write(path, s).unwrap();
}

/// Milliseconds each of `n` runs of `policer ARGS` took (each must succeed).
fn timed(sb: &Sandbox, n: usize, args: impl Fn(usize) -> Vec<String>) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let a = args(i);
            let a: Vec<&str> = a.iter().map(String::as_str).collect();
            let t0 = Instant::now();
            succeeds(&cli(sb, &a));
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Something that keeps `CLIENTS` bad connections open until stopped,
/// reconnecting whichever the daemon closes (its deadline), so the load
/// lasts as long as the measurement.
struct Load {
    stop: Arc<AtomicBool>,
    reconnects: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

#[derive(Clone, Copy)]
enum Kind {
    /// Connects and says nothing.
    Idle,
    /// Sends one byte of a request every second.
    Trickle,
    /// Sends a whole request for a large answer and never reads it.
    NoRead,
}

trait Conn: Read + Write + Send {
    fn nonblocking(&self);
}
impl Conn for UnixStream {
    fn nonblocking(&self) {
        let _ = self.set_nonblocking(true);
    }
}
impl Conn for TcpStream {
    fn nonblocking(&self) {
        let _ = self.set_nonblocking(true);
    }
}

impl Load {
    fn new() -> Load {
        Load { stop: Arc::new(AtomicBool::new(false)), reconnects: Arc::new(AtomicU64::new(0)), threads: vec![] }
    }

    /// A thread (in `ns` when given) holding `n` connections of `kind`.
    fn add<C: Conn + 'static>(
        &mut self,
        ns: Option<String>,
        n: usize,
        kind: Kind,
        connect: impl Fn() -> std::io::Result<C> + Send + 'static,
        request: &'static [u8],
    ) {
        let (stop, reconnects) = (self.stop.clone(), self.reconnects.clone());
        self.threads.push(thread::spawn(move || {
            if let Some(ns) = ns {
                enter(&ns).unwrap();
            }
            let open = || -> Option<(C, usize)> {
                let mut c = connect().ok()?;
                if let Kind::NoRead = kind {
                    c.write_all(request).ok()?;
                }
                c.nonblocking();
                Some((c, 0))
            };
            let mut conns: Vec<Option<(C, usize)>> = (0..n).map(|_| open()).collect();
            while !stop.load(Ordering::Relaxed) {
                for slot in conns.iter_mut() {
                    let alive = match slot {
                        Some((c, sent)) => {
                            let mut b = [0u8; 1];
                            let closed = match kind {
                                // Never read: only notice a reset when writing.
                                Kind::NoRead => c.write(b"x").is_err_and(|e| e.kind() != ErrorKind::WouldBlock),
                                _ => matches!(c.read(&mut b), Ok(0)),
                            };
                            if let Kind::Trickle = kind
                                && *sent < request.len()
                            {
                                match c.write(&request[*sent..*sent + 1]) {
                                    Ok(_) => *sent += 1,
                                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                                    Err(_) => {}
                                }
                            }
                            !closed
                        }
                        None => false,
                    };
                    if !alive {
                        reconnects.fetch_add(1, Ordering::Relaxed);
                        *slot = open();
                    }
                }
                thread::sleep(Duration::from_millis(1000));
            }
        }));
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.reconnects.load(Ordering::Relaxed)
    }
}

/// Seconds of each counter line ("[   1.5s] ...") printed so far.
fn counter_times(d: &Daemon) -> Vec<f64> {
    d.stdout()
        .lines()
        .filter_map(|l| l.strip_prefix('[')?.split_once("s]").map(|(t, _)| t.trim().parse::<f64>().ok()))
        .flatten()
        .collect()
}

fn metrics_len(ns: &str) -> usize {
    let ns = ns.to_string();
    thread::spawn(move || {
        enter(&ns).unwrap();
        let mut s = TcpStream::connect(("127.0.0.1", PORT)).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut body = Vec::new();
        s.read_to_end(&mut body).unwrap();
        body.len()
    })
    .join()
    .unwrap()
}

#[test]
fn slow_and_silent_clients_stall_nothing() {
    if !privileged("serving tier") {
        return;
    }
    let sb = Sandbox::new("srv");
    big_config(&sb.config);
    let interval = INTERVAL_S.to_string();
    let max_rules = (RULES + 1_000).to_string();
    let mut d = Daemon::attach(
        &sb,
        &["--mode", "native", "--interval", &interval, "--metrics", &PORT.to_string(), "--max-rules", &max_rules],
    );
    let body = metrics_len(&sb.rx_ns);
    assert!(body > 10_000_000, "/metrics is {body} bytes; the test wants a body over 10 MB");

    // `--runtime`: the change goes through the owner as any other, without
    // the format-preserving edit of this 18 000-rule file, whose own cost
    // (about a second in a debug build) varies between calls by more than
    // the 100 ms this test measures. The config tier tests the writes.
    let set = |i: usize| -> Vec<String> {
        ["rule", "set", &format!("198.18.{i}.0/24"), "--rate", "100pps", "--burst", "10", "--runtime"]
            .map(String::from)
            .to_vec()
    };
    let stats = |_| ["stats", "--json"].map(String::from).to_vec();
    // Warm up (page cache, first allocation of a large answer).
    timed(&sb, 2, stats);
    let mut base_set = timed(&sb, 6, set);
    let mut base_stats = timed(&sb, 6, stats);

    let sock = socket_of(&sb);
    let mut load = Load::new();
    let unix = move || UnixStream::connect(&sock);
    let tcp = || TcpStream::connect(("127.0.0.1", PORT));
    let control_req: &[u8] = b"{\"protocol\":2,\"op\":\"stats\"}\n";
    let http_req: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    load.add(None, CLIENTS, Kind::Idle, unix.clone(), control_req);
    load.add(None, CLIENTS, Kind::Trickle, unix.clone(), control_req);
    load.add(None, 1, Kind::NoRead, unix, control_req);
    let ns = Some(sb.rx_ns.clone());
    load.add(ns.clone(), CLIENTS, Kind::Idle, tcp, http_req);
    load.add(ns.clone(), CLIENTS, Kind::Trickle, tcp, http_req);
    load.add(ns, 1, Kind::NoRead, tcp, http_req);
    // Let every connection be made and the non-readers' answers (rendered
    // once each) fill their sockets.
    thread::sleep(Duration::from_secs(4));
    let lines_before = counter_times(&d).len();
    let t_load = Instant::now();
    let load_set = timed(&sb, 9, |i| set(i + 100));
    let load_stats = timed(&sb, 9, stats);
    // Hold the load over more than one request deadline.
    while t_load.elapsed() < Duration::from_secs(7) {
        thread::sleep(Duration::from_millis(100));
    }
    let times = counter_times(&d);
    let reconnects = load.stop();
    // The baseline again, after the load: the host's own noise (two cores,
    // other work) shows on both sides of the comparison.
    thread::sleep(Duration::from_secs(1));
    base_set.extend(timed(&sb, 6, |i| set(i + 200)));
    base_stats.extend(timed(&sb, 6, stats));
    // SIGTERM with bad clients connected again.
    let mut load = Load::new();
    let sock = socket_of(&sb);
    load.add(None, CLIENTS, Kind::Idle, move || UnixStream::connect(&sock), control_req);
    load.add(Some(sb.rx_ns.clone()), 1, Kind::NoRead, tcp, http_req);
    thread::sleep(Duration::from_secs(2));

    // SIGTERM with every bad client still connected.
    let t0 = Instant::now();
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(d.pid(), libc::SIGTERM) };
    let exited_clean = d.stop_with(0);
    let exit_s = t0.elapsed().as_secs_f64();
    load.stop();

    eprintln!(
        "rule set ms: base {base_set:.0?} load {load_set:.0?}\nstats ms: base {base_stats:.0?} load {load_stats:.0?}\n\
         /metrics {body} bytes; reconnects of cut-off clients {reconnects}; SIGTERM to exit {exit_s:.2} s"
    );
    for (what, base, load) in [("rule set", &base_set, &load_set), ("stats", &base_stats, &load_stats)] {
        assert!(
            median(load) <= median(base) + 100.0,
            "`policer {what}` took {:.0} ms under load against {:.0} ms without",
            median(load),
            median(base)
        );
    }
    // Counter lines kept their period through the load.
    let during: Vec<f64> = times[lines_before.saturating_sub(1)..].to_vec();
    assert!(during.len() >= 10, "too few counter lines under load: {during:?}");
    let worst = during.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    assert!(
        worst <= INTERVAL_S + 0.25,
        "a counter line came {worst:.2} s after the one before (period {INTERVAL_S} s)"
    );
    // The deadlines cut the silent clients off (they reconnected).
    assert!(reconnects >= CLIENTS as u64, "idle clients were never cut off ({reconnects} reconnects)");
    assert!(exited_clean, "the daemon did not exit cleanly on SIGTERM:\n{}", d.stderr());
    assert!(exit_s <= 1.0, "SIGTERM took {exit_s:.2} s to end the daemon");
}

/// Sends `bytes` on a fresh control connection; returns the reply line.
fn raw(sock: &PathBuf, bytes: &[u8]) -> String {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

fn rss_kib(pid: i32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn bad_requests_are_refused_and_cost_nothing() {
    if !privileged("serving tier") {
        return;
    }
    let sb = Sandbox::new("bad");
    let d = Daemon::attach(&sb, &["--rate", "1kpps", "--interval", "0"]);
    let sock = socket_of(&sb);
    let rss0 = rss_kib(d.pid());
    // 64 MiB without a newline: refused after the cap, not buffered.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(10))).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut sent = 0usize;
    for _ in 0..64 {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    let mut reply = String::new();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.read_to_string(&mut reply);
    assert!(reply.contains("larger than"), "oversized request: {reply:?} after {sent} bytes");
    let grown = rss_kib(d.pid()).saturating_sub(rss0);
    assert!(grown < 8 * 1024, "daemon grew {grown} KiB on an oversized request");

    // Not JSON; an older CLI without a protocol version; another protocol.
    assert!(raw(&sock, b"hello\n").contains("bad request"));
    assert!(raw(&sock, b"{\"op\":\"stats\"}\n").contains("another version"));
    assert!(raw(&sock, b"{\"protocol\":999,\"op\":\"stats\"}\n").contains("protocol 999"));
    // A request trickled slower than the deadline is dropped, with a reason.
    let mut s = UnixStream::connect(&sock).unwrap();
    let t0 = Instant::now();
    for b in b"{\"protocol\":2," {
        if s.write_all(&[*b]).is_err() {
            break;
        }
        thread::sleep(Duration::from_millis(500));
        if t0.elapsed() > Duration::from_secs(7) {
            break;
        }
    }
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = String::new();
    let _ = s.read_to_string(&mut r);
    assert!(r.contains("no whole request within"), "trickled request: {r:?}");
    // The daemon is still answering, and its socket is 0600.
    succeeds(&cli(&sb, &["status"]));
    let mode = std::fs::metadata(&sock).unwrap().st_mode() & 0o777;
    assert_eq!(mode, 0o600, "control socket mode {mode:o}");
}

#[test]
fn healthz_says_whether_every_interface_is_policed() {
    if !privileged("serving tier") {
        return;
    }
    let sb = Sandbox::new("hlz");
    let _d = Daemon::attach(&sb, &["--rate", "1kpps", "--interval", "0", "--metrics", "9472"]);
    let get = |path: &'static str| {
        let ns = sb.rx_ns.clone();
        thread::spawn(move || {
            enter(&ns).unwrap();
            let mut s = TcpStream::connect(("127.0.0.1", 9472)).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
        .join()
        .unwrap()
    };
    let ok = get("/healthz");
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    assert!(ok.contains("\"healthy\":true") && ok.contains(&format!("\"name\":\"{}\"", sb.rx_if)), "{ok}");
    // Someone removes the program behind the daemon's back: 503.
    policer_tests::netns::ip(&["-n", &sb.rx_ns, "link", "set", &sb.rx_if, "xdp", "off"]);
    let bad = get("/healthz");
    assert!(bad.starts_with("HTTP/1.1 503"), "{bad}");
    assert!(bad.contains("\"healthy\":false") && bad.contains("no XDP program is attached"), "{bad}");
    assert!(get("/nope").starts_with("HTTP/1.1 404"));
}

#[test]
fn a_change_that_times_out_may_still_apply_and_the_cli_says_so() {
    if !privileged("serving tier") {
        return;
    }
    let sb = Sandbox::new("tmo");
    let mut d = Daemon::attach(&sb, &["--rate", "1kpps", "--interval", "0"]);
    // A daemon that answers nothing (stopped), as a hung one would.
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(d.pid(), libc::SIGSTOP) };
    let t0 = Instant::now();
    let out = cli(&sb, &["--timeout", "1", "rule", "set", "203.0.113.0/24", "--rate", "10pps", "--burst", "5"]);
    let waited = t0.elapsed();
    policer_tests::daemon::fails_with(&out, "did not answer within 1.0 s; the change may still be applied");
    assert!(waited < Duration::from_secs(5), "the CLI waited {waited:?} with --timeout 1");
    let out = cli(&sb, &["--timeout", "1", "stats"]);
    policer_tests::daemon::fails_with(&out, "did not answer within 1.0 s");
    assert!(!String::from_utf8_lossy(&out.stderr).contains("may still be applied"), "a read changes nothing");
    // SAFETY: as above.
    unsafe { libc::kill(d.pid(), libc::SIGCONT) };
    // The request was in the socket: the daemon applies it once it runs.
    let t0 = Instant::now();
    loop {
        let ls = succeeds(&cli(&sb, &["rule", "ls"]));
        if ls.contains("203.0.113.0/24") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the timed-out change never applied:\n{ls}");
        thread::sleep(Duration::from_millis(100));
    }
    assert!(d.stop_with(libc::SIGTERM));
}
