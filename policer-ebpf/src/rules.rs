//! The rule for a frame: the longest-prefix match of its source (or, with
//! only default rules, one array read), then, for a prefix with classes,
//! the class its layer-4 header selects (policer_common::class).

use aya_ebpf::{maps::lpm_trie::Key, programs::XdpContext};
use policer_common::{
    ACTION_NONE, Counters, Rule,
    class::{self, ClassFilter, ClassList, FrameL4, INDEX_PORT_BITS, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP},
    wire::MAX_EXT_OFFSET,
};

use crate::{
    maps::{CLASS_FILTER, CLASS_INDEX, DEFAULT_RULES, FAST_PATH},
    parse::{L4At, ptr_at},
    verifier::launder,
};

/// The rule for a source: with only default rules (FAST_PATH) an inlined
/// array read, else the longest-prefix match in the family's trie.
#[inline(always)]
pub(crate) fn lookup_rule<const V6: bool>(search: impl FnOnce() -> Option<&'static Rule>) -> Option<&'static Rule> {
    let fast = FAST_PATH.get(0).copied().unwrap_or(0);
    if fast != 0 {
        // Only default rules: no need to search the tries.
        let i = (fast - 1) * 2 + V6 as u32;
        return DEFAULT_RULES.get(i).filter(|r| r.action != ACTION_NONE || r.classes != 0);
    }
    search()
}

/// The rule for a frame whose source's prefix rule is `rule`: one of the
/// prefix's classes if one matches (policer_common::class::select), else
/// `rule` itself, the fallback. Reads the layer-4 header only here.
#[inline(always)]
pub(crate) fn resolve_class<const V6: bool>(
    ctx: &XdpContext,
    rule: &'static Rule,
    l4: L4At,
    c: &mut Counters,
) -> &'static Rule {
    match class::select(rule, l4.proto(), &mut FrameClasses::<V6> { ctx, l4 }) {
        Some(r) => {
            c.class_matched += 1;
            r
        }
        None => rule,
    }
}

/// What class selection reads: this frame's headers and the class maps.
struct FrameClasses<'c, const V6: bool> {
    ctx: &'c XdpContext,
    l4: L4At,
}

impl<const V6: bool> class::ClassLookups<'static> for FrameClasses<'_, V6> {
    #[inline(always)]
    fn l4(&mut self, proto: u8) -> FrameL4 {
        let ctx = self.ctx;
        let mut f = FrameL4 { proto, has_l4: false, dport: 0, sport: 0, tcp_flags: 0, icmp_type: 0, dst: [0; 16] };
        // Laundered: the IPv6 walk ends at one of several offsets, and the
        // verifier would follow what comes next once for each.
        let off = launder(self.l4.off() as u64) as usize;
        let off = if off > MAX_EXT_OFFSET + 8 { 0 } else { off };
        if off != 0 {
            if proto == IPPROTO_TCP {
                if let Some(h) = ptr_at::<[u8; 14]>(ctx, off) {
                    // SAFETY: bounds checked by ptr_at.
                    let h = unsafe { *h };
                    f.sport = u16::from_be_bytes([h[0], h[1]]);
                    f.dport = u16::from_be_bytes([h[2], h[3]]);
                    f.tcp_flags = h[13];
                    f.has_l4 = true;
                }
            } else if proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6 {
                if let Some(h) = ptr_at::<[u8; 2]>(ctx, off) {
                    // SAFETY: bounds checked by ptr_at.
                    f.icmp_type = unsafe { (*h)[0] };
                    f.has_l4 = true;
                }
            } else if class::PROTOS_WITH_PORTS.contains(&proto) {
                if let Some(h) = ptr_at::<[u8; 4]>(ctx, off) {
                    // SAFETY: bounds checked by ptr_at.
                    let h = unsafe { *h };
                    f.sport = u16::from_be_bytes([h[0], h[1]]);
                    f.dport = u16::from_be_bytes([h[2], h[3]]);
                    f.has_l4 = true;
                }
            } else {
                f.has_l4 = true;
            }
        }
        f
    }

    #[inline(always)]
    fn filter(&mut self, group: u32) -> Option<&'static ClassFilter> {
        CLASS_FILTER.get(group)
    }

    /// Read again from the header parse checked.
    #[inline(always)]
    fn dst(&mut self) -> Option<[u8; 16]> {
        if V6 {
            // SAFETY: bounds checked by ptr_at.
            ptr_at::<[u8; 16]>(self.ctx, self.l4.ip() + 24).map(|d| unsafe { *d })
        } else {
            // SAFETY: bounds checked by ptr_at.
            ptr_at::<[u8; 4]>(self.ctx, self.l4.ip() + 16).map(|d| class::mapped_v4(unsafe { *d }))
        }
    }

    #[inline(always)]
    fn index(&mut self, key: [u8; class::INDEX_KEY_BYTES]) -> Option<&'static ClassList> {
        CLASS_INDEX.get(&Key::new(INDEX_PORT_BITS, key))
    }

    #[inline(always)]
    fn opaque(&mut self, i: usize) -> usize {
        launder(i as u64) as usize
    }
}
