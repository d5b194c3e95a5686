//! The system calls only the daemon makes, each wrapped once with its
//! SAFETY argument: FIEMAP and cachestat for file grants (SPEC §3.4), and
//! the passes over /proc and /sys that tell who else uses a granted file.
//! The calls its clients make too (mappings, futexes, descriptor passing,
//! positioned I/O) are `moneta_abi::sys`, re-exported here.

pub use moneta_abi::sys::*;
use moneta_abi::InodeId;
use std::io;
use std::os::fd::RawFd;

/// What the page cache holds of a file's range (cachestat(2), Linux 6.5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages cached (clean, dirty or under writeback).
    pub cached: u64,
    pub dirty: u64,
    pub writeback: u64,
}

impl CacheStat {
    /// Cached pages that are neither dirty nor being written: the ones a
    /// direct write can make stale.
    pub fn clean(&self) -> u64 {
        self.cached.saturating_sub(self.dirty + self.writeback)
    }
}

/// cachestat(2) of `[offset, offset + len)` (len 0: to the end of the file).
pub fn cachestat(fd: RawFd, offset: u64, len: u64) -> io::Result<CacheStat> {
    /// x86-64's number for cachestat (uapi asm/unistd_64.h).
    const SYS_CACHESTAT: libc::c_long = 451;
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    let range = Range { off: offset, len };
    let mut st = Stat::default();
    // SAFETY: the kernel reads `range` and writes `st`, both ours and of
    // the layout uapi/linux/mman.h gives.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd,
            &range as *const Range,
            &mut st as *mut Stat,
            0,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(CacheStat {
        cached: st.nr_cache,
        dirty: st.nr_dirty,
        writeback: st.nr_writeback,
    })
}

/// Extents one FIEMAP call reports at most.
pub const FIEMAP_BATCH: usize = 128;

// FIEMAP (linux/fiemap.h): request flag and extent flags.
pub const FIEMAP_FLAG_SYNC: u32 = 0x1;
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
pub const FIEMAP_EXTENT_UNKNOWN: u32 = 0x2;
pub const FIEMAP_EXTENT_DELALLOC: u32 = 0x4;
pub const FIEMAP_EXTENT_ENCODED: u32 = 0x8;
pub const FIEMAP_EXTENT_DATA_ENCRYPTED: u32 = 0x80;
pub const FIEMAP_EXTENT_NOT_ALIGNED: u32 = 0x100;
pub const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x200;
pub const FIEMAP_EXTENT_DATA_TAIL: u32 = 0x400;
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// `struct fiemap_extent`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FiemapExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset on the file system's block device.
    pub physical: u64,
    pub length: u64,
    reserved64: [u64; 2],
    /// FIEMAP_EXTENT_*.
    pub flags: u32,
    reserved: [u32; 3],
}

/// `struct fiemap` with room for [`FIEMAP_BATCH`] extents.
#[repr(C)]
struct Fiemap {
    start: u64,
    length: u64,
    flags: u32,
    mapped_extents: u32,
    extent_count: u32,
    reserved: u32,
    extents: [FiemapExtent; FIEMAP_BATCH],
}

/// FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap) (the header is 32 bytes).
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;

/// The extents of the file behind `fd` that overlap `[start, start + len)`,
/// in logical order, at most [`FIEMAP_BATCH`] (ask again from the end of
/// the last one for more). FIEMAP_FLAG_SYNC: the kernel writes the file's
/// dirty data first, so delayed allocations get real blocks.
pub fn fiemap(fd: RawFd, start: u64, len: u64) -> io::Result<Vec<FiemapExtent>> {
    let mut request = Box::new(Fiemap {
        start,
        length: len,
        flags: FIEMAP_FLAG_SYNC,
        mapped_extents: 0,
        extent_count: FIEMAP_BATCH as u32,
        reserved: 0,
        extents: [FiemapExtent::default(); FIEMAP_BATCH],
    });
    // SAFETY: `request` is a live `struct fiemap` whose extent array holds
    // `extent_count` entries, which bounds what the kernel writes.
    let r = unsafe { libc::ioctl(fd, FS_IOC_FIEMAP as _, &mut *request as *mut Fiemap) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    let n = (request.mapped_extents as usize).min(FIEMAP_BATCH);
    Ok(request.extents[..n].to_vec())
}

/// Whether any process maps the file (dev, ino) (a line of some
/// /proc/PID/maps names it). Processes that exit meanwhile are skipped.
pub fn inode_mapped_anywhere(dev: u64, ino: u64) -> bool {
    outside_uses(dev, ino, &[], None, false, true).mapped
}

/// Children of this process that never use what they inherited (the
/// coverage keeper, forked without exec: until it closes them it holds
/// every descriptor this process had, and it keeps this process's
/// mappings): the passes over /proc count them as this process. A pass
/// holds the read side for its whole walk, and a fork of such a child the
/// write side until its pid is noted, so no pass sees the child unnoted.
static OWN_HELPERS: std::sync::RwLock<Vec<i32>> = std::sync::RwLock::new(Vec::new());

/// The list of own helpers, to fork one and note its pid under (see
/// [`OWN_HELPERS`]); [`forget_own_helper`] once it is reaped.
pub fn own_helpers() -> std::sync::RwLockWriteGuard<'static, Vec<i32>> {
    OWN_HELPERS.write().unwrap_or_else(|p| p.into_inner())
}

/// `pid` is reaped: a new process may get its number.
pub fn forget_own_helper(pid: i32) {
    own_helpers().retain(|&p| p != pid);
}

/// This process and its own helpers, skipped by a pass over /proc (which
/// holds this for its whole walk).
struct ThisProcess {
    helpers: std::sync::RwLockReadGuard<'static, Vec<i32>>,
    me: i32,
}

impl ThisProcess {
    fn contains(&self, pid: i32) -> bool {
        pid == self.me || self.helpers.contains(&pid)
    }
}

fn this_process() -> ThisProcess {
    ThisProcess {
        helpers: OWN_HELPERS.read().unwrap_or_else(|p| p.into_inner()),
        me: std::process::id() as i32,
    }
}

/// How processes other than this one use the file (dev, ino), from one
/// pass over /proc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutsideUses {
    /// A descriptor of it is open (in a process not in `except`).
    pub open: bool,
    /// One of those is open for writing.
    pub open_for_writing: bool,
    /// Some process (any but this one) maps it.
    pub mapped: bool,
    /// The first process found with a descriptor of it open, and its
    /// command name (for the log: who keeps the file on the kernel path).
    pub holder: Option<(i32, String)>,
}

/// One pass over /proc: the descriptors of every process but this one (and
/// its own helpers) and `except` (only those whose path is `under`, if
/// given) when `fds`, and their mappings when `maps`.
pub fn outside_uses(
    dev: u64,
    ino: u64,
    except: &[i32],
    under: Option<&std::path::Path>,
    fds: bool,
    maps: bool,
) -> OutsideUses {
    use std::os::unix::fs::MetadataExt;
    let me = this_process();
    let mut uses = OutsideUses::default();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return uses;
    };
    let want_dev = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    let want_ino = ino.to_string();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if me.contains(pid) {
            continue;
        }
        if fds && !uses.open_for_writing && !except.contains(&pid) {
            if let Ok(list) = std::fs::read_dir(entry.path().join("fd")) {
                for f in list.flatten() {
                    let path = f.path();
                    let ours = under
                        .is_none_or(|u| std::fs::read_link(&path).is_ok_and(|t| t.starts_with(u)))
                        && std::fs::metadata(&path).is_ok_and(|m| m.dev() == dev && m.ino() == ino);
                    if ours {
                        uses.open = true;
                        if uses.holder.is_none() {
                            let comm = std::fs::read_to_string(entry.path().join("comm"))
                                .unwrap_or_default();
                            uses.holder = Some((pid, comm.trim_end().to_string()));
                        }
                        if fd_writable(&entry.path(), &f.file_name()) {
                            uses.open_for_writing = true;
                            break;
                        }
                    }
                }
            }
        }
        if maps && !uses.mapped {
            if let Ok(text) = std::fs::read_to_string(entry.path().join("maps")) {
                uses.mapped = text.lines().any(|line| {
                    let mut fields = line.split_ascii_whitespace();
                    let (_range, _perms, _offset) = (fields.next(), fields.next(), fields.next());
                    fields.next() == Some(want_dev.as_str())
                        && fields.next() == Some(want_ino.as_str())
                });
            }
        }
        if (!fds || uses.open_for_writing) && (!maps || uses.mapped) {
            break;
        }
    }
    uses
}

/// Whether descriptor `fd` of the process at `/proc/PID` is open for
/// writing (its fdinfo's octal flags; unreadable counts as writable).
fn fd_writable(proc: &std::path::Path, fd: &std::ffi::OsStr) -> bool {
    let Ok(info) = std::fs::read_to_string(proc.join("fdinfo").join(fd)) else {
        return true;
    };
    info.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
        .is_none_or(|flags| flags & libc::O_ACCMODE != libc::O_RDONLY)
}

/// Whether a loop device is attached to the file (dev, ino): the loop
/// driver reads, writes and discards it from inside the kernel, where no
/// fanotify event reports it.
pub fn inode_backs_loop_device(dev: u64, ino: u64) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(dir) = std::fs::read_dir("/sys/block") else {
        return false;
    };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("loop"))
        .filter_map(|e| std::fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .any(|path| {
            std::fs::metadata(path.trim_end_matches('\n'))
                .is_ok_and(|m| m.dev() == dev && m.ino() == ino)
        })
}

/// The thread group (process) of thread `tid`, from /proc.
pub fn process_of_thread(tid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{tid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))?
        .trim()
        .parse()
        .ok()
}

/// The inodes (dev, ino) of every regular file some process (other than
/// this one and its own helpers) has open under directory `root` (by the descriptor's path).
pub fn inodes_open_under(root: &std::path::Path) -> std::collections::HashSet<InodeId> {
    use std::os::unix::fs::MetadataExt;
    let me = this_process();
    let mut found = std::collections::HashSet::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in dir.flatten() {
        let pid = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok());
        if pid.is_none_or(|pid| me.contains(pid)) {
            continue;
        }
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for f in fds.flatten() {
            let path = f.path();
            if !std::fs::read_link(&path).is_ok_and(|t| t.starts_with(root)) {
                continue;
            }
            if let Ok(m) = std::fs::metadata(&path) {
                if m.is_file() {
                    found.insert(InodeId {
                        dev: m.dev(),
                        ino: m.ino(),
                    });
                }
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A child forked without exec holds every descriptor of this process
    /// until it closes them (the coverage keeper): noted as an own helper,
    /// the passes over /proc count it as this process; unnoted, as another.
    #[test]
    fn an_own_helper_holding_inherited_descriptors_is_not_outside() {
        let dir = std::env::temp_dir().join(format!("moneta-helper-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let file = std::fs::File::create(&path).unwrap();
        let st = file.metadata().unwrap();
        let mut helpers = own_helpers();
        // SAFETY: the child only sleeps (a raw system call) until killed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            loop {
                // SAFETY: pause(2) has no preconditions.
                unsafe { libc::pause() };
            }
        }
        assert!(pid > 0);
        drop(helpers);
        let outside = outside_uses(st.dev(), st.ino(), &[], Some(&dir), true, true);
        let under = inodes_open_under(&dir);
        helpers = own_helpers();
        helpers.push(pid);
        drop(helpers);
        let noted = outside_uses(st.dev(), st.ino(), &[], Some(&dir), true, true);
        let noted_under = inodes_open_under(&dir);
        // SAFETY: kill and reap our own child.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
        }
        forget_own_helper(pid);
        drop(file);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(outside.open && outside.open_for_writing, "{outside:?}");
        assert_eq!(outside.holder.as_ref().map(|h| h.0), Some(pid));
        assert_eq!(under.len(), 1);
        assert!(!noted.open && noted.holder.is_none(), "{noted:?}");
        assert!(noted_under.is_empty());
    }
}
