//! What a running program shares with the next build, as this build lays
//! it out: the layout version, the maps a new program takes over with
//! their key and value sizes (what adoption compares), and the check that
//! no map key or value has implicit padding (user space: each is
//! `aya::Pod`).
//!
//! It names the types of every other module, so it is the top layer (see
//! the crate doc); the maps' names are in [`crate::maps`].

use core::mem::size_of;

use crate::{
    Ban, BanParams, BanWindow, Bucket, BucketKeyV4, BucketKeyV6, Counters, MAP_BAN_PARAMS, MAP_BAN_WINDOWS, MAP_BANS,
    MAP_BUCKETS_V4, MAP_BUCKETS_V4_DROPS, MAP_BUCKETS_V4_GEOMETRY, MAP_BUCKETS_V4_USED, MAP_BUCKETS_V6,
    MAP_BUCKETS_V6_DROPS, MAP_BUCKETS_V6_KEYS, MAP_BUCKETS_V6_USED, MAP_CLASS_FILTER, MAP_CLASS_INDEX, MAP_CLOCK,
    MAP_COUNTERS, MAP_NEW_SOURCES, MAP_RECALL, MAP_RULE_COUNTERS, MAP_RULES_V4, MAP_RULES_V6, MAP_TOTALS, NewSources,
    Rule, RuleCounters,
    capture::{CaptureCounters, CaptureHeader, CaptureLane, CaptureRecord, SNAP_BYTES},
    class::{ClassCand, ClassFilter, ClassList, INDEX_KEY_BYTES, Total},
    recall::RecallSet,
    table::{Geometry, Set, SetDrops, SetKeys, Slot},
};

/// The layout of the state a running program shares with the next build
/// ([`SHARED_MAPS`]: keys, values and what they mean, e.g. a bucket's time
/// unit). Bump it with any change a newer build would misread: a program
/// stamped with another version is not adopted but replaced by a fresh
/// one (buckets start empty, rules come from the config).
///
/// 2: IPv6 in a set-associative table, the recall, the returned bit of a
/// slot, the geometry's capacity, the recall counters.
/// 3: classes and totals: the rule's class fields (80 bytes), the class
/// index and the totals, the class in the keyed table's keys, the total
/// drop counters.
/// 4: automatic bans: the ban store and the rules' ban parameters, the
/// banned and counting stamps of a slot, the ban counters.
/// 5: source-port classes: a class candidate's source port range (in what
/// was its padding, read under a new `needs` bit) and the class filter's
/// source port lanes; and the chain's counters (crate::chain; the chain
/// itself is reused by its pin, not by adoption).
/// 6: `--ban-within`: the rules' ban parameters carry the window (in what
/// was their padding) and the refusals in windows have a map of their own;
/// SYN cookies: the rule flag `syn::RULE_SYN` and the program's own SYN
/// maps (settings, budgets, counters, verified sources, the reflection
/// cap; none shared with the program it adopts).
/// 7: a slot's drop word holds the counter slot of the rule that dropped
/// its count above the count (`table::drop_word`); each table has a
/// bitmap of the sets it used (`table::used_bit`); the SYN counters'
/// `syns_passed` (a `flood` rule's SYNs within its SYN budget, passed to
/// the kernel): a map the daemon reads, though not one a new program
/// takes over.
pub const LAYOUT_VERSION: u32 = 7;
/// Builds from before layout versions carry no stamp. Their last layout
/// is version 1: an unstamped program whose shared maps have
/// [`SHARED_MAP_LAYOUT`]'s sizes is taken for version 1; one with other
/// maps is older still.
pub const UNSTAMPED_LAYOUT_VERSION: u32 = 1;
/// Maps every policer build since the first has had, by these names: with
/// the program name, what tells an unstamped (older) policer program from
/// someone else's.
pub const MAPS_OF_EVERY_BUILD: [&str; 3] = [MAP_RULES_V4, MAP_RULES_V6, MAP_COUNTERS];
/// The maps a newly loaded program takes over from a running one it
/// adopts (rules, buckets, counters): the state that outlives a restart.
pub const SHARED_MAPS: [&str; 22] = {
    // The names of SHARED_MAP_LAYOUT, the one list of the shared maps.
    let mut names = [""; 22];
    let mut i = 0;
    while i < names.len() {
        names[i] = SHARED_MAP_LAYOUT[i].0;
        i += 1;
    }
    names
};
/// The one list of the maps a program shares with the daemon and with the
/// builds that adopt it, with their key and value sizes as this build lays
/// them out ([`SHARED_MAPS`] is its names). A running program whose maps
/// differ in either is another build's: its state would be misread, so it
/// is not adopted. (The LPM tries' keys are the kernel's
/// `bpf_lpm_trie_key`: a `u32` prefix length, then the address.)
pub const SHARED_MAP_LAYOUT: [(&str, usize, usize); 22] = [
    (MAP_RULES_V4, 4 + 4, size_of::<Rule>()),
    (MAP_RULES_V6, 4 + 16, size_of::<Rule>()),
    (MAP_BUCKETS_V4, 4, size_of::<Set>()),
    (MAP_BUCKETS_V4_DROPS, 4, size_of::<SetDrops>()),
    (MAP_BUCKETS_V4_GEOMETRY, 4, size_of::<Geometry>()),
    (MAP_BUCKETS_V6, 4, size_of::<Set>()),
    (MAP_BUCKETS_V6_DROPS, 4, size_of::<SetDrops>()),
    (MAP_BUCKETS_V6_KEYS, 4, size_of::<SetKeys>()),
    (MAP_BUCKETS_V4_USED, 4, size_of::<u64>()),
    (MAP_BUCKETS_V6_USED, 4, size_of::<u64>()),
    (MAP_RECALL, 4, size_of::<RecallSet>()),
    (MAP_COUNTERS, 4, size_of::<Counters>()),
    (MAP_RULE_COUNTERS, 4, size_of::<RuleCounters>()),
    (MAP_NEW_SOURCES, 4, size_of::<NewSources>()),
    (MAP_CLOCK, 4, size_of::<u64>()),
    (MAP_CLASS_INDEX, 4 + INDEX_KEY_BYTES, size_of::<ClassList>()),
    (MAP_TOTALS, 4, size_of::<Total>()),
    (MAP_CLASS_FILTER, 4, size_of::<ClassFilter>()),
    (MAP_BANS, size_of::<BucketKeyV6>(), size_of::<Ban>()),
    (MAP_BAN_PARAMS, 4, size_of::<BanParams>()),
    (MAP_BAN_WINDOWS, size_of::<BucketKeyV6>(), size_of::<BanWindow>()),
    (crate::chain::MAP_CHAIN_COUNTERS, 4, size_of::<crate::chain::ChainCounters>()),
];

/// The kernel memory the source tables of a program loaded for
/// `max_sources` take, preallocated at load: for each family the sets and
/// their drop counts, the IPv6 sources' addresses, and the recall.
pub const fn source_tables_bytes(max_sources: u32) -> u64 {
    // The used-sets bitmaps (a bit a set, 0.06 % of this) are left out.
    let per_set = 2 * size_of::<Set>() + 2 * size_of::<SetDrops>() + size_of::<SetKeys>() + size_of::<RecallSet>();
    crate::table::sets_for(max_sources) as u64 * per_set as u64
}

#[cfg(feature = "user")]
mod pod {
    use super::*;

    // SAFETY: plain `#[repr(C)]` integers and byte arrays with no padding
    // (fields are ordered largest first), so every bit pattern is valid.
    unsafe impl aya::Pod for BucketKeyV4 {}
    unsafe impl aya::Pod for BucketKeyV6 {}
    unsafe impl aya::Pod for Counters {}
    unsafe impl aya::Pod for RuleCounters {}
    unsafe impl aya::Pod for NewSources {}
    unsafe impl aya::Pod for Ban {}
    unsafe impl aya::Pod for BanParams {}
    unsafe impl aya::Pod for BanWindow {}
    unsafe impl aya::Pod for Bucket {}
    unsafe impl aya::Pod for Set {}
    unsafe impl aya::Pod for SetDrops {}
    unsafe impl aya::Pod for Geometry {}
    unsafe impl aya::Pod for SetKeys {}
    unsafe impl aya::Pod for RecallSet {}
    unsafe impl aya::Pod for Rule {}
    unsafe impl aya::Pod for ClassList {}
    unsafe impl aya::Pod for Total {}
    unsafe impl aya::Pod for ClassFilter {}
    unsafe impl aya::Pod for CaptureLane {}
    unsafe impl aya::Pod for CaptureCounters {}
    unsafe impl aya::Pod for crate::chain::ChainCounters {}
    unsafe impl aya::Pod for crate::syn::SynConf {}
    unsafe impl aya::Pod for crate::syn::SynCounters {}
}

const _: () = {
    // No implicit padding: the sizes are the sums of the fields.
    assert!(size_of::<BucketKeyV4>() == 8);
    assert!(size_of::<BucketKeyV6>() == 24);
    assert!(size_of::<Bucket>() == 16);
    assert!(size_of::<Slot>() == 16);
    // One cache line.
    assert!(size_of::<Set>() == 64);
    assert!(size_of::<SetDrops>() == 32);
    assert!(size_of::<Geometry>() == 24);
    assert!(size_of::<SetKeys>() == 96);
    assert!(size_of::<ClassCand>() == 120);
    assert!(size_of::<ClassList>() == 8 + 8 * 120);
    assert!(size_of::<Total>() == 88);
    assert!(size_of::<ClassFilter>() == 288);
    assert!(size_of::<RecallSet>() == 64);
    assert!(size_of::<Rule>() == 80);
    assert!(size_of::<Counters>() == 23 * 8);
    assert!(size_of::<NewSources>() == 32);
    assert!(size_of::<RuleCounters>() == 8 * 8);
    assert!(size_of::<crate::chain::ChainCounters>() == 2 * 8);
    assert!(size_of::<crate::syn::SynConf>() == 2 * 8 + 4 * 4);
    assert!(size_of::<crate::syn::SynCounters>() == 9 * 8);
    // Capture (not shared: each program gets its own, see crate::capture).
    assert!(size_of::<CaptureLane>() == 3 * 8 + 32 + 4 * 4);
    assert!(size_of::<CaptureCounters>() == 4 * 8);
    assert!(size_of::<CaptureHeader>() == 32);
    assert!(size_of::<crate::capture::CaptureScratch>() == 8 + 16 + 6 * 4);
    assert!(size_of::<CaptureRecord>() == 32 + SNAP_BYTES);
};
