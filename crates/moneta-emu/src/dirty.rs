//! The dirty map of a mirrored SAN node (SPEC §4.3, issue 12 item 6; what
//! DRBD calls the activity/bitmap): while a peer holding the other copy of
//! some of this node's data is failed, writes go on degraded to this copy
//! alone, and the map records, per failed peer, which granules of the
//! global space the peer missed. When the peer is back, the port resyncs
//! exactly those granules from this node's copy, and clears each once the
//! peer has acknowledged it.
//!
//! The map is kept in a file beside the image (`save` after changes, at
//! most every `SAVE_INTERVAL_NS`; and at once when the last entry for a
//! peer clears), so that a node that itself restarts while a peer is behind
//! still knows what to resync.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

/// Granule of the map: a missed write marks every granule it touches.
pub const GRANULE_BYTES: u64 = 4096;

/// Missed granules by peer.
#[derive(Debug, Default)]
pub struct DirtyMap {
    missed: BTreeMap<u16, BTreeSet<u64>>,
    path: Option<PathBuf>,
    changed: bool,
}

impl DirtyMap {
    /// An empty map kept only in memory.
    pub fn in_memory() -> DirtyMap {
        DirtyMap::default()
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
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(map),
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
        Ok(map)
    }

    /// Peer `node` missed the copy of global `[addr, addr + bytes)`.
    pub fn mark(&mut self, node: u16, addr: u64, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let set = self.missed.entry(node).or_default();
        for g in addr / GRANULE_BYTES..=(addr + bytes - 1) / GRANULE_BYTES {
            set.insert(g);
        }
        self.changed = true;
    }

    /// Up to `max` granules `node` still misses, from the lowest, as
    /// global byte addresses.
    pub fn pending(&self, node: u16, max: usize) -> Vec<u64> {
        self.missed
            .get(&node)
            .map(|s| s.iter().take(max).map(|g| g * GRANULE_BYTES).collect())
            .unwrap_or_default()
    }

    /// `node` has the granule at global `addr` now.
    pub fn clear(&mut self, node: u16, addr: u64) {
        if let Some(set) = self.missed.get_mut(&node) {
            if set.remove(&(addr / GRANULE_BYTES)) {
                self.changed = true;
            }
            if set.is_empty() {
                self.missed.remove(&node);
            }
        }
    }

    /// Granules `node` misses.
    pub fn granules(&self, node: u16) -> u64 {
        self.missed.get(&node).map_or(0, |s| s.len() as u64)
    }

    pub fn is_clean(&self, node: u16) -> bool {
        !self.missed.contains_key(&node)
    }

    /// Bytes missed, all peers.
    pub fn bytes(&self) -> u64 {
        self.missed.values().map(|s| s.len() as u64).sum::<u64>() * GRANULE_BYTES
    }

    pub fn is_changed(&self) -> bool {
        self.changed
    }

    /// Write the map to its file (atomically: a temporary file renamed
    /// over it), if it has one and changed.
    pub fn save(&mut self) -> io::Result<()> {
        let Some(path) = &self.path else {
            self.changed = false;
            return Ok(());
        };
        if !self.changed {
            return Ok(());
        }
        let mut text = String::new();
        for (peer, set) in &self.missed {
            for g in set {
                text += &format!("{peer} {g}\n");
            }
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, path)?;
        self.changed = false;
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
        std::fs::write(&path, "1 x\n").unwrap();
        assert!(DirtyMap::load(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
