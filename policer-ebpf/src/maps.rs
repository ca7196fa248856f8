//! The maps and the load-time globals of the object's three programs.
//!
//! The names are the interface: user space (policer-user's `loader.rs`)
//! finds each map by its name in `policer_common::maps`, and each global
//! by its symbol; `LAYOUT` stamps the layout of what they hold. Grouped by
//! who reads them: the rules and the sources' tables (the policer), the
//! counters, the clock, classes, totals and bans, then capture's and
//! replay's own, then the globals the loader sets.
//!
//! Every map is a BTF map (its key and value types in the object's BTF),
//! so libbpf tools read and load the object: `bpftool map dump` formats
//! the values, `bpftool prog loadall` loads it (docs/chain.md).

use aya_ebpf::{
    bindings::BPF_F_MMAPABLE,
    btf_maps::{Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    macros::btf_map,
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

#[btf_map]
pub(crate) static RULES_V4: LpmTrie<[u8; 4], Rule, { DEFAULT_MAX_RULES as usize }> = LpmTrie::new();
#[btf_map]
pub(crate) static RULES_V6: LpmTrie<[u8; 16], Rule, { DEFAULT_MAX_RULES as usize }> = LpmTrie::new();
/// The tables' sets at the default size (the loader resizes them).
const SETS: usize = table::sets_for(DEFAULT_MAX_SOURCES) as usize;
/// Rule slots at the default size (the loader resizes them): slot 0 is
/// never given to a rule.
const RULE_SLOTS: usize = DEFAULT_MAX_RULES as usize + 1;
/// `BPF_F_MMAPABLE`, as a map definition's flags.
const MMAPABLE: usize = BPF_F_MMAPABLE as usize;
/// A family's table of sources, and its drop counts.
pub(crate) type Table = Array<Set, SETS, MMAPABLE>;
pub(crate) type TableDrops = Array<SetDrops, SETS>;
/// The words of a table's used-sets bitmap at the default size.
const USED_WORDS: usize = table::used_words(SETS as u32) as usize;

/// The IPv4 sources: a set-associative table (see policer_common::table),
/// resized by the loader to `--max-sources`. Mmapable, so the sets start on
/// a page and each is exactly one cache line.
#[btf_map]
pub(crate) static BUCKETS_V4: Table = Array::new();
/// Drops counted per slot of BUCKETS_V4 (same index, sampled); kept apart
/// so the drop path does not write the table.
#[btf_map]
pub(crate) static BUCKETS_V4_DROP: TableDrops = Array::new();
/// The tables' hash seed and size (written by the loader).
#[btf_map]
pub(crate) static BUCKETS_V4_GEOM: Array<Geometry, 1> = Array::new();
/// Which sets of BUCKETS_V4 ever held a bucket, a bit each
/// (policer_common::table::used_bit): what a reader of the table reads.
#[btf_map]
pub(crate) static BUCKETS_V4_USED: Array<u64, USED_WORDS> = Array::new();
/// The IPv6 sources: the same design, fingerprints for keys.
#[btf_map]
pub(crate) static BUCKETS_V6: Table = Array::new();
#[btf_map]
pub(crate) static BUCKETS_V6_DROP: TableDrops = Array::new();
#[btf_map]
pub(crate) static BUCKETS_V6_USED: Array<u64, USED_WORDS> = Array::new();
/// The IPv6 sources behind the fingerprints (for user space only).
#[btf_map]
pub(crate) static BUCKETS_V6_KEYS: Array<SetKeys, SETS> = Array::new();
/// What eviction forgot (policer_common::recall), one set per table set.
#[btf_map]
pub(crate) static RECALL: Array<RecallSet, SETS> = Array::new();
#[btf_map]
pub(crate) static COUNTERS: PerCpuArray<Counters, { MAX_IFACE_SLOTS as usize }> = PerCpuArray::new();
#[btf_map]
pub(crate) static RULE_COUNTERS: PerCpuArray<RuleCounters, RULE_SLOTS> = PerCpuArray::new();
/// This CPU's last clock reading and the bench sequence (see CpuScratch).
#[btf_map]
pub(crate) static CPU_SCRATCH: PerCpuArray<CpuScratch, 1> = PerCpuArray::new();
#[btf_map]
pub(crate) static NEW_SOURCES: Array<NewSources, RULE_SLOTS> = Array::new();
/// See policer_common::MAP_FAST_PATH. Array lookups are inlined by the
/// verifier; the LPM-trie lookup is a helper call (9-15 ns measured).
#[btf_map]
pub(crate) static FAST_PATH: Array<u32, 1> = Array::new();
#[btf_map]
pub(crate) static DEFAULT_RULES: Array<Rule, 4> = Array::new();
/// The test clock: [ns, jiffies] (jiffies 0: no clock window).
#[btf_map]
pub(crate) static CLOCK: Array<u64, 2> = Array::new();
/// The classes of the prefixes that have some (policer_common::class).
#[btf_map]
pub(crate) static CLASS_INDEX: LpmTrie<
    [u8; class::INDEX_KEY_BYTES],
    ClassList,
    { policer_common::MAX_CLASS_INDEX_ENTRIES as usize },
> = LpmTrie::new();
/// Which frames each group's classes can match (read before the lookup).
#[btf_map]
pub(crate) static CLASS_FILTER: Array<ClassFilter, { class::MAX_CLASS_GROUPS as usize }> = Array::new();
/// The rules' aggregate buckets, at their counter slots.
#[btf_map]
pub(crate) static TOTALS: Array<Total, RULE_SLOTS> = Array::new();
/// Automatic bans by bucket key (policer_common::ban): preallocated, never
/// evicted.
#[btf_map]
pub(crate) static BANS: HashMap<BucketKeyV6, Ban, { ban::DEFAULT_MAX_BANS as usize }> = HashMap::new();
/// The automatic bans of each rule, at its counter slot.
#[btf_map]
pub(crate) static BAN_PARAMS: Array<BanParams, RULE_SLOTS> = Array::new();
/// Refusals counted in a window (`--ban-within`), by bucket key: read
/// and written only by a refusal of a rule with a window.
#[btf_map]
pub(crate) static BAN_WINDOWS: LruHashMap<BucketKeyV6, BanWindow, { policer_common::MAX_BAN_WINDOWS as usize }> =
    LruHashMap::new();
// SYN cookies (crate::syn): per rule slot, the mode and cap, the
// `flood` mode's SYN budget, the counters; the verified sources and the
// reflection cap's networks; this CPU's work area.
#[btf_map]
pub(crate) static SYN_CONF: Array<SynConf, RULE_SLOTS> = Array::new();
#[btf_map]
pub(crate) static SYN_TOTALS: Array<Total, RULE_SLOTS> = Array::new();
#[btf_map]
pub(crate) static SYN_COUNTERS: PerCpuArray<SynCounters, RULE_SLOTS> = PerCpuArray::new();
#[btf_map]
pub(crate) static SYN_VERIFIED: LruHashMap<[u8; 16], u64, { syn::MAX_VERIFIED as usize }> = LruHashMap::new();
/// The reflection cap: a GCRA state (0: none yet) per slot of hashed
/// networks (policer_common::syn::cap_slot).
#[btf_map]
pub(crate) static SYN_CAP: Array<u64, { syn::CAP_SLOTS as usize }> = Array::new();
/// The filter in front of `SYN_VERIFIED` (policer_common::syn::seen_bit).
#[btf_map]
pub(crate) static SYN_SEEN: Array<u64, { syn::SEEN_WORDS as usize }> = Array::new();
/// Until when the listener is looked up by the SYN's own tuple
/// (policer_common::syn::EXACT_NS; written before any rule slot gets
/// SYN cookies).
#[btf_map]
pub(crate) static SYN_EXACT: Array<u64, 1> = Array::new();
/// The attached program itself, for the tail call that polices a frame
/// the SYN path handed back (filled by the loader).
#[btf_map]
pub(crate) static SYN_PROG: ProgramArray<1> = ProgramArray::new();
#[btf_map]
pub(crate) static SYN_SCRATCH: PerCpuArray<SynScratch, 1> = PerCpuArray::new();
/// The layout version stamp (policer_common::MAP_LAYOUT): written and
/// bound to the program by the loader, never read here.
#[btf_map]
pub(crate) static LAYOUT: Array<u32, 1> = Array::new();

/// The chain of a member (policer_common::chain): the root's program
/// array policer joined (`attach --join`), pinned by that root; on the hook
/// each interface's chain is its own array, reached through `CHAINS`.
/// BTF maps, so libbpf tools (bpftool, Katran-style roots) read them.
#[btf_map]
pub(crate) static CHAIN: ProgramArray<{ policer_common::chain::CHAIN_SLOTS as usize }> = ProgramArray::new();
/// Per interface slot (`ifindex % MAX_IFACE_SLOTS`), the dispatcher of
/// that interface's own chain (policer_common::chain::MAP_CHAINS), put
/// here by the daemon: the hook's hand-off tail-calls it.
#[btf_map]
pub(crate) static CHAINS: ProgramArray<{ MAX_IFACE_SLOTS as usize }> = ProgramArray::new();
#[btf_map]
pub(crate) static CHAIN_COUNTERS: PerCpuArray<ChainCounters, { MAX_IFACE_SLOTS as usize }> = PerCpuArray::new();

/// `policer capture` (policer_common::capture): the mask of the lanes in
/// use, read once per judged frame; 0 while no capture runs. A global of
/// the program's `.bss` (policer_common::capture::MAP_CAPTURE_ON), not a
/// map of its own: the read is one load from an address the verifier
/// knows, with no lookup and no null check, the whole of capture's cost on
/// the drop path while none runs. Written by the daemon only.
#[unsafe(no_mangle)]
pub(crate) static mut CAPTURE_ON: u64 = 0;
/// Each capture's filter, sampling and rate bound.
#[btf_map]
pub(crate) static CAPTURE_LANES: Array<CaptureLane, MAX_CAPTURES> = Array::new();
/// The lanes that capture each rule (at its counter slot).
#[btf_map]
pub(crate) static CAPTURE_RULES: Array<u32, RULE_SLOTS> = Array::new();
#[btf_map]
pub(crate) static CAPTURE_COUNTERS: PerCpuArray<CaptureCounters, MAX_CAPTURES> = PerCpuArray::new();
/// What the capture loop carries between lanes (see CaptureScratch).
#[btf_map]
pub(crate) static CAPTURE_SCRATCH: PerCpuArray<CaptureScratch, 1> = PerCpuArray::new();
/// The captured frames, to the daemon. Its type is `()`, not the record:
/// libbpf (bpftool) takes a BTF map's value size from its value type, and
/// the kernel wants 0 for a ring buffer; the records are reserved by type
/// (`reserve_untyped`).
#[btf_map]
pub(crate) static CAPTURE_RING: RingBuf<(), { CAPTURE_RING_BYTES as usize }> = RingBuf::new();
/// The capture program (`policer_capture` below), put here by the loader:
/// the verdict reaches it by a tail call, so the lanes run on a stack of
/// their own (this program's frame leaves too little of the 512 bytes the
/// verifier allows a call chain). Empty (a tail call that fails) until the
/// loader fills it, and again once the last descriptor of this array is
/// closed (the kernel clears a program array with its last user).
#[btf_map]
pub(crate) static CAPTURE_PROG: ProgramArray<1> = ProgramArray::new();

/// `policer replay`'s batch of frames and its cursor
/// (policer_common::replay): one entry each in the object; replay sizes the
/// batch. Read only by `policer_replay`, which only replay loads.
#[btf_map]
pub(crate) static REPLAY_FRAMES: Array<ReplayFrame, 1, MMAPABLE> = Array::new();
#[btf_map]
pub(crate) static REPLAY_CTL: Array<ReplayCtl, 1, MMAPABLE> = Array::new();
/// `policer_replay` itself, put here by replay's loader: each frame ends
/// in a tail call to the next (policer_common::replay).
#[btf_map]
pub(crate) static REPLAY_PROG: ProgramArray<1> = ProgramArray::new();

/// Set by the loader (read-only data): non-zero reads the clock from
/// `CLOCK`, for tests that control time. Constant after load, so the
/// verifier prunes the branch that is not taken.
#[unsafe(no_mangle)]
pub(crate) static TEST_CLOCK: u32 = 0;

/// Set by the loader (read-only data): the chain's first slot
/// (policer_common::chain::GLOBAL_CHAIN_FROM): 0 on the hook, N + 1 as a
/// member in slot N of another root's array.
#[unsafe(no_mangle)]
pub(crate) static CHAIN_FROM: u32 = 0;

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
