//! Kernel cost per packet by `BPF_PROG_TEST_RUN` (one 64-byte frame run
//! `repeat` times): the policer's bench variant, which replaces the source
//! with synthetic sources 10.x.y.z cycling 0..N, beside the reference
//! programs measured in the same run.

use std::{net::Ipv4Addr, time::Instant};

use anyhow::{Context, Result};
use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, LpmTrie, MapData, PerCpuArray, lpm_trie::Key},
    programs::{TestRun, TestRunOptions, Xdp},
};
use ipnet::IpNet;
use policer_common::{
    Counters, GLOBAL_BENCH_SOURCES, GLOBAL_TEST_CLOCK, GLOBAL_TICK_NS, MAP_BUCKETS_V4, MAP_BUCKETS_V4_DROPS,
    MAP_BUCKETS_V4_GEOMETRY, MAP_BUCKETS_V6, MAP_COUNTERS, MAP_DEFAULT_RULES, MAP_FAST_PATH, MAP_RULES_V4,
    MAX_IFACE_SLOTS, PROGRAM_NAME, Rule,
    rate::Rate,
    table::{self, Geometry},
};
use policer_user::loader::{LoadOptions, Policer, Variant};

use crate::{BENCH_OBJECT, REFERENCE_OBJECT};
use serde::{Deserialize, Serialize};

use super::{
    Stat, say,
    sys::{DST, bench_cpu, pin_cpu},
};
use crate::frame::FrameSpec;

/// What a row runs.
enum Subject {
    Policer(Box<Policer>),
    /// The policer object loaded by the benchmark itself, with the
    /// BENCH_SOURCES global set (when `LoadOptions::variant` is not
    /// honoured by the loader).
    RawPolicer(Box<Ebpf>),
    Reference(Box<Ebpf>, &'static str),
}

impl Subject {
    fn prog(&mut self) -> Result<&Xdp> {
        Ok(match self {
            Subject::Policer(p) => p.program(),
            Subject::RawPolicer(e) => e.program(PROGRAM_NAME).context("policer program")?.try_into()?,
            Subject::Reference(e, name) => e.program(name).context("reference program")?.try_into()?,
        })
    }

    /// Buckets the policer created so far (None for references).
    fn created(&self) -> Result<Option<u64>> {
        Ok(match self {
            Subject::Policer(p) => Some(p.counters()?.buckets_created),
            Subject::RawPolicer(e) => Some(raw_counters(e)?.buckets_created),
            Subject::Reference(..) => None,
        })
    }
}

fn raw_counters(e: &Ebpf) -> Result<Counters> {
    let m: PerCpuArray<&MapData, Counters> = PerCpuArray::try_from(e.map(MAP_COUNTERS).context("COUNTERS")?)?;
    let mut total = Counters::default();
    for slot in 0..MAX_IFACE_SLOTS {
        for c in m.get(&slot, 0)?.iter() {
            total.add(c);
        }
    }
    Ok(total)
}

fn raw_set_default_rule(e: &mut Ebpf, rule: &Rule) -> Result<()> {
    let mut m: LpmTrie<&mut MapData, [u8; 4], Rule> = LpmTrie::try_from(e.map_mut(MAP_RULES_V4).context("RULES_V4")?)?;
    m.insert(&Key::new(0, [0; 4]), rule, 0)?;
    Ok(())
}

struct Row {
    key: &'static str,
    label: String,
    sources: u32,
    table: u32,
    repeat: u32,
    subject: Subject,
    wall: Vec<f64>,
    kernel: Vec<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelRow {
    /// Stable key: `policer_drop`, `policer_admit`, `parse_lookup`, `xdp_pass`, `xdp_drop`,
    /// `breakdown`, `policer_drop_class1` (+ 1 class rule, fast path),
    /// `policer_drop_classes` (+ 16 class rules, fast path),
    /// `policer_drop_classes_tries` (the same, rule from the tries),
    /// `policer_admit_chain` (all admitted, xdp_pass in the chain's slot 0).
    pub key: String,
    pub label: String,
    pub sources: u32,
    /// Capacity of the program's LRU table (0: none).
    pub table: u32,
    pub repeat: u32,
    /// ns per packet: wall time of the test-run syscall / repeat.
    pub ns: Stat,
    /// ns per packet as the kernel reports it (integer ns, same runs;
    /// time the test loop spends rescheduled is not counted). The headline.
    pub kernel_ns: Stat,
    /// `kernel_ns` per repetition, in run order.
    pub kernel_reps: Vec<f64>,
    /// Buckets the policer created during the measured runs (after the
    /// warm-up pass); non-zero means the table was evicting.
    pub created_while_measuring: Option<u64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct KernelResults {
    pub rows: Vec<KernelRow>,
    /// What one random read costs on the benchmark CPU, by the size of the
    /// region read from (see [`memory_latency`]).
    pub memory: Vec<MemoryLatency>,
}

/// One working-set size of [`memory_latency`].
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryLatency {
    pub bytes: usize,
    /// ns per dependent read of a random cache line of the region.
    pub ns: f64,
    /// The same with the region in 2 MiB pages (transparent huge pages;
    /// on a VM the host's own translation stays). NaN below 2 MiB.
    #[serde(deserialize_with = "crate::nan_if_null")]
    pub huge_ns: f64,
    /// Share of the region the kernel did back with huge pages (NaN: not
    /// measured).
    #[serde(deserialize_with = "crate::nan_if_null")]
    pub huge_share: f64,
}

/// Working sets [`memory_latency`] measures: L2-sized to past the tables.
pub const MEMORY_SIZES: [usize; 6] = [256 << 10, 1 << 20, 2 << 20, 4 << 20, 8 << 20, 32 << 20];

/// The latency of a random cache-line read from user space on this CPU,
/// by the size of the region: a chain of pointers through every line of
/// the region in random order, each read waiting for the one before (as
/// the policer's bucket read waits for the hash). It says what a table of
/// a given size costs per lookup on this machine, apart from any program.
pub fn memory_latency(reads: usize) -> Vec<MemoryLatency> {
    MEMORY_SIZES
        .iter()
        .map(|&bytes| {
            // Three rounds of each, alternating, the medians: the host's
            // other tenants move a single reading.
            let (mut ns, mut huge_ns, mut huge_share) = (vec![], vec![], f64::NAN);
            for round in 0..3 {
                // Each kind goes first in turn. A region smaller than a huge
                // page cannot have one.
                for huge in [round % 2 == 1, round % 2 == 0] {
                    if !huge {
                        ns.push(chase(Region::new(bytes, false).words(), reads));
                    } else if bytes >= Region::HUGE {
                        let mut r = Region::new(bytes, true);
                        huge_share = r.huge_share();
                        huge_ns.push(chase(r.words(), reads));
                    }
                }
            }
            let median = |v: &[f64]| if v.is_empty() { f64::NAN } else { Stat::of(v).median };
            MemoryLatency { bytes, ns: median(&ns), huge_ns: median(&huge_ns), huge_share }
        })
        .collect()
}

/// ns per read of a pointer chase through every cache line of `next`, in
/// one random cycle.
fn chase(next: &mut [usize], reads: usize) -> f64 {
    let lines = next.len() / 8;
    // Every line in one random cycle (Sattolo's shuffle).
    let mut order: Vec<usize> = (0..lines).collect();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..lines).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % i as u64) as usize);
    }
    // next[line * 8] = the next line's first word index.
    for i in 0..lines {
        next[order[i] * 8] = order[(i + 1) % lines] * 8;
    }
    let mut p = 0usize;
    for _ in 0..lines {
        p = next[p];
    }
    let t0 = Instant::now();
    for _ in 0..reads {
        p = next[p];
    }
    let ns = t0.elapsed().as_nanos() as f64 / reads as f64;
    std::hint::black_box(p);
    ns
}

/// An anonymous mapping of `bytes`, 2 MiB-aligned, with or without
/// transparent huge pages.
struct Region {
    base: *mut libc::c_void,
    len: usize,
    start: usize,
    bytes: usize,
}

impl Region {
    const HUGE: usize = 2 << 20;

    fn new(bytes: usize, huge: bool) -> Region {
        let len = bytes + Self::HUGE;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(base != libc::MAP_FAILED, "mmap of {len} bytes: {}", std::io::Error::last_os_error());
        let start = (base as usize).next_multiple_of(Self::HUGE);
        let advice = if huge { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: inside the mapping. Advice only: failure leaves 4 KiB
        // pages, which huge_share reports.
        unsafe { libc::madvise(start as *mut libc::c_void, bytes, advice) };
        let mut r = Region { base, len, start, bytes };
        r.words().fill(0);
        r
    }

    fn words(&mut self) -> &mut [usize] {
        // SAFETY: `bytes` of the mapping from `start`, aligned, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.start as *mut usize, self.bytes / 8) }
    }

    /// AnonHugePages of the mapping, over its size (from /proc/self/smaps).
    fn huge_share(&self) -> f64 {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return f64::NAN };
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16))
            {
                inside = a <= self.start && self.start < b;
            } else if inside && let Some(kb) = line.strip_prefix("AnonHugePages:") {
                let kb: f64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(f64::NAN);
                return kb * 1024.0 / self.bytes as f64;
            }
        }
        f64::NAN
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}

fn frame() -> Vec<u8> {
    FrameSpec::udp(Ipv4Addr::new(10, 0, 0, 1).into(), Ipv4Addr::from(DST).into(), 64).build(None)
}

fn run_once(prog: &Xdp, data: &[u8], repeat: u32) -> Result<(f64, f64)> {
    let t0 = Instant::now();
    let r = prog.test_run(TestRunOptions { data_in: Some(data), repeat, ..Default::default() }).context("test run")?;
    let wall = t0.elapsed().as_nanos() as f64 / f64::from(repeat);
    Ok((wall, r.duration.as_nanos() as f64))
}

/// The rule for `rate` and `burst`, one bucket per IPv4 address.
fn rule(rate: &str, burst: u64) -> Result<policer_common::Rule> {
    Rate::parse(rate)?.rule(burst)?.with_key_len(32, false).map_err(|e| anyhow::anyhow!("rule: {e:?}"))
}

/// The benchmark's build of the program, policing `sources` synthetic
/// sources.
fn bench_variant(sources: u32) -> Variant {
    Variant { object: BENCH_OBJECT, globals: vec![(GLOBAL_BENCH_SOURCES, sources)] }
}

/// The policer's bench variant with `rate` for 0.0.0.0/0.
/// (The loader sets the variant's globals or fails to load.)
fn policer(sources: u32, table: u32, rate: &str, burst: u64) -> Result<Subject> {
    let rule = rule(rate, burst)?;
    let mut p = Policer::load(&LoadOptions {
        max_sources: table,
        variant: Some(bench_variant(sources)),
        ..Default::default()
    })?;
    p.set_rule("0.0.0.0/0".parse::<IpNet>()?, &rule)?;
    // As the daemon does when only default rules exist: the fast path.
    p.set_default_rules(0, Some(rule), None)?;
    p.set_fast_path(1)?;
    Ok(Subject::Policer(Box::new(p)))
}

/// The policer's bench variant dropping (1 pps per source, the class-less
/// rule for 0.0.0.0/0) with the veth rows' 16 class rules
/// ([`CLASS_RULES`](super::peers::CLASS_RULES)) on the same prefix, none
/// of which matches the frame (UDP to port 9): compiled by the daemon's
/// compiler and installed by its loader (`sync_rules`). `fast`: the
/// default-rules fast path carries the prefix's compiled rule (all rules
/// are for 0.0.0.0/0); else the tries are searched.
///
/// `classes`: the class rules (CLASS_RULES, or one for a row that shows
/// whether the cost grows with their number).
fn policer_classes(sources: u32, table: u32, fast: bool, classes: &[&[&str]]) -> Result<Subject> {
    let base = rule("1pps", 1)?;
    let mut p = Policer::load(&LoadOptions {
        max_sources: table,
        variant: Some(bench_variant(sources)),
        ..Default::default()
    })?;
    let prefix = super::peers::CLASS_PREFIX;
    let mut rules = vec![crate::classes::kernel_rule(prefix, "", base, 1)];
    for (i, c) in classes.iter().enumerate() {
        let words: Vec<String> =
            c.chunks(2).map(|kv| format!("{}={}", kv[0].trim_start_matches("--"), kv.get(1).unwrap_or(&""))).collect();
        rules.push(crate::classes::kernel_rule(prefix, &words.join(" "), base, i as u32 + 2));
    }
    let compiled = crate::classes::install(&mut p, &rules, &[], 0);
    if fast {
        let net: IpNet = prefix.parse()?;
        let def = *compiled.prefixes.get(&net).context("the prefix's compiled rule")?;
        p.set_default_rules(0, Some(def), None)?;
        p.set_fast_path(1)?;
    }
    Ok(Subject::Policer(Box::new(p)))
}

/// A policer object loaded by the benchmark itself, set up as the daemon
/// sets it up with only a default rule: `rule` for 0.0.0.0/0, the fast
/// path on, the kernel's tick, BENCH_SOURCES = `sources`.
fn raw_policer(object: &[u8], sources: u32, table: u32, rule: &Rule) -> Result<Ebpf> {
    let tick_ns = policer_user::loader::kernel_hz().map_or(0, policer_common::clock::tick_ns);
    let mut loader = EbpfLoader::new();
    loader
        .map_max_entries(MAP_BUCKETS_V4, table::sets_for(table))
        .map_max_entries(MAP_BUCKETS_V4_DROPS, table::sets_for(table))
        .map_max_entries(MAP_BUCKETS_V6, table::sets_for(table))
        .map_max_entries(policer_common::MAP_BUCKETS_V6_DROPS, table::sets_for(table))
        .map_max_entries(policer_common::MAP_BUCKETS_V6_KEYS, table::sets_for(table))
        .map_max_entries(policer_common::MAP_RECALL, table::sets_for(table))
        .map_max_entries(policer_common::MAP_BUCKETS_V4_USED, table::used_words(table::sets_for(table)))
        .map_max_entries(policer_common::MAP_BUCKETS_V6_USED, table::used_words(table::sets_for(table)))
        .override_global(GLOBAL_TEST_CLOCK, &0u32, true)
        .override_global(GLOBAL_TICK_NS, &tick_ns, true)
        .override_global(GLOBAL_BENCH_SOURCES, &sources, true);
    let mut ebpf = loader.load(object)?;
    let x: &mut Xdp = ebpf.program_mut(PROGRAM_NAME).context("program")?.try_into()?;
    x.load()?;
    raw_set_default_rule(&mut ebpf, rule)?;
    let mut d: Array<&mut MapData, Rule> = Array::try_from(ebpf.map_mut(MAP_DEFAULT_RULES).context("DEFAULT_RULES")?)?;
    d.set(0, rule, 0)?;
    let mut f: Array<&mut MapData, u32> = Array::try_from(ebpf.map_mut(MAP_FAST_PATH).context("FAST_PATH")?)?;
    f.set(0, &1, 0)?;
    let mut g: Array<&mut MapData, Geometry> =
        Array::try_from(ebpf.map_mut(MAP_BUCKETS_V4_GEOMETRY).context("BUCKETS_V4_GEOM")?)?;
    g.set(0, &Geometry::new(0x9e37_79b9_7f4a_7c15, table), 0)?;
    Ok(ebpf)
}

pub(crate) fn reference(name: &'static str, sources: u32, table: u32, steps: u32) -> Result<Ebpf> {
    let mut loader = EbpfLoader::new();
    loader.map_max_entries("REF_TABLE", table.max(1)).override_global("REF_SOURCES", &sources, true).override_global(
        "REF_STEPS",
        &steps,
        true,
    );
    let mut e = loader.load(REFERENCE_OBJECT)?;
    let x: &mut Xdp = e.program_mut(name).context("reference program")?.try_into()?;
    x.load()?;
    let mut m: LpmTrie<&mut MapData, [u8; 4], Rule> = LpmTrie::try_from(e.map_mut("REF_RULES").context("REF_RULES")?)?;
    m.insert(&Key::new(0, [0; 4]), &rule("1pps", 1)?, 0)?;
    Ok(e)
}

/// Puts the reference xdp_pass in slot 0 of the policer's chain
/// (policer_common::chain): a chain array with its dispatcher at the slot
/// of interface index 0 (a test run's frame comes on no interface), as the
/// daemon makes one for each interface; in a build from before
/// dispatchers, its one `CHAIN`. False for an object without a chain. The
/// arrays hold the programs once they are in.
fn chain_pass(e: &mut Ebpf) -> Result<bool> {
    use aya::maps::{Map, ProgramArray};
    use policer_common::chain::{MAP_CHAIN, MAP_CHAIN_COUNTERS, MAP_CHAINS};
    use policer_user::chain::dispatch;
    use std::os::fd::AsFd;
    let pass = reference("xdp_pass", 0, 1, 0)?;
    let x: &Xdp = pass.program("xdp_pass").context("xdp_pass")?.try_into()?;
    if let (Some(Map::ProgramArray(chains)), Some(Map::PerCpuArray(counters))) =
        (e.map(MAP_CHAINS), e.map(MAP_CHAIN_COUNTERS))
    {
        let array = dispatch::create_array()?;
        dispatch::put(array.as_fd(), 0, x.fd()?.as_fd())?;
        let d = dispatch::load_dispatcher(array.as_fd(), counters.fd().as_fd(), 0)?;
        dispatch::put(chains.fd().as_fd(), 0, d.as_fd())?;
        return Ok(true);
    }
    let Some(m) = e.map_mut(MAP_CHAIN) else {
        return Ok(false);
    };
    let mut chain = ProgramArray::try_from(m)?;
    chain.set(0, x.fd()?, 0)?;
    Ok(true)
}

/// The cumulative steps of the breakdown rows (see reference.rs).
pub const STEPS: [(u32, &str); 4] = [
    (1, "+ LPM-trie rule lookup"),
    (3, "+ bpf_ktime_get_ns"),
    (7, "+ two per-CPU counter blocks"),
    (15, "+ atomic add on the bucket"),
];

const M: u32 = 1 << 20;

/// Runs in a thread of its own, pinned to the benchmark CPU.
pub fn run(quick: bool, reps: usize) -> Result<KernelResults> {
    std::thread::scope(|s| s.spawn(|| measure(quick, reps)).join())
        .map_err(|_| anyhow::anyhow!("kernel bench panicked"))?
}

fn measure(quick: bool, reps: usize) -> Result<KernelResults> {
    pin_cpu(bench_cpu())?;
    let sizes: &[(u32, u32)] = &[(1, M), (65_536, M), (M, 2 * M)];
    let (short, long) = if quick { (2_000_000, 2_000_000) } else { (10_000_000, 4_000_000) };
    let mut rows = Vec::new();
    let mut add = |key, label: String, sources, table, subject| {
        let repeat = if sources >= M { long } else { short };
        rows.push(Row { key, label, sources, table, repeat, subject, wall: vec![], kernel: vec![] });
    };
    add(
        "xdp_drop",
        "xdp_drop (reference)".into(),
        0,
        0,
        Subject::Reference(Box::new(reference("xdp_drop", 0, 1, 0)?), "xdp_drop"),
    );
    add(
        "xdp_pass",
        "xdp_pass (reference)".into(),
        0,
        0,
        Subject::Reference(Box::new(reference("xdp_pass", 0, 1, 0)?), "xdp_pass"),
    );
    let mut extra = sizes.to_vec();
    extra.push((M, M / 2));
    for &(n, table) in &extra {
        let tag = if table < n { format!("{n} sources, {table}-entry table") } else { format!("{n} sources") };
        add(
            "parse_lookup",
            format!("parse + one LRU lookup (reference), {tag}"),
            n,
            table,
            Subject::Reference(Box::new(reference("parse_lookup", n, table, 0)?), "parse_lookup"),
        );
        if n == 65_536 {
            for (steps, what) in STEPS {
                add(
                    "breakdown",
                    format!("parse + one LRU lookup {what}, {tag}"),
                    n,
                    table,
                    Subject::Reference(Box::new(reference("parse_lookup", n, table, steps)?), "parse_lookup"),
                );
            }
        }
        add(
            "policer_drop",
            format!("policer, dropping (1 pps per source), {tag}"),
            n,
            table,
            policer(n, table, "1pps", 1)?,
        );
        // The class rows' A/B in the kernel: the same with 16 class rules
        // that do not match the frame (needs the loader: `sync_rules`).
        if n == 65_536 {
            let one: [&[&str]; 1] = [super::peers::DNS_RULE];
            for (key, fast, classes, how) in [
                ("policer_drop_class1", true, &one[..], "1 class rule (udp dport 53)"),
                ("policer_drop_classes", true, &super::peers::CLASS_RULES[..], "16 class rules"),
                (
                    "policer_drop_classes_tries",
                    false,
                    &super::peers::CLASS_RULES[..],
                    "16 class rules, rule from the tries",
                ),
            ] {
                let how = if fast { format!("{how}, default-rules fast path") } else { how.to_string() };
                add(
                    key,
                    format!("policer, dropping, + {how}, none matching the frame, {tag}"),
                    n,
                    table,
                    policer_classes(n, table, fast, classes)?,
                );
            }
        }
        // With a table smaller than the sources, every frame is of a
        // source the table does not hold: dropping, most are refused by
        // the new-source limiter; all admitted, each takes a slot (the
        // spoofed flood's two kinds of miss).
        add(
            "policer_admit",
            format!("policer, all admitted (100 Mpps), {tag}"),
            n,
            table,
            policer(n, table, "100Mpps", 1_000_000)?,
        );
        // The chain's hand-off (docs/chain.md): the same with a
        // pass-through program (xdp_pass) in slot 0 of the policer's chain,
        // against the row above (the chain empty): the tail call and the
        // member's run.
        if n <= 65_536 {
            let mut s = policer(n, table, "100Mpps", 1_000_000)?;
            if let Subject::Policer(p) = &mut s
                && chain_pass(&mut p.ebpf)?
            {
                add(
                    "policer_admit_chain",
                    format!("policer, all admitted, xdp_pass in its chain's slot 0, {tag}"),
                    n,
                    table,
                    s,
                );
            }
        }
    }
    let data = frame();
    // Warm-up: one pass over every source creates the entries.
    let mut created0 = Vec::new();
    for r in rows.iter_mut() {
        let n = r.sources.max(100_000);
        run_once(r.subject.prog()?, &data, n)?;
        created0.push(r.subject.created()?);
    }
    for rep in 0..reps {
        say(&format!("kernel cost: repetition {}/{reps}", rep + 1));
        for r in rows.iter_mut() {
            let (w, k) = run_once(r.subject.prog()?, &data, r.repeat)?;
            r.wall.push(w);
            r.kernel.push(k);
        }
    }
    let mut out = Vec::new();
    for (r, c0) in rows.iter_mut().zip(created0) {
        let created = r.subject.created()?.zip(c0).map(|(c, c0)| c - c0);
        out.push(KernelRow {
            key: r.key.into(),
            label: r.label.clone(),
            sources: r.sources,
            table: r.table,
            repeat: r.repeat,
            ns: Stat::of(&r.wall),
            kernel_ns: Stat::of(&r.kernel),
            kernel_reps: r.kernel.clone(),
            created_while_measuring: created,
        });
    }
    // On the same pinned CPU, after the programs.
    let memory = memory_latency(if quick { 2_000_000 } else { 10_000_000 });
    Ok(KernelResults { rows: out, memory })
}

/// One row of an A/B comparison ([`ab`]): wall ns per packet over the
/// repetitions.
#[derive(Clone, Debug)]
pub struct AbRow {
    pub label: String,
    pub min: f64,
    pub q25: f64,
    pub median: f64,
}

/// Compares policer objects (`(name, ELF bytes)`) by PROG_TEST_RUN, for
/// work on the packet path: each dropping (1 pps per source) and admitting
/// everything, at 1 and 65 536 sources, beside the parse + one LRU lookup
/// reference; repetitions interleaved, `repeat` frames each. Not part of
/// the report: rows of two builds side by side in one run, which is what a
/// change of a few ns needs on a noisy VM.
pub fn ab(objects: &[(String, Vec<u8>)], reps: usize, repeat: u32) -> Result<Vec<AbRow>> {
    std::thread::scope(|s| s.spawn(|| ab_measure(objects, reps, repeat)).join())
        .map_err(|_| anyhow::anyhow!("A/B run panicked"))?
}

fn ab_measure(objects: &[(String, Vec<u8>)], reps: usize, repeat: u32) -> Result<Vec<AbRow>> {
    pin_cpu(bench_cpu())?;
    let data = frame();
    let mut subjects: Vec<(String, Subject)> = Vec::new();
    for n in [1u32, 65_536] {
        let reference = reference("parse_lookup", n, M, 0)?;
        subjects.push((
            format!("parse + one LRU lookup, {n} sources"),
            Subject::Reference(Box::new(reference), "parse_lookup"),
        ));
        for (name, object) in objects {
            for (rate, burst, what) in [("1pps", 1, "dropping"), ("100Mpps", 1_000_000, "all admitted")] {
                let e = raw_policer(object, n, M, &rule(rate, burst)?).with_context(|| format!("loading {name}"))?;
                subjects.push((format!("{name}, {what}, {n} sources"), Subject::RawPolicer(Box::new(e))));
                // An object with the chain: the same with xdp_pass in its
                // slot 0 (what it hands on runs one more program).
                let mut e =
                    raw_policer(object, n, M, &rule(rate, burst)?).with_context(|| format!("loading {name}"))?;
                if chain_pass(&mut e)? {
                    let label = format!("{name}, {what}, xdp_pass in the chain, {n} sources");
                    subjects.push((label, Subject::RawPolicer(Box::new(e))));
                }
            }
        }
    }
    // Warm-up: every source's bucket made.
    for (_, s) in subjects.iter_mut() {
        run_once(s.prog()?, &data, 200_000)?;
    }
    let mut wall: Vec<Vec<f64>> = vec![Vec::new(); subjects.len()];
    for _ in 0..reps.max(1) {
        for (i, (_, s)) in subjects.iter_mut().enumerate() {
            wall[i].push(run_once(s.prog()?, &data, repeat)?.0);
        }
    }
    Ok(subjects
        .iter()
        .zip(wall)
        .map(|((label, _), mut v)| {
            v.sort_by(f64::total_cmp);
            AbRow { label: label.clone(), min: v[0], q25: v[v.len() / 4], median: v[v.len() / 2] }
        })
        .collect())
}
