//! The maps and the load-time globals of the object's three programs.
//!
//! The names are the interface: user space (policer-user's `loader.rs`)
//! finds each map by its name in `policer_common::maps`, and each global
//! by its symbol; `LAYOUT` stamps the layout of what they hold. Grouped by
//! who reads them: the rules and the sources' tables (the policer), the
//! counters, the clock, classes, totals and bans, then capture's and
//! replay's own, then the globals the loader sets.

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    btf_maps,
    macros::{btf_map, map},
    maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
};
use policer_common::{
    BucketKeyV6, Counters, CpuScratch, DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES, MAX_IFACE_SLOTS, NewSources, Rule,
    RuleCounters,
    ban::{self, Ban, BanParams, BanWindow},
    capture::{CAPTURE_RING_BYTES, CaptureCounters, CaptureLane, CaptureScratch, MAX_CAPTURES},
    chain::ChainCounters,
    class::{self, ClassFilter, ClassList, Total},
    recall::RecallSet,
    replay::{ReplayCtl, ReplayFrame},
    syn::{self, SynConf, SynCounters, SynScratch},
    table::{self, Geometry, Set, SetDrops, SetKeys},
};

#[map]
pub(crate) static RULES_V4: LpmTrie<[u8; 4], Rule> = LpmTrie::with_max_entries(DEFAULT_MAX_RULES, 0);
#[map]
pub(crate) static RULES_V6: LpmTrie<[u8; 16], Rule> = LpmTrie::with_max_entries(DEFAULT_MAX_RULES, 0);
/// The IPv4 sources: a set-associative table (see policer_common::table),
/// resized by the loader to `--max-sources`. Mmapable, so the sets start on
/// a page and each is exactly one cache line.
#[map]
pub(crate) static BUCKETS_V4: Array<Set> =
    Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), BPF_F_MMAPABLE);
/// Drops counted per slot of BUCKETS_V4 (same index, sampled); kept apart
/// so the drop path does not write the table.
#[map]
pub(crate) static BUCKETS_V4_DROP: Array<SetDrops> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
/// The tables' hash seed and size (written by the loader).
#[map]
pub(crate) static BUCKETS_V4_GEOM: Array<Geometry> = Array::with_max_entries(1, 0);
/// The IPv6 sources: the same design, fingerprints for keys.
#[map]
pub(crate) static BUCKETS_V6: Array<Set> =
    Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), BPF_F_MMAPABLE);
#[map]
pub(crate) static BUCKETS_V6_DROP: Array<SetDrops> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
/// The IPv6 sources behind the fingerprints (for user space only).
#[map]
pub(crate) static BUCKETS_V6_KEYS: Array<SetKeys> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
/// What eviction forgot (policer_common::recall), one set per table set.
#[map]
pub(crate) static RECALL: Array<RecallSet> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
#[map]
pub(crate) static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(MAX_IFACE_SLOTS, 0);
#[map]
pub(crate) static RULE_COUNTERS: PerCpuArray<RuleCounters> = PerCpuArray::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// This CPU's last clock reading and the bench sequence (see CpuScratch).
#[map]
pub(crate) static CPU_SCRATCH: PerCpuArray<CpuScratch> = PerCpuArray::with_max_entries(1, 0);
#[map]
pub(crate) static NEW_SOURCES: Array<NewSources> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// See policer_common::MAP_FAST_PATH. Array lookups are inlined by the
/// verifier; the LPM-trie lookup is a helper call (9-15 ns measured).
#[map]
pub(crate) static FAST_PATH: Array<u32> = Array::with_max_entries(1, 0);
#[map]
pub(crate) static DEFAULT_RULES: Array<Rule> = Array::with_max_entries(4, 0);
/// The test clock: [ns, jiffies] (jiffies 0: no clock window).
#[map]
pub(crate) static CLOCK: Array<u64> = Array::with_max_entries(2, 0);
/// The classes of the prefixes that have some (policer_common::class).
#[map]
pub(crate) static CLASS_INDEX: LpmTrie<[u8; class::INDEX_KEY_BYTES], ClassList> =
    LpmTrie::with_max_entries(policer_common::MAX_CLASS_INDEX_ENTRIES, 0);
/// Which frames each group's classes can match (read before the lookup).
#[map]
pub(crate) static CLASS_FILTER: Array<ClassFilter> = Array::with_max_entries(class::MAX_CLASS_GROUPS, 0);
/// The rules' aggregate buckets, at their counter slots.
#[map]
pub(crate) static TOTALS: Array<Total> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// Automatic bans by bucket key (policer_common::ban): preallocated, never
/// evicted.
#[map]
pub(crate) static BANS: HashMap<BucketKeyV6, Ban> = HashMap::with_max_entries(ban::DEFAULT_MAX_BANS, 0);
/// The automatic bans of each rule, at its counter slot.
#[map]
pub(crate) static BAN_PARAMS: Array<BanParams> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// Refusals counted in a window (`--ban-within`), by bucket key: read
/// and written only by a refusal of a rule with a window.
#[map]
pub(crate) static BAN_WINDOWS: LruHashMap<BucketKeyV6, BanWindow> =
    LruHashMap::with_max_entries(policer_common::MAX_BAN_WINDOWS, 0);
// SYN cookies (crate::syn): per rule slot, the mode and cap, the
// `flood` mode's SYN budget, the counters; the verified sources and the
// reflection cap's networks; this CPU's work area.
#[map]
pub(crate) static SYN_CONF: Array<SynConf> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
#[map]
pub(crate) static SYN_TOTALS: Array<Total> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
#[map]
pub(crate) static SYN_COUNTERS: PerCpuArray<SynCounters> = PerCpuArray::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
#[map]
pub(crate) static SYN_VERIFIED: LruHashMap<[u8; 16], u64> = LruHashMap::with_max_entries(syn::MAX_VERIFIED, 0);
#[map]
pub(crate) static SYN_CAP: LruHashMap<[u8; 16], u64> = LruHashMap::with_max_entries(syn::MAX_CAP_NETS, 0);
/// The attached program itself, for the tail call that polices a frame
/// the SYN path handed back (filled by the loader).
#[map]
pub(crate) static SYN_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);
#[map]
pub(crate) static SYN_SCRATCH: PerCpuArray<SynScratch> = PerCpuArray::with_max_entries(1, 0);
/// The layout version stamp (policer_common::MAP_LAYOUT): written and
/// bound to the program by the loader, never read here.
#[map]
pub(crate) static LAYOUT: Array<u32> = Array::with_max_entries(1, 0);

/// The chain (policer_common::chain): the programs the policer hands what
/// it passes to, pinned by the loader at /sys/fs/bpf/policer/IFACE/chain.
/// BTF maps, so libbpf tools (bpftool, Katran-style roots) read them.
#[btf_map]
pub(crate) static CHAIN: btf_maps::ProgramArray<{ policer_common::chain::CHAIN_SLOTS as usize }> =
    btf_maps::ProgramArray::new();
#[btf_map]
pub(crate) static CHAIN_COUNTERS: btf_maps::PerCpuArray<ChainCounters, { MAX_IFACE_SLOTS as usize }> =
    btf_maps::PerCpuArray::new();

/// `policer capture` (policer_common::capture): the mask of the lanes in
/// use, read once per judged frame; 0 while no capture runs. A global of
/// the program's `.bss` (policer_common::capture::MAP_CAPTURE_ON), not a
/// map of its own: the read is one load from an address the verifier
/// knows, with no lookup and no null check, the whole of capture's cost on
/// the drop path while none runs. Written by the daemon only.
#[unsafe(no_mangle)]
pub(crate) static mut CAPTURE_ON: u64 = 0;
/// Each capture's filter, sampling and rate bound.
#[map]
pub(crate) static CAPTURE_LANES: Array<CaptureLane> = Array::with_max_entries(MAX_CAPTURES as u32, 0);
/// The lanes that capture each rule (at its counter slot).
#[map]
pub(crate) static CAPTURE_RULES: Array<u32> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
#[map]
pub(crate) static CAPTURE_COUNTERS: PerCpuArray<CaptureCounters> =
    PerCpuArray::with_max_entries(MAX_CAPTURES as u32, 0);
/// What the capture loop carries between lanes (see CaptureScratch).
#[map]
pub(crate) static CAPTURE_SCRATCH: PerCpuArray<CaptureScratch> = PerCpuArray::with_max_entries(1, 0);
/// The captured frames, to the daemon.
#[map]
pub(crate) static CAPTURE_RING: RingBuf = RingBuf::with_byte_size(CAPTURE_RING_BYTES, 0);
/// The capture program (`policer_capture` below), put here by the loader:
/// the verdict reaches it by a tail call, so the lanes run on a stack of
/// their own (this program's frame leaves too little of the 512 bytes the
/// verifier allows a call chain). Empty (a tail call that fails) until the
/// loader fills it, and again once the last descriptor of this array is
/// closed (the kernel clears a program array with its last user).
#[map]
pub(crate) static CAPTURE_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// `policer replay`'s batch of frames and its cursor
/// (policer_common::replay): one entry each in the object; replay sizes the
/// batch. Read only by `policer_replay`, which only replay loads.
#[map]
pub(crate) static REPLAY_FRAMES: Array<ReplayFrame> = Array::with_max_entries(1, BPF_F_MMAPABLE);
#[map]
pub(crate) static REPLAY_CTL: Array<ReplayCtl> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// `policer_replay` itself, put here by replay's loader: each frame ends
/// in a tail call to the next (policer_common::replay).
#[map]
pub(crate) static REPLAY_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Set by the loader (read-only data): non-zero reads the clock from
/// `CLOCK`, for tests that control time. Constant after load, so the
/// verifier prunes the branch that is not taken.
#[unsafe(no_mangle)]
pub(crate) static TEST_CLOCK: u32 = 0;

/// Set by the loader: the kernel's tick (1e9 / CONFIG_HZ) in ns, so the
/// program knows how far the clock can be from its last reading by the
/// jiffies alone (see policer_common::clock). 0: unknown, the clock is read
/// for every frame that reaches a bucket.
#[unsafe(no_mangle)]
pub(crate) static TICK_NS: u64 = 0;

/// Set by the loader: one IPv4 drop in 2^N is counted per source, as 2^N
/// (policer_common::table::DROP_SAMPLE_SHIFT); 0 counts every drop.
#[unsafe(no_mangle)]
pub(crate) static DROP_SAMPLE_SHIFT: u32 = table::DROP_SAMPLE_SHIFT;

/// Set by the benchmark's loader: non-zero replaces the source with
/// synthetic IPv4 sources 0..BENCH_SOURCES in turn, so one test frame
/// touches many buckets. Only in the benchmark's build of this program
/// (the `bench` feature, see Cargo.toml): the product carries no hook.
#[cfg(feature = "bench")]
#[unsafe(no_mangle)]
pub(crate) static BENCH_SOURCES: u32 = 0;
