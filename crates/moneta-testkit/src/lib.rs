//! What a test needs from the machine, checked one way (docs/src/design/
//! testing.md, "A test that needs root or a tool fails without it").
//!
//! A test that needs root (mounts, loop devices, network namespaces) or a
//! program (`fio`, `gcc`, `nbdkit`, …) asks here first. When the machine
//! lacks it, the test *fails*, with a message naming what is missing and
//! how to get it (`make setup` installs every tool; CI runs as root), so a
//! test never passes by doing nothing. A developer without root may set
//! [`SKIP_ENV`]`=1` to have such tests print `SKIPPED: …` to stderr and
//! return instead; CI never sets it.
//!
//! ```ignore
//! if !moneta_testkit::require_root("it mounts a file system") {
//!     return; // only with MONETA_TEST_SKIP_UNAVAILABLE=1
//! }
//! ```
//!
//! A dev-dependency crate rather than a file each test includes: one copy,
//! compiled once, and usable from every crate's tests, benches and
//! `common/` modules alike.

use std::io::Write;
use std::path::Path;

/// The opt-out: `MONETA_TEST_SKIP_UNAVAILABLE=1` turns a missing
/// requirement into a printed skip. Any other value (or none) fails.
pub const SKIP_ENV: &str = "MONETA_TEST_SKIP_UNAVAILABLE";

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `tool` is an executable file on `PATH` (or, given with a `/`,
/// at that path).
pub fn have_tool(tool: &str) -> bool {
    if tool.contains('/') {
        return executable(Path::new(tool));
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| executable(&dir.join(tool))))
        .unwrap_or(false)
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// True when running as root. Otherwise the test fails with "needs root:
/// `why`", or, with [`SKIP_ENV`]`=1`, prints the skip and returns false.
#[track_caller]
pub fn require_root(why: &str) -> bool {
    is_root() || unavailable(&format!("needs root: {why}"), "run the tests as root")
}

/// True when `tool` is installed. Otherwise the test fails naming the tool
/// and `why` it is needed, or, with [`SKIP_ENV`]`=1`, prints the skip and
/// returns false.
#[track_caller]
pub fn require_tool(tool: &str, why: &str) -> bool {
    have_tool(tool)
        || unavailable(
            &format!("needs `{tool}` ({why}), which is not installed"),
            "`make setup` installs it",
        )
}

/// A requirement the machine does not meet, found some other way than the
/// checks above (a capability the kernel refused, say): fails, or skips
/// with [`SKIP_ENV`]`=1`. Returns false (the test should return).
#[track_caller]
pub fn unavailable(what: &str, remedy: &str) -> bool {
    if skipping_allowed() {
        // Straight to stderr: the harness captures eprintln! of passing
        // tests, and a skip must not look like a silent pass.
        let _ = writeln!(std::io::stderr(), "SKIPPED: {what} ({SKIP_ENV}=1)");
        false
    } else {
        panic!("{what}: {remedy}, or set {SKIP_ENV}=1 to skip such tests (CI never does)");
    }
}

/// Whether the opt-out is set (to exactly `1`).
pub fn skipping_allowed() -> bool {
    std::env::var_os(SKIP_ENV).is_some_and(|v| v == "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_are_found_on_path_and_by_path() {
        assert!(have_tool("sh"));
        assert!(have_tool("/bin/sh"));
        assert!(!have_tool("moneta-no-such-tool"));
        assert!(!have_tool("/nonexistent/sh"));
    }

    // One test touches the environment (tests run in parallel threads).
    #[test]
    fn a_missing_tool_fails_unless_skipping_is_asked_for() {
        std::env::remove_var(SKIP_ENV);
        let failed = std::panic::catch_unwind(|| require_tool("moneta-no-such-tool", "a test"));
        let message = failed.unwrap_err();
        let message = message.downcast_ref::<String>().unwrap();
        assert!(message.contains("moneta-no-such-tool"), "{message}");
        assert!(message.contains(SKIP_ENV), "{message}");
        std::env::set_var(SKIP_ENV, "yes");
        assert!(
            std::panic::catch_unwind(|| require_tool("moneta-no-such-tool", "a test")).is_err()
        );
        std::env::set_var(SKIP_ENV, "1");
        assert!(!require_tool("moneta-no-such-tool", "a test"));
        assert!(require_tool("sh", "a test"));
        std::env::remove_var(SKIP_ENV);
    }
}
