//! Network namespaces and veth pairs that clean up after themselves.

use std::{
    fs::File,
    os::fd::AsRawFd,
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

/// Runs `ip ARGS`, panicking with its stderr on failure.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).stdin(Stdio::null()).output().expect("run ip");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// `ip ARGS`, stdout, ignoring failure.
pub fn ip_out(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// Two namespaces joined by a veth pair:
/// `rx_ns`/`rx_if` (where the policer attaches) and `tx_ns`/`tx_if`
/// (where traffic comes from). Both are deleted on drop.
pub struct Sandbox {
    /// A config file for the policer of this sandbox (removed on drop);
    /// tests never touch /etc/policer.
    pub config: String,
    pub rx_ns: String,
    pub tx_ns: String,
    pub rx_if: String,
    pub tx_if: String,
}

static SEQ: AtomicU32 = AtomicU32::new(0);

impl Sandbox {
    /// A fresh pair of namespaces named after `tag`, unique per process.
    pub fn new(tag: &str) -> Sandbox {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{}", std::process::id() % 100_000, n);
        Sandbox::named(
            &format!("plc-{tag}-{id}-rx"),
            &format!("plc-{tag}-{id}-tx"),
            &format!("prx{id}"),
            &format!("ptx{id}"),
        )
    }

    pub fn named(rx_ns: &str, tx_ns: &str, rx_if: &str, tx_if: &str) -> Sandbox {
        // Leftovers from an interrupted run would make `add` fail.
        let _ = ip_out(&["netns", "del", rx_ns]);
        let _ = ip_out(&["netns", "del", tx_ns]);
        let config = format!("{}/{rx_ns}.toml", std::env::temp_dir().display());
        let _ = std::fs::remove_file(&config);
        let sb = Sandbox { config, rx_ns: rx_ns.into(), tx_ns: tx_ns.into(), rx_if: rx_if.into(), tx_if: tx_if.into() };
        ip(&["netns", "add", rx_ns]);
        ip(&["netns", "add", tx_ns]);
        ip(&["link", "add", rx_if, "netns", rx_ns, "type", "veth", "peer", "name", tx_if, "netns", tx_ns]);
        for (ns, ifc) in [(rx_ns, rx_if), (tx_ns, tx_if)] {
            // No IPv6 autoconfiguration chatter: only test frames cross.
            sysctl(ns, "net.ipv6.conf.all.disable_ipv6", "1");
            sysctl(ns, "net.ipv6.conf.default.disable_ipv6", "1");
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "link", "set", ifc, "up"]);
        }
        sb
    }

    /// MAC address of the receiving interface.
    pub fn rx_mac(&self) -> [u8; 6] {
        let out = ip_out(&["-n", &self.rx_ns, "-o", "link", "show", &self.rx_if]);
        let mac = out.split_whitespace().skip_while(|w| *w != "link/ether").nth(1).expect("mac address");
        let mut m = [0u8; 6];
        for (i, p) in mac.split(':').enumerate() {
            m[i] = u8::from_str_radix(p, 16).expect("hex");
        }
        m
    }

    /// The XDP program id attached to the receiving interface, if any.
    pub fn rx_xdp(&self) -> Option<String> {
        let out = ip_out(&["-n", &self.rx_ns, "-d", "link", "show", &self.rx_if]);
        out.split_once("prog/xdp id ").map(|(_, r)| r.split_whitespace().next().unwrap_or("").to_string())
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth in it (and so its peer).
        let _ = ip_out(&["netns", "del", &self.rx_ns]);
        let _ = ip_out(&["netns", "del", &self.tx_ns]);
        let _ = std::fs::remove_file(&self.config);
        let _ = std::fs::remove_dir_all(crate::daemon::state_dir_of(&self.config));
    }
}

fn sysctl(ns: &str, key: &str, val: &str) {
    let _ = Command::new("ip")
        .args(["netns", "exec", ns, "sysctl", "-qw", &format!("{key}={val}")])
        .stdin(Stdio::null())
        .status();
}

/// Moves the calling thread into namespace `ns` (as made by `ip netns`).
/// Only the calling thread moves: call it from a thread of its own.
pub fn enter(ns: &str) -> std::io::Result<()> {
    let f = File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: valid fd; CLONE_NEWNET only affects this thread.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
