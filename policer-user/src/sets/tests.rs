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
        (b"10.0.0.0/33\n", "feed.txt:1: prefix length '/33' must be 0 to 32"),
        (b"2001:db8::/129\n", "feed.txt:1: prefix length '/129' must be 0 to 128"),
        (b"10.0.0.1 10.0.0.2\n", "feed.txt:1: '10.0.0.1 10.0.0.2': one prefix per line"),
        (b"ok\n", "feed.txt:1: 'ok' is not an IP address"),
        (b"10.0.0.1\r\n\xff\xfe\r\n", "feed.txt:2: not UTF-8 text"),
        (b"10.0.0.0/\n", "feed.txt:1: prefix length '/' must be 0 to 32"),
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
        ..Header::default()
    };
    let entries = nets(&["10.0.0.1/32", "2001:db8::/32"]);
    stage(&dir, 0o600, &h, Body::Entries(&entries)).unwrap().commit().unwrap();
    // A staged file that is dropped leaves nothing behind.
    drop(stage(&dir, 0o600, &Header { name: "gone".into(), ..h.clone() }, Body::Entries(&entries)).unwrap());
    // The list as imported, comments and all, without a final newline.
    let raw = Header { name: "raw".into(), ..h.clone() };
    stage(&dir, 0o600, &raw, Body::Text(b"# feed\n2001:db8::/32\n10.0.0.1")).unwrap().commit().unwrap();
    let all = read_all(&dir).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].0, h);
    assert_eq!(all[0].1.entries, entries);
    assert_eq!((&all[1].0, &all[1].1.entries), (&raw, &entries));
    remove(&dir, "raw").unwrap();
    remove(&dir, "feed").unwrap();
    remove(&dir, "feed").unwrap();
    assert!(read_all(&dir).unwrap().is_empty());
    assert_eq!(legacy_dir(Path::new("/etc/policer/policer.toml")), Path::new("/etc/policer/policer.sets"));
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

#[test]
fn a_bom_mapped_entries_and_long_lines() {
    // A byte order mark at the start is no part of the first line.
    let l = parse(b"\xef\xbb\xbf10.0.0.1\n10.0.0.2\n", "f").unwrap();
    assert_eq!(l.entries, nets(&["10.0.0.1/32", "10.0.0.2/32"]));
    // Elsewhere it is a character of the line, shown, not invisible.
    let e = parse(b"10.0.0.1\n\xef\xbb\xbf10.0.0.2\n", "f").unwrap_err().to_string();
    assert!(e.starts_with("f:2: '\\u{feff}10.0.0.2' is not an IP address"), "{e}");
    // IPv4-mapped entries are the IPv4 prefixes they mean, counted.
    let l = parse(b"::ffff:10.0.0.1\n::ffff:192.0.2.0/120\n10.0.0.1\n::fffe:0:0/95\n", "f").unwrap();
    assert_eq!(l.entries, nets(&["10.0.0.1/32", "192.0.2.0/24", "::fffe:0:0/95"]));
    assert_eq!((l.mapped, l.duplicates), (2, 1));
    let e = parse(b"::ffff:10.0.0.1/120\n", "f").unwrap_err().to_string();
    assert!(e.contains("did you mean 10.0.0.0/24"), "{e}");
    // A 10 MB line is quoted by its first 80 characters and its size.
    let mut big = b"10.0.0.1\n".to_vec();
    big.extend(std::iter::repeat_n(b'9', 10 << 20));
    let e = parse(&big, "f").unwrap_err().to_string();
    assert!(e.len() < 200, "{} bytes of error", e.len());
    assert!(e.starts_with(&format!("f:2: '{}…(10485760 bytes)' is not an IP address", "9".repeat(80))), "{e}");
    let e = parse(format!("10.0.0.1 {}\n", "x".repeat(1000)).as_bytes(), "f").unwrap_err().to_string();
    assert!(e.contains("…(1009 bytes)': one prefix per line"), "{e}");
    let e = parse(format!("10.0.0.0/{}\n", "1".repeat(1000)).as_bytes(), "f").unwrap_err().to_string();
    assert!(e.len() < 200 && e.contains("…(1000 bytes)"), "{e}");
}

#[test]
fn max_remove_parses_and_bounds() {
    for (s, want) in [
        ("50%", MaxRemove::Share(5000)),
        ("12.5%", MaxRemove::Share(1250)),
        ("0.01%", MaxRemove::Share(1)),
        ("100%", MaxRemove::Share(10_000)),
        (" 0% ", MaxRemove::Share(0)),
        ("1000", MaxRemove::Count(1000)),
        ("0", MaxRemove::Count(0)),
    ] {
        assert_eq!(s.parse::<MaxRemove>().unwrap(), want, "{s}");
        // Through the wire and back.
        let json = serde_json::to_string(&want).unwrap();
        assert_eq!(serde_json::from_str::<MaxRemove>(&json).unwrap(), want);
    }
    assert_eq!(MaxRemove::default().to_string(), "50%");
    assert_eq!(MaxRemove::Share(1250).to_string(), "12.50%");
    for bad in ["", "%", "101%", "50.123%", "-1", "-5%", "1e3", "half", "5 0%", "1.5", "99999999999999999999999"] {
        let e = bad.parse::<MaxRemove>().unwrap_err();
        assert!(e.starts_with("--max-remove '"), "{bad}: {e}");
    }
    assert!(serde_json::from_str::<MaxRemove>("\"200%\"").is_err());

    let half = MaxRemove::default();
    assert!(half.allows(500_000, 1_000_000) && !half.allows(500_001, 1_000_000));
    // A file cut at 1 MB of a million-entry feed.
    assert!(!half.allows(916_580, 1_000_000));
    assert!(half.allows(0, 0) && half.allows(1, 2) && !half.allows(2, 3));
    assert!(MaxRemove::Count(10).allows(10, 11) && !MaxRemove::Count(10).allows(11, 1_000_000));
    assert!(MaxRemove::Share(10_000).allows(7, 7) && !MaxRemove::Share(0).allows(1, 1_000_000));
}

#[test]
fn state_files_are_private_as_the_config_and_not_through_links() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("policer.toml");
    assert_eq!(file_mode(&config), 0o600, "no config yet");
    fs::write(&config, "").unwrap();
    fs::set_permissions(&config, fs::Permissions::from_mode(0o640)).unwrap();
    assert_eq!(file_mode(&config), 0o640);
    fs::set_permissions(&config, fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(file_mode(&config), 0o644, "no execute bits");
    fs::set_permissions(&config, fs::Permissions::from_mode(0o600)).unwrap();

    let dir = legacy_dir(&config);
    let h = Header { name: "feed".into(), rule: RuleConfig::default(), expires_ms: None, ..Header::default() };
    // A link to a file root must not overwrite, planted at the very name
    // the next write tries first, and at the fixed name an older policer
    // used: neither is followed.
    fs::create_dir_all(&dir).unwrap();
    let victim = d.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    symlink(&victim, dir.join(".feed.set.tmp")).unwrap();
    let planted = dir.join(format!(".feed.set.{:016x}.tmp", 0x5eed_u64));
    symlink(&victim, &planted).unwrap();
    crate::files::NEXT_NAME.with(|c| c.set(Some(0x5eed)));
    stage(&dir, file_mode(&config), &h, Body::Text(b"10.0.0.1\n")).unwrap().commit().unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(fs::symlink_metadata(&planted).unwrap().file_type().is_symlink(), "the planted link was replaced");
    fs::remove_file(&planted).unwrap();
    let m = fs::metadata(dir.join("feed.set")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o600);
    // A new directory takes the mode too (searchable where readable).
    let dir2 = d.path().join("new.sets");
    stage(&dir2, 0o640, &h, Body::Text(b"10.0.0.1\n")).unwrap().commit().unwrap();
    assert_eq!(fs::metadata(&dir2).unwrap().mode() & 0o777, 0o750);
    assert_eq!(fs::metadata(dir2.join("feed.set")).unwrap().mode() & 0o777, 0o640);

    // Leftovers of killed writes (this version's and an older one's) go;
    // a staged write in progress, a state file and the link's target stay.
    let pending = stage(&dir, 0o600, &Header { name: "busy".into(), ..h.clone() }, Body::Text(b"10.0.0.2\n")).unwrap();
    fs::write(dir.join(".gone.set.00000000deadbeef.tmp"), "cut").unwrap();
    fs::write(dir.join(".old.set.tmp"), "cut").unwrap();
    let (removed, failed) = remove_leftovers(&dir);
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(removed, vec![dir.join(".gone.set.00000000deadbeef.tmp"), dir.join(".old.set.tmp")]);
    pending.commit().unwrap();
    let names: Vec<String> = read_all(&dir).unwrap().into_iter().map(|(h, _)| h.name).collect();
    assert_eq!(names, ["busy", "feed"]);
    assert!(victim.exists());
}

#[test]
fn state_files_that_are_not_files_are_named() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("feed.set");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = std::time::Instant::now();
    let e = read_all(d.path()).unwrap_err().to_string();
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(e, format!("set state file {} is a FIFO, not a regular file", fifo.display()));
    fs::remove_file(&fifo).unwrap();
    fs::create_dir(&fifo).unwrap();
    let e = read_all(d.path()).unwrap_err().to_string();
    assert!(e.ends_with("is a directory, not a regular file"), "{e}");
    fs::remove_dir(&fifo).unwrap();
    // A state file with a byte order mark (edited by hand) still reads.
    let h = Header { name: "feed".into(), rule: RuleConfig::default(), expires_ms: None, ..Header::default() };
    let mut text = b"\xef\xbb\xbf#policer-set ".to_vec();
    text.extend(serde_json::to_vec(&h).unwrap());
    text.extend(b"\n10.0.0.1\n");
    fs::write(&fifo, text).unwrap();
    assert_eq!(read_all(d.path()).unwrap()[0].0, h);
}

/// Spamhaus DROP lists: `;` header lines and `; SBL…` after each prefix.
#[test]
fn semicolon_comments_as_in_spamhaus_drop() {
    let text = b"; Spamhaus DROP List 2024/01/01 - (c) 2024 The Spamhaus Project\n; Last-Modified: x\n\
                 1.10.16.0/20 ; SBL256894\n1.19.0.0/16 ; SBL434604\n\n203.0.113.7;no space\n";
    let l = parse(text, "drop.txt").unwrap();
    assert_eq!(l.entries, nets(&["1.10.16.0/20", "1.19.0.0/16", "203.0.113.7/32"]));
    assert_eq!(line_of(text, "1.19.0.0/16".parse().unwrap()), Some(4));
    assert_eq!(line_of(text, "203.0.113.7/32".parse().unwrap()), Some(6));
    assert_eq!(line_of(text, "10.0.0.1/32".parse().unwrap()), None);
    let e = parse(b"; header\n1.2.3.0/24 ; SBL1\n1.2.3.4/24 ; SBL2\n", "drop.txt").unwrap_err().to_string();
    assert!(e.starts_with("drop.txt:3: '1.2.3.4/24' has host bits set"), "{e}");
}

/// Sets kept beside the config by older releases are copied into the
/// state directory once; after that the old place is not read.
#[test]
fn legacy_sets_are_copied_once() {
    let d = tempfile::tempdir().unwrap();
    let config = d.path().join("policer.toml");
    let legacy = legacy_dir(&config);
    let new = sets_dir(&d.path().join("state"));
    assert_eq!(migrate(&legacy, &new, 0o600).unwrap(), Migrated::Nothing, "no old directory");
    let h = Header { name: "feed".into(), rule: RuleConfig::default(), expires_ms: None, ..Header::default() };
    stage(&legacy, 0o640, &h, Body::Text(b"10.0.0.1\n; x\n")).unwrap().commit().unwrap();
    assert_eq!(migrate(&legacy, &new, 0o640).unwrap(), Migrated::Copied(vec!["feed".into()]));
    let all = read_all(&new).unwrap();
    assert_eq!((all.len(), &all[0].0, &all[0].1.entries), (1, &h, &nets(&["10.0.0.1/32"])));
    assert_eq!(fs::metadata(new.join("feed.set")).unwrap().mode() & 0o777, 0o640);
    // The new directory exists: the old one is not read again (a set
    // removed since does not come back).
    remove(&new, "feed").unwrap();
    assert_eq!(migrate(&legacy, &new, 0o640).unwrap(), Migrated::Nothing);
    remove_legacy(&legacy, &["feed".into()]).unwrap();
    assert!(!legacy.exists());
    // A legacy directory that does not read fails, naming it; nothing is
    // made.
    let bad = d.path().join("bad.sets");
    fs::create_dir(&bad).unwrap();
    fs::write(bad.join("x.set"), "not a set file\n").unwrap();
    let other = sets_dir(&d.path().join("state2"));
    assert!(migrate(&bad, &other, 0o600).unwrap_err().to_string().contains("x.set:1: not a policer set file"));
    assert!(!other.exists());
}

/// `overlaps` says what a look at every entry says: an entry holds the
/// prefix or lies inside it, in either family.
mod overlap {
    use super::*;
    use proptest::prelude::*;

    fn slow(list: &[IpNet], p: IpNet) -> bool {
        let p = p.trunc();
        list.iter().any(|e| e.contains(&p) || p.contains(e))
    }

    /// Prefixes in a small corner of each family, so that lists and probes
    /// meet often.
    fn net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<u8>(), 16u8..=32).prop_map(|(b, l)| IpNet::new(
                std::net::Ipv4Addr::new(10, 0, b >> 4, b << 4).into(),
                l
            )
            .unwrap()
            .trunc()),
            (any::<u16>(), 112u8..=128).prop_map(|(b, l)| IpNet::new(
                std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, b >> 8, b << 8).into(),
                l
            )
            .unwrap()
            .trunc()),
            (0u8..=8).prop_map(|l| IpNet::new(std::net::Ipv4Addr::new(10, 0, 0, 0).into(), l).unwrap().trunc()),
        ]
    }

    #[test]
    fn cases() {
        let list = nets(&["10.1.0.0/16", "10.2.3.4/32", "2001:db8::/64"]);
        for (p, want) in [
            ("10.1.2.0/24", true),  // inside an entry
            ("10.0.0.0/8", true),   // holds entries
            ("10.1.0.0/16", true),  // an entry
            ("10.2.3.0/24", true),  // holds the /32
            ("10.2.3.5/32", false), // beside it
            ("10.3.0.0/16", false), // beside
            ("0.0.0.0/0", true),    // holds all of IPv4
            ("::/0", true),         // holds the IPv6 entry
            ("2001:db8:0:1::/64", false),
            ("2001:db8::1/128", true),
            ("192.0.2.1/32", false),
        ] {
            let p: IpNet = p.parse().unwrap();
            assert_eq!(overlaps(&list, p), want, "{p}");
            assert_eq!(slow(&list, p), want, "{p} (the slow look)");
        }
        assert!(!overlaps(&[], "0.0.0.0/0".parse().unwrap()));
    }

    proptest! {
        #[test]
        fn overlaps_is_a_look_at_every_entry(mut list in proptest::collection::vec(net(), 0..40), p in net()) {
            list.sort_unstable();
            list.dedup();
            prop_assert_eq!(overlaps(&list, p), slow(&list, p));
        }
    }
}
