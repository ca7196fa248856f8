//! `policer status`.

use super::daemon;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long)]
    pub(super) json: bool,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let s = daemon()?.status()?;
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
