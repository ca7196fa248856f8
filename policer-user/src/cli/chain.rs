//! `policer chain add|rm|ls`: the programs behind policer on an interface
//! (docs/chain.md). The daemon loads and puts them in (its owner writes
//! the `[[chain]]` tables); this asks and prints.

use std::path::Path;

use crate::{chain::ChainConfig, control::ChainView};

#[derive(clap::Subcommand)]
pub enum Cmd {
    /// Put a program in a slot of IFACE's chain: an XDP object's program
    /// (libbpf-style, BTF maps; its pin-by-name maps pinned under
    /// --pin-maps), or one already pinned (--pinned). What policer passes
    /// on IFACE goes to the first filled slot; its verdict is final.
    /// Written to the config's [[chain]] tables.
    Add {
        #[command(flatten)]
        wait: super::Wait,
        /// The interface (one this daemon polices).
        iface: String,
        /// The object file (xdp-filter's xdpfilt_alw_udp.o, your own);
        /// or --pinned.
        #[arg(conflicts_with = "pinned")]
        object: Option<String>,
        /// The object's program (default: its only XDP program).
        #[arg(long, requires = "object")]
        program: Option<String>,
        /// The slot, 0 to 7 (default: the first free one).
        #[arg(long)]
        slot: Option<u32>,
        /// Where the object's pin-by-name maps are pinned, or found when
        /// pinned already (default /sys/fs/bpf, as libbpf).
        #[arg(long, value_name = "DIR", requires = "object")]
        pin_maps: Option<String>,
        /// A program loaded and pinned already (`bpftool prog load OBJ PATH`).
        #[arg(long, value_name = "BPFFS_PATH")]
        pinned: Option<String>,
    },
    /// Empty a slot of IFACE's chain (and remove its [[chain]] table).
    Rm {
        #[command(flatten)]
        wait: super::Wait,
        /// The interface.
        iface: String,
        /// The slot to empty, 0 to 7.
        #[arg(long)]
        slot: u32,
    },
    /// The chains: slot, program id, name, tag, where from, frames handed.
    Ls {
        #[command(flatten)]
        wait: super::Wait,
        /// One interface (default: every one the daemon polices).
        iface: Option<String>,
        /// One JSON array of the chains (docs/json.md).
        #[arg(long)]
        json: bool,
    },
}

impl Cmd {
    pub(super) fn json(&self) -> bool {
        matches!(self, Cmd::Ls { json: true, .. })
    }

    pub(super) fn wait(&self) -> super::Wait {
        match self {
            Cmd::Add { wait, .. } | Cmd::Rm { wait, .. } | Cmd::Ls { wait, .. } => *wait,
        }
    }
}

/// A path as the daemon should read it: absolute (the daemon runs
/// elsewhere).
fn absolute(p: &str) -> anyhow::Result<String> {
    let path = Path::new(p);
    if path.is_absolute() {
        return Ok(p.to_string());
    }
    Ok(std::env::current_dir()?.join(path).display().to_string())
}

pub fn run(cmd: Cmd) -> anyhow::Result<()> {
    let d = super::daemon()?;
    match cmd {
        Cmd::Add { iface, object, program, slot, pin_maps, pinned, .. } => {
            if object.is_none() && pinned.is_none() {
                return Err(super::Usage("chain add: name an OBJECT file, or --pinned BPFFS_PATH".into()).into());
            }
            let c = ChainConfig {
                interface: iface,
                slot: 0,
                object: object.as_deref().map(absolute).transpose()?,
                program,
                pin_maps: pin_maps.as_deref().map(absolute).transpose()?,
                pinned: pinned.as_deref().map(absolute).transpose()?,
            };
            println!("policer: {}", d.chain_add(c, slot)?);
        }
        Cmd::Rm { iface, slot, .. } => println!("policer: {}", d.chain_rm(iface, slot)?),
        Cmd::Ls { iface, json, .. } => {
            let chains = d.chain_ls(iface)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&chains)?);
            } else {
                print!("{}", text(&chains));
            }
        }
    }
    Ok(())
}

/// One line for `status`: the filled slots and the counts.
pub(super) fn summary(c: &ChainView) -> String {
    let slots = match c.slots.as_slice() {
        [] => "empty".to_string(),
        s => s
            .iter()
            .map(|s| format!("slot {} '{}' (id {})", s.slot, s.name, s.program_id))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!("{slots}; {} frames handed on, {} passed with the chain empty", c.handed_packets, c.empty_packets)
}

fn text(chains: &[ChainView]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    for c in chains {
        let _ = writeln!(
            out,
            "{} (pinned at {}): {} frames handed on, {} passed with the chain empty",
            c.interface, c.pinned, c.handed_packets, c.empty_packets
        );
        if c.slots.is_empty() {
            let _ = writeln!(out, "  empty: what policer passes goes up the stack\n");
            continue;
        }
        let mut t = crate::report::table(&["SLOT", "ID", "NAME", "TAG", "FROM"], 5);
        for s in &c.slots {
            t.add_row(vec![
                s.slot.to_string(),
                s.program_id.to_string(),
                s.name.clone(),
                s.tag.clone(),
                s.from.clone(),
            ]);
        }
        let _ = writeln!(out, "{t}\n");
    }
    out
}
