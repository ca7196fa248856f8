//! Finding what is on an interface, adopting a running policer program,
//! attaching fresh, and detaching a program no daemon owns.

use std::{
    collections::BTreeMap,
    fs,
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, Map, MapData, MapInfo},
    programs::{ProgramFd, loaded_programs},
};
use policer_common::{
    LAYOUT_VERSION, MAP_LAYOUT, MAPS_OF_EVERY_BUILD, PROGRAM_NAME, SHARED_MAP_LAYOUT, SHARED_MAPS,
    UNSTAMPED_LAYOUT_VERSION,
};

use crate::{
    control,
    error::{Error, Result},
    loader::{Mode, if_index, is_root},
    netlink::{self, XDP_FLAGS_UPDATE_IF_NOEXIST},
};

/// A running policer program found on an interface.
pub(super) struct Found {
    pub prog_id: u32,
    pub prog_fd: ProgramFd,
    /// name -> (map id, max_entries), of the maps named in SHARED_MAPS.
    pub maps: BTreeMap<String, (u32, u32)>,
    pub layout: Layout,
}

/// The layout of a running policer program's maps, as this build sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Layout {
    /// This build's: its rules, buckets and counters can be adopted.
    Same,
    /// Stamped with another version: replaced by a fresh program.
    Version(u32),
    /// Stamped with this build's version, but its maps differ (a build that
    /// changed the layout without bumping LAYOUT_VERSION): replaced too,
    /// rather than misread.
    Mismatch,
    /// No stamp, and maps unlike this build's: a build from before layout
    /// versions, older than version UNSTAMPED_LAYOUT_VERSION.
    Unstamped,
    /// This build's layout, but room for fewer rules than the start needs
    /// (an older build's 4 095 counter slots, or a smaller --max-rules):
    /// adopting it would refuse the config, so it is replaced.
    RuleLimit { has: u32, needs: u32 },
}

impl Layout {
    /// A policer program's layout from its stamp (if any) and whether its
    /// shared maps are exactly this build's (names and sizes).
    fn of(stamp: Option<u32>, same_maps: bool) -> Layout {
        match stamp {
            Some(v) if v != LAYOUT_VERSION => Layout::Version(v),
            Some(_) if same_maps => Layout::Same,
            Some(_) => Layout::Mismatch,
            None if same_maps && UNSTAMPED_LAYOUT_VERSION == LAYOUT_VERSION => Layout::Same,
            None if same_maps => Layout::Version(UNSTAMPED_LAYOUT_VERSION),
            None => Layout::Unstamped,
        }
    }

    /// "an older layout (v1)", for messages.
    pub fn describe(self) -> String {
        match self {
            Layout::Same => format!("this build's layout (v{LAYOUT_VERSION})"),
            Layout::Version(v) if v < LAYOUT_VERSION => format!("an older layout (v{v})"),
            Layout::Version(v) => format!("a newer layout (v{v}; this build has v{LAYOUT_VERSION})"),
            Layout::Mismatch => format!("another layout (stamped v{LAYOUT_VERSION}, but its maps differ)"),
            Layout::Unstamped => "an older layout (a build from before layout versions)".into(),
            Layout::RuleLimit { has, needs } => format!("a limit of {has} rules (this start needs {needs})"),
        }
    }
}

/// What is on an interface now.
pub(super) enum Existing {
    None,
    /// A policer program of this build's layout: adopted.
    Ours {
        prog_id: u32,
        mode_flags: u32,
    },
    /// A policer program of another layout: replaced by a fresh one.
    OtherLayout {
        prog_id: u32,
        mode_flags: u32,
        layout: Layout,
    },
}

pub(super) fn inspect(iface: &str, index: u32) -> Result<Existing> {
    let st = netlink::query(index).map_err(|source| Error::Netlink { iface: iface.into(), source })?;
    let Some(st) = st else {
        return Ok(Existing::None);
    };
    match find(st.prog_id) {
        Some(f) if f.layout == Layout::Same => Ok(Existing::Ours { prog_id: st.prog_id, mode_flags: st.mode_flags }),
        Some(f) => Ok(Existing::OtherLayout { prog_id: st.prog_id, mode_flags: st.mode_flags, layout: f.layout }),
        None => Err(Error::AlreadyAttached { iface: iface.into(), what: describe_program(st.prog_id, st.mode_flags) }),
    }
}

/// What is in a member's slot (`--join`, crate::member): nothing, a
/// policer program (adopted, or replaced if of another layout), or
/// another program: refused, the slot is taken.
pub(super) fn inspect_slot(j: &crate::member::Join) -> Result<Existing> {
    let Some(id) = j.held()? else {
        return Ok(Existing::None);
    };
    match find(id) {
        Some(f) if f.layout == Layout::Same => Ok(Existing::Ours { prog_id: id, mode_flags: 0 }),
        Some(f) => Ok(Existing::OtherLayout { prog_id: id, mode_flags: 0, layout: f.layout }),
        None => Err(Error::Invalid(format!(
            "{} is taken by {}: policer joins an empty slot (or its own, to adopt it); nothing changed",
            j.describe(),
            describe_program(id, 0)
        ))),
    }
}

/// A program on an interface, for an operator: `'xdp_dispatcher' (id 42,
/// native mode; a libxdp dispatcher)`. From what the kernel says of it;
/// a program gone meanwhile is named by its id.
pub fn describe_program(prog_id: u32, mode_flags: u32) -> String {
    let mode = match mode_flags {
        0 => String::new(),
        m => format!(", {} mode", Mode::flag_name(m)),
    };
    let info = loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == prog_id);
    let name = info.as_ref().and_then(|i| i.name_as_str().map(str::to_string)).filter(|n| !n.is_empty());
    let kind = match name.as_deref() {
        Some(n) if n.starts_with("xdp_dispatcher") => "; a libxdp dispatcher (xdp-loader, xdp-filter)",
        _ => "",
    };
    match name {
        Some(n) => format!("'{}' (id {prog_id}{mode}{kind})", crate::text::escaped(&n)),
        None => format!("program id {prog_id}{mode}"),
    }
}

/// The policer program with `prog_id`, its maps and their layout; None if
/// that program is not a policer of any build: another name, or not the
/// maps every policer build has had.
pub(super) fn find(prog_id: u32) -> Option<Found> {
    let info = loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == prog_id)?;
    if info.name_as_str() != Some(PROGRAM_NAME) {
        return None;
    }
    let mut maps = BTreeMap::new();
    let mut names = Vec::new();
    let mut stamp = None;
    let mut sizes_match = true;
    for id in info.map_ids().ok()??.into_iter() {
        let Ok(m) = MapInfo::from_id(id) else {
            continue;
        };
        let Some(n) = m.name_as_str() else {
            continue;
        };
        names.push(n.to_string());
        if n == MAP_LAYOUT {
            stamp = read_stamp(id);
        }
        if SHARED_MAPS.contains(&n) {
            // Keys or values of other sizes: another build's layout, whose
            // rules, buckets or counters would be misread.
            sizes_match &= SHARED_MAP_LAYOUT.iter().all(|&(name, key, value)| {
                name != n || (m.key_size() as usize == key && m.value_size() as usize == value)
            });
            maps.insert(n.to_string(), (id, m.max_entries()));
        }
    }
    if !MAPS_OF_EVERY_BUILD.iter().all(|n| names.iter().any(|m| m == n)) {
        return None;
    }
    let layout = Layout::of(stamp, sizes_match && maps.len() == SHARED_MAPS.len());
    let prog_fd = info.fd().ok()?;
    Some(Found { prog_id, prog_fd, maps, layout })
}

/// The version in a program's layout stamp (MAP_LAYOUT, key 0).
fn read_stamp(map_id: u32) -> Option<u32> {
    let m: Array<MapData, u32> = Array::try_from(Map::Array(MapData::from_id(map_id).ok()?)).ok()?;
    m.get(&0, 0).ok()
}

/// A bpffs mounted in a mount namespace of this thread's own, so pins of
/// adopted maps (needed to hand them to the loader) are invisible to
/// everyone else and vanish with the process. Must run before any thread
/// is started.
pub(super) struct PrivateBpffs {
    pub dir: PathBuf,
}

impl PrivateBpffs {
    pub fn mount() -> Result<PrivateBpffs> {
        let dir = PathBuf::from(control::RUN_DIR).join(format!("adopt-{}", std::process::id()));
        fs::create_dir_all(&dir)?;
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("no NUL");
        let dir_c = c(&dir);
        // SAFETY: plain syscalls with valid C strings.
        unsafe {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
            if libc::mount(
                std::ptr::null(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return Err(std::io::Error::last_os_error().into());
            }
            if libc::mount(c"bpf".as_ptr(), dir_c.as_ptr(), c"bpf".as_ptr(), 0, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error().into());
            }
        }
        Ok(PrivateBpffs { dir })
    }
}

impl Drop for PrivateBpffs {
    fn drop(&mut self) {
        if let Ok(c) = std::ffi::CString::new(self.dir.as_os_str().as_encoded_bytes()) {
            // SAFETY: valid C string.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// Attaches fresh (never over another program), trying modes in order.
pub(super) fn attach_fresh(name: &str, index: u32, fd: RawFd, mode: Mode) -> Result<u32> {
    let mut last = None;
    for &m in mode.tries() {
        match netlink::set(index, fd, XDP_FLAGS_UPDATE_IF_NOEXIST | m, None) {
            Ok(()) => return Ok(m),
            Err(e) => match e.errno {
                libc::EBUSY | libc::EEXIST => {
                    let what = match netlink::query(index) {
                        Ok(Some(st)) => describe_program(st.prog_id, st.mode_flags),
                        _ => "one policer cannot name (it went as policer looked)".into(),
                    };
                    return Err(Error::AlreadyAttached { iface: name.into(), what });
                }
                libc::EPERM | libc::EACCES => return Err(Error::NotRoot("attaching XDP")),
                libc::EOPNOTSUPP | libc::EINVAL => {
                    last = Some(Error::ModeUnsupported { iface: name.into(), mode: Mode::flag_name(m) });
                }
                _ => {
                    return Err(Error::Netlink { iface: name.into(), source: e });
                }
            },
        }
    }
    Err(last.expect("at least one mode"))
}

/// The policer programs attached in this network namespace (interface,
/// program id): with no daemon running, programs a `--persist` daemon (or
/// one that died) left policing. The interfaces are the caller's network
/// namespace's (`if_nameindex`, not sysfs, which shows the namespace of
/// whoever mounted it); those that cannot be read are skipped.
pub fn attached_programs() -> Vec<(String, u32)> {
    let mut links = Vec::new();
    // SAFETY: if_nameindex returns an array ended by a zero entry, or null;
    // it is read up to that entry and freed once.
    unsafe {
        let list = libc::if_nameindex();
        if list.is_null() {
            return Vec::new();
        }
        let mut p = list;
        while (*p).if_index != 0 && !(*p).if_name.is_null() {
            let name = std::ffi::CStr::from_ptr((*p).if_name).to_string_lossy().into_owned();
            links.push((name, (*p).if_index));
            p = p.add(1);
        }
        libc::if_freenameindex(list);
    }
    let mut out: Vec<(String, u32)> = links
        .into_iter()
        .filter_map(|(name, index)| {
            let st = netlink::query(index).ok()??;
            find(st.prog_id).map(|f| (name, f.prog_id))
        })
        .collect();
    out.sort();
    out
}

/// `policer detach IFACE` with no daemon running: remove the policer
/// program left attached (never another program).
pub fn detach_orphan(name: &str) -> Result<String> {
    if !is_root() {
        return Err(Error::NotRoot("detaching XDP"));
    }
    let index = if_index(name)?;
    let st = netlink::query(index).map_err(|source| Error::Netlink { iface: name.into(), source })?;
    let Some(st) = st else {
        return Err(Error::Invalid(format!("no XDP program is attached to {name}")));
    };
    let found = find(st.prog_id).ok_or_else(|| {
        Error::Invalid(format!(
            "the XDP program on {name}, {}, is not policer's; leaving it alone (its own tool removes it)",
            describe_program(st.prog_id, st.mode_flags)
        ))
    })?;
    let fd: OwnedFd = found.prog_fd.as_fd().try_clone_to_owned()?;
    netlink::set(index, -1, st.mode_flags, Some(fd.as_raw_fd()))
        .map_err(|source| Error::Netlink { iface: name.into(), source })?;
    let of = match found.layout {
        Layout::Same => String::new(),
        other => format!(", a program of {}", other.describe()),
    };
    Ok(format!("detached policer (program {}) from {name}{of}", found.prog_id))
}

/// What an adopted program's SYN cookies were doing: the settings of its
/// slots that answer SYNs, and those slots' SYN budgets (`flood`).
pub(super) type SynSlots = (Vec<(u32, policer_common::syn::SynConf)>, Vec<(u32, policer_common::class::Total)>);

/// The slots of the running program `prog_id` whose SYN cookies are on,
/// with their settings and SYN budgets, read from its own maps (a program
/// that adopts it shares none of them: `policer_common::LAYOUT_VERSION` 6).
/// A start writes them into the new program before attaching it, so that
/// from its first frame it answers the SYNs the old one answered, not only
/// once the start has written the rules (at 1 000 000 rules seconds later;
/// meanwhile a flood's SYNs reached the stack and took buckets). Empty when
/// the old program has no such maps of this build's sizes (another build).
pub(super) fn syn_slots(prog_id: u32) -> std::io::Result<SynSlots> {
    use policer_common::{
        class::Total,
        syn::{MAP_SYN_CONF, MAP_SYN_TOTALS, SynConf},
    };
    let Some(info) = loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == prog_id) else {
        return Ok((Vec::new(), Vec::new()));
    };
    let mut fds = BTreeMap::new();
    for id in info.map_ids().map_err(std::io::Error::other)?.unwrap_or_default() {
        let Ok(m) = MapInfo::from_id(id) else {
            continue;
        };
        let size = match m.name_as_str() {
            Some(MAP_SYN_CONF) => (MAP_SYN_CONF, size_of::<SynConf>()),
            Some(MAP_SYN_TOTALS) => (MAP_SYN_TOTALS, size_of::<Total>()),
            _ => continue,
        };
        if m.key_size() == 4 && m.value_size() as usize == size.1 {
            fds.insert(size.0, MapData::from_id(id).map_err(std::io::Error::other)?);
        }
    }
    let (Some(conf_map), Some(totals_map)) = (fds.get(MAP_SYN_CONF), fds.get(MAP_SYN_TOTALS)) else {
        return Ok((Vec::new(), Vec::new()));
    };
    fn read<V: Copy>(m: &MapData, mut keep: impl FnMut(u32, &V) -> bool) -> std::io::Result<Vec<(u32, V)>> {
        let mut out = Vec::new();
        crate::batch::for_each(m.fd().as_fd().as_raw_fd(), 4, size_of::<V>(), |k, v| {
            let slot = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]);
            // SAFETY: the kernel copied a value of V's size (checked above).
            let v = unsafe { std::ptr::read_unaligned(v.as_ptr().cast::<V>()) };
            if keep(slot, &v) {
                out.push((slot, v));
            }
        })?;
        Ok(out)
    }
    let conf: Vec<(u32, SynConf)> = read(conf_map, |_, c: &SynConf| c.mode != 0)?;
    let on: std::collections::BTreeSet<u32> = conf.iter().map(|e| e.0).collect();
    let totals = read(totals_map, |slot, _: &Total| on.contains(&slot))?;
    Ok((conf, totals))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_of_other_builds() {
        let v = LAYOUT_VERSION;
        assert_eq!(Layout::of(Some(v), true), Layout::Same);
        assert_eq!(Layout::of(Some(v - 1), true), Layout::Version(v - 1), "same sizes, older meaning");
        assert_eq!(Layout::of(Some(v + 1), false), Layout::Version(v + 1));
        assert_eq!(Layout::of(Some(v), false), Layout::Mismatch, "a layout change without a version bump");
        assert_eq!(Layout::of(None, false), Layout::Unstamped);
        // Builds from before stamps had layout UNSTAMPED_LAYOUT_VERSION.
        let unstamped = Layout::of(None, true);
        if UNSTAMPED_LAYOUT_VERSION == v {
            assert_eq!(unstamped, Layout::Same);
        } else {
            assert_eq!(unstamped, Layout::Version(UNSTAMPED_LAYOUT_VERSION));
        }
        assert_eq!(Layout::Version(v - 1).describe(), format!("an older layout (v{})", v - 1));
        assert!(Layout::Version(v + 1).describe().starts_with("a newer layout"));
    }
}
