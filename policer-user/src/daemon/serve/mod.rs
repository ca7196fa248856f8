//! Serving the daemon: the control socket ([`control`]) and `/metrics` +
//! `/healthz` ([`http`]).
//!
//! Every connection runs in its own task with a total deadline, a cap on
//! what it may send and a write timeout, and each endpoint serves at most
//! its cap of connections at once ([`Caps`]). So a client that connects and
//! says nothing, trickles a byte at a time, or never reads its answer holds
//! only its own task: the owner thread, the counter lines and signals never
//! wait for it.
//!
//! Past the cap the two endpoints differ: the control socket answers a
//! new connection "busy" and closes it (its clients are root's CLIs, and an
//! honest "try again" is the answer); the HTTP port sheds the oldest
//! connection that has not sent its request yet, so `/healthz` is answered
//! under any connection load (see [`http`] for why).
//!
//! Views never wait for a thread: a render shared by every request that
//! waits for it ([`render::Shared`]: `/metrics`, `stats`, `/healthz`), or
//! a small pool of their own per kind ([`Pool`]: `top`, `inspect`, an
//! import's read, `ban ls`'s read of the rule counters before it streams), whose permit is awaited before a blocking
//! thread is taken. So a storm of one kind never holds the threads another
//! needs.

pub mod control;
pub mod http;
pub mod render;

use std::{sync::Arc, time::Duration};

use tokio::sync::{Semaphore, watch};

use crate::daemon::{Health, Owner, Views};

/// Connections served at once per endpoint, when the fd budget allows.
pub const MAX_CONNECTIONS: usize = 512;
/// The smallest cap the fd budget lowers an endpoint's to.
pub const MIN_CONNECTIONS: usize = 8;
/// File descriptors kept for what the daemon opens now and then (the
/// config file and its temporary, a set's state file, an import's list,
/// a netlink socket per `/healthz` render, an accepted connection about to
/// be shed), on top of those open when serving starts.
pub const RESERVED_FDS: u64 = 64;
/// From accept to the whole request read.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Writing the whole answer; for a streamed answer (`rule ls --set`), the
/// longest a client may leave a chunk untaken.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Blocking threads of the runtime (`Daemon::run`): the shared renders
/// and the pools take at most [`BLOCKING_USED`] of them; the rest is
/// headroom.
pub const BLOCKING_THREADS: usize = 32;
/// Permits of each pool. `top` reads the whole table (tens of MB for a
/// million sources), an import parses a whole list: few at once.
const TOP_PERMITS: usize = 2;
const INSPECT_PERMITS: usize = 4;
const IMPORT_PERMITS: usize = 2;
const BAN_LS_PERMITS: usize = 2;
/// Shared renders: `/metrics`, `stats`, `/healthz`.
const SHARED_RENDERS: usize = 3;
const BLOCKING_USED: usize = TOP_PERMITS + INSPECT_PERMITS + IMPORT_PERMITS + BAN_LS_PERMITS + SHARED_RENDERS;
const _: () = assert!(BLOCKING_USED <= BLOCKING_THREADS / 2, "the views' threads must leave headroom");

/// Connections each endpoint serves at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    pub control: usize,
    pub http: usize,
}

/// Caps that fit `limit` file descriptors with `open` already in use and
/// [`RESERVED_FDS`] kept aside: [`MAX_CONNECTIONS`] each when they fit,
/// else the room left shared between the endpoints (at least
/// [`MIN_CONNECTIONS`] each), with a sentence for the log.
pub fn fit(limit: u64, open: u64, http: bool) -> (Caps, Option<String>) {
    let want = Caps { control: MAX_CONNECTIONS, http: if http { MAX_CONNECTIONS } else { 0 } };
    let need = (want.control + want.http) as u64;
    let room = limit.saturating_sub(open).saturating_sub(RESERVED_FDS);
    if room >= need {
        return (want, None);
    }
    let share = |n: usize| {
        if n == 0 { 0 } else { ((room * n as u64 / need) as usize).clamp(MIN_CONNECTIONS, n) }
    };
    let caps = Caps { control: share(want.control), http: share(want.http) };
    let why = format!(
        "warning: {limit} file descriptors (RLIMIT_NOFILE), {open} open and {RESERVED_FDS} kept for files: \
         connections capped at {} on the control socket{} instead of {MAX_CONNECTIONS} \
         (raise LimitNOFILE to at least {} for the full caps)",
        caps.control,
        if http { format!(" and {} on the HTTP port", caps.http) } else { String::new() },
        open + RESERVED_FDS + need,
    );
    (caps, Some(why))
}

/// Raises the soft RLIMIT_NOFILE to the hard one (systemd's default soft
/// limit is 1 024, below 512 HTTP and 512 control connections and the
/// daemon's own files). Done first thing at start, so the limit is settled
/// before the daemon says it is policing.
pub fn raise_nofile() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid out-pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
        }
    }
}

/// The connection caps for this process: counts the fds open now (maps,
/// programs, listeners, the config's watch) against RLIMIT_NOFILE (raised
/// at start, [`raise_nofile`]), and lowers the caps when they would not
/// fit, saying so on stdout.
pub fn caps(http: bool) -> Caps {
    raise_nofile();
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit with a valid out-pointer.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        // Unknown: assume the usual default soft limit.
        1024
    } else {
        lim.rlim_cur
    };
    let open = std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or(RESERVED_FDS);
    let (caps, why) = fit(limit, open, http);
    if let Some(why) = why {
        say!("policer: {why}");
    }
    caps
}

/// What every connection task shares.
pub struct Ctx {
    pub owner: Owner,
    pub views: Arc<Views>,
    /// `policer capture` (each capture also holds a control permit).
    pub capture: Arc<crate::daemon::capture::Hub>,
    /// Set when the daemon should exit (its last interface was detached).
    pub stop: watch::Sender<bool>,
    pub caps: Caps,
    pub metrics: render::Shared<bytes::Bytes>,
    pub stats: render::Shared<Arc<crate::control::StatsView>>,
    pub health: render::Shared<Arc<Health>>,
    pub top: Pool,
    pub inspect: Pool,
    pub import: Pool,
    pub ban_ls: Pool,
}

impl Ctx {
    /// Starts the shared renders (on the current runtime).
    pub fn new(
        owner: Owner,
        views: Arc<Views>,
        capture: Arc<crate::daemon::capture::Hub>,
        stop: watch::Sender<bool>,
        caps: Caps,
    ) -> Ctx {
        let v = views.clone();
        // Paced: a scrape storm takes at most half a core of renders.
        let metrics = render::Shared::paced(move || v.metrics());
        let v = views.clone();
        let stats = render::Shared::new(move || v.stats().map(Arc::new));
        let v = views.clone();
        let health = render::Shared::new(move || Ok(Arc::new(v.health())));
        Ctx {
            owner,
            views,
            capture,
            stop,
            caps,
            metrics,
            stats,
            health,
            top: Pool::new(TOP_PERMITS),
            inspect: Pool::new(INSPECT_PERMITS),
            import: Pool::new(IMPORT_PERMITS),
            ban_ls: Pool::new(BAN_LS_PERMITS),
        }
    }
}

/// A small pool of blocking threads for one kind of request: a request
/// waits for a permit as a task, and takes a thread only with one.
pub struct Pool(Semaphore);

impl Pool {
    fn new(permits: usize) -> Pool {
        Pool(Semaphore::new(permits))
    }

    /// Runs `f` on a blocking thread once a permit is free.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> crate::Result<T> + Send + 'static,
    ) -> crate::Result<T> {
        let _permit = self.hold().await?;
        blocking(f).await
    }

    /// A permit, held for as long as the caller keeps it (an import keeps
    /// it until the owner has applied the file it parsed).
    pub async fn hold(&self) -> crate::Result<tokio::sync::SemaphorePermit<'_>> {
        self.0.acquire().await.map_err(|_| crate::Error::ShuttingDown { note: "" })
    }
}

/// Runs `f` on the blocking pool (map reads are system calls; a table
/// read can take a second).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(crate::Error::Invalid(format!("internal error: {e}"))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_fit_the_fd_budget() {
        // systemd's unit (LimitNOFILE=8192), or a raised soft limit: full caps.
        assert_eq!(fit(8192, 40, true), (Caps { control: 512, http: 512 }, None));
        assert_eq!(fit(1024 + 1024, 60, true).0, Caps { control: 512, http: 512 });
        // The default soft limit of 1 024 with no hard limit above it:
        // both lowered, in proportion, and the log says how to get more.
        let (c, why) = fit(1024, 60, true);
        assert_eq!(c, Caps { control: 450, http: 450 });
        assert!(c.control + c.http + 60 + RESERVED_FDS as usize <= 1024);
        let why = why.unwrap();
        assert!(why.contains("450 on the control socket and 450 on the HTTP port"), "{why}");
        assert!(why.contains("at least 1148"), "{why}");
        // Without --metrics the control socket alone fits 1 024.
        assert_eq!(fit(1024, 60, false), (Caps { control: 512, http: 0 }, None));
        // Nearly nothing left: the floor, not zero.
        assert_eq!(fit(100, 90, true).0, Caps { control: MIN_CONNECTIONS, http: MIN_CONNECTIONS });
        assert_eq!(fit(0, 0, false).0.control, MIN_CONNECTIONS);
    }
}
