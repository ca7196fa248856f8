//! The policer's code on one frame ([`try_policer`], the body of the
//! attached program and of each replayed frame): count it on its
//! interface, parse it, find its rule (and class), judge it against its
//! source's bucket in the table of its family or the keyed one, then the
//! rule's aggregate bucket; count the verdict per interface and per rule,
//! and hand the frame to a running capture that wants it.

use aya_ebpf::{bindings::xdp_action, maps::lpm_trie::Key, programs::XdpContext};
use policer_common::{
    ACTION_NONE, BucketKeyV6, Counters, MAX_IFACE_SLOTS, Rule, RuleCounters,
    bucket::Action,
    capture,
    class::{self, RULE_CLASS, RULE_NO_SOURCE, RULE_TOTAL},
    syn::{RULE_SYN, SYN_PATH},
    table,
    verdict::{self, Verdict},
};

#[cfg(feature = "bench")]
use crate::maps::{BENCH_SOURCES, CPU_SCRATCH};
use crate::{
    capture::hand_to_capture,
    clock::{Clock, test_meta_report},
    maps::{BUCKETS_V4_GEOM, CAPTURE_ON, COUNTERS, RULE_COUNTERS, RULES_V4, RULES_V6, TEST_CLOCK},
    parse::{Parsed, parse},
    police::{Judged, count_drop, police_table},
    rules::{lookup_rule, resolve_class},
    totals::total_admits,
    verifier::trie_get,
};

/// Synthetic IPv4 source for the benchmark variant.
#[cfg(feature = "bench")]
#[inline(always)]
fn bench_source(n: u32) -> [u8; 4] {
    let mut addr = [0u8; 4];
    if let Some(scratch) = CPU_SCRATCH.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        let i = unsafe {
            let v = (*scratch).bench_seq;
            (*scratch).bench_seq = v + 1;
            (v % n as u64) as u32
        };
        addr[0] = 10;
        addr[1] = (i >> 16) as u8;
        addr[2] = (i >> 8) as u8;
        addr[3] = i as u8;
    }
    addr
}

#[inline(always)]
pub(crate) fn try_policer<const SYN: bool>(ctx: &XdpContext) -> u32 {
    // SAFETY: reading the ingress ifindex from the context.
    let slot = unsafe { (*ctx.ctx).ingress_ifindex } % MAX_IFACE_SLOTS;
    let Some(c) = COUNTERS.get_ptr_mut(slot) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    let c = unsafe { &mut *c };
    let len = (ctx.data_end() - ctx.data()) as u32;
    let (rule, target) = match parse(ctx) {
        Parsed::NonIp => {
            c.non_ip_pkts += 1;
            return xdp_action::XDP_PASS;
        }
        Parsed::Malformed => {
            c.malformed_pkts += 1;
            return xdp_action::XDP_DROP;
        }
        Parsed::V4 { src, fragment, l4 } => {
            c.fragment_pkts += fragment as u64;
            #[cfg(feature = "bench")]
            // SAFETY: a read of a plain static the loader may rewrite before load.
            let src = match unsafe { core::ptr::read_volatile(&BENCH_SOURCES) } {
                0 => src,
                n => bench_source(n),
            };
            let rule = lookup_rule::<false>(|| trie_get(&RULES_V4, &Key::new(32, src)))
                .map(|r| resolve_class::<false>(ctx, r, l4, c));
            if let Some(a) = syn_first::<SYN>(rule) {
                return a;
            }
            match rule {
                // A class's buckets are per (source, class): in the keyed
                // table, the source as ::ffff:a.b.c.d.
                Some(r) if r.flags & RULE_CLASS != 0 => {
                    let m = &r.key_mask;
                    let masked = [src[0] & m[0], src[1] & m[1], src[2] & m[2], src[3] & m[3]];
                    (rule, Target::Keyed(class::mapped_v4(masked), class::KEY_LEN_V4_MAPPED))
                }
                _ => (rule, Target::V4(src)),
            }
        }
        Parsed::V6 { src, fragment, l4 } => {
            c.fragment_pkts += fragment as u64;
            let rule = lookup_rule::<true>(|| trie_get(&RULES_V6, &Key::new(128, src)))
                .map(|r| resolve_class::<true>(ctx, r, l4, c));
            if let Some(a) = syn_first::<SYN>(rule) {
                return a;
            }
            (rule, Target::Keyed(src, 0))
        }
    };
    // One call site each, so each is inlined once.
    match target {
        Target::V4(src) => verdict(
            ctx,
            rule,
            len,
            c,
            #[inline(always)]
            |rule, clock, c, rc| {
                // The key: the masked source as one word (IPv4 keys are at most
                // 32 bits).
                let m = &rule.key_mask;
                let mask = u32::from_ne_bytes([m[0], m[1], m[2], m[3]]);
                let key = table::slot_key_word(u32::from_ne_bytes(src) & mask, rule.key_len);
                let Some(g) = BUCKETS_V4_GEOM.get(0).filter(|g| g.sets != 0) else {
                    c.bucket_insert_failed += 1;
                    return Judged::new_bucket(true);
                };
                let index = g.sets_of(key);
                police_table::<false>(ctx, g, key, index, &BucketKeyV6::default(), rule, clock, len, c, rc)
            },
        ),
        Target::Keyed(addr, mapped) => keyed_verdict(ctx, rule, addr, mapped, len, c),
    }
}

/// With `SYN` (the attached entry), a frame whose rule has SYN cookies
/// goes to the SYN path first (from the entry, crate::syn), uncounted: the
/// answer is `SYN_PATH` with the rule's slot. Only the slot is handed
/// over, in the return value: the SYN path parses the frame again itself,
/// so nothing of the parse lives on past the class lookup here (a value
/// live through it multiplies what the verifier walks, and the policer's
/// stack has no room to spare).
#[inline(always)]
fn syn_first<const SYN: bool>(rule: Option<&'static Rule>) -> Option<u32> {
    match rule {
        Some(r) if SYN && r.flags & RULE_SYN != 0 => Some(SYN_PATH | r.counter_slot),
        _ => None,
    }
}

/// Which table judges a frame.
enum Target {
    /// The IPv4 table: the source.
    V4([u8; 4]),
    /// The keyed table: the source, and the key length's family bit (an
    /// IPv4 source, masked already).
    Keyed([u8; 16], u32),
}

/// [`verdict`] on the keyed table (IPv6 sources, and the buckets of every
/// class): `addr` is the source (masked already when `mapped`, the key
/// length's family bit of an IPv4 source, is set).
#[inline(always)]
fn keyed_verdict(
    ctx: &XdpContext,
    rule: Option<&'static Rule>,
    addr: [u8; 16],
    mapped: u32,
    len: u32,
    c: &mut Counters,
) -> u32 {
    verdict(
        ctx,
        rule,
        len,
        c,
        #[inline(always)]
        |rule, clock, c, rc| {
            let class = if rule.flags & RULE_CLASS != 0 { rule.counter_slot } else { 0 };
            let mut key = BucketKeyV6 { addr, key_len: rule.key_len | mapped, class };
            if mapped == 0 {
                for i in 0..16 {
                    key.addr[i] = addr[i] & rule.key_mask[i];
                }
            }
            let Some(g) = BUCKETS_V4_GEOM.get(0).filter(|g| g.sets != 0) else {
                c.bucket_insert_failed += 1;
                return Judged::new_bucket(true);
            };
            let h = g.hash_key(&key);
            let index = g.sets_of_hash(h);
            police_table::<true>(ctx, g, table::v6_key_word(h), index, &key, rule, clock, len, c, rc)
        },
    )
}

/// Applies `rule` (from [`lookup_rule`]) to a frame of `len` bytes:
/// `police` judges it against the source's bucket when the rule polices or
/// monitors. Counts the verdict per interface and per rule.
#[inline(always)]
fn verdict(
    ctx: &XdpContext,
    rule: Option<&'static Rule>,
    len: u32,
    c: &mut Counters,
    police: impl FnOnce(&Rule, &mut Clock, &mut Counters, &mut RuleCounters) -> Judged,
) -> u32 {
    // A prefix whose classes did not match and that has no rule to fall to.
    let Some(rule) = rule.filter(|r| r.action != ACTION_NONE) else {
        c.unmatched_pkts += 1;
        return xdp_action::XDP_PASS;
    };
    // A slot past the array (a rule written for a larger limit) is counted
    // in slot 0, which no rule owns: the frame is still judged.
    let Some(rc) = RULE_COUNTERS.get_ptr_mut(rule.counter_slot).or_else(|| RULE_COUNTERS.get_ptr_mut(0)) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    let rc = unsafe { &mut *rc };
    // What is needed of the rule after its bucket's verdict, as numbers:
    // past that point the verifier then follows one path, not one per kind
    // of map the rule came from (trie, default rules, class list).
    let (action, flags, slot) = (rule.action, rule.flags, rule.counter_slot);
    let v = match Action::from_u32(action) {
        Some(Action::Allow) => Verdict::Pass,
        Some(Action::Deny) => Verdict::Drop,
        _ => {
            let mut clock = Clock::new(ctx);
            let admit = if flags & RULE_NO_SOURCE != 0 {
                true
            } else {
                let j = police(rule, &mut clock, c, rc);
                if !j.admit {
                    count_drop(&j.drop_at, slot, &mut clock);
                }
                j.admit
            };
            // The aggregate bucket, only for what the source's admitted.
            let admit = admit
                && (flags & RULE_TOTAL == 0 || {
                    let ok = total_admits(slot, &mut clock, len, c);
                    if !ok {
                        c.total_drops += 1;
                        rc.total_dropped_pkts += 1;
                    }
                    ok
                });
            Verdict::policed(action, admit)
        }
    };
    verdict::count(c, rc, v, len);
    // SAFETY: a read of a plain static the loader may rewrite before load.
    if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } != 0 {
        test_meta_report(ctx, slot, v);
    }
    // The whole cost of capture while none runs: one inlined array load
    // and a branch not taken.
    // SAFETY: a global the daemon rewrites whole (8 aligned bytes).
    let on = unsafe { core::ptr::read_volatile(&raw const CAPTURE_ON) };
    if on != 0 {
        hand_to_capture(ctx, on, capture::verdict_bit(v), slot);
    }
    if v.passes() { xdp_action::XDP_PASS } else { xdp_action::XDP_DROP }
}
