//! Types and bucket math shared by the XDP program and the userspace side.
//!
//! This crate is the single definition of everything the kernel and user
//! space exchange: map names, map keys and values, counters, and the reverse
//! leaky bucket itself. The eBPF crate is glue around it. Every `#[repr(C)]`
//! type here is laid out without implicit padding, so the bytes the kernel
//! sees are exactly the bytes user space wrote.
//!
//! # Layers
//!
//! A module uses only the layers below its own and the modules listed
//! before it in its own layer (`policer-user`'s host test `layering`
//! fails on a cycle):
//!
//! 1. **Plain types**, which use nothing: [`maps`] (map names, the bucket
//!    keys, the counters, a ban's entry and parameters, wire constants)
//!    [`flat`] (branch-free comparisons) and [`chain`] (the programs
//!    behind policer: the array, its counters).
//! 2. **The math**: [`clock`], [`bucket`] (`Rule`, `Bucket`, `Action`, the
//!    new-source limiter), `rate` (host only).
//! 3. **The decisions**: [`table`], [`recall`], [`ban`], [`slot`],
//!    [`class`], [`verdict`], [`capture`].
//! 4. **The layout**: [`layout`], which names every module's types: what a
//!    build shares with the next, the sizes adoption compares, `aya::Pod`
//!    and the padding checks.
//!
//! A type lives with the code that gives it meaning (`Rule` with the
//! bucket math, `Set` with the table); only the keys and values several
//! layers name are in `maps`. What moved down keeps its old path as a
//! re-export (`bucket::NS_PER_SEC`, `class::mapped_v4`, `ban::Ban`).
#![no_std]

// The host tests use std (proptest needs it) with or without the feature.
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod ban;
pub mod bucket;
pub mod capture;
pub mod chain;
pub mod class;
pub mod clock;
pub mod flat;
pub mod layout;
pub mod maps;
#[cfg(feature = "std")]
pub mod rate;
pub mod recall;
pub mod replay;
pub mod slot;
pub mod syn;
pub mod table;
pub mod verdict;

pub use bucket::{Bucket, NewSources, Rule};
pub use clock::{ClockWindow, CpuScratch};
pub use layout::{LAYOUT_VERSION, MAPS_OF_EVERY_BUILD, SHARED_MAP_LAYOUT, SHARED_MAPS, UNSTAMPED_LAYOUT_VERSION};
pub use maps::*;
