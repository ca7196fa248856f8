//! Tier 3, `--dry-run` (issue 31, point 2) on real traffic: the real
//! `policer` daemon and CLI as separate processes, real frames over a veth
//! pair from another namespace, counted on the receiving side.
//!
//! - `--dry-run` of each of `rule set`, `rule rm`, `rule import`, `ban` and
//!   `reload` changes nothing: the program's rule tries, limiters and
//!   counters (read from outside the daemon, by program id), the config
//!   file's bytes, the sets' state files and the audit trail are the same
//!   before and after;
//! - with a heavy source and sources in profile sending, a dry run that
//!   lowers the rate names exactly the sources that go pass → drop; the
//!   real change then makes exactly those lose frames on the wire, and the
//!   others not; a dry run that raises it names the sources that go drop →
//!   pass, and after the real change they lose none;
//! - a dry run the real change would refuse (a deny of 0.0.0.0/0 without
//!   --force, a bad rate, a rule rm of no rule, a reload of a broken file)
//!   fails with the same message and exit status, and changes nothing.

use std::{
    net::IpAddr,
    sync::{Arc, atomic::AtomicBool},
    time::Duration,
};

use policer_common::rate::Rate;
use policer_tests::{
    daemon::{Daemon, cli, succeeds},
    kstate,
    netns::Sandbox,
    privileged,
    traffic::{self, Flow, RunOptions},
};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn prog_id(sb: &Sandbox) -> u32 {
    sb.rx_xdp().expect("no XDP program attached").parse().unwrap()
}

fn json(out: &std::process::Output) -> serde_json::Value {
    let s = succeeds(out);
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// Everything a change could touch, read from outside the daemon.
#[derive(Debug, PartialEq)]
struct Everything {
    kernel: kstate::State,
    config: Vec<u8>,
    sets: Vec<(String, Vec<u8>)>,
    rules: String,
    changes: String,
}

fn everything(sb: &Sandbox) -> Everything {
    let sets_dir = policer_tests::daemon::sets_dir_of(&sb.config);
    let mut sets: Vec<(String, Vec<u8>)> = std::fs::read_dir(&sets_dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    sets.sort();
    let stats = json(&cli(sb, &["stats", "--json"]));
    Everything {
        kernel: kstate::read(prog_id(sb)),
        config: std::fs::read(&sb.config).unwrap(),
        sets,
        rules: succeeds(&cli(sb, &["rule", "ls", "--json"])),
        changes: stats["recent_changes"].to_string(),
    }
}

fn daemon(sb: &Sandbox) -> Daemon {
    Daemon::attach(sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0"])
}

#[test]
fn a_dry_run_of_each_verb_changes_nothing() {
    if !privileged("dryrun") {
        return;
    }
    let sb = Sandbox::new("dry0");
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "10.1.0.0/16", "--rate", "100pps", "--burst", "20"]));
    succeeds(&cli(&sb, &["rule", "set", "10.2.0.0/16", "--action", "deny"]));
    let list = format!("{}/dry-list.txt", std::env::temp_dir().display());
    std::fs::write(&list, "192.0.2.0/24\n198.51.100.7\n").unwrap();
    succeeds(&cli(&sb, &["rule", "import", &list, "--set", "blocked"]));
    succeeds(&cli(&sb, &["rule", "set", "10.1.0.0/16", "--rate", "80pps", "--runtime"]));
    let before = everything(&sb);

    // rule set: a changed rule, field by field.
    let v = json(&cli(&sb, &["rule", "set", "10.1.0.0/16", "--rate", "50pps", "--ttl", "1h", "--dry-run", "--json"]));
    assert_eq!(v["dry_run"], true);
    assert_eq!(v["verb"], "rule set");
    let ch = &v["rules_changed"][0];
    assert_eq!(ch["rule"], "10.1.0.0/16", "{v}");
    let fields: Vec<(String, String, String)> = ch["changes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["field"].as_str().unwrap().into(), c["old"].to_string(), c["new"].to_string()))
        .collect();
    assert!(fields.contains(&("rate".into(), "\"80pps\"".into(), "\"50pps\"".into())), "{fields:?}");
    assert!(fields.iter().any(|f| f.0 == "expires" && f.1 == "null"), "{fields:?}");
    // rule set of a new rule, as text.
    let t = succeeds(&cli(&sb, &["rule", "set", "10.3.0.0/16", "--rate", "1kpps", "--dry-run"]));
    assert!(t.starts_with("dry run: nothing changed"), "{t}");
    assert!(t.contains("+ 10.3.0.0/16"), "{t}");
    // rule rm.
    let v = json(&cli(&sb, &["rule", "rm", "10.2.0.0/16", "--dry-run", "--json"]));
    assert_eq!(v["rules_removed"][0]["rule"], "10.2.0.0/16", "{v}");
    assert_eq!(v["rules_removed"][0]["fields"]["action"], "deny", "{v}");
    // ban.
    let v = json(&cli(&sb, &["ban", "203.0.113.0/24", "--for", "1h", "--reason", "test", "--dry-run", "--json"]));
    assert_eq!(v["rules_added"][0]["rule"], "ban 203.0.113.0/24", "{v}");
    // rule import: entries in and out.
    std::fs::write(&list, "192.0.2.0/24\n203.0.113.9\n203.0.113.10\n").unwrap();
    let v = json(&cli(&sb, &["rule", "import", &list, "--set", "blocked", "--dry-run", "--json"]));
    let s = &v["sets"][0];
    assert_eq!(
        (s["set"].as_str(), s["entries_in"].as_u64(), s["entries_out"].as_u64()),
        (Some("blocked"), Some(2), Some(1)),
        "{v}"
    );
    assert_eq!(s["sample_out"][0], "198.51.100.7/32", "{v}");
    // reload: the daemon follows the file, so a reload's preview is of
    // what it would do now: with --discard-runtime, the runtime change
    // (made before the first reading) goes back to the file's.
    let v = json(&cli(&sb, &["reload", "--dry-run", "--json"]));
    assert!(v["rules_changed"].as_array().unwrap().is_empty(), "a plain reload keeps the runtime change: {v}");
    let v = json(&cli(&sb, &["reload", "--discard-runtime", "--dry-run", "--json"]));
    let ch = &v["rules_changed"][0];
    assert_eq!((ch["rule"].as_str(), ch["changes"][0]["field"].as_str()), (Some("10.1.0.0/16"), Some("rate")), "{v}");
    assert_eq!(
        (ch["changes"][0]["old"].as_str(), ch["changes"][0]["new"].as_str()),
        (Some("80pps"), Some("100pps")),
        "{v}"
    );

    let after = everything(&sb);
    assert_eq!(before.kernel.diff(&after.kernel), None, "a dry run changed the kernel's maps");
    assert_eq!(before.config, after.config, "a dry run changed the config file");
    assert_eq!(before.sets, after.sets, "a dry run changed a set's state file");
    assert_eq!(before.rules, after.rules, "a dry run changed the rules in force");
    let _ = std::fs::remove_file(&list);
}

/// The sources a dry run names in one direction.
fn named(v: &serde_json::Value, dir: &str) -> Vec<String> {
    let mut s: Vec<String> =
        v["live"][dir].as_array().unwrap().iter().map(|s| s["source"].as_str().unwrap().to_string()).collect();
    s.sort();
    s
}

/// Per flow, (sent, arrived) of the frames sent in `[from, to)` (ns since
/// `traffic::epoch_ns`).
fn window(sent: &traffic::SendReport, got: &traffic::Received, from: u64, to: u64) -> Vec<(u64, u64)> {
    let (s1, a1) = traffic::since(sent, got, from);
    let (s2, a2) = traffic::since(sent, got, to);
    (0..s1.len()).map(|i| (s1[i] - s2[i], a1[i] - a2[i])).collect()
}

#[test]
fn a_dry_run_predicts_which_live_sources_change_verdict_and_the_change_does_it() {
    if !privileged("dryrun") {
        return;
    }
    let sb = Sandbox::new("dry1");
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "10.77.0.0/16", "--rate", "100pps", "--burst", "20"]));
    // One heavy source, three in profile of the 100 pps rule; two of them
    // are over 40 pps, one is not.
    let srcs = ["10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.4"];
    let rates = [400.0, 70.0, 15.0, 70.0];
    let flows: Vec<Flow> = srcs.iter().zip(rates).map(|(s, pps)| Flow { src: ip(s), pps, len: 64 }).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let opts = RunOptions { keep_marks: true, stop: Some(stop.clone()), ..Default::default() };
    traffic::epoch_ns();
    let (sent, got, [t0, t1, t2, t3, t4]) = std::thread::scope(|scope| {
        let run = scope.spawn(|| traffic::run_with(&sb, &flows, Duration::from_secs(30), &opts));
        let marks = act(&sb);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (sent, got) = run.join().unwrap();
        (sent, got, marks)
    });

    // Before the change (dry runs included): the in-profile sources lost
    // nothing an exact 100 pps burst 20 policer would have admitted over
    // their real send times (all, when the sender kept its pace; a loaded
    // host's stalled sender catches up in bursts the rule may cut).
    let before = window(&sent, &got, 1_000_000_000, t0);
    let rule = Rate::Pps(100).rule(20).unwrap();
    for i in 1..4 {
        let exact = traffic::exact_admitted_in(&sent, &rule, i, 1_000_000_000, t0);
        let (s, a) = before[i];
        let ok = if exact == s { a == s } else { (a as f64 - exact as f64).abs() <= exact as f64 * 0.005 + 2.0 };
        assert!(
            ok,
            "{} lost frames before the change: arrived {a} of {s}, an exact policer admits {exact} ({before:?})",
            srcs[i]
        );
    }
    assert!(before[0].1 < before[0].0 / 2, "the heavy source is policed: {before:?}");
    // From a second after the lower rate (the bursts spent): exactly the
    // predicted sources lose frames.
    let lowered = window(&sent, &got, t1 + 1_500_000_000, t2);
    for (i, (s, a)) in lowered.iter().enumerate() {
        let predicted = i == 1 || i == 3 || i == 0;
        assert_eq!(a < s, predicted, "{}: sent {s}, arrived {a} under 40 pps ({lowered:?})", srcs[i]);
    }
    // After the raise: nobody loses a frame.
    let raised = window(&sent, &got, t3 + 500_000_000, t4);
    for (i, (s, a)) in raised.iter().enumerate() {
        assert_eq!(a, s, "{} lost frames after the raise ({raised:?})", srcs[i]);
    }
}

/// What the live test does while traffic flows: the dry runs and the real
/// changes; when each change was made (ns since `traffic::epoch_ns`).
fn act(sb: &Sandbox) -> [u64; 5] {
    std::thread::sleep(Duration::from_secs(3));

    // Lower the rate to 40 pps: the two 70 pps sources go pass → drop; the
    // heavy one drops either way, the 15 pps one passes either way.
    let v = json(&cli(sb, &["rule", "set", "10.77.0.0/16", "--rate", "40pps", "--dry-run", "--json"]));
    assert_eq!(named(&v, "pass_to_drop_top"), ["10.77.0.2", "10.77.0.4"], "{v:#}");
    assert_eq!(v["live"]["pass_to_drop"], 2, "{v:#}");
    assert!(named(&v, "drop_to_pass_top").is_empty(), "{v:#}");
    let text = succeeds(&cli(sb, &["rule", "set", "10.77.0.0/16", "--rate", "40pps", "--dry-run"]));
    assert!(text.starts_with("dry run: nothing changed") && text.contains("pass → drop"), "{text}");
    // Nothing was enforced: the 70 pps sources still lose nothing.
    let t0 = traffic::epoch_ns();
    succeeds(&cli(sb, &["rule", "set", "10.77.0.0/16", "--rate", "40pps"]));
    let t1 = traffic::epoch_ns();
    std::thread::sleep(Duration::from_secs(5));
    let t2 = traffic::epoch_ns();

    // Raise it far above: the heavy source (and the two) go drop → pass.
    let v = json(&cli(sb, &["rule", "set", "10.77.0.0/16", "--rate", "1kpps", "--dry-run", "--json"]));
    assert_eq!(named(&v, "drop_to_pass_top"), ["10.77.0.1", "10.77.0.2", "10.77.0.4"], "{v:#}");
    assert!(named(&v, "pass_to_drop_top").is_empty(), "{v:#}");
    let t3 = traffic::epoch_ns();
    succeeds(&cli(sb, &["rule", "set", "10.77.0.0/16", "--rate", "1kpps"]));
    std::thread::sleep(Duration::from_secs(4));
    let t4 = traffic::epoch_ns();
    [t0, t1, t2, t3, t4]
}

#[test]
fn a_dry_run_is_refused_as_the_change_would_be() {
    if !privileged("dryrun") {
        return;
    }
    let sb = Sandbox::new("dry2");
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "10.1.0.0/16", "--rate", "100pps"]));
    let before = everything(&sb);
    let cases: &[&[&str]] = &[
        &["rule", "set", "0.0.0.0/0", "--action", "deny"],
        &["rule", "set", "10.9.0.0/16", "--rate", "lots"],
        &["rule", "set", "10.1.0.0/16", "--burst", "0"],
        &["rule", "rm", "10.200.0.0/16"],
        &["ban", "0.0.0.0/0", "--for", "1h"],
        &["ban", "192.0.2.1", "--for", "soon"],
        &["rule", "import", "/nonexistent/list.txt", "--set", "x"],
    ];
    for c in cases {
        let real = cli(&sb, c);
        let mut dry = c.to_vec();
        dry.push("--dry-run");
        let preview = cli(&sb, &dry);
        assert!(!real.status.success(), "{c:?} was accepted");
        assert_eq!(real.status.code(), preview.status.code(), "{c:?}: the dry run's exit status");
        assert_eq!(
            String::from_utf8_lossy(&real.stderr),
            String::from_utf8_lossy(&preview.stderr),
            "{c:?}: the dry run's refusal"
        );
    }
    let after = everything(&sb);
    assert_eq!(before.kernel.diff(&after.kernel), None);
    assert_eq!(before.config, after.config);
    assert_eq!(before.rules, after.rules);
    assert_eq!(before.changes, after.changes, "a refused dry run is in the audit trail");
}

/// Review of the resolver: a reload's dry run judges the sources against
/// the file's `protect`, not the one in force. A dropping source the file
/// newly protects goes drop → pass in the preview. The file is written
/// without its final newline so the daemon does not follow it (a followed
/// file must end with one); `policer reload` would take it.
#[test]
fn a_reload_dry_run_judges_sources_against_the_files_protect() {
    if !privileged("dryrun") {
        return;
    }
    let sb = Sandbox::new("dry-prot");
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "10.78.0.0/16", "--rate", "40pps", "--burst", "20"]));
    let flows =
        [Flow { src: ip("10.78.0.1"), pps: 400.0, len: 64 }, Flow { src: ip("10.78.0.2"), pps: 400.0, len: 64 }];
    let stop = Arc::new(AtomicBool::new(false));
    let opts = RunOptions { stop: Some(stop.clone()), ..Default::default() };
    let v = std::thread::scope(|scope| {
        let run = scope.spawn(|| traffic::run_with(&sb, &flows, Duration::from_secs(30), &opts));
        std::thread::sleep(Duration::from_secs(2));
        let text = std::fs::read_to_string(&sb.config).unwrap();
        let with = if text.contains("[daemon]\n") {
            text.replacen("[daemon]\n", "[daemon]\nprotect = [\"10.78.0.1/32\"]\n", 1)
        } else {
            format!("[daemon]\nprotect = [\"10.78.0.1/32\"]\n\n{text}")
        };
        std::fs::write(&sb.config, with.trim_end()).unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let v = json(&cli(&sb, &["reload", "--dry-run", "--json"]));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        run.join().unwrap();
        v
    });
    assert_eq!(named(&v, "drop_to_pass_top"), ["10.78.0.1"], "{v:#}");
    assert!(named(&v, "pass_to_drop_top").is_empty(), "{v:#}");
}

/// Issue 43 point 10: `reload --dry-run FILE` previews a candidate file
/// against the live sources before it is moved into place: a rate the
/// candidate lowers shows the source that would go pass → drop, nothing
/// changes (kernel, config file, rules, audit), a broken candidate is
/// refused naming itself, and FILE without --dry-run is refused by the
/// command line.
#[test]
fn a_candidate_file_is_previewed_before_it_is_moved_into_place() {
    if !privileged("dryrun") {
        return;
    }
    let sb = Sandbox::new("dry-cand");
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "10.79.0.0/16", "--rate", "1000pps", "--burst", "50"]));
    let dir = std::env::temp_dir().join(format!("plc-cand-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let candidate = dir.join("policer.toml.new");
    // The file in force with that rule's rate lowered to 40 pps.
    let text = std::fs::read_to_string(&sb.config).unwrap();
    let mut ours = false;
    let lowered: Vec<String> = text
        .lines()
        .map(|l| {
            ours |= l == "prefix = \"10.79.0.0/16\"";
            if ours && l.starts_with("rate = ") {
                ours = false;
                "rate = \"40pps\"".to_string()
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(lowered.iter().any(|l| l == "rate = \"40pps\""), "{text}");
    std::fs::write(&candidate, lowered.join("\n") + "\n").unwrap();
    let flows = [Flow { src: ip("10.79.0.1"), pps: 300.0, len: 64 }];
    let stop = Arc::new(AtomicBool::new(false));
    let opts = RunOptions { stop: Some(stop.clone()), ..Default::default() };
    let (before, v, after, sent, asked) = std::thread::scope(|scope| {
        let run = scope.spawn(|| traffic::run_with(&sb, &flows, Duration::from_secs(30), &opts));
        std::thread::sleep(Duration::from_secs(2));
        let before = everything(&sb);
        let t0 = traffic::epoch_ns();
        let v = json(&cli(&sb, &["reload", "--dry-run", "--json", candidate.to_str().unwrap()]));
        let t1 = traffic::epoch_ns();
        let after = everything(&sb);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (sent, _) = run.join().unwrap();
        (before, v, after, sent, (t0, t1))
    });
    assert_eq!(v["rules_changed"].as_array().map(|a| a.len()), Some(1), "{v:#}");
    assert_eq!(named(&v, "pass_to_drop_top"), ["10.79.0.1"], "{v:#}");
    // Its rate within 5 % of what the sender really sent while the dry
    // run watched (its window lies inside the call; the sender is paced at
    // 300 pps, a loaded host may slow it).
    let (from, to) = (asked.0.saturating_sub(sent.start_epoch_ns), asked.1.saturating_sub(sent.start_epoch_ns));
    let n = sent.frames.iter().filter(|(t, _)| (from..to).contains(t)).count() as f64;
    let real = n / ((to - from) as f64 / 1e9);
    let rate = v["live"]["pass_to_drop_top"][0]["rate_pps"].as_f64().unwrap();
    assert!((rate - real).abs() <= real * 0.05, "a source sending {real:.1} pps measured at {rate} pps");
    // Traffic ran meanwhile: the counters moved, the rules and limiters not.
    assert_eq!((&before.kernel.rules, &before.kernel.new_sources), (&after.kernel.rules, &after.kernel.new_sources));
    assert_eq!((&before.config, &before.rules, &before.changes), (&after.config, &after.rules, &after.changes));
    // Broken: refused, naming the candidate; nothing changed.
    std::fs::write(&candidate, "[[rule]]\nprefix = \"10.79.0.0/16\"\nrate = \"fast\"\n").unwrap();
    let out = cli(&sb, &["reload", "--dry-run", candidate.to_str().unwrap()]);
    assert!(!out.status.success(), "a broken candidate was taken");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(candidate.to_str().unwrap()) && err.contains("rate"), "{err}");
    // A FIFO in its place is refused at once, never opened (it would hold
    // the daemon's owner until a writer came).
    let fifo = dir.join("fifo.toml");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    let out = cli(&sb, &["reload", "--dry-run", fifo.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is a FIFO, not a regular file"), "{err}");
    // Not a dry run: the command line refuses FILE alone.
    let out = cli(&sb, &["reload", candidate.to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--dry-run"));
    assert_eq!(everything(&sb).config, after.config);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--dry-run` of `rule set` while `flows` send for 30 s (asked after 2
/// s): the JSON, and the frames per second the flows really sent together
/// while it was asked (the dry run's window lies inside the call).
fn preview_under(sb: &Sandbox, flows: &[Flow], args: &[&str]) -> (serde_json::Value, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let opts = RunOptions { stop: Some(stop.clone()), ..Default::default() };
    std::thread::scope(|scope| {
        let run = scope.spawn(|| traffic::run_with(sb, flows, Duration::from_secs(30), &opts));
        std::thread::sleep(Duration::from_secs(2));
        let mut a = vec!["rule", "set"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--dry-run", "--json"]);
        let t0 = traffic::epoch_ns();
        let v = json(&cli(sb, &a));
        let t1 = traffic::epoch_ns();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let (sent, _) = run.join().unwrap();
        let (from, to) = (t0.saturating_sub(sent.start_epoch_ns), t1.saturating_sub(sent.start_epoch_ns));
        let n = sent.frames.iter().filter(|(t, _)| (from..to).contains(t)).count() as f64;
        (v, n / ((to - from) as f64 / 1e9))
    })
}

/// Issue 43 point 10: a dry run judges aggregates. Five sources at 100
/// pps under a per-source rule: adding `--total-rate 200pps` is judged
/// from the rule's counters (about 500 pps together, about 300 pps to be
/// dropped), no source listed as going to drop on its own, and the change
/// made drops what was predicted. A total-only rule over sources the
/// default rule judges now is judged from their buckets, with no invented
/// per-source rate. A source that sent nothing while watched is counted
/// idle, not listed.
#[test]
fn a_dry_run_judges_a_total_for_all_its_sources_together() {
    if !privileged("dryrun") {
        return;
    }
    let sb = Sandbox::new("dry-tot");
    let _d = daemon(&sb);
    succeeds(&cli(&sb, &["rule", "set", "10.80.0.0/16", "--rate", "1000pps", "--burst", "50"]));
    let five: Vec<Flow> = (1..=5).map(|i| Flow { src: ip(&format!("10.80.0.{i}")), pps: 100.0, len: 64 }).collect();
    let args = ["10.80.0.0/16", "--rate", "1000pps", "--burst", "50", "--total-rate", "200pps", "--total-burst", "20"];
    let (v, real) = preview_under(&sb, &five, &args);
    let a = &v["live"]["aggregates"];
    assert_eq!(a.as_array().map(|a| a.len()), Some(1), "{v:#}");
    let a = &a[0];
    assert_eq!((a["rule"].as_str(), a["measured_by"].as_str()), (Some("10.80.0.0/16"), Some("the rule's counters")));
    // What they really sent together while watched (paced at 500 pps),
    // within 5 %; the total's drop is what exceeds 200 pps of it.
    let rate = a["rate_pps"].as_f64().unwrap();
    assert!((rate - real).abs() <= real * 0.05, "five sources sending {real:.1} pps measured at {rate} pps: {a:#}");
    let drop = a["drop_after_pps"].as_f64().unwrap();
    assert!((drop - (real - 200.0)).abs() <= real * 0.05, "{a:#}");
    assert_eq!((a["total_now_pps"].clone(), a["total_after_pps"].as_f64()), (serde_json::Value::Null, Some(200.0)));
    assert!(named(&v, "pass_to_drop_top").is_empty(), "no source goes over on its own: {v:#}");
    // Made: what the total lets through over 3 s is what the preview said.
    succeeds(&cli(&sb, &["rule", "set"].iter().copied().chain(args).collect::<Vec<_>>()));
    // Over the run's own sending rate (the sender may be slower than
    // during the preview on a loaded host): the preview's measure of the
    // drop, sent rate less the total, within 10 %.
    let (sent, got) = traffic::run_with(&sb, &five, Duration::from_secs(3), &RunOptions::default());
    let (s, g) = (sent.sent.iter().sum::<u64>() as f64, got.per_flow.iter().sum::<u64>() as f64);
    let secs = (0..5).map(|i| sent.span_secs(i)).fold(0.0, f64::max);
    let want = s / secs - 200.0 - 20.0 / secs;
    assert!(
        ((s - g) / secs - want).abs() <= want * 0.1,
        "dropped {:.0} pps, the preview's measure says {want:.0}",
        (s - g) / secs
    );

    // A total only, over sources the default rule judges now (each has
    // a bucket): measured from their buckets; none given a rate of its
    // own. The fourth source sent before and stopped: idle.
    let stopped = [Flow { src: ip("10.81.0.4"), pps: 100.0, len: 64 }];
    traffic::run_with(&sb, &stopped, Duration::from_secs(1), &RunOptions::default());
    let three: Vec<Flow> = (1..=3).map(|i| Flow { src: ip(&format!("10.81.0.{i}")), pps: 100.0, len: 64 }).collect();
    let (v, real) = preview_under(&sb, &three, &["10.81.0.0/16", "--total-rate", "100pps", "--total-burst", "10"]);
    let a = &v["live"]["aggregates"][0];
    assert_eq!(a["measured_by"], "the buckets of 4 sources under it", "{v:#}");
    let rate = a["rate_pps"].as_f64().unwrap();
    assert!((rate - real).abs() <= real * 0.05, "three sources sending {real:.1} pps measured at {rate}: {a:#}");
    assert!((a["drop_after_pps"].as_f64().unwrap() - (real - 100.0)).abs() <= real * 0.05, "{a:#}");
    assert_eq!(v["live"]["pass_to_drop"], 0, "a total-only rule gives no source a rate of its own: {v:#}");
    assert_eq!(v["live"]["idle"], 1, "{v:#}");
}
