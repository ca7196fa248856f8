//! Protected prefixes (`protect = ["192.0.2.0/24", …]` in `[daemon]`):
//! sources that no rule, ban, set or feed may drop, so that no keystroke
//! and no feed locks the operator out of the box.
//!
//! Two guards, one definition of "protected":
//! - refusal: a rule, ban or set entry whose prefix lies inside a protected
//!   prefix (or is one) and does anything but allow is refused with the
//!   reason ([`Protect::refuse_rule`], [`Protect::refuse_entry`]), at
//!   `rule set`, `ban`, `rule import`, a reload and the start;
//! - the kernel: each protected prefix is an allow entry of the rule tries,
//!   over any ban that covers it, and any entry inside one that would not
//!   allow is made to ([`Protect::apply`], called by the rule compiler). A
//!   deny or ban of `0.0.0.0/0` (with `--force`) drops everything else.
//!
//! A rule covering a protected prefix (`0.0.0.0/0`) is fine: the protected
//! prefix is more specific, and the tries' longest match gives it.

use std::collections::BTreeMap;

use ipnet::IpNet;
use policer_common::{Rule, bucket::Action};

use crate::{
    error::{Error, Result},
    prefix::parse_prefix,
    rules::RuleSpec,
};

/// The protected prefixes, in the order given.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Protect {
    nets: Vec<IpNet>,
}

impl Protect {
    /// From the config's `protect` list; an entry that is not a prefix is
    /// an error naming it.
    pub fn parse(list: &[String]) -> Result<Protect> {
        let mut nets = Vec::with_capacity(list.len());
        for (i, s) in list.iter().enumerate() {
            let net = parse_prefix(s).map_err(|e| Error::Invalid(format!("daemon.protect[{i}]: {e}")))?;
            if !nets.contains(&net) {
                nets.push(net);
            }
        }
        Ok(Protect { nets })
    }

    pub fn from_nets(nets: impl IntoIterator<Item = IpNet>) -> Protect {
        let mut p = Protect::default();
        for n in nets {
            if !p.nets.contains(&n) {
                p.nets.push(n);
            }
        }
        p
    }

    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// The protected prefix that holds `net` (is it, or shorter), if any.
    pub fn holding(&self, net: &IpNet) -> Option<&IpNet> {
        self.nets.iter().find(|p| p.contains(net))
    }

    /// Refuses a rule or ban that would do anything but allow inside a
    /// protected prefix: a deny, a police or monitor rule (its buckets),
    /// a class (it narrows a prefix to police it), a manual ban.
    pub fn refuse_rule(&self, s: &RuleSpec) -> Result<()> {
        let Some(p) = self.holding(&s.net) else { return Ok(()) };
        let what = if s.ban().is_some() {
            "a ban".to_string()
        } else if s.class().is_none() {
            format!("a {} rule", s.action)
        } else {
            format!("a {} rule with a class", s.action)
        };
        if s.ban().is_none() && s.class().is_none() && s.action == Action::Allow {
            return Ok(());
        }
        Err(Error::Invalid(format!(
            "{} is inside the protected prefix {p} (protect in [daemon]): {what} there could drop it; nothing \
             changed",
            s.net
        )))
    }

    /// Refuses a set's entry `net` whose set does `action`, unless it
    /// allows.
    pub fn refuse_entry(&self, net: &IpNet, action: Action) -> Result<()> {
        match self.holding(net) {
            Some(p) if action != Action::Allow => Err(Error::Invalid(format!(
                "{net} is inside the protected prefix {p} (protect in [daemon]): a {action} set may not hold it; \
                 nothing changed"
            ))),
            _ => Ok(()),
        }
    }

    /// Makes the tries' `prefixes` pass every protected source: each
    /// protected prefix allows (its own allow rule's value if it has one,
    /// else [`protected_rule`]), and an entry inside one that would not
    /// allow (a ban's value laid over a rule under it) allows too.
    pub fn apply(&self, prefixes: &mut BTreeMap<IpNet, Rule>) {
        if self.nets.is_empty() {
            return;
        }
        for (net, rule) in prefixes.iter_mut() {
            if (rule.action != Action::Allow as u32 || rule.classes != 0) && self.holding(net).is_some() {
                *rule = protected_rule();
            }
        }
        for p in &self.nets {
            prefixes.entry(*p).or_insert_with(protected_rule);
        }
    }
}

/// The tries' value of a protected prefix without a rule of its own: allow,
/// no classes, counted in counter slot 0 (which no rule owns) with rule id
/// 0 (which no rule has).
pub fn protected_rule() -> Rule {
    Rule::packets(1, 1).expect("valid").with_action(Action::Allow).with_id(0).with_counter_slot(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::RuleConfig;

    fn spec(prefix: &str, f: impl FnOnce(&mut RuleConfig)) -> RuleSpec {
        let mut rc = RuleConfig { prefix: prefix.into(), ..Default::default() };
        f(&mut rc);
        rc.validate().unwrap()
    }

    fn protect(list: &[&str]) -> Protect {
        Protect::parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn inside_a_protected_prefix_only_allow_is_taken() {
        let p = protect(&["192.0.2.0/24", "2001:db8:1::/48"]);
        let deny = |n: &str| spec(n, |r| r.action = Some(Action::Deny));
        let e = p.refuse_rule(&deny("192.0.2.7")).unwrap_err().to_string();
        assert!(e.contains("192.0.2.7/32 is inside the protected prefix 192.0.2.0/24"), "{e}");
        assert!(e.contains("nothing changed"), "{e}");
        assert!(p.refuse_rule(&deny("192.0.2.0/24")).is_err(), "the prefix itself");
        assert!(p.refuse_rule(&deny("2001:db8:1:2::/64")).is_err());
        assert!(p.refuse_rule(&spec("192.0.2.0/25", |r| r.rate = Some("10pps".into()))).is_err(), "police");
        let mon = spec("192.0.2.0/25", |r| {
            r.rate = Some("10pps".into());
            r.action = Some(Action::Monitor);
        });
        assert!(p.refuse_rule(&mon).is_err(), "monitor");
        let ban = spec("192.0.2.9", |r| {
            r.ban = Some(true);
            r.ttl = Some("1h".into());
        });
        assert!(p.refuse_rule(&ban).unwrap_err().to_string().contains("a ban there"));
        let class = spec("192.0.2.0/24", |r| {
            r.action = Some(Action::Allow);
            r.proto = Some("udp".into());
        });
        assert!(p.refuse_rule(&class).is_err(), "a class narrows the prefix");
        // Allowed: an allow inside; anything covering or beside.
        assert!(p.refuse_rule(&spec("192.0.2.0/26", |r| r.action = Some(Action::Allow))).is_ok());
        assert!(p.refuse_rule(&deny("0.0.0.0/0")).is_ok());
        assert!(p.refuse_rule(&deny("192.0.3.0/24")).is_ok());
        assert!(p.refuse_rule(&deny("::/0")).is_ok());
        // Set entries.
        assert!(p.refuse_entry(&"192.0.2.128/25".parse().unwrap(), Action::Deny).is_err());
        assert!(p.refuse_entry(&"192.0.2.128/25".parse().unwrap(), Action::Allow).is_ok());
        assert!(p.refuse_entry(&"192.0.0.0/16".parse().unwrap(), Action::Deny).is_ok());
    }

    #[test]
    fn the_list_is_checked_and_named() {
        let e = Protect::parse(&["192.0.2.0/24".into(), "192.0.2.1/24".into()]).unwrap_err().to_string();
        assert!(e.starts_with("daemon.protect[1]: "), "{e}");
        assert_eq!(protect(&["10.0.0.1", "10.0.0.1/32"]).nets().len(), 1, "a host, once");
    }

    #[test]
    fn the_tries_pass_protected_sources_over_any_ban() {
        let p = protect(&["192.0.2.0/24"]);
        let ban = Rule::packets(1, 1).unwrap().with_action(Action::Deny).with_id(9).with_counter_slot(3);
        let own = Rule::packets(1, 1).unwrap().with_action(Action::Allow).with_id(4).with_counter_slot(2);
        let mut prefixes: BTreeMap<IpNet, Rule> = [
            ("0.0.0.0/0".parse().unwrap(), ban),
            // A rule under a ban of 0/0 takes the ban's value.
            ("192.0.2.128/25".parse().unwrap(), ban),
            ("192.0.2.64/26".parse().unwrap(), own),
        ]
        .into();
        p.apply(&mut prefixes);
        assert_eq!(prefixes[&"0.0.0.0/0".parse().unwrap()], ban, "outside: untouched");
        assert_eq!(prefixes[&"192.0.2.0/24".parse().unwrap()], protected_rule());
        assert_eq!(prefixes[&"192.0.2.128/25".parse().unwrap()], protected_rule());
        assert_eq!(prefixes[&"192.0.2.64/26".parse().unwrap()], own, "an allow keeps its own counters");
    }
}
