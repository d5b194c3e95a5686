//! The dirty map of a mirrored SAN node (SPEC §4.3, issue 12 item 6; what
//! DRBD calls the activity/bitmap): while a peer holding the other copy of
//! some of this node's data is failed, writes go on degraded to this copy
//! alone, and the map records, per failed peer, which granules of the
//! global space the peer missed. When the peer is back, the port resyncs
//! exactly those granules from this node's copy, and clears each once the
//! peer has acknowledged it.
//!
//! The map is kept in a file beside the image, so that a node that itself
//! restarts while a peer is behind still knows what to resync. A granule
//! newly marked is durable before the write that marked it is acknowledged
//! (issue 22: DRBD's activity log): the port appends the new granules to
//! the file and fdatasyncs it (`flush`) once per turn of the device thread
//! that marked any, before any completion of that turn leaves. Clears are
//! batched: the whole file is rewritten (`save`, atomically) at most every
//! `SAVE_INTERVAL_NS` while clears happen, at once when the map empties,
//! and always before the port tells a partner how much it missed or that
//! its resync is done (engine/port.rs): a granule left in the file after
//! the partner was told it has it would come back with a restart of this
//! node as a claim the partner contradicts once it has written alone, a
//! split brain that is not one.
//!
//! Whether a copy served before, and whether it is a whole generation, is
//! not this file's to say: a file beside the image survives the image it
//! describes (a replaced disk). The image's own replica metadata says it
//! (`replica_meta`, engine/port.rs); `fresh` only says the file is new.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Granule of the map: a missed write marks every granule it touches.
pub const GRANULE_BYTES: u64 = 4096;

/// The map's key for the granules of a failed mirrored write that this
/// node's copy may hold while its partner's does not (`unsure(partner)`):
/// neither acknowledged nor known missed, they are settled when the
/// partner's fate is (engine/port.rs): the copy that goes on marks them
/// missed by the partner, the one that yields hands them to it.
pub const UNSURE: u16 = 0x8000;

/// The key of the granules unsure with respect to `partner`.
pub fn unsure(partner: u16) -> u16 {
    UNSURE | partner
}

/// The map's flag for a **weak** claim (`weak(partner)`): a granule this
/// copy resyncs to `partner` so that the two copies converge, though it
/// holds no write acknowledged here that the partner missed: the granule
/// of a failed write (settled in this copy's favour, or handed over by the
/// partner, `DISCARD_TAG`, or refused here as a degraded copy). Either
/// version is allowed on both copies, so a weak claim never makes this
/// side "ahead" in the exchange: told counts and the split-brain rule see
/// only the **strong** claims (`strong_in`), i.e. acknowledged writes the
/// partner missed; a partner that wrote alone meanwhile wins the weak
/// granules (engine/port.rs). Without the difference, a node killed with a
/// weak claim pending came back looking ahead of a partner that had gone
/// on alone, and the nemesis's `resolve --discard` of a split brain that
/// was not one threw away acknowledged writes (`moneta san chaos`, 4
/// nodes, seed 20261130). Weak and strong claims of one granule never
/// coexist: strong wins.
pub const WEAK: u16 = 0x4000;

/// The key of the weak claims on `partner`.
pub fn weak(partner: u16) -> u16 {
    WEAK | partner
}

/// Missed granules by peer.
#[derive(Debug, Default)]
pub struct DirtyMap {
    missed: BTreeMap<u16, BTreeSet<u64>>,
    path: Option<PathBuf>,
    /// Cleared since the last `save` (the file holds more than the map).
    changed: bool,
    /// Marked since the last `flush` or `save`, not yet in the file.
    unsaved: Vec<(u16, u64)>,
    /// The file, open for appending (reopened after each `save`).
    append: Option<std::fs::File>,
    /// An append failed (a full disk, an I/O error): the file may end in a
    /// partial line, so the next `flush` rewrites it whole (`save`).
    torn: bool,
    /// There was no file: this image never served as a SAN node before.
    fresh: bool,
    /// `flush`es done (each one write and one fdatasync) and their time.
    pub flushes: u64,
    pub flush_ns: u64,
    /// The disk refuses every write (ENOSPC) while set: the replica
    /// protocol's simulator fills a disk this way (`san_sim`).
    refusing: bool,
}

impl DirtyMap {
    /// An empty map kept only in memory.
    pub fn in_memory() -> DirtyMap {
        DirtyMap {
            fresh: true,
            ..DirtyMap::default()
        }
    }

    /// Whether there was no file when the map was loaded (the image never
    /// served as a SAN node), or the map lives only in memory.
    pub fn fresh(&self) -> bool {
        self.fresh
    }

    /// The map saved at `path` (empty if there is no file yet). A file that
    /// does not parse is an error, not an empty map: it would lose writes.
    pub fn load(path: &Path) -> io::Result<DirtyMap> {
        let mut map = DirtyMap {
            path: Some(path.to_path_buf()),
            ..DirtyMap::default()
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Created now: a later start knows the image served.
                std::fs::write(path, "")?;
                std::fs::File::open(path)?.sync_all()?;
                map.fresh = true;
                return Ok(map);
            }
            Err(e) => return Err(e),
        };
        for (n, line) in text.lines().enumerate() {
            let bad = || {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}:{}: expected `PEER GRANULE`", path.display(), n + 1),
                )
            };
            let mut words = line.split_whitespace();
            let (Some(peer), Some(granule), None) = (words.next(), words.next(), words.next())
            else {
                return Err(bad());
            };
            let peer: u16 = peer.parse().map_err(|_| bad())?;
            let granule: u64 = granule.parse().map_err(|_| bad())?;
            map.missed.entry(peer).or_default().insert(granule);
        }
        // A granule appended weak and later strong (or the other way) is
        // strong.
        let strong: Vec<(u16, u64)> = map
            .missed
            .iter()
            .filter(|(&k, _)| k & (WEAK | UNSURE) == 0)
            .flat_map(|(&k, set)| set.iter().map(move |&g| (k, g)))
            .collect();
        for (k, g) in strong {
            if let Some(set) = map.missed.get_mut(&weak(k)) {
                set.remove(&g);
                if set.is_empty() {
                    map.missed.remove(&weak(k));
                }
            }
        }
        Ok(map)
    }

    /// The sets a node's claims live in: its strong key and its weak one
    /// (an unsure or weak key is alone).
    fn keys_of(node: u16) -> impl Iterator<Item = u16> {
        let plain = node & (WEAK | UNSURE) == 0;
        std::iter::once(node).chain(plain.then(|| weak(node)))
    }

    /// Peer `node` missed the copy of global `[addr, addr + bytes)` (a
    /// strong claim), or, with `weak(node)`, is to get this copy's version
    /// of it (a weak one: nothing if the claim is strong already; a strong
    /// mark replaces a weak one).
    pub fn mark(&mut self, node: u16, addr: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let granules = addr / GRANULE_BYTES..=(addr + bytes - 1) / GRANULE_BYTES;
        let is_weak = node & WEAK != 0 && node & UNSURE == 0;
        let plain = node & !WEAK;
        for g in granules {
            if is_weak && self.missed.get(&plain).is_some_and(|s| s.contains(&g)) {
                continue;
            }
            if !is_weak && node & UNSURE == 0 {
                self.remove(weak(node), g);
            }
            if self.missed.entry(node).or_default().insert(g) {
                self.unsaved.push((node, g));
            }
        }
    }

    /// Drop granule `g` from one set; returns whether it was there.
    fn remove(&mut self, key: u16, g: u64) -> bool {
        let Some(set) = self.missed.get_mut(&key) else {
            return false;
        };
        let was = set.remove(&g);
        if set.is_empty() {
            self.missed.remove(&key);
        }
        if was {
            self.changed = true;
        }
        was
    }

    /// Granules marked that are not yet durable.
    pub fn needs_flush(&self) -> bool {
        !self.unsaved.is_empty()
    }

    /// Whether a claim on a peer (strong or weak: not an unsure granule)
    /// in global `[addr, addr + len)` is not yet durable: a write there
    /// may not be acknowledged (engine/port.rs).
    pub fn unsaved_in(&self, addr: u64, len: u64) -> bool {
        if self.unsaved.is_empty() || len == 0 {
            return false;
        }
        let granules = addr / GRANULE_BYTES..=(addr + len - 1) / GRANULE_BYTES;
        self.unsaved
            .iter()
            .any(|&(key, g)| key & UNSURE == 0 && granules.contains(&g))
    }

    /// Make the disk refuse (ENOSPC) every write of the map from now on
    /// (`full`), or take them again.
    pub fn set_full(&mut self, full: bool) {
        if full {
            // What a refused append left is not known.
            self.torn = true;
            self.append = None;
        }
        self.refusing = full;
    }

    /// Make the granules marked since the last flush durable: append them
    /// to the file and fdatasync it (module header). Without a file,
    /// nothing to do.
    pub fn flush(&mut self) -> io::Result<()> {
        if self.unsaved.is_empty() {
            return Ok(());
        }
        let Some(path) = &self.path else {
            self.unsaved.clear();
            return Ok(());
        };
        if self.refusing {
            self.torn = true;
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let started = std::time::Instant::now();
        if self.torn {
            // Never append after a partial line: the whole map, atomically.
            self.save()?;
        } else {
            let appended = (|| {
                if self.append.is_none() {
                    self.append = Some(std::fs::OpenOptions::new().append(true).open(path)?);
                }
                let mut text = String::with_capacity(self.unsaved.len() * 12);
                for (peer, g) in &self.unsaved {
                    text += &format!("{peer} {g}\n");
                }
                let file = self.append.as_mut().expect("opened");
                // An open file that was unlinked takes appends no one reads.
                if std::os::unix::fs::MetadataExt::nlink(&file.metadata()?) == 0 {
                    return Err(io::Error::from(io::ErrorKind::NotFound));
                }
                file.write_all(text.as_bytes())?;
                file.sync_data()
            })();
            match appended {
                // The map file is gone (removed, or a mount hides it):
                // appending to a new one would lose what the old one held,
                // so the whole map is written anew, atomically.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.append = None;
                    self.torn = true;
                    self.save()?;
                }
                Err(e) => {
                    // What was written is not known: rewrite it all next time.
                    self.torn = true;
                    self.append = None;
                    return Err(e);
                }
                Ok(()) => {}
            }
            self.unsaved.clear();
        }
        self.flushes += 1;
        self.flush_ns += started.elapsed().as_nanos() as u64;
        Ok(())
    }

    /// Up to `max` granules `node` is still to get in global `[lo, hi)`
    /// (strong and weak claims), from the lowest, as global byte addresses.
    pub fn pending_in(&self, node: u16, lo: u64, hi: u64, max: usize) -> Vec<u64> {
        let range = lo / GRANULE_BYTES..hi.div_ceil(GRANULE_BYTES);
        let mut all: Vec<u64> = Vec::new();
        for key in Self::keys_of(node) {
            if let Some(s) = self.missed.get(&key) {
                all.extend(s.range(range.clone()).take(max));
            }
        }
        all.sort_unstable();
        all.truncate(max);
        all.into_iter().map(|g| g * GRANULE_BYTES).collect()
    }

    /// Granules `node` is still to get in global `[lo, hi)` (strong and
    /// weak claims).
    pub fn granules_in(&self, node: u16, lo: u64, hi: u64) -> u64 {
        Self::keys_of(node)
            .map(|key| self.count_in(key, lo, hi))
            .sum()
    }

    /// Strong claims only: acknowledged writes `node` missed in global
    /// `[lo, hi)` (what the exchange tells and the split-brain rule sees).
    pub fn strong_in(&self, node: u16, lo: u64, hi: u64) -> u64 {
        self.count_in(node, lo, hi)
    }

    fn count_in(&self, key: u16, lo: u64, hi: u64) -> u64 {
        self.missed.get(&key).map_or(0, |s| {
            s.range(lo / GRANULE_BYTES..hi.div_ceil(GRANULE_BYTES))
                .count() as u64
        })
    }

    /// Forget the weak claims on `node` in global `[lo, hi)` (the partner
    /// wrote alone and its version wins them); their global addresses.
    pub fn take_weak_in(&mut self, node: u16, lo: u64, hi: u64) -> Vec<u64> {
        let taken: Vec<u64> = self
            .missed
            .get(&weak(node))
            .map(|s| {
                s.range(lo / GRANULE_BYTES..hi.div_ceil(GRANULE_BYTES))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        for &g in &taken {
            self.remove(weak(node), g);
        }
        taken.into_iter().map(|g| g * GRANULE_BYTES).collect()
    }

    /// Forget what `node` misses in global `[lo, hi)` (this side's writes
    /// there are discarded: `moneta san resolve`); returns the granules'
    /// global addresses.
    pub fn take_in(&mut self, node: u16, lo: u64, hi: u64) -> Vec<u64> {
        let taken = self.pending_in(node, lo, hi, usize::MAX);
        for &g in &taken {
            self.clear(node, g);
        }
        taken
    }

    /// Up to `max` granules `node` is still to get, from the lowest, as
    /// global byte addresses.
    pub fn pending(&self, node: u16, max: usize) -> Vec<u64> {
        self.pending_in(node, 0, u64::MAX - GRANULE_BYTES, max)
    }

    /// `node` has the granule at global `addr` now (either claim goes).
    pub fn clear(&mut self, node: u16, addr: u64) {
        let g = addr / GRANULE_BYTES;
        for key in Self::keys_of(node) {
            self.remove(key, g);
        }
    }

    /// This node's claim on `node` for the granule at global `addr`:
    /// strong (`Some(true)`), weak (`Some(false)`) or none.
    pub fn claim_on(&self, node: u16, addr: u64) -> Option<bool> {
        let g = addr / GRANULE_BYTES;
        let has = |key: u16| self.missed.get(&key).is_some_and(|s| s.contains(&g));
        if has(node) {
            Some(true)
        } else if has(weak(node)) {
            Some(false)
        } else {
            None
        }
    }

    /// Forget the weak claim on `node` for the granule at global `addr`
    /// (the partner's version of it wins: engine/port.rs).
    pub fn drop_weak(&mut self, node: u16, addr: u64) {
        self.remove(weak(node), addr / GRANULE_BYTES);
    }

    /// Forget the unsure granule at global `addr` with respect to
    /// `partner`: the write that marked it was acknowledged (the activity
    /// log, engine/port.rs). The file keeps it until the next `save`.
    pub fn forget_unsure(&mut self, partner: u16, addr: u64) {
        self.remove(unsure(partner), addr / GRANULE_BYTES);
    }

    /// Whether the granule at global `addr` is unsure with respect to
    /// `partner`.
    pub fn is_unsure(&self, partner: u16, addr: u64) -> bool {
        self.missed
            .get(&unsure(partner))
            .is_some_and(|s| s.contains(&(addr / GRANULE_BYTES)))
    }

    /// Whether the map holds nothing at all (unsure granules included).
    pub fn is_empty(&self) -> bool {
        self.missed.is_empty()
    }

    /// Granules `node` is still to get (strong and weak claims).
    pub fn granules(&self, node: u16) -> u64 {
        self.granules_in(node, 0, u64::MAX - GRANULE_BYTES)
    }

    pub fn is_clean(&self, node: u16) -> bool {
        Self::keys_of(node).all(|k| !self.missed.contains_key(&k))
    }

    /// Bytes missed, all peers (unsure granules not counted).
    pub fn bytes(&self) -> u64 {
        self.missed
            .range(..UNSURE)
            .map(|(_, s)| s.len() as u64)
            .sum::<u64>()
            * GRANULE_BYTES
    }

    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// Write the whole map to its file (atomically: a temporary file
    /// renamed over it, then the directory synced), if it has one and
    /// granules were cleared since.
    pub fn save(&mut self) -> io::Result<()> {
        let Some(path) = &self.path else {
            self.changed = false;
            self.unsaved.clear();
            return Ok(());
        };
        if !self.changed && !self.torn && self.unsaved.is_empty() {
            return Ok(());
        }
        if self.refusing {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let mut text = String::new();
        for (peer, set) in &self.missed {
            for g in set {
                text += &format!("{peer} {g}\n");
            }
        }
        let tmp = path.with_extension("tmp");
        // One descriptor writes and syncs. It does not keep the appends:
        // the next flush opens the map by its path, so a map file that
        // vanished or that a mount now hides is found out (written whole
        // where a restart will read it), never appended to unseen.
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself is durable only once its directory is synced.
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        std::fs::File::open(dir.unwrap_or(Path::new(".")))?.sync_all()?;
        self.changed = false;
        self.torn = false;
        // The new file holds everything marked; appends go to it now.
        self.unsaved.clear();
        self.append = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_cover_every_granule_touched_and_survive_a_reload() {
        let dir = std::env::temp_dir().join(format!("moneta-dirty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dirty");
        let mut m = DirtyMap::load(&path).unwrap();
        m.mark(2, 4095, 2);
        m.mark(1, 8192, 4096);
        assert_eq!(m.pending(2, 10), vec![0, 4096]);
        assert_eq!(m.bytes(), 3 * GRANULE_BYTES);
        m.save().unwrap();
        let mut again = DirtyMap::load(&path).unwrap();
        assert_eq!(again.pending(1, 10), vec![8192]);
        again.clear(1, 8192);
        assert!(again.is_clean(1) && !again.is_clean(2));
        // Marks are durable after a flush alone, without a save.
        again.mark(3, 0, 1);
        again.flush().unwrap();
        let third = DirtyMap::load(&path).unwrap();
        assert_eq!(third.pending(3, 10), vec![0]);
        assert!(!third.fresh());
        std::fs::write(&path, "1 x\n").unwrap();
        assert!(DirtyMap::load(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn weak_claims_are_resynced_but_never_told_and_strong_ones_win() {
        let dir = std::env::temp_dir().join(format!("moneta-dirty-weak-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dirty");
        let mut m = DirtyMap::load(&path).unwrap();
        let g = GRANULE_BYTES;
        // Node 2: a strong claim at granule 0, weak ones at 1 and 2; a
        // weak mark over the strong one changes nothing, a strong mark over
        // a weak one makes it strong.
        m.mark(2, 0, g);
        m.mark(weak(2), g, 2 * g);
        m.mark(weak(2), 0, g);
        assert_eq!(
            (m.strong_in(2, 0, 8 * g), m.granules_in(2, 0, 8 * g)),
            (1, 3)
        );
        assert_eq!(m.pending_in(2, 0, 8 * g, 10), vec![0, g, 2 * g]);
        m.mark(2, 2 * g, g);
        assert_eq!(
            (m.strong_in(2, 0, 8 * g), m.granules_in(2, 0, 8 * g)),
            (2, 3)
        );
        m.flush().unwrap();
        // The file holds granule 2 both weak and strong: strong on reload.
        let mut again = DirtyMap::load(&path).unwrap();
        assert_eq!(again.strong_in(2, 0, 8 * g), 2);
        assert_eq!(again.granules_in(2, 0, 8 * g), 3);
        // The partner wrote alone: the weak claims go, the strong stay.
        assert_eq!(again.take_weak_in(2, 0, 8 * g), vec![g]);
        assert_eq!(again.granules_in(2, 0, 8 * g), 2);
        // A resync acknowledgement clears either kind.
        again.mark(weak(2), 5 * g, g);
        again.clear(2, 5 * g);
        again.clear(2, 0);
        again.clear(2, 2 * g);
        assert!(again.is_clean(2));
        again.save().unwrap();
        assert!(DirtyMap::load(&path).unwrap().is_clean(2));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A failed append (here: the file is /dev/full, a full disk) keeps
    /// the granules unsaved and never appends after what it may have
    /// half-written: the retry rewrites the whole map, which then loads.
    #[test]
    fn a_failed_flush_keeps_the_granules_and_the_retry_rewrites_the_file() {
        let dir = std::env::temp_dir().join(format!("moneta-dirty-full-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dirty");
        let mut m = DirtyMap::load(&path).unwrap();
        m.mark(1, 0, 4096);
        m.flush().unwrap();
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink("/dev/full", &path).unwrap();
        m.append = None;
        m.mark(1, 8192, 4096);
        m.mark(unsure(1), 20480, 4096);
        let e = m.flush().expect_err("a flush to a full disk");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
        assert!(m.needs_flush(), "the granule is still to be made durable");
        // A write on the granule not yet durable may not be acknowledged;
        // one on the durable granule, or on an unsure one, may.
        assert!(m.unsaved_in(8000, 500) && m.unsaved_in(12287, 1));
        assert!(!m.unsaved_in(0, 4096) && !m.unsaved_in(12288, 4096));
        assert!(
            !m.unsaved_in(20480, 4096),
            "an unsure granule gates nothing"
        );
        // The retry writes the map anew (the rename replaces the link).
        m.flush().unwrap();
        assert!(!m.needs_flush());
        let again = DirtyMap::load(&path).unwrap();
        assert_eq!(again.pending(1, 10), vec![0, 8192]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Appends after a save land in the map's file (the renamed one),
    /// after what the save wrote.
    #[test]
    fn appends_after_a_save_land_in_the_saved_file() {
        let dir = std::env::temp_dir().join(format!("moneta-dirty-resave-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dirty");
        let g = GRANULE_BYTES;
        let mut m = DirtyMap::load(&path).unwrap();
        m.mark(1, 0, g);
        m.mark(1, g, g);
        m.flush().unwrap();
        m.clear(1, 0);
        m.save().unwrap();
        assert!(
            !dir.join("dirty.tmp").exists(),
            "the temporary file renamed"
        );
        m.mark(1, 5 * g, g);
        m.flush().unwrap();
        m.mark(2, 7 * g, g);
        m.flush().unwrap();
        let again = DirtyMap::load(&path).unwrap();
        assert_eq!(again.pending(1, 10), vec![g, 5 * g]);
        assert_eq!(again.pending(2, 10), vec![7 * g]);
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_map_file_that_vanished_is_written_whole_not_appended_to() {
        let dir = std::env::temp_dir().join(format!("moneta-dirty-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("dirty");
        let g = GRANULE_BYTES;
        let mut m = DirtyMap::load(&path).unwrap();
        m.mark(1, 0, g);
        m.flush().unwrap();
        // Removed (or hidden by a mount) while the daemon runs.
        std::fs::remove_file(&path).unwrap();
        m.mark(1, 3 * g, g);
        m.flush().unwrap();
        let again = DirtyMap::load(&path).unwrap();
        assert_eq!(again.pending(1, 10), vec![0, 3 * g], "both granules kept");
        std::fs::remove_dir_all(&dir).ok();
    }
}
