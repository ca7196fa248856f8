//! Accuracy: sources offered 10× their limit, smoothly paced (the tests'
//! AF_PACKET generator), and what each system admitted against
//! `rate·T + burst`. Counted where every system's verdict is final: a UDP
//! socket in the receiving namespace (nftables ingress and iptables raw
//! run after AF_PACKET taps, so a raw receive socket would see frames
//! they drop).

use std::{
    net::{Ipv4Addr, UdpSocket},
    os::fd::AsRawFd,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::{
    Stat,
    peers::{Limit, System, hashlimit, nft, policer},
    say,
    sys::{DST, Net, settle},
};
use crate::{
    frame::MARKER,
    netns::enter,
    packet::RawSocket,
    traffic::{Flow, SendReport, epoch_ns, send},
};

/// What the receiving UDP socket counted.
#[derive(Clone, Debug, Default)]
pub struct UdpReceived {
    pub per_flow: Vec<u64>,
    /// Arrival times of flow 0's datagrams (kernel receive timestamps), ns
    /// since [`epoch_ns`].
    pub arrivals0: Vec<u64>,
    pub foreign: u64,
}

fn setsockopt(s: &UdpSocket, opt: i32, v: i32) {
    // SAFETY: pointer and length describe `v`.
    unsafe { libc::setsockopt(s.as_raw_fd(), libc::SOL_SOCKET, opt, &v as *const _ as *const libc::c_void, 4) };
}

fn realtime_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64
}

/// One datagram and the kernel's receive timestamp (SO_TIMESTAMPNS,
/// CLOCK_REALTIME ns), taken when the frame entered the stack: the
/// receiver thread's own scheduling delays do not move it.
fn recv_ts(s: &UdpSocket, buf: &mut [u8]) -> std::io::Result<(usize, Option<u64>)> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data; every pointer in it describes a live
    // buffer of the stated length; cmsgs are walked with the libc macros.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = libc::recvmsg(s.as_raw_fd(), &mut msg, 0);
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ts = None;
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                let t: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                ts = Some(t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
        Ok((n as usize, ts))
    }
}

/// Sends `flows` paced from the transmit side for `duration` and counts,
/// per flow, the datagrams a UDP socket on the receiving side gets.
/// `during` runs on the calling thread while traffic flows.
pub fn paced(
    net: &Net,
    flows: &[Flow],
    duration: Duration,
    during: impl FnOnce(),
) -> Result<(SendReport, UdpReceived)> {
    let run: u32 = (epoch_ns() as u32) | 1;
    let n = flows.len();
    let stop = Arc::new(AtomicBool::new(false));
    let (ready_tx, ready_rx) = mpsc::channel();
    let rns = net.sb.rx_ns.clone();
    let st = stop.clone();
    epoch_ns();
    let receiver = thread::spawn(move || -> Result<UdpReceived> {
        enter(&rns)?;
        let sock = UdpSocket::bind((Ipv4Addr::from(DST), 9)).context("bind the UDP receiver")?;
        setsockopt(&sock, libc::SO_RCVBUFFORCE, 64 << 20);
        setsockopt(&sock, libc::SO_TIMESTAMPNS, 1);
        // Kernel timestamps are CLOCK_REALTIME; arrivals are kept on the
        // process's monotonic epoch.
        let offset = realtime_ns() as i64 - epoch_ns() as i64;
        sock.set_read_timeout(Some(Duration::from_millis(50)))?;
        let _ = ready_tx.send(());
        let mut r = UdpReceived { per_flow: vec![0; n], ..Default::default() };
        let mut buf = [0u8; 2048];
        let mut quiet: Option<Instant> = None;
        loop {
            match recv_ts(&sock, &mut buf) {
                Ok((len, ts)) => {
                    quiet = None;
                    let m = &buf[..len];
                    if len >= 12 && m[..4] == MARKER {
                        let id = u32::from_be_bytes([m[4], m[5], m[6], m[7]]);
                        let flow = u32::from_be_bytes([m[8], m[9], m[10], m[11]]) as usize;
                        if id == run && flow < n {
                            if flow == 0 {
                                r.arrivals0.push(ts.map(|t| (t as i64 - offset) as u64).unwrap_or_else(epoch_ns));
                            }
                            r.per_flow[flow] += 1;
                            continue;
                        }
                    }
                    r.foreign += 1;
                }
                Err(_) => {
                    if st.load(Ordering::Relaxed)
                        && quiet.get_or_insert_with(Instant::now).elapsed() > Duration::from_millis(300)
                    {
                        return Ok(r);
                    }
                }
            }
        }
    });
    ready_rx.recv().context("receiver did not start")?;
    let (tns, tif, mac) = (net.sb.tx_ns.clone(), net.sb.tx_if.clone(), net.rx_mac);
    let fl = flows.to_vec();
    let sender = thread::spawn(move || -> Result<SendReport> {
        enter(&tns)?;
        let sock = RawSocket::bind(&tif)?;
        sock.big_buffers()?;
        Ok(send(&sock, &fl, mac, run, duration, &AtomicBool::new(false)))
    });
    during();
    let sent = sender.join().map_err(|_| anyhow::anyhow!("sender panicked"))??;
    stop.store(true, Ordering::Relaxed);
    let got = receiver.join().map_err(|_| anyhow::anyhow!("receiver panicked"))??;
    Ok((sent, got))
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccuracyRow {
    pub system: System,
    pub key: String,
    pub label: String,
    /// Heavy flows: admitted / exact - 1, per flow and repetition (see
    /// [`exact_admitted`]).
    pub error: Stat,
    /// Heavy flows: admitted / expected - 1, per flow and repetition.
    pub error_budget: Stat,
    /// Heavy flows: admitted, exact and expected (rate · T + burst), summed
    /// over flows, per repetition.
    pub admitted: Vec<u64>,
    pub exact: Vec<u64>,
    pub expected: Vec<f64>,
    pub sent: Vec<u64>,
    /// The light flow (half its limit): frames lost, per repetition.
    pub light_lost: Vec<u64>,
    /// The light flow: frames the exact bucket drops, per repetition.
    pub light_lost_exact: Vec<u64>,
    /// Heavy hitter's (flow 0) admitted rate per bin, last repetition.
    pub timeline: Vec<(f64, f64)>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct AccuracyResults {
    pub limit_pps: u64,
    pub burst: u64,
    pub offered_pps: f64,
    pub heavy_flows: usize,
    pub seconds: f64,
    pub reps: usize,
    pub bin_ms: u64,
    pub rows: Vec<AccuracyRow>,
}

pub const SYSTEMS: [System; 4] = [System::PolicerDrop, System::Nft, System::IptLegacy, System::IptNft];

pub fn run(quick: bool, reps: usize) -> Result<AccuracyResults> {
    let limit = Limit { pps: 1000, burst: 10 };
    let heavy = 4usize;
    let offered = 10.0 * limit.pps as f64;
    let secs = if quick { 2.0 } else { 5.0 };
    let bin_ms = 100u64;
    let mut flows: Vec<Flow> =
        (0..heavy).map(|i| Flow { src: Ipv4Addr::new(10, 2, 0, 1 + i as u8).into(), pps: offered, len: 64 }).collect();
    flows.push(Flow { src: Ipv4Addr::new(10, 2, 1, 1).into(), pps: limit.pps as f64 / 2.0, len: 64 });
    let mut rows = Vec::new();
    for sys in SYSTEMS {
        say(&format!("accuracy: {}", sys.label()));
        let (mut errs, mut errs_budget) = (Vec::new(), Vec::new());
        let (mut admitted, mut exact, mut expected, mut sent) = (vec![], vec![], vec![], vec![]);
        let (mut light_lost, mut light_lost_exact) = (vec![], vec![]);
        let mut timeline = vec![];
        for _ in 0..reps {
            // A fresh system each repetition: every source starts empty.
            let net = Net::new(&format!("a{}", sys.tag()))?;
            let _daemon = match sys {
                System::PolicerDrop => Some(policer(&net, limit, &["--max-sources", "65536"])),
                System::Nft => {
                    nft(&net, limit)?;
                    None
                }
                System::IptLegacy => {
                    hashlimit(&net, "iptables-legacy", limit)?;
                    None
                }
                _ => {
                    hashlimit(&net, "iptables-nft", limit)?;
                    None
                }
            };
            settle();
            let (s, r) = paced(&net, &flows, Duration::from_secs_f64(secs), || {})?;
            let exact_of = |f: usize| {
                let times = s.frames.iter().filter(|&&(_, i)| i as usize == f).map(|&(t, _)| t);
                exact_admitted(times, limit.pps, limit.burst)
            };
            let (mut a, mut x, mut e) = (0u64, 0u64, 0f64);
            for f in 0..heavy {
                let exp = limit.pps as f64 * s.span_secs(f) + limit.burst as f64;
                let ex = exact_of(f);
                errs.push(r.per_flow[f] as f64 / ex.max(1) as f64 - 1.0);
                errs_budget.push(r.per_flow[f] as f64 / exp - 1.0);
                a += r.per_flow[f];
                x += ex;
                e += exp;
            }
            admitted.push(a);
            exact.push(x);
            expected.push(e);
            sent.push(s.sent[..heavy].iter().sum());
            light_lost.push(s.sent[heavy].saturating_sub(r.per_flow[heavy]));
            light_lost_exact.push(s.sent[heavy].saturating_sub(exact_of(heavy)));
            timeline = bins(&r.arrivals0, bin_ms);
        }
        rows.push(AccuracyRow {
            system: sys,
            key: sys.key().into(),
            label: match sys {
                System::PolicerDrop => "policer".into(),
                _ => sys.label().into(),
            },
            error: Stat::of(&errs),
            error_budget: Stat::of(&errs_budget),
            admitted,
            exact,
            expected,
            sent,
            light_lost,
            light_lost_exact,
            timeline,
        });
    }
    Ok(AccuracyResults {
        limit_pps: limit.pps,
        burst: limit.burst,
        offered_pps: offered,
        heavy_flows: heavy,
        seconds: secs,
        reps,
        bin_ms,
        rows,
    })
}

/// Frames a perfect policer of `rate_pps`, `burst` would admit from one
/// source whose frames were sent at `times_ns` (in order): a textbook
/// token bucket, full at the start, written apart from the policer's own
/// arithmetic so that the benchmark does not grade it by itself. Fed the
/// times the generator actually sent at, it moves with a stall of the
/// sending thread (a pause, then a burst to catch up) as any exact policer
/// would.
pub fn exact_admitted(times_ns: impl IntoIterator<Item = u64>, rate_pps: u64, burst: u64) -> u64 {
    // Tokens in billionths of a packet: a packet is 1e9 of them, and each
    // ns adds rate_pps of them, so the sums are exact.
    const ONE: u128 = 1_000_000_000;
    let cap = burst as u128 * ONE;
    let (mut tokens, mut last, mut admitted) = (cap, None::<u64>, 0u64);
    for t in times_ns {
        if let Some(l) = last {
            tokens = (tokens + t.saturating_sub(l) as u128 * rate_pps as u128).min(cap);
        }
        last = Some(t);
        if tokens >= ONE {
            tokens -= ONE;
            admitted += 1;
        }
    }
    admitted
}

/// Arrivals per bin as a rate (pps), time from the first arrival (s).
fn bins(arrivals: &[u64], bin_ms: u64) -> Vec<(f64, f64)> {
    let Some(&t0) = arrivals.first() else { return vec![] };
    let w = bin_ms * 1_000_000;
    let last = arrivals.last().copied().unwrap_or(t0);
    let n = ((last - t0) / w + 1) as usize;
    let mut c = vec![0u64; n];
    for &t in arrivals {
        c[((t - t0) / w) as usize] += 1;
    }
    // The last bin is partial: leave it out.
    c.pop();
    c.iter().enumerate().map(|(i, &k)| ((i as u64 * bin_ms) as f64 / 1e3, k as f64 * 1e3 / bin_ms as f64)).collect()
}

#[cfg(test)]
mod tests {
    use super::exact_admitted;

    #[test]
    fn exact_bucket_admits_the_burst_then_the_rate() {
        // 1000 pps, burst 10: 100 frames at once pass 10.
        assert_eq!(exact_admitted([0; 100], 1000, 10), 10);
        // 10 000 pps offered for 1 s: the burst, then one per ms.
        let times = (0..10_000u64).map(|i| i * 100_000);
        assert_eq!(exact_admitted(times, 1000, 10), 10 + 999);
        // At half the rate, nothing is dropped.
        assert_eq!(exact_admitted((0..500u64).map(|i| i * 2_000_000), 1000, 10), 500);
        // A pause refills at most the burst: two bursts of 50, 1 s apart.
        let two = (0..50).map(|_| 0).chain((0..50).map(|_| 1_000_000_000));
        assert_eq!(exact_admitted(two, 1000, 10), 20);
    }
}
