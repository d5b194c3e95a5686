//! End-to-end tests of `moneta up`, `down` and `status`: real image files,
//! loop devices, XFS and ext4, and a real daemon. They need root and loop
//! devices (CI has both). Each test works under its own mount point in /tmp
//! and cleans up in a guard even when it fails.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn moneta(args: &[&str]) -> Output {
    moneta_with(args, &[])
}

fn moneta_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("moneta runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "status {}\nstdout: {}\nstderr: {}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    text(&o.stdout)
}

/// Exit code 2 and `needle` in the message.
#[track_caller]
fn refused(o: &Output, needle: &str) {
    let err = text(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {err}",
        text(&o.stdout)
    );
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

/// The state directory `moneta up` uses for `mount` (test paths have no
/// '_' or '%', which the name would escape).
fn state_dir(mount: &Path) -> PathBuf {
    let s = mount.to_str().unwrap();
    assert!(!s.contains('_') && !s.contains('%'));
    Path::new("/run/moneta").join(s.replace('/', "_"))
}

fn status() -> Vec<serde_json::Value> {
    let o = moneta(&["status", "--format", "json"]);
    serde_json::from_str(&ok(&o)).expect("status prints JSON")
}

fn entry(mount: &Path) -> Option<serde_json::Value> {
    status()
        .into_iter()
        .find(|e| e["mount"].as_str() == mount.to_str())
}

fn is_mounted(dir: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == dir.to_str())
}

/// Loop devices backed by anything in `dir`: `losetup -j` for the image,
/// and `losetup -a` in case the image was deleted under one.
fn loops_under(dir: &Path) -> String {
    let image = dir.join("device.img");
    let mut found = String::new();
    if image.exists() {
        let o = Command::new("losetup")
            .arg("-j")
            .arg(&image)
            .output()
            .unwrap();
        found += &text(&o.stdout);
    }
    let all = Command::new("losetup").arg("-a").output().unwrap();
    for line in text(&all.stdout).lines() {
        if line.contains(dir.to_str().unwrap()) && !found.contains(line) {
            found += line;
            found += "\n";
        }
    }
    found.trim().to_string()
}

fn daemon_runs(socket: &Path) -> bool {
    Command::new("pgrep")
        .arg("-f")
        .arg(socket)
        .stdout(Stdio::null())
        .status()
        .unwrap()
        .success()
}

#[track_caller]
fn assert_nothing_left(mount: &Path) {
    let dir = state_dir(mount);
    assert!(!is_mounted(mount), "{} is still mounted", mount.display());
    assert_eq!(loops_under(&dir), "", "loop devices left");
    assert!(!daemon_runs(&dir.join("monetad.sock")), "a daemon is left");
    assert!(!dir.join("state.json").exists(), "state.json left");
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !info.contains(dir.join("nbd").to_str().unwrap()),
        "nbdfuse's mount is left"
    );
}

/// A mount point under /tmp for one test; on drop, whatever `up` left is
/// taken down: `moneta down --purge`, then by hand.
struct Scratch {
    root: PathBuf,
    mount: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root = PathBuf::from(format!("/tmp/moneta-mount-{}-{name}", std::process::id()));
        let s = Scratch {
            mount: root.join("mnt"),
            root,
        };
        s.clean();
        std::fs::create_dir_all(&s.root).unwrap();
        s
    }

    fn at(&self, sub: &str) -> PathBuf {
        self.root.join(sub)
    }

    /// Take down every instance whose mount point is under this test's
    /// directory: by `moneta down --purge`, then by hand.
    fn clean(&self) {
        let prefix = format!(
            "{}_",
            state_dir(&self.root).file_name().unwrap().to_str().unwrap()
        );
        let dirs: Vec<PathBuf> = std::fs::read_dir("/run/moneta")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .map(|e| e.path())
            .collect();
        for dir in dirs {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let mount = PathBuf::from(name.replace('_', "/"));
            let _ = moneta(&["down", "--purge", "--mount", mount.to_str().unwrap()]);
            for line in loops_under(&dir).lines() {
                if let Some((dev, _)) = line.split_once(':') {
                    let _ = Command::new("umount").arg("-l").arg(dev).status();
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
            let _ = Command::new("pkill")
                .args(["--signal", "KILL", "-f"])
                .arg(dir.join("monetad.sock"))
                .status();
            let _ = std::fs::remove_dir_all(&dir);
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for point in info.lines().filter_map(|l| l.split(' ').nth(4)) {
            if Path::new(point).starts_with(&self.root) {
                let _ = Command::new("umount").arg("-l").arg(point).status();
            }
        }
        if !info.contains(self.root.to_str().unwrap()) {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.clean();
    }
}

fn up(mount: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["up", "--mount", mount.to_str().unwrap()];
    args.extend(extra);
    moneta(&args)
}

fn down(mount: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["down", "--mount", mount.to_str().unwrap()];
    args.extend(extra);
    moneta(&args)
}

/// Whether the daemon serves `needle` from its device: the bytes written
/// through the file system (loop device, page cache of the image) are the
/// bytes the device holds. Scans with raw reads until found.
fn daemon_serves(socket: &Path, needle: &[u8]) -> bool {
    let m = moneta::Moneta::connect(socket).expect("connect to the daemon");
    let capacity = m.capacity_bytes();
    m.grant_raw(0, capacity, false)
        .expect("raw grant (root owns the daemon)");
    let step = m.max_request_bytes().min(1 << 20);
    let mut buf = vec![0u8; step as usize];
    let mut carry = Vec::new();
    let mut at = 0;
    while at < capacity {
        let n = step.min(capacity - at) as usize;
        m.read(at, &mut buf[..n]).expect("raw read");
        carry.extend_from_slice(&buf[..n]);
        if carry.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
        carry.drain(..carry.len().saturating_sub(needle.len()));
        at += n as u64;
    }
    false
}

fn round_trip(fs: &str, size: &str) {
    let t = Scratch::new(fs);
    let mount = t.mount.clone();
    ok(&up(&mount, &["--fs", fs, "--size", size]));

    let e = entry(&mount).expect("status lists the instance");
    assert_eq!(e["state"], "up", "{e}");
    for piece in ["mounted", "loop_device", "daemon", "socket"] {
        assert_eq!(e["alive"][piece], true, "{piece}: {e}");
    }
    assert_eq!(e["fs"], fs);
    assert_eq!(e["state_dir"].as_str(), state_dir(&mount).to_str());
    let socket = PathBuf::from(e["socket"].as_str().unwrap());
    let image = PathBuf::from(e["image"].as_str().unwrap());
    let loop_device = e["loop_device"].as_str().unwrap().to_string();
    let table = ok(&moneta(&["status"]));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(mount.to_str().unwrap()) && l.contains(" up ")),
        "{table}"
    );

    let marker = format!(
        "moneta {fs} file, written through the mount {}",
        std::process::id()
    );
    let file = mount.join("hello.txt");
    std::fs::write(&file, &marker).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    ok(&Command::new("sync").output().unwrap());
    assert!(
        daemon_serves(&socket, marker.as_bytes()),
        "the daemon does not serve the file's bytes"
    );
    let stats: serde_json::Value = serde_json::from_str(&ok(&moneta(&[
        "stats",
        "--json",
        "--daemon",
        socket.to_str().unwrap(),
    ])))
    .unwrap();
    assert!(stats.get("channels_open").is_some(), "{stats}");

    let said = ok(&down(&mount, &[]));
    assert!(said.contains("kept"), "{said}");
    let e = entry(&mount).expect("a down instance with its image is listed");
    assert_eq!(e["state"], "down", "{e}");
    for piece in ["mounted", "loop_device", "daemon", "socket"] {
        assert_eq!(e["alive"][piece], false, "{piece}: {e}");
    }
    assert_nothing_left(&mount);
    let o = Command::new("losetup")
        .arg("-j")
        .arg(&image)
        .output()
        .unwrap();
    assert_eq!(text(&o.stdout).trim(), "", "{loop_device} still attached");
    assert!(!file.exists());

    // Plain `up` brings back the same image, file system and size.
    let said = ok(&up(&mount, &[]));
    assert!(said.contains("reused"), "{said}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), marker);
    let e = entry(&mount).unwrap();
    assert_eq!(
        (e["state"].as_str(), e["fs"].as_str()),
        (Some("up"), Some(fs))
    );

    ok(&down(&mount, &["--purge"]));
    assert_nothing_left(&mount);
    assert!(!state_dir(&mount).exists());
    assert!(entry(&mount).is_none());
}

#[test]
fn xfs_files_survive_down_and_up() {
    round_trip("xfs", "512M");
}

#[test]
fn ext4_files_survive_down_and_up() {
    round_trip("ext4", "64M");
}

#[test]
fn two_instances_coexist() {
    let t = Scratch::new("two");
    let (a, b) = (t.at("a"), t.at("b"));
    ok(&up(&a, &["--fs", "ext4", "--size", "64M"]));
    ok(&up(
        &b,
        &["--fs", "ext4", "--size", "128M", "--preset", "moneta"],
    ));
    let (ea, eb) = (entry(&a).unwrap(), entry(&b).unwrap());
    assert_eq!(
        (ea["state"].as_str(), eb["state"].as_str()),
        (Some("up"), Some("up"))
    );
    assert_ne!(ea["loop_device"], eb["loop_device"]);
    assert_ne!(ea["socket"], eb["socket"]);
    assert_eq!(eb["preset"], "moneta");
    std::fs::write(a.join("a.txt"), "a").unwrap();
    std::fs::write(b.join("b.txt"), "b").unwrap();
    assert!(!a.join("b.txt").exists() && !b.join("a.txt").exists());

    ok(&down(&a, &[]));
    assert_nothing_left(&a);
    let eb = entry(&b).unwrap();
    assert_eq!(eb["state"], "up", "{eb}");
    ok(&moneta(&[
        "stats",
        "--daemon",
        eb["socket"].as_str().unwrap(),
    ]));
    assert_eq!(std::fs::read_to_string(b.join("b.txt")).unwrap(), "b");
    ok(&down(&b, &["--purge"]));
    ok(&down(&a, &["--purge"]));
    assert_nothing_left(&b);
}

#[test]
fn up_twice_is_a_no_op_and_down_twice_is_fine() {
    let t = Scratch::new("twice");
    let m = t.mount.clone();
    ok(&up(&m, &["--fs", "ext4", "--size", "64M"]));
    let pid = entry(&m).unwrap()["daemon_pid"].clone();
    let said = ok(&up(&m, &["--fs", "ext4", "--size", "64M"]));
    assert!(said.contains("already up"), "{said}");
    ok(&up(&m, &[]));
    assert_eq!(
        entry(&m).unwrap()["daemon_pid"],
        pid,
        "the daemon was restarted"
    );

    refused(&up(&m, &["--fs", "xfs"]), "file system ext4 (asked xfs)");
    refused(
        &up(&m, &["--size", "128M"]),
        "size 67108864 bytes (asked 134217728)",
    );
    refused(
        &up(&m, &["--preset", "moneta"]),
        "preset moneta-d (asked moneta)",
    );
    refused(&up(&m, &["--fresh"]), "moneta down");
    assert_eq!(entry(&m).unwrap()["state"], "up");

    ok(&down(&m, &[]));
    let said = ok(&down(&m, &[]));
    assert!(said.contains("not up"), "{said}");
    // An image that exists is reused, never reformatted; its facts hold.
    refused(&up(&m, &["--fs", "xfs"]), "holds ext4, not xfs");
    ok(&down(&m, &["--purge"]));
    ok(&down(&m, &["--purge"]));
    assert_nothing_left(&m);
}

#[test]
fn up_from_a_configuration_file() {
    let t = Scratch::new("config");
    let m = t.mount.clone();
    let file = t.at("my-d.toml");
    std::fs::write(
        &file,
        "inherits = \"moneta-d\"\nname = \"my-d\"\n[device]\ntransfer_buffers = 4\n",
    )
    .unwrap();
    let bad = t.at("bad.toml");
    std::fs::write(&bad, "inherits = \"moneta-d\"\n[device]\nbufers = 4\n").unwrap();
    let ext4 = ["--fs", "ext4", "--size", "64M"];

    refused(
        &up(
            &m,
            &[&ext4[..], &["--config", bad.to_str().unwrap()]].concat(),
        ),
        "device.bufers: unknown key",
    );
    assert_nothing_left(&m);
    let said = ok(&up(
        &m,
        &[&ext4[..], &["--config", file.to_str().unwrap()]].concat(),
    ));
    assert!(said.contains("my-d from"), "{said}");
    assert_eq!(entry(&m).unwrap()["preset"], "my-d");
    let said = ok(&up(&m, &["--config", file.to_str().unwrap()]));
    assert!(said.contains("already up"), "{said}");
    refused(
        &up(&m, &["--preset", "moneta-d"]),
        "preset my-d (asked moneta-d)",
    );
    // A plain `up` serves the file again.
    ok(&down(&m, &[]));
    ok(&up(&m, &[]));
    assert_eq!(entry(&m).unwrap()["preset"], "my-d");
    ok(&down(&m, &["--purge"]));
    assert_nothing_left(&m);
}

#[test]
fn failed_up_leaves_nothing_behind() {
    let t = Scratch::new("fail");
    let m = t.mount.clone();
    let ext4 = ["--fs", "ext4", "--size", "64M"];

    refused(&up(&m, &["--preset", "nonexistent"]), "unknown preset");
    assert_nothing_left(&m);
    assert!(!state_dir(&m).exists());
    refused(
        &up(&m, &["--fs", "ext4", "--size", "100000"]),
        "multiple of memory.stripe_bytes",
    );
    refused(&up(&m, &["--size", "256M"]), "XFS needs at least");
    refused(&up(&m, &["--fs", "ext4", "--size", "64K"]), "mkfs.ext4");
    assert_nothing_left(&m);
    assert!(!state_dir(&m).exists());

    // The mount point is a regular file: refused before anything is made
    // (no image, file system or loop device to undo: nothing rolled back).
    let file = t.at("file");
    std::fs::write(&file, "not a directory").unwrap();
    let o = up(&file, &ext4);
    refused(&o, "not a directory");
    assert!(
        !text(&o.stderr).contains("rolled back"),
        "refused only after making something: {}",
        text(&o.stderr)
    );
    assert_nothing_left(&file);
    assert!(!state_dir(&file).exists());
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a directory");

    let deep = t.at("x/y/mnt");
    // The kernel path through NBD has its own order and one more step.
    let steps = [
        (
            "loop",
            &["image", "mkfs", "loop", "mount", "daemon", "state"][..],
        ),
        (
            "device",
            &["daemon", "nbdfuse", "loop", "mount", "state"][..],
        ),
    ];
    for (kernel_path, steps) in steps {
        for step in steps {
            let fault = format!("fail@{step}");
            let o = moneta_with(
                &[
                    "up",
                    "--mount",
                    deep.to_str().unwrap(),
                    "--fs",
                    "ext4",
                    "--size",
                    "64M",
                    "--kernel-path",
                    kernel_path,
                ],
                &[("MONETA_UP_FAULT", &fault)],
            );
            refused(&o, &format!("after step {step}"));
            assert_nothing_left(&deep);
            let what = format!("{kernel_path} {fault}");
            assert!(!state_dir(&deep).exists(), "{what}: state directory left");
            assert!(!t.at("x").exists(), "{what}: mount point directories left");
        }
    }
    let o = moneta_with(
        &[
            "up",
            "--mount",
            deep.to_str().unwrap(),
            "--fs",
            "ext4",
            "--size",
            "64M",
        ],
        &[("MONETA_UP_FAULT", "panic@daemon")],
    );
    assert_eq!(o.status.code(), Some(101), "{}", text(&o.stderr));
    assert_nothing_left(&deep);
    assert!(!state_dir(&deep).exists());

    // A failure on an existing image undoes the run but keeps the image.
    ok(&up(&m, &ext4));
    std::fs::write(m.join("keep.txt"), "kept").unwrap();
    ok(&down(&m, &[]));
    let o = moneta_with(
        &["up", "--mount", m.to_str().unwrap()],
        &[("MONETA_UP_FAULT", "fail@daemon")],
    );
    refused(&o, "after step daemon");
    assert_nothing_left(&m);
    assert!(state_dir(&m).join("device.img").exists());
    ok(&up(&m, &[]));
    assert_eq!(std::fs::read_to_string(m.join("keep.txt")).unwrap(), "kept");
    ok(&down(&m, &["--purge"]));
}

/// `up --size 100T` where the image's file system cannot hold a file that
/// large (ext4's limit is 16 TiB; here the child's RLIMIT_FSIZE of 1 TiB
/// stands in for it, so the test does not depend on what /run/moneta is):
/// the message names --size and what to do, not "File too large (os
/// error 27)", and nothing is left behind.
#[test]
fn an_image_too_large_for_its_file_system_is_named() {
    use std::os::unix::process::CommandExt;
    let t = Scratch::new("large");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_moneta"));
    cmd.args(["up", "--mount", t.mount.to_str().unwrap(), "--size", "100T"]);
    // SAFETY: setrlimit and signal are async-signal-safe; nothing else runs
    // between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 1 << 40,
                rlim_max: 1 << 40,
            };
            // Past the limit a write or truncate fails with EFBIG (with
            // SIGXFSZ ignored, as it stays across exec) instead of killing.
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            if libc::setrlimit(libc::RLIMIT_FSIZE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let o = cmd.output().expect("moneta runs");
    refused(&o, "--size 100 TiB: larger than the largest file");
    assert!(
        !text(&o.stderr).contains("os error 27"),
        "{}",
        text(&o.stderr)
    );
    assert_nothing_left(&t.mount);
    assert!(!state_dir(&t.mount).exists());
}

#[test]
fn interrupted_up_rolls_back() {
    let t = Scratch::new("sigint");
    let m = t.mount.clone();
    let mut child = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args([
            "up",
            "--mount",
            m.to_str().unwrap(),
            "--fs",
            "ext4",
            "--size",
            "64M",
        ])
        .env("MONETA_UP_FAULT", "stall@daemon")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("stalled") {
        assert_ne!(stderr.read_line(&mut said).unwrap(), 0, "up ended: {said}");
    }
    // The daemon is up at this point.
    assert!(daemon_runs(&state_dir(&m).join("monetad.sock")));
    // SAFETY: kill(2) of our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    stderr.read_to_string(&mut said).unwrap();
    let status = child.wait().unwrap();
    // The shell's code for Ctrl-C, as for every interrupted command.
    assert_eq!(status.code(), Some(130), "{said}");
    assert!(said.contains("interrupted by SIGINT"), "{said}");
    assert_nothing_left(&m);
    assert!(!state_dir(&m).exists());
}

#[test]
fn half_dead_instances_are_repaired_or_cleared() {
    let t = Scratch::new("repair");
    let m = t.mount.clone();
    ok(&up(&m, &["--fs", "ext4", "--size", "64M"]));
    std::fs::write(m.join("f.txt"), "survives").unwrap();
    let pid = entry(&m).unwrap()["daemon_pid"].as_i64().unwrap() as i32;
    // SAFETY: kill(2) of the daemon that `up` started for this test.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let deadline = Instant::now() + Duration::from_secs(5);
    while entry(&m).unwrap()["alive"]["daemon"] == true {
        assert!(Instant::now() < deadline, "the daemon did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = entry(&m).unwrap();
    assert_eq!(e["state"], "broken", "{e}");
    assert!(
        e["missing"].as_array().unwrap().contains(&"daemon".into()),
        "{e}"
    );
    let o = up(&m, &[]);
    ok(&o);
    assert!(text(&o.stderr).contains("half up"), "{}", text(&o.stderr));
    assert_eq!(entry(&m).unwrap()["state"], "up");
    assert_eq!(
        std::fs::read_to_string(m.join("f.txt")).unwrap(),
        "survives"
    );
    ok(&down(&m, &[]));

    // An `up` killed outright cannot roll back: its pieces run without a
    // state.json; status says so and `down` clears them.
    let mut child = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(["up", "--mount", m.to_str().unwrap()])
        .env("MONETA_UP_FAULT", "stall@daemon")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("stalled") {
        assert_ne!(stderr.read_line(&mut said).unwrap(), 0, "up ended: {said}");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let e = entry(&m).unwrap();
    assert_eq!(e["state"], "broken", "{e}");
    assert!(
        e["missing"]
            .as_array()
            .unwrap()
            .contains(&"state.json".into()),
        "{e}"
    );
    ok(&down(&m, &[]));
    assert_nothing_left(&m);
    ok(&up(&m, &[]));
    assert_eq!(
        std::fs::read_to_string(m.join("f.txt")).unwrap(),
        "survives"
    );
    ok(&down(&m, &["--purge"]));
    assert_nothing_left(&m);
}

#[test]
fn busy_mount_is_not_forced() {
    let t = Scratch::new("busy");
    let m = t.mount.clone();
    ok(&up(&m, &["--fs", "ext4", "--size", "64M"]));
    let held = std::fs::File::create(m.join("open.txt")).unwrap();
    let me = format!("pid {}", std::process::id());
    refused(&down(&m, &[]), &me);
    assert!(is_mounted(&m), "a busy mount was forced");
    assert_eq!(
        entry(&m).unwrap()["state"],
        "up",
        "down stopped something of a busy instance"
    );
    drop(held);
    // A process whose working directory is on the mount.
    let mut sleeper = Command::new("sleep")
        .arg("30")
        .current_dir(&m)
        .spawn()
        .unwrap();
    refused(
        &down(&m, &[]),
        &format!("pid {} (sleep): cwd", sleeper.id()),
    );
    assert_eq!(entry(&m).unwrap()["state"], "up");
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    ok(&down(&m, &["--purge"]));
    assert_nothing_left(&m);
}

/// Median time of `n` O_DIRECT 4 KiB reads of `path` at different offsets.
fn direct_read_median(path: &Path, n: usize) -> std::time::Duration {
    use std::os::unix::fs::FileExt;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap();
    let layout = std::alloc::Layout::from_size_align(4096, 4096).unwrap();
    // SAFETY: a 4096-byte, 4096-aligned allocation, freed below.
    let ptr = unsafe { std::alloc::alloc(layout) };
    // SAFETY: `ptr` holds 4096 bytes for the slice's life.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, 4096) };
    let mut took: Vec<std::time::Duration> = (0..n)
        .map(|i| {
            let t = std::time::Instant::now();
            f.read_exact_at(buf, (i as u64 * 8192) % (1 << 20)).unwrap();
            t.elapsed()
        })
        .collect();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    took.sort();
    took[n / 2]
}

#[test]
fn kernel_path_device_pays_the_device_timing_and_cleans_up() {
    let t = Scratch::new("kpath");
    let mount = t.mount.clone();
    // A slow array makes the device's time plain to see.
    let slow = ["--set", "memory.latency_ns_read=200000"];
    let mut args = vec!["--fs", "ext4", "--size", "64M", "--kernel-path", "device"];
    args.extend(slow);
    let said = ok(&up(&mount, &args));
    assert!(said.contains("pays the device's timing"), "{said}");
    let e = entry(&mount).unwrap();
    assert_eq!(e["state"], "up", "{e}");
    assert_eq!(e["kernel_path"], "device", "{e}");
    for piece in ["mounted", "loop_device", "daemon", "socket", "nbdfuse"] {
        assert_eq!(e["alive"][piece], true, "{piece}: {e}");
    }
    // Asking for the other kernel path while up is refused, naming it.
    refused(
        &up(&mount, &["--kernel-path", "loop"]),
        "kernel path device",
    );

    // The kernel's writes reach the device through NBD.
    let marker = format!("kernel path through NBD {}", std::process::id());
    let file = mount.join("k.txt");
    let mut data = marker.clone().into_bytes();
    data.resize(1 << 20, b'.');
    std::fs::write(&file, &data).unwrap();
    std::fs::File::open(&file).unwrap().sync_all().unwrap();
    let socket = PathBuf::from(e["socket"].as_str().unwrap());
    assert!(
        daemon_serves(&socket, marker.as_bytes()),
        "device lacks the bytes"
    );
    // And its O_DIRECT reads pay the 200 µs array (a loop device over the
    // image answers from memory in a few µs).
    let median = direct_read_median(&file, 21);
    assert!(
        median >= std::time::Duration::from_micros(200),
        "O_DIRECT 4 KiB read median {median:?}"
    );

    // Killed nbdfuse: status says what is missing; up repairs it.
    let pid = e["nbdfuse_pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) of the pid status reported as our nbdfuse.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let e = entry(&mount).unwrap();
    assert_eq!(e["state"], "broken", "{e}");
    assert!(e["missing"].to_string().contains("nbdfuse"), "{e}");
    let _ = Command::new("umount").arg("-l").arg(&mount).status();
    let said = ok(&up(&mount, &args));
    assert!(said.contains("reused"), "{said}");

    ok(&down(&mount, &[]));
    assert_nothing_left(&mount);
    // The files are on the image: a plain up (loop kernel path) shows them.
    ok(&up(&mount, &[]));
    let back = std::fs::read(&file).unwrap();
    assert!(back == data, "file differs after down and up");
    ok(&down(&mount, &["--purge"]));
    assert_nothing_left(&mount);
}
