//! QuickSAN's packets on the wire (SPEC §4.2, Appendix A.6, Table A.3).
//!
//! Raw Ethernet frames with a custom low-level protocol. Four packet types:
//! read request, write request (with payload), read completion (with
//! payload), write completion. The header is four 8-byte rows (Table A.3
//! draws each row with byte 0 on the right):
//!
//! | bytes  | field |
//! |--------|-------|
//! | 0..6   | destination MAC |
//! | 6..12  | source MAC |
//! | 12..14 | ethertype, the bytes 0x88 0x70 |
//! | 14..16 | INDEX (bits 15..4: the source's index into the identical, preconfigured MAC tables) and OP (bits 3..0) |
//! | 16..24 | write address: the byte address in the destination device's memory |
//! | 24     | CTRL |
//! | 25     | CMD (the device command byte of SPEC §1.2: opcode bits 1..0) |
//! | 26..28 | OFFSETS: the source's slot of this segment (where a completion lands) |
//! | 28..30 | TAG: the source request's physical tag |
//! | 30..32 | SIZE: payload bytes (at most one 8 KB transfer buffer) |
//! | 32..   | payload (write data, read completion data) |
//!
//! Table A.3 gives the fields and their rows, not every width; the widths of
//! the last row and the byte order (big-endian, as Ethernet's own fields)
//! are this model's choice. Multi-byte fields are big-endian.
//!
//! On the wire every frame also pays Ethernet's framing: preamble and start
//! delimiter (8 B), frame check sequence (4 B), the inter-frame gap (12 B),
//! and padding to the 64-byte minimum frame (header + FCS).
//!
//! Decoding never panics: bytes from the network are untrusted and anything
//! malformed is a [`PacketError`]. Left out: VLAN tags, jumbo-frame
//! negotiation (a QuickSAN frame with an 8 KB payload is a jumbo frame).

use std::fmt;

/// The header of every QuickSAN packet (Table A.3).
pub const HEADER_BYTES: u64 = 32;
/// Ethertype QuickSAN uses (Table A.3: bytes 0x88 0x70).
pub const ETHERTYPE: [u8; 2] = [0x88, 0x70];
/// Preamble and start-of-frame delimiter.
pub const PREAMBLE_BYTES: u64 = 8;
/// Frame check sequence (CRC-32).
pub const FCS_BYTES: u64 = 4;
/// Idle time between frames, in byte times.
pub const INTER_FRAME_GAP_BYTES: u64 = 12;
/// Smallest Ethernet frame, header to FCS.
pub const MIN_FRAME_BYTES: u64 = 64;
/// Largest payload a packet carries: one transfer buffer (SPEC §1.4).
pub const MAX_PAYLOAD_BYTES: u64 = 8192;
/// INDEX is 12 bits: at most this many nodes share a MAC table.
pub const MAX_NODES: u16 = 1 << 12;

/// Bytes one frame occupies on a link: preamble, frame (padded to the
/// minimum, with FCS) and the gap after it.
pub fn wire_bytes(frame_bytes_without_fcs: u64) -> u64 {
    PREAMBLE_BYTES
        + (frame_bytes_without_fcs + FCS_BYTES).max(MIN_FRAME_BYTES)
        + INTER_FRAME_GAP_BYTES
}

/// Bytes of a frame until its last bit has arrived (no gap after it).
pub fn arrival_bytes(frame_bytes_without_fcs: u64) -> u64 {
    wire_bytes(frame_bytes_without_fcs) - INTER_FRAME_GAP_BYTES
}

/// The four packet types (the OP field, bits 3..0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PacketKind {
    ReadRequest,
    WriteRequest,
    ReadCompletion,
    WriteCompletion,
}

impl PacketKind {
    fn op(self) -> u8 {
        match self {
            PacketKind::ReadRequest => 1,
            PacketKind::WriteRequest => 2,
            PacketKind::ReadCompletion => 3,
            PacketKind::WriteCompletion => 4,
        }
    }

    fn from_op(op: u8) -> Option<PacketKind> {
        Some(match op {
            1 => PacketKind::ReadRequest,
            2 => PacketKind::WriteRequest,
            3 => PacketKind::ReadCompletion,
            4 => PacketKind::WriteCompletion,
            _ => return None,
        })
    }

    /// Packets that carry data (write requests, read completions).
    pub fn has_payload(self) -> bool {
        matches!(self, PacketKind::WriteRequest | PacketKind::ReadCompletion)
    }
}

/// A 48-bit MAC address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// The locally administered address this model gives node `index`.
    pub fn of_node(index: u16) -> Mac {
        let [hi, lo] = index.to_be_bytes();
        Mac([0x02, 0x4d, 0x4e, 0x54, hi, lo])
    }
}

/// A decoded header (Table A.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PacketHeader {
    pub kind: PacketKind,
    pub dest: Mac,
    pub src: Mac,
    /// The source's index in the shared MAC table (12 bits).
    pub src_index: u16,
    /// Byte address in the destination device's memory (requests).
    pub addr: u64,
    pub ctrl: u8,
    pub cmd: u8,
    /// The source's slot for this segment.
    pub offsets: u16,
    pub tag: u16,
    /// Payload bytes that follow the header.
    pub size: u16,
}

impl PacketHeader {
    pub fn payload_bytes(&self) -> u64 {
        if self.kind.has_payload() {
            u64::from(self.size)
        } else {
            0
        }
    }

    /// Header and payload: what the frame holds before its FCS, and what the
    /// receive packet buffer stores.
    pub fn frame_bytes(&self) -> u64 {
        HEADER_BYTES + self.payload_bytes()
    }

    /// The 32 header bytes. Fails on values the fields cannot hold.
    pub fn encode(&self) -> Result<[u8; HEADER_BYTES as usize], PacketError> {
        if self.src_index >= MAX_NODES {
            return Err(PacketError::IndexTooLarge(self.src_index));
        }
        if u64::from(self.size) > MAX_PAYLOAD_BYTES {
            return Err(PacketError::PayloadTooLarge(self.size));
        }
        let mut b = [0u8; HEADER_BYTES as usize];
        b[0..6].copy_from_slice(&self.dest.0);
        b[6..12].copy_from_slice(&self.src.0);
        b[12..14].copy_from_slice(&ETHERTYPE);
        let index_op = (self.src_index << 4) | u16::from(self.kind.op());
        b[14..16].copy_from_slice(&index_op.to_be_bytes());
        b[16..24].copy_from_slice(&self.addr.to_be_bytes());
        b[24] = self.ctrl;
        b[25] = self.cmd;
        b[26..28].copy_from_slice(&self.offsets.to_be_bytes());
        b[28..30].copy_from_slice(&self.tag.to_be_bytes());
        b[30..32].copy_from_slice(&self.size.to_be_bytes());
        Ok(b)
    }

    /// Decode a frame (header and payload, FCS already checked by the MAC).
    /// Returns the header; the payload is `frame[32..]`.
    pub fn decode(frame: &[u8]) -> Result<PacketHeader, PacketError> {
        let Some(b) = frame.get(..HEADER_BYTES as usize) else {
            return Err(PacketError::Truncated {
                bytes: frame.len(),
                needed: HEADER_BYTES as usize,
            });
        };
        if b[12..14] != ETHERTYPE {
            return Err(PacketError::NotQuickSan([b[12], b[13]]));
        }
        let field16 = |at: usize| u16::from_be_bytes([b[at], b[at + 1]]);
        let mac = |at: usize| {
            let mut m = [0u8; 6];
            m.copy_from_slice(&b[at..at + 6]);
            Mac(m)
        };
        let index_op = field16(14);
        let op = (index_op & 0xF) as u8;
        let kind = PacketKind::from_op(op).ok_or(PacketError::UnknownOp(op))?;
        let size = field16(30);
        if u64::from(size) > MAX_PAYLOAD_BYTES {
            return Err(PacketError::PayloadTooLarge(size));
        }
        let header = PacketHeader {
            kind,
            dest: mac(0),
            src: mac(6),
            src_index: index_op >> 4,
            addr: u64::from_be_bytes(b[16..24].try_into().expect("8 bytes")),
            ctrl: b[24],
            cmd: b[25],
            offsets: field16(26),
            tag: field16(28),
            size,
        };
        let needed = header.frame_bytes() as usize;
        if frame.len() < needed {
            return Err(PacketError::Truncated {
                bytes: frame.len(),
                needed,
            });
        }
        Ok(header)
    }
}

/// Why bytes are not a QuickSAN packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PacketError {
    Truncated { bytes: usize, needed: usize },
    NotQuickSan([u8; 2]),
    UnknownOp(u8),
    PayloadTooLarge(u16),
    IndexTooLarge(u16),
}

impl fmt::Display for PacketError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PacketError::Truncated { bytes, needed } => {
                write!(f, "frame of {bytes} bytes, a packet needs {needed}")
            }
            PacketError::NotQuickSan(t) => {
                write!(f, "ethertype {:#04x}{:02x} is not QuickSAN's", t[0], t[1])
            }
            PacketError::UnknownOp(op) => write!(f, "unknown packet op {op}"),
            PacketError::PayloadTooLarge(s) => {
                write!(
                    f,
                    "payload of {s} bytes exceeds one {MAX_PAYLOAD_BYTES}-byte buffer"
                )
            }
            PacketError::IndexTooLarge(i) => write!(f, "source index {i} does not fit 12 bits"),
        }
    }
}

impl std::error::Error for PacketError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::rng::Rng;
    use proptest::prelude::*;

    fn header(kind: PacketKind) -> PacketHeader {
        PacketHeader {
            kind,
            dest: Mac::of_node(3),
            src: Mac::of_node(1),
            src_index: 1,
            addr: 0x0000_0001_2345_6000,
            ctrl: 0,
            cmd: 2,
            offsets: 7,
            tag: 63,
            size: 4096,
        }
    }

    #[test]
    fn table_a3_layout() {
        let b = header(PacketKind::WriteRequest).encode().unwrap();
        assert_eq!(&b[0..6], &Mac::of_node(3).0);
        assert_eq!(&b[6..12], &Mac::of_node(1).0);
        assert_eq!(&b[12..14], &[0x88, 0x70]);
        assert_eq!(u16::from_be_bytes([b[14], b[15]]), (1 << 4) | 2);
        assert_eq!(&b[16..24], &0x0000_0001_2345_6000u64.to_be_bytes());
        assert_eq!(u16::from_be_bytes([b[30], b[31]]), 4096);
    }

    #[test]
    fn ethernet_framing_overhead() {
        // A 32-byte header alone pads to the 64-byte minimum frame.
        assert_eq!(wire_bytes(HEADER_BYTES), 8 + 64 + 12);
        assert_eq!(arrival_bytes(HEADER_BYTES), 72);
        // A 4 KB write request: header, payload, FCS, preamble, gap.
        assert_eq!(wire_bytes(HEADER_BYTES + 4096), 8 + 32 + 4096 + 4 + 12);
    }

    proptest! {
        #[test]
        fn encode_decode_round_trip(
            op in 0usize..4, index in 0u16..MAX_NODES, addr: u64, ctrl: u8, cmd: u8,
            offsets: u16, tag: u16, size in 0u16..=8192, dest: [u8; 6], src: [u8; 6],
        ) {
            let kind = [PacketKind::ReadRequest, PacketKind::WriteRequest,
                PacketKind::ReadCompletion, PacketKind::WriteCompletion][op];
            let h = PacketHeader { kind, dest: Mac(dest), src: Mac(src), src_index: index,
                addr, ctrl, cmd, offsets, tag, size };
            let mut frame = h.encode().unwrap().to_vec();
            frame.resize(h.frame_bytes() as usize, 0xAB);
            prop_assert_eq!(PacketHeader::decode(&frame), Ok(h));
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let seed = 0x5eed_0001;
        eprintln!("garbage seed {seed:#x}");
        let mut rng = Rng::new(seed);
        let mut accepted = 0;
        for _ in 0..20_000 {
            let len = rng.below(80) as usize;
            let mut frame: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            // Half of them look like QuickSAN frames, to reach the later checks.
            if len >= 14 && rng.below(2) == 0 {
                frame[12..14].copy_from_slice(&ETHERTYPE);
            }
            if let Ok(h) = PacketHeader::decode(&frame) {
                accepted += 1;
                assert!(frame.len() as u64 >= h.frame_bytes());
                assert!(u64::from(h.size) <= MAX_PAYLOAD_BYTES);
            }
        }
        eprintln!("{accepted} random frames decoded as packets");
        assert_eq!(
            PacketHeader::decode(&[]),
            Err(PacketError::Truncated {
                bytes: 0,
                needed: 32
            })
        );
        let mut h = header(PacketKind::ReadCompletion).encode().unwrap();
        assert!(matches!(
            PacketHeader::decode(&h),
            Err(PacketError::Truncated { needed: 4128, .. })
        ));
        h[15] = 0x1F;
        assert_eq!(PacketHeader::decode(&h), Err(PacketError::UnknownOp(15)));
        h[12] = 0x08;
        assert!(matches!(
            PacketHeader::decode(&h),
            Err(PacketError::NotQuickSan(_))
        ));
        let mut big = header(PacketKind::WriteRequest);
        big.size = 8193;
        assert_eq!(big.encode(), Err(PacketError::PayloadTooLarge(8193)));
    }
}
