//! `policer object --write FILE`: the XDP object this binary carries, as
//! a file, for libbpf tools (bpftool, xdp-loader) and other loaders.

use std::{io::Write, path::PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// Where to write it (`-`: stdout). An existing file is replaced
    /// whole (written beside it, then renamed), never left half written.
    #[arg(long, value_name = "FILE")]
    write: PathBuf,
}

pub fn run(a: Args) -> anyhow::Result<()> {
    let object = crate::EBPF_OBJECT;
    if object.is_empty() {
        anyhow::bail!("this build has no XDP object (built with AYA_BUILD_SKIP=1, for host tests)");
    }
    if a.write.as_os_str() == "-" {
        std::io::stdout().lock().write_all(object)?;
        return Ok(());
    }
    let dir = match a.write.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = a.write.file_name().ok_or_else(|| anyhow::anyhow!("--write {}: not a file name", a.write.display()))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(object)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &a.write)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        anyhow::bail!("--write {}: {e}", a.write.display());
    }
    eprintln!("policer: wrote the XDP object ({} bytes) to {}", object.len(), a.write.display());
    Ok(())
}
