//! SYN cookies on the host side (docs/syn-cookies.md): what the kernel's
//! TCP settings make of cookies the program sends, the settings a rule's
//! slot gets (`SynConf`: the window scale and MSS the SYN-ACK offers), and
//! the preflight `policer check` and the start report.

use policer_common::syn::SynConf;

use crate::rules::SynPolicy;

/// The kernel's TCP settings that decide whether an XDP-made cookie is
/// accepted, and with which options (read from /proc/sys of the daemon's
/// network namespace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostTcp {
    /// `net.ipv4.tcp_syncookies`: 2 makes `bpf_tcp_gen_syncookie` answer
    /// always; 1 only while the listener's queue overflows; 0 never (and
    /// the kernel refuses every cookie ACK).
    pub syncookies: u32,
    /// `net.ipv4.tcp_timestamps`: 1 adds a per-connection random offset
    /// the program cannot know, so the options a cookie's timestamp
    /// carries are misread; 2 (no offset) keeps them; 0 drops them.
    pub timestamps: u32,
    pub window_scaling: u32,
    pub sack: u32,
    /// `net.ipv4.tcp_rmem`'s maximum and `net.core.rmem_max`: the window
    /// scale the kernel gives a connection.
    pub rmem_max: u32,
    pub core_rmem_max: u32,
    /// The smallest MTU of the namespace's interfaces (loopback aside).
    pub mtu: u32,
}

fn sysctl(path: &str) -> Option<u32> {
    std::fs::read_to_string(format!("/proc/sys/{path}")).ok()?.split_whitespace().last()?.parse().ok()
}

fn smallest_mtu() -> u32 {
    let mut mtu = None::<u32>;
    if let Ok(d) = std::fs::read_dir("/sys/class/net") {
        for e in d.flatten() {
            if e.file_name() == "lo" {
                continue;
            }
            if let Some(m) = std::fs::read_to_string(e.path().join("mtu")).ok().and_then(|s| s.trim().parse().ok()) {
                mtu = Some(mtu.map_or(m, |x: u32| x.min(m)));
            }
        }
    }
    mtu.unwrap_or(1500).clamp(576, 9000)
}

impl HostTcp {
    /// The settings as they are now (a setting that cannot be read is
    /// the kernel's default).
    pub fn read() -> HostTcp {
        HostTcp {
            syncookies: sysctl("net/ipv4/tcp_syncookies").unwrap_or(1),
            timestamps: sysctl("net/ipv4/tcp_timestamps").unwrap_or(1),
            window_scaling: sysctl("net/ipv4/tcp_window_scaling").unwrap_or(1),
            sack: sysctl("net/ipv4/tcp_sack").unwrap_or(1),
            rmem_max: sysctl("net/ipv4/tcp_rmem").unwrap_or(6_291_456),
            core_rmem_max: sysctl("net/core/rmem_max").unwrap_or(212_992),
            mtu: smallest_mtu(),
        }
    }

    /// The window scale the kernel gives a connection it makes from a
    /// cookie (`tcp_select_initial_window`: log2 of the largest receive
    /// space, less 15, within 0..=14), for a listener without SO_RCVBUF.
    pub fn wscale(&self) -> u8 {
        let space = self.rmem_max.max(self.core_rmem_max).min(u16::MAX as u32 * (1 << 14));
        (space.max(1).ilog2() as i32 - 15).clamp(0, 14) as u8
    }

    /// A rule slot's settings: off (zeros) without SYN cookies.
    pub fn conf(&self, syn: Option<SynPolicy>) -> SynConf {
        let Some(s) = syn else { return SynConf::default() };
        SynConf {
            mode: s.mode.kernel(),
            wscale: self.wscale() as u32,
            mss_v4: self.mtu - 40,
            mss_v6: self.mtu - 60,
            ..SynConf::default()
        }
        // A burst of a tenth of a second (at least 4): a few clients
        // behind one /24 connecting at once are not held back.
        .with_cap(s.syn_ack_pps, (s.syn_ack_pps / 10).max(4))
    }

    /// What the settings make of SYN cookies: (fine, one line each).
    pub fn preflight(&self) -> Vec<(bool, String)> {
        let mut out = Vec::new();
        out.push(match self.syncookies {
            2 => (
                true,
                "net.ipv4.tcp_syncookies = 2: the kernel makes a cookie for every SYN the policer answers".into(),
            ),
            1 => (
                false,
                "net.ipv4.tcp_syncookies = 1: the kernel makes cookies only while a listener's queue overflows; \
                 until then SYNs are policed without cookies (set it to 2)"
                    .into(),
            ),
            n => {
                (false, format!("net.ipv4.tcp_syncookies = {n}: no cookies at all; every SYN is policed (set it to 2)"))
            }
        });
        out.push(match self.timestamps {
            2 => (true, "net.ipv4.tcp_timestamps = 2: a cookie's timestamp keeps window scale, SACK and ECN".into()),
            1 => (
                false,
                "net.ipv4.tcp_timestamps = 1: the kernel offsets timestamps by a secret the program cannot know, \
                 so a cookie ACK's options are misread and refused (set it to 2)"
                    .into(),
            ),
            _ => (
                false,
                "net.ipv4.tcp_timestamps = 0: connections made from cookies have no window scale or SACK (set it to 2)"
                    .into(),
            ),
        });
        if self.window_scaling == 0 {
            out.push((false, "net.ipv4.tcp_window_scaling = 0: connections from cookies get no window scale".into()));
        }
        if self.sack == 0 {
            out.push((false, "net.ipv4.tcp_sack = 0: a cookie ACK that asked for SACK is refused".into()));
        }
        out.push((
            true,
            format!(
                "SYN-ACKs offer window scale {} and MSS {}/{} (IPv4/IPv6)",
                self.wscale(),
                self.mtu - 40,
                self.mtu - 60
            ),
        ));
        out
    }
}

/// Whether a TCP socket listens on `port` in this network namespace (from
/// /proc/net/tcp and tcp6): SYNs to a port nobody serves get no cookie.
pub fn listening(port: u16) -> bool {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let mut w = l.split_whitespace();
                let local = w.nth(1).unwrap_or("");
                let state = w.nth(1).unwrap_or("");
                state == "0A" && local.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) == Some(port)
            })
        })
    })
}

/// What `policer check` and the start warn of for `specs` (the rules in a
/// file): the kernel settings SYN cookies need that are not set, and each
/// SYN-cookie rule's destination port nobody listens on here. None when no
/// rule has SYN cookies.
pub fn warnings<'a>(specs: impl IntoIterator<Item = &'a crate::rules::RuleSpec>) -> Vec<String> {
    let syn: Vec<_> = specs.into_iter().filter(|s| s.syn().is_some()).collect();
    if syn.is_empty() {
        return Vec::new();
    }
    let mut out: Vec<String> = HostTcp::read()
        .preflight()
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, m)| format!("syn cookies: {m}"))
        .collect();
    for s in syn {
        if let Some((lo, hi)) = s.class().dport
            && !(lo..=hi).take(1024).any(listening)
        {
            out.push(format!(
                "syn cookies: {} [{}]: nothing listens on that port in this network namespace: its SYNs are policed \
                 without cookies until something does",
                s.net,
                s.class()
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{SynMode, SynPolicy};

    fn host(rmem: u32) -> HostTcp {
        HostTcp {
            syncookies: 2,
            timestamps: 2,
            window_scaling: 1,
            sack: 1,
            rmem_max: rmem,
            core_rmem_max: 212_992,
            mtu: 1500,
        }
    }

    #[test]
    fn wscale_is_the_kernels() {
        // Debian's default tcp_rmem maximum (6 MiB): 7, as `ss -ti` shows.
        assert_eq!(host(6_291_456).wscale(), 7);
        assert_eq!(host(4_194_304).wscale(), 7);
        assert_eq!(HostTcp { core_rmem_max: 65_535, ..host(65_535) }.wscale(), 0);
        // net.core.rmem_max counts too: the larger of the two.
        assert_eq!(HostTcp { core_rmem_max: 33_554_432, ..host(6_291_456) }.wscale(), 10);
        assert_eq!(host(u32::MAX).wscale(), 14);
    }

    #[test]
    fn conf_of_a_rule() {
        let c = host(6_291_456).conf(Some(SynPolicy { mode: SynMode::Always, syn_ack_pps: 1000 }));
        assert_eq!((c.mode, c.wscale, c.mss_v4, c.mss_v6), (policer_common::syn::SYN_ALWAYS, 7, 1460, 1440));
        assert_eq!(c.cap_interval_ns, 1_000_000);
        assert_eq!(c.cap_tolerance_ns, 99_000_000);
        assert_eq!(host(1).conf(None), SynConf::default());
        let bad = HostTcp { syncookies: 1, timestamps: 1, ..host(6_291_456) };
        assert_eq!(bad.preflight().iter().filter(|(ok, _)| !ok).count(), 2);
    }
}

/// Tests only (policer-user's `test-hooks` feature, like the start's hooks
/// in `daemon/start/hooks.rs`): `POLICER_TEST_SYN_EXACT_MS` in place of
/// policer_common::syn::EXACT_NS, so the tiers reach the SYN path's
/// lookup of a listener without a source in seconds.
#[cfg(feature = "test-hooks")]
pub(crate) fn exact_ns(ns: u64) -> u64 {
    std::env::var("POLICER_TEST_SYN_EXACT_MS").ok().and_then(|v| v.parse::<u64>().ok()).map_or(ns, |ms| ms * 1_000_000)
}

#[cfg(not(feature = "test-hooks"))]
#[inline(always)]
pub(crate) fn exact_ns(ns: u64) -> u64 {
    ns
}

/// The SYN path's filter in front of its verified sources
/// (policer_common::syn::SEEN_WORDS), kept useful over a long run: the
/// program only ever sets its bits, and the exact set (an LRU) lets
/// sources go, so the daemon rebuilds the filter from the set when
/// [`policer_common::syn::seen_is_stale`] says enough of it is stale.
/// Holds its own descriptors of the two maps (a thread of its own runs
/// it: `daemon::synfilter`), and of the time until which the program
/// looks listeners up by each SYN's own tuple (`SYN_EXACT`).
pub struct SeenFilter {
    pub(crate) seen: std::os::fd::OwnedFd,
    pub(crate) verified: std::os::fd::OwnedFd,
    pub(crate) exact: Option<std::os::fd::OwnedFd>,
}

/// What a rebuild found and left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rebuilt {
    /// Bits set before, and after.
    pub before: u64,
    pub after: u64,
    /// Sources of the exact set the filter was made of.
    pub sources: u64,
}

/// How often the daemon looks at the filter (a read of its 128 KiB).
pub const SEEN_CHECK: std::time::Duration = std::time::Duration::from_secs(10);

impl SeenFilter {
    /// Rebuilds the filter when it is stale; None when it is not.
    ///
    /// The program sets bits meanwhile (an atomic OR per verified source):
    /// the words are written from the set as read, then the set is read
    /// again and the bits of the sources verified during the rebuild are
    /// put back. A source verified between that read and the last write
    /// may lose its bit: it is asked for one more cookie, and verified
    /// again (never refused).
    pub fn refresh(&self) -> crate::Result<Option<Rebuilt>> {
        use policer_common::syn::{MAP_SYN_SEEN, SEEN_WORDS, seen_is_stale};
        use std::os::fd::AsRawFd;
        let words = SEEN_WORDS as usize;
        let mut now = vec![0u64; words];
        crate::batch::for_each_chunk(self.seen.as_raw_fd(), 4, 8, words, |k, v| {
            let i = u32::from_ne_bytes(k.try_into().unwrap_or_default()) as usize;
            if let (Some(w), Ok(v)) = (now.get_mut(i), v.try_into()) {
                *w = u64::from_ne_bytes(v);
            }
        })
        .map_err(crate::Error::kernel(format!("reading {MAP_SYN_SEEN}")))?;
        let before = ones(&now);
        if !seen_is_stale(before) {
            return Ok(None);
        }
        let (fresh, sources) = self.words_of_set()?;
        // A bit cleared is a source the program takes as never seen, whose
        // SYN then finds its listener without its own tuple: one the set
        // let go may still have a connection or a TIME_WAIT of that tuple.
        // So the program looks by the tuple again for as long as after
        // SYN cookies are switched on (policer_common::syn::EXACT_NS),
        // from before the first bit is cleared.
        if fresh.iter().zip(&now).any(|(f, n)| n & !f != 0) {
            self.exact_again()?;
        }
        self.write(&fresh, |i| fresh[i] != now[i])?;
        // The sources verified while the words were made and written.
        let (again, _) = self.words_of_set()?;
        let merged: Vec<u64> = fresh.iter().zip(&again).map(|(a, b)| a | b).collect();
        self.write(&merged, |i| merged[i] != fresh[i])?;
        Ok(Some(Rebuilt { before, after: ones(&merged), sources }))
    }

    /// Moves the end of the program's lookups by the SYN's own tuple
    /// (`SYN_EXACT`) to [`EXACT_NS`](policer_common::syn::EXACT_NS) from
    /// now, unless it is later already.
    fn exact_again(&self) -> crate::Result<()> {
        use policer_common::syn::{EXACT_NS, MAP_SYN_EXACT};
        use std::os::fd::AsRawFd;
        let Some(fd) = &self.exact else { return Ok(()) };
        let until = crate::duration::monotonic_ns().saturating_add(exact_ns(EXACT_NS));
        let now: Option<u64> = crate::batch::lookup(fd.as_raw_fd(), &0u32)
            .map_err(crate::Error::kernel(format!("reading {MAP_SYN_EXACT}")))?;
        if now.is_none_or(|t| t < until) {
            crate::batch::update_elem(fd.as_raw_fd(), &0u32, &until)
                .map_err(crate::Error::kernel(format!("writing {MAP_SYN_EXACT}")))?;
        }
        Ok(())
    }

    /// The filter's words for the sources the exact set holds now.
    fn words_of_set(&self) -> crate::Result<(Vec<u64>, u64)> {
        use policer_common::syn::{MAP_SYN_VERIFIED, SEEN_WORDS, mark_seen};
        use std::os::fd::AsRawFd;
        let mut words = vec![0u64; SEEN_WORDS as usize];
        let mut n = 0u64;
        crate::batch::for_each(self.verified.as_raw_fd(), 16, 8, |k, _| {
            if let Ok(src) = <[u8; 16]>::try_from(k) {
                mark_seen(&mut words, &src);
                n += 1;
            }
        })
        .map_err(crate::Error::kernel(format!("reading {MAP_SYN_VERIFIED}")))?;
        Ok((words, n))
    }

    /// Writes the words `changed` picks (one batch).
    fn write(&self, words: &[u64], changed: impl Fn(usize) -> bool) -> crate::Result<()> {
        use std::os::fd::AsRawFd;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, w) in words.iter().enumerate().filter(|(i, _)| changed(*i)) {
            keys.extend_from_slice(&(i as u32).to_ne_bytes());
            values.extend_from_slice(&w.to_ne_bytes());
        }
        let n = keys.len() / 4;
        if n == 0 {
            return Ok(());
        }
        match crate::batch::update(self.seen.as_raw_fd(), &keys, &values, n) {
            (_, Some(e)) => {
                Err(crate::Error::Kernel { what: format!("writing {}", policer_common::syn::MAP_SYN_SEEN), source: e })
            }
            _ => Ok(()),
        }
    }
}

/// Bits set in `words`.
fn ones(words: &[u64]) -> u64 {
    words.iter().map(|w| u64::from(w.count_ones())).sum()
}
