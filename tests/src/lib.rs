//! Test support for policer: network namespaces and veth pairs, frame
//! building, AF_PACKET sockets and a paced traffic generator.
//!
//! Everything here stays inside namespaces the caller creates; frames only
//! ever cross the veth pair between them.

pub mod bench;
pub mod daemon;
pub mod foreign;
pub mod frame;
pub mod kstate;
pub mod netns;
pub mod packet;
pub mod reference;
pub mod soak;
pub mod spoof;
pub mod traffic;

/// True when the privileged tiers can run. When they cannot, says why;
/// under CI (`CI=true`) or `POLICER_REQUIRE_PRIVILEGED=1` an unexpected
/// skip is a failure.
pub fn privileged(tier: &str) -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    let reason = format!("{tier}: skipped: needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN); run `cargo xtask test`");
    let required = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("POLICER_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
    if required {
        panic!("{reason} (CI requires every tier)");
    }
    eprintln!("{reason}");
    false
}

/// A deterministic xorshift64 step: reproducible pseudo-random test input.
pub fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}
