//! The miss path of NVMM's DRAM cache (SPEC §7 "Miss path"), once for both
//! faces (issue 24, "one core, two faces"): on a miss, choose the victim
//! (an empty way, else the set's least recently used block), write it back
//! if dirty, drop it, translate the missed block and read it from flash,
//! fill the way; optionally write back the set's next victim early (clean
//! it, keep it: the report's early write-back of cold dirty pages).
//!
//! The decisions live here and in the cache they act on
//! ([`BlockCache`]); what a step costs and where the bytes are is the
//! face's ([`MissFace`]):
//!
//! - the simulator's hybrid controller (`controller.rs`) books DRAM and
//!   flash reservations in virtual time and moves no bytes; its storage is
//!   the journal on physical flash (`journal.rs`);
//! - libnvmm (`crates/libnvmm/src/region.rs`) moves real bytes between its
//!   mapping and its log file, and waits on its clock (the wall clock, or a
//!   virtual one in its model face) until the flash timing's completion.
//!
//! Times are nanoseconds on the face's clock; every step of one miss is
//! booked at the miss's `now_ns`, so a face may do the real work of a step
//! while an earlier one is still in flight. What each face sees is its
//! own: the simulator reports every access (a hit moves its block to most
//! recently used), libnvmm only misses and first stores (user space never
//! sees a hit). Prefetch stays each face's (the controller installs
//! prefetched blocks at once, ready when their reads complete; libnvmm
//! installs them from buffers when their reads have completed) and calls
//! [`miss`] for each block it installs.

use super::cache::{BlockCache, WayIndex};
use crate::units::Ns;

/// When a missed block's data arrives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Fetched {
    /// The requested line (critical word first).
    pub critical_ns: Ns,
    /// The whole block.
    pub done_ns: Ns,
}

/// One face's steps of a miss: its memory, its storage and its clock.
pub trait MissFace {
    type Error;
    /// The cache the miss path decides in.
    fn cache(&mut self) -> &mut BlockCache;
    /// Write the dirty `block` back, asked at `now_ns` (its way is already
    /// marked clean); returns when its data has left the cache.
    fn write_back(&mut self, now_ns: Ns, block: u64) -> Result<Ns, Self::Error>;
    /// `block` leaves the cache (written back first if it was dirty).
    fn evict(&mut self, block: u64) -> Result<(), Self::Error>;
    /// Translate `block` and read it from flash at `now_ns` (a never-written
    /// block arrives at once, as zeros).
    fn fetch(&mut self, now_ns: Ns, block: u64) -> Result<Fetched, Self::Error>;
    /// Fill `block`'s way once its data has arrived (`data_ns`) and the
    /// victim has left (`victim_out_ns`); returns when the block is ready.
    fn fill(
        &mut self,
        now_ns: Ns,
        data_ns: Ns,
        victim_out_ns: Ns,
        block: u64,
    ) -> Result<Ns, Self::Error>;
}

/// What a miss did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Miss {
    /// The way `block` now holds.
    pub way: WayIndex,
    /// When the requested line arrived.
    pub critical_ns: Ns,
    /// The block evicted to make room, if the set was full.
    pub evicted: Option<u64>,
    /// Whether the set's next victim was written back early.
    pub written_early: bool,
}

/// Handle the miss of `block` at `now_ns` (see the module header); the
/// filled block is dirty if `dirty` (a store missed).
#[inline]
pub fn miss<F: MissFace>(
    face: &mut F,
    now_ns: Ns,
    block: u64,
    dirty: bool,
    early_write_back: bool,
) -> Result<Miss, F::Error> {
    let (way, old) = face.cache().victim(block);
    let mut victim_out_ns = now_ns;
    let evicted = old.block();
    if let Some(victim) = evicted {
        if old.dirty {
            face.cache().way_mut(way).dirty = false;
            victim_out_ns = face.write_back(now_ns, victim)?;
        }
        face.evict(victim)?;
    }
    let fetched = face.fetch(now_ns, block)?;
    let ready_ns = face.fill(now_ns, fetched.done_ns, victim_out_ns, block)?;
    face.cache().install(way, block, ready_ns, dirty);
    let mut written_early = false;
    if early_write_back {
        if let Some(next) = face.cache().next_victim(block, way) {
            let candidate = *face.cache().way(next);
            if candidate.dirty {
                face.cache().way_mut(next).dirty = false;
                let b = candidate.block().expect("a victim holds a block");
                face.write_back(now_ns, b)?;
                written_early = true;
            }
        }
    }
    Ok(Miss {
        way,
        critical_ns: fetched.critical_ns,
        evicted,
        written_early,
    })
}
