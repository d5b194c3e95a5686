//! The C ABI over [`Moneta`] (`include/moneta.h`). Calls return 0 (or a
//! valid pointer) on success and -1 (or NULL) on failure, with the reason in
//! `moneta_last_error()` (per thread). No call panics across the boundary:
//! a panic inside becomes an error return.

use crate::{CompletionMode, Io, Moneta, MonetaFile};
use moneta_client::file::{FileIo, Prepared};
use moneta_emu::{engine::EngineOptions, medium::Medium};
use moneta_model::config::Config;
use moneta_model::units::Op;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(message: impl Into<String>) {
    let text = message.into().replace('\0', " ");
    LAST_ERROR.with(|e| *e.borrow_mut() = CString::new(text).expect("NULs replaced"));
}

/// Run `f`, turning errors and panics into `fail` plus a message.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_error(e);
            fail
        }
        Err(panic) => {
            let why = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            set_error(format!("internal error in libmoneta: {why}"));
            fail
        }
    }
}

/// # Safety
/// `s` must be NULL or a NUL-terminated string.
unsafe fn text<'a>(s: *const c_char, what: &str) -> Result<&'a str, String> {
    if s.is_null() {
        return Err(format!("{what} is NULL"));
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| format!("{what} is not UTF-8"))
}

fn handle<'a>(m: *mut Moneta) -> Result<&'a Moneta, String> {
    // SAFETY: a non-NULL handle came from moneta_connect/moneta_embedded and
    // is live until moneta_close (the header's contract).
    unsafe { m.as_ref() }.ok_or_else(|| "moneta handle is NULL".to_string())
}

fn io_handle<'a>(io: *mut Io) -> Result<&'a mut Io, String> {
    // SAFETY: a non-NULL io came from moneta_prepare and is live until
    // moneta_release; the caller does not share it between threads at once.
    unsafe { io.as_mut() }.ok_or_else(|| "moneta_io handle is NULL".to_string())
}

fn submitted_io<'a>(io: *mut Io) -> Result<&'a mut Io, String> {
    let io = io_handle(io)?;
    if io.is_submitted() {
        Ok(io)
    } else {
        Err("moneta_io was not submitted".into())
    }
}

fn mode(completion: c_int) -> Result<CompletionMode, String> {
    match completion {
        0 => Ok(CompletionMode::Dma),
        1 => Ok(CompletionMode::Forwarding),
        2 => Ok(CompletionMode::IssueSleep),
        c => Err(format!("unknown completion mode {c}")),
    }
}

fn op(op: c_int) -> Result<Op, String> {
    match op {
        0 => Ok(Op::Read),
        1 => Ok(Op::Write),
        o => Err(format!("unknown operation {o}")),
    }
}

/// The last error on this thread (never NULL; empty if none).
#[no_mangle]
pub extern "C" fn moneta_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// # Safety
/// `socket_path` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn moneta_connect(socket_path: *const c_char) -> *mut Moneta {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the caller's promise.
        let path = unsafe { text(socket_path, "socket_path") }?;
        let m = Moneta::connect(Path::new(path)).map_err(|e| e.to_string())?;
        Ok(Box::into_raw(Box::new(m)))
    })
}

/// Start a device of preset `preset` in this process, on anonymous memory,
/// and open a channel on it with the whole device granted read-write.
///
/// # Safety
/// `preset` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn moneta_embedded(preset: *const c_char) -> *mut Moneta {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the caller's promise.
        let name = unsafe { text(preset, "preset") }?;
        let config = Config::preset(name).map_err(|e| e.to_string())?;
        let medium = Medium::anonymous(config.device.capacity_bytes).map_err(|e| e.to_string())?;
        let m =
            crate::embedded(config, medium, EngineOptions::default()).map_err(|e| e.to_string())?;
        m.grant_raw(0, m.capacity_bytes(), true)
            .map_err(|e| e.to_string())?;
        Ok(Box::into_raw(Box::new(m)))
    })
}

/// # Safety
/// `m` must be NULL or a live handle, not used again afterwards.
#[no_mangle]
pub unsafe extern "C" fn moneta_close(m: *mut Moneta) {
    if !m.is_null() {
        // SAFETY: the caller's promise: the handle came from Box::into_raw.
        drop(unsafe { Box::from_raw(m) });
    }
}

/// # Safety
/// `m` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn moneta_capacity(m: *mut Moneta) -> u64 {
    guard(0, || Ok(handle(m)?.capacity_bytes()))
}

/// # Safety
/// `m` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn moneta_grant_raw(
    m: *mut Moneta,
    start: u64,
    len: u64,
    write: c_int,
) -> c_int {
    guard(-1, || {
        handle(m)?
            .grant_raw(start, len, write != 0)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// # Safety
/// `m` must be a live handle and `buf` valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn moneta_read(
    m: *mut Moneta,
    addr: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(-1, || {
        if buf.is_null() && len > 0 {
            return Err("buf is NULL".into());
        }
        // SAFETY: the caller's promise (and len 0 never dereferences).
        let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        handle(m)?.read(addr, b).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// # Safety
/// `m` must be a live handle and `buf` valid for `len` bytes of reads.
#[no_mangle]
pub unsafe extern "C" fn moneta_write(
    m: *mut Moneta,
    addr: u64,
    buf: *const c_void,
    len: usize,
) -> c_int {
    guard(-1, || {
        if buf.is_null() && len > 0 {
            return Err("buf is NULL".into());
        }
        // SAFETY: the caller's promise.
        let b = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) };
        handle(m)?.write(addr, b).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Reserve tags for an asynchronous request. Never waits: NULL with "all
/// tags are busy" when the channel has no free run of tags for it (finish
/// and release a request, then retry).
///
/// # Safety
/// `m` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn moneta_prepare(
    m: *mut Moneta,
    operation: c_int,
    addr: u64,
    len: usize,
    completion: c_int,
) -> *mut Io {
    guard(std::ptr::null_mut(), || {
        let io = handle(m)?
            .try_prepare(op(operation)?, addr, len as u64, mode(completion)?)
            .map_err(|e| e.to_string())?
            .ok_or("all tags are busy: wait for and release a request, then retry")?;
        Ok(Box::into_raw(Box::new(io)))
    })
}

/// The request's DMA slice: fill it before submitting a write, read it after
/// a read completes. Valid until moneta_release.
///
/// # Safety
/// `m` and `io` must be live handles.
#[no_mangle]
pub unsafe extern "C" fn moneta_io_buffer(m: *mut Moneta, io: *mut Io) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let io = io_handle(io)?;
        if io.is_in_flight() {
            return Err(
                "the buffer of a request in flight belongs to the device: wait for it first".into(),
            );
        }
        Ok(handle(m)?.buffer_mut(io).as_mut_ptr().cast())
    })
}

/// # Safety
/// `m` and `io` must be live handles.
#[no_mangle]
pub unsafe extern "C" fn moneta_submit(m: *mut Moneta, io: *mut Io) -> c_int {
    guard(-1, || {
        handle(m)?
            .submit(io_handle(io)?)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// 1 if the request finished successfully, 0 if still in flight, -1 on error.
///
/// # Safety
/// `m` and `io` must be live handles, `io` submitted.
#[no_mangle]
pub unsafe extern "C" fn moneta_poll(m: *mut Moneta, io: *mut Io) -> c_int {
    guard(-1, || match handle(m)?.try_complete(submitted_io(io)?) {
        None => Ok(0),
        Some(Ok(())) => Ok(1),
        Some(Err(e)) => Err(e.to_string()),
    })
}

/// # Safety
/// `m` and `io` must be live handles, `io` submitted.
#[no_mangle]
pub unsafe extern "C" fn moneta_wait(m: *mut Moneta, io: *mut Io) -> c_int {
    guard(-1, || {
        handle(m)?
            .wait(submitted_io(io)?)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Give the request's tags back and free `io`.
///
/// # Safety
/// `m` must be a live handle; `io` NULL or a live request not used again.
#[no_mangle]
pub unsafe extern "C" fn moneta_release(m: *mut Moneta, io: *mut Io) {
    if io.is_null() {
        return;
    }
    // SAFETY: the caller's promise: io came from Box::into_raw in moneta_prepare.
    let io = unsafe { Box::from_raw(io) };
    guard((), || {
        handle(m)?.release(*io);
        Ok(())
    })
}

// Files on the Moneta file system (SPEC §3.2, §3.4): the descriptor the
// caller opened is the proof of its right to the file; the daemon checks
// it and the device enforces the grant.

fn file_handle<'a>(f: *mut MonetaFile) -> Result<&'a MonetaFile, String> {
    // SAFETY: a non-NULL file came from moneta_file_open and is live until
    // moneta_file_close (the header's contract).
    unsafe { f.as_ref() }.ok_or_else(|| "moneta_file handle is NULL".to_string())
}

fn file_io_handle<'a>(io: *mut FileIo) -> Result<&'a mut FileIo, String> {
    // SAFETY: a non-NULL io came from moneta_file_prepare and is live until
    // moneta_file_release; one thread at a time uses it.
    unsafe { io.as_mut() }.ok_or_else(|| "moneta_file_io handle is NULL".to_string())
}

/// Grant this channel the file open on `fd` (regular file on the device's
/// file system, or the device's block device). The caller keeps `fd` open
/// until moneta_file_close.
///
/// # Safety
/// `m` must be a live handle.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_open(m: *mut Moneta, fd: c_int) -> *mut MonetaFile {
    guard(std::ptr::null_mut(), || {
        let f = handle(m)?.open_file(fd).map_err(|e| e.to_string())?;
        Ok(Box::into_raw(Box::new(f)))
    })
}

/// Drop the kernel's stale cached pages of the file (a later read(2) sees
/// the direct writes), revoke the grant and free `f` (0, or -1: freed
/// anyway). Every request of the file must have been released.
///
/// # Safety
/// `m` must be a live handle; `f` NULL or a live file not used again.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_close(m: *mut Moneta, f: *mut MonetaFile) -> c_int {
    if f.is_null() {
        return 0;
    }
    // SAFETY: the caller's promise: f came from Box::into_raw.
    let f = unsafe { Box::from_raw(f) };
    guard(-1, || {
        let m = handle(m)?;
        f.sync(m).map_err(|e| e.to_string())?;
        f.close(m).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Every call on a file: `fail` unless `body` succeeds with the live
/// handles.
fn on_file<T>(
    fail: T,
    m: *mut Moneta,
    f: *mut MonetaFile,
    body: impl FnOnce(&Moneta, &MonetaFile) -> Result<T, String>,
) -> T {
    guard(fail, || body(handle(m)?, file_handle(f)?))
}

/// Every call on a file's request: as [`on_file`], with the request, which
/// must have been submitted (`submitted`) or must not be in flight.
fn on_file_io<T>(
    fail: T,
    m: *mut Moneta,
    f: *mut MonetaFile,
    io: *mut FileIo,
    submitted: bool,
    body: impl FnOnce(&Moneta, &MonetaFile, &mut FileIo) -> Result<T, String>,
) -> T {
    on_file(fail, m, f, |m, f| {
        let io = file_io_handle(io)?;
        if submitted && !io.io().is_submitted() {
            return Err("moneta_file_io was not submitted".into());
        }
        if !submitted && io.io().is_in_flight() {
            return Err("moneta_file_io is in flight already".into());
        }
        body(m, f, io)
    })
}

/// A caller's buffer may be NULL only when it is empty.
fn non_null(null: bool, len: usize) -> Result<(), String> {
    if null && len > 0 {
        return Err("buf is NULL".into());
    }
    Ok(())
}

/// `len` bytes to read from at `buf`.
///
/// # Safety
/// `buf` valid for `len` bytes of reads (or NULL).
unsafe fn bytes_in<'a>(buf: *const c_void, len: usize) -> Result<&'a [u8], String> {
    non_null(buf.is_null(), len)?;
    if len == 0 {
        return Ok(&[]);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// `len` bytes to write into at `buf`.
///
/// # Safety
/// `buf` valid for `len` bytes of writes (or NULL).
unsafe fn bytes_out<'a>(buf: *mut c_void, len: usize) -> Result<&'a mut [u8], String> {
    non_null(buf.is_null(), len)?;
    if len == 0 {
        return Ok(&mut []);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// Like pread(2): the bytes read (short at the end of the file), or -1.
///
/// # Safety
/// `m`, `f` live handles; `buf` valid for `len` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_pread(
    m: *mut Moneta,
    f: *mut MonetaFile,
    buf: *mut c_void,
    len: usize,
    offset: u64,
) -> i64 {
    on_file(-1, m, f, |m, f| {
        // SAFETY: the caller's promise.
        let b = unsafe { bytes_out(buf, len) }?;
        let n = f.read_at(m, b, offset).map_err(|e| e.to_string())?;
        Ok(n as i64)
    })
}

/// Like pwrite(2) (growing the file through the kernel): `len`, or -1.
///
/// # Safety
/// `m`, `f` live handles; `buf` valid for `len` bytes of reads.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_pwrite(
    m: *mut Moneta,
    f: *mut MonetaFile,
    buf: *const c_void,
    len: usize,
    offset: u64,
) -> i64 {
    on_file(-1, m, f, |m, f| {
        // SAFETY: the caller's promise.
        let b = unsafe { bytes_in(buf, len) }?;
        let n = f.write_at(m, b, offset).map_err(|e| e.to_string())?;
        Ok(n as i64)
    })
}

/// Make the file's direct writes the file system's data: what went direct
/// into preallocated (unwritten) extents as growth grants is settled first
/// (monetad writes it through the kernel, so the extents become written;
/// until then monetad's growth journal keeps it across a daemon crash),
/// then the kernel's stale cached pages are dropped, so a later read(2)
/// sees the direct writes. Direct writes into written extents are on the
/// medium when they complete. As for any kernel write, the caller's
/// fsync(2) of its descriptor afterwards makes the file system's metadata
/// durable.
///
/// # Safety
/// `m`, `f` live handles.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_sync(m: *mut Moneta, f: *mut MonetaFile) -> c_int {
    on_file(-1, m, f, |m, f| {
        f.settle(m).map_err(|e| e.to_string())?;
        f.sync(m).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// One asynchronous request of the file. `*status` says what happened:
/// 0 a request (returned), 1 no free run of tags (complete and release a
/// request, retry), 2 not one device request (growth, a hole, several
/// extents, the kernel's data: use moneta_file_pread/pwrite), -1 an error
/// (moneta_last_error). NULL unless 0.
///
/// # Safety
/// `m`, `f` live handles; `status` valid for one write.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_prepare(
    m: *mut Moneta,
    f: *mut MonetaFile,
    operation: c_int,
    offset: u64,
    len: usize,
    completion: c_int,
    status: *mut c_int,
) -> *mut FileIo {
    let (io, code) = on_file((std::ptr::null_mut(), -1), m, f, |m, f| {
        let prepared = f
            .prepare_async(m, op(operation)?, offset, len as u64, mode(completion)?)
            .map_err(|e| e.to_string())?;
        Ok(match prepared {
            Prepared::Device(io) => (Box::into_raw(Box::new(io)), 0),
            Prepared::Busy => (std::ptr::null_mut(), 1),
            Prepared::Synchronous => (std::ptr::null_mut(), 2),
        })
    });
    // SAFETY: the caller's promise (NULL tolerated).
    if let Some(s) = unsafe { status.as_mut() } {
        *s = code;
    }
    io
}

/// The request's DMA slice (as moneta_io_buffer).
///
/// # Safety
/// `m` and `io` live handles.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_io_buffer(m: *mut Moneta, io: *mut FileIo) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        let io = file_io_handle(io)?;
        if io.io().is_in_flight() {
            return Err(
                "the buffer of a request in flight belongs to the device: wait for it first".into(),
            );
        }
        Ok(handle(m)?.buffer_mut(io.io_mut()).as_mut_ptr().cast())
    })
}

/// # Safety
/// `m`, `f`, `io` live handles, `io` prepared on `f` and not in flight.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_submit(
    m: *mut Moneta,
    f: *mut MonetaFile,
    io: *mut FileIo,
) -> c_int {
    on_file_io(-1, m, f, io, false, |m, f, io| {
        f.submit_async(m, io).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// 1 if the request finished successfully (a read's data in its slice),
/// 0 if still in flight, -1 on error.
///
/// # Safety
/// `m`, `f`, `io` live handles, `io` submitted on `f`.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_poll(
    m: *mut Moneta,
    f: *mut MonetaFile,
    io: *mut FileIo,
) -> c_int {
    on_file_io(-1, m, f, io, true, |m, f, io| {
        match f.try_complete_async(m, io) {
            None => Ok(0),
            Some(Ok(())) => Ok(1),
            Some(Err(e)) => Err(e.to_string()),
        }
    })
}

/// Give the request's tags back and free `io` (only once it finished).
///
/// # Safety
/// `m` must be a live handle; `io` NULL or a live request not used again.
#[no_mangle]
pub unsafe extern "C" fn moneta_file_release(m: *mut Moneta, io: *mut FileIo) {
    if io.is_null() {
        return;
    }
    // SAFETY: the caller's promise: io came from Box::into_raw.
    let io = unsafe { Box::from_raw(io) };
    guard((), || {
        handle(m)?.release(io.into_io());
        Ok(())
    })
}
