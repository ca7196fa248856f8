//! Tier 3: the real `policer` binary, started as a separate process in one
//! namespace, policing real frames sent over a veth pair from another;
//! what arrives is counted on the receiving side, independently of
//! policer's own counters.

use std::{net::IpAddr, time::Duration};

use policer_tests::{
    daemon::{Daemon, policer_in},
    netns::Sandbox,
    privileged,
    traffic::{self, Flow},
};

fn v4(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// One source offered 10x its rate for 5 s is admitted rate*T + burst
/// within 1 %; sources under their rate lose nothing; IPv4 and IPv6.
#[test]
fn heavy_hitter_gets_rate_times_t_plus_burst() {
    if !privileged("veth tier") {
        return;
    }
    let sb = Sandbox::new("acc");
    let mut d = Daemon::start(
        &sb.rx_ns,
        &[
            "attach",
            &sb.rx_if,
            "--rate",
            "1000pps",
            "--burst",
            "10",
            "--mode",
            "native",
            "--max-sources",
            "65536",
        ],
    );
    assert!(d.stdout().contains("(native mode)"), "{}", d.stdout());
    assert!(sb.rx_xdp().is_some(), "no XDP program on {}", sb.rx_if);

    let mut flows = vec![Flow {
        src: v4("198.18.0.1"),
        pps: 10_000.0,
        len: 64,
    }];
    for i in 0..40 {
        flows.push(Flow {
            src: v4(&format!("198.18.1.{}", i + 1)),
            pps: 50.0,
            len: 64,
        });
    }
    for i in 0..10 {
        // Distinct /64s: IPv6 buckets are per /64 by default.
        flows.push(Flow {
            src: v4(&format!("2001:db8:1:{i}::1")),
            pps: 50.0,
            len: 90,
        });
    }
    let (sent, got) = traffic::run(&sb, &flows, Duration::from_secs(5));
    assert_eq!(
        got.socket_drops, 0,
        "receive socket lost frames: counts not trustworthy"
    );

    let span = sent.span_secs(0);
    let expected = 1000.0 * span + 10.0;
    let admitted = got.per_flow[0] as f64;
    eprintln!(
        "heavy hitter: sent {}, admitted {admitted}, expected {expected:.1} (T = {span:.4} s)",
        sent.sent[0]
    );
    assert!(
        sent.sent[0] >= 49_000,
        "generator fell short: {}",
        sent.sent[0]
    );
    assert!(
        (admitted - expected).abs() <= expected * 0.01,
        "admitted {admitted}, expected {expected:.1} +-1 %"
    );
    for (i, f) in flows.iter().enumerate().skip(1) {
        assert_eq!(
            got.per_flow[i], sent.sent[i],
            "in-profile source {} lost frames",
            f.src
        );
    }
    assert!(
        d.stop_with(libc::SIGTERM),
        "policer did not exit cleanly:\n{}",
        d.stderr()
    );
    assert!(d.stdout().contains("detached"), "{}", d.stdout());
    assert!(sb.rx_xdp().is_none(), "XDP still attached after SIGTERM");
}

/// skb (generic) mode polices too, and SIGINT detaches.
#[test]
fn skb_mode_polices_and_sigint_detaches() {
    if !privileged("veth tier") {
        return;
    }
    let sb = Sandbox::new("skb");
    let mut d = Daemon::start(
        &sb.rx_ns,
        &[
            "attach", &sb.rx_if, "--rate", "200pps", "--burst", "5", "--mode", "skb",
        ],
    );
    assert!(d.stdout().contains("(skb mode)"), "{}", d.stdout());
    let flows = [Flow {
        src: v4("198.18.7.7"),
        pps: 2_000.0,
        len: 64,
    }];
    let (sent, got) = traffic::run(&sb, &flows, Duration::from_secs(2));
    let expected = 200.0 * sent.span_secs(0) + 5.0;
    let admitted = got.per_flow[0] as f64;
    assert!(
        (admitted - expected).abs() <= expected * 0.02 + 1.0,
        "admitted {admitted}, expected {expected:.1}"
    );
    assert!(d.stop_with(libc::SIGINT), "{}", d.stderr());
    assert!(sb.rx_xdp().is_none());
}

fn fails_with(out: &std::process::Output, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success: {err}"
    );
    assert!(err.contains(needle), "stderr lacks '{needle}': {err}");
    assert!(!err.contains("panicked"), "panic: {err}");
}

/// Bad input gets a clear error, a non-zero exit, and nothing attached.
#[test]
fn bad_input_changes_nothing() {
    if !privileged("veth tier") {
        return;
    }
    let sb = Sandbox::new("bad");
    let ns = sb.rx_ns.as_str();
    let ifc = sb.rx_if.as_str();
    let cases: &[(&[&str], &str)] = &[
        (
            &["attach", "nosuch0", "--rate", "1kpps"],
            "unknown interface 'nosuch0'",
        ),
        (
            &["attach", ifc, "nosuch0", "--rate", "1kpps"],
            "unknown interface 'nosuch0'",
        ),
        (&["attach", ifc, ifc, "--rate", "1kpps"], "given twice"),
        (&["attach", ifc, "--rate", "10kbps"], "unknown unit"),
        (&["attach", ifc, "--rate", "0pps"], "rate out of range"),
        (&["attach", ifc, "--rate", "-5pps"], "non-negative number"),
        (&["attach", ifc, "--rate", "200Mpps"], "rate out of range"),
        (&["attach", ifc, "--rate", "1.5pps"], "whole number"),
        (
            &["attach", ifc, "--rate", "99999999999999999999999pps"],
            "too large",
        ),
        (
            &["attach", ifc, "--rate", "1kpps", "--burst", "0"],
            "burst out of range",
        ),
        (
            &["attach", ifc, "--rate", "1kpps", "--burst", "2000000000"],
            "burst out of range",
        ),
        (
            &["attach", ifc, "--rate", "1kpps", "--burst", "ten"],
            "non-negative number",
        ),
        (
            &["attach", ifc, "--rate", "1kpps", "--mode", "turbo"],
            "invalid value 'turbo'",
        ),
        (
            &["attach", ifc, "--rate", "1kpps", "--max-sources", "0"],
            "--max-sources",
        ),
        (&["attach", ifc], "--rate"),
    ];
    for (args, needle) in cases {
        let out = policer_in(ns, args);
        fails_with(&out, needle);
        assert!(sb.rx_xdp().is_none(), "{args:?} left XDP attached");
    }

    // Not root: refused before touching anything.
    let out = std::process::Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
        ])
        .arg(policer_tests::daemon::policer_bin())
        .args(["attach", ifc, "--rate", "1kpps"])
        .output()
        .expect("setpriv");
    fails_with(&out, "needs root");
    assert!(sb.rx_xdp().is_none());

    // XDP already attached by another program: refused, the other stays.
    let mut first = Daemon::start(
        ns,
        &["attach", ifc, "--rate", "1kpps", "--max-sources", "1024"],
    );
    let id = sb.rx_xdp().expect("first policer attached");
    for mode in ["auto", "native", "skb"] {
        let out = policer_in(
            ns,
            &[
                "attach",
                ifc,
                "--rate",
                "1kpps",
                "--mode",
                mode,
                "--max-sources",
                "1024",
            ],
        );
        fails_with(&out, "another XDP program is already attached");
        assert_eq!(
            sb.rx_xdp().as_deref(),
            Some(id.as_str()),
            "the first program was replaced"
        );
    }
    assert!(first.stop_with(libc::SIGTERM));
    assert!(sb.rx_xdp().is_none());
}
