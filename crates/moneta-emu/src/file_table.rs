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
//!   says so for any process): every holder's grants from the changed
//!   offset on are revoked, the device applies the removal before the call
//!   may proceed, and the inode is *changing* until the change ends.
//! - While an inode is changing, a soft miss waits (bounded) rather than
//!   read extents the change is about to free; a soft miss whose FIEMAP
//!   raced with a revocation (the inode's generation moved) starts again.
//!   Grants and revocations are applied to the device under the table's
//!   lock, so the device and the OS's copy never disagree.
//! - A file some process maps (`mmap`) is *mapped*: all its records are
//!   revoked, its page cache is made current, and every channel is told to
//!   use the kernel for it (SPEC §3.4's "switch such files to the
//!   system-call path") until no process maps it any more (checked in
//!   /proc, so forks, exits and programs outside the shim count too).
//!
//! Each holder channel's LAYOUT EPOCH word is bumped on every revocation,
//! so libraries drop cached translation maps (coherency; protection is the
//! device's). The daemon keeps a descriptor of every held file, so even an
//! unlinked file's blocks stay allocated until its records are gone.

use crate::control::{DirectAccess, FileExtent};
use crate::engine::Engine;
use crate::error::{EmuError, ErrorKind};
use crate::files::{GrantedFile, InodeId};
use crate::protection::Update;
use crate::sys;
use std::collections::{BTreeSet, HashMap};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Longest a soft miss waits for a layout change to end before it answers
/// "use the kernel" for the range (never a stale grant).
const CHANGE_WAIT: Duration = Duration::from_secs(5);
/// A layout change reported by the kernel for a thread whose completion
/// never arrived (the call failed, so nothing was freed) stops blocking
/// soft misses after this long.
const THREAD_CHANGE_EXPIRY: Duration = Duration::from_secs(2);
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

#[derive(Default)]
struct InodeState {
    /// (channel, file id) of every grant of this inode.
    holders: BTreeSet<(u16, u32)>,
    /// Layout changes in progress.
    changes: Vec<(ChangeOwner, Instant)>,
    mapped: Option<Mapped>,
    /// Bumped by every revocation.
    generation: u64,
}

impl InodeState {
    fn unused(&self) -> bool {
        self.holders.is_empty() && self.changes.is_empty() && self.mapped.is_none()
    }

    fn expire_changes(&mut self, now: Instant) {
        self.changes.retain(|(owner, since)| {
            !matches!(owner, ChangeOwner::Thread(_))
                || now.duration_since(*since) < THREAD_CHANGE_EXPIRY
        });
    }
}

#[derive(Default)]
struct Table {
    files: HashMap<(u16, u32), GrantedFile>,
    inodes: HashMap<InodeId, InodeState>,
}

/// Statistics for `moneta stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileTableStats {
    pub files_open: u64,
    pub inodes_held: u64,
    pub inodes_mapped: u64,
    pub layout_changes: u64,
    pub revocations: u64,
    pub soft_miss_waits: u64,
}

/// Every channel's file grants, by inode.
pub struct FileTable {
    engine: Arc<Engine>,
    table: Mutex<Table>,
    changed: Condvar,
    stats: Mutex<FileTableStats>,
}

impl FileTable {
    pub fn new(engine: Arc<Engine>) -> FileTable {
        FileTable {
            engine,
            table: Mutex::new(Table::default()),
            changed: Condvar::new(),
            stats: Mutex::new(FileTableStats::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().expect("file table")
    }

    pub fn stats(&self) -> FileTableStats {
        let t = self.lock();
        FileTableStats {
            files_open: t.files.len() as u64,
            inodes_held: t.inodes.values().filter(|s| !s.holders.is_empty()).count() as u64,
            inodes_mapped: t.inodes.values().filter(|s| s.mapped.is_some()).count() as u64,
            ..*self.stats.lock().expect("stats")
        }
    }

    /// Take a file opened for `(channel, file_id)`.
    pub fn open(&self, channel: u16, file_id: u32, file: GrantedFile) {
        let mut t = self.lock();
        t.inodes
            .entry(file.inode())
            .or_default()
            .holders
            .insert((channel, file_id));
        t.files.insert((channel, file_id), file);
    }

    /// The soft miss (SPEC §3.2): the file's extents over
    /// `[offset, offset + len)` (or its first part: the returned end), with records
    /// installed for what the channel may access directly. While the file
    /// is mapped, or while a layout change does not end within
    /// [`CHANGE_WAIT`], the answer grants nothing (the client uses the
    /// kernel there).
    pub fn map(
        &self,
        channel: u16,
        file_id: u32,
        offset: u64,
        len: u64,
    ) -> Result<(u64, Vec<FileExtent>), EmuError> {
        let capacity = self.engine.config().device.capacity_bytes;
        let deadline = Instant::now() + CHANGE_WAIT;
        let mut waited = false;
        loop {
            let inode = self
                .lock()
                .files
                .get(&(channel, file_id))
                .ok_or_else(|| not_open(file_id))?
                .inode();
            self.recheck_mapped(inode);
            let mut t = self.lock();
            let file = t
                .files
                .get(&(channel, file_id))
                .ok_or_else(|| not_open(file_id))?;
            let reader = file.extent_reader()?;
            let now = Instant::now();
            let st = t.inodes.entry(inode).or_default();
            st.expire_changes(now);
            if !st.changes.is_empty() && now < deadline {
                if !waited {
                    waited = true;
                    self.stats.lock().expect("stats").soft_miss_waits += 1;
                }
                let wait = (deadline - now).min(Duration::from_millis(50));
                drop(self.changed.wait_timeout(t, wait).expect("file table"));
                continue;
            }
            // Past the deadline with a change still going on: no grant.
            let kernel_only = st.mapped.is_some() || !st.changes.is_empty();
            let generation = st.generation;
            drop(t);
            let (extents, covered) = reader.read_extents(offset, len, capacity)?;
            drop(reader);
            if kernel_only {
                // Always safe: nothing is installed.
                let extents = extents
                    .into_iter()
                    .map(|e| FileExtent {
                        direct: DirectAccess::None,
                        ..e
                    })
                    .collect();
                return Ok((covered, extents));
            }
            let mut t = self.lock();
            let st = t.inodes.entry(inode).or_default();
            if st.generation != generation || st.mapped.is_some() || !st.changes.is_empty() {
                // A revocation raced with the FIEMAP: its answer may name
                // blocks the file is losing.
                continue;
            }
            let file = t
                .files
                .get_mut(&(channel, file_id))
                .ok_or_else(|| not_open(file_id))?;
            let (extents, updates) = file.grant(channel, offset, covered, extents)?;
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
    ) -> Option<crate::control::Extent> {
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
            if st.unused() {
                t.inodes.remove(&inode);
            }
        }
        drop(t);
        drop(file);
        Ok(())
    }

    /// A layout change of `inode` from byte `from` on is about to happen:
    /// revoke every channel's grants there (applied by the device before
    /// this returns) and hold soft misses until [`FileTable::end_change`].
    pub fn begin_change(
        &self,
        inode: InodeId,
        owner: ChangeOwner,
        from: u64,
    ) -> Result<(), EmuError> {
        let mut t = self.lock();
        let Table { files, inodes } = &mut *t;
        let st = inodes.entry(inode).or_default();
        st.changes.push((owner, Instant::now()));
        st.generation += 1;
        let revoked = self.revoke(files, st, from)?;
        let mut stats = self.stats.lock().expect("stats");
        stats.layout_changes += 1;
        stats.revocations += revoked;
        Ok(())
    }

    /// The change `owner` began is over (or its owner is gone).
    pub fn end_change(&self, inode: InodeId, owner: ChangeOwner) {
        let mut t = self.lock();
        if let Some(st) = t.inodes.get_mut(&inode) {
            if let Some(i) = st.changes.iter().position(|(o, _)| *o == owner) {
                st.changes.remove(i);
            }
            if st.unused() {
                t.inodes.remove(&inode);
            }
        }
        self.changed.notify_all();
    }

    /// Every change a thread of the kernel's reports had in progress on
    /// `inode` is over (its next event on the inode proves it).
    pub fn end_thread_changes(&self, inode: InodeId, tid: i32) {
        self.end_change(inode, ChangeOwner::Thread(tid));
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
        {
            let mut t = self.lock();
            let Table { files, inodes } = &mut *t;
            let st = inodes.entry(inode).or_default();
            st.generation += 1;
            let revoked = self.revoke(files, st, 0)?;
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
        for (channel, _) in &st.holders {
            self.bump_epoch(*channel);
        }
        if st.unused() {
            t.inodes.remove(&inode);
        }
        self.changed.notify_all();
    }

    /// A session ended: revoke and drop its files, end its changes.
    pub fn end_session(&self, channel: u16, session: u64, file_ids: &BTreeSet<u32>) {
        for id in file_ids {
            let _ = self.close(channel, *id);
        }
        let mut t = self.lock();
        t.inodes.retain(|_, st| {
            st.changes.retain(
                |(o, _)| !matches!(o, ChangeOwner::Session { session: s, .. } if *s == session),
            );
            !st.unused()
        });
        self.changed.notify_all();
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
            self.bump_epoch(channel);
        }
        if !updates.is_empty() {
            self.engine.update_permissions(updates)?;
        }
        Ok(revoked)
    }

    fn bump_epoch(&self, channel: u16) {
        if let Some(m) = self.engine.channel_memory(channel) {
            m.layout_epoch()
                .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        }
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
