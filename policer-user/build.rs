//! Builds the XDP program (policer-ebpf) with the pinned toolchain and
//! hands the object to `include_bytes_aligned!` through OUT_DIR.
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    // The pinned toolchain: the workspace's rust-version (bpf-linker is
    // built against its LLVM; see CONTRIBUTING.md, "Toolchain").
    let toolchain = std::env::var("CARGO_PKG_RUST_VERSION")?;
    // The inner eBPF build needs `-Z build-std=core` and `core_intrinsics`
    // on a stable toolchain; aya-build passes them when this is set.
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { std::env::set_var("RUSTC_BOOTSTRAP", "1") };
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../policer-ebpf");
    println!("cargo::rerun-if-changed=../policer-common/src");
    // AYA_BUILD_SKIP=1 (the host tier: no bpf-linker, no root): aya-build
    // builds nothing, and the objects are empty. The daemon library and its
    // unit tests build; loading says the build has no XDP object.
    if std::env::var_os("AYA_BUILD_SKIP").is_some_and(|v| v == "1" || v.eq_ignore_ascii_case("true")) {
        let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
        std::fs::write(out.join("policer"), [])?;
    }
    // Without features: the eBPF crate's `bench` feature (a benchmark's
    // hook) is built only by policer-bench, into its own object.
    aya_build::build_ebpf(
        [Package { name: "policer-ebpf", root_dir: root, ..Default::default() }],
        Toolchain::Custom(&toolchain),
    )?;
    strip_debug()
}

/// Drops the object's DWARF (`.debug_*`, about half of it) before it is
/// embedded: bpf-linker makes the BTF the loader and the verifier use
/// (`.BTF`, `.BTF.ext` with its line info) from it, and nothing reads it
/// after (`llvm-strip -g`, as the kernel's BPF selftests do). The program's
/// sections are untouched. The LLVM bpf-linker is built against ships
/// llvm-objcopy; without it the object is embedded as built, said once.
fn strip_debug() -> anyhow::Result<()> {
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("policer");
    if std::fs::metadata(&out).map(|m| m.len() == 0).unwrap_or(true) {
        return Ok(());
    }
    let objcopy = std::env::var("LLVM_PREFIX").unwrap_or_else(|_| "/usr/lib/llvm-22".into()) + "/bin/llvm-objcopy";
    match std::process::Command::new(&objcopy).arg("--strip-debug").arg(&out).status() {
        Ok(s) if s.success() => Ok(()),
        Ok(s) => anyhow::bail!("{objcopy} --strip-debug {}: {s}", out.display()),
        Err(e) => {
            println!("cargo::warning=the XDP object is embedded with its DWARF: {objcopy}: {e}");
            Ok(())
        }
    }
}
