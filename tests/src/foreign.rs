//! A foreign XDP program (not policer's): two instructions, `return
//! XDP_PASS`, loaded with a raw bpf(2) call. Tests use it to check that
//! policer never replaces or removes someone else's program.

use std::{
    io,
    os::fd::{FromRawFd, OwnedFd},
};

const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_PROG_TYPE_XDP: u32 = 6;

/// The program's name, as the kernel keeps it.
pub const NAME: &str = "foreign";

pub fn load_xdp_pass() -> io::Result<OwnedFd> {
    // mov64 r0, 2 (XDP_PASS); exit
    let insns: [u64; 2] =
        [u64::from_le_bytes([0xb7, 0, 0, 0, 2, 0, 0, 0]), u64::from_le_bytes([0x95, 0, 0, 0, 0, 0, 0, 0])];
    let license = c"GPL";
    let mut attr = [0u8; 128];
    attr[0..4].copy_from_slice(&BPF_PROG_TYPE_XDP.to_ne_bytes());
    attr[4..8].copy_from_slice(&2u32.to_ne_bytes());
    attr[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    attr[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    // prog_name at offset 48
    attr[48..55].copy_from_slice(b"foreign");
    // SAFETY: attr is a valid bpf_attr prefix; the pointers outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_PROG_LOAD, attr.as_ptr(), attr.len()) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
