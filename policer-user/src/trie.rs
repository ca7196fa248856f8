//! The one writer of the rule tries (`POLICER_RULES_V4`, `POLICER_RULES_V6`):
//! how an LPM key is laid out, batched writes that fall back to one entry
//! at a time, and errors that carry the kernel's errno. The loader writes
//! a rule set through it, the daemon the entries of sets.

use std::{io, os::fd::RawFd};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use policer_common::Rule;

use crate::{
    batch,
    error::{Error, Result},
};

/// The kernel's key of an LPM trie entry (`struct bpf_lpm_trie_key_u8`):
/// the prefix length in host order, then the data, most significant byte
/// first.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LpmKey<const N: usize> {
    pub len: u32,
    pub data: [u8; N],
}

// SAFETY: a u32 then bytes; every N used (4, 8, 16) is a multiple of 4, so
// there is no padding.
unsafe impl<const N: usize> aya::Pod for LpmKey<N> {}

impl LpmKey<4> {
    pub fn v4(n: &Ipv4Net) -> Self {
        LpmKey { len: n.prefix_len().into(), data: n.network().octets() }
    }
}

impl LpmKey<16> {
    pub fn v6(n: &Ipv6Net) -> Self {
        LpmKey { len: n.prefix_len().into(), data: n.network().octets() }
    }
}

/// Bytes of an IPv4 and of an IPv6 rule trie key.
pub const KEY_V4: usize = size_of::<LpmKey<4>>();
pub const KEY_V6: usize = size_of::<LpmKey<16>>();

/// Appends the key of `net` as a batch call reads keys: packed, each the
/// size of its family's key.
pub fn pack(net: &IpNet, out: &mut Vec<u8>) {
    out.extend_from_slice(&u32::from(net.prefix_len()).to_ne_bytes());
    match net.trunc() {
        IpNet::V4(n) => out.extend_from_slice(&n.network().octets()),
        IpNet::V6(n) => out.extend_from_slice(&n.network().octets()),
    }
}

/// The prefix of a key as [`pack`] lays it out (and the kernel returns it
/// from a batch read): its size says the family. `None`: not a key.
pub fn unpack(key: &[u8]) -> Option<IpNet> {
    let len = u8::try_from(u32::from_ne_bytes(key.get(..4)?.try_into().ok()?)).ok()?;
    let addr: std::net::IpAddr = match key.len() {
        KEY_V4 => std::net::Ipv4Addr::from(<[u8; 4]>::try_from(&key[4..8]).ok()?).into(),
        KEY_V6 => std::net::Ipv6Addr::from(<[u8; 16]>::try_from(&key[4..20]).ok()?).into(),
        _ => return None,
    };
    IpNet::new(addr, len).ok()
}

fn rule_bytes(r: &Rule) -> &[u8] {
    // SAFETY: Rule is plain data (repr(C), no padding: see its Pod impl).
    unsafe { std::slice::from_raw_parts(r as *const Rule as *const u8, size_of::<Rule>()) }
}

/// The kernel's ENOTSUPP (524): what a map type without batch operations
/// answers on some kernels (not a user-space errno, so libc has no name).
const ENOTSUPP: i32 = 524;

/// Whether a batch call failed because this kernel has no batch writes
/// for LPM tries (before 5.13: EINVAL, EOPNOTSUPP or ENOTSUPP), so the
/// rest go one at a time.
pub fn no_batch(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP | ENOTSUPP))
}

/// Entries per batch call of [`TrieWriter::write_all`]: bounds the buffers
/// (a value per entry, 80 B each: 5 MB).
pub const CHUNK: usize = 65_536;

/// The rule tries' descriptors. Copy, so that writer threads share one; it
/// borrows the descriptors of the [`crate::Policer`] (or of the maps a
/// start shares) it was made from, which outlive every write.
#[derive(Clone, Copy, Debug)]
pub struct TrieWriter {
    v4: RawFd,
    v6: RawFd,
}

impl TrieWriter {
    pub fn new(v4: RawFd, v6: RawFd) -> TrieWriter {
        TrieWriter { v4, v6 }
    }

    fn fd(&self, v6: bool) -> RawFd {
        if v6 { self.v6 } else { self.v4 }
    }

    /// Inserts (or replaces) the value of `net`, or with `None` removes it
    /// (an entry not there is fine). Atomic for that prefix.
    pub fn set(&self, net: IpNet, rule: Option<&Rule>) -> Result<()> {
        let r = match (net.trunc(), rule) {
            (IpNet::V4(n), Some(r)) => batch::update_elem(self.v4, &LpmKey::v4(&n), r),
            (IpNet::V4(n), None) => batch::delete_elem(self.v4, &LpmKey::v4(&n)),
            (IpNet::V6(n), Some(r)) => batch::update_elem(self.v6, &LpmKey::v6(&n), r),
            (IpNet::V6(n), None) => batch::delete_elem(self.v6, &LpmKey::v6(&n)),
        };
        r.map_err(Error::kernel(format!("the rule for {net}")))
    }

    /// Writes each prefix with its own value, batched per family, in
    /// batches of [`CHUNK`], taken from `entries` as they are written (a
    /// 1 000 000-rule start's keys and values are 5 MB at a time, not a
    /// copy of them all). Where the kernel has no batch writes for tries,
    /// or a trie is full, the rest of a batch go one at a time; at a full
    /// trie `make_room(net)` may remove an entry of `net`'s family (and
    /// says whether it did) before `net` is tried again, else the error is
    /// returned.
    pub fn write_each(
        &self,
        entries: impl IntoIterator<Item = (IpNet, Rule)>,
        mut make_room: impl FnMut(&IpNet) -> Result<bool>,
    ) -> Result<()> {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for e in entries {
            let list = if e.0.addr().is_ipv6() { &mut v6 } else { &mut v4 };
            list.push(e);
            if list.len() == CHUNK {
                let is_v6 = e.0.addr().is_ipv6();
                self.write_batch(is_v6, list, &mut make_room)?;
                list.clear();
            }
        }
        self.write_batch(false, &v4, &mut make_room)?;
        self.write_batch(true, &v6, &mut make_room)
    }

    /// One batch of [`TrieWriter::write_each`], all of one family.
    fn write_batch(
        &self,
        v6: bool,
        list: &[(IpNet, Rule)],
        make_room: &mut impl FnMut(&IpNet) -> Result<bool>,
    ) -> Result<()> {
        if list.is_empty() {
            return Ok(());
        }
        let (mut keys, mut values) =
            (Vec::with_capacity(list.len() * KEY_V6), Vec::with_capacity(list.len() * size_of::<Rule>()));
        for (n, r) in list {
            pack(n, &mut keys);
            values.extend_from_slice(rule_bytes(r));
        }
        let (done, err) = batch::update(self.fd(v6), &keys, &values, list.len());
        match err {
            None => {}
            Some(e) if no_batch(&e) || e.raw_os_error() == Some(libc::ENOSPC) => {
                for (net, rule) in &list[done..] {
                    loop {
                        match self.set(*net, Some(rule)) {
                            Err(e) if e.errno() == Some(libc::ENOSPC) => {
                                if !make_room(net)? {
                                    return Err(e);
                                }
                            }
                            r => break r?,
                        }
                    }
                }
            }
            Some(source) => return Err(Error::Kernel { what: "rule tries: batch update".into(), source }),
        }
        Ok(())
    }

    /// Writes `nets`, all of one family (`v6`), with one `value`: batches
    /// of [`CHUNK`] where the kernel has them for tries (5.13+), else one
    /// entry at a time.
    pub fn write_all(&self, v6: bool, nets: &[IpNet], value: &Rule) -> Result<()> {
        let fd = self.fd(v6);
        let values: Vec<u8> = rule_bytes(value).repeat(CHUNK.min(nets.len()));
        for chunk in nets.chunks(CHUNK) {
            let mut keys = Vec::with_capacity(chunk.len() * KEY_V6);
            chunk.iter().for_each(|n| pack(n, &mut keys));
            let (done, err) = batch::update(fd, &keys, &values, chunk.len());
            match err {
                None => {}
                Some(e) if no_batch(&e) => {
                    for n in &chunk[done..] {
                        self.set(*n, Some(value)).map_err(|e| rule_tries(&format!("writing {n}"), e))?;
                    }
                }
                Some(source) => {
                    return Err(Error::Kernel { what: format!("rule tries: writing {} prefixes", nets.len()), source });
                }
            }
        }
        Ok(())
    }

    /// Removes `nets`, all of one family (`v6`); an entry not there is fine.
    pub fn delete_all(&self, v6: bool, nets: &[IpNet]) -> Result<()> {
        let fd = self.fd(v6);
        let ksize = if v6 { KEY_V6 } else { KEY_V4 };
        for chunk in nets.chunks(CHUNK) {
            let mut keys = Vec::with_capacity(chunk.len() * ksize);
            chunk.iter().for_each(|n| pack(n, &mut keys));
            let mut at = 0;
            while at < chunk.len() {
                let (done, err) = batch::delete(fd, &keys[at * ksize..], chunk.len() - at);
                match err {
                    None => break,
                    // The entry at `done` is not there: skip it.
                    Some(e) if e.raw_os_error() == Some(libc::ENOENT) => at += done + 1,
                    Some(e) if no_batch(&e) => {
                        for n in &chunk[at + done..] {
                            self.set(*n, None).map_err(|e| rule_tries(&format!("removing {n}"), e))?;
                        }
                        break;
                    }
                    Some(source) => {
                        return Err(Error::Kernel {
                            what: format!("rule tries: removing {} prefixes", nets.len()),
                            source,
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// A one-entry error of a bulk write, named as the bulk writes name theirs.
fn rule_tries(what: &str, e: Error) -> Error {
    match e {
        Error::Kernel { source, .. } => Error::Kernel { what: format!("rule tries: {what}"), source },
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_length_in_host_order_then_the_network() {
        let n: Ipv4Net = "192.0.2.0/24".parse().unwrap();
        let k = LpmKey::v4(&n);
        assert_eq!((k.len, k.data), (24, [192, 0, 2, 0]));
        let mut packed = Vec::new();
        pack(&IpNet::V4(n), &mut packed);
        assert_eq!(packed.len(), KEY_V4);
        assert_eq!(packed[..4], 24u32.to_ne_bytes());
        assert_eq!(packed[4..], [192, 0, 2, 0]);
        let n: IpNet = "2001:db8::/32".parse().unwrap();
        let mut packed = Vec::new();
        pack(&n, &mut packed);
        assert_eq!(packed.len(), KEY_V6);
        assert_eq!(packed[..4], 32u32.to_ne_bytes());
        assert_eq!(packed[4..8], [0x20, 0x01, 0x0d, 0xb8]);
        assert!(packed[8..].iter().all(|b| *b == 0));
    }

    /// The bytes of a value as it sits in memory (what update_elem hands
    /// the kernel), padding and all.
    fn memory<T>(v: &T) -> Vec<u8> {
        // SAFETY: reads size_of::<T>() bytes of a live value.
        unsafe { std::slice::from_raw_parts(v as *const T as *const u8, size_of::<T>()) }.to_vec()
    }

    #[test]
    fn a_packed_key_is_the_key_the_kernel_reads_one_at_a_time() {
        // The bytes of LpmKey in memory (update_elem) and of pack (batches)
        // agree, and unpack gives the prefix back.
        for s in ["10.0.0.0/8", "203.0.113.7/32", "0.0.0.0/0", "2001:db8:1::/48", "::/0", "2001:db8::1/128"] {
            let n: IpNet = s.parse().unwrap();
            let one = match n {
                IpNet::V4(n) => memory(&LpmKey::v4(&n)),
                IpNet::V6(n) => memory(&LpmKey::v6(&n)),
            };
            let mut packed = Vec::new();
            pack(&n, &mut packed);
            assert_eq!(packed, one, "{s}");
            assert_eq!(unpack(&packed), Some(n), "{s}");
        }
        assert_eq!(unpack(&[0; 7]), None, "not a key's size");
        assert_eq!(unpack(&[33, 0, 0, 0, 10, 0, 0, 0]), None, "a length past the family's");
    }

    #[test]
    fn only_a_missing_batch_falls_back() {
        for errno in [libc::EINVAL, libc::EOPNOTSUPP, ENOTSUPP] {
            assert!(no_batch(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
        for errno in [libc::ENOSPC, libc::EPERM, libc::ENOMEM, libc::EFAULT] {
            assert!(!no_batch(&io::Error::from_raw_os_error(errno)), "{errno}");
        }
    }

    #[test]
    fn a_kernel_error_carries_its_errno_and_names_the_write() {
        let e = Error::kernel("the rule for 10.0.0.0/8")(io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.errno(), Some(libc::ENOSPC));
        let e = rule_tries("writing 10.0.0.0/8", e);
        assert_eq!(e.errno(), Some(libc::ENOSPC));
        assert!(e.to_string().starts_with("rule tries: writing 10.0.0.0/8: "), "{e}");
        assert_eq!(Error::Invalid("x".into()).errno(), None);
    }
}
