//! NVMM's model against the statements of SPEC §7 (the UMD report's
//! evaluation), with tolerances.
//!
//! Every check prints its measured number. A check the model misses is
//! marked as a known miss with its explanation (README "NVMM"); such a
//! check asserts that it still misses, so that the README's table cannot
//! silently go stale. No constant of the model was tuned to these numbers.
//!
//! Setup for all checks: preset `nvmm-mlc` (64 MB DRAM, 8 ONFI 3.0
//! channels), footprints 2× the DRAM, the report's access counts (GUPS
//! 5000 updates, MMAP 10,000 reads), "MLC latency" = 75 µs as the report's
//! sweep uses it, N threads = 8, prefetch = the next 16 pages, seed 1.

use moneta_model::nvmm::experiments::{point, standard_workload, wear, SweepPoint};
use moneta_model::nvmm::system::{run, SystemKind};
use moneta_model::nvmm::workload::WorkloadKind;
use moneta_model::nvmm::NvmmConfig;

const SEED: u64 = 1;
const MLC_NS: u64 = 75_000;
const THREADS: u32 = 8;
const RATIO: f64 = 2.0;

fn compare(kind: WorkloadKind, read_ns: u64, threads: u32, prefetch: u32) -> SweepPoint {
    let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
    c.flash.read_ns = read_ns;
    c.controller.prefetch_pages = prefetch;
    let w = standard_workload(&c, kind, threads, None, RATIO).unwrap();
    let nvmm = run(&c, SystemKind::Nvmm, &w, SEED).unwrap();
    let ssd = run(&c, SystemKind::Ssd, &w, SEED).unwrap();
    let dram = run(&c, SystemKind::AllDram, &w, SEED).unwrap();
    let p = point(&nvmm, &ssd, &dram);
    println!(
        "  {:<10} {:>7} ns {:>2} thr pf {:>2}: NVMM {:>12} ns  SSD {:>12} ns  DRAM {:>10} ns  \
         NVMM/SSD speedup {:.2}  NVMM/DRAM {:.2}  hit NVMM {:.2} SSD {:.2}",
        p.workload,
        read_ns,
        threads,
        prefetch,
        p.nvmm_elapsed_ns,
        p.ssd_elapsed_ns,
        p.all_dram_elapsed_ns,
        p.speedup_over_ssd,
        p.slowdown_vs_dram,
        p.nvmm_hit_rate,
        p.ssd_hit_rate
    );
    p
}

struct Check {
    name: &'static str,
    measured: f64,
    low: f64,
    high: f64,
    /// Why the model misses it, when it does.
    known_miss: Option<&'static str>,
}

fn verify(checks: &[Check]) {
    let mut failures = Vec::new();
    for c in checks {
        let within = c.low <= c.measured && c.measured <= c.high;
        let verdict = match (within, c.known_miss) {
            (true, None) => "ok",
            (false, Some(_)) => "KNOWN MISS",
            (false, None) => "FAIL",
            (true, Some(_)) => "NOW WITHIN (remove the known-miss mark, update README)",
        };
        println!(
            "{:<58} measured {:>7.2}  wanted {:.2} … {:.2}  {verdict}",
            c.name, c.measured, c.low, c.high
        );
        if let Some(why) = c.known_miss {
            println!("    why: {why}");
        }
        if within == c.known_miss.is_some() {
            failures.push(c.name);
        }
    }
    assert!(failures.is_empty(), "checks failed: {failures:?}");
}

#[test]
fn gups_speedups_over_the_ssd_at_mlc_latency() {
    let no_prefetch = compare(WorkloadKind::Gups, MLC_NS, 1, 0);
    let prefetch = compare(WorkloadKind::Gups, MLC_NS, 1, 16);
    let threads = compare(WorkloadKind::Gups, MLC_NS, THREADS, 16);
    verify(&[
        Check {
            name: "GUPS 1 thread, no prefetch: NVMM over SSD (3×)",
            measured: no_prefetch.speedup_over_ssd,
            low: 2.0,
            high: 4.0,
            known_miss: None,
        },
        Check {
            name: "GUPS 1 thread, prefetch 16: NVMM over SSD (3.7×)",
            measured: prefetch.speedup_over_ssd,
            low: 2.5,
            high: 5.0,
            known_miss: Some(
                "every prefetched page evicts a dirty page of the table (GUPS dirties what it \
                 touches), so a miss with prefetch also writes back up to 16 pages: programs \
                 (1.2 ms, holding their planes) and channel time the report's runs evidently \
                 did not pay; it does not say where its controller put prefetched blocks or \
                 when it wrote victims back",
            ),
        },
        Check {
            name: "GUPS 8 threads, prefetch 16: NVMM over SSD (4.7×)",
            measured: threads.speedup_over_ssd,
            low: 3.1,
            high: 6.3,
            known_miss: Some(
                "as with one thread, plus 8 threads × 17 page transfers per miss load the 8 \
                 ONFI 3.0 channels (8 is our assumption; the report says \"numerous\")",
            ),
        },
    ]);
}

#[test]
fn mmap_prefetch_threads_and_the_crossover() {
    let single = compare(WorkloadKind::Mmap, MLC_NS, 1, 0);
    let single_prefetch = compare(WorkloadKind::Mmap, MLC_NS, 1, 16);
    let threads = compare(WorkloadKind::Mmap, MLC_NS, THREADS, 0);
    let threads_prefetch = compare(WorkloadKind::Mmap, MLC_NS, THREADS, 16);
    let at_150 = compare(WorkloadKind::Mmap, 150_000, 1, 0);
    verify(&[
        Check {
            name: "MMAP 1 thread at MLC: NVMM ≈ SSD (\"roughly the same\")",
            measured: single.speedup_over_ssd,
            low: 0.75,
            high: 1.33,
            known_miss: Some(
                "an NVMM miss here costs the flash read and the first 64 B (~76 µs); the SSD \
                 fault costs the report's measured 162 µs. \"Roughly the same\" would need NVMM \
                 misses near 160 µs, which nothing in the report's controller description \
                 accounts for (full-system effects of MARSSx86 + Linux we do not model)",
            ),
        },
        Check {
            name: "MMAP 1 thread: gain from prefetch (1.6×)",
            measured: single.nvmm_elapsed_ns as f64 / single_prefetch.nvmm_elapsed_ns as f64,
            low: 1.2,
            high: 2.1,
            known_miss: Some(
                "prefetch doubles the hit rate (0.25 → 0.48), but 17 page transfers per miss \
                 (348 µs of channel time over 8 channels) delay the demand transfers",
            ),
        },
        Check {
            name: "MMAP 8 threads, no prefetch: NVMM over SSD (3×)",
            measured: threads.speedup_over_ssd,
            low: 2.0,
            high: 4.0,
            known_miss: Some(
                "our SSD system scales 7.4× from 1 to 8 threads (one core per thread, no kernel \
                 lock contention, no software variance); NVMM 6.5× (flash queueing). The \
                 report's Linux evidently scaled worse",
            ),
        },
        Check {
            name: "MMAP 8 threads, prefetch: NVMM over SSD (7×)",
            measured: threads_prefetch.speedup_over_ssd,
            low: 4.7,
            high: 9.3,
            known_miss: Some(
                "8 threads × 17 transfers per miss saturate the 8 ONFI 3.0 channels; prefetch \
                 then costs more than it saves",
            ),
        },
        Check {
            name: "MMAP 1 thread at 150 µs: the SSD has passed NVMM (< 1)",
            measured: at_150.speedup_over_ssd,
            low: 0.0,
            high: 1.0,
            known_miss: Some(
                "the SSD pays the flash latency per fault too, plus its software, and random \
                 MMAP reads turn Linux's read-around off (mmap_miss), so in the model it cannot \
                 pass NVMM; the report's crossover implies NVMM costs per miss the model does \
                 not have (as for MMAP ≈ SSD at MLC)",
            ),
        },
    ]);
}

#[test]
fn averaged_over_the_workloads_nvmm_is_near_dram_and_ahead_of_the_ssd() {
    let mut speedups = Vec::new();
    let mut slowdowns = Vec::new();
    for kind in [
        WorkloadKind::Gups,
        WorkloadKind::Mmap,
        WorkloadKind::Sequential,
    ] {
        for read_ns in [25_000, 50_000] {
            let p = compare(kind, read_ns, 1, 0);
            speedups.push(p.speedup_over_ssd);
            slowdowns.push(p.slowdown_vs_dram);
        }
    }
    let geomean = |v: &[f64]| (v.iter().map(|x| x.ln()).sum::<f64>() / v.len() as f64).exp();
    // The hit path alone: a working set that fits in the DRAM cache.
    let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
    c.flash.read_ns = 50_000;
    let w = standard_workload(&c, WorkloadKind::Gups, 1, Some(20_000), 0.5).unwrap();
    let nvmm = run(&c, SystemKind::Nvmm, &w, SEED).unwrap();
    let dram = run(&c, SystemKind::AllDram, &w, SEED).unwrap();
    println!("  fitting GUPS: NVMM hit rate {:.3}", nvmm.hit_rate);
    verify(&[
        Check {
            name: "working set fits in the DRAM: NVMM / all-DRAM (≤ 2)",
            measured: nvmm.elapsed_ns as f64 / dram.elapsed_ns as f64,
            low: 1.0,
            high: 2.0,
            known_miss: None,
        },
        Check {
            name: "mean over workloads (SLC, MLC): NVMM over SSD (1.5–2×)",
            measured: geomean(&speedups),
            low: 1.5,
            high: 2.0,
            known_miss: Some(
                "the report averages over its benchmark suite (PARSEC-like programs, file \
                 system benchmarks), which a model without a CPU cannot run; our three \
                 workloads include a sequential stream, where the SSD's readahead wins \
                 (0.24–0.30×), as the report also saw for sequential workloads",
            ),
        },
        Check {
            name: "mean over workloads (SLC, MLC): NVMM / all-DRAM (≤ 2)",
            measured: geomean(&slowdowns),
            low: 1.0,
            high: 2.0,
            known_miss: Some(
                "our workloads all miss by design (footprints 2× the DRAM), so a flash read \
                 ~2000× a DRAM access dominates; the report's average is over programs whose \
                 working sets mostly fit. The hit-path check below is the part we can check",
            ),
        },
    ]);
}

#[test]
fn ssd_hardware_time_per_fault_against_the_reports_measurement() {
    // The report measured 38.9 µs (SLC, 25 µs) and 88.8 µs (MLC, 75 µs) of
    // hardware time per MMAP access; the model's comes from its flash,
    // controller and link, the software time is the report's. Not
    // independent evidence: `ssd.controller_ns` (2 µs, an assumption) was
    // chosen with these figures in view (38.9 − 25 − 10.24 µs of transfer
    // leaves ~3.4 µs for command, controller and link).
    let mut checks = Vec::new();
    for (read_ns, measured_us, name) in [
        (25_000, 38.9, "SSD hardware time per fault, SLC (38.9 µs)"),
        (75_000, 88.8, "SSD hardware time per fault, MLC (88.8 µs)"),
    ] {
        let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
        c.flash.read_ns = read_ns;
        let w = standard_workload(&c, WorkloadKind::Mmap, 1, None, RATIO).unwrap();
        let r = run(&c, SystemKind::Ssd, &w, SEED).unwrap();
        let s = r.ssd.unwrap();
        let hw_us = s.fault_hardware_ns as f64 / s.faults as f64 / 1000.0;
        checks.push(Check {
            name,
            measured: hw_us,
            low: measured_us * 0.8,
            high: measured_us * 1.2,
            known_miss: None,
        });
    }
    verify(&checks);
}

#[test]
fn same_seed_same_numbers() {
    let c = NvmmConfig::preset("nvmm-slc").unwrap();
    let w = standard_workload(&c, WorkloadKind::Gups, 4, Some(3000), RATIO).unwrap();
    for system in [SystemKind::Nvmm, SystemKind::Ssd] {
        let a = run(&c, system, &w, 7).unwrap();
        let b = run(&c, system, &w, 7).unwrap();
        assert_eq!(a, b);
        let other = run(&c, system, &w, 8).unwrap();
        assert_ne!(a.elapsed_ns, other.elapsed_ns, "the seed should matter");
    }
}

#[test]
fn wear_against_the_reports_estimates() {
    // SPEC §7: one 8 Gb device loses half its capacity in under two days
    // and is worn out in three; 1000 devices: 2–3 years and 4–5 years. The
    // write rate of "moderate load" is not given, so only the shape can be
    // checked: worn out some time after half is retired (3 / 2 = 1.5×; 4–5
    // / 2–3 years = 1.3–2.5×).
    let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
    c.flash.blocks_per_plane = 8;
    let r = wear(&c, 50e6, 0.25, 1000, SEED).unwrap();
    println!(
        "  wear: half retired after {:.3} days, worn out after {:.3} days (one 8 Gb device at \
         50 MB/s), {:.1}% retired at the end, write amplification {:.2}",
        r.days_to_half_one_8gb_device,
        r.days_to_end_one_8gb_device,
        r.retired_fraction_at_end * 100.0,
        r.write_amplification
    );
    verify(&[Check {
        name: "wear: worn out / half retired (1.5×)",
        measured: r.days_to_end_one_8gb_device / r.days_to_half_one_8gb_device,
        low: 1.3,
        high: 2.5,
        known_miss: Some(
            "with a quarter of the flash live, writes stop fitting (a page's segments need \
             good pages at +0/+8/+16/+24 of one block, and collection needs free blocks) \
             when about half the pages are retired, so the end comes with the half; the \
             report does not say how full its devices were",
        ),
    }]);
}
