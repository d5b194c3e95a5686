//! End-to-end tests of the `moneta` binary: output forms, determinism,
//! errors for bad input, sharding and reports.

use std::process::{Command, Output};

fn moneta(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(args)
        .output()
        .expect("moneta runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A result's JSON document: its provenance says what ran; its results
/// are returned.
fn results(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&stdout(o)).expect("JSON");
    let p = &v["provenance"];
    assert_eq!(p["tool"], "moneta", "{v}");
    assert!(
        p["command"].as_array().is_some_and(|c| c.len() > 1)
            && p["commit"].as_str().is_some_and(|c| !c.is_empty())
            && p["date"].as_str().is_some_and(|d| d.ends_with('Z')),
        "provenance: {p}"
    );
    v["results"].clone()
}

/// CSV without its `# provenance` first line (checked).
fn csv_rows(o: &Output) -> String {
    let text = stdout(o);
    let (first, rest) = text.split_once('\n').expect("CSV lines");
    assert!(first.starts_with("# moneta "), "provenance line: {first}");
    rest.to_string()
}

#[test]
fn run_prints_the_documented_json_fields() {
    let o = moneta(&[
        "sim",
        "run",
        "--preset",
        "moneta",
        "--op",
        "mixed",
        "--size",
        "4096",
        "--threads",
        "4",
        "--ops",
        "5000",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = results(&o);
    for key in [
        "op",
        "size_bytes",
        "threads",
        "seed",
        "config",
        "bandwidth_mb_per_s",
        "iops",
        "latency_us_mean",
        "latency_us_p50",
        "latency_us_p99",
        "power_w",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["op"], "mixed");
    assert_eq!(v["size_bytes"], 4096);
    assert!(v["bandwidth_mb_per_s"].as_f64().unwrap() > 100.0);
    assert!(v["power_w"].as_f64().unwrap() > 0.1);
    assert_eq!(v["config"]["memory"]["controllers"], 8);
}

#[test]
fn same_seed_same_output_different_seed_different_output() {
    let args = [
        "sim",
        "run",
        "--preset",
        "moneta-micro10",
        "--op",
        "mixed",
        "--size",
        "2048",
        "--ops",
        "20000",
        "--format",
        "csv",
    ];
    let a = csv_rows(&moneta(&args));
    let b = csv_rows(&moneta(&args));
    assert_eq!(a, b);
    let mut other = args.to_vec();
    other.extend(["--seed", "99"]);
    assert_ne!(a, csv_rows(&moneta(&other)));
}

#[test]
fn bad_input_is_a_clear_error_not_a_crash() {
    for (args, needle) in [
        (
            vec!["sim", "run", "--set", "memory.controlers=4"],
            "memory.controlers",
        ),
        (
            vec!["sim", "run", "--set", "memory.controllers=0"],
            "memory.controllers",
        ),
        (
            vec!["sim", "run", "--set", "device.queue_policy=lifo"],
            "device.queue_policy",
        ),
        (vec!["sim", "run", "--preset", "nope"], "unknown preset"),
        (vec!["sim", "run", "--stack", "turbo"], "unknown stack"),
        (
            vec!["sim", "run", "--tech", "unobtainium"],
            "unknown technology",
        ),
        (vec!["sim", "run", "--size", "1000"], "multiple of 512"),
        (vec!["sim", "run", "--op", "erase"], "unknown op"),
        (vec!["sim", "sweep", "--shard", "3/2"], "--shard"),
        (vec!["sim", "sweep", "--sizes", "4k,4GB"], "--sizes"),
    ] {
        let o = moneta(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn shards_partition_the_sweep() {
    let base = [
        "sim",
        "sweep",
        "--preset",
        "moneta",
        "--op",
        "read,write",
        "--sizes",
        "512,4096,65536",
        "--ops",
        "3000",
        "--format",
        "json",
    ];
    let all: Vec<serde_json::Value> = serde_json::from_value(results(&moneta(&base))).unwrap();
    assert_eq!(all.len(), 6);
    let mut parts = Vec::new();
    for shard in ["0/2", "1/2"] {
        let mut args = base.to_vec();
        args.extend(["--shard", shard]);
        let v: Vec<serde_json::Value> = serde_json::from_value(results(&moneta(&args))).unwrap();
        parts.extend(v);
    }
    assert_eq!(parts.len(), 6);
    for p in &all {
        assert!(parts.contains(p), "shards lost {p}");
    }
}

#[test]
fn sweep_writes_plot_and_report() {
    let dir = std::env::temp_dir().join(format!("moneta-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("bw.svg");
    let html = dir.join("report.html");
    let o = moneta(&[
        "sim",
        "sweep",
        "--preset",
        "onyx-late",
        "--op",
        "read,write",
        "--sizes",
        "4096,65536",
        "--ops",
        "400",
        "--threads",
        "4",
        "--plot",
        svg.to_str().unwrap(),
        "--report",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let svg_text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg_text.starts_with("<svg") && svg_text.contains("read") && svg_text.contains("write")
    );
    let html_text = std::fs::read_to_string(&html).unwrap();
    assert!(html_text.contains("<svg") && html_text.contains("onyx-late"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn presets_lists_every_preset() {
    let out = stdout(&moneta(&["presets"]));
    for p in [
        "moneta-micro10",
        "moneta",
        "moneta-d",
        "haste",
        "onyx-late",
        "onyx-early",
        "ddr-ramdisk",
        "stt-mram",
    ] {
        assert!(out.contains(p), "{p}");
    }
}

/// A temporary directory for one test, removed when dropped.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("moneta-cli-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    /// A file in the directory holding `text`.
    fn file(&self, name: &str, text: &str) -> std::path::PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The exit code the command-line reference gives an error kind (its
/// "Exit status" table, generated from the CLI's error kinds).
fn documented_exit_code(kind: &str) -> i32 {
    let page =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/reference/cli.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let table = text
        .split("## Exit status")
        .nth(1)
        .unwrap_or_else(|| panic!("{} has no exit status section", page.display()));
    table
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            (cells.len() > 3 && cells[2] == kind).then(|| cells[1].parse().ok())?
        })
        .next()
        .unwrap_or_else(|| panic!("no exit code for '{kind}' in {}", page.display()))
}

#[test]
fn the_documented_exit_codes_are_the_shells() {
    // Ctrl-C: 128 + SIGINT, as a shell reports a command it interrupted.
    assert_eq!(documented_exit_code("interrupted"), 130);
    // A bad command line: clap's own code, which its parse errors use.
    assert_eq!(documented_exit_code("usage"), 2);
    let o = moneta(&["sim", "run", "--no-such-option"]);
    assert_eq!(o.status.code(), Some(documented_exit_code("usage")));
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn results_report_p99_9_and_max_in_json_and_csv_alike() {
    let args = [
        "sim",
        "run",
        "--op",
        "mixed",
        "--ops",
        "3000",
        "--threads",
        "4",
    ];
    let json = moneta(&[&args[..], &["--format", "json"]].concat());
    let v = results(&json);
    let (p99, p99_9, max) = (
        v["latency_us_p99"].as_f64().unwrap(),
        v["latency_us_p99_9"].as_f64().unwrap(),
        v["latency_us_max"].as_f64().unwrap(),
    );
    assert!(p99 <= p99_9 && p99_9 <= max, "{p99} {p99_9} {max}");
    // CSV's default is narrow: what ran and the table's numbers.
    let narrow = csv_rows(&moneta(&[&args[..], &["--format", "csv"]].concat()));
    let narrow_header: Vec<&str> = narrow.lines().next().unwrap().split(',').collect();
    assert!(narrow_header.len() <= 24, "{narrow_header:?}");
    for c in [
        "preset",
        "stack",
        "threads",
        "latency_us_p99_9",
        "energy_nj_per_op",
    ] {
        assert!(narrow_header.contains(&c), "{c}: {narrow_header:?}");
    }
    assert!(!narrow_header.iter().any(|h| h.contains('.')));
    // A prefix picks a dotted field's columns.
    let some = csv_rows(&moneta(
        &[
            &args[..],
            &["--format", "csv", "--columns", "op,breakdown_us"],
        ]
        .concat(),
    ));
    let some_header: Vec<&str> = some.lines().next().unwrap().split(',').collect();
    assert_eq!(some_header[0], "op");
    assert!(
        some_header[1..]
            .iter()
            .all(|h| h.starts_with("breakdown_us."))
            && some_header.len() > 3
    );
    // A name that is no column is refused before anything runs.
    let bad = moneta(&[&args[..], &["--format", "csv", "--columns", "latency"]].concat());
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stdout(&bad).is_empty() && stderr(&bad).contains("no column \"latency\""),
        "{}",
        stderr(&bad)
    );
    // --columns all: one column per JSON field, nested ones dotted, same numbers.
    let csv = csv_rows(&moneta(
        &[&args[..], &["--format", "csv", "--columns", "all"]].concat(),
    ));
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let row = lines.next().unwrap();
    assert!(lines.next().is_none());
    for (key, value) in v.as_object().unwrap() {
        match value {
            serde_json::Value::Object(_) | serde_json::Value::Array(_) => {
                assert!(
                    header.iter().any(|h| h.starts_with(&format!("{key}."))),
                    "{key}"
                )
            }
            _ => assert!(header.contains(&key.as_str()), "{key}"),
        }
    }
    assert!(header.contains(&"config.memory.controllers"));
    let column = header
        .iter()
        .position(|h| *h == "latency_us_p99_9")
        .unwrap();
    let cell: f64 = row.split(',').nth(column).unwrap().parse().unwrap();
    assert_eq!(cell, p99_9);
}

#[test]
fn config_dump_round_trips_to_identical_simulation_output() {
    let scratch = Scratch::new("dump");
    for preset in ["moneta-d", "onyx-early"] {
        let dump = moneta(&["config", "dump", "--preset", preset]);
        assert!(dump.status.success(), "{}", stderr(&dump));
        let file = scratch.file(&format!("{preset}.toml"), &stdout(&dump));
        let run = |device: &[&str]| {
            let args = [
                &["sim", "run", "--op", "mixed", "--ops", "4000"][..],
                device,
                &["--format", "json"],
            ]
            .concat();
            let o = moneta(&args);
            assert!(o.status.success(), "{args:?}: {}", stderr(&o));
            results(&o).to_string()
        };
        let from_preset = run(&["--preset", preset]);
        assert!(from_preset.contains(&format!("\"preset\":\"{preset}\"")));
        assert_eq!(from_preset, run(&["--config", file.to_str().unwrap()]));
    }
}

#[test]
fn the_example_configuration_loads() {
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/config/moneta-stt-mram.toml"
    );
    let o = moneta(&[
        "sim", "run", "--config", example, "--ops", "2000", "--format", "json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = results(&o);
    assert_eq!(v["preset"], "moneta-stt-mram");
    assert_eq!(v["config"]["memory"]["controllers"], 4);
    assert_eq!(v["config"]["memory"]["latency_ns_write"], 95);
}

#[test]
fn configuration_errors_name_the_key_and_what_is_allowed() {
    let scratch = Scratch::new("errors");
    let bad_key = scratch.file(
        "bad-key.toml",
        "inherits = \"moneta\"\n[memory]\ncontolers = 4\n",
    );
    let bad_enum = scratch.file(
        "bad-enum.toml",
        "inherits = \"moneta\"\n[device]\nqueue_policy = \"lifo\"\n",
    );
    let bad_tech = scratch.file(
        "bad-tech.toml",
        "inherits = \"moneta\"\n[memory]\ntechnology = \"nosuch\"\n",
    );
    let not_toml = scratch.file("not-toml.toml", "[memory\n");
    let missing = std::env::temp_dir().join("moneta-no-such-file.toml");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    for (args, needles) in [
        (
            vec!["sim", "run", "--config", &path(&bad_key)],
            vec!["bad-key.toml", "memory.contolers: unknown key (expected one of controller, controller_ns, controllers,"],
        ),
        (
            vec!["sim", "run", "--config", &path(&bad_enum)],
            vec!["device.queue_policy: unknown variant `lifo`, expected one of `fifo`, `2q`, `balance`"],
        ),
        (
            vec!["sim", "run", "--config", &path(&bad_tech)],
            vec!["memory.technology: unknown technology 'nosuch' (expected one of dram, pcm,", "p8p-pcm"],
        ),
        (
            vec!["sim", "run", "--config", &path(&not_toml)],
            vec!["not-toml.toml", "is not valid TOML"],
        ),
        (
            vec!["sim", "run", "--config", &path(&missing)],
            vec!["moneta-no-such-file.toml", "No such file"],
        ),
        (
            vec!["sim", "run", "--set", "memory.technology=nosuch"],
            vec!["--set memory.technology=nosuch: memory.technology: unknown technology 'nosuch' (expected one of dram,"],
        ),
        (
            vec!["sim", "run", "--set", "memory.contollers=4"],
            vec!["memory.contollers: unknown key (expected one of controller,"],
        ),
        (
            vec!["sim", "run", "--set", "host.stack=turbo"],
            vec!["host.stack: unknown variant `turbo`, expected one of `base`"],
        ),
        (
            vec!["bench", "--config", &path(&bad_key)],
            vec!["memory.contolers: unknown key"],
        ),
        (
            vec!["serve", "--config", &path(&bad_enum)],
            vec!["device.queue_policy: unknown variant `lifo`"],
        ),
        (
            vec!["config", "dump", "--preset", "nope"],
            vec!["unknown preset 'nope' (expected one of moneta-micro10, moneta,"],
        ),
    ] {
        let o = moneta(&args);
        assert_eq!(
            o.status.code(),
            Some(documented_exit_code("config")),
            "{args:?}"
        );
        let err = stderr(&o);
        for needle in needles {
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }
    // --preset and --config are one or the other.
    let o = moneta(&[
        "sim",
        "run",
        "--preset",
        "moneta",
        "--config",
        &path(&bad_key),
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot be used with"), "{}", stderr(&o));
}

#[test]
fn a_closed_stdout_ends_a_sweep_quietly() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args([
            "sim", "sweep", "--op", "read", "--sizes", "512,4096", "--ops", "2000", "--format",
            "csv",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader goes away before the sweep prints (`| head -0`).
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    let err = stderr(&o);
    assert!(err.is_empty(), "{err}");
    assert!(!err.contains("panicked"));
}

#[test]
fn more_threads_than_requests_is_a_warning() {
    let o = moneta(&["sim", "run", "--threads", "8", "--ops", "5"]);
    assert!(o.status.success());
    assert!(
        stderr(&o).contains("warning: 8 threads for 5 requests: 3 of them issue none"),
        "{}",
        stderr(&o)
    );
    let o = moneta(&[
        "sim",
        "run",
        "--preset",
        "moneta-d",
        "--threads",
        "2",
        "--qd",
        "8",
        "--ops",
        "10",
    ]);
    assert!(o.status.success());
    assert!(
        stderr(&o).contains(
            "warning: 2 threads × 8 requests in flight for 10 requests: 6 of them issue none"
        ),
        "{}",
        stderr(&o)
    );
}

/// Where time goes: for every stack, `breakdown_us` sums to the mean latency
/// and the `--breakdown` table's rows sum to its total.
#[test]
fn breakdown_sums_to_the_mean_latency_for_every_stack() {
    for stack in [
        "base", "nosched", "atomic", "spin", "2q", "balance", "direct", "ramdisk", "raw",
    ] {
        let json = moneta(&[
            "sim",
            "run",
            "--stack",
            stack,
            "--op",
            "mixed",
            "--threads",
            "8",
            "--ops",
            "3000",
            "--format",
            "json",
        ]);
        assert!(
            json.status.success(),
            "{stack}: {}",
            String::from_utf8_lossy(&json.stderr)
        );
        let v = results(&json);
        let parts = v["breakdown_us"].as_object().expect("breakdown_us object");
        assert!(!parts.is_empty(), "{stack}");
        let sum: f64 = parts.values().map(|x| x.as_f64().unwrap()).sum();
        let mean = v["latency_us_mean"].as_f64().unwrap();
        assert!((sum - mean).abs() < 1e-6 * mean, "{stack}: {sum} vs {mean}");

        let table = moneta(&[
            "sim",
            "run",
            "--stack",
            stack,
            "--op",
            "read",
            "--threads",
            "1",
            "--ops",
            "500",
            "--breakdown",
        ]);
        assert!(table.status.success(), "{stack}");
        let text = stdout(&table);
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("where time goes"))
            .skip(2)
            .collect();
        let value = |l: &str| -> f64 {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols[cols.len() - 2].parse().unwrap()
        };
        let (total, components) = rows.split_last().expect("a total row");
        assert!(total.starts_with("total = mean latency"), "{stack}: {text}");
        let sum: f64 = components.iter().map(|l| value(l)).sum();
        // Each row is rounded to 0.01 µs.
        assert!(
            (sum - value(total)).abs() <= 0.006 * components.len() as f64,
            "{stack}: {text}"
        );
    }
}

/// The emulator's view of where time goes sums to its measured mean, and
/// the fairness run reports a breakdown per thread group.
#[test]
fn bench_and_fairness_report_where_time_goes() {
    let o = moneta(&[
        "bench",
        "--preset",
        "moneta-d",
        "--op",
        "read",
        "--size",
        "4096",
        "--threads",
        "1",
        "--qd",
        "1",
        "--ops",
        "2000",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = results(&o);
    let spans = v["breakdown_us"].as_object().expect("breakdown_us");
    assert!(spans["device: dma"].as_f64().unwrap() > 0.0);
    let sum: f64 = spans.values().map(|x| x.as_f64().unwrap()).sum();
    let mean = v["latency_us_mean"].as_f64().unwrap();
    assert!((sum - mean).abs() < 1e-6 * mean, "{sum} vs {mean}");

    let o = moneta(&["sim", "fairness", "--ops", "2000", "--format", "json"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = results(&o);
    for g in v["groups"].as_array().unwrap() {
        let sum: f64 = g["breakdown_us"]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .sum();
        let mean = g["latency_us_mean"].as_f64().unwrap();
        assert!((sum - mean).abs() < 1e-6 * mean, "{sum} vs {mean}");
    }
}

#[test]
fn compare_puts_stacks_side_by_side_with_a_bar_each() {
    let dir = std::env::temp_dir().join(format!("moneta-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("bars.svg");
    let html = dir.join("report.html");
    let o = moneta(&[
        "sim",
        "compare",
        "--preset",
        "moneta",
        "--stack",
        "base,nosched,atomic,spin,direct",
        "--op",
        "read",
        "--size",
        "4096",
        "--ops",
        "2000",
        "--plot",
        svg.to_str().unwrap(),
        "--report",
        html.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = stdout(&o);
    let header = text.lines().nth(1).unwrap();
    for stack in ["base", "nosched", "atomic", "spin", "direct"] {
        assert!(header.contains(stack), "{header}");
    }
    let totals: Vec<f64> = text
        .lines()
        .find(|l| l.starts_with("total = mean latency"))
        .unwrap()
        .split_whitespace()
        .skip(4)
        .map(|x| x.parse().unwrap())
        .collect();
    // SPEC §2.2: each optimization removes time; Moneta-D removes the most.
    assert_eq!(totals.len(), 5);
    assert!(totals.windows(2).all(|w| w[1] < w[0]), "{totals:?}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert_eq!(svg.matches("<g class=\"bar\">").count(), 5);
    let html = std::fs::read_to_string(&html).unwrap();
    assert!(html.contains("latency CDF") && html.contains("wake-up"));
    // JSON: one point per configuration, each with its breakdown.
    let o = moneta(&[
        "sim",
        "compare",
        "--preset",
        "moneta,onyx-late",
        "--stack",
        "spin",
        "--ops",
        "1000",
        "--format",
        "json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = results(&o);
    assert_eq!(v.as_array().unwrap().len(), 2);
    assert!(v[1]["breakdown_us"]["array"].as_f64().unwrap() > 0.0);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sizes_take_suffixes_and_plots_are_figures_in_existing_directories_only() {
    let o = moneta(&[
        "sim", "run", "--size", "4k", "--ops", "200", "--format", "json",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v = results(&o);
    assert_eq!(v["size_bytes"], 4096);
    let bad = moneta(&["sim", "run", "--size", "4GB", "--ops", "10"]);
    assert!(!bad.status.success());
    let dir = std::env::temp_dir().join(format!("moneta-cli-png-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sweep = |plot: &std::path::Path| {
        moneta(&[
            "sim",
            "sweep",
            "--op",
            "read",
            "--sizes",
            "512,1k",
            "--ops",
            "200",
            "--plot",
            plot.to_str().unwrap(),
        ])
    };
    let jpeg = dir.join("bw.jpg");
    let o = sweep(&jpeg);
    assert!(!o.status.success() && !jpeg.exists());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("bw.jpg") && err.contains("*.png"), "{err}");
    let nested = dir.join("not/there/bw.svg");
    let o = sweep(&nested);
    assert!(!o.status.success() && !dir.join("not").exists());
    let svg = dir.join("bw.svg");
    assert!(sweep(&svg).status.success() && svg.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--plot x.png` and `--plot x.pdf` render the figure (resvg, svg2pdf):
/// a PNG of the paper size at --dpi with the provenance in a tEXt chunk,
/// a one-page PDF of the paper size in points with the provenance in its
/// document information, and the SVG itself in inches.
#[test]
fn plots_are_png_and_pdf_too_at_a_paper_size() {
    let dir = std::env::temp_dir().join(format!("moneta-cli-paper-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sweep = |plot: &std::path::Path, extra: &[&str]| {
        let mut args = vec![
            "sim",
            "sweep",
            "--op",
            "read",
            "--sizes",
            "512,4k,64k",
            "--ops",
            "200",
            "--plot",
            plot.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = moneta(&args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        std::fs::read(plot).unwrap()
    };
    let png = sweep(&dir.join("bw.png"), &["--figure", "column", "--dpi", "200"]);
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let width = u32::from_be_bytes(png[16..20].try_into().unwrap());
    assert_eq!(width, 700, "3.5 in at 200 dpi");
    let text = String::from_utf8_lossy(&png);
    assert!(text.contains("tEXtSource\0moneta ") && text.contains("--figure column"));
    let pdf = sweep(&dir.join("bw.pdf"), &["--figure", "page"]);
    let text = String::from_utf8_lossy(&pdf);
    assert!(text.starts_with("%PDF-"), "{}", &text[..20]);
    assert!(text.contains("/MediaBox [0 0 504 "), "7 in is 504 pt");
    assert!(
        text.contains("/Subject (moneta "),
        "provenance in the document information"
    );
    assert!(text.contains("/FontFile"), "the text's font is embedded");
    let svg = String::from_utf8(sweep(&dir.join("bw.svg"), &["--figure", "column"])).unwrap();
    assert!(svg.contains(" width=\"3.500in\""), "{}", &svg[..200]);
    let o = moneta(&["sim", "run", "--ops", "10", "--font-pt", "40"]);
    assert_eq!(o.status.code(), Some(documented_exit_code("usage")));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ctrl_c_during_a_sweep_prints_the_points_so_far() {
    use std::io::Read;
    let dir = Scratch::new("partial");
    let (svg, html) = (dir.0.join("partial.svg"), dir.0.join("partial.html"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(["sim", "sweep", "--ops", "100000", "--plot"])
        .arg(&svg)
        .arg("--report")
        .arg(&html)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("moneta runs");
    std::thread::sleep(std::time::Duration::from_millis(2500));
    // SAFETY: signalling our own child by its id.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(
        status.code(),
        Some(documented_exit_code("interrupted")),
        "{err}"
    );
    assert!(err.contains("interrupted"), "{err}");
    assert!(
        out.contains("read        512"),
        "the first point is printed: {out}"
    );
    // The figure and the page of the points so far say they are partial,
    // in their titles.
    let done = out
        .lines()
        .filter(|l| {
            ["read ", "write ", "mixed "]
                .iter()
                .any(|op| l.starts_with(op))
        })
        .count();
    let title = format!("PARTIAL: {done} of 36 points");
    for f in [&svg, &html] {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(text.contains(&title), "{title}: {}", f.display());
    }
}

/// `moneta report`: every page, and the NVMM page with its figures (the
/// sweep's four panels and the wear curve, titles naming preset and
/// threads), the report's statements on them as crosses, the table of
/// their errors, the commands, and the statements table kept.
#[test]
fn report_writes_every_page_and_the_nvmm_figures() {
    let dir = Scratch::new("report");
    let out = dir.0.join("pages");
    let o = moneta(&["report", "--out", out.to_str().unwrap(), "--ops", "100"]);
    assert!(o.status.success(), "{}", stderr(&o));
    for page in ["index", "moneta", "moneta-d", "onyx", "quicksan", "nvmm"] {
        assert!(out.join(format!("{page}.html")).is_file(), "{page}");
    }
    let nvmm = std::fs::read_to_string(out.join("nvmm.html")).unwrap();
    assert_eq!(
        nvmm.matches("<svg").count(),
        5,
        "four sweep panels and wear"
    );
    for panel in [
        "GUPS, 1 thread",
        "GUPS, 8 threads",
        "MMAP, 1 thread",
        "MMAP, 8 threads",
    ] {
        let title = format!("{panel}: NVMM over DRAM + SSD (nvmm-mlc, seed 1; crosses: published)");
        assert!(nvmm.contains(&title), "{title}");
    }
    assert!(nvmm.contains("Usable flash capacity as it wears (nvmm-mlc"));
    for crosses in [
        "published no prefetch",
        "published prefetch 16 pages",
        "published one 8 Gb device",
        "published 1000 devices (1 TB)",
    ] {
        assert!(
            nvmm.contains(&format!("<title>{crosses}</title>")),
            "{crosses}"
        );
    }
    assert!(nvmm.contains("Published points on the figures"));
    assert!(nvmm.contains("moneta nvmm sim sweep --seed 1 --plot nvmm-sweep.svg"));
    assert!(nvmm.contains("moneta nvmm sim wear --seed 1 --plot nvmm-wear.svg"));
    assert!(nvmm.contains("wear: worn out / half retired"));
    // A chart without published points does not promise crosses.
    let moneta_d = std::fs::read_to_string(out.join("moneta-d.html")).unwrap();
    assert!(moneta_d.contains("Bandwidth vs request size (moneta-d, direct stack, 16 threads)<"));
    // Figs. 4.5-4.6 from the model, one series per completion, and their
    // checks tabled; the Moneta page's thread scaling.
    for title in [
        "Bandwidth by completion technique (moneta-d, 32 threads, 50/50 random)<",
        "Bandwidth per busy CPU by completion technique (moneta-d, 32 threads, 50/50 random)<",
    ] {
        assert!(moneta_d.contains(title), "{title}");
    }
    for series in ["dma", "forwarding", "issue-sleep"] {
        assert!(
            moneta_d.contains(&format!("<title>{series}</title>")),
            "{series}"
        );
    }
    assert!(moneta_d.contains("DMA / forwarding bandwidth, 512 B, 32 threads 50/50"));
    assert!(moneta_d.contains("4 KB write throughput through the FS"));
    let moneta_page = std::fs::read_to_string(out.join("moneta.html")).unwrap();
    assert!(moneta_page
        .contains("Random read bandwidth vs threads (moneta, 2q stack, 512 B and 4 KB)<"));
}

/// `nvmm sim sweep --plot` draws one panel per workload and thread count;
/// `nvmm sim wear --plot` the capacity curve; a bad plot name is refused
/// before the run.
#[test]
fn nvmm_sweep_and_wear_draw_their_figures() {
    let dir = Scratch::new("nvmm-plots");
    // Run `moneta nvmm sim ARGS --plot NAME`; the SVG it wrote.
    let draw = |args: &[&str], name: &str| -> String {
        let path = dir.0.join(name);
        let mut all = vec!["nvmm", "sim"];
        all.extend_from_slice(args);
        all.extend(["--plot", path.to_str().unwrap()]);
        let o = moneta(&all);
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::read_to_string(&path).unwrap()
    };
    let svg = draw(
        &["sweep", "--latencies", "75000,150000", "--threads", "1"],
        "sweep.svg",
    );
    assert_eq!(svg.matches("<svg").count(), 3, "a document and two panels");
    assert!(svg.contains("MMAP, 1 thread") && svg.contains("<title>published no prefetch</title>"));
    let svg = draw(&["wear", "--endurance-scale", "1000"], "wear.svg");
    assert!(svg.contains("<title>published one 8 Gb device</title>"));
    let gif = dir.0.join("wear.gif");
    let o = moneta(&["nvmm", "sim", "wear", "--plot", gif.to_str().unwrap()]);
    assert!(!o.status.success() && stderr(&o).contains("wear.gif"));
    assert!(stdout(&o).is_empty(), "refused before the run");
}

#[test]
fn queue_depth_is_asynchronous_io_on_moneta_d_and_refused_elsewhere() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "sim", "run", "--preset", "moneta-d", "--size", "4k", "--op", "read", "--ops", "4000",
        ];
        args.extend_from_slice(extra);
        moneta(&args)
    };
    let sync = run(&["--threads", "1", "--format", "json"]);
    let deep = run(&["--threads", "1", "--queue-depth", "16", "--format", "json"]);
    assert!(
        sync.status.success() && deep.status.success(),
        "{}",
        stderr(&deep)
    );
    let field = |o: &Output, key: &str| -> f64 {
        let v = results(o);
        v[key].as_f64().unwrap_or_else(|| panic!("{key} in {v}"))
    };
    assert_eq!(field(&sync, "queue_depth"), 1.0);
    assert_eq!(field(&deep, "queue_depth"), 16.0);
    assert!(
        field(&deep, "bandwidth_mb_per_s") > 2.0 * field(&sync, "bandwidth_mb_per_s"),
        "16 requests in flight beat one"
    );
    let table = run(&["--threads", "2", "--queue-depth", "4"]);
    assert!(
        stdout(&table).contains("queue depth 4 per thread"),
        "{}",
        stdout(&table)
    );
    for (extra, says) in [
        (&["--queue-depth", "0"][..], "queue depth 0"),
        (&["--queue-depth", "65"][..], "queue depth 65"),
        (
            &["--queue-depth", "4", "--stack", "spin"][..],
            "asynchronous IO",
        ),
        (&["--queue-depth", "4", "--threads", "9"][..], "cores"),
        (&["--threads", "4000000000"][..], "requesters"),
        (
            &[
                "--threads",
                "2000",
                "--queue-depth",
                "64",
                "--stack",
                "direct",
            ][..],
            "requesters",
        ),
    ] {
        let o = run(extra);
        assert!(!o.status.success(), "{extra:?} must be refused");
        assert!(stderr(&o).contains(says), "{extra:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
    }
}

#[test]
fn unknown_names_suggest_the_nearest_and_a_missing_san_is_an_error() {
    for (args, says) in [
        (
            &["sim", "run", "--preset", "Moneta"][..],
            "did you mean 'moneta'?",
        ),
        (
            &["sim", "run", "--stack", "Spin"][..],
            "did you mean 'spin'?",
        ),
        (&["sim", "run", "--op", "reed"][..], "did you mean 'read'?"),
        (&["sim", "run", "--tech", "Pcm"][..], "did you mean 'pcm'?"),
    ] {
        let o = moneta(args);
        assert!(!o.status.success(), "{args:?}");
        assert!(stderr(&o).contains(says), "{args:?}: {}", stderr(&o));
    }
    let o = moneta(&["sim", "run", "--preset", "zzzz"]);
    assert!(!stderr(&o).contains("did you mean"), "{}", stderr(&o));
    let o = moneta(&["san", "status", "--name", "nosan0"]);
    assert!(
        !o.status.success(),
        "a SAN that does not exist is not 'down'"
    );
    assert!(
        stderr(&o).contains("no SAN named 'nosan0'"),
        "{}",
        stderr(&o)
    );
}

/// `sim sweep` with lists of presets, threads and queue depths: every
/// combination runs, the table says which row is which, and the figure
/// draws one series per operation and combination on one chart.
#[test]
fn sweeps_of_several_presets_and_thread_counts_overlay_them() {
    let dir = Scratch::new("overlay");
    let svg = dir.0.join("overlay.svg");
    let o = moneta(&[
        "sim",
        "sweep",
        "--preset",
        "moneta,onyx-late",
        "--threads",
        "1,4",
        "--op",
        "read",
        "--sizes",
        "512,4k",
        "--ops",
        "400",
        "--format",
        "json",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let points = results(&o);
    let points = points.as_array().unwrap();
    assert_eq!(points.len(), 2 * 2 * 2);
    let mut seen: Vec<(String, u64)> = points
        .iter()
        .map(|p| {
            (
                p["preset"].as_str().unwrap().to_string(),
                p["threads"].as_u64().unwrap(),
            )
        })
        .collect();
    seen.dedup();
    assert_eq!(seen.len(), 4, "{seen:?}");
    let text = std::fs::read_to_string(&svg).unwrap();
    for name in [
        "read, moneta, 2q, 1 thread",
        "read, moneta, 2q, 4 threads",
        "read, onyx-late, spin, 1 thread",
        "read, onyx-late, spin, 4 threads",
    ] {
        assert!(text.contains(&format!("<title>{name}</title>")), "{name}");
    }
    assert!(
        !text.contains("()") && !text.contains("(;"),
        "a title with nothing in its parentheses"
    );
    // The table names each row's preset and threads.
    let table = moneta(&[
        "sim",
        "sweep",
        "--preset",
        "moneta,onyx-late",
        "--qd",
        "1,4",
        "--stack",
        "direct",
        "--threads",
        "4",
        "--op",
        "read",
        "--sizes",
        "4k",
        "--ops",
        "400",
    ]);
    assert!(table.status.success(), "{}", stderr(&table));
    let t = stdout(&table);
    assert!(
        t.contains("moneta, QD4") && t.contains("onyx-late, QD1"),
        "{t}"
    );
    // One depth where only one is meant.
    let one = moneta(&["sim", "run", "--qd", "1,4"]);
    assert_eq!(one.status.code(), Some(2));
    assert!(stderr(&one).contains("lists are for `sim sweep`"));
}
