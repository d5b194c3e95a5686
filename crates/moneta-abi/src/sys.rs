//! The system calls both sides of a channel make (the daemon and its
//! clients: moneta-client, the shim), each wrapped once with its SAFETY
//! argument: shared mappings (memfd, files), futexes across processes,
//! descriptor passing over Unix sockets (SCM_RIGHTS) with the peer's
//! credentials (SO_PEERCRED), the clock the channel's stamps are read on,
//! and the file calls of file grants (SPEC §3.4): fstat, fcntl, fdatasync,
//! positioned I/O and page-cache advice. The daemon's own calls (FIEMAP,
//! cachestat, the passes over /proc) are in `moneta_emu::sys`.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU32;

/// A shared, read-write memory mapping, unmapped on drop.
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory; all concurrent access to it goes
// through atomics or raw-pointer copies whose callers document their races.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Map `len` bytes of `fd` (MAP_SHARED), or private anonymous memory
    /// backed by transparent huge pages where the kernel allows (fewer TLB
    /// misses on a large medium) if `fd` is None. `noreserve` asks the kernel
    /// not to reserve swap, so a mapping larger than RAM works as long as it
    /// is not all touched.
    pub fn new(fd: Option<RawFd>, len: usize, noreserve: bool) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let mut flags = match fd {
            Some(_) => libc::MAP_SHARED,
            None => libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        };
        if noreserve {
            flags |= libc::MAP_NORESERVE;
        }
        // SAFETY: a fresh mapping chosen by the kernel (addr = NULL) aliases
        // no Rust object; the result is checked before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd.unwrap_or(-1),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if fd.is_none() {
            // SAFETY: advice on our own fresh mapping; failure only means no
            // huge pages, which is fine.
            unsafe { libc::madvise(ptr, len, libc::MADV_HUGEPAGE) };
        }
        Ok(Mapping {
            ptr: NonNull::new(ptr.cast()).expect("mmap returned NULL"),
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Write dirty pages back to the file (no-op for anonymous memory).
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the range is exactly our own live mapping.
        let r = unsafe { libc::msync(self.ptr.as_ptr().cast(), self.len, libc::MS_SYNC) };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: we own the mapping; nothing borrows it past our lifetime.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An anonymous in-memory file of `len` bytes (for a channel's shared pages).
pub fn memfd(name: &str, len: u64) -> io::Result<OwnedFd> {
    let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: cname is a valid NUL-terminated string for the call's duration.
    let fd = unsafe { libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: plain syscall on our own descriptor.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Free bytes of the file system holding `fd`, as an unprivileged writer
/// sees them (`f_bavail`: without the blocks kept for root).
pub fn available_bytes(fd: RawFd) -> io::Result<u64> {
    // SAFETY: an all-zero statvfs is a valid value for the kernel to fill.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: plain syscall writing into our struct.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Size of the file behind `fd`.
pub fn file_len(fd: RawFd) -> io::Result<u64> {
    Ok(fstat(fd)?.st_size as u64)
}

/// Sleep while `*word == expected` (or until woken, or `timeout_ns`).
/// Shared (not FUTEX_PRIVATE) so that it works across processes mapping the
/// same pages.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout_ns: Option<u64>) {
    let ts = timeout_ns.map(|ns| libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a live, aligned 32-bit atomic; the kernel only reads
    // it. EAGAIN/EINTR/ETIMEDOUT are all "go and look again" for callers.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
        )
    };
}

/// Wake every thread sleeping on `word`, in any process.
pub fn futex_wake_all(word: &AtomicU32) {
    // SAFETY: as futex_wait; waking has no memory effects.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX) };
}

/// The credentials of the process at the other end of a Unix socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer_credentials(socket: RawFd) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`.
    let r = unsafe {
        libc::getsockopt(
            socket,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCredentials {
        pid: cred.pid,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The most descriptors one message carries.
pub const MAX_FDS_PER_MESSAGE: usize = 4;

/// Send `data` with `fds` attached (SCM_RIGHTS). Sends all of `data`.
pub fn send_with_fds(socket: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS_PER_MESSAGE);
    let mut sent = 0;
    while sent < data.len() {
        let mut iov = libc::iovec {
            iov_base: data[sent..].as_ptr() as *mut libc::c_void,
            iov_len: data.len() - sent,
        };
        let mut control = [0u64; 8]; // aligned space for one cmsg of 4 fds
                                     // SAFETY: msghdr is plain data; zeroed is a valid "no name, no control".
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if sent == 0 && !fds.is_empty() {
            let fd_bytes = std::mem::size_of_val(fds) as u32;
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = space;
            // SAFETY: `control` holds `space` bytes (≤ 64), so the first cmsg
            // header and its data fit; CMSG_* only compute offsets in it.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes) as usize;
                std::ptr::copy_nonoverlapping(
                    fds.as_ptr(),
                    libc::CMSG_DATA(cmsg).cast::<RawFd>(),
                    fds.len(),
                );
            }
        }
        // SAFETY: msg points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    Ok(())
}

/// Receive up to `buf.len()` bytes and any descriptors attached to them.
/// Returns (bytes read, descriptors); 0 bytes means the peer closed.
pub fn recv_with_fds(socket: RawFd, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    loop {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 8];
        // SAFETY: as in send_with_fds.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: msg points at live buffers; MSG_CMSG_CLOEXEC keeps received
        // descriptors from leaking into children.
        let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        let mut fds = Vec::new();
        // SAFETY: the kernel filled msg_control; CMSG_FIRSTHDR/NXTHDR walk it
        // within msg_controllen, and each SCM_RIGHTS payload holds whole fds,
        // which become ours (the kernel installed them in our table).
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(cmsg);
                    let payload = (*cmsg).cmsg_len - (data as usize - cmsg as usize);
                    let count = payload / std::mem::size_of::<RawFd>();
                    for i in 0..count {
                        let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "too many descriptors attached to one message",
            ));
        }
        return Ok((n as usize, fds));
    }
}

/// A descriptor's `fstat`.
pub fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: fstat writes into the zeroed struct we pass; an invalid fd is EBADF.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(st)
}

/// Make the calling thread's timed sleeps end when asked (timer slack
/// 1 ns instead of the default 50 µs, prctl(2) PR_SET_TIMERSLACK): a
/// reactor that naps until its next model event must not oversleep by the
/// kernel's default slack. No privilege needed.
pub fn set_timer_slack_ns(ns: u64) -> io::Result<()> {
    // SAFETY: prctl(2) PR_SET_TIMERSLACK on this thread takes a plain value.
    if unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, ns.max(1) as libc::c_ulong, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Run the calling thread under SCHED_FIFO at `priority` (1–99): it
/// preempts every ordinary thread the moment it is runnable (the kernel's
/// real-time throttling still leaves others 5% of each second). Needs
/// CAP_SYS_NICE.
pub fn set_realtime(priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: sched_setscheduler(2) on this thread (0) with a valid param.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Set the calling thread's nice value (setpriority(2) on its thread id:
/// on Linux the value is per thread). Lowering it below the current value
/// needs CAP_SYS_NICE.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid(2) takes nothing; setpriority(2) on this thread's id.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether `path` is on a tmpfs (statfs(2)); false if it cannot be asked.
pub fn on_tmpfs(path: &std::path::Path) -> bool {
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid C string and `st` a statfs the call fills.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == TMPFS_MAGIC
    }
}

/// A new descriptor (close-on-exec) for the open file description behind `fd`.
pub fn dup(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC only reads the descriptor table; an invalid fd is EBADF.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` is a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// The file status flags (`fcntl(F_GETFL)`): access mode, O_APPEND, O_PATH, …
pub fn status_flags(fd: RawFd) -> io::Result<i32> {
    // SAFETY: F_GETFL has no memory effects.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(flags)
}

/// Write the file's dirty data (and the metadata needed to read it) to its device.
pub fn fdatasync(fd: RawFd) -> io::Result<()> {
    loop {
        // SAFETY: plain syscall on a descriptor; no memory effects.
        if unsafe { libc::fdatasync(fd) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Drop the kernel's clean cached pages of `[offset, offset + len)` of the
/// file (len 0: to the end of the file).
pub fn drop_cached_pages(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    let offset = libc::off_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: advice only; no memory effects. Returns the error number.
    match unsafe { libc::posix_fadvise(fd, offset, len, libc::POSIX_FADV_DONTNEED) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// The alignment O_DIRECT needs on the open file `fd`: (memory, offset)
/// in bytes, from statx(2)'s STATX_DIOALIGN (Linux 6.1); None when the
/// file system does not say (then direct I/O is not supported there).
pub fn dio_alignment(fd: RawFd) -> Option<(u32, u32)> {
    /// STATX_DIOALIGN (uapi/linux/stat.h).
    const STATX_DIOALIGN: u32 = 0x2000;
    /// Offsets of stx_dio_mem_align and stx_dio_offset_align in struct
    /// statx (uapi/linux/stat.h), which the libc crate does not expose.
    const MEM_ALIGN_AT: usize = 152;
    let mut buf = [0u8; 256];
    let empty = b"\0";
    // SAFETY: statx writes at most 256 bytes (struct statx) into `buf`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_statx,
            fd,
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            STATX_DIOALIGN,
            buf.as_mut_ptr(),
        )
    };
    let mask = u32::from_ne_bytes(buf[..4].try_into().ok()?);
    if r != 0 || mask & STATX_DIOALIGN == 0 {
        return None;
    }
    let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
    let (mem, offset) = (word(MEM_ALIGN_AT), word(MEM_ALIGN_AT + 4));
    (mem > 0 && offset > 0).then_some((mem, offset))
}

/// Set the file's length.
pub fn ftruncate(fd: RawFd, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: plain syscall on a descriptor; no memory effects.
    if unsafe { libc::ftruncate(fd, len) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Read from `offset` until `buf` is full or the file ends; returns the
/// bytes read.
pub fn pread_full(fd: RawFd, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        let at =
            libc::off_t::try_from(offset + done as u64).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: the kernel writes at most `buf.len() - done` bytes into
        // our exclusively borrowed buffer.
        let n = unsafe { libc::pread(fd, buf[done..].as_mut_ptr().cast(), buf.len() - done, at) };
        match n {
            0 => break,
            n if n > 0 => done += n as usize,
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(done)
}

/// Write all of `buf` at `offset`.
pub fn pwrite_all(fd: RawFd, buf: &[u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let at =
            libc::off_t::try_from(offset + done as u64).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: the kernel reads at most `buf.len() - done` bytes of our buffer.
        let n = unsafe { libc::pwrite(fd, buf[done..].as_ptr().cast(), buf.len() - done, at) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        } else {
            done += n as usize;
        }
    }
    Ok(())
}

/// Size in bytes of the block device open on `fd` (BLKGETSIZE64).
pub fn block_device_bytes(fd: RawFd) -> io::Result<u64> {
    /// _IOR(0x12, 114, size_t) from linux/fs.h.
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut bytes: u64 = 0;
    // SAFETY: the ioctl writes one u64 into `bytes`.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut bytes) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(bytes)
}

/// A second, independent open file description of what `fd` names, with
/// access mode `flags` (O_CLOEXEC added): through /proc/self/fd, so the
/// kernel checks the access again.
pub fn reopen(fd: RawFd, flags: i32) -> io::Result<OwnedFd> {
    let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).expect("no NUL");
    // SAFETY: open(2) with a NUL-terminated path.
    let new = unsafe { libc::open(path.as_ptr(), flags | libc::O_CLOEXEC) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just opened and own.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(new) })
}

/// Write back the file's dirty pages over `[offset, offset + len)` and wait
/// for them (sync_file_range with WAIT_BEFORE, WRITE, WAIT_AFTER): they are
/// clean afterwards, so they can be dropped.
pub fn write_back_range(fd: RawFd, offset: u64, len: u64) -> io::Result<()> {
    let offset = libc::off64_t::try_from(offset).map_err(|_| io::ErrorKind::InvalidInput)?;
    let len = libc::off64_t::try_from(len).map_err(|_| io::ErrorKind::InvalidInput)?;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: plain syscall on a descriptor; no memory effects.
    if unsafe { libc::sync_file_range(fd, offset, len, flags) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// CLOCK_MONOTONIC in nanoseconds: the same clock in every process (a vDSO
/// read, no system call). A channel's submit stamps and due words are read
/// on it (`channel`'s header), so a client's stamp converts into the
/// device's model time.
#[inline]
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The CPU time this thread has used, in ns (CLOCK_THREAD_CPUTIME_ID): the
/// work of a section, without the time it waited for a core.
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid timespec to write; both clocks always exist.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The SCHED_FIFO priority of real-time device and benchmark threads
/// ([`set_realtime`]).
pub const REALTIME_PRIORITY: i32 = 10;

/// Hint the CPU to load the cache line at `p` (never faults, reads nothing
/// the program sees).
#[inline]
pub fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint: it never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
