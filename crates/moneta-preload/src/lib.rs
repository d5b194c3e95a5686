//! libmoneta_preload.so: unmodified programs on the emulated Moneta-D
//! (SPEC §3.2). Loaded with LD_PRELOAD (`moneta run -- CMD`), it replaces the
//! C library's file calls. A file the program opens on the Moneta mount (its
//! st_dev is the mount's) is handed to monetad with its descriptor: the
//! kernel already checked the open, so possession is the permission (SPEC
//! §3.4, DESIGN). From then on reads and writes of that descriptor go through
//! libmoneta's channel, straight to the device; everything else — other
//! files, sockets, metadata calls, O_APPEND writes (which must be atomic) —
//! goes to the C library untouched.
//!
//! Interposed: open, open64, openat, openat64, creat, creat64 (and glibc's
//! fortified __open_2 … forms), close, read, write, pread(64), pwrite(64),
//! readv, writev, preadv(64), pwritev(64), lseek(64), dup, dup2, dup3,
//! fcntl(64) (F_DUPFD, F_DUPFD_CLOEXEC, F_SETFL's O_APPEND; the rest pass
//! through), ftruncate(64), fallocate(64), fsync, fdatasync, and the
//! fortified __read_chk / __pread(64)_chk. fstat needs no interposing: the
//! kernel keeps the file's size (the library extends files through it).
//!
//! Variadic C functions (open's mode, fcntl's argument) are declared with
//! their optional argument as a fixed one: on x86-64 the System V ABI passes
//! it in the same register either way.
//!
//! A call that fails in the shim sets errno (EIO, or what the kernel said)
//! and returns -1, as the real call would. A thread already inside the shim
//! (the library's own system calls) always gets the C library directly.
//!
//! # Safety
//! Every exported function is `unsafe extern "C"` with exactly the contract
//! of the POSIX / glibc function it replaces (valid paths, buffers of the
//! given length, iovec arrays); that contract is not repeated on each.

#![allow(clippy::missing_safety_doc)]

mod real;
mod state;

use libc::{c_char, c_int, c_void, iovec, mode_t, off64_t, off_t, size_t, ssize_t};
use moneta::file::MonetaFile;
use real::real;
use state::{shim, warn, OpenFile};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The shim's own descriptors are numbered from here up.
const OWN_FD_MIN: usize = 512;

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

extern "C" fn init() {
    extern "C" fn child() {
        shim().after_fork_in_child();
    }
    // SAFETY: registering a fork handler with no prepare/parent handlers.
    unsafe { libc::pthread_atfork(None, None, Some(child)) };
}

/// After the real open returned `fd`: if the file is on the Moneta mount,
/// register it with monetad and start handling it.
fn adopt(fd: c_int, flags: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    let _ = enter(|| {
        let s = shim();
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
        // The library keeps a descriptor of its own for the open file
        // description: the program may dup2 and close the one it got (dd
        // does), and the shim's must outlive every alias. High and
        // close-on-exec, so the program's numbering and children see nothing.
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor we just checked.
        let own = unsafe { (real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, OWN_FD_MIN) };
        if own < 0 {
            warn(&format!(
                "descriptor {fd} stays with the kernel: no descriptor left"
            ));
            return;
        }
        match m.open_file(own) {
            Ok(file) => s.insert(
                fd,
                Arc::new(OpenFile {
                    file: std::sync::Mutex::new((s.generation(), Some(Arc::new(file)))),
                    offset: std::sync::Mutex::new(0),
                    append: AtomicBool::new(flags & libc::O_APPEND != 0),
                    fd: own,
                }),
            ),
            Err(e) => {
                // SAFETY: our own descriptor.
                unsafe { (real().close)(own) };
                // A policy refusal (e.g. O_WRONLY|O_APPEND, whose writes must
                // all go through the kernel) is normal and silent.
                if e.kind != moneta::ErrorKind::Unauthorized {
                    warn(&format!("descriptor {fd} stays with the kernel: {e}"));
                }
            }
        }
    });
    fd
}

/// Run `f` with the open file's library handle, re-registering it first if
/// this process forked since (the child has its own channel).
fn with_file<T>(
    of: &OpenFile,
    f: impl FnOnce(&moneta::Moneta, &MonetaFile) -> Result<T, c_int>,
) -> Result<T, c_int> {
    let s = shim();
    let m = s.moneta().ok_or(libc::EIO)?;
    let file = {
        let mut slot = of.file.lock().map_err(|_| libc::EIO)?;
        if slot.0 != s.generation() || slot.1.is_none() {
            // The parent's handle: forget it (closing would name the parent's file).
            std::mem::forget(slot.1.take());
            let file = m.open_file(of.fd).map_err(|e| {
                warn(&format!("re-registering descriptor {}: {e}", of.fd));
                libc::EIO
            })?;
            *slot = (s.generation(), Some(Arc::new(file)));
        }
        slot.1.clone().expect("just registered")
    };
    // The lock is not held during the IO: threads sharing a descriptor
    // (MonetaFile is thread-safe) run in parallel.
    f(&m, &file)
}

fn io_error(e: moneta::EmuError) -> c_int {
    warn(&e.to_string());
    libc::EIO
}

/// Handle a call for a descriptor the shim owns, or fall through.
fn ours<T>(fd: c_int, f: impl FnOnce(&Arc<OpenFile>) -> T) -> Option<T> {
    enter(|| shim().get(fd).map(|of| f(&of))).flatten()
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
        if !f.access().can_write() {
            if !of.append.load(Ordering::Acquire) {
                // As the kernel: writing a descriptor opened read-only is EBADF.
                return Err(libc::EBADF);
            }
            // pwrite on an O_APPEND descriptor appends (Linux): the kernel's job.
            // SAFETY: the caller's buffer on the shim's own descriptor.
            let n =
                unsafe { (real().pwrite64)(of.fd, buf.as_ptr().cast(), buf.len(), offset as i64) };
            if n < 0 {
                // SAFETY: reading this thread's errno.
                return Err(unsafe { *libc::__errno_location() });
            }
            f.refresh(m).map_err(io_error)?;
            return Ok(n as usize);
        }
        f.write_at(m, buf, offset).map_err(io_error)
    })
}

/// A write to an O_APPEND file: through the kernel (atomic append), then
/// made visible to the direct path.
fn append(of: &OpenFile, fd: c_int, buf: &[u8]) -> Result<usize, c_int> {
    // SAFETY: the caller's buffer, passed on unchanged.
    let n = unsafe { (real().write)(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        // SAFETY: reading this thread's errno.
        return Err(unsafe { *libc::__errno_location() });
    }
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

fn do_read(of: &OpenFile, buf: &mut [u8]) -> ssize_t {
    let Ok(mut offset) = of.offset.lock() else {
        return fail(libc::EIO);
    };
    let r = read_at(of, buf, *offset);
    if let Ok(n) = r {
        *offset += n as u64;
    }
    ret(r)
}

fn do_write(of: &OpenFile, fd: c_int, buf: &[u8]) -> ssize_t {
    let Ok(mut offset) = of.offset.lock() else {
        return fail(libc::EIO);
    };
    if of.append.load(Ordering::Acquire) {
        let r = append(of, fd, buf);
        if r.is_ok() {
            *offset = with_file(of, |_, f| f.len().map_err(io_error)).unwrap_or(*offset);
        }
        return ret(r);
    }
    let r = write_at(of, buf, *offset);
    if let Ok(n) = r {
        *offset += n as u64;
    }
    ret(r)
}

fn check_offset(offset: i64) -> Result<u64, c_int> {
    u64::try_from(offset).map_err(|_| libc::EINVAL)
}

// ---- open -----------------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn open(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    adopt(unsafe { (real().open)(path, flags, mode) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn open64(path: *const c_char, flags: c_int, mode: mode_t) -> c_int {
    adopt(unsafe { (real().open64)(path, flags, mode) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn openat(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    adopt(unsafe { (real().openat)(dir, path, flags, mode) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn openat64(
    dir: c_int,
    path: *const c_char,
    flags: c_int,
    mode: mode_t,
) -> c_int {
    adopt(unsafe { (real().openat64)(dir, path, flags, mode) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn __open_2(path: *const c_char, flags: c_int) -> c_int {
    adopt(unsafe { (real().__open_2)(path, flags) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn __open64_2(path: *const c_char, flags: c_int) -> c_int {
    adopt(unsafe { (real().__open64_2)(path, flags) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn __openat_2(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    adopt(unsafe { (real().__openat_2)(dir, path, flags) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn __openat64_2(dir: c_int, path: *const c_char, flags: c_int) -> c_int {
    adopt(unsafe { (real().__openat64_2)(dir, path, flags) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn creat(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    adopt(unsafe { (real().creat)(path, mode) }, flags)
}

#[no_mangle]
pub unsafe extern "C" fn creat64(path: *const c_char, mode: mode_t) -> c_int {
    let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC;
    adopt(unsafe { (real().creat64)(path, mode) }, flags)
}

// ---- close, dup -------------------------------------------------------------

/// Forget `fd` (closing the library's file if no descriptor is left).
fn forget(fd: c_int) {
    let _ = enter(|| {
        if let Some(of) = shim().remove(fd) {
            let _ = with_file(&of, |m, f| f.sync(m).map_err(io_error));
            if let Ok(mut slot) = of.file.lock() {
                if slot.0 == shim().generation() {
                    if let (Some(m), Some(f)) = (shim().moneta(), slot.1.take()) {
                        // Another thread still in an IO on this file (closing
                        // under it is the program's race): its grant then
                        // lasts until the channel closes.
                        if let Ok(f) = Arc::try_unwrap(f) {
                            if let Err(e) = f.close(&m) {
                                warn(&e.to_string());
                            }
                        }
                    }
                } else {
                    std::mem::forget(slot.1.take());
                }
            }
            // SAFETY: the shim's own descriptor; no alias refers to it.
            unsafe { (real().close)(of.fd) };
        }
    });
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    forget(fd);
    unsafe { (real().close)(fd) }
}

/// `new` now refers to what `old` refers to.
fn alias(old: c_int, new: c_int) -> c_int {
    if new >= 0 && new != old {
        let _ = enter(|| {
            if let Some(of) = shim().get(old) {
                shim().insert(new, of);
            }
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
        forget(new);
    }
    alias(old, unsafe { (real().dup2)(old, new) })
}

#[no_mangle]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    if old != new {
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
                    .store(arg as c_int & libc::O_APPEND != 0, Ordering::Release)
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

// ---- read, write ----------------------------------------------------------

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    ours(fd, |of| do_read(of, unsafe { slice_mut(buf, len) }))
        .unwrap_or_else(|| unsafe { (real().read)(fd, buf, len) })
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
) -> ssize_t {
    ours(fd, |of| {
        do_read(of, unsafe { slice_mut(buf, len.min(buflen)) })
    })
    .unwrap_or_else(|| unsafe { (real().__read_chk)(fd, buf, len, buflen) })
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    ours(fd, |of| do_write(of, fd, unsafe { slice(buf, len) }))
        .unwrap_or_else(|| unsafe { (real().write)(fd, buf, len) })
}

fn do_pread(fd: c_int, buf: *mut c_void, len: size_t, offset: i64) -> Option<ssize_t> {
    ours(fd, |of| {
        ret(check_offset(offset).and_then(|o| read_at(of, unsafe { slice_mut(buf, len) }, o)))
    })
}

fn do_pwrite(fd: c_int, buf: *const c_void, len: size_t, offset: i64) -> Option<ssize_t> {
    ours(fd, |of| {
        ret(check_offset(offset).and_then(|o| write_at(of, unsafe { slice(buf, len) }, o)))
    })
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
    ours(fd, |of| {
        let Ok(mut offset) = of.offset.lock() else {
            return fail(libc::EIO);
        };
        let r = unsafe { iovecs(iov, count) }.and_then(|v| vread(of, v, *offset));
        if let Ok(n) = r {
            *offset += n as u64;
        }
        ret(r)
    })
    .unwrap_or_else(|| unsafe { (real().readv)(fd, iov, count) })
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, count: c_int) -> ssize_t {
    ours(fd, |of| {
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
        let Ok(mut offset) = of.offset.lock() else {
            return fail(libc::EIO);
        };
        let r = vwrite(of, v, *offset);
        if let Ok(n) = r {
            *offset += n as u64;
        }
        ret(r)
    })
    .unwrap_or_else(|| unsafe { (real().writev)(fd, iov, count) })
}

fn do_preadv(fd: c_int, iov: *const iovec, count: c_int, offset: i64) -> Option<ssize_t> {
    ours(fd, |of| {
        ret(check_offset(offset)
            .and_then(|o| unsafe { iovecs(iov, count) }.and_then(|v| vread(of, v, o))))
    })
}

fn do_pwritev(fd: c_int, iov: *const iovec, count: c_int, offset: i64) -> Option<ssize_t> {
    ours(fd, |of| {
        ret(check_offset(offset)
            .and_then(|o| unsafe { iovecs(iov, count) }.and_then(|v| vwrite(of, v, o))))
    })
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

// ---- lseek, size, sync ------------------------------------------------------

fn do_lseek(fd: c_int, offset: i64, whence: c_int) -> Option<i64> {
    ours(fd, |of| {
        let Ok(mut pos) = of.offset.lock() else {
            return fail::<i64>(libc::EIO);
        };
        let base = match whence {
            libc::SEEK_SET => 0,
            libc::SEEK_CUR => *pos as i64,
            libc::SEEK_END => match with_file(of, |_, f| f.len().map_err(io_error)) {
                Ok(len) => len as i64,
                Err(e) => return fail(e),
            },
            libc::SEEK_DATA | libc::SEEK_HOLE => {
                // The kernel knows the holes; ask it from our position.
                // SAFETY: plain lseek on the caller's descriptor.
                let r = unsafe { (real().lseek64)(fd, offset, whence) };
                if r >= 0 {
                    *pos = r as u64;
                }
                return r;
            }
            _ => return fail(libc::EINVAL),
        };
        match base.checked_add(offset) {
            Some(p) if p >= 0 => {
                *pos = p as u64;
                p
            }
            _ => fail(libc::EINVAL),
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn lseek(fd: c_int, offset: off_t, whence: c_int) -> off_t {
    do_lseek(fd, offset, whence).unwrap_or_else(|| unsafe { (real().lseek)(fd, offset, whence) })
}

#[no_mangle]
pub unsafe extern "C" fn lseek64(fd: c_int, offset: off64_t, whence: c_int) -> off64_t {
    do_lseek(fd, offset, whence).unwrap_or_else(|| unsafe { (real().lseek64)(fd, offset, whence) })
}

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

/// After the kernel changed the file's allocation: forget cached extents.
fn after_allocation(fd: c_int, r: c_int) -> c_int {
    if r == 0 {
        let _ = ours(fd, |of| {
            with_file(of, |m, f| f.refresh(m).map_err(io_error))
        });
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn fallocate(fd: c_int, mode: c_int, offset: off_t, len: off_t) -> c_int {
    after_allocation(fd, unsafe { (real().fallocate)(fd, mode, offset, len) })
}

#[no_mangle]
pub unsafe extern "C" fn fallocate64(
    fd: c_int,
    mode: c_int,
    offset: off64_t,
    len: off64_t,
) -> c_int {
    after_allocation(fd, unsafe { (real().fallocate64)(fd, mode, offset, len) })
}

/// fsync/fdatasync: make direct writes visible to read(2) (SPEC §3.4), then
/// the kernel's own sync for whatever it holds.
fn sync_direct(fd: c_int) {
    let _ = ours(fd, |of| with_file(of, |m, f| f.sync(m).map_err(io_error)));
}

#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    sync_direct(fd);
    unsafe { (real().fsync)(fd) }
}

#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    sync_direct(fd);
    unsafe { (real().fdatasync)(fd) }
}
