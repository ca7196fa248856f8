//! The table of rules that `rule ls` prints, and `rule ls --set NAME`
//! above the set's entries: a module of its own so that `rule.rs` (which
//! dispatches to `import.rs`) and `import.rs` both stand on it.

use crate::control::RuleView;

/// The BANS column: a manual ban and its reason, or a rule's automatic bans.
fn bans_text(r: &RuleView) -> String {
    if r.ban {
        return match &r.reason {
            Some(why) => format!("manual ban: {}", crate::text::escaped(why)),
            None => "manual ban".into(),
        };
    }
    match &r.ban_for {
        Some(f) => {
            let mut s = format!("{f} after {}", r.ban_after.unwrap_or(1));
            if let Some(w) = &r.ban_within {
                s.push_str(&format!(" within {w}"));
            }
            if let Some(m) = &r.ban_max {
                s.push_str(&format!(", up to {m}"));
            }
            s
        }
        None => "-".into(),
    }
}

/// `rule ls` and the rule line of `rule ls --set NAME`: the rules as a
/// table, or as JSON.
pub(super) fn print(rules: &[RuleView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(rules)?);
        return Ok(());
    }
    let mut t = crate::report::table(
        &[
            "PREFIX",
            "CLASS",
            "ACTION",
            "RATE",
            "BURST",
            "TOTAL",
            "SYN-COOKIES",
            "KEY-LEN",
            "BANS",
            "EXPIRES",
            "SAVED",
            "ENTRIES",
        ],
        2,
    );
    for r in rules {
        let burst = r.burst.map(|b| format!("{b} {}", if r.unit == "bytes" { "B" } else { "pkt" }));
        let total = r.total_rate.as_ref().map(|t| {
            let global = r.global.as_ref().map(|g| format!(", global {g}")).unwrap_or_default();
            format!("{t}, burst {}{global}", r.total_burst.unwrap_or(0))
        });
        t.add_row(vec![
            r.prefix.clone(),
            if r.class.is_empty() { "-".into() } else { r.class.clone() },
            r.action.clone(),
            r.rate.clone().unwrap_or_else(|| "-".into()),
            burst.unwrap_or_else(|| "-".into()),
            total.unwrap_or_else(|| "-".into()),
            match (&r.syn_cookies, r.syn_ack_rate) {
                (Some(m), Some(cap)) => format!("{m}, cap {cap}/s per /24"),
                (Some(m), None) => m.clone(),
                _ => "-".into(),
            },
            r.key_len.to_string(),
            bans_text(r),
            r.expires.clone().unwrap_or_else(|| "-".into()),
            match (r.in_force, r.persisted, r.origin.as_deref()) {
                (false, _, _) => "not in force (removed with --runtime)",
                (true, _, Some("config")) => "config ([[set]])",
                (true, true, _) => "yes",
                (true, false, _) => "no (runtime)",
            }
            .to_string(),
            r.entries.map_or_else(|| "-".into(), |n| n.to_string()),
        ]);
    }
    println!("{t}");
    Ok(())
}
