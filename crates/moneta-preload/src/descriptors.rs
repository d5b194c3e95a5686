//! The program's descriptor numbers and the shim's (issue 42; README,
//! "Direct-path contract", descriptors): the shim's own descriptors sit at
//! [`moneta_client::OWN_FD_FLOOR`] and above, and no call of the
//! program's closes or replaces one. `close` of one answers EBADF (the
//! program never opened that number), `close_range` and `closefrom` close
//! around them, `dup2`/`dup3` onto one first move the shim's away
//! ([`crate::state::Shim::vacate`]). Every call that hands the program a
//! new number (open of any file, socket, socketpair, accept(4), pipe(2),
//! eventfd, memfd_create, epoll_create1, dup, F_DUPFD) drops whatever the
//! shim still knew under it: that number was closed behind the shim's
//! back, and the old file must never be served for the new one.
//!
//! It also answers what the kernel would refuse a write to: active swap
//! files (`/proc/swaps`, looked at only when the system has swap) and
//! files marked immutable or append-only (`statx` attributes). Another
//! process may `swapon` or `chattr` a file at any time and nothing tells
//! this one: a write reads the attributes again (and checks that its
//! descriptor still names the file) when the last clean look is older than
//! [`RECHECK_NS`] or this process made an ioctl that may change them since,
//! and looks at the system's swap at most every [`RECHECK_NS`]. So another
//! process's change takes effect for the shim's writes within 1 ms (the
//! kernel's: at once), this process's own at once.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::real::real;
use crate::state::{shim, OWN_FD_MIN};
use crate::{enter, forget, forget_now};
use libc::{c_char, c_int, c_uint};

/// Whether the program's `fd` is a descriptor of the shim's (only outside
/// shim code: the library closes its own).
pub fn held_by_shim(fd: c_int) -> bool {
    fd >= OWN_FD_MIN && enter(|| !shim().foreign() && shim().held().contains(&fd)).unwrap_or(false)
}

/// Before the program's dup2/dup3 onto `fd`: if the shim holds it, move the
/// shim's away (the program gets the number, as without the shim).
pub fn vacate_for_program(fd: c_int) {
    if fd >= OWN_FD_MIN {
        let _ = enter(|| {
            let s = shim();
            if !s.foreign() && s.held().contains(&fd) {
                s.vacate(fd);
            }
        });
    }
}

/// From shim code: forget what the shim knew under the number `fd`, which
/// the kernel just handed the program again.
pub fn drop_stale(fd: c_int) {
    forget_now(fd);
}

/// After a call that made the descriptor `fd` (if it did).
fn made(fd: c_int) -> c_int {
    if fd >= 0 {
        let _ = enter(|| drop_stale(fd));
    }
    fd
}

/// The ranges of `[first, last]` that hold no descriptor of the shim's.
fn gaps(first: c_uint, last: c_uint, held: &[c_int]) -> Vec<(c_uint, c_uint)> {
    let mut out = Vec::new();
    let mut from = first as u64;
    for &h in held {
        let h = h as u64;
        if h < from || h > last as u64 {
            continue;
        }
        if h > from {
            out.push((from as c_uint, (h - 1) as c_uint));
        }
        from = h + 1;
    }
    if from <= last as u64 {
        out.push((from as c_uint, last));
    }
    out
}

fn do_close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if first > last {
        // SAFETY: the caller's arguments: the kernel answers EINVAL.
        return unsafe { (real().close_range)(first, last, flags) };
    }
    let held = enter(|| {
        let s = shim();
        if s.foreign() {
            Vec::new()
        } else {
            s.held()
        }
    })
    .unwrap_or_default();
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        // The shim's table forgets what closes (its own entries only: the
        // numbers it has are few).
        let known: Vec<c_int> = enter(|| shim().known())
            .unwrap_or_default()
            .into_iter()
            .filter(|&fd| fd as u64 >= first as u64 && fd as u64 <= last as u64)
            .filter(|fd| !held.contains(fd))
            .collect();
        for fd in known {
            forget(fd);
        }
    }
    for (a, b) in gaps(first, last, &held) {
        // SAFETY: close_range over numbers the shim does not hold.
        let r = unsafe { (real().close_range)(a, b, flags) };
        if r != 0 {
            return r;
        }
    }
    0
}

/// The C library's `syscall()` with a number that closes or replaces
/// descriptors (`SYS_close`, `SYS_close_range`, `SYS_dup`, `SYS_dup2`,
/// `SYS_dup3`): made through the shim's own handling of that call, as the
/// C library's function of the same name would be, so the shim's table
/// stays in step with the kernel's and its own descriptors stay its own.
/// The arguments are the kernel's types (`unsigned int` descriptors, `int`
/// flags: the upper halves of the registers are not the caller's), the
/// answer `syscall()`'s (-1 and errno). `None` for every other number.
pub fn raw(
    number: libc::c_long,
    a: libc::c_long,
    b: libc::c_long,
    c: libc::c_long,
) -> Option<libc::c_long> {
    let fd = |v: libc::c_long| v as c_uint as c_int;
    // SAFETY (each arm): the interposed call with the caller's arguments,
    // as the kernel reads them.
    let r = match number {
        libc::SYS_close => unsafe { crate::close(fd(a)) },
        libc::SYS_close_range => do_close_range(a as c_uint, b as c_uint, c as c_uint as c_int),
        libc::SYS_dup => unsafe { crate::dup(fd(a)) },
        libc::SYS_dup2 => unsafe { crate::dup2(fd(a), fd(b)) },
        libc::SYS_dup3 => unsafe { crate::dup3(fd(a), fd(b), c as c_int) },
        _ => return None,
    };
    Some(r as libc::c_long)
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    do_close_range(first, last, flags)
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(low: c_int) {
    if low >= 0 && do_close_range(low as c_uint, c_uint::MAX, 0) == 0 {
        return;
    }
    // SAFETY: the caller's argument.
    unsafe { (real().closefrom)(low) }
}

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int {
    made(unsafe { (real().socket)(domain, kind, protocol) })
}

#[no_mangle]
pub unsafe extern "C" fn socketpair(d: c_int, k: c_int, p: c_int, sv: *mut c_int) -> c_int {
    let r = unsafe { (real().socketpair)(d, k, p, sv) };
    if r == 0 {
        // SAFETY: socketpair filled both.
        unsafe {
            made(*sv);
            made(*sv.add(1));
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn accept(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
) -> c_int {
    made(unsafe { (real().accept)(s, addr, len) })
}

#[no_mangle]
pub unsafe extern "C" fn accept4(
    s: c_int,
    addr: *mut libc::sockaddr,
    len: *mut libc::socklen_t,
    flags: c_int,
) -> c_int {
    made(unsafe { (real().accept4)(s, addr, len, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn pipe(fds: *mut c_int) -> c_int {
    let r = unsafe { (real().pipe)(fds) };
    if r == 0 {
        // SAFETY: pipe filled both.
        unsafe {
            made(*fds);
            made(*fds.add(1));
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn pipe2(fds: *mut c_int, flags: c_int) -> c_int {
    let r = unsafe { (real().pipe2)(fds, flags) };
    if r == 0 {
        // SAFETY: pipe2 filled both.
        unsafe {
            made(*fds);
            made(*fds.add(1));
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn eventfd(initval: c_uint, flags: c_int) -> c_int {
    made(unsafe { (real().eventfd)(initval, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn memfd_create(name: *const c_char, flags: c_uint) -> c_int {
    made(unsafe { (real().memfd_create)(name, flags) })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    made(unsafe { (real().epoll_create1)(flags) })
}

/// Before a write: if the system's swap changed since the last look
/// (`sysinfo`'s total, one system call), every open file that became an
/// active swap file goes to the kernel, which refuses writes to it
/// (ETXTBSY).
pub fn follow_swap() {
    static SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = now_ns();
    let next = NEXT.load(Ordering::Acquire);
    if now < next
        || NEXT
            .compare_exchange(next, now + RECHECK_NS, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
    {
        return; // looked less than RECHECK_NS ago, or another thread looks now
    }
    // SAFETY: sysinfo into a zeroed struct.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut info) } != 0 {
        return;
    }
    let total = info.totalswap as u64 * info.mem_unit as u64;
    if SEEN.swap(total, std::sync::atomic::Ordering::AcqRel) == total {
        return;
    }
    for of in shim().open_files() {
        let swap = is_swap_file(of.identity.0, of.identity.1);
        let mark = if swap {
            moneta_client::file::KernelReason::KernelRefusedAttr as u8 + 1
        } else {
            0
        };
        of.kernel_only
            .store(mark, std::sync::atomic::Ordering::Release);
    }
}

/// Whether the file (st_dev, st_ino) is an active swap file.
pub fn is_swap_file(dev: u64, ino: u64) -> bool {
    // SAFETY: sysinfo into a zeroed struct.
    let mut info: libc::sysinfo = unsafe { std::mem::zeroed() };
    if unsafe { libc::sysinfo(&mut info) } == 0 && info.totalswap == 0 {
        return false;
    }
    let Ok(text) = std::fs::read_to_string("/proc/swaps") else {
        return false;
    };
    text.lines().skip(1).any(|line| {
        let mut cols = line.split_whitespace();
        let (Some(name), Some("file")) = (cols.next(), cols.next()) else {
            return false;
        };
        // /proc/swaps escapes blanks in names as octal (\040).
        let name = name.replace("\\040", " ").replace("\\011", "\t");
        std::fs::metadata(&name).is_ok_and(|m| {
            std::os::unix::fs::MetadataExt::dev(&m) == dev
                && std::os::unix::fs::MetadataExt::ino(&m) == ino
        })
    })
}

/// How long a look at what another process can change without telling
/// this one (a file's attributes, the system's swap) stands: 1 ms.
pub const RECHECK_NS: u64 = 1_000_000;

/// Bumped after every ioctl of this process that may change attributes.
static ATTR_EPOCH: AtomicU64 = AtomicU64::new(0);

/// CLOCK_MONOTONIC in nanoseconds (the vDSO: no system call).
fn now_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// After an ioctl that may have changed a file's attributes.
pub fn attributes_may_have_changed() {
    ATTR_EPOCH.fetch_add(1, Ordering::AcqRel);
}

/// The epoch to pass to [`attributes_seen`], read before the look.
pub fn attribute_epoch() -> u64 {
    ATTR_EPOCH.load(Ordering::Acquire)
}

/// Packed (microseconds << 16 | epoch's low 16 bits): one atomic word, so
/// a time and an epoch from two different looks are never combined (48
/// bits of microseconds: 8.9 years of uptime; past that a look never
/// stands, which costs a statx, never a missed change).
fn pack(ns: u64, epoch: u64) -> u64 {
    ((ns / 1000) << 16) | (epoch & 0xFFFF)
}

/// A write found `of`'s attributes clean; `epoch` was read before it looked.
pub fn attributes_seen(of: &crate::state::OpenFile, epoch: u64) {
    of.attrs_clean
        .store(pack(now_ns(), epoch), Ordering::Release);
}

/// Whether the last clean look at `of`'s attributes still stands: less
/// than [`RECHECK_NS`] old and no attribute-changing ioctl since.
pub fn attributes_fresh(of: &crate::state::OpenFile) -> bool {
    let seen = of.attrs_clean.load(Ordering::Acquire);
    if seen == 0 {
        return false;
    }
    let epoch = attribute_epoch();
    let now_us = now_ns() / 1000;
    seen & 0xFFFF == epoch & 0xFFFF && now_us.saturating_sub(seen >> 16) < RECHECK_NS / 1000
}

/// ((st_dev, st_ino), statx attributes) of `fd`.
pub fn write_attributes(fd: c_int) -> Option<((u64, u64), u64)> {
    // SAFETY: statx of the descriptor into a zeroed struct.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_INO,
            &mut sx,
        )
    };
    if r != 0 {
        return None;
    }
    let dev = libc::makedev(sx.stx_dev_major, sx.stx_dev_minor);
    Some(((dev, sx.stx_ino), sx.stx_attributes))
}

#[cfg(test)]
mod tests {
    use super::gaps;

    #[test]
    fn gaps_skip_the_held_numbers() {
        assert_eq!(gaps(3, 10, &[]), vec![(3, 10)]);
        assert_eq!(
            gaps(3, u32::MAX, &[512, 513, 700]),
            vec![(3, 511), (514, 699), (701, u32::MAX)]
        );
        assert_eq!(gaps(512, 512, &[512]), vec![]);
        assert_eq!(gaps(0, 600, &[1, 600]), vec![(0, 0), (2, 599)]);
    }
}
