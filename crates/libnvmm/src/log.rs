//! The backing file as a log-structured flash (SPEC §7 "journaling": no
//! write-in-place). Layout:
//!
//! ```text
//! 0      superblock (geometry, CRC)
//! 4096   checkpoint slot 0 ┐ each: sequence, token, where the newest commit
//! 8192   checkpoint slot 1 ┘ record is (block, length, CRC), slot CRC
//! 16384  blocks of 32 flash pages (256 KB): page versions' segments and
//!        commit records, appended at the tail or reusing freed blocks
//! ```
//!
//! A commit writes the dirty segments, then a record (the page-table
//! entries changed since the last commit — or all of them, every 32 commits
//! — plus the token state), fdatasync, then the older slot, fdatasync. A
//! crash at any byte leaves the newer slot torn (its CRC fails) or complete,
//! so the last completed commit is always readable. Blocks referenced by the
//! committed state are never rewritten: a block freed since the last commit
//! waits in `pending_free` until the next commit is durable. Freed blocks
//! are punched out of the file (FALLOC_FL_PUNCH_HOLE).
//!
//! Every checksum is the project's CRC32C (`moneta_wire::crc32c`). Each
//! data flash page carries one too, kept in memory and in the commit
//! records (the pages written since the last commit; a full record has
//! them all): a read whose bytes do not match is a `BadFile` error naming
//! the page, never data. Before a commit, [`Log::check_intact`] asks the
//! file system (SEEK_DATA/SEEK_HOLE) whether any page or record the log
//! still needs was punched out or cut off by a truncation: then the file
//! changed under the region, and no token is given for it.

use crate::entry::{Entry, FLASH_PAGES_PER_BLOCK, SEGMENTS_PER_PAGE};
use crate::error::{ErrorKind, NvmmError, Result};
use crate::tokens::Tokens;
use moneta_wire::crc32c::crc32c;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Flash page = cache block = page segment: 8 KB, the report's example.
pub const FLASH_PAGE_BYTES: usize = 8192;
/// A virtual page (SPEC §7: 64 KB pages, independent of flash page size).
pub const PAGE_BYTES: usize = FLASH_PAGE_BYTES * SEGMENTS_PER_PAGE;
/// A flash block of the log: 32 flash pages, one page version's.
pub const BLOCK_BYTES: usize = FLASH_PAGE_BYTES * FLASH_PAGES_PER_BLOCK as usize;
const SECTOR: usize = 4096;
const SLOT_OFFSETS: [u64; 2] = [4096, 8192];
const DATA_START: u64 = 16384;
const SUPER_MAGIC: &[u8; 8] = b"NVMMLOG1";
const SLOT_MAGIC: &[u8; 8] = b"NVMMSLOT";
const RECORD_MAGIC: u32 = 0x4352_564e; // "NVRC"
const RECORD_HEADER: usize = 64;
/// 2: CRC32C throughout and a checksum per data flash page.
const FORMAT_VERSION: u32 = 2;
/// A full record is written after this many deltas, bounding recovery.
const MAX_DELTAS: usize = 32;

/// A heap buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain owned memory.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of at least `len` bytes (whole sectors); an
    /// allocation the system refuses is an `Exhausted` error, not an abort.
    pub fn new(len: usize) -> Result<AlignedBuf> {
        let refused = || {
            NvmmError::new(
                ErrorKind::Exhausted,
                format!("cannot allocate a {len}-byte IO buffer"),
            )
        };
        let len = len
            .max(SECTOR)
            .checked_next_multiple_of(SECTOR)
            .ok_or_else(refused)?;
        let layout = std::alloc::Layout::from_size_align(len, SECTOR).map_err(|_| refused())?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(refused());
        }
        Ok(AlignedBuf { ptr, len })
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr/len describe an owned allocation.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr/len describe an owned allocation, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len, SECTOR).expect("layout");
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) };
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RecordRef {
    block: u64,
    len: u64,
    crc: u32,
}

/// What recovery found: the committed table entries and tokens.
pub struct Recovered {
    pub entries: Vec<(u32, Entry)>,
    pub tokens: Tokens,
}

pub struct Log {
    file: File,
    direct: bool,
    pages: u64,
    tail_block: u64,
    free_blocks: Vec<u64>,
    pending_free: Vec<u64>,
    slot_seq: u64,
    /// Records of the committed state, oldest (a full one) first.
    chain: Vec<RecordRef>,
    /// CRC32C of every flash page written in a block in use.
    page_crcs: BTreeMap<u64, u32>,
    /// Those written since the last commit (the next delta record's).
    new_crcs: Vec<(u64, u32)>,
}

fn read_u64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Whether the open file `file` is on tmpfs (memory: O_DIRECT there costs
/// more than it saves).
fn on_tmpfs(file: &File) -> bool {
    const TMPFS_MAGIC: libc::c_long = 0x0102_1994;
    // SAFETY: fstatfs writes into a zeroed struct that lives here.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a descriptor we own; fs is a valid out-pointer.
    unsafe {
        libc::fstatfs(file.as_raw_fd(), &mut fs) == 0 && fs.f_type as libc::c_long == TMPFS_MAGIC
    }
}

/// Turn O_DIRECT on for `file` if asked and its file system allows it
/// (not on tmpfs). Returns whether it is on.
fn enable_direct(file: &File, try_direct: bool) -> bool {
    if !try_direct || on_tmpfs(file) {
        return false;
    }
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor we own.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above; a file system without O_DIRECT answers EINVAL.
    flags >= 0 && unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_DIRECT) } == 0
}

fn lock_exclusive(file: &File, path: &Path) -> Result<()> {
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(NvmmError::last_os(format!(
            "{} is in use by another process (flock)",
            path.display()
        )));
    }
    Ok(())
}

fn file_type_name(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFLNK => "a symbolic link",
        _ => "not a regular file",
    }
}

/// What is at a backing file's path, found before anything is written
/// (issue 24: libnvmm never replaces or writes what it was not made for).
pub enum Target {
    /// Nothing: a log is formatted under a temporary name beside it
    /// (created with O_EXCL) and renamed into place once complete.
    New,
    /// An empty regular file with a write permission bit, locked:
    /// formatted in place (its superblock last); a failed format truncates
    /// it back to empty.
    Empty(File),
    /// An NVMM log of `pages` 64 KB pages, locked.
    Log(File, u64),
}

impl Target {
    /// Look at `path` without following a symbolic link and without
    /// writing: only a regular file (or nothing) is accepted; the file is
    /// opened O_NOFOLLOW | O_NONBLOCK | O_NOCTTY (a FIFO or device never
    /// blocks or becomes a terminal) and `fstat` must show the same regular
    /// file as `lstat` did; it is locked (`flock`) before its superblock is
    /// read.
    pub fn inspect(path: &Path) -> Result<Target> {
        use std::os::unix::fs::MetadataExt;
        let shown = path.display();
        let bad = |what: String| NvmmError::new(ErrorKind::InvalidArgument, what);
        let before = match std::fs::symlink_metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Target::New),
            Err(e) => return Err(NvmmError::os(format!("lstat {shown}"), e)),
        };
        if !before.file_type().is_file() {
            return Err(bad(format!(
                "{shown} is {}; libnvmm's backing file must be a regular file or a new path \
                 (it never opens or replaces anything else)",
                file_type_name(before.mode())
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => bad(format!("{shown} became a symbolic link")),
                _ => NvmmError::os(format!("open {shown}"), e),
            })?;
        let now = file
            .metadata()
            .map_err(|e| NvmmError::os(format!("fstat {shown}"), e))?;
        if !now.file_type().is_file() || now.dev() != before.dev() || now.ino() != before.ino() {
            return Err(bad(format!("{shown} was replaced while being opened")));
        }
        let fd = file.as_raw_fd();
        // SAFETY: fcntl on a descriptor we own: back to blocking IO.
        unsafe {
            libc::fcntl(
                fd,
                libc::F_SETFL,
                libc::fcntl(fd, libc::F_GETFL) & !libc::O_NONBLOCK,
            )
        };
        lock_exclusive(&file, path)?;
        if now.len() == 0 {
            if now.mode() & 0o222 == 0 {
                return Err(bad(format!(
                    "{shown} is empty and read-only (mode {:o}); libnvmm would have to write it: \
                     give it a write permission or name a new path",
                    now.mode() & 0o7777
                )));
            }
            return Ok(Target::Empty(file));
        }
        let pages = read_superblock(&file).map_err(|e| {
            NvmmError::new(
                e.kind,
                format!(
                    "{shown}: {}; libnvmm does not overwrite files it did not make",
                    e.context
                ),
            )
        })?;
        Ok(Target::Log(file, pages))
    }
}

/// The region size (64 KB pages) a log's superblock records.
fn read_superblock(file: &File) -> Result<u64> {
    let mut sb = AlignedBuf::new(SECTOR)?;
    pread_full(file, sb.as_mut_slice(), 0)?;
    let b = sb.as_slice();
    if &b[0..8] != SUPER_MAGIC || read_u32(b, SECTOR - 4) != crc32c(&b[..SECTOR - 4]) {
        return Err(NvmmError::new(
            ErrorKind::BadFile,
            "not an NVMM log (bad superblock magic or CRC)",
        ));
    }
    let (version, flash_page, pages) = (read_u32(b, 8), read_u32(b, 12), read_u64(b, 16));
    if version != FORMAT_VERSION || flash_page as usize != FLASH_PAGE_BYTES {
        return Err(NvmmError::new(
            ErrorKind::BadFile,
            format!("log format {version} with {flash_page}-byte flash pages is not supported"),
        ));
    }
    if pages == 0 || pages > crate::table::MAX_PAGES {
        return Err(NvmmError::new(
            ErrorKind::BadFile,
            format!(
                "the superblock claims {pages} pages, outside 1..={}",
                crate::table::MAX_PAGES
            ),
        ));
    }
    Ok(pages)
}

/// Read `buf.len()` bytes at `offset`; bytes past the end read as zero.
fn pread_full(file: &File, buf: &mut [u8], offset: u64) -> Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(NvmmError::os(
                    format!("pread {} bytes at {offset}", buf.len()),
                    e,
                ))
            }
        }
    }
    Ok(())
}

/// A temporary file beside `path`, created (O_EXCL, O_NOFOLLOW) and locked.
fn create_beside(path: &Path) -> Result<(File, std::path::PathBuf)> {
    static SERIAL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        NvmmError::new(
            ErrorKind::InvalidArgument,
            format!("{} names no file", path.display()),
        )
    })?;
    loop {
        let n = SERIAL.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut tmp_name = name.to_os_string();
        tmp_name.push(format!(".format-{}-{n}", std::process::id()));
        let tmp = path.with_file_name(tmp_name);
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)
        {
            Ok(f) => {
                lock_exclusive(&f, &tmp)?;
                return Ok((f, tmp));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1 << 20 => continue,
            Err(e) => return Err(NvmmError::os(format!("create {}", tmp.display()), e)),
        }
    }
}

/// Move `tmp` to `path` only if nothing is there (renameat2 NOREPLACE, or
/// link + unlink where the file system lacks it).
fn rename_no_replace(tmp: &Path, path: &Path) -> Result<()> {
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).map_err(|_| {
            NvmmError::new(
                ErrorKind::InvalidArgument,
                format!("{} contains a NUL byte", p.display()),
            )
        })
    };
    let (from, to) = (c(tmp)?, c(path)?);
    // SAFETY: two NUL-terminated paths.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = std::io::Error::last_os_error();
    let exists = |e: &std::io::Error| {
        NvmmError::new(
            ErrorKind::Busy,
            format!(
                "{} appeared while its log was being formatted ({e}); left as it is",
                path.display()
            ),
        )
    };
    match e.raw_os_error() {
        Some(libc::EEXIST) => Err(exists(&e)),
        Some(libc::EINVAL) | Some(libc::ENOSYS) => {
            std::fs::hard_link(tmp, path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    exists(&e)
                } else {
                    NvmmError::os(format!("link to {}", path.display()), e)
                }
            })?;
            let _ = std::fs::remove_file(tmp);
            Ok(())
        }
        _ => Err(NvmmError::os(format!("rename to {}", path.display()), e)),
    }
}

fn sync_parent(path: &Path) {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

impl Log {
    /// Open the log `target` found at `path` (formatting it if new or
    /// empty) for a region of `pages` 64 KB pages, checked by the caller
    /// against the file's own size. The file is locked: one process maps a
    /// region at a time. On failure a new path is left absent and an empty
    /// file empty.
    pub fn open(
        target: Target,
        path: &Path,
        pages: u64,
        try_direct: bool,
    ) -> Result<(Log, Recovered)> {
        let file = match target {
            Target::New => {
                let (file, tmp) = create_beside(path)?;
                let direct = enable_direct(&file, try_direct);
                let mut log = Log::with_file(file, direct, pages);
                let made = log
                    .format(false)
                    .and_then(|()| rename_no_replace(&tmp, path));
                if let Err(e) = made {
                    let _ = std::fs::remove_file(&tmp);
                    return Err(e);
                }
                sync_parent(path);
                log.file
            }
            Target::Empty(file) => {
                let direct = enable_direct(&file, try_direct);
                let mut log = Log::with_file(file, direct, pages);
                if let Err(e) = log.format(true) {
                    let _ = log.file.set_len(0);
                    return Err(e);
                }
                log.file
            }
            Target::Log(file, file_pages) => {
                debug_assert_eq!(file_pages, pages, "the caller checks the region's size");
                file
            }
        };
        let direct = enable_direct(&file, try_direct);
        let mut log = Log::with_file(file, direct, pages);
        let recovered = log.recover()?;
        Ok((log, recovered))
    }

    fn with_file(file: File, direct: bool, pages: u64) -> Log {
        Log {
            file,
            direct,
            pages,
            tail_block: 0,
            free_blocks: Vec::new(),
            pending_free: Vec::new(),
            slot_seq: 0,
            chain: Vec::new(),
            page_crcs: BTreeMap::new(),
            new_crcs: Vec::new(),
        }
    }

    pub fn pages(&self) -> u64 {
        self.pages
    }
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn pwrite_all(&self, buf: &[u8], offset: u64) -> Result<()> {
        self.file
            .write_all_at(buf, offset)
            .map_err(|e| NvmmError::os(format!("pwrite {} bytes at {offset}", buf.len()), e))
    }

    fn pread_full(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        pread_full(&self.file, buf, offset)
    }

    pub fn sync_data(&self) -> Result<()> {
        self.file
            .sync_data()
            .map_err(|e| NvmmError::os("fdatasync", e))
    }

    /// Write an empty log: the superblock and token 0 (a full record with
    /// no entries). `superblock_last`: in place over an empty file, so a
    /// crash before the end leaves no superblock (the file is then no log
    /// and is refused, never misread).
    fn format(&mut self, superblock_last: bool) -> Result<()> {
        let mut sb = AlignedBuf::new(SECTOR)?;
        let b = sb.as_mut_slice();
        b[0..8].copy_from_slice(SUPER_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(FLASH_PAGE_BYTES as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.pages.to_le_bytes());
        b[24..28].copy_from_slice(&(SEGMENTS_PER_PAGE as u32).to_le_bytes());
        let crc = crc32c(&b[..SECTOR - 4]);
        b[SECTOR - 4..].copy_from_slice(&crc.to_le_bytes());
        if !superblock_last {
            self.pwrite_all(sb.as_slice(), 0)?;
        }
        // Token 0: the empty region, as a full record with no entries.
        self.commit(&Tokens::default(), Vec::new(), true)?;
        if superblock_last {
            self.pwrite_all(sb.as_slice(), 0)?;
            self.sync_data()?;
        }
        Ok(())
    }

    fn recover(&mut self) -> Result<Recovered> {
        // The newest slot whose CRC holds.
        let mut best: Option<(u64, u64, RecordRef)> = None;
        let mut slot = AlignedBuf::new(SECTOR)?;
        for offset in SLOT_OFFSETS {
            self.pread_full(slot.as_mut_slice(), offset)?;
            let s = slot.as_slice();
            if &s[0..8] != SLOT_MAGIC || read_u32(s, 60) != crc32c(&s[..60]) {
                continue;
            }
            let seq = read_u64(s, 8);
            let token = read_u64(s, 16);
            let r = RecordRef {
                block: read_u64(s, 24),
                len: read_u64(s, 32),
                crc: read_u32(s, 40),
            };
            if best.is_none_or(|(bs, _, _)| seq > bs) {
                best = Some((seq, token, r));
            }
        }
        let (seq, _token, newest) = best.ok_or_else(|| {
            NvmmError::new(ErrorKind::BadFile, "no checkpoint slot has a valid CRC")
        })?;
        self.slot_seq = seq;
        // Walk back from the newest record to a full one.
        let mut records = Vec::new();
        let mut r = newest;
        loop {
            let bytes = self.read_record(r)?;
            let full = read_u32(&bytes, 4) == 0;
            let prev = RecordRef {
                block: read_u64(&bytes, 24),
                len: read_u64(&bytes, 32),
                crc: read_u32(&bytes, 40),
            };
            records.push((r, bytes));
            if full {
                break;
            }
            if records.len() > MAX_DELTAS + 1 {
                return Err(NvmmError::new(
                    ErrorKind::BadFile,
                    "commit record chain too long",
                ));
            }
            r = prev;
        }
        records.reverse();
        let mut table = std::collections::BTreeMap::new();
        let mut tokens = Tokens::default();
        for (_, bytes) in &records {
            tokens.last = read_u64(bytes, 8);
            tokens.horizon = read_u64(bytes, 16);
            let n_intervals = read_u32(bytes, 44) as usize;
            let n_entries = read_u32(bytes, 48) as usize;
            let n_crcs = read_u32(bytes, 52) as usize;
            if read_u32(bytes, 4) == 0 {
                self.page_crcs.clear();
            }
            let mut at = RECORD_HEADER;
            tokens.rolled_back.clear();
            for _ in 0..n_intervals {
                tokens
                    .rolled_back
                    .push((read_u64(bytes, at), read_u64(bytes, at + 8)));
                at += 16;
            }
            for _ in 0..n_entries {
                let index = read_u32(bytes, at);
                let e = Entry::unpack(bytes[at + 4..at + 20].try_into().expect("16 bytes"));
                if e.is_present() {
                    table.insert(index, e);
                } else {
                    table.remove(&index);
                }
                at += 20;
            }
            for _ in 0..n_crcs {
                self.page_crcs
                    .insert(read_u64(bytes, at), read_u32(bytes, at + 8));
                at += 12;
            }
        }
        self.chain = records.iter().map(|(r, _)| *r).collect();
        let entries: Vec<(u32, Entry)> = table.into_iter().collect();
        self.rebuild_free(&entries);
        Ok(Recovered { entries, tokens })
    }

    fn read_record(&self, r: RecordRef) -> Result<Vec<u8>> {
        let bad = |why: &str| {
            NvmmError::new(
                ErrorKind::BadFile,
                format!(
                    "commit record at block {} ({} bytes): {why}",
                    r.block, r.len
                ),
            )
        };
        // The largest record: every table entry and every abandoned interval.
        let most = RECORD_HEADER as u64
            + crate::table::entries_for(self.pages) * (20 + 12 * FLASH_PAGES_PER_BLOCK)
            + crate::tokens::MAX_ROLLED_BACK as u64 * 16;
        if r.len < RECORD_HEADER as u64 || r.len > most {
            return Err(bad("bad length"));
        }
        let mut buf = AlignedBuf::new(r.len as usize)?;
        self.pread_full(buf.as_mut_slice(), self.block_offset(r.block))?;
        let mut bytes = Vec::new();
        bytes
            .try_reserve_exact(r.len as usize)
            .map_err(|_| bad("no memory to read it"))?;
        bytes.extend_from_slice(&buf.as_slice()[..r.len as usize]);
        if crc32c(&bytes) != r.crc {
            return Err(bad("CRC mismatch"));
        }
        if read_u32(&bytes, 0) != RECORD_MAGIC {
            return Err(bad("bad magic"));
        }
        let need = RECORD_HEADER as u64
            + read_u32(&bytes, 44) as u64 * 16
            + read_u32(&bytes, 48) as u64 * 20
            + read_u32(&bytes, 52) as u64 * 12;
        if need > r.len {
            return Err(bad("counts exceed length"));
        }
        Ok(bytes)
    }

    /// Blocks in use are the mapped versions' and the committed records';
    /// every other block below the tail is free.
    fn rebuild_free(&mut self, entries: &[(u32, Entry)]) {
        let mut used = std::collections::BTreeSet::new();
        for (_, e) in entries {
            if e.has(crate::entry::status::MAPPED) {
                used.insert(e.flash_page / FLASH_PAGES_PER_BLOCK);
            }
        }
        for r in &self.chain {
            for b in r.block..r.block + self.record_blocks(r.len) {
                used.insert(b);
            }
        }
        self.tail_block = used.iter().next_back().map_or(0, |b| b + 1);
        self.free_blocks = (0..self.tail_block)
            .rev()
            .filter(|b| !used.contains(b))
            .collect();
        self.pending_free.clear();
        // The records replayed may name pages since freed (and their blocks
        // reused): keep the checksums of the pages the committed entries
        // still read, the valid positions of each mapped version.
        let mut live = std::collections::BTreeSet::new();
        for (_, e) in entries {
            if e.has(crate::entry::status::MAPPED) {
                for i in 0..FLASH_PAGES_PER_BLOCK {
                    if e.valid & (1 << i) != 0 {
                        live.insert(e.flash_page + i);
                    }
                }
            }
        }
        self.page_crcs.retain(|fp, _| live.contains(fp));
    }

    fn record_blocks(&self, len: u64) -> u64 {
        len.div_ceil(BLOCK_BYTES as u64)
    }

    fn block_offset(&self, block: u64) -> u64 {
        DATA_START + block * BLOCK_BYTES as u64
    }

    fn flash_page_offset(&self, flash_page: u64) -> u64 {
        DATA_START + flash_page * FLASH_PAGE_BYTES as u64
    }

    /// A free block of 32 flash pages for a new page version.
    pub fn alloc_block(&mut self) -> Result<u64> {
        if let Some(b) = self.free_blocks.pop() {
            return Ok(b);
        }
        let b = self.tail_block;
        if (b + 1) * FLASH_PAGES_PER_BLOCK > crate::entry::MAX_FLASH_PAGE {
            return Err(NvmmError::new(
                ErrorKind::Exhausted,
                "the 34-bit flash address space is full",
            ));
        }
        self.tail_block += 1;
        Ok(b)
    }

    /// Release a block. `committed`: the last commit references it, so it
    /// may be reused only after the next commit.
    pub fn free_block(&mut self, block: u64, committed: bool) {
        if committed {
            self.pending_free.push(block);
        } else {
            self.punch(block, 1);
            self.free_blocks.push(block);
        }
    }

    fn punch(&mut self, block: u64, blocks: u64) {
        let pages = block * FLASH_PAGES_PER_BLOCK..(block + blocks) * FLASH_PAGES_PER_BLOCK;
        let gone: Vec<u64> = self.page_crcs.range(pages).map(|(&fp, _)| fp).collect();
        for fp in gone {
            self.page_crcs.remove(&fp);
        }
        // SAFETY: fallocate on a descriptor we own; failure only wastes space.
        unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                self.block_offset(block) as libc::off_t,
                (blocks * BLOCK_BYTES as u64) as libc::off_t,
            )
        };
    }

    pub fn blocks_in_use(&self) -> u64 {
        self.tail_block - self.free_blocks.len() as u64
    }

    /// Read one flash page, checked against its checksum.
    pub fn read_segment(&self, flash_page: u64, buf: &mut [u8]) -> Result<()> {
        debug_assert_eq!(buf.len(), FLASH_PAGE_BYTES);
        let offset = self.flash_page_offset(flash_page);
        self.pread_full(buf, offset)?;
        let want = self.page_crcs.get(&flash_page).copied();
        let got = crc32c(buf);
        if want != Some(got) {
            let why = match want {
                None => "has no checksum (the log never wrote it)".to_string(),
                Some(w) => format!(
                    "reads back with CRC32C {got:#010x}, not the {w:#010x} written (the backing file changed under the region: truncated, punched or overwritten)"
                ),
            };
            return Err(NvmmError::new(
                ErrorKind::BadFile,
                format!("flash page {flash_page} (file offset {offset}) {why}"),
            ));
        }
        Ok(())
    }

    /// Program one flash page. `data` must be FLASH_PAGE_BYTES long and,
    /// for O_DIRECT, 4 KB aligned (a cache block of the region is).
    pub fn write_segment(&mut self, flash_page: u64, data: &[u8]) -> Result<()> {
        debug_assert_eq!(data.len(), FLASH_PAGE_BYTES);
        self.pwrite_all(data, self.flash_page_offset(flash_page))?;
        let crc = crc32c(data);
        self.page_crcs.insert(flash_page, crc);
        self.new_crcs.push((flash_page, crc));
        Ok(())
    }

    /// Whether everything the log still needs is in the file: its
    /// superblock, the newest checkpoint slot, every committed record and
    /// every data page written. A range the file system reports as a hole
    /// (SEEK_DATA/SEEK_HOLE) was punched out, or cut off by a truncation,
    /// by someone else: the log only punches blocks it freed.
    pub fn check_intact(&self) -> Result<()> {
        let mut needed: Vec<(u64, u64, String)> = vec![
            (0, SECTOR as u64, "the superblock".into()),
            (
                SLOT_OFFSETS[(self.slot_seq % 2) as usize],
                SECTOR as u64,
                "the newest checkpoint slot".into(),
            ),
        ];
        for r in &self.chain {
            let len = self.record_blocks(r.len) * BLOCK_BYTES as u64;
            needed.push((
                self.block_offset(r.block),
                len,
                format!("the commit record at block {}", r.block),
            ));
        }
        needed.sort_by_key(|n| n.0);
        let pages = self.page_crcs.keys().map(|&fp| {
            (
                self.flash_page_offset(fp),
                FLASH_PAGE_BYTES as u64,
                format!("flash page {fp}"),
            )
        });
        let size = self
            .file
            .metadata()
            .map_err(|e| NvmmError::os("fstat of the log", e))?
            .len();
        let fd = self.file.as_raw_fd();
        // Walk the wanted ranges in order beside the file's data extents.
        let mut data: Option<(u64, u64)> = None;
        let mut check = |(at, len, what): (u64, u64, String)| -> Result<()> {
            if at + len > size {
                return Err(NvmmError::new(
                    ErrorKind::BadFile,
                    format!(
                        "the backing file was truncated to {size} bytes under the region: {what} (bytes {at}..{}) is gone",
                        at + len
                    ),
                ));
            }
            loop {
                match data {
                    Some((start, end)) if at >= start && at + len <= end => return Ok(()),
                    // Past this extent: find the next.
                    Some((_, end)) if at >= end => {}
                    // In a hole before the extent, or running off its end.
                    Some(_) => return Err(punched(&what, at, len)),
                    None => {}
                }
                let extent = data_extent(fd, at)?.ok_or_else(|| punched(&what, at, len))?;
                if extent.0 > at {
                    return Err(punched(&what, at, len));
                }
                data = Some(extent);
            }
        };
        let mut heads = needed.into_iter().peekable();
        let mut pages = pages.peekable();
        loop {
            let next = match (heads.peek(), pages.peek()) {
                (Some(h), Some(p)) if h.0 <= p.0 => heads.next(),
                (Some(_), None) => heads.next(),
                (_, Some(_)) => pages.next(),
                (None, None) => break,
            };
            check(next.expect("one of them"))?;
        }
        Ok(())
    }

    /// Make `changes` (or, when `full`, the whole table in `changes`) and
    /// `tokens` the committed state: record, fdatasync, slot, fdatasync.
    /// The caller has written and the segments already.
    pub fn commit(
        &mut self,
        tokens: &Tokens,
        changes: Vec<(u32, Entry)>,
        full: bool,
    ) -> Result<()> {
        let crcs: Vec<(u64, u32)> = if full {
            self.page_crcs.iter().map(|(&fp, &c)| (fp, c)).collect()
        } else {
            self.new_crcs.clone()
        };
        let len =
            RECORD_HEADER + tokens.rolled_back.len() * 16 + changes.len() * 20 + crcs.len() * 12;
        let blocks = self.record_blocks(len as u64);
        let mut buf = AlignedBuf::new(blocks as usize * BLOCK_BYTES)?;
        let b = buf.as_mut_slice();
        let prev = if full {
            None
        } else {
            self.chain.last().copied()
        };
        b[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&(if full { 0u32 } else { 1 }).to_le_bytes());
        b[8..16].copy_from_slice(&tokens.last.to_le_bytes());
        b[16..24].copy_from_slice(&tokens.horizon.to_le_bytes());
        if let Some(p) = prev {
            b[24..32].copy_from_slice(&p.block.to_le_bytes());
            b[32..40].copy_from_slice(&p.len.to_le_bytes());
            b[40..44].copy_from_slice(&p.crc.to_le_bytes());
        }
        b[44..48].copy_from_slice(&(tokens.rolled_back.len() as u32).to_le_bytes());
        b[48..52].copy_from_slice(&(changes.len() as u32).to_le_bytes());
        b[52..56].copy_from_slice(&(crcs.len() as u32).to_le_bytes());
        let mut at = RECORD_HEADER;
        for &(a, z) in &tokens.rolled_back {
            b[at..at + 8].copy_from_slice(&a.to_le_bytes());
            b[at + 8..at + 16].copy_from_slice(&z.to_le_bytes());
            at += 16;
        }
        for (index, e) in &changes {
            b[at..at + 4].copy_from_slice(&index.to_le_bytes());
            b[at + 4..at + 20].copy_from_slice(&e.pack());
            at += 20;
        }
        for (fp, c) in &crcs {
            b[at..at + 8].copy_from_slice(&fp.to_le_bytes());
            b[at + 8..at + 12].copy_from_slice(&c.to_le_bytes());
            at += 12;
        }
        let crc = crc32c(&b[..len]);
        let block = self.tail_block;
        self.tail_block += blocks;
        self.pwrite_all(buf.as_slice(), self.block_offset(block))?;
        self.sync_data()?;
        // The slot the older commit is in.
        let seq = self.slot_seq + 1;
        let mut slot = AlignedBuf::new(SECTOR)?;
        let s = slot.as_mut_slice();
        s[0..8].copy_from_slice(SLOT_MAGIC);
        s[8..16].copy_from_slice(&seq.to_le_bytes());
        s[16..24].copy_from_slice(&tokens.last.to_le_bytes());
        s[24..32].copy_from_slice(&block.to_le_bytes());
        s[32..40].copy_from_slice(&(len as u64).to_le_bytes());
        s[40..44].copy_from_slice(&crc.to_le_bytes());
        let slot_crc = crc32c(&s[..60]);
        s[60..64].copy_from_slice(&slot_crc.to_le_bytes());
        self.pwrite_all(slot.as_slice(), SLOT_OFFSETS[(seq % 2) as usize])?;
        self.sync_data()?;
        self.slot_seq = seq;
        self.new_crcs.clear();
        // Durable: what the previous commit alone referenced may be reused.
        let r = RecordRef {
            block,
            len: len as u64,
            crc,
        };
        if full {
            for old in std::mem::take(&mut self.chain) {
                let n = self.record_blocks(old.len);
                self.punch(old.block, n);
                self.free_blocks.extend(old.block..old.block + n);
            }
        }
        self.chain.push(r);
        for b in std::mem::take(&mut self.pending_free) {
            self.punch(b, 1);
            self.free_blocks.push(b);
        }
        Ok(())
    }

    /// Whether the next commit should be a full record.
    pub fn wants_full(&self, delta_entries: usize, present_entries: usize) -> bool {
        self.chain.len() > MAX_DELTAS || delta_entries >= present_entries
    }
}

fn punched(what: &str, at: u64, len: u64) -> NvmmError {
    NvmmError::new(
        ErrorKind::BadFile,
        format!(
            "{what} (bytes {at}..{}) was punched out of the backing file under the region",
            at + len
        ),
    )
}

/// The data extent at or after `from`: (start, end), or None past the
/// last one.
fn data_extent(fd: libc::c_int, from: u64) -> Result<Option<(u64, u64)>> {
    // SAFETY: lseek on a descriptor we own.
    let start = unsafe { libc::lseek(fd, from as libc::off_t, libc::SEEK_DATA) };
    if start < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            return Ok(None);
        }
        return Err(NvmmError::os("lseek(SEEK_DATA) of the log", e));
    }
    // SAFETY: as above.
    let end = unsafe { libc::lseek(fd, start, libc::SEEK_HOLE) };
    if end < 0 {
        return Err(NvmmError::last_os("lseek(SEEK_HOLE) of the log"));
    }
    Ok(Some((start as u64, end as u64)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::entry::status;

    fn temp(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("libnvmm-log-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    struct Remove(std::path::PathBuf);
    impl Drop for Remove {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    #[test]
    fn commits_survive_reopen_and_a_torn_slot_falls_back() {
        let path = temp("torn");
        let _guard = Remove(path.clone());
        let e = Entry {
            flash_page: 32,
            prev: 0,
            valid: 1,
            time: 1,
            status: status::PRESENT | status::MAPPED,
        };
        {
            let target = Target::inspect(&path).unwrap();
            let (mut log, rec) = Log::open(target, &path, 4, true).unwrap();
            assert!(rec.entries.is_empty());
            let b = log.alloc_block().unwrap();
            assert_eq!(b, 1, "block 0 holds the format's record");
            let data = AlignedBuf::new(FLASH_PAGE_BYTES).unwrap();
            log.write_segment(8, &data.as_slice()[..FLASH_PAGE_BYTES])
                .unwrap();
            let t = Tokens {
                last: 1,
                ..Tokens::default()
            };
            log.commit(&t, vec![(2, e)], false).unwrap();
        }
        {
            let target = Target::inspect(&path).unwrap();
            let (mut log, rec) = Log::open(target, &path, 4, true).unwrap();
            assert_eq!(rec.tokens.last, 1);
            assert_eq!(rec.entries, vec![(2, e)]);
            let t = Tokens {
                last: 2,
                ..Tokens::default()
            };
            log.commit(&t, vec![(3, e)], false).unwrap();
        }
        // Tear the newest slot (seq 3 → slot 1) at a byte inside it.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0xAB; 7], SLOT_OFFSETS[1] + 20).unwrap();
        drop(f);
        let (_log, rec) = Log::open(Target::inspect(&path).unwrap(), &path, 4, true).unwrap();
        assert_eq!(rec.tokens.last, 1, "the torn commit is not visible");
        assert_eq!(rec.entries, vec![(2, e)]);
        assert_eq!(
            Target::inspect(&path).err().map(|e| e.kind),
            Some(ErrorKind::Busy)
        );
    }
}
