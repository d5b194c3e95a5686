//! Authenticated frames (issue 22 item 3): a SAN's shared secret, the keyed
//! MAC every frame carries, and the replay window each receiver keeps per
//! peer.
//!
//! QuickSAN's paper trusts its Ethernet segment (SPEC §4.2). Here anyone
//! who can put a frame on the segment (a host on the bridge, a process in
//! a node's namespace) could otherwise claim to be a node: a forged session
//! frame with a newer epoch resets a peer's session, a forged 802.3x pause
//! stops a sender. With a secret, every frame (data, acknowledgement,
//! heartbeat, pause) ends in a 128-bit tag over every byte before it
//! (headers, payload, CRC32C). A receiver with the secret drops a frame
//! without a valid tag and counts it (`unauthenticated`).
//!
//! The tag is AEGISMAC-128X4 (draft-irtf-cfrg-aegis-aead, "AEGIS as a
//! Message Authentication Code"; the `aegis` crate, libaegis with AES-NI /
//! VAES), keyed with 128 bits derived from the secret by BLAKE3's
//! `derive_key`. The draft allows the MAC function, alone among AEGIS's,
//! to reuse its (key, nonce) pair, so the nonce is fixed. Issue 21 chose it
//! over keyed BLAKE3, the first MAC here: where one reactor tags and checks
//! both ends of every crossing, BLAKE3 cost 1.7 µs a 4 KB frame and 1.9 µs
//! an 8 KB one (it parallelizes across 1 KB chunks, and a frame has few),
//! AEGISMAC-128X4 0.12 and 0.16 µs on the same machine (`cargo bench -p
//! moneta-wire --bench wire` prints both).
//!
//! Replays: each sender numbers every frame it puts on the wire (48 bits,
//! from 1, never reused by one process: a retransmission is a new frame),
//! inside the tagged bytes. The receiver keeps, per peer, the highest number
//! seen and a 128-frame window below it (RFC 4303's anti-replay window): a
//! frame numbered at or below the window, or already seen in it, is a
//! replay and is dropped (`replayed`). A restarted sender starts numbering
//! again under a newer epoch (its clock's): the window starts over only
//! when an authentic frame names a newer epoch, and frames of older epochs
//! are stale (`reliable`'s rule).

use aegis::aegis128x4::Aegis128X4Mac;
use std::fmt;

/// Bytes of the tag that ends every frame.
pub const TAG_BYTES: usize = 16;
/// Bytes of a secret.
pub const SECRET_BYTES: usize = 32;
/// Frames below the highest number seen that may still arrive (reordered).
pub const REPLAY_WINDOW_FRAMES: u64 = 128;
/// The largest frame number (48 bits on the wire).
pub const MAX_COUNTER: u64 = (1 << 48) - 1;

/// The context of the MAC key's derivation from a secret (BLAKE3
/// `derive_key`: a new MAC or key size takes a new context).
const MAC_KEY_CONTEXT: &str = "moneta-wire 2026-11-27 frame tag AEGISMAC-128X4 key";

/// A SAN's shared secret: the key of every frame's MAC. Never printed.
#[derive(Clone)]
pub struct Secret {
    bytes: [u8; SECRET_BYTES],
    /// The MAC keyed with the derived key, before any input: cloned per
    /// frame (the key schedule runs once).
    mac: Aegis128X4Mac<TAG_BYTES>,
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for Secret {}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(…)")
    }
}

impl Secret {
    pub fn from_bytes(bytes: [u8; SECRET_BYTES]) -> Secret {
        let key = blake3::derive_key(MAC_KEY_CONTEXT, &bytes);
        let mut mac_key = [0u8; 16];
        mac_key.copy_from_slice(&key[..16]);
        Secret {
            bytes,
            mac: Aegis128X4Mac::new(&mac_key),
        }
    }

    /// A new secret from the kernel's random source.
    pub fn generate() -> std::io::Result<Secret> {
        let mut b = [0u8; SECRET_BYTES];
        let mut got = 0;
        while got < SECRET_BYTES {
            // SAFETY: writes at most the rest of `b`.
            let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), SECRET_BYTES - got, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            got += n as usize;
        }
        Ok(Secret::from_bytes(b))
    }

    /// The secret as the file holds it: 64 hexadecimal digits.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Read a secret written by [`Secret::to_hex`] (surrounding white space
    /// ignored).
    pub fn parse_hex(text: &str) -> Result<Secret, String> {
        let t = text.trim();
        if t.len() != 2 * SECRET_BYTES || !t.bytes().all(|c| c.is_ascii_hexdigit()) {
            return Err(format!(
                "a secret is {} hexadecimal digits ({} bytes)",
                2 * SECRET_BYTES,
                SECRET_BYTES
            ));
        }
        let mut b = [0u8; SECRET_BYTES];
        for (i, byte) in b.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(Secret::from_bytes(b))
    }

    /// Load a secret file; refused if other users may read it.
    pub fn load(path: &std::path::Path) -> Result<Secret, String> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if meta.mode() & 0o077 != 0 {
            return Err(format!(
                "{}: readable by other users (mode {:o}); chmod 600 it",
                path.display(),
                meta.mode() & 0o777
            ));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Secret::parse_hex(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Write a new secret file (mode 0600; an existing file is an error).
    pub fn save_new(&self, path: &std::path::Path) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        writeln!(f, "{}", self.to_hex()).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// The tag of `bytes`.
    pub fn tag(&self, bytes: &[u8]) -> [u8; TAG_BYTES] {
        let mut mac = self.mac.clone();
        mac.update(bytes);
        mac.finalize()
    }

    /// Whether `tag` is the tag of `bytes`, in time independent of where
    /// they differ.
    pub fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        let want = self.tag(bytes);
        tag.len() == TAG_BYTES && want.iter().zip(tag).fold(0u8, |d, (a, b)| d | (a ^ b)) == 0
    }
}

/// A receiver's record of the frame numbers one peer used in its current
/// epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayWindow {
    /// The highest number accepted (0: none yet).
    highest: u64,
    /// Bit i: number `highest - i` was accepted.
    seen: u128,
}

impl ReplayWindow {
    /// Accept `n` if it is new: above the highest, or inside the window and
    /// not seen. Number 0 is never valid.
    pub fn accept(&mut self, n: u64) -> bool {
        if n == 0 || n > MAX_COUNTER {
            return false;
        }
        if n > self.highest {
            let shift = n - self.highest;
            self.seen = if shift >= 128 { 0 } else { self.seen << shift } | 1;
            self.highest = n;
            return true;
        }
        let back = self.highest - n;
        if back >= REPLAY_WINDOW_FRAMES {
            return false;
        }
        let bit = 1u128 << back;
        if self.seen & bit != 0 {
            return false;
        }
        self.seen |= bit;
        true
    }

    /// Start over at `n` (an authentic frame of a newer epoch).
    pub fn restart(&mut self, n: u64) {
        *self = ReplayWindow::default();
        self.accept(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_round_trips_through_hex_and_tags_depend_on_every_byte() {
        let s = Secret::generate().unwrap();
        assert_eq!(
            Secret::parse_hex(&format!("  {}\n", s.to_hex())).unwrap(),
            s
        );
        assert!(Secret::parse_hex("abc").is_err());
        assert!(Secret::parse_hex(&"g".repeat(64)).is_err());
        assert_eq!(format!("{s:?}"), "Secret(…)");
        let msg: Vec<u8> = (0..300u32).map(|i| i as u8).collect();
        let tag = s.tag(&msg);
        assert!(s.verify(&msg, &tag));
        for i in [0, 17, 299] {
            let mut bad = msg.clone();
            bad[i] ^= 0x40;
            assert!(!s.verify(&bad, &tag));
        }
        let other = Secret::generate().unwrap();
        assert!(!other.verify(&msg, &tag));
        assert!(!s.verify(&msg, &tag[..8]));
    }

    /// Session version 3's tag, pinned: a change of the MAC, its key's
    /// derivation or its nonce makes nodes of two builds unable to talk,
    /// and must come with a new session version (`frame::VERSION`).
    #[test]
    fn the_tag_of_a_fixed_frame_under_a_fixed_secret_never_changes() {
        let s = Secret::from_bytes(std::array::from_fn(|i| i as u8));
        let msg: Vec<u8> = (0..8260u32).map(|i| (i * 7) as u8).collect();
        let hex = |t: [u8; TAG_BYTES]| t.iter().map(|b| format!("{b:02x}")).collect::<String>();
        assert_eq!(hex(s.tag(&msg)), "a728e590a809f10853007a54ac0c2132");
        assert_eq!(hex(s.tag(&msg[..68])), "d987c6ad13b7615288a175ca0f777e6c");
    }

    #[test]
    fn the_window_takes_each_number_once_and_nothing_far_behind() {
        let mut w = ReplayWindow::default();
        assert!(!w.accept(0));
        assert!(w.accept(5));
        assert!(!w.accept(5));
        assert!(w.accept(3), "reordered, inside the window");
        assert!(!w.accept(3));
        assert!(w.accept(200));
        assert!(!w.accept(5), "below the window now");
        assert!(w.accept(200 - 127));
        assert!(!w.accept(200 - 128));
        assert!(w.accept(1000));
        assert!(!w.accept(1000));
        assert!(!w.accept(MAX_COUNTER + 1));
        w.restart(2);
        assert!(!w.accept(2));
        assert!(w.accept(1));
    }

    #[test]
    fn a_secret_file_must_be_private() {
        let dir = std::env::temp_dir().join(format!("moneta-secret-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let p = dir.join("secret");
        let s = Secret::generate().unwrap();
        s.save_new(&p).unwrap();
        assert!(s.save_new(&p).is_err(), "never overwritten");
        assert_eq!(Secret::load(&p).unwrap(), s);
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(Secret::load(&p).unwrap_err().contains("chmod 600"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
