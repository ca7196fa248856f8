//! Benchmark support (`cargo xtask bench`).
