//! File grants from the kernel (SPEC §3.4, DESIGN "Processes in emulation"):
//! the trusted side of `open-file`, `map-file` and `close-file`.
//!
//! A client proves its right to a file the Moneta-D way: it opens the file
//! with open(2) on the file system that lives on this device (a real XFS or
//! ext4 on a loop device over the daemon's image), so the kernel checks its
//! rights, and passes the descriptor. The descriptor must name a regular
//! file on such a loop device, or that block device itself; its access mode
//! decides the permission bits. The file's extents
//! come from FIEMAP (SPEC §3.4's "function that extracts a file's
//! extents"): each written extent becomes a permission record of the
//! channel, keyed per (channel, file) so the table merges physically
//! adjacent extents of the file (SPEC §3.3). The daemon keeps the descriptor
//! and the extents it granted (the OS's copy of the records): a hard miss
//! re-installs from that copy, closing the file removes its records.
//!
//! Medium byte X is block-device byte X − the loop device's offset: a
//! buffered loop device and the daemon's shared mapping of the image go
//! through the same page cache, so what the file system writes is what the
//! device reads and the other way round.

use crate::protection::{RecordSpec, Update, READ, WRITE};
use crate::sys::{self, FiemapExtent};
use moneta_abi::control::{DirectAccess, Extent, FileExtent};
use moneta_abi::error::{EmuError, ErrorKind};
use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Files one session may hold open (each keeps a descriptor in the daemon).
pub const MAX_OPEN_FILES: usize = 1024;

/// Extent flags that rule out direct access: no blocks yet, data not stored
/// plainly in whole blocks of the device, or a location the file system
/// does not vouch for. Such ranges go through the kernel.
const NOT_DIRECT: u32 = sys::FIEMAP_EXTENT_UNKNOWN
    | sys::FIEMAP_EXTENT_DELALLOC
    | sys::FIEMAP_EXTENT_ENCODED
    | sys::FIEMAP_EXTENT_DATA_ENCRYPTED
    | sys::FIEMAP_EXTENT_NOT_ALIGNED
    | sys::FIEMAP_EXTENT_DATA_INLINE
    | sys::FIEMAP_EXTENT_DATA_TAIL;

use moneta_abi::InodeId;

/// The direct access a record with permission bits `perms` allows.
fn direct_access(perms: u8) -> DirectAccess {
    match (perms & READ != 0, perms & WRITE != 0) {
        (false, false) => DirectAccess::None,
        (true, false) => DirectAccess::Read,
        (false, true) => DirectAccess::Write,
        (true, true) => DirectAccess::ReadWrite,
    }
}

/// The permission bits of the records that allow `access`.
fn record_perms(access: DirectAccess) -> u8 {
    match access {
        DirectAccess::None => 0,
        DirectAccess::Read => READ,
        DirectAccess::Write => WRITE,
        DirectAccess::ReadWrite => READ | WRITE,
    }
}

/// `extents` with every part at or past `eof` made kernel-only.
fn clip_to(extents: Vec<FileExtent>, eof: u64) -> Vec<FileExtent> {
    let mut out = Vec::with_capacity(extents.len() + 1);
    for e in extents {
        let end = e.logical.saturating_add(e.len);
        if e.direct == DirectAccess::None || end <= eof {
            out.push(e);
        } else if e.logical >= eof {
            out.push(FileExtent {
                direct: DirectAccess::None,
                ..e
            });
        } else {
            let head = eof - e.logical;
            out.push(FileExtent { len: head, ..e });
            out.push(FileExtent {
                logical: eof,
                physical: e.physical + head,
                len: e.len - head,
                direct: DirectAccess::None,
                ..e
            });
        }
    }
    out
}

/// What `open-file` tells the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    pub size_bytes: u64,
    pub block_bytes: u64,
    pub access: DirectAccess,
}

/// One extent the daemon granted: the OS's copy of its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    logical: u64,
    start: u64,
    len: u64,
    perms: u8,
}

impl Grant {
    fn end(&self) -> u64 {
        self.logical.saturating_add(self.len)
    }

    /// The part inside `[from, to)` (which must overlap it).
    fn clip(&self, from: u64, to: u64) -> Grant {
        let logical = self.logical.max(from);
        Grant {
            logical,
            start: self.start + (logical - self.logical),
            len: self.end().min(to) - logical,
            perms: self.perms,
        }
    }

    /// Whether `next` continues this grant in the file and on the device.
    fn continued_by(&self, next: &Grant) -> bool {
        self.end() == next.logical
            && self.start + self.len == next.start
            && self.perms == next.perms
    }
}

/// Grants in logical order with continuations merged: one form per mapping.
fn coalesce(grants: Vec<Grant>) -> Vec<Grant> {
    let mut out: Vec<Grant> = Vec::with_capacity(grants.len());
    for g in grants {
        match out.last_mut() {
            Some(prev) if prev.continued_by(&g) => prev.len += g.len,
            _ => out.push(g),
        }
    }
    out
}

/// A file (or the device's block device) a channel was granted.
pub struct GrantedFile {
    /// The client's descriptor, duplicated into the daemon: the proof of
    /// permission, and what FIEMAP asks about.
    fd: OwnedFd,
    /// The records' file key: unique per (channel, file).
    key: u64,
    /// Bits the descriptor's access mode allows.
    perms: u8,
    /// Medium address of the block device's byte 0.
    base: u64,
    /// Size of the block device, when the descriptor is the device itself.
    device_bytes: Option<u64>,
    /// The file system's block size (grants end at the block holding EOF).
    block_bytes: u64,
    inode: InodeId,
    grants: BTreeMap<u64, Grant>,
    /// (start, logical) of every grant: the index a hard miss searches.
    by_start: BTreeSet<(u64, u64)>,
}

impl GrantedFile {
    /// Check the descriptor and take it. `images` are the (device, inode)
    /// of the files that carry the medium from byte 0 (the image file, and
    /// the nbdfuse file of a kernel path through the device); `key` the
    /// records' file key.
    pub fn open(
        fd: OwnedFd,
        key: u64,
        images: &[(u64, u64)],
    ) -> Result<(GrantedFile, Opened), EmuError> {
        let raw = fd.as_raw_fd();
        let st = sys::fstat(raw).map_err(|e| EmuError::io("fstat of the descriptor", e))?;
        let flags =
            sys::status_flags(raw).map_err(|e| EmuError::io("fcntl of the descriptor", e))?;
        if flags & libc::O_PATH != 0 {
            return Err(unauthorized(
                "an O_PATH descriptor grants no access to the file's data",
            ));
        }
        let (dev, device_bytes) = match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => (st.st_dev, None),
            libc::S_IFBLK => (st.st_rdev, Some(block_device_bytes(st.st_rdev)?)),
            kind => {
                return Err(unauthorized(format!(
                    "the descriptor names {}, not a regular file or the device's block device",
                    kind_name(kind)
                )))
            }
        };
        if images.is_empty() {
            return Err(unauthorized(
                "this device's medium is anonymous memory, so no file system lives on it \
                 (serve an --image)",
            ));
        }
        let base = device_base(dev, images)?;
        let mut perms = match flags & libc::O_ACCMODE {
            libc::O_RDONLY => READ,
            // The kernel refuses read(2) on a write-only descriptor, so
            // holding one proves no right to read.
            libc::O_WRONLY => WRITE,
            libc::O_RDWR => READ | WRITE,
            _ => return Err(unauthorized("the descriptor's access mode is invalid")),
        };
        if flags & libc::O_APPEND != 0 {
            // Appends go through the file system (SPEC §3.2), and an
            // append-only file may be opened for writing only with
            // O_APPEND: a direct write could overwrite its contents.
            perms &= READ;
        }
        if perms == 0 {
            return Err(unauthorized(
                "a write-only append descriptor allows no direct access (appends go through the file system)",
            ));
        }
        // Coherency (SPEC §3.4): what was written through the kernel, and
        // delayed allocations, reach the medium before the direct path reads.
        sys::fdatasync(raw).map_err(|e| EmuError::io("fdatasync of the file", e))?;
        let opened = Opened {
            size_bytes: device_bytes.unwrap_or(st.st_size as u64),
            block_bytes: st.st_blksize as u64,
            access: direct_access(perms),
        };
        let file = GrantedFile {
            fd,
            key,
            perms,
            base,
            device_bytes,
            block_bytes: (st.st_blksize as u64).max(1),
            inode: InodeId {
                dev: st.st_dev,
                ino: st.st_ino,
            },
            grants: BTreeMap::new(),
            by_start: BTreeSet::new(),
        };
        Ok((file, opened))
    }

    /// The file's identity: grants of the same file on different channels
    /// are revoked together.
    pub fn inode(&self) -> InodeId {
        self.inode
    }

    /// A copy that can answer [`GrantedFile::read_extents`] without the
    /// original (its own descriptor, no grants), so a FIEMAP runs without
    /// holding the table of grants.
    pub fn extent_reader(&self) -> Result<GrantedFile, EmuError> {
        let fd = sys::dup(self.fd.as_raw_fd())
            .map_err(|e| EmuError::io("duplicating the file's descriptor", e))?;
        Ok(GrantedFile {
            fd,
            grants: BTreeMap::new(),
            by_start: BTreeSet::new(),
            ..*self
        })
    }

    /// The size of the block device when the file is the device itself.
    pub fn device_bytes(&self) -> Option<u64> {
        self.device_bytes
    }

    /// The daemon's descriptor of the file (its proof of permission).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// The soft miss, first half (SPEC §3.2): the file's extents
    /// overlapping `[offset, offset + len)` (at most [`sys::FIEMAP_BATCH`])
    /// and the end of the range the answer covers (ask again from there;
    /// ranges without an extent are holes). Changes nothing: the caller
    /// checks that no layout change raced with it, then [`GrantedFile::grant`]s.
    pub fn read_extents(
        &self,
        offset: u64,
        len: u64,
        capacity: u64,
    ) -> Result<(Vec<FileExtent>, u64), EmuError> {
        let end = offset.checked_add(len).filter(|_| len > 0).ok_or_else(|| {
            EmuError::new(
                ErrorKind::Protocol,
                format!("file range [{offset}, +{len}) is empty or overflows"),
            )
        })?;
        match self.device_bytes {
            // The block device itself: one extent, the whole device.
            Some(bytes) => Ok((vec![self.extent(0, 0, bytes, 0, capacity)], end)),
            None => {
                let raw = sys::fiemap(self.fd.as_raw_fd(), offset, len)
                    .map_err(|e| EmuError::io("reading the file's extents (FIEMAP)", e))?;
                let covered = match raw.last() {
                    Some(last)
                        if raw.len() == sys::FIEMAP_BATCH
                            && last.flags & sys::FIEMAP_EXTENT_LAST == 0 =>
                    {
                        last.logical.saturating_add(last.length).min(end)
                    }
                    _ => end,
                };
                if covered <= offset {
                    return Err(EmuError::new(
                        ErrorKind::Io,
                        "FIEMAP returned no extent inside the requested range",
                    ));
                }
                let extents = raw
                    .iter()
                    .filter(|e| e.length > 0)
                    .map(|e: &FiemapExtent| {
                        self.extent(e.logical, e.physical, e.length, e.flags, capacity)
                    })
                    .collect();
                Ok((extents, covered))
            }
        }
    }

    /// The soft miss, second half: make `extents` (a [`GrantedFile::read_extents`]
    /// answer for a request from `offset` covering up to `covered`) this
    /// channel's grants over their span, none at or past `limit` (a
    /// pending layout change's offset). Blocks past the end of the file
    /// (rounded up to its block) are never granted: the file system may
    /// free them without a layout change anyone sees (XFS trims
    /// speculative preallocation in the background). Returns the extents
    /// as the client should see them and the record updates.
    pub fn grant(
        &mut self,
        channel: u16,
        offset: u64,
        covered: u64,
        mut extents: Vec<FileExtent>,
        limit: u64,
    ) -> Result<(Vec<FileExtent>, Vec<Update>), EmuError> {
        let end = self.grant_end(limit)?;
        if end < u64::MAX {
            extents = clip_to(extents, end);
        }
        // FIEMAP tells all about the span of its answer (file systems cut
        // the first extent at the requested offset).
        let span_start = extents.first().map_or(offset, |e| e.logical.min(offset));
        let span_end = extents
            .last()
            .map_or(covered, |e| e.logical.saturating_add(e.len).max(covered));
        let updates = self.replace(channel, span_start, span_end, &extents);
        Ok((extents, updates))
    }

    /// Where grants end: `limit`, or the end of the block holding the end
    /// of the file if that comes first.
    pub fn grant_end(&self, limit: u64) -> Result<u64, EmuError> {
        if self.device_bytes.is_some() {
            return Ok(limit);
        }
        let size =
            sys::file_len(self.fd.as_raw_fd()).map_err(|e| EmuError::io("fstat of the file", e))?;
        Ok(limit.min(size.div_ceil(self.block_bytes) * self.block_bytes))
    }

    /// The medium address of block-device byte `offset`.
    pub fn medium_address(&self, offset: u64) -> u64 {
        self.base.saturating_add(offset)
    }

    /// What the descriptor allows the device to do.
    pub fn access(&self) -> DirectAccess {
        direct_access(self.perms)
    }

    /// Whether the descriptor allows writing the file.
    pub fn may_write(&self) -> bool {
        self.perms & WRITE != 0
    }

    /// Whether some grant allows the device to write the file.
    pub fn has_write_grants(&self) -> bool {
        self.grants.values().any(|g| g.perms & WRITE != 0)
    }

    /// Revoke this channel's grants of the file from byte `from` on (a
    /// layout change there is about to happen): the updates that leave
    /// only the grants before it, or none if nothing was granted there.
    pub fn revoke_from(&mut self, channel: u16, from: u64) -> Vec<Update> {
        self.revoke_range(channel, from, u64::MAX)
    }

    /// The file ranges `[from, to)` whose grants lie on block-device bytes
    /// `[start, start + len)` (none for a grant of the device itself).
    pub fn logical_on_device(&self, start: u64, len: u64) -> Vec<(u64, u64)> {
        if self.device_bytes.is_some() {
            return Vec::new();
        }
        let lo = self.base.saturating_add(start);
        let hi = lo.saturating_add(len);
        self.grants
            .values()
            .filter(|g| g.start < hi && lo < g.start.saturating_add(g.len))
            .map(|g| {
                let from = g.logical + (lo.max(g.start) - g.start);
                let to = g.logical + (hi.min(g.start + g.len) - g.start);
                (from, to)
            })
            .collect()
    }

    /// Revoke this channel's grants of the file over `[from, to)`.
    pub fn revoke_range(&mut self, channel: u16, from: u64, to: u64) -> Vec<Update> {
        if self.take_grants(from, to).is_empty() {
            return Vec::new();
        }
        let mut updates = vec![self.remove(channel)];
        updates.extend(self.grants.values().map(|g| self.record(channel, g)));
        updates
    }

    /// Make `extents` the grants over `[from, to)`: the updates that install
    /// them, or, if the grants there changed (blocks moved or were freed),
    /// that replace all of the file's records.
    fn replace(&mut self, channel: u16, from: u64, to: u64, extents: &[FileExtent]) -> Vec<Update> {
        let old = coalesce(self.take_grants(from, to));
        let fresh = coalesce(
            extents
                .iter()
                .filter(|e| e.direct != DirectAccess::None)
                .map(|e| Grant {
                    logical: e.logical,
                    start: e.physical,
                    len: e.len,
                    perms: record_perms(e.direct),
                })
                .collect(),
        );
        for g in &fresh {
            self.insert(*g);
        }
        let mut updates = Vec::new();
        if old.iter().any(|g| !fresh.contains(g)) {
            updates.push(self.remove(channel));
            updates.extend(self.grants.values().map(|g| self.record(channel, g)));
        } else {
            updates.extend(fresh.iter().map(|g| self.record(channel, g)));
        }
        updates
    }

    /// The hard miss (SPEC §3.2): if this file's grants cover `[addr, addr +
    /// len)` with the access, the covering range (physically adjacent grants
    /// with the same bits, as the table merges them) and the updates that
    /// re-install it.
    pub fn resolve(
        &self,
        channel: u16,
        addr: u64,
        len: u64,
        write: bool,
    ) -> Option<(Extent, Vec<Update>)> {
        let need = if write { WRITE } else { READ };
        let end = addr.checked_add(len)?;
        let &(_, logical) = self.by_start.range(..=(addr, u64::MAX)).next_back()?;
        let first = self.grants[&logical];
        if first.perms & need == 0 || first.start + first.len <= addr {
            return None;
        }
        let mut run = vec![first];
        let mut run_end = first.start + first.len;
        while run_end < end {
            let &(start, logical) = self.by_start.range((run_end, 0)..).next()?;
            let g = self.grants[&logical];
            if start != run_end || g.perms != first.perms {
                return None;
            }
            run_end += g.len;
            run.push(g);
        }
        let extent = Extent {
            start: first.start,
            len: run_end - first.start,
            write: first.perms & WRITE != 0,
        };
        Some((
            extent,
            run.iter().map(|g| self.record(channel, g)).collect(),
        ))
    }

    /// The update that removes all of this file's records.
    pub fn remove(&self, channel: u16) -> Update {
        Update::RemoveFile {
            channel,
            file: self.key,
        }
    }

    /// One reply extent: device address and what the device will allow.
    fn extent(
        &self,
        logical: u64,
        physical: u64,
        len: u64,
        flags: u32,
        capacity: u64,
    ) -> FileExtent {
        let physical = self.base.saturating_add(physical);
        let unwritten = flags & sys::FIEMAP_EXTENT_UNWRITTEN != 0;
        let on_medium = physical.checked_add(len).is_some_and(|e| e <= capacity);
        let mut perms = self.perms;
        if flags & NOT_DIRECT != 0 || !on_medium {
            perms = 0;
        }
        if flags & sys::FIEMAP_EXTENT_SHARED != 0 {
            // Shared with another file (reflink): a direct write would
            // change both, bypassing the file system's copy-on-write. An
            // unwritten one is not grown either (the other file's growth
            // would zero it under this one's data).
            perms &= if unwritten { 0 } else { READ };
        }
        // An unwritten extent carries what a growth grant of it would allow
        // (`crate::growth`); the file table grants it only as such, and
        // answers `none` otherwise.
        if unwritten && perms & WRITE == 0 {
            perms = 0;
        }
        FileExtent {
            logical,
            physical,
            len,
            unwritten,
            direct: direct_access(perms),
        }
    }

    /// Remove the grants' parts inside `[from, to)` and return them, in
    /// logical order.
    fn take_grants(&mut self, from: u64, to: u64) -> Vec<Grant> {
        // Grants do not overlap, so walking down from `to` their ends fall too.
        let keys: Vec<u64> = self
            .grants
            .range(..to)
            .rev()
            .take_while(|(_, g)| g.end() > from)
            .map(|(&k, _)| k)
            .collect();
        let mut inside = Vec::with_capacity(keys.len());
        for k in keys.into_iter().rev() {
            let g = self.unlink(k);
            if g.logical < from {
                self.link(g.clip(g.logical, from));
            }
            if g.end() > to {
                self.link(g.clip(to, g.end()));
            }
            inside.push(g.clip(from, to));
        }
        inside
    }

    /// Add a grant, merged with the grants it continues or that continue it.
    fn insert(&mut self, mut g: Grant) {
        if let Some((&k, prev)) = self.grants.range(..g.logical).next_back() {
            if prev.continued_by(&g) {
                let prev = self.unlink(k);
                g = Grant {
                    len: prev.len + g.len,
                    ..prev
                };
            }
        }
        if let Some(next) = self.grants.get(&g.end()).copied() {
            if g.continued_by(&next) {
                self.unlink(next.logical);
                g.len += next.len;
            }
        }
        self.link(g);
    }

    fn link(&mut self, g: Grant) {
        self.grants.insert(g.logical, g);
        self.by_start.insert((g.start, g.logical));
    }

    fn unlink(&mut self, logical: u64) -> Grant {
        let g = self.grants.remove(&logical).expect("a grant");
        self.by_start.remove(&(g.start, g.logical));
        g
    }

    fn record(&self, channel: u16, g: &Grant) -> Update {
        Update::Install(RecordSpec {
            channel,
            file: self.key,
            start: g.start,
            len: g.len,
            perms: g.perms,
        })
    }
}

fn unauthorized(why: impl Into<String>) -> EmuError {
    EmuError::new(ErrorKind::Unauthorized, why)
}

fn kind_name(kind: libc::mode_t) -> &'static str {
    match kind {
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFIFO => "a pipe",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symbolic link",
        _ => "an object of unknown type",
    }
}

/// sysfs directory of block device `dev`.
fn sysfs_block(dev: libc::dev_t) -> PathBuf {
    PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ))
}

fn read_sysfs_u64(path: &Path) -> Result<u64, EmuError> {
    std::fs::read_to_string(path)
        .map_err(|e| EmuError::io(&format!("reading {}", path.display()), e))?
        .trim()
        .parse()
        .map_err(|e| EmuError::io(&format!("parsing {}", path.display()), e))
}

fn block_device_bytes(dev: libc::dev_t) -> Result<u64, EmuError> {
    Ok(read_sysfs_u64(&sysfs_block(dev).join("size"))? * 512)
}

/// Where byte 0 of block device `dev` lies on the medium, if `dev` is a
/// loop device whose backing file is one of `images` (partitions of one are
/// not recognized).
fn device_base(dev: libc::dev_t, images: &[(u64, u64)]) -> Result<u64, EmuError> {
    let name = format!("{}:{}", libc::major(dev), libc::minor(dev));
    let not_ours = |why: String| {
        unauthorized(format!(
            "the file is on block device {name}, {why}; file grants are for files on a loop \
             device over this device's image"
        ))
    };
    let dir = sysfs_block(dev);
    let backing = std::fs::read_to_string(dir.join("loop/backing_file"))
        .map_err(|_| not_ours("which is not a loop device".into()))?;
    let backing = backing.trim_end_matches('\n');
    let meta = std::fs::metadata(backing)
        .map_err(|e| not_ours(format!("a loop device over {backing} ({e})")))?;
    if !images.contains(&(meta.dev(), meta.ino())) {
        return Err(not_ours(format!(
            "a loop device over {backing}, which is not the image"
        )));
    }
    read_sysfs_u64(&dir.join("loop/offset"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The protocol's `DirectAccess` and the records' permission bits
    /// (SPEC §3.3) say the same thing both ways.
    #[test]
    fn direct_access_and_record_bits_agree() {
        for perms in [0, READ, WRITE, READ | WRITE] {
            let access = direct_access(perms);
            assert_eq!(record_perms(access), perms);
            assert_eq!(access.can_read(), perms & READ != 0);
            assert_eq!(access.can_write(), perms & WRITE != 0);
        }
    }

    fn file(perms: u8) -> GrantedFile {
        GrantedFile {
            fd: std::fs::File::open("/dev/null").unwrap().into(),
            key: 7,
            perms,
            base: 0,
            device_bytes: None,
            block_bytes: 4096,
            inode: InodeId { dev: 0, ino: 0 },
            grants: BTreeMap::new(),
            by_start: BTreeSet::new(),
        }
    }

    fn extent(logical: u64, physical: u64, len: u64) -> FileExtent {
        FileExtent {
            logical,
            physical,
            len,
            unwritten: false,
            direct: DirectAccess::ReadWrite,
        }
    }

    fn grants(f: &GrantedFile) -> Vec<(u64, u64, u64)> {
        f.grants
            .values()
            .map(|g| (g.logical, g.start, g.len))
            .collect()
    }

    fn installs(updates: &[Update]) -> Vec<(u64, u64)> {
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Install(r) => Some((r.start, r.len)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_view_cut_at_the_offset_changes_nothing() {
        let mut f = file(READ | WRITE);
        let u = f.replace(1, 0, 100, &[extent(0, 1000, 40), extent(60, 5000, 40)]);
        assert_eq!(installs(&u), [(1000, 40), (5000, 40)]);
        // XFS answers a map from 20 with the first extent cut there.
        let u = f.replace(1, 20, 100, &[extent(20, 1020, 20), extent(60, 5000, 40)]);
        assert!(!u.iter().any(|u| matches!(u, Update::RemoveFile { .. })));
        assert_eq!(grants(&f), [(0, 1000, 40), (60, 5000, 40)], "merged back");
    }

    #[test]
    fn a_freed_block_is_found_by_its_device_address() {
        let mut f = file(READ | WRITE);
        f.base = 100;
        f.replace(1, 0, 100, &[extent(0, 1100, 40), extent(60, 5100, 40)]);
        // Device bytes 1010..1030 are medium bytes 1110..1130: file 10..30.
        assert_eq!(f.logical_on_device(1010, 20), [(10, 30)]);
        // A free across both grants (and the gap between) finds both parts.
        assert_eq!(f.logical_on_device(1030, 4010), [(30, 40), (60, 100)]);
        assert!(f.logical_on_device(2000, 100).is_empty());
        let u = f.revoke_range(1, 10, 30);
        assert_eq!(installs(&u), [(1100, 10), (1130, 10), (5100, 40)]);
        assert!(f.logical_on_device(1010, 20).is_empty(), "revoked");
    }

    #[test]
    fn a_moved_block_replaces_all_records() {
        let mut f = file(READ | WRITE);
        f.replace(1, 0, 100, &[extent(0, 1000, 40), extent(60, 5000, 40)]);
        let u = f.replace(1, 60, 100, &[extent(60, 9000, 40)]);
        assert_eq!(
            u[0],
            Update::RemoveFile {
                channel: 1,
                file: 7
            }
        );
        assert_eq!(installs(&u), [(1000, 40), (9000, 40)]);
        // A hole where there was data: the old block is revoked too.
        let u = f.replace(1, 0, 40, &[]);
        assert_eq!(
            u[0],
            Update::RemoveFile {
                channel: 1,
                file: 7
            }
        );
        assert_eq!(installs(&u), [(9000, 40)]);
    }

    #[test]
    fn a_hard_miss_finds_physically_adjacent_grants_with_the_same_bits() {
        let mut f = file(READ | WRITE);
        // Logically apart, physically back to back (SPEC §3.3's merging).
        f.replace(
            1,
            0,
            300,
            &[
                extent(0, 2000, 100),
                extent(100, 7000, 100),
                extent(200, 2100, 100),
            ],
        );
        let (e, u) = f.resolve(1, 2050, 100, true).expect("covered by the run");
        assert_eq!((e.start, e.len, e.write), (2000, 200, true));
        assert_eq!(installs(&u), [(2000, 100), (2100, 100)]);
        assert!(f.resolve(1, 2150, 100, false).is_none(), "past the run");
        assert!(f.resolve(1, 1999, 2, false).is_none(), "before it");
        let ro = {
            let mut f = file(READ);
            f.replace(
                1,
                0,
                100,
                &[FileExtent {
                    direct: DirectAccess::Read,
                    ..extent(0, 2000, 100)
                }],
            );
            f
        };
        assert!(ro.resolve(1, 2000, 10, true).is_none(), "no write grant");
        assert!(ro.resolve(1, 2000, 10, false).is_some());
    }
}
