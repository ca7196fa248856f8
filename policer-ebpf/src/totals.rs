//! The rules' aggregate buckets (`--total-rate`, policer_common::class::
//! Total): one bucket per rule that has one, charged by every frame its
//! sources' buckets admitted, with the same compare-and-swap loop.

use policer_common::Counters;

use crate::{
    buckets::{Charge, charge},
    clock::Clock,
    maps::TOTALS,
};

/// Charges one frame to the rule's aggregate bucket (`--total-rate`).
#[inline(always)]
pub(crate) fn total_admits(slot: u32, clock: &mut Clock, len: u32, c: &mut Counters) -> bool {
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
