//! Tier 3: no client can stall the daemon. Real sockets against the real
//! `policer` binary: idle and trickling clients on the control socket and
//! on `/metrics`, clients that never read a large answer, oversized and
//! malformed requests — while `policer rule set` and `policer stats` run as
//! separate processes and must take at most 100 ms longer than without
//! them, counter lines keep their period, and SIGTERM ends the daemon
//! within a second. And serving isolation: a storm of `/metrics` scrapers
//! holds up no other view, `/healthz` is answered with every HTTP slot
//! held, `rule ls --set` of a million entries holds up no change and costs
//! little memory for clients that do not read it, the connection caps fit
//! the fd limit, and past the control cap the CLI says "daemon busy".

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

fn metrics_len(ns: &str, port: u16) -> usize {
    let ns = ns.to_string();
    thread::spawn(move || {
        enter(&ns).unwrap();
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
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
    let body = metrics_len(&sb.rx_ns, PORT);
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
    // A stall behind a bad client costs a request deadline (5 s): the call
    // that waited takes that much longer than any call without the load.
    // So no call under load may take more than the slowest without it plus
    // half a deadline: far above the host's noise (a debug `stats` of 18 000
    // rules takes 0.5-0.8 s on a two-core host, 1-3.5 s on a busy one, and
    // the load's own clients take CPU from it; issue 43 point 17), far below
    // a stall. The timings themselves are the benchmark's (control rows).
    for (what, base, load) in [("rule set", &base_set, &load_set), ("stats", &base_stats, &load_stats)] {
        let slowest = base.iter().copied().fold(0.0, f64::max);
        let worst = load.iter().copied().fold(0.0, f64::max);
        assert!(
            worst <= slowest + 2_500.0,
            "`policer {what}` took {worst:.0} ms under load, the slowest without it {slowest:.0} ms: a stall behind a bad client"
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
    // --on-detach stay: the program taken off below stays off (the default
    // puts it back within a tick: lifecycle tier).
    let _d = Daemon::attach(&sb, &["--rate", "1kpps", "--interval", "0", "--metrics", "9472", "--on-detach", "stay"]);
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
    let m = get("/metrics");
    assert!(m.contains(&format!("policer_interface_attached{{iface=\"{}\"}} 1", sb.rx_if)), "{m}");
    // Someone removes the program behind the daemon's back: 503.
    policer_tests::netns::ip(&["-n", &sb.rx_ns, "link", "set", &sb.rx_if, "xdp", "off"]);
    let bad = get("/healthz");
    assert!(bad.starts_with("HTTP/1.1 503"), "{bad}");
    assert!(bad.contains("\"healthy\":false") && bad.contains("no XDP program is attached"), "{bad}");
    // And /metrics says so, for the alert rule on it (a render may be
    // shared by scrapes a moment apart: asked until it is fresh).
    let off = format!("policer_interface_attached{{iface=\"{}\"}} 0", sb.rx_if);
    let t0 = Instant::now();
    loop {
        let m = get("/metrics");
        if m.contains(&off) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{off} not in /metrics:\n{m}");
        thread::sleep(Duration::from_millis(200));
    }
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

// ---------------------------------------------------------------------
// Serving isolation (issue 26): storms of one kind hold up no other
// request, /healthz is answered with every slot held, `rule ls --set` is
// answered off the owner in bounded memory, and past a cap the CLI says
// "busy".

/// A TCP connection to 127.0.0.1:`port` from `127.0.0.SRC` (the whole of
/// 127/8 is local): many client addresses from one host.
fn tcp_from(src: u8, port: u16) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let sockaddr = |a: [u8; 4], port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a) },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a fresh socket, owned by the TcpStream once connected (or
    // closed here on failure); the addresses are valid sockaddr_in.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let from = sockaddr([127, 0, 0, src], 0);
        let to = sockaddr([127, 0, 0, 1], port);
        if libc::bind(fd, &from as *const _ as *const libc::sockaddr, len) != 0
            || libc::connect(fd, &to as *const _ as *const libc::sockaddr, len) != 0
        {
            let e = std::io::Error::last_os_error();
            libc::close(fd);
            return Err(e);
        }
        Ok(TcpStream::from_raw_fd(fd))
    }
}

/// `GET PATH` from 127.0.0.SRC; the status line and the body's length, or
/// the error (`timeout` on each read).
fn get_from(src: u8, port: u16, path: &str, timeout: Duration) -> std::io::Result<(String, usize)> {
    let mut s = tcp_from(src, port)?;
    s.set_read_timeout(Some(timeout))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n")?;
    let mut out = Vec::new();
    s.read_to_end(&mut out)?;
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n").ok_or(ErrorKind::UnexpectedEof)?;
    Ok((head.lines().next().unwrap_or_default().to_string(), body.len()))
}

/// Threads that scrape `/metrics` back to back from 127.0.0.1..=20 until
/// stopped; counts whole answers.
struct Storm {
    stop: Arc<AtomicBool>,
    scrapes: Arc<AtomicU64>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Storm {
    fn start(ns: &str, port: u16, scrapers: usize, addresses: usize) -> Storm {
        let (stop, scrapes) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let threads = (0..scrapers)
            .map(|i| {
                let (stop, scrapes, ns) = (stop.clone(), scrapes.clone(), ns.to_string());
                thread::spawn(move || {
                    enter(&ns).unwrap();
                    // The scrapers stand for other hosts: on this one, 200
                    // threads waking at once would otherwise take the CPU
                    // from the CLI being measured (the scheduler shares it
                    // per thread), which says nothing of the daemon.
                    // SAFETY: setpriority on this thread (a tid is a pid
                    // to PRIO_PROCESS).
                    unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19) };
                    let src = 1 + (i % addresses) as u8;
                    while !stop.load(Ordering::Relaxed) {
                        match get_from(src, port, "/metrics", Duration::from_secs(20)) {
                            Ok((status, _)) if status.starts_with("HTTP/1.1 200") => {
                                scrapes.fetch_add(1, Ordering::Relaxed);
                            }
                            _ => thread::sleep(Duration::from_millis(10)),
                        }
                    }
                })
            })
            .collect();
        Storm { stop, scrapes, threads }
    }

    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            let _ = t.join();
        }
        self.scrapes.load(Ordering::Relaxed)
    }
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

/// A config of `n` /32 rules besides the default one.
fn config_of(path: &str, n: u32) {
    let mut s = String::from("[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nburst = 100\n\n");
    for i in 0..n {
        let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i);
        let _ = write!(s, "[[rule]]\nprefix = \"{a}/32\"\nrate = \"500pps\"\nburst = 50\n\n");
    }
    std::fs::write(path, s).unwrap();
}

/// 200 scrapers from 20 addresses (each under the per-address cap) keep
/// `/metrics` busy; `stats`, `ban ls`, `inspect` and `rule import` must
/// take at most 100 ms longer (median) than without them. Before the
/// scrapes shared one render, the waiting scrapes held all 32 blocking
/// threads and these took 1–1.6 s.
#[test]
fn a_scrape_storm_holds_up_no_other_view() {
    if !privileged("serving tier") {
        return;
    }
    const STORM_PORT: u16 = 9474;
    let sb = Sandbox::new("storm");
    let _sets = SetsDir::of(&sb);
    // Enough rules that a render takes a while (tens of ms), few enough
    // that 200 scrapers' copies of the answer do not take the host's CPU.
    config_of(&sb.config, 500);
    let d = Daemon::attach(
        &sb,
        &["--mode", "native", "--interval", "0", "--metrics", &STORM_PORT.to_string(), "--max-rules", "4096"],
    );
    let body = metrics_len(&sb.rx_ns, STORM_PORT);
    let list = std::env::temp_dir().join(format!("policer-storm-{}.txt", std::process::id()));
    std::fs::write(&list, (0..100).map(|i| format!("198.51.100.{i}\n")).collect::<String>()).unwrap();
    let list = list.to_str().unwrap().to_string();
    let calls: [(&str, Vec<&str>); 4] = [
        ("stats", vec!["stats", "--json"]),
        ("ban ls", vec!["ban", "ls", "--json"]),
        ("inspect", vec!["inspect", "100.64.0.9", "--json"]),
        ("rule import", vec!["rule", "import", &list, "--action", "deny", "--set", "storm"]),
    ];
    let run = |n: usize| -> Vec<Vec<f64>> {
        calls.iter().map(|(_, a)| timed(&sb, n, |_| a.iter().map(|s| s.to_string()).collect())).collect()
    };
    run(1);
    let mut base = run(5);

    let storm = Storm::start(&sb.rx_ns, STORM_PORT, 200, 20);
    thread::sleep(Duration::from_secs(2));
    let before = storm.scrapes.load(Ordering::Relaxed);
    let load = run(7);
    let during = storm.scrapes.load(Ordering::Relaxed) - before;
    let total = storm.stop();
    thread::sleep(Duration::from_secs(1));
    for (b, more) in base.iter_mut().zip(run(5)) {
        b.extend(more);
    }
    std::fs::remove_file(&list).unwrap();
    eprintln!("/metrics {body} bytes; {total} scrapes in all, {during} while measuring");
    for ((what, _), (b, l)) in calls.iter().zip(base.iter().zip(&load)) {
        eprintln!("{what} ms: base {b:.0?}\n      storm {l:.0?}");
    }
    assert!(during >= 200, "the storm answered only {during} scrapes while the calls ran");
    for ((what, _), (b, l)) in calls.iter().zip(base.iter().zip(&load)) {
        assert!(
            median(l) <= median(b) + 100.0,
            "`policer {what}` took {:.0} ms (median) under the scrape storm against {:.0} ms without",
            median(l),
            median(b)
        );
        assert!(
            max(l) <= max(b) + 500.0,
            "`policer {what}` took up to {:.0} ms under the scrape storm against {:.0} ms without",
            max(l),
            max(b)
        );
    }
    drop(d);
}

/// Every HTTP slot held by slow clients from 10 addresses (60 each, more
/// than the 512 slots, each address under its own cap of 64): 20 of 20
/// `/healthz` probes are answered, as the kubelet's liveness probe must be.
/// Before, a new connection past the cap was closed and none was.
#[test]
fn healthz_is_answered_with_every_slot_held() {
    if !privileged("serving tier") {
        return;
    }
    const PORT_H: u16 = 9475;
    let sb = Sandbox::new("hfull");
    let d = Daemon::attach(&sb, &["--rate", "1kpps", "--interval", "0", "--metrics", &PORT_H.to_string()]);
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", d.pid())).unwrap().count();
    let fds0 = fds();
    let mut load = Load::new();
    let http_req: &[u8] = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
    for a in 0..10u8 {
        let kind = if a % 2 == 0 { Kind::Idle } else { Kind::Trickle };
        load.add(Some(sb.rx_ns.clone()), 60, kind, move || tcp_from(11 + a, PORT_H), http_req);
    }
    // Every slot taken.
    let t0 = Instant::now();
    while fds() < fds0 + 500 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the slow clients took only {} fds", fds() - fds0);
        thread::sleep(Duration::from_millis(100));
    }
    let held = fds() - fds0;
    eprintln!("the daemon's own fds: {fds0}");
    let ns = sb.rx_ns.clone();
    let probes = thread::spawn(move || {
        enter(&ns).unwrap();
        (0..20)
            .map(|_| {
                let t = Instant::now();
                let r = get_from(1, PORT_H, "/healthz", Duration::from_secs(1));
                thread::sleep(Duration::from_millis(300));
                (r.map(|(status, _)| status), t.elapsed().as_secs_f64() * 1e3 - 300.0)
            })
            .collect::<Vec<_>>()
    })
    .join()
    .unwrap();
    let reconnects = load.stop();
    let answered = probes.iter().filter(|(r, _)| r.as_ref().is_ok_and(|s| s.starts_with("HTTP/1.1 200"))).count();
    eprintln!("slow clients held {held} fds; {reconnects} reconnects; probes: {probes:?}");
    assert_eq!(answered, 20, "{answered} of 20 /healthz probes answered with every slot held: {probes:?}");
    // Shedding made room: the slow clients were cut off and came back.
    assert!(reconnects >= 88, "only {reconnects} slow clients were shed or cut off");
}

/// The sets' state directory of a sandbox's config, removed on drop.
struct SetsDir(PathBuf);

impl SetsDir {
    fn of(sb: &Sandbox) -> SetsDir {
        let d = policer_tests::daemon::sets_dir_of(&sb.config);
        let _ = std::fs::remove_dir_all(&d);
        SetsDir(d)
    }
}

impl Drop for SetsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A `rule ls --set NAME` request on a fresh control connection.
fn set_ls(sock: &PathBuf, name: &str) -> UnixStream {
    let mut s = UnixStream::connect(sock).unwrap();
    let req = format!("{{\"protocol\":{},\"op\":\"set_ls\",\"name\":\"{name}\"}}\n", policer_user::control::PROTOCOL);
    s.write_all(req.as_bytes()).unwrap();
    s
}

/// `rule ls --set` of a million entries is answered off the owner: ten
/// clients reading it at once leave `rule set` within 100 ms of its time
/// without them (it waited 8 s when the owner built the answer), and
/// clients that never read cost the daemon little memory (each held a
/// copy of the whole answer, ~70 MB) and are dropped after the write
/// timeout.
#[test]
fn rule_ls_set_is_answered_off_the_owner_in_bounded_memory() {
    if !privileged("serving tier") {
        return;
    }
    const ENTRIES: u32 = 1_000_000;
    let sb = Sandbox::new("setls");
    let _sets = SetsDir::of(&sb);
    let d = Daemon::attach(&sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0", "--max-sources", "65536"]);
    let list = std::env::temp_dir().join(format!("policer-setls-{}.txt", std::process::id()));
    {
        let mut w = std::io::BufWriter::new(std::fs::File::create(&list).unwrap());
        for i in 0..ENTRIES {
            writeln!(w, "{}", Ipv4Addr::from(0x0a00_0000u32 + i)).unwrap();
        }
    }
    succeeds(&cli(&sb, &["rule", "import", list.to_str().unwrap(), "--action", "deny", "--set", "feed"]));
    std::fs::remove_file(&list).unwrap();
    let sock = socket_of(&sb);
    // The whole answer, through the CLI.
    let ls: serde_json::Value =
        serde_json::from_str(&succeeds(&cli(&sb, &["rule", "ls", "--set", "feed", "--json"]))).unwrap();
    assert_eq!(ls["entries"].as_array().unwrap().len(), ENTRIES as usize);
    assert_eq!(ls["entries"][0], "10.0.0.0/32");
    assert_eq!(ls["rule"]["set"], "feed");
    // An unknown set is refused, naming the known ones.
    policer_tests::daemon::fails_with(&cli(&sb, &["rule", "ls", "--set", "nope"]), "no set 'nope'; the sets are: feed");

    let set = |i: usize| -> Vec<String> {
        ["rule", "set", &format!("198.18.{i}.0/24"), "--rate", "100pps", "--burst", "10", "--runtime"]
            .map(String::from)
            .to_vec()
    };
    timed(&sb, 1, set);
    let mut base = timed(&sb, 6, |i| set(i + 1));

    // Ten clients reading the whole set, again and again.
    let stop = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..10)
        .map(|_| {
            let (stop, answers, sock) = (stop.clone(), answers.clone(), sock.clone());
            thread::spawn(move || {
                let mut len = 0;
                while !stop.load(Ordering::Relaxed) {
                    let mut s = set_ls(&sock, "feed");
                    let mut out = Vec::new();
                    s.read_to_end(&mut out).unwrap();
                    assert!(out.ends_with(b"]}\n"), "a cut answer of {} bytes", out.len());
                    len = out.len();
                    answers.fetch_add(1, Ordering::Relaxed);
                }
                len
            })
        })
        .collect();
    thread::sleep(Duration::from_secs(1));
    let load = timed(&sb, 9, |i| set(i + 100));
    stop.store(true, Ordering::Relaxed);
    let full_len = readers.into_iter().map(|t| t.join().unwrap()).max().unwrap();
    let read = answers.load(Ordering::Relaxed);
    base.extend(timed(&sb, 6, |i| set(i + 200)));
    eprintln!("rule set ms: base {base:.0?}\n    10 readers of {full_len} bytes ({read} answers) {load:.0?}");
    assert!(
        median(&load) <= median(&base) + 100.0,
        "`policer rule set` took {:.0} ms with ten `rule ls --set` readers against {:.0} ms without",
        median(&load),
        median(&base)
    );

    // Eight clients that ask for the set and never read it.
    thread::sleep(Duration::from_secs(1));
    let rss0 = rss_kib(d.pid());
    let t0 = Instant::now();
    let mut idle: Vec<UnixStream> = (0..8).map(|_| set_ls(&sock, "feed")).collect();
    thread::sleep(Duration::from_secs(3));
    let grown = rss_kib(d.pid()).saturating_sub(rss0);
    eprintln!("eight non-readers: the daemon grew {grown} KiB");
    assert!(grown < 16 * 1024, "eight clients that do not read grew the daemon by {grown} KiB");
    // Dropped after the write timeout (10 s untaken), not kept: each got
    // only what the socket buffers held, then the end.
    while t0.elapsed() < Duration::from_secs(13) {
        thread::sleep(Duration::from_millis(100));
    }
    for s in &mut idle {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let r = s.read_to_end(&mut got);
        assert!(
            r.is_ok() || r.as_ref().is_err_and(|e| e.kind() == ErrorKind::ConnectionReset),
            "a non-reader was not dropped: {r:?}"
        );
        assert!(got.len() < full_len / 2, "a non-reader got {} of {full_len} bytes", got.len());
    }
    // The daemon is fine.
    succeeds(&cli(&sb, &["status"]));
}

/// The daemon started with RLIMIT_NOFILE `soft`:`hard`, in the sandbox.
fn attach_limited(sb: &Sandbox, soft: u64, hard: u64, more: &[&str]) -> Daemon {
    let bin = policer_tests::daemon::policer_bin();
    let nofile = format!("--nofile={soft}:{hard}");
    let mut args = vec![nofile.as_str(), bin.to_str().unwrap(), "attach", &sb.rx_if, "--config", &sb.config];
    args.extend_from_slice(more);
    Daemon::start_bin(std::path::Path::new("prlimit"), &sb.rx_ns, &args)
}

/// The soft and hard "Max open files" of a process.
fn nofile(pid: i32) -> (String, String) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let l = s.lines().find(|l| l.starts_with("Max open files")).unwrap();
    let v: Vec<&str> = l.split_whitespace().collect();
    (v[3].to_string(), v[4].to_string())
}

/// The fd budget: a soft limit below the hard one is raised to it; when
/// even the hard limit cannot hold both caps, the caps are lowered and the
/// log says so. Past the (lowered) control cap, the CLI says "daemon busy"
/// with the cap, not "Connection reset by peer"; once the holders are gone
/// it works again.
#[test]
fn the_caps_fit_the_fd_limit_and_past_them_the_cli_says_busy() {
    if !privileged("serving tier") {
        return;
    }
    let sb = Sandbox::new("caps");
    // systemd's default: 1 024 soft, more hard. Raised, full caps.
    let d = attach_limited(&sb, 1024, 8192, &["--rate", "1kpps", "--interval", "0", "--metrics", "9476"]);
    assert_eq!(nofile(d.pid()), ("8192".into(), "8192".into()));
    assert!(!d.stdout().contains("capped at"), "{}", d.stdout());
    let mut d = d;
    assert!(d.stop_with(libc::SIGTERM));

    // 1 024 hard: 512 + 512 connections and the daemon's own fds do not
    // fit; both caps are lowered, in proportion.
    let d = attach_limited(&sb, 1024, 1024, &["--rate", "1kpps", "--interval", "0", "--metrics", "9476"]);
    let wait_log = |d: &Daemon| {
        let t0 = Instant::now();
        loop {
            if let Some(l) = d.stdout().lines().find(|l| l.contains("capped at")) {
                return l.to_string();
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "no word of the caps:\n{}", d.stdout());
            thread::sleep(Duration::from_millis(50));
        }
    };
    let line = wait_log(&d);
    let cap_of = |line: &str, after: &str| -> usize {
        line.split_once(after).unwrap().1.split_whitespace().next().unwrap().parse().unwrap()
    };
    let (control, http) = (cap_of(&line, "capped at "), cap_of(&line, "socket and "));
    assert!(control < 512 && http < 512 && control > 400, "{line}");
    assert!(line.contains("raise LimitNOFILE"), "{line}");
    let mut d = d;
    assert!(d.stop_with(libc::SIGTERM));

    // A small limit: the control cap is small enough to fill here.
    let d = attach_limited(&sb, 200, 200, &["--rate", "1kpps", "--interval", "0"]);
    let line = wait_log(&d);
    eprintln!("{line}");
    let cap = cap_of(&line, "capped at ");
    assert!((8..100).contains(&cap), "{line}");
    let sock = socket_of(&sb);
    let held: Vec<UnixStream> = (0..cap).map(|_| UnixStream::connect(&sock).unwrap()).collect();
    thread::sleep(Duration::from_millis(200));
    for args in [&["stats"][..], &["rule", "set", "198.18.0.0/24", "--rate", "10pps", "--burst", "5"][..]] {
        let out = cli(&sb, args);
        policer_tests::daemon::fails_with(
            &out,
            &format!("daemon busy: {cap} of {cap} control connections in use; try again"),
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("os error"), "{out:?}");
    }
    // Nothing changed, and the daemon answers once the slots are free.
    drop(held);
    thread::sleep(Duration::from_millis(200));
    assert!(!succeeds(&cli(&sb, &["rule", "ls"])).contains("198.18.0.0/24"));
    succeeds(&cli(&sb, &["stats"]));
}
