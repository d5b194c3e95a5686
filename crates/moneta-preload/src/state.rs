//! The shim's process state (SPEC §3.2): the channel to monetad, opened on
//! the first file the program opens on the Moneta mount, the table of
//! descriptors the shim handles, and the file mappings this process made.
//! Descriptors that `dup` made share one [`OpenFile`]. The file position is
//! the kernel's own (read with lseek, moved with lseek), so it is shared
//! exactly as the open file description shares it: across dup, fork, exec
//! and SCM_RIGHTS.
//!
//! Fork: the child shares the parent's channel pages and control socket, and
//! must not use them (their tags belong to the parent). pthread_atfork
//! handlers take the shim's own locks before the fork (so no other thread
//! holds one when the child is made) and the child's handler forgets the
//! parent's channel; the child opens its own on its next access and
//! re-registers each inherited descriptor with it. (A per-file lock held by
//! another thread at the fork can still block the child on that file.)
//! A child made without the C library's fork handlers (`clone`, a raw
//! `syscall(SYS_clone)`) has another pid than the one the shim recorded:
//! the shim does nothing in it, and the kernel serves all its IO.
//!
//! The shim's own descriptors (issue 42): the channel's socket, pages and
//! doorbell, each open file's descriptor of its own and the library's
//! second one, and each mapping's, all numbered from
//! [`moneta_client::OWN_FD_FLOOR`] up, close-on-exec. [`Shim::held`]
//! lists them; the interposed close, close_range, closefrom, dup2 and dup3
//! never let a program close or replace one (see lib.rs).

use moneta_client::file::MonetaFile;
use moneta_client::Moneta;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// Environment: the daemon's socket and the mount it serves.
pub const SOCKET_ENV: &str = "MONETA_SOCKET";
pub const MOUNT_ENV: &str = "MONETA_MOUNT";

/// A file the shim handles: the library's handle.
pub struct OpenFile {
    /// The library's file, for the channel of generation `generation`.
    pub file: Mutex<(u64, Option<Arc<MonetaFile>>)>,
    /// Held by read/write/readv/writev from reading the kernel's file
    /// position to moving it, so threads of this process sharing the open
    /// file description each get their own range.
    pub position: Mutex<()>,
    /// O_APPEND: writes go through the kernel, which makes them atomic.
    pub append: AtomicBool,
    /// O_DIRECT's alignment on this open file, (memory << 32) | offset in
    /// bytes; 0 without O_DIRECT. Misaligned direct I/O goes to the
    /// kernel, whose file system decides (EINVAL, or a short read).
    pub direct_align: AtomicU64,
    /// Empty when opened for writing (being created or rewritten): reads
    /// and writes go to the kernel until the program's first fsync of it.
    pub fresh: AtomicBool,
    /// The shim's own descriptor of this open file description (the
    /// library's handle uses it; closed with the last alias), made on the
    /// first call that needs it (-1 until then).
    pub fd: AtomicI32,
    /// (st_dev, st_ino) of the file at open: a descriptor that no longer
    /// names it is never used for it.
    pub identity: (u64, u64),
    /// Not 0: the kernel serves every request of this file, for the
    /// reason `KernelReason::ALL[kernel_only - 1]` (an active swap file).
    pub kernel_only: AtomicU8,
    /// When a write last found the file's attributes clean through a
    /// descriptor naming it, packed by [`crate::descriptors::attributes_seen`]
    /// (0: never): within [`crate::descriptors::RECHECK_NS`] of it, and with
    /// no attribute-changing ioctl of this process since, writes skip the
    /// `statx`.
    pub attrs_clean: AtomicU64,
}

impl Drop for OpenFile {
    /// The shim's descriptor lives as long as the last user of the open
    /// file, not the last alias: a thread still inside an IO of it keeps
    /// it, so its number cannot be reused under that IO (issue 42, case 3).
    fn drop(&mut self) {
        let own = self.fd.load(Ordering::Acquire);
        if own >= 0 {
            // SAFETY: the shim's own descriptor, used by no one now.
            unsafe { (crate::real::real().close)(own) };
        }
    }
}

impl OpenFile {
    /// The shim's own descriptor, duplicated from `alias` (a descriptor of
    /// this open file description the program just used) if there is none
    /// yet. High and close-on-exec, so the program's numbering and its
    /// children see nothing.
    ///
    /// Race-free (issue 42, case 3): the copy is kept only if it names this
    /// file and `alias` still maps to this open file in the shim's table
    /// after it was made (another thread may have closed `alias` and opened
    /// something else on its number meanwhile).
    pub fn own_fd(self: &Arc<Self>, alias: RawFd) -> Option<RawFd> {
        let fd = self.fd.load(Ordering::Acquire);
        if fd >= 0 {
            return Some(fd);
        }
        // SAFETY: fcntl(F_DUPFD_CLOEXEC) on the program's descriptor.
        let own = unsafe {
            (crate::real::real().fcntl)(alias, libc::F_DUPFD_CLOEXEC, OWN_FD_MIN as usize)
        };
        if own < 0 {
            return None;
        }
        let still = shim().get(alias).is_some_and(|of| Arc::ptr_eq(&of, self));
        if !still || identity(own) != Some(self.identity) {
            // SAFETY: the descriptor we just made.
            unsafe { (crate::real::real().close)(own) };
            return None;
        }
        match self
            .fd
            .compare_exchange(-1, own, Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => Some(own),
            Err(theirs) => {
                // Another thread made one first.
                // SAFETY: the descriptor we just made.
                unsafe { (crate::real::real().close)(own) };
                Some(theirs)
            }
        }
    }
}

/// The shim's own descriptors are numbered from here up.
pub const OWN_FD_MIN: RawFd = moneta_client::OWN_FD_FLOOR;

/// (st_dev, st_ino) of `fd`.
pub fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: fstat into a zeroed struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

/// This process's id, from the kernel (glibc caches nothing a raw clone
/// child could inherit wrongly).
pub fn kernel_pid() -> i32 {
    // SAFETY: getpid(2) has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_getpid) as i32 }
}

pub struct Shim {
    /// st_dev of the Moneta mount (files on it are ours).
    pub mount_dev: Option<u64>,
    socket: Option<String>,
    moneta: Mutex<Option<Moneta>>,
    /// Bumped in a forked child: handles from older generations are stale.
    generation: AtomicU64,
    files: RwLock<Vec<Option<Arc<OpenFile>>>>,
    /// Fast path: nothing to look up until the first file is ours.
    any: AtomicBool,
    /// File mappings this process made of files on the mount.
    pub mappings: Mutex<Vec<FileMapping>>,
    /// The process the shim's state belongs to (set at start and in a
    /// forked child).
    pid: AtomicI32,
    /// Free-text lines for the run report (io_uring instances seen, …).
    pub notes: Mutex<Vec<String>>,
    /// The channel's descriptors, and those of channels and handles the
    /// shim forgot (after a fork or a `dup2` onto one) but must keep open:
    /// all of them are the shim's, not the program's.
    book: Mutex<FdBook>,
}

#[derive(Default)]
struct FdBook {
    channel: Vec<RawFd>,
    retired: Vec<RawFd>,
}

/// A mapping of a file on the mount: monetad keeps the file on the kernel
/// path while any process maps it.
pub struct FileMapping {
    pub addr: usize,
    pub len: usize,
    /// A descriptor of the file (close-on-exec), to tell monetad which
    /// file was unmapped.
    pub fd: RawFd,
}

static SHIM: OnceLock<Shim> = OnceLock::new();

pub fn shim() -> &'static Shim {
    SHIM.get_or_init(|| {
        let mount_dev = std::env::var_os(MOUNT_ENV).and_then(|m| {
            let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(m.as_os_str()))
                .ok()?;
            // SAFETY: stat into a zeroed struct with a NUL-terminated path.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            (unsafe { libc::stat(c.as_ptr(), &mut st) } == 0).then_some(st.st_dev)
        });
        Shim {
            mount_dev,
            socket: std::env::var(SOCKET_ENV).ok(),
            moneta: Mutex::new(None),
            generation: AtomicU64::new(0),
            files: RwLock::new(Vec::new()),
            any: AtomicBool::new(false),
            mappings: Mutex::new(Vec::new()),
            pid: AtomicI32::new(kernel_pid()),
            notes: Mutex::new(Vec::new()),
            book: Mutex::new(FdBook::default()),
        }
    })
}

impl Shim {
    /// The channel (connecting on first use).
    pub fn moneta(&self) -> Option<Moneta> {
        let mut m = self.moneta.lock().ok()?;
        if m.is_none() {
            let socket = self.socket.as_ref()?;
            match Moneta::connect(std::path::Path::new(socket)) {
                Ok(c) => {
                    if let Ok(mut b) = self.book.lock() {
                        b.channel = c.own_fds();
                    }
                    *m = Some(c)
                }
                Err(e) => {
                    warn(&format!(
                        "cannot reach monetad at {socket}: {e}; using the kernel"
                    ));
                    return None;
                }
            }
        }
        m.clone()
    }

    /// Whether `fd` names a regular file on the Moneta mount.
    pub fn on_mount(&self, fd: RawFd) -> bool {
        let Some(dev) = self.mount_dev else {
            return false;
        };
        // SAFETY: fstat into a zeroed struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        (unsafe { libc::fstat(fd, &mut st) }) == 0
            && st.st_dev == dev
            && st.st_mode & libc::S_IFMT == libc::S_IFREG
    }

    /// Whether this is a process the shim's state does not belong to (a
    /// child made without fork handlers): then the shim stays out of the way.
    pub fn foreign(&self) -> bool {
        kernel_pid() != self.pid.load(Ordering::Acquire)
    }

    /// Every descriptor the shim holds now (its channel's, each open
    /// file's own and second one, each mapping's): the numbers a program
    /// must not close or replace.
    pub fn held(&self) -> Vec<RawFd> {
        let mut fds = Vec::new();
        if let Ok(b) = self.book.lock() {
            fds.extend(&b.channel);
            fds.extend(&b.retired);
        }
        if let Ok(files) = self.files.read() {
            for of in files.iter().flatten() {
                fds.push(of.fd.load(Ordering::Acquire));
                if let Ok(slot) = of.file.try_lock() {
                    fds.extend(slot.1.as_ref().and_then(|f| f.twin_fd()));
                }
            }
        }
        if let Ok(maps) = self.mappings.lock() {
            fds.extend(maps.iter().map(|r| r.fd));
        }
        fds.retain(|&fd| fd >= 0);
        fds.sort_unstable();
        fds.dedup();
        fds
    }

    /// Keep `fds` (of a forgotten channel or handle) as the shim's.
    pub fn retire(&self, fds: impl IntoIterator<Item = RawFd>) {
        if let Ok(mut b) = self.book.lock() {
            b.retired.extend(fds);
        }
    }

    /// The program is about to put something on `fd`, one of the shim's
    /// own numbers (dup2/dup3): give up what the shim had there. A
    /// channel descriptor: the channel is dropped (monetad frees it when
    /// its socket closes) and every file registers again on a new one. An
    /// open file's descriptor: it moves to another number and the file
    /// registers again. A mapping's: it moves.
    pub fn vacate(&self, fd: RawFd) {
        let channel = {
            let mut m = self.moneta.lock().unwrap_or_else(|e| e.into_inner());
            let mut b = self.book.lock().unwrap_or_else(|e| e.into_inner());
            if b.channel.contains(&fd) {
                let old = std::mem::take(&mut b.channel);
                b.retired.extend(old.iter().filter(|&&x| x != fd));
                m.take()
            } else {
                if let Some(i) = b.retired.iter().position(|&x| x == fd) {
                    b.retired.swap_remove(i);
                }
                None
            }
        };
        if let Some(c) = channel {
            // Forgotten, not dropped: a thread still inside an IO holds a
            // clone, and its last drop would close `fd`, the program's
            // from now on. Its socket is shut down so monetad frees the
            // channel now (closed outright if `fd` is the socket).
            let fds = c.own_fds();
            std::mem::forget(c);
            if let Some(&socket) = fds.last().filter(|&&s| s != fd) {
                // SAFETY: shutdown(2) of the forgotten channel's socket.
                unsafe { libc::shutdown(socket, libc::SHUT_RDWR) };
            }
            self.generation.fetch_add(1, Ordering::AcqRel);
            return;
        }
        if let Ok(files) = self.files.read() {
            for of in files.iter().flatten() {
                let mut slot = of.file.lock().unwrap_or_else(|e| e.into_inner());
                let twin = slot.1.as_ref().and_then(|f| f.twin_fd()) == Some(fd);
                let own = of.fd.load(Ordering::Acquire) == fd;
                if own || twin {
                    // The library's handle names `fd`: forget it (the
                    // daemon's copy of the file is freed with the channel).
                    let gone = slot.1.take();
                    self.retire(gone.as_ref().and_then(|f| f.twin_fd()).filter(|&t| t != fd));
                    std::mem::forget(gone);
                }
                if own {
                    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on the shim's descriptor.
                    let moved = unsafe {
                        (crate::real::real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, OWN_FD_MIN as usize)
                    };
                    of.fd.store(moved.max(-1), Ordering::Release);
                }
            }
        }
        if let Ok(mut maps) = self.mappings.lock() {
            for r in maps.iter_mut().filter(|r| r.fd == fd) {
                // SAFETY: fcntl(F_DUPFD_CLOEXEC) on the shim's descriptor.
                r.fd = unsafe {
                    (crate::real::real().fcntl)(fd, libc::F_DUPFD_CLOEXEC, OWN_FD_MIN as usize)
                };
            }
        }
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub fn get(&self, fd: RawFd) -> Option<Arc<OpenFile>> {
        if fd < 0 || !self.any.load(Ordering::Acquire) {
            return None;
        }
        self.files.read().ok()?.get(fd as usize)?.clone()
    }

    /// Every open file the table holds.
    pub fn open_files(&self) -> Vec<Arc<OpenFile>> {
        self.files
            .read()
            .map_or_else(|_| Vec::new(), |f| f.iter().flatten().cloned().collect())
    }

    /// Every number the table has an entry for.
    pub fn known(&self) -> Vec<RawFd> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.files.read().map_or_else(
            |_| Vec::new(),
            |f| {
                f.iter()
                    .enumerate()
                    .filter(|(_, e)| e.is_some())
                    .map(|(i, _)| i as RawFd)
                    .collect()
            },
        )
    }

    pub fn insert(&self, fd: RawFd, file: Arc<OpenFile>) {
        let Ok(mut files) = self.files.write() else {
            return;
        };
        let i = fd as usize;
        if files.len() <= i {
            files.resize(i + 1, None);
        }
        files[i] = Some(file);
        self.any.store(true, Ordering::Release);
    }

    /// Forget `fd`; returns its file if no other descriptor refers to it.
    pub fn remove(&self, fd: RawFd) -> Option<Arc<OpenFile>> {
        if fd < 0 || !self.any.load(Ordering::Acquire) {
            return None;
        }
        let mut files = self.files.write().ok()?;
        let f = files.get_mut(fd as usize)?.take()?;
        let shared = files.iter().flatten().any(|g| Arc::ptr_eq(g, &f));
        (!shared).then_some(f)
    }

    /// Before fork (pthread_atfork prepare): take the shim's own locks, so
    /// no other thread holds one at the moment of the fork (the child has
    /// only this thread and could never get it back).
    pub fn before_fork(&'static self) {
        let guards = ForkGuards {
            files: self.files.write().unwrap_or_else(|e| e.into_inner()),
            moneta: self.moneta.lock().unwrap_or_else(|e| e.into_inner()),
            mappings: self.mappings.lock().unwrap_or_else(|e| e.into_inner()),
            book: self.book.lock().unwrap_or_else(|e| e.into_inner()),
        };
        FORK_GUARDS.with(|g| *g.borrow_mut() = Some(guards));
    }

    /// After fork, in the parent: give the locks back.
    pub fn after_fork_in_parent(&self) {
        FORK_GUARDS.with(|g| drop(g.borrow_mut().take()));
    }

    /// In a forked child: drop the parent's channel without touching it,
    /// then give the locks back.
    pub fn after_fork_in_child(&self) {
        let guards = FORK_GUARDS.with(|g| g.borrow_mut().take());
        match guards {
            Some(mut g) => {
                // Forget, not drop: nothing of the parent's may be sent or
                // unmapped in a way that could disturb it (dropping only
                // closes our copies, but forgetting is the simplest thing
                // that is certainly safe).
                std::mem::forget(g.moneta.take());
                // Its descriptors stay open in the child, the shim's still.
                let old = std::mem::take(&mut g.book.channel);
                g.book.retired.extend(old);
            }
            None => {
                if let Ok(mut m) = self.moneta.lock() {
                    std::mem::forget(m.take());
                }
                self.retire(
                    self.book
                        .lock()
                        .map(|mut b| std::mem::take(&mut b.channel))
                        .unwrap_or_default(),
                );
            }
        }
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.pid.store(kernel_pid(), Ordering::Release);
        // The child's run report counts its own requests.
        moneta_client::file::ROUTES.reset();
        if let Ok(mut n) = self.notes.lock() {
            n.clear();
        }
    }
}

/// The shim's locks, held by the forking thread across fork.
struct ForkGuards {
    #[allow(dead_code)] // held, never read
    files: std::sync::RwLockWriteGuard<'static, Vec<Option<Arc<OpenFile>>>>,
    moneta: std::sync::MutexGuard<'static, Option<Moneta>>,
    #[allow(dead_code)] // held, never read
    mappings: std::sync::MutexGuard<'static, Vec<FileMapping>>,
    book: std::sync::MutexGuard<'static, FdBook>,
}

thread_local! {
    static FORK_GUARDS: std::cell::RefCell<Option<ForkGuards>> =
        const { std::cell::RefCell::new(None) };
}

/// A message on stderr (the shim never fails a call just to say something).
pub fn warn(message: &str) {
    let text = format!("libmoneta_preload: {message}\n");
    // SAFETY: write(2) of a valid buffer to stderr.
    unsafe { (crate::real::real().write)(2, text.as_ptr().cast(), text.len()) };
}
