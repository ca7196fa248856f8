//! AF_PACKET raw sockets: send whole frames, receive what the stack sees
//! after XDP (taps run after the XDP verdict, so dropped frames are never
//! seen here).

use std::{
    ffi::CString,
    io, mem,
    os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd},
    time::Duration,
};

pub struct RawSocket {
    fd: OwnedFd,
}

impl AsRawFd for RawSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl RawSocket {
    /// A raw socket bound to `iface` in the calling thread's namespace.
    pub fn bind(iface: &str) -> io::Result<RawSocket> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: plain syscall.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, proto as i32) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh, owned descriptor.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = CString::new(iface).map_err(|_| io::Error::other("bad name"))?;
        // SAFETY: valid C string.
        let idx = unsafe { libc::if_nametoindex(name.as_ptr()) };
        if idx == 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: sockaddr_ll is plain data.
        let mut sa: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sa.sll_family = libc::AF_PACKET as u16;
        sa.sll_protocol = proto;
        sa.sll_ifindex = idx as i32;
        // SAFETY: pointer and length describe `sa`.
        let r = unsafe {
            libc::bind(fd.as_raw_fd(), &sa as *const _ as *const libc::sockaddr, mem::size_of_val(&sa) as u32)
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        let s = RawSocket { fd };
        // Outgoing frames of this interface are not what we count.
        s.setsockopt(libc::SOL_PACKET, libc::PACKET_IGNORE_OUTGOING, 1)?;
        Ok(s)
    }

    fn setsockopt(&self, level: i32, opt: i32, v: i32) -> io::Result<()> {
        // SAFETY: pointer and length describe `v`.
        let r = unsafe { libc::setsockopt(self.fd.as_raw_fd(), level, opt, &v as *const _ as *const libc::c_void, 4) };
        if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    /// Large buffers, so a receiver never loses frames to a full queue.
    pub fn big_buffers(&self) -> io::Result<()> {
        self.setsockopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 256 << 20)?;
        self.setsockopt(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, 16 << 20)
    }

    pub fn set_timeout(&self, t: Duration) -> io::Result<()> {
        let tv = libc::timeval { tv_sec: t.as_secs() as i64, tv_usec: t.subsec_micros() as i64 };
        // SAFETY: pointer and length describe `tv`.
        let r = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                &tv as *const _ as *const libc::c_void,
                mem::size_of_val(&tv) as u32,
            )
        };
        if r != 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
    }

    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        loop {
            // SAFETY: buffer and length describe `frame`.
            let r = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            // A full transmit queue: wait for it rather than lose the frame.
            if e.raw_os_error() == Some(libc::ENOBUFS) || e.raw_os_error() == Some(libc::EAGAIN) {
                std::thread::yield_now();
                continue;
            }
            return Err(e);
        }
    }

    /// One frame, or `None` on timeout.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        // SAFETY: buffer and length describe `buf`.
        let r = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if r >= 0 {
            return Ok(Some(r as usize));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
            _ => Err(e),
        }
    }

    /// Frames the kernel dropped for this socket (queue full) since the
    /// last call.
    pub fn drops(&self) -> io::Result<u32> {
        self.counts().map(|(_, drops)| drops)
    }

    /// (frames that reached this socket, those of them it dropped) since
    /// the last call of this or [`RawSocket::drops`] (reading resets both).
    /// A frame its filter rejects is in neither; one dropped for a full
    /// queue is in both, so a socket never read still counts every frame
    /// its filter accepts: a counter of what arrived past XDP.
    pub fn counts(&self) -> io::Result<(u32, u32)> {
        let mut st = libc::tpacket_stats { tp_packets: 0, tp_drops: 0 };
        let mut len = mem::size_of_val(&st) as u32;
        // SAFETY: pointer and length describe `st`.
        let r = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_STATISTICS,
                &mut st as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
        // The kernel reports tp_packets with tp_drops already added.
        if r != 0 { Err(io::Error::last_os_error()) } else { Ok((st.tp_packets, st.tp_drops)) }
    }
}
