//! Block frees reported by the file systems themselves (issue 20; SPEC
//! §3.4: the OS tells the device which blocks left a file; README,
//! "Direct-path contract").
//!
//! fanotify ([`crate::layout_watch`]) reports what processes do to a held
//! file, but not what a file system does to its blocks on its own behalf or
//! through calls it does not hook (XFS_IOC_SWAPEXT, EXT4_IOC_SWAP_BOOT,
//! exchange-range). The file systems' own tracepoints fire on every block
//! free: `xfs:xfs_free_extent` and `ext4:ext4_free_blocks`. Two BPF
//! tracepoint programs (`bpf/frees.bpf.c`, loaded with aya) copy each free
//! on a watched device into a ring buffer, in the freeing thread and before
//! the transaction that frees the blocks commits, that is before the blocks
//! can be allocated to anyone else (XFS keeps a freed extent busy until its
//! transaction is in the log; ext4 returns freed blocks to its allocator in
//! the journal commit's callback).
//!
//! The handler (the file table) revokes every channel's grant of a freed
//! block and applies it to the device. Between the free and that revocation
//! the device takes no new command: [`FreeFence::pending`] compares the
//! ring's producer position (the kernel's page, mapped read-only) with the
//! position whose frees are applied, one load per device turn. A command
//! the device took before the free was executed as if it came before it.
//!
//! Where BPF is not available (no clang at build time, no privilege, a
//! kernel whose tracepoint layouts differ), [`FreeWatch::start`] fails with
//! the reason and the daemon keeps fanotify's guard alone; `moneta status`
//! names the guard of each mount.

use moneta_abi::error::{EmuError, ErrorKind};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, RawFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// Devices the programs watch at once (`WATCHED_DEVS` in frees.bpf.c).
const WATCHED_DEVS: u32 = 8;
/// Bytes of one ring record (`struct free_event` in frees.bpf.c).
const EVENT_BYTES: usize = 40;
/// Event kinds (`emit`'s first argument in frees.bpf.c).
const KIND_XFS: u32 = 1;
const KIND_EXT4: u32 = 2;
/// XFS_IOC_FSGEOMETRY: _IOR('X', 126, struct xfs_fsop_geom), 256 bytes.
const XFS_IOC_FSGEOMETRY: libc::c_ulong = 0x8100_587e;
const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
const EXT4_SUPER_MAGIC: i64 = 0xef53;

/// Blocks a file system freed: device bytes `[start, start + len)` of the
/// file system on `dev` (st_dev), and the inode that held them if the file
/// system says (ext4 does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreedRange {
    pub dev: u64,
    pub ino: Option<u64>,
    pub start: u64,
    pub len: u64,
}

/// What the handler is given: the frees, in the order they happened.
pub type FreeHandler = Arc<dyn Fn(&[FreedRange]) + Send + Sync>;

/// How a watched file system numbers its blocks.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    kind: u32,
    dev: u64,
    block_bytes: u64,
    /// XFS: blocks per allocation group (a block's device address is
    /// (agno × agblocks + agbno) × block size).
    ag_blocks: u64,
}

impl Geometry {
    fn freed(&self, ino: u64, group: u64, block: u64, count: u64) -> Option<FreedRange> {
        let first = match self.kind {
            KIND_XFS => group.checked_mul(self.ag_blocks)?.checked_add(block)?,
            _ => block,
        };
        Some(FreedRange {
            dev: self.dev,
            ino: (self.kind == KIND_EXT4).then_some(ino),
            start: first.checked_mul(self.block_bytes)?,
            len: count.checked_mul(self.block_bytes)?,
        })
    }
}

/// One page of the ring buffer's map, mapped read-only.
struct RingPage(*const AtomicU64);

// SAFETY: the page is a kernel-shared mapping read only with atomic loads.
unsafe impl Send for RingPage {}
unsafe impl Sync for RingPage {}

impl RingPage {
    fn map(fd: RawFd, page: usize) -> Result<RingPage, EmuError> {
        let size = page_size();
        // SAFETY: a fresh shared read-only mapping of the ring map's page.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                (page * size) as libc::off_t,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(EmuError::io(
                "mapping the free ring's position",
                std::io::Error::last_os_error(),
            ));
        }
        Ok(RingPage(p as *const AtomicU64))
    }

    fn load(&self) -> u64 {
        // SAFETY: the mapping lives as long as self and is 8-aligned.
        unsafe { (*self.0).load(Ordering::Acquire) }
    }
}

impl Drop for RingPage {
    fn drop(&mut self) {
        // SAFETY: mapped in `map` with this size.
        unsafe { libc::munmap(self.0 as *mut libc::c_void, page_size()) };
    }
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

/// The device's check that no reported free is waiting to be applied.
pub struct FreeFence {
    producer: RingPage,
    consumer: RingPage,
    /// The consumer position up to which frees are applied.
    applied: AtomicU64,
    /// The watcher is gone: nothing will apply frees, so none is waited for.
    off: AtomicBool,
    /// Device turns that took no command because a free was pending.
    pub stalls: AtomicU64,
}

impl FreeFence {
    /// Whether a free is in the ring that the device has not applied: then
    /// the device must take no new command.
    #[inline]
    pub fn pending(&self) -> bool {
        let p = self.producer.load();
        if p == self.applied.load(Ordering::Acquire) || self.off.load(Ordering::Relaxed) {
            return false;
        }
        self.stalls.fetch_add(1, Ordering::Relaxed);
        true
    }
}

/// Counters for `moneta stats`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FreeWatchStats {
    pub frees: u64,
    pub fence_stalls: u64,
    pub running: bool,
}

/// The loaded programs and the thread that applies their reports.
pub struct FreeWatch {
    /// Keeps the programs attached.
    _bpf: aya::Ebpf,
    devs: Mutex<(aya::maps::Array<aya::maps::MapData, u32>, Vec<u32>)>,
    geometry: Arc<Mutex<HashMap<u32, Geometry>>>,
    fence: Arc<FreeFence>,
    /// Tracepoints attached ("xfs:xfs_free_extent", ...).
    attached: Vec<&'static str>,
    /// Those that guard a watched file system.
    watched: Mutex<Vec<&'static str>>,
    frees: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The compiled programs (empty when built without clang).
#[cfg(moneta_bpf)]
static OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/frees.bpf.o"));
#[cfg(not(moneta_bpf))]
static OBJECT: &[u8] = &[];

/// A tracepoint's fields a program reads: (field, offset, size).
type Fields = &'static [(&'static str, u32, u32)];

/// The argument layout each program assumes: (category, name, fields).
const LAYOUTS: [(&str, &str, Fields); 2] = [
    (
        "xfs",
        "xfs_free_extent",
        &[
            ("dev", 8, 4),
            ("agno", 12, 4),
            ("agbno", 16, 4),
            ("len", 20, 4),
        ],
    ),
    (
        "ext4",
        "ext4_free_blocks",
        &[
            ("dev", 8, 4),
            ("ino", 16, 8),
            ("block", 24, 8),
            ("count", 32, 8),
        ],
    ),
];

/// Where tracefs is mounted when the system mounts it (systemd does; a
/// bare boot may not, and then no tracepoint can be found or attached).
const TRACEFS: &str = "/sys/kernel/tracing";

/// Make sure tracefs is mounted (its `events` directory names the
/// tracepoints and their layouts): if neither its place nor debugfs's
/// `tracing` has it, mount it at [`TRACEFS`] and say so. It stays mounted
/// (as on a system that mounts it at boot).
fn mount_tracefs() -> Result<(), String> {
    let mounted = [TRACEFS, "/sys/kernel/debug/tracing"]
        .iter()
        .any(|root| Path::new(root).join("events").is_dir());
    if mounted {
        return Ok(());
    }
    let c = |s: &str| std::ffi::CString::new(s).expect("no NUL");
    let (source, target, kind) = (c("nodev"), c(TRACEFS), c("tracefs"));
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            kind.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "tracefs is not mounted and mounting it at {TRACEFS} failed: {}",
            std::io::Error::last_os_error()
        ));
    }
    eprintln!("monetad: mounted tracefs at {TRACEFS} (the block-free tracepoints need it)");
    Ok(())
}

/// Whether the running kernel's format file for `category/name` has the
/// fields at the offsets and sizes the program reads.
fn layout_matches(category: &str, name: &str, fields: &[(&str, u32, u32)]) -> Result<(), String> {
    let text = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
        .iter()
        .find_map(|root| {
            std::fs::read_to_string(format!("{root}/events/{category}/{name}/format")).ok()
        })
        .ok_or_else(|| format!("no tracepoint {category}:{name}"))?;
    for (field, offset, size) in fields {
        let found = text.lines().any(|l| {
            let l = l.trim();
            l.split(';')
                .next()
                .is_some_and(|decl| decl.split_whitespace().last() == Some(field))
                && l.contains(&format!("offset:{offset};"))
                && l.contains(&format!("size:{size};"))
        });
        if !found {
            return Err(format!(
                "{category}:{name} has no field {field} at offset {offset} of size {size}"
            ));
        }
    }
    Ok(())
}

impl FreeWatch {
    /// Load and attach the programs and start applying their reports with
    /// `handler`. Fails, saying why, where this build or kernel cannot.
    pub fn start(handler: FreeHandler) -> Result<FreeWatch, EmuError> {
        use aya::maps::{Array, RingBuf};
        use aya::programs::TracePoint;
        let unavailable = |why: String| EmuError::new(ErrorKind::Io, why);
        if OBJECT.is_empty() {
            return Err(unavailable(
                "monetad was built without clang, so without its block-free tracepoints".into(),
            ));
        }
        mount_tracefs().map_err(unavailable)?;
        let mut bpf = aya::Ebpf::load(OBJECT)
            .map_err(|e| unavailable(format!("loading the block-free programs: {e}")))?;
        let mut attached = Vec::new();
        let mut refused = Vec::new();
        for (category, name, fields) in LAYOUTS {
            if let Err(why) = layout_matches(category, name, fields) {
                refused.push(why);
                continue;
            }
            let program: &mut TracePoint = bpf
                .program_mut(name)
                .ok_or_else(|| unavailable(format!("no program {name} in the object")))?
                .try_into()
                .map_err(|e| unavailable(format!("{name}: {e}")))?;
            let result = program.load().and_then(|()| program.attach(category, name));
            match result {
                Ok(_) => attached.push(if category == "xfs" {
                    "xfs:xfs_free_extent"
                } else {
                    "ext4:ext4_free_blocks"
                }),
                Err(e) => refused.push(format!("{category}:{name}: {e}")),
            }
        }
        if attached.is_empty() {
            return Err(unavailable(format!(
                "no block-free tracepoint could be attached: {}",
                refused.join("; ")
            )));
        }
        let devs = Array::try_from(
            bpf.take_map("DEVS")
                .ok_or_else(|| unavailable("no DEVS map in the object".into()))?,
        )
        .map_err(|e| unavailable(format!("DEVS: {e}")))?;
        let mut ring = RingBuf::try_from(
            bpf.take_map("FREES")
                .ok_or_else(|| unavailable("no FREES map in the object".into()))?,
        )
        .map_err(|e| unavailable(format!("FREES: {e}")))?;
        let fd = ring.as_raw_fd();
        let consumer = RingPage::map(fd, 0)?;
        let producer = RingPage::map(fd, 1)?;
        let applied = AtomicU64::new(consumer.load());
        let fence = Arc::new(FreeFence {
            producer,
            consumer,
            applied,
            off: AtomicBool::new(false),
            stalls: AtomicU64::new(0),
        });
        let geometry: Arc<Mutex<HashMap<u32, Geometry>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let frees = Arc::new(AtomicU64::new(0));
        let thread = {
            let (fence, geometry, stop, frees) =
                (fence.clone(), geometry.clone(), stop.clone(), frees.clone());
            std::thread::Builder::new()
                .name("monetad-frees".into())
                .spawn(move || {
                    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        serve(&mut ring, &fence, &geometry, &stop, &frees, &handler)
                    }));
                    // Nobody applies frees any more: the device must not wait.
                    fence.off.store(true, Ordering::Release);
                    if served.is_err() {
                        eprintln!("monetad: the block-free watcher stopped");
                    }
                })
                .map_err(|e| EmuError::io("starting the block-free watcher", e))?
        };
        Ok(FreeWatch {
            _bpf: bpf,
            devs: Mutex::new((devs, Vec::new())),
            geometry,
            fence,
            attached,
            watched: Mutex::default(),
            frees,
            stop,
            thread: Some(thread),
        })
    }

    /// Report the frees of the file system mounted at (or holding) `dir`
    /// from now on.
    pub fn watch_file_system(&self, dir: &Path) -> Result<(), EmuError> {
        let geometry = geometry_of(dir)?;
        let wanted = if geometry.kind == KIND_XFS {
            "xfs:xfs_free_extent"
        } else {
            "ext4:ext4_free_blocks"
        };
        if !self.attached.contains(&wanted) {
            return Err(EmuError::new(
                ErrorKind::Io,
                format!("the tracepoint {wanted} is not attached"),
            ));
        }
        let kdev = kernel_dev(geometry.dev);
        let mut devs = self.devs.lock().expect("devs");
        let (map, slots) = &mut *devs;
        if slots.contains(&kdev) {
            return Ok(());
        }
        if slots.len() as u32 >= WATCHED_DEVS {
            return Err(EmuError::new(
                ErrorKind::Io,
                format!("the block-free programs watch at most {WATCHED_DEVS} file systems"),
            ));
        }
        self.geometry
            .lock()
            .expect("geometry")
            .insert(kdev, geometry);
        map.set(slots.len() as u32, kdev, 0)
            .map_err(|e| EmuError::new(ErrorKind::Io, format!("watching device {kdev}: {e}")))?;
        slots.push(kdev);
        let mut watched = self.watched.lock().expect("watched");
        if !watched.contains(&wanted) {
            watched.push(wanted);
        }
        Ok(())
    }

    /// The check the device makes before it takes commands.
    pub fn fence(&self) -> Arc<FreeFence> {
        self.fence.clone()
    }

    /// Which tracepoints guard a watched file system (for `moneta status`).
    pub fn watched(&self) -> Vec<&'static str> {
        self.watched.lock().expect("watched").clone()
    }

    pub fn stats(&self) -> FreeWatchStats {
        FreeWatchStats {
            frees: self.frees.load(Ordering::Relaxed),
            fence_stalls: self.fence.stalls.load(Ordering::Relaxed),
            running: !self.fence.off.load(Ordering::Relaxed),
        }
    }
}

impl Drop for FreeWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The watcher's loop: wait for records, hand them to the handler, then
/// mark them applied (the device waits for that).
fn serve(
    ring: &mut aya::maps::RingBuf<aya::maps::MapData>,
    fence: &FreeFence,
    geometry: &Mutex<HashMap<u32, Geometry>>,
    stop: &AtomicBool,
    frees: &AtomicU64,
    handler: &FreeHandler,
) {
    let fd = ring.as_raw_fd();
    let mut batch = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd. The timeout bounds how long a stop
        // waits, and a wake-up the ring skipped (it wakes adaptively).
        unsafe { libc::poll(&mut pfd, 1, 20) };
        // The devices' geometry, locked only when a record came.
        let mut geo = None;
        while let Some(item) = ring.next() {
            let g = geo.get_or_insert_with(|| geometry.lock().expect("geometry"));
            batch.extend(parse(&item, g));
        }
        drop(geo);
        frees.fetch_add(batch.len() as u64, Ordering::Relaxed);
        if !batch.is_empty() {
            handler(&batch);
            batch.clear();
        }
        // Everything consumed so far is applied.
        fence
            .applied
            .store(fence.consumer.load(), Ordering::Release);
    }
}

/// A ring record as a freed range (None: not a watched device's, or malformed).
fn parse(item: &[u8], geo: &HashMap<u32, Geometry>) -> Option<FreedRange> {
    if item.len() < EVENT_BYTES {
        return None;
    }
    let u32_at = |o: usize| u32::from_ne_bytes(item[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_ne_bytes(item[o..o + 8].try_into().expect("8 bytes"));
    let (kind, kdev) = (u32_at(0), u32_at(4));
    let g = geo.get(&kdev)?;
    if g.kind != kind {
        return None;
    }
    g.freed(u64_at(8), u64_at(16), u64_at(24), u64_at(32))
}

/// The kernel's dev_t (major << 20 | minor) of a user-space st_dev.
fn kernel_dev(dev: u64) -> u32 {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    (major << 20) | minor
}

/// The block numbering of the file system holding `dir`.
fn geometry_of(dir: &Path) -> Result<Geometry, EmuError> {
    use std::os::unix::fs::MetadataExt;
    let file = std::fs::File::open(dir).map_err(|e| EmuError::io("opening the mount", e))?;
    let dev = file
        .metadata()
        .map_err(|e| EmuError::io("stat of the mount", e))?
        .dev();
    // SAFETY: statfs fills the struct it is given.
    let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut sfs) } != 0 {
        return Err(EmuError::io(
            "statfs of the mount",
            std::io::Error::last_os_error(),
        ));
    }
    let block_bytes = sfs.f_bsize as u64;
    match sfs.f_type as i64 {
        XFS_SUPER_MAGIC => {
            let mut geom = [0u8; 256];
            // SAFETY: the ioctl writes at most the 256 bytes its number encodes.
            if unsafe { libc::ioctl(file.as_raw_fd(), XFS_IOC_FSGEOMETRY, geom.as_mut_ptr()) } != 0
            {
                return Err(EmuError::io(
                    "XFS_IOC_FSGEOMETRY",
                    std::io::Error::last_os_error(),
                ));
            }
            let at =
                |o: usize| u64::from(u32::from_ne_bytes(geom[o..o + 4].try_into().expect("4")));
            Ok(Geometry {
                kind: KIND_XFS,
                dev,
                block_bytes: at(0),
                ag_blocks: at(8),
            })
        }
        EXT4_SUPER_MAGIC => Ok(Geometry {
            kind: KIND_EXT4,
            dev,
            block_bytes,
            ag_blocks: 0,
        }),
        other => Err(EmuError::new(
            ErrorKind::Io,
            format!("no block-free tracepoint for file system type {other:#x}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xfs_blocks_are_numbered_per_allocation_group() {
        let g = Geometry {
            kind: KIND_XFS,
            dev: 7,
            block_bytes: 4096,
            ag_blocks: 32768,
        };
        let r = g.freed(0, 2, 40, 16).unwrap();
        assert_eq!(r.start, (2 * 32768 + 40) * 4096);
        assert_eq!(r.len, 16 * 4096);
        assert_eq!(r.ino, None);
        // A hostile or corrupt record cannot overflow.
        assert_eq!(g.freed(0, u64::MAX, 1, 1), None);
    }

    #[test]
    fn records_of_other_devices_and_short_records_are_ignored() {
        let mut geo = HashMap::new();
        geo.insert(
            5,
            Geometry {
                kind: KIND_EXT4,
                dev: 9,
                block_bytes: 1024,
                ag_blocks: 0,
            },
        );
        let mut rec = [0u8; EVENT_BYTES];
        rec[0..4].copy_from_slice(&KIND_EXT4.to_ne_bytes());
        rec[4..8].copy_from_slice(&5u32.to_ne_bytes());
        rec[8..16].copy_from_slice(&12u64.to_ne_bytes());
        rec[24..32].copy_from_slice(&100u64.to_ne_bytes());
        rec[32..40].copy_from_slice(&3u64.to_ne_bytes());
        let r = parse(&rec, &geo).unwrap();
        assert_eq!((r.dev, r.ino, r.start, r.len), (9, Some(12), 102_400, 3072));
        assert_eq!(parse(&rec[..39], &geo), None);
        rec[4..8].copy_from_slice(&6u32.to_ne_bytes());
        assert_eq!(parse(&rec, &geo), None);
    }

    #[test]
    fn the_kernel_numbers_devices_its_own_way() {
        assert_eq!(kernel_dev(libc::makedev(7, 3)), (7 << 20) | 3);
        assert_eq!(kernel_dev(libc::makedev(259, 70_000)), (259 << 20) | 70_000);
    }
}
