use std::{io::Write, net::Ipv4Addr};

use super::*;

const SEC: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * SEC;

/// An Ethernet/IPv4 frame from `src` (what `source_of` reads).
fn frame(src: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0u8; 14 + 28];
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    f[14] = 0x45;
    f[16..18].copy_from_slice(&28u16.to_be_bytes());
    f[22] = 64;
    f[23] = 17;
    f[26..30].copy_from_slice(&src.octets());
    f[30..34].copy_from_slice(&[192, 0, 2, 1]);
    f
}

/// Every frame of sources sending evenly at their rates for `secs`
/// seconds, in time order.
fn frames(sources: &[(Ipv4Addr, u64)], secs: u64) -> Vec<(u64, Ipv4Addr)> {
    let mut v = Vec::new();
    for (a, pps) in sources {
        for i in 0..pps * secs {
            // Offset within the first gap so no frame sits on a bin's edge.
            v.push((T0 + SEC / (2 * pps) + i * SEC / pps, *a));
        }
    }
    v.sort();
    v
}

fn write_pcap(path: &Path, frames: &[(u64, Ipv4Addr)]) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    out.write_all(&0xa1b2_3c4du32.to_le_bytes()).unwrap();
    out.write_all(&2u16.to_le_bytes()).unwrap();
    out.write_all(&4u16.to_le_bytes()).unwrap();
    out.write_all(&[0; 8]).unwrap();
    out.write_all(&65535u32.to_le_bytes()).unwrap();
    out.write_all(&1u32.to_le_bytes()).unwrap();
    for (ts, a) in frames {
        let f = frame(*a);
        out.write_all(&((ts / SEC) as u32).to_le_bytes()).unwrap();
        out.write_all(&((ts % SEC) as u32).to_le_bytes()).unwrap();
        out.write_all(&(f.len() as u32).to_le_bytes()).unwrap();
        out.write_all(&(f.len() as u32).to_le_bytes()).unwrap();
        out.write_all(&f).unwrap();
    }
}

/// 20 sources at 10, 20, … 200 pps and 2 at 2 000, for 12 s.
fn population() -> Vec<(Ipv4Addr, u64)> {
    let mut v: Vec<(Ipv4Addr, u64)> = (1..=20).map(|i| (Ipv4Addr::new(10, 1, 0, i as u8), 10 * i)).collect();
    v.push((Ipv4Addr::new(10, 9, 0, 1), 2000));
    v.push((Ipv4Addr::new(10, 9, 0, 2), 2000));
    v
}

#[test]
fn a_capture_gives_each_rule_its_distribution_and_proposal() {
    let dir = tempfile::tempdir().unwrap();
    let (pcap, config) = (dir.path().join("c.pcap"), dir.path().join("p.toml"));
    let mut f = frames(&population(), 12);
    // A source of another rule, keyed by /24: two addresses, one bucket.
    f.extend(frames(&[(Ipv4Addr::new(172, 16, 5, 1), 5), (Ipv4Addr::new(172, 16, 5, 2), 5)], 12));
    // A frame no rule takes.
    f.push((T0 + 3 * SEC, Ipv4Addr::new(192, 168, 1, 1)));
    f.sort();
    write_pcap(&pcap, &f);
    std::fs::write(
        &config,
        "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\nburst = 100\naction = \"monitor\"\n\n\
         [[rule]]\nprefix = \"172.16.0.0/12\"\nrate = \"50pps\"\nburst = 10\nkey_len = 24\n",
    )
    .unwrap();
    // 20 of 22 sources: 90.9 %; keep 90 % is rank ⌈19.8⌉ = 20.
    let r = from_capture(&pcap, &config, &[], 900_000).unwrap();
    assert_eq!(r.rules.len(), 2);
    assert_eq!(r.unmatched_frames, 1);
    assert!((r.observed_s - 12.0).abs() < 1e-9, "{}", r.observed_s);
    let ten = &r.rules[0];
    assert_eq!((ten.rule.as_str(), ten.action.as_str(), ten.sources), ("10.0.0.0/8", "monitor", 22));
    assert_eq!(ten.frames, (2100 + 4000) * 12);
    // Even senders: a source at R pps has R in every 1 s window, R/10 in
    // every 100 ms one, 10 R over 10 s.
    assert_eq!(ten.peak_1s, Dist { p50: 110.0, p90: 200.0, p99: 2000.0, p99_9: 2000.0, max: 2000.0 });
    let d10 = ten.peak_10s.as_ref().unwrap();
    assert_eq!((d10.p50, d10.p90, d10.max), (110.0, 200.0, 2000.0));
    assert_eq!((ten.peak_100ms.p50, ten.peak_100ms.max), (110.0, 2000.0));
    // The 90 % keeps the 20th: 200 pps, and a tenth of a second's burst.
    assert_eq!((ten.suggested_rate_pps, ten.suggested_burst), (200, 20));
    assert_eq!(ten.within, 20);
    let cut: Vec<&str> = ten.cut.iter().map(|c| c.source.as_str()).collect();
    assert_eq!(cut, ["10.9.0.1", "10.9.0.2"]);
    assert_eq!(ten.command, "policer rule set 10.0.0.0/8 --rate 200pps --burst 20");
    let other = &r.rules[1];
    assert_eq!((other.sources, other.key_len), (1, 24));
    assert_eq!((other.suggested_rate_pps, other.suggested_burst), (10, 1));
    assert_eq!(other.command, "policer rule set 172.16.0.0/12 --rate 10pps --burst 1");
    // Every source kept: the heavy ones set the rate.
    let all = from_capture(&pcap, &config, &["10.0.0.0/8".parse().unwrap()], 1_000_000).unwrap();
    assert_eq!(all.rules.len(), 1);
    assert_eq!((all.rules[0].suggested_rate_pps, all.rules[0].within), (2000, 22));
    let t = text(&r);
    assert!(t.contains("\npolicer rule set 10.0.0.0/8 --rate 200pps --burst 20\n"), "{t}");
    assert!(t.contains("cut: 10.9.0.1 (2000.0 pps over 1 s, 2000.0 pps over 10 s)"), "{t}");
}

#[test]
fn a_bad_input_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (pcap, config) = (dir.path().join("c.pcap"), dir.path().join("p.toml"));
    write_pcap(&pcap, &frames(&[(Ipv4Addr::new(10, 0, 0, 1), 10)], 1));
    std::fs::write(&config, "[[rule]]\nprefix = \"10.0.0.0/8\"\naction = \"deny\"\n").unwrap();
    let e = from_capture(&pcap, &config, &[], 999_000).unwrap_err().to_string();
    assert!(e.contains("no rule to suggest for"), "{e}");
    std::fs::write(&config, "[[rule]]\nprefix = \"10.0.0.0/8\"\nrate = \"1kpps\"\n").unwrap();
    std::fs::write(&pcap, b"not a capture at all, no").unwrap();
    let e = from_capture(&pcap, &config, &[], 999_000).unwrap_err().to_string();
    assert!(e.contains("c.pcap"), "{e}");
    let e = from_capture(&dir.path().join("none.pcap"), &config, &[], 999_000).unwrap_err().to_string();
    assert!(e.contains("none.pcap"), "{e}");
}

#[test]
fn class_options_are_quoted_for_the_shell() {
    let t = Target {
        rule: "0.0.0.0/0 [tcp flags syn,!ack]".into(),
        net: "0.0.0.0/0".parse().unwrap(),
        key_len: 32,
        class_args: vec![("--proto", "tcp".into()), ("--tcp-flags", "syn,!ack".into())],
        action: "police".into(),
        rate: Some("20pps".into()),
        burst: Some(40),
    };
    assert_eq!(
        command(&t, 7, 3),
        "policer rule set 0.0.0.0/0 --proto tcp --tcp-flags 'syn,!ack' --rate 7pps --burst 3"
    );
    assert_eq!(shell_word("it's"), r"'it'\''s'");
}

#[test]
fn an_observation_without_frames_has_no_rules() {
    let t = Target {
        rule: "10.0.0.0/8".into(),
        net: "10.0.0.0/8".parse().unwrap(),
        key_len: 32,
        class_args: vec![],
        action: "monitor".into(),
        rate: None,
        burst: None,
    };
    let r = Observer::new(vec![t], Some(T0)).finish("daemon".into(), Some(3 * SEC), 999_000, vec![]);
    assert_eq!((r.rules.len(), r.unseen_rules.as_slice(), r.observed_s), (0, &["10.0.0.0/8".to_string()][..], 3.0));
}
