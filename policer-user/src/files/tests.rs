use std::{
    io::Write,
    os::unix::fs::{MetadataExt, symlink},
};

use super::*;

const SMALL: Limit = Limit { what: "a test file", max_bytes: 16 };

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo {}", p.display());
}

#[test]
fn regular_files_are_read_others_named() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("ok");
    fs::write(&f, b"0123456789abcdef").unwrap();
    assert_eq!(read_regular(&f, SMALL).unwrap(), b"0123456789abcdef");
    // Through a symlink too.
    let link = d.path().join("link");
    symlink(&f, &link).unwrap();
    assert_eq!(read_regular(&link, SMALL).unwrap().len(), 16);

    // A FIFO with no writer: refused at once, not waited on.
    let fifo = d.path().join("fifo");
    mkfifo(&fifo);
    let t = std::time::Instant::now();
    let e = read_regular(&fifo, SMALL).unwrap_err();
    assert!(t.elapsed() < std::time::Duration::from_secs(1));
    assert_eq!(e.to_string(), "is a FIFO, not a regular file");
    // A device, through a symlink; a directory.
    let zero = d.path().join("zero");
    symlink("/dev/zero", &zero).unwrap();
    assert_eq!(read_regular(&zero, CONFIG).unwrap_err().to_string(), "is a character device, not a regular file");
    assert_eq!(read_regular(d.path(), SMALL).unwrap_err().to_string(), "is a directory, not a regular file");

    let missing = read_regular(&d.path().join("nope"), SMALL).unwrap_err();
    assert!(missing.is_not_found(), "{missing}");
    assert!(!e.is_not_found());
}

#[test]
fn the_bound_is_kept_and_said() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("big");
    fs::write(&f, [b'x'; 17]).unwrap();
    let e = read_regular(&f, SMALL).unwrap_err();
    assert_eq!(e.to_string(), "is larger than 16 bytes, the most policer reads of a test file");
    assert_eq!(
        ReadError::TooLarge(CONFIG).to_string(),
        "is larger than 256 MiB, the most policer reads of a config file"
    );
    assert_eq!(
        ReadError::TooLarge(IMPORT).to_string(),
        "is larger than 1 GiB, the most policer reads of an import list"
    );
    assert!(ReadError::TooLarge(SET_STATE).to_string().contains("1.0 GiB (1073807360 bytes)"));
}

/// A file that grows while it is read: the read stops at the bound plus
/// one byte whatever the size said when it was opened.
#[test]
fn a_growing_file_is_cut_at_the_bound() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("growing");
    fs::write(&f, b"0123").unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (f, stop) = (f.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut w = OpenOptions::new().append(true).open(&f).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                w.write_all(&[b'y'; 4096]).unwrap();
                if w.metadata().unwrap().len() > 64 << 20 {
                    break;
                }
            }
        })
    };
    let limit = Limit { what: "a growing file", max_bytes: 1 << 20 };
    // Whatever the moment, either the whole file under the bound or a
    // refusal; never more than the bound read.
    for _ in 0..50 {
        match read_regular(&f, limit) {
            Ok(b) => assert!(b.len() as u64 <= limit.max_bytes),
            Err(ReadError::TooLarge(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
}

#[test]
fn temp_files_are_new_locked_and_not_through_planted_links() {
    let d = tempfile::tempdir().unwrap();
    let victim = d.path().join("victim");
    fs::write(&victim, "precious\n").unwrap();
    // A link planted at the very name tried first: another name is taken.
    let planted = d.path().join(format!(".x.set.{:016x}.tmp", 0x5eed_u64));
    symlink(&victim, &planted).unwrap();
    NEXT_NAME.with(|c| c.set(Some(0x5eed)));
    let (tmp, mut f) = create_temp(d.path(), "x.set", 0o640).unwrap();
    assert_ne!(tmp, planted);
    assert_eq!(temp_stem(&tmp.file_name().unwrap().to_string_lossy()), Some("x.set"));
    f.write_all(b"new").unwrap();
    assert_eq!(fs::read_to_string(&victim).unwrap(), "precious\n");
    assert_eq!(fs::metadata(&tmp).unwrap().mode() & 0o777 & !0o022, 0o640 & !0o022);

    // While its writer holds it, the cleanup leaves it; then takes it (and
    // leaves the planted link, and files not its own).
    fs::write(d.path().join(".y.set.0123456789abcdef.tmp"), "killed midway").unwrap();
    fs::write(d.path().join("x.set"), "a state file").unwrap();
    let (removed, failed) = remove_leftovers(d.path(), |n| temp_stem(n).is_some());
    assert!(failed.is_empty(), "{failed:?}");
    assert_eq!(removed, vec![d.path().join(".y.set.0123456789abcdef.tmp")]);
    assert!(tmp.exists(), "a write in progress was removed");
    drop(f);
    let (removed, _) = remove_leftovers(d.path(), |n| temp_stem(n).is_some());
    assert_eq!(removed, vec![tmp]);
    assert!(fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
    assert!(d.path().join("x.set").exists() && victim.exists());
    assert_eq!(remove_leftovers(&d.path().join("none"), |_| true).0, Vec::<PathBuf>::new());
}

#[test]
fn temp_names() {
    assert_eq!(temp_stem(".policer.toml.0123456789abcdef.tmp"), Some("policer.toml"));
    assert_eq!(temp_stem(".feed.set.FEDCBA9876543210.tmp"), Some("feed.set"));
    for no in [
        ".policer.toml.tmp",
        "policer.toml.0123456789abcdef.tmp",
        "..0123456789abcdef.tmp",
        ".a.0123.tmp",
        ".a.0123456789abcdeg.tmp",
    ] {
        assert_eq!(temp_stem(no), None, "{no}");
    }
}
