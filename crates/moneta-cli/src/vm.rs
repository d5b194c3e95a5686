//! `moneta vm run`: a real guest kernel on the emulated device (QEMU with
//! the device as its vhost-user-blk disk, crates/moneta-vhost); `moneta vm
//! compare` ([`compare`]): the same fio job through the guest's kernel, the
//! host's direct path and the simulator's kernel stacks.

mod compare;

use crate::DeviceArgs;
use clap::{Args, Subcommand};
use moneta_emu::control::ControlPlane;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_vhost::guest::{RunSpec, DEFAULT_PROGRAMS};
use moneta_vhost::vm::{self, VmSpec};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Where kernels and initramfs images are kept between runs.
pub const DEFAULT_CACHE: &str = "/var/cache/moneta/vm";

#[derive(Subcommand)]
pub enum Vm {
    /// Boot a guest with the device as /dev/vda, run CMD in it, print its
    /// output and exit with its exit code.
    Run(VmRunArgs),
    /// The same fio job on the guest's raw device, on XFS in the guest,
    /// through the host's user-space direct path and through the
    /// simulator's kernel stacks: one table (and figure) with the verdicts.
    Compare(compare::VmCompareArgs),
}

#[derive(Args)]
pub struct VmRunArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Random seed of the device model.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep the medium in this image file (created if missing). Default:
    /// anonymous memory.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Make this file system on /dev/vda in the guest and mount it on /mnt
    /// (the command runs there): xfs.
    #[arg(long)]
    mount_fs: Option<String>,
    /// Copy this host file into the guest's /files (repeatable).
    #[arg(long = "put", value_name = "FILE")]
    put: Vec<PathBuf>,
    /// Also copy this host program (and its shared libraries) into the
    /// guest (repeatable; fio, mkfs.xfs, xfs_repair and xfs_io always are).
    #[arg(long = "program", value_name = "NAME")]
    program: Vec<String>,
    /// Export the device read-only (VIRTIO_BLK_F_RO).
    #[arg(long)]
    read_only: bool,
    /// Guest memory (MiB).
    #[arg(long, default_value_t = 512)]
    memory_mib: u64,
    /// Kill QEMU and fail after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// Use TCG even where KVM is usable.
    #[arg(long)]
    tcg: bool,
    /// Do not copy the guest's console (boot messages) to stderr.
    #[arg(long)]
    quiet: bool,
    /// The kernel and initramfs cache.
    #[arg(long, default_value = DEFAULT_CACHE)]
    cache: PathBuf,
    /// The vhost-user socket [default: /tmp/moneta-vm-PID.sock].
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The command to run in the guest (through its busybox sh).
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

pub fn vm(v: Vm) -> Result<(), String> {
    match v {
        Vm::Run(a) => run(a),
        Vm::Compare(a) => compare::compare(a),
    }
}

/// The emulated device of `device` (in memory, or in `image`) and its
/// control plane; the preset's name.
fn start_device(
    device: &DeviceArgs,
    seed: u64,
    image: Option<&std::path::Path>,
) -> Result<(Arc<Engine>, Arc<ControlPlane>, String), String> {
    let config = device.config()?;
    let medium = match image {
        Some(p) => Medium::image(p, config.device.capacity_bytes),
        None => Medium::anonymous(config.device.capacity_bytes),
    }
    .map_err(|e| e.to_string())?;
    let preset = config.name.clone();
    let options = EngineOptions {
        seed,
        ..EngineOptions::default()
    };
    let engine = Arc::new(Engine::start(config, medium, options).map_err(|e| e.to_string())?);
    // SAFETY: geteuid has no preconditions.
    let plane = Arc::new(ControlPlane::new(engine.clone(), unsafe {
        libc::geteuid()
    }));
    Ok((engine, plane, preset))
}

/// The vhost-user socket of this process, unless one was given.
fn socket_or_default(socket: Option<&PathBuf>, tag: &str) -> PathBuf {
    socket.cloned().unwrap_or_else(|| {
        PathBuf::from(format!("/tmp/moneta-vm-{}{tag}.sock", std::process::id()))
    })
}

fn run(a: VmRunArgs) -> Result<(), String> {
    let (engine, plane, preset) = start_device(&a.device, a.seed, a.image.as_deref())?;
    let mut programs: Vec<String> = DEFAULT_PROGRAMS.iter().map(|p| p.to_string()).collect();
    programs.extend(a.program.iter().cloned());
    let spec = VmSpec {
        cache: a.cache.clone(),
        programs,
        run: RunSpec {
            command: a.command.clone(),
            mount_fs: a.mount_fs.clone(),
            files: a.put.clone(),
        },
        memory_mib: a.memory_mib,
        timeout: Duration::from_secs(a.timeout_s),
        read_only: a.read_only,
        socket: socket_or_default(a.socket.as_ref(), ""),
        echo_console: !a.quiet,
        echo_output: true,
        force_tcg: a.tcg,
        mark_prefix: None,
    };
    let r = vm::run(&plane, &spec)?;
    engine
        .medium()
        .flush()
        .map_err(|e| format!("flushing the medium: {e}"))?;
    let s = &r.stats;
    let o = &r.outcome;
    eprintln!(
        "vm: {}; kernel {}, preset {preset}; {}",
        r.accel.label(),
        r.kernel_release,
        r.accel_reason
    );
    eprintln!(
        "vm: command started at {} s of guest uptime; {:.1} s wall in all",
        o.guest_uptime_at_command_s
            .map_or("?".into(), |t| format!("{t:.2}")),
        o.wall.as_secs_f64()
    );
    eprintln!(
        "vm: {} virtio requests ({} reads, {} writes, {} flushes; {} malformed, {} not OK); \
         {} device requests, model {:.1} µs mean, seen by the backend after {:.1} µs, {:.1} µs behind the model; {}",
        s.requests,
        s.reads,
        s.writes,
        s.flushes,
        s.malformed,
        s.errors,
        s.device_requests,
        s.modeled_ns_mean / 1e3,
        s.wall_ns_mean / 1e3,
        s.behind_ns_mean / 1e3,
        r.verdict
    );
    if let Some(e) = &r.backend_error {
        eprintln!("vm: vhost-user backend: {e}");
    }
    if let Some(f) = &o.failure {
        return Err(format!("vm: {f}"));
    }
    match o.exit_code {
        Some(0) => Ok(()),
        Some(code) => {
            drop(plane);
            drop(engine);
            std::process::exit(code.clamp(1, 255))
        }
        None => Err("vm: no exit code from the guest".into()),
    }
}
