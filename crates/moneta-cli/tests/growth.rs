//! Growth grants survive a killed monetad (crates/moneta-emu/src/growth.rs,
//! "Durable pending ranges"): a program under the shim preallocates a new
//! file and writes into it (direct, as growth grants: pending, unwritten in
//! the file system's eyes), another process outside the shim fsyncs the
//! file and runs sync(1) (neither settles anything), monetad is killed
//! with SIGKILL before anything settles, and after `moneta up` the file
//! holds exactly what was written (the oracle: the program's own bytes,
//! from a printed seed; zeros elsewhere), read by a plain process.
//! Needs root and loop devices; the mount is torn down even on failure.

mod common;

use common::{ok, root, Mounted};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Preallocates `path` (8 MiB), writes 4 KiB blocks of seeded random bytes
/// at seeded offsets, prints "written", and waits for its stdin to close
/// (its last close would settle).
const WRITER: &str = r#"
import os, random, sys
path, seed = sys.argv[1], int(sys.argv[2])
r = random.Random(seed)
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.posix_fallocate(fd, 0, 8 << 20)
for _ in range(300):
    os.pwrite(fd, r.randbytes(4096), r.randrange(0, 2048) * 4096)
print("written", flush=True)
sys.stdin.read()
"#;

/// The file the writer leaves: its writes replayed over zeros.
fn oracle(seed: u64) -> Vec<u8> {
    let out = ok(
        Command::new("python3")
            .args([
                "-c",
                "import random, sys\n\
                 r = random.Random(int(sys.argv[1])); b = bytearray(8 << 20)\n\
                 for _ in range(300):\n\
                 \x20   d = r.randbytes(4096); o = r.randrange(0, 2048) * 4096; b[o:o+4096] = d\n\
                 sys.stdout.write(bytes(b).hex())",
                &seed.to_string(),
            ])
            .output()
            .unwrap(),
        "the oracle",
    );
    (0..out.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&out[i..i + 2], 16).unwrap())
        .collect()
}

fn growth_data_synced_elsewhere_survives_a_killed_monetad(fs: &str) {
    assert!(root(), "needs root: it mounts a file system");
    let seed = std::env::var("GROWTH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| u64::from(std::process::id()) * 7919 % 1_000_003);
    eprintln!("GROWTH_SEED={seed} ({fs})");
    let m = Mounted::up(&format!("growth-{fs}"), fs, "320M");
    let file = m.path("grown.dat");
    let mut writer = m
        .run(
            "python3",
            &["-c", WRITER, file.to_str().unwrap(), &seed.to_string()],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(writer.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "written", "the writer did not finish");
    let stats = m.stats();
    let files = &stats["files"];
    assert!(
        files["growth_bytes"].as_u64().unwrap() > 0,
        "nothing was written as a growth grant: {files}"
    );
    // A kernel-only fsync from another process, and sync(1): the data
    // must be durable though neither settles it.
    ok(
        Command::new("python3")
            .args([
                "-c",
                "import os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); os.fsync(fd)",
                file.to_str().unwrap(),
            ])
            .output()
            .unwrap(),
        "fsync from another process",
    );
    ok(Command::new("sync").output().unwrap(), "sync");
    let settled = m.stats()["files"]["growth_settled_bytes"].as_u64().unwrap();
    assert_eq!(
        settled, 0,
        "something settled before the kill: the test would not test recovery"
    );
    m.kill_daemon();
    // The writer's stdin closes: it exits (its close reaches no daemon).
    drop(writer.stdin.take());
    let _ = writer.wait();
    m.up_again();
    let want = oracle(seed);
    let got = std::fs::read(&file).unwrap();
    assert_eq!(got.len(), want.len(), "size after recovery");
    if let Some(at) = (0..want.len()).find(|&i| got[i] != want[i]) {
        let zeros = (0..want.len())
            .filter(|&i| want[i] != 0 && got[i] == 0)
            .count();
        panic!(
            "GROWTH_SEED={seed}: after monetad was killed and brought up again, byte {at} is \
             {} where the program wrote {} ({zeros} written bytes read as zeros)",
            got[at], want[at]
        );
    }
    let log = std::fs::read_to_string(format!(
        "/run/moneta/{}/monetad.log",
        m.mount.to_string_lossy().replace('/', "_")
    ))
    .unwrap_or_default();
    let mut out = std::io::stderr();
    for l in log.lines().filter(|l| l.contains("growth journal")) {
        let _ = writeln!(out, "{l}");
    }
}

#[test]
fn growth_on_xfs_survives_a_killed_monetad() {
    growth_data_synced_elsewhere_survives_a_killed_monetad("xfs");
}

#[test]
fn growth_on_ext4_survives_a_killed_monetad() {
    growth_data_synced_elsewhere_survives_a_killed_monetad("ext4");
}
