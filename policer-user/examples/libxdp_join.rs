//! SPIKE (issue 29, docs/design-libxdp.md): put policer's XDP program into
//! a libxdp multi-program dispatcher (protocol version 2, xdp-tools'
//! lib/libxdp/protocol.org) from Rust with aya alone, no libxdp.
//!
//! Not product code: no tests, one happy path, errors end the run. It
//! shows which pieces work and in what order; the design note says what
//! the real implementation needs beyond it.
//!
//! ```text
//! libxdp_join IFACE [--prio N] [--rule CIDR RATE BURST] [--dispatcher PATH] [--skb] [--without-policer]
//! ```
//!
//! What it does, as libxdp does it (libxdp.c: xdp_program__attach_multi,
//! xdp_multiprog__generate, xdp_multiprog__link_prog, xdp_multiprog__pin,
//! xdp_multiprog__attach, xdp_multiprog__unpin):
//! 1. lock: flock(LOCK_EX) on the directory /sys/fs/bpf/xdp;
//! 2. read what is attached (netlink); if it is a dispatcher (program name
//!    `xdp_dispatcher`, one map: its frozen .rodata config with magic 236
//!    and version 2), its components from
//!    /sys/fs/bpf/xdp/dispatch-IFINDEX-ID/progN-prog with their run
//!    priorities, chain-call actions and flags from that config;
//! 3. a new dispatcher: xdp-dispatcher.o with its `conf` global set for
//!    all components sorted by run priority; the old components are linked
//!    to it again (freplace, second attachment), policer is loaded as an
//!    extension of it (BPF_PROG_TYPE_EXT) and linked;
//! 4. every link and program pinned under dispatch-IFINDEX-NEWID;
//! 5. the new dispatcher replaces the old one on the interface
//!    (XDP_FLAGS_REPLACE with the expected old program: atomic), or is
//!    attached with XDP_FLAGS_UPDATE_IF_NOEXIST if nothing was there;
//! 6. the old dispatcher's pins are removed, the lock is released.

use std::{
    ffi::CString,
    os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd},
    path::{Path, PathBuf},
};

use anyhow::{Context, bail};
use aya::{
    EbpfLoader,
    maps::{Array, MapData},
    programs::{Extension, ProgramFd, Xdp, links::FdLink, loaded_programs},
};
use ipnet::IpNet;
use policer_common::{MAP_BUCKETS_V4_GEOMETRY, PROGRAM_NAME, Rule, rate::Rate, table::Geometry};
use policer_user::{
    EBPF_OBJECT,
    netlink::{self, XDP_FLAGS_DRV_MODE, XDP_FLAGS_SKB_MODE, XDP_FLAGS_UPDATE_IF_NOEXIST},
    trie::TrieWriter,
};

/// lib/libxdp/xdp-dispatcher.c.in (protocol.org, "Dispatcher format").
const MAX_DISPATCHER_ACTIONS: usize = 10;
const XDP_DISPATCHER_MAGIC: u8 = 236;
const XDP_DISPATCHER_VERSION: u8 = 2;
const XDP_DISPATCHER_RETVAL: u32 = 31;
const XDP_PASS: u32 = 2;
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// struct xdp_dispatcher_config (version 2): 4 + 3 * 40 = 124 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct Config {
    magic: u8,
    dispatcher_version: u8,
    num_progs_enabled: u8,
    is_xdp_frags: u8,
    chain_call_actions: [u32; MAX_DISPATCHER_ACTIONS],
    run_prios: [u32; MAX_DISPATCHER_ACTIONS],
    program_flags: [u32; MAX_DISPATCHER_ACTIONS],
}

impl Config {
    fn to_bytes(self) -> [u8; 124] {
        let mut b = [0u8; 124];
        b[0] = self.magic;
        b[1] = self.dispatcher_version;
        b[2] = self.num_progs_enabled;
        b[3] = self.is_xdp_frags;
        for i in 0..MAX_DISPATCHER_ACTIONS {
            b[4 + 4 * i..8 + 4 * i].copy_from_slice(&self.chain_call_actions[i].to_ne_bytes());
            b[44 + 4 * i..48 + 4 * i].copy_from_slice(&self.run_prios[i].to_ne_bytes());
            b[84 + 4 * i..88 + 4 * i].copy_from_slice(&self.program_flags[i].to_ne_bytes());
        }
        b
    }

    fn from_bytes(b: &[u8; 124]) -> Config {
        let u = |o: usize| u32::from_ne_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let mut c = Config {
            magic: b[0],
            dispatcher_version: b[1],
            num_progs_enabled: b[2],
            is_xdp_frags: b[3],
            ..Default::default()
        };
        for i in 0..MAX_DISPATCHER_ACTIONS {
            c.chain_call_actions[i] = u(4 + 4 * i);
            c.run_prios[i] = u(44 + 4 * i);
            c.program_flags[i] = u(84 + 4 * i);
        }
        c
    }
}

/// Removes a half-built dispatcher's pin directory unless disarmed.
struct UnpinOnError(Option<PathBuf>);

impl Drop for UnpinOnError {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

/// One component of the dispatcher to build.
struct Component {
    name: String,
    prio: u32,
    /// Chain-call actions without the stub's XDP_DISPATCHER_RETVAL bit.
    chain: u32,
    flags: u32,
    /// None: policer itself (loaded fresh as an extension).
    pinned: Option<Extension>,
}

struct Args {
    iface: String,
    prio: u32,
    rule: Option<(IpNet, String, u64)>,
    dispatcher: PathBuf,
    mode: u32,
    /// Build the dispatcher without policer (only what is there already;
    /// nothing on an empty interface): checks the dispatcher, config and
    /// pins against xdp-loader where freplace cannot be loaded.
    without_policer: bool,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        iface: String::new(),
        prio: 10,
        rule: None,
        dispatcher: "/usr/lib/x86_64-linux-gnu/bpf/xdp-dispatcher.o".into(),
        mode: XDP_FLAGS_DRV_MODE,
        without_policer: false,
    };
    while let Some(x) = it.next() {
        match x.as_str() {
            "--prio" => a.prio = it.next().context("--prio N")?.parse()?,
            "--rule" => {
                let net = it.next().context("--rule CIDR RATE BURST")?.parse()?;
                let rate = it.next().context("--rule CIDR RATE BURST")?;
                let burst = it.next().context("--rule CIDR RATE BURST")?.parse()?;
                a.rule = Some((net, rate, burst));
            }
            "--dispatcher" => a.dispatcher = it.next().context("--dispatcher PATH")?.into(),
            "--skb" => a.mode = XDP_FLAGS_SKB_MODE,
            "--without-policer" => a.without_policer = true,
            _ if a.iface.is_empty() => a.iface = x,
            _ => bail!("unexpected argument {x}"),
        }
    }
    if a.iface.is_empty() {
        bail!(
            "usage: libxdp_join IFACE [--prio N] [--rule CIDR RATE BURST] [--dispatcher PATH] [--skb] [--without-policer]"
        );
    }
    Ok(a)
}

/// bpf(BPF_PROG_GET_FD_BY_ID).
fn prog_fd_by_id(id: u32) -> anyhow::Result<OwnedFd> {
    #[repr(C)]
    struct Attr {
        id: u32,
        next_id: u32,
        open_flags: u32,
    }
    let attr = Attr { id, next_id: 0, open_flags: 0 };
    const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
    // SAFETY: attr is a valid bpf_attr prefix for this command.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_GET_FD_BY_ID, &attr, size_of::<Attr>()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context(format!("BPF_PROG_GET_FD_BY_ID {id}"));
    }
    // SAFETY: the kernel returned a new descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn ensure_bpffs(dir: &Path) -> anyhow::Result<()> {
    let c = CString::new(dir.as_os_str().as_encoded_bytes())?;
    // SAFETY: statfs into a zeroed struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is NUL-terminated, s is writable.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 || s.f_type != BPF_FS_MAGIC {
        bail!("{} is not a bpffs (mount -t bpf bpf {})", dir.display(), dir.display());
    }
    Ok(())
}

fn main() -> anyhow::Result<()> {
    env_logger::init();
    let args = parse_args()?;
    let ifindex = policer_user::loader::if_index(&args.iface)?;
    let bpffs = Path::new("/sys/fs/bpf");
    ensure_bpffs(bpffs)?;
    let xdp_dir = bpffs.join("xdp");
    match std::fs::create_dir(&xdp_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e).context("mkdir /sys/fs/bpf/xdp"),
    }
    // The protocol's lock: flock on the xdp directory (libxdp.c:
    // xdp_lock_acquire). Held until the end of main.
    let lock = std::fs::File::open(&xdp_dir).context("open /sys/fs/bpf/xdp")?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
        return Err(std::io::Error::last_os_error()).context("flock /sys/fs/bpf/xdp");
    }

    // 2. What is attached now.
    let mut comps: Vec<Component> = Vec::new();
    let mut old: Option<(OwnedFd, u32)> = None;
    let mut mode = args.mode;
    if let Some(state) = netlink::query(ifindex)? {
        let fd = prog_fd_by_id(state.prog_id)?;
        let info = loaded_programs()
            .filter_map(Result::ok)
            .find(|p| p.id() == state.prog_id)
            .context("attached program not listed")?;
        let name = info.name_as_str().unwrap_or("").to_string();
        let map_ids = info.map_ids()?.unwrap_or_default();
        if name != "xdp_dispatcher" || map_ids.len() != 1 {
            bail!(
                "{}: program {name:?} (id {}) is attached and is not a libxdp dispatcher; not replacing it",
                args.iface,
                state.prog_id
            );
        }
        let map = MapData::from_id(map_ids[0]).context("dispatcher config map")?;
        let arr: Array<MapData, [u8; 124]> =
            Array::try_from(aya::maps::Map::Array(map)).context("config map is not a [u8; 124] array")?;
        let cfg = Config::from_bytes(&arr.get(&0, 0)?);
        if cfg.magic != XDP_DISPATCHER_MAGIC || cfg.dispatcher_version != XDP_DISPATCHER_VERSION {
            bail!("dispatcher magic/version {}/{} is not 236/2", cfg.magic, cfg.dispatcher_version);
        }
        let dir = xdp_dir.join(format!("dispatch-{ifindex}-{}", state.prog_id));
        for i in 0..usize::from(cfg.num_progs_enabled) {
            let pin = dir.join(format!("prog{i}-prog"));
            let ext = Extension::from_pin(&pin).with_context(|| format!("{}", pin.display()))?;
            let name = ext.info()?.name_as_str().unwrap_or("?").to_string();
            comps.push(Component {
                name,
                prio: cfg.run_prios[i],
                chain: cfg.chain_call_actions[i] & !(1 << XDP_DISPATCHER_RETVAL),
                flags: cfg.program_flags[i],
                pinned: Some(ext),
            });
        }
        if state.mode_flags != 0 {
            mode = state.mode_flags;
        }
        eprintln!(
            "joining dispatcher id {} with {} component(s): {:?}",
            state.prog_id,
            comps.len(),
            comps.iter().map(|c| (&c.name, c.prio)).collect::<Vec<_>>()
        );
        old = Some((fd, state.prog_id));
    }
    if !args.without_policer {
        comps.push(Component {
            name: PROGRAM_NAME.into(),
            prio: args.prio,
            chain: 1 << XDP_PASS,
            flags: 0,
            pinned: None,
        });
    }
    if comps.len() > MAX_DISPATCHER_ACTIONS {
        bail!("the dispatcher is full ({MAX_DISPATCHER_ACTIONS} programs)");
    }
    // libxdp.c cmp_xdp_programs: run priority, then function name (then
    // loaded before not loaded, size, tag, load time: not needed here).
    comps.sort_by(|a, b| a.prio.cmp(&b.prio).then_with(|| a.name.cmp(&b.name)));

    // 3. The new dispatcher.
    let mut cfg = Config {
        magic: XDP_DISPATCHER_MAGIC,
        dispatcher_version: XDP_DISPATCHER_VERSION,
        num_progs_enabled: comps.len() as u8,
        is_xdp_frags: 0,
        ..Default::default()
    };
    for (i, c) in comps.iter().enumerate() {
        cfg.chain_call_actions[i] = c.chain | (1 << XDP_DISPATCHER_RETVAL);
        cfg.run_prios[i] = c.prio;
        cfg.program_flags[i] = c.flags;
    }
    let cfg_bytes = cfg.to_bytes();
    let mut disp_obj = EbpfLoader::new()
        .override_global("conf", &cfg_bytes, true)
        .load_file(&args.dispatcher)
        .with_context(|| format!("loading {}", args.dispatcher.display()))?;
    let disp: &mut Xdp = disp_obj.program_mut("xdp_dispatcher").context("no xdp_dispatcher")?.try_into()?;
    disp.load().context("verifying the dispatcher")?;
    let disp_fd: ProgramFd = disp.fd()?.try_clone()?;
    let disp_id = disp.info()?.id();
    let new_dir = xdp_dir.join(format!("dispatch-{ifindex}-{disp_id}"));
    std::fs::create_dir(&new_dir).with_context(|| format!("mkdir {}", new_dir.display()))?;
    // Until the swap succeeds, a failure removes the new pins again (as
    // xdp_multiprog__pin's err_unpin does); the old dispatcher is untouched.
    let mut undo = UnpinOnError(Some(new_dir.clone()));

    let mut policer_obj = EbpfLoader::new().extension(PROGRAM_NAME).load(EBPF_OBJECT).context("policer object")?;
    // Only one component: libxdp replaces the dispatcher's main function
    // itself (xdp_multiprog__link_prog: attach_func = "xdp_dispatcher").
    let n = comps.len();
    let target = |i: usize| if n == 1 { "xdp_dispatcher".to_string() } else { format!("prog{i}") };
    let mut keep = Vec::new();
    for (i, c) in comps.iter_mut().enumerate() {
        let t = target(i);
        let (ext, link_id) = match &mut c.pinned {
            Some(ext) => {
                let id =
                    ext.attach_to_program(&disp_fd, &t).with_context(|| format!("re-linking {} to {t}", c.name))?;
                (ext, id)
            }
            None => {
                let ext: &mut Extension =
                    policer_obj.program_mut(PROGRAM_NAME).context("no policer program")?.try_into()?;
                ext.load(disp_fd.try_clone()?, &t).with_context(|| format!("loading policer as freplace of {t}"))?;
                let id = ext.attach().context("linking policer")?;
                (ext, id)
            }
        };
        let link: FdLink = ext.take_link(link_id)?.into();
        keep.push(link.pin(new_dir.join(format!("prog{i}-link")))?);
        ext.pin(new_dir.join(format!("prog{i}-prog")))?;
        eprintln!("  prog{i}: {} prio {} chain {:#x} -> {t}", c.name, c.prio, cfg.chain_call_actions[i]);
    }

    if let Some((net, rate, burst)) = &args.rule {
        let geometry = Geometry::new(0x5eed, policer_common::DEFAULT_MAX_SOURCES);
        let mut g: Array<&mut MapData, Geometry> =
            Array::try_from(policer_obj.map_mut(MAP_BUCKETS_V4_GEOMETRY).context("geometry map")?)?;
        g.set(0, &geometry, 0)?;
        let rule: Rule = Rate::parse(rate)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .rule(*burst)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?
            .with_key_len(32, false)
            .map_err(|e| anyhow::anyhow!("{e:?}"))?;
        let fd = |n| -> anyhow::Result<i32> {
            let m = policer_obj.map(n).context(n)?;
            let aya::maps::Map::LpmTrie(d) = m else { bail!("{n} is not a trie") };
            Ok(d.fd().as_fd().as_raw_fd())
        };
        let w = TrieWriter::new(fd(policer_common::MAP_RULES_V4)?, fd(policer_common::MAP_RULES_V6)?);
        w.set(*net, Some(&rule))?;
        eprintln!("  rule {net}: {rate} burst {burst}");
    }

    // 5. Atomic swap (or first attach).
    let (flags, expected) = match &old {
        Some((fd, _)) => (mode, Some(fd.as_raw_fd())),
        None => (mode | XDP_FLAGS_UPDATE_IF_NOEXIST, None),
    };
    netlink::set(ifindex, disp_fd.as_fd().as_raw_fd(), flags, expected)
        .map_err(|e| anyhow::anyhow!("attaching the new dispatcher: {e}"))?;
    undo.0 = None;
    eprintln!("dispatcher id {disp_id} attached to {} (ifindex {ifindex})", args.iface);

    // 6. The old dispatcher's pins go.
    if let Some((_, old_id)) = old {
        let dir = xdp_dir.join(format!("dispatch-{ifindex}-{old_id}"));
        std::fs::remove_dir_all(&dir).with_context(|| format!("rm {}", dir.display()))?;
    }
    // The pinned links hold the components to the dispatcher; the device
    // holds the dispatcher. Forget the aya handles so nothing is detached
    // (dropping an Ebpf unloads only what no pin holds; be explicit).
    std::mem::forget(keep);
    std::mem::forget(policer_obj);
    std::mem::forget(disp_obj);
    drop(lock);
    Ok(())
}
