//! The lease thread of the fleet budgets (`[global]`, docs/fleet.md).
//!
//! Once a lease period it reads how many frames reached each global
//! rule's aggregate bucket, asks Redis for each budget's lease in one
//! pipelined round trip (the script of [`crate::fleet::SCRIPT`], EVALSHA
//! with an EVAL when Redis does not have it), and hands the owner the
//! aggregates for the next period ([`Owner::lease`], never waiting for
//! it). A round trip that fails or answers later than a period puts every
//! budget on its fallback at once. It runs on a thread of its own with
//! socket timeouts, so a hanging Redis holds neither the owner nor a
//! connection's task. Redis says when another daemon leases as this node
//! (two nodes given one `node_id`): said, and kept in the status. At a
//! plain exit ([`LeaseThread::leave`]) the node leaves its budgets at once.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        mpsc::{self, RecvTimeoutError},
    },
    time::{Duration, Instant},
};

use crate::{
    control::{FleetStatus, GlobalStatus},
    fleet::{self, Settings},
    rules::RuleKey,
};

use super::{LeaseWrite, owner::Owner, views::Views};

/// One global rule in force: where it is, and its share of the budget.
struct Member {
    key: RuleKey,
    slot: u32,
    budget_pps: u64,
}

/// What the thread keeps of one budget between periods.
#[derive(Default)]
struct Budget {
    /// The counters read last, by slot: frames that reached the aggregate
    /// (admitted or refused by it) and frames it admitted.
    seen: BTreeMap<u32, (u64, u64)>,
    live: u64,
    status: GlobalStatus,
}

/// Rounds of the last [`CLASH_ROUNDS`] in which Redis found another daemon
/// leasing as this node before it is said: a daemon restarted within its
/// node's registration finds its predecessor there once, two daemons with
/// one node id find each other nearly every round.
const CLASH_SAID: u32 = 3;
const CLASH_ROUNDS: u32 = 10;

/// How long a leave waits for Redis at most, whatever the lease period
/// (the connect, each read and write).
const LEAVE_TIMEOUT: Duration = Duration::from_millis(250);
/// How long the daemon's exit waits for the leave (a round in flight, then
/// the leave).
pub(super) const LEAVE_WAIT: Duration = Duration::from_millis(400);

/// The lease thread, as the daemon's exit sees it. Dropped, it ends at its
/// next wake without leaving the budgets (the program stays attached:
/// `--persist`, or a detach that failed).
pub(super) struct LeaseThread {
    leave: mpsc::Sender<()>,
    left: mpsc::Receiver<()>,
}

impl LeaseThread {
    /// Ends the lease thread, this node leaving every budget it leased
    /// (`crate::fleet::LEAVE`): the daemon exits and its program is
    /// detached, so the other nodes share the budget from their next lease
    /// instead of after this node's registration expires. Waits at most
    /// `within`; whether it was done.
    pub(super) fn leave(self, within: Duration) -> bool {
        self.leave.send(()).is_ok() && self.left.recv_timeout(within).is_ok()
    }
}

/// Starts the lease thread; its status is registered with the views.
pub(super) fn spawn(settings: Settings, owner: Owner, views: Arc<Views>) -> Option<LeaseThread> {
    let status = Arc::new(Mutex::new(FleetStatus {
        redis: settings.shown.clone(),
        node_id: settings.node_id.clone(),
        lease_period_ms: settings.period.as_millis() as u64,
        fallback: settings.fallback.name().into(),
        ..FleetStatus::default()
    }));
    views.set_fleet(status.clone());
    // A token of this start, told apart from another daemon's with the
    // same node id (the time as well, should getrandom fail).
    let instance = match crate::files::random_u64() {
        Ok(r) => format!("{r:016x}"),
        Err(_) => format!("{:x}-{}", crate::duration::unix_ms(), std::process::id()),
    };
    let (leave, stop) = mpsc::channel();
    let (done, left) = mpsc::channel();
    let run = Lease {
        settings,
        owner,
        views,
        status,
        conn: None,
        budgets: BTreeMap::new(),
        up: None,
        instance,
        clashes: 0,
        clash: false,
    };
    match std::thread::Builder::new().name("policer-fleet".into()).spawn(move || run.run(&stop, &done)) {
        Ok(_) => Some(LeaseThread { leave, left }),
        Err(e) => {
            say_err!("policer: fleet: the lease thread did not start: {e}");
            None
        }
    }
}

struct Lease {
    settings: Settings,
    owner: Owner,
    views: Arc<Views>,
    status: Arc<Mutex<FleetStatus>>,
    conn: Option<redis::Connection>,
    budgets: BTreeMap<String, Budget>,
    /// Whether the last round reached Redis (none before the first).
    up: Option<bool>,
    /// This start's token, what Redis keeps as the daemon leasing as this
    /// node.
    instance: String,
    /// The last [`CLASH_ROUNDS`] rounds, a bit each (the newest lowest):
    /// whether Redis found another daemon leasing as this node.
    clashes: u32,
    /// Whether that is said now.
    clash: bool,
}

/// What one round asks of one budget.
struct Ask {
    name: String,
    ask: u64,
    budget_pps: u64,
}

impl Lease {
    /// Rounds until the owner is gone or the daemon's exit ends it
    /// (`stop`: a message, leave the budgets and say so on `done`;
    /// dropped, end without leaving).
    fn run(mut self, stop: &mpsc::Receiver<()>, done: &mpsc::Sender<()>) {
        let period = self.settings.period;
        let mut next = Instant::now();
        let mut last = Instant::now();
        loop {
            next += period;
            let now = Instant::now();
            let woken = match next.checked_duration_since(now) {
                Some(wait) => stop.recv_timeout(wait),
                // A round that took longer than its period: start again
                // from now rather than run the missed ones back to back.
                None => {
                    next = now;
                    stop.try_recv().map_err(|e| match e {
                        mpsc::TryRecvError::Empty => RecvTimeoutError::Timeout,
                        mpsc::TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
                    })
                }
            };
            match woken {
                Ok(()) => {
                    self.leave_budgets();
                    let _ = done.send(());
                    return;
                }
                Err(RecvTimeoutError::Disconnected) => return,
                Err(RecvTimeoutError::Timeout) => {}
            }
            if self.owner.is_closed() {
                return;
            }
            let now = Instant::now();
            let elapsed = now - last;
            last = now;
            self.round(elapsed);
        }
    }

    /// One lease period: demand, the round trip, the writes, the status.
    fn round(&mut self, elapsed: Duration) {
        let members = self.members();
        self.budgets.retain(|name, _| members.contains_key(name));
        // The global rules' slots alone: a read of every slot for every CPU
        // ten times a second was megabytes to gigabytes a round.
        let slots = members.values().flatten().map(|m| m.slot);
        let counters: BTreeMap<u32, (u64, u64)> = match self.views.map_reader().rule_counters_of(slots) {
            Ok(c) => {
                c.into_iter().map(|(slot, c)| (slot, (c.passed_pkts + c.total_dropped_pkts, c.passed_pkts))).collect()
            }
            Err(e) => {
                say_err!("policer: fleet: reading the rules' counters: {e}");
                return;
            }
        };
        let period = self.settings.period;
        let mut asks = Vec::new();
        let mut demands = BTreeMap::new();
        for (name, rules) in &members {
            let b = self.budgets.entry(name.clone()).or_default();
            let (mut demand, mut used) = (0, 0);
            let mut seen = BTreeMap::new();
            for m in rules {
                let now = counters.get(&m.slot).copied().unwrap_or_default();
                // A slot not seen before (a new rule) counts from now.
                let before = b.seen.get(&m.slot).copied().unwrap_or(now);
                let d = now.0.saturating_sub(before.0);
                demand += d;
                used += now.1.saturating_sub(before.1);
                seen.insert(m.slot, now);
                demands.insert(m.slot, d);
            }
            b.seen = seen;
            let budget_pps = rules.iter().map(|m| m.budget_pps).max().unwrap_or(1);
            let ask = fleet::ask(demand, elapsed, period);
            (b.status.demand, b.status.used, b.status.asked) = (demand, used, ask);
            b.status.used_total += used;
            b.status.asked_total += ask;
            asks.push(Ask { name: name.clone(), ask, budget_pps });
        }
        if asks.is_empty() {
            self.publish();
            return;
        }
        let answer = self.ask_redis(&asks);
        self.said(&answer);
        if let Ok(replies) = &answer {
            self.clashed(replies.iter().any(|r| r.3 != 0));
        }
        let mut writes = Vec::new();
        for (i, a) in asks.iter().enumerate() {
            let b = self.budgets.get_mut(&a.name).expect("a budget for each ask");
            let reply = match &answer {
                Ok(replies) => replies.get(i).copied(),
                Err(_) => None,
            };
            let tokens = match reply {
                Some((grant, live, _, _)) => {
                    let live = live.max(1) as u64;
                    if live != b.live {
                        b.status.live_changed_unix_ms = crate::duration::unix_ms();
                    }
                    b.live = live;
                    grant.max(0) as u64
                }
                None => fleet::fallback_tokens(a.budget_pps, period, b.live, self.settings.fallback),
            };
            b.status.fallback = reply.is_none();
            b.status.live_nodes = b.live.max(1);
            b.status.granted = tokens;
            b.status.granted_total += tokens;
            b.status.budget_pps = a.budget_pps;
            b.status.rate_pps = (tokens as u128 * 1_000_000_000 / period.as_nanos().max(1)) as u64;
            writes.extend(split(&members[&a.name], &demands, tokens, &a.name, period));
        }
        for (name, b) in &mut self.budgets {
            b.status.name = name.clone();
            b.status.rules = members[name].iter().map(|m| m.key.to_string()).collect();
        }
        // A full queue keeps the last period's aggregates: the next round
        // writes again.
        self.owner.lease(writes);
        self.publish();
    }

    /// The global rules in force, by budget.
    fn members(&self) -> BTreeMap<String, Vec<Member>> {
        let snap = self.views.subscribe().borrow().clone();
        let mut out: BTreeMap<String, Vec<Member>> = BTreeMap::new();
        for (key, i) in snap.rules.iter() {
            let (Some(name), Some((rate, _))) = (i.spec.global(), i.spec.total()) else { continue };
            let budget_pps = match rate {
                policer_common::rate::Rate::Pps(p) => p,
                // Refused when the rule is made: a budget is packets.
                policer_common::rate::Rate::Bps(_) => continue,
            };
            out.entry(name.to_string()).or_default().push(Member { key: key.clone(), slot: i.slot, budget_pps });
        }
        out
    }

    /// The connection to Redis, made anew (with `timeout` for the connect
    /// and every read and write) when there is none.
    fn connection(&mut self, timeout: Duration) -> Result<&mut redis::Connection, String> {
        if self.conn.is_none() {
            let client = redis::Client::open(self.settings.connection.clone()).map_err(|e| e.to_string())?;
            let c = client.get_connection_with_timeout(timeout).map_err(|e| e.to_string())?;
            c.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
            c.set_write_timeout(Some(timeout)).map_err(|e| e.to_string())?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// One pipelined round trip: each budget's lease, `(grant, live nodes,
    /// sum of the asks, another daemon leased as this node)`, or why there
    /// is none.
    fn ask_redis(&mut self, asks: &[Ask]) -> Result<Vec<(i64, i64, i64, i64)>, String> {
        let timeout = self.settings.period;
        let instance = self.instance.clone();
        self.connection(timeout)?;
        let (s, conn) = (&self.settings, self.conn.as_mut().expect("connected above"));
        let sha = redis::Script::new(fleet::SCRIPT).get_hash().to_string();
        let period_us = s.period.as_micros() as u64;
        let ttl_us = s.ttl().as_micros() as u64;
        let pipe = |eval: bool| {
            let mut p = redis::pipe();
            for a in asks {
                let [tat, live, asked, inst] = fleet::keys(&a.name);
                let c = if eval { p.cmd("EVAL").arg(fleet::SCRIPT) } else { p.cmd("EVALSHA").arg(&sha) };
                c.arg(4).arg(tat).arg(live).arg(asked).arg(inst).arg(&s.node_id).arg(a.ask).arg(a.budget_pps);
                c.arg(period_us).arg(ttl_us).arg(&instance);
            }
            p
        };
        let started = Instant::now();
        let r = match pipe(false).query::<Vec<(i64, i64, i64, i64)>>(conn) {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                pipe(true).query::<Vec<(i64, i64, i64, i64)>>(conn)
            }
            r => r,
        };
        match r {
            Ok(_) if started.elapsed() > s.period => {
                Err(format!("answered in {} ms, later than a period", started.elapsed().as_millis()))
            }
            Ok(v) if v.len() == asks.len() => Ok(v),
            Ok(v) => Err(format!("{} answers to {} leases", v.len(), asks.len())),
            Err(e) => {
                // A connection that failed is not reused: the next round
                // connects anew (Redis restarted, a reply half read).
                self.conn = None;
                Err(e.to_string())
            }
        }
    }

    /// Says a change of the backend's state once (not every period), and
    /// keeps it in the status.
    fn said(&mut self, answer: &Result<Vec<(i64, i64, i64, i64)>, String>) {
        let up = answer.is_ok();
        let (redis, fallback) = (&self.settings.shown, self.settings.fallback.name());
        match (self.up, answer) {
            (Some(true) | None, Err(e)) => {
                say_err!(
                    "policer: fleet: Redis {redis} failed ({e}): the global rules fall back ({fallback}) until it answers"
                );
            }
            (Some(false), Ok(_)) => say!("policer: fleet: Redis {redis} answers again: leases resumed"),
            (None, Ok(_)) => say!("policer: fleet: leasing from Redis {redis} as node {}", self.settings.node_id),
            _ => {}
        }
        let changed = self.up != Some(up);
        self.up = Some(up);
        if let Ok(mut s) = self.status.lock() {
            if changed {
                s.changed_unix_ms = crate::duration::unix_ms();
            }
            s.backend_up = up;
            s.rounds += 1;
            s.failures += u64::from(!up);
            s.last_error = answer.as_ref().err().cloned();
        }
    }

    /// Keeps whether Redis found another daemon leasing as this node this
    /// round; says it when it comes back round after round (two daemons
    /// with one node id), and when it stopped.
    fn clashed(&mut self, now: bool) {
        self.clashes = (self.clashes << 1 | u32::from(now)) & ((1 << CLASH_ROUNDS) - 1);
        let n = self.clashes.count_ones();
        let node = &self.settings.node_id;
        if !self.clash && n >= CLASH_SAID {
            self.clash = true;
            say_err!(
                "policer: fleet: another daemon leases as node {node} too ({n} of the last {CLASH_ROUNDS} lease \
                 rounds): two nodes with one node_id share one node's place in every budget; give each node its \
                 own node_id in [global]"
            );
        } else if self.clash && n == 0 {
            self.clash = false;
            say!("policer: fleet: no other daemon leases as node {node} any more");
        }
        if let Ok(mut s) = self.status.lock() {
            s.node_id_clash = self.clash;
        }
    }

    /// Leaves every budget this node leased (`crate::fleet::LEAVE`), within
    /// [`LEAVE_TIMEOUT`] (or a period, when shorter); said.
    fn leave_budgets(&mut self) {
        let names: Vec<String> = self.budgets.keys().cloned().collect();
        if names.is_empty() {
            return;
        }
        let timeout = self.settings.period.min(LEAVE_TIMEOUT);
        let (node, instance) = (self.settings.node_id.clone(), self.instance.clone());
        if let Some(c) = &self.conn {
            let _ = c.set_read_timeout(Some(timeout));
            let _ = c.set_write_timeout(Some(timeout));
        }
        let r = self.connection(timeout).and_then(|conn| {
            let mut p = redis::pipe();
            for name in &names {
                let [_, live, asked, inst] = fleet::keys(name);
                p.cmd("EVAL").arg(fleet::LEAVE).arg(3).arg(live).arg(asked).arg(inst).arg(&node).arg(&instance);
            }
            p.query::<Vec<i64>>(conn).map_err(|e| e.to_string())
        });
        match r {
            Ok(_) => say!(
                "policer: fleet: node {node} left {}: the other nodes share them from their next lease",
                names.join(", ")
            ),
            Err(e) => say_err!(
                "policer: fleet: node {node} could not leave {} ({e}): the other nodes count it out when its \
                 registration expires",
                names.join(", ")
            ),
        }
    }

    fn publish(&self) {
        if let Ok(mut s) = self.status.lock() {
            s.budgets = self.budgets.values().map(|b| b.status.clone()).collect();
        }
    }
}

/// A budget's tokens for the next period over its rules on this node, in
/// proportion to each one's demand of the last (evenly when none had any).
fn split(rules: &[Member], demands: &BTreeMap<u32, u64>, tokens: u64, name: &str, period: Duration) -> Vec<LeaseWrite> {
    let total: u64 = rules.iter().map(|m| demands.get(&m.slot).copied().unwrap_or(0)).sum();
    rules
        .iter()
        .map(|m| {
            let share = match total {
                0 => tokens / rules.len().max(1) as u64,
                t => (tokens as u128 * demands.get(&m.slot).copied().unwrap_or(0) as u128 / t as u128) as u64,
            };
            LeaseWrite {
                key: m.key.clone(),
                slot: m.slot,
                name: name.to_string(),
                limiter: fleet::limiter(share, period),
            }
        })
        .collect()
}
