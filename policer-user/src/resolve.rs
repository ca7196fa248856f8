//! The host's one answer to "which entry covers this source (and this
//! frame's class), what it gets, and what else covers it", over the rules,
//! manual bans, sets and protected prefixes in force. `policer inspect`,
//! the dry run and the tests' oracle ask it; the compiled tries are the
//! kernel's truth, and the property test at the end of this file holds
//! the two equal.
//!
//! What the tries hold over a source, as their writers put it there:
//! - at a prefix of a rule or ban ([`crate::compile::compile`]): the
//!   longest manual ban over it if one is (a ban drops everything under
//!   it), else its class-less rule, else — the prefix has classes — the
//!   class-less rule it falls back to (the next shorter prefix's with one)
//!   or no rule; a protected prefix there, or over it, turns any value but
//!   a plain allow into its own allow ([`Protect::apply`]);
//! - at a protected prefix with no rule: its allow;
//! - at a set entry with no rule: the longest manual ban over it unless a
//!   protected prefix holds it, else the value of the set of highest
//!   [`precedence`] among those holding it (`daemon/sets.rs` writes them).
//!
//! The program takes the longest prefix the tries hold; where its value
//! has classes, a frame is matched against the classes of that prefix
//! and of each shorter one (up to the nearest that says `inherit =
//! false`), most specific first ([`crate::classes`]); a class-less prefix
//! under one with classes has them too.
//!
//! [`Protect::apply`]: crate::protect::Protect::apply

use std::{cmp::Reverse, net::IpAddr, sync::Arc};

use ipnet::IpNet;
use policer_common::{
    Rule,
    bucket::Action,
    class::{FrameL4, RULE_CLASS},
};

use crate::{classes::Class, compile::KernelRule, protect::protected_rule};

/// A rule or manual ban as a [`RuleSource`] holds it: its prefix, class,
/// kernel value (counter slot set) and the caller's key for it.
#[derive(Debug)]
pub struct Entry<'a, K> {
    pub net: IpNet,
    pub class: Class,
    pub value: Rule,
    pub ban: bool,
    /// `inherit` (false: the classes of shorter prefixes stop at this
    /// prefix).
    pub inherit: bool,
    pub key: &'a K,
}

impl<K> Clone for Entry<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Entry<'_, K> {}

/// Where the resolver reads the rules and manual bans.
pub trait RuleSource {
    type Key;
    /// Every prefix that has a rule or a ban (repeats are fine).
    fn nets(&self) -> impl Iterator<Item = IpNet> + '_;
    /// Appends the rules and bans of exactly `net`, in key order.
    fn at<'s>(&'s self, net: IpNet, out: &mut Vec<Entry<'s, Self::Key>>);
}

impl RuleSource for [KernelRule] {
    type Key = KernelRule;

    fn nets(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.iter().map(|r| r.net)
    }

    fn at<'s>(&'s self, net: IpNet, out: &mut Vec<Entry<'s, KernelRule>>) {
        for r in self.iter().filter(|r| r.net == net) {
            out.push(Entry { net, class: r.class, value: r.rule, ban: r.ban, inherit: r.inherit, key: r });
        }
    }
}

/// A named set as the tries hold it: its value per family, its entries
/// (sorted), and what decides which set's value a shared entry holds.
#[derive(Clone, Debug)]
pub struct SetList {
    pub name: String,
    pub action: Action,
    pub v4: Rule,
    pub v6: Rule,
    pub entries: Arc<Vec<IpNet>>,
}

impl SetList {
    pub fn rank(&self) -> (u8, Reverse<&str>) {
        precedence(self.action, &self.name)
    }

    pub fn value(&self, v6: bool) -> Rule {
        if v6 { self.v6 } else { self.v4 }
    }

    pub fn holds(&self, net: &IpNet) -> bool {
        self.entries.binary_search(net).is_ok()
    }
}

/// Which set's value a prefix in several sets holds: the higher of
/// (action, name) — deny over police over monitor over allow, and between
/// sets of one action the name that sorts first.
pub fn precedence(action: Action, name: &str) -> (u8, Reverse<&str>) {
    let a = match action {
        Action::Deny => 3,
        Action::Police => 2,
        Action::Monitor => 1,
        Action::Allow => 0,
    };
    (a, Reverse(name))
}

/// The kinds of entries over a source, in the order the program weighs
/// them at one prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Protect,
    Ban,
    Set,
    Rule,
}

/// One entry over a source.
#[derive(Debug)]
pub enum Cover<'a, K> {
    /// A protected prefix.
    Protect(IpNet),
    /// A manual ban.
    Ban(Entry<'a, K>),
    /// An entry of the set of this index (in the resolver's sets).
    Set { set: usize, entry: IpNet },
    /// A rule (class-less or with a class).
    Rule(Entry<'a, K>),
}

impl<K> Clone for Cover<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for Cover<'_, K> {}

impl<K> Cover<'_, K> {
    pub fn net(&self) -> IpNet {
        match self {
            Cover::Protect(n) | Cover::Set { entry: n, .. } => *n,
            Cover::Ban(e) | Cover::Rule(e) => e.net,
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Cover::Protect(_) => Kind::Protect,
            Cover::Ban(_) => Kind::Ban,
            Cover::Set { .. } => Kind::Set,
            Cover::Rule(_) => Kind::Rule,
        }
    }
}

/// What decides the value the tries hold over a source.
#[derive(Debug)]
pub enum By<'a, K> {
    /// No prefix holds the source.
    Nothing,
    /// The protected prefix's allow (the longest protected prefix over
    /// the source).
    Protect(IpNet),
    /// A manual ban.
    Ban(Entry<'a, K>),
    /// The set of this index, at this entry.
    Set { set: usize, entry: IpNet },
    /// The prefix's class-less rule (it has no classes).
    Rule(Entry<'a, K>),
    /// The prefix has classes; a frame of none falls to this class-less
    /// rule (none: to no rule).
    Classes { fallback: Option<Entry<'a, K>> },
}

impl<K> Clone for By<'_, K> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<K> Copy for By<'_, K> {}

/// The resolver's answer for one source (and frame).
#[derive(Debug)]
pub struct Answer<'a, K> {
    /// The longest prefix the tries hold over the source.
    pub prefix: Option<IpNet>,
    pub by: By<'a, K>,
    /// The value the tries hold at `prefix` (`classes`: the group field
    /// is the compiler's; here 0, with [`Answer::classes`] saying whether
    /// there is one).
    pub trie: Option<Rule>,
    /// A frame was given and one of the prefix's classes takes it.
    pub class: Option<Entry<'a, K>>,
}

impl<'a, K> Answer<'a, K> {
    /// Whether the value at the prefix has classes (frames are looked up
    /// in them).
    pub fn classes(&self) -> bool {
        matches!(self.by, By::Classes { .. })
    }

    /// The rule the frame gets (a class's with [`RULE_CLASS`] set, as
    /// compiled); `None`: no rule.
    pub fn rule(&self) -> Option<Rule> {
        if let Some(c) = &self.class {
            let mut r = c.value;
            r.flags |= RULE_CLASS;
            return Some(r);
        }
        self.trie.filter(|r| r.action != policer_common::ACTION_NONE)
    }

    /// The rule or ban the frame gets, if a rule or ban (not a set entry,
    /// not a protected prefix's own allow).
    pub fn entry(&self) -> Option<&Entry<'a, K>> {
        match &self.by {
            _ if self.class.is_some() => self.class.as_ref(),
            By::Ban(e) | By::Rule(e) | By::Classes { fallback: Some(e) } => Some(e),
            _ => None,
        }
    }
}

/// The rules and bans of `R`, the sets and the protected prefixes in force.
pub struct Resolver<'a, R: RuleSource + ?Sized> {
    rules: &'a R,
    sets: &'a [SetList],
    protect: &'a [IpNet],
    /// The prefix lengths of the rules and bans, per family (v6, len).
    lens: Vec<(bool, u8)>,
}

impl<'a, R: RuleSource + ?Sized> Resolver<'a, R> {
    pub fn new(rules: &'a R, sets: &'a [SetList], protect: &'a [IpNet]) -> Self {
        let mut lens: Vec<(bool, u8)> = rules.nets().map(|n| (n.addr().is_ipv6(), n.prefix_len())).collect();
        lens.sort_unstable();
        lens.dedup();
        Resolver { rules, sets, protect, lens }
    }

    pub fn sets(&self) -> &'a [SetList] {
        self.sets
    }

    /// Everything over `addr`: most specific first, and at one prefix in
    /// the order the program weighs them ([`Kind`]); rules in key order,
    /// sets in the resolver's order.
    pub fn covering(&self, addr: IpAddr) -> Vec<Cover<'a, R::Key>> {
        let v6 = addr.is_ipv6();
        let mut out: Vec<Cover<'a, R::Key>> =
            self.protect.iter().filter(|p| p.contains(&addr)).map(|p| Cover::Protect(*p)).collect();
        let mut at = Vec::new();
        for (_, len) in self.lens.iter().filter(|(f, _)| *f == v6) {
            let Ok(net) = IpNet::new(addr, *len).map(|n| n.trunc()) else { continue };
            self.rules.at(net, &mut at);
        }
        out.extend(at.into_iter().map(|e| if e.ban { Cover::Ban(e) } else { Cover::Rule(e) }));
        if !self.sets.is_empty() {
            let max = if v6 { 128 } else { 32 };
            for len in 0..=max {
                let Ok(net) = IpNet::new(addr, len).map(|n| n.trunc()) else { continue };
                for (i, s) in self.sets.iter().enumerate() {
                    if s.holds(&net) {
                        out.push(Cover::Set { set: i, entry: net });
                    }
                }
            }
        }
        out.sort_by_key(|c| (Reverse(c.net().prefix_len()), c.kind()));
        out
    }

    /// Of the sets holding `net`, the one whose value the tries hold there.
    pub fn set_winner(&self, net: &IpNet) -> Option<usize> {
        (0..self.sets.len()).filter(|i| self.sets[*i].holds(net)).max_by_key(|i| self.sets[*i].rank())
    }

    /// What the tries give `addr`, and with `frame`, which of the
    /// prefix's classes takes it.
    pub fn resolve(&self, addr: IpAddr, frame: Option<&FrameL4>) -> Answer<'a, R::Key> {
        self.answer(addr, &self.covering(addr), frame)
    }

    /// [`Resolver::resolve`] from `covers` (what [`Resolver::covering`]
    /// gave for `addr`).
    pub fn answer(&self, addr: IpAddr, covers: &[Cover<'a, R::Key>], frame: Option<&FrameL4>) -> Answer<'a, R::Key> {
        let v6 = addr.is_ipv6();
        let nothing = Answer { prefix: None, by: By::Nothing, trie: None, class: None };
        let Some(l) = covers.first().map(|c| c.net()) else { return nothing };
        let at_l = || covers.iter().take_while(|c| c.net() == l);
        // Every entry over `addr` holds `l` too (both hold `addr`, and
        // none is longer): the longest ban and protected prefix over it.
        let ban = covers.iter().find_map(|c| if let Cover::Ban(e) = c { Some(*e) } else { None });
        let protect = covers.iter().find_map(|c| if let Cover::Protect(p) = c { Some(*p) } else { None });
        let answer = |by: By<'a, R::Key>, trie: Rule| Answer { prefix: Some(l), by, trie: Some(trie), class: None };
        if !at_l().any(|c| c.kind() != Kind::Set) {
            // Only set entries: the ban's over them unless protected.
            if let (Some(b), None) = (ban, protect) {
                return answer(By::Ban(b), b.value);
            }
            let Some(set) = self.set_winner(&l) else { return nothing };
            return answer(By::Set { set, entry: l }, self.sets[set].value(v6));
        }
        let rules = || covers.iter().filter_map(|c| if let Cover::Rule(e) = c { Some(e) } else { None });
        // Its own classes, or (a class-less rule) those of a shorter prefix
        // it inherits, none stopping them between.
        let has_classes = rules().any(|e| e.net == l && !e.class.is_none())
            || rules().next().is_some_and(|e| e.net == l)
                && class_floor(rules(), l).is_some_and(|floor| {
                    rules().any(|e| e.net != l && !e.class.is_none() && e.net.prefix_len() >= floor)
                });
        let (by, value) = match ban {
            Some(b) => (By::Ban(b), b.value),
            None if has_classes => {
                // Falls to the class-less rule of this prefix or the next
                // shorter one with one.
                let fallback = rules().find(|e| e.class.is_none()).copied();
                let value = fallback.map_or_else(crate::compile::no_rule, |e| e.value);
                (By::Classes { fallback }, value)
            }
            None => match rules().find(|e| e.net == l && e.class.is_none()) {
                Some(e) => (By::Rule(*e), e.value),
                // A protected prefix alone.
                None => (By::Protect(l), protected_rule()),
            },
        };
        // A protected prefix over it allows, whatever else would.
        if let Some(p) = protect
            && (value.action != Action::Allow as u32 || matches!(by, By::Classes { .. }))
        {
            return answer(By::Protect(p), protected_rule());
        }
        let mut a = answer(by, value);
        if let (By::Classes { .. }, Some(f)) = (by, frame) {
            a.class = self.class_of(rules(), f, v6);
        }
        a
    }

    /// The class of the longest prefix's chain that takes frame `f`: its
    /// classes, then (unless it stops inheritance) each shorter prefix's
    /// up to the nearest one that stops it, each prefix's most specific
    /// first. (A class a longer prefix defines too never takes a frame
    /// there: the longer one's, the same match, is met first.)
    fn class_of<'e>(
        &self,
        rules: impl Iterator<Item = &'e Entry<'a, R::Key>>,
        f: &FrameL4,
        v6: bool,
    ) -> Option<Entry<'a, R::Key>>
    where
        'a: 'e,
    {
        let rules: Vec<&Entry<'a, R::Key>> = rules.collect();
        let l = rules.first()?.net;
        let floor = class_floor(rules.iter().copied(), l).unwrap_or(l.prefix_len());
        let mut i = 0;
        while i < rules.len() && rules[i].net.prefix_len() >= floor {
            let net = rules[i].net;
            let mut own: Vec<&Entry<'a, R::Key>> =
                rules[i..].iter().take_while(|e| e.net == net).filter(|e| !e.class.is_none()).copied().collect();
            own.sort_by(|a, b| b.class.order().cmp(&a.class.order()).then(a.class.cmp(&b.class)));
            if let Some(e) = own.into_iter().find(|e| e.class.matches(f, v6)) {
                return Some(*e);
            }
            i += rules[i..].iter().take_while(|e| e.net == net).count();
        }
        None
    }
}

/// What the classes of shorter prefixes do under a prefix: those that
/// apply to its sources (inherited), those its own class of the same
/// match overrides (shadowed), and those its `inherit = false` keeps out
/// (hidden); each the longest prefix's of its match, as `(prefix, class)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inheritance {
    pub inherited: Vec<(IpNet, Class)>,
    pub shadowed: Vec<(IpNet, Class)>,
    pub hidden: Vec<(IpNet, Class)>,
}

impl Inheritance {
    /// Of `net`, from `rules`: every rule (not ban) at `net` and at the
    /// shorter prefixes that hold it, as (prefix, class, inherit).
    pub fn of(net: IpNet, rules: &[(IpNet, Class, bool)]) -> Inheritance {
        let mut over: Vec<&(IpNet, Class, bool)> =
            rules.iter().filter(|(n, ..)| *n != net && n.contains(&net)).collect();
        over.sort_by_key(|(n, ..)| Reverse(n.prefix_len()));
        let own = |c: &Class| rules.iter().any(|(n, d, _)| *n == net && d == c);
        let stops = rules.iter().any(|(n, _, i)| *n == net && !i);
        let floor = over.iter().filter(|(.., i)| !i).map(|(n, ..)| n.prefix_len()).max().unwrap_or(0);
        let mut out = Inheritance::default();
        let mut seen: Vec<Class> = Vec::new();
        for (n, c, _) in over.into_iter().filter(|(n, c, _)| !c.is_none() && n.prefix_len() >= floor) {
            if seen.contains(c) {
                continue;
            }
            seen.push(*c);
            let list = match () {
                _ if own(c) => &mut out.shadowed,
                _ if stops => &mut out.hidden,
                _ => &mut out.inherited,
            };
            list.push((*n, *c));
        }
        out
    }

    /// The note a `rule set` reply (and its dry run) ends with; empty when
    /// no class of a shorter prefix reaches the prefix.
    pub fn note(&self) -> String {
        let list = |v: &[(IpNet, Class)]| {
            let mut s: Vec<String> = v.iter().take(8).map(|(n, c)| format!("{n} [{c}]")).collect();
            if v.len() > 8 {
                s.push(format!("and {} more", v.len() - 8));
            }
            s.join(", ")
        };
        let mut out = String::new();
        if !self.inherited.is_empty() {
            out += &format!(
                "; classes of shorter prefixes that still apply to its sources: {} (--no-inherit stops them)",
                list(&self.inherited)
            );
        }
        if !self.shadowed.is_empty() {
            out += &format!("; its own classes override {} for its sources", list(&self.shadowed));
        }
        if !self.hidden.is_empty() {
            out += &format!(
                "; no-inherit: {} no longer apply to its sources (--inherit brings them back)",
                list(&self.hidden)
            );
        }
        out
    }
}

/// How far up the classes of shorter prefixes reach a frame whose
/// longest prefix is `l` (`rules`: those over it, longest first): the
/// length of the nearest shorter prefix that stops inheritance (its own
/// classes still apply), or 0; `None` when `l` itself stops it.
fn class_floor<'e, 'a: 'e, K: 'a>(rules: impl Iterator<Item = &'e Entry<'a, K>> + Clone, l: IpNet) -> Option<u8> {
    if rules.clone().any(|e| e.net == l && !e.inherit) {
        return None;
    }
    Some(rules.filter(|e| e.net != l && !e.inherit).map(|e| e.net.prefix_len()).max().unwrap_or(0))
}

#[cfg(test)]
mod tests;
