//! BPF_MAP_LOOKUP_BATCH: read a whole map in a few system calls (aya 0.16
//! has no wrapper). Reading a million buckets one key at a time takes two
//! syscalls per entry; a batch of 8192 takes one.

use std::{io, os::fd::RawFd};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

/// `bpf_attr.batch`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Calls `f(key, value)` for every entry of the map behind `fd`.
/// `value_size` is the size the kernel copies per entry (for per-CPU maps:
/// the value rounded up to 8 bytes, times the possible CPUs).
pub fn for_each(fd: RawFd, key_size: usize, value_size: usize, f: impl FnMut(&[u8], &[u8])) -> io::Result<()> {
    for_each_chunk(fd, key_size, value_size, 8192, f)
}

/// [`for_each`], `chunk` entries a call: a map read on every scrape and
/// usually empty (the ban store) takes small buffers, so reading it leaves
/// no large freed blocks in the allocator's arenas.
pub fn for_each_chunk(
    fd: RawFd,
    key_size: usize,
    value_size: usize,
    chunk: usize,
    mut f: impl FnMut(&[u8], &[u8]),
) -> io::Result<()> {
    for_each_batch(fd, key_size, value_size, chunk, |_, entries| {
        for (k, v) in entries {
            f(k, v);
        }
    })
}

/// When a batch was copied: the kernel copies its entries in order during
/// one system call, between `before` and `after` (CLOCK_MONOTONIC ns, the
/// clock of `bpf_ktime_get_ns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copied {
    pub before: u64,
    pub after: u64,
    /// Entries in the batch.
    pub n: u64,
}

impl Copied {
    /// When entry `i` of the batch was copied, as the call's time shared
    /// out evenly over its entries (the copy is a loop over them): off by
    /// the call's unevenness, not by its length.
    pub fn at(&self, i: usize) -> u64 {
        let span = self.after.saturating_sub(self.before);
        match self.n {
            0 | 1 => self.before + span / 2,
            n => self.before + (span as u128 * (i as u128).min(n as u128 - 1) / (n as u128 - 1)) as u64,
        }
    }
}

/// [`for_each_chunk`], one call of `f` per batch the kernel returned, with
/// when it was copied ([`Copied`]) and the batch's entries: a reader that
/// judges entries against the clock (`policer top`) takes each entry's
/// time from it, whatever share of the batch is in use and however long
/// the walk.
pub fn for_each_batch(
    fd: RawFd,
    key_size: usize,
    value_size: usize,
    chunk: usize,
    mut f: impl FnMut(Copied, &mut dyn Iterator<Item = (&[u8], &[u8])>),
) -> io::Result<()> {
    let mut b = Batches::new(fd, key_size, value_size, chunk);
    while let Some(copied) = b.read_next()? {
        f(copied, &mut b.entries());
    }
    Ok(())
}

/// A walk of a map one batch at a time, each taken when asked: a reader
/// that hands entries on as it reads them (`ban ls` writing to a client)
/// waits between batches without holding a thread. A map that changes
/// during the walk gives each entry at most once, as [`for_each_batch`].
pub struct Batches {
    fd: RawFd,
    key_size: usize,
    value_size: usize,
    chunk: usize,
    keys: Vec<u8>,
    values: Vec<u8>,
    // The batch token is opaque: 8 bytes for hashes and arrays, but the
    // generic batch (LPM tries) writes a whole key there (20 bytes for an
    // IPv6 rule key); 64 covers every key this program has.
    token_in: [u8; 64],
    token_out: [u8; 64],
    first: bool,
    done: bool,
    /// Entries of the last batch.
    n: usize,
}

impl Batches {
    pub fn new(fd: RawFd, key_size: usize, value_size: usize, chunk: usize) -> Batches {
        let chunk = chunk.max(1);
        Batches {
            fd,
            key_size,
            value_size,
            chunk,
            keys: vec![0u8; key_size * chunk],
            values: vec![0u8; value_size * chunk],
            token_in: [0; 64],
            token_out: [0; 64],
            first: true,
            done: false,
            n: 0,
        }
    }

    /// Reads the next batch (at most `chunk` entries, see
    /// [`Batches::entries`]); `None` once the map is read to its end.
    pub fn read_next(&mut self) -> io::Result<Option<Copied>> {
        loop {
            if self.done {
                return Ok(None);
            }
            let mut attr = BatchAttr {
                in_batch: if self.first { 0 } else { self.token_in.as_mut_ptr() as u64 },
                out_batch: self.token_out.as_mut_ptr() as u64,
                keys: self.keys.as_mut_ptr() as u64,
                values: self.values.as_mut_ptr() as u64,
                count: self.chunk as u32,
                map_fd: self.fd as u32,
                ..Default::default()
            };
            let before = crate::duration::monotonic_ns();
            // SAFETY: attr points to buffers large enough for `count` entries.
            let r = unsafe {
                libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &mut attr as *mut BatchAttr, size_of::<BatchAttr>())
            };
            let copied = Copied { before, after: crate::duration::monotonic_ns(), n: attr.count as u64 };
            let err = if r < 0 { Some(io::Error::last_os_error()) } else { None };
            self.n = attr.count as usize;
            match err {
                None => {}
                // ENOENT: that was the last chunk.
                Some(e) if e.raw_os_error() == Some(libc::ENOENT) => self.done = true,
                Some(e) => {
                    self.done = true;
                    self.n = 0;
                    return Err(e);
                }
            }
            self.token_in = self.token_out;
            self.first = false;
            if self.n > 0 {
                return Ok(Some(copied));
            }
        }
    }

    /// The entries of the batch [`Batches::read_next`] read, as (key, value) bytes.
    pub fn entries(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        let (k, v) = (self.key_size, self.value_size);
        (0..self.n).map(move |i| (&self.keys[i * k..(i + 1) * k], &self.values[i * v..(i + 1) * v]))
    }
}

/// Possible CPUs, as per-CPU map values are laid out.
pub fn possible_cpus() -> io::Result<usize> {
    aya::util::nr_cpus().map(|n| n.get() as usize).map_err(|(_, e)| e)
}

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// BPF_MAP_UPDATE_BATCH of `count` packed keys and values. Returns how many
/// entries the kernel took before an error (all of them on success).
pub fn update(fd: RawFd, keys: &[u8], values: &[u8], count: usize) -> (usize, Option<io::Error>) {
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: count as u32,
        map_fd: fd as u32,
        ..Default::default()
    };
    // SAFETY: keys and values hold `count` packed entries of the map's sizes.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_BATCH, &mut attr as *mut BatchAttr, size_of::<BatchAttr>())
    };
    let err = if r < 0 { Some(io::Error::last_os_error()) } else { None };
    (attr.count as usize, err)
}

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;

/// `bpf_attr` for one element.
#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// BPF_MAP_LOOKUP_ELEM of a plain-data key and value (not per-CPU maps);
/// `None` when the key is absent.
pub fn lookup<K: aya::Pod, V: aya::Pod>(fd: RawFd, key: &K) -> io::Result<Option<V>> {
    let mut value = std::mem::MaybeUninit::<V>::zeroed();
    // SAFETY: the zeroed V's own bytes, borrowed while the kernel writes them.
    let bytes = unsafe { std::slice::from_raw_parts_mut(value.as_mut_ptr().cast::<u8>(), size_of::<V>()) };
    if !lookup_into(fd, key, bytes)? {
        return Ok(None);
    }
    // SAFETY: zeroed, then written whole by the kernel; V is plain data
    // (any bytes valid).
    Ok(Some(unsafe { value.assume_init() }))
}

/// BPF_MAP_LOOKUP_ELEM of a plain-data key into `value`, which must be
/// the size the kernel copies (for a per-CPU map: the value rounded up to
/// 8 bytes, times the possible CPUs); false when the key is absent.
pub fn lookup_into<K: aya::Pod>(fd: RawFd, key: &K, value: &mut [u8]) -> io::Result<bool> {
    let mut attr = ElemAttr {
        map_fd: fd as u32,
        key: key as *const K as u64,
        value: value.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: key points to a K of the map's key size; value is as large
    // as what the kernel copies (the caller's contract).
    let r =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_ELEM, &mut attr as *mut ElemAttr, size_of::<ElemAttr>()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOENT) { Ok(false) } else { Err(e) };
    }
    Ok(true)
}

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;

/// BPF_MAP_UPDATE_ELEM (BPF_ANY) of a plain-data key and value.
pub fn update_elem<K: aya::Pod, V: aya::Pod>(fd: RawFd, key: &K, value: &V) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: fd as u32,
        key: key as *const K as u64,
        value: value as *const V as u64,
        ..Default::default()
    };
    // SAFETY: key and value point to a K and a V of the map's sizes.
    let r =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_ELEM, &mut attr as *mut ElemAttr, size_of::<ElemAttr>()) };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// BPF_MAP_DELETE_ELEM of a plain-data key; a key that is not there is
/// fine.
pub fn delete_elem<K: aya::Pod>(fd: RawFd, key: &K) -> io::Result<()> {
    let mut attr = ElemAttr { map_fd: fd as u32, key: key as *const K as u64, ..Default::default() };
    // SAFETY: key points to a K of the map's key size.
    let r =
        unsafe { libc::syscall(libc::SYS_bpf, BPF_MAP_DELETE_ELEM, &mut attr as *mut ElemAttr, size_of::<ElemAttr>()) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENOENT) { Ok(()) } else { Err(e) };
    }
    Ok(())
}

const BPF_MAP_DELETE_BATCH: libc::c_long = 27;

/// BPF_MAP_DELETE_BATCH of `count` packed keys. Returns how many the kernel
/// deleted before an error (all of them on success; ENOENT for a key not
/// there stops it).
pub fn delete(fd: RawFd, keys: &[u8], count: usize) -> (usize, Option<io::Error>) {
    let mut attr =
        BatchAttr { keys: keys.as_ptr() as u64, count: count as u32, map_fd: fd as u32, ..Default::default() };
    // SAFETY: keys holds `count` packed keys of the map's key size.
    let r = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_MAP_DELETE_BATCH, &mut attr as *mut BatchAttr, size_of::<BatchAttr>())
    };
    let err = if r < 0 { Some(io::Error::last_os_error()) } else { None };
    (attr.count as usize, err)
}

#[cfg(test)]
mod tests {
    use super::Copied;

    #[test]
    fn entries_are_timed_across_the_copy() {
        let c = Copied { before: 1_000, after: 2_000, n: 5 };
        assert_eq!((0..5).map(|i| c.at(i)).collect::<Vec<_>>(), vec![1_000, 1_250, 1_500, 1_750, 2_000]);
        assert_eq!(c.at(9), 2_000, "never past the end");
        assert_eq!(Copied { before: 1_000, after: 2_000, n: 1 }.at(0), 1_500);
        // A clock read that went nowhere (a coarse clock): no span, no wrap.
        assert_eq!(Copied { before: 7, after: 7, n: 3 }.at(2), 7);
    }
}
