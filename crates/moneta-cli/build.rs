//! The commit a `moneta` binary was built from, for the provenance every
//! output carries (`MONETA_COMMIT`; "unknown" outside a git checkout). A
//! tree with uncommitted changes to tracked files is marked `-dirty`, as
//! `git describe --dirty` does: such a binary is not the commit it names.

use std::process::Command;

fn main() {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let mut commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty && commit != "unknown" {
        commit.push_str("-dirty");
    }
    println!("cargo:rustc-env=MONETA_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (a branch switch) and the ref it
    // names (a commit on that branch), as a loose file or in packed-refs.
    // Only files that exist are named: cargo counts a missing one as
    // changed, so naming an absent packed-refs rebuilt the CLI every time.
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or(dir.clone());
            for file in [
                format!("{common}/{reference}"),
                format!("{common}/packed-refs"),
            ] {
                if std::path::Path::new(&file).exists() {
                    println!("cargo:rerun-if-changed={file}");
                }
            }
        }
    }
    // And when a tracked file changes, so that `-dirty` comes and goes with
    // the tree (cargo scans a directory recursively).
    for path in [
        "../../crates",
        "../../fio-engine",
        "../../Cargo.toml",
        "../../Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
