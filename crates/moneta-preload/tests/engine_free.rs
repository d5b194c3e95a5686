//! The shim links no engine (issue 21; STYLE 14, "a client never needs the
//! daemon's engine to speak to it"): libmoneta_preload.so speaks to monetad
//! through `moneta-client` and `moneta-abi` only, so the device (`moneta-emu`)
//! must not be in it, whatever else the build includes. A whole-workspace
//! build is the case that matters: there Cargo unifies features across every
//! member, which once linked the whole engine into the shim.
//!
//! Two checks, each failing (never skipping) when its tool or artifact is
//! missing: the workspace's dependency graph (`cargo tree`, features as a
//! whole-workspace build unifies them) has no path from the shim to
//! moneta-emu, and the built library's symbol table (`nm`) has no
//! `moneta_emu::` symbol.

use std::path::PathBuf;
use std::process::{Command, Output};

/// The engine's package, and the path prefix of its symbols.
const ENGINE_PACKAGE: &str = "moneta-emu";
const ENGINE_SYMBOLS: &str = "moneta_emu::";

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e} (it is needed by this test)"));
    assert!(
        out.status.success(),
        "{command:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The shim as the build that ran this test made it: the test binary is
/// `<target>/<profile>/deps/engine_free-…`, the library
/// `<target>/<profile>/libmoneta_preload.so`.
fn built_shim() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lies in <target>/<profile>/deps");
    let shim = profile_dir.join("libmoneta_preload.so");
    assert!(
        shim.is_file(),
        "no {}: build the workspace first (`cargo build --release`, as `make test` does)",
        shim.display()
    );
    shim
}

/// Every package that depends on moneta-emu through normal dependencies,
/// with features unified as in `cargo build --workspace`.
#[test]
fn no_workspace_build_gives_the_shim_a_path_to_the_engine() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = run(Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["tree", "--workspace", "--edges", "normal", "--invert"])
        .arg(ENGINE_PACKAGE)
        .args(["--prefix", "none", "--no-dedupe"]));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(
        tree.lines().any(|l| l.starts_with(ENGINE_PACKAGE)),
        "cargo tree did not list {ENGINE_PACKAGE}:\n{tree}"
    );
    for client in ["moneta-preload ", "moneta-client "] {
        assert!(
            !tree.lines().any(|l| l.starts_with(client)),
            "{}reaches {ENGINE_PACKAGE} in a whole-workspace build:\n{tree}",
            client
        );
    }
}

#[test]
fn the_built_shim_has_no_engine_symbol() {
    let shim = built_shim();
    let out = run(Command::new("nm").arg("--demangle").arg(&shim));
    let symbols = String::from_utf8_lossy(&out.stdout);
    // A stripped library would pass vacuously: its own code must be there.
    assert!(
        symbols.contains("moneta_preload::"),
        "{} has no moneta_preload:: symbol: stripped, or not the shim",
        shim.display()
    );
    let engine: Vec<&str> = symbols
        .lines()
        .filter(|l| l.contains(ENGINE_SYMBOLS))
        .collect();
    assert!(
        engine.is_empty(),
        "{} links the engine: {} {ENGINE_SYMBOLS} symbols, e.g.\n{}",
        shim.display(),
        engine.len(),
        engine[..engine.len().min(10)].join("\n")
    );
}
