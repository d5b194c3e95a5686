//! `moneta report --out DIR`: one HTML page per system of SPEC.md (Moneta,
//! Moneta-D, Onyx, QuickSAN, NVMM) and an index. Each page reproduces the
//! system's paper experiments that the simulator runs, puts the published
//! points beside them (the checks of `moneta calibrate` that belong to the
//! system, each with its error), and lists the commands that make every
//! figure and table on it. Nothing here computes a number the other
//! commands do not: it calls the same functions.

use crate::nvmm::{self, WEAR_ENDURANCE_SCALE, WEAR_RATE_MB_S, WEAR_UTILIZATION};
use crate::output::sweep_report;
use crate::plot::{self, Chart, Report, ReportSection};
use moneta_model::calibration::{self, Check};
use moneta_model::config::Config;
use moneta_model::nvmm::experiments::{latency_sweep, wear_with_curve};
use moneta_model::nvmm::NvmmConfig;
use moneta_model::san::experiments::{self, Setup};
use moneta_model::san::interfaces::Interface;
use moneta_model::summary::{xdd_point, PointSummary};
use moneta_model::workload::{OpMix, RunLimit};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct ReportArgs {
    /// Directory for the pages (created if missing, its parent must exist).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Requests per simulated point (sweeps and SAN loads).
    #[arg(long, default_value_t = 20_000)]
    ops: u64,
    /// Random seed: the same seed gives the same pages (except the NVMM
    /// and QuickSAN numbers that measure this machine: none are used here;
    /// the published statements' checks always use seed 1).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

const SIZES: [u64; 12] = [
    512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576,
];

/// The three operations of every sweep in the papers.
const OPS: [(&str, OpMix); 3] = [
    ("read", OpMix::Read),
    ("write", OpMix::Write),
    ("mixed", OpMix::Mixed(0.5)),
];

fn sweep(config: &Config, ops: u64, seed: u64) -> Result<Vec<PointSummary>, String> {
    let mut points = Vec::new();
    for (_, op) in OPS {
        for size in SIZES {
            points.push(xdd_point(config, op, size, 16, RunLimit::Ops(ops), seed)?);
        }
    }
    Ok(points)
}

/// The published checks of one system, with their errors.
fn checks_section(title: &str, checks: &[Check]) -> Vec<ReportSection> {
    let missed = checks.iter().filter(|c| !c.within()).count();
    vec![
        ReportSection::Heading(title.into()),
        ReportSection::Paragraph(format!(
            "{} published numbers, {} within the project's tolerance, {missed} not (each miss is explained in README \"Calibration\" / \"Fidelity\").",
            checks.len(),
            checks.len() - missed
        )),
        ReportSection::Table {
            header: ["check", "source", "published", "model", "error", "tolerance", ""]
                .iter()
                .map(|h| h.to_string())
                .collect(),
            rows: checks
                .iter()
                .map(|c| {
                    vec![
                        c.name.clone(),
                        c.source.to_string(),
                        format!("{} {}", calibration::format_number(c.published), c.unit),
                        format!("{} {}", calibration::format_number(c.simulated), c.unit),
                        format!("{:+.1}%", 100.0 * c.error()),
                        c.tolerance_text(),
                        verdict(c.within()),
                    ]
                })
                .collect(),
        },
    ]
}

fn commands(lines: &[String]) -> ReportSection {
    ReportSection::Preformatted(lines.join("\n"))
}

fn with_sections(
    mut r: Report,
    title: &str,
    before: Vec<ReportSection>,
    after: Vec<ReportSection>,
) -> Report {
    r.title = title.into();
    let mut sections = before;
    sections.append(&mut r.sections);
    sections.extend(after);
    r.sections = sections;
    r
}

fn moneta_page(a: &ReportArgs) -> Result<Report, String> {
    let c = Config::preset("moneta").map_err(|e| e.to_string())?;
    let points = sweep(&c, a.ops, a.seed)?;
    let mut checks = calibration::table_3_4();
    checks.extend(calibration::software_steps());
    checks.extend(
        calibration::other_systems()
            .into_iter()
            .filter(|c| c.name.starts_with("Moneta 2011") || c.name.starts_with("HASTE")),
    );
    checks.extend(calibration::balance());
    checks.extend(calibration::latency_tolerance());
    checks.extend(calibration::power());
    checks.extend(
        calibration::direct_and_headline()
            .into_iter()
            .filter(|c| c.name.starts_with("MICRO'10")),
    );
    let seed = a.seed;
    Ok(with_sections(
        sweep_report(&c, &points),
        "Moneta (MICRO'10, dissertation ch. 3, the 2011 array beside Onyx)",
        vec![commands(&[
            format!("moneta sim sweep --preset moneta --threads 16 --ops {} --seed {seed} --report moneta-sweep.html", a.ops),
            "moneta calibrate".into(),
            "moneta sim fairness --preset moneta-micro10 --stack 2q   # §3.4.2, then --stack balance".into(),
        ])],
        checks_section("Published numbers of chapter 3 and MICRO'10", &checks),
    ))
}

fn moneta_d_page(a: &ReportArgs) -> Result<Report, String> {
    let c = Config::preset("moneta-d").map_err(|e| e.to_string())?;
    let points = sweep(&c, a.ops, a.seed)?;
    let mut checks: Vec<Check> = calibration::other_systems()
        .into_iter()
        .filter(|c| c.name.starts_with("Moneta-D"))
        .collect();
    checks.extend(
        calibration::direct_and_headline()
            .into_iter()
            .filter(|c| c.name.starts_with("Moneta-D")),
    );
    Ok(with_sections(
        sweep_report(&c, &points),
        "Moneta-D (dissertation ch. 4): user-space access with device-checked permissions",
        vec![commands(&[
            format!("moneta sim sweep --preset moneta-d --threads 16 --ops {} --seed {} --report moneta-d-sweep.html", a.ops, a.seed),
            "moneta sim compare --preset moneta-d --stack direct,spin --size 512 --threads 1   # Table 4.2 / Figure 4.3".into(),
        ])],
        checks_section("Published numbers of chapter 4 (Table 4.2, §4.4)", &checks),
    ))
}

fn onyx_page(a: &ReportArgs) -> Result<Report, String> {
    let mut sections = vec![
        commands(&[
            format!("moneta sim sweep --preset onyx-late --threads 16 --ops {} --seed {}", a.ops, a.seed),
            format!("moneta sim sweep --preset onyx-early --threads 16 --ops {} --seed {}", a.ops, a.seed),
        ]),
        ReportSection::Paragraph(
            "Onyx's own bandwidth tables (thesis Tables 5.1–5.3), its start-gap and BerkeleyDB results are withheld from the seeds to check predictions: no published Onyx point is drawn. The Moneta column of the same tables is on the Moneta page.".into(),
        ),
    ];
    for preset in ["onyx-late", "onyx-early"] {
        let c = Config::preset(preset).map_err(|e| e.to_string())?;
        let points = sweep(&c, a.ops, a.seed)?;
        let r = sweep_report(&c, &points);
        sections.push(ReportSection::Heading(c.description.clone()));
        sections.extend(
            r.sections
                .into_iter()
                .filter(|s| matches!(s, ReportSection::Chart(_) | ReportSection::Table { .. }))
                .take(3),
        );
    }
    Ok(Report {
        title: "Onyx (Akel MS thesis 2011): Moneta with P8P PCM".into(),
        sections,
    })
}

fn quicksan_page(a: &ReportArgs) -> Result<Report, String> {
    let device = Config::preset("quicksan-ssd").map_err(|e| e.to_string())?;
    let setup = Setup {
        costs: device.san.clone(),
        device,
        seed: a.seed,
        ops: a.ops,
        threads_per_host: 8,
    };
    let t = experiments::topology(false, 4)?;
    let rows = experiments::bandwidth(
        &setup,
        &Interface::ALL,
        t,
        false,
        &[OpMix::Read],
        &SIZES[..10],
        &mut |_, _, _| {},
    )?;
    let series = crate::san::bandwidth_series(&rows, |r| r.interface.key().to_string());
    let chart = Chart {
        title: "QuickSAN §5.4.3: random reads, MB/s per host (distributed, 4 nodes, 8 threads per host, log scale)".into(),
        x_label: "request size (bytes)".into(),
        y_label: "MB/s per host (log scale)".into(),
        x_log2: true,
        x_log10: false,
        y_log10: true,
        series,
    };
    let latency = experiments::latency(&setup, &Interface::ALL, t, 4096, &mut |_, _, _| {})?;
    let latency_table = ReportSection::Table {
        header: [
            "interface",
            "locality",
            "op",
            "mean µs",
            "OS µs",
            "GFS2 µs",
            "transport µs",
            "Table 5.1 transport µs",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows: latency
            .iter()
            .map(|r| {
                vec![
                    r.interface.key().into(),
                    r.locality.into(),
                    r.op.into(),
                    format!("{:.1}", r.latency_us_mean),
                    format!("{:.2}", r.table_5_1.os_entry_exit_block_io_us),
                    format!("{:.2}", r.table_5_1.file_system_us),
                    format!("{:.1}", r.table_5_1.block_transport_us),
                    format!("{:.1}", r.table_5_1.paper_block_transport_us),
                ]
            })
            .collect(),
    };
    let mut sections = vec![
        commands(&[
            "moneta san sim latency                      # §5.4.2, Table 5.2's layout".into(),
            "moneta san sim bandwidth --topology distributed --op read   # §5.4.3".into(),
            "moneta san sim scaling --nodes 1,2,4,8,16   # §5.4.4".into(),
            "moneta san sim replication                  # §5.4.5".into(),
            "moneta san sim sort --scale 0.01            # §5.4.6".into(),
            "moneta san sim energy                       # §5.4.7".into(),
        ]),
        ReportSection::Paragraph("Table 5.2 and the §5.4 figures are withheld from the seeds; Table 5.1, the chapter's headline ratios and §5.4.7's energy statements are the published points below.".into()),
        ReportSection::Heading("Latency, 4 KB, one thread (§5.4.2)".into()),
        latency_table,
        ReportSection::Heading("Bandwidth (§5.4.3)".into()),
        ReportSection::Chart(chart),
    ];
    sections.extend(checks_section(
        "Published numbers of chapter 5",
        &calibration::quicksan(),
    ));
    Ok(Report {
        title: "QuickSAN (dissertation ch. 5): a SAN of SSDs with a network port".into(),
        sections,
    })
}

/// The NVMM report's figures: the latency sweep (one chart per workload
/// and thread count) and the wear curve, with the statements that are
/// points of them as crosses and in a table with their errors; then all
/// of the report's statements. The sweep is `make nvmm`'s, in full (64
/// points, about a second).
fn nvmm_page(a: &ReportArgs) -> Result<Report, String> {
    let config = NvmmConfig::preset("nvmm-mlc").map_err(|e| e.to_string())?;
    let setup = nvmm::report_sweep(a.seed);
    let points = latency_sweep(&config, &setup, &mut |_, _| {}).map_err(|e| e.to_string())?;
    let mut worn = config.clone();
    worn.flash.blocks_per_plane = nvmm::WEAR_BLOCKS_PER_PLANE;
    let (wear, curve) = wear_with_curve(
        &worn,
        WEAR_RATE_MB_S * 1e6,
        WEAR_UTILIZATION,
        WEAR_ENDURANCE_SCALE,
        a.seed,
    )
    .map_err(|e| e.to_string())?;
    let seed = a.seed;
    let mut sections = vec![
        commands(&[
            format!("moneta nvmm sim sweep --seed {seed} --plot nvmm-sweep.svg   # the four sweep figures, the table of all 64 points"),
            format!("moneta nvmm sim wear --seed {seed} --plot nvmm-wear.svg     # the wear figure"),
            "moneta calibrate                                    # the statements at the end, with the array's".into(),
        ]),
        ReportSection::Paragraph(format!(
            "Preset nvmm-mlc ({}; the sweep sets the flash read latency, the wear run uses 8 blocks per plane). Workloads as in the report: GUPS 5000 random updates, MMAP 10,000 random reads, footprints 2× the DRAM; seed {seed}. The sweep is the full one of \"make nvmm\" (2 workloads × 8 latencies × 1 and 8 threads × prefetch 0 and 16), not scaled down. Crosses are the report's statements that are points of a curve, in the colour of the curve they belong to; the report gives them at its MLC latency (75 µs) and, for the crossover, at 150 µs.",
            config.description
        )),
        ReportSection::Heading("Latency sweep: NVMM against DRAM + SSD (report §5)".into()),
    ];
    sections.extend(
        nvmm::sweep_charts(&config, &setup, &points)
            .into_iter()
            .map(ReportSection::Chart),
    );
    sections.push(ReportSection::Heading("Wear (SPEC §7 \"Wear\")".into()));
    sections.push(ReportSection::Paragraph(format!(
        "Random single-segment write-backs at {WEAR_RATE_MB_S:.0} MB/s reaching the flash (\"moderate load\" has no rate in the report: ours is an assumption, and time scales as 1/rate), {:.0}% of the flash live, endurance ÷ {WEAR_ENDURANCE_SCALE} in the simulation and times multiplied back, scaled to one 8 Gb device and to 1000 at the same rate each. Capacity is the share of pages not retired, and none once no write fits (worn out). Only the shape is checked (\"wear: worn out / half retired\" below): the model has no gap between half and worn out.",
        100.0 * WEAR_UTILIZATION
    )));
    sections.push(ReportSection::Chart(nvmm::wear_chart(&wear, &curve)));
    sections.push(ReportSection::Heading(
        "Published points on the figures".into(),
    ));
    sections.push(ReportSection::Paragraph(
        "Each cross above beside the model's point at the same place. The sweep's points are the same runs as the checks below (seed 1). \"MMAP 1 thread: gain from prefetch\" is a ratio of two curves, not a point of one: it is in the checks only.".into(),
    ));
    let mut rows = Vec::new();
    for (s, p) in nvmm::sweep_published(&config, &setup, &points) {
        rows.push(vec![
            s.name.to_string(),
            format!(
                "{} {} thr, {} µs, prefetch {}",
                s.workload.name().to_uppercase(),
                s.threads,
                s.read_ns / 1000,
                s.prefetch_pages
            ),
            format!("{:.2} ×", s.published),
            format!("{:.2} ×", p.speedup_over_ssd),
            format!("{:+.1}%", 100.0 * (p.speedup_over_ssd / s.published - 1.0)),
            if s.inverse {
                "≤ 1 ×".to_string()
            } else {
                format!("{:.2}–{:.2} ×", s.low, s.high)
            },
            verdict(s.check(p.speedup_over_ssd).within()),
        ]);
    }
    for (s, model_days) in nvmm::wear_published(&wear) {
        // The report gives one device's times in days, 1000 devices' in years.
        let (unit, per_unit) = if s.devices == 1 {
            ("days", 1.0)
        } else {
            ("years", 365.0)
        };
        let time = |days: f64| calibration::format_number(days / per_unit);
        rows.push(vec![
            s.name.to_string(),
            format!("wear, {:.0}% capacity left", 100.0 * s.capacity_left),
            format!("{} {unit}", time(s.days_drawn)),
            format!("{} {unit}", time(model_days)),
            format!("{:+.1}%", 100.0 * (model_days / s.days_drawn - 1.0)),
            if s.days_low == 0.0 {
                format!("< {} {unit}", time(s.days_high))
            } else if s.days_low == s.days_high {
                format!("{} {unit}", time(s.days_high))
            } else {
                format!("{}–{} {unit}", time(s.days_low), time(s.days_high))
            },
            verdict(s.days_low <= model_days && model_days <= s.days_high),
        ]);
    }
    sections.push(ReportSection::Table {
        header: [
            "statement",
            "point",
            "published",
            "model",
            "error",
            "range",
            "",
        ]
        .iter()
        .map(|h| h.to_string())
        .collect(),
        rows,
    });
    sections.extend(checks_section(
        "Statements of the NVMM report (SPEC §7), each with the range it allows",
        &moneta_model::nvmm::calibration::checks(),
    ));
    Ok(Report {
        title: "NVMM (UMD report): journaled NAND flash as main memory".into(),
        sections,
    })
}

fn verdict(within: bool) -> String {
    if within { "ok" } else { "miss" }.to_string()
}

fn write_page(dir: &Path, name: &str, report: &Report) -> Result<(), String> {
    let path = dir.join(name);
    plot::write_file(&path, &report.to_html()).map_err(|e| e.to_string())?;
    eprintln!("moneta: wrote {}", path.display());
    Ok(())
}

pub fn report(a: ReportArgs) -> Result<(), String> {
    if !a.out.is_dir() {
        std::fs::create_dir(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    }
    let pages: [(&str, &str, Report); 5] = [
        ("moneta.html", "Moneta", moneta_page(&a)?),
        ("moneta-d.html", "Moneta-D", moneta_d_page(&a)?),
        ("onyx.html", "Onyx", onyx_page(&a)?),
        ("quicksan.html", "QuickSAN", quicksan_page(&a)?),
        ("nvmm.html", "NVMM", nvmm_page(&a)?),
    ];
    for (file, _, r) in &pages {
        write_page(&a.out, file, r)?;
    }
    let index = Report {
        title: "Moneta in software: the papers' experiments, reproduced".into(),
        sections: vec![
            ReportSection::Paragraph(format!(
                "One page per system, seed {}, {} requests per simulated point (the NVMM page's runs use the report's access counts).",
                a.seed, a.ops
            )),
            ReportSection::Links(
                pages
                    .iter()
                    .map(|(file, name, r)| (format!("{name}: {}", r.title), file.to_string()))
                    .collect(),
            ),
            commands(&[format!(
                "moneta report --out {} --ops {} --seed {}",
                a.out.display(),
                a.ops,
                a.seed
            )]),
        ],
    };
    write_page(&a.out, "index.html", &index)
}
