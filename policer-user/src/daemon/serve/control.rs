//! The daemon's side of the control socket: one task per connection, one
//! request and one reply (see [`crate::control`] for the protocol).

use std::{fmt::Write as _, sync::Arc, time::Duration};

use tokio::{
    io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
    net::{UnixListener, UnixStream},
    sync::Semaphore,
    time::{Instant, timeout, timeout_at},
};

use super::{Ctx, REQUEST_DEADLINE, WRITE_TIMEOUT};
use crate::{
    control::{Envelope, MAX_REQUEST_BYTES, PROTOCOL, Reply, Request},
    daemon::{
        Command, Response,
        views::{BanLs, SetRow},
    },
    loader::MapReader,
};

/// Accepts until the runtime ends.
pub async fn run(listener: UnixListener, ctx: Arc<Ctx>) {
    let cap = ctx.caps.control;
    let permits = Arc::new(Semaphore::new(cap));
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            // EMFILE and the like: give the system a moment.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            continue;
        };
        // Over the cap: answer "busy" and close, rather than queue. The
        // answer is a hundred bytes into an empty socket buffer: the write
        // does not block. The request is left unread, so the client may
        // see a reset after the answer; the CLI reads the answer first.
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            let in_use = cap - permits.available_permits();
            let _ = stream.try_write(&Reply::busy(in_use, cap).line());
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

/// What a request gets: a reply, or a set's entries to stream.
enum Outgoing {
    /// The reply, and whether the daemon should now exit.
    Reply(Reply, bool),
    Set(Box<SetRow>),
    /// `ban ls`: its rows stream as they are read.
    Bans(Box<BanLs>),
    /// A capture: its answer streams until it ends (`daemon::capture`).
    Capture(crate::capture::CaptureSpec),
}

async fn serve(mut stream: UnixStream, ctx: &Ctx) {
    // Who asks (the socket is root's only, but root is many people): for
    // the audit line of each change.
    let who = match stream.peer_cred() {
        Ok(c) => match c.pid() {
            Some(pid) => format!("uid {} pid {pid}", c.uid()),
            None => format!("uid {}", c.uid()),
        },
        Err(_) => "an unknown peer".to_string(),
    };
    let answer = match read_request(&mut stream).await {
        Ok(line) => answer(&line, ctx, &who).await,
        Err(e) => Outgoing::Reply(Reply::refused(e), false),
    };
    match answer {
        Outgoing::Reply(reply, exit) => {
            let text = reply.line();
            let _ = timeout(WRITE_TIMEOUT, async {
                stream.write_all(&text).await?;
                stream.shutdown().await
            })
            .await;
            // The last interface was detached: the daemon exits, now that
            // the client has its answer.
            if exit {
                ctx.stop.send_replace(true);
            }
        }
        Outgoing::Set(row) => {
            let _ = timeout(STREAM_DEADLINE, stream_set(&mut stream, &row, WRITE_TIMEOUT)).await;
        }
        Outgoing::Bans(ls) => {
            let reader = ctx.views.map_reader().clone();
            let _ = timeout(STREAM_DEADLINE, stream_bans(&mut stream, &ls, &reader, WRITE_TIMEOUT)).await;
        }
        Outgoing::Capture(spec) => {
            crate::daemon::capture::serve(stream, &ctx.capture, ctx.views.capture_names(), spec, ctx.stop.subscribe())
                .await;
        }
    }
}

/// A chunk of a streamed answer (a set's entries, `ban ls`): what one
/// client costs the daemon while it takes the answer.
const STREAM_CHUNK_BYTES: usize = 32 << 10;
/// The longest a streamed answer may take as a whole: a client that reads,
/// but slower than this allows, is dropped too (a million entries are
/// ~20 MB: a second or two for one that reads).
const STREAM_DEADLINE: Duration = Duration::from_secs(120);

/// One JSON reply line written in chunks as it is formatted: memory stays
/// one chunk per client however long the answer, and a client that leaves
/// a chunk untaken for `stall` is dropped. Each chunk lets other tasks
/// run, so streaming a million entries delays no other connection by more
/// than one chunk's formatting.
struct Chunked<'a, W> {
    w: &'a mut W,
    buf: String,
    stall: Duration,
}

impl<'a, W: tokio::io::AsyncWrite + Unpin> Chunked<'a, W> {
    fn new(w: &'a mut W, stall: Duration) -> Self {
        Chunked { w, buf: String::with_capacity(STREAM_CHUNK_BYTES + 1024), stall }
    }

    /// Writes what is formatted once it is a chunk.
    async fn flush_full(&mut self) -> std::io::Result<()> {
        if self.buf.len() >= STREAM_CHUNK_BYTES {
            timeout(self.stall, self.w.write_all(self.buf.as_bytes()))
                .await
                .map_err(|_| std::io::ErrorKind::TimedOut)??;
            self.buf.clear();
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    /// Writes the rest and closes the writing side.
    async fn finish(self) -> std::io::Result<()> {
        timeout(self.stall, async {
            self.w.write_all(self.buf.as_bytes()).await?;
            self.w.shutdown().await
        })
        .await
        .map_err(|_| std::io::ErrorKind::TimedOut)?
    }
}

/// Writes the set's reply (the same JSON line as `Reply::Set`) in chunks
/// ([`Chunked`]); the entries themselves are shared with the snapshot.
async fn stream_set<W: tokio::io::AsyncWrite + Unpin>(w: &mut W, row: &SetRow, stall: Duration) -> std::io::Result<()> {
    let mut out = Chunked::new(w, stall);
    let rule = serde_json::to_string(&row.view).map_err(std::io::Error::other)?;
    let _ = write!(out.buf, "{{\"reply\":\"set\",\"rule\":{rule},\"entries\":[");
    for (i, n) in row.entries.iter().enumerate() {
        let _ = write!(out.buf, "{}\"{n}\"", if i == 0 { "" } else { "," });
        out.flush_full().await?;
    }
    out.buf.push_str("]}\n");
    out.finish().await
}

/// Entries of the ban store read per system call while streaming: a batch
/// is read between two writes on the connection's task (tens of µs).
const BAN_BATCH: usize = 256;

/// Writes `ban ls`'s reply (the same JSON line as `Reply::Bans`) in chunks
/// ([`Chunked`]) as its rows are made: the manual bans from the snapshot,
/// then the ban store a batch at a time. Nothing holds the list: 100 000
/// bans cost the daemon one chunk and one batch per client. The rows are
/// not sorted (that needs them all): manual bans by prefix, then automatic
/// ones in the store's order. A store read that fails midway cuts the
/// answer short (the client says so); it cannot be a refusal any more.
async fn stream_bans<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    ls: &BanLs,
    reader: &MapReader,
    stall: Duration,
) -> std::io::Result<()> {
    let mut out = Chunked::new(w, stall);
    out.buf.push_str("{\"reply\":\"bans\",\"bans\":[");
    let mut first = true;
    let mut row = |buf: &mut String, v: &crate::control::BanView| -> std::io::Result<()> {
        if !std::mem::take(&mut first) {
            buf.push(',');
        }
        buf.push_str(&serde_json::to_string(v).map_err(std::io::Error::other)?);
        Ok(())
    };
    for v in ls.manual() {
        row(&mut out.buf, &v)?;
        out.flush_full().await?;
    }
    let mut store = reader.ban_batches(BAN_BATCH);
    let mut batch = Vec::with_capacity(BAN_BATCH);
    loop {
        store.next_batch(&mut batch).map_err(std::io::Error::other)?;
        if batch.is_empty() {
            break;
        }
        let (now_ms, now_ns) = (crate::duration::unix_ms(), crate::duration::monotonic_ns());
        for (k, b) in &batch {
            if let Some(v) = ls.auto(k, b, now_ms, now_ns) {
                row(&mut out.buf, &v)?;
            }
        }
        out.flush_full().await?;
    }
    out.buf.push_str("]}\n");
    out.finish().await
}

/// The answer, and whether the daemon should now exit.
/// The longest a read (`stats`, `top`, `inspect`, `ban ls`) waits for its
/// render: a wedged one must not keep its control permit for ever (every
/// later request would find the daemon busy). The CLI gives up at 30 s.
const READ_DEADLINE: Duration = Duration::from_secs(30);

async fn bounded<T>(f: impl std::future::Future<Output = crate::Result<T>>) -> crate::Result<T> {
    timeout(READ_DEADLINE, f).await.unwrap_or_else(|_| {
        Err(crate::Error::Invalid(format!("the daemon's read did not finish within {} s", READ_DEADLINE.as_secs())))
    })
}

/// The answer to a request line from `who`: a read, made here (off the
/// owner), or a change through the owner.
async fn answer(line: &[u8], ctx: &Ctx, who: &str) -> Outgoing {
    let env = match envelope(line) {
        Ok(env) => env,
        Err(error) => return Outgoing::Reply(Reply::refused(error), false),
    };
    let views = ctx.views.clone();
    match env.request {
        Request::RuleLs => read(Reply::Rules { rules: views.rules() }),
        Request::Status => read(Reply::Status(Box::new(views.status()))),
        Request::Stats => {
            read(bounded(ctx.stats.get()).await.map_or_else(refused, |s| Reply::Stats(Box::new((*s).clone()))))
        }
        Request::Top { n } => {
            read(bounded(ctx.top.run(move || views.top(n))).await.map_or_else(refused, |t| Reply::Top(Box::new(t))))
        }
        Request::Inspect { addr, frame } => read(
            bounded(ctx.inspect.run(move || views.inspect(addr, &frame)))
                .await
                .map_or_else(refused, |v| Reply::Inspect(Box::new(v))),
        ),
        // Streamed by this connection as the store is read; the rule
        // counters (each manual ban's drops) are read first, in their pool.
        Request::BanLs => match bounded(ctx.ban_ls.run(move || views.ban_ls())).await {
            Ok(ls) => Outgoing::Bans(Box::new(ls)),
            Err(e) => read(refused(e)),
        },
        Request::Import { path, shown, set, rule, max_remove, force, runtime, skip_protected, mmdb } => {
            let reading = move || {
                crate::daemon::read_import(&path, &shown, set, rule, max_remove, force, mmdb)
                    .map(|imp| crate::daemon::Import { runtime, skip_protected, ..imp })
            };
            import(ctx, who, reading).await
        }
        // Judged and planned by the owner as the change would be, nothing
        // written nor put in the audit trail; the live sources are judged
        // here, off the owner, in the pool of the table reads.
        Request::DryRun { change } => dry_run(*change, ctx).await,
        // From the snapshot, off the owner: a million entries are streamed
        // by this connection, and no change waits for them.
        Request::Capture { spec } => Outgoing::Capture(spec),
        Request::ChainLs { iface } => match views.chain_ls(iface.as_deref()) {
            Ok(chains) => read(Reply::Chains { chains }),
            Err(e) => read(refused(e)),
        },
        Request::SetLs { name } => match views.set(&name) {
            Ok(row) => Outgoing::Set(Box::new(row)),
            Err(e) => read(refused(e)),
        },
        // Every other request is a change through the owner.
        other => match Command::try_from(other) {
            Ok(cmd) => make_change(ctx, who, cmd).await,
            Err(r) => read(Reply::refused(format!("not a request this daemon serves: {r:?}"))),
        },
    }
}

/// The request of a line, or why it is refused: not a request, or one of
/// another protocol version.
fn envelope(line: &[u8]) -> Result<Envelope, String> {
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
            return Err(error);
        }
    };
    if env.protocol != PROTOCOL {
        let error = format!(
            "the CLI speaks protocol {} and the daemon {PROTOCOL}: use the same build of policer for both",
            env.protocol
        );
        return Err(error);
    }
    Ok(env)
}

/// A refusal saying `e`.
fn refused(e: crate::Error) -> Reply {
    Reply::refused(e.to_string())
}

/// The answer of a read: a reply, after which the daemon goes on.
fn read(reply: Reply) -> Outgoing {
    Outgoing::Reply(reply, false)
}

/// A change through the owner, put in the audit trail as made by `who`.
async fn make_change(ctx: &Ctx, who: &str, cmd: Command) -> Outgoing {
    let out = ctx.owner.ask(cmd).await;
    let reply = match out.result {
        Ok(response) => {
            // The audit trail: every change made through the socket, by
            // whom, with what it changed (old → new where it has one).
            ctx.views.audit().record(who, response.message());
            match response {
                Response::Done(message) => Reply::Done { message, counts: None },
                Response::Imported { message, counts } => Reply::Done { message, counts: Some(counts) },
                Response::Previewed(_) => Reply::refused("a change answered with a dry run's plan".to_string()),
            }
        }
        Err(e) => refused(e),
    };
    Outgoing::Reply(reply, out.exit)
}

/// An import: `reading` reads and parses the list here, off the owner
/// (the owner only diffs and writes). The pool's permit is held until the
/// owner has applied the import: it bounds the parsed files held in memory
/// (a list can be 1 GiB), not only the parsing.
async fn import(
    ctx: &Ctx,
    who: &str,
    reading: impl FnOnce() -> crate::Result<crate::daemon::Import> + Send + 'static,
) -> Outgoing {
    match ctx.import.hold().await {
        Err(e) => read(refused(e)),
        Ok(_permit) => {
            let imp = super::blocking(reading);
            match imp.await {
                Ok(imp) => make_change(ctx, who, Command::Import(Box::new(imp))).await,
                Err(e) => read(refused(e)),
            }
        }
    }
}

/// `--dry-run` of the change `request`: previewed by the owner, then the
/// live sources judged (`daemon::judge_live`).
async fn dry_run(request: Request, ctx: &Ctx) -> Outgoing {
    let cmd = match request {
        Request::Import { path, shown, set, rule, max_remove, force, runtime, skip_protected, mmdb } => {
            let imp = match ctx.import.hold().await {
                Err(e) => return read(refused(e)),
                Ok(_permit) => {
                    super::blocking(move || {
                        crate::daemon::read_import(&path, &shown, set, rule, max_remove, force, mmdb)
                            .map(|imp| crate::daemon::Import { runtime, skip_protected, ..imp })
                    })
                    .await
                }
            };
            match imp {
                Ok(imp) => Command::Import(Box::new(imp)),
                Err(e) => return read(refused(e)),
            }
        }
        // The owner says which changes it previews.
        other => match Command::try_from(other) {
            Ok(cmd) => cmd,
            Err(_) => {
                return read(Reply::refused(
                    "--dry-run is for rule set, rule rm, rule import, ban and reload".to_string(),
                ));
            }
        },
    };
    let out = ctx.owner.ask(Command::Preview(Box::new(cmd))).await;
    match out.result {
        Err(e) => read(refused(e)),
        Ok(Response::Done(_) | Response::Imported { .. }) => {
            read(Reply::refused("the dry run planned nothing".to_string()))
        }
        Ok(Response::Previewed(p)) => {
            let reader = ctx.views.reader();
            let judged = ctx
                .top
                .run(move || {
                    let mut v = p.view();
                    v.live = crate::daemon::judge_live(&reader, &p, crate::daemon::DRY_RUN_WINDOW);
                    Ok(v)
                })
                .await;
            read(judged.map_or_else(refused, |v| Reply::DryRun(Box::new(v))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::{RuleView, SetView};

    /// The changes become the owner's commands; reads, an import (read
    /// first) and a dry run come back as they were.
    #[test]
    fn a_change_request_is_a_command_and_nothing_else_is() {
        let rule = crate::rules::RuleConfig { prefix: "10.0.0.0/8".into(), ..Default::default() };
        let changes = [
            Request::RuleSet { rule: rule.clone(), runtime: true, replace: false, force: false },
            Request::RuleRm { rule: rule.clone(), runtime: false },
            Request::Reload { discard_runtime: true, candidate: None },
            Request::Detach { iface: "eth0".into(), hand_over: false, force: false },
            Request::Ban { rule: rule.clone(), runtime: false, force: true, state: false },
            Request::Unban { prefix: "10.0.0.0/8".into(), runtime: true },
            Request::SetRm { name: "feed".into() },
        ];
        for r in changes {
            let shown = format!("{r:?}");
            let cmd = Command::try_from(r).unwrap_or_else(|r| panic!("{r:?} is a change"));
            // Same variant, same fields.
            let (want, got) = (shown.split([' ', '{']).next().unwrap(), format!("{cmd:?}"));
            assert!(got.starts_with(want) && got.contains("runtime") == shown.contains("runtime"), "{shown} -> {got}");
        }
        for r in [Request::RuleLs, Request::Status, Request::Stats, Request::BanLs, Request::SetLs { name: "x".into() }]
        {
            assert!(Command::try_from(r).is_err());
        }
    }

    fn row(entries: &[&str]) -> SetRow {
        let spec = crate::rules::RuleConfig {
            prefix: "0.0.0.0/0".into(),
            action: Some(policer_common::bucket::Action::Deny),
            ..Default::default()
        }
        .validate()
        .unwrap();
        let view: RuleView = serde_json::from_value(serde_json::json!({
            "prefix": "set:feed", "action": "deny", "rate": null, "burst": null, "unit": "packets",
            "key_len": 32, "persisted": true, "set": "feed", "entries": entries.len(),
        }))
        .unwrap();
        SetRow {
            view,
            slot: 3,
            spec4: spec.clone(),
            spec6: spec,
            entries: Arc::new(entries.iter().map(|e| e.parse().unwrap()).collect()),
            labels: None,
        }
    }

    /// The streamed answer is the JSON line `Reply::Set` would be, in
    /// chunks, for an empty set, a small one and one of many chunks.
    #[tokio::test]
    async fn a_streamed_set_is_the_set_reply() {
        let many: Vec<String> = (0..20_000u32).map(|i| format!("{}/32", std::net::Ipv4Addr::from(i))).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for entries in [&[][..], &["10.0.0.0/8", "2001:db8::/32"][..], &many[..]] {
            let r = row(entries);
            let mut out = Vec::new();
            stream_set(&mut out, &r, Duration::from_secs(1)).await.unwrap();
            assert_eq!(out.last(), Some(&b'\n'));
            assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
            let got: Reply = serde_json::from_slice(&out).unwrap();
            let want = SetView { rule: r.view.clone(), entries: entries.iter().map(|e| e.to_string()).collect() };
            match got {
                Reply::Set(v) => assert_eq!(*v, want),
                other => panic!("{other:?}"),
            }
        }
    }

    /// A client that takes nothing is dropped after the stall timeout; the
    /// daemon holds one chunk for it, not the answer.
    #[tokio::test]
    async fn a_client_that_does_not_read_is_dropped() {
        let many: Vec<String> = (0..100_000u32).map(|i| format!("{}/32", std::net::Ipv4Addr::from(i))).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        let r = row(&many);
        let (mut ours, theirs) = tokio::io::duplex(64 << 10);
        let t0 = std::time::Instant::now();
        let e = stream_set(&mut ours, &r, Duration::from_millis(200)).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
        assert!(t0.elapsed() < Duration::from_secs(2));
        drop(theirs);
    }
}
