//! Tier 3, control plane: live rule changes under load, restarts and
//! upgrades that keep policing and keep buckets, reloads of a hand-edited
//! config file, and bad input that changes nothing. The daemon and the
//! CLI are separate processes, each started with `ip netns exec`, as a
//! user runs them.

use std::{net::IpAddr, thread, time::Duration};

use policer_common::rate::Rate;
use policer_tests::{
    daemon::{Daemon, cli, fails_with, policer_bin, policer_in, succeeds},
    netns::Sandbox,
    privileged,
    traffic::{self, Flow, arrived_between, epoch_ns},
};

const MS: u64 = 1_000_000;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn heavy(pps: f64) -> Flow {
    Flow { src: ip("198.18.0.1"), pps, len: 64 }
}

fn rules_json(sb: &Sandbox) -> String {
    succeeds(&cli(sb, &["rule", "ls", "--json"]))
}

/// A rule change under load is live at once: the admitted rate moves to
/// the new value, with no burst of over-admission at the switch.
#[test]
fn rule_change_under_load_takes_effect_without_a_burst() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("chg");
    let _d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    let flood = traffic::run_bg(&sb, &[heavy(10_000.0)], Duration::from_secs(4));
    thread::sleep(Duration::from_millis(2000));
    let before = epoch_ns();
    succeeds(&cli(&sb, &["rule", "set", "198.18.0.0/16", "--rate", "200pps", "--burst", "10"]));
    let live = epoch_ns();
    let (sent, got) = flood.join().unwrap();
    assert_eq!(got.socket_drops, 0);
    let start = got.arrivals0[0];
    let end = start + (sent.span_secs(0) * 1e9) as u64;
    eprintln!("rule change took {:.1} ms (CLI round trip)", (live - before) as f64 / 1e6);
    // Each window against what an exact policer under that window's rule
    // admits of the frames as they were really sent: a sender stalled by
    // the host (tens of ms on a loaded 2-core machine) hands the bucket
    // idle time it cannot bank beyond its burst, which rate x T does not
    // know.
    let (old_rule, new_rule) = (Rate::Pps(1000).rule(10).unwrap(), Rate::Pps(200).rule(10).unwrap());
    let within = |got: u64, exact: u64| (got as f64 - exact as f64).abs() <= exact as f64 * 0.03 + 2.0;
    // Before: 1000/s.
    let old = arrived_between(&got, start + 500 * MS, before);
    let old_exact = traffic::exact_admitted_in(&sent, &old_rule, 0, start + 500 * MS, before);
    let old_span = (before - start - 500 * MS) as f64 / 1e9;
    assert!(
        within(old, old_exact),
        "old rate {:.1}/s, exactly {:.1}/s",
        old as f64 / old_span,
        old_exact as f64 / old_span
    );
    // Right after the CLI returns: no burst — the full bucket stays full
    // under the new rule, so the first half second gets 200/s * 0.5 s.
    let first = arrived_between(&got, live, live + 500 * MS);
    assert!(first <= 100 + 2, "{first} frames in the 500 ms after the change: a burst");
    // Live within 50 ms, and at the new rate from then on.
    let new_span = (end - live - 50 * MS) as f64 / 1e9;
    let new = arrived_between(&got, live + 50 * MS, end + MS);
    let new_exact = traffic::exact_admitted_in(&sent, &new_rule, 0, live + 50 * MS, end + MS);
    assert!(
        within(new, new_exact),
        "new rate {:.1}/s, exactly {:.1}/s",
        new as f64 / new_span,
        new_exact as f64 / new_span
    );
    // The change is in the file.
    let text = std::fs::read_to_string(&sb.config).unwrap();
    assert!(text.contains("198.18.0.0/16") && text.contains("200pps"), "{text}");
}

/// `kill -9` of the daemon during a flood: the kernel keeps policing,
/// exactly; a new daemon adopts the program.
#[test]
fn kill_9_during_a_flood_keeps_enforcing() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("k9");
    let mut d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    let id = sb.rx_xdp().unwrap();
    let mut flows = vec![heavy(10_000.0)];
    for i in 1..=20 {
        flows.push(Flow { src: ip(&format!("198.18.2.{i}")), pps: 100.0, len: 64 });
    }
    let flood = traffic::run_bg(&sb, &flows, Duration::from_secs(5));
    thread::sleep(Duration::from_millis(1500));
    d.stop_with(libc::SIGKILL);
    let (sent, got) = flood.join().unwrap();
    assert_eq!(sb.rx_xdp().as_deref(), Some(id.as_str()), "program gone after kill -9");
    // Exactly what an uninterrupted policer admits of what was really sent.
    let exact = traffic::exact_admitted(&sent, &Rate::Pps(1000).rule(10).unwrap(), 64) as f64;
    let admitted = got.per_flow[0] as f64;
    eprintln!(
        "kill -9: admitted {admitted}, uninterrupted policer {exact}, rate x T + burst {:.1}",
        1000.0 * sent.span_secs(0) + 10.0
    );
    assert!((admitted - exact).abs() <= exact * 0.01, "admitted {admitted}, expected {exact}");
    // The in-profile sources lost nothing the 1000 pps burst 10 rule would
    // not cut over their real send times (a stalled sender's catch-up).
    let rule = Rate::Pps(1000).rule(10).unwrap();
    for (i, f) in flows.iter().enumerate().skip(1) {
        if let Err(e) = traffic::within_rule(&sent, &got, &rule, i) {
            panic!("in-profile source {} lost frames: {e}", f.src);
        }
    }
    // No daemon now: the CLI says so, with exit status 3 (as LSB `status`
    // does); asked for JSON, in JSON on stdout with the same exit status.
    let out = cli(&sb, &["rule", "ls"]);
    assert_eq!(out.status.code(), Some(3));
    fails_with(&out, "no policer daemon is running");
    for verb in [&["rule", "ls", "--json"][..], &["stats", "--json"], &["inspect", "198.18.0.1", "--json"]] {
        let out = cli(&sb, verb);
        assert_eq!(out.status.code(), Some(3), "{verb:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON error");
        assert!(v["error"].as_str().unwrap().contains("no policer daemon is running"), "{verb:?}: {v}");
    }
    // `status` says the program left attached is policing with no daemon.
    let out = cli(&sb, &["status"]);
    assert_eq!(out.status.code(), Some(3));
    fails_with(&out, "policer is attached and policing with the rules it had (program ");
    fails_with(&out, &format!(" on {}; left by a --persist exit or a daemon that died)", sb.rx_if));
    // The same in JSON: the kept program by id and interface, exit 3.
    let out = cli(&sb, &["status", "--json"]);
    assert_eq!(out.status.code(), Some(3));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON status");
    assert_eq!(v["daemon"], false, "{v}");
    assert_eq!(v["exit"], 3, "{v}");
    assert_eq!(v["policing"][0]["interface"], sb.rx_if.as_str(), "{v}");
    assert_eq!(v["policing"][0]["program_id"].to_string(), id, "{v}");
    assert!(v["error"].as_str().unwrap().contains("no policer daemon is running"), "{v}");
    // A usage error: exit status 2 for every verb, and JSON when asked for.
    for verb in [&["stats", "--json", "--bogus"][..], &["ban", "10.0.0.0/8", "--json"], &["rule", "ls", "--json", "x"]]
    {
        let out = cli(&sb, verb);
        assert_eq!(out.status.code(), Some(2), "{verb:?}: {}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON usage error");
        assert!(!v["error"].as_str().unwrap().is_empty(), "{verb:?}: {v}");
    }
    // It says what is missing, not only that something is (issue 43, 15).
    let out = cli(&sb, &["inspect", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("a JSON usage error");
    let e = v["error"].as_str().unwrap();
    assert!(e.contains("not provided") && e.contains("<ADDR"), "{v}");
    // Refused (bad input): 1.
    assert_eq!(cli(&sb, &["rule", "set", "10.0.0.1/8", "--rate", "1kpps"]).status.code(), Some(1));
    // A new daemon adopts the program (no --rate: the rules come from the file).
    let mut d2 = Daemon::attach(&sb, &["--interval", "0"]);
    assert!(d2.stdout().contains("adopting the policer already running"), "{}", d2.stdout());
    assert!(rules_json(&sb).contains("0.0.0.0/0"));
    assert!(d2.stop_with(libc::SIGTERM));
    assert!(sb.rx_xdp().is_none());
}

/// Restart and upgrade: a daemon that exits with --persist leaves the
/// kernel policing; the next one replaces the program atomically and
/// adopts the buckets, so a heavy hitter gets no fresh burst.
#[test]
fn restart_adopts_buckets_and_replaces_the_program() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("rst");
    let mut d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "2000", "--interval", "0", "--persist"]);
    let id1 = sb.rx_xdp().unwrap();
    let flood = traffic::run_bg(&sb, &[heavy(10_000.0)], Duration::from_secs(6));
    thread::sleep(Duration::from_millis(2000));
    assert!(d.stop_with(libc::SIGTERM));
    assert!(d.stdout().contains("stays attached"), "{}", d.stdout());
    assert_eq!(sb.rx_xdp().as_deref(), Some(id1.as_str()), "--persist exit detached");
    thread::sleep(Duration::from_millis(500));
    let d2 = Daemon::attach(&sb, &["--interval", "0", "--persist"]);
    let id2 = sb.rx_xdp().unwrap();
    assert_ne!(id1, id2, "program not replaced");
    assert!(d2.stdout().contains(&format!("replaced program {id1}")), "{}", d2.stdout());
    let (sent, got) = flood.join().unwrap();
    // One bucket across the restart: what an uninterrupted policer admits
    // of what was really sent (a fresh burst would add 2000).
    let expected = traffic::exact_admitted(&sent, &Rate::Pps(1000).rule(2000).unwrap(), 64) as f64;
    let admitted = got.per_flow[0] as f64;
    eprintln!(
        "across a restart: admitted {admitted}, uninterrupted policer {expected}, rate x T + burst {:.1}",
        1000.0 * sent.span_secs(0) + 2000.0
    );
    assert!((admitted - expected).abs() <= expected * 0.01, "admitted {admitted}, expected {expected:.1}");
    // `policer detach` is the way to remove it: the daemon detaches and,
    // with no interface left, exits.
    let out = succeeds(&cli(&sb, &["detach", &sb.rx_if]));
    assert!(out.contains("detached from"), "{out}");
    thread::sleep(Duration::from_millis(300));
    assert!(sb.rx_xdp().is_none());
    drop(d2);
}

fn send_two(sb: &Sandbox) -> (u64, u64) {
    let flows =
        [Flow { src: ip("198.18.5.1"), pps: 100.0, len: 64 }, Flow { src: ip("198.18.6.1"), pps: 100.0, len: 64 }];
    let (sent, got) = traffic::run(sb, &flows, Duration::from_millis(700));
    if let Err(e) = traffic::within_rule(&sent, &got, &Rate::Pps(1000).rule(10).unwrap(), 1) {
        panic!("the other prefix lost frames (the default rule, 1000 pps burst 10): {e}");
    }
    (got.per_flow[0], sent.sent[0])
}

/// A hand-edited config is applied by `policer reload` and by SIGHUP, only
/// when all of it is valid; a bad edit changes nothing.
#[test]
fn reload_applies_a_hand_edited_file() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("rld");
    let d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    let orig = std::fs::read_to_string(&sb.config).unwrap();
    let deny = format!("{orig}\n[[rule]]\nprefix = \"198.18.5.0/24\"\naction = \"deny\"\n");
    std::fs::write(&sb.config, &deny).unwrap();
    assert!(succeeds(&cli(&sb, &["reload"])).contains("reloaded"));
    assert!(rules_json(&sb).contains("198.18.5.0/24"));
    let (got, sent) = send_two(&sb);
    assert_eq!((got, sent > 0), (0, true), "deny rule not applied");

    // A bad edit: refused, nothing changes, the file is left as written.
    let before = rules_json(&sb);
    for (bad, needle) in [
        (
            format!("{orig}\n[[rule]]\nprefix = \"198.18.7.0/24\"\nrate = \"1kpps\"\nburst = 5\ncolour = \"red\"\n"),
            "unknown key `colour`",
        ),
        (format!("{orig}\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"5pps\"\n"), "appears twice"),
        (format!("{orig}\n[[rule]]\nprefix = \"198.18.7.0/24\"\nrate = 500\n"), "rate: 500 is not a rate"),
        ("[daemon]\n".to_string(), "no rules"),
    ] {
        std::fs::write(&sb.config, &bad).unwrap();
        fails_with(&cli(&sb, &["reload"]), needle);
        assert_eq!(rules_json(&sb), before, "a refused reload changed the rules");
        assert_eq!(std::fs::read_to_string(&sb.config).unwrap(), bad, "the daemon rewrote a hand-edited file");
    }
    let (got, _) = send_two(&sb);
    assert_eq!(got, 0, "deny rule lost by a refused reload");

    // SIGHUP applies the original file again: the deny rule is gone.
    std::fs::write(&sb.config, &orig).unwrap();
    // SAFETY: signalling our child.
    unsafe { libc::kill(d.pid(), libc::SIGHUP) };
    thread::sleep(Duration::from_millis(300));
    assert!(!rules_json(&sb).contains("198.18.5.0/24"), "SIGHUP did not reload");
    let (got, sent) = send_two(&sb);
    assert_eq!(got, sent, "traffic still denied after SIGHUP reload");
}

/// Every bad input to the rule verbs: a clear message, a non-zero exit, no
/// change to the running rules or the file.
#[test]
fn bad_rule_input_changes_nothing() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("brl");
    let _d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8", "--rate", "5kpps", "--burst", "50"]));
    let rules = rules_json(&sb);
    let file = std::fs::read(&sb.config).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["rule", "set", "10.0.0.0/33", "--rate", "1kpps"], "must be 0 to 32"),
        (&["rule", "set", "2001:db8::/129", "--rate", "1kpps"], "must be 0 to 128"),
        (&["rule", "set", "203.0.113.5/24", "--rate", "1kpps"], "host bits set"),
        (&["rule", "set", "300.0.0.0/8", "--rate", "1kpps"], "not an IP address"),
        (&["rule", "set", "garbage", "--rate", "1kpps"], "not an IP address"),
        (&["rule", "set", "", "--rate", "1kpps"], "empty prefix"),
        (&["rule", "set", "10.0.0.0/x", "--rate", "1kpps"], "prefix length"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "0pps"], "rate out of range"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "-1pps"], "non-negative number"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1e3pps"], "unknown unit"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "99999999999999999999999pps"], "too large"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "5furlongs"], "unknown unit"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "100"], "unknown unit"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "999bit"], "rate out of range"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "500gbit"], "rate out of range"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "101Mpps"], "rate out of range"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--burst", "0"], "burst out of range"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--burst", "1000000001"], "burst out of range"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--burst", "64kb"], "unknown unit"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "64kbit", "--burst", "10pkts"], "unknown unit"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--burst", "-3"], "non-negative number"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--key-len", "33"], "out of range 1 to 32"),
        (&["rule", "set", "2001:db8::/32", "--rate", "1kpps", "--key-len", "129"], "out of range 1 to 128"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--key-len", "4"], "shorter than the prefix"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--key-len", "abc"], "not a number of bits"),
        (&["rule", "set", "10.0.0.0/8", "--rate", "1kpps", "--action", "explode"], "invalid value 'explode'"),
        (&["rule", "set", "10.9.0.0/16"], "needs a rate"),
        (&["rule", "set", "10.0.0.0/8", "--key-len", "4"], "shorter than the prefix"),
        (&["rule", "set", "10.0.0.0/8", "--ban-for", "forever"], "forever"),
        (&["rule", "set", "10.0.0.0/8", "--action", "deny", "--burst", "5"], "a burst needs a rate"),
        (&["rule", "rm", "10.9.0.0/16"], "no rule for 10.9.0.0/16"),
        (&["rule", "rm", "10.0.0.1/8"], "host bits set"),
        (&["rule", "frobnicate"], "unrecognized subcommand"),
        (&["detach", "nosuch0"], "not policed by this daemon"),
    ];
    for (args, needle) in cases {
        fails_with(&cli(&sb, args), needle);
        assert_eq!(rules_json(&sb), rules, "{args:?} changed the rules");
        assert_eq!(std::fs::read(&sb.config).unwrap(), file, "{args:?} changed the file");
    }
    // Not root: the socket is 0600.
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", &sb.rx_ns, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(policer_bin())
        .args(["rule", "set", "10.0.0.0/8", "--rate", "1pps"])
        .output()
        .unwrap();
    fails_with(&out, "needs root");
    assert_eq!(rules_json(&sb), rules);
    // No daemon in another namespace: said clearly.
    fails_with(&policer_in(&sb.tx_ns, &["rule", "ls"]), "no policer daemon is running");
    fails_with(&policer_in(&sb.tx_ns, &["reload"]), "no policer daemon is running");
    // And the good verbs work: byte mode, monitor/allow/deny, key length.
    for args in [
        &["rule", "set", "10.1.0.0/16", "--rate", "64kbit", "--burst", "1500b"][..],
        &["rule", "set", "10.2.0.0/16", "--rate", "1kpps", "--action", "monitor"],
        &["rule", "set", "10.3.0.0/16", "--action", "allow"],
        &["rule", "set", "2001:db8::/32", "--rate", "1kpps", "--key-len", "48"],
        &["rule", "rm", "10.3.0.0/16"],
    ] {
        succeeds(&cli(&sb, args));
    }
    let text = std::fs::read_to_string(&sb.config).unwrap();
    assert!(text.contains("64kbit") && text.contains("monitor") && !text.contains("10.3.0.0/16"), "{text}");
}

/// An IPv6 host rule needs no `--key-len` (its key is its own /128): a
/// deny of one host drops that host only, on the wire.
#[test]
fn an_ipv6_host_deny_needs_no_key_len() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("v6h");
    let _d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    succeeds(&cli(&sb, &["rule", "set", "2001:db8:5::1", "--action", "deny"]));
    let all: serde_json::Value = serde_json::from_str(&rules_json(&sb)).unwrap();
    let host = all.as_array().unwrap().iter().find(|r| r["prefix"] == "2001:db8:5::1/128").expect("the host rule");
    assert_eq!(host["action"], "deny", "{host}");
    let host = Flow { src: ip("2001:db8:5::1"), pps: 200.0, len: 80 };
    let neighbour = Flow { src: ip("2001:db8:5::2"), pps: 200.0, len: 80 };
    let (sent, got) = traffic::run(&sb, &[host, neighbour], Duration::from_millis(700));
    assert!(sent.sent[0] > 0 && sent.sent[1] > 0, "{:?}", sent.sent);
    assert_eq!(got.per_flow[0], 0, "the denied host got through");
    // The neighbour (200 pps) is policed by the /64's bucket (1000 pps,
    // burst 10) alone, the denied host charging none: all of it arrives
    // when the sender kept its pace; a stalled sender's catch-up burst past
    // 10 frames is cut exactly as the bucket says.
    let rule = policer_common::Rule::packets(1000, 10).unwrap();
    let exact = traffic::exact_admitted_flow(&sent, &rule, 1, 80);
    let ok = if exact == sent.sent[1] {
        got.per_flow[1] == exact
    } else {
        (got.per_flow[1] as f64 - exact as f64).abs() <= exact as f64 * 0.005 + 2.0
    };
    assert!(
        ok,
        "its neighbour in the same /64: {} of {} arrived, the bucket admits {exact}",
        got.per_flow[1], sent.sent[1]
    );
}

/// `rule set` on a rule in force changes the fields given and keeps the
/// rest, saying old → new; `--replace` takes the fields given alone; a
/// rate on a deny and a byte burst below one full frame are warned about.
#[test]
fn rule_set_merges_and_says_what_changed() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("mrg");
    let d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    let said =
        succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8", "--rate", "5kpps", "--burst", "50", "--ban-for", "1m"]));
    assert!(said.contains("added the rule for 10.0.0.0/8: ") && said.contains("burst 50"), "{said}");
    let said = succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8", "--rate", "10kpps"]));
    assert!(said.contains("changed the rule for 10.0.0.0/8: rate 5kpps → 10kpps"), "{said}");
    assert!(!said.contains("burst") && !said.contains("ban"), "only the rate changed: {said}");
    let row = |sb: &Sandbox| -> serde_json::Value {
        let all: serde_json::Value = serde_json::from_str(&rules_json(sb)).unwrap();
        all.as_array().unwrap().iter().find(|r| r["prefix"] == "10.0.0.0/8").cloned().unwrap()
    };
    let r = row(&sb);
    assert_eq!((r["burst"].clone(), r["rate"].clone()), (50.into(), "10kpps".into()), "{r}");
    assert!(std::fs::read_to_string(&sb.config).unwrap().contains("ban_for = \"1m\""), "the file lost the bans");
    let said = succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8"]));
    assert!(said.contains("the rule for 10.0.0.0/8 is unchanged"), "{said}");
    // --replace: the fields given alone.
    let said = succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8", "--rate", "10kpps", "--replace"]));
    assert!(said.contains("burst 50 → ") && said.contains("ban-for 1m → none"), "{said}");
    // A deny takes no rate: warned, and not listed as `deny 5pps`.
    let said = succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8", "--action", "deny", "--rate", "5pps"]));
    assert!(said.contains("action police → deny") && said.contains("warning: --rate (and --burst) ignored"), "{said}");
    assert!(row(&sb)["rate"].is_null(), "{}", row(&sb));
    // A rate given to the deny in force: still a deny, warned, no rate kept.
    let said = succeeds(&cli(&sb, &["rule", "set", "10.0.0.0/8", "--rate", "2kpps"]));
    assert!(said.contains("the rule for 10.0.0.0/8 is unchanged") && said.contains("warning: --rate"), "{said}");
    assert!(row(&sb)["rate"].is_null(), "{}", row(&sb));
    // A byte burst below one full-size frame.
    let said = succeeds(&cli(&sb, &["rule", "set", "10.1.0.0/16", "--rate", "64kbit", "--burst", "1000b"]));
    assert!(said.contains("warning: a burst of 1000 bytes is less than one 1500-byte frame"), "{said}");
    // The audit trail: each change in the daemon's log, with who made it.
    let log = d.stdout();
    assert!(
        log.lines().any(|l| l.starts_with("policer: change by uid 0 pid ")
            && l.contains("changed the rule for 10.0.0.0/8: rate 5kpps → 10kpps")),
        "{log}"
    );
}

/// The audit trail: a rule set through the socket, a reload of a hand
/// edit (rule by rule, old → new) and an expiry each leave one line in
/// the daemon's log saying who and what, and `stats --json` lists them.
#[test]
fn every_change_is_a_line_of_the_log_and_in_stats() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("aud");
    let d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    let wait_line = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let t = std::time::Instant::now();
        loop {
            let log = d.stdout();
            if let Some(l) = log.lines().find(|l| ok(l)) {
                return l.to_string();
            }
            assert!(t.elapsed() < Duration::from_secs(10), "no line for {what} in the daemon's log:\n{log}");
            thread::sleep(Duration::from_millis(50));
        }
    };
    // A change through the socket, timed: who (uid and pid) and what.
    succeeds(&cli(&sb, &["rule", "set", "10.9.0.0/16", "--rate", "2kpps", "--ttl", "3s"]));
    let set = wait_line("rule set", &|l| {
        l.starts_with("policer: change by uid 0 pid ") && l.contains("added the rule for 10.9.0.0/16")
    });
    // A hand edit: one rule changed, one added, reloaded (the follower or
    // `policer reload`, whichever comes first) rule by rule.
    let text = std::fs::read_to_string(&sb.config).unwrap();
    assert!(text.contains("prefix = \"0.0.0.0/0\"\nrate = \"1kpps\""), "{text}");
    let edited =
        text.replacen("prefix = \"0.0.0.0/0\"\nrate = \"1kpps\"", "prefix = \"0.0.0.0/0\"\nrate = \"2kpps\"", 1)
            + "\n[[rule]]\nprefix = \"198.51.100.0/24\"\naction = \"deny\"\n";
    std::fs::write(&sb.config, &edited).unwrap();
    let _ = cli(&sb, &["reload"]);
    let reload = wait_line("reload", &|l| {
        (l.starts_with("policer: change by uid 0 pid ")
            || l.starts_with("policer: change by the config file (followed): "))
            && l.contains("reloaded ")
            && l.contains("+198.51.100.0/24 (action deny")
    });
    assert!(
        reload.contains("0.0.0.0/0: rate 1kpps → 2kpps") && reload.contains("1 added, 1 changed, 0 removed"),
        "{reload}"
    );
    // An explicit reload of the same file: a line too (nothing changed).
    succeeds(&cli(&sb, &["reload"]));
    let again = wait_line("explicit reload", &|l| {
        l.starts_with("policer: change by uid 0 pid ")
            && l.contains("reloaded ")
            && l.contains("0 added, 0 changed, 0 removed")
    });
    // The timed rule ends by itself.
    let expiry =
        wait_line("expiry", &|l| l == "policer: change by expiry: the rule for 10.9.0.0/16 expired and was removed");
    // Each once, and `stats --json` lists them, oldest first, with a time.
    let log = d.stdout();
    for l in [&set, &reload, &again, &expiry] {
        assert_eq!(log.lines().filter(|x| x == l).count(), 1, "{l:?} not once in:\n{log}");
    }
    let stats: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["stats", "--json"]))).unwrap();
    let recent = stats["recent_changes"].as_array().unwrap_or_else(|| panic!("{stats}"));
    let line_of = |r: &serde_json::Value| {
        format!("policer: change by {}: {}", r["who"].as_str().unwrap(), r["what"].as_str().unwrap())
    };
    let lines: Vec<String> = recent.iter().map(line_of).collect();
    let pos = |l: &String| lines.iter().position(|x| x == l).unwrap_or_else(|| panic!("{l:?} not in {lines:#?}"));
    assert!(pos(&set) < pos(&reload) && pos(&reload) < pos(&again) && pos(&again) < pos(&expiry), "{lines:#?}");
    for r in recent {
        assert!(r["time"].as_str().is_some_and(|t| t.ends_with('Z')) && r["unix_ms"].as_u64() > Some(0), "{r}");
    }
}

/// `policer status` says what runs: version, uptime, each interface's
/// mode, the config and whether it can be written, rules, sets, bans and
/// where /metrics is served; `--json` the same, field by field.
#[test]
fn status_says_what_runs() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("sts");
    let sets_dir = std::path::Path::new(&sb.config).with_extension("sets");
    let _ = std::fs::remove_dir_all(&sets_dir);
    let list = std::env::temp_dir().join(format!("plc-sts-{}.txt", std::process::id()));
    std::fs::write(&list, "192.0.2.0/24\n198.51.100.7\n").unwrap();
    let _d = Daemon::attach(&sb, &["--rate", "1000pps", "--interval", "0", "--mode", "skb", "--metrics", "9477"]);
    succeeds(&cli(&sb, &["rule", "import", list.to_str().unwrap(), "--set", "feed", "--action", "deny"]));
    succeeds(&cli(&sb, &["ban", "203.0.113.0/24", "--for", "1h"]));
    thread::sleep(Duration::from_millis(1100));
    let text = succeeds(&cli(&sb, &["status"]));
    let version = env!("CARGO_PKG_VERSION");
    for want in [
        format!("policer {version} daemon pid "),
        ", up ".to_string(),
        format!("interfaces: {} (skb)", sb.rx_if),
        // The two default rules; the ban is counted with the bans.
        format!("config: {}; writable; 2 rules", sb.config),
        "sets: feed (deny, 2 entries)".to_string(),
        "bans: 1 manual, 0 automatic".to_string(),
        "metrics: http://127.0.0.1:9477/metrics".to_string(),
    ] {
        assert!(text.contains(&want), "no {want:?} in:\n{text}");
    }
    let v: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    assert_eq!(v["version"], version, "{v}");
    assert!(v["uptime_seconds"].as_f64().is_some_and(|u| u >= 1.0), "{v}");
    assert_eq!(v["interface_modes"], serde_json::json!([{ "name": sb.rx_if, "mode": "skb", "attached": true }]), "{v}");
    assert_eq!((v["protect"].clone(), v["captures"].clone()), (serde_json::json!([]), serde_json::json!(0)), "{v}");
    assert_eq!(
        v["sets"],
        serde_json::json!([{ "name": "feed", "action": "deny", "entries": 2, "origin": "saved" }]),
        "{v}"
    );
    assert_eq!(v["bans"], serde_json::json!({ "manual": 1, "auto": 0 }), "{v}");
    assert_eq!(v["metrics"], "127.0.0.1:9477", "{v}");
    assert_eq!(v["config_status"]["read_only"], false, "{v}");
    assert_eq!(v["rules"], 2, "{v}");
    let _ = std::fs::remove_file(&list);
    let _ = std::fs::remove_dir_all(&sets_dir);
}

/// A daemon (the default rule 1000 pps, burst 10) whose every sync of the
/// config file's new version and of its directory takes `ms` longer (the
/// test hook `POLICER_TEST_SLOW_SYNC_MS`).
fn slow_disk_daemon(sb: &Sandbox, ms: &str) -> Daemon {
    let bin = policer_bin();
    assert!(
        policer_tests::file_contains(&bin, b"POLICER_TEST_SLOW_SYNC_MS"),
        "{} has no test hooks: build it with `cargo build -p policer-user --bin policer --features test-hooks`",
        bin.display()
    );
    let args = ["attach", &sb.rx_if, "--config", &sb.config, "--rate", "1000pps", "--burst", "10", "--interval", "0"];
    Daemon::try_start(&bin, &sb.rx_ns, &args, &[("POLICER_TEST_SLOW_SYNC_MS", ms)]).expect("daemon")
}

/// Issue 43 point 14: a slow disk (each sync of the config file's new
/// version made 400 ms longer by the test hook `POLICER_TEST_SLOW_SYNC_MS`)
/// keeps no change waiting in the owner's queue behind it: the changes
/// that come while a write is on its way are taken at once into the next
/// group (the owner's own record of the longest wait stays far below the
/// sync), each is answered once written, and they police: a deny among
/// them drops a real flow, another prefix passes.
#[test]
fn a_slow_disk_keeps_no_change_waiting_behind_a_write() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("slw");
    let _d = slow_disk_daemon(&sb, "400");
    let status = |sb: &Sandbox| -> serde_json::Value {
        serde_json::from_str(&succeeds(&cli(sb, &["status", "--json"]))).unwrap()
    };
    let before = status(&sb)["config_status"].clone();
    // Four clients, six changes each, one after another.
    let acked: Vec<String> = thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|c| {
                let sb = &sb;
                s.spawn(move || {
                    (0..6)
                        .filter_map(|i| {
                            let prefix = format!("10.{}.{i}.0/24", 120 + c);
                            let args: Vec<&str> = if (c, i) == (0, 0) {
                                vec!["rule", "set", "198.18.5.0/24", "--action", "deny"]
                            } else {
                                vec!["rule", "set", &prefix, "--rate", "300pps", "--burst", "20"]
                            };
                            let out = cli(sb, &args);
                            out.status.success().then(|| args[2].to_string())
                        })
                        .collect::<Vec<String>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(acked.len(), 24, "changes refused: only {acked:?} answered");
    let after = status(&sb)["config_status"].clone();
    let writes = after["writes"].as_u64().unwrap() - before["writes"].as_u64().unwrap();
    let waited = after["longest_wait_ms"].as_f64().unwrap();
    let wrote = after["longest_write_ms"].as_f64().unwrap();
    eprintln!("24 changes in {writes} writes; the longest write {wrote:.0} ms, the longest wait {waited:.0} ms");
    // Each write took the slow sync; no change waited for one in the queue
    // (the bound is half the sync: a queue behind the disk waits up to all
    // of it, and more behind two).
    assert!(wrote >= 400.0, "the hook did not slow the writes: {after}");
    assert!(waited < 200.0, "a change waited {waited:.0} ms in the owner's queue behind a 400 ms write: {after}");
    assert!(writes < 24, "no two changes shared a write: {writes} writes");
    let text = std::fs::read_to_string(&sb.config).unwrap();
    let ls = rules_json(&sb);
    for p in &acked {
        assert!(text.contains(&format!("prefix = \"{p}\"")), "{p} answered, not in the file");
        assert!(ls.contains(&format!("\"{p}\"")), "{p} answered, not in force");
    }
    let (got, sent) = send_two(&sb);
    assert_eq!((got, sent > 0), (0, true), "the deny rule taken during a write does not drop");
}

/// A hand edit saved while the daemon writes the file, with a change of
/// the same rule taken meanwhile into the next group (the syncs made slow,
/// 1 s each, by `POLICER_TEST_SLOW_SYNC_MS`): the edit is never
/// overwritten. The change judged on the file before the edit is refused
/// (the file changed by hand), the edit stays as saved and the daemon
/// follows it; the change whose write was on its way when the edit came
/// stands.
#[test]
fn a_hand_edit_during_a_write_is_not_overwritten_by_the_next_group() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("hed");
    let _d = slow_disk_daemon(&sb, "1000");
    succeeds(&cli(&sb, &["rule", "set", "10.140.0.0/24", "--rate", "300pps", "--burst", "20"]));
    let (first, second) = thread::scope(|s| {
        // A write on its way (1 s to stage, 1 s to sync the directory
        // after the rename: room for a slow host to bring the next
        // request in meanwhile) ...
        let first = s.spawn(|| cli(&sb, &["rule", "set", "10.141.0.0/24", "--rate", "300pps", "--burst", "20"]));
        thread::sleep(Duration::from_millis(150));
        // ... a change of 10.140.0.0/24 taken into the next group ...
        let second = s.spawn(|| cli(&sb, &["rule", "set", "10.140.0.0/24", "--rate", "200pps"]));
        // ... and, once the first write is renamed into place, an edit
        // of that same rule's burst saved by hand.
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(&sb.config).unwrap().contains("10.141.0.0/24") {
            assert!(t0.elapsed() < Duration::from_secs(5), "the first write never landed");
            thread::sleep(Duration::from_millis(10));
        }
        let text = std::fs::read_to_string(&sb.config).unwrap();
        let at = text.find("prefix = \"10.140.0.0/24\"").expect("the rule in the file");
        let edited = format!("{}{}", &text[..at], text[at..].replacen("burst = 20", "burst = 77", 1));
        assert_ne!(edited, text, "{text}");
        std::fs::write(&sb.config, &edited).unwrap();
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let err = String::from_utf8_lossy(&second.stderr).to_string();
    assert!(!second.status.success() && err.contains("changed on disk"), "the next group was not refused: {err}");
    // The edit as saved, followed into force; the refused change nowhere.
    let t0 = std::time::Instant::now();
    loop {
        let ls = rules_json(&sb);
        if ls.contains("\"burst\": 77") {
            assert!(!ls.contains("200pps") && !ls.contains(": 200,"), "the refused change is in force: {ls}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "the hand edit was not followed: {ls}");
        thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(&sb.config).unwrap();
    assert!(text.contains("burst = 77") && text.contains("10.141.0.0/24"), "{text}");
    assert!(!text.contains("rate = \"200pps\""), "the refused change was written: {text}");
}

/// A temporary tightening of a permanent rule ends while a write is on
/// its way (the syncs made 1 s slower by `POLICER_TEST_SLOW_SYNC_MS`), with
/// a change of that rule taken meanwhile into the next group, judged on
/// the temporary rule (whose end it keeps): the permanent rule comes back
/// at the end, in force and in the file, as if the change had come first.
/// (Before: the end, handled between the two groups, was undone by the
/// next group's write, and at the next tick the rule was removed
/// altogether, in the kernel and in the file.)
#[test]
fn a_rule_ending_during_a_write_comes_back_after_the_next_groups_change() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("end");
    let _d = slow_disk_daemon(&sb, "1000");
    let p = "10.150.0.0/24";
    succeeds(&cli(&sb, &["rule", "set", p, "--rate", "500pps", "--burst", "20"]));
    // The tightening, in the kernel at once; it ends 4 s from now.
    let t = std::time::Instant::now();
    succeeds(&cli(&sb, &["rule", "set", p, "--rate", "100pps", "--ttl", "4s"]));
    let t0 = std::time::Instant::now();
    eprintln!("ttl set in {:?}", t.elapsed());
    thread::sleep(Duration::from_millis(2500));
    let (first, second) = thread::scope(|s| {
        // A write on its way across the end (about 2 s: 1 s to stage, 1 s
        // to sync the directory) ...
        let first = s.spawn(|| cli(&sb, &["rule", "set", "10.151.0.0/24", "--rate", "300pps", "--burst", "20"]));
        thread::sleep(Duration::from_millis(150));
        // ... and a change of the tightened rule taken into the next group.
        let second = s.spawn(|| cli(&sb, &["rule", "set", p, "--burst", "50"]));
        (first.join().unwrap(), second.join().unwrap())
    });
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    eprintln!("both answered at {:?}", t0.elapsed());
    assert!(t0.elapsed() > Duration::from_secs(4), "the second change was answered before the end came");
    // The end's own write after both (2 s), and the ticks after it: the
    // permanent rule back.
    let rule = loop {
        let ls: serde_json::Value = serde_json::from_str(&rules_json(&sb)).unwrap();
        let rule = ls.as_array().and_then(|r| r.iter().find(|r| r["prefix"] == p)).cloned();
        match rule {
            Some(r) if r["expires"].is_null() => break r,
            r => assert!(t0.elapsed() < Duration::from_secs(14), "{p} did not come back: {r:?}"),
        }
        thread::sleep(Duration::from_millis(100));
    };
    eprintln!("back at {:?}", t0.elapsed());
    assert_eq!((rule["rate"].as_str(), rule["burst"].as_u64()), (Some("500pps"), Some(20)), "{rule}");
    // Still so after more ticks.
    thread::sleep(Duration::from_millis(1000));
    assert!(rules_json(&sb).contains(&format!("\"{p}\"")), "{p} went after it came back");
    let text = std::fs::read_to_string(&sb.config).unwrap();
    let at = text.find(&format!("prefix = \"{p}\"")).unwrap_or_else(|| panic!("{p} is gone from the file: {text}"));
    let block = &text[at..text[at..].find("[[rule]]").map_or(text.len(), |e| at + e)];
    assert!(block.contains("rate = \"500pps\"") && block.contains("burst = 20"), "{block}");
}

/// A change refused on the strength of a write that then fails is refused
/// with that failure, not with what the failed write would have made true:
/// a `rule rm` of a rule whose removal is being written (the syncs made
/// slow) is "no rule" only if the removal lands; when the removal fails (a
/// hand edit saved meanwhile), the rule is still in force, and the second
/// `rule rm` says the file changed, as the first does (before: "no rule
/// for …", which a script takes as done).
#[test]
fn a_refusal_judged_on_a_failed_write_says_it_failed() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("rjf");
    let _d = slow_disk_daemon(&sb, "1000");
    let p = "10.160.0.0/24";
    succeeds(&cli(&sb, &["rule", "set", p, "--action", "deny"]));
    let (first, second) = thread::scope(|s| {
        let first = s.spawn(|| cli(&sb, &["rule", "rm", p]));
        thread::sleep(Duration::from_millis(150));
        let second = s.spawn(|| cli(&sb, &["rule", "rm", p]));
        // Saved by hand while the removal is staged (1 s to sync).
        thread::sleep(Duration::from_millis(250));
        let text = std::fs::read_to_string(&sb.config).unwrap();
        std::fs::write(&sb.config, format!("{text}# edited by hand\n")).unwrap();
        (first.join().unwrap(), second.join().unwrap())
    });
    let (e1, e2) = (String::from_utf8_lossy(&first.stderr), String::from_utf8_lossy(&second.stderr));
    assert!(!first.status.success() && e1.contains("changed on disk"), "the removal was not refused: {e1}");
    assert!(!second.status.success() && e2.contains("changed on disk"), "the second removal: {e2}");
    assert!(!e2.contains("no rule"), "the second removal was told the rule is gone: {e2}");
    assert!(rules_json(&sb).contains(&format!("\"{p}\"")), "the rule is not in force");
    assert!(std::fs::read_to_string(&sb.config).unwrap().contains(&format!("prefix = \"{p}\"")));
}

/// SIGTERM while a write is on its way (the syncs made 250 ms slower),
/// with a change taken meanwhile into the next group: the write on its way
/// lands and is answered, the next group is refused whole ("shutting
/// down; nothing changed": none of it is in the kernel or the file), and
/// the daemon leaves within its deadline, detached (before: it wrote the
/// next group too, missed the deadline, and left the program attached as
/// with --persist).
#[test]
fn sigterm_during_a_write_refuses_the_next_group_and_detaches() {
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("stw");
    let mut d = slow_disk_daemon(&sb, "250");
    let (a, b) = ("10.170.0.0/24", "10.171.0.0/24");
    let (first, second, clean) = thread::scope(|s| {
        let first = s.spawn(|| cli(&sb, &["rule", "set", a, "--rate", "300pps", "--burst", "20"]));
        thread::sleep(Duration::from_millis(100));
        let second = s.spawn(|| cli(&sb, &["rule", "set", b, "--rate", "300pps", "--burst", "20"]));
        thread::sleep(Duration::from_millis(100));
        let clean = d.stop_with(libc::SIGTERM);
        (first.join().unwrap(), second.join().unwrap(), clean)
    });
    let log = d.stderr();
    assert!(clean, "the daemon did not exit cleanly: {log}");
    assert!(!log.contains("did not answer"), "the owner missed the shutdown deadline: {log}");
    assert_eq!(sb.rx_xdp(), None, "the program stayed attached: {log}");
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let e2 = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success() && e2.contains("shutting down"), "the next group: {e2}");
    let text = std::fs::read_to_string(&sb.config).unwrap();
    assert!(text.contains(&format!("prefix = \"{a}\"")), "{text}");
    assert!(!text.contains(&format!("prefix = \"{b}\"")), "a refused change was written: {text}");
}

/// Ten clients changing rules at once: changes that queue behind a write
/// share the next one (group commit; `status --json` counts writes and the
/// changes they carried), each is answered only once it is on disk, and a
/// `kill -9` in the middle of it loses no change that was answered: the
/// file is whole, holds every acknowledged rule, and the next daemon
/// polices with them.
#[test]
fn concurrent_changes_share_writes_and_a_kill_9_loses_none_acknowledged() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if !privileged("control tier") {
        return;
    }
    let sb = Sandbox::new("grp");
    let mut d = Daemon::attach(&sb, &["--rate", "1000pps", "--burst", "10", "--interval", "0"]);
    let clients = 10;
    // Client `c` sets rules 10.(100+c).i.0/24 one after another until
    // `stop`; the prefixes whose change was answered.
    let client = |c: usize, stop: &AtomicBool| {
        let mut acked = Vec::new();
        for i in 0..100 {
            if stop.load(Ordering::SeqCst) {
                break;
            }
            let prefix = format!("10.{}.{i}.0/24", 100 + c);
            let args = ["rule", "set", prefix.as_str(), "--rate", "300pps", "--burst", "20"];
            if cli(&sb, &args).status.success() {
                acked.push(prefix);
            }
        }
        acked
    };
    let round = |first: usize, stop: &AtomicBool, then: &mut dyn FnMut()| -> Vec<String> {
        thread::scope(|s| {
            let hs: Vec<_> = (first..first + clients).map(|c| s.spawn(move || client(c, stop))).collect();
            then();
            hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
        })
    };

    // A first round to its end: every change answered and in the file, in
    // fewer writes than changes.
    let never = AtomicBool::new(false);
    let first = round(0, &never, &mut || {});
    assert_eq!(first.len(), clients * 100, "changes refused");
    let v: serde_json::Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    let writes = v["config_status"]["writes"].as_u64().unwrap();
    let written = v["config_status"]["changes_written"].as_u64().unwrap();
    eprintln!("{written} changes in {writes} writes");
    assert_eq!(written, (clients * 100) as u64, "every change was written: {v}");
    assert!(writes < written, "no two changes shared a write: {writes} writes for {written} changes");
    let text = std::fs::read_to_string(&sb.config).unwrap();
    for p in &first {
        assert!(text.contains(&format!("prefix = \"{p}\"")), "{p} acknowledged, not in the file");
    }

    // A second round, killed in the middle; some removals in it too.
    let stop = AtomicBool::new(false);
    let acked = round(clients, &stop, &mut || {
        for c in 0..clients {
            succeeds(&cli(&sb, &["rule", "rm", &format!("10.{}.0.0/24", 100 + c)]));
        }
        thread::sleep(Duration::from_millis(1000));
        d.stop_with(libc::SIGKILL);
        stop.store(true, Ordering::SeqCst);
    });
    assert!(acked.len() > clients, "only {} changes were answered before the kill", acked.len());
    // The file is whole (`policer check`) and holds every answered change.
    succeeds(&policer_in(&sb.rx_ns, &["check", "--config", &sb.config]));
    let text = std::fs::read_to_string(&sb.config).unwrap();
    let lost: Vec<&String> = acked.iter().filter(|p| !text.contains(&format!("prefix = \"{p}\""))).collect();
    assert!(lost.is_empty(), "{} of {} acknowledged changes lost by a kill -9: {lost:?}", lost.len(), acked.len());
    for c in 0..clients {
        assert!(!text.contains(&format!("prefix = \"10.{}.0.0/24\"", 100 + c)), "an acknowledged removal came back");
    }
    // The next daemon polices with them.
    let _d2 = Daemon::attach(&sb, &["--interval", "0"]);
    let ls = rules_json(&sb);
    for p in acked.iter().chain(first.iter().filter(|p| !p.ends_with(".0.0/24"))) {
        assert!(ls.contains(&format!("\"{p}\"")), "{p} not in force after the restart");
    }
}
