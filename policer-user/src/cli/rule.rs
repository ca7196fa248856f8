//! `policer rule set|rm|ls`.

use clap::{Args, Subcommand};

use super::daemon;
use policer_common::bucket::Action;

use crate::{
    classes::{Class, ClassText},
    rules::{BurstValue, RuleConfig},
};

/// Which of a prefix's traffic a rule is for (none: all of it). A rule is
/// identified by its prefix and its class.
#[derive(Args, Clone, Debug, Default)]
pub struct ClassArgs {
    /// Protocol: tcp, udp, icmp, icmpv6, sctp, udplite, or a number.
    #[arg(long, allow_hyphen_values = true)]
    proto: Option<String>,
    /// Destination port or range LOW-HIGH (tcp, udp, sctp, udplite).
    #[arg(long, allow_hyphen_values = true)]
    dport: Option<String>,
    /// Source port or range LOW-HIGH (tcp, udp): 53 or 123 for a DNS or NTP reflection.
    #[arg(long, allow_hyphen_values = true)]
    sport: Option<String>,
    /// TCP flags, comma-separated, `!` negates: syn, syn,!ack (a bare SYN), rst.
    #[arg(long, allow_hyphen_values = true)]
    tcp_flags: Option<String>,
    /// ICMP (or ICMPv6) type: 8 is an echo request (128 for ICMPv6).
    #[arg(long, allow_hyphen_values = true)]
    icmp_type: Option<String>,
    /// Destination prefix or address.
    #[arg(long, allow_hyphen_values = true)]
    dst: Option<String>,
}

impl ClassArgs {
    fn text(&self) -> ClassText {
        ClassText {
            proto: self.proto.clone(),
            dport: self.dport.clone(),
            sport: self.sport.clone(),
            tcp_flags: self.tcp_flags.clone(),
            icmp_type: self.icmp_type.clone(),
            dst: self.dst.clone(),
        }
    }

    /// Validated here too, so bad input fails with no daemon, naming the
    /// value as written.
    fn rule(&self, cidr: &str) -> anyhow::Result<RuleConfig> {
        let net = crate::prefix::parse_prefix(cidr)?;
        if let Some(note) = crate::prefix::mapped_note(cidr, &net) {
            eprintln!("policer: note: {note}");
        }
        Class::parse(&self.text(), net.addr().is_ipv6())?;
        Ok(RuleConfig { prefix: cidr.to_string(), ..RuleConfig::default() }.with_class_text(self.text()))
    }
}

#[derive(Subcommand)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value per process, parsed once from the command line: its size costs nothing"
)]
pub enum Cmd {
    /// Add the rule for a prefix and class, or change the one there: the
    /// options given change those fields, the rest keep their values
    /// (`--replace`: the options given alone). Says every field it changed,
    /// old → new. Longest prefix wins, then its most specific class that
    /// matches.
    Set {
        #[command(flatten)]
        wait: super::Wait,
        /// 203.0.113.0/24, 2001:db8::/48, or one address.
        cidr: String,
        #[command(flatten)]
        class: ClassArgs,
        /// Rate per source (or per --key-len group): 500pps, 10kpps, 64kbit, 10gbit.
        #[arg(long, allow_hyphen_values = true)]
        rate: Option<String>,
        /// Burst: packets, or bytes for a bit rate (1500b, 64kb).
        #[arg(long, allow_hyphen_values = true)]
        burst: Option<String>,
        /// What the rule does (a new rule: police).
        #[arg(long, value_enum)]
        action: Option<Action>,
        /// Leading source bits that form one bucket (default 32 IPv4, 64
        /// IPv6, or the prefix's length when longer).
        #[arg(long, allow_hyphen_values = true)]
        key_len: Option<String>,
        /// Rate of the whole rule, all its sources together (an aggregate
        /// bucket, charged after the source's own admits the frame).
        #[arg(long, allow_hyphen_values = true)]
        total_rate: Option<String>,
        /// Burst of the aggregate bucket: packets, or bytes for a bit rate.
        #[arg(long, allow_hyphen_values = true)]
        total_burst: Option<String>,
        /// Share --total-rate with every node whose rule names the same
        /// budget: the total is then the whole fleet's, leased through the
        /// Redis of the config's [global] table (docs/fleet.md).
        #[arg(long, value_name = "NAME")]
        global: Option<String>,
        /// SYN cookies, for a TCP class (--proto tcp): off, flood (only
        /// while the rule's SYNs exceed --total-rate) or always. A SYN from
        /// a source that has not proved its address is answered by a SYN-ACK
        /// with the kernel's cookie from XDP; an ACK the kernel's cookie
        /// check accepts verifies the source and gives it a bucket. With
        /// flood, the unverified sources' SYNs have a budget of their own at
        /// --total-rate: within it they go to the kernel without a bucket,
        /// and the rule's total polices the verified sources' frames
        /// (docs/syn-cookies.md).
        #[arg(long, value_name = "MODE", value_parser = ["off", "flood", "always"])]
        syn_cookies: Option<String>,
        /// The reflection cap of SYN cookies: SYN-ACKs a second toward one
        /// /24 (IPv6: /48), 1pps to 100Mpps (default 1000pps).
        #[arg(long, value_name = "RATE")]
        syn_ack_rate: Option<String>,
        /// Ban a source whose bucket refuses --ban-after frames (since it
        /// was last admitted, or within --ban-within), for this long (500ms, 30s, 10m, 1h, 7d): its
        /// frames are dropped without touching its bucket until the ban
        /// ends; then it has its full burst again.
        #[arg(long, allow_hyphen_values = true, value_name = "DURATION")]
        ban_for: Option<String>,
        /// Refused frames that start a ban (default 1: the first): since
        /// the source was last admitted, or with --ban-within, within that
        /// window.
        #[arg(long, allow_hyphen_values = true, value_name = "N")]
        ban_after: Option<String>,
        /// Count --ban-after's refusals in a window of this long, admitted
        /// frames between them or not (fail2ban's findtime; maxretry is
        /// --ban-after): a brute-forcer whose bucket admits a few frames a
        /// second is banned at its N-th refusal within the window.
        #[arg(long, allow_hyphen_values = true, value_name = "DURATION")]
        ban_within: Option<String>,
        /// A source banned again within twice its last ban's length is
        /// banned twice as long, up to this (default: no growth).
        #[arg(long, allow_hyphen_values = true, value_name = "DURATION")]
        ban_max: Option<String>,
        /// The classes of shorter (covering) prefixes stop at this prefix:
        /// its sources get its own rules alone (by default a class of a
        /// shorter prefix, `0.0.0.0/0 --proto udp --dport 53`, applies
        /// under it unless it defines the same class).
        #[arg(long, conflicts_with = "inherit")]
        no_inherit: bool,
        /// Undo --no-inherit: the classes of shorter prefixes apply under
        /// this prefix again (the default).
        #[arg(long)]
        inherit: bool,
        /// Remove the rule this long from now (its sources fall to the next
        /// rule); kept across restarts as an absolute time. Given to a rule
        /// that has no end, a temporary change: that rule comes back when it
        /// ends (the config file keeps it; the change is in the kernel only,
        /// and a restart before the end brings the rule back early; refused
        /// while a change of that rule is still being written).
        #[arg(long, allow_hyphen_values = true, value_name = "DURATION")]
        ttl: Option<String>,
        /// Apply to the kernel only, without writing the config file (for
        /// when it cannot be written: a full disk, a read-only /etc). Shown
        /// as not persisted in `rule ls` and `status`; kept across reloads,
        /// gone at the next start or `reload --discard-runtime`.
        #[arg(long)]
        runtime: bool,
        /// Replace the rule in force with the options given alone (fields
        /// not given take their defaults) instead of changing those fields.
        #[arg(long)]
        replace: bool,
        /// Allow a deny of a whole family (`0.0.0.0/0`, `::/0`), which
        /// drops every source, the operator's own sessions included.
        #[arg(long)]
        force: bool,
        /// Show what the change would do, and change nothing: the rules
        /// added, changed (field by field) and removed, and which sources
        /// live in the bucket table now would go from pass to drop or back
        /// (their rate measured over one second). Refused exactly as the
        /// change would be (same message, same exit status). See
        /// docs/dry-run.md.
        #[arg(long)]
        dry_run: bool,
        /// With --dry-run: print it as JSON (docs/json.md).
        #[arg(long, requires = "dry_run")]
        json: bool,
    },
    /// Make a named set of prefixes from a file, one prefix per line (or
    /// add to the implicit set of the action and rate): one rule for all of
    /// them.
    Import(Box<super::import::Args>),
    /// Remove the rule for a prefix and class, or a set (`--set NAME`).
    Rm {
        #[command(flatten)]
        wait: super::Wait,
        /// The rule's prefix (with its class fields, if it has a class).
        #[arg(required_unless_present = "set")]
        cidr: Option<String>,
        /// Remove this set (`policer rule import --set NAME`) and all of its prefixes.
        #[arg(long, value_name = "NAME", conflicts_with_all = ["cidr", "runtime"])]
        set: Option<String>,
        #[command(flatten)]
        class: ClassArgs,
        /// Remove from the kernel only; the config file keeps the rule.
        #[arg(long)]
        runtime: bool,
        /// Show what the change would do, and change nothing: the rules
        /// added, changed (field by field) and removed, and which sources
        /// live in the bucket table now would go from pass to drop or back
        /// (their rate measured over one second). Refused exactly as the
        /// change would be (same message, same exit status). See
        /// docs/dry-run.md.
        #[arg(long, conflicts_with = "set")]
        dry_run: bool,
        /// With --dry-run: print it as JSON (docs/json.md).
        #[arg(long, requires = "dry_run")]
        json: bool,
    },
    /// List the rules (a set as one line), or a set's prefixes (`--set NAME`).
    Ls {
        #[command(flatten)]
        wait: super::Wait,
        /// Print JSON (fields: docs/json.md, and the man page).
        #[arg(long)]
        json: bool,
        /// List this set's rule and prefixes.
        #[arg(long, value_name = "NAME")]
        set: Option<String>,
    },
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Set {
            cidr,
            class,
            rate,
            burst,
            action,
            key_len,
            total_rate,
            total_burst,
            global,
            syn_cookies,
            syn_ack_rate,
            ban_for,
            ban_after,
            ban_within,
            ban_max,
            no_inherit,
            inherit,
            ttl,
            runtime,
            replace,
            force,
            dry_run,
            json,
            ..
        } => {
            let key_len = match key_len {
                Some(k) => Some(
                    k.parse::<u32>().map_err(|_| anyhow::anyhow!("invalid --key-len '{k}': not a number of bits"))?,
                ),
                None => None,
            };
            let ban_after = match ban_after {
                Some(n) => Some(n.parse::<u32>().map_err(|_| {
                    anyhow::anyhow!("invalid --ban-after '{n}': not a count of refused frames (1, 2, ...)")
                })?),
                None => None,
            };
            let rule = RuleConfig {
                rate,
                burst: burst.map(BurstValue::Text),
                action,
                key_len,
                total_rate,
                total_burst: total_burst.map(BurstValue::Text),
                global,
                syn_cookies,
                syn_ack_rate,
                ban_for,
                ban_after,
                ban_within,
                ban_max,
                inherit: if no_inherit { Some(false) } else { inherit.then_some(true) },
                ttl,
                ..class.rule(&cidr)?
            };
            // Validate here too, so bad input fails even with no daemon: in
            // full when the rule is whole by itself (or replaces), else the
            // fields that stand alone (the daemon checks the merged rule).
            if replace || rule.rate.is_some() || action.is_some_and(|a| !a.polices()) {
                rule.validate()?;
            } else {
                rule.check_fields()?;
            }
            if dry_run {
                let req = crate::control::Request::RuleSet { rule, runtime, replace, force };
                return super::dryrun::print(&daemon()?.dry_run(req)?, json);
            }
            println!("policer: {}", daemon()?.rule_set(rule, runtime, replace, force)?);
        }
        Cmd::Import(a) => super::import::run(*a)?,
        Cmd::Rm { set: Some(name), .. } => super::import::rm(name)?,
        Cmd::Ls { json, set: Some(name), .. } => super::import::ls(name, json)?,
        Cmd::Rm { cidr, class, runtime, set: None, dry_run, json, .. } => {
            let cidr = cidr.expect("required without --set");
            let rule = class.rule(&cidr)?;
            if dry_run {
                let req = crate::control::Request::RuleRm { rule, runtime };
                return super::dryrun::print(&daemon()?.dry_run(req)?, json);
            }
            println!("policer: {}", daemon()?.rule_rm(rule, runtime)?);
        }
        Cmd::Ls { json, set: None, .. } => {
            let rules = daemon()?.rule_ls()?;
            super::rule_list::print(&rules, json)?;
        }
    }
    Ok(())
}
