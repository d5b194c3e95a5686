//! The fio ioengine for Moneta (`fio-engine/`, README "A fio engine for
//! Moneta") on a real mount: fio's own verify at QD1 and QD32 with the
//! daemon's counters of the run showing the device served the requests
//! (not the page cache), a clear error above the channel's tags, and the
//! file's final bytes against a plain kernel run of the same job and seed.

mod common;

use common::{moneta, ok, Mounted};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FILE: &str = "16m";
const FILE_BYTES: u64 = 16 << 20;
const BLOCKS: u64 = FILE_BYTES / 4096;

/// The engine `make build` (fio-engine/Makefile) puts next to `moneta`.
fn engine() -> PathBuf {
    let e = Path::new(env!("CARGO_BIN_EXE_moneta")).with_file_name("libmoneta_fio.so");
    assert!(
        e.exists(),
        "{}: no fio engine (make -C fio-engine builds it; make setup fetches fio's source)",
        e.display()
    );
    e
}

/// fio through the engine on `m`'s file `name`, its requests counted under
/// run id `run`.
fn fio_engine(m: &Mounted, run: &str, name: &str, args: &[&str]) -> Output {
    Command::new("fio")
        .env("MONETA_RUN_ID", run)
        .arg(format!("--name={run}"))
        .arg(format!("--ioengine=external:{}", engine().display()))
        .arg(format!("--moneta_socket={}", m.socket()))
        .arg(format!("--filename={}", m.path(name).display()))
        .arg(format!("--size={FILE}"))
        .args(["--bs=4k", "--verify_state_save=0"])
        .args(args)
        .output()
        .expect("fio (make setup installs it)")
}

/// fio with one of the kernel's engines, not through Moneta.
fn fio_kernel(path: &Path, engine: &str, args: &[&str]) -> Output {
    Command::new("fio")
        .arg("--name=kernel")
        .arg(format!("--ioengine={engine}"))
        .arg(format!("--filename={}", path.display()))
        .arg(format!("--size={FILE}"))
        .args(["--bs=4k", "--verify_state_save=0"])
        .args(args)
        .output()
        .expect("fio (make setup installs it)")
}

/// The daemon's counters of run `run`: (reads, writes, refused).
fn run_counts(m: &Mounted, run: &str) -> (u64, u64, u64) {
    let out = ok(
        moneta()
            .args(["stats", "--json", "--daemon", &m.socket(), "--run", run])
            .output()
            .unwrap(),
        "moneta stats --run",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &v["client"];
    (
        c["read"]["requests"].as_u64().unwrap_or(0),
        c["write"]["requests"].as_u64().unwrap_or(0),
        c["refused"].as_u64().unwrap_or(0),
    )
}

/// Lay out `path` through the kernel (written, fsynced: extents the device
/// serves), with seeded contents.
fn lay_out(path: &Path) {
    ok(
        fio_kernel(
            path,
            "psync",
            &[
                "--rw=write",
                "--randseed=7",
                "--scramble_buffers=0",
                "--end_fsync=1",
            ],
        ),
        "laying the file out",
    );
}

#[test]
fn fio_verifies_through_the_engine_on_the_device_at_qd1_and_qd32() {
    if !moneta_testkit::require_root("it mounts a file system") {
        return;
    }
    let m = Mounted::up("fioeng-verify", "xfs", "512M");
    lay_out(&m.path("f"));
    for qd in [1u32, 32] {
        let run = format!("fioeng-verify-{}-qd{qd}", std::process::id());
        let depth = format!("--iodepth={qd}");
        let o = fio_engine(
            &m,
            &run,
            "f",
            &[
                "--rw=randwrite",
                &depth,
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
            ],
        );
        let text = ok(o, &format!("fio through the engine at QD{qd}"));
        assert!(text.contains("err= 0"), "{text}");
        let (reads, writes, refused) = run_counts(&m, &run);
        eprintln!("QD{qd}: the device served {writes} writes and {reads} verify reads");
        // Every write and every verify read of the job is a device request:
        // none went through the page cache.
        assert!(
            writes >= BLOCKS,
            "QD{qd}: {writes} device writes of {BLOCKS}"
        );
        assert!(reads >= BLOCKS, "QD{qd}: {reads} device reads of {BLOCKS}");
        assert_eq!(refused, 0, "QD{qd}: the device refused requests");
    }
}

#[test]
fn a_queue_depth_above_the_channels_tags_is_a_clear_error() {
    if !moneta_testkit::require_root("it mounts a file system") {
        return;
    }
    let m = Mounted::up("fioeng-depth", "xfs", "512M");
    lay_out(&m.path("f"));
    // 4 KiB takes one of the 64 tags; 64 KiB four.
    for (bs, depth, most) in [
        ("--bs=4k", "--iodepth=65", "64"),
        ("--bs=64k", "--iodepth=17", "16"),
    ] {
        let o = fio_engine(&m, "fioeng-depth", "f", &["--rw=randread", bs, depth]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{depth} {bs} ran: {err}");
        assert!(
            err.contains("does not fit the channel") && err.contains(&format!("--iodepth={most}")),
            "{depth} {bs}: {err}"
        );
    }
    let o = fio_engine(
        &m,
        "fioeng-depth-ok",
        "f",
        &["--rw=randread", "--bs=64k", "--iodepth=16"],
    );
    ok(o, "--bs=64k --iodepth=16 (64 tags)");
}

/// The oracle for the engine's writes: the same seeded job, once through
/// the engine at QD32 and once through the kernel's libaio engine at QD32
/// on another file, leaves the same bytes (each block written once, with
/// fio's seeded contents; fio's order of offsets and contents depends on
/// the depth, not on the engine).
#[test]
fn the_engines_writes_leave_the_bytes_a_kernel_run_of_the_same_job_leaves() {
    if !moneta_testkit::require_root("it mounts a file system") {
        return;
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        % 1_000_000_007;
    eprintln!("seed {seed} (fio --randseed)");
    let m = Mounted::up("fioeng-oracle", "ext4", "256M");
    lay_out(&m.path("engine"));
    let kernel = std::env::temp_dir().join(format!("fioeng-oracle-{}", std::process::id()));
    let job = [
        "--rw=randwrite".to_string(),
        format!("--randseed={seed}"),
        "--refill_buffers".to_string(),
        "--scramble_buffers=0".to_string(),
        "--number_ios=2048".to_string(),
        "--iodepth=32".to_string(),
    ];
    let job: Vec<&str> = job.iter().map(String::as_str).collect();
    let run = format!("fioeng-oracle-{}", std::process::id());
    ok(fio_engine(&m, &run, "engine", &job), "the engine's run");
    let (_, writes, _) = run_counts(&m, &run);
    assert!(writes >= 2048, "{writes} device writes of 2048");
    // The kernel's file starts as the engine's did: laid out the same way.
    lay_out(&kernel);
    let o = fio_kernel(&kernel, "libaio", &job);
    let kernel_bytes = std::fs::read(&kernel);
    let _ = std::fs::remove_file(&kernel);
    ok(o, "the kernel's run");
    let kernel_bytes = kernel_bytes.unwrap();
    // The engine's file through the kernel: moneta_file_close dropped the
    // stale cached pages, so read(2) sees the device.
    let engine_bytes = std::fs::read(m.path("engine")).unwrap();
    assert_eq!(engine_bytes.len(), kernel_bytes.len());
    if let Some(i) = (0..engine_bytes.len()).find(|&i| engine_bytes[i] != kernel_bytes[i]) {
        panic!(
            "seed {seed}: the files differ first at byte {i} (block {})",
            i / 4096
        );
    }
}

/// A monetad on an image of its own (no file system), stopped and its
/// files removed on drop.
struct Daemon {
    child: std::process::Child,
    image: PathBuf,
    socket: PathBuf,
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        let dir = std::env::temp_dir();
        let image = dir.join(format!("fioeng-{name}-{}.img", std::process::id()));
        let socket = dir.join(format!("fioeng-{name}-{}.sock", std::process::id()));
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(256 << 20))
            .unwrap();
        let child = moneta()
            .args(["serve", "--preset", "moneta-d", "--set"])
            .arg("device.capacity_bytes=268435456")
            .arg("--image")
            .arg(&image)
            .arg("--socket")
            .arg(&socket)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            image,
            socket,
        };
        for _ in 0..200 {
            if std::os::unix::net::UnixStream::connect(&d.socket).is_ok() {
                return d;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        panic!("monetad did not answer on {}", d.socket.display());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// The raw device (--moneta_raw=1): fio's offsets are device addresses, on
/// a daemon without a file system; verify at QD32, every request the
/// device's.
#[test]
fn fio_verifies_on_the_raw_device() {
    let d = Daemon::start("raw");
    let run = format!("fioeng-raw-{}", std::process::id());
    let o = Command::new("fio")
        .env("MONETA_RUN_ID", &run)
        .arg(format!("--name={run}"))
        .arg(format!("--ioengine=external:{}", engine().display()))
        .arg(format!("--moneta_socket={}", d.socket.display()))
        .args([
            "--moneta_raw=1",
            "--filename=/dev/null",
            "--rw=randwrite",
            "--bs=4k",
            "--iodepth=32",
            "--size=16m",
            "--verify=crc32c",
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
        ])
        .output()
        .expect("fio (make setup installs it)");
    let text = ok(o, "fio on the raw device");
    assert!(text.contains("err= 0"), "{text}");
    let out = ok(
        moneta()
            .args(["stats", "--json", "--daemon"])
            .arg(&d.socket)
            .args(["--run", &run])
            .output()
            .unwrap(),
        "moneta stats --run",
    );
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let c = &v["client"];
    let (reads, writes) = (
        c["read"]["requests"].as_u64().unwrap_or(0),
        c["write"]["requests"].as_u64().unwrap_or(0),
    );
    assert!(
        writes >= BLOCKS && reads >= BLOCKS,
        "{reads} reads, {writes} writes: {c}"
    );
}
