//! The medium: the bytes the emulated array stores (DESIGN "Processes in
//! emulation"). Anonymous memory by default (lost when the device stops), or
//! a memory-mapped image file whose contents survive restarts. Both are
//! mapped with MAP_NORESERVE, so a capacity larger than RAM works as long as
//! the workload does not touch all of it at once (an image file is sparse
//! until written; the kernel pages it in and out).
//!
//! The medium is only ever touched by the device thread; copies go between it
//! and a channel's DMA buffer, whose contents an untrusted client may change
//! at any moment, so copies take raw pointers and never form references to
//! shared memory.

use crate::sys::{prefetch_line, Mapping};
use std::fmt;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug)]
pub enum MediumError {
    Io {
        path: Option<PathBuf>,
        source: io::Error,
    },
    /// An existing image whose size is not the configured capacity.
    SizeMismatch {
        path: PathBuf,
        image_bytes: u64,
        capacity_bytes: u64,
    },
    CapacityTooLarge(u64),
}

impl fmt::Display for MediumError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MediumError::Io {
                path: Some(p),
                source,
            } => write!(f, "{}: {source}", p.display()),
            MediumError::Io { path: None, source } => write!(f, "anonymous medium: {source}"),
            MediumError::SizeMismatch {
                path,
                image_bytes,
                capacity_bytes,
            } => write!(
                f,
                "{} holds {image_bytes} bytes but the device capacity is {capacity_bytes} bytes \
                 (use --set device.capacity_bytes={image_bytes}, or another image)",
                path.display()
            ),
            MediumError::CapacityTooLarge(c) => write!(f, "capacity {c} bytes cannot be mapped"),
        }
    }
}

impl std::error::Error for MediumError {}

/// Where the bytes live.
pub struct Medium {
    map: Mapping,
    image: Option<PathBuf>,
    /// (st_dev, st_ino) of the mapped image: the file a loop device must be
    /// backed by for file grants (SPEC §3.4) to name this medium's bytes.
    image_identity: Option<(u64, u64)>,
}

impl Medium {
    /// Anonymous memory of `capacity_bytes`, zero-filled, allocated on touch.
    pub fn anonymous(capacity_bytes: u64) -> Result<Medium, MediumError> {
        let len = usize::try_from(capacity_bytes)
            .map_err(|_| MediumError::CapacityTooLarge(capacity_bytes))?;
        let map = Mapping::new(None, len, true)
            .map_err(|source| MediumError::Io { path: None, source })?;
        Ok(Medium {
            map,
            image: None,
            image_identity: None,
        })
    }

    /// The image file at `path`: created (sparse, zero-filled) if missing;
    /// if it exists it must be exactly `capacity_bytes` long, so an image is
    /// never silently truncated or extended (or that plus a SAN node's
    /// replica metadata, `replica_meta::META_BYTES`, which is not mapped).
    pub fn image(path: &Path, capacity_bytes: u64) -> Result<Medium, MediumError> {
        let io_err = |source| MediumError::Io {
            path: Some(path.to_path_buf()),
            source,
        };
        let len = usize::try_from(capacity_bytes)
            .map_err(|_| MediumError::CapacityTooLarge(capacity_bytes))?;
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(io_err)?;
        let meta = file.metadata().map_err(io_err)?;
        let image_bytes = meta.len();
        if image_bytes == 0 {
            file.set_len(capacity_bytes).map_err(io_err)?;
        } else if image_bytes != capacity_bytes
            && image_bytes != capacity_bytes + crate::replica_meta::META_BYTES
        {
            return Err(MediumError::SizeMismatch {
                path: path.to_path_buf(),
                image_bytes,
                capacity_bytes,
            });
        }
        let map = Mapping::new(Some(file.as_raw_fd()), len, true).map_err(io_err)?;
        Ok(Medium {
            map,
            image: Some(path.to_path_buf()),
            image_identity: Some((meta.dev(), meta.ino())),
        })
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.map.len() as u64
    }

    pub fn image_path(&self) -> Option<&Path> {
        self.image.as_deref()
    }

    /// (device, inode) of the image file, if the medium is one.
    pub fn image_identity(&self) -> Option<(u64, u64)> {
        self.image_identity
    }

    fn check(&self, addr: u64, len: usize) -> io::Result<usize> {
        match addr.checked_add(len as u64) {
            Some(end) if end <= self.capacity_bytes() => Ok(addr as usize),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("[{addr}, +{len}) is outside the medium"),
            )),
        }
    }

    /// Copy `len` bytes at `addr` into `dst`.
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes of writes and must not overlap the
    /// medium. It may be shared memory that another process writes
    /// concurrently (the bytes then are whatever they are).
    pub unsafe fn read_into(&self, addr: u64, dst: *mut u8, len: usize) -> io::Result<()> {
        let offset = self.check(addr, len)?;
        // SAFETY: the range is inside our mapping (checked); dst is the
        // caller's promise.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(offset), dst, len) };
        Ok(())
    }

    /// Start loading the first bytes of `[addr, addr + len)` into the cache
    /// (at most 1 KiB; the hardware prefetcher follows a longer copy), so
    /// that a copy soon after does not wait for memory. A hint: an address
    /// outside the medium is ignored, and nothing is read or changed.
    #[inline]
    pub fn prefetch(&self, addr: u64, len: u64) {
        let capacity = self.capacity_bytes();
        if addr >= capacity {
            return;
        }
        let end = addr.saturating_add(len.min(1024)).min(capacity);
        let mut line = addr & !63;
        while line < end {
            prefetch_line(self.map.as_ptr().wrapping_add(line as usize));
            line += 64;
        }
    }

    /// Copy `len` bytes from `src` to `addr`.
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes of reads and must not overlap the
    /// medium; as for `read_into`, it may be concurrently written shared memory.
    pub unsafe fn write_from(&self, addr: u64, src: *const u8, len: usize) -> io::Result<()> {
        let offset = self.check(addr, len)?;
        // SAFETY: as read_into.
        unsafe { std::ptr::copy_nonoverlapping(src, self.map.as_ptr().add(offset), len) };
        Ok(())
    }

    /// Safe copies for the trusted side (tests, the control plane).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> io::Result<()> {
        // SAFETY: buf is an exclusive Rust slice of buf.len() bytes.
        unsafe { self.read_into(addr, buf.as_mut_ptr(), buf.len()) }
    }

    pub fn write(&self, addr: u64, buf: &[u8]) -> io::Result<()> {
        // SAFETY: buf is a Rust slice of buf.len() bytes.
        unsafe { self.write_from(addr, buf.as_ptr(), buf.len()) }
    }

    /// Fault in the pages of `[addr, addr + len)` now (contents unchanged),
    /// so that first touches do not add page-fault time to emulated requests.
    /// Anonymous memory there is backed by huge pages where the kernel
    /// allows (it is all resident anyway): random accesses then miss the
    /// TLB far less, a page-table walk less on the data copy of a request.
    pub fn populate(&self, addr: u64, len: u64) -> io::Result<()> {
        let len = len.min(self.capacity_bytes().saturating_sub(addr)) as usize;
        if len == 0 {
            return Ok(());
        }
        let page = 4096usize;
        let start = addr as usize / page * page;
        let end = (addr as usize + len).div_ceil(page) * page;
        let end = end.min(self.map.len());
        // Huge pages need 2 MiB-aligned addresses: the aligned part of the range.
        let huge = 2usize << 20;
        let base = self.map.as_ptr() as usize;
        let huge_start = (base + start).div_ceil(huge) * huge - base;
        // Below `base` (a small range inside the mapping's first huge page):
        // no aligned part (this wrapped before, and madvise got a bogus range).
        let huge_end = ((base + end) / huge * huge).saturating_sub(base);
        if self.image.is_none() && huge_start < huge_end {
            // SAFETY: the range is page-aligned and inside our mapping;
            // MADV_HUGEPAGE is advice about backing, never about contents.
            // Refused (no THP support) it changes nothing, so the result is ignored.
            unsafe {
                libc::madvise(
                    self.map.as_ptr().add(huge_start).cast(),
                    huge_end - huge_start,
                    libc::MADV_HUGEPAGE,
                )
            };
        }
        // SAFETY: the range is page-aligned and inside our mapping;
        // MADV_POPULATE_WRITE only faults pages in, it never changes data.
        let r = unsafe {
            libc::madvise(
                self.map.as_ptr().add(start).cast(),
                end - start,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Make an image durable (msync); nothing to do for anonymous memory.
    pub fn flush(&self) -> io::Result<()> {
        if self.image.is_some() {
            self.map.sync()
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("moneta-medium-{}-{name}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        dir
    }

    #[test]
    fn prefetch_takes_any_address_and_changes_nothing() {
        let m = Medium::anonymous(1 << 20).unwrap();
        m.populate(0, 1 << 20).unwrap();
        m.write(4096, b"kept").unwrap();
        for (addr, len) in [
            (0, 512),
            (4090, u64::MAX),
            ((1 << 20) - 1, 64),
            (1 << 20, 512),
            (u64::MAX, u64::MAX),
        ] {
            m.prefetch(addr, len);
        }
        let mut b = [0u8; 4];
        m.read(4096, &mut b).unwrap();
        assert_eq!(&b, b"kept");
    }

    #[test]
    fn anonymous_reads_back_and_checks_bounds() {
        let m = Medium::anonymous(1 << 20).unwrap();
        m.write(4096, b"moneta").unwrap();
        let mut b = [0u8; 6];
        m.read(4096, &mut b).unwrap();
        assert_eq!(&b, b"moneta");
        assert!(m.write((1 << 20) - 3, b"moneta").is_err());
        assert!(m.read(u64::MAX - 2, &mut b).is_err());
    }

    #[test]
    fn image_survives_reopening_and_rejects_a_wrong_size() {
        let path = temp("image");
        {
            let m = Medium::image(&path, 1 << 20).unwrap();
            m.write(12345, b"persistent").unwrap();
            m.flush().unwrap();
        }
        let m = Medium::image(&path, 1 << 20).unwrap();
        let mut b = [0u8; 10];
        m.read(12345, &mut b).unwrap();
        assert_eq!(&b, b"persistent");
        drop(m);
        let e = Medium::image(&path, 2 << 20).err().unwrap();
        assert!(e.to_string().contains("capacity"), "{e}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            1 << 20,
            "untouched"
        );
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn image_larger_than_ram_maps_sparsely() {
        // 1 TiB: far more than this machine's RAM; only touched pages exist.
        let path = temp("huge");
        let m = Medium::image(&path, 1 << 40).unwrap();
        m.write((1 << 40) - 8, b"the end!").unwrap();
        let mut b = [0u8; 8];
        m.read((1 << 40) - 8, &mut b).unwrap();
        assert_eq!(&b, b"the end!");
        drop(m);
        std::fs::remove_file(&path).unwrap();
    }
}
