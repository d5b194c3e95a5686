//! libnvmm given what a hostile or careless caller gives it (issue 24):
//! a backing path that is not a regular file, a file it did not make, sizes
//! and DRAM budgets at the limits of u64. Every case must fail with a clear
//! error value (never abort the caller) and leave the path exactly as it
//! was; an absurd DRAM budget is the region's size, not gigabytes of RSS.

use nvmm::testkit::fast_dir;
use nvmm::{ErrorKind, Nvmm, Options};
use std::ffi::CString;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const MB: u64 = 1 << 20;

/// A fresh directory removed with everything in it on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let p = fast_dir().join(format!("libnvmm-hostile-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        TempDir(p)
    }
    fn join(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
    /// Names in the directory, sorted.
    fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn c(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

/// What `lstat` says of a path: type, mode, inode, size, device number.
fn snapshot(p: &Path) -> (bool, bool, bool, bool, u32, u64, u64, u64) {
    let m = std::fs::symlink_metadata(p).unwrap();
    let t = m.file_type();
    (
        t.is_char_device(),
        t.is_fifo(),
        t.is_symlink(),
        t.is_file(),
        m.mode(),
        m.ino(),
        m.size(),
        m.rdev(),
    )
}

/// Open must fail with `kind` and a message containing `says`, and leave
/// `path` (and the directory's listing) exactly as they were.
fn refused(dir: &TempDir, path: &Path, kind: ErrorKind, says: &str) {
    let before = (snapshot(path), dir.names());
    let e = Nvmm::open(path, MB, MB).err().expect("open must fail");
    println!("{}: {e}", path.display());
    assert_eq!(e.kind, kind, "{e}");
    assert!(e.context.contains(says), "{e}");
    assert_eq!(
        (snapshot(path), dir.names()),
        before,
        "{e}: the path changed"
    );
}

#[test]
fn a_character_device_node_is_refused_and_left_alone() {
    let dir = TempDir::new("chr");
    let node = dir.join("null-like");
    // A node with /dev/null's numbers, made here (never the real one).
    // SAFETY: a NUL-terminated path; mknod only creates a name.
    let made = unsafe {
        libc::mknod(
            c(&node).as_ptr(),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
    };
    if made != 0 {
        let e = std::io::Error::last_os_error();
        moneta_testkit::unavailable(&format!("mknod needs CAP_MKNOD ({e})"), "run as root");
        return;
    }
    refused(
        &dir,
        &node,
        ErrorKind::InvalidArgument,
        "a character device",
    );
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = TempDir::new("fifo");
    let fifo = dir.join("fifo");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c(&fifo).as_ptr(), 0o644) }, 0);
    refused(&dir, &fifo, ErrorKind::InvalidArgument, "a FIFO");
}

#[test]
fn a_symlink_to_an_empty_file_is_refused_and_neither_is_touched() {
    let dir = TempDir::new("symlink");
    let target = dir.join("empty");
    std::fs::write(&target, b"").unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let target_before = snapshot(&target);
    refused(&dir, &link, ErrorKind::InvalidArgument, "a symbolic link");
    assert_eq!(snapshot(&target), target_before);
    // A dangling link is no new path either.
    std::fs::remove_file(&target).unwrap();
    refused(&dir, &link, ErrorKind::InvalidArgument, "a symbolic link");
    assert!(!target.exists(), "nothing was created through the link");
}

#[test]
fn an_empty_read_only_file_is_refused_and_keeps_its_mode() {
    let dir = TempDir::new("ro");
    let file = dir.join("ro");
    std::fs::write(&file, b"").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
    refused(&dir, &file, ErrorKind::InvalidArgument, "read-only");
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o444
    );
}

#[test]
fn a_file_libnvmm_did_not_make_is_refused_unchanged() {
    let dir = TempDir::new("foreign");
    let file = dir.join("notes.txt");
    std::fs::write(&file, b"precious bytes").unwrap();
    refused(&dir, &file, ErrorKind::BadFile, "not an NVMM log");
    assert_eq!(std::fs::read(&file).unwrap(), b"precious bytes");
}

#[test]
fn an_empty_writable_file_is_formatted_in_place() {
    let dir = TempDir::new("inplace");
    let file = dir.join("made-by-mktemp");
    std::fs::write(&file, b"").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ino = std::fs::metadata(&file).unwrap().ino();
    let n = Nvmm::open(&file, MB, 256 << 10).unwrap();
    n.write(100, b"kept").unwrap();
    n.close().unwrap();
    let m = std::fs::metadata(&file).unwrap();
    assert_eq!(
        (m.ino(), m.mode() & 0o777),
        (ino, 0o600),
        "same inode and mode"
    );
    assert_eq!(dir.names(), vec!["made-by-mktemp".to_string()], "no debris");
    let n = Nvmm::open(&file, 0, 256 << 10).unwrap();
    let mut got = [0u8; 4];
    n.read(100, &mut got).unwrap();
    assert_eq!(&got, b"kept");
}

/// Resident set size of this process, from /proc.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

#[test]
fn dram_budgets_at_the_limits_of_u64_do_not_abort_or_take_memory() {
    let dir = TempDir::new("budget");
    for (i, dram) in [1u64 << 40, 1 << 63, u64::MAX].into_iter().enumerate() {
        let path = dir.join(&format!("region-{i}"));
        let before = rss_bytes();
        let mut o = Options::new(dram);
        o.ways = 0; // fully associative: the cache is one set of the budget
        let n = Nvmm::open_with(&path, MB, o).unwrap_or_else(|e| panic!("dram {dram}: {e}"));
        let grew = rss_bytes().saturating_sub(before);
        println!("dram_bytes {dram}: RSS grew by {grew} bytes");
        assert!(grew < 32 * MB, "dram {dram}: RSS grew by {grew} bytes");
        let s = n.stats();
        assert_eq!(s.capacity_blocks, MB / 8192, "the budget is the region");
        n.write(MB - 8, b"last8byt").unwrap();
        let mut got = [0u8; 8];
        n.read(MB - 8, &mut got).unwrap();
        assert_eq!(&got, b"last8byt");
        n.close().unwrap();
    }
}

#[test]
fn regions_beyond_the_limit_fail_before_anything_is_written() {
    let dir = TempDir::new("huge");
    let path = dir.join("petabyte");
    for size in [1u64 << 50, u64::MAX] {
        let e = Nvmm::open(&path, size, 64 * MB).err().expect("must fail");
        println!("{size}: {e}");
        assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
        assert!(e.context.contains("exceeds the largest"), "{e}");
        assert!(dir.names().is_empty(), "debris: {:?}", dir.names());
    }
    // A later open of the path with a sane size works (nothing was left).
    let n = Nvmm::open(&path, MB, 256 << 10).unwrap();
    n.close().unwrap();
    // An existing log opened with another size is refused, untouched.
    let len = std::fs::metadata(&path).unwrap().len();
    let e = Nvmm::open(&path, 2 * MB, 256 << 10).err().unwrap();
    assert_eq!(e.kind, ErrorKind::BadFile, "{e}");
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    // Too small a budget and too deep a prefetch are errors too.
    let e = Nvmm::open(dir.join("tiny"), MB, 4096).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    let mut o = Options::new(MB);
    o.prefetch_blocks = 1 << 20;
    let e = Nvmm::open_with(dir.join("deep"), MB, o).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert_eq!(dir.names(), vec!["petabyte".to_string()], "no debris");
}
