//! SYN cookies in XDP (issue 45, docs/syn-cookies.md): what the program
//! decides and builds for a TCP rule with `--syn-cookies`, as pure
//! functions of bytes the program copied out of the frame, so that they
//! are tested on the host.
//!
//! - [`parse_syn`]: what a SYN asked for (window scale, SACK, timestamps,
//!   ECN), read from its TCP header;
//! - [`cookie_tsval`]: the timestamp the SYN-ACK carries, whose low six
//!   bits tell the kernel those options when the cookie comes back (as the
//!   kernel's own cookies do: `cookie_init_timestamp`,
//!   `cookie_timestamp_decode`);
//! - [`build_synack`]: the SYN-ACK's IP and TCP headers with their
//!   checksums, IPv4 or IPv6;
//! - [`cap_admit`], [`cap_slot`]: the reflection cap's bucket (SYN-ACKs
//!   toward one /24 or /48) and where a network's is.
//!
//! The kernel makes and checks the cookie itself (`bpf_tcp_gen_syncookie`,
//! `bpf_tcp_check_syncookie`); nothing here knows its secret.

/// `Rule::flags`: the rule answers SYNs with cookies (its mode and cap in
/// `SYN_CONF` at its counter slot).
pub const RULE_SYN: u32 = 16;

/// [`SynConf::mode`]: cookies for every SYN of an unverified source.
pub const SYN_ALWAYS: u32 = 1;
/// [`SynConf::mode`]: cookies only while the rule's SYNs from unverified
/// sources exceed its SYN budget (`--total-rate`, a bucket of its own:
/// the SYNs within it go to the kernel, not charged to the rule's total).
pub const SYN_FLOOD: u32 = 2;

/// The program's answer for a frame the SYN path hands back to policing
/// (not an XDP action: those are 0..=4).
pub const SYN_POLICE: u32 = 0x5359_4e00;
/// What the policer's code returns for a frame of a SYN-cookie rule that
/// the SYN path must see first (the frame is not counted yet): this bit
/// and the rule's counter slot.
pub const SYN_PATH: u32 = 1 << 31;
/// The program the attached one tail-calls to police a frame the SYN path
/// handed back: the same code without the SYN path.
pub const SYN_POLICE_PROGRAM: &str = "policer_syn_police";

/// Map names (not shared with an adopted program: a new program starts
/// with no verified sources and its own counters).
pub const MAP_SYN_CONF: &str = "SYN_CONF";
pub const MAP_SYN_TOTALS: &str = "SYN_TOTALS";
pub const MAP_SYN_COUNTERS: &str = "SYN_COUNTERS";
pub const MAP_SYN_VERIFIED: &str = "SYN_VERIFIED";
pub const MAP_SYN_CAP: &str = "SYN_CAP";
/// `ProgramArray`, one entry: [`SYN_POLICE_PROGRAM`] (the policing of a
/// frame the SYN path hands back is a tail call to it).
pub const MAP_SYN_PROG: &str = "SYN_PROG";
/// Array of one `u64`: the monotonic time (ns) until which every SYN
/// answered finds its listener by the SYN's own tuple ([`EXACT_NS`]).
pub const MAP_SYN_EXACT: &str = "SYN_EXACT";
/// How long after SYN cookies' settings are written (a start, a rule
/// given `--syn-cookies`) the SYN path looks its listener up by the SYN's
/// own tuple, which finds a connection or a TIME_WAIT of that tuple
/// first (the kernel's to answer), at the cost of a miss in the kernel's
/// table of connections for every forged source. After it, a SYN of a
/// source the verified-sources filter has never seen finds the listener
/// by its address and port alone: every source that had a connection
/// since has been verified (an ACK of a connection the kernel holds
/// verifies it), and a TIME_WAIT outlives no connection by more than
/// 60 s (docs/syn-cookies.md, "The listener's lookup").
pub const EXACT_NS: u64 = 120_000_000_000;

/// Sources that proved their address (LRU: the least recently seen go).
pub const MAX_VERIFIED: u32 = 262_144;
/// Slots of the reflection cap (`SYN_CAP`, the program's own array of
/// GCRA states, 512 KiB: small enough to stay in a core's caches under a
/// flood): each network (/24, /48) charges the slot its number hashes to
/// ([`cap_slot`]). Networks that share a slot share its budget, so no
/// network ever gets more than the cap; a flood from every /24 of the
/// IPv4 space puts 256 networks on a slot, and a flood of 10 M SYNs a
/// second charges each slot 153 a second against the default cap's 1000.
/// (Until 2026-11-30 an LRU hash of 65 536 networks: a bucket array and an
/// element to walk for every SYN, a quarter of the SYN path's cost, and a
/// flood from more networks than it held evicted a real one's state,
/// whose next SYN-ACK then went as a new network's first.)
pub const CAP_SLOTS: u32 = 1 << 16;
/// The filter in front of the verified sources (`SYN_SEEN`, the program's
/// own array): one bit per hashed source, 2^20 bits in 16 384 words
/// (128 KiB), set by the program when a source is verified. A clear bit
/// is a source never verified: its SYN skips the lookup of
/// `SYN_VERIFIED`, which for a forged source is a miss in a 4 MiB bucket
/// array (the largest single cost of answering a flood's SYN: docs/syn-
/// cookies.md). A set bit is only a maybe: the exact set decides. Bits of
/// sources the LRU set has let go stay set until the daemon rebuilds the
/// filter from the exact set ([`seen_is_stale`]); a new program starts it
/// empty, with an empty verified set.
pub const SEEN_WORDS: u32 = 16_384;

/// Set bits of the filter past which the daemon rebuilds it from
/// `SYN_VERIFIED`: that set holds at most [`MAX_VERIFIED`] sources, so at
/// most that many bits are live, and past this bound at least an eighth
/// of the filter's bits belong to sources the set let go. Rebuilt, the
/// filter is at most a quarter full (262 144 of 1 048 576 bits), and it
/// is rebuilt again before it is three eighths full: at least five in
/// eight forged SYNs skip the exact set's lookup, however long the
/// program runs.
pub const SEEN_REBUILD_BITS: u64 = MAX_VERIFIED as u64 + SEEN_WORDS as u64 * 64 / 8;

/// Whether a filter with `set_bits` bits set is due for a rebuild.
pub fn seen_is_stale(set_bits: u64) -> bool {
    set_bits > SEEN_REBUILD_BITS
}

/// Sets `src`'s bit in `words` (a filter of [`SEEN_WORDS`] words, as the
/// program's [`seen_bit`] does): the daemon's rebuild.
pub fn mark_seen(words: &mut [u64], src: &[u8; 16]) {
    let (w, bit) = seen_bit(src);
    if let Some(v) = words.get_mut(w as usize) {
        *v |= bit;
    }
}
pub const MAP_SYN_SEEN: &str = "SYN_SEEN";

/// The word and the bit of `src` (an IPv4 source as `::ffff:a.b.c.d`) in
/// the verified-sources filter: its four 32-bit words folded, then mixed
/// by murmur3's finalizer, so that neighbouring addresses spread over the
/// whole filter.
pub fn seen_bit(src: &[u8; 16]) -> (u32, u64) {
    let w = |i: usize| u32::from_le_bytes([src[i], src[i + 1], src[i + 2], src[i + 3]]);
    let mut h = w(0) ^ w(4).rotate_left(8) ^ w(8).rotate_left(16) ^ w(12);
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    let bit = h & (SEEN_WORDS * 64 - 1);
    (bit / 64, 1u64 << (bit % 64))
}

/// The reflection cap's default: SYN-ACKs per second toward one /24 or /48.
pub const DEFAULT_SYN_ACK_RATE_PPS: u64 = 1000;

/// TCP option kinds.
const OPT_EOL: u8 = 0;
const OPT_NOP: u8 = 1;
const OPT_MSS: u8 = 2;
const OPT_WSCALE: u8 = 3;
const OPT_SACK_PERM: u8 = 4;
const OPT_TS: u8 = 8;

/// Low bits of the cookie timestamp (the kernel's `TSBITS`,
/// `TS_OPT_WSCALE_MASK`, `TS_OPT_SACK`, `TS_OPT_ECN`).
pub const TS_BITS: u32 = 6;
pub const TS_OPT_WSCALE_MASK: u32 = 0xf;
pub const TS_OPT_SACK: u32 = 1 << 4;
pub const TS_OPT_ECN: u32 = 1 << 5;

/// Per rule slot: how its SYNs are answered.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynConf {
    /// Reflection cap: ns between SYN-ACKs toward one network, and the
    /// burst's tolerance (`(burst - 1) * interval`).
    pub cap_interval_ns: u64,
    pub cap_tolerance_ns: u64,
    /// [`SYN_ALWAYS`] or [`SYN_FLOOD`]; 0: off.
    pub mode: u32,
    /// The window scale the SYN-ACK offers: the one the kernel will use
    /// for the connection it makes from the cookie (its
    /// `tcp_select_initial_window` from `tcp_rmem`/`rmem_max`).
    pub wscale: u32,
    /// The MSS the SYN-ACK offers, per family (the interface's MTU).
    pub mss_v4: u32,
    pub mss_v6: u32,
}

impl SynConf {
    /// A cap of `rate_pps` SYN-ACKs a second with a burst of `burst`.
    pub fn with_cap(mut self, rate_pps: u64, burst: u64) -> SynConf {
        let rate = if rate_pps == 0 { 1 } else { rate_pps };
        self.cap_interval_ns = 1_000_000_000 / rate;
        self.cap_tolerance_ns = self.cap_interval_ns.saturating_mul(burst.saturating_sub(1));
        self
    }
}

/// Per rule slot, per CPU: what the SYN path did (summed over CPUs, the
/// counters `stats --json` shows).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(serde::Serialize, serde::Deserialize))]
// A daemon of an older build answers without the newer counters: zero.
#[cfg_attr(feature = "user", serde(default))]
pub struct SynCounters {
    /// SYNs of unverified sources the SYN path saw (a SYN-ACK answers at
    /// most each).
    pub syns: u64,
    /// SYNs answered with a cookie (SYN-ACKs sent).
    pub cookies_sent: u64,
    /// ACKs whose cookie the kernel accepted.
    pub acks_accepted: u64,
    /// ACKs to a listener from unverified sources whose cookie it refused
    /// (dropped).
    pub acks_refused: u64,
    /// Sources marked verified (a cookie, or a connection the kernel
    /// holds).
    pub sources_verified: u64,
    /// SYN-ACKs held back by the reflection cap (the SYN dropped).
    pub synacks_capped: u64,
    /// SYNs for a port with no listener (policed as without cookies).
    pub no_listener: u64,
    /// SYNs the kernel would not make a cookie for (policed; e.g.
    /// `net.ipv4.tcp_syncookies` is not 2 and the queue is not full).
    pub no_cookie: u64,
    /// `flood`: SYNs within the rule's SYN budget, passed to the kernel
    /// (no bucket made, not charged to the rule's total).
    pub syns_passed: u64,
}

impl SynCounters {
    /// Sums two CPUs' (or two reads') counters.
    pub fn add(&mut self, o: &SynCounters) {
        self.syns += o.syns;
        self.cookies_sent += o.cookies_sent;
        self.acks_accepted += o.acks_accepted;
        self.acks_refused += o.acks_refused;
        self.sources_verified += o.sources_verified;
        self.synacks_capped += o.synacks_capped;
        self.no_listener += o.no_listener;
        self.no_cookie += o.no_cookie;
        self.syns_passed += o.syns_passed;
    }
}

/// Bytes of a TCP header the program copies (the most a header can be).
pub const TCP_MAX: usize = 60;
/// Bytes of the IP header the program copies (IPv4's fixed part, or
/// IPv6's).
pub const IP_MAX: usize = 40;

/// This CPU's work area of the SYN path (not shared): the frame's
/// headers copied out, the SYN-ACK's built, the socket tuple, and what
/// the policer's code handed over.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SynScratch {
    /// The rule's counter slot, the IP and TCP headers' offsets, IPv6.
    pub slot: u32,
    pub _pad0: u32,
    pub ip_off: u32,
    pub l4_off: u32,
    pub v6: u32,
    pub _pad: u32,
    /// The frame's IP header at [`ip_at`] (IPv4: its first 20 bytes) and
    /// its TCP header right after: as in the frame, so one copy takes
    /// both, and the socket tuple (addresses, then ports) is read where
    /// they are ([`TUPLE_AT_V4`], [`TUPLE_AT_V6`]).
    pub ip: [u8; IP_MAX],
    pub tcp: [u8; 64],
    /// The SYN-ACK's IP header (at [`ip_at`]) and TCP header: one store.
    pub ip_out: [u8; IP_MAX],
    pub tcp_out: [u8; 64],
}

/// Where a family's IP header sits in [`SynScratch::ip`] and `ip_out` (and
/// in [`build_synack`]'s buffers): at their end, right before the TCP
/// header that follows them (IPv6's at 0, IPv4's 20 bytes at 20).
#[inline(always)]
pub const fn ip_at(v6: bool) -> usize {
    if v6 { 0 } else { IP_MAX - 20 }
}

/// Where `struct bpf_sock_tuple` (source and destination addresses, then
/// ports: 12 bytes for IPv4, 36 for IPv6) starts in [`SynScratch::ip`]
/// followed by the TCP header: the IP header's addresses and the TCP
/// header's ports are that, back to back.
pub const TUPLE_AT_V4: usize = IP_MAX - 20 + 12;
pub const TUPLE_AT_V6: usize = 8;

// The copies and the store take the IP and TCP headers as one run of
// bytes: each pair of arrays must be adjacent.
const _: () = assert!(core::mem::offset_of!(SynScratch, tcp) == core::mem::offset_of!(SynScratch, ip) + IP_MAX);
const _: () = assert!(core::mem::offset_of!(SynScratch, tcp_out) == core::mem::offset_of!(SynScratch, ip_out) + IP_MAX);

/// What a SYN asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynOpts {
    /// Its window scale option (`None`: not sent).
    pub wscale: Option<u8>,
    pub sack: bool,
    /// Its timestamp value (`None`: no timestamp option).
    pub tsval: Option<u32>,
    /// ECE and CWR both set: it asks for ECN.
    pub ecn: bool,
}

#[inline(always)]
fn be32(b: &[u8; 64], i: usize) -> u32 {
    let g = |k: usize| b.get(k).copied().unwrap_or(0) as u32;
    g(i) << 24 | g(i + 1) << 16 | g(i + 2) << 8 | g(i + 3)
}

/// Reads a SYN's options from its TCP header (`tcp[..len]`, `len` its data
/// offset in bytes). A malformed option ends the walk with what was read.
pub fn parse_syn(tcp: &[u8; 64], len: usize) -> SynOpts {
    parse_syn_with(tcp, len, |i| i)
}

/// [`parse_syn`], with what each step carries (the offset, and what was
/// found so far packed in one word) passed through `opaque` (the
/// identity): the program hides them from the verifier, which then walks
/// the loop once per step, not once per combination of offsets and
/// options found.
#[inline(always)]
pub fn parse_syn_with(tcp: &[u8; 64], len: usize, opaque: impl Fn(u64) -> u64) -> SynOpts {
    // Found so far: bits 0..8 the window scale, 8 it was sent, 9 SACK,
    // 10 a timestamp, 32..64 its value.
    const WS: u64 = 1 << 8;
    const SACK: u64 = 1 << 9;
    const TS: u64 = 1 << 10;
    let end = if len > TCP_MAX { TCP_MAX } else { len };
    let mut i = 20;
    let mut found = 0u64;
    // Every option takes a byte at least: 40 steps walk any header.
    for _ in 0..40 {
        i = opaque(i as u64) as usize;
        found = opaque(found);
        if i >= end {
            break;
        }
        let kind = tcp.get(i & 63).copied().unwrap_or(OPT_EOL);
        if kind == OPT_EOL {
            break;
        }
        if kind == OPT_NOP {
            i += 1;
            continue;
        }
        let olen = tcp.get((i + 1) & 63).copied().unwrap_or(0) as usize;
        if olen < 2 || i + olen > end {
            break;
        }
        if kind == OPT_WSCALE && olen == 3 {
            let s = tcp.get((i + 2) & 63).copied().unwrap_or(0);
            // RFC 7323: a shift over 14 is taken as 14.
            found = (found & !0xff) | WS | if s > 14 { 14 } else { s as u64 };
        } else if kind == OPT_SACK_PERM && olen == 2 {
            found |= SACK;
        } else if kind == OPT_TS && olen == 10 {
            found = (found & 0xffff_ffff) | TS | (be32(tcp, (i + 2) & 63) as u64) << 32;
        }
        i += olen;
    }
    SynOpts {
        wscale: if found & WS != 0 { Some(found as u8) } else { None },
        sack: found & SACK != 0,
        tsval: if found & TS != 0 { Some((found >> 32) as u32) } else { None },
        ecn: tcp[13] & 0xc0 == 0xc0,
    }
}

/// The SYN-ACK's timestamp at `now_ms` (the kernel's TCP clock, ms):
/// the time with its low [`TS_BITS`] bits replaced by the options the
/// cookie stands for, never after `now_ms` (the kernel's own later
/// timestamps must not look older to the client).
pub fn cookie_tsval(now_ms: u32, o: &SynOpts) -> u32 {
    let mut bits = match o.wscale {
        Some(s) => s as u32 & TS_OPT_WSCALE_MASK,
        None => TS_OPT_WSCALE_MASK,
    };
    if o.sack {
        bits |= TS_OPT_SACK;
    }
    if o.ecn {
        bits |= TS_OPT_ECN;
    }
    let ts = (now_ms & !((1 << TS_BITS) - 1)) | bits;
    if ts > now_ms { ts.wrapping_sub(1 << TS_BITS) } else { ts }
}

/// The one's-complement sum of `b[..len]` (as big-endian words, a last odd
/// byte padded with zero) added to `sum`, not folded.
#[inline(always)]
fn sum_words(b: &[u8], len: usize, mut sum: u32) -> u32 {
    let mut i = 0;
    while i + 1 < len && i + 1 < b.len() {
        sum += (b[i] as u32) << 8 | b[i + 1] as u32;
        i += 2;
    }
    if i < len && i < b.len() {
        sum += (b[i] as u32) << 8;
    }
    sum
}

#[inline(always)]
fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// What the SYN-ACK carries that the frame does not tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynAckParams {
    /// The kernel's cookie (the SYN-ACK's sequence number).
    pub cookie: u32,
    /// The MSS offered.
    pub mss: u16,
    /// The window scale offered (when the client sent one and timestamps).
    pub wscale: u8,
    /// The kernel's TCP clock, ms.
    pub now_ms: u32,
}

/// Builds the SYN-ACK answering the SYN whose IP header is in `ip` at
/// [`ip_at`] (IPv4: its first 20 bytes; IPv6: 40), TCP header `tcp` and
/// options `o`
/// ([`parse_syn`]): its IP
/// header into `ip_out` at [`ip_at`] and TCP header into `tcp_out` (its
/// first n bytes), checksums filled; the rest of each is left as it was.
/// Returns the TCP header's length n. Options as the kernel's cookie SYN-ACK
/// has them: MSS; with the client's timestamps also the timestamp (its low
/// bits the cookie's options, [`cookie_tsval`]), SACK-permitted and window
/// scale when the client sent them; without timestamps none but MSS (the
/// cookie could not carry them).
#[inline(always)]
pub fn build_synack(
    ip: &[u8; IP_MAX],
    tcp: &[u8; 64],
    o: &SynOpts,
    v6: bool,
    p: &SynAckParams,
    ip_out: &mut [u8; IP_MAX],
    tcp_out: &mut [u8; 64],
) -> usize {
    let ts = o.tsval.is_some();
    // Every byte of the header is written below (no zeroing of the whole
    // array first: in the program that is a byte loop of 64 steps).
    // Ports swapped; seq the cookie; ack the SYN's seq + 1.
    tcp_out[0..2].copy_from_slice(&[tcp[2], tcp[3]]);
    tcp_out[2..4].copy_from_slice(&[tcp[0], tcp[1]]);
    tcp_out[4..8].copy_from_slice(&p.cookie.to_be_bytes());
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
    tcp_out[8..12].copy_from_slice(&seq.wrapping_add(1).to_be_bytes());
    let mut n = 20;
    tcp_out[20..24].copy_from_slice(&[OPT_MSS, 4, (p.mss >> 8) as u8, p.mss as u8]);
    n += 4;
    if let Some(tsecr) = o.tsval {
        let first = if o.sack { [OPT_SACK_PERM, 2] } else { [OPT_NOP, OPT_NOP] };
        tcp_out[24..26].copy_from_slice(&first);
        tcp_out[26..28].copy_from_slice(&[OPT_TS, 10]);
        tcp_out[28..32].copy_from_slice(&cookie_tsval(p.now_ms, o).to_be_bytes());
        tcp_out[32..36].copy_from_slice(&tsecr.to_be_bytes());
        n += 12;
        if o.wscale.is_some() {
            tcp_out[36..40].copy_from_slice(&[OPT_NOP, OPT_WSCALE, 3, p.wscale]);
            n += 4;
        }
    }
    tcp_out[12] = ((n / 4) as u8) << 4;
    // SYN, ACK; ECE when ECN is agreed (only the timestamp carries it).
    tcp_out[13] = 0x12 | if ts && o.ecn { 0x40 } else { 0 };
    // The window: 64 KiB less, in whole segments (as the kernel's first).
    let seg = p.mss as u32 - if ts { 12 } else { 0 };
    let win = 65535u32.checked_div(seg).map_or(65535, |q| q * seg);
    tcp_out[14..16].copy_from_slice(&(win as u16).to_be_bytes());
    // The checksum (zero while summing) and the urgent pointer.
    tcp_out[16..20].copy_from_slice(&[0; 4]);
    // Addresses swapped; the pseudo-header's sum, then the TCP header's.
    let mut sum = 6 + n as u32;
    if v6 {
        // Version, no traffic class, no flow label.
        ip_out[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
        ip_out[4..6].copy_from_slice(&(n as u16).to_be_bytes());
        ip_out[6] = 6;
        ip_out[7] = 64;
        ip_out[8..24].copy_from_slice(&ip[24..40]);
        ip_out[24..40].copy_from_slice(&ip[8..24]);
        sum = sum_words(&ip_out[8..40], 32, sum);
    } else {
        const A: usize = ip_at(false);
        ip_out[A..A + 2].copy_from_slice(&[0x45, 0]);
        ip_out[A + 2..A + 4].copy_from_slice(&(20 + n as u16).to_be_bytes());
        // No id; don't fragment, as the kernel's own.
        ip_out[A + 4..A + 8].copy_from_slice(&[0, 0, 0x40, 0]);
        ip_out[A + 8] = 64;
        ip_out[A + 9] = 6;
        ip_out[A + 10..A + 12].copy_from_slice(&[0, 0]);
        ip_out[A + 12..A + 16].copy_from_slice(&ip[A + 16..A + 20]);
        ip_out[A + 16..A + 20].copy_from_slice(&ip[A + 12..A + 16]);
        let c = fold(sum_words(&ip_out[A..], 20, 0));
        ip_out[A + 10..A + 12].copy_from_slice(&c.to_be_bytes());
        sum = sum_words(&ip_out[A + 12..], 8, sum);
    }
    let c = fold(sum_words(&tcp_out[..], n, sum));
    tcp_out[16..18].copy_from_slice(&c.to_be_bytes());
    n
}

/// The reflection cap (GCRA): a network's bucket state `tat` (ns; 0 for a
/// new one) at `now_ns`: the new state when one more SYN-ACK may go, else
/// `None`.
pub fn cap_admit(tat: u64, now_ns: u64, conf: &SynConf) -> Option<u64> {
    let tat = if tat > now_ns { tat } else { now_ns };
    if tat - now_ns > conf.cap_tolerance_ns {
        return None;
    }
    Some(tat + conf.cap_interval_ns)
}

/// The reflection cap's slot of a source ([`CAP_SLOTS`]): its /24 (IPv4)
/// or /48 (IPv6) hashed (Fibonacci hashing of the network's bits, the
/// family in the top bit), so neighbouring networks land far apart.
#[inline(always)]
pub fn cap_slot(src: &[u8; 16], v6: bool) -> u32 {
    let b = |i: usize| src[i] as u64;
    let net = if v6 {
        1 << 63 | b(0) << 40 | b(1) << 32 | b(2) << 24 | b(3) << 16 | b(4) << 8 | b(5)
    } else {
        b(12) << 16 | b(13) << 8 | b(14)
    };
    (net.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - CAP_SLOTS.trailing_zeros())) as u32
}

#[cfg(test)]
mod tests;
