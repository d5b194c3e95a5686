//! The papers' published orderings, "A beats B", from the model: stack
//! order (MICRO'10 §IV, dissertation ch. 3), completion techniques
//! (dissertation §4.3.4, Figs. 4.5–4.6), synchronous against asynchronous
//! IO (§4.4.4, Fig. 4.11), Moneta-D against the kernel stack through a file
//! system (§4.4), Onyx's early against late write completion and its 4 KB
//! stripe against others (the Onyx thesis §4.1.1, §5.2), QuickSAN-D
//! against iSCSI (ch. 5, Table 5.1 and the bandwidth statements) and NVMM's
//! prefetch and its SSD baseline (the UMD report's §5, SPEC §7).
//!
//! A number within its tolerance can still tell a reader the opposite of
//! the paper (a ratio of 0.86 where the paper has 1.21 is inside no band
//! but a band around 1 would hide it); an ordering checks only the
//! direction. Each is measured on the same set-ups as the calibration
//! checks (`calibration`, `nvmm::calibration`). Orderings the model still
//! inverts are in [`KNOWN_INVERSIONS`] with why; `tests/orderings.rs`
//! holds every other one, and each known one to still being inverted.

use crate::calibration::{self, AsyncPoint, CompletionPoint, SEED};
use crate::config::{Completion, Config, Stack};
use crate::nvmm::calibration::compare;
use crate::nvmm::workload::WorkloadKind;
use crate::san::calibration_runs::QuicksanRuns;
use crate::summary::xdd_point;
use crate::workload::{OpMix, RunLimit};
use serde::Serialize;

/// One published ordering: `winner` should measure better than `loser`.
#[derive(Debug, Clone, Serialize)]
pub struct Ordering {
    pub name: String,
    pub source: &'static str,
    /// The measure of the side the paper has winning, and of the other.
    pub winner: f64,
    pub loser: f64,
    pub unit: &'static str,
    /// Lower is better (latency, time): the winner must measure less.
    pub lower_is_better: bool,
}

impl Ordering {
    pub fn holds(&self) -> bool {
        if self.lower_is_better {
            self.winner < self.loser
        } else {
            self.winner > self.loser
        }
    }

    /// The winner's advantage as the paper states it (> 1 when it holds).
    pub fn ratio(&self) -> f64 {
        if self.lower_is_better {
            self.loser / self.winner
        } else {
            self.winner / self.loser
        }
    }
}

/// Orderings the model inverts, with why (README "Fidelity").
pub const KNOWN_INVERSIONS: &[(&str, &str)] = &[
    ("DMA beats issue-sleep, 4096 B", DMA_IN_FLIGHT),
    ("DMA beats issue-sleep, 8192 B", DMA_IN_FLIGHT),
    (
        "8 threads: synchronous beats asynchronous, 512 B",
        ASYNC_COST,
    ),
    (
        "8 threads: synchronous beats asynchronous, 1024 B",
        ASYNC_COST,
    ),
    (
        "8 threads: synchronous beats asynchronous, 2048 B",
        ASYNC_COST,
    ),
    (
        "Onyx read bandwidth, 16 threads, mean over 1–64 KB: a 4 KB stripe beats 1 KB",
        ONYX_STRIPE,
    ),
    ("GUPS 1 thread at MLC: prefetch beats none", NVMM_PREFETCH),
    (
        "GUPS at MLC, prefetch: NVMM's margin over the SSD is wider with 8 threads than with 1",
        NVMM_THREADS,
    ),
    (
        "MMAP at MLC, no prefetch: NVMM's margin over the SSD is wider with 8 threads than with 1",
        NVMM_THREADS,
    ),
    (
        "MMAP 1 thread at 150 µs, no prefetch: the SSD beats NVMM",
        NVMM_MISS_COST,
    ),
    (
        "MMAP 1 thread at 750 µs, no prefetch: the SSD beats NVMM",
        NVMM_MISS_COST,
    ),
];

const DMA_IN_FLIGHT: &str = "From 4 KB the spinning techniques hold a core per request in flight: 32 threads on the host's 8 cores keep 8 requests in the device, while issue-sleep's sleepers keep up to 32, so issue-sleep reaches the link first (calibration COMPLETION_COST). Fig. 4.5's DMA lead up to 8 KB needs more requests in flight per spinning core than one, i.e. more hardware thread contexts than the 8 cores the model's host has (the E5520 has two per core; ch. 4 speaks of 'Nehalem thread contexts'). The model has them (host.threads_per_core), off in every preset: with 2 and spinners that take none of their core, DMA / issue-sleep at 4 and 8 KB rises only to 0.98× and 0.97× (issue-sleep is near the link already), while Moneta-D's 16-thread 512 B writes reach 3.0M/s against the published 1.8M; with siblings that share their core at Hyper-Threading's public 0.65 (host.smt_sibling_share) the same 0.98× / 0.97× and 2.9M/s (docs/src/fidelity/rejected.md).";
const ASYNC_COST: &str = "The model has no cost for the library's asynchronous request bookkeeping or for contention on tag allocation, which §4.4.4 names as the reason small asynchronous requests lose with 8 threads but does not quantify (calibration ASYNC_COST).";
const ONYX_STRIPE: &str = "The thesis's 1 KB stripe loses 'because of the transfer buffer space allocation in Onyx, not enough 1 KB requests reach the memory controller to provide the appropriate read parallelism' (§5.2); the model's Onyx allocates a transfer buffer per request, whatever the stripe, so a 1 KB stripe spreads each read over more controllers and wins (923 MB/s with 4 KB against 1081 MB/s with 1 KB, mean over 1-64 KB, 16 threads, seed 1). The allocation scheme that starves the controllers is not described beyond that sentence.";
const NVMM_PREFETCH: &str = "GUPS starts with the DRAM full of the table's tail (clean, HybridSim's prefill) and updates uniformly at random, so the hit rate is the resident fraction whatever is prefetched; prefetch's reads cost without a hit-rate gain (nvmm::calibration KNOWN_MISSES). The report's \"birthday\" gain needs ways holding no table data; it does not say where the table was when the measured run began.";
const NVMM_THREADS: &str = "With one core per thread (cpu.cores = 8) the SSD's faults overlap as NVMM's misses do, so the SSD gains from 8 threads as much as NVMM (GUPS with prefetch 1.92× → 1.80×, MMAP without 1.75× → 1.73×); the report's wider margin says the SSD path scales worse with threads, by kernel paging costs under concurrency that its software-time table (one thread) does not give (nvmm::calibration KNOWN_MISSES, MMAP 8 threads).";
const NVMM_MISS_COST: &str = "An NVMM miss costs the flash read and the page's transfer; the SSD pays the flash read plus its software per fault, so the model's SSD cannot pass NVMM (nvmm::calibration KNOWN_MISSES); the report publishes the SSD's time per access, not NVMM's.";

/// Why an ordering is inverted, if it is a documented inversion.
pub fn known_inversion(name: &str) -> Option<&'static str> {
    KNOWN_INVERSIONS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

fn ordering(
    name: String,
    source: &'static str,
    winner: f64,
    loser: f64,
    unit: &'static str,
    lower_is_better: bool,
) -> Ordering {
    Ordering {
        name,
        source,
        winner,
        loser,
        unit,
        lower_is_better,
    }
}

fn preset(name: &str, stack: Stack) -> Config {
    let mut c = Config::preset(name).expect("shipped preset");
    c.set_stack(stack);
    c
}

fn latency_us(c: &Config, op: OpMix, size: u64) -> f64 {
    xdd_point(c, op, size, 1, RunLimit::Ops(5_000), SEED)
        .expect("ordering point runs")
        .latency_us_mean
}

fn bandwidth(c: &Config, op: OpMix, size: u64, threads: u32) -> f64 {
    xdd_point(c, op, size, threads, RunLimit::Ops(40_000), SEED)
        .expect("ordering point runs")
        .bandwidth_mb_per_s
}

/// MICRO'10 §IV / Fig. 3: each software step lowers the 4 KB latency (the
/// mean of read and write), 2Q raises Spin's peak bandwidth (§IV.D), and
/// Moneta-D beats the kernel stack through a file system (dissertation
/// §4.4.1–4.4.2).
pub fn stacks() -> Vec<Ordering> {
    let src = "MICRO'10 §IV, Fig. 3 (SPEC §2.1–2.2)";
    let steps = [Stack::Base, Stack::NoSched, Stack::Atomic, Stack::Spin];
    let lat: Vec<f64> = steps
        .iter()
        .map(|&s| {
            let c = preset("moneta-micro10", s);
            (latency_us(&c, OpMix::Read, 4096) + latency_us(&c, OpMix::Write, 4096)) / 2.0
        })
        .collect();
    let mut v: Vec<Ordering> = steps
        .windows(2)
        .zip(lat.windows(2))
        .map(|(s, l)| {
            ordering(
                format!("4 KB latency: Moneta+{:?} beats Moneta+{:?}", s[1], s[0]),
                src,
                l[1],
                l[0],
                "µs",
                true,
            )
        })
        .collect();
    // Spin on the FIFO baseline's two buffers, 2Q as §V ran it.
    let peak = |stack| {
        let c = match stack {
            Stack::Spin => preset("moneta-micro10", stack),
            _ => calibration::section_v(stack),
        };
        [4096, 8192, 16384, 65536]
            .into_iter()
            .map(|size| bandwidth(&c, OpMix::Mixed(0.5), size, 16))
            .fold(0.0, f64::max)
    };
    v.push(ordering(
        "peak 50/50 bandwidth: Moneta+2Q beats Moneta+Spin".into(),
        "MICRO'10 §IV.D (SPEC §2.2)",
        peak(Stack::TwoQueue),
        peak(Stack::Spin),
        "MB/s",
        false,
    ));
    let direct = preset("moneta-d", Stack::Direct);
    let kernel_fs = calibration::kernel_with_file_system();
    let src = "dissertation §4.4.1–4.4.2 (SPEC §3.5)";
    for op in [OpMix::Read, OpMix::Write] {
        v.push(ordering(
            format!("512 B {} latency: Moneta-D beats Moneta + FS", op.name()),
            src,
            latency_us(&direct, op, 512),
            latency_us(&kernel_fs, op, 512),
            "µs",
            true,
        ));
        for size in [512, 4096] {
            v.push(ordering(
                format!(
                    "{size} B {} bandwidth, 16 threads: Moneta-D beats Moneta + FS",
                    op.name()
                ),
                src,
                bandwidth(&direct, op, size, 16),
                bandwidth(&kernel_fs, op, size, 16),
                "MB/s",
                false,
            ));
        }
    }
    v
}

/// The rest of chapter 3's and chapter 4's statements that put one set-up
/// above another (MICRO'10 §IV–§V, dissertation §3.3–§3.4, §4.4): each
/// step's bandwidth claim, Balance's fairness, the latency sweep's extra
/// controllers, the abstract's final design over Base, and Moneta-D against
/// the interrupt-completing kernel baseline with and without its file
/// system. Measured on the calibration checks' set-ups.
pub fn moneta_steps() -> Vec<Ordering> {
    let micro = |s| preset("moneta-micro10", s);
    let steps = "MICRO'10 §IV (seed 000); dissertation §3.3";
    let mut v = vec![
        // "increases peak bandwidth by 4× for 4 KB requests".
        ordering(
            "4 KB read bandwidth, 16 threads: Moneta+NoSched beats Moneta+Base".into(),
            steps,
            bandwidth(&micro(Stack::NoSched), OpMix::Read, 4096, 16),
            bandwidth(&micro(Stack::Base), OpMix::Read, 4096, 16),
            "MB/s",
            false,
        ),
        // "increases bandwidth by 460 MB/s for 4 KB writes".
        ordering(
            "4 KB write bandwidth, 16 threads: Moneta+Atomic beats Moneta+NoSched".into(),
            steps,
            bandwidth(&micro(Stack::Atomic), OpMix::Write, 4096, 16),
            bandwidth(&micro(Stack::NoSched), OpMix::Write, 4096, 16),
            "MB/s",
            false,
        ),
    ];
    // "Moneta+Spin improves bandwidth for 512-4096 byte requests by up to
    // 250 MB/s": Spin ahead of Atomic at its best small size and op.
    let (spin, atomic) = (micro(Stack::Spin), micro(Stack::Atomic));
    let best = [OpMix::Read, OpMix::Write, OpMix::Mixed(0.5)]
        .into_iter()
        .flat_map(|op| [512, 1024, 2048, 4096].map(move |size| (op, size)))
        .map(|(op, size)| {
            (
                bandwidth(&spin, op, size, 16),
                bandwidth(&atomic, op, size, 16),
            )
        })
        .max_by(|a, b| (a.0 - a.1).total_cmp(&(b.0 - b.1)))
        .expect("sizes");
    v.push(ordering(
        "small-request bandwidth, 16 threads, best of 512 B–4 KB: Moneta+Spin beats Moneta+Atomic"
            .into(),
        steps,
        best.0,
        best.1,
        "MB/s",
        false,
    ));
    // The abstract's "increases performance for small, random accesses by
    // 18x": the final design (Balance, §V's buffers) over Base, 512 B.
    let balance = calibration::section_v(Stack::Balance);
    for op in [OpMix::Read, OpMix::Write] {
        v.push(ordering(
            format!(
                "512 B {} bandwidth, 16 threads: Moneta+Balance beats Moneta+Base",
                op.name()
            ),
            "MICRO'10 abstract (seed 000)",
            bandwidth(&balance, op, 512, 16),
            bandwidth(&micro(Stack::Base), op, 512, 16),
            "MB/s",
            false,
        ));
    }
    // §V.B: Balance gives the 4 KB threads beside 512 KB threads more
    // bandwidth than 2Q did (16 MB/s before, 12× after).
    let small = |stack| {
        let c = calibration::section_v(stack);
        let w = crate::workload::Workload::fairness(
            4,
            4096,
            4,
            512 << 10,
            crate::summary::default_region_bytes(&c),
            RunLimit::Ops(20_000),
            SEED,
        );
        let r = crate::experiment::run(&c, &w).expect("fairness runs");
        crate::experiment::rate(r.groups[0].bytes, r.elapsed_ns) / 1e6
    };
    v.push(ordering(
        "4 KB threads beside 512 KB threads: Moneta+Balance beats Moneta+2Q".into(),
        "MICRO'10 §V.B (SPEC §2.2)",
        small(Stack::Balance),
        small(Stack::TwoQueue),
        "MB/s",
        false,
    ));
    // Fig. 4 / Fig. 3.4: "Additional controllers allow Moneta to hide
    // longer memory latencies"; 4 µs costs 8 controllers 20% of 4 ns's.
    let sweep = |controllers: u32, latency_ns: u64| {
        let mut c = calibration::section_v(Stack::Balance);
        c.set(&format!("memory.controllers={controllers}"))
            .expect("valid");
        c.memory.latency_ns_read = latency_ns;
        c.memory.latency_ns_write = latency_ns;
        (bandwidth(&c, OpMix::Read, 4096, 16) + bandwidth(&c, OpMix::Write, 4096, 16)) / 2.0
    };
    let src = "MICRO'10 Fig. 4 text, dissertation Fig. 3.4 (SPEC §2.2)";
    let us4_8 = sweep(8, 4000);
    v.push(ordering(
        "4 KB bandwidth at 4 µs: 8 controllers beat 4".into(),
        src,
        us4_8,
        sweep(4, 4000),
        "MB/s",
        false,
    ));
    v.push(ordering(
        "4 KB bandwidth, 8 controllers: 4 ns memory beats 4 µs".into(),
        src,
        sweep(8, 4),
        us4_8,
        "MB/s",
        false,
    ));
    // Chapter 4: Moneta-D against the interrupt-completing baseline.
    let direct = preset("moneta-d", Stack::Direct);
    let raw = calibration::kernel_baseline();
    let kernel_fs = calibration::kernel_with_file_system();
    v.push(ordering(
        "512 B read latency: Moneta-D beats Moneta without a file system".into(),
        "dissertation ch. 4 introduction \"by 64%\" (SPEC §3.5)",
        latency_us(&direct, OpMix::Read, 512),
        latency_us(&raw, OpMix::Read, 512),
        "µs",
        true,
    ));
    for op in [OpMix::Read, OpMix::Write] {
        v.push(ordering(
            format!("4 KB {} latency: Moneta-D beats Moneta + FS", op.name()),
            "dissertation §4.5 \"58%\", \"60%\" (SPEC §3.5)",
            latency_us(&direct, op, 4096),
            latency_us(&kernel_fs, op, 4096),
            "µs",
            true,
        ));
    }
    // §4.3.4: "Interrupt forwarding and DMA completion all have similar
    // latencies – between 2.5 and 2.7 µs. Issue-sleep takes over 14 µs"
    // (Table 4.2's completion rows, 512 B, one thread).
    let mut sleep = preset("moneta-d", Stack::Direct);
    sleep.direct.completion = Completion::IssueSleep;
    for op in [OpMix::Read, OpMix::Write] {
        v.push(ordering(
            format!(
                "512 B {} latency: DMA completion beats issue-sleep",
                op.name()
            ),
            "dissertation §4.3.4, Table 4.2 (seed 002)",
            latency_us(&direct, op, 512),
            latency_us(&sleep, op, 512),
            "µs",
            true,
        ));
    }
    // §4.4.2: "Adding a file system reduces performance for the original
    // Moneta system by up to 13×" (writes), reads lose "at most 34%".
    for op in [OpMix::Read, OpMix::Write] {
        v.push(ordering(
            format!(
                "512 B {} bandwidth, 16 threads: Moneta beats Moneta + FS",
                op.name()
            ),
            "dissertation §4.4.2 (seed 002)",
            bandwidth(&raw, op, 512, 16),
            bandwidth(&kernel_fs, op, 512, 16),
            "MB/s",
            false,
        ));
    }
    v
}

/// The Onyx thesis (seed 004): early write completion "allows Onyx to
/// overlap PCM write times with the request latency through the system"
/// (§4.1.1, "Request Completion"), so early beats late for writes; "A 4 KB
/// stripe size provides the best read performance in Onyx" (Graph 5.2,
/// §5.2), against smaller stripes ("not enough 1 KB requests reach the
/// memory controller") and larger ones. The tables behind both are
/// withheld: only the orderings are checked, on the presets' set-ups (16
/// XDD threads, §5.1).
pub fn onyx() -> Vec<Ordering> {
    let early = preset("onyx-early", Stack::Spin);
    let late = preset("onyx-late", Stack::Spin);
    let completion = "Onyx thesis §4.1.1, Request Completion (seed 004)";
    let mut v = vec![
        ordering(
            "Onyx 4 KB write latency: early completion beats late".into(),
            completion,
            latency_us(&early, OpMix::Write, 4096),
            latency_us(&late, OpMix::Write, 4096),
            "µs",
            true,
        ),
        ordering(
            "Onyx 4 KB write bandwidth, 16 threads: early completion beats late".into(),
            completion,
            bandwidth(&early, OpMix::Write, 4096, 16),
            bandwidth(&late, OpMix::Write, 4096, 16),
            "MB/s",
            false,
        ),
    ];
    // Graph 5.2: read bandwidth across request sizes; "best" read as the
    // mean over the sizes Graph 5.2 spans that every stripe serves.
    let reads = |stripe: u64| {
        let mut c = preset("onyx-early", Stack::Spin);
        c.set(&format!("memory.stripe_bytes={stripe}"))
            .expect("a valid stripe");
        let sizes = [1024, 4096, 16384, 65536];
        sizes
            .iter()
            .map(|&size| bandwidth(&c, OpMix::Read, size, 16))
            .sum::<f64>()
            / sizes.len() as f64
    };
    let four = reads(4096);
    for other in [1024, 16384] {
        v.push(ordering(
            format!(
                "Onyx read bandwidth, 16 threads, mean over 1–64 KB: a 4 KB stripe beats {} KB",
                other / 1024
            ),
            "Onyx thesis §5.2, Graph 5.2 (seed 004)",
            four,
            reads(other),
            "MB/s",
            false,
        ));
    }
    v
}

/// Fig. 4.5: DMA completion beats interrupt forwarding and issue-sleep by
/// 21–171% for accesses up to 8 KB; Fig. 4.6: issue-sleep is the most
/// efficient (bandwidth per CPU) for larger accesses (from 8 KB, "the
/// best choice for accesses of 8 KB or larger because it is more
/// CPU-efficient").
pub fn completions(points: &[CompletionPoint]) -> Vec<Ordering> {
    let at = |completion, size| {
        points
            .iter()
            .find(|p: &&CompletionPoint| p.completion == completion && p.size_bytes == size)
            .expect("a point per completion and size")
    };
    let mut v = Vec::new();
    for size in calibration::COMPLETION_SIZES {
        if size <= 1024 {
            // Figs. 4.5-4.6 captions: "For small accesses, DMA completion
            // is the best alternative by both measures" (taken as 512 B
            // and 1 KB, the sizes below the text's 2 KB-and-up discussion).
            for (other, label) in [
                (Completion::Forwarding, "interrupt forwarding"),
                (Completion::IssueSleep, "issue-sleep"),
            ] {
                v.push(ordering(
                    format!("bandwidth per CPU: DMA beats {label}, {size} B"),
                    "dissertation §4.3.4, Figs. 4.5-4.6 captions (SPEC §3.5)",
                    at(Completion::Dma, size).mb_per_s_per_cpu,
                    at(other, size).mb_per_s_per_cpu,
                    "MB/s per CPU",
                    false,
                ));
            }
        }
        if size <= 8192 {
            for (other, label) in [
                (Completion::Forwarding, "interrupt forwarding"),
                (Completion::IssueSleep, "issue-sleep"),
            ] {
                v.push(ordering(
                    format!("DMA beats {label}, {size} B"),
                    "dissertation §4.3.4, Fig. 4.5 (SPEC §3.5)",
                    at(Completion::Dma, size).bandwidth_mb_per_s,
                    at(other, size).bandwidth_mb_per_s,
                    "MB/s",
                    false,
                ));
            }
        } else {
            let spinning = at(Completion::Dma, size)
                .mb_per_s_per_cpu
                .max(at(Completion::Forwarding, size).mb_per_s_per_cpu);
            v.push(ordering(
                format!("bandwidth per CPU: issue-sleep beats spinning, {size} B"),
                "dissertation §4.3.4, Fig. 4.6 (SPEC §3.5)",
                at(Completion::IssueSleep, size).mb_per_s_per_cpu,
                spinning,
                "MB/s per CPU",
                false,
            ));
        }
    }
    v
}

/// Fig. 4.11 (§4.4.4): with 1 thread asynchronous IO beats synchronous at
/// every size 512 B–256 KB; with 8 threads it does from 4 KB, and loses
/// below.
pub fn asynchronous(points: &[AsyncPoint]) -> Vec<Ordering> {
    let at = |threads, asynchronous: bool, size| {
        points
            .iter()
            .find(|p: &&AsyncPoint| {
                p.threads == threads && (p.queue_depth > 1) == asynchronous && p.size_bytes == size
            })
            .expect("a point per thread count, interface and size")
            .bandwidth_mb_per_s
    };
    let src = "dissertation §4.4.4, Fig. 4.11 (SPEC §3.5)";
    let per_cpu = |asynchronous: bool| {
        points
            .iter()
            .find(|p| {
                p.threads == 1 && (p.queue_depth > 1) == asynchronous && p.size_bytes == 16384
            })
            .expect("a 1-thread 16 KB point per interface")
            .mb_per_s_per_cpu
    };
    // Fig. 4.12: "for one thread, asynchronous requests are 2.8× more
    // efficient than synchronous requests" (16 KB).
    let mut v = vec![ordering(
        "1 thread, 16 KB, bandwidth per CPU: asynchronous beats synchronous".into(),
        "dissertation §4.4.4, Fig. 4.12 (SPEC §3.5)",
        per_cpu(true),
        per_cpu(false),
        "MB/s per CPU",
        false,
    )];
    for size in calibration::COMPLETION_SIZES {
        v.push(ordering(
            format!("1 thread: asynchronous beats synchronous, {size} B"),
            src,
            at(1, true, size),
            at(1, false, size),
            "MB/s",
            false,
        ));
        let (winner, loser, name) = if size >= 4096 {
            (true, false, "asynchronous beats synchronous")
        } else {
            (false, true, "synchronous beats asynchronous")
        };
        v.push(ordering(
            format!("8 threads: {name}, {size} B"),
            src,
            at(8, winner, size),
            at(8, loser, size),
            "MB/s",
            false,
        ));
    }
    v
}

/// Chapter 5: QuickSAN-D beats iSCSI in latency (Table 5.1, "reduces
/// overall latency by 93%") and in bandwidth at every size ("improves
/// bandwidth by 14.7× for 4 KB requests", "up to 167×" for small ones);
/// QuickSAN-D beats QuickSAN-OS in latency (Table 5.1) and in bandwidth for
/// small requests and writes (Fig. 5.5: "QuickSAN-D's userspace interface
/// delivers especially large gains for small accesses and writes");
/// QuickSAN-OS beats iSCSI in latency (Table 5.1) and bandwidth (Fig. 5.5:
/// "Eliminating software and block transport overheads improves bandwidth
/// performance for all configurations"); energy per 4 KB request (§5.4.7):
/// both QuickSAN stacks below iSCSI for reads, writes and the 50/50 mix
/// ("6.2 and 12.7× more energy per IOP than the QuickSAN-OS and between
/// 13.2 and 27.4× more than QuickSAN-D"), QuickSAN-D below QuickSAN-OS for
/// writes ("increases (QuickSAN-OS) energy costs by 4× relative to
/// QuickSAN-D"). Distributed, 4 nodes, 8 threads per host, as the
/// calibration checks.
pub fn quicksan() -> Vec<Ordering> {
    quicksan_orderings(&QuicksanRuns::run(SEED))
}

/// [`quicksan`]'s orderings on the calibration's runs made already
/// (`moneta report` reads the same runs for the checks). The bandwidth
/// orderings run their own sweep: three stacks at four sizes up to 1 MiB,
/// 4,000 requests per point, which the checks do not measure.
pub fn quicksan_orderings(runs: &QuicksanRuns) -> Vec<Ordering> {
    use crate::san::calibration_runs::{distributed, setup, THREE_STACKS};
    use crate::san::experiments::{bandwidth, mb_per_s_per_host};
    use crate::san::interfaces::Interface;
    let remote = |i: Interface, op: &str| runs.remote(i, op).latency_us_mean;
    let mut v = Vec::new();
    for op in ["read", "write"] {
        for (winner, loser, label) in [
            (
                Interface::QuicksanD,
                Interface::Iscsi,
                "QuickSAN-D beats iSCSI",
            ),
            (
                Interface::QuicksanD,
                Interface::QuicksanOs,
                "QuickSAN-D beats QuickSAN-OS",
            ),
            (
                Interface::QuicksanOs,
                Interface::Iscsi,
                "QuickSAN-OS beats iSCSI",
            ),
        ] {
            v.push(ordering(
                format!("remote 4 KB {op} latency: {label}"),
                "Table 5.1 (SPEC §4.2)",
                remote(winner, op),
                remote(loser, op),
                "µs",
                true,
            ));
        }
    }
    // Every size of `moneta san sim bandwidth`'s sweep (Fig. 5.5's axis,
    // 512 B … 256 KB) and 1 MB; reads, writes and the 50/50 mix.
    let sizes = [
        512,
        1024,
        2048,
        4096,
        8192,
        16384,
        32768,
        65536,
        131072,
        262144,
        1 << 20,
    ];
    let bw_mixes = [OpMix::Read, OpMix::Write, OpMix::Mixed(0.5)];
    let bw = bandwidth(
        &setup(SEED, 4_000),
        &THREE_STACKS,
        distributed(),
        false,
        &bw_mixes,
        &sizes,
        &mut |_, _, _| {},
    )
    .expect("bandwidth runs");
    let per_host = |i: Interface, op: &str, size: u64| mb_per_s_per_host(&bw, i, op, size);
    let fig_5_5 = "dissertation Fig. 5.5 caption";
    for op in ["read", "write", "mixed"] {
        for size in sizes {
            v.push(ordering(
                format!("{size} B {op} bandwidth per host: QuickSAN-D beats iSCSI"),
                "dissertation ch. 5 introduction and §5.5",
                per_host(Interface::QuicksanD, op, size),
                per_host(Interface::Iscsi, op, size),
                "MB/s",
                false,
            ));
            v.push(ordering(
                format!("{size} B {op} bandwidth per host: QuickSAN-OS beats iSCSI"),
                fig_5_5,
                per_host(Interface::QuicksanOs, op, size),
                per_host(Interface::Iscsi, op, size),
                "MB/s",
                false,
            ));
        }
    }
    for (op, size) in [("read", 512), ("write", 512), ("write", 4096)] {
        v.push(ordering(
            format!("{size} B {op} bandwidth per host: QuickSAN-D beats QuickSAN-OS"),
            fig_5_5,
            per_host(Interface::QuicksanD, op, size),
            per_host(Interface::QuicksanOs, op, size),
            "MB/s",
            false,
        ));
    }
    let joules = |i: Interface, op: &str| runs.joules_per_op(i, op);
    let src = "dissertation §5.4.7 (SPEC §4.4)";
    for op in ["read", "write", "mixed"] {
        for (winner, label) in [
            (Interface::QuicksanOs, "QuickSAN-OS"),
            (Interface::QuicksanD, "QuickSAN-D"),
        ] {
            v.push(ordering(
                format!("energy per 4 KB {op}: {label} beats iSCSI"),
                src,
                joules(winner, op),
                joules(Interface::Iscsi, op),
                "J",
                true,
            ));
        }
    }
    v.push(ordering(
        "energy per 4 KB write: QuickSAN-D beats QuickSAN-OS".into(),
        src,
        joules(Interface::QuicksanD, "write"),
        joules(Interface::QuicksanOs, "write"),
        "J",
        true,
    ));
    v
}

/// The UMD report's §5 (SPEC §7), on the calibration's set-up (preset
/// `nvmm-mlc`, footprint 2× the DRAM, the report's access counts): NVMM's
/// prefetch of 16 pages helps GUPS and MMAP at the MLC latency and hurts
/// GUPS at 750 µs; NVMM beats the SSD at MLC with and without prefetch; the
/// SSD passes NVMM at 150 µs (MMAP, 1 thread, no prefetch) and beyond;
/// "multithreading and prefetching push this crossover point beyond the
/// 750000 ns point".
pub fn nvmm() -> Vec<Ordering> {
    const MLC: u64 = 75_000;
    let src = "NVMM report §5 (SPEC §7)";
    let elapsed = |kind, read_ns, threads, prefetch| {
        compare(kind, read_ns, threads, prefetch).nvmm_elapsed_ns as f64
    };
    let mut v = Vec::new();
    for (kind, name, threads) in [
        (WorkloadKind::Gups, "GUPS", 1),
        (WorkloadKind::Mmap, "MMAP", 1),
        (WorkloadKind::Mmap, "MMAP", 8),
    ] {
        v.push(ordering(
            format!(
                "{name} {threads} thread{} at MLC: prefetch beats none",
                plural(threads)
            ),
            src,
            elapsed(kind, MLC, threads, 16),
            elapsed(kind, MLC, threads, 0),
            "ns",
            true,
        ));
    }
    v.push(ordering(
        "GUPS 1 thread at 750 µs: no prefetch beats prefetch".into(),
        src,
        elapsed(WorkloadKind::Gups, 750_000, 1, 0),
        elapsed(WorkloadKind::Gups, 750_000, 1, 16),
        "ns",
        true,
    ));
    for (kind, name, threads, prefetch) in [
        (WorkloadKind::Gups, "GUPS", 1, 0),
        (WorkloadKind::Gups, "GUPS", 1, 16),
        (WorkloadKind::Gups, "GUPS", 8, 16),
        (WorkloadKind::Mmap, "MMAP", 8, 0),
        (WorkloadKind::Mmap, "MMAP", 8, 16),
    ] {
        let p = compare(kind, MLC, threads, prefetch);
        v.push(ordering(
            format!(
                "{name} {threads} thread{} at MLC, {}: NVMM beats the SSD",
                plural(threads),
                if prefetch > 0 {
                    "prefetch"
                } else {
                    "no prefetch"
                }
            ),
            src,
            p.nvmm_elapsed_ns as f64,
            p.ssd_elapsed_ns as f64,
            "ns",
            true,
        ));
    }
    for read_ns in [150_000, 750_000] {
        let p = compare(WorkloadKind::Mmap, read_ns, 1, 0);
        v.push(ordering(
            format!(
                "MMAP 1 thread at {} µs, no prefetch: the SSD beats NVMM",
                read_ns / 1000
            ),
            src,
            p.ssd_elapsed_ns as f64,
            p.nvmm_elapsed_ns as f64,
            "ns",
            true,
        ));
    }
    let p = compare(WorkloadKind::Mmap, 750_000, 8, 16);
    v.push(ordering(
        "MMAP 8 threads at 750 µs, prefetch: NVMM beats the SSD".into(),
        src,
        p.nvmm_elapsed_ns as f64,
        p.ssd_elapsed_ns as f64,
        "ns",
        true,
    ));
    // Threads widen NVMM's margin over the SSD: GUPS with prefetch "The
    // introduction of multiple threads increases the performance margin
    // between Hybrid and the SSD even more to a 4.7x speedup" (from 3.7×);
    // MMAP without prefetch from "roughly the same" to "a 3x speedup".
    for (kind, name, prefetch) in [
        (WorkloadKind::Gups, "GUPS", 16),
        (WorkloadKind::Mmap, "MMAP", 0),
    ] {
        v.push(ordering(
            format!(
                "{name} at MLC, {}: NVMM's margin over the SSD is wider with 8 threads than with 1",
                if prefetch > 0 {
                    "prefetch"
                } else {
                    "no prefetch"
                }
            ),
            src,
            compare(kind, MLC, 8, prefetch).speedup_over_ssd,
            compare(kind, MLC, 1, prefetch).speedup_over_ssd,
            "×",
            false,
        ));
    }
    // MMAP: "switching to the multithreaded case results in a large
    // increase in performance for both the SSD and the Hybrid
    // architecture" (the same 10,000 reads, by 8 threads against 1).
    let one = compare(WorkloadKind::Mmap, MLC, 1, 0);
    let eight = compare(WorkloadKind::Mmap, MLC, 8, 0);
    for (system, multi, single) in [
        ("NVMM", eight.nvmm_elapsed_ns, one.nvmm_elapsed_ns),
        ("the SSD", eight.ssd_elapsed_ns, one.ssd_elapsed_ns),
    ] {
        v.push(ordering(
            format!("MMAP at MLC, no prefetch: {system} is faster with 8 threads than with 1"),
            src,
            multi as f64,
            single as f64,
            "ns",
            true,
        ));
    }
    // "Prefetching has a greater effect for MMAP than it did for GUPS":
    // NVMM's time without prefetch over its time with it, one thread.
    let gain = |kind| elapsed(kind, MLC, 1, 0) / elapsed(kind, MLC, 1, 16);
    v.push(ordering(
        "1 thread at MLC: prefetch gains more for MMAP than for GUPS".into(),
        src,
        gain(WorkloadKind::Mmap),
        gain(WorkloadKind::Gups),
        "×",
        false,
    ));
    v
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Every published ordering, in the order above (the completion and
/// asynchronous sweeps at the calibration's seed and request counts).
pub fn all() -> Vec<Ordering> {
    let mut v = stacks();
    v.extend(moneta_steps());
    v.extend(onyx());
    v.extend(completions(
        &calibration::completion_sweep(calibration::COMPLETION_OPS, SEED)
            .expect("completion sweep runs"),
    ));
    v.extend(asynchronous(
        &calibration::async_sweep(calibration::ASYNC_OPS, SEED).expect("asynchronous sweep runs"),
    ));
    v.extend(quicksan());
    v.extend(nvmm());
    v
}
