//! SQLite in an NVMM region against the model's prediction and against
//! SQLite on a plain file (issue 24). The same transactions (inserts of
//! 1–50 rows of 200 bytes with an index, a few updates, a progress row;
//! `tests/common/sqlite.rs`) run:
//!
//! 1. on a plain file on the root file system (the SSD baseline: SQLite's
//!    rollback journal, synchronous=FULL, the page cache);
//! 2. on plain memory (the all-DRAM time: SQLite's own CPU time);
//! 3. on libnvmm with the model's flash on a virtual clock: the flash time
//!    the model charges (misses, write-backs, syncs), without waiting;
//! 4. on libnvmm with the model's flash on the wall clock (the emulation).
//!
//! The model's prediction is (2) + (3): SQLite's CPU time plus the charged
//! flash time. The verdict says whether the library kept up with it (within
//! 10%) on this machine: "faithful" or "not faithful: why".
//!
//! `cargo bench -p libnvmm --bench sqlite [-- --smoke] [--txns N] [--preset P]`

#[path = "../tests/common/sqlite.rs"]
#[allow(dead_code)]
mod sqlite;

use moneta_model::kernel::VirtualClock;
use nvmm::{ModelTiming, Nvmm, Options, Stats};
use rusqlite::Connection;
use sqlite::{checkpoint, open_in, open_on, transaction, SCHEMA};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

const REGION: u64 = 32 << 20;
const DRAM: u64 = 8 << 20;

fn run(c: &Connection, txns: u64, mut after: impl FnMut(&Connection)) -> f64 {
    c.execute_batch(SCHEMA).unwrap();
    let t0 = Instant::now();
    for txn in 1..=txns {
        transaction(c, txn);
        after(c);
    }
    t0.elapsed().as_secs_f64()
}

fn dir() -> PathBuf {
    let d = PathBuf::from(std::env::var("NVMM_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into()));
    d.join(format!("nvmm-sqlite-bench-{}", std::process::id()))
}

fn on_libnvmm(path: &PathBuf, preset: &str, virtual_clock: bool, txns: u64) -> (f64, u64, Stats) {
    let _ = std::fs::remove_file(path);
    let mut o = Options::new(DRAM);
    o.timing = Box::new(ModelTiming::preset(preset).unwrap());
    if virtual_clock {
        o.clock = Some(Arc::new(VirtualClock::new()));
    }
    let region = Nvmm::open_with(path, REGION, o).unwrap();
    let secs = {
        let c = open_in(&region);
        run(&c, txns, |c| {
            checkpoint(&region, c);
        })
    };
    let charged = region.clock_ns();
    let stats = region.stats();
    drop(region);
    let _ = std::fs::remove_file(path);
    (secs, charged, stats)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let value = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let smoke = args.iter().any(|a| a == "--smoke");
    let txns: u64 = value("--txns")
        .and_then(|s| s.parse().ok())
        .unwrap_or(if smoke { 200 } else { 2000 });
    let preset = value("--preset").unwrap_or_else(|| "nvmm-slc".into());
    let dir = dir();
    std::fs::create_dir_all(&dir).unwrap();

    // 1. SQLite on a plain file.
    let db = dir.join("baseline.db");
    let file_secs = {
        let c = Connection::open(&db).unwrap();
        c.execute_batch("PRAGMA journal_mode=DELETE; PRAGMA synchronous=FULL;")
            .unwrap();
        run(&c, txns, |_| {})
    };
    let _ = std::fs::remove_file(&db);
    // 2. Plain memory.
    let mut buf = vec![0u8; (REGION - sqlite::HEADER_BYTES) as usize];
    // SAFETY: the buffer outlives the connection, which is dropped first.
    let dram_secs = {
        let c = unsafe { open_on(buf.as_mut_ptr(), 0, buf.len() as u64) };
        run(&c, txns, |_| {})
    };
    drop(buf);
    // 3. The model's charged flash time; 4. the emulation.
    let region = dir.join("region.nvmm");
    let (_, charged_ns, model_stats) = on_libnvmm(&region, &preset, true, txns);
    let (lib_secs, _, lib_stats) = on_libnvmm(&region, &preset, false, txns);
    let _ = std::fs::remove_dir(&dir);

    let predicted = dram_secs + charged_ns as f64 / 1e9;
    let ratio = lib_secs / predicted;
    let faithful = ratio <= 1.10;
    let per_miss_us = if lib_stats.misses > 0 {
        (lib_secs - predicted).max(0.0) * 1e6 / (lib_stats.misses + lib_stats.syncs) as f64
    } else {
        0.0
    };
    let verdict = if faithful {
        "faithful".to_string()
    } else {
        format!(
            "not faithful: the library took {ratio:.2}x the model's prediction; its own time \
             (faults, write-protect round trips, log IO and fdatasync per sync: {per_miss_us:.0} µs \
             per miss or sync beyond the model) exceeds what {preset}'s flash leaves room for on \
             this machine"
        )
    };
    let tps = |s: f64| txns as f64 / s;
    println!(
        "SQLite, {txns} transactions, region {} MB over {} MB of DRAM, preset {preset}",
        REGION >> 20,
        DRAM >> 20
    );
    println!(
        "  plain file (journal, synchronous=FULL): {:>10.0} txn/s",
        tps(file_secs)
    );
    println!(
        "  plain memory (SQLite's CPU time):       {:>10.0} txn/s",
        tps(dram_secs)
    );
    println!(
        "  model prediction (memory + {:.3} s of charged flash: {} misses, {} write-backs, {} syncs): {:>10.0} txn/s",
        charged_ns as f64 / 1e9,
        model_stats.misses,
        model_stats.write_backs,
        model_stats.syncs,
        tps(predicted)
    );
    println!(
        "  libnvmm on the model's flash:           {:>10.0} txn/s ({} misses)",
        tps(lib_secs),
        lib_stats.misses
    );
    println!(
        "  libnvmm / prediction: {ratio:.2}x time; libnvmm / plain file: {:.2}x throughput",
        file_secs / lib_secs
    );
    println!("  verdict: {verdict}");
    let json = serde_json::json!({
        "bench": "sqlite", "txns": txns, "preset": preset,
        "region_bytes": REGION, "dram_bytes": DRAM,
        "file_txn_per_s": tps(file_secs), "dram_txn_per_s": tps(dram_secs),
        "model_charged_flash_s": charged_ns as f64 / 1e9, "model_txn_per_s": tps(predicted),
        "libnvmm_txn_per_s": tps(lib_secs), "libnvmm_over_model_time": ratio,
        "faithful": faithful, "verdict": verdict,
    });
    println!("{json}");
}
