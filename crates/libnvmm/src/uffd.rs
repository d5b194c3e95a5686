//! userfaultfd(2) at the kernel boundary: the few ioctls libnvmm needs,
//! declared from `<linux/userfaultfd.h>` (a stable kernel ABI) over `libc`
//! rather than through bindgen. Missing-page faults are how the DRAM cache
//! sees a miss (SPEC §7 "miss path"); write-protect faults are how it sees a
//! block turn dirty. Every `unsafe` block in libnvmm that talks to the kernel
//! about faults is here.

use crate::error::{ErrorKind, NvmmError, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const UFFD_API: u64 = 0xAA;
const UFFDIO: u64 = 0xAA;
const UFFD_FEATURE_PAGEFAULT_FLAG_WP: u64 = 1 << 0;
const UFFD_USER_MODE_ONLY: libc::c_int = 1;
const UFFDIO_REGISTER_MODE_MISSING: u64 = 1 << 0;
const UFFDIO_REGISTER_MODE_WP: u64 = 1 << 1;
const UFFDIO_COPY_MODE_WP: u64 = 1 << 1;
const UFFDIO_WRITEPROTECT_MODE_WP: u64 = 1 << 0;
const UFFD_EVENT_PAGEFAULT: u8 = 0x12;
const UFFD_PAGEFAULT_FLAG_WRITE: u64 = 1 << 0;
/// The faulting thread's id in each message (Linux 4.14).
const UFFD_FEATURE_THREAD_ID: u64 = 1 << 8;
const UFFD_PAGEFAULT_FLAG_WP: u64 = 1 << 1;
const NR_WAKE: u64 = 0x02;
const NR_COPY: u64 = 0x03;
const NR_WRITEPROTECT: u64 = 0x06;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioCopy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
struct UffdioWriteprotect {
    range: UffdioRange,
    mode: u64,
}

/// `struct uffd_msg` as a page-fault event uses it (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct UffdMsg {
    event: u8,
    reserved1: u8,
    reserved2: u16,
    reserved3: u32,
    flags: u64,
    address: u64,
    feat: u64,
}

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

const UFFDIO_API: u64 = iowr(0x3F, std::mem::size_of::<UffdioApi>());
const UFFDIO_REGISTER: u64 = iowr(0x00, std::mem::size_of::<UffdioRegister>());
const UFFDIO_COPY: u64 = iowr(NR_COPY, std::mem::size_of::<UffdioCopy>());
const UFFDIO_WRITEPROTECT: u64 = iowr(NR_WRITEPROTECT, std::mem::size_of::<UffdioWriteprotect>());
const UFFDIO_WAKE: u64 = ior(NR_WAKE, std::mem::size_of::<UffdioRange>());

/// One page fault as the handler sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    pub address: u64,
    /// The faulting access was a write (to a missing or a protected page).
    pub write: bool,
    /// A write to a present, write-protected page (not a missing page).
    pub write_protect: bool,
    /// The faulting thread (its tid), 0 if the kernel did not say.
    pub thread: u32,
}

/// A userfaultfd with the API handshake done and write-protect verified.
pub struct Userfault {
    fd: OwnedFd,
}

impl Userfault {
    /// Open a userfaultfd and check that this kernel can report
    /// write-protect faults on anonymous memory. As root all faults are
    /// handled; otherwise, with `vm.unprivileged_userfaultfd = 0`, only
    /// user-mode faults are (a system call reading the region then fails
    /// with EFAULT instead of waiting for the handler).
    pub fn open() -> Result<Userfault> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        // SAFETY: userfaultfd takes an int of flags and returns a new fd or -1.
        let mut fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) };
        if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM) {
            // SAFETY: as above.
            fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags | UFFD_USER_MODE_ONLY) };
        }
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            let sysctl = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unreadable".into());
            return Err(NvmmError::new(
                ErrorKind::Unsupported,
                format!(
                    "userfaultfd(2) failed: {e} (needs CONFIG_USERFAULTFD; as non-root \
                     vm.unprivileged_userfaultfd=1 or CAP_SYS_PTRACE; it is {sysctl})"
                ),
            ));
        }
        // SAFETY: fd is a new descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut api = UffdioApi {
            api: UFFD_API,
            features: UFFD_FEATURE_PAGEFAULT_FLAG_WP | UFFD_FEATURE_THREAD_ID,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API reads and writes a uffdio_api that lives here.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API as _, &mut api) } < 0 {
            return Err(NvmmError::new(
                ErrorKind::Unsupported,
                format!(
                    "UFFDIO_API with UFFD_FEATURE_PAGEFAULT_FLAG_WP failed: {} \
                     (write-protect faults need Linux ≥ 5.7 with CONFIG_HAVE_ARCH_USERFAULTFD_WP)",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        if api.features & UFFD_FEATURE_PAGEFAULT_FLAG_WP == 0 {
            return Err(NvmmError::new(
                ErrorKind::Unsupported,
                "this kernel's userfaultfd lacks UFFD_FEATURE_PAGEFAULT_FLAG_WP",
            ));
        }
        Ok(Userfault { fd })
    }

    pub fn raw_fd(&self) -> libc::c_int {
        self.fd.as_raw_fd()
    }

    /// Register `[start, start+len)` for missing and write-protect faults.
    pub fn register(&self, start: u64, len: u64) -> Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange { start, len },
            mode: UFFDIO_REGISTER_MODE_MISSING | UFFDIO_REGISTER_MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER reads and writes a uffdio_register that lives here.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_REGISTER as _, &mut reg) } < 0 {
            return Err(NvmmError::new(
                ErrorKind::Unsupported,
                format!(
                    "UFFDIO_REGISTER (missing + write-protect) of {len} bytes failed: {}",
                    std::io::Error::last_os_error()
                ),
            ));
        }
        let needed = (1 << NR_COPY) | (1 << NR_WRITEPROTECT) | (1 << NR_WAKE);
        if reg.ioctls & needed != needed {
            return Err(NvmmError::new(
                ErrorKind::Unsupported,
                format!(
                    "the registered range lacks UFFDIO_COPY/UFFDIO_WRITEPROTECT/UFFDIO_WAKE (ioctls {:#x})",
                    reg.ioctls
                ),
            ));
        }
        Ok(())
    }

    /// The next fault, if one is queued (the descriptor is non-blocking).
    pub fn next_fault(&self) -> Result<Option<Fault>> {
        let mut msg = UffdMsg::default();
        let size = std::mem::size_of::<UffdMsg>();
        // SAFETY: reads at most `size` bytes into a live uffd_msg.
        let n = unsafe { libc::read(self.raw_fd(), (&mut msg as *mut UffdMsg).cast(), size) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(None),
                _ => Err(NvmmError::os("read(userfaultfd)", e)),
            };
        }
        if n as usize != size || msg.event != UFFD_EVENT_PAGEFAULT {
            // Only page-fault events were asked for; anything else is skipped.
            return Ok(None);
        }
        Ok(Some(Fault {
            address: msg.address,
            write: msg.flags & UFFD_PAGEFAULT_FLAG_WRITE != 0,
            write_protect: msg.flags & UFFD_PAGEFAULT_FLAG_WP != 0,
            thread: msg.feat as u32,
        }))
    }

    /// Wait up to `timeout_ms` (−1: forever) for a fault or for `wake_fd`.
    pub fn poll(&self, wake_fd: libc::c_int, timeout_ms: i32) -> Result<()> {
        let mut fds = [
            libc::pollfd {
                fd: self.raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: wake_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: poll reads/writes the two pollfds that live here.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, timeout_ms) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                return Err(NvmmError::os("poll(userfaultfd)", e));
            }
        }
        Ok(())
    }

    /// Fill `[dst, dst+len)` atomically with the bytes at `src` and wake the
    /// threads waiting on it; `write_protect` maps it read-only to the
    /// application so that its first store raises a write-protect fault.
    /// Ok(false): the range was already filled (another fault raced).
    ///
    /// # Safety
    /// `src` must point to `len` readable bytes, and `dst` must lie in a
    /// range registered on this descriptor.
    pub unsafe fn copy(
        &self,
        dst: u64,
        src: *const u8,
        len: u64,
        write_protect: bool,
    ) -> Result<bool> {
        let mut copy = UffdioCopy {
            dst,
            src: src as u64,
            len,
            mode: if write_protect {
                UFFDIO_COPY_MODE_WP
            } else {
                0
            },
            copy: 0,
        };
        // SAFETY: the caller's promise on src/dst; the struct lives here.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_COPY as _, &mut copy) } < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EEXIST) {
                self.wake(dst, len)?;
                return Ok(false);
            }
            return Err(NvmmError::os(
                format!("UFFDIO_COPY of {len} bytes at {dst:#x}"),
                e,
            ));
        }
        Ok(true)
    }

    /// Set or clear write protection on `[start, start+len)`; clearing wakes
    /// the writers that waited on it.
    pub fn write_protect(&self, start: u64, len: u64, protect: bool) -> Result<()> {
        let mut wp = UffdioWriteprotect {
            range: UffdioRange { start, len },
            mode: if protect {
                UFFDIO_WRITEPROTECT_MODE_WP
            } else {
                0
            },
        };
        // SAFETY: UFFDIO_WRITEPROTECT reads a struct that lives here.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WRITEPROTECT as _, &mut wp) } < 0 {
            return Err(NvmmError::last_os(format!(
                "UFFDIO_WRITEPROTECT({protect}) of {len} bytes at {start:#x}"
            )));
        }
        Ok(())
    }

    /// Wake the threads waiting on `[start, start+len)` (their retried access
    /// faults again if the page is still missing).
    pub fn wake(&self, start: u64, len: u64) -> Result<()> {
        let mut range = UffdioRange { start, len };
        // SAFETY: UFFDIO_WAKE reads a uffdio_range that lives here.
        if unsafe { libc::ioctl(self.raw_fd(), UFFDIO_WAKE as _, &mut range) } < 0 {
            return Err(NvmmError::last_os(format!("UFFDIO_WAKE at {start:#x}")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ioctl_numbers_match_the_kernel_header() {
        // Values of <linux/userfaultfd.h> on x86_64, as the C preprocessor
        // computes them.
        assert_eq!(UFFDIO_API, 0xc018_aa3f);
        assert_eq!(UFFDIO_REGISTER, 0xc020_aa00);
        assert_eq!(UFFDIO_COPY, 0xc028_aa03);
        assert_eq!(UFFDIO_WRITEPROTECT, 0xc018_aa06);
        assert_eq!(UFFDIO_WAKE, 0x8010_aa02);
        assert_eq!(std::mem::size_of::<UffdMsg>(), 32);
    }
}
