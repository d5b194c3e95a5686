//! Tags: identifiers of outstanding requests (SPEC §1.2, §1.4).
//!
//! The device tracks 64 physical tags. A [`TagPool`] is the lock-free free
//! list of the driver (Moneta+Atomic) or the retag unit's hardware free list
//! (Moneta-D): allocation fails when every tag is in flight, and the caller
//! waits. Freeing a tag that is not in flight is a bug in the caller.

use crate::units::PhysTag;

/// Up to 256 tags as a bitmap; lowest free tag first (deterministic).
#[derive(Debug, Clone)]
pub struct TagPool {
    free: [u64; 4],
    capacity: u32,
    in_flight: u32,
}

impl TagPool {
    pub fn new(capacity: u32) -> Self {
        assert!((1..=256).contains(&capacity), "tag pool of {capacity} tags");
        let mut free = [0u64; 4];
        for t in 0..capacity {
            free[(t / 64) as usize] |= 1 << (t % 64);
        }
        Self {
            free,
            capacity,
            in_flight: 0,
        }
    }

    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight
    }

    pub fn allocate(&mut self) -> Option<PhysTag> {
        for (i, word) in self.free.iter_mut().enumerate() {
            if *word != 0 {
                let bit = word.trailing_zeros();
                *word &= !(1 << bit);
                self.in_flight += 1;
                return Some(PhysTag((i as u32 * 64 + bit) as u8));
            }
        }
        None
    }

    pub fn is_in_flight(&self, tag: PhysTag) -> bool {
        let t = tag.0 as u32;
        t < self.capacity && self.free[(t / 64) as usize] & (1 << (t % 64)) == 0
    }

    pub fn release(&mut self, tag: PhysTag) {
        assert!(
            self.is_in_flight(tag),
            "released tag {} that is not in flight",
            tag.0
        );
        let t = tag.0 as u32;
        self.free[(t / 64) as usize] |= 1 << (t % 64);
        self.in_flight -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_every_tag_once_then_stalls() {
        let mut p = TagPool::new(64);
        let tags: Vec<_> = (0..64).map(|_| p.allocate().unwrap()).collect();
        assert!(p.allocate().is_none());
        let mut sorted: Vec<u8> = tags.iter().map(|t| t.0).collect();
        sorted.dedup();
        assert_eq!(sorted.len(), 64);
        p.release(PhysTag(17));
        assert_eq!(p.allocate(), Some(PhysTag(17)));
        assert_eq!(p.in_flight(), 64);
    }

    #[test]
    #[should_panic]
    fn double_release_is_a_bug() {
        let mut p = TagPool::new(4);
        let t = p.allocate().unwrap();
        p.release(t);
        p.release(t);
    }
}
