//! What the benchmark (the policer-bench crate) shares with the attack,
//! bans and soak tiers: the live-frames flood generator and the system
//! plumbing around it (CPU pinning and accounting, commands in
//! namespaces, interface and SNMP counters, RSS).

pub mod generator;
pub mod sys;
