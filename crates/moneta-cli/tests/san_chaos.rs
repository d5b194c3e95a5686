//! `moneta san chaos` (issue 22 item 6): a short randomized fault schedule
//! against a mirrored SAN of three nodes, with the register checker on every
//! read; the long run is `make san-chaos`. Needs root (CI has it). The
//! seed is printed (MONETA_SEED replays its schedule).

mod common;

use std::process::Output;

fn moneta(args: &[&str]) -> Output {
    common::moneta().args(args).output().expect("moneta runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The run's SAN is removed even if the chaos command itself dies.
struct Down(String);

impl Drop for Down {
    fn drop(&mut self) {
        let _ = moneta(&["san", "down", "--purge", "--name", &self.0]);
    }
}

#[test]
fn bad_arguments_are_errors_not_panics() {
    let cases: [(&[&str], &str); 7] = [
        (&["--nodes", "2"], "--nodes 2: 3 to 5"),
        (&["--nodes", "6"], "--nodes 6: 3 to 5"),
        (&["--clients", "0"], "--clients 0"),
        (&["--duration-s", "0"], "--duration-s 0"),
        (&["--size", "3M"], "power of two"),
        (&["--step-ms", "10"], "--step-ms 10"),
        (&["--blocks-per-slice", "0"], "--blocks-per-slice 0"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["san", "chaos", "--name", "chaosbad"];
        args.extend_from_slice(extra);
        let o = moneta(&args);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
        assert!(
            err.contains(needle),
            "{extra:?}: expected '{needle}' in {err}"
        );
    }
    let o = moneta(&["san", "chaos", "--name", "Bad_Name"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("a-z and 0-9"), "{err}");
}

/// About 40 s of schedule (kill -9, restart, partitions, lossy links,
/// resolve) with three client threads; any stale, lost or mixed read, or a
/// block that no node serves after recovery, fails the test.
#[test]
fn a_short_chaos_run_finds_no_stale_or_mixed_read() {
    if !moneta_testkit::require_root("network namespaces for the SAN") {
        return;
    }
    let seed = moneta_model::kernel::rng::seed_from_env("MONETA_SEED").to_string();
    let name = format!("ch{}", std::process::id() % 100_000);
    let _down = Down(name.clone());
    let o = moneta(&[
        "san",
        "chaos",
        "--name",
        &name,
        "--seed",
        &seed,
        "--duration-s",
        "40",
        "--step-ms",
        "1500",
        "--clients-on",
        CLIENTS_ON,
        "--json",
    ]);
    let out = text(&o.stdout);
    let err = text(&o.stderr);
    let s: serde_json::Value = serde_json::from_str::<serde_json::Value>(&out)
        .unwrap_or_else(|e| panic!("no summary ({e}), seed {seed}: {out}\n{err}"))["results"]
        .clone();
    eprintln!("{out}");
    assert_eq!(
        s["failures"],
        serde_json::json!({}),
        "seed {seed} (MONETA_SEED={seed} replays the schedule): {}",
        s["failures_reported"]
    );
    assert!(o.status.success(), "seed {seed}: {}\n{err}", s["verdict"]);
    assert_eq!(
        s["final_errors"], 0,
        "seed {seed}: {}",
        s["final_error_examples"]
    );
    assert!(s["reads_checked"].as_u64().unwrap() > 100, "{s:#}");
    assert!(s["writes_ok"].as_u64().unwrap() > 50, "{s:#}");
    let steps: u64 = s["nemesis"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "skipped")
        .map(|(_, n)| n.as_u64().unwrap())
        .sum();
    assert!(steps >= 10, "the nemesis hardly acted: {s:#}");
    assert_eq!(s["final_reads"], 3 * s["blocks"].as_u64().unwrap(), "{s:#}");
}

const CLIENTS_ON: &str = "majority";
