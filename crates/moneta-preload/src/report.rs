//! The shim's run report (issue 43; README, "Unmodified programs", run
//! report): with `MONETA_RUN_REPORT_DIR` set, each shim process writes
//! `$MONETA_RUN_REPORT_DIR/shim-<pid>.json` when it exits (a forked child
//! too, counting its own requests), and before each execve
//! `shim-<pid>-<n>.json` (n = 1, 2, … per exec of that pid; removed again
//! if the exec fails): requests and bytes of the mount's files served by
//! the device and by the kernel, per operation, why the kernel served
//! them, and notes. Written atomically (a temporary file, then rename).
//! The counters are moneta-client's per-process atomics
//! ([`moneta_client::file::ROUTES`]); nothing here runs on the IO path.
//!
//! Asynchronous IO: libaio's `io_submit` is interposed and each iocb of a
//! mount file counts as a kernel request (`libaio`). io_uring submissions
//! cannot be seen (they are stores to a ring shared with the kernel), so
//! the rings are counted where they are made: `io_uring_setup` (liburing's
//! function) and `syscall(__NR_io_uring_setup, …)` (fio's engine, and
//! liburing when built on the C library's `syscall`) are interposed, and
//! each ring a process created is reason `io-uring`, op `ring-setup`, in
//! its report, with a note. A ring made by an inline system call (liburing
//! built without the C library) is seen only if it is still open at exit.

use crate::real::real;
use crate::state::shim;
use crate::{enter, set_errno};
use libc::{c_char, c_int, c_long};
use moneta_client::file::{KernelReason, RouteOp, ROUTES};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

/// io_uring rings this process created (successful `io_uring_setup`s).
static RINGS_MADE: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Rings this thread made (tells a liburing `io_uring_setup` that went
    /// through the interposed `syscall` from one that did not).
    static RINGS_HERE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

fn ring_made() {
    RINGS_MADE.fetch_add(1, Ordering::Relaxed);
    RINGS_HERE.with(|n| n.set(n.get() + 1));
}

/// A forked child counts its own rings.
pub fn after_fork_in_child() {
    RINGS_MADE.store(0, Ordering::Relaxed);
}

/// The directory reports go to (read once, at the first use).
fn dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        std::env::var_os("MONETA_RUN_REPORT_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    })
    .as_deref()
}

/// Read the environment now: a program may change it before it exits.
pub fn init() {
    let _ = dir();
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn counts(c: &[moneta_client::file::Count; 3]) -> String {
    let one = |op: RouteOp| {
        let (r, b) = c[op as usize].get();
        format!(
            "{}:{{\"requests\":{r},\"bytes\":{b}}}",
            json_string(op.name())
        )
    };
    format!("{{{}}}", RouteOp::ALL.map(one).join(","))
}

/// io_uring instances this process has open.
fn io_uring_instances() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| {
        d.flatten()
            .filter(|e| {
                std::fs::read_link(e.path())
                    .is_ok_and(|l| l.to_string_lossy() == "anon_inode:[io_uring]")
            })
            .count()
    })
}

/// The report's JSON.
pub fn render(pid: i32) -> String {
    let exe = std::fs::read_link("/proc/self/exe")
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let argv0 = std::fs::read("/proc/self/cmdline")
        .ok()
        .and_then(|c| {
            c.split(|&b| b == 0)
                .next()
                .map(|a| String::from_utf8_lossy(a).into_owned())
        })
        .unwrap_or_default();
    let mut reasons = Vec::new();
    for why in KernelReason::ALL {
        for op in RouteOp::ALL {
            let (r, b) = ROUTES.reasons[why as usize][op as usize].get();
            if r > 0 || b > 0 {
                reasons.push(format!(
                    "{{\"reason\":{},\"op\":{},\"requests\":{r},\"bytes\":{b}}}",
                    json_string(why.name()),
                    json_string(op.name())
                ));
            }
        }
    }
    let made = RINGS_MADE.load(Ordering::Relaxed);
    if made > 0 {
        reasons.push(format!(
            "{{\"reason\":{},\"op\":\"ring-setup\",\"requests\":{made},\"bytes\":0}}",
            json_string(KernelReason::IoUring.name())
        ));
    }
    let mut notes: Vec<String> = shim().notes.lock().map(|n| n.clone()).unwrap_or_default();
    let open = io_uring_instances();
    if made > 0 {
        notes.push(format!(
            "{made} io_uring instance(s) created ({open} still open at exit): what they \
             submitted went to the kernel and is not counted in the requests here (io-uring)"
        ));
    } else if open > 0 {
        notes.push(format!(
            "{open} io_uring instance(s) open at exit, made outside the interposed calls \
             (inherited, or an inline system call): what they submitted went to the kernel and \
             is not counted here (io-uring)"
        ));
    }
    format!(
        "{{\"schema\":\"moneta-shim-report/1\",\"pid\":{pid},\"exe\":{},\"argv0\":{},\
         \"device\":{},\"kernel\":{},\"kernel_reasons\":[{}],\"notes\":[{}]}}\n",
        json_string(&exe),
        json_string(&argv0),
        counts(&ROUTES.device),
        counts(&ROUTES.kernel),
        reasons.join(","),
        notes
            .iter()
            .map(|n| json_string(n))
            .collect::<Vec<_>>()
            .join(",")
    )
}

/// Write the report as `name` in the report directory, atomically.
fn write_as(dir: &Path, name: &str, pid: i32) -> Option<PathBuf> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.tmp"));
    std::fs::write(&tmp, render(pid)).ok()?;
    std::fs::rename(&tmp, &path).ok()?;
    Some(path)
}

/// At exit: `shim-<pid>.json` (not in a child made without fork handlers,
/// whose counters are its parent's).
pub fn at_exit() {
    let _ = enter(|| {
        let dir = dir()?;
        if shim().foreign() {
            return None;
        }
        let pid = std::process::id() as i32;
        write_as(dir, &format!("shim-{pid}.json"), pid)
    });
}

/// Before an execve: `shim-<pid>-<n>.json`, its path (to remove if the
/// exec fails).
fn before_exec() -> Option<PathBuf> {
    enter(|| {
        let dir = dir()?;
        if shim().foreign() {
            return None;
        }
        let pid = std::process::id() as i32;
        let n = (1..)
            .find(|n| !dir.join(format!("shim-{pid}-{n}.json")).exists())
            .unwrap_or(1);
        write_as(dir, &format!("shim-{pid}-{n}.json"), pid)
    })
    .flatten()
}

/// Run an exec with its pre-exec report; it returns only if it failed.
fn exec_with_report(exec: impl FnOnce() -> c_int) -> c_int {
    let written = before_exec();
    let r = exec();
    // SAFETY: reading this thread's errno right after the call.
    let errno = unsafe { *libc::__errno_location() };
    if let Some(p) = written {
        let _ = enter(|| std::fs::remove_file(p));
    }
    set_errno(errno);
    r
}

#[no_mangle]
pub unsafe extern "C" fn execve(
    path: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    exec_with_report(|| unsafe { (real().execve)(path, argv, envp) })
}

/// `_exit` and `_Exit` skip the fini array (fio's job processes end this
/// way, as many forking servers' children do): the report is written first.
#[no_mangle]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    at_exit();
    // SAFETY: the C library's `_exit`; it does not return.
    unsafe { (real()._exit)(status) };
    // Not reached; exit_group ends every thread if it were.
    loop {
        // SAFETY: exit_group takes the status and does not return.
        unsafe { libc::syscall(libc::SYS_exit_group, status as c_long) };
    }
}

/// C99's name for `_exit`.
#[no_mangle]
#[allow(non_snake_case)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    // SAFETY: as `_exit`.
    unsafe { _exit(status) }
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    exec_with_report(|| unsafe { (real().execv)(path, argv) })
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    exec_with_report(|| unsafe { (real().execvp)(file, argv) })
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(
    file: *const c_char,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    exec_with_report(|| unsafe { (real().execvpe)(file, argv, envp) })
}

#[no_mangle]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> c_int {
    exec_with_report(|| unsafe { (real().fexecve)(fd, argv, envp) })
}

/// libaio's io_submit, if the program links libaio (else the system call).
fn real_io_submit() -> Option<unsafe extern "C" fn(usize, c_long, *mut *mut u8) -> c_int> {
    static P: OnceLock<usize> = OnceLock::new();
    let p = *P.get_or_init(|| {
        // SAFETY: dlsym with a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"io_submit".as_ptr()) as usize }
    });
    // SAFETY: libaio's io_submit has this signature.
    (p != 0).then(|| unsafe {
        std::mem::transmute::<usize, unsafe extern "C" fn(usize, c_long, *mut *mut u8) -> c_int>(p)
    })
}

/// The iocbs' requests on the mount's files, counted as the kernel's.
///
/// # Safety
/// `iocbs` valid for `n` pointers to struct iocb (io_submit's contract).
unsafe fn count_iocbs(iocbs: *mut *mut u8, n: usize) {
    let _ = enter(|| {
        for i in 0..n {
            // SAFETY: the caller's promise; struct iocb's layout (uapi/linux/aio_abi.h).
            let (opcode, fd, buf, nbytes) = unsafe {
                let cb = *iocbs.add(i);
                if cb.is_null() {
                    continue;
                }
                (
                    std::ptr::read_unaligned(cb.add(16) as *const u16),
                    std::ptr::read_unaligned(cb.add(20) as *const u32) as c_int,
                    std::ptr::read_unaligned(cb.add(24) as *const u64),
                    std::ptr::read_unaligned(cb.add(32) as *const u64),
                )
            };
            if shim().get(fd).is_none() {
                continue;
            }
            let vector_bytes = || {
                (0..nbytes.min(1024) as usize)
                    // SAFETY: a vectored iocb's buffer is an iovec array of nbytes entries.
                    .map(|k| unsafe { (*(buf as *const libc::iovec).add(k)).iov_len as u64 })
                    .sum::<u64>()
            };
            let (op, bytes) = match opcode {
                0 => (RouteOp::Read, nbytes),
                1 => (RouteOp::Write, nbytes),
                2 | 3 => (RouteOp::Fsync, 0),
                7 => (RouteOp::Read, vector_bytes()),
                8 => (RouteOp::Write, vector_bytes()),
                _ => continue,
            };
            ROUTES.kernel(KernelReason::Libaio, op, bytes);
        }
    });
}

#[no_mangle]
pub unsafe extern "C" fn io_submit(ctx: usize, nr: c_long, iocbs: *mut *mut u8) -> c_int {
    let r = match real_io_submit() {
        // SAFETY: the caller's arguments, passed on.
        Some(f) => unsafe { f(ctx, nr, iocbs) },
        None => {
            // SAFETY: io_submit(2) with the caller's arguments; libaio's
            // convention: a negative errno on failure.
            let r = unsafe { libc::syscall(libc::SYS_io_submit, ctx, nr, iocbs) };
            if r < 0 {
                // SAFETY: reading this thread's errno.
                -unsafe { *libc::__errno_location() }
            } else {
                r as c_int
            }
        }
    };
    if r > 0 {
        // SAFETY: io_submit's contract; the first r were accepted.
        unsafe { count_iocbs(iocbs, r as usize) };
    }
    r
}

/// The C library's `syscall`, found without the shim's own machinery
/// (a `OnceLock` waits with futex, a `syscall` of its own: no lock here).
fn real_syscall(
) -> unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long {
    static P: AtomicUsize = AtomicUsize::new(0);
    let mut p = P.load(Ordering::Acquire);
    if p == 0 {
        // SAFETY: dlsym with a NUL-terminated name; glibc always has it.
        p = unsafe { libc::dlsym(libc::RTLD_NEXT, c"syscall".as_ptr()) } as usize;
        P.store(p, Ordering::Release);
    }
    // SAFETY: glibc's `long syscall(long number, ...)`: on x86-64 a variadic
    // callee reads its integer arguments from the same registers (and the
    // seventh from the same stack slot) as this fixed signature passes them;
    // glibc's own implementation reads exactly seven.
    unsafe {
        std::mem::transmute::<
            usize,
            unsafe extern "C" fn(c_long, c_long, c_long, c_long, c_long, c_long, c_long) -> c_long,
        >(p)
    }
}

/// `syscall(2)`, declared with its six optional arguments as fixed ones (as
/// glibc reads them: the System V ABI passes them the same way): passed
/// on unchanged, errno included; a ring made by `__NR_io_uring_setup` is
/// counted. The numbers that close or replace descriptors go through the
/// shim's own `close`/`close_range`/`dup*` ([`crate::descriptors::raw`]),
/// so its table stays in step with the kernel's. Every other number only
/// costs the indirect call.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    number: c_long,
    a: c_long,
    b: c_long,
    c: c_long,
    d: c_long,
    e: c_long,
    f: c_long,
) -> c_long {
    if let Some(r) = crate::descriptors::raw(number, a, b, c) {
        return r;
    }
    // SAFETY: the caller's arguments, passed on.
    let r = unsafe { real_syscall()(number, a, b, c, d, e, f) };
    if number == libc::SYS_io_uring_setup && r >= 0 {
        ring_made();
    }
    r
}

/// liburing's `io_uring_setup` (programs that call it directly; liburing's
/// own `io_uring_queue_init` makes the system call itself, seen through
/// [`syscall`] when liburing is built on the C library): passed on to
/// liburing's, or made as the system call with liburing's convention (a
/// negative errno) when no liburing is loaded.
#[no_mangle]
pub unsafe extern "C" fn io_uring_setup(entries: libc::c_uint, params: *mut libc::c_void) -> c_int {
    static P: AtomicUsize = AtomicUsize::new(0);
    let mut p = P.load(Ordering::Acquire);
    if p == 0 {
        // SAFETY: dlsym with a NUL-terminated name; 1 marks "not found".
        p = (unsafe { libc::dlsym(libc::RTLD_NEXT, c"io_uring_setup".as_ptr()) } as usize).max(1);
        P.store(p, Ordering::Release);
    }
    let before = RINGS_HERE.with(|n| n.get());
    let r = if p > 1 {
        // SAFETY: liburing's `int io_uring_setup(unsigned, struct io_uring_params *)`.
        let f = unsafe {
            std::mem::transmute::<
                usize,
                unsafe extern "C" fn(libc::c_uint, *mut libc::c_void) -> c_int,
            >(p)
        };
        // SAFETY: the caller's arguments, passed on.
        unsafe { f(entries, params) }
    } else {
        // SAFETY: io_uring_setup(2) with the caller's arguments.
        let r = unsafe {
            real_syscall()(
                libc::SYS_io_uring_setup,
                entries as c_long,
                params as c_long,
                0,
                0,
                0,
                0,
            )
        };
        if r < 0 {
            // SAFETY: reading this thread's errno.
            -unsafe { *libc::__errno_location() }
        } else {
            r as c_int
        }
    };
    // Counted once: liburing built on the C library's `syscall` was
    // counted there already (on this thread).
    if r >= 0 && RINGS_HERE.with(|n| n.get()) == before {
        ring_made();
    }
    r
}
