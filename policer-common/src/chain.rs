//! The chain (docs/chain.md): the programs behind policer on an
//! interface. Every frame the policer's verdict passes is handed to the
//! first filled slot of a program array of [`CHAIN_SLOTS`] (a tail call, as
//! Katran's `xdp_root` hands frames on); the drop path never enters it.
//! The array is pinned at [`pin_path`], where any tool can put a program
//! (`bpftool map update pinned … key 0 0 0 0 value pinned PROG`).
//!
//! Each interface has a chain of its own, though one program polices them
//! all: the program hands a frame to its interface's *dispatcher*, in
//! [`MAP_CHAINS`] at the interface's slot, a small program the daemon
//! loads for each interface that tail-calls that interface's array
//! ([`DISPATCHER_PROGRAM`]). A member of another root (`attach --join`)
//! hands straight to the root's array ([`MAP_CHAIN`]).

/// Program array (`BPF_MAP_TYPE_PROG_ARRAY`, a BTF map) of
/// [`CHAIN_SLOTS`]: `u32` slot -> program. Katran-compatible keys and
/// values.
pub const MAP_CHAIN: &str = "CHAIN";
/// Program array of [`crate::MAX_IFACE_SLOTS`]: at an interface's slot
/// (`ifindex % MAX_IFACE_SLOTS`), the dispatcher of its chain. Pinned
/// at [`dispatch_pin_path`] of each interface, so the dispatchers (and
/// the chains through them) outlive the daemon as the hook does.
pub const MAP_CHAINS: &str = "CHAINS";
/// The name of the dispatcher the daemon loads for each interface (a
/// program of its own: it holds the interface's array).
pub const DISPATCHER_PROGRAM: &str = "policer_chain";
/// Per-CPU array of [`ChainCounters`], one per interface slot
/// (`ifindex % MAX_IFACE_SLOTS`, as [`crate::MAP_COUNTERS`]).
pub const MAP_CHAIN_COUNTERS: &str = "CHAIN_COUNTERS";
/// Slots of the chain: the first filled one runs, its verdict is final.
pub const CHAIN_SLOTS: u32 = 8;
/// Where policer pins an interface's chain: `/sys/fs/bpf/policer/IFACE/chain`.
pub const PIN_ROOT: &str = "/sys/fs/bpf/policer";
/// The bpffs mount point the pins live under.
pub const BPFFS: &str = "/sys/fs/bpf";
/// Read-only global (`u32`): the first slot of the chain the program
/// hands to. 0 when policer owns the hook; N + 1 when policer is itself a
/// member, in slot N, of another root's program array (`attach --join
/// PATH --slot N`): the array is then that root's, and policer hands on
/// to the slots behind its own. Set at load, so the verifier drops the
/// tail calls before it.
pub const GLOBAL_CHAIN_FROM: &str = "CHAIN_FROM";

/// What the chain saw on one interface, counted before the jump (a tail
/// call that succeeds does not return).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChainCounters {
    /// Frames the verdict passed that a program of the chain took.
    pub handed_pkts: u64,
    /// Frames the verdict passed while every slot was empty (passed).
    pub empty_pkts: u64,
}

impl ChainCounters {
    /// The sum over CPUs.
    pub fn add(&mut self, other: &ChainCounters) {
        self.handed_pkts = self.handed_pkts.wrapping_add(other.handed_pkts);
        self.empty_pkts = self.empty_pkts.wrapping_add(other.empty_pkts);
    }
}

/// The pin of `iface`'s chain.
#[cfg(any(test, feature = "std"))]
pub fn pin_path(iface: &str) -> std::path::PathBuf {
    std::path::Path::new(PIN_ROOT).join(iface).join("chain")
}

/// The pin of the dispatchers' array ([`MAP_CHAINS`]) beside `iface`'s
/// chain: `/sys/fs/bpf/policer/IFACE/dispatch`.
#[cfg(any(test, feature = "std"))]
pub fn dispatch_pin_path(iface: &str) -> std::path::PathBuf {
    std::path::Path::new(PIN_ROOT).join(iface).join("dispatch")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_under_the_interface() {
        assert_eq!(pin_path("eth0"), std::path::PathBuf::from("/sys/fs/bpf/policer/eth0/chain"));
        assert_eq!(dispatch_pin_path("eth0"), std::path::PathBuf::from("/sys/fs/bpf/policer/eth0/dispatch"));
        let mut a = ChainCounters { handed_pkts: 1, empty_pkts: 2 };
        a.add(&ChainCounters { handed_pkts: 3, empty_pkts: 4 });
        assert_eq!(a, ChainCounters { handed_pkts: 4, empty_pkts: 6 });
    }
}
