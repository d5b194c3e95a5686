//! moneta-torture: the direct path's differential torture harness (issue
//! 20; README "Direct-path contract"). It is the safety gate of every
//! change to the shim, libmoneta's file grants and the daemon's layout
//! watching.
//!
//! One run is two runs of the same seeded schedule on one Moneta file
//! system: first every worker plain (the kernel alone: the oracle), then
//! the chosen workers through the shim (`moneta run`) beside plain ones,
//! with admin tools (xfs_fsr, e4defrag, fstrim, clones) let loose on the
//! files meanwhile. Workers run concurrently, never serialized. Checked:
//!
//! - in the run, every read of a private file against the worker's model,
//!   and what must hold under any interleaving on the shared files;
//! - call by call, the shim run's results against the kernel's (the
//!   deterministic lines of the workers' logs);
//! - at the end, every file's bytes (read after dropping the page cache)
//!   against the models and against the kernel run's files; then the disk
//!   is filled by a plain process and every file on the mount is scanned
//!   for units of a file they do not belong to (writes that reached freed
//!   blocks).
//!
//! A failure prints the seed and a command that reproduces it; `shrink`
//! cuts a failing schedule down (fewer operations, fewer workers, fewer
//! kinds of operation) and prints the smallest that still fails.

mod ctx;
mod error;
mod fd_scenarios;
mod io_cost;
mod pattern;
mod scenario;
mod sys;
mod worker;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use worker::{Config, Worker};

const USAGE: &str = "\
usage:
  moneta-torture run --mount DIR [--moneta PATH] [--seed S] [--ops N] [--workers P]
                     [--shim-workers K] [--skip op,op] [--no-admin] [--no-fill]
                     [--results DIR] [--json]
  moneta-torture shrink (the same options): cut a failing schedule down
  moneta-torture scenario NAME|all --mount DIR [--moneta PATH]: the scripted
                     schedules of the data-loss classes issue 20 found
  moneta-torture scenarios: the scenario names (`scenario all` runs them)
  moneta-torture ops: the operation names (--skip takes them)
  moneta-torture io-cost --file F [--ops N] [--bytes B] [--write] [--api]:
                     N reads (writes) of an existing file, mean ns per call

run: the schedule (seed S, N operations per worker, P workers of which the
first K go through the shim; default K = P/2 rounded up) first through the
kernel alone, then with the shim, on the Moneta file system mounted at DIR;
exit 0 when nothing differs, 1 when something does (the seed reproduces it).";

#[derive(Clone)]
struct RunArgs {
    mount: PathBuf,
    moneta: PathBuf,
    seed: u64,
    ops: u64,
    workers: u32,
    shim_workers: u32,
    skip: BTreeSet<String>,
    admin: bool,
    fill: bool,
    results: PathBuf,
    json: bool,
}

impl RunArgs {
    fn command_line(&self) -> String {
        let mut s = format!(
            "moneta-torture run --mount {} --seed {} --ops {} --workers {} --shim-workers {}",
            self.mount.display(),
            self.seed,
            self.ops,
            self.workers,
            self.shim_workers
        );
        if !self.skip.is_empty() {
            s += &format!(
                " --skip {}",
                self.skip.iter().cloned().collect::<Vec<_>>().join(",")
            );
        }
        if !self.admin {
            s += " --no-admin";
        }
        if !self.fill {
            s += " --no-fill";
        }
        s
    }
}

fn parse_run(args: &[String]) -> crate::error::Result<RunArgs> {
    let mut a = RunArgs {
        mount: PathBuf::new(),
        moneta: PathBuf::from("moneta"),
        seed: seed_now(),
        ops: 2000,
        workers: 4,
        shim_workers: u32::MAX,
        skip: BTreeSet::new(),
        admin: true,
        fill: true,
        results: PathBuf::new(),
        json: false,
    };
    let mut i = 0;
    let value = |i: &mut usize| -> Result<String, String> {
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| format!("{} needs a value", args[*i - 1]))
    };
    let number = |s: String, what: &str| -> Result<u64, String> {
        s.parse::<u64>()
            .map_err(|_| format!("{what}: {s:?} is not a whole number"))
    };
    while i < args.len() {
        match args[i].as_str() {
            "--mount" => a.mount = PathBuf::from(value(&mut i)?),
            "--moneta" => a.moneta = PathBuf::from(value(&mut i)?),
            "--seed" => a.seed = number(value(&mut i)?, "--seed")?,
            "--ops" => a.ops = number(value(&mut i)?, "--ops")?,
            "--workers" => a.workers = number(value(&mut i)?, "--workers")? as u32,
            "--shim-workers" => a.shim_workers = number(value(&mut i)?, "--shim-workers")? as u32,
            "--skip" => {
                for op in value(&mut i)?.split(',').filter(|s| !s.is_empty()) {
                    if !worker::OPS.iter().any(|o| o.0 == op) {
                        return Err(
                            format!("--skip: no operation {op:?} (moneta-torture ops)").into()
                        );
                    }
                    a.skip.insert(op.to_string());
                }
            }
            "--no-admin" => a.admin = false,
            "--no-fill" => a.fill = false,
            "--results" => a.results = PathBuf::from(value(&mut i)?),
            "--json" => a.json = true,
            other => return Err(format!("unknown option {other:?}\n{USAGE}").into()),
        }
        i += 1;
    }
    if a.mount.as_os_str().is_empty() {
        return Err(format!("--mount is required\n{USAGE}").into());
    }
    if !(1..=32).contains(&a.workers) {
        return Err("--workers: from 1 to 32".into());
    }
    if a.shim_workers == u32::MAX {
        a.shim_workers = a.workers.div_ceil(2);
    }
    if a.shim_workers > a.workers {
        return Err("--shim-workers cannot exceed --workers".into());
    }
    if a.results.as_os_str().is_empty() {
        a.results = std::env::temp_dir().join(format!("moneta-torture-{}", std::process::id()));
    }
    Ok(a)
}

fn seed_now() -> u64 {
    std::env::var("TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64 ^ std::process::id() as u64)
                .unwrap_or(1)
        })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("worker") => run_worker(&args[1..]),
        Some("exec-write") => worker::exec_write(&args[1..]),
        Some("step") => scenario::step(&args[1..]),
        Some("io-cost") => io_cost::main(&args[1..]),
        Some("scenario") => run_scenarios(&args[1..]),
        Some("scenarios") => {
            for name in scenario::all() {
                println!("{name}");
            }
            0
        }
        Some("ops") => {
            for (name, _) in worker::OPS {
                println!("{name}");
            }
            0
        }
        Some(cmd @ ("run" | "shrink")) => match parse_run(&args[1..]) {
            Ok(a) if cmd == "run" => {
                let outcome = run(&a);
                report(&a, &outcome);
                i32::from(!outcome.problems.is_empty())
            }
            Ok(a) => shrink(a),
            Err(e) => {
                eprintln!("moneta-torture: {e}");
                2
            }
        },
        _ => {
            eprintln!("{USAGE}");
            2
        }
    };
    std::process::exit(code);
}

fn run_scenarios(args: &[String]) -> i32 {
    let Some(name) = args.first() else {
        eprintln!("{USAGE}");
        return 2;
    };
    let a = match parse_run(&args[1..]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("moneta-torture: {e}");
            return 2;
        }
    };
    let names: Vec<&str> = if name == "all" {
        scenario::all()
    } else {
        vec![name.as_str()]
    };
    let c = ctx::Ctx {
        mount: a.mount.clone(),
        moneta: a.moneta.clone(),
        dir: a.mount.join("torture-scenario"),
    };
    let mut failed = 0;
    for n in names {
        let t0 = Instant::now();
        match scenario::run(n, &c) {
            Ok(what) => eprintln!(
                "scenario {n}: ok in {:.1} s — {what}",
                t0.elapsed().as_secs_f64()
            ),
            Err(e) => {
                failed += 1;
                eprintln!("scenario {n}: FAILED — {e}");
            }
        }
    }
    i32::from(failed > 0)
}

fn run_worker(args: &[String]) -> i32 {
    let get = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .cloned()
            .unwrap_or_default()
    };
    let cfg = Config {
        dir: PathBuf::from(get("--dir")),
        results: PathBuf::from(get("--results")),
        worker: get("--worker").parse().unwrap_or(0),
        workers: get("--workers").parse().unwrap_or(1),
        seed: get("--seed").parse().unwrap_or(1),
        ops: get("--ops").parse().unwrap_or(0),
        skip: get("--skip")
            .split(',')
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        shim: args.iter().any(|a| a == "--shim"),
    };
    match Worker::new(cfg).run() {
        Ok(()) => 0,
        Err(worker::Failure(what)) => {
            eprintln!("worker: {what}");
            3
        }
    }
}

/// What a run found.
#[derive(Default)]
struct Outcome {
    problems: Vec<String>,
    ops_done: u64,
    admin_actions: Vec<String>,
    device_requests: Option<u64>,
    /// O_DIRECT reads the kernel failed with EIO (a delayed allocation in
    /// their range) where the shim read the model's bytes.
    kernel_dio_eio: u64,
    /// Unaligned O_DIRECT reads the kernel answered EINVAL in one run and
    /// served in the other ([`Tolerated::Unaligned`]).
    dio_unaligned: u64,
    /// (dev, ino) of the files on the mount before the shim run.
    preexisting: std::collections::HashSet<(u64, u64)>,
    seconds: f64,
    /// Wall seconds of the kernel run, the shim run and the final checks.
    phase_seconds: [f64; 3],
}

/// A phase of the run: the kernel alone, or with the shim.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Kernel,
    Shim,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Kernel => "kernel",
            Phase::Shim => "shim",
        }
    }
}

fn run(a: &RunArgs) -> Outcome {
    let t0 = Instant::now();
    let mut out = Outcome::default();
    let _ = std::fs::remove_dir_all(&a.results);
    for phase in [Phase::Kernel, Phase::Shim] {
        let dir = a.mount.join(format!("torture-{}", phase.name()));
        let res = a.results.join(phase.name());
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = std::fs::create_dir_all(&dir).and_then(|()| std::fs::create_dir_all(&res)) {
            out.problems.push(format!("making {}: {e}", dir.display()));
            return out;
        }
        if let Err(e) = make_shared_files(&dir, a.workers) {
            out.problems.push(format!("making the shared files: {e}"));
            return out;
        }
        let before = device_requests(a);
        if phase == Phase::Shim {
            // Files that were here before the shim run hold what earlier
            // runs wrote: the scan for foreign units leaves them out (the
            // kernel run's files are compared byte for byte instead).
            out.preexisting = regular_files(&a.mount);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let admin = (phase == Phase::Shim && a.admin).then(|| {
            let (dir, stop, mount, workers) =
                (dir.clone(), stop.clone(), a.mount.clone(), a.workers);
            let seed = a.seed;
            std::thread::spawn(move || admin_loop(&dir, &mount, workers, seed, &stop))
        });
        let tp = Instant::now();
        let children: Vec<(u32, std::io::Result<Child>)> = (0..a.workers)
            .map(|w| (w, spawn_worker(a, phase, w, &dir, &res)))
            .collect();
        for (w, child) in children {
            let status = child.and_then(|mut c| c.wait());
            match status {
                Ok(s) if s.success() => {}
                Ok(s) => {
                    let last = last_failure(&res.join(format!("w{w}.log")));
                    out.problems.push(format!(
                        "{} run: worker {w} ({}) {}: {}",
                        phase.name(),
                        if phase == Phase::Shim && w < a.shim_workers {
                            "shim"
                        } else {
                            "plain"
                        },
                        s,
                        last
                    ));
                }
                Err(e) => out.problems.push(format!("worker {w}: {e}")),
            }
        }
        stop.store(true, Ordering::Release);
        let clones = admin
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        out.phase_seconds[phase as usize] = tp.elapsed().as_secs_f64();
        if phase == Phase::Shim {
            out.device_requests = device_requests(a)
                .zip(before)
                .map(|(x, y)| x.saturating_sub(y));
            out.admin_actions = clones.iter().map(|c| c.action.clone()).collect();
            if !out.problems.is_empty() {
                // The kernel run must be clean for the comparison to mean anything.
                out.seconds = t0.elapsed().as_secs_f64();
                return out;
            }
            let tc = Instant::now();
            check_final(a, &mut out, &clones);
            out.phase_seconds[2] = tc.elapsed().as_secs_f64();
        } else if !out.problems.is_empty() {
            out.problems.insert(
                0,
                "the kernel-only run failed: the harness's model is wrong (not the shim)".into(),
            );
            out.seconds = t0.elapsed().as_secs_f64();
            return out;
        }
    }
    out.ops_done = a.ops * a.workers as u64;
    if out.problems.is_empty() {
        for phase in [Phase::Kernel, Phase::Shim] {
            let _ = std::fs::remove_dir_all(a.mount.join(format!("torture-{}", phase.name())));
        }
    }
    out.seconds = t0.elapsed().as_secs_f64();
    out
}

fn spawn_worker(
    a: &RunArgs,
    phase: Phase,
    w: u32,
    dir: &Path,
    res: &Path,
) -> std::io::Result<Child> {
    let me = std::env::current_exe()?;
    let shim = phase == Phase::Shim && w < a.shim_workers;
    let mut cmd = if shim {
        let mut c = Command::new(&a.moneta);
        c.arg("run").arg("--mount").arg(&a.mount).arg("--").arg(&me);
        c
    } else {
        Command::new(&me)
    };
    cmd.arg("worker")
        .arg("--dir")
        .arg(dir)
        .arg("--results")
        .arg(res)
        .args(["--worker", &w.to_string()])
        .args(["--workers", &a.workers.to_string()])
        .args(["--seed", &a.seed.to_string()])
        .args(["--ops", &a.ops.to_string()]);
    if !a.skip.is_empty() {
        cmd.arg("--skip")
            .arg(a.skip.iter().cloned().collect::<Vec<_>>().join(","));
    }
    if shim {
        cmd.arg("--shim");
    }
    cmd.env_remove("LD_PRELOAD").spawn()
}

fn last_failure(log: &Path) -> String {
    std::fs::read_to_string(log)
        .ok()
        .and_then(|s| {
            s.lines()
                .rev()
                .find(|l| l.contains(" FAIL "))
                .map(String::from)
        })
        .unwrap_or_else(|| "no check failed (it crashed or was killed)".into())
}

fn make_shared_files(dir: &Path, workers: u32) -> std::io::Result<()> {
    let shared = std::fs::File::create(dir.join("shared"))?;
    shared.set_len(worker::contested_offset(workers) + worker::CONTESTED_BYTES)?;
    shared.sync_all()?;
    std::fs::write(dir.join("mapped"), vec![0u8; worker::MAPPED_BYTES as usize])?;
    std::fs::File::open(dir.join("mapped"))?.sync_all()
}

fn device_requests(a: &RunArgs) -> Option<u64> {
    daemon_counter(&a.moneta, &a.mount, "requests_completed")
}

/// A counter of the monetad serving `mount` (`moneta stats`), by key.
fn daemon_counter(moneta: &Path, mount: &Path, key: &str) -> Option<u64> {
    let out = Command::new(moneta)
        .args(["status", "--format", "json"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // The instance whose mount is ours: its socket, then its counters.
    let mount = mount.canonicalize().ok()?;
    let needle = format!("\"mount\":\"{}\"", mount.display());
    let at = text.replace(": ", ":").find(&needle)?;
    let rest = &text.replace(": ", ":")[at..];
    let socket_key = "\"socket\":\"";
    let s = rest.find(socket_key)? + socket_key.len();
    let socket = &rest[s..s + rest[s..].find('"')?];
    let stats = Command::new(moneta)
        .args(["stats", "--json", "--daemon", socket])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&stats.stdout).replace(": ", ":");
    let key = format!("\"{key}\":");
    let s = text.find(&key)? + key.len();
    text[s..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .ok()
}

/// A clone the admin thread made, and what it held then.
#[derive(Clone)]
struct Clone_ {
    path: Option<PathBuf>,
    digest: u64,
    action: String,
}

/// Admin tools against the shim run's files until `stop`: xfs_fsr or
/// e4defrag on a private file, fstrim, and reflink clones (whose bytes
/// must never change afterwards).
fn admin_loop(dir: &Path, mount: &Path, workers: u32, seed: u64, stop: &AtomicBool) -> Vec<Clone_> {
    let mut rng = pattern::Rng::new(seed ^ 0xAD);
    let mut done = Vec::new();
    let fs = fs_type(mount);
    let mut n = 0;
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(Duration::from_millis(30 + rng.below(200)));
        if stop.load(Ordering::Acquire) {
            break;
        }
        let w = rng.below(workers as u64) as u32;
        let file = worker::private_path(dir, w, rng.below(2) as u32);
        let (action, clone) = match rng.below(4) {
            0 | 1 if fs == "xfs" => (run_tool("xfs_fsr", &[file.as_os_str()]), None),
            0 | 1 if fs == "ext4" => (run_tool("e4defrag", &[file.as_os_str()]), None),
            2 => (run_tool("fstrim", &[mount.as_os_str()]), None),
            _ => {
                n += 1;
                let target = dir.join(format!("clone{n}"));
                match reflink(&file, &target) {
                    Ok(d) => (
                        format!("clone {} -> {}", file.display(), target.display()),
                        Some((target, d)),
                    ),
                    Err(e) => (format!("clone: {e}"), None),
                }
            }
        };
        done.push(Clone_ {
            digest: clone.as_ref().map_or(0, |c| c.1),
            path: clone.map(|c| c.0),
            action,
        });
    }
    done
}

fn fs_type(mount: &Path) -> String {
    let m = mount.canonicalize().unwrap_or(mount.to_path_buf());
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && Path::new(f[1]) == m).then(|| f[2].to_string())
        })
        .next_back()
        .unwrap_or_default()
}

fn run_tool(tool: &str, args: &[&std::ffi::OsStr]) -> String {
    match Command::new(tool).args(args).output() {
        Ok(o) => format!(
            "{tool} {}",
            if o.status.success() { "ok" } else { "failed" }
        ),
        Err(e) => format!("{tool}: {e}"),
    }
}

/// FICLONE `from` to a new file `to`; the digest of what `to` holds.
fn reflink(from: &Path, to: &Path) -> crate::error::Result<u64> {
    let src = sys::open(from, libc::O_RDONLY).map_err(|e| format!("open: errno {e}"))? as i32;
    let dst = match sys::open(to, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL) {
        Ok(fd) => fd as i32,
        Err(e) => {
            sys::close(src);
            return Err(format!("create: errno {e}").into());
        }
    };
    // SAFETY: FICLONE with a source descriptor.
    let r = unsafe { libc::ioctl(dst, libc::FICLONE, src) };
    let e = sys::errno();
    sys::close(src);
    let result = if r == 0 {
        read_whole(dst).map(|b| pattern::digest(&b))
    } else {
        Err(format!("FICLONE: errno {e}").into())
    };
    sys::close(dst);
    if result.is_err() {
        let _ = std::fs::remove_file(to);
    }
    result
}

/// The whole file, read after its cached pages are written back and dropped.
fn read_whole(fd: i32) -> crate::error::Result<Vec<u8>> {
    // SAFETY: plain syscalls on our descriptor.
    unsafe {
        libc::fsync(fd);
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED);
    }
    let size = sys::fsize(fd).map_err(|e| format!("fstat: errno {e}"))?;
    let mut b = vec![0u8; size as usize];
    let n = sys::pread_full(fd, &mut b, 0).map_err(|e| format!("read: errno {e}"))?;
    b.truncate(n as usize);
    Ok(b)
}

fn read_path(p: &Path) -> crate::error::Result<Vec<u8>> {
    let fd =
        sys::open(p, libc::O_RDONLY).map_err(|e| format!("open {}: errno {e}", p.display()))?;
    let r = read_whole(fd as i32);
    sys::close(fd as i32);
    r
}

fn check_final(a: &RunArgs, out: &mut Outcome, clones: &[Clone_]) {
    let kdir = a.mount.join("torture-kernel");
    let sdir = a.mount.join("torture-shim");
    let (kres, sres) = (a.results.join("kernel"), a.results.join("shim"));
    // 1. Call by call: the deterministic lines of each worker's log.
    for w in 0..a.workers {
        let lines = |p: PathBuf| -> Vec<String> {
            std::fs::read_to_string(p)
                .unwrap_or_default()
                .lines()
                .filter(|l| {
                    !l.split_once(' ')
                        .is_some_and(|(_, rest)| rest.starts_with('~'))
                })
                .map(String::from)
                .collect()
        };
        let (k, s) = (
            lines(kres.join(format!("w{w}.log"))),
            lines(sres.join(format!("w{w}.log"))),
        );
        // A worker that is plain in the shim run meets the kernel alone there too.
        let plain = w >= a.shim_workers;
        let (mut kernel_eio, mut unaligned) = (0, 0);
        let differs = |i: &usize| match (k.get(*i), s.get(*i)) {
            (Some(a), Some(b)) if a != b => tolerated(a, b, plain).is_none(),
            (a, b) => a != b,
        };
        for i in 0..k.len().min(s.len()) {
            match (k[i] != s[i])
                .then(|| tolerated(&k[i], &s[i], plain))
                .flatten()
            {
                Some(Tolerated::KernelEio) => kernel_eio += 1,
                Some(Tolerated::Unaligned) => unaligned += 1,
                None => {}
            }
        }
        out.kernel_dio_eio += kernel_eio;
        out.dio_unaligned += unaligned;
        if let Some(i) = (0..k.len().max(s.len())).find(differs) {
            out.problems.push(format!(
                "worker {w}: the shim run differs from the kernel's at call {i}: kernel {:?}, shim {:?}",
                k.get(i),
                s.get(i)
            ));
        }
    }
    // 2. Private files against the models and the kernel run's files.
    for w in 0..a.workers {
        for k in 0..2 {
            let model = std::fs::read(sres.join(format!("w{w}.f{k}.model"))).unwrap_or_default();
            let name = worker::private_name(w, k);
            match (read_path(&sdir.join(&name)), read_path(&kdir.join(&name))) {
                (Ok(shim), Ok(kernel)) => {
                    if let Some(d) = first_difference(&shim, &model) {
                        out.problems
                            .push(format!("{name}: final contents differ from the model: {d}"));
                    }
                    if let Some(d) = first_difference(&shim, &kernel) {
                        out.problems.push(format!(
                            "{name}: final contents differ from the kernel run's: {d}"
                        ));
                    }
                }
                (s, k) => out
                    .problems
                    .push(format!("{name}: {:?} {:?}", s.err(), k.err())),
            }
        }
    }
    // 3. The shared file: stripes exactly, the contested range valid.
    match read_path(&sdir.join("shared")) {
        Ok(shared) => check_shared(a, &sres, &shared, out),
        Err(e) => out.problems.push(format!("shared: {e}")),
    }
    match read_path(&sdir.join("mapped")) {
        Ok(mapped) => {
            for w in 0..a.workers {
                for (i, v) in pairs(&sres.join(format!("w{w}.mapped"))) {
                    let got = &mapped[(i * pattern::UNIT) as usize..][..16];
                    if got != pattern::unit(worker::MAPPED_ID, i, v as u32) {
                        out.problems.push(format!(
                            "mapped file: worker {w}'s unit {i} holds {:?}, it last wrote version {v}",
                            pattern::parse(got)
                        ));
                        break;
                    }
                }
            }
        }
        Err(e) => out.problems.push(format!("mapped: {e}")),
    }
    // 4. Clones never change.
    for c in clones {
        if let Some(p) = &c.path {
            match read_path(p) {
                Ok(b) if pattern::digest(&b) == c.digest => {}
                Ok(_) => out.problems.push(format!(
                    "{}: a clone changed after it was made",
                    p.display()
                )),
                Err(e) => out.problems.push(format!("{}: {e}", p.display())),
            }
        }
    }
    // 5. Fill the disk, then scan every file for units that are not its own.
    let fills = if a.fill { fill_disk(&sdir) } else { Vec::new() };
    let skip = std::mem::take(&mut out.preexisting);
    scan_mount(&a.mount, &skip, out);
    for f in fills {
        let _ = std::fs::remove_file(f);
    }
}

/// Why two differing log lines of the same call are both right.
enum Tolerated {
    /// The kernel's own O_DIRECT read failed with EIO where it met a
    /// delayed allocation ("Direct I/O collision with buffered writes!" in
    /// dmesg): in the kernel run, or in the shim run by a worker that is
    /// plain there too. The other run read the data, checked against the
    /// model in the run.
    KernelEio,
    /// An unaligned O_DIRECT read: the shim passes it to the kernel, which
    /// answers EINVAL where the range maps written blocks and reads holes
    /// and unwritten extents (XFS's iomap) — and which blocks are written
    /// differs between runs (writeback timing, `xfs_fsr`, only in the shim
    /// run). Data read is checked against the model in the run.
    Unaligned,
}

/// Whether kernel-run line `k` and shim-run line `s` of one call may
/// differ; `plain`: the worker is plain in the shim run too.
fn tolerated(k: &str, s: &str, plain: bool) -> Option<Tolerated> {
    let (kw, sw): (Vec<&str>, Vec<&str>) = (k.split(' ').collect(), s.split(' ').collect());
    if kw.len() != sw.len()
        || kw.get(1) != Some(&"direct_read")
        || kw[..kw.len() - 1] != sw[..sw.len() - 1]
    {
        return None;
    }
    let (kr, sr) = (kw[kw.len() - 1], sw[sw.len() - 1]);
    if kr == "-5" || (plain && sr == "-5") {
        return Some(Tolerated::KernelEio);
    }
    let field = |i: usize| kw.get(i).and_then(|f| f.parse::<u64>().ok());
    let unaligned = match (field(3), field(4)) {
        (Some(off), Some(len)) => off % 512 != 0 || len % 512 != 0,
        _ => false,
    };
    let read = |r: &str| r.parse::<i64>().is_ok_and(|n| n >= 0);
    (unaligned && ((kr == "-22" && read(sr)) || (sr == "-22" && read(kr))))
        .then_some(Tolerated::Unaligned)
}

fn pairs(p: &Path) -> Vec<(u64, u64)> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_once(' ')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        })
        .collect()
}

fn check_shared(a: &RunArgs, sres: &Path, shared: &[u8], out: &mut Outcome) {
    for w in 0..a.workers {
        for (j, v) in pairs(&sres.join(format!("w{w}.stripe"))) {
            let off = worker::stripe_offset(w, j, a.workers);
            let want = pattern::stamped(4096, worker::SHARED_ID, off, v as u32);
            if shared.get(off as usize..off as usize + 4096) != Some(&want[..]) {
                out.problems.push(format!(
                    "shared file: worker {w}'s stripe block {j} (offset {off}) lost version {v}"
                ));
            }
        }
    }
    let base = worker::contested_offset(a.workers);
    let written: BTreeSet<u64> = (0..a.workers)
        .flat_map(|w| {
            std::fs::read_to_string(sres.join(format!("w{w}.contested")))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect::<Vec<u64>>()
        })
        .collect();
    for i in 0..worker::CONTESTED_BYTES / pattern::UNIT {
        let pos = base + i * pattern::UNIT;
        let Some(u) = shared.get(pos as usize..pos as usize + 16) else {
            out.problems
                .push("shared file: shorter than its contested range".into());
            return;
        };
        let ok = match pattern::parse(u) {
            Some((f, at, _)) => f == worker::SHARED_ID && at as u64 == pos / pattern::UNIT,
            None => u.iter().all(|&b| b == 0) && !written.contains(&i),
        };
        if !ok {
            out.problems.push(format!(
                "shared file: contested unit at {pos} holds {:?} (written: {})",
                pattern::parse(u),
                written.contains(&i)
            ));
            return;
        }
    }
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<String> {
    if a == b {
        return None;
    }
    let i = (0..a.len().min(b.len())).find(|&i| a[i] != b[i]);
    Some(match i {
        Some(i) => {
            let n = (i..a.len().min(b.len()))
                .take_while(|&j| a[j] != b[j])
                .count();
            let zeros = a[i..i + n].iter().all(|&x| x == 0);
            format!(
                "{n} bytes from byte {i}{} (found {:?}, expected {:?}); sizes {} and {}",
                if zeros { ", zeros" } else { "" },
                a.get(i / 16 * 16..i / 16 * 16 + 16)
                    .and_then(pattern::parse),
                b.get(i / 16 * 16..i / 16 * 16 + 16)
                    .and_then(pattern::parse),
                a.len(),
                b.len()
            )
        }
        None => format!("sizes {} and {}", a.len(), b.len()),
    })
}

const FILL_BYTE: u8 = 0xEE;

/// A plain process fills the file system (so freed blocks are reused);
/// the fillers' own bytes are checked by the scan.
fn fill_disk(dir: &Path) -> Vec<PathBuf> {
    let chunk = vec![FILL_BYTE; 4 << 20];
    let mut made = Vec::new();
    'files: for n in 0..4096 {
        let p = dir.join(format!("fill{n}"));
        let Ok(fd) = sys::open(&p, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC) else {
            break;
        };
        made.push(p);
        for i in 0..16u64 {
            if sys::pwrite(fd as i32, &chunk, i * chunk.len() as u64) != Ok(chunk.len() as i64) {
                // SAFETY: plain syscall.
                unsafe { libc::fsync(fd as i32) };
                sys::close(fd as i32);
                break 'files;
            }
        }
        // SAFETY: plain syscall.
        unsafe { libc::fsync(fd as i32) };
        sys::close(fd as i32);
    }
    made
}

/// Every regular file under `dir` (recursively).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut stack = vec![dir.to_path_buf()];
    let mut files = Vec::new();
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => files.push(e.path()),
                _ => {}
            }
        }
    }
    files
}

/// (dev, ino) of every regular file under `dir`.
fn regular_files(dir: &Path) -> std::collections::HashSet<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    walk(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino())))
        .collect()
}

/// Every regular file under the mount that the shim run made (those from
/// before it are in `skip`): units must be of the file itself
/// (private files may hold their worker's other files' units, which
/// copies bring); fillers hold nothing but their byte.
fn scan_mount(mount: &Path, skip: &std::collections::HashSet<(u64, u64)>, out: &mut Outcome) {
    use std::os::unix::fs::MetadataExt;
    let mut reported = 0;
    for p in walk(mount) {
        if std::fs::metadata(&p).is_ok_and(|m| skip.contains(&(m.dev(), m.ino()))) {
            continue;
        }
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name.starts_with("clone") {
            continue; // checked by digest
        }
        let Ok(bytes) = read_path(&p) else { continue };
        let allowed = allowed_ids(&name);
        if name.starts_with("fill") {
            if let Some(i) = bytes.iter().position(|&b| b != FILL_BYTE) {
                out.problems.push(format!(
                        "{}: a filler holds foreign bytes at {i} (unit {:?}): a write reached freed blocks",
                        p.display(),
                        bytes.get(i / 16 * 16..i / 16 * 16 + 16).and_then(pattern::parse)
                    ));
                reported += 1;
            }
            continue;
        }
        for (i, u) in bytes.chunks_exact(16).enumerate() {
            if let Some((f, _, _)) = pattern::parse(u) {
                if !allowed(f) {
                    out.problems.push(format!(
                        "{}: unit of file {f:#06x} at offset {}: another file's data",
                        p.display(),
                        i * 16
                    ));
                    reported += 1;
                    break;
                }
            }
        }
        if reported > 20 {
            return;
        }
    }
}

fn allowed_ids(name: &str) -> Box<dyn Fn(u16) -> bool> {
    let worker = name
        .strip_prefix('w')
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse::<u32>().ok());
    match (name, worker) {
        ("shared", _) => Box::new(|f| f == worker::SHARED_ID),
        ("mapped", _) => Box::new(|f| f == worker::MAPPED_ID),
        (_, Some(w)) if name.ends_with(".log") => Box::new(move |f| f == worker::log_id(w)),
        (_, Some(w)) if name.ends_with(".kill") => Box::new(move |f| f == worker::kill_id(w)),
        (_, Some(w)) => Box::new(move |f| worker::owner_of(f) == Some(w) && (f & 0xFF) < 0x80),
        _ => Box::new(|_| false),
    }
}

fn report(a: &RunArgs, o: &Outcome) {
    let verdict = if o.problems.is_empty() {
        "no differences"
    } else {
        "DIFFERENCES"
    };
    if a.json {
        let esc = |s: &str| s.replace('\\', "\\\\").replace('"', "\\\"");
        println!(
            "{{\"seed\":{},\"kernel_dio_eio\":{},\"dio_unaligned_tolerated\":{},\"workers\":{},\"shim_workers\":{},\"ops_per_worker\":{},\"ops\":{},\
             \"device_requests\":{},\"admin_actions\":{},\"seconds\":{:.1},\"phase_seconds\":{{\"kernel\":{:.1},\"shim\":{:.1},\"check\":{:.1}}},\"problems\":[{}]}}",
            a.seed,
            o.kernel_dio_eio,
            o.dio_unaligned,
            a.workers,
            a.shim_workers,
            a.ops,
            o.ops_done,
            o.device_requests.map_or("null".into(), |n| n.to_string()),
            o.admin_actions.len(),
            o.seconds,
            o.phase_seconds[0],
            o.phase_seconds[1],
            o.phase_seconds[2],
            o.problems
                .iter()
                .map(|p| format!("\"{}\"", esc(p)))
                .collect::<Vec<_>>()
                .join(",")
        );
    }
    eprintln!(
        "moneta-torture: seed {} — {} workers ({} through the shim) × {} operations, twice \
         (kernel, shim) in {:.1} s; {} device requests; {} admin actions ({}); {} kernel \
         O_DIRECT EIOs and {} unaligned O_DIRECT outcomes tolerated; {verdict}",
        a.seed,
        a.workers,
        a.shim_workers,
        a.ops,
        o.seconds,
        o.device_requests.map_or("?".into(), |n| n.to_string()),
        o.admin_actions.len(),
        summarize(&o.admin_actions),
        o.kernel_dio_eio,
        o.dio_unaligned
    );
    for p in o.problems.iter().take(20) {
        eprintln!("  {p}");
    }
    if !o.problems.is_empty() {
        eprintln!(
            "reproduce: {}\nresults kept in {} and the files under {}/torture-*",
            a.command_line(),
            a.results.display(),
            a.mount.display()
        );
    }
}

fn summarize(actions: &[String]) -> String {
    let mut counts = std::collections::BTreeMap::new();
    for a in actions {
        let key: String = a.split_whitespace().take(2).collect::<Vec<_>>().join(" ");
        *counts
            .entry(if key.starts_with("clone /") {
                "clone ok".to_string()
            } else {
                key
            })
            .or_insert(0) += 1;
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} ×{v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A failure's kind: its first problem without numbers and paths, so a
/// shrunk schedule is kept only if it fails the same way.
fn signature(o: &Outcome) -> String {
    let p = o.problems.first().cloned().unwrap_or_default();
    let p = p.split(" FAIL ").last().unwrap_or_default();
    p.split_whitespace()
        .filter(|w| !w.contains('/') && !w.chars().any(|c| c.is_ascii_digit()))
        .take(6)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Whether the schedule `a` fails as `want` (twice tried: runs are concurrent).
fn fails(a: &RunArgs, want: &str) -> bool {
    (0..2).any(|_| {
        let o = run(a);
        !o.problems.is_empty() && signature(&o) == want
    })
}

/// Cut a failing schedule down: fewer operations (bisection), fewer
/// workers, fewer kinds of operation, no admin tools; print the smallest
/// command that still fails.
fn shrink(mut a: RunArgs) -> i32 {
    let first = run(&a);
    report(&a, &first);
    if first.problems.is_empty() {
        eprintln!("moneta-torture shrink: the schedule did not fail; nothing to shrink");
        return 0;
    }
    let want = signature(&first);
    eprintln!("shrink: keeping schedules that fail as: {want}");
    let (mut lo, mut hi) = (0, a.ops);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        let b = RunArgs {
            ops: mid,
            ..a.clone()
        };
        if fails(&b, &want) {
            hi = mid;
        } else {
            lo = mid;
        }
        eprintln!("shrink: {hi} operations per worker fail");
    }
    a.ops = hi;
    while a.workers > 1 {
        let b = RunArgs {
            workers: a.workers - 1,
            shim_workers: a.shim_workers.min(a.workers - 1).max(1),
            ..a.clone()
        };
        if !fails(&b, &want) {
            break;
        }
        a = b;
        eprintln!("shrink: {} workers fail", a.workers);
    }
    for flag in [false, true] {
        let b = if flag {
            RunArgs {
                fill: false,
                ..a.clone()
            }
        } else {
            RunArgs {
                admin: false,
                ..a.clone()
            }
        };
        if fails(&b, &want) {
            a = b;
        }
    }
    for (op, _) in worker::OPS {
        if a.skip.contains(*op) {
            continue;
        }
        let mut b = a.clone();
        b.skip.insert(op.to_string());
        if fails(&b, &want) {
            a = b;
            eprintln!("shrink: fails without {op}");
        }
    }
    let last = run(&a);
    report(&a, &last);
    eprintln!("shrunk: {}", a.command_line());
    1
}

#[cfg(test)]
mod tests {
    use super::{tolerated, Tolerated};

    #[test]
    fn only_the_kernels_own_o_direct_answers_are_tolerated() {
        let t = |k: &str, s: &str, plain: bool| tolerated(k, s, plain);
        let k = "18542 direct_read 1 6463502 28160 28160";
        let s = "18542 direct_read 1 6463502 28160 -22";
        assert!(matches!(t(k, s, false), Some(Tolerated::Unaligned)));
        assert!(matches!(t(s, k, false), Some(Tolerated::Unaligned)));
        // Aligned: EINVAL is never the kernel's choice by extent state.
        let (a, b) = (
            "7 direct_read 1 4096 8192 8192",
            "7 direct_read 1 4096 8192 -22",
        );
        assert!(t(a, b, true).is_none());
        // A short read is a difference, not a tolerated outcome.
        let (a, b) = (
            "7 direct_read 1 4097 8192 8192",
            "7 direct_read 1 4097 8192 4096",
        );
        assert!(t(a, b, false).is_none());
        // Other calls, or other arguments, are never tolerated.
        let (a, b) = ("7 pread 1 4097 8192 8192", "7 pread 1 4097 8192 -22");
        assert!(t(a, b, false).is_none());
        let (a, b) = (
            "7 direct_read 1 4097 8192 8192",
            "7 direct_read 0 4097 8192 -22",
        );
        assert!(t(a, b, false).is_none());
        // The kernel's own EIO: in the kernel run; in the shim run only
        // for a worker that is plain there (a shim worker's EIO is ours).
        let (ok, eio) = (
            "7 direct_read 1 4096 8192 8192",
            "7 direct_read 1 4096 8192 -5",
        );
        assert!(matches!(t(eio, ok, false), Some(Tolerated::KernelEio)));
        assert!(matches!(t(ok, eio, true), Some(Tolerated::KernelEio)));
        assert!(t(ok, eio, false).is_none());
    }
}
