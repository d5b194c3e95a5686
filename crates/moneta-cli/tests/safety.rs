//! Direct-path data safety (issue 8), each scenario as a user met it:
//! programs through `moneta run` (the shim) beside plain programs on the
//! same Moneta file system. Needs root and loop devices; every mount is torn
//! down even when a test fails.
//!
//! 1. A layout change of a granted file (truncate and regrow, hole punch),
//!    by a shim process or a plain one, must not let the holder's later
//!    direct writes land in the blocks another file reuses.
//! 2. fork: parent and child share the open file description's offset.
//! 3. mmap: a mapping sees direct writes made before it, and direct writes
//!    made while it exists; stores through it are never lost to stale pages.
//! 4. O_DIRECT descriptors write into holes and past the end of the file.
//! 5. errno survives: ENOSPC from growing a file reaches the program.

mod common;

use common::{ok, Mounted};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};

const MIB: usize = 1 << 20;

fn python(m: &Mounted, script: &str, args: &[&str]) -> Command {
    let mut a = vec!["-c", script];
    a.extend_from_slice(args);
    m.run("python3", &a)
}

fn plain_python(script: &str, args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    c.arg("-c").arg(script).args(args);
    c
}

/// Physical byte ranges of a file's extents (xfs_io's FIEMAP, 512-byte units).
fn physical_ranges(path: &Path) -> Vec<(u64, u64)> {
    let out = ok(
        Command::new("xfs_io")
            .args(["-r", "-c", "fiemap"])
            .arg(path)
            .output()
            .unwrap(),
        "xfs_io fiemap",
    );
    out.lines()
        .filter_map(|l| {
            let phys = l.split(':').nth(2)?.trim();
            let (a, b) = phys.split_once("..")?;
            Some((
                a.parse::<u64>().ok()? * 512,
                (b.parse::<u64>().ok()? + 1) * 512,
            ))
        })
        .collect()
}

fn overlaps(a: &[(u64, u64)], b: &[(u64, u64)]) -> bool {
    a.iter()
        .any(|&(x0, x1)| b.iter().any(|&(y0, y1)| x0 < y1 && y0 < x1))
}

/// Write back and drop every cached page, so reads see the medium.
fn drop_caches() {
    ok(Command::new("sync").output().unwrap(), "sync");
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
}

/// Every 8-byte word of the file, as a histogram of tags.
fn tags(path: &Path) -> std::collections::BTreeMap<Vec<u8>, usize> {
    let data = std::fs::read(path).unwrap();
    let mut h = std::collections::BTreeMap::new();
    for w in data.chunks(8) {
        *h.entry(w.to_vec()).or_insert(0) += 1;
    }
    h
}

/// The holder: writes 4 MiB to X through the shim, reads and rewrites some
/// of it directly (so it holds write records, and its map covers all of
/// X: its second write needs no soft miss), says "ready", waits for a
/// line, writes 4 MiB again, fsyncs, says "done".
const HOLDER: &str = r#"
import os, sys
path, size = sys.argv[1], int(sys.argv[2])
MiB = 1 << 20
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
one = b"AAAAAAA1" * (size // 8)
os.pwrite(fd, one, 0)
os.fsync(fd)
# Created through the kernel; reopened, the shim serves it directly.
os.close(fd)
fd = os.open(path, os.O_RDWR)
assert os.pread(fd, 4096, 0) == one[:4096]
os.pwrite(fd, one[:65536], 65536)
print("ready", flush=True)
sys.stdin.readline()
os.pwrite(fd, b"AAAAAAA2" * (4 * MiB // 8), 0)
os.fsync(fd)
print("done", flush=True)
"#;

/// Fill the file system with file Y (all but `spare` bytes of its free space).
const FILLER: &str = r#"
import os, sys
path, spare = sys.argv[1], int(sys.argv[2])
st = os.statvfs(os.path.dirname(path))
size = max(st.f_bavail * st.f_frsize - spare, 0) // (1 << 20) * (1 << 20)
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
chunk = b"YYYYYYYY" * (1 << 17)
for at in range(0, size, len(chunk)):
    os.pwrite(fd, chunk, at)
os.fsync(fd)
os.close(fd)
print(size)
"#;

/// Kills a child process if the test fails before it ends.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Scenario 1 with `change` (a layout change run while the holder holds
/// X): the file system then gives X's freed blocks to Y, X regrows (sparse)
/// to its old size, and the holder writes X again through the mapping it
/// had. Afterwards Y holds only Y's bytes and X only the holder's second
/// write.
fn layout_change_then_reuse(fs: &str, name: &str, change: &dyn Fn(&Mounted, &Path)) {
    layout_change_then_reuse_after(fs, name, &|_, _| {}, change, true);
}

/// How monetad learns of the change in [`layout_change_then_reuse_with`].
#[derive(Clone, Copy, PartialEq)]
enum Guard {
    /// fanotify and the block-free tracepoints (the default).
    Both,
    /// The file systems' block-free tracepoints alone (MONETA_GUARD).
    Tracepoints,
}

/// [`layout_change_then_reuse`], running `before` ahead of the holder;
/// `seen`: monetad must have been told of the change (else it must have
/// kept the holder off the device for the file).
fn layout_change_then_reuse_after(
    fs: &str,
    name: &str,
    before: &dyn Fn(&Mounted, &Path),
    change: &dyn Fn(&Mounted, &Path),
    seen: bool,
) {
    layout_change_then_reuse_with(fs, name, before, change, seen, Guard::Both);
}

fn layout_change_then_reuse_with(
    fs: &str,
    name: &str,
    before: &dyn Fn(&Mounted, &Path),
    change: &dyn Fn(&Mounted, &Path),
    seen: bool,
    guard: Guard,
) {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    // ext4 spreads a new file over its block groups: a small file system
    // and a big X make Y's blocks overlap X's old ones.
    let (fs_size, x_bytes) = match fs {
        "ext4" => ("128M", 64 * MIB),
        _ => ("512M", 4 * MIB),
    };
    let env: &[(&str, &str)] = match guard {
        Guard::Both => &[],
        Guard::Tracepoints => &[("MONETA_GUARD", "tracepoints")],
    };
    let m = Mounted::up_with(name, fs, fs_size, env, &[]);
    let x = m.path("x");
    let y = m.path("y");
    before(&m, &x);
    let mut holder = Reaper(
        python(&m, HOLDER, &[x.to_str().unwrap(), &x_bytes.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(holder.0.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let before = m.device_requests();
    assert_eq!(
        before > 0,
        seen,
        "the holder reached the device: {before} requests (expected: {seen})"
    );
    let x_blocks = physical_ranges(&x);
    // Which counter says monetad saw the change.
    let counter = match guard {
        Guard::Both => "layout_changes",
        Guard::Tracepoints => "block_free_revocations",
    };
    let changes_before = m.stats()["files"][counter].as_u64().unwrap();
    change(&m, &x);
    assert!(
        !seen || m.stats()["files"][counter].as_u64().unwrap() > changes_before,
        "monetad did not see the layout change ({counter})"
    );
    // The freeing transaction commits (ext4 reuses blocks only after).
    ok(Command::new("sync").output().unwrap(), "sync");
    ok(
        plain_python(FILLER, &[y.to_str().unwrap(), &(8 * MIB).to_string()])
            .output()
            .unwrap(),
        "filling the file system",
    );
    assert!(
        overlaps(&x_blocks, &physical_ranges(&y)),
        "the file system did not reuse X's freed blocks for Y: the scenario did not happen"
    );
    ok(
        Command::new("truncate")
            .args(["-s", "4M"])
            .arg(&x)
            .output()
            .unwrap(),
        "regrowing X",
    );
    let mut stdin = holder.0.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "done");
    assert!(holder.0.wait().unwrap().success(), "the holder failed");
    drop_caches();
    let y_tags = tags(&y);
    assert_eq!(
        y_tags.keys().collect::<Vec<_>>(),
        [&b"YYYYYYYY".to_vec()],
        "Y holds bytes it never wrote: {:?}",
        y_tags
            .iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), *v))
            .collect::<Vec<_>>()
    );
    let x_tags = tags(&x);
    assert_eq!(
        x_tags.get(b"AAAAAAA2".as_slice()).copied(),
        Some(4 * MIB / 8),
        "X lost the holder's write: {:?}",
        x_tags
            .iter()
            .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), *v))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_shim_process_truncating_a_held_file_revokes_the_holder() {
    layout_change_then_reuse("xfs", "shim-truncate", &|m, x| {
        let script = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.ftruncate(fd, 0)
os.close(fd)
"#;
        ok(
            python(m, script, &[x.to_str().unwrap()]).output().unwrap(),
            "ftruncate through the shim",
        );
    });
}

/// A plain program (`args`, then the file) as the layout change.
fn plain_change(args: &'static [&'static str]) -> impl Fn(&Mounted, &Path) {
    move |_, x| {
        ok(
            Command::new(args[0])
                .args(&args[1..])
                .arg(x)
                .output()
                .unwrap(),
            &args.join(" "),
        );
    }
}

#[test]
fn a_plain_truncate_of_a_held_file_revokes_the_holder() {
    layout_change_then_reuse(
        "xfs",
        "plain-truncate",
        &plain_change(&["truncate", "-s", "0"]),
    );
}

#[test]
fn a_plain_hole_punch_in_a_held_file_revokes_the_holder() {
    layout_change_then_reuse(
        "xfs",
        "plain-punch",
        &plain_change(&[
            "fallocate",
            "--punch-hole",
            "--offset",
            "0",
            "--length",
            "4194304",
        ]),
    );
}

/// The block-free tracepoints alone (fanotify off) keep the holder out of
/// blocks a plain process freed: the guard for frees that no open, access
/// or ioctl hook reports.
#[test]
fn block_free_tracepoints_alone_revoke_the_holder_on_xfs() {
    layout_change_then_reuse_with(
        "xfs",
        "tracepoints-xfs",
        &|_, _| {},
        &plain_change(&["truncate", "-s", "0"]),
        true,
        Guard::Tracepoints,
    );
}

#[test]
fn block_free_tracepoints_alone_revoke_the_holder_on_ext4() {
    layout_change_then_reuse_with(
        "ext4",
        "tracepoints-ext4",
        &|_, _| {},
        &plain_change(&["truncate", "-s", "0"]),
        true,
        Guard::Tracepoints,
    );
}

#[test]
fn a_plain_truncate_of_a_held_file_on_ext4_revokes_the_holder() {
    layout_change_then_reuse(
        "ext4",
        "plain-truncate-ext4",
        &plain_change(&["truncate", "-s", "0"]),
    );
}

#[test]
fn a_forked_child_shares_the_file_offset() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("fork", "xfs", "512M");
    let f = m.path("f");
    // Allocated and flushed first, so the writes below go to the device.
    std::fs::write(&f, vec![b'.'; 64 << 10]).unwrap();
    let script = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.write(fd, b"P" * 4096)
pid = os.fork()
if pid == 0:
    os.write(fd, b"C" * 4096)
    os._exit(0)
os.waitpid(pid, 0)
os.write(fd, b"Q" * 4096)
print(os.lseek(fd, 0, os.SEEK_CUR))
os.fsync(fd)
"#;
    let out = ok(
        python(&m, script, &[f.to_str().unwrap()]).output().unwrap(),
        "fork through the shim",
    );
    assert_eq!(
        out.trim(),
        "12288",
        "the kernel's offset after three writes"
    );
    drop_caches();
    let data = std::fs::read(&f).unwrap();
    assert_eq!(&data[..4096], &[b'P'; 4096][..]);
    assert_eq!(&data[4096..8192], &[b'C'; 4096][..], "the child's write");
    assert_eq!(&data[8192..12288], &[b'Q'; 4096][..]);
    assert!(data[12288..].iter().all(|&b| b == b'.'));
}

#[test]
fn mappings_see_direct_writes_and_lose_nothing() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("mmap", "xfs", "512M");
    let f = m.path("f");
    std::fs::write(&f, vec![b'.'; 1 << 20]).unwrap();
    let script = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
# A direct write, then a mapping must show it.
os.pwrite(fd, b"D" * 4096, 0)
mp = mmap.mmap(fd, 1 << 20)
assert mp[:4096] == b"D" * 4096, "mapping after a direct write"
# Writes while mapped: the mapping and read(2) see them.
os.pwrite(fd, b"E" * 4096, 8192)
os.fsync(fd)
assert mp[8192:12288] == b"E" * 4096, "mapping after pwrite"
assert os.pread(fd, 4096, 8192) == b"E" * 4096
# A store through the mapping: written back, nothing else changed.
mp[100:101] = b"Z"
mp.flush()
mp.close()
os.pwrite(fd, b"F" * 4096, 16384)
os.fsync(fd)
os.close(fd)
"#;
    ok(
        python(&m, script, &[f.to_str().unwrap()]).output().unwrap(),
        "mmap through the shim",
    );
    drop_caches();
    let data = std::fs::read(&f).unwrap();
    let mut want = vec![b'.'; 1 << 20];
    want[..4096].fill(b'D');
    want[100] = b'Z';
    want[8192..12288].fill(b'E');
    want[16384..20480].fill(b'F');
    let diff = (0..want.len()).find(|&i| data[i] != want[i]);
    assert_eq!(diff, None, "first difference at {diff:?}");
}

#[test]
fn a_plain_mapping_sees_a_shim_writers_fsynced_data() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("mmap-plain", "xfs", "512M");
    let f = m.path("f");
    std::fs::write(&f, vec![b'.'; 1 << 20]).unwrap();
    let writer = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
os.pwrite(fd, b"W" * 8192, 4096)
os.fsync(fd)
"#;
    ok(
        python(&m, writer, &[f.to_str().unwrap()]).output().unwrap(),
        "direct write",
    );
    let reader = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
mp = mmap.mmap(fd, 1 << 20, prot=mmap.PROT_READ)
print(mp[4096:12288] == b"W" * 8192)
"#;
    let out = ok(
        plain_python(reader, &[f.to_str().unwrap()])
            .output()
            .unwrap(),
        "plain mapping",
    );
    assert_eq!(
        out.trim(),
        "True",
        "a plain mapping after the writer's fsync"
    );
}

#[test]
fn o_direct_writes_fill_holes_and_grow_files() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("odirect", "xfs", "512M");
    let src = m.path("src");
    let dst = m.path("dst");
    let data: Vec<u8> = (0..(2 * MIB) as u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    // Past the end, then into a hole left behind.
    ok(
        m.run(
            "dd",
            &[
                &format!("if={}", src.display()),
                &format!("of={}", dst.display()),
                "bs=64k",
                "count=16",
                "skip=16",
                "seek=16",
                "oflag=direct",
                "conv=notrunc",
                "status=none",
            ],
        )
        .output()
        .unwrap(),
        "dd oflag=direct past the end",
    );
    ok(
        m.run(
            "dd",
            &[
                &format!("if={}", src.display()),
                &format!("of={}", dst.display()),
                "bs=64k",
                "count=16",
                "oflag=direct",
                "conv=notrunc",
                "status=none",
            ],
        )
        .output()
        .unwrap(),
        "dd oflag=direct into the hole",
    );
    drop_caches();
    assert!(std::fs::read(&dst).unwrap() == data, "dst differs from src");
    let out = ok(
        m.run(
            "fio",
            &[
                "--name=direct",
                &format!("--filename={}", m.path("fio.dat").display()),
                "--ioengine=psync",
                "--direct=1",
                "--rw=randwrite",
                "--bs=4k",
                "--size=8m",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_state_save=0", // no state file left in the working directory
                "--output-format=json",
            ],
        )
        .output()
        .unwrap(),
        "fio --direct=1",
    );
    let v: serde_json::Value = serde_json::from_str(&out[out.find('{').unwrap()..]).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0, "fio --direct=1 reports an error");
    assert_eq!(v["jobs"][0]["read"]["io_bytes"], 8 << 20, "all verified");
}

#[test]
fn a_full_file_system_says_enospc() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("enospc", "ext4", "64M");
    let f = m.path("big");
    let script = r#"
import errno, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
chunk = b"x" * (1 << 20)
at = 0
try:
    while at < (1 << 30):
        os.pwrite(fd, chunk, at)
        os.fsync(fd)
        at += len(chunk)
    print("no error")
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
"#;
    let out = ok(
        python(&m, script, &[f.to_str().unwrap()]).output().unwrap(),
        "filling the file system",
    );
    assert_eq!(out.trim(), "ENOSPC");
    // Holes inside a file the direct path serves (not one being created),
    // filled once space is gone.
    let script = r#"
import errno, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 256 << 20)
os.fsync(fd)
try:
    for at in range(0, 256 << 20, 1 << 20):
        os.pwrite(fd, b"y" * 4096, at)
    os.fsync(fd)
    print("no error")
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
"#;
    let out = ok(
        python(&m, script, &[m.path("sparse").to_str().unwrap()])
            .output()
            .unwrap(),
        "writing into a hole on a full file system",
    );
    assert_eq!(out.trim(), "ENOSPC");
    let sqlite = m
        .run("sqlite3", &[m.path("db").to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut sqlite = sqlite;
    sqlite
        .stdin
        .take()
        .unwrap()
        .write_all(b"CREATE TABLE t(x);\nINSERT INTO t VALUES(randomblob(1000000));\n")
        .unwrap();
    let o = sqlite.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("full") && !err.contains("I/O error"),
        "sqlite3 should say the disk is full: {err}"
    );
}

#[test]
fn a_plain_process_that_opened_the_file_before_it_was_held_is_seen() {
    // The kernel decides at open whether an open file will report its
    // accesses: this puncher opens X for writing before any shim process
    // holds it (and so before X is watched). A writer outside the shim may
    // move blocks with calls no event reports (xfs_fsr's swapext), so
    // monetad, finding it in /proc at X's first watch, keeps every channel
    // on the kernel path for X while it has X open (README, "Direct-path
    // contract"): the holder never reaches the device, and the punch
    // cannot reach its blocks.
    const PUNCHER: &str = r#"
import ctypes, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
print("open", flush=True)
sys.stdin.readline()
assert ctypes.CDLL(None).fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(4 << 20)) == 0
os.fsync(fd)
"#;
    let puncher = std::cell::RefCell::new(None::<Reaper>);
    layout_change_then_reuse_after(
        "xfs",
        "early-opener",
        &|_, x| {
            let mut p = Reaper(
                plain_python(PUNCHER, &[x.to_str().unwrap()])
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            let mut line = String::new();
            BufReader::new(p.0.stdout.take().unwrap())
                .read_line(&mut line)
                .unwrap();
            assert_eq!(line.trim(), "open");
            *puncher.borrow_mut() = Some(p);
        },
        &|_, _| {
            let mut p = puncher.borrow_mut().take().expect("the early opener");
            writeln!(p.0.stdin.take().unwrap(), "go").unwrap();
            assert!(p.0.wait().unwrap().success(), "the punch failed");
        },
        false,
    );
}

#[test]
fn a_plain_mapping_and_a_direct_holder_see_each_others_writes() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("mmap-mixed", "xfs", "512M");
    let f = m.path("f");
    std::fs::write(&f, vec![b'.'; 1 << 20]).unwrap();
    // The holder reads directly first (it holds records), then waits.
    let holder = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
assert os.pread(fd, 4096, 0) == b"." * 4096
print("holding", flush=True)
sys.stdin.readline()
seen = os.pread(fd, 4, 4096)
os.pwrite(fd, b"H" * 4096, 8192)
os.fsync(fd)
print(seen.decode(), flush=True)
sys.stdin.readline()
"#;
    let mapper = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
mp = mmap.mmap(fd, 1 << 20)
mp[4096:4100] = b"MMAP"
mp.flush()
print("stored", flush=True)
sys.stdin.readline()
print(mp[8192:8196].decode(), flush=True)
"#;
    let mut h = Reaper(
        python(&m, holder, &[f.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut h_out = BufReader::new(h.0.stdout.take().unwrap()).lines();
    let mut h_in = h.0.stdin.take().unwrap();
    assert_eq!(h_out.next().unwrap().unwrap(), "holding");
    assert!(
        m.device_requests() > 0,
        "the holder is not on the direct path"
    );
    let mut p = Reaper(
        plain_python(mapper, &[f.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut p_out = BufReader::new(p.0.stdout.take().unwrap()).lines();
    let mut p_in = p.0.stdin.take().unwrap();
    assert_eq!(p_out.next().unwrap().unwrap(), "stored");
    writeln!(h_in, "go").unwrap();
    assert_eq!(
        h_out.next().unwrap().unwrap(),
        "MMAP",
        "the holder read around a plain process's store through its mapping"
    );
    writeln!(p_in, "go").unwrap();
    assert_eq!(
        p_out.next().unwrap().unwrap(),
        "HHHH",
        "the mapping missed the holder's write"
    );
    assert!(m.stats()["files"]["inodes_mapped"].as_u64().unwrap() >= 1);
    writeln!(h_in, "done").unwrap();
    assert!(p.0.wait().unwrap().success() && h.0.wait().unwrap().success());
}

#[test]
fn forking_while_another_thread_does_direct_io_does_not_hang_the_child() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("fork-threads", "xfs", "512M");
    for name in ["busy", "child"] {
        std::fs::write(m.path(name), vec![b'.'; 1 << 20]).unwrap();
    }
    // One thread reads one file directly without pause (and opens and
    // closes files, taking the shim's table and channel locks) while the
    // main thread forks; each child writes the other file and exits.
    let script = r#"
import os, sys, threading
busy, child = sys.argv[1], sys.argv[2]
stop = False
def reader():
    while not stop:
        fd = os.open(busy, os.O_RDONLY)
        for i in range(64):
            os.pread(fd, 4096, (i * 4096) % (1 << 20))
        os.close(fd)
t = threading.Thread(target=reader)
t.start()
cfd = os.open(child, os.O_RDWR)
for i in range(40):
    pid = os.fork()
    if pid == 0:
        os.pwrite(cfd, b"%04d" % i, i * 4)
        os.fsync(cfd)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert status == 0, status
stop = True
t.join()
print(os.pread(cfd, 160, 0).decode())
"#;
    let mut c = m
        .run(
            "timeout",
            &[
                "60",
                "python3",
                "-c",
                script,
                m.path("busy").to_str().unwrap(),
                m.path("child").to_str().unwrap(),
            ],
        )
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(c.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert!(
        c.wait().unwrap().success(),
        "a forked child hung or failed: {out}"
    );
    let want: String = (0..40).map(|i| format!("{i:04}")).collect();
    assert_eq!(out.trim(), want, "every child's write is there");
}
