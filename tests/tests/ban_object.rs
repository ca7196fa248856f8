//! Tier 2, automatic bans (issue 18): the real compiled XDP object under
//! BPF_PROG_TEST_RUN, rules written into its maps as the daemon writes
//! them, and a clock the test controls, so every verdict is exact.
//!
//! - `--ban-after 1`: the burst, then the first refused frame starts the
//!   ban; nothing passes until the ban's end, not one ns before; then the
//!   burst again; the bucket is untouched while banned;
//! - `--ban-after 3`: three refusals since the last admission, and an
//!   admission in between starts the count again; with `--ban-within 1s`,
//!   three refusals within a second, admissions between them or not;
//! - escalation: twice as long within twice the last length, up to
//!   `--ban-max`, back to `--ban-for` after a quiet spell;
//! - a banned source whose slot a crowd of sources in debt takes is still
//!   dropped (the store, on the table miss), and gets no slot;
//! - a full store makes no new ban and counts it;
//! - IPv6 sources and IPv4 class buckets are banned by their own keys.

use std::net::IpAddr;

use policer_common::{
    Rule,
    ban::{BanParams, RULE_BAN},
    rate::Rate,
};
use policer_tests::{
    classes::{install, kernel_rule},
    frame::FrameSpec,
    privileged,
};
use policer_user::{LoadOptions, Policer};

const PASS: u32 = 2;
const DROP: u32 = 1;
const SEC: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;
const T0: u64 = 50 * SEC;

fn load(max_sources: u32, max_bans: u32) -> Policer {
    let mut p = Policer::load(&LoadOptions {
        max_sources,
        max_bans,
        test_clock: true,
        drop_sample_shift: 0,
        ..Default::default()
    })
    .expect("load object");
    p.set_clock(T0).unwrap();
    p
}

fn run(p: &mut Policer, frame: &[u8]) -> u32 {
    policer_tests::test_run(p, frame)
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn udp(src: &str) -> Vec<u8> {
    let dst = if src.contains(':') { ip("2001:db8:ffff::1") } else { ip("198.19.255.1") };
    FrameSpec::udp(ip(src), dst, 64).build(None)
}

/// A police rule of 10 pps, burst 4, with bans (`RULE_BAN`).
fn banning(v6: bool) -> Rule {
    let mut r = Rate::Pps(10).rule(4).unwrap().with_key_len(if v6 { 64 } else { 32 }, v6).unwrap();
    r.flags |= RULE_BAN;
    r
}

fn params(ban_for_ms: u64, ban_after: u32, ban_max_ms: u64) -> BanParams {
    BanParams { ban_for_ns: ban_for_ms * MS, ban_max_ns: ban_max_ms * MS, ban_after, ban_within_ms: 0 }
}

/// Installs `rule` for `net` at counter slot 2 with ban `params`.
fn setup(p: &mut Policer, net: &str, words: &str, rule: Rule, params: &BanParams) {
    install(p, &[kernel_rule(net, words, rule, 2)], &[], T0);
    p.set_ban_params(2, Some(params)).unwrap();
}

/// Sends frames of `src` at `now`; the verdicts.
fn frames(p: &mut Policer, frame: &[u8], now: u64, n: usize) -> Vec<u32> {
    p.set_clock(now).unwrap();
    (0..n).map(|_| run(p, frame)).collect()
}

fn passed(v: &[u32]) -> usize {
    v.iter().filter(|&&x| x == PASS).count()
}

fn counters(p: &Policer) -> policer_common::Counters {
    p.reader().counters().unwrap()
}

#[test]
fn the_first_refusal_bans_until_the_end_and_then_the_burst_is_back() {
    if !privileged("ban object tier") {
        return;
    }
    for (src, net, v6) in [("10.1.0.7", "10.0.0.0/8", false), ("2001:db8:1::7", "2001:db8::/32", true)] {
        let mut p = load(4096, 1024);
        setup(&mut p, net, "", banning(v6), &params(3000, 1, 0));
        let f = udp(src);
        // The burst, then the first refusal starts a 3 s ban.
        let v = frames(&mut p, &f, T0, 10);
        assert_eq!(v, [PASS, PASS, PASS, PASS, DROP, DROP, DROP, DROP, DROP, DROP], "{src}");
        let c = counters(&p);
        assert_eq!((c.bans_started, c.ban_drops), (1, 5), "{src}: the first refusal bans, the rest are ban drops");
        // Banned: nothing at any time before the end, not 1 ns before.
        for at in [T0 + SEC, T0 + 2 * SEC, T0 + 3 * SEC - 1] {
            assert_eq!(passed(&frames(&mut p, &f, at, 3)), 0, "{src} at +{} ns", at - T0);
        }
        let bans = p.reader().bans().unwrap();
        assert_eq!(bans.len(), 1, "{src}");
        assert_eq!((bans[0].1.end_ns, bans[0].1.len_ns, bans[0].1.count), (T0 + 3 * SEC, 3 * SEC, 1), "{src}");
        assert!(bans[0].1.drops >= 14, "{src}: the ban's drops ({}) are counted", bans[0].1.drops);
        // At the end: the whole burst again (its bucket full, not what it
        // was when the ban started), then a new ban.
        let v = frames(&mut p, &f, T0 + 3 * SEC, 6);
        assert_eq!(passed(&v), 4, "{src}: {v:?}");
        assert_eq!(counters(&p).bans_started, 2, "{src}");
        // Lifted by hand: the next frame is a new source's.
        let key = bans[0].0;
        assert!(p.lift_ban(&key).unwrap(), "{src}");
        assert_eq!(frames(&mut p, &f, T0 + 3 * SEC + MS, 1), [PASS], "{src}: lifted");
        assert!(!p.lift_ban(&key).unwrap(), "{src}: nothing left to lift");
    }
}

#[test]
fn ban_after_counts_refusals_since_the_last_admission() {
    if !privileged("ban object tier") {
        return;
    }
    let mut p = load(4096, 1024);
    setup(&mut p, "10.0.0.0/8", "", banning(false), &params(1000, 3, 0));
    let f = udp("10.2.0.1");
    assert_eq!(passed(&frames(&mut p, &f, T0, 4)), 4);
    // Two refusals, then 100 ms (one frame's worth at 10 pps) admits one:
    // the count starts again.
    assert_eq!(frames(&mut p, &f, T0, 2), [DROP, DROP]);
    assert_eq!(frames(&mut p, &f, T0 + 100 * MS, 1), [PASS]);
    assert_eq!(counters(&p).bans_started, 0, "two refusals, then an admission: no ban");
    // Three in a row: banned at the third.
    assert_eq!(frames(&mut p, &f, T0 + 100 * MS, 3), [DROP, DROP, DROP]);
    assert_eq!(counters(&p).bans_started, 1);
    // Even when the bucket would admit again, the ban holds.
    assert_eq!(passed(&frames(&mut p, &f, T0 + 900 * MS, 5)), 0);
    assert_eq!(passed(&frames(&mut p, &f, T0 + 1100 * MS, 1)), 1, "the ban (1 s from +100 ms) is over");
}

/// `--ban-after 3 --ban-within 1s` (issue 43 point 8): refusals counted
/// in their window, admissions between them or not; a window that is over
/// starts again; the slot stays the rule's (no count in it).
#[test]
fn ban_within_counts_refusals_in_a_window_admissions_or_not() {
    if !privileged("ban object tier") {
        return;
    }
    let mut p = load(4096, 1024);
    let windowed = BanParams { ban_within_ms: 1000, ..params(1000, 3, 0) };
    setup(&mut p, "10.0.0.0/8", "", banning(false), &windowed);
    let f = udp("10.2.0.1");
    assert_eq!(passed(&frames(&mut p, &f, T0, 4)), 4);
    // Two refusals, an admission, one more refusal: the third within 1 s.
    assert_eq!(frames(&mut p, &f, T0, 2), [DROP, DROP]);
    assert_eq!(frames(&mut p, &f, T0 + 100 * MS, 1), [PASS]);
    assert_eq!(counters(&p).bans_started, 0);
    assert_eq!(frames(&mut p, &f, T0 + 100 * MS, 1), [DROP]);
    assert_eq!(counters(&p).bans_started, 1, "the third refusal within the window bans, admissions or not");
    assert_eq!(passed(&frames(&mut p, &f, T0 + 900 * MS, 5)), 0, "banned");
    // After the ban (ends at +1.1 s): its burst, then two refusals, and the
    // third only after the window (1 s from the first) is over: no ban.
    assert_eq!(passed(&frames(&mut p, &f, T0 + 1100 * MS, 4)), 4);
    assert_eq!(frames(&mut p, &f, T0 + 1100 * MS, 2), [DROP, DROP]);
    // +2.2 s: the window of +1.1 s is over. The burst, then a refusal
    // starts a new window; its third refusal bans.
    assert_eq!(passed(&frames(&mut p, &f, T0 + 2200 * MS, 4)), 4);
    assert_eq!(frames(&mut p, &f, T0 + 2200 * MS, 2), [DROP, DROP]);
    assert_eq!(counters(&p).bans_started, 1, "two refusals of a new window: no ban");
    assert_eq!(frames(&mut p, &f, T0 + 2200 * MS, 1), [DROP]);
    assert_eq!(counters(&p).bans_started, 2, "the third of the new window bans");
}

#[test]
fn bans_grow_within_twice_their_length_up_to_the_max() {
    if !privileged("ban object tier") {
        return;
    }
    let mut p = load(4096, 1024);
    setup(&mut p, "10.0.0.0/8", "", banning(false), &params(1000, 1, 3000));
    let f = udp("10.3.0.1");
    let mut now = T0;
    let mut lens = Vec::new();
    for _ in 0..4 {
        // Burst, then the ban; the length is read from the store.
        let v = frames(&mut p, &f, now, 6);
        assert_eq!(passed(&v), 4, "{v:?}");
        let b = p.reader().bans().unwrap()[0].1;
        lens.push(b.len_ns / MS);
        now = b.end_ns;
    }
    assert_eq!(lens, [1000, 2000, 3000, 3000], "doubling, capped at --ban-max");
    // Quiet for twice the last length: back to --ban-for.
    now += 6 * SEC;
    frames(&mut p, &f, now, 6);
    let b = p.reader().bans().unwrap()[0].1;
    assert_eq!((b.len_ns / MS, b.count), (1000, 1));
    // The daemon forgets entries whose window is over.
    assert!(p.expire_bans(b.end_ns + 2 * SEC - 1).unwrap().is_empty());
    assert_eq!(p.expire_bans(b.end_ns + 2 * SEC).unwrap().len(), 1);
    assert!(p.reader().bans().unwrap().is_empty());
}

#[test]
fn a_banned_source_without_a_slot_is_still_banned_and_gets_none() {
    if !privileged("ban object tier") {
        return;
    }
    // A tiny table (64 sources): a crowd of sources in debt (each sent 5
    // frames against a burst of 4, under a rule without bans) takes every
    // slot, the banned one's too.
    let mut p = load(64, 1024);
    let mut crowd = Rate::Pps(10).rule(4).unwrap();
    crowd.counter_slot = 3;
    install(
        &mut p,
        &[kernel_rule("10.0.0.0/8", "", banning(false), 2), kernel_rule("172.16.0.0/12", "", crowd, 3)],
        &[],
        T0,
    );
    p.set_ban_params(2, Some(&params(10_000, 1, 0))).unwrap();
    let f = udp("10.4.0.1");
    assert_eq!(passed(&frames(&mut p, &f, T0, 6)), 4);
    let mut evicted = false;
    for round in 0..8u32 {
        for i in 0..256u32 {
            let src = format!("172.16.{}.{}", round, i);
            frames(&mut p, &udp(&src), T0 + SEC, 5);
        }
        let mut live = false;
        p.reader()
            .for_each_bucket(|k, _| live |= k.family == policer_common::FAMILY_V4 && k.addr[..4] == [10, 4, 0, 1])
            .unwrap();
        if !live {
            evicted = true;
            break;
        }
    }
    assert!(evicted, "the crowd never took the banned source's slot");
    let before = counters(&p);
    assert_eq!(passed(&frames(&mut p, &f, T0 + 2 * SEC, 20)), 0, "evicted, and still banned");
    let after = counters(&p);
    assert_eq!(after.ban_drops - before.ban_drops, 20);
    assert_eq!(after.buckets_created, before.buckets_created, "a banned source takes no slot");
    // After the ban: admitted again (a new source).
    assert_eq!(frames(&mut p, &f, T0 + 11 * SEC, 1), [PASS]);
}

#[test]
fn a_full_store_makes_no_new_ban_and_counts_it() {
    if !privileged("ban object tier") {
        return;
    }
    let mut p = load(4096, 2);
    setup(&mut p, "10.0.0.0/8", "", banning(false), &params(60_000, 1, 0));
    for (i, src) in ["10.5.0.1", "10.5.0.2", "10.5.0.3"].iter().enumerate() {
        let v = frames(&mut p, &udp(src), T0, 8);
        assert_eq!(passed(&v), 4, "{src}: {v:?}");
        let c = counters(&p);
        assert_eq!(c.bans_started, (i as u64 + 1).min(2), "{src}");
        assert_eq!(c.bans_refused_full, (i as u64).saturating_sub(1) * 4, "{src}");
    }
    // The third source is policed by its bucket: it drains and is admitted.
    assert_eq!(frames(&mut p, &udp("10.5.0.3"), T0 + SEC, 1), [PASS]);
    // The two bans hold.
    assert_eq!(passed(&frames(&mut p, &udp("10.5.0.1"), T0 + SEC, 3)), 0);
}

#[test]
fn class_buckets_are_banned_by_their_own_key() {
    if !privileged("ban object tier") {
        return;
    }
    let mut p = load(4096, 1024);
    // UDP to port 53 from 10/8 bans; the prefix's other traffic has a
    // generous class-less rule.
    let mut dns = banning(false);
    dns.counter_slot = 2;
    let other = Rate::Pps(100_000).rule(1000).unwrap();
    install(
        &mut p,
        &[kernel_rule("10.0.0.0/8", "proto=udp dport=53", dns, 2), kernel_rule("10.0.0.0/8", "", other, 3)],
        &[],
        T0,
    );
    p.set_ban_params(2, Some(&params(5000, 1, 0))).unwrap();
    let query = FrameSpec::udp_to(ip("10.6.0.1"), ip("198.19.255.1"), 64, 53).build(None);
    let web = FrameSpec::udp_to(ip("10.6.0.1"), ip("198.19.255.1"), 64, 443).build(None);
    assert_eq!(passed(&frames(&mut p, &query, T0, 6)), 4);
    assert_eq!(counters(&p).bans_started, 1);
    assert_eq!(passed(&frames(&mut p, &query, T0 + SEC, 3)), 0, "the class bucket is banned");
    assert_eq!(passed(&frames(&mut p, &web, T0 + SEC, 3)), 3, "the source's other traffic is not");
    let bans = p.reader().bans().unwrap();
    assert_eq!(bans.len(), 1);
    assert_eq!(bans[0].0.class, 2, "the ban's key is the class bucket's");
}
