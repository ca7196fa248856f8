//! Class rules (issue 17) for the object tier: written as an operator
//! writes them, compiled by the daemon's own compiler
//! (`policer_user::classes::compile`) and installed straight into a loaded
//! object's maps (the tries, `CLASS_INDEX`, `TOTALS`), so a test can run
//! frames through the real program with `BPF_PROG_TEST_RUN`.

use aya::maps::{
    Array, MapData,
    lpm_trie::{Key, LpmTrie},
};
use ipnet::IpNet;
use policer_common::{
    MAP_CLASS_INDEX, MAP_TOTALS, Rule,
    class::{ClassList, INDEX_KEY_BYTES, RULE_NO_SOURCE, RULE_TOTAL, Total},
};
use policer_user::{
    Policer,
    classes::{Class, ClassText, Compiled, Groups, KernelRule, compile},
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
    KernelRule { net, class: class(net.addr().is_ipv6(), words), rule }
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

/// Compiles `rules` and writes them into `p`: each prefix's rule in its
/// trie, the class index, and `totals` (counter slot, limiter; empty at
/// `now_ns`) into `TOTALS`. Returns what was compiled.
pub fn install(p: &mut Policer, rules: &[KernelRule], totals: &[(u32, Rule)], now_ns: u64) -> Compiled {
    let compiled = compile(rules, &mut Groups::default()).expect("compile the class rules");
    for (net, r) in &compiled.prefixes {
        p.set_rule(*net, r).expect("set a prefix's rule");
    }
    {
        let mut index: LpmTrie<&mut MapData, [u8; INDEX_KEY_BYTES], ClassList> =
            LpmTrie::try_from(p.ebpf.map_mut(MAP_CLASS_INDEX).expect("CLASS_INDEX in the object"))
                .expect("CLASS_INDEX is an LPM trie");
        for ((bits, data), list) in &compiled.index {
            index.insert(&Key::new(*bits, *data), list, 0).expect("insert a class index entry");
        }
    }
    let mut t: Array<&mut MapData, Total> =
        Array::try_from(p.ebpf.map_mut(MAP_TOTALS).expect("TOTALS in the object")).expect("TOTALS is an array");
    for (slot, limiter) in totals {
        t.set(*slot, &Total { tat: limiter.empty_tat(now_ns), limiter: *limiter }, 0).expect("set a total");
    }
    compiled
}
