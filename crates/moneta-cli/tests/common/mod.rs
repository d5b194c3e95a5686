//! What the file-system integration tests share: a Moneta file system
//! mounted for one test (`moneta up`, torn down with `moneta down --purge`
//! even when the test fails), and running programs through the shim.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn moneta() -> Command {
    Command::new(env!("CARGO_BIN_EXE_moneta"))
}

/// The program's stdout; panics with its output if it failed.
pub fn ok(o: Output, what: &str) -> String {
    assert!(
        o.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A Moneta file system mounted for one test; `down --purge` on drop.
pub struct Mounted {
    pub mount: PathBuf,
}

impl Mounted {
    pub fn up(name: &str, fs: &str, size: &str) -> Mounted {
        Mounted::up_with(name, fs, size, &[], &[])
    }

    /// [`Mounted::up`] with `env` in monetad's environment and `extra`
    /// arguments to `moneta up`.
    pub fn up_with(
        name: &str,
        fs: &str,
        size: &str,
        env: &[(&str, &str)],
        extra: &[&str],
    ) -> Mounted {
        let mount = std::env::temp_dir().join(format!("moneta-prog-{}-{name}", std::process::id()));
        let m = Mounted { mount };
        ok(
            moneta()
                .envs(env.iter().copied())
                .args(["up", "--fs", fs, "--size", size])
                .args(extra)
                .arg("--mount")
                .arg(&m.mount)
                .output()
                .unwrap(),
            "moneta up",
        );
        m
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mount.join(name)
    }

    /// `moneta run --mount M -- program args…`
    pub fn run(&self, program: &str, args: &[&str]) -> Command {
        let mut c = moneta();
        c.args(["run", "--mount"])
            .arg(&self.mount)
            .arg("--")
            .arg(program)
            .args(args);
        c
    }

    /// The daemon's socket: in the state directory named after the mount
    /// ('/' → '_', with '_' and '%' percent-escaped, as `moneta up` names it).
    pub fn socket(&self) -> String {
        let name: String = self
            .mount
            .to_string_lossy()
            .chars()
            .map(|c| match c {
                '/' => "_".to_string(),
                '_' => "%5F".to_string(),
                '%' => "%25".to_string(),
                c => c.to_string(),
            })
            .collect();
        format!("/run/moneta/{name}/monetad.sock")
    }

    /// The daemon's counters (`moneta stats`).
    pub fn stats(&self) -> serde_json::Value {
        let out = ok(
            moneta()
                .args(["stats", "--json", "--daemon", &self.socket()])
                .output()
                .unwrap(),
            "moneta stats",
        );
        serde_json::from_str(&out).unwrap()
    }

    /// The pid of this mount's monetad (found by its socket, as `moneta
    /// down` finds it).
    pub fn daemon_pid(&self) -> i32 {
        let socket = self.socket();
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                    let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
                    args.contains(&b"serve".as_slice()) && args.contains(&socket.as_bytes())
                })
            })
            .expect("monetad's pid")
    }

    /// Kill this mount's monetad (SIGKILL), as a crash would.
    pub fn kill_daemon(&self) {
        // SAFETY: kill(2) of the daemon this test started.
        unsafe { libc::kill(self.daemon_pid(), libc::SIGKILL) };
    }

    /// `moneta up` again on this mount (after a crash: it repairs).
    pub fn up_again(&self) {
        ok(
            moneta()
                .args(["up", "--mount"])
                .arg(&self.mount)
                .output()
                .unwrap(),
            "moneta up after the crash",
        );
    }

    pub fn device_requests(&self) -> u64 {
        self.stats()["requests_completed"].as_u64().unwrap()
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // A child the test started may still be exiting: try again briefly;
        // then say who holds the mount, end them, and take it down.
        for attempt in 0..12 {
            let o = moneta()
                .args(["down", "--purge", "--mount"])
                .arg(&self.mount)
                .output();
            match o {
                Ok(o) if o.status.success() => break,
                Ok(o) if attempt == 10 => {
                    eprintln!(
                        "moneta down {} failed: {}",
                        self.mount.display(),
                        String::from_utf8_lossy(&o.stderr)
                    );
                    // fuser prints the pids on stdout; never this process.
                    let me = std::process::id();
                    if let Ok(out) = std::process::Command::new("fuser")
                        .arg("-m")
                        .arg(&self.mount)
                        .output()
                    {
                        for pid in String::from_utf8_lossy(&out.stdout)
                            .split_whitespace()
                            .filter_map(|p| p.parse::<u32>().ok())
                            .filter(|&p| p != me)
                        {
                            // SAFETY: kill(2) of a process holding the test's mount.
                            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                        }
                    }
                    std::thread::sleep(std::time::Duration::from_millis(300));
                }
                _ => std::thread::sleep(std::time::Duration::from_millis(300)),
            }
        }
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// Whether the test may go on: it mounts, so it needs root, and fails
/// without it unless skipping was asked for (`moneta_testkit`).
pub fn root() -> bool {
    moneta_testkit::require_root("it mounts a file system")
}

pub fn exists(p: &Path) -> bool {
    p.exists()
}

/// Threads of process `pid` whose name (comm) starts with `prefix`.
pub fn threads_named(pid: u32, prefix: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with(prefix))
                })
                .count()
        })
        .unwrap_or(0)
}
