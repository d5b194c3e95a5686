//! What goes on the wire (SPEC §4.2, Table A.3; issue 12 item 1).
//!
//! A QuickSAN frame, byte 0 first (multi-byte fields big-endian):
//!
//! | bytes        | field |
//! |--------------|-------|
//! | 0..32        | Table A.3 header, encoded by the model's codec (`moneta_model::device::packet`); bytes 12..14 carry the link's EtherType (0x8870 by default) |
//! | 32           | session version (3: the tag is AEGISMAC-128X4; 2 was keyed BLAKE3) |
//! | 33           | session flags: DATA (a QuickSAN packet follows), HELLO (answer at once), AUTH (the tag is a MAC) |
//! | 34..36       | frame number, bits 47..32 (the replay window's, `auth`) |
//! | 36..40       | sender's epoch (its incarnation of this session) |
//! | 40..44       | the receiver's epoch as the sender knows it (0: not yet known) |
//! | 44..48       | sequence number (DATA frames) |
//! | 48..52       | cumulative acknowledgement: the next sequence number expected from the receiver |
//! | 52..60       | selective acknowledgement: bit i set = frame ack+1+i is held |
//! | 60..64       | frame number, bits 31..0 |
//! | 64..64+P     | payload (P = SIZE for write requests and read completions, else 0) |
//! | 64+P..68+P   | CRC32C of bytes 0..64+P |
//! | 68+P..84+P   | tag: with the SAN's secret, AEGISMAC-128X4 over bytes 0..68+P, 16 bytes (`auth`); without, zeros |
//!
//! A session-only frame (an acknowledgement, heartbeat or probe, no
//! QuickSAN packet) has OP = 0 in the INDEX+OP field and zeros in the rest
//! of the Table A.3 rows: 84 bytes, above Ethernet's 60-byte minimum, so no
//! NIC pads it (the length is always taken from the header, never from the
//! end of what arrived).
//!
//! Pause frames are IEEE 802.3x MAC control frames (Annex 31B): destination
//! (the peer's unicast address, which 31B allows besides 01-80-C2-00-00-01),
//! source, EtherType 0x8808, opcode 0x0001, pause time in quanta of 512 bit
//! times; in 31B's reserved bytes, the frame number (18..24), the sender's
//! epoch (24..28) and the AUTH flag (28); zeros to 60 bytes; then, because
//! the FCS is not visible here, a CRC32C of those 60 bytes (60..64) and the
//! tag (64..80) as above.
//!
//! Parsing never panics: every byte that arrives is untrusted.

use crate::auth::Secret;
pub use crate::auth::TAG_BYTES;
use crate::crc32c::crc32c;
use moneta_model::device::packet::{
    self, Mac, PacketError, PacketHeader, HEADER_BYTES, MAX_PAYLOAD_BYTES,
};
use std::fmt;

/// The Table A.3 header.
pub const A3_BYTES: usize = HEADER_BYTES as usize;
/// The session header after it.
pub const SESSION_BYTES: usize = 32;
/// The CRC32C trailer.
pub const CRC_BYTES: usize = 4;
/// Where the payload starts.
pub const PAYLOAD_OFFSET: usize = A3_BYTES + SESSION_BYTES;
/// Everything but the payload.
pub const OVERHEAD_BYTES: usize = PAYLOAD_OFFSET + CRC_BYTES + TAG_BYTES;
/// The largest frame: one 8 KB transfer buffer of payload (8,276 bytes: a
/// jumbo frame on Ethernet).
pub const MAX_FRAME_BYTES: usize = OVERHEAD_BYTES + MAX_PAYLOAD_BYTES as usize;
/// The paper's EtherType (Table A.3).
pub const QUICKSAN_ETHERTYPE: u16 = u16::from_be_bytes(packet::ETHERTYPE);
/// IEEE 802.3 MAC control.
pub const MAC_CONTROL_ETHERTYPE: u16 = 0x8808;
/// 802.3x PAUSE opcode.
pub const PAUSE_OPCODE: u16 = 0x0001;
/// A pause frame: the 60-byte 802.3x frame, its CRC32C and its tag.
pub const PAUSE_FRAME_BYTES: usize = 60 + CRC_BYTES + TAG_BYTES;
/// The reserved multicast address of 802.3x pause frames.
pub const PAUSE_MULTICAST: Mac = Mac([0x01, 0x80, 0xC2, 0x00, 0x00, 0x01]);

/// The session version: a node of another version's frames are malformed
/// here (`BadVersion`), not forged.
pub const VERSION: u8 = 3;
/// Session flag: a QuickSAN packet follows the session header.
pub const FLAG_DATA: u8 = 0x01;
/// Session flag: the sender wants an answer now (a probe).
pub const FLAG_HELLO: u8 = 0x02;
/// Session (and pause) flag: the tag is a MAC under the SAN's secret.
pub const FLAG_AUTH: u8 = 0x04;

/// The session header (bytes 32..64).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SessionHeader {
    pub flags: u8,
    pub src_epoch: u32,
    pub dst_epoch: u32,
    pub seq: u32,
    pub ack: u32,
    pub sack: u64,
    /// The sender's number of this frame (48 bits; `auth`).
    pub counter: u64,
}

impl SessionHeader {
    fn write(&self, b: &mut [u8]) {
        b[0] = VERSION;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&((self.counter >> 32) as u16).to_be_bytes());
        b[4..8].copy_from_slice(&self.src_epoch.to_be_bytes());
        b[8..12].copy_from_slice(&self.dst_epoch.to_be_bytes());
        b[12..16].copy_from_slice(&self.seq.to_be_bytes());
        b[16..20].copy_from_slice(&self.ack.to_be_bytes());
        b[20..28].copy_from_slice(&self.sack.to_be_bytes());
        b[28..32].copy_from_slice(&(self.counter as u32).to_be_bytes());
    }

    fn read(b: &[u8]) -> Result<SessionHeader, FrameError> {
        if b[0] != VERSION {
            return Err(FrameError::BadVersion(b[0]));
        }
        let u32_at = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let mut sack = [0u8; 8];
        sack.copy_from_slice(&b[20..28]);
        Ok(SessionHeader {
            flags: b[1],
            src_epoch: u32_at(4),
            dst_epoch: u32_at(8),
            seq: u32_at(12),
            ack: u32_at(16),
            sack: u64::from_be_bytes(sack),
            counter: u64::from(u16::from_be_bytes([b[2], b[3]])) << 32 | u64::from(u32_at(28)),
        })
    }
}

/// Bytes of the frame that carries `header` (and its payload).
pub fn data_frame_bytes(header: &PacketHeader) -> usize {
    OVERHEAD_BYTES + header.payload_bytes() as usize
}

/// Write a QuickSAN packet's Table A.3 header and payload into `buf`; the
/// session header and CRC are written by [`seal`] at each transmission.
/// Returns the frame's length.
pub fn encode_data(
    buf: &mut [u8],
    header: &PacketHeader,
    ethertype: u16,
    payload: &[u8],
) -> Result<usize, PacketError> {
    let a3 = header.encode()?;
    let len = data_frame_bytes(header);
    debug_assert_eq!(payload.len(), header.payload_bytes() as usize);
    debug_assert!(buf.len() >= len);
    buf[..A3_BYTES].copy_from_slice(&a3);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
    buf[PAYLOAD_OFFSET..PAYLOAD_OFFSET + payload.len()].copy_from_slice(payload);
    Ok(len)
}

/// Write the session header into a frame of `len` bytes, its CRC32C and
/// its tag (a MAC under `secret`, which also sets FLAG_AUTH; else zeros).
pub fn seal(buf: &mut [u8], len: usize, session: &SessionHeader, secret: Option<&Secret>) {
    let mut session = *session;
    if secret.is_some() {
        session.flags |= FLAG_AUTH;
    }
    session.write(&mut buf[A3_BYTES..PAYLOAD_OFFSET]);
    let tag_at = len - TAG_BYTES;
    let crc_at = tag_at - CRC_BYTES;
    let crc = crc32c(&buf[..crc_at]);
    buf[crc_at..tag_at].copy_from_slice(&crc.to_be_bytes());
    tag(buf, tag_at, secret);
}

/// The tag at `tag_at` of a frame whose bytes before it are written.
fn tag(buf: &mut [u8], tag_at: usize, secret: Option<&Secret>) {
    let t = secret.map_or([0; TAG_BYTES], |s| s.tag(&buf[..tag_at]));
    buf[tag_at..tag_at + TAG_BYTES].copy_from_slice(&t);
}

/// Write a session-only frame (no QuickSAN packet); returns its length.
pub fn encode_control(
    buf: &mut [u8],
    dest: Mac,
    src: Mac,
    src_index: u16,
    ethertype: u16,
    session: &SessionHeader,
    secret: Option<&Secret>,
) -> usize {
    buf[..A3_BYTES].fill(0);
    buf[0..6].copy_from_slice(&dest.0);
    buf[6..12].copy_from_slice(&src.0);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
    // INDEX in bits 15..4, OP 0: no packet.
    buf[14..16].copy_from_slice(&((src_index & 0x0FFF) << 4).to_be_bytes());
    let len = OVERHEAD_BYTES;
    seal(buf, len, session, secret);
    len
}

/// What an 802.3x pause frame says besides its addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pause {
    /// Stop for this many × 512 bit times (0: resume).
    pub quanta: u16,
    /// The sender's epoch of its session with the receiver.
    pub epoch: u32,
    /// The sender's frame number (48 bits).
    pub counter: u64,
}

/// Write an 802.3x pause frame to `dest`; returns its length.
pub fn encode_pause(
    buf: &mut [u8],
    dest: Mac,
    src: Mac,
    pause: &Pause,
    secret: Option<&Secret>,
) -> usize {
    buf[..PAUSE_FRAME_BYTES].fill(0);
    buf[0..6].copy_from_slice(&dest.0);
    buf[6..12].copy_from_slice(&src.0);
    buf[12..14].copy_from_slice(&MAC_CONTROL_ETHERTYPE.to_be_bytes());
    buf[14..16].copy_from_slice(&PAUSE_OPCODE.to_be_bytes());
    buf[16..18].copy_from_slice(&pause.quanta.to_be_bytes());
    buf[18..24].copy_from_slice(&pause.counter.to_be_bytes()[2..8]);
    buf[24..28].copy_from_slice(&pause.epoch.to_be_bytes());
    if secret.is_some() {
        buf[28] = FLAG_AUTH;
    }
    let crc = crc32c(&buf[..60]);
    buf[60..64].copy_from_slice(&crc.to_be_bytes());
    tag(buf, 64, secret);
    PAUSE_FRAME_BYTES
}

/// A frame that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// An 802.3x pause (quanta 0: resume).
    Pause { src: Mac, pause: Pause },
    /// A session frame; `packet` is the QuickSAN packet it carries, whose
    /// payload is `frame[PAYLOAD_OFFSET..PAYLOAD_OFFSET + payload_bytes]`.
    Session {
        src: Mac,
        src_index: u16,
        session: SessionHeader,
        packet: Option<PacketHeader>,
        len: usize,
    },
}

/// Why a frame was dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    Truncated {
        bytes: usize,
        needed: usize,
    },
    UnknownEtherType(u16),
    NotForUs(Mac),
    BadCrc,
    /// No valid tag under this node's secret, or a tag where this node has
    /// none (a SAN whose nodes disagree about the secret).
    Unauthenticated,
    BadVersion(u8),
    BadPause,
    Packet(PacketError),
    /// DATA flag without a packet, or a packet without it.
    Inconsistent,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Truncated { bytes, needed } => {
                write!(f, "frame of {bytes} bytes, needs {needed}")
            }
            FrameError::UnknownEtherType(t) => write!(f, "EtherType {t:#06x} is not ours"),
            FrameError::NotForUs(m) => write!(f, "frame for {:02x?}", m.0),
            FrameError::BadCrc => write!(f, "CRC32C mismatch"),
            FrameError::Unauthenticated => write!(f, "no valid tag under the SAN's secret"),
            FrameError::BadVersion(v) => write!(f, "session version {v}"),
            FrameError::BadPause => write!(f, "malformed MAC control frame"),
            FrameError::Packet(e) => write!(f, "{e}"),
            FrameError::Inconsistent => write!(f, "flags disagree with the packet"),
        }
    }
}

fn crc_ok(frame: &[u8], crc_at: usize) -> bool {
    let want = u32::from_be_bytes([
        frame[crc_at],
        frame[crc_at + 1],
        frame[crc_at + 2],
        frame[crc_at + 3],
    ]);
    crc32c(&frame[..crc_at]) == want
}

/// Whether the frame's authentication agrees with this node's: with a
/// secret, the flag is set and the tag at `tag_at` is valid; without, the
/// flag is clear and the tag is zeros.
fn authentic(frame: &[u8], flags: u8, tag_at: usize, secret: Option<&Secret>) -> bool {
    let tag = &frame[tag_at..tag_at + TAG_BYTES];
    match secret {
        Some(s) => flags & FLAG_AUTH != 0 && s.verify(&frame[..tag_at], tag),
        None => flags & FLAG_AUTH == 0 && tag.iter().all(|&b| b == 0),
    }
}

/// Check the CRC at `crc_at` and the tag after it: a frame that fails its
/// CRC is corrupt (`BadCrc`), one whose CRC holds but whose tag does not is
/// not from a holder of the secret (`Unauthenticated`). The tag covers the
/// CRC, so an authentic tag vouches for it: with a secret, the tag is
/// checked first and the CRC only to tell those two failures apart (the
/// receive side's CRC was 4% of a reactor's time moving 8 KB frames).
fn check(
    frame: &[u8],
    flags: u8,
    crc_at: usize,
    secret: Option<&Secret>,
) -> Result<(), FrameError> {
    let tag_at = crc_at + CRC_BYTES;
    if secret.is_some() && authentic(frame, flags, tag_at, secret) {
        return Ok(());
    }
    if !crc_ok(frame, crc_at) {
        return Err(FrameError::BadCrc);
    }
    if !authentic(frame, flags, tag_at, secret) {
        return Err(FrameError::Unauthenticated);
    }
    Ok(())
}

/// Check and decode a frame that arrived for `local` on a link that carries
/// `ethertype`, authenticated under `secret` if this node has one. Bytes
/// past the frame's length (padding) are ignored. The buffer is mutable
/// because the Table A.3 codec reads the paper's EtherType: a configured
/// other one is swapped in and out around it.
pub fn parse(
    frame: &mut [u8],
    ethertype: u16,
    local: Mac,
    secret: Option<&Secret>,
) -> Result<Parsed, FrameError> {
    if frame.len() < 14 {
        return Err(FrameError::Truncated {
            bytes: frame.len(),
            needed: 14,
        });
    }
    let mut dest = [0u8; 6];
    dest.copy_from_slice(&frame[0..6]);
    let mut src = [0u8; 6];
    src.copy_from_slice(&frame[6..12]);
    let (dest, src) = (Mac(dest), Mac(src));
    let kind = u16::from_be_bytes([frame[12], frame[13]]);
    if kind == MAC_CONTROL_ETHERTYPE {
        if dest != local && dest != PAUSE_MULTICAST {
            return Err(FrameError::NotForUs(dest));
        }
        if frame.len() < PAUSE_FRAME_BYTES {
            return Err(FrameError::Truncated {
                bytes: frame.len(),
                needed: PAUSE_FRAME_BYTES,
            });
        }
        check(frame, frame[28], 60, secret)?;
        if u16::from_be_bytes([frame[14], frame[15]]) != PAUSE_OPCODE {
            return Err(FrameError::BadPause);
        }
        let mut counter = [0u8; 8];
        counter[2..8].copy_from_slice(&frame[18..24]);
        let pause = Pause {
            quanta: u16::from_be_bytes([frame[16], frame[17]]),
            counter: u64::from_be_bytes(counter),
            epoch: u32::from_be_bytes([frame[24], frame[25], frame[26], frame[27]]),
        };
        return Ok(Parsed::Pause { src, pause });
    }
    if kind != ethertype {
        return Err(FrameError::UnknownEtherType(kind));
    }
    if dest != local {
        return Err(FrameError::NotForUs(dest));
    }
    if frame.len() < OVERHEAD_BYTES {
        return Err(FrameError::Truncated {
            bytes: frame.len(),
            needed: OVERHEAD_BYTES,
        });
    }
    let index_op = u16::from_be_bytes([frame[14], frame[15]]);
    let src_index = index_op >> 4;
    let packet = if index_op & 0xF == 0 {
        None
    } else {
        // The codec knows the paper's EtherType only.
        frame[12..14].copy_from_slice(&packet::ETHERTYPE);
        let decoded = PacketHeader::decode(frame);
        frame[12..14].copy_from_slice(&ethertype.to_be_bytes());
        Some(decoded.map_err(FrameError::Packet)?)
    };
    let len = packet.as_ref().map_or(OVERHEAD_BYTES, data_frame_bytes);
    if frame.len() < len {
        return Err(FrameError::Truncated {
            bytes: frame.len(),
            needed: len,
        });
    }
    let tag_at = len - TAG_BYTES;
    check(frame, frame[A3_BYTES + 1], tag_at - CRC_BYTES, secret)?;
    let session = SessionHeader::read(&frame[A3_BYTES..PAYLOAD_OFFSET])?;
    if (session.flags & FLAG_DATA != 0) != packet.is_some() {
        return Err(FrameError::Inconsistent);
    }
    Ok(Parsed::Session {
        src,
        src_index,
        session,
        packet,
        len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use moneta_model::device::packet::PacketKind;

    fn header(size: u16) -> PacketHeader {
        PacketHeader {
            kind: PacketKind::WriteRequest,
            dest: Mac::of_node(1),
            src: Mac::of_node(0),
            src_index: 0,
            addr: 0x1234_5000,
            ctrl: 0,
            cmd: 2,
            offsets: 3,
            tag: 9,
            size,
        }
    }

    #[test]
    fn data_frame_round_trip_and_any_flipped_bit_is_caught() {
        let secret = Secret::generate().unwrap();
        for key in [None, Some(&secret)] {
            let mut buf = vec![0u8; MAX_FRAME_BYTES];
            let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
            let h = header(4096);
            let len = encode_data(&mut buf, &h, 0x88B5, &payload).unwrap();
            assert_eq!(len, 84 + 4096);
            let s = SessionHeader {
                flags: FLAG_DATA,
                src_epoch: 5,
                dst_epoch: 6,
                seq: 7,
                ack: 8,
                sack: 0b1010,
                counter: 0xABCD_1234_5678,
            };
            seal(&mut buf, len, &s, key);
            assert_eq!(&buf[12..14], &[0x88, 0xB5]);
            let parsed = parse(&mut buf[..len + 10], 0x88B5, Mac::of_node(1), key).unwrap();
            let flags = if key.is_some() {
                FLAG_DATA | FLAG_AUTH
            } else {
                FLAG_DATA
            };
            assert_eq!(
                parsed,
                Parsed::Session {
                    src: Mac::of_node(0),
                    src_index: 0,
                    session: SessionHeader { flags, ..s },
                    packet: Some(h),
                    len
                }
            );
            assert_eq!(&buf[PAYLOAD_OFFSET..PAYLOAD_OFFSET + 4096], &payload[..]);
            for bit in [0usize, 100, 14 * 8 + 3, 300 * 8, (len - 1) * 8] {
                let mut bad = buf.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                assert!(parse(&mut bad[..len], 0x88B5, Mac::of_node(1), key).is_err());
            }
            // A payload bit flipped in transit is corruption, not forgery,
            // whether or not the tag is checked first (it is, with a secret).
            let mut bad = buf.clone();
            bad[300] ^= 0x10;
            assert_eq!(
                parse(&mut bad[..len], 0x88B5, Mac::of_node(1), key),
                Err(FrameError::BadCrc)
            );
            // Another host's frame, another protocol.
            assert!(matches!(
                parse(&mut buf[..len], 0x88B5, Mac::of_node(2), key),
                Err(FrameError::NotForUs(_))
            ));
            assert!(matches!(
                parse(&mut buf[..len], QUICKSAN_ETHERTYPE, Mac::of_node(1), key),
                Err(FrameError::UnknownEtherType(0x88B5))
            ));
        }
    }

    #[test]
    fn a_forged_frame_with_a_valid_crc_is_refused_under_a_secret() {
        let (secret, other) = (Secret::generate().unwrap(), Secret::generate().unwrap());
        let mut buf = vec![0u8; MAX_FRAME_BYTES];
        let s = SessionHeader {
            flags: FLAG_HELLO,
            src_epoch: 99,
            counter: 1,
            ..Default::default()
        };
        // Sealed without the secret, with another one, and with the right
        // one then altered with its CRC fixed up (what a forger can do).
        let dest = Mac::of_node(1);
        let mut probe = |key: Option<&Secret>| {
            let len = encode_control(
                &mut buf,
                dest,
                Mac::of_node(0),
                0,
                QUICKSAN_ETHERTYPE,
                &s,
                key,
            );
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, dest, Some(&secret)).map(|_| len)
        };
        assert_eq!(probe(None), Err(FrameError::Unauthenticated));
        assert_eq!(probe(Some(&other)), Err(FrameError::Unauthenticated));
        let len = probe(Some(&secret)).expect("the right secret");
        // A node without the secret refuses tagged frames: a SAN whose nodes
        // disagree about the secret does not half work.
        assert_eq!(
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, dest, None),
            Err(FrameError::Unauthenticated)
        );
        buf[A3_BYTES + 4..A3_BYTES + 8].copy_from_slice(&100u32.to_be_bytes());
        let crc_at = len - TAG_BYTES - CRC_BYTES;
        let crc = crc32c(&buf[..crc_at]);
        buf[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, dest, Some(&secret)),
            Err(FrameError::Unauthenticated)
        );
        // Pause frames likewise.
        let p = Pause {
            quanta: 0xFFFF,
            epoch: 7,
            counter: 3,
        };
        let len = encode_pause(&mut buf, dest, Mac::of_node(4), &p, None);
        assert_eq!(
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, dest, Some(&secret)),
            Err(FrameError::Unauthenticated)
        );
        encode_pause(&mut buf, dest, Mac::of_node(4), &p, Some(&secret));
        assert_eq!(
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, dest, Some(&secret)),
            Ok(Parsed::Pause {
                src: Mac::of_node(4),
                pause: p
            })
        );
    }

    #[test]
    fn control_and_pause_frames() {
        let mut buf = vec![0u8; 128];
        let s = SessionHeader {
            flags: FLAG_HELLO,
            src_epoch: 1,
            ..Default::default()
        };
        let len = encode_control(
            &mut buf,
            Mac::of_node(1),
            Mac::of_node(4),
            4,
            QUICKSAN_ETHERTYPE,
            &s,
            None,
        );
        assert_eq!(len, 84);
        let p = parse(&mut buf[..len], QUICKSAN_ETHERTYPE, Mac::of_node(1), None).unwrap();
        assert!(
            matches!(p, Parsed::Session { src_index: 4, packet: None, session, .. } if session == s)
        );
        let pause = Pause {
            quanta: 0xFFFF,
            epoch: 9,
            counter: 0x0102_0304_0506,
        };
        let len = encode_pause(&mut buf, Mac::of_node(1), Mac::of_node(4), &pause, None);
        assert_eq!(len, 80);
        assert_eq!(&buf[12..16], &[0x88, 0x08, 0x00, 0x01]);
        assert_eq!(
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, Mac::of_node(1), None),
            Ok(Parsed::Pause {
                src: Mac::of_node(4),
                pause
            })
        );
        buf[40] = 1;
        assert_eq!(
            parse(&mut buf[..len], QUICKSAN_ETHERTYPE, Mac::of_node(1), None),
            Err(FrameError::BadCrc)
        );
    }
}
