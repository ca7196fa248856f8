//! `policer rule set|rm|ls`.

use clap::Subcommand;

use super::{call, done};
use policer_common::bucket::Action;

use crate::{
    control::{Reply, Request, RuleView},
    rules::{BurstValue, RuleConfig},
};

#[derive(Subcommand)]
pub enum Cmd {
    /// Add or replace the rule for a prefix (longest prefix wins).
    Set {
        /// 203.0.113.0/24, 2001:db8::/48, or one address.
        cidr: String,
        /// Rate per source (or per --key-len group): 500pps, 10kpps, 64kbit, 10gbit.
        #[arg(long, allow_hyphen_values = true)]
        rate: Option<String>,
        /// Burst: packets, or bytes for a bit rate (1500b, 64kb).
        #[arg(long, allow_hyphen_values = true)]
        burst: Option<String>,
        #[arg(long, value_enum, default_value_t = Action::Police)]
        action: Action,
        /// Leading source bits that form one bucket (default 32 IPv4, 64 IPv6).
        #[arg(long, allow_hyphen_values = true)]
        key_len: Option<String>,
        /// Apply to the kernel only, without writing the config file (for
        /// when it cannot be written: a full disk, a read-only /etc). Shown
        /// as not persisted in `rule ls` and `status`; gone at the next
        /// start or reload.
        #[arg(long)]
        runtime: bool,
    },
    /// Remove the rule for a prefix.
    Rm {
        cidr: String,
        /// Remove from the kernel only; the config file keeps the rule.
        #[arg(long)]
        runtime: bool,
    },
    /// List the rules.
    Ls {
        #[arg(long)]
        json: bool,
    },
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Set { cidr, rate, burst, action, key_len, runtime } => {
            let key_len = match key_len {
                Some(k) => Some(
                    k.parse::<u32>().map_err(|_| anyhow::anyhow!("invalid --key-len '{k}': not a number of bits"))?,
                ),
                None => None,
            };
            let rule =
                RuleConfig { prefix: cidr, rate, burst: burst.map(BurstValue::Text), action: Some(action), key_len };
            // Validate here too, so bad input fails even with no daemon.
            rule.validate()?;
            println!("policer: {}", done(call(Request::RuleSet { rule, runtime })?));
        }
        Cmd::Rm { cidr, runtime } => {
            crate::rules::parse_prefix(&cidr)?;
            println!("policer: {}", done(call(Request::RuleRm { prefix: cidr, runtime })?));
        }
        Cmd::Ls { json } => {
            let Reply::Rules { rules } = call(Request::RuleLs)? else { unreachable!("checked by control::call") };
            print_rules(&rules, json)?;
        }
    }
    Ok(())
}

fn print_rules(rules: &[RuleView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rules)?);
        return Ok(());
    }
    let mut t = crate::report::table(&["PREFIX", "ACTION", "RATE", "BURST", "KEY-LEN", "SAVED"], 2);
    for r in rules {
        let burst = r.burst.map(|b| format!("{b} {}", if r.unit == "bytes" { "B" } else { "pkt" }));
        t.add_row(vec![
            r.prefix.clone(),
            r.action.clone(),
            r.rate.clone().unwrap_or_else(|| "-".into()),
            burst.unwrap_or_else(|| "-".into()),
            r.key_len.to_string(),
            match (r.in_force, r.persisted) {
                (false, _) => "not in force (removed with --runtime)",
                (true, true) => "yes",
                (true, false) => "no (runtime)",
            }
            .to_string(),
        ]);
    }
    println!("{t}");
    Ok(())
}
