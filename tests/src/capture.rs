//! Writing pcap captures for `policer replay` (its tests and the
//! benchmark's replay row): streamed through a buffer, so a capture of any
//! size is written in bounded memory.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

const SEC: u64 = 1_000_000_000;

/// A pcap file with nanosecond timestamps (magic a1b23c4d), Ethernet.
pub struct PcapWriter {
    out: BufWriter<File>,
    /// Bytes written so far.
    pub bytes: u64,
}

impl PcapWriter {
    pub fn create(path: &Path) -> std::io::Result<PcapWriter> {
        let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&0xa1b2_3c4du32.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&[0; 8]);
        h.extend_from_slice(&65535u32.to_le_bytes());
        h.extend_from_slice(&1u32.to_le_bytes());
        out.write_all(&h)?;
        Ok(PcapWriter { out, bytes: h.len() as u64 })
    }

    /// One frame at `ts_ns` (ns since the Unix epoch).
    pub fn write(&mut self, ts_ns: u64, frame: &[u8]) -> std::io::Result<()> {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&((ts_ns / SEC) as u32).to_le_bytes());
        h[4..8].copy_from_slice(&((ts_ns % SEC) as u32).to_le_bytes());
        h[8..12].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(frame.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(frame)?;
        self.bytes += 16 + frame.len() as u64;
        Ok(())
    }

    pub fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
