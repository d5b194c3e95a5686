//! Output of simulated points: terminal tables, CSV, JSON, and the charts
//! and HTML report of a sweep.

use crate::plot::{Chart, Report, ReportSection, Series};
use clap::ValueEnum;
use moneta_model::config::Config;
use moneta_model::summary::PointSummary;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

const COLUMNS: [&str; 11] = [
    "op",
    "size_bytes",
    "threads",
    "bandwidth_mb_per_s",
    "iops",
    "latency_us_mean",
    "latency_us_p50",
    "latency_us_p99",
    "power_w",
    "cpu_utilization",
    "seed",
];

fn row(p: &PointSummary) -> [String; 11] {
    [
        p.op.clone(),
        p.size_bytes.to_string(),
        p.threads.to_string(),
        format!("{:.1}", p.bandwidth_mb_per_s),
        format!("{:.0}", p.iops),
        format!("{:.2}", p.latency_us_mean),
        format!("{:.2}", p.latency_us_p50),
        format!("{:.2}", p.latency_us_p99),
        if p.power_w.is_finite() {
            format!("{:.3}", p.power_w)
        } else {
            "-".to_string()
        },
        format!("{:.2}", p.cpu_utilization),
        p.seed.to_string(),
    ]
}

/// Print points; `array` makes JSON an array even for one point (sweeps).
pub fn print_points(points: &[PointSummary], format: Format, array: bool) {
    match format {
        Format::Json => {
            let text = if array || points.len() != 1 {
                serde_json::to_string_pretty(points)
            } else {
                serde_json::to_string_pretty(&points[0])
            };
            println!("{}", text.expect("points serialize"));
        }
        Format::Csv => {
            println!("preset,stack,{}", COLUMNS.join(","));
            for p in points {
                println!("{},{},{}", p.preset, p.stack, row(p).join(","));
            }
        }
        Format::Table => {
            if let Some(first) = points.first() {
                println!(
                    "preset {}  stack {}  seed {}",
                    first.preset, first.stack, first.seed
                );
            }
            let header = [
                "op", "size", "thr", "MB/s", "IOPS", "mean µs", "p50 µs", "p99 µs", "power W",
                "cpu",
            ];
            println!(
                "{:<6} {:>8} {:>4} {:>9} {:>10} {:>9} {:>9} {:>9} {:>8} {:>5}",
                header[0],
                header[1],
                header[2],
                header[3],
                header[4],
                header[5],
                header[6],
                header[7],
                header[8],
                header[9]
            );
            for p in points {
                let r = row(p);
                println!(
                    "{:<6} {:>8} {:>4} {:>9} {:>10} {:>9} {:>9} {:>9} {:>8} {:>5}",
                    r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9]
                );
            }
        }
    }
}

fn series_by_op(points: &[PointSummary], value: impl Fn(&PointSummary) -> f64) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for p in points {
        let s = match series.iter_mut().position(|s| s.name == p.op) {
            Some(i) => &mut series[i],
            None => {
                series.push(Series {
                    name: p.op.clone(),
                    points: Vec::new(),
                });
                series.last_mut().expect("just pushed")
            }
        };
        s.points.push((p.size_bytes as f64, value(p)));
    }
    series
}

pub fn bandwidth_chart(config: &Config, points: &[PointSummary]) -> Chart {
    Chart {
        title: format!(
            "{}: bandwidth vs request size ({} stack)",
            config.name,
            config.host.stack.name()
        ),
        x_label: "request size (bytes)".into(),
        y_label: "bandwidth (MB/s)".into(),
        x_log2: true,
        series: series_by_op(points, |p| p.bandwidth_mb_per_s),
    }
}

pub fn sweep_report(config: &Config, points: &[PointSummary]) -> Report {
    let latency = Chart {
        title: format!("{}: mean latency vs request size", config.name),
        x_label: "request size (bytes)".into(),
        y_label: "mean latency (µs)".into(),
        x_log2: true,
        series: series_by_op(points, |p| p.latency_us_mean),
    };
    let power = Chart {
        title: format!("{}: device power vs request size", config.name),
        x_label: "request size (bytes)".into(),
        y_label: "power (W)".into(),
        x_log2: true,
        series: series_by_op(points, |p| p.power_w),
    };
    let seed = points.first().map_or(0, |p| p.seed);
    Report {
        title: format!("Moneta simulation: {}", config.name),
        sections: vec![
            ReportSection::Heading(config.description.clone()),
            ReportSection::Paragraph(format!(
                "Stack {}, seed {seed}. Bandwidth in 10^6 B/s, as in the papers. Re-running with the same seed and configuration gives the same numbers.",
                config.host.stack.name()
            )),
            ReportSection::Chart(bandwidth_chart(config, points)),
            ReportSection::Chart(latency),
            ReportSection::Chart(power),
            ReportSection::Table {
                header: COLUMNS.iter().map(|c| c.to_string()).collect(),
                rows: points.iter().map(|p| row(p).to_vec()).collect(),
            },
            ReportSection::Heading("Resolved configuration".into()),
            ReportSection::Preformatted(toml::to_string(config).unwrap_or_default()),
        ],
    }
}
