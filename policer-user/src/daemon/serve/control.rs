//! The daemon's side of the control socket: one task per connection, one
//! request and one reply (see [`crate::control`] for the protocol).

use std::sync::Arc;

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    time::{Instant, timeout, timeout_at},
};

use super::{Ctx, REQUEST_DEADLINE, WRITE_TIMEOUT, blocking, limiter};
use crate::{
    control::{Envelope, MAX_REQUEST_BYTES, PROTOCOL, Reply, Request},
    daemon::Command,
};

/// Accepts until the runtime ends.
pub async fn run(listener: UnixListener, ctx: Arc<Ctx>) {
    let permits = limiter();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // EMFILE and the like: give the system a moment.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        // Over the cap: close at once rather than queue.
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            serve(stream, &ctx).await;
            drop(permit);
        });
    }
}

/// Reads one request line: at most [`MAX_REQUEST_BYTES`], all of it
/// within [`REQUEST_DEADLINE`] of the accept.
async fn read_request(stream: &mut UnixStream) -> Result<Vec<u8>, String> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut line = Vec::new();
    let mut r = BufReader::new(stream).take(MAX_REQUEST_BYTES as u64 + 1);
    match timeout_at(deadline, r.read_until(b'\n', &mut line)).await {
        Err(_) => Err(format!("no whole request within {} s", REQUEST_DEADLINE.as_secs())),
        Ok(Err(e)) => Err(format!("reading the request: {e}")),
        Ok(Ok(_)) if line.len() > MAX_REQUEST_BYTES => {
            Err(format!("request larger than {} bytes refused", MAX_REQUEST_BYTES))
        }
        Ok(Ok(_)) => Ok(line),
    }
}

async fn serve(mut stream: UnixStream, ctx: &Ctx) {
    let (reply, exit) = match read_request(&mut stream).await {
        Ok(line) => answer(&line, ctx).await,
        Err(e) => (Reply::Refused { error: e }, false),
    };
    let mut text =
        serde_json::to_vec(&reply).unwrap_or_else(|_| b"{\"reply\":\"refused\",\"error\":\"internal\"}".to_vec());
    text.push(b'\n');
    let _ = timeout(WRITE_TIMEOUT, async {
        stream.write_all(&text).await?;
        stream.shutdown().await
    })
    .await;
    // The last interface was detached: the daemon exits, now that the
    // client has its answer.
    if exit {
        ctx.stop.send_replace(true);
    }
}

/// The reply, and whether the daemon should now exit.
async fn answer(line: &[u8], ctx: &Ctx) -> (Reply, bool) {
    let env: Envelope = match serde_json::from_slice(line) {
        Ok(e) => e,
        Err(e) => {
            // Tell an older CLI (no protocol field) what is wrong.
            let old = serde_json::from_slice::<serde_json::Value>(line)
                .ok()
                .is_some_and(|v| v.get("op").is_some() && v.get("protocol").is_none());
            let error = if old {
                "this CLI is another version of policer than the daemon (no protocol version); use the same build"
                    .to_string()
            } else {
                format!("bad request: {e}")
            };
            return (Reply::Refused { error }, false);
        }
    };
    if env.protocol != PROTOCOL {
        let error = format!(
            "the CLI speaks protocol {} and the daemon {PROTOCOL}: use the same build of policer for both",
            env.protocol
        );
        return (Reply::Refused { error }, false);
    }
    let refused = |e: crate::Error| Reply::Refused { error: e.to_string() };
    let change = |cmd| async {
        let out = ctx.owner.ask(cmd).await;
        let reply = match out.result {
            Ok(message) => Reply::Done { message },
            Err(e) => refused(e),
        };
        (reply, out.exit)
    };
    let views = ctx.views.clone();
    match env.request {
        Request::RuleSet { rule, runtime } => change(Command::RuleSet { rule, runtime }).await,
        Request::RuleRm { rule, runtime } => change(Command::RuleRm { rule, runtime }).await,
        Request::Reload => change(Command::Reload).await,
        Request::Detach { iface } => change(Command::Detach { iface }).await,
        Request::RuleLs => (Reply::Rules { rules: views.rules() }, false),
        Request::Status => (Reply::Status(Box::new(views.status())), false),
        Request::Stats => {
            (blocking(move || views.stats()).await.map_or_else(refused, |s| Reply::Stats(Box::new(s))), false)
        }
        Request::Top { n } => (blocking(move || views.top(n)).await.map_or_else(refused, Reply::Top), false),
        Request::Inspect { addr } => {
            (blocking(move || views.inspect(addr)).await.map_or_else(refused, |v| Reply::Inspect(Box::new(v))), false)
        }
        Request::Ban { rule, runtime } => change(Command::Ban { rule, runtime }).await,
        Request::Unban { prefix, runtime } => change(Command::Unban { prefix, runtime }).await,
        Request::BanLs => {
            (blocking(move || views.bans()).await.map_or_else(refused, |bans| Reply::Bans { bans }), false)
        }
        // Read and parsed here, off the owner: the owner only diffs and
        // writes.
        Request::Import { path, shown, set, rule, max_remove, force } => {
            match blocking(move || crate::daemon::read_import(&path, &shown, set, rule, max_remove, force)).await {
                Ok(imp) => change(Command::Import(Box::new(imp))).await,
                Err(e) => (refused(e), false),
            }
        }
        Request::SetRm { name } => change(Command::SetRm { name }).await,
        Request::SetLs { name } => {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let out = ctx.owner.ask(Command::SetLs { name, reply: tx }).await;
            match (out.result, rx.await) {
                (Err(e), _) => (refused(e), false),
                (Ok(_), Ok(Ok(v))) => (Reply::Set(Box::new(v)), false),
                (Ok(_), Ok(Err(e))) => (refused(e), false),
                (Ok(_), Err(_)) => (refused(crate::Error::Invalid("the daemon is shutting down".into())), false),
            }
        }
    }
}
