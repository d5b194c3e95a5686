//! Garbage frames never panic (issue 12; STYLE rule 7): random bytes,
//! truncated frames, bad CRCs, unknown EtherTypes, and frames with a valid
//! CRC but random session fields, fed to the parser and to a live endpoint
//! through the in-memory wire. The endpoint counts every frame and delivers
//! nothing that was not sent whole.

use moneta_model::device::packet::{Mac, PacketHeader, PacketKind};
use moneta_wire::auth::Secret;
use moneta_wire::crc32c::crc32c;
use moneta_wire::frame::{self, SessionHeader, FLAG_DATA, QUICKSAN_ETHERTYPE};
use moneta_wire::mem::MemWire;
use moneta_wire::{Endpoint, Transport, WireConfig};
use proptest::prelude::*;

/// Shape random bytes into something closer to a frame, by `mode`.
fn shape(mode: u8, mut bytes: Vec<u8>, cut: usize) -> Vec<u8> {
    let ours = |b: &mut Vec<u8>| {
        if b.len() >= 14 {
            b[0..6].copy_from_slice(&Mac::of_node(0).0);
            b[6..12].copy_from_slice(&Mac::of_node(1).0);
            b[12..14].copy_from_slice(&QUICKSAN_ETHERTYPE.to_be_bytes());
        }
    };
    match mode % 6 {
        // Raw noise.
        0 => {}
        // Addressed to us, our EtherType, random rest (bad CRC).
        1 => ours(&mut bytes),
        // ... with a CRC that matches wherever the header says it ends.
        2 => {
            ours(&mut bytes);
            if bytes.len() >= 16 {
                bytes[14] = 0; // INDEX 1: its upper bits
                bytes[15] = (1 << 4) | (bytes[15] & 0x0F);
            }
            if bytes.len() >= frame::OVERHEAD_BYTES {
                bytes[32] = frame::VERSION; // session version
                let p = match PacketHeader::decode(&bytes) {
                    Ok(h) => h.payload_bytes() as usize,
                    Err(_) => 0,
                };
                let len = frame::OVERHEAD_BYTES + p;
                if bytes.len() >= len {
                    let at = len - frame::TAG_BYTES - 4;
                    let crc = crc32c(&bytes[..at]);
                    bytes[at..at + 4].copy_from_slice(&crc.to_be_bytes());
                }
            }
        }
        // A pause-looking frame.
        3 => {
            ours(&mut bytes);
            if bytes.len() >= 14 {
                bytes[12..14].copy_from_slice(&[0x88, 0x08]);
            }
            if bytes.len() >= 64 {
                let crc = crc32c(&bytes[..60]);
                bytes[60..64].copy_from_slice(&crc.to_be_bytes());
            }
        }
        // A real data frame, truncated.
        4 => {
            let mut buf = vec![0u8; frame::MAX_FRAME_BYTES];
            let h = PacketHeader {
                kind: PacketKind::WriteRequest,
                dest: Mac::of_node(0),
                src: Mac::of_node(1),
                src_index: 1,
                addr: 0,
                ctrl: 0,
                cmd: 2,
                offsets: 0,
                tag: 0,
                size: 512,
            };
            let len = frame::encode_data(&mut buf, &h, QUICKSAN_ETHERTYPE, &[9; 512]).unwrap();
            let s = SessionHeader {
                flags: FLAG_DATA,
                ..Default::default()
            };
            frame::seal(&mut buf, len, &s, None);
            buf.truncate(cut % len);
            bytes = buf;
        }
        // Noise with an unknown EtherType.
        _ => {
            if bytes.len() >= 14 {
                bytes[12..14].copy_from_slice(&[0x08, 0x00]);
            }
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn parse_never_panics(mode: u8, bytes in proptest::collection::vec(any::<u8>(), 0..9000),
                          cut: usize, ethertype: u16) {
        let mut f = shape(mode, bytes, cut);
        let secret = Secret::from_bytes([7; 32]);
        for key in [None, Some(&secret)] {
            let _ = frame::parse(&mut f, ethertype, Mac::of_node(0), key);
            let r = frame::parse(&mut f, QUICKSAN_ETHERTYPE, Mac::of_node(0), key);
            // Nobody without the secret makes a frame that passes under it.
            prop_assert!(key.is_none() || r.is_err());
        }
    }

    #[test]
    fn an_endpoint_survives_garbage(
        frames in proptest::collection::vec(
            (any::<u8>(), proptest::collection::vec(any::<u8>(), 0..300), any::<usize>()),
            1..40)
    ) {
        for secret in [None, Some(Secret::from_bytes([7; 32]))] {
            let keyed = secret.is_some();
            let wire = MemWire::new(2, 100);
            let mut c = WireConfig::new(0, &[1]);
            c.initial_epoch = Some(10);
            c.secret = secret;
            let mut ep = Endpoint::new(wire.port(0, 9000), c, 0).unwrap();
            let mut noise = wire.port(1, 9000);
            let mut now = 0;
            for (mode, bytes, cut) in frames.iter().cloned() {
                let f = shape(mode, bytes, cut);
                noise.send(now, 0, &f).unwrap();
                now += 1000;
                ep.poll(now).unwrap();
            }
            let s = ep.stats();
            prop_assert_eq!(s.frames_received, frames.len() as u64);
            // Nothing delivered is anything but a packet whose payload fits;
            // under a secret, nothing at all.
            while let Some(ok) = ep.recv(|_, h, payload| payload.len() as u64 == h.payload_bytes()) {
                prop_assert!(ok && !keyed);
            }
            let mut up = false;
            while let Some(e) = ep.next_event() {
                up |= matches!(e, moneta_wire::WireEvent::PeerUp { .. });
            }
            prop_assert!(!(keyed && up), "garbage brought a peer up under a secret");
        }
    }
}
