//! The commit a `moneta` binary was built from, for the provenance every
//! output carries (`MONETA_COMMIT`; "unknown" outside a git checkout).

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
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=MONETA_COMMIT={commit}");
    // Rebuild when HEAD moves: HEAD itself (a branch switch) and the ref it
    // names (a commit on that branch).
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
        if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
            let common = git(&["rev-parse", "--git-common-dir"]).unwrap_or(dir.clone());
            println!("cargo:rerun-if-changed={common}/{reference}");
            println!("cargo:rerun-if-changed={common}/packed-refs");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
