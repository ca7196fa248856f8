//! The XDP object: glue around `policer_common`, which holds the policy
//! (the bucket arithmetic, the table's and the recall's rules, classes,
//! bans, capture's filters) as pure functions this code calls between its
//! loads, stores and compare-and-swaps. Built for `bpfel-unknown-none` by
//! policer-user's build.rs; on the host this binary is an empty stub so
//! that workspace commands (`cargo clippy --all-targets`, `cargo test`)
//! work.
//!
//! The object holds three programs (their entries in `entries`):
//!
//! - **`policer`**, the one the daemon attaches to each interface. For each
//!   frame (`frame`): parse (`parse`) -> rule lookup, the family's LPM trie
//!   (`rules`) -> the prefix's classes, if it has any (policer_common::class:
//!   one LPM lookup by protocol and port) -> bucket lookup, a
//!   set-associative array per family (`police`, policer_common::table; on
//!   a miss the ban store (`bans`), the recall (policer_common::recall),
//!   then the new-source limiter) -> `Rule::admit` under compare-and-swap
//!   (`buckets`) -> the rule's aggregate bucket, if it has one (`totals`)
//!   -> count; the time read at most once, and only when needed (`clock`).
//! - **`policer_capture`**, never attached: while `policer capture` runs,
//!   the policer's verdict hands a frame some capture wants to it by a
//!   tail call (`capture`); it runs the capture lanes on a stack of its
//!   own, writes the frame to the ring, and ends with the verdict's action.
//! - **`policer_replay`**, loaded only by `policer replay` (with the test
//!   clock), never attached: each run of a test run makes the test frame
//!   the batch's next frame, judges it with the attached program's own
//!   code (`judge_frame`), writes the result back (`replay`), and
//!   tail-calls itself for the next.
//!
//! The maps and the globals the loader sets are in `maps`.
#![cfg_attr(target_arch = "bpf", no_std, no_main)]
// `atomic_cxchg` is the only way to get a BPF cmpxchg: the bpfel target
// reports no atomic CAS, so `AtomicU64::compare_exchange` does not exist.
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics), allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod bans;
#[cfg(target_arch = "bpf")]
mod buckets;
#[cfg(target_arch = "bpf")]
mod capture;
#[cfg(target_arch = "bpf")]
mod chain;
#[cfg(target_arch = "bpf")]
mod clock;
#[cfg(target_arch = "bpf")]
mod entries;
#[cfg(target_arch = "bpf")]
mod frame;
#[cfg(target_arch = "bpf")]
mod maps;
#[cfg(target_arch = "bpf")]
mod parse;
#[cfg(target_arch = "bpf")]
mod police;
#[cfg(target_arch = "bpf")]
mod replay;
#[cfg(target_arch = "bpf")]
mod rules;
#[cfg(target_arch = "bpf")]
mod syn;
#[cfg(target_arch = "bpf")]
mod totals;
#[cfg(target_arch = "bpf")]
mod verifier;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {
    eprintln!("policer-ebpf is an XDP program; policer-user builds it for bpfel-unknown-none");
}
