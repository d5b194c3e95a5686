//! The guest's software: Debian's kernel and an initramfs made from the
//! host's Debian packages, both cached.
//!
//! - The kernel: `vmlinuz` and the few modules the guest needs (virtio
//!   PCI, virtio-blk, XFS and what they depend on, read from each module's
//!   `.modinfo`), taken from the `linux-image-amd64` package's kernel
//!   (`apt-get download`, `dpkg-deb -x`; nothing is installed into /boot).
//! - The initramfs (a `newc` cpio archive, which the kernel unpacks
//!   uncompressed): busybox-static, the programs asked for (fio,
//!   mkfs.xfs, xfs_repair, xfs_io by default) with the shared libraries
//!   `ldd` names, the modules, and `/init`.
//! - Per run, a second small archive appended to it (the kernel unpacks
//!   concatenated archives in order): the command, the file system to
//!   make, and the files put into the guest (`/files`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Modules the guest loads, with their dependencies added. crc32c_generic
/// is named because libcrc32c (XFS's dependency) asks for the `crc32c`
/// crypto algorithm only as a soft dependency (`softdep=pre: crc32c`).
pub const GUEST_MODULES: &[&str] = &["virtio_pci", "virtio_blk", "crc32c_generic", "xfs"];

/// Programs the initramfs carries besides busybox.
pub const DEFAULT_PROGRAMS: &[&str] = &["fio", "mkfs.xfs", "xfs_repair", "xfs_io"];

/// The marker lines `/init` prints around the command's output.
pub const BEGIN_MARK: &str = "@@moneta-vm begin";
pub const EXIT_MARK: &str = "@@moneta-vm exit";

/// A kernel ready to boot: its image and the guest's modules in load order.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub release: String,
    pub vmlinuz: PathBuf,
    /// Module files, dependencies first.
    pub modules: Vec<PathBuf>,
}

fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("running {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{:?} {:?}: {}; {}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The kernel package `linux-image-amd64` depends on (its release).
fn kernel_package() -> Result<String, String> {
    let out = run(Command::new("apt-cache").args(["depends", "linux-image-amd64"]))?;
    out.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_string)
        .ok_or_else(|| "apt-cache depends linux-image-amd64 names no linux-image package".into())
}

/// The cached kernel under `cache`, fetched and extracted on first use.
pub fn kernel(cache: &Path) -> Result<Kernel, String> {
    let dir = cache.join("kernel");
    if let Some(k) = cached_kernel(&dir)? {
        return Ok(k);
    }
    let package = kernel_package()?;
    // Per process: runs that start together each fetch, and the first
    // rename wins.
    let work = cache.join(format!("kernel.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    eprintln!("vm: fetching {package} (once; cached in {})", dir.display());
    run(Command::new("apt-get")
        .args(["download", &package])
        .current_dir(&work))?;
    let deb = fs::read_dir(&work)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or("apt-get download left no .deb")?;
    let tree = work.join("x");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&tree))?;
    let release = package.trim_start_matches("linux-image-").to_string();
    let modules_root = tree.join("lib/modules").join(&release);
    let order = module_order(&modules_root, GUEST_MODULES)?;
    let staged = work.join("kernel");
    fs::create_dir_all(staged.join("modules")).map_err(|e| e.to_string())?;
    fs::copy(
        tree.join("boot").join(format!("vmlinuz-{release}")),
        staged.join("vmlinuz"),
    )
    .map_err(|e| format!("vmlinuz-{release}: {e}"))?;
    let mut names = Vec::new();
    for path in &order {
        let name = path.file_name().expect("a module file").to_owned();
        fs::copy(path, staged.join("modules").join(&name)).map_err(|e| e.to_string())?;
        names.push(name.to_string_lossy().into_owned());
    }
    fs::write(staged.join("modules/order"), names.join("\n") + "\n").map_err(|e| e.to_string())?;
    fs::write(staged.join("release"), &release).map_err(|e| e.to_string())?;
    if dir.exists() && cached_kernel(&dir)?.is_none() {
        let _ = fs::remove_dir_all(&dir);
    }
    let renamed = fs::rename(&staged, &dir);
    let _ = fs::remove_dir_all(&work);
    if let Err(e) = renamed {
        if cached_kernel(&dir)?.is_none() {
            return Err(format!("{}: {e}", dir.display()));
        }
    }
    cached_kernel(&dir)?.ok_or_else(|| format!("{}: incomplete after extraction", dir.display()))
}

fn cached_kernel(dir: &Path) -> Result<Option<Kernel>, String> {
    let (Ok(release), Ok(order)) = (
        fs::read_to_string(dir.join("release")),
        fs::read_to_string(dir.join("modules/order")),
    ) else {
        return Ok(None);
    };
    let modules: Vec<PathBuf> = order
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| dir.join("modules").join(l))
        .collect();
    if !dir.join("vmlinuz").exists() || modules.iter().any(|m| !m.exists()) {
        return Ok(None);
    }
    Ok(Some(Kernel {
        release,
        vmlinuz: dir.join("vmlinuz"),
        modules,
    }))
}

/// The `depends=` field of a module's `.modinfo` section (NUL-separated
/// `key=value` strings).
pub fn module_depends(ko: &[u8]) -> Vec<String> {
    ko.split(|&b| b == 0)
        .filter_map(|s| s.strip_prefix(b"depends="))
        .flat_map(|s| s.split(|&b| b == b','))
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).replace('-', "_"))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// Every module `wanted` needs under `root`, dependencies first.
fn module_order(root: &Path, wanted: &[&str]) -> Result<Vec<PathBuf>, String> {
    let mut by_name = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
            let p = e.map_err(|e| e.to_string())?.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Some(name) = p.file_name().and_then(|n| n.to_str()) {
                if let Some(stem) = name.strip_suffix(".ko") {
                    by_name.insert(stem.replace('-', "_"), p.clone());
                }
            }
        }
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    fn visit(
        name: &str,
        by_name: &BTreeMap<String, PathBuf>,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<PathBuf>,
        depth: usize,
    ) -> Result<(), String> {
        if depth > 32 {
            return Err(format!("module dependencies too deep at {name}"));
        }
        if !seen.insert(name.to_string()) {
            return Ok(());
        }
        let path = by_name
            .get(name)
            .ok_or_else(|| format!("module {name} is not in the kernel package (built in?)"))?;
        let bytes = fs::read(path).map_err(|e| e.to_string())?;
        for d in module_depends(&bytes) {
            visit(&d, by_name, seen, order, depth + 1)?;
        }
        order.push(path.clone());
        Ok(())
    }
    for w in wanted {
        visit(w, &by_name, &mut seen, &mut order, 0)?;
    }
    Ok(order)
}

/// A `newc` cpio archive being written (the kernel's initramfs format,
/// Documentation/driver-api/early-userspace/buffer-format.rst).
pub struct Cpio {
    out: Vec<u8>,
    inode: u32,
    dirs: BTreeSet<String>,
}

impl Default for Cpio {
    fn default() -> Cpio {
        Cpio {
            out: Vec::new(),
            inode: 1,
            dirs: BTreeSet::new(),
        }
    }
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, data: &[u8]) {
        let name = name.trim_start_matches('/');
        let fields = [
            self.inode,
            mode,
            0,
            0,
            1,
            0,
            data.len() as u32,
            0,
            0,
            0,
            0,
            name.len() as u32 + 1,
            0,
        ];
        self.inode += 1;
        self.out.extend_from_slice(b"070701");
        for f in fields {
            self.out.extend_from_slice(format!("{f:08X}").as_bytes());
        }
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }

    /// A directory and its parents (each once).
    pub fn dir(&mut self, path: &str) {
        let path = path.trim_matches('/');
        let mut at = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !at.is_empty() {
                at.push('/');
            }
            at.push_str(part);
            if self.dirs.insert(at.clone()) {
                let name = at.clone();
                self.entry(&name, 0o040755, &[]);
            }
        }
    }

    /// A regular file (its directory made first).
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, 0o100000 | (mode & 0o7777), data);
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, 0o120777, target.as_bytes());
    }

    /// The archive with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, &[]);
        self.out
    }
}

/// Where a host program is (`command -v`'s search of the usual dirs).
pub fn which(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Some(PathBuf::from(program)).filter(|p| p.is_file());
    }
    [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ]
    .iter()
    .map(|d| Path::new(d).join(program))
    .find(|p| p.is_file())
}

/// The shared libraries `ldd` says `binary` loads (with the loader).
fn libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|e| format!("ldd: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let path = match l.split_once("=>") {
                Some((_, right)) => right.trim().split(' ').next()?,
                None => l.split(' ').next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// The `/init` script: mount, load the modules, wait for the disk, run
/// the per-run script, power off.
fn init_script(modules: &[String]) -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
for m in {modules}; do insmod /lib/moneta-modules/$m || echo "moneta-vm: insmod $m failed"; done
n=0
while [ ! -b /dev/vda ] && [ $n -lt 100 ]; do sleep 0.1; n=$((n+1)); done
echo 1 > /proc/sys/kernel/printk
if [ -b /dev/vda ]; then . /moneta/run.sh; else echo "{EXIT_MARK} 125 no /dev/vda"; fi
sync
poweroff -f
"#,
        modules = modules.join(" ")
    )
}

/// The cached base initramfs for `kernel` and `programs` (rebuilt when
/// either changes: the cache key is their names and sizes).
pub fn base_initramfs(
    cache: &Path,
    kernel: &Kernel,
    programs: &[String],
) -> Result<PathBuf, String> {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or("busybox not found: install busybox-static (make setup)")?;
    let mut key = format!(
        "{} {}",
        kernel.release,
        fs::metadata(&busybox).map_or(0, |m| m.len())
    );
    let mut binaries = Vec::new();
    for p in programs {
        let path = which(p).ok_or_else(|| format!("{p}: not found on the host (make setup)"))?;
        key.push_str(&format!(
            " {}:{}",
            path.display(),
            fs::metadata(&path).map_or(0, |m| m.len())
        ));
        binaries.push(path);
    }
    let name = format!(
        "initramfs-{:016x}.cpio",
        moneta_model::kernel::hash::fnv1a(key.as_bytes())
    );
    let out = cache.join(&name);
    if out.exists() {
        return Ok(out);
    }
    let mut cpio = Cpio::default();
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "mnt", "files", "moneta",
    ] {
        cpio.dir(d);
    }
    cpio.file("bin/busybox", 0o755, &read(&busybox)?);
    let mut libs = BTreeSet::new();
    for b in &binaries {
        cpio.file(&b.to_string_lossy(), 0o755, &read(b)?);
        libs.extend(libraries(b)?);
    }
    for l in &libs {
        cpio.file(&l.to_string_lossy(), 0o755, &read(l)?);
    }
    let mut names = Vec::new();
    for m in &kernel.modules {
        let n = m
            .file_name()
            .expect("module file")
            .to_string_lossy()
            .into_owned();
        cpio.file(&format!("lib/moneta-modules/{n}"), 0o644, &read(m)?);
        names.push(n);
    }
    cpio.file("init", 0o755, init_script(&names).as_bytes());
    write_atomically(&out, &cpio.finish())?;
    Ok(out)
}

/// What one run does in the guest.
#[derive(Debug, Clone, Default)]
pub struct RunSpec {
    /// The command's words (run with `exec` semantics through sh: quoted).
    pub command: Vec<String>,
    /// Make this file system on /dev/vda and mount it on /mnt first.
    pub mount_fs: Option<String>,
    /// Host files copied into the guest's /files.
    pub files: Vec<PathBuf>,
}

/// Quote a word for sh.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The per-run archive: `/moneta/run.sh` and `/files`.
pub fn run_archive(spec: &RunSpec) -> Result<Vec<u8>, String> {
    let mut cpio = Cpio::default();
    let mut script = String::new();
    if let Some(fs_type) = &spec.mount_fs {
        let mkfs = match fs_type.as_str() {
            "xfs" => "mkfs.xfs -f -q /dev/vda",
            other => return Err(format!("--mount-fs {other}: only xfs")),
        };
        script.push_str(&format!(
            "{mkfs} || {{ echo \"{EXIT_MARK} 124 mkfs failed\"; return; }}\n\
             mount -t {fs_type} /dev/vda /mnt || {{ echo \"{EXIT_MARK} 124 mount failed\"; return; }}\n\
             cd /mnt\n"
        ));
    }
    let words: Vec<String> = spec.command.iter().map(|w| quote(w)).collect();
    script.push_str(&format!(
        "echo \"{BEGIN_MARK} $(cut -d' ' -f1 /proc/uptime)\"\n{}\nrc=$?\ncd /\n",
        words.join(" ")
    ));
    if spec.mount_fs.is_some() {
        script.push_str("umount /mnt || rc=123\n");
    }
    script.push_str(&format!("sync\necho \"{EXIT_MARK} $rc\"\n"));
    cpio.file("moneta/run.sh", 0o644, script.as_bytes());
    for f in &spec.files {
        let name = f
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| format!("{}: no file name", f.display()))?;
        cpio.file(&format!("files/{name}"), 0o644, &read(f)?);
    }
    Ok(cpio.finish())
}

fn read(p: &Path) -> Result<Vec<u8>, String> {
    fs::read(p).map_err(|e| format!("{}: {e}", p.display()))
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut f = fs::File::create(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    f.write_all(bytes).map_err(|e| e.to_string())?;
    fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_depends_reads_the_modinfo_field() {
        let ko =
            b"\x7fELF junk\0license=GPL\0depends=virtio,virtio_ring,crc32c-generic\0vermagic=6.1\0";
        assert_eq!(
            module_depends(ko),
            vec!["crc32c_generic", "virtio", "virtio_ring"]
        );
        assert!(module_depends(b"depends=\0").is_empty());
    }

    #[test]
    fn cpio_entries_are_aligned_and_end_with_the_trailer() {
        let mut c = Cpio::default();
        c.file("a/b/c", 0o644, b"xyz");
        c.symlink("bin/sh", "busybox");
        let out = c.finish();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let text = String::from_utf8_lossy(&out);
        for name in ["a\0", "a/b\0", "a/b/c\0", "bin/sh\0", "TRAILER!!!\0"] {
            assert!(text.contains(name), "{name}");
        }
    }

    #[test]
    fn quoted_words_survive_sh() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }
}
