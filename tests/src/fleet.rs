//! Fleet budgets' test and benchmark rig (docs/fleet.md): a control
//! namespace with a bridge and Debian's redis-server on it, and three edge
//! namespaces, each with its own `policer` daemon, a veth to the bridge and
//! a veth from its own generator namespace (a [`Sandbox`]).

use std::{
    process::{Child, Command, Stdio},
    sync::{Arc, atomic::AtomicBool},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{
    daemon::{Daemon, cli, succeeds},
    netns::{self, Sandbox, ip, ip_out},
    packet::RawSocket,
    traffic::{self, Flow, SendReport},
};

/// Redis's address on the control bridge.
pub const REDIS_IP: &str = "10.77.0.254";

/// A redis-server in the control namespace, killed on drop.
pub struct Redis {
    ns: String,
    bind: String,
    port: u16,
    child: Option<Child>,
}

impl Redis {
    pub fn start(ns: &str, port: u16) -> Redis {
        Redis::start_on(ns, REDIS_IP, port)
    }

    /// A redis-server listening on `bind` in `ns`.
    pub fn start_on(ns: &str, bind: &str, port: u16) -> Redis {
        let mut r = Redis { ns: ns.into(), bind: bind.into(), port, child: None };
        r.restart();
        r
    }

    pub fn restart(&mut self) {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns, "redis-server", "--bind", &self.bind, "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no", "--loglevel", "warning"])
            // DEBUG SLEEP: a Redis that answers late (the fleet tier).
            .args(["--enable-debug-command", "yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (Debian's redis-server package: cargo xtask setup installs it)");
        self.child = Some(child);
        let t0 = Instant::now();
        while !self.answers() {
            assert!(t0.elapsed() < Duration::from_secs(10), "redis-server did not start");
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether `PING` is answered `PONG`.
    pub fn answers(&self) -> bool {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.ns, "redis-cli", "-h", &self.bind, "-p", &self.port.to_string(), "ping"])
            .stdin(Stdio::null())
            .output();
        out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // `ip netns exec` execs redis-server: the child is Redis.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Three edges, a control namespace with a bridge and Redis, a daemon on
/// each edge.
pub struct Fleet {
    pub edges: Vec<Sandbox>,
    pub daemons: Vec<Option<Daemon>>,
    pub redis: Redis,
    pub ctl: String,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.daemons.clear();
        self.redis.stop();
        let _ = ip_out(&["netns", "del", &self.ctl]);
    }
}

pub const METRICS: u16 = 19_470;

impl Fleet {
    /// The control namespace, Redis and three edges whose config holds
    /// `[global]` and `rules` (TOML), each with its daemon, all leasing.
    pub fn new(tag: &str, rules: &str) -> Fleet {
        let id = std::process::id() % 10_000;
        let ctl = format!("plc-{tag}-{id}-ctl");
        let _ = ip_out(&["netns", "del", &ctl]);
        ip(&["netns", "add", &ctl]);
        ip(&["-n", &ctl, "link", "set", "lo", "up"]);
        ip(&["-n", &ctl, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &ctl, "addr", "add", &format!("{REDIS_IP}/24"), "dev", "br0"]);
        ip(&["-n", &ctl, "link", "set", "br0", "up"]);
        let redis = Redis::start(&ctl, 6379);
        let mut edges = Vec::new();
        for n in 0..3 {
            let sb = Sandbox::new(&format!("{tag}{n}"));
            let (e, c) = (format!("fe{id}{n}"), format!("fc{id}{n}"));
            ip(&["link", "add", &e, "netns", &sb.rx_ns, "type", "veth", "peer", "name", &c, "netns", &ctl]);
            ip(&["-n", &ctl, "link", "set", &c, "master", "br0", "up"]);
            ip(&["-n", &sb.rx_ns, "addr", "add", &format!("10.77.0.{}/24", n + 1), "dev", &e]);
            ip(&["-n", &sb.rx_ns, "link", "set", &e, "up"]);
            std::fs::write(
                &sb.config,
                format!("[global]\nredis_url = \"redis://{REDIS_IP}:6379/0\"\nnode_id = \"edge{n}\"\n\n{rules}"),
            )
            .unwrap();
            edges.push(sb);
        }
        let mut f = Fleet { edges, daemons: Vec::new(), redis, ctl };
        for n in 0..3 {
            let d = f.start_daemon(n);
            f.daemons.push(Some(d));
        }
        f.wait_up(&[0, 1, 2], Duration::from_secs(5));
        f
    }

    pub fn start_daemon(&self, n: usize) -> Daemon {
        let m = (METRICS + n as u16).to_string();
        Daemon::attach(&self.edges[n], &["--interval", "0", "--metrics", &m])
    }

    pub fn status(&self, n: usize) -> Value {
        serde_json::from_str(&succeeds(&cli(&self.edges[n], &["status", "--json"]))).unwrap()
    }

    /// The fleet part of `status --json`, and its one budget.
    pub fn fleet(&self, n: usize) -> (Value, Value) {
        let f = self.status(n)["fleet"].clone();
        let b = f["budgets"].get(0).cloned().unwrap_or(Value::Null);
        (f, b)
    }

    /// The frames the rule admitted on edge `n` so far, and when read.
    pub fn passed(&self, n: usize) -> (u64, Instant) {
        let s: Value = serde_json::from_str(&succeeds(&cli(&self.edges[n], &["stats", "--json"]))).unwrap();
        let at = Instant::now();
        let r = s["rules"].as_array().unwrap().iter().find(|r| r["prefix"] == "0.0.0.0/0").expect("the rule");
        (r["passed_packets"].as_u64().expect("passed_packets"), at)
    }

    /// Each edge's admitted rate over `window`, packets/s.
    pub fn admitted(&self, edges: &[usize], window: Duration) -> Vec<f64> {
        let before: Vec<_> = edges.iter().map(|n| self.passed(*n)).collect();
        thread::sleep(window);
        let after: Vec<_> = edges.iter().map(|n| self.passed(*n)).collect();
        before.iter().zip(&after).map(|(a, b)| (b.0 - a.0) as f64 / (b.1 - a.1).as_secs_f64()).collect()
    }

    /// Waits until every edge of `edges` leases from Redis.
    pub fn wait_up(&self, edges: &[usize], within: Duration) {
        let t0 = Instant::now();
        for n in edges {
            while self.fleet(*n).0["backend_up"] != true {
                assert!(t0.elapsed() < within, "edge {n} never leased: {}", self.status(*n));
                thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// Sends `pps` (over 16 sources) to edge `n` for `secs` in the
    /// background.
    pub fn load(&self, n: usize, pps: f64, secs: f64, stop: &Arc<AtomicBool>) -> thread::JoinHandle<SendReport> {
        let sb = &self.edges[n];
        let (tns, tif, mac) = (sb.tx_ns.clone(), sb.tx_if.clone(), sb.rx_mac());
        let flows: Vec<Flow> = (0..16)
            .map(|i| Flow { src: format!("198.18.{n}.{}", i + 1).parse().unwrap(), pps: pps / 16.0, len: 64 })
            .collect();
        let stop = stop.clone();
        thread::spawn(move || {
            netns::enter(&tns).unwrap();
            let sock = RawSocket::bind(&tif).unwrap();
            sock.big_buffers().unwrap();
            traffic::send(&sock, &flows, mac, 7, Duration::from_secs_f64(secs), &stop)
        })
    }
}
