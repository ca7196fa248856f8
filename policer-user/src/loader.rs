//! Loading the XDP object, filling its maps and attaching it.

use std::{ffi::CString, io};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
    programs::{ProgramError, Xdp, XdpMode, xdp::XdpLinkId},
};
use ipnet::IpNet;
use policer_common::{
    Counters, DEFAULT_MAX_SOURCES, GLOBAL_TEST_CLOCK, MAP_CLOCK, MAP_COUNTERS, MAP_RULES_V4,
    MAP_RULES_V6, PROGRAM_NAME, Rule,
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
    pub fn name(xdp: XdpMode) -> &'static str {
        match xdp {
            XdpMode::Driver => "native",
            XdpMode::Skb => "skb",
            XdpMode::Hardware => "hw",
            XdpMode::Default => "default",
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the bucket table.
    pub max_sources: u32,
    /// Read the clock from the CLOCK map (tests only).
    pub test_clock: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_sources: DEFAULT_MAX_SOURCES,
            test_clock: false,
        }
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
    if idx == 0 {
        Err(Error::UnknownInterface(name.into()))
    } else {
        Ok(idx)
    }
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
        let mut ebpf =
            EbpfLoader::new()
                .map_max_entries(policer_common::MAP_BUCKETS, opts.max_sources)
                .override_global(GLOBAL_TEST_CLOCK, &test_clock, true)
                .load(EBPF_OBJECT)
                .map_err(|e| match &e {
                    aya::EbpfError::MapError(aya::maps::MapError::CreateError {
                        io_error, ..
                    }) if is_eperm(io_error) => Error::NotRoot("loading the XDP program"),
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
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| p.try_into().ok())
            .expect("loaded")
    }

    /// Installs (or replaces, atomically for that prefix) the rule for `net`.
    pub fn set_rule(&mut self, net: IpNet, rule: &Rule) -> Result<()> {
        let net = net.trunc();
        match net {
            IpNet::V4(n) => {
                let mut m: LpmTrie<&mut MapData, [u8; 4], Rule> = LpmTrie::try_from(
                    self.ebpf
                        .map_mut(MAP_RULES_V4)
                        .ok_or(Error::Missing(MAP_RULES_V4))?,
                )
                .map_err(Error::map(MAP_RULES_V4))?;
                m.insert(
                    &Key::new(n.prefix_len().into(), n.network().octets()),
                    rule,
                    0,
                )
                .map_err(Error::map(MAP_RULES_V4))
            }
            IpNet::V6(n) => {
                let mut m: LpmTrie<&mut MapData, [u8; 16], Rule> = LpmTrie::try_from(
                    self.ebpf
                        .map_mut(MAP_RULES_V6)
                        .ok_or(Error::Missing(MAP_RULES_V6))?,
                )
                .map_err(Error::map(MAP_RULES_V6))?;
                m.insert(
                    &Key::new(n.prefix_len().into(), n.network().octets()),
                    rule,
                    0,
                )
                .map_err(Error::map(MAP_RULES_V6))
            }
        }
    }

    /// Counters summed over CPUs.
    pub fn counters(&self) -> Result<Counters> {
        let m: PerCpuArray<&MapData, Counters> = PerCpuArray::try_from(
            self.ebpf
                .map(MAP_COUNTERS)
                .ok_or(Error::Missing(MAP_COUNTERS))?,
        )
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
        let mut m: Array<&mut MapData, u64> = Array::try_from(
            self.ebpf
                .map_mut(MAP_CLOCK)
                .ok_or(Error::Missing(MAP_CLOCK))?,
        )
        .map_err(Error::map(MAP_CLOCK))?;
        m.set(0, &now_ns, 0).map_err(Error::map(MAP_CLOCK))
    }

    /// Attaches to `iface`; returns the link and the mode obtained.
    pub fn attach(&mut self, iface: &str, mode: Mode) -> Result<(XdpLinkId, XdpMode)> {
        let idx = if_index(iface)?;
        let tries: &[XdpMode] = match mode {
            Mode::Auto => &[XdpMode::Driver, XdpMode::Skb],
            Mode::Native => &[XdpMode::Driver],
            Mode::Skb => &[XdpMode::Skb],
        };
        let mut last = None;
        for &m in tries {
            match self.program().attach(idx, m) {
                Ok(id) => return Ok((id, m)),
                Err(e) => {
                    let err = classify(iface, m, e);
                    // Only "this mode is not supported" moves on to the
                    // next mode; anything else (another program, no
                    // permission) is final.
                    if !matches!(err, Error::ModeUnsupported { .. }) {
                        return Err(err);
                    }
                    last = Some(err);
                }
            }
        }
        Err(last.expect("at least one mode tried"))
    }
}

fn classify(iface: &str, mode: XdpMode, e: ProgramError) -> Error {
    let errno = match &e {
        ProgramError::SyscallError(s) => s.io_error.raw_os_error(),
        ProgramError::XdpError(aya::programs::xdp::XdpError::NetlinkError(n)) => {
            // Netlink errors carry the errno in their io::Error source.
            std::error::Error::source(n)
                .and_then(|s| s.downcast_ref::<io::Error>())
                .and_then(io::Error::raw_os_error)
        }
        _ => None,
    };
    match errno {
        Some(libc::EBUSY) | Some(libc::EEXIST) => Error::AlreadyAttached {
            iface: iface.into(),
        },
        Some(libc::EPERM) | Some(libc::EACCES) => Error::NotRoot("attaching XDP"),
        Some(libc::EOPNOTSUPP) => Error::ModeUnsupported {
            iface: iface.into(),
            mode: Mode::name(mode),
        },
        _ => Error::Attach {
            iface: iface.into(),
            source: Box::new(e),
        },
    }
}
