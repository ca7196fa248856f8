//! The CrowdSec bouncer and watcher (`[crowdsec]`): a task on the daemon's
//! runtime that pulls the Local API's decision stream into a set through
//! the owner (one atomic replacement per change, diff-written), ends each
//! decision at its own end, keeps what is in force when the Local API is
//! down, and with `publish = true` posts the daemon's automatic bans as
//! alerts, so every bouncer of a fleet enforces them.
//!
//! What is in force is also written to `STATE_DIR/feeds/SET.json`, so a
//! restart while the Local API is down starts with it (each decision still
//! ends at its own end). The key and the password are never logged.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::sync::mpsc;

use super::{Command, Owner, Views, bans::AutoBan};
use crate::{
    control::FeedStatus,
    crowdsec::{Applied, Pull, Restore, Settings, Store, Url},
    error::{Error, Result},
    rules::RuleConfig,
};

/// One request's whole time (connect, send, the reply's last byte).
const TIMEOUT: Duration = Duration::from_secs(30);
/// The start's check of the key waits this long at most.
const START_CHECK: Duration = Duration::from_secs(5);
/// A reply larger than this is refused (a million decisions are ~150 MB).
const MAX_BODY: usize = 512 << 20;
/// Failed pulls are tried again after `update_frequency`, twice as long
/// after each failure, up to this: a Local API back from an outage is
/// pulled within a minute.
const BACKOFF_MAX: Duration = Duration::from_secs(60);
/// Ends of decisions are taken at most this often (decisions end within
/// a second of their end: thousands of ends a minute make one change a
/// second, not one each).
const EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// While pulls are refused for `max_cover`, the refusal is logged again at
/// most this often (other failures are logged at the first of a run).
const COVER_WARN_EVERY: Duration = Duration::from_secs(60);

/// Automatic bans waiting to be posted at most; past it they are counted
/// and dropped (the ban itself is in force here regardless).
pub const PUBLISH_QUEUE: usize = 10_000;
/// Alerts per POST.
const PUBLISH_BATCH: usize = 500;
/// The scenario of the alerts of automatic bans.
const SCENARIO: &str = "policer/auto-ban";
/// The origin of their decisions: `crowdsec`, that of a decision a
/// watcher (a machine of the Local API, as the daemon is with `publish`)
/// takes from its scenario. The operator's views list no other by
/// default: `cscli decisions list` and `cscli alerts list` (CrowdSec 1.4
/// and 1.5) show only alerts with a decision of origin `crowdsec` or
/// `cscli` unless given `--all` or `--origin`, so decisions of origin
/// `policer` were served to every bouncer and listed by neither.
/// Policer's bans are told apart by their scenario and machine.
const ORIGIN: &str = "crowdsec";

/// A failed request, by kind (the `errors` label).
#[derive(Debug)]
pub(crate) enum HttpError {
    Connect(String),
    Timeout,
    Status(u16, String),
    Body(String),
}

impl HttpError {
    pub(crate) fn kind(&self) -> String {
        match self {
            HttpError::Connect(_) => "connect".into(),
            HttpError::Timeout => "timeout".into(),
            HttpError::Status(c, _) => format!("http_{c}"),
            HttpError::Body(_) => "body".into(),
        }
    }
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Connect(e) => write!(f, "cannot connect: {e}"),
            HttpError::Timeout => write!(f, "no whole answer within {} s", TIMEOUT.as_secs()),
            HttpError::Status(403, _) | HttpError::Status(401, _) => {
                write!(f, "the Local API refused the credentials (HTTP 403/401): check api_key / the machine login")
            }
            HttpError::Status(c, body) => write!(f, "HTTP {c}: {body}"),
            HttpError::Body(e) => write!(f, "reading the answer: {e}"),
        }
    }
}

/// One HTTP/1.1 request on a connection of its own (hyper's client
/// connection; no pool: a pull every few seconds needs none): the answer's
/// head, its body to read.
pub(crate) async fn send(
    url: &Url,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> std::result::Result<hyper::Response<hyper::body::Incoming>, HttpError> {
    let go = async {
        let stream =
            tokio::net::TcpStream::connect(url.authority()).await.map_err(|e| HttpError::Connect(e.to_string()))?;
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(stream))
            .await
            .map_err(|e| HttpError::Connect(e.to_string()))?;
        // The connection's driver ends with the exchange, or with the
        // timeout (a peer that never closes is not waited on for ever).
        tokio::spawn(tokio::time::timeout(timeout, conn));
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", url.authority())
            .header("user-agent", concat!("policer/", env!("CARGO_PKG_VERSION")));
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req =
            req.body(Full::new(Bytes::from(body.unwrap_or_default()))).map_err(|e| HttpError::Body(e.to_string()))?;
        send.send_request(req).await.map_err(|e| HttpError::Connect(e.to_string()))
    };
    tokio::time::timeout(timeout, go).await.unwrap_or(Err(HttpError::Timeout))
}

/// A whole body, up to [`MAX_BODY`].
async fn read_body(body: hyper::body::Incoming) -> std::result::Result<Bytes, HttpError> {
    Ok(Limited::new(body, MAX_BODY).collect().await.map_err(|e| HttpError::Body(e.to_string()))?.to_bytes())
}

/// The error of a status other than 2xx, with the start of its body.
fn status_error(status: hyper::StatusCode, body: &[u8]) -> HttpError {
    let text: String = String::from_utf8_lossy(body).chars().take(200).collect();
    HttpError::Status(status.as_u16(), crate::text::escaped(text.trim()))
}

/// One request and its whole answer (an error unless 2xx).
pub(crate) async fn request(
    url: &Url,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> std::result::Result<Bytes, HttpError> {
    let go = async {
        let resp = send(url, method, path, headers, body, timeout).await?;
        let status = resp.status();
        let bytes = read_body(resp.into_body()).await?;
        if !status.is_success() {
            return Err(status_error(status, &bytes));
        }
        Ok(bytes)
    };
    tokio::time::timeout(timeout, go).await.unwrap_or(Err(HttpError::Timeout))
}

/// At start: whether the Local API takes the key (a cheap query that
/// changes nothing). A refused key fails the start; a Local API that does
/// not answer does not (the feed retries, and says so).
pub fn check_at_start(s: &Settings) -> Result<Option<String>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let path = format!("{}v1/decisions?ip=192.0.2.255", s.url.base);
    match rt.block_on(request(&s.url, "GET", &path, &[("X-Api-Key", &s.api_key)], None, START_CHECK)) {
        Ok(_) => {}
        Err(e @ HttpError::Status(401 | 403, _)) => {
            return Err(Error::Invalid(format!(
                "crowdsec: the Local API at {}: {e}; nothing started (`cscli bouncers add NAME -o raw` prints a key)",
                s.url_text
            )));
        }
        Err(e) => {
            return Ok(Some(format!(
                "crowdsec: the Local API at {} does not answer yet ({e}); policing starts without its decisions \
                 and pulls them once it does",
                s.url_text
            )));
        }
    }
    // Publishing: the machine's login too, so a wrong password is said now
    // rather than found at the first automatic ban.
    let Some((id, password)) = &s.publish else { return Ok(None) };
    let body = serde_json::json!({ "machine_id": id, "password": password, "scenarios": [SCENARIO] });
    let path = format!("{}v1/watchers/login", s.url.base);
    match rt.block_on(request(&s.url, "POST", &path, &[], Some(body.to_string().into_bytes()), START_CHECK)) {
        Ok(_) => Ok(None),
        Err(HttpError::Status(401 | 403, _)) => Err(Error::Invalid(format!(
            "crowdsec: the Local API at {} refused the login of machine '{}' (publish = true): check machine_id \
             and password (`cscli machines add NAME --password …`, or `cscli machines validate NAME`); nothing \
             started",
            s.url_text,
            crate::text::escaped(id)
        ))),
        Err(e) => Ok(Some(format!(
            "crowdsec: the Local API at {} does not answer yet ({e}); policing starts without its decisions \
             and pulls them once it does",
            s.url_text
        ))),
    }
}

/// What the feed task needs.
pub struct Feed {
    pub settings: Settings,
    pub owner: Owner,
    pub views: Arc<Views>,
    /// `STATE_DIR/feeds/`.
    pub dir: PathBuf,
    pub publish: Option<mpsc::Receiver<AutoBan>>,
}

/// The feed's own file of what is in force.
fn state_file(dir: &Path, set: &str) -> PathBuf {
    dir.join(format!("{set}.json"))
}

fn unix_s() -> f64 {
    crate::duration::unix_ms() as f64 / 1000.0
}

struct Run {
    s: Arc<Settings>,
    owner: Owner,
    views: Arc<Views>,
    status: Arc<Mutex<FeedStatus>>,
    /// The decisions in force. Parsing, applying, ending, listing and
    /// saving them run on the blocking pool (a million decisions are
    /// seconds of work), never on the runtime's two workers that serve
    /// control requests; the task awaits each, so it is never contended
    /// while the task itself looks at it.
    store: Arc<Mutex<Store>>,
    file: PathBuf,
    /// The store changed since the set was last written (an import is
    /// due; tried again after a failure).
    dirty: bool,
    /// The store changed since the state file was last written.
    unsaved: bool,
    /// Whether a pull of this daemon has succeeded yet.
    synced: Synced,
    /// The last pull was refused for `max_cover`; when that was last logged.
    cover: CoverWarn,
    token: Option<(String, Instant)>,
    pending: Vec<AutoBan>,
}

/// A refusal for `max_cover` is not a passing outage: the operator must
/// act (the Local API's decisions or the bound). It is logged again once a
/// [`COVER_WARN_EVERY`] while pulls are refused for it.
#[derive(Debug, Default)]
struct CoverWarn {
    refused: bool,
    logged: Option<tokio::time::Instant>,
}

impl CoverWarn {
    /// A pull ended at `now`, refused for `max_cover` or not: whether its
    /// refusal is to be logged now.
    fn pulled(&mut self, refused: bool, now: tokio::time::Instant) -> bool {
        self.refused = refused;
        if !refused {
            self.logged = None;
            return false;
        }
        if self.logged.is_some_and(|t| now < t + COVER_WARN_EVERY) {
            return false;
        }
        self.logged = Some(now);
        true
    }
}

/// When a good pull makes an import: when it changed the set's values, or
/// when it is this daemon's first (an empty feed's set is still created;
/// what the restored set holds is made the pulled truth). A later startup
/// pull (after any failed one: a Local API restart, one 503) that changes
/// nothing imports nothing: a million decisions are not written again.
#[derive(Debug, Default)]
struct Synced(bool);

impl Synced {
    /// A pull succeeded that changed the set's values or not: whether an
    /// import is due.
    fn pulled(&mut self, changed: bool) -> bool {
        let first = !std::mem::replace(&mut self.0, true);
        changed || first
    }
}

fn lock(m: &Mutex<Store>) -> std::sync::MutexGuard<'_, Store> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why a pull failed: its `errors` kind and what to say.
struct PullError {
    kind: String,
    why: String,
}

/// What a pull did, to count and log.
struct Pulled {
    applied: Applied,
    received: u64,
    skipped: std::collections::BTreeMap<String, u64>,
    examples: Vec<(crate::crowdsec::Skip, String)>,
    held: usize,
}

/// The answer's body as the parser's reader: chunks as they arrive, on the
/// blocking pool (the runtime forwards them; the answer is never whole in
/// memory).
struct BodyReader {
    rx: mpsc::Receiver<std::result::Result<Bytes, String>>,
    cur: Bytes,
}

impl std::io::Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(Ok(b)) => self.cur = b,
                Some(Err(e)) => return Err(std::io::Error::other(e)),
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        bytes::Buf::advance(&mut self.cur, n);
        Ok(n)
    }
}

impl Run {
    fn status(&self, f: impl FnOnce(&mut FeedStatus)) {
        if let Ok(mut s) = self.status.lock() {
            f(&mut s);
        }
    }

    fn error(&self, kind: &str, why: &str) {
        self.status(|s| *s.errors.entry(kind.to_string()).or_insert(0) += 1);
        log::debug!("crowdsec: {kind}: {why}");
    }

    /// `f` on the store, on the blocking pool; `None` if it panicked.
    async fn on_store<T: Send + 'static>(&self, f: impl FnOnce(&mut Store) -> T + Send + 'static) -> Option<T> {
        let st = self.store.clone();
        tokio::task::spawn_blocking(move || f(&mut lock(&st))).await.ok()
    }

    /// Counts kept as the store changes: no walk of what is held.
    fn levels(&self) {
        let (n, by, p, scopes) = {
            let st = lock(&self.store);
            (st.len() as u64, st.by_origin(), st.values() as u64, st.by_scope())
        };
        self.status(|s| {
            s.decisions = n;
            s.decisions_by_origin = by;
            s.decisions_by_scope = scopes;
            s.prefixes = p;
        });
    }

    /// Reads the file of a previous run: what has not ended yet. A file
    /// beyond `max_cover` is refused as a pull beyond it is (counted
    /// `cover`, the reason in `status`): the feed starts empty and writes
    /// the set empty, since the set saved with the file holds them.
    async fn restore(&mut self) {
        let (file, s) = (self.file.clone(), self.s.clone());
        let r = self
            .on_store(move |st| -> std::result::Result<Option<(usize, usize)>, Restore> {
                let text = match crate::files::read_regular(&file, crate::files::FEED_STATE) {
                    Ok(t) => t,
                    Err(e) if e.is_not_found() => return Ok(None),
                    Err(e) => return Err(Restore::Unreadable(format!("cannot read {}: {e}", file.display()))),
                };
                let (read, ended) = Store::restore(&text, &s, crate::duration::unix_ms()).map_err(|e| match e {
                    Restore::Unreadable(e) => Restore::Unreadable(format!("{} is unreadable ({e})", file.display())),
                    cover => cover,
                })?;
                *st = read;
                Ok(Some((st.len(), ended)))
            })
            .await;
        match r {
            Some(Ok(None)) => {}
            Some(Ok(Some((held, ended)))) => {
                say!(
                    "policer: crowdsec: {held} decisions in force from {} ({ended} ended while stopped), until the \
                     first pull",
                    self.file.display()
                );
                self.dirty = true;
            }
            Some(Err(Restore::Cover(why))) => {
                let why = format!("max_cover: {} not restored: {why}", self.file.display());
                say_err!(
                    "policer: crowdsec: {why}: starting empty, the set '{}' emptied until the first pull",
                    self.s.set
                );
                self.error("cover", &why);
                self.status(|st| st.last_error = Some(why));
                // The set saved with the file holds them: written empty.
                self.dirty = true;
            }
            Some(Err(Restore::Unreadable(e))) => say_err!("policer: crowdsec: {e}; starting empty"),
            None => say_err!("policer: crowdsec: reading {} failed; starting empty", self.file.display()),
        }
    }

    async fn save(&mut self) {
        if !self.unsaved {
            return;
        }
        let file = self.file.clone();
        let r = self
            .on_store(move |st| -> std::io::Result<()> { crate::files::replace_json(&file, &*st) })
            .await
            .unwrap_or_else(|| Err(std::io::Error::other("the writer failed")));
        match r {
            Ok(()) => self.unsaved = false,
            Err(e) => self.error("save", &format!("{}: {e}", self.file.display())),
        }
    }

    /// The set becomes the store's prefixes (one change through the owner).
    async fn write_set(&mut self) {
        if !self.dirty {
            return;
        }
        let scoped = self.s.scoped.clone();
        let Some(((entries, labels), held)) = self.on_store(move |st| (st.entries(&scoped), st.len())).await else {
            self.error("apply", "listing the decisions failed");
            return;
        };
        let imp = super::Import {
            file: format!("the CrowdSec Local API ({held} decisions)"),
            text: Vec::new(),
            list: crate::sets::List { entries, duplicates: 0, mapped: 0 },
            set: Some(self.s.set.clone()),
            rule: RuleConfig { action: Some(self.s.action), ..RuleConfig::default() },
            max_remove: Default::default(),
            // The Local API is the truth: a startup pull that shrinks the
            // set is what it says (a failed or cut pull never gets here).
            force: true,
            // Saved as any imported set: a restart polices with it from
            // its first frame, before the feed's task runs.
            runtime: false,
            feed: true,
            skip_protected: false,
            mmdb: None,
            labels: labels.map(Arc::new),
        };
        let out = self.owner.ask(Command::Import(Box::new(imp))).await;
        match out.result {
            Ok(r) => {
                self.dirty = false;
                // The feed's file follows the set: a restart restores the
                // decisions of the set it starts with, not older ones.
                self.unsaved = true;
                self.views.audit().record(&format!("crowdsec ({})", self.s.url_text), r.message());
                if let super::Response::Imported { counts: c, .. } = r {
                    self.status(|s| {
                        s.left_out_protected = c.refused_protected;
                        s.left_out_rule_prefix = c.refused_rule_prefix;
                    });
                }
            }
            Err(e) => {
                self.error("apply", &e.to_string());
                say_err!("policer: crowdsec: the set '{}' could not be written (tried again): {e}", self.s.set);
            }
        }
    }

    /// One pull: the answer is read as it arrives, a decision at a time,
    /// and applied on the blocking pool, all or nothing. An answer that is
    /// not the stream, cut, late or past the bound changes nothing.
    /// `word`: what the log calls it (`startup`, `whole`, `delta`).
    async fn pull(&mut self, startup: bool, word: &str) -> std::result::Result<Option<String>, String> {
        let t0 = Instant::now();
        let r = self.pull_apply(startup).await;
        let p = match r {
            Ok(p) => p,
            Err(e) => {
                self.error(&e.kind, &e.why);
                self.cover.refused = e.kind == "cover";
                return Err(e.why);
            }
        };
        self.cover.refused = false;
        for (why, v) in &p.examples {
            say_err!("policer: crowdsec: a decision not applied ({why}): {v}");
        }
        let a = &p.applied;
        let skipped: u64 = p.skipped.values().sum();
        self.status(|s| {
            s.received += p.received;
            s.deleted += a.deleted as u64;
            for (why, n) in &p.skipped {
                *s.skipped.entry(why.clone()).or_insert(0) += n;
            }
        });
        if self.synced.pulled(a.changed) {
            self.dirty = true;
        }
        if a.added > 0 || a.deleted > 0 || skipped > 0 {
            say!(
                "policer: crowdsec: {word} pull: {} new, {} deleted, {} not applied; {} decisions in force ({:.2} s){}",
                a.added,
                a.deleted,
                skipped,
                p.held,
                t0.elapsed().as_secs_f64(),
                match a.doubted_ms {
                    Some(ms) => format!(" (taken after whole answers had said so for {} s)", ms / 1000),
                    None if word == "whole" => " (what the pulls of changes had missed or kept)".to_string(),
                    None => String::new(),
                }
            );
        }
        // Said when it begins; counted at each answer; pulled whole at the
        // usual pace while it lasts.
        let doubt = a.doubt.as_ref().map(|d| {
            self.status(|s| *s.errors.entry("shrink".into()).or_insert(0) += 1);
            if d.for_ms == 0 {
                say_err!("policer: crowdsec: {word} pull from {}: {d}", self.s.url_text);
            }
            d.to_string()
        });
        Ok(doubt)
    }

    async fn pull_apply(&self, startup: bool) -> std::result::Result<Pulled, PullError> {
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let path = self.s.stream_path(startup);
        let key = self.s.api_key.clone();
        let http = |e: HttpError| PullError { kind: e.kind(), why: e.to_string() };
        let resp = send(&self.s.url, "GET", &path, &[("X-Api-Key", &key)], None, TIMEOUT).await.map_err(http)?;
        let status = resp.status();
        if !status.is_success() {
            let body = tokio::time::timeout_at(deadline, read_body(resp.into_body())).await;
            let text = body.map(|b| b.unwrap_or_default()).unwrap_or_default();
            return Err(http(status_error(status, &text)));
        }
        let (tx, rx) = mpsc::channel::<std::result::Result<Bytes, String>>(16);
        let (s, store) = (self.s.clone(), self.store.clone());
        let job = tokio::task::spawn_blocking(move || -> std::result::Result<Pulled, PullError> {
            let reader = std::io::BufReader::with_capacity(64 << 10, BodyReader { rx, cur: Bytes::new() });
            let pull = crate::crowdsec::parse_stream(&s, reader).map_err(|e| PullError {
                kind: if e.is_io() { "body".into() } else { "parse".into() },
                why: format!("reading the stream's answer: {e}; nothing changed"),
            })?;
            let now = crate::duration::unix_ms();
            let mut st = lock(&store);
            let applied = st
                .apply(&s, &pull, startup, now)
                .map_err(|why| PullError { kind: "cover".into(), why: format!("max_cover: {why}") })?;
            let held = st.len();
            drop(st);
            let big = pull.new.len() + pull.deleted.len() > 100_000;
            let Pull { received, skipped, examples, .. } = pull;
            // A big answer's decisions are gone now: give their pages back
            // rather than keep them as the daemon's resident size.
            if big {
                #[cfg(target_env = "gnu")]
                // SAFETY: malloc_trim only returns free heap pages to the kernel.
                unsafe {
                    libc::malloc_trim(0);
                }
            }
            Ok(Pulled { applied, received, skipped, examples, held })
        });
        // The body, forwarded as it comes, within the request's time and
        // the bound; a failure is passed on so the parse fails with it.
        let forward = async {
            let mut body = resp.into_body();
            let mut total = 0usize;
            loop {
                match body.frame().await {
                    None => return Ok(()),
                    Some(Err(e)) => return Err(HttpError::Body(e.to_string())),
                    Some(Ok(f)) => {
                        let Ok(data) = f.into_data() else { continue };
                        total += data.len();
                        if total > MAX_BODY {
                            return Err(HttpError::Body(format!("the answer is larger than {} MiB", MAX_BODY >> 20)));
                        }
                        if tx.send(Ok(data)).await.is_err() {
                            // The parser stopped: its error says why.
                            return Ok(());
                        }
                    }
                }
            }
        };
        let forwarded = tokio::time::timeout_at(deadline, forward).await.unwrap_or(Err(HttpError::Timeout));
        if let Err(e) = &forwarded {
            let _ = tx.send(Err(e.to_string())).await;
        }
        drop(tx);
        let out = job.await.map_err(|e| PullError { kind: "parse".into(), why: format!("internal error: {e}") })?;
        match (forwarded, out) {
            (Err(e), _) => Err(http(e)),
            (Ok(()), out) => out,
        }
    }
    /// A watcher's token (logged in again when near its end or refused).
    async fn token(&mut self) -> std::result::Result<String, String> {
        if let Some((t, at)) = &self.token
            && at.elapsed() < Duration::from_secs(30 * 60)
        {
            return Ok(t.clone());
        }
        let Some((id, password)) = self.s.publish.clone() else { return Err("publish is off".into()) };
        let body = serde_json::json!({ "machine_id": id, "password": password, "scenarios": [SCENARIO] });
        let path = format!("{}v1/watchers/login", self.s.url.base);
        let r = request(&self.s.url, "POST", &path, &[], Some(body.to_string().into_bytes()), TIMEOUT).await;
        let bytes = r.map_err(|e| {
            self.error("login", &e.to_string());
            format!("login as machine '{id}': {e}")
        })?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).map_err(|e| format!("login answer: {e}"))?;
        let t = v.get("token").and_then(|t| t.as_str()).ok_or("login answer without a token")?.to_string();
        self.token = Some((t.clone(), Instant::now()));
        Ok(t)
    }

    /// Keeps at most [`PUBLISH_QUEUE`] bans waiting (the newest: an
    /// outage of the Local API with a ban storm must not grow the daemon
    /// without bound); those dropped are counted.
    fn cap_pending(&mut self) {
        if self.pending.len() > PUBLISH_QUEUE {
            let n = self.pending.len() - PUBLISH_QUEUE;
            self.pending.drain(..n);
            self.status(|s| *s.errors.entry("publish_dropped".into()).or_insert(0) += n as u64);
            log::warn!("crowdsec: {n} automatic bans not published (the queue was full)");
        }
    }

    /// Posts what is pending, in batches; keeps what failed for the next
    /// round.
    async fn publish(&mut self) {
        while !self.pending.is_empty() {
            let token = match self.token().await {
                Ok(t) => t,
                Err(e) => {
                    self.status(|s| s.last_error = Some(e.clone()));
                    break;
                }
            };
            let n = self.pending.len().min(PUBLISH_BATCH);
            let alerts: Vec<serde_json::Value> = self.pending[..n].iter().map(alert).collect();
            let path = format!("{}v1/alerts", self.s.url.base);
            let auth = format!("Bearer {token}");
            let body = serde_json::to_vec(&alerts).unwrap_or_default();
            match request(&self.s.url, "POST", &path, &[("Authorization", &auth)], Some(body), TIMEOUT).await {
                Ok(_) => {
                    self.pending.drain(..n);
                    self.status(|s| s.published += n as u64);
                }
                Err(e) => {
                    if matches!(e, HttpError::Status(401 | 403, _)) {
                        self.token = None;
                    }
                    self.error("publish", &e.to_string());
                    self.status(|s| s.last_error = Some(format!("publishing automatic bans: {e}")));
                    break;
                }
            }
        }
        let left = self.pending.len() as u64;
        self.status(|s| s.publish_pending = left);
    }
}

/// An automatic ban as a CrowdSec alert with one decision of origin
/// [`ORIGIN`].
fn alert(b: &AutoBan) -> serde_json::Value {
    let host = b.net.prefix_len() == b.net.max_prefix_len();
    let (scope, value) = if host { ("Ip", b.net.addr().to_string()) } else { ("Range", b.net.to_string()) };
    let now = crate::duration::unix_ms();
    let at = crate::duration::rfc3339(now);
    let scenario = SCENARIO;
    let message = format!(
        "policer: automatic ban of {value} for {} s (rule {}; ban #{} of this source)",
        b.secs, b.rule, b.count
    );
    let mut source = serde_json::json!({ "scope": scope, "value": value });
    if host {
        source["ip"] = serde_json::json!(value);
    } else {
        source["range"] = serde_json::json!(value);
    }
    serde_json::json!({
        "scenario": scenario,
        "scenario_hash": "",
        "scenario_version": "",
        "message": message,
        "events_count": 1,
        "events": [{ "timestamp": at, "meta": [{ "key": "rule", "value": b.rule }] }],
        "start_at": at,
        "stop_at": at,
        "capacity": 0,
        "leakspeed": "0",
        "simulated": false,
        "source": source,
        "decisions": [{
            "origin": ORIGIN,
            "type": "ban",
            "scope": scope,
            "value": value,
            "duration": format!("{}s", b.secs.max(1)),
            "scenario": scenario,
        }],
    })
}

/// Starts the feed's task on the current runtime.
pub fn spawn(feed: Feed) {
    let status = Arc::new(Mutex::new(FeedStatus {
        kind: "crowdsec".into(),
        url: feed.settings.url_text.clone(),
        set: feed.settings.set.clone(),
        publish: feed.settings.publish.is_some(),
        ..FeedStatus::default()
    }));
    feed.views.add_feed(status.clone());
    let file = state_file(&feed.dir, &feed.settings.set);
    let run = Run {
        s: Arc::new(feed.settings),
        owner: feed.owner,
        views: feed.views,
        status,
        store: Arc::new(Mutex::new(Store::default())),
        file,
        dirty: false,
        unsaved: false,
        synced: Synced::default(),
        cover: CoverWarn::default(),
        token: None,
        pending: Vec::new(),
    };
    tokio::spawn(run_feed(run, feed.publish));
}

/// When the feed pulls next, and what.
struct Pulls {
    /// The next pull is a whole one (`startup=true`): the first, and
    /// after a failed pull (its answer may have been lost, and its changes
    /// with it).
    startup: bool,
    /// The wait after a failure (doubling up to [`BACKOFF_MAX`]).
    wait: Duration,
    next: tokio::time::Instant,
    /// The last whole pull (`full_sync_every`): the pulls of changes can
    /// miss a decision the Local API wrote while it answered one.
    last_whole: tokio::time::Instant,
}

impl Run {
    /// The pull that is due: whole (the first, after a failure, every
    /// `full_sync_every`) or of changes; its outcome in the status, and
    /// when the next one is.
    async fn pull_due(&mut self, p: &mut Pulls) {
        let t = unix_s();
        let due = self.s.full_every.is_some_and(|e| tokio::time::Instant::now() >= p.last_whole + e);
        let whole = p.startup || due;
        let word = if p.startup {
            "startup"
        } else if due {
            "whole"
        } else {
            "delta"
        };
        match self.pull(whole, word).await {
            Ok(doubt) => {
                if whole {
                    p.last_whole = tokio::time::Instant::now();
                }
                self.cover.pulled(false, tokio::time::Instant::now());
                p.startup = doubt.is_some();
                p.wait = self.s.every;
                self.status(|s| {
                    s.last_sync_success = true;
                    s.last_sync_timestamp_seconds = t;
                    s.last_success_timestamp_seconds = t;
                    s.last_error = doubt;
                });
            }
            Err(e) => {
                // A pull may have reached the Local API and its answer
                // been lost: the next is a whole one, so no change is
                // missed.
                let cover = self.cover.refused;
                let cover_due = self.cover.pulled(cover, tokio::time::Instant::now());
                if (!cover && (!p.startup || self.status.lock().map(|s| s.last_sync_success).unwrap_or(true)))
                    || cover_due
                {
                    say_err!(
                        "policer: crowdsec: pulling decisions from {} failed: {e}; the {} decisions in force \
                         stay (each until its end); trying again in {} s",
                        self.s.url_text,
                        lock(&self.store).len(),
                        p.wait.as_secs()
                    );
                }
                p.startup = true;
                self.status(|s| {
                    s.last_sync_success = false;
                    s.last_sync_timestamp_seconds = t;
                    s.last_error = Some(e);
                });
                p.wait = (p.wait * 2).min(BACKOFF_MAX);
            }
        }
        p.next = tokio::time::Instant::now() + if p.startup { p.wait } else { self.s.every };
    }
}

async fn run_feed(mut r: Run, mut publish: Option<mpsc::Receiver<AutoBan>>) {
    r.restore().await;
    r.write_set().await;
    r.levels();
    let mut pulls = Pulls {
        startup: true,
        wait: r.s.every,
        next: tokio::time::Instant::now(),
        last_whole: tokio::time::Instant::now(),
    };
    let mut last_expiry = tokio::time::Instant::now();
    loop {
        // The next pull, the next end of a decision (a second after the
        // last at the soonest), a retry of the set or the file, or a ban
        // to publish.
        let next_end = lock(&r.store).next_end().map(|ms| {
            let left = ms.saturating_sub(crate::duration::unix_ms());
            (tokio::time::Instant::now() + Duration::from_millis(left)).max(last_expiry + EXPIRE_EVERY)
        });
        let until = next_end.map_or(pulls.next, |e| e.min(pulls.next));
        let dirty_retry = r.dirty.then(|| tokio::time::Instant::now() + Duration::from_secs(1));
        let until = dirty_retry.map_or(until, |d| d.min(until));
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            b = async { match publish.as_mut() { Some(rx) => rx.recv().await, None => std::future::pending().await } } => {
                match b {
                    Some(b) => r.pending.push(b),
                    None => publish = None,
                }
                // Gather what else is queued, then post at once.
                if let Some(rx) = publish.as_mut() {
                    while let Ok(b) = rx.try_recv() {
                        r.pending.push(b);
                    }
                }
                r.cap_pending();
                r.publish().await;
                continue;
            }
        }
        if tokio::time::Instant::now() >= last_expiry + EXPIRE_EVERY {
            last_expiry = tokio::time::Instant::now();
            let now = crate::duration::unix_ms();
            // By the index of ends, on the blocking pool: what ends, not
            // what is held.
            let (ended, changed) = r.on_store(move |st| st.expire(now)).await.unwrap_or((0, false));
            if ended > 0 {
                r.status(|s| s.expired += ended as u64);
            }
            if changed {
                r.dirty = true;
            }
        }
        if tokio::time::Instant::now() >= pulls.next {
            r.pull_due(&mut pulls).await;
            if !r.pending.is_empty() {
                r.publish().await;
            }
        }
        r.write_set().await;
        r.levels();
        r.save().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_first_good_pull_or_a_change_makes_an_import() {
        let mut s = Synced::default();
        // The first good pull: due even when nothing changed (an empty
        // feed's set is created).
        assert!(s.pulled(false));
        // Later pulls, startup ones after a failure included: only a change.
        assert!(!s.pulled(false));
        assert!(!s.pulled(false));
        assert!(s.pulled(true));
        assert!(!s.pulled(false));
    }

    #[test]
    fn a_cover_refusal_is_logged_again_once_a_minute_while_it_lasts() {
        let mut c = CoverWarn::default();
        let t0 = tokio::time::Instant::now();
        let s = Duration::from_secs;
        assert!(c.pulled(true, t0), "the first refusal is logged");
        assert!(!c.pulled(true, t0 + s(10)));
        assert!(!c.pulled(true, t0 + s(59)));
        assert!(c.pulled(true, t0 + s(60)), "still refused a minute later: logged again");
        assert!(!c.pulled(true, t0 + s(100)));
        // A good pull (or another failure) ends the run: the next refusal
        // is logged at once.
        assert!(!c.pulled(false, t0 + s(101)));
        assert!(c.pulled(true, t0 + s(102)));
    }

    #[test]
    fn an_alert_carries_one_policer_decision() {
        let a = alert(&AutoBan { net: "192.0.2.7/32".parse().unwrap(), secs: 60, rule: "0.0.0.0/0".into(), count: 2 });
        assert_eq!(a["source"]["ip"], "192.0.2.7");
        // Listed by `cscli decisions list` without `--all` (1.4.6 lists
        // only the origins `crowdsec` and `cscli` by default).
        assert_eq!(a["decisions"][0]["origin"], "crowdsec");
        assert_eq!(a["decisions"][0]["scenario"], "policer/auto-ban");
        assert_eq!(a["scenario"], "policer/auto-ban");
        assert_eq!(a["decisions"][0]["scope"], "Ip");
        assert_eq!(a["decisions"][0]["duration"], "60s");
        let a = alert(&AutoBan { net: "2001:db8::/64".parse().unwrap(), secs: 5, rule: "::/0".into(), count: 1 });
        assert_eq!(a["decisions"][0]["scope"], "Range");
        assert_eq!(a["source"]["range"], "2001:db8::/64");
    }
}
