//! FNV-1a, 64-bit (Fowler, Noll and Vo): the one non-cryptographic hash of
//! the workspace, for checksums that must never change under a dependency
//! upgrade (STYLE.md rule 3): the replica simulator's trace hash, the SAN
//! register's payload sum, the torture workers' digests and the shortened
//! names of mount points' state directories, the VM runner's cached
//! initramfs names.

/// The FNV-1a offset basis: the hash of no bytes.
pub const FNV1A_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV1A_PRIME: u64 = 0x100_0000_01b3;

/// FNV-1a of `bytes`.
#[inline]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    fnv1a_extend(FNV1A_OFFSET, bytes)
}

/// Continues the FNV-1a hash `h` over `bytes` (a hash of a stream, piece by
/// piece: `fnv1a_extend(fnv1a(a), b) == fnv1a(a ++ b)`).
#[inline]
pub fn fnv1a_extend(h: u64, bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(h, |h, &x| (h ^ u64::from(x)).wrapping_mul(FNV1A_PRIME))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a_matches_the_published_vectors_and_extends() {
        // From the FNV reference test suite (64-bit FNV-1a).
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a_extend(fnv1a(b"foo"), b"bar"), fnv1a(b"foobar"));
    }
}
