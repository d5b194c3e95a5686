//! The register model of the SAN's chaos checker and of the replica
//! protocol's simulator (issue 22 item 6, issue 39 item 6; Jepsen's register
//! checker is the model): versioned, checksummed 4 KB blocks, each with one
//! writer (its versions 1, 2, 3, … in order), and the rule a read of one
//! must follow.
//!
//! A read that began after version `a` was acknowledged and after a read
//! returned `r` must return a version in `max(a, r) ..= started` (the
//! highest version whose write was started: a write that failed may or may
//! not have landed) or an error. An older version is **stale**, zeros where
//! a version was acknowledged are **lost**, bytes that are not one whole
//! version are **mixed**; a version older than one a read already returned
//! is allowed by the rule ("went back") and counted apart.

use moneta_model::kernel::rng::Rng;
use moneta_wire::crc32c::crc32c;

/// Every block is one request of this size.
pub const BLOCK_BYTES: usize = 4096;
const MAGIC: u64 = 0x4d6f_6e65_7461_4348; // "MonetaCH"
/// Bytes of header before the payload: magic, block, version, seed, CRC32C
/// (hardware CRC: a simulated operation makes and checks blocks by the
/// thousand, and FNV-1a's byte-serial multiplies were a fifth of its CPU).
const HEADER: usize = 40;

/// The nemesis's `resolve --discard` step, in the chaos checker and the
/// simulator alike: the `k`-th of the nodes reporting a split brain
/// (`k` is drawn with the step), or none (counted `resolve-none`).
pub fn resolve_target<T: Copy>(split_brain: &[T], k: usize) -> Option<T> {
    (!split_brain.is_empty()).then(|| split_brain[k % split_brain.len()])
}

/// The bytes of `block` at `version` in the run of `seed`: a header (magic,
/// block, version, seed, CRC32C of the payload) and a seeded payload.
pub fn block_content(seed: u64, block: u64, version: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_BYTES];
    Rng::new(seed ^ (block << 32) ^ version.rotate_left(17) ^ MAGIC).fill(&mut b[HEADER..]);
    let sum = u64::from(crc32c(&b[HEADER..]));
    for (i, word) in [MAGIC, block, version, seed, sum].into_iter().enumerate() {
        b[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    b
}

/// What a read of a block returned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// All zeros: never written (version 0).
    Zero,
    /// One whole version of this block.
    Version(u64),
    /// Anything else; the header's claim and where the bytes first differ
    /// from the version it claims.
    Mixed { claims: String, first_bad: usize },
}

pub fn decode(seed: u64, block: u64, got: &[u8]) -> Decoded {
    if got.iter().all(|&x| x == 0) {
        return Decoded::Zero;
    }
    let word = |i: usize| u64::from_le_bytes(got[i * 8..i * 8 + 8].try_into().unwrap());
    let (magic, b, v, s, sum) = (word(0), word(1), word(2), word(3), word(4));
    let expected = block_content(seed, block, v);
    let Some(first_bad) = got.iter().zip(&expected).position(|(x, y)| x != y) else {
        return Decoded::Version(v);
    };
    // Only a read that is not one whole version pays for its description.
    let claims = format!(
        "magic {magic:#x} block {b} version {v} seed {s}, checksum {}",
        if u64::from(crc32c(&got[HEADER..])) == sum {
            "matches"
        } else {
            "BAD"
        }
    );
    Decoded::Mixed { claims, first_bad }
}

/// A read's lower bound, taken when it begins.
#[derive(Clone, Copy)]
pub struct Floor {
    /// Highest version acknowledged when the read began.
    pub acked: u64,
    /// Highest version a completed read had returned when it began.
    pub read: u64,
}

/// The verdict on one read of a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Fine(u64),
    Stale {
        got: u64,
        acked: u64,
    },
    Lost {
        acked: u64,
    },
    WentBack {
        got: u64,
        read: u64,
    },
    Mixed(String),
    /// A version that was never started: another run's data or garbage
    /// that happens to be a whole version (counted as mixed).
    Future {
        got: u64,
        started: u64,
    },
}

impl Verdict {
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Fine(_) => "fine",
            Verdict::Stale { .. } => "stale",
            Verdict::Lost { .. } => "lost",
            Verdict::WentBack { .. } => "went-back",
            Verdict::Mixed(_) | Verdict::Future { .. } => "mixed",
        }
    }
}

/// The register rule: a read that began at `floor` and ended when version
/// `started` was the newest started returns one of `max(acked, read) ..=
/// started`, else it is a failure.
pub fn judge(floor: Floor, started: u64, decoded: &Decoded) -> Verdict {
    let got = match decoded {
        Decoded::Mixed { claims, first_bad } => {
            return Verdict::Mixed(format!("{claims}; first differing byte at {first_bad}"))
        }
        Decoded::Zero => 0,
        Decoded::Version(v) => *v,
    };
    if got > started {
        Verdict::Future { got, started }
    } else if got < floor.acked && got == 0 {
        Verdict::Lost { acked: floor.acked }
    } else if got < floor.acked {
        Verdict::Stale {
            got,
            acked: floor.acked,
        }
    } else if got < floor.read {
        Verdict::WentBack {
            got,
            read: floor.read,
        }
    } else {
        Verdict::Fine(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: u64 = 7;

    fn floor(acked: u64, read: u64) -> Floor {
        Floor { acked, read }
    }

    #[test]
    fn a_whole_version_decodes_and_anything_else_is_mixed() {
        let v3 = block_content(SEED, 5, 3);
        assert_eq!(decode(SEED, 5, &v3), Decoded::Version(3));
        assert_eq!(decode(SEED, 5, &[0u8; BLOCK_BYTES]), Decoded::Zero);
        // Half of version 3, half of version 4.
        let v4 = block_content(SEED, 5, 4);
        let mut torn = v3.clone();
        torn[2048..].copy_from_slice(&v4[2048..]);
        assert!(matches!(
            decode(SEED, 5, &torn),
            Decoded::Mixed {
                first_bad: 2048,
                ..
            }
        ));
        // One flipped bit.
        let mut flipped = v3.clone();
        flipped[1000] ^= 1;
        assert!(matches!(decode(SEED, 5, &flipped), Decoded::Mixed { .. }));
        // Another block's version, another run's.
        assert!(matches!(decode(SEED, 6, &v3), Decoded::Mixed { .. }));
        assert!(matches!(decode(SEED + 1, 5, &v3), Decoded::Mixed { .. }));
        // Zeros over part of a block.
        let mut holed = v3;
        holed[4000..].fill(0);
        assert!(matches!(decode(SEED, 5, &holed), Decoded::Mixed { .. }));
    }

    #[test]
    fn the_register_rule() {
        let v = Decoded::Version;
        // The acknowledged version, or one started since (it may have landed).
        assert_eq!(judge(floor(3, 0), 5, &v(3)), Verdict::Fine(3));
        assert_eq!(judge(floor(3, 0), 5, &v(5)), Verdict::Fine(5));
        // Older than acknowledged before the read began.
        assert_eq!(
            judge(floor(3, 0), 5, &v(2)),
            Verdict::Stale { got: 2, acked: 3 }
        );
        assert_eq!(
            judge(floor(3, 0), 5, &Decoded::Zero),
            Verdict::Lost { acked: 3 }
        );
        // Zeros are fine before anything was acknowledged.
        assert_eq!(judge(floor(0, 0), 1, &Decoded::Zero), Verdict::Fine(0));
        // A failed write's version seen, then an older one: went back.
        assert_eq!(
            judge(floor(3, 4), 4, &v(3)),
            Verdict::WentBack { got: 3, read: 4 }
        );
        // Never written.
        assert_eq!(
            judge(floor(0, 0), 2, &v(9)),
            Verdict::Future { got: 9, started: 2 }
        );
        assert_eq!(Verdict::Future { got: 9, started: 2 }.kind(), "mixed");
    }
}
