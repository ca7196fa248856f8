//! The systems compared: XDP floors, the policer (the real daemon), and
//! the kernel's own per-source limiters (nftables dynamic set with `limit`,
//! iptables `hashlimit` on the legacy and nft back ends). Each lives in
//! the receiving namespace of its own [`Net`] and goes away with it.

use crate::REFERENCE_OBJECT;
use anyhow::{Context, Result};
use aya::{
    Ebpf,
    programs::{Xdp, XdpMode},
};

use super::sys::{Net, if_index, run_in, run_in_stdin};
use crate::{daemon::Daemon, netns::enter};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum System {
    XdpDrop,
    PolicerDrop,
    /// The reference `parse_lookup` (reference.rs) on veth: parse, one
    /// LRU hash lookup of the source (an insert on a miss), drop.
    RefLookup,
    PolicerAdmit,
    XdpPass,
    Nft,
    IptLegacy,
    IptNft,
    /// The IPv6 rows: the same systems fed an IPv6 flood (a source per /64).
    XdpDrop6,
    PolicerDrop6,
    /// The reference `parse_lookup6`: parse, one LRU hash lookup of the
    /// source's /64, drop.
    RefLookup6,
    /// nftables with an `ip6 saddr` dynamic set.
    Nft6,
    /// The class rows (issue 17): the dropping policer with
    /// [`CLASS_RULES`] installed beside its source-only rule, none of
    /// which matches the flood (UDP to port 9): the A/B partner of
    /// `PolicerDrop`.
    PolicerClasses,
    /// The class-matching flood (UDP to port 53): the policer with a
    /// class-less rule that admits everything and
    /// `0.0.0.0/0 --proto udp --dport 53` at the dropping limit.
    PolicerDns,
    /// nftables, `udp dport 53` before the dynamic set + limit.
    NftDns,
    /// iptables-legacy hashlimit with `-p udp --dport 53`.
    IptLegacyDns,
}

/// The class rules of the `PolicerClasses` row, all on the flood's source
/// prefix (0.0.0.0/0), written as `policer rule set 0.0.0.0/0 …` takes
/// them (each also gets the dropping limit; the benchmark writes them
/// into the daemon's config file, see [`class_config`]). None matches the flood: UDP to port
/// [`FLOOD_DPORT`](super::generator::FLOOD_DPORT), 9.
pub const CLASS_RULES: [&[&str]; 16] = [
    &["--proto", "tcp", "--tcp-flags", "syn,!ack"],
    &["--proto", "tcp", "--dport", "22"],
    &["--proto", "tcp", "--dport", "80"],
    &["--proto", "tcp", "--dport", "443"],
    &["--proto", "tcp", "--dport", "8000-8999"],
    &["--proto", "udp", "--dport", "53"],
    &["--proto", "udp", "--dport", "123"],
    &["--proto", "udp", "--dport", "161-162"],
    &["--proto", "udp", "--dport", "27015"],
    &["--proto", "udp", "--dport", "500"],
    &["--proto", "icmp", "--icmp-type", "8"],
    &["--proto", "icmp"],
    &["--proto", "47"],
    &["--proto", "50"],
    &["--dst", "192.0.2.10", "--proto", "udp", "--dport", "5060"],
    &["--proto", "tcp", "--dport", "25"],
];

/// The class rule of the `PolicerDns` row (with the dropping limit).
pub const DNS_RULE: &[&str] = &["--proto", "udp", "--dport", "53"];

/// The source prefix of the class rules: every source of the floods.
pub const CLASS_PREFIX: &str = "0.0.0.0/0";

/// An address family of a flood.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// A per-source limit: packets per second and burst.
#[derive(Clone, Copy, Debug)]
pub struct Limit {
    pub pps: u64,
    pub burst: u64,
}

impl System {
    pub fn key(self) -> &'static str {
        match self {
            System::XdpDrop => "xdp_drop",
            System::PolicerDrop => "policer_drop",
            System::RefLookup => "parse_lookup",
            System::PolicerAdmit => "policer_admit",
            System::XdpPass => "xdp_pass",
            System::Nft => "nft_dynset",
            System::IptLegacy => "iptables_legacy_hashlimit",
            System::IptNft => "iptables_nft_hashlimit",
            System::XdpDrop6 => "xdp_drop_v6",
            System::PolicerDrop6 => "policer_drop_v6",
            System::RefLookup6 => "parse_lookup_v6",
            System::Nft6 => "nft_dynset_v6",
            System::PolicerClasses => "policer_drop_classes",
            System::PolicerDns => "policer_dns",
            System::NftDns => "nft_dynset_dns",
            System::IptLegacyDns => "iptables_legacy_hashlimit_dns",
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            System::XdpDrop => "xdp_drop (floor)",
            System::PolicerDrop => "policer, dropping (1 pps per source)",
            System::RefLookup => "parse + one LRU lookup (reference), dropping all",
            System::PolicerAdmit => "policer, all admitted",
            System::XdpPass => "xdp_pass, up to the stack",
            System::Nft => "nftables netdev ingress, dynamic set + limit",
            System::IptLegacy => "iptables-legacy raw hashlimit",
            System::IptNft => "iptables-nft raw hashlimit",
            System::XdpDrop6 => "IPv6: xdp_drop (floor)",
            System::PolicerDrop6 => "IPv6: policer, dropping (1 pps per /64)",
            System::RefLookup6 => "IPv6: parse + one LRU lookup of the /64 (reference), dropping all",
            System::Nft6 => "IPv6: nftables netdev ingress, ip6 saddr dynamic set + limit",
            System::PolicerClasses => "policer, dropping, + 16 class rules not matching the flood",
            System::PolicerDns => "UDP/53 flood: policer, class rule `--proto udp --dport 53` (1 pps per source)",
            System::NftDns => "UDP/53 flood: nftables netdev ingress, `udp dport 53` dynamic set + limit",
            System::IptLegacyDns => "UDP/53 flood: iptables-legacy raw hashlimit, `-p udp --dport 53`",
        }
    }

    /// Short tag for namespace and interface names.
    pub fn tag(self) -> &'static str {
        match self {
            System::XdpDrop => "fd",
            System::PolicerDrop => "pd",
            System::RefLookup => "rl",
            System::PolicerAdmit => "pa",
            System::XdpPass => "fp",
            System::Nft => "nf",
            System::IptLegacy => "il",
            System::IptNft => "in",
            System::XdpDrop6 => "fd6",
            System::PolicerDrop6 => "pd6",
            System::RefLookup6 => "rl6",
            System::Nft6 => "nf6",
            System::PolicerClasses => "pc",
            System::PolicerDns => "pq",
            System::NftDns => "nq",
            System::IptLegacyDns => "iq",
        }
    }

    /// The family of the flood the system is measured with.
    pub fn family(self) -> Family {
        match self {
            System::XdpDrop6 | System::PolicerDrop6 | System::RefLookup6 | System::Nft6 => Family::V6,
            _ => Family::V4,
        }
    }

    /// The UDP destination port of the flood the system is measured with.
    pub fn dport(self) -> u16 {
        match self {
            System::PolicerDns | System::NftDns | System::IptLegacyDns => super::generator::DNS_DPORT,
            _ => super::generator::FLOOD_DPORT,
        }
    }

    /// One of the class rows (reported in their own table).
    pub fn is_class_row(self) -> bool {
        matches!(self, System::PolicerClasses | System::PolicerDns | System::NftDns | System::IptLegacyDns)
    }
}

/// A system installed on a [`Net`]; removed with it.
pub enum Installed {
    Xdp(Box<Ebpf>),
    Daemon(Box<Daemon>),
    Netfilter,
}

impl Installed {
    pub fn daemon(&self) -> Option<&Daemon> {
        match self {
            Installed::Daemon(d) => Some(d),
            _ => None,
        }
    }
}

/// Attaches reference program `name` to the receiving veth (native mode).
pub fn attach_reference(net: &Net, name: &str) -> Result<Ebpf> {
    attach_reference_sized(net, name, 1024)
}

/// [`attach_reference`] with the reference's LRU tables (`REF_TABLE`,
/// `REF_TABLE6`) for `table` sources.
pub fn attach_reference_sized(net: &Net, name: &str, table: u32) -> Result<Ebpf> {
    attach_reference_in(&net.sb.rx_ns, &net.sb.rx_if, name, table)
}

/// [`attach_reference_sized`] on interface `ifc` of namespace `ns`.
pub fn attach_reference_in(ns: &str, ifc: &str, name: &str, table: u32) -> Result<Ebpf> {
    let mut e = aya::EbpfLoader::new()
        .map_max_entries("REF_TABLE", table.max(1))
        .map_max_entries("REF_TABLE6", table.max(1))
        .load(REFERENCE_OBJECT)?;
    let p: &mut Xdp = e.program_mut(name).context("reference program")?.try_into()?;
    p.load()?;
    let idx = if_index(ns, ifc)?;
    std::thread::scope(|s| {
        s.spawn(|| -> Result<()> {
            enter(ns)?;
            p.attach(idx, XdpMode::Driver)?;
            Ok(())
        })
        .join()
        .map_err(|_| anyhow::anyhow!("attach thread panicked"))?
    })?;
    Ok(e)
}

/// Sources every system can track at once in the veth runs: the nftables
/// set size, hashlimit's `--hashlimit-htable-max` and policer's
/// `--max-sources`, so no system pays for a larger table than the others.
pub const TABLE_CAPACITY: u32 = 262_144;

/// `policer attach` on the receiving veth with `limit` for every source.
pub fn policer(net: &Net, limit: Limit, extra: &[&str]) -> Daemon {
    policer_bin(&crate::daemon::policer_bin(), net, limit, extra)
}

/// [`policer`] with the `policer` binary at `bin`.
pub fn policer_bin(bin: &std::path::Path, net: &Net, limit: Limit, extra: &[&str]) -> Daemon {
    let rate = format!("{}pps", limit.pps);
    let burst = limit.burst.to_string();
    let mut args = vec!["--rate", &rate, "--burst", &burst, "--mode", "native", "--interval", "0"];
    args.extend_from_slice(extra);
    Daemon::attach_bin(bin, &net.sb, &args)
}

/// nftables: a netdev ingress chain on the receiving veth that adds each
/// source to a dynamic set with a `limit` and drops what is over it.
pub fn nft(net: &Net, limit: Limit) -> Result<()> {
    nft_set(net, limit, Family::V4, TABLE_CAPACITY)
}

/// [`nft`] for `family` (`ip saddr` or `ip6 saddr`) with a set of `size`
/// elements. A full set adds nothing: the rule does not match, and the
/// chain's policy accepts the frame (nft_dynset in the kernel).
pub fn nft_set(net: &Net, limit: Limit, family: Family, size: u32) -> Result<()> {
    nft_matching(net, limit, family, size, "")
}

/// [`nft_set`] with `matching` (an nft expression such as `udp dport 53 `,
/// with its trailing space) before the set: frames it does not match are
/// accepted without touching the set.
pub fn nft_matching(net: &Net, limit: Limit, family: Family, size: u32, matching: &str) -> Result<()> {
    let (ty, saddr) = match family {
        Family::V4 => ("ipv4_addr", "ip saddr"),
        Family::V6 => ("ipv6_addr", "ip6 saddr"),
    };
    let ruleset = format!(
        "table netdev pb {{\n  set pbm {{ type {ty}; size {size}; flags dynamic; }}\n  \
         chain pbin {{ type filter hook ingress device \"{}\" priority 0; policy accept;\n    \
         {matching}add @pbm {{ {saddr} limit rate over {}/second burst {} packets }} drop\n  }}\n}}\n",
        net.sb.rx_if, limit.pps, limit.burst
    );
    run_in_stdin(&net.sb.rx_ns, "nft", &["-f", "-"], &ruleset).context("nft ruleset")?;
    Ok(())
}

/// iptables (`iptables-legacy` or `iptables-nft`): raw PREROUTING
/// hashlimit per source address, dropping what is above the limit.
pub fn hashlimit(net: &Net, binary: &str, limit: Limit) -> Result<()> {
    hashlimit_matching(net, binary, limit, &[])
}

/// [`hashlimit`] with `matching` (iptables match options such as
/// `-p udp --dport 53`) before the hashlimit match.
pub fn hashlimit_matching(net: &Net, binary: &str, limit: Limit, matching: &[&str]) -> Result<()> {
    let above = format!("{}/sec", limit.pps);
    let burst = limit.burst.to_string();
    let name = format!("pb{}", net.sb.rx_if);
    let max = TABLE_CAPACITY.to_string();
    let mut args = vec!["-t", "raw", "-A", "PREROUTING", "-i", &net.sb.rx_if];
    args.extend_from_slice(matching);
    args.extend_from_slice(&[
        "-m",
        "hashlimit",
        "--hashlimit-mode",
        "srcip",
        "--hashlimit-above",
        &above,
        "--hashlimit-burst",
        &burst,
        "--hashlimit-name",
        &name,
        "--hashlimit-htable-size",
        "65536",
        "--hashlimit-htable-max",
        &max,
        "-j",
        "DROP",
    ]);
    run_in(&net.sb.rx_ns, binary, &args).with_context(|| format!("{binary} hashlimit"))?;
    Ok(())
}

/// Installs `sys` on `net`: `drop_limit` is the limit for the dropping
/// rows, `admit_limit` for the policer row that admits everything.
pub fn install(sys: System, net: &Net, drop_limit: Limit, admit_limit: Limit) -> Result<Installed> {
    let capacity = TABLE_CAPACITY.to_string();
    Ok(match sys {
        System::XdpDrop | System::XdpDrop6 => Installed::Xdp(Box::new(attach_reference(net, "xdp_drop")?)),
        System::XdpPass => Installed::Xdp(Box::new(attach_reference(net, "xdp_pass")?)),
        System::RefLookup => Installed::Xdp(Box::new(attach_reference_sized(net, "parse_lookup", TABLE_CAPACITY)?)),
        System::RefLookup6 => Installed::Xdp(Box::new(attach_reference_sized(net, "parse_lookup6", TABLE_CAPACITY)?)),
        System::PolicerDrop | System::PolicerDrop6 => {
            Installed::Daemon(Box::new(policer(net, drop_limit, &["--max-sources", &capacity])))
        }
        System::PolicerAdmit => Installed::Daemon(Box::new(policer(net, admit_limit, &["--max-sources", &capacity]))),
        System::Nft => {
            nft(net, drop_limit)?;
            Installed::Netfilter
        }
        System::Nft6 => {
            nft_set(net, drop_limit, Family::V6, TABLE_CAPACITY)?;
            Installed::Netfilter
        }
        System::IptLegacy => {
            hashlimit(net, "iptables-legacy", drop_limit)?;
            Installed::Netfilter
        }
        System::IptNft => {
            hashlimit(net, "iptables-nft", drop_limit)?;
            Installed::Netfilter
        }
        System::PolicerClasses => {
            class_config(net, &CLASS_RULES, drop_limit)?;
            let d = policer(net, drop_limit, &["--max-sources", &capacity]);
            check_rules(&d, CLASS_RULES.len() + 2)?;
            Installed::Daemon(Box::new(d))
        }
        System::PolicerDns => {
            class_config(net, &[DNS_RULE], drop_limit)?;
            let d = policer(net, admit_limit, &["--max-sources", &capacity]);
            check_rules(&d, 3)?;
            Installed::Daemon(Box::new(d))
        }
        System::NftDns => {
            nft_matching(net, drop_limit, Family::V4, TABLE_CAPACITY, "udp dport 53 ")?;
            Installed::Netfilter
        }
        System::IptLegacyDns => {
            hashlimit_matching(net, "iptables-legacy", drop_limit, &["-p", "udp", "--dport", "53"])?;
            Installed::Netfilter
        }
    })
}

/// Writes `net`'s config file with a `[[rule]]` for 0.0.0.0/0 and every
/// class of `classes` (written as `policer rule set 0.0.0.0/0 …` options,
/// see [`CLASS_RULES`]), each with `limit`, for the daemon to start with;
/// its command line's `--rate`/`--burst` add the class-less rules for
/// 0.0.0.0/0 and ::/0. (The same rules as `policer rule set 0.0.0.0/0 …`
/// calls once it runs would make, in force before the first frame; a first
/// version used those calls and met a since-fixed bug of the config-file
/// editor.)
pub fn class_config(net: &Net, classes: &[&[&str]], limit: Limit) -> Result<()> {
    std::fs::write(&net.sb.config, class_toml(classes, limit)?).with_context(|| format!("write {}", net.sb.config))
}

/// Fails when the daemon says it polices with other than `n` rules (the
/// class rules, and the class-less ones for 0.0.0.0/0 and ::/0 its command
/// line adds): class rules it did not take would make the class rows
/// measure something else. Says nothing when its start message has no
/// count.
pub fn check_rules(d: &Daemon, n: usize) -> Result<()> {
    let out = d.stdout();
    let count = out.lines().find_map(|l| {
        let (_, rest) = l.split_once("policing on ")?;
        let (_, rest) = rest.split_once(" with ")?;
        rest.split_whitespace().next()?.parse::<usize>().ok()
    });
    match count {
        Some(c) if c != n => anyhow::bail!("the daemon polices with {c} rules, not the {n} of its config file:\n{out}"),
        _ => Ok(()),
    }
}

/// The `[[rule]]` tables of [`class_config`].
pub fn class_toml(classes: &[&[&str]], limit: Limit) -> Result<String> {
    let mut out = String::new();
    for class in classes {
        out.push_str(&format!("[[rule]]\nprefix = \"{CLASS_PREFIX}\"\n"));
        for kv in class.chunks(2) {
            let [k, v] = kv else { anyhow::bail!("class option without a value: {class:?}") };
            let line = match *k {
                "--proto" => format!("proto = \"{v}\""),
                "--dport" if v.bytes().all(|b| b.is_ascii_digit()) => format!("dport = {v}"),
                "--dport" => format!("dport = \"{v}\""),
                "--tcp-flags" => format!("tcp_flags = \"{v}\""),
                "--icmp-type" => format!("icmp_type = {v}"),
                "--dst" => format!("dst = \"{v}\""),
                _ => anyhow::bail!("class option {k} has no config-file field here"),
            };
            out.push_str(&line);
            out.push('\n');
        }
        out.push_str(&format!("rate = \"{}pps\"\nburst = {}\n\n", limit.pps, limit.burst));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_class_rules_make_a_config_file_the_daemon_takes() {
        let toml = class_toml(&CLASS_RULES, Limit { pps: 1, burst: 1 }).unwrap();
        let (_, rules) = policer_user::config::Config::parse(&toml, std::path::Path::new("bench.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        assert_eq!(rules.len(), 16, "{toml}");
        assert!(toml.contains("dport = \"8000-8999\"") && toml.contains("tcp_flags = \"syn,!ack\""), "{toml}");
        let (_, one) = policer_user::config::Config::parse(
            &class_toml(&[DNS_RULE], Limit { pps: 1, burst: 1 }).unwrap(),
            std::path::Path::new("bench.toml"),
        )
        .unwrap();
        assert_eq!(one.len(), 1);
        // The floods' port is none of the classes' ports.
        let port = super::super::generator::FLOOD_DPORT.to_string();
        assert!(CLASS_RULES.iter().all(|c| c.windows(2).all(|kv| kv != ["--dport", port.as_str()])));
    }
}
