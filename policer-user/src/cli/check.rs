//! `policer check [--config FILE] [--json]`: validate a config file the
//! way `attach` and `reload` do, without root and without a daemon.

use std::path::PathBuf;

use serde::Serialize;

use crate::config::{Config, DEFAULT_PATH, Problem};

#[derive(clap::Args)]
pub struct Args {
    /// The file to check.
    #[arg(long, default_value = DEFAULT_PATH)]
    config: PathBuf,
    /// One JSON object: {"ok", "file", "rules", "ipv4_rules", "ipv6_rules", "interfaces", "problems"}.
    #[arg(long)]
    pub(super) json: bool,
    /// The rule limit the daemon will run with (as `attach --max-rules`).
    #[arg(long)]
    max_rules: Option<u32>,
}

#[derive(Serialize)]
struct Report<'a> {
    ok: bool,
    file: String,
    rules: usize,
    ipv4_rules: usize,
    ipv6_rules: usize,
    interfaces: Vec<String>,
    problems: &'a [Problem],
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let file = a.config.display().to_string();
    let text = match std::fs::read_to_string(&a.config) {
        Ok(t) => t,
        Err(e) => {
            let p = [Problem { line: None, message: format!("cannot read it: {e}") }];
            return finish(a.json, &file, None, &p);
        }
    };
    match Config::check(&text, a.max_rules) {
        Ok((cfg, rules)) => {
            let v4 = rules.keys().filter(|k| matches!(k.net, ipnet::IpNet::V4(_))).count();
            finish(a.json, &file, Some((cfg, rules.len(), v4)), &[])
        }
        Err(problems) => finish(a.json, &file, None, &problems),
    }
}

fn finish(json: bool, file: &str, good: Option<(Config, usize, usize)>, problems: &[Problem]) -> anyhow::Result<()> {
    let (interfaces, rules, v4) = match &good {
        Some((cfg, n, v4)) => (cfg.daemon.interfaces.clone(), *n, *v4),
        None => (vec![], 0, 0),
    };
    if json {
        let r = Report {
            ok: problems.is_empty(),
            file: file.into(),
            rules,
            ipv4_rules: v4,
            ipv6_rules: rules - v4,
            interfaces: interfaces.clone(),
            problems,
        };
        println!("{}", serde_json::to_string_pretty(&r)?);
    } else if problems.is_empty() {
        let ifs = if interfaces.is_empty() { "none named (give them to attach)".into() } else { interfaces.join(", ") };
        println!("{file}: ok: {rules} rules ({v4} IPv4, {} IPv6); interfaces: {ifs}", rules - v4);
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
