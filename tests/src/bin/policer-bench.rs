//! `cargo xtask bench`: see tests/src/bench/. (Being written.)
fn main() {
    eprintln!("policer-bench: not written yet");
    std::process::exit(1);
}
