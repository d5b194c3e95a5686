//! Calibration: the model's predictions beside the published numbers of
//! SPEC §1.9, §2.2, §2.3 and §3.5, each with the tolerance the project accepts.
//!
//! Nothing here feeds back into the model: the constants in the presets come
//! from the papers' parameters (and name their source); these checks only
//! measure how close the mechanisms land. Where they miss, the check is
//! listed in [`KNOWN_DEVIATIONS`] with the reason, and the test asserts it
//! still misses, so the README table can never silently go stale.

use crate::check::Check;
use crate::config::{Completion, Config, Stack};
use crate::experiment::{rate, run};
use crate::san::calibration_runs::QuicksanRuns;
use crate::summary::{default_region_bytes, xdd_point};
use crate::units::format_table_number;
use crate::workload::{OpMix, RunLimit, Workload};
use serde::Serialize;

/// Why a check misses, if it is a documented deviation (the array's and
/// QuickSAN's here, NVMM's in `nvmm::calibration`).
pub fn known_deviation(name: &str) -> Option<&'static str> {
    KNOWN_DEVIATIONS
        .iter()
        .chain(crate::nvmm::calibration::KNOWN_MISSES)
        .find(|(n, _)| *n == name)
        .map(|(_, why)| *why)
}

/// Checks the mechanisms do not reach, with why (README "Calibration").
pub const KNOWN_DEVIATIONS: &[(&str, &str)] = &[
    ("Balance: small-thread gain", BALANCE),
    ("4 µs: 8 − 4 controllers", TWO_BUFFERS_LATENCY),
    ("8 controllers: 4 µs / 4 ns bandwidth", TWO_BUFFERS_LATENCY),
    ("Moneta 2011 4 KB write latency", WRITE_LATENCY),
    ("2011 read 512 B", CURVE_2011),
    ("2011 write 512 B", CURVE_2011),
    ("2011 mixed 512 B", CURVE_2011),
    ("2011 read 1024 B", CURVE_2011),
    ("2011 write 1024 B", CURVE_2011),
    ("2011 mixed 1024 B", CURVE_2011),
    ("2011 read 2048 B", CURVE_2011),
    ("2011 write 2048 B", CURVE_2011),
    ("2011 mixed 2048 B", CURVE_2011),
    ("2011 read 4096 B", CURVE_2011),
    ("2011 write 4096 B", CURVE_2011),
    ("2011 mixed 4096 B", CURVE_2011),
    ("2011 mixed 8192 B", CURVE_2011),
    ("NoSched → Atomic 4 KB latency saving", ATOMIC_STEP),
    (
        "NoSched → Atomic 4 KB write bandwidth gain, 16 threads",
        ATOMIC_STEP,
    ),
    ("Atomic → Spin 4 KB latency saving", SPIN_STEP),
    (
        "Atomic → Spin bandwidth gain, largest over 512 B–4 KB, 16 threads",
        SPIN_STEP,
    ),
    ("2Q peak mixed bandwidth / the link's 4 GB/s", TWO_BUFFERS),
    ("MICRO'10 sequential bandwidth, 50/50, Balance", TWO_BUFFERS),
    (
        "MICRO'10 small random accesses: Balance / Base bandwidth, largest over 512 B–4 KB",
        BASE_SERIAL,
    ),
    ("energy: iSCSI / QuickSAN-OS, highest", ENERGY),
    ("energy, writes: QuickSAN-OS / QuickSAN-D", ENERGY),
    ("energy: iSCSI / QuickSAN-D, lowest", ENERGY),
    ("bandwidth: QuickSAN-D / iSCSI, 4 KB read", ISCSI_TARGET),
    (
        "DMA / forwarding bandwidth, 2048 B, 32 threads 50/50",
        COMPLETION_COST,
    ),
    (
        "DMA / forwarding bandwidth, 4096 B, 32 threads 50/50",
        COMPLETION_COST,
    ),
    (
        "DMA / issue-sleep bandwidth, 4096 B, 32 threads 50/50",
        COMPLETION_COST,
    ),
    (
        "DMA / forwarding bandwidth, 8192 B, 32 threads 50/50",
        COMPLETION_COST,
    ),
    (
        "DMA / issue-sleep bandwidth, 8192 B, 32 threads 50/50",
        COMPLETION_COST,
    ),
    (
        "DMA over the others up to 8 KB: smallest gain",
        COMPLETION_COST,
    ),
    (
        "DMA over the others up to 8 KB: largest gain",
        COMPLETION_COST,
    ),
    ("Moneta-D 512 B write latency, issue-sleep", SLEEP_OVERLAP),
    (
        "async / sync bandwidth, 1 thread: smallest over 512 B–256 KB",
        ASYNC_COST,
    ),
    (
        "async / sync bandwidth, 1 thread: largest over 512 B–256 KB",
        ASYNC_COST,
    ),
    (
        "async / sync bandwidth, 8 threads: largest below 4 KB",
        ASYNC_COST,
    ),
    (
        "reads: bandwidth lost to the FS, 1 − (Moneta + FS) / Moneta, largest over 512 B–32 KB",
        FS_SERIAL,
    ),
    (
        "async / sync bandwidth per CPU, 1 thread, 16 KB",
        ASYNC_COST,
    ),
];

const COMPLETION_COST: &str = "Interrupts take a core in the model (experiment.rs, docs/src/fidelity/calibration.md, 'Moneta-D: completions'): a forwarded completion runs Table 3.1's 1.08 / 1.10 µs kernel handler on the one interrupt core, ahead of the thread there, and a spinning thread reads and clears the channel's TAGSTATUSREGISTER (one PIO word, a read serving every tag set before it), inside Table 4.2's one-thread 2.71 / 2.36 µs. Where the 32 spinners are CPU-bound the handlers cost most of one core of eight: DMA / forwarding 1.25× at 512 B and 1.21× at 1 KB (ok), then 1.15×, 1.05× and 1.01× at 2, 4 and 8 KB as the link rather than the cores bounds DMA (2.3-3.0 GB/s). Issue-sleep's thread sleeps until the interrupt wakes it even when the device finished during its 3.90 / 3.96 µs system call (its result comes back only then, §4.3.4; Table 4.2's 14.65 µs for a lone 512 B request), and its handler and context switch take cores: DMA / issue-sleep 1.60× and 1.41× at 512 B and 1 KB (ok). From 2 KB its sleepers free the cores that spinners hold, so it keeps all 32 requests in flight against DMA's 8 (one per core) and catches up with DMA (1.11×, 0.86×, 0.90× at 2, 4, 8 KB with only the 2 µs switch of its wake-up on a core). With host.wake_on_core = whole (Table 3.1's 4.3 / 3.6 µs of its 9.7 / 9.2 µs wake-up on the core it gets, §3.3.3) issue-sleep's sleepers cost more CPU: DMA / issue-sleep 2.05×, 1.79×, 1.40× at 512 B-2 KB (ok), 0.93× and 0.90× at 4 and 8 KB, where issue-sleep is near the link's 3.46 GB/s and no CPU cost binds it. Charging the rest of the wake-up (7.7 µs) to the interrupt core, as Linux 2.6's try_to_wake_up runs in the handler, would bound issue-sleep at ~130K completions/s (0.53 GB/s at 4 KB, DMA / issue-sleep ~5×, 10× at 512 B), outside the range; Table 3.1's 2.3 / 1.6 µs beyond the switch would bound it near 2 GB/s at 4 KB and not at all at 8 KB (the lost prototype's 1.41× / 0.90×). No constant was set to reach the range.";
const ASYNC_COST: &str = "An asynchronous thread (experiment.rs; 64 requests in flight alone, 8 each of 8 threads, our assumption) pays per request only Table 4.2's host costs (library 0.21 / 0.29 µs, extent lookup 0.12 µs, copy 0.34 / 0.26 µs per KB); DMA completion's 2.32 / 2.68 µs is latency, under which its core serves its other requests. So one thread moves 983 MB/s of 50/50 512 B requests (1.9M IOPS on one core) against the synchronous thread's 113 MB/s, 8.6×, and still 3.05× at 256 KB, where the synchronous thread's 87 µs copy leaves the link idle. §4.4.4 measured 1.1–3.0× and names 'software overheads resulting from maintaining asynchronous request data structures and increased contention during tag allocation' for small requests without a cost; the model has the tags but no bookkeeping cost, so small requests gain far more than published, and 8 threads' small requests gain 3.2× where the paper's lose. 4 KB's 5.7× meets the chapter's 5.5×. Bandwidth per CPU at 16 KB equals the bandwidth gain, 4.1× against 2.8×: both interfaces keep their core busy (the synchronous thread spins, the asynchronous one polls). No constant was set to reach the published range.";
const SLEEP_OVERLAP: &str = "The model runs issue-sleep's system call in parallel with the access, as §4.3.4 says ('The system call also occurs in parallel with the access'), and times Table 4.2's completion (14.65 / 14.29 µs, system call included) from the issue, so the 512 B access (1.26 / 2.18 µs) is hidden under it; Table 4.2's columns add the two. A lone request takes 14.1 µs for a read (16.5 summed, -14.6%, ok) and 13.7 µs for a write (17.1, -19.6%): the write's longer access is the larger part hidden.";
const FS_SERIAL: &str = "With host.wake_on_core = whole (Table 3.1's wake-up as CPU, §3.3.3) the interrupt-completing baseline without a file system is CPU-bound for small requests at 8 cores: its 512 B writes fall, so the FS costs writes 13.6× (13×, within; 16.0× with the 2 µs switch alone) and reads at most 27% (at most 34%; 31% before): both ratios are baseline / baseline + FS, and one CPU cost per request cannot move them apart. Writes through the file system hold the file's write lock from the file system's entry until their completion is noticed (host.fs_write_atomicity, §4.4.2 and §5.4.3), so the baseline's 16 writer threads run one at a time, and each is handed the lock asleep, so it switches in (2 µs) holding it. Chapter 4's baseline completes by interrupt (Table 4.2; calibration::kernel_baseline, Moneta+Atomic): a 512 B write spends ~16 µs under the lock (31.6 MB/s with the file system against 506 MB/s without, with the 2 µs switch alone), 16× where §4.4.2 says 'up to 13×' (+23%). Against the spinning 2Q driver the ratio was 11.9× (within), but Table 4.2 does not describe that driver, and it put the 58% / 60% latency savings at 48% (both misses, now met). The 13× would need ~13 µs under the lock, i.e. the woken writer's hand-over cheaper than Table 3.1's sleeping path; no seed separates the lock's hold time.";

const ISCSI_TARGET: &str = "iSCSI's loaded 4 KB bandwidth is bound by tgtd's one event-loop core per target (tgt 1.0.14). Table 5.1's 284 µs is split into the software's CPU, itemized from public sources (66.5 µs: TCP per KB at both ends, Foong et al.; one system call per PDU segment at the target, tgt's iscsi_tcp.c, RFC 3720's 8 KB PDUs; tgt's and libiscsi's thread hand-offs at Table 3.1's sleep cost), and interconnect latency that holds no core (the rest, 217.5 µs); it was all CPU, half on the event loop. The event loop now spends 30.8 µs per 4 KB read (110 MB/s per host, was 27): 9.2× against 14.7×, from 37×. Both directions rest on the itemized CPU being the whole CPU: a per-request CPU figure for open-iscsi and tgt on 2.6.18 would settle it; none is public.";

const KERNEL_SRC: &str = "Table 5.1 non-media total (SPEC §4.2). Re-audit: the kernel column has the direct column's block-transport row (17.0 / 16.9 µs) and a total that is the sum of its rows (3.8 + 1.4 + 17.0 = 22.2, 3.4 + 2.3 + 16.9 = 22.6 µs, from the application's perspective), so the kernel path completes as the direct one does (san.kernel_completion = spin); it was charged chapter 4's Moneta-D-era 'baseline interrupts' row (5.82 / 5.87 µs, another driver's) on top: 27.2 / 28.7 µs";
const ENERGY: &str = "Host power is linear in core utilization (Fan, Weber and Barroso, ISCA 2007) from 160 W idle to 320 W with all 8 cores busy (busy − idle = two E5520s' 80 W TDP, Intel ARK; idle = half of busy, Barroso and Hölzle, IEEE Computer 2007), and a spinning core counts as busy. Both QuickSAN paths spin for 4 KB (san.kernel_completion = spin), so an OS read costs about what a D read does, where §5.4.7 has OS reads about 2× dearer. iSCSI's CPU is Table 5.1's row less its interconnect latency (see the 14.7× check), and every stack through GFS2 takes the write lock (san.fs_write_atomicity_existing): iSCSI / OS 6.1-8.7× against 6.2-12.7× (was 5.9-24.8×), iSCSI / D 6.3-27.3× against 13.2-27.4× (was 18.4-25.4×): iSCSI reads are now 6.3× D's, writes (one at a time per host) 27×. The OS write ratio comes from the same lock: 3.13× against 4×. No SPECpower result of a dual E5520 server was found in a citable form; the nearest, an IBM x3550 M3 with 2 × X5670 (res2010q2/power_ssj2008-20100315-00239, 66 W idle … 247 W, san.host_power_w), lowers every ratio (iSCSI / D highest 27.3 → 21.6×, calibrate 80 → 79) and stays off. Distributed hosts share their 8 cores between client and target software (san.host_cores_shared): iSCSI / OS lowest 6.11 → 6.27×, iSCSI / D lowest 6.25 → 6.42×.";

const BASE_SERIAL: &str = "Base runs the whole block queue, the dispatch (tag, copy, PIO) and the completion in the single no-op scheduler context, and with host.wake_in_scheduler (MICRO'10 §IV 'The no-op scheduler is single-threaded so it removes any parallelism in request handling'; Linux 2.6.18 wakes the O_DIRECT waiter from the request's completion, fs/direct-io.c dio_bio_end_io) the completion's wake-up beyond the 2 µs switch too (Table 3.1: 2.3 / 1.6 µs): ~8.8 µs per 4 KB read, 466 MB/s, so NoSched / Base is 3.70× (4×, within; 2.73× with the wake-up on the woken core). The abstract's 18× for small random accesses needs more: Base's 512 B reads run at 58 MB/s (114K requests/s) against Balance's 515 MB/s, 8.8×; 18× would put Base near 29 MB/s, ~18 µs of serialized work per request, twice what Table 3.1 attributes to the serialized components.";
const ATOMIC_STEP: &str = "Atomic removes two of the three PIO command words (Table 3.1: 1.15 / 1.18 µs for three, so 0.78 µs saved) and the two locks, which cost nothing uncontended: 0.78 µs where §IV.B says 1 µs; the seeds give no cost for taking a lock. Under load NoSched's hardware lock covers the PIO words and the interrupt handler, 1.18 + 1.10 = 2.28 µs per 4 KB write, <= 439K writes/s = 1.80 GB/s, above the link's 1.73 GB/s payload rate: NoSched's 16 writers are link-bound already (1722 MB/s, as Atomic's), so the gain is 0. +460 MB/s needs NoSched at <= ~1.27 GB/s, >= 3.2 µs per request under a lock, more than Table 3.1's PIO and handler times.";
const SPIN_STEP: &str = "Spinning saves what Table 3.1 charges to sleeping: the interrupt handler (1.08 / 1.10 µs) and the wake-up, 'thread sleep during hw' minus the hardware total (12.3 - 8.0 = 4.3 / 11.8 - 8.2 = 3.6 µs), less the one PIO status read the spinning thread does (0.38 µs): 4.9 µs where §IV.C says 6 (the same 1.3 µs shortfall as Base -> Spin's 7.7 of 9 µs). For bandwidth the sleeping thread's extra CPU is the handler and its wake-up, which runs on the core it gets (host.wake_on_core = whole: Table 3.1's 4.3 / 3.6 µs, §3.3.3 'requires a context switch to wake up the thread ... limits performance'): 16 Atomic threads on 8 cores trail Spin by at most ~300 MB/s (2 KB reads), +20% against 'up to 250 MB/s'. With only SPEC §2.2's 2 µs switch on the core (wake_on_core = switch, before issue 38) the gap was 105 MB/s (1 KB reads).";
const TWO_BUFFERS: &str = "Re-audit: two 8 KB buffers are the FIFO baseline's (MICRO'10 §III.A, Fig. 1), and 2Q's published 71% of 4 GB/s = 2.84 GB/s mixed cannot run on two store-and-forward buffers (each 8 KB segment holds one >= 8192 B / 2 GB/s + 8192 B / 4 GB/s = 6.14 µs, so two move <= 2.67 GB/s): §V's experiments (2Q, Balance, the latency sweep, the abstract's final design) now run with the design's 8 buffers (dissertation A.2.4 'Moneta includes up to 8 buffers'; calibration::section_v), which brought 2Q / Spin from 1.05× to 1.93× (ok) and the abstract's 541K 4 KB IOPS from 411K to 591K (ok). With 8 buffers 2Q and Balance are bound by the link's payload rate (2 × 2 GB/s × 128 / 148 = 3.46 GB/s with 128 B TLPs): 2Q mixed peaks at 3.35 GB/s, 0.84 of 4 GB/s against 0.71 (+18%), and Balance's sequential 50/50 at 3.27 GB/s against the abstract's 2.8 (+17%); with two buffers both were ~1.8 GB/s (-36%, -35%). The published 2.84 GB/s lies between what 2 and 8 buffers allow; the seeds give no other buffer count for §V, and the model takes none that would fit.";
const BALANCE: &str = "Round-robin as described (one buffer to the head request, the rest back to the tail) with 4 small and 4 large requests queued gives the small threads about 4 × 4 KB per 4 × (4 + 8) KB of grants, a third of the bytes. With §V's 8 buffers (calibration::section_v) the small threads go from 17.8 to 278 MB/s, 15.6× (+30%; 21× on two buffers), and the aggregate stays the same (1.00×, ok; it lost 16% on two buffers). The published 12× is 192 MB/s for four threads, one 4 KB request per ~85 µs per thread against ~24 µs alone (170 MB/s): each small request waited behind ~100 KB (~12 segments) of large-request data, about three rounds, not one; the seeds do not say what else the round-robin queue shared.";
const TWO_BUFFERS_LATENCY: &str = "Reads get their buffer before the memory access and keep it until their DMA ends (MICRO'10 §III.A allocates a buffer for each transfer first; dissertation A.2.4: 'Both read and write requests are allocated buffers immediately'). The sweep is Moneta+Balance, a §V experiment, run with 8 buffers (calibration::section_v): each 4 KB read holds its buffer >= latency + 1.02 µs DDR + 1.02 µs ring + 2.37 µs DMA, so 8 buffers move <= 8 × 4096 B / 8.4 µs = 3.9 GB/s at 4 µs, above the link's 1.73 GB/s: 1 µs is hidden (1.00×, ok; 0.92× on two buffers, which move <= 1.52 GB/s at 1 µs), and so is 4 µs (0.99× against 0.8; 0.77× on two buffers). The published pair (1 µs hidden, 4 µs costing 20%) needs between 2 and 8 buffers in flight (about 3), a count no seed gives. Writes leave their buffer at the ring; one controller sustains 4096 B / (4 µs + 1.02 µs) = 816 MB/s, so 4 controllers (3.3 GB/s) already exceed the 2 GB/s link, and doubling them adds 38 MB/s; +400 MB/s needs a per-controller rate near 250 MB/s at 4 µs (the array latency paid ~4 times per 4 KB), which the texts do not describe.";
const WRITE_LATENCY: &str = "The texts disagree on spinning for 4 KB writes. MICRO'10 §III.C: 'spinning only helps for write requests smaller than 4 KB, so the driver spins for those requests and sleeps for larger requests' — a sleeping 4 KB write gives 16.1 µs (+15%) — but Fig. 3 credits spinning with 6 of the 9 µs Base→Spin saving at 4 KB, which the model reproduces only by spinning at 4 KB (sleeping drops the saving to 2.8 µs). The model spins: 11.6 µs, with a write hardware path of ~5.0 µs (Table 3.1's measured 8.2 µs hardware total includes a 4.39 µs '4 KB PCM access' no published mechanism explains).";
const CURVE_2011: &str = "The 2011 small-request numbers match 8 cores each spending Table 3.1's whole Base software time per request: 8 / 12.2 µs = 656K reads/s × 512 B = 336 MB/s (published 338.2) and 8 / 13.3 µs = 602K writes/s = 308 MB/s (327.4). But the thesis (§2.1) measured the spinning atomic driver of Table 3.4, which did 1.16M 512 B reads/s = 592 MB/s (<= 6.9 µs of CPU per request) on an array with fewer buffers (2 vs 8) and controllers (4 vs 8); no device mechanism makes the 2011 array slower. The model follows the mechanisms: below 4 KB CPU-bound as Table 3.4 (1.0M 512 B IOPS), from 4 KB link-bound (1730 MB/s, PCIe 1.1 ×8 with 128 B payloads; the 2011 4 KB read, 326K IOPS, is itself 12% below Table 3.4's 369K). Re-audit: the thesis names the driver (§2: it 'bypasses the Linux IO request scheduler, utilizes atomic PIO writes ..., processes completed tags in parallel, and takes advantage of spin-waits'), so the 2011 run is not an interrupt-completion stack; and its FusionIO column, the same 80 GB ioDrive as Table 3.4's, agrees with Table 3.4 at 4 KB (93.1K / 71.2K read / write IOPS against 92.2K / 70.6K) but not at 512 B (90.0K / 87.0K against 132.8K / 71.3K): the two tables' small-request set-ups differed for both devices in a way neither text describes, so no public source gives the 2011 host's per-request cost. Re-audit (issue 38), the driver: an interrupt-completing driver (Moneta+Atomic on the 2Q array, with Table 3.1's wake-up as CPU) would fit the 2011 reads (358 / 692 / 1315 MB/s at 512 B / 1 KB / 2 KB against 338 / 721 / 1272) but not the writes (426 / 815 / 1563 against 327 / 519 / 974) nor the thesis's own latencies (4 KB 18.0 / 16.1 µs against 13 / 14; spinning gives 12.8 / 11.6), and the thesis says its driver 'takes advantage of spin-waits' (§2.1): the spinning driver is kept.";

/// The seed of every check (and of the orderings, which share its runs).
pub const SEED: u64 = 1;
const OPS: u64 = 60_000;

fn preset(name: &str, stack: Stack) -> Config {
    let mut c = Config::preset(name).expect("shipped preset");
    c.set_stack(stack);
    c
}

/// Transfer buffers of MICRO'10 §V's experiments (Moneta+2Q, +Balance, the
/// memory-latency sweep, and the abstract's final-design numbers). Two 8 KB
/// buffers are the FIFO baseline's (MICRO'10 §III.A, Fig. 1: "The scheduler
/// manages two 8 KB buffers as it processes IO requests in FIFO order"), and
/// §V.A's measured 2Q figure cannot run on two: a store-and-forward 8 KB
/// segment holds its buffer >= 8192 B / 2 GB/s + 8192 B / 4 GB/s = 6.14 µs,
/// so two buffers move <= 2.67 GB/s, below the 71% of 4 GB/s = 2.84 GB/s
/// published. The design's buffer count is configurable (§III: "it supports
/// configurable buffer sizes in the scheduler") and "Moneta includes up to
/// 8 buffers" (dissertation A.2.4): §V's experiments run with the 8.
const SECTION_V_BUFFERS: u32 = 8;

/// The MICRO'10 array as §V's hardware experiments ran it: `stack` (2Q or
/// Balance) with [`SECTION_V_BUFFERS`] transfer buffers.
pub fn section_v(stack: Stack) -> Config {
    let mut c = preset("moneta-micro10", stack);
    c.device.transfer_buffers = SECTION_V_BUFFERS;
    c
}

fn bandwidth(c: &Config, op: OpMix, size: u64, threads: u32) -> f64 {
    xdd_point(c, op, size, threads, RunLimit::Ops(OPS), SEED)
        .expect("calibration point runs")
        .bandwidth_mb_per_s
}

fn iops(c: &Config, op: OpMix, size: u64, threads: u32) -> f64 {
    xdd_point(c, op, size, threads, RunLimit::Ops(OPS), SEED)
        .expect("calibration point runs")
        .iops
}

fn latency_us(c: &Config, op: OpMix, size: u64) -> f64 {
    xdd_point(c, op, size, 1, RunLimit::Ops(5_000), SEED)
        .expect("calibration point runs")
        .latency_us_mean
}

fn check(
    name: String,
    source: &'static str,
    published: f64,
    simulated: f64,
    tolerance: f64,
    unit: &'static str,
) -> Check {
    Check {
        name,
        source,
        published,
        simulated,
        tolerance,
        unit,
        bounds: None,
    }
}

/// Moneta (2011) random bandwidth, 16 XDD threads (SPEC §2.3 table).
pub const MONETA_2011: [(u64, f64, f64, f64); 12] = [
    (512, 338.2, 327.4, 316.8),
    (1024, 720.6, 518.5, 526.5),
    (2048, 1272.4, 974.4, 1135.8),
    (4096, 1334.6, 1286.9, 1720.1),
    (8192, 1504.6, 1596.0, 2317.4),
    (16384, 1743.1, 1737.3, 3159.3),
    (32768, 1742.9, 1739.3, 3152.2),
    (65536, 1742.3, 1737.4, 3161.4),
    (131072, 1743.4, 1737.4, 3093.4),
    (262144, 1742.8, 1737.8, 3094.2),
    (524288, 1740.1, 1737.5, 3039.3),
    (1048576, 1742.8, 1741.3, 2916.5),
];

/// Published bandwidth points (request bytes, MB/s) of a random XDD sweep
/// on `config` with `threads` threads and operation `op` ("read", "write",
/// "mixed"), when the papers give them for that system: today the Moneta
/// (2011) table of the Onyx thesis (preset `moneta`, 2Q, 16 threads). With
/// the source to cite beside a plot.
pub fn published_bandwidth(
    config: &Config,
    op: &str,
    threads: u32,
) -> Option<(&'static str, Vec<(u64, f64)>)> {
    if config.name != "moneta" || config.host.stack != Stack::TwoQueue || threads != 16 {
        return None;
    }
    let column = match op {
        "read" => 1,
        "write" => 2,
        "mixed" => 3,
        _ => return None,
    };
    let points = MONETA_2011
        .iter()
        .map(|&(size, r, w, m)| (size, [0.0, r, w, m][column]))
        .collect();
    Some((
        "Onyx thesis Tables 5.1–5.3, Moneta column (SPEC §2.3)",
        points,
    ))
}

pub fn table_3_4() -> Vec<Check> {
    let c = preset("moneta-micro10", Stack::Spin);
    let src = "Table 3.4 (SPEC §2.3)";
    vec![
        check(
            "Spin 4 KB read IOPS".into(),
            src,
            368_534.0,
            iops(&c, OpMix::Read, 4096, 16),
            0.15,
            "IOPS",
        ),
        check(
            "Spin 4 KB write IOPS".into(),
            src,
            389_859.0,
            iops(&c, OpMix::Write, 4096, 16),
            0.15,
            "IOPS",
        ),
        check(
            "Spin 512 B read IOPS".into(),
            src,
            1_156_779.0,
            iops(&c, OpMix::Read, 512, 16),
            0.15,
            "IOPS",
        ),
        check(
            "Spin 512 B write IOPS".into(),
            src,
            1_043_793.0,
            iops(&c, OpMix::Write, 512, 16),
            0.15,
            "IOPS",
        ),
    ]
}

/// The Moneta of the Onyx thesis's 2011 measurements (preset `moneta`):
/// its driver "bypasses the Linux IO request scheduler, utilizes atomic PIO
/// writes ..., processes completed tags in parallel, and takes advantage of
/// spin-waits" (thesis §2.1), on the 2Q array.
pub fn moneta_2011() -> Config {
    preset("moneta", MONETA_2011_STACK)
}

const MONETA_2011_STACK: Stack = Stack::TwoQueue;

pub fn moneta_2011_curves() -> Vec<Check> {
    let c = moneta_2011();
    let src = "Moneta 2011 table (SPEC §2.3)";
    let mut out = Vec::new();
    for (size, read, write, mixed) in MONETA_2011 {
        for (op, published) in [
            (OpMix::Read, read),
            (OpMix::Write, write),
            (OpMix::Mixed(0.5), mixed),
        ] {
            let name = format!("2011 {} {} B", op.name(), size);
            out.push(check(
                name,
                src,
                published,
                bandwidth(&c, op, size, 16),
                0.15,
                "MB/s",
            ));
        }
    }
    out
}

pub fn software_steps() -> Vec<Check> {
    let base = preset("moneta-micro10", Stack::Base);
    let nosched = preset("moneta-micro10", Stack::NoSched);
    let atomic = preset("moneta-micro10", Stack::Atomic);
    let spin = preset("moneta-micro10", Stack::Spin);
    let two_q = section_v(Stack::TwoQueue);
    let src = "MICRO'10 §IV, Table 3.1 (SPEC §2.1–2.2)";
    // Mean of the 4 KB read and write latencies (Fig. 3 and §IV give one
    // saving per step for both).
    let latency_4k = |c: &Config| {
        let r = latency_us(c, OpMix::Read, 4096);
        let w = latency_us(c, OpMix::Write, 4096);
        (r, w, (r + w) / 2.0)
    };
    let (base_r, base_w, base_4k) = latency_4k(&base);
    let (_, _, nosched_4k) = latency_4k(&nosched);
    let (_, _, atomic_4k) = latency_4k(&atomic);
    let (_, _, spin_4k) = latency_4k(&spin);
    let peak_mixed = |c: &Config| {
        MONETA_2011
            .iter()
            .map(|&(size, ..)| bandwidth(c, OpMix::Mixed(0.5), size, 16))
            .fold(0.0, f64::max)
    };
    let (two_q_peak, spin_peak) = (peak_mixed(&two_q), peak_mixed(&spin));
    // §IV.C: "Moneta+Spin improves bandwidth for 512-4096 byte requests by
    // up to 250 MB/s" (op not given: the largest of read, write, 50/50).
    let spin_gain = [OpMix::Read, OpMix::Write, OpMix::Mixed(0.5)]
        .into_iter()
        .flat_map(|op| SMALL_SIZES.map(move |size| (op, size)))
        .map(|(op, size)| bandwidth(&spin, op, size, 16) - bandwidth(&atomic, op, size, 16))
        .fold(f64::MIN, f64::max);
    vec![
        check(
            "Base 4 KB read latency".into(),
            src,
            21.0,
            base_r,
            0.15,
            "µs",
        ),
        check(
            "Base 4 KB write latency".into(),
            src,
            21.0,
            base_w,
            0.15,
            "µs",
        ),
        check(
            "Base → Spin 4 KB latency saving".into(),
            src,
            9.0,
            base_4k - spin_4k,
            0.15,
            "µs",
        ),
        check(
            "NoSched / Base 4 KB read bandwidth".into(),
            src,
            4.0,
            bandwidth(&nosched, OpMix::Read, 4096, 16) / bandwidth(&base, OpMix::Read, 4096, 16),
            0.15,
            "×",
        ),
        check(
            "2Q / Spin peak mixed bandwidth".into(),
            src,
            1.75,
            two_q_peak / spin_peak,
            0.15,
            "×",
        ),
        // §IV.A: "Moneta+NoSched reduces per-request latency by 2 µs".
        check(
            "Base → NoSched 4 KB latency saving".into(),
            STEPS,
            2.0,
            base_4k - nosched_4k,
            0.15,
            "µs",
        ),
        // §IV.B: "Moneta+Atomic reduces latency by 1µs over Moneta+NoSched
        // and increases bandwidth by 460 MB/s for 4 KB writes".
        check(
            "NoSched → Atomic 4 KB latency saving".into(),
            STEPS,
            1.0,
            nosched_4k - atomic_4k,
            0.15,
            "µs",
        ),
        check(
            "NoSched → Atomic 4 KB write bandwidth gain, 16 threads".into(),
            STEPS,
            460.0,
            bandwidth(&atomic, OpMix::Write, 4096, 16)
                - bandwidth(&nosched, OpMix::Write, 4096, 16),
            0.15,
            "MB/s",
        ),
        // §IV.C: "Spinning reduces latency by 6µs".
        check(
            "Atomic → Spin 4 KB latency saving".into(),
            STEPS,
            6.0,
            atomic_4k - spin_4k,
            0.15,
            "µs",
        ),
        check(
            "Atomic → Spin bandwidth gain, largest over 512 B–4 KB, 16 threads".into(),
            STEPS,
            250.0,
            spin_gain,
            0.15,
            "MB/s",
        ),
        // §V.A: 2Q "consumes 71% of the total PCIe bandwidth" (2 GB/s each way).
        check(
            "2Q peak mixed bandwidth / the link's 4 GB/s".into(),
            "MICRO'10 §V.A (SPEC §2.2)",
            0.71,
            two_q_peak / 4000.0,
            0.15,
            "",
        ),
    ]
}

/// MICRO'10 §IV's step-by-step statements (each optimization's saving and gain).
const STEPS: &str = "MICRO'10 §IV (seed 000; not in SPEC)";

/// The small requests of MICRO'10's statements ("512-4096 byte requests").
const SMALL_SIZES: [u64; 4] = [512, 1024, 2048, 4096];

/// Single-thread latencies of the other published systems.
pub fn other_systems() -> Vec<Check> {
    let direct = preset("moneta-d", Stack::Direct);
    let haste = Config::preset("haste").expect("shipped preset");
    vec![
        check(
            "Moneta 2011 4 KB read latency".into(),
            "Onyx thesis §5 (SPEC §2.3)",
            13.0,
            latency_us(&moneta_2011(), OpMix::Read, 4096),
            0.15,
            "µs",
        ),
        check(
            "Moneta 2011 4 KB write latency".into(),
            "Onyx thesis §5 (SPEC §2.3)",
            14.0,
            latency_us(&moneta_2011(), OpMix::Write, 4096),
            0.15,
            "µs",
        ),
        check(
            "Moneta-D 512 B read latency".into(),
            "ASPLOS'12 / dissertation ch. 4 (SPEC §3.5)",
            4.1,
            latency_us(&direct, OpMix::Read, 512),
            0.15,
            "µs",
        ),
        check(
            "HASTE 4 KB read latency".into(),
            "SC'10 (SPEC §6)",
            16.0,
            latency_us(&haste, OpMix::Read, 4096),
            0.15,
            "µs",
        ),
    ]
}

/// SPEC §2.2: 4 threads of 4 KB reads beside 4 threads of 512 KB reads.
pub fn balance() -> Vec<Check> {
    let src = "MICRO'10 §V.B (SPEC §2.2)";
    let fair = |stack| {
        let c = section_v(stack);
        let w = Workload::fairness(
            4,
            4096,
            4,
            512 << 10,
            default_region_bytes(&c),
            RunLimit::Ops(40_000),
            SEED,
        );
        let r = run(&c, &w).expect("fairness runs");
        let small = rate(r.groups[0].bytes, r.elapsed_ns) / 1e6;
        let large = rate(r.groups[1].bytes, r.elapsed_ns) / 1e6;
        (small, large, r.bandwidth_mb_per_s())
    };
    let (small_before, large_before, total_before) = fair(Stack::TwoQueue);
    let (small_after, _large_after, total_after) = fair(Stack::Balance);
    vec![
        check(
            "4 KB threads beside 512 KB threads, before".into(),
            src,
            16.0,
            small_before,
            0.15,
            "MB/s",
        ),
        check(
            "512 KB threads beside 4 KB threads, before".into(),
            src,
            1500.0,
            large_before,
            0.15,
            "MB/s",
        ),
        check(
            "Balance: small-thread gain".into(),
            src,
            12.0,
            small_after / small_before,
            0.15,
            "×",
        ),
        check(
            "Balance: aggregate after / before".into(),
            src,
            1.0,
            total_after / total_before,
            0.15,
            "×",
        ),
    ]
}

/// SPEC §2.2 latency tolerance: Moneta+Balance, 4 KB reads and writes.
pub fn latency_tolerance() -> Vec<Check> {
    let src = "MICRO'10 Fig. 4 text (SPEC §2.2)";
    let bw = |controllers: u32, latency_ns: u64| {
        let mut c = section_v(Stack::Balance);
        c.set(&format!("memory.controllers={controllers}"))
            .expect("valid");
        c.memory.latency_ns_read = latency_ns;
        c.memory.latency_ns_write = latency_ns;
        (bandwidth(&c, OpMix::Read, 4096, 16) + bandwidth(&c, OpMix::Write, 4096, 16)) / 2.0
    };
    let fast8 = bw(8, 4);
    let us1_8 = bw(8, 1000);
    let us4_8 = bw(8, 4000);
    let us4_4 = bw(4, 4000);
    vec![
        check(
            "8 controllers: 1 µs / 4 ns bandwidth".into(),
            src,
            1.0,
            us1_8 / fast8,
            0.05,
            "×",
        ),
        check(
            "8 controllers: 4 µs / 4 ns bandwidth".into(),
            src,
            0.8,
            us4_8 / fast8,
            0.15,
            "×",
        ),
        check(
            "4 µs: 8 − 4 controllers".into(),
            src,
            400.0,
            us4_8 - us4_4,
            0.15,
            "MB/s",
        ),
    ]
}

/// SPEC §1.9 power consequences that a whole simulated run can show.
pub fn power() -> Vec<Check> {
    let src = "MICRO'10 Table I text (SPEC §1.9)";
    let c = preset("moneta-micro10", Stack::Spin);
    let w8 = xdd_point(&c, OpMix::Write, 8192, 16, RunLimit::Ops(OPS), SEED).expect("runs");
    vec![check(
        "random 8 KB writes, total power".into(),
        src,
        3.47,
        w8.power_w,
        0.10,
        "W",
    )]
}

/// Moneta-D (dissertation ch. 4) and the MICRO'10 headline numbers that a
/// closed loop can measure (SPEC §2.3, §3.5).
pub fn direct_and_headline() -> Vec<Check> {
    let direct = preset("moneta-d", Stack::Direct);
    let micro = preset("moneta-micro10", Stack::Spin);
    let balance = section_v(Stack::Balance);
    // Table 4.2's Moneta-D write column (1 extent), summed: hardware + DMA
    // 2.18, copy 0.13, extent lookup 0.12, hardware check 0.06, library
    // 0.29, DMA completion 2.68 µs.
    let table_4_2_write = 2.18 + 0.13 + 0.12 + 0.06 + 0.29 + 2.68;
    // The same columns with issue-sleep's completion (14.65 / 14.29 µs)
    // in place of DMA's.
    let mut sleep = direct.clone();
    sleep.direct.completion = crate::config::Completion::IssueSleep;
    let table_4_2_sleep = [
        (
            OpMix::Read,
            "read",
            1.26 + 0.17 + 0.12 + 0.06 + 0.21 + 14.65,
        ),
        (
            OpMix::Write,
            "write",
            2.18 + 0.13 + 0.12 + 0.06 + 0.29 + 14.29,
        ),
    ];
    let mut v = vec![
        check(
            "Moneta-D 512 B write latency".into(),
            "Table 4.2, Moneta-D column summed (SPEC §3.5)",
            table_4_2_write,
            latency_us(&direct, OpMix::Write, 512),
            0.15,
            "µs",
        ),
        check(
            "Moneta-D 512 B write IOPS, 16 threads".into(),
            "dissertation §4.4.2 \"1.8 M 512 B IO operations per second\" (SPEC §3.5)",
            1.8e6,
            iops(&direct, OpMix::Write, 512, 16),
            0.15,
            "IOPS",
        ),
        check(
            "MICRO'10 512 B write latency".into(),
            "MICRO'10 abstract (SPEC §2.3)",
            9.0,
            latency_us(&micro, OpMix::Write, 512),
            0.15,
            "µs",
        ),
        check(
            "MICRO'10 random 4 KB IOPS, 50/50, Balance".into(),
            "MICRO'10 abstract: 541K 4 KB IOPS, 2.2 GB/s (SPEC §2.3)",
            541_000.0,
            iops(&balance, OpMix::Mixed(0.5), 4096, 16),
            0.15,
            "IOPS",
        ),
    ];
    // MICRO'10 abstract: "increases performance for small, random accesses
    // by 18x" (the final design, Balance, over Base; dissertation ch. 3
    // says "up to 19×"), and "Moneta array sustain 2.8 GB/s for sequential
    // transfers" (taken as 50/50, the only mix above one link direction's
    // 2 GB/s, at the largest of 64–512 KB).
    let base = preset("moneta-micro10", Stack::Base);
    let small_gain = [OpMix::Read, OpMix::Write, OpMix::Mixed(0.5)]
        .into_iter()
        .flat_map(|op| SMALL_SIZES.map(move |size| (op, size)))
        .map(|(op, size)| bandwidth(&balance, op, size, 16) / bandwidth(&base, op, size, 16))
        .fold(0.0, f64::max);
    v.push(check(
        "MICRO'10 small random accesses: Balance / Base bandwidth, largest over 512 B–4 KB".into(),
        "MICRO'10 abstract \"18x\", dissertation ch. 3 \"up to 19×\" (seeds 000, 002; not in SPEC)",
        18.0,
        small_gain,
        0.15,
        "×",
    ));
    let sequential = [65536, 131072, 262144, 524288]
        .into_iter()
        .map(|size| {
            let mut w = Workload::xdd(
                OpMix::Mixed(0.5),
                size,
                16,
                default_region_bytes(&balance),
                RunLimit::Ops(4_000),
                SEED,
            );
            w.groups[0].random = false;
            crate::summary::workload_point(&balance, &w)
                .expect("calibration point runs")
                .bandwidth_mb_per_s
        })
        .fold(0.0, f64::max);
    v.push(check(
        "MICRO'10 sequential bandwidth, 50/50, Balance".into(),
        "MICRO'10 abstract \"2.8 GB/s for sequential transfers\" (SPEC §2.3)",
        2800.0,
        sequential,
        0.15,
        "MB/s",
    ));
    for (op, name, published) in table_4_2_sleep {
        v.push(check(
            format!("Moneta-D 512 B {name} latency, issue-sleep"),
            "Table 4.2, Moneta-D column summed with issue-sleep's completion (SPEC §3.5)",
            published,
            latency_us(&sleep, op, 512),
            0.15,
            "µs",
        ));
    }
    v
}

/// Request sizes of the completion experiment (dissertation Figs. 4.5–4.6:
/// 32 threads, 50/50 random, "accesses of the size given on the horizontal
/// axis"; the seeds' text speaks of sizes up to 256 KB).
pub const COMPLETION_SIZES: [u64; 10] = [
    512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144,
];

/// Threads of the completion experiment (dissertation §4.3.4).
pub const COMPLETION_THREADS: u32 = 32;

/// Moneta-D's three completion techniques (SPEC §3.5), in the figures' order.
pub const COMPLETIONS: [Completion; 3] = [
    Completion::Dma,
    Completion::Forwarding,
    Completion::IssueSleep,
];

/// The name a completion goes by in tables and legends.
pub fn completion_name(c: Completion) -> &'static str {
    match c {
        Completion::Dma => "dma",
        Completion::Forwarding => "forwarding",
        Completion::IssueSleep => "issue-sleep",
    }
}

/// One point of the completion experiment.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionPoint {
    pub completion: Completion,
    pub size_bytes: u64,
    pub bandwidth_mb_per_s: f64,
    /// Bandwidth per busy host core (Fig. 4.6's "GB/s per CPU", in MB/s):
    /// bandwidth / (CPU utilization × cores), i.e. bytes per ns of host CPU
    /// time, spinning counted as busy, sleeping not.
    pub mb_per_s_per_cpu: f64,
}

/// Figs. 4.6 and 4.12's "bandwidth per CPU": MB/s over the host cores the
/// point kept busy (spinning and polling count, sleeping does not).
fn per_cpu(c: &Config, p: &crate::summary::PointSummary) -> f64 {
    let cpus = p.cpu_utilization * c.host.contexts() as f64;
    if cpus > 0.0 {
        p.bandwidth_mb_per_s / cpus
    } else {
        f64::INFINITY
    }
}

/// Dissertation §4.3.4, Figs. 4.5–4.6: preset `moneta-d` with each
/// completion, 32 threads of 50/50 random requests per size.
pub fn completion_sweep(ops: u64, seed: u64) -> crate::error::Result<Vec<CompletionPoint>> {
    let mut out = Vec::new();
    for completion in COMPLETIONS {
        let mut c = preset("moneta-d", Stack::Direct);
        c.direct.completion = completion;
        for size_bytes in COMPLETION_SIZES {
            let p = xdd_point(
                &c,
                OpMix::Mixed(0.5),
                size_bytes,
                COMPLETION_THREADS,
                RunLimit::Ops(ops),
                seed,
            )?;
            out.push(CompletionPoint {
                completion,
                size_bytes,
                bandwidth_mb_per_s: p.bandwidth_mb_per_s,
                mb_per_s_per_cpu: per_cpu(&c, &p),
            });
        }
    }
    Ok(out)
}

/// A statement that gives only a range, "between `low` and `high`"
/// (`high` infinite: "more than `low`"; `low` zero: "less than `high`"):
/// the published column shows the range, and the error is measured from
/// `low` (from `high` when `low` is zero).
fn ranged(
    name: String,
    source: &'static str,
    simulated: f64,
    bounds: (f64, f64),
    unit: &'static str,
) -> Check {
    let reference = if bounds.0 > 0.0 { bounds.0 } else { bounds.1 };
    Check {
        bounds: Some(bounds),
        ..check(name, source, reference, simulated, 0.0, unit)
    }
}

/// Dissertation §4.3.4's statements about Figs. 4.5 and 4.6, checked on
/// the points of [`completion_sweep`].
pub fn completion_checks(points: &[CompletionPoint]) -> Vec<Check> {
    let at = |completion, size| {
        points
            .iter()
            .find(|p| p.completion == completion && p.size_bytes == size)
            .expect("a point per completion and size")
    };
    let src = "dissertation §4.3.4, Fig. 4.5 (SPEC §3.5)";
    let mut v = Vec::new();
    // "DMA completion outperforms the other schemes by between 21% and
    // 171%, for accesses up to 8 KB": every gain in the range, and the
    // range's ends as the smallest and largest gain.
    let mut gains = Vec::new();
    for size in COMPLETION_SIZES.into_iter().filter(|&s| s <= 8192) {
        for other in [Completion::Forwarding, Completion::IssueSleep] {
            let gain =
                at(Completion::Dma, size).bandwidth_mb_per_s / at(other, size).bandwidth_mb_per_s;
            gains.push(gain);
            v.push(ranged(
                format!(
                    "DMA / {} bandwidth, {size} B, 32 threads 50/50",
                    completion_name(other)
                ),
                src,
                gain,
                (1.21, 2.71),
                "×",
            ));
        }
    }
    v.push(check(
        "DMA over the others up to 8 KB: smallest gain".into(),
        src,
        1.21,
        gains.iter().copied().fold(f64::INFINITY, f64::min),
        0.15,
        "×",
    ));
    v.push(check(
        "DMA over the others up to 8 KB: largest gain".into(),
        src,
        2.71,
        gains.iter().copied().fold(0.0, f64::max),
        0.15,
        "×",
    ));
    // Fig. 4.6: "Issue-sleep does much better and can deliver up to 7×
    // more bandwidth per CPU" than the two spinning techniques; the
    // caption: "For larger accesses, however, issue-sleep enjoys a large
    // advantage in efficiency" (SPEC §3.5: best at ≥ 8 KB).
    let src = "dissertation §4.3.4, Fig. 4.6 (SPEC §3.5)";
    let efficiency_gain = |size| {
        let spinning = at(Completion::Dma, size)
            .mb_per_s_per_cpu
            .max(at(Completion::Forwarding, size).mb_per_s_per_cpu);
        at(Completion::IssueSleep, size).mb_per_s_per_cpu / spinning
    };
    v.push(check(
        "bandwidth per CPU: issue-sleep / best spinning, largest over 512 B–256 KB".into(),
        src,
        7.0,
        COMPLETION_SIZES
            .into_iter()
            .map(efficiency_gain)
            .fold(0.0, f64::max),
        0.15,
        "×",
    ));
    v.push(ranged(
        "bandwidth per CPU: issue-sleep / best spinning, smallest over 8 KB–256 KB".into(),
        src,
        COMPLETION_SIZES
            .into_iter()
            .filter(|&s| s >= 8192)
            .map(efficiency_gain)
            .fold(f64::INFINITY, f64::min),
        (1.0, f64::INFINITY),
        "×",
    ));
    v
}

/// Dissertation Figs. 4.5–4.6 (seed 1, the calibration's op count).
/// Requests per point of the completion sweep (Figs. 4.5–4.6).
pub const COMPLETION_OPS: u64 = OPS;

pub fn direct_completions() -> Vec<Check> {
    completion_checks(&completion_sweep(COMPLETION_OPS, SEED).expect("completion sweep runs"))
}

/// Threads of the asynchronous-IO experiment (dissertation §4.4.4,
/// Fig. 4.11: "1 and 8 threads").
pub const ASYNC_THREADS: [u32; 2] = [1, 8];

/// Requests an asynchronous thread keeps in flight: every tag of its
/// process's channel (64, SPEC §3.1) shared by the threads. The 64 is the
/// channel's DMA buffer, 1 MB in 16 KB slices, one per tag (dissertation
/// §4.3.2); a request above 16 KB holds several (`direct.dma_slice_bytes`),
/// so fewer are in flight. Our assumption: the text gives no depth, but
/// says the 8-thread runs contend "during tag allocation", which they do
/// only if together they ask for all 64.
pub fn async_queue_depth(threads: u32) -> u32 {
    crate::workload::CHANNEL_TAGS / threads
}

/// One point of the asynchronous-IO experiment.
#[derive(Debug, Clone, Serialize)]
pub struct AsyncPoint {
    pub threads: u32,
    /// 1: the synchronous interface.
    pub queue_depth: u32,
    pub size_bytes: u64,
    pub bandwidth_mb_per_s: f64,
    /// Bandwidth per busy host core (Fig. 4.12), as [`CompletionPoint`]'s.
    pub mb_per_s_per_cpu: f64,
}

/// Dissertation §4.4.4, Figs. 4.11–4.12: preset `moneta-d` (DMA
/// completion), 50/50 random requests of each size (the op is our
/// assumption, as the completion experiment's), 1 and 8 threads, each
/// synchronous and asynchronous ([`async_queue_depth`]).
pub fn async_sweep(ops: u64, seed: u64) -> crate::error::Result<Vec<AsyncPoint>> {
    let c = preset("moneta-d", Stack::Direct);
    let mut out = Vec::new();
    for threads in ASYNC_THREADS {
        for queue_depth in [1, async_queue_depth(threads)] {
            for size_bytes in COMPLETION_SIZES {
                let mut w = crate::workload::Workload::xdd(
                    OpMix::Mixed(0.5),
                    size_bytes,
                    threads,
                    default_region_bytes(&c),
                    RunLimit::Ops(ops),
                    seed,
                );
                w.groups[0].queue_depth = queue_depth;
                let p = crate::summary::workload_point(&c, &w)?;
                out.push(AsyncPoint {
                    threads,
                    queue_depth,
                    size_bytes,
                    bandwidth_mb_per_s: p.bandwidth_mb_per_s,
                    mb_per_s_per_cpu: per_cpu(&c, &p),
                });
            }
        }
    }
    Ok(out)
}

/// Dissertation §4.4.4's statements about Figs. 4.11 and 4.12 (and the
/// chapter's introduction and conclusion), on the points of [`async_sweep`].
pub fn async_checks(points: &[AsyncPoint]) -> Vec<Check> {
    let at = |threads, asynchronous: bool, size| {
        points
            .iter()
            .find(|p| {
                p.threads == threads && (p.queue_depth > 1) == asynchronous && p.size_bytes == size
            })
            .expect("a point per thread count, interface and size")
    };
    let gain = |threads, size| {
        at(threads, true, size).bandwidth_mb_per_s / at(threads, false, size).bandwidth_mb_per_s
    };
    let one: Vec<f64> = COMPLETION_SIZES.into_iter().map(|s| gain(1, s)).collect();
    let src = "dissertation §4.4.4, Fig. 4.11 (SPEC §3.5)";
    vec![
        // "Asynchronous operations increase throughput by between 1.1× and
        // 3.0× on access sizes of 512 B to 256 KB when using 1 thread."
        check(
            "async / sync bandwidth, 1 thread: smallest over 512 B–256 KB".into(),
            src,
            1.1,
            one.iter().copied().fold(f64::INFINITY, f64::min),
            0.15,
            "×",
        ),
        check(
            "async / sync bandwidth, 1 thread: largest over 512 B–256 KB".into(),
            src,
            3.0,
            one.iter().copied().fold(0.0, f64::max),
            0.15,
            "×",
        ),
        // Re-audit: the introduction and conclusion of chapter 4 say "With
        // a single thread, Moneta-D's asynchronous IO interface improves
        // performance by 5.5× for 4 KB accesses", which the figure's own
        // text (1.1–3.0× over 512 B–256 KB, above) and its caption ("up to
        // 3.5×") both contradict. The section that presents Fig. 4.11 is
        // kept; the summaries' 5.5× is no longer a check (it was met, at
        // 5.7×, and that does not make it agree with the figure).
        // "With 8 threads, asynchronous operations boost performance for
        // requests of 4 KB or larger. Small request performance suffers."
        ranged(
            "async / sync bandwidth, 8 threads: smallest over 4 KB–256 KB".into(),
            src,
            COMPLETION_SIZES
                .into_iter()
                .filter(|&s| s >= 4096)
                .map(|s| gain(8, s))
                .fold(f64::INFINITY, f64::min),
            (1.0, f64::INFINITY),
            "×",
        ),
        ranged(
            "async / sync bandwidth, 8 threads: largest below 4 KB".into(),
            src,
            COMPLETION_SIZES
                .into_iter()
                .filter(|&s| s < 4096)
                .map(|s| gain(8, s))
                .fold(0.0, f64::max),
            (0.0, 1.0),
            "×",
        ),
        // Fig. 4.12: "for one thread, asynchronous requests are 2.8× more
        // efficient than synchronous requests with respect to the amount
        // of bandwidth per CPU" (16 KB accesses).
        check(
            "async / sync bandwidth per CPU, 1 thread, 16 KB".into(),
            "dissertation §4.4.4, Fig. 4.12 (SPEC §3.5)",
            2.8,
            at(1, true, 16384).mb_per_s_per_cpu / at(1, false, 16384).mb_per_s_per_cpu,
            0.15,
            "×",
        ),
    ]
}

/// Ops per point of the asynchronous-IO experiment: a depth-64 thread
/// needs many requests past its start.
pub const ASYNC_OPS: u64 = 20_000;

/// Dissertation Figs. 4.11–4.12 (seed 1).
pub fn direct_async() -> Vec<Check> {
    async_checks(&async_sweep(ASYNC_OPS, SEED).expect("asynchronous sweep runs"))
}

/// The baseline Moneta of dissertation chapter 4, without a file system:
/// the kernel driver that completes by interrupt. Table 4.2's baseline
/// column has "Completion: Baseline (interrupts) 5.82 / 5.87 µs" and
/// §4.3.4 measures the completion strategies "in addition to the interrupt
/// processing overhead for the baseline Moneta design"; the interrupt-
/// completing kernel stack with the atomic command word is Moneta+Atomic
/// (Table 3.1's costs), on the same array as Moneta-D. (Before the
/// re-audit the chapter's comparisons were made against the spinning 2Q
/// driver, which Table 4.2 does not describe.)
pub fn kernel_baseline() -> Config {
    preset("moneta-d", Stack::Atomic)
}

/// The baseline the chapter 4 comparisons "through the file system" are
/// made against: [`kernel_baseline`] with the file system's costs
/// (Table 3.1).
pub fn kernel_with_file_system() -> Config {
    let mut c = kernel_baseline();
    c.host.file_system = true;
    c
}

/// Dissertation ch. 4's comparisons of Moneta-D with baseline Moneta
/// through a file system (§4.4.1–4.4.2, the chapter's introduction and
/// summary), 16 XDD threads for throughput, 1 for latency.
pub fn direct_vs_file_system() -> Vec<Check> {
    let direct = preset("moneta-d", Stack::Direct);
    let kernel = kernel_with_file_system();
    let raw = kernel_baseline();
    let mut v = Vec::new();
    v.push(check(
        "512 B read latency removed: 1 − Moneta-D / Moneta".into(),
        "dissertation ch. 4 introduction \"by 64% (to 4.1 µs) relative to the original Moneta design\" (SPEC §3.5). Re-audit: against Moneta without a file system, as Table 4.2's baseline column gives it (1.26 + 0.17 + 3.90 + 5.82 = 11.15 µs, 1 − 4.1 / 11.15 = 63%; with its file system's 4.21 µs it would be 73%); it was checked against Moneta + FS",
        0.64,
        1.0 - latency_us(&direct, OpMix::Read, 512) / latency_us(&raw, OpMix::Read, 512),
        0.15,
        "",
    ));
    v.push(check(
        "4 KB write latency removed through the FS: 1 − Moneta-D / Moneta + FS".into(),
        "dissertation §4.5 \"by up to 58%\" (SPEC §3.5). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver",
        0.58,
        1.0 - latency_us(&direct, OpMix::Write, 4096) / latency_us(&kernel, OpMix::Write, 4096),
        0.15,
        "",
    ));
    v.push(check(
        "4 KB read latency removed through the FS: 1 − Moneta-D / Moneta + FS".into(),
        "dissertation §4.5 \"Reads are 60% faster\" (SPEC §3.5). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver",
        0.60,
        1.0 - latency_us(&direct, OpMix::Read, 4096) / latency_us(&kernel, OpMix::Read, 4096),
        0.15,
        "",
    ));
    let gain = |op, size| bandwidth(&direct, op, size, 16) / bandwidth(&kernel, op, size, 16);
    v.push(check(
        "4 KB write throughput through the FS: Moneta-D / Moneta + FS".into(),
        "dissertation §4.5 \"7.6×\" (SPEC §3.5). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver",
        7.6,
        gain(OpMix::Write, 4096),
        0.15,
        "×",
    ));
    let small_writes: Vec<f64> = [512, 1024, 2048, 4096]
        .into_iter()
        .map(|size| gain(OpMix::Write, size))
        .collect();
    v.push(check(
        "512 B bandwidth with a FS: Moneta-D / Moneta + FS, 50/50".into(),
        "dissertation ch. 4 introduction \"14.8× increase in bandwidth for 512 byte requests in the presence of a file system\" (SPEC §3.5). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver; the statement names no operation, and the chapter gives writes (§4.4.2's 26×) and reads (at most 34% lost) their own numbers, so it is read as the chapter's 50/50 mix (Figs. 4.5-4.6); it was the largest of read and write, which made it contradict the 26×",
        14.8,
        gain(OpMix::Mixed(0.5), 512),
        0.15,
        "×",
    ));
    v.push(check(
        "small writes through the FS: Moneta-D / Moneta + FS, largest over 512 B–4 KB".into(),
        "dissertation §4.4.2 \"26×\" (SPEC §3.5). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver",
        26.0,
        small_writes.iter().copied().fold(0.0, f64::max),
        0.15,
        "×",
    ));
    // §4.4.2: the file system's cost to the baseline itself, over Fig. 4.7's
    // sizes (its bandwidth figures are not in the seeds).
    let sizes = [512, 1024, 2048, 4096, 8192, 16384, 32768];
    let loss = |op| {
        sizes
            .iter()
            .map(|&size| bandwidth(&raw, op, size, 16) / bandwidth(&kernel, op, size, 16))
            .fold(0.0, f64::max)
    };
    v.push(check(
        "writes: Moneta / Moneta + FS bandwidth, largest over 512 B–32 KB".into(),
        "dissertation §4.4.2 \"up to 13×\" (seed 002; not in SPEC). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver",
        13.0,
        loss(OpMix::Write),
        0.15,
        "×",
    ));
    v.push(check(
        "reads: bandwidth lost to the FS, 1 − (Moneta + FS) / Moneta, largest over 512 B–32 KB"
            .into(),
        "dissertation §4.4.2 \"at most 34%\" (seed 002; not in SPEC). Re-audit: the baseline completes by interrupt (Table 4.2, §4.3.4), was the spinning 2Q driver",
        0.34,
        1.0 - 1.0 / loss(OpMix::Read),
        0.15,
        "",
    ));
    v
}

/// QuickSAN (dissertation ch. 5): Table 5.1's non-media totals for a
/// remote 4 KB access (one thread, distributed, 4 nodes), and §5.4.7's
/// energy statements (distributed, 4 nodes, 4 KB, 8 threads per host).
pub fn quicksan() -> Vec<Check> {
    quicksan_checks(&QuicksanRuns::run(SEED))
}

/// [`quicksan`]'s checks on runs made already (`moneta report` reads the
/// same runs for the orderings).
pub fn quicksan_checks(runs: &QuicksanRuns) -> Vec<Check> {
    use crate::san::interfaces::Interface;
    let src = "Table 5.1 non-media total (SPEC §4.2)";
    let mut v = Vec::new();
    for (interface, label, read, write) in [
        (Interface::QuicksanD, "QuickSAN direct", 17.2, 17.1),
        (Interface::QuicksanOs, "QuickSAN kernel", 22.2, 22.6),
        (Interface::Iscsi, "iSCSI", 288.1, 212.6),
        (Interface::FibreChannel, "Fibre Channel", 90.1, 90.8),
    ] {
        let src = if interface == Interface::QuicksanOs {
            KERNEL_SRC
        } else {
            src
        };
        for (op, published) in [("read", read), ("write", write)] {
            let r = runs.remote(interface, op);
            v.push(check(
                format!("{label} remote 4 KB {op}, non-media"),
                src,
                published,
                r.latency_us_mean - r.table_5_1.media_us,
                0.15,
                "µs",
            ));
        }
    }
    // Chapter 5's introduction and summary: "reduces overall latency by
    // 93% and improves bandwidth by 14.7× for 4 KB requests"; "can improve
    // bandwidth for small requests by up to 167×" (QuickSAN-D over iSCSI,
    // distributed, 4 nodes; the 4 KB figure taken for reads, as the
    // chapter's latency figures are).
    let remote_read = |i: Interface| runs.remote(i, "read").latency_us_mean;
    let src = "dissertation ch. 5 introduction and §5.5";
    v.push(check(
        "latency removed: 1 − QuickSAN-D / iSCSI, remote 4 KB read".into(),
        src,
        0.93,
        1.0 - remote_read(Interface::QuicksanD) / remote_read(Interface::Iscsi),
        0.05,
        "",
    ));
    // §5.5: "QuickSAN reduces software and block transport overheads by
    // between 82 and 95% compared to Fibre Channel and iSCSI-based SAN
    // implementations": 1 − QuickSAN-D's non-media time over theirs, remote
    // 4 KB reads and writes (Table 5.1's rows give 81–94%).
    let non_media = |i: Interface, op: &str| {
        let r = runs.remote(i, op);
        r.latency_us_mean - r.table_5_1.media_us
    };
    let removed: Vec<f64> = [Interface::FibreChannel, Interface::Iscsi]
        .into_iter()
        .flat_map(|other| ["read", "write"].map(move |op| (other, op)))
        .map(|(other, op)| 1.0 - non_media(Interface::QuicksanD, op) / non_media(other, op))
        .collect();
    for (label, published, value) in [
        (
            "smallest",
            0.82,
            removed.iter().copied().fold(f64::MAX, f64::min),
        ),
        (
            "largest",
            0.95,
            removed.iter().copied().fold(f64::MIN, f64::max),
        ),
    ] {
        v.push(check(
            format!("overheads removed: 1 − QuickSAN-D / Fibre Channel or iSCSI, {label}"),
            "dissertation §5.5 \"between 82 and 95%\" (seed 002; not in SPEC)",
            published,
            value,
            0.15,
            "",
        ));
    }
    let per_host = |i: Interface, op: &str, size: u64| runs.mb_per_s_per_host(i, op, size);
    let gain = |op: &str, size| {
        per_host(Interface::QuicksanD, op, size) / per_host(Interface::Iscsi, op, size)
    };
    // One row per figure on the report's page: the bandwidth statements
    // are Fig. 5.5's (§5.4.3), the latency one Table 5.1 / 5.2's.
    let src = "Fig. 5.5 (bandwidth): dissertation ch. 5 introduction and §5.5";
    v.push(check(
        "bandwidth: QuickSAN-D / iSCSI, 4 KB read".into(),
        src,
        14.7,
        gain("read", 4096),
        0.15,
        "×",
    ));
    v.push(check(
        "bandwidth: QuickSAN-D / iSCSI, 512 B, largest of read, write, 50/50".into(),
        src,
        167.0,
        ["read", "write", "mixed"]
            .iter()
            .map(|op| gain(op, 512))
            .fold(0.0, f64::max),
        0.15,
        "×",
    ));
    let joules = |i: Interface, op: &str| runs.joules_per_op(i, op);
    let ratios = |over: Interface| -> Vec<f64> {
        ["read", "write", "mixed"]
            .iter()
            .map(|op| joules(Interface::Iscsi, op) / joules(over, op))
            .collect()
    };
    let lowest = |v: &[f64]| v.iter().copied().fold(f64::INFINITY, f64::min);
    let highest = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let src = "Fig. 5.10 (energy per 4 KB IOP): dissertation §5.4.7 (SPEC §4.4)";
    let os = ratios(Interface::QuicksanOs);
    let d = ratios(Interface::QuicksanD);
    v.extend([
        check(
            "energy: iSCSI / QuickSAN-OS, lowest of read, write, 50/50".into(),
            src,
            6.2,
            lowest(&os),
            0.15,
            "×",
        ),
        check(
            "energy: iSCSI / QuickSAN-OS, highest".into(),
            src,
            12.7,
            highest(&os),
            0.15,
            "×",
        ),
        check(
            "energy: iSCSI / QuickSAN-D, lowest".into(),
            src,
            13.2,
            lowest(&d),
            0.15,
            "×",
        ),
        check(
            "energy: iSCSI / QuickSAN-D, highest".into(),
            src,
            27.4,
            highest(&d),
            0.15,
            "×",
        ),
        check(
            "energy, writes: QuickSAN-OS / QuickSAN-D".into(),
            src,
            4.0,
            joules(Interface::QuicksanOs, "write") / joules(Interface::QuicksanD, "write"),
            0.15,
            "×",
        ),
    ]);
    v
}

/// A function that runs one group of checks.
pub type CheckGroup = fn() -> Vec<Check>;

/// The groups of checks, in README order: (what, the function that runs
/// them). `moneta calibrate` runs them one by one so that an interrupt
/// between groups can still print the ones done.
pub fn groups() -> Vec<(&'static str, CheckGroup)> {
    vec![
        ("Table 3.4", table_3_4),
        ("software steps", software_steps),
        ("other systems", other_systems),
        ("Balance", balance),
        ("latency tolerance", latency_tolerance),
        ("power", power),
        ("Moneta-D and MICRO'10", direct_and_headline),
        ("Moneta-D completions", direct_completions),
        ("Moneta-D asynchronous IO", direct_async),
        ("Moneta-D and Moneta + FS", direct_vs_file_system),
        ("Moneta 2011 curves", moneta_2011_curves),
        ("QuickSAN", quicksan),
        ("NVMM", crate::nvmm::calibration::checks),
    ]
}

/// Every check, in README order.
pub fn all() -> Vec<Check> {
    groups().into_iter().flat_map(|(_, run)| run()).collect()
}

/// A markdown table of checks.
pub fn markdown(checks: &[Check]) -> String {
    let mut s = String::from("| check | source | published | simulated | error | tolerance | |\n|---|---|---|---|---|---|---|\n");
    for c in checks {
        let mark = if c.within() { "ok" } else { "**miss**" };
        let tolerance = c.tolerance_text();
        s.push_str(&format!(
            "| {} | {} | {} {} | {} {} | {:+.1}% | {} | {} |\n",
            c.name,
            c.source,
            c.published_text(),
            c.unit,
            format_table_number(c.simulated),
            c.unit,
            100.0 * c.error(),
            tolerance,
            mark
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calibration suite: every check within its tolerance except the
    /// documented deviations, which must still miss (so README stays true).
    #[test]
    fn calibration_against_published_numbers() {
        let checks = all();
        eprintln!("{}", markdown(&checks));
        let known = |name: &str| known_deviation(name).is_some();
        for (name, _) in KNOWN_DEVIATIONS
            .iter()
            .chain(crate::nvmm::calibration::KNOWN_MISSES)
        {
            assert!(
                checks.iter().any(|c| c.name == *name),
                "deviation '{name}' names no check"
            );
        }
        let mut problems = Vec::new();
        for c in &checks {
            match (c.within(), known(&c.name)) {
                (true, true) => problems.push(format!(
                    "'{}' now within tolerance: remove it from KNOWN_DEVIATIONS",
                    c.name
                )),
                (false, false) => problems.push(format!(
                    "'{}' off by {:+.1}% (±{:.0}%)",
                    c.name,
                    100.0 * c.error(),
                    100.0 * c.tolerance
                )),
                _ => {}
            }
        }
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }
}
