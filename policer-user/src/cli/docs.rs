//! Hidden verbs for packagers and `cargo xtask install`: man pages and
//! shell completions, generated from the CLI definition itself (so they
//! cannot drift from it).

use std::path::{Path, PathBuf};

use clap::CommandFactory;

use super::Cli;

#[derive(clap::Args)]
pub struct ManArgs {
    /// Directory to write policer.8 and policer-VERB.8 into.
    #[arg(long, default_value = ".")]
    out: PathBuf,
}

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// bash, zsh or fish.
    shell: clap_complete::Shell,
}

/// Writes `policer.8` and one page per verb (`policer-rule-set.8` …).
pub fn man(a: ManArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&a.out)?;
    let cmd = Cli::command().name("policer");
    let mut written = Vec::new();
    write_pages(&cmd, "policer", &a.out, &mut written)?;
    for w in written {
        println!("{}", w.display());
    }
    Ok(())
}

fn write_pages(cmd: &clap::Command, name: &str, dir: &Path, out: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    if cmd.is_hide_set() {
        return Ok(());
    }
    // clap names take &'static str (without its `string` feature); this
    // runs once, to write a handful of pages.
    let static_name: &'static str = Box::leak(name.to_string().into_boxed_str());
    let page = clap_mangen::Man::new(cmd.clone().name(static_name)).section("8");
    let path = dir.join(format!("{name}.8"));
    let mut buf = Vec::new();
    page.render(&mut buf)?;
    // clap_mangen puts the top command's after-help (the exit codes) under
    // EXTRA; man-pages(7) names that section EXIT STATUS.
    let text = String::from_utf8(buf)?;
    let text = if name == "policer" { text.replacen(".SH EXTRA", ".SH \"EXIT STATUS\"", 1) } else { text };
    std::fs::write(&path, text)?;
    out.push(path);
    for sub in cmd.get_subcommands() {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, out)?;
    }
    Ok(())
}

/// Prints the completion script for a shell.
pub fn completions(a: CompletionsArgs) -> anyhow::Result<()> {
    let mut cmd = Cli::command();
    clap_complete::generate(a.shell, &mut cmd, "policer", &mut std::io::stdout());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_per_verb_and_completions_for_three_shells() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = Cli::command().name("policer");
        let mut pages = Vec::new();
        write_pages(&cmd, "policer", dir.path(), &mut pages).unwrap();
        let names: Vec<String> = pages.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
        for want in ["policer.8", "policer-attach.8", "policer-rule-set.8", "policer-inspect.8", "policer-check.8"] {
            assert!(names.iter().any(|n| n == want), "no {want} in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("completions") || n.contains("-man")), "hidden verbs: {names:?}");
        let main = std::fs::read_to_string(dir.path().join("policer.8")).unwrap();
        assert!(main.contains(".TH policer 8") && main.contains("inspect"), "{main}");
        // The exit codes, each on its line, under EXIT STATUS.
        let exit = main.split_once(".SH \"EXIT STATUS\"").map(|(_, t)| t).unwrap_or_else(|| panic!("{main}"));
        for code in ["0  done", "1  refused or invalid", "2  usage", "3  no daemon runs"] {
            assert!(exit.contains(code), "no {code:?} in the EXIT STATUS of:\n{main}");
        }
        for shell in [clap_complete::Shell::Bash, clap_complete::Shell::Zsh, clap_complete::Shell::Fish] {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "policer", &mut out);
            let text = String::from_utf8(out).unwrap();
            assert!(text.contains("inspect") && text.contains("max-rules"), "{shell:?}");
        }
    }
}
