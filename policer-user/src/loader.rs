//! Loading the XDP object, filling its maps and attaching it.

use std::{
    ffi::CString,
    io,
    net::IpAddr,
    os::fd::{AsFd, AsRawFd, OwnedFd, RawFd},
    path::PathBuf,
    sync::Arc,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, LpmTrie, MapData, PerCpuArray, ProgramArray},
    programs::Xdp,
};
use ipnet::IpNet;
use policer_common::{
    Bucket, BucketKey, BucketKeyV6, Counters, DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES, GLOBAL_DROP_SAMPLE_SHIFT,
    GLOBAL_TEST_CLOCK, LAYOUT_VERSION, MAP_BUCKETS_V4, MAP_BUCKETS_V4_DROPS, MAP_BUCKETS_V4_GEOMETRY,
    MAP_BUCKETS_V4_USED, MAP_BUCKETS_V6, MAP_BUCKETS_V6_DROPS, MAP_BUCKETS_V6_KEYS, MAP_BUCKETS_V6_USED,
    MAP_CLASS_FILTER, MAP_CLASS_INDEX, MAP_CLOCK, MAP_COUNTERS, MAP_DEFAULT_RULES, MAP_FAST_PATH, MAP_LAYOUT,
    MAP_NEW_SOURCES, MAP_RECALL, MAP_RULE_COUNTERS, MAP_RULES_V4, MAP_RULES_V6, MAP_TOTALS, MAX_RULES, NewSources,
    PROGRAM_NAME, Rule, RuleCounters,
    ban::{Ban, BanParams},
    class::{ClassFilter, ClassList, INDEX_KEY_BYTES, Total},
    recall::{self, RecallSet},
    table::{self, Geometry, Set, SetDrops, SetKeys},
};

use crate::{
    compile::{Compiled, IndexKey},
    error::{Error, Result},
    trie::{LpmKey, TrieWriter},
};

/// The XDP object, built by build.rs with the pinned toolchain.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/policer"));

/// How to attach: `auto` tries native (driver) XDP first, then generic.
/// The same names on the command line and in the config file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Auto,
    Native,
    Skb,
}

impl Mode {
    /// Netlink mode flags to try, in order.
    pub fn tries(self) -> &'static [u32] {
        use crate::netlink::{XDP_FLAGS_DRV_MODE as DRV, XDP_FLAGS_SKB_MODE as SKB};
        match self {
            Mode::Auto => &[DRV, SKB],
            Mode::Native => &[DRV],
            Mode::Skb => &[SKB],
        }
    }

    /// The name of a netlink mode flag.
    pub fn flag_name(flags: u32) -> &'static str {
        if flags & crate::netlink::XDP_FLAGS_SKB_MODE != 0 {
            "skb"
        } else if flags & crate::netlink::XDP_FLAGS_DRV_MODE != 0 {
            "native"
        } else {
            "default"
        }
    }
}

#[derive(Clone, Debug)]
pub struct LoadOptions {
    /// Capacity of the bucket table.
    pub max_sources: u32,
    /// Rules the program holds (each with its own counters and limiter).
    pub max_rules: u32,
    /// Entries of the automatic-ban store (policer_common::ban).
    pub max_bans: u32,
    /// Read the clock from the CLOCK map (tests only).
    pub test_clock: bool,
    /// Another build of the XDP program to load instead of
    /// [`EBPF_OBJECT`]: the benchmark's (with its hooks), which the
    /// product does not carry. `None`: the product's.
    #[doc(hidden)]
    pub variant: Option<Variant>,
    /// The kernel's tick in ns; `None` reads CONFIG_HZ from the kernel's
    /// config (0: unknown, the program reads the clock for every frame).
    pub tick_ns: Option<u64>,
    /// Existing maps to reuse, by name: bpffs paths where they are pinned
    /// (adopting a running policer's rules, buckets and counters).
    pub reuse: Vec<(&'static str, PathBuf)>,
    /// The IPv4 table's hash seed; `None` draws a random one (tests fix it
    /// to know which sources share a set).
    pub table_seed: Option<u64>,
    /// One IPv4 drop in 2^N is counted per source, as 2^N
    /// ([`table::DROP_SAMPLE_SHIFT`]); tests set 0 to count every drop.
    pub drop_sample_shift: u32,
    /// The layout version the program is stamped with ([`MAP_LAYOUT`]):
    /// [`LAYOUT_VERSION`]. Tests only: another version makes the program
    /// look like another build's; `None` stamps nothing, like a build from
    /// before layout versions.
    #[doc(hidden)]
    pub layout_version: Option<u32>,
    /// Frames in a `policer replay` batch: non-zero sizes its map and
    /// loads the batch entry (policer_common::replay) *instead of* the
    /// attached entry and the capture program: such a load is for
    /// replay only (its `program()` is not loaded, and cannot be attached).
    pub replay_batch: u32,
    /// Where the chain's array (policer_common::chain) is pinned: on the
    /// hook (`chain_from` 0) the interfaces' dispatchers (`CHAINS`, at the
    /// first interface's `dispatch` pin), as a member the root's array.
    /// Reused when a pin is there (a restart, an upgrade: the programs in
    /// it stay), else made and pinned there. `None`: the program's own,
    /// unpinned.
    pub chain_pin: Option<PathBuf>,
    /// The chain's first slot ([`GLOBAL_CHAIN_FROM`]): 0 on the hook; N +
    /// 1 as a member in slot N of another root's array (`chain_pin` is
    /// then that array).
    ///
    /// [`GLOBAL_CHAIN_FROM`]: policer_common::chain::GLOBAL_CHAIN_FROM
    pub chain_from: u32,
    /// A large config is read while this load runs (the reading is then
    /// the start's critical path): the tail calls' programs, verified
    /// beside the attached one, are verified at a lower priority until the
    /// attached one is done, so that a third busy thread does not take the
    /// reading's CPU on a two-core machine.
    pub reading_beside: bool,
}

/// A build of the XDP program other than the product's, and the `u32`
/// globals to set in it (each must exist in it, or loading fails).
#[derive(Clone)]
pub struct Variant {
    pub object: &'static [u8],
    pub globals: Vec<(&'static str, u32)>,
}

impl std::fmt::Debug for Variant {
    /// The object's size, not its bytes.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Variant").field("object_bytes", &self.object.len()).field("globals", &self.globals).finish()
    }
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            max_sources: DEFAULT_MAX_SOURCES,
            max_rules: DEFAULT_MAX_RULES,
            max_bans: policer_common::ban::DEFAULT_MAX_BANS,
            test_clock: false,
            variant: None,
            tick_ns: None,
            reuse: vec![],
            table_seed: None,
            drop_sample_shift: table::DROP_SAMPLE_SHIFT,
            layout_version: Some(LAYOUT_VERSION),
            replay_batch: 0,
            chain_pin: None,
            chain_from: 0,
            reading_beside: false,
        }
    }
}

/// A loaded (not yet attached) policer. Dropping it detaches every link it
/// made and unloads the program.
pub struct Policer {
    pub ebpf: Ebpf,
    /// Read-only handles on the counter and bucket maps, shared with the
    /// daemon's readers (stats, top, /metrics) so a long read of the table
    /// never waits for, or holds up, the one owner that writes.
    reader: Arc<MapReader>,
}

/// Read-only access to what the program counts and remembers: its own
/// duplicates of the maps' file descriptors, so it can live on another
/// thread than the [`Policer`] that loaded them (the kernel serializes
/// nothing here: map reads run beside the program and beside writers).
pub struct MapReader {
    counters: OwnedFd,
    rule_counters: OwnedFd,
    /// SYN cookies' counters (policer_common::syn); None in a program
    /// built before them.
    syn_counters: Option<OwnedFd>,
    /// SYN cookies' verified sources; None in a program built before them.
    syn_verified: Option<OwnedFd>,
    buckets_v4: OwnedFd,
    buckets_v4_drops: OwnedFd,
    buckets_v6: OwnedFd,
    buckets_v6_drops: OwnedFd,
    buckets_v6_keys: OwnedFd,
    /// The tables' used-sets bitmaps (policer_common::table::used_bit);
    /// None in a program built before them (its tables are read whole).
    buckets_v4_used: Option<OwnedFd>,
    buckets_v6_used: Option<OwnedFd>,
    recall: OwnedFd,
    new_sources: OwnedFd,
    bans: OwnedFd,
    /// What `policer inspect` resolves a frame's rule with, as the program
    /// does: the rule tries, the default-rules fast path, the class maps.
    rules_v4: OwnedFd,
    rules_v6: OwnedFd,
    fast_path: OwnedFd,
    default_rules: OwnedFd,
    class_index: OwnedFd,
    class_filter: OwnedFd,
    /// The chain's counters per interface slot (policer_common::chain).
    chain_counters: OwnedFd,
    /// Entries the ban store holds.
    ban_capacity: u32,
    /// The tables' hash and size; fixed for the tables' life.
    geometry: Geometry,
}

/// Where a source's slot is: the table, its set (as read) and the way.
struct SlotAt<'a> {
    table: &'a OwnedFd,
    name: &'static str,
    index: u32,
    set: Set,
    way: usize,
}

/// The recall's fill (see policer_common::recall).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecallFill {
    /// Entries it holds.
    pub capacity: u64,
    /// Entries that would recall a source now: exact when the recall has
    /// at most [`RECALL_SAMPLE_SETS`] sets, else estimated from that many
    /// sets spread evenly over it.
    pub live: u64,
}

/// Sets of the recall read to estimate its fill.
pub const RECALL_SAMPLE_SETS: u64 = 1024;

/// The running kernel's CONFIG_HZ, from /proc/config.gz or
/// /boot/config-RELEASE; `None` if neither says.
pub fn kernel_hz() -> Option<u64> {
    use std::io::Read;
    let from_gz = || {
        let mut text = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open("/proc/config.gz").ok()?).read_to_string(&mut text).ok()?;
        Some(text)
    };
    let from_boot = || {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
        std::fs::read_to_string(format!("/boot/config-{}", release.trim())).ok()
    };
    let text = from_gz().or_else(from_boot)?;
    parse_hz(&text)
}

/// `CONFIG_HZ=N` from a kernel config.
fn parse_hz(config: &str) -> Option<u64> {
    config.lines().find_map(|l| l.strip_prefix("CONFIG_HZ=")).and_then(|v| v.trim().parse().ok()).filter(|&hz| hz > 0)
}

/// The interface index of `name`, or a clear error.
pub fn if_index(name: &str) -> Result<u32> {
    let c = CString::new(name).map_err(|_| Error::UnknownInterface(name.into()))?;
    // SAFETY: `c` is a valid NUL-terminated string.
    let idx = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if idx == 0 { Err(Error::UnknownInterface(name.into())) } else { Ok(idx) }
}

pub fn is_root() -> bool {
    // SAFETY: no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn is_eperm(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES))
}

/// The descriptors of the maps a rule set lives in.
pub struct RuleFds {
    tries: TrieWriter,
    index: RawFd,
    filter: RawFd,
}

impl RuleFds {
    pub fn of(ebpf: &Ebpf) -> Result<RuleFds> {
        Ok(RuleFds {
            tries: TrieWriter::new(map_fd(ebpf, MAP_RULES_V4)?, map_fd(ebpf, MAP_RULES_V6)?),
            index: map_fd(ebpf, MAP_CLASS_INDEX)?,
            filter: map_fd(ebpf, MAP_CLASS_FILTER)?,
        })
    }
}

/// Makes the rule maps behind `f` go from `have` to `want` (see
/// [`Policer::sync_rules`] for the order). Prefixes go in batches where
/// the kernel has batch updates for tries (100 000 rules at a start).
/// Writes the tries' `changed` prefixes, then removes the `gone` ones; at
/// the tries' limit one goes first for each new one that finds no room.
fn write_prefixes(f: &RuleFds, changed: impl IntoIterator<Item = (IpNet, Rule)>, mut gone: Vec<IpNet>) -> Result<()> {
    f.tries.write_each(changed, |net| {
        let Some(i) = gone.iter().rposition(|g| g.addr().is_ipv6() == net.addr().is_ipv6()) else { return Ok(false) };
        f.tries.set(gone.remove(i), None)?;
        Ok(true)
    })?;
    // The rest at once (a reload that drops 100 000 rules: a few batch
    // calls, not a syscall each).
    let (v4, v6): (Vec<IpNet>, Vec<IpNet>) = gone.into_iter().partition(|n| n.addr().is_ipv4());
    f.tries.delete_all(false, &v4)?;
    f.tries.delete_all(true, &v6)?;
    Ok(())
}

pub fn sync_maps(f: &RuleFds, have: &Compiled, want: &Compiled) -> Result<()> {
    // Filters first as the union of before and after (a frame never skips
    // a lookup that could match), exact at the end.
    for (g, w) in &want.filters {
        let u = have.filters.get(g).map_or(*w, |h| h.union(w));
        if have.filters.get(g) != Some(&u) {
            crate::batch::update_elem(f.filter, g, &u).map_err(Error::kernel(MAP_CLASS_FILTER))?;
        }
    }
    for (k, v) in &want.index {
        if have.index.get(k) != Some(v) {
            crate::batch::update_elem(f.index, &LpmKey { len: k.0, data: k.1 }, v)
                .map_err(Error::kernel(MAP_CLASS_INDEX))?;
        }
    }
    // Prefixes, new and changed; those that go, last. But at the tries'
    // limit one goes first for each new one that finds no room.
    let changed = want.prefixes.iter().filter(|(n, r)| have.prefixes.get(n) != Some(r)).map(|(n, r)| (*n, *r));
    let gone: Vec<IpNet> = have.prefixes.keys().filter(|n| !want.prefixes.contains_key(n)).copied().collect();
    write_prefixes(f, changed, gone)?;
    for k in have.index.keys().filter(|k| !want.index.contains_key(k)) {
        crate::batch::delete_elem(f.index, &LpmKey { len: k.0, data: k.1 }).map_err(Error::kernel(MAP_CLASS_INDEX))?;
    }
    for (g, w) in &want.filters {
        if have.filters.get(g).is_none_or(|h| h.union(w) != *w) {
            crate::batch::update_elem(f.filter, g, w).map_err(Error::kernel(MAP_CLASS_FILTER))?;
        }
    }
    for g in have.filters.keys().filter(|g| !want.filters.contains_key(g)) {
        crate::batch::update_elem(f.filter, g, &ClassFilter::default()).map_err(Error::kernel(MAP_CLASS_FILTER))?;
    }
    Ok(())
}

/// Whether a program can be loaded for `n` sources (`what`: the setting,
/// as the message names it): at least 1, at most [`MAX_SOURCES`], whose
/// tables take what the kernel must preallocate at a start (said in the
/// message). A config past it would be applied by a reload and then fail
/// the next start with ENOMEM: it is refused wherever it is read (the
/// config's checks call it too; it lives here, where the tables are
/// sized, as `config` stands on the loader).
///
/// [`MAX_SOURCES`]: policer_common::MAX_SOURCES
pub fn check_max_sources(n: u32, what: &str) -> std::result::Result<(), String> {
    use policer_common::{MAX_SOURCES, layout::source_tables_bytes};
    let mib = |n: u32| source_tables_bytes(n).div_ceil(1 << 20);
    if (1..=MAX_SOURCES).contains(&n) {
        return Ok(());
    }
    let would = if n > MAX_SOURCES { format!("; {n} would take {} MiB", mib(n)) } else { String::new() };
    Err(format!(
        "{what} must be 1 to {MAX_SOURCES} (the source tables are preallocated in the kernel at a start: \
         {} MiB at {MAX_SOURCES}{would})",
        mib(MAX_SOURCES),
    ))
}

/// Whether `n` sources fit a machine of `mem_total` bytes (its MemTotal):
/// their tables ([`source_tables_bytes`]) past all of it are refused (the
/// start would fail with ENOMEM, or leave the machine nothing), past half
/// of it are warned of (`Ok(Some(warning))`). `what`: the setting, as the
/// message names it.
///
/// [`source_tables_bytes`]: policer_common::layout::source_tables_bytes
pub fn check_sources_memory(n: u32, mem_total: u64, what: &str) -> std::result::Result<Option<String>, String> {
    let need = policer_common::layout::source_tables_bytes(n);
    let mib = |b: u64| b.div_ceil(1 << 20);
    let say = |how: &str| {
        format!(
            "{what} = {n}: the source tables take {} MiB of kernel memory at a start, {how} this machine's {} MiB \
             (MemTotal)",
            mib(need),
            mib(mem_total)
        )
    };
    if need > mem_total {
        Err(format!("{}; nothing changed: give fewer sources", say("more than")))
    } else if need > mem_total / 2 {
        Ok(Some(say("over half of")))
    } else {
        Ok(None)
    }
}

/// This machine's memory (MemTotal of /proc/meminfo), in bytes; `None`
/// where it cannot be read.
pub fn mem_total() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// [`check_max_sources`], then [`check_sources_memory`] on this machine
/// (skipped where its memory cannot be read): what a start of `n`
/// sources needs, checked where the operator gives it (the command line,
/// the config's `max_sources` at a start, a reload, `policer check`).
pub fn check_sources_here(n: u32, what: &str) -> std::result::Result<Option<String>, String> {
    check_max_sources(n, what)?;
    match mem_total() {
        Some(total) => check_sources_memory(n, total, what),
        None => Ok(None),
    }
}

impl Policer {
    /// Loads the program. `opts.max_sources` is not bounded here: an
    /// adopted program's size is whatever its build allowed (its maps are
    /// reused); the sizes an operator gives are checked where given
    /// ([`check_sources_here`]).
    pub fn load(opts: &LoadOptions) -> Result<Policer> {
        check_sizes(opts)?;
        let test_clock: u32 = opts.test_clock.into();
        let tick_ns = opts.tick_ns.unwrap_or_else(|| kernel_hz().map_or(0, policer_common::clock::tick_ns));
        let drop_shift = opts.drop_sample_shift.min(15);
        let mut loader = EbpfLoader::new();
        loader
            .map_max_entries(MAP_BUCKETS_V4, table::sets_for(opts.max_sources))
            .map_max_entries(MAP_BUCKETS_V4_DROPS, table::sets_for(opts.max_sources))
            .map_max_entries(MAP_BUCKETS_V6, table::sets_for(opts.max_sources))
            .map_max_entries(MAP_BUCKETS_V6_DROPS, table::sets_for(opts.max_sources))
            .map_max_entries(MAP_BUCKETS_V6_KEYS, table::sets_for(opts.max_sources))
            .map_max_entries(MAP_BUCKETS_V4_USED, table::used_words(table::sets_for(opts.max_sources)))
            .map_max_entries(MAP_BUCKETS_V6_USED, table::used_words(table::sets_for(opts.max_sources)))
            .map_max_entries(MAP_RECALL, table::sets_for(opts.max_sources))
            // Tries hold sets' prefixes too (`rule import`): sized for
            // millions; an LPM trie is never preallocated, so the size
            // costs nothing until entries are written.
            .map_max_entries(MAP_RULES_V4, TRIE_PREFIXES.max(opts.max_rules))
            .map_max_entries(MAP_RULES_V6, TRIE_PREFIXES.max(opts.max_rules))
            // Slot 0 is never given to a rule: max_rules + 1 entries.
            .map_max_entries(MAP_RULE_COUNTERS, opts.max_rules + 1)
            .map_max_entries(MAP_NEW_SOURCES, opts.max_rules + 1)
            .map_max_entries(MAP_TOTALS, opts.max_rules + 1)
            .map_max_entries(policer_common::MAP_BAN_PARAMS, opts.max_rules + 1)
            .map_max_entries(policer_common::capture::MAP_CAPTURE_RULES, opts.max_rules + 1)
            .map_max_entries(policer_common::MAP_BANS, opts.max_bans.max(1))
            .map_max_entries(policer_common::replay::MAP_REPLAY_FRAMES, opts.replay_batch.max(1))
            .override_global(GLOBAL_DROP_SAMPLE_SHIFT, &drop_shift, true)
            .override_global(GLOBAL_TEST_CLOCK, &test_clock, true)
            .override_global(policer_common::GLOBAL_TICK_NS, &tick_ns, true)
            .override_global(policer_common::chain::GLOBAL_CHAIN_FROM, &opts.chain_from, true);
        size_syn_maps(&mut loader, opts.max_rules);
        pin_paths(&mut loader, opts)?;
        let object = match &opts.variant {
            Some(v) => {
                for (name, value) in &v.globals {
                    loader.override_global(name, value, true);
                }
                v.object
            }
            None => EBPF_OBJECT,
        };
        if object.is_empty() {
            return Err(Error::Invalid(
                "this build has no XDP object (built with AYA_BUILD_SKIP=1, for host tests): build without it".into(),
            ));
        }
        let mut ebpf = loader.load(object).map_err(|e| match &e {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError { io_error, .. }) if is_eperm(io_error) => {
                Error::NotRoot("loading the XDP program")
            }
            _ => Error::Load(Box::new(e)),
        })?;
        if opts.replay_batch == 0 {
            load_programs(&mut ebpf, opts.reading_beside)?;
            if let Some(v) = opts.layout_version {
                stamp_layout(&mut ebpf, v)?;
            }
        } else {
            // A replay runs only its entry, which calls the policer's own
            // function: the attached entry and the capture program are not
            // loaded (each would be verified for nothing; the entry's
            // verification is most of a replay's start). Nothing is
            // attached, so no layout stamp either.
            load_replay(&mut ebpf)?;
        }
        let reader = Arc::new(MapReader::of(&ebpf)?);
        let mut p = Policer { ebpf, reader };
        // A table taken over keeps its hash; a new one gets a fresh secret
        // seed, so nobody can pick sources that share a set.
        if !opts.reuse.iter().any(|(n, _)| *n == MAP_BUCKETS_V4) {
            let seed = match opts.table_seed {
                Some(s) => s,
                None => random_u64()?,
            };
            let geometry = Geometry::new(seed, opts.max_sources);
            let mut m: Array<&mut MapData, Geometry> = Array::try_from(
                p.ebpf.map_mut(MAP_BUCKETS_V4_GEOMETRY).ok_or(Error::Missing(MAP_BUCKETS_V4_GEOMETRY))?,
            )
            .map_err(Error::map(MAP_BUCKETS_V4_GEOMETRY))?;
            m.set(0, &geometry, 0).map_err(Error::map(MAP_BUCKETS_V4_GEOMETRY))?;
        }
        // The reader hashes as the table does (fresh or taken over).
        let g: Option<Geometry> = crate::batch::lookup(map_fd(&p.ebpf, MAP_BUCKETS_V4_GEOMETRY)?, &0u32)
            .map_err(Error::kernel(format!("reading {MAP_BUCKETS_V4_GEOMETRY}")))?;
        if let Some(reader) = Arc::get_mut(&mut p.reader) {
            reader.geometry = g.unwrap_or_default();
        }
        Ok(p)
    }

    /// Takes the capture maps out of the program (the daemon's capture
    /// hub becomes their one writer). A program without them (loaded from
    /// an object older than capture) is a clear error, not a crash.
    pub fn take_capture(&mut self) -> Result<CaptureMaps> {
        use policer_common::capture::{
            MAP_CAPTURE_COUNTERS, MAP_CAPTURE_LANES, MAP_CAPTURE_ON, MAP_CAPTURE_RING, MAP_CAPTURE_RULES,
        };
        let missing = |name: &str| {
            Error::Invalid(format!(
                "capture is not available: the loaded program has no {name} map (an object built without the \
                 capture path, or older than capture; docs/capture.md)"
            ))
        };
        let names = [MAP_CAPTURE_ON, MAP_CAPTURE_LANES, MAP_CAPTURE_RULES, MAP_CAPTURE_COUNTERS, MAP_CAPTURE_RING];
        if let Some(n) = names.iter().find(|n| self.ebpf.map(n).is_none()) {
            return Err(missing(n));
        }
        // The lanes run in the capture program: without it (an object of
        // another build) the lanes would never be read.
        if self.ebpf.program(policer_common::capture::CAPTURE_PROGRAM).is_none()
            || self.ebpf.map(policer_common::capture::MAP_CAPTURE_PROG).is_none()
        {
            return Err(Error::Invalid(format!(
                "capture is not available: the loaded object has no {} program (a build older than capture's \
                 tail call; docs/capture.md)",
                policer_common::capture::CAPTURE_PROGRAM
            )));
        }
        let mut take = |name: &'static str| self.ebpf.take_map(name).ok_or_else(|| missing(name));
        Ok(CaptureMaps {
            on: Array::try_from(take(MAP_CAPTURE_ON)?).map_err(Error::map(MAP_CAPTURE_ON))?,
            lanes: Array::try_from(take(MAP_CAPTURE_LANES)?).map_err(Error::map(MAP_CAPTURE_LANES))?,
            rules: Array::try_from(take(MAP_CAPTURE_RULES)?).map_err(Error::map(MAP_CAPTURE_RULES))?,
            counters: PerCpuArray::try_from(take(MAP_CAPTURE_COUNTERS)?).map_err(Error::map(MAP_CAPTURE_COUNTERS))?,
            ring: aya::maps::RingBuf::try_from(take(MAP_CAPTURE_RING)?).map_err(Error::map(MAP_CAPTURE_RING))?,
        })
    }

    pub fn program(&mut self) -> &mut Xdp {
        // Checked at load.
        self.ebpf.program_mut(PROGRAM_NAME).and_then(|p| p.try_into().ok()).expect("loaded")
    }

    /// Installs (or replaces, atomically for that prefix) the rule for `net`.
    pub fn set_rule(&mut self, net: IpNet, rule: &Rule) -> Result<()> {
        self.trie_writer()?.set(net, Some(rule))
    }

    fn map_fd(&self, name: &'static str) -> Result<RawFd> {
        map_fd(&self.ebpf, name)
    }

    /// The read-only side of the maps, for other threads.
    pub fn reader(&self) -> Arc<MapReader> {
        self.reader.clone()
    }

    /// The SYN path's filter of verified sources and its exact set, with
    /// descriptors of their own (None: a program without SYN cookies).
    pub fn seen_filter(&self) -> Option<crate::syncookies::SeenFilter> {
        use policer_common::syn::{MAP_SYN_SEEN, MAP_SYN_VERIFIED};
        let dup = |name: &'static str| -> Option<OwnedFd> {
            let fd = map_fd(&self.ebpf, name).ok()?;
            // SAFETY: `fd` is open for as long as `self.ebpf` lives; the
            // duplicate is ours.
            unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned().ok()
        };
        Some(crate::syncookies::SeenFilter {
            seen: dup(MAP_SYN_SEEN)?,
            verified: dup(MAP_SYN_VERIFIED)?,
            exact: dup(policer_common::syn::MAP_SYN_EXACT),
        })
    }

    /// Sets (or with None clears) the automatic bans of the rule at `slot`.
    pub fn set_ban_params(&mut self, slot: u32, params: Option<&BanParams>) -> Result<()> {
        let p = params.copied().unwrap_or_default();
        crate::batch::update_elem(self.map_fd(policer_common::MAP_BAN_PARAMS)?, &slot, &p)
            .map_err(Error::kernel(policer_common::MAP_BAN_PARAMS))
    }

    /// Lifts the automatic ban of `key`: its entry goes (false: it had
    /// none), and a slot that caches the ban or counts refusals is freed,
    /// so the source's next frame is judged as a new source's. The set is
    /// rewritten whole: a charge another CPU made to another slot of the
    /// same set in the microseconds between the read and the write can be
    /// lost (a frame or two of budget, once).
    pub fn lift_ban(&mut self, key: &BucketKeyV6) -> Result<bool> {
        let fd = self.map_fd(policer_common::MAP_BANS)?;
        let had = crate::batch::lookup::<BucketKeyV6, Ban>(fd, key)
            .map_err(Error::kernel(format!("reading {}", policer_common::MAP_BANS)))?
            .is_some();
        if had {
            crate::batch::delete_elem(fd, key).map_err(Error::kernel(policer_common::MAP_BANS))?;
        }
        if let Some(SlotAt { table, name, index: i, mut set, way: w }) = self.reader.slot_of(key)? {
            let stamp = set.ways[w].stamp();
            if !matches!(policer_common::ban::slot_ban(stamp), policer_common::ban::SlotBan::None) {
                set.ways[w] = policer_common::table::Slot::default();
                crate::batch::update_elem(table.as_raw_fd(), &i, &set).map_err(Error::kernel(name))?;
            }
        }
        Ok(had)
    }

    /// Puts `ban` into the automatic-ban store at `key` (a start bringing
    /// back the bans a plain exit kept: `daemon/bans.rs`, `KeptBan`).
    pub fn put_ban(&mut self, key: &BucketKeyV6, ban: &Ban) -> Result<()> {
        let fd = self.map_fd(policer_common::MAP_BANS)?;
        crate::batch::update_elem(fd, key, ban).map_err(Error::kernel(policer_common::MAP_BANS))
    }

    /// Removes the store's entries whose escalation window is over at
    /// `now_ns` (policer_common::ban::forgettable); returns them.
    pub fn expire_bans(&mut self, now_ns: u64) -> Result<Vec<(BucketKeyV6, Ban)>> {
        let fd = self.map_fd(policer_common::MAP_BANS)?;
        let gone: Vec<(BucketKeyV6, Ban)> =
            self.reader.bans()?.into_iter().filter(|(_, b)| policer_common::ban::forgettable(b, now_ns)).collect();
        for (k, _) in &gone {
            match crate::batch::delete_elem(fd, k) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => return Err(Error::kernel(policer_common::MAP_BANS)(e)),
            }
        }
        Ok(gone)
    }

    /// Entries the automatic-ban store holds.
    pub fn ban_capacity(&self) -> u32 {
        self.reader.ban_capacity()
    }

    /// Counters of every interface slot (summed over CPUs).
    pub fn iface_counters(&self) -> Result<Vec<(u32, Counters)>> {
        self.reader.iface_counters()
    }

    /// Counters summed over CPUs and interfaces.
    pub fn counters(&self) -> Result<Counters> {
        self.reader.counters()
    }

    /// Counters of every rule slot (summed over CPUs).
    pub fn rule_counters(&self) -> Result<Vec<(u32, RuleCounters)>> {
        self.reader.rule_counters()
    }

    /// Calls `f` for every live bucket, IPv4 then IPv6.
    pub fn for_each_bucket(&self, f: impl FnMut(&BucketKey, &Bucket)) -> Result<()> {
        self.reader.for_each_bucket(f)
    }

    /// Capacity of the bucket tables.
    pub fn max_sources(&self) -> Result<u32> {
        Ok(self.reader.max_sources())
    }

    /// Rules this program holds: counter slots 1..=max_rules (an adopted
    /// program keeps the size it was loaded with).
    pub fn max_rules(&self) -> Result<u32> {
        let m = self.ebpf.map(MAP_RULE_COUNTERS).ok_or(Error::Missing(MAP_RULE_COUNTERS))?;
        match m {
            aya::maps::Map::PerCpuArray(d) => {
                d.info().map(|i| i.max_entries().saturating_sub(1)).map_err(Error::map(MAP_RULE_COUNTERS))
            }
            _ => Err(Error::Missing(MAP_RULE_COUNTERS)),
        }
    }
}

/// A walk of the ban store ([`MapReader::ban_batches`]).
pub struct BanBatches<'a> {
    b: crate::batch::Batches,
    /// The walk reads the reader's descriptor: it must not outlive it.
    _reader: std::marker::PhantomData<&'a MapReader>,
}

impl BanBatches<'_> {
    /// The next batch of entries; empty once the store is read.
    pub fn next_batch(&mut self, out: &mut Vec<(BucketKeyV6, Ban)>) -> Result<()> {
        out.clear();
        if self.b.read_next().map_err(Error::kernel(format!("reading {}", policer_common::MAP_BANS)))?.is_some() {
            for (k, v) in self.b.entries() {
                // SAFETY: the kernel copied whole keys and values of these
                // plain types; read unaligned from the byte buffers.
                out.push(unsafe {
                    (
                        std::ptr::read_unaligned(k.as_ptr() as *const BucketKeyV6),
                        std::ptr::read_unaligned(v.as_ptr() as *const Ban),
                    )
                });
            }
        }
        Ok(())
    }
}

/// Prefixes each rule trie (IPv4, IPv6) holds: rules and the entries of
/// sets (`policer rule import`). A program loaded by an older build keeps
/// its smaller tries when adopted; an import past them is refused with the
/// limit named ([`Policer::rule_trie_capacity`]).
pub const TRIE_PREFIXES: u32 = 1 << 22;

impl Policer {
    /// The writer of the rule tries, for the set writes.
    pub fn trie_writer(&self) -> Result<TrieWriter> {
        Ok(TrieWriter::new(self.map_fd(MAP_RULES_V4)?, self.map_fd(MAP_RULES_V6)?))
    }

    /// Prefixes the rule tries hold at most (IPv4, IPv6).
    pub fn rule_trie_capacity(&self) -> Result<(u32, u32)> {
        let cap = |name: &'static str| -> Result<u32> {
            match self.ebpf.map(name).ok_or(Error::Missing(name))? {
                aya::maps::Map::LpmTrie(d) => d.info().map(|i| i.max_entries()).map_err(Error::map(name)),
                _ => Err(Error::Missing(name)),
            }
        };
        Ok((cap(MAP_RULES_V4)?, cap(MAP_RULES_V6)?))
    }
}

/// The maps of `policer capture` (policer_common::capture), owned by the
/// daemon's capture hub.
pub struct CaptureMaps {
    pub on: Array<MapData, u64>,
    pub lanes: Array<MapData, policer_common::capture::CaptureLane>,
    pub rules: Array<MapData, u32>,
    pub counters: PerCpuArray<MapData, policer_common::capture::CaptureCounters>,
    pub ring: aya::maps::RingBuf<MapData>,
}

/// The maps a program adopting another's shares with it and a start
/// writes: the rule tries, the new-source limiters, the rule counters.
/// Holds its own duplicates of the descriptors, so a start can read what it
/// is about to overwrite and put it back on failure without borrowing the
/// [`Policer`] (see `daemon::start`).
pub struct SharedMaps {
    /// Duplicated descriptors of the rule tries, the class index and
    /// filter, and the totals.
    rule_maps: [OwnedFd; 5],
    new_sources: Array<MapData, NewSources>,
    rule_counters: PerCpuArray<MapData, RuleCounters>,
    ban_params: OwnedFd,
}

impl SharedMaps {
    fn of(ebpf: &Ebpf) -> Result<SharedMaps> {
        let dup = |name: &'static str| -> Result<OwnedFd> {
            // SAFETY: the descriptor is open for as long as `ebpf` lives;
            // the duplicate is ours.
            Ok(unsafe { std::os::fd::BorrowedFd::borrow_raw(map_fd(ebpf, name)?) }.try_clone_to_owned()?)
        };
        let data = |name: &'static str| -> Result<MapData> { MapData::from_fd(dup(name)?).map_err(Error::map(name)) };
        use aya::maps::Map;
        Ok(SharedMaps {
            rule_maps: [
                dup(MAP_RULES_V4)?,
                dup(MAP_RULES_V6)?,
                dup(MAP_CLASS_INDEX)?,
                dup(MAP_CLASS_FILTER)?,
                dup(MAP_TOTALS)?,
            ],
            new_sources: Array::try_from(Map::Array(data(MAP_NEW_SOURCES)?)).map_err(Error::map(MAP_NEW_SOURCES))?,
            ban_params: dup(policer_common::MAP_BAN_PARAMS)?,
            rule_counters: PerCpuArray::try_from(Map::PerCpuArray(data(MAP_RULE_COUNTERS)?))
                .map_err(Error::map(MAP_RULE_COUNTERS))?,
        })
    }

    /// Makes the rule maps go from `have` to `want` ([`sync_maps`]).
    pub fn sync_rules(&mut self, have: &Compiled, want: &Compiled) -> Result<()> {
        let m = &self.rule_maps;
        let fds = RuleFds {
            tries: TrieWriter::new(m[0].as_raw_fd(), m[1].as_raw_fd()),
            index: m[2].as_raw_fd(),
            filter: m[3].as_raw_fd(),
        };
        sync_maps(&fds, have, want)
    }

    /// Puts the tries back at `written` (sorted): what `old` holds is
    /// written again, the rest removed.
    pub fn restore_entries(&mut self, written: &[IpNet], old: &std::collections::BTreeMap<IpNet, Rule>) -> Result<()> {
        let m = &self.rule_maps;
        let tries = TrieWriter::new(m[0].as_raw_fd(), m[1].as_raw_fd());
        tries.write_each(old.iter().map(|(n, r)| (*n, *r)), |_| Ok(false))?;
        let (v4, v6): (Vec<IpNet>, Vec<IpNet>) =
            written.iter().filter(|n| !old.contains_key(n)).partition(|n| n.addr().is_ipv4());
        tries.delete_all(false, &v4)?;
        tries.delete_all(true, &v6)
    }

    /// The aggregate bucket of a counter slot.
    pub fn total(&self, slot: u32) -> Result<Total> {
        let t: Option<Total> = crate::batch::lookup(self.rule_maps[4].as_raw_fd(), &slot)
            .map_err(Error::kernel(format!("reading {MAP_TOTALS}")))?;
        Ok(t.unwrap_or(Total { tat: 0, limiter: Rule::packets(1, 1).expect("valid") }))
    }

    pub fn set_total(&mut self, slot: u32, t: &Total) -> Result<()> {
        crate::batch::update_elem(self.rule_maps[4].as_raw_fd(), &slot, t).map_err(Error::kernel(MAP_TOTALS))
    }

    /// The new-source limiter of a rule slot.
    pub fn new_sources(&self, slot: u32) -> Result<NewSources> {
        self.new_sources.get(&slot, 0).map_err(Error::map(MAP_NEW_SOURCES))
    }

    pub fn set_new_sources(&mut self, slot: u32, ns: &NewSources) -> Result<()> {
        self.new_sources.set(slot, ns, 0).map_err(Error::map(MAP_NEW_SOURCES))
    }

    /// The automatic bans of the rule at `slot` (all zero: none).
    pub fn ban_params(&self, slot: u32) -> Result<BanParams> {
        crate::batch::lookup(self.ban_params.as_raw_fd(), &slot)
            .map(Option::unwrap_or_default)
            .map_err(Error::kernel(format!("reading {}", policer_common::MAP_BAN_PARAMS)))
    }

    pub fn set_ban_params(&mut self, slot: u32, p: &BanParams) -> Result<()> {
        crate::batch::update_elem(self.ban_params.as_raw_fd(), &slot, p)
            .map_err(Error::kernel(policer_common::MAP_BAN_PARAMS))
    }

    /// A rule slot's counters, one per CPU.
    pub fn rule_counters(&self, slot: u32) -> Result<aya::maps::PerCpuValues<RuleCounters>> {
        self.rule_counters.get(&slot, 0).map_err(Error::map(MAP_RULE_COUNTERS))
    }

    pub fn set_rule_counters(&mut self, slot: u32, v: aya::maps::PerCpuValues<RuleCounters>) -> Result<()> {
        self.rule_counters.set(slot, v, 0).map_err(Error::map(MAP_RULE_COUNTERS))
    }
}

impl Policer {
    /// Handles of its own on the rule, limiter and rule-counter maps.
    pub fn shared_maps(&self) -> Result<SharedMaps> {
        SharedMaps::of(&self.ebpf)
    }

    /// A descriptor of its own on the loaded program (it keeps the
    /// program loaded, e.g. to put an interface back after a failure).
    pub fn prog_fd_owned(&mut self) -> Result<OwnedFd> {
        let fd = self.program().fd().map_err(|e| Error::Program(Box::new(e)))?;
        Ok(fd.as_fd().try_clone_to_owned()?)
    }

    /// The interfaces' dispatchers' array (`CHAINS`) and the descriptor
    /// of the chain's counters, for the dispatchers
    /// ([`crate::chain::dispatch_all`]).
    pub fn chain_maps(&self) -> Result<(&MapData, RawFd)> {
        use policer_common::chain::{MAP_CHAIN_COUNTERS, MAP_CHAINS};
        let chains = match self.ebpf.map(MAP_CHAINS) {
            Some(aya::maps::Map::ProgramArray(d)) => d,
            _ => return Err(Error::Missing(MAP_CHAINS)),
        };
        Ok((chains, map_fd(&self.ebpf, MAP_CHAIN_COUNTERS)?))
    }
}

/// The aggregate bucket of a slot without one (`--total-rate` not given).
pub fn no_total() -> Total {
    Total { tat: 0, limiter: Rule::packets(1, 1).expect("valid") }
}

/// The values of some rule slots, as [`Policer::save_slots`] read them.
#[derive(Debug, Default)]
pub struct SavedSlots {
    new_sources: Vec<(u32, NewSources)>,
    bans: Vec<(u32, BanParams)>,
    totals: Vec<(u32, Total)>,
    syn: Vec<(u32, policer_common::syn::SynConf)>,
    syn_totals: Vec<(u32, Total)>,
}

/// Writes `entries` (index, value) into the array map `fd` ([`Policer::set_slots`]).
fn write_array<V: aya::Pod>(fd: RawFd, name: &'static str, entries: &[(u32, V)]) -> Result<()> {
    const CHUNK: usize = 8192;
    for chunk in entries.chunks(CHUNK) {
        let keys: Vec<u32> = chunk.iter().map(|e| e.0).collect();
        let values: Vec<V> = chunk.iter().map(|e| e.1).collect();
        // SAFETY: u32 and a Pod value are plain bytes; the slices cover
        // exactly the vectors' elements.
        let (k, v) = unsafe {
            (
                std::slice::from_raw_parts(keys.as_ptr().cast::<u8>(), std::mem::size_of_val(keys.as_slice())),
                std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values.as_slice())),
            )
        };
        match crate::batch::update(fd, k, v, chunk.len()) {
            (n, None) if n == chunk.len() => {}
            (0, Some(e)) if crate::trie::no_batch(&e) => {
                for (i, value) in chunk {
                    crate::batch::update_elem(fd, i, value).map_err(Error::kernel(name))?;
                }
            }
            (_, e) => {
                return Err(Error::kernel(name)(
                    e.unwrap_or_else(|| io::Error::other("the kernel took part of a batch without an error")),
                ));
            }
        }
    }
    Ok(())
}

pub(crate) fn map_fd(ebpf: &Ebpf, name: &'static str) -> Result<RawFd> {
    let m = ebpf.map(name).ok_or(Error::Missing(name))?;
    let data: &MapData = match m {
        aya::maps::Map::PerCpuArray(d)
        | aya::maps::Map::LruHashMap(d)
        | aya::maps::Map::HashMap(d)
        | aya::maps::Map::Array(d)
        | aya::maps::Map::LpmTrie(d) => d,
        _ => return Err(Error::Missing(name)),
    };
    Ok(data.fd().as_fd().as_raw_fd())
}

impl MapReader {
    fn of(ebpf: &Ebpf) -> Result<MapReader> {
        let dup = |name: &'static str| -> Result<OwnedFd> {
            let fd = map_fd(ebpf, name)?;
            // SAFETY: `fd` is open for as long as `ebpf` lives; the
            // duplicate is ours.
            Ok(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()?)
        };
        Ok(MapReader {
            counters: dup(MAP_COUNTERS)?,
            rule_counters: dup(MAP_RULE_COUNTERS)?,
            syn_counters: dup(policer_common::syn::MAP_SYN_COUNTERS).ok(),
            syn_verified: dup(policer_common::syn::MAP_SYN_VERIFIED).ok(),
            buckets_v4: dup(MAP_BUCKETS_V4)?,
            buckets_v4_drops: dup(MAP_BUCKETS_V4_DROPS)?,
            buckets_v6: dup(MAP_BUCKETS_V6)?,
            buckets_v6_drops: dup(MAP_BUCKETS_V6_DROPS)?,
            buckets_v6_keys: dup(MAP_BUCKETS_V6_KEYS)?,
            buckets_v4_used: dup(MAP_BUCKETS_V4_USED).ok(),
            buckets_v6_used: dup(MAP_BUCKETS_V6_USED).ok(),
            recall: dup(MAP_RECALL)?,
            new_sources: dup(MAP_NEW_SOURCES)?,
            bans: dup(policer_common::MAP_BANS)?,
            rules_v4: dup(MAP_RULES_V4)?,
            rules_v6: dup(MAP_RULES_V6)?,
            fast_path: dup(MAP_FAST_PATH)?,
            default_rules: dup(MAP_DEFAULT_RULES)?,
            class_index: dup(MAP_CLASS_INDEX)?,
            class_filter: dup(MAP_CLASS_FILTER)?,
            chain_counters: dup(policer_common::chain::MAP_CHAIN_COUNTERS)?,
            ban_capacity: match ebpf.map(policer_common::MAP_BANS) {
                Some(aya::maps::Map::HashMap(d)) => {
                    d.info().map(|i| i.max_entries()).map_err(Error::map(policer_common::MAP_BANS))?
                }
                _ => return Err(Error::Missing(policer_common::MAP_BANS)),
            },
            // Filled in by the loader once the table's seed is known.
            geometry: Geometry::default(),
        })
    }

    /// The rule the program finds for a source before classes: with only
    /// default rules (the fast path) the default rule of its family, else
    /// the longest match in its family's trie (`lookup_rule` in the
    /// program). `None`: no prefix holds a rule.
    pub fn prefix_rule(&self, src: IpAddr) -> Result<Option<Rule>> {
        let io = |name: &'static str| Error::kernel(format!("reading {name}"));
        let fast: u32 =
            crate::batch::lookup(self.fast_path.as_raw_fd(), &0u32).map_err(io(MAP_FAST_PATH))?.unwrap_or(0);
        if fast != 0 {
            let i = (fast - 1) * 2 + u32::from(src.is_ipv6());
            let r: Option<Rule> =
                crate::batch::lookup(self.default_rules.as_raw_fd(), &i).map_err(io(MAP_DEFAULT_RULES))?;
            return Ok(r.filter(|r| r.action != policer_common::ACTION_NONE || r.classes != 0));
        }
        match src {
            IpAddr::V4(a) => crate::batch::lookup(self.rules_v4.as_raw_fd(), &LpmKey { len: 32, data: a.octets() })
                .map_err(io(MAP_RULES_V4)),
            IpAddr::V6(a) => crate::batch::lookup(self.rules_v6.as_raw_fd(), &LpmKey { len: 128, data: a.octets() })
                .map_err(io(MAP_RULES_V6)),
        }
    }

    /// A group's class filter (`CLASS_FILTER`).
    pub fn class_filter(&self, group: u32) -> Result<Option<ClassFilter>> {
        crate::batch::lookup(self.class_filter.as_raw_fd(), &group)
            .map_err(Error::kernel(format!("reading {MAP_CLASS_FILTER}")))
    }

    /// The class list of the longest prefix of `key` in `CLASS_INDEX`,
    /// looked up at the port's length as the program does.
    pub fn class_list(&self, key: [u8; INDEX_KEY_BYTES]) -> Result<Option<ClassList>> {
        crate::batch::lookup(
            self.class_index.as_raw_fd(),
            &LpmKey { len: policer_common::class::INDEX_PORT_BITS, data: key },
        )
        .map_err(Error::kernel(format!("reading {MAP_CLASS_INDEX}")))
    }

    /// Every entry of the automatic-ban store: bans in force and those
    /// kept for escalation (see policer_common::ban). One batched read.
    pub fn bans(&self) -> Result<Vec<(BucketKeyV6, Ban)>> {
        let mut out = Vec::new();
        crate::batch::for_each_chunk(self.bans.as_raw_fd(), size_of::<BucketKeyV6>(), size_of::<Ban>(), 256, |k, v| {
            // SAFETY: the kernel copied whole keys and values of these
            // plain types; read unaligned from the byte buffers.
            let (k, v) = unsafe {
                (
                    std::ptr::read_unaligned(k.as_ptr() as *const BucketKeyV6),
                    std::ptr::read_unaligned(v.as_ptr() as *const Ban),
                )
            };
            out.push((k, v));
        })
        .map_err(Error::kernel(format!("reading {}", policer_common::MAP_BANS)))?;
        Ok(out)
    }

    /// The ban store, a batch of at most `chunk` entries at a time
    /// ([`BanBatches::next`]): for a reader that passes each batch on
    /// before it reads the next (`ban ls`).
    pub fn ban_batches(&self, chunk: usize) -> BanBatches<'_> {
        BanBatches {
            b: crate::batch::Batches::new(self.bans.as_raw_fd(), size_of::<BucketKeyV6>(), size_of::<Ban>(), chunk),
            _reader: std::marker::PhantomData,
        }
    }

    /// Entries the automatic-ban store holds.
    pub fn ban_capacity(&self) -> u32 {
        self.ban_capacity
    }

    /// The table's set and slot that hold `key` as the program keys it (a
    /// plain IPv4 source in the IPv4 table, anything else in the keyed
    /// one), with the set as read.
    fn slot_of(&self, key: &BucketKeyV6) -> Result<Option<SlotAt<'_>>> {
        let plain_v4 = key.class == 0 && key.key_len & policer_common::class::KEY_LEN_V4_MAPPED != 0;
        let (want, sets, fd, name) = if plain_v4 {
            let a = [key.addr[12], key.addr[13], key.addr[14], key.addr[15]];
            let want = table::slot_key(a, key.key_len & !policer_common::class::KEY_LEN_V4_MAPPED);
            (want, self.geometry.sets_of(want), &self.buckets_v4, MAP_BUCKETS_V4)
        } else {
            let (want, sets) = self.v6_word(key);
            (want, sets, &self.buckets_v6, MAP_BUCKETS_V6)
        };
        for i in sets {
            let set: Option<Set> =
                crate::batch::lookup(fd.as_raw_fd(), &i).map_err(Error::kernel(format!("reading {name}")))?;
            if let Some(set) = set
                && let Some(w) = set.ways.iter().position(|s| s.source() == want)
            {
                return Ok(Some(SlotAt { table: fd, name, index: i, set, way: w }));
            }
        }
        Ok(None)
    }

    /// The bucket of one source, if it has one (what `policer inspect`
    /// shows): its first set, then its second (see policer_common::table).
    pub fn bucket(&self, key: &BucketKey) -> Result<Option<Bucket>> {
        Ok(self.bucket_dropped_by(key)?.map(|(b, _)| b))
    }

    /// [`MapReader::bucket`], with the counter slot of the rule whose drops
    /// its count is (policer_common::table::dropped_by).
    pub fn bucket_dropped_by(&self, key: &BucketKey) -> Result<Option<(Bucket, Option<u32>)>> {
        let io = |name: &'static str| Error::kernel(format!("reading {name}"));
        let (want, sets, (table, drops), (table_name, drops_name)) = match key.keyed() {
            None => {
                let want = table::slot_key([key.addr[0], key.addr[1], key.addr[2], key.addr[3]], key.key_len);
                let maps = (&self.buckets_v4, &self.buckets_v4_drops);
                (want, self.geometry.sets_of(want), maps, (MAP_BUCKETS_V4, MAP_BUCKETS_V4_DROPS))
            }
            Some(k) => {
                let (want, sets) = self.v6_word(&k);
                (want, sets, (&self.buckets_v6, &self.buckets_v6_drops), (MAP_BUCKETS_V6, MAP_BUCKETS_V6_DROPS))
            }
        };
        for i in sets {
            let set: Option<Set> = crate::batch::lookup(table.as_raw_fd(), &i).map_err(io(table_name))?;
            let drops: Option<SetDrops> = crate::batch::lookup(drops.as_raw_fd(), &i).map_err(io(drops_name))?;
            let (Some(set), drops) = (set, drops.unwrap_or_default()) else { continue };
            if let Some(b) = set
                .ways
                .iter()
                .zip(drops.ways)
                .find(|(s, _)| s.source() == want)
                .map(|(s, n)| (s.bucket(n), table::dropped_by(n)))
            {
                return Ok(Some(b));
            }
        }
        Ok(None)
    }

    /// A keyed-table source's key word and sets, as the program hashes it.
    fn v6_word(&self, k: &BucketKeyV6) -> (u64, [u32; 2]) {
        let h = self.geometry.hash_key(k);
        (table::v6_key_word(h), self.geometry.sets_of_hash(h))
    }

    /// Whether the recall would recall `key` now, and with what debt in ns
    /// (`None`: not recalled). See policer_common::recall.
    pub fn recalled(&self, key: &BucketKey, now_ns: u64) -> Result<Option<u64>> {
        let (word, keyed) = match key.keyed() {
            None => (table::slot_key([key.addr[0], key.addr[1], key.addr[2], key.addr[3]], key.key_len), false),
            Some(k) => (self.v6_word(&k).0, true),
        };
        let (i, fp) = recall::locate(self.geometry.seed, self.geometry.sets, word, keyed);
        let set: Option<RecallSet> = crate::batch::lookup(self.recall.as_raw_fd(), &i)
            .map_err(Error::kernel(format!("reading {MAP_RECALL}")))?;
        Ok(set.and_then(|s| recall::recall(&s, fp, now_ns)))
    }

    /// How full the recall is at `now_ns` (see [`RecallFill`]).
    pub fn recall_fill(&self, now_ns: u64) -> Result<RecallFill> {
        let sets = self.geometry.sets;
        let capacity = sets * recall::RECALL_WAYS as u64;
        let n = sets.min(RECALL_SAMPLE_SETS);
        if n == 0 {
            return Ok(RecallFill::default());
        }
        let mut live = 0u64;
        for j in 0..n {
            let i = (j * sets / n) as u32;
            let set: Option<RecallSet> = crate::batch::lookup(self.recall.as_raw_fd(), &i)
                .map_err(Error::kernel(format!("reading {MAP_RECALL}")))?;
            live += set.map_or(0, |s| recall::live(&s, now_ns) as u64);
        }
        Ok(RecallFill { capacity, live: live * sets / n })
    }

    /// The new-source limiter of a rule's slot.
    pub fn new_sources(&self, slot: u32) -> Result<Option<NewSources>> {
        crate::batch::lookup(self.new_sources.as_raw_fd(), &slot)
            .map_err(Error::kernel(format!("reading {MAP_NEW_SOURCES}")))
    }

    /// Capacity of the bucket tables (`--max-sources`).
    pub fn max_sources(&self) -> u32 {
        self.geometry.capacity.min(u32::MAX as u64) as u32
    }

    /// Sums a per-CPU array's slots over CPUs, slot by slot.
    fn per_cpu_slots<T: aya::Pod + Default>(
        &self,
        fd: &OwnedFd,
        name: &'static str,
        add: impl Fn(&mut T, &T),
    ) -> Result<Vec<(u32, T)>> {
        let fd = fd.as_raw_fd();
        let cpus = crate::batch::possible_cpus()?;
        let stride = size_of::<T>().next_multiple_of(8);
        let mut out = Vec::new();
        crate::batch::for_each(fd, 4, stride * cpus, |k, v| {
            let slot = u32::from_ne_bytes([k[0], k[1], k[2], k[3]]);
            let mut sum = T::default();
            for cpu in 0..cpus {
                // SAFETY: the kernel wrote a T at each stride; T is Pod.
                let one: T = unsafe { std::ptr::read_unaligned(v[cpu * stride..].as_ptr() as *const T) };
                add(&mut sum, &one);
            }
            out.push((slot, sum));
        })
        .map_err(Error::kernel(format!("reading {name}")))?;
        Ok(out)
    }

    /// Counters of every interface slot (summed over CPUs).
    pub fn iface_counters(&self) -> Result<Vec<(u32, Counters)>> {
        self.per_cpu_slots(&self.counters, MAP_COUNTERS, Counters::add)
    }

    /// The chain's counters of every interface slot (summed over CPUs).
    pub fn chain_counters(&self) -> Result<Vec<(u32, policer_common::chain::ChainCounters)>> {
        use policer_common::chain::{ChainCounters, MAP_CHAIN_COUNTERS};
        self.per_cpu_slots(&self.chain_counters, MAP_CHAIN_COUNTERS, ChainCounters::add)
    }

    /// Counters summed over CPUs and interfaces.
    pub fn counters(&self) -> Result<Counters> {
        let mut total = Counters::default();
        for (_, c) in self.iface_counters()? {
            total.add(&c);
        }
        Ok(total)
    }

    /// Counters of every rule slot (summed over CPUs).
    pub fn rule_counters(&self) -> Result<Vec<(u32, RuleCounters)>> {
        self.per_cpu_slots(&self.rule_counters, MAP_RULE_COUNTERS, RuleCounters::add)
    }

    /// The counters of the rule slots `slots` alone (summed over CPUs), one
    /// lookup each; a slot past the map is left out. For a caller that
    /// needs a few slots often (the fleet's lease round, ten times a second):
    /// [`MapReader::rule_counters`] copies every slot for every CPU, 16 384
    /// slots by default and up to millions.
    pub fn rule_counters_of(&self, slots: impl IntoIterator<Item = u32>) -> Result<Vec<(u32, RuleCounters)>> {
        let cpus = crate::batch::possible_cpus()?;
        let stride = size_of::<RuleCounters>().next_multiple_of(8);
        let mut buf = vec![0u8; stride * cpus];
        let mut out = Vec::new();
        for slot in slots {
            let found = crate::batch::lookup_into(self.rule_counters.as_raw_fd(), &slot, &mut buf)
                .map_err(Error::kernel(format!("reading {MAP_RULE_COUNTERS}")))?;
            if !found {
                continue;
            }
            let mut sum = RuleCounters::default();
            for cpu in 0..cpus {
                // SAFETY: the kernel wrote a RuleCounters at each stride; it is Pod.
                let one: RuleCounters = unsafe { std::ptr::read_unaligned(buf[cpu * stride..].as_ptr().cast()) };
                sum.add(&one);
            }
            out.push((slot, sum));
        }
        Ok(out)
    }

    /// Whether `addr` proved its address to SYN cookies (None: a program
    /// without them).
    pub fn syn_verified(&self, addr: std::net::IpAddr) -> Result<Option<bool>> {
        let Some(fd) = &self.syn_verified else { return Ok(None) };
        let key: [u8; 16] = match addr {
            std::net::IpAddr::V4(a) => policer_common::mapped_v4(a.octets()),
            std::net::IpAddr::V6(a) => a.octets(),
        };
        let v: Option<u64> = crate::batch::lookup(fd.as_raw_fd(), &key)
            .map_err(Error::kernel(format!("reading {}", policer_common::syn::MAP_SYN_VERIFIED)))?;
        Ok(Some(v.is_some()))
    }

    /// SYN cookies' counters of every rule slot (summed over CPUs).
    pub fn syn_counters(&self) -> Result<Vec<(u32, policer_common::syn::SynCounters)>> {
        match &self.syn_counters {
            Some(fd) => {
                self.per_cpu_slots(fd, policer_common::syn::MAP_SYN_COUNTERS, policer_common::syn::SynCounters::add)
            }
            None => Ok(Vec::new()),
        }
    }

    /// Calls `f` for every live bucket, IPv4 then IPv6.
    pub fn for_each_bucket(&self, mut f: impl FnMut(&BucketKey, &Bucket)) -> Result<()> {
        self.for_each_bucket_read(|k, b, _, _| f(k, b))
    }

    /// [`MapReader::for_each_bucket`], each bucket with the monotonic clock
    /// read just after the kernel copied the batch that held it: the time
    /// to judge its debt at. A clock read before the copy counts the charges
    /// made in between as debt (a walk of a large table takes a quarter of a
    /// second, which a source at half its rate would show as a full bucket);
    /// one read after it can only show a hair less debt than there was.
    /// Read per batch of slots scanned, not per bucket kept, so a sparse
    /// table is judged as closely as a full one. The last argument is the
    /// counter slot of the rule whose drops the bucket's count is
    /// (policer_common::table::dropped_by).
    pub fn for_each_bucket_read(&self, mut f: impl FnMut(&BucketKey, &Bucket, u64, Option<u32>)) -> Result<()> {
        let v4 = (&self.buckets_v4, &self.buckets_v4_drops, self.buckets_v4_used.as_ref());
        self.for_each_slot(v4, MAP_BUCKETS_V4, |_, _, slot, n, read_ns| {
            if let Some(k) = table::key_of(slot.key) {
                f(&k.into(), &slot.bucket(n), read_ns, table::dropped_by(n));
            }
        })?;
        // IPv6 slots hold fingerprints: the keys sit beside them, written
        // after the slot is claimed. A key that does not hash to its slot
        // (being rewritten) is skipped. The keys (40 bytes a source) are
        // read whole only when many sets are in use, else set by set.
        let mut used: Vec<(u32, usize, table::Slot, u64, u64)> = Vec::new();
        let v6 = (&self.buckets_v6, &self.buckets_v6_drops, self.buckets_v6_used.as_ref());
        self.for_each_slot(v6, MAP_BUCKETS_V6, |i, w, slot, n, read_ns| {
            if slot.key & table::KEY_VALID != 0 {
                used.push((i, w, *slot, n, read_ns));
            }
        })?;
        if used.is_empty() {
            return Ok(());
        }
        let mut keys: std::collections::HashMap<u32, SetKeys> = std::collections::HashMap::new();
        if used.len() as u64 > self.geometry.sets / 8 {
            let all: Vec<SetKeys> = read_array(&self.buckets_v6_keys, MAP_BUCKETS_V6_KEYS)?;
            keys.extend(used.iter().filter_map(|&(i, ..)| all.get(i as usize).map(|k| (i, *k))));
        } else {
            for &(i, ..) in &used {
                if !keys.contains_key(&i)
                    && let Some(k) = crate::batch::lookup(self.buckets_v6_keys.as_raw_fd(), &i)
                        .map_err(Error::kernel(format!("reading {MAP_BUCKETS_V6_KEYS}")))?
                {
                    keys.insert(i, k);
                }
            }
        }
        for (i, w, slot, n, read_ns) in used {
            let Some(k) = keys.get(&i).map(|s| s.ways[w]) else { continue };
            let (word, sets) = self.v6_word(&k);
            if word == slot.source() && sets.contains(&i) {
                f(&k.into(), &slot.bucket(n), read_ns, table::dropped_by(n));
            }
        }
        Ok(())
    }

    /// Calls `f(set, way, slot, drop word, read_ns)` for every slot of a
    /// table (`table`: its sets, drop words and used-sets bitmap) that may
    /// hold a bucket, `read_ns` being when the kernel copied it
    /// (`batch::Copied::at`). Only the sets its bitmap marks are read
    /// when they are few ([`SPARSE_SETS`]): a `top` of a few sources costs
    /// a few lookups, not a walk of a million-source table.
    fn for_each_slot(
        &self,
        (table, drops, used): (&OwnedFd, &OwnedFd, Option<&OwnedFd>),
        name: &'static str,
        mut f: impl FnMut(u32, usize, &table::Slot, u64, u64),
    ) -> Result<()> {
        if let Some(used) = used {
            let words: Vec<u64> = read_array(used, name)?;
            let marked: u64 = words.iter().map(|w| u64::from(w.count_ones())).sum();
            if marked <= self.geometry.sets / SPARSE_SETS {
                let io = || Error::kernel(format!("reading {name}"));
                for i in table::used_sets(&words) {
                    let set: Option<Set> = crate::batch::lookup(table.as_raw_fd(), &i).map_err(io())?;
                    let d: Option<SetDrops> = crate::batch::lookup(drops.as_raw_fd(), &i).map_err(io())?;
                    let read_ns = crate::duration::monotonic_ns();
                    let (Some(set), d) = (set, d.unwrap_or_default()) else { continue };
                    for (w, (slot, n)) in set.ways.iter().zip(d.ways).enumerate() {
                        f(i, w, slot, n, read_ns);
                    }
                }
                return Ok(());
            }
        }
        // The drop counts first (a set's index is its key), then the sets.
        let drops: Vec<SetDrops> = read_array(drops, name)?;
        crate::batch::for_each_batch(table.as_raw_fd(), size_of::<u32>(), size_of::<Set>(), 8192, |copied, entries| {
            for (j, (k, v)) in entries.enumerate() {
                let read_ns = copied.at(j);
                // SAFETY: the kernel wrote a key and a value of these Pod types.
                let (i, set) = unsafe {
                    (
                        std::ptr::read_unaligned(k.as_ptr() as *const u32),
                        std::ptr::read_unaligned(v.as_ptr() as *const Set),
                    )
                };
                let d = drops.get(i as usize).copied().unwrap_or_default();
                for (w, (slot, n)) in set.ways.iter().zip(d.ways).enumerate() {
                    f(i, w, slot, n, read_ns);
                }
            }
        })
        .map_err(Error::kernel(format!("reading {name}")))
    }
}

/// A table whose used-sets bitmap marks at most one set in this many is
/// read set by set (two lookups a set, about 2 µs), not whole (a batched
/// walk of every set, about 0.7 µs a set).
const SPARSE_SETS: u64 = 4;

/// Every value of an array map, by index.
fn read_array<T: aya::Pod + Default + Clone>(fd: &OwnedFd, name: &'static str) -> Result<Vec<T>> {
    let mut out: Vec<T> = Vec::new();
    crate::batch::for_each(fd.as_raw_fd(), size_of::<u32>(), size_of::<T>(), |k, v| {
        // SAFETY: the kernel wrote a key and a value of these Pod types.
        let (i, t) = unsafe {
            (std::ptr::read_unaligned(k.as_ptr() as *const u32), std::ptr::read_unaligned(v.as_ptr() as *const T))
        };
        let i = i as usize;
        if out.len() <= i {
            out.resize(i + 1, T::default());
        }
        out[i] = t;
    })
    .map_err(Error::kernel(format!("reading {name}")))?;
    Ok(out)
}

impl Policer {
    /// Turns the default-rules fast path off (0) or on, reading pair
    /// `selector - 1` of the default rules.
    pub fn set_fast_path(&mut self, selector: u32) -> Result<()> {
        let mut m: Array<&mut MapData, u32> =
            Array::try_from(self.ebpf.map_mut(MAP_FAST_PATH).ok_or(Error::Missing(MAP_FAST_PATH))?)
                .map_err(Error::map(MAP_FAST_PATH))?;
        m.set(0, &selector, 0).map_err(Error::map(MAP_FAST_PATH))
    }

    /// Writes default-rule pair `pair` (0 or 1): the rules for 0.0.0.0/0
    /// and ::/0, `None` where that family has no rule.
    pub fn set_default_rules(&mut self, pair: u32, v4: Option<Rule>, v6: Option<Rule>) -> Result<()> {
        let mut m: Array<&mut MapData, Rule> =
            Array::try_from(self.ebpf.map_mut(MAP_DEFAULT_RULES).ok_or(Error::Missing(MAP_DEFAULT_RULES))?)
                .map_err(Error::map(MAP_DEFAULT_RULES))?;
        let none = Rule { action: policer_common::ACTION_NONE, ..Rule::packets(1, 1).expect("valid") };
        m.set(pair * 2, &v4.unwrap_or(none), 0).map_err(Error::map(MAP_DEFAULT_RULES))?;
        m.set(pair * 2 + 1, &v6.unwrap_or(none), 0).map_err(Error::map(MAP_DEFAULT_RULES))
    }

    /// Sets the new-source limiter of a rule slot.
    pub fn set_new_sources(&mut self, slot: u32, ns: &NewSources) -> Result<()> {
        let mut m: Array<&mut MapData, NewSources> =
            Array::try_from(self.ebpf.map_mut(MAP_NEW_SOURCES).ok_or(Error::Missing(MAP_NEW_SOURCES))?)
                .map_err(Error::map(MAP_NEW_SOURCES))?;
        m.set(slot, ns, 0).map_err(Error::map(MAP_NEW_SOURCES))
    }

    /// Writes rule slots' new-source limiters, automatic-ban parameters
    /// and aggregate buckets (each `(slot, value)`), a batch call per map
    /// and 8 192 slots where the kernel has batches for arrays, one call
    /// per slot where not: a start with 100 000 rules makes a few calls,
    /// not 300 000.
    pub fn set_slots(
        &mut self,
        new_sources: &[(u32, NewSources)],
        bans: &[(u32, policer_common::ban::BanParams)],
        totals: &[(u32, Total)],
    ) -> Result<()> {
        write_array(self.map_fd(MAP_NEW_SOURCES)?, MAP_NEW_SOURCES, new_sources)?;
        write_array(self.map_fd(policer_common::MAP_BAN_PARAMS)?, policer_common::MAP_BAN_PARAMS, bans)?;
        write_array(self.map_fd(MAP_TOTALS)?, MAP_TOTALS, totals)
    }

    /// Writes the SYN cookies' settings of rule slots, and the `flood`
    /// mode's SYN budgets (policer_common::syn).
    pub fn set_syn_slots(
        &mut self,
        conf: &[(u32, policer_common::syn::SynConf)],
        totals: &[(u32, Total)],
    ) -> Result<()> {
        use policer_common::syn::{EXACT_NS, MAP_SYN_CONF, MAP_SYN_EXACT, MAP_SYN_TOTALS};
        // Settings that turn SYN cookies on: the listener is looked up by
        // each SYN's own tuple for a while (policer_common::syn::EXACT_NS).
        if conf.iter().any(|(_, c)| c.mode != 0) && self.ebpf.map(MAP_SYN_EXACT).is_some() {
            let until = crate::duration::monotonic_ns().saturating_add(crate::syncookies::exact_ns(EXACT_NS));
            write_array(self.map_fd(MAP_SYN_EXACT)?, MAP_SYN_EXACT, &[(0u32, until)])?;
        }
        write_array(self.map_fd(MAP_SYN_CONF)?, MAP_SYN_CONF, conf)?;
        write_array(self.map_fd(MAP_SYN_TOTALS)?, MAP_SYN_TOTALS, totals)
    }

    /// What the arrays of rule slots hold at `slots`: each slot's
    /// new-source limiter, ban parameters, aggregate bucket, SYN settings
    /// and SYN budget, to be put back by [`Policer::restore_slots`] (a
    /// change that failed after writing them). A slot an array does not
    /// hold (an object without SYN cookies' maps) is left out of it.
    pub fn save_slots(&self, slots: &[u32]) -> Result<SavedSlots> {
        use policer_common::syn::{MAP_SYN_CONF, MAP_SYN_TOTALS};
        fn read<V: aya::Pod>(fd: RawFd, name: &'static str, slots: &[u32]) -> Result<Vec<(u32, V)>> {
            let mut out = Vec::with_capacity(slots.len());
            for &slot in slots {
                let v: Option<V> = crate::batch::lookup(fd, &slot).map_err(Error::kernel(format!("reading {name}")))?;
                out.extend(v.map(|v| (slot, v)));
            }
            Ok(out)
        }
        let syn = |name: &'static str| self.ebpf.map(name).is_some();
        Ok(SavedSlots {
            new_sources: read(self.map_fd(MAP_NEW_SOURCES)?, MAP_NEW_SOURCES, slots)?,
            bans: read(self.map_fd(policer_common::MAP_BAN_PARAMS)?, policer_common::MAP_BAN_PARAMS, slots)?,
            totals: read(self.map_fd(MAP_TOTALS)?, MAP_TOTALS, slots)?,
            syn: if syn(MAP_SYN_CONF) { read(self.map_fd(MAP_SYN_CONF)?, MAP_SYN_CONF, slots)? } else { Vec::new() },
            syn_totals: if syn(MAP_SYN_TOTALS) {
                read(self.map_fd(MAP_SYN_TOTALS)?, MAP_SYN_TOTALS, slots)?
            } else {
                Vec::new()
            },
        })
    }

    /// Puts back what [`Policer::save_slots`] read.
    pub fn restore_slots(&mut self, saved: &SavedSlots) -> Result<()> {
        self.set_slots(&saved.new_sources, &saved.bans, &saved.totals)?;
        if !saved.syn.is_empty() || !saved.syn_totals.is_empty() {
            self.set_syn_slots(&saved.syn, &saved.syn_totals)?;
        }
        Ok(())
    }

    /// A rule slot's counters, one per CPU (what a change that zeroes the
    /// slot puts back with [`Policer::add_back_rule_counters`] if it fails).
    pub fn slot_counters(&mut self, slot: u32) -> Result<aya::maps::PerCpuValues<RuleCounters>> {
        let m: PerCpuArray<&mut MapData, RuleCounters> =
            PerCpuArray::try_from(self.ebpf.map_mut(MAP_RULE_COUNTERS).ok_or(Error::Missing(MAP_RULE_COUNTERS))?)
                .map_err(Error::map(MAP_RULE_COUNTERS))?;
        m.get(&slot, 0).map_err(Error::map(MAP_RULE_COUNTERS))
    }

    /// Puts `old` back into a slot zeroed since, with what was counted
    /// there meanwhile added ([`merged_counters`]).
    pub fn add_back_rule_counters(&mut self, slot: u32, old: &aya::maps::PerCpuValues<RuleCounters>) -> Result<()> {
        let mut m: PerCpuArray<&mut MapData, RuleCounters> =
            PerCpuArray::try_from(self.ebpf.map_mut(MAP_RULE_COUNTERS).ok_or(Error::Missing(MAP_RULE_COUNTERS))?)
                .map_err(Error::map(MAP_RULE_COUNTERS))?;
        let now = m.get(&slot, 0).map_err(Error::map(MAP_RULE_COUNTERS))?;
        m.set(slot, merged_counters(old, &now)?, 0).map_err(Error::map(MAP_RULE_COUNTERS))
    }

    /// Zeroes a rule slot before it is given to a new prefix.
    pub fn reset_rule_counters(&mut self, slot: u32) -> Result<()> {
        let cpus = crate::batch::possible_cpus()?;
        let mut m: PerCpuArray<&mut MapData, RuleCounters> =
            PerCpuArray::try_from(self.ebpf.map_mut(MAP_RULE_COUNTERS).ok_or(Error::Missing(MAP_RULE_COUNTERS))?)
                .map_err(Error::map(MAP_RULE_COUNTERS))?;
        let zeros = aya::maps::PerCpuValues::try_from(vec![RuleCounters::default(); cpus])
            .map_err(|e| Error::Invalid(e.to_string()))?;
        m.set(slot, zeros, 0).map_err(Error::map(MAP_RULE_COUNTERS))
    }

    /// The bucket of one source, if it has one.
    pub fn bucket(&self, key: &BucketKey) -> Result<Option<Bucket>> {
        self.reader.bucket(key)
    }

    /// [`Policer::bucket`] with the counter slot of the rule that dropped
    /// its count.
    pub fn bucket_dropped_by(&self, key: &BucketKey) -> Result<Option<(Bucket, Option<u32>)>> {
        self.reader.bucket_dropped_by(key)
    }

    /// Sets the test clock (only read when loaded with `test_clock`).
    pub fn set_clock(&mut self, now_ns: u64) -> Result<()> {
        self.set_clock_word(0, now_ns)
    }

    /// Sets the test jiffies (only read when loaded with `test_clock`; 0,
    /// the default, makes the program read the clock for every frame).
    pub fn set_jiffies(&mut self, jiffies: u64) -> Result<()> {
        self.set_clock_word(1, jiffies)
    }

    fn set_clock_word(&mut self, index: u32, value: u64) -> Result<()> {
        let mut m: Array<&mut MapData, u64> =
            Array::try_from(self.ebpf.map_mut(MAP_CLOCK).ok_or(Error::Missing(MAP_CLOCK))?)
                .map_err(Error::map(MAP_CLOCK))?;
        m.set(index, &value, 0).map_err(Error::map(MAP_CLOCK))
    }

    /// The loaded program's kernel id (what netlink reports as attached).
    pub fn program_id(&mut self) -> Result<u32> {
        let info = self.program().info().map_err(|e| Error::Program(Box::new(e)))?;
        Ok(info.id())
    }

    /// The loaded program's file descriptor (for netlink attach).
    pub fn prog_fd(&mut self) -> Result<RawFd> {
        let fd = self.program().fd().map_err(|e| Error::Program(Box::new(e)))?;
        Ok(fd.as_fd().as_raw_fd())
    }

    /// Makes the rule tries and the class index hold `want` (from
    /// [`crate::compile::compile`]), changing only what differs from what
    /// they hold, in an order that never shows a frame a prefix pointing at
    /// class entries not yet written: new and changed class entries, new
    /// and changed prefixes, removed prefixes, removed class entries. Each
    /// entry is replaced atomically. On an error the kernel holds part of
    /// the change; the caller puts back what was in force with another
    /// sync. Reads the maps first; [`Policer::sync_rules_from`] when the
    /// caller knows what they hold.
    pub fn sync_rules(&mut self, want: &Compiled) -> Result<()> {
        let have = self.kernel_compiled()?;
        self.sync_rules_from(&have, want)
    }

    /// The rule maps' descriptors, for a writer on another thread
    /// ([`sync_maps`]); they live as long as this `Policer`.
    pub fn rule_fds(&self) -> Result<RuleFds> {
        RuleFds::of(&self.ebpf)
    }

    /// [`Policer::sync_rules`] from a known state of the maps (the daemon
    /// keeps the one copy of it).
    pub fn sync_rules_from(&mut self, have: &Compiled, want: &Compiled) -> Result<()> {
        sync_maps(&RuleFds::of(&self.ebpf)?, have, want)
    }

    /// Writes a change of the tries' prefixes (`None`: removed), the
    /// class maps unchanged: new and changed prefixes first, removed ones
    /// last, as [`sync_maps`].
    pub fn write_rule_prefixes(&mut self, prefixes: &[(IpNet, Option<Rule>)]) -> Result<()> {
        let changed = prefixes.iter().filter_map(|(n, r)| r.map(|r| (*n, r)));
        let gone: Vec<IpNet> = prefixes.iter().filter(|(_, r)| r.is_none()).map(|(n, _)| *n).collect();
        write_prefixes(&RuleFds::of(&self.ebpf)?, changed, gone)
    }

    /// What the tries and the class index hold now.
    pub fn kernel_compiled(&self) -> Result<Compiled> {
        let mut c = Compiled { prefixes: self.kernel_rules()?.into_iter().collect(), ..Compiled::default() };
        let m: LpmTrie<&MapData, [u8; INDEX_KEY_BYTES], ClassList> =
            LpmTrie::try_from(self.ebpf.map(MAP_CLASS_INDEX).ok_or(Error::Missing(MAP_CLASS_INDEX))?)
                .map_err(Error::map(MAP_CLASS_INDEX))?;
        for item in m.iter() {
            let (k, v) = item.map_err(Error::map(MAP_CLASS_INDEX))?;
            let key: IndexKey = (k.prefix_len(), k.data());
            c.index.insert(key, v);
        }
        let groups: std::collections::BTreeSet<u32> =
            c.prefixes.values().map(|r| r.classes).filter(|g| *g != 0).collect();
        for g in groups {
            let f: Option<ClassFilter> = crate::batch::lookup(self.map_fd(MAP_CLASS_FILTER)?, &g)
                .map_err(Error::kernel(format!("reading {MAP_CLASS_FILTER}")))?;
            c.filters.insert(g, f.unwrap_or_default());
        }
        Ok(c)
    }

    /// Sets (or with `None` clears) the aggregate bucket of a rule's
    /// counter slot (`--total-rate`).
    pub fn set_total(&mut self, slot: u32, t: Option<&Total>) -> Result<()> {
        let mut m: Array<&mut MapData, Total> =
            Array::try_from(self.ebpf.map_mut(MAP_TOTALS).ok_or(Error::Missing(MAP_TOTALS))?)
                .map_err(Error::map(MAP_TOTALS))?;
        m.set(slot, t.unwrap_or(&no_total()), 0).map_err(Error::map(MAP_TOTALS))
    }

    /// The aggregate bucket of a rule's counter slot.
    pub fn total(&self, slot: u32) -> Result<Option<Total>> {
        crate::batch::lookup(self.map_fd(MAP_TOTALS)?, &slot).map_err(Error::kernel(format!("reading {MAP_TOTALS}")))
    }

    /// Every rule in the kernel's tries.
    pub fn kernel_rules(&self) -> Result<Vec<(IpNet, Rule)>> {
        // Batched (a set of a million prefixes: one call per 8192, not two
        // per entry); one at a time where the kernel has no batch for tries.
        match self.kernel_rules_batched() {
            Ok(out) => return Ok(out),
            Err(Error::Kernel { source, .. }) if crate::trie::no_batch(&source) => {}
            Err(e) => return Err(e),
        }
        let mut out = Vec::new();
        let m: LpmTrie<&MapData, [u8; 4], Rule> =
            LpmTrie::try_from(self.ebpf.map(MAP_RULES_V4).ok_or(Error::Missing(MAP_RULES_V4))?)
                .map_err(Error::map(MAP_RULES_V4))?;
        for item in m.iter() {
            let (k, v) = item.map_err(Error::map(MAP_RULES_V4))?;
            let net = IpNet::new(std::net::Ipv4Addr::from(k.data()).into(), k.prefix_len() as u8)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            out.push((net, v));
        }
        let m: LpmTrie<&MapData, [u8; 16], Rule> =
            LpmTrie::try_from(self.ebpf.map(MAP_RULES_V6).ok_or(Error::Missing(MAP_RULES_V6))?)
                .map_err(Error::map(MAP_RULES_V6))?;
        for item in m.iter() {
            let (k, v) = item.map_err(Error::map(MAP_RULES_V6))?;
            let net = IpNet::new(std::net::Ipv6Addr::from(k.data()).into(), k.prefix_len() as u8)
                .map_err(|e| Error::Invalid(e.to_string()))?;
            out.push((net, v));
        }
        Ok(out)
    }
}

impl Policer {
    fn kernel_rules_batched(&self) -> Result<Vec<(IpNet, Rule)>> {
        let mut out = Vec::new();
        for (name, key_size) in [(MAP_RULES_V4, crate::trie::KEY_V4), (MAP_RULES_V6, crate::trie::KEY_V6)] {
            let mut bad = None;
            crate::batch::for_each(self.map_fd(name)?, key_size, size_of::<Rule>(), |k, v| {
                // SAFETY: v holds a whole Rule (plain data, any bytes valid).
                let rule = unsafe { std::ptr::read_unaligned(v.as_ptr() as *const Rule) };
                match crate::trie::unpack(k) {
                    Some(n) => out.push((n, rule)),
                    None => bad = Some(format!("a key that is not a prefix: {k:02x?}")),
                }
            })
            .map_err(Error::kernel(format!("reading {name}")))?;
            if let Some(e) = bad {
                return Err(Error::Invalid(format!("reading {name}: {e}")));
            }
        }
        Ok(out)
    }
}

/// The maps reused from their pins (`opts.reuse`), and the chain's array
/// (policer_common::chain) pinned at `opts.chain_pin`: on the hook the
/// interfaces' dispatchers (`CHAINS`), as a member the root's array
/// (`CHAIN`); reused when pinned there, else made and pinned (its
/// directory made first).
fn pin_paths<'a>(loader: &mut EbpfLoader<'a>, opts: &'a LoadOptions) -> Result<()> {
    use policer_common::chain::{MAP_CHAIN, MAP_CHAINS};
    for (name, path) in &opts.reuse {
        loader.map_pin_path(name, path.as_path());
    }
    if let Some(pin) = opts.chain_pin.as_deref() {
        if let Some(dir) = pin.parent() {
            std::fs::create_dir_all(dir).map_err(Error::kernel(format!("making {}", dir.display())))?;
        }
        if opts.chain_from == 0 {
            loader.map_pin_path(MAP_CHAINS, pin);
            return Ok(());
        }
        loader.map_pin_path(MAP_CHAIN, pin);
        // A pinned array is taken as it is (aya requires the object's size
        // to be the map's): another root's may have fewer or more slots
        // than policer's own 8; tail calls past its end find them empty.
        if let Ok(info) = aya::maps::MapInfo::from_pin(pin) {
            loader.map_max_entries(MAP_CHAIN, info.max_entries());
        }
    }
    Ok(())
}

/// Loads the attached program and the two its tail calls reach, each put
/// in its program array: the capture program (docs/capture.md) and the
/// policer's code without the SYN path (policer_common::syn). The kernel
/// verifies programs of a privileged loader side by side, and the two
/// large ones (the attached program and the SYN path's police, each over a
/// second of the verifier's time) are independent: the others are loaded
/// on a thread of their own beside the attached one (one after the other
/// if no thread can be had); with `yielding`, at nice 10 until the
/// attached one is verified (put back to the process's priority then,
/// where the kernel allows it).
///
/// Both tail-call targets live as long as this load: their arrays are
/// this program's own, created fresh by every start (an adopted program's
/// maps never include them), and the kernel empties each when its last
/// descriptor closes, so a program left running (`--persist`) falls back
/// to returning its verdicts and passing what its SYN path hands back. An
/// object without the capture program (another build) loads without it:
/// captures are then refused ([`Policer::take_capture`]); one without the
/// SYN path's police or its array skips it.
fn load_programs(ebpf: &mut Ebpf, yielding: bool) -> Result<()> {
    use policer_common::{
        capture::{CAPTURE_PROGRAM, MAP_CAPTURE_PROG},
        syn::{MAP_SYN_PROG, SYN_POLICE_PROGRAM},
    };
    let with_syn_police = ebpf.map(MAP_SYN_PROG).is_some();
    let mut attached = None;
    let mut beside: Vec<(&'static str, &'static str, &mut aya::programs::Program)> = Vec::new();
    for (name, prog) in ebpf.programs_mut() {
        match name {
            PROGRAM_NAME => attached = Some(prog),
            CAPTURE_PROGRAM => beside.push((CAPTURE_PROGRAM, MAP_CAPTURE_PROG, prog)),
            SYN_POLICE_PROGRAM if with_syn_police => beside.push((SYN_POLICE_PROGRAM, MAP_SYN_PROG, prog)),
            _ => {}
        }
    }
    let attached = attached.ok_or(Error::Missing("XDP program"))?;
    let verify_beside = |beside: &mut Vec<(&'static str, &'static str, &mut aya::programs::Program)>| {
        beside.iter_mut().try_for_each(|(_, _, prog)| verify(prog))
    };
    // The verifying thread's id once it yields; `Some(None)`: the attached
    // program is done, it yields no more.
    let yielded: std::sync::Mutex<Option<Option<(libc::pid_t, i32)>>> = std::sync::Mutex::new(None);
    let (first, rest) = std::thread::scope(|s| {
        let thread = std::thread::Builder::new().name("policer-verify".into()).spawn_scoped(s, || {
            if yielding {
                let mut y = yielded.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                if y.is_none() {
                    *y = Some(Some(nice_down(10)));
                }
            }
            verify_beside(&mut beside)
        });
        let first = verify(attached);
        if let Some(Some((tid, was))) = yielded.lock().unwrap_or_else(std::sync::PoisonError::into_inner).replace(None)
        {
            set_nice(tid, was);
        }
        let rest = thread.map(|t| {
            t.join()
                .unwrap_or_else(|_| Err(Error::Invalid("the thread loading the tail calls' programs panicked".into())))
        });
        (first, rest)
    });
    first?;
    // No thread: loaded after the attached one, as before.
    rest.unwrap_or_else(|_| verify_beside(&mut beside))?;
    let arrays: Vec<(&'static str, &'static str)> = beside.iter().map(|(n, a, _)| (*n, *a)).collect();
    for (name, array) in arrays {
        put_in_array(ebpf, name, array)?;
    }
    Ok(())
}

/// Lowers the calling thread's priority by `by` (its nice raised, to 19
/// at most), best effort: its id and the nice it had (the process's own,
/// under `nice` or a unit's `Nice=`), to put back with [`set_nice`].
fn nice_down(by: i32) -> (libc::pid_t, i32) {
    // SAFETY: plain system calls on this thread; errno is this thread's.
    unsafe {
        let tid = libc::gettid();
        // getpriority's -1 is also a nice: errno tells a failure apart.
        *libc::__errno_location() = 0;
        let was = libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t);
        let was = if was == -1 && *libc::__errno_location() != 0 { 0 } else { was };
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, (was + by).min(19));
        (tid, was)
    }
}

/// Sets the nice value of thread `tid` of this process, best effort
/// (raising a priority needs CAP_SYS_NICE, or an RLIMIT_NICE that allows
/// it: the shipped unit's `LimitNICE=+0`).
fn set_nice(tid: libc::pid_t, nice: i32) {
    // SAFETY: a plain system call on a thread id of this process.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
}

/// Loads (the kernel verifies) an XDP program of the object.
fn verify(prog: &mut aya::programs::Program) -> Result<()> {
    let prog: &mut Xdp = prog.try_into().map_err(|e| Error::Program(Box::new(e)))?;
    prog.load().map_err(|e| Error::Program(Box::new(e)))
}

/// Sizes SYN cookies' per-rule maps (policer_common::syn) for
/// `max_rules` (slot 0 is never a rule's: one more).
fn size_syn_maps(loader: &mut EbpfLoader<'_>, max_rules: u32) {
    use policer_common::syn::{MAP_SYN_CONF, MAP_SYN_COUNTERS, MAP_SYN_TOTALS};
    for m in [MAP_SYN_CONF, MAP_SYN_TOTALS, MAP_SYN_COUNTERS] {
        loader.map_max_entries(m, max_rules + 1);
    }
}

/// Loads `policer replay`'s batch entry and puts it in its own program
/// array, so that each frame ends in a tail call to the next
/// (policer_common::replay). The array's entry goes with the load (the
/// kernel empties it with its last descriptor).
fn load_replay(ebpf: &mut Ebpf) -> Result<()> {
    use policer_common::replay::{MAP_REPLAY_PROG, REPLAY_PROGRAM};
    load_into_array(ebpf, REPLAY_PROGRAM, MAP_REPLAY_PROG)
}

/// Loads the object's XDP program `name` and puts it at index 0 of the
/// program array `array`, for a tail call to reach it.
fn load_into_array(ebpf: &mut Ebpf, name: &'static str, array: &'static str) -> Result<()> {
    verify(ebpf.program_mut(name).ok_or(Error::Missing(name))?)?;
    put_in_array(ebpf, name, array)
}

/// Puts the loaded XDP program `name` at index 0 of the program array
/// `array`.
fn put_in_array(ebpf: &mut Ebpf, name: &'static str, array: &'static str) -> Result<()> {
    let prog: &Xdp =
        ebpf.program(name).ok_or(Error::Missing(name))?.try_into().map_err(|e| Error::Program(Box::new(e)))?;
    let fd = prog
        .fd()
        .map_err(|e| Error::Program(Box::new(e)))?
        .try_clone()
        .map_err(Error::kernel(format!("duplicating the descriptor of program {name}")))?;
    let mut m = ProgramArray::try_from(ebpf.map_mut(array).ok_or(Error::Missing(array))?).map_err(Error::map(array))?;
    m.set(0, &fd, 0).map_err(Error::map(array))?;
    Ok(())
}

/// Writes the layout version into [`MAP_LAYOUT`], freezes the map (no
/// later write from user space) and binds it to the program: the program
/// never reads it, and without the binding it would not be among the
/// program's maps, where another build looks for it.
fn stamp_layout(ebpf: &mut Ebpf, version: u32) -> Result<()> {
    let mut m: Array<&mut MapData, u32> =
        Array::try_from(ebpf.map_mut(MAP_LAYOUT).ok_or(Error::Missing(MAP_LAYOUT))?).map_err(Error::map(MAP_LAYOUT))?;
    m.set(0, &version, 0).map_err(Error::map(MAP_LAYOUT))?;
    let map = map_fd(ebpf, MAP_LAYOUT)?;
    let prog: &Xdp = ebpf
        .program(PROGRAM_NAME)
        .ok_or(Error::Missing("XDP program"))?
        .try_into()
        .map_err(|e| Error::Program(Box::new(e)))?;
    let prog = prog.fd().map_err(|e| Error::Program(Box::new(e)))?.as_fd().as_raw_fd();
    const BPF_MAP_FREEZE: libc::c_long = 22;
    const BPF_PROG_BIND_MAP: libc::c_long = 35;
    let sys = |cmd: libc::c_long, attr: &[u32; 3], what: &str| -> Result<()> {
        // SAFETY: `attr` is a valid prefix of `union bpf_attr` for `cmd`
        // (map_fd; or prog_fd, map_fd, flags) and outlives the call.
        let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_ptr(), size_of_val(attr)) };
        if r < 0 {
            return Err(Error::Kernel { what: format!("{what} {MAP_LAYOUT}"), source: io::Error::last_os_error() });
        }
        Ok(())
    };
    sys(BPF_MAP_FREEZE, &[map as u32, 0, 0], "freezing")?;
    sys(BPF_PROG_BIND_MAP, &[prog as u32, map as u32, 0], "binding")
}

/// 64 random bits from the kernel.
fn random_u64() -> Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: writes at most 8 bytes into `b`.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) };
    if n != b.len() as isize {
        return Err(Error::Kernel { what: "getrandom".into(), source: io::Error::last_os_error() });
    }
    Ok(u64::from_ne_bytes(b))
}

/// The table and rule sizes a load is asked for, checked before anything
/// is loaded.
fn check_sizes(opts: &LoadOptions) -> Result<()> {
    if opts.max_sources == 0 {
        return Err(Error::Invalid("a table of 0 sources cannot be loaded".into()));
    }
    if !(1..=MAX_RULES).contains(&opts.max_rules) {
        return Err(Error::Invalid(format!("--max-rules must be 1 to {MAX_RULES}")));
    }
    Ok(())
}

/// A slot's counters zeroed and then counted into again (`now`), with what
/// it held before (`old`) added back, CPU by CPU: nothing the running
/// program counted is lost when a failed change puts a slot back.
pub fn merged_counters(
    old: &aya::maps::PerCpuValues<RuleCounters>,
    now: &aya::maps::PerCpuValues<RuleCounters>,
) -> Result<aya::maps::PerCpuValues<RuleCounters>> {
    let sum: Vec<RuleCounters> = old
        .iter()
        .zip(now.iter())
        .map(|(o, n)| {
            let mut c = *o;
            c.add(n);
            c
        })
        .collect();
    aya::maps::PerCpuValues::try_from(sum).map_err(|e| Error::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::parse_hz;

    #[test]
    fn hz_from_a_kernel_config() {
        assert_eq!(parse_hz("# CONFIG_HZ_100 is not set\nCONFIG_HZ_250=y\nCONFIG_HZ=250\n"), Some(250));
        assert_eq!(parse_hz("CONFIG_HZ_1000=y\nCONFIG_HZ=1000"), Some(1000));
        assert_eq!(parse_hz("CONFIG_HZ=\n"), None);
        assert_eq!(parse_hz("CONFIG_HZ=0\n"), None);
        assert_eq!(parse_hz("CONFIG_HZ_PERIODIC=y\n"), None);
    }
}
