//! The SYN-cookie rig (issue 45, docs/syn-cookies.md), shared by the `syn`
//! tier and the benchmark's `syn` group: a sandbox whose receiving side
//! serves TCP with the kernel set for cookies, a kernel TCP server, real
//! kernel clients bound to chosen addresses, and a spoofed SYN flood from
//! a raw socket on one CPU (with the CPU time it and the softirq on that
//! CPU spent).

use std::{
    io::{Read, Write},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream},
    os::fd::{AsFd, AsRawFd},
    process::Command,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use policer_common::class::{TCP_ACK, TCP_SYN};

use crate::{
    bench::{
        generator::{ksoftirqd_ns, thread_cpu_ns},
        sys::pin_cpu,
    },
    foreign,
    frame::FrameSpec,
    netns::{Sandbox, enter, ip},
    packet::RawSocket,
};

/// The server's port, and one nobody listens on.
pub const PORT: u16 = 8080;
pub const CLOSED: u16 = 8081;
pub const RX4: &str = "10.99.0.1";
pub const TX4: &str = "10.99.0.2";
pub const RX6: &str = "fd99::1";
pub const TX6: &str = "fd99::2";

/// Client addresses: `CLIENTS` (+ 1) of each family on the sending side,
/// each a source that proves itself once.
pub const CLIENTS: u8 = 20;

pub fn client4(i: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 99, 0, 10 + i))
}

pub fn client6(i: u8) -> IpAddr {
    format!("fd99::{:x}", 0x10 + u32::from(i)).parse().unwrap()
}

/// `sysctl -w KEY=VALUE` in `ns`.
pub fn sysctl(ns: &str, kv: &str) {
    let ok = Command::new("ip").args(["netns", "exec", ns, "sysctl", "-qw", kv]).status().unwrap().success();
    assert!(ok, "sysctl {kv}");
}

/// A sandbox with addresses on both sides (IPv6 too; `CLIENTS` + 1 client
/// addresses of each family), the kernel set for cookies
/// (docs/syn-cookies.md), and an XDP program on the sending veth: what the
/// policer sends back (`XDP_TX`) is received there only when the peer has
/// one (measured on 6.18: GRO alone leaves the frames in the peer's ring
/// until other traffic wakes it).
pub fn sandbox(sb: Sandbox) -> Sandbox {
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
    // The clients' patience, [`CLIENT_PATIENCE`]: here a client's SYN can
    // fail on its own host (the flood keeps the receiving veth's ring of 256
    // full; `veth_xmit` drops and tells TCP, `TCPRetransFail`), which a real
    // client behind a wire never sees. TCP then tries again after 0.5 s
    // instead of its backoff and counts it as a retransmission: with the
    // default 6 (+ `tcp_syn_linear_timeouts` 4) a client gave up after
    // 6.2 s of local failures (seen in CI on a slow host: 9 of 500). 40
    // tries keep it trying for the 20 s it waits, as a client behind a real
    // wire would (its backoff gives it about two minutes).
    sysctl(&sb.tx_ns, "net.ipv4.tcp_syn_retries=40");
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

/// Replaces the sending veth's `xdp_pass` with `xdp_sink` (tests/ebpf):
/// frames to `net`/`len` are dropped there. The SYN-ACKs answering a flood
/// spoofed from `net` would go out to the forged sources, not into the
/// clients' host: without it the clients' kernel takes each of them
/// through its stack, on the two CPUs the rig shares, and the rings both
/// ways overflow more often (a client that lost its SYNs seven times in a
/// row gives up after 6 s on 6.18: `tcp_syn_linear_timeouts`).
pub fn sink_replies_to(sb: &Sandbox, net: Ipv4Addr, len: u8) {
    let (ns, ifc) = (sb.tx_ns.clone(), sb.tx_if.clone());
    let mask = u32::MAX.checked_shl(32 - u32::from(len)).unwrap_or(0);
    let net = u32::from(net) & mask;
    thread::spawn(move || {
        enter(&ns).unwrap();
        let mut loader = aya::EbpfLoader::new();
        loader.override_global("SINK_NET", &net, true).override_global("SINK_MASK", &mask, true);
        let mut ebpf = loader.load(crate::REFERENCE_OBJECT).expect("load the reference object");
        let p: &mut aya::programs::Xdp = ebpf.program_mut("xdp_sink").unwrap().try_into().unwrap();
        p.load().expect("load xdp_sink");
        let fd = p.fd().unwrap().as_fd().as_raw_fd();
        let idx = policer_user::loader::if_index(&ifc).unwrap();
        policer_user::netlink::set(idx, fd, policer_user::netlink::XDP_FLAGS_DRV_MODE, None)
            .expect("attach xdp_sink to the sending veth");
    })
    .join()
    .unwrap();
}

/// A kernel TCP server in `ns` on `[::]:PORT` (IPv4 too): each connection
/// reads a line and answers `pong` with it. Stops with the flag.
pub fn server(ns: &str, stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
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
                        s.set_read_timeout(Some(CLIENT_PATIENCE)).unwrap();
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
pub fn connect_many(ns: &str, from: Vec<IpAddr>, to: SocketAddr, n: u64) -> u64 {
    connect_many_on(ns, from, to, n, None)
}

/// [`connect_many`], its threads pinned to `cpu` when given.
pub fn connect_many_on(ns: &str, from: Vec<IpAddr>, to: SocketAddr, n: u64, cpu: Option<usize>) -> u64 {
    let ok = Arc::new(AtomicU64::new(0));
    let hs: Vec<_> = (0..10)
        .map(|t| {
            let (ns, ok, from) = (ns.to_string(), ok.clone(), from.clone());
            thread::spawn(move || {
                enter(&ns).unwrap();
                if let Some(c) = cpu {
                    pin_cpu(c).unwrap();
                }
                for i in (t..n).step_by(10) {
                    let src = SocketAddr::new(from[i as usize % from.len()], 0);
                    match one_connection(src, to, i) {
                        Ok(()) => _ = ok.fetch_add(1, Ordering::Relaxed),
                        // Why a connection failed, for the log.
                        Err(e) => eprintln!("connection {i} from {src} to {to}: {e}"),
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

/// One connection from `src` to `to` that carries `ping i` and its answer,
/// or which step failed and how.
fn one_connection(src: SocketAddr, to: SocketAddr, i: u64) -> Result<(), String> {
    let started = Instant::now();
    let at = |step: &str, e: &dyn std::fmt::Display| format!("{step} after {:?}: {e}", started.elapsed());
    let mut s = connect_from(src, to).map_err(|e| at("connect", &e))?;
    let local = s.local_addr().map(|a| a.port()).unwrap_or(0);
    s.set_read_timeout(Some(CLIENT_PATIENCE)).unwrap();
    let msg = format!("ping {i}");
    s.write_all(msg.as_bytes()).map_err(|e| at(&format!("write (port {local})"), &e))?;
    let mut b = [0u8; 64];
    let k = s.read(&mut b).map_err(|e| at(&format!("read (port {local})"), &e))?;
    if b[..k] != *format!("pong {msg}").as_bytes() {
        return Err(at(&format!("answer (port {local})"), &String::from_utf8_lossy(&b[..k])));
    }
    Ok(())
}

/// How long a client waits to connect, and for its answer: a real
/// client's patience (the kernel's own connect gives up after about two
/// minutes), not 5 s: on two cores saturated by the flood a SYN-ACK or the
/// server's turn can take a retransmission (1 s, 3 s, 7 s) to come.
pub const CLIENT_PATIENCE: Duration = Duration::from_secs(20);

/// A kernel TCP connection from `src` to `to` ([`CLIENT_PATIENCE`] to connect).
pub fn connect_from(src: SocketAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let domain = if to.is_ipv6() { socket2::Domain::IPV6 } else { socket2::Domain::IPV4 };
    let s = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    s.bind(&src.into())?;
    s.connect_timeout(&to.into(), CLIENT_PATIENCE)?;
    Ok(s.into())
}

/// Random sources of 100.64.0.0/10 (one SYN each, as a spoofed flood).
pub fn spoofed_v4(r: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(0x6440_0000 | (r as u32 & 0x003f_ffff)))
}

/// Random sources of one /24, 100.70.5.0/24.
pub fn one_net_v4(r: u64) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(100, 70, 5, r as u8))
}

/// Random sources of one /48, 2001:db8:70::/48.
pub fn one_net_v6(r: u64) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x70, (r >> 16) as u16, (r >> 32) as u16, 0, (r >> 48) as u16, r as u16))
}

/// `n` SYNs (64-byte frames, no options) to `dst`:`dport` from
/// `source(random)`, random source ports, to the receiver's MAC `mac`.
pub fn syn_frames(
    n: usize,
    seed: u64,
    source: fn(u64) -> IpAddr,
    dst: IpAddr,
    dport: u16,
    mac: [u8; 6],
) -> Vec<Vec<u8>> {
    let mut seed = seed;
    (0..n)
        .map(|_| {
            let r = crate::rng(&mut seed);
            let sport = 1024 + (r >> 40) as u16 % 60000;
            let len = if dst.is_ipv6() { 74 } else { 64 };
            let mut spec = FrameSpec::tcp(source(r), dst, len, sport, dport, TCP_SYN);
            spec.dst_mac = mac;
            let mut f = spec.build(None);
            // A valid TCP checksum: the kernel drops a SYN without one
            // before it answers (XDP does not look).
            fix_tcp_checksum(&mut f, 14 + if dst.is_ipv6() { 40 } else { 20 }, dst.is_ipv6());
            f
        })
        .collect()
}

/// An ACK to `dst`:`dport` from `src` whose acknowledgment number is a
/// cookie nobody was sent.
pub fn forged_ack(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, ack: u32, mac: [u8; 6]) -> Vec<u8> {
    let mut spec = FrameSpec::tcp(src, dst, if dst.is_ipv6() { 74 } else { 54 }, sport, dport, TCP_ACK);
    spec.dst_mac = mac;
    let mut f = spec.build(None);
    let tcp = 14 + if dst.is_ipv6() { 40 } else { 20 };
    f[tcp + 8..tcp + 12].copy_from_slice(&ack.to_be_bytes());
    // The TCP checksum is the frame's own: patch it for the new number.
    fix_tcp_checksum(&mut f, tcp, dst.is_ipv6());
    f
}

/// The ACK that completes the handshake `syn` (an untagged SYN frame with
/// IP and TCP headers adjacent, as [`syn_frames`] makes) began, for the
/// SYN-ACK whose sequence number (the cookie) is `cookie`: what a real
/// client at the SYN's source would send.
pub fn cookie_ack(syn: &[u8], cookie: u32) -> Vec<u8> {
    let v6 = syn[12..14] == [0x86, 0xdd];
    let tcp = 14 + if v6 { 40 } else { 20 };
    let mut f = syn.to_vec();
    let seq = u32::from_be_bytes(f[tcp + 4..tcp + 8].try_into().unwrap());
    f[tcp + 4..tcp + 8].copy_from_slice(&seq.wrapping_add(1).to_be_bytes());
    f[tcp + 8..tcp + 12].copy_from_slice(&cookie.wrapping_add(1).to_be_bytes());
    f[tcp + 13] = TCP_ACK;
    fix_tcp_checksum(&mut f, tcp, v6);
    f
}

/// Recomputes the TCP checksum of an untagged frame whose TCP header is
/// at `tcp` (the segment's length from the IP header: Ethernet padding
/// after it is not the segment's).
fn fix_tcp_checksum(f: &mut [u8], tcp: usize, v6: bool) {
    f[tcp + 16] = 0;
    f[tcp + 17] = 0;
    let seg = if v6 {
        usize::from(u16::from_be_bytes([f[14 + 4], f[14 + 5]]))
    } else {
        usize::from(u16::from_be_bytes([f[14 + 2], f[14 + 3]])) - (tcp - 14)
    };
    let mut sum: u32 = 0;
    let mut add = |b: &[u8]| {
        for c in b.chunks(2) {
            sum += u32::from(c[0]) << 8 | u32::from(*c.get(1).unwrap_or(&0));
        }
    };
    if v6 {
        add(&f[14 + 8..14 + 40]);
    } else {
        add(&f[14 + 12..14 + 20]);
    }
    add(&(seg as u32).to_be_bytes());
    add(&[0, 6]);
    add(&f[tcp..tcp + seg]);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let c = !(sum as u16);
    f[tcp + 16..tcp + 18].copy_from_slice(&c.to_be_bytes());
}

/// What a flood sent, and what it cost the CPU it ran on.
#[derive(Clone, Copy, Debug, Default)]
pub struct FloodReport {
    pub sent: u64,
    pub wall_ns: u64,
    /// CPU time of the sending thread (which runs the receiving veth's
    /// softirq when it re-enables bottom halves) plus that CPU's
    /// ksoftirqd: the flood's whole cost on its CPU, both sides.
    pub own_ns: u64,
}

/// Sends `frames` in turn from a raw socket on the sandbox's sending veth,
/// pinned to `cpu`, until the flag (or `max`).
pub fn flood(
    sb: &Sandbox,
    frames: Vec<Vec<u8>>,
    cpu: usize,
    stop: Arc<AtomicBool>,
    max: Duration,
) -> thread::JoinHandle<FloodReport> {
    let (ns, ifc) = (sb.tx_ns.clone(), sb.tx_if.clone());
    let (tx, rx) = std::sync::mpsc::channel();
    let h = thread::spawn(move || {
        enter(&ns).unwrap();
        pin_cpu(cpu).unwrap();
        let sock = RawSocket::bind(&ifc).unwrap();
        tx.send(()).unwrap();
        let mut sent = 0;
        let (t0, c0, k0) = (Instant::now(), thread_cpu_ns(), ksoftirqd_ns(cpu));
        'flood: loop {
            for chunk in frames.chunks(256) {
                if stop.load(Ordering::Relaxed) || t0.elapsed() >= max {
                    break 'flood;
                }
                for f in chunk {
                    if sock.send(f).is_ok() {
                        sent += 1;
                    }
                }
            }
        }
        let own_ns = (thread_cpu_ns() - c0) + ksoftirqd_ns(cpu).saturating_sub(k0);
        FloodReport { sent, wall_ns: t0.elapsed().as_nanos() as u64, own_ns }
    });
    rx.recv().unwrap();
    h
}

/// `ss -tin` in `ns`: the `wscale:a,b` and whether `sack` is on, of the
/// first established connection matching `filter`.
pub fn ss_options(ns: &str, filter: &str) -> (String, bool) {
    let out =
        Command::new("ip").args(["netns", "exec", ns, "ss", "-tinH", "state", "established", filter]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let ws = text.split_whitespace().find(|w| w.starts_with("wscale:")).unwrap_or("none").to_string();
    (ws, text.contains(" sack"))
}

/// The destination address of a SYN-ACK frame (untagged, IPv4 or IPv6),
/// or `None` for any other frame.
pub fn synack_to(f: &[u8]) -> Option<IpAddr> {
    let (v6, tcp) = match f.get(12..14)? {
        [0x08, 0x00] => (false, 14 + usize::from(f.get(14)? & 0xf) * 4),
        [0x86, 0xdd] => (true, 14 + 40),
        _ => return None,
    };
    let proto = if v6 { *f.get(14 + 6)? } else { *f.get(14 + 9)? };
    if proto != 6 || f.get(tcp + 13)? & (TCP_SYN | TCP_ACK) != TCP_SYN | TCP_ACK {
        return None;
    }
    Some(if v6 {
        let b: [u8; 16] = f.get(14 + 24..14 + 40)?.try_into().ok()?;
        IpAddr::V6(b.into())
    } else {
        let b: [u8; 4] = f.get(14 + 16..14 + 20)?.try_into().ok()?;
        IpAddr::V4(b.into())
    })
}

/// The nonzero drop and XDP counters of both veths (`ethtool -S`): where a
/// frame lost before the program or before the client went.
pub fn veth_drops(sb: &Sandbox) -> String {
    [(&sb.rx_ns, &sb.rx_if), (&sb.tx_ns, &sb.tx_if)]
        .iter()
        .map(|(ns, ifc)| {
            let out = Command::new("ip").args(["netns", "exec", ns, "ethtool", "-S", ifc]).output();
            let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
            let rows: Vec<String> = text
                .lines()
                .filter_map(|l| l.trim().split_once(": "))
                .filter(|(k, v)| *v != "0" && (k.contains("drop") || k.contains("err") || k.contains("xdp")))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            // A frame `veth_xmit` could not put in the peer's ring is the
            // sender's TX drop (`ip -s link`), not in `ethtool -S`.
            let link = Command::new("ip").args(["-n", ns, "-s", "-j", "link", "show", "dev", ifc]).output();
            let tx_dropped = link
                .ok()
                .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
                .and_then(|v| v[0]["stats64"]["tx"]["dropped"].as_u64())
                .unwrap_or(0);
            format!("{ifc}: {} tx_dropped={tx_dropped}", rows.join(" "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The nonzero TCP counters of `ns` (`nstat -az`, kernel totals since the
/// namespace was made): what the kernel did with the connections.
pub fn tcp_counters(ns: &str) -> String {
    let out = Command::new("ip").args(["netns", "exec", ns, "nstat", "-az"]).output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (k, v) = (w.next()?, w.next()?);
            (k.starts_with("Tcp") && v != "0").then(|| format!("{k}={v}"))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
