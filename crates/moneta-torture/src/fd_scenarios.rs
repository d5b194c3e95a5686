//! Scripted schedules for issue 42's eight cases (README, "The gate"):
//! programs that own descriptor numbers, close what they did not open,
//! reuse numbers across threads, change status flags and attributes, make
//! children without fork handlers, or read beside a truncating process.
//! Each schedule runs once plain (the kernel alone: the oracle) and once
//! through the shim from the same starting files; what each call returned
//! (a results file) and the files' final bytes must be the same, and
//! schedules whose outcome depends on timing check what must hold under
//! any interleaving (no unit of one file inside another, no zeros that
//! were never written, no hang). `run-report` checks the shim's run
//! report files (issue 43).

use crate::ctx::Ctx;
use crate::pattern::{self, stamped};
use crate::sys;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub const SCENARIOS: &[&str] = &[
    "fixed-numbers",
    "raw-dup-numbers",
    "closed-control",
    "fd-reuse",
    "setfl-append",
    "attributes",
    "swap-file",
    "clone-children",
    "truncate-race",
    "run-report",
    "growth-outside-writer",
    "hole-stale",
    "growth-kernel-write",
];

/// How long a step may take before it counts as hung.
const STEP_DEADLINE: Duration = Duration::from_secs(120);

pub fn run(name: &str, c: &Ctx) -> Option<Result<String, String>> {
    Some(match name {
        "fixed-numbers" => differential(c, "fixed-numbers", &["A", "B"], |d| {
            plain_file(&d.join("A"), &[b'a'; 4096])?;
            plain_file(&d.join("B"), &[b'B'; 8192])
        }),
        "raw-dup-numbers" => differential(c, "raw-dup-numbers", &["A", "B"], |d| {
            plain_file(&d.join("A"), &[b'a'; 4096])?;
            plain_file(&d.join("B"), &[b'B'; 8192])
        }),
        "closed-control" => differential(c, "closed-control", &["A", "B", "C", "D", "E"], |d| {
            for f in ["A", "B", "C", "D", "E"] {
                plain_file(&d.join(f), &stamped(16384, 0x42, 0, 1))?;
            }
            Ok(())
        }),
        "fd-reuse" => fd_reuse(c),
        "setfl-append" => differential(c, "setfl-append", &["A"], |d| {
            plain_file(&d.join("A"), &stamped(8192, 0x44, 0, 1))
        }),
        "attributes" => {
            let r = differential(c, "attributes", &["A", "P"], |d| {
                plain_file(&d.join("A"), &stamped(8192, 0x45, 0, 1))?;
                plain_file(&d.join("P"), &stamped(8192, 0x46, 0, 1))
            });
            // Never leave an immutable file behind (nothing could remove it).
            for f in ["A", "P"] {
                let _ = set_flags(&c.dir.join("plain").join(f), 0);
                let _ = set_flags(&c.dir.join("shim").join(f), 0);
            }
            r
        }
        "swap-file" => swap_file(c),
        "clone-children" => differential(c, "clone-children", &["A"], |d| {
            plain_file(&d.join("A"), &stamped(32768, 0x47, 0, 1))
        }),
        "truncate-race" => truncate_race(c),
        "run-report" => run_report(c),
        "growth-outside-writer" => differential(c, "growth-outside-writer", &["A"], |d| {
            plain_file(&d.join("A"), &stamped(GROWTH_BASE, 0x48, 0, 1))
        }),
        "hole-stale" => differential(c, "hole-stale", &["A"], |d| {
            let _ = std::fs::remove_file(d.join("A"));
            plain_file(&d.join("G"), &stamped(HOLE_FILE, 0x49, 0, 1))
        }),
        "growth-kernel-write" => differential(c, "growth-kernel-write", &["A"], |d| {
            cut_preallocated(&d.join("A"))
        }),
        _ => return None,
    })
}

fn plain_file(p: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
    std::fs::File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(|e| e.to_string())
}

/// `moneta-torture step ARGS`, through the shim or plain, with a deadline.
fn step_cmd(c: &Ctx, shim: bool, args: &[&str]) -> Command {
    let me = std::env::current_exe().expect("own path");
    let mut cmd = if shim {
        let mut cmd = Command::new(&c.moneta);
        cmd.arg("run")
            .arg("--mount")
            .arg(&c.mount)
            .arg("--")
            .arg(me);
        cmd
    } else {
        Command::new(me)
    };
    cmd.arg("step").args(args).env_remove("LD_PRELOAD");
    cmd.env("MONETA_CONTROL_TIMEOUT_MS", "5000");
    cmd
}

/// Run a step to its end (killed, and an error, past [`STEP_DEADLINE`]).
fn run_step(mut cmd: Command) -> Result<String, String> {
    let out = std::env::temp_dir().join(format!(
        "moneta-torture-step-{}-{}.out",
        std::process::id(),
        Instant::now().elapsed().as_nanos()
    ));
    let f = std::fs::File::create(&out).map_err(|e| e.to_string())?;
    // Its own process group: a hung step is killed with all it made.
    let mut child = std::os::unix::process::CommandExt::process_group(&mut cmd, 0)
        .stdout(f.try_clone().map_err(|e| e.to_string())?)
        .stderr(f)
        .spawn()
        .map_err(|e| format!("spawn: {e}"))?;
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if t0.elapsed() > STEP_DEADLINE {
            // SAFETY: kill(2) of the step's own process group.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let _ = std::fs::remove_file(&out);
    match status {
        Some(s) if s.success() => Ok(text),
        Some(s) => Err(format!("step failed ({s}): {text}")),
        None => Err(format!(
            "step hung: killed after {} s: {text}",
            STEP_DEADLINE.as_secs()
        )),
    }
}

/// The schedule `name` from the same starting files (made by `setup`),
/// plain in `plain/` and through the shim in `shim/`: the results files
/// and the final bytes of `files` must be equal.
fn differential(
    c: &Ctx,
    name: &str,
    files: &[&str],
    setup: impl Fn(&Path) -> Result<(), String>,
) -> Result<String, String> {
    let mut results = Vec::new();
    for shim in [false, true] {
        let d = c.dir.join(if shim { "shim" } else { "plain" });
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        setup(&d)?;
        let res = d.join("results");
        let d_s = d.to_string_lossy().into_owned();
        let r_s = res.to_string_lossy().into_owned();
        let text = run_step(step_cmd(c, shim, &[name, &d_s, &r_s]))
            .map_err(|e| format!("{} run: {e}", if shim { "shim" } else { "plain" }))?;
        let got = std::fs::read_to_string(&res).map_err(|e| format!("results: {e}: {text}"))?;
        let mut bytes = Vec::new();
        for f in files {
            bytes.push(crate::read_path(&d.join(f))?);
        }
        results.push((got, bytes));
    }
    let (plain, shim) = (&results[0], &results[1]);
    if plain.0 != shim.0 {
        return Err(format!(
            "results differ:\n--- plain\n{}--- shim\n{}",
            plain.0, shim.0
        ));
    }
    for (i, f) in files.iter().enumerate() {
        if let Some(d) = crate::first_difference(&shim.1[i], &plain.1[i]) {
            return Err(format!("file {f} differs from the plain run's: {d}"));
        }
    }
    Ok(format!(
        "{} calls and {} files as the kernel alone",
        plain.0.lines().count(),
        files.len()
    ))
}

/// A results file: one line per call, written when the step ends (the
/// steps close descriptors they did not open, so none is held meanwhile).
struct Results(PathBuf, String);

impl Results {
    fn new(p: &Path) -> Result<Results, String> {
        Ok(Results(p.to_path_buf(), String::new()))
    }
    fn say(&mut self, line: impl std::fmt::Display) {
        let _ = writeln!(self.1, "{line}");
    }
}

impl Drop for Results {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.0, &self.1);
    }
}

fn errno_of(r: i64) -> String {
    if r < 0 {
        format!("errno {}", sys::errno())
    } else {
        r.to_string()
    }
}

fn open_rw(p: &Path, extra: i32) -> Result<i32, String> {
    sys::open(p, libc::O_RDWR | extra)
        .map(|fd| fd as i32)
        .map_err(|e| format!("open {}: errno {e}", p.display()))
}

/// `moneta-torture step NAME ARGS` for these scenarios (None: not one).
pub fn step(args: &[String]) -> Option<Result<(), String>> {
    let dir = PathBuf::from(args.get(1).cloned().unwrap_or_default());
    let res = PathBuf::from(args.get(2).cloned().unwrap_or_default());
    Some(match args.first().map(String::as_str)? {
        "fixed-numbers" => fixed_numbers(&dir, &res, Dup::Libc),
        "raw-dup-numbers" => fixed_numbers(&dir, &res, Dup::RawSyscall),
        "closed-control" => closed_control(&dir, &res),
        "setfl-append" => setfl_append(&dir, &res),
        "attributes" => attributes(&dir, &res),
        "clone-children" => clone_children(&dir, &res),
        "fd-reuse-step" => fd_reuse_step(&dir, &res),
        "swap-writer" => swap_writer(&dir, &res),
        "truncate-appender" => truncate_appender(&dir, &res),
        "truncate-loop" => truncate_loop(&dir),
        "report-writer" => report_writer(&dir),
        "growth-outside-writer" => growth_outside_writer(&dir, &res),
        "hole-stale" => hole_stale(&dir, &res),
        "growth-kernel-write" => growth_kernel_write(&dir, &res),
        "append-far" => append_far(&dir, &res),
        "hold-open" => hold_open(&dir),
        "report-exec" => {
            let fd = open_rw(&dir, 0);
            fd.map(|fd| {
                let mut b = vec![0u8; 4096];
                let _ = sys::pread(fd, &mut b, 0);
                sys::close(fd);
            })
        }
        "append-once" => {
            let fd = open_rw(&dir, libc::O_APPEND);
            fd.map(|fd| {
                let _ = sys::write(fd, b"THIRD-PROCESS\n");
                sys::close(fd);
            })
        }
        "set-flags" => set_flags(&dir, args.get(2).and_then(|f| f.parse().ok()).unwrap_or(0)),
        _ => return None,
    })
}

/// How case 1 puts a file on a fixed number.
#[derive(Clone, Copy)]
enum Dup {
    /// The C library's `dup2`.
    Libc,
    /// The raw system calls through the C library's `syscall()`:
    /// `SYS_dup2` (where the architecture has it) and `SYS_dup3`,
    /// alternating, as a program that bypasses the C library's wrappers
    /// does (issue 42: the shim's own numbers may not be replaced unseen).
    RawSyscall,
}

impl Dup {
    fn onto(self, old: i32, new: i32) -> i32 {
        match self {
            // SAFETY: plain syscall; the program owns whatever number it names.
            Dup::Libc => unsafe { libc::dup2(old, new) },
            Dup::RawSyscall => {
                #[cfg(target_arch = "x86_64")]
                if new % 2 == 0 {
                    // SAFETY: as above, the raw system call.
                    return unsafe { libc::syscall(libc::SYS_dup2, old, new) } as i32;
                }
                // SAFETY: as above, the raw system call.
                unsafe { libc::syscall(libc::SYS_dup3, old, new, 0) as i32 }
            }
        }
    }
}

/// Case 1: the program's own files on fixed numbers (by `dup2`, or by the
/// raw `SYS_dup2`/`SYS_dup3` system calls: scenario `raw-dup-numbers`),
/// then it closes every number it did not open, and goes on with its file.
fn fixed_numbers(d: &Path, res: &Path, dup: Dup) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let fa = open_rw(&d.join("A"), 0)?;
    let mut buf = vec![0u8; 4096];
    out.say(format!(
        "read A {}",
        errno_of(sys::read(fa, &mut buf).unwrap_or(-1))
    ));
    let fb = open_rw(&d.join("B"), 0)?;
    let mut placed = 0;
    for n in (3..=40).chain(500..=560) {
        if n != fa && n != fb && dup.onto(fb, n) == n {
            placed += 1;
        }
    }
    out.say(format!("dup2 of B onto {placed} numbers"));
    out.say(format!(
        "write A {}",
        errno_of(sys::write(fa, b"TAIL-OF-A\n").unwrap_or(-1))
    ));
    // SAFETY: plain syscalls.
    out.say(format!(
        "ftruncate A {}",
        errno_of(unsafe { libc::ftruncate(fa, 4100) } as i64)
    ));
    let mut closed = 0;
    for n in 3..1100 {
        // SAFETY: closing numbers this program does not use any more.
        if n != fa && unsafe { libc::close(n) } == 0 {
            closed += 1;
        }
    }
    out.say(format!("closed {closed} numbers"));
    out.say(format!(
        "append A {}",
        errno_of(sys::pwrite(fa, b"MORE\n", 4100).unwrap_or(-1))
    ));
    let mut back = vec![0u8; 8192];
    let n = sys::pread(fa, &mut back, 0).unwrap_or(-1);
    out.say(format!(
        "pread A {} digest {:x}",
        errno_of(n),
        pattern::digest(&back[..n.max(0) as usize])
    ));
    // SAFETY: plain syscall.
    out.say(format!(
        "fsync A {}",
        errno_of(unsafe { libc::fsync(fa) } as i64)
    ));
    Ok(())
}

/// Case 2: the program closes every descriptor above its file's (with
/// close_range, closefrom, a close loop, and the raw system calls through
/// the C library's `syscall()`: `SYS_close_range`, then a `SYS_close`
/// loop), makes a socketpair, and goes on reading and writing mount files:
/// nothing of the shim's may arrive on its socket, and every call must
/// answer as the kernel's.
fn closed_control(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let mut fds = Vec::new();
    for (i, name) in ["A", "B", "C", "D", "E"].iter().enumerate() {
        let fd = open_rw(&d.join(name), 0)?;
        fds.push(fd);
        let mut b = vec![0u8; 4096];
        out.say(format!(
            "pread {name} {}",
            errno_of(sys::pread(fd, &mut b, 0).unwrap_or(-1))
        ));
        let top = *fds.iter().max().unwrap_or(&fd);
        // SAFETY: plain calls; the program closes what it did not open.
        let how = match i {
            0 => unsafe { close_range_libc(top as u32 + 1) },
            1 => {
                unsafe { closefrom_libc(top + 1) };
                0
            }
            2 => {
                for n in top + 1..2048 {
                    unsafe { libc::close(n) };
                }
                0
            }
            3 => unsafe {
                libc::syscall(
                    libc::SYS_close_range,
                    top as libc::c_long + 1,
                    libc::c_long::from(u32::MAX),
                    0 as libc::c_long,
                )
            },
            _ => {
                for n in top + 1..2048 {
                    unsafe { libc::syscall(libc::SYS_close, n as libc::c_long) };
                }
                0
            }
        };
        out.say(format!("close above {name}: {how}"));
        let mut sv = [0i32; 2];
        // SAFETY: plain syscall.
        if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, sv.as_mut_ptr()) } != 0 {
            return Err("socketpair".into());
        }
        for (j, &fd) in fds.iter().enumerate() {
            let mut b = vec![0u8; 4096];
            let off = 4096 * (1 + (i + j) as u64 % 3);
            out.say(format!(
                "pread #{j} {}",
                errno_of(sys::pread(fd, &mut b, off).unwrap_or(-1))
            ));
            out.say(format!("data #{j} {:x}", pattern::digest(&b)));
            let data = stamped(4096, 0x42, off, 2 + i as u32);
            out.say(format!(
                "pwrite #{j} {}",
                errno_of(sys::pwrite(fd, &data, off).unwrap_or(-1))
            ));
        }
        let mut p = libc::pollfd {
            fd: sv[1],
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd, no wait.
        let ready = unsafe { libc::poll(&mut p, 1, 0) };
        out.say(format!("socket has data: {}", ready > 0));
        sys::close(sv[0]);
        sys::close(sv[1]);
    }
    for &fd in &fds {
        // SAFETY: plain syscall.
        out.say(format!(
            "fsync {}",
            errno_of(unsafe { libc::fsync(fd) } as i64)
        ));
    }
    Ok(())
}

extern "C" {
    #[link_name = "close_range"]
    fn close_range_c(first: u32, last: u32, flags: i32) -> i32;
    #[link_name = "closefrom"]
    fn closefrom_c(low: i32);
}

/// The C library's close_range (what Python's os.closerange calls).
///
/// # Safety
/// Closes every descriptor from `first` on.
unsafe fn close_range_libc(first: u32) -> i64 {
    // SAFETY: the caller's promise.
    unsafe { close_range_c(first, u32::MAX, 0) as i64 }
}

/// # Safety
/// Closes every descriptor from `low` on.
unsafe fn closefrom_libc(low: i32) {
    // SAFETY: the caller's promise.
    unsafe { closefrom_c(low) }
}

/// Case 4: O_APPEND set and cleared with F_SETFL after the first IO, in
/// this process and by a child sharing the open file description, with a
/// third process appending.
fn setfl_append(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let a = d.join("A");
    let fd = open_rw(&a, 0)?;
    let r = |x: sys::Sys| errno_of(x.unwrap_or(-1));
    out.say(format!("pwrite {}", r(sys::pwrite(fd, b"xy", 100))));
    // SAFETY: plain syscalls on our descriptor.
    unsafe { libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND) };
    out.say(format!("pwrite appending {}", r(sys::pwrite(fd, b"PW", 0))));
    out.say(format!("write appending {}", r(sys::write(fd, b"W1"))));
    unsafe { libc::fcntl(fd, libc::F_SETFL, 0) };
    out.say(format!("pwrite at 0 {}", r(sys::pwrite(fd, b"P2", 0))));
    out.say(format!("seek {}", r(sys::seek(fd, 50, libc::SEEK_SET))));
    // A child sets O_APPEND on the shared open file description.
    // SAFETY: the child makes system calls only, then _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        unsafe {
            libc::fcntl(fd, libc::F_SETFL, libc::O_APPEND);
            libc::_exit(0)
        };
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    // A third process appends (plain).
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let s = Command::new(me)
        .args(["step", "append-once"])
        .arg(&a)
        .env_remove("LD_PRELOAD")
        .status()
        .map_err(|e| e.to_string())?;
    out.say(format!("third process {}", s.success()));
    out.say(format!(
        "write after the child's F_SETFL {}",
        r(sys::write(fd, b"PARENT\n"))
    ));
    out.say(format!("pwrite after it {}", r(sys::pwrite(fd, b"P3", 10))));
    unsafe { libc::fcntl(fd, libc::F_SETFL, 0) };
    out.say(format!("write cleared {}", r(sys::write(fd, b"CLEARED"))));
    // SAFETY: plain syscall.
    out.say(format!(
        "fsync {}",
        errno_of(unsafe { libc::fsync(fd) } as i64)
    ));
    Ok(())
}

const FS_IMMUTABLE_FL: i32 = 0x10;
const FS_APPEND_FL: i32 = 0x20;
const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;

/// Set the file's attribute flags to `flags` (immutable/append-only bits
/// only; the rest kept), from this process.
fn set_flags(p: &Path, flags: i32) -> Result<(), String> {
    let fd = sys::open(p, libc::O_RDONLY | libc::O_NONBLOCK)
        .map_err(|e| format!("open: errno {e}"))? as i32;
    let mut cur: i32 = 0;
    // SAFETY: FS_IOC_GETFLAGS/SETFLAGS with an int.
    let r = unsafe {
        libc::ioctl(fd, FS_IOC_GETFLAGS, &mut cur);
        cur = (cur & !(FS_IMMUTABLE_FL | FS_APPEND_FL)) | flags;
        libc::ioctl(fd, FS_IOC_SETFLAGS, &cur)
    };
    sys::close(fd);
    if r == 0 {
        Ok(())
    } else {
        Err(format!("FS_IOC_SETFLAGS: errno {}", sys::errno()))
    }
}

/// Another process changes a file's attributes (`chattr`).
fn chattr(p: &Path, flags: i32) -> bool {
    std::env::current_exe().is_ok_and(|me| {
        Command::new(me)
            .args(["step", "set-flags"])
            .arg(p)
            .arg(flags.to_string())
            .env_remove("LD_PRELOAD")
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// Case 5: a file open for writing made immutable, then append-only, by
/// another process, between writes.
fn attributes(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let r = |x: sys::Sys| errno_of(x.unwrap_or(-1));
    for (name, flag) in [("A", FS_IMMUTABLE_FL), ("P", FS_APPEND_FL)] {
        let p = d.join(name);
        let fd = open_rw(&p, 0)?;
        out.say(format!(
            "{name} pwrite {}",
            r(sys::pwrite(fd, &stamped(4096, 0x45, 0, 2), 0))
        ));
        // SAFETY: plain syscall.
        out.say(format!(
            "{name} fsync {}",
            errno_of(unsafe { libc::fsync(fd) } as i64)
        ));
        out.say(format!("{name} flag set {}", chattr(&p, flag)));
        for v in 3..6u32 {
            out.say(format!(
                "{name} pwrite {}",
                r(sys::pwrite(fd, &stamped(4096, 0x45, 4096, v), 4096))
            ));
            out.say(format!(
                "{name} write {}",
                r(sys::write(fd, &stamped(512, 0x45, 0, v)))
            ));
        }
        out.say(format!("{name} flag cleared {}", chattr(&p, 0)));
        out.say(format!(
            "{name} pwrite after {}",
            r(sys::pwrite(fd, &stamped(4096, 0x45, 0, 9), 0))
        ));
        // SAFETY: plain syscall.
        out.say(format!(
            "{name} fsync {}",
            errno_of(unsafe { libc::fsync(fd) } as i64)
        ));
        sys::close(fd);
    }
    Ok(())
}

/// Case 7: children made without the C library's fork handlers (a raw
/// clone system call; clone(CLONE_FILES)) write and read the parent's file.
fn clone_children(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let fd = open_rw(&d.join("A"), 0)?;
    let r = |x: sys::Sys| errno_of(x.unwrap_or(-1));
    out.say(format!(
        "parent pwrite {}",
        r(sys::pwrite(fd, &stamped(4096, 0x47, 0, 2), 0))
    ));
    let mut b = vec![0u8; 4096];
    out.say(format!("parent pread {}", r(sys::pread(fd, &mut b, 4096))));
    /// 100 rounds of pwrite, pread back and a write at the position (the
    /// parent does the same meanwhile, at other offsets).
    fn child_io(fd: i32, at: u64, v: u32) -> i32 {
        io_rounds(fd, at, v, true)
    }
    fn io_rounds(fd: i32, at: u64, v: u32, position: bool) -> i32 {
        for i in 0..100 {
            let data = stamped(4096, 0x47, at, v + i);
            if sys::pwrite(fd, &data, at) != Ok(4096) {
                return 2;
            }
            let mut back = vec![0u8; 4096];
            if sys::pread(fd, &mut back, at) != Ok(4096) || back != data {
                return 3;
            }
        }
        // The shared position too (the child's only: the order of two
        // processes' writes at one position is not the kernel's to fix).
        if position && sys::write(fd, &stamped(100, 0x47, 0, v)) != Ok(100) {
            return 4;
        }
        0
    }
    let wait = |pid: i32| -> String {
        let t0 = Instant::now();
        loop {
            let mut st = 0;
            // SAFETY: our child.
            let w = unsafe { libc::waitpid(pid, &mut st, libc::WNOHANG | libc::__WALL) };
            if w == pid {
                return format!("exit {}", libc::WEXITSTATUS(st));
            }
            if t0.elapsed() > Duration::from_secs(30) {
                // SAFETY: our child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return "hung (killed after 30 s)".into();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // A raw clone system call: fork without the C library.
    // SAFETY: the child makes system calls only, then _exit.
    let pid =
        unsafe { libc::syscall(libc::SYS_clone, libc::SIGCHLD as libc::c_long, 0, 0, 0, 0) } as i32;
    if pid == 0 {
        let code = child_io(fd, 4096, 3);
        // SAFETY: leaving the child.
        unsafe { libc::syscall(libc::SYS_exit_group, code as libc::c_long) };
    }
    out.say(format!(
        "parent beside it {}",
        io_rounds(fd, 16384, 20, false)
    ));
    out.say(format!("raw clone child {}", wait(pid)));
    // clone(CLONE_FILES): the descriptor table is shared, the memory copied.
    extern "C" fn child(arg: *mut libc::c_void) -> i32 {
        child_io(arg as usize as i32, 8192, 4)
    }
    let mut stack = vec![0u8; 256 << 10];
    // SAFETY: a child on its own stack, sharing only the descriptor table.
    let pid = unsafe {
        libc::clone(
            child,
            stack.as_mut_ptr().add(stack.len()).cast(),
            libc::CLONE_FILES | libc::SIGCHLD,
            fd as usize as *mut libc::c_void,
        )
    };
    out.say(format!(
        "parent beside it {}",
        io_rounds(fd, 20480, 40, false)
    ));
    out.say(format!("clone(CLONE_FILES) child {}", wait(pid)));
    out.say(format!(
        "parent pwrite {}",
        r(sys::pwrite(fd, &stamped(4096, 0x47, 12288, 5), 12288))
    ));
    out.say(format!(
        "parent write {}",
        r(sys::write(fd, &stamped(100, 0x47, 0, 6)))
    ));
    // SAFETY: plain syscall.
    out.say(format!(
        "parent fsync {}",
        errno_of(unsafe { libc::fsync(fd) } as i64)
    ));
    Ok(())
}

const REUSE_ROUNDS: u32 = 90;
const REUSE_TARGET: u16 = 0x4301;
const REUSE_NEW: u16 = 0x4302;
const REUSE_OTHER: u16 = 0x4303;
const REUSE_VALID: u16 = 0x4304;

/// Case 3: a thread writes through descriptor N while another closes N (or
/// dup2s /dev/null or another file onto it) and opens a new file, and a
/// third keeps the control plane busy. The new file must hold only its own
/// units, and a descriptor nobody touched must go on working.
fn fd_reuse(c: &Ctx) -> Result<String, String> {
    let mut said = Vec::new();
    for shim in [false, true] {
        let d = c.dir.join(if shim { "shim" } else { "plain" });
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        plain_file(&d.join("target"), &stamped(1 << 20, REUSE_TARGET, 0, 1))?;
        plain_file(&d.join("other"), &stamped(1 << 20, REUSE_OTHER, 0, 1))?;
        plain_file(&d.join("valid"), &stamped(1 << 20, REUSE_VALID, 0, 1))?;
        for i in 0..4 {
            plain_file(&d.join(format!("busy{i}")), &stamped(65536, 0x4310, 0, 1))?;
        }
        for round in 0..REUSE_ROUNDS {
            plain_file(
                &d.join(format!("new{round}")),
                &stamped(64 << 10, REUSE_NEW, 0, 1),
            )?;
        }
        let res = d.join("results");
        let run = if shim { "shim" } else { "plain" };
        let text = run_step(step_cmd(
            c,
            shim,
            &[
                "fd-reuse-step",
                &d.to_string_lossy(),
                &res.to_string_lossy(),
            ],
        ))
        .map_err(|e| format!("{run} run: {e}"))?;
        let got = std::fs::read_to_string(&res).map_err(|e| format!("results: {e}: {text}"))?;
        let mut foreign = 0usize;
        for round in 0..REUSE_ROUNDS {
            let f = d.join(format!("new{round}"));
            let bytes = crate::read_path(&f)?;
            foreign += bytes
                .chunks(16)
                .filter(|u| pattern::parse(u).is_none_or(|(id, _, _)| id != REUSE_NEW))
                .count();
        }
        if foreign > 0 {
            return Err(format!(
                "{run} run: {foreign} units in the newly opened files are not theirs \
                 (another descriptor's data)\n{got}"
            ));
        }
        if !got.contains("valid descriptor: 200 of 200 writes") {
            return Err(format!(
                "{run} run: a descriptor nobody touched failed:\n{got}"
            ));
        }
        said.push(got.lines().last().unwrap_or("").to_string());
    }
    Ok(format!(
        "{REUSE_ROUNDS} rounds each run, no foreign units in any new file; {}",
        said.join("; ")
    ))
}

fn fd_reuse_step(d: &Path, res: &Path) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
    use std::sync::Arc;
    let mut out = Results::new(res)?;
    let valid = open_rw(&d.join("valid"), 0)?;
    let other = open_rw(&d.join("other"), 0)?;
    let null = sys::open(Path::new("/dev/null"), libc::O_RDWR).map_err(|e| e.to_string())? as i32;
    let stop = Arc::new(AtomicBool::new(false));
    // The control plane kept busy: opens, reads (registrations), closes.
    let busy = {
        let (stop, d) = (stop.clone(), d.to_path_buf());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Acquire) {
                if let Ok(fd) = sys::open(&d.join(format!("busy{}", i % 4)), libc::O_RDWR) {
                    let mut b = vec![0u8; 4096];
                    let _ = sys::pread(fd as i32, &mut b, (i % 16) * 4096);
                    sys::close(fd as i32);
                }
                i += 1;
            }
        })
    };
    let stray = Arc::new(AtomicU64::new(0));
    for round in 0..REUSE_ROUNDS {
        // A lower number held for the close variant: closed with N, it is
        // the one the new file gets, so the new file never has N (then the
        // kernel alone never puts the racing thread's data in it).
        // SAFETY: plain syscall.
        let placeholder = unsafe { libc::dup(null) };
        let t = open_rw(&d.join("target"), 0)?;
        // N above every number the other threads use.
        // SAFETY: plain syscalls on our descriptor.
        let n = unsafe { libc::fcntl(t, libc::F_DUPFD, 100) };
        sys::close(t);
        // No IO before the race: the writer's first write registers the
        // file while the control plane is busy.
        let fd = Arc::new(AtomicI32::new(n));
        let go = Arc::new(AtomicBool::new(true));
        let writer = {
            let (fd, go, stray) = (fd.clone(), go.clone(), stray.clone());
            std::thread::spawn(move || {
                let mut k = 0u64;
                while go.load(Ordering::Acquire) {
                    let off = (k % 256) * 4096;
                    let data = stamped(4096, REUSE_TARGET, off, 2 + round);
                    if sys::pwrite(fd.load(Ordering::Acquire), &data, off).is_ok() {
                        stray.fetch_add(1, Ordering::Relaxed);
                    }
                    k += 1;
                }
            })
        };
        std::thread::sleep(Duration::from_micros(20 + 40 * (round as u64 % 5)));
        // SAFETY: plain syscalls on numbers this program owns.
        match round % 3 {
            0 => {
                sys::close(n);
                sys::close(placeholder);
            }
            1 => unsafe {
                libc::dup2(null, n);
            },
            _ => unsafe {
                libc::dup2(other, n);
            },
        }
        let f2 = open_rw(&d.join(format!("new{round}")), 0)?;
        let data = stamped(64 << 10, REUSE_NEW, 0, 2);
        let _ = sys::pwrite(f2, &data, 0);
        // SAFETY: plain syscall.
        unsafe { libc::fsync(f2) };
        std::thread::sleep(Duration::from_micros(300));
        go.store(false, Ordering::Release);
        let _ = writer.join();
        sys::close(f2);
        if round % 3 != 0 {
            sys::close(n);
            sys::close(placeholder);
        }
    }
    stop.store(true, Ordering::Release);
    let _ = busy.join();
    let mut ok = 0;
    for i in 0..200u64 {
        let off = (i % 256) * 4096;
        if sys::pwrite(valid, &stamped(4096, REUSE_VALID, off, 2), off) == Ok(4096) {
            ok += 1;
        }
    }
    out.say(format!("valid descriptor: {ok} of 200 writes"));
    out.say(format!(
        "{} writes by the racing thread succeeded",
        stray.load(Ordering::Relaxed)
    ));
    Ok(())
}

/// Case 6: a held file made an active swap file by another process
/// (swapon) between writes: the kernel then refuses writes (ETXTBSY).
fn swap_file(c: &Ctx) -> Result<String, String> {
    let mut results = Vec::new();
    for shim in [false, true] {
        let d = c.dir.join(if shim { "shim" } else { "plain" });
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let s = d.join("swap");
        plain_file(&s, &vec![0u8; 16 << 20])?;
        let mk = Command::new("mkswap")
            .arg(&s)
            .output()
            .map_err(|e| format!("mkswap (util-linux) is needed: {e}"))?;
        if !mk.status.success() {
            return Err(format!("mkswap: {}", String::from_utf8_lossy(&mk.stderr)));
        }
        let res = d.join("results");
        let go = d.join("go");
        let mut child = step_cmd(
            c,
            shim,
            &["swap-writer", &s.to_string_lossy(), &res.to_string_lossy()],
        )
        .spawn()
        .map_err(|e| e.to_string())?;
        let ready = s.with_extension("ready");
        let t0 = Instant::now();
        while !ready.exists() && t0.elapsed() < STEP_DEADLINE {
            std::thread::sleep(Duration::from_millis(10));
        }
        let on = Command::new("swapon").arg(&s).output();
        let _ = std::fs::write(&go, b"");
        let waited = child.wait();
        let off = Command::new("swapoff").arg(&s).output();
        let on = on.map_err(|e| format!("swapon (util-linux) is needed: {e}"))?;
        if !on.status.success() {
            return Err(format!("swapon: {}", String::from_utf8_lossy(&on.stderr)));
        }
        if !off.is_ok_and(|o| o.status.success()) {
            return Err(format!("swapoff {} failed: remove it by hand", s.display()));
        }
        if !waited.is_ok_and(|s| s.success()) {
            return Err("the swap writer failed".into());
        }
        results.push(std::fs::read_to_string(&res).map_err(|e| e.to_string())?);
    }
    if results[0] != results[1] {
        return Err(format!(
            "results differ:\n--- plain\n{}--- shim\n{}",
            results[0], results[1]
        ));
    }
    if !results[0].contains("errno 26") {
        return Err(format!(
            "the kernel did not refuse the write:\n{}",
            results[0]
        ));
    }
    Ok(format!(
        "{} writes into the active swap file refused as by the kernel (ETXTBSY) in both runs",
        results[1].matches("errno 26").count()
    ))
}

fn swap_writer(s: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let fd = open_rw(s, 0)?;
    let r = |x: sys::Sys| errno_of(x.unwrap_or(-1));
    let page = stamped(4096, 0x48, 1 << 20, 1);
    out.say(format!(
        "pwrite before {}",
        r(sys::pwrite(fd, &page, 1 << 20))
    ));
    let mut b = vec![0u8; 4096];
    out.say(format!(
        "pread before {}",
        r(sys::pread(fd, &mut b, 2 << 20))
    ));
    // SAFETY: plain syscall.
    out.say(format!(
        "fsync {}",
        errno_of(unsafe { libc::fsync(fd) } as i64)
    ));
    std::fs::write(s.with_extension("ready"), b"").map_err(|e| e.to_string())?;
    let go = s.parent().unwrap_or(Path::new("/")).join("go");
    let t0 = Instant::now();
    while !go.exists() && t0.elapsed() < STEP_DEADLINE {
        std::thread::sleep(Duration::from_millis(5));
    }
    for v in 2..8u32 {
        // Spread over a second: past any short-lived state swapon's own
        // open of the file left.
        std::thread::sleep(Duration::from_millis(200));
        let page = stamped(4096, 0x48, 1 << 20, v);
        out.say(format!(
            "pwrite after swapon {}",
            r(sys::pwrite(fd, &page, 1 << 20))
        ));
    }
    Ok(())
}

const TRUNC_ID: u16 = 0x49;
const TRUNC_SECONDS: u64 = 3;

/// Case 8: an O_APPEND writer that reads back beside a process truncating
/// the file to 0 over and over: no read may return zeros (the file never
/// has a hole: it only shrinks to nothing and grows by appends).
fn truncate_race(c: &Ctx) -> Result<String, String> {
    let mut said = Vec::new();
    for shim in [false, true] {
        let d = c.dir.join(if shim { "shim" } else { "plain" });
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        let t = d.join("T");
        plain_file(&t, &stamped(256 << 10, TRUNC_ID, 0, 1))?;
        let res = d.join("results");
        let t_s = t.to_string_lossy().into_owned();
        let mut truncator = Command::new(std::env::current_exe().map_err(|e| e.to_string())?)
            .args(["step", "truncate-loop", &t_s])
            .env_remove("LD_PRELOAD")
            .spawn()
            .map_err(|e| e.to_string())?;
        let r = run_step(step_cmd(
            c,
            shim,
            &["truncate-appender", &t_s, &res.to_string_lossy()],
        ));
        let _ = truncator.wait();
        let run = if shim { "shim" } else { "plain" };
        r.map_err(|e| format!("{run} run: {e}"))?;
        let got = std::fs::read_to_string(&res).map_err(|e| e.to_string())?;
        if !got.contains(" 0 zero units") {
            return Err(format!("{run} run read zeros never written: {got}"));
        }
        said.push(format!("{run}: {}", got.trim()));
    }
    Ok(said.join("; "))
}

fn truncate_loop(t: &Path) -> Result<(), String> {
    let fd = open_rw(t, 0)?;
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs(TRUNC_SECONDS) {
        // SAFETY: plain syscall.
        unsafe { libc::ftruncate(fd, 0) };
        n += 1;
        std::thread::sleep(Duration::from_micros(500));
    }
    sys::close(fd);
    eprintln!("{n} truncates");
    Ok(())
}

fn truncate_appender(t: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let fd = open_rw(t, libc::O_APPEND)?;
    let mut rng = pattern::Rng::new(0x49);
    let t0 = Instant::now();
    let (mut reads, mut zeros, mut bytes) = (0u64, 0u64, 0u64);
    let mut v = 1u32;
    while t0.elapsed() < Duration::from_secs(TRUNC_SECONDS) {
        v += 1;
        let _ = sys::write(fd, &stamped(4096, TRUNC_ID, 0, v));
        if v.is_multiple_of(16) {
            // SAFETY: plain syscall.
            unsafe { libc::fdatasync(fd) };
        }
        let size = sys::fsize(fd).unwrap_or(0) as u64;
        let off = rng.below(size.max(1)) / 16 * 16;
        let mut b = vec![0u8; 16384];
        if let Ok(n) = sys::pread(fd, &mut b, off) {
            reads += 1;
            bytes += n as u64;
            zeros += b[..n as usize / 16 * 16]
                .chunks(16)
                .filter(|u| u.iter().all(|&x| x == 0))
                .count() as u64;
        }
    }
    out.say(format!("{reads} reads ({bytes} bytes): {zeros} zero units"));
    Ok(())
}

/// The shim's run report (`MONETA_RUN_REPORT_DIR`, issue 43): a program
/// that overwrites and reads an existing file (the device), creates and
/// appends to files (the kernel, for those reasons), and forks a child
/// that execs: its report, the child's pre-exec report and the exec'd
/// image's report must all be there and say so.
fn run_report(c: &Ctx) -> Result<String, String> {
    let d = c.dir.join("report");
    let reports = d.join("reports");
    std::fs::create_dir_all(&reports).map_err(|e| e.to_string())?;
    plain_file(&d.join("E"), &stamped(1 << 20, 0x4A, 0, 1))?;
    let mut cmd = step_cmd(c, true, &["report-writer", &d.to_string_lossy()]);
    cmd.env("MONETA_RUN_REPORT_DIR", &reports);
    run_step(cmd)?;
    let mut files: Vec<(String, String)> = std::fs::read_dir(&reports)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read_to_string(e.path()).unwrap_or_default())
        })
        .collect();
    files.sort();
    let names: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    if files
        .iter()
        .any(|f| !f.1.starts_with("{\"schema\":\"moneta-shim-report/1\""))
    {
        return Err(format!("a report without the schema: {files:?}"));
    }
    let main = files
        .iter()
        .find(|f| number(&f.1, "\"device\":{\"read\":{\"requests\":").unwrap_or(0) >= 10)
        .ok_or_else(|| format!("no report with the writer's device reads: {files:?}"))?;
    let want = [
        ("\"device\":{\"read\":{\"requests\":", 10),
        ("\"write\":{\"requests\":", 10),
        (
            "\"reason\":\"new-or-growing-file\",\"op\":\"write\",\"requests\":",
            2,
        ),
        ("\"reason\":\"append\",\"op\":\"write\",\"requests\":", 3),
    ];
    for (key, at_least) in want {
        let got = number(&main.1, key).unwrap_or(0);
        if got < at_least {
            return Err(format!(
                "{}: {key} {got}, expected at least {at_least}: {}",
                main.0, main.1
            ));
        }
    }
    let pre_exec = names.iter().filter(|n| n.ends_with("-1.json")).count();
    if files.len() != 3 || pre_exec != 1 {
        return Err(format!(
            "expected the writer's, its child's pre-exec and the exec'd image's reports: {names:?}"
        ));
    }
    Ok(format!(
        "{} reports ({}); the writer's counts as expected",
        files.len(),
        names.join(", ")
    ))
}

/// The number after `key` in `json`.
fn number(json: &str, key: &str) -> Option<u64> {
    let at = json.find(key)? + key.len();
    let digits: String = json[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

fn report_writer(d: &Path) -> Result<(), String> {
    let e = open_rw(&d.join("E"), 0)?;
    for i in 0..10u64 {
        let mut b = vec![0u8; 4096];
        sys::pread(e, &mut b, i * 8192).map_err(|e| format!("pread: errno {e}"))?;
        sys::pwrite(e, &stamped(4096, 0x4A, i * 8192, 2), i * 8192)
            .map_err(|e| format!("pwrite: errno {e}"))?;
    }
    // SAFETY: plain syscalls.
    unsafe { libc::fsync(e) };
    let n = sys::open(&d.join("N"), libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC)
        .map_err(|e| format!("open N: errno {e}"))? as i32;
    for i in 0..2u64 {
        let _ = sys::write(n, &stamped(4096, 0x4B, i * 4096, 1));
    }
    let a = open_rw(&d.join("E"), libc::O_APPEND)?;
    for _ in 0..3 {
        let _ = sys::write(a, &stamped(512, 0x4A, 0, 3));
    }
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    // SAFETY: the child execs at once.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let err = std::os::unix::process::CommandExt::exec(
            Command::new(me)
                .args(["step", "report-exec"])
                .arg(d.join("E")),
        );
        eprintln!("exec: {err}");
        // SAFETY: leaving the child.
        unsafe { libc::_exit(1) };
    }
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    if libc::WEXITSTATUS(st) != 0 {
        return Err("the exec'd child failed".into());
    }
    Ok(())
}

/// The written part of `growth-outside-writer`'s file; the step
/// preallocates [`GROWTH_BASE`, +[`GROWTH_PREALLOC`]) behind it.
const GROWTH_BASE: u64 = 64 << 10;
const GROWTH_PREALLOC: u64 = 256 << 10;

/// What `growth-outside-writer`'s reads say: the bytes as written, or
/// where they differ.
fn as_written(got: &[u8], want: &[u8]) -> String {
    match crate::first_difference(got, want) {
        None => format!("{} bytes as written", got.len()),
        Some(d) => d,
    }
}

/// The torture gate's `prealloc_write` failures (XFS seed 420030, ext4
/// seed 520032: "bytes differ …, all zeros"): a write into a preallocated
/// (unwritten) range, which the shim sends direct as a growth grant, read
/// back while a process outside the shim holds the file open for writing
/// (as xfs_fsr and e4defrag do). monetad then sends every channel to the
/// kernel for the file; the data written direct is on the device but not
/// yet written data in the file system's eyes, so the reads must reach it
/// through the kernel (which has monetad settle it first), never be told
/// "unwritten: zeros". Reads through the writing descriptor and a new
/// read-only one, before, during and after the outside writer's open.
fn growth_outside_writer(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let a = d.join("A");
    let fd = open_rw(&a, 0)?;
    let mut model = stamped(GROWTH_BASE, 0x48, 0, 1);
    // SAFETY: plain syscall on our descriptor.
    let r = unsafe { libc::fallocate(fd, 0, GROWTH_BASE as i64, GROWTH_PREALLOC as i64) };
    out.say(format!("fallocate {}", errno_of(r as i64)));
    model.resize((GROWTH_BASE + GROWTH_PREALLOC) as usize, 0);
    for (off, len) in [
        (GROWTH_BASE + 8192, 4096u64),
        (GROWTH_BASE + 16384 + 2560, 530),
    ] {
        let data = stamped(len, 0x48, off, 2);
        let r = sys::pwrite(fd, &data, off);
        out.say(format!("pwrite {off} {len} {}", sys::show(r)));
        if r.is_ok() {
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
    }
    let read_all = |out: &mut Results, when: &str| {
        for how in ["writer", "reader"] {
            let rfd = if how == "writer" {
                fd
            } else {
                match sys::open(&a, libc::O_RDONLY) {
                    Ok(x) => x as i32,
                    Err(e) => {
                        out.say(format!("{when} open {how}: errno {e}"));
                        continue;
                    }
                }
            };
            // The preallocated range alone (a read of the written part
            // through the kernel would have monetad settle the file first).
            let mut buf = vec![0u8; GROWTH_PREALLOC as usize];
            let r = sys::pread_full(rfd, &mut buf, GROWTH_BASE);
            if how == "reader" {
                sys::close(rfd);
            }
            match r {
                Ok(n) => out.say(format!(
                    "{when} read {how}: {}",
                    as_written(&buf[..n as usize], &model[GROWTH_BASE as usize..])
                )),
                Err(e) => out.say(format!("{when} read {how}: errno {e}")),
            }
        }
    };
    read_all(&mut out, "alone");
    // A writer outside the shim opens the file and holds it open.
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut holder = Command::new(me)
        .args(["step", "hold-open"])
        .arg(&a)
        .env_remove("LD_PRELOAD")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn the outside writer: {e}"))?;
    let mut line = String::new();
    let opened = holder
        .stdout
        .take()
        .map(std::io::BufReader::new)
        .map(|mut o| std::io::BufRead::read_line(&mut o, &mut line));
    out.say(format!(
        "outside writer: {}",
        match opened {
            Some(Ok(_)) => line.trim().to_string(),
            _ => "no answer".into(),
        }
    ));
    read_all(&mut out, "beside the outside writer");
    drop(holder.stdin.take());
    let s = holder.wait().map_err(|e| e.to_string())?;
    out.say(format!("outside writer ended {}", s.success()));
    read_all(&mut out, "after it");
    // SAFETY: plain syscalls on our descriptor.
    out.say(format!(
        "fsync {}",
        errno_of(unsafe { libc::fsync(fd) } as i64)
    ));
    sys::close(fd);
    Ok(())
}

/// `hold-open FILE` (plain): open FILE for writing, say "open", and keep
/// it open until stdin ends.
fn hold_open(p: &Path) -> Result<(), String> {
    let fd = sys::open(p, libc::O_WRONLY).map_err(|e| format!("open: errno {e}"))? as i32;
    println!("open");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let mut sink = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut sink);
    sys::close(fd);
    Ok(())
}

/// `hole-stale`'s file size (and its garbage file's).
const HOLE_FILE: u64 = 4 << 20;

/// Growth into holes (monetad's `allocate-file`): the file system
/// allocates a hole's blocks for a direct write, and they may be the very
/// blocks a deleted file held. A file G of stamped bytes is deleted (its
/// blocks freed, their bytes still on the medium); a new sparse file A of
/// the same size then gets small, unaligned writes into its holes (each
/// in a block of its own, so each allocation's block holds the write and
/// bytes nobody wrote). Every byte nobody wrote must read as zeros, through
/// the writing descriptor, a new read-only one, and (the differential's
/// last look) the kernel: a grant made without zeroing the allocated blocks
/// on the medium first shows G's bytes there.
fn hole_stale(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let g = d.join("G");
    out.say(format!(
        "unlink G {}",
        std::fs::remove_file(&g).map_or_else(|e| e.to_string(), |()| "ok".into())
    ));
    // The free committed, so the allocator may hand G's blocks out again.
    // SAFETY: plain syscall.
    unsafe { libc::sync() };
    let a = d.join("A");
    let fd = sys::open(&a, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)
        .map(|fd| fd as i32)
        .map_err(|e| format!("create A: errno {e}"))?;
    // SAFETY: plain syscall on our descriptor.
    let r = unsafe { libc::ftruncate(fd, HOLE_FILE as i64) };
    out.say(format!("ftruncate {}", errno_of(r as i64)));
    let mut model = vec![0u8; HOLE_FILE as usize];
    let pieces = 48u64;
    for i in 0..pieces {
        let off = i * (HOLE_FILE / pieces) / 4096 * 4096 + 1000 + i * 7;
        let len = 100 + i * 13;
        let data = stamped(len, 0x4a, off, 2);
        let r = sys::pwrite(fd, &data, off);
        out.say(format!("pwrite {off} {len} {}", sys::show(r)));
        if let Ok(n) = r {
            let n = n as usize;
            model[off as usize..off as usize + n].copy_from_slice(&data[..n]);
        }
    }
    for how in ["writer", "reader"] {
        let rfd = if how == "writer" {
            fd
        } else {
            match sys::open(&a, libc::O_RDONLY) {
                Ok(x) => x as i32,
                Err(e) => {
                    out.say(format!("open {how}: errno {e}"));
                    continue;
                }
            }
        };
        let mut buf = vec![0u8; HOLE_FILE as usize];
        let r = sys::pread_full(rfd, &mut buf, 0);
        if how == "reader" {
            sys::close(rfd);
        }
        match r {
            Ok(n) => out.say(format!(
                "read {how}: {}",
                as_written(&buf[..n as usize], &model)
            )),
            Err(e) => out.say(format!("read {how}: errno {e}")),
        }
    }
    sys::close(fd);
    Ok(())
}

/// The part of `growth-kernel-write`'s file past its cut end: its last
/// block is preallocated, the size ends inside it.
const CUT_TAIL: u64 = 1000;

/// A kernel write into a range pending from a growth grant, by another
/// process under the shim (the daemon's settle rule: what the kernel wrote
/// there since the grant is never settled from the medium). The file ends
/// inside a preallocated block (fallocate, then a cut mid-block); this
/// process opens it and writes direct into that block below the end (a
/// growth grant: the whole block pending, zeroed on the medium). A second
/// process appends through the kernel with its file position moved far
/// past the end (`lseek` on an O_APPEND descriptor, then the raw
/// `SYS_write`; the kernel appends at the end all the same, but reports
/// the access at the position), and writes with `pwritev2(RWF_APPEND)` at
/// a far offset, then this process runs
/// fdatasync and closes (both settle). Every byte must read as the kernel
/// alone leaves it: the appended bytes, not the medium's zeros.
fn growth_kernel_write(d: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let a = d.join("A");
    let fd = open_rw(&a, 0)?;
    // The appender starts first (its start, an exec, ends nothing of
    // this process's), opens the file and waits.
    let me = std::env::current_exe().map_err(|e| e.to_string())?;
    // Under the shim when this step is (LD_PRELOAD is inherited).
    let mut child = Command::new(me)
        .args(["step", "append-far"])
        .arg(&a)
        .arg(res.with_extension("child"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("spawn the appender: {e}"))?;
    let mut line = String::new();
    let opened = child
        .stdout
        .take()
        .map(std::io::BufReader::new)
        .map(|mut o| std::io::BufRead::read_line(&mut o, &mut line));
    out.say(format!(
        "appender: {}",
        match opened {
            Some(Ok(_)) => line.trim().to_string(),
            _ => "no answer".into(),
        }
    ));
    let data = stamped(512, 0x4b, GROWTH_BASE, 2);
    out.say(format!(
        "pwrite {GROWTH_BASE} 512 {}",
        sys::show(sys::pwrite(fd, &data, GROWTH_BASE))
    ));
    drop(child.stdin.take());
    let s = child.wait().map_err(|e| e.to_string())?;
    out.say(format!("appender {}", s.success()));
    let child = std::fs::read_to_string(res.with_extension("child")).unwrap_or_default();
    out.say(child.trim_end());
    // SAFETY: plain syscalls on our descriptor.
    out.say(format!(
        "fdatasync {}",
        errno_of(unsafe { libc::fdatasync(fd) } as i64)
    ));
    let mut buf = vec![0u8; 2 * GROWTH_BASE as usize];
    let r = sys::pread_full(fd, &mut buf, 0);
    out.say(format!("read back {}", sys::show(r)));
    sys::close(fd);
    Ok(())
}

/// `growth-kernel-write`'s starting file (made plain): written bytes,
/// then a preallocation, cut [`CUT_TAIL`] bytes into its first block.
fn cut_preallocated(a: &Path) -> Result<(), String> {
    plain_file(a, &stamped(GROWTH_BASE, 0x4b, 0, 1))?;
    let fd = open_rw(a, 0)?;
    // SAFETY: plain syscalls on our descriptor.
    let r = unsafe {
        if libc::fallocate(fd, 0, GROWTH_BASE as i64, GROWTH_PREALLOC as i64) != 0 {
            -1
        } else {
            libc::ftruncate(fd, (GROWTH_BASE + CUT_TAIL) as i64) | libc::fsync(fd)
        }
    };
    let e = sys::errno();
    sys::close(fd);
    if r != 0 {
        return Err(format!("preallocating and cutting A: errno {e}"));
    }
    Ok(())
}

/// `append-far FILE RESULTS`: append through O_APPEND with the position
/// far past the end (the raw `SYS_write`), then `pwritev2(RWF_APPEND)` at
/// a far offset: kernel writes the shim does not interpose.
fn append_far(a: &Path, res: &Path) -> Result<(), String> {
    let mut out = Results::new(res)?;
    let fd = open_rw(a, libc::O_APPEND)?;
    let fd2 = open_rw(a, 0)?;
    println!("open");
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    // Until the writer's stdin ends: it has written into the file by then.
    let mut sink = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut sink);
    out.say(format!(
        "lseek far {}",
        sys::show(sys::seek(fd, (4 * GROWTH_PREALLOC) as i64, libc::SEEK_SET))
    ));
    let rec = stamped(160, 0x4b, 0, 3);
    // The raw system call (the shim sees only the C library's write).
    // SAFETY: plain syscall; the buffer is ours.
    let r = unsafe { libc::syscall(libc::SYS_write, fd, rec.as_ptr(), rec.len()) };
    out.say(format!("append {}", errno_of(r)));
    sys::close(fd);
    let fd = fd2;
    let more = stamped(96, 0x4b, 0, 4);
    let iov = sys::iovecs(&[&more]);
    // SAFETY: plain syscall; the vector names our buffer.
    let r = unsafe {
        libc::pwritev2(
            fd,
            iov.as_ptr(),
            iov.len() as i32,
            (4 * GROWTH_PREALLOC) as i64,
            libc::RWF_APPEND,
        )
    };
    out.say(format!("pwritev2 append {}", errno_of(r as i64)));
    sys::close(fd);
    Ok(())
}
