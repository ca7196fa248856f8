//! Tests of [`ConfigFile`]: edits that keep what the operator wrote, and
//! writes that keep the file's owner, mode and links, refuse hand edits,
//! and leave nothing behind on error. They run as root in CI and as any
//! user by hand; nothing here needs privileges except the owner test, which
//! says so when it skips.

use std::{
    collections::BTreeMap,
    fs,
    os::unix::fs::{MetadataExt, PermissionsExt, symlink},
    path::{Path, PathBuf},
};

use ipnet::IpNet;

use super::{
    ConfigFile, NEW_FILE_MODE,
    write::{FAULT, Step},
};
use crate::files::NEXT_NAME;
use crate::{
    error::Error,
    rules::{BurstValue, RuleConfig, RuleKey, RuleSpec},
};

/// The shipped config with its example rules in force (it ships them
/// commented out): a file with comments, paragraphs and every kind of rule.
static EXAMPLE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let shipped = include_str!("../../../deploy/policer.toml");
    let (defaults, examples) = shipped
        .split_once("# Examples (uncomment and adapt; `policer check --config FILE` validates).\n#\n")
        .expect("the shipped config has examples");
    let uncommented: Vec<&str> = examples
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(t) if t.starts_with("[[rule]]") || t.starts_with("[[set]]") || t.contains(" = ") => t,
            _ => l,
        })
        .collect();
    format!("{defaults}{}\n", uncommented.join("\n"))
});

fn rule(
    prefix: &str,
    rate: Option<&str>,
    burst: Option<u64>,
    action: Option<policer_common::bucket::Action>,
) -> RuleSpec {
    RuleConfig {
        prefix: prefix.into(),
        rate: rate.map(Into::into),
        burst: burst.map(BurstValue::Count),
        action,
        ..RuleConfig::default()
    }
    .validate()
    .unwrap()
}

fn with(mut rules: BTreeMap<RuleKey, RuleSpec>, r: RuleSpec) -> BTreeMap<RuleKey, RuleSpec> {
    rules.insert(r.key(), r);
    rules
}

fn without(mut rules: BTreeMap<RuleKey, RuleSpec>, prefix: &str) -> BTreeMap<RuleKey, RuleSpec> {
    let key = RuleKey::new(prefix.parse::<IpNet>().unwrap(), Default::default(), false);
    rules.remove(&key).expect("rule exists");
    rules
}

/// Files in `dir` other than `keep`: temporary files left behind.
fn leftovers(dir: &Path, keep: &[&str]) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

fn example_in(dir: &Path) -> PathBuf {
    let p = dir.join("policer.toml");
    fs::write(&p, &*EXAMPLE).unwrap();
    p
}

/// Lines of `b` not in `a` and lines of `a` not in `b`, in order.
fn diff(a: &str, b: &str) -> (Vec<String>, Vec<String>) {
    let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    (
        lb.iter().filter(|l| !la.contains(l)).map(|l| l.to_string()).collect(),
        la.iter().filter(|l| !lb.contains(l)).map(|l| l.to_string()).collect(),
    )
}

#[test]
fn unchanged_rules_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let before = fs::metadata(&p).unwrap().ino();
    f.apply_rules(&rules).unwrap();
    f.set_interfaces(&["eth0".into()]).unwrap();
    assert_eq!(fs::read_to_string(&p).unwrap(), *EXAMPLE);
    assert_eq!(fs::metadata(&p).unwrap().ino(), before, "rewritten although nothing changed");
}

#[test]
fn set_keeps_comments_and_layout() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();

    // Replace: only the changed key's line differs; its comment stays.
    let rules = with(rules, rule("203.0.113.0/24", Some("750pps"), Some(50), None));
    f.apply_rules(&rules).unwrap();
    let text = fs::read_to_string(&p).unwrap();
    assert_eq!(diff(&EXAMPLE, &text), (vec![r#"rate = "750pps""#.into()], vec![r#"rate = "500pps""#.into()]));
    assert!(
        text.contains("# A tighter limit for one network.\n[[rule]]\nprefix = \"203.0.113.0/24\"\nrate = \"750pps\"")
    );

    // Add: inserted after the last rule (before the [[set]] that follows
    // the rules); everything else is as it was.
    let rules = with(rules, rule("192.0.2.128/25", None, None, Some(policer_common::bucket::Action::Deny)));
    f.apply_rules(&rules).unwrap();
    let added = fs::read_to_string(&p).unwrap();
    let at = text.find("\n# A named set").expect("the example's [[set]]");
    let new = "\n[[rule]]\nprefix = \"192.0.2.128/25\"\naction = \"deny\"\n";
    assert_eq!(added, format!("{}{new}{}", &text[..at], &text[at..]), "text around the new rule changed");

    // Remove: the table and the comment above it go, nothing else.
    let rules = without(rules, "203.0.113.0/24");
    f.apply_rules(&rules).unwrap();
    let removed = fs::read_to_string(&p).unwrap();
    let (new, gone) = diff(&added, &removed);
    assert!(new.is_empty(), "{new:?}");
    assert_eq!(
        gone,
        ["# A tighter limit for one network.", "prefix = \"203.0.113.0/24\"", "rate = \"750pps\"", "burst = 50"]
    );
    let (_, back) = ConfigFile::open(&p).unwrap();
    assert_eq!(back, rules);
}

#[test]
fn change_edits_only_what_changed() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    let text = "\
# top
[[rule]]
prefix = '10.0.0.0/8'   # quoted my way
rate = \"1kpps\"          # the rate
burst = 100             # the burst
key_len = 32            # explicit default
";
    fs::write(&p, text).unwrap();
    let (mut f, _) = ConfigFile::open(&p).unwrap();
    let mut r = rule("10.0.0.0/8", Some("2kpps"), Some(100), Some(policer_common::bucket::Action::Monitor));
    f.apply_rules(&[(r.key(), r.clone())].into()).unwrap();
    assert_eq!(
        fs::read_to_string(&p).unwrap(),
        "\
# top
[[rule]]
prefix = '10.0.0.0/8'   # quoted my way
rate = \"2kpps\"          # the rate
burst = 100             # the burst
key_len = 32            # explicit default
action = \"monitor\"
"
    );
    // To a bit rate: rate and burst change together; back to police: the
    // action goes, as a new rule would not have it; the explicit default
    // key length, unchanged, stays.
    r = rule("10.0.0.0/8", Some("8mbit"), None, None);
    f.apply_rules(&[(r.key(), r.clone())].into()).unwrap();
    let now = fs::read_to_string(&p).unwrap();
    assert!(
        now.contains("prefix = '10.0.0.0/8'   # quoted my way\nrate = \"8mbit\"          # the rate\nburst = \""),
        "{now}"
    );
    assert!(now.contains("key_len = 32            # explicit default\n") && !now.contains("action"), "{now}");
    let (_, back) = ConfigFile::open(&p).unwrap();
    assert_eq!(back[&r.key()], r);
}

#[test]
fn removing_a_rule_keeps_the_paragraph_above_it() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    // The first rule carries the file's "One [[rule]] per prefix" paragraph.
    f.apply_rules(&without(rules, "0.0.0.0/0")).unwrap();
    let text = fs::read_to_string(&p).unwrap();
    let (new, gone) = diff(&EXAMPLE, &text);
    assert!(new.is_empty(), "{new:?}");
    assert_eq!(
        gone,
        [
            "# The default rule: every IPv4 source at 10 000 packets/s, bursts of 200,",
            "# all of them together at most 100 000 packets/s.",
            "prefix = \"0.0.0.0/0\"",
        ]
    );
    assert!(text.contains(
        "# its total, the rule's other sources share that total with it.\n\n# Every IPv6 /64 (the default key length for IPv6) likewise.\n[[rule]]\nprefix = \"::/0\""
    ), "{text}");
}

#[test]
fn inline_rules_are_edited_too() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    fs::write(
        &p,
        "rule = [\n  { prefix = \"10.0.0.0/8\", action = \"allow\" },  # lab\n  { prefix = \"0.0.0.0/0\", rate = \"1kpps\" },\n]\n",
    )
    .unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let rules = with(without(rules, "0.0.0.0/0"), rule("192.0.2.0/24", Some("5pps"), Some(5), None));
    f.apply_rules(&rules).unwrap();
    assert_eq!(
        fs::read_to_string(&p).unwrap(),
        "rule = [\n  { prefix = \"10.0.0.0/8\", action = \"allow\" },  # lab\n  \
         { prefix = \"192.0.2.0/24\", rate = \"5pps\", burst = 5 },\n]\n"
    );
    let (_, back) = ConfigFile::open(&p).unwrap();
    assert_eq!(back, rules);
}

#[test]
fn interfaces_keep_their_comment() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let spliced = super::SPLICED.with(|n| n.get());
    f.set_interfaces(&["eth1".into(), "eth2".into()]).unwrap();
    // Only the [daemon] table was parsed and rewritten (`splice.rs`), as
    // the whole-document edit would have written it (checked inside).
    assert_eq!(super::SPLICED.with(|n| n.get()), spliced + 1);
    let text = fs::read_to_string(&p).unwrap();
    assert_eq!(
        diff(&EXAMPLE, &text),
        (vec![r#"interfaces = ["eth1", "eth2"]"#.into()], vec![r#"interfaces = ["eth0"]"#.into()])
    );
    assert_eq!(f.config().daemon.interfaces, ["eth1", "eth2"]);
    // The rules' places moved with it: a rule change after it is in place.
    let mut want = rules.clone();
    let last = want.keys().last().unwrap().clone();
    want.remove(&last);
    f.apply_rules(&want).unwrap();
    assert_eq!(super::SPLICED.with(|n| n.get()), spliced + 2);
    assert_eq!(ConfigFile::open(&p).unwrap().1, want);
}

#[test]
fn new_file_is_0600_and_valid() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("etc/policer/policer.toml");
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    assert!(rules.is_empty());
    f.set_interfaces(&[]).unwrap();
    assert!(!p.exists(), "a change that changes nothing created the file");
    let rules = with(rules, rule("0.0.0.0/0", Some("10kpps"), Some(200), None));
    f.update(super::Change { rules: Some(&rules), interfaces: Some(&["eth0".into()]), chains: None }).unwrap();
    let text = fs::read_to_string(&p).unwrap();
    assert!(text.starts_with("# policer configuration"), "{text}");
    assert!(text.find("[daemon]").unwrap() < text.find("[[rule]]").unwrap(), "{text}");
    assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, NEW_FILE_MODE);
    let (again, back) = ConfigFile::open(&p).unwrap();
    assert_eq!((back, &again.config().daemon.interfaces[..]), (rules, &["eth0".to_string()][..]));
}

#[test]
fn mode_and_owner_are_kept() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    fs::set_permissions(&p, fs::Permissions::from_mode(0o640)).unwrap();
    // Another owner than ours, when we may give one (as root).
    let (uid, gid) = (4242, 4343);
    let chowned = std::os::unix::fs::chown(&p, Some(uid), Some(gid)).is_ok();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    f.apply_rules(&without(rules, "10.0.0.0/8")).unwrap();
    let m = fs::metadata(&p).unwrap();
    assert_eq!(m.mode() & 0o7777, 0o640);
    if chowned {
        assert_eq!((m.uid(), m.gid()), (uid, gid));
    } else {
        eprintln!("skipped the owner check: not allowed to chown (not root)");
    }
    assert!(leftovers(d.path(), &["policer.toml"]).is_empty());
}

#[test]
fn symlinked_config_is_written_through() {
    let d = tempfile::tempdir().unwrap();
    let real_dir = d.path().join("real");
    fs::create_dir(&real_dir).unwrap();
    let real = example_in(&real_dir);
    fs::set_permissions(&real, fs::Permissions::from_mode(0o600)).unwrap();
    // /etc/policer/policer.toml -> ../real/policer.toml, relative like most.
    let etc = d.path().join("etc");
    fs::create_dir(&etc).unwrap();
    let link = etc.join("policer.toml");
    symlink("../real/policer.toml", &link).unwrap();

    let (mut f, rules) = ConfigFile::open(&link).unwrap();
    let rules = without(rules, "198.51.100.0/24");
    f.apply_rules(&rules).unwrap();
    assert!(fs::symlink_metadata(&link).unwrap().file_type().is_symlink(), "the link was replaced");
    assert_eq!(fs::read_link(&link).unwrap(), Path::new("../real/policer.toml"));
    assert_eq!(ConfigFile::open(&real).unwrap().1, rules);
    assert_eq!(fs::metadata(&real).unwrap().mode() & 0o7777, 0o600);
    assert!(leftovers(&etc, &["policer.toml"]).is_empty());
    assert!(leftovers(&real_dir, &["policer.toml"]).is_empty());
}

#[test]
fn hand_edit_not_reloaded_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let edited = EXAMPLE.replace("rate = \"500pps\"", "rate = \"400pps\" # by hand");
    fs::write(&p, &edited).unwrap();
    assert!(f.changed_on_disk().unwrap());

    let e = f.apply_rules(&without(rules.clone(), "10.0.0.0/8")).unwrap_err();
    assert!(matches!(e, Error::ConfigChanged { .. }), "{e:?}");
    assert!(e.is_config_not_written());
    assert!(e.to_string().contains("policer reload"), "{e}");
    assert_eq!(fs::read_to_string(&p).unwrap(), edited, "the hand edit was overwritten");
    assert!(leftovers(d.path(), &["policer.toml"]).is_empty());

    // A file removed by hand is a change too.
    fs::remove_file(&p).unwrap();
    assert!(matches!(f.set_interfaces(&[]), Err(Error::ConfigChanged { .. })));
    assert!(!p.exists());

    // After a reload the edit is what the daemon writes on from.
    fs::write(&p, &edited).unwrap();
    let snap = f.read().unwrap();
    assert_eq!(snap.rules.len(), rules.len());
    let reloaded = snap.rules.clone();
    f.accept(snap);
    f.apply_rules(&without(reloaded, "10.0.0.0/8")).unwrap();
    assert!(fs::read_to_string(&p).unwrap().contains("rate = \"400pps\" # by hand"));
}

#[test]
fn failed_write_leaves_file_and_no_temporary() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let want = without(rules, "10.0.0.0/8");
    for (step, errno, needle) in [
        (Step::Create, libc::EROFS, "creating a temporary file"),
        (Step::Create, libc::EACCES, "creating a temporary file"),
        (Step::Own, libc::EPERM, "giving the new file"),
        (Step::Write, libc::ENOSPC, "writing the temporary file"),
        (Step::Sync, libc::EIO, "syncing"),
        (Step::Rename, libc::EXDEV, "renaming"),
    ] {
        FAULT.with(|c| c.set(Some((step, errno))));
        let e = f.apply_rules(&want).unwrap_err();
        FAULT.with(|c| c.set(None));
        assert!(matches!(e, Error::ConfigWrite { .. }) && e.is_config_not_written(), "{step:?}: {e:?}");
        let msg = e.to_string();
        assert!(msg.contains(needle) && msg.contains("the file was left as it was"), "{step:?}: {msg}");
        assert!(msg.contains(&std::io::Error::from_raw_os_error(errno).to_string()), "{msg}");
        assert_eq!(fs::read_to_string(&p).unwrap(), *EXAMPLE, "{step:?}: the file changed");
        assert_eq!(fs::metadata(&p).unwrap().mode() & 0o7777, 0o600);
        assert!(leftovers(d.path(), &["policer.toml"]).is_empty(), "{step:?}: temporary file left behind");
    }
    // And with the fault gone, the same change goes through.
    f.apply_rules(&want).unwrap();
    assert_eq!(ConfigFile::open(&p).unwrap().1, want);
}

#[test]
fn directory_that_cannot_be_created_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    fs::write(d.path().join("etc"), "a file, not a directory").unwrap();
    let p = d.path().join("etc/policer/policer.toml");
    let e = super::write::stage(&p, b"[daemon]\n").and_then(|s| s.commit()).unwrap_err();
    assert!(matches!(e, Error::ConfigWrite { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("creating the directory") && msg.contains("Not a directory"), "{msg}");
    assert!(leftovers(d.path(), &["etc"]).is_empty());
    assert_eq!(fs::read_to_string(d.path().join("etc")).unwrap(), "a file, not a directory");
}

#[test]
fn temporary_names_are_random_and_never_followed() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    // Two writes stopped just before the rename: their temporary names.
    let mut names = Vec::new();
    for _ in 0..2 {
        let staged = super::write::stage(&p, b"x = 1\n").unwrap();
        names.extend(leftovers(d.path(), &["policer.toml"]));
        drop(staged);
    }
    assert_eq!(names.len(), 2);
    assert_ne!(names[0], names[1], "temporary names repeat");
    assert!(names.iter().all(|n| n.starts_with(".policer.toml.") && n.ends_with(".tmp")), "{names:?}");
    assert!(leftovers(d.path(), &["policer.toml"]).is_empty());

    // The old code's predictable name, planted as a symlink to a file the
    // write must not touch: nothing follows it.
    let victim = d.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    let planted = d.path().join(format!(".policer.toml.tmp-{}", std::process::id()));
    symlink(&victim, &planted).unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    f.apply_rules(&without(rules, "10.0.0.0/8")).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert!(fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
    assert!(!fs::symlink_metadata(&p).unwrap().file_type().is_symlink());
}

#[test]
fn planted_symlink_at_the_temporary_name_is_not_followed() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let victim = d.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    // Plant a symlink at the very name the next write will try first.
    let planted = d.path().join(format!(".policer.toml.{:016x}.tmp", 0x5eed_u64));
    symlink(&victim, &planted).unwrap();
    NEXT_NAME.with(|c| c.set(Some(0x5eed)));
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let want = without(rules, "10.0.0.0/8");
    f.apply_rules(&want).unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n", "the write went through the planted link");
    assert!(fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
    assert_eq!(ConfigFile::open(&p).unwrap().1, want);
    assert!(
        leftovers(d.path(), &["policer.toml", "victim", &planted.file_name().unwrap().to_string_lossy()]).is_empty()
    );
}

#[test]
fn dotted_keys_bare_addresses_and_paragraphs_survive() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    fs::write(
        &p,
        "\
daemon.interfaces = [\"eth0\"] # dotted
daemon.mode = \"skb\"

# para

# own
[[rule]]
prefix = \"10.0.0.0/8\"
action = \"deny\"

# about the rest

# own2
[[rule]]
prefix = \"203.0.113.7\" # bare
rate = \"1kpps\"
",
    )
    .unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    f.set_interfaces(&["eth1".into()]).unwrap();
    let rules = with(without(rules, "10.0.0.0/8"), rule("203.0.113.7", Some("2kpps"), None, None));
    f.apply_rules(&rules).unwrap();
    let burst = rules.values().next().unwrap().burst;
    assert_eq!(
        fs::read_to_string(&p).unwrap(),
        format!(
            "\
daemon.interfaces = [\"eth1\"] # dotted
daemon.mode = \"skb\"

# para

# about the rest

# own2
[[rule]]
prefix = \"203.0.113.7\" # bare
rate = \"2kpps\"
burst = {burst}
"
        )
    );
    // The last rule gone: the paragraphs above it stay at the end.
    f.apply_rules(&BTreeMap::new()).unwrap();
    assert_eq!(
        fs::read_to_string(&p).unwrap(),
        "daemon.interfaces = [\"eth1\"] # dotted\ndaemon.mode = \"skb\"\n\n# para\n\n# about the rest\n"
    );
}

fn class_spec(prefix: &str, set: impl FnOnce(&mut RuleConfig)) -> RuleSpec {
    let mut r = RuleConfig { prefix: prefix.into(), rate: Some("10pps".into()), ..RuleConfig::default() };
    set(&mut r);
    r.validate().unwrap()
}

/// Class rules are written with their class and total, read back as the
/// same rules; two classes of one prefix are two rules, and removing one
/// leaves the other and the prefix's class-less rule as written.
#[test]
fn class_rules_written_and_read_back() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let dns = class_spec("203.0.113.0/24", |r| {
        r.proto = Some("udp".into());
        r.dport = Some(crate::rules::PortValue::Number(53));
    });
    let syn = class_spec("203.0.113.0/24", |r| {
        r.proto = Some("tcp".into());
        r.tcp_flags = Some("syn,!ack".into());
        r.total_rate = Some("5kpps".into());
        r.total_burst = Some(BurstValue::Count(100));
    });
    let game = class_spec("0.0.0.0/0", |r| {
        r.rate = None;
        r.dst = Some("192.0.2.10/32".into());
        r.proto = Some("udp".into());
        r.dport = Some(crate::rules::PortValue::Text("27015-27020".into()));
        r.total_rate = Some("50kpps".into());
    });
    let echo = class_spec("2001:db8::/32", |r| {
        r.proto = Some("icmpv6".into());
        r.icmp_type = Some(128);
    });
    let reflect = class_spec("203.0.113.0/24", |r| {
        r.proto = Some("udp".into());
        r.sport = Some(crate::rules::PortValue::Number(123));
        r.total_rate = Some("4kpps".into());
    });
    let replies = class_spec("2001:db8::/32", |r| {
        r.proto = Some("tcp".into());
        r.sport = Some(crate::rules::PortValue::Text("1024-65535".into()));
        r.dport = Some(crate::rules::PortValue::Number(443));
    });
    let all = with(with(with(with(rules.clone(), dns.clone()), syn.clone()), game.clone()), echo.clone());
    let all = with(with(all, reflect.clone()), replies.clone());
    assert_eq!(all.len(), rules.len() + 6, "two classes of one prefix are two rules");
    f.apply_rules(&all).unwrap();
    let text = fs::read_to_string(&p).unwrap();
    for want in [
        "proto = \"udp\"\ndport = 53\n",
        "proto = \"tcp\"\ntcp_flags = \"syn,!ack\"\n",
        "total_rate = \"5kpps\"\ntotal_burst = 100\n",
        "dport = \"27015-27020\"",
        "dst = \"192.0.2.10/32\"",
        "icmp_type = 128",
        "proto = \"udp\"\nsport = 123\n",
        "proto = \"tcp\"\ndport = 443\nsport = \"1024-65535\"\n",
    ] {
        assert!(text.contains(want), "no '{want}' in:\n{text}");
    }
    let (_, read) = ConfigFile::open(&p).unwrap();
    assert_eq!(read, all, "read back differs:\n{text}");

    // Remove the DNS class: the SYN class and the class-less rule of the
    // same prefix stay.
    let mut fewer = all.clone();
    fewer.remove(&dns.key()).unwrap();
    f.apply_rules(&fewer).unwrap();
    let after = fs::read_to_string(&p).unwrap();
    assert!(!after.contains("dport = 53"), "{after}");
    assert!(after.contains("tcp_flags = \"syn,!ack\""), "{after}");
    assert!(after.contains("prefix = \"203.0.113.0/24\"\nrate = \"500pps\""), "{after}");
    let (_, read) = ConfigFile::open(&p).unwrap();
    assert_eq!(read, fewer);

    // A changed total is written in place.
    let mut syn2 = syn.clone();
    syn2.set_total(Some((policer_common::rate::Rate::parse("6kpps").unwrap(), 100)));
    f.apply_rules(&with(fewer, syn2)).unwrap();
    let changed = fs::read_to_string(&p).unwrap();
    assert_eq!(diff(&after, &changed), (vec!["total_rate = \"6kpps\"".into()], vec!["total_rate = \"5kpps\"".into()]));
}

/// `policer check` (and a reload) refuse what `rule set` refuses: bad class
/// fields, tying classes, a rule twice.
#[test]
fn class_problems_in_a_file() {
    // Each at the line of the key it is about.
    let bad = [
        ("proto = \"tpc\"", "tpc", 4),
        ("proto = \"udp\"\ndport = \"90-80\"", "below LOW", 5),
        ("dport = 53", "dport", 4),
        ("proto = \"udp\"\ntcp_flags = \"syn\"", "tcp_flags needs proto tcp", 5),
        ("proto = \"udp\"\nicmp_type = 8", "icmp_type", 5),
        ("total_burst = 10", "total_burst needs total_rate", 4),
    ];
    for (fields, want, line) in bad {
        let text = format!("[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\n{fields}\n");
        let problems = super::Config::check(&text, None).err().unwrap_or_else(|| panic!("accepted:\n{text}"));
        assert!(problems.iter().any(|p| p.message.contains(want) && p.line == Some(line)), "{text}: {problems:?}");
        assert_eq!(problems.len(), 1, "{problems:?}");
    }
    // Two classes that tie: neither more specific, one frame matches both.
    let tie = "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = \"50-60\"\n\n\
               [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = \"55-65\"\n";
    let problems = super::Config::check(tie, None).unwrap_err();
    assert!(problems.iter().any(|p| p.message.contains("tie")), "{problems:?}");
    // The same rule twice.
    let twice = "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = 53\n\n\
                 [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"2kpps\"\nproto = \"udp\"\ndport = \"53\"\n";
    let problems = super::Config::check(twice, None).unwrap_err();
    assert!(problems.iter().any(|p| p.message.contains("twice")), "{problems:?}");
    // Nested ranges do not tie (the narrower wins), nor do classes of two
    // prefixes.
    let fine = "[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = \"50-60\"\n\n\
                [[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = 53\n\n\
                [[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\nproto = \"udp\"\ndport = \"55-65\"\n";
    let (_, rules) = super::Config::check(fine, None).unwrap();
    assert_eq!(rules.len(), 3);
}

/// Class rules in a file: read back as written, identified by prefix and
/// class; rules that tie are a problem of the file, as `rule set` says.
#[test]
fn class_rules_read_write_and_ties() {
    let text = r#"
[[rule]]
prefix = "0.0.0.0/0"
rate = "1kpps"

[[rule]]
prefix = "0.0.0.0/0"
proto = "udp"
dport = 53
rate = "10pps"
burst = 20

[[rule]]
prefix = "0.0.0.0/0"
proto = "tcp"
tcp_flags = "syn,!ack"
rate = "5pps"

[[rule]]
prefix = "192.0.2.0/24"
dst = "198.51.100.10"
proto = "udp"
dport = "27015"
total_rate = "50kpps"
"#;
    let (_, rules) = super::Config::parse(text, Path::new("t.toml")).unwrap();
    assert_eq!(rules.len(), 4);
    let dns = rules.values().find(|s| s.class().dport == Some((53, 53))).unwrap();
    assert_eq!((dns.class().proto, dns.burst), (Some(17), 20));
    let game = rules.values().find(|s| s.total().is_some()).unwrap();
    assert_eq!((game.rate, game.class().to_string()), (None, "udp dport 27015 dst 198.51.100.10/32".to_string()));
    // Back to text and read again: the same rules.
    for s in rules.values() {
        let back = s.config().validate().unwrap();
        assert_eq!(&back, s, "{}", s.key());
    }
    let tie = format!(
        "{text}\n[[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\ndport = \"50-59\"\nrate = \"1pps\"\n\n\
         [[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\ndport = \"55-64\"\nrate = \"1pps\"\n"
    );
    let e = super::Config::parse(&tie, Path::new("t.toml")).unwrap_err().to_string();
    assert!(e.contains("tie"), "{e}");
    let bad = format!("{text}\n[[rule]]\nprefix = \"10.0.0.0/8\"\ntotal_burst = 5\nrate = \"1pps\"\n");
    let e = super::Config::parse(&bad, Path::new("t.toml")).unwrap_err().to_string();
    assert!(e.contains("rule 5 (prefix 10.0.0.0/8): total_burst needs total_rate"), "{e}");
}

/// A config that is not a regular file is refused at once, named, without
/// blocking (a FIFO) or reading without end (a link to /dev/zero); a hand
/// edit check before a write says the same.
#[test]
fn a_config_that_is_not_a_regular_file_is_refused_at_once() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let t = std::time::Instant::now();
    let e = ConfigFile::open(&p).unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(e.to_string(), format!("{} is a FIFO, not a regular file", p.display()));
    fs::remove_file(&p).unwrap();
    symlink("/dev/zero", &p).unwrap();
    let e = ConfigFile::open(&p).unwrap_err().to_string();
    assert_eq!(e, format!("{} is a character device, not a regular file", p.display()));

    // A file in force, then replaced by a FIFO: a write is refused at once.
    fs::remove_file(&p).unwrap();
    let p = example_in(d.path());
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    fs::remove_file(&p).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let e = f.apply_rules(&without(rules, "10.0.0.0/8")).unwrap_err();
    assert!(e.is_config_not_written() && e.to_string().contains("is a FIFO, not a regular file"), "{e}");
    assert!(f.read().unwrap_err().to_string().contains("is a FIFO"));
}

/// The temporaries of a config write killed midway go at the next start;
/// other files beside it stay.
#[test]
fn leftovers_of_killed_writes_are_removed() {
    let d = tempfile::tempdir().unwrap();
    let p = example_in(d.path());
    for n in [".policer.toml.0123456789abcdef.tmp", ".other.toml.0123456789abcdef.tmp", ".policer.toml.tmp"] {
        fs::write(d.path().join(n), "cut short").unwrap();
    }
    let (removed, failed) = super::remove_leftovers(&p);
    assert!(failed.is_empty());
    assert_eq!(removed, vec![d.path().join(".policer.toml.0123456789abcdef.tmp")]);
    let mut left = leftovers(d.path(), &["policer.toml"]);
    left.sort();
    assert_eq!(left, [".other.toml.0123456789abcdef.tmp", ".policer.toml.tmp"]);
}

/// An IPv4-mapped prefix in the file is the IPv4 rule, and a change of
/// another rule keeps it as written.
#[test]
fn an_ipv4_mapped_prefix_is_the_ipv4_rule() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    let text = "[[rule]]\nprefix = \"::ffff:10.0.0.0/104\"\nrate = \"1kpps\"\n\n[[rule]]\nprefix = \"192.0.2.0/24\"\naction = \"deny\"\n";
    fs::write(&p, text).unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let keys: Vec<String> = rules.keys().map(|k| k.net.to_string()).collect();
    assert_eq!(keys, ["10.0.0.0/8", "192.0.2.0/24"]);
    f.apply_rules(&without(rules, "192.0.2.0/24")).unwrap();
    let now = fs::read_to_string(&p).unwrap();
    assert!(now.contains("::ffff:10.0.0.0/104") && !now.contains("192.0.2.0/24"), "{now}");
}

/// A config saved with a UTF-8 byte order mark reads, and a change
/// writes it (without the mark: TOML is UTF-8 by definition).
#[test]
fn a_byte_order_mark_is_fine() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    fs::write(&p, format!("\u{feff}{}", *EXAMPLE)).unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    f.apply_rules(&without(rules.clone(), "10.0.0.0/8")).unwrap();
    let (_, now) = ConfigFile::open(&p).unwrap();
    assert_eq!(now, without(rules, "10.0.0.0/8"));
    assert!(!fs::read_to_string(&p).unwrap().contains('\u{feff}'));
}

/// `protect` in [daemon]: a rule that could drop inside a protected prefix
/// is a problem of its `[[rule]]` (at its line), a bad entry one of its own;
/// a deny covering it is fine.
#[test]
fn protected_prefixes_in_a_file() {
    let text = "[daemon]\nprotect = [\"192.0.2.0/24\", \"2001:db8::/32\"]\n\n\
                [[rule]]\nprefix = \"0.0.0.0/0\"\naction = \"deny\"\n\n\
                [[rule]]\nprefix = \"192.0.2.10\"\naction = \"deny\"\n\n\
                [[rule]]\nprefix = \"192.0.2.0/25\"\naction = \"allow\"\n";
    let problems = super::Config::check(text, None).unwrap_err();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].line, Some(8), "{problems:?}");
    assert!(problems[0].message.contains("192.0.2.10/32 is inside the protected prefix 192.0.2.0/24"), "{problems:?}");
    let bad = "[daemon]\nprotect = [\"192.0.2.300/24\"]\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\n";
    let problems = super::Config::check(bad, None).unwrap_err();
    assert!(problems[0].message.starts_with("daemon: protect: "), "{problems:?}");
    assert!(problems[0].message.contains("\"192.0.2.300/24\" is not one"), "{problems:?}");
    assert_eq!(problems[0].line, Some(2), "{problems:?}");
    let fine = text.replace("[[rule]]\nprefix = \"192.0.2.10\"\naction = \"deny\"\n\n", "");
    let (cfg, rules) = super::Config::check(&fine, None).unwrap();
    assert_eq!((cfg.daemon.protect.len(), rules.len()), (2, 2));
}

/// Every kind of key, given a value of the wrong kind or an invalid one:
/// the problem names the rule, its prefix and the key, shows the value as
/// written, gives a valid example, sits on the key's line, and names no
/// Rust type.
#[test]
fn bad_values_name_the_key_and_an_example() {
    let rule = |body: &str| format!("[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\n{body}\n");
    let cases: Vec<(String, usize, &str)> = vec![
        (
            rule("burst = \"abc\""),
            4,
            r#"rule 1 (prefix 10.0.0.0/8): burst: "abc" is not a burst; write a count like burst = 50"#,
        ),
        (rule("burst = -3"), 4, "burst: -3 is not a burst; write a count like burst = 50"),
        (rule("burst = 1.5"), 4, "burst: 1.5 is not a burst"),
        (rule("key_len = \"24\""), 4, r#"key_len: "24" is not a key length; write key_len = 32"#),
        (rule("key_len = -1"), 4, "key_len: -1 is not a key length"),
        (rule("action = \"drop\""), 4, r#"action: "drop" is not an action; write action = "police""#),
        (rule("icmp_type = 300"), 4, "icmp_type: 300 is not an ICMP type; write icmp_type = 8"),
        (rule("proto = 17"), 4, r#"proto: 17 is not a protocol; write proto = "udp""#),
        (rule("dport = 70000"), 4, "dport: 70000 is not a port; write dport = 53"),
        (rule("dport = true"), 4, "dport: true is not a port"),
        (rule("sport = 70000"), 4, "sport: 70000 is not a port; write sport = 53"),
        (rule("sport = [53]"), 4, "sport: a list is not a port"),
        (rule("tcp_flags = [\"syn\"]"), 4, "tcp_flags: a list is not a set of TCP flags"),
        (rule("dst = 1"), 4, "dst: 1 is not a destination prefix"),
        (rule("total_rate = \"lots\""), 4, r#"total_rate: "lots" is not a rate; write total_rate = "10kpps""#),
        (rule("total_rate = \"1kpps\"\ntotal_burst = {}"), 5, "total_burst: a table is not a burst"),
        (rule("ban_for = 10"), 4, r#"ban_for: 10 is not a duration; write ban_for = "10m""#),
        (rule("ban_for = \"1m\"\nban_max = \"forever\""), 5, r#"ban_max: "forever" is not a duration"#),
        (
            rule("ban_for = \"1m\"\nban_after = 0"),
            5,
            "ban_after: 0 is not a number of refused frames; write ban_after = 10",
        ),
        (
            rule("expires = 2026-11-25T01:02:03Z"),
            4,
            r#"expires: 2026-11-25T01:02:03Z is not a time; write expires = "2026-11-25T01:02:03Z" (UTC, quoted)"#,
        ),
        (rule("expires = \"tomorrow\""), 4, r#"expires: "tomorrow" is not a time"#),
        (rule("ban = \"yes\""), 4, r#"ban: "yes" is not true or false"#),
        (rule("reason = 5"), 4, "reason: 5 is not a reason"),
        (
            rule("colour = \"red\""),
            4,
            "rule 1 (prefix 10.0.0.0/8): unknown key `colour`; a rule's keys are prefix, rate",
        ),
        (
            "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = 1000\n".into(),
            3,
            "rate: 1000 is not a rate; write rate = \"10kpps\"",
        ),
        (
            "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"8mbit\"\nburst = \"12 apples\"\n".into(),
            4,
            r#"burst: "12 apples" is not a burst; write a size like burst = "64kb""#,
        ),
        (
            "[[rule]]\nprefix = [\"10.0.0.0/8\"]\n".into(),
            2,
            "rule 1: prefix: a list is not a prefix; write prefix = \"10.0.0.0/8\"",
        ),
        (
            "[[rule]]\nprefix = \"10.0.0.300/8\"\n".into(),
            2,
            "rule 1 (prefix 10.0.0.300/8): prefix: '10.0.0.300' in '10.0.0.300/8' is not an IP address; write prefix",
        ),
        (
            "[[rule]]\nrate = \"1kpps\"\n".into(),
            1,
            "rule 1: prefix: a rule needs a prefix; write prefix = \"10.0.0.0/8\"",
        ),
        (
            "[daemon]\ninterfaces = \"eth0\"\n".into(),
            2,
            r#"daemon.interfaces: "eth0" is not a list of interface names; write interfaces = ["eth0", "eth1"]"#,
        ),
        ("[daemon]\nmode = \"fast\"\n".into(), 2, r#"daemon.mode: "fast" is not a mode; write mode = "auto""#),
        (
            "[daemon]\nmax_sources = \"1M\"\n".into(),
            2,
            r#"daemon.max_sources: "1M" is not a number of sources; write max_sources = 1048576"#,
        ),
        ("[daemon]\nmax_rules = -5\n".into(), 2, "daemon.max_rules: -5 is not a number of rules; write max_rules = "),
        ("[daemon]\nspeed = 1\n".into(), 2, "daemon: unknown key `speed`"),
        ("daemon = 3\n".into(), 1, "daemon: 3 is not a table"),
        (
            "rules = []\n".into(),
            1,
            "unknown key `rules`: the file holds a [daemon] table, [[rule]], [[set]] and [[chain]] tables",
        ),
    ];
    for (text, line, want) in &cases {
        let problems = super::Config::check(text, None).err().unwrap_or_else(|| panic!("accepted:\n{text}"));
        let p = problems
            .iter()
            .find(|p| p.message.contains(want))
            .unwrap_or_else(|| panic!("{text}\nwant {want:?} in {problems:?}"));
        assert_eq!(p.line, Some(*line), "{text}: {p:?}");
        for p in &problems {
            for rust in ["u32", "u64", "enum", "BurstValue", "PortValue", "invalid type", "variant", "expected"] {
                assert!(!p.message.contains(rust), "{text}: a Rust type in {p:?}");
            }
        }
        // The daemon's reload says the first problem, with its line.
        let e = super::Config::parse(text, Path::new("t.toml")).unwrap_err().to_string();
        assert!(e.starts_with(&format!("t.toml: line {}: ", problems[0].line.unwrap())), "{e}");
    }
}

/// `policer check` reports every problem of a file in one run: syntax
/// errors, values of the wrong kind and rules that do not hold together,
/// each on its line, in the file's order.
#[test]
fn every_problem_in_one_run() {
    let text = "\
[daemon]
mode = \"turbo\"

[[rule]]
prefix = \"0.0.0.0/0\"
rate = 1kpps

[[rule]]
prefix = \"10.0.0.0/8\"
burst = \"abc\"
rate = \"1kpps\"

[[rule]]
prefix = \"10.0.0.1/8\"
rate = \"1kpps\"

[[rule]]
prefix = \"192.0.2.0/24\"
rate = \"1kpps\"
key_len = \"24\"
action = \"drop\"

[[rule]]
prefix = \"198.51.100.0/24\"
total_burst = 5
action = \"deny\"
";
    let problems = super::Config::check(text, None).unwrap_err();
    let got: Vec<(Option<usize>, &str)> = problems.iter().map(|p| (p.line, p.message.as_str())).collect();
    let want: [(usize, &str); 7] = [
        (2, "daemon.mode: \"turbo\""),
        (6, "not valid TOML"),
        (10, "rule 2 (prefix 10.0.0.0/8): burst: \"abc\" is not a burst"),
        (14, "rule 3 (prefix 10.0.0.1/8): prefix: '10.0.0.1/8' has host bits set; did you mean 10.0.0.0/8?"),
        (20, "rule 4 (prefix 192.0.2.0/24): key_len: \"24\""),
        (21, "rule 4 (prefix 192.0.2.0/24): action: \"drop\""),
        (25, "rule 5 (prefix 198.51.100.0/24): total_burst needs total_rate"),
    ];
    for (line, msg) in want {
        assert!(got.iter().any(|(l, m)| *l == Some(line) && m.contains(msg)), "want {line}: {msg:?} in {got:#?}");
    }
    assert!(got.windows(2).all(|w| w[0].0 <= w[1].0), "not in the file's order: {got:#?}");
}

/// Issue 43, point 15: every problem of every rule, not a rule's first:
/// the values of its keys and what its keys say together, each at the line
/// of its key (a key that is missing: at the rule's), in the file's order;
/// nothing twice, and nothing that only follows from another problem (no
/// "a burst needs a rate" after a rate that is not one, nothing of
/// `ban_for` after an action that is not one). The daemon's error on such
/// a file counts them all.
#[test]
fn every_problem_of_every_rule() {
    let text = "\
[[rule]]
prefix = \"10.0.0.1/8\"
rate = \"fast\"
colour = \"red\"

[[rule]]
prefix = \"10.1.0.0/16\"
rate = \"1kpps\"
proto = \"foo\"
tcp_flags = \"xyz\"
dport = \"9000-8000\"
key_len = 8
ban_for = \"1h\"
ban_max = \"1m\"

[[rule]]
prefix = \"10.3.0.1/16\"
proto = \"bogus\"
rate = \"1kpps\"

[[rule]]
prefix = \"10.2.0.0/16\"
rate = \"fast\"
burst = 10
ban_for = \"1m\"
total_burst = 5

[[rule]]
prefix = \"10.4.0.0/16\"
action = \"dney\"
ban_for = \"1m\"
reason = \"why\"

[[rule]]
prefix = \"10.5.0.0/16\"
burst = 10
ban_after = 3
proto = \"udp\"
icmp_type = 8
dst = \"2001:db8::/32\"

[[rule]]
prefix = \"10.2.0.0/16\"
rate = \"2kpps\"
";
    let problems = super::Config::check(text, None).unwrap_err();
    let got: Vec<(usize, &str)> = problems.iter().map(|p| (p.line.unwrap_or(0), p.message.as_str())).collect();
    let want: &[(usize, &str)] = &[
        (2, "rule 1 (prefix 10.0.0.1/8): prefix: '10.0.0.1/8' has host bits set"),
        (3, "rule 1 (prefix 10.0.0.1/8): rate: \"fast\" is not a rate"),
        (4, "rule 1 (prefix 10.0.0.1/8): unknown key `colour`"),
        (9, "rule 2 (prefix 10.1.0.0/16): proto 'foo': unknown protocol"),
        (10, "rule 2 (prefix 10.1.0.0/16): tcp_flags 'xyz': unknown flag 'xyz'"),
        (11, "rule 2 (prefix 10.1.0.0/16): dport '9000-8000': HIGH (8000) is below LOW (9000)"),
        (12, "rule 2 (prefix 10.1.0.0/16): key_len: key length 8 is shorter than the prefix 10.1.0.0/16"),
        (14, "rule 2 (prefix 10.1.0.0/16): ban_max (1m) is shorter than ban_for (1h)"),
        (17, "rule 3 (prefix 10.3.0.1/16): prefix: '10.3.0.1/16' has host bits set"),
        (18, "rule 3 (prefix 10.3.0.1/16): proto 'bogus': unknown protocol"),
        (23, "rule 4 (prefix 10.2.0.0/16): rate: \"fast\" is not a rate"),
        (26, "rule 4 (prefix 10.2.0.0/16): total_burst needs total_rate"),
        (30, "rule 5 (prefix 10.4.0.0/16): action: \"dney\" is not an action"),
        (32, "rule 5 (prefix 10.4.0.0/16): reason: a reason belongs to a ban"),
        (34, "rule 6 (prefix 10.5.0.0/16): rate: a police rule needs a rate (rate), a total (total_rate), or both"),
        (37, "rule 6 (prefix 10.5.0.0/16): ban_after and ban_max need ban_for (and so does ban_within)"),
        (39, "rule 6 (prefix 10.5.0.0/16): icmp_type needs proto icmp"),
        (40, "rule 6 (prefix 10.5.0.0/16): dst 2001:db8::/32: an IPv6 destination for an IPv4 source prefix"),
        (42, "rule 7 (prefix 10.2.0.0/16): prefix 10.2.0.0/16 appears twice"),
    ];
    let shown = || got.iter().map(|(l, m)| format!("{l}: {m}\n")).collect::<String>();
    for (i, (line, start)) in want.iter().enumerate() {
        let (l, m) = got.get(i).unwrap_or_else(|| panic!("want {line}: {start:?}, got:\n{}", shown()));
        assert!(l == line && m.starts_with(start), "{i}: want {line}: {start:?}, got:\n{}", shown());
    }
    assert_eq!(got.len(), want.len(), "more than wanted:\n{}", shown());
    // The daemon's refusal: the first, and how many more.
    let e = super::Config::parse(text, Path::new("t.toml")).unwrap_err().to_string();
    assert!(e.starts_with("t.toml: line 2: rule 1 (prefix 10.0.0.1/8): prefix: '10.0.0.1/8'"), "{e}");
    assert!(
        e.ends_with(&format!("(and {} more problems: `policer check --config FILE` lists them all)", want.len() - 1)),
        "{e}"
    );
}

/// A `[[set]]` of a MaxMind DB file: `mmdb` with `country` and/or `asn`
/// (codes taken upper case, AS numbers as numbers or `AS…`), read key by
/// key; `file` and `mmdb` together, `mmdb` alone, and `country` without
/// `mmdb` are each a problem naming the set and the key.
#[test]
fn set_tables_of_a_database() {
    let good = "[[set]]\nname = \"geo\"\nmmdb = \"GeoLite2-Country.mmdb\"\ncountry = [\"de\", \"FR\"]\nasn = [64500, \"AS64501\"]\naction = \"deny\"\n";
    let (cfg, _) = super::Config::check(good, None).unwrap();
    let s = &cfg.sets[0];
    assert_eq!((s.mmdb.as_deref(), s.file.as_str()), (Some("GeoLite2-Country.mmdb"), ""));
    assert_eq!((s.country.clone(), s.asn.clone()), (vec!["DE".to_string(), "FR".to_string()], vec![64500, 64501]));
    assert_eq!(s.path(Path::new("/etc/policer/policer.toml")), Path::new("/etc/policer/GeoLite2-Country.mmdb"));
    for (text, line, msg) in [
        (
            "[[set]]\nname = \"a\"\nfile = \"a.txt\"\nmmdb = \"a.mmdb\"\ncountry = [\"DE\"]\n",
            1,
            "set 1 (name a): mmdb: a set reads a list file or an MMDB database, not both",
        ),
        ("[[set]]\nname = \"a\"\nmmdb = \"a.mmdb\"\n", 1, "set 1 (name a): mmdb: an MMDB set needs country or asn"),
        (
            "[[set]]\nname = \"a\"\nfile = \"a.txt\"\nasn = [1]\n",
            1,
            "set 1 (name a): file: country and asn pick networks of an MMDB database",
        ),
        (
            "[[set]]\nname = \"a\"\nmmdb = \"a.mmdb\"\ncountry = [\"DEU\"]\n",
            4,
            "set 1 (name a): country: \"DEU\" is not a country code (two letters)",
        ),
        (
            "[[set]]\nname = \"a\"\nmmdb = \"a.mmdb\"\nasn = [\"ASx\"]\n",
            4,
            "set 1 (name a): asn: \"ASx\" is not an AS number",
        ),
        ("[[set]]\nname = \"a\"\nmmdb = 3\ncountry = [\"DE\"]\n", 3, "set 1 (name a): mmdb: 3 is not a file"),
    ] {
        let problems = super::Config::check(text, None).unwrap_err();
        assert!(
            problems.iter().any(|p| p.line == Some(line) && p.message.starts_with(msg)),
            "{text}: want {line}: {msg:?} in {problems:#?}"
        );
    }
}

/// `[[set]]` tables are read key by key: each problem names the set, the
/// key, an example, and the line; a good one reads as what it says.
#[test]
fn set_tables_read_key_by_key() {
    let good = "[[set]]\nname = \"feed\"\nfile = \"feed.txt\"\naction = \"police\"\nrate = \"10kpps\"\nburst = 50\nkey_len = 24\n";
    let (cfg, _) = super::Config::check(good, None).unwrap();
    let s = &cfg.sets[0];
    assert_eq!(
        (s.name.as_str(), s.file.as_str(), s.rate.as_deref(), s.key_len),
        ("feed", "feed.txt", Some("10kpps"), Some(24))
    );
    assert_eq!(s.path(Path::new("/etc/policer/policer.toml")), Path::new("/etc/policer/feed.txt"));
    assert_eq!(s.path(Path::new("policer.toml")), Path::new("feed.txt"));
    let text = "\
[[set]]
name = \"feed\"
file = \"feed.txt\"
action = \"drop\"

[[set]]
name = \".bad\"
file = \"x.txt\"

[[set]]
file = 7
rate = \"fast\"
colour = 1

[[set]]
name = \"slow\"
file = \"slow.txt\"
action = \"police\"

[[set]]
name = \"slow\"
file = \"again.txt\"
action = \"deny\"

[[set]]
name = \"nofile\"
";
    let problems = super::Config::check(text, None).unwrap_err();
    let got: Vec<(Option<usize>, &str)> = problems.iter().map(|p| (p.line, p.message.as_str())).collect();
    let want: [(usize, &str); 8] = [
        (4, "set 1 (name feed): action: \"drop\" is not an action; write action = \"police\""),
        (7, "set 2 (name .bad): name: set name '.bad'"),
        (10, "set 3: name: a set needs a name; write name = \"blocklist\""),
        (11, "set 3: file: 7 is not a file; write file = \"blocklist.txt\""),
        (12, "set 3: rate: \"fast\" is not a rate; write rate = \"10kpps\""),
        (
            13,
            "set 3: unknown key `colour`; a set's keys are name, file, mmdb, country, asn, action, rate, burst, key_len",
        ),
        (15, "set 4 (name slow): a police set needs a rate per source"),
        (25, "set 6 (name nofile): file: a set needs a list file; write file = \"blocklist.txt\""),
    ];
    for (line, msg) in want {
        assert!(got.iter().any(|(l, m)| *l == Some(line) && m.contains(msg)), "want {line}: {msg:?} in {got:#?}");
    }
    assert!(
        got.iter().any(|(l, m)| *l == Some(20) && m.contains("set 5 (name slow): the name of set 4 too")),
        "{got:#?}"
    );
    // The start and a reload refuse it, naming the first problem.
    let e = super::Config::parse(text, Path::new("t.toml")).unwrap_err().to_string();
    assert!(e.contains("t.toml: line 4: set 1 (name feed): action"), "{e}");
}

/// `policer check` reads each set's file: a bad line is FILE:LINE, and so
/// is an entry that is a rule's prefix or inside a protected prefix; an
/// empty list and a missing file are named.
#[test]
fn check_reads_set_files() {
    let d = tempfile::tempdir().unwrap();
    let cfg = d.path().join("policer.toml");
    let list = d.path().join("feed.txt");
    let head = "[daemon]\nprotect = [\"192.0.2.0/24\"]\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\n\n\
                [[rule]]\nprefix = \"203.0.113.0/24\"\nrate = \"5kpps\"\n\n";
    let text = format!("{head}[[set]]\nname = \"feed\"\nfile = \"feed.txt\"\naction = \"deny\"\n");
    let check = |body: &str| {
        fs::write(&list, body).unwrap();
        super::Config::check_at(&text, None, Some(&cfg))
    };
    let (c, _) = check("198.51.100.1\n# comment\n198.51.100.0/30 ; SBL1\n").unwrap();
    assert_eq!(c.sets.len(), 1);
    let one = |body: &str| {
        let p = check(body).unwrap_err();
        assert_eq!(p.len(), 1, "{p:#?}");
        assert_eq!(p[0].line, Some(12), "{p:#?}");
        p[0].message.clone()
    };
    let f = list.display().to_string();
    let m = one("198.51.100.1\n198.51.100.300\n");
    assert!(m.starts_with("set 1 (name feed): ") && m.contains(&format!("{f}:2: ")), "{m}");
    let m = one("198.51.100.1\n\n203.0.113.0/24\n");
    assert!(m.contains(&format!("{f}:3: 203.0.113.0/24 is the prefix of the rule")), "{m}");
    let m = one("192.0.2.7\n");
    assert!(m.contains(&format!("{f}:1: ")) && m.contains("protect"), "{m}");
    let m = one("# nothing\n");
    assert!(m.contains("has no entries") && m.contains("remove the [[set]] table"), "{m}");
    fs::remove_file(&list).unwrap();
    let p = super::Config::check_at(&text, None, Some(&cfg)).unwrap_err();
    assert!(p[0].message.contains(&format!("its file {f}: ")), "{p:#?}");
    // Without a path (parse, as the start and reload do first), the files
    // are not read.
    assert!(super::Config::check(&text, None).is_ok());
}

/// Lines by binary search: the same answers as counting newlines.
#[test]
fn lines_are_found_as_counted() {
    let text = "a\nbb\n\nccc\u{e9}\nd";
    let lines = super::read::Lines::of(text);
    for at in 0..=text.len() + 2 {
        let counted = text.as_bytes()[..at.min(text.len())].iter().filter(|&&b| b == b'\n').count() + 1;
        assert_eq!(lines.at(at), counted, "byte {at}");
    }
}

/// A file laid out as operators lay them out (a preamble, `[daemon]`
/// between rules, comment paragraphs, comments above and beside keys,
/// classes, bans, byte mode, a `[[set]]` between rules), changed a few
/// rules at a time hundreds of times: each change is made only where its
/// rules are (`splice.rs`), gives the bytes the whole-document edit
/// gives (checked inside, `file.rs`), and the file says what is wanted.
#[test]
fn changes_of_a_few_rules_edit_only_their_text_and_match_the_whole_document_edit() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    let text = "\
# preamble
# of the file

[[rule]]
prefix = \"0.0.0.0/0\"   # everyone
rate = \"10kpps\"
burst = 200

# About the next one.

# Its own comment.
[[rule]]
prefix = \"203.0.113.0/24\"
rate = \"500pps\"  # tight
# between keys
burst = 50
# trailing, after its last key

[daemon]
interfaces = [\"eth0\"]

[[rule]]
prefix = \"198.18.0.0/15\"
rate = \"100mbit\"
burst = \"64kb\"
key_len = 24

[[set]]
name = \"blocklist\"
file = \"blocklist.txt\"
action = \"deny\"

# A paragraph.

[[rule]]
prefix = \"192.0.2.0/24\"
proto = \"udp\"
dport = 53
rate = \"1kpps\"
[[rule]]
prefix = \"2001:db8::/32\"
action = \"deny\"
[[rule]]
prefix = \"198.51.100.7\"
ban = true
reason = \"scanner\"
expires = \"2099-01-01T00:00:00Z\"
# the end
";
    fs::write(&p, text).unwrap();
    let (mut f, mut want) = ConfigFile::open(&p).unwrap();
    let (spliced0, mut changes) = (super::SPLICED.with(|n| n.get()), 0);
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((seed >> 33) as usize) % n.max(1)
    };
    let mut added = 0u32;
    for _ in 0..300 {
        let before = want.clone();
        let keys: Vec<RuleKey> = want.keys().cloned().collect();
        let mut edits: Vec<(RuleKey, Option<RuleSpec>)> = Vec::new();
        for _ in 0..1 + next(3) {
            let e = match next(4) {
                // A new rule (a few kinds).
                0 | 1 if want.len() < 40 => {
                    added += 1;
                    let a = format!("10.{}.{}.0/24", added / 250, added % 250);
                    let s = match next(3) {
                        0 => rule(&a, Some("700pps"), Some(30), None),
                        1 => rule(&a, None, None, Some(policer_common::bucket::Action::Deny)),
                        _ => RuleConfig { prefix: a, rate: Some("1mbit".into()), ..Default::default() }
                            .validate()
                            .unwrap(),
                    };
                    (s.key(), Some(s))
                }
                // A rule removed.
                2 if keys.len() > 2 => {
                    let k = keys[1 + next(keys.len() - 1)].clone();
                    (k, None)
                }
                // A rule changed: its rate, or its action.
                _ => {
                    let k = keys[next(keys.len())].clone();
                    let old = &want[&k];
                    if old.ban().is_some() {
                        continue;
                    }
                    let mut c = old.config();
                    match next(2) {
                        0 if old.rate.is_some_and(|r| !r.is_bytes()) => {
                            c.rate = Some(format!("{}pps", 100 + next(900)));
                        }
                        _ => {
                            c.action = Some(if old.action == policer_common::bucket::Action::Monitor {
                                policer_common::bucket::Action::Police
                            } else {
                                policer_common::bucket::Action::Monitor
                            });
                            if c.rate.is_none() {
                                c.rate = Some("2kpps".into());
                            }
                        }
                    }
                    (k, Some(c.validate().unwrap()))
                }
            };
            if edits.iter().all(|(k, _)| *k != e.0) {
                edits.push(e);
            }
        }
        for (k, v) in &edits {
            match v {
                Some(s) => want.insert(k.clone(), s.clone()),
                None => want.remove(k),
            };
        }
        let pending = f.stage_rules(&before, &edits).unwrap();
        f.commit(pending).unwrap();
        changes += 1;
        let on_disk = fs::read_to_string(&p).unwrap();
        let (_, read) = super::Config::parse(&on_disk, &p).unwrap();
        assert_eq!(read, want, "after {changes} changes the file says otherwise:\n{on_disk}");
    }
    let spliced = super::SPLICED.with(|n| n.get()) - spliced0;
    // The first table and a change next to another go the whole way.
    assert!(spliced * 10 >= changes * 9, "only {spliced} of {changes} changes were made in place");
    let last = fs::read_to_string(&p).unwrap();
    assert!(last.starts_with("# preamble\n# of the file\n"), "{last}");
    assert!(
        last.contains("[daemon]\ninterfaces = [\"eth0\"]") && last.contains("[[set]]\nname = \"blocklist\""),
        "{last}"
    );
}

/// A file without `[daemon]` (as a config of rules alone is written) gets
/// one after its last table when the start names interfaces: only that
/// table is written (`splice.rs`), where the whole-document edit puts it
/// (checked inside), before the comments that end the file.
#[test]
fn interfaces_go_into_a_new_daemon_table_after_the_last_one() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    fs::write(&p, "# mine\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\n\n[[rule]]\nprefix = \"10.0.0.0/8\"\naction = \"deny\"\n\n# the end\n").unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    let spliced = super::SPLICED.with(|n| n.get());
    f.set_interfaces(&["eth0".into()]).unwrap();
    assert_eq!(super::SPLICED.with(|n| n.get()), spliced + 1);
    let text = fs::read_to_string(&p).unwrap();
    assert!(text.ends_with("action = \"deny\"\n\n[daemon]\ninterfaces = [\"eth0\"]\n\n# the end\n"), "{text}");
    let (again, read) = ConfigFile::open(&p).unwrap();
    assert_eq!((again.config().daemon.interfaces.clone(), read), (vec!["eth0".to_string()], rules.clone()));
    // A rule change after it still finds its rules.
    f.apply_rules(&without(rules.clone(), "10.0.0.0/8")).unwrap();
    assert_eq!(super::SPLICED.with(|n| n.get()), spliced + 2);
    assert_eq!(ConfigFile::open(&p).unwrap().1, without(rules, "10.0.0.0/8"));
}

/// The hand-edit check trusts the file's stamp only once it was found to
/// hold what the daemon last read or wrote, with its timestamps a tick old
/// by then; any edit after that is seen, be it the same size, in place,
/// right after a check, or only a rename over it.
#[test]
fn edits_are_seen_whatever_the_stamp_says() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    let text = "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"100pps\"\n";
    std::fs::write(&p, text).unwrap();
    let (f, _) = ConfigFile::open(&p).unwrap();
    // A check right away (read), then one a tick later (read, stamp kept),
    // then one by the stamp alone.
    assert!(!f.changed_on_disk().unwrap());
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(!f.changed_on_disk().unwrap());
    assert!(f.stamped(), "the stamp is kept once it tells edits");
    assert!(!f.changed_on_disk().unwrap());
    // The same size, in place, at once.
    let same_size = text.replace("100pps", "200pps");
    assert_eq!(same_size.len(), text.len());
    {
        use std::io::Write;
        let mut w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        w.write_all(same_size.as_bytes()).unwrap();
    }
    assert!(f.changed_on_disk().unwrap(), "an edit in place of the same size");
    // Put back as it was: the bytes are what counts.
    std::fs::write(&p, text).unwrap();
    assert!(!f.changed_on_disk().unwrap(), "the same bytes again");
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert!(!f.changed_on_disk().unwrap());
    assert!(f.stamped());
    // Another file renamed over it, same bytes but one.
    let other = d.path().join("new.toml");
    std::fs::write(&other, same_size.as_bytes()).unwrap();
    std::fs::rename(&other, &p).unwrap();
    assert!(f.changed_on_disk().unwrap(), "a rename over it");
    std::fs::remove_file(&p).unwrap();
    assert!(f.changed_on_disk().unwrap(), "removed");
}

/// A manual ban as a file holds one (`reason` as written, any text).
fn ban_spec(prefix: &str, reason: Option<&str>) -> RuleSpec {
    RuleConfig {
        prefix: prefix.into(),
        ban: Some(true),
        reason: reason.map(Into::into),
        expires: Some("2099-01-01T00:00:00Z".into()),
        ..RuleConfig::default()
    }
    .validate()
    .unwrap()
}

/// Makes `edits` the daemon's way (`stage_rules`, then `commit`) in a file
/// holding `text`: the file written must parse and hold exactly the rules
/// wanted, and everything else it said before (`[daemon]`).
fn edits_say_what_was_wanted(text: &str, edits: &[(RuleKey, Option<RuleSpec>)]) -> String {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    fs::write(&p, text).unwrap();
    let (mut f, before) = ConfigFile::open(&p).unwrap();
    let mut want = before.clone();
    crate::rules::edit_rules(&mut want, edits);
    let pending = f.stage_rules(&before, edits).unwrap();
    f.commit(pending).unwrap();
    let written = fs::read_to_string(&p).unwrap();
    let (cfg, read) = super::Config::parse(&written, &p).unwrap_or_else(|e| panic!("{e}:\n{written}"));
    assert_eq!(read, want, "the file written says otherwise:\n{written}");
    assert_eq!(cfg.daemon, f.config().daemon, "{written}");
    // And a daemon started on it again reads the same (what a restart does).
    assert_eq!(ConfigFile::open(&p).unwrap().1, want);
    written
}

/// `edits_say_what_was_wanted`, and whether the edit was made in place by
/// `splice.rs` (the fast path; `SPLICED` counts them) or not (the
/// whole-document edit of `edit.rs`).
fn edits_spliced(text: &str, edits: &[(RuleKey, Option<RuleSpec>)]) -> (String, bool) {
    let before = super::SPLICED.with(|n| n.get());
    let written = edits_say_what_was_wanted(text, edits);
    let after = super::SPLICED.with(|n| n.get());
    assert!(after <= before + 1, "one edit, spliced {} times", after - before);
    (written, after == before + 1)
}

/// Issue 41, point 1, the red team's first case: a hand-written last rule
/// whose reason is a multi-line string holding a line that starts with
/// `[`. A rule set and a ban after it were written inside the string (the
/// line scan took `[INC-4711] scanner` for the next table): answered,
/// then gone at the next start.
#[test]
fn an_addition_after_a_multi_line_reason_goes_after_the_string() {
    let text = "\
[daemon]
interfaces = [\"eth0\"]

[[rule]]
prefix = \"0.0.0.0/0\"
rate = \"10kpps\"

[[rule]]
prefix = \"198.51.100.7\"
ban = true
expires = \"2099-01-01T00:00:00Z\"
reason = \"\"\"
[INC-4711] scanner
\"\"\"
";
    // Each made in place (the fast path sees the string for what it is,
    // rather than leaving every file with one to the whole-document edit).
    let deny = rule("10.77.0.0/16", None, None, Some(policer_common::bucket::Action::Deny));
    let (written, spliced) = edits_spliced(text, &[(deny.key(), Some(deny.clone()))]);
    assert!(spliced);
    let ban = ban_spec("203.0.113.0/24", None);
    assert!(edits_spliced(&written, &[(ban.key(), Some(ban))]).1);
    // Both at once, and a change of the rule with the string itself.
    let both =
        [(deny.key(), Some(deny)), (ban_spec("203.0.113.0/24", None).key(), Some(ban_spec("203.0.113.0/24", None)))];
    assert!(edits_spliced(text, &both).1);
    let b = ban_spec("198.51.100.7", Some("other"));
    assert!(edits_spliced(text, &[(b.key(), Some(b))]).1);
}

/// The red team's second case: a reason ending in a line `#4711"""` right
/// above the next rule. Removing that rule took the line for the rule's
/// comment and removed the closing quotes with it: an invalid file.
#[test]
fn removing_the_rule_after_a_string_keeps_its_closing_line() {
    let text = "\
[[rule]]
prefix = \"0.0.0.0/0\"
rate = \"10kpps\"

[[rule]]
prefix = \"198.51.100.7\"
ban = true
expires = \"2099-01-01T00:00:00Z\"
reason = \"\"\"
scanner
#4711\"\"\"
[[rule]]
prefix = \"10.0.0.0/8\"
rate = \"1kpps\"

# the end
";
    let k = rule("10.0.0.0/8", Some("1kpps"), None, None).key();
    let (written, spliced) = edits_spliced(text, &[(k, None)]);
    assert!(written.contains("#4711\"\"\"\n") && spliced, "{written}");
    // A comment of its own above it goes with it; the string's lines stay.
    let text = text.replace("#4711\"\"\"\n", "#4711\"\"\"\n# the /8\n");
    let k = rule("10.0.0.0/8", Some("1kpps"), None, None).key();
    let (written, spliced) = edits_spliced(&text, &[(k, None)]);
    assert!(written.contains("#4711\"\"\"\n") && !written.contains("# the /8") && spliced, "{written}");
}

/// The red team's third case: a header written with an escape
/// (`[["ru\u006ce"]]`, which is `[[rule]]`) and a `[[rule]]` line inside a
/// string, which together looked like one header per rule: a change of the
/// escaped rule was made to the string's copy. And a `daemon` key with an
/// escape (`"d\u0061emon" = {}`): the start appended a second `[daemon]`.
#[test]
fn escaped_names_and_headers_in_strings_are_not_taken_for_tables() {
    let text = "\
[[rule]]
prefix = \"0.0.0.0/0\"
rate = \"10kpps\"

[[rule]]
prefix = \"198.51.100.7\"
ban = true
expires = \"2099-01-01T00:00:00Z\"
reason = \"\"\"
[[rule]]
prefix = \"10.0.0.0/8\"
rate = \"1kpps\"
[end]\"\"\"

[[\"ru\\u006ce\"]]
prefix = \"10.0.0.0/8\"
rate = \"1kpps\"
";
    // A header spelled with an escape is `edit.rs`'s (the whole document
    // edited), never spliced; the same file with `[[rule]]` is spliced.
    let r = rule("10.0.0.0/8", Some("2kpps"), None, None);
    assert!(!edits_spliced(text, &[(r.key(), Some(r))]).1);
    let r = rule("10.0.0.0/8", Some("2kpps"), None, None);
    assert!(!edits_spliced(text, &[(r.key(), None)]).1);
    let c = rule("10.1.0.0/16", Some("2kpps"), None, None);
    assert!(!edits_spliced(text, &[(c.key(), Some(c))]).1);
    let plain = text.replace("[[\"ru\\u006ce\"]]", "[[rule]]");
    assert_ne!(plain, text);
    let r = rule("10.0.0.0/8", Some("2kpps"), None, None);
    assert!(edits_spliced(&plain, &[(r.key(), Some(r))]).1);
    let c = rule("10.1.0.0/16", Some("2kpps"), None, None);
    assert!(edits_spliced(&plain, &[(c.key(), Some(c))]).1);

    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    fs::write(&p, "\"d\\u0061emon\" = {}\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\n").unwrap();
    let (mut f, rules) = ConfigFile::open(&p).unwrap();
    f.update(super::Change { rules: None, interfaces: Some(&["eth0".into()]), chains: None }).unwrap();
    let written = fs::read_to_string(&p).unwrap();
    let (cfg, read) = super::Config::parse(&written, &p).unwrap_or_else(|e| panic!("{e}:\n{written}"));
    assert_eq!((cfg.daemon.interfaces, read), (vec!["eth0".to_string()], rules), "{written}");
}

/// Issue 41, point 1: random documents whose bans have multi-line reasons
/// (basic and literal) holding `[`, `[[rule]]`, `[daemon]`, `#` lines,
/// quotes, escapes and closing quotes on a content line, with comments and
/// header spellings around; random changes, removals and additions, made
/// the daemon's way. The file written always parses and holds exactly the
/// rules wanted (and, inside, `file.rs` checks every change made in place
/// against the whole-document edit, line for line).
mod splice_props {
    use proptest::prelude::*;

    use super::*;

    /// A document from `pick` (each call: a choice below its argument),
    /// and whether it is `splice.rs`'s: every header spelled `[[rule]]`
    /// and no `daemon` key spelled with an escape (strings of every kind
    /// inside it).
    fn document(pick: &mut impl FnMut(usize) -> usize) -> (String, bool) {
        const BASIC: [&str; 12] = [
            "[INC-4711] scanner",
            "[[rule]]",
            "[daemon]",
            "#4711",
            "# not a comment",
            "",
            "prefix = \\\"10.0.0.0/8\\\"",
            "a \\\"quoted\\\" word \\\\ and \\u0041",
            "\"\" two quotes",
            "''' three single",
            "[",
            "} ] {",
        ];
        const LITERAL: [&str; 10] = [
            "[INC-4711] scanner",
            "[[rule]]",
            "[daemon]",
            "#4711",
            "",
            "prefix = \"10.0.0.0/8\"",
            "back\\slash \\\" raw",
            "\"\"\" three double",
            "'' two single",
            "[x",
        ];
        // Spelled otherwise than `[[rule]]`, a header makes the whole
        // file edited by `edit.rs` (which does not keep such a spelling
        // when it edits other rules): only now and then.
        const HEADERS: [&str; 6] =
            ["[[rule]]", "[[rule]]  # c", "[[ rule ]]", "[[\"rule\"]]", "[['rule']]", "[[\"ru\\u006ce\"]]"];
        let mut t = String::new();
        if pick(2) == 0 {
            t.push_str("# preamble\n\n");
        }
        let mut plain = true;
        match pick(4) {
            0 => t.push_str("[daemon]\ninterfaces = [\"eth0\"]\n\n"),
            1 => {
                t.push_str("\"d\\u0061emon\" = { interfaces = [\"eth0\"] }\n\n");
                plain = false;
            }
            _ => {}
        }
        let n = 1 + pick(7);
        for i in 0..n {
            for _ in 0..pick(3) {
                t.push_str(["\n", "# about it\n", "#[[rule]]\n"][pick(3)]);
            }
            let h = if pick(10) == 0 {
                plain = false;
                HEADERS[2 + pick(4)]
            } else {
                HEADERS[pick(2)]
            };
            t.push_str(h);
            t.push('\n');
            if pick(3) == 0 {
                t.push_str(&format!("prefix = \"192.0.2.{i}\"\nban = true\n"));
                let literal = pick(2) == 0;
                let q = if literal { "'''" } else { "\"\"\"" };
                let mut reason = format!("reason = {q}");
                if pick(2) == 0 {
                    reason.push('\n');
                }
                let lines = 1 + pick(3);
                for l in 0..lines {
                    reason.push_str(if literal { LITERAL[pick(LITERAL.len())] } else { BASIC[pick(BASIC.len())] });
                    if l + 1 < lines {
                        reason.push('\n');
                    }
                }
                match pick(3) {
                    // On a line of its own, on the content's last line, or
                    // with a quote of the content before it.
                    0 => reason.push_str(&format!("\n{q}")),
                    1 => reason.push_str(q),
                    _ => reason.push_str(&format!("{}{q}", &q[..1])),
                }
                let expires = "expires = \"2099-01-01T00:00:00Z\"\n";
                if pick(2) == 0 {
                    t.push_str(&format!("{reason}\n{expires}"));
                } else {
                    t.push_str(&format!("{expires}{reason}\n"));
                }
            } else {
                t.push_str(&format!("prefix = \"10.{i}.0.0/16\"\nrate = \"{}pps\"\n", 100 + pick(900)));
            }
            if pick(4) == 0 {
                t.push_str("# after it\n");
            }
        }
        (t, plain)
    }

    /// Random edits of `rules`.
    fn edits(
        rules: &BTreeMap<RuleKey, RuleSpec>,
        pick: &mut impl FnMut(usize) -> usize,
    ) -> Vec<(RuleKey, Option<RuleSpec>)> {
        let keys: Vec<&RuleKey> = rules.keys().collect();
        let mut out: Vec<(RuleKey, Option<RuleSpec>)> = Vec::new();
        for j in 0..1 + pick(3) {
            let e = match pick(4) {
                0 => {
                    let a = format!("10.{}.0.0/16", 100 + j);
                    let s = match pick(3) {
                        0 => rule(&a, None, None, Some(policer_common::bucket::Action::Deny)),
                        1 => ban_spec(&format!("203.0.113.{j}"), Some("new")),
                        _ => rule(&a, Some("700pps"), Some(30), None),
                    };
                    (s.key(), Some(s))
                }
                1 => (keys[pick(keys.len())].clone(), None),
                _ => {
                    let k = keys[pick(keys.len())].clone();
                    let s = if k.ban {
                        ban_spec(&k.net.to_string(), Some("changed"))
                    } else {
                        rule(&k.net.to_string(), Some(&format!("{}pps", 1000 + pick(900))), None, None)
                    };
                    (k, Some(s))
                }
            };
            if out.iter().all(|(k, _)| *k != e.0) {
                out.push(e);
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]
        #[test]
        fn every_change_written_says_what_was_wanted(choices in prop::collection::vec(any::<u32>(), 64..256)) {
            let mut at = 0;
            let mut pick = |n: usize| {
                at += 1;
                choices[at % choices.len()] as usize % n.max(1)
            };
            let (text, plain) = document(&mut pick);
            let (_, before) = super::super::Config::parse(&text, Path::new("-"))
                .unwrap_or_else(|e| panic!("the generated document does not parse: {e}\n{text}"));
            let mut text = text;
            let mut rules = before;
            for _ in 0..3 {
                if rules.is_empty() {
                    break;
                }
                let e = edits(&rules, &mut pick);
                let (written, spliced) = edits_spliced(&text, &e);
                // One change or addition in a document of `[[rule]]`
                // headers is made in place, whatever its strings hold (a
                // lexer that gave up on them would leave every such file
                // to the whole-document edit); several edits may meet, or
                // a removal take a comment, which `splice.rs` leaves to
                // `edit.rs`.
                let one_set = matches!(e.as_slice(), [(_, Some(_))]);
                prop_assert!(spliced || !plain || !one_set, "not spliced: {e:?}\n{text}");
                text = written;
                crate::rules::edit_rules(&mut rules, &e);
            }
        }
    }
}

/// Issue 41, point 5: a writer killed mid-file leaves a file cut at any
/// byte, closed as if finished. The shipped config (its examples in force)
/// cut at every byte: no cut that ends inside a line is taken by a
/// followed reload, though many of them are valid TOML and valid rules
/// (`burst = 1` of `burst = 100`, a rule's last key gone: what the rule
/// before this one, for drastic reloads only, let through); a cut at a
/// line's end is taken exactly when it is a valid whole file, the
/// documented rule (nothing in its bytes tells it from a file written
/// that way). An explicit reload of an ordinary change still takes a valid
/// file without the newline; a drastic one never does.
#[test]
fn a_cut_file_is_followed_only_if_it_ends_as_a_whole_file_does() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("policer.toml");
    let whole = EXAMPLE.as_bytes();
    fs::write(&p, whole).unwrap();
    let (f, _) = ConfigFile::open(&p).unwrap();
    let (mut taken, mut valid_mid_line) = (0, 0);
    for cut in 0..=whole.len() {
        let bytes = &whole[..cut];
        let followed = f.snapshot(Some(bytes.to_vec())).and_then(|s| s.check_whole(&p, true, None));
        let at_line_end = bytes.ends_with(b"\n");
        let valid = std::str::from_utf8(bytes).is_ok_and(|t| super::Config::parse(t, &p).is_ok());
        if at_line_end {
            assert_eq!(followed.is_ok(), valid, "the cut at byte {cut}, at a line's end");
            taken += usize::from(valid);
        } else {
            assert!(
                followed.is_err(),
                "the cut at byte {cut}, inside a line, was followed:\n{}",
                String::from_utf8_lossy(bytes)
            );
        }
        if !at_line_end && valid {
            valid_mid_line += 1;
            let snap = f.snapshot(Some(bytes.to_vec())).unwrap();
            let e = snap.check_whole(&p, true, None).unwrap_err().to_string();
            assert!(e.contains("does not end with a newline") && e.contains("nothing changed"), "{e}");
            assert!(snap.check_whole(&p, false, None).is_ok(), "an explicit reload of an ordinary change");
            assert!(snap.check_whole(&p, false, Some("lift every ban (1)")).is_err(), "a drastic one");
        }
    }
    assert!(valid_mid_line > 50, "only {valid_mid_line} valid cuts inside a line: the test tests little");
    assert!(taken > 5, "{taken}");
    // The whole file is followed, and so is one without a file (nothing to read).
    assert!(f.snapshot(Some(whole.to_vec())).and_then(|s| s.check_whole(&p, true, None)).is_ok());
    assert!(f.snapshot(None).and_then(|s| s.check_whole(&p, true, None)).is_ok());
}

/// `[global]` and a rule's `global` (fleet budgets, docs/fleet.md): read,
/// checked, and a rule that names a budget without the table refused.
#[test]
fn global_table_and_rules() {
    let table = "[global]\nredis_url = \"redis://127.0.0.1:6379/0\"\nnode_id = \"edge1\"\nlease_period = \"50ms\"\n\n";
    let rule = "[[rule]]\nprefix = \"0.0.0.0/0\"\ntotal_rate = \"30kpps\"\nglobal = \"svc\"\n";
    let (cfg, rules, problems) = super::Config::check_all(&format!("{table}{rule}"), None);
    assert!(problems.is_empty(), "{problems:?}");
    assert_eq!(cfg.global.as_ref().and_then(|g| g.node_id.as_deref()), Some("edge1"));
    assert_eq!(rules.values().next().and_then(|s| s.global()), Some("svc"));
    let said = |text: &str| -> String {
        let (_, _, p) = super::Config::check_all(text, None);
        p.iter().map(|p| p.message.clone()).collect::<Vec<_>>().join("; ")
    };
    for (text, needle) in [
        (rule.to_string(), "needs a [global] table"),
        (format!("{table}[[rule]]\nprefix = \"0.0.0.0/0\"\nrate = \"1kpps\"\nglobal = \"svc\"\n"), "global needs"),
        (format!("{table}[[rule]]\nprefix = \"0.0.0.0/0\"\ntotal_rate = \"1mbit\"\nglobal = \"svc\"\n"), "bit rate"),
        (format!("{table}[[rule]]\nprefix = \"0.0.0.0/0\"\ntotal_rate = \"1kpps\"\nglobal = \"a b\"\n"), "not a name"),
        (
            format!("{table}[[rule]]\nprefix = \"0.0.0.0/0\"\ntotal_rate = \"19pps\"\nglobal = \"svc\"\n"),
            "at least 20pps",
        ),
        ("[global]\nnode_id = \"x\"\n".to_string(), "redis_url is needed"),
        ("[global]\nredis_url = \"redis://h/0\"\nperiod = 1\n".to_string(), "period"),
        ("[global]\nredis_url = \"redis://h/0\"\nfallback = \"all\"\n".to_string(), "fallback"),
        ("[global]\nredis_url = \"redis://h/0\"\ndatabase = \"x\"\n".to_string(), "database"),
    ] {
        let s = said(&text);
        assert!(s.contains(needle), "{text}: {s}");
    }
    // Written back as read.
    let spec = rules.values().next().unwrap();
    assert_eq!(spec.config().global.as_deref(), Some("svc"));
}
