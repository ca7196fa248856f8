//! Builds the policer's program again with its `bench` feature (the
//! BENCH_SOURCES global: synthetic sources, one frame touching N buckets),
//! for `BENCH_OBJECT`: what the benchmark's kernel rows and `--ab` load. It
//! belongs to the benchmark alone: the `policer` binary (policer-user's
//! build) never sees the feature, and the tests do not build it.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // The pinned toolchain: the workspace's rust-version (bpf-linker is
    // built against its LLVM; see CONTRIBUTING.md, "Toolchain").
    let toolchain = std::env::var("CARGO_PKG_RUST_VERSION")?;
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    println!("cargo::rerun-if-changed=../policer-common/src");
    // AYA_BUILD_SKIP=1 (the host tier): an empty object, as in policer-user.
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        std::fs::write(out.join("policer"), [])?;
    }
    let policer = concat!(env!("CARGO_MANIFEST_DIR"), "/../policer-ebpf");
    aya_build::build_ebpf(
        [Package { name: "policer-ebpf", root_dir: policer, features: &["bench"], ..Default::default() }],
        Toolchain::Custom(&toolchain),
    )
}
