//! NVMM's model against the statements of SPEC §7 (the UMD report's
//! evaluation), as `check::Check`s with the range each statement
//! allows; `moneta calibrate` prints them beside the array's checks and the
//! test `tests/nvmm_calibration.rs` holds them to their ranges.
//!
//! Setup for all checks: preset `nvmm-mlc` (64 MB DRAM, 1000 MLC packages
//! on 250 ONFI 3.0 channels), footprints 2× the DRAM (HybridSim's shipped
//! `ini/hybridsim.ini`: `TOTAL_PAGES` 8 GB behind `CACHE_PAGES` 4 GB; the
//! report says only "larger than the DRAM"), the report's access counts (GUPS
//! 5000 updates, MMAP 10,000 reads), "MLC latency" = 75 µs as the report's
//! sweep uses it, N threads = 8, prefetch = the next 16 pages, seed 1. No
//! constant of the model was tuned to these numbers. A check the model
//! misses is listed in [`KNOWN_MISSES`] with the reason.

use crate::check::Check;
use crate::nvmm::experiments::{point, standard_workload, wear, SweepPoint};
use crate::nvmm::system::{run, SystemKind};
use crate::nvmm::workload::WorkloadKind;
use crate::nvmm::NvmmConfig;

const SEED: u64 = 1;
const MLC_NS: u64 = 75_000;
const THREADS: u32 = 8;
const RATIO: f64 = 2.0;
/// The report's figure or table each check is a point of (the report
/// page groups its "what reproduces" by these).
const GUPS_FIGURE: &str = "NVMM report, Latency Sensitivity: GUPS figure (SPEC §7)";
const MMAP_FIGURE: &str = "NVMM report, Latency Sensitivity: MMAP figure (SPEC §7)";
const COMPARISON_FIGURE: &str = "NVMM report, Performance Comparison figure (SPEC §7)";
const SOFTWARE_TABLE: &str = "NVMM report, The Software Overhead of SSDs: table (SPEC §7)";
const WEAR_ESTIMATE: &str =
    "NVMM report, Nonvolatile Main Memory System Architecture: wear estimate (SPEC §7)";

/// (check name, why the model misses it).
pub const KNOWN_MISSES: &[(&str, &str)] = &[
    ("GUPS 1 thread, prefetch 16: NVMM over SSD", "Measured start states (docs/src/fidelity/audit-nvmm-quicksan.md): a dirty tail (controller.start_dirty) makes prefetch 2.4× slower (0.80×), other data in the cache (controller.start_blocks = other) gives the birthday gain (1.17× → 1.80×) but drops the no-prefetch 3× to 1.17× and makes prefetch help at 750 µs; neither is kept. GUPS starts with the DRAM full of the table's tail (clean: HybridSim's prefill) and updates uniformly at random, so the hit rate is the resident fraction whatever is prefetched (0.509 without, 0.508 with); the report's \"birthday attack\" gain needs ways holding no table data. With the report's 1000 flash devices the backing store has the bandwidth prefetch needs (1.06× → 1.92× after the set-up changes), so what is missing is where the table was when the measured run began: HybridSim prefills \"the first CACHE_PAGES pages of the address space\", and the report does not say whether the table was among them (it needs the benchmark's physical placement or the run's restore file)"),
    ("GUPS 8 threads, prefetch 16: NVMM over SSD", "as with one thread (hit rate 0.512 → 0.488 with prefetch: the same full cache of table blocks); 1.80× (was 0.68×): the report's 1000 devices removed the queueing behind prefetch reads, not the missing hit-rate gain"),
    ("MMAP 1 thread at MLC: NVMM over SSD (\"roughly the same\")", "an NVMM miss costs the flash read and the whole 8 KB page before the line goes to the CPU (HybridSim, ~96 µs); the SSD fault costs the report's measured 162 µs, so NVMM is 1.75× (2.23× with critical word first). \"Roughly the same\" needs NVMM misses near 160 µs: the report publishes the SSD's time per access, not NVMM's, and nothing in its controller description accounts for the difference"),
    ("MMAP 8 threads, no prefetch: NVMM over SSD", "with one core per thread the SSD's faults overlap as NVMM's misses do, so the SSD gains from 8 threads as much as NVMM (1.73×, against 1.75× with one thread); the report's 3× (against ≈ 1× with one thread) says the SSD path scales worse with threads, by kernel paging costs its software-time table (one thread) does not give. Was 2.06× within range with the line returned critical word first, which HybridSim does not do"),
    ("MMAP 8 threads, prefetch: NVMM over SSD", "prefetch now helps (hit rate 0.245 → 0.481, NVMM 1.36× faster; the report: 7/3 = 2.3×) since the report's 1000 devices carry the 17 reads per miss (0.79× before), but the SSD scales with threads as NVMM does (see MMAP 8 threads without prefetch): 2.35×"),
    ("MMAP 1 thread at 150 µs: SSD over NVMM (passed: > 1)", "the SSD pays the flash latency per fault too, plus its software, and random MMAP reads turn Linux's read-around off (mmap_miss), so it cannot pass NVMM (0.69, 0.61 with critical word first); the report's crossover implies NVMM costs per miss the model does not have (as for MMAP ≈ SSD at MLC)"),
    ("mean over workloads (SLC, MLC): NVMM over SSD", "misread kept as a check: the report averages over the benchmarks of its Performance Comparison figure (single- and multithreaded programs, DD, mmap, Videoserver, a light mix), which a model without a CPU cannot run; GUPS is not among them (it is the latency-sensitivity study's). Our three workloads include a sequential stream where the SSD's readahead wins (0.23–0.28×): 1.07×. Needs the figure's per-benchmark values, which the text does not give"),
    ("wear: worn out / half retired", "re-read: the run now goes on past the first unplaceable write, deleting pages that cannot be written, until no live page can be (the report's \"wear out completely\": capacity gone), 1.00 → 1.005. With a normal endurance spread of σ/μ = 0.2 (an assumption) and even wear, all blocks retire within the spread and the sub-page placement fails once about half of each block is bad, so the end follows the half at once; even perfect packing gives μ/(μ − 0.40σ) = 1.09. The report's 1.5 needs its [Micron 2014] distribution curve (a normal law would need σ/μ ≈ 0.84), which it does not give"),

];

/// The report's statement about the file-system benchmarks, which replaces
/// a misread check (see [`FILE_SYSTEM_VS_DRAM_SOURCE`]).
pub const FILE_SYSTEM_VS_DRAM: &str =
    "file-system workloads (sequential, MMAP; SLC, MLC): NVMM / all-DRAM fails to approach (> 2)";
const FILE_SYSTEM_VS_DRAM_SOURCE: &str = "NVMM report, Performance Comparison figure (SPEC §7): \"Both NVMM and SSD architectures fail to approach the performance of all-DRAM systems for the file system workloads ... The file-system benchmarks (DD and mmap) both use files that exceed the size of the DRAM system\". Re-audit: this replaces \"mean over workloads (SLC, MLC): NVMM / all-DRAM\" (1 … 2, measured 109×), which set the report's \"averaging across all of the benchmarks ... comes within a factor of 2 of an all-DRAM system\" against GUPS, MMAP and a sequential stream, all 2× the DRAM. That average is over the IPC of the Performance Comparison figure's programs, whose working sets mostly fit in the DRAM (the model has no CPU to run them; the fitting case is the check \"working set fits in the DRAM\"); GUPS is the latency study's benchmark, not the figure's. For the two benchmarks the model does run, the report says the opposite of \"within 2×\"";

/// One point of the sweep on the calibration's set-up: NVMM, the SSD
/// system and all-DRAM on the same workload.
pub fn compare(kind: WorkloadKind, read_ns: u64, threads: u32, prefetch: u32) -> SweepPoint {
    let mut c = NvmmConfig::preset("nvmm-mlc").expect("shipped preset");
    c.flash.read_ns = read_ns;
    c.controller.prefetch_pages = prefetch;
    let w = standard_workload(&c, kind, threads, None, RATIO).expect("standard workload");
    let nvmm = run(&c, SystemKind::Nvmm, &w, SEED).expect("runs");
    let ssd = run(&c, SystemKind::Ssd, &w, SEED).expect("runs");
    let dram = run(&c, SystemKind::AllDram, &w, SEED).expect("runs");
    point(&nvmm, &ssd, &dram)
}

/// A statement "about `published`" that the project accepts within [low, high].
fn ranged(
    name: &str,
    source: &'static str,
    published: f64,
    measured: f64,
    low: f64,
    high: f64,
) -> Check {
    Check {
        name: name.into(),
        source,
        published,
        simulated: measured,
        tolerance: ((high - published).max(published - low) / published).abs(),
        unit: "×",
        bounds: Some((low, high)),
    }
}

/// A statement that is one point of the latency sweep: NVMM's speedup over
/// the SSD system for a workload, flash read latency, thread count and
/// prefetch depth (preset `nvmm-mlc`, the report's access counts,
/// footprint 2× the DRAM, seed 1: what `moneta nvmm sim sweep` runs by
/// default), with the range the project accepts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepStatement {
    pub name: &'static str,
    pub workload: WorkloadKind,
    pub read_ns: u64,
    pub threads: u32,
    pub prefetch_pages: u32,
    /// NVMM over SSD (SSD time / NVMM time).
    pub published: f64,
    pub low: f64,
    pub high: f64,
    /// The check states the inverse, SSD over NVMM ("the SSD passes NVMM").
    pub inverse: bool,
}

/// The report's statements that are points of the sweep, in the order of
/// [`checks`]. "MMAP 1 thread: gain from prefetch" is a ratio of two
/// curves, not a point of one, and is not here.
pub const SWEEP_STATEMENTS: [SweepStatement; 7] = [
    statement(
        "GUPS 1 thread, no prefetch: NVMM over SSD",
        WorkloadKind::Gups,
        MLC_NS,
        1,
        0,
        3.0,
        2.0,
        4.0,
    ),
    statement(
        "GUPS 1 thread, prefetch 16: NVMM over SSD",
        WorkloadKind::Gups,
        MLC_NS,
        1,
        16,
        3.7,
        2.5,
        5.0,
    ),
    statement(
        "GUPS 8 threads, prefetch 16: NVMM over SSD",
        WorkloadKind::Gups,
        MLC_NS,
        THREADS,
        16,
        4.7,
        3.1,
        6.3,
    ),
    statement(
        "MMAP 1 thread at MLC: NVMM over SSD (\"roughly the same\")",
        WorkloadKind::Mmap,
        MLC_NS,
        1,
        0,
        1.0,
        0.75,
        1.33,
    ),
    statement(
        "MMAP 8 threads, no prefetch: NVMM over SSD",
        WorkloadKind::Mmap,
        MLC_NS,
        THREADS,
        0,
        3.0,
        2.0,
        4.0,
    ),
    statement(
        "MMAP 8 threads, prefetch: NVMM over SSD",
        WorkloadKind::Mmap,
        MLC_NS,
        THREADS,
        16,
        7.0,
        4.7,
        9.3,
    ),
    // "SSD passes NVMM at 150 µs": the SSD's speedup over NVMM above 1.
    SweepStatement {
        inverse: true,
        high: f64::INFINITY,
        ..statement(
            "MMAP 1 thread at 150 µs: SSD over NVMM (passed: > 1)",
            WorkloadKind::Mmap,
            150_000,
            1,
            0,
            1.0,
            1.0,
            1.0,
        )
    },
];

#[allow(clippy::too_many_arguments)]
const fn statement(
    name: &'static str,
    workload: WorkloadKind,
    read_ns: u64,
    threads: u32,
    prefetch_pages: u32,
    published: f64,
    low: f64,
    high: f64,
) -> SweepStatement {
    SweepStatement {
        name,
        workload,
        read_ns,
        threads,
        prefetch_pages,
        published,
        low,
        high,
        inverse: false,
    }
}

impl SweepStatement {
    /// The check of this statement given the model's NVMM-over-SSD speedup.
    pub fn check(&self, speedup_over_ssd: f64) -> Check {
        let measured = if self.inverse {
            1.0 / speedup_over_ssd
        } else {
            speedup_over_ssd
        };
        let source = match self.workload {
            WorkloadKind::Gups => GUPS_FIGURE,
            _ => MMAP_FIGURE,
        };
        ranged(
            self.name,
            source,
            self.published,
            measured,
            self.low,
            self.high,
        )
    }
}

/// A wear estimate of SPEC §7 as a point of a capacity-over-time curve.
/// "Moderate load" has no write rate, so only the shape can be compared
/// (the check "wear: worn out / half retired").
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WearStatement {
    pub name: &'static str,
    /// 1 (one 8 Gb device) or 1000 (a 1 TB system).
    pub devices: u32,
    /// Share of the capacity still usable: 0.5 at "half", 0 when worn out.
    pub capacity_left: f64,
    pub days_low: f64,
    pub days_high: f64,
    /// Where the point is drawn: "< 2 days" at 2, a range at its middle.
    pub days_drawn: f64,
}

pub const WEAR_STATEMENTS: [WearStatement; 4] = [
    wear_statement(
        "one 8 Gb device: half its capacity lost in < 2 days",
        1,
        0.5,
        0.0,
        2.0,
    ),
    wear_statement("one 8 Gb device: worn out in 3 days", 1, 0.0, 3.0, 3.0),
    wear_statement(
        "1000 devices: half the capacity lost in 2–3 years",
        1000,
        0.5,
        730.0,
        1095.0,
    ),
    wear_statement(
        "1000 devices: worn out in 4–5 years",
        1000,
        0.0,
        1460.0,
        1825.0,
    ),
];

const fn wear_statement(
    name: &'static str,
    devices: u32,
    capacity_left: f64,
    days_low: f64,
    days_high: f64,
) -> WearStatement {
    WearStatement {
        name,
        devices,
        capacity_left,
        days_low,
        days_high,
        days_drawn: if days_low == 0.0 {
            days_high
        } else {
            (days_low + days_high) / 2.0
        },
    }
}

/// GUPS and MMAP speedups, the crossover, the averages, the hit path, the
/// SSD's hardware time per fault and the wear shape.
pub fn checks() -> Vec<Check> {
    let mut v: Vec<Check> = SWEEP_STATEMENTS
        .iter()
        .map(|s| {
            s.check(compare(s.workload, s.read_ns, s.threads, s.prefetch_pages).speedup_over_ssd)
        })
        .collect();
    let mmap = compare(WorkloadKind::Mmap, MLC_NS, 1, 0);
    let mmap_prefetch = compare(WorkloadKind::Mmap, MLC_NS, 1, 16);
    v.insert(
        4,
        ranged(
            "MMAP 1 thread: gain from prefetch",
            MMAP_FIGURE,
            1.6,
            mmap.nvmm_elapsed_ns as f64 / mmap_prefetch.nvmm_elapsed_ns as f64,
            1.2,
            2.1,
        ),
    );
    let mut speedups = Vec::new();
    // NVMM / all-DRAM of the report's two file-system benchmarks, DD (a
    // sequential stream) and mmap (MMAP), files larger than the DRAM.
    let mut file_system_slowdowns = Vec::new();
    for kind in [
        WorkloadKind::Gups,
        WorkloadKind::Mmap,
        WorkloadKind::Sequential,
    ] {
        for read_ns in [25_000, 50_000] {
            let p = compare(kind, read_ns, 1, 0);
            speedups.push(p.speedup_over_ssd);
            if kind != WorkloadKind::Gups {
                file_system_slowdowns.push(p.slowdown_vs_dram);
            }
        }
    }
    let geomean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    // The hit path alone: a working set that fits in the DRAM cache.
    let mut c = NvmmConfig::preset("nvmm-mlc").expect("shipped preset");
    c.flash.read_ns = 50_000;
    let w = standard_workload(&c, WorkloadKind::Gups, 1, Some(20_000), 0.5).expect("workload");
    let nvmm = run(&c, SystemKind::Nvmm, &w, SEED).expect("runs");
    let dram = run(&c, SystemKind::AllDram, &w, SEED).expect("runs");
    v.push(ranged(
        "working set fits in the DRAM: NVMM / all-DRAM (≤ 2)",
        COMPARISON_FIGURE,
        2.0,
        nvmm.elapsed_ns as f64 / dram.elapsed_ns as f64,
        1.0,
        2.0,
    ));
    v.push(ranged(
        "mean over workloads (SLC, MLC): NVMM over SSD",
        COMPARISON_FIGURE,
        1.75,
        geomean(&speedups),
        1.5,
        2.0,
    ));
    let file_system = ranged(
        FILE_SYSTEM_VS_DRAM,
        FILE_SYSTEM_VS_DRAM_SOURCE,
        2.0,
        geomean(&file_system_slowdowns),
        2.0,
        f64::INFINITY,
    );
    v.push(file_system);
    // The report measured 38.9 µs (SLC, 25 µs) and 88.8 µs (MLC, 75 µs) of
    // hardware time per MMAP access. Not independent evidence:
    // `ssd.controller_ns` (2 µs, an assumption) was chosen with these
    // figures in view.
    for (read_ns, published_us, name) in [
        (25_000, 38.9, "SSD hardware time per fault, SLC"),
        (75_000, 88.8, "SSD hardware time per fault, MLC"),
    ] {
        let mut c = NvmmConfig::preset("nvmm-mlc").expect("shipped preset");
        c.flash.read_ns = read_ns;
        let w = standard_workload(&c, WorkloadKind::Mmap, 1, None, RATIO).expect("workload");
        let r = run(&c, SystemKind::Ssd, &w, SEED).expect("runs");
        let s = r.ssd.expect("an SSD run has SSD counters");
        let hw_us = s.fault_hardware_ns as f64 / s.faults as f64 / 1000.0;
        let mut check = ranged(
            name,
            SOFTWARE_TABLE,
            published_us,
            hw_us,
            0.8 * published_us,
            1.2 * published_us,
        );
        check.unit = "µs";
        v.push(check);
    }
    // One 8 Gb device: half its capacity in < 2 days, worn out in 3 (1.5×);
    // 1000 devices: 2–3 and 4–5 years (1.3–2.5×). Only the shape can be
    // checked: "moderate load" has no write rate.
    let mut c = NvmmConfig::preset("nvmm-mlc").expect("shipped preset");
    c.flash.blocks_per_plane = 8;
    let r = wear(&c, 50e6, 0.25, 1000, SEED).expect("wear runs");
    v.push(ranged(
        "wear: worn out / half retired",
        WEAR_ESTIMATE,
        1.5,
        r.days_to_end_one_8gb_device / r.days_to_half_one_8gb_device,
        1.3,
        2.5,
    ));
    v
}
