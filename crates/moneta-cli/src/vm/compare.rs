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
use moneta_vhost::backend::{ChannelTarget, Stats, StatsSnapshot};
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
    /// io_uring queue depths run besides psync at depth 1, comma-separated
    /// (an empty list, `--uring-depths ""`: psync only).
    #[arg(long, default_value = "1,32")]
    uring_depths: String,
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
             --norandommap --randrepeat=0 --lat_percentiles=1 --output-format=json",
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
    /// model time during this row's job (a guest's: between its marks).
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
            mark_prefix: Some("@@moneta-fio-".into()),
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
        let runnable = fidelity::runnable_now().unwrap_or(0.0);
        for (i, (job, m)) in jobs.iter().zip(measured).enumerate() {
            let (faithful, verdict) = job_verdict(&r.marks, i, runnable)?;
            rows.push(Row {
                path: path.to_string(),
                kind: format!("measured, {}", accel_short(&r)),
                latency_us_mean: m.mean,
                latency_us_p50: m.p50,
                latency_us_p99: m.p99,
                iops: m.iops,
                faithful: Some(faithful),
                verdict,
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
    let (layer_header, layers) = layer_table(&rows, &accel);
    let all_faithful = rows.iter().all(|r| r.faithful != Some(false));
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
                println!("{path}, the whole run: {}", r.verdict);
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
            println!(
                "\nper layer, median µs per IO (a difference at or below zero is within noise):"
            );
            output::print_aligned(&layer_header, &layers);
        }
    }
    let panels = figures(&rows, &accel);
    if let Some(p) = &a.plot {
        let docs: Vec<String> = panels.iter().map(|b| b.to_svg(1100, 520)).collect();
        plot::write_file_from(p, &plot::one_below_the_other(&docs), &provenance)
            .map_err(|e| e.to_string())?;
        eprintln!("wrote {}", p.display());
    }
    if let Some(p) = &a.report {
        let mut sections = vec![ReportSection::Paragraph(format!(
            "{accel}; guest kernel {kernel}; preset {preset}. Measured rows: fio in the \
                 guest (O_DIRECT) and the host's user-space channel on the same emulated device; \
                 simulated rows: one thread through the model's stacks."
        ))];
        sections.extend(panels.into_iter().map(ReportSection::Bars));
        for (path, r) in &runs {
            sections.push(ReportSection::Paragraph(format!(
                "{path}, the whole run: {} (each job's own verdict is in its row)",
                r.verdict
            )));
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
        sections.push(ReportSection::Heading("Per layer".into()));
        sections.push(ReportSection::Paragraph(format!(
            "Each layer's median cost per IO, as the differences of the rows above give it: the \
             device is the model's time alone (the raw stack); the user-space path is the host's \
             direct path over it; the guest kernel and virtio-blk are the raw guest over the \
             host's direct path ({accel}{}); the file system is XFS over the raw guest. The \
             model's column is its stacks' differences (direct over raw; its base kernel stack, \
             Table 3.1's layers, over direct). A difference at or below zero is within noise.",
            if accel.starts_with("TCG") {
                ": an emulated CPU's, not a real kernel's"
            } else {
                ""
            }
        )));
        sections.push(ReportSection::Table {
            header: layer_header,
            rows: layers,
        });
        let report = Report {
            title: format!("Guest kernel against the direct path ({accel})"),
            sections,
        };
        plot::write_file_from(p, &report.to_html(), &provenance).map_err(|e| e.to_string())?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// `--uring-depths`: a comma-separated list of depths from 1 to 64, or
/// nothing at all (no io_uring jobs).
fn uring_depths(list: &str) -> Result<Vec<u32>, String> {
    list.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| match d.parse::<u32>() {
            Ok(n) if (1..=64).contains(&n) => Ok(n),
            _ => Err(format!("--uring-depths {d}: from 1 to 64")),
        })
        .collect()
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
    let uring_depths = uring_depths(&a.uring_depths)?;
    if a.runtime_s == 0 {
        return Err("--runtime-s 0: at least 1".into());
    }
    let mut jobs = Vec::new();
    for rw in &a.rw {
        if rw != "randread" && rw != "randwrite" {
            return Err(format!("--rw {rw}: randread or randwrite"));
        }
        for &size_bytes in &sizes {
            let engines =
                std::iter::once(("psync", 1)).chain(uring_depths.iter().map(|&d| ("io_uring", d)));
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

/// One fio job's numbers (µs): mean, p50 and p99 all of fio's total
/// latency, submission to completion (`lat`; the job asks for its
/// percentiles), as the host and simulated rows measure theirs.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Measured {
    mean: f64,
    p50: f64,
    p99: f64,
    iops: f64,
}

/// Job `i`'s own verdict: the backend's counters between the job's begin
/// and end marks (the device requests it made, how far behind the model's
/// time their completions came), judged as a whole run is.
fn job_verdict(
    marks: &[(String, StatsSnapshot)],
    i: usize,
    runnable: f64,
) -> Result<(bool, String), String> {
    let at = |mark: String| {
        marks
            .iter()
            .find(|(m, _)| *m == mark)
            .map(|(_, s)| *s)
            .ok_or_else(|| format!("the backend saw no '{mark}' (its counters per job)"))
    };
    let (begin, end) = (at(format!("{BEGIN} {i}"))?, at(format!("{END} {i}"))?);
    let n = end.device_requests.saturating_sub(begin.device_requests);
    if n == 0 {
        return Ok((false, "no device requests during the job".into()));
    }
    let share = |e: f64, b: f64| {
        (e * end.device_requests as f64 - b * begin.device_requests as f64) / n as f64
    };
    Ok(fidelity::judge(
        share(end.behind_ns_mean, begin.behind_ns_mean).max(0.0),
        share(end.modeled_ns_mean, begin.modeled_ns_mean).max(0.0),
        runnable,
        fidelity::cores(),
    ))
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
    // Total latency's percentiles (--lat_percentiles=1): io_uring's
    // completion latency alone (clat) would leave out its submission.
    let percentiles = &side["lat_ns"]["percentile"];
    if !percentiles.is_object() {
        return Err(format!(
            "fio's JSON has no lat_ns.percentile (an fio without --lat_percentiles?): {text}"
        ));
    }
    let pct = |p: &str| percentiles[p].as_f64().unwrap_or(0.0) / 1e3;
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

/// `x` over `y` (median, mean) in words: a difference at or below zero at
/// the median is "within noise" (a layer cannot make an IO faster; a
/// negative difference is the run's noise, not a gain).
fn over(x: (f64, f64), y: (f64, f64)) -> String {
    let (median, mean) = (x.0 - y.0, x.1 - y.1);
    if median <= 0.0 {
        format!("within noise (median {median:+.1} µs, mean {mean:+.1} µs)")
    } else {
        format!("median {median:.1} µs, mean {mean:.1} µs")
    }
}

/// Per psync QD1 job: the guest kernel's cost over the host's direct path
/// on the same device (the guest's block layer, virtio and, under TCG,
/// the emulated CPU), XFS's over the raw device, and the simulator's
/// kernel stacks' over its direct stack, beside loop/FUSE/NBD's transport.
/// Medians first: on a loaded host a mean is its tail's.
fn transport_notes(rows: &[Row], accel: &str) -> Vec<String> {
    let mut notes = Vec::new();
    for job in psync_jobs(rows) {
        let m = |p: &str| latency_of(rows, job, p);
        let (Some(host), Some(sim_direct)) = (m("host direct"), m("sim direct")) else {
            continue;
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
        notes.push(format!("{job}: {}", parts.join("; ")));
    }
    notes
}

/// The psync QD1 jobs of `rows`, in order, once each.
fn psync_jobs(rows: &[Row]) -> Vec<&str> {
    let mut jobs: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.engine == "psync") {
        if !jobs.contains(&r.job.as_str()) {
            jobs.push(&r.job);
        }
    }
    jobs
}

/// Per psync QD1 job, each layer's median cost per IO as the differences
/// of the rows give it, measured beside modeled: the device (the model's
/// `raw` stack: its time alone), the user-space path over it (host direct
/// over `raw`; the model: `direct` over `raw`), the guest kernel and
/// virtio-blk over the user-space path (guest raw over host direct; the
/// model: its `base` kernel stack over `direct`, Table 3.1's layers), and
/// the file system (guest XFS over guest raw; the model has none here).
/// A difference at or below zero is within noise. (header, rows)
fn layer_table(rows: &[Row], accel: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let short = accel.split(':').next().unwrap_or(accel);
    let header = [
        "job",
        "layer",
        &format!("measured ({short}), median µs"),
        "model, µs",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut out = Vec::new();
    let diff = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if x - y <= 0.0 => format!("within noise ({:+.1})", x - y),
        (Some(x), Some(y)) => format!("{:.1}", x - y),
        _ => "-".into(),
    };
    for job in psync_jobs(rows) {
        let p50 = |p: &str| latency_of(rows, job, p).map(|v| v.0);
        let sim = |p: &str| latency_of(rows, job, p).map(|v| v.1);
        let layers = [
            (
                "device (model time)",
                "-".to_string(),
                sim("sim raw").map_or("-".into(), |v| format!("{v:.1}")),
            ),
            (
                "user-space path (channel)",
                diff(p50("host direct"), sim("sim raw")),
                diff(sim("sim direct"), sim("sim raw")),
            ),
            (
                "guest kernel + virtio-blk",
                diff(p50("guest raw"), p50("host direct")),
                diff(sim("sim base"), sim("sim direct")),
            ),
            (
                "file system (XFS)",
                diff(p50("guest XFS"), p50("guest raw")),
                "-".to_string(),
            ),
        ];
        for (layer, measured, model) in layers {
            out.push(vec![job.to_string(), layer.to_string(), measured, model]);
        }
    }
    (header, out)
}

/// Median latency per path of the psync QD1 jobs (every path has them;
/// the mean of a loaded host is its tail's), one bar per (job, path), one
/// colour per kind, in two panels with their own scales: the guest's rows
/// (hundreds of µs to ms under TCG) above, the host's direct path and the
/// simulator's stacks (µs) below, so that neither flattens the other.
fn figures(rows: &[Row], accel: &str) -> Vec<StackedBars> {
    let panel = |title: String, guest: bool| StackedBars {
        title,
        y_label: "median latency (µs)".into(),
        bars: rows
            .iter()
            .filter(|r| r.engine == "psync" && r.path.starts_with("guest") == guest)
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
    };
    vec![
        panel(
            format!("fio psync QD1 in the guest ({accel}): median latency (µs)"),
            true,
        ),
        panel(
            "fio psync QD1: the host's direct path and the model's stacks: median latency (µs)"
                .into(),
            false,
        ),
    ]
    .into_iter()
    .filter(|p| !p.bars.is_empty())
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--uring-depths ""` runs psync only; a depth outside 1–64 or a word
    /// is refused by name.
    #[test]
    fn uring_depths_may_be_empty_and_are_bounded() {
        assert_eq!(uring_depths(""), Ok(vec![]));
        assert_eq!(uring_depths("1,32"), Ok(vec![1, 32]));
        assert_eq!(uring_depths(" 4 , 8 "), Ok(vec![4, 8]));
        for bad in ["0", "65", "x", "1,0"] {
            assert!(
                uring_depths(bad).unwrap_err().contains("from 1 to 64"),
                "{bad}"
            );
        }
    }

    /// A job's verdict is its own: the counters between its marks, not the
    /// run's. Job 0 keeps up (0.1 µs behind 4 µs modeled); job 1 falls
    /// 40 µs behind, which the whole run's mean would have diluted.
    #[test]
    fn each_job_is_judged_on_the_requests_between_its_marks() {
        let snap = |n: u64, behind_ns_mean: f64, modeled_ns_mean: f64| StatsSnapshot {
            requests: n,
            reads: n,
            writes: 0,
            flushes: 0,
            malformed: 0,
            errors: 0,
            device_requests: n,
            modeled_ns_mean,
            wall_ns_mean: 0.0,
            behind_ns_mean,
        };
        // Cumulative means: 1,000 requests at 100 ns behind, then 100 more
        // at 40,000 ns behind (mean over 1,100: (100,000 + 4,000,000) / 1,100).
        let marks = vec![
            (format!("{BEGIN} 0"), snap(0, 0.0, 0.0)),
            (format!("{END} 0"), snap(1000, 100.0, 4000.0)),
            (format!("{BEGIN} 1"), snap(1000, 100.0, 4000.0)),
            (format!("{END} 1"), snap(1100, 4_100_000.0 / 1100.0, 4000.0)),
        ];
        let (ok0, text0) = job_verdict(&marks, 0, 0.0).unwrap();
        assert!(ok0, "{text0}");
        let (ok1, text1) = job_verdict(&marks, 1, 0.0).unwrap();
        assert!(!ok1 && text1.contains("40.0 µs behind"), "{text1}");
        assert!(job_verdict(&marks, 2, 0.0).is_err(), "no marks: an error");
    }

    #[test]
    fn guest_output_is_split_into_each_jobs_json() {
        let json = |mean: f64| {
            format!(
                "{{\"jobs\":[{{\"read\":{{\"total_ios\":10,\"iops\":5.0,\
                 \"lat_ns\":{{\"mean\":{mean},\"percentile\":{{\"99.000000\":9000}}}}}},\"write\":{{\"total_ios\":0}}}}]}}"
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

    fn row(job: &str, path: &str, p50: f64, mean: f64) -> Row {
        Row {
            job: job.into(),
            engine: "psync".into(),
            path: path.into(),
            latency_us_p50: p50,
            latency_us_mean: mean,
            ..row_of(&Job {
                rw: "randread".into(),
                size_bytes: 4096,
                engine: "psync",
                queue_depth: 1,
            })
        }
    }

    /// Each layer is the difference of two rows; one at or below zero is
    /// "within noise", never a layer that makes an IO faster.
    #[test]
    fn layers_are_row_differences_and_negative_ones_are_noise() {
        let j = "randread 4 KB psync QD1";
        let rows = vec![
            row(j, "guest raw", 130.0, 500.0),
            row(j, "guest XFS", 120.0, 520.0),
            row(j, "host direct", 5.5, 80.0),
            row(j, "sim raw", 4.8, 4.8),
            row(j, "sim direct", 8.8, 8.8),
            row(j, "sim base", 20.8, 20.8),
            row(j, "sim spin", 12.8, 12.8),
        ];
        let (header, table) = layer_table(&rows, "TCG: guest CPU emulated");
        assert_eq!(header[2], "measured (TCG), median µs");
        let cell =
            |layer: &str, col: usize| table.iter().find(|r| r[1] == layer).unwrap()[col].clone();
        assert_eq!(cell("device (model time)", 3), "4.8");
        assert_eq!(cell("user-space path (channel)", 2), "0.7");
        assert_eq!(cell("user-space path (channel)", 3), "4.0");
        assert_eq!(cell("guest kernel + virtio-blk", 2), "124.5");
        assert_eq!(cell("guest kernel + virtio-blk", 3), "12.0");
        assert_eq!(cell("file system (XFS)", 2), "within noise (-10.0)");
        let notes = transport_notes(&rows, "TCG");
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("XFS over the raw device: within noise (median -10.0 µs"),
            "{}",
            notes[0]
        );
        assert!(
            notes[0].contains("median 124.5 µs, mean 420.0 µs per IO"),
            "{}",
            notes[0]
        );
        // Two panels: the guest's rows, then the host's and the model's.
        let panels = figures(&rows, "TCG");
        assert_eq!(panels.len(), 2);
        assert!(panels[0].bars.iter().all(|(l, _)| l.contains("guest")));
        assert!(panels[1].bars.iter().all(|(l, _)| !l.contains("guest")));
    }

    #[test]
    fn fio_json_without_latency_is_an_error_not_zero() {
        assert!(fio_numbers("{\"jobs\":[{\"read\":{\"total_ios\":1}}]}").is_err());
        assert!(fio_numbers("not json").is_err());
        // Completion latency's percentiles alone are not taken for total
        // latency's (io_uring's submission would be left out).
        let clat_only = "{\"jobs\":[{\"read\":{\"total_ios\":1,\"lat_ns\":{\"mean\":5000},\
                         \"clat_ns\":{\"percentile\":{\"50.000000\":4000}}}}]}";
        let e = fio_numbers(clat_only).unwrap_err();
        assert!(e.contains("lat_percentiles"), "{e}");
    }
}
