//! `policer capture`: what the CLI asks for ([`CaptureSpec`]), how the
//! answer travels (a JSON line, then [`Chunk`]s: pcapng bytes, and a
//! [`CaptureSummary`] at the end), and the pcapng the daemon writes
//! ([`PcapNg`]). The kernel side is `policer_common::capture`; the
//! daemon's is `daemon::capture`; design and bounds: docs/capture.md.

use std::{borrow::Cow, collections::BTreeMap, io::Read, time::Duration};

use pcap_file::{
    DataLink,
    pcapng::{
        PcapNgWriter,
        blocks::{
            enhanced_packet::{EnhancedPacketBlock, EnhancedPacketOption},
            interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption, InterfaceTsResolution},
            opt_common::CommonOption,
        },
    },
};
use policer_common::capture::{CAPTURE_DROPPED, CAPTURE_PASSED, CAPTURE_WOULD_DROP, MAX_CAPTURE_PPS, SNAP_BYTES};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The rate bound when `--max-pps` is not given.
pub const DEFAULT_MAX_PPS: u64 = 1000;
/// The largest chunk on the wire (pcapng bytes).
pub const MAX_CHUNK_BYTES: usize = 64 << 10;
/// Chunk tags.
pub const CHUNK_DATA: u8 = b'D';
pub const CHUNK_END: u8 = b'E';

/// What `policer capture` asks for (all checked again by the daemon).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSpec {
    /// Verdict bits (policer_common::capture::CAPTURE_*).
    pub verdicts: u32,
    /// Rules by the prefix `rule ls` shows (`set:NAME` for a set); empty:
    /// every rule.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// A source prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// One frame in N.
    pub sample: u32,
    /// The rate bound, frames per second.
    pub max_pps: u64,
    /// End after this many frames.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// End after this long, ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
}

impl CaptureSpec {
    /// The checks both sides make: a clear refusal, nothing started.
    pub fn check(&self) -> Result<()> {
        let all = CAPTURE_PASSED | CAPTURE_DROPPED | CAPTURE_WOULD_DROP;
        if self.verdicts == 0 || self.verdicts & !all != 0 {
            return Err(Error::Invalid("capture: no verdict to capture".into()));
        }
        if self.sample == 0 {
            return Err(Error::Invalid("--sample 1/N: N must be at least 1".into()));
        }
        if !(1..=MAX_CAPTURE_PPS).contains(&self.max_pps) {
            return Err(Error::Invalid(format!("--max-pps must be 1 to {MAX_CAPTURE_PPS}")));
        }
        if self.count == Some(0) {
            return Err(Error::Invalid("--count must be at least 1".into()));
        }
        if self.duration_ms == Some(0) {
            return Err(Error::Invalid("--duration must be longer than 0".into()));
        }
        if let Some(s) = &self.source {
            parse_source(s)?;
        }
        Ok(())
    }
}

/// `--source CIDR` (an address alone is its /32 or /128).
pub fn parse_source(s: &str) -> Result<ipnet::IpNet> {
    let t = s.trim();
    t.parse::<ipnet::IpNet>()
        .or_else(|_| t.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map(|n| n.trunc())
        .map_err(|_| Error::Invalid(format!("--source '{s}': expected an address or a prefix (CIDR)")))
}

/// `--sample 1/N` (or `N`).
pub fn parse_sample(s: &str) -> Result<u32> {
    let t = s.trim();
    let n = t.strip_prefix("1/").unwrap_or(t);
    match n.parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(Error::Invalid(format!("--sample '{s}': expected 1/N with N a whole number ≥ 1 (1/1000)"))),
    }
}

/// How a capture went, sent at its end and printed by the CLI.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureSummary {
    /// Frames written to the output.
    pub written: u64,
    /// Frames the kernel's filter and sampling took.
    pub matched: u64,
    /// Of those, refused by the rate bound (in the kernel).
    pub rate_bounded: u64,
    /// Lost because the ring buffer was full.
    pub ring_full: u64,
    /// Dropped by the daemon because this client read too slowly.
    pub slow_reader: u64,
    /// What ended it: `count`, `duration`, `client`, `daemon`, or an error.
    pub ended: String,
}

impl CaptureSummary {
    pub fn line(&self) -> String {
        format!(
            "policer capture: {} frames written; {} over the rate bound, {} lost to a full ring, {} to a slow \
             reader (ended: {})",
            self.written, self.rate_bounded, self.ring_full, self.slow_reader, self.ended
        )
    }
}

/// The capture counters of `stats --json` and `/metrics`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureStatus {
    /// Captures running now.
    pub active: u32,
    /// The kernel's CAPTURE_ON word: the lanes in use (bits 0-7), the
    /// verdicts they want (bits 8-10) and their smallest sample (bits
    /// 32-63); 0: the drop path does not look further.
    pub kernel_mask: u64,
    /// Since the program was loaded: frames written to the ring, refused
    /// by the rate bound, lost to a full ring.
    pub frames: u64,
    pub rate_bounded: u64,
    pub ring_full: u64,
    /// Frames dropped for slow readers, since the daemon started.
    pub slow_reader: u64,
}

/// One chunk of the answer after its first line.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    Data(Vec<u8>),
    End(CaptureSummary),
}

/// Counts the frames (enhanced packet blocks) of a pcapng stream of this
/// machine's byte order ([`PcapNg`] writes its own), fed in pieces that
/// may cut a block.
#[derive(Default, Debug)]
pub struct FrameCount {
    head: Vec<u8>,
    skip: usize,
    pub frames: u64,
}

impl FrameCount {
    pub fn feed(&mut self, mut b: &[u8]) {
        loop {
            let n = self.skip.min(b.len());
            self.skip -= n;
            b = &b[n..];
            if self.skip > 0 || b.is_empty() {
                return;
            }
            let n = (8 - self.head.len()).min(b.len());
            self.head.extend_from_slice(&b[..n]);
            b = &b[n..];
            if self.head.len() < 8 {
                return;
            }
            let word =
                |i: usize| u32::from_ne_bytes([self.head[i], self.head[i + 1], self.head[i + 2], self.head[i + 3]]);
            if word(0) == 6 {
                self.frames += 1;
            }
            // A block is at least 12 bytes; a shorter length is no pcapng:
            // nothing more is counted.
            let len = word(4) as usize;
            self.skip = if len < 12 { usize::MAX } else { len - 8 };
            self.head.clear();
        }
    }
}

/// A chunk as it goes on the wire: its tag, its length (u32, LE), its bytes.
pub fn frame_chunk(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + payload.len());
    v.push(tag);
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

/// Reads the next chunk; `None` at a clean end of the stream.
pub fn read_chunk(r: &mut impl Read) -> Result<Option<Chunk>> {
    let mut head = [0u8; 5];
    match r.read_exact(&mut head) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::Io(e)),
    }
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > MAX_CHUNK_BYTES {
        return Err(Error::Invalid(format!(
            "capture: a chunk of {len} bytes from the daemon (at most {MAX_CHUNK_BYTES})"
        )));
    }
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)?;
    match head[0] {
        CHUNK_DATA => Ok(Some(Chunk::Data(buf))),
        CHUNK_END => serde_json::from_slice(&buf)
            .map(|s| Some(Chunk::End(s)))
            .map_err(|e| Error::Invalid(format!("capture: the daemon's summary is not understood: {e}"))),
        t => Err(Error::Invalid(format!("capture: unknown chunk {t} from the daemon"))),
    }
}

/// A frame the program captured, as the daemon hands it to a capture.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Wall clock, ns since the Unix epoch.
    pub unix_ns: u64,
    pub len: u32,
    pub ifindex: u32,
    /// The verdict bit.
    pub verdict: u32,
    /// The rule as `rule ls` names it.
    pub rule: String,
    pub data: Vec<u8>,
}

/// The word a verdict bit is written as in a packet's comment.
pub fn verdict_name(bit: u32) -> &'static str {
    match bit {
        CAPTURE_PASSED => "passed",
        CAPTURE_DROPPED => "dropped",
        CAPTURE_WOULD_DROP => "would_drop",
        _ => "unknown",
    }
}

/// The pcapng of one capture, written into a buffer the caller drains
/// ([`PcapNg::take`]): a section header, an interface description block
/// per interface as its first frame comes (name, nanosecond timestamps),
/// and an enhanced packet block per frame with the comment
/// `verdict=dropped rule=10.0.0.0/8 iface=eth0` (`ban=10.0.0.0/24` for a
/// frame a manual ban dropped).
pub struct PcapNg {
    w: PcapNgWriter<Vec<u8>>,
    /// ifindex → interface id in this section.
    ids: BTreeMap<u32, u32>,
    names: BTreeMap<u32, String>,
}

impl PcapNg {
    /// `names`: the interfaces' names by index.
    pub fn new(names: BTreeMap<u32, String>) -> Result<PcapNg> {
        let w = PcapNgWriter::new(Vec::new()).map_err(|e| Error::Invalid(format!("pcapng: {e}")))?;
        Ok(PcapNg { w, ids: BTreeMap::new(), names })
    }

    fn name(&self, ifindex: u32) -> String {
        self.names.get(&ifindex).cloned().unwrap_or_else(|| format!("if{ifindex}"))
    }

    pub fn write(&mut self, f: &Frame) -> Result<()> {
        let err = |e: pcap_file::pcapng::PcapNgWriteError| Error::Invalid(format!("pcapng: {e}"));
        let id = match self.ids.get(&f.ifindex) {
            Some(id) => *id,
            None => {
                let id = self.ids.len() as u32;
                let resol = InterfaceTsResolution::new(false, 9).map_err(|e| Error::Invalid(format!("pcapng: {e}")))?;
                let idb = InterfaceDescriptionBlock {
                    linktype: DataLink::ETHERNET,
                    snaplen: SNAP_BYTES as u32,
                    options: vec![
                        InterfaceDescriptionOption::IfName(Cow::Owned(self.name(f.ifindex))),
                        InterfaceDescriptionOption::IfTsResol(resol),
                    ],
                };
                self.w.write_pcapng_block(idb).map_err(err)?;
                self.ids.insert(f.ifindex, id);
                id
            }
        };
        let by = match f.rule.strip_prefix("ban ") {
            Some(prefix) => format!("ban={prefix}"),
            None => format!("rule={}", f.rule),
        };
        let comment = format!("verdict={} {by} iface={}", verdict_name(f.verdict), self.name(f.ifindex));
        let epb = EnhancedPacketBlock {
            interface_id: id,
            timestamp: Duration::from_nanos(f.unix_ns),
            original_len: f.len.max(f.data.len() as u32),
            data: Cow::Borrowed(&f.data),
            options: vec![EnhancedPacketOption::Common(CommonOption::Comment(Cow::Owned(comment)))],
        };
        self.w.write_pcapng_block(epb).map_err(err)?;
        Ok(())
    }

    /// The bytes written since the last take.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(self.w.get_mut())
    }

    pub fn pending(&self) -> usize {
        self.w.get_ref().len()
    }
}

#[cfg(test)]
mod tests {
    use pcap_file::pcapng::{Block, PcapNgReader};

    use super::*;

    fn spec() -> CaptureSpec {
        CaptureSpec {
            verdicts: CAPTURE_DROPPED,
            rules: vec![],
            source: None,
            sample: 1,
            max_pps: 100,
            count: None,
            duration_ms: None,
        }
    }

    #[test]
    fn frames_are_counted_in_a_stream_cut_anywhere() {
        let mut p = PcapNg::new(BTreeMap::from([(3, "eth0".to_string())])).unwrap();
        for i in 0..7u32 {
            let f = Frame {
                unix_ns: 1_700_000_000_000_000_000 + u64::from(i),
                ifindex: 3,
                verdict: CAPTURE_DROPPED,
                rule: "10.0.0.0/8".into(),
                len: 60 + i,
                data: vec![i as u8; 60 + i as usize],
            };
            p.write(&f).unwrap();
        }
        let bytes = p.take();
        for cut in [1, 3, 7, 8, 13, 64, bytes.len()] {
            let mut c = FrameCount::default();
            for piece in bytes.chunks(cut) {
                c.feed(piece);
            }
            assert_eq!(c.frames, 7, "pieces of {cut}");
        }
    }

    #[test]
    fn bad_specs_are_refused() {
        assert!(spec().check().is_ok());
        for (bad, want) in [
            (CaptureSpec { verdicts: 0, ..spec() }, "verdict"),
            (CaptureSpec { sample: 0, ..spec() }, "--sample"),
            (CaptureSpec { max_pps: 0, ..spec() }, "--max-pps"),
            (CaptureSpec { max_pps: MAX_CAPTURE_PPS + 1, ..spec() }, "--max-pps"),
            (CaptureSpec { count: Some(0), ..spec() }, "--count"),
            (CaptureSpec { duration_ms: Some(0), ..spec() }, "--duration"),
            (CaptureSpec { source: Some("10.0.0.0/33".into()), ..spec() }, "--source"),
        ] {
            let e = bad.check().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
        assert_eq!(parse_sample("1/1000").unwrap(), 1000);
        assert_eq!(parse_sample("7").unwrap(), 7);
        assert!(parse_sample("1/0").is_err() && parse_sample("2/3").is_err() && parse_sample("x").is_err());
        assert_eq!(parse_source("10.1.2.3/16").unwrap().to_string(), "10.1.0.0/16");
        assert_eq!(parse_source("2001:db8::1").unwrap().to_string(), "2001:db8::1/128");
    }

    #[test]
    fn chunks_round_trip() {
        let s = CaptureSummary { written: 3, ended: "count".into(), ..Default::default() };
        let mut wire = frame_chunk(CHUNK_DATA, b"abc");
        wire.extend(frame_chunk(CHUNK_END, &serde_json::to_vec(&s).unwrap()));
        let mut r = &wire[..];
        assert_eq!(read_chunk(&mut r).unwrap(), Some(Chunk::Data(b"abc".to_vec())));
        assert_eq!(read_chunk(&mut r).unwrap(), Some(Chunk::End(s)));
        assert_eq!(read_chunk(&mut r).unwrap(), None);
        let huge = [CHUNK_DATA, 0xff, 0xff, 0xff, 0x7f];
        assert!(read_chunk(&mut &huge[..]).is_err());
    }

    /// What the daemon writes reads back with its interfaces, ns
    /// timestamps, lengths and comments.
    #[test]
    fn the_pcapng_reads_back() {
        let mut p = PcapNg::new(BTreeMap::from([(7, "veth0".to_string())])).unwrap();
        let frames = [
            Frame {
                unix_ns: 1_700_000_000_123_456_789,
                len: 1500,
                ifindex: 7,
                verdict: CAPTURE_DROPPED,
                rule: "10.0.0.0/8".into(),
                data: vec![1; 256],
            },
            Frame {
                unix_ns: 1_700_000_001_000_000_001,
                len: 60,
                ifindex: 9,
                verdict: CAPTURE_PASSED,
                rule: "::/0".into(),
                data: vec![2; 60],
            },
            Frame {
                unix_ns: 1_700_000_002_000_000_000,
                len: 64,
                ifindex: 7,
                verdict: CAPTURE_DROPPED,
                rule: "ban 192.0.2.0/24".into(),
                data: vec![3; 64],
            },
        ];
        let mut bytes = Vec::new();
        for f in &frames {
            p.write(f).unwrap();
            bytes.extend(p.take());
        }
        assert_eq!(p.pending(), 0);
        let mut r = PcapNgReader::new(&bytes[..]).unwrap();
        let mut got = Vec::new();
        while let Some(b) = r.next_block() {
            if let (Block::EnhancedPacket(e), _) = b.unwrap() {
                let comment = e.options.iter().find_map(|o| match o {
                    EnhancedPacketOption::Common(CommonOption::Comment(c)) => Some(c.to_string()),
                    _ => None,
                });
                got.push((e.interface_id, e.timestamp.as_nanos() as u64, e.original_len, e.data.len(), comment));
            }
        }
        assert_eq!(r.interfaces().len(), 2);
        assert_eq!(
            got,
            [
                (0, frames[0].unix_ns, 1500, 256, Some("verdict=dropped rule=10.0.0.0/8 iface=veth0".into())),
                (1, frames[1].unix_ns, 60, 60, Some("verdict=passed rule=::/0 iface=if9".into())),
                (0, frames[2].unix_ns, 64, 64, Some("verdict=dropped ban=192.0.2.0/24 iface=veth0".into())),
            ]
        );
    }
}
