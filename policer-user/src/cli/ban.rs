//! `policer ban PREFIX --for DURATION`, `policer ban ls`, `policer unban PREFIX`.

use clap::{Args as ClapArgs, Subcommand};

use super::daemon;
use std::io::Write;

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
    #[arg(long, conflicts_with = "state")]
    runtime: bool,
    /// Keep the ban in the state directory (STATE_DIR/bans.json), not in
    /// the config file: for bans another program manages (fail2ban's
    /// action), which stay out of the hand-managed policer.toml. Listed
    /// and counted as any manual ban, lifted by `policer unban` or at its
    /// end, kept across reloads (`--discard-runtime` too) and restarts.
    #[arg(long)]
    state: bool,
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
        return ls(json);
    }
    let (Some(cidr), Some(ttl)) = (a.cidr, a.duration) else {
        return Err(super::Usage(
            "usage: policer ban PREFIX --for DURATION [--reason TEXT] [--runtime | --state] [--force] [--dry-run [--json]]"
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
        let req = crate::control::Request::Ban { rule, runtime: a.runtime, force: a.force, state: a.state };
        return super::dryrun::print(&daemon()?.dry_run(req)?, a.json);
    }
    println!("policer: {}", daemon()?.ban(rule, a.runtime, a.force, a.state)?);
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

/// `ban ls`: each ban printed as it arrives from the daemon (it streams
/// them), so 100 000 bans start printing at once and are never one list.
fn ls(json: bool) -> anyhow::Result<()> {
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut p = Printer::new(json);
    daemon()?.ban_ls_each(&mut |b| p.row(&mut out, b))?;
    p.end(&mut out)?;
    out.flush()?;
    Ok(())
}

/// The table's first rows, whose widths set the columns'; later rows are
/// printed under them as they come (a wider cell widens its row only).
const FIRST_PAGE: usize = 1000;
const HEADERS: [&str; 6] = ["PREFIX", "ORIGIN", "REASON", "EXPIRES", "LEFT", "DROPPED"];
/// DROPPED and after are numbers: right-aligned.
const NUMERIC_FROM: usize = 5;

/// Prints `ban ls` a row at a time: `--json` as `serde_json`'s pretty
/// array would print the whole list (the same bytes), the table as
/// `crate::report::table` would (columns as wide as the first
/// [`FIRST_PAGE`] rows need).
struct Printer {
    json: bool,
    rows: u64,
    /// The first page, held until its widths are known.
    page: Vec<[String; 6]>,
    widths: Option<[usize; 6]>,
}

impl Printer {
    fn new(json: bool) -> Printer {
        Printer { json, rows: 0, page: Vec::new(), widths: None }
    }

    fn row(&mut self, w: &mut impl Write, b: BanView) -> std::io::Result<()> {
        self.rows += 1;
        if self.json {
            let text = serde_json::to_string_pretty(&b).map_err(std::io::Error::other)?;
            w.write_all(if self.rows == 1 { b"[\n" } else { b",\n" })?;
            for (i, line) in text.lines().enumerate() {
                if i > 0 {
                    w.write_all(b"\n")?;
                }
                write!(w, "  {line}")?;
            }
            return Ok(());
        }
        let cells = cells(&b);
        match self.widths {
            Some(widths) => write_row(w, &widths, &cells),
            None => {
                self.page.push(cells);
                if self.page.len() == FIRST_PAGE { self.flush_page(w) } else { Ok(()) }
            }
        }
    }

    /// The widths of the first page, its rows, and the header over them.
    fn flush_page(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        let mut widths = HEADERS.map(|h| h.chars().count());
        for r in &self.page {
            for (i, c) in r.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        write_row(w, &widths, &HEADERS.map(String::from))?;
        for r in std::mem::take(&mut self.page) {
            write_row(w, &widths, &r)?;
        }
        self.widths = Some(widths);
        Ok(())
    }

    fn end(&mut self, w: &mut impl Write) -> std::io::Result<()> {
        if self.json {
            return w.write_all(if self.rows == 0 { b"[]\n" } else { b"\n]\n" });
        }
        if self.rows == 0 {
            return writeln!(w, "no bans in force");
        }
        if self.widths.is_none() {
            self.flush_page(w)?;
        }
        Ok(())
    }
}

/// A ban's cells in the table.
fn cells(b: &BanView) -> [String; 6] {
    let origin = match (&b.origin[..], &b.rule, b.count) {
        ("auto", Some(r), Some(n)) if n > 1 => format!("auto ({r}; ban #{n})"),
        ("auto", Some(r), _) => format!("auto ({r})"),
        (o, _, _) => o.to_string(),
    };
    let left = crate::duration::format(std::time::Duration::from_millis((b.left_seconds * 1000.0) as u64));
    let dropped = crate::report::estimate(b.dropped_pkts, b.drops_margin);
    [
        b.prefix.clone(),
        origin,
        b.reason.as_deref().map_or_else(|| "-".into(), crate::text::escaped),
        b.expires.clone(),
        left,
        dropped,
    ]
}

/// One line of the table, laid out as `crate::report::table` lays it out
/// (no borders, a space either side of each cell, numbers right-aligned).
fn write_row(w: &mut impl Write, widths: &[usize; 6], cells: &[String; 6]) -> std::io::Result<()> {
    let mut line = String::new();
    for (i, c) in cells.iter().enumerate() {
        let pad = widths[i].saturating_sub(c.chars().count());
        line.push(' ');
        if i >= NUMERIC_FROM {
            line.extend(std::iter::repeat_n(' ', pad));
            line.push_str(c);
        } else {
            line.push_str(c);
            line.extend(std::iter::repeat_n(' ', pad));
        }
        line.push(' ');
    }
    writeln!(w, "{line}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ban(i: u32, origin: &str) -> BanView {
        BanView {
            prefix: format!("10.0.{}.{}/32", i / 256, i % 256),
            origin: origin.into(),
            rule: (origin == "auto").then(|| "0.0.0.0/0".to_string()),
            reason: i.is_multiple_of(3).then(|| format!("reason {i}")),
            expires: "2026-01-01T00:00:00.000Z".into(),
            left_seconds: f64::from(i) * 7.5,
            dropped_pkts: u64::from(i) * 1000,
            drops_margin: if origin == "auto" {
                policer_common::table::drop_count_margin(u64::from(i) * 1000, 6)
            } else {
                0
            },
            count: (origin == "auto").then_some(i % 4),
            length_seconds: (origin == "auto").then_some(60.0),
        }
    }

    fn printed(json: bool, bans: &[BanView]) -> String {
        let mut out = Vec::new();
        let mut p = Printer::new(json);
        for b in bans {
            p.row(&mut out, b.clone()).unwrap();
        }
        p.end(&mut out).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// Printed a row at a time, `--json` is byte for byte the pretty list.
    #[test]
    fn streamed_json_is_the_pretty_list() {
        for n in [0, 1, 3, 50] {
            let bans: Vec<BanView> =
                (0..n).map(|i| ban(i, if i.is_multiple_of(2) { "manual" } else { "auto" })).collect();
            let want = format!("{}\n", serde_json::to_string_pretty(&bans).unwrap());
            assert_eq!(printed(true, &bans), want, "{n} bans");
        }
    }

    /// Up to a page, the table is the one `report::table` prints; past it,
    /// later rows keep the first page's columns.
    #[test]
    fn streamed_table_is_the_table() {
        for n in [1, 2, 17] {
            let bans: Vec<BanView> =
                (0..n).map(|i| ban(i * 37, if i.is_multiple_of(2) { "manual" } else { "auto" })).collect();
            let mut t = crate::report::table(&HEADERS, NUMERIC_FROM);
            for b in &bans {
                t.add_row(cells(b).to_vec());
            }
            assert_eq!(printed(false, &bans), format!("{t}\n"), "{n} bans");
        }
        assert_eq!(printed(false, &[]), "no bans in force\n");
        let many: Vec<BanView> = (0..FIRST_PAGE as u32 + 5).map(|i| ban(i, "manual")).collect();
        let text = printed(false, &many);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), FIRST_PAGE + 6);
        // The columns of a late row start where the header's do.
        let col = |l: &str| l.find(" 2026").unwrap();
        assert_eq!(col(lines[FIRST_PAGE + 5]), lines[0].find(" EXPIRES").unwrap());
    }
}
