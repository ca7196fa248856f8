//! Classes as operators write them (`--proto`, `--dport`, `--tcp-flags`,
//! `--icmp-type`, `--dst`), their order, and their compilation into what
//! the program reads (see `policer_common::class`).
//!
//! # Which rule a frame gets
//!
//! 1. The longest source prefix that has any rule (with or without a
//!    class), as before.
//! 2. Among that prefix's classes, the most specific that matches
//!    ([`Class::order`]): more fields beat fewer; then a narrower port
//!    range; then a longer destination prefix; then more TCP flags looked
//!    at. Two classes of one prefix that no field tells apart and that one
//!    frame could match are refused at `rule set` ([`check_ties`]).
//! 3. None matches: the prefix's class-less rule, if it has one; else the
//!    next shorter prefix with a rule, from step 2.
//!
//! Non-first fragments carry no ports, flags or ICMP type: they match only
//! classes that name nothing past the IP header (`--proto`, `--dst`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    net::IpAddr,
};

use ipnet::IpNet;
use policer_common::{
    ACTION_NONE, Rule,
    class::{
        self, ClassCand, ClassFilter, ClassList, ClassLookups, FrameL4, INDEX_GROUP_BITS, INDEX_KEY_BYTES,
        INDEX_PROTO_BITS, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, MAX_CANDIDATES, MAX_CLASS_GROUPS, NEEDS_DST,
        NEEDS_ICMP_TYPE, NEEDS_L4, NEEDS_TCP_FLAGS, PROTOS_WITH_PORTS, RULE_CLASS, TCP_ACK, TCP_CWR, TCP_ECE, TCP_FIN,
        TCP_PSH, TCP_RST, TCP_SYN, TCP_URG, index_key, mapped_v4,
    },
};

use crate::error::{Error, Result};

/// The class of a rule: which of its source prefix's traffic it is for.
/// Every field is optional; none is the prefix's class-less rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Class {
    /// IP protocol number.
    pub proto: Option<u8>,
    /// Destination ports, inclusive.
    pub dport: Option<(u16, u16)>,
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

fn proto_name(p: u8) -> String {
    PROTO_NAMES.iter().find(|(_, n)| *n == p).map_or_else(|| p.to_string(), |(s, _)| (*s).to_string())
}

fn parse_proto(s: &str) -> Result<u8> {
    let t = s.trim().to_ascii_lowercase();
    if let Some((_, p)) = PROTO_NAMES.iter().find(|(n, _)| *n == t) {
        return Ok(*p);
    }
    match t.parse::<u16>() {
        Ok(n) if n <= 255 => Ok(n as u8),
        Ok(_) => Err(Error::Invalid(format!("--proto '{s}': a protocol number is 0..=255"))),
        Err(_) => Err(Error::Invalid(format!(
            "--proto '{s}': unknown protocol (tcp, udp, icmp, icmpv6, sctp, udplite, or a number 0..=255)"
        ))),
    }
}

fn parse_port(s: &str, whole: &str) -> Result<u16> {
    let t = s.trim();
    match t.parse::<u32>() {
        Ok(n) if n <= 65_535 => Ok(n as u16),
        Ok(_) => Err(Error::Invalid(format!("--dport '{whole}': port {t} out of range 0..=65535"))),
        Err(_) => Err(Error::Invalid(format!("--dport '{whole}': '{t}' is not a port number (PORT or LOW-HIGH)"))),
    }
}

fn parse_ports(s: &str) -> Result<(u16, u16)> {
    match s.split_once('-') {
        None => {
            let p = parse_port(s, s)?;
            Ok((p, p))
        }
        Some((lo, hi)) => {
            let (lo, hi) = (parse_port(lo, s)?, parse_port(hi, s)?);
            if hi < lo {
                return Err(Error::Invalid(format!("--dport '{s}': HIGH ({hi}) is below LOW ({lo})")));
            }
            Ok((lo, hi))
        }
    }
}

fn parse_flags(s: &str) -> Result<(u8, u8)> {
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

    /// Validates a class of a rule for a source prefix of family `v6`.
    pub fn parse(t: &ClassText, v6: bool) -> Result<Class> {
        let proto = t.proto.as_deref().map(parse_proto).transpose()?;
        let dport = t.dport.as_deref().map(parse_ports).transpose()?;
        let tcp_flags = t.tcp_flags.as_deref().map(parse_flags).transpose()?;
        let icmp_type = match t.icmp_type.as_deref() {
            Some(s) => Some(s.trim().parse::<u8>().map_err(|_| {
                Error::Invalid(format!("--icmp-type '{s}': an ICMP type is a number 0..=255 (8: echo request)"))
            })?),
            None => None,
        };
        let dst = match t.dst.as_deref() {
            Some(s) => {
                let n = crate::rules::parse_prefix(s).map_err(|e| Error::Invalid(format!("--dst: {e}")))?;
                if n.addr().is_ipv6() != v6 {
                    return Err(Error::Invalid(format!(
                        "--dst {n}: an {} destination for an {} source prefix",
                        if v6 { "IPv4" } else { "IPv6" },
                        if v6 { "IPv6" } else { "IPv4" }
                    )));
                }
                Some(n)
            }
            None => None,
        };
        if dport.is_some() && !proto.is_some_and(|p| PROTOS_WITH_PORTS.contains(&p)) {
            return Err(Error::Invalid(
                "--dport needs a protocol with ports: --proto tcp, udp, sctp or udplite".into(),
            ));
        }
        if tcp_flags.is_some() && proto != Some(IPPROTO_TCP) {
            return Err(Error::Invalid("--tcp-flags needs --proto tcp".into()));
        }
        if let Some(p) = proto {
            let wrong_icmp = if v6 { IPPROTO_ICMP } else { IPPROTO_ICMPV6 };
            if p == wrong_icmp {
                return Err(Error::Invalid(format!(
                    "--proto {}: {} source prefix; use --proto {}",
                    proto_name(p),
                    if v6 { "an IPv6" } else { "an IPv4" },
                    if v6 { "icmpv6" } else { "icmp" }
                )));
            }
        }
        if icmp_type.is_some() && !matches!(proto, Some(IPPROTO_ICMP) | Some(IPPROTO_ICMPV6)) {
            return Err(Error::Invalid(format!("--icmp-type needs --proto {}", if v6 { "icmpv6" } else { "icmp" })));
        }
        Ok(Class { proto, dport, tcp_flags, icmp_type, dst })
    }

    /// Back to the written form (canonical).
    pub fn text(&self) -> ClassText {
        ClassText {
            proto: self.proto.map(proto_name),
            dport: self.dport.map(|(lo, hi)| if lo == hi { lo.to_string() } else { format!("{lo}-{hi}") }),
            tcp_flags: self.tcp_flags.map(|(m, s)| flags_text(m, s)),
            icmp_type: self.icmp_type.map(|t| t.to_string()),
            dst: self.dst.map(|d| d.to_string()),
        }
    }

    /// Fields set.
    fn fields(&self) -> u32 {
        self.proto.is_some() as u32
            + self.dport.is_some() as u32
            + self.tcp_flags.is_some() as u32
            + self.icmp_type.is_some() as u32
            + self.dst.is_some() as u32
    }

    /// Ports the class covers (65 536 when it names none).
    fn port_span(&self) -> u32 {
        self.dport.map_or(65_536, |(lo, hi)| u32::from(hi - lo) + 1)
    }

    /// How specific the class is: the greater wins ([module doc](self)).
    pub fn order(&self) -> (u32, std::cmp::Reverse<u32>, u8, u32) {
        (
            self.fields(),
            std::cmp::Reverse(self.port_span()),
            self.dst.map_or(0, |d| d.prefix_len()),
            self.tcp_flags.map_or(0, |(m, _)| m.count_ones()),
        )
    }

    /// Whether one frame could match both `self` and `o`.
    pub fn overlaps(&self, o: &Class) -> bool {
        let both = |a: Option<u8>, b: Option<u8>| a.zip(b).is_none_or(|(a, b)| a == b);
        if !both(self.proto, o.proto) || !both(self.icmp_type, o.icmp_type) {
            return false;
        }
        if let (Some((a0, a1)), Some((b0, b1))) = (self.dport, o.dport)
            && (a1 < b0 || b1 < a0)
        {
            return false;
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
        let needs_l4 = self.dport.is_some() || self.tcp_flags.is_some() || self.icmp_type.is_some();
        if needs_l4 && !f.has_l4 {
            return false;
        }
        if self.dport.is_some_and(|(lo, hi)| !(lo..=hi).contains(&f.dport)) {
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

    /// The program's form of this class, with its rule.
    fn candidate(&self, rule: Rule) -> ClassCand {
        let mut c = ClassCand {
            rule,
            dst: [0; 16],
            dst_mask: [0; 16],
            needs: 0,
            tcp_mask: 0,
            tcp_flags: 0,
            icmp_type: 0,
            _pad: [0; 4],
        };
        if self.dport.is_some() || self.tcp_flags.is_some() || self.icmp_type.is_some() {
            c.needs |= NEEDS_L4;
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
    /// `udp dport 53`, `tcp flags syn,!ack`, `icmp type 8`, `dst 192.0.2.10/32`;
    /// `-` for no class.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_none() {
            return f.write_str("-");
        }
        let t = self.text();
        let mut parts = Vec::new();
        if let Some(p) = t.proto {
            parts.push(p);
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
                         specific (more fields, a narrower port range, a longer --dst, more --tcp-flags win); \
                         make one narrower, or remove one"
                    )));
                }
            }
        }
    }
    Ok(())
}

/// Whether a set of rules compiles (no classes that tie, none crowding a
/// frame): what `rule set`, `reload` and `check` refuse before anything is
/// written. Rules without classes always do, and are not compiled here.
pub fn check_rules<'a>(rules: impl IntoIterator<Item = &'a crate::rules::RuleSpec>) -> Result<()> {
    let rules: Vec<&crate::rules::RuleSpec> = rules.into_iter().collect();
    if rules.iter().all(|s| s.class.is_none()) {
        return Ok(());
    }
    let kernel = rules
        .iter()
        .map(|s| Ok(KernelRule { net: s.net, class: s.class, rule: s.kernel(0)?, ban: s.ban.is_some() }))
        .collect::<Result<Vec<_>>>()?;
    compile(&kernel, &mut Groups::default()).map(|_| ())
}

/// A rule in force, as [`compile`] takes it: its prefix, class, and kernel
/// value (counter slot, id and flags already set).
#[derive(Clone, Debug)]
pub struct KernelRule {
    pub net: IpNet,
    pub class: Class,
    pub rule: Rule,
    /// A manual ban: its deny value replaces the rules of every prefix it
    /// covers (theirs come back when it ends).
    pub ban: bool,
}

/// A `CLASS_INDEX` key: prefix length and data ([`index_key`]).
pub type IndexKey = (u32, [u8; policer_common::class::INDEX_KEY_BYTES]);

/// What the kernel's rule maps hold for a set of rules.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Compiled {
    /// The tries: each prefix with any rule, and its rule there (the
    /// class-less rule, or the fallback, with the group of its classes).
    pub prefixes: BTreeMap<IpNet, Rule>,
    /// The class index.
    pub index: BTreeMap<IndexKey, ClassList>,
    /// Each group's filter (`CLASS_FILTER`): which frames can match.
    pub filters: BTreeMap<u32, ClassFilter>,
}

/// Group ids (`1..MAX_CLASS_GROUPS`) for prefixes with classes: stable
/// while a prefix has classes, and not handed to another prefix in the
/// change that frees them (a new group's entries go in before the prefix
/// points at it, an old one's come out after), nor in the next.
#[derive(Clone, Debug, Default)]
pub struct Groups {
    of: BTreeMap<IpNet, u32>,
    /// Freed by the last compile.
    resting: BTreeSet<u32>,
}

impl Groups {
    /// Groups as found in the kernel (adoption).
    pub fn adopt(&mut self, prefixes: impl IntoIterator<Item = (IpNet, u32)>) {
        for (n, g) in prefixes {
            if g != 0 {
                self.of.insert(n, g);
            }
        }
    }

    fn take(&mut self, net: IpNet, used: &BTreeSet<u32>) -> Result<u32> {
        if let Some(g) = self.of.get(&net) {
            return Ok(*g);
        }
        let g = (1..MAX_CLASS_GROUPS).find(|g| !used.contains(g) && !self.resting.contains(g)).ok_or_else(|| {
            Error::Invalid(format!(
                "{net}: at most {} source prefixes can have classes; nothing changed",
                MAX_CLASS_GROUPS - 1
            ))
        })?;
        self.of.insert(net, g);
        Ok(g)
    }
}

/// Bit `p % 64` of each protocol `p`.
fn proto_bit(p: u8) -> u64 {
    1u64 << (p & 63)
}

/// The next shorter prefix with any rule that contains `net`.
fn parent<'a>(net: &IpNet, prefixes: &'a BTreeSet<IpNet>) -> Option<&'a IpNet> {
    let mut best: Option<&IpNet> = None;
    for p in prefixes {
        if p != net && p.prefix_len() < net.prefix_len() && p.contains(net) {
            best = match best {
                Some(b) if b.prefix_len() >= p.prefix_len() => Some(b),
                _ => Some(p),
            };
        }
    }
    best
}

/// The kernel's rule maps for `rules` ([module doc](self)). Fails when a
/// frame could have more than [`MAX_CANDIDATES`] classes to choose from.
pub fn compile(rules: &[KernelRule], groups: &mut Groups) -> Result<Compiled> {
    let bans = Bans::new(rules.iter().filter(|r| r.ban).map(|r| (r.net, r.rule)));
    if bans.is_empty() {
        return compile_rules(rules, groups);
    }
    // Rules under a ban are not compiled (their classes need no group
    // while they cannot match); the prefixes they leave take the ban's
    // value, and each ban its own.
    let kept: Vec<KernelRule> = rules.iter().filter(|r| !r.ban && bans.covering(&r.net).is_none()).cloned().collect();
    let mut out = compile_rules(&kept, groups)?;
    for r in rules.iter().filter(|r| !r.ban) {
        if let Some(b) = bans.covering(&r.net) {
            out.prefixes.insert(r.net, b);
        }
    }
    for net in bans.by_net.keys() {
        out.prefixes.insert(*net, bans.covering(net).expect("a ban covers itself"));
    }
    Ok(out)
}

/// Manual bans by prefix, and the prefix lengths they have (few), so that
/// finding the ban over a prefix costs a lookup per length, not per ban.
struct Bans {
    by_net: std::collections::HashMap<IpNet, Rule>,
    lens: BTreeSet<(bool, u8)>,
}

impl Bans {
    fn new(bans: impl Iterator<Item = (IpNet, Rule)>) -> Bans {
        let by_net: std::collections::HashMap<IpNet, Rule> = bans.collect();
        let lens = by_net.keys().map(|n| (n.addr().is_ipv6(), n.prefix_len())).collect();
        Bans { by_net, lens }
    }

    fn is_empty(&self) -> bool {
        self.by_net.is_empty()
    }

    /// The value of the most specific ban whose prefix holds `net`.
    fn covering(&self, net: &IpNet) -> Option<Rule> {
        let v6 = net.addr().is_ipv6();
        self.lens
            .iter()
            .rev()
            .filter(|(f, len)| *f == v6 && *len <= net.prefix_len())
            .find_map(|(_, len)| IpNet::new(net.addr(), *len).ok().and_then(|n| self.by_net.get(&n.trunc())).copied())
    }
}

/// [`compile`] without bans.
fn compile_rules(rules: &[KernelRule], groups: &mut Groups) -> Result<Compiled> {
    check_ties(rules.iter().map(|r| (&r.net, &r.class)))?;
    let mut classless: BTreeMap<IpNet, Rule> = BTreeMap::new();
    let mut classes: BTreeMap<IpNet, Vec<(Class, Rule)>> = BTreeMap::new();
    for r in rules {
        if r.class.is_none() {
            classless.insert(r.net, r.rule);
        } else {
            let mut rule = r.rule;
            rule.flags |= RULE_CLASS;
            rule.classes = 0;
            classes.entry(r.net).or_default().push((r.class, rule));
        }
    }
    // Forget the groups of prefixes that no longer have classes; they rest
    // for a change before another prefix may have them.
    let before = groups.of.clone();
    groups.of.retain(|n, _| classes.contains_key(n));
    let freed: BTreeSet<u32> = before.values().filter(|g| !groups.of.values().any(|h| h == *g)).copied().collect();
    let mut used: BTreeSet<u32> = groups.of.values().copied().collect();
    used.extend(&groups.resting);
    let all: BTreeSet<IpNet> = classless.keys().chain(classes.keys()).copied().collect();
    let mut out = Compiled::default();
    // Class-less prefixes without classes: as before. (Only prefixes with
    // classes need their ancestors; keep this linear for 100 000 rules.)
    for (n, r) in &classless {
        if !classes.contains_key(n) {
            out.prefixes.insert(*n, *r);
        }
    }
    for net in classes.keys() {
        // The chain: this prefix's classes, then (while no class-less rule
        // stops it) each shorter prefix's.
        let mut chain: Vec<(Class, Rule)> = Vec::new();
        let mut fallback: Option<Rule> = None;
        let mut at = Some(net);
        while let Some(p) = at {
            let mut own = classes.get(p).cloned().unwrap_or_default();
            // Most specific first; ties were refused.
            own.sort_by(|a, b| b.0.order().cmp(&a.0.order()).then(a.0.cmp(&b.0)));
            chain.extend(own);
            if let Some(r) = classless.get(p) {
                fallback = Some(*r);
                break;
            }
            at = parent(p, &all);
        }
        let group = groups.take(*net, &used)?;
        used.insert(group);
        let mut value = fallback.unwrap_or_else(|| {
            let mut r = Rule::packets(1, 1).expect("valid");
            r.action = ACTION_NONE;
            r
        });
        value.classes = group;
        value.class_protos = chain.iter().fold(0, |m, (c, _)| m | c.proto.map_or(u64::MAX, proto_bit));
        out.prefixes.insert(*net, value);
        index_group(group, net, &chain, &mut out.index)?;
        out.filters.insert(group, filter(&chain));
    }
    groups.resting = freed;
    Ok(out)
}

/// Which frames a chain of classes can match: a protocol with a class that
/// names no port (or a class that names no protocol) is looked up for
/// every frame; otherwise the ports its classes name.
fn filter(chain: &[(Class, Rule)]) -> ClassFilter {
    let mut f = ClassFilter::default();
    for (c, _) in chain {
        match (c.proto, c.dport) {
            (None, _) => {
                for p in 0..=255 {
                    f.set_any(p);
                }
            }
            (Some(p), None) => f.set_any(p),
            (Some(p), Some((lo, hi))) => f.set_ports(p, lo, hi),
        }
    }
    f
}

/// The index entries of one group: for each protocol the classes name,
/// the port space cut where the set of classes changes, each piece as
/// aligned blocks.
fn index_group(
    group: u32,
    net: &IpNet,
    chain: &[(Class, Rule)],
    index: &mut BTreeMap<IndexKey, ClassList>,
) -> Result<()> {
    let list = |members: &mut dyn Iterator<Item = &(Class, Rule)>, what: &str| -> Result<ClassList> {
        let members: Vec<&(Class, Rule)> = members.collect();
        if members.len() > MAX_CANDIDATES {
            return Err(Error::Invalid(format!(
                "{net}: {} classes (of this prefix and the shorter ones it falls to) can match the same frame \
                 ({what}); at most {MAX_CANDIDATES}",
                members.len()
            )));
        }
        let mut l = ClassList { len: members.len() as u32, _pad: 0, cands: [empty_cand(); MAX_CANDIDATES] };
        for (i, (c, r)) in members.into_iter().enumerate() {
            l.cands[i] = c.candidate(*r);
        }
        Ok(l)
    };
    // Every protocol: the classes without one.
    let any = list(&mut chain.iter().filter(|(c, _)| c.proto.is_none()), "any protocol")?;
    if any.len > 0 {
        index.insert((INDEX_GROUP_BITS, index_key(group, 0, 0)), any);
    }
    let protos: BTreeSet<u8> = chain.iter().filter_map(|(c, _)| c.proto).collect();
    for p in protos {
        let of_proto = |c: &Class| c.proto.is_none_or(|q| q == p);
        let name = proto_name(p);
        // All ports: the classes of this protocol without ports.
        let portless = list(&mut chain.iter().filter(|(c, _)| of_proto(c) && c.dport.is_none()), &name)?;
        index.insert((INDEX_PROTO_BITS, index_key(group, p, 0)), portless);
        // Where the port classes change.
        let mut cuts: BTreeSet<u32> = BTreeSet::new();
        for (c, _) in chain.iter().filter(|(c, _)| c.proto == Some(p)) {
            if let Some((lo, hi)) = c.dport {
                cuts.insert(lo.into());
                cuts.insert(u32::from(hi) + 1);
            }
        }
        let cuts: Vec<u32> = cuts.into_iter().collect();
        for w in cuts.windows(2) {
            let (lo, hi) = (w[0], w[1] - 1);
            let covering = |c: &Class| c.dport.is_none_or(|(a, b)| u32::from(a) <= lo && hi <= u32::from(b));
            if !chain.iter().any(|(c, _)| c.proto == Some(p) && c.dport.is_some() && covering(c)) {
                continue;
            }
            let what = if lo == hi { format!("{name} port {lo}") } else { format!("{name} ports {lo}-{hi}") };
            let l = list(&mut chain.iter().filter(|(c, _)| of_proto(c) && covering(c)), &what)?;
            for (start, bits) in blocks(lo, hi) {
                index.insert((INDEX_PROTO_BITS + 16 - bits, index_key(group, p, start as u16)), l);
            }
        }
    }
    Ok(())
}

fn empty_cand() -> ClassCand {
    Class::default().candidate(Rule::packets(1, 1).expect("valid"))
}

/// `lo..=hi` as aligned blocks: (start, log2 of the size).
fn blocks(mut lo: u32, hi: u32) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    while lo <= hi {
        let mut bits = if lo == 0 { 16 } else { lo.trailing_zeros().min(16) };
        while lo + (1 << bits) - 1 > hi {
            bits -= 1;
        }
        out.push((lo, bits));
        lo += 1 << bits;
    }
    out
}

/// The rule a frame from `src` gets, by the rules themselves (the
/// reference the compiled maps are tested against): `None` when no rule
/// applies.
pub fn resolve<'a>(rules: &'a [KernelRule], src: IpAddr, f: &FrameL4) -> Option<&'a KernelRule> {
    let v6 = src.is_ipv6();
    let mut prefixes: Vec<&IpNet> = rules.iter().map(|r| &r.net).filter(|n| n.contains(&src)).collect();
    prefixes.sort_by_key(|n| std::cmp::Reverse(n.prefix_len()));
    prefixes.dedup();
    for p in prefixes {
        let mut own: Vec<&KernelRule> = rules.iter().filter(|r| &r.net == p && !r.class.is_none()).collect();
        own.sort_by(|a, b| b.class.order().cmp(&a.class.order()).then(a.class.cmp(&b.class)));
        if let Some(r) = own.into_iter().find(|r| r.class.matches(f, v6)) {
            return Some(r);
        }
        if let Some(r) = rules.iter().find(|r| &r.net == p && r.class.is_none()) {
            return Some(r);
        }
    }
    None
}

/// The rule the compiled maps give a frame from `src`, looked up as the
/// program does: the trie's longest match, then the program's own class
/// choice (policer_common::class::select) on the compiled index. `None`
/// for no rule.
pub fn lookup(c: &Compiled, src: IpAddr, f: &FrameL4) -> Option<Rule> {
    let best = c.prefixes.iter().filter(|(n, _)| n.contains(&src)).max_by_key(|(n, _)| n.prefix_len())?.1;
    let rule = *class::select(best, f.proto, &mut CompiledLookups { c, frame: f }).unwrap_or(best);
    (rule.action != ACTION_NONE).then_some(rule)
}

/// The compiled maps and one frame, read as the program reads its maps and
/// the frame's headers.
struct CompiledLookups<'a> {
    c: &'a Compiled,
    frame: &'a FrameL4,
}

impl<'a> ClassLookups<'a> for CompiledLookups<'a> {
    fn l4(&mut self, proto: u8) -> FrameL4 {
        // The program reads nothing past the IP header of a frame without
        // a layer-4 header.
        let f = self.frame;
        if f.has_l4 { FrameL4 { proto, dst: [0; 16], ..*f } } else { FrameL4 { proto, ..FrameL4::default() } }
    }

    fn filter(&mut self, group: u32) -> Option<&'a ClassFilter> {
        self.c.filters.get(&group)
    }

    fn dst(&mut self) -> Option<[u8; 16]> {
        Some(self.frame.dst)
    }

    /// The trie's longest match.
    fn index(&mut self, key: [u8; INDEX_KEY_BYTES]) -> Option<&'a ClassList> {
        let hits = self.c.index.iter().filter(|((bits, k), _)| prefix_eq(k, &key, *bits));
        hits.max_by_key(|((bits, _), _)| *bits).map(|(_, l)| l)
    }
}

fn prefix_eq(a: &[u8], b: &[u8], bits: u32) -> bool {
    let full = (bits / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rest = bits % 8;
    rest == 0 || (a[full] ^ b[full]) >> (8 - rest) == 0
}

#[cfg(test)]
mod tests;
