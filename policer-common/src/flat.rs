//! Branch-free comparisons for the program's table scans.
//!
//! BPF has no conditional move or set-on-compare: every `if`, `min` or
//! `<` that reaches a decision becomes a jump, and the verifier walks each
//! path a scan over eight slots can take. With a running minimum that is
//! close to every subset of the slots: the scans of eviction and of the
//! recall pushed the program past the verifier's million instructions.
//! These helpers decide with arithmetic alone (the sign bit of a
//! difference), so a scan is one straight path.

/// 1 if `a < b`, else 0. Both must be below 2^63.
#[inline(always)]
pub const fn lt(a: u64, b: u64) -> u64 {
    a.wrapping_sub(b) >> 63
}

/// 1 if `x == 0`, else 0.
#[inline(always)]
pub const fn is_zero(x: u64) -> u64 {
    ((x | x.wrapping_neg()) >> 63) ^ 1
}

/// 1 if `a == b`, else 0.
#[inline(always)]
pub const fn eq(a: u64, b: u64) -> u64 {
    is_zero(a ^ b)
}

/// `a` if `bit` is 1, `b` if it is 0.
#[inline(always)]
pub const fn pick(bit: u64, a: u64, b: u64) -> u64 {
    let m = bit.wrapping_neg();
    (a & m) | (b & !m)
}

/// The smaller of `a` and `b`, both below 2^63.
#[inline(always)]
pub const fn min(a: u64, b: u64) -> u64 {
    pick(lt(a, b), a, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn agree_with_the_operators(a in 0..1u64 << 63, b in 0..1u64 << 63, x in any::<u64>(), y in any::<u64>()) {
            prop_assert_eq!(lt(a, b), (a < b) as u64);
            prop_assert_eq!(min(a, b), a.min(b));
            prop_assert_eq!(is_zero(x), (x == 0) as u64);
            prop_assert_eq!(eq(x, y), (x == y) as u64);
            prop_assert_eq!(eq(x, x), 1);
            prop_assert_eq!(pick(1, x, y), x);
            prop_assert_eq!(pick(0, x, y), y);
        }
    }
}
