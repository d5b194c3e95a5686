//! What the harness writes: every byte belongs to a 16-byte *unit* aligned
//! in the file, stamped with the file it was written to, its index there
//! and a version, behind a magic and a checksum. A unit found anywhere is
//! attributed at once: in another worker's file it is a leak, in a filler
//! file it is a write that reached freed blocks.

/// Bytes per stamped unit.
pub const UNIT: u64 = 16;
const MAGIC: [u8; 2] = [0xA5, 0x5A];

/// xorshift64*: the schedule's randomness (the same seed, the same schedule).
#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, never zero.
        let mut state = seed;
        Rng(moneta_model::kernel::rng::splitmix64(&mut state) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// A length from 1 byte to `max`, small ones most often (log-uniform).
    pub fn length(&mut self, max: u64) -> u64 {
        let bits = 64 - max.leading_zeros() as u64;
        let top = 1u64 << self.below(bits);
        (top + self.below(top)).clamp(1, max)
    }
}

fn checksum(head: &[u8; 12]) -> u32 {
    let mut h: u32 = 0x811C_9DC5;
    for &b in head {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    h | 1
}

/// The unit at index `index` of file `file`, version `version`.
pub fn unit(file: u16, index: u64, version: u32) -> [u8; 16] {
    let mut head = [0u8; 12];
    head[..2].copy_from_slice(&MAGIC);
    head[2..4].copy_from_slice(&file.to_le_bytes());
    head[4..8].copy_from_slice(&(index as u32).to_le_bytes());
    head[8..12].copy_from_slice(&version.to_le_bytes());
    let mut u = [0u8; 16];
    u[..12].copy_from_slice(&head);
    u[12..].copy_from_slice(&checksum(&head).to_le_bytes());
    u
}

/// Fill `buf` with what file `file` holds at `offset` once version
/// `version` is written there.
pub fn fill(buf: &mut [u8], file: u16, offset: u64, version: u32) {
    let mut at = 0usize;
    while at < buf.len() {
        let pos = offset + at as u64;
        let u = unit(file, pos / UNIT, version);
        let skip = (pos % UNIT) as usize;
        let n = (UNIT as usize - skip).min(buf.len() - at);
        buf[at..at + n].copy_from_slice(&u[skip..skip + n]);
        at += n;
    }
}

pub fn stamped(len: u64, file: u16, offset: u64, version: u32) -> Vec<u8> {
    let mut v = vec![0u8; len as usize];
    fill(&mut v, file, offset, version);
    v
}

/// A whole, valid unit: (file, index, version).
pub fn parse(u: &[u8]) -> Option<(u16, u32, u32)> {
    if u.len() < 16 || u[..2] != MAGIC {
        return None;
    }
    let head: [u8; 12] = u[..12].try_into().ok()?;
    if u32::from_le_bytes(u[12..16].try_into().ok()?) != checksum(&head) {
        return None;
    }
    Some((
        u16::from_le_bytes([u[2], u[3]]),
        u32::from_le_bytes(u[4..8].try_into().ok()?),
        u32::from_le_bytes(u[8..12].try_into().ok()?),
    ))
}

/// FNV-1a of a byte string (results logged by the workers).
pub fn digest(b: &[u8]) -> u64 {
    moneta_model::kernel::hash::fnv1a(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_round_trip_and_pieces_line_up() {
        let u = unit(7, 1234, 99);
        assert_eq!(parse(&u), Some((7, 1234, 99)));
        let mut bad = u;
        bad[5] ^= 1;
        assert_eq!(parse(&bad), None);
        let whole = stamped(64, 3, 32, 5);
        let mut piece = vec![0u8; 21];
        fill(&mut piece, 3, 37, 5);
        assert_eq!(&whole[5..26], &piece[..]);
        assert_eq!(parse(&whole[16..32]), Some((3, 3, 5)));
    }

    #[test]
    fn lengths_stay_in_bounds() {
        let mut r = Rng::new(1);
        for _ in 0..10_000 {
            let n = r.length(1 << 20);
            assert!((1..=1 << 20).contains(&n));
        }
    }
}
