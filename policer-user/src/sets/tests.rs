use super::*;

fn nets(v: &[&str]) -> Vec<IpNet> {
    let mut v: Vec<IpNet> = v.iter().map(|s| s.parse().unwrap()).collect();
    v.sort();
    v
}

#[test]
fn parses_comments_blanks_crlf_and_both_families() {
    let text = b"# a feed\r\n\r\n203.0.113.7\r\n  198.51.100.0/24  # a comment\n2001:db8::/32\n\n2001:db8:1::5\n";
    let l = parse(text, "feed.txt").unwrap();
    assert_eq!(l.entries, nets(&["203.0.113.7/32", "198.51.100.0/24", "2001:db8::/32", "2001:db8:1::5/128"]));
    assert_eq!(l.duplicates, 0);
    assert_eq!(parse(b"", "f").unwrap(), List::default());
    assert_eq!(parse(b"# only comments\n\n", "f").unwrap().entries, vec![]);
    // No newline at the end.
    assert_eq!(parse(b"10.0.0.1", "f").unwrap().entries, nets(&["10.0.0.1/32"]));
}

#[test]
fn duplicates_are_kept_once() {
    let l = parse(b"10.0.0.1\n10.0.0.1/32\n10.0.0.2\n10.0.0.1\n", "f").unwrap();
    assert_eq!(l.entries, nets(&["10.0.0.1/32", "10.0.0.2/32"]));
    assert_eq!(l.duplicates, 2);
}

#[test]
fn bad_lines_are_named_by_number() {
    let cases: [(&[u8], &str); 8] = [
        (b"10.0.0.1\n10.0.0.300\n", "feed.txt:2: '10.0.0.300' is not an IP address"),
        (b"10.0.0.1\n\n# x\n10.0.0.5/24\n", "feed.txt:4: '10.0.0.5/24' has host bits set; did you mean 10.0.0.0/24?"),
        (b"10.0.0.0/33\n", "feed.txt:1: prefix length '/33' must be 0..=32"),
        (b"2001:db8::/129\n", "feed.txt:1: prefix length '/129' must be 0..=128"),
        (b"10.0.0.1 10.0.0.2\n", "feed.txt:1: '10.0.0.1 10.0.0.2': one prefix per line"),
        (b"ok\n", "feed.txt:1: 'ok' is not an IP address"),
        (b"10.0.0.1\r\n\xff\xfe\r\n", "feed.txt:2: not UTF-8 text"),
        (b"10.0.0.0/\n", "feed.txt:1: prefix length '/' must be 0..=32"),
    ];
    for (text, want) in cases {
        let e = parse(text, "feed.txt").unwrap_err().to_string();
        assert!(e.starts_with(want), "{:?}: '{e}' is not '{want}'", String::from_utf8_lossy(text));
        assert!(e.ends_with("nothing imported"), "{e}");
    }
}

#[test]
fn diff_adds_keeps_and_removes() {
    let old = nets(&["10.0.0.1/32", "10.0.0.2/32", "10.0.0.3/32", "2001:db8::/32"]);
    let new = nets(&["10.0.0.2/32", "10.0.0.4/32", "2001:db8::/32", "2001:db8:1::/48"]);
    let d = diff(&old, &new);
    assert_eq!(d.add, nets(&["10.0.0.4/32", "2001:db8:1::/48"]));
    assert_eq!(d.keep, nets(&["10.0.0.2/32", "2001:db8::/32"]));
    assert_eq!(d.remove, nets(&["10.0.0.1/32", "10.0.0.3/32"]));
    assert_eq!(diff(&[], &new).add, new);
    assert_eq!(diff(&old, &[]).remove, old);
    assert_eq!(diff(&old, &old).keep, old);
    assert_eq!(first_common(&old, &new), Some("10.0.0.2/32".parse().unwrap()));
    assert_eq!(first_common(&old, &nets(&["10.0.0.9/32"])), None);
}

/// A million lines parse and diff well inside the import budget (a debug
/// build is slower; this only guards against a quadratic step).
#[test]
fn a_million_lines() {
    let mut text = String::new();
    for a in hosts(1_000_000) {
        text.push_str(&a.to_string());
        text.push('\n');
    }
    let l = parse(text.as_bytes(), "big").unwrap();
    assert_eq!(l.entries.len(), 1_000_000);
    let mut other = l.entries[100_000..].to_vec();
    other.extend(hosts(1_100_000).skip(1_000_000).map(|a| IpNet::from(IpAddr::V4(a))));
    other.sort();
    let d = diff(&l.entries, &other);
    assert_eq!((d.add.len(), d.keep.len(), d.remove.len()), (100_000, 900_000, 100_000));
}

#[test]
fn names_and_state_files() {
    for ok in ["feed", "spamhaus-drop", "a.b_c:1", "police-100pps"] {
        check_name(ok).unwrap();
    }
    for bad in ["", ".hidden", "-x", "a/b", "a b", &"x".repeat(65)] {
        assert!(check_name(bad).is_err(), "{bad}");
    }
    let dir = std::env::temp_dir().join(format!("policer-sets-test-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let h = Header {
        name: "feed".into(),
        rule: RuleConfig { action: Some(policer_common::bucket::Action::Deny), ..RuleConfig::default() },
        expires_ms: Some(1_700_000_000_000),
    };
    let entries = nets(&["10.0.0.1/32", "2001:db8::/32"]);
    stage(&dir, &h, Body::Entries(&entries)).unwrap().commit().unwrap();
    // A staged file that is dropped leaves nothing behind.
    drop(stage(&dir, &Header { name: "gone".into(), ..h.clone() }, Body::Entries(&entries)).unwrap());
    // The list as imported, comments and all, without a final newline.
    let raw = Header { name: "raw".into(), ..h.clone() };
    stage(&dir, &raw, Body::Text(b"# feed\n2001:db8::/32\n10.0.0.1")).unwrap().commit().unwrap();
    let all = read_all(&dir).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].0, h);
    assert_eq!(all[0].1.entries, entries);
    assert_eq!((&all[1].0, &all[1].1.entries), (&raw, &entries));
    remove(&dir, "raw").unwrap();
    remove(&dir, "feed").unwrap();
    remove(&dir, "feed").unwrap();
    assert!(read_all(&dir).unwrap().is_empty());
    assert_eq!(state_dir(Path::new("/etc/policer/policer.toml")), Path::new("/etc/policer/policer.sets"));
    let _ = fs::remove_dir_all(&dir);
}

#[test]
fn implicit_names() {
    use policer_common::bucket::Action;
    let rc = |action, rate: Option<&str>| RuleConfig {
        action: Some(action),
        rate: rate.map(Into::into),
        ..RuleConfig::default()
    };
    assert_eq!(implicit_name(&rc(Action::Deny, None)), "deny");
    assert_eq!(implicit_name(&rc(Action::Police, Some("100pps"))), "police-100pps");
    assert_eq!(implicit_name(&rc(Action::Police, Some("10 kpps"))), implicit_name(&rc(Action::Police, Some("10kpps"))));
    for a in [Action::Allow, Action::Monitor] {
        check_name(&implicit_name(&rc(a, Some("64kbit")))).unwrap();
    }
}
