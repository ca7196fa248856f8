//! Serving the daemon: the control socket ([`control`]) and `/metrics` +
//! `/healthz` ([`http`]).
//!
//! Every connection runs in its own task with a total deadline, a cap on
//! what it may send and a write timeout, and each endpoint serves at most
//! [`MAX_CONNECTIONS`] at once (past that a new connection is closed at
//! once). So a client that connects and says nothing, trickles a byte at a
//! time, or never reads its answer holds only its own task: the owner
//! thread, the counter lines and signals never wait for it.

pub mod control;
pub mod http;

use std::{sync::Arc, time::Duration};

use tokio::sync::{Semaphore, watch};

use crate::daemon::{Owner, Views};

/// Connections served at once per endpoint.
pub const MAX_CONNECTIONS: usize = 512;
/// From accept to the whole request read.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(5);
/// Writing the whole answer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// What every connection task shares.
pub struct Ctx {
    pub owner: Owner,
    pub views: Arc<Views>,
    /// Set when the daemon should exit (its last interface was detached).
    pub stop: watch::Sender<bool>,
}

/// A per-endpoint cap on connections.
pub(crate) fn limiter() -> Arc<Semaphore> {
    Arc::new(Semaphore::new(MAX_CONNECTIONS))
}

/// Runs a read-only view on the blocking pool (map reads are system
/// calls; a table read can take a second).
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(crate::Error::Invalid(format!("internal error: {e}"))))
}
