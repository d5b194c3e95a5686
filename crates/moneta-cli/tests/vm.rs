//! `moneta vm run` end to end (issue 44): a Debian kernel under QEMU with
//! the emulated device as its vhost-user-blk disk. The guest writes seeded
//! bytes to /dev/vda with O_DIRECT, reads them back past its page cache
//! and compares; the host then finds the same bytes in the device's image.
//! Through XFS in the guest: the file is there, and the host's xfs_repair
//! finds the file system clean and a loop mount the same bytes. The
//! command's exit code comes back. Needs root (the kernel's package is
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
    let repair = Command::new("xfs_repair")
        .arg("-n")
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        repair.status.success(),
        "xfs_repair -n: {}{}",
        String::from_utf8_lossy(&repair.stdout),
        String::from_utf8_lossy(&repair.stderr)
    );
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
