//! libmoneta_preload.so: unmodified programs on the emulated Moneta-D
//! (SPEC §3.2). Loaded with LD_PRELOAD (`moneta run -- CMD`), it replaces the
//! C library's file calls. A file the program opens on the Moneta mount (its
//! st_dev is the mount's) is handed to monetad with its descriptor: the
//! kernel already checked the open, so possession is the permission (SPEC
//! §3.4, DESIGN). From then on reads and writes of that descriptor go through
//! moneta-client's channel, straight to the device; everything else — other
//! files, sockets, metadata calls, O_APPEND writes (which must be atomic) —
//! goes to the C library untouched.
//!
//! Interposed: open, open64, openat, openat64, creat, creat64 (and glibc's
//! fortified __open_2 … forms), close, read, write, pread(64), pwrite(64),
//! readv, writev, preadv(64), pwritev(64), dup, dup2, dup3, fcntl(64)
//! (F_DUPFD, F_DUPFD_CLOEXEC, F_SETFL's O_APPEND; the rest pass through),
//! truncate(64), ftruncate(64), fallocate(64), fsync, fdatasync, mmap(64),
//! munmap, mremap, ioctl (any but a few read-only ones runs as a layout
//! change of the whole file), the fortified __read_chk / __pread(64)_chk, and
//! for the run report io_submit, io_uring_setup and syscall(2) (which counts
//! rings made with __NR_io_uring_setup and passes everything on). fstat and
//! lseek need no interposing: the kernel keeps the file's size (the library
//! grows files through it) and its file position (the shim reads and moves
//! it), so both are shared across dup, fork and exec as POSIX says.
//!
//! Data safety (issue 8): a call that changes a file's layout (truncate,
//! ftruncate, open with O_TRUNC, fallocate that punches, zeroes, collapses
//! or inserts) first asks monetad to revoke every channel's records of the
//! file from the changed offset on, and ends the change after the call; a
//! file this process maps is announced first, so every channel uses the
//! kernel for it while any process maps it.
//!
//! Variadic C functions (open's mode, fcntl's argument) are declared with
//! their optional argument as a fixed one: on x86-64 the System V ABI passes
//! it in the same register either way.
//!
//! A call that fails in the shim sets errno (what the kernel said, e.g.
//! ENOSPC from growing a file, or EIO when the device failed) and returns
//! -1, as the real call would. A thread already inside the shim
//! (the library's own system calls) always gets the C library directly.
//!
//! # Safety
//! Every exported function is `unsafe extern "C"` with exactly the contract
//! of the POSIX / glibc function it replaces (valid paths, buffers of the
//! given length, iovec arrays); that contract is not repeated on each.

#![allow(clippy::missing_safety_doc)]

mod descriptors;
mod real;
mod report;
mod state;

use libc::{c_char, c_int, c_void, iovec, mode_t, off64_t, off_t, size_t, ssize_t};
use moneta_client::file::{KernelReason, MonetaFile, RouteOp, ROUTES};
use real::real;
use state::{shim, warn, FileMapping, OpenFile, OWN_FD_MIN};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

thread_local! {
    /// Set while this thread runs shim code: its own calls pass through.
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Run `f` as shim code, or return None if this thread already is inside.
fn enter<T>(f: impl FnOnce() -> T) -> Option<T> {
    let already = INSIDE.with(|i| i.replace(true));
    if already {
        return None;
    }
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            INSIDE.with(|i| i.set(false));
        }
    }
    let _leave = Leave;
    Some(f())
}

fn set_errno(e: c_int) {
    // SAFETY: errno is this thread's.
    unsafe { *libc::__errno_location() = e };
}

fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

/// At exit: the run report.
extern "C" fn fini() {
    report::at_exit();
}

extern "C" fn init() {
    report::init();
    extern "C" fn prepare() {
        shim().before_fork();
    }
    extern "C" fn parent() {
        shim().after_fork_in_parent();
    }
    extern "C" fn child() {
        shim().after_fork_in_child();
        // The child's run report counts its own rings.
        report::after_fork_in_child();
    }
    // SAFETY: registering fork handlers that only take and release the
    // shim's own locks and forget the parent's channel in the child.
    unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
}

/// After the real open returned `fd`: if the file is on the Moneta mount,
/// register it with monetad and start handling it.
fn adopt(fd: c_int, flags: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    let _ = enter(|| {
        let s = shim();
        // Whatever the shim knew under this number is gone (the kernel
        // reused it: the program closed it behind the shim's back).
        descriptors::drop_stale(fd);
        let Some(dev) = s.mount_dev else { return };
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0
            || st.st_dev != dev
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
        {
            return;
        }
        let Some(m) = s.moneta() else { return };
        drop(m);
        // An active swap file: the kernel refuses every write to it
        // (ETXTBSY), so it is the kernel's.
        let kernel_only = if descriptors::is_swap_file(st.st_dev, st.st_ino) {
            KernelReason::KernelRefusedAttr as u8 + 1
        } else {
            0
        };
        // Lazy: the library's handle is made, and the daemon hears of the
        // file, when the device is first needed. A file that was empty
        // when opened for writing is being created: the kernel serves it
        // until the program's first fsync of it (growth costs nothing more
        // than the kernel's own path).
        s.insert(
            fd,
            Arc::new(OpenFile {
                file: std::sync::Mutex::new((s.generation(), None)),
                position: std::sync::Mutex::new(()),
                append: AtomicBool::new(flags & libc::O_APPEND != 0),
                fresh: AtomicBool::new(
                    st.st_size == 0 && flags & libc::O_ACCMODE != libc::O_RDONLY,
                ),
                direct_align: std::sync::atomic::AtomicU64::new(direct_alignment(fd, flags)),
                // The library keeps a descriptor of its own for the open file
                // description (made when first needed): the program may dup2
                // and close the one it got (dd does), and the shim's must
                // outlive every alias.
                fd: std::sync::atomic::AtomicI32::new(-1),
                identity: (st.st_dev, st.st_ino),
                kernel_only: std::sync::atomic::AtomicU8::new(kernel_only),
                attrs_clean: std::sync::atomic::AtomicU64::new(0),
            }),
        );
    });
    fd
}

/// O_DIRECT's alignment for [`OpenFile::direct_align`] (0 without it).
fn direct_alignment(fd: c_int, flags: c_int) -> u64 {
    if flags & libc::O_DIRECT == 0 {
        return 0;
    }
    // Where the file system does not say, the logical block of every
    // device here (512 B).
    let (mem, offset) = moneta_abi::sys::dio_alignment(fd).unwrap_or((512, 512));
    (mem as u64) << 32 | offset as u64
}

/// Whether a direct (O_DIRECT) access of `len` bytes at `addr` in memory
/// and `offset` in the file breaks its alignment.
fn misaligned(of: &OpenFile, addr: usize, len: usize, offset: u64) -> bool {
    let a = of.direct_align.load(Ordering::Acquire);
    if a == 0 {
        return false;
    }
    let (mem, off) = ((a >> 32).max(1), (a & 0xFFFF_FFFF).max(1));
    !(addr as u64).is_multiple_of(mem)
        || !(len as u64).is_multiple_of(off)
        || !offset.is_multiple_of(off)
}

/// Run `f` with the open file's library handle, re-registering it first if
/// this process forked since (the child has its own channel).
fn with_file<T>(
    of: &OpenFile,
    f: impl FnOnce(&moneta_client::Moneta, &MonetaFile) -> Result<T, c_int>,
) -> Result<T, c_int> {
    let s = shim();
    let m = s.moneta().ok_or(libc::EIO)?;
    let file = {
        let mut slot = of.file.lock().map_err(|_| libc::EIO)?;
        if slot.0 != s.generation() || slot.1.is_none() {
            // The parent's handle: forget it (closing would name the parent's
            // file); its second descriptor stays open, the shim's.
            let gone = slot.1.take();
            s.retire(gone.as_ref().and_then(|f| f.twin_fd()));
            std::mem::forget(gone);
            let own = of.fd.load(Ordering::Acquire);
            let file = m.open_file_lazy(own).map_err(|e| {
                warn(&format!("descriptor {own}: {e}"));
                e.posix_errno()
            })?;
            *slot = (s.generation(), Some(Arc::new(file)));
        }
        slot.1.clone().expect("just registered")
    };
    // The lock is not held during the IO: threads sharing a descriptor
    // (MonetaFile is thread-safe) run in parallel.
    f(&m, &file)
}

/// The errno a program expects for a failure; failures that are not the
/// kernel's own answer (a device or daemon problem) are also reported on
/// stderr, since EIO alone says little.
fn io_error(e: moneta_client::EmuError) -> c_int {
    if e.errno.is_none() {
        warn(&e.to_string());
    }
    e.posix_errno()
}

/// The shim's open file for the program's `fd`, if the shim handles it in
/// this process: not in a child made without fork handlers (another pid),
/// and not if the number no longer names the file (closed and reused
/// behind the shim's back: the entry is dropped).
fn lookup(fd: c_int) -> Option<Arc<OpenFile>> {
    let s = shim();
    let of = s.get(fd)?;
    if s.foreign() {
        return None;
    }
    Some(of)
}

/// Handle a call for a descriptor the shim owns, or fall through.
fn ours<T>(fd: c_int, f: impl FnOnce(&Arc<OpenFile>) -> T) -> Option<T> {
    enter(|| {
        let of = lookup(fd)?;
        of.own_fd(fd)?;
        Some(f(&of))
    })
    .flatten()
}

/// Why the kernel serves a read or write of `of` through the program's
/// `fd` at `offset` (None: the file position) of the buffers `io`, or None
/// if the shim may. The status flags are read from the kernel on every
/// call, so a change by `fcntl(F_SETFL)` in any process sharing the open
/// file description takes effect at once; writes also read the file's
/// attributes (immutable, append-only: the kernel refuses or appends)
/// and check that `fd` still names the file: at once after an
/// attribute-changing ioctl of this process, else at most every
/// [`descriptors::RECHECK_NS`] (another process's `chattr` or `swapon`
/// takes effect within that).
fn kernel_reason(
    of: &OpenFile,
    fd: c_int,
    io: &[(usize, usize)],
    offset: Option<i64>,
    op: RouteOp,
) -> Result<Option<KernelReason>, ()> {
    if op == RouteOp::Write {
        descriptors::follow_swap();
    }
    let only = of.kernel_only.load(Ordering::Acquire);
    if only != 0 {
        return Ok(KernelReason::ALL.get(only as usize - 1).copied());
    }
    // SAFETY: F_GETFL on the program's descriptor.
    let flags = unsafe { (real().fcntl)(fd, libc::F_GETFL, 0) };
    if flags < 0 {
        return Err(()); // the kernel answers (EBADF)
    }
    of.append
        .store(flags & libc::O_APPEND != 0, Ordering::Release);
    if (flags & libc::O_DIRECT != 0) != (of.direct_align.load(Ordering::Acquire) != 0) {
        of.direct_align
            .store(direct_alignment(fd, flags), Ordering::Release);
    }
    if op == RouteOp::Write && !descriptors::attributes_fresh(of) {
        let epoch = descriptors::attribute_epoch();
        match descriptors::write_attributes(fd) {
            Some((id, attrs)) if id == of.identity => {
                if attrs & (libc::STATX_ATTR_IMMUTABLE | libc::STATX_ATTR_APPEND) as u64 != 0 {
                    return Ok(Some(KernelReason::KernelRefusedAttr));
                }
                descriptors::attributes_seen(of, epoch);
            }
            _ => return Err(()),
        }
    }
    if of.fresh.load(Ordering::Acquire) {
        // A file being created stays on the kernel path (small files never
        // cost a control-plane round trip) until its first fsync, or, where
        // the daemon fills holes with growth grants, until it is big enough
        // that the direct path pays: its writes into holes then go direct.
        // What it wrote through the kernel so far is flushed by the first
        // soft miss over it, which grants nothing where a page is cached.
        let leave = op == RouteOp::Write
            && shim().moneta().is_some_and(|m| m.info().growth_holes)
            && moneta_abi::sys::file_len(fd)
                .is_ok_and(|n| n >= moneta_client::file::DIRECT_AFTER_SYNC_BYTES);
        if !leave {
            return Ok(Some(KernelReason::NewOrGrowingFile));
        }
        of.fresh.store(false, Ordering::Release);
    }
    if of.direct_align.load(Ordering::Acquire) != 0 {
        let mut at = match offset {
            Some(o) => u64::try_from(o).map_err(|_| ())?,
            None => position(fd).map_err(|_| ())?,
        };
        for &(addr, len) in io {
            if misaligned(of, addr, len, at) {
                return Ok(Some(KernelReason::UnalignedODirect));
            }
            at += len as u64;
        }
    }
    Ok(None)
}

/// As [`ours`], for reads and writes of the buffers `io` (address,
/// length) at `offset` (None: the file position): a file being created
/// (see [`OpenFile::fresh`]) falls through to the kernel too, and so does
/// misaligned O_DIRECT I/O, whose outcome is the file system's to decide
/// (EINVAL, or a short read at the end of the file or in a hole), and
/// whatever [`kernel_reason`] sends there; counted for the run report.
fn ours_io<T>(
    fd: c_int,
    io: &[(usize, usize)],
    offset: Option<i64>,
    op: RouteOp,
    f: impl FnOnce(&Arc<OpenFile>) -> T,
) -> Option<T> {
    enter(|| {
        let of = lookup(fd)?;
        let bytes = io.iter().map(|x| x.1 as u64).sum();
        match kernel_reason(&of, fd, io, offset, op) {
            Ok(None) => {}
            Ok(Some(why)) => {
                ROUTES.kernel(why, op, bytes);
                return None;
            }
            Err(()) => {
                ROUTES.kernel(KernelReason::Other, op, bytes);
                return None;
            }
        }
        if of.own_fd(fd).is_none() {
            ROUTES.kernel(KernelReason::Other, op, bytes);
            return None;
        }
        Some(f(&of))
    })
    .flatten()
}

fn ret(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}

fn read_at(of: &OpenFile, buf: &mut [u8], offset: u64) -> Result<usize, c_int> {
    with_file(of, |m, f| f.read_at(m, buf, offset).map_err(io_error))
}

fn write_at(of: &OpenFile, buf: &[u8], offset: u64) -> Result<usize, c_int> {
    with_file(of, |m, f| {
        let own = of.fd.load(Ordering::Acquire);
        if of.append.load(Ordering::Acquire) || !f.access().can_write() {
            // SAFETY: F_GETFL on the shim's descriptor of the file.
            let flags = unsafe { (real().fcntl)(own, libc::F_GETFL, 0) };
            if flags & libc::O_ACCMODE == libc::O_RDONLY {
                // As the kernel: writing a descriptor opened read-only is EBADF.
                return Err(libc::EBADF);
            }
            // pwrite on an O_APPEND descriptor appends (Linux), and a
            // handle the daemon gave read-only access (opened O_APPEND)
            // writes through the kernel: the kernel's job.
            settle_before_kernel_write(of)?;
            // SAFETY: the caller's buffer on the shim's own descriptor.
            let n =
                unsafe { (real().pwrite64)(own, buf.as_ptr().cast(), buf.len(), offset as i64) };
            if n < 0 {
                // SAFETY: reading this thread's errno.
                return Err(unsafe { *libc::__errno_location() });
            }
            ROUTES.kernel(KernelReason::Append, RouteOp::Write, n as u64);
            f.refresh(m).map_err(io_error)?;
            return Ok(n as usize);
        }
        f.write_at(m, buf, offset).map_err(io_error)
    })
}

/// Before an append through the kernel's page cache: what this process's
/// handles of the file wrote direct into unwritten extents is settled
/// first. Settling writes the device's bytes there through the kernel, so
/// a later settle (at fsync) would otherwise put the device's older bytes
/// over what the kernel appended now. The appending descriptor's own
/// handle may not write (O_APPEND) and never grew: the handle that did is
/// the same file's read-write one (torture seed 440044 on XFS: appended
/// bytes read back as zeros after fdatasync). Another process's growth is
/// not settled here.
fn settle_before_kernel_write(of: &OpenFile) -> Result<(), c_int> {
    let s = shim();
    for fd in s.known() {
        let Some(other) = s.get(fd) else { continue };
        if other.identity == of.identity && other.own_fd(fd).is_some() {
            with_file(&other, |m, f| f.settle(m).map_err(io_error))?;
        }
    }
    Ok(())
}

/// A write to an O_APPEND file: through the kernel (atomic append), then
/// made visible to the direct path.
fn append(of: &OpenFile, fd: c_int, buf: &[u8]) -> Result<usize, c_int> {
    settle_before_kernel_write(of)?;
    // SAFETY: the caller's buffer, passed on unchanged.
    let n = unsafe { (real().write)(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        // SAFETY: reading this thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    ROUTES.kernel(KernelReason::Append, RouteOp::Write, n as u64);
    with_file(of, |m, f| f.refresh(m).map_err(io_error))?;
    Ok(n as usize)
}

/// # Safety
/// `buf` valid for `len` bytes.
unsafe fn slice_mut<'a>(buf: *mut c_void, len: size_t) -> &'a mut [u8] {
    if len == 0 {
        &mut []
    } else {
        // SAFETY: the caller's promise (read(2)'s contract).
        unsafe { std::slice::from_raw_parts_mut(buf.cast(), len) }
    }
}

/// # Safety
/// `buf` valid for `len` bytes.
unsafe fn slice<'a>(buf: *const c_void, len: size_t) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise (write(2)'s contract).
        unsafe { std::slice::from_raw_parts(buf.cast(), len) }
    }
}

/// The kernel's file position of `fd`.
fn position(fd: c_int) -> Result<u64, c_int> {
    // SAFETY: lseek on the caller's descriptor.
    let p = unsafe { (real().lseek64)(fd, 0, libc::SEEK_CUR) };
    if p < 0 {
        // SAFETY: reading this thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    Ok(p as u64)
}

/// Move the kernel's file position by `delta` bytes in one system call
/// (atomic for every holder of the open file description, across fork,
/// exec and SCM_RIGHTS alike): the new position.
fn advance(fd: c_int, delta: i64) -> Result<u64, c_int> {
    // SAFETY: lseek on the caller's descriptor.
    let p = unsafe { (real().lseek64)(fd, delta, libc::SEEK_CUR) };
    if p < 0 {
        // SAFETY: reading this thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
    Ok(p as u64)
}

/// write/writev: `len` bytes at the kernel's file position. The range is
/// reserved first by moving the shared position past it in one lseek, so
/// processes sharing the open file description (fork, exec, SCM_RIGHTS)
/// never write over each other, as the kernel's own write guarantees.
fn write_at_position(
    of: &OpenFile,
    fd: c_int,
    len: usize,
    io: impl FnOnce(u64) -> Result<usize, c_int>,
) -> ssize_t {
    let Ok(_held) = of.position.lock() else {
        return fail(libc::EIO);
    };
    let r = advance(fd, len as i64).and_then(|end| {
        let at = end - len as u64;
        io(at).inspect_err(|_| {
            // Nothing was written: give the range back (the kernel's
            // write leaves the position alone when it fails).
            let _ = advance(fd, -(len as i64));
        })
    });
    ret(r)
}

/// read/readv: up to `len` bytes at the kernel's file position, reserved
/// as for writes (up to the end of the file); a short read gives back
/// what it did not use.
fn read_at_position(
    of: &OpenFile,
    fd: c_int,
    len: usize,
    io: impl FnOnce(u64, usize) -> Result<usize, c_int>,
) -> ssize_t {
    let Ok(_held) = of.position.lock() else {
        return fail(libc::EIO);
    };
    let r = position(fd).and_then(|at| {
        let size =
            moneta_abi::sys::file_len(fd).map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))?;
        let want = (len as u64).min(size.saturating_sub(at)) as usize;
        if want == 0 {
            return Ok(0);
        }
        let at = advance(fd, want as i64)? - want as u64;
        let n = io(at, want).inspect_err(|_| {
            let _ = advance(fd, -(want as i64));
        })?;
        if n != want {
            let _ = advance(fd, n as i64 - want as i64);
        }
        Ok(n)
    });
    ret(r)
}

fn do_read(of: &OpenFile, fd: c_int, buf: &mut [u8]) -> ssize_t {
    let len = buf.len();
    read_at_position(of, fd, len, |at, want| read_at(of, &mut buf[..want], at))
}

fn do_write(of: &OpenFile, fd: c_int, buf: &[u8]) -> ssize_t {
    if of.append.load(Ordering::Acquire) {
        // The kernel appends atomically and moves the position itself.
        return ret(append(of, fd, buf));
    }
    write_at_position(of, fd, buf.len(), |at| write_at(of, buf, at))
}

fn check_offset(offset: i64) -> Result<u64, c_int> {
    u64::try_from(offset).map_err(|_| libc::EINVAL)
}

// ---- open -----------------------------------------------------------------

/// Whether `path` (relative to `dir`) names an existing regular file on the
/// mount (a stat, so nothing but such a file is ever opened early).
fn regular_on_mount(dir: c_int, path: *const c_char) -> bool {
    enter(|| {
        let dev = shim().mount_dev?;
        // SAFETY: fstatat into a zeroed struct with the caller's path.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let ok = unsafe { libc::fstatat(dir, path, &mut st, 0) } == 0;
        Some(ok && st.st_dev == dev && st.st_mode & libc::S_IFMT == libc::S_IFREG)
    })
    .flatten()
    .unwrap_or(false)
}

/// An open(2) of `path` (relative to `dir`) with `flags`: an O_TRUNC open of
/// a file on the mount is a layout change monetad hears of first; a regular
/// file on the mount that opened is handled by the shim from then on.
fn open_with(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    real_open: impl FnOnce() -> c_int,
) -> c_int {
    let fd = if flags & libc::O_TRUNC != 0 && regular_on_mount(dir, path) {
        layout_change_by_path(
            // SAFETY: the caller's path, opened for writing without side
            // effects (no O_CREAT, no O_TRUNC).
            || unsafe {
                (real().openat)(
                    dir,
                    path,
                    libc::O_WRONLY
                        | libc::O_NONBLOCK
                        | libc::O_NOCTTY
                        | libc::O_CLOEXEC
                        | (flags & libc::O_NOFOLLOW),
                    0,
                )
            },
            |_| 0,
            real_open,
        )
    } else {
        real_open()
    };
    adopt(fd, flags)
}

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    open_with(libc::AT_FDCWD, path, flags, || unsafe {
        (real().open)(path, flags, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    open_with(libc::AT_FDCWD, path, flags, || unsafe {
        (real().open64)(path, flags, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    open_with(dir, path, flags, || unsafe {
        (real().openat)(dir, path, flags, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    open_with(dir, path, flags, || unsafe {
        (real().openat64)(dir, path, flags, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    open_with(libc::AT_FDCWD, path, flags, || unsafe {
        (real().__open_2)(path, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    open_with(libc::AT_FDCWD, path, flags, || unsafe {
        (real().__open64_2)(path, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    open_with(dir, path, flags, || unsafe {
        (real().__openat_2)(dir, path, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    open_with(dir, path, flags, || unsafe {
        (real().__openat64_2)(dir, path, flags)
    })
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    open_with(libc::AT_FDCWD, path, flags, || unsafe {
        (real().creat)(path, mode)
    })
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    open_with(libc::AT_FDCWD, path, flags, || unsafe {
        (real().creat64)(path, mode)
    })
}

// ---- close, dup -------------------------------------------------------------

/// Forget `fd` (closing the library's file if no descriptor is left).
fn forget(fd: c_int) {
    let _ = enter(|| forget_now(fd));
}

/// [`forget`], from shim code.
fn forget_now(fd: c_int) {
    {
        // A child made without fork handlers touches nothing of the shim's
        // (the channel, even the table, may be its parent's).
        if shim().get(fd).is_none() || shim().foreign() {
            return;
        }
        if let Some(of) = shim().remove(fd) {
            if let Ok(mut slot) = of.file.lock() {
                if slot.0 == shim().generation() {
                    if let (Some(m), Some(f)) = (shim().moneta(), slot.1.take()) {
                        // Another thread still in an IO on this file (closing
                        // under it is the program's race): its grant then
                        // lasts until the channel closes.
                        match Arc::try_unwrap(f) {
                            Ok(f) => {
                                if let Err(e) = f.close(&m) {
                                    warn(&e.to_string());
                                }
                            }
                            Err(f) => {
                                let _ = f.drop_stale_cache();
                            }
                        }
                    }
                } else {
                    let gone = slot.1.take();
                    shim().retire(gone.as_ref().and_then(|f| f.twin_fd()));
                    std::mem::forget(gone);
                }
            }
            // The shim's own descriptor of the file closes when the last
            // user of `of` lets go of it (OpenFile's Drop).
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if descriptors::held_by_shim(fd) {
        // A number the program never opened: the kernel would say EBADF.
        return fail(libc::EBADF);
    }
    forget(fd);
    unsafe { (real().close)(fd) }
}

/// `new` now refers to what `old` refers to (or, if the shim does not
/// handle `old`, to nothing the shim knows).
fn alias(old: c_int, new: c_int) -> c_int {
    if new >= 0 && new != old {
        let _ = enter(|| match shim().get(old) {
            Some(of) if !shim().foreign() => shim().insert(new, of),
            _ => descriptors::drop_stale(new),
        });
    }
    new
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    alias(fd, unsafe { (real().dup)(fd) })
}

#[no_mangle]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    if old != new {
        descriptors::vacate_for_program(new);
        forget(new);
    }
    alias(old, unsafe { (real().dup2)(old, new) })
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new {
        descriptors::vacate_for_program(new);
        forget(new);
    }
    alias(old, unsafe { (real().dup3)(old, new, flags) })
}

fn fcntl_common(fd: c_int, cmd: c_int, arg: usize, r: c_int) -> c_int {
    match cmd {
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => alias(fd, r),
        libc::F_SETFL if r == 0 => {
            let _ = ours(fd, |of| {
                of.append
                    .store(arg as c_int & libc::O_APPEND != 0, Ordering::Release);
                of.direct_align
                    .store(direct_alignment(fd, arg as c_int), Ordering::Release);
            });
            r
        }
        _ => r,
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_common(fd, cmd, arg, unsafe { (real().fcntl)(fd, cmd, arg) })
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    fcntl_common(fd, cmd, arg, unsafe { (real().fcntl64)(fd, cmd, arg) })
}

/// ioctls that only read a file's state (or the terminal's): everything
/// else a program asks of a file on the mount may move its blocks where no
/// event reports it (XFS_IOC_SWAPEXT, XFS_IOC_EXCHANGE_RANGE,
/// EXT4_IOC_SWAP_BOOT, EXT4_IOC_MOVE_EXT, …), so it runs as a layout
/// change of the whole file.
const READ_ONLY_IOCTLS: [libc::c_ulong; 6] = [
    0xC020_660B, // FS_IOC_FIEMAP
    0x8008_6601, // FS_IOC_GETFLAGS
    0x801C_581F, // FS_IOC_FSGETXATTR
    0x0000_0002, // FIGETBSZ
    0x0000_541B, // FIONREAD
    0x8004_6601, // FS_IOC32_GETFLAGS
];

const FICLONE: libc::c_ulong = 0x4004_9409;
const FICLONERANGE: libc::c_ulong = 0x4020_940D;

/// Whether `request` clones from a source that is not on the mount: the
/// kernel refuses a clone across mounts (EXDEV) before it touches the
/// destination, so no layout change is needed (cp tries FICLONE for every
/// file it copies in from elsewhere).
fn clone_from_elsewhere(request: libc::c_ulong, arg: usize) -> bool {
    let src = match request {
        FICLONE => arg as c_int,
        // SAFETY: FICLONERANGE's argument points to a struct
        // file_clone_range, whose first field is the source's s64 fd.
        FICLONERANGE if arg != 0 => {
            (unsafe { std::ptr::read_unaligned(arg as *const i64) }) as c_int
        }
        _ => return false,
    };
    let Some(dev) = shim().mount_dev else {
        return false;
    };
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(src, &mut st) }) == 0 && st.st_dev != dev
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, request: libc::c_ulong, arg: usize) -> c_int {
    // SAFETY: the caller's arguments, passed on unchanged.
    let real_call = || unsafe { (real().ioctl)(fd, request, arg) };
    if READ_ONLY_IOCTLS.contains(&request) || clone_from_elsewhere(request, arg) {
        return real_call();
    }
    // Any other ioctl may change a file's attributes (FS_IOC_SETFLAGS,
    // FS_IOC_FSSETXATTR): the next write of every file reads them again.
    let real_call = || {
        let r = real_call();
        descriptors::attributes_may_have_changed();
        r
    };
    let handled = ours(fd, |of| {
        let r = with_file(of, |m, f| {
            f.layout_change(m, 0, || {
                let r = real_call();
                // SAFETY: reading this thread's errno right after the call.
                Ok((r, unsafe { *libc::__errno_location() }))
            })
            .map_err(io_error)
        });
        match r {
            Ok((r, errno)) => {
                set_errno(errno);
                r
            }
            Err(e) => fail(e),
        }
    });
    handled.unwrap_or_else(real_call)
}

// ---- read, write ----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    ours_io(fd, &[(buf as usize, len)], None, RouteOp::Read, |of| {
        do_read(of, fd, unsafe { slice_mut(buf, len) })
    })
    .unwrap_or_else(|| unsafe { (real().read)(fd, buf, len) })
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
) -> ssize_t {
    ours_io(
        fd,
        &[(buf as usize, len.min(buflen))],
        None,
        RouteOp::Read,
        |of| do_read(of, fd, unsafe { slice_mut(buf, len.min(buflen)) }),
    )
    .unwrap_or_else(|| unsafe { (real().__read_chk)(fd, buf, len, buflen) })
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    ours_io(fd, &[(buf as usize, len)], None, RouteOp::Write, |of| {
        do_write(of, fd, unsafe { slice(buf, len) })
    })
    .unwrap_or_else(|| unsafe { (real().write)(fd, buf, len) })
}

fn do_pread(fd: c_int, buf: *mut c_void, len: size_t, offset: i64) -> Option<ssize_t> {
    ours_io(
        fd,
        &[(buf as usize, len)],
        Some(offset),
        RouteOp::Read,
        |of| ret(check_offset(offset).and_then(|o| read_at(of, unsafe { slice_mut(buf, len) }, o))),
    )
}

fn do_pwrite(fd: c_int, buf: *const c_void, len: size_t, offset: i64) -> Option<ssize_t> {
    ours_io(
        fd,
        &[(buf as usize, len)],
        Some(offset),
        RouteOp::Write,
        |of| ret(check_offset(offset).and_then(|o| write_at(of, unsafe { slice(buf, len) }, o))),
    )
}

#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, len: size_t, offset: off_t) -> ssize_t {
    do_pread(fd, buf, len, offset)
        .unwrap_or_else(|| unsafe { (real().pread)(fd, buf, len, offset) })
}

#[no_mangle]
pub unsafe extern "C" fn pread64(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    offset: off64_t,
) -> ssize_t {
    do_pread(fd, buf, len, offset)
        .unwrap_or_else(|| unsafe { (real().pread64)(fd, buf, len, offset) })
}

#[no_mangle]
pub unsafe extern "C" fn __pread_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    offset: off_t,
    buflen: size_t,
) -> ssize_t {
    do_pread(fd, buf, len.min(buflen), offset)
        .unwrap_or_else(|| unsafe { (real().__pread_chk)(fd, buf, len, offset, buflen) })
}

#[no_mangle]
pub unsafe extern "C" fn __pread64_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    offset: off64_t,
    buflen: size_t,
) -> ssize_t {
    do_pread(fd, buf, len.min(buflen), offset)
        .unwrap_or_else(|| unsafe { (real().__pread64_chk)(fd, buf, len, offset, buflen) })
}

#[no_mangle]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    offset: off_t,
) -> ssize_t {
    do_pwrite(fd, buf, len, offset)
        .unwrap_or_else(|| unsafe { (real().pwrite)(fd, buf, len, offset) })
}

#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    offset: off64_t,
) -> ssize_t {
    do_pwrite(fd, buf, len, offset)
        .unwrap_or_else(|| unsafe { (real().pwrite64)(fd, buf, len, offset) })
}

// ---- vectored -------------------------------------------------------------

/// The iovecs as slices.
///
/// # Safety
/// `iov` valid for `count` entries, each describing valid memory.
unsafe fn iovecs<'a>(iov: *const iovec, count: c_int) -> Result<&'a [iovec], c_int> {
    if !(0..=libc::UIO_MAXIOV).contains(&count) {
        return Err(libc::EINVAL);
    }
    if count == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's promise (readv(2)'s contract).
    Ok(unsafe { std::slice::from_raw_parts(iov, count as usize) })
}

/// The (address, length) of each buffer, for the O_DIRECT alignment check
/// (none if the vector itself is invalid: the call reports that).
///
/// # Safety
/// As [`iovecs`].
unsafe fn buffers(iov: *const iovec, count: c_int) -> Vec<(usize, usize)> {
    // SAFETY: the caller's promise.
    unsafe { iovecs(iov, count) }
        .map(|v| v.iter().map(|x| (x.iov_base as usize, x.iov_len)).collect())
        .unwrap_or_default()
}

/// Read into each buffer in turn from `offset`; stops early at end of file.
fn vread(of: &OpenFile, iov: &[iovec], offset: u64) -> Result<usize, c_int> {
    let mut done = 0usize;
    for v in iov {
        // SAFETY: readv's contract: each iovec describes writable memory.
        let buf = unsafe { slice_mut(v.iov_base, v.iov_len) };
        let n = read_at(of, buf, offset + done as u64)?;
        done += n;
        if n < v.iov_len {
            break;
        }
    }
    Ok(done)
}

fn vwrite(of: &OpenFile, iov: &[iovec], offset: u64) -> Result<usize, c_int> {
    // One contiguous write, so a concurrent reader never sees half of it
    // split at an iovec boundary any more than pwrite would allow.
    let total: usize = iov.iter().map(|v| v.iov_len).sum();
    let mut data = Vec::with_capacity(total);
    for v in iov {
        // SAFETY: writev's contract: each iovec describes readable memory.
        data.extend_from_slice(unsafe { slice(v.iov_base, v.iov_len) });
    }
    write_at(of, &data, offset)
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    ours_io(
        fd,
        &unsafe { buffers(iov, count) },
        None,
        RouteOp::Read,
        |of| match unsafe { iovecs(iov, count) } {
            Ok(v) => {
                let len = v.iter().map(|x| x.iov_len).sum();
                read_at_position(of, fd, len, |at, _| vread(of, v, at))
            }
            Err(e) => fail(e),
        },
    )
    .unwrap_or_else(|| unsafe { (real().readv)(fd, iov, count) })
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    ours_io(
        fd,
        &unsafe { buffers(iov, count) },
        None,
        RouteOp::Write,
        |of| {
            let v = match unsafe { iovecs(iov, count) } {
                Ok(v) => v,
                Err(e) => return fail(e),
            };
            if of.append.load(Ordering::Acquire) {
                let data: Vec<u8> = v
                    .iter()
                    .flat_map(|x| unsafe { slice(x.iov_base, x.iov_len) }.iter().copied())
                    .collect();
                return do_write(of, fd, &data);
            }
            let len = v.iter().map(|x| x.iov_len).sum();
            write_at_position(of, fd, len, |at| vwrite(of, v, at))
        },
    )
    .unwrap_or_else(|| unsafe { (real().writev)(fd, iov, count) })
}

fn do_preadv(fd: c_int, iov: *const iovec, count: c_int, offset: i64) -> Option<ssize_t> {
    ours_io(
        fd,
        &unsafe { buffers(iov, count) },
        Some(offset),
        RouteOp::Read,
        |of| {
            ret(check_offset(offset)
                .and_then(|o| unsafe { iovecs(iov, count) }.and_then(|v| vread(of, v, o))))
        },
    )
}

fn do_pwritev(fd: c_int, iov: *const iovec, count: c_int, offset: i64) -> Option<ssize_t> {
    ours_io(
        fd,
        &unsafe { buffers(iov, count) },
        Some(offset),
        RouteOp::Write,
        |of| {
            ret(check_offset(offset)
                .and_then(|o| unsafe { iovecs(iov, count) }.and_then(|v| vwrite(of, v, o))))
        },
    )
}

#[no_mangle]
pub unsafe extern "C" fn preadv(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    do_preadv(fd, iov, count, offset)
        .unwrap_or_else(|| unsafe { (real().preadv)(fd, iov, count, offset) })
}

#[no_mangle]
pub unsafe extern "C" fn preadv64(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off64_t,
) -> ssize_t {
    do_preadv(fd, iov, count, offset)
        .unwrap_or_else(|| unsafe { (real().preadv64)(fd, iov, count, offset) })
}

#[no_mangle]
pub unsafe extern "C" fn pwritev(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off_t,
) -> ssize_t {
    do_pwritev(fd, iov, count, offset)
        .unwrap_or_else(|| unsafe { (real().pwritev)(fd, iov, count, offset) })
}

#[no_mangle]
pub unsafe extern "C" fn pwritev64(
    fd: c_int,
    iov: *const iovec,
    count: c_int,
    offset: off64_t,
) -> ssize_t {
    do_pwritev(fd, iov, count, offset)
        .unwrap_or_else(|| unsafe { (real().pwritev64)(fd, iov, count, offset) })
}

// ---- size, layout, sync -----------------------------------------------------

fn do_ftruncate(fd: c_int, len: i64) -> Option<c_int> {
    ours(fd, |of| {
        match check_offset(len)
            .and_then(|l| with_file(of, |m, f| f.set_len(m, l).map_err(io_error)))
        {
            Ok(()) => 0,
            Err(e) => fail(e),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate(fd: c_int, len: off_t) -> c_int {
    do_ftruncate(fd, len).unwrap_or_else(|| unsafe { (real().ftruncate)(fd, len) })
}

#[no_mangle]
pub unsafe extern "C" fn ftruncate64(fd: c_int, len: off64_t) -> c_int {
    do_ftruncate(fd, len).unwrap_or_else(|| unsafe { (real().ftruncate64)(fd, len) })
}

/// Run `change`, a layout change by path of the file `open_for_write`
/// opens (truncate(2), open with O_TRUNC), between monetad's revocation of
/// every channel's records of it from byte `from(size)` on and the end of
/// the change. Files off the mount, or that cannot be opened for writing
/// (then the change fails in the kernel anyway), change directly.
fn layout_change_by_path<T>(
    open_for_write: impl FnOnce() -> c_int,
    from: impl FnOnce(u64) -> u64,
    change: impl FnOnce() -> T,
) -> T {
    let token = enter(|| {
        let s = shim();
        s.mount_dev?;
        let fd = open_for_write();
        if fd < 0 {
            return None;
        }
        let token = if s.on_mount(fd) {
            let size = moneta_abi::sys::file_len(fd).unwrap_or(0);
            let m = s.moneta()?;
            match m.layout_change(fd, from(size)) {
                Ok(t) => Some((m, t)),
                Err(e) => {
                    warn(&format!("announcing a layout change: {e}"));
                    None
                }
            }
        } else {
            None
        };
        // SAFETY: the descriptor opened above.
        unsafe { (real().close)(fd) };
        token
    })
    .flatten();
    let result = change();
    if let Some((m, token)) = token {
        let _ = enter(|| m.layout_done(token));
    }
    result
}

fn do_truncate(path: *const c_char, len: i64, real_truncate: impl FnOnce() -> c_int) -> c_int {
    if !regular_on_mount(libc::AT_FDCWD, path) {
        return real_truncate();
    }
    layout_change_by_path(
        // SAFETY: the caller's path, opened for writing without side effects.
        || unsafe {
            (real().open)(
                path,
                libc::O_WRONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC,
                0,
            )
        },
        |size| size.min(len.max(0) as u64) / 4096 * 4096,
        real_truncate,
    )
}

#[no_mangle]
pub unsafe extern "C" fn truncate(path: *const c_char, len: off_t) -> c_int {
    do_truncate(path, len, || unsafe { (real().truncate)(path, len) })
}

#[no_mangle]
pub unsafe extern "C" fn truncate64(path: *const c_char, len: off64_t) -> c_int {
    do_truncate(path, len, || unsafe { (real().truncate64)(path, len) })
}

/// fallocate modes that free or move blocks.
const LAYOUT_MODES: c_int = libc::FALLOC_FL_PUNCH_HOLE
    | libc::FALLOC_FL_COLLAPSE_RANGE
    | libc::FALLOC_FL_ZERO_RANGE
    | libc::FALLOC_FL_INSERT_RANGE;

fn do_fallocate(fd: c_int, mode: c_int, offset: i64, len: i64) -> c_int {
    // off_t and off64_t are the same on x86-64 (the shim's one target).
    // SAFETY: the caller's arguments, passed on unchanged.
    let real_call = || unsafe { (real().fallocate64)(fd, mode, offset, len) };
    let with_errno = || {
        let r = real_call();
        // SAFETY: reading this thread's errno right after the call.
        (r, unsafe { *libc::__errno_location() })
    };
    let handled = ours(fd, |of| {
        // A file being created that holds no block yet (nothing was
        // written to it: delayed allocations count in st_blocks) and is
        // now preallocated leaves the kernel path when the daemon makes
        // growth grants (it says so when the channel opens): its unwritten
        // extents are written direct (moneta-emu `growth`). Without them
        // every write there would go through the kernel, one revocation
        // each, so the file stays on the kernel path until its first fsync.
        let unwritten_only = mode & LAYOUT_MODES == 0
            && of.fresh.load(Ordering::Acquire)
            && shim().moneta().is_some_and(|m| m.info().growth)
            && moneta_abi::sys::fstat(fd).is_ok_and(|st| st.st_blocks == 0);
        let r = if mode & LAYOUT_MODES != 0 {
            let from = (offset.max(0) as u64) / 4096 * 4096;
            with_file(of, |m, f| {
                f.layout_change(m, from, || Ok(with_errno()))
                    .map_err(io_error)
            })
        } else {
            Ok(with_errno())
        };
        match r {
            Ok((0, _)) => {
                if unwritten_only {
                    of.fresh.store(false, Ordering::Release);
                }
                // Holes may have become unwritten extents: ask again.
                let _ = with_file(of, |m, f| f.refresh(m).map_err(io_error));
                0
            }
            Ok((_, errno)) => fail(errno),
            Err(e) => fail(e),
        }
    });
    handled.unwrap_or_else(real_call)
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int {
    do_fallocate(fd, mode, offset, len)
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(
    fd: c_int,
    mode: c_int,
    offset: off64_t,
    len: off64_t,
) -> c_int {
    do_fallocate(fd, mode, offset, len)
}

/// posix_fallocate as fallocate mode 0 (what glibc does first), so a file
/// preallocated this way is announced and may leave the kernel path as
/// above; where the file system cannot (EOPNOTSUPP), glibc's own
/// emulation runs. Returns the error number, as POSIX says.
fn do_posix_fallocate(fd: c_int, offset: i64, len: i64) -> c_int {
    if do_fallocate(fd, 0, offset, len) == 0 {
        return 0;
    }
    // SAFETY: this thread's errno, right after the call.
    match unsafe { *libc::__errno_location() } {
        // SAFETY: the caller's arguments, passed on unchanged.
        libc::EOPNOTSUPP => unsafe { (real().posix_fallocate64)(fd, offset, len) },
        e => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate(fd: c_int, offset: off_t, len: off_t) -> c_int {
    do_posix_fallocate(fd, offset, len)
}

#[no_mangle]
pub unsafe extern "C" fn posix_fallocate64(fd: c_int, offset: off64_t, len: off64_t) -> c_int {
    do_posix_fallocate(fd, offset, len)
}

/// fsync/fdatasync: the kernel's own sync first (its dirty pages reach the
/// device), then its cached pages of the file are dropped, so a later
/// read(2) by any process sees the direct writes (SPEC §3.4).
fn sync_then_drop(fd: c_int, real_sync: impl FnOnce() -> c_int) -> c_int {
    // What went direct into unwritten extents becomes written data first
    // (monetad settles it), so the kernel's sync makes it durable.
    let settled = ours(fd, |of| {
        with_file(of, |m, f| f.settle(m).map_err(io_error)).map_or_else(fail, |_| 0)
    });
    if settled.is_some_and(|r| r != 0) {
        return -1;
    }
    let r = real_sync();
    if r == 0 {
        let _ = ours(fd, |of| {
            let registered = of
                .file
                .lock()
                .is_ok_and(|s| s.1.as_ref().is_some_and(|f| f.refused().is_none()));
            if registered && !of.fresh.load(Ordering::Acquire) {
                ROUTES.device(RouteOp::Fsync, 0);
            } else {
                let why = if of.fresh.load(Ordering::Acquire) {
                    KernelReason::NewOrGrowingFile
                } else {
                    KernelReason::NotRegistered
                };
                ROUTES.kernel(why, RouteOp::Fsync, 0);
            }
            if of.fresh.swap(false, Ordering::AcqRel) {
                // A file being created is on the device now. What it holds
                // was written through the kernel: it stays this handle's
                // kernel pages (a small file only ever grown — a journal —
                // never costs a control-plane round trip; a big one goes
                // direct at its next fsync, its cached copy dropped then).
                let _ = with_file(of, |_, f| f.written_through_the_kernel().map_err(io_error));
            } else {
                let _ = with_file(of, |m, f| f.synced(m).map_err(io_error));
            }
        });
    }
    r
}

/// sync(2) and syncfs: every file this process has open on the mount that
/// was granted growth is settled first (monetad writes what went direct
/// into unwritten extents through the kernel), so the kernel's sync makes
/// it durable. Another process's growth data is covered by monetad's growth
/// journal (docs: "The direct-path contract").
fn settle_all_open() {
    for fd in shim().known() {
        let _ = ours(fd, |of| {
            if let Err(e) = with_file(of, |m, f| f.settle(m).map_err(io_error)) {
                warn(&format!(
                    "settling descriptor {fd} before a sync: errno {e}"
                ));
            }
        });
    }
}

#[no_mangle]
pub unsafe extern "C" fn sync() {
    settle_all_open();
    unsafe { (real().sync)() }
}

#[no_mangle]
pub unsafe extern "C" fn syncfs(fd: c_int) -> c_int {
    settle_all_open();
    unsafe { (real().syncfs)(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    sync_then_drop(fd, || unsafe { (real().fsync)(fd) })
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    sync_then_drop(fd, || unsafe { (real().fdatasync)(fd) })
}

// ---- mmap -------------------------------------------------------------------

/// Before mapping a file on the mount: monetad revokes every channel's
/// records of it, makes its page cache current, and keeps every channel on
/// the kernel path for it while any process maps it. Returns a descriptor
/// of the file to remember the mapping by.
fn before_map(fd: c_int, flags: c_int) -> Option<c_int> {
    if fd < 0 || flags & libc::MAP_ANONYMOUS != 0 {
        return None;
    }
    enter(|| {
        let s = shim();
        if !s.on_mount(fd) {
            return None;
        }
        let m = s.moneta()?;
        if let Err(e) = m.mapped(fd) {
            warn(&format!("announcing a mapping of descriptor {fd}: {e}"));
        }
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on the caller's descriptor.
        let own = unsafe { (real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, OWN_FD_MIN as usize) };
        (own >= 0).then_some(own)
    })
    .flatten()
}

/// After mmap: remember a mapping that was made, or say that it was not.
fn after_map(p: *mut c_void, len: size_t, own: Option<c_int>) -> *mut c_void {
    if let Some(own) = own {
        let _ = enter(|| {
            let s = shim();
            if p == libc::MAP_FAILED {
                if let Some(m) = s.moneta() {
                    let _ = m.unmapped(own);
                }
                // SAFETY: our own descriptor.
                unsafe { (real().close)(own) };
            } else if let Ok(mut maps) = s.mappings.lock() {
                maps.push(FileMapping {
                    addr: p as usize,
                    len,
                    fd: own,
                });
            }
        });
    }
    p
}

/// After munmap (or a mremap that moved or shrank): forget the mappings of
/// `[addr, addr + len)`; monetad checks whether anyone still maps their files.
fn forget_mappings(addr: usize, len: usize) {
    let _ = enter(|| {
        let s = shim();
        let gone: Vec<FileMapping> = {
            let Ok(mut maps) = s.mappings.lock() else {
                return;
            };
            if maps.is_empty() {
                return;
            }
            let end = addr.saturating_add(len);
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut *maps)
                .into_iter()
                .partition(|r| r.addr < end && addr < r.addr + r.len);
            *maps = kept;
            gone
        };
        for r in gone {
            if let Some(m) = s.moneta() {
                let _ = m.unmapped(r.fd);
            }
            // SAFETY: our own descriptor.
            unsafe { (real().close)(r.fd) };
        }
    });
}

#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off_t,
) -> *mut c_void {
    let own = before_map(fd, flags);
    after_map(
        unsafe { (real().mmap)(addr, len, prot, flags, fd, offset) },
        len,
        own,
    )
}

#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: size_t,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    offset: off64_t,
) -> *mut c_void {
    let own = before_map(fd, flags);
    after_map(
        unsafe { (real().mmap64)(addr, len, prot, flags, fd, offset) },
        len,
        own,
    )
}

#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: size_t) -> c_int {
    let r = unsafe { (real().munmap)(addr, len) };
    if r == 0 {
        forget_mappings(addr as usize, len);
    }
    r
}

/// mremap's fifth argument exists only with MREMAP_FIXED; on x86-64 it is
/// read from a register either way.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: size_t,
    new_len: size_t,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let p = unsafe { (real().mremap)(old, old_len, new_len, flags, new_addr) };
    if p != libc::MAP_FAILED {
        // Re-key a moved or resized file mapping (the file stays mapped).
        let _ = enter(|| {
            if let Ok(mut maps) = shim().mappings.lock() {
                for r in maps.iter_mut().filter(|r| r.addr == old as usize) {
                    r.addr = p as usize;
                    r.len = new_len;
                }
            }
        });
    }
    p
}
