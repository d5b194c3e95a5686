//! The machine-readable summary of one simulated point: what `moneta sim`
//! prints as JSON/CSV/table and what calibration compares with the papers.

use crate::breakdown::Breakdown;
use crate::config::Config;
use crate::device::power;
use crate::error::Error;
use crate::experiment::{run, RunResult};
use crate::workload::{OpMix, RunLimit, Workload};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct PointSummary {
    pub preset: String,
    pub stack: String,
    pub op: String,
    /// Fraction of reads (1 for read, 0 for write).
    pub read_fraction: f64,
    pub size_bytes: u64,
    pub pattern: String,
    pub region_bytes: u64,
    pub threads: u32,
    /// Requests each thread keeps in flight (1: synchronous).
    pub queue_depth: u32,
    pub seed: u64,
    pub ops: u64,
    pub elapsed_ns: u64,
    pub bandwidth_mb_per_s: f64,
    pub iops: f64,
    pub latency_us_mean: f64,
    pub latency_us_p50: f64,
    pub latency_us_p99: f64,
    pub latency_us_p99_9: f64,
    pub latency_us_max: f64,
    /// Where time goes (SPEC §2.1): mean µs per component; the values sum to
    /// `latency_us_mean` (within float rounding).
    pub breakdown_us: Breakdown,
    /// (latency µs, fraction of requests at or below it), for plots.
    #[serde(skip)]
    pub latency_cdf_us: Vec<(f64, f64)>,
    pub power_w: f64,
    pub energy_nj_per_op: f64,
    /// Average power of each device component (SPEC §1.9).
    pub power_components: Vec<ComponentWatts>,
    pub cpu_utilization: f64,
    pub soft_misses: u64,
    pub hard_misses: u64,
    pub config: serde_json::Value,
}

#[derive(Debug, Clone, Serialize)]
pub struct ComponentWatts {
    pub name: &'static str,
    pub average_w: f64,
}

impl PointSummary {
    /// Summarize a run of a single-group workload.
    pub fn new(config: &Config, workload: &Workload, r: &RunResult) -> Self {
        let g = &workload.groups[0];
        let op = g.op;
        let power = power_of_run(config, r);
        let cores_ns = config.host.contexts() as f64 * r.elapsed_ns as f64;
        PointSummary {
            preset: config.name.clone(),
            stack: config.host.stack.name().to_string(),
            op: op.name().to_string(),
            read_fraction: op.read_fraction(),
            size_bytes: g.size_bytes,
            pattern: if g.random { "random" } else { "sequential" }.to_string(),
            region_bytes: g.region_bytes,
            threads: workload.threads(),
            queue_depth: g.queue_depth,
            seed: workload.seed,
            ops: r.ops,
            elapsed_ns: r.elapsed_ns,
            bandwidth_mb_per_s: r.bandwidth_mb_per_s(),
            iops: r.iops(),
            latency_us_mean: r.latency.mean_ns() / 1e3,
            latency_us_p50: r.latency.percentile_ns(0.5) / 1e3,
            latency_us_p99: r.latency.percentile_ns(0.99) / 1e3,
            latency_us_p99_9: r.latency.percentile_ns(0.999) / 1e3,
            latency_us_max: r.latency.max_ns() as f64 / 1e3,
            breakdown_us: r.breakdown.clone(),
            latency_cdf_us: CDF_FRACTIONS
                .iter()
                .map(|&q| (r.latency.percentile_ns(q) / 1e3, q))
                .collect(),
            power_w: power.as_ref().map_or(f64::NAN, |p| p.total_w),
            energy_nj_per_op: power.as_ref().map_or(f64::NAN, |p| p.energy_nj_per_op),
            power_components: power
                .as_ref()
                .map(|p| {
                    p.components
                        .iter()
                        .map(|c| ComponentWatts {
                            name: c.name,
                            average_w: c.average_w,
                        })
                        .collect()
                })
                .unwrap_or_default(),
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

/// Where the latency CDF of a point is sampled.
const CDF_FRACTIONS: [f64; 25] = [
    0.001, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7,
    0.75, 0.8, 0.85, 0.9, 0.95, 0.99, 0.999, 1.0,
];

/// The device power report of a run (SPEC §1.9); `None` for the DDR
/// ramdisk, which has no Moneta device.
pub fn power_of_run(
    config: &crate::config::Config,
    run: &crate::experiment::RunResult,
) -> Option<power::PowerReport> {
    if config.host.stack == crate::config::Stack::Ramdisk {
        return None;
    }
    let c = &run.device;
    let activity = power::DeviceActivity {
        elapsed_ns: run.elapsed_ns,
        dma_busy_ns_host_to_device: c.dma_busy_ns_host_to_device,
        dma_busy_ns_device_to_host: c.dma_busy_ns_device_to_host,
        ring_busy_ns: c.ring_busy_ns,
        scheduler_busy_ns: c.scheduler_busy_ns,
        buffer_busy_ns: c.buffer_busy_ns,
        transfer_buffers: config.device.transfer_buffers,
        controllers: c.controllers.clone(),
    };
    Some(power::power_report(
        &config.power,
        config.device.capacity_bytes,
        &activity,
        run.ops,
    ))
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
) -> Result<PointSummary, Error> {
    let w = Workload::xdd(
        op,
        size_bytes,
        threads,
        default_region_bytes(config),
        limit,
        seed,
    );
    workload_point(config, &w)
}

/// Run a single-group workload and summarize it.
pub fn workload_point(config: &Config, workload: &Workload) -> Result<PointSummary, Error> {
    if workload.groups.len() != 1 {
        return Err(Error::workload(
            "a point summary needs a workload of one thread group",
        ));
    }
    let r = run(config, workload)?;
    Ok(PointSummary::new(config, workload, &r))
}
