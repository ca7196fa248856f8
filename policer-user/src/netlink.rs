//! XDP attachment through rtnetlink.
//!
//! policer attaches the older netlink way on purpose: such a program stays
//! attached after the process that attached it exits (a bpf_link would
//! die with its last file descriptor or bpffs pin, and pins made inside
//! `ip netns exec` vanish with its mount namespace). That is what lets the
//! kernel keep policing while the daemon is down, and a restarted daemon
//! find the program (and, through it, its maps) by id. `XDP_FLAGS_REPLACE`
//! with the expected old program makes upgrades atomic.

use std::{io, mem, os::fd::RawFd};

use crate::error::NlError;

const IFLA_XDP: u16 = 43;
const IFLA_XDP_FD: u16 = 1;
const IFLA_XDP_ATTACHED: u16 = 2;
const IFLA_XDP_FLAGS: u16 = 3;
const IFLA_XDP_PROG_ID: u16 = 4;
const IFLA_XDP_EXPECTED_FD: u16 = 8;
const NLA_F_NESTED: u16 = 1 << 15;
const NETLINK_EXT_ACK: i32 = 11;
const NLMSGERR_ATTR_MSG: u16 = 1;

pub const XDP_FLAGS_UPDATE_IF_NOEXIST: u32 = 1;
pub const XDP_FLAGS_SKB_MODE: u32 = 2;
pub const XDP_FLAGS_DRV_MODE: u32 = 4;
pub const XDP_FLAGS_REPLACE: u32 = 16;

/// What is attached to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XdpState {
    pub prog_id: u32,
    /// XDP_FLAGS_DRV_MODE or XDP_FLAGS_SKB_MODE (0 if none or other).
    pub mode_flags: u32,
}

struct Sock(RawFd);

impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: we own the descriptor.
        unsafe { libc::close(self.0) };
    }
}

fn open() -> io::Result<Sock> {
    // SAFETY: plain syscalls on a fresh descriptor.
    unsafe {
        let fd = libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let one: i32 = 1;
        libc::setsockopt(fd, libc::SOL_NETLINK, NETLINK_EXT_ACK, &one as *const _ as *const libc::c_void, 4);
        Ok(Sock(fd))
    }
}

fn push_attr(buf: &mut Vec<u8>, ty: u16, data: &[u8]) {
    let len = 4 + data.len();
    buf.extend_from_slice(&(len as u16).to_ne_bytes());
    buf.extend_from_slice(&ty.to_ne_bytes());
    buf.extend_from_slice(data);
    while !buf.len().is_multiple_of(4) {
        buf.push(0);
    }
}

/// nlmsghdr + ifinfomsg for `ifindex`, then `attrs`.
fn message(ty: u16, flags: u16, ifindex: u32, attrs: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(64);
    let total = 16 + 16 + attrs.len();
    m.extend_from_slice(&(total as u32).to_ne_bytes());
    m.extend_from_slice(&ty.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // pid
    // ifinfomsg: family, pad, type, index, flags, change
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0, 0, 0]);
    m.extend_from_slice(&(ifindex as i32).to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(attrs);
    m
}

fn send_recv(s: &Sock, msg: &[u8]) -> io::Result<Vec<u8>> {
    // SAFETY: buffers and lengths describe valid memory.
    unsafe {
        let mut sa: libc::sockaddr_nl = mem::zeroed();
        sa.nl_family = libc::AF_NETLINK as u16;
        let r = libc::sendto(
            s.0,
            msg.as_ptr() as *const libc::c_void,
            msg.len(),
            0,
            &sa as *const _ as *const libc::sockaddr,
            mem::size_of_val(&sa) as u32,
        );
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; 65536];
        let n = libc::recv(s.0, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(buf)
    }
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_ne_bytes([b[i], b[i + 1]])
}

fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

/// Iterates (type, payload) over netlink attributes.
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if b.len() < 4 {
            return None;
        }
        let len = u16_at(b, 0) as usize;
        let ty = u16_at(b, 2) & !NLA_F_NESTED;
        if len < 4 || len > b.len() {
            return None;
        }
        let data = &b[4..len];
        b = &b[((len + 3) & !3).min(b.len())..];
        Some((ty, data))
    })
}

/// Checks an ACK; returns the kernel's error.
fn check_ack(resp: &[u8]) -> Result<(), NlError> {
    if resp.len() < 20 || u16_at(resp, 4) != libc::NLMSG_ERROR as u16 {
        return Err(NlError { errno: libc::EPROTO, msg: None });
    }
    let err = -(u32_at(resp, 16) as i32);
    if err == 0 {
        return Ok(());
    }
    // Extended ack: the original header (16 bytes, payload not echoed
    // when NLM_F_CAPPED) follows the error, then TLVs.
    let flags = u16_at(resp, 6);
    let mut msg = None;
    if flags & 0x200 != 0 {
        let skip = if flags & 0x100 != 0 { 20 + 16 } else { 20 + u32_at(resp, 20) as usize };
        if skip <= resp.len() {
            for (ty, data) in attrs(&resp[skip..]) {
                if ty == NLMSGERR_ATTR_MSG {
                    msg = Some(String::from_utf8_lossy(data).trim_end_matches('\0').to_string());
                }
            }
        }
    }
    Err(NlError { errno: err, msg })
}

/// The XDP program attached to `ifindex`, if any.
pub fn query(ifindex: u32) -> Result<Option<XdpState>, NlError> {
    let s = open().map_err(io_err)?;
    let m = message(libc::RTM_GETLINK, (libc::NLM_F_REQUEST) as u16, ifindex, &[]);
    let resp = send_recv(&s, &m).map_err(io_err)?;
    if resp.len() >= 16 && u16_at(&resp, 4) == libc::NLMSG_ERROR as u16 {
        check_ack(&resp)?;
    }
    if resp.len() < 32 || u16_at(&resp, 4) != libc::RTM_NEWLINK {
        return Err(NlError { errno: libc::EPROTO, msg: Some("unexpected reply to RTM_GETLINK".into()) });
    }
    let total = (u32_at(&resp, 0) as usize).min(resp.len());
    let mut attached = 0u8;
    let mut prog_id = 0u32;
    for (ty, data) in attrs(&resp[32..total]) {
        if ty == IFLA_XDP {
            for (t, d) in attrs(data) {
                match t {
                    IFLA_XDP_ATTACHED if !d.is_empty() => attached = d[0],
                    IFLA_XDP_PROG_ID if d.len() >= 4 => prog_id = u32_at(d, 0),
                    _ => {}
                }
            }
        }
    }
    if attached == 0 || prog_id == 0 {
        return Ok(None);
    }
    let mode_flags = match attached {
        1 => XDP_FLAGS_DRV_MODE,
        2 => XDP_FLAGS_SKB_MODE,
        _ => 0,
    };
    Ok(Some(XdpState { prog_id, mode_flags }))
}

fn io_err(e: io::Error) -> NlError {
    NlError { errno: e.raw_os_error().unwrap_or(libc::EIO), msg: None }
}

/// Attaches `fd` (or detaches with -1) with `flags`; with
/// `XDP_FLAGS_REPLACE`, only if `expected` is what is attached now.
pub fn set(ifindex: u32, fd: RawFd, flags: u32, expected: Option<RawFd>) -> Result<(), NlError> {
    let s = open().map_err(io_err)?;
    let mut nested = Vec::new();
    push_attr(&mut nested, IFLA_XDP_FD, &fd.to_ne_bytes());
    let mut flags = flags;
    if let Some(e) = expected {
        flags |= XDP_FLAGS_REPLACE;
        push_attr(&mut nested, IFLA_XDP_EXPECTED_FD, &e.to_ne_bytes());
    }
    push_attr(&mut nested, IFLA_XDP_FLAGS, &flags.to_ne_bytes());
    let mut a = Vec::new();
    push_attr(&mut a, IFLA_XDP | NLA_F_NESTED, &nested);
    let m = message(libc::RTM_SETLINK, (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16, ifindex, &a);
    let resp = send_recv(&s, &m).map_err(io_err)?;
    check_ack(&resp)
}

/// The token that stands for the interface of the default route, in the
/// config (`interfaces = ["@default-route"]`) and on the command line.
pub const DEFAULT_ROUTE: &str = "@default-route";

const RTA_OIF: u16 = 4;
const RTA_PRIORITY: u16 = 6;
const RTA_MULTIPATH: u16 = 9;
const RTA_TABLE: u16 = 15;
const RT_TABLE_MAIN: u32 = 254;
const RTN_UNICAST: u8 = 1;

/// The interface of the main table's default route: IPv4 first, else IPv6
/// (the lowest metric wins; a multipath route gives its first hop).
/// `None`: there is no default route.
pub fn default_route_ifindex() -> Result<Option<u32>, NlError> {
    for family in [libc::AF_INET, libc::AF_INET6] {
        if let Some(i) = default_route(family as u8)? {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

fn default_route(family: u8) -> Result<Option<u32>, NlError> {
    let s = open().map_err(io_err)?;
    // nlmsghdr + rtmsg (family, dst_len, src_len, tos, table, protocol,
    // scope, type, flags).
    let mut m = Vec::with_capacity(28);
    m.extend_from_slice(&28u32.to_ne_bytes());
    m.extend_from_slice(&libc::RTM_GETROUTE.to_ne_bytes());
    m.extend_from_slice(&((libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family, 0, 0, 0, 0, 0, 0, 0]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    let mut resp = send_recv(&s, &m).map_err(io_err)?;
    // (metric, ifindex) of the best default route so far.
    let mut best: Option<(u32, u32)> = None;
    loop {
        let mut b = &resp[..];
        while b.len() >= 16 {
            let len = u32_at(b, 0) as usize;
            let ty = u16_at(b, 4);
            if len < 16 || len > b.len() {
                return Err(NlError { errno: libc::EPROTO, msg: None });
            }
            if ty == libc::NLMSG_DONE as u16 {
                return Ok(best.map(|b| b.1));
            }
            if ty == libc::NLMSG_ERROR as u16 {
                check_ack(b)?;
            }
            if ty == libc::RTM_NEWROUTE && len >= 28 {
                let r = &b[16..len];
                let (dst_len, mut table, rtype) = (r[1], r[4] as u32, r[7]);
                let (mut oif, mut metric) = (None, 0u32);
                for (t, d) in attrs(&r[12..]) {
                    match t {
                        RTA_OIF if d.len() >= 4 => oif = Some(u32_at(d, 0)),
                        RTA_PRIORITY if d.len() >= 4 => metric = u32_at(d, 0),
                        RTA_TABLE if d.len() >= 4 => table = u32_at(d, 0),
                        // rtnexthop: len u16, flags u8, hops u8, ifindex i32.
                        RTA_MULTIPATH if d.len() >= 8 && oif.is_none() => oif = Some(u32_at(d, 4)),
                        _ => {}
                    }
                }
                if dst_len == 0
                    && rtype == RTN_UNICAST
                    && table == RT_TABLE_MAIN
                    && let Some(i) = oif.filter(|&i| i != 0)
                    && best.is_none_or(|(m, _)| metric < m)
                {
                    best = Some((metric, i));
                }
            }
            b = &b[((len + 3) & !3).min(b.len())..];
        }
        resp = recv(&s).map_err(io_err)?;
    }
}

fn recv(s: &Sock) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    // SAFETY: the buffer and its length describe valid memory.
    let n = unsafe { libc::recv(s.0, buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    buf.truncate(n as usize);
    Ok(buf)
}

/// `names` with [`DEFAULT_ROUTE`] replaced by the default route's
/// interface; a clear error when there is none.
pub fn resolve_interfaces(names: &[String]) -> crate::error::Result<Vec<String>> {
    names
        .iter()
        .map(|n| {
            if n != DEFAULT_ROUTE {
                return Ok(n.clone());
            }
            let idx = default_route_ifindex()
                .map_err(|e| crate::Error::Invalid(format!("{DEFAULT_ROUTE}: cannot read the routes: {e}")))?
                .ok_or_else(|| {
                    crate::Error::Invalid(format!(
                        "{DEFAULT_ROUTE}: no default route (IPv4 or IPv6) in this network namespace; \
                         name the interface instead"
                    ))
                })?;
            let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
            // SAFETY: buf holds IF_NAMESIZE bytes, as if_indextoname needs.
            let p = unsafe { libc::if_indextoname(idx, buf.as_mut_ptr()) };
            if p.is_null() {
                return Err(crate::Error::Invalid(format!(
                    "{DEFAULT_ROUTE}: the default route's interface (index {idx}) is gone: {}",
                    io::Error::last_os_error()
                )));
            }
            // SAFETY: if_indextoname wrote a NUL-terminated name into buf.
            Ok(unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
        })
        .collect()
}
