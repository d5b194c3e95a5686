//! Output of simulated points: terminal tables, CSV, JSON, and the charts
//! and HTML report of a sweep; where time goes (SPEC §2.1 Table 3.1): the
//! breakdown table, stacked bars and latency CDFs.

use crate::plot::{Chart, Report, ReportSection, Series, StackedBars, PUBLISHED_PREFIX};
use crate::provenance::Provenance;
use clap::ValueEnum;
use moneta_model::breakdown::Component;
use moneta_model::calibration::published_bandwidth;
use moneta_model::config::Config;
use moneta_model::summary::PointSummary;
use serde::Serialize;
use serde_json::Value;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    Csv,
}

/// The columns of the terminal table and the HTML report (CSV and JSON
/// carry every field).
const COLUMNS: [&str; 13] = [
    "op",
    "size_bytes",
    "threads",
    "bandwidth_mb_per_s",
    "iops",
    "latency_us_mean",
    "latency_us_p50",
    "latency_us_p99",
    "latency_us_p99_9",
    "latency_us_max",
    "power_w",
    "cpu_utilization",
    "seed",
];

fn row(p: &PointSummary) -> [String; 13] {
    [
        p.op.clone(),
        p.size_bytes.to_string(),
        p.threads.to_string(),
        format!("{:.1}", p.bandwidth_mb_per_s),
        format!("{:.0}", p.iops),
        format!("{:.2}", p.latency_us_mean),
        format!("{:.2}", p.latency_us_p50),
        format!("{:.2}", p.latency_us_p99),
        format!("{:.2}", p.latency_us_p99_9),
        format!("{:.2}", p.latency_us_max),
        if p.power_w.is_finite() {
            format!("{:.3}", p.power_w)
        } else {
            "-".to_string()
        },
        format!("{:.2}", p.cpu_utilization),
        p.seed.to_string(),
    ]
}

/// Print points; `array` makes JSON's results an array even for one point
/// (sweeps).
pub fn print_points(
    points: &[PointSummary],
    format: Format,
    array: bool,
    provenance: &Provenance,
) -> Result<(), String> {
    match format {
        Format::Json if array || points.len() != 1 => print_result_json(points, provenance),
        Format::Json => print_result_json(&points[0], provenance),
        Format::Csv => print_result_csv(points, provenance),
        Format::Table => {
            if let Some(first) = points.first() {
                let depth = match first.queue_depth {
                    1 => String::new(),
                    n => format!("  queue depth {n} per thread (asynchronous)"),
                };
                println!(
                    "preset {}  stack {}  seed {}{depth}",
                    first.preset, first.stack, first.seed
                );
            }
            let header = [
                "op",
                "size",
                "thr",
                "MB/s",
                "IOPS",
                "mean µs",
                "p50 µs",
                "p99 µs",
                "p99.9 µs",
                "max µs",
                "power W",
                "cpu",
            ];
            let line = |c: [&str; 12]| {
                println!(
                    "{:<6} {:>8} {:>4} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5}",
                    c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
                )
            };
            line(header);
            for p in points {
                let r = row(p);
                line(std::array::from_fn(|i| r[i].as_str()));
            }
            Ok(())
        }
    }
}

/// Columns of the rows' JSON: integers whole, other numbers to three
/// significant digits (at least two decimals).
pub(crate) fn table<T: Serialize>(
    rows: &[T],
    columns: &[&str],
) -> Result<(Vec<String>, Vec<Vec<String>>), String> {
    let cells = rows
        .iter()
        .map(|r| {
            let v = serde_json::to_value(r).map_err(|e| e.to_string())?;
            Ok(columns
                .iter()
                .map(|c| {
                    let cell = c.split('.').try_fold(&v, |v, k| v.get(k));
                    match cell {
                        Some(Value::Number(n)) if n.is_f64() => {
                            let x = n.as_f64().unwrap_or(f64::NAN);
                            // Three significant digits below 100, else two decimals.
                            if x.abs() < 100.0 && x != 0.0 {
                                let decimals = (2 - x.abs().log10().floor() as i32).clamp(2, 6);
                                format!("{x:.*}", decimals as usize)
                            } else {
                                format!("{x:.2}")
                            }
                        }
                        Some(Value::String(s)) => s.clone(),
                        Some(v) => v.to_string(),
                        None => "-".into(),
                    }
                })
                .collect())
        })
        .collect::<Result<Vec<Vec<String>>, String>>()?;
    let header = columns.iter().map(|c| c.to_string()).collect();
    Ok((header, cells))
}

/// Pretty JSON of any result on stdout.
/// Print `header` and `cells` as right-aligned columns two spaces apart.
pub fn print_aligned(header: &[String], cells: &[Vec<String>]) {
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in std::iter::once(header).chain(cells.iter().map(Vec::as_slice)) {
        let s: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:>w$}"))
            .collect();
        println!("{}", s.join("  "));
    }
}

pub fn print_json<T: Serialize + ?Sized>(value: &T) -> Result<(), String> {
    let text = serde_json::to_string_pretty(value).map_err(|e| e.to_string())?;
    print_text(&text)
}

/// A result as JSON, in fio's shape: what ran, then what it found —
/// `{"provenance": {...}, "results": ...}`.
pub fn print_result_json<T: Serialize + ?Sized>(
    results: &T,
    provenance: &Provenance,
) -> Result<(), String> {
    print_text(&result_json(results, provenance)?)
}

pub fn result_json<T: Serialize + ?Sized>(
    results: &T,
    provenance: &Provenance,
) -> Result<String, String> {
    #[derive(Serialize)]
    struct Doc<'a, T: ?Sized> {
        provenance: &'a Provenance,
        results: &'a T,
    }
    serde_json::to_string_pretty(&Doc {
        provenance,
        results,
    })
    .map_err(|e| e.to_string())
}

/// Results as CSV after one comment line, `# <provenance>` (pandas reads
/// it with `comment="#"`).
pub fn print_result_csv<T: Serialize>(
    records: &[T],
    provenance: &Provenance,
) -> Result<(), String> {
    print_text(&csv_provenance(provenance))?;
    print_csv(records)
}

/// The CSV comment line: one line, whatever the command line held.
pub fn csv_provenance(provenance: &Provenance) -> String {
    format!("# {}", provenance.line().replace(['\r', '\n'], " "))
}

/// `text` and a newline on stdout. A reader that went away (`moneta stats |
/// head`) ends the output quietly: commands that talk to a daemon keep
/// SIGPIPE ignored (they must see EPIPE on the socket), so `println!` would
/// panic there.
pub fn print_text(text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(format!("writing stdout: {e}")),
        _ => Ok(()),
    }
}

/// CSV of results on stdout: one row per record, one column per field of
/// its JSON form (see [`flatten`]); a field a record lacks is empty.
pub fn print_csv<T: Serialize>(records: &[T]) -> Result<(), String> {
    let rows: Vec<Vec<(String, String)>> = records
        .iter()
        .map(|r| {
            let value = serde_json::to_value(r).map_err(|e| e.to_string())?;
            let mut cells = Vec::new();
            flatten("", &value, &mut cells);
            Ok(cells)
        })
        .collect::<Result<_, String>>()?;
    let mut header: Vec<&str> = Vec::new();
    for cells in &rows {
        for (key, _) in cells {
            if !header.contains(&key.as_str()) {
                header.push(key);
            }
        }
    }
    let mut out = csv::Writer::from_writer(std::io::stdout().lock());
    let io = |e: csv::Error| e.to_string();
    out.write_record(&header).map_err(io)?;
    for cells in &rows {
        out.write_record(header.iter().map(|h| {
            cells
                .iter()
                .find(|(k, _)| k == h)
                .map_or("", |(_, v)| v.as_str())
        }))
        .map_err(io)?;
    }
    out.flush().map_err(|e| e.to_string())
}

/// A JSON value as (column, cell) pairs. Nested objects become dotted
/// columns (`config.memory.controllers`, `device.lateness_ns_p99`); list
/// items are numbered, or named by their `name` field when they have one
/// (`power_components.ring.average_w`); null (a missing or NaN number) is an
/// empty cell.
fn flatten(prefix: &str, value: &Value, cells: &mut Vec<(String, String)>) {
    let join = |key: &str| {
        if prefix.is_empty() {
            key.to_string()
        } else {
            format!("{prefix}.{key}")
        }
    };
    match value {
        Value::Object(fields) => {
            for (key, v) in fields {
                flatten(&join(key), v, cells);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                match item.get("name").and_then(Value::as_str) {
                    Some(name) => {
                        let key = join(name);
                        let fields = item.as_object().into_iter().flatten();
                        for (k, v) in fields.filter(|(k, _)| *k != "name") {
                            flatten(&format!("{key}.{k}"), v, cells);
                        }
                    }
                    None => flatten(&join(&i.to_string()), item, cells),
                }
            }
        }
        Value::Null => cells.push((prefix.to_string(), String::new())),
        Value::String(s) => cells.push((prefix.to_string(), s.clone())),
        other => cells.push((prefix.to_string(), other.to_string())),
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

/// "preset, stack, N threads" for titles.
fn run_label(config: &Config, points: &[PointSummary]) -> String {
    let threads = points.first().map_or(0, |p| p.threads);
    format!(
        "{}, {} stack, {threads} threads",
        config.name,
        config.host.stack.name()
    )
}

/// Published points for the operations of `points` (see
/// `calibration::published_bandwidth`), each beside the model's point of
/// the same operation and size: (op, size, published MB/s, model MB/s).
/// (op, size in bytes, published MB/s, model MB/s).
pub type PublishedPoint = (String, u64, f64, f64);

pub fn published_beside(
    config: &Config,
    points: &[PointSummary],
) -> (Option<&'static str>, Vec<PublishedPoint>) {
    let mut source = None;
    let mut rows = Vec::new();
    for p in points {
        if let Some((src, published)) = published_bandwidth(config, &p.op, p.threads) {
            if let Some(&(_, mb)) = published.iter().find(|(size, _)| *size == p.size_bytes) {
                source = Some(src);
                rows.push((p.op.clone(), p.size_bytes, mb, p.bandwidth_mb_per_s));
            }
        }
    }
    (source, rows)
}

pub fn bandwidth_chart(config: &Config, points: &[PointSummary]) -> Chart {
    let mut series = series_by_op(points, |p| p.bandwidth_mb_per_s);
    let (_, published) = published_beside(config, points);
    let crosses = crate::plot::crosses_note(!published.is_empty());
    for (op, size, mb, _) in published {
        let name = format!("{PUBLISHED_PREFIX}{op}");
        match series.iter_mut().find(|s| s.name == name) {
            Some(s) => s.points.push((size as f64, mb)),
            None => series.push(Series {
                name,
                points: vec![(size as f64, mb)],
            }),
        }
    }
    Chart {
        title: format!(
            "Bandwidth vs request size ({}{crosses})",
            run_label(config, points)
        ),
        x_label: "request size (bytes)".into(),
        y_label: "bandwidth (MB/s)".into(),
        x_log2: true,
        x_log10: false,
        y_log10: false,
        series,
    }
}

/// The published points beside the model's, with the error of each, and
/// the mean absolute percentage error.
fn published_table(config: &Config, points: &[PointSummary]) -> Vec<ReportSection> {
    let (Some(source), rows) = published_beside(config, points) else {
        return vec![ReportSection::Paragraph(
            "No published points are known for this configuration (the papers' tables are for preset moneta with the 2q stack at 16 threads; Onyx's are withheld).".into(),
        )];
    };
    let errors: Vec<f64> = rows.iter().map(|r| (r.3 - r.2) / r.2).collect();
    let mape = 100.0 * errors.iter().map(|e| e.abs()).sum::<f64>() / errors.len() as f64;
    vec![
        ReportSection::Heading("Published beside the model".into()),
        ReportSection::Paragraph(format!(
            "Source: {source}. {} points, mean absolute error {mape:.1}%.",
            rows.len()
        )),
        ReportSection::Table {
            header: ["op", "size (B)", "published MB/s", "model MB/s", "error"]
                .iter()
                .map(|h| h.to_string())
                .collect(),
            rows: rows
                .iter()
                .zip(&errors)
                .map(|((op, size, published, model), e)| {
                    vec![
                        op.clone(),
                        size.to_string(),
                        format!("{published:.1}"),
                        format!("{model:.1}"),
                        format!("{:+.1}%", 100.0 * e),
                    ]
                })
                .collect(),
        },
    ]
}

pub fn sweep_report(config: &Config, points: &[PointSummary]) -> Report {
    let latency = Chart {
        title: format!(
            "Mean latency vs request size ({})",
            run_label(config, points)
        ),
        x_label: "request size (bytes)".into(),
        y_label: "mean latency (µs, log scale)".into(),
        x_log2: true,
        x_log10: false,
        y_log10: true,
        series: series_by_op(points, |p| p.latency_us_mean),
    };
    let power = Chart {
        title: format!(
            "Device power vs request size ({})",
            run_label(config, points)
        ),
        x_label: "request size (bytes)".into(),
        y_label: "power (W)".into(),
        x_log2: true,
        x_log10: false,
        y_log10: false,
        series: series_by_op(points, |p| p.power_w),
    };
    let seed = points.first().map_or(0, |p| p.seed);
    let mut where_time_goes = vec![ReportSection::Heading("Where time goes".into())];
    for op in ["read", "write", "mixed"] {
        let of_op: Vec<&PointSummary> = points.iter().filter(|p| p.op == op).collect();
        if of_op.is_empty() {
            continue;
        }
        let labels: Vec<String> = of_op
            .iter()
            .map(|p| crate::plot::format_pow2(p.size_bytes as f64))
            .collect();
        where_time_goes.push(ReportSection::Bars(breakdown_bars(
            format!(
                "Where {op} time goes, by request size ({})",
                run_label(config, points)
            ),
            &of_op,
            &labels,
            true,
        )));
        where_time_goes.push(ReportSection::Chart(cdf_chart(
            format!(
                "{op} latency CDF, by request size ({})",
                run_label(config, points)
            ),
            &of_op,
            &labels,
        )));
    }
    Report {
        title: format!("Moneta simulation: {}", config.name),
        sections: vec![
            ReportSection::Heading(config.description.clone()),
            ReportSection::Paragraph(format!(
                "Stack {}, seed {seed}. Bandwidth in 10^6 B/s, as in the papers. Re-running with the same seed and configuration gives the same numbers.",
                config.host.stack.name()
            )),
            ReportSection::Chart(bandwidth_chart(config, points)),
        ]
        .into_iter()
        .chain(published_table(config, points))
        .chain([
            ReportSection::Chart(latency),
            ReportSection::Chart(power),
        ])
        .chain(where_time_goes)
        .chain([
            ReportSection::Table {
                header: COLUMNS.iter().map(|c| c.to_string()).collect(),
                rows: points.iter().map(|p| row(p).to_vec()).collect(),
            },
            ReportSection::Heading("Resolved configuration".into()),
            ReportSection::Preformatted(toml::to_string(config).unwrap_or_default()),
        ])
        .collect(),
    }
}

/// Components that took time in any of `points`, in Table 3.1 order.
fn components_of(points: &[&PointSummary]) -> Vec<Component> {
    Component::ALL
        .into_iter()
        .filter(|&c| points.iter().any(|p| p.breakdown_us.mean_ns(c) > 0.0))
        .collect()
}

/// Print where time goes, Table 3.1 style: one row per component with its
/// mean µs and share; the rows sum to the mean latency.
pub fn print_breakdown(p: &PointSummary) {
    let b = &p.breakdown_us;
    let total_us = b.total_mean_ns() / 1e3;
    println!(
        "\nwhere time goes: {} / {}, {} {} B, {} {}, mean of {} requests",
        p.preset,
        p.stack,
        p.op,
        p.size_bytes,
        p.threads,
        if p.threads == 1 { "thread" } else { "threads" },
        b.count()
    );
    println!("{:<38} {:>9} {:>7}", "component", "µs", "%");
    for (c, us) in b.mean_us() {
        let share = if total_us > 0.0 {
            100.0 * us / total_us
        } else {
            0.0
        };
        let side = if c.is_device() { " (device)" } else { "" };
        println!(
            "{:<38} {us:>9.2} {share:>7.1}",
            format!("{}{side}", c.label())
        );
    }
    println!(
        "{:<38} {total_us:>9.2} {:>7.1}",
        "total = mean latency", 100.0
    );
}

/// Several configurations side by side: one column of mean µs per point.
pub fn print_comparison(
    points: &[PointSummary],
    labels: &[String],
    format: Format,
    provenance: &Provenance,
) -> Result<(), String> {
    let refs: Vec<&PointSummary> = points.iter().collect();
    let components = components_of(&refs);
    match format {
        Format::Json => print_points(points, format, true, provenance),
        Format::Csv => {
            println!("{}", csv_provenance(provenance));
            println!("component,{}", labels.join(","));
            for c in &components {
                let row: Vec<String> = points
                    .iter()
                    .map(|p| format!("{:.3}", p.breakdown_us.mean_ns(*c) / 1e3))
                    .collect();
                println!("{},{}", c.key(), row.join(","));
            }
            let totals: Vec<String> = points
                .iter()
                .map(|p| format!("{:.3}", p.breakdown_us.total_mean_ns() / 1e3))
                .collect();
            println!("total,{}", totals.join(","));
            Ok(())
        }
        Format::Table => {
            if !points.is_empty() {
                println!(
                    "where time goes (mean µs per request): {}",
                    compared_workload(points)
                );
            }
            let width = labels.iter().map(|l| l.len()).max().unwrap_or(0).max(8);
            print!("{:<32}", "component");
            for l in labels {
                print!(" {l:>width$}");
            }
            println!();
            for c in &components {
                print!("{:<32}", c.label());
                for p in points {
                    print!(" {:>width$.2}", p.breakdown_us.mean_ns(*c) / 1e3);
                }
                println!();
            }
            print!("{:<32}", "total = mean latency");
            for p in points {
                print!(" {:>width$.2}", p.breakdown_us.total_mean_ns() / 1e3);
            }
            println!();
            Ok(())
        }
    }
}

/// One stacked bar per point, labelled by `labels`.
pub fn breakdown_bars(
    title: String,
    points: &[&PointSummary],
    labels: &[String],
    percent: bool,
) -> StackedBars {
    let components = components_of(points);
    StackedBars {
        title,
        y_label: "mean latency (µs)".into(),
        bars: points
            .iter()
            .zip(labels)
            .map(|(p, label)| {
                let parts = components
                    .iter()
                    .map(|&c| (c.label().to_string(), p.breakdown_us.mean_ns(c) / 1e3))
                    .collect();
                (label.clone(), parts)
            })
            .collect(),
        percent,
    }
}

/// Latency CDFs on a log latency axis, one series per point.
pub fn cdf_chart(title: String, points: &[&PointSummary], labels: &[String]) -> Chart {
    Chart {
        title,
        x_label: "latency (µs, log scale)".into(),
        y_label: "fraction of requests".into(),
        x_log2: false,
        x_log10: true,
        y_log10: false,
        series: points
            .iter()
            .zip(labels)
            .map(|(p, label)| Series {
                name: label.clone(),
                points: p.latency_cdf_us.clone(),
            })
            .collect(),
    }
}

/// What a comparison ran: the preset (when every point shares one),
/// operation, size, threads, seed.
fn compared_workload(points: &[PointSummary]) -> String {
    points.first().map_or(String::new(), |p| {
        let preset = if points.iter().all(|q| q.preset == p.preset) {
            format!("{}, ", p.preset)
        } else {
            String::new()
        };
        let threads = if p.threads == 1 { "thread" } else { "threads" };
        format!(
            "{preset}{} {}, {} {threads}, seed {}",
            p.op,
            moneta_model::units::format_size(
                p.size_bytes as f64,
                true,
                &moneta_model::units::LEGEND_UNITS
            ),
            p.threads,
            p.seed
        )
    })
}

/// The stacked bars of `moneta sim compare`: one bar per configuration, in µs.
pub fn compare_bars(points: &[PointSummary], labels: &[String]) -> StackedBars {
    let refs: Vec<&PointSummary> = points.iter().collect();
    breakdown_bars(
        format!("where time goes: {}", compared_workload(points)),
        &refs,
        labels,
        false,
    )
}

/// The report of `moneta sim compare`: stacked bars, CDFs and the table.
pub fn compare_report(points: &[PointSummary], labels: &[String]) -> Report {
    let refs: Vec<&PointSummary> = points.iter().collect();
    let components = components_of(&refs);
    let what = compared_workload(points);
    let mut rows: Vec<Vec<String>> = components
        .iter()
        .map(|c| {
            std::iter::once(c.label().to_string())
                .chain(
                    points
                        .iter()
                        .map(|p| format!("{:.2}", p.breakdown_us.mean_ns(*c) / 1e3)),
                )
                .collect()
        })
        .collect();
    rows.push(
        std::iter::once("total = mean latency".to_string())
            .chain(
                points
                    .iter()
                    .map(|p| format!("{:.2}", p.breakdown_us.total_mean_ns() / 1e3)),
            )
            .collect(),
    );
    Report {
        title: format!("Where time goes: {what}"),
        sections: vec![
            ReportSection::Paragraph(
                "Mean µs per request by component (SPEC §2.1 Table 3.1); each bar sums to the mean latency. Same seed, same numbers.".into(),
            ),
            ReportSection::Bars(compare_bars(points, labels)),
            ReportSection::Chart(cdf_chart(format!("latency CDF: {what}"), &refs, labels)),
            ReportSection::Table {
                header: std::iter::once("component".to_string())
                    .chain(labels.iter().cloned())
                    .collect(),
                rows,
            },
        ],
    }
}
