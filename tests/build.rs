//! Builds the reference XDP programs (tests/ebpf: floors, the parse +
//! lookup reference, the live-frames generator), for `REFERENCE_OBJECT`,
//! and the policer's program again with its `bench` feature (the
//! BENCH_SOURCES global), for `BENCH_OBJECT`, with the pinned toolchain.
//! They belong to the benchmark and the tests, not to the `policer` binary.
use aya_build::{Package, Toolchain};

/// Must match xtask's TOOLCHAIN (see policer-user/build.rs).
const TOOLCHAIN: &str = "1.98.0";

fn main() -> anyhow::Result<()> {
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf");
    println!("cargo::rerun-if-changed=../policer-common/src");
    // AYA_BUILD_SKIP=1 (the host tier): an empty object, as in policer-user.
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        std::fs::write(out.join("reference"), [])?;
        std::fs::write(out.join("policer"), [])?;
    }
    let policer = concat!(env!("CARGO_MANIFEST_DIR"), "/../policer-ebpf");
    aya_build::build_ebpf(
        [
            Package { name: "policer-bench-ebpf", root_dir: root, ..Default::default() },
            // Its own target directory under this crate's OUT_DIR: the
            // product's build (policer-user) never sees the feature.
            Package { name: "policer-ebpf", root_dir: policer, features: &["bench"], ..Default::default() },
        ],
        Toolchain::Custom(TOOLCHAIN),
    )
}
