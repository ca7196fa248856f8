//! Builds the XDP program (policer-ebpf) with the pinned toolchain and
//! hands the object to `include_bytes_aligned!` through OUT_DIR.
use aya_build::{Package, Toolchain};

/// Must match rust-toolchain.toml: bpf-linker is built against this
/// toolchain's LLVM (see README, "Toolchain").
const TOOLCHAIN: &str = "1.98.0";

fn main() -> anyhow::Result<()> {
    // The inner eBPF build needs `-Z build-std=core` and `core_intrinsics`
    // on a stable toolchain; aya-build passes them when this is set.
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../policer-ebpf");
    println!("cargo::rerun-if-changed=../policer-common/src");
    aya_build::build_ebpf(
        [Package { name: "policer-ebpf", root_dir: root, ..Default::default() }],
        Toolchain::Custom(TOOLCHAIN),
    )
}
