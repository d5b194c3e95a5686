//! monetad's log lines, rate-limited and bounded in size (issue 39: a flood
//! of connections at the descriptor limit once logged "accept: Too many
//! open files" at ~23 MB/s, on a SAN node under `/run`, beside its dirty
//! maps). The daemon writes its log to stderr (`moneta up` and `san up`
//! redirect it to a file); every line that an outside party can trigger
//! goes through a [`LogLimit`].
//!
//! Each limiter lets [`BURST`] lines through per [`WINDOW`], counts the
//! rest, and says how many it dropped with the next line it lets through;
//! all limiters together stop at [`MAX_LOG_BYTES`] for the process's
//! lifetime, with one last line saying so. A flood therefore costs at most
//! a few hundred bytes a second and never more than the cap.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines per window one limiter lets through.
pub const BURST: u32 = 5;
/// The window.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Bytes all limiters of the process may write, in total.
pub const MAX_LOG_BYTES: u64 = 4 << 20;

static WRITTEN: AtomicU64 = AtomicU64::new(0);

struct Window {
    started: Option<Instant>,
    passed: u32,
    dropped: u64,
}

/// One kind of log line (`accept`, `refused`, ...).
pub struct LogLimit {
    window: Mutex<Window>,
}

impl Default for LogLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl LogLimit {
    pub const fn new() -> LogLimit {
        LogLimit {
            window: Mutex::new(Window {
                started: None,
                passed: 0,
                dropped: 0,
            }),
        }
    }

    /// Log `line` (made only if it is let through), or count it.
    /// Returns whether it was written.
    pub fn log(&self, line: impl FnOnce() -> String) -> bool {
        let now = Instant::now();
        let dropped = {
            let mut w = self.window.lock().unwrap_or_else(|p| p.into_inner());
            if w.started.is_none_or(|t| now.duration_since(t) >= WINDOW) {
                w.started = Some(now);
                w.passed = 0;
            }
            if w.passed >= BURST {
                w.dropped += 1;
                return false;
            }
            w.passed += 1;
            std::mem::take(&mut w.dropped)
        };
        let mut text = line();
        if dropped > 0 {
            text.push_str(&format!(
                " ({dropped} more like it in the last {} s not logged)",
                WINDOW.as_secs()
            ));
        }
        text.push('\n');
        write_bounded(&text)
    }
}

/// Write to stderr within the process's [`MAX_LOG_BYTES`].
fn write_bounded(text: &str) -> bool {
    let len = text.len() as u64;
    let before = WRITTEN.fetch_add(len, Ordering::Relaxed);
    if before + len <= MAX_LOG_BYTES {
        eprint!("{text}");
        return true;
    }
    if before <= MAX_LOG_BYTES {
        eprintln!(
            "monetad: the log reached {MAX_LOG_BYTES} bytes; rate-limited lines are no longer written"
        );
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_passes_a_burst_per_window() {
        let limit = LogLimit::new();
        let passed = (0..10_000)
            .filter(|i| limit.log(|| format!("test line {i}")))
            .count();
        assert_eq!(passed, BURST as usize);
    }
}
