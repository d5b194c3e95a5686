//! Worker operations whose outcome depends on another thread's timing
//! (issue 42, cases 3 and 8; README "The gate: moneta-torture"): a
//! descriptor number closed or replaced under a thread doing IO on it, and
//! a plain-kernel truncate racing the worker's reads and writes.
//!
//! The oracle for a race is the set of outcomes the kernel allows, not one
//! outcome: each check below holds under every interleaving the kernel can
//! produce (the kernel run checks the same and must pass), and fails for
//! data in a file it was never written to, zeros where the kernel has
//! none, a write lost that finished before the race began, or an error
//! the kernel never answers.

use super::{private_id, Failure, Step, Worker};
use crate::pattern::{self, stamped, Rng, UNIT};
use crate::sys::{self, show};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Blocks of the file the racing thread writes in [`Worker::fd_reuse`].
const REUSE_BLOCKS: u64 = 64;
/// Bytes of the file a truncate races in [`Worker::truncate_race`].
const TRUNC_SPAN: u64 = 256 << 10;

/// Whether an append-mode read of [`Worker::truncate_race`] may return a
/// zero unit at `at`: only at or past `cut`, the lowest cut of a truncate
/// that overlapped the read (u64::MAX: none did), as the kernel itself may
/// (a cut inside a large folio zeroes its tail under the reader).
fn zeros_allowed(at: u64, cut: u64) -> bool {
    at >= cut
}

/// A file of `len` stamped bytes (file `id`, version 1), written plainly
/// and synced, so the shim serves it (it is not empty when reopened).
fn seed_file(p: &Path, id: u16, len: u64) -> Result<(), Failure> {
    let fd = sys::open(p, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC)
        .map_err(|e| Failure(format!("creating {}: errno {e}", p.display())))? as i32;
    let ok = sys::pwrite(fd, &stamped(len, id, 0, 1), 0) == Ok(len as i64)
        // SAFETY: plain syscall.
        && unsafe { libc::fsync(fd) } == 0;
    sys::close(fd);
    if ok {
        Ok(())
    } else {
        Err(Failure(format!(
            "writing {}: errno {}",
            p.display(),
            sys::errno()
        )))
    }
}

fn whole(p: &Path) -> Result<Vec<u8>, Failure> {
    let fd = sys::open(p, libc::O_RDONLY)
        .map_err(|e| Failure(format!("opening {}: errno {e}", p.display())))? as i32;
    let size = sys::fsize(fd).unwrap_or(0) as usize;
    let mut b = vec![0u8; size];
    let got = sys::pread_full(fd, &mut b, 0);
    sys::close(fd);
    match got {
        Ok(n) if n as usize == size => Ok(b),
        other => Err(Failure(format!(
            "reading {} ({size} bytes): {}",
            p.display(),
            show(other)
        ))),
    }
}

/// What the racing writer of [`Worker::fd_reuse`] saw: per write (write
/// `i` is version `base | (i + 1)` of block `i % REUSE_BLOCKS`), its answer.
#[derive(Default)]
struct WriterLog {
    /// `None`: the whole block was written; `Some(0)`: a short write;
    /// `Some(e)`: errno `e`.
    answers: Vec<Option<i32>>,
    /// Writes `0..before` returned before the number was closed or
    /// replaced: each reached A.
    before: usize,
}

impl WriterLog {
    fn count(&self, answer: Option<i32>) -> usize {
        self.answers.iter().filter(|&&a| a == answer).count()
    }
}

/// What a 4 KiB block of A or C holds after [`Worker::fd_reuse`]: what it
/// held before the operation, or the block of racing write `i`.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Held {
    Before,
    Write(usize),
}

/// Classify each block of `now` against what it held `before` and the
/// racing writes (`None`: neither, which no schedule explains).
fn classify(now: &[u8], before: &[u8], writes: &[Vec<u8>]) -> Vec<Option<Held>> {
    (0..REUSE_BLOCKS as usize)
        .map(|b| {
            let got = now.get(b * 4096..(b + 1) * 4096)?;
            if before.get(b * 4096..(b + 1) * 4096) == Some(got) {
                return Some(Held::Before);
            }
            (b..writes.len())
                .step_by(REUSE_BLOCKS as usize)
                .find(|&i| writes[i] == got)
                .map(Held::Write)
        })
        .collect()
}

/// What block `b` holds when the writes of `range` (in order) reached it.
fn last_write(b: usize, range: std::ops::Range<usize>) -> Held {
    range
        .rev()
        .find(|i| i % REUSE_BLOCKS as usize == b)
        .map_or(Held::Before, Held::Write)
}

impl Worker {
    fn scratch(&self, what: &str) -> PathBuf {
        self.cfg.dir.join(format!("w{}.{what}", self.cfg.worker))
    }

    /// Descriptor-number reuse across threads (case 3): a thread pwrites
    /// file A through number N while this thread closes N, or `dup2`s
    /// /dev/null or file C onto it, then opens file B (which gets another
    /// number: N is above every number the worker uses) and writes and
    /// reads it; a third thread keeps the control plane busy (opens, reads
    /// and closes of the private files).
    ///
    /// The oracle is exact. The writer's calls are sequential and the
    /// kernel resolves the number once per call, so there is one cut-over
    /// `k`: writes `0..k` reached A, writes `k..` reached what replaced N
    /// (nothing, /dev/null or C). `k` is at least the number of writes that
    /// returned before the close began. A close answers writes `0..k` in
    /// full and `k..` with EBADF (then `k` is known); a replacement answers
    /// every write in full. A must hold, block by block, what it held
    /// before with writes `0..k` applied; C what it held before with writes
    /// `k..` applied (after the `dup2` of C) or exactly what it held; B
    /// exactly what was written to it. Some `k` must explain A and C
    /// together.
    pub(super) fn fd_reuse(&mut self, r: &mut Rng) -> Step {
        let w = self.cfg.worker;
        let (a_id, b_id, c_id) = (
            private_id(w, 0x10),
            private_id(w, 0x11),
            private_id(w, 0x12),
        );
        let (pa, pb, pc) = (
            self.scratch("reuse-a"),
            self.scratch("reuse-b"),
            self.scratch("reuse-c"),
        );
        // Made once per worker (A keeps older versions of its own units;
        // C is made again after it was the replacement), at version 1:
        // below every version a racing write uses.
        for (p, id, len) in [
            (&pa, a_id, REUSE_BLOCKS * 4096),
            (&pb, b_id, 64 << 10),
            (&pc, c_id, REUSE_BLOCKS * 4096),
        ] {
            if !p.exists() {
                seed_file(p, id, len)?;
            }
        }
        let (a_before, c_before) = (whole(&pa)?, whole(&pc)?);
        let variant = r.below(3);
        let delay = 10 + r.below(400);
        let writes = 16 + r.below(240) as usize;
        // Above every version an earlier operation wrote (and the seed's 1).
        let base = (self.op as u32 + 1) << 8;
        let blocks: Vec<Vec<u8>> = (0..writes)
            .map(|i| {
                let off = (i as u64 % REUSE_BLOCKS) * 4096;
                stamped(4096, a_id, off, base | (i as u32 + 1))
            })
            .collect();
        // Above the numbers the worker's dup operations use (up to 325),
        // below the shim's own (512).
        let n = 430 + w as i32 * 2;
        let t = sys::open(&pa, libc::O_RDWR).map_err(|e| Failure(format!("open A: errno {e}")))?;
        // SAFETY: plain syscalls on our descriptors; N is above every
        // number this worker holds.
        let got = unsafe { libc::dup2(t as i32, n) };
        sys::close(t as i32);
        if got != n {
            return self.fail(format!("fd_reuse: dup2 onto {n}: errno {}", sys::errno()));
        }
        let null = sys::open(Path::new("/dev/null"), libc::O_RDWR)
            .map_err(|e| Failure(format!("/dev/null: errno {e}")))? as i32;
        let c =
            sys::open(&pc, libc::O_RDWR).map_err(|e| Failure(format!("open C: errno {e}")))? as i32;
        let stop = Arc::new(AtomicBool::new(false));
        let busy = {
            let stop = stop.clone();
            let paths: Vec<PathBuf> = self.files.iter().map(|f| f.path.clone()).collect();
            std::thread::spawn(move || {
                let mut i = 0usize;
                let mut b = vec![0u8; 4096];
                while !stop.load(Ordering::Acquire) {
                    if let Ok(fd) = sys::open(&paths[i % paths.len()], libc::O_RDONLY) {
                        let _ = sys::pread(fd as i32, &mut b, (i as u64 % 16) * 4096);
                        sys::close(fd as i32);
                    }
                    i += 1;
                }
            })
        };
        let closing = Arc::new(AtomicBool::new(false));
        let writer = {
            let closing = closing.clone();
            let blocks = blocks.clone();
            std::thread::spawn(move || {
                let mut log = WriterLog::default();
                for (i, data) in blocks.iter().enumerate() {
                    let off = (i as u64 % REUSE_BLOCKS) * 4096;
                    log.answers.push(match sys::pwrite(n, data, off) {
                        Ok(4096) => None,
                        Ok(_) => Some(0),
                        Err(e) => Some(e),
                    });
                    if !closing.load(Ordering::SeqCst) {
                        log.before = i + 1;
                    }
                }
                log
            })
        };
        std::thread::sleep(Duration::from_micros(delay));
        closing.store(true, Ordering::SeqCst);
        match variant {
            0 => sys::close(n),
            // SAFETY: replacing our own number.
            1 => unsafe {
                libc::dup2(null, n);
            },
            // SAFETY: as above.
            _ => unsafe {
                libc::dup2(c, n);
            },
        }
        let fb = sys::open(&pb, libc::O_RDWR);
        let new = stamped(64 << 10, b_id, 0, base | 0xFF);
        let b_res = fb.and_then(|fd| {
            let fd = fd as i32;
            let w = sys::pwrite(fd, &new, 0);
            let mut back = vec![0u8; new.len()];
            let rd = sys::pread_full(fd, &mut back, 0);
            // SAFETY: plain syscall.
            unsafe { libc::fsync(fd) };
            sys::close(fd);
            match (w, rd) {
                (Ok(x), Ok(y)) if x == y && back == new => Ok(x),
                (Ok(_), Ok(_)) => Err(-1),
                (Err(e), _) | (_, Err(e)) => Err(e),
            }
        });
        let log = writer
            .join()
            .map_err(|_| Failure("fd_reuse: the writer panicked".into()))?;
        stop.store(true, Ordering::Release);
        let _ = busy.join();
        if variant != 0 {
            sys::close(n);
        }
        sys::close(null);
        sys::close(c);
        let (ok, ebadf) = (log.count(None), log.count(Some(libc::EBADF)));
        self.say(format_args!(
            "~fd_reuse {variant} {delay} ok {ok} ebadf {ebadf} before {}",
            log.before
        ));
        // The answers: all in full after a replacement; in full, then
        // EBADF after a close.
        let answered = if variant == 0 {
            let k = log.answers.iter().take_while(|a| a.is_none()).count();
            log.answers[k..]
                .iter()
                .position(|&a| a != Some(libc::EBADF))
                .map_or(Ok(k), |j| Err(k + j))
        } else {
            log.answers
                .iter()
                .position(|a| a.is_some())
                .map_or(Ok(writes), Err)
        };
        let cut = match answered {
            Ok(k) if k >= log.before => k,
            Ok(k) => {
                return self.fail(format!(
                    "fd_reuse (variant {variant}): {k} writes through number {n} succeeded,                      but {} returned before it was closed",
                    log.before
                ))
            }
            Err(i) => {
                return self.fail(format!(
                    "fd_reuse (variant {variant}): write {i} of {writes} through the racing                      number answered {}; the kernel answers {} ({ok} in full, {ebadf} EBADF)",
                    match log.answers[i] {
                        Some(0) => "a short count".to_string(),
                        Some(e) => format!("errno {e}"),
                        None => "in full".to_string(),
                    },
                    if variant == 0 {
                        "in full until the close, then EBADF"
                    } else {
                        "in full"
                    }
                ))
            }
        };
        if let Err(e) = b_res {
            return self.fail(format!(
                "fd_reuse (variant {variant}): the newly opened file B: {}",
                if e == -1 {
                    "read back other bytes than written".to_string()
                } else {
                    format!("errno {e}")
                }
            ));
        }
        let (a, cnow) = (whole(&pa)?, whole(&pc)?);
        let (a_held, c_held) = (
            classify(&a, &a_before, &blocks),
            classify(&cnow, &c_before, &blocks),
        );
        let size = (REUSE_BLOCKS * 4096) as usize;
        // The cut-overs that explain A, then C too.
        let explains_a = |k: usize| {
            a.len() == size
                && (0..REUSE_BLOCKS as usize).all(|b| a_held[b] == Some(last_write(b, 0..k)))
        };
        let explains_c = |k: usize| {
            cnow.len() == size
                && (0..REUSE_BLOCKS as usize).all(|b| {
                    c_held[b]
                        == Some(if variant == 2 {
                            last_write(b, k..writes)
                        } else {
                            Held::Before
                        })
                })
        };
        let range = if variant == 0 {
            cut..cut + 1
        } else {
            log.before..writes + 1
        };
        let Some(k) = range.clone().find(|&k| explains_a(k) && explains_c(k)) else {
            let a_only = range.clone().find(|&k| explains_a(k));
            let (file, held, bytes) = if a_only.is_none() {
                ("A", &a_held, &a)
            } else {
                ("C", &c_held, &cnow)
            };
            let k = a_only.unwrap_or(range.start);
            let b = (0..REUSE_BLOCKS as usize)
                .find(|&b| {
                    held[b]
                        != Some(if file == "A" {
                            last_write(b, 0..k)
                        } else if variant == 2 {
                            last_write(b, k..writes)
                        } else {
                            Held::Before
                        })
                })
                .unwrap_or(0);
            return self.fail(format!(
                "fd_reuse (variant {variant}): no cut-over in {range:?} of {writes} writes                  explains {file} ({} bytes): with {k}, block {b} holds {:?}, first unit {:?}                  ({} writes returned before the close)",
                bytes.len(),
                held.get(b),
                bytes.get(b * 4096..b * 4096 + 16).and_then(pattern::parse),
                log.before
            ));
        };
        let b = whole(&pb)?;
        if b != new {
            let i = (0..b.len().min(new.len()))
                .find(|&i| b[i] != new[i])
                .unwrap_or(0);
            return self.fail(format!(
                "fd_reuse (variant {variant}): B holds other bytes than written from byte {i} \
                 (unit {:?}; {} bytes, {} written): another descriptor's data",
                b.get(i / 16 * 16..i / 16 * 16 + 16)
                    .and_then(pattern::parse),
                b.len(),
                new.len()
            ));
        }
        if variant == 2 && k < writes {
            let _ = std::fs::remove_file(&pc);
        }
        self.say(format_args!("~fd_reuse cut-over {k} of {writes}"));
        self.say(format_args!("fd_reuse {variant} ok"));
        Ok(())
    }

    /// A plain-kernel truncate racing this worker's IO (case 8): another
    /// thread opens the file with a raw system call (never seen by the
    /// shim) and shrinks it again and again, by descriptor or by path,
    /// while this thread reads it and writes it. Two modes:
    ///
    /// - append: writes are O_APPEND 4 KiB blocks and truncates shrink only
    ///   (to a multiple of 4 KiB), so the file never has a hole: every
    ///   unit a read returns is a unit of this file, never zeros — except
    ///   at or past the cut of a truncate that ran during the read: a cut
    ///   inside a large folio (XFS, and ext4 from Linux 6.16) zeroes the
    ///   folio's tail in place when it cannot be split, and a read that
    ///   sampled the size before the cut copies those zeros (`filemap_read`
    ///   checks the size once, before copying; the plain kernel run of ext4
    ///   seed 540008 returned such zeros 6,368 bytes past its offset);
    /// - overwrite: pwrites of whole units at their places: every unit read is zeros (a hole the truncate
    ///   left) or this file's unit at that place.
    ///
    /// Truncates cut at page boundaries (4 KiB) in both modes.
    ///
    /// Any length a read returns is allowed (the race decides the size).
    pub(super) fn truncate_race(&mut self, r: &mut Rng) -> Step {
        let id = private_id(self.cfg.worker, 0x13);
        let append = r.chance(50);
        // One file per mode, kept between operations (appends and shrinks
        // never make a hole); made again when a truncate left it small,
        // so the shim serves it (a file empty at open is the kernel's).
        let p = self.scratch(if append { "trunc-a" } else { "trunc-o" });
        if std::fs::metadata(&p).map_or(true, |m| m.len() < 16 << 10) {
            seed_file(&p, id, TRUNC_SPAN)?;
        }
        let rounds = 8 + r.below(40);
        let by_path = r.chance(30);
        let pause = 20 + r.below(300);
        let flags = if append {
            libc::O_RDWR | libc::O_APPEND
        } else {
            libc::O_RDWR
        };
        let fd = sys::open(&p, flags).map_err(|e| Failure(format!("open: errno {e}")))? as i32;
        let stop = Arc::new(AtomicBool::new(false));
        let truncates = Arc::new(AtomicU64::new(0));
        // The cut of the truncate in progress (u64::MAX: none), and the
        // lowest cut since the reader last reset it: together the lowest
        // cut of any truncate that overlapped a read (see `cuts_during`).
        let cutting = Arc::new(AtomicU64::new(u64::MAX));
        let lowest = Arc::new(AtomicU64::new(u64::MAX));
        let truncater = {
            let (stop, truncates, p) = (stop.clone(), truncates.clone(), p.clone());
            let (cutting, lowest) = (cutting.clone(), lowest.clone());
            let mut tr = Rng::new(r.next());
            std::thread::spawn(move || {
                let c = sys::cpath(&p);
                // SAFETY: raw system calls (past the shim) on our own file.
                let tfd = unsafe {
                    libc::syscall(
                        libc::SYS_openat,
                        libc::AT_FDCWD,
                        c.as_ptr(),
                        libc::O_RDWR,
                        0,
                    )
                } as i32;
                if tfd < 0 {
                    return;
                }
                while !stop.load(Ordering::Acquire) {
                    let size = sys::fsize(tfd).unwrap_or(0) as u64;
                    // Whole pages: no partial page is zeroed under a read
                    // (a torn unit the kernel itself could show).
                    let to = tr.below(size + 1) / 4096 * 4096;
                    cutting.store(to, Ordering::SeqCst);
                    lowest.fetch_min(to, Ordering::SeqCst);
                    // SAFETY: as above; `to` never exceeds the size seen,
                    // and the file only grows in between: it shrinks.
                    unsafe {
                        if by_path {
                            libc::syscall(libc::SYS_truncate, c.as_ptr(), to as i64);
                        } else {
                            libc::syscall(libc::SYS_ftruncate, tfd, to as i64);
                        }
                    }
                    cutting.store(u64::MAX, Ordering::SeqCst);
                    truncates.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_micros(pause));
                }
                // SAFETY: our raw descriptor.
                unsafe { libc::syscall(libc::SYS_close, tfd) };
            })
        };
        let version = (self.op as u32) << 8;
        let (mut reads, mut bytes) = (0u64, 0u64);
        let mut failure = None;
        for i in 0..rounds {
            let v = version | (i as u32 & 0xFF);
            let wrote = if append {
                sys::write(fd, &stamped(4096, id, 0, v))
            } else {
                let off = r.below(TRUNC_SPAN / UNIT) * UNIT;
                let len = (r.length(32 << 10) / UNIT * UNIT).max(UNIT);
                sys::pwrite(fd, &stamped(len, id, off, v), off)
            };
            if let Err(e) = wrote {
                failure = Some(format!("a write answered errno {e}"));
                break;
            }
            if i % 8 == 7 {
                // SAFETY: plain syscall.
                unsafe { libc::fdatasync(fd) };
            }
            let size = sys::fsize(fd).unwrap_or(0) as u64;
            let off = r.below(size.max(1)) / UNIT * UNIT;
            let mut b = vec![0u8; r.length(64 << 10).max(UNIT) as usize];
            lowest.store(u64::MAX, Ordering::SeqCst);
            lowest.fetch_min(cutting.load(Ordering::SeqCst), Ordering::SeqCst);
            let got = sys::pread(fd, &mut b, off);
            let cut = lowest.load(Ordering::SeqCst);
            let n = match got {
                Ok(n) => n as usize,
                Err(e) => {
                    failure = Some(format!("a read at {off} answered errno {e}"));
                    break;
                }
            };
            reads += 1;
            bytes += n as u64;
            let bad = b[..n / UNIT as usize * UNIT as usize]
                .chunks(UNIT as usize)
                .enumerate()
                .find(|(j, u)| {
                    let index = off / UNIT + *j as u64;
                    match pattern::parse(u) {
                        Some((f, at, _)) => f != id || (!append && at as u64 != index),
                        None => {
                            let zeros = u.iter().all(|&x| x == 0);
                            !zeros || (append && !zeros_allowed(index * UNIT, cut))
                        }
                    }
                });
            if let Some((j, u)) = bad {
                failure = Some(format!(
                    "a read at {off} of {} bytes returned {n}; unit at {} holds {:?}{}",
                    b.len(),
                    off + j as u64 * UNIT,
                    pattern::parse(u),
                    if u.iter().all(|&x| x == 0) {
                        match cut {
                            u64::MAX => " (zeros: the file never had a hole there)".to_string(),
                            c => format!(
                                " (zeros: the file never had a hole there, before the racing cut at {c})"
                            ),
                        }
                    } else {
                        String::new()
                    }
                ));
                break;
            }
        }
        stop.store(true, Ordering::Release);
        let _ = truncater.join();
        sys::close(fd);
        let mode = if append { "append" } else { "overwrite" };
        self.say(format_args!(
            "~truncate_race {mode} {reads} reads {bytes} bytes {} truncates",
            truncates.load(Ordering::Relaxed)
        ));
        if let Some(f) = failure {
            return self.fail(format!("truncate_race ({mode}, racing truncates): {f}"));
        }
        self.say(format_args!("truncate_race {mode} ok"));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::zeros_allowed;

    #[test]
    fn zeros_are_allowed_only_past_a_racing_cut() {
        // No truncate overlapped the read: never.
        assert!(!zeros_allowed(0, u64::MAX));
        assert!(!zeros_allowed(1 << 40, u64::MAX));
        // A cut at 160 KiB overlapped it: from the cut on, not before.
        assert!(!zeros_allowed((160 << 10) - 16, 160 << 10));
        assert!(zeros_allowed(160 << 10, 160 << 10));
        assert!(zeros_allowed(172_656, 163_840));
    }
}
