//! Classes: rules for one kind of a source prefix's traffic (a protocol,
//! a destination port or range, a source port or range, TCP flags, an ICMP
//! type, a destination prefix), and aggregate caps on a whole rule.
//!
//! # How a frame finds its rule
//!
//! The source's longest prefix that has any rule is found as before (the
//! LPM tries, or the default-rules fast path). Its [`crate::Rule`] there is
//! the prefix's *fallback*: its class-less rule, or when it has none, what
//! the next shorter prefixes resolve to (user space works that out), or
//! [`crate::ACTION_NONE`]. When the prefix has classes, `Rule::classes`
//! names its group, and one lookup in `CLASS_INDEX` (an LPM trie keyed by
//! group, protocol and destination port, see [`index_key`]) returns the
//! [`ClassList`] for that protocol and port: every class that can match
//! there, the most specific first, each with its whole rule inline (so an
//! update replaces a list atomically). The first whose remaining fields
//! match ([`ClassCand::matches`]) is the rule; none: the fallback.
//!
//! The index is keyed by the destination port only. A class that names a
//! source port (`--sport`) is a candidate like the others: one without a
//! destination port sits in its protocol's entry and behind every port's,
//! and [`ClassCand::matches`] compares the frame's source port with its
//! range; the filter has lanes for the source ports such classes name, so
//! a frame that neither port can match still skips the lookup.
//!
//! Port ranges become LPM prefixes: user space cuts the port space of a
//! group and protocol into the intervals where the set of classes does not
//! change and writes each as aligned blocks, so the trie's longest match is
//! the list for the frame's port. A class without a port is in its
//! protocol's entry (`/40`), a class without a protocol in the group's
//! (`/32`), and each list also holds the less specific classes behind the
//! more specific ones. The per-frame work is one trie lookup and at most
//! [`MAX_CANDIDATES`] short comparisons, whatever the number of rules; and
//! none of it for a frame whose protocol no class names
//! (`Rule::class_protos`).
//!
//! Frames without a layer-4 header to read (a non-first fragment, a header
//! cut short, an IPv6 extension chain longer than the parser walks) are
//! looked up with ports 0 and match only classes that read nothing past the
//! IP header: protocol and destination ([`NEEDS_L4`]); a source port class
//! needs the layer-4 header as a destination port class does.

use crate::bucket::Rule;

// The IPv4 form of the keyed table's keys (an IPv4 source's class
// buckets) is defined with the keys, in `maps`; it keeps its path here.
pub use crate::{KEY_LEN_V4_MAPPED, mapped_v4};

/// `Rule::flags`: the rule is a class's: its buckets are per (source key,
/// class), in the keyed table (see [`crate::table::Geometry::hash_v6`]),
/// the class named by its counter slot.
pub const RULE_CLASS: u32 = 1;
/// `Rule::flags`: the rule has an aggregate bucket (`--total-rate`), in
/// `TOTALS` at its counter slot, charged after the source's bucket admits.
pub const RULE_TOTAL: u32 = 2;
/// `Rule::flags`: the rule has no per-source bucket (only a total).
pub const RULE_NO_SOURCE: u32 = 4;

/// Candidates a [`ClassList`] holds: the most classes of one prefix and
/// the shorter prefixes it falls to that can match one frame.
pub const MAX_CANDIDATES: usize = 8;

/// [`ClassCand::needs`]: the class reads the layer-4 header (a port, TCP
/// flags or an ICMP type), so a frame without one cannot match it.
pub const NEEDS_L4: u8 = 1;
/// [`ClassCand::needs`]: match `tcp_mask`/`tcp_flags`.
pub const NEEDS_TCP_FLAGS: u8 = 2;
/// [`ClassCand::needs`]: match `icmp_type`.
pub const NEEDS_ICMP_TYPE: u8 = 4;
/// [`ClassCand::needs`]: match `dst`/`dst_mask`.
pub const NEEDS_DST: u8 = 8;
/// [`ClassCand::needs`]: match `sport_lo..=sport_hi`.
pub const NEEDS_SPORT: u8 = 16;

/// IP protocols whose destination port a class can name.
pub const PROTOS_WITH_PORTS: [u8; 4] = [6, 17, 132, 136];
/// IP protocols whose source port a class can name: those with a lane in
/// the [`ClassFilter`] (TCP and UDP).
pub const PROTOS_WITH_SPORTS: [u8; 2] = [6, 17];
pub const IPPROTO_ICMP: u8 = 1;
pub const IPPROTO_TCP: u8 = 6;
pub const IPPROTO_UDP: u8 = 17;
pub const IPPROTO_ICMPV6: u8 = 58;

/// TCP flag bits (byte 13 of the header).
pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_PSH: u8 = 0x08;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_URG: u8 = 0x20;
pub const TCP_ECE: u8 = 0x40;
pub const TCP_CWR: u8 = 0x80;

/// Bytes of a `CLASS_INDEX` key after the prefix length: group (4, network
/// order), protocol (1), port (2, network order), padding (1).
pub const INDEX_KEY_BYTES: usize = 8;
/// Prefix length of a group's entry (every protocol and port).
pub const INDEX_GROUP_BITS: u32 = 32;
/// Prefix length of a protocol's entry (every port).
pub const INDEX_PROTO_BITS: u32 = 40;
/// Prefix length of one port.
pub const INDEX_PORT_BITS: u32 = 56;

/// The `CLASS_INDEX` key data of a frame (or an entry) of `group`,
/// `proto`, `port`.
#[inline(always)]
pub const fn index_key(group: u32, proto: u8, port: u16) -> [u8; INDEX_KEY_BYTES] {
    let g = group.to_be_bytes();
    let p = port.to_be_bytes();
    [g[0], g[1], g[2], g[3], proto, p[0], p[1], 0]
}

/// What a frame offers to class matching (read only when its prefix has
/// classes).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameL4 {
    /// IP protocol (IPv6: the header after the extension headers).
    pub proto: u8,
    /// Whether the layer-4 header was read (see the module doc).
    pub has_l4: bool,
    pub dport: u16,
    pub sport: u16,
    pub tcp_flags: u8,
    pub icmp_type: u8,
    /// Destination address, network order (IPv4: the first 4 bytes).
    pub dst: [u8; 16],
}

/// One class as the program matches it, with its rule.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassCand {
    pub rule: Rule,
    /// Destination prefix, masked (network order).
    pub dst: [u8; 16],
    pub dst_mask: [u8; 16],
    /// [`NEEDS_L4`] and the other `NEEDS_` bits.
    pub needs: u8,
    /// TCP flags that must be set (`tcp_flags`) among those looked at
    /// (`tcp_mask`): `syn,!ack` is mask SYN|ACK, flags SYN.
    pub tcp_mask: u8,
    pub tcp_flags: u8,
    pub icmp_type: u8,
    /// Source ports, inclusive ([`NEEDS_SPORT`]).
    pub sport_lo: u16,
    pub sport_hi: u16,
}

impl ClassCand {
    /// Whether a frame that reached this candidate (its group, protocol and
    /// port range already matched by the index) matches the rest.
    #[inline(always)]
    pub fn matches(&self, f: &FrameL4) -> bool {
        let n = self.needs;
        if n & NEEDS_L4 != 0 && !f.has_l4 {
            return false;
        }
        if n & NEEDS_TCP_FLAGS != 0 && f.tcp_flags & self.tcp_mask != self.tcp_flags {
            return false;
        }
        if n & NEEDS_ICMP_TYPE != 0 && f.icmp_type != self.icmp_type {
            return false;
        }
        if n & NEEDS_SPORT != 0 {
            // Read from the frame's memory at each candidate: kept in a
            // register across the scan, the source port takes a stack slot
            // of its own in each of the program's two copies of the class
            // step (IPv4, IPv6), 16 bytes its deepest call chain (512) has
            // no room for (480 + the log record's 32, as before).
            // SAFETY: a plain read of a field of a live reference.
            let sport = unsafe { core::ptr::read_volatile(&f.sport) };
            if sport < self.sport_lo || sport > self.sport_hi {
                return false;
            }
        }
        if n & NEEDS_DST != 0 {
            let (d, a, m) = (words(&f.dst), words(&self.dst), words(&self.dst_mask));
            if (d.0 & m.0) != a.0 || (d.1 & m.1) != a.1 {
                return false;
            }
        }
        true
    }
}

#[inline(always)]
fn words(a: &[u8; 16]) -> (u64, u64) {
    (
        u64::from_ne_bytes([a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]]),
        u64::from_ne_bytes([a[8], a[9], a[10], a[11], a[12], a[13], a[14], a[15]]),
    )
}

/// The value of `CLASS_INDEX`: the classes that can match at one group,
/// protocol and port block, most specific first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClassList {
    /// Candidates in use (at most [`MAX_CANDIDATES`]).
    pub len: u32,
    pub _pad: u32,
    pub cands: [ClassCand; MAX_CANDIDATES],
}

impl ClassList {
    /// The first candidate that matches `f`, as an index.
    #[inline(always)]
    pub fn first_match(&self, f: &FrameL4) -> Option<usize> {
        let n = self.len as usize;
        let mut i = 0;
        while i < MAX_CANDIDATES {
            if i >= n {
                return None;
            }
            if self.cands[i].matches(f) {
                return Some(i);
            }
            i += 1;
        }
        None
    }
}

/// What [`select`] reads of a frame and of the class maps, each only when
/// the answers before it leave the choice open: the program reads the
/// frame and its maps, the host its compiled rules.
pub trait ClassLookups<'a> {
    /// The frame's layer-4 fields for protocol `proto` (its header read
    /// here, `dst` left for [`ClassLookups::dst`]).
    fn l4(&mut self, proto: u8) -> FrameL4;
    /// The [`ClassFilter`] of a group.
    fn filter(&mut self, group: u32) -> Option<&'a ClassFilter>;
    /// The frame's destination as [`FrameL4::dst`] holds it (`None`:
    /// unreadable, no class).
    fn dst(&mut self) -> Option<[u8; 16]>;
    /// The `CLASS_INDEX` entry of the longest prefix of `key`
    /// ([`index_key`]) at [`INDEX_PORT_BITS`].
    fn index(&mut self, key: [u8; INDEX_KEY_BYTES]) -> Option<&'a ClassList>;
    /// The candidate's index as the program should see it: the program
    /// hides it from the verifier (so it walks one candidate, not each);
    /// the host keeps it.
    fn opaque(&mut self, i: usize) -> usize {
        i
    }
}

/// The class rule a frame gets when its source's prefix rule is `rule`
/// and its protocol is `proto`: `None` when none of the prefix's classes
/// matches (the frame falls to `rule`). The one class choice: the program
/// and the host's lookup both make it here.
///
/// Cheapest first: the rule's protocol bits (no read), the layer-4 header,
/// the group's filter (an inlined array read in the program), the
/// destination, then the index (a trie lookup) and its candidates.
#[inline(always)]
pub fn select<'a>(rule: &Rule, proto: u8, l: &mut impl ClassLookups<'a>) -> Option<&'a Rule> {
    if rule.classes == 0 || rule.class_protos & (1u64 << (proto & 63)) == 0 {
        return None;
    }
    let mut f = l.l4(proto);
    if !l.filter(rule.classes)?.may_match(proto, f.has_l4, f.dport, f.sport) {
        return None;
    }
    f.dst = l.dst()?;
    let list = l.index(index_key(rule.classes, proto, f.dport))?;
    let i = list.first_match(&f)?;
    list.cands.get(l.opaque(i) % MAX_CANDIDATES).map(|c| &c.rule)
}

/// Groups (prefixes with classes) a program holds: the entries of
/// `CLASS_FILTER`. Group ids are `1..MAX_CLASS_GROUPS`.
pub const MAX_CLASS_GROUPS: u32 = 4096;
/// Ports one bit of a [`ClassFilter`] lane stands for: bit `port % 512`.
pub const FILTER_PORT_BITS: u32 = 512;

/// The value of `CLASS_FILTER`, one per group: whether the class lookup
/// can find anything for a frame, read before it (an inlined array read,
/// against the trie lookup's helper call), so that frames of a protocol
/// and port no class names skip the lookup: the drop path of a flood that
/// no class matches costs what it did without classes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassFilter {
    /// Bit `p` (of 256): a class of protocol `p` names no port (or a class
    /// names no protocol, or `p` has ports but no lane): look up every
    /// frame of `p`.
    pub any: [u64; 4],
    /// TCP, then UDP: bit `port % 512` set for every port a class of that
    /// protocol names.
    pub ports: [[u64; 8]; 2],
    /// TCP, then UDP: bit `port % 512` set for every source port a class
    /// of that protocol names without a destination port.
    pub sports: [[u64; 8]; 2],
}

impl ClassFilter {
    /// The lane of a protocol with ports, if it has one.
    #[inline(always)]
    pub const fn lane(proto: u8) -> Option<usize> {
        match proto {
            IPPROTO_TCP => Some(0),
            IPPROTO_UDP => Some(1),
            _ => None,
        }
    }

    /// Whether a frame of `proto` to `port` from `sport` (`has_l4`: its
    /// layer-4 header was read) may match a class. The source port's lane
    /// is read only when the destination port's rules the frame out.
    #[inline(always)]
    pub fn may_match(&self, proto: u8, has_l4: bool, port: u16, sport: u16) -> bool {
        if self.any[(proto >> 6) as usize & 3] & (1u64 << (proto & 63)) != 0 {
            return true;
        }
        let Some(lane) = ClassFilter::lane(proto) else {
            return false;
        };
        let (bit, sbit) = (port as u32 % FILTER_PORT_BITS, sport as u32 % FILTER_PORT_BITS);
        has_l4
            && (self.ports[lane & 1][(bit >> 6) as usize & 7] & (1u64 << (bit & 63)) != 0
                || self.sports[lane & 1][(sbit >> 6) as usize & 7] & (1u64 << (sbit & 63)) != 0)
    }

    /// Marks protocol `proto` as looked up for every frame.
    pub fn set_any(&mut self, proto: u8) {
        self.any[proto as usize >> 6] |= 1u64 << (proto & 63);
    }

    /// Marks the ports `lo..=hi` of `proto` (a protocol without a lane is
    /// looked up for every frame).
    pub fn set_ports(&mut self, proto: u8, lo: u16, hi: u16) {
        match ClassFilter::lane(proto) {
            Some(lane) => set_lane(&mut self.ports[lane], lo, hi),
            None => self.set_any(proto),
        }
    }

    /// Marks the source ports `lo..=hi` of `proto` (of a class without a
    /// destination port; a protocol without a lane is looked up for every
    /// frame).
    pub fn set_sports(&mut self, proto: u8, lo: u16, hi: u16) {
        match ClassFilter::lane(proto) {
            Some(lane) => set_lane(&mut self.sports[lane], lo, hi),
            None => self.set_any(proto),
        }
    }

    /// Every bit of both.
    pub fn union(&self, o: &ClassFilter) -> ClassFilter {
        let mut u = *self;
        for i in 0..4 {
            u.any[i] |= o.any[i];
        }
        for l in 0..2 {
            for i in 0..8 {
                u.ports[l][i] |= o.ports[l][i];
                u.sports[l][i] |= o.sports[l][i];
            }
        }
        u
    }
}

/// Sets the bits of ports `lo..=hi` in a lane.
fn set_lane(lane: &mut [u64; 8], lo: u16, hi: u16) {
    if (hi - lo) as u32 + 1 >= FILTER_PORT_BITS {
        *lane = [u64::MAX; 8];
        return;
    }
    let mut p = lo as u32;
    while p <= hi as u32 {
        let bit = p % FILTER_PORT_BITS;
        lane[(bit >> 6) as usize] |= 1u64 << (bit & 63);
        p += 1;
    }
}

/// The value of `TOTALS`, one per rule counter slot: a rule's aggregate
/// bucket (`--total-rate`, `--total-burst`), charged under
/// compare-and-swap like a source's.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Total {
    pub tat: u64,
    /// The arithmetic of the aggregate (rate, burst, unit).
    pub limiter: Rule,
}

#[cfg(test)]
mod tests;
