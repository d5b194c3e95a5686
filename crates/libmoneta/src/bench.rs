//! XDD on the emulator (`moneta bench`): closed-loop threads sharing one
//! channel, each keeping `queue_depth` requests in flight, with the same
//! address streams (`workload::AddressStream`) the simulator's XDD uses, so a
//! benchmark and its simulation ask for the same requests. Latency is
//! measured in the client from just before the submitting store to the
//! moment the completion is seen, so it includes the whole software path.
//!
//! Where time goes (SPEC §2.1), as far as the emulator sees it
//! ([`emulator_spans`]): the client's path up to its submit stamp, the
//! device's modeled time by component, and the model completion until the
//! client saw it; the spans add up to the measured mean.

use crate::{CompletionMode, Io, Moneta};
use moneta_abi::stats::EngineStats;
use moneta_abi::sys::monotonic_ns;
use moneta_abi::{EmuError, ErrorKind};
use moneta_model::stats::LatencyHistogram;
use moneta_model::summary::PointSummary;
use moneta_model::workload::{AddressStream, ThreadGroup};
use serde::Serialize;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// Threads, op mix, size, pattern and region (as the simulator's XDD).
    pub group: ThreadGroup,
    pub queue_depth: u32,
    /// Stop after this many requests (all threads), or after `duration_ns`.
    pub ops: Option<u64>,
    pub duration_ns: u64,
    pub mode: CompletionMode,
    pub seed: u64,
    /// Run the client threads under SCHED_FIFO (`moneta bench --realtime`,
    /// issue 21): the host's other threads cannot make them wait for a core.
    pub realtime: bool,
    /// Asked now and then: true stops the run early, and what it measured
    /// so far is the result (`moneta bench` on Ctrl-C).
    pub cancelled: Option<fn() -> bool>,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct BenchResult {
    pub ops: u64,
    pub bytes: u64,
    pub elapsed_ns: u64,
    pub latency: LatencyHistogram,
    /// Mean time from the client's clock read before submitting to the
    /// submit stamp the device times the request from (the library's path).
    pub submit_to_stamp_ns_mean: f64,
    /// Mean time from each request's model completion (its due word) until
    /// the client saw it: the device thread's posting, the hop back and
    /// the client's detection.
    pub due_to_seen_ns_mean: f64,
    /// The same, per request (its p50 and p99 go into the verdict).
    pub due_to_seen: LatencyHistogram,
    /// Threads of the whole machine that were runnable, on average over
    /// the run (sampled from /proc/stat every 10 ms; the sampler excluded).
    pub runnable_mean: f64,
    /// Every client thread ran under SCHED_FIFO (`BenchSpec::realtime`).
    pub realtime: bool,
}

/// What one client thread measured.
#[derive(Default)]
struct ThreadTotals {
    done: u64,
    latency: LatencyHistogram,
    submit_to_stamp_ns: u64,
    due_to_seen_ns: u64,
    due_to_seen: LatencyHistogram,
}

impl ThreadTotals {
    /// Request `io`, submitted at `t0` (CLOCK_MONOTONIC), was seen done now.
    fn record(&mut self, m: &Moneta, io: &Io, t0: u64) {
        let seen = monotonic_ns();
        self.latency.record(seen.saturating_sub(t0));
        self.submit_to_stamp_ns += io.issued_at_ns().saturating_sub(t0);
        let late = seen.saturating_sub(m.due_ns(io));
        self.due_to_seen_ns += late;
        self.due_to_seen.record(late);
        self.done += 1;
    }
}

impl BenchResult {
    pub fn iops(&self) -> f64 {
        self.ops as f64 * 1e9 / self.elapsed_ns.max(1) as f64
    }

    pub fn bandwidth_mb_per_s(&self) -> f64 {
        self.bytes as f64 * 1e3 / self.elapsed_ns.max(1) as f64
    }
}

/// Run the benchmark on `m` (which must already hold grants for the region).
pub fn run(m: &Moneta, spec: &BenchSpec) -> Result<BenchResult, EmuError> {
    let g = &spec.group;
    if g.threads == 0 || spec.queue_depth == 0 || g.size_bytes == 0 {
        return Err(EmuError::new(
            ErrorKind::Config,
            "threads, queue depth and size must be positive",
        ));
    }
    if g.size_bytes > m.max_request_bytes() {
        return Err(EmuError::new(
            ErrorKind::Config,
            format!(
                "size {} exceeds the largest request, {} bytes",
                g.size_bytes,
                m.max_request_bytes()
            ),
        ));
    }
    if g.region_bytes < g.size_bytes || g.region_offset_bytes + g.region_bytes > m.capacity_bytes()
    {
        return Err(EmuError::new(
            ErrorKind::Config,
            "the region must hold a request and fit the device",
        ));
    }
    if u64::from(g.threads) * u64::from(spec.queue_depth) * g.size_bytes.div_ceil(16 << 10) > 64 {
        return Err(EmuError::new(
            ErrorKind::Config,
            "threads × queue depth × 16 KiB slices per request exceed the channel's 64 tags",
        ));
    }
    let issued = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let ordinary = AtomicU64::new(0);
    let start = Instant::now();
    let load = HostLoad::start();
    let results: Vec<Result<ThreadTotals, EmuError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..g.threads)
            .map(|t| {
                let (issued, stop, ordinary) = (&issued, &stop, &ordinary);
                s.spawn(move || {
                    if spec.realtime {
                        if let Err(e) =
                            moneta_abi::sys::set_realtime(moneta_abi::sys::REALTIME_PRIORITY)
                        {
                            ordinary.fetch_add(1, Ordering::Relaxed);
                            eprintln!(
                                "moneta: bench threads stay ordinary threads: SCHED_FIFO: {e}"
                            );
                        }
                    }
                    let r = thread(m, spec, t as u64, issued, stop, start);
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .collect()
    });
    let elapsed_ns = start.elapsed().as_nanos() as u64;
    let runnable_mean = load.stop();
    let mut latency = LatencyHistogram::new();
    let mut due_to_seen = LatencyHistogram::new();
    let (mut ops, mut to_stamp, mut after_due) = (0, 0, 0);
    for r in results {
        let t = r?;
        ops += t.done;
        to_stamp += t.submit_to_stamp_ns;
        after_due += t.due_to_seen_ns;
        latency.merge(&t.latency);
        due_to_seen.merge(&t.due_to_seen);
    }
    let per_op = |ns: u64| ns as f64 / ops.max(1) as f64;
    Ok(BenchResult {
        ops,
        bytes: ops * g.size_bytes,
        elapsed_ns,
        latency,
        submit_to_stamp_ns_mean: per_op(to_stamp),
        due_to_seen_ns_mean: per_op(after_due),
        due_to_seen,
        runnable_mean,
        realtime: spec.realtime && ordinary.load(Ordering::Relaxed) == 0,
    })
}

/// How many threads of the machine want a core, sampled while a run goes.
pub struct HostLoad {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<f64>>,
}

impl HostLoad {
    pub fn start() -> HostLoad {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("bench-load".into())
            .spawn(move || {
                let (mut sum, mut n) = (0.0, 0u32);
                loop {
                    if let Some(r) = moneta_abi::fidelity::runnable_now() {
                        sum += r;
                        n += 1;
                    }
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                sum / f64::from(n.max(1))
            })
            .ok();
        HostLoad { stop, thread }
    }

    /// The mean number of runnable threads since start.
    pub fn stop(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or(0.0)
    }
}

/// Whether a run kept the emulator's promise, the model's timing (issue
/// 21, [`moneta_abi::fidelity`]): a request is behind by the time from its
/// model completion until its client saw it (the device thread's posting,
/// the hop back, the client's detection).
#[derive(Debug, Clone, Serialize)]
pub struct Fidelity {
    pub faithful: bool,
    pub verdict: String,
    /// The model's mean latency of the run's requests (µs).
    pub modeled_us_mean: f64,
    pub measured_us_mean: f64,
    /// From model completion until the client saw it (µs).
    pub behind_us_mean: f64,
    pub behind_us_p50: f64,
    pub behind_us_p99: f64,
    /// The device side: completions posted after their model time, and
    /// commands taken after their stamp (ns; since the daemon started).
    pub lateness_ns_mean: f64,
    pub lateness_ns_p99: f64,
    pub accept_delay_ns_mean: f64,
    pub accept_delay_ns_p99: f64,
    pub runnable_threads_mean: f64,
    pub cores: usize,
}

impl Fidelity {
    pub fn judge(r: &BenchResult, modeled_us_mean: f64, device: &EngineStats) -> Fidelity {
        let cores = moneta_abi::fidelity::cores();
        let behind_ns = r.due_to_seen_ns_mean;
        let (faithful, verdict) =
            moneta_abi::fidelity::judge(behind_ns, modeled_us_mean * 1e3, r.runnable_mean, cores);
        Fidelity {
            faithful,
            verdict,
            modeled_us_mean,
            measured_us_mean: r.latency.mean_ns() / 1e3,
            behind_us_mean: behind_ns / 1e3,
            behind_us_p50: r.due_to_seen.percentile_ns(0.5) / 1e3,
            behind_us_p99: r.due_to_seen.percentile_ns(0.99) / 1e3,
            lateness_ns_mean: device.lateness_ns_mean,
            lateness_ns_p99: device.lateness_ns_p99,
            accept_delay_ns_mean: device.accept_delay_ns_mean,
            accept_delay_ns_p99: device.accept_delay_ns_p99,
            runnable_threads_mean: r.runnable_mean,
            cores,
        }
    }
}

fn thread(
    m: &Moneta,
    spec: &BenchSpec,
    thread: u64,
    issued: &AtomicU64,
    stop: &AtomicBool,
    start: Instant,
) -> Result<ThreadTotals, EmuError> {
    let g = &spec.group;
    let mut addresses = AddressStream::new(g, spec.seed, thread);
    let mut totals = ThreadTotals::default();
    // Each request with the CLOCK_MONOTONIC reading just before its submission.
    let mut in_flight: Vec<(Io, u64)> = Vec::with_capacity(spec.queue_depth as usize);
    let mut turns = 0u32;
    loop {
        // Keep the queue full until the run's end.
        while in_flight.len() < spec.queue_depth as usize && !stop.load(Ordering::Relaxed) {
            if spec
                .ops
                .is_some_and(|limit| issued.fetch_add(1, Ordering::Relaxed) >= limit)
            {
                stop.store(true, Ordering::Relaxed);
                break;
            }
            let (op, addr) = addresses.next(g.op);
            let mut io = m.prepare(op, addr, g.size_bytes, spec.mode)?;
            let t0 = monotonic_ns();
            m.submit(&mut io)?;
            in_flight.push((io, t0));
        }
        if in_flight.is_empty() {
            return Ok(totals);
        }
        if spec.mode == CompletionMode::IssueSleep {
            // Sleep on the oldest; collect the others as they come.
            let (io, _) = &mut in_flight[0];
            m.wait(io)?;
            let (io, t0) = in_flight.swap_remove(0);
            totals.record(m, &io, t0);
            m.release(io);
        }
        let mut i = 0;
        while i < in_flight.len() {
            match m.try_complete(&mut in_flight[i].0) {
                None => i += 1,
                Some(r) => {
                    r?;
                    let (io, t0) = in_flight.swap_remove(i);
                    totals.record(m, &io, t0);
                    m.release(io);
                }
            }
        }
        turns = turns.wrapping_add(1);
        if turns.is_multiple_of(1 << 16) {
            m.check_device()?;
        }
        if turns.is_multiple_of(64) {
            let over = spec.ops.is_none() && start.elapsed().as_nanos() as u64 >= spec.duration_ns;
            if over || spec.cancelled.is_some_and(|f| f()) {
                stop.store(true, Ordering::Relaxed);
            }
        }
    }
}

/// `moneta bench`'s report: the fields of `moneta sim run`'s JSON that apply
/// to a measurement, plus the emulator's own.
#[derive(Debug, Clone, Serialize)]
pub struct BenchSummary {
    pub preset: String,
    /// "emulator": the real software path, measured.
    pub stack: String,
    /// "embedded" or the daemon's socket.
    pub target: String,
    pub op: String,
    pub read_fraction: f64,
    pub size_bytes: u64,
    pub pattern: String,
    pub region_bytes: u64,
    pub threads: u32,
    pub queue_depth: u32,
    pub completion: String,
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
    pub soft_misses: u64,
    pub hard_misses: u64,
    /// Where time went: mean µs per span ([`emulator_spans`]); sums to
    /// `latency_us_mean`.
    #[serde(serialize_with = "as_map")]
    pub breakdown_us: Vec<(String, f64)>,
    /// The device thread's own counters (timing precision, protection).
    pub device: EngineStats,
    /// The simulator on the same configuration (`--compare-sim`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim: Option<PointSummary>,
    /// Whether the host kept the model's timing ([`Fidelity`]).
    pub faithful: bool,
    pub verdict: String,
    pub fidelity: Fidelity,
    /// The client threads ran under SCHED_FIFO (`moneta bench --realtime`).
    pub realtime: bool,
}

impl BenchSummary {
    pub fn new(
        preset: &str,
        target: &str,
        spec: &BenchSpec,
        r: &BenchResult,
        m: &Moneta,
        before: &EngineStats,
        device: EngineStats,
    ) -> Self {
        let g = &spec.group;
        let latency_us_mean = r.latency.mean_ns() / 1e3;
        let (soft_misses, hard_misses) = m.misses();
        let breakdown_us = emulator_spans(before, &device, r);
        let modeled_us_mean = breakdown_us
            .iter()
            .filter(|(k, _)| k.starts_with("device: "))
            .map(|(_, us)| us)
            .sum();
        let fidelity = Fidelity::judge(r, modeled_us_mean, &device);
        BenchSummary {
            preset: preset.to_string(),
            stack: "emulator".into(),
            target: target.to_string(),
            op: g.op.name().to_string(),
            read_fraction: g.op.read_fraction(),
            size_bytes: g.size_bytes,
            pattern: if g.random { "random" } else { "sequential" }.into(),
            region_bytes: g.region_bytes,
            threads: g.threads,
            queue_depth: spec.queue_depth,
            completion: spec.mode.name().into(),
            seed: spec.seed,
            ops: r.ops,
            elapsed_ns: r.elapsed_ns,
            bandwidth_mb_per_s: r.bandwidth_mb_per_s(),
            iops: r.iops(),
            latency_us_mean,
            breakdown_us,
            latency_us_p50: r.latency.percentile_ns(0.5) / 1e3,
            latency_us_p99: r.latency.percentile_ns(0.99) / 1e3,
            latency_us_p99_9: r.latency.percentile_ns(0.999) / 1e3,
            latency_us_max: r.latency.max_ns() as f64 / 1e3,
            soft_misses,
            hard_misses,
            device,
            sim: None,
            faithful: fidelity.faithful,
            verdict: fidelity.verdict.clone(),
            fidelity,
            realtime: r.realtime,
        }
    }

    /// Hold the result to the simulator's prediction for the same
    /// configuration (`--compare-sim`): a mean faster than `sim`'s beyond
    /// the tolerance is not faithful either
    /// ([`moneta_abi::fidelity::judge_predicted`]).
    pub fn compare_with(&mut self, sim: PointSummary) {
        if let Some(text) = moneta_abi::fidelity::faster_than_model(
            self.latency_us_mean * 1e3,
            sim.latency_us_mean * 1e3,
        ) {
            self.faithful = false;
            self.verdict = text;
            self.fidelity.faithful = false;
            self.fidelity.verdict = self.verdict.clone();
        }
        self.sim = Some(sim);
    }
}

/// The options of the benchmark binaries (`benches/overhead.rs`,
/// `benches/fidelity.rs`): `--smoke` for a short run, `--json PATH` to
/// write the results.
pub struct BenchOptions {
    pub smoke: bool,
    pub json: Option<std::path::PathBuf>,
}

impl BenchOptions {
    pub fn from_args() -> BenchOptions {
        let args: Vec<String> = std::env::args().collect();
        BenchOptions {
            smoke: args.iter().any(|a| a == "--smoke"),
            json: args
                .iter()
                .position(|a| a == "--json")
                .and_then(|i| args.get(i + 1))
                .map(std::path::PathBuf::from),
        }
    }
}

/// How a benchmark prints a figure against its target.
pub fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// The raw cross-core cache-line round trip on this machine, now: two
/// threads hand one cache line back and forth `round_trips` times; the
/// median of `rounds` runs of the mean, in ns. The floor of any design in
/// which a client and a device thread talk through shared memory (a command
/// goes one way, its completion the other), so the software floor is
/// reported against it, measured in the same run (the figure moves between
/// ~120 and ~600 ns with vCPU placement).
pub fn cross_core_round_trip_ns(round_trips: u64, rounds: usize) -> f64 {
    #[repr(align(128))]
    struct Line(AtomicU64);
    let mut means: Vec<f64> = (0..rounds.max(1))
        .map(|_| {
            let line = Line(AtomicU64::new(0));
            let line = &line.0;
            std::thread::scope(|s| {
                s.spawn(|| {
                    // The echo: odd values are pings, answered with the next even one.
                    for i in 0..round_trips {
                        while line.load(Ordering::Acquire) != 2 * i + 1 {
                            std::hint::spin_loop();
                        }
                        line.store(2 * i + 2, Ordering::Release);
                    }
                });
                let start = Instant::now();
                for i in 0..round_trips {
                    line.store(2 * i + 1, Ordering::Release);
                    while line.load(Ordering::Acquire) != 2 * i + 2 {
                        std::hint::spin_loop();
                    }
                }
                start.elapsed().as_nanos() as f64 / round_trips.max(1) as f64
            })
        })
        .collect();
    means.sort_by(f64::total_cmp);
    means[means.len() / 2]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_takes_some_time() {
        let rtt = cross_core_round_trip_ns(1000, 3);
        assert!(rtt > 0.0 && rtt.is_finite(), "{rtt}");
    }
}

/// Where the measured time went, in spans that add up (µs, means): the
/// client's path up to the submit stamp (`client: submit → stamp`), the
/// device's modeled time by component (`device: <component>`, from the
/// device's counters before and after the run, so a shared daemon's earlier
/// requests do not count), the model completion until the client saw it
/// (`completion: due → seen`: the device thread's posting, the hop back,
/// the client's detection), and `other`, the rest of the mean latency: time
/// a request entered the model after its stamp (clamped), and the mismatch
/// when the device completed requests the client did not measure (it can
/// come out slightly negative).
pub fn emulator_spans(
    before: &EngineStats,
    after: &EngineStats,
    r: &BenchResult,
) -> Vec<(String, f64)> {
    let latency_us_mean = r.latency.mean_ns() / 1e3;
    let (n0, n1) = (
        before.device_time_requests as f64,
        after.device_time_requests as f64,
    );
    let n = n1 - n0;
    let mut spans = vec![(
        "client: submit → stamp".to_string(),
        r.submit_to_stamp_ns_mean / 1e3,
    )];
    let mean_since = |mean0: f64, mean1: f64| (mean1 * n1 - mean0 * n0) / n;
    let device = after.device_time_us.iter().map(|(key, us1)| {
        let us0 = before
            .device_time_us
            .iter()
            .find(|(k, _)| k == key)
            .map_or(0.0, |(_, us)| *us);
        (format!("device: {key}"), mean_since(us0, *us1))
    });
    if n > 0.0 {
        spans.extend(device);
    }
    spans.push(("completion: due → seen".into(), r.due_to_seen_ns_mean / 1e3));
    let seen: f64 = spans.iter().map(|(_, us)| us).sum();
    spans.push(("other".into(), latency_us_mean - seen));
    spans
}

fn as_map<S: serde::Serializer>(spans: &[(String, f64)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(spans.iter().map(|(k, v)| (k, v)))
}

#[cfg(test)]
mod spans_tests {
    use super::*;

    #[test]
    fn spans_count_only_this_run_and_sum_to_the_mean() {
        let before = EngineStats {
            device_time_requests: 100,
            device_time_us: vec![("dma".into(), 2.0)],
            lateness_ns_mean: 1000.0,
            ..EngineStats::default()
        };
        let after = EngineStats {
            device_time_requests: 300,
            device_time_us: vec![("dma".into(), 3.0), ("array".into(), 1.5)],
            lateness_ns_mean: 2000.0,
            ..EngineStats::default()
        };
        let mut latency = LatencyHistogram::new();
        latency.record(10_000);
        let r = BenchResult {
            ops: 1,
            bytes: 512,
            elapsed_ns: 10_000,
            latency,
            submit_to_stamp_ns_mean: 100.0,
            due_to_seen_ns_mean: 400.0,
            due_to_seen: LatencyHistogram::new(),
            runnable_mean: 1.0,
            realtime: false,
        };
        let spans = emulator_spans(&before, &after, &r);
        let get = |k: &str| spans.iter().find(|(n, _)| n == k).unwrap().1;
        assert_eq!(get("client: submit → stamp"), 0.1);
        assert_eq!(get("device: dma"), 3.5);
        assert_eq!(get("device: array"), 2.25);
        assert_eq!(get("completion: due → seen"), 0.4);
        assert!((get("other") - (10.0 - 0.1 - 3.5 - 2.25 - 0.4)).abs() < 1e-12);
        let sum: f64 = spans.iter().map(|(_, us)| us).sum();
        assert!((sum - 10.0).abs() < 1e-12);
    }
}
