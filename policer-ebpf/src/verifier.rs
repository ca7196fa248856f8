//! What the program does for the verifier's sake rather than the policy's.

use crate::maps::CPU_SCRATCH;

/// `x`, passed through this CPU's scratch map value, so that the verifier
/// sees a number it cannot know (range checks still bound it) and walks
/// what follows once, not once per value `x` could take.
#[inline(always)]
pub(crate) fn launder(x: u64) -> u64 {
    match CPU_SCRATCH.get_ptr_mut(0) {
        // SAFETY: this CPU's slot; only this CPU touches it while we run.
        Some(s) => unsafe {
            core::ptr::write_volatile(&raw mut (*s).opaque, x);
            core::ptr::read_volatile(&(*s).opaque)
        },
        None => x,
    }
}

/// A lookup in an LPM trie whose value the kernel stores right after the
/// key's data (`trie_lookup_elem`: `found->data + trie->data_size`): for the
/// IPv4 rule trie at offset 4, so its `Rule` is only 4-aligned there. aya's
/// typed `btf_maps::LpmTrie::get` refuses such a trie at compile time; the
/// program has always read it so (the JITs load unaligned words, and the
/// verifier checks alignment only under BPF_F_STRICT_ALIGNMENT). The same
/// helper call as `get`.
#[inline(always)]
pub(crate) fn trie_get<M, K, V>(map: &'static M, key: &aya_ebpf::maps::lpm_trie::Key<K>) -> Option<&'static V> {
    // SAFETY: `map` is a map definition (its address is what the loader
    // relocates), `key` a whole key; the kernel returns a value or null.
    unsafe {
        let p = aya_ebpf::helpers::bpf_map_lookup_elem(
            core::ptr::from_ref(map).cast_mut().cast(),
            core::ptr::from_ref(key).cast(),
        );
        p.cast::<V>().cast_const().as_ref()
    }
}
