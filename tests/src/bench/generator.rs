//! The flood generator: the reference object's `xdp_gen` run with
//! `BPF_PROG_TEST_RUN` in live-frames mode (`BPF_F_TEST_XDP_LIVE_FRAMES`).
//! Each frame gets a new IPv4 source and is redirected into the transmit
//! veth, whose peer receives it. The receiving veth's NAPI runs in softirq
//! on the CPU that runs the test, so generator and receiver share one CPU
//! (PLATFORM-NOTES: split across CPUs, page-pool recycling dominates).

use std::{
    net::Ipv4Addr,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{TestRun, TestRunAttrs, TestRunOptions, Xdp},
};
use policer_user::loader::REFERENCE_OBJECT;

use super::sys::{DST, cpu_times_ns, pin_cpu};
use crate::{frame::FrameSpec, netns::enter};

/// Frames per test-run call (each call costs milliseconds of RCU sync).
pub const CHUNK: u32 = 1 << 20;
/// Frames per redirect flush inside a call.
pub const BATCH: u32 = 64;

pub struct Generator {
    ebpf: Ebpf,
    frame: Vec<u8>,
}

/// What one flood did, measured on the generator's CPU.
#[derive(Clone, Copy, Debug, Default)]
pub struct Flood {
    /// Frames the generator produced.
    pub frames: u64,
    pub wall_ns: u64,
    /// Busy time of the CPU (all work on it, softirq included).
    pub busy_ns: u64,
    pub idle_ns: u64,
    /// CPU time of the work itself: the generator thread (which also runs
    /// the receiving softirq when it re-enables bottom halves) plus that
    /// CPU's ksoftirqd. Unlike `busy_ns`, other tasks sharing the CPU do
    /// not count.
    pub own_ns: u64,
}

/// CPU time of the calling thread, ns.
pub fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Run time of `ksoftirqd/CPU`, ns (0 if it cannot be found).
pub fn ksoftirqd_ns(cpu: usize) -> u64 {
    let want = format!("ksoftirqd/{cpu}");
    let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
    for e in dir.flatten() {
        let p = e.path();
        if std::fs::read_to_string(p.join("comm")).is_ok_and(|c| c.trim() == want) {
            return std::fs::read_to_string(p.join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next().and_then(|x| x.parse().ok()))
                .unwrap_or(0);
        }
    }
    0
}

impl Generator {
    /// A generator that redirects into interface `tx_index` (of the
    /// namespace it will run in), 64-byte UDP frames to `dst_mac`, from
    /// `sources` addresses starting at `base`.
    pub fn new(tx_index: u32, dst_mac: [u8; 6], sources: u32, base: Ipv4Addr, random: bool) -> Result<Generator> {
        let base = u32::from(base);
        let random = u32::from(random);
        let sources = sources.max(1);
        let mut loader = EbpfLoader::new();
        loader
            .override_global("GEN_IFINDEX", &tx_index, true)
            .override_global("GEN_SOURCES", &sources, true)
            .override_global("GEN_BASE", &base, true)
            .override_global("GEN_RANDOM", &random, true);
        let mut ebpf = loader.load(REFERENCE_OBJECT).context("load the reference object")?;
        let p: &mut Xdp = ebpf.program_mut("xdp_gen").context("xdp_gen")?.try_into()?;
        p.load().context("load xdp_gen")?;
        let mut spec = FrameSpec::udp(Ipv4Addr::from(base).into(), Ipv4Addr::from(DST).into(), 64);
        spec.dst_mac = dst_mac;
        Ok(Generator { ebpf, frame: spec.build(None) })
    }

    fn prog(&self) -> Result<&Xdp> {
        Ok(self.ebpf.program("xdp_gen").context("xdp_gen")?.try_into()?)
    }

    /// One live-frames test run of `frames` frames.
    pub fn burst(&self, frames: u32) -> Result<()> {
        let opts = TestRunOptions {
            data_in: Some(&self.frame),
            repeat: frames,
            attrs: TestRunAttrs::new().xdp_live_frames(BATCH),
            ..Default::default()
        };
        self.prog()?.test_run(opts).context("live-frames test run")?;
        Ok(())
    }

    /// Floods for at least `dur` (whole calls of `chunk` frames) from a
    /// thread inside `ns`, pinned to `cpu`.
    pub fn flood(&self, ns: &str, cpu: usize, dur: Duration, chunk: u32) -> Result<Flood> {
        std::thread::scope(|s| {
            s.spawn(|| -> Result<Flood> {
                enter(ns).context("enter the transmit namespace")?;
                pin_cpu(cpu)?;
                // Let the scheduler move us before measuring.
                std::thread::yield_now();
                let (b0, i0) = cpu_times_ns(cpu)?;
                let (c0, k0) = (thread_cpu_ns(), ksoftirqd_ns(cpu));
                let t0 = Instant::now();
                let mut frames = 0u64;
                while frames == 0 || t0.elapsed() < dur {
                    self.burst(chunk)?;
                    frames += u64::from(chunk);
                }
                let wall_ns = t0.elapsed().as_nanos() as u64;
                // Softirq work queued by the last call finishes here.
                std::thread::sleep(Duration::from_millis(30));
                let (c1, k1) = (thread_cpu_ns(), ksoftirqd_ns(cpu));
                let (b1, i1) = cpu_times_ns(cpu)?;
                let own_ns = (c1 - c0) + k1.saturating_sub(k0);
                Ok(Flood { frames, wall_ns, busy_ns: b1 - b0, idle_ns: i1 - i0, own_ns })
            })
            .join()
            .map_err(|_| anyhow::anyhow!("generator thread panicked"))?
        })
    }
}
