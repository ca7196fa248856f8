//! Types and bucket math shared by the XDP program and the userspace side.
//!
//! This crate is the single definition of everything the kernel and user
//! space exchange: map names, map keys and values, counters, and the reverse
//! leaky bucket itself. The eBPF crate is glue around it. Every `#[repr(C)]`
//! type here is laid out without implicit padding, so the bytes the kernel
//! sees are exactly the bytes user space wrote.
#![no_std]

// The host tests use std (proptest needs it) with or without the feature.
#[cfg(any(test, feature = "std"))]
extern crate std;

pub mod ban;
pub mod bucket;
pub mod class;
pub mod clock;
pub mod flat;
pub mod layout;
pub mod maps;
#[cfg(feature = "std")]
pub mod rate;
pub mod recall;
pub mod slot;
pub mod table;
pub mod verdict;

pub use bucket::{Bucket, NewSources, Rule};
pub use clock::{ClockWindow, CpuScratch};
pub use layout::{LAYOUT_VERSION, MAPS_OF_EVERY_BUILD, SHARED_MAP_LAYOUT, SHARED_MAPS, UNSTAMPED_LAYOUT_VERSION};
pub use maps::*;
