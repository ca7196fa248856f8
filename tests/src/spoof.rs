//! Spoofed-source floods for the attack tier: the live-frames generator
//! ([`crate::bench::generator`]) at full speed from a thread inside the
//! sandbox's transmit namespace, random IPv4 sources across a prefix or
//! random IPv6 /64s, while the paced sender ([`crate::traffic`]) runs.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    bench::{
        generator::Generator,
        sys::{if_index, pin_cpu},
    },
    netns::{Sandbox, enter},
};

/// What the generator sends.
#[derive(Clone, Copy, Debug)]
pub struct Spoof {
    /// IPv4: the first source (`sources` addresses from it). IPv6: the
    /// address whose /16 and interface id every source shares, one /64
    /// per index (see [`crate::bench::generator::v6_source`]).
    pub base: IpAddr,
    pub sources: u32,
    /// Random sources (else in turn).
    pub random: bool,
}

impl Spoof {
    /// Random sources across `prefix_len` bits of IPv4 prefix `base`.
    pub fn v4(base: Ipv4Addr, prefix_len: u8) -> Spoof {
        Spoof { base: base.into(), sources: 1 << (32 - u32::from(prefix_len)), random: true }
    }

    /// Random /64s: `sources` of them, of the /16 of `base`.
    pub fn v6(base: Ipv6Addr, sources: u32) -> Spoof {
        Spoof { base: base.into(), sources, random: true }
    }

    /// The generator, loaded; `tx_index` is the transmit veth's index.
    pub fn generator(&self, tx_index: u32, dst_mac: [u8; 6]) -> Result<Generator> {
        match self.base {
            IpAddr::V4(b) => Generator::new(tx_index, dst_mac, self.sources, b, self.random),
            IpAddr::V6(b) => Generator::new_v6(tx_index, dst_mac, self.sources, b, self.random),
        }
    }
}

/// What a flood did.
#[derive(Clone, Copy, Debug, Default)]
pub struct FloodReport {
    /// Frames the generator produced (not all reach the policer: the
    /// receiving veth's ring drops what it has no room for).
    pub frames: u64,
    pub wall_ns: u64,
    /// Test-run calls made.
    pub calls: u64,
}

impl FloodReport {
    pub fn pps(&self) -> f64 {
        self.frames as f64 * 1e9 / self.wall_ns.max(1) as f64
    }
}

/// Frames per test-run call: large enough that the call's fixed cost (an
/// RCU sync, milliseconds) is small, small enough to stop on time.
pub const CALL_FRAMES: u32 = 1 << 16;

/// A flood running in the background: the generator at full speed,
/// pinned to one CPU, inside the sandbox's transmit namespace. Stops when
/// told, when dropped, or after a minute whatever happens.
pub struct Flood {
    handle: Option<thread::JoinHandle<Result<FloodReport>>>,
    stop: Arc<AtomicBool>,
}

impl Flood {
    /// Starts flooding the sandbox's receiving side with `spoof` from a
    /// thread pinned to `cpu`; returns once the generator is loaded and
    /// its first call is under way.
    pub fn start(sb: &Sandbox, spoof: Spoof, cpu: usize) -> Result<Flood> {
        Flood::start_to(sb, spoof, None, cpu)
    }

    /// [`Flood::start`] with UDP destination port `dport` in every frame
    /// (none: the generator's own, [`crate::bench::generator::FLOOD_DPORT`]).
    pub fn start_to(sb: &Sandbox, spoof: Spoof, dport: Option<u16>, cpu: usize) -> Result<Flood> {
        let (ns, ifc, mac) = (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_mac());
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = thread::spawn(move || -> Result<FloodReport> {
            let tx_index = if_index(&ns, &ifc)?;
            enter(&ns).context("enter the transmit namespace")?;
            pin_cpu(cpu)?;
            let g = spoof.generator(tx_index, mac)?;
            let g = match dport {
                Some(p) => g.with_dport(p)?,
                None => g,
            };
            let _ = ready_tx.send(());
            let t0 = Instant::now();
            let mut r = FloodReport::default();
            while !st.load(Ordering::Relaxed) && t0.elapsed() < Duration::from_secs(60) {
                g.burst(CALL_FRAMES)?;
                r.frames += u64::from(CALL_FRAMES);
                r.calls += 1;
            }
            r.wall_ns = t0.elapsed().as_nanos() as u64;
            Ok(r)
        });
        let mut f = Flood { handle: Some(handle), stop };
        if ready_rx.recv().is_err() {
            // The thread ended before flooding: its error says why.
            return Err(f.stop().err().unwrap_or_else(|| anyhow::anyhow!("generator ended at once")));
        }
        Ok(f)
    }

    /// Stops the flood; what it did.
    pub fn stop(&mut self) -> Result<FloodReport> {
        self.stop.store(true, Ordering::Relaxed);
        let h = self.handle.take().context("flood already stopped")?;
        h.join().map_err(|_| anyhow::anyhow!("generator thread panicked"))?
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Distinct sources expected among `frames` drawn uniformly at random
/// from `space` addresses.
pub fn expected_distinct(frames: f64, space: f64) -> f64 {
    space * (1.0 - (-frames / space).exp())
}

/// Sends `frames` frames of `spoof` (one call), from inside the transmit
/// namespace; returns when they are sent.
pub fn send_once(sb: &Sandbox, spoof: Spoof, frames: u32) -> Result<()> {
    let (ns, ifc, mac) = (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_mac());
    thread::spawn(move || {
        let tx_index = if_index(&ns, &ifc)?;
        enter(&ns).context("enter the transmit namespace")?;
        spoof.generator(tx_index, mac)?.burst(frames)
    })
    .join()
    .map_err(|_| anyhow::anyhow!("generator thread panicked"))?
}
