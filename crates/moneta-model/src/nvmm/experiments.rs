//! The report's experiments on the model (SPEC §7 "Evaluation", "Wear"):
//! standard workloads sized against the DRAM, the backing-store latency
//! sweep (NVMM with and without prefetch, the SSD system, all-DRAM, 1 and N
//! threads), and the wear-out estimate.

use super::config::NvmmConfig;
use super::journal::{Journal, VIRTUAL_PAGE_BYTES};
use super::system::{run, RunResult, SystemKind};
use super::workload::{Workload, WorkloadKind};
use super::NvmmError;
use crate::kernel::Rng;
use serde::Serialize;

/// The backing-store latencies of the report's sweep (ns): SLC/8 … MLC,
/// 150 µs and 750 µs.
pub const SWEEP_LATENCIES_NS: [u64; 8] = [
    3_125, 6_250, 12_500, 25_000, 50_000, 75_000, 150_000, 750_000,
];

/// The prefetch depth of the report's prefetching configuration.
pub const REPORT_PREFETCH_PAGES: u32 = 16;

/// A standard workload for `config`: footprint `footprint_ratio` × the
/// DRAM; `accesses` default to the report's (GUPS 5000 updates, MMAP
/// 10,000 reads; sequential 100,000 lines).
pub fn standard_workload(
    config: &NvmmConfig,
    kind: WorkloadKind,
    threads: u32,
    accesses: Option<u64>,
    footprint_ratio: f64,
) -> Result<Workload, NvmmError> {
    if !(footprint_ratio.is_finite() && footprint_ratio > 0.0) {
        return Err(NvmmError::Workload(
            "the footprint ratio must be positive".into(),
        ));
    }
    let accesses = accesses.unwrap_or(match kind {
        WorkloadKind::Gups => 5_000,
        WorkloadKind::Mmap => 10_000,
        _ => 100_000,
    });
    let bytes = (config.dram.capacity_bytes as f64 * footprint_ratio) as u64;
    let footprint = bytes.div_ceil(VIRTUAL_PAGE_BYTES).max(1) * VIRTUAL_PAGE_BYTES;
    Workload::new(kind, threads, accesses, footprint, config.dram.line_bytes)
        .map_err(NvmmError::Workload)
}

/// One point of the latency sweep: the three systems on one workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepPoint {
    pub workload: &'static str,
    pub backing_read_ns: u64,
    pub threads: u32,
    pub prefetch_pages: u32,
    pub nvmm_elapsed_ns: u64,
    pub ssd_elapsed_ns: u64,
    pub all_dram_elapsed_ns: u64,
    /// SSD time / NVMM time: > 1 when NVMM is faster.
    pub speedup_over_ssd: f64,
    /// NVMM time / all-DRAM time.
    pub slowdown_vs_dram: f64,
    pub nvmm_hit_rate: f64,
    pub ssd_hit_rate: f64,
    pub seed: u64,
}

/// What a sweep covers.
pub struct SweepSetup {
    pub workloads: Vec<WorkloadKind>,
    pub latencies_ns: Vec<u64>,
    pub threads: Vec<u32>,
    pub prefetch: Vec<u32>,
    pub accesses: Option<u64>,
    pub footprint_ratio: f64,
    pub seed: u64,
}

/// Every (workload, latency, threads, prefetch) point; `progress(done,
/// all)` after each. The SSD and all-DRAM runs do not depend on NVMM's
/// prefetch and are shared between prefetch settings.
pub fn latency_sweep(
    base: &NvmmConfig,
    setup: &SweepSetup,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<SweepPoint>, NvmmError> {
    let all = setup.workloads.len()
        * setup.latencies_ns.len()
        * setup.threads.len()
        * setup.prefetch.len();
    let mut points = Vec::with_capacity(all);
    for &kind in &setup.workloads {
        for &threads in &setup.threads {
            let w = standard_workload(base, kind, threads, setup.accesses, setup.footprint_ratio)?;
            let dram = run(base, SystemKind::AllDram, &w, setup.seed)?;
            for &latency in &setup.latencies_ns {
                let mut config = base.clone();
                config.flash.read_ns = latency;
                let ssd = run(&config, SystemKind::Ssd, &w, setup.seed)?;
                for &prefetch in &setup.prefetch {
                    config.controller.prefetch_pages = prefetch;
                    let nvmm = run(&config, SystemKind::Nvmm, &w, setup.seed)?;
                    points.push(point(&nvmm, &ssd, &dram));
                    progress(points.len(), all);
                }
            }
        }
    }
    Ok(points)
}

pub fn point(nvmm: &RunResult, ssd: &RunResult, dram: &RunResult) -> SweepPoint {
    SweepPoint {
        workload: nvmm.workload,
        backing_read_ns: nvmm.backing_read_ns,
        threads: nvmm.threads,
        prefetch_pages: nvmm.prefetch_pages,
        nvmm_elapsed_ns: nvmm.elapsed_ns,
        ssd_elapsed_ns: ssd.elapsed_ns,
        all_dram_elapsed_ns: dram.elapsed_ns,
        speedup_over_ssd: ssd.elapsed_ns as f64 / nvmm.elapsed_ns as f64,
        slowdown_vs_dram: nvmm.elapsed_ns as f64 / dram.elapsed_ns as f64,
        nvmm_hit_rate: nvmm.hit_rate,
        ssd_hit_rate: ssd.hit_rate,
        seed: nvmm.seed,
    }
}

/// The wear estimate: how long until half the flash is retired, and until
/// it is worn out completely.
///
/// The report's estimate ("would lose half its storage capacity to the
/// removal of bad pages in just under two days and would wear out
/// completely in three"; "as individual pages wear out, they are removed
/// from the system ... and the usable storage per flash chip decreases")
/// counts capacity: half of it gone, then all of it. So the run does not
/// stop at the first write that no longer fits: the host keeps writing at
/// the same rate, and a page that cannot be written is deleted (the
/// report's `delete`), so the live data shrinks with the capacity. "Worn
/// out" is the end of that: no live page is left that can be written. The
/// first unplaceable write is reported too (the estimate before the
/// re-audit, which read "completely" as "the first write that fails").
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WearReport {
    pub preset: String,
    pub flash_bytes: u64,
    pub endurance_cycles: u64,
    /// Endurance divided by this in the simulation; times multiplied back.
    pub endurance_scale: u64,
    pub write_rate_bytes_per_s: f64,
    /// Share of the flash holding live virtual pages at the start.
    pub utilization: f64,
    pub segments_written_to_half: u64,
    /// Segments written when the first write did not fit.
    pub segments_written_to_first_unplaceable: u64,
    pub segments_written_to_end: u64,
    /// Virtual pages deleted because they could not be written.
    pub pages_deleted: u64,
    /// Share of flash pages retired when no write fit any more.
    pub retired_fraction_at_end: f64,
    /// Flash pages programmed per segment written by the host.
    pub write_amplification: f64,
    pub days_to_half_simulated_flash: f64,
    pub days_to_end_simulated_flash: f64,
    /// Scaled to one 8 Gb (1 GB) device and to 1000 of them at the same rate.
    pub days_to_half_one_8gb_device: f64,
    pub days_to_first_unplaceable_one_8gb_device: f64,
    pub days_to_end_one_8gb_device: f64,
    pub years_to_half_1000_devices: f64,
    pub years_to_end_1000_devices: f64,
    pub seed: u64,
}

/// One point of the wear run's retirement curve.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct WearSample {
    /// Time at the run's write rate, scaled to one 8 Gb device.
    pub days_one_8gb_device: f64,
    /// Share of flash pages retired.
    pub retired_fraction: f64,
}

/// Samples of the retirement curve: one per 5% of pages retired (at most
/// 20 + 2), few enough to show each as a marker.
const WEAR_CURVE_STEP: f64 = 0.05;

/// The wear estimate runs on at most this many of the configuration's
/// channels: wear-out time depends on the pages' endurance, the share of
/// the flash that is live and where writes land (round robin over the
/// planes), not on how many channels carry them, and the journal keeps
/// state per flash page (the presets' 1000 packages would make the run
/// 30× longer for the same curve, scaled to one device).
pub const WEAR_MAX_CHANNELS: u32 = 8;

/// Write random single segments of live virtual pages (as write-backs of
/// a DRAM cache would) until the flash is worn out. Endurance is divided by
/// `endurance_scale` so the run is short, and times multiplied by it back
/// (wear-out time is proportional to endurance when the write pattern is
/// the same).
pub fn wear(
    config: &NvmmConfig,
    write_rate_bytes_per_s: f64,
    utilization: f64,
    endurance_scale: u64,
    seed: u64,
) -> Result<WearReport, NvmmError> {
    wear_with_curve(
        config,
        write_rate_bytes_per_s,
        utilization,
        endurance_scale,
        seed,
    )
    .map(|(report, _)| report)
}

/// [`wear`], and the retirement curve: the first page retired, every
/// further 5%, and the end (no live page can be written).
pub fn wear_with_curve(
    config: &NvmmConfig,
    write_rate_bytes_per_s: f64,
    utilization: f64,
    endurance_scale: u64,
    seed: u64,
) -> Result<(WearReport, Vec<WearSample>), NvmmError> {
    if !(write_rate_bytes_per_s.is_finite() && write_rate_bytes_per_s > 0.0) {
        return Err(NvmmError::Workload(
            "the write rate must be positive".into(),
        ));
    }
    if !(0.0 < utilization && utilization <= 0.8) {
        return Err(NvmmError::Workload(
            "utilization must be in (0, 0.8]".into(),
        ));
    }
    if endurance_scale == 0 || endurance_scale > config.flash.endurance_cycles {
        return Err(NvmmError::Workload(
            "endurance scale must be 1 … flash.endurance_cycles".into(),
        ));
    }
    let mut capped = config.clone();
    capped.flash.channels = capped.flash.channels.min(WEAR_MAX_CHANNELS);
    let config = &capped;
    let mut scaled = config.clone();
    scaled.flash.endurance_cycles = config.flash.endurance_cycles / endurance_scale;
    let flash_bytes = config.flash_bytes();
    let vpages = ((flash_bytes as f64 * utilization) as u64 / VIRTUAL_PAGE_BYTES).max(1);
    let mut journal = Journal::new(&scaled, vpages, seed).map_err(NvmmError::Flash)?;
    journal.preload().map_err(NvmmError::Flash)?;
    let base = journal.stats();
    let segments = journal.segments_per_page();
    let mut rng = Rng::stream(seed, 0x3EA5);
    // The live virtual pages; a page the journal dropped (a failed write
    // that had consolidated it) or that could not be written leaves.
    let mut live: Vec<u64> = (0..vpages).collect();
    let (mut written, mut to_half, mut first_unplaceable) = (0u64, None, None);
    let mut deleted = 0u64;
    // (segments written, retired fraction), sampled as retirement grows.
    let mut curve: Vec<(u64, f64)> = Vec::new();
    let mut next_sample = f64::MIN_POSITIVE;
    // Bounded: every write programs a page; flash wears out well before.
    let limit = config.flash_pages() * scaled.flash.endurance_cycles * 4 + 1_000_000;
    while written < limit && !live.is_empty() {
        let at = rng.below(live.len() as u64) as usize;
        let vpn = live[at];
        let segment = rng.below(segments.into()) as u32;
        if journal.write_back(0, 0, vpn, 1 << segment, None).is_err() {
            first_unplaceable.get_or_insert(written);
            journal.delete(vpn);
            live.swap_remove(at);
            deleted += 1;
            // A failed write may have consolidated (and so dropped) others.
            live.retain(|&v| journal.chain_length(v) > 0);
            continue;
        }
        written += 1;
        let retired = journal.retired_fraction();
        if retired >= next_sample {
            curve.push((written, retired));
            next_sample = (retired / WEAR_CURVE_STEP).floor() * WEAR_CURVE_STEP + WEAR_CURVE_STEP;
        }
        if to_half.is_none() && retired >= 0.5 {
            to_half = Some(written);
        }
    }
    curve.push((written, journal.retired_fraction()));
    // Worn out before half was retired: "half" is then the end.
    let to_half = to_half.unwrap_or(written);
    let first_unplaceable = first_unplaceable.unwrap_or(written);
    let s = journal.stats();
    let programmed = s.pages_programmed - base.pages_programmed;
    let seconds = |segs: u64| {
        segs as f64 * config.flash.page_bytes as f64 / write_rate_bytes_per_s
            * endurance_scale as f64
    };
    let day = 86_400.0;
    let device_scale = (1u64 << 30) as f64 / flash_bytes as f64;
    let report = WearReport {
        preset: config.name.clone(),
        flash_bytes,
        endurance_cycles: config.flash.endurance_cycles,
        endurance_scale,
        write_rate_bytes_per_s,
        utilization,
        segments_written_to_half: to_half,
        segments_written_to_first_unplaceable: first_unplaceable,
        segments_written_to_end: written,
        pages_deleted: deleted,
        retired_fraction_at_end: journal.retired_fraction(),
        write_amplification: programmed as f64 / written.max(1) as f64,
        days_to_half_simulated_flash: seconds(to_half) / day,
        days_to_end_simulated_flash: seconds(written) / day,
        days_to_half_one_8gb_device: seconds(to_half) * device_scale / day,
        days_to_first_unplaceable_one_8gb_device: seconds(first_unplaceable) * device_scale / day,
        days_to_end_one_8gb_device: seconds(written) * device_scale / day,
        years_to_half_1000_devices: seconds(to_half) * device_scale * 1000.0 / day / 365.0,
        years_to_end_1000_devices: seconds(written) * device_scale * 1000.0 / day / 365.0,
        seed,
    };
    let curve = curve
        .into_iter()
        .map(|(segments, retired_fraction)| WearSample {
            days_one_8gb_device: seconds(segments) * device_scale / day,
            retired_fraction,
        })
        .collect();
    Ok((report, curve))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wear_retires_half_before_the_end_and_scales_with_devices() {
        let mut c = NvmmConfig::preset("nvmm-slc").unwrap();
        c.flash.blocks_per_plane = 8;
        c.flash.channels = 2;
        c.flash.volumes_per_channel = 2;
        let r = wear(&c, 50e6, 0.25, 5000, 3).unwrap();
        println!("{r:?}");
        assert!(r.segments_written_to_half <= r.segments_written_to_end);
        // The first write that does not fit comes before the end: the run
        // goes on with the live data shrinking (pages deleted) until the
        // capacity is gone, not only a fifth of it.
        assert!(r.segments_written_to_first_unplaceable < r.segments_written_to_end);
        assert!(r.days_to_first_unplaceable_one_8gb_device < r.days_to_end_one_8gb_device);
        assert!(r.pages_deleted >= 1, "{r:?}");
        // Past half: the old end (the first unplaceable write) came with
        // about half the pages retired.
        assert!(r.retired_fraction_at_end > 0.55, "{r:?}");
        assert!(r.write_amplification >= 1.0);
        let ratio = r.years_to_half_1000_devices * 365.0 / r.days_to_half_one_8gb_device;
        assert!((ratio - 1000.0).abs() < 1e-6);
        assert!(wear(&c, 0.0, 0.25, 10, 3).is_err());
        // The curve: retirement only grows, ends where the report does, and
        // is the same run.
        let (same, curve) = wear_with_curve(&c, 50e6, 0.25, 5000, 3).unwrap();
        assert_eq!(same, r);
        assert!(curve.len() >= 2 && curve.len() <= 22, "{}", curve.len());
        assert!(curve
            .windows(2)
            .all(|w| w[0].days_one_8gb_device <= w[1].days_one_8gb_device
                && w[0].retired_fraction <= w[1].retired_fraction));
        let end = curve.last().unwrap();
        assert_eq!(end.retired_fraction, r.retired_fraction_at_end);
        assert!((end.days_one_8gb_device - r.days_to_end_one_8gb_device).abs() < 1e-9);
        assert!(wear(&c, 1e6, 0.9, 10, 3).is_err());
    }
}
