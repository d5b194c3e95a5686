//! CRC32C (Castagnoli, the iSCSI checksum, RFC 3720) of a frame (SPEC §4.2).
//!
//! The hardware checks each frame's Ethernet FCS and drops corrupt ones
//! before processing them (A.6); a packet socket never shows the FCS, and a
//! UDP datagram's 16-bit checksum is weak, so every QuickSAN frame carries
//! its own CRC32C. On x86-64 with SSE4.2 the `crc32` instruction computes it
//! (about 8 bytes per cycle: an 8 KB frame costs a few hundred ns); elsewhere
//! a byte-wise table. Both give the same value (tested).

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

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn crc32c_sse42(bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut crc = u64::from(!0u32);
    let mut words = bytes.chunks_exact(8);
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
            let len = rng.below(9000) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            assert_eq!(crc32c(&bytes), crc32c_table(&bytes), "len {len}");
        }
    }
}
