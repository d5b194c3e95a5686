//! Booting the guest under QEMU with the device as its vhost-user-blk
//! disk, and collecting what the command printed and its exit code.
//!
//! QEMU needs the guest's memory shared with the backend
//! (`memory-backend-memfd,share=on` as the one NUMA node's memory). The
//! serial console is QEMU's stdout: read line by line on a thread, the
//! lines between [`BEGIN_MARK`] and [`EXIT_MARK`] are the command's output,
//! the rest the console's (boot messages). Every wait is bounded: the run
//! as a whole by its timeout, and QEMU's exit after the guest powered off
//! by [`EXIT_GRACE`]; a QEMU that overstays either is killed.
//!
//! Acceleration: KVM when `/dev/kvm` opens and the CPU shows hardware
//! virtualization (vmx/svm); a `/dev/kvm` without them is PVM (the
//! `kvm_pvm` module), which hangs a stock Debian kernel right after the
//! BIOS, so TCG, and the guest's CPU is emulated.

use crate::guest::{BEGIN_MARK, EXIT_MARK};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// How long QEMU may take to exit after the guest printed its exit code.
pub const EXIT_GRACE: Duration = Duration::from_secs(15);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    /// What every result says about the guest's CPU.
    pub fn label(self) -> &'static str {
        match self {
            Accel::Kvm => "KVM: guest CPU on hardware virtualization",
            Accel::Tcg => "TCG: guest CPU emulated",
        }
    }
}

/// KVM if usable, else TCG, and why.
pub fn choose_accel() -> (Accel, String) {
    let flags = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let hardware = flags
        .lines()
        .filter(|l| l.starts_with("flags"))
        .any(|l| l.split_whitespace().any(|f| f == "vmx" || f == "svm"));
    let opens = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok();
    let pvm = Path::new("/sys/module/kvm_pvm").exists();
    match (opens, hardware, pvm) {
        (true, true, false) => (Accel::Kvm, "KVM (/dev/kvm, vmx/svm)".into()),
        (true, _, _) => (
            Accel::Tcg,
            "/dev/kvm is PVM or has no vmx/svm (a stock kernel hangs under it): TCG".into(),
        ),
        (false, _, _) => (Accel::Tcg, "no usable /dev/kvm: TCG".into()),
    }
}

/// One boot.
#[derive(Debug, Clone)]
pub struct Boot {
    pub qemu: PathBuf,
    pub accel: Accel,
    pub vmlinuz: PathBuf,
    pub initramfs: PathBuf,
    pub socket: PathBuf,
    pub memory_mib: u64,
    pub timeout: Duration,
    /// Copy console lines (not the command's output) to stderr.
    pub echo_console: bool,
    /// Copy the command's output lines to stdout as they come.
    pub echo_output: bool,
    /// Called with each line of the command's output as it arrives.
    pub on_output: Option<OnOutput>,
}

/// A callback on the command's output lines, as they arrive (what the
/// device saw by then can be read at each one).
#[derive(Clone)]
pub struct OnOutput(pub std::sync::Arc<dyn Fn(&str) + Send + Sync>);

impl std::fmt::Debug for OnOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnOutput")
    }
}

/// What a run gave.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// The command's output lines.
    pub output: Vec<String>,
    /// Its exit code, if the guest printed one.
    pub exit_code: Option<i32>,
    /// The guest's uptime when the command started (s).
    pub guest_uptime_at_command_s: Option<f64>,
    pub wall: Duration,
    /// QEMU's exit status (None: it was killed).
    pub qemu_status: Option<i32>,
    /// Why the run failed, if it did (timeout, QEMU's own error).
    pub failure: Option<String>,
    /// Console lines (boot log), kept for diagnosis.
    pub console: Vec<String>,
}

impl Boot {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.qemu);
        let mem = format!("{}M", self.memory_mib);
        c.args(["-nodefaults", "-display", "none", "-no-reboot", "-smp", "1"]);
        match self.accel {
            Accel::Kvm => c.args(["-accel", "kvm", "-cpu", "host"]),
            Accel::Tcg => c.args(["-accel", "tcg", "-cpu", "max"]),
        };
        c.args(["-m", &mem]);
        c.arg("-object")
            .arg(format!("memory-backend-memfd,id=mem,size={mem},share=on"));
        c.args(["-numa", "node,memdev=mem"]);
        c.arg("-chardev")
            .arg(format!("socket,id=vhost0,path={}", self.socket.display()));
        c.args(["-device", "vhost-user-blk-pci,chardev=vhost0,num-queues=1"]);
        c.args(["-serial", "stdio"]);
        c.arg("-kernel").arg(&self.vmlinuz);
        c.arg("-initrd").arg(&self.initramfs);
        c.args([
            "-append",
            "console=ttyS0 panic=-1 loglevel=4 rdinit=/init i8042.noaux i8042.nokbd",
        ]);
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Boot, run, power off; always returns with QEMU gone.
    pub fn run(&self) -> Outcome {
        let began = Instant::now();
        let mut out = Outcome::default();
        let mut child = match self.command().spawn() {
            Ok(c) => c,
            Err(e) => {
                out.failure = Some(format!("starting {}: {e}", self.qemu.display()));
                return out;
            }
        };
        let (lines, seen) = mpsc::channel::<String>();
        let stdout = child.stdout.take().expect("piped");
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { break };
                let text = String::from_utf8_lossy(&line)
                    .trim_end_matches('\r')
                    .to_string();
                if lines.send(text).is_err() {
                    break;
                }
            }
        });
        let mut stderr = child.stderr.take().expect("piped");
        let errors = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = stderr.read_to_string(&mut s);
            s
        });
        let deadline = began + self.timeout;
        let mut in_command = false;
        let mut exit_seen_at: Option<Instant> = None;
        loop {
            match seen.recv_timeout(Duration::from_millis(50)) {
                Ok(line) => self.take_line(line, &mut in_command, &mut out, &mut exit_seen_at),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                // QEMU closed its stdout: it is exiting.
                Err(mpsc::RecvTimeoutError::Disconnected) => {}
            }
            if let Ok(Some(status)) = child.try_wait() {
                out.qemu_status = status.code();
                break;
            }
            let now = Instant::now();
            if exit_seen_at.is_some_and(|t| now.duration_since(t) > EXIT_GRACE) {
                kill(&mut child);
                out.failure = Some(format!(
                    "QEMU did not exit within {EXIT_GRACE:?} of the guest's power-off; killed"
                ));
                break;
            }
            if now > deadline {
                kill(&mut child);
                out.failure = Some(format!("no result within {:?}; QEMU killed", self.timeout));
                break;
            }
        }
        // What is left in the pipe (bounded: the writer is gone).
        let _ = reader.join();
        while let Ok(line) = seen.try_recv() {
            self.take_line(line, &mut in_command, &mut out, &mut exit_seen_at);
        }
        let qemu_errors = errors.join().unwrap_or_default();
        if out.failure.is_none() && out.exit_code.is_none() {
            out.failure = Some(format!(
                "the guest printed no exit code (QEMU {}): {}",
                out.qemu_status
                    .map_or("killed".to_string(), |c| format!("exit {c}")),
                last_lines(&qemu_errors, &out.console)
            ));
        }
        out.wall = began.elapsed();
        out
    }

    fn take_line(
        &self,
        line: String,
        in_command: &mut bool,
        out: &mut Outcome,
        exit_seen_at: &mut Option<Instant>,
    ) {
        if let Some(rest) = line.strip_prefix(BEGIN_MARK) {
            *in_command = true;
            out.guest_uptime_at_command_s = rest.trim().parse().ok();
            return;
        }
        if let Some(rest) = line.strip_prefix(EXIT_MARK) {
            *in_command = false;
            let code = rest.split_whitespace().next().and_then(|c| c.parse().ok());
            out.exit_code = code;
            *exit_seen_at = Some(Instant::now());
            if code != Some(0) {
                out.console.push(line);
            }
            return;
        }
        if *in_command {
            if let Some(f) = &self.on_output {
                (f.0)(&line);
            }
            if self.echo_output {
                let _ = writeln!(std::io::stdout().lock(), "{line}");
            }
            out.output.push(line);
        } else {
            if self.echo_console {
                eprintln!("{line}");
            }
            out.console.push(line);
        }
    }
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn last_lines(stderr: &str, console: &[String]) -> String {
    let mut tail: Vec<&str> = console.iter().rev().take(8).map(String::as_str).collect();
    tail.reverse();
    format!(
        "QEMU said: {}; console: {}",
        stderr.trim(),
        tail.join(" | ")
    )
}
