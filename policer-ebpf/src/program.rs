//! The XDP program: glue around `policer_common`.
//!
//! parse -> rule lookup (LPM trie) -> the prefix's classes, if it has
//! any (policer_common::class: one LPM lookup by protocol and port) ->
//! bucket lookup (a set-associative array per family, see
//! policer_common::table; on a miss the recall, policer_common::recall,
//! then the new-source limiter) -> `Rule::admit` under compare-and-swap ->
//! the rule's aggregate bucket, if it has one -> count.

use core::{
    intrinsics::{AtomicOrdering, atomic_cxchg, atomic_xadd},
    mem,
};

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, xdp_action, xdp_md},
    helpers::{bpf_get_prandom_u32, bpf_jiffies64, bpf_ktime_get_ns},
    macros::{map, xdp},
    maps::{Array, HashMap, LpmTrie, PerCpuArray, lpm_trie::Key},
    programs::XdpContext,
};
use aya_ebpf::{
    helpers::generated::{bpf_xdp_adjust_tail, bpf_xdp_load_bytes, bpf_xdp_store_bytes},
    maps::{ProgramArray, RingBuf},
};
use aya_log_ebpf::warn;
use network_types::{
    eth::EthHdr,
    ip::{Ipv4Hdr, Ipv6Hdr},
};
use policer_common::capture::{self, CAPTURE_RING_BYTES, CaptureRecord, SNAP_BYTES};
use policer_common::{
    ACTION_NONE, Bucket, BucketKeyV6, ClockWindow, Counters, CpuScratch, DEFAULT_MAX_RULES, DEFAULT_MAX_SOURCES,
    MAX_IFACE_SLOTS, NewSources, Rule, RuleCounters,
    ban::{self, Ban, BanParams, RULE_BAN},
    bucket::Action,
    capture::{CaptureCounters, CaptureLane, CaptureScratch, MAX_CAPTURES},
    class::{
        self, ClassFilter, ClassList, FrameL4, INDEX_PORT_BITS, IPPROTO_ICMP, IPPROTO_ICMPV6, IPPROTO_TCP, RULE_CLASS,
        RULE_NO_SOURCE, RULE_TOTAL, Total,
    },
    recall::{self, RecallSet},
    replay::{REPLAY_HEAD, REPLAY_MIN_LEN, ReplayCtl, ReplayFrame},
    slot::{self, Found, Miss, Refusal},
    table::{self, Geometry, KEY_MASK, Set, SetDrops, SetKeys, Slot, WAYS},
    verdict::{self, Verdict},
    wire::{
        ETH_P_8021AD, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IPPROTO_AH, IPPROTO_DSTOPTS, IPPROTO_FRAGMENT,
        IPPROTO_HOPOPTS, IPPROTO_ROUTING, IPV4_MIN_HLEN, IPV6_HLEN, MAX_EXT_HEADERS, MAX_EXT_OFFSET, MAX_VLAN_TAGS,
        VLAN_HLEN,
    },
};

#[map]
static RULES_V4: LpmTrie<[u8; 4], Rule> = LpmTrie::with_max_entries(DEFAULT_MAX_RULES, 0);
#[map]
static RULES_V6: LpmTrie<[u8; 16], Rule> = LpmTrie::with_max_entries(DEFAULT_MAX_RULES, 0);
/// The IPv4 sources: a set-associative table (see policer_common::table),
/// resized by the loader to `--max-sources`. Mmapable, so the sets start on
/// a page and each is exactly one cache line.
#[map]
static BUCKETS_V4: Array<Set> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), BPF_F_MMAPABLE);
/// Drops counted per slot of BUCKETS_V4 (same index, sampled); kept apart
/// so the drop path does not write the table.
#[map]
static BUCKETS_V4_DROP: Array<SetDrops> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
/// The tables' hash seed and size (written by the loader).
#[map]
static BUCKETS_V4_GEOM: Array<Geometry> = Array::with_max_entries(1, 0);
/// The IPv6 sources: the same design, fingerprints for keys.
#[map]
static BUCKETS_V6: Array<Set> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), BPF_F_MMAPABLE);
#[map]
static BUCKETS_V6_DROP: Array<SetDrops> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
/// The IPv6 sources behind the fingerprints (for user space only).
#[map]
static BUCKETS_V6_KEYS: Array<SetKeys> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
/// What eviction forgot (policer_common::recall), one set per table set.
#[map]
static RECALL: Array<RecallSet> = Array::with_max_entries(table::sets_for(DEFAULT_MAX_SOURCES), 0);
#[map]
static COUNTERS: PerCpuArray<Counters> = PerCpuArray::with_max_entries(MAX_IFACE_SLOTS, 0);
#[map]
static RULE_COUNTERS: PerCpuArray<RuleCounters> = PerCpuArray::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// This CPU's last clock reading and the bench sequence (see CpuScratch).
#[map]
static CPU_SCRATCH: PerCpuArray<CpuScratch> = PerCpuArray::with_max_entries(1, 0);
#[map]
static NEW_SOURCES: Array<NewSources> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// See policer_common::MAP_FAST_PATH. Array lookups are inlined by the
/// verifier; the LPM-trie lookup is a helper call (9-15 ns measured).
#[map]
static FAST_PATH: Array<u32> = Array::with_max_entries(1, 0);
#[map]
static DEFAULT_RULES: Array<Rule> = Array::with_max_entries(4, 0);
/// The test clock: [ns, jiffies] (jiffies 0: no clock window).
#[map]
static CLOCK: Array<u64> = Array::with_max_entries(2, 0);
/// The classes of the prefixes that have some (policer_common::class).
#[map]
static CLASS_INDEX: LpmTrie<[u8; class::INDEX_KEY_BYTES], ClassList> =
    LpmTrie::with_max_entries(policer_common::MAX_CLASS_INDEX_ENTRIES, 0);
/// Which frames each group's classes can match (read before the lookup).
#[map]
static CLASS_FILTER: Array<ClassFilter> = Array::with_max_entries(class::MAX_CLASS_GROUPS, 0);
/// The rules' aggregate buckets, at their counter slots.
#[map]
static TOTALS: Array<Total> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// Automatic bans by bucket key (policer_common::ban): preallocated, never
/// evicted.
#[map]
static BANS: HashMap<BucketKeyV6, Ban> = HashMap::with_max_entries(ban::DEFAULT_MAX_BANS, 0);
/// The automatic bans of each rule, at its counter slot.
#[map]
static BAN_PARAMS: Array<BanParams> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
/// The layout version stamp (policer_common::MAP_LAYOUT): written and
/// bound to the program by the loader, never read here.
#[map]
static LAYOUT: Array<u32> = Array::with_max_entries(1, 0);

/// `policer capture` (policer_common::capture): the mask of the lanes in
/// use, read once per judged frame; 0 while no capture runs. A global of
/// the program's `.bss` (policer_common::capture::MAP_CAPTURE_ON), not a
/// map of its own: the read is one load from an address the verifier
/// knows, with no lookup and no null check, the whole of capture's cost on
/// the drop path while none runs. Written by the daemon only.
#[unsafe(no_mangle)]
static mut CAPTURE_ON: u64 = 0;
/// Each capture's filter, sampling and rate bound.
#[map]
static CAPTURE_LANES: Array<CaptureLane> = Array::with_max_entries(MAX_CAPTURES as u32, 0);
/// The lanes that capture each rule (at its counter slot).
#[map]
static CAPTURE_RULES: Array<u32> = Array::with_max_entries(DEFAULT_MAX_RULES + 1, 0);
#[map]
static CAPTURE_COUNTERS: PerCpuArray<CaptureCounters> = PerCpuArray::with_max_entries(MAX_CAPTURES as u32, 0);
/// What the capture loop carries between lanes (see CaptureScratch).
#[map]
static CAPTURE_SCRATCH: PerCpuArray<CaptureScratch> = PerCpuArray::with_max_entries(1, 0);
/// The captured frames, to the daemon.
#[map]
static CAPTURE_RING: RingBuf = RingBuf::with_byte_size(CAPTURE_RING_BYTES, 0);
/// The capture program (`policer_capture` below), put here by the loader:
/// the verdict reaches it by a tail call, so the lanes run on a stack of
/// their own (this program's frame leaves too little of the 512 bytes the
/// verifier allows a call chain). Empty (a tail call that fails) until the
/// loader fills it, and again once the last descriptor of this array is
/// closed (the kernel clears a program array with its last user).
#[map]
static CAPTURE_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// `policer replay`'s batch of frames and its cursor
/// (policer_common::replay): one entry each in the object; replay sizes the
/// batch. Read only by `policer_replay`, which only replay loads.
#[map]
static REPLAY_FRAMES: Array<ReplayFrame> = Array::with_max_entries(1, BPF_F_MMAPABLE);
#[map]
static REPLAY_CTL: Array<ReplayCtl> = Array::with_max_entries(1, BPF_F_MMAPABLE);
/// `policer_replay` itself, put here by replay's loader: each frame ends
/// in a tail call to the next (policer_common::replay).
#[map]
static REPLAY_PROG: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// Set by the loader (read-only data): non-zero reads the clock from
/// `CLOCK`, for tests that control time. Constant after load, so the
/// verifier prunes the branch that is not taken.
#[unsafe(no_mangle)]
static TEST_CLOCK: u32 = 0;

/// Set by the loader: the kernel's tick (1e9 / CONFIG_HZ) in ns, so the
/// program knows how far the clock can be from its last reading by the
/// jiffies alone (see policer_common::clock). 0: unknown, the clock is read
/// for every frame that reaches a bucket.
#[unsafe(no_mangle)]
static TICK_NS: u64 = 0;

/// Set by the loader: one IPv4 drop in 2^N is counted per source, as 2^N
/// (policer_common::table::DROP_SAMPLE_SHIFT); 0 counts every drop.
#[unsafe(no_mangle)]
static DROP_SAMPLE_SHIFT: u32 = table::DROP_SAMPLE_SHIFT;

/// Set by the benchmark's loader: non-zero replaces the source with
/// synthetic IPv4 sources 0..BENCH_SOURCES in turn, so one test frame
/// touches many buckets. Only in the benchmark's build of this program
/// (the `bench` feature, see Cargo.toml): the product carries no hook.
#[cfg(feature = "bench")]
#[unsafe(no_mangle)]
static BENCH_SOURCES: u32 = 0;

/// Compare-and-swap rounds before giving up. Each lost round means another
/// CPU admitted a packet from this bucket meanwhile; four in a row is rare.
const CAS_ROUNDS: usize = 4;

#[xdp]
pub fn policer(ctx: XdpContext) -> u32 {
    judge_frame(ctx.ctx)
}

/// The policer's code on a frame: the attached program's body, and what
/// `policer_replay` runs for each frame of a batch (one copy in the
/// object, called by both).
#[inline(never)]
fn judge_frame(md: *mut xdp_md) -> u32 {
    try_policer(&XdpContext::new(md))
}

/// `policer replay`'s batch entry (policer_common::replay): run with a
/// test run's `repeat`, each run makes the test frame the batch's next
/// frame and judges it with the code above. Test clock only (the product
/// never loads it; without the test clock it does nothing).
#[xdp]
pub fn policer_replay(ctx: XdpContext) -> u32 {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } == 0 {
        return xdp_action::XDP_ABORTED;
    }
    // Each step is a function of its own and this one keeps only
    // registers, so that the policer's code has as much of the stack as in
    // the attached program (the verifier allows 512 bytes for the deepest
    // chain of calls), and is the attached program's own function.
    let i = replay_prepare(ctx.ctx);
    if i < 0 {
        return xdp_action::XDP_ABORTED;
    }
    let ret = judge_frame(ctx.ctx);
    replay_finish(ctx.ctx, i as u32, ret);
    // The next frame, in the same test run: a tail call starts afresh
    // (stack and all); after the kernel's limit (33 in a row) it fails
    // and the run ends here.
    // SAFETY: a tail call from this program's own context.
    unsafe { REPLAY_PROG.tail_call(&ctx, 0) };
    ret
}

/// Makes the test run's frame the batch's next frame (its length, its
/// head, its time in the metadata); the frame's index, -1 past the
/// batch's end or when the frame cannot be made (a scalar: an `Option`
/// would come back through the caller's stack).
#[inline(never)]
fn replay_prepare(md: *mut xdp_md) -> i64 {
    replay_make(md).map_or(-1, i64::from)
}

#[inline(always)]
fn replay_make(md: *mut xdp_md) -> Option<u32> {
    let ctx = XdpContext::new(md);
    let ctl = REPLAY_CTL.get_ptr_mut(0)?;
    // SAFETY: the map's one entry; a test run runs on one CPU, and replay
    // writes it only between runs.
    let ctl = unsafe { &mut *ctl };
    let i = ctl.next;
    if i >= ctl.count {
        return None;
    }
    ctl.next = i + 1;
    let f = REPLAY_FRAMES.get_ptr_mut(i)?;
    // SAFETY: an entry of the batch, written by replay before the run.
    let f = unsafe { &mut *f };
    let len = f.len;
    if len < REPLAY_MIN_LEN {
        return None;
    }
    // The head is copied whole (a constant size, as the verifier wants it):
    // the frame is made at least that long for the copy, then cut to its
    // length.
    let copy_len = if (len as usize) < REPLAY_HEAD { REPLAY_HEAD as u32 } else { len };
    let delta = copy_len as i64 - (ctx.data_end() - ctx.data()) as i64;
    // SAFETY: helpers on this program's own context; packet pointers are
    // read again from the context after them.
    unsafe {
        if delta != 0 && bpf_xdp_adjust_tail(md, delta as i32) != 0 {
            return None;
        }
        if bpf_xdp_store_bytes(md, 0, f.head.as_mut_ptr().cast(), REPLAY_HEAD as u32) != 0 {
            return None;
        }
        if copy_len != len && bpf_xdp_adjust_tail(md, len as i32 - copy_len as i32) != 0 {
            return None;
        }
    }
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_LEN > ctx.data() {
        return None;
    }
    // SAFETY: bounds checked against `data` above; XDP may write metadata.
    unsafe {
        core::ptr::write_unaligned((meta + verdict::TEST_META_NOW) as *mut u64, f.now);
        core::ptr::write_unaligned((meta + verdict::TEST_META_SLOT) as *mut u32, u32::MAX);
        core::ptr::write_unaligned((meta + verdict::TEST_META_VERDICT) as *mut u32, u32::MAX);
    }
    Some(i)
}

/// Writes what the policer's code made of frame `i` back into its record.
#[inline(never)]
fn replay_finish(md: *mut xdp_md, i: u32, ret: u32) {
    let ctx = XdpContext::new(md);
    let Some(f) = REPLAY_FRAMES.get_ptr_mut(i) else {
        return;
    };
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_LEN > ctx.data() {
        return;
    }
    // SAFETY: bounds checked against `data` above; `f` an entry of the batch.
    unsafe {
        (*f).slot = core::ptr::read_unaligned((meta + verdict::TEST_META_SLOT) as *const u32);
        (*f).verdict = core::ptr::read_unaligned((meta + verdict::TEST_META_VERDICT) as *const u32);
        (*f).ret = ret;
    }
}

/// The time, read at most once per frame and only when a verdict needs it.
struct Clock {
    scratch: *mut CpuScratch,
    jiffies: u64,
    /// Where the time is known to lie without reading the clock.
    window: Option<ClockWindow>,
    now: Option<u64>,
}

impl Clock {
    #[inline(always)]
    fn new(ctx: &XdpContext) -> Clock {
        let scratch = CPU_SCRATCH.get_ptr_mut(0).unwrap_or(core::ptr::null_mut());
        // SAFETY: plain statics the loader may rewrite before load.
        let (test, tick) = unsafe { (core::ptr::read_volatile(&TEST_CLOCK) != 0, core::ptr::read_volatile(&TICK_NS)) };
        let jiffies = if test {
            // A time in the frame's metadata (`policer replay`) is the
            // clock from this frame on, as if written into `CLOCK`.
            let meta_now = test_meta_now(ctx);
            if meta_now != 0
                && let Some(t) = CLOCK.get_ptr_mut(0)
            {
                // SAFETY: an array slot; tests run one frame at a time.
                unsafe { *t = meta_now };
            }
            CLOCK.get(1).copied().unwrap_or(0)
        } else {
            // SAFETY: BPF helper with no preconditions (inlined by the verifier).
            unsafe { bpf_jiffies64() }
        };
        let window = if scratch.is_null() || (test && jiffies == 0) {
            None
        } else {
            // SAFETY: this CPU's slot; only this CPU touches it while we run.
            unsafe { (*scratch).window(jiffies, tick) }
        };
        Clock { scratch, jiffies, window, now: None }
    }

    /// Whether `rule` refuses the frame at every instant the time can be,
    /// so it can be dropped without reading the clock.
    #[inline(always)]
    fn refuses(&self, rule: &Rule, tat: u64, len: u32) -> bool {
        match self.window {
            Some(w) if self.now.is_none() => rule.refuses_within(tat, w.lo, w.hi, len),
            _ => false,
        }
    }

    /// The time, or the upper end of the window it is known to lie in
    /// (no clock read), for decisions a few ticks cannot change.
    #[inline(always)]
    fn approx(&mut self) -> u64 {
        match self.window {
            Some(w) if self.now.is_none() => w.hi,
            _ => self.now(),
        }
    }

    /// Whether to count this drop (one in 2^`shift`, at random).
    #[inline(always)]
    fn sample(&mut self, shift: u32) -> bool {
        if shift == 0 || self.scratch.is_null() {
            return true;
        }
        // SAFETY: as in `new`.
        let r = unsafe { (*self.scratch).next_random() };
        r & ((1u64 << (shift & 31)) - 1) == 0
    }

    #[inline(always)]
    fn now(&mut self) -> u64 {
        if let Some(now) = self.now {
            return now;
        }
        // SAFETY: a read of a plain static the loader may rewrite before load.
        let now = if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } != 0 {
            CLOCK.get(0).copied().unwrap_or(0)
        } else {
            // SAFETY: BPF helper with no preconditions.
            unsafe { bpf_ktime_get_ns() }
        };
        if !self.scratch.is_null() {
            // SAFETY: as in `new`.
            unsafe { (*self.scratch).record(now, self.jiffies) };
        }
        self.now = Some(now);
        now
    }
}

/// Test clock only: the time a test run gives in the frame's metadata
/// (policer_common::verdict::TEST_META_LEN), 0 when it gives none.
#[inline(always)]
fn test_meta_now(ctx: &XdpContext) -> u64 {
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_NOW + 8 > ctx.data() {
        return 0;
    }
    // SAFETY: bounds checked against `data` above (metadata lies before it).
    unsafe { core::ptr::read_unaligned((meta + verdict::TEST_META_NOW) as *const u64) }
}

/// Test clock only: writes which rule slot judged the frame, and how, into
/// its metadata when the test run gave room for it.
#[inline(always)]
fn test_meta_report(ctx: &XdpContext, slot: u32, v: Verdict) {
    let meta = ctx.metadata();
    if meta + verdict::TEST_META_LEN > ctx.data() {
        return;
    }
    // SAFETY: bounds checked against `data` above; XDP may write metadata.
    unsafe {
        core::ptr::write_unaligned((meta + verdict::TEST_META_SLOT) as *mut u32, slot);
        core::ptr::write_unaligned((meta + verdict::TEST_META_VERDICT) as *mut u32, verdict::test_meta_code(v));
    }
}

/// `x`, passed through this CPU's scratch map value, so that the verifier
/// sees a number it cannot know (range checks still bound it) and walks
/// what follows once, not once per value `x` could take.
#[inline(always)]
fn launder(x: u64) -> u64 {
    match CPU_SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; only this CPU touches it while we run.
        Some(s) => unsafe {
            core::ptr::write_volatile(&raw mut (*s).opaque, x);
            core::ptr::read_volatile(&(*s).opaque)
        },
        None => x,
    }
}

/// One bounds-checked read of a `T` at `off` bytes into the frame.
#[inline(always)]
fn ptr_at<T>(ctx: &XdpContext, off: usize) -> Option<*const T> {
    let start = ctx.data();
    let end = ctx.data_end();
    if start + off + mem::size_of::<T>() > end {
        return None;
    }
    Some((start + off) as *const T)
}

enum Parsed {
    NonIp,
    Malformed,
    /// The source address as it sits in the header (network order).
    V4 {
        src: [u8; 4],
        fragment: bool,
        l4: L4At,
    },
    V6 {
        src: [u8; 16],
        fragment: bool,
        l4: L4At,
    },
}

/// Where the layer-4 header is, read only if the source's prefix has
/// classes: packed in one word, so that it costs one register (or one
/// spill) on the path of every frame.
#[derive(Clone, Copy)]
struct L4At(u64);

impl L4At {
    /// `ip`: offset of the IP header (its destination is read from there,
    /// for classes only); `off`: offset of the layer-4 header, 0 for none
    /// to read (a non-first fragment, or an IPv6 extension chain longer
    /// than the walk).
    #[inline(always)]
    fn new(ip: usize, proto: u8, off: usize) -> L4At {
        L4At((off as u64 & 0xffff) | (proto as u64) << 16 | (ip as u64 & 0xff) << 24)
    }

    #[inline(always)]
    fn ip(self) -> usize {
        ((self.0 >> 24) & 0xff) as usize
    }

    #[inline(always)]
    fn proto(self) -> u8 {
        (self.0 >> 16) as u8
    }

    #[inline(always)]
    fn off(self) -> usize {
        (self.0 & 0xffff) as usize
    }
}

#[inline(always)]
fn parse(ctx: &XdpContext) -> Parsed {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return Parsed::NonIp;
    };
    // SAFETY: bounds checked by ptr_at.
    let mut proto = u16::from_be(unsafe { (*eth).ether_type });
    let mut off = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        // The inner ethertype sits in the last two bytes of the tag.
        let Some(inner) = ptr_at::<[u8; 2]>(ctx, off + VLAN_HLEN - 2) else {
            return Parsed::Malformed;
        };
        // SAFETY: bounds checked by ptr_at.
        proto = u16::from_be_bytes(unsafe { *inner });
        off += VLAN_HLEN;
    }
    let frame_len = ctx.data_end() - ctx.data();
    match proto {
        ETH_P_IP => {
            let Some(ip) = ptr_at::<Ipv4Hdr>(ctx, off) else {
                return Parsed::Malformed;
            };
            // SAFETY: bounds checked by ptr_at.
            let ip = unsafe { &*ip };
            let hlen = ((ip.vihl & 0xf) as usize) * 4;
            let tot_len = u16::from_be_bytes(ip.tot_len) as usize;
            // Version 4, IHL >= 5, options inside the frame, and a total
            // length that covers the header and fits in the frame (shorter
            // is fine: Ethernet pads small frames).
            if ip.vihl >> 4 != 4
                || hlen < IPV4_MIN_HLEN
                || off + hlen > frame_len
                || tot_len < hlen
                || off + tot_len > frame_len
            {
                return Parsed::Malformed;
            }
            // More-fragments flag or a fragment offset.
            let frags = u16::from_be_bytes(ip.frags);
            let fragment = frags & 0x3fff != 0;
            // Only a first fragment (offset 0) carries the layer-4 header.
            let l4 = L4At::new(off, ip.proto as u8, if frags & 0x1fff == 0 { off + hlen } else { 0 });
            Parsed::V4 { src: ip.src_addr, fragment, l4 }
        }
        ETH_P_IPV6 => {
            let Some(ip) = ptr_at::<Ipv6Hdr>(ctx, off) else {
                return Parsed::Malformed;
            };
            // SAFETY: bounds checked by ptr_at.
            let ip = unsafe { &*ip };
            let payload = u16::from_be_bytes(ip.payload_len) as usize;
            // Payload length 0 is a jumbogram (or unknown): not checked.
            if ip.vcf[0] >> 4 != 6 || off + IPV6_HLEN + payload > frame_len {
                return Parsed::Malformed;
            }
            // Walk the extension headers to find a fragment header; a
            // header cut off by the end of the frame is malformed.
            let mut nh = ip.next_hdr;
            let mut p = off + IPV6_HLEN;
            let mut fragment = false;
            // The header after the chain, once found (stays 0 for a chain
            // the walk does not finish, and for a non-first fragment).
            let mut l4_off = 0;
            let mut later_fragment = false;
            for _ in 0..MAX_EXT_HEADERS {
                let len = match nh {
                    IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH => {
                        let Some(h) = ptr_at::<[u8; 2]>(ctx, p) else {
                            return Parsed::Malformed;
                        };
                        // SAFETY: bounds checked by ptr_at.
                        let h = unsafe { *h };
                        let len = if nh == IPPROTO_AH { (h[1] as usize + 2) * 4 } else { (h[1] as usize + 1) * 8 };
                        nh = h[0];
                        len
                    }
                    IPPROTO_FRAGMENT => {
                        // The whole (fixed, 8-byte) header; a one-byte read
                        // gets a bounds check the verifier cannot follow.
                        let Some(h) = ptr_at::<[u8; 8]>(ctx, p) else {
                            return Parsed::Malformed;
                        };
                        fragment = true;
                        // SAFETY: bounds checked by ptr_at.
                        let h = unsafe { *h };
                        nh = h[0];
                        later_fragment |= u16::from_be_bytes([h[2], h[3]]) & 0xfff8 != 0;
                        8
                    }
                    _ => {
                        l4_off = p;
                        break;
                    }
                };
                if p + len > frame_len {
                    return Parsed::Malformed;
                }
                p += len;
                // Bounded: past this, the rest of the chain is not read.
                if p > MAX_EXT_OFFSET {
                    break;
                }
            }
            let l4 = L4At::new(off, nh, if later_fragment { 0 } else { l4_off });
            Parsed::V6 { src: ip.src_addr, fragment, l4 }
        }
        _ => Parsed::NonIp,
    }
}

/// The rule for a source: with only default rules (FAST_PATH) an inlined
/// array read, else the longest-prefix match in the family's trie.
#[inline(always)]
fn lookup_rule<const V6: bool>(search: impl FnOnce() -> Option<&'static Rule>) -> Option<&'static Rule> {
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
fn resolve_class<const V6: bool>(ctx: &XdpContext, rule: &'static Rule, l4: L4At, c: &mut Counters) -> &'static Rule {
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
        let mut f = FrameL4 { proto, has_l4: false, dport: 0, tcp_flags: 0, icmp_type: 0, dst: [0; 16] };
        // Laundered: the IPv6 walk ends at one of several offsets, and the
        // verifier would follow what comes next once for each.
        let off = launder(self.l4.off() as u64) as usize;
        let off = if off > MAX_EXT_OFFSET + 8 { 0 } else { off };
        if off != 0 {
            if proto == IPPROTO_TCP {
                if let Some(h) = ptr_at::<[u8; 14]>(ctx, off) {
                    // SAFETY: bounds checked by ptr_at.
                    let h = unsafe { *h };
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

/// Charges one frame to the rule's aggregate bucket (`--total-rate`).
#[inline(always)]
fn total_admits(slot: u32, clock: &mut Clock, len: u32, c: &mut Counters) -> bool {
    let Some(t) = TOTALS.get_ptr_mut(slot) else {
        return true;
    };
    // SAFETY: a live array value; `tat` is only changed by compare-and-swap.
    unsafe {
        let limiter = &(*t).limiter;
        // Every round lost to other CPUs: dropped, as for a source's bucket.
        matches!(charge(&raw mut (*t).tat, limiter, clock, len, &mut c.cas_retries), Charge::Admitted)
    }
}

/// Where a drop is counted for the source.
enum DropAt {
    Nowhere,
    /// A table's drop array: IPv6 or not, set, way.
    Slot(bool, u32, usize),
}

/// What `police` decided, and where to count a drop.
struct Judged {
    admit: bool,
    drop_at: DropAt,
}

impl Judged {
    const fn new_bucket(admit: bool) -> Judged {
        Judged { admit, drop_at: DropAt::Nowhere }
    }
}

/// The family's table and its drop counts.
#[inline(always)]
fn table_of<const V6: bool>() -> (&'static Array<Set>, &'static Array<SetDrops>) {
    if V6 { (&BUCKETS_V6, &BUCKETS_V6_DROP) } else { (&BUCKETS_V4, &BUCKETS_V4_DROP) }
}

/// Judges a frame against its source's slot in the family's
/// set-associative table (see policer_common::table): looked for in its
/// first set, then its second; on a miss the recall (policer_common::recall)
/// and the new-source limiter decide. `key` is the source's key word
/// without a stamp, `index` its two sets, `v6_key` the IPv6 source (written
/// beside the slot it claims).
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined glue: the frame's parsed fields, passed as the verifier tracks them"
)]
fn police_table<const V6: bool>(
    ctx: &XdpContext,
    g: &Geometry,
    key: u64,
    index: [u32; 2],
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    len: u32,
    c: &mut Counters,
    rc: &mut RuleCounters,
) -> Judged {
    let (table, drops) = table_of::<V6>();
    let Some(first) = table.get_ptr_mut(index[0]) else {
        // No table (not set up by the loader): police nothing.
        c.bucket_insert_failed += 1;
        return Judged::new_bucket(true);
    };
    // SAFETY: `first` and `second` point into the array's values, live for
    // this program run; slots are read with volatile loads because other
    // CPUs write them.
    unsafe {
        // The second set only when the first does not hold the source: a
        // new source, or one whose first set was full when it came (rare).
        // Under a flood of new sources this is a second read, which the
        // benchmark's table-overflow rows measured as no slower.
        let (second, index1) = match table.get_ptr_mut(index[1]) {
            Some(s) if index[1] != index[0] => (s, index[1]),
            _ => (first, index[0]),
        };
        let found = match find(first, key) {
            Some((w, word)) => Some((first, index[0], w, word)),
            None if index1 != index[0] => find(second, key).map(|(w, word)| (second, index1, w, word)),
            None => None,
        };
        if let Some((set, at, w, word)) = found {
            // One place that judges a found slot, whichever set and way
            // (laundered: the verifier walks it once, not per way).
            let w = launder(w as u64) as usize % WAYS;
            let slot = (&raw mut (*set).ways as *mut Slot).add(w);
            let admit = slot_admit::<V6>(ctx, slot, word, v6_key, rule, clock, len, c);
            return Judged { admit, drop_at: DropAt::Slot(V6, at, w) };
        }
        // Not in the table: the miss policy (policer_common::slot::miss)
        // decides whether it gets a slot.
        let (tat, now, returned) = match slot::miss(rule, len, &mut TableMiss::<V6> { g, key, v6_key, rule, clock, c })
        {
            Miss::Take { tat, now_ns, returned } => (tat, now_ns, returned),
            Miss::Banned | Miss::Refused => return Judged::new_bucket(false),
            Miss::DebtDrop => {
                c.recall_debt_drops += 1;
                return Judged::new_bucket(false);
            }
            Miss::Limited => {
                c.new_sources_limited += 1;
                return Judged::new_bucket(false);
            }
        };
        if returned {
            c.recall_known += 1;
        }
        let (w0, w1) = (&raw mut (*first).ways as *mut Slot, &raw mut (*second).ways as *mut Slot);
        let mut slots = [[Slot::default(); WAYS]; 2];
        for w in 0..WAYS {
            slots[0][w] = core::ptr::read_volatile(w0.add(w));
            slots[1][w] = core::ptr::read_volatile(w1.add(w));
        }
        // The victim as a number the verifier cannot know (else it walks
        // the rest of this path once for each of the eight slots).
        let code = launder(table::victim_code(&slots, now)) & 7;
        let (i, v) = ((code >> 2) as usize, (code & 3) as usize);
        let (ways, index) = if i == 0 { (w0, index[0]) } else { (w1, index1) };
        let slot = ways.add(v);
        let old = core::ptr::read_volatile(slot);
        let returned = if returned { table::KEY_RETURNED } else { 0 };
        let seen = cas(&raw mut (*slot).key, old.key, table::stamped(key | returned, rule.stamp));
        if seen == old.key {
            // Ours: the new bucket replaces whatever the slot held, and
            // its drop count starts at zero.
            core::ptr::write_volatile(&raw mut (*slot).tat, tat);
            if let Some(d) = drops.get_ptr_mut(index) {
                core::ptr::write_volatile((&raw mut (*d).ways as *mut u64).add(v), 0);
            }
            if V6 && let Some(k) = BUCKETS_V6_KEYS.get_ptr_mut(index) {
                core::ptr::write_volatile((&raw mut (*k).ways as *mut BucketKeyV6).add(v), *v6_key);
            }
            c.buckets_created += 1;
            rc.buckets_created += 1;
            remember::<V6>(g, &old, now, c);
            return Judged::new_bucket(true);
        }
        if seen & KEY_MASK == key {
            // Another CPU made this source's bucket meanwhile: judge by it.
            let admit = slot_admit::<V6>(ctx, slot, seen, v6_key, rule, clock, len, c);
            return Judged { admit, drop_at: DropAt::Slot(V6, index, v) };
        }
    }
    // Lost the slot to another new source: rare; admitted, and counted.
    c.bucket_insert_failed += 1;
    Judged::new_bucket(true)
}

/// What the miss policy reads for a source the table does not hold: the
/// ban store (a banned source whose slot went to a flood of new sources,
/// or that was banned while it had none), the recall, the rule's
/// new-source limiter, the clock.
struct TableMiss<'a, const V6: bool> {
    g: &'a Geometry,
    /// The source's key word (no stamp).
    key: u64,
    v6_key: &'a BucketKeyV6,
    rule: &'a Rule,
    clock: &'a mut Clock,
    c: &'a mut Counters,
}

impl<const V6: bool> slot::MissLookups for TableMiss<'_, V6> {
    #[inline(always)]
    fn banned(&mut self) -> bool {
        banned::<V6>(self.key, self.v6_key, self.clock, self.c)
    }

    /// Read with the time's upper bound when the jiffies give one (a window
    /// of ticks is nothing against the recall's window), so a refused new
    /// source still costs no clock read.
    #[inline(always)]
    fn recalled(&mut self) -> Option<u64> {
        let (rset, fp) = recall::locate(self.g.seed, self.g.sets, self.key, V6);
        RECALL.get(rset).and_then(|s| recall::recall(s, fp, self.clock.approx()))
    }

    #[inline(always)]
    fn new_source_allowed(&mut self) -> bool {
        new_source_allowed(self.rule, self.clock)
    }

    #[inline(always)]
    fn now(&mut self) -> u64 {
        self.clock.now()
    }
}

/// Writes an evicted slot into the recall (policer_common::recall), marked
/// *once* when it had drained and its source had not come back.
#[inline(always)]
fn remember<const V6: bool>(g: &Geometry, old: &Slot, now: u64, c: &mut Counters) {
    if old.key & table::KEY_VALID == 0 {
        return;
    }
    let debt = table::slot_debt_ns(old, now);
    let once = policer_common::flat::is_zero(debt) & (((old.key & table::KEY_RETURNED) >> 39) ^ 1);
    let (rset, fp) = recall::locate(g.seed, g.sets, old.key, V6);
    let Some(s) = RECALL.get_ptr_mut(rset) else {
        return;
    };
    // SAFETY: a live array value; entries are whole words, written plainly
    // (two CPUs placing entries at once can lose one: a source forgotten,
    // judged as new).
    unsafe {
        let set = core::ptr::read_volatile(s);
        let i = launder(recall::place(&set, fp, now) as u64) as usize % recall::RECALL_WAYS;
        core::ptr::write_volatile((&raw mut (*s).entries as *mut u64).add(i), recall::entry(fp, now, debt, once));
    }
    c.recall_stored += 1;
}

/// The way of the set at `set` that holds the source `key`, and its key
/// word as read.
///
/// # Safety
/// `set` must point into a live map value.
#[inline(always)]
unsafe fn find(set: *mut Set, key: u64) -> Option<(usize, u64)> {
    // SAFETY: the caller's contract.
    unsafe {
        let ways = &raw mut (*set).ways as *mut Slot;
        for w in 0..WAYS {
            let word = core::ptr::read_volatile(&(*ways.add(w)).key);
            if word & KEY_MASK == key {
                return Some((w, word));
            }
        }
    }
    None
}

/// Charges a frame to a slot whose key word was read as `word`, carrying
/// the bucket over first if its rule changed size or unit, and marking the
/// source as come back (once per slot). A slot that caches a ban or counts
/// refusals (policer_common::ban) is handled here too, off the path of a
/// slot whose word is already what the rule wants.
///
/// # Safety
/// `slot` must point into a live map value.
#[inline(always)]
#[expect(
    clippy::too_many_arguments,
    reason = "inlined glue: the found slot and the frame, passed as the verifier tracks them"
)]
unsafe fn slot_admit<const V6: bool>(
    ctx: &XdpContext,
    slot: *mut Slot,
    word: u64,
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    len: u32,
    c: &mut Counters,
) -> bool {
    // SAFETY: the caller's contract.
    unsafe {
        let want = slot::wanted(word, rule);
        // All but Ready are rare (the source's second frame, the first
        // after a rule change, a banned source, a count of refusals).
        match slot::found(word, rule) {
            Found::Ready => {}
            Found::Banned => {
                let end = core::ptr::read_volatile(&(*slot).tat);
                if slot::in_force(end, clock.approx()) || slot::in_force(end, clock.now()) {
                    c.ban_drops += 1;
                    count_slot_ban_drop::<V6>(word, v6_key, clock);
                    return false;
                }
                // The ban is over: a fresh bucket, its full burst.
                let fresh = slot::unbanned(word, rule, clock.now());
                if cas(&raw mut (*slot).key, word, fresh.key) == word {
                    core::ptr::write_volatile(&raw mut (*slot).tat, fresh.tat);
                }
            }
            Found::Counting(n) => {
                if judge(ctx, &raw mut (*slot).tat, rule, clock, len, c) {
                    cas(&raw mut (*slot).key, word, want);
                    return true;
                }
                refused::<V6>(slot, word, n + 1, v6_key, rule, clock, c);
                return false;
            }
            Found::Restamp { carry } => {
                if carry {
                    let old = Slot { key: word, tat: core::ptr::read_volatile(&(*slot).tat) };
                    carry_over(&raw mut (*slot).tat, &old.bucket(0), rule, clock);
                }
                cas(&raw mut (*slot).key, word, want);
            }
        }
        let admit = judge(ctx, &raw mut (*slot).tat, rule, clock, len, c);
        if !admit && rule.flags & RULE_BAN != 0 {
            refused::<V6>(slot, want, 1, v6_key, rule, clock, c);
        }
        admit
    }
}

/// A rule with bans refused the source's `n`-th frame since it was last
/// admitted: the slot (whose word is `word`) counts it, or at the rule's
/// `--ban-after` the ban starts (policer_common::ban).
///
/// # Safety
/// `slot` must point into a live map value.
#[inline(always)]
unsafe fn refused<const V6: bool>(
    slot: *mut Slot,
    word: u64,
    n: u32,
    v6_key: &BucketKeyV6,
    rule: &Rule,
    clock: &mut Clock,
    c: &mut Counters,
) {
    let Some(p) = BAN_PARAMS.get_ptr(rule.counter_slot) else {
        return;
    };
    // SAFETY: the caller's contract; `p` is a live array value.
    unsafe {
        let banned = match slot::refusal(word, n, &*p) {
            Refusal::Ignore => return,
            Refusal::Count(counted) => {
                cas(&raw mut (*slot).key, word, counted);
                return;
            }
            Refusal::Ban(banned) => banned,
        };
        let Some(key) = ban_key::<V6>(clock, word, v6_key) else {
            return;
        };
        let now = clock.now();
        let prev = BANS.get_ptr_mut(&*key);
        let end = match slot::ban_to_start(prev.map(|b| &*b), now, &*p, rule.counter_slot) {
            // Banned already (another CPU started it, or the slot was made
            // after the ban began): the slot caches it.
            None => prev.map_or(now, |b| core::ptr::read_volatile(&(*b).end_ns)),
            Some(start) => {
                let ban = &raw mut (*clock.scratch).ban;
                *ban = start;
                if BANS.insert(&*key, &*ban, 0).is_err() {
                    c.bans_refused_full += 1;
                    return;
                }
                c.bans_started += 1;
                (*ban).end_ns
            }
        };
        // The word first, then the end: a CPU between the two sees a ban
        // until the bucket's old `tat` (units far past any ns): a drop.
        if cas(&raw mut (*slot).key, word, banned) == word {
            core::ptr::write_volatile(&raw mut (*slot).tat, end);
        }
    }
}

/// The store's key of the source (the keyed table's key, or for the IPv4
/// table the mapped form of its key word `word`), written into the CPU's
/// scratch: a pointer to it, for map lookups. None without a scratch.
#[inline(always)]
fn ban_key<const V6: bool>(clock: &Clock, word: u64, v6_key: &BucketKeyV6) -> Option<*mut BucketKeyV6> {
    if clock.scratch.is_null() {
        return None;
    }
    // SAFETY: the scratch is this CPU's live array value.
    unsafe {
        let k = &raw mut (*clock.scratch).ban_key;
        if V6 {
            *k = *v6_key;
        } else {
            // ::ffff:a.b.c.d (policer_common::ban::key_v4), field by field.
            let a = &raw mut (*k).addr as *mut u32;
            a.write(0);
            a.add(1).write(0);
            a.add(2).write(u32::from_ne_bytes([0, 0, 0xff, 0xff]));
            a.add(3).write(word as u32);
            (*k).key_len = ((word >> 32) & 0x3f) as u32 | class::KEY_LEN_V4_MAPPED;
            (*k).class = 0;
        }
        Some(k)
    }
}

/// Whether the source of a table miss is banned (the store's entry for its
/// key has not ended): counted as a ban drop.
#[inline(always)]
fn banned<const V6: bool>(key: u64, v6_key: &BucketKeyV6, clock: &mut Clock, c: &mut Counters) -> bool {
    let Some(k) = ban_key::<V6>(clock, key, v6_key) else {
        return false;
    };
    // SAFETY: `k` is the scratch's key.
    let Some(b) = BANS.get_ptr_mut(unsafe { &*k }) else {
        return false;
    };
    // SAFETY: a live map value; its words change whole.
    let end = unsafe { core::ptr::read_volatile(&(*b).end_ns) };
    if slot::in_force(end, clock.approx()) || slot::in_force(end, clock.now()) {
        c.ban_drops += 1;
        count_ban_drop(b, clock);
        return true;
    }
    false
}

/// Counts a banned source's drop in its ban's entry `b`, sampled as
/// [`count_drop`] samples.
#[inline(always)]
fn count_ban_drop(b: *mut Ban, clock: &mut Clock) {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let shift = unsafe { core::ptr::read_volatile(&DROP_SAMPLE_SHIFT) } & 15;
    if clock.sample(shift) {
        // SAFETY: a live map value; other CPUs add to it atomically too.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*b).drops, 1u64 << shift) };
    }
}

/// [`count_ban_drop`] for a banned slot's drop: its entry looked up only
/// when the drop is sampled.
#[inline(always)]
fn count_slot_ban_drop<const V6: bool>(word: u64, v6_key: &BucketKeyV6, clock: &mut Clock) {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let shift = unsafe { core::ptr::read_volatile(&DROP_SAMPLE_SHIFT) } & 15;
    if !clock.sample(shift) {
        return;
    }
    let Some(k) = ban_key::<V6>(clock, word, v6_key) else {
        return;
    };
    // SAFETY: `k` is the scratch's key.
    if let Some(b) = BANS.get_ptr_mut(unsafe { &*k }) {
        // SAFETY: a live map value; other CPUs add to it atomically too.
        unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(&raw mut (*b).drops, 1u64 << shift) };
    }
}

/// Compare-and-swap of a word other CPUs also change; returns the word
/// found, which equals `old` when the swap happened. (Compare that value,
/// not the intrinsic's flag: see docs/platform.md.)
///
/// # Safety
/// `ptr` must point into a live map value.
#[inline(always)]
unsafe fn cas(ptr: *mut u64, old: u64, new: u64) -> u64 {
    // SAFETY: the caller's contract.
    unsafe { atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(ptr, old, new).0 }
}

/// Carries a bucket read as `old` over to `rule` (its rule changed size
/// or unit): the rescaled `tat` is swapped in unless another CPU charged
/// the bucket meanwhile. The caller then swaps in the new stamp.
///
/// # Safety
/// `tat_ptr` must point into a live map value.
#[inline(always)]
unsafe fn carry_over(tat_ptr: *mut u64, old: &Bucket, rule: &Rule, clock: &mut Clock) {
    // SAFETY: the caller's contract.
    unsafe { cas(tat_ptr, old.tat, rule.rescale(old, clock.now())) };
}

/// Charges a frame to the bucket state at `tat_ptr`; the verdict.
///
/// # Safety
/// `tat_ptr` must point into a live map value.
#[inline(always)]
unsafe fn judge(
    ctx: &XdpContext,
    tat_ptr: *mut u64,
    rule: &Rule,
    clock: &mut Clock,
    len: u32,
    c: &mut Counters,
) -> bool {
    // SAFETY: the caller's contract.
    match unsafe { charge(tat_ptr, rule, clock, len, &mut c.cas_retries) } {
        Charge::Admitted => return true,
        Charge::Refused => return false,
        Charge::Lost => {}
    }
    // Lost every round to other CPUs admitting from this bucket: it is
    // being hammered, so dropping is the conservative answer.
    c.cas_exhausted += 1;
    if c.cas_exhausted.is_power_of_two() {
        warn!(
            ctx,
            "a bucket lost {} compare-and-swap rounds in a row ({} drops so far on this CPU)",
            CAS_ROUNDS,
            c.cas_exhausted
        );
    }
    false
}

/// Takes one new source from the rule's limiter (compare-and-swap).
#[inline(always)]
fn new_source_allowed(rule: &Rule, clock: &mut Clock) -> bool {
    // Sized by the loader to the rule limit: the array's bounds check is
    // the only one needed.
    let Some(ns) = NEW_SOURCES.get_ptr_mut(rule.counter_slot) else {
        return true;
    };
    // SAFETY: a live array value; `tat` is only changed by compare-and-swap.
    unsafe {
        if core::ptr::read_volatile(&(*ns).enabled) == 0 {
            return true;
        }
        let limiter = core::ptr::read_volatile(ns).limiter();
        let mut retries = 0;
        matches!(charge(&raw mut (*ns).tat, &limiter, clock, 0, &mut retries), Charge::Admitted)
    }
}

/// The outcome of charging a bucket under compare-and-swap.
enum Charge {
    Admitted,
    /// The bucket has no room: the frame is over its rate.
    Refused,
    /// Every round was lost to other CPUs charging the same bucket.
    Lost,
}

/// Charges one frame to the bucket state at `tat_ptr` with `rule`'s
/// arithmetic: the one compare-and-swap loop of the program, so two CPUs
/// can never spend the same budget. Counts lost rounds in `retries`.
/// A frame the bucket refuses whatever the exact time is refused without
/// reading the clock; everything else reads it.
///
/// # Safety
/// `tat_ptr` must point into a live map value.
#[inline(always)]
unsafe fn charge(tat_ptr: *mut u64, rule: &Rule, clock: &mut Clock, len: u32, retries: &mut u64) -> Charge {
    // SAFETY: the caller's contract; other CPUs only change it by CAS.
    let mut old = unsafe { core::ptr::read_volatile(tat_ptr) };
    if clock.refuses(rule, old, len) {
        return Charge::Refused;
    }
    let now = clock.now();
    for _ in 0..CAS_ROUNDS {
        let Some(new) = rule.admit(old, now, len) else {
            return Charge::Refused;
        };
        // SAFETY: as above.
        let seen = unsafe { cas(tat_ptr, old, new) };
        if seen == old {
            return Charge::Admitted;
        }
        *retries += 1;
        old = seen;
    }
    Charge::Lost
}

/// Counts a drop on its source, sampled (DROP_SAMPLE_SHIFT): atomic adds,
/// because other CPUs may count drops on the same source.
#[inline(always)]
fn count_drop(at: &DropAt, clock: &mut Clock) {
    let DropAt::Slot(v6, set, way) = *at else {
        return;
    };
    // SAFETY: a read of a plain static the loader may rewrite before load.
    let shift = unsafe { core::ptr::read_volatile(&DROP_SAMPLE_SHIFT) } & 15;
    if !clock.sample(shift) {
        return;
    }
    let d = if v6 { BUCKETS_V6_DROP.get_ptr_mut(set) } else { BUCKETS_V4_DROP.get_ptr_mut(set) };
    if let Some(d) = d {
        // SAFETY: live map value; `way` < WAYS.
        unsafe {
            atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(
                (&raw mut (*d).ways as *mut u64).add(way % WAYS),
                1u64 << shift,
            );
        }
    }
}

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
fn try_policer(ctx: &XdpContext) -> u32 {
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
            let rule = lookup_rule::<false>(|| RULES_V4.get(&Key::new(32, src)))
                .map(|r| resolve_class::<false>(ctx, r, l4, c));
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
            let rule =
                lookup_rule::<true>(|| RULES_V6.get(&Key::new(128, src))).map(|r| resolve_class::<true>(ctx, r, l4, c));
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
                    count_drop(&j.drop_at, &mut clock);
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

/// With a capture running: a frame whose verdict some capture wants goes
/// to the capture program by a tail call, which does not come back (that
/// program ends with this verdict's action). When the call fails (the
/// array empty: the daemon that filled it is gone) this returns and the
/// caller returns the verdict itself.
#[inline(always)]
fn hand_to_capture(ctx: &XdpContext, on: u64, verdict: u32, slot: u32) {
    if !capture::wanted(on, verdict) {
        return;
    }
    // The first sampling step: a frame no lane could sample costs one
    // random number (this CPU's xorshift: no helper call), not the tail
    // call.
    if capture::least_sample(on) > 1 {
        let random = match CPU_SCRATCH.get_ptr_mut(0) {
            // SAFETY: this CPU's slot; only this CPU touches it while we run.
            Some(s) => unsafe { (*s).next_random() },
            None => 0,
        };
        if !capture::presampled(on, (random >> 32) as u32) {
            return;
        }
    }
    let Some(sc) = CAPTURE_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: this CPU's slot: an XDP program and the program it tail-calls
    // run on one CPU without preemption, so nobody else touches it between.
    unsafe {
        (*sc).verdict = verdict;
        (*sc).slot = slot;
        CAPTURE_PROG.tail_call(ctx, 0);
    }
}

/// The capture program: the lanes for the frame the policer's verdict
/// handed over (verdict and slot in the CPU's scratch), then that
/// verdict's action. Never attached: reached only by the tail call.
#[xdp]
pub fn policer_capture(ctx: XdpContext) -> u32 {
    let Some(sc) = CAPTURE_SCRATCH.get_ptr_mut(0) else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: this CPU's slot, written by the policer's program just
    // before the tail call (see `hand_to_capture`).
    let (verdict, slot) = unsafe { (core::ptr::read_volatile(&(*sc).verdict), core::ptr::read_volatile(&(*sc).slot)) };
    // SAFETY: as in `verdict`.
    let on = unsafe { core::ptr::read_volatile(&raw const CAPTURE_ON) };
    let lanes = on as u32 & capture::ON_LANES;
    if lanes != 0 {
        let len = (ctx.data_end() - ctx.data()) as u32;
        capture(&ctx, sc, lanes, capture::least_sample(on), verdict, slot, len);
    }
    if verdict == capture::CAPTURE_DROPPED { xdp_action::XDP_DROP } else { xdp_action::XDP_PASS }
}

/// The program's clock (the test clock under tests), for captured frames.
#[inline(always)]
fn capture_now() -> u64 {
    // SAFETY: a read of a plain static the loader may rewrite before load.
    if unsafe { core::ptr::read_volatile(&TEST_CLOCK) } != 0 {
        CLOCK.get(0).copied().unwrap_or(0)
    } else {
        // SAFETY: BPF helper with no preconditions.
        unsafe { bpf_ktime_get_ns() }
    }
}

/// The frame's source, read again from the frame (only for a lane with a
/// source filter) into `addr` (IPv4 in the first 4 bytes): its family, 0
/// when not IP.
#[inline(always)]
fn capture_source(ctx: &XdpContext, addr: *mut [u8; 16]) -> u32 {
    let Some(eth) = ptr_at::<EthHdr>(ctx, 0) else {
        return 0;
    };
    // SAFETY: bounds checked by ptr_at.
    let mut proto = u16::from_be(unsafe { (*eth).ether_type });
    let mut off = EthHdr::LEN;
    for _ in 0..MAX_VLAN_TAGS {
        if proto != ETH_P_8021Q && proto != ETH_P_8021AD {
            break;
        }
        let Some(inner) = ptr_at::<[u8; 2]>(ctx, off + VLAN_HLEN - 2) else {
            return 0;
        };
        // SAFETY: bounds checked by ptr_at.
        proto = u16::from_be_bytes(unsafe { *inner });
        off += VLAN_HLEN;
    }
    // SAFETY (the copies): bounds checked by ptr_at; `addr` is the
    // scratch's, 16 bytes.
    if proto == ETH_P_IP {
        if let Some(a) = ptr_at::<u32>(ctx, off + 12) {
            unsafe {
                let w = addr as *mut u32;
                w.write_unaligned(core::ptr::read_unaligned(a));
                w.add(1).write_unaligned(0);
                w.add(2).write_unaligned(0);
                w.add(3).write_unaligned(0);
            }
            return policer_common::FAMILY_V4;
        }
    } else if proto == ETH_P_IPV6
        && let Some(a) = ptr_at::<[u32; 4]>(ctx, off + 8)
    {
        unsafe {
            let w = addr as *mut u32;
            let a = a as *const u32;
            for k in 0..4 {
                w.add(k).write_unaligned(core::ptr::read_unaligned(a.add(k)));
            }
        }
        return policer_common::FAMILY_V6;
    }
    0
}

/// Hands a judged frame to the captures that take it (policer_common::
/// capture: filter, sampling, the rate bound under compare-and-swap), as
/// one ring record carrying the mask of those lanes.
#[inline(always)]
fn capture(ctx: &XdpContext, sc: *mut CaptureScratch, on: u32, least: u32, verdict: u32, slot: u32, len: u32) {
    // SAFETY: this CPU's slot; only this CPU touches it while we run.
    unsafe {
        (*sc).now_ns = 0;
        (*sc).have_src = 0;
        (*sc).took = 0;
    }
    let rule_lanes = match CAPTURE_RULES.get_ptr(slot) {
        // SAFETY: a live map value.
        Some(r) => unsafe { core::ptr::read_volatile(r) },
        None => 0,
    };
    // The lanes' random number: the kernel's, a stream apart from the
    // xorshift the first sampling step drew from.
    // SAFETY: BPF helper with no preconditions.
    let random = unsafe { (u64::from(bpf_get_prandom_u32()) << 32) | u64::from(bpf_get_prandom_u32()) };
    for i in 0..MAX_CAPTURES as u32 {
        if on & (1 << i) != 0 {
            capture_lane(ctx, sc, i, least, verdict, rule_lanes, random);
        }
    }
    // SAFETY: as above.
    let took = unsafe { core::ptr::read_volatile(&(*sc).took) };
    if took == 0 {
        return;
    }
    let Some(mut entry) = CAPTURE_RING.reserve::<CaptureRecord>(0) else {
        count_lanes(took, |cc| cc.ring_full += 1);
        return;
    };
    let caplen = if len as usize > SNAP_BYTES { SNAP_BYTES as u32 } else { len };
    let rec = entry.as_mut_ptr();
    // SAFETY: the reservation is ours until submitted; the frame's bytes go
    // straight into it (the helper checks the offset and length against
    // the frame, the verifier the length against the buffer).
    let copied = unsafe {
        // Field by field, straight into the ring: no copy on the stack.
        let h = &raw mut (*rec).header;
        (*h).time_ns = core::ptr::read_volatile(&(*sc).now_ns);
        (*h).len = len;
        (*h).caplen = caplen;
        (*h).ifindex = (*ctx.ctx).ingress_ifindex;
        (*h).rule_slot = slot;
        (*h).verdict = verdict;
        (*h).lanes = took;
        // Read back and bounded as the verifier tracks it (an AND, then
        // +1: 1 ..= SNAP_BYTES), whatever the compiler kept of the min.
        let n = core::ptr::read_volatile(&raw const (*rec).header.caplen);
        n != 0
            && bpf_xdp_load_bytes(
                ctx.ctx,
                0,
                (&raw mut (*rec).data) as *mut core::ffi::c_void,
                ((n - 1) & (SNAP_BYTES as u32 - 1)) + 1,
            ) == 0
    };
    if !copied {
        entry.discard(0);
        return;
    }
    entry.submit(0);
    count_lanes(took, |cc| cc.captured += 1);
}

/// Whether lane `i` takes the frame: its filter, its source prefix, its
/// sampling, then its rate bound (compare-and-swap); a taken frame sets
/// the lane's bit in the scratch's `took`.
#[inline(always)]
fn capture_lane(
    ctx: &XdpContext,
    sc: *mut CaptureScratch,
    i: u32,
    least: u32,
    verdict: u32,
    rule_lanes: u32,
    random: u64,
) {
    let Some(lane) = CAPTURE_LANES.get_ptr_mut(i) else {
        return;
    };
    // SAFETY: a live map value; only `tat_ns` changes while a lane is in
    // use, and only by compare-and-swap.
    let l = unsafe { &*lane };
    if !capture::filter_takes(l, i, verdict, rule_lanes) {
        return;
    }
    // SAFETY (the scratch): this CPU's slot, as in `capture`.
    if l.src_family != 0 {
        unsafe {
            if core::ptr::read_volatile(&(*sc).have_src) == 0 {
                (*sc).family = capture_source(ctx, &raw mut (*sc).src);
                (*sc).have_src = 1;
            }
            let family = core::ptr::read_volatile(&(*sc).family);
            if !capture::source_matches(l, family, &(*sc).src) {
                return;
            }
        }
    }
    if !capture::sampled(l.sample_every, least, random, i) {
        return;
    }
    let Some(cc) = CAPTURE_COUNTERS.get_ptr_mut(i) else {
        return;
    };
    // SAFETY: per-CPU slot, only this CPU writes it while we run.
    let cc = unsafe { &mut *cc };
    cc.matched += 1;
    // SAFETY: the scratch, as above.
    let now = unsafe {
        let mut now = core::ptr::read_volatile(&(*sc).now_ns);
        if now == 0 {
            now = capture_now();
            (*sc).now_ns = now;
        }
        now
    };
    // SAFETY: a live map value, changed by other CPUs only by CAS.
    let tat_ptr = unsafe { &raw mut (*lane).tat_ns };
    // SAFETY: as above.
    let mut old = unsafe { core::ptr::read_volatile(tat_ptr) };
    for _ in 0..CAS_ROUNDS {
        let Some(new) = capture::admit(old, now, l.interval_ns, l.tolerance_ns) else {
            break;
        };
        // SAFETY: as above.
        let seen = unsafe { cas(tat_ptr, old, new) };
        if seen == old {
            // SAFETY: the scratch, as above.
            unsafe { (*sc).took |= 1 << i };
            return;
        }
        old = seen;
    }
    // Over the bound, or every round lost to CPUs that took it.
    cc.rate_bounded += 1;
}

/// Applies `f` to the counters of each lane in `lanes`.
#[inline(always)]
fn count_lanes(lanes: u32, f: impl Fn(&mut CaptureCounters)) {
    for i in 0..MAX_CAPTURES as u32 {
        if lanes & (1 << i) != 0
            && let Some(cc) = CAPTURE_COUNTERS.get_ptr_mut(i)
        {
            // SAFETY: per-CPU slot, only this CPU writes it while we run.
            f(unsafe { &mut *cc });
        }
    }
}

#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
