//! The command line: one file per verb (parse, call, print). `main.rs`
//! only parses and runs [`Cli`].

mod attach;
mod ban;
mod capture;
mod chain;
mod check;
mod detach;
mod docs;
mod dryrun;
mod import;
mod inspect;
mod manual;
mod object;
#[cfg(test)]
mod references;
mod reload;
mod replay;
mod rule;
mod rule_list;
mod stats;
mod status;
mod suggest;
mod top;

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::control;

/// The exit status of every verb, as `policer --help` and the man page's
/// EXIT STATUS section say it (the codes of LSB `status`: 3 is "not
/// running").
pub(crate) const EXIT_STATUS: &str = "\
Exit status:
  0  done (for `check`: the file is valid)
  1  refused or invalid: a bad value, a rule the daemon refuses, a config
     file with problems, a kernel or file error; nothing was changed
  2  usage: an unknown verb or option, a missing or malformed argument
  3  no daemon runs in this network namespace (LSB `status`: not running)

With --json, an error is {\"error\": \"...\"} on stdout, with the same status.";

#[derive(Parser)]
#[command(
    name = "policer",
    version,
    about = "Per-source packet-rate policer in XDP",
    after_help = "Exit status: 0 done, 1 refused or invalid, 2 usage, 3 no daemon (--help says more).",
    after_long_help = EXIT_STATUS
)]
pub struct Cli {
    /// Seconds to wait for the daemon's answer (default 30), for every
    /// verb that asks one; also an option of each such verb.
    #[arg(long, value_name = "SECS")]
    timeout: Option<f64>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon: attach to the interfaces and police every source.
    Attach(attach::Args),
    /// Detach from an interface (through the daemon, or directly if none runs).
    Detach(detach::Args),
    /// Change the running daemon's rules.
    Rule {
        #[command(subcommand)]
        cmd: Box<rule::Cmd>,
    },
    /// Ban a prefix for a while (`ban PREFIX --for 1h`), or list the bans
    /// in force (`ban ls`).
    Ban(ban::Args),
    /// The programs behind policer on an interface: what policer passes
    /// is handed to the first filled slot of its chain (xdp-filter, your
    /// own XDP program).
    Chain {
        #[command(subcommand)]
        cmd: Box<chain::Cmd>,
    },
    /// Lift a ban: a manual one, and the automatic bans of sources in the prefix.
    Unban(ban::UnbanArgs),
    /// Re-read the config file; applied only if all of it is valid. What was changed with `--runtime` is kept.
    Reload(reload::Args),
    /// Validate a config file (no root, no daemon): what it would install, or every problem.
    Check(check::Args),
    /// The running daemon: interfaces, config, rules.
    Status(status::Args),
    /// Counters: totals, per interface, per rule (exact, summed over CPUs).
    Stats(stats::Args),
    /// The sources with the most debt and the most drops right now.
    ///
    /// A source's drops are counted by sampling (one in 64): shown as
    /// estimates, `~N ±M` (two standard deviations), and credited to the
    /// rule that dropped them, `(by RULE)` when that is not the rule that
    /// charges the source now. Sources holding a bucket are said in debt
    /// and idle apart. The daemon reads only the parts of its tables that
    /// ever held a source.
    Top(top::Args),
    /// One source now: its rule, bucket, debt, and when it would be admitted.
    Inspect(inspect::Args),
    /// What the rules would have done to a capture: every frame through the
    /// real program, on the capture's own clock (no daemon, nothing attached).
    Replay(replay::Args),
    /// Propose per rule a rate and burst that a share of its sources stays
    /// within (--keep, 99.9% by default), from the daemon's traffic
    /// (--watch DURATION) or a capture (--pcap FILE): the distribution, and
    /// the `rule set` lines that apply it.
    Suggest(suggest::Args),
    /// Write the frames the running daemon judges (dropped by default) to
    /// a pcapng file or stdout: filtered, sampled and rate-bounded in the
    /// kernel.
    Capture(capture::Args),
    /// Write the XDP object this binary carries to a file (for bpftool,
    /// xdp-loader, another loader).
    Object(object::Args),
    /// Write the man pages (policer.8, one per verb, policer.toml.5) into a
    /// directory.
    Man(docs::ManArgs),
    /// Print a shell completion script (bash, zsh, fish).
    Completions(docs::CompletionsArgs),
}

impl Cli {
    /// Whether the verb was asked for JSON: its errors are JSON too
    /// (`{"error": "…"}` on stdout, bpftool's convention), with the same
    /// exit code.
    /// Exit status 2: the command line itself is wrong.
    pub const EXIT_USAGE: u8 = 2;
    /// Exit status 3: no daemon runs in this network namespace.
    pub const EXIT_NO_DAEMON: u8 = 3;

    /// The exit status of a failed command (see the `after_long_help`).
    pub fn exit_status(e: &anyhow::Error) -> u8 {
        if e.chain().any(|c| matches!(c.downcast_ref::<crate::Error>(), Some(crate::Error::NoDaemon))) {
            Self::EXIT_NO_DAEMON
        } else if e.is::<Usage>() {
            Self::EXIT_USAGE
        } else {
            1
        }
    }

    pub fn json(&self) -> bool {
        match &self.cmd {
            Cmd::Stats(a) => a.json,
            Cmd::Top(a) => a.json,
            Cmd::Status(a) => a.json,
            Cmd::Inspect(a) => a.json,
            Cmd::Check(a) => a.json,
            Cmd::Replay(a) => a.json,
            Cmd::Suggest(a) => a.json,
            Cmd::Rule { cmd } => match &**cmd {
                rule::Cmd::Ls { json, .. } | rule::Cmd::Set { json, .. } | rule::Cmd::Rm { json, .. } => *json,
                rule::Cmd::Import(a) => a.json,
            },
            Cmd::Reload(a) => a.json,
            Cmd::Ban(a) => a.json(),
            Cmd::Chain { cmd } => cmd.json(),
            _ => false,
        }
    }

    /// The `--timeout` of the verb that asks a daemon (its own, else the
    /// one before the verb), if any was given.
    fn wait(&self) -> Option<f64> {
        let verb = match &self.cmd {
            Cmd::Detach(a) => a.wait,
            Cmd::Rule { cmd } => match &**cmd {
                rule::Cmd::Set { wait, .. } | rule::Cmd::Rm { wait, .. } | rule::Cmd::Ls { wait, .. } => *wait,
                rule::Cmd::Import(a) => a.wait,
            },
            Cmd::Ban(a) => a.wait(),
            Cmd::Unban(a) => a.wait,
            Cmd::Chain { cmd } => cmd.wait(),
            Cmd::Reload(a) => a.wait,
            Cmd::Status(a) => a.wait,
            Cmd::Stats(a) => a.wait,
            Cmd::Top(a) => a.wait,
            Cmd::Inspect(a) => a.wait,
            Cmd::Capture(a) => a.wait,
            Cmd::Suggest(a) => a.wait,
            _ => Wait::default(),
        };
        verb.timeout.or(self.timeout)
    }

    pub fn run(self) -> anyhow::Result<()> {
        let timeout = self.wait().unwrap_or(control::CALL_TIMEOUT.as_secs_f64());
        if !(0.1..=3600.0).contains(&timeout) {
            anyhow::bail!("--timeout {timeout}: must be 0.1 to 3600 seconds");
        }
        TIMEOUT.set(Duration::from_secs_f64(timeout)).ok();
        if !matches!(self.cmd, Cmd::Attach(_)) {
            // A reader that goes away (`policer stats --watch 1 | head`)
            // ends the command quietly, as it does any Unix filter, instead
            // of a panic on the write. Not the daemon: it writes to sockets
            // whose peers may vanish.
            // SAFETY: setting a signal's disposition to its default.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        }
        match self.cmd {
            Cmd::Attach(a) => attach::run(a),
            Cmd::Detach(a) => detach::run(a),
            Cmd::Rule { cmd } => rule::run(*cmd),
            Cmd::Ban(a) => ban::run(a),
            Cmd::Unban(a) => ban::unban(a),
            Cmd::Chain { cmd } => chain::run(*cmd),
            Cmd::Reload(a) => reload::run(a),
            Cmd::Check(a) => check::run(a),
            Cmd::Status(a) => status::run(a),
            Cmd::Stats(a) => stats::run(a),
            Cmd::Top(a) => top::run(a),
            Cmd::Inspect(a) => inspect::run(a),
            Cmd::Replay(a) => replay::run(a),
            Cmd::Suggest(a) => suggest::run(a),
            Cmd::Capture(a) => capture::run(a),
            Cmd::Object(a) => object::run(a),
            Cmd::Man(a) => docs::man(a),
            Cmd::Completions(a) => docs::completions(a),
        }
    }
}

/// A command line wrong in a way clap does not see (a usage line is
/// printed): exit status 2, as clap's own usage errors.
#[derive(Debug)]
pub struct Usage(pub String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// An error whose message was already printed: `main` only sets the exit
/// code.
#[derive(Debug)]
pub struct Quiet;

impl std::fmt::Display for Quiet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(reported above)")
    }
}

impl std::error::Error for Quiet {}

/// `--timeout` of the verbs that ask a daemon (not of `attach`, `check`,
/// `replay`: no daemon to wait for).
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub(crate) struct Wait {
    /// Seconds to wait for the daemon's answer (default 30). A change that
    /// times out may still be applied: the CLI says so.
    #[arg(long, value_name = "SECS")]
    pub(crate) timeout: Option<f64>,
}

/// `--timeout`, set once before any verb runs.
static TIMEOUT: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

/// The daemon of this network namespace, with the `--timeout` in force; a
/// refusal is an error (non-zero exit).
fn daemon() -> crate::Result<control::Client> {
    control::Client::new(*TIMEOUT.get().unwrap_or(&control::CALL_TIMEOUT))
}

/// Prints one sample of a read verb: pretty JSON, or one JSON object per
/// line under `--watch`; else its text, a blank line between samples.
fn show<T: serde::Serialize>(v: &T, json: bool, watching: bool, text: impl Fn(&T) -> String) -> anyhow::Result<()> {
    match (json, watching) {
        (true, true) => println!("{}", serde_json::to_string(v)?),
        (true, false) => println!("{}", serde_json::to_string_pretty(v)?),
        (false, w) => print!("{}{}", text(v), if w { "\n" } else { "" }),
    }
    Ok(())
}

/// `--watch SECS`, checked.
fn watch_period(w: Option<f64>) -> anyhow::Result<Option<Duration>> {
    match w {
        None => Ok(None),
        Some(s) if (0.1..=3600.0).contains(&s) => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => anyhow::bail!("--watch {s}: must be 0.1 to 3600 seconds"),
    }
}
