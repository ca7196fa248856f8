//! `policer status`: the running daemon (version, uptime, interfaces and
//! their modes, config and whether it is read-only, rules, sets, bans,
//! protected prefixes, running captures, metrics); with no daemon, whether
//! a kept program is policing anyway.

use super::daemon;
use crate::control::{FeedStatus, StatusView};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// One JSON object: the daemon's status; with no daemon, an error
    /// object that names any program still policing (exit status 3).
    #[arg(long)]
    pub(super) json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let s = match daemon().and_then(|d| d.status()) {
        Ok(s) => s,
        // No daemon, but a program kept by --persist may be policing: say so
        // (still exit status 3: no daemon).
        Err(crate::Error::NoDaemon) => return no_daemon(a.json),
        Err(e) => return Err(e.into()),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    print_daemon(&s);
    print_config(&s);
    print_enforced(&s);
    print_syn_cookies(&s);
    for f in &s.feeds {
        print_feed(f);
    }
    for l in s.fleet.iter().flat_map(crate::report::fleet_lines) {
        println!("{l}");
    }
    for c in s.chains.iter().flatten() {
        println!("chain on {}: {}", c.interface, super::chain::summary(c));
    }
    if s.version.is_some() {
        match &s.metrics {
            Some(m) => println!("metrics: http://{m}/metrics"),
            None => println!("metrics: not served (attach --metrics ADDR serves them)"),
        }
    }
    Ok(())
}

/// The daemon (version, pid, uptime, program, what it does on exit) and
/// its interfaces with their modes.
fn print_daemon(s: &StatusView) {
    let version = s.version.as_deref().map_or_else(|| "policer daemon".to_string(), |v| format!("policer {v} daemon"));
    let up = s
        .uptime_seconds
        .map(|u| format!(", up {}", crate::duration::format(std::time::Duration::from_secs(u as u64))))
        .unwrap_or_default();
    println!(
        "{version} pid {}{up}; program {}; {}",
        s.pid,
        s.program_id,
        if s.persist { "keeps policing on exit (--persist)" } else { "detaches on exit" }
    );
    let ifaces = if s.interface_modes.is_empty() {
        s.interfaces.join(", ")
    } else {
        s.interface_modes
            .iter()
            .map(|i| match (&i.attached, &i.detached_since) {
                (Some(false), Some(t)) => format!("{} (NOT ATTACHED since {t}: removed from outside)", i.name),
                _ => format!("{} ({})", i.name, i.mode),
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!("interfaces: {ifaces}");
}

/// The config file, whether it is writable, its rules, and a last reload
/// that was not applied.
fn print_config(s: &StatusView) {
    let runtime = if s.runtime_rules > 0 {
        format!(" ({} not persisted: set or removed with --runtime; `policer rule ls` shows which)", s.runtime_rules)
    } else {
        String::new()
    };
    let writable = match &s.config_status {
        Some(c) if c.read_only => "; read-only: rule changes need --runtime",
        Some(_) => "; writable",
        None => "",
    };
    println!("config: {}{writable}; {} rules{runtime}", s.config, s.rules);
    if let Some(c) = &s.config_status
        && !c.last_reload_success
    {
        println!(
            "config: the last reload was not applied, the rules in force stay: {}",
            c.last_reload_error.as_deref().unwrap_or("(no reason recorded)")
        );
    }
}

/// The sets, bans, protected prefixes and running captures, each when the
/// daemon says them.
fn print_enforced(s: &StatusView) {
    if let Some(sets) = &s.sets {
        let text = if sets.is_empty() {
            "none".to_string()
        } else {
            sets.iter()
                .map(|x| match x.origin.as_deref() {
                    Some(o) if o != "saved" => format!("{} ({}, {} entries, {o})", x.name, x.action, x.entries),
                    _ => format!("{} ({}, {} entries)", x.name, x.action, x.entries),
                })
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!("sets: {text}");
    }
    if let Some(b) = s.bans {
        println!("bans: {} manual, {} automatic (`policer ban ls` lists them)", b.manual, b.auto);
    }
    if let Some(p) = &s.protect {
        let text = if p.is_empty() { "none".to_string() } else { format!("{} (never dropped)", p.join(", ")) };
        println!("protect: {text}");
    }
    match s.captures {
        Some(0) => println!("captures: none running"),
        Some(n) => println!("captures: {n} running (`policer stats` counts their frames)"),
        None => {}
    }
}

/// A decision feed: where it pulls from, into which set, what is in force,
/// and how its last pull went.
fn print_feed(f: &FeedStatus) {
    let when = |t: f64| {
        if t <= 0.0 { "never".to_string() } else { crate::duration::rfc3339((t * 1000.0) as u64) }
    };
    let state = if f.last_sync_success {
        // A success with a note: a whole answer doubted (crowdsec).
        let note = f.last_error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default();
        format!("last pull ok at {}{note}", when(f.last_sync_timestamp_seconds))
    } else {
        format!(
            "last pull FAILED at {} ({}); last success {}",
            when(f.last_sync_timestamp_seconds),
            f.last_error.as_deref().unwrap_or("no reason recorded"),
            when(f.last_success_timestamp_seconds)
        )
    };
    let skipped: u64 = f.skipped.values().sum();
    // The set's entries are the prefixes less those left out: said, so
    // the feed's count and the set's agree.
    let left_out = match (f.left_out_protected, f.left_out_rule_prefix) {
        (0, 0) => String::new(),
        (p, r) => {
            format!(", {} of them left out of the set ({p} inside protected prefixes, {r} at a rule's prefix)", p + r)
        }
    };
    println!(
        "feed: {} {} into set '{}': {} decisions in force ({} prefixes{left_out}), {skipped} not applied; {state}{}",
        f.kind,
        f.url,
        f.set,
        f.decisions,
        f.prefixes,
        if f.publish { format!("; publishes automatic bans ({} posted)", f.published) } else { String::new() }
    );
}

/// No daemon: exit status 3, and any policer program left attached named
/// with its id (a `--persist` exit, or a daemon that died): it polices
/// with the rules it had.
fn no_daemon(json: bool) -> anyhow::Result<()> {
    let kept = crate::daemon::attached_programs();
    if kept.is_empty() {
        return Err(crate::Error::NoDaemon.into());
    }
    let on: Vec<String> = kept.iter().map(|(i, p)| format!("program {p} on {i}")).collect();
    let first = &kept[0].0;
    let message = format!(
        "no daemon, but policer is attached and policing with the rules it had ({}; left by a --persist \
         exit or a daemon that died): `policer attach {first}` adopts it, `policer detach {first}` removes it",
        on.join(", ")
    );
    if json {
        let programs: Vec<serde_json::Value> =
            kept.iter().map(|(i, p)| serde_json::json!({ "interface": i, "program_id": p })).collect();
        let v = serde_json::json!({
            "error": format!("{message}: {}", crate::Error::NoDaemon),
            "exit": super::Cli::EXIT_NO_DAEMON,
            "daemon": false,
            "policing": programs,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
        // Printed; the exit status is still "no daemon".
        return Err(anyhow::Error::new(crate::Error::NoDaemon).context(super::Quiet));
    }
    Err(anyhow::Error::new(crate::Error::NoDaemon).context(message))
}

/// The rules with SYN cookies, their counters, and the kernel settings
/// they need that are not set.
fn print_syn_cookies(s: &StatusView) {
    for y in &s.syn_cookies {
        let (mode, c) = (&y.counters.mode, &y.counters.counters);
        println!(
            "syn cookies: {} ({}): {} SYNs of unverified sources, {} cookies sent, {} held back by the cap, \
             {} ACKs accepted, {} refused, {} sources verified",
            y.rule, mode, c.syns, c.cookies_sent, c.synacks_capped, c.acks_accepted, c.acks_refused, c.sources_verified
        );
    }
    for w in &s.syn_cookie_warnings {
        println!("syn cookies: warning: {w}");
    }
}
