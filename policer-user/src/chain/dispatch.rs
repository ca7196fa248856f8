//! Each interface's own chain (policer_common::chain): one program polices
//! every interface, and hands what it passes to its interface's
//! *dispatcher*, in the program's `CHAINS` array at the interface's slot.
//! A dispatcher is a program of a few instructions, loaded here for each
//! interface with that interface's array (pinned at its
//! `/sys/fs/bpf/policer/IFACE/chain`): it tail-calls the array's slots 0,
//! 1, … in order, as Katran's root does, and when all are empty counts the
//! frame as passed with the chain empty and passes it.
//!
//! Why a program of its own for each interface: a tail call names its
//! program array in the instruction, and a program array cannot be the
//! inner map of a map of maps (the kernel refuses it: docs/chain.md), so
//! one program cannot pick "this interface's array" at run time. The
//! dispatchers are made with bpf(2) from the instructions below (nothing
//! to build: they are the same few instructions with another array).

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd},
    path::Path,
};

use policer_common::{
    MAX_IFACE_SLOTS,
    chain::{CHAIN_SLOTS, ChainCounters, DISPATCHER_PROGRAM, MAP_CHAIN},
};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_OBJ_PIN: libc::c_long = 6;
/// `BPF_MAP_TYPE_PROG_ARRAY`.
pub const BPF_MAP_TYPE_PROG_ARRAY: u32 = 3;
const BPF_PROG_TYPE_XDP: u32 = 6;
/// `BPF_XDP`: the expected attach type aya and libbpf give an "xdp"
/// program; a program array takes only programs like its owner.
const BPF_XDP: u32 = 37;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_TAIL_CALL: i32 = 12;
/// The license of policer's object (policer-ebpf's `license` section).
const LICENSE: &std::ffi::CStr = c"Dual MIT/GPL";

/// bpf(2) with `attr`; its result (a descriptor, or 0).
pub fn bpf(cmd: libc::c_long, attr: &[u8]) -> io::Result<i64> {
    // SAFETY: `attr` is a valid bpf_attr prefix for `cmd`; the pointers in
    // it outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), attr.len()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(r) }
}

/// The descriptor a bpf(2) command returned, owned.
pub fn owned(r: i64) -> OwnedFd {
    // SAFETY: a fresh descriptor bpf(2) returned, ours alone.
    unsafe { OwnedFd::from_raw_fd(r as RawFd) }
}

/// A new, empty chain: a program array of [`CHAIN_SLOTS`] (u32 keys, program
/// values), named as the object's chain map.
pub fn create_array() -> io::Result<OwnedFd> {
    map_create(BPF_MAP_TYPE_PROG_ARRAY, CHAIN_SLOTS, MAP_CHAIN)
}

/// A map of `kind` (`BPF_MAP_TYPE_*`) of `max_entries` u32 keys and
/// values, named `name` (the kernel keeps 15 bytes of it).
pub fn map_create(kind: u32, max_entries: u32, name: &str) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 72];
    attr[0..4].copy_from_slice(&kind.to_ne_bytes());
    attr[4..8].copy_from_slice(&4u32.to_ne_bytes());
    attr[8..12].copy_from_slice(&4u32.to_ne_bytes());
    attr[12..16].copy_from_slice(&max_entries.to_ne_bytes());
    // `map_name` at offset 28 (at most 15 bytes and a NUL).
    let n = &name.as_bytes()[..name.len().min(15)];
    attr[28..28 + n.len()].copy_from_slice(n);
    bpf(BPF_MAP_CREATE, &attr).map(owned)
}

/// Pins a map or program at `path` (in a bpffs).
pub fn pin(fd: BorrowedFd<'_>, path: &Path) -> io::Result<()> {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let mut attr = [0u8; 16];
    attr[0..8].copy_from_slice(&(c.as_ptr() as u64).to_ne_bytes());
    attr[8..12].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    bpf(BPF_OBJ_PIN, &attr).map(|_| ())
}

/// Puts program `prog` at `key` of the program array `map` (replacing
/// what was there, in one step).
pub fn put(map: BorrowedFd<'_>, key: u32, prog: BorrowedFd<'_>) -> io::Result<()> {
    let v = prog.as_raw_fd() as u32;
    let mut attr = [0u8; 32];
    attr[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(&key as *const u32 as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(&v as *const u32 as u64).to_ne_bytes());
    bpf(BPF_MAP_UPDATE_ELEM, &attr).map(|_| ())
}

/// Loads the dispatcher of the interface at `ifindex`: the chain `array`,
/// counted in `counters` (the program's `CHAIN_COUNTERS`) at the
/// interface's slot.
pub fn load_dispatcher(array: BorrowedFd<'_>, counters: BorrowedFd<'_>, ifindex: u32) -> io::Result<OwnedFd> {
    let insns = dispatcher_insns(array.as_raw_fd(), counters.as_raw_fd(), ifindex % MAX_IFACE_SLOTS);
    load_xdp(&insns, DISPATCHER_PROGRAM)
}

/// An XDP program of `insns`, attach type xdp (as aya and libbpf load an
/// "xdp" program, so a program array takes it beside policer's), named
/// `name` (15 bytes kept).
pub fn load_xdp(insns: &[u64], name: &str) -> io::Result<OwnedFd> {
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&(insns.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(LICENSE.as_ptr() as u64).to_ne_bytes());
    // `prog_name` at offset 48, `expected_attach_type` at 68.
    let n = &name.as_bytes()[..name.len().min(15)];
    attr[48..48 + n.len()].copy_from_slice(n);
    attr[68..72].copy_from_slice(&BPF_XDP.to_ne_bytes());
    bpf(BPF_PROG_LOAD, &attr).map(owned)
}

/// One instruction: opcode, registers (dst, src), offset, immediate.
pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    let o = off.to_le_bytes();
    let i = imm.to_le_bytes();
    u64::from_le_bytes([code, (src << 4) | dst, o[0], o[1], i[0], i[1], i[2], i[3]])
}

/// `r6 = ctx`, then `bpf_tail_call(ctx, array, slot)` for slots 0 to
/// `slots - 1` in turn (a call that returns found its slot empty; the
/// kernel patches a constant slot into a direct jump): the start of a
/// Katran-style root, and of a dispatcher.
pub fn tail_call_each(array: RawFd, slots: u32) -> Vec<u64> {
    const MOV64_REG: u8 = 0xbf;
    const MOV64_IMM: u8 = 0xb7;
    const LD_IMM64: u8 = 0x18;
    const CALL: u8 = 0x85;
    const PSEUDO_MAP_FD: u8 = 1;
    let mut p = vec![insn(MOV64_REG, 6, 1, 0, 0)]; // r6 = ctx
    for slot in 0..slots {
        p.push(insn(MOV64_REG, 1, 6, 0, 0)); // r1 = ctx
        p.push(insn(LD_IMM64, 2, PSEUDO_MAP_FD, 0, array)); // r2 = &array
        p.push(0);
        p.push(insn(MOV64_IMM, 3, 0, 0, slot as i32)); // r3 = slot
        p.push(insn(CALL, 0, 0, 0, BPF_FUNC_TAIL_CALL));
    }
    p
}

/// The dispatcher: `bpf_tail_call(ctx, array, slot)` for each slot in
/// turn (a call that returns found the slot empty; the kernel patches a
/// constant slot into a direct jump); then, every slot empty, the frame
/// the policer counted as handed is counted as passed with the chain empty
/// (`handed_pkts -= 1`, `empty_pkts += 1` in this CPU's counters at
/// `key`), and passed.
fn dispatcher_insns(array: RawFd, counters: RawFd, key: u32) -> Vec<u64> {
    const MOV64_REG: u8 = 0xbf;
    const MOV64_IMM: u8 = 0xb7;
    const ADD64_IMM: u8 = 0x07;
    const LD_IMM64: u8 = 0x18;
    const LDX_DW: u8 = 0x79;
    const STX_DW: u8 = 0x7b;
    const ST_W: u8 = 0x62;
    const JEQ_IMM: u8 = 0x15;
    const CALL: u8 = 0x85;
    const EXIT: u8 = 0x95;
    const PSEUDO_MAP_FD: u8 = 1;
    const XDP_PASS: i32 = 2;
    let handed = std::mem::offset_of!(ChainCounters, handed_pkts) as i16;
    let empty = std::mem::offset_of!(ChainCounters, empty_pkts) as i16;
    let mut p = tail_call_each(array, CHAIN_SLOTS);
    p.extend([
        insn(ST_W, 10, 0, -4, key as i32), // *(u32 *)(fp - 4) = key
        insn(MOV64_REG, 2, 10, 0, 0),      // r2 = fp
        insn(ADD64_IMM, 2, 0, 0, -4),      // r2 = &key
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, counters),
        0,
        insn(CALL, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),
        insn(JEQ_IMM, 0, 0, 6, 0), // no counters: skip to the pass
        insn(LDX_DW, 1, 0, handed, 0),
        insn(ADD64_IMM, 1, 0, 0, -1),
        insn(STX_DW, 0, 1, handed, 0),
        insn(LDX_DW, 1, 0, empty, 0),
        insn(ADD64_IMM, 1, 0, 0, 1),
        insn(STX_DW, 0, 1, empty, 0),
        insn(MOV64_IMM, 0, 0, 0, XDP_PASS),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dispatcher_calls_every_slot_then_counts_and_passes() {
        let p = dispatcher_insns(7, 9, 3);
        // r6 = ctx, 5 instructions a slot (the map load is two), the count
        // (13) and the pass.
        assert_eq!(p.len(), 1 + 5 * CHAIN_SLOTS as usize + 15);
        let calls: Vec<i32> = p.iter().filter(|i| (**i & 0xff) as u8 == 0x85).map(|i| (*i >> 32) as i32).collect();
        assert_eq!(calls.len(), CHAIN_SLOTS as usize + 1);
        assert!(calls[..CHAIN_SLOTS as usize].iter().all(|c| *c == BPF_FUNC_TAIL_CALL));
        assert_eq!(calls[CHAIN_SLOTS as usize], BPF_FUNC_MAP_LOOKUP_ELEM);
        // The slots, in order, and the key stored for the lookup.
        let slots: Vec<i32> = p
            .iter()
            .filter(|i| (**i & 0xff) as u8 == 0xb7 && ((**i >> 8) & 0xf) == 3)
            .map(|i| (*i >> 32) as i32)
            .collect();
        assert_eq!(slots, (0..CHAIN_SLOTS as i32).collect::<Vec<_>>());
        assert!(p.iter().any(|i| (*i & 0xff) as u8 == 0x62 && (*i >> 32) as i32 == 3));
        // The skip over the count lands on the pass.
        let jeq = p.iter().position(|i| (*i & 0xff) as u8 == 0x15).unwrap();
        let off = ((p[jeq] >> 16) & 0xffff) as i16 as usize;
        assert_eq!(p[jeq + 1 + off] & 0xff, 0xb7);
        assert_eq!((p[jeq + 1 + off] >> 32) as i32, 2);
    }
}
