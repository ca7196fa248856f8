//! `policer status`.

use super::daemon;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub(super) json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let s = match daemon().and_then(|d| d.status()) {
        Ok(s) => s,
        // No daemon, but a program kept by --persist may be policing: say so
        // (still exit status 3: no daemon).
        Err(crate::Error::NoDaemon) => {
            let kept = crate::daemon::attached_programs();
            if kept.is_empty() {
                return Err(crate::Error::NoDaemon.into());
            }
            let on: Vec<String> = kept.iter().map(|(i, p)| format!("program {p} on {i}")).collect();
            let first = &kept[0].0;
            return Err(anyhow::Error::new(crate::Error::NoDaemon).context(format!(
                "no daemon, but policer is attached and policing with the rules it had ({}; left by a --persist \
                 exit or a daemon that died): \
                 `policer attach {first}` adopts it, `policer detach {first}` removes it",
                on.join(", ")
            )));
        }
        Err(e) => return Err(e.into()),
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
        return Ok(());
    }
    let runtime = if s.runtime_rules > 0 {
        format!(" ({} not persisted: set with --runtime; `policer rule ls` shows which)", s.runtime_rules)
    } else {
        String::new()
    };
    println!(
        "policer daemon pid {} on {}; {} rules{runtime} from {}; program {}; {}",
        s.pid,
        s.interfaces.join(", "),
        s.rules,
        s.config,
        s.program_id,
        if s.persist { "persists on exit" } else { "detaches on exit" }
    );
    if let Some(c) = &s.config_status
        && !c.last_reload_success
    {
        println!(
            "config: the last reload was not applied, the rules in force stay: {}",
            c.last_reload_error.as_deref().unwrap_or("(no reason recorded)")
        );
    }
    Ok(())
}
