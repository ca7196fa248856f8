//! The chain on the user side (docs/chain.md): the bpffs it is pinned in,
//! the programs in its slots, and the checks a program passes before it
//! joins. The array and its counters are policer_common::chain's; the
//! daemon's owner puts programs in and takes them out
//! (`daemon/chain.rs`), the CLI only asks.

pub mod dispatch;

use std::{
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Map, MapData, ProgramArray},
    programs::{ProgramFd, ProgramInfo, loaded_programs},
};
use policer_common::{
    MAX_IFACE_SLOTS,
    chain::{BPFFS, CHAIN_SLOTS, MAP_CHAIN, MAP_CHAINS, dispatch_pin_path, pin_path},
};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// `BPF_FS_MAGIC` (linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Whether `path` is a bpffs mount (or in one; a path not made yet: its
/// nearest existing ancestor).
pub fn is_bpffs(path: &Path) -> bool {
    let Some(path) = path.ancestors().find(|p| p.exists()) else {
        return false;
    };
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs into a zeroed struct with a valid C string.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC
    }
}

/// Mounts a bpffs at /sys/fs/bpf where none is (a real host's systemd
/// mounts one; a bare VM may not). True when it mounted one now.
pub fn ensure_bpffs() -> Result<bool> {
    let at = Path::new(BPFFS);
    if is_bpffs(at) {
        return Ok(false);
    }
    std::fs::create_dir_all(at).map_err(Error::kernel(format!("making {BPFFS}")))?;
    // SAFETY: plain mount(2) with static C strings.
    let r = unsafe { libc::mount(c"bpf".as_ptr(), c"/sys/fs/bpf".as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) };
    if r != 0 {
        return Err(Error::Kernel {
            what: format!("mounting a bpffs at {BPFFS}"),
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(true)
}

/// What is pinned under policer's root in the bpffs now: each
/// interface's directory and the chains and dispatchers in it.
pub fn pins_now() -> Vec<PathBuf> {
    let Ok(dirs) = std::fs::read_dir(policer_common::chain::PIN_ROOT) else {
        return Vec::new();
    };
    let mut pins = Vec::new();
    for dir in dirs.filter_map(|e| Some(e.ok()?.path())) {
        pins.extend(std::fs::read_dir(&dir).into_iter().flatten().filter_map(|e| Some(e.ok()?.path())));
        pins.push(dir);
    }
    pins
}

/// After a start that failed: the pins it made for `iface` (not in
/// `before`, [`pins_now`]'s) go, a chain only while empty (nothing put a
/// program in it meanwhile), the directory when emptied.
pub fn unpin_made(iface: &str, before: &[PathBuf]) {
    let (chain, dispatch) = (pin_path(iface), dispatch_pin_path(iface));
    if !before.contains(&dispatch) {
        let _ = std::fs::remove_file(&dispatch);
    }
    if !before.contains(&chain) && slots(iface).is_ok_and(|s| s.is_empty()) {
        let _ = std::fs::remove_file(&chain);
    }
    if let Some(dir) = chain.parent().filter(|d| !before.iter().any(|p| p == d)) {
        let _ = std::fs::remove_dir(dir);
    }
}

/// Gives each interface (name, ifindex) its own chain and the dispatcher
/// that reaches it, before the program is attached (so the hand-off finds
/// them from its first frame): the array pinned at the interface's
/// [`pin_path`] (kept with its programs when pinned there already, else
/// made), its dispatcher loaded and put in `chains` at the interface's
/// slot (replacing an earlier start's in one step), and `chains` pinned
/// beside it ([`dispatch_pin_path`]). An array one interface shares with
/// another (a build before this one pinned one chain under every name) is
/// split: a copy of its slots for each interface after the first. What
/// changed, in lines to say.
pub fn dispatch_all(ifaces: &[(String, u32)], chains: &MapData, counters: RawFd) -> Result<Vec<String>> {
    for (i, (a, ai)) in ifaces.iter().enumerate() {
        if let Some((b, _)) = ifaces[..i].iter().find(|(_, bi)| bi % MAX_IFACE_SLOTS == ai % MAX_IFACE_SLOTS) {
            return Err(Error::Invalid(format!(
                "{b} and {a} share an interface slot (their indexes are equal modulo {MAX_IFACE_SLOTS}): one \
                 daemon cannot keep their chains and counters apart; run a daemon for each"
            )));
        }
    }
    let chains_id = chains.info().map_err(Error::map(MAP_CHAINS))?.id();
    // SAFETY: the program's counters map, open as long as `chains` is.
    let counters = unsafe { BorrowedFd::borrow_raw(counters) };
    let mut said = Vec::new();
    let mut seen: Vec<(u32, String)> = Vec::new();
    for (name, index) in ifaces {
        let array = own_array(name, &mut seen, &mut said)?;
        let dispatcher = dispatch::load_dispatcher(array.as_fd(), counters, *index)
            .map_err(Error::kernel(format!("loading the dispatcher of {name}'s chain")))?;
        dispatch::put(chains.fd().as_fd(), index % MAX_IFACE_SLOTS, dispatcher.as_fd())
            .map_err(Error::kernel(format!("putting {name}'s chain dispatcher in {MAP_CHAINS}")))?;
        let at = dispatch_pin_path(name);
        if aya::maps::MapInfo::from_pin(&at).is_ok_and(|i| i.id() == chains_id) {
            continue;
        }
        let _ = std::fs::remove_file(&at);
        dispatch::pin(chains.fd().as_fd(), &at).map_err(Error::kernel(format!("pinning {}", at.display())))?;
    }
    Ok(said)
}

/// Takes the dispatcher of the interface with `ifindex` out of `chains`
/// (the interface leaves a program that polices others still): nothing
/// holds that interface's chain open for the program any more.
pub fn forget_dispatcher(chains: &MapData, ifindex: u32) -> Result<()> {
    crate::batch::delete_elem(chains.fd().as_fd().as_raw_fd(), &(ifindex % MAX_IFACE_SLOTS))
        .map_err(Error::kernel(format!("taking a dispatcher out of {MAP_CHAINS}")))
}

/// `iface`'s own chain array: its pin's, else a new one pinned there; a
/// copy when its pin is an array `seen` for an earlier interface.
fn own_array(iface: &str, seen: &mut Vec<(u32, String)>, said: &mut Vec<String>) -> Result<OwnedFd> {
    let at = pin_path(iface);
    if at.exists() {
        let m = open_data(iface)?;
        let info = m.info().map_err(Error::map(MAP_CHAIN))?;
        is_a_chain(&info, &at)?;
        let id = info.id();
        let Some((_, first)) = seen.iter().find(|(i, _)| *i == id) else {
            seen.push((id, iface.to_string()));
            return Ok(m.fd().as_fd().try_clone_to_owned()?);
        };
        let copy = dispatch::create_array().map_err(Error::kernel(format!("making {iface}'s chain")))?;
        let mut moved = Vec::new();
        for s in read_slots(&m, 0..CHAIN_SLOTS)? {
            let prog = program_info(s.program_id)
                .ok_or_else(|| Error::Invalid(format!("program {} went away", s.program_id)))?
                .fd()
                .map_err(|e| Error::Program(Box::new(e)))?;
            dispatch::put(copy.as_fd(), s.slot, prog.as_fd())
                .map_err(Error::kernel(format!("copying slot {} of {iface}'s chain", s.slot)))?;
            moved.push(format!("slot {}: program {} ('{}')", s.slot, s.program_id, s.name));
        }
        std::fs::remove_file(&at).map_err(Error::kernel(format!("replacing {}", at.display())))?;
        dispatch::pin(copy.as_fd(), &at).map_err(Error::kernel(format!("pinning {}", at.display())))?;
        said.push(format!(
            "policer: {iface} has a chain of its own now (it shared {first}'s, as builds before this one made \
             them){}",
            if moved.is_empty() { String::new() } else { format!(": copied {}", moved.join(", ")) }
        ));
        return Ok(copy);
    }
    if let Some(dir) = at.parent() {
        std::fs::create_dir_all(dir).map_err(Error::kernel(format!("making {}", dir.display())))?;
    }
    let new = dispatch::create_array().map_err(Error::kernel(format!("making {iface}'s chain")))?;
    dispatch::pin(new.as_fd(), &at).map_err(Error::kernel(format!("pinning {}", at.display())))?;
    seen.push((new_id(&at)?, iface.to_string()));
    Ok(new)
}

/// Whether the map pinned at `at` is a chain: a program array of
/// [`CHAIN_SLOTS`] slots. Anything else there (another tool's map, a
/// hand-made pin) is refused by name, not with the kernel's error at the
/// first put.
fn is_a_chain(info: &aya::maps::MapInfo, at: &Path) -> Result<()> {
    let kind = info.map_type().map_or_else(|e| format!("a map of an unknown type ({e})"), |t| format!("{t:?}"));
    if matches!(info.map_type(), Ok(aya::maps::MapType::ProgramArray)) && info.max_entries() == CHAIN_SLOTS {
        return Ok(());
    }
    Err(Error::Invalid(format!(
        "{} is not a policer chain (a program array of {CHAIN_SLOTS} slots) but {kind} of {} entries ('{}', map \
         {}): move it away or remove it, and policer pins a chain there",
        at.display(),
        info.max_entries(),
        info.name_as_str().unwrap_or("?"),
        info.id()
    )))
}

/// The id of the map pinned at `at`.
fn new_id(at: &Path) -> Result<u32> {
    aya::maps::MapInfo::from_pin(at).map(|i| i.id()).map_err(Error::map(MAP_CHAIN))
}

/// The chain pinned for `iface`.
fn open_data(iface: &str) -> Result<MapData> {
    let at = pin_path(iface);
    MapData::from_pin(&at).map_err(|e| {
        Error::Invalid(format!("{iface} has no chain at {} (policer pins it when it attaches): {e}", at.display()))
    })
}

/// The chain pinned for `iface`, to change.
fn open(iface: &str) -> Result<ProgramArray<MapData>> {
    ProgramArray::try_from(Map::ProgramArray(open_data(iface)?)).map_err(Error::map(MAP_CHAIN))
}

/// The id of the program in `slot` (a program array's value, read from
/// user space, is the program's id).
fn slot_id(m: &MapData, slot: u32) -> Result<Option<u32>> {
    crate::batch::lookup(m.fd().as_fd().as_raw_fd(), &slot).map_err(Error::kernel(format!("reading {MAP_CHAIN}")))
}

/// One `[[chain]]` table: a program in a slot of an interface's chain,
/// from an object file (`object`, `program`, `pin_maps`) or a bpffs pin
/// (`pinned`). Written by `policer chain add/rm`, read at start and reload.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChainConfig {
    pub interface: String,
    pub slot: u32,
    /// A libbpf-style object file (absolute, or relative to the config's
    /// directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The object's program (default: its only XDP program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub program: Option<String>,
    /// Where the object's pin-by-name maps are pinned (default /sys/fs/bpf).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pin_maps: Option<String>,
    /// A program already loaded and pinned in bpffs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
}

impl ChainConfig {
    /// Where the program comes from, for `chain ls` and messages.
    pub fn from(&self) -> String {
        match (&self.object, &self.pinned) {
            (Some(o), _) => match &self.program {
                Some(p) => format!("{o} ({p})"),
                None => o.clone(),
            },
            (None, Some(p)) => format!("pinned {p}"),
            (None, None) => String::new(),
        }
    }

    /// The table's problems beyond its keys' types: a slot in range, one
    /// source, the object's keys only with an object.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.interface.is_empty() {
            return Err("needs an interface; write interface = \"eth0\"".into());
        }
        if self.slot >= CHAIN_SLOTS {
            return Err(format!("slot {}: the chain has slots 0 to {}", self.slot, CHAIN_SLOTS - 1));
        }
        match (&self.object, &self.pinned) {
            (Some(_), Some(_)) => Err("names both object and pinned; a slot holds one program".into()),
            (None, None) => Err("needs object = \"FILE.o\" or pinned = \"/sys/fs/bpf/PATH\"".into()),
            (None, Some(_)) if self.program.is_some() || self.pin_maps.is_some() => {
                Err("program and pin_maps go with object, not pinned".into())
            }
            _ => Ok(()),
        }
    }
}

/// One filled slot, as `chain ls` shows it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SlotView {
    pub slot: u32,
    pub program_id: u32,
    pub name: String,
    /// The program's tag (hex), as bpftool shows it.
    pub tag: String,
    /// Where it came from: the config's object or pin, or "outside policer"
    /// (bpftool, another tool) when the config names nothing for the slot.
    pub from: String,
}

/// The filled slots of `iface`'s chain (program id, name, tag).
pub fn slots(iface: &str) -> Result<Vec<SlotView>> {
    read_slots(&open_data(iface)?, 0..CHAIN_SLOTS)
}

/// The filled slots of `range` of the program array pinned at `path`
/// (another root's, for a member: `attach --join`).
pub fn slots_in(path: &Path, range: std::ops::Range<u32>) -> Result<Vec<SlotView>> {
    let m = MapData::from_pin(path)
        .map_err(|e| Error::Invalid(format!("cannot open the program array at {}: {e}", path.display())))?;
    read_slots(&m, range)
}

fn read_slots(m: &MapData, range: std::ops::Range<u32>) -> Result<Vec<SlotView>> {
    let mut out = Vec::new();
    for slot in range {
        let Some(id) = slot_id(m, slot)? else { continue };
        let info = program_info(id);
        out.push(SlotView {
            slot,
            program_id: id,
            name: info.as_ref().and_then(|i| i.name_as_str().map(str::to_string)).unwrap_or_default(),
            tag: info.as_ref().map(|i| format!("{:016x}", i.tag())).unwrap_or_default(),
            from: String::new(),
        });
    }
    Ok(out)
}

/// The loaded program with `id`, if it still is.
pub fn program_info(id: u32) -> Option<ProgramInfo> {
    loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == id)
}

/// Puts `prog` in `slot` of `iface`'s chain; the kernel's refusal named.
pub fn put(iface: &str, slot: u32, prog: &ProgramFd) -> Result<()> {
    let mut arr = open(iface)?;
    arr.set(slot, prog, 0).map_err(|e| {
        let invalid =
            matches!(&e, aya::maps::MapError::SyscallError(s) if s.io_error.raw_os_error() == Some(libc::EINVAL));
        if invalid {
            Error::Invalid(format!(
                "the kernel refused the program in slot {slot} of {iface}'s chain: a program array takes only \
                 programs like policer's (XDP, without xdp.frags, attach type xdp): {e}"
            ))
        } else {
            Error::map(MAP_CHAIN)(e)
        }
    })
}

/// Empties `slot` of `iface`'s chain; the id of the program it held.
pub fn take(iface: &str, slot: u32) -> Result<Option<u32>> {
    let id = slot_id(&open_data(iface)?, slot)?;
    if id.is_some() {
        open(iface)?.clear_index(&slot).map_err(Error::map(MAP_CHAIN))?;
    }
    Ok(id)
}

/// The first empty slot of `iface`'s chain.
pub fn first_free(iface: &str) -> Result<u32> {
    let used: Vec<u32> = slots(iface)?.iter().map(|s| s.slot).collect();
    (0..CHAIN_SLOTS)
        .find(|s| !used.contains(s))
        .ok_or_else(|| Error::Invalid(format!("{iface}'s chain is full ({CHAIN_SLOTS} slots): `policer chain rm` one")))
}

/// Checks a slot number given by an operator.
pub fn check_slot(slot: u32) -> Result<u32> {
    if slot < CHAIN_SLOTS {
        Ok(slot)
    } else {
        Err(Error::Invalid(format!("slot {slot}: the chain has slots 0 to {}", CHAIN_SLOTS - 1)))
    }
}

/// Which program of an object joins the chain, or why none can: the one
/// named (else the object's only XDP program), of section `xdp` (an
/// interface's attach type, without frags), as policer's own program is:
/// the kernel takes only such programs into the array.
pub fn pick_program(object: &[u8], program: Option<&str>) -> Result<String> {
    use aya_obj::{ProgramSection, programs::XdpAttachType};
    let obj = aya_obj::Object::parse(object).map_err(|e| Error::Invalid(format!("not a BPF object: {e}")))?;
    let mut names: Vec<&String> = obj.programs.keys().collect();
    names.sort();
    let name = match program {
        Some(p) => obj.programs.get_key_value(p).map(|(k, _)| k).ok_or_else(|| {
            Error::Invalid(format!(
                "the object has no program '{p}' (it has: {})",
                names.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
            ))
        })?,
        None => {
            let xdp: Vec<&&String> = names
                .iter()
                .filter(|n| matches!(obj.programs[n.as_str()].section, ProgramSection::Xdp { .. }))
                .collect();
            match xdp.as_slice() {
                [one] => *one,
                [] => match names.first() {
                    Some(n) => n,
                    None => return Err(Error::Invalid("the object holds no program".into())),
                },
                more => {
                    return Err(Error::Invalid(format!(
                        "the object has {} XDP programs ({}): name one with --program",
                        more.len(),
                        more.iter().map(|n| n.as_str()).collect::<Vec<_>>().join(", ")
                    )));
                }
            }
        }
    };
    match &obj.programs[name].section {
        ProgramSection::Xdp { frags: true, .. } => Err(Error::Invalid(format!(
            "program '{name}' is built for xdp.frags (multi-buffer): policer's program is not, and the kernel takes \
             only programs like the array's owner into a chain"
        ))),
        ProgramSection::Xdp { attach_type: XdpAttachType::CpuMap | XdpAttachType::DevMap, .. } => {
            Err(Error::Invalid(format!(
                "program '{name}' is built for another attach type (a cpumap or devmap program): only an \
                 interface's XDP program (section \"xdp\") can join the chain"
            )))
        }
        ProgramSection::Xdp { .. } => Ok(name.clone()),
        other => Err(Error::Invalid(format!(
            "program '{name}' is not an XDP program (section kind {}): only XDP programs can join the chain",
            section_kind(other)
        ))),
    }
}

/// A section's kind for messages: `SocketFilter`, `SchedClassifier`, ...
fn section_kind(s: &aya_obj::ProgramSection) -> String {
    let d = format!("{s:?}");
    d.split([' ', '{', '(']).next().unwrap_or_default().to_string()
}

/// What `policer check` can tell of a table without loading it: its
/// object is there and has a program that can join (a pinned program is
/// the running host's, not checked).
pub fn check_object(c: &ChainConfig, base: &Path) -> std::result::Result<(), String> {
    let Some(object) = &c.object else { return Ok(()) };
    let path = if Path::new(object).is_absolute() { PathBuf::from(object) } else { base.join(object) };
    let bytes = std::fs::read(&path).map_err(|e| format!("{object}: {e}"))?;
    pick_program(&bytes, c.program.as_deref()).map(|_| ()).map_err(|e| format!("{object}: {e}"))
}

/// Where `pin_maps` defaults: libbpf's own place for pin-by-name maps.
pub fn default_pin_maps() -> PathBuf {
    PathBuf::from(BPFFS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_checked() {
        assert_eq!(check_slot(0).unwrap(), 0);
        assert_eq!(check_slot(7).unwrap(), 7);
        assert!(check_slot(8).unwrap_err().to_string().contains("slots 0 to 7"));
    }

    #[test]
    fn not_an_object_is_named() {
        assert!(pick_program(b"hello", None).unwrap_err().to_string().contains("not a BPF object"));
    }
}
