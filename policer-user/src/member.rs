//! Member mode (docs/chain.md, "Policer behind another root"): `policer
//! attach IFACE --join PATH --slot N`. Another root owns the interface's
//! hook (a Katran-style `xdp_root`: a small program that tail-calls into a
//! pinned program array); policer puts its program in slot N of that
//! array, not onto the hook, and hands what it passes to the slots behind
//! its own (N + 1 …, `GLOBAL_CHAIN_FROM`). Its maps, rules and counters
//! are as on the hook; detach empties only its slot.

use std::{
    os::fd::{AsFd, AsRawFd, RawFd},
    path::{Path, PathBuf},
};

use aya::maps::MapData;

use crate::error::{Error, Result};

/// `BPF_MAP_TYPE_PROG_ARRAY` (linux/bpf.h).
const PROG_ARRAY: u32 = 3;

/// A slot of another root's program array that policer runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Join {
    /// Where the root's array is pinned (in a bpffs).
    pub path: PathBuf,
    pub slot: u32,
}

impl Join {
    /// Checks `--join PATH --slot N` before anything changes: PATH is in a
    /// bpffs, holds a pinned map, a program array, with a slot N.
    pub fn open(path: &Path, slot: u32) -> Result<Join> {
        let shown = path.display();
        if !path.is_absolute() {
            return Err(Error::Invalid(format!("--join {shown}: give the array's absolute bpffs path")));
        }
        if !path.exists() {
            return Err(Error::Invalid(format!(
                "--join {shown}: nothing is pinned there (the root's tool pins its program array, e.g. \
                 /sys/fs/bpf/ROOT/progs)"
            )));
        }
        if !crate::chain::is_bpffs(path) {
            return Err(Error::Invalid(format!(
                "--join {shown}: not in a bpffs: a root's program array is pinned in one (/sys/fs/bpf)"
            )));
        }
        let (kind, entries) = describe(path)?;
        if kind != Some(PROG_ARRAY) {
            let what = match kind {
                Some(t) => format!("a map of type {t}"),
                None => "not a map (a pinned program or link?)".to_string(),
            };
            return Err(Error::Invalid(format!(
                "--join {shown}: {what}, not a program array (BPF_MAP_TYPE_PROG_ARRAY): policer joins a root that \
                 tail-calls into one"
            )));
        }
        if slot >= entries {
            return Err(Error::Invalid(format!("--slot {slot}: {shown} has slots 0 to {}", entries.saturating_sub(1))));
        }
        Ok(Join { path: path.to_path_buf(), slot })
    }

    /// The array, opened anew (it is pinned; nothing is held between uses).
    fn map(&self) -> Result<MapData> {
        MapData::from_pin(&self.path)
            .map_err(|e| Error::Invalid(format!("--join {}: cannot open the array: {e}", self.path.display())))
    }

    /// The id of the program in the slot.
    pub fn held(&self) -> Result<Option<u32>> {
        let m = self.map()?;
        crate::batch::lookup(m.fd().as_fd().as_raw_fd(), &self.slot).map_err(Error::kernel(format!(
            "reading slot {} of {}",
            self.slot,
            self.path.display()
        )))
    }

    /// Puts the program `prog` in the slot (replacing what is there, in
    /// one step: a frame runs the old program or the new one).
    pub fn put(&self, prog: RawFd) -> Result<()> {
        let m = self.map()?;
        let fd = prog as u32;
        crate::batch::update_elem(m.fd().as_fd().as_raw_fd(), &self.slot, &fd).map_err(|e| {
            let why = if e.raw_os_error() == Some(libc::EINVAL) {
                " (the kernel takes only programs like the array's owner: XDP, attach type xdp, without frags)"
            } else {
                ""
            };
            Error::Invalid(format!("cannot put policer in slot {} of {}: {e}{why}", self.slot, self.path.display()))
        })
    }

    /// Empties the slot if it holds program `id` (never another's).
    /// True when it emptied it.
    pub fn clear_if(&self, id: u32) -> Result<bool> {
        if self.held()? != Some(id) {
            return Ok(false);
        }
        let m = self.map()?;
        match crate::batch::delete_elem(m.fd().as_fd().as_raw_fd(), &self.slot) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(Error::kernel(format!("emptying slot {} of {}", self.slot, self.path.display()))(e)),
        }
    }

    /// "slot 3 of /sys/fs/bpf/root/progs", for messages.
    pub fn describe(&self) -> String {
        format!("slot {} of {}", self.slot, self.path.display())
    }
}

/// The type and size of the map pinned at `path` (type `None`: not a
/// map), from its descriptor's fdinfo (a pinned program would read as a
/// map through BPF_OBJ_GET_INFO_BY_FD's buffer).
fn describe(path: &Path) -> Result<(Option<u32>, u32)> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| Error::Invalid(format!("--join {}: not a path", path.display())))?;
    // BPF_OBJ_GET: pathname (u64) at 0, bpf_fd at 8, file_flags at 12.
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    const BPF_OBJ_GET: libc::c_long = 7;
    // SAFETY: a valid bpf_attr prefix; the path outlives the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_OBJ_GET, attr.as_ptr(), attr.len()) };
    if fd < 0 {
        return Err(Error::Invalid(format!(
            "--join {}: cannot open what is pinned there: {}",
            path.display(),
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: a fresh descriptor of ours.
    let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) };
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd()))?;
    Ok(parse_fdinfo(&info))
}

/// `map_type` and `max_entries` of a descriptor's fdinfo text.
fn parse_fdinfo(text: &str) -> (Option<u32>, u32) {
    let field = |k: &str| {
        text.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.trim_start_matches(':').trim().parse::<u32>().ok())
    };
    (field("map_type"), field("max_entries").unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fdinfo_of_a_map_and_of_a_program() {
        let map = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t2057\nmap_type:\t3\nkey_size:\t4\n\
                   value_size:\t4\nmax_entries:\t8\nmap_flags:\t0x0\n";
        assert_eq!(parse_fdinfo(map), (Some(3), 8));
        let prog = "pos:\t0\nflags:\t02000002\nprog_type:\t6\nprog_jited:\t1\nprog_tag:\t3b185187f1855c4c\n";
        assert_eq!(parse_fdinfo(prog), (None, 0));
    }

    #[test]
    fn paths_outside_a_bpffs_are_refused() {
        let e = Join::open(Path::new("relative/path"), 0).unwrap_err().to_string();
        assert!(e.contains("absolute"), "{e}");
        let e = Join::open(Path::new("/etc/hostname"), 0).unwrap_err().to_string();
        assert!(e.contains("not in a bpffs"), "{e}");
        let e = Join::open(Path::new("/nonexistent/x"), 0).unwrap_err().to_string();
        assert!(e.contains("nothing is pinned"), "{e}");
    }
}
