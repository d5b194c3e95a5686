//! One guest run on the emulated device: the kernel and initramfs
//! ([`crate::guest`]), the vhost-user-blk backend on a channel of the
//! device ([`crate::backend`]), QEMU ([`crate::qemu`]), and what the
//! device saw of it (requests, model time, how far behind the model's time
//! the backend saw completions, and the verdict on that).

use crate::backend::{BlkBackend, ChannelTarget, Stats, StatsSnapshot, VhostServer};
use crate::guest::{self, RunSpec};
use crate::qemu::{self, Accel, Boot, Outcome};
use moneta_emu::control::ControlPlane;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How long the backend's thread may take to end once QEMU is gone.
const SERVER_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct VmSpec {
    /// Where the kernel and initramfs are cached.
    pub cache: PathBuf,
    /// Programs copied into the initramfs besides busybox.
    pub programs: Vec<String>,
    pub run: RunSpec,
    pub memory_mib: u64,
    pub timeout: Duration,
    pub read_only: bool,
    /// The vhost-user socket (removed afterwards).
    pub socket: PathBuf,
    pub echo_console: bool,
    pub echo_output: bool,
    /// Force TCG even where KVM is usable.
    pub force_tcg: bool,
    /// Output lines starting with this (after leading blanks) are marks:
    /// the backend's counters are read as each arrives ([`VmResult::marks`]),
    /// so a run of several jobs has each job's own share.
    pub mark_prefix: Option<String>,
}

#[derive(Debug, Clone)]
pub struct VmResult {
    pub outcome: Outcome,
    pub accel: Accel,
    pub accel_reason: String,
    pub kernel_release: String,
    pub stats: StatsSnapshot,
    /// Whether the backend saw the device's completions at their model
    /// time (moneta_abi::fidelity's rule), and the text.
    pub faithful: bool,
    pub verdict: String,
    /// The backend's thread, if it ended with an error.
    pub backend_error: Option<String>,
    /// Each mark line ([`VmSpec::mark_prefix`], trimmed) with the backend's
    /// counters when it arrived.
    pub marks: Vec<(String, StatsSnapshot)>,
}

/// Boot a guest with the whole device of `plane` as /dev/vda, run the
/// command, power off.
pub fn run(plane: &Arc<ControlPlane>, spec: &VmSpec) -> Result<VmResult, String> {
    let qemu = guest::which("qemu-system-x86_64")
        .ok_or("qemu-system-x86_64 not found: install qemu-system-x86 (make setup)")?;
    std::fs::create_dir_all(&spec.cache).map_err(|e| format!("{}: {e}", spec.cache.display()))?;
    let kernel = guest::kernel(&spec.cache)?;
    let base = guest::base_initramfs(&spec.cache, &kernel, &spec.programs)?;
    let mut initrd = std::fs::read(&base).map_err(|e| format!("{}: {e}", base.display()))?;
    initrd.extend_from_slice(&guest::run_archive(&spec.run)?);
    let initrd_path = spec.socket.with_extension("initrd");
    std::fs::write(&initrd_path, &initrd).map_err(|e| format!("{}: {e}", initrd_path.display()))?;
    let result = boot(plane, spec, &qemu, &kernel, &initrd_path);
    let _ = std::fs::remove_file(&initrd_path);
    let _ = std::fs::remove_file(&spec.socket);
    result
}

fn boot(
    plane: &Arc<ControlPlane>,
    spec: &VmSpec,
    qemu_path: &Path,
    kernel: &guest::Kernel,
    initrd: &Path,
) -> Result<VmResult, String> {
    let stats = Arc::new(Stats::default());
    let capacity = plane.engine().address_space_bytes();
    let target = ChannelTarget::open(plane, 0, capacity, spec.read_only, stats.clone())?;
    let backend = BlkBackend::new(target).map_err(|e| format!("vhost backend: {e}"))?;
    let server = VhostServer::bind(&spec.socket, backend)?;
    let (done, ended) = mpsc::channel();
    std::thread::Builder::new()
        .name("moneta-vhost".into())
        .spawn(move || {
            let _ = done.send(server.run());
        })
        .map_err(|e| format!("starting the vhost-user thread: {e}"))?;
    let (mut accel, mut accel_reason) = qemu::choose_accel();
    if spec.force_tcg && accel == Accel::Kvm {
        (accel, accel_reason) = (Accel::Tcg, "TCG asked for (--tcg)".into());
    }
    let marks = Arc::new(std::sync::Mutex::new(Vec::new()));
    let on_output = spec.mark_prefix.clone().map(|prefix| {
        let (stats, marks) = (stats.clone(), marks.clone());
        qemu::OnOutput(Arc::new(move |line: &str| {
            let line = line.trim();
            if line.starts_with(&prefix) {
                let mut m = marks.lock().unwrap_or_else(|e| e.into_inner());
                m.push((line.to_string(), stats.snapshot()));
            }
        }))
    });
    let boot = Boot {
        qemu: qemu_path.to_path_buf(),
        accel,
        vmlinuz: kernel.vmlinuz.clone(),
        initramfs: initrd.to_path_buf(),
        socket: spec.socket.clone(),
        memory_mib: spec.memory_mib,
        timeout: spec.timeout,
        echo_console: spec.echo_console,
        echo_output: spec.echo_output,
        on_output,
    };
    let outcome = boot.run();
    // A QEMU that never connected leaves the server in accept.
    VhostServer::unblock(&spec.socket);
    let backend_error = match ended.recv_timeout(SERVER_GRACE) {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(e),
        Err(_) => Some(format!(
            "the vhost-user thread did not end within {SERVER_GRACE:?} (left behind)"
        )),
    };
    let marks = std::mem::take(&mut *marks.lock().unwrap_or_else(|e| e.into_inner()));
    let snapshot = stats.snapshot();
    let runnable = moneta_abi::fidelity::runnable_now().unwrap_or(0.0);
    let (faithful, verdict) = moneta_abi::fidelity::judge(
        snapshot.behind_ns_mean,
        snapshot.modeled_ns_mean,
        runnable,
        moneta_abi::fidelity::cores(),
    );
    Ok(VmResult {
        outcome,
        accel,
        accel_reason,
        kernel_release: kernel.release.clone(),
        stats: snapshot,
        faithful,
        verdict,
        backend_error,
        marks,
    })
}
