//! `moneta up`, `moneta down`, `moneta status`: the Moneta file system of
//! DESIGN "Processes in emulation" (a real XFS or ext4 on a loop device over
//! the device image, with monetad serving the same image) brought up, torn
//! down and inspected as one unit. README "File system" describes the use.
//!
//! An instance is named after its mount point and keeps everything in
//! `/run/moneta/<name>/`:
//! - `device.img`: the medium, a sparse file. The loop device under the file
//!   system and the daemon's memory map both use it; the loop device is
//!   buffered (not direct I/O) so both see one page cache. `down` keeps it,
//!   so files survive `down` + `up`.
//! - `image.json`: what the image holds (file system, size) and the preset
//!   and overrides it was last served with. It lives as long as the image:
//!   it is how `up` knows never to make a new file system on it.
//! - `state.json`: the running instance (loop device, daemon pid, socket).
//!   `up` writes it last, `down` removes it.
//! - `monetad.sock`, `monetad.log`.
//!
//! A lock file `/run/moneta/.lock-<name>` (as long as the state directory
//! exists) serializes `up` and `down` of one mount point. `up` registers the undo of every step in a rollback guard,
//! so an error, a panic or Ctrl-C leaves nothing behind. `down`, and `up`
//! when it repairs a half-dead instance, find the pieces from the image and
//! socket paths (mount table, /sys/block/loop*/loop/backing_file, /proc), not
//! from state.json alone, so they also clean up after a crash that skipped
//! the rollback.

use clap::{Args, ValueEnum};
use moneta_model::config::Config;
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

pub(crate) const RUN_DIR: &str = "/run/moneta";
const DEFAULT_MOUNT: &str = "/mnt/moneta";
const DEFAULT_PRESET: &str = "moneta-d";
const DEFAULT_SIZE: u64 = 4 << 30;
/// mkfs.xfs refuses anything smaller.
const XFS_MIN_BYTES: u64 = 300 << 20;
pub(crate) const SOCKET_WAIT: Duration = Duration::from_secs(10);
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Longest instance name: keeps `<run dir>/<name>/monetad.sock` within the
/// 108 bytes of a Unix socket address.
const MAX_NAME: usize = 77;
/// Test hook: `fail@STEP`, `panic@STEP` or `stall@STEP` (wait for a signal)
/// after STEP (image, mkfs, loop, mount, daemon, state) of `moneta up`, so
/// the rollback can be tested at every step.
const FAULT_ENV: &str = "MONETA_UP_FAULT";

/// How the kernel's own reads and writes (page cache write-back,
/// O_DIRECT, mmap, programs outside the shim) reach the medium.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KernelPath {
    /// A loop device over the image: no device timing (the page cache and
    /// the image file are as fast as this machine).
    #[default]
    Loop,
    /// A loop device (direct I/O) over an `nbdfuse` file backed by the
    /// daemon's NBD export: every kernel read and write is a device request
    /// and pays the emulated device's timing.
    Device,
}

impl KernelPath {
    fn name(self) -> &'static str {
        match self {
            KernelPath::Loop => "loop",
            KernelPath::Device => "device",
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Fs {
    Xfs,
    Ext4,
}

impl Fs {
    fn name(self) -> &'static str {
        match self {
            Fs::Xfs => "xfs",
            Fs::Ext4 => "ext4",
        }
    }

    fn mkfs(self, image: &Path) -> Command {
        // -f/-F: the image is a fresh file of ours; no questions.
        let (program, force) = match self {
            Fs::Xfs => ("mkfs.xfs", "-f"),
            Fs::Ext4 => ("mkfs.ext4", "-F"),
        };
        let mut c = Command::new(program);
        c.args(["-q", force]).arg(image);
        c
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum StatusFormat {
    Table,
    Json,
}

#[derive(Args)]
pub struct UpArgs {
    /// File system of a new image [default: xfs; an existing image keeps its own].
    #[arg(long, value_enum)]
    fs: Option<Fs>,
    /// Device size: bytes, or with a K, M, G or T suffix (powers of 1024);
    /// a multiple of memory.stripe_bytes × memory.controllers
    /// [default: 4G; an existing image keeps its own].
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Mount point (created if missing).
    #[arg(long, default_value = DEFAULT_MOUNT)]
    mount: PathBuf,
    /// Preset of the emulated device [default: the last `up`'s, else moneta-d].
    #[arg(long)]
    preset: Option<String>,
    /// Configuration file of the emulated device, instead of --preset
    /// (`moneta config dump`; monetad reads it again at each `up`).
    #[arg(long, value_name = "FILE.toml", conflicts_with = "preset")]
    config: Option<PathBuf>,
    /// Override a key of the device's configuration (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Make a new image and file system even if one exists (its files are lost).
    #[arg(long)]
    fresh: bool,
    /// How the kernel's own IO reaches the medium: `loop` (over the image,
    /// no device timing) or `device` (through the daemon's NBD export and
    /// nbdfuse, paying the device's timing) [default: loop].
    #[arg(long, value_enum)]
    kernel_path: Option<KernelPath>,
}

#[derive(Args)]
pub struct DownArgs {
    #[arg(long, default_value = DEFAULT_MOUNT)]
    mount: PathBuf,
    /// Also delete the image (and so its files) and the state directory.
    #[arg(long)]
    purge: bool,
}

#[derive(Args)]
pub struct StatusArgs {
    #[arg(long, value_enum, default_value_t = StatusFormat::Table)]
    format: StatusFormat,
}

/// `--size`: bytes, or K/M/G/T (optionally KiB, MiB, …) as powers of 1024
/// (the one parser, `moneta_model::units::parse_size`).
pub(crate) use moneta_model::units::parse_size;

/// `bytes` for messages: in the largest binary unit that divides it ("3 GiB"),
/// else to a tenth of a MiB, else in bytes.
pub(crate) fn human(bytes: u64) -> String {
    use moneta_model::units::{format_size, IEC_UNITS};
    if bytes >= 1 << 20 && !bytes.is_multiple_of(1 << 10) {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    } else {
        format_size(bytes as f64, true, &IEC_UNITS)
    }
}

// ---------------------------------------------------------------------------
// Instances and their records

/// The paths of one instance.
struct Instance {
    mount: PathBuf,
    dir: PathBuf,
    lock: PathBuf,
    image: PathBuf,
    record: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    /// Kernel path `device`: the daemon's NBD socket, the FUSE mount
    /// nbdfuse serves the export in, the file there, nbdfuse's log.
    nbd_socket: PathBuf,
    fuse_dir: PathBuf,
    fuse_file: PathBuf,
    fuse_log: PathBuf,
}

impl Instance {
    /// Loop devices of this instance, over the image or the nbdfuse file.
    fn loops(&self) -> Vec<PathBuf> {
        let mut l = loops_for(&self.image);
        l.extend(loops_for(&self.fuse_file));
        l
    }

    fn for_mount(mount: &Path) -> Result<Instance, String> {
        let mount = canonical(mount)?;
        let name = instance_name(&mount);
        Ok(Instance::at(run_dir().join(name), mount))
    }

    fn at(dir: PathBuf, mount: PathBuf) -> Instance {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        Instance {
            mount,
            lock: run_dir().join(format!(".lock-{name}")),
            image: dir.join("device.img"),
            record: dir.join("image.json"),
            state: dir.join("state.json"),
            socket: dir.join("monetad.sock"),
            log: dir.join("monetad.log"),
            nbd_socket: dir.join("nbd.sock"),
            fuse_dir: dir.join("nbd"),
            fuse_file: dir.join("nbd").join("device"),
            fuse_log: dir.join("nbdfuse.log"),
            dir,
        }
    }
}

/// `/run/moneta` with any symlink resolved, so the image path compares
/// equal to what the kernel reports as a loop device's backing file.
fn run_dir() -> PathBuf {
    fs::canonicalize(RUN_DIR).unwrap_or_else(|_| PathBuf::from(RUN_DIR))
}

/// The mount point as the kernel will name it: absolute, symlinks resolved
/// as far as the path exists, `.` and `..` removed from the rest.
fn canonical(path: &Path) -> Result<PathBuf, String> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| format!("the current directory: {e}"))?
            .join(path)
    };
    let mut base = abs.as_path();
    let mut rest = Vec::new();
    let mut out = loop {
        if let Ok(p) = fs::canonicalize(base) {
            break p;
        }
        match (base.components().next_back(), base.parent()) {
            (Some(last), Some(parent)) => {
                rest.push(last.as_os_str().to_os_string());
                base = parent;
            }
            _ => break PathBuf::from("/"),
        }
    };
    for c in rest.iter().rev() {
        match c.as_bytes() {
            b".." => {
                out.pop();
            }
            b"." => {}
            _ => out.push(c),
        }
    }
    Ok(out)
}

/// `/mnt/moneta` → `_mnt_moneta`: '/' becomes '_', and '_' and '%' are
/// percent-escaped so two mount points never share a name. A long path is
/// cut and given a hash of the whole path.
fn instance_name(mount: &Path) -> String {
    let mut name = String::new();
    for &b in mount.as_os_str().as_bytes() {
        match b {
            b'/' => name.push('_'),
            b'_' | b'%' => name.push_str(&format!("%{b:02X}")),
            b if b.is_ascii_graphic() || b == b' ' => name.push(b as char),
            b => name.push_str(&format!("%{b:02X}")),
        }
    }
    if name.len() <= MAX_NAME {
        return name;
    }
    // FNV-1a: collisions need 2^32 long paths.
    let hash = moneta_model::kernel::hash::fnv1a(mount.as_os_str().as_bytes());
    let keep = MAX_NAME - 17;
    format!("{}-{hash:016x}", &name[..keep])
}

/// The running instance; written last by `up`.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct State {
    mount: PathBuf,
    fs: Fs,
    size_bytes: u64,
    preset: String,
    /// The configuration file the preset came from (`up --config`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<PathBuf>,
    image: PathBuf,
    loop_device: PathBuf,
    socket: PathBuf,
    daemon_pid: u32,
    sets: Vec<String>,
    #[serde(default)]
    kernel_path: KernelPath,
    /// Kernel path `device`: the nbdfuse process serving the loop's file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nbdfuse_pid: Option<u32>,
}

/// What `device.img` holds, and how it was last served.
#[derive(Serialize, Deserialize, Clone, Debug)]
struct ImageRecord {
    mount: PathBuf,
    fs: Fs,
    size_bytes: u64,
    preset: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    config: Option<PathBuf>,
    sets: Vec<String>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, String> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// The socket and mount point of the instance mounted at `mount`, for
/// `moneta run`; an error if it is not up.
pub fn running(mount: &Path) -> Result<(PathBuf, PathBuf), String> {
    let inst = Instance::for_mount(mount)?;
    let state = read_state(&inst).ok_or_else(|| {
        format!(
            "nothing is up at {} (moneta up --mount {})",
            inst.mount.display(),
            inst.mount.display()
        )
    })?;
    if UnixStream::connect(&state.socket).is_err() {
        return Err(format!(
            "the daemon of {} is not answering on {} (moneta status; moneta up repairs it)",
            inst.mount.display(),
            state.socket.display()
        ));
    }
    Ok((state.socket, inst.mount))
}

/// The loop device under the instance mounted at `mount` (`moneta run`
/// reads its counters), if it is up.
pub fn loop_device_of(mount: &Path) -> Option<PathBuf> {
    let inst = Instance::for_mount(mount).ok()?;
    read_state(&inst).map(|s| s.loop_device)
}

/// A state.json that cannot be read counts as absent: the pieces are found
/// without it.
fn read_state(inst: &Instance) -> Option<State> {
    read_json(&inst.state).unwrap_or_else(|e| {
        eprintln!("moneta: ignoring {e}");
        None
    })
}

/// Write through a temporary file and rename, so a reader never sees half.
fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<(), String> {
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_string_pretty(value).expect("records serialize");
    fs::write(&tmp, text + "\n")
        .and_then(|()| fs::rename(&tmp, path))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

/// Serializes `up` and `down` of one mount point. The lock file lives as
/// long as the state directory: whoever holds the lock when the directory
/// is gone deletes the file, and a waiter then finds that the file it
/// locked is no longer the one at the path, and locks afresh. The
/// descriptor is close-on-exec (as all of std's), so the daemon does not
/// inherit the lock.
struct Lock {
    _file: fs::File,
    path: PathBuf,
    dir: PathBuf,
}

impl Lock {
    fn take(inst: &Instance) -> Result<Lock, String> {
        let mut told = false;
        loop {
            let f = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&inst.lock)
                .map_err(|e| format!("{}: {e}", inst.lock.display()))?;
            // SAFETY: flock(2) on a descriptor we own.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                if !told {
                    eprintln!(
                        "moneta: waiting for another moneta up/down on {}",
                        inst.mount.display()
                    );
                    told = true;
                }
                // SAFETY: as above.
                if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
                    return Err(format!(
                        "locking {}: {}",
                        inst.lock.display(),
                        io::Error::last_os_error()
                    ));
                }
            }
            let same = match (f.metadata(), fs::metadata(&inst.lock)) {
                (Ok(held), Ok(now)) => held.dev() == now.dev() && held.ino() == now.ino(),
                _ => false,
            };
            if same {
                return Ok(Lock {
                    _file: f,
                    path: inst.lock.clone(),
                    dir: inst.dir.clone(),
                });
            }
        }
    }
}

impl Drop for Lock {
    fn drop(&mut self) {
        if !self.dir.exists() {
            let _ = fs::remove_file(&self.path);
        }
    }
}

// ---------------------------------------------------------------------------
// The system: commands, mount table, loop devices, processes

/// Run a command; on failure the error names it and carries its stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<String, String> {
    let shown = format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = cmd.output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            format!(
                "{}: not found (install xfsprogs, e2fsprogs and util-linux)",
                cmd.get_program().to_string_lossy()
            )
        } else {
            format!("{shown}: {e}")
        }
    })?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    // Ctrl-C reaches the command too; say why it failed.
    interrupted()?;
    // mkfs.xfs follows its one-line complaint with a page of usage.
    let stderr = String::from_utf8_lossy(&out.stderr);
    let said: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .take(4)
        .collect();
    Err(format!(
        "{shown} failed ({}): {}",
        out.status,
        said.join("; ")
    ))
}

struct MountEntry {
    point: PathBuf,
    fstype: String,
    source: PathBuf,
}

/// /proc/self/mountinfo, whose fields escape space, tab, newline and
/// backslash as octal.
fn mounts() -> Vec<MountEntry> {
    fn unescape(s: &str) -> PathBuf {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
                let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
                out.push(v);
                i += 4;
            } else {
                out.push(b[i]);
                i += 1;
            }
        }
        PathBuf::from(OsString::from_vec(out))
    }
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let point = before.split(' ').nth(4)?;
            let mut after = after.split(' ');
            let fstype = after.next()?;
            let source = after.next()?;
            Some(MountEntry {
                point: unescape(point),
                fstype: fstype.to_string(),
                source: unescape(source),
            })
        })
        .collect()
}

/// What is visible at `dir` (the last mount there hides the others).
fn mounted_at(dir: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.point == dir)
}

/// Loop devices whose backing file is `image` (also once it was deleted).
fn loops_for(image: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    let mut devs: Vec<PathBuf> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("loop") {
                return None;
            }
            let backing = fs::read(e.path().join("loop/backing_file")).ok()?;
            let backing = backing.strip_suffix(b"\n").unwrap_or(&backing);
            let backing = backing.strip_suffix(b" (deleted)").unwrap_or(backing);
            (backing == image.as_os_str().as_bytes()).then(|| Path::new("/dev").join(name))
        })
        .collect();
    devs.sort();
    devs
}

/// The command line of `pid`, if it runs (zombies do not).
pub(crate) fn cmdline(pid: i32) -> Option<Vec<OsString>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The state follows the parenthesized command name, which may contain
    // anything, so look after the last ')'.
    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
    if matches!(state, 'Z' | 'X') {
        return None;
    }
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| OsString::from_vec(a.to_vec()))
            .collect(),
    )
}

/// Whether `pid` is a live `moneta serve … --socket SOCKET`: a pid from a
/// state file may have been reused by anything since.
pub(crate) fn is_our_daemon(pid: i32, socket: &Path) -> bool {
    daemon_sockets(pid).iter().any(|s| s == socket)
}

/// The sockets a live monetad serves: a `moneta serve`'s `--socket`, or
/// those of every device of a `moneta serve-group` (from its argument files).
pub(crate) fn daemon_sockets(pid: i32) -> Vec<PathBuf> {
    let Some(args) = cmdline(pid) else {
        return Vec::new();
    };
    if args.iter().any(|a| a == "serve-group") {
        return crate::emu::group_sockets(&args);
    }
    if !args.iter().any(|a| a == "serve") {
        return Vec::new();
    }
    args.windows(2)
        .find(|w| w[0] == "--socket")
        .map(|w| PathBuf::from(&w[1]))
        .into_iter()
        .collect()
}

/// Processes (other than this one and `except`) using the file system
/// with device number `dev`: as their working or root directory, through
/// an open descriptor, or through a memory mapping. (pid, name, how).
fn users_of(dev: u64, except: &[i32]) -> Vec<(i32, String, String)> {
    use std::os::unix::fs::MetadataExt;
    let me = std::process::id() as i32;
    let on = |p: &Path| fs::metadata(p).is_ok_and(|m| m.dev() == dev);
    let want = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir("/proc") else {
        return found;
    };
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| *p != me && !except.contains(p))
    {
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let mut how = Vec::new();
        for link in ["cwd", "root"] {
            if on(&proc_dir.join(link)) {
                how.push(link.to_string());
            }
        }
        if let Ok(fds) = fs::read_dir(proc_dir.join("fd")) {
            let open = fds.flatten().filter(|f| on(&f.path())).count();
            if open > 0 {
                how.push(format!("{open} open file(s)"));
            }
        }
        if fs::read_to_string(proc_dir.join("maps")).is_ok_and(|maps| {
            maps.lines()
                .any(|l| l.split_ascii_whitespace().nth(3) == Some(want.as_str()))
        }) {
            how.push("a mapped file".to_string());
        }
        if !how.is_empty() {
            let name = fs::read_to_string(proc_dir.join("comm"))
                .map(|c| c.trim().to_string())
                .unwrap_or_default();
            found.push((pid, name, how.join(", ")));
        }
    }
    found
}

fn daemon_pids(socket: &Path) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| is_our_daemon(pid, socket))
        .collect();
    pids.sort();
    pids
}

/// Collect `pid`'s exit status if it is our child that exited.
pub(crate) fn reap(pid: i32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on one pid; not our child gives ECHILD.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    (r == pid).then_some(status)
}

/// SIGTERM, up to STOP_GRACE for the daemon to remove its socket and go,
/// then SIGKILL. Returns whether there was a daemon to stop.
pub(crate) fn stop_daemon(pid: i32, socket: &Path) -> Result<bool, String> {
    reap(pid);
    if !is_our_daemon(pid, socket) {
        return Ok(false);
    }
    let wait_gone = |limit: Duration| {
        let deadline = Instant::now() + limit;
        loop {
            reap(pid);
            if !is_our_daemon(pid, socket) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    // SAFETY: kill(2) of a pid just checked to be our daemon.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    if wait_gone(STOP_GRACE) {
        return Ok(true);
    }
    eprintln!(
        "moneta: monetad (pid {pid}) ignored SIGTERM for {} s; killing it",
        STOP_GRACE.as_secs()
    );
    // SAFETY: as above; checked again just now by wait_gone.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    if wait_gone(Duration::from_secs(2)) {
        Ok(true)
    } else {
        Err(format!("monetad (pid {pid}) survived SIGKILL"))
    }
}

/// Unmount; a busy file system gets a few chances, then the error says how
/// to find who holds it.
fn unmount(dir: &Path) -> Result<(), String> {
    let mut attempt = 0;
    loop {
        match run(Command::new("umount").arg(dir)) {
            Ok(_) => return Ok(()),
            Err(e) if e.contains("busy") && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) if e.contains("busy") => {
                return Err(format!(
                    "{e}\nsomething still uses {0}: `fuser -vm {0}` lists it; stop it and run moneta down again",
                    dir.display()
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// Detach a loop device and wait until it is gone. Right after an unmount
/// the kernel may still hold the device for a moment; `losetup -d` then
/// only marks it to detach when released, so success means little until
/// the backing file disappears from sysfs.
fn detach(dev: &Path) -> Result<(), String> {
    let name = dev.file_name().unwrap_or_default();
    let backing = Path::new("/sys/block").join(name).join("loop/backing_file");
    // A device set to clear itself on its last close may already be going
    // when `losetup -d` runs (it then fails with "No such device or
    // address"): gone is what was asked, so only a device still attached
    // when every attempt failed is an error.
    let mut attempt = 0;
    while let Err(e) = run(Command::new("losetup").arg("-d").arg(dev)) {
        if !backing.exists() {
            return Ok(());
        }
        if attempt == 5 {
            return Err(e);
        }
        attempt += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + STOP_GRACE;
    while backing.exists() {
        if Instant::now() >= deadline {
            return Err(format!(
                "{} is still attached {} s after losetup -d: something holds it open",
                dev.display(),
                STOP_GRACE.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Stop the daemon, unmount and detach whatever of `inst` is still there;
/// the image stays. Returns what it did.
///
/// With the kernel path `device` the file system's blocks go through
/// nbdfuse and the daemon's NBD export, so those stop last: the file
/// system is unmounted (and its last writes land) while they still serve.
/// Over a plain loop device the daemon stops first (it may hold files of
/// the mount open).
fn teardown(inst: &Instance) -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    let device_path = mounted_at(&inst.fuse_dir).is_some()
        || !loops_for(&inst.fuse_file).is_empty()
        || !nbdfuse_pids(inst).is_empty();
    let stop_daemons = |done: &mut Vec<String>| -> Result<(), String> {
        for pid in daemon_pids(&inst.socket) {
            if stop_daemon(pid, &inst.socket)? {
                done.push(format!("stopped monetad (pid {pid})"));
            }
        }
        Ok(())
    };
    if !device_path {
        stop_daemons(&mut done)?;
    }
    // SAFETY: sync(2) has no preconditions.
    unsafe { libc::sync() };
    let loops = inst.loops();
    // Innermost first: mounts stacked on the mount point come later in the table.
    for m in mounts()
        .into_iter()
        .rev()
        .filter(|m| loops.contains(&m.source))
    {
        unmount(&m.point)?;
        done.push(format!("unmounted {}", m.point.display()));
    }
    for dev in inst.loops() {
        detach(&dev)?;
        done.push(format!("detached {}", dev.display()));
    }
    if device_path {
        if stop_nbdfuse(inst)? {
            done.push("stopped nbdfuse".to_string());
        }
        stop_daemons(&mut done)?;
    }
    for socket in [&inst.socket, &inst.nbd_socket] {
        match fs::remove_file(socket) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                return Err(format!("removing {}: {e}", socket.display()))
            }
            _ => {}
        }
    }
    Ok(done)
}

/// nbdfuse processes serving this instance's file.
fn nbdfuse_pids(inst: &Instance) -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| {
            cmdline(pid).is_some_and(|args| {
                args.first()
                    .is_some_and(|a| Path::new(a).file_name() == Some("nbdfuse".as_ref()))
                    && args.iter().any(|a| Path::new(a) == inst.fuse_file)
            })
        })
        .collect();
    pids.sort();
    pids
}

/// Unmount nbdfuse's FUSE mount (nbdfuse then exits), or kill nbdfuse if
/// it does not go; remove the mount directory. Whether there was one.
fn stop_nbdfuse(inst: &Instance) -> Result<bool, String> {
    let mut any = false;
    if mounted_at(&inst.fuse_dir).is_some() {
        any = true;
        if run(Command::new("umount").arg(&inst.fuse_dir)).is_err() {
            run(Command::new("umount").arg("-l").arg(&inst.fuse_dir))?;
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    loop {
        let pids = nbdfuse_pids(inst);
        if pids.is_empty() {
            break;
        }
        any = true;
        for &pid in &pids {
            reap(pid);
        }
        if Instant::now() >= deadline {
            for pid in pids {
                // SAFETY: kill(2) of a pid just checked to be our nbdfuse.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                reap(pid);
            }
            std::thread::sleep(Duration::from_millis(50));
            if !nbdfuse_pids(inst).is_empty() {
                return Err("nbdfuse survived SIGKILL".into());
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = fs::remove_dir(&inst.fuse_dir);
    Ok(any)
}

/// Which pieces of an instance run.
#[derive(Serialize)]
struct Alive {
    mounted: bool,
    loop_device: bool,
    daemon: bool,
    socket: bool,
    /// Kernel path `device`: nbdfuse serves the loop device's file (null
    /// when the kernel path is the plain loop device).
    nbdfuse: Option<bool>,
}

impl Alive {
    fn probe(inst: &Instance, state: Option<&State>) -> Alive {
        let loops = inst.loops();
        let mounted = mounted_at(&inst.mount).is_some_and(|m| loops.contains(&m.source));
        let (loop_device, daemon) = match state {
            Some(s) => (
                loops.contains(&s.loop_device),
                is_our_daemon(s.daemon_pid as i32, &inst.socket),
            ),
            None => (!loops.is_empty(), !daemon_pids(&inst.socket).is_empty()),
        };
        let device_path = state.map_or(
            mounted_at(&inst.fuse_dir).is_some() || !nbdfuse_pids(inst).is_empty(),
            |s| s.kernel_path == KernelPath::Device,
        );
        Alive {
            mounted,
            loop_device,
            daemon,
            socket: UnixStream::connect(&inst.socket).is_ok(),
            nbdfuse: device_path
                .then(|| mounted_at(&inst.fuse_dir).is_some() && !nbdfuse_pids(inst).is_empty()),
        }
    }

    fn all(&self) -> bool {
        self.mounted
            && self.loop_device
            && self.daemon
            && self.socket
            && self.nbdfuse != Some(false)
    }

    fn any(&self) -> bool {
        self.mounted || self.loop_device || self.daemon || self.socket || self.nbdfuse == Some(true)
    }

    /// The pieces that do not run, and state.json when pieces run without
    /// it (an `up` killed before it could finish or roll back).
    fn missing(&self, state: bool) -> Vec<&'static str> {
        let record = (!state && self.any()).then_some("state.json");
        [
            (self.mounted, "mount"),
            (self.loop_device, "loop device"),
            (self.daemon, "daemon"),
            (self.socket, "socket"),
            (self.nbdfuse != Some(false), "nbdfuse"),
        ]
        .into_iter()
        .filter(|(ok, _)| !ok)
        .map(|(_, what)| what)
        .chain(record)
        .collect()
    }
}

// ---------------------------------------------------------------------------
// Interrupts, fault injection and rollback

/// The signal that asked `up` to stop (0: none).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(sig, Ordering::Release);
}

/// Ctrl-C, SIGTERM or a closed terminal during `up` ends it between steps,
/// through the rollback, instead of killing it halfway.
pub(crate) fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Whether a signal `catch_signals` watches has come (`sim sweep` and
/// `calibrate` stop between points and print what they have).
pub(crate) fn signal_received() -> bool {
    INTERRUPTED.load(Ordering::Acquire) != 0
}

pub(crate) fn interrupted() -> Result<(), String> {
    match INTERRUPTED.load(Ordering::Acquire) {
        0 => Ok(()),
        sig => {
            let name = match sig {
                libc::SIGINT => "SIGINT",
                libc::SIGTERM => "SIGTERM",
                libc::SIGHUP => "SIGHUP",
                _ => "a signal",
            };
            Err(format!(
                "interrupted by {name}; undid everything up had done"
            ))
        }
    }
}

/// Between steps: stop if interrupted, and the test hook of FAULT_ENV.
fn checkpoint(step: &str) -> Result<(), String> {
    interrupted()?;
    let Ok(fault) = std::env::var(FAULT_ENV) else {
        return Ok(());
    };
    match fault.split_once('@') {
        Some(("fail", s)) if s == step => Err(format!("{FAULT_ENV}: failing after step {step}")),
        Some(("panic", s)) if s == step => panic!("{FAULT_ENV}: panicking after step {step}"),
        Some(("stall", s)) if s == step => {
            eprintln!("moneta: {FAULT_ENV}: stalled after step {step} until a signal");
            loop {
                interrupted()?;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        _ => Ok(()),
    }
}

type Undo = Box<dyn FnOnce() -> Result<(), String>>;

/// The undo of every step taken so far, run newest first when dropped
/// before `commit` (an error return, a panic, an interrupt).
#[derive(Default)]
pub(crate) struct Rollback {
    undo: Vec<(String, Undo)>,
}

impl Rollback {
    pub(crate) fn push(
        &mut self,
        what: impl Into<String>,
        undo: impl FnOnce() -> Result<(), String> + 'static,
    ) {
        self.undo.push((what.into(), Box::new(undo)));
    }

    pub(crate) fn commit(mut self) {
        self.undo.clear();
    }
}

impl Drop for Rollback {
    fn drop(&mut self) {
        while let Some((what, undo)) = self.undo.pop() {
            match undo() {
                Ok(()) => eprintln!("moneta: rolled back: {what}"),
                Err(e) => eprintln!("moneta: rolling back ({what}) failed: {e}"),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// up

/// The instance `up` is to bring up, every default resolved.
struct Wanted {
    fs: Fs,
    size: u64,
    /// The configuration's name: a preset's, or the file's.
    preset: String,
    /// The configuration file, when not a preset (absolute: monetad runs in `/`).
    config: Option<PathBuf>,
    sets: Vec<String>,
}

impl Wanted {
    /// Resolve the arguments against the image's record (when the image is
    /// reused: its file system and size are facts) and check the device
    /// configuration, all before anything is touched.
    fn resolve(
        a: &UpArgs,
        inst: &Instance,
        record: Option<&ImageRecord>,
    ) -> Result<Wanted, String> {
        let explicit = a.preset.is_some() || a.config.is_some() || !a.set.is_empty();
        let (preset, file, sets) = match record {
            Some(r) if !explicit => (r.preset.clone(), r.config.clone(), r.sets.clone()),
            _ => (
                a.preset
                    .clone()
                    .unwrap_or_else(|| DEFAULT_PRESET.to_string()),
                a.config
                    .as_deref()
                    .map(|p| {
                        fs::canonicalize(p).map_err(|e| format!("--config {}: {e}", p.display()))
                    })
                    .transpose()?,
                a.set.clone(),
            ),
        };
        let mut config = match &file {
            Some(p) => crate::config_file(p)?,
            None => Config::preset(&preset).map_err(|e| e.to_string())?,
        };
        let preset = config.name.clone();
        for kv in &sets {
            if kv.split('=').next().map(str::trim) == Some("device.capacity_bytes") {
                return Err(format!(
                    "--set {kv}: the capacity is the image's size; use --size"
                ));
            }
            config.set(kv).map_err(|e| format!("--set {kv}: {e}"))?;
        }
        let granule = config.memory.stripe_bytes * config.memory.controllers as u64;
        let (fs, size) = match record {
            Some(r) => {
                let image = inst.image.display();
                if let Some(fs) = a.fs.filter(|&f| f != r.fs) {
                    return Err(format!(
                        "{image} holds {}, not {}; --fresh makes a new image (its files are lost)",
                        r.fs.name(),
                        fs.name()
                    ));
                }
                if let Some(size) = a.size.filter(|&s| s != r.size_bytes) {
                    return Err(format!("{image} is {} bytes ({}), not {size}; --fresh makes a new image (its files are lost)", r.size_bytes, human(r.size_bytes)));
                }
                (r.fs, r.size_bytes)
            }
            None => (
                a.fs.unwrap_or(Fs::Xfs),
                a.size.unwrap_or(DEFAULT_SIZE.div_ceil(granule) * granule),
            ),
        };
        if !size.is_multiple_of(granule) {
            let below = size / granule * granule;
            let above = below + granule;
            let near = if below > 0 {
                format!("{below} or {above}")
            } else {
                above.to_string()
            };
            return Err(format!(
                "--size {size}: the device's capacity must be a multiple of memory.stripe_bytes × memory.controllers = {} × {} = {granule} bytes (preset {preset}); {near} would do",
                config.memory.stripe_bytes, config.memory.controllers
            ));
        }
        config
            .set(&format!("device.capacity_bytes={size}"))
            .map_err(|e| format!("--size {size}: {e}"))?;
        if fs == Fs::Xfs && size < XFS_MIN_BYTES {
            return Err(format!(
                "--size {size}: XFS needs at least {} ({XFS_MIN_BYTES} bytes); use --fs ext4 for a smaller device",
                human(XFS_MIN_BYTES)
            ));
        }
        Ok(Wanted {
            fs,
            size,
            preset,
            config: file,
            sets,
        })
    }

    fn record(&self, inst: &Instance) -> ImageRecord {
        ImageRecord {
            mount: inst.mount.clone(),
            fs: self.fs,
            size_bytes: self.size,
            preset: self.preset.clone(),
            config: self.config.clone(),
            sets: self.sets.clone(),
        }
    }
}

/// How the options given differ from a running instance (options not given
/// accept whatever runs).
fn differences(a: &UpArgs, s: &State) -> Vec<String> {
    let mut d = Vec::new();
    if let Some(fs) = a.fs.filter(|&f| f != s.fs) {
        d.push(format!("file system {} (asked {})", s.fs.name(), fs.name()));
    }
    if let Some(size) = a.size.filter(|&n| n != s.size_bytes) {
        d.push(format!("size {} bytes (asked {size})", s.size_bytes));
    }
    if let Some(file) = &a.config {
        let asked = fs::canonicalize(file).unwrap_or_else(|_| file.clone());
        if s.config.as_ref() != Some(&asked) {
            d.push(format!(
                "configuration {} (asked {})",
                s.config
                    .as_deref()
                    .map_or(format!("preset {}", s.preset), |p| p.display().to_string()),
                asked.display()
            ));
        }
    }
    if let Some(k) = a.kernel_path.filter(|&k| k != s.kernel_path) {
        d.push(format!(
            "kernel path {} (asked {})",
            s.kernel_path.name(),
            k.name()
        ));
    }
    if a.preset.is_some() || a.config.is_some() || !a.set.is_empty() {
        let preset = a.preset.as_deref().unwrap_or(DEFAULT_PRESET);
        if a.config.is_none() && (preset != s.preset || s.config.is_some()) {
            d.push(format!("preset {} (asked {preset})", s.preset));
        }
        if a.set != s.sets {
            d.push(format!("overrides {:?} (asked {:?})", s.sets, a.set));
        }
    }
    d
}

/// Loop devices and mounts are root's; say so up front rather than fail
/// halfway with EPERM.
pub(crate) fn need_root(what: &str) -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(format!(
            "moneta {what} needs root (it attaches loop devices and mounts)"
        ));
    }
    Ok(())
}

pub fn up(a: UpArgs) -> Result<(), String> {
    need_root("up")?;
    fs::create_dir_all(RUN_DIR).map_err(|e| format!("creating {RUN_DIR}: {e}"))?;
    let inst = Instance::for_mount(&a.mount)?;
    let mount = inst.mount.display().to_string();
    let _lock = Lock::take(&inst)?;

    let state = read_state(&inst);
    let mut missing = Vec::new();
    if let Some(s) = &state {
        let alive = Alive::probe(&inst, Some(s));
        missing = alive.missing(true);
        if alive.all() {
            if a.fresh {
                return Err(format!("{mount} is up: --fresh would replace the file system under it; moneta down --mount {mount} first"));
            }
            let diffs = differences(&a, s);
            if !diffs.is_empty() {
                return Err(format!(
                    "{mount} is already up with {}; moneta down --mount {mount} first",
                    diffs.join(", ")
                ));
            }
            println!(
                "{mount} is already up: {} {} on {}, monetad pid {} ({}) on {}",
                s.fs.name(),
                human(s.size_bytes),
                s.loop_device.display(),
                s.daemon_pid,
                s.preset,
                s.socket.display()
            );
            return Ok(());
        }
    }

    // An image is reused unless --fresh: never a new file system over files.
    let image_exists = inst.image.exists();
    let record = if a.fresh || !image_exists {
        None
    } else {
        Some(read_json::<ImageRecord>(&inst.record)?.ok_or_else(|| {
            format!(
                "{} exists but {} is missing, so what it holds is unknown (an up that died while making it?); --fresh makes a new image",
                inst.image.display(),
                inst.record.display()
            )
        })?)
    };
    let want = Wanted::resolve(&a, &inst, record.as_ref())?;

    // Half up (a crash, a reboot, a killed daemon) or leftovers of an `up`
    // killed before it could roll back: clear them, keeping the image.
    let cleaned = teardown(&inst)?;
    if state.is_some() || !cleaned.is_empty() {
        let gone = if missing.is_empty() {
            "left over from an up that did not finish".to_string()
        } else {
            format!("not running: {}", missing.join(", "))
        };
        let undone = if cleaned.is_empty() {
            String::new()
        } else {
            format!(" ({})", cleaned.join(", "))
        };
        eprintln!("moneta: {mount} was half up ({gone}); starting it over{undone}");
    }
    let _ = fs::remove_file(&inst.state);
    if let Some(m) = mounted_at(&inst.mount) {
        return Err(format!(
            "{mount} is already a mount point ({} from {}); choose another --mount",
            m.fstype,
            m.source.display()
        ));
    }

    // Checked before anything is made: a mount point that cannot be one.
    if let Some(p) = inst.mount.ancestors().find(|p| p.exists()) {
        if !p.is_dir() {
            return Err(format!(
                "{}: exists and is not a directory; choose another --mount",
                p.display()
            ));
        }
    }

    catch_signals();
    let mut rb = Rollback::default();
    if !inst.dir.exists() {
        fs::create_dir(&inst.dir).map_err(|e| format!("creating {}: {e}", inst.dir.display()))?;
        let dir = inst.dir.clone();
        rb.push(format!("removed {}", dir.display()), move || {
            fs::remove_dir_all(&dir).map_err(|e| e.to_string())
        });
    }

    let image_note = if record.is_none() {
        if image_exists {
            fs::remove_file(&inst.image)
                .map_err(|e| format!("removing the old {}: {e}", inst.image.display()))?;
            let _ = fs::remove_file(&inst.record);
            eprintln!("moneta: --fresh: removed the old image");
        }
        // Sparse: the medium costs only what is written.
        fs::File::create_new(&inst.image)
            .and_then(|f| f.set_len(want.size))
            .map_err(|e| match e.raw_os_error() {
                Some(libc::EFBIG) => format!(
                    "--size {}: larger than the largest file the file system under {RUN_DIR} \
                     can hold (the device's image lives there); choose a smaller --size",
                    human(want.size)
                ),
                _ => format!("creating {}: {e}", inst.image.display()),
            })?;
        let (image, record) = (inst.image.clone(), inst.record.clone());
        rb.push(format!("removed {}", image.display()), move || {
            let _ = fs::remove_file(&record);
            fs::remove_file(&image).map_err(|e| e.to_string())
        });
        checkpoint("image")?;
        run(&mut want.fs.mkfs(&inst.image))?;
        write_json(&inst.record, &want.record(&inst))?;
        checkpoint("mkfs")?;
        "new"
    } else {
        "reused"
    };

    let kernel_path = a.kernel_path.unwrap_or_default();
    let (dev, pid, nbdfuse_pid) = match kernel_path {
        KernelPath::Loop => {
            // Buffered (no --direct-io): the daemon maps the same file, and
            // only the page cache makes the two views one.
            let dev = attach_loop(&inst.image, false, &mut rb)?;
            mount_fs(&inst, &want, &dev, &mut rb)?;
            let pid = start_daemon(&inst, &want, false, &mut rb)?;
            checkpoint("daemon")?;
            (dev, pid, None)
        }
        KernelPath::Device => {
            // The daemon first: the loop device's blocks come from its NBD
            // export through nbdfuse. The loop uses direct I/O, so no page
            // cache sits between the file system and the device.
            let pid = start_daemon(&inst, &want, true, &mut rb)?;
            checkpoint("daemon")?;
            let fuse = start_nbdfuse(&inst, want.size, &mut rb)?;
            checkpoint("nbdfuse")?;
            let dev = attach_loop(&inst.fuse_file, true, &mut rb)?;
            mount_fs(&inst, &want, &dev, &mut rb)?;
            (dev, pid, Some(fuse))
        }
    };

    let state = State {
        mount: inst.mount.clone(),
        fs: want.fs,
        size_bytes: want.size,
        preset: want.preset.clone(),
        config: want.config.clone(),
        image: inst.image.clone(),
        loop_device: dev.clone(),
        socket: inst.socket.clone(),
        daemon_pid: pid,
        sets: want.sets.clone(),
        kernel_path,
        nbdfuse_pid,
    };
    write_json(&inst.state, &state)?;
    {
        let path = inst.state.clone();
        rb.push(format!("removed {}", path.display()), move || {
            fs::remove_file(&path).map_err(|e| e.to_string())
        });
    }
    checkpoint("state")?;
    // The preset and overrides the next plain `moneta up` will use.
    write_json(&inst.record, &want.record(&inst))?;
    rb.commit();

    println!(
        "{mount}: {} {} up ({} image {})\n  loop device {}{}\n  monetad pid {} ({}{}) on {}, log {}",
        want.fs.name(),
        human(want.size),
        image_note,
        inst.image.display(),
        dev.display(),
        match nbdfuse_pid {
            Some(f) => format!(
                " over {} (nbdfuse pid {f}, NBD {}): the kernel path pays the device's timing",
                inst.fuse_file.display(),
                inst.nbd_socket.display()
            ),
            None => " over the image: the kernel path has no device timing".to_string(),
        },
        pid,
        match &want.config {
            Some(file) => format!("{} from {}", want.preset, file.display()),
            None => want.preset.clone(),
        },
        want.sets
            .iter()
            .map(|s| format!(" --set {s}"))
            .collect::<String>(),
        inst.socket.display(),
        inst.log.display()
    );
    Ok(())
}

/// A loop device over `backing` (direct I/O or buffered), detached on rollback.
fn attach_loop(backing: &Path, direct_io: bool, rb: &mut Rollback) -> Result<PathBuf, String> {
    let mut cmd = Command::new("losetup");
    cmd.args(["--find", "--show"]);
    if direct_io {
        cmd.arg("--direct-io=on");
    }
    let dev = PathBuf::from(run(cmd.arg(backing))?.trim());
    {
        let dev = dev.clone();
        rb.push(format!("detached {}", dev.display()), move || detach(&dev));
    }
    checkpoint("loop")?;
    Ok(dev)
}

/// Mount the file system on `dev` at the mount point (made if missing),
/// unmounted on rollback.
fn mount_fs(inst: &Instance, want: &Wanted, dev: &Path, rb: &mut Rollback) -> Result<(), String> {
    refuse_non_empty(&inst.mount)?;
    let made = make_dirs(&inst.mount)?;
    // `down --purge` removes what `up` made, and only that.
    fs::write(
        inst.dir.join(MADE_DIRS),
        made.iter()
            .map(|d| format!("{}\n", d.display()))
            .collect::<String>(),
    )
    .map_err(|e| format!("{}: {e}", inst.dir.join(MADE_DIRS).display()))?;
    for dir in made.into_iter() {
        rb.push(format!("removed {}", dir.display()), move || {
            fs::remove_dir(&dir).map_err(|e| e.to_string())
        });
    }
    run(Command::new("mount")
        .args(["-t", want.fs.name()])
        .arg(dev)
        .arg(&inst.mount))?;
    {
        let dir = inst.mount.clone();
        // A rollback must not leave a mount behind: lazily if need be.
        rb.push(format!("unmounted {}", dir.display()), move || {
            unmount(&dir).or_else(|e| {
                run(Command::new("umount").arg("-l").arg(&dir))
                    .map(drop)
                    .map_err(|l| format!("{e}; lazily: {l}"))
            })
        });
    }
    checkpoint("mount")
}

/// nbdfuse serving the daemon's NBD export as `inst.fuse_file`, detached
/// like the daemon; returns its pid once the file is there with the
/// device's size.
fn start_nbdfuse(inst: &Instance, size: u64, rb: &mut Rollback) -> Result<u32, String> {
    if Command::new("nbdfuse").arg("--version").output().is_err() {
        return Err(
            "--kernel-path device needs nbdfuse (Debian: apt-get install libnbd-bin)".into(),
        );
    }
    let _ = fs::remove_dir(&inst.fuse_dir);
    fs::create_dir(&inst.fuse_dir)
        .map_err(|e| format!("creating {}: {e}", inst.fuse_dir.display()))?;
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&inst.fuse_log)
        .map_err(|e| format!("{}: {e}", inst.fuse_log.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let uri = moneta_nbd::unix_uri("moneta", &inst.nbd_socket);
    let mut cmd = Command::new("nbdfuse");
    cmd.arg(&inst.fuse_file).arg(&uri);
    let pid = spawn_detached(&mut cmd, log, &inst.fuse_log)
        .map_err(|e| format!("starting nbdfuse: {e}"))?;
    {
        let (dir, mount) = (inst.dir.clone(), inst.mount.clone());
        rb.push(format!("stopped nbdfuse (pid {pid})"), move || {
            stop_nbdfuse(&Instance::at(dir, mount)).map(drop)
        });
    }
    let started = Instant::now();
    loop {
        if let Some(status) = reap(pid as i32) {
            return Err(format!(
                "nbdfuse exited (status {status}) before serving {}; {}",
                inst.fuse_file.display(),
                log_tail(&inst.fuse_log, log_start)
            ));
        }
        if fs::metadata(&inst.fuse_file).is_ok_and(|m| m.len() == size) {
            return Ok(pid);
        }
        if started.elapsed() > SOCKET_WAIT {
            return Err(format!(
                "nbdfuse (pid {pid}) did not serve {} within {} s; {}",
                inst.fuse_file.display(),
                SOCKET_WAIT.as_secs(),
                log_tail(&inst.fuse_log, log_start)
            ));
        }
        interrupted()?;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The file in an instance's state directory naming the directories `up`
/// made for the mount point, outermost first.
const MADE_DIRS: &str = "made-dirs";

/// Mounting over a directory with files would hide them: say so instead.
fn refuse_non_empty(mount: &Path) -> Result<(), String> {
    let Ok(entries) = fs::read_dir(mount) else {
        return Ok(());
    };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .take(4)
        .collect();
    if names.is_empty() || mounted_at(mount).is_some() {
        return Ok(());
    }
    Err(format!(
        "{} is not empty ({}{}): mounting over it would hide its files; empty it or choose another --mount",
        mount.display(),
        names[..names.len().min(3)].join(", "),
        if names.len() > 3 { ", …" } else { "" }
    ))
}

/// Remove the directories `up` made for the mount point (innermost first,
/// only while empty); returns those removed.
fn remove_made_dirs(inst: &Instance) -> Vec<PathBuf> {
    let listed = fs::read_to_string(inst.dir.join(MADE_DIRS)).unwrap_or_default();
    listed
        .lines()
        .rev()
        .map(PathBuf::from)
        .filter(|d| fs::remove_dir(d).is_ok())
        .collect()
}

/// `mkdir -p` returning the directories it made, outermost first.
fn make_dirs(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut missing = Vec::new();
    let mut p = dir;
    loop {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(format!("{}: exists and is not a directory", p.display())),
            Err(_) => {
                missing.push(p.to_path_buf());
                match p.parent() {
                    Some(parent) => p = parent,
                    None => break,
                }
            }
        }
    }
    missing.reverse();
    for (i, d) in missing.iter().enumerate() {
        if let Err(e) = fs::create_dir(d) {
            // Undo our part before reporting: the caller registers nothing.
            for made in missing[..i].iter().rev() {
                let _ = fs::remove_dir(made);
            }
            return Err(format!("creating {}: {e}", d.display()));
        }
    }
    Ok(missing)
}

/// `moneta serve` on the image, detached: its own session (no terminal
/// signals, survives the shell), cwd `/` (never keeps a mount busy), output
/// to the log. Returns once it accepts connections.
fn start_daemon(
    inst: &Instance,
    want: &Wanted,
    nbd: bool,
    rb: &mut Rollback,
) -> Result<u32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("finding the moneta binary: {e}"))?;
    let mut log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&inst.log)
        .map_err(|e| format!("{}: {e}", inst.log.display()))?;
    let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
    let mut cmd = Command::new(&exe);
    cmd.arg("serve");
    match &want.config {
        Some(file) => cmd.arg("--config").arg(file),
        None => cmd.args(["--preset", &want.preset]),
    };
    for kv in &want.sets {
        cmd.arg("--set").arg(kv);
    }
    // The capacity last, after the overrides, as Wanted::resolve checked it.
    cmd.arg("--set")
        .arg(format!("device.capacity_bytes={}", want.size))
        .arg("--image")
        .arg(&inst.image)
        .arg("--socket")
        .arg(&inst.socket)
        // Every local user may reach the direct path of files the kernel
        // lets them open on the mount (PostgreSQL runs as postgres).
        .args(["--socket-mode", "0666"])
        .arg("--watch-fs")
        .arg(&inst.mount);
    if nbd {
        // The loop device goes over nbdfuse's file, which carries the
        // daemon's own export "moneta" (the whole medium): files there are
        // granted as on the image, so the direct path stays.
        cmd.arg("--nbd")
            .arg(format!("unix:{}", inst.nbd_socket.display()))
            .arg("--image-alias")
            .arg(&inst.fuse_file);
    }
    let _ = writeln!(
        log,
        "---- moneta up {}: {} {}",
        inst.mount.display(),
        exe.display(),
        cmd.get_args()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let pid = spawn_detached(&mut cmd, log, &inst.log)
        .map_err(|e| format!("starting {} serve: {e}", exe.display()))?;
    {
        let socket = inst.socket.clone();
        rb.push(format!("stopped monetad (pid {pid})"), move || {
            stop_daemon(pid as i32, &socket).map(drop)
        });
    }
    let started = Instant::now();
    loop {
        if let Some(status) = reap(pid as i32) {
            let how = if libc::WIFEXITED(status) {
                format!("exit code {}", libc::WEXITSTATUS(status))
            } else {
                format!("signal {}", libc::WTERMSIG(status))
            };
            return Err(format!(
                "monetad exited ({how}) before listening on {}; {}",
                inst.socket.display(),
                log_tail(&inst.log, log_start)
            ));
        }
        if UnixStream::connect(&inst.socket).is_ok() {
            return Ok(pid);
        }
        if started.elapsed() > SOCKET_WAIT {
            return Err(format!(
                "monetad (pid {pid}) did not listen on {} within {} s; {}",
                inst.socket.display(),
                SOCKET_WAIT.as_secs(),
                log_tail(&inst.log, log_start)
            ));
        }
        interrupted()?;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Start `cmd` detached: its own session (no terminal signals, survives the
/// shell), cwd `/` (never keeps a mount busy), output to `log` (at
/// `log_path`). Returns its pid: the process is managed by pid from here
/// (the handle would neither kill nor reap it on drop).
pub(crate) fn spawn_detached(
    cmd: &mut Command,
    log: fs::File,
    log_path: &Path,
) -> Result<u32, String> {
    let err_log = log
        .try_clone()
        .map_err(|e| format!("{}: {e}", log_path.display()))?;
    cmd.current_dir("/")
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err_log);
    // SAFETY: setsid(2) is async-signal-safe, and the closure touches
    // nothing else between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() == -1 {
                Err(io::Error::last_os_error())
            } else {
                Ok(())
            }
        });
    }
    let child = cmd.spawn().map_err(|e| e.to_string())?;
    Ok(child.id())
}

/// The last lines the daemon wrote since `from`.
pub(crate) fn log_tail(path: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(from));
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(15)..];
    format!("its log {} ends:\n{}", path.display(), tail.join("\n"))
}

// ---------------------------------------------------------------------------
// down

pub fn down(a: DownArgs) -> Result<(), String> {
    need_root("down")?;
    let inst = Instance::for_mount(&a.mount)?;
    let mount = inst.mount.display().to_string();
    // Without a state directory there is nothing of ours to lock; leftovers
    // (a state directory deleted by hand) are still found by path.
    let _lock = if inst.dir.exists() {
        Some(Lock::take(&inst)?)
    } else {
        None
    };
    let was_up = inst.state.exists();
    // A busy mount cannot be unmounted: refuse before stopping anything,
    // so the instance stays whole.
    if mounted_at(&inst.mount).is_some() {
        use std::os::unix::fs::MetadataExt;
        if let Ok(meta) = fs::metadata(&inst.mount) {
            let users = users_of(meta.dev(), &daemon_pids(&inst.socket));
            if !users.is_empty() {
                let list: Vec<String> = users
                    .iter()
                    .map(|(pid, name, how)| format!("pid {pid} ({name}): {how}"))
                    .collect();
                return Err(format!(
                    "{mount} is busy, nothing was stopped; these processes use it: {}",
                    list.join("; ")
                ));
            }
        }
    }
    let done = teardown(&inst)?;
    match fs::remove_file(&inst.state) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(format!("removing {}: {e}", inst.state.display()))
        }
        _ => {}
    }
    let what = if done.is_empty() {
        String::new()
    } else {
        format!(": {}", done.join(", "))
    };
    if !was_up && done.is_empty() && !a.purge {
        println!("{mount} is not up; nothing to do");
        return Ok(());
    }
    if a.purge {
        if inst.dir.exists() {
            let removed = remove_made_dirs(&inst);
            fs::remove_dir_all(&inst.dir)
                .map_err(|e| format!("removing {}: {e}", inst.dir.display()))?;
            let removed: String = removed
                .iter()
                .map(|d| format!(" and {}", d.display()))
                .collect();
            println!("{mount} down{what}; purged {}{removed}", inst.dir.display());
        } else {
            println!("{mount} down{what}; nothing to purge");
        }
    } else if inst.image.exists() {
        println!(
            "{mount} down{what}; kept {} (moneta up --mount {mount} brings its files back; --purge deletes it)",
            inst.image.display()
        );
    } else {
        println!("{mount} down{what}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// status

pub fn status(a: StatusArgs) -> Result<(), String> {
    let root = run_dir();
    let mut dirs: Vec<PathBuf> = match fs::read_dir(&root) {
        Ok(entries) => entries
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            // A SAN's directory is `moneta san status`'s, not a mount.
            .filter(|e| !e.file_name().to_string_lossy().starts_with("san-"))
            .map(|e| e.path())
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(format!("{}: {e}", root.display())),
    };
    dirs.sort();
    let rows: Vec<serde_json::Value> = dirs.into_iter().map(status_row).collect();
    match a.format {
        StatusFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("status serializes")
        ),
        StatusFormat::Table => print_status(&rows, &root),
    }
    Ok(())
}

fn status_row(dir: PathBuf) -> serde_json::Value {
    let probe_state = read_json::<State>(&dir.join("state.json"));
    let record = read_json::<ImageRecord>(&dir.join("image.json"))
        .ok()
        .flatten();
    let state = probe_state.as_ref().ok().and_then(Option::as_ref);
    let mount = state
        .map(|s| s.mount.clone())
        .or_else(|| record.as_ref().map(|r| r.mount.clone()));
    let inst = Instance::at(dir, mount.clone().unwrap_or_default());
    let alive = Alive::probe(&inst, state);
    let word = match (state.is_some(), alive.all(), alive.any()) {
        (true, true, _) => "up",
        (false, _, false) => "down",
        _ => "broken",
    };
    let missing = if word == "broken" {
        alive.missing(state.is_some())
    } else {
        Vec::new()
    };
    let (fs, size, preset, sets) = match (state, &record) {
        (Some(s), _) => (
            Some(s.fs),
            Some(s.size_bytes),
            Some(&s.preset),
            Some(&s.sets),
        ),
        (None, Some(r)) => (
            Some(r.fs),
            Some(r.size_bytes),
            Some(&r.preset),
            Some(&r.sets),
        ),
        _ => (None, None, None, None),
    };
    // What guards the direct path's blocks: the daemon says (README,
    // "Direct-path contract").
    let guard = (word == "up")
        .then(|| moneta::Moneta::connect(&inst.socket).ok()?.stats().ok())
        .flatten()
        .map(|s| s.guard);
    serde_json::json!({
        "mount": mount,
        "state": word,
        "guard": guard,
        "fs": fs.map(Fs::name),
        "size_bytes": size,
        "preset": preset,
        "sets": sets,
        "state_dir": inst.dir,
        "image": inst.image,
        "image_exists": inst.image.exists(),
        "loop_device": state.map(|s| &s.loop_device),
        "kernel_path": state.map(|s| s.kernel_path.name()),
        "nbdfuse_pid": state.and_then(|s| s.nbdfuse_pid),
        "socket": inst.socket,
        "daemon_pid": state.map(|s| s.daemon_pid),
        "log": inst.log,
        "missing": missing,
        "alive": alive,
        "error": probe_state.err(),
    })
}

fn print_status(rows: &[serde_json::Value], root: &Path) {
    if rows.is_empty() {
        println!("nothing under {}", root.display());
        return;
    }
    let text = |v: &serde_json::Value| match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut table = vec![[
        "MOUNT", "STATE", "FS", "SIZE", "PRESET", "LOOP", "PID", "SOCKET",
    ]
    .map(String::from)];
    let mut notes = Vec::new();
    for r in rows {
        table.push([
            text(&r["mount"]),
            text(&r["state"]),
            text(&r["fs"]),
            r["size_bytes"].as_u64().map_or("-".into(), human),
            text(&r["preset"]),
            text(&r["loop_device"]),
            text(&r["daemon_pid"]),
            if r["state"] == "down" {
                "-".into()
            } else {
                text(&r["socket"])
            },
        ]);
        let mount = text(&r["mount"]);
        match r["state"].as_str() {
            Some("broken") => notes.push(format!(
                "{mount}: broken, missing: {} (moneta up repairs, moneta down clears)",
                r["missing"]
                    .as_array()
                    .map(|m| m.iter().map(text).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default()
            )),
            Some("down") if r["image_exists"] == true => {
                notes.push(format!("{mount}: down, image kept: {}", text(&r["image"])))
            }
            Some("up") if r["guard"].is_string() => {
                notes.push(format!("{mount}: guarded by {}", text(&r["guard"])))
            }
            _ => {}
        }
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| {
            table
                .iter()
                .map(|row| row[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in &table {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    for n in notes {
        println!("{n}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn up_refuses_a_non_empty_mount_point_and_purge_removes_only_its_dirs() {
        let root = std::env::temp_dir().join(format!("moneta-mount-dirs-{}", std::process::id()));
        let full = root.join("full");
        fs::create_dir_all(&full).unwrap();
        fs::write(full.join("precious.txt"), "x").unwrap();
        let e = refuse_non_empty(&full).unwrap_err();
        assert!(e.contains("not empty") && e.contains("precious.txt"), "{e}");
        assert!(refuse_non_empty(&root.join("missing")).is_ok());
        let inst = Instance::at(root.join("state"), root.join("a/b/mnt"));
        fs::create_dir_all(&inst.dir).unwrap();
        let made = make_dirs(&inst.mount).unwrap();
        assert_eq!(made.len(), 3);
        fs::write(
            inst.dir.join(MADE_DIRS),
            made.iter()
                .map(|d| format!("{}\n", d.display()))
                .collect::<String>(),
        )
        .unwrap();
        assert_eq!(remove_made_dirs(&inst).len(), 3);
        assert!(!root.join("a").exists() && full.exists());
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn names_are_distinct_and_short() {
        assert_eq!(instance_name(Path::new("/mnt/moneta")), "_mnt_moneta");
        assert_ne!(
            instance_name(Path::new("/a_b/c")),
            instance_name(Path::new("/a/b_c"))
        );
        assert_ne!(
            instance_name(Path::new("/a_/b")),
            instance_name(Path::new("/a/_b"))
        );
        let long = format!("/{}", "x".repeat(300));
        let other = format!("/{}y", "x".repeat(299));
        let (a, b) = (
            instance_name(Path::new(&long)),
            instance_name(Path::new(&other)),
        );
        assert!(a.len() <= MAX_NAME && b.len() <= MAX_NAME);
        assert_ne!(a, b);
    }

    #[test]
    fn mount_points_are_made_absolute_and_clean() {
        let missing = canonical(Path::new("/nonexistent-moneta/x/../y/./z")).unwrap();
        assert_eq!(missing, Path::new("/nonexistent-moneta/y/z"));
        assert_eq!(canonical(Path::new("/")).unwrap(), Path::new("/"));
    }
}
