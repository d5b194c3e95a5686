//! What the tests, benchmarks and helper programs of libnvmm share: a
//! seeded generator (SplitMix64), a temporary file removed on drop, and the
//! deterministic write workload of the crash test (the child that is
//! killed and the parent that checks recovery compute the same writes).

use std::path::{Path, PathBuf};

/// SplitMix64: small, seedable, good enough for workloads.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        moneta_model::kernel::rng::splitmix64(&mut self.0)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// A seed from the environment variable `var` if set, else from the clock.
pub fn seed_from_env(var: &str) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        })
}

/// A path in `dir` removed (if present) when created and when dropped.
pub struct TempPath(PathBuf);

impl TempPath {
    pub fn new(dir: impl AsRef<Path>, name: &str) -> TempPath {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = dir
            .as_ref()
            .join(format!("libnvmm-{name}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        TempPath(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        // Formatting files of processes killed while creating the log.
        let (Some(dir), Some(name)) = (self.0.parent(), self.0.file_name()) else {
            return;
        };
        let prefix = format!("{}.format-", name.to_string_lossy());
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }
}

/// Geometry of the crash test's region: 4 MB over 256 KB of DRAM, so that
/// every iteration evicts.
pub const CRASH_REGION_BYTES: u64 = 4 << 20;
pub const CRASH_DRAM_BYTES: u64 = 256 << 10;
pub const CRASH_WAYS: usize = 4;

/// The writes of crash-test iteration `k` (≥ 1): `(offset, bytes)`.
pub fn crash_iteration(seed: u64, k: u64) -> Vec<(u64, Vec<u8>)> {
    let mut rng = Rng::new(seed ^ k.wrapping_mul(0xA076_1D64_78BD_642F));
    let mut out = Vec::new();
    let n = 1 + rng.below(48);
    for _ in 0..n {
        if rng.below(16) == 0 {
            // A run across several blocks.
            let len = 8192 + rng.below(3 * 8192);
            let off = rng.below(CRASH_REGION_BYTES - len);
            let byte = rng.next_u64() as u8;
            out.push((off, vec![byte; len as usize]));
        } else {
            let off = rng.below(CRASH_REGION_BYTES / 8) * 8;
            out.push((off, rng.next_u64().to_le_bytes().to_vec()));
        }
    }
    out
}

/// A directory on memory (tmpfs) for fast tests, else the temp directory.
pub fn fast_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}
