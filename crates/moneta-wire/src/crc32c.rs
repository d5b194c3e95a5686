//! CRC32C (Castagnoli, the iSCSI checksum, RFC 3720) of a frame (SPEC §4.2).
//!
//! The hardware checks each frame's Ethernet FCS and drops corrupt ones
//! before processing them (A.6); a packet socket never shows the FCS, and a
//! UDP datagram's 16-bit checksum is weak, so every QuickSAN frame carries
//! its own CRC32C. On x86-64 with SSE4.2 the `crc32` instruction computes it
//! (three interleaved streams, about 8 bytes per cycle: an 8 KB frame costs
//! a few hundred ns); elsewhere a byte-wise table. Both give the same value
//! (tested).

/// Reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

const fn make_table() -> [u32; 256] {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
}

static TABLE: [u32; 256] = make_table();

/// CRC32C of `bytes`.
pub fn crc32c(bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2, checked just above.
            return unsafe { crc32c_sse42(bytes) };
        }
    }
    crc32c_table(bytes)
}

/// The portable version (and the reference the hardware one is tested with).
pub fn crc32c_table(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ u32::from(b)) & 0xFF) as usize] ^ (crc >> 8);
    }
    !crc
}

/// Bytes per stream in one round of three interleaved streams.
const BLOCK: usize = 512;

/// The register after `n` zero bytes, as byte tables: linear over GF(2),
/// so `shift(v) = T0[v & 0xFF] ^ T1[v >> 8 & 0xFF] ^ ...`.
struct Shift([[u32; 256]; 4]);

impl Shift {
    fn new(n: usize) -> Shift {
        let mut t = [[0u32; 256]; 4];
        for (k, row) in t.iter_mut().enumerate() {
            for (b, entry) in row.iter_mut().enumerate() {
                let mut x = (b as u32) << (8 * k);
                for _ in 0..n {
                    x = TABLE[(x & 0xFF) as usize] ^ (x >> 8);
                }
                *entry = x;
            }
        }
        Shift(t)
    }

    fn apply(&self, v: u32) -> u32 {
        self.0[0][(v & 0xFF) as usize]
            ^ self.0[1][(v >> 8 & 0xFF) as usize]
            ^ self.0[2][(v >> 16 & 0xFF) as usize]
            ^ self.0[3][(v >> 24) as usize]
    }
}

/// The `crc32` instruction takes 3 cycles and can start one a cycle: three
/// independent streams over consecutive blocks keep it busy (about 3× one
/// stream's speed), and the register is linear, so the streams combine as
/// R(s, A‖B‖C) = Z(Z(R(s, A)) ^ R(0, B)) ^ R(0, C), where Z feeds `BLOCK`
/// zero bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    static SHIFT: std::sync::OnceLock<Shift> = std::sync::OnceLock::new();
    let word = |b: &[u8], i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let mut crc = u64::from(!0u32);
    let mut rounds = bytes.chunks_exact(3 * BLOCK);
    if rounds.len() > 0 {
        let shift = SHIFT.get_or_init(|| Shift::new(BLOCK));
        for round in &mut rounds {
            let (a, rest) = round.split_at(BLOCK);
            let (b, c) = rest.split_at(BLOCK);
            let (mut ca, mut cb, mut cc) = (crc, 0u64, 0u64);
            for i in (0..BLOCK).step_by(8) {
                ca = _mm_crc32_u64(ca, word(a, i));
                cb = _mm_crc32_u64(cb, word(b, i));
                cc = _mm_crc32_u64(cc, word(c, i));
            }
            let ab = shift.apply(ca as u32) ^ cb as u32;
            crc = u64::from(shift.apply(ab) ^ cc as u32);
        }
    }
    let mut words = rounds.remainder().chunks_exact(8);
    for w in &mut words {
        let v = u64::from_le_bytes(w.try_into().expect("8 bytes"));
        crc = _mm_crc32_u64(crc, v);
    }
    let mut crc = crc as u32;
    for &b in words.remainder() {
        crc = _mm_crc32_u8(crc, b);
    }
    !crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use moneta_model::kernel::rng::Rng;

    #[test]
    fn check_value() {
        // The standard check value of CRC-32C (RFC 3720 B.4 catalogue).
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_table(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[]), 0);
        // RFC 3720 B.4: 32 bytes of zeros.
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
    }

    #[test]
    fn hardware_and_table_agree() {
        let seed = 0xC3C3_0001;
        eprintln!("crc32c seed {seed:#x}");
        let mut rng = Rng::new(seed);
        for _ in 0..500 {
            let len = rng.below(20_000) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            assert_eq!(crc32c(&bytes), crc32c_table(&bytes), "len {len}");
        }
    }
}
