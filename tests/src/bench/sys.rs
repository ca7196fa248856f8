//! System plumbing for the benchmark: CPU pinning and accounting, commands,
//! namespaces set up for benchmarking, interface and SNMP counters.

use std::{
    process::{Command, Stdio},
    thread,
    time::Duration,
};

use anyhow::{Context, Result, bail};

use crate::netns::{Sandbox, ip, ip_out};

/// Pins the calling thread to `cpu`.
pub fn pin_cpu(cpu: usize) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity(0) targets this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            return Err(std::io::Error::last_os_error()).context("sched_setaffinity");
        }
    }
    Ok(())
}

/// The CPU that generators and receivers share (the last one).
pub fn bench_cpu() -> usize {
    thread::available_parallelism().map(|n| n.get()).unwrap_or(1).saturating_sub(1)
}

/// Busy and idle time of `cpu` since boot, in ns, from /proc/stat
/// (busy = user + nice + system + irq + softirq + steal).
pub fn cpu_times_ns(cpu: usize) -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let name = format!("cpu{cpu}");
    let line = stat.lines().find(|l| l.split_whitespace().next() == Some(name.as_str())).context("cpu line")?;
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
    // SAFETY: no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let busy = v[0] + v[1] + v[2] + v[5] + v[6] + v.get(7).copied().unwrap_or(0);
    let idle = v[3] + v[4];
    Ok((busy * 1_000_000_000 / hz, idle * 1_000_000_000 / hz))
}

/// Runs a command to completion; fails with its stderr.
pub fn run(cmd: &str, args: &[&str]) -> Result<String> {
    let out =
        Command::new(cmd).args(args).stdin(Stdio::null()).output().with_context(|| format!("cannot run {cmd}"))?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command inside namespace `ns`.
pub fn run_in(ns: &str, cmd: &str, args: &[&str]) -> Result<String> {
    let mut v = vec!["netns", "exec", ns, cmd];
    v.extend_from_slice(args);
    run("ip", &v)
}

/// Runs a command inside `ns`, feeding `input` on stdin.
pub fn run_in_stdin(ns: &str, cmd: &str, args: &[&str], input: &str) -> Result<String> {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, cmd])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {cmd}"))?;
    child.stdin.take().context("stdin")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        bail!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Destination of every benchmark frame; assigned to the receiving veth
/// so admitted frames go up the stack to a closed UDP port (or a socket).
pub const DST: [u8; 4] = [198, 19, 255, 1];

/// Two namespaces and a veth pair, named `pb-TAG-rx`/`pb-TAG-tx`, set up
/// like a receiving host: the destination address on the receiving side,
/// no reverse-path filter, GRO on (so the veth has NAPI and receives
/// redirected frames with or without an XDP program). Removed on drop.
pub struct Net {
    pub sb: Sandbox,
    pub rx_mac: [u8; 6],
    /// Index of the transmit veth, in the transmit namespace.
    pub tx_index: u32,
}

impl Net {
    pub fn new(tag: &str) -> Result<Net> {
        let sb = Sandbox::named(
            &format!("pb-{tag}-rx"),
            &format!("pb-{tag}-tx"),
            &format!("pbr{tag}"),
            &format!("pbt{tag}"),
        );
        let dst = format!("{}.{}.{}.{}/24", DST[0], DST[1], DST[2], DST[3]);
        ip(&["-n", &sb.rx_ns, "addr", "add", &dst, "dev", &sb.rx_if]);
        // The IPv6 floods' destination too, so that their admitted frames
        // go up the stack as far as the IPv4 ones (the sandbox disables
        // IPv6, and an interface without it discards IPv6 frames at once).
        // IPv6 on the receiving interface only, with no link-local address,
        // no router solicitations and no duplicate address detection: no
        // chatter, and the address is usable at once.
        for (key, val) in [("addr_gen_mode", "1"), ("router_solicitations", "0"), ("disable_ipv6", "0")] {
            run_in(&sb.rx_ns, "sysctl", &["-qw", &format!("net.ipv6.conf.{}.{key}={val}", sb.rx_if)])?;
        }
        let dst6 = format!("{}/64", super::generator::DST_V6);
        ip(&["-n", &sb.rx_ns, "addr", "add", &dst6, "dev", &sb.rx_if, "nodad"]);
        for key in ["all", "default", sb.rx_if.as_str()] {
            run_in(&sb.rx_ns, "sysctl", &["-qw", &format!("net.ipv4.conf.{key}.rp_filter=0")])?;
        }
        for (ns, ifc) in [(&sb.rx_ns, &sb.rx_if), (&sb.tx_ns, &sb.tx_if)] {
            run_in(ns, "ethtool", &["-K", ifc, "gro", "on"]).context("ethtool -K gro on")?;
        }
        let rx_mac = sb.rx_mac();
        let tx_index = if_index(&sb.tx_ns, &sb.tx_if)?;
        Ok(Net { sb, rx_mac, tx_index })
    }

    pub fn rx_stats(&self) -> Result<LinkStats> {
        link_stats(&self.sb.rx_ns, &self.sb.rx_if)
    }

    /// Datagrams that reached the UDP layer of the receiving namespace
    /// (delivered to a socket or to a closed port, or refused there), IPv4
    /// and IPv6.
    pub fn udp_in(&self) -> Result<u64> {
        let out = run_in(&self.sb.rx_ns, "cat", &["/proc/net/snmp", "/proc/net/snmp6"])?;
        udp_in_of(&out)
    }
}

/// [`Net::udp_in`] from /proc/net/snmp followed by /proc/net/snmp6.
fn udp_in_of(text: &str) -> Result<u64> {
    let mut lines = text.lines().filter(|l| l.starts_with("Udp:"));
    let (h, v) = (lines.next().context("Udp header")?, lines.next().context("Udp values")?);
    let mut total = 0;
    for (k, x) in h.split_whitespace().zip(v.split_whitespace()) {
        if k == "InDatagrams" || k == "NoPorts" || k == "InErrors" {
            total += x.parse::<u64>().unwrap_or(0);
        }
    }
    // snmp6: one "name value" a line.
    for l in text.lines() {
        let mut f = l.split_whitespace();
        if let (Some("Udp6InDatagrams" | "Udp6NoPorts" | "Udp6InErrors"), Some(x)) = (f.next(), f.next()) {
            total += x.parse::<u64>().unwrap_or(0);
        }
    }
    Ok(total)
}

/// Index of `ifc` in `ns`.
pub fn if_index(ns: &str, ifc: &str) -> Result<u32> {
    let out = ip_out(&["-n", ns, "-j", "link", "show", "dev", ifc]);
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -j link")?;
    v[0]["ifindex"].as_u64().map(|x| x as u32).context("ifindex")
}

#[derive(Clone, Copy, Debug, Default)]
pub struct LinkStats {
    pub rx_packets: u64,
    pub rx_dropped: u64,
}

pub fn link_stats(ns: &str, ifc: &str) -> Result<LinkStats> {
    let out = ip_out(&["-n", ns, "-s", "-j", "link", "show", "dev", ifc]);
    let v: serde_json::Value = serde_json::from_str(&out).context("ip -s -j link")?;
    let rx = &v[0]["stats64"]["rx"];
    Ok(LinkStats {
        rx_packets: rx["packets"].as_u64().context("rx packets")?,
        rx_dropped: rx["dropped"].as_u64().unwrap_or(0),
    })
}

/// VmRSS of `pid` in KiB.
pub fn rss_kib(pid: i32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// Sleeps a little so the machine settles between experiments.
pub fn settle() {
    thread::sleep(Duration::from_millis(200));
}

/// One-line description of the machine.
pub fn machine() -> String {
    let kernel = run("uname", &["-r"]).unwrap_or_default().trim().to_string();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let n = thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    // Return-thunk and retpoline mitigations make every kernel call and
    // return (BPF helpers included) dearer: worth knowing beside the numbers.
    let vuln = |name: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/vulnerabilities/{name}"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    format!(
        "Linux {kernel}, {n} vCPU ({cpu}); mitigations: spec_rstack_overflow \"{}\", spectre_v2 \"{}\"",
        vuln("spec_rstack_overflow"),
        vuln("spectre_v2")
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn udp_in_counts_ipv4_and_ipv6() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 2 64\n\
                    Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n\
                    Udp: 1 20 300 4000 5\n\
                    Udp6InDatagrams                 \t10000\n\
                    Udp6NoPorts                     \t200000\n\
                    Udp6InErrors                    \t3000000\n\
                    Udp6OutDatagrams                \t7\n\
                    UdpLite6InDatagrams             \t9\n";
        assert_eq!(super::udp_in_of(text).unwrap(), 3_210_321);
        assert!(super::udp_in_of("Udp6NoPorts 1\n").is_err(), "no IPv4 table");
    }
}
