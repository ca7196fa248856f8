//! `/metrics` (Prometheus) and `/healthz` on hyper's HTTP/1 server: one
//! task per connection, one request per connection, a deadline on the
//! request head and on the whole exchange.

use std::{
    collections::HashMap,
    convert::Infallible,
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Incoming, header, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;

use super::{Ctx, REQUEST_DEADLINE, WRITE_TIMEOUT, blocking, limiter};

/// The whole exchange, from accept to the last byte of the answer.
const EXCHANGE_DEADLINE: Duration = Duration::from_secs(REQUEST_DEADLINE.as_secs() + WRITE_TIMEOUT.as_secs());

/// Connections one client address may hold at once: with `--metrics
/// 0.0.0.0:PORT` a remote client holding idle connections must not use up
/// the endpoint's cap and shut out `/healthz` for everyone else.
pub const MAX_PER_PEER: usize = 64;

/// Connections per client address; a [`PeerSlot`] gives its place back.
#[derive(Default)]
struct Peers(Mutex<HashMap<IpAddr, usize>>);

struct PeerSlot(Arc<Peers>, IpAddr);

impl Peers {
    fn take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerSlot> {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(ip).or_default();
        if *n >= MAX_PER_PEER {
            return None;
        }
        *n += 1;
        Some(PeerSlot(self.clone(), ip))
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut m = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.1);
            }
        }
    }
}

/// Accepts until the runtime ends.
pub async fn run(listener: TcpListener, ctx: Arc<Ctx>) {
    let permits = limiter();
    let peers = Arc::new(Peers::default());
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // Over a cap: close at once rather than queue.
        let Some(slot) = peers.take(peer.ip()) else {
            drop(stream);
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| handle(req, ctx.clone()));
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(REQUEST_DEADLINE)
                .keep_alive(false)
                .serve_connection(TokioIo::new(stream), service);
            // A client that never reads its answer is cut off here.
            let _ = tokio::time::timeout(EXCHANGE_DEADLINE, conn).await;
            drop(permit);
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
    let views = ctx.views.clone();
    Ok(match req.uri().path() {
        "/metrics" => match blocking(move || views.metrics()).await {
            Ok(text) => reply(StatusCode::OK, crate::metrics::CONTENT_TYPE, text),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, "text/plain", format!("{e}\n")),
        },
        "/healthz" => {
            let h = blocking(move || Ok(views.health())).await;
            match h {
                Ok(h) => {
                    let status = if h.healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
                    let mut body = serde_json::to_vec(&h).unwrap_or_default();
                    body.push(b'\n');
                    reply(status, "application/json", body)
                }
                Err(e) => reply(StatusCode::SERVICE_UNAVAILABLE, "text/plain", format!("{e}\n")),
            }
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "see /metrics and /healthz\n"),
    })
}
