//! The flood generator: the reference object's `xdp_gen` run with
//! `BPF_PROG_TEST_RUN` in live-frames mode (`BPF_F_TEST_XDP_LIVE_FRAMES`).
//! Each frame gets a new source and is redirected into the transmit veth,
//! whose peer receives it.
//!
//! IPv4 ([`Generator::new`]): `xdp_gen` writes the source, base + 0..N in
//! turn or at random, and fixes the header checksum.
//!
//! IPv6 ([`Generator::new_v6`]) uses the same program unchanged. `xdp_gen`
//! writes at fixed offsets of what it takes for an IPv4 header: the 4-byte
//! "source" at IP offset 12 and the 2-byte "checksum" at IP offset 10. In
//! an IPv6 header those are bytes 4..8 and 2..4 of the source address. So
//! bytes 4..8 become base + i, bytes 2..4 a checksum that depends only on
//! the frame's fixed bytes and i, and bytes 0..2 and the interface id
//! (8..16) stay as built: every i is its own /64, all inside the /16 of
//! the base address. [`v6_source`] computes the address of index i. The receiving veth's NAPI runs in softirq
//! on the CPU that runs the test, so generator and receiver share one CPU
//! (docs/platform.md: split across CPUs, page-pool recycling dominates).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    time::{Duration, Instant},
};

use crate::REFERENCE_OBJECT;
use anyhow::{Context, Result};
use aya::{
    Ebpf, EbpfLoader,
    programs::{TestRun, TestRunAttrs, TestRunOptions, Xdp},
};

use super::sys::{DST, cpu_times_ns, pin_cpu};
use crate::{
    frame::{FrameSpec, checksum},
    netns::enter,
};

/// Frames per test-run call (each call costs milliseconds of RCU sync).
pub const CHUNK: u32 = 1 << 20;
/// Frames per redirect flush inside a call.
pub const BATCH: u32 = 64;
/// Destination of the IPv6 frames.
pub const DST_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
/// Length of the generated frames (the smallest Ethernet frame).
pub const FRAME_LEN: usize = 64;
/// UDP destination port of the benchmark's floods (discard), as built by
/// `FrameSpec::udp`: no class rule of the benchmark's matches it.
pub const FLOOD_DPORT: u16 = 9;
/// UDP destination port of the class-matching flood (DNS).
pub const DNS_DPORT: u16 = 53;

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
        let mut spec = FrameSpec::udp(base.into(), Ipv4Addr::from(DST).into(), FRAME_LEN);
        spec.dst_mac = dst_mac;
        Generator::load(tx_index, spec.build(None), sources, u32::from(base), random)
    }

    /// An IPv6 generator: 64-byte UDP frames to `dst_mac` from `sources`
    /// distinct /64s, index i from [`v6_source`]`(base, i)` (in turn, or
    /// at random with `random`). The /64s all lie in `base`'s /16, bytes
    /// 4..8 of the address are `base`'s bytes 4..8 plus i, and every frame
    /// has `base`'s interface id.
    pub fn new_v6(tx_index: u32, dst_mac: [u8; 6], sources: u32, base: Ipv6Addr, random: bool) -> Result<Generator> {
        let frame = v6_frame(dst_mac, base);
        Generator::load(tx_index, frame, sources, v6_index_base(base), random)
    }

    /// A generator of `frame` (untagged IPv4: `xdp_gen` writes its source,
    /// `base` + 0..`sources`, and the IP header checksum; a TCP checksum
    /// is left as built, wrong for every other source).
    pub fn from_frame(tx_index: u32, frame: Vec<u8>, sources: u32, base: Ipv4Addr, random: bool) -> Result<Generator> {
        Generator::load(tx_index, frame, sources, u32::from(base), random)
    }

    fn load(tx_index: u32, frame: Vec<u8>, sources: u32, base: u32, random: bool) -> Result<Generator> {
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
        Ok(Generator { ebpf, frame })
    }

    /// The same generator with UDP destination port `port` in every frame
    /// (`xdp_gen` rewrites only the source address and the IP header
    /// checksum; the UDP checksum is zero, "none", in the IPv4 frames).
    pub fn with_dport(mut self, port: u16) -> Result<Generator> {
        let at = udp_offset(&self.frame).context("not a UDP frame the generator builds")?;
        self.frame[at + 2..at + 4].copy_from_slice(&port.to_be_bytes());
        Ok(self)
    }

    /// The UDP destination port of the generated frames.
    pub fn dport(&self) -> Option<u16> {
        let at = udp_offset(&self.frame)?;
        Some(u16::from_be_bytes([self.frame[at + 2], self.frame[at + 3]]))
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

/// Offset of the IP header in a generated frame (no VLAN tags).
const L3: usize = 14;

/// Offset of the UDP header in a generated frame (untagged Ethernet, IPv4
/// with any header length or IPv6 without extension headers).
fn udp_offset(f: &[u8]) -> Option<usize> {
    let at = match u16::from_be_bytes([*f.get(12)?, *f.get(13)?]) {
        0x0800 if *f.get(L3 + 9)? == 17 => L3 + usize::from(f[L3] & 0xf) * 4,
        0x86dd if *f.get(L3 + 6)? == 17 => L3 + 40,
        _ => return None,
    };
    (at + 8 <= f.len()).then_some(at)
}

/// The IPv6 frame `xdp_gen` rewrites (see the module doc).
fn v6_frame(dst_mac: [u8; 6], base: Ipv6Addr) -> Vec<u8> {
    let mut spec = FrameSpec::udp(base.into(), DST_V6.into(), FRAME_LEN);
    spec.dst_mac = dst_mac;
    spec.build(None)
}

/// `GEN_BASE` for an IPv6 base address: its bytes 4..8.
fn v6_index_base(base: Ipv6Addr) -> u32 {
    let o = base.octets();
    u32::from_be_bytes([o[4], o[5], o[6], o[7]])
}

/// The source address of index `i` of an IPv6 generator built from `base`:
/// what `xdp_gen` makes of the frame (its IPv4 source and checksum writes
/// landing in the IPv6 source address, see the module doc).
pub fn v6_source(base: Ipv6Addr, i: u32) -> Ipv6Addr {
    let mut f = v6_frame([0; 6], base);
    let ip = &mut f[L3..L3 + 20];
    ip[12..16].copy_from_slice(&v6_index_base(base).wrapping_add(i).to_be_bytes());
    ip[10] = 0;
    ip[11] = 0;
    let c = checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let mut a = [0u8; 16];
    a.copy_from_slice(&f[L3 + 8..L3 + 24]);
    Ipv6Addr::from(a)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v6_sources_are_distinct_64s_of_one_16() {
        let base: Ipv6Addr = "3fff:0:100:0:a:b:c:d".parse().unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..10_000 {
            let a = v6_source(base, i).octets();
            assert_eq!(a[..2], [0x3f, 0xff]);
            assert_eq!(u32::from_be_bytes([a[4], a[5], a[6], a[7]]), 0x0100_0000 + i);
            assert_eq!(a[8..], base.octets()[8..]);
            assert!(seen.insert(a[..8].to_vec()), "index {i}: a /64 twice");
        }
        // The frame is what it claims: IPv6, UDP, 64 bytes, from `base`.
        let f = v6_frame([2, 0, 0, 0, 0, 1], base);
        assert_eq!(f.len(), FRAME_LEN);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!(f[L3 + 6], 17);
        assert_eq!(f[L3 + 8..L3 + 24], base.octets());
        assert_eq!(udp_offset(&f), Some(L3 + 40));
    }

    #[test]
    fn flood_port_and_the_dns_port() {
        let mut spec = FrameSpec::udp(Ipv4Addr::new(10, 1, 0, 0).into(), Ipv4Addr::from(DST).into(), FRAME_LEN);
        spec.dst_mac = [2, 0, 0, 0, 0, 1];
        let mut f = spec.build(None);
        let at = udp_offset(&f).unwrap();
        assert_eq!(at, L3 + 20);
        assert_eq!(u16::from_be_bytes([f[at + 2], f[at + 3]]), FLOOD_DPORT);
        f[at + 2..at + 4].copy_from_slice(&DNS_DPORT.to_be_bytes());
        assert_eq!(&f[at + 2..at + 4], &[0, 53]);
        // The UDP checksum stays "none", so the port needs no fix-up.
        assert_eq!(&f[at + 6..at + 8], &[0, 0]);
    }
}
