//! A rule's verdict on a frame and how it is counted: one definition for
//! the program, which counts per interface ([`Counters`]) and per rule
//! ([`RuleCounters`]) in one call, and for the host tests.

use crate::{Counters, RuleCounters, bucket::Action};

/// What becomes of a frame under its rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// Passed by a monitor rule whose buckets refused it: counted as passed
    /// and as would-drop.
    WouldDrop,
    Drop,
}

impl Verdict {
    /// The verdict of a rule whose `action` ([`Action`] as a number) polices
    /// or monitors, on a frame its buckets `admitted` (or not).
    #[inline(always)]
    pub const fn policed(action: u32, admitted: bool) -> Verdict {
        if admitted {
            Verdict::Pass
        } else if action == Action::Monitor as u32 {
            Verdict::WouldDrop
        } else {
            Verdict::Drop
        }
    }

    /// Whether the frame goes on to the stack.
    #[inline(always)]
    pub const fn passes(self) -> bool {
        !matches!(self, Verdict::Drop)
    }
}

/// Counts a frame of `len` bytes with verdict `v` on the interface's
/// counters `c` and its rule's `rc`.
#[inline(always)]
pub fn count(c: &mut Counters, rc: &mut RuleCounters, v: Verdict, len: u32) {
    let len = len as u64;
    if let Verdict::WouldDrop = v {
        add(&mut c.would_drop_pkts, &mut c.would_drop_bytes, len);
        add(&mut rc.would_drop_pkts, &mut rc.would_drop_bytes, len);
    }
    if v.passes() {
        add(&mut c.passed_pkts, &mut c.passed_bytes, len);
        add(&mut rc.passed_pkts, &mut rc.passed_bytes, len);
    } else {
        add(&mut c.dropped_pkts, &mut c.dropped_bytes, len);
        add(&mut rc.dropped_pkts, &mut rc.dropped_bytes, len);
    }
}

/// The metadata a test-clock program (`TEST_CLOCK`, as `policer replay`
/// and the object tier load it) reads and writes in front of a test run's
/// frame (`BPF_PROG_TEST_RUN` with an `xdp_md` whose `data` is
/// [`TEST_META_LEN`]: the first bytes of `data_in` become the frame's
/// `data_meta`, and `data_out` returns them). In: the clock for this frame
/// (u64 at [`TEST_META_NOW`], native order; 0: read `CLOCK` instead), so a
/// replay sets the time in the same call that judges the frame. Out: the
/// counter slot of the rule that judged it (u32 at [`TEST_META_SLOT`]) and
/// [`test_meta_code`] of its verdict (u32 at [`TEST_META_VERDICT`]); both
/// stay as written in when no rule judged the frame. The product's program
/// (`TEST_CLOCK` 0) neither reads nor writes metadata: the verifier prunes it.
pub const TEST_META_LEN: usize = 16;
pub const TEST_META_NOW: usize = 0;
pub const TEST_META_SLOT: usize = 8;
pub const TEST_META_VERDICT: usize = 12;
// What `bpf_prog_test_run_xdp` takes as metadata: a multiple of 4, at most
// 32 bytes (`xdp_metalen_invalid`); the three fields fit in it.
const _: () = assert!(TEST_META_VERDICT + 4 <= TEST_META_LEN && TEST_META_LEN.is_multiple_of(4) && TEST_META_LEN <= 32);

/// A verdict as the test metadata reports it.
#[inline(always)]
pub const fn test_meta_code(v: Verdict) -> u32 {
    match v {
        Verdict::Pass => 0,
        Verdict::WouldDrop => 1,
        Verdict::Drop => 2,
    }
}

/// The verdict of a [`test_meta_code`]; `None` for anything else (no rule).
pub const fn from_test_meta_code(code: u32) -> Option<Verdict> {
    match code {
        0 => Some(Verdict::Pass),
        1 => Some(Verdict::WouldDrop),
        2 => Some(Verdict::Drop),
        _ => None,
    }
}

#[inline(always)]
fn add(pkts: &mut u64, bytes: &mut u64, len: u64) {
    *pkts += 1;
    *bytes += len;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_monitor_passes_what_its_buckets_refuse_and_a_police_rule_drops_it() {
        for a in [Action::Police, Action::Monitor] {
            assert_eq!(Verdict::policed(a as u32, true), Verdict::Pass);
        }
        assert_eq!(Verdict::policed(Action::Monitor as u32, false), Verdict::WouldDrop);
        assert_eq!(Verdict::policed(Action::Police as u32, false), Verdict::Drop);
        assert!(Verdict::WouldDrop.passes() && Verdict::Pass.passes() && !Verdict::Drop.passes());
        for v in [Verdict::Pass, Verdict::WouldDrop, Verdict::Drop] {
            assert_eq!(from_test_meta_code(test_meta_code(v)), Some(v));
        }
        assert_eq!(from_test_meta_code(u32::MAX), None);
    }

    #[test]
    fn each_verdict_counts_on_the_interface_and_the_rule_alike() {
        let (mut c, mut rc) = (Counters::default(), RuleCounters::default());
        count(&mut c, &mut rc, Verdict::Pass, 100);
        count(&mut c, &mut rc, Verdict::WouldDrop, 60);
        count(&mut c, &mut rc, Verdict::Drop, 40);
        count(&mut c, &mut rc, Verdict::Drop, 1);
        let got = |p: u64, b: u64, wp: u64, wb: u64, dp: u64, db: u64| (p, b, wp, wb, dp, db);
        let want = got(2, 160, 1, 60, 2, 41);
        assert_eq!(
            got(c.passed_pkts, c.passed_bytes, c.would_drop_pkts, c.would_drop_bytes, c.dropped_pkts, c.dropped_bytes),
            want
        );
        assert_eq!(
            got(
                rc.passed_pkts,
                rc.passed_bytes,
                rc.would_drop_pkts,
                rc.would_drop_bytes,
                rc.dropped_pkts,
                rc.dropped_bytes
            ),
            want
        );
        assert_eq!((c.unmatched_pkts, rc.buckets_created, rc.total_dropped_pkts), (0, 0, 0));
    }
}
