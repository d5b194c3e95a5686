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

/// The headings of [`row`]'s cells: the terminal table's and the HTML
/// report's (CSV and JSON carry every field; the seed is said once).
const TABLE_HEADER: [&str; 12] = [
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

fn row(p: &PointSummary) -> [String; 12] {
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
    ]
}

/// Print points; `array` makes JSON's results an array even for one point
/// (sweeps).
/// `columns` picks CSV's columns (see [`select_columns`]).
pub fn print_points(
    points: &[PointSummary],
    format: Format,
    array: bool,
    columns: Option<&str>,
    provenance: &Provenance,
) -> Result<(), String> {
    match format {
        Format::Json if array || points.len() != 1 => print_result_json(points, provenance),
        Format::Json => print_result_json(&points[0], provenance),
        Format::Csv => {
            if let Some(first) = points.first() {
                check_point_columns(columns, first)?;
            }
            print_text(&csv_provenance(provenance))?;
            print_csv_columns(points, Some(columns.unwrap_or(POINT_CSV_COLUMNS)))
        }
        Format::Table => {
            if let Some(first) = points.first() {
                let depth = match first.queue_depth {
                    1 => String::new(),
                    n => format!("  queue depth {n} per thread (asynchronous)"),
                };
                let varying = Varying::of(points);
                let mut what = Vec::new();
                if !varying.preset {
                    what.push(format!("preset {}", first.preset));
                }
                if !varying.stack {
                    what.push(format!("stack {}", first.stack));
                }
                what.push(format!("seed {}", first.seed));
                let depth = if varying.depth { String::new() } else { depth };
                println!("{}{depth}", what.join("  "));
            }
            let header = TABLE_HEADER;
            // With lists of presets, stacks, threads or depths, each row
            // first says which it is.
            let varying = Varying::of(points);
            let labels: Vec<String> = points.iter().map(|p| varying.label(p)).collect();
            let width = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
            let line = |label: &str, c: [&str; 12]| {
                let lead = if width > 0 {
                    format!("{label:<width$}  ")
                } else {
                    String::new()
                };
                println!(
                    "{lead}{:<6} {:>8} {:>4} {:>9} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>5}",
                    c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
                )
            };
            line("", header);
            for (p, label) in points.iter().zip(&labels) {
                let r = row(p);
                line(label, std::array::from_fn(|i| r[i].as_str()));
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

/// A simulated point's CSV columns unless `--columns` says otherwise: what
/// the table shows, what ran and the energy. `--columns all` gives every
/// field of the JSON (about 200: the breakdown, the power components, the
/// CDF and the whole configuration).
pub const POINT_CSV_COLUMNS: &str = "preset,stack,op,read_fraction,size_bytes,pattern,threads,queue_depth,seed,ops,bandwidth_mb_per_s,iops,latency_us_mean,latency_us_p50,latency_us_p99,latency_us_p99_9,latency_us_max,power_w,energy_nj_per_op,cpu_utilization";

/// The columns of `all` (every flattened field, in first-seen order) that
/// `wanted` names: `all`, or a comma-separated list of names, each a column
/// (`latency_us_p99`) or the prefix of dotted ones (`breakdown_us` gives
/// every `breakdown_us.*`). A name that matches nothing is an error that
/// lists the top-level names.
pub fn select_columns<'a>(all: &[&'a str], wanted: &str) -> Result<Vec<&'a str>, String> {
    if wanted.trim() == "all" {
        return Ok(all.to_vec());
    }
    let mut picked: Vec<&str> = Vec::new();
    for name in wanted.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let dotted = format!("{name}.");
        let matches: Vec<&str> = all
            .iter()
            .copied()
            .filter(|c| *c == name || c.starts_with(&dotted))
            .collect();
        if matches.is_empty() {
            let mut top: Vec<&str> = all
                .iter()
                .map(|c| c.split('.').next().unwrap_or(c))
                .collect();
            top.dedup();
            return Err(format!(
                "--columns: no column {name:?}; columns are {} (dotted ones by their prefix), or all",
                top.join(", ")
            ));
        }
        for c in matches {
            if !picked.contains(&c) {
                picked.push(c);
            }
        }
    }
    Ok(picked)
}

/// Whether `wanted` (as `--columns` takes it) names only fields of
/// `sample`, a simulated point: checked before a sweep runs, so that a
/// typo costs no run.
pub fn check_point_columns(wanted: Option<&str>, sample: &PointSummary) -> Result<(), String> {
    let Some(wanted) = wanted else {
        return Ok(());
    };
    let value = serde_json::to_value(sample).map_err(|e| e.to_string())?;
    let mut cells = Vec::new();
    flatten("", &value, &mut cells);
    let names: Vec<&str> = cells.iter().map(|(k, _)| k.as_str()).collect();
    select_columns(&names, wanted).map(|_| ())
}

/// CSV of results on stdout: one row per record, one column per field of
/// its JSON form (see [`flatten`]); a field a record lacks is empty.
pub fn print_csv<T: Serialize>(records: &[T]) -> Result<(), String> {
    print_csv_columns(records, None)
}

/// [`print_csv`] with the columns `columns` selects ([`select_columns`];
/// `None` is every column).
pub fn print_csv_columns<T: Serialize>(records: &[T], columns: Option<&str>) -> Result<(), String> {
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
    if let Some(wanted) = columns.filter(|_| !rows.is_empty()) {
        header = select_columns(&header, wanted)?;
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

/// What set a sweep's points apart besides the operation and the size:
/// the preset, stack, threads or queue depth, where the points hold more
/// than one of it (lists of `--preset`, `--stack`, `--threads`,
/// `--queue-depth`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Varying {
    preset: bool,
    stack: bool,
    threads: bool,
    depth: bool,
}

impl Varying {
    pub fn of(points: &[PointSummary]) -> Varying {
        let differ = |f: &dyn Fn(&PointSummary) -> String| {
            points
                .first()
                .is_some_and(|p0| points.iter().any(|p| f(p) != f(p0)))
        };
        Varying {
            preset: differ(&|p| p.preset.clone()),
            stack: differ(&|p| p.stack.clone()),
            threads: differ(&|p| p.threads.to_string()),
            depth: differ(&|p| p.queue_depth.to_string()),
        }
    }

    /// What sets `p` apart ("onyx-late, 1 thread"), empty when nothing varies.
    pub fn label(&self, p: &PointSummary) -> String {
        let mut parts = Vec::new();
        if self.preset {
            parts.push(p.preset.clone());
        }
        if self.stack {
            parts.push(p.stack.clone());
        }
        if self.threads {
            parts.push(threads_label(p.threads));
        }
        if self.depth {
            parts.push(format!("QD{}", p.queue_depth));
        }
        parts.join(", ")
    }

    /// A series' name: the operation, then what sets it apart.
    fn series_name(&self, p: &PointSummary) -> String {
        match self.label(p) {
            l if l.is_empty() => p.op.clone(),
            l => format!("{}, {l}", p.op),
        }
    }
}

/// "1 thread", "16 threads".
pub fn threads_label(n: u32) -> String {
    format!("{n} thread{}", if n == 1 { "" } else { "s" })
}

/// One series per operation and what else varies (see [`Varying`]), in
/// first-seen order.
fn series_by_op(points: &[PointSummary], value: impl Fn(&PointSummary) -> f64) -> Vec<Series> {
    let varying = Varying::of(points);
    let mut series: Vec<Series> = Vec::new();
    for p in points {
        let name = varying.series_name(p);
        let s = match series.iter_mut().position(|s| s.name == name) {
            Some(i) => &mut series[i],
            None => {
                series.push(Series {
                    name,
                    points: Vec::new(),
                });
                series.last_mut().expect("just pushed")
            }
        };
        s.points.push((p.size_bytes as f64, value(p)));
    }
    series
}

/// "preset, stack, N threads" for titles: what every point shares (what
/// varies is in the series' names), and the queue depth when it is not 1.
fn run_label(points: &[PointSummary]) -> String {
    let Some(p) = points.first() else {
        return "no points".into();
    };
    let varying = Varying::of(points);
    let mut parts = Vec::new();
    if !varying.preset {
        parts.push(p.preset.clone());
    }
    if !varying.stack {
        parts.push(format!("{} stack", p.stack));
    }
    if !varying.threads {
        parts.push(threads_label(p.threads));
    }
    if !varying.depth && p.queue_depth != 1 {
        parts.push(format!("queue depth {}", p.queue_depth));
    }
    parts.join(", ")
}

/// `what (detail)`, or `what` alone when there is no detail (a leading
/// "; " of an empty first part dropped).
fn titled(what: &str, detail: &str) -> String {
    match detail.trim_start_matches("; ") {
        "" => what.to_string(),
        d => format!("{what} ({d})"),
    }
}

/// Adds "PARTIAL: k of n points" to a title when the run stopped early.
pub fn mark_partial(title: &mut String, partial: Option<(usize, usize)>) {
    if let Some((done, all)) = partial {
        title.push_str(&format!(" — PARTIAL: {done} of {all} points"));
    }
}

/// The configuration a point ran: the one of `configs` with its preset and
/// stack (the first when none matches).
fn config_of<'a>(configs: &'a [Config], p: &PointSummary) -> &'a Config {
    configs
        .iter()
        .find(|c| c.name == p.preset && c.host.stack.name() == p.stack)
        .unwrap_or(&configs[0])
}

/// (op, size in bytes, published MB/s, model MB/s).
pub type PublishedPoint = (String, u64, f64, f64);

/// Published points for the points of `points` (see
/// `calibration::published_bandwidth`), each beside the model's point of
/// the same operation and size, named by the point's series (the model's
/// curve it is compared with).
pub fn published_beside(
    configs: &[Config],
    points: &[PointSummary],
) -> (Option<&'static str>, Vec<PublishedPoint>) {
    let varying = Varying::of(points);
    let mut source = None;
    let mut rows = Vec::new();
    if configs.is_empty() {
        return (None, rows);
    }
    for p in points {
        let config = config_of(configs, p);
        if let Some((src, published)) = published_bandwidth(config, &p.op, p.threads) {
            if p.queue_depth != 1 {
                continue;
            }
            if let Some(&(_, mb)) = published.iter().find(|(size, _)| *size == p.size_bytes) {
                source = Some(src);
                rows.push((
                    varying.series_name(p),
                    p.size_bytes,
                    mb,
                    p.bandwidth_mb_per_s,
                ));
            }
        }
    }
    (source, rows)
}

pub fn bandwidth_chart(configs: &[Config], points: &[PointSummary]) -> Chart {
    let mut series = series_by_op(points, |p| p.bandwidth_mb_per_s);
    let (_, published) = published_beside(configs, points);
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
        title: titled(
            "Bandwidth vs request size",
            &format!("{}{crosses}", run_label(points)),
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
fn published_table(configs: &[Config], points: &[PointSummary]) -> Vec<ReportSection> {
    let (Some(source), rows) = published_beside(configs, points) else {
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
            header: [
                "series",
                "size (B)",
                "published MB/s",
                "model MB/s",
                "error",
            ]
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

/// The HTML report of a sweep of one or more configurations (`configs`,
/// at least one: the points' presets and stacks).
pub fn sweep_report(configs: &[Config], points: &[PointSummary]) -> Report {
    let what = run_label(points);
    let latency = Chart {
        title: titled("Mean latency vs request size", &what),
        x_label: "request size (bytes)".into(),
        y_label: "mean latency (µs, log scale)".into(),
        x_log2: true,
        x_log10: false,
        y_log10: true,
        series: series_by_op(points, |p| p.latency_us_mean),
    };
    let power = Chart {
        title: titled("Device power vs request size", &what),
        x_label: "request size (bytes)".into(),
        y_label: "power (W)".into(),
        x_log2: true,
        x_log10: false,
        y_log10: false,
        series: series_by_op(points, |p| p.power_w),
    };
    let seed = points.first().map_or(0, |p| p.seed);
    let varying = Varying::of(points);
    let mut where_time_goes = vec![ReportSection::Heading("Where time goes".into())];
    let mut names: Vec<String> = Vec::new();
    for p in points {
        let name = varying.series_name(p);
        if !names.contains(&name) {
            names.push(name);
        }
    }
    for name in &names {
        let of_series: Vec<&PointSummary> = points
            .iter()
            .filter(|p| varying.series_name(p) == *name)
            .collect();
        let labels: Vec<String> = of_series
            .iter()
            .map(|p| crate::plot::format_pow2(p.size_bytes as f64))
            .collect();
        where_time_goes.push(ReportSection::Bars(breakdown_bars(
            titled(&format!("Where {name} time goes, by request size"), &what),
            &of_series,
            &labels,
            true,
        )));
        if of_series.iter().any(|p| has_distribution(p)) {
            where_time_goes.push(ReportSection::Chart(cdf_chart(
                titled(&format!("{name} latency CDF, by request size"), &what),
                &of_series,
                &labels,
            )));
        } else {
            where_time_goes.push(ReportSection::Paragraph(format!(
                "{name}: every request of a size takes the same time (within 2%), so there is no latency distribution to draw; the table below has the latencies."
            )));
        }
    }
    let config = &configs[0];
    let title = if configs.len() == 1 {
        format!("Moneta simulation: {}", config.name)
    } else {
        let names: Vec<String> = configs
            .iter()
            .map(|c| format!("{}/{}", c.name, c.host.stack.name()))
            .collect();
        format!("Moneta simulation: {}", names.join(" vs "))
    };
    let description = if configs.len() == 1 {
        format!(
            "{} Stack {}, seed {seed}.",
            config.description,
            config.host.stack.name()
        )
    } else {
        let each: Vec<String> = configs
            .iter()
            .map(|c| {
                format!(
                    "{} ({} stack): {}",
                    c.name,
                    c.host.stack.name(),
                    c.description
                )
            })
            .collect();
        format!("{} Seed {seed}.", each.join(" "))
    };
    let (mut header, mut cells): (Vec<String>, Vec<Vec<String>>) = (
        TABLE_HEADER.iter().map(|c| c.to_string()).collect(),
        points.iter().map(|p| row(p).to_vec()).collect(),
    );
    if varying != Varying::default() {
        header.insert(0, "series".into());
        for (r, p) in cells.iter_mut().zip(points) {
            r.insert(0, varying.label(p));
        }
    }
    let mut sections = vec![
        ReportSection::Paragraph(format!(
            "{description} Bandwidth in 10^6 B/s, as in the papers. Re-running with the same seed and configuration gives the same numbers."
        )),
        ReportSection::Chart(bandwidth_chart(configs, points)),
    ];
    sections.extend(published_table(configs, points));
    sections.extend([ReportSection::Chart(latency), ReportSection::Chart(power)]);
    sections.extend(where_time_goes);
    sections.push(ReportSection::Heading("Results".into()));
    sections.push(ReportSection::Table {
        header,
        rows: cells,
    });
    for c in configs {
        sections.push(ReportSection::Heading(format!(
            "Resolved configuration: {} ({} stack)",
            c.name,
            c.host.stack.name()
        )));
        sections.push(ReportSection::Preformatted(
            toml::to_string(c).unwrap_or_default(),
        ));
    }
    Report { title, sections }
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
        Format::Json => print_points(points, format, true, None, provenance),
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

/// The most segments a bar has: more cannot be told apart by colour.
pub const MAX_SEGMENTS: usize = 8;

/// The components a chart of `points` draws on their own (the largest by
/// their summed share of each point's latency, at most [`MAX_SEGMENTS`] - 1
/// when some must go into "other"), in Table 3.1 order, and those it sums
/// as "other".
fn drawn_components(points: &[&PointSummary]) -> (Vec<Component>, Vec<Component>) {
    let all = components_of(points);
    if all.len() <= MAX_SEGMENTS {
        return (all, Vec::new());
    }
    let share = |c: Component| -> f64 {
        points
            .iter()
            .map(|p| {
                let total = p.breakdown_us.total_mean_ns();
                if total > 0.0 {
                    p.breakdown_us.mean_ns(c) / total
                } else {
                    0.0
                }
            })
            .sum()
    };
    let mut by_share = all.clone();
    by_share.sort_by(|a, b| share(*b).total_cmp(&share(*a)));
    let kept = &by_share[..MAX_SEGMENTS - 1];
    all.iter().partition(|c| kept.contains(c))
}

/// One stacked bar per point, labelled by `labels`: at most
/// [`MAX_SEGMENTS`] segments coloured by family (`plot::Family`), the
/// smallest components summed as "other" on top (the tables keep them all).
pub fn breakdown_bars(
    title: String,
    points: &[&PointSummary],
    labels: &[String],
    percent: bool,
) -> StackedBars {
    let (drawn, other) = drawn_components(points);
    let other_name = format!(
        "{} ({} smaller components)",
        crate::plot::OTHER_COMPONENTS,
        other.len()
    );
    StackedBars {
        title,
        y_label: "mean latency (µs)".into(),
        bars: points
            .iter()
            .zip(labels)
            .map(|(p, label)| {
                let mut parts: Vec<(String, f64)> = drawn
                    .iter()
                    .map(|&c| (c.label().to_string(), p.breakdown_us.mean_ns(c) / 1e3))
                    .collect();
                if !other.is_empty() {
                    let rest = other
                        .iter()
                        .map(|&c| p.breakdown_us.mean_ns(c))
                        .sum::<f64>();
                    parts.push((other_name.clone(), rest / 1e3));
                }
                (label.clone(), parts)
            })
            .collect(),
        percent,
    }
}

/// Whether a point's latencies spread (the slowest request more than 2%
/// slower than the fastest): a CDF of a point without is a vertical line.
pub fn has_distribution(p: &PointSummary) -> bool {
    match (p.latency_cdf_us.first(), p.latency_cdf_us.last()) {
        (Some(&(lo, _)), Some(&(hi, _))) => lo > 0.0 && hi > 1.02 * lo,
        _ => false,
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
            if points.iter().any(has_distribution) {
                ReportSection::Chart(cdf_chart(format!("latency CDF: {what}"), &refs, labels))
            } else {
                ReportSection::Paragraph(
                    "Every request takes the same time in each configuration (within 2%): no latency distribution to draw (more threads make one).".into(),
                )
            },
            ReportSection::Table {
                header: std::iter::once("component".to_string())
                    .chain(labels.iter().cloned())
                    .collect(),
                rows,
            },
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plot::tests::{assert_no_label_overlaps, check_balanced};
    use moneta_model::summary::xdd_point;
    use moneta_model::workload::{OpMix, RunLimit};

    fn point(preset: &str, size: u64, threads: u32) -> (Config, PointSummary) {
        let c = Config::preset(preset).unwrap();
        let p = xdd_point(&c, OpMix::Read, size, threads, RunLimit::Ops(400), 1).unwrap();
        (c, p)
    }

    /// Several presets and thread counts in one sweep: one series per
    /// operation and combination, named by what sets it apart; titles keep
    /// what they share and never an empty "()"; the page renders with a
    /// "series" column and no overlapping labels.
    #[test]
    fn a_sweep_of_several_configurations_overlays_them() {
        let mut configs = Vec::new();
        let mut points = Vec::new();
        for preset in ["moneta", "onyx-late"] {
            for threads in [1, 16] {
                for size in [512, 4096] {
                    let (c, p) = point(preset, size, threads);
                    points.push(p);
                    if !configs.iter().any(|k: &Config| k.name == c.name) {
                        configs.push(c);
                    }
                }
            }
        }
        let chart = bandwidth_chart(&configs, &points);
        let names: Vec<&str> = chart.series.iter().map(|s| s.name.as_str()).collect();
        assert!(names.contains(&"read, moneta, 2q, 1 thread"), "{names:?}");
        assert!(
            names.contains(&"read, onyx-late, spin, 16 threads"),
            "{names:?}"
        );
        assert_eq!(
            names
                .iter()
                .filter(|n| !n.starts_with(PUBLISHED_PREFIX))
                .count(),
            4
        );
        // Published points (moneta, 16 threads) take their series' name.
        assert!(
            names.contains(&"published read, moneta, 2q, 16 threads"),
            "{names:?}"
        );
        assert!(
            !chart.title.contains("()") && !chart.title.contains("(;"),
            "{}",
            chart.title
        );
        let html = sweep_report(&configs, &points).to_html();
        check_balanced(&html);
        assert!(html.contains("<th>series</th><th>op</th>"));
        assert!(html.contains("Resolved configuration: onyx-late"));
        for svg in html.split("<figure>").skip(1) {
            assert_no_label_overlaps(
                "sweep report figure",
                svg.split("</figure>").next().unwrap(),
            );
        }
        // One configuration: its name in the titles, no series column.
        let one: Vec<PointSummary> = points
            .iter()
            .filter(|p| p.preset == "moneta" && p.threads == 16)
            .cloned()
            .collect();
        let chart = bandwidth_chart(&configs[..1], &one);
        assert_eq!(chart.series[0].name, "read");
        assert!(
            chart.title.contains("moneta, 2q stack, 16 threads"),
            "{}",
            chart.title
        );
        assert!(!sweep_report(&configs[..1], &one)
            .to_html()
            .contains("<th>series</th><th>op</th>"));
        let mut title = chart.title.clone();
        mark_partial(&mut title, Some((3, 36)));
        assert!(title.ends_with("PARTIAL: 3 of 36 points"));
    }

    /// A bar has at most eight segments: the largest components, the rest
    /// summed as "other" on top; every bar still sums to its latency.
    #[test]
    fn breakdown_bars_group_small_components_as_other() {
        let points: Vec<PointSummary> = [512, 65536]
            .iter()
            .map(|&s| point("moneta", s, 16).1)
            .collect();
        let refs: Vec<&PointSummary> = points.iter().collect();
        assert!(
            components_of(&refs).len() > MAX_SEGMENTS,
            "the case needs many components"
        );
        let bars = breakdown_bars("t".into(), &refs, &["a".into(), "b".into()], false);
        for ((_, parts), p) in bars.bars.iter().zip(&points) {
            assert!(parts.len() <= MAX_SEGMENTS, "{parts:?}");
            let (last, _) = parts.last().unwrap();
            assert!(last.starts_with("other ("), "{last}");
            let sum: f64 = parts.iter().map(|(_, v)| v).sum();
            let total = p.breakdown_us.total_mean_ns() / 1e3;
            assert!(
                (sum - total).abs() < 1e-6 * total.max(1.0),
                "{sum} vs {total}"
            );
        }
        // Few components: no "other".
        let (drawn, other) = drawn_components(&refs[..1]);
        assert!(drawn.len() <= MAX_SEGMENTS);
        if components_of(&refs[..1]).len() <= MAX_SEGMENTS {
            assert!(other.is_empty());
        }
    }

    /// One thread of the deterministic model has no distribution to draw;
    /// sixteen threads queueing do.
    #[test]
    fn a_cdf_only_where_latencies_spread() {
        assert!(!has_distribution(&point("moneta", 4096, 1).1));
        assert!(has_distribution(&point("onyx-late", 4096, 16).1));
    }

    #[test]
    fn columns_are_selected_by_name_or_prefix() {
        let all = [
            "op",
            "size_bytes",
            "breakdown_us.dma",
            "breakdown_us.ring",
            "config.a.b",
        ];
        assert_eq!(select_columns(&all, "all").unwrap(), all.to_vec());
        assert_eq!(
            select_columns(&all, "size_bytes, breakdown_us,op").unwrap(),
            vec!["size_bytes", "breakdown_us.dma", "breakdown_us.ring", "op"]
        );
        assert_eq!(
            select_columns(&all, "config.a").unwrap(),
            vec!["config.a.b"]
        );
        let e = select_columns(&all, "op,breakdown").unwrap_err();
        assert!(
            e.contains("\"breakdown\"") && e.contains("breakdown_us, config"),
            "{e}"
        );
        // The default names only fields a point has.
        let p = point("moneta", 4096, 1).1;
        check_point_columns(Some(POINT_CSV_COLUMNS), &p).unwrap();
        assert!(check_point_columns(Some("latency"), &p).is_err());
    }
}
