//! `policer capture`, the daemon's side: the hub that owns the capture maps
//! (their one writer: they are not rule state, so they do not go through
//! the owner), reads the ring buffer in a task of its own, and hands each
//! record to the captures whose lanes took it; and the connection's side,
//! which writes one capture's pcapng to its client in chunks.
//!
//! Bounds: at most [`MAX_CAPTURES`] captures (each also holds a control
//! connection permit); each has a queue of [`QUEUE_FRAMES`] frames between
//! the ring's reader and its connection, and a full queue drops the frame
//! and counts it (a slow reader never grows the daemon); the kernel bounds
//! each lane's rate, so the ring's reader does at most the sum of the
//! bounds' work.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use aya::maps::{Array, MapData, PerCpuArray, RingBuf};
use policer_common::{
    FAMILY_V4, FAMILY_V6,
    capture::{CaptureCounters, CaptureLane, CaptureRecord, MAX_CAPTURES, on_word},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::UnixStream,
    sync::mpsc,
    time::{Instant, timeout},
};

use crate::{
    capture::{CHUNK_DATA, CHUNK_END, CaptureSpec, CaptureStatus, CaptureSummary, Frame, PcapNg, frame_chunk},
    control::Reply,
    error::{Error, Result},
    loader::CaptureMaps,
};

/// Frames queued for one capture's connection.
pub const QUEUE_FRAMES: usize = 2048;
/// Bytes of pcapng gathered before a chunk is written (or
/// [`FLUSH_EVERY`], whichever comes first).
const CHUNK_BYTES: usize = 32 << 10;
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// A client that leaves a chunk untaken this long is dropped.
const STALL: Duration = Duration::from_secs(10);
/// With nothing to send, an empty chunk goes out this often: a client
/// that takes nothing (stopped, or a connection that never reads) is then
/// seen, and dropped after [`STALL`], even when no frame matches — it
/// would otherwise hold its lane (one of 8) for good.
const KEEPALIVE: Duration = Duration::from_secs(1);

/// The kernel's side of the hub: the maps it writes.
struct Kernel {
    on: Array<MapData, u64>,
    lanes: Array<MapData, CaptureLane>,
    rules: Array<MapData, u32>,
    counters: PerCpuArray<MapData, CaptureCounters>,
}

/// A lane in use: where its frames go.
struct Lane {
    tx: mpsc::Sender<Arc<Frame>>,
    slow: Arc<AtomicU64>,
    /// The rule slots whose CAPTURE_RULES entry has this lane's bit.
    slots: Vec<u32>,
    /// The verdicts it takes and its sample (its part of the CAPTURE_ON
    /// word).
    verdicts: u32,
    sample_every: u32,
}

struct State {
    lanes: [Option<Lane>; MAX_CAPTURES],
    /// Wall clock minus the program's clock, ns (set at a capture's start).
    offset_ns: i128,
    /// Rule names by counter slot and interface names by index, as of
    /// the last capture's start.
    rules: BTreeMap<u32, (String, String)>,
}

pub struct Hub {
    kernel: Result<Mutex<Kernel>, String>,
    state: Mutex<State>,
    /// Frames dropped for slow readers, since the start.
    slow_total: AtomicU64,
}

impl Hub {
    /// The hub over the program's capture maps, and its ring reader task
    /// (on the current runtime). `maps` is an error for a program without
    /// them: every capture is then refused with it.
    pub fn start(maps: Result<CaptureMaps>) -> Arc<Hub> {
        let (kernel, ring) = match maps {
            Ok(m) => (
                Ok(Mutex::new(Kernel { on: m.on, lanes: m.lanes, rules: m.rules, counters: m.counters })),
                Some(m.ring),
            ),
            Err(e) => (Err(e.to_string()), None),
        };
        let hub = Arc::new(Hub {
            kernel,
            state: Mutex::new(State { lanes: Default::default(), offset_ns: 0, rules: BTreeMap::new() }),
            slow_total: AtomicU64::new(0),
        });
        if let Some(ring) = ring {
            let h = hub.clone();
            tokio::spawn(async move {
                if let Err(e) = read_ring(ring, &h).await {
                    log::warn!("capture ring buffer unavailable: {e}");
                }
            });
        }
        // Whatever a daemon killed mid-capture left: nothing, since the
        // maps are this program's own; cleared anyway, so a capture starts
        // from a known state.
        if let Ok(k) = &hub.kernel
            && let Ok(mut k) = k.lock()
        {
            let _ = k.on.set(0, &0, 0);
        }
        hub
    }

    fn kernel(&self) -> Result<std::sync::MutexGuard<'_, Kernel>> {
        match &self.kernel {
            Ok(k) => k.lock().map_err(|_| Error::Invalid("capture: internal lock poisoned".into())),
            Err(e) => Err(Error::Invalid(e.clone())),
        }
    }

    /// The captures running now (`status`): the hub's own state, no
    /// kernel read.
    pub fn active(&self) -> u32 {
        self.state.lock().map(|s| s.lanes.iter().filter(|l| l.is_some()).count() as u32).unwrap_or(0)
    }

    /// `stats --json`'s and `/metrics`' capture counts; none when the
    /// program has no capture maps.
    pub fn status(&self) -> Option<CaptureStatus> {
        let k = self.kernel().ok()?;
        let mut total = CaptureCounters::default();
        for i in 0..MAX_CAPTURES as u32 {
            if let Ok(v) = k.counters.get(&i, 0) {
                for c in v.iter() {
                    total.add(c);
                }
            }
        }
        Some(CaptureStatus {
            active: self.active(),
            kernel_mask: k.on.get(&0, 0).unwrap_or(0),
            frames: total.captured,
            rate_bounded: total.rate_bounded,
            ring_full: total.ring_full,
            slow_reader: self.slow_total.load(Ordering::Relaxed),
        })
    }

    fn lane_counters(k: &Kernel, lane: u32) -> CaptureCounters {
        let mut total = CaptureCounters::default();
        if let Ok(v) = k.counters.get(&lane, 0) {
            for c in v.iter() {
                total.add(c);
            }
        }
        total
    }

    /// Starts a capture: a free lane written with its filter, then its
    /// bit set in the mask the program reads.
    fn open(&self, spec: &CaptureSpec, names: Names) -> Result<Session> {
        spec.check()?;
        let mut lane = CaptureLane::bounded(spec.max_pps, spec.sample);
        lane.verdicts = spec.verdicts;
        let mut slots = Vec::new();
        if spec.rules.is_empty() {
            lane.all_rules = 1;
        } else {
            for want in &spec.rules {
                let norm = want.parse::<ipnet::IpNet>().map(|n| n.trunc().to_string()).unwrap_or(want.clone());
                let found: Vec<u32> =
                    names.rules.iter().filter(|(_, (prefix, _))| *prefix == norm).map(|(slot, _)| *slot).collect();
                if found.is_empty() {
                    return Err(Error::Invalid(format!(
                        "--rule {want}: no rule of that prefix is in force (`policer rule ls` names them)"
                    )));
                }
                slots.extend(found);
            }
            slots.sort_unstable();
            slots.dedup();
        }
        if let Some(src) = &spec.source {
            let net = crate::capture::parse_source(src)?;
            let (family, addr, len) = match net {
                ipnet::IpNet::V4(n) => {
                    let mut a = [0u8; 16];
                    a[..4].copy_from_slice(&n.addr().octets());
                    (FAMILY_V4, a, n.prefix_len() as usize)
                }
                ipnet::IpNet::V6(n) => (FAMILY_V6, n.addr().octets(), n.prefix_len() as usize),
            };
            lane.src_family = family;
            for (i, a) in addr.iter().enumerate() {
                let bits = len.saturating_sub(i * 8).min(8);
                lane.src_mask[i] = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
                lane.src[i] = a & lane.src_mask[i];
            }
        }
        let mut k = self.kernel()?;
        let mut st = self.state.lock().map_err(|_| Error::Invalid("capture: internal lock poisoned".into()))?;
        let Some(i) = st.lanes.iter().position(|l| l.is_none()) else {
            return Err(Error::Invalid(format!(
                "{MAX_CAPTURES} captures are running: the most at once; try again when one ends"
            )));
        };
        let bit = 1u32 << i;
        let io = |e: aya::maps::MapError| Error::Invalid(format!("capture: writing the program's maps: {e}"));
        // The lane first, its rules, then its bit: the program never sees
        // the bit without the lane's filter.
        k.lanes.set(i as u32, &lane, 0).map_err(io)?;
        let mut written = Vec::new();
        for &s in &slots {
            let old = k.rules.get(&s, 0).unwrap_or(0);
            if let Err(e) = k.rules.set(s, &(old | bit), 0) {
                for &w in &written {
                    let old = k.rules.get(&w, 0).unwrap_or(0);
                    let _ = k.rules.set(w, &(old & !bit), 0);
                }
                return Err(io(e));
            }
            written.push(s);
        }
        let on = on_word(
            st.lanes
                .iter()
                .enumerate()
                .filter_map(|(j, l)| l.as_ref().map(|l| (j, l.verdicts, l.sample_every)))
                .chain([(i, lane.verdicts, lane.sample_every)]),
        );
        if let Err(e) = k.on.set(0, &on, 0) {
            for &w in &written {
                let old = k.rules.get(&w, 0).unwrap_or(0);
                let _ = k.rules.set(w, &(old & !bit), 0);
            }
            return Err(io(e));
        }
        let before = Self::lane_counters(&k, i as u32);
        st.offset_ns = wall_minus_monotonic();
        st.rules = names.rules.clone();
        let (tx, rx) = mpsc::channel(QUEUE_FRAMES);
        let slow = Arc::new(AtomicU64::new(0));
        st.lanes[i] =
            Some(Lane { tx, slow: slow.clone(), slots, verdicts: lane.verdicts, sample_every: lane.sample_every });
        Ok(Session { lane: i as u32, rx, slow, before, ifaces: names.ifaces })
    }

    /// Ends a capture: its bit cleared first (when it was the last, the
    /// program is back to the branch not taken), then its rules; its
    /// counts since its start.
    fn close(&self, lane: u32) -> CaptureCounters {
        let bit = 1u32 << lane;
        let Ok(mut k) = self.kernel() else {
            return CaptureCounters::default();
        };
        // The lane leaves the state and the word under both locks (the
        // order `open` takes them), so the word is always the lanes in use.
        let (slots, on) = match self.state.lock() {
            Ok(mut st) => {
                let slots = st.lanes[lane as usize].take().map(|l| l.slots);
                (slots, lanes_word(&st.lanes))
            }
            Err(_) => (None, k.on.get(&0, 0).unwrap_or(0) & !u64::from(bit)),
        };
        if let Err(e) = k.on.set(0, &on, 0) {
            log::warn!("capture: cannot clear lane {lane} in the program: {e}");
        }
        for s in slots.unwrap_or_default() {
            let old = k.rules.get(&s, 0).unwrap_or(0);
            let _ = k.rules.set(s, &(old & !bit), 0);
        }
        Self::lane_counters(&k, lane)
    }

    /// Hands a ring record to the lanes that took it.
    fn dispatch(&self, bytes: &[u8]) {
        let Some((h, data)) = CaptureRecord::parse(bytes) else {
            return;
        };
        let Ok(st) = self.state.lock() else {
            return;
        };
        let unix_ns = (h.time_ns as i128 + st.offset_ns).clamp(0, u64::MAX as i128) as u64;
        let rule = st.rules.get(&h.rule_slot).map_or_else(|| format!("slot:{}", h.rule_slot), |r| r.1.clone());
        let frame =
            Arc::new(Frame { unix_ns, len: h.len, ifindex: h.ifindex, verdict: h.verdict, rule, data: data.to_vec() });
        for (i, lane) in st.lanes.iter().enumerate() {
            if h.lanes & (1 << i) == 0 {
                continue;
            }
            if let Some(l) = lane
                && l.tx.try_send(frame.clone()).is_err()
            {
                l.slow.fetch_add(1, Ordering::Relaxed);
                self.slow_total.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// CLOCK_REALTIME − CLOCK_MONOTONIC, ns: what turns the program's clock
/// into wall-clock time.
fn wall_minus_monotonic() -> i128 {
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as i128);
    wall - crate::duration::monotonic_ns() as i128
}

/// Reads the ring as it fills, until the runtime ends.
async fn read_ring(ring: RingBuf<MapData>, hub: &Hub) -> Result<()> {
    // SAFETY: the ring map owns its fd for as long as the AsyncFd holds it;
    // reading records neither closes nor replaces it.
    let mut fd = unsafe { tokio::io::unix::AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) }
        .map_err(|e| Error::Invalid(format!("watching the capture ring: {e}")))?;
    loop {
        let mut guard = fd.readable_mut().await?;
        let ring = guard.get_inner_mut();
        let mut n = 0;
        while let Some(item) = ring.next() {
            hub.dispatch(&item);
            n += 1;
            // Let other tasks run now and then under a full ring.
            if n % 1024 == 0 {
                break;
            }
        }
        if n % 1024 != 0 || n == 0 {
            guard.clear_ready();
        } else {
            drop(guard);
            tokio::task::yield_now().await;
        }
    }
}

/// A capture in progress.
struct Session {
    lane: u32,
    rx: mpsc::Receiver<Arc<Frame>>,
    slow: Arc<AtomicU64>,
    before: CaptureCounters,
    ifaces: BTreeMap<u32, String>,
}

/// Names the capture writes: rules by counter slot, interfaces by index.
pub struct Names {
    /// slot → (prefix, name with its class).
    pub rules: BTreeMap<u32, (String, String)>,
    pub ifaces: BTreeMap<u32, String>,
}

/// Serves a `capture` request on its connection: the first line, then
/// pcapng chunks until the capture ends (its count, its duration, the
/// client going away, a client that stops reading, the daemon stopping),
/// then the summary. `names`: the rules' and interfaces' names as the
/// views have them now (`Views::capture_names`).
pub async fn serve(
    mut stream: UnixStream,
    hub: &Hub,
    names: Names,
    spec: CaptureSpec,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let session = hub.open(&spec, names);
    let mut s = match session {
        Ok(s) => s,
        Err(e) => {
            let _ = timeout(STALL, stream.write_all(&Reply::refused(e.to_string()).line())).await;
            return;
        }
    };
    let lane = s.lane;
    let mut summary = CaptureSummary::default();
    let ended = run(&mut stream, &mut s, &spec, &mut summary, &mut stop).await;
    let counts = hub.close(lane).since(&s.before);
    summary.matched = counts.matched;
    summary.rate_bounded = counts.rate_bounded;
    summary.ring_full = counts.ring_full;
    // Frames still queued when it ended are not lost to a slow reader.
    summary.slow_reader = s.slow.load(Ordering::Relaxed);
    summary.ended = ended;
    if let Ok(json) = serde_json::to_vec(&summary) {
        let _ = timeout(STALL, async {
            stream.write_all(&frame_chunk(CHUNK_END, &json)).await?;
            stream.shutdown().await
        })
        .await;
    }
}

/// The capture's loop; what ended it.
async fn run(
    stream: &mut UnixStream,
    s: &mut Session,
    spec: &CaptureSpec,
    summary: &mut CaptureSummary,
    stop: &mut tokio::sync::watch::Receiver<bool>,
) -> String {
    let message = format!(
        "capturing on lane {} ({} frames/s at most{})",
        s.lane,
        spec.max_pps,
        if spec.sample > 1 { format!(", 1 in {}", spec.sample) } else { String::new() }
    );
    let first = Reply::Capturing { message }.line();
    if timeout(STALL, stream.write_all(&first)).await.map_or(true, |r| r.is_err()) {
        return "client".into();
    }
    let mut pcap = match PcapNg::new(s.ifaces.clone()) {
        Ok(p) => p,
        Err(e) => return e.to_string(),
    };
    let deadline = spec.duration_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let far = Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600);
    let mut flush = tokio::time::interval(FLUSH_EVERY);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&*stream);
    let (mut rd, mut wr) = stream.split();
    let mut scratch = [0u8; 64];
    let mut alive = tokio::time::interval(KEEPALIVE);
    let mut taken = Taken::default();
    // The section header goes out at once: a reader sees a valid file.
    if write_data(&mut wr, pcap.take()).await.is_err() {
        return "client".into();
    }
    loop {
        tokio::select! {
            f = s.rx.recv() => {
                let Some(f) = f else { return "daemon".into() };
                if let Err(e) = pcap.write(&f) {
                    return e.to_string();
                }
                summary.written += 1;
                let done = spec.count.is_some_and(|c| summary.written >= c);
                if done || pcap.pending() >= CHUNK_BYTES {
                    if write_data(&mut wr, pcap.take()).await.is_err() {
                        return "client".into();
                    }
                    taken.wrote();
                }
                if done {
                    return "count".into();
                }
            }
            _ = flush.tick() => {
                if pcap.pending() > 0 {
                    if write_data(&mut wr, pcap.take()).await.is_err() {
                        return "client".into();
                    }
                    taken.wrote();
                }
            }
            _ = tokio::time::sleep_until(deadline.unwrap_or(far)) => {
                let _ = write_data(&mut wr, pcap.take()).await;
                return "duration".into();
            }
            _ = alive.tick() => {
                // Nothing pending to send: an empty chunk, so that a client
                // that takes nothing fills its queue.
                if pcap.pending() == 0
                    && timeout(STALL, wr.write_all(&frame_chunk(CHUNK_DATA, &[]))).await.map_or(true, |r| r.is_err())
                {
                    return "client".into();
                }
                if taken.stalled(unread(fd), std::time::Instant::now()) {
                    return "client (it took nothing for 10 s)".into();
                }
            }
            // The client closed its side (or went away): end at once.
            r = rd.read(&mut scratch) => {
                if matches!(r, Ok(0) | Err(_)) {
                    let _ = write_data(&mut wr, pcap.take()).await;
                    return "client".into();
                }
            }
            _ = stop.changed() => {
                let _ = write_data(&mut wr, pcap.take()).await;
                return "daemon".into();
            }
        }
    }
}

/// Bytes written to `fd` (a connected Unix stream socket) that its peer
/// has not read yet (`SIOCOUTQ`); 0 when it cannot be read.
fn unread(fd: std::os::fd::RawFd) -> usize {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int; `fd` is the open socket
    // of the capture's connection.
    let r = unsafe { libc::ioctl(fd, libc::TIOCOUTQ, &mut n) };
    if r == 0 { n.max(0) as usize } else { 0 }
}

/// Whether a client takes what it is sent: the bytes it has not read,
/// looked at once per [`KEEPALIVE`]. Stalled when they were there and
/// never fell for [`STALL`], and no frames' write went through meanwhile:
/// while frames flow faster than a slow client reads, its queue stays
/// full yet it reads — a write that goes through is progress, and a write
/// the client never takes ends at its own [`STALL`] timeout.
#[derive(Default)]
struct Taken {
    last: usize,
    since: Option<std::time::Instant>,
}

impl Taken {
    fn stalled(&mut self, unread: usize, now: std::time::Instant) -> bool {
        let progress = unread == 0 || unread < self.last;
        self.last = unread;
        if progress {
            self.since = None;
            return false;
        }
        now.duration_since(*self.since.get_or_insert(now)) >= STALL
    }

    /// Frames' bytes went to the client (its queue had room for them).
    fn wrote(&mut self) {
        self.since = None;
    }
}

async fn write_data(w: &mut (impl AsyncWriteExt + Unpin), bytes: Vec<u8>) -> std::io::Result<()> {
    for part in bytes.chunks(crate::capture::MAX_CHUNK_BYTES) {
        timeout(STALL, w.write_all(&frame_chunk(CHUNK_DATA, part)))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    }
    Ok(())
}

/// The CAPTURE_ON word for the lanes in use.
fn lanes_word(lanes: &[Option<Lane>; MAX_CAPTURES]) -> u64 {
    on_word(lanes.iter().enumerate().filter_map(|(i, l)| l.as_ref().map(|l| (i, l.verdicts, l.sample_every))))
}

#[cfg(test)]
mod stall_tests {
    use super::*;

    #[test]
    fn a_client_that_takes_nothing_is_stalled_after_the_bound_and_one_that_reads_never() {
        let t0 = std::time::Instant::now();
        let mut t = Taken::default();
        // Never read: what was sent stays, and grows with each empty chunk.
        let mut stalled_at = None;
        for i in 0..20u64 {
            if t.stalled(5 * (i as usize + 1), t0 + Duration::from_secs(i)) {
                stalled_at = Some(i);
                break;
            }
        }
        assert_eq!(stalled_at, Some(STALL.as_secs()));
        // A reader: the queue empties (or falls) between looks.
        let mut t = Taken::default();
        for i in 0..100u64 {
            let unread = if i % 3 == 0 { 0 } else { 1000 - i as usize };
            assert!(!t.stalled(unread, t0 + Duration::from_secs(i)), "at {i}");
        }
    }

    /// A client slower than the frames: its queue stays full at every look,
    /// but the frames' writes go through as it reads. Not stalled; once the
    /// writes stop going through (no frames, or it stopped reading) the
    /// bound counts from the first look after the last write.
    #[test]
    fn a_slow_reader_under_a_full_queue_is_not_stalled_while_writes_go_through() {
        let t0 = std::time::Instant::now();
        let mut t = Taken::default();
        let full = 212_992;
        for i in 0..100u64 {
            t.wrote();
            assert!(!t.stalled(full, t0 + Duration::from_secs(i)), "dropped at {i} s while reading");
        }
        let mut stalled_at = None;
        for i in 100..130u64 {
            if t.stalled(full, t0 + Duration::from_secs(i)) {
                stalled_at = Some(i);
                break;
            }
        }
        // The last write at 99 s, the first look after it at 99 s.
        assert_eq!(stalled_at, Some(99 + STALL.as_secs()));
    }
}
