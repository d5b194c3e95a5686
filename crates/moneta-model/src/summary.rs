//! The machine-readable summary of one simulated point: what `moneta sim`
//! prints as JSON/CSV/table and what calibration compares with the papers.

use crate::config::Config;
use crate::experiment::{run, RunResult};
use crate::workload::{OpMix, RunLimit, Workload};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct PointSummary {
    pub preset: String,
    pub stack: String,
    pub op: String,
    pub size_bytes: u64,
    pub threads: u32,
    pub seed: u64,
    pub ops: u64,
    pub elapsed_ns: u64,
    pub bandwidth_mb_per_s: f64,
    pub iops: f64,
    pub latency_us_mean: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub power_w: f64,
    pub energy_nj_per_op: f64,
    pub cpu_utilization: f64,
    pub soft_misses: u64,
    pub hard_misses: u64,
    pub config: serde_json::Value,
}

impl PointSummary {
    pub fn new(
        config: &Config,
        op: OpMix,
        size_bytes: u64,
        threads: u32,
        seed: u64,
        r: &RunResult,
    ) -> Self {
        let power = crate::device::power_of_run(config, r);
        let cores_ns = config.host.cores as f64 * r.elapsed_ns as f64;
        PointSummary {
            preset: config.name.clone(),
            stack: config.host.stack.name().to_string(),
            op: op.name().to_string(),
            size_bytes,
            threads,
            seed,
            ops: r.ops,
            elapsed_ns: r.elapsed_ns,
            bandwidth_mb_per_s: r.bandwidth_mb_per_s(),
            iops: r.iops(),
            latency_us_mean: r.latency.mean_ns() / 1e3,
            latency_us_p50: r.latency.percentile_ns(0.5) / 1e3,
            latency_us_p99: r.latency.percentile_ns(0.99) / 1e3,
            power_w: power.0,
            energy_nj_per_op: power.1,
            cpu_utilization: if cores_ns > 0.0 {
                r.cpu_busy_ns as f64 / cores_ns
            } else {
                0.0
            },
            soft_misses: r.soft_misses,
            hard_misses: r.hard_misses,
            config: config.to_json(),
        }
    }
}

/// Region the XDD workloads touch by default: the whole device, capped at
/// 16 GB (as the papers' random tests; start-gap tables stay small).
pub fn default_region_bytes(config: &Config) -> u64 {
    config.device.capacity_bytes.min(16 << 30)
}

/// Run one XDD point.
pub fn xdd_point(
    config: &Config,
    op: OpMix,
    size_bytes: u64,
    threads: u32,
    limit: RunLimit,
    seed: u64,
) -> Result<PointSummary, String> {
    let w = Workload::xdd(
        op,
        size_bytes,
        threads,
        default_region_bytes(config),
        limit,
        seed,
    );
    let r = run(config, &w)?;
    Ok(PointSummary::new(config, op, size_bytes, threads, seed, &r))
}
