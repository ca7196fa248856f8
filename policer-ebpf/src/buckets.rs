//! Charging a bucket: the one compare-and-swap loop of the program
//! ([`charge`]), so that two CPUs never spend the same budget, and what
//! calls it — a source's bucket ([`judge`], [`carry_over`] when its rule
//! changed), a rule's new-source limiter. The arithmetic is
//! policer_common's (`Rule::admit`, `Rule::rescale`).

use core::intrinsics::{AtomicOrdering, atomic_cxchg};

use policer_common::{Bucket, Counters, Rule};

use crate::{clock::Clock, maps::NEW_SOURCES};

/// Compare-and-swap rounds before giving up. Each lost round means another
/// CPU admitted a packet from this bucket meanwhile; four in a row is rare.
pub(crate) const CAS_ROUNDS: usize = 4;

/// Compare-and-swap of a word other CPUs also change; returns the word
/// found, which equals `old` when the swap happened. (Compare that value,
/// not the intrinsic's flag: see docs/platform.md.)
///
/// # Safety
/// `ptr` must point into a live map value.
#[inline(always)]
pub(crate) unsafe fn cas(ptr: *mut u64, old: u64, new: u64) -> u64 {
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
pub(crate) unsafe fn carry_over(tat_ptr: *mut u64, old: &Bucket, rule: &Rule, clock: &mut Clock) {
    // SAFETY: the caller's contract.
    unsafe { cas(tat_ptr, old.tat, rule.rescale(old, clock.now())) };
}

/// Charges a frame to the bucket state at `tat_ptr`; the verdict.
///
/// # Safety
/// `tat_ptr` must point into a live map value.
#[inline(always)]
pub(crate) unsafe fn judge(tat_ptr: *mut u64, rule: &Rule, clock: &mut Clock, len: u32, c: &mut Counters) -> bool {
    // SAFETY: the caller's contract.
    match unsafe { charge(tat_ptr, rule, clock, len, &mut c.cas_retries) } {
        Charge::Admitted => return true,
        Charge::Refused => return false,
        Charge::Lost => {}
    }
    // Lost every round to other CPUs admitting from this bucket: it is
    // being hammered, so dropping is the conservative answer. Counted
    // (`cas_exhausted`: stats, /metrics); not logged from the kernel:
    // aya-log's ring buffer is a legacy map, and every map of the object
    // is a BTF map (docs/chain.md).
    c.cas_exhausted += 1;
    false
}

/// Takes one new source from the rule's limiter (compare-and-swap).
#[inline(always)]
pub(crate) fn new_source_allowed(rule: &Rule, clock: &mut Clock) -> bool {
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
pub(crate) enum Charge {
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
pub(crate) unsafe fn charge(tat_ptr: *mut u64, rule: &Rule, clock: &mut Clock, len: u32, retries: &mut u64) -> Charge {
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
