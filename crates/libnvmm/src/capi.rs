//! The C ABI of libnvmm (`include/nvmm.h`): the same calls as the Rust API
//! on an opaque handle. Calls return 0 / a non-NULL pointer / a non-zero
//! token on success; `nvmm_last_error()` says why one failed (per thread).
//! No call panics across the boundary: a panic becomes an error return.

use crate::region::{Nvmm, Options};
use crate::timing::{timing_from_env, FixedLatency};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: String) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, String>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(msg)) => {
            set_error(msg);
            fail
        }
        Err(_) => {
            set_error("libnvmm panicked (a bug)".into());
            fail
        }
    }
}

/// Options of `nvmm_open_ex`, mirrored in nvmm.h.
#[repr(C)]
pub struct NvmmOptions {
    pub ways: u32,
    pub prefetch_blocks: u32,
    pub read_latency_ns: u64,
    pub program_latency_ns: u64,
    pub direct_io: c_int,
}

#[no_mangle]
pub extern "C" fn nvmm_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// # Safety
/// `path` must be a NUL-terminated string; `opts` NULL or valid.
#[no_mangle]
pub unsafe extern "C" fn nvmm_open_ex(
    path: *const c_char,
    size: u64,
    dram_bytes: u64,
    opts: *const NvmmOptions,
) -> *mut Nvmm {
    guard(std::ptr::null_mut(), || {
        if path.is_null() {
            return Err("path is NULL".into());
        }
        // SAFETY: the caller's promise.
        let path = unsafe { CStr::from_ptr(path) }
            .to_str()
            .map_err(|_| "path is not UTF-8".to_string())?;
        let mut o = Options::new(dram_bytes);
        // SAFETY: the caller's promise (NULL or a valid struct).
        if let Some(x) = unsafe { opts.as_ref() } {
            o.ways = x.ways as usize;
            o.prefetch_blocks = x.prefetch_blocks as usize;
            o.timing = Box::new(FixedLatency {
                read_ns: x.read_latency_ns,
                program_ns: x.program_latency_ns,
            });
            o.direct_io = x.direct_io != 0;
        }
        // NVMM_TIMING=<preset>: the model's flash instead of fixed latencies.
        if let Some(model) = timing_from_env()? {
            o.timing = Box::new(model);
        }
        let n = Nvmm::open_with(path, size, o).map_err(|e| e.to_string())?;
        Ok(Box::into_raw(Box::new(n)))
    })
}

/// # Safety
/// `path` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn nvmm_open(path: *const c_char, size: u64, dram_bytes: u64) -> *mut Nvmm {
    // SAFETY: forwarded promise.
    unsafe { nvmm_open_ex(path, size, dram_bytes, std::ptr::null()) }
}

/// # Safety
/// `n` must be a handle from nvmm_open, or NULL.
unsafe fn handle<'a>(n: *mut Nvmm) -> Result<&'a Nvmm, String> {
    // SAFETY: the caller's promise.
    unsafe { n.as_ref() }.ok_or_else(|| "handle is NULL".to_string())
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_base(n: *mut Nvmm) -> *mut c_void {
    // SAFETY: the caller's promise.
    guard(std::ptr::null_mut(), || {
        Ok(unsafe { handle(n) }?.as_ptr().cast())
    })
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_size(n: *mut Nvmm) -> u64 {
    // SAFETY: the caller's promise.
    guard(0, || Ok(unsafe { handle(n) }?.len()))
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_sync(n: *mut Nvmm) -> u64 {
    // SAFETY: the caller's promise.
    guard(0, || {
        unsafe { handle(n) }?.sync().map_err(|e| e.to_string())
    })
}

/// Sync tokens start at 1 after open of a fresh file; 0 is "failed"
/// except as the argument of nvmm_rollback (the empty region).
///
/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_rollback(n: *mut Nvmm, token: u64) -> u64 {
    // SAFETY: the caller's promise.
    guard(0, || {
        unsafe { handle(n) }?
            .rollback(token)
            .map_err(|e| e.to_string())
    })
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_last_token(n: *mut Nvmm) -> u64 {
    // SAFETY: the caller's promise.
    guard(0, || {
        unsafe { handle(n) }?
            .last_token()
            .map_err(|e| e.to_string())
    })
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_alloc(n: *mut Nvmm) -> *mut c_void {
    guard(std::ptr::null_mut(), || {
        // SAFETY: the caller's promise.
        let n = unsafe { handle(n) }?;
        let offset = n.alloc().map_err(|e| e.to_string())?;
        // SAFETY: alloc returns an offset inside the region.
        Ok(unsafe { n.as_ptr().add(offset as usize) }.cast())
    })
}

fn offset_of(n: &Nvmm, page: *const c_void) -> Result<u64, String> {
    let a = page as u64;
    let base = n.as_ptr() as u64;
    if a < base || a >= base + n.len() {
        return Err(format!("{a:#x} is not inside the region"));
    }
    Ok(a - base)
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_delete(n: *mut Nvmm, page: *const c_void) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's promise.
        let n = unsafe { handle(n) }?;
        n.delete(offset_of(n, page)?).map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// # Safety
/// `n` must be a handle from nvmm_open.
#[no_mangle]
pub unsafe extern "C" fn nvmm_setperms(n: *mut Nvmm, page: *const c_void, perms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's promise.
        let n = unsafe { handle(n) }?;
        let perms = u8::try_from(perms).map_err(|_| format!("bad permissions {perms}"))?;
        n.set_perms(offset_of(n, page)?, perms)
            .map_err(|e| e.to_string())?;
        Ok(0)
    })
}

/// Collect temporary pages, sync, unmap, free the handle. Returns the
/// final token, or 0 (the handle is freed either way).
///
/// # Safety
/// `n` must be a handle from nvmm_open, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nvmm_close(n: *mut Nvmm) -> u64 {
    guard(0, || {
        if n.is_null() {
            return Err("handle is NULL".into());
        }
        // SAFETY: the caller's promise: a handle from Box::into_raw.
        let n = unsafe { Box::from_raw(n) };
        if std::env::var_os("NVMM_STATS").is_some() {
            eprintln!("libnvmm: {:?}", n.stats());
        }
        n.close().map_err(|e| e.to_string())
    })
}
