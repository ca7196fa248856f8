//! A Katran-style root of the tests' own (Katran's `xdp_root`, "shared
//! mode"): a program array and an XDP program that tail-calls its slots
//! 0, 1, … in order and passes the frame when all are empty. Made with raw
//! bpf(2) calls from the instructions below (no object file, nothing of
//! policer's), pinned in bpffs as a root's tool pins them, so that policer
//! can join it (`policer attach IFACE --join PATH --slot N`).

use std::{
    io,
    os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd},
    path::Path,
};

use policer_user::chain::dispatch::{self, BPF_MAP_TYPE_PROG_ARRAY, insn};

const BPF_MAP_TYPE_ARRAY: u32 = 2;

/// The slots of the root's array.
pub const ROOT_SLOTS: u32 = 8;

/// A map of `kind` (u32 keys and values), named `name`.
pub fn map_create(kind: u32, max_entries: u32, name: &str) -> io::Result<OwnedFd> {
    dispatch::map_create(kind, max_entries, name)
}

/// Pins `fd` (a map or a program) at `path`.
pub fn pin(fd: RawFd, path: &Path) -> io::Result<()> {
    // SAFETY: the caller's open descriptor, for the call.
    dispatch::pin(unsafe { BorrowedFd::borrow_raw(fd) }, path)
}

/// Puts program `prog` at `slot` of the program array `map`.
pub fn put(map: RawFd, slot: u32, prog: RawFd) -> io::Result<()> {
    // SAFETY: the caller's open descriptors, for the call.
    unsafe { dispatch::put(BorrowedFd::borrow_raw(map), slot, BorrowedFd::borrow_raw(prog)) }
}

/// An XDP program of `insns` (attach type xdp, as libbpf loads one).
pub fn load_xdp(insns: &[u64], name: &str) -> io::Result<OwnedFd> {
    dispatch::load_xdp(insns, name)
}

/// The root: for each slot in turn, `bpf_tail_call(ctx, array, slot)`
/// (a call that returns found the slot empty); then `XDP_PASS`.
fn root_insns(array: RawFd) -> Vec<u64> {
    let mut p = dispatch::tail_call_each(array, ROOT_SLOTS);
    p.push(insn(0xb7, 0, 0, 0, 2)); // r0 = XDP_PASS
    p.push(insn(0x95, 0, 0, 0, 0)); // exit
    p
}

/// `return XDP_PASS`, attach type xdp: a program that can sit in a slot.
pub fn load_pass(name: &str) -> io::Result<OwnedFd> {
    load_xdp(&[insn(0xb7, 0, 0, 0, 2), insn(0x95, 0, 0, 0, 0)], name)
}

/// A root: its array pinned at `dir/progs`, its program at `dir/root`.
pub struct Root {
    pub array: OwnedFd,
    pub prog: OwnedFd,
}

impl Root {
    /// Makes `dir` (in a bpffs), the array and the root program, pinned.
    pub fn create(dir: &Path) -> io::Result<Root> {
        std::fs::create_dir_all(dir)?;
        let array = map_create(BPF_MAP_TYPE_PROG_ARRAY, ROOT_SLOTS, "root_progs")?;
        let prog = load_xdp(&root_insns(array.as_raw_fd()), "xdp_root")?;
        pin(array.as_raw_fd(), &dir.join("progs"))?;
        pin(prog.as_raw_fd(), &dir.join("root"))?;
        Ok(Root { array, prog })
    }
}

/// A plain array map (not a program array), pinned at `path`: what
/// `--join` must refuse.
pub fn pin_plain_array(path: &Path) -> io::Result<()> {
    let m = map_create(BPF_MAP_TYPE_ARRAY, 8, "not_progs")?;
    pin(m.as_raw_fd(), path)
}

/// What the kernel says of map `id`: its type, name, and BTF (object id,
/// key and value type ids; 0 where it has none). `bpf_map_info` read by
/// BPF_OBJ_GET_INFO_BY_FD (bpftool's `map show` prints the BTF object,
/// not the key and value types).
pub struct MapBtf {
    pub map_type: u32,
    pub name: String,
    pub btf_id: u32,
    pub key_type_id: u32,
    pub value_type_id: u32,
}

pub fn map_btf(id: u32) -> io::Result<MapBtf> {
    const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&id.to_ne_bytes());
    let fd = dispatch::bpf(BPF_MAP_GET_FD_BY_ID, &attr).map(dispatch::owned)?;
    let mut info = [0u8; 96];
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    dispatch::bpf(BPF_OBJ_GET_INFO_BY_FD, &attr)?;
    let word = |at: usize| u32::from_ne_bytes([info[at], info[at + 1], info[at + 2], info[at + 3]]);
    let name = info[24..40].iter().take_while(|b| **b != 0).map(|b| *b as char).collect();
    Ok(MapBtf { map_type: word(0), name, btf_id: word(64), key_type_id: word(68), value_type_id: word(72) })
}
