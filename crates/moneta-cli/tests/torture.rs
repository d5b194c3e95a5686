//! The randomized torture test of the direct path (issue 8,
//! `scripts/torture.py`), smoke size: four processes, two through the shim
//! and two plain, on XFS and on ext4, with a random seed printed for
//! reproduction; first a run with plain processes only, which proves the
//! checker's model right on this kernel. `make torture` runs the long mode.

mod common;

use common::{root, Mounted};
use std::process::Command;

fn torture(m: &Mounted, extra: &[&str]) {
    let o = Command::new("python3")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../scripts/torture.py"
        ))
        .args([
            "--mount",
            m.mount.to_str().unwrap(),
            "--workers",
            "4",
            "--ops",
            "60",
        ])
        .args(["--moneta", env!("CARGO_BIN_EXE_moneta"), "--timeout", "240"])
        .args(extra)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "torture failed:\n{out}");
}

#[test]
fn torture_smoke_on_xfs_and_ext4() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    for fs in ["xfs", "ext4"] {
        let m = Mounted::up(&format!("torture-{fs}"), fs, "512M");
        torture(&m, &["--plain"]);
        let before = m.device_requests();
        torture(&m, &[]);
        assert!(
            m.device_requests() > before,
            "{fs}: the shim workers never reached the device"
        );
    }
}
