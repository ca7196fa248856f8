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
/// sections are untouched. llvm-objcopy is `$LLVM_PREFIX/bin/llvm-objcopy`
/// when LLVM_PREFIX is set (as for bpf-linker's build), else that of the
/// LLVM bpf-linker is built against (`/usr/lib/llvm-22`, CONTRIBUTING.md),
/// else the one on PATH; without one the object is embedded as built, and
/// the build warns that the image is larger for it.
fn strip_debug() -> anyhow::Result<()> {
    println!("cargo::rerun-if-env-changed=LLVM_PREFIX");
    let out = std::path::PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("policer");
    if std::fs::metadata(&out).map(|m| m.len() == 0).unwrap_or(true) {
        return Ok(());
    }
    let candidates = match std::env::var("LLVM_PREFIX") {
        Ok(prefix) => vec![format!("{prefix}/bin/llvm-objcopy")],
        Err(_) => vec!["/usr/lib/llvm-22/bin/llvm-objcopy".to_string(), "llvm-objcopy".to_string()],
    };
    for objcopy in &candidates {
        match std::process::Command::new(objcopy).arg("--strip-debug").arg(&out).status() {
            Ok(s) if s.success() => return Ok(()),
            Ok(s) => anyhow::bail!("{objcopy} --strip-debug {}: {s}", out.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => anyhow::bail!("{objcopy} --strip-debug {}: {e}", out.display()),
        }
    }
    println!(
        "cargo::warning=no llvm-objcopy found (tried {}): the XDP object is embedded with its DWARF, which makes \
         the policer binary about 1 MB larger (the object 1.4 MB instead of 0.3 MB; the README's image size is \
         of a stripped one); install LLVM 22 or set LLVM_PREFIX to an LLVM prefix with bin/llvm-objcopy",
        candidates.join(", ")
    );
    Ok(())
}
