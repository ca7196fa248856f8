//! Reading a capture frame by frame (pcap or pcapng, told apart by their
//! first bytes), each frame as the Ethernet frame the XDP program sees.
//!
//! Streams: one frame is in memory at a time (the reader's buffer and the
//! caller's), whatever the size of the file.

use std::{
    fs::File,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
};

use pcap_file::{
    DataLink,
    pcap::PcapReader,
    pcapng::{Block, PcapNgReader},
};

use crate::error::{Error, Result};

/// The largest frame BPF_PROG_TEST_RUN takes for an XDP program without
/// fragments: a page less XDP_PACKET_HEADROOM (256) and the tail room of
/// `struct skb_shared_info` (320 on x86-64): `bpf_prog_test_run_xdp`.
/// Longer frames are clipped to it (their headers are all the program
/// reads, their IP length made the clipped one: byte-mode rules then see
/// the clipped length; counted apart).
pub const MAX_FRAME: usize = 4096 - 256 - 320;

/// The link layers replayed: Ethernet as it is, Linux cooked captures
/// (`tcpdump -i any`) with their header rewritten as an Ethernet one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Link {
    Ethernet,
    /// LINKTYPE_LINUX_SLL: a 16-byte header, the EtherType at 14.
    Sll,
    /// LINKTYPE_LINUX_SLL2: a 20-byte header, the EtherType at 0.
    Sll2,
}

impl Link {
    fn of(d: DataLink) -> Option<Link> {
        match d {
            DataLink::ETHERNET => Some(Link::Ethernet),
            DataLink::LINUX_SLL => Some(Link::Sll),
            DataLink::LINUX_SLL2 => Some(Link::Sll2),
            _ => None,
        }
    }
}

/// A frame's place in time and its length on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// The capture's timestamp, ns since the Unix epoch.
    pub ts_ns: u64,
    /// The frame's length as the program is given it (the original
    /// length, clipped to [`MAX_FRAME`]).
    pub len: u32,
    /// Whether the frame was longer than [`MAX_FRAME`].
    pub clipped: bool,
}

enum Reader {
    Pcap { r: PcapReader<BufReader<Counted>>, link: Link },
    PcapNg(PcapNgReader<BufReader<Counted>>),
}

/// The file, counting the bytes read from it (the progress bar's position).
struct Counted {
    file: File,
    read: std::rc::Rc<std::cell::Cell<u64>>,
}

impl std::io::Read for Counted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.read.set(self.read.get() + n as u64);
        Ok(n)
    }
}

/// An open capture.
pub struct Capture {
    path: PathBuf,
    reader: Reader,
    /// Frames read so far (for errors: "frame N").
    frames: u64,
    /// Bytes read from the file so far (ahead of the frames by at most the
    /// reader's buffer).
    read: std::rc::Rc<std::cell::Cell<u64>>,
}

/// The first four bytes of a pcapng file (a Section Header Block's type).
const PCAPNG_MAGIC: [u8; 4] = [0x0a, 0x0d, 0x0d, 0x0a];

fn unsupported(path: &Path, d: DataLink, where_: &str) -> Error {
    Error::Invalid(format!(
        "{}: {where_}link type {d:?} ({}): only Ethernet and Linux cooked captures (SLL, SLL2) can be replayed",
        path.display(),
        u32::from(d)
    ))
}

impl Capture {
    /// Opens `path`, reading its header; a file that is neither pcap nor
    /// pcapng, or of another link type, is refused here.
    pub fn open(path: &Path) -> Result<Capture> {
        let bad = |what: String| Error::Invalid(format!("{}: {what}", path.display()));
        let file = File::open(path).map_err(|source| Error::ConfigRead { path: path.to_path_buf(), source })?;
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut buf = BufReader::with_capacity(256 * 1024, Counted { file, read: read.clone() });
        let head = buf.fill_buf().map_err(|source| Error::ConfigRead { path: path.to_path_buf(), source })?;
        let reader = if head.starts_with(&PCAPNG_MAGIC) {
            Reader::PcapNg(PcapNgReader::new(buf).map_err(|e| bad(format!("not a valid pcapng file: {e}")))?)
        } else {
            let r = PcapReader::new(buf).map_err(|e| bad(format!("neither pcap nor pcapng: {e}")))?;
            let d = r.header().datalink;
            let link = Link::of(d).ok_or_else(|| unsupported(path, d, ""))?;
            Reader::Pcap { r, link }
        };
        Ok(Capture { path: path.to_path_buf(), reader, frames: 0, read })
    }

    /// Bytes of the file read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.get()
    }

    /// The next frame, written into `out` as an Ethernet frame; `None` at
    /// the end of the capture.
    pub fn next(&mut self, out: &mut Vec<u8>) -> Result<Option<Frame>> {
        let path = self.path.clone();
        let n = self.frames + 1;
        let bad = |what: String| Error::Invalid(format!("{}: frame {n}: {what}", path.display()));
        let got = match &mut self.reader {
            Reader::Pcap { r, link } => match r.next_packet() {
                None => None,
                Some(Err(e)) => return Err(bad(format!("{e}"))),
                Some(Ok(p)) => {
                    let ts = p.timestamp();
                    Some((ts, p.orig_len(), ethernet(*link, p.data(), out).map_err(bad)?))
                }
            },
            Reader::PcapNg(r) => loop {
                match r.next_block() {
                    None => break None,
                    Some(Err(e)) => return Err(bad(format!("{e}"))),
                    Some(Ok((Block::EnhancedPacket(p), state))) => {
                        let d = state
                            .interfaces()
                            .get(p.interface_id as usize)
                            .map(|i| i.linktype)
                            .ok_or_else(|| bad(format!("interface {} is not described", p.interface_id)))?;
                        let link = Link::of(d).ok_or_else(|| unsupported(&path, d, &format!("frame {n}: ")))?;
                        break Some((p.timestamp, p.original_len, ethernet(link, &p.data, out).map_err(bad)?));
                    }
                    Some(Ok((Block::SimplePacket(_), _))) => {
                        return Err(bad("a Simple Packet Block has no timestamp: it cannot be replayed".into()));
                    }
                    Some(Ok((Block::Packet(_), _))) => {
                        return Err(bad("obsolete Packet Block: rewrite the capture (editcap -F pcapng)".into()));
                    }
                    // Section headers, interfaces (kept by the reader),
                    // statistics, names, custom blocks: no frame.
                    Some(Ok(_)) => {}
                }
            },
        };
        let Some((ts, orig_len, header_delta)) = got else { return Ok(None) };
        self.frames = n;
        let ts_ns = u64::try_from(ts.as_nanos()).map_err(|_| bad("timestamp past the year 2554".into()))?;
        // The length on the wire: a snap length cuts what was captured,
        // not what the policer saw (a byte-mode rule counts all of it).
        let wire = (orig_len as i64 + header_delta).max(out.len() as i64) as usize;
        let clipped = wire > MAX_FRAME;
        out.resize(wire.min(MAX_FRAME), 0);
        if clipped {
            fit_ip_length(out);
        }
        Ok(Some(Frame { ts_ns, len: out.len() as u32, clipped }))
    }
}

/// A clipped frame's IP length made what is left of it, so that the
/// program parses the clipped frame as the frame it was (an IPv4 total
/// length, or an IPv6 payload length, past the frame's end is malformed
/// to it) and a byte-mode rule charges the clipped length. The IPv4
/// header checksum is not mended: the program does not read it.
fn fit_ip_length(f: &mut [u8]) {
    let mut off = 12;
    for _ in 0..2 {
        match f.get(off..off + 2) {
            Some([0x81, 0x00] | [0x88, 0xa8]) => off += 4,
            _ => break,
        }
    }
    let ip = off + 2;
    let Some(rest) = f.len().checked_sub(ip) else { return };
    match f.get(off..off + 2) {
        Some([0x08, 0x00]) if rest >= 20 => {
            let n = u16::try_from(rest).unwrap_or(u16::MAX);
            if usize::from(u16::from_be_bytes([f[ip + 2], f[ip + 3]])) > rest {
                f[ip + 2..ip + 4].copy_from_slice(&n.to_be_bytes());
            }
        }
        Some([0x86, 0xdd]) if rest >= 40 => {
            let n = u16::try_from(rest - 40).unwrap_or(u16::MAX);
            if usize::from(u16::from_be_bytes([f[ip + 4], f[ip + 5]])) > rest - 40 {
                f[ip + 4..ip + 6].copy_from_slice(&n.to_be_bytes());
            }
        }
        _ => {}
    }
}

/// Writes `data` of link layer `link` into `out` as an Ethernet frame;
/// returns by how much the header's length changed (SLL → Ethernet).
fn ethernet(link: Link, data: &[u8], out: &mut Vec<u8>) -> std::result::Result<i64, String> {
    out.clear();
    let (ethertype, payload, header) = match link {
        Link::Ethernet => {
            out.extend_from_slice(data);
            return Ok(0);
        }
        Link::Sll if data.len() >= 16 => ([data[14], data[15]], &data[16..], 16),
        Link::Sll2 if data.len() >= 20 => ([data[0], data[1]], &data[20..], 20),
        Link::Sll | Link::Sll2 => return Err(format!("{} bytes: shorter than a Linux cooked header", data.len())),
    };
    // Addresses the program does not read: zero.
    out.extend_from_slice(&[0; 12]);
    out.extend_from_slice(&ethertype);
    out.extend_from_slice(payload);
    Ok(14 - header)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clipped_frame_has_the_ip_length_of_what_is_left() {
        // IPv4 of 9 000 bytes on the wire, clipped.
        let mut v4 = vec![0u8; MAX_FRAME];
        v4[12..14].copy_from_slice(&[0x08, 0x00]);
        v4[14] = 0x45;
        v4[16..18].copy_from_slice(&(9_000u16 - 14).to_be_bytes());
        fit_ip_length(&mut v4);
        assert_eq!(u16::from_be_bytes([v4[16], v4[17]]) as usize, MAX_FRAME - 14);
        // IPv6 behind two VLAN tags.
        let mut v6 = vec![0u8; MAX_FRAME];
        v6[12..14].copy_from_slice(&[0x88, 0xa8]);
        v6[16..18].copy_from_slice(&[0x81, 0x00]);
        v6[20..22].copy_from_slice(&[0x86, 0xdd]);
        v6[22] = 0x60;
        v6[26..28].copy_from_slice(&8_000u16.to_be_bytes());
        fit_ip_length(&mut v6);
        assert_eq!(u16::from_be_bytes([v6[26], v6[27]]) as usize, MAX_FRAME - 22 - 40);
        // A length already inside the frame (Ethernet padding) is kept;
        // not IP, or too short for a header: untouched.
        let mut short = v4.clone();
        short[16..18].copy_from_slice(&100u16.to_be_bytes());
        let before = short.clone();
        fit_ip_length(&mut short);
        assert_eq!(short, before);
        let mut arp = vec![0u8; 30];
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let before = arp.clone();
        fit_ip_length(&mut arp);
        assert_eq!(arp, before);
        let mut cut = vec![0u8; 20];
        cut[12..14].copy_from_slice(&[0x08, 0x00]);
        fit_ip_length(&mut cut);
    }

    #[test]
    fn cooked_headers_become_ethernet() {
        let mut out = Vec::new();
        let mut sll = vec![0u8; 16];
        sll[14..16].copy_from_slice(&[0x86, 0xdd]);
        sll.extend_from_slice(&[0x60, 1, 2]);
        assert_eq!(ethernet(Link::Sll, &sll, &mut out), Ok(-2));
        assert_eq!(out, [&[0u8; 12][..], &[0x86, 0xdd, 0x60, 1, 2]].concat());
        let mut sll2 = vec![0x08, 0x00];
        sll2.resize(20, 7);
        sll2.push(0x45);
        assert_eq!(ethernet(Link::Sll2, &sll2, &mut out), Ok(-6));
        assert_eq!(out, [&[0u8; 12][..], &[0x08, 0x00, 0x45]].concat());
        assert!(ethernet(Link::Sll, &[0; 15], &mut out).is_err());
        assert_eq!(ethernet(Link::Ethernet, &[1, 2, 3], &mut out), Ok(0));
        assert_eq!(out, [1, 2, 3]);
    }
}
