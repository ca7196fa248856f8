//! Reading a capture frame by frame (pcap or pcapng, told apart by their
//! first bytes), each frame as the Ethernet frame the XDP program sees.
//!
//! Streams: one frame is in memory at a time (the reader's buffer and the
//! caller's), whatever the size of the file.

use std::{
    fs::File,
    io::{BufRead, BufReader, Read},
    os::unix::fs::FileTypeExt,
    path::{Path, PathBuf},
    time::Duration,
};

use pcap_file::{
    DataLink, Endianness,
    pcap::PcapParser,
    pcapng::{Block, PcapNgReadError, PcapNgReader},
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
pub struct FrameMeta {
    /// The capture's timestamp, ns since the Unix epoch.
    pub ts_ns: u64,
    /// The frame's length as the program is given it (the original
    /// length, clipped to [`MAX_FRAME`]).
    pub len: u32,
    /// Whether the frame was longer than [`MAX_FRAME`].
    pub clipped: bool,
}

/// The most a pcap record may hold: libpcap's largest snap length
/// (`MAXIMUM_SNAPLEN`, 256 KiB), which no capture tool writes past. A
/// record header that says more is damage (or not a capture), refused
/// before anything is read for it: a length of 4 GiB is not read into
/// memory to find out.
pub const MAX_RECORD: u32 = 262_144;

/// How long `replay` waits for a writer to open a FIFO it was given.
pub const FIFO_WAIT: Duration = Duration::from_secs(30);

/// The size of a classic pcap file's header, and of a record's.
const PCAP_HEADER: u64 = 24;
const RECORD_HEADER: usize = 16;

enum FormatReader {
    /// Classic pcap, read record by record here (so that a record's
    /// header is judged before its body is read: [`MAX_RECORD`]), each
    /// record parsed by pcap-file's parser.
    Pcap {
        r: BufReader<Counted>,
        parser: PcapParser,
        link: Link,
        record: Vec<u8>,
        offset: u64,
    },
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
    reader: FormatReader,
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
        let file = open_input(path, FIFO_WAIT)?;
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        let mut buf = BufReader::with_capacity(256 * 1024, Counted { file, read: read.clone() });
        let head = buf.fill_buf().map_err(|source| Error::ConfigRead { path: path.to_path_buf(), source })?;
        let reader = if head.starts_with(&PCAPNG_MAGIC) {
            FormatReader::PcapNg(PcapNgReader::new(buf).map_err(|e| bad(format!("not a valid pcapng file: {e}")))?)
        } else {
            let mut head = [0u8; PCAP_HEADER as usize];
            read_full(&mut buf, &mut head).map_err(|source| Error::ConfigRead { path: path.to_path_buf(), source })?;
            let (_, parser) = PcapParser::new(&head).map_err(|e| bad(format!("neither pcap nor pcapng: {e}")))?;
            let d = parser.header().datalink;
            let link = Link::of(d).ok_or_else(|| unsupported(path, d, ""))?;
            FormatReader::Pcap { r: buf, parser, link, record: Vec::new(), offset: PCAP_HEADER }
        };
        Ok(Capture { path: path.to_path_buf(), reader, frames: 0, read })
    }

    /// Bytes of the file read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read.get()
    }

    /// The next frame, written into `out` as an Ethernet frame; `None` at
    /// the end of the capture.
    pub fn next(&mut self, out: &mut Vec<u8>) -> Result<Option<FrameMeta>> {
        let path = self.path.clone();
        let n = self.frames + 1;
        let bad = |what: String| Error::Invalid(format!("{}: frame {n}: {what}", path.display()));
        let got = match &mut self.reader {
            FormatReader::Pcap { r, parser, link, record, offset } => {
                let at = *offset;
                match next_record(r, parser, record).map_err(|e| bad(format!("the record at byte {at}: {e}")))? {
                    None => None,
                    Some(()) => {
                        *offset += record.len() as u64;
                        let (_, p) =
                            parser.next_packet(record).map_err(|e| bad(format!("the record at byte {at}: {e}")))?;
                        let ts = p.timestamp();
                        Some((ts, p.orig_len(), ethernet(*link, p.data(), out).map_err(bad)?))
                    }
                }
            }
            FormatReader::PcapNg(r) => loop {
                match r.next_block() {
                    None => break None,
                    Some(Err(PcapNgReadError::Io(e))) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        return Err(bad(format!(
                            "the file ends inside a block, at or before byte {} (cut short, or a block length past \
                             its end: damaged)",
                            self.read.get()
                        )));
                    }
                    Some(Err(PcapNgReadError::Io(e))) => return Err(bad(format!("reading: {e}"))),
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
        Ok(Some(FrameMeta { ts_ns, len: out.len() as u32, clipped }))
    }
}

/// Reads the next record of a classic pcap file into `record` (its
/// header and body); `None` at the end of the file. A record header that
/// says more than the file's snap length, or than [`MAX_RECORD`], is
/// refused before its body is read, and a file that ends inside a record
/// says where.
fn next_record(
    r: &mut impl BufRead,
    parser: &PcapParser,
    record: &mut Vec<u8>,
) -> std::result::Result<Option<()>, String> {
    let mut head = [0u8; RECORD_HEADER];
    let got = read_full(r, &mut head).map_err(|e| format!("{e}"))?;
    if got == 0 {
        return Ok(None);
    }
    if got < RECORD_HEADER {
        return Err(format!("the file ends {got} bytes into the record's 16-byte header (cut short)"));
    }
    let h = parser.header();
    let field = |at: usize| {
        let b = [head[at], head[at + 1], head[at + 2], head[at + 3]];
        match h.endianness {
            Endianness::Big => u32::from_be_bytes(b),
            Endianness::Little => u32::from_le_bytes(b),
        }
    };
    let caplen = field(8);
    if caplen > h.snaplen {
        return Err(format!(
            "its captured length is {caplen} bytes, more than the file's snap length ({}): the file is damaged",
            h.snaplen
        ));
    }
    if caplen > MAX_RECORD {
        return Err(format!(
            "its captured length is {caplen} bytes, more than the {MAX_RECORD} bytes any capture tool writes \
             (libpcap's largest snap length): the file is damaged"
        ));
    }
    record.clear();
    record.extend_from_slice(&head);
    record.resize(RECORD_HEADER + caplen as usize, 0);
    let body = read_full(r, &mut record[RECORD_HEADER..]).map_err(|e| format!("{e}"))?;
    if body < caplen as usize {
        return Err(format!("the file ends {body} bytes into the record's {caplen} captured bytes (cut short)"));
    }
    Ok(Some(()))
}

/// Reads until `buf` is full or the input ends; how much was read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Opens the capture. A FIFO is waited on for a writer for at most
/// [`FIFO_WAIT`], saying so on stderr: a plain (blocking) open of its read
/// end, on a helper thread, returns exactly when a writer opens it (Linux's
/// poll reports nothing for a writer that has only opened it, and
/// `tcpdump -w FIFO` without `-U` writes nothing, not even its header,
/// until its buffer fills). No writer within the wait is an error that
/// names the FIFO; the helper is then woken by opening the FIFO for
/// writing here, and both ends are dropped. Reads block as usual after.
fn open_input(path: &Path, wait: Duration) -> Result<File> {
    let read_err = |source| Error::ConfigRead { path: path.to_path_buf(), source };
    let fifo = std::fs::metadata(path).map(|m| m.file_type().is_fifo()).unwrap_or(false);
    if !fifo {
        return File::open(path).map_err(read_err);
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let opening = path.to_path_buf();
    std::thread::Builder::new()
        .name("policer-fifo".into())
        .spawn(move || {
            let _ = tx.send(File::open(opening));
        })
        .map_err(read_err)?;
    let deadline = std::time::Instant::now() + wait;
    let mut said = false;
    loop {
        // A writer already there: no word of waiting.
        let step = if said { deadline.saturating_duration_since(std::time::Instant::now()) } else { NO_WORD };
        match rx.recv_timeout(step.min(wait)) {
            Ok(opened) => return opened.map_err(read_err),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if !said && step < wait => {
                said = true;
                eprintln!(
                    "policer replay: {} is a FIFO with no writer yet; waiting up to {} s for one",
                    path.display(),
                    wait.as_secs()
                );
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => break,
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                return Err(read_err(std::io::Error::other("the FIFO's opening thread ended without an answer")));
            }
        }
    }
    // Wakes the helper's open (a reader waiting in open counts as one, so
    // this open succeeds); what it opened is dropped with this end.
    use std::os::unix::fs::OpenOptionsExt;
    if let Ok(wake) = std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(path) {
        let _ = rx.recv_timeout(Duration::from_secs(1));
        drop(wake);
    }
    Err(Error::Invalid(format!(
        "{}: no writer opened the FIFO within {} s (start the writer, e.g. `tcpdump -U -w {}`, or replay a file)",
        path.display(),
        wait.as_secs(),
        path.display()
    )))
}

/// How long a FIFO's open may take before `replay` says it is waiting.
const NO_WORD: Duration = Duration::from_millis(100);

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
    use std::io::Write;

    use super::*;

    /// A little-endian microsecond pcap of Ethernet frames: (caplen, len, data).
    fn pcap(records: &[(u32, u32, &[u8])]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        f.extend_from_slice(&2u16.to_le_bytes());
        f.extend_from_slice(&4u16.to_le_bytes());
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65_535u32.to_le_bytes());
        f.extend_from_slice(&1u32.to_le_bytes());
        for &(caplen, len, data) in records {
            f.extend_from_slice(&1_700_000_000u32.to_le_bytes());
            f.extend_from_slice(&0u32.to_le_bytes());
            f.extend_from_slice(&caplen.to_le_bytes());
            f.extend_from_slice(&len.to_le_bytes());
            f.extend_from_slice(data);
        }
        f
    }

    fn read_all(bytes: &[u8]) -> (usize, Result<()>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.pcap");
        std::fs::write(&path, bytes).unwrap();
        let mut c = match Capture::open(&path) {
            Ok(c) => c,
            Err(e) => return (0, Err(e)),
        };
        let mut out = Vec::new();
        let mut n = 0;
        loop {
            match c.next(&mut out) {
                Ok(Some(_)) => n += 1,
                Ok(None) => return (n, Ok(())),
                Err(e) => return (n, Err(e)),
            }
        }
    }

    #[test]
    fn a_huge_caplen_names_the_record_and_why_before_reading_it() {
        let frame = [0u8; 60];
        let good = pcap(&[(60, 60, &frame), (60, 60, &frame)]);
        assert_eq!(read_all(&good).0, 2);
        // The second record says 4 GiB: refused by its header, nothing read for it.
        let mut bad = pcap(&[(60, 60, &frame)]);
        bad.extend_from_slice(&pcap(&[(u32::MAX, u32::MAX, &frame)])[24..]);
        let (n, r) = read_all(&bad);
        let e = r.unwrap_err().to_string();
        assert_eq!(n, 1, "{e}");
        assert!(e.contains("frame 2") && e.contains("at byte 100") && e.contains("4294967295"), "{e}");
        assert!(e.contains("snap length (65535)") && !e.contains("I/O error"), "{e}");
        // Cut inside a record's body, and inside a record's header.
        let cut = &good[..good.len() - 10];
        let e = read_all(cut).1.unwrap_err().to_string();
        assert!(e.contains("frame 2") && e.contains("50 bytes into the record's 60 captured bytes"), "{e}");
        let cut = &good[..24 + 76 + 5];
        let e = read_all(cut).1.unwrap_err().to_string();
        assert!(e.contains("5 bytes into the record's 16-byte header"), "{e}");
    }

    #[test]
    fn a_fifo_without_a_writer_is_an_error_after_the_wait_and_one_with_a_writer_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a path string valid for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t0 = std::time::Instant::now();
        let e = open_input(&path, Duration::from_millis(300)).unwrap_err().to_string();
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert!(e.contains("no writer opened the FIFO within"), "{e}");
        // A writer that comes during the wait: its capture is read whole.
        let bytes = pcap(&[(60, 60, &[0u8; 60])]);
        let w = {
            let (path, bytes) = (path.clone(), bytes.clone());
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(200));
                std::fs::write(&path, &bytes).unwrap();
            })
        };
        let mut f = open_input(&path, Duration::from_secs(10)).unwrap();
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        w.join().unwrap();
        assert_eq!(got, bytes);
    }

    /// Issue 41, point 12 (review): a writer that opens the FIFO and
    /// writes nothing for a while (`tcpdump -w FIFO` buffers even its
    /// header) is a writer: the open returns when it opens, and reads wait
    /// for its bytes. Polling for data refused it after the wait.
    #[test]
    fn a_fifo_writer_that_writes_nothing_for_a_while_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fifo");
        let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
        // SAFETY: a path string valid for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let bytes = pcap(&[(60, 60, &[0u8; 60])]);
        let w = {
            let (path, bytes) = (path.clone(), bytes.clone());
            std::thread::spawn(move || {
                let mut f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                std::thread::sleep(Duration::from_secs(1));
                f.write_all(&bytes).unwrap();
            })
        };
        let mut f = open_input(&path, Duration::from_millis(500)).unwrap();
        let mut got = Vec::new();
        f.read_to_end(&mut got).unwrap();
        w.join().unwrap();
        assert_eq!(got, bytes);
    }

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
