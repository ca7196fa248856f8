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
//! SIGPIPE is ignored by Rust's runtime, so a write to a closed pipe is an
//! EPIPE error here, not a signal. SIGHUP (a terminal closing sends it to
//! its jobs) is `policer reload` (`daemon/mod.rs`): harmless to a daemon
//! whose file did not change.

use std::{
    fmt,
    io::Write,
    sync::atomic::{AtomicBool, Ordering},
};

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

/// One line on `stream`; never fails, never panics.
pub(crate) fn line(stream: Stream, args: fmt::Arguments<'_>) {
    let mut text = fmt::format(args);
    text.push('\n');
    emit(stream, text.as_bytes(), &|s, b| s.write(b));
}

/// [`line`] with the writer given (tests).
fn emit(stream: Stream, text: &[u8], write: &dyn Fn(Stream, &[u8]) -> std::io::Result<()>) {
    match write(stream, text) {
        Ok(()) => {
            if stream.gone().swap(false, Ordering::SeqCst) {
                let note = format!("policer: {} works again; lines written meanwhile were dropped\n", stream.name());
                let _ = write(stream.other(), note.as_bytes());
            }
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
