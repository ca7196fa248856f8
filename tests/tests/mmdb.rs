//! Tier 3, country and network sets from MaxMind DB files (issue 46,
//! points 2 and 3), on real traffic: the real daemon and CLI as separate
//! processes, databases the tests write themselves with PyPI's
//! `mmdb-writer` (`policer_tests::mmdb`), frames over a veth pair counted
//! on the receiving side.
//!
//! - `rule import --mmdb DB --country DE --set NAME` and `--asn` put
//!   exactly the writer's networks of that country or AS in the set, IPv4
//!   and IPv6, nested networks as the tree's leaves, IPv4 held at
//!   `::/96` and under `::ffff:0:0/96` once, as IPv4; sources inside are
//!   denied or policed, sources outside pass; `inspect` names the country
//!   or AS; a cut, an empty or a foreign file is refused and changes
//!   nothing;
//! - a `[[set]]` with `mmdb`, `country` and `asn` is in force from the
//!   start; a database swapped into place replaces the set by itself (the
//!   daemon follows it as it follows the config) and `policer reload` then
//!   changes nothing; a cut one is refused, followed or reloaded, and
//!   changes nothing;
//! - CrowdSec's `Country` and `AS` decisions (`cscli decisions add --scope
//!   Country --value DE`), through `country_mmdb` and `asn_mmdb`, are the
//!   networks of that country or AS in the feed's set, enforced on
//!   traffic, counted by scope, and lifted at their end.

use std::{
    net::IpAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use policer_tests::{
    daemon::{Daemon, cli, fails_with, samples, scrape, succeeds},
    lapi::{self, Lapi},
    mmdb,
    netns::Sandbox,
    traffic::{self, Flow},
};
use serde_json::{Value, json};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A file of the test's beside the sandbox's config, removed on drop.
struct Temp(PathBuf);

impl Temp {
    fn beside(sb: &Sandbox, name: &str) -> Temp {
        Temp(Path::new(&sb.config).parent().unwrap().join(format!("{}-{name}", sb.rx_ns)))
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The sets' state directory of a sandbox's config, removed on drop.
struct SetsDir(PathBuf);

impl SetsDir {
    fn of(sb: &Sandbox) -> SetsDir {
        let d = policer_tests::daemon::sets_dir_of(&sb.config);
        let _ = std::fs::remove_dir_all(&d);
        SetsDir(d)
    }
}

impl Drop for SetsDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const RULES: &str = "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"100kpps\"\nburst = 1000\n\n\
                     [[rule]]\nprefix = \"::/0\"\nrate = \"100kpps\"\nburst = 1000\n";

fn country(cc: &str) -> Value {
    json!({"country": {"iso_code": cc, "names": {"en": cc}}, "continent": {"code": "EU"}})
}

/// The Country database: nested networks (DE's /16 inside FR's /8, DE's
/// /48 inside FR's /32), IPv4 at `::/96` and under `::ffff:0:0/96` (FR's
/// 198.51.100.0/24 both, FR's 203.0.113.0/24 only there), both families.
fn countries(de_v4: &str) -> Value {
    json!([
        ["10.0.0.0/8", country("FR")],
        ["10.1.0.0/16", country("DE")],
        [de_v4, country("DE")],
        ["198.51.100.0/24", country("FR")],
        ["::ffff:198.51.100.0/120", country("FR")],
        ["::ffff:203.0.113.0/120", country("FR")],
        ["2001:db8::/32", country("FR")],
        ["2001:db8:1::/48", country("DE")],
    ])
}

/// The ASN database: AS64501's /16 inside AS64500's /8, its IPv6 /48,
/// and an IPv4 network only under `::ffff:0:0/96`.
fn ases() -> Value {
    let asn = |n: u32| json!({"autonomous_system_number": n, "autonomous_system_organization": format!("AS {n}")});
    json!([
        ["10.0.0.0/8", asn(64500)],
        ["10.1.0.0/16", asn(64501)],
        ["2001:db8:1::/48", asn(64501)],
        ["::ffff:203.0.113.0/120", asn(64501)],
        ["192.0.2.0/24", asn(64502)],
    ])
}

/// The writer's networks whose record `keep` takes, sorted as the set
/// lists them.
fn of(list: &[(String, Value)], keep: impl Fn(&Value) -> bool) -> Vec<String> {
    let mut v: Vec<ipnet::IpNet> = list.iter().filter(|(_, r)| keep(r)).map(|(n, _)| n.parse().unwrap()).collect();
    v.sort();
    v.iter().map(|n| n.to_string()).collect()
}

fn entries(sb: &Sandbox, set: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(&succeeds(&cli(sb, &["rule", "ls", "--set", set, "--json"]))).unwrap();
    v["entries"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().to_string()).collect()
}

/// Frames that arrived from each source, and were sent: 200 pps for 0.5 s.
fn arrived(sb: &Sandbox, srcs: &[&str]) -> Vec<(u64, u64)> {
    let flows: Vec<Flow> = srcs.iter().map(|s| Flow { src: ip(s), pps: 200.0, len: 64 }).collect();
    let (sent, got) = traffic::run(sb, &flows, Duration::from_millis(500));
    assert_eq!(got.socket_drops, 0);
    (0..srcs.len()).map(|i| (got.per_flow[i], sent.sent[i])).collect()
}

/// Asserts which of `srcs` are dropped (every frame) and which pass
/// (every frame).
fn expect(sb: &Sandbox, srcs: &[(&str, bool)], when: &str) {
    let names: Vec<&str> = srcs.iter().map(|(s, _)| *s).collect();
    for ((src, dropped), (got, sent)) in srcs.iter().zip(arrived(sb, &names)) {
        assert!(sent > 50, "{when}: {src} sent only {sent}");
        if *dropped {
            assert_eq!(got, 0, "{when}: {src} is in the set, yet {got} of {sent} frames arrived");
        } else {
            assert_eq!(got, sent, "{when}: {src} is not in the set, yet only {got} of {sent} frames arrived");
        }
    }
}

fn inspect_rule(sb: &Sandbox, addr: &str) -> String {
    let v: Value = serde_json::from_str(&succeeds(&cli(sb, &["inspect", addr, "--json"]))).unwrap();
    v["rule"].as_str().unwrap_or_default().to_string()
}

/// A database cut short, one with no network, and a list file given as a
/// database: each refused naming why, the set unchanged.
fn refused_files_change_nothing(sb: &Sandbox, db: &Temp, set: &str, before: &[String]) {
    let whole = std::fs::read(&db.0).unwrap();
    let cut = Temp::beside(sb, "cut.mmdb");
    std::fs::write(&cut.0, &whole[..whole.len() - 30]).unwrap();
    let empty = Temp::beside(sb, "empty.mmdb");
    mmdb::write(&empty.0, "GeoLite2-Country", &json!([]));
    let list = Temp::beside(sb, "list.mmdb");
    std::fs::write(&list.0, "10.1.0.0/16\n").unwrap();
    for (f, why) in [(&cut, "not a whole MaxMind DB file"), (&empty, "mmdb"), (&list, "not a whole MaxMind DB file")] {
        let out = cli(sb, &["rule", "import", "--mmdb", f.path(), "--country", "DE", "--set", set, "--action", "deny"]);
        fails_with(&out, why);
        fails_with(&out, "nothing imported");
        assert_eq!(entries(sb, set), before, "a refused database changed the set ({})", f.path());
    }
    // A Country database asked for an AS it does not name.
    let out = cli(sb, &["rule", "import", "--mmdb", db.path(), "--asn", "64500", "--set", set, "--action", "deny"]);
    fails_with(&out, "has no network of AS 64500");
    assert_eq!(entries(sb, set), before);
}

#[test]
fn an_import_by_country_and_by_as_is_exactly_their_networks_on_real_traffic() {
    if !mmdb::available("mmdb tier") {
        return;
    }
    let sb = Sandbox::new("mmdbimp");
    let _sets = SetsDir::of(&sb);
    std::fs::write(&sb.config, RULES).unwrap();
    let db = Temp::beside(&sb, "country.mmdb");
    let listed = mmdb::write(&db.0, "GeoLite2-Country", &countries("192.0.2.0/24"));
    let asdb = Temp::beside(&sb, "asn.mmdb");
    let as_listed = mmdb::write(&asdb.0, "GeoLite2-ASN", &ases());
    let _d = Daemon::attach(&sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0"]);

    // By country: DE, exactly the writer's networks of DE, both families.
    let out = cli(&sb, &["rule", "import", "--mmdb", db.path(), "--country", "de", "--set", "geo", "--json"]);
    let counts: Value = serde_json::from_str(&succeeds(&out)).unwrap();
    let want = of(&listed, |r| r["country"]["iso_code"] == "DE");
    assert_eq!(want, ["10.1.0.0/16", "192.0.2.0/24", "2001:db8:1::/48"]);
    assert_eq!(counts["entries"], want.len(), "{counts}");
    assert_eq!(entries(&sb, "geo"), want);
    // FR: the leaves of its /8 around DE's /16 and of its /32 around DE's
    // /48; 198.51.100.0/24 (at ::/96 and under ::ffff:0:0/96) once, and
    // 203.0.113.0/24 (only under ::ffff:0:0/96), both as IPv4.
    let fr = succeeds(&cli(
        &sb,
        &["rule", "import", "--mmdb", db.path(), "--country", "FR", "--set", "fr", "--action", "allow"],
    ));
    let want_fr = of(&listed, |r| r["country"]["iso_code"] == "FR");
    assert!(want_fr.contains(&"198.51.100.0/24".into()) && want_fr.contains(&"203.0.113.0/24".into()));
    assert!(want_fr.contains(&"10.0.0.0/16".into()) && want_fr.contains(&"2001:db8:8000::/33".into()));
    assert_eq!(entries(&sb, "fr"), want_fr, "{fr}");
    succeeds(&cli(&sb, &["rule", "rm", "--set", "fr"]));
    // On traffic: DE's sources dropped (an IPv6 one too), FR's pass.
    expect(
        &sb,
        &[
            ("10.1.0.5", true),
            ("192.0.2.7", true),
            ("2001:db8:1::5", true),
            ("10.2.0.1", false),
            ("198.51.100.7", false),
            ("2001:db8:2::1", false),
        ],
        "the DE set",
    );
    // inspect names the country that put the source there.
    let r = inspect_rule(&sb, "192.0.2.7");
    assert!(r.contains("set:geo") && r.contains("192.0.2.0/24") && r.contains("country DE"), "{r}");
    let r = inspect_rule(&sb, "2001:db8:1::5");
    assert!(r.contains("country DE"), "{r}");

    // By AS: police 50 pps per source over AS64501's networks.
    let out = cli(
        &sb,
        &[
            "rule",
            "import",
            "--mmdb",
            asdb.path(),
            "--asn",
            "AS64501",
            "--set",
            "as64501",
            "--action",
            "police",
            "--rate",
            "50pps",
            "--burst",
            "5",
        ],
    );
    succeeds(&out);
    let want_as = of(&as_listed, |r| r["autonomous_system_number"] == 64501);
    assert_eq!(want_as, ["10.1.0.0/16", "203.0.113.0/24", "2001:db8:1::/48"]);
    assert_eq!(entries(&sb, "as64501"), want_as);
    // 203.0.113.9 is in no country set: policed (~5 + 25 of 100), while
    // 10.0.0.9 (AS64500) passes whole.
    let got = arrived(&sb, &["203.0.113.9", "10.0.0.9"]);
    let (p, ps) = got[0];
    assert!((20..=40).contains(&p) && ps >= 90, "a source of AS64501 policed at 50 pps: {p} of {ps} arrived");
    assert_eq!(got[1].0, got[1].1, "a source of AS64500 lost frames: {:?}", got[1]);
    let r = inspect_rule(&sb, "203.0.113.9");
    assert!(r.contains("set:as64501") && r.contains("AS64501"), "{r}");

    // The sets survive a restart with what put each entry in.
    drop(_d);
    let _d = Daemon::attach(&sb, &["--rate", "100kpps", "--burst", "1000", "--interval", "0"]);
    assert_eq!(entries(&sb, "geo"), want);
    let r = inspect_rule(&sb, "10.1.0.5");
    assert!(r.contains("country DE"), "after a restart: {r}");

    // A database that does not open, is empty or cut short: nothing changes.
    refused_files_change_nothing(&sb, &db, "geo", &want);
    expect(&sb, &[("192.0.2.7", true), ("10.2.0.1", false)], "after the refused files");
}

#[test]
fn a_config_set_of_a_database_follows_a_swapped_database_at_reload() {
    if !mmdb::available("mmdb tier") {
        return;
    }
    let sb = Sandbox::new("mmdbcfg");
    let _sets = SetsDir::of(&sb);
    let db = Temp::beside(&sb, "geo.mmdb");
    let listed = mmdb::write(&db.0, "GeoLite2-Country", &countries("192.0.2.0/24"));
    let name = db.0.file_name().unwrap().to_str().unwrap().to_string();
    let with_set = format!(
        "{RULES}\n[[set]]\nname = \"geo\"\nmmdb = \"{name}\"\ncountry = [\"DE\"]\nasn = [64999]\naction = \"deny\"\n"
    );
    std::fs::write(&sb.config, &with_set).unwrap();
    succeeds(&cli(&sb, &["check", &sb.config]));
    let _d = Daemon::attach(&sb, &["--interval", "0"]);
    assert_eq!(entries(&sb, "geo"), of(&listed, |r| r["country"]["iso_code"] == "DE"));
    expect(&sb, &[("192.0.2.7", true), ("10.1.0.5", true), ("198.51.100.7", false)], "from the start");
    let r = inspect_rule(&sb, "192.0.2.7");
    assert!(r.contains("country DE"), "{r}");

    // The database swapped (a new file renamed into place): DE is now
    // 198.51.100.0/24 instead of 192.0.2.0/24; `policer reload` takes it.
    let next = Temp::beside(&sb, "geo.next.mmdb");
    let relisted = mmdb::write(
        &next.0,
        "GeoLite2-Country",
        &json!([
            ["10.0.0.0/8", country("FR")],
            ["10.1.0.0/16", country("DE")],
            ["198.51.100.0/24", country("DE")],
            ["2001:db8:1::/48", country("DE")],
        ]),
    );
    std::fs::rename(&next.0, &db.0).unwrap();
    // Followed: in force without a reload within a few seconds.
    let want = of(&relisted, |r| r["country"]["iso_code"] == "DE");
    let t0 = Instant::now();
    while entries(&sb, "geo") != want {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the swapped database was not followed: {:?}",
            entries(&sb, "geo")
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("the swapped database in force {:.2} s after its rename", t0.elapsed().as_secs_f64());
    // And `policer reload` of it changes nothing more.
    let msg = succeeds(&cli(&sb, &["reload"]));
    assert!(!msg.contains("config sets: changed geo"), "{msg}");
    assert_eq!(entries(&sb, "geo"), want);
    expect(&sb, &[("192.0.2.7", false), ("198.51.100.7", true), ("10.1.0.5", true)], "after the swap");

    // Cut short (written in place, as a download killed midway leaves
    // it): followed and refused, and `policer reload` is refused saying
    // why; nothing changes.
    let whole = std::fs::read(&db.0).unwrap();
    std::fs::write(&db.0, &whole[..whole.len() / 2]).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let st: Value = serde_json::from_str(&succeeds(&cli(&sb, &["status", "--json"]))).unwrap();
    let last = st["config_status"]["last_reload_error"].as_str().unwrap_or_default().to_string();
    assert!(last.contains("not a whole MaxMind DB file"), "the followed cut database: {st:#}");
    let out = cli(&sb, &["reload"]);
    fails_with(&out, "not a whole MaxMind DB file");
    fails_with(&out, "set 'geo'");
    fails_with(&cli(&sb, &["check", &sb.config]), "not a whole MaxMind DB file");
    assert_eq!(entries(&sb, "geo"), of(&relisted, |r| r["country"]["iso_code"] == "DE"));
    expect(&sb, &[("192.0.2.7", false), ("198.51.100.7", true)], "after a refused reload");
    // A set of a database with no file key, and one naming a country with
    // no network: refused by check.
    std::fs::write(&db.0, &whole).unwrap();
    std::fs::write(&sb.config, with_set.replace("country = [\"DE\"]\nasn = [64999]\n", "")).unwrap();
    fails_with(&cli(&sb, &["check", &sb.config]), "needs country or asn");
    std::fs::write(&sb.config, with_set.replace("[\"DE\"]", "[\"JP\"]")).unwrap();
    fails_with(&cli(&sb, &["check", &sb.config]), "has no network of country JP; AS 64999");
}

/// Waits until `cond` holds of the crowdsec set's entries (at most `secs`).
fn wait_set(sb: &Sandbox, secs: f64, what: &str, cond: impl Fn(&[String]) -> bool) {
    let t0 = Instant::now();
    loop {
        let out = cli(sb, &["rule", "ls", "--set", "crowdsec", "--json"]);
        let e: Vec<String> = if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).unwrap();
            v["entries"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().to_string()).collect()
        } else {
            Vec::new()
        };
        if cond(&e) {
            return;
        }
        assert!(t0.elapsed().as_secs_f64() < secs, "{what}: not within {secs} s; the set holds {e:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn crowdsec_country_and_as_decisions_are_their_networks_until_their_end() {
    if !lapi::available("mmdb tier") || !mmdb::available("mmdb tier") {
        return;
    }
    let sb = Sandbox::new("mmdbcs");
    let db = Temp::beside(&sb, "cs-country.mmdb");
    let listed = mmdb::write(&db.0, "GeoLite2-Country", &countries("192.0.2.0/24"));
    let asdb = Temp::beside(&sb, "cs-asn.mmdb");
    let as_listed = mmdb::write(&asdb.0, "GeoLite2-ASN", &ases());
    let lapi = Lapi::start(&sb.rx_ns, 18_460);
    let key = lapi.bouncer_key("policer-mmdb");
    lapi.add_decision(&["--scope", "Country", "--value", "DE", "--duration", "1h"]);
    lapi.add_decision(&["--scope", "AS", "--value", "64502", "--duration", "6s"]);
    lapi.add_decision(&["--ip", "10.9.9.9", "--duration", "1h"]);
    std::fs::write(
        &sb.config,
        format!(
            "[crowdsec]\nlapi_url = \"{}\"\napi_key = \"{key}\"\nupdate_frequency = \"1s\"\ncountry_mmdb = \"{}\"\n\
             asn_mmdb = \"{}\"\n\n{RULES}",
            lapi.url(),
            db.path(),
            asdb.path()
        ),
    )
    .unwrap();
    let _d = Daemon::attach(&sb, &["--interval", "0", "--metrics", "9486"]);
    let mut want = of(&listed, |r| r["country"]["iso_code"] == "DE");
    want.extend(of(&as_listed, |r| r["autonomous_system_number"] == 64502));
    want.push("10.9.9.9/32".into());
    want.sort_by_key(|n| n.parse::<ipnet::IpNet>().unwrap());
    want.dedup();
    // DE's networks and AS64502's (192.0.2.0/24 is both), and the Ip.
    wait_set(&sb, 5.0, "the startup pull", |e| e == want.as_slice());
    expect(
        &sb,
        &[("10.1.0.5", true), ("192.0.2.7", true), ("2001:db8:1::5", true), ("10.9.9.9", true), ("10.2.0.1", false)],
        "the Country and AS decisions",
    );
    let r = inspect_rule(&sb, "2001:db8:1::5");
    assert!(r.contains("set:crowdsec") && r.contains("country DE"), "{r}");
    let stats: Value = serde_json::from_str(&succeeds(&cli(&sb, &["stats", "--json"]))).unwrap();
    let f = &stats["feeds"][0];
    assert_eq!(f["decisions_by_scope"], json!({"country": 1, "as": 1, "ip": 1}), "{f:#}");
    let m = samples(&scrape(&sb.rx_ns, 9486));
    assert_eq!(m.get("policer_crowdsec_scope_decisions{scope=\"country\"}"), Some(&1.0), "{m:?}");
    assert_eq!(m.get("policer_crowdsec_scope_decisions{scope=\"as\"}"), Some(&1.0), "{m:?}");
    // The AS decision ends at its end: 192.0.2.0/24 stays (DE holds it).
    let t0 = Instant::now();
    loop {
        let st: Value = serde_json::from_str(&succeeds(&cli(&sb, &["stats", "--json"]))).unwrap();
        if st["feeds"][0]["decisions_by_scope"].get("as").is_none() {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the 6 s AS decision did not end: {:#}", st["feeds"][0]);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(entries(&sb, "crowdsec"), want, "DE still holds 192.0.2.0/24");
    expect(&sb, &[("192.0.2.7", true)], "after the AS decision's end");
    // The Country decision deleted: its networks leave.
    lapi.cscli(&["decisions", "delete", "--value", "DE"]);
    wait_set(&sb, 5.0, "the deletion of the Country decision", |e| e == ["10.9.9.9/32".to_string()]);
    expect(&sb, &[("10.1.0.5", false), ("192.0.2.7", false), ("2001:db8:1::5", false), ("10.9.9.9", true)], "lifted");
}
