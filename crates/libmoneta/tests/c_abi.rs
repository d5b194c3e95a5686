//! The C ABI as a C user meets it: `include/moneta.h` compiles as C and C++,
//! and `examples/c/moneta_example.c`, linked against the real `libmoneta.so`,
//! passes on embedded devices and against a daemon over its socket.
//!
//! Needs gcc (and g++ for the C++ check); without them the tests say they
//! were skipped rather than pass silently.

use moneta_emu::control::ControlPlane;
use moneta_emu::daemon::Daemon;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_emu::EmuError;
use moneta_model::config::Config;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

/// A run of the example that takes longer has hung (it polls without limit).
const RUN_TIMEOUT: Duration = Duration::from_secs(20);

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Where cargo puts artifacts: CARGO_TARGET_DIR or the workspace's target/.
/// A relative CARGO_TARGET_DIR is taken from the workspace root, as cargo
/// does when run there (this test runs in the package's directory).
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
}

/// Whether `tool` is installed: fails the test if not, unless skipping was
/// asked for (`moneta_testkit`).
fn have(tool: &str, what: &str) -> bool {
    moneta_testkit::require_tool(tool, what)
}

fn output_text(out: &Output) -> String {
    format!(
        "status {}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}",
        output_text(&out)
    );
    out
}

/// Build libmoneta.so the way a C user would. Always asking cargo (a no-op
/// when up to date) means the example never runs against a stale library.
fn build_library() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).current_dir(workspace_root()).args([
        "build",
        "--release",
        "-p",
        "libmoneta",
    ]));
    let dir = target_dir().join("release");
    assert!(
        dir.join("libmoneta.so").is_file(),
        "cargo built no libmoneta.so in {}",
        dir.display()
    );
    dir
}

/// Compile the example with the flags of examples/c/Makefile.
fn build_example(lib_dir: &Path) -> PathBuf {
    let root = workspace_root();
    let exe = target_dir().join("moneta_example");
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/c/moneta_example.c"))
        .arg("-L")
        .arg(lib_dir)
        .arg("-lmoneta")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-o")
        .arg(&exe));
    exe
}

/// Run the example on `target`; expect exit 0 and "ok" as the last line.
fn run_example(exe: &Path, target: &str) {
    let mut command = Command::new(exe);
    command
        .arg(target)
        // cargo test points LD_LIBRARY_PATH at deps/, which would override
        // the rpath; the example must find the library the way a user's does.
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", exe.display()));
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    let out = match rx.recv_timeout(RUN_TIMEOUT) {
        Ok(out) => out.expect("collecting the example's output"),
        Err(_) => {
            // SAFETY: kill has no memory preconditions; `pid` is our child,
            // not yet reaped (the waiting thread has not returned).
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            panic!("moneta_example {target} hung for {RUN_TIMEOUT:?}");
        }
    };
    let text = output_text(&out);
    assert!(out.status.success(), "moneta_example {target}: {text}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().last(), Some("ok"), "{text}");
    assert!(
        stdout.contains("expected error: ") && stdout.contains("no read grant"),
        "the refused read should explain itself: {text}"
    );
}

/// An in-process monetad on a 64 MiB null device; stops it and removes its
/// socket when dropped, so a failing test leaves nothing behind.
struct TestDaemon {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), EmuError>>>,
}

impl TestDaemon {
    fn start() -> TestDaemon {
        let mut config = Config::preset("null").unwrap();
        config.device.capacity_bytes = 64 << 20;
        let medium = Medium::anonymous(config.device.capacity_bytes).unwrap();
        let engine = Arc::new(Engine::start(config, medium, EngineOptions::default()).unwrap());
        // SAFETY: geteuid has no preconditions.
        let owner = unsafe { libc::geteuid() };
        let plane = Arc::new(ControlPlane::new(engine, owner));
        let socket = std::env::temp_dir().join(format!("moneta-c-abi-{}.sock", std::process::id()));
        let daemon = Daemon::bind(&socket, plane).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || daemon.run(&flag));
        TestDaemon {
            socket,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            // Dropping the Daemon at the end of its thread removes the socket.
            let result = thread.join();
            if !std::thread::panicking() {
                result.expect("daemon thread").expect("daemon run");
            }
        }
        // In case the thread panicked before the Daemon's own clean-up ran.
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[test]
fn header_compiles_as_c_and_cpp() {
    let header = workspace_root().join("include/moneta.h");
    for (compiler, language) in [("gcc", "c"), ("g++", "c++")] {
        if have(compiler, &format!("include/moneta.h as {language}")) {
            run(Command::new(compiler)
                .args([
                    "-fsyntax-only",
                    "-pedantic",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    "-x",
                    language,
                ])
                .arg(&header));
        }
    }
}

#[test]
fn c_example_passes_embedded_and_against_a_daemon() {
    if !have("gcc", "the C example") {
        return;
    }
    let exe = build_example(&build_library());
    run_example(&exe, "embedded:null");
    run_example(&exe, "embedded:onyx-late");
    let daemon = TestDaemon::start();
    run_example(&exe, daemon.socket.to_str().expect("UTF-8 temp dir"));
}
