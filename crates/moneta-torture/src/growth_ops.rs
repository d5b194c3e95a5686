//! The torture operation for growth grants (moneta-emu `growth`: direct
//! writes into allocated-but-unwritten extents, settled into written data
//! before any kernel access, fsync or last close).
//!
//! `prealloc_write` preallocates a range of a private file (fallocate mode
//! 0, which may extend it, or KEEP_SIZE), writes stamped data into part of
//! it, and reads it back three ways: through the writing descriptor, and
//! through a descriptor opened for the read only (a second handle through
//! the shim: it maps the pending range and must read the data, not the
//! zeros the file system still reports); sometimes it fsyncs in between.
//! Every read must equal the model; the run's final check reads the files
//! through the kernel alone (whose read has monetad settle first).

use super::{Step, Worker, MAX_FILE, MAX_IO};
use crate::pattern::{stamped, Rng};
use crate::sys::{self, show};

impl Worker {
    pub(super) fn prealloc_write(&mut self, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        let off = Self::offset(r, size) / 4096 * 4096;
        let len = r.length(MAX_IO).div_ceil(4096) * 4096;
        let keep = r.chance(30);
        if off + len > MAX_FILE {
            self.say(format_args!("prealloc_write {k} skipped"));
            return Ok(());
        }
        let mode = if keep { libc::FALLOC_FL_KEEP_SIZE } else { 0 };
        let fd = self.files[k].rw();
        // SAFETY: plain syscall.
        let res = sys::check(unsafe { libc::fallocate64(fd, mode, off as i64, len as i64) } as i64);
        self.say(format_args!(
            "prealloc_write {k} falloc {off} {len} {keep} {}",
            show(res)
        ));
        if res.is_err() {
            return Ok(());
        }
        if !keep && off + len > size {
            self.files[k].model.resize((off + len) as usize, 0);
        }
        // A write inside the preallocated range (past the end too, when
        // KEEP_SIZE left the size alone).
        let w_off = off + r.below(len) / 512 * 512;
        let w_len = r.length((off + len - w_off).min(256 << 10)).max(1);
        let data = stamped(w_len, self.files[k].id, w_off, self.op as u32);
        let res = sys::pwrite(fd, &data, w_off);
        self.say(format_args!(
            "prealloc_write {k} pwrite {w_off} {w_len} {}",
            show(res)
        ));
        match res {
            Ok(n) => self.files[k].model_write(w_off, &data[..n as usize]),
            Err(e) => return self.fail(format!("prealloc_write pwrite of file {k}: errno {e}")),
        }
        if r.chance(30) {
            // SAFETY: plain syscall.
            let res = sys::check(unsafe { libc::fdatasync(fd) } as i64);
            self.say(format_args!("prealloc_write {k} fdatasync {}", show(res)));
        }
        self.read_back(k, off, len, "prealloc_write")
    }

    /// A write into a hole (growth into holes: monetad has the file system
    /// allocate it, the data goes direct): the file gets a hole — punched
    /// inside it, or left between its end and a larger size — then stamped
    /// data is written into part of it (block-aligned or not, so the rest
    /// of a block must read as zeros), and read back as `prealloc_write`
    /// does: through the writing descriptor and a second, read-only one.
    pub(super) fn hole_write(&mut self, k: usize, r: &mut Rng) -> Step {
        let size = self.files[k].model.len() as u64;
        let punch = size >= 8192 && r.chance(50);
        let (off, len) = if punch {
            let off = r.below(size - 4096) / 4096 * 4096;
            (
                off,
                r.length(MAX_IO)
                    .div_ceil(4096)
                    .saturating_mul(4096)
                    .min(size - off),
            )
        } else {
            // Grow the file past its end: a hole from the old end on.
            let off = size.div_ceil(4096) * 4096 + r.below(4) * 4096;
            let len = r.length(MAX_IO).div_ceil(4096) * 4096 + r.below(2) * 4096;
            (off, len)
        };
        if len == 0 || off + len > MAX_FILE {
            self.say(format_args!("hole_write {k} skipped"));
            return Ok(());
        }
        let fd = self.files[k].rw();
        let res = if punch {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: plain syscall.
            sys::check(unsafe { libc::fallocate64(fd, mode, off as i64, len as i64) } as i64)
        } else {
            // SAFETY: plain syscall.
            sys::check(unsafe { libc::ftruncate64(fd, (off + len) as i64) } as i64)
        };
        self.say(format_args!(
            "hole_write {k} {} {off} {len} {}",
            if punch { "punch" } else { "grow" },
            show(res)
        ));
        if res.is_err() {
            return Ok(());
        }
        {
            let m = &mut self.files[k].model;
            if punch {
                m[off as usize..(off + len) as usize].fill(0);
            } else {
                m.resize((off + len) as usize, 0);
            }
        }
        let aligned = r.chance(50);
        let mut w_off = off + r.below(len);
        if aligned {
            w_off = w_off / 4096 * 4096;
        }
        let mut w_len = r.length((off + len - w_off).min(256 << 10)).max(1);
        if aligned {
            w_len = w_len.div_ceil(4096) * 4096;
        }
        let w_len = w_len.min(off + len - w_off);
        let data = stamped(w_len, self.files[k].id, w_off, self.op as u32);
        let res = sys::pwrite(fd, &data, w_off);
        self.say(format_args!(
            "hole_write {k} pwrite {w_off} {w_len} {}",
            show(res)
        ));
        match res {
            Ok(n) => self.files[k].model_write(w_off, &data[..n as usize]),
            Err(e) => return self.fail(format!("hole_write pwrite of file {k}: errno {e}")),
        }
        if r.chance(30) {
            // SAFETY: plain syscall.
            let res = sys::check(unsafe { libc::fdatasync(fd) } as i64);
            self.say(format_args!("hole_write {k} fdatasync {}", show(res)));
        }
        self.read_back(k, off, len, "hole_write")
    }

    /// Read `[from, from + n)` of file `k` through its read-write
    /// descriptor and through a new read-only one; both must equal the model.
    fn read_back(&mut self, k: usize, from: u64, n: u64, what: &str) -> Step {
        let fd = self.files[k].rw();
        for how in 0..2 {
            let rfd = if how == 0 {
                fd
            } else {
                match sys::open(&self.files[k].path, libc::O_RDONLY) {
                    Ok(x) => x as i32,
                    Err(e) => return self.fail(format!("{what} open of file {k}: errno {e}")),
                }
            };
            let mut buf = vec![0u8; n as usize];
            let res = sys::pread_full(rfd, &mut buf, from);
            if how == 1 {
                sys::close(rfd);
            }
            self.say(format_args!(
                "{what} {k} read{how} {from} {n} {}",
                show(res)
            ));
            let got = match res {
                Ok(g) => buf[..g as usize].to_vec(),
                Err(e) => return self.fail(format!("{what} read of file {k}: errno {e}")),
            };
            self.compare(k, from, &got, &format!("{what} read"))?;
        }
        Ok(())
    }
}
