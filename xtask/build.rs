//! The pinned toolchain is the workspace's `rust-version` (one definition,
//! in the workspace's Cargo.toml): handed to xtask's code as
//! `POLICER_TOOLCHAIN`. Read here rather than declared as xtask's own
//! `rust-version`, which would stop an older default toolchain from
//! building xtask at all.

fn main() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    println!("cargo:rerun-if-changed={manifest}");
    let text = std::fs::read_to_string(manifest).expect("the workspace's Cargo.toml");
    let version = text
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k.trim() == "rust-version").then(|| v.trim().trim_matches('"').to_string())
        })
        .expect("rust-version in [workspace.package]");
    println!("cargo:rustc-env=POLICER_TOOLCHAIN={version}");
}
