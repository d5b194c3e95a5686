//! The retag stage (SPEC §1.4, Moneta-D): each channel has 64 virtual tags;
//! a (channel, virtual tag) pair in flight holds one of the device's physical
//! tags, taken from a hardware free list. When none is free the stage stalls
//! (the device stops taking commands) until a completion releases one. The
//! rest of the pipeline carries only the physical tag. [`RoundRobin`] is the
//! order in which the stage visits the channels for new commands, so that
//! when tags are scarce every channel gets its turn.

use super::tags::TagPool;
use crate::units::PhysTag;

pub struct Retag {
    pool: TagPool,
    /// (channel, virtual tag) holding each physical tag.
    owner: Vec<Option<(u16, u8)>>,
}

impl Retag {
    pub fn new(physical_tags: u32) -> Self {
        Retag {
            pool: TagPool::new(physical_tags),
            owner: vec![None; physical_tags as usize],
        }
    }

    pub fn has_free(&self) -> bool {
        self.pool.in_flight() < self.pool.capacity()
    }

    pub fn in_flight(&self) -> u32 {
        self.pool.in_flight()
    }

    /// Give (channel, virtual tag) a physical tag, or None: stall.
    pub fn map(&mut self, channel: u16, virtual_tag: u8) -> Option<PhysTag> {
        let tag = self.pool.allocate()?;
        debug_assert!(self.owner[tag.0 as usize].is_none());
        self.owner[tag.0 as usize] = Some((channel, virtual_tag));
        Some(tag)
    }

    /// Free a physical tag; returns who held it.
    pub fn release(&mut self, tag: PhysTag) -> (u16, u8) {
        let owner = self.owner[tag.0 as usize]
            .take()
            .expect("released a physical tag nobody holds");
        self.pool.release(tag);
        owner
    }
}

/// Round-robin order over the channels with commands: each pass starts one
/// channel further than the last.
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    /// Positions `0..n` in this pass's order.
    pub fn pass(&mut self, n: usize) -> impl Iterator<Item = usize> + use<> {
        let start = if n > 0 { self.next % n } else { 0 };
        if n > 0 {
            self.next = (start + 1) % n;
        }
        (0..n).map(move |i| (start + i) % n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_until_exhausted_then_stalls() {
        let mut r = Retag::new(2);
        let a = r.map(5, 63).unwrap();
        let b = r.map(6, 63).unwrap();
        assert_ne!(a, b);
        assert!(!r.has_free() && r.map(7, 0).is_none());
        assert_eq!(r.release(a), (5, 63));
        assert!(r.has_free());
        assert_eq!(r.map(7, 0), Some(a));
        assert_eq!(r.in_flight(), 2);
    }

    #[test]
    fn round_robin_starts_one_further_each_pass() {
        let mut r = RoundRobin::default();
        assert_eq!(r.pass(3).collect::<Vec<_>>(), vec![0, 1, 2]);
        assert_eq!(r.pass(3).collect::<Vec<_>>(), vec![1, 2, 0]);
        assert_eq!(r.pass(2).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(r.pass(0).count(), 0);
    }
}
