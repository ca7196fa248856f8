//! The interfaces' XDP hooks, watched (issue 43, point 1): a program
//! removed from outside (`ip link set dev IFACE xdp off`, another loader,
//! a driver reset) is found within a tick, said loudly, shown in `status`,
//! and dealt with as `--on-detach` says: put back onto an empty hook (the
//! same program and maps: buckets, bans and counters survive), the daemon
//! exits, or it stays and says so. A program someone else attached is never
//! replaced, only named. The decision is pure ([`judge`]); the owner's tick
//! looks at the hooks and does what it says (`owner.rs`: `watch_hooks`).

/// What `--on-detach` does when the policer program is found gone from an
/// interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum OnDetach {
    /// Put the same program back onto the empty hook (never over another
    /// program: that one is named, and the program goes back once it is
    /// gone).
    #[default]
    Reattach,
    /// The daemon exits, non-zero (a supervisor restarts it).
    Exit,
    /// Keep running, not policing that interface; `status` says so.
    Stay,
}

/// What an interface's hook holds now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    Ours,
    Empty,
    /// Another program, as `describe_program` names it.
    Other(String),
}

/// What the tick does about one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    Nothing,
    /// Ours again (put back by someone, or the other program went and
    /// ours came back): say so, policing.
    Back,
    /// Attach the program again onto the empty hook; the text says why.
    PutBack {
        first: bool,
    },
    /// Not policing the interface: say `why` once (when it is first found).
    Lost {
        why: String,
    },
    /// The daemon leaves: `why`.
    Exit {
        why: String,
    },
}

/// What to do about interface `name` whose hook holds `seen`, the
/// program having been found gone before (`lost`) or not.
pub fn judge(name: &str, seen: &Seen, lost: bool, policy: OnDetach) -> Act {
    let gone = format!(
        "{name}: the policer program is no longer attached (removed from outside: `ip link set dev {name} xdp \
         off`, another loader, a driver reset)"
    );
    match (seen, policy) {
        (Seen::Ours, _) if lost => Act::Back,
        (Seen::Ours, _) => Act::Nothing,
        (_, OnDetach::Exit) => Act::Exit { why: format!("{gone}; the daemon exits (--on-detach exit)") },
        (Seen::Empty, OnDetach::Reattach) => Act::PutBack { first: !lost },
        (_, _) if lost => Act::Nothing,
        (Seen::Empty, OnDetach::Stay) => Act::Lost {
            why: format!("{gone}; NOT policing {name} (--on-detach stay: `policer detach {name}`, then attach again)"),
        },
        (Seen::Other(what), _) => Act::Lost {
            why: format!(
                "{gone}; another program is attached there now: {what}. policer never replaces it: NOT policing \
                 {name}{}",
                if policy == OnDetach::Reattach { " until it goes (then the policer program is put back)" } else { "" }
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_hook_and_policy() {
        use Act::*;
        let other = Seen::Other("program 7 (xdp_dispatcher)".into());
        for policy in [OnDetach::Reattach, OnDetach::Exit, OnDetach::Stay] {
            assert_eq!(judge("eth0", &Seen::Ours, false, policy), Nothing);
            assert_eq!(judge("eth0", &Seen::Ours, true, policy), Back);
        }
        assert_eq!(judge("eth0", &Seen::Empty, false, OnDetach::Reattach), PutBack { first: true });
        // Tried again each tick while the hook is empty.
        assert_eq!(judge("eth0", &Seen::Empty, true, OnDetach::Reattach), PutBack { first: false });
        let Lost { why } = judge("eth0", &other, false, OnDetach::Reattach) else { panic!() };
        assert!(why.contains("program 7 (xdp_dispatcher)") && why.contains("never replaces it"), "{why}");
        assert!(why.contains("until it goes"), "{why}");
        // Said once.
        assert_eq!(judge("eth0", &other, true, OnDetach::Reattach), Nothing);
        let Lost { why } = judge("eth0", &Seen::Empty, false, OnDetach::Stay) else { panic!() };
        assert!(why.contains("NOT policing eth0 (--on-detach stay"), "{why}");
        assert_eq!(judge("eth0", &Seen::Empty, true, OnDetach::Stay), Nothing);
        for seen in [Seen::Empty, other] {
            let Exit { why } = judge("eth0", &seen, false, OnDetach::Exit) else { panic!() };
            assert!(why.contains("xdp off") && why.contains("exits"), "{why}");
        }
    }
}
