//! Replica metadata on the medium (SPEC §4.3 mirroring; issue 39 item 1,
//! after DRBD's internal meta data and generation identifiers): what a
//! SAN node's image says about the copies of mirrored slices it holds.
//!
//! The metadata lives **on the image itself**, in `META_BYTES` after the
//! device's capacity (DRBD keeps its internal meta data at the end of the
//! backing device), so that a replaced or recreated image (a new disk, a
//! reboot that emptied `/dev/shm`) carries none and can never pass for the
//! copy that served before: a dirty map or a file beside the image would
//! survive the image it described. It names the SAN, the node, and per
//! mirrored slice held here the state of the copy and the data generation
//! it holds:
//!
//! - `New`: written by `moneta san up` on the blank images of a SAN it
//!   creates (every copy all zeros, so every copy agrees: DRBD's
//!   `new-current-uuid --clear-bitmap`); the first start serves it up to
//!   date and records `UpToDate`.
//! - `UpToDate`: the copy held a whole generation when last recorded; a
//!   restart makes it outdated (it may have missed writes while away)
//!   until its partner says what it missed (engine/port.rs).
//! - `Inconsistent`: the copy is not a whole generation (a resync into it
//!   began and did not finish, or it discarded its own writes): it is never
//!   read, never forced, and only its partner's `SYNC_DONE` after a resync
//!   makes it up to date again. `full`: it needs every granule of the slice
//!   (no metadata, foreign metadata, or a resync of everything that has not
//!   finished): its partner is asked for a full resync.
//!
//! A copy with no metadata, unreadable metadata or metadata of another SAN,
//! node or slice is `Inconsistent` and `full`.
//!
//! Update order (kill -9 at any moment): the state that allows less is
//! made durable **before** the medium or the in-memory state move on:
//! `Inconsistent` is written and fdatasynced before the first resync write
//! reaches the medium; `UpToDate` is written only after the resync is done,
//! before the copy serves. Each record is written whole into one of two
//! slots (the older one), with a sequence number and a CRC32C: a torn
//! write leaves the other slot, which still holds the previous state.

use moneta_wire::crc32c::crc32c;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// Bytes of metadata after the capacity on an image.
pub const META_BYTES: u64 = 4096;
const SLOT_BYTES: usize = 2048;
const MAGIC: &[u8; 8] = b"MONREPL1";
/// Longest SAN name recorded.
const MAX_SAN: usize = 64;
/// Bytes of one copy's record: slice u32, state u8, full u8, generation u64.
const RECORD_BYTES: usize = 14;

/// The recorded state of one copy (module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    New,
    UpToDate,
    Inconsistent,
}

impl Stored {
    fn code(self) -> u8 {
        match self {
            Stored::New => 0,
            Stored::UpToDate => 1,
            Stored::Inconsistent => 2,
        }
    }

    fn of(code: u8) -> Option<Stored> {
        Some(match code {
            0 => Stored::New,
            1 => Stored::UpToDate,
            2 => Stored::Inconsistent,
            _ => return None,
        })
    }
}

/// What the medium says of one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyMeta {
    pub state: Stored,
    /// Every granule of the slice is needed (module header).
    pub full: bool,
    /// The data generation the copy holds (or, inconsistent, is being
    /// brought to): a forced copy starts a new one, a resync target takes
    /// its source's.
    pub generation: u64,
}

impl CopyMeta {
    /// A copy with no (or foreign) metadata.
    pub const BLANK: CopyMeta = CopyMeta {
        state: Stored::Inconsistent,
        full: true,
        generation: 0,
    };
}

/// One node's replica metadata, and where it is kept.
#[derive(Debug)]
pub struct ReplicaMeta {
    /// The image, open for the metadata's reads and writes (None: a medium
    /// in memory, whose metadata is lost with it).
    file: Option<File>,
    offset: u64,
    san: String,
    node: u16,
    seq: u64,
    copies: BTreeMap<u32, CopyMeta>,
    /// What loading found, for the daemon's log.
    pub found: String,
    /// Writes done (each one pwrite and one fdatasync).
    pub writes: u64,
}

fn encode(san: &str, node: u16, seq: u64, copies: &BTreeMap<u32, CopyMeta>) -> Vec<u8> {
    let mut b = Vec::with_capacity(SLOT_BYTES);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&seq.to_le_bytes());
    b.extend_from_slice(&node.to_le_bytes());
    let name = &san.as_bytes()[..san.len().min(MAX_SAN)];
    b.push(name.len() as u8);
    b.extend_from_slice(name);
    b.extend_from_slice(&(copies.len() as u16).to_le_bytes());
    for (&slice, c) in copies {
        b.extend_from_slice(&slice.to_le_bytes());
        b.push(c.state.code());
        b.push(u8::from(c.full));
        b.extend_from_slice(&c.generation.to_le_bytes());
    }
    let crc = crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b.resize(SLOT_BYTES, 0);
    b
}

/// A slot's (seq, SAN, node, copies), if it holds a valid record.
type Decoded = (u64, String, u16, BTreeMap<u32, CopyMeta>);

fn decode(b: &[u8]) -> Option<Decoded> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let s = b.get(at..at + n)?;
        at += n;
        Some(s)
    };
    if take(8)? != MAGIC {
        return None;
    }
    let seq = u64::from_le_bytes(take(8)?.try_into().ok()?);
    let node = u16::from_le_bytes(take(2)?.try_into().ok()?);
    let len = take(1)?[0] as usize;
    let san = String::from_utf8(take(len)?.to_vec()).ok()?;
    let n = u16::from_le_bytes(take(2)?.try_into().ok()?) as usize;
    let mut copies = BTreeMap::new();
    for _ in 0..n {
        let r = take(RECORD_BYTES)?;
        let slice = u32::from_le_bytes(r[0..4].try_into().ok()?);
        let state = Stored::of(r[4])?;
        let full = r[5] != 0;
        let generation = u64::from_le_bytes(r[6..14].try_into().ok()?);
        copies.insert(
            slice,
            CopyMeta {
                state,
                full,
                generation,
            },
        );
    }
    let end = at;
    let crc = u32::from_le_bytes(b.get(end..end + 4)?.try_into().ok()?);
    (crc32c(&b[..end]) == crc).then_some((seq, san, node, copies))
}

impl ReplicaMeta {
    /// The metadata of a medium kept in memory: every copy blank.
    pub fn in_memory(san: &str, node: u16, slices: &[u32]) -> ReplicaMeta {
        ReplicaMeta {
            file: None,
            offset: 0,
            san: san.to_string(),
            node,
            seq: 0,
            copies: slices.iter().map(|&s| (s, CopyMeta::BLANK)).collect(),
            found: "the medium is in memory: its copies start blank".into(),
            writes: 0,
        }
    }

    /// Read the metadata of the image at `path` (of a device of
    /// `capacity` bytes) for node `node` of SAN `san`, holding mirrored
    /// copies of `slices`. No metadata, or metadata of another SAN or node,
    /// makes every copy blank (`CopyMeta::BLANK`); a slice it does not
    /// name is blank too.
    pub fn load(
        path: &Path,
        capacity: u64,
        san: &str,
        node: u16,
        slices: &[u32],
    ) -> io::Result<ReplicaMeta> {
        let file = OpenOptions::new().read(true).write(true).open(path)?;
        let len = file.metadata()?.len();
        let mut meta = ReplicaMeta {
            offset: capacity,
            ..ReplicaMeta::in_memory(san, node, slices)
        };
        meta.found = "no replica metadata on the image (a new or replaced disk)".into();
        if len >= capacity + META_BYTES {
            let mut buf = vec![0u8; META_BYTES as usize];
            file.read_exact_at(&mut buf, capacity)?;
            let best = buf
                .chunks(SLOT_BYTES)
                .filter_map(decode)
                .max_by_key(|d| d.0);
            meta.found = match best {
                None => "unreadable replica metadata (both slots damaged)".into(),
                Some((_, s, n, _)) if s != san || n != node => format!(
                    "foreign replica metadata (SAN '{s}', node {n}; this is SAN '{san}', \
                     node {node})"
                ),
                Some((seq, _, _, copies)) => {
                    meta.seq = seq;
                    for (&slice, c) in meta.copies.iter_mut() {
                        *c = copies.get(&slice).copied().unwrap_or(CopyMeta::BLANK);
                    }
                    format!("replica metadata of SAN '{san}', node {node}")
                }
            };
        }
        meta.file = Some(file);
        Ok(meta)
    }

    /// Write the metadata of a new SAN's blank image (`moneta san up`):
    /// every copy `New`, generation 1. Creates the image (sparse, the
    /// device's capacity) if it is missing.
    pub fn initialize(
        path: &Path,
        capacity: u64,
        san: &str,
        node: u16,
        slices: &[u32],
    ) -> io::Result<()> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        if file.metadata()?.len() < capacity {
            file.set_len(capacity)?;
        }
        let mut meta = ReplicaMeta::load(path, capacity, san, node, slices)?;
        for c in meta.copies.values_mut() {
            *c = CopyMeta {
                state: Stored::New,
                full: false,
                generation: 1,
            };
        }
        meta.store()
    }

    /// What the medium says of the copy of `slice` (blank if it is not one
    /// of this node's mirrored copies).
    pub fn copy(&self, slice: usize) -> CopyMeta {
        self.copies
            .get(&(slice as u32))
            .copied()
            .unwrap_or(CopyMeta::BLANK)
    }

    /// Whether `slice` is one of the copies recorded here.
    pub fn holds(&self, slice: usize) -> bool {
        self.copies.contains_key(&(slice as u32))
    }

    /// Record `copy` for `slice`, durably, before returning (nothing to do
    /// if it is already what the medium says).
    pub fn set(&mut self, slice: usize, copy: CopyMeta) -> io::Result<()> {
        let Some(c) = self.copies.get_mut(&(slice as u32)) else {
            return Ok(());
        };
        if *c == copy {
            return Ok(());
        }
        let before = *c;
        *c = copy;
        let stored = self.store();
        if stored.is_err() {
            // The medium still says what it said.
            self.copies.insert(slice as u32, before);
        }
        stored
    }

    /// Write the whole record into the older slot and fdatasync it.
    fn store(&mut self) -> io::Result<()> {
        let seq = self.seq + 1;
        let bytes = encode(&self.san, self.node, seq, &self.copies);
        if let Some(file) = &self.file {
            let slot = (seq % 2) * SLOT_BYTES as u64;
            file.write_all_at(&bytes, self.offset + slot)?;
            file.sync_data()?;
        }
        self.seq = seq;
        self.writes += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("moneta-meta-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("device.img")
    }

    #[test]
    fn a_blank_image_is_inconsistent_and_a_new_one_is_new_until_recorded() {
        let path = temp("blank");
        std::fs::write(&path, vec![0u8; 65536]).unwrap();
        let m = ReplicaMeta::load(&path, 65536, "s", 1, &[0, 1]).unwrap();
        assert_eq!(m.copy(0), CopyMeta::BLANK);
        assert!(m.found.contains("no replica metadata"), "{}", m.found);
        ReplicaMeta::initialize(&path, 65536, "s", 1, &[0, 1]).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 65536 + META_BYTES);
        let mut m = ReplicaMeta::load(&path, 65536, "s", 1, &[0, 1]).unwrap();
        assert_eq!(m.copy(1).state, Stored::New);
        let inc = CopyMeta {
            state: Stored::Inconsistent,
            full: false,
            generation: 1,
        };
        m.set(1, inc).unwrap();
        // Survives a reload; another SAN or node finds it foreign.
        let again = ReplicaMeta::load(&path, 65536, "s", 1, &[0, 1]).unwrap();
        assert_eq!((again.copy(0).state, again.copy(1)), (Stored::New, inc));
        for (san, node) in [("t", 1), ("s", 2)] {
            let f = ReplicaMeta::load(&path, 65536, san, node, &[0, 1]).unwrap();
            assert_eq!(f.copy(1), CopyMeta::BLANK);
            assert!(f.found.contains("foreign"), "{}", f.found);
        }
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    /// A torn write of the newer slot leaves the older one: the state
    /// before the update, never garbage.
    #[test]
    fn a_damaged_slot_falls_back_to_the_other() {
        let path = temp("torn");
        ReplicaMeta::initialize(&path, 4096, "s", 0, &[0]).unwrap();
        let mut m = ReplicaMeta::load(&path, 4096, "s", 0, &[0]).unwrap();
        let up = CopyMeta {
            state: Stored::UpToDate,
            full: false,
            generation: 1,
        };
        m.set(0, up).unwrap();
        let seq = m.seq;
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xFF; 40], 4096 + (seq % 2) * SLOT_BYTES as u64 + 10)
            .unwrap();
        let back = ReplicaMeta::load(&path, 4096, "s", 0, &[0]).unwrap();
        assert_eq!(back.copy(0).state, Stored::New, "the older slot");
        f.write_all_at(&[0xFF; 40], 4096 + ((seq + 1) % 2) * SLOT_BYTES as u64 + 10)
            .unwrap();
        let none = ReplicaMeta::load(&path, 4096, "s", 0, &[0]).unwrap();
        assert_eq!(none.copy(0), CopyMeta::BLANK);
        assert!(none.found.contains("unreadable"), "{}", none.found);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
