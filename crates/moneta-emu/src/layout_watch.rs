//! The kernel's word on layout changes of granted files, from every process
//! (issue 8; DESIGN "a layout change of a granted file revokes the old
//! blocks for every channel before they can be reused").
//!
//! A fanotify group of the pre-content class (Linux 6.14+) holds an inode
//! mark on every file a channel holds. The kernel then stops each process
//! that is about to touch such a file — before the file system changes
//! anything — until the daemon answers, and tells what the process is doing:
//!
//! | what a process does | event (in order) | measured on this kernel, XFS and ext4 |
//! |---|---|---|
//! | read, pread | FAN_PRE_ACCESS (range), FAN_ACCESS after | revoke from the range's start until the access event; drop stale clean pages |
//! | write, pwrite, fallocate (any mode), copy into it | FAN_PRE_ACCESS (range), FAN_MODIFY after | revoke from the range's start |
//! | truncate(2) | FAN_PRE_ACCESS (new size, count 0); no event after | revoke from the new size |
//! | ftruncate | FAN_PRE_ACCESS (new size, count 0); FAN_CLOSE_WRITE at close | revoke from the new size |
//! | open with O_TRUNC | FAN_OPEN_PERM only (the truncation itself sends nothing) | the opener's flags, read from /proc/TID/syscall |
//! | open for writing outside the shim (xfs_fsr, e4defrag, losetup, any plain writer) | FAN_OPEN_PERM | every channel to the kernel while the writer has it open (its ioctls can move blocks unreported) |
//! | mmap | FAN_PRE_ACCESS (the mapped range); page faults send nothing | the file goes to the kernel path while mapped |
//!
//! A pre-access event does not say whether it is a read, a write, a hole
//! punch or an mmap: the watcher reads the stopped thread's system call
//! from /proc/TID/syscall (it cannot change while the thread waits for the
//! answer). An event whose system call cannot be read counts as a layout
//! change (the safe side). Events caused by this process are answered at
//! once. Every permission event is answered FAN_ALLOW — the watcher never
//! denies, and answers even if the handler panics — and closing the group
//! allows whatever is still pending, so no process can hang on the daemon.

use crate::cover_keeper::CoverKeeper;
use crate::sys;
use moneta_abi::error::EmuError;
use moneta_abi::InodeId;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// FAN_PRE_ACCESS (uapi/linux/fanotify.h, Linux 6.14).
const FAN_PRE_ACCESS: u64 = 0x0010_0000;
/// FAN_EVENT_INFO_TYPE_RANGE (uapi/linux/fanotify.h, Linux 6.14).
const FAN_EVENT_INFO_TYPE_RANGE: u8 = 6;
/// The events a watched file's mark asks for.
const MARK_MASK: u64 = FAN_PRE_ACCESS
    | libc::FAN_OPEN_PERM
    | libc::FAN_ACCESS
    | libc::FAN_MODIFY
    | libc::FAN_CLOSE_WRITE;

/// x86-64 system call numbers the watcher tells apart.
mod nr {
    pub const READ: i64 = 0;
    pub const OPEN: i64 = 2;
    pub const MMAP: i64 = 9;
    pub const PREAD64: i64 = 17;
    pub const READV: i64 = 19;
    pub const TRUNCATE: i64 = 76;
    pub const FTRUNCATE: i64 = 77;
    pub const CREAT: i64 = 85;
    pub const OPENAT: i64 = 257;
    pub const PREADV: i64 = 295;
    pub const PREADV2: i64 = 327;
    pub const OPENAT2: i64 = 437;
}

/// What a process is about to do to a watched file (or has done).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayoutEvent {
    /// Truncation to `to` bytes (truncate, ftruncate, an O_TRUNC open).
    Truncate { inode: InodeId, tid: i32, to: u64 },
    /// A change of content or layout from byte `from` on (a write, a
    /// fallocate, or an access the watcher could not classify).
    Change { inode: InodeId, tid: i32, from: u64 },
    /// The file is being opened for writing (`truncate`: with O_TRUNC).
    /// A writer outside the shim may move the file's blocks with calls no
    /// event reports (XFS_IOC_SWAPEXT as xfs_fsr does, EXT4_IOC_SWAP_BOOT,
    /// exchange-range, a loop device attached to it).
    OpenForWrite {
        inode: InodeId,
        tid: i32,
        truncate: bool,
    },
    /// The file is being mapped.
    Map { inode: InodeId, tid: i32 },
    /// A read through the kernel from byte `from` on: the page cache is
    /// about to be filled there (and read ahead past it).
    Read { inode: InodeId, tid: i32, from: u64 },
    /// The thread finished a change or a read (FAN_MODIFY,
    /// FAN_CLOSE_WRITE, FAN_ACCESS).
    Done { inode: InodeId, tid: i32 },
}

/// What the watcher has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LayoutWatchStats {
    pub events: u64,
    pub permission_events: u64,
    pub handler_ns_total: u64,
    pub handler_ns_max: u64,
}

#[derive(Default)]
struct Counters {
    events: AtomicU64,
    permission_events: AtomicU64,
    handler_ns_total: AtomicU64,
    handler_ns_max: AtomicU64,
}

pub type Handler = Arc<dyn Fn(&LayoutEvent) + Send + Sync>;

/// A running watcher: a fanotify group and the thread that answers it.
pub struct LayoutWatch {
    group: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
    /// Groups whose file-system mark makes later opens report (see
    /// [`LayoutWatch::cover_file_system`]), and their keeper.
    coverage: Arc<std::sync::Mutex<Coverage>>,
}

/// The coverage groups, and the child process holding a second reference
/// to each (crate::cover_keeper: monetad killed must release its watcher
/// group before them).
#[derive(Default)]
struct Coverage {
    groups: Vec<OwnedFd>,
    keeper: Option<CoverKeeper>,
    /// When a keeper was last started (one start a second at most).
    started: Option<std::time::Instant>,
}

impl Coverage {
    /// Start a new keeper if the last one died (someone killed it).
    fn tend(&mut self) {
        let Some(keeper) = &self.keeper else {
            return;
        };
        if keeper.alive()
            || self
                .started
                .is_some_and(|t| t.elapsed() < std::time::Duration::from_secs(1))
        {
            return;
        }
        eprintln!(
            "monetad: the coverage keeper (pid {}) died; starting another",
            keeper.pid()
        );
        self.keeper = None;
        self.start_keeper();
    }

    fn start_keeper(&mut self) {
        self.started = Some(std::time::Instant::now());
        let fds: Vec<RawFd> = self.groups.iter().map(|g| g.as_raw_fd()).collect();
        match CoverKeeper::spawn(&fds) {
            Ok(k) => self.keeper = Some(k),
            Err(e) => eprintln!(
                "monetad: {e}; killed (SIGKILL) with a writer waiting on it, monetad's \
                 exit may hang until that writer is killed"
            ),
        }
    }
}

impl LayoutWatch {
    /// Start a watcher; each event goes to `handler` (on the watcher's
    /// thread) before the process that caused it may go on. An error if
    /// this kernel has no pre-content events (before Linux 6.14) or the
    /// caller lacks CAP_SYS_ADMIN.
    pub fn start(handler: Handler) -> Result<LayoutWatch, EmuError> {
        let flags = libc::FAN_CLASS_PRE_CONTENT
            | libc::FAN_CLOEXEC
            | libc::FAN_NONBLOCK
            | libc::FAN_UNLIMITED_QUEUE
            | libc::FAN_UNLIMITED_MARKS
            | libc::FAN_REPORT_TID;
        // SAFETY: plain syscall; the result is a new descriptor or -1.
        let fd = unsafe {
            libc::fanotify_init(
                flags,
                (libc::O_RDONLY | libc::O_LARGEFILE | libc::O_CLOEXEC) as u32,
            )
        };
        if fd < 0 {
            return Err(EmuError::io(
                "starting the layout watcher (fanotify_init with pre-content events: \
                 Linux 6.14+ and CAP_SYS_ADMIN)",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a descriptor we just made and own.
        let group = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let coverage = Arc::new(std::sync::Mutex::new(Coverage::default()));
        let thread = {
            let (group, stop, counters) = (group.clone(), stop.clone(), counters.clone());
            let coverage = coverage.clone();
            std::thread::Builder::new()
                .name("moneta-layout-watch".into())
                .spawn(move || serve(&group, &stop, &counters, &coverage, &handler))
                .map_err(|e| EmuError::io("starting the layout watcher thread", e))?
        };
        Ok(LayoutWatch {
            group,
            stop,
            thread: Some(thread),
            counters,
            coverage,
        })
    }

    /// Make every file opened from now on on the file system holding
    /// `dir` able to report its accesses once it is watched. The kernel
    /// decides that per open file, at open, and only if the file or its
    /// file system has a pre-content mark then: a separate group marks the
    /// file system with an *ignore* mask of FAN_PRE_ACCESS, which delivers
    /// nothing but counts as such a mark (found and measured on this
    /// kernel: an unwatched file's writes cost the same with it).
    pub fn cover_file_system(&self, dir: &std::path::Path) -> Result<(), EmuError> {
        // SAFETY: plain syscall; the result is a new descriptor or -1.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_PRE_CONTENT | libc::FAN_CLOEXEC,
                (libc::O_RDONLY | libc::O_CLOEXEC) as u32,
            )
        };
        if fd < 0 {
            return Err(EmuError::io(
                "starting the coverage group (fanotify_init)",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: a descriptor we just made and own.
        let group = unsafe { OwnedFd::from_raw_fd(fd) };
        let path = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(dir.as_os_str()))
            .map_err(|_| EmuError::io("the watched directory", "a NUL in its path"))?;
        // SAFETY: marks the file system holding `path` (NUL-terminated).
        let r = unsafe {
            libc::fanotify_mark(
                group.as_raw_fd(),
                libc::FAN_MARK_ADD | libc::FAN_MARK_FILESYSTEM | libc::FAN_MARK_IGNORE_SURV,
                FAN_PRE_ACCESS,
                libc::AT_FDCWD,
                path.as_ptr(),
            )
        };
        if r != 0 {
            return Err(EmuError::io(
                &format!("covering the file system of {}", dir.display()),
                std::io::Error::last_os_error(),
            ));
        }
        let fd = group.as_raw_fd();
        let mut coverage = self.coverage.lock().expect("coverage");
        coverage.groups.push(group);
        let given = coverage.keeper.as_ref().map(|k| k.give(fd));
        if !matches!(given, Some(Ok(()))) {
            // The first group, or a keeper that cannot take it: a new
            // keeper holds them all.
            coverage.keeper = None;
            coverage.start_keeper();
        }
        Ok(())
    }

    /// Watch the file open on `fd`. An error if its file system cannot
    /// send pre-content events.
    pub fn watch(&self, fd: RawFd) -> Result<(), EmuError> {
        self.mark(libc::FAN_MARK_ADD, fd)
    }

    pub fn unwatch(&self, fd: RawFd) -> Result<(), EmuError> {
        self.mark(libc::FAN_MARK_REMOVE, fd)
    }

    fn mark(&self, op: u32, fd: RawFd) -> Result<(), EmuError> {
        // SAFETY: marks the object `fd` refers to (path NULL).
        let r = unsafe {
            libc::fanotify_mark(self.group.as_raw_fd(), op, MARK_MASK, fd, std::ptr::null())
        };
        if r != 0 {
            return Err(EmuError::io(
                "marking the file for the layout watcher (fanotify_mark)",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    pub fn stats(&self) -> LayoutWatchStats {
        let c = &self.counters;
        LayoutWatchStats {
            events: c.events.load(Ordering::Relaxed),
            permission_events: c.permission_events.load(Ordering::Relaxed),
            handler_ns_total: c.handler_ns_total.load(Ordering::Relaxed),
            handler_ns_max: c.handler_ns_max.load(Ordering::Relaxed),
        }
    }
}

impl Drop for LayoutWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // The group closes with the last Arc: the kernel allows anything pending.
    }
}

/// The watcher thread: read events, classify, hand over, answer. Stops
/// within 100 ms of `stop`.
fn serve(
    group: &OwnedFd,
    stop: &AtomicBool,
    counters: &Counters,
    coverage: &std::sync::Mutex<Coverage>,
    handler: &Handler,
) {
    let me = std::process::id() as i32;
    let mut buf = vec![0u8; 64 << 10];
    let mut tended = std::time::Instant::now();
    while !stop.load(Ordering::Acquire) {
        if tended.elapsed() >= std::time::Duration::from_millis(100) {
            tended = std::time::Instant::now();
            coverage.lock().expect("coverage").tend();
        }
        let mut pfd = libc::pollfd {
            fd: group.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, 100) } <= 0 {
            continue;
        }
        // SAFETY: reading into our buffer.
        let n = unsafe { libc::read(group.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            continue;
        }
        let mut at = 0usize;
        let n = n as usize;
        let meta_len = std::mem::size_of::<libc::fanotify_event_metadata>();
        while at + meta_len <= n {
            // SAFETY: the kernel wrote a whole metadata record at `at`.
            let meta: libc::fanotify_event_metadata =
                unsafe { std::ptr::read_unaligned(buf.as_ptr().add(at).cast()) };
            let len = meta.event_len as usize;
            if len < meta_len || at + len > n {
                break;
            }
            let info = &buf[at + meta_len..at + len];
            handle_one(group, &meta, info, me, counters, handler);
            at += len;
        }
    }
}

fn handle_one(
    group: &OwnedFd,
    meta: &libc::fanotify_event_metadata,
    info: &[u8],
    me: i32,
    counters: &Counters,
    handler: &Handler,
) {
    counters.events.fetch_add(1, Ordering::Relaxed);
    // SAFETY: the event's descriptor is ours to close (or FAN_NOFD, < 0).
    let event_fd = (meta.fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(meta.fd) });
    let permission = meta.mask & (FAN_PRE_ACCESS | libc::FAN_OPEN_PERM) != 0;
    if meta.pid != me {
        if let Some(fd) = &event_fd {
            if let Some(event) = classify(meta, info, fd.as_raw_fd()) {
                let t0 = std::time::Instant::now();
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| handler(&event)));
                let ns = t0.elapsed().as_nanos() as u64;
                counters.handler_ns_total.fetch_add(ns, Ordering::Relaxed);
                counters.handler_ns_max.fetch_max(ns, Ordering::Relaxed);
            }
        }
    }
    if permission {
        counters.permission_events.fetch_add(1, Ordering::Relaxed);
        if let Some(fd) = &event_fd {
            let response = libc::fanotify_response {
                fd: fd.as_raw_fd(),
                response: libc::FAN_ALLOW,
            };
            // SAFETY: writing one response record to the group.
            unsafe {
                libc::write(
                    group.as_raw_fd(),
                    (&response as *const libc::fanotify_response).cast(),
                    std::mem::size_of::<libc::fanotify_response>(),
                )
            };
        }
    }
}

/// What the event means for the file's layout (None: nothing).
fn classify(meta: &libc::fanotify_event_metadata, info: &[u8], fd: RawFd) -> Option<LayoutEvent> {
    let st = sys::fstat(fd).ok()?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return None;
    }
    let inode = InodeId {
        dev: st.st_dev,
        ino: st.st_ino,
    };
    let tid = meta.pid;
    if meta.mask & (libc::FAN_MODIFY | libc::FAN_CLOSE_WRITE | libc::FAN_ACCESS) != 0 {
        return Some(LayoutEvent::Done { inode, tid });
    }
    let call = syscall_of(tid);
    if meta.mask & libc::FAN_OPEN_PERM != 0 {
        let flags = match call {
            Some((nr::OPEN, args)) => Some(args[1] as i32),
            Some((nr::OPENAT, args)) => Some(args[2] as i32),
            Some((nr::CREAT, _)) => Some(libc::O_WRONLY | libc::O_TRUNC),
            // openat2 keeps its flags in user memory, and an unreadable
            // call is unknown: assume the worst (writing, truncating).
            Some((nr::OPENAT2, _)) | None => Some(libc::O_RDWR | libc::O_TRUNC),
            // exec, a loop device's attach through another call: writing.
            Some(_) => None,
        };
        let (write, truncate) = match flags {
            Some(f) => (
                f & libc::O_ACCMODE != libc::O_RDONLY,
                f & libc::O_TRUNC != 0,
            ),
            None => (true, false),
        };
        return write.then_some(LayoutEvent::OpenForWrite {
            inode,
            tid,
            truncate,
        });
    }
    if meta.mask & FAN_PRE_ACCESS == 0 {
        return None;
    }
    let (offset, count) = range_of(info).unwrap_or((0, 0));
    match call {
        // Reading changes no layout, but fills the page cache (sendfile
        // and splice count as changes: the watched file may be their
        // destination).
        Some((nr::READ | nr::PREAD64 | nr::READV | nr::PREADV | nr::PREADV2, _)) => {
            Some(LayoutEvent::Read {
                inode,
                tid,
                from: offset,
            })
        }
        Some((nr::MMAP, _)) => Some(LayoutEvent::Map { inode, tid }),
        Some((nr::TRUNCATE | nr::FTRUNCATE, _)) => Some(LayoutEvent::Truncate {
            inode,
            tid,
            to: offset,
        }),
        // Unreadable: a zero-length range is how truncations look.
        None if count == 0 => Some(LayoutEvent::Truncate {
            inode,
            tid,
            to: offset,
        }),
        _ => Some(LayoutEvent::Change {
            inode,
            tid,
            from: offset,
        }),
    }
}

/// The (offset, count) of a pre-access event's range record.
fn range_of(info: &[u8]) -> Option<(u64, u64)> {
    let mut at = 0;
    while at + 4 <= info.len() {
        let kind = info[at];
        let len = u16::from_ne_bytes([info[at + 2], info[at + 3]]) as usize;
        if len < 4 || at + len > info.len() {
            return None;
        }
        if kind == FAN_EVENT_INFO_TYPE_RANGE && len >= 24 {
            let offset = u64::from_ne_bytes(info[at + 8..at + 16].try_into().ok()?);
            let count = u64::from_ne_bytes(info[at + 16..at + 24].try_into().ok()?);
            return Some((offset, count));
        }
        at += len;
    }
    None
}

/// The system call a thread is in (number and first six arguments), read
/// from /proc/TID/syscall while the thread waits for our answer.
fn syscall_of(tid: i32) -> Option<(i64, [u64; 6])> {
    let text = std::fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?;
    let mut fields = text.split_ascii_whitespace();
    let nr: i64 = fields.next()?.parse().ok()?;
    let mut args = [0u64; 6];
    for a in &mut args {
        *a = u64::from_str_radix(fields.next()?.trim_start_matches("0x"), 16).ok()?;
    }
    Some((nr, args))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn range_records_are_found_and_bad_ones_refused() {
        let mut info = vec![FAN_EVENT_INFO_TYPE_RANGE, 0, 24, 0, 0, 0, 0, 0];
        info.extend_from_slice(&8192u64.to_ne_bytes());
        info.extend_from_slice(&4096u64.to_ne_bytes());
        assert_eq!(range_of(&info), Some((8192, 4096)));
        assert_eq!(range_of(&info[..10]), None);
        assert_eq!(range_of(&[6, 0, 0, 0]), None, "a zero-length record");
    }

    #[test]
    fn this_threads_system_call_is_readable() {
        // Reading our own syscall file shows the read in progress.
        // SAFETY: gettid has no preconditions.
        let (nr, _) = syscall_of(unsafe { libc::gettid() }).expect("readable");
        assert_eq!(nr, nr::READ);
    }
}
