//! libnvmm end to end on real userfaultfd faults and a real backing file
//! (SPEC §7): reads and writes across eviction under random access, sync and
//! rollback, alloc / delete / setperms / temporary pages, reopen after a
//! clean close, and garbage collection discarding the oldest tokens first.

use nvmm::entry::status;
use nvmm::testkit::{fast_dir, seed_from_env, Rng, TempPath};
use nvmm::{perms, ErrorKind, Nvmm, Options, PAGE_BYTES};
use std::process::Command;

const MB: u64 = 1 << 20;

fn small(dram: u64, ways: usize) -> Options {
    let mut o = Options::new(dram);
    o.ways = ways;
    o
}

fn contents(n: &Nvmm) -> Vec<u8> {
    let mut v = vec![0u8; n.len() as usize];
    n.read(0, &mut v).unwrap();
    v
}

#[test]
fn random_reads_and_writes_survive_eviction() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed} (NVMM_TEST_SEED reproduces)");
    let mut rng = Rng::new(seed);
    let file = TempPath::new(fast_dir(), "evict");
    for prefetch in [0, 4] {
        let mut o = small(256 << 10, 4); // 32 blocks in 8 sets
        o.prefetch_blocks = prefetch;
        let n = Nvmm::open_with(file.path(), 4 * MB, o).unwrap();
        let mut shadow = contents(&n);
        for op in 0..30_000u64 {
            let off = rng.below(n.len() / 8) * 8;
            if rng.below(2) == 0 {
                let v = rng.next_u64().to_le_bytes();
                n.write(off, &v).unwrap();
                shadow[off as usize..off as usize + 8].copy_from_slice(&v);
            } else {
                let mut got = [0u8; 8];
                n.read(off, &mut got).unwrap();
                assert_eq!(
                    got,
                    shadow[off as usize..off as usize + 8],
                    "seed {seed} prefetch {prefetch}: op {op} read at {off}"
                );
            }
        }
        assert_eq!(contents(&n), shadow, "seed {seed}: whole region");
        let s = n.stats();
        println!("prefetch {prefetch}: {s:?}");
        assert!(s.resident_blocks <= s.capacity_blocks);
        assert!(s.evictions > 1000 && s.write_backs > 1000, "{s:?}");
        if prefetch > 0 {
            assert!(s.prefetch_issued > 0, "{s:?}");
        }
        n.close().unwrap();
        let n = Nvmm::open_with(file.path(), 0, small(256 << 10, 4)).unwrap();
        assert_eq!(contents(&n), shadow, "seed {seed}: after reopen");
        n.close().unwrap();
    }
}

#[test]
fn rollback_restores_each_synced_state() {
    let file = TempPath::new(fast_dir(), "rollback");
    let n = Nvmm::open_with(file.path(), 2 * MB, small(128 << 10, 0)).unwrap();
    assert_eq!(n.last_token().unwrap(), 0);
    let page = PAGE_BYTES as u64;
    n.write(0, &[1; 200_000]).unwrap();
    let t1 = n.sync().unwrap();
    let s1 = contents(&n);
    // A partial update: one 8 KB segment of page 1, one byte of page 2.
    n.write(page + 8192, &[2; 8192]).unwrap();
    n.write(2 * page + 5, &[3]).unwrap();
    let t2 = n.sync().unwrap();
    let s2 = contents(&n);
    n.write(100, &[4; 300_000]).unwrap(); // never synced
    assert_eq!((t1, t2), (1, 2));
    let t3 = n.rollback(t2).unwrap();
    assert_eq!(contents(&n), s2, "rollback to the partial update");
    assert_eq!(t3, 3);
    let t4 = n.rollback(t1).unwrap();
    assert_eq!(contents(&n), s1);
    assert_eq!(
        n.rollback(t2).unwrap_err().kind,
        ErrorKind::StaleToken,
        "t2 was rolled back past"
    );
    assert_eq!(n.rollback(t3).unwrap_err().kind, ErrorKind::StaleToken);
    assert_eq!(n.rollback(99).unwrap_err().kind, ErrorKind::StaleToken);
    n.write(7, &[9; 10]).unwrap();
    let t5 = n.sync().unwrap();
    let s5 = contents(&n);
    n.close().unwrap();
    // Reopen: the state, the tokens and the abandoned interval persist.
    let n = Nvmm::open_with(file.path(), 2 * MB, small(128 << 10, 0)).unwrap();
    assert_eq!(contents(&n), s5);
    assert!(n.last_token().unwrap() > t5);
    assert_eq!(n.rollback(t2).unwrap_err().kind, ErrorKind::StaleToken);
    n.rollback(t4).unwrap();
    assert_eq!(contents(&n), s1);
    n.rollback(0).unwrap();
    assert!(
        contents(&n).iter().all(|&b| b == 0),
        "token 0 is the empty region"
    );
    drop(n);
    // A different size is refused, not reinterpreted.
    let e = Nvmm::open(file.path(), 4 * MB, MB).err().unwrap();
    assert_eq!(e.kind, ErrorKind::BadFile);
}

#[test]
fn alloc_delete_setperms_and_temporary_pages() {
    let file = TempPath::new(fast_dir(), "api");
    let n = Nvmm::open_with(file.path(), MB, small(256 << 10, 0)).unwrap(); // 16 pages
    let a = n.alloc().unwrap();
    let b = n.alloc().unwrap();
    assert_ne!(a, b);
    n.write(a, &[7; 70_000]).unwrap(); // spills into page a+1, which becomes allocated
    let before_delete = n.sync().unwrap();
    n.delete(a).unwrap();
    let mut got = vec![1u8; 65536];
    n.read(a, &mut got).unwrap();
    assert!(got.iter().all(|&x| x == 0), "a deleted page reads as zero");
    assert_eq!(n.page_status(a).unwrap() & status::ALLOCATED, 0);
    // alloc hands out the deleted page again, not the written one.
    let mut seen = vec![];
    while let Ok(p) = n.alloc() {
        seen.push(p);
    }
    assert!(seen.contains(&a) && !seen.contains(&(a + 65536)) && !seen.contains(&b));
    assert_eq!(n.alloc().unwrap_err().kind, ErrorKind::Exhausted);
    n.rollback(before_delete).unwrap();
    n.read(a, &mut got).unwrap();
    assert!(
        got.iter().all(|&x| x == 7),
        "rollback brings the deleted page back"
    );
    // Read-only: the MMU refuses a store (checked in a child process).
    n.set_perms(0, perms::READ).unwrap();
    assert_eq!(n.page_status(0).unwrap() & perms::WRITE, 0);
    // Temporary: collected when this "application" closes.
    n.write(3 * 65536, &[5; 10]).unwrap();
    n.set_perms(3 * 65536, perms::READ | perms::WRITE | perms::TEMPORARY)
        .unwrap();
    assert_eq!(
        n.set_perms(0, 0x80).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        n.delete(n.len()).unwrap_err().kind,
        ErrorKind::InvalidArgument
    );
    n.close().unwrap();

    let out = Command::new(env!("CARGO_BIN_EXE_nvmm-child"))
        .arg("store-readonly")
        .arg(file.path())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGSEGV),
        "{:?} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("read 7"));

    let n = Nvmm::open(file.path(), 0, 256 << 10).unwrap();
    let mut t = [9u8; 10];
    n.read(3 * 65536, &mut t).unwrap();
    assert_eq!(t, [0; 10], "the temporary page was collected");
    assert_eq!(
        n.page_status(0).unwrap() & perms::WRITE,
        0,
        "permissions persist"
    );
    // A temporary page of a process that dies without closing is
    // collected at the next open.
    n.write(4 * 65536, &[6; 4]).unwrap();
    n.set_perms(4 * 65536, perms::READ | perms::WRITE | perms::TEMPORARY)
        .unwrap();
    n.sync().unwrap();
    drop(n); // a crash: no close
    let n = Nvmm::open(file.path(), 0, 256 << 10).unwrap();
    n.read(4 * 65536, &mut t[..4]).unwrap();
    assert_eq!(t[..4], [0; 4]);
    n.close().unwrap();
}

#[test]
fn garbage_collection_discards_the_oldest_tokens_first() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed}");
    let mut rng = Rng::new(seed);
    let file = TempPath::new(fast_dir(), "gc");
    // 8 pages: the version area holds 24 versions.
    let n = Nvmm::open_with(file.path(), 8 * 65536, small(64 << 10, 0)).unwrap();
    let mut states = vec![(0u64, contents(&n))];
    for _ in 0..200 {
        for _ in 0..1 + rng.below(6) {
            let off = rng.below(n.len() - 16);
            n.write(off, &rng.next_u64().to_le_bytes()).unwrap();
        }
        let t = n.sync().unwrap();
        states.push((t, contents(&n)));
    }
    let s = n.stats();
    println!("{s:?}");
    assert!(s.versions_used <= s.version_capacity);
    assert!(s.gc.chains_merged > 0 && s.gc.tokens_discarded > 0, "{s:?}");
    let oldest = n.oldest_token().unwrap();
    assert!(oldest > 0);
    assert_eq!(
        n.rollback(oldest - 1).unwrap_err().kind,
        ErrorKind::StaleToken
    );
    // Every live token's state is intact: roll back to the newest ones in
    // turn (a rollback abandons the tokens after it, so go newest first).
    // The background collector may raise the horizon meanwhile; a token it
    // discarded must then be refused as stale, never restored wrongly.
    let mut restored = 0;
    for (t, state) in states.iter().rev().take(8) {
        match n.rollback(*t) {
            Ok(_) => {
                assert_eq!(&contents(&n), state, "seed {seed}: state at token {t}");
                restored += 1;
            }
            Err(e) => {
                assert_eq!(e.kind, ErrorKind::StaleToken, "seed {seed}: {e}");
                assert!(
                    *t < n.oldest_token().unwrap(),
                    "seed {seed}: live token {t} refused"
                );
                break;
            }
        }
    }
    assert!(
        restored >= 1,
        "seed {seed}: no live token could be restored"
    );
    let oldest = n.oldest_token().unwrap();
    if let Some((t, state)) = states.iter().find(|(t, _)| *t == oldest) {
        n.rollback(*t).unwrap();
        assert_eq!(
            &contents(&n),
            state,
            "seed {seed}: the oldest live token {t}"
        );
    }
    n.close().unwrap();
}

#[test]
fn misses_take_the_model_flash_time() {
    use nvmm::ModelTiming;
    assert!(ModelTiming::preset("nosuch").is_err());
    let timing = ModelTiming::preset("nvmm-slc").unwrap();
    let floor_ns = timing.idle_read_ns();
    assert!(
        floor_ns > 1_000,
        "an SLC page read takes µs, not {floor_ns} ns"
    );
    let file = TempPath::new(fast_dir(), "model-timing");
    let blocks = 64u64;
    let stride = 8192 * 2;
    {
        let n = Nvmm::open_with(file.path(), 8 * MB, small(1 << 20, 4)).unwrap();
        for i in 0..blocks {
            n.write(i * stride, &(i + 1).to_le_bytes()).unwrap();
        }
        n.sync().unwrap();
        n.close().unwrap();
    }
    let mut o = small(1 << 20, 4);
    o.timing = Box::new(timing);
    let n = Nvmm::open_with(file.path(), 0, o).unwrap();
    // Misses of written blocks one after another: each waits for the
    // modeled read at least (the wall clock can only be later than the
    // model, never earlier). Never-written blocks need no flash read.
    let t0 = std::time::Instant::now();
    let mut b = [0u8; 8];
    for i in 0..blocks {
        n.read(i * stride, &mut b).unwrap();
        assert_eq!(u64::from_le_bytes(b), i + 1, "block {i}");
    }
    let elapsed = t0.elapsed().as_nanos() as u64;
    let s = n.stats();
    assert!(s.misses >= blocks / 2, "{s:?}");
    assert!(
        s.miss_modeled_ns >= s.misses * floor_ns,
        "modeled {} ns for {} misses, floor {floor_ns} each",
        s.miss_modeled_ns,
        s.misses
    );
    assert!(
        elapsed >= s.misses * floor_ns,
        "{} misses in {elapsed} ns: faster than the flash ({floor_ns} ns each)",
        s.misses
    );
    println!(
        "{} misses: modeled {:.1} µs each (idle floor {:.1}), wall {:.1} µs each",
        s.misses,
        s.miss_modeled_ns as f64 / s.misses as f64 / 1e3,
        floor_ns as f64 / 1e3,
        elapsed as f64 / blocks as f64 / 1e3
    );
    n.close().unwrap();
}

/// Issue 24: with a 16 MiB region over 512 KB of DRAM, syncs that each
/// rewrite most pages filled the version area and garbage collection
/// discarded every token but the last, so rollback to the previous sync
/// failed. The retention policy keeps the newest `retain_syncs` (default 2).
#[test]
fn rollback_to_the_previous_sync_survives_garbage_collection() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed}");
    for retain in [1u64, 2] {
        let mut rng = Rng::new(seed ^ retain);
        let file = TempPath::new(fast_dir(), "retain");
        let mut o = small(512 << 10, 16);
        o.retain_syncs = retain;
        let n = Nvmm::open_with(file.path(), 16 * MB, o).unwrap();
        // The states of the last `retain` syncs, newest last.
        let mut kept: Vec<(u64, Vec<u8>)> = vec![(0, contents(&n))];
        for round in 0..6 {
            for _ in 0..4 {
                for _ in 0..1500 {
                    let off = rng.below(n.len() / 8) * 8;
                    n.write(off, &rng.next_u64().to_le_bytes()).unwrap();
                }
                let t = n
                    .sync()
                    .unwrap_or_else(|e| panic!("seed {seed} retain {retain} round {round}: {e}"));
                kept.push((t, contents(&n)));
                if kept.len() > retain as usize {
                    kept.remove(0);
                }
            }
            let s = n.stats();
            assert!(
                s.gc.chains_merged > 0,
                "seed {seed}: the version area must be under pressure: {s:?}"
            );
            // Unsynced writes, then back to the oldest retained sync.
            n.write(0, b"unsynced").unwrap();
            let (t, state) = kept[0].clone();
            let back = n
                .rollback(t)
                .unwrap_or_else(|e| panic!("seed {seed} retain {retain} round {round}: {e}"));
            assert_eq!(contents(&n), state, "seed {seed}: state at token {t}");
            kept = vec![(back, state)];
        }
        let s = n.stats();
        println!("retain {retain}: {s:?}");
        assert!(s.gc.tokens_discarded > 0, "{s:?}");
        // A collected token is refused with what to change.
        let e = n.rollback(1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::StaleToken);
        assert!(e.context.contains("retain_syncs"), "{e}");
        n.close().unwrap();
    }
    let mut o = small(512 << 10, 16);
    o.retain_syncs = 3;
    let file = TempPath::new(fast_dir(), "retain3");
    let e = Nvmm::open_with(file.path(), 16 * MB, o).err().unwrap();
    assert_eq!(e.kind, ErrorKind::InvalidArgument, "{e}");
    assert!(!file.path().exists());
}
