//! `policer suggest --watch DURATION`: the daemon keeps no per-source
//! frame counts (a bucket holds when its debt drains and its drops), so
//! the sources' rates are observed, not read: a capture of every frame the
//! rules judge (`policer capture --all`, bounded in the kernel by
//! `--max-pps`) for DURATION, each frame counted under the rule that
//! judged it, on the kernel's timestamps. Frames the capture did not
//! deliver (over its bound, a full ring) are counted and said: the peaks
//! are then low bounds.

use std::{
    collections::HashMap,
    io::{BufReader, Read},
    os::unix::net::UnixStream,
    time::{Duration, Instant},
};

use pcap_file::pcapng::{
    Block, PcapNgReader,
    blocks::{enhanced_packet::EnhancedPacketOption, opt_common::CommonOption},
};
use policer_common::capture::{CAPTURE_DROPPED, CAPTURE_PASSED, CAPTURE_WOULD_DROP};

use super::{Observer, Report, Target, peaks::Ppm};
use crate::{
    capture::{CaptureSpec, CaptureSummary, Chunk, read_chunk},
    control::{Client, RuleView},
    error::{Error, Result},
    replay::source_of,
};

/// The daemon's capture stream as the pcapng bytes it carries; its end
/// (the summary) is an end of file.
struct Chunks {
    r: BufReader<UnixStream>,
    buf: Vec<u8>,
    at: usize,
    summary: Option<CaptureSummary>,
}

impl Chunks {
    /// Whether the stream has ended (no byte left), reading chunks until
    /// it has a byte or ends.
    fn at_end(&mut self) -> std::io::Result<bool> {
        while self.at == self.buf.len() {
            if self.summary.is_some() {
                return Ok(true);
            }
            match read_chunk(&mut self.r).map_err(std::io::Error::other)? {
                Some(Chunk::Data(b)) => (self.buf, self.at) = (b, 0),
                Some(Chunk::End(s)) => self.summary = Some(s),
                None => return Ok(true),
            }
        }
        Ok(false)
    }
}

impl Read for Chunks {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at_end()? {
            return Ok(0);
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// The rule a captured frame's comment names (`verdict=passed
/// rule=10.0.0.0/8 (udp dport 53) iface=eth0`): `None` for a ban's.
fn rule_of(comment: &str) -> Option<&str> {
    let rest = comment.split_once(" rule=")?.1;
    Some(rest.rsplit_once(" iface=").map_or(rest, |(r, _)| r))
}

/// The rules in force that police or monitor with a rate (`only`: of these
/// prefixes), each under the name a capture gives its frames.
fn targets(rules: Vec<RuleView>, only: &[ipnet::IpNet]) -> Vec<(String, Target)> {
    let mut out = Vec::new();
    for v in rules {
        if v.ban || v.set.is_some() || !v.in_force || !matches!(v.action.as_str(), "police" | "monitor") {
            continue;
        }
        let Some(rate) = v.rate.clone() else { continue };
        let Ok(net) = v.prefix.parse::<ipnet::IpNet>() else { continue };
        if !only.is_empty() && !only.contains(&net) {
            continue;
        }
        let classed = !(v.class.is_empty() || v.class == "-");
        let (name, rule) = if classed {
            (format!("{net} ({})", v.class), format!("{net} [{}]", v.class))
        } else {
            (net.to_string(), net.to_string())
        };
        let class_args = [
            ("--proto", &v.proto),
            ("--dport", &v.dport),
            ("--tcp-flags", &v.tcp_flags),
            ("--icmp-type", &v.icmp_type),
            ("--dst", &v.dst),
        ]
        .into_iter()
        .filter_map(|(o, f)| f.clone().map(|f| (o, f)))
        .collect();
        out.push((
            name,
            Target { rule, net, key_len: v.key_len, class_args, action: v.action, rate: Some(rate), burst: v.burst },
        ));
    }
    out
}

/// Watches the daemon's judged frames for `duration` and proposes from
/// them. `max_pps` bounds the capture (frames past it are not seen, and
/// said so).
pub fn watch(client: &Client, duration: Duration, only: &[ipnet::IpNet], max_pps: u64, keep: Ppm) -> Result<Report> {
    let named = targets(client.rule_ls()?, only);
    if named.is_empty() {
        return Err(Error::Invalid(format!(
            "no rule to suggest for: the daemon has no rule that polices or monitors with a rate{}",
            if only.is_empty() { "" } else { " at the prefixes given with --rule" }
        )));
    }
    let by_name: HashMap<String, usize> = named.iter().enumerate().map(|(i, (n, _))| (n.clone(), i)).collect();
    let spec = CaptureSpec {
        verdicts: CAPTURE_PASSED | CAPTURE_DROPPED | CAPTURE_WOULD_DROP,
        // Every rule's frames unless some were named: those of the others
        // are counted as unmatched.
        rules: if only.is_empty() { vec![] } else { only.iter().map(|n| n.to_string()).collect() },
        source: None,
        sample: 1,
        max_pps,
        count: None,
        duration_ms: Some(duration.as_millis().max(1) as u64),
    };
    spec.check()?;
    let start_ns = crate::duration::unix_ms() * 1_000_000;
    let t0 = Instant::now();
    let (_, r) = client.capture(spec)?;
    let mut obs = Observer::new(named.into_iter().map(|(_, t)| t).collect(), Some(start_ns));
    let mut chunks = Chunks { r, buf: Vec::new(), at: 0, summary: None };
    read_frames(&mut chunks, &by_name, &mut obs)?;
    // The rest of the stream, to its summary (a capture that took no frame
    // sends no pcapng at all).
    let mut sink = [0u8; 4096];
    while chunks.read(&mut sink).map_err(|e| Error::Invalid(format!("capture: {e}")))? > 0 {}
    let elapsed = t0.elapsed();
    let mut notes = Vec::new();
    match &chunks.summary {
        Some(s) => {
            let lost = s.rate_bounded + s.ring_full + s.slow_reader;
            if lost > 0 {
                notes.push(format!(
                    "{lost} judged frames were not seen ({} over the capture's bound of {max_pps} frames/s \
                     (--max-pps), {} lost to a full ring, {} to a slow reader): the peaks are low bounds",
                    s.rate_bounded, s.ring_full, s.slow_reader
                ));
            }
            if s.ended != "duration" {
                notes.push(format!("the watch ended early ({}), after {:.1} s", s.ended, elapsed.as_secs_f64()));
            }
        }
        None => notes.push("the daemon's capture ended without its summary: frames may be missing".into()),
    }
    let from = format!("the daemon's judged frames, watched for {}", crate::duration::format(duration));
    Ok(obs.finish(from, Some(elapsed.min(duration).as_nanos() as u64), keep, notes))
}

/// Counts each captured frame under the rule its comment names.
fn read_frames(chunks: &mut Chunks, by_name: &HashMap<String, usize>, obs: &mut Observer) -> Result<()> {
    let bad = |e: &dyn std::fmt::Display| Error::Invalid(format!("capture: the daemon's pcapng: {e}"));
    // No section at all: the capture took no frame.
    if chunks.at_end().map_err(|e| bad(&e))? {
        return Ok(());
    }
    let mut reader = PcapNgReader::new(&mut *chunks).map_err(|e| bad(&e))?;
    while let Some(block) = reader.next_block() {
        let (block, _) = block.map_err(|e| bad(&e))?;
        let Block::EnhancedPacket(p) = block else { continue };
        let comment = p.options.iter().find_map(|o| match o {
            EnhancedPacketOption::Common(CommonOption::Comment(c)) => Some(c.as_ref()),
            _ => None,
        });
        let target = comment.and_then(rule_of).and_then(|n| by_name.get(n));
        match (target, source_of(&p.data)) {
            (Some(i), Some(src)) => obs.frame(*i, src, p.timestamp.as_nanos() as u64),
            _ => obs.unmatched(),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::rule_of;

    #[test]
    fn a_frames_rule_is_read_from_its_comment() {
        assert_eq!(rule_of("verdict=passed rule=10.0.0.0/8 iface=eth0"), Some("10.0.0.0/8"));
        assert_eq!(
            rule_of("verdict=dropped rule=10.0.0.0/8 (udp dport 53) iface=v0"),
            Some("10.0.0.0/8 (udp dport 53)")
        );
        assert_eq!(rule_of("verdict=dropped ban=10.0.0.0/24 iface=eth0"), None);
    }
}
