//! The Moneta-D library's per-descriptor extent map (SPEC §3.2) and where
//! the file system placed the file's extents on the device (SPEC §3.3).
//!
//! A thread group's file covers its workload region, cut into
//! `direct.file_extents` extents of whole requests. The file system placed
//! each extent physically right after the previous one with probability
//! `direct.adjacent_fraction` (seeded) and otherwise one request further on,
//! so the device's permission table merges exactly the adjacent runs (when
//! `direct.merge_records`). The library learns an extent on its first use: a
//! *soft miss*, for which the kernel installs the extent's record in the
//! device's table. Hard misses (the table evicted the record) are the
//! device's answer, not the library's: see `device::driver`.
//!
//! Left out: requests that span extents (a group's requests are whole
//! slots of an extent, so none does) and holes.

use crate::config::DirectConfig;
use crate::kernel::Rng;
use crate::units::DeviceAddr;
use crate::workload::ThreadGroup;

pub struct ExtentMap {
    base_bytes: u64,
    size_bytes: u64,
    slots: u64,
    /// How far each extent sits beyond its logical place: the gaps the
    /// file system left before it.
    shift_bytes: Vec<u64>,
    known_to_library: Vec<bool>,
}

impl ExtentMap {
    /// The layout of `group`'s file; `stream` picks the seeded stream.
    pub fn new(direct: &DirectConfig, group: &ThreadGroup, seed: u64, stream: u64) -> Self {
        let extents = direct.file_extents as usize;
        let mut rng = Rng::stream(seed, 0x9E4_u64 + stream);
        let mut shift_bytes = Vec::with_capacity(extents);
        let mut shift = 0;
        for i in 0..extents {
            if i > 0 && rng.unit() >= direct.adjacent_fraction {
                shift += group.size_bytes;
            }
            shift_bytes.push(shift);
        }
        ExtentMap {
            base_bytes: group.region_offset_bytes,
            size_bytes: group.size_bytes,
            slots: group.region_bytes / group.size_bytes,
            shift_bytes,
            known_to_library: vec![false; extents],
        }
    }

    pub fn extents(&self) -> usize {
        self.shift_bytes.len()
    }

    /// One past the last device byte the file occupies.
    pub fn end_bytes(&self) -> u64 {
        self.base_bytes + self.slots * self.size_bytes + self.shift_bytes.last().unwrap_or(&0)
    }

    /// The extent holding the request at logical address `addr`.
    pub fn extent_of(&self, addr: u64) -> usize {
        let slot = (addr - self.base_bytes) / self.size_bytes;
        (slot as u128 * self.extents() as u128 / self.slots as u128) as usize
    }

    /// First request slot of `extent`.
    fn first_slot(&self, extent: usize) -> u64 {
        (extent as u128 * self.slots as u128).div_ceil(self.extents() as u128) as u64
    }

    /// The device byte range `[start, start + len)` of `extent`.
    pub fn device_range(&self, extent: usize) -> (DeviceAddr, u64) {
        let first = self.first_slot(extent);
        let end = self.first_slot(extent + 1);
        let start = self.base_bytes + first * self.size_bytes + self.shift_bytes[extent];
        (DeviceAddr(start), (end - first) * self.size_bytes)
    }

    /// Where the request at logical address `addr` lies on the device.
    pub fn device_addr(&self, addr: u64) -> DeviceAddr {
        DeviceAddr(addr + self.shift_bytes[self.extent_of(addr)])
    }

    /// The library looks `extent` up: `true` is a soft miss (it was not in
    /// the map, and now is).
    pub fn learn(&mut self, extent: usize) -> bool {
        !std::mem::replace(&mut self.known_to_library[extent], true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::workload::{OpMix, RunLimit, Workload};

    fn map(extents: u64, adjacent: f64) -> ExtentMap {
        let mut c = Config::preset("moneta-d").unwrap().direct;
        c.file_extents = extents;
        c.adjacent_fraction = adjacent;
        let w = Workload::xdd(OpMix::Read, 4096, 1, 1 << 20, RunLimit::Ops(1), 1);
        ExtentMap::new(&c, &w.groups[0], 1, 0)
    }

    #[test]
    fn extents_tile_the_file_and_gaps_separate_non_adjacent_ones() {
        let all_adjacent = map(16, 1.0);
        assert_eq!(all_adjacent.end_bytes(), 1 << 20);
        let none_adjacent = map(16, 0.0);
        assert_eq!(none_adjacent.end_bytes(), (1 << 20) + 15 * 4096);
        for m in [&all_adjacent, &none_adjacent] {
            let mut end = None;
            for e in 0..16 {
                let (start, len) = m.device_range(e);
                assert_eq!(len, (1 << 20) / 16);
                if let Some(prev_end) = end {
                    let gap = start.0 - prev_end;
                    assert_eq!(
                        gap,
                        if std::ptr::eq(m, &all_adjacent) {
                            0
                        } else {
                            4096
                        }
                    );
                }
                end = Some(start.0 + len);
                assert_eq!(m.extent_of(e as u64 * len), e);
                assert_eq!(m.device_addr(e as u64 * len), start);
            }
        }
    }

    #[test]
    fn first_use_is_a_soft_miss() {
        let mut m = map(4, 0.5);
        assert!(m.learn(2));
        assert!(!m.learn(2));
    }
}
