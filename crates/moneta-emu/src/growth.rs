//! Growth on the device: direct writes into allocated-but-unwritten
//! extents (SPEC §3.2–3.4, dissertation ch. 4: the kernel allocates and
//! says which blocks, the data goes direct).
//!
//! A file the program preallocated (fallocate, posix_fallocate: what fio,
//! databases and `cp --preallocate` do) has *unwritten* extents: blocks the
//! file owns, which the file system reads as zeros whatever the device
//! holds there. Before this, every write into one went through the kernel,
//! whose write was a reported kernel access of the file: every channel's
//! grants from its offset on were revoked, the cache dropped, the library's
//! map forgotten — the next write mapped again and met the same unwritten
//! extent (fio randwrite on a laid-out file: ~6,000 layout changes,
//! revocations and cache drops per 3 s, 4% direct). The cause of the
//! thrash was the kernel path itself; the cure is not sending those writes
//! there.
//!
//! How an unwritten extent becomes a *growth grant* (all in monetad, under
//! the file table's lock, which every kernel access's report also takes):
//!
//! 1. A soft miss (`map-file`) of a handle that may write first writes the
//!    window's page cache back and waits (both XFS and ext4 convert an
//!    unwritten extent before the page's writeback ends), then FIEMAPs it;
//!    under the lock it checks that no revocation raced (the inode's
//!    generation) and that no page of the window is cached (cachestat),
//!    and grants nothing from a pending kernel access's offset on. An
//!    extent FIEMAP still calls unwritten then holds no one's data: no
//!    cached page, no write in progress (its report would be pending), no
//!    writeback outstanding.
//! 2. Its device blocks are zeroed **on the medium** (not through the
//!    kernel: no page cache, no file-size change, no write a concurrent
//!    writer could lose — the kernel reads the extent as zeros anyway, so
//!    zeroing it changes nothing anyone can see), except where the inode
//!    already has a pending range (another holder's direct data lives
//!    there). The range becomes *pending* on the inode and is granted like
//!    written data (reads and writes direct, for every holder: the other
//!    holders' epochs are bumped so their libraries forget maps that said
//!    "zeros"). A stale or foreign byte never becomes readable: the blocks
//!    held zeros before any grant allowed a read.
//! 3. **Settling** makes pending ranges written in the file system's eyes:
//!    monetad reads the device's bytes and writes them through the kernel
//!    (buffered, clipped to the file's size, so i_size never moves), waits
//!    for the writeback (which converts the extent) and drops those pages.
//!    It writes through a descriptor the kernel opened for a notification
//!    fanotify group (FMODE_NONOTIFY), so settling raises no access event
//!    of its own (the layout watcher's thread settles, and would otherwise
//!    wait for itself). Settling happens, from the accessed offset on,
//!    *after* the grants there are revoked (the device has applied it, so
//!    no direct write lands under the copy) and before the kernel access
//!    goes on, for:
//!    - every kernel access of the file by any process (read, write,
//!      truncate, fallocate, mmap: the reports of `layout_watch`, and the
//!      shim's own announcements) — so every process sees what was written;
//!      a write or truncation from the block holding the file's end at the
//!      latest (`file_table::end_block`: an append is reported at the
//!      descriptor's position, the kernel writes at the end), so a pending
//!      range the kernel writes over is never settled over its bytes later;
//!    - the shim's fsync/fdatasync of a handle that mapped a growth extent,
//!      and its sync(2)/syncfs for every such handle of the process (it
//!      announces a layout change of the whole file before the kernel's
//!      sync, so synced data is written data; a sync no shim sees is
//!      covered by the journal below);
//!    - the last holder's close, a session's end, and monetad's stop.
//!
//! A process outside the shim opening the file for writing has it settled
//! at its open (xfs_fsr's and e4defrag's ioctls move blocks without an
//! access event; e4defrag swaps unwritten extents without copying them).
//!
//! A pending range a soft miss cannot grant (the file is on the kernel
//! path for a while: a writer outside the shim, a mapping, cached pages,
//! a layout change under way; or its blocks moved) is answered as data
//! only the kernel serves, never as "unwritten": the library reads an
//! unwritten extent as zeros itself, while the data is on the device. The
//! kernel's access then has it settled (torture scenario
//! `growth-outside-writer`; the gate's XFS seed 420030 and ext4 seed
//! 520032 read such zeros).
//!
//! A block freed under a pending range (reported by the block-free
//! tracepoints) is forgotten, never settled: its bytes may be another
//! file's by then.
//!
//! **Durable pending ranges.** A pending range's data is on the medium
//! (the image's page cache, which outlives monetad) but the file system
//! reads it as zeros until it is settled. So before a growth grant is
//! answered, the range is recorded in a journal next to the image
//! ([`Journal`]: the file's handle — `name_to_handle_at`, which names the
//! inode and its generation across remounts — the logical range and the
//! medium address), written and `fdatasync`ed; each settle and each freed
//! pending block is recorded too. When monetad starts on that file system
//! again (`moneta up` after a crash), before it watches or grants anything,
//! it replays the journal and settles what is still recorded — **only where
//! the file (opened by its handle: a deleted or reused inode fails) still
//! maps those very medium blocks at those offsets as unwritten** (FIEMAP).
//! Anywhere else the range is left alone: a block written since holds
//! someone's written data, a block moved or freed is not the file's. So an
//! fsync through any handle or process, `sync(2)` or `syncfs`, followed by
//! a SIGKILL of monetad, loses nothing: the data is on the medium and the
//! record says where it belongs. Growth grants are on by default
//! (`MONETA_GROWTH=0` turns them off) wherever monetad serves an image,
//! can keep the journal, and can open files by handle at start.
//!
//! **Growth into holes** (on by default; `MONETA_GROWTH_HOLES=0` turns it
//! off): a client's write inside the file's size that meets only holes asks
//! `allocate-file` for the aligned 1 MiB chunk(s) around it (moneta-client
//! `ALLOCATE_CHUNK_BYTES`, SPEC §3.4); monetad has the file system allocate the range
//! (`fallocate(FALLOC_FL_KEEP_SIZE)` through the quiet descriptor: no byte,
//! size or page anyone can see changes, no access event), and the soft miss
//! that follows makes the new unwritten extents growth grants as above
//! (zeroed on the medium first: the blocks may be a deleted file's).
//!
//! Writes past the end of a file still go through the kernel (the shim's
//! `new-or-growing-file` reason), and so do writes into holes without
//! growth into holes (`hole`): the user's guide says why past the end is
//! harder (the size must move after the data, and pending ranges past the
//! end must outlive settles while in flight).

use crate::medium::Medium;
use moneta_abi::error::EmuError;
use moneta_abi::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// Whether growth grants are wanted: on unless `MONETA_GROWTH` is `0`,
/// `off` or `no`.
pub fn enabled() -> bool {
    !matches!(
        std::env::var("MONETA_GROWTH").as_deref(),
        Ok("0") | Ok("off") | Ok("no")
    )
}

/// Whether growth grants also fill holes for a client's direct write
/// (`allocate-file`, "Growth into holes" above): with growth on, unless
/// `MONETA_GROWTH_HOLES` is `0`, `off` or `no` (on by default: clients
/// allocate a whole 1 MiB chunk per `allocate-file`, so its cost is paid
/// once per chunk, not per write).
pub fn holes_enabled() -> bool {
    !matches!(
        std::env::var("MONETA_GROWTH_HOLES").as_deref(),
        Ok("0") | Ok("off") | Ok("no")
    )
}

/// Free space (as an unprivileged writer sees it) an allocation for a
/// direct write leaves at least: below it the write goes through the
/// kernel, which answers ENOSPC exactly when it would.
pub const ALLOCATE_HEADROOM_BYTES: u64 = 64 << 20;

/// One pending range: file bytes `[logical, logical + len)` whose data is
/// on the device at `physical` but whose extent is still unwritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    pub logical: u64,
    pub physical: u64,
    pub len: u64,
}

impl Pending {
    pub fn end(&self) -> u64 {
        self.logical + self.len
    }
}

/// An inode's pending ranges (sorted by logical offset, disjoint).
#[derive(Debug, Default)]
pub struct PendingSet {
    ranges: Vec<Pending>,
}

impl PendingSet {
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The parts of `[from, to)` not pending yet, in order.
    pub fn missing(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        self.pieces(from, to)
            .into_iter()
            .filter(|p| p.2.is_none())
            .map(|(a, b, _)| (a, b))
            .collect()
    }

    /// `[from, to)` in order as pieces: pending ones with their device
    /// address, and the rest (None).
    pub fn pieces(&self, from: u64, to: u64) -> Vec<(u64, u64, Option<u64>)> {
        let mut out = Vec::new();
        let mut at = from;
        for r in self
            .ranges
            .iter()
            .filter(|r| r.end() > from && r.logical < to)
        {
            if r.logical > at {
                out.push((at, r.logical, None));
            }
            let a = at.max(r.logical);
            let b = r.end().min(to);
            out.push((a, b, Some(r.physical + (a - r.logical))));
            at = b;
        }
        if at < to {
            out.push((at, to, None));
        }
        out
    }

    /// Add a range (callers add only what [`PendingSet::missing`] named).
    pub fn add(&mut self, p: Pending) {
        let i = self.ranges.partition_point(|r| r.logical < p.logical);
        self.ranges.insert(i, p);
    }

    /// Remove and return the parts at or past `from`.
    pub fn take_from(&mut self, from: u64) -> Vec<Pending> {
        let mut taken = Vec::new();
        self.ranges.retain_mut(|r| {
            if r.end() <= from {
                return true;
            }
            if r.logical >= from {
                taken.push(*r);
                return false;
            }
            let cut = from - r.logical;
            taken.push(Pending {
                logical: from,
                physical: r.physical + cut,
                len: r.len - cut,
            });
            r.len = cut;
            true
        });
        taken
    }

    /// Forget the parts whose device bytes lie in `[start, start + len)`
    /// (freed blocks: never settled). Whether any was forgotten.
    pub fn forget_device(&mut self, start: u64, len: u64) -> bool {
        let end = start.saturating_add(len);
        let mut out = Vec::with_capacity(self.ranges.len());
        let mut hit = false;
        for r in self.ranges.drain(..) {
            let (a, b) = (r.physical, r.physical + r.len);
            if b <= start || a >= end {
                out.push(r);
                continue;
            }
            hit = true;
            if a < start {
                out.push(Pending {
                    len: start - a,
                    ..r
                });
            }
            if b > end {
                let cut = end - a;
                out.push(Pending {
                    logical: r.logical + cut,
                    physical: end,
                    len: r.len - cut,
                });
            }
        }
        self.ranges = out;
        hit
    }
}

/// Zero `[addr, addr + len)` on the medium (the blocks of an unwritten
/// extent, before a growth grant lets anyone read them directly).
pub fn zero_on_medium(medium: &Medium, addr: u64, len: u64) -> Result<(), EmuError> {
    const CHUNK: u64 = 1 << 20;
    let zeros = vec![0u8; CHUNK.min(len) as usize];
    let mut at = 0;
    while at < len {
        let n = CHUNK.min(len - at);
        medium
            .write(addr + at, &zeros[..n as usize])
            .map_err(|e| EmuError::io("zeroing an unwritten extent on the medium", e))?;
        at += n;
    }
    Ok(())
}

/// A writable descriptor of the file open on `fd` whose accesses raise no
/// fanotify event (FMODE_NONOTIFY): the kernel opens it for a notification
/// group's FAN_OPEN event, caused here by reopening the file read-only.
/// The call must not run on the layout watcher's thread (the reopen's
/// permission event is answered there).
pub fn quiet_writer(fd: RawFd) -> Result<OwnedFd, EmuError> {
    let flags = (libc::O_RDWR | libc::O_LARGEFILE | libc::O_CLOEXEC) as u32;
    // SAFETY: plain syscall; the result is a new descriptor or -1.
    let g = unsafe {
        libc::fanotify_init(
            libc::FAN_CLASS_NOTIF | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
            flags,
        )
    };
    if g < 0 {
        return Err(EmuError::io(
            "fanotify_init for a settling descriptor",
            std::io::Error::last_os_error(),
        ));
    }
    // SAFETY: a descriptor we just made and own.
    let group = unsafe { OwnedFd::from_raw_fd(g) };
    // SAFETY: marks the inode of `fd` (dirfd with a NULL path).
    let r = unsafe {
        libc::fanotify_mark(
            group.as_raw_fd(),
            libc::FAN_MARK_ADD,
            libc::FAN_OPEN,
            fd,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(EmuError::io(
            "fanotify_mark for a settling descriptor",
            std::io::Error::last_os_error(),
        ));
    }
    let opened = sys::reopen(fd, libc::O_RDONLY)
        .map_err(|e| EmuError::io("reopening a file for its settling descriptor", e))?;
    drop(opened);
    let mut buf = [0u8; 4096];
    // SAFETY: reading event records into our buffer.
    let n = unsafe { libc::read(group.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    let meta_len = std::mem::size_of::<libc::fanotify_event_metadata>();
    let mut found: Option<OwnedFd> = None;
    let mut at = 0usize;
    while n > 0 && at + meta_len <= n as usize {
        // SAFETY: the kernel wrote a whole metadata record at `at`.
        let meta: libc::fanotify_event_metadata =
            unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
        if (meta.event_len as usize) < meta_len {
            break;
        }
        if meta.fd >= 0 {
            // SAFETY: the event's descriptor is ours to own.
            let owned = unsafe { OwnedFd::from_raw_fd(meta.fd) };
            if found.is_none() && same_file(owned.as_raw_fd(), fd) {
                found = Some(owned);
            }
        }
        at += meta.event_len as usize;
    }
    found.ok_or_else(|| {
        EmuError::new(
            moneta_abi::error::ErrorKind::Io,
            "no fanotify event came for the settling descriptor's reopen",
        )
    })
}

fn same_file(a: RawFd, b: RawFd) -> bool {
    match (sys::fstat(a), sys::fstat(b)) {
        (Ok(x), Ok(y)) => x.st_dev == y.st_dev && x.st_ino == y.st_ino,
        _ => false,
    }
}

/// Settle `ranges` (taken from an inode's pending set): write the device's
/// bytes through `quiet` (buffered, clipped to the file's size), wait for
/// the writeback, which makes the extents written, and drop those pages.
/// The caller has revoked every grant over them (the device applied it).
pub fn settle(medium: &Medium, quiet: RawFd, ranges: &[Pending]) -> Result<u64, EmuError> {
    if ranges.is_empty() {
        return Ok(0);
    }
    let size = sys::file_len(quiet).map_err(|e| EmuError::io("fstat while settling", e))?;
    const CHUNK: u64 = 1 << 20;
    let mut buf = vec![0u8; CHUNK as usize];
    let mut bytes = 0;
    for r in ranges {
        let end = r.end().min(size);
        let mut at = r.logical;
        while at < end {
            let n = CHUNK.min(end - at);
            let piece = &mut buf[..n as usize];
            medium
                .read(r.physical + (at - r.logical), piece)
                .map_err(|e| EmuError::io("reading a pending range from the medium", e))?;
            sys::pwrite_all(quiet, piece, at)
                .map_err(|e| EmuError::io("settling a pending range", e))?;
            at += n;
            bytes += n;
        }
        if end > r.logical {
            sys::write_back_range(quiet, r.logical, end - r.logical)
                .map_err(|e| EmuError::io("writing back a settled range", e))?;
            let _ = sys::drop_cached_pages(quiet, r.logical, end - r.logical);
        }
    }
    Ok(bytes)
}

/// A file's persistent identity: what `name_to_handle_at` returns (it
/// names the inode and its generation, and stays valid across remounts of
/// XFS and ext4), opened again with `open_by_handle_at`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FileHandle {
    kind: i32,
    bytes: Vec<u8>,
}

/// `struct file_handle` with room for MAX_HANDLE_SZ bytes.
#[repr(C)]
struct RawHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; 128],
}

impl FileHandle {
    /// The handle of the file open on `fd`.
    pub fn of(fd: RawFd) -> std::io::Result<FileHandle> {
        let mut raw = RawHandle {
            handle_bytes: 128,
            handle_type: 0,
            f_handle: [0; 128],
        };
        let mut mount_id: libc::c_int = 0;
        // SAFETY: name_to_handle_at with an empty path names `fd` itself;
        // the kernel writes at most `handle_bytes` bytes into `f_handle`.
        let r = unsafe {
            libc::syscall(
                libc::SYS_name_to_handle_at,
                fd,
                c"".as_ptr(),
                &mut raw as *mut RawHandle,
                &mut mount_id as *mut libc::c_int,
                libc::AT_EMPTY_PATH,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = (raw.handle_bytes as usize).min(128);
        Ok(FileHandle {
            kind: raw.handle_type,
            bytes: raw.f_handle[..n].to_vec(),
        })
    }

    /// The file again, opened read-write through any descriptor `mount_fd`
    /// of the same file system (needs CAP_DAC_READ_SEARCH). ESTALE: the
    /// inode is gone (deleted, or its number reused by another file).
    pub fn open(&self, mount_fd: RawFd, flags: i32) -> std::io::Result<OwnedFd> {
        let mut raw = RawHandle {
            handle_bytes: self.bytes.len() as u32,
            handle_type: self.kind,
            f_handle: [0; 128],
        };
        raw.f_handle[..self.bytes.len()].copy_from_slice(&self.bytes);
        // SAFETY: open_by_handle_at reads the handle we built; the result
        // is a new descriptor or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_open_by_handle_at,
                mount_fd,
                &raw as *const RawHandle,
                flags | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just gave us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
    }

    fn key(&self) -> String {
        let hex: String = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}:{hex}", self.kind)
    }

    fn parse(key: &str) -> Option<FileHandle> {
        let (kind, hex) = key.split_once(':')?;
        if hex.len() % 2 != 0 || hex.len() > 256 {
            return None;
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).ok())
            .collect::<Option<Vec<u8>>>()?;
        Some(FileHandle {
            kind: kind.parse().ok()?,
            bytes,
        })
    }
}

/// The durable record of every inode's pending ranges (module header):
/// one line per change of a [`PendingSet`] — `+ H L P N` (added), `- H F`
/// (settled from F on), `f H P N` (medium bytes freed) — each written and
/// `fdatasync`ed before the change takes effect outside monetad. Replaying
/// the lines through a [`PendingSet`] per handle gives what was pending
/// when monetad stopped.
pub struct Journal {
    file: std::fs::File,
    /// Written since it was last cleared.
    written: bool,
}

/// What a journal still records as pending, by file.
pub type Recorded = Vec<(FileHandle, Vec<Pending>)>;

impl Journal {
    /// Open (or create) the journal at `path`; returns it and what it
    /// records as pending (unreadable lines, a torn last one, are skipped).
    pub fn open(path: &std::path::Path) -> Result<(Journal, Recorded), EmuError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => return Err(EmuError::io("reading the growth journal", e)),
        };
        let mut sets: Vec<(String, PendingSet)> = Vec::new();
        for line in text.lines() {
            let w: Vec<&str> = line.split(' ').collect();
            let num = |i: usize| w.get(i).and_then(|x| x.parse::<u64>().ok());
            let Some(&key) = w.get(1) else { continue };
            let at = match sets.iter().position(|(k, _)| k == key) {
                Some(i) => i,
                None => {
                    sets.push((key.to_string(), PendingSet::default()));
                    sets.len() - 1
                }
            };
            let set = &mut sets[at].1;
            match (w[0], num(2), num(3), num(4)) {
                ("+", Some(logical), Some(physical), Some(len)) if len > 0 => {
                    for (a, b) in set.missing(logical, logical.saturating_add(len)) {
                        set.add(Pending {
                            logical: a,
                            physical: physical + (a - logical),
                            len: b - a,
                        });
                    }
                }
                ("-", Some(from), None, None) => {
                    set.take_from(from);
                }
                ("f", Some(physical), Some(len), None) => {
                    set.forget_device(physical, len);
                }
                _ => {}
            }
        }
        let recorded = sets
            .into_iter()
            .filter(|(_, s)| !s.is_empty())
            .filter_map(|(k, s)| Some((FileHandle::parse(&k)?, s.ranges)))
            .collect();
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| EmuError::io("opening the growth journal", e))?;
        Ok((
            Journal {
                file,
                written: true,
            },
            recorded,
        ))
    }

    fn record(&mut self, line: String) -> Result<(), EmuError> {
        use std::io::Write;
        self.written = true;
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| EmuError::io("writing the growth journal", e))
    }

    /// `p` of the file `h` becomes pending (before it is granted).
    pub fn added(&mut self, h: &FileHandle, p: &Pending) -> Result<(), EmuError> {
        self.record(format!(
            "+ {} {} {} {}\n",
            h.key(),
            p.logical,
            p.physical,
            p.len
        ))
    }

    /// The pending ranges of `h` from `from` on are settled.
    pub fn settled(&mut self, h: &FileHandle, from: u64) -> Result<(), EmuError> {
        self.record(format!("- {} {from}\n", h.key()))
    }

    /// The medium bytes `[physical, physical + len)` of `h`'s pending
    /// ranges were freed (never to be settled).
    pub fn forgotten(&mut self, h: &FileHandle, physical: u64, len: u64) -> Result<(), EmuError> {
        self.record(format!("f {} {physical} {len}\n", h.key()))
    }

    /// Nothing is pending anywhere: start the journal afresh.
    pub fn clear(&mut self) -> Result<(), EmuError> {
        if !self.written {
            return Ok(());
        }
        self.written = false;
        self.file
            .set_len(0)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| EmuError::io("clearing the growth journal", e))
    }
}

/// A recovered file's extents over a range, as `(logical, medium address,
/// len, unwritten)`.
pub type ExtentsOf<'a> =
    dyn Fn(&OwnedFd, u64, u64) -> Result<Vec<(u64, u64, u64, bool)>, EmuError> + 'a;

/// What settling a journal's ranges at start did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Bytes written through the kernel (clipped to the files' sizes).
    pub settled_bytes: u64,
    /// Files with something settled.
    pub files: u64,
    /// Recorded bytes left alone: the file is gone, or no longer maps
    /// those blocks there as unwritten.
    pub left_bytes: u64,
}

/// Settle what a journal recorded (monetad's start, before anything on the
/// file system is watched or granted): each file opened by its handle
/// through `mount_fd`; `extents` answers FIEMAP for it as
/// `(logical, medium address, len, unwritten)`. A recorded range is
/// written through the kernel only where the file still maps the very
/// medium blocks recorded there as unwritten.
pub fn recover(
    medium: &Medium,
    mount_fd: RawFd,
    recorded: &Recorded,
    extents: &ExtentsOf<'_>,
) -> Recovery {
    let mut out = Recovery::default();
    for (handle, ranges) in recorded {
        let total: u64 = ranges.iter().map(|r| r.len).sum();
        let fd = match handle.open(mount_fd, libc::O_RDWR) {
            Ok(fd) => fd,
            Err(e) => {
                eprintln!("monetad: growth journal: a file with {total} pending bytes is gone ({e}); nothing to settle");
                out.left_bytes += total;
                continue;
            }
        };
        let mut still = Vec::new();
        for r in ranges {
            let found = match extents(&fd, r.logical, r.len) {
                Ok(x) => x,
                Err(e) => {
                    eprintln!("monetad: growth journal: FIEMAP: {e}");
                    Vec::new()
                }
            };
            for (logical, physical, len, unwritten) in found {
                let a = logical.max(r.logical);
                let b = logical.saturating_add(len).min(r.end());
                if a >= b || !unwritten || physical + (a - logical) != r.physical + (a - r.logical)
                {
                    continue;
                }
                still.push(Pending {
                    logical: a,
                    physical: r.physical + (a - r.logical),
                    len: b - a,
                });
            }
        }
        let kept: u64 = still.iter().map(|r| r.len).sum();
        out.left_bytes += total - kept;
        if still.is_empty() {
            continue;
        }
        match settle(medium, fd.as_raw_fd(), &still).and_then(|n| {
            sys::fdatasync(fd.as_raw_fd())
                .map(|()| n)
                .map_err(|e| EmuError::io("fdatasync after settling", e))
        }) {
            Ok(n) => {
                out.settled_bytes += n;
                out.files += 1;
            }
            Err(e) => eprintln!("monetad: growth journal: settling {kept} bytes: {e}"),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(logical: u64, physical: u64, len: u64) -> Pending {
        Pending {
            logical,
            physical,
            len,
        }
    }

    #[test]
    fn pending_ranges_split_and_forget() {
        let mut s = PendingSet::default();
        assert_eq!(s.missing(0, 100), [(0, 100)]);
        s.add(p(10, 1010, 10));
        s.add(p(40, 2040, 20));
        assert_eq!(s.missing(0, 100), [(0, 10), (20, 40), (60, 100)]);
        assert_eq!(s.missing(12, 18), []);
        assert_eq!(
            s.pieces(5, 45),
            [
                (5, 10, None),
                (10, 20, Some(1010)),
                (20, 40, None),
                (40, 45, Some(2040))
            ]
        );
        assert_eq!(s.take_from(50), [p(50, 2050, 10)]);
        assert_eq!(s.missing(0, 100), [(0, 10), (20, 40), (50, 100)]);
        assert!(s.forget_device(1012, 2));
        assert_eq!(s.ranges, [p(10, 1010, 2), p(14, 1014, 6), p(40, 2040, 10)]);
        assert!(!s.forget_device(5000, 10));
        assert_eq!(s.take_from(0).len(), 3);
        assert!(s.is_empty());
    }

    #[test]
    fn the_journal_replays_to_what_is_still_pending() {
        let dir = std::env::temp_dir().join(format!("growth-journal-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let h = FileHandle {
            kind: 1,
            bytes: vec![0xab, 0x01, 0xff],
        };
        let g = FileHandle {
            kind: 2,
            bytes: vec![7],
        };
        {
            let (mut j, recorded) = Journal::open(&dir).unwrap();
            assert!(recorded.is_empty());
            j.added(&h, &p(0, 1000, 100)).unwrap();
            j.added(&h, &p(200, 5000, 100)).unwrap();
            j.added(&g, &p(0, 9000, 10)).unwrap();
            j.settled(&h, 250).unwrap();
            j.forgotten(&h, 1010, 10).unwrap();
            j.settled(&g, 0).unwrap();
        }
        // A torn last line is skipped.
        std::fs::OpenOptions::new()
            .append(true)
            .open(&dir)
            .and_then(|mut f| std::io::Write::write_all(&mut f, b"+ 1:ab01ff 900 9"))
            .unwrap();
        let (mut j, recorded) = Journal::open(&dir).unwrap();
        assert_eq!(
            recorded,
            [(
                h.clone(),
                vec![p(0, 1000, 10), p(20, 1020, 80), p(200, 5000, 50)]
            )]
        );
        j.clear().unwrap();
        assert!(Journal::open(&dir).unwrap().1.is_empty());
        assert_eq!(FileHandle::parse(&h.key()), Some(h));
        assert_eq!(FileHandle::parse("1:abc"), None);
        let _ = std::fs::remove_file(&dir);
    }
}
