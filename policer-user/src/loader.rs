//! Loading the XDP object, filling its maps and attaching it.

use std::{
    ffi::CString,
    io,
    os::fd::{AsFd, AsRawFd, RawFd},
    path::PathBuf,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
    programs::Xdp,
};
use ipnet::IpNet;
use policer_common::{
    Counters, DEFAULT_MAX_SOURCES, GLOBAL_TEST_CLOCK, MAP_CLOCK, MAP_COUNTERS, MAP_RULES_V4, MAP_RULES_V6,
    PROGRAM_NAME, Rule,
};

use crate::error::{Error, Result};

/// The XDP object, built by build.rs with the pinned toolchain.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/policer"));

/// How to attach: `auto` tries native (driver) XDP first, then generic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Auto,
    Native,
    Skb,
}

impl Mode {
    /// Netlink mode flags to try, in order.
    pub fn tries(self) -> &'static [u32] {
        use crate::netlink::{XDP_FLAGS_DRV_MODE as DRV, XDP_FLAGS_SKB_MODE as SKB};
        match self {
            Mode::Auto => &[DRV, SKB],
            Mode::Native => &[DRV],
            Mode::Skb => &[SKB],
        }
    }

    /// The name of a netlink mode flag.
    pub fn flag_name(flags: u32) -> &'static str {
        if flags & crate::netlink::XDP_FLAGS_SKB_MODE != 0 {
            "skb"
        } else if flags & crate::netlink::XDP_FLAGS_DRV_MODE != 0 {
            "native"
        } else {
            "default"
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the bucket table.
    pub max_sources: u32,
    /// Read the clock from the CLOCK map (tests only).
    pub test_clock: bool,
    /// Existing maps to reuse, by name: bpffs paths where they are pinned
    /// (adopting a running policer's rules, buckets and counters).
    pub reuse: Vec<(&'static str, PathBuf)>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions { max_sources: DEFAULT_MAX_SOURCES, test_clock: false, reuse: vec![] }
    }
}

/// A loaded (not yet attached) policer. Dropping it detaches every link it
/// made and unloads the program.
pub struct Policer {
    pub ebpf: Ebpf,
}

/// The interface index of `name`, or a clear error.
pub fn if_index(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| Error::UnknownInterface(name.into()))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 { Err(Error::UnknownInterface(name.into())) } else { Ok(idx) }
}

pub fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn is_eperm(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

impl Policer {
    pub fn load(opts: &LoadOptions) -> Result<Policer> {
        if opts.max_sources == 0 {
            return Err(Error::Invalid("--max-sources must be at least 1".into()));
        }
        let test_clock: u32 = opts.test_clock.into();
        let mut loader = EbpfLoader::new();
        loader.map_max_entries(policer_common::MAP_BUCKETS, opts.max_sources).override_global(
            GLOBAL_TEST_CLOCK,
            &test_clock,
            true,
        );
        for (name, path) in &opts.reuse {
            loader.map_pin_path(name, path.as_path());
        }
        let mut ebpf = loader.load(EBPF_OBJECT).map_err(|e| match &e {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. }) if is_eperm(io_error) => {
                Error::NotRoot("loading the XDP program")
            }
            _ => Error::Load(Box::new(e)),
        })?;
        let prog: &mut Xdp = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(Error::Missing("XDP program"))?
            .try_into()
            .map_err(|e| Error::Program(Box::new(e)))?;
        prog.load().map_err(|e| Error::Program(Box::new(e)))?;
        Ok(Policer { ebpf })
    }

    pub fn program(&mut self) -> &mut Xdp {
        // Checked at load.
        self.ebpf.program_mut(PROGRAM_NAME).and_then(|p| p.try_into().ok()).expect("loaded")
    }

    /// Installs (or replaces, atomically for that prefix) the rule for `net`.
    pub fn set_rule(&mut self, net: IpNet, rule: &Rule) -> Result<()> {
        let net = net.trunc();
        match net {
            IpNet::V4(n) => {
                let mut m: LpmTrie<&mut MapData, [u8; 4], Rule> =
                    LpmTrie::try_from(self.ebpf.map_mut(MAP_RULES_V4).ok_or(Error::Missing(MAP_RULES_V4))?)
                        .map_err(Error::map(MAP_RULES_V4))?;
                m.insert(&Key::new(n.prefix_len().into(), n.network().octets()), rule, 0)
                    .map_err(Error::map(MAP_RULES_V4))
            }
            IpNet::V6(n) => {
                let mut m: LpmTrie<&mut MapData, [u8; 16], Rule> =
                    LpmTrie::try_from(self.ebpf.map_mut(MAP_RULES_V6).ok_or(Error::Missing(MAP_RULES_V6))?)
                        .map_err(Error::map(MAP_RULES_V6))?;
                m.insert(&Key::new(n.prefix_len().into(), n.network().octets()), rule, 0)
                    .map_err(Error::map(MAP_RULES_V6))
            }
        }
    }

    /// Counters summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        let m: PerCpuArray<&MapData, Counters> =
            PerCpuArray::try_from(self.ebpf.map(MAP_COUNTERS).ok_or(Error::Missing(MAP_COUNTERS))?)
                .map_err(Error::map(MAP_COUNTERS))?;
        let per_cpu = m.get(&0, 0).map_err(Error::map(MAP_COUNTERS))?;
        let mut total = Counters::default();
        for c in per_cpu.iter() {
            total.add(c);
        }
        Ok(total)
    }

    /// Sets the test clock (only read when loaded with `test_clock`).
    pub fn set_clock(&mut self, now_ns: u64) -> Result<()> {
        let mut m: Array<&mut MapData, u64> =
            Array::try_from(self.ebpf.map_mut(MAP_CLOCK).ok_or(Error::Missing(MAP_CLOCK))?)
                .map_err(Error::map(MAP_CLOCK))?;
        m.set(0, &now_ns, 0).map_err(Error::map(MAP_CLOCK))
    }

    /// The loaded program's file descriptor (for netlink attach).
    pub fn prog_fd(&mut self) -> Result<RawFd> {
        let fd = self.program().fd().map_err(|e| Error::Program(Box::new(e)))?;
        Ok(fd.as_fd().as_raw_fd())
    }

    /// Removes the rule for `net`.
    pub fn remove_rule(&mut self, net: IpNet) -> Result<()> {
        let net = net.trunc();
        match net {
            IpNet::V4(n) => {
                let mut m: LpmTrie<&mut MapData, [u8; 4], Rule> =
                    LpmTrie::try_from(self.ebpf.map_mut(MAP_RULES_V4).ok_or(Error::Missing(MAP_RULES_V4))?)
                        .map_err(Error::map(MAP_RULES_V4))?;
                m.remove(&Key::new(n.prefix_len().into(), n.network().octets())).map_err(Error::map(MAP_RULES_V4))
            }
            IpNet::V6(n) => {
                let mut m: LpmTrie<&mut MapData, [u8; 16], Rule> =
                    LpmTrie::try_from(self.ebpf.map_mut(MAP_RULES_V6).ok_or(Error::Missing(MAP_RULES_V6))?)
                        .map_err(Error::map(MAP_RULES_V6))?;
                m.remove(&Key::new(n.prefix_len().into(), n.network().octets())).map_err(Error::map(MAP_RULES_V6))
            }
        }
    }

    /// Every rule in the kernel's tries.
    pub fn kernel_rules(&self) -> Result<Vec<(IpNet, Rule)>> {
        let mut out = Vec::new();
        let m: LpmTrie<&MapData, [u8; 4], Rule> =
            LpmTrie::try_from(self.ebpf.map(MAP_RULES_V4).ok_or(Error::Missing(MAP_RULES_V4))?)
                .map_err(Error::map(MAP_RULES_V4))?;
        for item in m.iter() {
            let (k, v) = item.map_err(Error::map(MAP_RULES_V4))?;
            let net = IpNet::new(std::net::Ipv4Addr::from(k.data()).into(), k.prefix_len() as u8)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            out.push((net, v));
        }
        let m: LpmTrie<&MapData, [u8; 16], Rule> =
            LpmTrie::try_from(self.ebpf.map(MAP_RULES_V6).ok_or(Error::Missing(MAP_RULES_V6))?)
                .map_err(Error::map(MAP_RULES_V6))?;
        for item in m.iter() {
            let (k, v) = item.map_err(Error::map(MAP_RULES_V6))?;
            let net = IpNet::new(std::net::Ipv6Addr::from(k.data()).into(), k.prefix_len() as u8)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            out.push((net, v));
        }
        Ok(out)
    }
}
