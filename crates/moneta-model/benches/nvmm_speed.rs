//! How fast the NVMM model simulates (issue 13, item 8; issue 24): GUPS on
//! NVMM with a table 1/0.9 of the DRAM cache (a ~90% hit rate), 8
//! simulated threads, on one core. Target: at least 20 M simulated memory
//! accesses per CPU-second. The run's CPU time is the thread's time on a
//! CPU (Linux `/proc/thread-self/schedstat`); the wall-clock rate is
//! printed too, and on a loaded machine it also counts waiting for a CPU.
//!
//! `cargo bench -p moneta-model --bench nvmm_speed` (add `-- --smoke` for
//! the short CI run).

use moneta_model::nvmm::experiments::standard_workload;
use moneta_model::nvmm::system::{run, SystemKind};
use moneta_model::nvmm::workload::WorkloadKind;
use moneta_model::nvmm::NvmmConfig;
use std::time::Instant;

const TARGET_PER_S: f64 = 20e6;
const THREADS: u32 = 8;

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let accesses: u64 = if smoke { 1_000_000 } else { 20_000_000 };
    let seed = 1;
    let config = NvmmConfig::preset("nvmm-mlc").expect("preset");
    let workload = standard_workload(
        &config,
        WorkloadKind::Gups,
        THREADS,
        Some(accesses),
        1.0 / 0.9,
    )
    .expect("workload");
    println!(
        "nvmm_speed: GUPS, {THREADS} threads, table {} MB over a {} MB DRAM cache, {accesses} \
         accesses, preset {}, seed {seed}",
        workload.footprint_bytes >> 20,
        config.dram.capacity_bytes >> 20,
        config.name
    );
    let cpu_start = cpu_seconds();
    let start = Instant::now();
    let r = run(&config, SystemKind::Nvmm, &workload, seed).expect("run");
    let wall_s = start.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds().zip(cpu_start).map(|(end, start)| end - start);
    let per_wall_s = r.accesses as f64 / wall_s;
    println!(
        "simulated {} accesses in {:.3} s of model time: hit rate {:.3}, {} flash reads, \
         {} programs, {} erases",
        r.accesses,
        r.elapsed_ns as f64 / 1e9,
        r.hit_rate,
        r.flash_reads,
        r.flash_programs,
        r.flash_erases
    );
    println!(
        "wall clock: {:.2} M accesses per second ({:.3} s, set-up included)",
        per_wall_s / 1e6,
        wall_s
    );
    match cpu_s {
        Some(cpu_s) => {
            let per_cpu_s = r.accesses as f64 / cpu_s;
            println!(
                "speed: {:.2} M accesses per CPU-second ({:.3} s of CPU, {:.0} ns each, set-up \
                 included); target {:.0} M: {}",
                per_cpu_s / 1e6,
                cpu_s,
                cpu_s * 1e9 / r.accesses as f64,
                TARGET_PER_S / 1e6,
                if per_cpu_s >= TARGET_PER_S {
                    "met"
                } else {
                    "NOT met"
                }
            );
        }
        None => {
            println!("speed: no CPU time here (/proc/thread-self/schedstat); see the wall clock")
        }
    }
}

/// This thread's time on a CPU so far, in seconds (Linux schedstat: the
/// first field is nanoseconds on a CPU), if the system tells.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
    Some(ns as f64 / 1e9)
}
