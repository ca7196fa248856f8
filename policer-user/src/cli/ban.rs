//! `policer ban PREFIX --for DURATION`, `policer ban ls`, `policer unban PREFIX`.

use clap::{Args as ClapArgs, Subcommand};

use super::daemon;
use crate::{control::BanView, rules::RuleConfig};

#[derive(ClapArgs)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// The prefix or address to ban: every frame from it is dropped, whatever
    /// rule it (or a more specific prefix) has, until the ban ends.
    #[arg(required = true)]
    cidr: Option<String>,
    /// How long: 500ms, 30s, 10m, 1h, 7d (kept across restarts as an
    /// absolute time).
    #[arg(long = "for", value_name = "DURATION", allow_hyphen_values = true, required = true)]
    duration: Option<String>,
    /// Why, for `ban ls` and the config file: one line of at most 200
    /// characters, plain text (no control characters, bidi overrides or
    /// isolates, or line and paragraph separators, which would make it, or
    /// what is shown after it, read otherwise than it was written).
    #[arg(long, value_name = "TEXT", allow_hyphen_values = true)]
    reason: Option<String>,
    /// Apply to the kernel only, without writing the config file (kept
    /// across reloads; gone at the next start or `reload --discard-runtime`).
    #[arg(long)]
    runtime: bool,
    /// Allow a ban of a whole family (`0.0.0.0/0`, `::/0`), which drops
    /// every source, the operator's own sessions included.
    #[arg(long)]
    force: bool,
    /// Show what the ban would do, and change nothing: the ban added or
    /// replaced (field by field), and which sources live in the bucket
    /// table now would go from pass to drop. Refused exactly as the ban
    /// would be. See docs/dry-run.md.
    #[arg(long)]
    dry_run: bool,
    /// With --dry-run: print it as JSON (docs/json.md).
    #[arg(long, requires = "dry_run")]
    json: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// List the bans in force: manual ones and automatic ones (--ban-for).
    Ls {
        /// Print JSON (fields: docs/json.md, and the man page).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        wait: super::Wait,
    },
}

#[derive(ClapArgs)]
pub struct UnbanArgs {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// A manual ban's prefix; automatic bans of sources in it are lifted too.
    cidr: String,
    /// Lift in the kernel only; the config file keeps a manual ban.
    #[arg(long)]
    runtime: bool,
}

impl Args {
    /// The --timeout given (`ban ls --timeout`, or the ban's).
    pub(super) fn wait(&self) -> super::Wait {
        match &self.cmd {
            Some(Cmd::Ls { wait, .. }) => *wait,
            None => self.wait,
        }
    }

    pub fn json(&self) -> bool {
        self.json || matches!(self.cmd, Some(Cmd::Ls { json: true, .. }))
    }
}

pub fn run(a: Args) -> anyhow::Result<()> {
    if let Some(Cmd::Ls { json, .. }) = a.cmd {
        let bans = daemon()?.ban_ls()?;
        return print_bans(&bans, json);
    }
    let (Some(cidr), Some(ttl)) = (a.cidr, a.duration) else {
        return Err(super::Usage(
            "usage: policer ban PREFIX --for DURATION [--reason TEXT] [--runtime] [--force] [--dry-run [--json]]"
                .into(),
        )
        .into());
    };
    let rule = RuleConfig { prefix: cidr, ban: Some(true), ttl: Some(ttl), reason: a.reason, ..RuleConfig::default() };
    // Bad input fails here too, with no daemon.
    let spec = rule.validate()?;
    rule.check_reason()?;
    if let Some(note) = crate::prefix::mapped_note(&rule.prefix, &spec.net) {
        eprintln!("policer: note: {note}");
    }
    if a.dry_run {
        let req = crate::control::Request::Ban { rule, runtime: a.runtime, force: a.force };
        return super::dryrun::print(&daemon()?.dry_run(req)?, a.json);
    }
    println!("policer: {}", daemon()?.ban(rule, a.runtime, a.force)?);
    Ok(())
}

pub fn unban(a: UnbanArgs) -> anyhow::Result<()> {
    let net = crate::prefix::parse_prefix(&a.cidr)?;
    if let Some(note) = crate::prefix::mapped_note(&a.cidr, &net) {
        eprintln!("policer: note: {note}");
    }
    println!("policer: {}", daemon()?.unban(a.cidr, a.runtime)?);
    Ok(())
}

fn print_bans(bans: &[BanView], json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(bans)?);
        return Ok(());
    }
    if bans.is_empty() {
        println!("no bans in force");
        return Ok(());
    }
    let mut t = crate::report::table(&["PREFIX", "ORIGIN", "REASON", "EXPIRES", "LEFT", "DROPPED"], 5);
    for b in bans {
        let origin = match (&b.origin[..], &b.rule, b.count) {
            ("auto", Some(r), Some(n)) if n > 1 => format!("auto ({r}; ban #{n})"),
            ("auto", Some(r), _) => format!("auto ({r})"),
            (o, _, _) => o.to_string(),
        };
        let left = crate::duration::format(std::time::Duration::from_millis((b.left_seconds * 1000.0) as u64));
        let dropped = if b.origin == "auto" { format!("~{}", b.dropped_pkts) } else { b.dropped_pkts.to_string() };
        t.add_row(vec![
            b.prefix.clone(),
            origin,
            b.reason.as_deref().map_or_else(|| "-".into(), crate::text::escaped),
            b.expires.clone(),
            left,
            dropped,
        ]);
    }
    println!("{t}");
    Ok(())
}
