//! libnvmm never reports durability it does not have (issue 39, cases 4–6):
//!
//! - The backing file truncated (`truncate`) or punched (`fallocate -p`) by
//!   another process under an open region: `sync` and `close` fail with an
//!   error naming the cause, never a token; a miss of a lost block is a
//!   memory error (SIGBUS) for the faulting thread, never zeros.
//! - A fork child gets `ErrorKind::Forked` from every call and no copy of
//!   the region (touching it faults, SIGSEGV), never zeros or a token; the
//!   parent's data is intact after it.
//! - A write-back the file system refuses (ENOSPC on a small tmpfs) is an
//!   error value: the program goes on with its data in memory, `sync`
//!   fails with the cause; it is never aborted.
//! - A data block zeroed in the file is a checksum error (SIGBUS on the
//!   miss, the CRC32C mismatch on stderr), never zeros read back.
//!
//! Data come from a printed seed (`NVMM_TEST_SEED` reproduces). Processes
//! that must die run as children of this binary; mounts are removed even
//! when a test fails. The tmpfs test needs root and fails without it.

use nvmm::testkit::{fast_dir, seed_from_env, Rng, TempPath};
use nvmm::{ErrorKind, Nvmm, Options};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MB: u64 = 1 << 20;
const REGION: u64 = 4 * MB;
/// Far less than the data written: most blocks are evicted, so reading
/// them back goes to the file.
const DRAM: u64 = 256 << 10;
const ROLE_ENV: &str = "NVMM_NEVER_LIES_ROLE";
const PATH_ENV: &str = "NVMM_NEVER_LIES_PATH";
const SEED_ENV: &str = "NVMM_NEVER_LIES_SEED";

fn options() -> Options {
    let mut o = Options::new(DRAM);
    o.ways = 4;
    o
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    (0..len).map(|_| rng.next_u64() as u8).collect()
}

fn seed() -> u64 {
    let s = seed_from_env("NVMM_TEST_SEED");
    println!("seed {s} (NVMM_TEST_SEED reproduces)");
    s
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{program} (util-linux/coreutils) is needed: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A region of REGION bytes with `data` written over its first bytes and synced.
fn written(path: &Path, data: &[u8]) -> Nvmm {
    let n = Nvmm::open_with(path, REGION, options()).unwrap();
    n.write(0, data).unwrap();
    n.sync().expect("the first sync");
    n
}

#[test]
fn a_truncated_backing_file_fails_sync_and_close_with_the_cause() {
    let seed = seed();
    let file = TempPath::new(fast_dir(), "truncated");
    let data = pattern(seed, 2 * MB as usize);
    let n = written(file.path(), &data);
    // Another process cuts the log short under the open region.
    run("truncate", &["-s", "64K", file.path().to_str().unwrap()]);
    n.write(3 * MB, b"after the truncation").unwrap();
    let e = n
        .sync()
        .expect_err("sync returned a token over a truncated file");
    println!("sync: {e}");
    assert_eq!(e.kind, ErrorKind::BadFile, "{e}");
    assert!(e.context.contains("truncated"), "{e}");
    let again = n.close().expect_err("close returned a token");
    assert_eq!(again, e, "close names the same cause");
}

/// The child of the SIGBUS tests: open the region at PATH_ENV and read all
/// of it, comparing with the pattern; prints what it read if it survives.
#[test]
fn reader_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("reader") {
        return;
    }
    let path = PathBuf::from(std::env::var_os(PATH_ENV).unwrap());
    let seed: u64 = std::env::var(SEED_ENV).unwrap().parse().unwrap();
    let n = Nvmm::open_with(&path, 0, options()).unwrap();
    let want = pattern(seed, 2 * MB as usize);
    let mut got = vec![0u8; want.len()];
    n.read(0, &mut got).unwrap();
    println!("read back, equal={}", got == want);
}

/// The child of the punch test: write, sync, have the data punched out by
/// `fallocate`, try to sync, then read a lost block.
#[test]
fn puncher_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("puncher") {
        return;
    }
    let path = PathBuf::from(std::env::var_os(PATH_ENV).unwrap());
    let seed: u64 = std::env::var(SEED_ENV).unwrap().parse().unwrap();
    let data = pattern(seed, 2 * MB as usize);
    let n = written(&path, &data);
    // The data area (after the 16 KB of superblock and slots), by another process.
    let len = std::fs::metadata(&path).unwrap().len() - 16384;
    run(
        "fallocate",
        &[
            "-p",
            "-o",
            "16384",
            "-l",
            &len.to_string(),
            path.to_str().unwrap(),
        ],
    );
    n.write(3 * MB, b"after the punch").unwrap();
    match n.sync() {
        Ok(token) => println!("sync after punch: token {token}"),
        Err(e) => println!("sync after punch: error {e}"),
    }
    // At most 32 of its 256 blocks are resident: the others' misses read
    // the punched file.
    let mut back = vec![0u8; data.len()];
    n.read(0, &mut back).unwrap();
    println!("read the punched blocks, equal={}", back == data);
}

fn child(role: &str, path: &Path, seed: u64) -> std::process::Output {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("{role}_entry"),
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, role)
        .env(PATH_ENV, path)
        .env(SEED_ENV, seed.to_string())
        .output()
        .unwrap()
}

#[test]
fn a_punched_backing_file_fails_sync_and_its_misses_are_sigbus() {
    let seed = seed();
    let file = TempPath::new(fast_dir(), "punched");
    let out = child("puncher", file.path(), seed);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("child stdout:\n{stdout}\nchild stderr:\n{stderr}");
    assert!(
        stdout.contains("sync after punch: error") && stdout.contains("punched out"),
        "the sync after the punch must fail naming it"
    );
    assert!(
        !stdout.contains("read the punched blocks"),
        "the punched block was read back as data"
    );
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{:?}", out.status);
    assert!(
        stderr.contains("cannot be read back"),
        "the cause is on stderr"
    );
}

#[test]
fn a_zeroed_data_block_is_a_checksum_error_not_zeros() {
    use std::os::unix::fs::FileExt;
    let seed = seed();
    let file = TempPath::new(fast_dir(), "zeroed");
    let data = pattern(seed, 2 * MB as usize);
    written(file.path(), &data).close().unwrap();
    // Zero every flash page that holds the region's first block: the one
    // write and sync leave it in the log twice (at the same two offsets,
    // 64 KiB apart, on every run; counted below), and the reader takes the
    // newest copy, so zeroing one of them tests nothing.
    let log = std::fs::read(file.path()).unwrap();
    let pages: Vec<usize> = (16384..log.len() - 8192)
        .step_by(8192)
        .filter(|&at| log[at..at + 8192] == data[..8192])
        .collect();
    println!("copies of the first block in the log: {pages:?}");
    assert!(!pages.is_empty(), "the first block is in the log");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(file.path())
        .unwrap();
    for page in pages {
        f.write_all_at(&[0u8; 8192], page as u64).unwrap();
    }
    drop(f);
    let out = child("reader", file.path(), seed);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("child stdout:\n{stdout}\nchild stderr:\n{stderr}");
    assert!(
        !stdout.contains("read back"),
        "the zeroed block was read as data"
    );
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{:?}", out.status);
    assert!(stderr.contains("CRC32C"), "the checksum mismatch is named");
}

#[test]
fn a_fork_child_gets_errors_not_zeros_and_the_parent_keeps_its_data() {
    let seed = seed();
    let file = TempPath::new(fast_dir(), "fork");
    let data = pattern(seed, 2 * MB as usize);
    let n = written(file.path(), &data);
    let base = n.as_ptr() as usize;
    // SAFETY: the child calls into libnvmm (which must refuse) and exits
    // with _exit; it touches no lock the parent's threads may hold.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = match n.sync() {
            Err(e) if e.kind == ErrorKind::Forked => match n.read(0, &mut [0u8; 16]) {
                Err(e) if e.kind == ErrorKind::Forked => 0,
                _ => 2,
            },
            _ => 1,
        };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    assert!(pid > 0, "fork");
    let mut status = 0;
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the child's sync/read did not fail with Forked (status {status:#x})"
    );
    // A child that touches the region's memory gets no zeros: it is not mapped.
    // SAFETY: as above; the child reads one byte and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: a read of the parent's mapping address, which the child
        // does not have (MADV_DONTFORK): it faults.
        let byte = unsafe { std::ptr::read_volatile((base + 3 * 8192) as *const u8) };
        // SAFETY: as above.
        unsafe { libc::_exit(if byte == 0 { 3 } else { 4 }) };
    }
    assert!(pid > 0, "fork");
    // SAFETY: waits for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGSEGV,
        "the child read the region (status {status:#x}): exit 3 is zeros, 4 data"
    );
    n.close().unwrap();
    let n = Nvmm::open_with(file.path(), 0, options()).unwrap();
    let mut back = vec![0u8; data.len()];
    n.read(0, &mut back).unwrap();
    assert!(back == data, "the parent's data changed");
    n.close().unwrap();
}

/// A tmpfs of `bytes` mounted for the test, removed when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(bytes: u64) -> SmallFs {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(unsafe { libc::geteuid() }, 0, "mounting a tmpfs needs root");
        let dir = std::env::temp_dir().join(format!("daemon-nvmm-enospc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fs = SmallFs(dir);
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                &format!("size={bytes}"),
                "tmpfs",
                fs.0.to_str().unwrap(),
            ],
        );
        fs
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn a_refused_write_back_is_an_error_value_not_an_abort() {
    let seed = seed();
    let fs = SmallFs::mount(MB);
    let path = fs.0.join("region");
    let n = Nvmm::open_with(&path, REGION, options()).unwrap();
    // 3 MB through 256 KB of DRAM on a 1 MB file system: evictions need
    // write-backs the file system refuses.
    let data = pattern(seed, 3 * MB as usize);
    n.write(0, &data).unwrap();
    let mut back = vec![0u8; data.len()];
    n.read(0, &mut back).unwrap();
    assert!(back == data, "the program's data changed in memory");
    let e = n
        .sync()
        .expect_err("sync returned a token with writes refused");
    println!("sync: {e}");
    assert_eq!(e.kind, ErrorKind::Io, "{e}");
    assert!(e.context.contains("No space left"), "{e}");
    let again = n.close().expect_err("close returned a token");
    assert_eq!(again, e);
}
