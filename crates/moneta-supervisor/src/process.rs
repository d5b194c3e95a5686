//! One supervisor for the processes an instance runs (monetad, nbdfuse, a
//! SAN's daemons): started detached with their output in a log, waited for
//! until ready, stopped with a signal and a grace period, reaped.
//!
//! Processes are managed by pid, not by a `Child` handle: they outlive the
//! command that started them, and a later command (`down`) stops them
//! from the pid in a state file or one found in /proc.

use crate::rollback::Rollback;
use crate::signals::interrupted;
use crate::{Error, ErrorKind, Result};
use std::fs::{self, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Start `cmd` detached: its own session (no terminal signals, survives the
/// shell), cwd `/` (never keeps a mount busy), output to `log` (at
/// `log_path`). Returns its pid: the process is managed by pid from here
/// (the handle would neither kill nor reap it on drop).
pub fn spawn_detached(cmd: &mut Command, log: fs::File, log_path: &Path) -> Result<u32> {
    let err_log = log
        .try_clone()
        .map_err(|e| Error::io(log_path.display().to_string(), e))?;
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
    let child = cmd.spawn().map_err(|e| {
        Error::with_source(
            ErrorKind::Command,
            format!("starting {}", cmd.get_program().to_string_lossy()),
            e,
        )
    })?;
    Ok(child.id())
}

/// Collect `pid`'s wait status if it is our child that exited.
pub fn reap(pid: i32) -> Option<i32> {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on one pid; not our child gives ECHILD.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    (r == pid).then_some(status)
}

/// A wait status in words: "exit code 1", "signal 9".
pub fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exit code {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!("signal {}", libc::WTERMSIG(status))
    } else {
        format!("status {status:#x}")
    }
}

/// The last lines a process wrote to its log since byte `from`.
pub fn log_tail(path: &Path, from: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = fs::File::open(path) {
        let _ = f.seek(SeekFrom::Start(from));
        let _ = f.read_to_string(&mut text);
    }
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(15)..];
    format!("its log {} ends:\n{}", path.display(), tail.join("\n"))
}

/// How to start one process of an instance.
pub struct Launch<'a> {
    /// Its name in messages: "monetad", "nbdfuse", "monetad in ns-x".
    pub what: &'a str,
    /// The log its output is appended to.
    pub log: &'a Path,
    /// A line written to the log before it starts (the command, say).
    pub banner: Option<String>,
    /// How long it has to become ready.
    pub limit: Duration,
}

impl Launch<'_> {
    /// Start `cmd` detached ([`spawn_detached`]), register `stop` of its
    /// pid with `rb`, and wait until `waiting()` returns None; until then
    /// it says what is awaited ("listening on /run/…/monetad.sock"). An
    /// error if the process exits first ([`ErrorKind::Exited`]), is not
    /// ready within the limit ([`ErrorKind::Timeout`]), or a signal comes;
    /// the errors end with the log's last lines. Returns the pid.
    pub fn start<E: std::fmt::Display>(
        &self,
        cmd: &mut Command,
        rb: &mut Rollback,
        stop: impl FnOnce(u32) -> std::result::Result<(), E> + 'static,
        mut waiting: impl FnMut() -> Option<String>,
    ) -> Result<u32> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log)
            .map_err(|e| Error::io(self.log.display().to_string(), e))?;
        let log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        if let Some(b) = &self.banner {
            let _ = writeln!(log, "{b}");
        }
        let pid = spawn_detached(cmd, log, self.log)
            .map_err(|e| Error::with_source(e.kind(), format!("starting {}", self.what), e))?;
        rb.push(format!("stopped {} (pid {pid})", self.what), move || {
            stop(pid)
        });
        let started = Instant::now();
        loop {
            let Some(awaited) = waiting() else {
                return Ok(pid);
            };
            if let Some(status) = reap(pid as i32) {
                return Err(Error::new(
                    ErrorKind::Exited,
                    format!(
                        "{} exited ({}) before {awaited}; {}",
                        self.what,
                        describe_status(status),
                        log_tail(self.log, log_start)
                    ),
                ));
            }
            if started.elapsed() > self.limit {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{} (pid {pid}) was not {awaited} within {} s; {}",
                        self.what,
                        self.limit.as_secs(),
                        log_tail(self.log, log_start)
                    ),
                ));
            }
            interrupted()?;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// How to stop a process.
pub struct Stop<'a> {
    /// Its name in messages.
    pub what: &'a str,
    /// The signal that asks it to go (SIGTERM); None when it has been
    /// asked otherwise (nbdfuse goes when its FUSE mount is unmounted).
    pub ask: Option<libc::c_int>,
    /// How long it has before SIGKILL.
    pub grace: Duration,
}

impl Stop<'_> {
    /// Stop `pid` while `is_ours(pid)` holds (a pid from a state file may
    /// since be anyone's): ask, wait up to the grace period (reaping it if
    /// it is our child), then SIGKILL and wait 2 s more. Returns whether
    /// there was a process to stop; an error if it survived SIGKILL.
    pub fn run(&self, pid: i32, is_ours: impl Fn(i32) -> bool) -> Result<bool> {
        reap(pid);
        if !is_ours(pid) {
            return Ok(false);
        }
        let wait_gone = |limit: Duration| {
            let deadline = Instant::now() + limit;
            loop {
                reap(pid);
                if !is_ours(pid) {
                    return true;
                }
                if Instant::now() >= deadline {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        };
        if let Some(sig) = self.ask {
            // SAFETY: kill(2) of a pid just checked to be ours.
            unsafe { libc::kill(pid, sig) };
        }
        if wait_gone(self.grace) {
            return Ok(true);
        }
        eprintln!(
            "moneta: {} (pid {pid}) did not go within {} s{}; killing it",
            self.what,
            self.grace.as_secs(),
            if self.ask == Some(libc::SIGTERM) {
                " of SIGTERM"
            } else {
                ""
            }
        );
        kill(pid);
        if wait_gone(Duration::from_secs(2)) {
            Ok(true)
        } else {
            Err(Error::new(
                ErrorKind::Stuck,
                format!("{} (pid {pid}) survived SIGKILL", self.what),
            ))
        }
    }
}

/// SIGKILL `pid` (the caller checked it is ours) and reap it if it is our
/// child.
pub fn kill(pid: i32) {
    // SAFETY: kill(2) of a pid the caller just checked.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    reap(pid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::system::cmdline;
    use std::path::PathBuf;

    fn scratch(tag: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("moneta-supervisor-p{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn alive(pid: i32) -> bool {
        cmdline(pid).is_some()
    }

    fn launch<'a>(log: &'a Path, limit: Duration) -> Launch<'a> {
        Launch {
            what: "the test process",
            log,
            banner: Some("---- test".into()),
            limit,
        }
    }

    #[test]
    fn a_process_is_ready_once_its_file_is_there_and_stops_on_sigterm() {
        let dir = scratch("ready");
        let (log, flag) = (dir.join("log"), dir.join("ready"));
        let mut rb = Rollback::default();
        let script = format!("echo started; touch {}; exec sleep 30", flag.display());
        let pid = launch(&log, Duration::from_secs(10))
            .start(
                Command::new("sh").args(["-c", &script]),
                &mut rb,
                |_| Ok::<(), String>(()),
                || (!flag.exists()).then(|| "making its file".to_string()),
            )
            .unwrap();
        rb.commit();
        assert!(alive(pid as i32));
        let text = fs::read_to_string(&log).unwrap();
        assert!(text.starts_with("---- test\n"), "{text:?}");
        let stop = Stop {
            what: "sleep",
            ask: Some(libc::SIGTERM),
            grace: Duration::from_secs(5),
        };
        assert!(stop.run(pid as i32, alive).unwrap());
        assert!(!alive(pid as i32));
        // Gone already: nothing to stop.
        assert!(!stop.run(pid as i32, alive).unwrap());
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_exit_before_ready_is_an_error_with_the_log_and_the_rollback_stops_it() {
        let dir = scratch("exit");
        let log = dir.join("log");
        let stopped = std::rc::Rc::new(std::cell::Cell::new(None));
        let s = stopped.clone();
        let e = {
            let mut rb = Rollback::default();
            launch(&log, Duration::from_secs(10))
                .start(
                    Command::new("sh").args(["-c", "echo the reason; exit 7"]),
                    &mut rb,
                    move |pid| {
                        s.set(Some(pid));
                        Ok::<(), String>(())
                    },
                    || Some("listening".to_string()),
                )
                .unwrap_err()
        };
        assert_eq!(e.kind(), ErrorKind::Exited);
        let text = e.to_string();
        assert!(
            text.contains("the test process exited (exit code 7) before listening"),
            "{text}"
        );
        assert!(text.contains("the reason"), "{text}");
        assert!(stopped.get().is_some(), "the rollback did not stop it");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_late_process_times_out_and_one_ignoring_sigterm_is_killed() {
        let dir = scratch("late");
        let log = dir.join("log");
        let mut rb = Rollback::default();
        let e = launch(&log, Duration::from_millis(300))
            .start(
                Command::new("sh").args([
                    "-c",
                    "trap '' TERM; echo ignoring; while :; do sleep 0.05; done",
                ]),
                &mut rb,
                |_| Ok::<(), String>(()),
                || Some("ready".to_string()),
            )
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Timeout);
        assert!(e.to_string().contains("was not ready within 0 s"), "{e}");
        let pid = cmdline_pid_of(&log);
        rb.commit();
        let stop = Stop {
            what: "sh",
            ask: Some(libc::SIGTERM),
            grace: Duration::from_millis(300),
        };
        let started = Instant::now();
        assert!(stop.run(pid, alive).unwrap());
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(!alive(pid));
        fs::remove_dir_all(&dir).unwrap();
    }

    /// The one process whose stdout is `log`.
    fn cmdline_pid_of(log: &Path) -> i32 {
        let log = fs::canonicalize(log).unwrap();
        crate::system::pids()
            .into_iter()
            .find(|p| fs::read_link(format!("/proc/{p}/fd/1")).is_ok_and(|l| l == log))
            .expect("the process writing the log")
    }

    #[test]
    fn wait_statuses_read_as_words() {
        assert_eq!(describe_status(7 << 8), "exit code 7");
        assert_eq!(describe_status(9), "signal 9");
    }
}
