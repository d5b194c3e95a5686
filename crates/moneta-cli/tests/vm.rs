//! `moneta vm run` end to end (issue 44): a Debian kernel under QEMU with
//! the emulated device as its vhost-user-blk disk. The guest writes seeded
//! bytes to /dev/vda with O_DIRECT, reads them back past its page cache
//! and compares; the host then finds the same bytes in the device's image.
//! Through XFS in the guest: the file is there, and the host's xfs_repair
//! finds the file system clean and a loop mount the same bytes. The
//! command's exit code comes back. What the guest flushed survives kill -9
//! of the moneta process (the device and its vhost-user backend) and of
//! QEMU together: a restarted guest mounts the XFS, the file is the same
//! bytes, and the host's xfs_repair -n finds the file system clean. Needs root (the kernel's package is
//! fetched into /var/cache/moneta/vm once), qemu-system-x86_64 and a
//! static busybox (`make setup`); here QEMU runs TCG (PVM /dev/kvm).

mod common;

use common::moneta;
use moneta_testkit::{require_root, require_tool};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch directory removed on drop, with its loop mount if any.
struct Scratch {
    dir: PathBuf,
    mounted: Option<PathBuf>,
}

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = PathBuf::from(format!("/tmp/vm-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir, mounted: None }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Some(m) = &self.mounted {
            let _ = Command::new("umount").arg(m).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `len` bytes of splitmix64 output from `seed`.
fn seeded(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        out.extend_from_slice(&moneta_model::kernel::rng::splitmix64(&mut s).to_le_bytes());
    }
    out.truncate(len);
    out
}

fn needs() -> bool {
    require_root("the guest kernel is fetched into /var/cache/moneta/vm")
        && require_tool("qemu-system-x86_64", "moneta vm boots the guest under QEMU")
        && require_tool(
            "busybox",
            "the guest's initramfs is built around busybox-static",
        )
}

fn vm_run(s: &Scratch, extra: &[&str], command: &str) -> Output {
    let image = s.dir.join("device.img");
    let socket = s.dir.join("vhost.sock");
    let mut c = moneta();
    c.args(["vm", "run", "--quiet", "--timeout-s", "400"])
        .args(["--set", "device.capacity_bytes=1073741824"])
        .arg("--image")
        .arg(&image)
        .arg("--socket")
        .arg(&socket)
        .args(extra)
        .args(["--", "sh", "-c", command]);
    let out = c.output().expect("running moneta vm run");
    eprintln!(
        "moneta vm run: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn image_bytes(image: &Path, at: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(image).unwrap();
    let mut buf = vec![0u8; len];
    f.read_exact_at(&mut buf, at).unwrap();
    buf
}

#[test]
fn a_guest_writes_seeded_bytes_to_vda_and_the_image_holds_them() {
    if !needs() {
        return;
    }
    let s = Scratch::new("raw");
    let seed = 20261202u64;
    let data = seeded(seed, 1 << 20);
    let file = s.dir.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    // Written at block 100 (4 KiB blocks), read back with the page cache dropped.
    let command =
        "dd if=/files/data.bin of=/dev/vda bs=4096 seek=100 oflag=direct conv=fsync status=none \
         && echo 3 > /proc/sys/vm/drop_caches \
         && dd if=/dev/vda of=/tmp/back bs=4096 skip=100 count=256 iflag=direct status=none \
         && cmp /files/data.bin /tmp/back && echo SAME-IN-GUEST";
    let out = vm_run(&s, &["--put", file.to_str().unwrap()], command);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "seed {seed}: the guest's command failed"
    );
    assert!(stdout.contains("SAME-IN-GUEST"), "seed {seed}: {stdout}");
    assert!(
        stderr.contains("TCG: guest CPU emulated") || stderr.contains("KVM:"),
        "the result names how the guest's CPU ran: {stderr}"
    );
    assert!(stderr.contains(" 0 malformed"), "{stderr}");
    let on_image = image_bytes(&s.dir.join("device.img"), 100 * 4096, data.len());
    assert!(
        on_image == data,
        "seed {seed}: the image differs from what the guest wrote"
    );
}

#[test]
fn xfs_in_the_guest_keeps_a_file_the_host_finds_intact() {
    if !needs() || !require_tool("xfs_repair", "checking the guest's XFS from the host") {
        return;
    }
    let mut s = Scratch::new("xfs");
    let seed = 44u64;
    let data = seeded(seed, 3 << 20);
    let file = s.dir.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    let command = "cp /files/data.bin /mnt/kept && sync && echo 3 > /proc/sys/vm/drop_caches \
         && cmp /files/data.bin /mnt/kept && echo SAME-ON-XFS";
    let out = vm_run(
        &s,
        &["--mount-fs", "xfs", "--put", file.to_str().unwrap()],
        command,
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "seed {seed}: the guest's command failed"
    );
    assert!(stdout.contains("SAME-ON-XFS"), "{stdout}");
    let image = s.dir.join("device.img");
    assert_xfs_clean(&image, "after the guest's copy");
    let mnt = s.dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mount = Command::new("mount")
        .args(["-t", "xfs", "-o", "loop,ro"])
        .arg(&image)
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(mount.success(), "mounting the guest's XFS on the host");
    s.mounted = Some(mnt.clone());
    let kept = std::fs::read(mnt.join("kept")).unwrap();
    assert!(kept == data, "seed {seed}: the file differs on the host");
}

#[test]
fn the_guest_commands_exit_code_comes_back() {
    if !needs() {
        return;
    }
    let s = Scratch::new("exit");
    let out = vm_run(&s, &[], "echo before; exit 7");
    assert_eq!(out.status.code(), Some(7));
    assert!(String::from_utf8_lossy(&out.stdout).contains("before"));
}

/// Process ids of `pid`'s children (every thread's).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
            }
        }
    }
    out
}

/// The running `moneta vm run` and its QEMU, killed with SIGKILL on drop.
struct Running {
    child: std::process::Child,
    qemu: Vec<u32>,
}

impl Running {
    fn kill_all(&mut self) {
        // The device (and its backend) first, then QEMU: both at once, as a crash would.
        let _ = self.child.kill();
        for &q in &self.qemu {
            // SAFETY: kill has no memory preconditions; q is our child's child.
            unsafe { libc::kill(q as i32, libc::SIGKILL) };
        }
        let _ = self.child.wait();
        for &q in &self.qemu {
            for _ in 0..100 {
                if !Path::new(&format!("/proc/{q}")).exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.kill_all();
    }
}

#[test]
fn what_the_guest_flushed_survives_kill_9_of_qemu_and_the_device() {
    use std::io::BufRead;
    if !needs() || !require_tool("xfs_repair", "checking the guest's XFS from the host") {
        return;
    }
    let s = Scratch::new("kill9");
    let seed = 4409u64;
    let data = seeded(seed, 2 << 20);
    let file = s.dir.join("data.bin");
    std::fs::write(&file, &data).unwrap();
    let image = s.dir.join("device.img");
    let mut c = moneta();
    c.args(["vm", "run", "--quiet", "--timeout-s", "400"])
        .args(["--set", "device.capacity_bytes=1073741824"])
        .arg("--image")
        .arg(&image)
        .arg("--socket")
        .arg(s.dir.join("vhost.sock"))
        .args(["--mount-fs", "xfs", "--put", file.to_str().unwrap()])
        .args([
            "--",
            "sh",
            "-c",
            // Flushed, then more written and never flushed, then killed mid-sleep.
            "cp /files/data.bin /mnt/kept && sync && echo FLUSHED \
             && dd if=/dev/zero of=/mnt/unflushed bs=64k count=64 status=none; sleep 600",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    let mut child = c.spawn().expect("starting moneta vm run");
    let stdout = child.stdout.take().unwrap();
    let mut running = Running {
        child,
        qemu: Vec::new(),
    };
    let mut flushed = false;
    for line in std::io::BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        eprintln!("guest: {line}");
        if line.trim() == "FLUSHED" {
            flushed = true;
            break;
        }
    }
    assert!(flushed, "seed {seed}: the guest never reported its flush");
    // Let the unflushed write start, then kill the device and QEMU.
    std::thread::sleep(std::time::Duration::from_millis(500));
    running.qemu = children(running.child.id());
    assert!(
        !running.qemu.is_empty(),
        "no QEMU under moneta vm run (pid {})",
        running.child.id()
    );
    running.kill_all();
    drop(running);
    // A new device on the same image, a new guest: mount (the log is
    // replayed), compare, unmount.
    let out = vm_run(
        &s,
        &["--put", file.to_str().unwrap()],
        "mount -t xfs /dev/vda /mnt && cmp /files/data.bin /mnt/kept && echo SAME-AFTER-KILL; \
         rc=$?; umount /mnt; exit $rc",
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("SAME-AFTER-KILL"),
        "seed {seed}: the flushed file did not survive kill -9: {stdout}"
    );
    assert_xfs_clean(&image, &format!("seed {seed}: after kill -9"));
}

/// `xfs_repair -n` finds nothing wrong with the XFS on `image`.
fn assert_xfs_clean(image: &std::path::Path, when: &str) {
    let repair = Command::new("xfs_repair")
        .arg("-n")
        .arg(image)
        .output()
        .unwrap();
    assert!(
        repair.status.success(),
        "xfs_repair -n {when}: {}{}",
        String::from_utf8_lossy(&repair.stdout),
        String::from_utf8_lossy(&repair.stderr)
    );
}

/// `moneta vm compare` (one raw guest, two fio jobs, one second each):
/// every measured row carries its own job's verdict, judged on the device
/// requests between the marks the guest printed around that job, and the
/// JSON carries the provenance with the overall verdict.
#[test]
fn vm_compare_gives_each_job_its_own_verdict() {
    if !needs() {
        return;
    }
    let s = Scratch::new("compare");
    let out = moneta()
        .args(["vm", "compare", "--no-xfs", "--tcg", "--format", "json"])
        .args(["--set", "device.capacity_bytes=1073741824"])
        .args([
            "--rw",
            "randread,randwrite",
            "--sizes",
            "4k",
            "--uring-depths",
            "",
        ])
        .args(["--runtime-s", "1", "--region", "16m", "--timeout-s", "400"])
        .current_dir(&s.dir)
        .output()
        .expect("running moneta vm compare");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let rows = v["results"].as_array().unwrap();
    let guest: Vec<&serde_json::Value> = rows.iter().filter(|r| r["path"] == "guest raw").collect();
    assert_eq!(guest.len(), 2, "{v}");
    for r in &guest {
        let verdict = r["verdict"].as_str().unwrap();
        assert!(r["faithful"].is_boolean(), "{r}");
        assert!(
            verdict == "faithful" || verdict.starts_with("not faithful: "),
            "each job is judged on its own requests: {r}"
        );
    }
    let overall = v["provenance"]["verdict"].as_str().unwrap();
    let any_not = rows.iter().any(|r| r["faithful"] == false);
    assert_eq!(overall == "not faithful", any_not, "{v}");
    assert!(rows.iter().any(|r| r["path"] == "sim base"), "{v}");
}
