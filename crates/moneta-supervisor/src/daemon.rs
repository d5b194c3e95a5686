//! Recognising a monetad by its command line, finding and stopping it.
//!
//! A pid from a state file may have been reused by anything since, so a
//! daemon is ours only while its command line says so: `moneta serve …
//! --socket S`, or `moneta serve-group FILE…` whose argument files (one
//! `serve` argument a line) name the sockets of its devices.

use crate::process::{Launch, Stop};
use crate::rollback::Rollback;
use crate::system::{cmdline, command_line, processes_where};
use crate::{Result, READY_WAIT, STOP_GRACE};
use std::ffi::OsString;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The sockets a live monetad serves; empty if `pid` is not one.
pub fn daemon_sockets(pid: i32) -> Vec<PathBuf> {
    cmdline(pid).map_or_else(Vec::new, |args| sockets_of(&args))
}

/// The sockets a monetad with command line `args` serves: a `moneta
/// serve`'s `--socket`, or those of every device of a `moneta serve-group`
/// (from its argument files).
pub fn sockets_of(args: &[OsString]) -> Vec<PathBuf> {
    if args.iter().any(|a| a == "serve-group") {
        return group_sockets(args);
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

/// The sockets of a `moneta serve-group` command line: the `--socket` line
/// of each argument file (the arguments after `serve-group` that are not
/// options or their numbers).
fn group_sockets(args: &[OsString]) -> Vec<PathBuf> {
    let Some(at) = args.iter().position(|a| a == "serve-group") else {
        return Vec::new();
    };
    args[at + 1..]
        .iter()
        .filter_map(|a| a.to_str())
        .filter(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .filter_map(|file| std::fs::read_to_string(file).ok())
        .filter_map(|text| {
            let lines: Vec<&str> = text.lines().collect();
            lines
                .windows(2)
                .find(|w| w[0] == "--socket")
                .map(|w| PathBuf::from(w[1]))
        })
        .collect()
}

/// Whether `pid` is a live monetad serving `socket`.
pub fn is_our_daemon(pid: i32, socket: &Path) -> bool {
    daemon_sockets(pid).iter().any(|s| s == socket)
}

/// The live monetads serving `socket`, sorted.
pub fn daemon_pids(socket: &Path) -> Vec<i32> {
    processes_where(|args| sockets_of(args).iter().any(|s| s == socket))
}

/// The live monetads with a socket under `dir`, sorted.
pub fn daemons_under(dir: &Path) -> Vec<i32> {
    processes_where(|args| sockets_of(args).iter().any(|s| s.starts_with(dir)))
}

/// SIGTERM, up to [`STOP_GRACE`] for the daemon to remove its socket and
/// go, then SIGKILL. Returns whether there was a daemon to stop.
pub fn stop_daemon(pid: i32, socket: &Path) -> Result<bool> {
    Stop {
        what: "monetad",
        ask: Some(libc::SIGTERM),
        grace: STOP_GRACE,
    }
    .run(pid, |p| is_our_daemon(p, socket))
}

/// Start a monetad (`cmd`: `moneta serve …`, `moneta serve-group …`, or
/// `ip netns exec NS moneta serve …`, which execs it) detached, its output
/// appended to `log` after a line `---- TAG: COMMAND`; register its stop
/// with `rb`; and wait until it listens on every one of `sockets` (up to
/// [`READY_WAIT`]). Returns its pid.
pub fn start_daemon(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    tag: &str,
    sockets: &[PathBuf],
    rb: &mut Rollback,
) -> Result<u32> {
    let socket = sockets.first().cloned().unwrap_or_default();
    Launch {
        what,
        log,
        banner: Some(format!("---- {tag}: {}", command_line(cmd))),
        limit: READY_WAIT,
    }
    .start(
        cmd,
        rb,
        move |pid| stop_daemon(pid as i32, &socket).map(drop),
        || {
            sockets
                .iter()
                .find(|s| UnixStream::connect(s).is_err())
                .map(|s| format!("listening on {}", s.display()))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn a_daemon_is_known_by_its_socket_or_its_groups_files() {
        assert_eq!(
            sockets_of(&os(&[
                "/bin/moneta",
                "serve",
                "--preset",
                "x",
                "--socket",
                "/r/a.sock"
            ])),
            vec![PathBuf::from("/r/a.sock")]
        );
        assert!(sockets_of(&os(&["/bin/sleep", "--socket", "/r/a.sock"])).is_empty());
        let dir = std::env::temp_dir().join(format!("moneta-supervisor-d-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let (f0, f1) = (dir.join("n0.args"), dir.join("n1.args"));
        fs::write(&f0, "--preset\nx\n--socket\n/r/n0.sock\n").unwrap();
        fs::write(&f1, "--socket\n/r/n1.sock\n--netns\nns1\n").unwrap();
        let args = os(&[
            "/bin/moneta",
            "serve-group",
            "--reactors",
            "2",
            f0.to_str().unwrap(),
            f1.to_str().unwrap(),
        ]);
        assert_eq!(
            sockets_of(&args),
            vec![PathBuf::from("/r/n0.sock"), PathBuf::from("/r/n1.sock")]
        );
        fs::remove_dir_all(&dir).unwrap();
        // This test process is no daemon.
        let me = std::process::id() as i32;
        assert!(daemon_sockets(me).is_empty());
        assert!(!is_our_daemon(me, Path::new("/r/a.sock")));
        assert!(!stop_daemon(me, Path::new("/r/a.sock")).unwrap());
    }
}
