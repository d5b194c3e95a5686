//! The C ABI as a C user meets it: `include/nvmm.h` compiles as C and C++,
//! and `examples/nvmm/nvmm_example.c`, linked against the real
//! `libnvmm.so`, maps a region 8× its DRAM budget, syncs, rolls back,
//! allocates, sets permissions and reopens. Needs gcc (and g++); without
//! them the test says it was skipped.

use nvmm::testkit::{fast_dir, TempPath};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => workspace_root().join(dir),
        None => workspace_root().join("target"),
    }
}

/// Whether `tool` is installed: fails the test if not, unless skipping was
/// asked for (`moneta_testkit`).
fn have(tool: &str) -> bool {
    moneta_testkit::require_tool(tool, "the C ABI test compiles the C example")
}

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn c_example_runs_against_libnvmm_so() {
    if !have("gcc") || !have("g++") {
        return;
    }
    let root = workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo)
        .current_dir(&root)
        .args(["build", "--release", "-p", "libnvmm"]));
    let lib = target_dir().join("release");
    assert!(
        lib.join("libnvmm.so").is_file(),
        "no libnvmm.so in {}",
        lib.display()
    );
    // The header as C++ (the example itself is C: void * converts).
    let cpp = TempPath::new(fast_dir(), "header.cpp");
    std::fs::write(
        cpp.path(),
        "#include <nvmm.h>\nint main() { nvmm_options_t o{}; (void)o; return nvmm_open(\"\", 0, 0) ? 1 : 0; }\n",
    )
    .unwrap();
    run(Command::new("g++")
        .args([
            "-x",
            "c++",
            "-fsyntax-only",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-I",
        ])
        .arg(root.join("include"))
        .arg(cpp.path()));
    let exe = target_dir().join("nvmm_example");
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/nvmm/nvmm_example.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lnvmm")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&exe));
    let file = TempPath::new(fast_dir(), "c-example");
    let out = run(Command::new(&exe)
        .arg(file.path())
        .env_remove("LD_LIBRARY_PATH"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().last(), Some("ok"), "{stdout}");
    // And the C GUPS program builds and agrees with itself across modes.
    let gups = target_dir().join("nvmm_gups_c_test");
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("examples/nvmm/gups.c"))
        .arg("-L")
        .arg(&lib)
        .arg("-lnvmm")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .arg("-o")
        .arg(&gups));
    let mut sums = vec![];
    for mode in ["nvmm", "mmap"] {
        let f = TempPath::new(fast_dir(), "c-gups");
        let out = run(Command::new(&gups)
            .args([
                mode,
                &f.path().display().to_string(),
                "4194304",
                "1048576",
                "3000",
                "9",
                "gups",
            ])
            .env_remove("LD_LIBRARY_PATH"));
        let line = String::from_utf8_lossy(&out.stdout).to_string();
        sums.push(
            line.split_whitespace()
                .find(|kv| kv.starts_with("checksum="))
                .map(str::to_string),
        );
    }
    assert!(
        sums[0].is_some() && sums[0] == sums[1],
        "checksums differ: {sums:?}"
    );
}
