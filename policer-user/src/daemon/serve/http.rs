//! `/metrics` (Prometheus) and `/healthz` on hyper's HTTP/1 server: one
//! task per connection, one request per connection, a deadline on the
//! request head and on the whole exchange.

use std::{
    collections::{BTreeMap, HashMap},
    convert::Infallible,
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{net::TcpListener, sync::oneshot};

use super::{Ctx, REQUEST_DEADLINE, WRITE_TIMEOUT};

/// The whole exchange, from accept to the last byte of the answer.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(REQUEST_DEADLINE.as_secs() + WRITE_TIMEOUT.as_secs());

/// Connections one client address may hold at once: with `--metrics
/// 0.0.0.0:PORT` one remote client cannot take every slot by itself.
pub const MAX_PER_PEER: usize = 64;

/// The connections being served, oldest first, so that one can be shed
/// when a new one comes at a cap.
///
/// Why shed rather than refuse, and why on this port rather than a
/// listener of `/healthz`'s own: the clients that hold slots without
/// cost to themselves are those that connect and send nothing, or trickle
/// (a few addresses under the per-address cap are enough to take all of
/// them); refusing new connections then shuts out the kubelet's probe and
/// the pod restarts in a loop. A port of its own for `/healthz` would be
/// reachable by the same clients (the DaemonSet is on the host network) and
/// could be filled the same way. Shedding the oldest connection that has
/// not sent its request head makes every new connection servable: a probe
/// or a scrape sends its request at once, so it is never the oldest idle
/// one, and a client holding slots only displaces its own connections.
/// When no connection is idle (all are being answered), the oldest goes:
/// it has had the longest to take its answer.
struct ConnSlots {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// By accept order.
    conns: BTreeMap<u64, Conn>,
    per_peer: HashMap<IpAddr, usize>,
}

struct Conn {
    peer: IpAddr,
    /// Its request head was read: it is being answered.
    answering: Arc<AtomicBool>,
    /// Dropped to shed it.
    _shed: oneshot::Sender<()>,
}

/// A connection's place; gives it back when dropped.
struct ConnSlot {
    slots: Arc<ConnSlots>,
    id: u64,
    answering: Arc<AtomicBool>,
    /// Fires when the connection is shed.
    shed: oneshot::Receiver<()>,
}

impl Inner {
    fn remove(&mut self, id: u64) {
        if let Some(c) = self.conns.remove(&id)
            && let Some(n) = self.per_peer.get_mut(&c.peer)
        {
            *n -= 1;
            if *n == 0 {
                self.per_peer.remove(&c.peer);
            }
        }
    }

    /// The oldest connection not yet answered (of `peer`, when given).
    fn oldest_idle(&self, peer: Option<IpAddr>) -> Option<u64> {
        self.conns
            .iter()
            .find(|(_, c)| peer.is_none_or(|p| c.peer == p) && !c.answering.load(Ordering::Relaxed))
            .map(|(id, _)| *id)
    }
}

impl ConnSlots {
    /// A place for a new connection from `peer`, shedding an idle one when
    /// a cap is reached; `None` when every connection under that cap is
    /// being answered.
    fn take(self: &Arc<Self>, peer: IpAddr) -> Option<ConnSlot> {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if g.per_peer.get(&peer).is_some_and(|n| *n >= MAX_PER_PEER) {
            let victim = g.oldest_idle(Some(peer))?;
            g.remove(victim);
        }
        // Only a connection that has not sent its request is shed: one
        // being answered (a scrape waiting for its render) finishes; with
        // every one being answered the newcomer is refused.
        if g.conns.len() >= self.cap {
            let victim = g.oldest_idle(None)?;
            g.remove(victim);
        }
        let id = g.next;
        g.next += 1;
        let answering = Arc::new(AtomicBool::new(false));
        let (tx, shed) = oneshot::channel();
        g.conns.insert(id, Conn { peer, answering: answering.clone(), _shed: tx });
        *g.per_peer.entry(peer).or_default() += 1;
        Some(ConnSlot { slots: self.clone(), id, answering, shed })
    }
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        self.slots.inner.lock().unwrap_or_else(|p| p.into_inner()).remove(self.id);
    }
}

/// Accepts until the runtime ends.
pub async fn run(listener: TcpListener, ctx: Arc<Ctx>) {
    let slots = Arc::new(ConnSlots { cap: ctx.caps.http, inner: Mutex::default() });
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let Some(mut slot) = slots.take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let answering = slot.answering.clone();
            let service = service_fn(move |req| {
                answering.store(true, Ordering::Relaxed);
                handle(req, ctx.clone())
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_DEADLINE)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                // A client that never reads its answer is cut off here.
                _ = tokio::time::timeout(EXCHANGE_DEADLINE, conn) => {}
                // Shed for a newer connection: dropping it closes it.
                _ = &mut slot.shed => {}
            }
            drop(slot);
        });
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    r
}

async fn handle(req: Request<Incoming>, ctx: Arc<Ctx>) -> Result<Response<Full<Bytes>>, Infallible> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return Ok(reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n"));
    }
    Ok(match req.uri().path() {
        "/metrics" => match ctx.metrics.get().await {
            Ok(text) => reply(StatusCode::OK, crate::metrics::CONTENT_TYPE, text),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
        },
        "/healthz" => match ctx.health.get().await {
            Ok(h) => {
                let status = if h.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                let mut body = serde_json::to_vec(&*h).unwrap_or_default();
                body.push(b'\n');
                reply(status, "application/json", body)
            }
            Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{e}\n")),
        },
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "see /metrics and /healthz\n"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    fn shed(s: &mut ConnSlot) -> bool {
        !matches!(s.shed.try_recv(), Err(oneshot::error::TryRecvError::Empty))
    }

    /// At the cap the oldest connection without a request goes, never one
    /// being answered; with every one answered the newcomer is refused.
    #[test]
    fn at_the_cap_the_oldest_idle_connection_is_shed() {
        let slots = Arc::new(ConnSlots { cap: 3, inner: Mutex::default() });
        let mut a = slots.take(ip(1)).unwrap();
        let mut b = slots.take(ip(2)).unwrap();
        let mut c = slots.take(ip(3)).unwrap();
        a.answering.store(true, Ordering::Relaxed);
        let mut d = slots.take(ip(4)).unwrap();
        assert!(!shed(&mut a) && shed(&mut b) && !shed(&mut c) && !shed(&mut d));
        drop(b);
        assert_eq!(slots.inner.lock().unwrap().conns.len(), 3);
        // Every one answering: none is cut off mid-answer, the newcomer is
        // refused, and gets a place once one is done.
        c.answering.store(true, Ordering::Relaxed);
        d.answering.store(true, Ordering::Relaxed);
        assert!(slots.take(ip(5)).is_none());
        assert!(!shed(&mut a) && !shed(&mut c) && !shed(&mut d));
        drop(a);
        let e = slots.take(ip(5)).unwrap();
        // Dropped slots give their places back.
        drop((c, d, e));
        let g = slots.inner.lock().unwrap();
        assert!(g.conns.is_empty() && g.per_peer.is_empty());
    }

    /// One address past its own cap displaces its own oldest idle
    /// connection, not another address's; with none idle it is refused.
    #[test]
    fn an_address_at_its_cap_displaces_only_its_own() {
        let slots = Arc::new(ConnSlots { cap: 1000, inner: Mutex::default() });
        let mut other = slots.take(ip(9)).unwrap();
        let mut mine: Vec<ConnSlot> = (0..MAX_PER_PEER).map(|_| slots.take(ip(1)).unwrap()).collect();
        let mut next = slots.take(ip(1)).unwrap();
        assert!(shed(&mut mine[0]) && !shed(&mut mine[1]) && !shed(&mut other) && !shed(&mut next));
        mine.remove(0);
        mine.push(next);
        for s in &mine {
            s.answering.store(true, Ordering::Relaxed);
        }
        assert!(slots.take(ip(1)).is_none());
        assert!(slots.take(ip(2)).is_some());
    }
}
