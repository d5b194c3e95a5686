//! Transfer buffers and segmentation (SPEC §1.4).
//!
//! A request is cut into segments of at most one buffer (8 KB), also cut
//! wherever a stripe boundary would be crossed, so each segment fits one
//! buffer and targets one memory controller. The scheduler allocates a buffer
//! before a segment starts and stalls while none is free.

use crate::units::{Divisor, Ns};

/// Where a segment of a request goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// Byte offset of the segment inside its request.
    pub offset_bytes: u64,
    pub bytes: u64,
    pub controller: u32,
    /// Byte address inside the controller's own memory.
    pub local_addr: u64,
}

/// Striping of the internal address space across controllers.
#[derive(Debug, Clone, Copy)]
pub struct Striping {
    stripe: Divisor,
    controllers: Divisor,
    /// The smaller of the stripe and the segment (buffer) size: segments
    /// end at its multiples.
    boundary: Divisor,
}

impl Striping {
    pub fn new(stripe_bytes: u64, controllers: u32, segment_bytes: u64) -> Striping {
        Striping {
            stripe: Divisor::new(stripe_bytes),
            controllers: Divisor::new(u64::from(controllers)),
            boundary: Divisor::new(stripe_bytes.min(segment_bytes)),
        }
    }

    pub fn stripe_bytes(&self) -> u64 {
        self.stripe.get()
    }

    /// The segment of a request at `addr` (request start) that begins at
    /// `offset_bytes` into it; `len_bytes` is the request length.
    pub fn segment(&self, addr: u64, len_bytes: u64, offset_bytes: u64) -> Segment {
        let at = addr + offset_bytes;
        let to_boundary = self.boundary.get() - self.boundary.remainder_of(at);
        let bytes = to_boundary.min(len_bytes - offset_bytes);
        let stripe = self.stripe.quotient_of(at);
        let controller = self.controllers.remainder_of(stripe) as u32;
        let local_addr =
            self.controllers.quotient_of(stripe) * self.stripe.get() + self.stripe.remainder_of(at);
        Segment {
            offset_bytes,
            bytes,
            controller,
            local_addr,
        }
    }

    /// Number of segments of a request.
    pub fn segment_count(&self, addr: u64, len_bytes: u64) -> u32 {
        let first = self.boundary.quotient_of(addr);
        let last = self.boundary.quotient_of(addr + len_bytes - 1);
        (last - first + 1) as u32
    }
}

/// A fixed pool of transfer buffers; also accounts their busy time for the
/// power model.
#[derive(Debug, Clone)]
pub struct BufferPool {
    free: Vec<u16>,
    allocated_at_ns: Vec<Ns>,
    busy_ns_total: u64,
}

impl BufferPool {
    pub fn new(count: u32) -> Self {
        Self {
            free: (0..count as u16).rev().collect(),
            allocated_at_ns: vec![0; count as usize],
            busy_ns_total: 0,
        }
    }

    /// A free buffer, now owned by the caller's segment until it releases it
    /// (SPEC §1.4: allocated before the segment starts, freed after its
    /// last transfer); None while every buffer is owned.
    pub fn allocate(&mut self, now_ns: Ns) -> Option<u16> {
        let b = self.free.pop()?;
        debug_assert!(
            usize::from(b) < self.allocated_at_ns.len(),
            "free list holds buffer {b}, outside the pool"
        );
        self.allocated_at_ns[b as usize] = now_ns;
        Some(b)
    }

    /// The owner gives `buffer` back. Ownership is asserted in debug builds:
    /// only an allocated buffer of this pool is released, once, and not
    /// before it was allocated.
    pub fn release(&mut self, now_ns: Ns, buffer: u16) {
        debug_assert!(
            usize::from(buffer) < self.allocated_at_ns.len(),
            "released buffer {buffer}, outside the pool of {}",
            self.allocated_at_ns.len()
        );
        debug_assert!(!self.free.contains(&buffer), "buffer {buffer} freed twice");
        debug_assert!(
            now_ns >= self.allocated_at_ns[buffer as usize],
            "buffer {buffer} released at {now_ns} ns, before its allocation at {} ns",
            self.allocated_at_ns[buffer as usize]
        );
        self.busy_ns_total += now_ns - self.allocated_at_ns[buffer as usize];
        self.free.push(buffer);
    }

    pub fn has_free(&self) -> bool {
        !self.free.is_empty()
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn busy_ns(&self) -> u64 {
        self.busy_ns_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn moneta() -> Striping {
        Striping::new(8192, 8, 8192)
    }

    #[test]
    fn segments_split_at_8kb_boundaries() {
        let s = moneta();
        assert_eq!(s.segment_count(0, 8192), 1);
        assert_eq!(s.segment_count(4096, 8192), 2);
        assert_eq!(s.segment_count(0, 1 << 20), 128);
        let a = s.segment(4096, 8192, 0);
        assert_eq!((a.bytes, a.controller, a.local_addr), (4096, 0, 4096));
        let b = s.segment(4096, 8192, 4096);
        assert_eq!((b.bytes, b.controller, b.local_addr), (4096, 1, 0));
        let c = s.segment(9 * 8192, 512, 0);
        assert_eq!((c.controller, c.local_addr), (1, 8192));
    }

    proptest! {
        #[test]
        fn segments_tile_the_request(addr in 0u64..(1 << 30), len in 1u64..(1 << 21), stripe_log in 9u32..16, ctrls in 1u32..17) {
            let s = Striping::new(1 << stripe_log, ctrls, 8192);
            let n = s.segment_count(addr, len);
            let mut off = 0;
            for _ in 0..n {
                let seg = s.segment(addr, len, off);
                prop_assert!(seg.bytes > 0 && seg.bytes <= 8192);
                prop_assert!(seg.controller < ctrls);
                // A segment never crosses a stripe: it stays in one controller.
                prop_assert!(seg.local_addr % s.stripe_bytes() + seg.bytes <= s.stripe_bytes());
                off += seg.bytes;
            }
            prop_assert_eq!(off, len);
        }
    }
}
