//! The simulator's hybrid controller (`moneta_model::nvmm::controller`)
//! and libnvmm's miss path (`region.rs`, here its model face
//! [`nvmm::Replay`]) fed one trace (issue 24, "one core, two faces").
//!
//! Both run one miss path (`moneta_model::nvmm::miss_path`: the LRU victim
//! of a full set written back if dirty and dropped, then the fill) on one
//! cache (`BlockCache`), page-table code and flash timing. What still
//! differs is pinned here by the smallest trace that shows it:
//!
//! 1. what each face sees: the controller sees every access (a hit moves
//!    its block to most recently used); libnvmm sees only misses and first
//!    stores (userfaultfd delivers no hits), so its order is by fill and
//!    first store;
//! 2. storage: the controller's journal writes each write-back as a new
//!    version of the page, packed into physical flash blocks; libnvmm's
//!    log gives a version a block of its own and writes a segment written
//!    back again before the next sync into its next position there;
//! 3. prefetch: the controller installs prefetched blocks at once (ready
//!    when their reads complete); libnvmm holds them in buffers and
//!    installs them when their reads have completed.
//!
//! With the same inputs (no access libnvmm cannot see, no prefetch) the two
//! make the same cache decisions access for access: the last test.

use moneta_model::kernel::VirtualClock;
use moneta_model::nvmm::controller::HybridController;
use moneta_model::nvmm::workload::{Access, AccessKind};
use moneta_model::nvmm::NvmmConfig;
use nvmm::testkit::{fast_dir, seed_from_env, Rng, TempPath};
use nvmm::{ModelTiming, Options, Replay, FLASH_PAGE_BYTES};
use std::sync::Arc;

const REGION: u64 = 4 << 20;
const BLOCK: u64 = FLASH_PAGE_BYTES as u64;

/// The simulator's controller on nvmm-slc with a cache of `sets` sets of
/// `ways` 8 KB blocks.
fn controller(sets: u64, ways: u32, prefetch: u32) -> HybridController {
    let mut c = NvmmConfig::preset("nvmm-slc").unwrap();
    c.dram.capacity_bytes = sets * u64::from(ways) * BLOCK;
    c.controller.ways = ways;
    c.controller.prefetch_pages = prefetch;
    HybridController::new(&c, REGION, 1).unwrap()
}

/// libnvmm's model face with the same cache geometry, flash and a virtual
/// clock.
fn library(path: &TempPath, sets: u64, ways: usize, prefetch: usize) -> Replay {
    let mut o = Options::new(sets * ways as u64 * BLOCK);
    o.ways = ways;
    o.prefetch_blocks = prefetch;
    o.timing = Box::new(ModelTiming::preset("nvmm-slc").unwrap());
    o.clock = Some(Arc::new(VirtualClock::new()));
    o.background_gc = false;
    Replay::open(path.path(), REGION, o).unwrap()
}

/// One trace of (block, write) through both, the controller's accesses one
/// after another in virtual time.
struct Both {
    model: HybridController,
    lib: Replay,
    now_ns: u64,
    _file: TempPath,
}

impl Both {
    fn new(sets: u64, model_ways: u32, lib_ways: usize, prefetch: u32) -> Both {
        let file = TempPath::new(fast_dir(), "controller-vs-library");
        Both {
            model: controller(sets, model_ways, prefetch),
            lib: library(&file, sets, lib_ways, prefetch as usize),
            now_ns: 0,
            _file: file,
        }
    }

    fn access(&mut self, block: u64, write: bool) {
        let kind = if write {
            AccessKind::Write
        } else {
            AccessKind::Read
        };
        let addr = block * BLOCK;
        self.now_ns = self
            .model
            .access(self.now_ns, Access { addr, kind })
            .unwrap()
            + 1_000;
        self.lib.access(addr, write).unwrap();
    }

    fn reads(&mut self, blocks: impl IntoIterator<Item = u64>) {
        for b in blocks {
            self.access(b, false);
        }
    }

    fn resident(&self) -> (Vec<u64>, Vec<u64>) {
        (
            self.model.resident_blocks(),
            self.lib.resident_blocks().unwrap(),
        )
    }
}

#[test]
fn both_fill_every_way_and_evict_the_lru_block_on_demand() {
    let mut t = Both::new(1, 4, 4, 0);
    t.reads(0..4);
    let (model, lib) = t.resident();
    assert_eq!(model, vec![0, 1, 2, 3]);
    assert_eq!(lib, model, "no way is kept free");
    t.reads([4]);
    let (model, lib) = t.resident();
    assert_eq!(model, vec![1, 2, 3, 4], "the oldest, 0, was the victim");
    assert_eq!(lib, model);
    assert_eq!(t.lib.stats().evictions, 1);
}

#[test]
fn hits_reorder_the_controllers_set_libnvmm_never_sees_them() {
    let mut t = Both::new(1, 4, 4, 0);
    t.reads([0, 1, 2, 3, 0, 4]);
    let (model, lib) = t.resident();
    assert_eq!(
        model,
        vec![0, 2, 3, 4],
        "LRU: the hit on 0 made 1 the victim"
    );
    assert_eq!(lib, vec![1, 2, 3, 4], "fill order: 0 was the oldest fill");
    assert_eq!(t.model.stats().hits, 1);
    assert_eq!(t.lib.stats().misses, 5);
}

#[test]
fn the_controller_writes_a_version_per_write_back_libnvmm_one_per_sync() {
    let mut t = Both::new(1, 4, 4, 0);
    // Block 0 (segment 0 of page 0) dirtied and evicted twice.
    for round in 0..2u64 {
        t.access(0, true);
        t.reads(1 + 8 * round..=8 + 8 * round);
    }
    assert_eq!(t.model.stats().write_backs, 2);
    assert_eq!(t.lib.stats().write_backs, 2);
    assert_eq!(
        t.model.chain_length(0),
        3,
        "the preloaded version and one per write-back"
    );
    let lib_entries = t.lib.table_entries().unwrap();
    let head = lib_entries.iter().find(|(i, _)| *i == 0).unwrap().1;
    assert_eq!(t.lib.stats().versions_used, 0, "page 0 has one version");
    assert_eq!(
        head.valid,
        1 << 8,
        "the second write-back took position 1 of the same block"
    );
}

#[test]
fn the_controller_installs_prefetches_at_once_libnvmm_when_they_arrive() {
    let mut t = Both::new(1, 8, 8, 2);
    t.reads([0]);
    let (model, lib) = t.resident();
    assert_eq!(model, vec![0, 1, 2]);
    assert_eq!(lib, vec![0]);
    assert_eq!(t.lib.stats().prefetch_issued, 2);
    t.reads([1]);
    assert_eq!(
        t.model.stats().hits,
        1,
        "1 was installed, its fill in flight"
    );
    assert_eq!(
        (t.lib.stats().misses, t.lib.stats().prefetch_used),
        (2, 1),
        "1 was in a buffer: a fault, served by the prefetch"
    );
}

#[test]
fn with_the_same_inputs_they_decide_alike() {
    // A random trace without the accesses libnvmm cannot see (a load of a
    // resident block, a store to a dirty one) and without prefetch: the
    // two caches agree access for access.
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed} (NVMM_TEST_SEED reproduces)");
    let mut rng = Rng::new(seed);
    let mut t = Both::new(4, 4, 4, 0);
    let mut dirty = std::collections::HashSet::new();
    let mut steps = 0;
    while steps < 4_000 {
        let (block, write) = (rng.below(64), rng.below(3) == 0);
        let resident = t.model.resident_blocks();
        if resident.contains(&block) && (!write || dirty.contains(&block)) {
            continue; // a hit only the controller would see
        }
        t.access(block, write);
        steps += 1;
        if write {
            dirty.insert(block);
        }
        let (model, lib) = t.resident();
        assert_eq!(
            model, lib,
            "seed {seed}: resident blocks after step {steps}"
        );
        dirty.retain(|b| model.contains(b));
    }
    let (m, l) = (t.model.stats(), t.lib.stats());
    assert_eq!(m.misses, l.misses, "seed {seed}");
    assert_eq!(m.write_backs, l.write_backs, "seed {seed}");
    assert!(m.write_backs > 100, "{m:?}");
    println!(
        "{} misses and {} write-backs in both",
        m.misses, m.write_backs
    );
}
