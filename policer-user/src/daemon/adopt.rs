//! Finding what is on an interface, adopting a running policer program,
//! attaching fresh, and detaching a program no daemon owns.

use std::{
    collections::BTreeMap,
    fs,
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
    path::{Path, PathBuf},
};

use aya::{
    maps::MapInfo,
    programs::{ProgramFd, loaded_programs},
};
use policer_common::{PROGRAM_NAME, SHARED_MAP_LAYOUT, SHARED_MAPS};

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
    /// name -> (map id, max_entries)
    pub maps: BTreeMap<String, (u32, u32)>,
}

/// What is on an interface now.
pub(super) enum Existing {
    None,
    Ours { prog_id: u32, mode_flags: u32 },
}

pub(super) fn inspect(iface: &str, index: u32) -> Result<Existing> {
    let st = netlink::query(index).map_err(|source| Error::Netlink { iface: iface.into(), source })?;
    let Some(st) = st else {
        return Ok(Existing::None);
    };
    match find(st.prog_id) {
        Some(_) => Ok(Existing::Ours { prog_id: st.prog_id, mode_flags: st.mode_flags }),
        None => Err(Error::AlreadyAttached { iface: iface.into() }),
    }
}

/// The policer program with `prog_id` and its maps; None if that program
/// is not a policer (another name, or not our maps).
pub(super) fn find(prog_id: u32) -> Option<Found> {
    let info = loaded_programs().filter_map(|p| p.ok()).find(|p| p.id() == prog_id)?;
    if info.name_as_str() != Some(PROGRAM_NAME) {
        return None;
    }
    let mut maps = BTreeMap::new();
    for id in info.map_ids().ok()??.into_iter() {
        let Ok(m) = MapInfo::from_id(id) else {
            continue;
        };
        if let Some(n) = m.name_as_str().filter(|n| SHARED_MAPS.contains(n)) {
            // A build whose maps have another layout is not ours to adopt:
            // its rules, buckets or counters would be misread.
            if SHARED_MAP_LAYOUT.iter().any(|&(name, key, value)| {
                name == n && (m.key_size() as usize != key || m.value_size() as usize != value)
            }) {
                return None;
            }
            maps.insert(n.to_string(), (id, m.max_entries()));
        }
    }
    if maps.len() != SHARED_MAPS.len() {
        return None;
    }
    let prog_fd = info.fd().ok()?;
    Some(Found { prog_id, prog_fd, maps })
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
                    return Err(Error::AlreadyAttached { iface: name.into() });
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
    let found = find(st.prog_id)
        .ok_or_else(|| Error::Invalid(format!("the XDP program on {name} is not policer's; leaving it alone")))?;
    let fd: OwnedFd = found.prog_fd.as_fd().try_clone_to_owned()?;
    netlink::set(index, -1, st.mode_flags, Some(fd.as_raw_fd()))
        .map_err(|source| Error::Netlink { iface: name.into(), source })?;
    Ok(format!("detached policer (program {}) from {name}", found.prog_id))
}
