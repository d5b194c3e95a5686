//! Scripted schedules: each class of data loss issue 20 found, as the
//! exact sequence that lost data, checked against what the kernel alone
//! gives (README, "Direct-path contract"). The random runs find new
//! classes; these keep the known ones closed, deterministically.
//!
//! Every scenario runs its shim parts through `moneta run` and its plain
//! parts in this process (or a plain child), then reads the files back
//! after dropping their cached pages.

use crate::ctx::Ctx;
use crate::error::Result;
use crate::pattern::{self, stamped};
use crate::sys;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const SCENARIOS: &[&str] = &[
    "exec-after-open",
    "mmap-beside-shim",
    "fork-position",
    "defragment",
    "loop-discard",
    "sparse-writers",
    "many-files",
    "near-full",
];

/// Every scenario: issue 20's classes, then issue 42's.
pub fn all() -> Vec<&'static str> {
    SCENARIOS
        .iter()
        .chain(crate::fd_scenarios::SCENARIOS)
        .copied()
        .collect()
}

/// Run one scenario: Ok(what was checked) or Err(what was lost).
pub fn run(name: &str, c: &Ctx) -> Result<String> {
    let _ = std::fs::remove_dir_all(&c.dir);
    std::fs::create_dir_all(&c.dir).map_err(|e| e.to_string())?;
    if let Some(r) = crate::fd_scenarios::run(name, c) {
        if r.is_ok() {
            let _ = std::fs::remove_dir_all(&c.dir);
        }
        return r.map_err(crate::error::Error::from);
    }
    let r = match name {
        "exec-after-open" => exec_after_open(c),
        "mmap-beside-shim" => mmap_beside_shim(c),
        "fork-position" => fork_position(c),
        "defragment" => defragment(c),
        "loop-discard" => loop_discard(c),
        "sparse-writers" => sparse_writers(c),
        "many-files" => many_files(c),
        "near-full" => near_full(c),
        other => Err(format!("no scenario {other:?} ({})", all().join(", ")).into()),
    };
    if r.is_ok() {
        let _ = std::fs::remove_dir_all(&c.dir);
    }
    r
}

fn plain_file(p: &Path, bytes: &[u8]) -> Result<()> {
    std::fs::write(p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
    std::fs::File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(crate::error::Error::from)
}

fn read_back(p: &Path) -> Result<Vec<u8>> {
    crate::read_path(p)
}

fn expect_eq(what: &str, got: &[u8], want: &[u8]) -> Result<()> {
    match crate::first_difference(got, want) {
        None => Ok(()),
        Some(d) => Err(crate::error::Error::lost(format!("{what}: {d}"))),
    }
}

/// Class 2: a descriptor opened and written through the shim, a child that
/// execs (with and without the shim) writes after it, the parent syncs.
fn exec_after_open(c: &Ctx) -> Result<String> {
    for shim_child in [true, false] {
        let f = c.path(&format!("exec-{shim_child}"));
        plain_file(&f, &vec![0u8; 64 << 10])?;
        c.shim(&[
            "exec-parent",
            f.to_str().unwrap_or(""),
            if shim_child { "shim" } else { "plain" },
        ])?;
        let mut want = vec![0u8; 64 << 10];
        want[..100].copy_from_slice(&stamped(100, 1, 0, 1));
        want[100..104].copy_from_slice(&stamped(4, 1, 100, 2));
        expect_eq(
            &format!(
                "child {}",
                if shim_child {
                    "with the shim"
                } else {
                    "without it"
                }
            ),
            &read_back(&f)?,
            &want,
        )?;
    }
    Ok("the parent's write and the exec'd child's write (with and without the shim) are both on the file".into())
}

/// Class 3: a plain process maps a file and touches it; a shim process
/// pwrites and fsyncs; the mapping then stores and msyncs.
fn mmap_beside_shim(c: &Ctx) -> Result<String> {
    let f = c.path("mapped");
    plain_file(&f, &vec![0u8; 64 << 10])?;
    let fd = sys::open(&f, libc::O_RDWR).map_err(|e| format!("open: {e}"))? as i32;
    // SAFETY: a shared mapping of the 64 KiB file, touched, later stored into.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            64 << 10,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err("mmap failed".into());
    }
    let p = p.cast::<u8>();
    // SAFETY: inside the mapping.
    let touched: u64 = (0..16).map(|i| unsafe { *p.add(i * 4096) } as u64).sum();
    let result = (|| {
        c.shim(&["pwrite-sync", f.to_str().unwrap_or(""), "0", "1024", "5"])?;
        let store = stamped(16, 1, 2048, 6);
        // SAFETY: bytes 2048..2064 lie inside the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(store.as_ptr(), p.add(2048), 16);
            libc::msync(p.cast(), 64 << 10, libc::MS_SYNC);
        }
        let mut want = vec![0u8; 64 << 10];
        want[..1024].copy_from_slice(&stamped(1024, 1, 0, 5));
        want[2048..2064].copy_from_slice(&store);
        expect_eq("after the mapping's msync", &read_back(&f)?, &want)
    })();
    // SAFETY: our mapping and descriptor.
    unsafe {
        libc::munmap(p.cast(), 64 << 10);
    }
    sys::close(fd);
    result.map(|()| {
        format!("the shim's synced write survives the mapping's write-back (touched {touched})")
    })
}

/// Class 4: parent and child write 3,000 records each through one
/// descriptor (one file position).
fn fork_position(c: &Ctx) -> Result<String> {
    let f = c.path("records");
    plain_file(&f, &vec![0u8; 6000 * 64])?;
    let out = c.shim(&["fork-records", f.to_str().unwrap_or(""), "3000"])?;
    let got = read_back(&f)?;
    let mut seen = std::collections::BTreeSet::new();
    for rec in got.chunks(64) {
        if let Some((_, idx, _)) = pattern::parse(rec) {
            if rec == stamped(64, 9, idx as u64 / 4 * 64, 1).as_slice() {
                seen.insert(idx);
            }
        }
    }
    if seen.len() != 6000 {
        return Err(format!("{} of 6000 records are in the file ({out})", seen.len()).into());
    }
    Ok("6000 of 6000 records written through a shared descriptor by parent and child".into())
}

/// Fill the file system with a plain writer; the fillers (to remove).
fn fill(dir: &Path) -> Vec<PathBuf> {
    crate::fill_disk(dir)
}

/// Whether any filler holds a byte that is not its own.
fn check_fillers(fills: &[PathBuf]) -> Result<()> {
    for f in fills {
        let b = read_back(f)?;
        if let Some(i) = b.iter().position(|&x| x != crate::FILL_BYTE) {
            return Err(format!(
                "{}: foreign bytes at {i} (unit {:?}): a write reached freed blocks",
                f.display(),
                b.get(i / 16 * 16..i / 16 * 16 + 16)
                    .and_then(pattern::parse)
            )
            .into());
        }
    }
    Ok(())
}

/// The model a writer step leaves: (block, version) per line.
fn model_blocks(p: &Path) -> Vec<(u64, u32)> {
    crate::pairs(p)
        .into_iter()
        .map(|(b, v)| (b, v as u32))
        .collect()
}

fn check_blocks(f: &Path, model: &[(u64, u32)], id: u16) -> Result<usize> {
    let got = read_back(f)?;
    for &(b, v) in model {
        let at = (b * 4096) as usize;
        let want = stamped(4096, id, b * 4096, v);
        if got.get(at..at + 4096) != Some(&want[..]) {
            return Err(format!(
                "{}: block {b} lost its synced version {v} (holds {:?})",
                f.display(),
                got.get(at..at + 16).and_then(pattern::parse)
            )
            .into());
        }
    }
    Ok(model.len())
}

/// Class 5: a shim process rewrites and syncs blocks of a fragmented file
/// while xfs_fsr (or e4defrag) defragments it; then a plain process fills
/// the disk. Every synced block must be in the file, no filler may hold
/// the writer's bytes.
fn defragment(c: &Ctx) -> Result<String> {
    let fs = crate::fs_type(&c.mount);
    let tool = if fs == "ext4" { "e4defrag" } else { "xfs_fsr" };
    let f = c.path("fragmented");
    let model = c.path("fragmented.model");
    make_fragmented(&f)?;
    let moves_before = crate::daemon_counter(&c.moneta, &c.mount, "foreign_writers").unwrap_or(0);
    let mut writer = c
        .spawn_shim(&[
            "frag-writer",
            f.to_str().unwrap_or(""),
            "2",
            model.to_str().unwrap_or(""),
        ])
        .map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    let mut runs = 0;
    while writer.try_wait().map_err(|e| e.to_string())?.is_none()
        && t0.elapsed() < Duration::from_secs(60)
    {
        if f.exists() {
            let _ = Command::new(tool).arg(&f).output();
            runs += 1;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let status = writer.wait().map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("the writer failed: {status}").into());
    }
    let fills = fill(&c.dir);
    let blocks = check_blocks(&f, &model_blocks(&model), 0xF5);
    let fillers = check_fillers(&fills);
    for p in &fills {
        let _ = std::fs::remove_file(p);
    }
    let blocks = blocks?;
    fillers?;
    let seen =
        crate::daemon_counter(&c.moneta, &c.mount, "foreign_writers").unwrap_or(0) - moves_before;
    Ok(format!(
        "{blocks} synced blocks intact after {runs} {tool} runs and a full disk \
         ({seen} opens for writing outside the shim sent the file to the kernel path)"
    ))
}

/// Class 5: a loop device attached to a held file, discarded, detached;
/// the holder then rewrites every block.
fn loop_discard(c: &Ctx) -> Result<String> {
    let f = c.path("looped");
    let go = c.path("looped.go");
    let model = c.path("looped.model");
    plain_file(&f, &vec![0u8; 4 << 20])?;
    let mut writer = c
        .spawn_shim(&[
            "write-wait-write",
            f.to_str().unwrap_or(""),
            go.to_str().unwrap_or(""),
            model.to_str().unwrap_or(""),
        ])
        .map_err(|e| e.to_string())?;
    let ready = go.with_extension("ready");
    let t0 = Instant::now();
    while !ready.exists() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let attach = Command::new("losetup")
        .args(["-f", "--show"])
        .arg(&f)
        .output()
        .map_err(|e| format!("losetup: {e}"))?;
    let dev = String::from_utf8_lossy(&attach.stdout).trim().to_string();
    let discarded = if attach.status.success() && !dev.is_empty() {
        let d = Command::new("blkdiscard").arg(&dev).status();
        let _ = Command::new("losetup").args(["-d", &dev]).status();
        d.map(|s| s.success()).unwrap_or(false)
    } else {
        false
    };
    let _ = std::fs::write(&go, b"go");
    let status = writer.wait().map_err(|e| e.to_string())?;
    if !discarded {
        return Err(
            format!("could not attach and discard a loop device on the file ({dev:?})").into(),
        );
    }
    if !status.success() {
        return Err(format!("the writer failed: {status}").into());
    }
    let fills = fill(&c.dir);
    let blocks = check_blocks(&f, &model_blocks(&model), 0xF6);
    let fillers = check_fillers(&fills);
    for p in &fills {
        let _ = std::fs::remove_file(p);
    }
    let blocks = blocks?;
    fillers?;
    Ok(format!(
        "{blocks} blocks rewritten after a loop device discarded the file are all in it"
    ))
}

/// Class 6: four shim processes write separate blocks of one sparse file,
/// fsync after each.
fn sparse_writers(c: &Ctx) -> Result<String> {
    let f = c.path("sparse");
    let file = std::fs::File::create(&f).map_err(|e| e.to_string())?;
    file.set_len(16 << 20).map_err(|e| e.to_string())?;
    drop(file);
    let children: Vec<_> = (0..4)
        .map(|w| {
            c.spawn_shim(&[
                "block-writer",
                f.to_str().unwrap_or(""),
                &w.to_string(),
                "4",
                "300",
            ])
        })
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    for mut ch in children {
        let s = ch.wait().map_err(|e| e.to_string())?;
        if !s.success() {
            return Err(format!("a writer failed: {s}").into());
        }
    }
    let got = read_back(&f)?;
    let mut checked = 0;
    for w in 0..4u64 {
        let model = model_blocks(&f.with_extension(format!("w{w}")));
        for (b, v) in model {
            let at = (b * 4096) as usize;
            if got.get(at..at + 4096) != Some(&stamped(4096, 0xF7, b * 4096, v)[..]) {
                return Err(format!("block {b} (writer {w}) lost its synced version {v}").into());
            }
            checked += 1;
        }
    }
    Ok(format!(
        "{checked} blocks of 4 writers of one sparse file, each synced, all kept"
    ))
}

/// 1,100 files open in one shim process: every read and write works.
fn many_files(c: &Ctx) -> Result<String> {
    for i in 0..MANY_FILES {
        let p = c.dir.join(format!("many{i}"));
        std::fs::write(&p, [7u8; 8192]).map_err(|e| format!("{}: {e}", p.display()))?;
    }
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    let out = c.shim(&[
        "many-files",
        c.dir.to_str().unwrap_or(""),
        &MANY_FILES.to_string(),
    ])?;
    Ok(out.trim().to_string())
}

/// Near a full disk, a 4 KiB write into a hole succeeds under the shim
/// when it does through the kernel.
fn near_full(c: &Ctx) -> Result<String> {
    let (a, b) = (c.path("hole-shim"), c.path("hole-kernel"));
    for p in [&a, &b] {
        let f = std::fs::File::create(p).map_err(|e| e.to_string())?;
        f.set_len(1 << 20).map_err(|e| e.to_string())?;
    }
    // Register the shim's file while there is room.
    c.shim(&["pwrite-sync", a.to_str().unwrap_or(""), "0", "4096", "1"])?;
    plain_pwrite(&b, 0, 4096, 1)?;
    let fills = fill(&c.dir);
    // Free 128 KiB: the kernel path can place a block there.
    if let Some(last) = fills.last() {
        let len = std::fs::metadata(last).map(|m| m.len()).unwrap_or(0);
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(last)
            .and_then(|f| f.set_len(len.saturating_sub(128 << 10)));
    }
    let kernel = plain_pwrite(&b, 512 << 10, 4096, 2);
    let shim = c.shim(&[
        "pwrite-sync",
        a.to_str().unwrap_or(""),
        "524288",
        "4096",
        "2",
    ]);
    for p in &fills {
        let _ = std::fs::remove_file(p);
    }
    match (kernel, shim) {
        (Ok(()), Ok(_)) => Ok("a 4 KiB write into a hole near a full disk succeeds through the shim as through the kernel".into()),
        (Err(k), Ok(_)) => Ok(format!("the kernel refused ({k}) and the shim succeeded")),
        (Ok(()), Err(s)) => Err(format!("the kernel wrote into the hole, the shim did not: {s}").into()),
        (Err(k), Err(s)) => Ok(format!("both refused: kernel {k}; shim {s}")),
    }
}

fn plain_pwrite(p: &Path, off: u64, len: u64, version: u32) -> Result<()> {
    let fd = sys::open(p, libc::O_RDWR).map_err(|e| format!("open: errno {e}"))? as i32;
    let r = sys::pwrite(fd, &stamped(len, 1, off, version), off);
    // SAFETY: plain syscall.
    let s = unsafe { libc::fsync(fd) };
    sys::close(fd);
    match r {
        Ok(n) if n as u64 == len && s == 0 => Ok(()),
        other => Err(format!("pwrite {}, fsync {s}", sys::show(other)).into()),
    }
}

/// `moneta-torture step NAME ARGS`: the parts that run through the shim.
pub fn step(args: &[String]) -> i32 {
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    let num = |i: usize| arg(i).parse::<u64>().unwrap_or(0);
    let r = if let Some(r) = crate::fd_scenarios::step(args) {
        r.map_err(crate::error::Error::from)
    } else {
        match arg(0).as_str() {
            "pwrite-sync" => {
                let p = PathBuf::from(arg(1));
                plain_pwrite(&p, num(2), num(3), num(4) as u32)
            }
            "exec-parent" => exec_parent(&PathBuf::from(arg(1)), arg(2) == "shim"),
            "fork-records" => fork_records(&PathBuf::from(arg(1)), num(2)),
            "frag-writer" => frag_writer(&PathBuf::from(arg(1)), num(2), &PathBuf::from(arg(3))),
            "write-wait-write" => write_wait_write(
                &PathBuf::from(arg(1)),
                &PathBuf::from(arg(2)),
                &PathBuf::from(arg(3)),
            ),
            "block-writer" => block_writer(&PathBuf::from(arg(1)), num(2), num(3), num(4)),
            "many-files" => many_files_step(&PathBuf::from(arg(1)), num(2)),
            other => Err(format!("no step {other:?}").into()),
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("step {}: {e}", arg(0));
            1
        }
    }
}

fn exec_parent(f: &Path, shim_child: bool) -> Result<()> {
    let fd = sys::open(f, libc::O_RDWR).map_err(|e| format!("open: errno {e}"))? as i32;
    // SAFETY: plain syscall: the file becomes standard output.
    if unsafe { libc::dup2(fd, 1) } != 1 {
        return Err("dup2".into());
    }
    if sys::write(1, &stamped(100, 1, 0, 1)) != Ok(100) {
        return Err("write of 100 bytes".into());
    }
    let mut cmd = Command::new(std::env::current_exe().map_err(|e| e.to_string())?);
    cmd.args(["exec-write", "1", "4", "1", "2"]);
    if !shim_child {
        cmd.env_remove("LD_PRELOAD");
    }
    let s = cmd.status().map_err(|e| e.to_string())?;
    // SAFETY: plain syscall.
    if !s.success() || unsafe { libc::fsync(1) } != 0 {
        return Err(format!("child {s}").into());
    }
    Ok(())
}

fn fork_records(f: &Path, records: u64) -> Result<()> {
    let fd = sys::open(f, libc::O_RDWR).map_err(|e| format!("open: errno {e}"))? as i32;
    let rec = |role: u64, i: u64| stamped(64, 9, ((role << 16) | i) * 4 * 16, 1);
    // SAFETY: the child makes system calls only, then _exit.
    let pid = unsafe { libc::fork() };
    let role = u64::from(pid == 0);
    for i in 0..records {
        let _ = sys::write(fd, &rec(role, i));
    }
    if pid == 0 {
        // SAFETY: leaving the child.
        unsafe { libc::_exit(0) };
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe {
        libc::waitpid(pid, &mut st, 0);
        libc::fsync(fd);
    }
    Ok(())
}

const FRAGMENTED_BLOCKS: u64 = 256;

/// A fragmented file (its blocks interleaved with another file's, which is
/// then removed), written by a plain process.
fn make_fragmented(f: &Path) -> Result<()> {
    let other = f.with_extension("interleave");
    let fd = sys::open(f, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC)
        .map_err(|e| format!("open: errno {e}"))? as i32;
    let od = sys::open(&other, libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC)
        .map_err(|e| format!("open: errno {e}"))? as i32;
    for b in 0..FRAGMENTED_BLOCKS {
        let _ = sys::pwrite(fd, &stamped(4096, 0xF5, b * 4096, 0), b * 4096);
        let _ = sys::pwrite(od, &[0x11; 4096], b * 4096);
        // SAFETY: plain syscalls.
        unsafe {
            libc::fsync(fd);
            libc::fsync(od);
        }
    }
    sys::close(od);
    sys::close(fd);
    std::fs::remove_file(&other).map_err(crate::error::Error::from)
}

/// Blocks of the (existing, fragmented) file rewritten and synced every
/// ~2 ms for `seconds`.
fn frag_writer(f: &Path, seconds: u64, model: &Path) -> Result<()> {
    const BLOCKS: u64 = FRAGMENTED_BLOCKS;
    let fd = sys::open(f, libc::O_RDWR).map_err(|e| format!("open: errno {e}"))? as i32;
    let mut versions = vec![0u32; BLOCKS as usize];
    let mut rng = pattern::Rng::new(seconds ^ 0xF5);
    let t0 = Instant::now();
    let mut n = 0u32;
    while t0.elapsed() < Duration::from_secs(seconds) {
        n += 1;
        let b = rng.below(BLOCKS);
        if sys::pwrite(fd, &stamped(4096, 0xF5, b * 4096, n), b * 4096) != Ok(4096) {
            return Err(format!("pwrite: errno {}", sys::errno()).into());
        }
        // SAFETY: plain syscall.
        if unsafe { libc::fdatasync(fd) } != 0 {
            return Err(format!("fdatasync: errno {}", sys::errno()).into());
        }
        versions[b as usize] = n;
        std::thread::sleep(Duration::from_millis(2));
    }
    sys::close(fd);
    let text: String = versions
        .iter()
        .enumerate()
        .map(|(b, v)| format!("{b} {v}\n"))
        .collect();
    std::fs::write(model, text).map_err(crate::error::Error::from)
}

/// Write every block, sync, say ready, wait for `go`, write every block
/// again and sync: the model is the second version.
fn write_wait_write(f: &Path, go: &Path, model: &Path) -> Result<()> {
    let fd = sys::open(f, libc::O_RDWR).map_err(|e| format!("open: errno {e}"))? as i32;
    let blocks = 1024u64;
    for v in [1u32, 2] {
        for b in 0..blocks {
            if sys::pwrite(fd, &stamped(4096, 0xF6, b * 4096, v), b * 4096) != Ok(4096) {
                return Err(format!("pwrite: errno {}", sys::errno()).into());
            }
        }
        // SAFETY: plain syscall.
        if unsafe { libc::fsync(fd) } != 0 {
            return Err(format!("fsync: errno {}", sys::errno()).into());
        }
        if v == 1 {
            std::fs::write(go.with_extension("ready"), b"").map_err(|e| e.to_string())?;
            let t0 = Instant::now();
            while !go.exists() && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
    sys::close(fd);
    let text: String = (0..blocks).map(|b| format!("{b} 2\n")).collect();
    std::fs::write(model, text).map_err(crate::error::Error::from)
}

fn block_writer(f: &Path, me: u64, writers: u64, writes: u64) -> Result<()> {
    let fd = sys::open(f, libc::O_RDWR).map_err(|e| format!("open: errno {e}"))? as i32;
    let blocks = (16 << 20) / 4096 / writers;
    let mut rng = pattern::Rng::new(me + 77);
    let mut model = std::collections::BTreeMap::new();
    for n in 1..=writes as u32 {
        let b = rng.below(blocks) * writers + me;
        if sys::pwrite(fd, &stamped(4096, 0xF7, b * 4096, n), b * 4096) != Ok(4096) {
            return Err(format!("pwrite: errno {}", sys::errno()).into());
        }
        // SAFETY: plain syscall.
        if unsafe { libc::fsync(fd) } != 0 {
            return Err(format!("fsync: errno {}", sys::errno()).into());
        }
        model.insert(b, n);
    }
    sys::close(fd);
    let text: String = model.iter().map(|(b, v)| format!("{b} {v}\n")).collect();
    std::fs::write(f.with_extension(format!("w{me}")), text).map_err(crate::error::Error::from)
}

/// More files than a channel may hold (1,024).
const MANY_FILES: u64 = 1100;

/// Open `n` existing files at once, write and read each through the shim.
fn many_files_step(dir: &Path, n: u64) -> Result<()> {
    let mut fds = Vec::new();
    for i in 0..n {
        let p = dir.join(format!("many{i}"));
        let fd = sys::open(&p, libc::O_RDWR).map_err(|e| format!("open {i}: errno {e}"))? as i32;
        fds.push(fd);
    }
    for (i, &fd) in fds.iter().enumerate() {
        let data = stamped(4096, 3, 4096, i as u32);
        if sys::pwrite(fd, &data, 4096) != Ok(4096) {
            return Err(format!("pwrite of file {i}: errno {}", sys::errno()).into());
        }
        let mut back = vec![0u8; 4096];
        if sys::pread(fd, &mut back, 4096) != Ok(4096) || back != data {
            return Err(format!("pread of file {i}: errno {}", sys::errno()).into());
        }
    }
    for fd in fds {
        sys::close(fd);
    }
    println!("{n} files open at once in one shim process: every pwrite and pread served");
    Ok(())
}
