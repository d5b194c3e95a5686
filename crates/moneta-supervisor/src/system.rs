//! The one layer over the system's own records: processes (/proc), the
//! mount table (/proc/self/mountinfo), loop devices (/sys/block and
//! `losetup`), and external commands.

use crate::signals::interrupted;
use crate::{Error, ErrorKind, Result, STOP_GRACE};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Commands

/// A command as a shell would show it: the program and its arguments.
pub fn command_line(cmd: &Command) -> String {
    format!(
        "{} {}",
        cmd.get_program().to_string_lossy(),
        cmd.get_args()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    )
}

/// Run a command; its stdout, or an error that names it and carries the
/// first lines of its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    let shown = command_line(cmd);
    let out = cmd.output().map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            Error::new(
                ErrorKind::ToolMissing,
                format!(
                    "{}: not found (install xfsprogs, e2fsprogs, util-linux and iproute2)",
                    cmd.get_program().to_string_lossy()
                ),
            )
        } else {
            Error::with_source(ErrorKind::Command, shown.clone(), e)
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
    Err(Error::new(
        ErrorKind::Command,
        format!("{shown} failed ({}): {}", out.status, said.join("; ")),
    ))
}

// ---------------------------------------------------------------------------
// Processes

/// Every process's pid, from /proc.
pub fn pids() -> Vec<i32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .collect();
    pids.sort();
    pids
}

/// The command line of `pid`, if it runs (zombies do not).
pub fn cmdline(pid: i32) -> Option<Vec<OsString>> {
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

/// The live processes whose command line satisfies `is`, sorted.
pub fn processes_where(is: impl Fn(&[OsString]) -> bool) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&pid| cmdline(pid).is_some_and(|args| is(&args)))
        .collect()
}

/// Whether `args` is a run of `program` (by the file name of argv[0]).
pub fn runs_program(args: &[OsString], program: &str) -> bool {
    args.first()
        .is_some_and(|a| Path::new(a).file_name() == Some(program.as_ref()))
}

/// A process using a file system, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct User {
    pub pid: i32,
    pub name: String,
    /// "cwd", "root", "2 open file(s)", "a mapped file", comma-separated.
    pub how: String,
}

/// Processes (other than this one and `except`) using the file system
/// with device number `dev`: as their working or root directory, through
/// an open descriptor, or through a memory mapping.
pub fn users_of(dev: u64, except: &[i32]) -> Vec<User> {
    let me = std::process::id() as i32;
    let on = |p: &Path| fs::metadata(p).is_ok_and(|m| m.dev() == dev);
    let want = format!("{:02x}:{:02x}", libc::major(dev), libc::minor(dev));
    let mut found = Vec::new();
    for pid in pids()
        .into_iter()
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
            found.push(User {
                pid,
                name,
                how: how.join(", "),
            });
        }
    }
    found
}

/// The memory available (MemAvailable), if `/proc/meminfo` says.
pub fn mem_available() -> Option<u64> {
    fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| parse_mem_available(&m))
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

// ---------------------------------------------------------------------------
// The mount table

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountEntry {
    pub point: PathBuf,
    pub fstype: String,
    pub source: PathBuf,
}

/// The mounts of this process's namespace, in mount order.
pub fn mounts() -> Vec<MountEntry> {
    parse_mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

/// /proc/self/mountinfo, whose fields escape space, tab, newline and
/// backslash as octal.
pub fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
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
pub fn mounted_at(dir: &Path) -> Option<MountEntry> {
    mounts().into_iter().rev().find(|m| m.point == dir)
}

/// Unmount; a busy file system gets a few chances, then the error says how
/// to find who holds it.
pub fn unmount(dir: &Path) -> Result<()> {
    let mut attempt = 0;
    loop {
        match run(std::process::Command::new("umount").arg(dir)) {
            Ok(_) => return Ok(()),
            Err(e) if e.to_string().contains("busy") && attempt < 5 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(e) if e.to_string().contains("busy") => {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!(
                        "{e}\nsomething still uses {0}: `fuser -vm {0}` lists it; stop it and run moneta down again",
                        dir.display()
                    ),
                ))
            }
            Err(e) => return Err(e),
        }
    }
}

/// [`unmount`], else lazily (`umount -l`): a rollback must not leave a
/// mount behind.
pub fn unmount_or_lazily(dir: &Path) -> Result<()> {
    unmount(dir).or_else(|e| {
        run(Command::new("umount").arg("-l").arg(dir))
            .map(drop)
            .map_err(|l| Error::with_source(l.kind(), format!("{e}; lazily"), l))
    })
}

// ---------------------------------------------------------------------------
// Loop devices

/// Loop devices whose backing file is `image` (also once it was deleted).
pub fn loops_for(image: &Path) -> Vec<PathBuf> {
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

/// A new loop device over `backing`, with direct I/O or buffered.
pub fn attach_loop(backing: &Path, direct_io: bool) -> Result<PathBuf> {
    let mut cmd = Command::new("losetup");
    cmd.args(["--find", "--show"]);
    if direct_io {
        cmd.arg("--direct-io=on");
    }
    Ok(PathBuf::from(run(cmd.arg(backing))?.trim()))
}

/// Detach a loop device and wait until it is gone. Right after an unmount
/// the kernel may still hold the device for a moment; `losetup -d` then
/// only marks it to detach when released, so success means little until
/// the backing file disappears from sysfs.
pub fn detach_loop(dev: &Path) -> Result<()> {
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
            return Err(Error::new(
                ErrorKind::Stuck,
                format!(
                    "{} is still attached {} s after losetup -d: something holds it open",
                    dev.display(),
                    STOP_GRACE.as_secs()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_fields_are_unescaped_and_the_last_mount_wins() {
        let text = "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
                    40 22 7:0 / /mnt/with\\040space rw - xfs /dev/loop0 rw\n\
                    41 40 7:1 / /mnt/with\\040space rw - ext4 /dev/loop1 rw\n\
                    garbage line\n";
        let m = parse_mountinfo(text);
        assert_eq!(m.len(), 3);
        assert_eq!(m[1].point, Path::new("/mnt/with space"));
        assert_eq!(m[1].fstype, "xfs");
        assert_eq!(m[2].source, Path::new("/dev/loop1"));
        let last = m
            .iter()
            .rev()
            .find(|e| e.point == Path::new("/mnt/with space"));
        assert_eq!(last.unwrap().fstype, "ext4");
        assert!(mounts().iter().any(|e| e.point == Path::new("/")));
    }

    #[test]
    fn this_process_is_found_by_its_command_line() {
        let me = std::process::id() as i32;
        let args = cmdline(me).expect("our own command line");
        assert!(!args.is_empty());
        let exe = args[0].clone();
        assert!(processes_where(|a| a.first() == Some(&exe)).contains(&me));
        assert!(pids().contains(&me));
        assert!(cmdline(i32::MAX).is_none());
        assert!(runs_program(
            &[OsString::from("/usr/bin/nbdfuse")],
            "nbdfuse"
        ));
        assert!(!runs_program(
            &[OsString::from("/usr/bin/nbdfuse2")],
            "nbdfuse"
        ));
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        assert_eq!(
            parse_mem_available("MemTotal: 10 kB\nMemAvailable:    2048 kB\n"),
            Some(2 << 20)
        );
        assert_eq!(parse_mem_available("MemTotal: 10 kB\n"), None);
        assert!(mem_available().is_some());
    }

    #[test]
    fn a_command_error_names_it_and_what_it_said() {
        let out = run(Command::new("sh").args(["-c", "echo hi"])).unwrap();
        assert_eq!(out, "hi\n");
        let e = run(Command::new("sh").args(["-c", "echo bad thing >&2; exit 3"])).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Command);
        assert!(
            e.to_string().contains("sh -c") && e.to_string().contains("bad thing"),
            "{e}"
        );
        let e = run(&mut Command::new("moneta-no-such-tool")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::ToolMissing);
    }
}
