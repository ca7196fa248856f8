//! Map names, keys and values the XDP program and user space share.
//!
//! The eBPF statics carry exactly these names (a test loads the object and
//! checks each one exists). The keys and values here are the ones several
//! layers name (the bucket keys, the counters, a ban and a rule's ban
//! parameters); the others live with the code that gives them meaning (a
//! `Rule` with the bucket math, a `Set` with the table). This is the
//! crate's bottom layer: it uses no other module (see the crate doc). What
//! the shared maps hold, size by size, is in [`crate::layout`].

/// LPM trie: IPv4 prefix -> [`crate::Rule`].
pub const MAP_RULES_V4: &str = "RULES_V4";
/// LPM trie: IPv6 prefix -> [`crate::Rule`].
pub const MAP_RULES_V6: &str = "RULES_V6";
/// Array of [`crate::table::Set`]: the IPv4 sources, a set-associative
/// table (see [`crate::table`]); `sets_for(--max-sources)` entries.
pub const MAP_BUCKETS_V4: &str = "BUCKETS_V4";
/// Array of [`crate::table::SetDrops`], one per set of [`MAP_BUCKETS_V4`]:
/// the drops counted for each slot (sampled).
pub const MAP_BUCKETS_V4_DROPS: &str = "BUCKETS_V4_DROP";
/// Array of `u64`, [`crate::table::used_words`] of the sets: which sets
/// of [`MAP_BUCKETS_V4`] ever held a bucket, a bit each
/// ([`crate::table::used_bit`]).
pub const MAP_BUCKETS_V4_USED: &str = "BUCKETS_V4_USED";
/// The same for [`MAP_BUCKETS_V6`].
pub const MAP_BUCKETS_V6_USED: &str = "BUCKETS_V6_USED";
/// Array of one [`crate::table::Geometry`]: the hash and size of both
/// families' tables and of the recall.
pub const MAP_BUCKETS_V4_GEOMETRY: &str = "BUCKETS_V4_GEOM";
/// Array of [`crate::table::Set`]: the IPv6 sources, the same design as
/// [`MAP_BUCKETS_V4`] with fingerprints for keys
/// ([`crate::table::v6_key_word`]).
pub const MAP_BUCKETS_V6: &str = "BUCKETS_V6";
/// Array of [`crate::table::SetDrops`], one per set of [`MAP_BUCKETS_V6`].
pub const MAP_BUCKETS_V6_DROPS: &str = "BUCKETS_V6_DROP";
/// Array of [`crate::table::SetKeys`], one per set of [`MAP_BUCKETS_V6`]:
/// the addresses behind the fingerprints, for user space.
pub const MAP_BUCKETS_V6_KEYS: &str = "BUCKETS_V6_KEYS";
/// Array of [`crate::recall::RecallSet`]: what eviction forgot (see
/// [`crate::recall`]); as many sets as the tables.
pub const MAP_RECALL: &str = "RECALL";
/// LPM trie: [`crate::class::index_key`] -> [`crate::class::ClassList`]:
/// the classes of the prefixes that have some (see [`crate::class`]).
pub const MAP_CLASS_INDEX: &str = "CLASS_INDEX";
/// Array of [`crate::class::ClassFilter`], one per class group
/// ([`crate::class::MAX_CLASS_GROUPS`]): which frames the class lookup can
/// match.
pub const MAP_CLASS_FILTER: &str = "CLASS_FILTER";
/// Array of [`crate::class::Total`], one per rule counter slot: the
/// aggregate buckets of rules with `--total-rate`.
pub const MAP_TOTALS: &str = "TOTALS";
/// Hash (preallocated, never LRU) of [`BucketKeyV6`] -> [`Ban`]:
/// the automatic bans (see [`crate::ban`]).
pub const MAP_BANS: &str = "BANS";
/// Array of [`BanParams`], one per rule counter slot: the automatic bans of
/// rules with `--ban-for`.
pub const MAP_BAN_PARAMS: &str = "BAN_PARAMS";
/// LRU hash of [`BucketKeyV6`] -> [`BanWindow`]: the refusals of sources
/// of rules with `--ban-within`, each in its window (an entry pushed out
/// by others starts its count again: at most a delayed ban).
pub const MAP_BAN_WINDOWS: &str = "BAN_WINDOWS";
/// Entries of [`MAP_BAN_WINDOWS`].
pub const MAX_BAN_WINDOWS: u32 = 65_536;
/// Entries of [`MAP_CLASS_INDEX`] (port blocks of every group).
pub const MAX_CLASS_INDEX_ENTRIES: u32 = 65_536;
/// Per-CPU array of [`Counters`], one slot per interface
/// (`ifindex % MAX_IFACE_SLOTS`).
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Per-CPU array of [`RuleCounters`], one slot per rule (`Rule::counter_slot`).
pub const MAP_RULE_COUNTERS: &str = "RULE_COUNTERS";
/// Per-CPU array of one [`crate::CpuScratch`]: the program's last clock
/// reading on this CPU, and the sequence of the bench-only key variation.
pub const MAP_CPU_SCRATCH: &str = "CPU_SCRATCH";
/// Array of [`crate::NewSources`], one per rule counter slot: the limiter
/// on how fast a rule may admit sources that have no bucket (table
/// pressure).
pub const MAP_NEW_SOURCES: &str = "NEW_SOURCES";
/// Array of one `u32`: the default-rules fast path. 0: look every source up
/// in the LPM tries. 1 or 2: the rule set is only `0.0.0.0/0` and/or `::/0`,
/// and their rules are in [`MAP_DEFAULT_RULES`] pair 0 or 1 (double
/// buffered, so a reader never sees a rule half written).
pub const MAP_FAST_PATH: &str = "FAST_PATH";
/// Array of 4 [`crate::Rule`]s: two pairs of (IPv4 default, IPv6 default).
pub const MAP_DEFAULT_RULES: &str = "DEFAULT_RULES";
/// A default-rule slot with this action means "no rule for this family".
pub const ACTION_NONE: u32 = u32::MAX;
/// Array of two `u64`: the clock in ns and the jiffies, when the test clock
/// is on (jiffies 0: the program reads the clock for every frame).
pub const MAP_CLOCK: &str = "CLOCK";
/// Array of one `u32`: the layout version ([`crate::LAYOUT_VERSION`]) of
/// the build that loaded the program. The program never reads it: the
/// loader writes it, freezes it and binds it to the program
/// (BPF_PROG_BIND_MAP), so any later build can read it through the
/// program's map ids.
pub const MAP_LAYOUT: &str = "LAYOUT";
/// Read-only global (`u32`): non-zero makes the program read its clock
/// from [`MAP_CLOCK`] instead of `bpf_ktime_get_ns`. Set at load time, so
/// the verifier removes the branch in production.
pub const GLOBAL_TEST_CLOCK: &str = "TEST_CLOCK";
/// Read-only global (`u32`): one IPv4 drop in 2^N is counted, as 2^N
/// (see [`crate::table::DROP_SAMPLE_SHIFT`]); 0 counts every drop.
pub const GLOBAL_DROP_SAMPLE_SHIFT: &str = "DROP_SAMPLE_SHIFT";
/// Read-only global (`u64`): the kernel's tick in ns (1e9 / CONFIG_HZ),
/// 0 if unknown. See [`crate::clock`].
pub const GLOBAL_TICK_NS: &str = "TICK_NS";
/// Read-only global (`u32`): non-zero makes the program ignore the real
/// source and police synthetic sources 0..N in turn (benchmarks only, to
/// touch N buckets with one test frame). Only in the benchmark's build of
/// the program (policer-ebpf's `bench` feature): the product has no such
/// global.
pub const GLOBAL_BENCH_SOURCES: &str = "BENCH_SOURCES";
/// Slots in [`MAP_COUNTERS`]: interfaces are counted at `ifindex % 1024`.
pub const MAX_IFACE_SLOTS: u32 = 1024;
/// Rules a daemon holds by default (`--max-rules`): every rule has its own
/// counters ([`MAP_RULE_COUNTERS`]) and new-source limiter
/// ([`MAP_NEW_SOURCES`]), at slots 1..=max_rules (slot 0 is never given
/// out). The loader sizes those maps and the rule tries to the limit.
pub const DEFAULT_MAX_RULES: u32 = 16_384;
/// The XDP program's name in the object.
pub const PROGRAM_NAME: &str = "policer";

/// The largest `--max-rules` accepted (per-CPU counters cost
/// 56 bytes per rule and CPU).
pub const MAX_RULES: u32 = 1_048_576;
/// Default capacity of the bucket table (sources tracked at once).
pub const DEFAULT_MAX_SOURCES: u32 = 1_048_576;
/// The largest `--max-sources` accepted: the tables of both families are
/// preallocated at load, 176 bytes of kernel memory per source
/// ([`crate::layout::source_tables_bytes`]): 2.75 GiB at this bound. A
/// size the kernel cannot allocate fails the start (ENOMEM), so a config
/// past it is refused by `policer check`, a reload and a start alike.
pub const MAX_SOURCES: u32 = 16_777_216;

pub const FAMILY_V4: u32 = 4;
pub const FAMILY_V6: u32 = 6;

/// An IPv4 source as the bucket table knows it: the address masked to the
/// rule's key length, and the key length, so two rules that group sources
/// differently never share a bucket. In the table it is packed into one
/// key word ([`crate::table::slot_key`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BucketKeyV4 {
    /// Masked source, network order.
    pub addr: [u8; 4],
    /// Leading bits of `addr` that are significant.
    pub key_len: u32,
}

/// An IPv6 source as the bucket table knows it (as [`BucketKeyV4`]); in
/// the table it is a fingerprint ([`crate::table::v6_key_word`]), and the
/// key itself sits beside it in [`MAP_BUCKETS_V6_KEYS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BucketKeyV6 {
    /// Masked source, network order (an IPv4 source of a class:
    /// [`mapped_v4`]).
    pub addr: [u8; 16],
    /// Leading bits of `addr` that are significant, with
    /// [`KEY_LEN_V4_MAPPED`] for an IPv4 source.
    pub key_len: u32,
    /// The class whose bucket this is (its rule's counter slot), 0 for a
    /// class-less rule's.
    pub class: u32,
}

/// A key of the keyed table (IPv6 sources, and every class's buckets) for
/// an IPv4 source: the address as `::ffff:a.b.c.d` and this bit in the
/// key length, so it can never be an IPv6 source's.
pub const KEY_LEN_V4_MAPPED: u32 = 0x100;

/// The keyed table's key for an IPv4 class bucket: the masked address in
/// the last 4 bytes after `::ffff:`.
#[inline(always)]
pub const fn mapped_v4(addr: [u8; 4]) -> [u8; 16] {
    [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, addr[0], addr[1], addr[2], addr[3]]
}

/// A bucket's key from either table, as user space shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BucketKey {
    /// Masked source, network order; IPv4 uses the first 4 bytes.
    pub addr: [u8; 16],
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u32,
    /// Leading bits of `addr` that are significant.
    pub key_len: u32,
    /// The class (its rule's counter slot), 0 for a class-less rule.
    pub class: u32,
}

impl BucketKey {
    /// Where the bucket lives: the IPv4 table's key word for a class-less
    /// IPv4 source, else the keyed table's key.
    pub fn keyed(&self) -> Option<BucketKeyV6> {
        match (self.family, self.class) {
            (FAMILY_V4, 0) => None,
            (FAMILY_V4, class) => Some(BucketKeyV6 {
                addr: mapped_v4([self.addr[0], self.addr[1], self.addr[2], self.addr[3]]),
                key_len: self.key_len | KEY_LEN_V4_MAPPED,
                class,
            }),
            (_, class) => Some(BucketKeyV6 { addr: self.addr, key_len: self.key_len, class }),
        }
    }
}

impl From<BucketKeyV4> for BucketKey {
    fn from(k: BucketKeyV4) -> BucketKey {
        let mut addr = [0; 16];
        addr[..4].copy_from_slice(&k.addr);
        BucketKey { addr, family: FAMILY_V4, key_len: k.key_len, class: 0 }
    }
}

impl From<BucketKeyV6> for BucketKey {
    fn from(k: BucketKeyV6) -> BucketKey {
        if k.key_len & KEY_LEN_V4_MAPPED != 0 {
            let mut addr = [0; 16];
            addr[..4].copy_from_slice(&k.addr[12..]);
            return BucketKey { addr, family: FAMILY_V4, key_len: k.key_len & !KEY_LEN_V4_MAPPED, class: k.class };
        }
        BucketKey { addr: k.addr, family: FAMILY_V6, key_len: k.key_len, class: k.class }
    }
}

/// `a.f += b.f` for each field named.
macro_rules! add_fields {
    ($a:ident, $b:ident; $($f:ident),+ $(,)?) => { $( $a.$f += $b.$f; )+ };
}

/// Packet counters, one set per CPU; user space sums them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Counters {
    /// Frames passed by a rule (admitted, allowed or monitored).
    pub passed_pkts: u64,
    pub passed_bytes: u64,
    /// Frames dropped by a rule (over the bucket, or a deny rule).
    pub dropped_pkts: u64,
    pub dropped_bytes: u64,
    /// Frames a monitor rule passed that policing would have dropped.
    pub would_drop_pkts: u64,
    pub would_drop_bytes: u64,
    /// IP frames no rule matched (passed).
    pub unmatched_pkts: u64,
    /// Non-IP frames (passed).
    pub non_ip_pkts: u64,
    /// Frames claiming IP too short to carry a source address (dropped).
    pub malformed_pkts: u64,
    /// IP fragments (policed like any frame of their source).
    pub fragment_pkts: u64,
    /// Buckets created.
    pub buckets_created: u64,
    /// Bucket inserts the kernel refused (the frame is still judged).
    pub bucket_insert_failed: u64,
    /// Compare-and-swap rounds lost to another CPU.
    pub cas_retries: u64,
    /// Frames dropped because every compare-and-swap round was lost.
    pub cas_exhausted: u64,
    /// New sources refused by their rule's new-source limiter: the frame is
    /// dropped and no bucket is made (table pressure).
    pub new_sources_limited: u64,
    /// Sources without a bucket that the recall knew (see
    /// [`crate::recall`]): let past the new-source limiter.
    pub recall_known: u64,
    /// Frames dropped on a debt resumed from the recall (no bucket made).
    pub recall_debt_drops: u64,
    /// Evicted buckets written to the recall.
    pub recall_stored: u64,
    /// Frames a source's bucket admitted that their rule's aggregate
    /// bucket (`--total-rate`) refused.
    pub total_drops: u64,
    /// Frames whose prefix has classes that one of them matched.
    pub class_matched: u64,
    /// Automatic bans started (see [`crate::ban`]).
    pub bans_started: u64,
    /// Frames of banned sources dropped (exact).
    pub ban_drops: u64,
    /// Bans not started because the store was full (the source stays
    /// policed by its bucket).
    pub bans_refused_full: u64,
}

impl Counters {
    /// The verdict counters, in the per-rule layout.
    pub fn verdicts(&self) -> RuleCounters {
        RuleCounters {
            passed_pkts: self.passed_pkts,
            passed_bytes: self.passed_bytes,
            dropped_pkts: self.dropped_pkts,
            dropped_bytes: self.dropped_bytes,
            would_drop_pkts: self.would_drop_pkts,
            would_drop_bytes: self.would_drop_bytes,
            buckets_created: self.buckets_created,
            total_dropped_pkts: self.total_drops,
        }
    }

    /// Adds another CPU's counters.
    pub fn add(&mut self, o: &Counters) {
        add_fields!(self, o; passed_pkts, passed_bytes, dropped_pkts, dropped_bytes, would_drop_pkts,
            would_drop_bytes, unmatched_pkts, non_ip_pkts, malformed_pkts, fragment_pkts, buckets_created,
            bucket_insert_failed, cas_retries, cas_exhausted, new_sources_limited, recall_known, recall_debt_drops,
            recall_stored, total_drops, class_matched, bans_started, ban_drops, bans_refused_full);
    }
}

/// Per-rule counters, one set per CPU; user space sums them.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RuleCounters {
    pub passed_pkts: u64,
    pub passed_bytes: u64,
    pub dropped_pkts: u64,
    pub dropped_bytes: u64,
    pub would_drop_pkts: u64,
    pub would_drop_bytes: u64,
    pub buckets_created: u64,
    /// Of the dropped (or would-drop) frames, those the rule's aggregate
    /// bucket refused (`--total-rate`); the rest their source's bucket did.
    pub total_dropped_pkts: u64,
}

impl RuleCounters {
    /// Adds another CPU's counters.
    pub fn add(&mut self, o: &RuleCounters) {
        add_fields!(self, o; passed_pkts, passed_bytes, dropped_pkts, dropped_bytes, would_drop_pkts,
            would_drop_bytes, buckets_created, total_dropped_pkts);
    }
}

/// A rule's automatic bans (see [`crate::ban`]), in [`MAP_BAN_PARAMS`] at
/// its counter slot.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BanParams {
    /// How long a ban lasts, ns (0: the rule makes none).
    pub ban_for_ns: u64,
    /// The longest a repeated ban grows to, ns (0: no growth).
    pub ban_max_ns: u64,
    /// Refused frames that start a ban (>= 1): since the last admission,
    /// or with `ban_within_ms`, within that window.
    pub ban_after: u32,
    /// `--ban-within`, ms (0: refusals since the last admission, counted
    /// in the slot). Else refusals are counted in [`MAP_BAN_WINDOWS`]
    /// ([`crate::ban::window_refusal`]), admissions or not.
    pub ban_within_ms: u32,
}

/// One entry of [`MAP_BAN_WINDOWS`]: a source's refusals counted in a
/// window (`--ban-within`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BanWindow {
    /// When the window began (its first refusal), ns.
    pub start_ns: u64,
    /// Refusals in it so far.
    pub count: u32,
    pub _pad: u32,
}

/// One entry of the ban store ([`MAP_BANS`], see [`crate::ban`]): a ban in
/// force, or one that ended and is kept for escalation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ban {
    /// When the ban ends, ns of the program's clock (CLOCK_MONOTONIC).
    pub end_ns: u64,
    /// Its length, ns (what the next one doubles).
    pub len_ns: u64,
    /// When it started, ns.
    pub start_ns: u64,
    /// Frames dropped while banned (sampled: an estimate).
    pub drops: u64,
    /// The counter slot of the rule whose bucket the source exceeded.
    pub rule_slot: u32,
    /// Bans of this key in a row (1: the first; escalation adds one).
    pub count: u32,
}

/// Layer-2/3 constants the parser uses.
pub mod wire {
    pub const ETH_HLEN: usize = 14;
    pub const ETH_P_IP: u16 = 0x0800;
    pub const ETH_P_IPV6: u16 = 0x86DD;
    pub const ETH_P_8021Q: u16 = 0x8100;
    pub const ETH_P_8021AD: u16 = 0x88A8;
    pub const VLAN_HLEN: usize = 4;
    /// 802.1Q / 802.1ad tags the parser looks through.
    pub const MAX_VLAN_TAGS: usize = 2;
    pub const IPV4_MIN_HLEN: usize = 20;
    pub const IPV6_HLEN: usize = 40;
    pub const IPPROTO_HOPOPTS: u8 = 0;
    pub const IPPROTO_ROUTING: u8 = 43;
    pub const IPPROTO_FRAGMENT: u8 = 44;
    pub const IPPROTO_AH: u8 = 51;
    pub const IPPROTO_DSTOPTS: u8 = 60;
    /// IPv6 extension headers walked at most (looking for a fragment header).
    pub const MAX_EXT_HEADERS: usize = 8;
    /// The walk stops once it is this many bytes into the frame.
    pub const MAX_EXT_OFFSET: usize = 512;
    /// Default bucket key length: one bucket per IPv4 address, per IPv6 /64.
    pub const DEFAULT_KEY_LEN_V4: u32 = 32;
    pub const DEFAULT_KEY_LEN_V6: u32 = 64;
}
