//! What the program does for the verifier's sake rather than the policy's.

use crate::maps::CPU_SCRATCH;

/// `x`, passed through this CPU's scratch map value, so that the verifier
/// sees a number it cannot know (range checks still bound it) and walks
/// what follows once, not once per value `x` could take.
#[inline(always)]
pub(crate) fn launder(x: u64) -> u64 {
    match CPU_SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; only this CPU touches it while we run.
        Some(s) => unsafe {
            core::ptr::write_volatile(&raw mut (*s).opaque, x);
            core::ptr::read_volatile(&(*s).opaque)
        },
        None => x,
    }
}
