//! A smoothly paced traffic generator and a receiver that counts what
//! arrives, per flow. Burst-sending generators under-admit in accuracy
//! tests (docs/platform.md), so each flow sends at exact, evenly spaced
//! times from one schedule.

use std::{
    cmp::Reverse,
    collections::BinaryHeap,
    net::IpAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use crate::{
    frame::{FrameSpec, find_mark},
    netns::{Sandbox, enter},
    packet::RawSocket,
};

/// One source sending at a fixed rate.
#[derive(Clone, Debug)]
pub struct Flow {
    pub src: IpAddr,
    pub pps: f64,
    /// Frame length in bytes.
    pub len: usize,
}

#[derive(Clone, Debug, Default)]
pub struct SendReport {
    pub sent: Vec<u64>,
    /// Send time of each flow's first and last frame, ns since the start.
    pub first_ns: Vec<u64>,
    pub last_ns: Vec<u64>,
    /// Every frame sent, in order: (ns since the start, flow index).
    pub frames: Vec<(u64, u32)>,
    /// How late the latest frame was sent against its schedule, ns.
    pub max_late_ns: u64,
    /// Frames sent more than a millisecond late.
    pub late_1ms: u64,
    /// The start of the schedule, ns since [`epoch_ns`].
    pub start_epoch_ns: u64,
}

impl SendReport {
    /// Seconds between a flow's first and last frame.
    pub fn span_secs(&self, flow: usize) -> f64 {
        self.last_ns[flow].saturating_sub(self.first_ns[flow]) as f64 / 1e9
    }
}

#[derive(Clone, Debug, Default)]
pub struct Received {
    pub per_flow: Vec<u64>,
    pub bytes_per_flow: Vec<u64>,
    /// Frames that were not ours (should be zero in a quiet sandbox).
    pub foreign: u64,
    /// Frames the receive socket itself lost (must be zero for counts to
    /// be trusted).
    pub socket_drops: u64,
    /// Arrival times of flow 0's frames, ns since [`epoch`].
    pub arrivals0: Vec<u64>,
    /// (flow, sequence) of every frame of ours, in arrival order, when
    /// asked for ([`RunOptions::keep_marks`]).
    pub marks: Vec<(u32, u32)>,
}

static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// A process-wide time origin, so tests can line up what they did with
/// when frames arrived.
pub fn epoch_ns() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// `t` as ns since [`epoch_ns`]'s origin (0 for an instant before it).
pub fn epoch_ns_at(t: Instant) -> u64 {
    t.saturating_duration_since(*EPOCH.get_or_init(Instant::now)).as_nanos() as u64
}

const DST_V4: &str = "198.19.255.1";
const DST_V6: &str = "2001:db8:ffff::1";

/// Sends `flows` for `duration` on `sock`, paced.
pub fn send(
    sock: &RawSocket,
    flows: &[Flow],
    dst_mac: [u8; 6],
    run: u32,
    duration: Duration,
    stop: &AtomicBool,
) -> SendReport {
    send_specs(sock, &spec_flows(flows), dst_mac, run, duration, stop)
}

/// A flow of frames built from a [`FrameSpec`] (any layer 4, tags,
/// extension headers, fragments), sent at a fixed rate. The destination
/// MAC is the receiver's; the marker goes in the payload.
#[derive(Clone, Debug)]
pub struct SpecFlow {
    pub spec: FrameSpec,
    pub pps: f64,
}

/// [`Flow`]s as UDP [`SpecFlow`]s to the default destinations.
pub fn spec_flows(flows: &[Flow]) -> Vec<SpecFlow> {
    flows
        .iter()
        .map(|f| {
            let dst: IpAddr = if f.src.is_ipv4() { DST_V4.parse().unwrap() } else { DST_V6.parse().unwrap() };
            SpecFlow { spec: FrameSpec::udp(f.src, dst, f.len), pps: f.pps }
        })
        .collect()
}

/// [`send`] for [`SpecFlow`]s.
pub fn send_specs(
    sock: &RawSocket,
    flows: &[SpecFlow],
    dst_mac: [u8; 6],
    run: u32,
    duration: Duration,
    stop: &AtomicBool,
) -> SendReport {
    let mut frames: Vec<(Vec<u8>, usize)> = flows
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut spec = f.spec.clone();
            spec.dst_mac = dst_mac;
            let b = spec.build(Some((run, i as u32, 0)));
            let seq_at = b.windows(4).position(|w| w == crate::frame::MARKER).expect("marker") + 12;
            (b, seq_at)
        })
        .collect();
    let n = flows.len();
    let mut rep = SendReport { sent: vec![0; n], first_ns: vec![0; n], last_ns: vec![0; n], ..Default::default() };
    let period: Vec<f64> = flows.iter().map(|f| 1e9 / f.pps).collect();
    // Stagger the flows' phases so the aggregate is smooth too.
    let phase: Vec<f64> = (0..n).map(|i| period[i] * (i as f64 / n as f64)).collect();
    let end_ns = duration.as_nanos() as u64;
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = (0..n).map(|i| Reverse((phase[i] as u64, i))).collect();
    // The schedule's origin and its epoch time are one clock reading: two
    // readings would put every send time late by whatever came between
    // them (a preemption of the sender there is milliseconds), and a frame
    // sent just before a change would count as sent after it.
    let start = Instant::now();
    rep.start_epoch_ns = epoch_ns_at(start);
    while let Some(Reverse((due, i))) = heap.pop() {
        if due >= end_ns || stop.load(Ordering::Relaxed) {
            continue;
        }
        loop {
            let now = start.elapsed().as_nanos() as u64;
            if now >= due {
                break;
            }
            if due - now > 300_000 {
                thread::sleep(Duration::from_nanos(due - now - 200_000));
            } else {
                std::hint::spin_loop();
            }
        }
        let (frame, seq_at) = &mut frames[i];
        let k = rep.sent[i];
        frame[*seq_at..*seq_at + 4].copy_from_slice(&(k as u32).to_be_bytes());
        let at = start.elapsed().as_nanos() as u64;
        let late = at - due;
        rep.max_late_ns = rep.max_late_ns.max(late);
        rep.late_1ms += u64::from(late > 1_000_000);
        sock.send(frame).expect("send frame");
        if k == 0 {
            rep.first_ns[i] = at;
        }
        rep.last_ns[i] = at;
        rep.sent[i] = k + 1;
        rep.frames.push((at, i as u32));
        let next = phase[i] + (k + 1) as f64 * period[i];
        heap.push(Reverse((next as u64, i)));
    }
    rep
}

/// Counts our frames by flow until `stop`, then drains for a moment.
pub fn receive(sock: &RawSocket, n: usize, run: u32, stop: &AtomicBool) -> Received {
    receive_marks(sock, n, run, stop, false)
}

/// [`receive`], keeping every frame's (flow, sequence) with `keep_marks`.
pub fn receive_marks(sock: &RawSocket, n: usize, run: u32, stop: &AtomicBool, keep_marks: bool) -> Received {
    let mut r = Received { per_flow: vec![0; n], bytes_per_flow: vec![0; n], ..Default::default() };
    let mut buf = vec![0u8; 65536];
    sock.set_timeout(Duration::from_millis(50)).expect("timeout");
    let mut quiet_since: Option<Instant> = None;
    loop {
        match sock.recv(&mut buf).expect("recv") {
            Some(len) => {
                quiet_since = None;
                match find_mark(&buf[..len]) {
                    Some((id, flow, seq)) if id == run && (flow as usize) < n => {
                        if keep_marks {
                            r.marks.push((flow, seq));
                        }
                        if flow == 0 {
                            r.arrivals0.push(epoch_ns());
                        }
                        r.per_flow[flow as usize] += 1;
                        r.bytes_per_flow[flow as usize] += len as u64;
                    }
                    _ => r.foreign += 1,
                }
            }
            None => {
                if stop.load(Ordering::Relaxed) {
                    let q = *quiet_since.get_or_insert_with(Instant::now);
                    if q.elapsed() > Duration::from_millis(300) {
                        break;
                    }
                }
            }
        }
    }
    r.socket_drops = sock.drops().unwrap_or(u32::MAX) as u64;
    r
}

/// Sends `flows` from the sandbox's transmit side and counts what arrives
/// on the receive side, each in a thread inside its namespace.
pub fn run(sb: &Sandbox, flows: &[Flow], duration: Duration) -> (SendReport, Received) {
    run_in(&sb.tx_ns, &sb.tx_if, &sb.rx_ns, &sb.rx_if, sb.rx_mac(), flows, duration, None)
}

/// How [`run_with`] runs.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// The receiving socket takes only frames with the marker (a socket
    /// filter, see [`accept_only_marked`]): for runs beside a flood whose
    /// admitted frames would otherwise swamp it. Untagged frames without
    /// IPv4 options only.
    pub marked_only: bool,
    /// Pin the sender to this CPU (a flood generator pinned to the other
    /// one then cannot crowd it).
    pub sender_cpu: Option<usize>,
    /// Stops the sender early.
    pub stop: Option<Arc<AtomicBool>>,
    /// Keep every received frame's (flow, sequence) in
    /// [`Received::marks`] (for [`since`]).
    pub keep_marks: bool,
}

/// [`run`] with options.
pub fn run_with(sb: &Sandbox, flows: &[Flow], duration: Duration, opts: &RunOptions) -> (SendReport, Received) {
    run_opts(&sb.tx_ns, &sb.tx_if, &sb.rx_ns, &sb.rx_if, sb.rx_mac(), &spec_flows(flows), duration, opts)
}

#[expect(clippy::too_many_arguments, reason = "plain plumbing of one experiment's parameters")]
pub fn run_in(
    tx_ns: &str,
    tx_if: &str,
    rx_ns: &str,
    rx_if: &str,
    dst_mac: [u8; 6],
    flows: &[Flow],
    duration: Duration,
    stop: Option<Arc<AtomicBool>>,
) -> (SendReport, Received) {
    let opts = RunOptions { stop, ..Default::default() };
    run_opts(tx_ns, tx_if, rx_ns, rx_if, dst_mac, &spec_flows(flows), duration, &opts)
}

/// [`run_with`] for [`SpecFlow`]s: any frame shape, counted per flow on
/// the receiving side.
pub fn run_specs(sb: &Sandbox, flows: &[SpecFlow], duration: Duration, opts: &RunOptions) -> (SendReport, Received) {
    run_opts(&sb.tx_ns, &sb.tx_if, &sb.rx_ns, &sb.rx_if, sb.rx_mac(), flows, duration, opts)
}

#[expect(clippy::too_many_arguments, reason = "plain plumbing of one experiment's parameters")]
fn run_opts(
    tx_ns: &str,
    tx_if: &str,
    rx_ns: &str,
    rx_if: &str,
    dst_mac: [u8; 6],
    flows: &[SpecFlow],
    duration: Duration,
    opts: &RunOptions,
) -> (SendReport, Received) {
    let run: u32 = rand_u32();
    let stop_rx = Arc::new(AtomicBool::new(false));
    let stop_tx = opts.stop.clone().unwrap_or_else(|| Arc::new(AtomicBool::new(false)));
    let (ready_tx, ready_rx) = mpsc::channel();
    let n = flows.len();
    let (rns, rif) = (rx_ns.to_string(), rx_if.to_string());
    let st = stop_rx.clone();
    let (marked_only, keep_marks) = (opts.marked_only, opts.keep_marks);
    let receiver = thread::spawn(move || {
        enter(&rns).expect("enter receive namespace");
        let sock = RawSocket::bind(&rif).expect("bind receive socket");
        sock.big_buffers().expect("socket buffers");
        if marked_only {
            accept_only_marked(&sock).expect("socket filter");
            // Frames queued between bind and filter are not ours to count.
            sock.set_timeout(Duration::from_millis(1)).expect("timeout");
            let mut buf = vec![0u8; 65536];
            while sock.recv(&mut buf).expect("recv").is_some() {}
            sock.drops().expect("socket statistics");
        }
        ready_tx.send(()).unwrap();
        receive_marks(&sock, n, run, &st, keep_marks)
    });
    ready_rx.recv().expect("receiver ready");
    let (tns, tif) = (tx_ns.to_string(), tx_if.to_string());
    let fl = flows.to_vec();
    let stx = stop_tx.clone();
    let cpu = opts.sender_cpu;
    let sender = thread::spawn(move || {
        enter(&tns).expect("enter transmit namespace");
        if let Some(cpu) = cpu {
            crate::bench::sys::pin_cpu(cpu).expect("pin the sender");
        }
        let sock = RawSocket::bind(&tif).expect("bind transmit socket");
        sock.big_buffers().expect("socket buffers");
        send_specs(&sock, &fl, dst_mac, run, duration, &stx)
    });
    let sent = sender.join().expect("sender");
    stop_rx.store(true, Ordering::Relaxed);
    let recv = receiver.join().expect("receiver");
    (sent, recv)
}

/// Per flow, the frames sent from `from_ns` (ns since [`epoch_ns`]) on,
/// and how many of them arrived: (sent, arrived). Needs a run with
/// [`RunOptions::keep_marks`].
pub fn since(sent: &SendReport, got: &Received, from_ns: u64) -> (Vec<u64>, Vec<u64>) {
    let n = sent.sent.len();
    let cut = from_ns.saturating_sub(sent.start_epoch_ns);
    // Sequence numbers count each flow's frames from 0 in send order.
    let mut seq = vec![0u32; n];
    let mut first = vec![u32::MAX; n];
    let mut after = vec![0u64; n];
    for &(t, i) in &sent.frames {
        let i = i as usize;
        if t >= cut {
            first[i] = first[i].min(seq[i]);
            after[i] += 1;
        }
        seq[i] += 1;
    }
    let mut arrived = vec![0u64; n];
    for &(flow, s) in &got.marks {
        if let Some(a) = arrived.get_mut(flow as usize)
            && s >= first[flow as usize]
        {
            *a += 1;
        }
    }
    (after, arrived)
}

/// A classic BPF socket filter on `sock` that keeps only frames carrying
/// the marker at the start of the UDP payload of an untagged IPv4 (no
/// options) or IPv6 frame, as [`send`] builds them. Frames it rejects are
/// not counted as the socket's drops.
pub fn accept_only_marked(sock: &RawSocket) -> std::io::Result<()> {
    let marker = u32::from_be_bytes(crate::frame::MARKER);
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
    let (ld_h, ld_w, jeq, ret) = (
        libc::BPF_LD | libc::BPF_H | libc::BPF_ABS,
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        libc::BPF_RET | libc::BPF_K,
    );
    let prog = [
        op(ld_h, 0, 0, 12),    // 0: EtherType
        op(jeq, 0, 2, 0x0800), // 1: IPv4 -> 2, else 4
        op(ld_w, 0, 0, 42),    // 2: payload of 14 + 20 + 8
        op(jeq, 3, 4, marker), // 3: marker -> 7, else 8
        op(jeq, 0, 3, 0x86dd), // 4: IPv6 -> 5, else 8
        op(ld_w, 0, 0, 62),    // 5: payload of 14 + 40 + 8
        op(jeq, 0, 1, marker), // 6: marker -> 7, else 8
        op(ret, 0, 0, 0xffff), // 7: accept
        op(ret, 0, 0, 0),      // 8: reject
    ];
    attach_filter(sock, &prog)
}

/// A classic BPF socket filter on `sock` that keeps only untagged UDP
/// frames to port `dport` of one family (IPv4 without options, or IPv6
/// without extension headers), as [`send`] and the flood generator build
/// them: with [`RawSocket::counts`], a count of what of one kind of traffic
/// arrived past XDP.
pub fn accept_only_udp_to(sock: &RawSocket, v6: bool, dport: u16) -> std::io::Result<()> {
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
    let (ld_b, ld_h, jeq, ret) = (
        libc::BPF_LD | libc::BPF_B | libc::BPF_ABS,
        libc::BPF_LD | libc::BPF_H | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        libc::BPF_RET | libc::BPF_K,
    );
    // EtherType; the IP protocol (or IPv6 next header); the UDP port.
    let (ether, proto_at, port_at) = if v6 { (0x86dd, 14 + 6, 14 + 40 + 2) } else { (0x0800, 14 + 9, 14 + 20 + 2) };
    let prog = [
        op(ld_h, 0, 0, 12),              // 0: EtherType
        op(jeq, 0, 4, ether),            // 1: the family -> 2, else 6
        op(ld_b, 0, 0, proto_at),        // 2: protocol
        op(jeq, 0, 2, 17),               // 3: UDP -> 4, else 6
        op(ld_h, 0, 0, port_at),         // 4: destination port
        op(jeq, 1, 0, u32::from(dport)), // 5: the port -> 7, else 6
        op(ret, 0, 0, 0),                // 6: reject
        op(ret, 0, 0, 0xffff),           // 7: accept
    ];
    attach_filter(sock, &prog)
}

/// Attaches the classic BPF program `prog` to `sock` (SO_ATTACH_FILTER).
fn attach_filter(sock: &RawSocket, prog: &[libc::sock_filter]) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: pointer and length describe `fprog`, which points at `prog`;
    // the kernel copies the program.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            &fprog as *const _ as *const libc::c_void,
            std::mem::size_of_val(&fprog) as u32,
        )
    };
    if r != 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) }
}

fn rand_u32() -> u32 {
    let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (t.subsec_nanos() ^ std::process::id().rotate_left(16)) | 1
}

/// [`run`] in a background thread, so a test can act while traffic flows.
pub fn run_bg(sb: &Sandbox, flows: &[Flow], duration: Duration) -> thread::JoinHandle<(SendReport, Received)> {
    let (tx_ns, tx_if, rx_ns, rx_if, mac) =
        (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_ns.clone(), sb.rx_if.clone(), sb.rx_mac());
    let flows = flows.to_vec();
    epoch_ns();
    thread::spawn(move || run_in(&tx_ns, &tx_if, &rx_ns, &rx_if, mac, &flows, duration, None))
}

/// What an exact policer admits of flow 0 as it was actually sent (the
/// host model of the bucket over the real send times). A generator that
/// stalls (a loaded machine) hands the bucket idle gaps it cannot bank
/// beyond its burst; comparing against this, rather than rate x T + burst,
/// keeps a stall from looking like a policer error.
pub fn exact_admitted(sent: &SendReport, rule: &policer_common::Rule, len: u32) -> u64 {
    exact_model(rule, sent.frames.iter().filter(|f| f.1 == 0).map(|&(t, _)| (t, len))).0
}

/// [`exact_admitted`] for flow `flow` (frames of `len` bytes).
pub fn exact_admitted_flow(sent: &SendReport, rule: &policer_common::Rule, flow: usize, len: u32) -> u64 {
    exact_model(rule, sent.frames.iter().filter(|f| f.1 as usize == flow).map(|&(t, _)| (t, len))).0
}

/// Of flow `flow`'s frames sent in `[from_ns, to_ns)` (ns since
/// [`epoch_ns`]), how many an exact policer under `rule` admits when the
/// rule was in force from the flow's first frame on: the bucket runs over
/// every earlier frame too, so a catch-up burst after a sender's stall is
/// judged as the kernel judges it.
pub fn exact_admitted_in(sent: &SendReport, rule: &policer_common::Rule, flow: usize, from_ns: u64, to_ns: u64) -> u64 {
    let (from, to) = (from_ns.saturating_sub(sent.start_epoch_ns), to_ns.saturating_sub(sent.start_epoch_ns));
    let mut tat = rule.empty_tat(1_000_000_000);
    let mut n = 0;
    for &(t, _) in sent.frames.iter().filter(|f| f.1 as usize == flow && f.0 < to) {
        if let Some(new) = rule.admit(tat, 1_000_000_000 + t, 64) {
            tat = new;
            n += u64::from(t >= from);
        }
    }
    n
}

/// Whether flow `flow` got what a source under `rule` (one bucket, from its
/// first frame, 64-byte frames) is due over its real send times: every
/// frame when the sender kept its pace, else the exact policer's count
/// within 0.5 % + 2 frames. `Err` says what arrived against what is due.
pub fn within_rule(sent: &SendReport, got: &Received, rule: &policer_common::Rule, flow: usize) -> Result<(), String> {
    let (s, a) = (sent.sent[flow], got.per_flow[flow]);
    let exact = exact_admitted_flow(sent, rule, flow, 64);
    let ok = if exact == s { a == s } else { (a as f64 - exact as f64).abs() <= exact as f64 * 0.005 + 2.0 };
    if ok { Ok(()) } else { Err(format!("arrived {a} of {s}, an exact policer admits {exact}")) }
}

/// Frames one bucket under `rule` admits of the frames of `flows` together
/// (an aggregate over some flows), frames of 64 bytes.
pub fn exact_model_of_flows(sent: &SendReport, rule: &policer_common::Rule, flows: &[usize]) -> u64 {
    exact_model(rule, sent.frames.iter().filter(|f| flows.contains(&(f.1 as usize))).map(|&(t, _)| (t, 64))).0
}

/// Frames an exact policer admits when every flow shares one bucket (one
/// source, or one prefix grouped by key length), frames of `len` bytes.
pub fn exact_admitted_shared(sent: &SendReport, rule: &policer_common::Rule, len: u32) -> u64 {
    exact_model(rule, sent.frames.iter().map(|&(t, _)| (t, len))).0
}

/// Bytes an exact policer admits when all `flows` share one bucket (one
/// source), over the real send times of every frame: see [`exact_admitted`].
pub fn exact_admitted_bytes(sent: &SendReport, flows: &[Flow], rule: &policer_common::Rule) -> u64 {
    exact_model(rule, sent.frames.iter().map(|&(t, i)| (t, flows[i as usize].len as u32))).1
}

/// (frames, bytes) one bucket under `rule` admits of (time in ns, length):
/// the exact token bucket on those times (`policer replay`'s model).
pub fn exact_admitted_at(rule: &policer_common::Rule, frames: impl Iterator<Item = (u64, u32)>) -> (u64, u64) {
    exact_model(rule, frames)
}

/// (frames, bytes) one bucket under `rule` admits of (send time, length).
fn exact_model(rule: &policer_common::Rule, frames: impl Iterator<Item = (u64, u32)>) -> (u64, u64) {
    let mut tat = rule.empty_tat(1_000_000_000);
    let (mut n, mut bytes) = (0, 0);
    for (t, len) in frames {
        if let Some(new) = rule.admit(tat, 1_000_000_000 + t, len) {
            tat = new;
            n += 1;
            bytes += len as u64;
        }
    }
    (n, bytes)
}

/// How many tries a test that needs a smooth sender makes before it says
/// the machine is overloaded (each try with fresh sources).
pub const SMOOTH_TRIES: u32 = 5;

/// Writes out what the machine has pending for its disks, before a run
/// whose sender must keep its schedule; returns how long that took. Right
/// after a build (CI compiles each tier just before running it) hundreds
/// of MB are written back 30 s after they were dirtied, in the middle of
/// the first tests, and on this 2-core machine that work can stall a
/// sender for tens of ms (a stalled sender hands a bucket idle time it
/// cannot bank beyond its burst, and the try does not count).
pub fn settle_disk() -> Duration {
    let t = std::time::Instant::now();
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    t.elapsed()
}

/// Whether flow 0 was sent smoothly enough for a rate x T + burst check:
/// the exact policer's count over the real send times is within `tol` of it.
pub fn smooth(sent: &SendReport, rule: &policer_common::Rule, rate_pps: f64, burst: f64, tol: f64) -> bool {
    let ideal = rate_pps * sent.span_secs(0) + burst;
    (exact_admitted(sent, rule, 64) as f64 - ideal).abs() <= tol * ideal
}

/// Frames of flow 0 that arrived in [from, to) (ns since [`epoch_ns`]).
pub fn arrived_between(r: &Received, from: u64, to: u64) -> u64 {
    r.arrivals0.iter().filter(|&&t| t >= from && t < to).count() as u64
}

/// Sends `frames` as they are from the sandbox's transmit side, back to
/// back. Returns when all are sent.
pub fn send_raw(sb: &Sandbox, frames: Vec<Vec<u8>>) {
    let (ns, ifc) = (sb.tx_ns.clone(), sb.tx_if.clone());
    thread::spawn(move || {
        enter(&ns).expect("enter transmit namespace");
        let sock = RawSocket::bind(&ifc).expect("bind transmit socket");
        for f in &frames {
            sock.send(f).expect("send");
        }
    })
    .join()
    .expect("raw sender");
}
