//! `moneta nvmm sim …`: NVMM (SPEC §7) in virtual time, on the model
//! `moneta_model::nvmm`: one run (`run`), the report's backing-store latency
//! sweep (`sweep`), and the wear-out estimate (`wear`); `moneta nvmm
//! presets` lists the presets. Every command prints a table, JSON or CSV,
//! shows progress on stderr when it is a terminal; `sweep` and `wear` draw
//! their figures (`--plot`), with the report's statements that are points
//! of them as crosses (`moneta report` puts the same figures on its NVMM
//! page).

use crate::error::{Error, ErrorKind};
use crate::output::table;
use crate::output::{print_result_csv, print_result_json, Format};
use crate::plot::{self, Chart, Series};
use crate::provenance::Provenance;
use crate::san::Meter;
use clap::{Args, Subcommand};
use moneta_model::nvmm::calibration::{
    SweepStatement, WearStatement, SWEEP_STATEMENTS, WEAR_STATEMENTS,
};
use moneta_model::nvmm::experiments::{
    self, latency_sweep, standard_workload, SweepPoint, SweepSetup, WearReport, WearSample,
    REPORT_PREFETCH_PAGES, SWEEP_LATENCIES_NS,
};
use moneta_model::nvmm::system::{run, SystemKind};
use moneta_model::nvmm::workload::{Workload, WorkloadKind};
use moneta_model::nvmm::{NvmmConfig, NVMM_PRESETS};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Subcommand)]
pub enum NvmmCommand {
    /// Simulate NVMM and its baselines in virtual time.
    #[command(subcommand)]
    Sim(Box<NvmmSim>),
    /// List the NVMM presets (--verbose: their TOML).
    Presets {
        #[arg(long)]
        verbose: bool,
    },
}

#[derive(Subcommand)]
pub enum NvmmSim {
    /// One workload on NVMM, the DRAM + SSD system and all-DRAM.
    Run(RunArgs),
    /// The report's latency sweep: backing-store latency 3.125 µs … 750 µs,
    /// NVMM with and without prefetch, 1 and N threads, against the SSD.
    Sweep(SweepArgs),
    /// How long until half the flash is retired, and until it is worn out,
    /// at a write rate (SPEC §7 "Wear").
    Wear(WearArgs),
}

/// The configuration: a preset or file, with overrides.
#[derive(Args, Clone)]
pub struct NvmmConfigArgs {
    /// NVMM preset (`moneta nvmm presets`).
    #[arg(long, default_value = "nvmm-mlc")]
    preset: String,
    /// Configuration file in the NVMM presets' schema: every key, or
    /// `inherits = "PRESET"` and the keys that differ. Instead of --preset.
    #[arg(long, value_name = "FILE.toml")]
    config: Option<PathBuf>,
    /// Override any key, e.g. --set controller.prefetch_pages=16 or
    /// --set flash.technology=slc-nand (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Random seed: the same seed gives the same numbers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output format: a table, JSON, or CSV.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

impl NvmmConfigArgs {
    fn config(&self) -> crate::error::Result<NvmmConfig> {
        let mut c = match &self.config {
            Some(path) => NvmmConfig::from_file(path)
                .map_err(|e| Error::config(format!("--config {}", path.display()), e))?,
            None => NvmmConfig::preset(&self.preset).map_err(|e| Error::config("", e))?,
        };
        for s in &self.set {
            c.set(s)
                .map_err(|e| Error::config(format!("--set {s}"), e))?;
        }
        Ok(c)
    }
}

/// The workload's shape.
#[derive(Args, Clone)]
pub struct WorkloadArgs {
    /// Accesses of all threads together [default: GUPS 5000, MMAP 10,000,
    /// sequential 100,000, as in the report].
    #[arg(long)]
    accesses: Option<u64>,
    /// Footprint (GUPS table, MMAP file) as a multiple of the DRAM size.
    #[arg(long, default_value_t = 2.0)]
    footprint_ratio: f64,
}

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    common: NvmmConfigArgs,
    #[command(flatten)]
    shape: WorkloadArgs,
    /// gups, mmap, sequential, or trace (with --trace).
    #[arg(long, default_value = "gups")]
    workload: String,
    /// Address trace: lines `R|W|U ADDRESS [THREAD]` (trace workload).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Threads (one per core; ignored for a trace, which names its own).
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Systems, comma-separated: nvmm, ssd, all-dram, or all.
    #[arg(long, default_value = "all")]
    systems: String,
}

#[derive(Args)]
pub struct SweepArgs {
    #[command(flatten)]
    common: NvmmConfigArgs,
    #[command(flatten)]
    shape: WorkloadArgs,
    /// Workloads, comma-separated: gups, mmap, sequential.
    #[arg(long, default_value = "gups,mmap")]
    workloads: String,
    /// Backing-store read latencies in ns, comma-separated (NVMM and SSD)
    /// [default: the report's 3125 … 750000].
    #[arg(long)]
    latencies: Option<String>,
    /// Thread counts, comma-separated.
    #[arg(long, default_value = "1,8")]
    threads: String,
    /// NVMM prefetch depths, comma-separated (0: off; the report: 16).
    #[arg(long, default_value = "0,16")]
    prefetch: String,
    /// Write an SVG plot: NVMM's speedup over the SSD against latency, one
    /// panel per workload and thread count.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

/// `moneta nvmm sim wear`'s defaults (also the report page's run).
pub(crate) const WEAR_RATE_MB_S: f64 = 50.0;
pub(crate) const WEAR_UTILIZATION: f64 = 0.25;
pub(crate) const WEAR_ENDURANCE_SCALE: u64 = 100;
pub(crate) const WEAR_BLOCKS_PER_PLANE: u32 = 8;

#[derive(Args)]
pub struct WearArgs {
    #[command(flatten)]
    common: NvmmConfigArgs,
    /// Rate at which write-backs reach the flash, MB/s (10^6 B/s).
    #[arg(long, default_value_t = WEAR_RATE_MB_S)]
    write_rate_mb_s: f64,
    /// Share of the flash holding live data (below 0.5, or the data stops
    /// fitting before half the flash is retired).
    #[arg(long, default_value_t = WEAR_UTILIZATION)]
    utilization: f64,
    /// Divide page endurance by this in the simulation (times are
    /// multiplied back) so that wearing out takes seconds.
    #[arg(long, default_value_t = WEAR_ENDURANCE_SCALE)]
    endurance_scale: u64,
    /// Blocks per plane for the wear run (a smaller flash wears out faster
    /// to simulate; the times are scaled to one 8 Gb device).
    #[arg(long, default_value_t = WEAR_BLOCKS_PER_PLANE)]
    blocks_per_plane: u32,
    /// Write an SVG plot: usable capacity over time, one device and 1000.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

pub fn dispatch(command: NvmmCommand) -> crate::error::Result<()> {
    match command {
        NvmmCommand::Sim(sim) => match *sim {
            NvmmSim::Run(a) => sim_run(a),
            NvmmSim::Sweep(a) => sim_sweep(a),
            NvmmSim::Wear(a) => sim_wear(a),
        },
        NvmmCommand::Presets { verbose } => {
            for (name, text) in NVMM_PRESETS {
                let c = NvmmConfig::preset(name).map_err(Error::because)?;
                println!("{name:<16} {}", c.description);
                if verbose {
                    println!("{text}");
                }
            }
            Ok(())
        }
    }
}

/// A comma-separated option: each item parsed by `parse`; a bad one is a
/// usage error naming `what`, its cause kept.
fn parse_list<T, E>(
    what: &str,
    list: &str,
    parse: impl Fn(&str) -> Result<T, E>,
) -> crate::error::Result<Vec<T>>
where
    E: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    let items: Vec<T> = list
        .split(',')
        .map(|s| parse(s.trim()).map_err(|e| Error::with_source(ErrorKind::Usage, what, e)))
        .collect::<Result<_, _>>()?;
    if items.is_empty() {
        return Err(Error::usage(format!("{what}: empty list")));
    }
    Ok(items)
}

fn number<T: std::str::FromStr>(s: &str) -> crate::error::Result<T> {
    s.parse()
        .map_err(|_| Error::usage(format!("'{s}' is not a number")))
}

/// Print rows as the format asks; the table shows `columns`.
fn emit<T: Serialize>(
    common: &NvmmConfigArgs,
    config: &NvmmConfig,
    title: &str,
    rows: &[T],
    columns: &[&str],
) -> crate::error::Result<()> {
    match common.format {
        Format::Json => Ok(print_result_json(
            rows,
            &Provenance::here().seed(common.seed),
        )?),
        Format::Csv => Ok(print_result_csv(
            rows,
            &Provenance::here().seed(common.seed),
        )?),
        Format::Table => {
            let (header, cells) = table(rows, columns)?;
            println!("{title}  (preset {}, seed {})", config.name, common.seed);
            crate::output::print_aligned(&header, &cells);
            Ok(())
        }
    }
}

fn sim_run(a: RunArgs) -> crate::error::Result<()> {
    let config = a.common.config()?;
    let kind = WorkloadKind::parse(&a.workload)?;
    let workload = match (kind, &a.trace) {
        (WorkloadKind::Trace, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| Error::failed_with(format!("--trace {}", path.display()), e))?;
            Workload::from_trace(&text, config.dram.line_bytes)?
        }
        (WorkloadKind::Trace, None) => return Err("the trace workload needs --trace FILE".into()),
        (_, Some(_)) => return Err("--trace goes with --workload trace".into()),
        (kind, None) => standard_workload(
            &config,
            kind,
            a.threads,
            a.shape.accesses,
            a.shape.footprint_ratio,
        )
        .map_err(Error::because)?,
    };
    let systems: Vec<SystemKind> = if a.systems == "all" {
        vec![SystemKind::Nvmm, SystemKind::Ssd, SystemKind::AllDram]
    } else {
        parse_list("--systems", &a.systems, SystemKind::parse)?
    };
    let mut rows = Vec::new();
    let mut meter = Meter::new();
    for (i, &system) in systems.iter().enumerate() {
        meter.tick(i, systems.len(), system.name());
        rows.push(run(&config, system, &workload, a.common.seed).map_err(Error::because)?);
    }
    meter.tick(systems.len(), systems.len(), "");
    emit(
        &a.common,
        &config,
        &format!(
            "NVMM run: {} × {} thread(s), {} accesses, footprint {} MB",
            workload.kind.name(),
            workload.threads,
            workload.accesses,
            workload.footprint_bytes >> 20
        ),
        &rows,
        &[
            "system",
            "elapsed_ns",
            "accesses_per_s",
            "latency_ns_mean",
            "hit_rate",
            "flash_reads",
            "flash_programs",
            "flash_erases",
        ],
    )
}

fn sim_sweep(a: SweepArgs) -> crate::error::Result<()> {
    let config = a.common.config()?;
    let setup = SweepSetup {
        workloads: parse_list(
            "--workloads",
            &a.workloads,
            |s| match WorkloadKind::parse(s)? {
                WorkloadKind::Trace => Err(String::from("a sweep runs gups, mmap or sequential")),
                k => Ok(k),
            },
        )?,
        latencies_ns: match &a.latencies {
            Some(list) => parse_list("--latencies", list, number)?,
            None => SWEEP_LATENCIES_NS.to_vec(),
        },
        threads: parse_list("--threads", &a.threads, number)?,
        prefetch: parse_list("--prefetch", &a.prefetch, number)?,
        accesses: a.shape.accesses,
        footprint_ratio: a.shape.footprint_ratio,
        seed: a.common.seed,
    };
    if let Some(path) = &a.plot {
        plot::check_output(path, true)?;
    }
    if setup.latencies_ns.contains(&0) {
        return Err("--latencies: a latency must be positive".into());
    }
    let mut meter = Meter::new();
    let points = latency_sweep(&config, &setup, &mut |done, all| {
        meter.tick(done.min(all.saturating_sub(1)), all, "sweep")
    })
    .map_err(Error::because)?;
    meter.tick(points.len(), points.len(), "");
    if let Some(path) = &a.plot {
        let svg = plot::stacked_svg(&sweep_charts(&config, &setup, &points), 900, 480);
        write_plot(path, &svg)?;
    }
    emit(
        &a.common,
        &config,
        &format!(
            "NVMM latency sweep (the report's: prefetch {} = its scheme)",
            REPORT_PREFETCH_PAGES
        ),
        &points,
        &[
            "workload",
            "backing_read_ns",
            "threads",
            "prefetch_pages",
            "nvmm_elapsed_ns",
            "ssd_elapsed_ns",
            "all_dram_elapsed_ns",
            "speedup_over_ssd",
            "slowdown_vs_dram",
            "nvmm_hit_rate",
        ],
    )
}

fn sim_wear(a: WearArgs) -> crate::error::Result<()> {
    let mut config = a.common.config()?;
    config
        .set(&format!("flash.blocks_per_plane={}", a.blocks_per_plane))
        .map_err(|e| Error::failed_with("--blocks-per-plane", e))?;
    if let Some(path) = &a.plot {
        plot::check_output(path, true)?;
    }
    let mut meter = Meter::new();
    meter.tick(0, 1, "wearing the flash out");
    let (report, curve) = experiments::wear_with_curve(
        &config,
        a.write_rate_mb_s * 1e6,
        a.utilization,
        a.endurance_scale,
        a.common.seed,
    )
    .map_err(Error::because)?;
    meter.tick(1, 1, "");
    if let Some(path) = &a.plot {
        write_plot(path, &wear_chart(&report, &curve).to_svg(900, 480))?;
    }
    emit(
        &a.common,
        &config,
        "NVMM wear (SPEC §7 estimates: one 8 Gb device with a 32 GB cache, moderate load: \
         half in < 2 days, worn out in 3; 1000 devices: 2–3 years, 4–5 years)",
        std::slice::from_ref(&report),
        &[
            "endurance_cycles",
            "write_rate_bytes_per_s",
            "write_amplification",
            "retired_fraction_at_end",
            "pages_deleted",
            "days_to_half_one_8gb_device",
            "days_to_first_unplaceable_one_8gb_device",
            "days_to_end_one_8gb_device",
            "years_to_half_1000_devices",
            "years_to_end_1000_devices",
        ],
    )
}

fn write_plot(path: &Path, svg: &str) -> crate::error::Result<()> {
    plot::write_file(path, svg).map_err(Error::because)?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `moneta nvmm sim sweep`'s defaults: the report's sweep.
pub(crate) fn report_sweep(seed: u64) -> SweepSetup {
    SweepSetup {
        workloads: vec![WorkloadKind::Gups, WorkloadKind::Mmap],
        latencies_ns: SWEEP_LATENCIES_NS.to_vec(),
        threads: vec![1, 8],
        prefetch: vec![0, REPORT_PREFETCH_PAGES],
        accesses: None,
        footprint_ratio: 2.0,
        seed,
    }
}

/// The report's published points apply to the preset its statements are
/// checked on (`nvmm-mlc`) with its workload shape.
fn published_apply(preset: &str, setup: &SweepSetup) -> bool {
    let shape = report_sweep(setup.seed);
    preset == "nvmm-mlc"
        && setup.accesses == shape.accesses
        && setup.footprint_ratio == shape.footprint_ratio
}

/// The statements that are points of this sweep, each with the model's
/// point at the same workload, latency, threads and prefetch.
pub(crate) fn sweep_published<'a>(
    config: &NvmmConfig,
    setup: &SweepSetup,
    points: &'a [SweepPoint],
) -> Vec<(SweepStatement, &'a SweepPoint)> {
    if !published_apply(&config.name, setup) {
        return Vec::new();
    }
    SWEEP_STATEMENTS
        .iter()
        .filter_map(|s| {
            let p = points.iter().find(|p| {
                p.workload == s.workload.name()
                    && p.backing_read_ns == s.read_ns
                    && p.threads == s.threads
                    && p.prefetch_pages == s.prefetch_pages
            })?;
            Some((*s, p))
        })
        .collect()
}

fn prefetch_name(pages: u32) -> String {
    if pages == 0 {
        "no prefetch".into()
    } else {
        format!("prefetch {pages} pages")
    }
}

fn threads_name(threads: u32) -> String {
    if threads == 1 {
        "1 thread".into()
    } else {
        format!("{threads} threads")
    }
}

/// One chart per workload and thread count: NVMM's speedup over the DRAM +
/// SSD system against the flash read latency, one line per prefetch depth,
/// the report's statements at their latency as crosses.
pub(crate) fn sweep_charts(
    config: &NvmmConfig,
    setup: &SweepSetup,
    points: &[SweepPoint],
) -> Vec<Chart> {
    let published = sweep_published(config, setup, points);
    let mut charts = Vec::new();
    for &w in &setup.workloads {
        for &t in &setup.threads {
            let mut series: Vec<Series> = setup
                .prefetch
                .iter()
                .map(|&p| Series {
                    name: prefetch_name(p),
                    points: points
                        .iter()
                        .filter(|q| {
                            q.workload == w.name() && q.threads == t && q.prefetch_pages == p
                        })
                        .map(|q| (q.backing_read_ns as f64 / 1000.0, q.speedup_over_ssd))
                        .collect(),
                })
                .collect();
            for &p in &setup.prefetch {
                let crosses: Vec<(f64, f64)> = published
                    .iter()
                    .filter(|(s, _)| s.workload == w && s.threads == t && s.prefetch_pages == p)
                    .map(|(s, _)| (s.read_ns as f64 / 1000.0, s.published))
                    .collect();
                if !crosses.is_empty() {
                    series.push(Series {
                        name: format!("{}{}", plot::PUBLISHED_PREFIX, prefetch_name(p)),
                        points: crosses,
                    });
                }
            }
            let crosses = plot::crosses_note(
                series
                    .iter()
                    .any(|s| s.name.starts_with(plot::PUBLISHED_PREFIX)),
            );
            charts.push(Chart {
                title: format!(
                    "{}, {}: NVMM over DRAM + SSD ({}, seed {}{crosses})",
                    w.name().to_uppercase(),
                    threads_name(t),
                    config.name,
                    setup.seed
                ),
                x_label: "flash read latency (µs, log scale)".into(),
                y_label: "speedup: SSD time / NVMM time (log scale)".into(),
                x_log10: true,
                y_log10: true,
                series,
                ..Chart::default()
            });
        }
    }
    charts
}

/// The wear statements, each with the model's time for it (days).
pub(crate) fn wear_published(report: &WearReport) -> Vec<(WearStatement, f64)> {
    if report.preset != "nvmm-mlc" {
        return Vec::new();
    }
    WEAR_STATEMENTS
        .iter()
        .map(|s| {
            let one = if s.capacity_left > 0.0 {
                report.days_to_half_one_8gb_device
            } else {
                report.days_to_end_one_8gb_device
            };
            (*s, one * f64::from(s.devices))
        })
        .collect()
}

/// Usable capacity (pages not retired; none at the end, when no live page
/// can be written any more) over time
/// for one 8 Gb device and for 1000 at the same rate each, the report's
/// estimates as crosses.
pub(crate) fn wear_chart(report: &WearReport, curve: &[WearSample]) -> Chart {
    let published = wear_published(report);
    let mut series = Vec::new();
    for (devices, name) in [(1.0, "one 8 Gb device"), (1000.0, "1000 devices (1 TB)")] {
        let mut points: Vec<(f64, f64)> = curve
            .iter()
            .map(|s| {
                (
                    s.days_one_8gb_device * devices,
                    100.0 * (1.0 - s.retired_fraction),
                )
            })
            .collect();
        points.push((report.days_to_end_one_8gb_device * devices, 0.0));
        series.push(Series {
            name: name.into(),
            points,
        });
    }
    for (devices, name) in [(1, "one 8 Gb device"), (1000, "1000 devices (1 TB)")] {
        let crosses: Vec<(f64, f64)> = published
            .iter()
            .filter(|(s, _)| s.devices == devices)
            .map(|(s, _)| (s.days_drawn, 100.0 * s.capacity_left))
            .collect();
        if !crosses.is_empty() {
            series.push(Series {
                name: format!("{}{name}", plot::PUBLISHED_PREFIX),
                points: crosses,
            });
        }
    }
    Chart {
        title: format!(
            "Usable flash capacity as it wears ({}, {:.0} MB/s each, seed {}{})",
            report.preset,
            report.write_rate_bytes_per_s / 1e6,
            report.seed,
            plot::crosses_note(!published.is_empty())
        ),
        x_label: "days (log scale)".into(),
        y_label: "usable capacity (% of the flash)".into(),
        x_log10: true,
        series,
        ..Chart::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_name_their_option() {
        assert_eq!(
            parse_list("--x", "1, 2", number::<u32>).unwrap(),
            vec![1, 2]
        );
        let e = parse_list("--threads", "1,x", number::<u32>).unwrap_err();
        assert!(e.to_string().starts_with("--threads"), "{e}");
        assert_eq!(e.kind(), ErrorKind::Usage);
        let args = NvmmConfigArgs {
            preset: "nvmm-slc".into(),
            config: None,
            set: vec!["flash.onfi=onfi5".into()],
            seed: 1,
            format: Format::Table,
        };
        let e = args.config().unwrap_err();
        assert!(e.to_string().contains("onfi4"), "{e}");
        assert_eq!(e.kind(), ErrorKind::Config);
    }

    /// The figures of `sweep --plot`, `wear --plot` and the report's NVMM
    /// page: titles name the preset and threads, log axes, every statement
    /// that is a point of a curve drawn as a cross at the model's runs (the
    /// checks' own), and no label overlapping another.
    #[test]
    fn figures_carry_the_published_points_without_overlapping_labels() {
        use crate::plot::tests::{assert_no_label_overlaps, check_balanced};
        use moneta_model::nvmm::calibration::checks;
        let config = NvmmConfig::preset("nvmm-mlc").unwrap();
        let mut setup = report_sweep(1);
        setup.latencies_ns = vec![75_000, 150_000];
        let points = latency_sweep(&config, &setup, &mut |_, _| {}).unwrap();
        let charts = sweep_charts(&config, &setup, &points);
        assert_eq!(charts.len(), 4);
        for c in &charts {
            assert!(
                c.title.contains("nvmm-mlc") && c.title.contains("thread"),
                "{}",
                c.title
            );
            assert!(c.x_log10 && c.y_log10);
            assert_no_label_overlaps(&c.title, &c.to_svg(900, 480));
        }
        check_balanced(&plot::stacked_svg(&charts, 900, 480));
        let crosses = |charts: &[Chart]| -> usize {
            charts
                .iter()
                .flat_map(|c| &c.series)
                .filter(|s| s.name.starts_with(plot::PUBLISHED_PREFIX))
                .map(|s| s.points.len())
                .sum()
        };
        assert_eq!(crosses(&charts), SWEEP_STATEMENTS.len());
        let published = sweep_published(&config, &setup, &points);
        assert_eq!(published.len(), SWEEP_STATEMENTS.len());
        let checks = checks();
        for (s, p) in &published {
            let check = checks.iter().find(|c| c.name == s.name).expect(s.name);
            assert_eq!(check.simulated, s.check(p.speedup_over_ssd).simulated);
        }
        // Another workload shape is not the report's: no crosses.
        let mut other = report_sweep(1);
        other.accesses = Some(1000);
        assert!(sweep_published(&config, &other, &points).is_empty());

        let mut worn = config.clone();
        worn.flash.blocks_per_plane = WEAR_BLOCKS_PER_PLANE;
        let (report, curve) =
            experiments::wear_with_curve(&worn, WEAR_RATE_MB_S * 1e6, WEAR_UTILIZATION, 1000, 1)
                .unwrap();
        let wear = wear_chart(&report, &curve);
        assert!(wear.title.contains("nvmm-mlc") && wear.x_log10);
        assert_eq!(crosses(std::slice::from_ref(&wear)), WEAR_STATEMENTS.len());
        assert_no_label_overlaps(&wear.title, &wear.to_svg(900, 480));
    }
}
