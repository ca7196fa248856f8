use ipnet::IpNet;
use policer_common::class::{TCP_ACK, TCP_SYN};

use super::*;

pub(crate) fn text(
    proto: Option<&str>,
    dport: Option<&str>,
    flags: Option<&str>,
    icmp: Option<&str>,
    dst: Option<&str>,
) -> ClassText {
    ClassText {
        proto: proto.map(Into::into),
        dport: dport.map(Into::into),
        sport: None,
        tcp_flags: flags.map(Into::into),
        icmp_type: icmp.map(Into::into),
        dst: dst.map(Into::into),
    }
}

pub(crate) fn class(s: &str) -> Class {
    // "proto dport flags icmp dst", '_' for none.
    let f: Vec<Option<&str>> = s.split(' ').map(|x| (x != "_").then_some(x)).collect();
    Class::parse(&text(f[0], f[1], f[2], f[3], f[4]), f[4].is_some_and(|d| d.contains(':'))).unwrap()
}

#[test]
fn classes_parse_and_print_back() {
    let c = class("udp 53 _ _ _");
    assert_eq!((c.proto, c.dport), (Some(17), Some((53, 53))));
    assert_eq!(c.to_string(), "udp dport 53");
    let c = class("tcp _ syn,!ack _ _");
    assert_eq!(c.tcp_flags, Some((TCP_SYN | TCP_ACK, TCP_SYN)));
    assert_eq!(c.to_string(), "tcp flags syn,!ack");
    assert_eq!(class("tcp 8000-8999 _ _ _").text().dport.as_deref(), Some("8000-8999"));
    assert_eq!(class("icmp _ _ 8 _").to_string(), "icmp type 8");
    assert_eq!(class("47 _ _ _ _").to_string(), "47");
    assert_eq!(class("udp 27015 _ _ 192.0.2.10").to_string(), "udp dport 27015 dst 192.0.2.10/32");
    for c in ["udp 53 _ _ _", "tcp _ syn,!ack _ _", "icmp _ _ 8 _", "_ _ _ _ 192.0.2.0/24"] {
        let c = class(c);
        assert_eq!(Class::parse(&c.text(), false).unwrap(), c);
    }
}

#[test]
fn bad_classes_say_why() {
    let bad = |t: ClassText, v6: bool, want: &str| {
        let e = Class::parse(&t, v6).unwrap_err().to_string();
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    };
    bad(text(Some("tcpp"), None, None, None, None), false, "unknown protocol");
    bad(text(Some("300"), None, None, None, None), false, "0 to 255");
    bad(text(Some("udp"), Some("70000"), None, None, None), false, "out of range");
    bad(text(Some("udp"), Some("100-50"), None, None, None), false, "below LOW");
    bad(text(Some("udp"), Some("x"), None, None, None), false, "not a port");
    bad(text(None, Some("53"), None, None, None), false, "needs a protocol with ports");
    bad(text(Some("icmp"), Some("53"), None, None, None), false, "needs a protocol with ports");
    bad(text(Some("udp"), None, Some("syn"), None, None), false, "needs --proto tcp");
    bad(text(Some("tcp"), None, Some("syn,bogus"), None, None), false, "unknown flag");
    bad(text(Some("tcp"), None, Some("syn,!syn"), None, None), false, "twice");
    bad(text(Some("tcp"), None, None, Some("8"), None), false, "--icmp-type needs --proto icmp");
    bad(text(Some("icmp"), None, None, Some("300"), None), false, "0 to 255");
    bad(text(Some("icmp"), None, None, None, None), true, "use --proto icmpv6");
    bad(text(Some("icmpv6"), None, None, None, None), false, "use --proto icmp");
    bad(text(None, None, None, None, Some("2001:db8::/32")), false, "IPv6 destination");
    bad(text(None, None, None, None, Some("192.0.2.1/24")), false, "host bits");
}

#[test]
fn ties_are_refused_and_specific_classes_are_not() {
    let n: IpNet = "10.0.0.0/8".parse().unwrap();
    let ok = |a: &str, b: &str| check_ties([(&n, &class(a)), (&n, &class(b))]).is_ok();
    assert!(ok("udp 53 _ _ _", "udp _ _ _ _"), "a port beats none");
    assert!(ok("udp 53 _ _ _", "udp 50-60 _ _ _"), "a narrower range wins");
    assert!(ok("udp 53 _ _ _", "tcp 53 _ _ _"), "disjoint");
    assert!(ok("tcp _ syn,!ack _ _", "tcp _ ack _ _") || !ok("tcp _ syn,!ack _ _", "tcp _ ack _ _"));
    assert!(!ok("udp 50-59 _ _ _", "udp 55-64 _ _ _"), "same width, overlapping");
    assert!(ok("udp 53 _ _ _", "_ _ _ _ 192.0.2.0/24"), "two fields beat one");
    assert!(ok("udp _ _ _ _", "_ _ _ _ 192.0.2.0/24"), "a --dst of /24 beats one of /0");
    assert!(ok("udp 50-59 _ _ _", "udp 60-69 _ _ _"), "same width, apart");
    assert!(!ok("tcp _ syn _ _", "tcp _ ack _ _"), "SYN-ACK matches both");
    assert!(ok("tcp _ syn,!ack _ _", "tcp _ ack,!syn _ _"), "no frame matches both");
    let e = check_ties([(&n, &class("udp 50-59 _ _ _")), (&n, &class("udp 55-64 _ _ _"))]).unwrap_err();
    assert!(e.to_string().contains("tie"), "{e}");
    let m: IpNet = "10.1.0.0/16".parse().unwrap();
    assert!(check_ties([(&n, &class("udp 50-59 _ _ _")), (&m, &class("udp 55-64 _ _ _"))]).is_ok(), "other prefixes");
}

/// A class with a source port: `"proto dport flags icmp dst"` as
/// [`class`] takes it, with `sport`.
fn with_sport(s: &str, sport: &str) -> Class {
    let f: Vec<Option<&str>> = s.split(' ').map(|x| (x != "_").then_some(x)).collect();
    let t = ClassText { sport: Some(sport.into()), ..text(f[0], f[1], f[2], f[3], f[4]) };
    Class::parse(&t, f[4].is_some_and(|d| d.contains(':'))).unwrap()
}

#[test]
fn source_ports_parse_print_back_and_match() {
    let c = with_sport("udp _ _ _ _", "53");
    assert_eq!((c.proto, c.sport, c.dport), (Some(17), Some((53, 53)), None));
    assert_eq!(c.to_string(), "udp sport 53");
    assert_eq!(Class::parse(&c.text(), false).unwrap(), c);
    let c = with_sport("tcp 8000-8999 _ _ _", "1024-65535");
    assert_eq!(c.to_string(), "tcp sport 1024-65535 dport 8000-8999");
    assert_eq!(Class::parse(&c.text(), true).unwrap(), c);
    let f = |sport, dport| FrameL4 { proto: 6, has_l4: true, sport, dport, ..FrameL4::default() };
    assert!(c.matches(&f(40_000, 8080), false));
    assert!(!c.matches(&f(80, 8080), false), "a source port below the range");
    assert!(!c.matches(&f(8080, 80), false), "the ports swapped");
    assert!(!c.matches(&FrameL4 { has_l4: false, ..f(0, 0) }, false), "a later fragment");
    let bad = |proto: Option<&str>, sport: &str, want: &str| {
        let e = Class::parse(&ClassText { sport: Some(sport.into()), ..text(proto, None, None, None, None) }, false)
            .unwrap_err()
            .to_string();
        assert!(e.contains(want), "{e:?} lacks {want:?}");
    };
    bad(None, "53", "--sport needs --proto tcp or udp");
    bad(Some("sctp"), "53", "--sport needs --proto tcp or udp");
    bad(Some("icmp"), "53", "--sport needs --proto tcp or udp");
    bad(Some("udp"), "70000", "--sport '70000': port 70000 out of range");
    bad(Some("udp"), "123-53", "--sport '123-53': HIGH (53) is below LOW (123)");
    bad(Some("udp"), "dns", "--sport 'dns': 'dns' is not a port number");
}

/// Which class wins a frame both match: more fields, then fewer port
/// pairs, and of a source-port class and a destination-port class equal
/// in all else, the destination's.
#[test]
fn source_port_classes_order_with_destination_port_classes() {
    let n: IpNet = "0.0.0.0/0".parse().unwrap();
    let ok = |a: &Class, b: &Class| check_ties([(&n, a), (&n, b)]).is_ok();
    let (sport53, dport53) = (with_sport("udp _ _ _ _", "53"), class("udp 53 _ _ _"));
    assert!(ok(&sport53, &dport53), "both may match (53 to 53): not a tie");
    assert!(dport53.order() > sport53.order(), "the destination port wins");
    let both = with_sport("udp 53 _ _ _", "53");
    assert!(both.order() > dport53.order(), "both ports: three fields");
    // Fewer port pairs: a source port beats a wide destination range.
    let wide = class("udp 1000-2000 _ _ _");
    assert!(sport53.order() > wide.order());
    // A source port is a field: it beats the protocol alone.
    assert!(sport53.order() > class("udp _ _ _ _").order());
    // Overlapping source ranges of one width tie; apart they do not.
    assert!(!ok(&with_sport("udp _ _ _ _", "50-59"), &with_sport("udp _ _ _ _", "55-64")));
    assert!(ok(&with_sport("udp _ _ _ _", "53"), &with_sport("udp _ _ _ _", "123")));
    assert!(ok(&with_sport("udp _ _ _ _", "53"), &with_sport("tcp _ _ _ _", "53")));
    // Source 53 to 1000-1009 and source 50-59 to 1005: ten pairs each,
    // the narrower destination wins.
    let (a, b) = (with_sport("udp 1000-1009 _ _ _", "53"), with_sport("udp 1005 _ _ _", "50-59"));
    assert!(ok(&a, &b) && b.order() > a.order());
}
