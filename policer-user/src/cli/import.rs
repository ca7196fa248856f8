//! `policer rule import FILE`, `rule ls --set NAME`, `rule rm --set NAME`:
//! named sets of prefixes (see `crate::sets`).

use clap::Args as ClapArgs;
use policer_common::bucket::Action;

use super::daemon;
use crate::rules::{BurstValue, RuleConfig};

#[derive(ClapArgs)]
pub struct Args {
    #[command(flatten)]
    pub(super) wait: super::Wait,
    /// One prefix or address per line; `#` and `;` start comments (a whole
    /// line or after the prefix, as in Spamhaus DROP: `1.2.3.0/24 ;
    /// SBL123`), blank lines are fine, and so is a UTF-8 byte order mark at
    /// the start. All or nothing: one bad line and nothing is imported (the
    /// file and line are named). IPv4-mapped IPv6 entries (::ffff:a.b.c.d[/96+N]) are taken
    /// as the IPv4 prefixes they are (/N), and the outcome says how many.
    /// A regular file of at most 1 GiB; a file with no entries is refused
    /// (an empty feed is a failed download more often than a wish).
    #[arg(required_unless_present = "mmdb", conflicts_with = "mmdb")]
    file: Option<String>,
    /// A MaxMind DB file instead of a list (GeoLite2/GeoIP2 Country or
    /// ASN, DB-IP lite, IPinfo lite): the set is every network of it, IPv4
    /// and IPv6, whose country is one of --country or whose AS is one of
    /// --asn. Needs --set: the database is the whole set, replaced as a
    /// new list replaces it. A file that does not open, holds no network,
    /// is cut short or has none of them changes nothing. `inspect ADDR`
    /// names the country or AS that put a source in the set.
    #[arg(long, value_name = "FILE", requires = "set")]
    mmdb: Option<String>,
    /// With --mmdb: the countries, ISO 3166-1 codes (DE,FR).
    #[arg(long, value_name = "CC[,CC…]", requires = "mmdb")]
    country: Option<String>,
    /// With --mmdb: the AS numbers (64500,AS64501).
    #[arg(long, value_name = "N[,N…]", requires = "mmdb")]
    asn: Option<String>,
    /// What the set does to its sources. A prefix in several sets takes
    /// the value of one: deny over police over monitor over allow, and
    /// between sets of one action the name that sorts first.
    #[arg(long, value_enum, default_value_t = Action::Deny)]
    action: Action,
    /// Rate per source, needed by police and monitor sets: 500pps, 10kpps,
    /// 64kbit.
    #[arg(long, allow_hyphen_values = true)]
    rate: Option<String>,
    /// Burst: packets, or bytes for a bit rate.
    #[arg(long, allow_hyphen_values = true)]
    burst: Option<String>,
    /// Leading source bits that form one bucket (default 32 IPv4, 64 IPv6).
    #[arg(long, allow_hyphen_values = true)]
    key_len: Option<String>,
    /// Remove the set this long from now (500ms, 30s, 10m, 1h, 7d); without
    /// --set the prefixes go to a set of their own that ends then. Kept
    /// across restarts as an absolute time.
    #[arg(long, allow_hyphen_values = true, value_name = "DURATION")]
    ttl: Option<String>,
    /// The file becomes the whole of this set: prefixes not in it leave,
    /// new ones come, in one change. Without it the prefixes are added to
    /// the set named after the action and rate (`deny`, `police-100pps`).
    #[arg(long, value_name = "NAME")]
    set: Option<String>,
    /// With --set: the most entries the new file may remove from the set,
    /// a share of its entries (50%, 12.5%) or a count (1000). More is
    /// refused with nothing changed: a feed cut short or a failed download
    /// would otherwise open a blocklist. Default 50%.
    #[arg(long, value_name = "N|P%", requires = "set")]
    max_remove: Option<String>,
    /// With --set: replace the set however many entries that removes.
    #[arg(long, requires = "set", conflicts_with = "max_remove")]
    force: bool,
    /// Load the set into the running daemon only: no state file is
    /// written (for a state directory that cannot be written), and the set
    /// is gone when the daemon stops. A saved set of the same name is left
    /// as saved and comes back at the next start.
    #[arg(long)]
    runtime: bool,
    /// Leave out the entries inside a protected prefix (`protect` in
    /// [daemon]) instead of refusing the whole file: the answer counts
    /// them and names the first (for a feed imported from a timer, which
    /// cannot be told to fix one line). The state file holds what was
    /// imported.
    #[arg(long)]
    skip_protected: bool,
    /// Print the outcome as JSON: {"message", "set", "action", "rate",
    /// "entries", "added", "changed", "removed", "unchanged", "duplicates",
    /// "mapped", "shadowed", "saved", "expires"}.
    #[arg(long)]
    pub json: bool,
    /// Show what the import would do, and change nothing: the set's
    /// entries in and out (counts and the first 20 of each), its rule's
    /// changes, and which sources live in the bucket table now would go
    /// from pass to drop or back. Refused exactly as the import would be
    /// (a bad line, --max-remove, a conflict). See docs/dry-run.md.
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let key_len = match &a.key_len {
        Some(k) => {
            Some(k.parse::<u32>().map_err(|_| anyhow::anyhow!("invalid --key-len '{k}': not a number of bits"))?)
        }
        None => None,
    };
    if let Some(t) = &a.ttl {
        crate::duration::parse(t)?;
    }
    if let Some(n) = &a.set {
        crate::sets::check_name(n)?;
    }
    let max_remove = match &a.max_remove {
        Some(m) => Some(m.parse::<crate::sets::MaxRemove>().map_err(|e| anyhow::anyhow!(e))?),
        None => None,
    };
    let rule = RuleConfig {
        action: Some(a.action),
        rate: a.rate,
        burst: a.burst.map(BurstValue::Text),
        key_len,
        ttl: a.ttl,
        ..RuleConfig::default()
    };
    let mmdb = match &a.mmdb {
        Some(_) => Some(crate::mmdb::Query::parse(a.country.as_deref(), a.asn.as_deref())?),
        None => None,
    };
    let file = a.mmdb.or(a.file).unwrap_or_default();
    // The daemon reads the file itself (a million lines are not sent over
    // the socket): a relative path is resolved here, against where the
    // user is.
    let path = std::path::absolute(&file).map_err(|e| anyhow::anyhow!("{file}: {e}"))?;
    if let Err(e) = std::fs::metadata(&path) {
        anyhow::bail!("{file}: {e}; nothing imported");
    }
    let req = crate::control::Request::Import {
        path: path.to_string_lossy().into_owned(),
        shown: file,
        set: a.set,
        rule,
        max_remove,
        force: a.force,
        runtime: a.runtime,
        skip_protected: a.skip_protected,
        mmdb,
    };
    if a.dry_run {
        return super::dryrun::print(&daemon()?.dry_run(req)?, a.json);
    }
    let (msg, counts) = daemon()?.import(req)?;
    if a.json {
        let mut v = serde_json::to_value(counts.unwrap_or_default())?;
        if let Some(o) = v.as_object_mut() {
            o.insert("message".into(), msg.into());
        }
        println!("{v}");
    } else {
        println!("policer: {msg}");
    }
    Ok(())
}

pub fn rm(name: String) -> anyhow::Result<()> {
    println!("policer: {}", daemon()?.set_rm(name)?);
    Ok(())
}

pub fn ls(name: String, json: bool) -> anyhow::Result<()> {
    let v = daemon()?.set_ls(name)?;
    if json {
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    super::rule_list::print(std::slice::from_ref(&v.rule), false)?;
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for e in &v.entries {
        writeln!(out, "{e}")?;
    }
    Ok(())
}
