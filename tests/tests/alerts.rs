//! The alert rules (deploy/prometheus/alerts.yaml) and the Grafana
//! dashboard (deploy/grafana-dashboard.json) against the real tools: Debian's
//! `promtool` checks the rules and runs their unit tests
//! (deploy/prometheus/alerts_test.yaml); Debian's `prometheus` scrapes a
//! daemon that polices real traffic and pulls a real CrowdSec Local API,
//! evaluates every rule without an error and every dashboard query with
//! series to show, and the detach alert goes pending when the program is
//! taken off the interface behind the daemon's back. Both binaries are
//! unpacked by `cargo xtask setup` into `target/tools/prometheus/`.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use policer_tests::{
    daemon::{Daemon, cli, succeeds},
    fleet::Redis,
    lapi::{self, Lapi},
    netns::{Sandbox, ip},
    traffic::{self, Flow, RunOptions},
};
use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `target/tools/prometheus/usr/bin` (or under `$CARGO_TARGET_DIR`).
fn tools() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| repo().join("target"), PathBuf::from);
    target.join("tools/prometheus/usr/bin")
}

/// Whether promtool and prometheus are here; otherwise says why (and
/// under CI fails).
fn have_tools() -> bool {
    if tools().join("promtool").exists() && tools().join("prometheus").exists() {
        return true;
    }
    policer_tests::skip(&format!(
        "alerts tier: skipped: promtool and prometheus are not in {}: run `cargo xtask setup` (as root)",
        tools().display()
    ));
    false
}

fn promtool(args: &[&str]) -> (bool, String) {
    let o = Command::new(tools().join("promtool"))
        .args(args)
        .current_dir(repo().join("deploy/prometheus"))
        .output()
        .expect("run promtool");
    (o.status.success(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    if !have_tools() {
        return;
    }
    let (ok, out) = promtool(&["check", "rules", "alerts.yaml"]);
    assert!(ok, "{out}");
    // Every alert has a summary and a runbook line, and a unit test.
    let rules = std::fs::read_to_string(repo().join("deploy/prometheus/alerts.yaml")).unwrap();
    let tests = std::fs::read_to_string(repo().join("deploy/prometheus/alerts_test.yaml")).unwrap();
    let alerts: Vec<&str> = rules.lines().filter_map(|l| l.trim().strip_prefix("- alert: ")).collect();
    assert!(alerts.len() >= 12, "{alerts:?}");
    assert_eq!(rules.matches("summary:").count(), alerts.len(), "an alert without a summary");
    assert_eq!(rules.matches("runbook:").count(), alerts.len(), "an alert without a runbook line");
    for a in &alerts {
        assert!(tests.contains(&format!("alertname: {a}\n")), "no unit test fires {a}");
    }
    let (ok, out) = promtool(&["test", "rules", "alerts_test.yaml"]);
    assert!(ok && out.contains("SUCCESS"), "{out}");
    // And the unit tests can fail: a rule file whose detach alert never
    // fires is caught.
    let dir = std::env::temp_dir().join(format!("policer-alerts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("alerts.yaml"),
        rules.replace("policer_interface_attached == 0", "policer_interface_attached == 2"),
    )
    .unwrap();
    std::fs::write(dir.join("alerts_test.yaml"), &tests).unwrap();
    let o =
        Command::new(tools().join("promtool")).args(["test", "rules", "alerts_test.yaml"]).current_dir(&dir).output();
    let _ = std::fs::remove_dir_all(&dir);
    let o = o.expect("run promtool");
    assert!(!o.status.success(), "promtool passed a broken rule");
    assert!(String::from_utf8_lossy(&o.stderr).contains("PolicerProgramDetached"));
}

/// A Prometheus in namespace `ns`, on 127.0.0.1:`port` there, scraping
/// `target` every second and evaluating the alert rules every second.
struct Prometheus {
    ns: String,
    port: u16,
    dir: PathBuf,
    child: Child,
}

impl Prometheus {
    fn start(ns: &str, port: u16, target: SocketAddr) -> Prometheus {
        let dir = std::env::temp_dir().join(format!("policer-prom-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(repo().join("deploy/prometheus/alerts.yaml"), dir.join("alerts.yaml")).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - alerts.yaml\n\
                 scrape_configs:\n  - job_name: policer\n    static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(tools().join("prometheus"))
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let p = Prometheus { ns: ns.into(), port, dir, child };
        let t0 = Instant::now();
        while p.get("/-/ready").is_none_or(|(code, _)| code != 200) {
            assert!(t0.elapsed() < Duration::from_secs(30), "prometheus did not start:\n{}", p.log());
            std::thread::sleep(Duration::from_millis(200));
        }
        p
    }

    fn get(&self, path: &str) -> Option<(u16, String)> {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.port);
        lapi::http_in(&self.ns, addr, "GET", path, &[], None)
    }

    fn api(&self, path: &str) -> Value {
        let (code, body) = self.get(path).unwrap_or_else(|| panic!("GET {path}: no answer\n{}", self.log()));
        assert_eq!(code, 200, "GET {path}: {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{v}");
        v["data"].clone()
    }

    /// The instant query's result vector.
    fn query(&self, expr: &str) -> Vec<Value> {
        let d = self.api(&format!("/api/v1/query?query={}", encode(expr)));
        d["result"].as_array().cloned().unwrap_or_default()
    }

    /// The state of every alerting rule, and the rules that failed to
    /// evaluate (name: error).
    fn rules(&self) -> (Vec<(String, String)>, Vec<String>) {
        let d = self.api("/api/v1/rules");
        let (mut alerts, mut bad) = (Vec::new(), Vec::new());
        for g in d["groups"].as_array().unwrap() {
            for r in g["rules"].as_array().unwrap() {
                let name = r["name"].as_str().unwrap().to_string();
                if r["health"] != "ok" && r["health"] != "unknown" {
                    bad.push(format!("{name}: {} {}", r["health"], r["lastError"]));
                }
                if r["type"] == "alerting" {
                    alerts.push((name, r["state"].as_str().unwrap_or("").to_string()));
                }
            }
        }
        (alerts, bad)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Percent-encodes a query parameter (RFC 3986 unreserved kept).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Every query of the dashboard, with Grafana's variables as a panel would
/// send them: (panel title, expr).
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("deploy/grafana-dashboard.json")).unwrap()).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap().replace("$instance", ".*").replace("$__rate_interval", "15s");
            out.push((p["title"].as_str().unwrap_or("").to_string(), expr));
        }
    }
    out
}

#[test]
fn a_real_prometheus_evaluates_every_rule_and_every_dashboard_query_on_a_policing_daemon() {
    if !lapi::available("alerts tier") || !have_tools() {
        return;
    }
    let sb = Sandbox::new("prom");
    let lapi = Lapi::start(&sb.rx_ns, 18_490);
    let key = lapi.bouncer_key("policer-prom");
    lapi.add_ip("10.95.0.1", "1h");
    let (login, password) = lapi.machine();
    // Every kind of series the dashboard draws: a policed default with
    // automatic bans, a monitor rule, a class, an aggregate, a manual ban,
    // a feed that publishes, a fleet budget leased from a real Redis, a
    // class with SYN cookies.
    let _redis = Redis::start_on(&sb.rx_ns, "127.0.0.1", 16_391);
    std::fs::write(
        &sb.config,
        format!(
            "[crowdsec]\nlapi_url = \"{}\"\napi_key = \"{key}\"\nupdate_frequency = \"1s\"\npublish = true\n\
             machine_id = \"{login}\"\npassword = \"{password}\"\n\n\
             [global]\nredis_url = \"redis://127.0.0.1:16391\"\nnode_id = \"edge-a\"\n\n\
             [[rule]]\nprefix = \"10.98.0.0/16\"\nrate = \"1kpps\"\nburst = 10\ntotal_rate = \"2kpps\"\nglobal = \"svc\"\n\n\
             [[rule]]\nprefix = \"10.97.0.0/16\"\nproto = \"tcp\"\ndport = 8443\nrate = \"100pps\"\nburst = 10\n\
             syn_cookies = \"always\"\n\n\
             [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"200pps\"\nburst = 10\nban_for = \"1m\"\n\n\
             [[rule]]\nprefix = \"10.92.0.0/16\"\nrate = \"100pps\"\nburst = 10\naction = \"monitor\"\n\n\
             [[rule]]\nprefix = \"10.93.0.0/16\"\nrate = \"100pps\"\nburst = 10\nproto = \"udp\"\n\n\
             [[rule]]\nprefix = \"10.94.0.0/16\"\nrate = \"1kpps\"\nburst = 10\ntotal_rate = \"100pps\"\n\n\
             [[rule]]\nprefix = \"::/0\"\nrate = \"100kpps\"\nburst = 1000\n",
            lapi.url()
        ),
    )
    .unwrap();
    // --on-detach stay: the program taken off below stays off (the default
    // puts it back within a tick), so the alert has a state to see.
    let _d = Daemon::attach(&sb, &["--interval", "0", "--metrics", "9491", "--on-detach", "stay"]);
    succeeds(&cli(&sb, &["ban", "10.96.0.0/24", "--for", "1h", "--reason", "test"]));
    let prom = Prometheus::start(&sb.rx_ns, 19_491, "127.0.0.1:9491".parse().unwrap());
    let ip4 = |s: &str| -> IpAddr { s.parse().unwrap() };
    let flows = [
        Flow { src: ip4("10.91.0.5"), pps: 1000.0, len: 64 },
        Flow { src: ip4("10.92.0.5"), pps: 500.0, len: 64 },
        Flow { src: ip4("10.93.0.5"), pps: 500.0, len: 64 },
        Flow { src: ip4("10.94.0.5"), pps: 300.0, len: 64 },
        Flow { src: ip4("10.96.0.5"), pps: 100.0, len: 64 },
        Flow { src: ip4("10.98.0.5"), pps: 300.0, len: 64 },
    ];
    traffic::run_with(&sb, &flows, Duration::from_secs(6), &RunOptions::default());
    // A few scrapes after the traffic, and the rules evaluated on them.
    let t0 = Instant::now();
    while prom.query("policer_packets_total").is_empty() || prom.query("up == 1").is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no scrape of policer:\n{}", prom.log());
        std::thread::sleep(Duration::from_millis(500));
    }
    std::thread::sleep(Duration::from_secs(3));

    let mut empty = Vec::new();
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{queries:?}");
    for (title, expr) in &queries {
        if prom.query(expr).is_empty() {
            empty.push(format!("{title}: {expr}"));
        }
    }
    assert!(empty.is_empty(), "dashboard queries with no series:\n{}", empty.join("\n"));

    let (alerts, bad) = prom.rules();
    assert!(bad.is_empty(), "rules that failed to evaluate: {bad:?}");
    assert!(alerts.len() >= 12, "{alerts:?}");
    let state = |name: &str| prom.rules().0.into_iter().find(|(n, _)| n == name).map(|(_, s)| s);
    assert_eq!(state("PolicerDown").as_deref(), Some("inactive"));
    assert_eq!(state("PolicerProgramDetached").as_deref(), Some("inactive"));
    assert_eq!(state("PolicerConfigReloadRefused").as_deref(), Some("inactive"));
    // The program taken off behind the daemon's back: the alert's
    // expression holds on the next scrape (pending, firing after 1 min).
    ip(&["-n", &sb.rx_ns, "link", "set", &sb.rx_if, "xdp", "off"]);
    let t0 = Instant::now();
    while state("PolicerProgramDetached").as_deref() != Some("pending") {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "PolicerProgramDetached not pending: {:?}\n{}",
            prom.rules().0,
            prom.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
