//! `policer check [FILE | --config FILE] [--json]`: validate a config file
//! the way `attach` and `reload` do, without root and without a daemon;
//! every problem of the file in one run, each with its line.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::{Config, DEFAULT_PATH, Problem};

#[derive(clap::Args)]
pub struct Args {
    /// The file to check (or give it as FILE).
    #[arg(long, default_value = DEFAULT_PATH, conflicts_with = "file")]
    config: PathBuf,
    /// The file to check, as `policer check FILE`.
    #[arg(value_name = "FILE")]
    file: Option<PathBuf>,
    /// One JSON object: {"ok", "file", "rules", "ipv4_rules", "ipv6_rules", "interfaces", "problems", "warnings"}.
    #[arg(long)]
    pub(super) json: bool,
    /// The rule limit the daemon will run with (as `attach --max-rules`).
    #[arg(long)]
    max_rules: Option<u32>,
}

#[derive(Serialize)]
struct CheckReport<'a> {
    ok: bool,
    file: String,
    rules: usize,
    ipv4_rules: usize,
    ipv6_rules: usize,
    interfaces: Vec<String>,
    problems: &'a [Problem],
    /// What is valid but worth changing (no final newline; source tables
    /// over half of this machine's memory).
    warnings: &'a [String],
}

pub fn run(mut a: Args) -> anyhow::Result<()> {
    if let Some(f) = a.file.take() {
        a.config = f;
    }
    let file = a.config.display().to_string();
    // As the daemon reads it: a regular file of bounded size, without
    // blocking on a FIFO (`files.rs`).
    let read = crate::files::read_regular(&a.config, crate::files::CONFIG);
    let text = match read.map(String::from_utf8) {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            let p =
                [Problem { line: None, message: format!("not UTF-8 text (byte {})", e.utf8_error().valid_up_to()) }];
            return finish(a.json, &file, None, &p, &[]);
        }
        Err(e) => {
            let message = match e {
                crate::files::ReadError::Io(e) => format!("cannot read it: {e}"),
                e => format!("it {e}"),
            };
            return finish(a.json, &file, None, &[Problem { line: None, message }], &[]);
        }
    };
    match Config::check_at(&text, a.max_rules, Some(&a.config)) {
        Ok((cfg, rules)) => {
            let mut warnings: Vec<String> = crate::config::final_newline_warning(&text).into_iter().collect();
            // What a start of this file will need of this machine.
            if let Some(n) = cfg.daemon.max_sources {
                match crate::loader::check_sources_here(n, "daemon.max_sources") {
                    Ok(w) => warnings.extend(w),
                    Err(message) => return finish(a.json, &file, None, &[Problem { line: None, message }], &[]),
                }
            }
            // The feed's secrets' files that others may read (the values
            // were checked with the file).
            if let Some(c) = &cfg.crowdsec
                && let Ok(s) = c.settings(a.config.parent().unwrap_or(std::path::Path::new("/")))
            {
                warnings.extend(s.warnings);
            }
            // SYN cookies: the kernel settings they need, and listeners.
            warnings.extend(crate::syncookies::warnings(rules.values()));
            // The chain's objects: there, and with a program that can join.
            let base = a.config.parent().unwrap_or(std::path::Path::new("/"));
            let chain: Vec<Problem> = cfg
                .chains
                .iter()
                .enumerate()
                .filter_map(|(i, c)| crate::chain::check_object(c, base).err().map(|e| (i, e)))
                .map(|(i, e)| Problem { line: None, message: format!("chain {}: {e}", i + 1) })
                .collect();
            if !chain.is_empty() {
                return finish(a.json, &file, None, &chain, &[]);
            }
            let v4 = rules.keys().filter(|k| matches!(k.net, ipnet::IpNet::V4(_))).count();
            finish(a.json, &file, Some((cfg, rules.len(), v4)), &[], &warnings)
        }
        Err(problems) => finish(a.json, &file, None, &problems, &[]),
    }
}

fn finish(
    json: bool,
    file: &str,
    good: Option<(Config, usize, usize)>,
    problems: &[Problem],
    warnings: &[String],
) -> anyhow::Result<()> {
    let (interfaces, rules, v4) = match &good {
        Some((cfg, n, v4)) => (cfg.daemon.interfaces.clone(), *n, *v4),
        None => (vec![], 0, 0),
    };
    if json {
        let r = CheckReport {
            ok: problems.is_empty(),
            file: file.into(),
            rules,
            ipv4_rules: v4,
            ipv6_rules: rules - v4,
            interfaces: interfaces.clone(),
            problems,
            warnings,
        };
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if problems.is_empty() {
        let ifs = if interfaces.is_empty() { "none named (give them to attach)".into() } else { interfaces.join(", ") };
        let sets = match good.as_ref().map(|g| &g.0.sets) {
            Some(s) if !s.is_empty() => {
                format!("; sets: {}", s.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "))
            }
            _ => String::new(),
        };
        println!("{file}: ok: {rules} rules ({v4} IPv4, {} IPv6){sets}; interfaces: {ifs}", rules - v4);
        for w in warnings {
            eprintln!("{file}: warning: {w}");
        }
    } else {
        for p in problems {
            match p.line {
                Some(l) => eprintln!("{file}:{l}: {}", p.message),
                None => eprintln!("{file}: {}", p.message),
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        // The problems are printed; a non-zero exit says the rest.
        Err(super::Quiet.into())
    }
}
