//! The reading and normalizing of MMDB files, on databases written by
//! PyPI's `mmdb-writer` (`tests/mmdb/write_mmdb.py`; the specs and the
//! writer's own list of each are in `policer-user/testdata/`).

use super::*;

fn data(name: &str) -> Vec<u8> {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata").join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn db(name: &str) -> Db {
    from_bytes(data(&format!("{name}.mmdb")), name).unwrap()
}

/// The writer's list of `name`: its networks whose record `keep` takes.
fn expected(name: &str, keep: impl Fn(&serde_json::Value) -> bool) -> Vec<IpNet> {
    let list: Vec<(String, serde_json::Value)> =
        serde_json::from_slice(&data(&format!("{name}.expected.json"))).unwrap();
    let mut v: Vec<IpNet> = list.iter().filter(|(_, r)| keep(r)).map(|(n, _)| n.parse().unwrap()).collect();
    v.sort();
    v
}

fn q(country: &[&str], asn: &[u32]) -> Query {
    Query { country: country.iter().map(|c| c.to_string()).collect(), asn: asn.to_vec() }
}

#[test]
fn a_country_is_every_network_of_it_both_families_ipv4_once() {
    let s = db("country").select(&q(&["FR"], &[])).unwrap();
    let want = expected("country", |r| r["country"]["iso_code"] == "FR");
    assert_eq!(s.entries, want);
    // Nested: 10.0.0.0/8 less DE's 10.1.0.0/16, as the tree's leaves.
    assert!(s.entries.contains(&"10.0.0.0/16".parse().unwrap()));
    assert!(!s.entries.contains(&"10.1.0.0/16".parse().unwrap()));
    assert!(s.entries.contains(&"10.128.0.0/9".parse().unwrap()));
    // In ::/96 and under ::ffff:0:0/96 both: IPv4, once.
    assert_eq!(s.entries.iter().filter(|n| **n == "198.51.100.0/24".parse::<IpNet>().unwrap()).count(), 1);
    // Only under ::ffff:0:0/96: IPv4 too.
    assert!(s.entries.contains(&"203.0.113.0/24".parse().unwrap()));
    assert!(
        s.entries.iter().all(|n| n
            .addr()
            .to_string()
            .parse::<std::net::Ipv6Addr>()
            .map_or(true, |a| a.to_ipv4_mapped().is_none()))
    );
    assert!(s.mapped >= 2, "{}", s.mapped);
    assert!(s.entries.contains(&"2001:db8:8000::/33".parse().unwrap()));
    assert_eq!(s.labels.get(&"10.0.0.0/16".parse().unwrap()), Some(&Label::Country("FR".into())));
    assert_eq!(s.database_type, "GeoLite2-Country");
    // IPv4 first, sorted, each once.
    let mut sorted = s.entries.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted, s.entries);
}

#[test]
fn countries_and_ases_together_label_each_network() {
    let s = db("country").select(&q(&["DE", "FR"], &[])).unwrap();
    assert_eq!(s.entries, expected("country", |r| r["country"]["iso_code"] != serde_json::Value::Null));
    assert_eq!(s.labels.get(&"10.1.0.0/16".parse().unwrap()), Some(&Label::Country("DE".into())));
    let a = db("asn").select(&q(&[], &[64501])).unwrap();
    assert_eq!(a.entries, expected("asn", |r| r["autonomous_system_number"] == 64501));
    assert_eq!(a.labels.get(&"2001:db8::/32".parse().unwrap()), Some(&Label::As(64501)));
    let text = String::from_utf8(a.text()).unwrap();
    assert!(text.contains("10.1.0.0/16 # AS64501\n"), "{text}");
    // The state file's comments give the labels back.
    assert_eq!(Labels::from_text(text.as_bytes()), *a.labels);
}

#[test]
fn ipinfo_lite_and_an_ipv4_database_read_too() {
    let i = db("ipinfo");
    // Codes are upper case, as `Query::parse` makes them.
    assert!(i.select(&q(&["de"], &[])).is_err());
    let de = i.select(&q(&["DE"], &[])).unwrap();
    assert_eq!(de.entries, vec!["2001:db8::/32".parse::<IpNet>().unwrap()]);
    let a = i.select(&q(&[], &[64500])).unwrap();
    assert_eq!(a.entries, vec!["10.0.0.0/8".parse::<IpNet>().unwrap()]);
    assert_eq!(a.labels.get(&a.entries[0]), Some(&Label::As(64500)));
    let v4 = db("v4only").select(&q(&["FR"], &[])).unwrap();
    assert_eq!(v4.entries, expected("v4only", |r| r["country"]["iso_code"] == "FR"));
}

#[test]
fn a_query_that_takes_nothing_a_cut_or_empty_file_is_refused_naming_why() {
    let e = db("asn").select(&q(&["FR"], &[])).unwrap_err().to_string();
    assert!(e.contains("GeoLite2-ASN") && e.contains("no network of country FR"), "{e}");
    let whole = data("country.mmdb");
    for cut in [whole.len() - 1, whole.len() - 40, whole.len() / 2, 10, 0] {
        let e = from_bytes(whole[..cut].to_vec(), "cut.mmdb").err().map(|e| e.to_string());
        let e = e.unwrap_or_else(|| panic!("a file cut at {cut} of {} bytes opened", whole.len()));
        assert!(e.contains("cut.mmdb") && e.contains("not a whole MaxMind DB file"), "{e}");
    }
    let e = from_bytes(b"10.0.0.0/8\n".to_vec(), "list.txt").err().unwrap().to_string();
    assert!(e.contains("list.txt"), "{e}");
}

#[test]
fn countries_and_as_numbers_parse_and_refuse_clearly() {
    assert_eq!(parse_countries("fr, DE,FR").unwrap(), vec!["DE".to_string(), "FR".to_string()]);
    assert!(parse_countries("FRA").unwrap_err().to_string().contains("two letters"));
    assert!(parse_countries("F1").is_err());
    assert_eq!(parse_asns("AS64501,64500,as64500").unwrap(), vec![64500, 64501]);
    assert!(parse_asns("ASx").unwrap_err().to_string().contains("AS number"));
    assert!(parse_asns("-1").is_err());
    assert!(Query::parse(None, None).unwrap_err().to_string().contains("--country"));
    assert_eq!(Query::parse(Some("de"), Some("AS1")).unwrap().describe(), "country DE; AS 1");
    assert_eq!(Label::parse("country fr"), Some(Label::Country("FR".into())));
    assert_eq!(Label::parse(" AS64500 "), Some(Label::As(64500)));
    assert_eq!(Label::parse("SBL123"), None);
}
