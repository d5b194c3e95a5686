//! `moneta fio-sweep`: fio through the Moneta ioengine (`fio-engine/`,
//! README "A fio engine for Moneta") on a mount, at a sweep of queue
//! depths, beside the simulator's `direct` stack (Moneta-D's user-space
//! path, SPEC §3.2–§3.5, with §4.4.4's asynchronous requests) at the same
//! depth, with the verdict of `moneta_abi::fidelity` (late, or faster than
//! the model). Each cell is one fio run under its own run id, so the
//! daemon's counters of that run say how many of fio's requests the device
//! served and how late it posted them.

use crate::error::Error;
use crate::output::{self, Format};
use clap::Args;
use moneta::Moneta;
use moneta_abi::fidelity;
use moneta_model::config::{Config, Stack};
use moneta_model::summary::workload_point;
use moneta_model::workload::{OpMix, RunLimit, Workload};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Args)]
pub struct FioSweepArgs {
    /// The Moneta mount (from `moneta up`).
    #[arg(long, default_value = "/mnt/moneta")]
    mount: PathBuf,
    /// Queue depths (fio --iodepth), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    depths: Vec<u32>,
    /// fio workloads (--rw), comma-separated: randread, randwrite.
    #[arg(long, value_delimiter = ',', default_value = "randread,randwrite")]
    rw: Vec<String>,
    /// Request size.
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    bs: u64,
    /// The file's size (fio lays it out through the kernel, then fsyncs).
    #[arg(long, default_value_t = 256 << 20, value_parser = moneta_model::units::parse_size)]
    size: u64,
    /// Seconds per cell.
    #[arg(long, default_value_t = 3)]
    runtime: u32,
    /// The mount's preset (`moneta up --preset`), for the simulator.
    #[arg(long, default_value = "moneta-d")]
    preset: String,
    /// The mount's `--set KEY=VALUE` overrides, for the simulator.
    #[arg(long)]
    set: Vec<String>,
    /// The engine [default: libmoneta_fio.so next to this program, built
    /// by `make -C fio-engine`].
    #[arg(long)]
    engine: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// One fio run against its prediction.
#[derive(Debug, Serialize)]
struct Cell {
    rw: String,
    queue_depth: u32,
    iops: f64,
    /// fio's mean completion latency (submission to completion).
    latency_us_mean: f64,
    latency_us_p99: f64,
    /// The simulator's `direct` stack, one thread at this depth.
    sim_latency_us_mean: f64,
    sim_iops: f64,
    /// fio's requests and, of them, those the device served (the run's
    /// counters in the daemon).
    fio_requests: u64,
    device_requests: u64,
    /// The daemon's side: mean modeled device time and lateness.
    device_us_mean: f64,
    behind_us_mean: f64,
    faithful: bool,
    verdict: String,
}

pub fn fio_sweep(a: FioSweepArgs) -> crate::error::Result<()> {
    let (socket, mount) = crate::mount::running(&a.mount)?;
    let engine = match &a.engine {
        Some(e) => e.clone(),
        None => std::env::current_exe()
            .map_err(Error::because)?
            .with_file_name("libmoneta_fio.so"),
    };
    if !engine.exists() {
        return Err(format!(
            "{}: no fio engine (make -C fio-engine builds it)",
            engine.display()
        )
        .into());
    }
    let m = Moneta::connect(&socket)
        .map_err(|e| Error::failed_with(format!("{}", socket.display()), e))?;
    let mut config = Config::preset(&a.preset).map_err(Error::because)?;
    for kv in &a.set {
        config
            .set(kv)
            .map_err(|e| Error::failed_with(format!("--set {kv}"), e))?;
    }
    config.set_stack(Stack::Direct);
    let file = mount.join("moneta-fio-sweep");
    let mut cells = Vec::new();
    for rw in &a.rw {
        let mix = match rw.as_str() {
            "randread" => OpMix::Read,
            "randwrite" => OpMix::Write,
            other => return Err(format!("--rw {other}: randread or randwrite").into()),
        };
        for &qd in &a.depths {
            let run = format!("fio-sweep-{}-{rw}-{qd}", std::process::id());
            let job = fio(&a, &engine, &socket, &file, rw, qd, &run)?;
            let side = if mix == OpMix::Read { "read" } else { "write" };
            let measured = &job[side];
            let fio_requests = measured["total_ios"].as_u64().unwrap_or(0);
            let latency_ns = measured["lat_ns"]["mean"].as_f64().unwrap_or(0.0);
            let p99_ns = measured["clat_ns"]["percentile"]["99.000000"]
                .as_f64()
                .unwrap_or(0.0);
            let client = m
                .stats_of(Some(&run), None)
                .map_err(Error::because)?
                .client
                .unwrap_or_default();
            let ops = if mix == OpMix::Read {
                client.read
            } else {
                client.write
            };
            let per = |sum: u64| sum as f64 / ops.requests.max(1) as f64;
            let mut w = Workload::xdd(mix, a.bs, 1, a.size, RunLimit::Ops(20_000), 1);
            w.groups[0].queue_depth = qd;
            w.groups[0].random = true;
            let sim = workload_point(&config, &w)?;
            let (mut faithful, mut verdict) = fidelity::judge_predicted(
                per(ops.lateness_ns_sum),
                per(ops.device_ns_sum),
                fidelity::runnable_now().unwrap_or(0.0),
                fidelity::cores(),
                latency_ns,
                Some(sim.latency_us_mean * 1e3),
            );
            if ops.requests * 10 < fio_requests * 9 {
                faithful = false;
                verdict = format!(
                    "not measured on the device: it served {} of fio's {fio_requests} \
                     requests; {verdict}",
                    ops.requests
                );
            }
            cells.push(Cell {
                rw: rw.clone(),
                queue_depth: qd,
                iops: measured["iops"].as_f64().unwrap_or(0.0),
                latency_us_mean: latency_ns / 1e3,
                latency_us_p99: p99_ns / 1e3,
                sim_latency_us_mean: sim.latency_us_mean,
                sim_iops: sim.iops,
                fio_requests,
                device_requests: ops.requests,
                device_us_mean: per(ops.device_ns_sum) / 1e3,
                behind_us_mean: per(ops.lateness_ns_sum) / 1e3,
                faithful,
                verdict,
            });
        }
    }
    let _ = std::fs::remove_file(&file);
    print(&a, &cells)
}

/// One fio run through the engine: its job's JSON.
fn fio(
    a: &FioSweepArgs,
    engine: &Path,
    socket: &Path,
    file: &Path,
    rw: &str,
    qd: u32,
    run: &str,
) -> crate::error::Result<serde_json::Value> {
    let out = Command::new("fio")
        .env(moneta::RUN_ID_ENV, run)
        .arg("--name=moneta-fio-sweep")
        .arg(format!("--ioengine=external:{}", engine.display()))
        .arg(format!("--moneta_socket={}", socket.display()))
        .arg(format!("--filename={}", file.display()))
        .arg(format!("--rw={rw}"))
        .arg(format!("--bs={}", a.bs))
        .arg(format!("--size={}", a.size))
        .arg(format!("--iodepth={qd}"))
        .arg(format!("--runtime={}", a.runtime))
        .args(["--time_based", "--norandommap", "--output-format=json"])
        .output()
        .map_err(|e| Error::failed_with("running fio (make setup installs it)", e))?;
    if !out.status.success() {
        return Err(Error::failed(format!(
            "fio --rw={rw} --iodepth={qd} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    // fio may print notes before its JSON.
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value = serde_json::from_str(json)
        .map_err(|e| Error::failed_with(format!("fio's JSON ({text})"), e))?;
    Ok(v["jobs"][0].clone())
}

fn print(a: &FioSweepArgs, cells: &[Cell]) -> crate::error::Result<()> {
    match a.format {
        Format::Json => Ok(output::print_result_json(
            cells,
            &crate::provenance::Provenance::here(),
        )?),
        Format::Csv => Ok(output::print_result_csv(
            cells,
            &crate::provenance::Provenance::here(),
        )?),
        Format::Table => {
            println!(
                "fio through the Moneta engine on {} ({} B, {} s per cell) against `moneta sim` \
                 preset {}, stack direct, 1 thread",
                a.mount.display(),
                a.bs,
                a.runtime,
                a.preset
            );
            println!(
                "{:<10} {:>3} {:>10} {:>9} {:>9} {:>9} {:>10} {:>7} {:>9}  verdict",
                "rw", "qd", "IOPS", "mean µs", "p99 µs", "sim µs", "sim IOPS", "ratio", "device"
            );
            for c in cells {
                println!(
                    "{:<10} {:>3} {:>10.0} {:>9.2} {:>9.2} {:>9.2} {:>10.0} {:>7.2} {:>8.1}%  {}",
                    c.rw,
                    c.queue_depth,
                    c.iops,
                    c.latency_us_mean,
                    c.latency_us_p99,
                    c.sim_latency_us_mean,
                    c.sim_iops,
                    c.latency_us_mean / c.sim_latency_us_mean.max(f64::MIN_POSITIVE),
                    c.device_requests as f64 * 100.0 / c.fio_requests.max(1) as f64,
                    c.verdict
                );
            }
            Ok(())
        }
    }
}
