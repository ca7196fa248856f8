//! The daemon's output: every line it prints goes through here, never
//! through `println!`/`eprintln!` (which panic when a write fails:
//! `policer attach … | head -3`, or `attach … &` in a terminal that
//! closes, gave EPIPE or EIO, and the panic ended the thread that printed —
//! the owner, or the event loop — leaving the program attached with no
//! daemon, or detached). A line that cannot be written is dropped: the
//! daemon keeps policing and serving. The first failure of a stream is
//! said once on the other one (stdout gone: on stderr; stderr gone: on
//! stdout), and once more when the stream works again. The lint below
//! keeps the daemon's modules off the panicking macros.
//!
//! Once the daemon runs ([`start`]), a line does not wait for its stream:
//! it goes into a bounded queue ([`StreamQueue`]) that one thread per stream
//! writes. A stream nobody reads (`attach | less` not scrolled, Ctrl-S in a
//! terminal, a wedged journald) blocks only that thread; the owner, whose
//! changes and ban ends print lines, goes on. A line that finds the queue
//! full is dropped and counted, and the count is said on the stream once it
//! has caught up. Before [`start`] (the start, which may unshare the mount
//! namespace and so must be single-threaded) lines are written in place.
//!
//! It is the daemon's one voice: `say!`/`say_err!` (what it did, what it
//! refused) and the `log` records (warnings of the machinery, debug
//! lines; [`init_log`] sends them through the same queues as
//! `policer: LEVEL: …`). When a stream is the journal's (systemd sets
//! `JOURNAL_STREAM` to its device and inode, systemd.exec(5)), each line
//! starts with its syslog priority, `<N>`, which journald takes as the
//! entry's priority (sd-daemon(3)): `journalctl -u policer -p warning`
//! lists the daemon's warnings and errors, not its every change.
//!
//! SIGPIPE is ignored by Rust's runtime, so a write to a closed pipe is an
//! EPIPE error here, not a signal. SIGHUP (a terminal closing sends it to
//! its jobs) is `policer reload` (`daemon/mod.rs`): harmless to a daemon
//! whose file did not change.

use std::{
    fmt,
    io::Write,
    sync::{
        Arc, OnceLock,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc::{self, SyncSender, TryRecvError, TrySendError},
    },
    time::{Duration, Instant},
};

/// Lines a stream's queue holds while its writer waits.
const QUEUE_LINES: usize = 1024;

/// The queues of stdout and stderr, once the daemon runs.
static QUEUES: OnceLock<[StreamQueue; 2]> = OnceLock::new();

/// Whether the last write of each stream failed.
static STDOUT_GONE: AtomicBool = AtomicBool::new(false);
static STDERR_GONE: AtomicBool = AtomicBool::new(false);

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Stream {
    Out,
    Err,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Out => "stdout",
            Stream::Err => "stderr",
        }
    }

    fn gone(self) -> &'static AtomicBool {
        match self {
            Stream::Out => &STDOUT_GONE,
            Stream::Err => &STDERR_GONE,
        }
    }

    fn other(self) -> Stream {
        match self {
            Stream::Out => Stream::Err,
            Stream::Err => Stream::Out,
        }
    }

    /// Writes `line` whole (and flushes), or says why not.
    fn write(self, line: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Out => {
                let mut o = std::io::stdout().lock();
                o.write_all(line).and_then(|()| o.flush())
            }
            Stream::Err => {
                let mut e = std::io::stderr().lock();
                e.write_all(line).and_then(|()| e.flush())
            }
        }
    }
}

/// One line on `stream`; never fails, never panics, and once the daemon
/// runs never waits for the stream.
pub(crate) fn line(stream: Stream, args: fmt::Arguments<'_>) {
    send(stream, framed(stream, &fmt::format(args)));
}

/// `text` as a line of `stream`: its priority first when the stream is
/// the journal's (a warning's, or an answer's on stdout, an error's on
/// stderr), a newline last.
fn framed(stream: Stream, text: &str) -> Vec<u8> {
    frame(journal()[stream as usize], stream, text)
}

/// [`framed`], told whether the stream is the journal's.
fn frame(journal: bool, stream: Stream, text: &str) -> Vec<u8> {
    let priority = match stream {
        _ if text.starts_with("policer: warning") => WARNING,
        Stream::Out => INFO,
        Stream::Err => ERR,
    };
    let mut out = String::with_capacity(text.len() + 4);
    if journal {
        out.push_str(PRIORITIES[priority as usize]);
    }
    out.push_str(text);
    out.push('\n');
    out.into_bytes()
}

/// `<N>` for each syslog priority N.
const PRIORITIES: [&str; 8] = ["<0>", "<1>", "<2>", "<3>", "<4>", "<5>", "<6>", "<7>"];

/// A `Write` for code that writes its lines to a writer (the start's
/// report): each whole line goes out as [`line`] sends it.
pub(crate) struct Voice {
    stream: Stream,
    pending: Vec<u8>,
}

impl Voice {
    pub(crate) fn new(stream: Stream) -> Voice {
        Voice { stream, pending: Vec::new() }
    }
}

impl Write for Voice {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let rest = self.pending.split_off(end + 1);
            let text = String::from_utf8_lossy(&self.pending[..end]).into_owned();
            self.pending = rest;
            send(self.stream, framed(self.stream, &text));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for Voice {
    /// A last line without its newline is said too.
    fn drop(&mut self) {
        if !self.pending.is_empty() {
            let text = String::from_utf8_lossy(&self.pending).into_owned();
            send(self.stream, framed(self.stream, &text));
        }
    }
}

/// Syslog priorities (sd-daemon(3)): what a line is, for the journal.
const ERR: u8 = 3;
const WARNING: u8 = 4;
const INFO: u8 = 6;
const DEBUG: u8 = 7;

/// `<N>` when `stream` is the journal's, else nothing.
fn prefix(stream: Stream, priority: u8) -> &'static str {
    if journal()[stream as usize] { PRIORITIES[priority as usize & 7] } else { "" }
}

/// Whether stdout and stderr are the journal's streams: `JOURNAL_STREAM`
/// (`DEVICE:INODE`) names the one systemd connected, and the descriptor
/// still is it (a child's redirected stream is not).
fn journal() -> [bool; 2] {
    static JOURNAL: OnceLock<[bool; 2]> = OnceLock::new();
    *JOURNAL.get_or_init(|| {
        let Some((dev, ino)) = std::env::var("JOURNAL_STREAM").ok().and_then(|v| parse_journal_stream(&v)) else {
            return [false, false];
        };
        let is = |fd: i32| {
            // SAFETY: fstat(2) on a descriptor this process holds (or
            // not: then it fails), into a zeroed struct of the right type.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            (unsafe { libc::fstat(fd, &mut st) } == 0) && st.st_dev as u64 == dev && st.st_ino as u64 == ino
        };
        [is(1), is(2)]
    })
}

/// `DEVICE:INODE` of `JOURNAL_STREAM`, both decimal.
fn parse_journal_stream(v: &str) -> Option<(u64, u64)> {
    let (d, i) = v.split_once(':')?;
    Some((d.parse().ok()?, i.parse().ok()?))
}

/// Sends the `log` records (the machinery's warnings; debug lines with
/// `RUST_LOG=debug`) through the daemon's voice: on stderr, through its
/// queue once the daemon runs (so a stream nobody reads never holds the
/// owner), as `policer: warning: …`, with the journal's priority when
/// stderr is the journal's. `RUST_LOG` sets the level (warnings by
/// default).
pub fn init_log() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format(|buf, record| {
            let (word, priority) = match record.level() {
                log::Level::Error => ("error", ERR),
                log::Level::Warn => ("warning", WARNING),
                log::Level::Info => ("info", INFO),
                log::Level::Debug => ("debug", DEBUG),
                log::Level::Trace => ("trace", DEBUG),
            };
            writeln!(buf, "{}policer: {word}: {}", prefix(Stream::Err, priority), record.args())
        })
        .target(env_logger::Target::Pipe(Box::new(LogPipe(Vec::new()))))
        .init();
}

/// What `env_logger` writes into: whole lines, sent as [`line`] sends
/// them.
struct LogPipe(Vec<u8>);

impl Write for LogPipe {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.extend_from_slice(buf);
        while let Some(end) = self.0.iter().position(|b| *b == b'\n') {
            let rest = self.0.split_off(end + 1);
            send(Stream::Err, std::mem::replace(&mut self.0, rest));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Queues `text` for `stream` (written in place before [`start`], or if
/// its writer is gone).
fn send(stream: Stream, text: Vec<u8>) {
    match QUEUES.get() {
        Some(queues) => {
            if let Err(text) = queues[stream as usize].send(text) {
                emit(stream, &text, &|s, b| s.write(b));
            }
        }
        None => {
            emit(stream, &text, &|s, b| s.write(b));
        }
    }
}

/// From now on lines go through a queue and a writer thread per stream.
/// Called when the daemon runs, after its start (which must be
/// single-threaded). If a thread cannot be made, lines stay written in
/// place.
pub(crate) fn start() {
    if QUEUES.get().is_some() {
        return;
    }
    let queue = |stream: Stream| {
        // The writer's notes for the other stream go through its queue.
        let write = move |b: &[u8]| {
            emit(stream, b, &|s, b| {
                if s == stream {
                    s.write(b)
                } else {
                    send(s, b.to_vec());
                    Ok(())
                }
            })
        };
        StreamQueue::spawn(&format!("policer-{}", stream.name()), stream.name(), QUEUE_LINES, write)
    };
    if let (Ok(out), Ok(err)) = (queue(Stream::Out), queue(Stream::Err)) {
        let _ = QUEUES.set([out, err]);
    }
}

/// Waits (up to `limit`) until the lines queued so far are written: before
/// the process ends.
pub(crate) fn flush(limit: Duration) {
    if let Some(queues) = QUEUES.get() {
        let until = Instant::now() + limit;
        for l in queues {
            l.flush(until);
        }
    }
}

enum Msg {
    Line(Vec<u8>),
    Flush(mpsc::Sender<()>),
}

/// A stream's bounded queue and the thread that writes it.
struct StreamQueue {
    tx: SyncSender<Msg>,
    /// Lines dropped on a full queue, not yet said.
    dropped: Arc<AtomicU64>,
}

impl StreamQueue {
    /// A queue of `cap` lines; `write` writes one (true: written).
    fn spawn(
        thread: &str,
        stream: &'static str,
        cap: usize,
        mut write: impl FnMut(&[u8]) -> bool + Send + 'static,
    ) -> std::io::Result<StreamQueue> {
        let (tx, rx) = mpsc::sync_channel::<Msg>(cap);
        let dropped = Arc::new(AtomicU64::new(0));
        let d = dropped.clone();
        std::thread::Builder::new().name(thread.into()).spawn(move || {
            // Said once the queue is empty (the stream caught up).
            let say_dropped = |write: &mut dyn FnMut(&[u8]) -> bool| {
                let n = d.swap(0, Ordering::SeqCst);
                if n > 0 {
                    let note = format!(
                        "policer: {n} lines to {stream} were dropped: it was not read (the daemon does not wait \
                         for its output)\n"
                    );
                    write(note.as_bytes());
                }
            };
            loop {
                let m = match rx.try_recv() {
                    Ok(m) => m,
                    Err(TryRecvError::Disconnected) => return,
                    Err(TryRecvError::Empty) => {
                        say_dropped(&mut write);
                        match rx.recv() {
                            Ok(m) => m,
                            Err(_) => return,
                        }
                    }
                };
                match m {
                    Msg::Line(b) => {
                        write(&b);
                    }
                    Msg::Flush(ack) => {
                        say_dropped(&mut write);
                        let _ = ack.send(());
                    }
                }
            }
        })?;
        Ok(StreamQueue { tx, dropped })
    }

    /// Queues a line, or drops and counts it when the queue is full;
    /// `Err(line)`: the writer is gone.
    fn send(&self, line: Vec<u8>) -> Result<(), Vec<u8>> {
        match self.tx.try_send(Msg::Line(line)) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => {
                self.dropped.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Err(TrySendError::Disconnected(Msg::Line(l))) => Err(l),
            Err(TrySendError::Disconnected(_)) => Ok(()),
        }
    }

    /// Waits until what was queued before is written (or `until`).
    fn flush(&self, until: Instant) -> bool {
        let (ack, done) = mpsc::channel();
        let mut msg = Msg::Flush(ack);
        loop {
            match self.tx.try_send(msg) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < until => {
                    msg = m;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        done.recv_timeout(until.saturating_duration_since(Instant::now())).is_ok()
    }
}

/// [`line`] with the writer given (tests); true: written.
fn emit(stream: Stream, text: &[u8], write: &dyn Fn(Stream, &[u8]) -> std::io::Result<()>) -> bool {
    match write(stream, text) {
        Ok(()) => {
            if stream.gone().swap(false, Ordering::SeqCst) {
                let note = format!("policer: {} works again; lines written meanwhile were dropped\n", stream.name());
                let _ = write(stream.other(), note.as_bytes());
            }
            true
        }
        Err(e) => {
            if !stream.gone().swap(true, Ordering::SeqCst) {
                let note = format!(
                    "policer: {} is gone ({e}): the daemon keeps policing and serving; \
                     its lines to {} are dropped until it works again\n",
                    stream.name(),
                    stream.name()
                );
                // The other stream may be gone too (a closed terminal):
                // nothing more to do then.
                if write(stream.other(), note.as_bytes()).is_err() {
                    stream.other().gone().store(true, Ordering::SeqCst);
                }
            }
            false
        }
    }
}

/// `println!` for the daemon: a line on stdout that never panics.
macro_rules! say {
    ($($t:tt)*) => {
        $crate::daemon::output::line($crate::daemon::output::Stream::Out, format_args!($($t)*))
    };
}

/// `eprintln!` for the daemon: a line on stderr that never panics.
macro_rules! say_err {
    ($($t:tt)*) => {
        $crate::daemon::output::line($crate::daemon::output::Stream::Err, format_args!($($t)*))
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_journal_reads_each_lines_priority() {
        use super::{Stream, frame};
        let f = |j, s, t| String::from_utf8(frame(j, s, t)).unwrap();
        assert_eq!(f(true, Stream::Out, "policer: added the rule"), "<6>policer: added the rule\n");
        assert_eq!(f(true, Stream::Out, "policer: warning: x"), "<4>policer: warning: x\n");
        assert_eq!(f(true, Stream::Err, "policer: the set could not"), "<3>policer: the set could not\n");
        assert_eq!(f(true, Stream::Err, "policer: warning: y"), "<4>policer: warning: y\n");
        // Not the journal's stream: the line as it is.
        assert_eq!(f(false, Stream::Err, "policer: warning: y"), "policer: warning: y\n");
    }

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert_eq!(super::parse_journal_stream("8:12345"), Some((8, 12345)));
        for bad in ["", "8", "8:", ":1", "a:1", "8:12345:1"] {
            assert_eq!(super::parse_journal_stream(bad), None, "{bad}");
        }
    }

    use std::sync::Mutex;

    use super::*;

    /// The flags are the process's: one test at a time touches them.
    static SERIAL: Mutex<()> = Mutex::new(());

    #[test]
    fn a_failing_stream_is_said_once_on_the_other_and_never_panics() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let log = Mutex::new(Vec::<(Stream, String)>::new());
        let out_works = AtomicBool::new(false);
        let write = |s: Stream, b: &[u8]| -> std::io::Result<()> {
            if s == Stream::Out && !out_works.load(Ordering::SeqCst) {
                return Err(std::io::Error::from_raw_os_error(libc::EPIPE));
            }
            log.lock().unwrap().push((s, String::from_utf8_lossy(b).into_owned()));
            Ok(())
        };
        STDOUT_GONE.store(false, Ordering::SeqCst);
        for i in 0..5 {
            emit(Stream::Out, format!("line {i}\n").as_bytes(), &write);
        }
        {
            let l = log.lock().unwrap();
            assert_eq!(l.len(), 1, "said once: {l:?}");
            assert_eq!(l[0].0, Stream::Err);
            assert!(l[0].1.contains("stdout is gone") && l[0].1.contains("keeps policing"), "{l:?}");
        }
        out_works.store(true, Ordering::SeqCst);
        emit(Stream::Out, b"back\n", &write);
        let l = log.lock().unwrap();
        assert_eq!(l.len(), 3, "{l:?}");
        assert_eq!(l[1], (Stream::Out, "back\n".to_string()));
        assert!(l[2].0 == Stream::Err && l[2].1.contains("stdout works again"), "{l:?}");
        assert!(!STDOUT_GONE.load(Ordering::SeqCst));
    }

    /// A stream nobody reads blocks its writer, never the one who prints:
    /// lines past the queue are dropped and counted, and the count is said
    /// once the stream moves again.
    #[test]
    fn a_stream_nobody_reads_drops_lines_instead_of_blocking_and_says_how_many() {
        let (open, gate) = mpsc::channel::<()>();
        let written = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
        let w = written.clone();
        let mut blocked = true;
        let queue = StreamQueue::spawn("test-queue", "stdout", 8, move |b: &[u8]| {
            if blocked {
                // Blocks as a write to a full pipe nobody reads does.
                let _ = gate.recv();
                blocked = false;
            }
            w.lock().unwrap().push(String::from_utf8_lossy(b).into_owned());
            true
        })
        .unwrap();
        let queue = Arc::new(queue);
        // 100 lines while the writer is stuck: the sender never waits.
        let (sent, done) = mpsc::channel();
        let l = queue.clone();
        std::thread::spawn(move || {
            for i in 0..100 {
                l.send(format!("line {i}\n").into_bytes()).unwrap();
            }
            let _ = sent.send(());
        });
        done.recv_timeout(Duration::from_secs(60)).expect("a line waited for a stream nobody reads");
        assert!(written.lock().unwrap().is_empty(), "the writer is still blocked");
        let dropped = queue.dropped.load(Ordering::SeqCst);
        assert!((90..=92).contains(&dropped), "8 queued, one taken by the writer: {dropped} dropped");
        open.send(()).unwrap();
        assert!(queue.flush(Instant::now() + Duration::from_secs(60)), "flushed");
        let w = written.lock().unwrap();
        let lines: Vec<&String> = w.iter().filter(|l| l.starts_with("line ")).collect();
        assert_eq!(lines.len() as u64 + dropped, 100, "{w:?}");
        assert_eq!(lines[0], "line 0\n", "{w:?}");
        let notes: Vec<&String> = w.iter().filter(|l| l.contains("dropped")).collect();
        assert_eq!(notes.len(), 1, "said once: {w:?}");
        assert!(notes[0].contains(&format!("{dropped} lines to stdout were dropped")), "{w:?}");
        assert_eq!(w.last(), Some(notes[0]), "said after the queued lines: {w:?}");
        assert_eq!(queue.dropped.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn both_streams_gone_is_no_panic() {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let write = |_: Stream, _: &[u8]| -> std::io::Result<()> { Err(std::io::Error::from_raw_os_error(libc::EIO)) };
        for _ in 0..3 {
            emit(Stream::Out, b"x\n", &write);
            emit(Stream::Err, b"y\n", &write);
        }
        assert!(STDOUT_GONE.load(Ordering::SeqCst) && STDERR_GONE.load(Ordering::SeqCst));
        STDOUT_GONE.store(false, Ordering::SeqCst);
        STDERR_GONE.store(false, Ordering::SeqCst);
    }
}
