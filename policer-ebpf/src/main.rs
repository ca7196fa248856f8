//! The XDP program. Built for `bpfel-unknown-none` by policer-user's
//! build.rs; on the host this binary is an empty stub so that workspace
//! commands (`cargo clippy --all-targets`, `cargo test`) work.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// `atomic_cxchg` is the only way to get a BPF cmpxchg: the bpfel target
// reports no atomic CAS, so `AtomicU64::compare_exchange` does not exist.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics), allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod program;

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("policer-ebpf is an XDP program; policer-user builds it for bpfel-unknown-none");
}
