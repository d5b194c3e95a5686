//! One worker process of a torture run: a seeded schedule of file
//! operations from every family the direct path must keep (README,
//! "Direct-path contract"), on files of its own and on files shared with
//! the other workers, each read checked in the run against a model.
//!
//! - **Private files** (two per worker): every operation is applied to an
//!   in-memory model when the kernel (or the shim) says it succeeded, and
//!   every read must equal the model byte for byte. Each result goes to the
//!   worker's log, so the run through the shim can be compared call by
//!   call with the same schedule through the kernel alone.
//! - **The shared file**: each worker owns its stripe of 4 KiB blocks
//!   (checked exactly), and all write whole stamped units over one
//!   contested range (every unit read must be a valid unit of that file at
//!   that place, and a unit this worker wrote never reads as zeros again).
//! - **The mapped file**: plain workers keep it mapped and store their own
//!   units through the mapping; shim workers pwrite theirs; each unit has
//!   one owner whose model is exact, so a stale page written back over
//!   another's synced data is seen.
//! - **Processes**: fork with a shared file position (records through one
//!   descriptor, none may be lost), exec with an inherited descriptor,
//!   SCM_RIGHTS, and kill -9 of a writer (what it synced must be there).
//!
//! Lines of the log that start with `~` are not deterministic (they depend
//! on other workers) and are left out of the differential comparison.

#[path = "growth_ops.rs"]
mod growth_ops;
mod races;

use crate::pattern::{self, stamped, Rng, UNIT};
use crate::sys::{self, show, Aligned, Sys};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The largest size a private file is grown to.
pub const MAX_FILE: u64 = 8 << 20;
/// The largest single write.
const MAX_IO: u64 = 1 << 20;
/// Blocks of the shared file's stripe per worker.
pub const STRIPE_BLOCKS: u64 = 64;
/// The contested range of the shared file.
pub const CONTESTED_BYTES: u64 = 256 << 10;
/// Size of the mapped file.
pub const MAPPED_BYTES: u64 = 256 << 10;
/// File ids of the files all workers share.
pub const SHARED_ID: u16 = 0xFFFF;
pub const MAPPED_ID: u16 = 0xFFFE;

pub fn private_id(worker: u32, k: u32) -> u16 {
    ((worker << 8) | k) as u16
}
pub fn log_id(worker: u32) -> u16 {
    ((worker << 8) | 0x80) as u16
}
pub fn kill_id(worker: u32) -> u16 {
    ((worker << 8) | 0x81) as u16
}
/// Files a worker's units may legitimately appear in: its own.
pub fn owner_of(id: u16) -> Option<u32> {
    (id < 0xFF00).then_some((id >> 8) as u32)
}
pub fn private_name(worker: u32, k: u32) -> String {
    format!("w{worker}.f{k}")
}
/// Which worker owns unit `index` of the mapped file.
pub fn mapped_owner(index: u64, workers: u32) -> u32 {
    ((index / 4) % workers as u64) as u32
}
pub fn stripe_offset(worker: u32, j: u64, workers: u32) -> u64 {
    (worker as u64 + workers as u64 * j) * 4096
}
pub fn contested_offset(workers: u32) -> u64 {
    workers as u64 * STRIPE_BLOCKS * 4096
}

/// The operations, by name (`--skip` takes these names).
pub const OPS: &[(&str, u64)] = &[
    ("pwrite", 140),
    ("pwritev", 40),
    ("write", 50),
    ("writev", 20),
    ("pread", 140),
    ("preadv", 30),
    ("read", 40),
    ("ftruncate", 20),
    ("truncate", 10),
    ("fallocate", 60),
    ("fsync", 30),
    ("fdatasync", 20),
    ("sync_range", 10),
    ("reopen", 30),
    ("otrunc", 3),
    ("append", 20),
    ("direct_write", 20),
    ("direct_read", 20),
    ("copy_range", 20),
    ("sendfile", 10),
    ("splice", 10),
    ("mmap_store", 20),
    ("fork_log", 4),
    ("exec_write", 8),
    ("scm_rights", 8),
    ("kill_writer", 4),
    ("dup", 10),
    ("stripe_write", 40),
    ("stripe_read", 30),
    ("contested_write", 30),
    ("contested_read", 30),
    ("mapped_write", 20),
    ("mapped_read", 20),
    ("dup_held", 6),
    ("close_foreign", 4),
    ("setfl_flip", 8),
    ("clone_child", 4),
    ("chattr", 3),
    ("fd_reuse", 4),
    ("truncate_race", 4),
    ("prealloc_write", 20),
    ("hole_write", 20),
];

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    ReadWrite,
    Direct,
    Append,
    ReadOnly,
}

impl Kind {
    fn flags(self) -> i32 {
        match self {
            Kind::ReadWrite => libc::O_RDWR,
            Kind::Direct => libc::O_RDWR | libc::O_DIRECT,
            Kind::Append => libc::O_RDWR | libc::O_APPEND,
            Kind::ReadOnly => libc::O_RDONLY,
        }
    }
}

struct Desc {
    fd: i32,
    kind: Kind,
}

struct Private {
    path: PathBuf,
    id: u16,
    model: Vec<u8>,
    /// `fds[0]` is always a read-write descriptor.
    fds: Vec<Desc>,
}

impl Private {
    fn rw(&self) -> i32 {
        self.fds[0].fd
    }

    fn find(&self, kind: Kind) -> Option<i32> {
        self.fds.iter().find(|d| d.kind == kind).map(|d| d.fd)
    }

    fn model_write(&mut self, off: u64, data: &[u8]) {
        if data.is_empty() {
            return; // a write of nothing extends nothing
        }
        let end = off as usize + data.len();
        if end > self.model.len() {
            self.model.resize(end, 0);
        }
        self.model[off as usize..end].copy_from_slice(data);
    }

    fn expect(&self, off: u64, len: u64) -> &[u8] {
        let size = self.model.len() as u64;
        if off >= size {
            return &[];
        }
        &self.model[off as usize..(off + len).min(size) as usize]
    }
}

pub struct Config {
    pub dir: PathBuf,
    pub results: PathBuf,
    pub worker: u32,
    pub workers: u32,
    pub seed: u64,
    pub ops: u64,
    pub skip: BTreeSet<String>,
    /// This worker runs through the shim (decides mmap's role on the
    /// mapped file and what exec children inherit).
    pub shim: bool,
}

pub struct Worker {
    cfg: Config,
    rng: Rng,
    files: Vec<Private>,
    shared_fd: i32,
    stripe: BTreeMap<u64, u32>,
    contested_mine: BTreeSet<u64>,
    mapped_fd: i32,
    mapping: Option<*mut u8>,
    mapped_model: BTreeMap<u64, u32>,
    log: std::io::BufWriter<std::fs::File>,
    op: u64,
    failures: u64,
    /// Calls and wall time per kind of operation (written to `w{N}.time`:
    /// where a run's time goes, never compared between runs).
    time: BTreeMap<&'static str, (u64, std::time::Duration)>,
}

/// What went wrong in a check: the worker stops at the first.
pub struct Failure(pub String);

type Step = Result<(), Failure>;

impl Worker {
    pub fn new(cfg: Config) -> Worker {
        let log = std::fs::File::create(cfg.results.join(format!("w{}.log", cfg.worker)))
            .expect("worker log");
        let rng = Rng::new(cfg.seed ^ ((cfg.worker as u64 + 1) << 40));
        let mut files = Vec::new();
        for k in 0..2 {
            let path = cfg.dir.join(private_name(cfg.worker, k));
            let fd = sys::open(&path, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC)
                .expect("creating a private file") as i32;
            files.push(Private {
                path,
                id: private_id(cfg.worker, k),
                model: Vec::new(),
                fds: vec![Desc {
                    fd,
                    kind: Kind::ReadWrite,
                }],
            });
        }
        let shared_fd =
            sys::open(&cfg.dir.join("shared"), libc::O_RDWR).expect("shared file") as i32;
        let mapped_fd =
            sys::open(&cfg.dir.join("mapped"), libc::O_RDWR).expect("mapped file") as i32;
        Worker {
            rng,
            files,
            shared_fd,
            stripe: BTreeMap::new(),
            contested_mine: BTreeSet::new(),
            mapped_fd,
            mapping: None,
            mapped_model: BTreeMap::new(),
            log: std::io::BufWriter::new(log),
            op: 0,
            failures: 0,
            time: BTreeMap::new(),
            cfg,
        }
    }

    fn say(&mut self, line: std::fmt::Arguments) {
        let _ = writeln!(self.log, "{} {}", self.op, line);
    }

    fn fail(&mut self, what: String) -> Step {
        self.failures += 1;
        let _ = writeln!(self.log, "{} FAIL {}", self.op, what);
        let _ = self.log.flush();
        Err(Failure(what))
    }

    /// Run the schedule; the first failed check ends it.
    pub fn run(&mut self) -> Result<(), Failure> {
        if !self.cfg.shim {
            // Plain workers keep the mapped file mapped throughout.
            // SAFETY: a shared mapping of a file of MAPPED_BYTES bytes.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    MAPPED_BYTES as usize,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    self.mapped_fd,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                self.mapping = Some(p.cast());
            }
        }
        let total: u64 = OPS.iter().map(|o| o.1).sum();
        while self.op < self.cfg.ops {
            let mut pick = self.rng.below(total);
            let name = OPS
                .iter()
                .find(|(_, w)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .map(|o| o.0)
                .expect("weights");
            let k = self.rng.below(2) as usize;
            // The random draws of a skipped operation are still made, so
            // the rest of the schedule stays the same when shrinking.
            let seed = self.rng.next();
            if !self.cfg.skip.contains(name) {
                let mut r = Rng::new(seed);
                let t = std::time::Instant::now();
                let res = self.step(name, k, &mut r);
                let e = self.time.entry(name).or_default();
                e.0 += 1;
                e.1 += t.elapsed();
                res?;
            }
            self.op += 1;
        }
        self.finish()
    }

    fn step(&mut self, name: &str, k: usize, r: &mut Rng) -> Step {
        match name {
            "pwrite" | "pwritev" | "write" | "writev" => self.write_op(name, k, r),
            "pread" | "preadv" | "read" => self.read_op(name, k, r),
            "ftruncate" | "truncate" => {
                let len = r.below(MAX_FILE);
                let f = &self.files[k];
                let res = if name == "ftruncate" {
                    // SAFETY: plain syscall.
                    sys::check(unsafe { libc::ftruncate64(f.rw(), len as i64) } as i64)
                } else {
                    let c = sys::cpath(&f.path);
                    // SAFETY: a valid C string.
                    sys::check(unsafe { libc::truncate64(c.as_ptr(), len as i64) } as i64)
                };
                if res.is_ok() {
                    self.files[k].model.resize(len as usize, 0);
                }
                self.say(format_args!("{name} {k} {len} {}", show(res)));
                Ok(())
            }
            "fallocate" => self.fallocate(k, r),
            "prealloc_write" => self.prealloc_write(k, r),
            "hole_write" => self.hole_write(k, r),
            "fsync" | "fdatasync" | "sync_range" => {
                let fd = self.files[k].rw();
                // SAFETY: plain syscalls.
                let res = sys::check(unsafe {
                    match name {
                        "fsync" => libc::fsync(fd),
                        "fdatasync" => libc::fdatasync(fd),
                        _ => libc::sync_file_range(
                            fd,
                            0,
                            0,
                            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                                | libc::SYNC_FILE_RANGE_WRITE
                                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                        ),
                    }
                } as i64);
                self.say(format_args!("{name} {k} {}", show(res)));
                Ok(())
            }
            "reopen" => self.reopen(k, r),
            "otrunc" => {
                let f = &mut self.files[k];
                let res = sys::open(&f.path, libc::O_RDWR | libc::O_TRUNC);
                if let Ok(fd) = res {
                    sys::close(f.fds[0].fd);
                    f.fds[0].fd = fd as i32;
                    f.model.clear();
                }
                self.say(format_args!("otrunc {k} {}", res.is_ok()));
                Ok(())
            }
            "append" => {
                let fd = self.desc(k, Kind::Append);
                let len = r.length(64 << 10);
                let f = &self.files[k];
                let at = f.model.len() as u64;
                let data = stamped(len, f.id, at, self.op as u32);
                let res = sys::write(fd, &data);
                if let Ok(n) = res {
                    self.files[k].model_write(at, &data[..n as usize]);
                }
                self.say(format_args!("append {k} {len} {}", show(res)));
                Ok(())
            }
            "direct_write" | "direct_read" => self.direct(name, k, r),
            "copy_range" | "sendfile" | "splice" => self.copy(name, k, r),
            "mmap_store" => self.mmap_store(k, r),
            "fork_log" => self.fork_log(r),
            "exec_write" => self.exec_write(k, r),
            "scm_rights" => self.scm_rights(k, r),
            "kill_writer" => self.kill_writer(r),
            "dup" => {
                let f = &mut self.files[k];
                let old = f.fds[0].fd;
                // SAFETY: plain syscalls on our descriptor.
                let new = unsafe {
                    match r.below(3) {
                        0 => libc::dup(old),
                        1 => libc::fcntl(old, libc::F_DUPFD, 100),
                        _ => libc::dup2(old, 200 + (self.cfg.worker as i32 * 4) + k as i32),
                    }
                };
                if new >= 0 && new != old {
                    sys::close(old);
                    f.fds[0].fd = new;
                }
                self.say(format_args!("dup {k} {}", new >= 0));
                Ok(())
            }
            "dup_held" => {
                let f = &mut self.files[k];
                let old = f.fds[0].fd;
                // The numbers the shim's own descriptors start at.
                let target = 512 + (self.cfg.worker as i32 * 2) + k as i32 + r.below(4) as i32 * 8;
                // SAFETY: plain syscalls on our descriptor.
                let new = unsafe { libc::dup2(old, target) };
                if new == target && new != old {
                    sys::close(old);
                    f.fds[0].fd = new;
                }
                self.say(format_args!("dup_held {k} {}", new == target));
                Ok(())
            }
            "close_foreign" => self.close_foreign(r),
            "setfl_flip" => self.setfl_flip(k, r),
            "clone_child" => self.clone_child(k, r),
            "chattr" => self.chattr(k, r),
            "fd_reuse" => self.fd_reuse(r),
            "truncate_race" => self.truncate_race(r),
            "stripe_write" => self.stripe_write(r),
            "stripe_read" => self.stripe_read(r),
            "contested_write" => self.contested_write(r),
            "contested_read" => self.contested_read(r),
            "mapped_write" => self.mapped_write(r),
            "mapped_read" => self.mapped_read(r),
            other => unreachable!("operation {other}"),
        }
    }

    /// Every descriptor this worker holds.
    fn own_fds(&self) -> Vec<i32> {
        let mut v: Vec<i32> = self
            .files
            .iter()
            .flat_map(|f| f.fds.iter().map(|d| d.fd))
            .collect();
        v.extend([
            self.shared_fd,
            self.mapped_fd,
            std::os::fd::AsRawFd::as_raw_fd(self.log.get_ref()),
        ]);
        v
    }

    /// Close every number above the worker's own (a close loop, then
    /// close_range to the end): as without the shim, none of them is open.
    fn close_foreign(&mut self, r: &mut Rng) -> Step {
        let top = self.own_fds().into_iter().max().unwrap_or(2);
        let span = 64 + r.below(600) as i32;
        let mut closed = 0;
        for n in top + 1..top + 1 + span {
            // SAFETY: numbers this worker does not use.
            if unsafe { libc::close(n) } == 0 {
                closed += 1;
            }
        }
        extern "C" {
            fn close_range(first: u32, last: u32, flags: i32) -> i32;
        }
        // SAFETY: the C library's close_range over numbers this worker does not use.
        let ranged = unsafe { close_range((top + 1 + span) as u32, u32::MAX, 0) };
        self.say(format_args!("close_foreign {closed} {ranged}"));
        Ok(())
    }

    /// O_APPEND set by F_SETFL on the read-write descriptor: a pwrite then
    /// appends (Linux); cleared again after.
    fn setfl_flip(&mut self, k: usize, r: &mut Rng) -> Step {
        let fd = self.files[k].rw();
        let len = r.length(32 << 10);
        let at = self.files[k].model.len() as u64;
        let data = stamped(len, self.files[k].id, at, self.op as u32);
        // SAFETY: plain syscalls on our descriptor.
        let set = unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND) };
        let res = sys::pwrite(fd, &data, r.below(MAX_FILE));
        // SAFETY: as above.
        let clear = unsafe { libc::fcntl(fd, libc::F_SETFL, 0) };
        if let Ok(n) = res {
            self.files[k].model_write(at, &data[..n as usize]);
        }
        self.say(format_args!("setfl_flip {k} {set} {clear} {}", show(res)));
        Ok(())
    }

    /// A child made by a raw clone system call (no fork handlers) pwrites
    /// the file and reads it back.
    fn clone_child(&mut self, k: usize, r: &mut Rng) -> Step {
        let fd = self.files[k].rw();
        let size = self.files[k].model.len() as u64;
        let off = Self::offset(r, size).min(MAX_FILE - 1);
        let len = r.length(64 << 10).min(MAX_FILE - off);
        let data = stamped(len, self.files[k].id, off, self.op as u32);
        let _ = self.log.flush();
        // SAFETY: the child makes system calls only, then exits.
        let pid =
            unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) }
                as i32;
        if pid == 0 {
            let mut back = vec![0u8; len as usize];
            let code = if sys::pwrite(fd, &data, off) != Ok(len as i64) {
                2
            } else if sys::pread(fd, &mut back, off) != Ok(len as i64) || back != data {
                3
            } else {
                0
            };
            // SAFETY: leaving the child without the C library's exit.
            unsafe { libc::syscall(libc::SYS_exit_group, code as libc::c_long) };
        }
        if pid < 0 {
            self.say(format_args!("clone_child {k} failed"));
            return Ok(());
        }
        let t0 = std::time::Instant::now();
        let status = loop {
            let mut st = 0;
            // SAFETY: our child.
            if unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG) } == pid {
                break Some(st);
            }
            if t0.elapsed() > std::time::Duration::from_secs(60) {
                // SAFETY: our child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        };
        let Some(st) = status else {
            return self.fail(format!(
                "clone_child {k}: the child hung (killed after 60 s)"
            ));
        };
        let code = libc::WEXITSTATUS(st);
        if code == 0 {
            self.files[k].model_write(off, &data);
        }
        self.say(format_args!("clone_child {k} {off} {len} exit {code}"));
        if code == 3 {
            return self.fail(format!("clone_child {k}: the child read back other bytes"));
        }
        Ok(())
    }

    /// Another write while the file is immutable (chattr +i), then the flag
    /// cleared: the write answers as the kernel's (EPERM on ext4).
    fn chattr(&mut self, k: usize, r: &mut Rng) -> Step {
        const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
        const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
        const FS_IMMUTABLE_FL: i32 = 0x10;
        let size = self.files[k].model.len() as u64;
        let off = r.below(size.max(1));
        let len = r.length(16 << 10).min(MAX_FILE - off);
        let data = stamped(len, self.files[k].id, off, self.op as u32);
        let Ok(fd) = sys::open(&self.files[k].path, libc::O_RDONLY | libc::O_NONBLOCK) else {
            self.say(format_args!("chattr {k} no open"));
            return Ok(());
        };
        let fd = fd as i32;
        let mut flags: i32 = 0;
        // SAFETY: FS_IOC_GETFLAGS/SETFLAGS with an int.
        let set = unsafe {
            libc::ioctl(fd, FS_IOC_GETFLAGS, &mut flags);
            let on = flags | FS_IMMUTABLE_FL;
            libc::ioctl(fd, FS_IOC_SETFLAGS, &on)
        };
        let res = sys::pwrite(self.files[k].rw(), &data, off);
        // SAFETY: as above.
        let clear = unsafe {
            let off_flags = flags & !FS_IMMUTABLE_FL;
            libc::ioctl(fd, FS_IOC_SETFLAGS, &off_flags)
        };
        sys::close(fd);
        if let Ok(n) = res {
            self.files[k].model_write(off, &data[..n as usize]);
        }
        self.say(format_args!("chattr {k} {set} {clear} {}", show(res)));
        Ok(())
    }

    /// A descriptor of private file `k` of this kind (opened if missing).
    fn desc(&mut self, k: usize, kind: Kind) -> i32 {
        if let Some(fd) = self.files[k].find(kind) {
            return fd;
        }
        let f = &mut self.files[k];
        match sys::open(&f.path, kind.flags()) {
            Ok(fd) => {
                f.fds.push(Desc {
                    fd: fd as i32,
                    kind,
                });
                fd as i32
            }
            Err(_) => f.rw(),
        }
    }

    /// An offset for an access to a file of `size` bytes: anywhere up to
    /// the largest size, or near its end (growth, tails).
    fn offset(r: &mut Rng, size: u64) -> u64 {
        match r.below(4) {
            0 => size.saturating_sub(r.below(8192)),
            1 => size + r.below(8192),
            _ => r.below(MAX_FILE),
        }
    }

    fn write_op(&mut self, name: &str, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        let off = Self::offset(r, size).min(MAX_FILE - 1);
        let len = r.length(MAX_IO).min(MAX_FILE - off);
        let f = &self.files[k];
        let data = stamped(len, f.id, off, self.op as u32);
        let fd = f.rw();
        let res = match name {
            "pwrite" => sys::pwrite(fd, &data, off),
            "pwritev" | "writev" => {
                let cut1 = r.below(len + 1) as usize;
                let cut2 = cut1 + r.below(len + 1 - cut1 as u64) as usize;
                let iov = sys::iovecs(&[&data[..cut1], &data[cut1..cut2], &data[cut2..]]);
                if name == "pwritev" {
                    // SAFETY: iovecs over `data`.
                    sys::check(unsafe { libc::pwritev64(fd, iov.as_ptr(), 3, off as i64) } as i64)
                } else {
                    sys::seek(fd, off as i64, libc::SEEK_SET)
                        // SAFETY: iovecs over `data`.
                        .and_then(|_| {
                            sys::check(unsafe { libc::writev(fd, iov.as_ptr(), 3) } as i64)
                        })
                }
            }
            _ => sys::seek(fd, off as i64, libc::SEEK_SET).and_then(|_| sys::write(fd, &data)),
        };
        if let Ok(n) = res {
            self.files[k].model_write(off, &data[..n as usize]);
            if name == "write" || name == "writev" {
                // The position moved past what was written.
                let pos = sys::seek(fd, 0, libc::SEEK_CUR);
                if pos != Ok((off + n as u64) as i64) {
                    return self.fail(format!(
                        "{name} of {n} bytes at {off} left the position at {}",
                        show(pos)
                    ));
                }
            }
        }
        self.say(format_args!("{name} {k} {off} {len} {}", show(res)));
        Ok(())
    }

    fn read_op(&mut self, name: &str, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        let off = Self::offset(r, size);
        let len = r.length(MAX_IO);
        let fd = match r.below(3) {
            0 => self.desc(k, Kind::ReadOnly),
            _ => self.files[k].rw(),
        };
        let mut buf = vec![0u8; len as usize];
        let res = match name {
            "pread" => sys::pread(fd, &mut buf, off),
            "preadv" => {
                let cut = r.below(len + 1) as usize;
                let (a, b) = buf.split_at_mut(cut);
                let iov = sys::iovecs(&[a, b]);
                // SAFETY: iovecs over `buf`, which outlives the call.
                sys::check(unsafe { libc::preadv64(fd, iov.as_ptr(), 2, off as i64) } as i64)
            }
            _ => sys::seek(fd, off as i64, libc::SEEK_SET).and_then(|_| sys::read(fd, &mut buf)),
        };
        self.say(format_args!("{name} {k} {off} {len} {}", show(res)));
        let got = match res {
            Ok(n) => &buf[..n as usize],
            Err(e) => return self.fail(format!("{name} of file {k} at {off}: errno {e}")),
        };
        self.compare(k, off, got, name)
    }

    /// An in-run check: `got`, read at `off`, against the model.
    fn compare(&mut self, k: usize, off: u64, got: &[u8], what: &str) -> Step {
        let want = self.files[k].expect(off, got.len() as u64);
        if want.len() != got.len() {
            return self.fail(format!(
                "{what} of {} at {off}: {} bytes, the model has {} (size {})",
                self.files[k].path.display(),
                got.len(),
                want.len(),
                self.files[k].model.len()
            ));
        }
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let bad = (i..got.len()).take_while(|&j| got[j] != want[j]).count();
            let zeros = got[i..i + bad].iter().all(|&b| b == 0);
            let at = off + i as u64;
            let unit_at = at / UNIT * UNIT;
            let whose = got
                .get((unit_at - off) as usize..(unit_at - off + UNIT) as usize)
                .and_then(pattern::parse);
            return self.fail(format!(
                "{what} of {} at {off}+{}: {bad} bytes differ from the model from byte {at}{} \
                 (found unit {whose:?}, the model's {:?})",
                self.files[k].path.display(),
                got.len(),
                if zeros { ", all zeros" } else { "" },
                self.files[k]
                    .model
                    .get(unit_at as usize..(unit_at + UNIT) as usize)
                    .and_then(pattern::parse)
            ));
        }
        Ok(())
    }

    fn fallocate(&mut self, k: usize, r: &mut Rng) -> Step {
        const MODES: [i32; 7] = [
            0,
            libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_ZERO_RANGE,
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            libc::FALLOC_FL_COLLAPSE_RANGE,
            libc::FALLOC_FL_INSERT_RANGE,
        ];
        let mode = MODES[r.below(MODES.len() as u64) as usize];
        let size = self.files[k].model.len() as u64;
        let aligned = r.chance(80);
        let (mut off, mut len) = (Self::offset(r, size), r.length(MAX_IO));
        if aligned {
            off = off / 4096 * 4096;
            len = len.div_ceil(4096) * 4096;
        }
        let grows =
            mode & libc::FALLOC_FL_KEEP_SIZE == 0 && mode & (libc::FALLOC_FL_COLLAPSE_RANGE) == 0;
        if (grows && off + len > MAX_FILE)
            || (mode == libc::FALLOC_FL_INSERT_RANGE && size + len > MAX_FILE)
        {
            self.say(format_args!("fallocate {k} skipped"));
            return Ok(());
        }
        let fd = self.files[k].rw();
        // SAFETY: plain syscall.
        let res = sys::check(unsafe { libc::fallocate64(fd, mode, off as i64, len as i64) } as i64);
        if res.is_ok() {
            let m = &mut self.files[k].model;
            let end = (off + len) as usize;
            let (o, s) = (off as usize, m.len());
            match mode {
                0 | libc::FALLOC_FL_ZERO_RANGE if end > s => m.resize(end, 0),
                _ => {}
            }
            match mode {
                x if x & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0 => {
                    let e = end.min(m.len());
                    if o < e {
                        m[o..e].fill(0);
                    }
                }
                libc::FALLOC_FL_COLLAPSE_RANGE => {
                    m.drain(o..end);
                }
                libc::FALLOC_FL_INSERT_RANGE => {
                    m.splice(o..o, std::iter::repeat_n(0u8, len as usize));
                }
                _ => {}
            }
        }
        self.say(format_args!(
            "fallocate {k} {mode} {off} {len} {}",
            show(res)
        ));
        Ok(())
    }

    fn reopen(&mut self, k: usize, r: &mut Rng) -> Step {
        let f = &mut self.files[k];
        let i = r.below(f.fds.len() as u64) as usize;
        let kind = if i == 0 {
            Kind::ReadWrite
        } else {
            [Kind::Direct, Kind::Append, Kind::ReadOnly][r.below(3) as usize]
        };
        sys::close(f.fds[i].fd);
        let res = sys::open(&f.path, kind.flags());
        match res {
            Ok(fd) => {
                f.fds[i] = Desc {
                    fd: fd as i32,
                    kind,
                }
            }
            Err(e) if i == 0 => {
                let what = format!("reopening {}: errno {e}", f.path.display());
                return self.fail(what);
            }
            Err(_) => {
                f.fds.remove(i);
            }
        }
        self.say(format_args!("reopen {k} {i} {kind:?} {}", res.is_ok()));
        Ok(())
    }

    fn direct(&mut self, name: &str, k: usize, r: &mut Rng) -> Step {
        let fd = self.desc(k, Kind::Direct);
        let size = self.files[k].model.len() as u64;
        let aligned = r.chance(85);
        let mut off = Self::offset(r, size).min(MAX_FILE - 4096) / 4096 * 4096;
        let pages = 1 + r.below(32);
        let mut len = (pages * 4096).min(MAX_FILE - off);
        if !aligned {
            off += 1 + r.below(511);
            len = len.saturating_sub(512).max(1);
        }
        let mut buf = Aligned::new(len as usize);
        if name == "direct_write" {
            let id = self.files[k].id;
            pattern::fill(buf.bytes(), id, off, self.op as u32);
            let res = sys::pwrite(fd, buf.bytes(), off);
            if let Ok(n) = res {
                let data = buf.bytes()[..n as usize].to_vec();
                self.files[k].model_write(off, &data);
            }
            self.say(format_args!("{name} {k} {off} {len} {}", show(res)));
            Ok(())
        } else {
            let res = sys::pread(fd, buf.bytes(), off);
            self.say(format_args!("{name} {k} {off} {len} {}", show(res)));
            match res {
                Ok(n) => {
                    let got = buf.bytes()[..n as usize].to_vec();
                    self.compare(k, off, &got, name)
                }
                Err(_) => Ok(()), // EINVAL for unaligned: compared through the log
            }
        }
    }

    fn copy(&mut self, name: &str, k: usize, r: &mut Rng) -> Step {
        let src = 1 - k;
        let src_size = self.files[src].model.len() as u64;
        let src_off = r.below(src_size + 1);
        let dst_size = self.files[k].model.len() as u64;
        let dst_off = Self::offset(r, dst_size).min(MAX_FILE - 1);
        let len = r
            .length(if name == "splice" { 64 << 10 } else { MAX_IO })
            .min(MAX_FILE - dst_off);
        let (sfd, dfd) = (self.files[src].rw(), self.files[k].rw());
        let res = match name {
            "copy_range" => {
                let (mut so, mut d) = (src_off as i64, dst_off as i64);
                // SAFETY: plain syscall with offsets we own.
                sys::check(unsafe {
                    libc::copy_file_range(sfd, &mut so, dfd, &mut d, len as usize, 0)
                } as i64)
            }
            "sendfile" => {
                let mut so = src_off as i64;
                sys::seek(dfd, dst_off as i64, libc::SEEK_SET).and_then(|_| {
                    // SAFETY: plain syscall with an offset we own.
                    sys::check(unsafe { libc::sendfile64(dfd, sfd, &mut so, len as usize) } as i64)
                })
            }
            _ => splice_copy(sfd, src_off, dfd, dst_off, len),
        };
        if let Ok(n) = res {
            let data = self.files[src].expect(src_off, n as u64).to_vec();
            if data.len() as i64 != n {
                return self.fail(format!(
                    "{name} copied {n} bytes from a {src_size}-byte file at {src_off}"
                ));
            }
            self.files[k].model_write(dst_off, &data);
        }
        self.say(format_args!(
            "{name} {k} {src_off} {dst_off} {len} {}",
            show(res)
        ));
        Ok(())
    }

    fn mmap_store(&mut self, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        if size == 0 {
            self.say(format_args!("mmap_store {k} empty"));
            return Ok(());
        }
        let off = r.below(size);
        let len = r.length(256 << 10).min(size - off);
        let page = off / 4096 * 4096;
        let map_len = (off + len - page) as usize;
        let fd = self.files[k].rw();
        let data = stamped(len, self.files[k].id, off, self.op as u32);
        // SAFETY: a shared mapping of bytes inside the file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                page as i64,
            )
        };
        if p == libc::MAP_FAILED {
            return self.fail(format!("mmap of file {k}: errno {}", sys::errno()));
        }
        // SAFETY: [off - page, + len) lies inside the mapping and the file.
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                p.cast::<u8>().add((off - page) as usize),
                len as usize,
            );
            libc::msync(p, map_len, libc::MS_SYNC);
            libc::munmap(p, map_len);
        }
        self.files[k].model_write(off, &data);
        self.say(format_args!("mmap_store {k} {off} {len}"));
        Ok(())
    }

    /// Parent and child write records through one descriptor (one file
    /// position): every record must be in the file once.
    fn fork_log(&mut self, r: &mut Rng) -> Step {
        let path = self.cfg.dir.join(format!("w{}.log", self.cfg.worker));
        let id = log_id(self.cfg.worker);
        let records = 50 + r.below(400);
        let Ok(fd) = sys::open(&path, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) else {
            return self.fail(format!(
                "creating {}: errno {}",
                path.display(),
                sys::errno()
            ));
        };
        let fd = fd as i32;
        let total = records * 2 * 64;
        let _ = sys::pwrite(fd, &vec![0u8; total as usize], 0);
        // SAFETY: plain syscalls.
        unsafe { libc::fsync(fd) };
        let _ = sys::seek(fd, 0, libc::SEEK_SET);
        let record = |role: u64, i: u64| stamped(64, id, (role << 20 | i) * 64, 7);
        // SAFETY: the child only makes system calls, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            for i in 0..records {
                let _ = sys::write(fd, &record(1, i));
            }
            // SAFETY: leaving the child without running the parent's exit handlers.
            unsafe { libc::_exit(0) };
        }
        for i in 0..records {
            let _ = sys::write(fd, &record(0, i));
        }
        let status = wait(pid);
        let pos = sys::seek(fd, 0, libc::SEEK_CUR);
        let mut buf = vec![0u8; total as usize];
        let got = sys::pread_full(fd, &mut buf, 0);
        sys::close(fd);
        let mut seen = BTreeSet::new();
        let mut bad = 0;
        for rec in buf.chunks(64) {
            match pattern::parse(rec) {
                Some((f, _, _)) if f == id => {
                    let key = u32::from_le_bytes(rec[4..8].try_into().expect("4 bytes")) as u64 / 4;
                    let (role, i) = (key >> 20, key & 0xFFFFF);
                    if rec == record(role, i).as_slice() {
                        seen.insert(key);
                    } else {
                        bad += 1;
                    }
                }
                _ => bad += 1,
            }
        }
        self.say(format_args!(
            "fork_log {records} {status} {} {}",
            show(pos),
            show(got)
        ));
        if status != 0 || seen.len() as u64 != records * 2 || bad != 0 || pos != Ok(total as i64) {
            return self.fail(format!(
                "fork_log: {} of {} records in the file, {bad} slots without a whole record, \
                 position {} (expected {total}), child status {status}",
                seen.len(),
                records * 2,
                show(pos)
            ));
        }
        Ok(())
    }

    /// Write at the position, then a child that execs writes after it
    /// through the inherited descriptor (with the shim or without).
    fn exec_write(&mut self, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        let at = r.below(size + 1).min(MAX_FILE - 8192);
        let first = r.length(4096);
        let second = r.length(4096);
        let without_shim = r.chance(50);
        let id = self.files[k].id;
        let fd = self.files[k].rw();
        let data = stamped(first, id, at, self.op as u32);
        let wrote = sys::seek(fd, at as i64, libc::SEEK_SET).and_then(|_| sys::write(fd, &data));
        if wrote != Ok(first as i64) {
            return self.fail(format!(
                "exec_write: write of {first} at {at}: {}",
                show(wrote)
            ));
        }
        self.files[k].model_write(at, &data);
        let version = (self.op as u32) ^ 0x8000_0000;
        let exe = std::env::current_exe().expect("own path");
        let mut cmd = std::process::Command::new(exe);
        cmd.args([
            "exec-write",
            &fd.to_string(),
            &second.to_string(),
            &id.to_string(),
            &version.to_string(),
        ]);
        if without_shim {
            cmd.env_remove("LD_PRELOAD");
        }
        // Command::spawn forks and execs; the descriptor is inherited (no
        // O_CLOEXEC on the workers' descriptors).
        let status = cmd.status().map(|s| s.code().unwrap_or(-1)).unwrap_or(-2);
        // SAFETY: plain syscall.
        let synced = sys::check(unsafe { libc::fsync(fd) } as i64);
        if status == 0 {
            let tail = stamped(second, id, at + first, version);
            self.files[k].model_write(at + first, &tail);
        }
        self.say(format_args!(
            "exec_write {k} {at} {first} {second} {status} {}",
            show(synced)
        ));
        if status != 0 {
            return self.fail(format!("exec_write: the child exited with {status}"));
        }
        Ok(())
    }

    /// Pass the read-write descriptor to a child over a Unix socket; it
    /// writes through it and syncs.
    fn scm_rights(&mut self, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        let at = r.below(size + 1).min(MAX_FILE - 65536);
        let len = r.length(65536);
        let id = self.files[k].id;
        let data = stamped(len, id, at, self.op as u32);
        let mut pair = [0i32; 2];
        // SAFETY: plain syscall into a two-element array.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, pair.as_mut_ptr()) } != 0
        {
            return self.fail(format!("socketpair: errno {}", sys::errno()));
        }
        // SAFETY: the child only makes system calls, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = match recv_fd(pair[1]) {
                Some(got) => {
                    let ok = sys::pwrite(got, &data, at) == Ok(len as i64)
                        // SAFETY: plain syscall.
                        && unsafe { libc::fsync(got) } == 0;
                    if ok {
                        0
                    } else {
                        2
                    }
                }
                None => 3,
            };
            // SAFETY: leaving the child.
            unsafe { libc::_exit(code) };
        }
        send_fd(pair[0], self.files[k].rw());
        let status = wait(pid);
        sys::close(pair[0]);
        sys::close(pair[1]);
        if status == 0 {
            self.files[k].model_write(at, &data);
        }
        self.say(format_args!("scm_rights {k} {at} {len} {status}"));
        if status != 0 {
            return self.fail(format!("scm_rights: the child exited with {status}"));
        }
        Ok(())
    }

    /// A child writes and syncs 4 KiB blocks of a file, telling each synced
    /// one through a pipe, until it is killed with SIGKILL: every block it
    /// told must be there.
    fn kill_writer(&mut self, r: &mut Rng) -> Step {
        let path = self.cfg.dir.join(format!("w{}.kill", self.cfg.worker));
        let id = kill_id(self.cfg.worker);
        let version = self.op as u32;
        let mut pipe = [0i32; 2];
        // SAFETY: plain syscall into a two-element array.
        unsafe { libc::pipe(pipe.as_mut_ptr()) };
        // SAFETY: the child only makes system calls, then _exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            sys::close(pipe[0]);
            if let Ok(fd) = sys::open(&path, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) {
                for i in 0..512u64 {
                    let block = stamped(4096, id, i * 4096, version);
                    if sys::pwrite(fd as i32, &block, i * 4096) != Ok(4096) {
                        break;
                    }
                    // SAFETY: plain syscall.
                    if unsafe { libc::fdatasync(fd as i32) } != 0 {
                        break;
                    }
                    let _ = sys::write(pipe[1], &(i as u32).to_le_bytes());
                }
            }
            // SAFETY: leaving the child.
            unsafe {
                libc::pause();
                libc::_exit(0)
            };
        }
        sys::close(pipe[1]);
        std::thread::sleep(std::time::Duration::from_micros(500 + r.below(5000)));
        // SAFETY: killing our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        wait(pid);
        let mut told = Vec::new();
        let mut b = [0u8; 4096];
        while let Ok(n) = sys::read(pipe[0], &mut b) {
            if n <= 0 {
                break;
            }
            told.extend_from_slice(&b[..n as usize]);
        }
        sys::close(pipe[0]);
        let synced = (told.len() / 4) as u64;
        let Ok(fd) = sys::open(&path, libc::O_RDONLY) else {
            self.say(format_args!("~kill_writer nofile"));
            return if synced == 0 {
                self.say(format_args!("kill_writer ok"));
                Ok(())
            } else {
                self.fail(format!("kill_writer: {} is gone", path.display()))
            };
        };
        let mut buf = vec![0u8; (synced * 4096) as usize];
        let got = sys::pread_full(fd as i32, &mut buf, 0);
        sys::close(fd as i32);
        let want = stamped(synced * 4096, id, 0, version);
        self.say(format_args!("~kill_writer {synced} {}", show(got)));
        if got != Ok(want.len() as i64) || buf != want {
            let first = (0..buf.len()).find(|&i| buf[i] != want[i]).unwrap_or(0);
            return self.fail(format!(
                "kill_writer: {synced} blocks were synced before SIGKILL; read {} bytes, \
                 first difference at {first}",
                show(got)
            ));
        }
        self.say(format_args!("kill_writer ok"));
        Ok(())
    }

    fn stripe_write(&mut self, r: &mut Rng) -> Step {
        let j = r.below(STRIPE_BLOCKS);
        let off = stripe_offset(self.cfg.worker, j, self.cfg.workers);
        let version = (self.cfg.worker << 24) | (self.op as u32 & 0xFF_FFFF);
        let data = stamped(4096, SHARED_ID, off, version);
        let res = sys::pwrite(self.shared_fd, &data, off);
        if res == Ok(4096) {
            self.stripe.insert(j, version);
        } else {
            return self.fail(format!("stripe write at {off}: {}", show(res)));
        }
        if r.chance(60) {
            // SAFETY: plain syscall.
            unsafe { libc::fsync(self.shared_fd) };
        }
        self.say(format_args!("stripe_write {j}"));
        Ok(())
    }

    fn stripe_read(&mut self, r: &mut Rng) -> Step {
        let j = r.below(STRIPE_BLOCKS);
        let off = stripe_offset(self.cfg.worker, j, self.cfg.workers);
        let mut buf = vec![0u8; 4096];
        let res = sys::pread_full(self.shared_fd, &mut buf, off);
        let want = match self.stripe.get(&j) {
            Some(&v) => stamped(4096, SHARED_ID, off, v),
            None => vec![0u8; 4096],
        };
        self.say(format_args!("stripe_read {j}"));
        if res != Ok(4096) || buf != want {
            let first = (0..4096).find(|&i| buf[i] != want[i]).unwrap_or(0);
            return self.fail(format!(
                "stripe block {j} of the shared file (offset {off}): read {}, differs from \
                 byte {first} (found {:?}, wrote version {:?})",
                show(res),
                pattern::parse(&buf[first / 16 * 16..first / 16 * 16 + 16]),
                self.stripe.get(&j)
            ));
        }
        Ok(())
    }

    fn contested_write(&mut self, r: &mut Rng) -> Step {
        let base = contested_offset(self.cfg.workers);
        let units = CONTESTED_BYTES / UNIT;
        let n = 1 + r.below(256);
        let first = r.below(units - n);
        let off = base + first * UNIT;
        let version = (self.cfg.worker << 24) | (self.op as u32 & 0xFF_FFFF);
        let data = stamped(n * UNIT, SHARED_ID, off, version);
        let res = sys::pwrite(self.shared_fd, &data, off);
        if res != Ok(data.len() as i64) {
            return self.fail(format!("contested write at {off}: {}", show(res)));
        }
        self.contested_mine.extend(first..first + n);
        if r.chance(50) {
            // SAFETY: plain syscall.
            unsafe { libc::fsync(self.shared_fd) };
        }
        self.say(format_args!("~contested_write {off} {n}"));
        Ok(())
    }

    fn contested_read(&mut self, r: &mut Rng) -> Step {
        let base = contested_offset(self.cfg.workers);
        let units = CONTESTED_BYTES / UNIT;
        let n = 1 + r.below(1024).min(units - 1);
        let first = r.below(units - n);
        let mut buf = vec![0u8; (n * UNIT) as usize];
        let res = sys::pread_full(self.shared_fd, &mut buf, base + first * UNIT);
        self.say(format_args!("~contested_read {first} {n} {}", show(res)));
        for (i, u) in buf.chunks(UNIT as usize).enumerate() {
            let index = first + i as u64;
            let pos = base + index * UNIT;
            let ok = match pattern::parse(u) {
                Some((f, at, _)) => f == SHARED_ID && at as u64 == pos / UNIT,
                None => u.iter().all(|&b| b == 0) && !self.contested_mine.contains(&index),
            };
            if !ok {
                return self.fail(format!(
                    "contested unit at {pos} of the shared file holds {:?} ({}); this worker \
                     wrote it: {}",
                    pattern::parse(u),
                    if u.iter().all(|&b| b == 0) {
                        "zeros"
                    } else {
                        "not a unit of it"
                    },
                    self.contested_mine.contains(&index)
                ));
            }
        }
        Ok(())
    }

    /// This worker's units of the mapped file: stored through the mapping
    /// (plain workers) or written with pwrite (shim workers).
    fn mapped_write(&mut self, r: &mut Rng) -> Step {
        let units = MAPPED_BYTES / UNIT;
        let workers = self.cfg.workers;
        let start = r.below(units);
        let version = (self.cfg.worker << 24) | (self.op as u32 & 0xFF_FFFF);
        let mine: Vec<u64> = (start..units.min(start + 64))
            .filter(|&i| mapped_owner(i, workers) == self.cfg.worker)
            .collect();
        // Runs of consecutive units (a worker owns groups of 4): one store
        // or pwrite each, the same bytes as unit by unit, and a quarter of
        // the calls through the shim (each a device round trip).
        let mut at = 0;
        while at < mine.len() {
            let first = mine[at];
            let run = mine[at..]
                .iter()
                .enumerate()
                .take_while(|&(j, &i)| i == first + j as u64)
                .count();
            at += run;
            let data = stamped(run as u64 * UNIT, MAPPED_ID, first * UNIT, version);
            match self.mapping {
                // SAFETY: units first..first + run lie inside the MAPPED_BYTES mapping.
                Some(p) => unsafe {
                    std::ptr::copy_nonoverlapping(
                        data.as_ptr(),
                        p.add((first * UNIT) as usize),
                        data.len(),
                    )
                },
                None => {
                    if sys::pwrite(self.mapped_fd, &data, first * UNIT) != Ok(data.len() as i64) {
                        return self.fail(format!(
                            "pwrite of mapped units {first}..{}: errno {}",
                            first + run as u64,
                            sys::errno()
                        ));
                    }
                }
            }
            for i in first..first + run as u64 {
                self.mapped_model.insert(i, version);
            }
        }
        if r.chance(50) {
            // SAFETY: msync of our mapping / fsync of our descriptor.
            unsafe {
                match self.mapping {
                    Some(p) => libc::msync(p.cast(), MAPPED_BYTES as usize, libc::MS_SYNC),
                    None => libc::fsync(self.mapped_fd),
                }
            };
        }
        self.say(format_args!("mapped_write {start} {}", mine.len()));
        Ok(())
    }

    fn mapped_read(&mut self, _r: &mut Rng) -> Step {
        let mut buf = vec![0u8; MAPPED_BYTES as usize];
        let res = sys::pread_full(self.mapped_fd, &mut buf, 0);
        if res != Ok(MAPPED_BYTES as i64) {
            return self.fail(format!("reading the mapped file: {}", show(res)));
        }
        self.say(format_args!("mapped_read"));
        self.check_mapped(&buf)
    }

    fn check_mapped(&mut self, buf: &[u8]) -> Step {
        for (&i, &v) in &self.mapped_model {
            let got = &buf[(i * UNIT) as usize..][..UNIT as usize];
            if got != pattern::unit(MAPPED_ID, i, v) {
                let what = format!(
                    "unit {i} of the mapped file holds {:?}, this worker last wrote version {v}",
                    pattern::parse(got)
                );
                return self.fail(what);
            }
        }
        Ok(())
    }

    /// Sync everything and write the models for the final check.
    fn finish(&mut self) -> Step {
        if let Some(p) = self.mapping.take() {
            // SAFETY: our own mapping.
            unsafe {
                libc::msync(p.cast(), MAPPED_BYTES as usize, libc::MS_SYNC);
                libc::munmap(p.cast(), MAPPED_BYTES as usize);
            }
        }
        for f in &self.files {
            // SAFETY: plain syscall.
            unsafe { libc::fsync(f.rw()) };
        }
        // SAFETY: plain syscalls.
        unsafe {
            libc::fsync(self.shared_fd);
            libc::fsync(self.mapped_fd);
        }
        for (k, f) in self.files.iter().enumerate() {
            let out = self
                .cfg
                .results
                .join(format!("w{}.f{k}.model", self.cfg.worker));
            std::fs::write(out, &f.model).expect("writing a model");
        }
        let pairs = |m: &BTreeMap<u64, u32>| -> String {
            m.iter().map(|(k, v)| format!("{k} {v}\n")).collect()
        };
        let contested: String = self
            .contested_mine
            .iter()
            .map(|i| format!("{i}\n"))
            .collect();
        for (what, text) in [
            ("stripe", pairs(&self.stripe)),
            ("mapped", pairs(&self.mapped_model)),
            ("contested", contested),
        ] {
            let out = self
                .cfg
                .results
                .join(format!("w{}.{what}", self.cfg.worker));
            std::fs::write(out, text).expect("writing a model");
        }
        let time: String = self
            .time
            .iter()
            .map(|(name, (n, d))| format!("{name} {n} {}\n", d.as_micros()))
            .collect();
        let _ = std::fs::write(
            self.cfg.results.join(format!("w{}.time", self.cfg.worker)),
            time,
        );
        let _ = self.log.flush();
        Ok(())
    }
}

fn wait(pid: i32) -> i32 {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    }
}

fn splice_copy(sfd: i32, src_off: u64, dfd: i32, dst_off: u64, len: u64) -> Sys {
    let mut p = [0i32; 2];
    // SAFETY: plain syscalls on descriptors we own and offsets we own.
    unsafe {
        if libc::pipe(p.as_mut_ptr()) != 0 {
            return Err(sys::errno());
        }
        let mut so = src_off as i64;
        let n = libc::splice(sfd, &mut so, p[1], std::ptr::null_mut(), len as usize, 0);
        let res = if n < 0 {
            Err(sys::errno())
        } else {
            let mut d = dst_off as i64;
            let mut moved = 0i64;
            let mut err = None;
            while moved < n as i64 {
                let m = libc::splice(
                    p[0],
                    std::ptr::null_mut(),
                    dfd,
                    &mut d,
                    (n as i64 - moved) as usize,
                    0,
                );
                if m <= 0 {
                    err = Some(sys::errno());
                    break;
                }
                moved += m as i64;
            }
            match err {
                Some(e) if moved == 0 => Err(e),
                _ => Ok(moved),
            }
        };
        libc::close(p[0]);
        libc::close(p[1]);
        res
    }
}

/// `f` with a message of one byte and room for one descriptor
/// (SCM_RIGHTS), in buffers that live for the call.
fn with_fd_message<T>(f: impl FnOnce(&mut libc::msghdr) -> T) -> T {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // SAFETY: CMSG_SPACE is arithmetic on a constant.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) } as usize;
    let mut control = vec![0u8; space];
    // SAFETY: a zeroed msghdr is valid; its pointers are set to our buffers.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    f(&mut msg)
}

fn send_fd(sock: i32, fd: i32) {
    with_fd_message(|msg| {
        // SAFETY: the control buffer has room for one header and descriptor.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<i32>(), fd);
            libc::sendmsg(sock, msg, 0);
        }
    })
}

fn recv_fd(sock: i32) -> Option<i32> {
    with_fd_message(|msg| {
        // SAFETY: receiving into the message's own buffers.
        unsafe {
            if libc::recvmsg(sock, msg, 0) <= 0 {
                return None;
            }
            let c = libc::CMSG_FIRSTHDR(msg);
            if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
                return None;
            }
            Some(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>()))
        }
    })
}

/// `moneta-torture exec-write FD LEN FILE VERSION`: the exec'd child of
/// [`Worker::exec_write`] writes LEN stamped bytes at FD's position.
pub fn exec_write(args: &[String]) -> i32 {
    let parse = |i: usize| args.get(i).and_then(|a| a.parse::<u64>().ok());
    let (Some(fd), Some(len), Some(file), Some(version)) = (parse(0), parse(1), parse(2), parse(3))
    else {
        eprintln!("usage: moneta-torture exec-write FD LEN FILE VERSION");
        return 2;
    };
    let fd = fd as i32;
    let Ok(pos) = sys::seek(fd, 0, libc::SEEK_CUR) else {
        return 3;
    };
    let data = stamped(len, file as u16, pos as u64, version as u32);
    if sys::write(fd, &data) == Ok(len as i64) {
        0
    } else {
        4
    }
}

/// The paths of a worker's files (for the final check).
pub fn private_path(dir: &Path, worker: u32, k: u32) -> PathBuf {
    dir.join(private_name(worker, k))
}
