//! Emulator fidelity against the simulator, on the wall clock (issue 9,
//! item 3; DESIGN "One model, two clocks").
//!
//! The deterministic twin test proves the emulator's device logic computes
//! exactly the simulator's completion times; what remains is how closely the
//! real software path around it (the client's submission, the device
//! thread's poll, the hop between cores and back) lets a client *see* those
//! times. That depends on the machine and its load, so it is a benchmark, not
//! a test: it prints its figures against their targets and never fails.
//!
//! One client thread, queue depth 1, DMA completion, an embedded device. For
//! each configuration the simulator (host stack `raw`: the device alone)
//! gives the modeled latency and the emulator measures it:
//!
//! - **the sweep**: the null device with a memory read latency of L, so the
//!   modeled QD1 latency of a 512 B read is about L; the smallest L whose
//!   mean latency is within 5% (and every larger one too) is the fidelity
//!   floor on this machine (goal: ≤ 2 µs);
//! - **published configurations**: `moneta` 4 KB reads (4.78 µs modeled;
//!   goal: within 5%) and the larger requests of the old fidelity test.
//!
//! The raw cross-core round trip is measured in the same run, beside them.
//!
//! `make fidelity` (= `cargo bench -p libmoneta --bench fidelity`; add
//! `-- --smoke` for a short run, `-- --json PATH` to write the results).

use moneta::bench::{self, cross_core_round_trip_ns, verdict, BenchOptions, BenchSpec};
use moneta::CompletionMode;
use moneta_emu::engine::EngineOptions;
use moneta_emu::medium::Medium;
use moneta_model::config::{Config, Stack};
use moneta_model::summary::workload_point;
use moneta_model::workload::{OpMix, RunLimit, Workload};

const REGION_BYTES: u64 = 256 << 20;
const TOLERANCE: f64 = 0.05;

struct Case {
    label: String,
    config: Config,
    op: OpMix,
    size: u64,
    queue_depth: u32,
}

#[derive(serde::Serialize)]
struct Outcome {
    label: String,
    size_bytes: u64,
    queue_depth: u32,
    modeled_latency_us: f64,
    measured_latency_us: f64,
    measured_latency_us_p50: f64,
    latency_error: f64,
    modeled_mb_per_s: f64,
    measured_mb_per_s: f64,
    bandwidth_error: f64,
    /// How long commands waited for the device thread to see them (not
    /// counted as device time: the client's stamp is).
    accept_delay_ns_mean: f64,
    /// How long after their model time completions were posted.
    lateness_ns_mean: f64,
    within: bool,
    /// The emulator's verdict on the point (`moneta_abi::fidelity`): late
    /// beyond its limit, or faster than the simulator beyond its tolerance.
    faithful: bool,
    verdict: String,
}

fn main() {
    let BenchOptions { smoke, json } = BenchOptions::from_args();
    let duration_ns: u64 = if smoke { 150_000_000 } else { 1_000_000_000 };
    let rtt = cross_core_round_trip_ns(if smoke { 20_000 } else { 200_000 }, 5);
    println!("cross-core cache-line round trip: {rtt:.0} ns (median of 5)");

    let sweep: &[u64] = if smoke {
        &[1000, 4000]
    } else {
        &[250, 500, 1000, 1500, 2000, 3000, 4000, 8000, 16000, 32000]
    };
    println!("\nsweep: null device, memory read latency L, 512 B reads, QD1");
    print_header();
    let mut swept = Vec::new();
    for &l in sweep {
        let mut config = Config::preset("null").expect("null preset");
        config
            .set(&format!("memory.latency_ns_read={l}"))
            .expect("a valid key");
        let case = Case {
            label: format!("null read, L = {l} ns"),
            config,
            op: OpMix::Read,
            size: 512,
            queue_depth: 1,
        };
        let o = measure(&case, duration_ns);
        print_row(&o);
        swept.push(o);
    }
    // The floor: the smallest modeled latency from which on every point is within.
    let floor = swept
        .iter()
        .rev()
        .take_while(|o| o.within)
        .last()
        .map(|o| o.modeled_latency_us);
    match floor {
        Some(f) => println!(
            "fidelity floor: {f:.2} µs modeled QD1 latency is reproduced within 5% (goal ≤ 2 µs: {})",
            verdict(f <= 2.0)
        ),
        None => println!("fidelity floor: no point of the sweep is within 5% (goal ≤ 2 µs: NOT met)"),
    }

    println!("\npublished configurations");
    print_header();
    let mut published = Vec::new();
    let cases: Vec<(&str, OpMix, u64, u32)> = if smoke {
        vec![("moneta", OpMix::Read, 4096, 1)]
    } else {
        vec![
            ("moneta", OpMix::Read, 4096, 1),
            ("moneta", OpMix::Read, 512, 1),
            ("moneta", OpMix::Write, 4096, 1),
            ("moneta", OpMix::Read, 65536, 1),
            ("moneta", OpMix::Write, 65536, 1),
            ("onyx-late", OpMix::Read, 65536, 1),
            ("onyx-late", OpMix::Read, 65536, 2),
            ("onyx-late", OpMix::Write, 4096, 1),
        ]
    };
    for (preset, op, size, queue_depth) in cases {
        let case = Case {
            label: format!("{preset} {}", op.name()),
            config: Config::preset(preset).expect("shipped preset"),
            op,
            size,
            queue_depth,
        };
        let o = measure(&case, duration_ns);
        print_row(&o);
        published.push(o);
    }
    let moneta_4k = &published[0];
    println!(
        "moneta 4 KB reads: {:.2} µs measured vs {:.2} µs modeled ({:+.1}%; goal within 5%: {})",
        moneta_4k.measured_latency_us,
        moneta_4k.modeled_latency_us,
        moneta_4k.latency_error * 100.0,
        verdict(moneta_4k.within)
    );
    if let Some(path) = json {
        let doc = serde_json::json!({
            "cross_core_round_trip_ns": rtt,
            "fidelity_floor_us": floor,
            "floor_goal_us": 2.0,
            "sweep": swept,
            "published": published,
        });
        let text = serde_json::to_string_pretty(&doc).expect("json");
        if let Err(e) = std::fs::write(&path, text + "\n") {
            eprintln!("fidelity: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
    }
}

fn print_header() {
    println!(
        "{:<24} {:>6} {:>3} {:>10} {:>10} {:>8} {:>8} {:>9} {:>9}  within 5%",
        "configuration",
        "size",
        "qd",
        "model µs",
        "meas. µs",
        "error",
        "bw err",
        "accept ns",
        "late ns"
    );
}

fn print_row(o: &Outcome) {
    println!(
        "{:<24} {:>6} {:>3} {:>10.3} {:>10.3} {:>+7.1}% {:>+7.1}% {:>9.0} {:>9.0}  {}",
        o.label,
        o.size_bytes,
        o.queue_depth,
        o.modeled_latency_us,
        o.measured_latency_us,
        o.latency_error * 100.0,
        o.bandwidth_error * 100.0,
        o.accept_delay_ns_mean,
        o.lateness_ns_mean,
        if o.within { "yes" } else { "no" }
    );
    if !o.faithful {
        println!("    verdict: {}", o.verdict);
    }
}

/// Simulate `case` (the device alone) and measure it on the emulator.
fn measure(case: &Case, duration_ns: u64) -> Outcome {
    let mut workload = Workload::xdd(
        case.op,
        case.size,
        1,
        REGION_BYTES,
        RunLimit::DurationNs(duration_ns),
        7,
    );
    let mut sim_config = case.config.clone();
    sim_config.set_stack(Stack::Raw);
    // A closed loop of `queue_depth` requesters is the same offered load.
    let mut sim_workload = workload.clone();
    sim_workload.groups[0].threads = case.queue_depth;
    let sim = workload_point(&sim_config, &sim_workload).expect("simulation");

    let medium = Medium::anonymous(case.config.device.capacity_bytes).expect("medium");
    let options = EngineOptions {
        seed: 7,
        populate_bytes: REGION_BYTES,
        ..EngineOptions::default()
    };
    let m = moneta::embedded(case.config.clone(), medium, options).expect("embedded device");
    m.grant_raw(0, REGION_BYTES, true).expect("raw grant");
    workload.groups[0].threads = 1;
    let spec = BenchSpec {
        group: workload.groups[0].clone(),
        queue_depth: case.queue_depth,
        ops: None,
        duration_ns,
        mode: CompletionMode::Dma,
        seed: 7,
        realtime: false,
        cancelled: None,
    };
    // Warm up (caches, the device thread's first polls), then measure.
    let warm_up = BenchSpec {
        duration_ns: duration_ns / 5,
        ..spec.clone()
    };
    bench::run(&m, &warm_up).expect("warm-up");
    let r = bench::run(&m, &spec).expect("benchmark");
    // Cumulative over the warm-up and the run.
    let after = m.stats().expect("device statistics");
    let measured_latency_us = r.latency.mean_ns() / 1e3;
    let latency_error = measured_latency_us / sim.latency_us_mean - 1.0;
    let bandwidth_error = r.bandwidth_mb_per_s() / sim.bandwidth_mb_per_s - 1.0;
    let (faithful, verdict) = moneta_abi::fidelity::judge_predicted(
        r.due_to_seen_ns_mean,
        sim.latency_us_mean * 1e3,
        r.runnable_mean,
        moneta_abi::fidelity::cores(),
        r.latency.mean_ns(),
        Some(sim.latency_us_mean * 1e3),
    );
    Outcome {
        label: case.label.clone(),
        size_bytes: case.size,
        queue_depth: case.queue_depth,
        modeled_latency_us: sim.latency_us_mean,
        measured_latency_us,
        measured_latency_us_p50: r.latency.percentile_ns(0.5) / 1e3,
        latency_error,
        modeled_mb_per_s: sim.bandwidth_mb_per_s,
        measured_mb_per_s: r.bandwidth_mb_per_s(),
        bandwidth_error,
        accept_delay_ns_mean: after.accept_delay_ns_mean,
        lateness_ns_mean: after.lateness_ns_mean,
        within: latency_error.abs() <= TOLERANCE && bandwidth_error.abs() <= TOLERANCE,
        faithful,
        verdict,
    }
}
