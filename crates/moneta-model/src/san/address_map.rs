//! The global address map: QuickSAN's "configuration utility" (SPEC §4.1,
//! §4.3), which, like a logical volume manager, decides how the global
//! storage space maps onto the SSDs, and programs every device's routing
//! registers (LOCALREQUESTMASK/TAG) and MAC table accordingly.
//!
//! Each SSD holds one contiguous, aligned slice of the global space: that
//! is what the routing registers express (a mask over the upper address
//! bits, compared with a tag), so the slice size is a power of two and the
//! upper bits name the slice. The same map serves both topologies: in the
//! centralized one the slices are the server's SSDs (one shared block
//! device), in the distributed one each host's SSD (SPEC §4.1).
//!
//! Mirroring (SPEC §4.3): each SSD's capacity is split in halves; the
//! first holds its primary slice, the second the replica of the previous
//! SSD's slice (SSD i mirrors SSD i−1), so any one SSD can fail.

use super::error::SanError;
use crate::device::network::{RouteTable, SliceOwners};

#[derive(Debug, Clone)]
pub struct AddressMap {
    slice_shift: u32,
    slices: Vec<SliceOwners>,
}

impl AddressMap {
    /// The SSDs' node indices in slice order, each with `ssd_capacity_bytes`.
    pub fn new(ssds: &[u16], ssd_capacity_bytes: u64, mirroring: bool) -> Result<Self, SanError> {
        if ssds.is_empty() {
            return Err(SanError::BadConfig("a SAN needs at least one SSD".into()));
        }
        if mirroring && ssds.len() < 2 {
            return Err(SanError::BadConfig(
                "mirroring needs at least two SSDs".into(),
            ));
        }
        if !ssd_capacity_bytes.is_power_of_two() {
            return Err(SanError::BadConfig(format!(
                "device.capacity_bytes {ssd_capacity_bytes} must be a power of two: \
                 LOCALREQUESTMASK selects a slice by the upper address bits"
            )));
        }
        let slice_bytes = if mirroring {
            ssd_capacity_bytes / 2
        } else {
            ssd_capacity_bytes
        };
        let slice_shift = slice_bytes.trailing_zeros();
        if slice_shift + (64 - (ssds.len() as u64).leading_zeros()) > 63 {
            return Err(SanError::BadConfig(
                "the global space does not fit 64-bit addresses".into(),
            ));
        }
        let k = ssds.len();
        let slices = (0..k)
            .map(|i| SliceOwners {
                primary: (ssds[i], 0),
                replica: mirroring.then(|| (ssds[(i + 1) % k], slice_bytes)),
            })
            .collect();
        Ok(AddressMap {
            slice_shift,
            slices,
        })
    }

    pub fn capacity_bytes(&self) -> u64 {
        (self.slices.len() as u64) << self.slice_shift
    }

    pub fn slice_bytes(&self) -> u64 {
        1 << self.slice_shift
    }

    fn owners(&self, addr: u64) -> (&SliceOwners, u64) {
        let slice = (addr >> self.slice_shift) as usize;
        (&self.slices[slice], addr & (self.slice_bytes() - 1))
    }

    /// The node holding the primary copy of `addr` (< capacity), and the
    /// device-local address there.
    pub fn primary(&self, addr: u64) -> (u16, u64) {
        let (owners, offset) = self.owners(addr);
        (owners.primary.0, owners.primary.1 + offset)
    }

    /// The node holding the mirror copy of `addr`, if mirrored.
    pub fn replica(&self, addr: u64) -> Option<(u16, u64)> {
        let (owners, offset) = self.owners(addr);
        owners.replica.map(|(node, base)| (node, base + offset))
    }

    /// The routing registers and MAC table the utility programs into `node`.
    pub fn route_table(&self, node: u16, has_memory: bool) -> RouteTable {
        RouteTable::new(node, self.slice_shift, self.slices.clone(), has_memory)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::network::Target;
    use crate::kernel::Rng;

    /// Every global address has exactly one primary (device, local address),
    /// and mirrored one replica on another device; no two global addresses
    /// share a (device, local address); every device's routing registers
    /// agree with the map.
    #[test]
    fn routing_is_total_and_unique() {
        let seed = 0x0ADD_0001;
        eprintln!("routing property seed {seed:#x}");
        let mut rng = Rng::new(seed);
        for case in 0..200 {
            let nodes = 1 + rng.below(16) as u16;
            let mirroring = nodes >= 2 && rng.below(2) == 0;
            let capacity = 1u64 << (13 + rng.below(24));
            let ssds: Vec<u16> = (0..nodes).collect();
            let map = AddressMap::new(&ssds, capacity, mirroring).unwrap();
            let expected = if mirroring { capacity / 2 } else { capacity } * nodes as u64;
            assert_eq!(map.capacity_bytes(), expected, "case {case}");
            let mut tables: Vec<RouteTable> =
                ssds.iter().map(|&n| map.route_table(n, true)).collect();
            let mut seen = std::collections::HashMap::new();
            for _ in 0..200 {
                let addr = rng.below(map.capacity_bytes());
                let (node, local) = map.primary(addr);
                assert!(local < capacity);
                let mut copies = vec![(node, local)];
                if let Some((rnode, rlocal)) = map.replica(addr) {
                    assert_ne!(rnode, node, "replica on the primary's device");
                    assert!(rlocal < capacity);
                    copies.push((rnode, rlocal));
                } else {
                    assert!(!mirroring);
                }
                for copy in copies {
                    if let Some(other) = seen.insert(copy, addr) {
                        assert_eq!(other, addr, "two addresses share {copy:?}");
                    }
                }
                // Each device routes the write's copies to the same places.
                for t in &mut tables {
                    let node = t.node;
                    let here = |(n, a): (u16, u64)| {
                        if n == node {
                            Target::Local(a)
                        } else {
                            Target::Remote { node: n, addr: a }
                        }
                    };
                    assert_eq!(t.route_write(addr, 0), here(map.primary(addr)));
                    if let Some(r) = map.replica(addr) {
                        assert_eq!(t.route_write(addr, 1), here(r));
                        let read = t.route_read(addr);
                        assert!(read == here(r) || read == here(map.primary(addr)));
                    }
                }
            }
        }
    }

    #[test]
    fn bad_maps_are_errors() {
        assert!(AddressMap::new(&[], 1 << 20, false).is_err());
        assert!(AddressMap::new(&[0], 1 << 20, true).is_err());
        assert!(AddressMap::new(&[0, 1], 3 << 20, false).is_err());
    }
}
