//! `moneta-torture io-cost`: the per-IO cost of the shim's checks (issue
//! 42; README "Unmodified programs: `moneta run` and the shim"). One
//! process does N reads or writes of B bytes at seeded random aligned
//! offsets of an existing file on the mount, either through libc
//! (`pread`/`pwrite`: the shim's path when run under `moneta run`, the
//! kernel's otherwise) or through libmoneta's file API directly
//! (`--api`: the same requests with no interposition, no per-call
//! checks), and prints the mean nanoseconds per call. Run each side in the
//! same session and quote ratios. `--checks` times, on the same
//! descriptor, each system call the shim's per-IO checks make (getpid,
//! F_GETFL, statx, sysinfo) against the kernel's own pread of cached bytes.

use crate::error::Result;
use crate::pattern::Rng;
use crate::sys;
use std::path::PathBuf;
use std::time::Instant;

struct Args {
    file: PathBuf,
    ops: u64,
    bytes: u64,
    write: bool,
    api: bool,
    checks: bool,
}

fn parse(args: &[String]) -> Result<Args> {
    let mut a = Args {
        file: PathBuf::new(),
        ops: 100_000,
        bytes: 4096,
        write: false,
        api: false,
        checks: false,
    };
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].clone();
        let mut value = || {
            i += 1;
            args.get(i).cloned().ok_or("a value is missing")
        };
        match flag.as_str() {
            "--file" => a.file = PathBuf::from(value()?),
            "--ops" => a.ops = value()?.parse().map_err(|_| "--ops: a number")?,
            "--bytes" => a.bytes = value()?.parse().map_err(|_| "--bytes: a number")?,
            "--write" => a.write = true,
            "--api" => a.api = true,
            "--checks" => a.checks = true,
            other => return Err(format!("io-cost: unknown option {other:?}").into()),
        }
        i += 1;
    }
    if a.file.as_os_str().is_empty() || a.bytes == 0 {
        return Err(
            "usage: moneta-torture io-cost --file F [--ops N] [--bytes B] [--write] \
                    [--api]"
                .into(),
        );
    }
    Ok(a)
}

/// The entry point: 0 when every call moved all its bytes.
pub fn main(args: &[String]) -> i32 {
    let a = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("moneta-torture: {e}");
            return 2;
        }
    };
    let fd = match sys::open(&a.file, libc::O_RDWR) {
        Ok(fd) => fd as i32,
        Err(e) => {
            eprintln!("io-cost: opening {}: errno {e}", a.file.display());
            return 2;
        }
    };
    let size = sys::fsize(fd).unwrap_or(0) as u64;
    let slots = size / a.bytes;
    if slots == 0 {
        eprintln!("io-cost: {} is smaller than one IO", a.file.display());
        return 2;
    }
    if a.checks {
        checks(fd, a.ops, a.bytes);
        return 0;
    }
    let mut rng = Rng::new(0x0010_C057);
    let mut buf = vec![0x5Au8; a.bytes as usize];
    let api = if a.api {
        match api_file(fd) {
            Ok(x) => Some(x),
            Err(e) => {
                eprintln!("io-cost: libmoneta: {e}");
                return 2;
            }
        }
    } else {
        None
    };
    let t0 = Instant::now();
    let mut bad = 0u64;
    for _ in 0..a.ops {
        let off = rng.below(slots) * a.bytes;
        let n = match (&api, a.write) {
            (Some((m, f)), true) => f.write_at(m, &buf, off).map_err(|_| 0),
            (Some((m, f)), false) => f.read_at(m, &mut buf, off).map_err(|_| 0),
            (None, true) => sys::pwrite(fd, &buf, off).map(|n| n as usize),
            (None, false) => sys::pread(fd, &mut buf, off).map(|n| n as usize),
        };
        if n != Ok(a.bytes as usize) {
            bad += 1;
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / a.ops as f64;
    println!(
        "io-cost: {} {} × {} B via {}: {ns:.0} ns per call, {bad} short or failed",
        a.ops,
        if a.write { "pwrite" } else { "pread" },
        a.bytes,
        if a.api {
            "libmoneta's file API"
        } else {
            "libc"
        }
    );
    i32::from(bad > 0)
}

/// libmoneta's handle of the open file `fd` (MONETA_SOCKET names the
/// daemon, as `moneta run` sets it).
fn api_file(fd: i32) -> Result<(moneta_client::Moneta, moneta_client::file::MonetaFile)> {
    let socket = std::env::var("MONETA_SOCKET").map_err(|_| "MONETA_SOCKET is not set")?;
    let m =
        moneta_client::Moneta::connect(std::path::Path::new(&socket)).map_err(|e| e.to_string())?;
    let f = m.open_file(fd).map_err(|e| e.to_string())?;
    Ok((m, f))
}

/// Mean nanoseconds of each system call of the shim's per-IO checks, and
/// of a pread of `bytes` cached bytes, `ops` calls each.
fn checks(fd: i32, ops: u64, bytes: u64) {
    let time = |what: &str, f: &mut dyn FnMut()| {
        let t0 = Instant::now();
        for _ in 0..ops {
            f();
        }
        println!(
            "io-cost: {what}: {:.0} ns per call",
            t0.elapsed().as_nanos() as f64 / ops as f64
        );
    };
    // SAFETY (every closure): plain system calls on our descriptor and
    // into zeroed structs of the right type.
    time("getpid", &mut || unsafe {
        libc::syscall(libc::SYS_getpid);
    });
    time("fcntl(F_GETFL)", &mut || unsafe {
        libc::fcntl(fd, libc::F_GETFL);
    });
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    time("statx", &mut || unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_INO,
            &mut sx,
        );
    });
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    time("sysinfo", &mut || unsafe {
        libc::sysinfo(&mut si);
    });
    let mut buf = vec![0u8; bytes as usize];
    time(&format!("pread of {bytes} cached bytes"), &mut || {
        let _ = sys::pread(fd, &mut buf, 0);
    });
}
