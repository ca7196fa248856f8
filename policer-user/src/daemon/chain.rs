//! The chain's programs as the owner puts them in and takes them out
//! (docs/chain.md): `policer chain add/rm`, the `[[chain]]` tables at
//! start and reload, and what `detach` does with a chain that holds
//! programs. The array is pinned (crate::chain), so it outlives the
//! daemon: a restart finds its programs in place and adopts them.

use std::path::{Path, PathBuf};

use aya::{
    EbpfLoader,
    programs::{ProgramFd, ProgramInfo, Xdp},
};

use crate::{
    chain::{self, ChainConfig, SlotView},
    config::ConfigFile,
    error::{Error, Result},
};

/// A program ready to join: its descriptor and what to call it.
pub(super) struct Joining {
    pub fd: ProgramFd,
    pub name: String,
}

/// Loads what a `[[chain]]` table names (its object's program, or the
/// pinned one), checked as the chain takes only: an interface's XDP
/// program without frags. Nothing is put in a slot here; a refused
/// object loads nothing. `base`: the config file's directory, for
/// relative paths.
pub(super) fn load(c: &ChainConfig, base: &Path) -> Result<Joining> {
    let at = |p: &str| -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() { p.to_path_buf() } else { base.join(p) }
    };
    if let Some(pin) = &c.pinned {
        let info =
            ProgramInfo::from_pin(at(pin)).map_err(|e| Error::Invalid(format!("{pin}: not a pinned program: {e}")))?;
        if info.program_type() != aya_obj::generated::bpf_prog_type::BPF_PROG_TYPE_XDP {
            return Err(Error::Invalid(format!(
                "{pin}: not an XDP program (type {:?}): only XDP programs can join the chain",
                info.program_type()
            )));
        }
        let fd = info.fd().map_err(|e| Error::Program(Box::new(e)))?;
        let name = info.name_as_str().unwrap_or_default().to_string();
        return Ok(Joining { fd, name });
    }
    let Some(object) = &c.object else {
        return Err(Error::Invalid("a chain table needs object or pinned".into()));
    };
    let path = at(object);
    let bytes = std::fs::read(&path).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    let name = chain::pick_program(&bytes, c.program.as_deref()).map_err(|e| match e {
        Error::Invalid(m) => Error::Invalid(format!("{object}: {m}")),
        other => other,
    })?;
    let pin_maps = c.pin_maps.as_deref().map(&at).unwrap_or_else(chain::default_pin_maps);
    if !chain::is_bpffs(&pin_maps) {
        return Err(Error::Invalid(format!(
            "{object}: --pin-maps {}: not in a bpffs; its pin-by-name maps cannot be pinned there",
            pin_maps.display()
        )));
    }
    std::fs::create_dir_all(&pin_maps).map_err(|e| Error::Invalid(format!("{}: {e}", pin_maps.display())))?;
    let mut ebpf = EbpfLoader::new().default_map_pin_directory(&pin_maps).load(&bytes).map_err(|e| {
        Error::Invalid(format!("{object}: cannot load (its maps pinned under {}): {e}", pin_maps.display()))
    })?;
    let prog: &mut Xdp = ebpf
        .program_mut(&name)
        .ok_or_else(|| Error::Invalid(format!("{object}: no program {name}")))?
        .try_into()
        .map_err(|e| Error::Invalid(format!("{object}: program {name}: {e}")))?;
    prog.load().map_err(|e| Error::Invalid(format!("{object}: the kernel refused program {name}: {e}")))?;
    let fd = prog.fd().map_err(|e| Error::Program(Box::new(e)))?.try_clone().map_err(Error::kernel("a program"))?;
    // The object's other descriptors go with `ebpf`: the program keeps
    // its maps, the chain (once it is in) keeps the program.
    Ok(Joining { fd, name })
}

/// `chain add`: `c` (its slot already chosen) loaded and put in its slot,
/// then the file written; a file that cannot be written takes it out
/// again. `chains`: the file's tables as they are.
pub(super) fn add(file: &mut ConfigFile, c: ChainConfig) -> Result<String> {
    c.check().map_err(|e| Error::Invalid(format!("chain: {e}")))?;
    if let Some(s) = chain::slots(&c.interface)?.into_iter().find(|s| s.slot == c.slot) {
        return Err(Error::Invalid(format!(
            "slot {} of {}'s chain holds program {} ('{}'): `policer chain rm {} --slot {}` first",
            c.slot, c.interface, s.program_id, s.name, c.interface, c.slot
        )));
    }
    let base = file.path().parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("/"));
    let j = load(&c, &base)?;
    let mut tables: Vec<ChainConfig> =
        file.config().chains.iter().filter(|o| !(o.interface == c.interface && o.slot == c.slot)).cloned().collect();
    tables.push(c.clone());
    tables.sort_by(|a, b| (&a.interface, a.slot).cmp(&(&b.interface, b.slot)));
    chain::put(&c.interface, c.slot, &j.fd)?;
    if let Err(e) = file.set_chains(&tables) {
        let _ = chain::take(&c.interface, c.slot);
        return Err(e);
    }
    let id = chain::slots(&c.interface)?.into_iter().find(|s| s.slot == c.slot).map_or(0, |s| s.program_id);
    Ok(format!("{} (program {id}, '{}') in slot {} of {}'s chain", c.from(), j.name, c.slot, c.interface))
}

/// `chain rm`: the slot emptied, its table gone from the file.
pub(super) fn rm(file: &mut ConfigFile, iface: &str, slot: u32) -> Result<String> {
    chain::check_slot(slot)?;
    let tables: Vec<ChainConfig> =
        file.config().chains.iter().filter(|o| !(o.interface == iface && o.slot == slot)).cloned().collect();
    let had = chain::slots(iface)?.into_iter().find(|s| s.slot == slot);
    if had.is_none() && tables.len() == file.config().chains.len() {
        return Err(Error::Invalid(format!("slot {slot} of {iface}'s chain is empty")));
    }
    // The file first: a file that cannot be written leaves the slot alone.
    file.set_chains(&tables)?;
    chain::take(iface, slot)?;
    Ok(match had {
        Some(s) => format!("removed program {} ('{}') from slot {slot} of {iface}'s chain", s.program_id, s.name),
        None => format!("slot {slot} of {iface}'s chain was empty; its table is gone from the file"),
    })
}

/// At start and reload: every table of the file whose slot is empty is
/// loaded into it; a filled slot is kept (a restart adopts the chain as
/// it runs: no frame goes unchained). Tables of interfaces this daemon
/// does not police are left for the daemon that does. Returns what was
/// done, a line each; a table that cannot load is said and skipped (a
/// start does not fail over a program behind policer).
pub(super) fn fill(tables: &[ChainConfig], ifaces: &[String], base: &Path) -> Vec<String> {
    let mut said = Vec::new();
    for c in tables.iter().filter(|c| ifaces.contains(&c.interface)) {
        let filled = match chain::slots(&c.interface) {
            Ok(s) => s.into_iter().find(|s| s.slot == c.slot),
            Err(e) => {
                said.push(format!("warning: chain of {}: {e}", c.interface));
                continue;
            }
        };
        if let Some(s) = filled {
            said.push(format!(
                "keeping program {} ('{}') in slot {} of {}'s chain ({})",
                s.program_id,
                s.name,
                c.slot,
                c.interface,
                c.from()
            ));
            continue;
        }
        match load(c, base).and_then(|j| chain::put(&c.interface, c.slot, &j.fd).map(|()| j)) {
            Ok(j) => said.push(format!("{} ('{}') in slot {} of {}'s chain", c.from(), j.name, c.slot, c.interface)),
            Err(e) => said.push(format!("warning: slot {} of {}'s chain left empty: {e}", c.slot, c.interface)),
        }
    }
    said
}

/// At reload: the tables the file had (`old`) and no longer has (`new`),
/// for interfaces in `ifaces`: their slots emptied, a line said each. A
/// table deleted by hand is a `chain rm`; a slot it never filled (an
/// empty one) is said too.
pub(super) fn empty_gone(old: &[ChainConfig], new: &[ChainConfig], ifaces: &[String]) -> Vec<String> {
    let mut said = Vec::new();
    for c in old.iter().filter(|c| ifaces.contains(&c.interface)) {
        if new.iter().any(|n| n.interface == c.interface && n.slot == c.slot) {
            continue;
        }
        said.push(match chain::take(&c.interface, c.slot) {
            Ok(Some(id)) => format!(
                "emptied slot {} of {}'s chain (program {id}): its [[chain]] table ({}) is gone from the file",
                c.slot,
                c.interface,
                c.from()
            ),
            Ok(None) => format!(
                "slot {} of {}'s chain was empty; its [[chain]] table ({}) is gone from the file",
                c.slot,
                c.interface,
                c.from()
            ),
            Err(e) => format!(
                "warning: the [[chain]] table of slot {} of {} is gone from the file, but the slot could not be \
                 emptied: {e}",
                c.slot, c.interface
            ),
        });
    }
    said
}

/// After a detach with the chain empty: its pin, the dispatchers' pin
/// beside it and the interface's pin directory go (nothing is left to
/// keep; a start pins fresh ones). A chain that holds programs
/// (`--persist` aside, never the case after `before_detach`) is kept.
pub(super) fn unpin_if_empty(iface: &str) {
    if chain::slots(iface).is_ok_and(|s| s.is_empty()) {
        let pin = policer_common::chain::pin_path(iface);
        let _ = std::fs::remove_file(policer_common::chain::dispatch_pin_path(iface));
        let _ = std::fs::remove_file(&pin);
        if let Some(dir) = pin.parent() {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// The filled slots of `iface`'s chain, each with where the file says it
/// came from.
pub(super) fn listed(iface: &str, tables: &[ChainConfig]) -> Result<Vec<SlotView>> {
    let mut slots = chain::slots(iface)?;
    for s in slots.iter_mut() {
        s.from = tables
            .iter()
            .find(|c| c.interface == iface && c.slot == s.slot)
            .map_or_else(|| "outside policer (no [[chain]] table)".to_string(), ChainConfig::from);
    }
    Ok(slots)
}

/// `detach` of an interface whose chain holds programs: refused, naming
/// them, unless `hand_over` (slot 0's program takes policer's place on
/// the hook, atomically) or `force` (the chain is emptied). `replace`
/// swaps the hook's program (netlink, `XDP_FLAGS_REPLACE`). Returns what
/// to say, and whether the hook was handed over (then it is not ours to
/// detach).
pub(super) fn before_detach(
    iface: &str,
    hand_over: bool,
    force: bool,
    replace: impl FnOnce(&ProgramFd) -> Result<()>,
) -> Result<(String, bool)> {
    let slots = match chain::slots(iface) {
        Ok(s) => s,
        // No chain (a program of a build from before it): nothing to do.
        Err(_) => return Ok((String::new(), false)),
    };
    if slots.is_empty() {
        return Ok((String::new(), false));
    }
    let names = slots
        .iter()
        .map(|s| format!("slot {}: program {} ('{}')", s.slot, s.program_id, s.name))
        .collect::<Vec<_>>()
        .join(", ");
    if hand_over {
        let first = &slots[0];
        let info = chain::program_info(first.program_id)
            .ok_or_else(|| Error::Invalid(format!("program {} went away", first.program_id)))?;
        let fd = info.fd().map_err(|e| Error::Program(Box::new(e)))?;
        replace(&fd)?;
        for s in &slots {
            let _ = chain::take(iface, s.slot);
        }
        return Ok((
            format!(
                "handed {iface} over to program {} ('{}'), slot {} of the chain, attached in policer's place",
                first.program_id, first.name, first.slot
            ),
            true,
        ));
    }
    if !force {
        return Err(Error::Invalid(format!(
            "{iface}'s chain holds programs ({names}): detaching would take them off the interface too. \
             `policer detach {iface} --hand-over` attaches slot {}'s program in policer's place; `--force` detaches \
             and empties the chain; or `policer chain rm {iface} --slot N` each first",
            slots[0].slot
        )));
    }
    for s in &slots {
        chain::take(iface, s.slot)?;
    }
    Ok((format!("emptied {iface}'s chain ({names})"), false))
}
