//! One core, two faces (issue 24; STYLE 10 "same test, two backends"): one
//! access trace runs through libnvmm's real face (loads and stores on the
//! mapped region, faults delivered by the kernel through userfaultfd, a log
//! file) and through its model face ([`nvmm::Replay`]: the same cache
//! policy, page table, log and flash timing driven by the trace, no
//! memory). Both run the NVMM model's flash (`ModelTiming`, preset
//! nvmm-slc) on a virtual clock, so a miss waits exactly its modeled time.
//! Both faces run the miss path the simulator's controller runs too
//! (`moneta_model::nvmm::miss_path`). The page table (every entry:
//! mapping, chain, valid bits, time, status), the cache's contents (which
//! blocks are resident), the counters (misses, write-protect faults,
//! write-backs, evictions, syncs) and the charged time (flash time of
//! misses, and the clock) must be equal to the nanosecond.
//! `controller_vs_library.rs` compares libnvmm with the controller itself.

use moneta_model::kernel::VirtualClock;
use nvmm::testkit::{fast_dir, seed_from_env, Rng, TempPath};
use nvmm::{ModelTiming, Nvmm, Options, Replay, Stats};
use std::sync::Arc;

const REGION: u64 = 4 << 20;

fn options() -> Options {
    let mut o = Options::new(256 << 10); // 32 blocks, 8 sets of 4 ways
    o.ways = 4;
    o.timing = Box::new(ModelTiming::preset("nvmm-slc").unwrap());
    o.clock = Some(Arc::new(VirtualClock::new()));
    // The collector thread runs on the wall clock's schedule; GC still
    // runs (in both faces alike) when the version area is full.
    o.background_gc = false;
    o
}

/// What both faces must agree on (the handler's own time is the wall
/// clock's in the real face, so it is left out).
fn comparable(s: Stats) -> [u64; 8] {
    [
        s.misses,
        s.miss_modeled_ns,
        s.write_protect_faults,
        s.write_backs,
        s.evictions,
        s.syncs,
        s.resident_blocks,
        s.versions_used,
    ]
}

#[test]
fn one_trace_two_faces_same_state_and_time() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed} (NVMM_TEST_SEED reproduces)");
    let mut rng = Rng::new(seed);
    // (offset, write) with a sync every 2000 accesses; a hot quarter of
    // the region takes half the accesses, so there are hits too.
    let trace: Vec<Option<(u64, bool)>> = (0..12_000u64)
        .map(|i| {
            if i % 2000 == 1999 {
                return None;
            }
            let span = if rng.below(2) == 0 {
                REGION / 4
            } else {
                REGION
            };
            Some((rng.below(span / 8) * 8, rng.below(3) == 0))
        })
        .collect();

    let real_file = TempPath::new(fast_dir(), "twin-real");
    let model_file = TempPath::new(fast_dir(), "twin-model");
    let real = Nvmm::open_with(real_file.path(), REGION, options()).unwrap();
    let model = Replay::open(model_file.path(), REGION, options()).unwrap();
    let base = real.as_ptr();
    for (i, step) in trace.iter().enumerate() {
        match *step {
            None => {
                let (a, b) = (real.sync().unwrap(), model.sync().unwrap());
                assert_eq!(a, b, "seed {seed}: token at step {i}");
            }
            Some((offset, write)) => {
                // SAFETY: offset + 8 lies inside the region; the handler
                // thread serves the fault this may raise.
                unsafe {
                    let p = base.add(offset as usize).cast::<u64>();
                    if write {
                        p.write_volatile(i as u64);
                    } else {
                        std::hint::black_box(p.read_volatile());
                    }
                }
                // The handler finishes a fault (its bookkeeping after
                // UFFDIO_COPY has woken this thread) under the region lock;
                // taking the lock here orders that before the next access,
                // as in the replay.
                let _ = real.stats();
                model.access(offset, write).unwrap();
            }
        }
        if i % 1000 == 999 {
            assert_eq!(
                comparable(real.stats()),
                comparable(model.stats()),
                "seed {seed}: counters after step {i}"
            );
            assert_eq!(
                real.resident_blocks().unwrap(),
                model.resident_blocks().unwrap(),
                "seed {seed}: cache contents after step {i}"
            );
        }
    }
    let (r, m) = (real.stats(), model.stats());
    println!("real:  {r:?}\nmodel: {m:?}");
    assert_eq!(comparable(r), comparable(m), "seed {seed}: counters");
    assert_eq!(
        real.resident_blocks().unwrap(),
        model.resident_blocks().unwrap(),
        "seed {seed}: cache contents"
    );
    assert!(
        r.misses > 1000 && r.write_backs > 500 && r.write_protect_faults > 100,
        "{r:?}"
    );
    assert!(
        r.miss_modeled_ns >= r.misses * 40_000,
        "SLC reads are charged: {r:?}"
    );
    assert_eq!(
        real.clock_ns(),
        model.clock_ns(),
        "seed {seed}: charged time"
    );
    let (rt, mt) = (
        real.table_entries().unwrap(),
        model.table_entries().unwrap(),
    );
    assert_eq!(rt.len(), mt.len(), "seed {seed}: table sizes");
    assert!(rt == mt, "seed {seed}: page tables differ");
    println!(
        "{} table entries equal; charged {} ns of flash time in both faces",
        rt.len(),
        real.clock_ns()
    );
}
