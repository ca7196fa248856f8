//! `policer replay` in batches: many frames judged in one
//! `BPF_PROG_TEST_RUN`.
//!
//! A test run judges one frame, and its fixed cost (the system call, the
//! kernel's page for the frame, the copies in and out: ~1.4 µs on a small
//! VM) is many times the program's; `repeat` reruns the same frame (and
//! above 1 swaps the program into the kernel's XDP dispatcher and out, a
//! `synchronize_rcu` each). So replay loads a second entry of the same
//! object, [`REPLAY_PROGRAM`]: each time it runs it takes the next
//! [`ReplayFrame`] of [`MAP_REPLAY_FRAMES`] (the cursor in
//! [`MAP_REPLAY_CTL`]), makes the test run's frame that frame (its length
//! by `bpf_xdp_adjust_tail`, its first bytes by `bpf_xdp_store_bytes`, its
//! time in the metadata as in [`crate::verdict::TEST_META_LEN`]), calls
//! the policer's own code on it (the function the attached program's entry
//! calls: one copy in the object), writes the program's return value, rule
//! slot and verdict back into the record, and tail-calls itself
//! ([`MAP_REPLAY_PROG`]) for the next: up to [`REPLAY_FRAMES_PER_RUN`] a
//! test run. The frames are judged one after another in capture order on
//! one CPU, as one test run a frame judges them.
//!
//! Only the first [`REPLAY_HEAD`] bytes of a frame are copied: every byte
//! the program reads lies in them (the parser's bounds, checked below);
//! the rest of the frame is there at its length, its content unread.

use crate::wire::{MAX_EXT_OFFSET, MAX_VLAN_TAGS, VLAN_HLEN};

/// The replay entry of the XDP object (never attached).
pub const REPLAY_PROGRAM: &str = "policer_replay";
/// `Array<ReplayFrame>`, mmapable: a batch of frames. One entry in the
/// object (the daemon never uses it); replay sizes it [`REPLAY_BATCH`].
pub const MAP_REPLAY_FRAMES: &str = "REPLAY_FRAMES";
/// `Array<ReplayCtl>`, one entry, mmapable: the batch's cursor and length.
pub const MAP_REPLAY_CTL: &str = "REPLAY_CTL";
/// `ProgramArray`, one entry: [`REPLAY_PROGRAM`] itself, which ends each
/// frame with a tail call to it for the next.
pub const MAP_REPLAY_PROG: &str = "REPLAY_PROG";
/// Frames one test run judges at most: the first, then one per tail call
/// (the kernel's `MAX_TAIL_CALL_CNT`, 33).
pub const REPLAY_FRAMES_PER_RUN: u32 = 34;
/// Records in a batch (the map's entries), judged up to
/// [`REPLAY_FRAMES_PER_RUN`] a test run.
pub const REPLAY_BATCH: u32 = 2048;

/// The furthest byte the parser reads, plus one: the IPv6 extension walk
/// reads a header at an offset of at most `MAX_EXT_OFFSET` (8 bytes of a
/// fragment header at most), and the layer-4 header it finds (at most
/// `MAX_EXT_OFFSET + 8`, where the class lookup stops) is read for 14
/// bytes (TCP's flags). IPv4 (options up to 60 bytes after two VLAN tags)
/// and the IPv6 header end well before.
pub const PARSER_READS: usize = MAX_EXT_OFFSET + 8 + 14;
/// Bytes of each frame copied into the test run's frame: [`PARSER_READS`],
/// rounded up.
pub const REPLAY_HEAD: usize = PARSER_READS.next_multiple_of(32);
const _: () = assert!(REPLAY_HEAD >= PARSER_READS && 14 + MAX_VLAN_TAGS * VLAN_HLEN + 60 + 14 <= REPLAY_HEAD);

/// Shortest frame the batch path takes: `bpf_xdp_adjust_tail` keeps an
/// Ethernet header. Shorter frames are not Ethernet frames: the program
/// passes them unread (no rule), which replay counts without a run.
pub const REPLAY_MIN_LEN: u32 = 14;

/// What [`ReplayFrame::ret`] holds until the program has run the frame.
pub const REPLAY_NOT_RUN: u32 = u32::MAX;

/// One frame of a batch. In: `now`, `len`, `head_len`, `head`. Out:
/// `ret`, `slot`, `verdict` (as [`crate::verdict::TEST_META_SLOT`] and
/// `TEST_META_VERDICT` report them: `u32::MAX` when no rule judged it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ReplayFrame {
    /// The program's clock for this frame (never 0).
    pub now: u64,
    /// The frame's length (at least [`REPLAY_MIN_LEN`], at most what a test
    /// run's page holds).
    pub len: u32,
    /// Bytes of `head` that are the frame's: `len.min(REPLAY_HEAD)`
    /// (zero-padded past what was captured). The program copies the whole
    /// head (a constant size) and then cuts the frame to `len`.
    pub head_len: u32,
    /// The program's return value; [`REPLAY_NOT_RUN`] before.
    pub ret: u32,
    pub slot: u32,
    pub verdict: u32,
    pub _pad: u32,
    pub head: [u8; REPLAY_HEAD],
}

impl ReplayFrame {
    pub const EMPTY: ReplayFrame = ReplayFrame {
        now: 0,
        len: 0,
        head_len: 0,
        ret: REPLAY_NOT_RUN,
        slot: u32::MAX,
        verdict: u32::MAX,
        _pad: 0,
        head: [0; REPLAY_HEAD],
    };
}

/// The batch's cursor: the program runs frame `next` (and counts it on)
/// while `next < count`; past the end it returns `XDP_ABORTED` untouched.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ReplayCtl {
    pub next: u32,
    pub count: u32,
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: `#[repr(C)]` integers and a byte array, no padding (the u64
    // first, six u32s, then bytes to a multiple of 8), any bit pattern valid.
    unsafe impl aya::Pod for super::ReplayFrame {}
    // SAFETY: two u32s.
    unsafe impl aya::Pod for super::ReplayCtl {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_has_no_padding_and_the_head_covers_the_parser() {
        assert_eq!(core::mem::size_of::<ReplayFrame>(), 8 + 6 * 4 + REPLAY_HEAD);
        assert_eq!(core::mem::size_of::<ReplayFrame>() % 8, 0);
        assert_eq!(PARSER_READS, 534);
    }
}
