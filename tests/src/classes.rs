//! Class rules (issue 17) for the object tier: written as an operator
//! writes them, compiled by the daemon's own compiler
//! (`policer_user::compile::compile`) and installed into a loaded object
//! by the daemon's loader (`sync_rules`, `set_total`), so a test can run
//! frames through the real program with `BPF_PROG_TEST_RUN`.

use ipnet::IpNet;
use policer_common::{
    Rule,
    class::{RULE_NO_SOURCE, RULE_TOTAL, Total},
};
use policer_user::{
    Policer,
    classes::{Class, ClassText},
    compile::{Compiled, Groups, KernelRule, compile},
};

/// A class from `key=value` words, as the CLI's options (without the
/// dashes): `proto=tcp tcp-flags=syn,!ack`, `proto=udp dport=53`,
/// `dst=192.0.2.0/24`; `""` is no class. Panics on a class the daemon
/// refuses (a test's own mistake).
pub fn class(v6: bool, words: &str) -> Class {
    let mut t = ClassText::default();
    for w in words.split_whitespace() {
        let (k, v) = w.split_once('=').unwrap_or_else(|| panic!("class word '{w}' is not key=value"));
        let slot = match k {
            "proto" => &mut t.proto,
            "dport" => &mut t.dport,
            "sport" => &mut t.sport,
            "tcp-flags" => &mut t.tcp_flags,
            "icmp-type" => &mut t.icmp_type,
            "dst" => &mut t.dst,
            _ => panic!("unknown class field '{k}'"),
        };
        *slot = Some(v.to_string());
    }
    Class::parse(&t, v6).unwrap_or_else(|e| panic!("class '{words}': {e}"))
}

/// A rule in force: `net`, its class, `rule` with its counter slot and id
/// set to `slot` (every rule of a test gets its own).
pub fn kernel_rule(net: &str, words: &str, mut rule: Rule, slot: u32) -> KernelRule {
    let net: IpNet = net.parse().unwrap();
    rule.counter_slot = slot;
    rule.rule_id = slot;
    KernelRule { net, class: class(net.addr().is_ipv6(), words), rule, ban: false, inherit: true }
}

/// `rule` with an aggregate bucket (`--total-rate`): the flag, and its
/// limiter to install with [`install`]. `per_source: false` is a rule with
/// only a total.
pub fn with_total(mut rule: Rule, per_source: bool) -> Rule {
    rule.flags |= RULE_TOTAL;
    if !per_source {
        rule.flags |= RULE_NO_SOURCE;
    }
    rule
}

/// Compiles `rules` and installs them into `p` as the daemon does
/// (`Policer::sync_rules`: each prefix's rule in its trie, the class
/// index), and `totals` (counter slot, limiter; empty at `now_ns`) with
/// `Policer::set_total`. Returns what was compiled.
pub fn install(p: &mut Policer, rules: &[KernelRule], totals: &[(u32, Rule)], now_ns: u64) -> Compiled {
    install_with(p, rules, totals, now_ns, &mut Groups::default())
}

/// [`install`] with the daemon's group ids kept from one rule set to the
/// next (a change to the rules in force, as `rule set`/`rule rm` make).
pub fn install_with(
    p: &mut Policer,
    rules: &[KernelRule],
    totals: &[(u32, Rule)],
    now_ns: u64,
    groups: &mut Groups,
) -> Compiled {
    let compiled = compile(rules, groups).expect("compile the class rules");
    p.sync_rules(&compiled).expect("install the compiled rules");
    for (slot, limiter) in totals {
        p.set_total(*slot, Some(&Total { tat: limiter.empty_tat(now_ns), limiter: *limiter })).expect("set a total");
    }
    compiled
}
