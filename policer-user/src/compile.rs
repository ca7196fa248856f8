//! The rules→kernel compiler: a set of rules in force (prefix, class,
//! kernel value) becomes what the program's rule maps hold — the tries'
//! value of each prefix, the class index and each group's filter — with
//! manual bans over the rules under them. Which rule a frame gets is told
//! in [`crate::classes`]; writing the result is [`crate::loader`]'s.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use policer_common::{
    ACTION_NONE, Rule,
    class::{
        ClassCand, ClassFilter, ClassList, INDEX_GROUP_BITS, INDEX_PROTO_BITS, MAX_CANDIDATES, MAX_CLASS_GROUPS,
        RULE_CLASS, index_key,
    },
};

use crate::{
    classes::{Class, check_ties, proto_name},
    error::{Error, Result},
    rules::RuleSpec,
};

/// Whether a set of rules compiles (no classes that tie, none crowding a
/// frame): what `policer check` refuses without a daemon. (The daemon
/// compiles a change once, in its plan.) Rules without classes always do,
/// and are not compiled here.
pub fn check_rules<'a>(rules: impl IntoIterator<Item = &'a RuleSpec>) -> Result<()> {
    let rules: Vec<&RuleSpec> = rules.into_iter().collect();
    if rules.iter().all(|s| s.class().is_none()) {
        return Ok(());
    }
    let kernel = rules
        .iter()
        .map(|s| {
            Ok(KernelRule {
                net: s.net,
                class: s.class(),
                rule: s.kernel(0)?,
                ban: s.ban().is_some(),
                inherit: s.inherits(),
            })
        })
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
    /// `inherit` (default true): the classes of shorter prefixes apply
    /// under this prefix; false on any rule of a prefix stops them there
    /// (for the prefix and every longer one under it).
    pub inherit: bool,
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
#[derive(Clone, Debug, Default, PartialEq, Eq)]
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

    /// As a compile that frees no group leaves them: none resting.
    pub fn settle(&mut self) {
        self.resting.clear();
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

/// Prefixes by family and the lengths they have (few), so that the
/// longest one holding a prefix costs a lookup per length held, not per
/// prefix.
struct Lens<'a, V> {
    map: &'a BTreeMap<IpNet, V>,
    lens: Vec<(bool, u8)>,
}

impl<'a, V> Lens<'a, V> {
    fn new(map: &'a BTreeMap<IpNet, V>) -> Self {
        let mut lens: Vec<(bool, u8)> = map.keys().map(|n| (n.addr().is_ipv6(), n.prefix_len())).collect();
        lens.sort_unstable();
        lens.dedup();
        Lens { map, lens }
    }

    /// The prefixes of the map strictly shorter than `net` that hold it,
    /// longest first.
    fn over(&self, net: &IpNet) -> impl Iterator<Item = (IpNet, &'a V)> + '_ {
        let (v6, len) = (net.addr().is_ipv6(), net.prefix_len());
        let addr = net.addr();
        self.lens.iter().rev().filter(move |(f, l)| *f == v6 && *l < len).filter_map(move |(_, l)| {
            let n = IpNet::new(addr, *l).ok()?.trunc();
            self.map.get(&n).map(|v| (n, v))
        })
    }
}

/// The kernel's rule maps for `rules` (see [`crate::classes`] for which
/// rule a frame gets). Fails when a
/// frame could have more than [`MAX_CANDIDATES`] classes to choose from.
pub fn compile(rules: &[KernelRule], groups: &mut Groups) -> Result<Compiled> {
    let bans = BanIndex::new(rules.iter().filter(|r| r.ban).map(|r| (r.net, r.rule)));
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
struct BanIndex {
    by_net: std::collections::HashMap<IpNet, Rule>,
    lens: BTreeSet<(bool, u8)>,
}

impl BanIndex {
    fn new(bans: impl Iterator<Item = (IpNet, Rule)>) -> BanIndex {
        let by_net: std::collections::HashMap<IpNet, Rule> = bans.collect();
        let lens = by_net.keys().map(|n| (n.addr().is_ipv6(), n.prefix_len())).collect();
        BanIndex { by_net, lens }
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
    // Collected, not inserted one by one: a map built in one go has full
    // nodes, one built by inserts in key order half-empty ones (twice the
    // memory: about 90 bytes a rule, at 100 000 rules 9 MB).
    // (From a vector of its exact size: a filter's collect grows by
    // doubling.)
    let mut sorted = Vec::with_capacity(rules.iter().filter(|r| r.class.is_none()).count());
    sorted.extend(rules.iter().filter(|r| r.class.is_none()).map(|r| (r.net, r.rule)));
    let classless: BTreeMap<IpNet, Rule> = sorted.into_iter().collect();
    let mut classes: BTreeMap<IpNet, Vec<(Class, Rule)>> = BTreeMap::new();
    for r in rules {
        if !r.class.is_none() {
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
    // Where the classes of shorter prefixes stop: a prefix with a rule
    // that says `inherit = false`.
    let stops: BTreeMap<IpNet, ()> = rules.iter().filter(|r| !r.inherit).map(|r| (r.net, ())).collect();
    let (classless_at, class_at, stop_at) = (Lens::new(&classless), Lens::new(&classes), Lens::new(&stops));
    // Class-less prefixes without classes: as before, unless under a
    // prefix with classes (below). Collected in one go, for full nodes:
    // the map is kept as long as the rules are in force.
    let mut out = Compiled {
        prefixes: classless.iter().filter(|(n, _)| !classes.contains_key(n)).map(|(n, r)| (*n, *r)).collect(),
        ..Compiled::default()
    };
    let mut chains: BTreeMap<IpNet, (u32, u64)> = BTreeMap::new();
    for net in classes.keys() {
        let chain = chain_of(net, &classes, &class_at, &stops, &stop_at);
        // A frame of none of the classes: the class-less rule of this
        // prefix or of the next shorter one with one.
        let fallback = classless.get(net).copied().or_else(|| classless_at.over(net).next().map(|(_, r)| *r));
        let group = groups.take(*net, &used)?;
        used.insert(group);
        let mut value = fallback.unwrap_or_else(no_rule);
        value.classes = group;
        value.class_protos = chain.iter().fold(0, |m, (c, _)| m | c.proto.map_or(u64::MAX, proto_bit));
        out.prefixes.insert(*net, value);
        chains.insert(*net, (group, value.class_protos));
        index_group(group, net, &chain, &mut out.index)?;
        out.filters.insert(group, filter(&chain));
    }
    // A class-less prefix under a prefix with classes inherits its chain
    // whole (it adds no class of its own): it shares that prefix's group,
    // with its own rule as the fallback. A cost of a few lookups a rule,
    // and none without classes.
    if !classes.is_empty() {
        for (net, rule) in &classless {
            if classes.contains_key(net) || stops.contains_key(net) {
                continue;
            }
            if let Some(owner) = inherited_from(net, &class_at, &stop_at) {
                let (group, protos) = chains[&owner];
                let mut value = *rule;
                value.classes = group;
                value.class_protos = protos;
                out.prefixes.insert(*net, value);
            }
        }
    }
    groups.resting = freed;
    Ok(out)
}

/// The classes a frame from `net` (a prefix with classes) is matched
/// against, in order: its own, most specific first; then, unless a rule
/// of `net` stops inheritance, each shorter prefix's (longest first, up to
/// and including the nearest prefix that stops it), leaving out a class
/// a longer prefix defines already (that one shadows it).
fn chain_of(
    net: &IpNet,
    classes: &BTreeMap<IpNet, Vec<(Class, Rule)>>,
    class_at: &Lens<'_, Vec<(Class, Rule)>>,
    stops: &BTreeMap<IpNet, ()>,
    stop_at: &Lens<'_, ()>,
) -> Vec<(Class, Rule)> {
    let sorted = |p: &IpNet| {
        let mut own = classes.get(p).cloned().unwrap_or_default();
        // Most specific first; ties were refused.
        own.sort_by(|a, b| b.0.order().cmp(&a.0.order()).then(a.0.cmp(&b.0)));
        own
    };
    let mut chain = sorted(net);
    if stops.contains_key(net) {
        return chain;
    }
    let floor = stop_at.over(net).next().map_or(0, |(s, _)| s.prefix_len());
    for (p, _) in class_at.over(net).take_while(|(p, _)| p.prefix_len() >= floor) {
        for (c, r) in sorted(&p) {
            if !chain.iter().any(|(d, _)| *d == c) {
                chain.push((c, r));
            }
        }
    }
    chain
}

/// The prefix with classes whose chain a class-less prefix `net` (without
/// classes, not stopping inheritance) inherits: the longest with classes
/// over it, unless a prefix between them stops inheritance.
fn inherited_from(net: &IpNet, class_at: &Lens<'_, Vec<(Class, Rule)>>, stop_at: &Lens<'_, ()>) -> Option<IpNet> {
    let (owner, _) = class_at.over(net).next()?;
    match stop_at.over(net).next() {
        Some((s, _)) if s.prefix_len() > owner.prefix_len() => None,
        _ => Some(owner),
    }
}

/// The tries' value of a prefix with classes and no class-less rule to
/// fall back to: a frame of none of its classes gets no rule.
pub(crate) fn no_rule() -> Rule {
    let mut r = Rule::packets(1, 1).expect("valid");
    r.action = ACTION_NONE;
    r
}

/// Which frames a chain of classes can match: a protocol with a class that
/// names no port (or a class that names no protocol) is looked up for
/// every frame; otherwise the destination ports its classes name, and the
/// source ports of those that name only a source port.
fn filter(chain: &[(Class, Rule)]) -> ClassFilter {
    let mut f = ClassFilter::default();
    for (c, _) in chain {
        match (c.proto, c.dport, c.sport) {
            (None, _, _) => {
                for p in 0..=255 {
                    f.set_any(p);
                }
            }
            (Some(p), None, None) => f.set_any(p),
            (Some(p), Some((lo, hi)), _) => f.set_ports(p, lo, hi),
            (Some(p), None, Some((lo, hi))) => f.set_sports(p, lo, hi),
        }
    }
    f
}

/// The index entries of one group: for each protocol the classes name,
/// the destination port space cut where the set of classes changes, each
/// piece as aligned blocks. (The source port is the candidates' to match:
/// a class with a source port and no destination port is in its
/// protocol's entry and every port's.)
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
                "{net}: {} classes (of this prefix and the shorter ones it falls to) are candidates for the same \
                 frame ({what}; a class with a --sport and no --dport is one for every port of its protocol); at \
                 most {MAX_CANDIDATES}",
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

#[cfg(test)]
use policer_common::class::FrameL4;

/// The rule the compiled maps give a frame from `src`, looked up as the
/// program does (the tests' model of it): the trie's longest match, then the program's own class
/// choice (policer_common::class::select) on the compiled index. `None`
/// for no rule.
#[cfg(test)]
pub fn lookup(c: &Compiled, src: std::net::IpAddr, f: &FrameL4) -> Option<Rule> {
    let best = c.prefixes.iter().filter(|(n, _)| n.contains(&src)).max_by_key(|(n, _)| n.prefix_len())?.1;
    let rule = *policer_common::class::select(best, f.proto, &mut CompiledLookups { c, frame: f }).unwrap_or(best);
    (rule.action != ACTION_NONE).then_some(rule)
}

/// The compiled maps and one frame, read as the program reads its maps and
/// the frame's headers.
#[cfg(test)]
struct CompiledLookups<'a> {
    c: &'a Compiled,
    frame: &'a FrameL4,
}

#[cfg(test)]
impl<'a> policer_common::class::ClassLookups<'a> for CompiledLookups<'a> {
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
    fn index(&mut self, key: [u8; policer_common::class::INDEX_KEY_BYTES]) -> Option<&'a ClassList> {
        let hits = self.c.index.iter().filter(|((bits, k), _)| prefix_eq(k, &key, *bits));
        hits.max_by_key(|((bits, _), _)| *bits).map(|(_, l)| l)
    }
}

#[cfg(test)]
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
