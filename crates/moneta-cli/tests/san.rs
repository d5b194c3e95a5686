//! End-to-end tests of `moneta san sim …` (the QuickSAN experiments, SPEC
//! §4.4): every command in its three output forms, same seed same output,
//! clear errors for bad input, plot and report files.

mod common;

use common::{moneta, ok};
use std::process::Output;

fn run(args: &[&str]) -> Output {
    moneta().args(args).output().expect("moneta runs")
}

/// Each command in a quick form.
fn quick(command: &str) -> Vec<&'static str> {
    let mut a = vec!["san", "sim"];
    match command {
        "latency" => a.extend(["latency", "--ops", "50"]),
        "bandwidth" => a.extend(["bandwidth", "--ops", "400", "--sizes", "512,65536"]),
        "scaling" => a.extend(["scaling", "--ops", "400", "--nodes", "2,4"]),
        "replication" => a.extend(["replication", "--ops", "400", "--op", "read,write"]),
        "sort" => a.extend([
            "sort",
            "--scale",
            "0.0002",
            "--partition-ns",
            "100",
            "--sort-ns",
            "300",
        ]),
        "energy" => a.extend(["energy", "--ops", "400"]),
        other => panic!("no command {other}"),
    }
    a
}

const COMMANDS: [&str; 6] = [
    "latency",
    "bandwidth",
    "scaling",
    "replication",
    "sort",
    "energy",
];

#[test]
fn every_command_prints_json_csv_and_a_table_from_the_same_rows() {
    for c in COMMANDS {
        let args = quick(c);
        let json = ok(run(&[&args[..], &["--format", "json"]].concat()), c);
        let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(doc["provenance"]["seed"].is_u64(), "{c}: {doc}");
        let rows = doc["results"].as_array().expect("an array of rows");
        assert!(!rows.is_empty(), "{c}");
        let csv = ok(run(&[&args[..], &["--format", "csv"]].concat()), c);
        assert!(csv.starts_with("# moneta "), "{c}: provenance line: {csv}");
        assert_eq!(
            csv.lines().count(),
            rows.len() + 2,
            "{c}: provenance, header + rows"
        );
        let table = ok(run(&args), c);
        assert!(table.lines().count() >= rows.len() + 2, "{c}: {table}");
    }
}

#[test]
fn latency_rows_cover_interfaces_localities_and_ops_with_their_breakdown() {
    let json = ok(
        run(&[&quick("latency")[..], &["--format", "json"]].concat()),
        "latency",
    );
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rows = doc["results"].as_array().expect("rows");
    assert_eq!(rows.len(), 4 * 2 * 2);
    for r in rows {
        let mean = r["latency_us_mean"].as_f64().unwrap();
        let sum: f64 = r["breakdown_us"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_f64().unwrap())
            .sum();
        assert!((sum - mean).abs() < 1e-6 * mean, "{r}");
        assert_eq!(r["size_bytes"], 4096);
        for key in ["interface", "locality", "op"] {
            assert!(r[key].is_string(), "{key} in {r}");
        }
    }
    let iscsi = rows.iter().find(|r| r["interface"] == "iscsi").unwrap();
    let direct = rows
        .iter()
        .find(|r| r["interface"] == "quicksan-d")
        .unwrap();
    assert!(iscsi["latency_us_mean"].as_f64() > direct["latency_us_mean"].as_f64());
}

#[test]
fn same_seed_same_output_other_seed_other_output() {
    let args = quick("bandwidth");
    let with_seed = |s: &str| {
        let json = ok(
            run(&[&args[..], &["--format", "json", "--seed", s]].concat()),
            "bandwidth",
        );
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["results"].clone()
    };
    assert_eq!(with_seed("5"), with_seed("5"));
    assert_ne!(with_seed("5"), with_seed("6"));
}

#[test]
fn bad_input_is_a_clear_error_listing_what_is_allowed() {
    for (args, needle) in [
        (
            vec!["san", "sim", "latency", "--interfaces", "nfs"],
            "quicksan-d",
        ),
        (vec!["san", "sim", "latency", "--nodes", "0"], "--nodes"),
        (vec!["san", "sim", "latency", "--size", "0"], "--size"),
        (
            vec!["san", "sim", "bandwidth", "--topology", "ring"],
            "centralized",
        ),
        (vec!["san", "sim", "bandwidth", "--op", "erase"], "mixed"),
        (
            vec!["san", "sim", "bandwidth", "--sizes", "4k,4GB"],
            "--sizes",
        ),
        (vec!["san", "sim", "scaling", "--nodes", "2,0"], "--nodes"),
        (
            vec!["san", "sim", "scaling", "--interface", "scsi"],
            "fibre-channel",
        ),
        (vec!["san", "sim", "energy", "--threads", "0"], "--threads"),
        (vec!["san", "sim", "sort", "--scale", "2"], "--scale"),
        (
            vec!["san", "sim", "latency", "--preset", "nope"],
            "unknown preset",
        ),
    ] {
        let o = run(&args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn plot_and_report_are_written() {
    let dir = std::env::temp_dir().join(format!("moneta-san-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for c in ["latency", "scaling"] {
        let svg = dir.join(format!("{c}.svg"));
        let html = dir.join(format!("{c}.html"));
        let args = quick(c);
        ok(
            run(&[
                &args[..],
                &[
                    "--plot",
                    svg.to_str().unwrap(),
                    "--report",
                    html.to_str().unwrap(),
                ],
            ]
            .concat()),
            c,
        );
        assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
        assert!(std::fs::read_to_string(&html).unwrap().contains("<table"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
