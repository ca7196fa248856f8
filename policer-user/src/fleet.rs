//! Fleet budgets (`--global NAME`, `[global]`; docs/fleet.md): one
//! `--total-rate` shared by every node that names the same budget, through
//! Redis. What is decided here is pure and host-tested: the `[global]`
//! table and its settings, the lease script, and the arithmetic that turns
//! a grant (tokens for one lease period) or a fallback into the rate the
//! rule's aggregate bucket runs at in the kernel. The lease thread is
//! `daemon/fleet.rs`.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The lease period when `[global]` names none.
pub const DEFAULT_LEASE_PERIOD: Duration = Duration::from_millis(100);
/// A node's registration lasts this many lease periods: a node that has not
/// asked for that long is no longer live (its demand no longer counts).
pub const TTL_PERIODS: u32 = 10;
/// The longest name of a fleet budget.
const MAX_NAME: usize = 64;

/// `[global]`: the Redis that holds the fleet's budgets, and this node.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalConfig {
    /// `redis://HOST:PORT/DB` (plain TCP; a password in the URL, or in
    /// `password_file`).
    pub redis_url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<String>,
    /// The database (overrides the URL's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub database: Option<u32>,
    /// This node's name in the fleet (default: the hostname).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    /// `100ms` by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_period: Option<String>,
    /// `share` (default) or `local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

impl std::fmt::Debug for GlobalConfig {
    // The URL may hold a password: never shown.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalConfig")
            .field("node_id", &self.node_id)
            .field("lease_period", &self.lease_period)
            .field("fallback", &self.fallback)
            .finish_non_exhaustive()
    }
}

/// What a node does with a global rule while Redis cannot be asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fallback {
    /// The budget divided by the nodes last seen live (at least one).
    Share,
    /// The whole budget, as if the node were alone.
    Local,
}

impl Fallback {
    pub const fn name(self) -> &'static str {
        match self {
            Fallback::Share => "share",
            Fallback::Local => "local",
        }
    }
}

/// `[global]` as checked.
#[derive(Clone)]
pub struct Settings {
    /// What the Redis client connects to (the password inside).
    pub connection: redis::ConnectionInfo,
    /// `HOST:PORT`, for messages (never the password).
    pub shown: String,
    pub node_id: String,
    pub period: Duration,
    pub fallback: Fallback,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("redis", &self.shown)
            .field("node_id", &self.node_id)
            .field("period", &self.period)
            .field("fallback", &self.fallback)
            .finish()
    }
}

impl Settings {
    /// How long this node's registration lasts ([`TTL_PERIODS`] periods).
    pub fn ttl(&self) -> Duration {
        self.period * TTL_PERIODS
    }
}

impl GlobalConfig {
    /// The settings, the password file read relative to `base` (the config
    /// file's directory).
    pub fn settings(&self, base: &Path) -> Result<Settings> {
        use redis::IntoConnectionInfo;
        let bad = |m: String| Error::Invalid(format!("global.{m}"));
        if !(self.redis_url.starts_with("redis://")) {
            return Err(bad(format!(
                "redis_url: {:?} is not a redis:// URL; write redis_url = \"redis://127.0.0.1:6379/0\"",
                crate::text::escaped(&self.redis_url)
            )));
        }
        let mut info = self.redis_url.as_str().into_connection_info().map_err(|e| {
            bad(format!(
                "redis_url: {}; write redis_url = \"redis://127.0.0.1:6379/0\"",
                e.detail().unwrap_or("not valid")
            ))
        })?;
        let shown = info.addr().to_string();
        let mut redis = info.redis_settings().clone();
        if let Some(f) = &self.password_file {
            let p = base.join(f);
            let text = std::fs::read_to_string(&p).map_err(|e| bad(format!("password_file: {}: {e}", p.display())))?;
            let pw = text.trim_end_matches(['\n', '\r']);
            if pw.is_empty() || pw.contains(['\n', '\r']) {
                return Err(bad(format!("password_file: {}: not one line holding the password", p.display())));
            }
            redis = redis.set_password(pw);
        }
        if let Some(db) = self.database {
            redis = redis.set_db(db as i64);
        }
        info = info.set_redis_settings(redis);
        let node_id = match &self.node_id {
            Some(n) => check_name(n).map_err(|e| bad(format!("node_id: {e}")))?,
            None => hostname()?,
        };
        let period = match &self.lease_period {
            None => DEFAULT_LEASE_PERIOD,
            Some(t) => {
                let d = crate::duration::parse(t).map_err(|e| bad(format!("lease_period: {e}; write \"100ms\"")))?;
                if d < Duration::from_millis(10) || d > Duration::from_secs(10) {
                    return Err(bad(format!("lease_period: {t:?} is not between 10ms and 10s; write \"100ms\"")));
                }
                d
            }
        };
        let fallback = match self.fallback.as_deref() {
            None | Some("share") => Fallback::Share,
            Some("local") => Fallback::Local,
            Some(o) => {
                return Err(bad(format!(
                    "fallback: {:?} is not share or local; write fallback = \"share\"",
                    crate::text::escaped(o)
                )));
            }
        };
        Ok(Settings { connection: info, shown, node_id, period, fallback })
    }
}

/// The host's name (`node_id`'s default).
fn hostname() -> Result<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is ours and its length is given.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return Err(Error::Invalid(format!("global.node_id: the hostname: {}", std::io::Error::last_os_error())));
    }
    let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]).into_owned();
    check_name(&name).map_err(|e| Error::Invalid(format!("global.node_id (the hostname): {e}; write node_id")))
}

/// A budget's or a node's name: 1 to 64 of `A-Z a-z 0-9 . _ -` (it is
/// part of Redis keys and of metric labels).
pub fn check_name(name: &str) -> Result<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(name.to_string())
    } else {
        Err(Error::Invalid(format!(
            "{:?} is not a name of 1 to {MAX_NAME} letters, digits, '.', '_' or '-'",
            crate::text::escaped(name)
        )))
    }
}

/// The Redis keys of budget `name`: the GCRA's theoretical arrival time,
/// the live nodes (a sorted set scored by their registration's end, on
/// Redis's clock), their last asks (a hash) and the daemon that last
/// leased as each node (a hash: node id to the daemon's instance, a
/// random token of its start). One hash tag, so a Redis Cluster keeps them
/// on one shard.
pub fn keys(name: &str) -> [String; 4] {
    [
        format!("policer:{{{name}}}:tat"),
        format!("policer:{{{name}}}:live"),
        format!("policer:{{{name}}}:asks"),
        format!("policer:{{{name}}}:inst"),
    ]
}

/// The lease, in one atomic script on Redis's clock (`TIME`): node
/// `ARGV[1]` registers for `ARGV[5]` µs and asks `ARGV[2]` tokens of the
/// budget of `ARGV[3]` tokens a second for one period of `ARGV[4]` µs.
/// Expired nodes are dropped with their asks; the ask is cut to the node's
/// share of one period's budget in proportion to the live nodes' asks, or,
/// when the asks leave part of the budget unused, given an equal part of
/// what they leave (an idle node then admits new traffic from its first
/// frame, not at the 1 pps of a grant of 0, and the shares still add up
/// to one period's budget); then a GCRA over the budget (tolerance: two
/// periods, so nodes whose rounds fall at different phases do not starve
/// each other) grants what it has. A TAT further ahead than the tolerance
/// is one Redis's clock stepped back from (an NTP step, a VM resumed, a
/// failover to a replica whose clock is behind): taken as a fresh start,
/// as after a restart of Redis, not as a debt that grants nothing for as
/// long as the step. The caller's instance (`ARGV[6]`) is kept as the one
/// leasing as its node; another one found there is said (`clash` 1): two
/// daemons with one node id (a config copied between nodes) share one
/// node's place in the shares, or a daemon restarted within its node's
/// registration (once).
/// Returns `{grant, live nodes, sum of the asks, clash}`.
pub const SCRIPT: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local node, ask = ARGV[1], math.max(0, math.floor(tonumber(ARGV[2])))
local rate, period, ttl = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local inst = ARGV[6]
local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)
if #gone > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  redis.call('HDEL', KEYS[3], unpack(gone))
  redis.call('HDEL', KEYS[4], unpack(gone))
end
local was = redis.call('HGET', KEYS[4], node)
local clash = 0
if was and was ~= inst then clash = 1 end
redis.call('HSET', KEYS[4], node, inst)
redis.call('ZADD', KEYS[2], now + ttl, node)
redis.call('HSET', KEYS[3], node, ask)
local live = redis.call('ZCARD', KEYS[2])
local sum = 0
for _, v in ipairs(redis.call('HVALS', KEYS[3])) do sum = sum + tonumber(v) end
local budget = math.floor(rate * period / 1000000)
local share = ask + math.floor((budget - sum) / live)
if sum > budget then share = math.floor(budget * ask / sum) end
local every = 1000000 / rate
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now or tat > now + 2 * period then tat = now end
local room = math.floor((now + 2 * period - tat) / every)
local grant = math.max(0, math.min(share, room))
tat = tat + grant * every
local keep = math.ceil((ttl + 2 * period) / 1000)
redis.call('SET', KEYS[1], string.format('%.0f', tat), 'PX', keep)
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('PEXPIRE', KEYS[3], keep)
redis.call('PEXPIRE', KEYS[4], keep)
return {grant, live, sum, clash}
"#;

/// A node leaving a budget (its daemon exits and its program is
/// detached): its registration, its ask and its instance removed at once,
/// so that the other nodes' next leases share the budget without it
/// instead of after its registration's TTL; only when the instance leasing
/// as the node is still this daemon (`ARGV[2]`), never another daemon's
/// with the same node id. Keys: `:live`, `:asks`, `:inst` ([`keys`]).
/// Returns 1 when it left, 0 when it was not there.
pub const LEAVE: &str = r#"
if redis.call('HGET', KEYS[3], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return 1
"#;

/// Why a budget of `rate_pps` cannot be shared in lease periods of
/// `period`: under one packet a period, every node would be granted none
/// of it (a grant is whole packets).
pub fn budget_too_small(rate_pps: u64, period: Duration) -> Option<String> {
    if budget_per_period(rate_pps, period) > 0 {
        return None;
    }
    let least = 1_000_000_000u128.div_ceil(period.as_nanos().max(1));
    Some(format!(
        "a fleet budget of {rate_pps}pps is under one packet a lease period ({} ms): no node would be granted any of \
         it; give at least {least}pps, or a longer lease_period in [global]",
        period.as_millis()
    ))
}

/// One period's budget in tokens (packets) of a budget of `rate_pps`.
pub fn budget_per_period(rate_pps: u64, period: Duration) -> u64 {
    (rate_pps as u128 * period.as_nanos() / 1_000_000_000) as u64
}

/// What a node asks for after a period in which `demand` frames reached
/// the rule's aggregate bucket over `elapsed`: that demand over one lease
/// period, with an eighth more so a growing demand is not always one
/// period behind.
pub fn ask(demand: u64, elapsed: Duration, period: Duration) -> u64 {
    let elapsed = elapsed.as_nanos().max(1);
    let per_period = (demand as u128 * period.as_nanos()).div_ceil(elapsed) as u64;
    per_period.saturating_add(per_period / 8)
}

/// The tokens a node uses for one period while Redis cannot be asked:
/// the budget over the nodes last seen live, or all of it.
pub fn fallback_tokens(rate_pps: u64, period: Duration, live: u64, fallback: Fallback) -> u64 {
    let budget = budget_per_period(rate_pps, period);
    match fallback {
        Fallback::Share => budget / live.max(1),
        Fallback::Local => budget,
    }
}

/// The aggregate bucket a node runs for one period with `tokens` (a grant
/// or a fallback): that many packets over the period, a bucket of one
/// period's tokens so a bursty arrival loses none, and so no more than one
/// period's unused grant is ever held.
pub fn limiter(tokens: u64, period: Duration) -> policer_common::Rule {
    let pps = (tokens as u128 * 1_000_000_000 / period.as_nanos().max(1)) as u64;
    let pps = pps.clamp(policer_common::bucket::MIN_RATE_PPS, policer_common::bucket::MAX_RATE_PPS);
    let burst = tokens.clamp(1, policer_common::bucket::MAX_BURST);
    policer_common::Rule::packets(pps, burst).expect("rate and burst clamped to their ranges")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(check_name("svc-1.dns_a").unwrap(), "svc-1.dns_a");
        for bad in ["", "a b", "x{y}", &"a".repeat(65), "é"] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn settings_defaults_and_refusals() {
        let base = Path::new("/nonexistent");
        let c = GlobalConfig {
            redis_url: "redis://127.0.0.1:6379/2".into(),
            node_id: Some("edge1".into()),
            ..Default::default()
        };
        let s = c.settings(base).unwrap();
        assert_eq!((s.period, s.fallback, s.node_id.as_str()), (DEFAULT_LEASE_PERIOD, Fallback::Share, "edge1"));
        assert_eq!(s.connection.redis_settings().db(), 2);
        assert_eq!(s.ttl(), Duration::from_secs(1));
        let db = GlobalConfig { database: Some(5), ..c.clone() }.settings(base).unwrap();
        assert_eq!(db.connection.redis_settings().db(), 5);
        for (bad, says) in [
            (GlobalConfig { redis_url: "http://x".into(), ..c.clone() }, "redis_url"),
            (GlobalConfig { lease_period: Some("1ms".into()), ..c.clone() }, "lease_period"),
            (GlobalConfig { fallback: Some("all".into()), ..c.clone() }, "fallback"),
            (GlobalConfig { node_id: Some("a b".into()), ..c.clone() }, "node_id"),
            (GlobalConfig { password_file: Some("nope".into()), ..c.clone() }, "password_file"),
        ] {
            let e = bad.settings(base).unwrap_err().to_string();
            assert!(e.contains(says), "{e}");
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pw"), "s3cret\n").unwrap();
        let pw = GlobalConfig { password_file: Some("pw".into()), ..c }.settings(dir.path()).unwrap();
        assert_eq!(pw.connection.redis_settings().password(), Some("s3cret"));
        assert!(!format!("{pw:?}").contains("s3cret"));
    }

    #[test]
    fn arithmetic() {
        let p = Duration::from_millis(100);
        assert_eq!(budget_per_period(30_000, p), 3000);
        // 5000 frames over 100 ms: 5000 and an eighth; over 200 ms half.
        assert_eq!(ask(5000, p, p), 5625);
        assert_eq!(ask(5000, p * 2, p), 2812);
        assert_eq!(ask(0, p, p), 0);
        assert_eq!(fallback_tokens(30_000, p, 3, Fallback::Share), 1000);
        assert_eq!(fallback_tokens(30_000, p, 0, Fallback::Share), 3000);
        assert_eq!(fallback_tokens(30_000, p, 3, Fallback::Local), 3000);
        // Under one packet a period: refused, saying what would do.
        assert_eq!(budget_too_small(10, p), None);
        let small = budget_too_small(9, p).unwrap();
        assert!(small.contains("9pps") && small.contains("at least 10pps"), "{small}");
        assert!(budget_too_small(1, Duration::from_secs(1)).is_none());
        assert!(budget_too_small(2, Duration::from_millis(300)).unwrap().contains("at least 4pps"));
        // 1000 tokens a period of 100 ms: 10 kpps, a bucket of 1000.
        assert_eq!(limiter(1000, p), policer_common::Rule::packets(10_000, 1000).unwrap());
        // Nothing granted: the smallest rate the kernel takes.
        assert_eq!(limiter(0, p), policer_common::Rule::packets(1, 1).unwrap());
    }
}
