//! `policer capture -w FILE|- [--dropped|--passed|--would-drop|--all]
//! [--rule CIDR…] [--source CIDR] [--sample 1/N] [--max-pps P]
//! [--count N] [--duration T]`: frames the running daemon judged, as
//! pcapng (docs/capture.md).

use std::{
    io::{BufReader, Write},
    os::{fd::AsRawFd, unix::net::UnixStream},
    path::PathBuf,
};

use policer_common::capture::{CAPTURE_DROPPED, CAPTURE_PASSED, CAPTURE_WOULD_DROP, MAX_CAPTURE_PPS};

use super::daemon;
use crate::capture::{CaptureSpec, Chunk, DEFAULT_MAX_PPS, parse_sample, read_chunk};

#[derive(clap::Args)]
#[command(after_help = "Ends at --count, at --duration, or on Ctrl-C; a summary goes to stderr. \
    `policer capture -w - --dropped | tcpdump -nn -r -` reads it live. Only frames a rule judged are \
    captured (not non-IP, malformed or unmatched ones). Up to 8 captures run at once, each bounded on \
    its own; with none running the drop path reads one word more. docs/capture.md has the design.")]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// Where to write the pcapng: a file (created, or truncated), or `-`
    /// for stdout.
    #[arg(short = 'w', long = "write", value_name = "FILE")]
    write: String,
    /// Frames a rule dropped (the default when no verdict is named).
    #[arg(long)]
    dropped: bool,
    /// Frames a rule passed (admitted, allowed, or passed by a monitor rule).
    #[arg(long)]
    passed: bool,
    /// Frames a monitor rule passed that policing would have dropped.
    #[arg(long)]
    would_drop: bool,
    /// Every judged frame, whatever its verdict.
    #[arg(long, conflicts_with_all = ["dropped", "passed", "would_drop"])]
    all: bool,
    /// Only frames of these rules, by their prefix as `policer rule ls`
    /// shows it (`set:NAME` for a named set); repeat or list them.
    #[arg(long = "rule", value_name = "CIDR", num_args = 1.., value_delimiter = ',')]
    rules: Vec<String>,
    /// Only frames from sources in this prefix (an address alone: that
    /// source).
    #[arg(long, value_name = "CIDR")]
    source: Option<String>,
    /// Take one matching frame in N, at random (`1/1000`).
    #[arg(long, value_name = "1/N", default_value = "1/1")]
    sample: String,
    /// At most P frames per second (plus a burst of a tenth of a second's
    /// worth), bounded in the kernel: a flood cannot flood the daemon.
    #[arg(long, value_name = "P", default_value_t = DEFAULT_MAX_PPS)]
    max_pps: u64,
    /// End after N frames.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// End after this long (`30s`, `5m`).
    #[arg(long, value_name = "T")]
    duration: Option<String>,
    /// End before the output passes this many bytes (suffixes k, M, G:
    /// KiB, MiB, GiB; 0: no bound; default 100M for a file, no bound for
    /// `-w -`). The capture then stops cleanly with a whole file (every
    /// frame whole) and says so on stderr, with the summary; exit 0.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_size: Option<u64>,
}

/// The bound on the output: `--max-size` as given (0: none), else 100 MiB
/// for a file and none for stdout (a live pipe into `tcpdump -r -` runs
/// until it is stopped).
fn max_size(write: &str, given: Option<u64>) -> Option<u64> {
    match given {
        Some(0) => None,
        Some(n) => Some(n),
        None if write == "-" => None,
        None => Some(100 << 20),
    }
}

/// Bytes, with k, M or G (binary: KiB, MiB, GiB).
fn parse_size(s: &str) -> Result<u64, String> {
    let (num, mult) = match s.char_indices().last() {
        Some((i, 'k' | 'K')) => (&s[..i], 1u64 << 10),
        Some((i, 'M')) => (&s[..i], 1 << 20),
        Some((i, 'G')) => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    let n: u64 = num.parse().map_err(|_| format!("{s:?} is not a size (bytes, or with k, M or G: 64k, 100M)"))?;
    let bytes = n.checked_mul(mult).ok_or_else(|| format!("{s} is too large"))?;
    if bytes != 0 && bytes < 4096 {
        return Err(format!("{s}: at least 4096 bytes (a file's header and a frame), or 0 for no bound"));
    }
    Ok(bytes)
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let spec = capture_spec(&a)?;
    spec.check()?;
    // The output first: a file that cannot be written starts no capture.
    let mut out = output(&a.write)?;
    let (message, mut reader) = daemon()?.capture(spec)?;
    eprintln!("policer: {message}");
    // Ctrl-C (or SIGTERM) ends the capture as the daemon sees it: our side
    // of the connection is shut, the daemon sends what it has and the
    // summary.
    on_interrupt_shut(reader.get_ref());
    let bound = max_size(&a.write, a.max_size);
    let mut written: u64 = 0;
    let mut frames = crate::capture::FrameCount::default();
    loop {
        match read_chunk(&mut reader)? {
            Some(Chunk::Data(bytes)) => {
                // The daemon's chunks hold whole blocks: stopping before one
                // leaves a whole file.
                if let Some(bound) = bound
                    && written + bytes.len() as u64 > bound
                {
                    out.flush()?;
                    eprintln!(
                        "policer: capture stopped at --max-size {bound}: {written} bytes written, every frame whole"
                    );
                    return end_at_max_size(&mut reader, &frames);
                }
                frames.feed(&bytes);
                written += bytes.len() as u64;
                if let Err(e) = out.write_all(&bytes).and_then(|_| out.flush()) {
                    // A reader of stdout that went away (`| head`): the
                    // capture ends; the daemon sees the connection close.
                    if e.kind() == std::io::ErrorKind::BrokenPipe {
                        return Ok(());
                    }
                    anyhow::bail!("-w {}: {e}", a.write);
                }
            }
            Some(Chunk::End(summary)) => {
                out.flush()?;
                eprintln!("{}", summary.line());
                return Ok(());
            }
            None => anyhow::bail!("the daemon closed the capture without a summary (it stopped?)"),
        }
    }
}

/// What the arguments ask to capture (the verdicts named, else drops);
/// its own check ([`CaptureSpec::check`]) is the caller's to make.
fn capture_spec(a: &Args) -> anyhow::Result<CaptureSpec> {
    let mut verdicts = 0;
    if a.all {
        verdicts = CAPTURE_PASSED | CAPTURE_DROPPED | CAPTURE_WOULD_DROP;
    }
    if a.dropped {
        verdicts |= CAPTURE_DROPPED;
    }
    if a.passed {
        verdicts |= CAPTURE_PASSED;
    }
    if a.would_drop {
        verdicts |= CAPTURE_WOULD_DROP;
    }
    if verdicts == 0 {
        verdicts = CAPTURE_DROPPED;
    }
    if !(1..=MAX_CAPTURE_PPS).contains(&a.max_pps) {
        anyhow::bail!("--max-pps {}: must be 1 to {MAX_CAPTURE_PPS}", a.max_pps);
    }
    let duration_ms = match &a.duration {
        Some(d) => Some(crate::duration::parse(d)?.as_millis().min(u64::MAX as u128) as u64),
        None => None,
    };
    Ok(CaptureSpec {
        verdicts,
        rules: a.rules.iter().map(|r| r.trim().to_string()).filter(|r| !r.is_empty()).collect(),
        source: a.source.clone(),
        sample: parse_sample(&a.sample)?,
        max_pps: a.max_pps,
        count: a.count,
        duration_ms,
    })
}

/// `-w`'s output: stdout for `-`, else the file, created (or truncated).
fn output(write: &str) -> anyhow::Result<Box<dyn Write>> {
    Ok(if write == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        let path = PathBuf::from(write);
        Box::new(
            std::fs::File::create(&path)
                .map_err(|e| anyhow::anyhow!("-w {}: cannot create it: {e}", path.display()))?,
        )
    })
}

/// The end of a capture stopped at `--max-size` (the output flushed, the
/// stop said): the daemon's summary, with the frames written (`frames`),
/// on stderr.
fn end_at_max_size(reader: &mut BufReader<UnixStream>, frames: &crate::capture::FrameCount) -> anyhow::Result<()> {
    // The daemon's summary: our side shut, as Ctrl-C does;
    // what it sends meanwhile is not written.
    let _ = reader.get_ref().shutdown(std::net::Shutdown::Write);
    loop {
        match read_chunk(reader)? {
            Some(Chunk::Data(_)) => {}
            Some(Chunk::End(mut summary)) => {
                summary.written = frames.frames;
                summary.ended = "--max-size".into();
                eprintln!("{}", summary.line());
                return Ok(());
            }
            None => return Ok(()),
        }
    }
}

/// Shuts the write side of `stream` on SIGINT or SIGTERM (a thread waits
/// for them, blocked everywhere else), so the daemon ends the capture.
fn on_interrupt_shut(stream: &UnixStream) {
    let fd = stream.as_raw_fd();
    // SAFETY: plain signal-set calls on a local set; blocking the two
    // signals in this thread before any other is spawned, so the waiter
    // alone takes them.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    std::thread::spawn(move || {
        let mut sig = 0;
        // SAFETY: waits on the set blocked above.
        if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
            // SAFETY: shutting a socket this process holds open for as
            // long as the capture runs (the main thread owns it).
            unsafe { libc::shutdown(fd, libc::SHUT_WR) };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::{max_size, parse_size};

    #[test]
    fn stdout_is_unbounded_unless_asked_and_a_file_is_100m() {
        assert_eq!(max_size("-", None), None);
        assert_eq!(max_size("-", Some(8192)), Some(8192));
        assert_eq!(max_size("out.pcapng", None), Some(100 << 20));
        assert_eq!(max_size("out.pcapng", Some(0)), None);
        assert_eq!(max_size("-", Some(0)), None);
    }

    #[test]
    fn sizes_parse_with_binary_suffixes_and_bad_ones_are_refused() {
        assert_eq!(parse_size("100M"), Ok(100 << 20));
        assert_eq!(parse_size("64k"), Ok(64 << 10));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("8192"), Ok(8192));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "M", "1.5M", "-1", "10", "12T", "99999999999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
