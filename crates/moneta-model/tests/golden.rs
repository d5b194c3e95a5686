//! Golden outputs: the key figures of small runs of every host stack
//! (Stack::ALL on the 2011 array), the Onyx presets and an over-subscribed
//! Moneta-D permission table, for three seeds, pinned to the last digit.
//!
//! A refactor that must not change behaviour keeps this file's numbers; one
//! that does change them rewrites `tests/golden/runs.txt` in its own commit
//! whose message says which lines changed and why. Regenerate with
//! `MONETA_GOLDEN_UPDATE=1 cargo test --release -p moneta-model --test golden`.

use moneta_model::config::{Config, Stack};
use moneta_model::experiment::run;
use moneta_model::workload::{OpMix, RunLimit, Workload};

const GOLDEN: &str = "tests/golden/runs.txt";
const SEEDS: [u64; 3] = [1, 2, 3];

/// (case name, configuration) of every pinned run.
fn cases() -> Vec<(String, Config)> {
    let mut cases = Vec::new();
    for stack in Stack::ALL {
        let mut c = Config::preset("moneta").unwrap();
        c.set_stack(stack);
        cases.push((format!("moneta/{}", stack.name()), c));
    }
    for preset in ["onyx-late", "onyx-early"] {
        cases.push((preset.to_string(), Config::preset(preset).unwrap()));
    }
    // Moneta-D with a fragmented file and a table too small for it: soft
    // misses, merging and hard misses all happen.
    let mut c = Config::preset("moneta-d").unwrap();
    c.direct.file_extents = 4096;
    c.direct.permission_records = 1024;
    c.direct.adjacent_fraction = 0.5;
    cases.push(("moneta-d/4096-extents-1024-records".to_string(), c));
    cases
}

fn line(name: &str, seed: u64, c: &Config) -> String {
    let w = Workload::xdd(
        OpMix::Mixed(0.5),
        4096,
        8,
        1 << 30,
        RunLimit::Ops(3000),
        seed,
    );
    let r = run(c, &w).unwrap();
    format!(
        "{name} seed={seed} elapsed_ns={} ops={} latency_mean_bits={:#018x} events={} soft_misses={} hard_misses={}",
        r.elapsed_ns,
        r.ops,
        r.latency.mean_ns().to_bits(),
        r.events,
        r.soft_misses,
        r.hard_misses
    )
}

#[test]
fn runs_match_the_golden_file() {
    let mut lines = Vec::new();
    for (name, c) in cases() {
        for seed in SEEDS {
            lines.push(line(&name, seed, &c));
        }
    }
    let actual = lines.join("\n") + "\n";
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    if std::env::var_os("MONETA_GOLDEN_UPDATE").is_some() {
        std::fs::write(&path, &actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap();
    let mut differ = Vec::new();
    for (e, a) in expected.lines().zip(actual.lines()) {
        if e != a {
            differ.push(format!("- {e}\n+ {a}"));
        }
    }
    assert_eq!(
        expected.lines().count(),
        actual.lines().count(),
        "number of golden lines"
    );
    assert!(
        differ.is_empty(),
        "golden runs changed:\n{}",
        differ.join("\n")
    );
}
