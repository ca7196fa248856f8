//! Test support for policer: network namespaces and veth pairs, frame
//! building, AF_PACKET sockets and a paced traffic generator.
//!
//! Everything here stays inside namespaces the caller creates; frames only
//! ever cross the veth pair between them.

pub mod bench;
pub mod capture;
pub mod classes;
pub mod daemon;
pub mod fleet;
pub mod foreign;
pub mod frame;
pub mod kstate;
pub mod lapi;
pub mod mmdb;
pub mod netns;
pub mod packet;
pub mod readable;
pub mod readme;
pub mod reference;
pub mod root;
pub mod soak;
pub mod spoof;
pub mod syn;
pub mod traffic;

/// The reference XDP programs (tests/ebpf: xdp_pass, xdp_drop, parse + one
/// lookup, the live-frames generator), built by build.rs. Empty in a build
/// with `AYA_BUILD_SKIP=1`.
pub static REFERENCE_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/reference"));

/// True when the privileged tiers can run. When they cannot, says why;
/// under CI (`CI=true`) or `POLICER_REQUIRE_PRIVILEGED=1` an unexpected
/// skip is a failure.
pub fn privileged(tier: &str) -> bool {
    // SAFETY: no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    skip(&format!("{tier}: skipped: needs root (CAP_BPF, CAP_NET_ADMIN, CAP_SYS_ADMIN); run `cargo xtask test`"));
    false
}

/// A test that cannot run on this machine says why and returns; under CI
/// (`CI=true`) or `POLICER_REQUIRE_PRIVILEGED=1` the skip is a failure:
/// every test runs there or the run is red.
pub fn skip(reason: &str) {
    let required = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
        || std::env::var("POLICER_REQUIRE_PRIVILEGED").is_ok_and(|v| v == "1");
    if required {
        panic!("{reason} (CI requires every test)");
    }
    eprintln!("{reason}");
}

/// Whether the file at `path` holds the bytes `needle` anywhere: what
/// `strings FILE | grep NEEDLE` finds in a binary, without binutils.
pub fn file_contains(path: &std::path::Path, needle: &[u8]) -> bool {
    assert!(!needle.is_empty(), "an empty needle is in every file");
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    bytes.windows(needle.len()).any(|w| w == needle)
}

/// A deterministic xorshift64 step: reproducible pseudo-random test input.
pub fn rng(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// One frame through the loaded program (BPF_PROG_TEST_RUN): its verdict
/// (`XDP_DROP` 1, `XDP_PASS` 2).
pub fn test_run(p: &mut policer_user::Policer, frame: &[u8]) -> u32 {
    use aya::programs::{TestRun, TestRunOptions};
    let mut out = vec![0u8; frame.len() + 512];
    p.program()
        .test_run(TestRunOptions { data_in: Some(frame), data_out: Some(&mut out), ..Default::default() })
        .expect("test run")
        .return_value
}

#[cfg(test)]
mod tests {
    #[test]
    fn file_contains_finds_bytes_anywhere_and_only_those() {
        let path = std::env::temp_dir().join(format!("policer-file-contains-{}", std::process::id()));
        std::fs::write(&path, b"\0\x7fELF..POLICER_TEST_FAIL_AT\0tail").unwrap();
        let found = |n: &[u8]| super::file_contains(&path, n);
        assert!(found(b"POLICER_TEST_"));
        assert!(found(b"tail"), "at the very end");
        assert!(found(b"\0\x7fELF"), "at the very start");
        assert!(!found(b"BENCH_SOURCES"));
        assert!(!found(b"tail\0"), "past the end");
        std::fs::remove_file(&path).unwrap();
    }
}
