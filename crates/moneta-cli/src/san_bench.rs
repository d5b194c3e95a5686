//! `moneta san bench` (issue 12 item 8): local against remote access on an
//! emulated SAN (`moneta san up`), measured through node 0's daemon with
//! libmoneta (QuickSAN-D's path: the library, the device, the network
//! ports and the wire), beside the simulator's prediction for the same
//! device preset, node count, mirroring and request size
//! (`san::experiments::latency_of`, interface quicksan-d with the host
//! stack `raw`: one thread issuing serially, the device and the network
//! modeled, the host software left to the real library being measured).
//! Remote points, there and here, touch slices with no copy on node 0.
//!
//! Local requests fall in node 0's primary slice; remote ones in a slice
//! with no copy on node 0 (slice 1 unmirrored; mirrored, the slice whose
//! copies are on nodes 1 and 2, so it needs three nodes). Latency is one
//! request at a time; bandwidth keeps `--qd` requests of `--bw-size` in
//! flight from one thread.
//!
//! Every point carries the verdict of `moneta_abi::fidelity` (issue 21): how
//! far behind the model it ran (against the simulator's prediction where
//! there is one) and, when that is beyond the limit, why (more runnable
//! threads than cores, or a host too slow), and a point faster than the
//! simulator's prediction beyond `fidelity::FASTER_FRACTION` is not
//! faithful either; a warning on stderr and `faithful`/`verdict` in the
//! JSON say so for the whole run.

use crate::output::{print_aligned, Format};
use crate::san_up::load_state;
use clap::Args;
use moneta::bench::{self, BenchSpec};
use moneta::{CompletionMode, Moneta};
use moneta_emu::san_file::SanFile;
use moneta_model::config::{Config, Stack};
use moneta_model::san::experiments::{self, Setup};
use moneta_model::san::interfaces::Interface;
use moneta_model::san::system::Topology;
use moneta_model::units::Op;
use moneta_model::workload::{OpMix, RunLimit, Workload};
use serde::Serialize;

#[derive(Args)]
pub struct SanBenchArgs {
    #[arg(long, default_value = "san")]
    name: String,
    /// Requests per latency point.
    #[arg(long, default_value_t = 5000)]
    ops: u64,
    /// Request size of the latency points, bytes.
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
    /// Request size and queue depth of the bandwidth points.
    #[arg(long, default_value_t = 65536, value_parser = moneta_model::units::parse_size)]
    bw_size: u64,
    #[arg(long, default_value_t = 8)]
    qd: u32,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Debug, Serialize)]
struct Row {
    locality: &'static str,
    op: &'static str,
    size_bytes: u64,
    qd: u32,
    /// Emulated: measured through node 0's daemon.
    mean_us: f64,
    p50_us: f64,
    p99_us: f64,
    mb_per_s: f64,
    /// The simulator's mean for a lone request (latency points only).
    sim_mean_us: Option<f64>,
    /// How far behind the model the point ran (µs, mean): the measured
    /// mean beyond the simulator's where there is one, else from each
    /// request's model completion until node 0's client saw it.
    behind_us_mean: f64,
    /// Model completion until seen, per request (µs).
    behind_us_p50: f64,
    behind_us_p99: f64,
    /// Threads of the machine runnable during the point, on average.
    runnable_threads_mean: f64,
    /// The verdict (`moneta_abi::fidelity`): faithful, or why not.
    faithful: bool,
    verdict: String,
}

pub fn run(a: SanBenchArgs) -> crate::error::Result<()> {
    let state = load_state(&a.name)?;
    let file = SanFile::load(&state.san_file).map_err(|e| e.to_string())?;
    let nodes = state.nodes.len() as u16;
    let map = file.address_map().map_err(|e| e.to_string())?;
    let slice = map.slice_bytes();
    let m = Moneta::connect(&state.nodes[0].socket).map_err(|e| e.to_string())?;
    let config: Config = serde_json::from_value(m.info().config.clone())
        .map_err(|e| format!("node 0's configuration: {e}"))?;
    m.grant_raw(0, m.capacity_bytes(), true)
        .map_err(|e| format!("{e} (raw grants need the daemons' owner)"))?;
    // A slice with no copy on node 0.
    let remote = (1..map.capacity_bytes() / slice).find(|&s| {
        let base = s * slice;
        map.primary(base).0 != 0 && map.replica(base).is_none_or(|(r, _)| r != 0)
    });
    if remote.is_none() {
        eprintln!(
            "moneta: every slice has a copy on node 0: no remote points (mirrored needs 3 nodes)"
        );
    }
    let mut places = vec![("local", 0u64)];
    if let Some(s) = remote {
        places.push(("remote", s * slice));
    }
    let sim = if nodes >= 2 && remote.is_some() {
        // The emulated path runs the real libmoneta, not the modeled
        // QuickSAN-D library (stack `direct`, ~4 µs of 2012 software per
        // request): the prediction is the same SAN with the host's
        // software left out (`raw`), as `moneta bench --compare-sim`.
        let mut device = config.clone();
        device.set_stack(Stack::Raw);
        let setup = Setup {
            device,
            costs: config.san.clone(),
            seed: a.seed,
            ops: 2000,
            threads_per_host: 1,
        };
        experiments::latency_of(
            &setup,
            &[Interface::QuicksanD],
            Topology::Distributed { nodes },
            file.mirror,
            a.size,
            &mut |_, _, _| {},
        )?
    } else {
        Vec::new()
    };
    let mut rows = Vec::new();
    // Ctrl-C ends the point running (its partial measurement is kept) and
    // skips the rest; what was measured is printed.
    moneta_supervisor::signals::catch_signals();
    'points: for &(locality, offset) in &places {
        for op in [Op::Read, Op::Write] {
            let op_key = if op == Op::Read { "read" } else { "write" };
            for (size, qd, ops) in [(a.size, 1, a.ops), (a.bw_size, a.qd, a.ops / 2)] {
                if moneta_supervisor::signals::signal_received() {
                    break 'points;
                }
                let mix = if op == Op::Read {
                    OpMix::Read
                } else {
                    OpMix::Write
                };
                let mut w = Workload::xdd(mix, size, 1, slice / 2, RunLimit::Ops(1), a.seed);
                w.groups[0].region_offset_bytes = offset;
                let spec = BenchSpec {
                    group: w.groups[0].clone(),
                    queue_depth: qd,
                    ops: Some(ops.max(1)),
                    duration_ns: u64::MAX,
                    mode: CompletionMode::Dma,
                    seed: a.seed,
                    realtime: false,
                    cancelled: Some(moneta_supervisor::signals::signal_received),
                };
                eprintln!("moneta: {locality} {op_key} {size} B at QD {qd} …");
                let r = bench::run(&m, &spec).map_err(|e| e.to_string())?;
                let sim_mean_us = (qd == 1)
                    .then(|| {
                        sim.iter()
                            .find(|s| s.locality == locality && s.op == op_key)
                            .map(|s| s.latency_us_mean)
                    })
                    .flatten();
                let mean_us = r.latency.mean_ns() / 1e3;
                // The model's time for the point: the simulator's mean where
                // it predicts one (a remote request's model time starts over
                // at each wire crossing, so only the end-to-end prediction
                // shows the hops the host was late for); else what the
                // device modeled, the measured mean less the lag.
                let (behind_ns, modeled_ns) = match sim_mean_us {
                    Some(sim) => ((mean_us - sim).max(0.0) * 1e3, sim * 1e3),
                    None => (
                        r.due_to_seen_ns_mean,
                        (mean_us * 1e3 - r.due_to_seen_ns_mean).max(0.0),
                    ),
                };
                let (faithful, verdict) = moneta_abi::fidelity::judge_predicted(
                    behind_ns,
                    modeled_ns,
                    r.runnable_mean,
                    moneta_abi::fidelity::cores(),
                    mean_us * 1e3,
                    sim_mean_us.map(|us| us * 1e3),
                );
                rows.push(Row {
                    locality,
                    op: op_key,
                    size_bytes: size,
                    qd,
                    mean_us,
                    p50_us: r.latency.percentile_ns(0.5) / 1e3,
                    p99_us: r.latency.percentile_ns(0.99) / 1e3,
                    mb_per_s: r.bandwidth_mb_per_s(),
                    sim_mean_us,
                    behind_us_mean: behind_ns / 1e3,
                    behind_us_p50: r.due_to_seen.percentile_ns(0.5) / 1e3,
                    behind_us_p99: r.due_to_seen.percentile_ns(0.99) / 1e3,
                    runnable_threads_mean: r.runnable_mean,
                    faithful,
                    verdict,
                });
            }
        }
    }
    let faithful = rows.iter().all(|r| r.faithful);
    let verdict = match rows.iter().find(|r| !r.faithful) {
        None => "faithful".to_string(),
        Some(r) => format!(
            "{} of {} points not faithful; first, {} {} {} B QD {}: {}",
            rows.iter().filter(|r| !r.faithful).count(),
            rows.len(),
            r.locality,
            r.op,
            r.size_bytes,
            r.qd,
            r.verdict
        ),
    };
    if !faithful {
        eprintln!("moneta: warning: {verdict}");
    }
    match a.format {
        Format::Json => {
            let out = serde_json::json!({
                "san": a.name,
                "nodes": nodes,
                "mirror": file.mirror,
                "preset": config.name,
                "faithful": faithful,
                "verdict": verdict,
                "rows": rows,
            });
            crate::output::print_result_json(
                &out,
                &crate::provenance::Provenance::here().verdict(&verdict),
            )?;
        }
        _ => {
            println!(
                "SAN '{}': {nodes} nodes{}, preset {}, through node 0 (libmoneta, DMA completion)",
                a.name,
                if file.mirror { ", mirrored" } else { "" },
                config.name
            );
            let f = |v: f64| format!("{v:.2}");
            let header = [
                "locality",
                "op",
                "size",
                "qd",
                "mean µs",
                "p50 µs",
                "p99 µs",
                "MB/s",
                "sim µs",
                "behind µs",
                "faithful",
            ]
            .map(String::from);
            let mut table = Vec::new();
            for r in &rows {
                table.push(vec![
                    r.locality.to_string(),
                    r.op.to_string(),
                    r.size_bytes.to_string(),
                    r.qd.to_string(),
                    f(r.mean_us),
                    f(r.p50_us),
                    f(r.p99_us),
                    format!("{:.1}", r.mb_per_s),
                    r.sim_mean_us.map_or("-".into(), f),
                    f(r.behind_us_mean),
                    if r.faithful { "yes" } else { "no" }.into(),
                ]);
            }
            print_aligned(&header, &table);
            println!("verdict: {verdict}");
        }
    }
    if moneta_supervisor::signals::signal_received() {
        return Err(crate::error::Error::interrupted(format!(
            "interrupted: {} points measured, printed above",
            rows.len()
        )));
    }
    Ok(())
}
