//! Compiles the block-free tracepoint programs (bpf/frees.bpf.c) with clang
//! for the BPF target. Without clang the daemon is built without them and
//! says so when it starts (`moneta status`: the guard of each mount); `make
//! setup` installs clang.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(moneta_bpf)");
    println!("cargo:rerun-if-changed=bpf/frees.bpf.c");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let clang = std::env::var("CLANG").unwrap_or_else(|_| "clang".into());
    // The asm/ headers linux/bpf.h includes live under the host's triplet.
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let status = Command::new(&clang)
        .args(["-O2", "-g", "-target", "bpf", "-I", &multiarch, "-c"])
        .arg("bpf/frees.bpf.c")
        .arg("-o")
        .arg(out.join("frees.bpf.o"))
        .status();
    match status {
        Ok(s) if s.success() => println!("cargo:rustc-cfg=moneta_bpf"),
        Ok(s) => println!("cargo:warning=clang failed on bpf/frees.bpf.c ({s}): monetad is built without the block-free tracepoints"),
        Err(e) => println!("cargo:warning=no clang ({e}): monetad is built without the block-free tracepoints (make setup installs it)"),
    }
}
