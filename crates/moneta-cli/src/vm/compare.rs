//! `moneta vm compare`: the papers' comparison of the kernel's IO stack
//! with the user-space direct path on one device (MICRO'10 Table 3.1's
//! per-layer costs, SPEC §1.5–§1.7; Moneta-D's direct path, SPEC §3.2), in
//! one command. The same fio job runs
//!
//! - in a guest (QEMU, crates/moneta-vhost) on its raw `/dev/vda`, O_DIRECT;
//! - in a guest on a file of XFS made on `/dev/vda`, O_DIRECT;
//! - on the host through a channel of the same device (libmoneta's
//!   user-space path, in this process: no kernel, no socket);
//! - in the simulator, one thread, through the kernel stacks `base`,
//!   `nosched`, `atomic`, `spin` and the `direct` stack (and `raw`: the
//!   device alone),
//!
//! and one table (and figure) puts them side by side with the verdicts.
//! Measured rows say whether the guest's CPU was emulated (TCG): then the
//! guest kernel's own costs are an emulated CPU's, not a real kernel's.

use super::{socket_or_default, start_device, DEFAULT_CACHE};
use crate::output::{self, Format};
use crate::plot::{self, Report, ReportSection, StackedBars};
use crate::provenance::Provenance;
use crate::DeviceArgs;
use clap::Args;
use moneta_abi::fidelity;
use moneta_emu::control::ControlPlane;
use moneta_model::config::Stack;
use moneta_model::summary::workload_point;
use moneta_model::units::{format_size, parse_size, parse_size_list, LEGEND_UNITS};
use moneta_model::workload::{OpMix, RunLimit, Workload};
use moneta_vhost::backend::{ChannelTarget, Stats};
use moneta_vhost::blk::Target;
use moneta_vhost::guest::{RunSpec, DEFAULT_PROGRAMS};
use moneta_vhost::vm::{self, VmResult, VmSpec};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The loop → FUSE → NBD kernel path's transport per IO (µs), measured
/// with `moneta up --kernel-path device` (docs/src/guide/kernel-path.md).
const NBD_TRANSPORT_US: (f64, f64) = (95.0, 175.0);

/// The simulator's stacks beside the measurements, at queue depth 1.
const SIM_STACKS: [&str; 6] = ["raw", "direct", "spin", "atomic", "nosched", "base"];

const BEGIN: &str = "@@moneta-fio-begin";
const END: &str = "@@moneta-fio-end";

#[derive(Args)]
pub struct VmCompareArgs {
    #[command(flatten)]
    device: DeviceArgs,
    /// Random seed of the device model and of the simulator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// fio workloads (--rw), comma-separated: randread, randwrite.
    #[arg(long, value_delimiter = ',', default_value = "randread,randwrite")]
    rw: Vec<String>,
    /// Request sizes, comma-separated (512 B to 256 KB).
    #[arg(long, default_value = "4k")]
    sizes: String,
    /// io_uring queue depths run besides psync at depth 1 (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    uring_depths: Vec<u32>,
    /// Seconds per fio job (and per host-path cell).
    #[arg(long, default_value_t = 3)]
    runtime_s: u32,
    /// Bytes each job touches: the raw device's first bytes, or the size
    /// of fio's file on XFS.
    #[arg(long, default_value = "64m", value_parser = parse_size)]
    region: u64,
    /// Leave out the XFS guest run.
    #[arg(long)]
    no_xfs: bool,
    /// Guest memory (MiB).
    #[arg(long, default_value_t = 512)]
    memory_mib: u64,
    /// Kill QEMU and fail after this many seconds (per guest run).
    #[arg(long, default_value_t = 900)]
    timeout_s: u64,
    /// Use TCG even where KVM is usable.
    #[arg(long)]
    tcg: bool,
    /// Copy the guests' consoles (boot messages) to stderr.
    #[arg(long)]
    console: bool,
    /// The kernel and initramfs cache.
    #[arg(long, default_value = DEFAULT_CACHE)]
    cache: PathBuf,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Write an SVG figure: mean latency per path, per job.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write an HTML page: the figure, the table, the transport estimate.
    #[arg(long)]
    report: Option<PathBuf>,
}

/// One fio job: workload, size, engine and depth.
#[derive(Debug, Clone, PartialEq)]
struct Job {
    rw: String,
    size_bytes: u64,
    engine: &'static str,
    queue_depth: u32,
}

impl Job {
    fn label(&self) -> String {
        format!(
            "{} {} {} QD{}",
            self.rw,
            format_size(self.size_bytes as f64, true, &LEGEND_UNITS),
            self.engine,
            self.queue_depth
        )
    }

    fn mix(&self) -> OpMix {
        if self.rw == "randread" {
            OpMix::Read
        } else {
            OpMix::Write
        }
    }

    /// The guest's fio command line for this job on `filename`.
    fn fio(&self, filename: &str, region: u64, runtime_s: u32) -> String {
        format!(
            "fio --name=moneta --filename={filename} --rw={} --bs={} --direct=1 \
             --ioengine={} --iodepth={} --size={region} --runtime={runtime_s} --time_based \
             --norandommap --randrepeat=0 --output-format=json",
            self.rw, self.size_bytes, self.engine, self.queue_depth
        )
    }
}

/// One row of the comparison.
#[derive(Debug, Clone, Serialize)]
struct Row {
    job: String,
    rw: String,
    size_bytes: u64,
    engine: String,
    queue_depth: u32,
    /// guest raw, guest XFS, host direct, or sim STACK.
    path: String,
    /// measured (TCG/KVM), or simulated.
    kind: String,
    latency_us_mean: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    iops: f64,
    /// Measured rows: whether the device's completions were seen at their
    /// model time, for the whole run the row belongs to.
    faithful: Option<bool>,
    verdict: String,
}

pub fn compare(a: VmCompareArgs) -> Result<(), String> {
    plot::check_outputs(a.plot.as_deref(), a.report.as_deref())?;
    let jobs = jobs(&a)?;
    let (engine, plane, preset) = start_device(&a.device, a.seed, None)?;
    let capacity = plane.engine().address_space_bytes();
    if a.region > capacity {
        return Err(format!(
            "--region {}: the device has {capacity} bytes",
            a.region
        ));
    }
    if !a.no_xfs && capacity < 300 << 20 {
        return Err(format!(
            "the device has {capacity} bytes; mkfs.xfs needs 300 MB \
             (--set device.capacity_bytes=1073741824, or --no-xfs)"
        ));
    }
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    let mut targets = vec![("guest raw", "/dev/vda", None)];
    if !a.no_xfs {
        targets.push(("guest XFS", "/mnt/moneta-fio", Some("xfs".to_string())));
    }
    for (path, filename, fs) in targets {
        eprintln!(
            "vm compare: booting a guest for {path} ({} fio jobs)",
            jobs.len()
        );
        let script: String = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| {
                format!(
                    "echo {BEGIN} {i}; {}; echo; echo {END} {i}\n",
                    j.fio(filename, a.region, a.runtime_s)
                )
            })
            .collect();
        let spec = VmSpec {
            cache: a.cache.clone(),
            programs: DEFAULT_PROGRAMS.iter().map(|p| p.to_string()).collect(),
            run: RunSpec {
                command: vec!["sh".into(), "-c".into(), script],
                mount_fs: fs,
                files: Vec::new(),
            },
            memory_mib: a.memory_mib,
            timeout: Duration::from_secs(a.timeout_s),
            read_only: false,
            socket: socket_or_default(None, &format!("-{}", path.replace(' ', "-"))),
            echo_console: a.console,
            echo_output: false,
            force_tcg: a.tcg,
        };
        let r = vm::run(&plane, &spec)?;
        if let Some(f) = &r.outcome.failure {
            return Err(format!("vm compare: {path}: {f}"));
        }
        if r.outcome.exit_code != Some(0) {
            return Err(format!(
                "vm compare: {path}: the guest's fio failed (exit {:?}): {}",
                r.outcome.exit_code,
                r.outcome.output.join("\n")
            ));
        }
        let measured = guest_results(&r.outcome.output, jobs.len())?;
        for (job, m) in jobs.iter().zip(measured) {
            rows.push(Row {
                path: path.to_string(),
                kind: format!("measured, {}", accel_short(&r)),
                latency_us_mean: m.mean,
                latency_us_p50: m.p50,
                latency_us_p99: m.p99,
                iops: m.iops,
                faithful: Some(r.faithful),
                verdict: r.verdict.clone(),
                ..row_of(job)
            });
        }
        runs.push((path, r));
    }
    for job in jobs
        .iter()
        .filter(|j| j.queue_depth == 1 && j.engine == "psync")
    {
        rows.push(host_direct(&plane, job, &a)?);
    }
    for job in &jobs {
        rows.extend(simulated(&a, job)?);
    }
    drop(plane);
    drop(engine);
    let accel = runs
        .first()
        .map_or("no guest".to_string(), |(_, r)| r.accel.label().to_string());
    let kernel = runs
        .first()
        .map_or(String::new(), |(_, r)| r.kernel_release.clone());
    let notes = transport_notes(&rows, &accel);
    let all_faithful = runs.iter().all(|(_, r)| r.faithful);
    let provenance = Provenance::here().seed(a.seed).verdict(if all_faithful {
        "faithful"
    } else {
        "not faithful"
    });
    match a.format {
        Format::Json => output::print_result_json(&rows, &provenance)?,
        Format::Csv => output::print_result_csv(&rows, &provenance)?,
        Format::Table => {
            println!("{accel}; kernel {kernel}; preset {preset}");
            for (path, r) in &runs {
                println!("{path}: {}", r.verdict);
            }
            let header: Vec<String> =
                ["job", "path", "kind", "mean µs", "p50 µs", "p99 µs", "IOPS"]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            let cells: Vec<Vec<String>> = rows.iter().map(table_cells).collect();
            output::print_aligned(&header, &cells);
            for n in &notes {
                println!("{n}");
            }
        }
    }
    let bars = figure(&rows, &accel);
    if let Some(p) = &a.plot {
        plot::write_file_from(p, &bars.to_svg(1100, 560), &provenance)
            .map_err(|e| e.to_string())?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.report {
        let mut sections = vec![
            ReportSection::Paragraph(format!(
                "{accel}; guest kernel {kernel}; preset {preset}. Measured rows: fio in the \
                 guest (O_DIRECT) and the host's user-space channel on the same emulated device; \
                 simulated rows: one thread through the model's stacks."
            )),
            ReportSection::Bars(bars),
        ];
        for (path, r) in &runs {
            sections.push(ReportSection::Paragraph(format!("{path}: {}", r.verdict)));
        }
        sections.push(ReportSection::Table {
            header: ["job", "path", "kind", "mean µs", "p50 µs", "p99 µs", "IOPS"]
                .iter()
                .map(|s| s.to_string())
                .collect(),
            rows: rows.iter().map(table_cells).collect(),
        });
        sections.push(ReportSection::Heading("Per-IO transport".into()));
        sections.extend(notes.iter().cloned().map(ReportSection::Paragraph));
        let report = Report {
            title: format!("Guest kernel against the direct path ({accel})"),
            sections,
        };
        plot::write_file_from(p, &report.to_html(), &provenance).map_err(|e| e.to_string())?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

fn jobs(a: &VmCompareArgs) -> Result<Vec<Job>, String> {
    let sizes = parse_size_list("--sizes", &a.sizes)?;
    for &s in &sizes {
        if !(512..=256 << 10).contains(&s) || s % 512 != 0 {
            return Err(format!(
                "--sizes {s}: a multiple of 512 B from 512 B to 256 KB"
            ));
        }
    }
    if let Some(d) = a.uring_depths.iter().find(|&&d| d == 0 || d > 64) {
        return Err(format!("--uring-depths {d}: from 1 to 64"));
    }
    if a.runtime_s == 0 {
        return Err("--runtime-s 0: at least 1".into());
    }
    let mut jobs = Vec::new();
    for rw in &a.rw {
        if rw != "randread" && rw != "randwrite" {
            return Err(format!("--rw {rw}: randread or randwrite"));
        }
        for &size_bytes in &sizes {
            let engines = std::iter::once(("psync", 1))
                .chain(a.uring_depths.iter().map(|&d| ("io_uring", d)));
            for (engine, queue_depth) in engines {
                jobs.push(Job {
                    rw: rw.clone(),
                    size_bytes,
                    engine,
                    queue_depth,
                });
            }
        }
    }
    Ok(jobs)
}

fn row_of(job: &Job) -> Row {
    Row {
        job: job.label(),
        rw: job.rw.clone(),
        size_bytes: job.size_bytes,
        engine: job.engine.to_string(),
        queue_depth: job.queue_depth,
        path: String::new(),
        kind: String::new(),
        latency_us_mean: 0.0,
        latency_us_p50: 0.0,
        latency_us_p99: 0.0,
        iops: 0.0,
        faithful: None,
        verdict: String::new(),
    }
}

fn accel_short(r: &VmResult) -> &'static str {
    match r.accel {
        moneta_vhost::qemu::Accel::Kvm => "KVM",
        moneta_vhost::qemu::Accel::Tcg => "TCG",
    }
}

/// One fio job's numbers (µs; fio's p50 and p99 are of completion latency).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Measured {
    mean: f64,
    p50: f64,
    p99: f64,
    iops: f64,
}

/// Each job's numbers, from fio's JSON between the markers in the guest's
/// output.
fn guest_results(output: &[String], jobs: usize) -> Result<Vec<Measured>, String> {
    let mut out = Vec::with_capacity(jobs);
    for i in 0..jobs {
        let begin = format!("{BEGIN} {i}");
        let end = format!("{END} {i}");
        let start = output
            .iter()
            .position(|l| l.trim() == begin)
            .ok_or_else(|| format!("no output of fio job {i} from the guest"))?;
        let stop = output[start..]
            .iter()
            .position(|l| l.trim() == end)
            .ok_or_else(|| format!("fio job {i}'s output has no end"))?;
        out.push(fio_numbers(&output[start + 1..start + stop].join("\n"))?);
    }
    Ok(out)
}

/// The numbers of fio's JSON (notes before it are skipped).
fn fio_numbers(text: &str) -> Result<Measured, String> {
    let json = text.find('{').map_or("", |i| &text[i..]);
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("fio's JSON: {e}: {text}"))?;
    let job = &v["jobs"][0];
    let side = if job["read"]["total_ios"].as_u64().unwrap_or(0) > 0 {
        &job["read"]
    } else {
        &job["write"]
    };
    let mean = side["lat_ns"]["mean"]
        .as_f64()
        .ok_or_else(|| format!("fio's JSON has no lat_ns.mean: {text}"))?;
    let pct = |p: &str| side["clat_ns"]["percentile"][p].as_f64().unwrap_or(0.0) / 1e3;
    Ok(Measured {
        mean: mean / 1e3,
        p50: pct("50.000000"),
        p99: pct("99.000000"),
        iops: side["iops"].as_f64().unwrap_or(0.0),
    })
}

/// The job at depth 1 through a channel of the device in this process:
/// random size-aligned offsets in the region, for the job's runtime.
fn host_direct(plane: &Arc<ControlPlane>, job: &Job, a: &VmCompareArgs) -> Result<Row, String> {
    let stats = Arc::new(Stats::default());
    let target = ChannelTarget::open(plane, 0, a.region, false, stats.clone())?;
    let mut buf = vec![0x5au8; job.size_bytes as usize];
    let slots = (a.region / job.size_bytes).max(1);
    let mut rng = a.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut latencies = Vec::new();
    let until = Instant::now() + Duration::from_secs(a.runtime_s.into());
    while Instant::now() < until && latencies.len() < 2_000_000 {
        // xorshift64*: offsets only, no statistics rest on it.
        rng ^= rng >> 12;
        rng ^= rng << 25;
        rng ^= rng >> 27;
        let addr = (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) % slots) * job.size_bytes;
        let t = Instant::now();
        if job.mix() == OpMix::Read {
            target.read(addr, &mut buf)?;
        } else {
            target.write(addr, &buf)?;
        }
        latencies.push(t.elapsed().as_nanos() as f64 / 1e3);
    }
    let s = stats.snapshot();
    let (faithful, verdict) = fidelity::judge(
        s.behind_ns_mean,
        s.modeled_ns_mean,
        fidelity::runnable_now().unwrap_or(0.0),
        fidelity::cores(),
    );
    let n = latencies.len().max(1) as f64;
    let mean = latencies.iter().sum::<f64>() / n;
    latencies.sort_by(f64::total_cmp);
    let at = |q: f64| {
        latencies
            .get(((latencies.len() as f64 * q) as usize).min(latencies.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Row {
        path: "host direct".into(),
        kind: "measured, host".into(),
        latency_us_mean: mean,
        latency_us_p50: at(0.5),
        latency_us_p99: at(0.99),
        iops: n / a.runtime_s as f64,
        faithful: Some(faithful),
        verdict,
        ..row_of(job)
    })
}

/// The job in the simulator: every stack of [`SIM_STACKS`] for psync at
/// depth 1; deeper io_uring queues only through `direct` (the kernel stacks
/// are synchronous); io_uring at depth 1 is psync's job to the model.
fn simulated(a: &VmCompareArgs, job: &Job) -> Result<Vec<Row>, String> {
    let base = a.device.config()?;
    let stacks: &[&str] = match (job.engine, job.queue_depth) {
        ("psync", _) => &SIM_STACKS,
        (_, 1) => &[],
        _ => &["direct"],
    };
    let mut rows = Vec::new();
    for &name in stacks {
        let mut config = base.clone();
        config.set_stack(Stack::parse(name).map_err(|e| e.to_string())?);
        let mut w = Workload::xdd(
            job.mix(),
            job.size_bytes,
            1,
            a.region,
            RunLimit::Ops(20_000),
            a.seed,
        );
        w.groups[0].queue_depth = job.queue_depth;
        let p = workload_point(&config, &w)?;
        rows.push(Row {
            path: format!("sim {name}"),
            kind: "simulated".into(),
            latency_us_mean: p.latency_us_mean,
            latency_us_p50: p.latency_us_p50,
            latency_us_p99: p.latency_us_p99,
            iops: p.iops,
            faithful: None,
            verdict: "model".into(),
            ..row_of(job)
        });
    }
    Ok(rows)
}

fn table_cells(r: &Row) -> Vec<String> {
    vec![
        r.job.clone(),
        r.path.clone(),
        match r.faithful {
            Some(true) => format!("{}, faithful", r.kind),
            Some(false) => format!("{}, not faithful", r.kind),
            None => r.kind.clone(),
        },
        format!("{:.1}", r.latency_us_mean),
        format!("{:.1}", r.latency_us_p50),
        format!("{:.1}", r.latency_us_p99),
        format!("{:.0}", r.iops),
    ]
}

/// (median, mean) latency of `path`'s row for `job`.
fn latency_of(rows: &[Row], job: &str, path: &str) -> Option<(f64, f64)> {
    rows.iter()
        .find(|r| r.job == job && r.path == path)
        .map(|r| (r.latency_us_p50, r.latency_us_mean))
}

/// Per psync QD1 job: the guest kernel's cost over the host's direct path
/// on the same device (the guest's block layer, virtio and, under TCG,
/// the emulated CPU), XFS's over the raw device, and the simulator's
/// kernel stacks' over its direct stack, beside loop/FUSE/NBD's transport.
/// Medians first: on a loaded host a mean is its tail's.
fn transport_notes(rows: &[Row], accel: &str) -> Vec<String> {
    let mut notes = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.engine == "psync") {
        if seen.contains(&r.job.as_str()) {
            continue;
        }
        seen.push(&r.job);
        let m = |p: &str| latency_of(rows, &r.job, p);
        let (Some(host), Some(sim_direct)) = (m("host direct"), m("sim direct")) else {
            continue;
        };
        let over = |x: (f64, f64), y: (f64, f64)| {
            format!("median {:.1} µs, mean {:.1} µs", x.0 - y.0, x.1 - y.1)
        };
        let mut parts = Vec::new();
        if let Some(raw) = m("guest raw") {
            parts.push(format!(
                "guest kernel + virtio over the host's direct path: {} per IO ({accel}), \
                 against loop/FUSE/NBD's {:.0}–{:.0} µs",
                over(raw, host),
                NBD_TRANSPORT_US.0,
                NBD_TRANSPORT_US.1
            ));
            if let Some(xfs) = m("guest XFS") {
                parts.push(format!("XFS over the raw device: {}", over(xfs, raw)));
            }
        }
        let sim: Vec<String> = ["base", "spin"]
            .iter()
            .filter_map(|s| {
                let name = format!("sim {s}");
                m(&name).map(|v| format!("{s} {:.1} µs", v.1 - sim_direct.1))
            })
            .collect();
        parts.push(format!(
            "the model's kernel stacks over its direct stack: {}",
            sim.join(", ")
        ));
        notes.push(format!("{}: {}", r.job, parts.join("; ")));
    }
    notes
}

/// Median latency per path of the psync QD1 jobs (every path has them;
/// the mean of a loaded host is its tail's), one bar per (job, path), one
/// colour per kind.
fn figure(rows: &[Row], accel: &str) -> StackedBars {
    StackedBars {
        title: format!("fio psync QD1: median latency per path (µs); guest rows {accel}"),
        y_label: "median latency (µs)".into(),
        bars: rows
            .iter()
            .filter(|r| r.engine == "psync")
            .map(|r| {
                let kind = match r.faithful {
                    Some(false) => format!("{} (not faithful)", r.kind),
                    _ => r.kind.clone(),
                };
                (
                    format!("{} · {}", r.job, r.path),
                    vec![(kind, r.latency_us_p50)],
                )
            })
            .collect(),
        percent: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_output_is_split_into_each_jobs_json() {
        let json = |mean: f64| {
            format!(
                "{{\"jobs\":[{{\"read\":{{\"total_ios\":10,\"iops\":5.0,\"lat_ns\":{{\"mean\":{mean}}},\
                 \"clat_ns\":{{\"percentile\":{{\"99.000000\":9000}}}}}},\"write\":{{\"total_ios\":0}}}}]}}"
            )
        };
        let lines: Vec<String> = vec![
            "noise".into(),
            format!("{BEGIN} 0"),
            "fio: note before the JSON".into(),
            json(2000.0),
            String::new(),
            format!("{END} 0"),
            format!("{BEGIN} 1"),
            json(4000.0),
            format!("{END} 1"),
        ];
        let r = guest_results(&lines, 2).unwrap();
        let m = |mean| Measured {
            mean,
            p50: 0.0,
            p99: 9.0,
            iops: 5.0,
        };
        assert_eq!(r, vec![m(2.0), m(4.0)]);
        assert!(guest_results(&lines, 3).is_err());
        assert!(guest_results(&lines[..4], 1).is_err(), "no end marker");
    }

    #[test]
    fn fio_json_without_latency_is_an_error_not_zero() {
        assert!(fio_numbers("{\"jobs\":[{\"read\":{\"total_ios\":1}}]}").is_err());
        assert!(fio_numbers("not json").is_err());
    }
}
