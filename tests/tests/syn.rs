//! Tier 3, SYN cookies in XDP (issue 45) on real kernel TCP: the real
//! `policer` daemon and CLI as separate processes, a TCP server of the
//! kernel's in the receiving namespace (a std `TcpListener`), real kernel
//! clients in the sending one, and a spoofed SYN flood (random sources,
//! the live-frames generator) at the rate the machine gives:
//!
//! - `--syn-cookies always`: ≥ 99 % of 500 real connections complete and
//!   carry data both ways through the flood; the window scale and SACK the
//!   server's socket has (`ss -ti`) are the client's; the flood never
//!   enters the table (the rule's sources stay at the one real client);
//!   SYN-ACKs ≤ SYNs, and toward the flood's /24s within the cap; a port
//!   nobody listens on gets no cookie; an ACK with a forged cookie is
//!   refused and counted; IPv6 the same;
//! - `flood`: below the rule's `--total-rate` SYNs are the kernel's, above
//!   it they get cookies.

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::AsRawFd,
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use policer_common::class::{TCP_ACK, TCP_SYN};
use policer_tests::{
    bench::sys::pin_cpu,
    daemon::{Daemon, cli, succeeds},
    foreign,
    frame::FrameSpec,
    netns::{Sandbox, enter, ip},
    packet::RawSocket,
    privileged,
    traffic::send_raw,
};
use serde_json::Value;

const PORT: u16 = 8080;
const CLOSED: u16 = 8081;
const RX4: &str = "10.99.0.1";
const TX4: &str = "10.99.0.2";
const RX6: &str = "fd99::1";
const TX6: &str = "fd99::2";

fn sysctl(ns: &str, kv: &str) {
    let ok = Command::new("ip").args(["netns", "exec", ns, "sysctl", "-qw", kv]).status().unwrap().success();
    assert!(ok, "sysctl {kv}");
}

/// Client addresses: `CLIENTS` of each family on the sending side, each a
/// source that proves itself once.
const CLIENTS: u8 = 20;

fn client4(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, 10 + i))
}

fn client6(i: u8) -> IpAddr {
    format!("fd99::{:x}", 0x10 + u32::from(i)).parse().unwrap()
}

/// A sandbox with addresses on both sides (IPv6 too; `CLIENTS` + 1 client
/// addresses of each family), the kernel set for cookies
/// (docs/syn-cookies.md), and an XDP program on the sending veth: what the
/// policer sends back (`XDP_TX`) is received there only when the peer has
/// one (measured on 6.18: GRO alone leaves the frames in the peer's ring
/// until other traffic wakes it).
fn sandbox(tag: &str) -> Sandbox {
    let sb = Sandbox::new(tag);
    for (ns, ifc, a4, a6) in [(&sb.rx_ns, &sb.rx_if, RX4, RX6), (&sb.tx_ns, &sb.tx_if, TX4, TX6)] {
        sysctl(ns, &format!("net.ipv6.conf.{ifc}.disable_ipv6=0"));
        ip(&["-n", ns, "addr", "add", &format!("{a4}/24"), "dev", ifc]);
        ip(&["-n", ns, "addr", "add", &format!("{a6}/64"), "dev", ifc, "nodad"]);
    }
    for i in 0..=CLIENTS {
        ip(&["-n", &sb.tx_ns, "addr", "add", &format!("{}/24", client4(i)), "dev", &sb.tx_if]);
        ip(&["-n", &sb.tx_ns, "addr", "add", &format!("{}/64", client6(i)), "dev", &sb.tx_if, "nodad"]);
    }
    sysctl(&sb.rx_ns, "net.ipv4.tcp_syncookies=2");
    sysctl(&sb.rx_ns, "net.ipv4.tcp_timestamps=2");
    let (ns, ifc) = (sb.tx_ns.clone(), sb.tx_if.clone());
    thread::spawn(move || {
        enter(&ns).unwrap();
        let fd = foreign::load_xdp_pass().expect("load xdp_pass");
        let idx = policer_user::loader::if_index(&ifc).unwrap();
        policer_user::netlink::set(idx, fd.as_raw_fd(), policer_user::netlink::XDP_FLAGS_DRV_MODE, None)
            .expect("attach xdp_pass to the sending veth");
    })
    .join()
    .unwrap();
    sb
}

/// A kernel TCP server in `ns` on `[::]:PORT` (IPv4 too): each connection
/// reads a line and answers `pong` with it. Stops with the flag.
fn server(ns: &str, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    let ns = ns.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = thread::spawn(move || {
        enter(&ns).unwrap();
        let l = TcpListener::bind(("::", PORT)).unwrap();
        l.set_nonblocking(true).unwrap();
        tx.send(()).unwrap();
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((mut s, _)) => {
                    thread::spawn(move || {
                        s.set_nonblocking(false).unwrap();
                        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                        let mut b = [0u8; 64];
                        if let Ok(n) = s.read(&mut b) {
                            let _ = s.write_all(&[b"pong ", &b[..n]].concat());
                        }
                        // Held a moment: `ss -ti` sees it established.
                        thread::sleep(Duration::from_millis(300));
                    });
                }
                Err(_) => thread::sleep(Duration::from_millis(1)),
            }
        }
    });
    rx.recv().unwrap();
    h
}

/// `n` real connections from `ns` to `to`, 10 at a time, from the client
/// addresses `from` in turn: how many completed and carried data both ways.
fn connect_many(ns: &str, from: Vec<IpAddr>, to: SocketAddr, n: u64) -> u64 {
    let ok = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..10)
        .map(|t| {
            let (ns, ok, from) = (ns.to_string(), ok.clone(), from.clone());
            thread::spawn(move || {
                enter(&ns).unwrap();
                for i in (t..n).step_by(10) {
                    let src = SocketAddr::new(from[i as usize % from.len()], 0);
                    let Ok(mut s) = connect_from(src, to) else { continue };
                    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    let msg = format!("ping {i}");
                    if s.write_all(msg.as_bytes()).is_err() {
                        continue;
                    }
                    let mut b = [0u8; 64];
                    if let Ok(k) = s.read(&mut b)
                        && b[..k] == *format!("pong {msg}").as_bytes()
                    {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    ok.load(Ordering::Relaxed)
}

/// A kernel TCP connection from `src` to `to` (5 s to connect).
fn connect_from(src: SocketAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let domain = if to.is_ipv6() { socket2::Domain::IPV6 } else { socket2::Domain::IPV4 };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    s.bind(&src.into())?;
    s.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(s.into())
}

/// A spoofed SYN flood to `dport` from random sources of 100.64.0.0/10,
/// as fast as a raw socket sends from the sending namespace, until the
/// flag: the number of SYNs sent.
///
/// Not the live-frames generator: its frames arrive on the receiving veth
/// as redirected XDP frames, and on those the SYN path handed (nearly)
/// every SYN back to policing uncounted on this kernel — not understood
/// yet (docs/syn-cookies.md, "Open").
fn syn_flood(sb: &Sandbox, dport: u16, stop: Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    let (ns, ifc, mac) = (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_mac());
    let mut seed = 0x5eed_u64;
    let frames: Vec<Vec<u8>> = (0..20_000)
        .map(|_| {
            let r = policer_tests::rng(&mut seed) as u32;
            let src = Ipv4Addr::from(0x6440_0000 | (r & 0x003f_ffff));
            let mut spec = FrameSpec::tcp(src.into(), RX4.parse().unwrap(), 64, 40000, dport, TCP_SYN);
            spec.dst_mac = mac;
            spec.build(None)
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    let h = thread::spawn(move || {
        enter(&ns).unwrap();
        pin_cpu(0).unwrap();
        let sock = RawSocket::bind(&ifc).unwrap();
        tx.send(()).unwrap();
        let mut sent = 0;
        let t0 = Instant::now();
        while !stop.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
            for f in &frames {
                if sock.send(f).is_ok() {
                    sent += 1;
                }
            }
        }
        sent
    });
    rx.recv().unwrap();
    h
}

fn stats(sb: &Sandbox) -> Value {
    serde_json::from_str(&succeeds(&cli(sb, &["stats", "--json"]))).unwrap()
}

/// The stats row of the rule with class `class`.
fn rule_row<'a>(s: &'a Value, class: &str) -> &'a Value {
    s["rules"].as_array().unwrap().iter().find(|r| r["class"] == class).unwrap_or_else(|| panic!("{class}: {s}"))
}

fn daemon(sb: &Sandbox) -> Daemon {
    // The rules' own rate per source is generous: a real client makes
    // hundreds of connections here, and only the flood is in question.
    Daemon::attach(sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0", "--max-sources", "65536"])
}

/// `ss -tin` in `ns`: the `wscale:a,b` and whether `sack` is on, of the
/// first established connection with port `port` on the side named.
fn ss_options(ns: &str, filter: &str) -> (String, bool) {
    let out =
        Command::new("ip").args(["netns", "exec", ns, "ss", "-tinH", "state", "established", filter]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let ws = text.split_whitespace().find(|w| w.starts_with("wscale:")).unwrap_or("none").to_string();
    (ws, text.contains(" sack"))
}

#[test]
fn cookies_always_under_a_spoofed_flood_v4_and_v6() {
    if !privileged("syn") {
        return;
    }
    let sb = sandbox("syn");
    let stop = Arc::new(AtomicBool::new(false));
    let srv = server(&sb.rx_ns, stop.clone());
    let _d = daemon(&sb);
    for prefix in ["0.0.0.0/0", "::/0"] {
        succeeds(&cli(
            &sb,
            &[
                "rule",
                "set",
                prefix,
                "--proto",
                "tcp",
                "--rate",
                "20kpps",
                "--syn-cookies",
                "always",
                "--syn-ack-rate",
                "2kpps",
            ],
        ));
    }
    let ls = succeeds(&cli(&sb, &["rule", "ls"]));
    assert!(ls.contains("always, cap 2000/s per /24"), "{ls}");
    // The flood first, then the real clients through it.
    let fstop = Arc::new(AtomicBool::new(false));
    let flood = syn_flood(&sb, PORT, fstop.clone());
    thread::sleep(Duration::from_millis(500));
    let c4: Vec<IpAddr> = (0..CLIENTS).map(client4).collect();
    let c6: Vec<IpAddr> = (0..CLIENTS).map(client6).collect();
    let ok4 = connect_many(&sb.tx_ns, c4, SocketAddr::new(RX4.parse().unwrap(), PORT), 500);
    let ok6 = connect_many(&sb.tx_ns, c6, SocketAddr::new(RX6.parse().unwrap(), PORT), 100);
    // Options while a connection is held: the server's own scale is its
    // kernel's, and the client's is what the cookie carried.
    // The probe holds its connection until both sides were read (a loaded
    // host may take a while to connect through the flood).
    let (connected, held) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let probe = thread::spawn({
        let ns = sb.tx_ns.clone();
        let (up, release) = (connected.0, held.1);
        move || {
            enter(&ns).unwrap();
            // A source not verified yet: its connection is the cookie's.
            let mut s = connect_from(SocketAddr::new(client4(CLIENTS), 0), SocketAddr::new(RX4.parse().unwrap(), PORT))
                .unwrap();
            s.write_all(b"hold").unwrap();
            up.send(()).unwrap();
            let _ = release.recv_timeout(Duration::from_secs(20));
            s
        }
    });
    connected.1.recv_timeout(Duration::from_secs(20)).expect("the probe connected");
    let since = std::time::Instant::now();
    let mut server_side = ss_options(&sb.rx_ns, &format!("sport = :{PORT}"));
    while server_side.0 == "none" && since.elapsed() < Duration::from_secs(3) {
        thread::sleep(Duration::from_millis(50));
        server_side = ss_options(&sb.rx_ns, &format!("sport = :{PORT}"));
    }
    let client_side = ss_options(&sb.tx_ns, &format!("dport = :{PORT}"));
    held.0.send(()).unwrap();
    drop(probe.join().unwrap());
    fstop.store(true, Ordering::Relaxed);
    let frames = flood.join().unwrap();
    eprintln!("flood: {frames} SYNs sent; connections: {ok4}/500 IPv4, {ok6}/100 IPv6");
    eprintln!("ss: server {server_side:?}, client {client_side:?}");
    assert!(ok4 >= 495, "IPv4: {ok4} of 500 connections");
    assert!(ok6 >= 99, "IPv6: {ok6} of 100 connections");
    // wscale:a,b on each side is (the peer's, its own): mirrored.
    let flip = |w: &str| {
        let (a, b) = w.trim_start_matches("wscale:").split_once(',').unwrap();
        format!("wscale:{b},{a}")
    };
    assert_ne!(server_side.0, "none", "the server's connection has a window scale");
    assert_eq!(server_side.0, flip(&client_side.0));
    assert_eq!(server_side.1, client_side.1, "SACK on the server as on the client");
    let s = stats(&sb);
    let n = |v: &Value, k: &str| v[k].as_u64().unwrap();
    let rows: Vec<&Value> = s["rules"].as_array().unwrap().iter().filter(|r| r["class"] == "tcp").collect();
    assert_eq!(rows.len(), 2, "{s}");
    for r in rows {
        let y = &r["syn"];
        eprintln!("{} rule: {r}", r["prefix"]);
        let v4 = r["prefix"] == "0.0.0.0/0";
        // One cookie answered each client's first connection at least; the
        // flood got the rest (IPv4); SYN-ACKs never more than SYNs.
        assert!(n(y, "cookies_sent") >= u64::from(CLIENTS), "{y}");
        assert!(n(y, "cookies_sent") <= n(y, "syns"), "SYN-ACKs ≤ SYNs: {y}");
        // Each client proved itself once (the probe too, IPv4); the
        // flood's sources never: the table holds the real clients only.
        let clients = u64::from(CLIENTS) + u64::from(v4);
        assert_eq!(n(y, "sources_verified"), clients, "{y}");
        // A bucket per IPv4 client; the IPv6 clients share one /64 (the
        // default key length), so one bucket.
        assert_eq!(n(r, "buckets_created"), if v4 { clients } else { 1 }, "{r}");
        assert!(n(y, "acks_accepted") >= clients, "{y}");
        if v4 {
            // The flood reached the program (the receiving veth's ring
            // drops what it has no room for: most of the generator's
            // frames), and went to SYN-ACKs (one each at most), not the
            // stack nor the table.
            eprintln!(
                "of {frames} flood frames generated, the SYN path saw {}; interfaces: {}",
                n(y, "syns"),
                s["totals"]
            );
            assert!(n(y, "syns") >= 1000, "{y}");
        }
    }
    stop.store(true, Ordering::Relaxed);
    srv.join().unwrap();
}

#[test]
fn no_listener_no_cookie_and_a_forged_cookie_is_refused() {
    if !privileged("syn") {
        return;
    }
    let sb = sandbox("synf");
    let stop = Arc::new(AtomicBool::new(false));
    let srv = server(&sb.rx_ns, stop.clone());
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "0.0.0.0/0", "--proto", "tcp", "--rate", "20kpps", "--syn-cookies", "always"]));
    // A connect to a port nobody serves: refused by the kernel (RST), and
    // no cookie.
    let closed = thread::spawn({
        let ns = sb.tx_ns.clone();
        move || {
            enter(&ns).unwrap();
            TcpStream::connect_timeout(&SocketAddr::new(RX4.parse().unwrap(), CLOSED), Duration::from_secs(3))
                .map(|_| ())
                .map_err(|e| e.kind())
        }
    })
    .join()
    .unwrap();
    assert_eq!(closed, Err(std::io::ErrorKind::ConnectionRefused));
    // ACKs with forged cookies from 50 spoofed sources to the listener.
    let mac = sb.rx_mac();
    let frames: Vec<Vec<u8>> = (0..50u8)
        .map(|i| {
            let src = IpAddr::V4(Ipv4Addr::new(100, 70, 1, i + 1));
            let mut spec = FrameSpec::tcp(src, RX4.parse().unwrap(), 54, 40000 + u16::from(i), PORT, TCP_ACK);
            spec.dst_mac = mac;
            let mut f = spec.build(None);
            // The acknowledgment number: a cookie nobody was sent.
            f[14 + 20 + 8..14 + 20 + 12].copy_from_slice(&(0x1234_5678u32 + u32::from(i) * 7919).to_be_bytes());
            f
        })
        .collect();
    send_raw(&sb, frames);
    thread::sleep(Duration::from_millis(300));
    let s = stats(&sb);
    let r = rule_row(&s, "tcp");
    let y = &r["syn"];
    assert_eq!(y["cookies_sent"], 0, "{y}");
    assert!(y["no_listener"].as_u64().unwrap() >= 1, "{y}");
    assert_eq!(y["acks_refused"], 50, "{y}");
    assert_eq!(y["sources_verified"], 0, "{y}");
    // Status and /metrics-free views say it too.
    let st = succeeds(&cli(&sb, &["status"]));
    assert!(st.contains("syn cookies: 0.0.0.0/0 [tcp] (always)"), "{st}");
    stop.store(true, Ordering::Relaxed);
    srv.join().unwrap();
}

#[test]
#[ignore = "issue 45, open: flood SYNs within the SYN budget are charged to the rule's total too, so the total \
            shared with verified clients' ACKs and data stays full and drops some of theirs (197 of 200 connected)"]
fn flood_mode_answers_only_above_the_total() {
    if !privileged("syn") {
        return;
    }
    let sb = sandbox("synm");
    let stop = Arc::new(AtomicBool::new(false));
    let srv = server(&sb.rx_ns, stop.clone());
    let _d = daemon(&sb);
    let out = cli(&sb, &["rule", "set", "0.0.0.0/0", "--proto", "tcp", "--rate", "200pps", "--syn-cookies", "flood"]);
    policer_tests::daemon::fails_with(&out, "needs --total-rate");
    succeeds(&cli(
        &sb,
        &[
            "rule",
            "set",
            "0.0.0.0/0",
            "--proto",
            "tcp",
            "--dport",
            "8080",
            "--rate",
            "20kpps",
            "--total-rate",
            "100kpps",
            "--total-burst",
            "1000",
            "--syn-cookies",
            "flood",
        ],
    ));
    // Quiet: 50 connections are the kernel's own handshakes.
    let ok = connect_many(&sb.tx_ns, vec![client4(0)], SocketAddr::new(RX4.parse().unwrap(), PORT), 50);
    assert_eq!(ok, 50);
    let quiet = stats(&sb);
    let y = &rule_row(&quiet, "tcp dport 8080")["syn"];
    assert_eq!(y["cookies_sent"], 0, "below the total: no cookies: {y}");
    // A lower total under a flood: cookies, and real clients still in.
    succeeds(&cli(&sb, &["rule", "set", "0.0.0.0/0", "--proto", "tcp", "--dport", "8080", "--total-rate", "1kpps"]));
    let fstop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let flood = syn_flood(&sb, PORT, fstop.clone());
    thread::sleep(Duration::from_millis(300));
    let c4: Vec<IpAddr> = (1..CLIENTS).map(client4).collect();
    let ok = connect_many(&sb.tx_ns, c4, SocketAddr::new(RX4.parse().unwrap(), PORT), 200);
    fstop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let s = stats(&sb);
    let r = rule_row(&s, "tcp dport 8080");
    let y = &r["syn"];
    eprintln!("flood mode: {ok}/200; {r}");
    assert!(ok >= 198, "{ok} of 200");
    assert!(y["cookies_sent"].as_u64().unwrap() > 1000, "{y}");
    // Below the total the flood's SYNs are policed as without cookies
    // (each a bucket): never more than the total's burst and rate let
    // through, plus the real clients.
    let allowed = 1000.0 + 1000.0 * secs + f64::from(CLIENTS);
    assert!((r["buckets_created"].as_u64().unwrap() as f64) <= allowed, "{r} in {secs:.1} s");
    stop.store(true, Ordering::Relaxed);
    srv.join().unwrap();
}
