//! The NVMM region of a process (SPEC §7, issue 13): a mapping far larger
//! than its DRAM budget whose resident pages are the DRAM cache and whose
//! backing file is the journaled flash.
//!
//! Miss path (SPEC §7 "Miss path"), the simulator's own
//! (`moneta_model::nvmm::miss_path`, issue 24: the controller of
//! `moneta nvmm sim` runs the same function; this region is its other
//! face, [`Filling`]): a missing-page fault reaches the handler thread; if
//! the block's set is full, its least recently used block (by fill and
//! first store: user space sees no hits) is written to the log if dirty
//! (write-protect, program a new flash page) and dropped (MADV_DONTNEED);
//! the faulting block is translated through the page table, `pread` from
//! the file into a staging buffer (O_DIRECT where allowed), and installed
//! whole with UFFDIO_COPY once the flash timing's completion time has come
//! on the region's clock — write-protected, so the first store raises a
//! write-protect fault that marks the block dirty. The victim's program
//! and the read are booked on the flash timing at the fault's time, in the
//! simulator's order. Optionally the next N blocks are prefetched (read
//! into buffers, installed through the same miss path when their reads
//! complete).
//! sync writes every dirty block as a new page version and commits; rollback
//! drops the cache and truncates every chain to the token's time.
//!
//! One lock guards the state; the handler, the GC thread and API calls take
//! it in turn. No code holding it touches the region's memory from user
//! space (the kernel reads resident blocks for pwrite), so it cannot wait on
//! its own fault.
//!
//! The region never lies about durability (issue 39):
//! - A write-back the file system refuses (ENOSPC, `chattr +i`), a page
//!   that reads back with the wrong checksum, or a backing file that lost
//!   pages (punched, truncated: [`Log::check_intact`] before every commit)
//!   *fails* the region: every later call returns that first error, naming
//!   the cause, and no token is issued again. A failed region goes on
//!   serving faults without writing anything back (blocks stay resident,
//!   past the DRAM budget), so a program that hit a refused write-back is
//!   not killed for it. A block that cannot be read back is the one thing
//!   a faulting load cannot be given: its thread gets SIGBUS, as from a
//!   memory error, and the cause is on stderr.
//! - A fork child does not inherit the region: it is mapped MADV_DONTFORK
//!   (the child's accesses fault, SIGSEGV, instead of reading zeros) and
//!   every call from the child fails with `ErrorKind::Forked`; the parent's
//!   log and threads are left alone.

use crate::cache::Cache;
use crate::entry::{status, Entry, FLASH_PAGES_PER_BLOCK, POSITIONS, SEGMENTS_PER_PAGE};
use crate::error::{ErrorKind, NvmmError, Result};
use crate::gc::{self, GcOutcome};
use crate::log::{AlignedBuf, Log, Target, FLASH_PAGE_BYTES, PAGE_BYTES};
use crate::table::{self, Table};
use crate::timing::{FixedLatency, FlashTiming, SharedClock, WallClock};
use crate::tokens::Tokens;
use crate::uffd::{Fault, Userfault};
use moneta_model::nvmm::cache::BlockCache;
use moneta_model::nvmm::miss_path::{self, Fetched, MissFace};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

const BLOCK: u64 = FLASH_PAGE_BYTES as u64;
const PAGE: u64 = PAGE_BYTES as u64;
const SEGS: u64 = SEGMENTS_PER_PAGE as u64;
/// Prefetch depth bound (the report's scheme fetches the next 16 pages).
pub const MAX_PREFETCH_BLOCKS: usize = 64;

/// Page permissions for [`Nvmm::set_perms`] (SPEC §7 setperms).
pub mod perms {
    pub const READ: u8 = super::status::READ;
    pub const WRITE: u8 = super::status::WRITE;
    /// Collected when the application ends (at close or the next open).
    pub const TEMPORARY: u8 = super::status::TEMPORARY;
}

/// How a region is opened.
pub struct Options {
    /// DRAM cache size: at most this many bytes of the region are resident.
    pub dram_bytes: u64,
    /// Cache associativity (0: fully associative).
    pub ways: usize,
    /// Blocks after a missing one to read ahead (SPEC §7: 16).
    pub prefetch_blocks: usize,
    /// Flash completion times: [`FixedLatency`] 0 by default (the library's
    /// own cost); `ModelTiming::preset("nvmm-mlc")` for the model's flash.
    pub timing: Box<dyn FlashTiming>,
    /// Open the backing file with O_DIRECT when its file system allows, so
    /// the page cache does not double the DRAM budget (never on tmpfs,
    /// whose file pages are already memory and whose O_DIRECT is slow).
    pub direct_io: bool,
    /// After a fault, keep polling for the next this long before sleeping.
    pub handler_spin_ns: u64,
    /// Syncs kept restorable whatever garbage collection needs: 1 ..=
    /// [`crate::tokens::MAX_RETAIN`] (2), default 2 (the last sync and the
    /// one before it). Older tokens stay restorable while there is room.
    pub retain_syncs: u64,
    /// The clock of flash completion times (None: the wall clock). A
    /// [`moneta_model::kernel::VirtualClock`] makes waits jump instead of sleep
    /// (the twin test runs both faces on one).
    pub clock: Option<SharedClock>,
    /// Run the background collector thread (GC still runs when the version
    /// area is full).
    pub background_gc: bool,
}

impl Options {
    pub fn new(dram_bytes: u64) -> Options {
        Options {
            dram_bytes,
            ways: 16,
            prefetch_blocks: 0,
            timing: Box::new(FixedLatency::default()),
            direct_io: true,
            handler_spin_ns: std::env::var("NVMM_SPIN_US")
                .ok()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or(20)
                * 1000,
            retain_syncs: crate::tokens::DEFAULT_RETAIN,
            clock: None,
            background_gc: true,
        }
    }
}

/// Counters since open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub misses: u64,
    /// Handler time of misses, fault read to UFFDIO_COPY done.
    pub miss_handler_ns: u64,
    /// Flash time the timing model charged to those misses.
    pub miss_modeled_ns: u64,
    pub write_protect_faults: u64,
    pub write_backs: u64,
    pub evictions: u64,
    pub prefetch_issued: u64,
    pub prefetch_used: u64,
    pub syncs: u64,
    pub resident_blocks: u64,
    pub capacity_blocks: u64,
    pub versions_used: u64,
    pub version_capacity: u64,
    pub log_blocks: u64,
    pub gc: GcOutcome,
    pub direct_io: bool,
}

#[derive(Default)]
struct Counters {
    misses: AtomicU64,
    miss_handler_ns: AtomicU64,
    miss_modeled_ns: AtomicU64,
    write_protect_faults: AtomicU64,
    write_backs: AtomicU64,
    evictions: AtomicU64,
    prefetch_issued: AtomicU64,
    prefetch_used: AtomicU64,
    syncs: AtomicU64,
}

fn bump(c: &AtomicU64, by: u64) {
    c.fetch_add(by, Ordering::Relaxed);
}

struct Prefetched {
    block: u64,
    done_ns: u64,
    buf: AlignedBuf,
}

struct State {
    table: Table,
    log: Log,
    tokens: Tokens,
    cache: Cache,
    timing: Box<dyn FlashTiming>,
    buf: AlignedBuf,
    /// Garbage collection's copy buffer (never `buf`, which may hold a
    /// block being installed).
    gc_buf: AlignedBuf,
    zero: AlignedBuf,
    prefetch_blocks: usize,
    prefetching: Vec<Prefetched>,
    spare: Vec<AlignedBuf>,
    program_busy_until_ns: u64,
    alloc_cursor: u64,
    gc: GcOutcome,
    failed: Option<NvmmError>,
}

struct Shared {
    /// The kernel side of the real face; None in a [`Replay`] (the model
    /// face: no memory, the same decisions).
    uffd: Option<Userfault>,
    base: u64,
    len: u64,
    state: Mutex<State>,
    stop: AtomicBool,
    wake: OwnedFd,
    /// The clock flash completion times are on: the wall clock, or a
    /// [`moneta_model::kernel::VirtualClock`].
    clock: SharedClock,
    /// The handler's own polling schedule is always on the wall clock.
    wall: WallClock,
    counters: Counters,
    spin_ns: u64,
    prefetch_enabled: bool,
    /// The process that opened the region (a fork child is another).
    owner_pid: u32,
}

/// A mapped NVMM region. Dropping it without [`Nvmm::close`] is a crash:
/// the file keeps the last sync.
pub struct Nvmm {
    face: Face,
    threads: Vec<JoinHandle<()>>,
}

fn madvise_dontneed(addr: u64, len: u64) -> Result<()> {
    // SAFETY: the range lies inside our own anonymous mapping; dropping its
    // pages is what the cache means by eviction.
    if unsafe { libc::madvise(addr as *mut libc::c_void, len as usize, libc::MADV_DONTNEED) } != 0 {
        return Err(NvmmError::last_os(format!(
            "madvise(DONTNEED) at {addr:#x}"
        )));
    }
    Ok(())
}

fn protection(st: u8) -> libc::c_int {
    if st & status::WRITE != 0 {
        libc::PROT_READ | libc::PROT_WRITE
    } else if st & status::READ != 0 {
        libc::PROT_READ
    } else {
        libc::PROT_NONE
    }
}

impl Shared {
    /// An error unless this is the process that opened the region.
    fn check_process(&self) -> Result<()> {
        let pid = std::process::id();
        if pid != self.owner_pid {
            return Err(NvmmError::new(
                ErrorKind::Forked,
                format!(
                    "the region was opened by process {}; a fork child (process {pid}) does not \
                     inherit it (its pages are not mapped here and its log is the parent's)",
                    self.owner_pid
                ),
            ));
        }
        Ok(())
    }

    fn forked(&self) -> bool {
        std::process::id() != self.owner_pid
    }

    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.check_process()?;
        let st = self.state.lock().map_err(|_| {
            NvmmError::new(ErrorKind::Io, "a thread panicked holding the region lock")
        })?;
        if let Some(e) = &st.failed {
            return Err(e.clone());
        }
        Ok(st)
    }

    fn block_addr(&self, block: u64) -> u64 {
        self.base + block * BLOCK
    }

    /// Write-protect (or unprotect, waking the faulting thread) a block.
    fn protect_block(&self, block: u64, on: bool) -> Result<()> {
        match &self.uffd {
            Some(u) => u.write_protect(self.block_addr(block), BLOCK, on),
            None => Ok(()),
        }
    }

    fn wake_block(&self, block: u64) -> Result<()> {
        match &self.uffd {
            Some(u) => u.wake(self.block_addr(block), BLOCK),
            None => Ok(()),
        }
    }

    /// Install `BLOCK` bytes at `src` as `block`, write-protected if asked.
    ///
    /// # Safety
    /// `src` must be a live buffer of at least `BLOCK` bytes.
    unsafe fn fill_block(&self, block: u64, src: *const u8, write_protect: bool) -> Result<()> {
        match &self.uffd {
            // SAFETY: the caller's promise; the block lies in the registered range.
            Some(u) => {
                unsafe { u.copy(self.block_addr(block), src, BLOCK, write_protect) }.map(|_| ())
            }
            None => Ok(()),
        }
    }

    fn discard_block(&self, block: u64) -> Result<()> {
        match &self.uffd {
            Some(_) => madvise_dontneed(self.block_addr(block), BLOCK),
            None => Ok(()),
        }
    }

    fn mprotect_page(&self, vpn: u64, st: u8) -> Result<()> {
        if self.uffd.is_none() {
            return Ok(());
        }
        // SAFETY: the page lies inside our own mapping.
        let r = unsafe {
            libc::mprotect(
                (self.base + vpn * PAGE) as *mut libc::c_void,
                PAGE as usize,
                protection(st),
            )
        };
        if r != 0 {
            return Err(NvmmError::last_os(format!("mprotect page {vpn}")));
        }
        Ok(())
    }

    /// Every page's protection from its head entry (after open/rollback).
    fn apply_all_perms(&self, st: &State) -> Result<()> {
        for vpn in 0..st.table.pages() {
            let head = st.table.head(vpn);
            let want = if head.is_present() {
                head.status
            } else {
                status::READ | status::WRITE
            };
            if protection(want) != libc::PROT_READ | libc::PROT_WRITE {
                self.mprotect_page(vpn, want)?;
            }
        }
        Ok(())
    }
}

impl State {
    /// A free version entry, collecting garbage first if there is none.
    fn ensure_version_slot(&mut self) -> Result<()> {
        if self.table.has_free_version() {
            return Ok(());
        }
        // A short pause: free an eighth of the area, a few chains at a time
        // (the background collector does the rest between faults).
        let target = self.table.version_capacity() - self.table.version_capacity() / 8;
        while !self.table.has_free_version() {
            let before = self.table.versions_used();
            gc::collect(
                &mut self.table,
                &mut self.log,
                &mut self.tokens,
                target,
                16,
                &mut self.gc_buf,
                &mut self.gc,
            )?;
            if self.table.versions_used() == before {
                break;
            }
        }
        if !self.table.has_free_version() {
            return Err(NvmmError::new(
                ErrorKind::Exhausted,
                "the version area is full with only the retained syncs' versions left (a bug: \
                 retain_syncs ≤ 2 always fits)",
            ));
        }
        Ok(())
    }

    /// The head of `vpn` to change for a metadata update at the pending
    /// time: the head itself if written since the last sync, else a new one.
    fn metadata_version(&mut self, vpn: u64) -> Result<Entry> {
        let head = self.table.head(vpn);
        if head.is_present() && head.time as u64 == self.tokens.pending() {
            return Ok(head);
        }
        self.ensure_version_slot()?;
        Ok(self.table.push_version(vpn, self.tokens.pending())?)
    }

    /// The flash page segment `seg` of `vpn` is programmed to at the pending
    /// time. Flash pages are programmed once: if the head is uncommitted, the
    /// segment goes to its first position in the head's block or, written
    /// again, to the next position; otherwise (or with all four positions
    /// used) to a new version with a new block.
    fn prepare_segment(&mut self, vpn: u64, seg: u64) -> Result<u64> {
        let pending = self.tokens.pending();
        let head = self.table.head(vpn);
        let s = seg as usize;
        let reuse = head.is_present() && head.time as u64 == pending;
        let position = match (reuse, head.has(status::MAPPED), head.segment_position(s)) {
            (true, false, _) | (true, true, None) => Some(0),
            (true, true, Some(k)) if k + 1 < POSITIONS => Some(k + 1),
            _ => None,
        };
        let (mut e, k) = match position {
            Some(k) => (head, k),
            None => {
                self.ensure_version_slot()?;
                (self.table.push_version(vpn, pending)?, 0)
            }
        };
        if !e.has(status::MAPPED) {
            e.flash_page = self.log.alloc_block()? * FLASH_PAGES_PER_BLOCK;
            e.status |= status::MAPPED;
            e.valid = 0;
        }
        for old in 0..POSITIONS {
            e.valid &= !(1 << (s + SEGMENTS_PER_PAGE * old));
        }
        e.valid |= 1 << (s + SEGMENTS_PER_PAGE * k);
        e.status |= status::ALLOCATED;
        self.table.set(vpn as u32, e);
        Ok(e.flash_page + (s + SEGMENTS_PER_PAGE * k) as u64)
    }

    fn release_block(&mut self, e: &Entry) {
        if e.has(status::MAPPED) {
            self.log.free_block(
                e.flash_page / FLASH_PAGES_PER_BLOCK,
                e.time as u64 <= self.tokens.last,
            );
        }
    }

    /// Write the dirty `block` back (sync); it is clean once written.
    fn write_back(&mut self, sh: &Shared, block: u64) -> Result<()> {
        self.write_segment_back(sh, sh.clock.now(), block)?;
        self.cache.set_dirty(block, false);
        Ok(())
    }

    /// Program `block`'s bytes as its segment's next flash page, booked on
    /// the flash timing at `now_ns` (the caller marks it clean).
    fn write_segment_back(&mut self, sh: &Shared, now_ns: u64, block: u64) -> Result<()> {
        sh.protect_block(block, true)?;
        let fp = self.prepare_segment(block / SEGS, block % SEGS)?;
        if sh.uffd.is_some() {
            // SAFETY: the block is resident (mapped by UFFDIO_COPY) and now
            // write-protected, so nothing writes it while the kernel reads it.
            let data = unsafe {
                std::slice::from_raw_parts(sh.block_addr(block) as *const u8, FLASH_PAGE_BYTES)
            };
            self.log.write_segment(fp, data)?;
        } else {
            // The model face has no bytes: its log gets zeros.
            self.log
                .write_segment(fp, &self.zero.as_slice()[..FLASH_PAGE_BYTES])?;
        }
        let done = self.timing.program_page(now_ns, fp);
        self.program_busy_until_ns = self.program_busy_until_ns.max(done);
        bump(&sh.counters.write_backs, 1);
        Ok(())
    }

    /// Read `block`'s current contents for a fill: into the spare buffer
    /// when one is given (a prefetch, installed later), else into `buf`, or
    /// nowhere for a never-written block (the zero block is the source).
    /// Returns when the flash read completes on the timing's clock, the
    /// modeled time, and where the bytes are.
    ///
    /// Tried and dropped: UFFDIO_COPY straight from a read-only mapping of
    /// the log (no pread). A block is read from a flash page this mapping
    /// has not touched yet (every write-back goes to a new page), so the
    /// copy takes the kernel's slow path and faults the source in: measured
    /// here, pread + copy 11–12 µs, in place 11–12 µs; populating the
    /// mapping up front cost more than it saved.
    fn read_block(
        &mut self,
        now: u64,
        block: u64,
        into_spare: Option<&mut AlignedBuf>,
    ) -> Result<(u64, u64, *const u8)> {
        let loc = self.table.locate(block / SEGS, (block % SEGS) as u32, None);
        let Some((fp, _hops)) = loc else {
            return Ok(match into_spare {
                Some(b) => {
                    b.as_mut_slice()[..FLASH_PAGE_BYTES].fill(0);
                    (now, 0, b.as_ptr())
                }
                None => (now, 0, self.zero.as_ptr()),
            });
        };
        let src = match into_spare {
            Some(b) => {
                self.log
                    .read_segment(fp, &mut b.as_mut_slice()[..FLASH_PAGE_BYTES])?;
                b.as_ptr()
            }
            None => {
                self.log
                    .read_segment(fp, &mut self.buf.as_mut_slice()[..FLASH_PAGE_BYTES])?;
                self.buf.as_ptr()
            }
        };
        let done = self.timing.read_page(now, fp);
        Ok((done, done.saturating_sub(now), src))
    }

    /// Fill `block` through the miss path the simulator's controller runs
    /// too ([`miss_path::miss`]: the LRU victim written back if dirty and
    /// dropped, then the block read and installed), from the flash or from
    /// a prefetch buffer; writable and dirty if the fault was a write.
    /// Returns the flash time the read was charged.
    fn miss(
        &mut self,
        sh: &Shared,
        now_ns: u64,
        block: u64,
        source: Source,
        write: bool,
    ) -> Result<u64> {
        let mut face = Filling {
            st: self,
            sh,
            source,
            write,
            modeled_ns: 0,
        };
        miss_path::miss(&mut face, now_ns, block, write, false)?;
        let modeled_ns = face.modeled_ns;
        if write {
            self.note_written(block)?;
        }
        Ok(modeled_ns)
    }

    /// A page written to becomes allocated (SPEC §7: writing a
    /// never-allocated page creates it).
    fn note_written(&mut self, block: u64) -> Result<()> {
        let vpn = block / SEGS;
        if !self.table.head(vpn).has(status::ALLOCATED) {
            let mut e = self.metadata_version(vpn)?;
            e.status |= status::ALLOCATED;
            self.table.set(vpn as u32, e);
        }
        Ok(())
    }

    fn issue_prefetch(&mut self, sh: &Shared, block: u64) -> Result<()> {
        let blocks = sh.len / BLOCK;
        for next in block + 1..=block + self.prefetch_blocks as u64 {
            if next >= blocks
                || self.cache.is_resident(next)
                || self.prefetching.iter().any(|p| p.block == next)
            {
                continue;
            }
            let Some(mut buf) = self.spare.pop() else {
                return Ok(());
            };
            let (done_ns, _, _) = self.read_block(sh.clock.now(), next, Some(&mut buf))?;
            self.prefetching.push(Prefetched {
                block: next,
                done_ns,
                buf,
            });
            bump(&sh.counters.prefetch_issued, 1);
        }
        Ok(())
    }

    /// Install the prefetched blocks whose reads have completed.
    fn install_due_prefetches(&mut self, sh: &Shared) -> Result<()> {
        let now = sh.clock.now();
        let mut i = 0;
        while i < self.prefetching.len() {
            if self.prefetching[i].done_ns <= now {
                let p = self.prefetching.swap_remove(i);
                if !self.cache.is_resident(p.block) {
                    let source = Source::Buffer(p.buf.as_ptr(), p.done_ns);
                    self.miss(sh, now, p.block, source, false)?;
                }
                self.spare.push(p.buf);
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    fn next_prefetch_due(&self) -> Option<u64> {
        self.prefetching.iter().map(|p| p.done_ns).min()
    }

    fn handle_fault(&mut self, sh: &Shared, f: Fault) -> Result<()> {
        let block = (f.address - sh.base) / BLOCK;
        if self.cache.is_resident(block) {
            if f.write_protect || f.write {
                bump(&sh.counters.write_protect_faults, 1);
                if !self.cache.is_dirty(block) {
                    self.cache.set_dirty(block, true);
                    self.cache.touch(block);
                    self.note_written(block)?;
                }
                return sh.protect_block(block, false);
            }
            return sh.wake_block(block);
        }
        let t0 = sh.clock.now();
        if let Some(i) = self.prefetching.iter().position(|p| p.block == block) {
            let p = self.prefetching.swap_remove(i);
            let source = Source::Buffer(p.buf.as_ptr(), p.done_ns);
            self.miss(sh, t0, block, source, f.write)?;
            self.spare.push(p.buf);
            bump(&sh.counters.prefetch_used, 1);
        } else {
            let modeled = self.miss(sh, t0, block, Source::Flash, f.write)?;
            bump(&sh.counters.miss_modeled_ns, modeled);
        }
        bump(&sh.counters.misses, 1);
        bump(&sh.counters.miss_handler_ns, sh.clock.now() - t0);
        Ok(())
    }

    fn drop_block(&mut self, sh: &Shared, block: u64) -> Result<()> {
        if self.cache.is_resident(block) {
            sh.discard_block(block)?;
            self.cache.remove(block);
        }
        if let Some(i) = self.prefetching.iter().position(|p| p.block == block) {
            let p = self.prefetching.swap_remove(i);
            self.spare.push(p.buf);
        }
        Ok(())
    }

    /// A failure of the backing file (an IO error, a page or record that
    /// does not read back) fails the region: the table may be ahead of the
    /// log, so nothing is committed again. Argument and token errors do not.
    fn fail_on_file_error<T>(&mut self, r: Result<T>) -> Result<T> {
        if let Err(e) = &r {
            if matches!(e.kind, ErrorKind::Io | ErrorKind::BadFile) && self.failed.is_none() {
                self.failed = Some(e.clone());
            }
        }
        r
    }

    /// A fault on a failed region: install the block (checked against its
    /// checksum) without evicting or writing anything back, or, for a
    /// resident block, let the access go on.
    fn serve_failed(&mut self, sh: &Shared, f: Fault) -> Result<()> {
        let block = (f.address - sh.base) / BLOCK;
        if self.cache.is_resident(block) {
            return if f.write_protect || f.write {
                sh.protect_block(block, false)
            } else {
                sh.wake_block(block)
            };
        }
        let (_, _, src) = self.read_block(sh.clock.now(), block, None)?;
        // SAFETY: src is `buf` or the zero block, a live buffer of a block.
        unsafe { sh.fill_block(block, src, false) }
    }

    /// Write every dirty block and commit: the sync of SPEC §7.
    fn sync(&mut self, sh: &Shared) -> Result<u64> {
        for block in self.cache.dirty_blocks() {
            self.write_back(sh, block)?;
        }
        sh.clock.advance_to(self.program_busy_until_ns);
        self.commit()
    }

    fn commit(&mut self) -> Result<u64> {
        // Never a token for a file that lost what the log needs.
        if let Err(e) = self.log.check_intact() {
            self.failed = Some(e.clone());
            return Err(e);
        }
        let token = self.tokens.next_token()?;
        let changes = self.table.take_changes();
        let full = self
            .log
            .wants_full(changes.len(), self.table.present_count());
        let entries = if full { self.table.present() } else { changes };
        let mut tokens = self.tokens.clone();
        tokens.last = token;
        match self.log.commit(&tokens, entries, full) {
            Ok(()) => {
                self.tokens = tokens;
                Ok(token)
            }
            Err(e) => {
                // The in-memory table is ahead of a log whose commit failed
                // half way: refuse further work rather than guess.
                self.failed = Some(e.clone());
                Err(e)
            }
        }
    }

    fn delete(&mut self, sh: &Shared, vpn: u64) -> Result<()> {
        for block in vpn * SEGS..(vpn + 1) * SEGS {
            self.drop_block(sh, block)?;
        }
        let mut e = self.metadata_version(vpn)?;
        self.release_block(&e);
        e.status = status::PRESENT | status::FRESH | status::READ | status::WRITE;
        e.valid = 0;
        e.flash_page = 0;
        self.table.set(vpn as u32, e);
        sh.mprotect_page(vpn, e.status)
    }

    fn collect_temporary(&mut self, sh: &Shared) -> Result<()> {
        for vpn in 0..self.table.pages() {
            let head = self.table.head(vpn);
            if head.has(status::ALLOCATED) && head.has(status::TEMPORARY) {
                self.delete(sh, vpn)?;
            }
        }
        Ok(())
    }
}

/// Where a filled block's bytes come from.
#[derive(Clone, Copy)]
enum Source {
    /// Read from the log now (a demand miss; its prefetches are issued).
    Flash,
    /// A prefetch buffer whose read completes at the given time.
    Buffer(*const u8, u64),
}

/// libnvmm's face of the miss path (`moneta_model::nvmm::miss_path`): the
/// region's memory (UFFDIO_COPY, MADV_DONTNEED; nothing in the model face
/// [`Replay`]), the log file as the flash, and the region's clock, on
/// which a fill waits until the flash timing's completion.
struct Filling<'a> {
    st: &'a mut State,
    sh: &'a Shared,
    source: Source,
    write: bool,
    /// Flash time the timing charged the read.
    modeled_ns: u64,
}

impl MissFace for Filling<'_> {
    type Error = NvmmError;

    fn cache(&mut self) -> &mut BlockCache {
        self.st.cache.blocks_mut()
    }

    fn write_back(&mut self, now_ns: u64, block: u64) -> Result<u64> {
        self.st.write_segment_back(self.sh, now_ns, block)?;
        Ok(self.sh.clock.now())
    }

    fn evict(&mut self, block: u64) -> Result<()> {
        self.sh.discard_block(block)?;
        bump(&self.sh.counters.evictions, 1);
        Ok(())
    }

    fn fetch(&mut self, now_ns: u64, block: u64) -> Result<Fetched> {
        let done_ns = match self.source {
            Source::Flash => {
                let (done, modeled, src) = self.st.read_block(now_ns, block, None)?;
                self.source = Source::Buffer(src, done);
                self.modeled_ns = modeled;
                self.st.issue_prefetch(self.sh, block)?;
                done
            }
            Source::Buffer(_, done) => done,
        };
        Ok(Fetched {
            critical_ns: done_ns,
            done_ns,
        })
    }

    fn fill(&mut self, _now_ns: u64, data_ns: u64, victim_out_ns: u64, block: u64) -> Result<u64> {
        let Source::Buffer(src, _) = self.source else {
            unreachable!("fetch names the bytes before a fill");
        };
        self.sh.clock.advance_to(data_ns.max(victim_out_ns));
        // SAFETY: src is `buf`, the zero block or a prefetch buffer, each a
        // live buffer of a whole block; the block lies in the registered range.
        unsafe { self.sh.fill_block(block, src, !self.write)? };
        Ok(self.sh.clock.now())
    }
}

/// The pages of a region of `size` bytes (rounded up to 64 KB pages),
/// within libnvmm's limit.
fn pages_for(size: u64) -> Result<u64> {
    let pages = size.div_ceil(PAGE);
    if pages > table::MAX_PAGES {
        return Err(NvmmError::new(
            ErrorKind::InvalidArgument,
            format!(
                "a region of {size} bytes exceeds the largest libnvmm maps, {} bytes \
                 (16 TiB: 2^28 pages of 64 KB, the page table's 30-bit index; SPEC §7)",
                table::MAX_PAGES * PAGE
            ),
        ));
    }
    Ok(pages)
}

/// The machine's physical memory, if the kernel says.
fn physical_memory_bytes() -> Option<u64> {
    // SAFETY: sysinfo fills a zeroed struct that lives here.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out-pointer.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return None;
    }
    (si.totalram as u64).checked_mul(u64::from(si.mem_unit.max(1)))
}

/// The page table (16-byte entries, four per 64 KB page, SPEC §7) and the
/// cache's per-block state live in memory, whatever the DRAM budget: a
/// region whose bookkeeping would take more than half the machine's memory
/// is refused with the numbers, before anything is allocated or written.
fn check_memory(pages: u64, dram_bytes: u64) -> Result<()> {
    let need = table::memory_bytes(pages)
        .saturating_add(Cache::memory_bytes((pages * SEGS).min(dram_bytes / BLOCK)));
    if let Some(ram) = physical_memory_bytes() {
        if need > ram / 2 {
            return Err(NvmmError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "a region of {} bytes needs {need} bytes of page table and cache \
                     bookkeeping in memory, more than half of this machine's {ram} bytes; \
                     map a smaller region",
                    pages * PAGE
                ),
            ));
        }
    }
    Ok(())
}

impl Nvmm {
    /// Map a region of `size` bytes (rounded up to 64 KB pages; 0: the
    /// size the file was made with) backed by the log at `path`, with
    /// `dram_bytes` of DRAM cache.
    pub fn open(path: impl AsRef<Path>, size: u64, dram_bytes: u64) -> Result<Nvmm> {
        Self::open_with(path, size, Options::new(dram_bytes))
    }

    /// Open with [`Options`]. Everything is checked before the backing
    /// file is written (issue 24): the path must be a regular file or new
    /// (see [`crate::log::Target`]), the size within 64 KB ..= 16 TiB, the
    /// page table and cache bookkeeping must fit in memory, allocations
    /// that fail are errors; a failed open leaves the path as it was.
    pub fn open_with(path: impl AsRef<Path>, size: u64, options: Options) -> Result<Nvmm> {
        let background_gc = options.background_gc;
        let shared = prepare(path.as_ref(), size, options, true)?;
        let mut nvmm = Nvmm {
            face: Face {
                shared: shared.clone(),
            },
            threads: Vec::new(),
        };
        let sh = shared.clone();
        nvmm.threads.push(
            std::thread::Builder::new()
                .name("nvmm-fault".into())
                .spawn(move || fault_handler(&sh))
                .map_err(|e| NvmmError::os("spawn the fault handler", e))?,
        );
        if background_gc {
            let sh = shared.clone();
            nvmm.threads.push(
                std::thread::Builder::new()
                    .name("nvmm-gc".into())
                    .spawn(move || collector(&sh))
                    .map_err(|e| NvmmError::os("spawn the collector", e))?,
            );
        }
        Ok(nvmm)
    }
}

/// Everything of an open but its threads: arguments and the path checked,
/// bookkeeping allocated, then (the real face) the region mapped and
/// registered, and only then the log opened or made. `real` false is the
/// model face ([`Replay`]): no userfaultfd, no mapping.
fn prepare(path: &Path, size: u64, options: Options, real: bool) -> Result<Arc<Shared>> {
    {
        let bad = |what: String| NvmmError::new(ErrorKind::InvalidArgument, what);
        if options.dram_bytes < BLOCK {
            return Err(bad(format!(
                "a DRAM budget of {} bytes holds no 8 KB block",
                options.dram_bytes
            )));
        }
        if options.prefetch_blocks > MAX_PREFETCH_BLOCKS {
            return Err(bad(format!(
                "prefetch depth {} exceeds {MAX_PREFETCH_BLOCKS}",
                options.prefetch_blocks
            )));
        }
        if !(1..=crate::tokens::MAX_RETAIN).contains(&options.retain_syncs) {
            return Err(bad(format!(
                "retain_syncs {} is outside 1 ..= {}: the page table keeps three previous \
                 versions per page, which always hold that many restorable syncs and a \
                 write-back's new version",
                options.retain_syncs,
                crate::tokens::MAX_RETAIN
            )));
        }
        let requested = if size == 0 {
            None
        } else {
            Some(pages_for(size)?)
        };
        let uffd = if real { Some(Userfault::open()?) } else { None };
        let target = Target::inspect(path)?;
        let pages = match (&target, requested) {
            (Target::Log(_, file_pages), None) => *file_pages,
            (Target::Log(_, file_pages), Some(p)) if p != *file_pages => {
                return Err(NvmmError::new(
                    ErrorKind::BadFile,
                    format!(
                        "{} holds a region of {} bytes, not {}",
                        path.display(),
                        file_pages * PAGE,
                        p * PAGE
                    ),
                ))
            }
            (_, Some(p)) => p,
            (_, None) => {
                return Err(bad(format!(
                    "{} is new: its region needs a size",
                    path.display()
                )))
            }
        };
        check_memory(pages, options.dram_bytes)?;
        let len = pages * PAGE;
        let mut table = table::new(pages)?;
        let cache = Cache::new(len / BLOCK, options.dram_bytes / BLOCK, options.ways)?;
        let buffers = || AlignedBuf::new(FLASH_PAGE_BYTES);
        let (buf, gc_buf, zero) = (buffers()?, buffers()?, buffers()?);
        let spare = (0..options.prefetch_blocks)
            .map(|_| buffers())
            .collect::<Result<Vec<_>>>()?;
        let base = match &uffd {
            Some(uffd) => {
                // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
                let base = unsafe {
                    libc::mmap(
                        std::ptr::null_mut(),
                        len as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                        -1,
                        0,
                    )
                };
                if base == libc::MAP_FAILED {
                    return Err(NvmmError::last_os(format!("mmap of {len} bytes")));
                }
                // SAFETY: our mapping; huge pages would make 2 MB the fill unit.
                unsafe { libc::madvise(base, len as usize, libc::MADV_NOHUGEPAGE) };
                // A fork child gets no copy: without the handler it would
                // read zeros for every block not resident.
                // SAFETY: our mapping.
                if unsafe { libc::madvise(base, len as usize, libc::MADV_DONTFORK) } != 0 {
                    let e = NvmmError::last_os("madvise(DONTFORK) of the region");
                    // SAFETY: unmapping the mapping made above, which nothing uses yet.
                    unsafe { libc::munmap(base, len as usize) };
                    return Err(e);
                }
                if let Err(e) = uffd.register(base as u64, len) {
                    // SAFETY: unmapping the mapping made above, which nothing uses yet.
                    unsafe { libc::munmap(base, len as usize) };
                    return Err(e);
                }
                base
            }
            None => std::ptr::null_mut(),
        };
        let unmap = |e: NvmmError| {
            if !base.is_null() {
                // SAFETY: unmapping the mapping made above, which nothing uses yet.
                unsafe { libc::munmap(base, len as usize) };
            }
            e
        };
        // Only now, with everything else in hand, is the file written.
        let (log, recovered) = Log::open(target, path, pages, options.direct_io).map_err(unmap)?;
        table.load(recovered.entries).map_err(|e| unmap(e.into()))?;
        // SAFETY: eventfd returns a new descriptor or -1.
        let wake = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wake < 0 {
            return Err(unmap(NvmmError::last_os("eventfd")));
        }
        // SAFETY: a new descriptor nothing else owns.
        let wake = unsafe { OwnedFd::from_raw_fd(wake) };
        let mut tokens = recovered.tokens;
        tokens.retain = options.retain_syncs;
        let state = State {
            table,
            log,
            tokens,
            cache,
            timing: options.timing,
            buf,
            gc_buf,
            zero,
            prefetch_blocks: options.prefetch_blocks,
            prefetching: Vec::new(),
            spare,
            program_busy_until_ns: 0,
            alloc_cursor: 0,
            gc: GcOutcome::default(),
            failed: None,
        };
        let shared = Arc::new(Shared {
            uffd,
            base: base as u64,
            len,
            state: Mutex::new(state),
            stop: AtomicBool::new(false),
            wake,
            clock: options
                .clock
                .unwrap_or_else(|| Arc::new(WallClock::new()) as SharedClock),
            wall: WallClock::new(),
            counters: Counters::default(),
            spin_ns: options.handler_spin_ns,
            prefetch_enabled: options.prefetch_blocks > 0,
            owner_pid: std::process::id(),
        });
        {
            let mut st = shared.lock()?;
            shared.apply_all_perms(&st)?;
            // The application that made these pages temporary has ended.
            st.collect_temporary(&shared)?;
        }
        Ok(shared)
    }
}

impl Nvmm {
    /// The first byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.face.shared.base as *mut u8
    }

    pub fn len(&self) -> u64 {
        self.face.shared.len
    }

    pub fn is_empty(&self) -> bool {
        self.face.shared.len == 0
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        self.face.shared.check_process()?;
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.face.shared.len)
        {
            return Err(NvmmError::new(
                ErrorKind::InvalidArgument,
                format!(
                    "[{offset}, +{len}) is outside the {}-byte region",
                    self.face.shared.len
                ),
            ));
        }
        Ok(())
    }

    /// Copy bytes out of the region (faulting blocks in as needed).
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.check_range(offset, out.len() as u64)?;
        // SAFETY: in range; the handler thread serves the faults this
        // causes, and this thread holds no lock.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.as_ptr().add(offset as usize),
                out.as_mut_ptr(),
                out.len(),
            )
        };
        Ok(())
    }

    /// Copy bytes into the region.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_range(offset, data.len() as u64)?;
        // SAFETY: as in read; the pages must be writable (set_perms).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.as_ptr().add(offset as usize),
                data.len(),
            )
        };
        Ok(())
    }

    /// Flush every dirty block to the log and commit; the token names the
    /// state for [`Nvmm::rollback`] (SPEC §7 sync).
    pub fn sync(&self) -> Result<u64> {
        let mut st = self.face.shared.lock()?;
        let token = st.sync(&self.face.shared);
        let token = st.fail_on_file_error(token)?;
        bump(&self.face.shared.counters.syncs, 1);
        Ok(token)
    }

    /// Restore the region as it was at `token`, discarding everything
    /// written since (including unsynced data), and commit that as a new
    /// token, which is returned. Tokens after `token` become invalid.
    pub fn rollback(&self, token: u64) -> Result<u64> {
        let sh = &*self.face.shared;
        let mut st = sh.lock()?;
        if let Some(why) = st.tokens.why_not_live(token) {
            return Err(NvmmError::new(ErrorKind::StaleToken, why));
        }
        for block in st.cache.resident_blocks() {
            st.drop_block(sh, block)?;
        }
        for p in std::mem::take(&mut st.prefetching) {
            st.spare.push(p.buf);
        }
        for vpn in 0..st.table.pages() {
            loop {
                let head = st.table.head(vpn);
                if !head.is_present() || head.time as u64 <= token {
                    break;
                }
                st.release_block(&head);
                if head.prev != 0 {
                    let older = st.table.get(head.prev);
                    st.table.free_version(head.prev);
                    st.table.set(vpn as u32, older);
                } else {
                    st.table.set(vpn as u32, Entry::default());
                }
            }
        }
        st.tokens.abandon_after(token);
        let new_token = st.commit()?;
        // SAFETY: our own mapping.
        unsafe {
            libc::mprotect(
                sh.base as *mut libc::c_void,
                sh.len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        sh.apply_all_perms(&st)?;
        Ok(new_token)
    }

    /// A never-allocated (or deleted) page, zero-filled; its offset.
    pub fn alloc(&self) -> Result<u64> {
        let sh = &*self.face.shared;
        let mut st = sh.lock()?;
        let pages = st.table.pages();
        for i in 0..pages {
            let vpn = (st.alloc_cursor + i) % pages;
            if st.table.head(vpn).has(status::ALLOCATED) {
                continue;
            }
            let mut e = st.metadata_version(vpn)?;
            st.release_block(&e);
            e.status =
                status::PRESENT | status::FRESH | status::ALLOCATED | status::READ | status::WRITE;
            e.valid = 0;
            e.flash_page = 0;
            st.table.set(vpn as u32, e);
            for block in vpn * SEGS..(vpn + 1) * SEGS {
                st.drop_block(sh, block)?;
            }
            st.alloc_cursor = vpn + 1;
            return Ok(vpn * PAGE);
        }
        Err(NvmmError::new(
            ErrorKind::Exhausted,
            "every page of the region is allocated",
        ))
    }

    fn page_of(&self, offset: u64) -> Result<u64> {
        self.check_range(offset, 1)?;
        Ok(offset / PAGE)
    }

    /// Delete the page holding `offset` now (SPEC §7 delete): it reads as
    /// zero and is no longer allocated; older tokens still hold its data.
    pub fn delete(&self, offset: u64) -> Result<()> {
        let vpn = self.page_of(offset)?;
        let mut st = self.face.shared.lock()?;
        st.delete(&self.face.shared, vpn)
    }

    /// Set the page's permissions ([`perms`]: READ, WRITE, TEMPORARY);
    /// enforced by the MMU (a store to a read-only page is SIGSEGV).
    pub fn set_perms(&self, offset: u64, perms: u8) -> Result<()> {
        let vpn = self.page_of(offset)?;
        if perms & !status::PERMS != 0 {
            return Err(NvmmError::new(
                ErrorKind::InvalidArgument,
                format!("permission bits {perms:#x} outside READ|WRITE|TEMPORARY"),
            ));
        }
        let mut st = self.face.shared.lock()?;
        let mut e = st.metadata_version(vpn)?;
        e.status = (e.status & !status::PERMS) | perms | status::ALLOCATED;
        st.table.set(vpn as u32, e);
        self.face.shared.mprotect_page(vpn, e.status)
    }

    /// The page's status bits (see [`crate::entry::status`]).
    pub fn page_status(&self, offset: u64) -> Result<u8> {
        let vpn = self.page_of(offset)?;
        let st = self.face.shared.lock()?;
        let head = st.table.head(vpn);
        Ok(if head.is_present() {
            head.status
        } else {
            status::READ | status::WRITE
        })
    }

    /// The last committed token.
    pub fn last_token(&self) -> Result<u64> {
        Ok(self.face.shared.lock()?.tokens.last)
    }

    /// The oldest token rollback still accepts.
    pub fn oldest_token(&self) -> Result<u64> {
        Ok(self.face.shared.lock()?.tokens.horizon)
    }

    /// Run garbage collection now down to `target_used` version entries.
    pub fn collect_garbage(&self, target_used: u64) -> Result<GcOutcome> {
        let mut st = self.face.shared.lock()?;
        let st = &mut *st;
        let mut out = GcOutcome::default();
        gc::collect(
            &mut st.table,
            &mut st.log,
            &mut st.tokens,
            target_used,
            0,
            &mut st.gc_buf,
            &mut out,
        )?;
        add_gc(&mut st.gc, &out);
        Ok(out)
    }
}

/// What both faces of a region answer alike ([`Nvmm`] and [`Replay`]
/// dereference to it).
pub struct Face {
    shared: Arc<Shared>,
}

impl Face {
    pub fn stats(&self) -> Stats {
        let shared = &*self.shared;
        let c = &shared.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut s = Stats {
            misses: get(&c.misses),
            miss_handler_ns: get(&c.miss_handler_ns),
            miss_modeled_ns: get(&c.miss_modeled_ns),
            write_protect_faults: get(&c.write_protect_faults),
            write_backs: get(&c.write_backs),
            evictions: get(&c.evictions),
            prefetch_issued: get(&c.prefetch_issued),
            prefetch_used: get(&c.prefetch_used),
            syncs: get(&c.syncs),
            ..Stats::default()
        };
        // A fork child must not take a lock the parent's threads may have held.
        if let Some(st) = (!shared.forked())
            .then(|| shared.state.lock().ok())
            .flatten()
        {
            s.resident_blocks = st.cache.resident();
            s.capacity_blocks = st.cache.capacity_blocks();
            s.versions_used = st.table.versions_used();
            s.version_capacity = st.table.version_capacity();
            s.log_blocks = st.log.blocks_in_use();
            s.gc = st.gc;
            s.direct_io = st.log.is_direct();
        }
        s
    }

    /// Every page-table entry in use (for comparing the two faces).
    pub fn table_entries(&self) -> Result<Vec<(u32, Entry)>> {
        Ok(self.shared.lock()?.table.present())
    }

    /// The resident blocks (8 KB, numbered from the region's start), in
    /// order: the DRAM cache's contents.
    pub fn resident_blocks(&self) -> Result<Vec<u64>> {
        let mut v = self.shared.lock()?.cache.resident_blocks();
        v.sort_unstable();
        Ok(v)
    }

    /// Now on the region's clock (virtual with [`Options::clock`]).
    pub fn clock_ns(&self) -> u64 {
        self.shared.clock.now()
    }
}

impl std::ops::Deref for Nvmm {
    type Target = Face;
    fn deref(&self) -> &Face {
        &self.face
    }
}

impl std::ops::Deref for Replay {
    type Target = Face;
    fn deref(&self) -> &Face {
        &self.face
    }
}

impl Nvmm {
    /// Collect temporary pages, sync, and unmap; returns the final token.
    pub fn close(mut self) -> Result<u64> {
        let token = {
            let mut st = self.face.shared.lock()?;
            let t = st
                .collect_temporary(&self.face.shared)
                .and_then(|()| st.sync(&self.face.shared));
            let t = st.fail_on_file_error(t)?;
            bump(&self.face.shared.counters.syncs, 1);
            t
        };
        self.stop_threads();
        Ok(token)
    }

    fn stop_threads(&mut self) {
        if self.face.shared.forked() {
            // A fork child has none of the parent's threads to stop (and
            // must not wake the parent's through the shared eventfd).
            std::mem::forget(std::mem::take(&mut self.threads));
            return;
        }
        self.face.shared.stop.store(true, Ordering::Release);
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe {
            libc::write(
                self.face.shared.wake.as_raw_fd(),
                (&one as *const u64).cast(),
                8,
            )
        };
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// The model face of a region (issue 24: one core, two faces): the same
/// `State` as [`Nvmm`] — cache policy, page table, log, garbage collection,
/// tokens, flash timing — with no memory behind it and no threads.
/// Accesses come from a trace instead of the MMU, as the kernel would
/// deliver them to the real face: a missing block is a missing-page fault;
/// a store to a resident clean block (installed write-protected) is a
/// write-protect fault; anything else is a hit the library never sees.
/// With a [`moneta_model::kernel::VirtualClock`] it runs in virtual time; the
/// twin test (`tests/twin.rs`) runs one trace through both faces.
pub struct Replay {
    face: Face,
}

impl Replay {
    pub fn open(path: impl AsRef<Path>, size: u64, options: Options) -> Result<Replay> {
        Ok(Replay {
            face: Face {
                shared: prepare(path.as_ref(), size, options, false)?,
            },
        })
    }

    /// One 64 B access at `offset`.
    pub fn access(&self, offset: u64, write: bool) -> Result<()> {
        let sh = &*self.face.shared;
        if offset >= sh.len {
            return Err(NvmmError::new(
                ErrorKind::InvalidArgument,
                format!("{offset} is outside the {}-byte region", sh.len),
            ));
        }
        let mut st = sh.lock()?;
        let block = offset / BLOCK;
        let fault = if !st.cache.is_resident(block) {
            Some((write, false))
        } else if write && !st.cache.is_dirty(block) {
            Some((true, true))
        } else {
            None
        };
        if let Some((write, write_protect)) = fault {
            st.handle_fault(
                sh,
                Fault {
                    address: sh.base + offset,
                    write,
                    write_protect,
                    thread: 0,
                },
            )?;
        }
        Ok(())
    }

    pub fn sync(&self) -> Result<u64> {
        let token = self.face.shared.lock()?.sync(&self.face.shared)?;
        bump(&self.face.shared.counters.syncs, 1);
        Ok(token)
    }
}

fn add_gc(total: &mut GcOutcome, o: &GcOutcome) {
    total.chains_merged += o.chains_merged;
    total.versions_freed += o.versions_freed;
    total.segments_copied += o.segments_copied;
    total.tokens_discarded += o.tokens_discarded;
}

impl Drop for Nvmm {
    fn drop(&mut self) {
        self.stop_threads();
        if self.face.shared.forked() {
            // Not mapped in a fork child (MADV_DONTFORK): its addresses
            // may hold the child's own mappings by now.
            return;
        }
        // SAFETY: the handler has stopped; the region is ours to unmap. Any
        // access to it after this is the caller's use-after-free.
        unsafe {
            libc::munmap(
                self.face.shared.base as *mut libc::c_void,
                self.face.shared.len as usize,
            )
        };
    }
}

fn fatal(what: &str, e: &NvmmError) -> ! {
    // Straight to descriptor 2: a test harness captures eprintln! (in
    // spawned threads too) and would lose the message with the process.
    let msg = format!("libnvmm: {what}: {e}; a faulting thread cannot be resumed, aborting\n");
    // SAFETY: writes a live buffer to stderr.
    unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    std::process::abort();
}

/// Fail the region with `e` (the first failure stays) and say so on stderr.
fn fail_region(st: &mut State, what: &str, e: NvmmError) {
    if st.failed.is_none() {
        let msg = format!(
            "libnvmm: {what}: {e}; the region is failed (every call returns this error, no sync \
             is committed again)\n"
        );
        // SAFETY: writes a live buffer to stderr.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
        st.failed = Some(e);
    }
}

/// Resolve one fault. On a failed region (or when this fault fails it),
/// serve it without write-backs; a block that cannot be read back is a
/// memory error for the faulting thread: SIGBUS.
fn serve_fault(sh: &Shared, st: &mut State, f: Fault) {
    if st.failed.is_none() {
        match st.handle_fault(sh, f) {
            Ok(()) => return,
            Err(e) => fail_region(st, &format!("fault at {:#x}", f.address), e),
        }
    }
    if let Err(e) = st.serve_failed(sh, f) {
        if f.thread == 0 {
            fatal(&format!("fault at {:#x}", f.address), &e);
        }
        let msg = format!(
            "libnvmm: the block at {:#x} cannot be read back ({e}): SIGBUS to thread {}\n",
            f.address, f.thread
        );
        // SAFETY: writes a live buffer to stderr; tgkill of a thread of this
        // process, blocked in the fault, which the signal interrupts.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), msg.len());
            libc::syscall(
                libc::SYS_tgkill,
                libc::getpid(),
                f.thread as libc::c_int,
                libc::SIGBUS,
            );
        }
    }
}

/// The handler thread: resolve faults, install completed prefetches, poll.
fn fault_handler(sh: &Shared) {
    let mut last_fault_ns = 0;
    while !sh.stop.load(Ordering::Acquire) {
        let mut handled = false;
        loop {
            let Some(uffd) = &sh.uffd else { return };
            match uffd.next_fault() {
                Ok(Some(f)) => {
                    handled = true;
                    if f.address < sh.base || f.address >= sh.base + sh.len {
                        continue;
                    }
                    let mut st = match sh.state.lock() {
                        Ok(st) => st,
                        Err(_) => fatal(
                            "region lock poisoned",
                            &NvmmError::new(ErrorKind::Io, "poisoned"),
                        ),
                    };
                    serve_fault(sh, &mut st, f);
                }
                Ok(None) => break,
                Err(e) => fatal("reading userfaultfd", &e),
            }
        }
        let next_due = if !sh.prefetch_enabled {
            None
        } else {
            let Ok(mut st) = sh.state.lock() else { return };
            if !st.prefetching.is_empty() && st.failed.is_none() {
                if let Err(e) = st.install_due_prefetches(sh) {
                    fail_region(&mut st, "installing a prefetched block", e);
                }
            }
            st.next_prefetch_due()
        };
        let now = sh.wall.now_ns();
        if handled {
            last_fault_ns = now;
        }
        if now.saturating_sub(last_fault_ns) < sh.spin_ns {
            std::hint::spin_loop();
            continue;
        }
        let timeout_ms = match next_due {
            Some(due) => (due.saturating_sub(sh.clock.now()).div_ceil(1_000_000)).min(100) as i32,
            None => 100,
        };
        let Some(uffd) = &sh.uffd else { return };
        if let Err(e) = uffd.poll(sh.wake.as_raw_fd(), timeout_ms) {
            fatal("polling userfaultfd", &e);
        }
    }
}

/// The background collector: when more than half the version area is in
/// use, merge chains (a bounded number per lock hold) down to a quarter.
fn collector(sh: &Shared) {
    while !sh.stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(10));
        let Ok(mut guard) = sh.state.lock() else {
            return;
        };
        let st = &mut *guard;
        if st.failed.is_some() || st.table.versions_used() <= st.table.version_capacity() / 2 {
            continue;
        }
        let target = st.table.version_capacity() / 4;
        let mut out = GcOutcome::default();
        if let Err(e) = gc::collect(
            &mut st.table,
            &mut st.log,
            &mut st.tokens,
            target,
            64,
            &mut st.gc_buf,
            &mut out,
        ) {
            st.failed = Some(e);
        }
        add_gc(&mut st.gc, &out);
    }
}
