//! The permission state a Moneta-D process meets (SPEC §3.2–3.3).
//!
//! Two levels: the library's per-descriptor extent map (filled on demand; a
//! missing extent is a *soft miss*: ask the kernel, which installs the
//! record) and the device's permission table of `permission_records` records
//! shared by all channels (a record evicted from it gives a *hard miss*: the
//! device rejects the request and the library re-installs and retries).
//! Records merge when the file system placed consecutive extents physically
//! adjacent (same file, same permission bits), so a file of E extents needs
//! fewer records. Eviction picks a resident record at random (seeded). The
//! device's lookup walks a balanced tree: depth = ⌈log2(records + 1)⌉,
//! at most 14 levels for 16K records.

use crate::config::DirectConfig;
use crate::kernel::Rng;

pub struct PermissionModel {
    /// Record that covers each extent of the file (merging applied).
    record_of_extent: Vec<u32>,
    known_to_library: Vec<bool>,
    /// Position of each record in `resident`, or u32::MAX if not in the table.
    slot_of_record: Vec<u32>,
    resident: Vec<u32>,
    capacity: usize,
    rng: Rng,
    pub soft_misses: u64,
    pub hard_misses: u64,
    pub evictions: u64,
}

impl PermissionModel {
    pub fn new(direct: &DirectConfig, seed: u64) -> Self {
        let extents = direct.file_extents as usize;
        let mut rng = Rng::stream(seed, 0x9E4_u64);
        let mut record_of_extent = Vec::with_capacity(extents);
        let mut record = 0u32;
        for i in 0..extents {
            let adjacent = direct.merge_records && i > 0 && rng.unit() < direct.adjacent_fraction;
            if i > 0 && !adjacent {
                record += 1;
            }
            record_of_extent.push(record);
        }
        let records = record as usize + 1;
        Self {
            record_of_extent,
            known_to_library: vec![false; extents],
            slot_of_record: vec![u32::MAX; records],
            resident: Vec::with_capacity((direct.permission_records as usize).min(records)),
            capacity: direct.permission_records as usize,
            rng,
            soft_misses: 0,
            hard_misses: 0,
            evictions: 0,
        }
    }

    pub fn records(&self) -> usize {
        self.slot_of_record.len()
    }

    pub fn extents(&self) -> usize {
        self.record_of_extent.len()
    }

    /// Depth of the device's tree for the records now resident.
    pub fn tree_depth(&self) -> u32 {
        let n = self.resident.len() as u64 + 1;
        (64 - (n - 1).leading_zeros()).max(1)
    }

    fn install(&mut self, record: u32) {
        if self.resident.len() == self.capacity {
            let victim_slot = self.rng.below(self.resident.len() as u64) as usize;
            let victim = self.resident.swap_remove(victim_slot);
            self.slot_of_record[victim as usize] = u32::MAX;
            if let Some(&moved) = self.resident.get(victim_slot) {
                self.slot_of_record[moved as usize] = victim_slot as u32;
            }
            self.evictions += 1;
        }
        self.slot_of_record[record as usize] = self.resident.len() as u32;
        self.resident.push(record);
    }

    /// An access to `extent`: returns (soft miss, hard miss).
    pub fn access(&mut self, extent: usize) -> (bool, bool) {
        let record = self.record_of_extent[extent];
        if !self.known_to_library[extent] {
            self.known_to_library[extent] = true;
            self.soft_misses += 1;
            if self.slot_of_record[record as usize] == u32::MAX {
                self.install(record);
            }
            return (true, false);
        }
        if self.slot_of_record[record as usize] == u32::MAX {
            self.hard_misses += 1;
            self.install(record);
            return (false, true);
        }
        (false, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn model(extents: u64, records: u32, merge: bool, adjacent: f64) -> PermissionModel {
        let mut c = Config::preset("moneta-d").unwrap().direct;
        c.file_extents = extents;
        c.permission_records = records;
        c.merge_records = merge;
        c.adjacent_fraction = adjacent;
        PermissionModel::new(&c, 1)
    }

    #[test]
    fn first_touch_is_a_soft_miss_then_hits() {
        let mut m = model(4, 16, false, 0.0);
        assert_eq!(m.access(2), (true, false));
        assert_eq!(m.access(2), (false, false));
        assert_eq!(m.tree_depth(), 1);
    }

    #[test]
    fn overflowing_the_table_gives_hard_misses_and_merging_avoids_them() {
        let mut m = model(64, 32, false, 0.0);
        let mut rng = Rng::new(3);
        for e in 0..64 {
            m.access(e);
        }
        for _ in 0..1000 {
            m.access(rng.below(64) as usize);
        }
        assert!(m.hard_misses > 100, "{}", m.hard_misses);
        assert!(m.resident.len() <= 32);
        // Every second extent adjacent to its predecessor: half the records.
        let mut merged = model(64, 32, true, 1.0);
        for e in 0..64 {
            merged.access(e);
        }
        for _ in 0..1000 {
            merged.access(rng.below(64) as usize);
        }
        assert_eq!(merged.hard_misses, 0);
        assert_eq!(merged.records(), 1);
    }
}
