//! Classes as operators write them (`--proto`, `--dport`, `--sport`,
//! `--tcp-flags`, `--icmp-type`, `--dst`) and their order: the vocabulary. How a set of
//! classed rules becomes what the program reads is [`crate::compile`]'s.
//!
//! # Which rule a frame gets
//!
//! 1. The longest source prefix that has any rule (with or without a
//!    class), as before.
//! 2. Among that prefix's classes, the most specific that matches
//!    ([`Class::order`]): more fields beat fewer (`--sport` and `--dport`
//!    are a field each); then fewer port pairs (the source ports a class
//!    covers times its destination ports: a narrower range of either);
//!    then a longer destination prefix; then more TCP flags looked at;
//!    last, a narrower destination port range, so that of a source-port
//!    class and a destination-port class equal in all else
//!    (`udp sport 53`, `udp dport 53`), the destination's wins a frame
//!    both match (from port 53 to port 53: traffic for this host's own
//!    service). Two classes of one prefix that no field tells apart and
//!    that one frame could match are refused at `rule set` ([`check_ties`]).
//! 3. None matches: the classes of each shorter prefix (longest first, its
//!    most specific first), up to and including the nearest one with a
//!    rule that says `inherit = false` (none, if the prefix itself says
//!    it); a class of a shorter prefix that the longer one defines too is
//!    met there first (it shadows it). Issue 43: classes compose, as
//!    nftables operators expect.
//! 4. None matches: the prefix's class-less rule, if it has one; else the
//!    next shorter prefix's class-less rule.
//!
//! Non-first fragments carry no ports, flags or ICMP type: they match only
//! classes that name nothing past the IP header (`--proto`, `--dst`); a
//! `--sport` class takes a flood's first fragments, not the later ones.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use ipnet::IpNet;
use policer_common::{
    Rule,
    class::{
        ClassCand, FrameL4, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, NEEDS_DST, NEEDS_ICMP_TYPE, NEEDS_L4,
        NEEDS_SPORT, NEEDS_TCP_FLAGS, PROTOS_WITH_PORTS, PROTOS_WITH_SPORTS, TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN,
        TCP_PSH, TCP_RST, TCP_SYN, TCP_URG, mapped_v4,
    },
};

use crate::{
    error::{Error, Result},
    prefix::parse_prefix,
};

/// The class of a rule: which of its source prefix's traffic it is for.
/// Every field is optional; none is the prefix's class-less rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Class {
    /// IP protocol number.
    pub proto: Option<u8>,
    /// Destination ports, inclusive.
    pub dport: Option<(u16, u16)>,
    /// Source ports, inclusive (TCP and UDP).
    pub sport: Option<(u16, u16)>,
    /// TCP flags: (looked at, of those set).
    pub tcp_flags: Option<(u8, u8)>,
    pub icmp_type: Option<u8>,
    /// Destination prefix (same family as the source prefix).
    pub dst: Option<IpNet>,
}

/// A class as written (CLI options, config file fields): text as the
/// operator gives it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassText {
    pub proto: Option<String>,
    pub dport: Option<String>,
    pub sport: Option<String>,
    pub tcp_flags: Option<String>,
    pub icmp_type: Option<String>,
    pub dst: Option<String>,
}

const FLAG_NAMES: [(&str, u8); 8] = [
    ("fin", TCP_FIN),
    ("syn", TCP_SYN),
    ("rst", TCP_RST),
    ("psh", TCP_PSH),
    ("ack", TCP_ACK),
    ("urg", TCP_URG),
    ("ece", TCP_ECE),
    ("cwr", TCP_CWR),
];

/// Protocol names operators write.
const PROTO_NAMES: [(&str, u8); 6] = [
    ("icmp", IPPROTO_ICMP),
    ("tcp", IPPROTO_TCP),
    ("udp", 17),
    ("icmpv6", IPPROTO_ICMPV6),
    ("sctp", 132),
    ("udplite", 136),
];

/// A protocol as operators write it: its name, or its number.
pub fn proto_name(p: u8) -> String {
    PROTO_NAMES.iter().find(|(_, n)| *n == p).map_or_else(|| p.to_string(), |(s, _)| (*s).to_string())
}

pub(crate) fn parse_proto(s: &str) -> Result<u8> {
    let t = s.trim().to_ascii_lowercase();
    if let Some((_, p)) = PROTO_NAMES.iter().find(|(n, _)| *n == t) {
        return Ok(*p);
    }
    match t.parse::<u16>() {
        Ok(n) if n <= 255 => Ok(n as u8),
        Ok(_) => Err(Error::Invalid(format!("--proto '{s}': a protocol number is 0 to 255"))),
        Err(_) => Err(Error::Invalid(format!(
            "--proto '{s}': unknown protocol (tcp, udp, icmp, icmpv6, sctp, udplite, or a number 0 to 255)"
        ))),
    }
}

fn parse_port(s: &str, whole: &str, opt: &str) -> Result<u16> {
    let t = s.trim();
    match t.parse::<u32>() {
        Ok(n) if n <= 65_535 => Ok(n as u16),
        Ok(_) => Err(Error::Invalid(format!("{opt} '{whole}': port {t} out of range 0 to 65535"))),
        Err(_) => Err(Error::Invalid(format!("{opt} '{whole}': '{t}' is not a port number (PORT or LOW-HIGH)"))),
    }
}

/// `PORT` or `LOW-HIGH`, for the option `opt` (`--dport`, `--sport`).
fn parse_ports(s: &str, opt: &str) -> Result<(u16, u16)> {
    match s.split_once('-') {
        None => {
            let p = parse_port(s, s, opt)?;
            Ok((p, p))
        }
        Some((lo, hi)) => {
            let (lo, hi) = (parse_port(lo, s, opt)?, parse_port(hi, s, opt)?);
            if hi < lo {
                return Err(Error::Invalid(format!("{opt} '{s}': HIGH ({hi}) is below LOW ({lo})")));
            }
            Ok((lo, hi))
        }
    }
}

fn ports_text((lo, hi): (u16, u16)) -> String {
    if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }
}

pub(crate) fn parse_flags(s: &str) -> Result<(u8, u8)> {
    let (mut mask, mut set) = (0u8, 0u8);
    for item in s.split(',') {
        let t = item.trim().to_ascii_lowercase();
        let (neg, name) = match t.strip_prefix('!') {
            Some(n) => (true, n.trim()),
            None => (false, t.as_str()),
        };
        let Some((_, bit)) = FLAG_NAMES.iter().find(|(n, _)| *n == name) else {
            return Err(Error::Invalid(format!(
                "--tcp-flags '{s}': unknown flag '{}' (fin, syn, rst, psh, ack, urg, ece, cwr; '!' negates)",
                item.trim()
            )));
        };
        if mask & bit != 0 {
            return Err(Error::Invalid(format!("--tcp-flags '{s}': {name} is named twice")));
        }
        mask |= bit;
        if !neg {
            set |= bit;
        }
    }
    Ok((mask, set))
}

/// Ports `PORT` or `LOW-HIGH` cover (65 536 when none is named).
fn span(ports: Option<(u16, u16)>) -> u64 {
    ports.map_or(65_536, |(lo, hi)| u64::from(hi - lo) + 1)
}

fn flags_text(mask: u8, set: u8) -> String {
    let mut out = Vec::new();
    for (name, bit) in FLAG_NAMES {
        if mask & bit != 0 {
            out.push(if set & bit != 0 { name.to_string() } else { format!("!{name}") });
        }
    }
    out.join(",")
}

impl Class {
    /// Whether this is no class (the prefix's class-less rule).
    pub fn is_none(&self) -> bool {
        *self == Class::default()
    }

    /// Validates a class of a rule for a source prefix of family `v6`:
    /// the first problem [`Class::checked`] finds.
    pub fn parse(t: &ClassText, v6: bool) -> Result<Class> {
        let mut found = Vec::new();
        match Class::checked(t, Some(v6), &[], &mut found) {
            Some(c) if found.is_empty() => Ok(c),
            _ => Err(found.into_iter().next().map_or_else(|| Error::Invalid("not a valid class".into()), |(_, e)| e)),
        }
    }

    /// Every problem of a class, each with its key (`proto`, `dport`,
    /// `sport`, `tcp_flags`, `icmp_type`, `dst`), into `found`; the class when it
    /// has none. `v6`: the source prefix's family, when known (else what
    /// depends on it is not checked). `broken`: keys given whose values
    /// could not be read (unset here): what follows only from them (a
    /// dport "needs a protocol" when the protocol was not one) is not said.
    pub fn checked(
        t: &ClassText,
        v6: Option<bool>,
        broken: &[&str],
        found: &mut Vec<(&'static str, Error)>,
    ) -> Option<Class> {
        let before = found.len();
        // Each field: `None` when not known, `Some(None)` when not given.
        fn field<T>(
            key: &'static str,
            given: Option<&str>,
            broken: &[&str],
            parse: impl FnOnce(&str) -> Result<T>,
            found: &mut Vec<(&'static str, Error)>,
        ) -> Option<Option<T>> {
            if broken.contains(&key) {
                return None;
            }
            match given.map(parse) {
                None => Some(None),
                Some(Ok(v)) => Some(Some(v)),
                Some(Err(e)) => {
                    found.push((key, e));
                    None
                }
            }
        }
        let proto = field("proto", t.proto.as_deref(), broken, parse_proto, found);
        let dport = field("dport", t.dport.as_deref(), broken, |s| parse_ports(s, "--dport"), found);
        let sport = field("sport", t.sport.as_deref(), broken, |s| parse_ports(s, "--sport"), found);
        let tcp_flags = field("tcp_flags", t.tcp_flags.as_deref(), broken, parse_flags, found);
        let icmp_type = field(
            "icmp_type",
            t.icmp_type.as_deref(),
            broken,
            |s| {
                s.trim().parse::<u8>().map_err(|_| {
                    Error::Invalid(format!("--icmp-type '{s}': an ICMP type is a number 0 to 255 (8: echo request)"))
                })
            },
            found,
        );
        let dst = field(
            "dst",
            t.dst.as_deref(),
            broken,
            |s| {
                let n = parse_prefix(s).map_err(|e| Error::Invalid(format!("--dst: {e}")))?;
                match v6 {
                    Some(v6) if n.addr().is_ipv6() != v6 => Err(Error::Invalid(format!(
                        "--dst {n}: an {} destination for an {} source prefix",
                        if v6 { "IPv4" } else { "IPv6" },
                        if v6 { "IPv6" } else { "IPv4" }
                    ))),
                    _ => Ok(n),
                }
            },
            found,
        );
        let given = Given {
            dport: matches!(dport, Some(Some(_))),
            sport: matches!(sport, Some(Some(_))),
            tcp_flags: matches!(tcp_flags, Some(Some(_))),
            icmp_type: matches!(icmp_type, Some(Some(_))),
        };
        needs_of_proto(proto, given, v6, found);
        if found.len() > before {
            return None;
        }
        Some(Class {
            proto: proto?,
            dport: dport?,
            sport: sport?,
            tcp_flags: tcp_flags?,
            icmp_type: icmp_type?,
            dst: dst?,
        })
    }

    /// Back to the written form (canonical).
    pub fn text(&self) -> ClassText {
        ClassText {
            proto: self.proto.map(proto_name),
            dport: self.dport.map(ports_text),
            sport: self.sport.map(ports_text),
            tcp_flags: self.tcp_flags.map(|(m, s)| flags_text(m, s)),
            icmp_type: self.icmp_type.map(|t| t.to_string()),
            dst: self.dst.map(|d| d.to_string()),
        }
    }

    /// Fields set.
    fn fields(&self) -> u32 {
        self.proto.is_some() as u32
            + self.dport.is_some() as u32
            + self.sport.is_some() as u32
            + self.tcp_flags.is_some() as u32
            + self.icmp_type.is_some() as u32
            + self.dst.is_some() as u32
    }

    /// Destination ports the class covers (65 536 when it names none).
    fn dport_span(&self) -> u64 {
        span(self.dport)
    }

    /// (Source, destination) port pairs the class covers.
    fn port_pairs(&self) -> u64 {
        span(self.sport) * self.dport_span()
    }

    /// How specific the class is: the greater wins ([module doc](self)).
    pub fn order(&self) -> (u32, std::cmp::Reverse<u64>, u8, u32, std::cmp::Reverse<u64>) {
        (
            self.fields(),
            std::cmp::Reverse(self.port_pairs()),
            self.dst.map_or(0, |d| d.prefix_len()),
            self.tcp_flags.map_or(0, |(m, _)| m.count_ones()),
            std::cmp::Reverse(self.dport_span()),
        )
    }

    /// Whether one frame could match both `self` and `o`.
    pub fn overlaps(&self, o: &Class) -> bool {
        let both = |a: Option<u8>, b: Option<u8>| a.zip(b).is_none_or(|(a, b)| a == b);
        if !both(self.proto, o.proto) || !both(self.icmp_type, o.icmp_type) {
            return false;
        }
        for (a, b) in [(self.dport, o.dport), (self.sport, o.sport)] {
            if let (Some((a0, a1)), Some((b0, b1))) = (a, b)
                && (a1 < b0 || b1 < a0)
            {
                return false;
            }
        }
        if let (Some((am, av)), Some((bm, bv))) = (self.tcp_flags, o.tcp_flags)
            && (av ^ bv) & am & bm != 0
        {
            return false;
        }
        if let (Some(a), Some(b)) = (self.dst, o.dst)
            && !a.contains(&b)
            && !b.contains(&a)
        {
            return false;
        }
        true
    }

    /// Whether a frame matches (the reference the program is tested
    /// against; the program gets there through the index).
    pub fn matches(&self, f: &FrameL4, v6: bool) -> bool {
        if self.proto.is_some_and(|p| p != f.proto) {
            return false;
        }
        if self.needs_l4() && !f.has_l4 {
            return false;
        }
        if self.dport.is_some_and(|(lo, hi)| !(lo..=hi).contains(&f.dport)) {
            return false;
        }
        if self.sport.is_some_and(|(lo, hi)| !(lo..=hi).contains(&f.sport)) {
            return false;
        }
        if self.tcp_flags.is_some_and(|(m, s)| f.tcp_flags & m != s) {
            return false;
        }
        if self.icmp_type.is_some_and(|t| t != f.icmp_type) {
            return false;
        }
        if let Some(d) = self.dst {
            let a: IpAddr = if v6 {
                std::net::Ipv6Addr::from(f.dst).into()
            } else {
                std::net::Ipv4Addr::new(f.dst[12], f.dst[13], f.dst[14], f.dst[15]).into()
            };
            if !d.contains(&a) {
                return false;
            }
        }
        true
    }

    /// Whether the class reads the layer-4 header (a port, TCP flags or an
    /// ICMP type).
    fn needs_l4(&self) -> bool {
        self.dport.is_some() || self.sport.is_some() || self.tcp_flags.is_some() || self.icmp_type.is_some()
    }

    /// The program's form of this class, with its rule.
    pub fn candidate(&self, rule: Rule) -> ClassCand {
        let mut c = ClassCand {
            rule,
            dst: [0; 16],
            dst_mask: [0; 16],
            needs: 0,
            tcp_mask: 0,
            tcp_flags: 0,
            icmp_type: 0,
            sport_lo: 0,
            sport_hi: 0,
        };
        if self.needs_l4() {
            c.needs |= NEEDS_L4;
        }
        if let Some((lo, hi)) = self.sport {
            c.needs |= NEEDS_SPORT;
            (c.sport_lo, c.sport_hi) = (lo, hi);
        }
        if let Some((m, s)) = self.tcp_flags {
            c.needs |= NEEDS_TCP_FLAGS;
            (c.tcp_mask, c.tcp_flags) = (m, s);
        }
        if let Some(t) = self.icmp_type {
            c.needs |= NEEDS_ICMP_TYPE;
            c.icmp_type = t;
        }
        if let Some(d) = self.dst {
            c.needs |= NEEDS_DST;
            match d {
                IpNet::V4(n) => {
                    c.dst = mapped_v4(n.network().octets());
                    // The frame's destination is mapped alike (the program
                    // reads IPv4 destinations as ::ffff:a.b.c.d).
                    c.dst_mask = mapped_v4(n.netmask().octets());
                }
                IpNet::V6(n) => {
                    c.dst = n.network().octets();
                    c.dst_mask = n.netmask().octets();
                }
            }
        }
        c
    }
}

impl fmt::Display for Class {
    /// `udp dport 53`, `udp sport 123`, `tcp flags syn,!ack`, `icmp type 8`,
    /// `dst 192.0.2.10/32`; `-` for no class.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("-");
        }
        let t = self.text();
        let mut parts = Vec::new();
        if let Some(p) = t.proto {
            parts.push(p);
        }
        if let Some(p) = t.sport {
            parts.push(format!("sport {p}"));
        }
        if let Some(p) = t.dport {
            parts.push(format!("dport {p}"));
        }
        if let Some(p) = t.tcp_flags {
            parts.push(format!("flags {p}"));
        }
        if let Some(p) = t.icmp_type {
            parts.push(format!("type {p}"));
        }
        if let Some(p) = t.dst {
            parts.push(format!("dst {p}"));
        }
        f.write_str(&parts.join(" "))
    }
}

/// Refuses two classes of one prefix that tie: neither is more specific
/// ([`Class::order`]) and one frame could match both.
pub fn check_ties<'a>(rules: impl IntoIterator<Item = (&'a IpNet, &'a Class)>) -> Result<()> {
    let mut by_prefix: BTreeMap<&IpNet, Vec<&Class>> = BTreeMap::new();
    for (n, c) in rules {
        if !c.is_none() {
            by_prefix.entry(n).or_default().push(c);
        }
    }
    for (net, classes) in by_prefix {
        for (i, a) in classes.iter().enumerate() {
            for b in &classes[i + 1..] {
                if a != b && a.order() == b.order() && a.overlaps(b) {
                    return Err(Error::Invalid(format!(
                        "{net}: the classes '{a}' and '{b}' tie: the same frame can match both and neither is more \
                         specific (more fields, narrower port ranges, a longer --dst, more --tcp-flags win); \
                         make one narrower, or remove one"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Which of the fields that need a protocol a class gives.
#[derive(Clone, Copy)]
struct Given {
    dport: bool,
    sport: bool,
    tcp_flags: bool,
    icmp_type: bool,
}

/// What a class's fields need of its protocol, when the protocol is known
/// (`proto`: `None` not known, `Some(None)` not given): each problem into
/// `found`.
fn needs_of_proto(
    proto: Option<Option<u8>>,
    Given { dport, sport, tcp_flags, icmp_type }: Given,
    v6: Option<bool>,
    found: &mut Vec<(&'static str, Error)>,
) {
    if let (true, Some(proto)) = (dport, proto)
        && !proto.is_some_and(|p| PROTOS_WITH_PORTS.contains(&p))
    {
        found.push((
            "dport",
            Error::Invalid("--dport needs a protocol with ports: --proto tcp, udp, sctp or udplite".into()),
        ));
    }
    if let (true, Some(proto)) = (sport, proto)
        && !proto.is_some_and(|p| PROTOS_WITH_SPORTS.contains(&p))
    {
        found.push(("sport", Error::Invalid("--sport needs --proto tcp or udp".into())));
    }
    if let (true, Some(proto)) = (tcp_flags, proto)
        && proto != Some(IPPROTO_TCP)
    {
        found.push(("tcp_flags", Error::Invalid("--tcp-flags needs --proto tcp".into())));
    }
    if let (Some(Some(p)), Some(v6)) = (proto, v6) {
        let wrong_icmp = if v6 { IPPROTO_ICMP } else { IPPROTO_ICMPV6 };
        if p == wrong_icmp {
            found.push((
                "proto",
                Error::Invalid(format!(
                    "--proto {}: {} source prefix; use --proto {}",
                    proto_name(p),
                    if v6 { "an IPv6" } else { "an IPv4" },
                    if v6 { "icmpv6" } else { "icmp" }
                )),
            ));
        }
    }
    if let (true, Some(proto)) = (icmp_type, proto)
        && !matches!(proto, Some(IPPROTO_ICMP) | Some(IPPROTO_ICMPV6))
    {
        let want = match v6 {
            Some(true) => "icmpv6",
            Some(false) => "icmp",
            None => "icmp or icmpv6",
        };
        found.push(("icmp_type", Error::Invalid(format!("--icmp-type needs --proto {want}"))));
    }
}

#[cfg(test)]
pub(crate) mod tests;
