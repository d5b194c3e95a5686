//! Nothing hangs silently: requests in flight when their daemon dies
//! complete with an error, however the program waits for them — the Rust
//! API's `poll`, `try_complete` and `wait` in each completion mode, and the
//! C ABI's `moneta_poll`. Before, `poll` said "in flight" forever.
//!
//! monetad runs in a child process (this test binary, re-executed with
//! `DAEMON_ENV` set); it is stopped (SIGSTOP) so the requests cannot
//! complete, then killed (SIGKILL). The child is killed when the test ends,
//! even when it fails.

use moneta::capi;
use moneta::{CompletionMode, Io, Moneta, ResultCode};
use moneta_emu::control::ControlPlane;
use moneta_emu::daemon::Daemon;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_model::config::Config;
use moneta_model::units::Op;
use std::ffi::{CStr, CString};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// The child finds the socket to serve on here; without it, `daemon_entry`
/// does nothing.
const DAEMON_ENV: &str = "MONETA_DEAD_DAEMON_SOCKET";
const MIB: u64 = 1 << 20;
/// A request of a dead daemon must end within this (the library looks
/// every millisecond; the bound only absorbs a loaded machine).
const BOUND: Duration = Duration::from_secs(5);
const MODES: [CompletionMode; 3] = [
    CompletionMode::Dma,
    CompletionMode::Forwarding,
    CompletionMode::IssueSleep,
];

/// The daemon (run as a child process of the test binary).
#[test]
fn daemon_entry() {
    let Some(socket) = std::env::var_os(DAEMON_ENV) else {
        return;
    };
    let mut config = Config::preset("null").unwrap();
    config.device.capacity_bytes = 64 * MIB;
    let medium = Medium::anonymous(config.device.capacity_bytes).unwrap();
    let engine = Arc::new(Engine::start(config, medium, EngineOptions::default()).unwrap());
    // SAFETY: geteuid has no preconditions.
    let plane = Arc::new(ControlPlane::new(engine, unsafe { libc::geteuid() }));
    let daemon = Daemon::bind(Path::new(&socket), plane).unwrap();
    println!("ready");
    // Bounded, so that a child whose parent died first does not linger.
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(60));
        flag.store(true, std::sync::atomic::Ordering::Release);
    });
    daemon.run(&stop).unwrap();
}

/// The daemon's process, killed when dropped (also when the test fails).
struct DaemonProcess {
    child: Child,
    socket: PathBuf,
}

impl DaemonProcess {
    fn start() -> DaemonProcess {
        let socket =
            std::env::temp_dir().join(format!("daemon-dead-daemon-{}.sock", std::process::id()));
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "daemon_entry", "--nocapture", "--test-threads=1"])
            .env(DAEMON_ENV, &socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut daemon = DaemonProcess { child, socket };
        let ready = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.contains("ready"));
        assert!(ready, "the daemon process did not start");
        daemon.signal(0);
        daemon
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn signal(&mut self, signal: i32) {
        // SAFETY: kill(2) of our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(self.pid(), signal) }, 0, "kill");
    }

    /// SIGSTOP, and wait until the kernel says it is stopped.
    fn stop(&mut self) {
        self.signal(libc::SIGSTOP);
        let stat = format!("/proc/{}/stat", self.pid());
        let t0 = Instant::now();
        loop {
            let text = std::fs::read_to_string(&stat).unwrap();
            // The state follows the parenthesised command name.
            let state = text.rsplit(')').next().unwrap().trim_start();
            if state.starts_with('T') {
                return;
            }
            assert!(t0.elapsed() < BOUND, "the daemon did not stop: {text}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn submitted(m: &Moneta, addr: u64, mode: CompletionMode) -> Io {
    let mut io = m
        .try_prepare(Op::Write, addr, 4096, mode)
        .unwrap()
        .expect("a fresh channel has free tags");
    m.buffer_mut(&mut io).fill(0x5A);
    m.submit(&mut io).unwrap();
    io
}

#[test]
fn requests_in_flight_when_the_daemon_dies_complete_with_an_error() {
    let mut daemon = DaemonProcess::start();
    let m = Moneta::connect(&daemon.socket).unwrap();
    m.grant_raw(0, 8 * MIB, true).unwrap();
    let path = CString::new(daemon.socket.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path; the handle is closed below.
    let c = unsafe { capi::moneta_connect(path.as_ptr()) };
    assert!(!c.is_null(), "moneta_connect");
    // SAFETY: a live handle.
    assert_eq!(unsafe { capi::moneta_grant_raw(c, 0, 8 * MIB, 1) }, 0);

    daemon.stop();
    let mut by_try_complete: Vec<Io> = MODES
        .iter()
        .enumerate()
        .map(|(i, &mode)| submitted(&m, i as u64 * 4096, mode))
        .collect();
    let by_poll = submitted(&m, 3 * 4096, CompletionMode::Forwarding);
    let mut by_wait = submitted(&m, 4 * 4096, CompletionMode::IssueSleep);
    // SAFETY: a live handle; the request is released below.
    let c_io = unsafe { capi::moneta_prepare(c, 1, 5 * 4096, 4096, 0) };
    assert!(!c_io.is_null(), "moneta_prepare");
    // SAFETY: live handles.
    assert_eq!(unsafe { capi::moneta_submit(c, c_io) }, 0);
    // A stopped daemon is slow, not dead: the requests stay in flight.
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(m.poll(&by_poll), None, "completed by a stopped daemon");
    // SAFETY: live handles.
    assert_eq!(unsafe { capi::moneta_poll(c, c_io) }, 0);

    daemon.kill();
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    let waiter = m.clone();
    std::thread::spawn(move || {
        let result = waiter.wait(&mut by_wait);
        let _ = tx.send(result.map_err(|e| e.to_string()));
    });
    let mut try_complete_errors = vec![None; by_try_complete.len()];
    let (mut poll_code, mut c_code) = (None, None);
    while t0.elapsed() < BOUND {
        for (io, error) in by_try_complete.iter_mut().zip(&mut try_complete_errors) {
            if error.is_none() {
                if let Some(result) = m.try_complete(io) {
                    *error = Some(result.expect_err("a dead daemon's write succeeded"));
                }
            }
        }
        if poll_code.is_none() {
            poll_code = m.poll(&by_poll);
        }
        if c_code.is_none() {
            // SAFETY: live handles.
            match unsafe { capi::moneta_poll(c, c_io) } {
                0 => {}
                code => {
                    // SAFETY: the library's NUL-terminated, thread-local message.
                    let why = unsafe { CStr::from_ptr(capi::moneta_last_error()) };
                    c_code = Some((code, why.to_string_lossy().into_owned()));
                }
            }
        }
        if try_complete_errors.iter().all(Option::is_some)
            && poll_code.is_some()
            && c_code.is_some()
        {
            break;
        }
        std::thread::yield_now();
    }
    eprintln!("the dead daemon's requests ended after {:?}", t0.elapsed());
    for (mode, error) in MODES.iter().zip(&try_complete_errors) {
        let error = error.as_ref().unwrap_or_else(|| {
            panic!("try_complete ({mode:?}): still in flight {BOUND:?} after the daemon died")
        });
        eprintln!("try_complete ({mode:?}): {error}");
    }
    assert_eq!(poll_code, Some(ResultCode::DeviceFailure), "poll");
    let (code, why) = c_code.expect("moneta_poll: still in flight after the daemon died");
    assert_eq!(code, -1, "moneta_poll: {why}");
    eprintln!("moneta_poll: {why}");
    let waited = rx
        .recv_timeout(BOUND)
        .expect("wait: still waiting after the daemon died");
    assert!(waited.is_err(), "wait: a dead daemon's write succeeded");

    for io in by_try_complete {
        m.release(io);
    }
    m.release(by_poll);
    // SAFETY: live handles, not used again.
    unsafe {
        capi::moneta_release(c, c_io);
        capi::moneta_close(c);
    }
}
