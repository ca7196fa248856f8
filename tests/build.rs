//! Builds the reference XDP programs (tests/ebpf: floors, the parse +
//! lookup reference, the live-frames generator), for `REFERENCE_OBJECT`,
//! with the pinned toolchain. They belong to the benchmark and the tests,
//! not to the `policer` binary.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // The pinned toolchain: the workspace's rust-version.
    let toolchain = std::env::var("CARGO_PKG_RUST_VERSION")?;
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/ebpf");
    println!("cargo::rerun-if-changed=../policer-common/src");
    // AYA_BUILD_SKIP=1 (the host tier): an empty object, as in policer-user.
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        std::fs::write(out.join("reference"), [])?;
    }
    aya_build::build_ebpf(
        [Package { name: "policer-bench-ebpf", root_dir: root, ..Default::default() }],
        Toolchain::Custom(&toolchain),
    )
}
