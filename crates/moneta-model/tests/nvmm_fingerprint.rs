//! Every NVMM mechanism's output for fixed seeds, as one string: runs of
//! each system over GUPS, MMAP and sequential at SLC and MLC with and
//! without prefetch, a garbage-collection-heavy run and the wear estimate.
//! Issue 24 moved the page table's codec and version chains into one place
//! shared with libnvmm; this test pins that the simulator's numbers did not
//! move (the fingerprint was taken before the change). Issue 23's fourth
//! pass rewrote it on purpose: flash commands interrupt return data
//! (`flash.command_priority = "interrupt"`); with `"gaps"` the old
//! fingerprint is reproduced byte for byte.

use moneta_model::nvmm::experiments::{standard_workload, wear};
use moneta_model::nvmm::system::{run, SystemKind};
use moneta_model::nvmm::workload::WorkloadKind;
use moneta_model::nvmm::NvmmConfig;

fn fingerprint() -> String {
    let mut out = String::new();
    for preset in ["nvmm-slc", "nvmm-mlc"] {
        for prefetch in [0, 16] {
            for kind in [
                WorkloadKind::Gups,
                WorkloadKind::Mmap,
                WorkloadKind::Sequential,
            ] {
                let mut c = NvmmConfig::preset(preset).unwrap();
                c.controller.prefetch_pages = prefetch;
                let w = standard_workload(&c, kind, 2, Some(4000), 2.0).unwrap();
                for system in [SystemKind::Nvmm, SystemKind::Ssd, SystemKind::AllDram] {
                    let r = run(&c, system, &w, 11).unwrap();
                    out += &format!("{preset} {prefetch} {kind:?} {system:?}: {r:?}\n");
                }
            }
        }
    }
    // One previous version per page: the upper table fills and the longest
    // chains are consolidated (the shared victim order).
    let mut c = NvmmConfig::preset("nvmm-slc").unwrap();
    c.journal.versions_per_page = 1;
    let w = standard_workload(&c, WorkloadKind::Gups, 4, Some(30_000), 1.2).unwrap();
    let r = run(&c, SystemKind::Nvmm, &w, 5).unwrap();
    out += &format!("reclaim: {r:?}\n");
    let mut c = NvmmConfig::preset("nvmm-mlc").unwrap();
    c.flash.blocks_per_plane = 8;
    let r = wear(&c, 50e6, 0.25, 100, 3).unwrap();
    out += &format!("wear: {r:?}\n");
    out
}

#[test]
fn simulator_output_is_unchanged() {
    let got = fingerprint();
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/golden/nvmm_fingerprint.txt"
    );
    if std::env::var_os("NVMM_FINGERPRINT_WRITE").is_some() {
        std::fs::write(path, &got).unwrap();
    }
    let want = std::fs::read_to_string(path).unwrap();
    assert!(
        got == want,
        "NVMM simulator output changed; diff against {path}"
    );
}
