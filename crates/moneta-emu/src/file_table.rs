//! The OS's table of granted files across all channels (SPEC §3.3–3.4,
//! DESIGN "The direct path never weakens the file system's protection").
//!
//! Each channel's grants of a file live in a [`GrantedFile`]; this table
//! keeps them all, indexed by inode, so a layout change of one file revokes
//! its records **on every channel that holds it** before the file system
//! can free a block:
//!
//! - A layout change begins (a shim process says so before its truncate,
//!   ftruncate, O_TRUNC open or fallocate; the kernel's pre-content event
//!   says so for any process, [`crate::layout_watch`]): every holder's
//!   grants from the changed offset on are revoked, the device applies the
//!   removal before the call may proceed, and the change is *pending* until
//!   it ends (its owner says so, the kernel reports the thread's
//!   modification, a truncation's new size is seen, or it expires).
//! - While changes are pending, a soft miss grants nothing from the lowest
//!   pending offset on (the client uses the kernel there until the change
//!   ends and its LAYOUT EPOCH moves); a soft miss whose FIEMAP raced with
//!   a revocation (the inode's generation moved) starts again. Grants and
//!   revocations are applied to the device under the table's lock, so the
//!   device and the OS's copy never disagree.
//! - No grant reaches past the end of the file, so a truncation to N,
//!   once its new size is visible, has nothing left to free below N.
//! - A file some process maps (`mmap`) is *mapped*: all its records are
//!   revoked, its page cache is made current, and every channel is told to
//!   use the kernel for it (SPEC §3.4's "switch such files to the
//!   system-call path") until no process maps it any more (checked in
//!   /proc, so forks, exits and programs outside the shim count too).
//!
//! - A file a process outside the shim opened before the file system was
//!   covered (its open cannot report accesses) is *blind*: granted to no
//!   channel until no such open is left (checked in /proc).
//! - A file a process outside the shim opens for writing, or that a loop
//!   device is attached to, has a *foreign writer*: its ioctls (xfs_fsr's
//!   swapext, EXT4_IOC_SWAP_BOOT, exchange-range) and the loop driver move
//!   or free blocks with no event, so it is granted to no channel while
//!   such a writer has it open (checked in /proc and /sys/block).
//! - No page cache under a grant (issue 20): every kernel access of a held
//!   file (reads included) revokes the grants from its offset on until it
//!   ends and first drops clean cached pages, which direct writes may have
//!   made stale; a soft miss writes back and drops its window and grants
//!   nothing where pages remain. So no buffered write, read-modify-write or
//!   mapping write-back ever starts from a stale copy of direct data.
//!
//! Each holder's LAYOUT EPOCH word (per file, in its channel's shared page)
//! is bumped on every revocation and when changes end, so libraries drop
//! cached translation maps (coherency; protection is the device's). The
//! daemon keeps a descriptor of every held file, so even an unlinked file's
//! blocks stay allocated until its records are gone.

use crate::engine::Engine;
use crate::files::GrantedFile;
use crate::free_watch::{FreeHandler, FreeWatch, FreedRange};
use crate::growth::{self, Pending, PendingSet};
use crate::layout_watch::{Handler, LayoutEvent, LayoutWatch};
use crate::protection::Update;
use crate::sys;
use moneta_abi::control::{DirectAccess, FileExtent};
use moneta_abi::error::{EmuError, ErrorKind};
use moneta_abi::InodeId;
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// A layout change reported by the kernel for a thread whose completion
/// never arrived (the call failed, so nothing was freed) stops limiting
/// grants after this long.
const THREAD_CHANGE_EXPIRY: Duration = Duration::from_secs(2);
/// A layout change already past the kernel's hook when a file's watch was
/// placed is not reported; the first grant after a new watch waits this
/// long so that such a change has taken the inode's lock (see README,
/// "Direct-path contract").
const NEW_WATCH_GRACE: Duration = Duration::from_millis(2);
/// How often a mapped file is checked for still being mapped somewhere.
const MAPPED_RECHECK: Duration = Duration::from_millis(100);

/// Who is changing a file's layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeOwner {
    /// A thread the kernel reported (fanotify pre-content event).
    Thread(i32),
    /// A control-plane session that announced the change (the shim), and
    /// its token.
    Session { session: u64, token: u64 },
}

struct Mapped {
    /// Kept to write the page cache back once nobody maps the file.
    fd: OwnedFd,
    checked: Instant,
}

/// A layout change in progress.
#[derive(Debug, Clone, Copy)]
struct Change {
    owner: ChangeOwner,
    /// Nothing is granted from here on while it is pending.
    from: u64,
    /// A truncation to this size: over once the file is no bigger.
    truncate_to: Option<u64>,
    since: Instant,
}

#[derive(Default)]
struct InodeState {
    /// (channel, file id) of every grant of this inode.
    holders: BTreeSet<(u16, u32)>,
    /// Layout changes in progress.
    changes: Vec<Change>,
    mapped: Option<Mapped>,
    /// Bumped by every revocation.
    generation: u64,
    /// When the layout watcher began watching it (None: not watched).
    watched_since: Option<Instant>,
    /// Some process outside the shim opened the file before it was
    /// watched: the kernel decides per open file, at open, whether it
    /// reports accesses, so that process's writes and hole punches would go
    /// unseen. Nothing is granted until no such open is left (last checked
    /// then).
    blind: Option<Instant>,
    /// A process outside the shim opened the file for writing (or a loop
    /// device is attached to it): its ioctls may move blocks with no event
    /// (XFS_IOC_SWAPEXT, EXT4_IOC_SWAP_BOOT, exchange-range; the loop
    /// driver's I/O), so nothing is granted while it has the file open for
    /// writing (last checked then), and the shim's writes go through the
    /// kernel, where they change the file's times (xfs_fsr then refuses to
    /// swap a file changed under it).
    foreign_writer: Option<Instant>,
    /// A write grant may have existed since the file's cached pages were
    /// last dropped: only then can a cached page be stale (the device
    /// writes a file's blocks only through write grants, and a grant's
    /// window is dropped when it is made), so only then does a kernel
    /// access drop the cache first.
    maybe_stale: bool,
    /// Growth grants whose data is on the device but whose extents the
    /// file system still calls unwritten ([`crate::growth`]).
    pending: PendingSet,
    /// The descriptor pending ranges are settled through (no fanotify
    /// events of its own).
    quiet: Option<OwnedFd>,
    /// The file's handle, by which the growth journal names it.
    handle: Option<growth::FileHandle>,
}

impl InodeState {
    fn unused(&self) -> bool {
        self.holders.is_empty()
            && self.pending.is_empty()
            && self.changes.is_empty()
            && self.mapped.is_none()
            && self.foreign_writer.is_none()
    }

    /// Drop the changes that are over: expired ones the kernel reported,
    /// and truncations whose new size is visible (`size`, if known).
    /// Whether any ended.
    fn expire_changes(&mut self, now: Instant, size: Option<u64>) -> bool {
        let before = self.changes.len();
        self.changes.retain(|c| {
            let expired = matches!(c.owner, ChangeOwner::Thread(_))
                && now.duration_since(c.since) >= THREAD_CHANGE_EXPIRY;
            let truncated = matches!((c.truncate_to, size), (Some(to), Some(s)) if s <= to);
            !expired && !truncated
        });
        self.changes.len() != before
    }

    /// Grants end below this offset while changes are pending (a mapped
    /// file: no grants at all).
    fn limit(&self) -> u64 {
        if self.mapped.is_some() || self.blind.is_some() || self.foreign_writer.is_some() {
            return 0;
        }
        self.changes
            .iter()
            .map(|c| c.from)
            .min()
            .unwrap_or(u64::MAX)
    }
}

#[derive(Default)]
struct Table {
    files: HashMap<(u16, u32), GrantedFile>,
    inodes: HashMap<InodeId, InodeState>,
}

use moneta_abi::stats::FileTableStats;

/// Every channel's file grants, by inode.
pub struct FileTable {
    engine: Arc<Engine>,
    table: Mutex<Table>,
    stats: Mutex<FileTableStats>,
    /// The kernel's reports of layout changes by any process (started with
    /// the first file; None if this kernel cannot).
    watch: OnceLock<Option<LayoutWatch>>,
    /// Whether the file system is covered (every open from then on can
    /// report, [`LayoutWatch::cover_file_system`]), and the inodes some
    /// process had open on it before that (their opens cannot report).
    covered: Mutex<Option<std::collections::HashSet<InodeId>>>,
    /// The pid of each session's client (their descriptors opened before a
    /// watch are announced through the shim, not blind).
    session_pids: Mutex<HashMap<u64, i32>>,
    /// Where the watched file system is mounted (the /proc scans look only
    /// at descriptors under it).
    mount_root: Mutex<Option<std::path::PathBuf>>,
    /// The file systems' reports of freed blocks (started with the file
    /// system's watch; the reason if it could not start).
    frees: OnceLock<Result<FreeWatch, String>>,
    /// Whether soft misses make unwritten extents growth grants
    /// ([`crate::growth`]; on unless `MONETA_GROWTH=0`, and only with a
    /// journal that could be recovered at start).
    growth: AtomicBool,
    /// Whether growth grants also fill holes for a client's direct write
    /// ([`FileTable::allocate`]; with growth, unless `MONETA_GROWTH_HOLES=0`).
    growth_holes: bool,
    /// Where the growth journal lives, and the (st_dev, st_ino) of the
    /// files carrying the medium (to read a recovered file's extents).
    journal_at: OnceLock<(std::path::PathBuf, Vec<(u64, u64)>)>,
    /// The durable record of pending ranges (taken after the table's lock).
    journal: Mutex<Option<growth::Journal>>,
    me: Weak<FileTable>,
}

impl FileTable {
    pub fn new(engine: Arc<Engine>) -> Arc<FileTable> {
        // Growth writes zeros to the medium itself, so only where the
        // medium is the whole address space (not a SAN's global one).
        let growth =
            growth::enabled() && engine.address_space_bytes() == engine.medium().capacity_bytes();
        Arc::new_cyclic(|me| FileTable {
            engine,
            table: Mutex::new(Table::default()),
            stats: Mutex::new(FileTableStats::default()),
            watch: OnceLock::new(),
            covered: Mutex::new(None),
            session_pids: Mutex::new(HashMap::new()),
            mount_root: Mutex::new(None),
            frees: OnceLock::new(),
            growth: AtomicBool::new(growth),
            growth_holes: growth::holes_enabled(),
            journal_at: OnceLock::new(),
            journal: Mutex::new(None),
            me: me.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("file table")
    }

    /// Keep the growth journal at `path` ([`crate::growth`], "Durable
    /// pending ranges"); `images` are the files that carry the medium.
    /// Without one no growth grant is made. What an earlier run left in it
    /// is settled when the file system is first watched.
    pub fn set_growth_journal(&self, path: std::path::PathBuf, images: Vec<(u64, u64)>) {
        let _ = self.journal_at.set((path, images));
    }

    /// Whether growth grants are on (clients follow it: a file preallocated
    /// while new leaves the kernel path only then).
    pub fn growth_on(&self) -> bool {
        self.growth.load(Ordering::Acquire) && self.journal_at.get().is_some()
    }

    /// Whether growth grants also fill holes (clients ask `allocate-file`
    /// for a write into a hole only then).
    pub fn growth_holes_on(&self) -> bool {
        self.growth_holes && self.growth_on()
    }

    /// A client's write is about to fill holes of `[offset, offset + len)`
    /// (inside the file's size) of its open file ([`crate::growth`],
    /// "Growth into holes"): the file system allocates them as unwritten
    /// extents — `fallocate(FALLOC_FL_KEEP_SIZE)` through the inode's quiet
    /// descriptor, which changes no byte anyone can read, no size and no
    /// page, and raises no access event — and the soft miss that follows
    /// makes them growth grants exactly as for preallocated space (cached
    /// pages, pending kernel accesses and outside writers keep the window
    /// on the kernel path; the blocks are zeroed on the medium first).
    /// Refused (unauthorized: the client writes through the kernel) where
    /// growth into holes is off, the descriptor may not write, the range is
    /// not inside the file, or the file system is nearly full (monetad
    /// allocates as root, which may use blocks kept from other users).
    pub fn allocate(
        &self,
        channel: u16,
        file_id: u32,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<FileExtent>), EmuError> {
        let refuse = |why: &str| {
            Err(EmuError::new(
                ErrorKind::Unauthorized,
                format!("no allocation for a direct write: {why}"),
            ))
        };
        if !self.growth_holes_on() || self.watcher().is_none() {
            return refuse("growth into holes is off");
        }
        let end = match offset.checked_add(len) {
            Some(e) if len > 0 => e,
            _ => {
                return Err(EmuError::new(
                    ErrorKind::Request,
                    "allocate-file needs a non-empty range inside the file",
                ))
            }
        };
        let (reader, inode) = {
            let t = self.lock();
            let f = t
                .files
                .get(&(channel, file_id))
                .ok_or_else(|| not_open(file_id))?;
            (f.extent_reader()?, f.inode())
        };
        if !reader.may_write() || reader.device_bytes().is_some() {
            return refuse("the descriptor may not write a file");
        }
        let size =
            sys::file_len(reader.raw_fd()).map_err(|e| EmuError::io("fstat of the file", e))?;
        if end > size {
            return refuse("the range is not inside the file");
        }
        match sys::available_bytes(reader.raw_fd()) {
            Ok(free) if free >= len.saturating_add(growth::ALLOCATE_HEADROOM_BYTES) => {}
            _ => return refuse("the file system is nearly full"),
        }
        if !self.has_quiet(inode) {
            // Outside the lock (the reopen's event is answered by the
            // layout watcher's thread, which may be waiting for it).
            let made = growth::quiet_writer(reader.raw_fd()).and_then(|q| {
                let h = growth::FileHandle::of(reader.raw_fd())
                    .map_err(|e| EmuError::io("name_to_handle_at of the file", e))?;
                Ok((q, h))
            });
            let (q, h) = match made {
                Ok(x) => x,
                Err(e) => return refuse(&e.to_string()),
            };
            let mut t = self.lock();
            let st = t.inodes.entry(inode).or_default();
            if st.quiet.is_none() {
                st.quiet = Some(q);
                st.handle = Some(h);
            }
        }
        drop(reader);
        {
            let t = self.lock();
            let Some(quiet) = t.inodes.get(&inode).and_then(|st| st.quiet.as_ref()) else {
                return refuse("the file has no settling descriptor");
            };
            // The file system allocates the whole blocks the range touches.
            let (from, to) = (offset, end);
            // SAFETY: plain syscall on a descriptor the table owns.
            let r = unsafe {
                libc::fallocate64(
                    quiet.as_raw_fd(),
                    libc::FALLOC_FL_KEEP_SIZE,
                    from as i64,
                    (to - from) as i64,
                )
            };
            if r != 0 {
                let e = std::io::Error::last_os_error();
                return refuse(&format!("fallocate: {e}"));
            }
            let mut stats = self.stats.lock().expect("stats");
            stats.growth_allocations += 1;
            stats.growth_allocated_bytes += to - from;
        }
        self.map(channel, file_id, offset, len)
    }

    /// Settle what the growth journal still records (monetad's start, before
    /// the file system holding `dir` is watched), and keep the journal for
    /// this run if growth is on. Growth goes off if files cannot be opened
    /// by handle here (no CAP_DAC_READ_SEARCH, or a file system without
    /// handles): a later start could not settle them.
    fn recover_growth(&self, dir: &std::path::Path) {
        let Some((path, images)) = self.journal_at.get() else {
            self.growth.store(false, Ordering::Release);
            return;
        };
        let mount = match std::fs::File::open(dir) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("monetad: no growth grants: opening {}: {e}", dir.display());
                self.growth.store(false, Ordering::Release);
                return;
            }
        };
        let mount_fd = mount.as_raw_fd();
        let (mut journal, recorded) = match growth::Journal::open(path) {
            Ok(x) => x,
            Err(e) => {
                eprintln!("monetad: no growth grants: {e}");
                self.growth.store(false, Ordering::Release);
                return;
            }
        };
        if !recorded.is_empty() {
            let capacity = self.engine.config().device.capacity_bytes;
            let extents = |fd: &OwnedFd, logical: u64, len: u64| {
                let dup = sys::dup(fd.as_raw_fd())
                    .map_err(|e| EmuError::io("duplicating a recovered file's descriptor", e))?;
                let (file, _) = GrantedFile::open(dup, 0, images)?;
                let mut out = Vec::new();
                let (mut at, end) = (logical, logical + len);
                while at < end {
                    let (found, covered) = file.read_extents(at, end - at, capacity)?;
                    out.extend(
                        found
                            .iter()
                            .map(|e| (e.logical, e.physical, e.len, e.unwritten)),
                    );
                    at = covered;
                }
                Ok(out)
            };
            let r = growth::recover(self.engine.medium(), mount_fd, &recorded, &extents);
            eprintln!(
                "monetad: growth journal {}: settled {} bytes written direct in {} files before the last stop; {} recorded bytes left alone (file gone, or those blocks no longer unwritten there)",
                path.display(),
                r.settled_bytes,
                r.files,
                r.left_bytes
            );
            let mut stats = self.stats.lock().expect("stats");
            stats.growth_settled_bytes += r.settled_bytes;
        }
        if let Err(e) = journal.clear() {
            eprintln!("monetad: no growth grants: {e}");
            self.growth.store(false, Ordering::Release);
            return;
        }
        if !self.growth.load(Ordering::Acquire) {
            return;
        }
        // A later start must open files by handle: try it on the mount.
        let probe = growth::FileHandle::of(mount_fd).and_then(|h| h.open(mount_fd, libc::O_RDONLY));
        if let Err(e) = probe {
            eprintln!(
                "monetad: no growth grants: files on {} cannot be opened by handle ({e}), so a restart could not settle them",
                dir.display()
            );
            self.growth.store(false, Ordering::Release);
            return;
        }
        *self.journal.lock().expect("journal") = Some(journal);
    }

    /// Record a change of the pending ranges in the journal.
    fn journal(
        &self,
        f: impl FnOnce(&mut growth::Journal) -> Result<(), EmuError>,
    ) -> Result<(), EmuError> {
        match self.journal.lock().expect("journal").as_mut() {
            Some(j) => f(j),
            None => Err(EmuError::new(ErrorKind::Io, "no growth journal")),
        }
    }

    /// Start the journal afresh when nothing is pending anywhere.
    fn journal_maybe_clear(&self, inodes: &HashMap<InodeId, InodeState>) {
        if inodes.values().all(|st| st.pending.is_empty()) {
            if let Some(j) = self.journal.lock().expect("journal").as_mut() {
                let _ = j.clear();
            }
        }
    }

    /// Why nothing of `inode` would be granted now (empty: nothing keeps
    /// it on the kernel path as a whole), for diagnostics.
    pub fn kernel_path_reasons(&self, inode: InodeId) -> Vec<String> {
        let t = self.lock();
        let Some(st) = t.inodes.get(&inode) else {
            return vec!["not open through the device".into()];
        };
        let mut why = Vec::new();
        if st.mapped.is_some() {
            why.push("mapped by some process".into());
        }
        if st.blind.is_some() {
            why.push("open outside the shim since before it was watched".into());
        }
        if st.foreign_writer.is_some() {
            why.push("open for writing outside the shim (or behind a loop device)".into());
        }
        for c in &st.changes {
            why.push(format!(
                "a layout change from byte {} pending for {:?}",
                c.from,
                c.since.elapsed()
            ));
        }
        why
    }

    pub fn stats(&self) -> FileTableStats {
        let t = self.lock();
        // Only if started: statistics must not start the watcher.
        let started = self.watch.get().and_then(|w| w.as_ref());
        let watch = started.map(|w| w.stats()).unwrap_or_default();
        let frees = match self.frees.get() {
            Some(Ok(f)) => f.stats(),
            _ => Default::default(),
        };
        FileTableStats {
            files_open: t.files.len() as u64,
            inodes_held: t.inodes.values().filter(|s| !s.holders.is_empty()).count() as u64,
            inodes_mapped: t.inodes.values().filter(|s| s.mapped.is_some()).count() as u64,
            inodes_foreign_written: t
                .inodes
                .values()
                .filter(|s| s.foreign_writer.is_some())
                .count() as u64,
            inodes_watched: t
                .inodes
                .values()
                .filter(|s| s.watched_since.is_some())
                .count() as u64,
            layout_watch: started.is_some(),
            kernel_events: watch.events,
            kernel_event_handler_ns_max: watch.handler_ns_max,
            block_free_guard: frees.running,
            block_frees: frees.frees,
            free_fence_stalls: frees.fence_stalls,
            ..*self.stats.lock().expect("stats")
        }
    }

    /// The layout watcher, started on first use (never with
    /// `MONETA_GUARD=tracepoints`, which tests the block-free guard alone).
    fn watcher(&self) -> Option<&LayoutWatch> {
        self.watch
            .get_or_init(|| {
                if std::env::var_os("MONETA_GUARD").is_some_and(|g| g == "tracepoints") {
                    eprintln!("monetad: MONETA_GUARD=tracepoints: no fanotify layout watch");
                    return None;
                }
                let me = self.me.clone();
                let handler: Handler = Arc::new(move |e: &LayoutEvent| {
                    if let Some(t) = me.upgrade() {
                        t.on_kernel_event(e);
                    }
                });
                match LayoutWatch::start(handler) {
                    Ok(w) => Some(w),
                    Err(e) => {
                        eprintln!(
                            "monetad: {e}; layout changes by processes outside the shim are \
                             not seen (docs/src/guide/direct-path.md)"
                        );
                        None
                    }
                }
            })
            .as_ref()
    }

    /// Check every mapped inode that was not checked lately (a mapping
    /// ends with munmap, exit or exec, and only munmap through the shim
    /// says so; a mapped file keeps a descriptor, and so its blocks).
    fn recheck_all_mapped(&self) {
        let mapped: Vec<InodeId> = self
            .lock()
            .inodes
            .iter()
            .filter(|(_, st)| st.mapped.is_some())
            .map(|(inode, _)| *inode)
            .collect();
        for inode in mapped {
            self.recheck_mapped(inode);
        }
    }

    /// Watch the file system holding directory `dir` from now on (monetad
    /// does at start, before programs open files there): every open from
    /// now on can report its accesses, and the files open on it already
    /// (a daemon restart) are noted — a process outside the shim with such
    /// an open keeps the file from being granted.
    pub fn watch_file_system(&self, dir: &std::path::Path) -> Result<(), EmuError> {
        let frees = self.watch_frees(dir);
        let watcher = self.watcher().ok_or_else(|| {
            EmuError::new(
                moneta_abi::error::ErrorKind::Io,
                "this kernel cannot report layout changes (no fanotify pre-content events)",
            )
        })?;
        let mut covered = self.covered.lock().expect("covered");
        if covered.is_none() {
            self.recover_growth(dir);
            watcher.cover_file_system(dir)?;
            let root = mount_point_of(dir);
            *covered = Some(sys::inodes_open_under(&root));
            *self.mount_root.lock().expect("mount root") = Some(root);
        }
        frees
    }

    /// Learn of every block the file system holding `dir` frees (README,
    /// "Direct-path contract"): an error says why not, and the mount keeps
    /// fanotify's guard alone.
    fn watch_frees(&self, dir: &std::path::Path) -> Result<(), EmuError> {
        let started = self.frees.get_or_init(|| {
            let me = self.me.clone();
            let handler: FreeHandler = Arc::new(move |frees: &[FreedRange]| {
                if let Some(t) = me.upgrade() {
                    t.on_frees(frees);
                }
            });
            let watch = FreeWatch::start(handler).map_err(|e| e.message)?;
            self.engine.set_free_fence(watch.fence());
            Ok(watch)
        });
        match started {
            Ok(watch) => watch.watch_file_system(dir),
            Err(why) => Err(EmuError::new(moneta_abi::error::ErrorKind::Io, why.clone())),
        }
    }

    /// Which mechanisms guard the watched file system against blocks moved
    /// or freed under a grant (for `moneta status`).
    pub fn guard(&self) -> String {
        let fanotify = self.watch.get().is_some_and(|w| w.is_some());
        let frees = match self.frees.get() {
            Some(Ok(f)) => Ok(f.watched().join(",")),
            Some(Err(why)) => Err(why.clone()),
            None => Err("not started".into()),
        };
        match (fanotify, frees) {
            (true, Ok(tps)) => format!("fanotify pre-content + block-free tracepoints ({tps})"),
            (true, Err(why)) => {
                format!("fanotify pre-content only (block-free tracepoints: {why})")
            }
            (false, Ok(tps)) => format!("block-free tracepoints only ({tps}; no fanotify)"),
            (false, Err(_)) => "none: no fanotify pre-content events and no block-free \
                                tracepoints (docs/src/guide/direct-path.md)"
                .into(),
        }
    }

    /// The file system freed blocks (on the free watcher's thread; the
    /// device takes no command until this returns): every channel's grant
    /// of a freed block is revoked, and every map of an inode on that file
    /// system in progress starts over (its FIEMAP may predate the free).
    fn on_frees(&self, frees: &[FreedRange]) {
        let mut t = self.lock();
        let Table { files, inodes } = &mut *t;
        let mut updates = Vec::new();
        let mut hit = 0u64;
        for (&(channel, file_id), f) in files.iter_mut() {
            let dev = f.inode().dev;
            let mut lost = false;
            for r in frees.iter().filter(|r| r.dev == dev) {
                for (from, to) in f.logical_on_device(r.start, r.len) {
                    let u = f.revoke_range(channel, from, to);
                    lost |= !u.is_empty();
                    updates.extend(u);
                }
            }
            if lost {
                hit += 1;
                self.bump_epoch(channel, file_id);
            }
        }
        for (inode, st) in inodes.iter_mut() {
            if frees.iter().any(|r| r.dev == inode.dev) {
                st.generation += 1;
            }
            if st.pending.is_empty() {
                continue;
            }
            // A freed block's bytes may be another file's soon: never settled.
            let Some(f) = st.holders.iter().find_map(|h| files.get(h)) else {
                continue;
            };
            for r in frees.iter().filter(|r| r.dev == inode.dev) {
                let at = f.medium_address(r.start);
                if st.pending.forget_device(at, r.len) {
                    eprintln!("monetad: blocks of inode {inode:?} written direct were freed before settling");
                    if let Some(h) = &st.handle {
                        if let Err(e) = self.journal(|j| j.forgotten(h, at, r.len)) {
                            eprintln!("monetad: {e}");
                        }
                    }
                }
            }
        }
        if !updates.is_empty() {
            if let Err(e) = self.engine.update_permissions(updates) {
                eprintln!("monetad: revoking freed blocks: {e}");
            }
        }
        let mut stats = self.stats.lock().expect("stats");
        stats.block_free_revocations += hit;
        stats.revocations += hit;
    }

    /// Take a file opened for `(channel, file_id)`; its inode is watched
    /// for layout changes from then on.
    pub fn open(&self, channel: u16, file_id: u32, file: GrantedFile) {
        self.recheck_all_mapped();
        let watcher = self.watcher();
        if watcher.is_some() && self.covered.lock().expect("covered").is_none() {
            // Not told where the file system is: next to this file.
            if let Ok(path) = std::fs::read_link(format!("/proc/self/fd/{}", file.raw_fd())) {
                if let Some(dir) = path.parent() {
                    let _ = self.watch_file_system(dir);
                }
            }
        }
        let inode = file.inode();
        let mut t = self.lock();
        let st = t.inodes.entry(inode).or_default();
        st.holders.insert((channel, file_id));
        if st.watched_since.is_none() {
            if let Some(w) = watcher {
                match w.watch(file.raw_fd()) {
                    Ok(()) => {
                        st.watched_since = Some(Instant::now());
                        // Opens from before the file system was covered
                        // cannot report: if a process outside the shim
                        // has one, grant nothing.
                        let early = self
                            .covered
                            .lock()
                            .expect("covered")
                            .as_ref()
                            .is_none_or(|early| early.contains(&inode));
                        // One pass over /proc: opens from before the file
                        // system was covered cannot report (blind); a
                        // writer outside the shim that opened it before
                        // the watch (xfs_fsr at work) and a loop device on
                        // it can move blocks unseen; a mapping made before
                        // the watch faults pages in unseen.
                        let uses = self.outside_uses(inode, true);
                        let holder = || match &uses.holder {
                            Some((pid, comm)) => format!("pid {pid} ({comm})"),
                            None => "a loop device".into(),
                        };
                        if early && uses.open {
                            st.blind = Some(Instant::now());
                            eprintln!(
                                "monetad: inode {}:{} is open in {} since before it was \
                                 watched: served through the kernel until that open ends",
                                inode.dev,
                                inode.ino,
                                holder()
                            );
                        } else if uses.open_for_writing
                            || sys::inode_backs_loop_device(inode.dev, inode.ino)
                        {
                            st.foreign_writer = Some(Instant::now());
                            eprintln!(
                                "monetad: inode {}:{} is open for writing outside the shim \
                                 ({}): served through the kernel while it is",
                                inode.dev,
                                inode.ino,
                                holder()
                            );
                        }
                        if st.mapped.is_none() && uses.mapped {
                            if let Ok(keep) = sys::dup(file.raw_fd()) {
                                st.mapped = Some(Mapped {
                                    fd: keep,
                                    checked: Instant::now(),
                                });
                            }
                        }
                    }
                    Err(e) => eprintln!("monetad: {e}"),
                }
            }
        }
        t.files.insert((channel, file_id), file);
    }

    /// A control-plane session began (its client's pid) or ended.
    pub fn session_started(&self, session: u64, pid: i32) {
        self.session_pids
            .lock()
            .expect("session pids")
            .insert(session, pid);
    }

    /// How processes outside the shim use `inode` (and, with `maps`,
    /// whether any process maps it).
    fn outside_uses(&self, inode: InodeId, maps: bool) -> sys::OutsideUses {
        let pids: Vec<i32> = self
            .session_pids
            .lock()
            .expect("session pids")
            .values()
            .copied()
            .collect();
        let root = self.mount_root.lock().expect("mount root").clone();
        let t = Instant::now();
        let uses = sys::outside_uses(inode.dev, inode.ino, &pids, root.as_deref(), true, maps);
        let mut stats = self.stats.lock().expect("stats");
        if maps {
            stats.proc_scans += 1;
        } else {
            stats.proc_rechecks += 1;
        }
        stats.proc_scan_us += t.elapsed().as_micros() as u64;
        uses
    }

    fn open_outside_the_shim(&self, inode: InodeId, for_writing: bool) -> bool {
        let uses = self.outside_uses(inode, false);
        if for_writing {
            uses.open_for_writing
        } else {
            uses.open
        }
    }

    /// Whether thread `tid` belongs to a client of the control plane (a
    /// process under the shim).
    fn in_session(&self, tid: i32) -> bool {
        let Some(pid) = sys::process_of_thread(tid) else {
            return false;
        };
        self.session_pids
            .lock()
            .expect("session pids")
            .values()
            .any(|&p| p == pid)
    }

    /// If `inode` is blind and was not checked lately: once no process
    /// outside the shim has it open from before its watch, grants resume
    /// (opens since the watch report; only older ones were blind).
    fn recheck_blind(&self, inode: InodeId) {
        self.recheck(
            inode,
            |st| &mut st.blind,
            || self.open_outside_the_shim(inode, false),
        );
    }

    /// If a writer outside the shim sent `inode` to the kernel path and it
    /// was not checked lately: once no such process has it open for
    /// writing and no loop device is attached to it, grants resume.
    fn recheck_foreign_writer(&self, inode: InodeId) {
        self.recheck(
            inode,
            |st| &mut st.foreign_writer,
            || {
                self.open_outside_the_shim(inode, true)
                    || sys::inode_backs_loop_device(inode.dev, inode.ino)
            },
        );
    }

    /// A reason `field` keeps `inode` on the kernel path, checked again
    /// (`still`) at most every [`MAPPED_RECHECK`]; cleared once it no
    /// longer holds.
    fn recheck(
        &self,
        inode: InodeId,
        field: impl Fn(&mut InodeState) -> &mut Option<Instant>,
        still: impl FnOnce() -> bool,
    ) {
        {
            let mut t = self.lock();
            let Some(checked) = t.inodes.get_mut(&inode).and_then(|s| field(s).as_mut()) else {
                return;
            };
            if checked.elapsed() < MAPPED_RECHECK {
                return;
            }
            *checked = Instant::now();
        }
        if still() {
            return;
        }
        let mut t = self.lock();
        if let Some(st) = t.inodes.get_mut(&inode) {
            *field(st) = None;
            st.generation += 1;
            self.changes_ended(st);
        }
    }

    /// A process outside the shim is opening `inode` for writing: every
    /// channel's records are revoked and it goes to the kernel path (see
    /// [`InodeState::foreign_writer`]).
    fn foreign_writer(&self, inode: InodeId) -> Result<(), EmuError> {
        let mut t = self.lock();
        let Table { files, inodes } = &mut *t;
        let Some(st) = inodes.get_mut(&inode) else {
            return Ok(());
        };
        st.foreign_writer = Some(Instant::now());
        st.generation += 1;
        let revoked = self.revoke(files, st, 0)?;
        // Its ioctls may move or swap the file's blocks without an access
        // event (e4defrag moves unwritten extents without copying them):
        // what was written direct into unwritten extents becomes written
        // data before its open returns.
        self.settle(st, 0);
        let mut stats = self.stats.lock().expect("stats");
        stats.foreign_writers += 1;
        stats.revocations += revoked;
        Ok(())
    }

    /// The soft miss (SPEC §3.2): the file's extents over
    /// `[offset, offset + len)` (or its first part: the returned end), with
    /// records installed for what the channel may access directly. Nothing
    /// is granted past the end of the file, from the lowest offset a
    /// pending layout change may touch, or at all while the file is mapped
    /// (the client uses the kernel there).
    pub fn map(
        &self,
        channel: u16,
        file_id: u32,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<FileExtent>), EmuError> {
        let capacity = self.engine.config().device.capacity_bytes;
        loop {
            let inode = self
                .lock()
                .files
                .get(&(channel, file_id))
                .ok_or_else(|| not_open(file_id))?
                .inode();
            self.recheck_mapped(inode);
            self.recheck_blind(inode);
            self.recheck_foreign_writer(inode);
            let (reader, generation, watched_since) = {
                let mut t = self.lock();
                let reader = t
                    .files
                    .get(&(channel, file_id))
                    .ok_or_else(|| not_open(file_id))?
                    .extent_reader()?;
                let size = sys::file_len(reader.raw_fd()).ok();
                let st = t.inodes.entry(inode).or_default();
                if st.expire_changes(Instant::now(), size) {
                    self.changes_ended(st);
                }
                (reader, st.generation, st.watched_since)
            };
            if let Some(since) = watched_since {
                let age = since.elapsed();
                if age < NEW_WATCH_GRACE {
                    std::thread::sleep(NEW_WATCH_GRACE - age);
                }
            }
            // The page cache of the window goes to the device first: no
            // dirty page may lie under a direct write grant.
            let (window_from, window_len) = folio_window(offset, len);
            let _ = sys::write_back_range(reader.raw_fd(), window_from, window_len);
            let (extents, covered) = reader.read_extents(offset, len, capacity)?;
            // Without the kernel's access reports nothing would settle
            // before another process reads.
            let grow = self.growth.load(Ordering::Acquire)
                && self.watcher().is_some()
                && reader.may_write()
                && reader.device_bytes().is_none()
                && extents
                    .iter()
                    .any(|e| e.unwritten && e.direct != DirectAccess::None);
            let quiet = if grow && !self.has_quiet(inode) {
                // Outside the lock: the reopen's permission event is
                // answered by the layout watcher's thread, which may be
                // waiting for the lock.
                match growth::quiet_writer(reader.raw_fd()).and_then(|q| {
                    let h = growth::FileHandle::of(reader.raw_fd())
                        .map_err(|e| EmuError::io("name_to_handle_at of the file", e))?;
                    Ok((q, h))
                }) {
                    Ok(q) => Some(q),
                    Err(e) => {
                        eprintln!("monetad: no growth grants for inode {inode:?}: {e}");
                        None
                    }
                }
            } else {
                None
            };
            drop(reader);
            let mut t = self.lock();
            let Table { files, inodes } = &mut *t;
            let st = inodes.entry(inode).or_default();
            if st.generation != generation {
                // A revocation raced with the FIEMAP: its answer may name
                // blocks the file is losing.
                continue;
            }
            let mut limit = st.limit();
            let file = files
                .get_mut(&(channel, file_id))
                .ok_or_else(|| not_open(file_id))?;
            // No cached page may lie under a grant: a direct write would
            // make it stale, and the kernel might use it later (a partial
            // buffered write, a mapping's write-back). Dropped here, under
            // the lock every kernel access's report takes too; what cannot
            // be dropped (mapped, locked, dirtied since) keeps the window
            // on the kernel path.
            if limit > offset && file.device_bytes().is_none() {
                let fd = file.raw_fd();
                let _ = sys::drop_cached_pages(fd, window_from, window_len);
                match sys::cachestat(fd, offset, covered - offset) {
                    Ok(c) if c.cached == 0 => {}
                    _ => {
                        limit = offset;
                        self.stats.lock().expect("stats").grants_refused_cached += 1;
                    }
                }
            }
            if st.quiet.is_none() {
                if let Some((q, h)) = quiet {
                    st.quiet = Some(q);
                    st.handle = Some(h);
                }
            }
            let extents = if (grow && st.quiet.is_some()) || !st.pending.is_empty() {
                let end = file.grant_end(limit)?;
                let zero = grow && st.quiet.is_some();
                let reader = (!file.may_write()).then(|| file.access());
                let (extents, zeroed) = self.grow(st, extents, end, zero, reader)?;
                if zeroed > 0 {
                    // Their maps said "zeros" there; the device holds the data now.
                    for &(c, id) in st.holders.iter().filter(|&&h| h != (channel, file_id)) {
                        self.bump_epoch(c, id);
                    }
                    let mut stats = self.stats.lock().expect("stats");
                    stats.growth_grants += 1;
                    stats.growth_bytes += zeroed;
                }
                extents
            } else {
                extents.into_iter().map(no_growth).collect()
            };
            let (extents, updates) = file.grant(channel, offset, covered, extents, limit)?;
            st.maybe_stale |= file.has_write_grants();
            // Applied under the lock: a revocation cannot slip between.
            self.engine.update_permissions(updates)?;
            return Ok((covered, extents));
        }
    }

    /// The hard miss (SPEC §3.2): re-install the records covering `[addr,
    /// addr + len)` from the grants of the channel's files `file_ids`.
    pub fn resolve(
        &self,
        channel: u16,
        file_ids: &BTreeSet<u32>,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Option<moneta_abi::control::Extent> {
        let t = self.lock();
        let (extent, updates) = file_ids
            .iter()
            .filter_map(|id| t.files.get(&(channel, *id)))
            .find_map(|f| f.resolve(channel, addr, len, write))?;
        self.engine.update_permissions(updates).ok()?;
        Some(extent)
    }

    /// Revoke a file's grant on its channel and drop the daemon's
    /// descriptor (after the records are gone).
    pub fn close(&self, channel: u16, file_id: u32) -> Result<(), EmuError> {
        let mut t = self.lock();
        let file = t
            .files
            .get(&(channel, file_id))
            .ok_or_else(|| not_open(file_id))?;
        self.engine.update_permissions(vec![file.remove(channel)])?;
        let file = t.files.remove(&(channel, file_id)).expect("just found");
        let inode = file.inode();
        if let Some(st) = t.inodes.get_mut(&inode) {
            st.holders.remove(&(channel, file_id));
            if st.holders.is_empty() {
                // No grant is left: what was written direct becomes written data.
                self.settle(st, 0);
            }
            if st.holders.is_empty() && st.maybe_stale {
                // Unwatched from now on: no stale page may outlive the grants.
                drop_stale_pages(file.raw_fd());
                st.maybe_stale = false;
            }
            if st.holders.is_empty() && st.watched_since.take().is_some() {
                if let Some(w) = self.watcher() {
                    let _ = w.unwatch(file.raw_fd());
                }
            }
            if st.unused() {
                t.inodes.remove(&inode);
            }
        }
        self.journal_maybe_clear(&t.inodes);
        drop(t);
        drop(file);
        Ok(())
    }

    /// A layout change of `inode` from byte `from` on is about to happen
    /// (a truncation to `truncate_to`, if it is one): revoke every
    /// channel's grants there (applied by the device before this returns)
    /// and grant nothing there until [`FileTable::end_change`].
    pub fn begin_change(
        &self,
        inode: InodeId,
        owner: ChangeOwner,
        from: u64,
        truncate_to: Option<u64>,
    ) -> Result<(), EmuError> {
        self.begin_kernel_use(inode, owner, from, truncate_to, false)
    }

    /// The kernel is about to use the page cache of `inode` from byte
    /// `from` on (a layout change, a write, or a read when `read`): every
    /// channel's grants there are revoked (the device has applied it when
    /// this returns), nothing is granted there until the use ends, and
    /// clean cached pages, which direct writes may have made stale, are
    /// dropped so the kernel reads the device's data.
    fn begin_kernel_use(
        &self,
        inode: InodeId,
        owner: ChangeOwner,
        from: u64,
        truncate_to: Option<u64>,
        read: bool,
    ) -> Result<(), EmuError> {
        let mut t = self.lock();
        let Table { files, inodes } = &mut *t;
        let st = inodes.entry(inode).or_default();
        let from = if read {
            from
        } else {
            from.min(end_block(files, st).unwrap_or(u64::MAX))
        };
        st.changes.push(Change {
            owner,
            from,
            truncate_to,
            since: Instant::now(),
        });
        st.generation += 1;
        let revoked = self.revoke(files, st, from)?;
        self.settle(st, from);
        let dropped = st.maybe_stale
            && st
                .holders
                .iter()
                .find_map(|h| files.get(h))
                .is_some_and(|f| drop_stale_pages(f.raw_fd()));
        // Write grants left below `from` may still make pages stale.
        st.maybe_stale = st
            .holders
            .iter()
            .filter_map(|h| files.get(h))
            .any(|f| f.has_write_grants());
        let mut stats = self.stats.lock().expect("stats");
        if read {
            stats.kernel_reads += 1;
        } else {
            stats.layout_changes += 1;
        }
        stats.revocations += revoked;
        stats.cache_drops += u64::from(dropped);
        Ok(())
    }

    /// The change(s) `owner` began on `inode` are over (or their owner is gone).
    pub fn end_change(&self, inode: InodeId, owner: ChangeOwner) {
        let mut t = self.lock();
        if let Some(st) = t.inodes.get_mut(&inode) {
            let before = st.changes.len();
            st.changes.retain(|c| c.owner != owner);
            if st.changes.len() != before {
                self.changes_ended(st);
            }
            if st.unused() {
                t.inodes.remove(&inode);
            }
        }
    }

    /// Changes ended: holders may map the range again (their libraries
    /// learn it from the epoch).
    fn changes_ended(&self, st: &InodeState) {
        for &(channel, file_id) in &st.holders {
            self.bump_epoch(channel, file_id);
        }
    }

    /// The layout watcher's report (on its thread, before the process that
    /// caused it goes on).
    fn on_kernel_event(&self, e: &LayoutEvent) {
        let result = match *e {
            LayoutEvent::Truncate { inode, tid, to } => self.begin_change(
                inode,
                ChangeOwner::Thread(tid),
                to / BLOCK_FLOOR * BLOCK_FLOOR,
                Some(to),
            ),
            LayoutEvent::Change { inode, tid, from } => self.begin_change(
                inode,
                ChangeOwner::Thread(tid),
                from / BLOCK_FLOOR * BLOCK_FLOOR,
                None,
            ),
            LayoutEvent::Read { inode, tid, from } => self.begin_kernel_use(
                inode,
                ChangeOwner::Thread(tid),
                from / FOLIO_BYTES * FOLIO_BYTES,
                None,
                true,
            ),
            LayoutEvent::OpenForWrite {
                inode,
                tid,
                truncate,
            } => {
                let truncated = if truncate {
                    self.begin_change(inode, ChangeOwner::Thread(tid), 0, Some(0))
                } else {
                    Ok(())
                };
                if self.in_session(tid) {
                    truncated
                } else {
                    truncated.and(self.foreign_writer(inode))
                }
            }
            LayoutEvent::Map { inode, .. } => self.mapped_inode(inode),
            LayoutEvent::Done { inode, tid } => {
                self.end_change(inode, ChangeOwner::Thread(tid));
                Ok(())
            }
        };
        if let Err(err) = result {
            eprintln!("monetad: handling {e:?}: {err}");
        }
    }

    /// A process is about to map the file open on `fd`: revoke every
    /// channel's records of it, write back and drop its page cache (which
    /// may predate direct writes), and send every channel to the kernel for
    /// it until no process maps it.
    pub fn mapped(&self, fd: OwnedFd) -> Result<(), EmuError> {
        let st = sys::fstat(fd.as_raw_fd()).map_err(|e| EmuError::io("fstat of the file", e))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Ok(());
        }
        let inode = InodeId {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        self.mark_mapped(inode, fd)
    }

    /// [`FileTable::mapped`] for a held inode the kernel reported (a
    /// process outside the shim is mapping it).
    fn mapped_inode(&self, inode: InodeId) -> Result<(), EmuError> {
        let fd = {
            let t = self.lock();
            let Some(st) = t.inodes.get(&inode) else {
                return Ok(());
            };
            let Some(file) = st.holders.iter().find_map(|h| t.files.get(h)) else {
                return Ok(());
            };
            sys::dup(file.raw_fd()).map_err(|e| EmuError::io("duplicating a descriptor", e))?
        };
        self.mark_mapped(inode, fd)
    }

    fn mark_mapped(&self, inode: InodeId, fd: OwnedFd) -> Result<(), EmuError> {
        {
            let mut t = self.lock();
            let Table { files, inodes } = &mut *t;
            let st = inodes.entry(inode).or_default();
            st.generation += 1;
            let revoked = self.revoke(files, st, 0)?;
            self.settle(st, 0);
            self.stats.lock().expect("stats").revocations += revoked;
            if st.mapped.is_none() {
                let keep = sys::dup(fd.as_raw_fd())
                    .map_err(|e| EmuError::io("duplicating the file's descriptor", e))?;
                st.mapped = Some(Mapped {
                    fd: keep,
                    checked: Instant::now(),
                });
            }
        }
        // No direct write can reach the file any more: the page cache
        // becomes the truth once it holds what the device holds.
        make_cache_current(fd.as_raw_fd())
    }

    /// A process unmapped (part of) the file on `fd`: check now whether
    /// anyone still maps it.
    pub fn unmapped(&self, fd: OwnedFd) -> Result<(), EmuError> {
        let st = sys::fstat(fd.as_raw_fd()).map_err(|e| EmuError::io("fstat of the file", e))?;
        let inode = InodeId {
            dev: st.st_dev,
            ino: st.st_ino,
        };
        if let Some(m) = self
            .lock()
            .inodes
            .get_mut(&inode)
            .and_then(|s| s.mapped.as_mut())
        {
            m.checked = Instant::now() - MAPPED_RECHECK;
        }
        self.recheck_mapped(inode);
        Ok(())
    }

    /// If `inode` is mapped and was not checked lately: when no process
    /// maps it any more, write its pages back and let channels go direct.
    fn recheck_mapped(&self, inode: InodeId) {
        let fd = {
            let mut t = self.lock();
            let Some(m) = t.inodes.get_mut(&inode).and_then(|s| s.mapped.as_mut()) else {
                return;
            };
            if m.checked.elapsed() < MAPPED_RECHECK {
                return;
            }
            m.checked = Instant::now();
            match sys::dup(m.fd.as_raw_fd()) {
                Ok(fd) => fd,
                Err(_) => return,
            }
        };
        if sys::inode_mapped_anywhere(inode.dev, inode.ino) {
            return;
        }
        // Dirty mapped pages reach the device before anything goes direct.
        if make_cache_current(fd.as_raw_fd()).is_err() {
            return;
        }
        let mut t = self.lock();
        let Some(st) = t.inodes.get_mut(&inode) else {
            return;
        };
        if sys::inode_mapped_anywhere(inode.dev, inode.ino) {
            return;
        }
        st.mapped = None;
        st.generation += 1;
        self.changes_ended(st);
        if st.unused() {
            t.inodes.remove(&inode);
        }
    }

    /// A session ended: revoke and drop its files, end its changes.
    pub fn end_session(&self, channel: u16, session: u64, file_ids: &BTreeSet<u32>) {
        self.session_pids
            .lock()
            .expect("session pids")
            .remove(&session);
        self.recheck_all_mapped();
        for id in file_ids {
            let _ = self.close(channel, *id);
        }
        let mut t = self.lock();
        let mut ended = Vec::new();
        for (inode, st) in t.inodes.iter_mut() {
            let before = st.changes.len();
            st.changes.retain(
                |c| !matches!(c.owner, ChangeOwner::Session { session: s, .. } if s == session),
            );
            if st.changes.len() != before {
                self.changes_ended(st);
            }
            if st.unused() {
                ended.push(*inode);
            }
        }
        for inode in ended {
            t.inodes.remove(&inode);
        }
    }

    /// Revoke every holder's grants of `st`'s inode from `from` on; the
    /// device has applied it when this returns. Returns the holders that
    /// lost records.
    fn revoke(
        &self,
        files: &mut HashMap<(u16, u32), GrantedFile>,
        st: &InodeState,
        from: u64,
    ) -> Result<u64, EmuError> {
        let mut updates: Vec<Update> = Vec::new();
        let mut revoked = 0;
        for &(channel, file_id) in &st.holders {
            if let Some(f) = files.get_mut(&(channel, file_id)) {
                let u = f.revoke_from(channel, from);
                if !u.is_empty() {
                    revoked += 1;
                    updates.extend(u);
                }
            }
            self.bump_epoch(channel, file_id);
        }
        if !updates.is_empty() {
            self.engine.update_permissions(updates)?;
        }
        Ok(revoked)
    }

    fn has_quiet(&self, inode: InodeId) -> bool {
        self.lock()
            .inodes
            .get(&inode)
            .is_some_and(|st| st.quiet.is_some())
    }

    /// Make the unwritten extents of a soft miss's answer growth grants
    /// below `end` ([`crate::growth`], step 2). Pending parts are granted
    /// with the handle's access (another holder's data is there: a
    /// read-only handle's `reader_access`); when
    /// `zero` (a handle that may write), the other parts' blocks are
    /// zeroed on the medium and become pending. Returns the extents as the
    /// client sees them (growth ones unwritten with the access a grant
    /// allows; the rest `none`) and the bytes zeroed.
    ///
    /// A pending part that is not granted (at or past `end`: a writer
    /// outside the shim, a mapping, a pending layout change or cached
    /// pages keep the window on the kernel path; or its blocks moved) is
    /// never answered "unwritten": the client would read zeros there
    /// without asking anyone, while the data written direct is on the
    /// device. It is answered as data only the kernel serves, and the
    /// kernel's access has it settled first.
    fn grow(
        &self,
        st: &mut InodeState,
        extents: Vec<FileExtent>,
        end: u64,
        zero: bool,
        reader_access: Option<DirectAccess>,
    ) -> Result<(Vec<FileExtent>, u64), EmuError> {
        let mut out = Vec::with_capacity(extents.len());
        let mut zeroed = 0;
        for e in extents {
            if !e.unwritten {
                out.push(e);
                continue;
            }
            // A writer's extent carries what it may do there (`none` where
            // shared or not on the medium); a reader's only its access.
            let access = reader_access.unwrap_or(e.direct);
            let e_end = e.logical.saturating_add(e.len);
            for (a0, b0, pending) in st.pending.pieces(e.logical, e_end) {
                // Split at `end`: nothing is granted from there on.
                for (a, b) in [(a0, b0.min(end)), (a0.max(end), b0)] {
                    if a >= b {
                        continue;
                    }
                    // Where the pending data of `a` is on the device.
                    let pending = pending.map(|p| p + (a - a0));
                    let physical = e.physical + (a - e.logical);
                    let piece = FileExtent {
                        logical: a,
                        physical,
                        len: b - a,
                        ..e
                    };
                    let grantable = b <= end;
                    match pending {
                        // Pending at these very blocks: the data is there.
                        Some(p) if grantable && p == physical && access != DirectAccess::None => {
                            out.push(FileExtent {
                                direct: access,
                                ..piece
                            })
                        }
                        // Pending, not granted here (or elsewhere: the
                        // extent moved, which no revocation announced):
                        // the kernel's, which settles it first.
                        Some(_) => out.push(kernel_only(piece)),
                        None if grantable && zero && e.direct != DirectAccess::None => {
                            let Some(handle) = &st.handle else {
                                out.push(no_growth(piece));
                                continue;
                            };
                            growth::zero_on_medium(self.engine.medium(), physical, b - a)?;
                            let p = Pending {
                                logical: a,
                                physical,
                                len: b - a,
                            };
                            // Durable before anyone may write there directly.
                            self.journal(|j| j.added(handle, &p))?;
                            st.pending.add(p);
                            zeroed += b - a;
                            out.push(piece);
                        }
                        None => out.push(no_growth(piece)),
                    }
                }
            }
        }
        Ok((out, zeroed))
    }

    /// Settle the inode's pending ranges from `from` on ([`crate::growth`],
    /// step 3); the caller revoked every grant there.
    fn settle(&self, st: &mut InodeState, from: u64) {
        if st.pending.is_empty() {
            return;
        }
        let Some(quiet) = &st.quiet else {
            return;
        };
        let ranges = st.pending.take_from(from);
        if ranges.is_empty() {
            return;
        }
        // A soft miss whose FIEMAP ran before this saw the ranges
        // unwritten and, with them no longer pending, would zero them:
        // it must start again.
        st.generation += 1;
        match growth::settle(self.engine.medium(), quiet.as_raw_fd(), &ranges) {
            Ok(bytes) => {
                if let Some(h) = &st.handle {
                    // Settled data is written data: a restart leaves it be
                    // (FIEMAP says written) even if this record is lost.
                    if let Err(e) = self.journal(|j| j.settled(h, from)) {
                        eprintln!("monetad: {e}");
                    }
                }
                let mut stats = self.stats.lock().expect("stats");
                stats.growth_settles += 1;
                stats.growth_settled_bytes += bytes;
            }
            Err(e) => {
                eprintln!("monetad: settling what was written direct into unwritten extents: {e}");
                for r in ranges {
                    st.pending.add(r);
                }
            }
        }
    }

    /// Settle every inode (monetad is stopping).
    pub fn settle_all(&self) {
        let mut t = self.lock();
        let Table { files, inodes } = &mut *t;
        for st in inodes.values_mut() {
            if st.pending.is_empty() {
                continue;
            }
            let _ = self.revoke(files, st, 0);
            self.settle(st, 0);
        }
        self.journal_maybe_clear(inodes);
    }

    fn bump_epoch(&self, channel: u16, file_id: u32) {
        if let Some(m) = self.engine.channel_memory(channel) {
            m.layout_epoch(file_id)
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// The start of the block (at [`BLOCK_FLOOR`]) holding the end of the
/// file, read through any descriptor monetad has of it (None: none).
///
/// A kernel write or truncation starts there at the latest, whatever
/// offset the kernel reported: an O_APPEND write (and `RWF_APPEND`) is
/// reported at the descriptor's position or the call's offset, which may
/// lie far past the end, while the kernel writes at the end; and a write
/// or truncation past the end makes everything between the old end and it
/// part of the file. A growth grant's pending range may reach past the end
/// (the end's block, a preallocation beyond it): what the kernel writes or
/// exposes there must be settled (or forgotten, past the size) before the
/// kernel goes on, never settled from the medium over it later.
fn end_block(files: &HashMap<(u16, u32), GrantedFile>, st: &InodeState) -> Option<u64> {
    let fd = st.quiet.as_ref().map(|q| q.as_raw_fd()).or_else(|| {
        st.holders
            .iter()
            .find_map(|h| files.get(h))
            .map(|f| f.raw_fd())
    })?;
    let size = moneta_abi::sys::file_len(fd).ok()?;
    Some(size / BLOCK_FLOOR * BLOCK_FLOOR)
}

/// A pending range's piece the client may not reach directly: data only
/// the kernel serves (its access has monetad settle the range first), not
/// "unwritten", which the client reads as zeros itself.
fn kernel_only(e: FileExtent) -> FileExtent {
    FileExtent {
        unwritten: false,
        direct: DirectAccess::None,
        ..e
    }
}

/// An extent as granted without growth: unwritten ones allow nothing.
fn no_growth(e: FileExtent) -> FileExtent {
    if e.unwritten {
        FileExtent {
            direct: DirectAccess::None,
            ..e
        }
    } else {
        e
    }
}

/// Revocations start at a multiple of this (no file system here has
/// bigger blocks), so the block holding the changed offset is included.
const BLOCK_FLOOR: u64 = 64 << 10;

/// The mount point of the file system holding `dir` (the nearest
/// ancestor on another device, or `/`); `dir` itself if unknown.
fn mount_point_of(dir: &std::path::Path) -> std::path::PathBuf {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = dir.canonicalize() else {
        return dir.to_path_buf();
    };
    let Ok(dev) = std::fs::metadata(&dir).map(|m| m.dev()) else {
        return dir;
    };
    let mut at = dir.as_path();
    while let Some(parent) = at.parent() {
        if std::fs::metadata(parent).map_or(true, |m| m.dev() != dev) {
            break;
        }
        at = parent;
    }
    at.to_path_buf()
}

/// The largest folio the page cache may hold (a PMD, 2 MiB on x86-64): the
/// cache is dropped in whole folios, and a read fills at least one.
const FOLIO_BYTES: u64 = 2 << 20;

/// `[offset, offset + len)` widened to whole folios, as (start, length).
fn folio_window(offset: u64, len: u64) -> (u64, u64) {
    let from = offset / FOLIO_BYTES * FOLIO_BYTES;
    let to = offset
        .saturating_add(len)
        .div_ceil(FOLIO_BYTES)
        .saturating_mul(FOLIO_BYTES);
    (from, to - from)
}

/// Drop the file's clean cached pages if it has any (cachestat first: a
/// file whose cache is all dirty, or empty, costs one system call).
/// Whether pages were dropped.
fn drop_stale_pages(fd: std::os::fd::RawFd) -> bool {
    match sys::cachestat(fd, 0, 0) {
        Ok(c) if c.clean() == 0 => false,
        _ => sys::drop_cached_pages(fd, 0, 0).is_ok(),
    }
}

/// Write the file's dirty pages to the device, then drop its clean cached
/// pages (they may predate direct writes).
fn make_cache_current(fd: std::os::fd::RawFd) -> Result<(), EmuError> {
    sys::fdatasync(fd).map_err(|e| EmuError::io("fdatasync of the file", e))?;
    sys::drop_cached_pages(fd, 0, 0)
        .map_err(|e| EmuError::io("dropping the file's cached pages", e))
}

fn not_open(file_id: u32) -> EmuError {
    EmuError::new(
        ErrorKind::Protocol,
        format!("file {file_id} is not open on this channel"),
    )
}
