//! The verbs for packagers and `cargo xtask install`: man pages and
//! shell completions, generated from the CLI definition itself (so they
//! cannot drift from it).

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::{Cli, manual};
use crate::config::schema;

#[derive(clap::Args)]
pub struct ManArgs {
    /// Directory to write policer.8 and policer-VERB.8 into.
    #[arg(long, default_value = ".")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// bash, zsh or fish.
    #[arg(required_unless_present = "list")]
    shell: Option<clap_complete::Shell>,
    /// Print the names the scripts complete from the running daemon, one
    /// per line: `sets` (for --set), `prefixes` (its rules' prefixes, for
    /// `rule set` and `rule rm`), `addresses` (their first addresses, for
    /// `inspect`), `bans` (the manual bans' prefixes, for `unban`);
    /// nothing when no daemon answers.
    #[arg(long, value_name = "WHAT", value_parser = LISTS.map(|(_, what)| what))]
    list: Option<String>,
}

/// Writes `policer.8`, one page per verb (`policer-rule-set.8` …) and
/// `policer.toml.5`.
pub fn man(a: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out)?;
    for w in write_all(&a.out)? {
        println!("{}", w.display());
    }
    Ok(())
}

/// Every page, into `dir`: the paths written.
pub(super) fn write_all(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut cmd = Cli::command().name("policer").bin_name("policer");
    // Built, so the global options reach every verb and each verb knows
    // its full name (`policer rule set`).
    cmd.build();
    let mut written = Vec::new();
    write_pages(&cmd, "policer", dir, &mut written)?;
    let path = dir.join("policer.toml.5");
    std::fs::write(&path, config_page())?;
    written.push(path);
    Ok(written)
}

/// The manual's entry for page `name`.
fn page_of(name: &str) -> anyhow::Result<&'static manual::Page> {
    manual::PAGES
        .iter()
        .find(|p| p.name == name)
        .ok_or_else(|| anyhow::anyhow!("no entry for the page {name} in cli/manual.rs"))
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if cmd.is_hide_set() {
        return Ok(());
    }
    let path = dir.join(format!("{name}.8"));
    std::fs::write(&path, verb_page(cmd, name)?)?;
    out.push(path);
    for sub in visible(cmd) {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, out)?;
    }
    Ok(())
}

/// A command's verbs as pages list them: not hidden, not clap's `help`.
fn visible(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help")
}

/// The page of one command: clap's SYNOPSIS and OPTIONS, the manual's
/// sections around them.
fn verb_page(cmd: &clap::Command, name: &str) -> anyhow::Result<String> {
    let page = page_of(name)?;
    let full = name.replace('-', " ");
    // clap names take &'static str (without its `string` feature); this
    // runs once per page.
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let mut c = cmd.clone().name(leak(name.to_string())).bin_name(leak(full.clone()));
    if !page.asks_daemon && c.get_arguments().any(|a| a.get_id() == "timeout") {
        // --timeout is the wait for a daemon's answer: not for this page.
        c = c.mut_arg("timeout", |a| a.hide(true));
    }
    let man = clap_mangen::Man::new(c).section("8").manual("policer manual");
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    let mut t = String::from_utf8(buf)?;
    t.push_str(&format!(".SH NAME\n{} \\- {}\n", esc(name), esc(page.summary)));
    let mut buf = Vec::new();
    man.render_synopsis_section(&mut buf)?;
    t.push_str(&String::from_utf8(buf)?);
    t.push_str(".SH DESCRIPTION\n");
    t.push_str(&paragraphs(page.description));
    let mut buf = Vec::new();
    man.render_options_section(&mut buf)?;
    t.push_str(&String::from_utf8(buf)?);
    let subs: Vec<&clap::Command> = visible(cmd).collect();
    if !subs.is_empty() {
        t.push_str(".SH COMMANDS\n");
        for s in subs {
            let sub = format!("{name}-{}", s.get_name());
            t.push_str(&format!(".TP\n\\fB{}\\fR(8)\n{}\n", esc(&sub), esc(page_of(&sub)?.summary)));
        }
    }
    if let Some(heading) = page.json {
        t.push_str(".SH \"JSON OUTPUT\"\n");
        t.push_str(&markdown(json_section(heading)?));
        t.push_str(&paragraphs(
            "Fields are only ever added, never renamed or removed. With --json an error is {\"error\": \"...\", \
             \"exit\": N} on stdout, with the same exit status.",
        ));
    }
    if !page.examples.is_empty() {
        t.push_str(".SH EXAMPLES\n");
        for (what, cmd) in page.examples {
            t.push_str(&format!(".PP\n{}:\n.PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n", esc(what), esc(cmd)));
        }
    }
    t.push_str(".SH \"EXIT STATUS\"\n.nf\n");
    let exit = super::EXIT_STATUS.trim_start_matches("Exit status:\n");
    t.push_str(&esc(exit));
    t.push_str("\n.fi\n");
    t.push_str(&files_section());
    if name == "policer" || name == "policer-attach" {
        t.push_str(".SH ENVIRONMENT\n");
        for (var, what) in manual::ENVIRONMENT {
            t.push_str(&format!(".TP\n\\fB{}\\fR\n{}\n", esc(var), esc(what)));
        }
    }
    let mut see: Vec<String> = Vec::new();
    if name != "policer" {
        see.push("policer(8)".into());
    }
    see.push("policer.toml(5)".into());
    see.extend(page.see_also.iter().filter(|s| **s != name).map(|s| format!("{s}(8)")));
    t.push_str(".SH \"SEE ALSO\"\n");
    let refs: Vec<String> = see
        .iter()
        .map(|r| {
            let (n, sec) = r.split_once('(').unwrap_or((r, ""));
            format!("\\fB{}\\fR({sec}", esc(n))
        })
        .collect();
    t.push_str(&refs.join(",\n"));
    t.push('\n');
    Ok(t)
}

fn files_section() -> String {
    let mut t = String::from(".SH FILES\n");
    for (f, what) in manual::FILES {
        t.push_str(&format!(".TP\n\\fI{}\\fR\n{}\n", esc(f), esc(what)));
    }
    t
}

/// policer.toml(5): every listed key of every table of the config's
/// [`schema`].
fn config_page() -> String {
    let mut t = format!(
        ".TH policer.toml 5 \"\" \"policer {}\" \"policer manual\"\n.SH NAME\npolicer.toml \\- the policer \
         daemon's config file\n.SH SYNOPSIS\n/etc/policer/policer.toml\n.SH DESCRIPTION\n",
        env!("CARGO_PKG_VERSION")
    );
    t.push_str(&paragraphs(
        "A TOML file: one [daemon] table, [[rule]] and [[set]] tables, a [crowdsec] and a [global] table (fleet budgets: \
         docs/fleet.md). The daemon starts \
         from it, writes every rule change into it (keeping its comments, order and spelling, atomically), and \
         follows it: a finished write (a close after writing, a rename over it, a symlink swap) is applied within \
         a second, as `policer reload` does. Nothing of a file is applied unless all of it is valid; `policer \
         check FILE` lists every problem with its line. Unknown keys, wrong types, a prefix and class given twice \
         and classes that could tie are errors.",
    ));
    for table in schema::TABLES {
        t.push_str(&format!(".SH \"{}\"\n", esc(table.header)));
        t.push_str(&paragraphs(table.help));
        for key in schema::KEYS.iter().filter(|k| k.table() == table.table && k.listed) {
            t.push_str(&format!(
                ".TP\n\\fB{}\\fR (\\fI{}\\fR; default: {})\n{}\n",
                esc(key.key),
                esc(key.kind),
                esc(key.default),
                inline(key.help)
            ));
        }
    }
    t.push_str(".SH EXAMPLES\n");
    t.push_str(&paragraphs("The default rules, a DNS class, and a management network that is never dropped:"));
    t.push_str(&format!(
        ".PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n",
        esc("[daemon]\ninterfaces = [\"eth0\"]\nprotect = [\"192.0.2.0/24\"]\n\n[[rule]]\nprefix = \"0.0.0.0/0\"\n\
             rate = \"10kpps\"\nburst = 200\n\n[[rule]]\nprefix = \"::/0\"\nrate = \"10kpps\"\nburst = 200\n\n\
             [[rule]]\nprefix = \"0.0.0.0/0\"\nproto = \"udp\"\ndport = 53\nrate = \"50pps\"\nburst = 100\n\n\
             [[set]]\nname = \"drop-feed\"\nfile = \"drop.txt\"\naction = \"deny\"")
    ));
    t.push_str(&files_section());
    t.push_str(".SH \"SEE ALSO\"\n\\fBpolicer\\fR(8),\n\\fBpolicer\\-check\\fR(8),\n\\fBpolicer\\-reload\\fR(8)\n");
    t
}

/// The section of docs/json.md under `heading`, up to the next one.
fn json_section(heading: &str) -> anyhow::Result<&'static str> {
    let doc = manual::JSON_DOC;
    let at = doc
        .find(&format!("\n{heading}\n"))
        .ok_or_else(|| anyhow::anyhow!("docs/json.md has no section {heading:?}"))?;
    let body = &doc[at + heading.len() + 2..];
    Ok(body.find("\n## ").map_or(body, |end| &body[..end]))
}

/// Markdown's paragraphs and code blocks as roff (`code` in bold).
fn markdown(md: &str) -> String {
    let mut t = String::new();
    for (i, part) in md.split("```").enumerate() {
        if i % 2 == 1 {
            let code = part.trim_start_matches(|c: char| c.is_alphanumeric()).trim_matches('\n');
            t.push_str(&format!(".PP\n.RS 4\n.nf\n{}\n.fi\n.RE\n", esc(code)));
        } else {
            t.push_str(&paragraphs(part));
        }
    }
    t
}

/// Paragraphs (blank-line separated; `- ` items) as roff, `code` in bold.
fn paragraphs(text: &str) -> String {
    let mut t = String::new();
    for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()) {
        if let Some(item) = para.strip_prefix("- ") {
            t.push_str(&format!(".IP \\(bu 2\n{}\n", inline(&item.replace('\n', " "))));
        } else {
            t.push_str(&format!(".PP\n{}\n", inline(&para.replace('\n', " "))));
        }
    }
    t
}

/// Escaped text with `code` spans in bold.
fn inline(s: &str) -> String {
    s.split('`')
        .enumerate()
        .map(|(i, part)| if i % 2 == 1 { format!("\\fB{}\\fR", esc(part)) } else { esc(part) })
        .collect()
}

/// Text escaped for roff: backslashes, hyphens as the minus a shell takes,
/// a control character at a line's start.
fn esc(s: &str) -> String {
    let t = s.replace('\\', "\\e").replace('-', "\\-");
    t.lines()
        .map(|l| if l.starts_with('.') || l.starts_with('\'') { format!("\\&{l}") } else { l.to_string() })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Stand-ins for what a script cannot know when it is written: each
/// becomes the shell's own way to list it (interfaces) or a call of
/// `policer completions --list` ([`LISTS`]).
const IFACES: &str = "__policer_interfaces__";
const SETS: &str = "__policer_sets__";
const PREFIXES: &str = "__policer_prefixes__";
const ADDRESSES: &str = "__policer_addresses__";
const BANS: &str = "__policer_bans__";

/// The stand-ins the running daemon fills, each with what `--list`
/// prints for it.
const LISTS: [(&str, &str); 4] = [(SETS, "sets"), (PREFIXES, "prefixes"), (ADDRESSES, "addresses"), (BANS, "bans")];

/// The values each option is completed with, where its parser alone does
/// not list them (a protocol may also be a number; flags combine): the
/// option's id, in every verb that has it.
fn hints() -> [(&'static str, Vec<&'static str>); 4] {
    [
        ("proto", vec!["tcp", "udp", "icmp", "icmpv6", "sctp", "udplite"]),
        ("tcp_flags", vec!["syn", "syn,!ack", "ack", "rst", "fin", "psh", "urg", "ece", "cwr"]),
        ("set", vec![SETS]),
        ("iface", vec![IFACES]),
    ]
}

/// The values of a verb's positional argument: the verb (its words after
/// `policer`), the argument's id, and its stand-in. A rule's prefix
/// completes from the rules in force, an address to inspect from their
/// first addresses, a ban to lift from the manual bans.
const POSITIONALS: [(&str, &str, &str); 5] = [
    ("attach", "ifaces", IFACES),
    ("rule set", "cidr", PREFIXES),
    ("rule rm", "cidr", PREFIXES),
    ("inspect", "addr", ADDRESSES),
    ("unban", "cidr", BANS),
];

/// The command the scripts are written from: the visible verbs only, and
/// the values of [`hints`] and [`POSITIONALS`] as possible values. Parsing
/// is not changed: only the scripts see these.
fn completion_command() -> clap::Command {
    /// `c`, which is the verb `verb` (its words after `policer`).
    fn shape(c: clap::Command, verb: &str) -> clap::Command {
        // Each argument given its values where it stands: `mut_arg` would
        // move it to the end, and a positional moved behind another
        // (`chain add IFACE [OBJECT]`) changes their order.
        let args: Vec<clap::Arg> = c
            .get_arguments()
            .cloned()
            .map(|a| {
                let id = a.get_id().as_str().to_string();
                let positional = POSITIONALS.iter().find(|(v, p, _)| *v == verb && *p == id).map(|(_, _, s)| vec![*s]);
                match positional.or_else(|| hints().into_iter().find(|(h, _)| *h == id).map(|(_, v)| v)) {
                    Some(vals) => a.value_parser(clap::builder::PossibleValuesParser::new(vals)),
                    None => a,
                }
            })
            .collect();
        let subs: Vec<clap::Command> = c
            .get_subcommands()
            .filter(|s| !s.is_hide_set())
            .cloned()
            .map(|s| {
                let name = s.get_name().to_string();
                shape(s, if verb.is_empty() { name } else { format!("{verb} {name}") }.as_str())
            })
            .collect();
        // clap_complete lists hidden verbs too: the command is rebuilt
        // without them (clap names are &'static str; this runs once).
        let name: &'static str = Box::leak(c.get_name().to_string().into_boxed_str());
        let mut out = clap::Command::new(name);
        out = out.args(args);
        if let Some(a) = c.get_about() {
            out = out.about(a.clone());
        }
        out.subcommands(subs)
    }
    let mut cmd = shape(Cli::command(), "").name("policer").version(env!("CARGO_PKG_VERSION"));
    cmd.build();
    cmd
}

/// The script for `shell`, its stand-ins replaced by the shell's own
/// listings.
pub(crate) fn completion_script(shell: clap_complete::Shell) -> anyhow::Result<String> {
    let mut cmd = completion_command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "policer", &mut out);
    let mut text = String::from_utf8(out)?;
    let list = |what: &str| format!("policer completions --list {what} 2>/dev/null");
    Ok(match shell {
        clap_complete::Shell::Bash => {
            text = text.replace(IFACES, "$(command ls /sys/class/net 2>/dev/null)");
            for (stand_in, what) in LISTS {
                text = text.replace(stand_in, &format!("$({})", list(what)));
            }
            text
        }
        clap_complete::Shell::Zsh => {
            text = text.replace(&format!("({IFACES})"), "_net_interfaces");
            // `{…}` actions are evaluated when completing.
            for (stand_in, what) in LISTS {
                text = text.replace(&format!("({stand_in})"), &format!("{{compadd -- $({})}}", list(what)));
            }
            text
        }
        clap_complete::Shell::Fish => {
            for (stand_in, what) in LISTS {
                text = text.replace(&format!("\"{stand_in}\\t''\""), &format!("\"({})\"", list(what)));
            }
            // fish's script completes no positional values: they are said
            // here, the interfaces of attach and detach and the daemon's
            // names.
            let fill = |stand_in: &str| match LISTS.iter().find(|(s, _)| *s == stand_in) {
                Some((_, what)) => format!("({})", list(what)),
                None => "(__fish_print_interfaces)".into(),
            };
            for (verb, stand_in) in POSITIONALS.iter().map(|(v, _, s)| (*v, *s)).chain([("detach", IFACES)]) {
                let when = match verb.split_once(' ') {
                    Some((verb, sub)) => {
                        format!("__fish_policer_using_subcommand {verb}; and __fish_seen_subcommand_from {sub}")
                    }
                    None => format!("__fish_policer_using_subcommand {verb}"),
                };
                text.push_str(&format!("complete -c policer -n \"{when}\" -f -a \"{}\"\n", fill(stand_in)));
            }
            text
        }
        _ => text,
    })
}

/// Prints the completion script for a shell, or (`--list`) the names the
/// scripts complete from the daemon.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<()> {
    if let Some(what) = a.list {
        // Quietly nothing without a daemon (or without the right to ask it).
        if let Ok(rules) = super::daemon().and_then(|d| d.rule_ls()) {
            let rules = rules.into_iter();
            let mut names: Vec<String> = match what.as_str() {
                "sets" => rules.filter_map(|r| r.set).collect(),
                "bans" => rules.filter(|r| r.ban && r.in_force).map(|r| r.prefix).collect(),
                prefixes => {
                    let rules = rules.filter(|r| r.set.is_none() && !r.ban && r.in_force);
                    if prefixes == "addresses" {
                        rules
                            .map(|r| r.prefix.split_once('/').map_or(r.prefix.clone(), |(a, _)| a.to_string()))
                            .collect()
                    } else {
                        rules.map(|r| r.prefix).collect()
                    }
                }
            };
            names.sort();
            names.dedup();
            for n in names {
                println!("{n}");
            }
        }
        return Ok(());
    }
    let shell = a.shell.ok_or_else(|| super::Usage("a shell: bash, zsh or fish".into()))?;
    print!("{}", completion_script(shell)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_verb_and_completions_for_three_shells() {
        let dir = tempfile::tempdir().unwrap();
        let pages = write_all(dir.path()).unwrap();
        let names: Vec<String> = pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for want in [
            "policer.8",
            "policer-attach.8",
            "policer-rule-set.8",
            "policer-inspect.8",
            "policer-check.8",
            "policer.toml.5",
        ] {
            assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
        }
        // `man` and `completions` are verbs with pages of their own (`policer
        // --help` lists them); `help` is clap's, with none.
        for want in ["policer-man.8", "policer-completions.8"] {
            assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("help")), "a page for clap's help: {names:?}");
        // Every entry of the manual is a page (none left over).
        for p in manual::PAGES {
            assert!(names.contains(&format!("{}.8", p.name)), "cli/manual.rs has {} but no such verb", p.name);
        }
        let main = std::fs::read_to_string(dir.path().join("policer.8")).unwrap();
        assert!(main.contains(".TH policer 8") && main.contains("inspect"), "{main}");
        // The exit codes, each on its line, under EXIT STATUS.
        let exit = main.split_once(".SH \"EXIT STATUS\"").map(|(_, t)| t).unwrap_or_else(|| panic!("{main}"));
        for code in ["0  done", "1  refused or invalid", "2  usage", "3  no daemon runs"] {
            assert!(exit.contains(code), "no {code:?} in the EXIT STATUS of:\n{main}");
        }
        // Every page: the sections, and references only to pages that exist.
        for (name, path) in names.iter().zip(&pages) {
            let text = std::fs::read_to_string(path).unwrap();
            for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "FILES", "\"SEE ALSO\""] {
                assert!(text.contains(&format!(".SH {section}\n")), "{name} has no {section}");
            }
            if name.ends_with(".8") {
                for section in ["OPTIONS", "EXAMPLES", "\"EXIT STATUS\""] {
                    assert!(text.contains(&format!(".SH {section}\n")), "{name} has no {section}");
                }
            }
            for r in references(&text) {
                assert!(names.contains(&r), "{name} refers to {r}, which is not a page");
            }
        }
        // --timeout only where a daemon is asked.
        let check = std::fs::read_to_string(dir.path().join("policer-check.8")).unwrap();
        let set = std::fs::read_to_string(dir.path().join("policer-rule-set.8")).unwrap();
        assert!(!check.contains("\\-\\-timeout") && set.contains("\\-\\-timeout"));
        // The JSON schemas are docs/json.md's.
        let stats = std::fs::read_to_string(dir.path().join("policer-stats.8")).unwrap();
        assert!(stats.contains(".SH \"JSON OUTPUT\"") && stats.contains("recall_capacity"), "{stats}");
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let text = completion_script(shell).unwrap();
            assert!(text.contains("inspect") && text.contains("max-rules"), "{shell:?}");
            // Every verb `policer --help` lists, `man` and `completions` too.
            for verb in ["man", "completions"] {
                let offered = match shell {
                    clap_complete::Shell::Bash => format!("policer,{verb})"),
                    clap_complete::Shell::Zsh => format!("'{verb}:"),
                    _ => format!("-a \"{verb}\""),
                };
                assert!(text.contains(&offered), "{shell:?} does not offer {verb}");
            }
            // Values: protocols, actions, modes, interfaces, sets.
            for want in ["udplite", "monitor", "native", "syn,!ack"] {
                assert!(text.contains(want), "{shell:?} does not complete {want}");
            }
            assert!(!text.contains("__policer_"), "{shell:?}: a stand-in left");
            // The daemon's names (the observe tier asks each shell).
            for what in ["sets", "prefixes", "addresses", "bans"] {
                assert!(text.contains(&format!("policer completions --list {what} ")), "{shell:?}: no {what}");
            }
        }
    }

    /// `\fBNAME\fR(N)` references in a page, as file names (`NAME.N`).
    fn references(roff: &str) -> Vec<String> {
        let mut out = Vec::new();
        for (i, _) in roff.match_indices("\\fB") {
            let rest = &roff[i + 3..];
            let Some(end) = rest.find("\\fR(") else { continue };
            let name = rest[..end].replace("\\-", "-");
            let sec: String = rest[end + 4..].chars().take_while(char::is_ascii_digit).collect();
            if !sec.is_empty() && !name.contains(' ') {
                out.push(format!("{name}.{sec}"));
            }
        }
        out
    }

    /// Every option and argument of every verb has help: a page never
    /// lists a bare flag.
    #[test]
    fn every_option_has_help() {
        let mut cmd = Cli::command();
        cmd.build();
        fn walk(c: &clap::Command, path: &str, bad: &mut Vec<String>) {
            for a in c.get_arguments().filter(|a| !a.is_hide_set()) {
                let help = a.get_help().or(a.get_long_help()).map(|h| h.to_string()).unwrap_or_default();
                if help.trim().len() < 4 {
                    bad.push(format!("{path} {}", a.get_id()));
                }
            }
            for s in visible(c) {
                walk(s, &format!("{path} {}", s.get_name()), bad);
            }
        }
        let mut bad = Vec::new();
        walk(&cmd, "policer", &mut bad);
        assert!(bad.is_empty(), "options without help: {bad:?}");
    }

    /// policer.toml(5) names every key of every table the file is
    /// written from (serde's structs, whose fields the schema's test holds
    /// to the keys the reader takes), and no other: the page's lists,
    /// read back from the page, against the structs' field names.
    #[test]
    fn the_config_page_has_every_key() {
        use crate::config::schema::{Table, serde_fields};
        let page = config_page();
        // `.SH "[[rule]]"` heads a table; `.TP` and `\fBkey\fR (` a key.
        let mut on_page: Vec<(String, Vec<String>)> = Vec::new();
        let mut lines = page.lines().peekable();
        while let Some(line) = lines.next() {
            if let Some(head) = line.strip_prefix(".SH \"[").and_then(|h| h.strip_suffix("]\"")) {
                on_page.push((head.trim_matches(['[', ']']).to_string(), Vec::new()));
            } else if line == ".TP"
                && let Some((_, keys)) = on_page.last_mut()
                && let Some(key) = lines.peek().and_then(|l| l.strip_prefix("\\fB")?.split_once("\\fR (").map(|k| k.0))
            {
                keys.push(key.replace("\\-", "-"));
            }
        }
        let structs = [
            (Table::Daemon, serde_fields::<crate::config::DaemonConfig>()),
            (Table::Rule, serde_fields::<crate::rules::RuleConfig>()),
            (Table::Set, serde_fields::<crate::config::SetConfig>()),
            (Table::Crowdsec, serde_fields::<crate::crowdsec::CrowdsecConfig>()),
            (Table::Chain, serde_fields::<crate::chain::ChainConfig>()),
            (Table::Global, serde_fields::<crate::fleet::GlobalConfig>()),
        ];
        let tables: Vec<&str> = on_page.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tables, ["daemon", "rule", "set", "crowdsec", "chain", "global"], "the page's tables");
        for ((name, mut keys), (table, fields)) in on_page.into_iter().zip(structs) {
            assert_eq!(name, table.name());
            // `ttl` is on the wire only: a file may not hold it.
            let mut fields: Vec<String> =
                fields.into_iter().filter(|f| !(table == Table::Rule && *f == "ttl")).map(str::to_string).collect();
            keys.sort();
            fields.sort();
            assert_eq!(keys, fields, "[{name}]: policer.toml(5) and the config's struct disagree");
        }
    }
}
