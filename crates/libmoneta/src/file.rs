//! Files on the Moneta file system through the direct path (SPEC §3.2,
//! §3.4): the library side of file grants.
//!
//! [`Moneta::open_file`] passes a descriptor the caller opened with open(2)
//! to the control plane, which checks it and keeps a copy: the kernel's
//! permission check is the policy. A [`MonetaFile`] then keeps SPEC §3.2's
//! per-descriptor translation map (file offset → device extent, one entry
//! per extent, holes included) filled on demand by `map-file` (the soft
//! miss); a request spanning extents becomes several device requests. Holes
//! and unwritten extents read as zeros without the device; ranges the
//! device does not serve (shared with another file, inline, encoded) go
//! through the kernel.
//!
//! File system cooperation (SPEC §3.4): a write touching a hole, an
//! unwritten extent or the end of the file first allocates through the
//! kernel, writing zeros in 1 MiB-aligned chunks over the unallocated parts
//! only and never past the write's end, then flushes the file (so the file
//! system's zeros cannot land on direct data later) and forgets the mapping
//! there. The kernel's page cache is not coherent with direct writes: before
//! the kernel writes part of the file, its cached pages there are dropped
//! (it re-reads them from the device), and [`MonetaFile::sync`] drops them
//! all so that a later read(2) sees the direct data.

use crate::client::Moneta;
use moneta_emu::control::{DirectAccess, FileExtent, Request, Response};
use moneta_emu::sys;
use moneta_emu::{EmuError, ErrorKind};
use std::os::fd::RawFd;
use std::sync::RwLock;

/// Allocation granularity of writes to unallocated ranges (SPEC §3.4).
const CHUNK: u64 = 1 << 20;
/// Page granularity of the kernel's cache.
const PAGE: u64 = 4096;
static ZEROS: [u8; CHUNK as usize] = [0; CHUNK as usize];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No blocks: reads as zeros.
    Hole,
    /// Blocks never written: reads as zeros.
    Unwritten,
    /// Data the device serves with this access.
    Direct(DirectAccess),
    /// Data only the kernel serves.
    Kernel,
}

impl Kind {
    fn unallocated(self) -> bool {
        matches!(self, Kind::Hole | Kind::Unwritten)
    }
}

/// One entry of the translation map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    logical: u64,
    len: u64,
    /// Device address of `logical` (meaningless for holes).
    physical: u64,
    kind: Kind,
}

impl Segment {
    fn end(&self) -> u64 {
        self.logical + self.len
    }

    /// The part inside `[from, to)` (which must overlap it).
    fn clip(&self, from: u64, to: u64) -> Segment {
        let start = self.logical.max(from);
        Segment {
            logical: start,
            len: self.end().min(to) - start,
            physical: self.physical + (start - self.logical),
            kind: self.kind,
        }
    }

    /// Whether `next` continues this segment in the file and on the device.
    fn continued_by(&self, next: &Segment) -> bool {
        self.end() == next.logical
            && self.kind == next.kind
            && (self.kind.unallocated() || self.physical + self.len == next.physical)
    }

    fn from_extent(e: &FileExtent) -> Segment {
        let kind = match (e.unwritten, e.direct) {
            (true, _) => Kind::Unwritten,
            (false, DirectAccess::None) => Kind::Kernel,
            (false, access) => Kind::Direct(access),
        };
        Segment {
            logical: e.logical,
            len: e.len,
            physical: e.physical,
            kind,
        }
    }

    fn hole(from: u64, to: u64) -> Segment {
        Segment {
            logical: from,
            len: to - from,
            physical: 0,
            kind: Kind::Hole,
        }
    }
}

/// How much of a file one soft miss maps (the answer may come in pieces of
/// at most 128 extents).
const MAP_WINDOW_BYTES: u64 = 64 << 20;

/// A file granted to a channel. The caller keeps its descriptor open for as
/// long as it uses this; [`MonetaFile::close`] revokes the grant.
/// Thread-safe: threads may read and write disjoint or overlapping ranges
/// concurrently (overlapping writes land in an unspecified order, as with
/// pwrite).
pub struct MonetaFile {
    file_id: u32,
    channel: u16,
    /// The caller's descriptor (not owned).
    fd: RawFd,
    /// What the descriptor's access mode allows.
    access: DirectAccess,
    /// Size of the block device when the descriptor is the device itself
    /// (whose fstat size is 0).
    device_bytes: Option<u64>,
    block_bytes: u64,
    /// The translation map: sorted, non-overlapping, gaps unknown.
    map: RwLock<Vec<Segment>>,
    /// Direct writes share it; the kernel's writes (allocation, copy on
    /// write, truncation) take it alone: the kernel rewrites whole pages,
    /// and must not rewrite one a direct write is changing, nor zero a
    /// range another writer just allocated.
    kernel_writes: RwLock<()>,
}

impl Moneta {
    /// Grant this channel the file open on `fd` (SPEC §3.4). `fd` must name
    /// a regular file on the file system on this device (or the device's
    /// block device); its access mode decides what the device allows:
    /// O_RDONLY reads, O_WRONLY writes, O_RDWR both (O_APPEND: reads only,
    /// appends go through the file system). The caller keeps `fd` open
    /// while it uses the file.
    pub fn open_file(&self, fd: RawFd) -> Result<MonetaFile, EmuError> {
        let st = sys::fstat(fd).map_err(|e| EmuError::io("fstat of the file", e))?;
        match self.call_with_fd(Request::OpenFile {}, Some(fd))? {
            Response::FileOpened {
                file_id,
                size_bytes,
                block_bytes,
                access,
            } => Ok(MonetaFile {
                file_id,
                channel: self.info().channel,
                fd,
                access,
                device_bytes: (st.st_mode & libc::S_IFMT == libc::S_IFBLK).then_some(size_bytes),
                block_bytes: block_bytes.max(1),
                map: RwLock::new(Vec::new()),
                kernel_writes: RwLock::new(()),
            }),
            other => Err(unexpected(other)),
        }
    }
}

impl MonetaFile {
    /// The file's id on its channel.
    pub fn id(&self) -> u32 {
        self.file_id
    }

    /// What the device allows on this file's data.
    pub fn access(&self) -> DirectAccess {
        self.access
    }

    /// Current size (the file system's, asked each time).
    pub fn len(&self) -> Result<u64, EmuError> {
        match self.device_bytes {
            Some(bytes) => Ok(bytes),
            None => sys::file_len(self.fd).map_err(|e| EmuError::io("fstat of the file", e)),
        }
    }

    pub fn is_empty(&self) -> Result<bool, EmuError> {
        Ok(self.len()? == 0)
    }

    /// Like pread: up to `buf.len()` bytes at `offset`, short at the end of
    /// the file, 0 past it.
    pub fn read_at(&self, m: &Moneta, buf: &mut [u8], offset: u64) -> Result<usize, EmuError> {
        self.check_channel(m)?;
        let size = self.len()?;
        if offset >= size || buf.is_empty() {
            return Ok(0);
        }
        let n = (size - offset).min(buf.len() as u64);
        for s in self.segments(m, offset, offset + n)? {
            let piece = &mut buf[(s.logical - offset) as usize..][..s.len as usize];
            match s.kind {
                Kind::Hole | Kind::Unwritten => piece.fill(0),
                Kind::Direct(_) => m.read_mapped(s.physical, piece)?,
                Kind::Kernel => {
                    let got = sys::pread_full(self.fd, piece, s.logical)
                        .map_err(|e| EmuError::io("pread of the file", e))?;
                    piece[got..].fill(0);
                }
            }
        }
        Ok(n as usize)
    }

    /// Like pwrite: all of `buf` at `offset`, extending the file if it ends
    /// past the end. Unallocated parts are allocated through the kernel
    /// first (SPEC §3.4); the data itself goes to the device directly.
    pub fn write_at(&self, m: &Moneta, buf: &[u8], offset: u64) -> Result<usize, EmuError> {
        self.check_channel(m)?;
        if buf.is_empty() {
            return Ok(0);
        }
        let end = offset.checked_add(buf.len() as u64).ok_or_else(|| {
            EmuError::new(ErrorKind::Request, "write range overflows the file offset")
        })?;
        self.allocate(m, offset, end)?;
        // On a read-only grant too: the device, not the library, enforces
        // the permission (and refuses). The kernel takes what is shared
        // with another file (it copies on write), data the device does not
        // serve, and a range another writer punched meanwhile.
        let direct = |s: &Segment| matches!(s.kind, Kind::Direct(a) if a.can_write() || !self.access.can_write());
        let shared = self.kernel_writes.read().expect("kernel writes");
        let segments = self.segments(m, offset, end)?;
        if segments.iter().all(direct) {
            for s in &segments {
                let piece = &buf[(s.logical - offset) as usize..][..s.len as usize];
                m.write_mapped(s.physical, piece)?;
            }
            return Ok(buf.len());
        }
        drop(shared);
        let _alone = self.kernel_writes.write().expect("kernel writes");
        for s in self.segments(m, offset, end)? {
            let piece = &buf[(s.logical - offset) as usize..][..s.len as usize];
            if direct(&s) {
                m.write_mapped(s.physical, piece)?;
            } else {
                self.kernel_write(piece, s.logical)?;
            }
        }
        // The data must reach the medium before a direct read sees it, and
        // copy on write moved it.
        self.flush()?;
        self.invalidate(offset, end);
        Ok(buf.len())
    }

    /// Coherency after direct writes (SPEC §3.4): drop the kernel's cached
    /// pages of the file, so a later read(2) sees what the device holds.
    pub fn sync(&self, m: &Moneta) -> Result<(), EmuError> {
        self.check_channel(m)?;
        sys::drop_cached_pages(self.fd, 0, 0)
            .map_err(|e| EmuError::io("dropping the file's cached pages", e))
    }

    /// Truncate or extend through the kernel; the mapping past the new end
    /// is forgotten, and the grants of blocks a truncation freed revoked.
    pub fn set_len(&self, m: &Moneta, len: u64) -> Result<(), EmuError> {
        self.check_channel(m)?;
        let _alone = self.kernel_writes.write().expect("kernel writes");
        let old = self.len()?;
        // The file system zeroes the rest of the block at the new end
        // through its page cache: it must start from the device's data, and
        // its zeros must reach the device before a direct write there.
        self.sync(m)?;
        sys::ftruncate(self.fd, len).map_err(|e| EmuError::io("ftruncate of the file", e))?;
        self.flush()?;
        let kept = old.min(len) / self.block_bytes * self.block_bytes;
        self.invalidate(kept, u64::MAX);
        if old > kept {
            // A fresh map of the cut range replaces the daemon's grants there.
            self.fetch(m, kept, old)?;
        }
        Ok(())
    }

    /// The kernel changed the file behind the library's back (an O_APPEND
    /// write, fallocate): its data must reach the device, and the map is
    /// forgotten, to be asked again on the next access.
    pub fn refresh(&self, m: &Moneta) -> Result<(), EmuError> {
        self.check_channel(m)?;
        let _alone = self.kernel_writes.write().expect("kernel writes");
        self.flush()?;
        self.invalidate(0, u64::MAX);
        Ok(())
    }

    /// [`MonetaFile::sync`], then revoke the grant (the caller still owns
    /// and closes the descriptor).
    pub fn close(self, m: &Moneta) -> Result<(), EmuError> {
        self.sync(m)?;
        match m.call_with_fd(
            Request::CloseFile {
                file_id: self.file_id,
            },
            None,
        )? {
            Response::FileClosed { .. } => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    fn check_channel(&self, m: &Moneta) -> Result<(), EmuError> {
        if m.info().channel == self.channel {
            Ok(())
        } else {
            Err(EmuError::new(
                ErrorKind::Request,
                format!(
                    "file {} was opened on channel {}, not {}",
                    self.file_id,
                    self.channel,
                    m.info().channel
                ),
            ))
        }
    }

    fn flush(&self) -> Result<(), EmuError> {
        sys::fdatasync(self.fd).map_err(|e| EmuError::io("fdatasync of the file", e))
    }

    /// Write through the kernel, which first re-reads from the device the
    /// pages it only partly overwrites (its cached copies may predate
    /// direct writes).
    fn kernel_write(&self, buf: &[u8], offset: u64) -> Result<(), EmuError> {
        let from = offset / PAGE * PAGE;
        let to = (offset + buf.len() as u64).div_ceil(PAGE) * PAGE;
        sys::drop_cached_pages(self.fd, from, to - from)
            .map_err(|e| EmuError::io("dropping the file's cached pages", e))?;
        sys::pwrite_all(self.fd, buf, offset).map_err(|e| EmuError::io("pwrite of the file", e))
    }

    /// Make `[offset, end)` written blocks inside the file (SPEC §3.4).
    fn allocate(&self, m: &Moneta, offset: u64, end: u64) -> Result<(), EmuError> {
        if end <= self.len()?
            && self
                .segments(m, offset, end)?
                .iter()
                .all(|s| !s.kind.unallocated())
        {
            return Ok(());
        }
        let _alone = self.kernel_writes.write().expect("kernel writes");
        let size = self.len()?;
        let from = offset / CHUNK * CHUNK;
        let to = end.div_ceil(CHUNK).saturating_mul(CHUNK).min(size.max(end));
        // A fresh map (FIEMAP flushes the file first), so a hole is one.
        self.invalidate(from, to);
        let mut fills: Vec<(u64, u64)> = Vec::new();
        for s in self.segments(m, from, to)? {
            let start = if s.kind.unallocated() {
                s.logical
            } else {
                s.logical.max(size)
            };
            if start >= s.end() {
                continue;
            }
            match fills.last_mut() {
                Some(last) if last.1 == start => last.1 = s.end(),
                _ => fills.push((start, s.end())),
            }
        }
        if to > size && !fills.is_empty() {
            // Extending, the file system also zeroes the rest of the block
            // at the old end, through its cache: it must re-read that block.
            let eof_page = size / PAGE * PAGE;
            sys::drop_cached_pages(self.fd, eof_page, to - eof_page)
                .map_err(|e| EmuError::io("dropping the file's cached pages", e))?;
        }
        for &(a, b) in &fills {
            let mut at = a;
            while at < b {
                let n = (b - at).min(CHUNK);
                self.kernel_write(&ZEROS[..n as usize], at)?;
                at += n;
            }
        }
        if !fills.is_empty() {
            self.flush()?;
            self.invalidate(from, to);
        }
        Ok(())
    }

    /// The map of `[from, to)`, in order and without gaps, asking the
    /// control plane for what the map lacks (soft misses).
    fn segments(&self, m: &Moneta, from: u64, to: u64) -> Result<Vec<Segment>, EmuError> {
        loop {
            match self.lookup(from, to) {
                Ok(segments) => return Ok(segments),
                Err((a, b)) => {
                    // A soft miss maps a window from the gap on (up to the
                    // end of the file), not just this request: random
                    // accesses would otherwise ask the kernel every time.
                    // The window starts at the gap, so an answer cut short
                    // (128 extents) is continued, never asked again.
                    let size = self.len()?.div_ceil(self.block_bytes) * self.block_bytes;
                    let end = b.max(a.saturating_add(MAP_WINDOW_BYTES).min(size));
                    self.fetch(m, a, end)?
                }
            }
        }
    }

    /// The map of `[from, to)`, or the first gap in it.
    fn lookup(&self, from: u64, to: u64) -> Result<Vec<Segment>, (u64, u64)> {
        let map = self.map.read().expect("map");
        let mut out = Vec::new();
        let mut at = from;
        let mut i = map.partition_point(|s| s.end() <= from);
        while at < to {
            match map.get(i) {
                Some(s) if s.logical <= at => {
                    out.push(s.clip(at, to));
                    at = s.end().min(to);
                    i += 1;
                }
                next => return Err((at, next.map_or(to, |s| s.logical.min(to)))),
            }
        }
        Ok(out)
    }

    /// A soft miss: map `[from, to)` (or its first part) through the control plane.
    fn fetch(&self, m: &Moneta, from: u64, to: u64) -> Result<(), EmuError> {
        m.count_soft_miss();
        let request = Request::MapFile {
            file_id: self.file_id,
            offset: from,
            len: to - from,
        };
        let (end, extents) = match m.call_with_fd(request, None)? {
            Response::FileExtents { end, extents } => (end, extents),
            other => return Err(unexpected(other)),
        };
        if end <= from || end > to {
            return Err(EmuError::new(
                ErrorKind::Protocol,
                format!("map-file of [{from}, {to}) answered up to {end}"),
            ));
        }
        self.insert(from, end, &extents);
        Ok(())
    }

    /// Replace the map of `[from, to)` with `extents` (holes between them).
    fn insert(&self, from: u64, to: u64, extents: &[FileExtent]) {
        let mut fresh = Vec::new();
        let mut at = from;
        for e in extents {
            let s = Segment::from_extent(e);
            if s.end() <= at || s.logical >= to {
                continue;
            }
            let s = s.clip(at, to);
            if s.logical > at {
                fresh.push(Segment::hole(at, s.logical));
            }
            at = s.end();
            fresh.push(s);
        }
        if at < to {
            fresh.push(Segment::hole(at, to));
        }
        let mut map = self.map.write().expect("map");
        let first = map.partition_point(|s| s.end() <= from);
        let last = map.partition_point(|s| s.logical < to);
        let mut replacement = Vec::with_capacity(fresh.len() + 2);
        if first < last && map[first].logical < from {
            replacement.push(map[first].clip(map[first].logical, from));
        }
        replacement.extend(fresh);
        if first < last && map[last - 1].end() > to {
            replacement.push(map[last - 1].clip(to, map[last - 1].end()));
        }
        map.splice(first..last, replacement);
        // Merge what continues in the file and on the device, so a request
        // spanning extents that lie back to back is one device request.
        let mut merged: Vec<Segment> = Vec::with_capacity(map.len());
        for s in map.drain(..) {
            match merged.last_mut() {
                Some(prev) if prev.continued_by(&s) => prev.len += s.len,
                _ => merged.push(s),
            }
        }
        *map = merged;
    }

    /// Forget every map entry overlapping `[from, to)`.
    fn invalidate(&self, from: u64, to: u64) {
        self.map
            .write()
            .expect("map")
            .retain(|s| s.end() <= from || s.logical >= to);
    }
}

fn unexpected(reply: Response) -> EmuError {
    EmuError::new(ErrorKind::Protocol, format!("unexpected reply {reply:?}"))
}
