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
//! File system cooperation (SPEC §3.4, issue 8):
//!
//! - **Growth goes through the kernel.** A write that touches a hole, an
//!   unwritten extent or the end of the file is written whole through the
//!   kernel (never zeros over a "hole" that may hold another process's
//!   unallocated data: README, "Direct-path contract") (its page cache allocates, as for any program), and the pages it
//!   touched become this handle's *kernel pages*: this handle reads and
//!   rewrites them through the kernel from then on, so the page cache stays
//!   the one copy of them and nothing of it can be written back over direct
//!   data. Others reach the data directly once it is flushed (a soft miss's
//!   FIEMAP flushes the file first). A file that is only ever grown (a log,
//!   a journal, `tar` output) never costs a control-plane round trip.
//! - **Registration is lazy** for [`Moneta::open_file_lazy`] (the shim): the
//!   descriptor is passed to the control plane on the first access of data
//!   the device might serve; until then, and if the daemon refuses it, the
//!   kernel serves the file.
//! - **Layout changes are announced**: [`MonetaFile::set_len`] (and the
//!   shim's fallocate, truncate and O_TRUNC) ask the control plane to
//!   revoke every channel's records of the file before the kernel changes
//!   it. Records revoked under this handle (by another process's change,
//!   or the kernel's report of one) show up as a failed hard miss: the map
//!   is forgotten and asked again; the channel's LAYOUT EPOCH tells the
//!   library to forget its maps before that happens.
//! - The kernel's page cache is not coherent with direct writes: before the
//!   kernel writes part of the file, its clean cached pages there are
//!   dropped (it re-reads them from the device), and [`MonetaFile::sync`]
//!   drops them all so that a later read(2) sees the direct data.
//!
//! A descriptor opened with O_DIRECT gets a second, buffered descriptor of
//! the same file for the kernel's part (O_DIRECT would refuse unaligned
//! growth).

use crate::client::{identity, lift, Moneta};
use moneta_abi::control::{DirectAccess, FileExtent, Request, Response};
use moneta_abi::sys;
use moneta_abi::{EmuError, ErrorKind};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

mod asynchronous;
pub use asynchronous::{FileIo, Prepared};

/// What a request of a file did, for a run report (`moneta run`'s, from
/// the shim): counted per process in plain atomics, never allocating.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteOp {
    Read = 0,
    Write = 1,
    Fsync = 2,
}

impl RouteOp {
    pub const ALL: [RouteOp; 3] = [RouteOp::Read, RouteOp::Write, RouteOp::Fsync];
    pub fn name(self) -> &'static str {
        ["read", "write", "fsync"][self as usize]
    }
}

/// Why the kernel, not the device, served a request (kebab-case in the
/// run report).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelReason {
    NewOrGrowingFile = 0,
    Hole,
    UnalignedODirect,
    IoUring,
    Libaio,
    Mmap,
    OtherWriter,
    TooManyFiles,
    NotRegistered,
    KernelRefusedAttr,
    Append,
    Other,
}

impl KernelReason {
    pub const ALL: [KernelReason; 12] = [
        KernelReason::NewOrGrowingFile,
        KernelReason::Hole,
        KernelReason::UnalignedODirect,
        KernelReason::IoUring,
        KernelReason::Libaio,
        KernelReason::Mmap,
        KernelReason::OtherWriter,
        KernelReason::TooManyFiles,
        KernelReason::NotRegistered,
        KernelReason::KernelRefusedAttr,
        KernelReason::Append,
        KernelReason::Other,
    ];
    pub fn name(self) -> &'static str {
        [
            "new-or-growing-file",
            "hole",
            "unaligned-o-direct",
            "io-uring",
            "libaio",
            "mmap",
            "other-writer",
            "too-many-files",
            "not-registered",
            "kernel-refused-attr",
            "append",
            "other",
        ][self as usize]
    }

    /// The reason in a control plane's refusal of a file.
    fn of_refusal(message: &str) -> KernelReason {
        if message.contains("too many") || message.contains("files open") {
            KernelReason::TooManyFiles
        } else if message.contains("mapped") {
            KernelReason::Mmap
        } else if message.contains("writ") && message.contains("outside") {
            KernelReason::OtherWriter
        } else if message.contains("immutable")
            || message.contains("append-only")
            || message.contains("swap")
        {
            KernelReason::KernelRefusedAttr
        } else {
            KernelReason::NotRegistered
        }
    }
}

/// Requests and bytes.
#[derive(Debug, Default)]
pub struct Count {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

impl Count {
    // Only the initializer of `ROUTES`'s arrays (each use is a new value).
    #[allow(clippy::declare_interior_mutable_const)]
    const ZERO: Count = Count {
        requests: AtomicU64::new(0),
        bytes: AtomicU64::new(0),
    };
    pub fn add(&self, bytes: u64) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }
    pub fn get(&self) -> (u64, u64) {
        (
            self.requests.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
    fn reset(&self) {
        self.requests.store(0, Ordering::Relaxed);
        self.bytes.store(0, Ordering::Relaxed);
    }
}

/// This process's requests of files by route: what the device served,
/// what the kernel served, and why the kernel did.
pub struct Routes {
    pub device: [Count; 3],
    pub kernel: [Count; 3],
    pub reasons: [[Count; 3]; 12],
}

pub static ROUTES: Routes = Routes {
    device: [Count::ZERO; 3],
    kernel: [Count::ZERO; 3],
    reasons: [const { [Count::ZERO; 3] }; 12],
};

impl Routes {
    pub fn device(&self, op: RouteOp, bytes: u64) {
        self.device[op as usize].add(bytes);
    }
    pub fn kernel(&self, why: KernelReason, op: RouteOp, bytes: u64) {
        self.kernel[op as usize].add(bytes);
        self.reasons[why as usize][op as usize].add(bytes);
    }
    /// Start from zero (a forked child counts its own requests).
    pub fn reset(&self) {
        self.device
            .iter()
            .chain(&self.kernel)
            .for_each(Count::reset);
        self.reasons.iter().flatten().for_each(Count::reset);
    }
}

/// Count a read of `got` bytes, `kernel` of them the kernel's (for `why`).
fn count_read(got: u64, kernel: u64, why: KernelReason) {
    let kernel = kernel.min(got);
    if kernel > 0 {
        ROUTES.kernel(why, RouteOp::Read, kernel);
    }
    if got > kernel {
        ROUTES.device(RouteOp::Read, got - kernel);
    }
}

/// Page granularity of the kernel's cache.
const PAGE: u64 = 4096;
/// The largest folio the page cache may hold (a PMD, 2 MiB on x86-64):
/// dropping cached data drops whole folios only, so every drop is widened
/// to this alignment (a large folio left behind would keep stale blocks).
const FOLIO_MAX: u64 = 2 << 20;
/// A request whose records keep being revoked under it is retried this
/// often, then served by the kernel.
const REVOKED_RETRIES: u32 = 8;
/// At a sync, a handle's kernel pages go direct once the file is this big
/// (or registered already): below it, registering would cost more than the
/// kernel path saves.
pub const DIRECT_AFTER_SYNC_BYTES: u64 = 256 << 10;
/// Kernel-page ranges a handle remembers; past this it flushes the file and
/// forgets them (the data is then on the device for everyone).
const MAX_KERNEL_RANGES: usize = 1024;

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
    /// Why a kernel segment is the kernel's.
    why: KernelReason,
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
            why: self.why,
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
            (true, DirectAccess::None) => Kind::Unwritten,
            // A growth grant (monetad's `growth`): allocated, unwritten in
            // the file system's eyes until monetad settles it, and served
            // by the device meanwhile (its blocks were zeroed first).
            (true, access) => Kind::Direct(access),
            (false, DirectAccess::None) => Kind::Kernel,
            (false, access) => Kind::Direct(access),
        };
        Segment {
            logical: e.logical,
            len: e.len,
            physical: e.physical,
            kind,
            why: KernelReason::Other,
        }
    }

    fn kernel(from: u64, to: u64, why: KernelReason) -> Segment {
        Segment {
            logical: from,
            len: to - from,
            physical: 0,
            kind: Kind::Kernel,
            why,
        }
    }

    fn hole(from: u64, to: u64) -> Segment {
        Segment {
            logical: from,
            len: to - from,
            physical: 0,
            kind: Kind::Hole,
            why: KernelReason::Hole,
        }
    }
}

/// How much of a file one soft miss maps (the answer may come in pieces of
/// at most 128 extents).
const MAP_WINDOW_BYTES: u64 = 64 << 20;

/// What one `allocate-file` asks the file system to allocate around a
/// write into holes: the aligned chunk holding it (SPEC §3.4, "Sparse
/// files": the library allocates 1 MB chunks, to limit fragmentation; here
/// also so that one control-plane round trip, one `fallocate`, one
/// zeroing on the medium and one journal record serve every later write
/// into that chunk instead of each write paying them). `fallocate` with
/// `KEEP_SIZE` over the chunk's parts that are not holes changes nothing
/// anyone can read, so a chunk wider than the write is as safe as the
/// write's own range.
pub const ALLOCATE_CHUNK_BYTES: u64 = 1 << 20;

/// The chunk(s) `allocate-file` asks for around a write of `[from, to)`
/// into holes: aligned to [`ALLOCATE_CHUNK_BYTES`], inside the file's
/// `size` (the daemon allocates only inside the size).
fn allocation_window(from: u64, to: u64, size: u64) -> (u64, u64) {
    let a = from / ALLOCATE_CHUNK_BYTES * ALLOCATE_CHUNK_BYTES;
    let b = to
        .div_ceil(ALLOCATE_CHUNK_BYTES)
        .saturating_mul(ALLOCATE_CHUNK_BYTES)
        .min(size)
        .max(to);
    (a, b)
}

/// Where a handle stands with the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Registration {
    /// Not passed to the daemon yet (lazy handles).
    Pending,
    /// Granted on the channel as this file id.
    Granted(u32),
    /// The daemon will not serve it (policy): the kernel serves the file.
    Refused(KernelReason),
}

/// A file granted to a channel. The caller keeps its descriptor open for as
/// long as it uses this; [`MonetaFile::close`] revokes the grant.
/// Thread-safe: threads may read and write disjoint or overlapping ranges
/// concurrently (overlapping writes land in an unspecified order, as with
/// pwrite).
pub struct MonetaFile {
    channel: u16,
    /// The caller's descriptor (not owned).
    fd: RawFd,
    /// (st_dev, st_ino) of the file when the handle was made: every
    /// descriptor of it is checked against it before the library sends it
    /// or writes through it (a number the program closed and reused must
    /// never name another file).
    identity: (u64, u64),
    /// A second descriptor of the same file for the kernel's share of the
    /// work: buffered (when `fd` is O_DIRECT), and opened after the
    /// control plane began watching the file, so the kernel reports what
    /// it is used for (it decides that per open file, at open).
    kernel_fd: std::sync::OnceLock<OwnedFd>,
    /// The access mode to open `kernel_fd` with.
    kernel_mode: i32,
    /// What the descriptor's access mode allows.
    access: DirectAccess,
    /// Size of the block device when the descriptor is the device itself
    /// (whose fstat size is 0).
    device_bytes: Option<u64>,
    block_bytes: u64,
    registration: Mutex<Registration>,
    /// File id + 1 once granted, 0 before.
    granted_id: AtomicU32,
    /// The translation map: sorted, non-overlapping, gaps unknown.
    map: RwLock<Vec<Segment>>,
    /// The channel's LAYOUT EPOCH the map was built under.
    epoch: AtomicU64,
    /// Page-aligned ranges this handle wrote through the kernel (sorted,
    /// disjoint): read and written through the kernel by this handle.
    kernel_pages: Mutex<Vec<(u64, u64)>>,
    /// Whether this handle ever wrote to the device directly (then the
    /// kernel's cached pages may be stale).
    wrote_directly: AtomicBool,
    /// Whether a map of this handle held a growth grant since its last
    /// settling: its fsync then has monetad settle the file first.
    grew: AtomicBool,
    /// Direct writes share it; the kernel's writes take it alone: the
    /// kernel rewrites whole pages, and must not rewrite one a direct
    /// write is changing.
    kernel_writes: RwLock<()>,
}

/// The access a descriptor's status flags allow (the daemon applies the
/// same rule; it decides, this only predicts).
fn access_of(flags: i32) -> DirectAccess {
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => DirectAccess::Read,
        libc::O_WRONLY if flags & libc::O_APPEND == 0 => DirectAccess::Write,
        libc::O_WRONLY => DirectAccess::None,
        _ if flags & libc::O_APPEND != 0 => DirectAccess::Read,
        _ => DirectAccess::ReadWrite,
    }
}

impl Moneta {
    /// Grant this channel the file open on `fd` (SPEC §3.4). `fd` must name
    /// a regular file on the file system on this device (or the device's
    /// block device); its access mode decides what the device allows:
    /// O_RDONLY reads, O_WRONLY writes, O_RDWR both (O_APPEND: reads only,
    /// appends go through the file system). The caller keeps `fd` open
    /// while it uses the file.
    pub fn open_file(&self, fd: RawFd) -> Result<MonetaFile, EmuError> {
        let f = self.open_file_lazy(fd)?;
        f.register(self, true)?;
        Ok(f)
    }

    /// As [`Moneta::open_file`], but the descriptor reaches the control
    /// plane only when the device is first needed, and a refusal then
    /// means "the kernel serves this file" rather than an error.
    pub fn open_file_lazy(&self, fd: RawFd) -> Result<MonetaFile, EmuError> {
        let st = sys::fstat(fd).map_err(|e| EmuError::io("fstat of the file", e))?;
        let flags = sys::status_flags(fd).map_err(|e| EmuError::io("fcntl of the file", e))?;
        let device_bytes = match st.st_mode & libc::S_IFMT {
            libc::S_IFBLK => Some(
                sys::block_device_bytes(fd)
                    .map_err(|e| EmuError::io("size of the block device", e))?,
            ),
            _ => None,
        };
        let kernel_mode = flags & libc::O_ACCMODE;
        let kernel_fd = std::sync::OnceLock::new();
        if flags & libc::O_DIRECT != 0 && device_bytes.is_none() {
            let twin = sys::reopen(fd, kernel_mode)
                .map(lift)
                .map_err(|e| EmuError::io("reopening the O_DIRECT file buffered", e))?;
            let _ = kernel_fd.set(twin);
        }
        Ok(MonetaFile {
            channel: self.info().channel,
            fd,
            identity: (st.st_dev, st.st_ino),
            kernel_fd,
            kernel_mode,
            access: access_of(flags),
            device_bytes,
            block_bytes: (st.st_blksize as u64).max(1),
            registration: Mutex::new(Registration::Pending),
            granted_id: AtomicU32::new(0),
            map: RwLock::new(Vec::new()),
            epoch: AtomicU64::new(0),
            kernel_pages: Mutex::new(Vec::new()),
            wrote_directly: AtomicBool::new(false),
            grew: AtomicBool::new(false),
            kernel_writes: RwLock::new(()),
        })
    }

    /// Announce a layout change of the file open (for writing) on `fd`
    /// from byte `from` on: when this returns, no channel holds a record
    /// of its blocks there. End it with [`Moneta::layout_done`].
    pub fn layout_change(&self, fd: RawFd, from: u64) -> Result<u64, EmuError> {
        match self.call_with_fd(Request::LayoutChange { from }, Some(fd))? {
            Response::ChangeBegun { token } => Ok(token),
            other => Err(unexpected(other)),
        }
    }

    pub fn layout_done(&self, token: u64) -> Result<(), EmuError> {
        match self.call_with_fd(Request::LayoutDone { token }, None)? {
            Response::Done {} => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// This process is about to map the file open on `fd`: every channel
    /// is sent to the kernel for it while any process maps it.
    pub fn mapped(&self, fd: RawFd) -> Result<(), EmuError> {
        match self.call_with_fd(Request::Mapped {}, Some(fd))? {
            Response::Done {} => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// This process unmapped (part of) the file open on `fd`.
    pub fn unmapped(&self, fd: RawFd) -> Result<(), EmuError> {
        match self.call_with_fd(Request::Unmapped {}, Some(fd))? {
            Response::Done {} => Ok(()),
            other => Err(unexpected(other)),
        }
    }
}

/// Whether an error means "the records under this request were revoked"
/// (the hard miss found no grant): ask for the map again. The device's
/// permission refusal counts too when the handle `may` do the access: its
/// grant was downgraded meanwhile (a kernel access of the file took the
/// write permission back); a handle that may not keeps the refusal.
fn revoked(e: &EmuError, may: bool) -> bool {
    e.kind == ErrorKind::Unauthorized
        || (may && e.kind == ErrorKind::Request && e.errno == Some(libc::EACCES))
}

fn page_floor(x: u64) -> u64 {
    x / PAGE * PAGE
}

fn page_ceil(x: u64) -> u64 {
    x.div_ceil(PAGE).saturating_mul(PAGE)
}

impl MonetaFile {
    /// The file's id on its channel, once the control plane has it.
    pub fn id(&self) -> Option<u32> {
        // The file id, copied out of the registration once granted (a
        // lock-free read on every request).
        match self.granted_id.load(Ordering::Acquire) {
            0 => None,
            id => Some(id - 1),
        }
    }

    /// What the descriptor allows (what the device will allow, once the
    /// control plane has granted the file).
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

    /// Whether `fd` still names this handle's file: an error if the number
    /// was closed (or reused for another file) under the library.
    fn verify(&self, fd: RawFd) -> Result<(), EmuError> {
        if identity(fd) == Some(self.identity) {
            Ok(())
        } else {
            Err(EmuError::new(
                ErrorKind::Request,
                format!("descriptor {fd} no longer names the file this handle was opened on"),
            )
            .with_errno(Some(libc::EBADF)))
        }
    }

    /// Why the kernel serves this file if the control plane refused it.
    fn refusal(&self) -> KernelReason {
        match *self.registration.lock().expect("registration") {
            Registration::Refused(why) => why,
            _ => KernelReason::Other,
        }
    }

    /// The second descriptor this handle opened for the kernel's share, if
    /// any (the shim keeps programs from closing or replacing it).
    pub fn twin_fd(&self) -> Option<RawFd> {
        self.kernel_fd.get().map(|f| f.as_raw_fd())
    }

    /// Whether the control plane refused this file, and why.
    pub fn refused(&self) -> Option<KernelReason> {
        match *self.registration.lock().expect("registration") {
            Registration::Refused(why) => Some(why),
            _ => None,
        }
    }

    /// The descriptor the kernel's share of the work goes through.
    fn kernel_fd(&self) -> RawFd {
        self.kernel_fd.get().map_or(self.fd, |f| f.as_raw_fd())
    }

    /// Pass the descriptor to the control plane if that has not happened
    /// yet: the file id, or None if the daemon will not serve the file (an
    /// error instead when `eager`).
    fn register(&self, m: &Moneta, eager: bool) -> Result<Option<u32>, EmuError> {
        let mut reg = self.registration.lock().expect("registration");
        if *reg == Registration::Pending {
            self.verify(self.fd)?;
            *reg = match m.call_with_fd(Request::OpenFile {}, Some(self.fd)) {
                Ok(Response::FileOpened { file_id, .. }) => {
                    self.epoch.store(m.layout_epoch(file_id), Ordering::Release);
                    if self.kernel_fd.get().is_none() && self.device_bytes.is_none() {
                        // Opened now that the file is watched: what this
                        // handle writes through the kernel is reported to
                        // the other holders (their maps follow it).
                        if let Ok(twin) = sys::reopen(self.fd, self.kernel_mode).map(lift) {
                            let _ = self.kernel_fd.set(twin);
                        }
                    }
                    self.granted_id.store(file_id + 1, Ordering::Release);
                    Registration::Granted(file_id)
                }
                Ok(other) => return Err(unexpected(other)),
                Err(e) if e.kind == ErrorKind::Unauthorized && !eager => {
                    Registration::Refused(KernelReason::of_refusal(&e.message))
                }
                Err(e) => return Err(e),
            };
        }
        Ok(match *reg {
            Registration::Granted(id) => Some(id),
            _ => None,
        })
    }

    /// Forget the maps if the control plane changed a file of this channel
    /// since they were made.
    fn follow_epoch(&self, m: &Moneta) {
        let Some(id) = self.id() else {
            return; // no map yet
        };
        let now = m.layout_epoch(id);
        if self.epoch.swap(now, Ordering::AcqRel) != now {
            self.invalidate(0, u64::MAX);
        }
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
        let buf = &mut buf[..n as usize];
        let mut attempt = 0;
        loop {
            self.follow_epoch(m);
            let epoch = self.id().map(|id| m.layout_epoch(id));
            match self.read_once(m, buf, offset, attempt >= REVOKED_RETRIES) {
                Err(e) if revoked(&e, self.access.can_read()) && attempt < REVOKED_RETRIES => {
                    attempt += 1;
                    self.invalidate(offset, offset + n);
                }
                // The file's layout changed while the map was read (a
                // truncate, a punch, another process's allocation): what
                // the map said was a hole may not be one now. Read again.
                Ok(_)
                    if attempt < REVOKED_RETRIES
                        && self.id().map(|id| m.layout_epoch(id)) != epoch =>
                {
                    attempt += 1;
                    self.invalidate(offset, offset + n);
                }
                Ok(got) => {
                    // A truncate that raced the read: the kernel returns
                    // nothing past the new end, never zeros for it.
                    let now = self.len()?;
                    count_read(got.0 as u64, got.1, got.2);
                    return Ok(got.0.min(now.saturating_sub(offset) as usize));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Read `buf` at `offset` by the map: the bytes read (short where the
    /// kernel's share ended early: the file shrank under the read), how
    /// many of them the kernel served, and why.
    fn read_once(
        &self,
        m: &Moneta,
        buf: &mut [u8],
        offset: u64,
        kernel: bool,
    ) -> Result<(usize, u64, KernelReason), EmuError> {
        let end = offset + buf.len() as u64;
        let mut kernel_bytes = 0u64;
        let mut why = KernelReason::Other;
        for s in self.plan(m, offset, end, kernel)? {
            let piece = &mut buf[(s.logical - offset) as usize..][..s.len as usize];
            match s.kind {
                Kind::Hole | Kind::Unwritten => piece.fill(0),
                Kind::Direct(_) => m.read_mapped(s.physical, piece)?,
                Kind::Kernel => {
                    self.make_current_outside_kernel_pages(s.logical, s.end())?;
                    let fd = self.kernel_fd();
                    self.verify(fd)?;
                    let got = sys::pread_full(fd, piece, s.logical)
                        .map_err(|e| EmuError::io("pread of the file", e))?;
                    kernel_bytes += got as u64;
                    why = s.why;
                    if got < piece.len() {
                        return Ok(((s.logical - offset) as usize + got, kernel_bytes, why));
                    }
                }
            }
        }
        Ok((buf.len(), kernel_bytes, why))
    }

    /// Like pwrite: all of `buf` at `offset`, extending the file if it ends
    /// past the end. Data the device serves goes to it directly; growth,
    /// holes, unwritten extents, this handle's kernel pages and data the
    /// device does not serve go through the kernel (SPEC §3.4).
    pub fn write_at(&self, m: &Moneta, buf: &[u8], offset: u64) -> Result<usize, EmuError> {
        self.check_channel(m)?;
        if buf.is_empty() {
            return Ok(0);
        }
        let end = offset.checked_add(buf.len() as u64).ok_or_else(|| {
            EmuError::new(ErrorKind::Request, "write range overflows the file offset")
        })?;
        let size = self.len()?;
        if end > size {
            self.kernel_write(buf, offset, size)?;
            ROUTES.kernel(
                KernelReason::NewOrGrowingFile,
                RouteOp::Write,
                buf.len() as u64,
            );
            return Ok(buf.len());
        }
        // On a read-only grant too: the device, not the library, enforces
        // the permission (and refuses). The kernel takes what is shared
        // with another file (it copies on write) and data the device does
        // not serve.
        let direct = |s: &Segment| matches!(s.kind, Kind::Direct(a) if a.can_write() || !self.access.can_write());
        let mut attempt = 0;
        let mut allocated = false;
        loop {
            self.follow_epoch(m);
            let shared = self.kernel_writes.read().expect("kernel writes");
            let segments = self.plan(m, offset, end, attempt >= REVOKED_RETRIES)?;
            // A hole or unwritten extent inside the file (a sparse or
            // preallocated file) is written through the kernel, which
            // allocates it. SPEC §3.4's library allocates 1 MB chunks by
            // writing zeros there, but a chunk's "hole" may hold another
            // process's data that the kernel has not allocated yet (delayed
            // allocation, or a write racing with the map): zeros over it
            // would lose that data. Only the caller's bytes are written.
            if let Some(s) = segments.iter().find(|s| !direct(s)) {
                // Holes only (and data this handle may write): the daemon
                // may have the file system allocate them and grant them
                // (growth into holes), then the write goes direct.
                if !allocated
                    && attempt < REVOKED_RETRIES
                    && self.access.can_write()
                    && m.info().growth_holes
                    && segments.iter().all(|s| direct(s) || s.kind == Kind::Hole)
                {
                    allocated = true;
                    let (a, b) = allocation_window(offset, end, size);
                    if self.fetch(m, a, b, true)? {
                        continue;
                    }
                }
                let why = match s.kind {
                    Kind::Kernel => s.why,
                    Kind::Hole | Kind::Unwritten => KernelReason::Hole,
                    // Shared with another file: the kernel copies on write.
                    Kind::Direct(_) => KernelReason::Other,
                };
                drop(shared);
                self.kernel_write(buf, offset, size)?;
                ROUTES.kernel(why, RouteOp::Write, buf.len() as u64);
                // Holes and unwritten extents there are allocated now.
                self.invalidate(offset, end);
                return Ok(buf.len());
            }
            self.wrote_directly.store(true, Ordering::Release);
            let result = segments.iter().try_for_each(|s| {
                let piece = &buf[(s.logical - offset) as usize..][..s.len as usize];
                m.write_mapped(s.physical, piece)
            });
            match result {
                Err(e) if revoked(&e, self.access.can_write()) && attempt < REVOKED_RETRIES => {
                    attempt += 1;
                    self.invalidate(offset, end);
                }
                r => {
                    r?;
                    ROUTES.device(RouteOp::Write, buf.len() as u64);
                    return Ok(buf.len());
                }
            }
        }
    }

    /// Coherency after direct writes (SPEC §3.4): drop the kernel's cached
    /// pages of the file, so a later read(2) sees what the device holds;
    /// ranges the map sent to the kernel are asked again next time.
    ///
    /// This handle's kernel pages are written to the device first; they go
    /// to the direct path from now on if the file is registered already or
    /// has grown to [`DIRECT_AFTER_SYNC_BYTES`] (a small file only ever
    /// grown — a journal, a log — stays on the kernel path, where it costs
    /// no control-plane round trip).
    pub fn sync(&self, m: &Moneta) -> Result<(), EmuError> {
        self.sync_after(m, false)
    }

    /// [`MonetaFile::sync`] right after the program's own fsync or
    /// fdatasync of the descriptor succeeded (the kernel's pages are on the
    /// device already).
    pub fn synced(&self, m: &Moneta) -> Result<(), EmuError> {
        self.sync_after(m, true)
    }

    fn sync_after(&self, m: &Moneta, flushed: bool) -> Result<(), EmuError> {
        self.check_channel(m)?;
        self.map
            .write()
            .expect("map")
            .retain(|s| s.kind != Kind::Kernel);
        let mut pages = self.kernel_pages.lock().expect("kernel pages");
        if !pages.is_empty() {
            if !flushed {
                sys::fdatasync(self.kernel_fd())
                    .map_err(|e| EmuError::io("fdatasync of the file", e))?;
            }
            if self.id().is_some() || self.len()? >= DIRECT_AFTER_SYNC_BYTES {
                pages.clear();
                // Cached copies of them go stale under direct writes.
                self.wrote_directly.store(true, Ordering::Release);
            }
        }
        drop(pages);
        self.drop_stale_cache()
    }

    /// Before the kernel's fsync or fdatasync of the descriptor: if this
    /// handle was granted growth (direct writes into unwritten extents),
    /// monetad settles the file (writes what the device holds there
    /// through the kernel, making the extents written), so that the sync
    /// makes it durable. Announced as a layout change of the whole file,
    /// which revokes every channel's grants first.
    pub fn settle(&self, m: &Moneta) -> Result<(), EmuError> {
        self.check_channel(m)?;
        if !self.access.can_write() || !self.grew.swap(false, Ordering::AcqRel) {
            return Ok(());
        }
        self.layout_change(m, 0, || Ok(()))
    }

    /// Everything in the file so far was written through the kernel by
    /// this handle's open file (the shim serves a file being created
    /// through the kernel until its first fsync): it stays on the kernel
    /// path like any of this handle's kernel pages.
    pub fn written_through_the_kernel(&self) -> Result<(), EmuError> {
        let size = self.len()?;
        if size > 0 {
            add_range(
                &mut self.kernel_pages.lock().expect("kernel pages"),
                0,
                page_ceil(size),
            );
        }
        Ok(())
    }

    /// Truncate or extend through the kernel, after every channel's records
    /// of the blocks a truncation frees are revoked (SPEC §3.4, issue 8).
    pub fn set_len(&self, m: &Moneta, len: u64) -> Result<(), EmuError> {
        self.check_channel(m)?;
        let _alone = self.kernel_writes.write().expect("kernel writes");
        let old = self.len()?;
        let kept = old.min(len) / self.block_bytes * self.block_bytes;
        self.layout_change(m, kept, || {
            // The file system zeroes the rest of the block at the new end
            // through its page cache: it must start from the device's data
            // (clean pages only can be dropped: write the dirty ones first).
            sys::fdatasync(self.kernel_fd())
                .map_err(|e| EmuError::io("fdatasync of the file", e))?;
            self.drop_cache(kept, u64::MAX)?;
            sys::ftruncate(self.kernel_fd(), len)
                .map_err(|e| EmuError::io("ftruncate of the file", e))
        })?;
        self.invalidate(kept, u64::MAX);
        let mut pages = self.kernel_pages.lock().expect("kernel pages");
        remove_range(&mut pages, page_ceil(len), u64::MAX);
        if !len.is_multiple_of(PAGE) {
            // Its tail page (zeroed in the page cache) stays the kernel's.
            add_range(&mut pages, page_floor(len), page_ceil(len));
        }
        Ok(())
    }

    /// Run `change` (a layout change of the file from byte `from` on)
    /// between the control plane's revocation of every channel's records
    /// there and the end of the change. A descriptor that may not write
    /// cannot change the layout: the kernel's own error comes back.
    pub fn layout_change<T>(
        &self,
        m: &Moneta,
        from: u64,
        change: impl FnOnce() -> Result<T, EmuError>,
    ) -> Result<T, EmuError> {
        if !self.access.can_write() || self.device_bytes.is_some() {
            return change();
        }
        let token = m.layout_change(self.fd, from)?;
        let result = change();
        let done = m.layout_done(token);
        self.invalidate(from, u64::MAX);
        let value = result?;
        done?;
        Ok(value)
    }

    /// The kernel changed the file behind the library's back (an O_APPEND
    /// write, fallocate): the map is forgotten, to be asked again on the
    /// next access (whose FIEMAP flushes the kernel's data first).
    pub fn refresh(&self, m: &Moneta) -> Result<(), EmuError> {
        self.check_channel(m)?;
        self.invalidate(0, u64::MAX);
        Ok(())
    }

    /// Drop the kernel's clean cached pages of the file (if this handle
    /// wrote directly, they may be stale), then revoke the grant (the
    /// caller still owns and closes the descriptor). Unlike
    /// [`MonetaFile::sync`] this writes nothing back: closing is not
    /// fsync.
    pub fn close(self, m: &Moneta) -> Result<(), EmuError> {
        self.check_channel(m)?;
        self.drop_stale_cache()?;
        let Some(file_id) = self.id() else {
            return Ok(());
        };
        match m.call_with_fd(Request::CloseFile { file_id }, None)? {
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
                    "this file was opened on channel {}, not {}",
                    self.channel,
                    m.info().channel
                ),
            ))
        }
    }

    /// Write through the kernel, which first re-reads from the device the
    /// pages it only partly overwrites (its clean cached copies may predate
    /// direct writes). The pages become this handle's kernel pages.
    fn kernel_write(&self, buf: &[u8], offset: u64, size: u64) -> Result<(), EmuError> {
        let _alone = self.kernel_writes.write().expect("kernel writes");
        let from = page_floor(offset);
        let to = page_ceil(offset + buf.len() as u64);
        // Only pages holding data already can be stale (appending at a
        // page-aligned end touches none), and this handle's own kernel
        // pages are current.
        if from < page_ceil(size) {
            self.make_current_outside_kernel_pages(from, to.min(page_ceil(size)))?;
        }
        self.verify(self.kernel_fd())?;
        let written = sys::pwrite_all(self.kernel_fd(), buf, offset)
            .map_err(|e| EmuError::io("pwrite of the file", e));
        let mut pages = self.kernel_pages.lock().expect("kernel pages");
        // Even a failed write may have changed some of them.
        add_range(&mut pages, from, to);
        if pages.len() > MAX_KERNEL_RANGES {
            // Put everything on the device, where every path sees it.
            sys::fdatasync(self.kernel_fd())
                .map_err(|e| EmuError::io("fdatasync of the file", e))?;
            pages.clear();
        }
        written
    }

    /// After direct writes, the kernel's clean cached pages of the file
    /// may be stale: drop them (cheap when there are none).
    pub fn drop_stale_cache(&self) -> Result<(), EmuError> {
        if self.wrote_directly.load(Ordering::Acquire) {
            sys::drop_cached_pages(self.kernel_fd(), 0, 0)
                .map_err(|e| EmuError::io("dropping the file's cached pages", e))?;
        }
        Ok(())
    }

    /// Make the kernel's cache of `[from, to)` hold what the device holds,
    /// except where this handle's kernel pages are (they are the newest
    /// copy): cached blocks there may predate direct writes, and a dirty
    /// folio cannot be dropped with stale clean blocks in it, so the range
    /// (widened to whole folios) is written back, then dropped.
    fn make_current_outside_kernel_pages(&self, from: u64, to: u64) -> Result<(), EmuError> {
        let mut outside = vec![(page_floor(from), page_ceil(to))];
        for &(a, b) in self.kernel_pages.lock().expect("kernel pages").iter() {
            remove_range(&mut outside, a, b);
        }
        for (a, b) in outside {
            let a = a / FOLIO_MAX * FOLIO_MAX;
            let b = b.div_ceil(FOLIO_MAX).saturating_mul(FOLIO_MAX);
            sys::write_back_range(self.kernel_fd(), a, b - a)
                .map_err(|e| EmuError::io("writing back the file's cached pages", e))?;
            self.drop_cache(a, b)?;
        }
        Ok(())
    }

    /// Drop the kernel's clean cached data over `[from, to)`, widened to
    /// whole folios.
    fn drop_cache(&self, from: u64, to: u64) -> Result<(), EmuError> {
        let a = from / FOLIO_MAX * FOLIO_MAX;
        let len = if to == u64::MAX {
            0
        } else {
            to.div_ceil(FOLIO_MAX).saturating_mul(FOLIO_MAX) - a
        };
        sys::drop_cached_pages(self.kernel_fd(), a, len)
            .map_err(|e| EmuError::io("dropping the file's cached pages", e))
    }

    /// The map of `[from, to)` in order and without gaps, with this
    /// handle's kernel pages (and everything, if `kernel`, or if the daemon
    /// does not serve the file) sent to the kernel.
    fn plan(&self, m: &Moneta, from: u64, to: u64, kernel: bool) -> Result<Vec<Segment>, EmuError> {
        // Only the kernel pages this request touches (usually none).
        let pages: Vec<(u64, u64)> = {
            let all = self.kernel_pages.lock().expect("kernel pages");
            let first = all.partition_point(|r| r.1 <= from);
            all[first..]
                .iter()
                .take_while(|r| r.0 < to)
                .copied()
                .collect()
        };
        let mut out = Vec::new();
        let mut at = from;
        let mut i = pages.partition_point(|r| r.1 <= from);
        while at < to {
            let direct_end = match pages.get(i) {
                Some(&(a, b)) if a <= at => {
                    let b = b.min(to);
                    out.push(Segment::kernel(at, b, KernelReason::NewOrGrowingFile));
                    at = b;
                    i += 1;
                    continue;
                }
                Some(&(a, _)) => a.min(to),
                None => to,
            };
            if kernel {
                out.push(Segment::kernel(at, direct_end, KernelReason::Other));
            } else if self.register(m, false)?.is_none() {
                out.push(Segment::kernel(at, direct_end, self.refusal()));
            } else {
                out.extend(self.segments(m, at, direct_end)?);
            }
            at = direct_end;
        }
        Ok(out)
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
                    self.fetch(m, a, end, false)?;
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

    /// A soft miss: map `[from, to)` (or its first part) through the
    /// control plane. With `allocate` (a write into holes inside the file),
    /// the daemon first has the file system allocate the holes there
    /// (`allocate-file`); whether it did (a refusal: the kernel writes).
    fn fetch(&self, m: &Moneta, from: u64, to: u64, allocate: bool) -> Result<bool, EmuError> {
        m.count_soft_miss();
        let file_id = self.register(m, false)?.ok_or_else(|| {
            EmuError::new(
                ErrorKind::Unauthorized,
                "the daemon does not serve this file",
            )
        })?;
        let (offset, len) = (from, to - from);
        let request = if allocate {
            Request::AllocateFile {
                file_id,
                offset,
                len,
            }
        } else {
            Request::MapFile {
                file_id,
                offset,
                len,
            }
        };
        let (end, extents) = match m.call_with_fd(request, None) {
            Ok(Response::FileExtents { end, extents }) => (end, extents),
            Ok(other) => return Err(unexpected(other)),
            Err(e) if allocate && e.kind == ErrorKind::Unauthorized => return Ok(false),
            Err(e) => return Err(e),
        };
        if end <= from || end > to {
            return Err(EmuError::new(
                ErrorKind::Protocol,
                format!("map-file of [{from}, {to}) answered up to {end}"),
            ));
        }
        if extents
            .iter()
            .any(|e| e.unwritten && e.direct != DirectAccess::None)
        {
            self.grew.store(true, Ordering::Release);
        }
        self.insert(from, end, &extents);
        Ok(true)
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

/// Add `[from, to)` to sorted, disjoint ranges (merging what touches it).
fn add_range(ranges: &mut Vec<(u64, u64)>, from: u64, to: u64) {
    let first = ranges.partition_point(|r| r.1 < from);
    let last = ranges.partition_point(|r| r.0 <= to);
    let (mut a, mut b) = (from, to);
    if first < last {
        a = a.min(ranges[first].0);
        b = b.max(ranges[last - 1].1);
    }
    ranges.splice(first..last, [(a, b)]);
}

/// Remove `[from, to)` from sorted, disjoint ranges.
fn remove_range(ranges: &mut Vec<(u64, u64)>, from: u64, to: u64) {
    let mut out = Vec::with_capacity(ranges.len() + 1);
    for &(a, b) in ranges.iter() {
        if b <= from || a >= to {
            out.push((a, b));
            continue;
        }
        if a < from {
            out.push((a, from));
        }
        if b > to {
            out.push((to, b));
        }
    }
    *ranges = out;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_takes_the_aligned_chunks_inside_the_size() {
        const C: u64 = ALLOCATE_CHUNK_BYTES;
        // A small write in the middle of a big sparse file: its whole chunk.
        assert_eq!(allocation_window(C + 1000, C + 1100, 64 * C), (C, 2 * C));
        // Across a chunk boundary: both chunks.
        assert_eq!(
            allocation_window(2 * C - 10, 2 * C + 10, 64 * C),
            (C, 3 * C)
        );
        // The last chunk stops at the size (unaligned), never past it.
        assert_eq!(
            allocation_window(C + 5, C + 10, C + 4096 + 7),
            (C, C + 4103)
        );
        // A write that ends at the size keeps its own end.
        assert_eq!(allocation_window(0, 100, 100), (0, 100));
    }

    #[test]
    fn ranges_merge_and_split() {
        let mut r = Vec::new();
        add_range(&mut r, 10, 20);
        add_range(&mut r, 30, 40);
        add_range(&mut r, 20, 30);
        assert_eq!(r, [(10, 40)]);
        add_range(&mut r, 50, 60);
        add_range(&mut r, 0, 5);
        assert_eq!(r, [(0, 5), (10, 40), (50, 60)]);
        remove_range(&mut r, 15, 55);
        assert_eq!(r, [(0, 5), (10, 15), (55, 60)]);
        remove_range(&mut r, 0, u64::MAX);
        assert!(r.is_empty());
    }

    #[test]
    fn access_follows_the_descriptor() {
        assert_eq!(access_of(libc::O_RDONLY), DirectAccess::Read);
        assert_eq!(access_of(libc::O_RDWR), DirectAccess::ReadWrite);
        assert_eq!(access_of(libc::O_WRONLY), DirectAccess::Write);
        assert_eq!(
            access_of(libc::O_WRONLY | libc::O_APPEND),
            DirectAccess::None
        );
        assert_eq!(access_of(libc::O_RDWR | libc::O_APPEND), DirectAccess::Read);
    }
}
