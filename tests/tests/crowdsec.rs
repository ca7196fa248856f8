//! Tier 3, the CrowdSec feed (issue 30) against a real Local API (Debian's
//! crowdsec 1.4.6, started by the tests: `policer_tests::lapi`), the real
//! `policer` daemon and CLI, and real frames over veth counted on the
//! receiving side.
//!
//! - every decision of the Local API is in force after the startup pull
//!   (by count and per prefix in `rule ls --set crowdsec`, and on traffic
//!   for a sample: banned sources dropped, a captcha decision and others
//!   untouched); a delete lifts and an add drops within one poll; a
//!   decision ends at its own end;
//! - the Local API killed: what is in force stays in force and the failure
//!   shows in `status`, `stats --json` and /metrics; restarted, the feed
//!   catches up; a daemon restarted while the Local API is down starts with
//!   what was in force;
//! - a refused key fails the start with a clear error, and a key revoked at
//!   run time shows as a failure while the decisions stay;
//! - two daemons in two namespaces sharing one Local API: an automatic ban
//!   on one (`publish = true`) drops the source on the other;
//! - a published automatic ban shows in the operator's own views, `cscli
//!   decisions list` and `cscli alerts list` with their default filters,
//!   and leaves `cscli decisions list` at its end.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use policer_tests::{
    daemon::{Daemon, cli, samples, scrape, succeeds},
    lapi::{self, Lapi},
    netns::Sandbox,
    traffic::{self, Flow, RunOptions},
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A port per test (the LAPI listens in the test's namespace).
fn port(n: u16) -> u16 {
    18_400 + n
}

/// Writes the sandbox's config with a `[crowdsec]` table (`extra` keys
/// added), before the daemon starts.
fn write_config(sb: &Sandbox, url: &str, key: &str, extra: &str) {
    std::fs::write(
        &sb.config,
        format!(
            "[crowdsec]\nlapi_url = \"{url}\"\napi_key = \"{key}\"\nupdate_frequency = \"1s\"\n{extra}\n\n\
             [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100kpps\"\nburst = 1000\n\n\
             [[rule]]\nprefix = \"::/0\"\nrate = \"100kpps\"\nburst = 1000\n"
        ),
    )
    .unwrap();
}

fn daemon(sb: &Sandbox, metrics: u16) -> Daemon {
    let m = metrics.to_string();
    Daemon::attach(sb, &["--interval", "0", "--metrics", &m])
}

fn feed(sb: &Sandbox) -> serde_json::Value {
    let s: serde_json::Value = serde_json::from_str(&succeeds(&cli(sb, &["stats", "--json"]))).unwrap();
    s["feeds"][0].clone()
}

/// Waits until `cond` holds of the feed's status (at most `secs`).
fn wait_feed(sb: &Sandbox, secs: u64, what: &str, cond: impl Fn(&serde_json::Value) -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        let f = feed(sb);
        if cond(&f) {
            return t0.elapsed();
        }
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what}: not within {secs} s; the feed: {f:#}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The set's prefixes as `rule ls --set NAME` lists them.
fn set_entries(sb: &Sandbox, set: &str) -> Vec<String> {
    let out = cli(sb, &["rule", "ls", "--set", set]);
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.parse::<ipnet::IpNet>().is_ok())
        .map(str::to_string)
        .collect()
}

/// Until `cond` holds of the set's prefixes (at most `secs`): how long.
fn wait_set(sb: &Sandbox, secs: f64, what: &str, cond: impl Fn(&[String]) -> bool) -> Duration {
    let t0 = Instant::now();
    loop {
        let e = set_entries(sb, "crowdsec");
        if cond(&e) {
            return t0.elapsed();
        }
        assert!(t0.elapsed().as_secs_f64() < secs, "{what}: not within {secs} s; the set holds {e:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Seconds to wait for the end of a decision of `secs` added at `added`:
/// until 2 s past its end.
fn until_end(added: Instant, secs: u64) -> f64 {
    (added + Duration::from_secs(secs + 2)).saturating_duration_since(Instant::now()).as_secs_f64().max(2.0)
}

/// Sends 1 s of each flow; how many of each arrived, and were sent.
fn send(sb: &Sandbox, srcs: &[&str]) -> (Vec<u64>, Vec<u64>) {
    let flows: Vec<Flow> = srcs.iter().map(|s| Flow { src: ip(s), pps: 300.0, len: 64 }).collect();
    let (sent, got) = traffic::run_with(sb, &flows, Duration::from_secs(1), &RunOptions::default());
    (got.per_flow.clone(), sent.sent.clone())
}

#[test]
fn every_decision_is_in_force_after_the_sync_and_deletes_adds_and_ends_follow() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-sync");
    let lapi = Lapi::start(&sb.rx_ns, port(1));
    let key = lapi.bouncer_key("policer-sync");
    lapi.add_ip("10.71.0.1", "1h");
    lapi.add_ip("fd00:71::1", "1h");
    lapi.add_range("10.72.0.0/24", "1h");
    lapi.add_range("fd00:72::/64", "1h");
    lapi.add_decision(&["--ip", "10.73.0.1", "--type", "captcha", "--duration", "1h"]);
    // Long enough to be in force at the first pull on a busy host (a 4 s
    // one ended before a loaded debug daemon's start: 1005 of 1006).
    let short_added = Instant::now();
    lapi.add_ip("10.74.0.1", "20s");
    // A feed's worth in one import (Ip scope, some of them CIDRs).
    let mut csv = String::from("value,duration,reason\n");
    for i in 0..1000u32 {
        csv.push_str(&format!("10.80.{}.{},1h,bulk\n", i / 250, i % 250 + 1));
    }
    csv.push_str("10.81.0.0/24,1h,bulk range\n");
    assert_eq!(lapi.import_csv(&csv, &[]), 1001);
    write_config(&sb, &lapi.url(), &key, "");
    let _d = daemon(&sb, 9481);
    let expect = 4 + 1 + 1001;
    wait_feed(&sb, 5, "the startup sync", |f| f["decisions"] == expect);
    // Every prefix, by name.
    let e = set_entries(&sb, "crowdsec");
    assert_eq!(e.len(), expect, "{e:?}");
    for p in ["10.71.0.1/32", "fd00:71::1/128", "10.72.0.0/24", "fd00:72::/64", "10.74.0.1/32", "10.81.0.0/24"] {
        assert!(e.iter().any(|x| x == p), "{p} is not in the set: {e:?}");
    }
    assert!(!e.iter().any(|x| x.starts_with("10.73.0.1")), "a captcha decision was applied as a ban");
    let f = feed(&sb);
    assert_eq!(f["skipped"]["type:captcha"], 1, "{f:#}");
    assert_eq!(f["last_sync_success"], true, "{f:#}");
    assert_eq!(f["decisions_by_origin"]["cscli"], 5, "{f:#}");
    // On traffic: the banned drop, the others pass.
    let (got, sent) = send(&sb, &["10.71.0.1", "10.72.0.9", "fd00:72::9", "10.80.1.7", "10.73.0.1", "10.75.0.1"]);
    assert_eq!(&got[..4], &[0, 0, 0, 0], "banned sources got through: {got:?} of {sent:?}");
    assert_eq!(got[4..], sent[4..], "unbanned sources lost frames: {got:?} of {sent:?}");
    // A delete lifts, an add drops, within one poll (1 s) and a second.
    lapi.delete_ip("10.71.0.1");
    lapi.add_ip("10.76.0.1", "1h");
    let took = wait_set(&sb, 2.0, "a delete and an add", |e| {
        !e.iter().any(|x| x == "10.71.0.1/32") && e.iter().any(|x| x == "10.76.0.1/32")
    });
    eprintln!("a delta in force {:.2} s after cscli returned", took.as_secs_f64());
    let (got, sent) = send(&sb, &["10.71.0.1", "10.76.0.1"]);
    assert_eq!((got[0], got[1]), (sent[0], 0), "after the delta: {got:?} of {sent:?}");
    // The 20 s decision ended at its end (+2 s), with no word from the feed.
    wait_set(&sb, until_end(short_added, 20), "the end of a 20 s decision", |e| !e.iter().any(|x| x == "10.74.0.1/32"));
    // The feed counts the end once the owner has written the set: its
    // status follows the set by a moment. Counted once: as its own end,
    // or as the Local API's deletion when that came first (the Local API
    // answers the time left, which the daemon counts from the answer's
    // arrival: its end is later than the Local API's by the answer's way,
    // and a pull in between brings the deletion; seen once in a full run
    // under load). `deleted` holds the delete above too.
    wait_feed(&sb, 2, "the end counted", |f| {
        f["expired"].as_u64().unwrap_or(0) + f["deleted"].as_u64().unwrap_or(0) >= 2
    });
    let f = feed(&sb);
    assert_eq!(f["expired"].as_u64().unwrap_or(0) + f["deleted"].as_u64().unwrap_or(0), 2, "counted once: {f:#}");
    // /metrics and status say it.
    let m = samples(&scrape(&sb.rx_ns, 9481));
    assert_eq!(m.get("policer_crowdsec_last_sync_success"), Some(&1.0), "{m:?}");
    assert!(m.contains_key("policer_crowdsec_decisions{origin=\"cscli\"}"), "{m:?}");
    assert_eq!(m.get("policer_crowdsec_decisions_skipped_total{reason=\"type:captcha\"}"), Some(&1.0), "{m:?}");
    let st = succeeds(&cli(&sb, &["status"]));
    assert!(st.contains("feed: crowdsec http://127.0.0.1:") && st.contains("into set 'crowdsec'"), "{st}");
    // The set is the feed's: no hand changes it.
    let before = set_entries(&sb, "crowdsec");
    let list = std::env::temp_dir().join(format!("{}-list.txt", sb.rx_ns));
    std::fs::write(&list, "10.77.0.1\n").unwrap();
    let imp = cli(&sb, &["rule", "import", list.to_str().unwrap(), "--action", "deny", "--set", "crowdsec"]);
    policer_tests::daemon::fails_with(&imp, "is the CrowdSec feed's");
    policer_tests::daemon::fails_with(&cli(&sb, &["rule", "rm", "--set", "crowdsec"]), "is the CrowdSec feed's");
    let _ = std::fs::remove_file(&list);
    assert_eq!(set_entries(&sb, "crowdsec"), before, "a refused change changed the set");
    // The key is nowhere to be read.
    let all = format!(
        "{st}{}{}{}",
        succeeds(&cli(&sb, &["status", "--json"])),
        succeeds(&cli(&sb, &["stats", "--json"])),
        scrape(&sb.rx_ns, 9481)
    );
    assert!(!all.contains(&key), "the API key leaked into a view");
}

#[test]
fn the_lapi_down_keeps_what_is_in_force_and_the_feed_catches_up() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-down");
    let mut lapi = Lapi::start(&sb.rx_ns, port(2));
    let key = lapi.bouncer_key("policer-down");
    lapi.add_ip("10.71.0.2", "1h");
    let short_added = Instant::now();
    lapi.add_ip("10.71.0.3", "15s");
    write_config(&sb, &lapi.url(), &key, "");
    let mut d = daemon(&sb, 9482);
    wait_feed(&sb, 5, "the startup sync", |f| f["decisions"] == 2);
    lapi.kill();
    wait_feed(&sb, 5, "a failed pull", |f| f["last_sync_success"] == false);
    let f = feed(&sb);
    assert!(f["errors"]["connect"].as_u64().unwrap_or(0) >= 1, "{f:#}");
    assert!(f["last_error"].as_str().unwrap().contains("cannot connect"), "{f:#}");
    let m = samples(&scrape(&sb.rx_ns, 9482));
    assert_eq!(m.get("policer_crowdsec_last_sync_success"), Some(&0.0), "{m:?}");
    let st = succeeds(&cli(&sb, &["status"]));
    assert!(st.contains("last pull FAILED"), "{st}");
    // Down: the ban stays; the 15 s one still ends at its end.
    let (got, sent) = send(&sb, &["10.71.0.2", "10.75.0.2"]);
    assert_eq!((got[0], got[1]), (0, sent[1]), "with the LAPI down: {got:?} of {sent:?}");
    wait_set(&sb, until_end(short_added, 15), "the end of a 15 s decision with the LAPI down", |e| {
        !e.iter().any(|x| x == "10.71.0.3/32") && e.iter().any(|x| x == "10.71.0.2/32")
    });
    // Back: what changed meanwhile arrives.
    lapi.restart();
    lapi.add_ip("10.71.0.4", "1h");
    lapi.delete_ip("10.71.0.2");
    // The retry waits at most its backoff (2, 4, ... s since the failure).
    wait_set(&sb, 20.0, "catching up after the LAPI came back", |e| {
        e.iter().any(|x| x == "10.71.0.4/32") && !e.iter().any(|x| x == "10.71.0.2/32")
    });
    wait_feed(&sb, 5, "a good pull again", |f| f["last_sync_success"] == true);
    // A daemon restarted while the Local API is down starts with what was
    // in force (its state file), not with an open door.
    assert!(d.stop_with(libc::SIGTERM));
    drop(d);
    lapi.kill();
    let d = daemon(&sb, 9482);
    assert!(d.stdout().contains("does not answer yet"), "{}", d.stdout());
    // In force from the start (the set is saved), not from the feed's
    // first pull or its state file a moment later.
    let e = set_entries(&sb, "crowdsec");
    assert!(e.iter().any(|x| x == "10.71.0.4/32"), "after a restart with the LAPI down the set holds {e:?}");
    let (got, sent) = send(&sb, &["10.71.0.4", "10.75.0.2"]);
    assert_eq!((got[0], got[1]), (0, sent[1]), "after the restart: {got:?} of {sent:?}");
}

#[test]
fn a_refused_key_fails_the_start_and_a_revoked_one_shows_at_run_time() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-key");
    let lapi = Lapi::start(&sb.rx_ns, port(3));
    write_config(&sb, &lapi.url(), "not-a-key", "");
    let bin = policer_tests::daemon::policer_bin();
    let args = ["attach", sb.rx_if.as_str(), "--config", sb.config.as_str(), "--interval", "0"];
    let e = match Daemon::try_start(&bin, &sb.rx_ns, &args, &[]) {
        Ok(_) => panic!("a daemon started with a refused key"),
        Err(e) => e,
    };
    assert!(e.stderr.contains("refused the credentials"), "{}", e.stderr);
    assert!(!e.stderr.contains("not-a-key"), "the key is quoted: {}", e.stderr);
    let key = lapi.bouncer_key("policer-key");
    // Publishing with a wrong machine password: refused at start too.
    let (login, _) = lapi.machine();
    write_config(
        &sb,
        &lapi.url(),
        &key,
        &format!("publish = true\nmachine_id = \"{login}\"\npassword = \"wrong-pw\"\n"),
    );
    let e = match Daemon::try_start(&bin, &sb.rx_ns, &args, &[]) {
        Ok(_) => panic!("a daemon started with a refused machine login"),
        Err(e) => e,
    };
    assert!(e.stderr.contains(&format!("refused the login of machine '{login}'")), "{}", e.stderr);
    assert!(!e.stderr.contains("wrong-pw"), "the password is quoted: {}", e.stderr);
    lapi.add_ip("10.71.0.5", "1h");
    write_config(&sb, &lapi.url(), &key, "");
    let _d = daemon(&sb, 9483);
    wait_feed(&sb, 5, "the startup sync", |f| f["decisions"] == 1);
    lapi.cscli(&["bouncers", "delete", "policer-key"]);
    wait_feed(&sb, 5, "a refused pull", |f| f["last_sync_success"] == false);
    let f = feed(&sb);
    assert!(f["errors"]["http_403"].as_u64().unwrap_or(0) >= 1, "{f:#}");
    assert!(f["last_error"].as_str().unwrap().contains("refused the credentials"), "{f:#}");
    assert_eq!(f["decisions"], 1, "{f:#}");
    let (got, _) = send(&sb, &["10.71.0.5"]);
    assert_eq!(got[0], 0, "a revoked key opened the blocklist");
}

#[test]
fn an_automatic_ban_on_one_node_drops_the_source_on_the_other() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let a = Sandbox::new("cs-fleet-a");
    let b = Sandbox::new("cs-fleet-b");
    let lapi = Lapi::start(&a.rx_ns, port(4));
    let (addr_a, _) = lapi::link_namespaces(&a.rx_ns, &b.rx_ns);
    let (login, password) = lapi.machine();
    let key_a = lapi.bouncer_key("policer-a");
    let key_b = lapi.bouncer_key("policer-b");
    let publish = format!("publish = true\nmachine_id = \"{login}\"\npassword = \"{password}\"\n");
    write_config(&a, &lapi.url(), &key_a, &publish);
    write_config(&b, &lapi.url_at(addr_a), &key_b, &publish);
    let _da = daemon(&a, 9484);
    let _db = daemon(&b, 9485);
    wait_feed(&a, 5, "node A's first pull", |f| f["last_sync_success"] == true);
    wait_feed(&b, 5, "node B's first pull", |f| f["last_sync_success"] == true);
    // Node A bans a heavy source of 10.90.0.0/16 for a minute.
    succeeds(&cli(&a, &["rule", "set", "10.90.0.0/16", "--rate", "100pps", "--burst", "10", "--ban-for", "60s"]));
    // The flood's first refused frame starts the ban (--ban-after 1): the
    // flood's start is the ban's, to a few ms.
    let flows = [Flow { src: ip("10.90.0.5"), pps: 2000.0, len: 64 }];
    let banned = Instant::now();
    std::thread::scope(|s| {
        s.spawn(|| traffic::run_with(&a, &flows, Duration::from_millis(500), &RunOptions::default()));
        // Node B, which never saw the source, drops it within its
        // update_frequency (1 s) and a second of the ban's start.
        wait_set(&b, 4.0, "the ban reaching node B", |e| e.iter().any(|x| x == "10.90.0.5/32"));
        let took = banned.elapsed();
        eprintln!("node B enforced node A's ban {:.2} s after it started", took.as_secs_f64());
        assert!(took <= Duration::from_secs(2), "{took:?}: more than update_frequency + 1 s");
    });
    wait_feed(&a, 5, "node A's publication", |f| f["published"].as_u64().unwrap_or(0) >= 1);
    let f = feed(&b);
    // Of origin `crowdsec`, as any watcher's (so `cscli decisions list`
    // shows it).
    assert_eq!(f["decisions_by_origin"]["crowdsec"], 1, "{f:#}");
    let (got, sent) = send(&b, &["10.90.0.5", "10.90.0.6"]);
    assert_eq!((got[0], got[1]), (0, sent[1]), "on node B: {got:?} of {sent:?}");
    // No loop: node B publishes nothing (it banned nothing itself).
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(feed(&b)["published"], 0);
    assert_eq!(feed(&a)["published"], 1);
}

/// What `cscli decisions list -o json` or `cscli alerts list -o json`
/// (the operator's plain command: only cscli's default filters) lists,
/// as the alerts it prints (`null` when there is none).
fn cscli_list(lapi: &Lapi, what: &str) -> Vec<serde_json::Value> {
    let out = lapi.cscli(&[what, "list", "-o", "json"]);
    let v: serde_json::Value =
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("cscli {what} list -o json: not JSON ({e}): {out}"));
    v.as_array().cloned().unwrap_or_default()
}

/// The listed alerts whose source is `value`.
fn alerts_of<'a>(alerts: &'a [serde_json::Value], value: &str) -> Vec<&'a serde_json::Value> {
    alerts.iter().filter(|a| a["source"]["value"] == value).collect()
}

/// The operator's own views of the Local API show a published automatic
/// ban (issue 43, point 16): `cscli decisions list` and `cscli alerts
/// list`, with only their default filters, list the banned source with
/// policer's scenario and message, sent by the daemon's machine, and
/// `cscli decisions list` drops it at the ban's end. (CrowdSec 1.4.6 lists
/// by default only alerts with a decision of origin `crowdsec` or `cscli`:
/// an alert whose decisions were of origin `policer` was served to the
/// bouncers and shown by neither command without `--all`.)
#[test]
fn a_published_automatic_ban_shows_in_cscli_decisions_and_alerts_lists_until_its_end() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-cscli");
    let lapi = Lapi::start(&sb.rx_ns, port(11));
    let (login, password) = lapi.machine();
    let key = lapi.bouncer_key("policer-cscli");
    let publish = format!("publish = true\nmachine_id = \"{login}\"\npassword = \"{password}\"\n");
    write_config(&sb, &lapi.url(), &key, &publish);
    let _d = daemon(&sb, 9491);
    wait_feed(&sb, 5, "the first pull", |f| f["last_sync_success"] == true);
    assert!(cscli_list(&lapi, "decisions").is_empty() && cscli_list(&lapi, "alerts").is_empty());
    // A heavy source of 10.91.0.0/16 banned for 5 s by its first refused
    // frame (the flood's start is the ban's, to a few ms).
    succeeds(&cli(&sb, &["rule", "set", "10.91.0.0/16", "--rate", "100pps", "--burst", "10", "--ban-for", "5s"]));
    let flows = [Flow { src: ip("10.91.0.5"), pps: 2000.0, len: 64 }];
    let banned = Instant::now();
    traffic::run_with(&sb, &flows, Duration::from_millis(300), &RunOptions::default());
    wait_feed(&sb, 3, "the ban's publication", |f| f["published"].as_u64().unwrap_or(0) >= 1);
    // What bouncers get is the ban: the source, a ban, policer's scenario.
    let s = lapi.stream(&key, true);
    let served: Vec<_> =
        s["new"].as_array().into_iter().flatten().filter(|d| d["value"] == "10.91.0.5").cloned().collect();
    assert_eq!(served.len(), 1, "{s:#}");
    for (field, want) in [("type", "ban"), ("scope", "Ip"), ("scenario", "policer/auto-ban")] {
        assert_eq!(served[0][field], want, "{s:#}");
    }
    // `cscli decisions list`: the source, banned, for policer's reason.
    let listed = cscli_list(&lapi, "decisions");
    let mine = alerts_of(&listed, "10.91.0.5");
    assert_eq!(mine.len(), 1, "cscli decisions list does not show the ban: {listed:#?}");
    let a = mine[0];
    assert_eq!(a["source"]["scope"], "Ip", "{a:#}");
    assert_eq!(a["scenario"], "policer/auto-ban", "{a:#}");
    assert_eq!(a["machine_id"], login.as_str(), "{a:#}");
    let d = &a["decisions"][0];
    for (field, want) in [("value", "10.91.0.5"), ("type", "ban"), ("scenario", "policer/auto-ban")] {
        assert_eq!(d[field], want, "{a:#}");
    }
    // `cscli alerts list`: the alert, with policer's message.
    let listed = cscli_list(&lapi, "alerts");
    let mine = alerts_of(&listed, "10.91.0.5");
    assert_eq!(mine.len(), 1, "cscli alerts list does not show the ban: {listed:#?}");
    assert_eq!(mine[0]["scenario"], "policer/auto-ban", "{:#}", mine[0]);
    let message = mine[0]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("policer: automatic ban of 10.91.0.5 for 5 s"), "{message}");
    // At the ban's end (5 s, published a moment after it started) it
    // leaves `cscli decisions list`.
    loop {
        let listed = cscli_list(&lapi, "decisions");
        if alerts_of(&listed, "10.91.0.5").is_empty() {
            break;
        }
        let t = banned.elapsed();
        assert!(t < Duration::from_secs(8), "still listed {:.1} s after a 5 s ban: {listed:#?}", t.as_secs_f64());
        std::thread::sleep(Duration::from_millis(200));
    }
    let gone = banned.elapsed();
    eprintln!("the ban left cscli decisions list {:.2} s after it started", gone.as_secs_f64());
    assert!(gone >= Duration::from_millis(4500), "{gone:?}: gone from cscli decisions list before the ban's end");
}

/// An operator who finds its own network among the feed's decisions can
/// protect it: the reload that adds `protect` is taken (not refused for
/// the feed's entries inside it), those entries leave the set at once and
/// pass on the wire, the rest stay dropped, and later syncs keep them out.
#[test]
fn protecting_a_prefix_the_feed_lists_is_taken_and_leaves_it_out() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-prot");
    let lapi = Lapi::start(&sb.rx_ns, port(6));
    let key = lapi.bouncer_key("policer-prot");
    lapi.add_ip("10.75.0.5", "1h");
    lapi.add_ip("10.76.0.5", "1h");
    write_config(&sb, &lapi.url(), &key, "");
    let _d = daemon(&sb, 9486);
    wait_set(&sb, 5.0, "the startup sync", |e| e.len() == 2);
    let (got, sent) = send(&sb, &["10.75.0.5", "10.76.0.5"]);
    assert!(sent[0] > 100 && got == [0, 0], "{got:?} of {sent:?}");
    // The operator's own network, 10.75.0.0/24, was listed by the feed.
    let text = std::fs::read_to_string(&sb.config).unwrap();
    let with = if text.contains("[daemon]\n") {
        text.replacen("[daemon]\n", "[daemon]\nprotect = [\"10.75.0.0/24\"]\n", 1)
    } else {
        format!("[daemon]\nprotect = [\"10.75.0.0/24\"]\n\n{text}")
    };
    std::fs::write(&sb.config, with).unwrap();
    let out = cli(&sb, &["reload"]);
    assert!(out.status.success(), "the reload was refused: {}", String::from_utf8_lossy(&out.stderr));
    wait_set(&sb, 5.0, "the protected entry left out", |e| e == ["10.76.0.5/32"]);
    let (got, sent) = send(&sb, &["10.75.0.5", "10.76.0.5"]);
    assert_eq!((got[0], got[1]), (sent[0], 0), "the protected source must pass, the other stay dropped");
    // A later sync (a new decision) keeps it out, and says so.
    lapi.add_ip("10.77.0.5", "1h");
    wait_set(&sb, 5.0, "the next sync", |e| e == ["10.76.0.5/32", "10.77.0.5/32"]);
    wait_feed(&sb, 5, "the left-out count", |f| f["left_out_protected"] == 1);
    // Issue 43 point 5: the feed's count and the set's agree, the
    // protected entry counted apart, in `status` too.
    let f = feed(&sb);
    assert_eq!(f["prefixes"], 3, "{f:#}");
    assert_eq!(set_entries(&sb, "crowdsec").len(), 3 - 1, "the set holds the prefixes less the one left out");
    let st = succeeds(&cli(&sb, &["status"]));
    assert!(
        st.contains("(3 prefixes, 1 of them left out of the set (1 inside protected prefixes, 0 at a rule's prefix))"),
        "{st}"
    );
    assert!(st.lines().any(|l| l.starts_with("sets: ") && l.contains(", 2 entries")), "{st}");
}

/// Issue 41, point 6: after a failed pull, a 200 whose body is an object
/// but not the stream (`{"message": "maintenance"}`, as a LAPI behind a
/// maintenance page answers) is a failed pull that changes nothing — it
/// emptied the set ("startup pull: 0 new, 258 deleted"). The decisions
/// come from the real LAPI through a small proxy in its place
/// ([`lapi::Proxy`]), which then answers like the broken peer.
#[test]
fn a_200_answer_that_is_not_the_stream_is_a_failed_pull_and_changes_nothing() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-maint");
    let lapi = Lapi::start(&sb.rx_ns, port(7));
    let key = lapi.bouncer_key("policer-maint");
    lapi.add_ip("10.71.7.1", "1h");
    lapi.add_range("10.72.7.0/24", "1h");
    let proxy = lapi::Proxy::start(&sb.rx_ns, port(17), lapi.port());
    write_config(&sb, &proxy.url(), &key, "");
    let _d = daemon(&sb, 9487);
    wait_feed(&sb, 10, "the startup sync through the proxy", |f| f["decisions"] == 2 && f["last_sync_success"] == true);
    let before = set_entries(&sb, "crowdsec");
    assert_eq!(before.len(), 2, "{before:?}");
    // One failed pull (so the next is a startup pull), then the answer
    // that is no stream.
    proxy.answer(503, r#"{"message":"down"}"#);
    wait_feed(&sb, 10, "a failed pull", |f| f["errors"]["http_503"].as_u64().unwrap_or(0) >= 1);
    proxy.answer(200, r#"{"message":"maintenance"}"#);
    wait_feed(&sb, 20, "the maintenance answer taken as a failed pull", |f| {
        f["errors"]["parse"].as_u64().unwrap_or(0) >= 1
    });
    let f = feed(&sb);
    assert_eq!(f["last_sync_success"], false, "{f:#}");
    let why = f["last_error"].as_str().unwrap_or("");
    assert!(why.contains("not a decision stream"), "{f:#}");
    assert_eq!(why.matches("decision stream").count(), 1, "said twice: {why}");
    assert_eq!(f["decisions"], 2, "the maintenance answer changed the decisions: {f:#}");
    assert_eq!(set_entries(&sb, "crowdsec"), before, "the maintenance answer changed the set");
    let m = samples(&scrape(&sb.rx_ns, 9487));
    assert!(m.get("policer_crowdsec_errors_total{kind=\"parse\"}").copied().unwrap_or(0.0) >= 1.0, "{m:?}");
    assert_eq!(m.get("policer_crowdsec_last_sync_success"), Some(&0.0), "{m:?}");
    let st = succeeds(&cli(&sb, &["status"]));
    assert!(st.contains("last pull FAILED"), "{st}");
    // Still in force on traffic.
    let (got, sent) = send(&sb, &["10.71.7.1", "10.72.7.9", "10.75.7.1"]);
    assert_eq!((got[0], got[1], got[2]), (0, 0, sent[2]), "after the maintenance answer: {got:?} of {sent:?}");
    // The LAPI back: the feed catches up (a startup pull).
    proxy.pass();
    lapi.add_ip("10.76.7.1", "1h");
    wait_set(&sb, 40.0, "catching up after the maintenance", |e| e.len() == 3);
    wait_feed(&sb, 5, "a good pull again", |f| f["last_sync_success"] == true);
    assert!(proxy.served() >= 4, "the proxy served {}", proxy.served());
}

/// Issue 41, point 7: `min_prefix_len` bounds each decision, not the feed:
/// 256 `/8` decisions dropped all of IPv4. What all the decisions cover is
/// bounded per family (`max_cover_v4`, by default a /7's worth); a pull
/// beyond it is refused whole, what was in force stays, and sources
/// outside the earlier bans pass. Decisions from the real LAPI.
#[test]
fn decisions_covering_more_than_max_cover_are_refused_whole_and_earlier_bans_stay() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-cover");
    let lapi = Lapi::start(&sb.rx_ns, port(8));
    let key = lapi.bouncer_key("policer-cover");
    lapi.add_ip("10.71.8.1", "1h");
    lapi.add_range("11.0.0.0/8", "1h");
    write_config(&sb, &lapi.url(), &key, "");
    let _d = daemon(&sb, 9488);
    wait_feed(&sb, 10, "the startup sync", |f| f["decisions"] == 2 && f["last_sync_success"] == true);
    // Two more /8s: three /8s and a host are more than a /7's worth.
    lapi.add_range("12.0.0.0/8", "1h");
    lapi.add_range("13.0.0.0/8", "1h");
    wait_feed(&sb, 10, "the pull beyond the bound refused", |f| f["errors"]["cover"].as_u64().unwrap_or(0) >= 1);
    let f = feed(&sb);
    assert_eq!(f["last_sync_success"], false, "{f:#}");
    let why = f["last_error"].as_str().unwrap_or("");
    assert!(why.contains("max_cover_v4 = 7") && why.contains("refused"), "{f:#}");
    assert_eq!(f["decisions"], 2, "{f:#}");
    let mut e = set_entries(&sb, "crowdsec");
    e.sort();
    assert_eq!(e, ["10.71.8.1/32", "11.0.0.0/8"], "a refused pull changed the set");
    let m = samples(&scrape(&sb.rx_ns, 9488));
    assert!(m.get("policer_crowdsec_errors_total{kind=\"cover\"}").copied().unwrap_or(0.0) >= 1.0, "{m:?}");
    // The earlier bans drop; sources outside them, inside the refused
    // ranges, pass.
    let (got, sent) = send(&sb, &["10.71.8.1", "11.1.2.3", "12.1.2.3", "13.1.2.3", "10.75.8.1"]);
    assert_eq!(&got[..2], &[0, 0], "the earlier bans: {got:?} of {sent:?}");
    assert_eq!(got[2..], sent[2..], "sources of the refused pull were dropped: {got:?} of {sent:?}");
    // Back within the bound (a /8 and a host): taken at the next
    // (startup) pull.
    lapi.cscli(&["decisions", "delete", "--range", "13.0.0.0/8"]);
    lapi.cscli(&["decisions", "delete", "--range", "11.0.0.0/8"]);
    wait_set(&sb, 40.0, "the feed within its bound again", |e| {
        e.iter().any(|x| x == "12.0.0.0/8") && !e.iter().any(|x| x == "11.0.0.0/8")
    });
    wait_feed(&sb, 5, "a good pull again", |f| f["last_sync_success"] == true);
    let (got, sent) = send(&sb, &["12.1.2.3", "13.1.2.3", "11.1.2.3", "10.71.8.1"]);
    assert_eq!(got, [0, sent[1], sent[2], 0], "within the bound: {got:?} of {sent:?}");
}

/// Review of point 7: a restart must not bring back what a pull would
/// refuse. Decisions within the bound are saved (state file and set); the
/// daemon restarts, the Local API down, under a tighter `max_cover_v4`:
/// the state file is refused as a pull beyond the bound is (counted
/// `cover`, logged), the feed starts empty and the set saved with the file
/// is written empty, so its sources pass. It restored both and kept them.
#[test]
fn a_restart_does_not_restore_decisions_beyond_max_cover() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-restore");
    let mut lapi = Lapi::start(&sb.rx_ns, port(9));
    let key = lapi.bouncer_key("policer-restore");
    lapi.add_ip("10.71.9.1", "1h");
    lapi.add_range("11.0.0.0/8", "1h");
    write_config(&sb, &lapi.url(), &key, "");
    let mut d = daemon(&sb, 9489);
    wait_feed(&sb, 10, "the startup sync", |f| f["decisions"] == 2 && f["last_sync_success"] == true);
    wait_set(&sb, 10.0, "the feed's set", |e| e.len() == 2);
    assert!(d.stop_with(libc::SIGTERM));
    drop(d);
    lapi.kill();
    // One /8's worth: a /8 and a host are beyond it.
    write_config(&sb, &lapi.url(), &key, "max_cover_v4 = 8");
    let d = daemon(&sb, 9489);
    wait_feed(&sb, 10, "the state file refused", |f| f["errors"]["cover"].as_u64().unwrap_or(0) >= 1);
    wait_set(&sb, 10.0, "the set written empty", |e| e.is_empty());
    let f = feed(&sb);
    assert_eq!(f["decisions"], 0, "{f:#}");
    let log = format!("{}\n{}", d.stdout(), d.stderr());
    assert!(log.contains("not restored") && log.contains("max_cover_v4 = 8"), "{log}");
    let (got, sent) = send(&sb, &["10.71.9.1", "11.1.2.3"]);
    assert_eq!(got, sent, "sources of the refused state file were dropped: {got:?} of {sent:?}");
}

/// Review: a startup pull after a failed one (a Local API restart, one
/// 503) that finds the same decisions imports nothing; only the daemon's
/// first good pull and a change do (each import is a "change by crowdsec"
/// line). Every such startup pull imported the whole set again.
#[test]
fn a_startup_pull_after_a_failure_that_changes_nothing_imports_nothing() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-noimport");
    let lapi = Lapi::start(&sb.rx_ns, port(10));
    let key = lapi.bouncer_key("policer-noimport");
    lapi.add_ip("10.71.10.1", "1h");
    let proxy = lapi::Proxy::start(&sb.rx_ns, port(20), lapi.port());
    write_config(&sb, &proxy.url(), &key, "");
    let d = daemon(&sb, 9490);
    wait_feed(&sb, 10, "the startup sync", |f| f["decisions"] == 1 && f["last_sync_success"] == true);
    wait_set(&sb, 10.0, "the feed's set", |e| e.len() == 1);
    let imports = || d.stdout().lines().filter(|l| l.contains("change by crowdsec")).count();
    assert_eq!(imports(), 1, "{}", d.stdout());
    proxy.answer(503, r#"{"message":"down"}"#);
    wait_feed(&sb, 10, "a failed pull", |f| f["errors"]["http_503"].as_u64().unwrap_or(0) >= 1);
    let served = proxy.served();
    proxy.pass();
    // The startup pull after it, and a delta after that: both good.
    wait_feed(&sb, 20, "a good pull again", |f| f["last_sync_success"] == true);
    let t0 = Instant::now();
    while proxy.served() < served + 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "no pulls after the failure");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(imports(), 1, "a startup pull that changed nothing imported the set: {}", d.stdout());
    // A change still imports.
    lapi.add_ip("10.71.10.2", "1h");
    wait_set(&sb, 10.0, "the new decision", |e| e.len() == 2);
    let t0 = Instant::now();
    while imports() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(5), "the change's import not logged: {}", d.stdout());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(imports(), 2, "{}", d.stdout());
}

/// The Local API answers a pull of changes with what it wrote since its
/// last answer to the key, and a decision it wrote while it answered one
/// is in neither answer: 40 000 decisions imported while the daemon pulls
/// every second (the import spans several pulls) lost 50 in every run
/// here. The whole pull every `full_sync_every` brings them in: the set
/// ends up holding every decision the Local API's own whole answer holds.
#[test]
fn a_whole_pull_brings_in_what_the_pulls_of_changes_missed() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    const N: u32 = 40_000;
    let sb = Sandbox::new("cs-whole");
    let lapi = Lapi::start(&sb.rx_ns, port(12));
    let key = lapi.bouncer_key("policer-whole");
    write_config(&sb, &lapi.url(), &key, "full_sync_every = \"6s\"");
    let d = daemon(&sb, 19_412);
    wait_feed(&sb, 20, "the first pull", |f| f["last_sync_success"] == true);
    let mut csv = String::from("value,duration,reason\n");
    for i in 0..N {
        let a = std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(10, 80, 0, 0)) + i);
        csv.push_str(&format!("{a},1h,whole\n"));
    }
    assert_eq!(lapi.import_csv(&csv, &[]), N as usize);
    // Read with a key of its own: the Local API keeps each key's last pull.
    let truth = lapi.stream(&lapi.bouncer_key("policer-truth"), true)["new"].as_array().map_or(0, |a| a.len());
    assert_eq!(truth, N as usize, "the Local API's whole answer");
    wait_feed(&sb, 30, "every decision in force", |f| f["decisions"] == u64::from(N));
    let out = d.stdout();
    let deltas: Vec<&str> = out.lines().filter(|l| l.contains("crowdsec: delta pull:")).collect();
    let wholes: Vec<&str> = out.lines().filter(|l| l.contains("crowdsec: whole pull:")).collect();
    eprintln!("{}\n{}", deltas.join("\n"), wholes.join("\n"));
    let by_deltas: u64 =
        deltas.iter().filter_map(|l| l.split("delta pull: ").nth(1)?.split(' ').next()?.parse::<u64>().ok()).sum();
    if by_deltas < u64::from(N) {
        // What the pulls of changes missed came with a whole pull, said.
        assert!(
            wholes.iter().any(|l| l.contains(&format!("whole pull: {} new, 0 deleted", u64::from(N) - by_deltas))),
            "the pulls of changes brought {by_deltas} of {N}; the whole pulls said: {wholes:?}"
        );
    } else {
        eprintln!("this run's pulls of changes missed nothing (the import fell between two pulls)");
    }
}

/// A valid but empty stream (a Local API restarted before its database is
/// there, one answer gone wrong) must not lift a blocklist: a whole answer
/// that would remove most of what is in force is doubted: what it leaves
/// out stays on traffic, what it adds is taken, said once and counted; the
/// doubt ends as soon as a whole answer agrees with what is held (the
/// minute after which a removal said by every whole answer is taken is the
/// host test's: `a_whole_answer_removing_most_is_taken_only_once_said_for_a_minute`).
/// The decisions come from the real LAPI; the short answer from a proxy in
/// front of it.
#[test]
fn a_valid_empty_whole_answer_does_not_lift_the_blocklist_at_once() {
    if !lapi::available("crowdsec tier") {
        return;
    }
    let sb = Sandbox::new("cs-shrink");
    let lapi = Lapi::start(&sb.rx_ns, port(13));
    let key = lapi.bouncer_key("policer-shrink");
    let mut csv = String::from("value,duration,reason\n");
    for i in 1..=12 {
        csv.push_str(&format!("10.73.13.{i},1h,shrink\n"));
    }
    assert_eq!(lapi.import_csv(&csv, &[]), 12);
    let proxy = lapi::Proxy::start(&sb.rx_ns, port(23), lapi.port());
    write_config(&sb, &proxy.url(), &key, "full_sync_every = \"2s\"");
    let d = daemon(&sb, 9492);
    wait_feed(&sb, 10, "the startup sync", |f| f["decisions"] == 12 && f["last_sync_success"] == true);
    wait_set(&sb, 10.0, "the feed's set", |e| e.len() == 12);
    // A valid stream with one new decision and none of the 12.
    proxy.answer(
        200,
        r#"{"new":[{"id":990013,"origin":"cscli","type":"ban","scope":"Ip","value":"10.74.13.9","duration":"1h",
            "scenario":"shrink"}],"deleted":null}"#,
    );
    wait_feed(&sb, 10, "a whole answer doubted", |f| f["errors"]["shrink"].as_u64().unwrap_or(0) >= 2);
    let f = feed(&sb);
    assert_eq!(f["decisions"], 13, "{f:#}");
    let why = f["last_error"].as_str().unwrap_or("");
    assert!(
        why.contains("would remove 12 of the 13 decisions in force") || why.contains("remove 12 of the 12"),
        "{f:#}"
    );
    wait_set(&sb, 5.0, "the 12 and the new one", |e| e.len() == 13);
    let said = |d: &Daemon| d.stderr().matches("decisions in force: they stay until").count();
    assert_eq!(said(&d), 1, "said once, not at every pull: {}", d.stderr());
    let st = succeeds(&cli(&sb, &["status"]));
    assert!(st.contains("last pull ok at") && st.contains("they stay until whole answers have said so"), "{st}");
    let m = samples(&scrape(&sb.rx_ns, 9492));
    assert!(m.get("policer_crowdsec_errors_total{kind=\"shrink\"}").copied().unwrap_or(0.0) >= 2.0, "{m:?}");
    let (got, sent) = send(&sb, &["10.73.13.1", "10.73.13.12", "10.74.13.9", "10.74.13.1"]);
    assert_eq!((got[0], got[1], got[2], got[3]), (0, 0, 0, sent[3]), "under the short answers: {got:?} of {sent:?}");
    // The real answer again: the one it lacks goes, the doubt ends.
    proxy.pass();
    wait_set(&sb, 10.0, "the real answer's 12", |e| e.len() == 12);
    wait_feed(&sb, 10, "the doubt over", |f| f["last_error"].is_null());
    let shrinks = feed(&sb)["errors"]["shrink"].as_u64().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let f = feed(&sb);
    assert_eq!((f["decisions"].as_u64(), f["errors"]["shrink"].as_u64()), (Some(12), Some(shrinks)), "{f:#}");
}
