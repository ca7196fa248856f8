//! Map names, keys and values the XDP program and user space share.
//!
//! The eBPF statics carry exactly these names (a test loads the object and
//! checks each one exists).

use crate::bucket::Bucket;

/// LPM trie: IPv4 prefix -> [`crate::Rule`].
pub const MAP_RULES_V4: &str = "RULES_V4";
/// LPM trie: IPv6 prefix -> [`crate::Rule`].
pub const MAP_RULES_V6: &str = "RULES_V6";
/// LRU hash: [`BucketKey`] -> [`Bucket`].
pub const MAP_BUCKETS: &str = "BUCKETS";
/// Per-CPU array of [`Counters`], one slot per interface
/// (`ifindex % MAX_IFACE_SLOTS`).
pub const MAP_COUNTERS: &str = "COUNTERS";
/// Per-CPU array of [`RuleCounters`], one slot per rule (`Rule::counter_slot`).
pub const MAP_RULE_COUNTERS: &str = "RULE_COUNTERS";
/// Per-CPU array of one `u64`: sequence for the bench-only key variation.
pub const MAP_BENCH_SEQ: &str = "BENCH_SEQ";
/// Array of one `u64`: the clock in ns when the test clock is on.
pub const MAP_CLOCK: &str = "CLOCK";
/// Read-only global (`u32`): non-zero makes the program read its clock
/// from [`MAP_CLOCK`] instead of `bpf_ktime_get_ns`. Set at load time, so
/// the verifier removes the branch in production.
pub const GLOBAL_TEST_CLOCK: &str = "TEST_CLOCK";
/// Read-only global (`u32`): non-zero makes the program ignore the real
/// source and police synthetic sources 0..N in turn (benchmarks only, to
/// touch N buckets with one test frame). Zero in production: the verifier
/// removes the branch.
pub const GLOBAL_BENCH_SOURCES: &str = "BENCH_SOURCES";
/// Slots in [`MAP_COUNTERS`]: interfaces are counted at `ifindex % 1024`.
pub const MAX_IFACE_SLOTS: u32 = 1024;
/// Slots in [`MAP_RULE_COUNTERS`]; rules past this share slot 0.
pub const MAX_RULE_SLOTS: u32 = 4096;
/// The XDP program's name in the object.
pub const PROGRAM_NAME: &str = "policer";

/// Capacity of the rule tries.
pub const MAX_RULES: u32 = 131_072;
/// Default capacity of the bucket table (sources tracked at once).
pub const DEFAULT_MAX_SOURCES: u32 = 1_048_576;

pub const FAMILY_V4: u32 = 4;
pub const FAMILY_V6: u32 = 6;

/// Key of the bucket map: the source address masked to the rule's key
/// length. The key length is part of the key so two rules that group
/// sources differently never share a bucket.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct BucketKey {
    /// Masked source, network order; IPv4 uses the first 4 bytes.
    pub addr: [u8; 16],
    /// [`FAMILY_V4`] or [`FAMILY_V6`].
    pub family: u32,
    /// Leading bits of `addr` that are significant.
    pub key_len: u32,
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
}

impl Counters {
    /// Adds another CPU's counters.
    pub fn add(&mut self, o: &Counters) {
        self.passed_pkts += o.passed_pkts;
        self.passed_bytes += o.passed_bytes;
        self.dropped_pkts += o.dropped_pkts;
        self.dropped_bytes += o.dropped_bytes;
        self.would_drop_pkts += o.would_drop_pkts;
        self.would_drop_bytes += o.would_drop_bytes;
        self.unmatched_pkts += o.unmatched_pkts;
        self.non_ip_pkts += o.non_ip_pkts;
        self.malformed_pkts += o.malformed_pkts;
        self.fragment_pkts += o.fragment_pkts;
        self.buckets_created += o.buckets_created;
        self.bucket_insert_failed += o.bucket_insert_failed;
        self.cas_retries += o.cas_retries;
        self.cas_exhausted += o.cas_exhausted;
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
}

impl RuleCounters {
    pub fn add(&mut self, o: &RuleCounters) {
        self.passed_pkts += o.passed_pkts;
        self.passed_bytes += o.passed_bytes;
        self.dropped_pkts += o.dropped_pkts;
        self.dropped_bytes += o.dropped_bytes;
        self.would_drop_pkts += o.would_drop_pkts;
        self.would_drop_bytes += o.would_drop_bytes;
        self.buckets_created += o.buckets_created;
    }
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

#[cfg(feature = "user")]
mod pod {
    // SAFETY: plain `#[repr(C)]` integers and byte arrays with no padding
    // (fields are ordered largest first), so every bit pattern is valid.
    unsafe impl aya::Pod for super::BucketKey {}
    unsafe impl aya::Pod for super::Counters {}
    unsafe impl aya::Pod for super::RuleCounters {}
    unsafe impl aya::Pod for crate::bucket::Bucket {}
    unsafe impl aya::Pod for crate::bucket::Rule {}
}

const _: () = {
    // No implicit padding: the sizes are the sums of the fields.
    assert!(core::mem::size_of::<BucketKey>() == 24);
    assert!(core::mem::size_of::<Bucket>() == 32);
    assert!(core::mem::size_of::<crate::bucket::Rule>() == 64);
    assert!(core::mem::size_of::<Counters>() == 14 * 8);
    assert!(core::mem::size_of::<RuleCounters>() == 7 * 8);
};
