//! A Katran-style root of the tests' own (Katran's `xdp_root`, "shared
//! mode"): a program array and an XDP program that tail-calls its slots
//! 0, 1, … in order and passes the frame when all are empty. Made with raw
//! bpf(2) calls from the instructions below (no object file, nothing of
//! policer's), pinned in bpffs as a root's tool pins them, so that policer
//! can join it (`policer attach IFACE --join PATH --slot N`).

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_MAP_TYPE_PROG_ARRAY: u32 = 3;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP`: the expected attach type libbpf and aya give an "xdp"
/// program; a program array takes only programs of its owner's.
const BPF_XDP: u32 = 37;
const BPF_FUNC_TAIL_CALL: i32 = 12;

/// The slots of the root's array.
pub const ROOT_SLOTS: u32 = 8;

fn bpf(cmd: libc::c_long, attr: &[u8]) -> io::Result<i64> {
    // SAFETY: `attr` is a valid bpf_attr prefix for `cmd`; pointers in it
    // outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

fn fd_of(r: i64) -> OwnedFd {
    // SAFETY: a fresh descriptor returned by bpf(2), ours.
    unsafe { OwnedFd::from_raw_fd(r as i32) }
}

/// A map of `kind` (u32 keys and values), named `name`.
pub fn map_create(kind: u32, max_entries: u32, name: &str) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 72];
    attr[0..4].copy_from_slice(&kind.to_ne_bytes());
    attr[4..8].copy_from_slice(&4u32.to_ne_bytes());
    attr[8..12].copy_from_slice(&4u32.to_ne_bytes());
    attr[12..16].copy_from_slice(&max_entries.to_ne_bytes());
    // map_name at offset 28.
    let n = name.as_bytes();
    attr[28..28 + n.len().min(15)].copy_from_slice(&n[..n.len().min(15)]);
    bpf(BPF_MAP_CREATE, &attr).map(fd_of)
}

/// Pins `fd` (a map or a program) at `path`.
pub fn pin(fd: RawFd, path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).expect("no NUL");
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(fd as u32).to_ne_bytes());
    bpf(BPF_OBJ_PIN, &attr).map(|_| ())
}

/// Puts program `prog` at `slot` of the program array `map`.
pub fn put(map: RawFd, slot: u32, prog: RawFd) -> io::Result<()> {
    let (k, v) = (slot, prog as u32);
    let mut attr = [0u8; 32];
    attr[0..4].copy_from_slice(&(map as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(&k as *const u32 as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(&v as *const u32 as u64).to_ne_bytes());
    bpf(BPF_MAP_UPDATE_ELEM, &attr).map(|_| ())
}

/// An XDP program of `insns` (attach type xdp, as libbpf loads one).
pub fn load_xdp(insns: &[u64], name: &str) -> io::Result<OwnedFd> {
    let license = c"GPL";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let n = name.as_bytes();
    attr[48..48 + n.len().min(15)].copy_from_slice(&n[..n.len().min(15)]);
    attr[68..72].copy_from_slice(&BPF_XDP.to_ne_bytes());
    bpf(BPF_PROG_LOAD, &attr).map(fd_of)
}

/// One instruction: opcode, registers (dst, src), offset, immediate.
fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let o = off.to_le_bytes();
    let i = imm.to_le_bytes();
    u64::from_le_bytes([code, (src << 4) | dst, o[0], o[1], i[0], i[1], i[2], i[3]])
}

/// The root: for each slot in turn, `bpf_tail_call(ctx, array, slot)`
/// (a call that returns found the slot empty); then `XDP_PASS`.
fn root_insns(array: RawFd) -> Vec<u64> {
    const MOV64_REG: u8 = 0xbf;
    const MOV64_IMM: u8 = 0xb7;
    const LD_IMM64: u8 = 0x18;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const PSEUDO_MAP_FD: u8 = 1;
    let mut p = vec![insn(MOV64_REG, 6, 1, 0, 0)]; // r6 = ctx
    for slot in 0..ROOT_SLOTS {
        p.push(insn(MOV64_REG, 1, 6, 0, 0)); // r1 = ctx
        p.push(insn(LD_IMM64, 2, PSEUDO_MAP_FD, 0, array)); // r2 = &array
        p.push(0);
        p.push(insn(MOV64_IMM, 3, 0, 0, slot as i32)); // r3 = slot
        p.push(insn(CALL, 0, 0, 0, BPF_FUNC_TAIL_CALL));
    }
    p.push(insn(MOV64_IMM, 0, 0, 0, 2)); // XDP_PASS
    p.push(insn(EXIT, 0, 0, 0, 0));
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
    let fd = bpf(BPF_MAP_GET_FD_BY_ID, &attr).map(fd_of)?;
    let mut info = [0u8; 96];
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    bpf(BPF_OBJ_GET_INFO_BY_FD, &attr)?;
    let word = |at: usize| u32::from_ne_bytes([info[at], info[at + 1], info[at + 2], info[at + 3]]);
    let name = info[24..40].iter().take_while(|b| **b != 0).map(|b| *b as char).collect();
    Ok(MapBtf { map_type: word(0), name, btf_id: word(64), key_type_id: word(68), value_type_id: word(72) })
}
