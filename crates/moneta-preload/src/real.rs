//! The C library's own versions of the calls the shim interposes, found with
//! dlsym(RTLD_NEXT) once and cached. Every call the shim does not handle
//! goes straight to these.

use libc::{c_char, c_int, c_void, iovec, mode_t, off64_t, off_t, size_t, ssize_t};
use std::sync::OnceLock;

macro_rules! real_fns {
    ($( $name:ident : fn($($arg:ty),*) -> $ret:ty ; )*) => {
        /// Pointers to the next definitions of each interposed function.
        pub struct Real {
            $( pub $name: unsafe extern "C" fn($($arg),*) -> $ret, )*
        }

        fn resolve() -> Real {
            Real {
                $( $name: {
                    let name = concat!(stringify!($name), "\0");
                    // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT finds
                    // the C library's definition behind ours.
                    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) };
                    assert!(!p.is_null(), "libmoneta_preload: no {} in the C library", stringify!($name));
                    // SAFETY: the C library's symbol of this name has this
                    // signature (POSIX / glibc).
                    unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) -> $ret>(p) }
                }, )*
            }
        }
    };
}

real_fns! {
    open: fn(*const c_char, c_int, mode_t) -> c_int;
    open64: fn(*const c_char, c_int, mode_t) -> c_int;
    openat: fn(c_int, *const c_char, c_int, mode_t) -> c_int;
    openat64: fn(c_int, *const c_char, c_int, mode_t) -> c_int;
    creat: fn(*const c_char, mode_t) -> c_int;
    creat64: fn(*const c_char, mode_t) -> c_int;
    close: fn(c_int) -> c_int;
    read: fn(c_int, *mut c_void, size_t) -> ssize_t;
    write: fn(c_int, *const c_void, size_t) -> ssize_t;
    pread: fn(c_int, *mut c_void, size_t, off_t) -> ssize_t;
    pread64: fn(c_int, *mut c_void, size_t, off64_t) -> ssize_t;
    pwrite: fn(c_int, *const c_void, size_t, off_t) -> ssize_t;
    pwrite64: fn(c_int, *const c_void, size_t, off64_t) -> ssize_t;
    readv: fn(c_int, *const iovec, c_int) -> ssize_t;
    writev: fn(c_int, *const iovec, c_int) -> ssize_t;
    preadv: fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
    preadv64: fn(c_int, *const iovec, c_int, off64_t) -> ssize_t;
    pwritev: fn(c_int, *const iovec, c_int, off_t) -> ssize_t;
    pwritev64: fn(c_int, *const iovec, c_int, off64_t) -> ssize_t;
    lseek64: fn(c_int, off64_t, c_int) -> off64_t;
    dup: fn(c_int) -> c_int;
    dup2: fn(c_int, c_int) -> c_int;
    dup3: fn(c_int, c_int, c_int) -> c_int;
    fcntl: fn(c_int, c_int, usize) -> c_int;
    fcntl64: fn(c_int, c_int, usize) -> c_int;
    ioctl: fn(c_int, libc::c_ulong, usize) -> c_int;
    ftruncate: fn(c_int, off_t) -> c_int;
    ftruncate64: fn(c_int, off64_t) -> c_int;
    fallocate64: fn(c_int, c_int, off64_t, off64_t) -> c_int;
    posix_fallocate64: fn(c_int, off64_t, off64_t) -> c_int;
    truncate: fn(*const c_char, off_t) -> c_int;
    truncate64: fn(*const c_char, off64_t) -> c_int;
    mmap: fn(*mut c_void, size_t, c_int, c_int, c_int, off_t) -> *mut c_void;
    mmap64: fn(*mut c_void, size_t, c_int, c_int, c_int, off64_t) -> *mut c_void;
    munmap: fn(*mut c_void, size_t) -> c_int;
    mremap: fn(*mut c_void, size_t, size_t, c_int, *mut c_void) -> *mut c_void;
    fsync: fn(c_int) -> c_int;
    fdatasync: fn(c_int) -> c_int;
    sync: fn() -> ();
    syncfs: fn(c_int) -> c_int;
    close_range: fn(libc::c_uint, libc::c_uint, c_int) -> c_int;
    closefrom: fn(c_int) -> ();
    socket: fn(c_int, c_int, c_int) -> c_int;
    socketpair: fn(c_int, c_int, c_int, *mut c_int) -> c_int;
    accept: fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> c_int;
    accept4: fn(c_int, *mut libc::sockaddr, *mut libc::socklen_t, c_int) -> c_int;
    pipe: fn(*mut c_int) -> c_int;
    pipe2: fn(*mut c_int, c_int) -> c_int;
    eventfd: fn(libc::c_uint, c_int) -> c_int;
    memfd_create: fn(*const c_char, libc::c_uint) -> c_int;
    epoll_create1: fn(c_int) -> c_int;
    execve: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    _exit: fn(c_int) -> ();
    execv: fn(*const c_char, *const *const c_char) -> c_int;
    execvp: fn(*const c_char, *const *const c_char) -> c_int;
    execvpe: fn(*const c_char, *const *const c_char, *const *const c_char) -> c_int;
    fexecve: fn(c_int, *const *const c_char, *const *const c_char) -> c_int;
    __open_2: fn(*const c_char, c_int) -> c_int;
    __open64_2: fn(*const c_char, c_int) -> c_int;
    __openat_2: fn(c_int, *const c_char, c_int) -> c_int;
    __openat64_2: fn(c_int, *const c_char, c_int) -> c_int;
    __read_chk: fn(c_int, *mut c_void, size_t, size_t) -> ssize_t;
    __pread_chk: fn(c_int, *mut c_void, size_t, off_t, size_t) -> ssize_t;
    __pread64_chk: fn(c_int, *mut c_void, size_t, off64_t, size_t) -> ssize_t;
}

static REAL: OnceLock<Real> = OnceLock::new();

/// The C library's functions (resolved on first use).
pub fn real() -> &'static Real {
    REAL.get_or_init(resolve)
}
