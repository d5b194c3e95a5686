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
//!
//! The mechanisms (processes, the lock and the records, the rollback, the
//! mount table, loop devices, /proc) are `moneta_supervisor`'s, shared with
//! `moneta san up`; this file holds what an instance of a mount point is.

use crate::error::{Error, Result};
use clap::{Args, ValueEnum};
use moneta_model::config::Config;
use moneta_supervisor::daemon::{daemon_pids, is_our_daemon, stop_daemon};
use moneta_supervisor::process::{Launch, Stop};
use moneta_supervisor::signals::{catch_signals, interrupted};
use moneta_supervisor::state::{read_json, write_atomic, write_json, StateDir};
use moneta_supervisor::system::{
    self, loops_for, mounted_at, mounts, processes_where, run, runs_program, unmount,
};
use moneta_supervisor::{Rollback, READY_WAIT, STOP_GRACE};
use serde::{Deserialize, Serialize};
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(crate) const RUN_DIR: &str = "/run/moneta";
const DEFAULT_MOUNT: &str = "/mnt/moneta";
const DEFAULT_PRESET: &str = "moneta-d";
const DEFAULT_SIZE: u64 = 4 << 30;
/// mkfs.xfs refuses anything smaller.
const XFS_MIN_BYTES: u64 = 300 << 20;
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
    use moneta_model::units::{format_mib, format_size, IEC_UNITS};
    if bytes >= 1 << 20 && !bytes.is_multiple_of(1 << 10) {
        format_mib(bytes)
    } else {
        format_size(bytes as f64, true, &IEC_UNITS)
    }
}

// ---------------------------------------------------------------------------
// Instances and their records

/// The paths of one instance.
struct Instance {
    mount: PathBuf,
    /// `/run/moneta/<name>/` and its lock `/run/moneta/.lock-<name>`.
    sd: StateDir,
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

    fn for_mount(mount: &Path) -> Result<Instance> {
        let mount = canonical(mount)?;
        let name = instance_name(&mount);
        Ok(Instance::at(run_dir().join(name), mount))
    }

    fn at(dir: PathBuf, mount: PathBuf) -> Instance {
        let name = dir.file_name().unwrap_or_default().to_string_lossy();
        let lock = run_dir().join(format!(".lock-{name}"));
        Instance {
            mount,
            image: dir.join("device.img"),
            record: dir.join("image.json"),
            state: dir.join("state.json"),
            socket: dir.join("monetad.sock"),
            log: dir.join("monetad.log"),
            nbd_socket: dir.join("nbd.sock"),
            fuse_dir: dir.join("nbd"),
            fuse_file: dir.join("nbd").join("device"),
            fuse_log: dir.join("nbdfuse.log"),
            sd: StateDir { dir, lock },
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
fn canonical(path: &Path) -> Result<PathBuf> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir()
            .map_err(|e| Error::failed_with("the current directory", e))?
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

/// The socket and mount point of the instance mounted at `mount`, for
/// `moneta run`; an error if it is not up.
pub fn running(mount: &Path) -> Result<(PathBuf, PathBuf)> {
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
        )
        .into());
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

/// Stop the daemon, unmount and detach whatever of `inst` is still there;
/// the image stays. Returns what it did.
///
/// With the kernel path `device` the file system's blocks go through
/// nbdfuse and the daemon's NBD export, so those stop last: the file
/// system is unmounted (and its last writes land) while they still serve.
/// Over a plain loop device the daemon stops first (it may hold files of
/// the mount open).
fn teardown(inst: &Instance) -> Result<Vec<String>> {
    let mut done = Vec::new();
    let device_path = mounted_at(&inst.fuse_dir).is_some()
        || !loops_for(&inst.fuse_file).is_empty()
        || !nbdfuse_pids(inst).is_empty();
    let stop_daemons = |done: &mut Vec<String>| -> Result<()> {
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
        system::detach_loop(&dev)?;
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
                return Err(format!("removing {}: {e}", socket.display()).into())
            }
            _ => {}
        }
    }
    Ok(done)
}

/// nbdfuse processes serving this instance's file.
fn nbdfuse_pids(inst: &Instance) -> Vec<i32> {
    processes_where(|args| {
        runs_program(args, "nbdfuse") && args.iter().any(|a| Path::new(a) == inst.fuse_file)
    })
}

/// Unmount nbdfuse's FUSE mount (nbdfuse then exits), or kill nbdfuse if
/// it does not go; remove the mount directory. Whether there was one.
fn stop_nbdfuse(inst: &Instance) -> Result<bool> {
    let mut any = false;
    if mounted_at(&inst.fuse_dir).is_some() {
        any = true;
        if run(Command::new("umount").arg(&inst.fuse_dir)).is_err() {
            run(Command::new("umount").arg("-l").arg(&inst.fuse_dir))?;
        }
    }
    let stop = Stop {
        what: "nbdfuse",
        ask: None,
        grace: STOP_GRACE,
    };
    for pid in nbdfuse_pids(inst) {
        any |= stop.run(pid, |p| nbdfuse_pids(inst).contains(&p))?;
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
// Fault injection

/// Between steps: stop if interrupted, and the test hook of FAULT_ENV.
fn checkpoint(step: &str) -> Result<()> {
    interrupted()?;
    let Ok(fault) = std::env::var(FAULT_ENV) else {
        return Ok(());
    };
    match fault.split_once('@') {
        Some(("fail", s)) if s == step => {
            Err(format!("{FAULT_ENV}: failing after step {step}").into())
        }
        Some(("panic", s)) if s == step => panic!("{FAULT_ENV}: panicking after step {step}"),
        Some(("stall", s)) if s == step => {
            eprintln!("moneta: {FAULT_ENV}: stalled after step {step} until a signal");
            loop {
                interrupted()?;
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }
        _ => Ok(()),
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
    fn resolve(a: &UpArgs, inst: &Instance, record: Option<&ImageRecord>) -> Result<Wanted> {
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
                        fs::canonicalize(p)
                            .map_err(|e| Error::io(format!("--config {}", p.display()), e))
                    })
                    .transpose()?,
                a.set.clone(),
            ),
        };
        let mut config = match &file {
            Some(p) => crate::config_file(p)?,
            None => Config::preset(&preset).map_err(|e| Error::config("", e))?,
        };
        let preset = config.name.clone();
        for kv in &sets {
            if kv.split('=').next().map(str::trim) == Some("device.capacity_bytes") {
                return Err(Error::usage(format!(
                    "--set {kv}: the capacity is the image's size; use --size"
                )));
            }
            config
                .set(kv)
                .map_err(|e| Error::config(format!("--set {kv}"), e))?;
        }
        let granule = config.memory.stripe_bytes * config.memory.controllers as u64;
        let (fs, size) = match record {
            Some(r) => {
                let image = inst.image.display();
                if let Some(fs) = a.fs.filter(|&f| f != r.fs) {
                    return Err(Error::usage(format!(
                        "{image} holds {}, not {}; --fresh makes a new image (its files are lost)",
                        r.fs.name(),
                        fs.name()
                    )));
                }
                if let Some(size) = a.size.filter(|&s| s != r.size_bytes) {
                    return Err(Error::usage(format!("{image} is {} bytes ({}), not {size}; --fresh makes a new image (its files are lost)", r.size_bytes, human(r.size_bytes))));
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
            return Err(Error::usage(format!(
                "--size {size}: the device's capacity must be a multiple of memory.stripe_bytes × memory.controllers = {} × {} = {granule} bytes (preset {preset}); {near} would do",
                config.memory.stripe_bytes, config.memory.controllers
            )));
        }
        config
            .set(&format!("device.capacity_bytes={size}"))
            .map_err(|e| Error::config(format!("--size {size}"), e))?;
        if fs == Fs::Xfs && size < XFS_MIN_BYTES {
            return Err(Error::usage(format!(
                "--size {size}: XFS needs at least {} ({XFS_MIN_BYTES} bytes); use --fs ext4 for a smaller device",
                human(XFS_MIN_BYTES)
            )));
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
pub(crate) fn need_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Error::usage(format!(
            "moneta {what} needs root (it attaches loop devices and mounts)"
        )));
    }
    Ok(())
}

pub fn up(a: UpArgs) -> Result<()> {
    need_root("up")?;
    fs::create_dir_all(RUN_DIR)
        .map_err(|e| Error::failed_with(format!("creating {RUN_DIR}"), e))?;
    let inst = Instance::for_mount(&a.mount)?;
    let mount = inst.mount.display().to_string();
    let _lock = inst.sd.lock(&format!("moneta up/down on {mount}"))?;

    let state = read_state(&inst);
    let mut missing = Vec::new();
    if let Some(s) = &state {
        let alive = Alive::probe(&inst, Some(s));
        missing = alive.missing(true);
        if alive.all() {
            if a.fresh {
                return Err(format!("{mount} is up: --fresh would replace the file system under it; moneta down --mount {mount} first").into());
            }
            let diffs = differences(&a, s);
            if !diffs.is_empty() {
                return Err(format!(
                    "{mount} is already up with {}; moneta down --mount {mount} first",
                    diffs.join(", ")
                )
                .into());
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
        )
        .into());
    }

    // Checked before anything is made: a mount point that cannot be one.
    if let Some(p) = inst.mount.ancestors().find(|p| p.exists()) {
        if !p.is_dir() {
            return Err(format!(
                "{}: exists and is not a directory; choose another --mount",
                p.display()
            )
            .into());
        }
    }

    catch_signals();
    let mut rb = Rollback::default();
    if !inst.sd.dir.exists() {
        fs::create_dir(&inst.sd.dir)
            .map_err(|e| Error::failed_with(format!("creating {}", inst.sd.dir.display()), e))?;
        let dir = inst.sd.dir.clone();
        rb.push(format!("removed {}", dir.display()), move || {
            fs::remove_dir_all(&dir)
        });
    }

    let image_note = if record.is_none() {
        if image_exists {
            fs::remove_file(&inst.image).map_err(|e| {
                Error::failed_with(format!("removing the old {}", inst.image.display()), e)
            })?;
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
            fs::remove_file(&image)
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
            fs::remove_file(&path)
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
fn attach_loop(backing: &Path, direct_io: bool, rb: &mut Rollback) -> Result<PathBuf> {
    let dev = system::attach_loop(backing, direct_io)?;
    {
        let dev = dev.clone();
        rb.push(format!("detached {}", dev.display()), move || {
            system::detach_loop(&dev)
        });
    }
    checkpoint("loop")?;
    Ok(dev)
}

/// Mount the file system on `dev` at the mount point (made if missing),
/// unmounted on rollback.
fn mount_fs(inst: &Instance, want: &Wanted, dev: &Path, rb: &mut Rollback) -> Result<()> {
    refuse_non_empty(&inst.mount)?;
    let made = make_dirs(&inst.mount)?;
    // `down --purge` removes what `up` made, and only that.
    write_atomic(
        &inst.sd.path(MADE_DIRS),
        made.iter()
            .map(|d| format!("{}\n", d.display()))
            .collect::<String>()
            .as_bytes(),
    )?;
    for dir in made.into_iter() {
        rb.push(format!("removed {}", dir.display()), move || {
            fs::remove_dir(&dir)
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
            system::unmount_or_lazily(&dir)
        });
    }
    checkpoint("mount")
}

/// nbdfuse serving the daemon's NBD export as `inst.fuse_file`, detached
/// like the daemon; returns its pid once the file is there with the
/// device's size.
fn start_nbdfuse(inst: &Instance, size: u64, rb: &mut Rollback) -> Result<u32> {
    if Command::new("nbdfuse").arg("--version").output().is_err() {
        return Err(
            "--kernel-path device needs nbdfuse (Debian: apt-get install libnbd-bin)".into(),
        );
    }
    let _ = fs::remove_dir(&inst.fuse_dir);
    fs::create_dir(&inst.fuse_dir)
        .map_err(|e| Error::failed_with(format!("creating {}", inst.fuse_dir.display()), e))?;
    let uri = moneta_nbd::unix_uri("moneta", &inst.nbd_socket);
    let mut cmd = Command::new("nbdfuse");
    cmd.arg(&inst.fuse_file).arg(&uri);
    let (dir, mount) = (inst.sd.dir.clone(), inst.mount.clone());
    let serving = format!("serving {}", inst.fuse_file.display());
    let pid = Launch {
        what: "nbdfuse",
        log: &inst.fuse_log,
        banner: None,
        limit: READY_WAIT,
    }
    .start(
        &mut cmd,
        rb,
        move |_| stop_nbdfuse(&Instance::at(dir, mount)).map(drop),
        || (!fs::metadata(&inst.fuse_file).is_ok_and(|m| m.len() == size)).then(|| serving.clone()),
    )?;
    Ok(pid)
}

/// The file in an instance's state directory naming the directories `up`
/// made for the mount point, outermost first.
const MADE_DIRS: &str = "made-dirs";

/// Mounting over a directory with files would hide them: say so instead.
fn refuse_non_empty(mount: &Path) -> Result<()> {
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
    ).into())
}

/// Remove the directories `up` made for the mount point (innermost first,
/// only while empty); returns those removed.
fn remove_made_dirs(inst: &Instance) -> Vec<PathBuf> {
    let listed = fs::read_to_string(inst.sd.dir.join(MADE_DIRS)).unwrap_or_default();
    listed
        .lines()
        .rev()
        .map(PathBuf::from)
        .filter(|d| fs::remove_dir(d).is_ok())
        .collect()
}

/// `mkdir -p` returning the directories it made, outermost first.
fn make_dirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut missing = Vec::new();
    let mut p = dir;
    loop {
        match fs::metadata(p) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(format!("{}: exists and is not a directory", p.display()).into()),
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
            return Err(format!("creating {}: {e}", d.display()).into());
        }
    }
    Ok(missing)
}

/// `moneta serve` on the image, detached: its own session (no terminal
/// signals, survives the shell), cwd `/` (never keeps a mount busy), output
/// to the log. Returns once it accepts connections.
fn start_daemon(inst: &Instance, want: &Wanted, nbd: bool, rb: &mut Rollback) -> Result<u32> {
    let exe =
        std::env::current_exe().map_err(|e| Error::failed_with("finding the moneta binary", e))?;
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
    let pid = moneta_supervisor::daemon::start_daemon(
        &mut cmd,
        "monetad",
        &inst.log,
        &format!("moneta up {}", inst.mount.display()),
        std::slice::from_ref(&inst.socket),
        rb,
    )?;
    Ok(pid)
}

// ---------------------------------------------------------------------------
// down

pub fn down(a: DownArgs) -> Result<()> {
    need_root("down")?;
    let inst = Instance::for_mount(&a.mount)?;
    let mount = inst.mount.display().to_string();
    // Without a state directory there is nothing of ours to lock; leftovers
    // (a state directory deleted by hand) are still found by path.
    let _lock = if inst.sd.dir.exists() {
        Some(inst.sd.lock(&format!("moneta up/down on {mount}"))?)
    } else {
        None
    };
    let was_up = inst.state.exists();
    // A busy mount cannot be unmounted: refuse before stopping anything,
    // so the instance stays whole.
    if mounted_at(&inst.mount).is_some() {
        use std::os::unix::fs::MetadataExt;
        if let Ok(meta) = fs::metadata(&inst.mount) {
            let users = system::users_of(meta.dev(), &daemon_pids(&inst.socket));
            if !users.is_empty() {
                let list: Vec<String> = users
                    .iter()
                    .map(|u| format!("pid {} ({}): {}", u.pid, u.name, u.how))
                    .collect();
                return Err(format!(
                    "{mount} is busy, nothing was stopped; these processes use it: {}",
                    list.join("; ")
                )
                .into());
            }
        }
    }
    let done = teardown(&inst)?;
    match fs::remove_file(&inst.state) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(format!("removing {}: {e}", inst.state.display()).into())
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
        if inst.sd.dir.exists() {
            let removed = remove_made_dirs(&inst);
            fs::remove_dir_all(&inst.sd.dir).map_err(|e| {
                Error::failed_with(format!("removing {}", inst.sd.dir.display()), e)
            })?;
            let removed: String = removed
                .iter()
                .map(|d| format!(" and {}", d.display()))
                .collect();
            println!(
                "{mount} down{what}; purged {}{removed}",
                inst.sd.dir.display()
            );
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

pub fn status(a: StatusArgs) -> Result<()> {
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
        Err(e) => return Err(format!("{}: {e}", root.display()).into()),
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
        "state_dir": inst.sd.dir,
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
        "error": probe_state.err().map(|e| e.to_string()),
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
        let e = refuse_non_empty(&full).unwrap_err().to_string();
        assert!(e.contains("not empty") && e.contains("precious.txt"), "{e}");
        assert!(refuse_non_empty(&root.join("missing")).is_ok());
        let inst = Instance::at(root.join("state"), root.join("a/b/mnt"));
        fs::create_dir_all(&inst.sd.dir).unwrap();
        let made = make_dirs(&inst.mount).unwrap();
        assert_eq!(made.len(), 3);
        fs::write(
            inst.sd.dir.join(MADE_DIRS),
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
