//! Thin system-call wrappers: every call returns what the kernel (or the
//! shim standing in for it) said, as `Ok(n)` or `Err(errno)`, so both runs
//! of a schedule can be compared call by call.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub type Sys = Result<i64, i32>;

pub fn errno() -> i32 {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() }
}

pub fn check(r: i64) -> Sys {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// `Ok(n)` as "n", `Err(e)` as "-e": what the logs record.
pub fn show(r: Sys) -> String {
    match r {
        Ok(n) => n.to_string(),
        Err(e) => format!("-{e}"),
    }
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

pub fn open(p: &Path, flags: i32) -> Sys {
    let c = cpath(p);
    // SAFETY: a valid C string; mode used only with O_CREAT.
    check(unsafe { libc::open(c.as_ptr(), flags, 0o644) } as i64)
}

pub fn close(fd: i32) {
    // SAFETY: closing a descriptor this program owns.
    unsafe { libc::close(fd) };
}

pub fn pwrite(fd: i32, b: &[u8], off: u64) -> Sys {
    // SAFETY: a valid buffer of b.len() bytes.
    check(unsafe { libc::pwrite64(fd, b.as_ptr().cast(), b.len(), off as i64) } as i64)
}

pub fn pread(fd: i32, b: &mut [u8], off: u64) -> Sys {
    // SAFETY: a valid buffer of b.len() bytes.
    check(unsafe { libc::pread64(fd, b.as_mut_ptr().cast(), b.len(), off as i64) } as i64)
}

pub fn write(fd: i32, b: &[u8]) -> Sys {
    // SAFETY: a valid buffer of b.len() bytes.
    check(unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) } as i64)
}

pub fn read(fd: i32, b: &mut [u8]) -> Sys {
    // SAFETY: a valid buffer of b.len() bytes.
    check(unsafe { libc::read(fd, b.as_mut_ptr().cast(), b.len()) } as i64)
}

pub fn seek(fd: i32, off: i64, whence: i32) -> Sys {
    // SAFETY: plain syscall.
    check(unsafe { libc::lseek64(fd, off, whence) })
}

/// pread until `b` is full or the end of the file: the bytes read.
pub fn pread_full(fd: i32, b: &mut [u8], off: u64) -> Sys {
    let mut done = 0usize;
    while done < b.len() {
        match pread(fd, &mut b[done..], off + done as u64)? {
            0 => break,
            n => done += n as usize,
        }
    }
    Ok(done as i64)
}

pub fn iovecs(parts: &[&[u8]]) -> Vec<libc::iovec> {
    parts
        .iter()
        .map(|p| libc::iovec {
            iov_base: p.as_ptr() as *mut libc::c_void,
            iov_len: p.len(),
        })
        .collect()
}

pub fn fsize(fd: i32) -> Sys {
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstat(fd, &mut st) } as i64)?;
    Ok(st.st_size)
}

/// A buffer of `len` bytes aligned to 4096 (O_DIRECT).
pub struct Aligned {
    raw: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize) -> Aligned {
        let raw = vec![0u8; len + 4096];
        let at = raw.as_ptr().align_offset(4096);
        Aligned { raw, at, len }
    }
    pub fn bytes(&mut self) -> &mut [u8] {
        &mut self.raw[self.at..self.at + self.len]
    }
}
