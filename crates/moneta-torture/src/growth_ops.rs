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
        let (from, n) = (off, len);
        for how in 0..2 {
            let rfd = if how == 0 {
                fd
            } else {
                match sys::open(&self.files[k].path, libc::O_RDONLY) {
                    Ok(x) => x as i32,
                    Err(e) => {
                        return self.fail(format!("prealloc_write open of file {k}: errno {e}"))
                    }
                }
            };
            let mut buf = vec![0u8; n as usize];
            let res = sys::pread_full(rfd, &mut buf, from);
            if how == 1 {
                sys::close(rfd);
            }
            self.say(format_args!(
                "prealloc_write {k} read{how} {from} {n} {}",
                show(res)
            ));
            let got = match res {
                Ok(g) => buf[..g as usize].to_vec(),
                Err(e) => return self.fail(format!("prealloc_write read of file {k}: errno {e}")),
            };
            self.compare(k, from, &got, "prealloc_write read")?;
        }
        Ok(())
    }
}
