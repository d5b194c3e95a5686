//! The replica protocol's deterministic simulator (`moneta_emu::san_sim`,
//! issue 39 item 6): short schedules under the nemesis have no violation
//! of the register model, and a seed replays exactly (same trace).
//! The seeds are fixed (`FIXED_SEED`), so `make test` cannot fail by
//! chance; `MONETA_SIM_SEED=N` replays a printed seed and
//! `MONETA_SIM_SEED=random` draws one from the clock (the random hunt is
//! `make san-sim`).

use moneta_emu::san_sim::{self, SimOptions};
use std::path::PathBuf;

/// The first of the short schedules' seeds when none is asked for.
const FIXED_SEED: u64 = 1000;

fn seed() -> u64 {
    moneta_model::kernel::rng::seed_fixed_unless_env("MONETA_SIM_SEED", FIXED_SEED)
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(format!(
        "/dev/shm/moneta-simtest-{}-{name}",
        std::process::id()
    ))
}

#[test]
fn short_schedules_keep_every_acknowledged_write() {
    let seed = seed();
    let mut kinds = std::collections::BTreeMap::new();
    let (mut ops, mut reads) = (0, 0);
    for k in 0..4 {
        let o = SimOptions::new(seed + k, 3000, &dir("short"));
        let r = san_sim::run(&o).unwrap();
        assert!(
            r.violations.is_empty(),
            "seed {}: {:#?}\nreplay: MONETA_SIM_SEED={seed} or moneta san sim-protocol --seed {} \
             --ops 3000 --trace",
            o.seed,
            r.violations,
            o.seed
        );
        assert!(
            r.final_reads >= 24 * 3,
            "seed {}: every block read through every node",
            o.seed
        );
        ops += r.ops;
        reads += r.reads_ok + r.final_reads;
        for (kind, n) in r.steps {
            *kinds.entry(kind).or_insert(0) += n;
        }
    }
    println!("seed {seed}: {ops} operations, {reads} reads checked, nemesis {kinds:?}");
    assert!(ops >= 4 * 3000);
    // The nemesis acted: nodes died, links were cut or faulty.
    let acted: u64 = [
        "kill",
        "replace-disk",
        "partition",
        "partition-link",
        "lossy",
        "disk-full",
    ]
    .iter()
    .map(|k| kinds.get(*k).copied().unwrap_or(0))
    .sum();
    assert!(acted > 0, "seed {seed}: the nemesis did nothing: {kinds:?}");
}

/// Operator-made split brains (`SimOptions::split_brains`): a copy forced
/// while its partner is alive behind a cut, both sides written, and the
/// two holders asked at once to discard their own side. Exactly one of
/// the two contradicting resolves may be granted (two grants are a
/// violation), and the copies converge on the winner's.
///
/// A force step that finds no outdated copy makes one: it cuts a node off
/// from every peer (its copies go outdated, its partners' on alone) and
/// forces its copies `SPLIT_FORCE_NS` later, with nothing healing the cut
/// until then (before, these schedules made no split brain at all).
#[test]
fn operator_split_brains_are_resolved_once() {
    let seed = seed();
    let mut kinds = std::collections::BTreeMap::new();
    for k in 0..4 {
        let mut o = SimOptions::new(seed + k, 5000, &dir("split"));
        o.split_brains = true;
        let r = san_sim::run(&o).unwrap();
        assert!(
            r.violations.is_empty(),
            "seed {}: {:#?}\nreplay: moneta san sim-protocol --seed {} --ops 5000 --split-brains \
             --trace",
            o.seed,
            r.violations,
            o.seed
        );
        for (kind, n) in r.steps {
            *kinds.entry(kind).or_insert(0) += n;
        }
    }
    println!("seed {seed}: nemesis {kinds:?}");
    let got = |k: &str| kinds.get(k).copied().unwrap_or(0);
    assert!(
        got("resolve-contested") > 0 && got("resolve-decided") > 0,
        "seed {seed}: no split brain was made and contested: {kinds:?}"
    );
}

#[test]
fn a_seed_replays_exactly() {
    let seed = seed();
    let mut o = SimOptions::new(seed, 1500, &dir("replay"));
    o.keep_trace = true;
    let a = san_sim::run(&o).unwrap();
    let b = san_sim::run(&o).unwrap();
    assert_eq!(a.trace_hash, b.trace_hash, "seed {seed}");
    let events = |r: &san_sim::SimReport| -> Vec<String> {
        // The nodes' log lines are kept beside the trace, not part of it
        // (a log line's rate limit reads the wall clock).
        r.trace
            .iter()
            .filter(|l| !l.contains(" log "))
            .cloned()
            .collect()
    };
    assert_eq!(events(&a), events(&b), "seed {seed}");
    assert!(
        events(&a).len() > 1500,
        "seed {seed}: a trace of every operation"
    );
    o.seed = seed + 1;
    let c = san_sim::run(&o).unwrap();
    assert_ne!(a.trace_hash, c.trace_hash, "seeds {seed} and {}", seed + 1);
}

/// The schedules a 45-minute run found failing, replayed whole (a few
/// seconds each): 20261263 forced a copy whose partner was alive behind a
/// cut (now never: the force's contract is a partner that is down) and
/// discarded the forced side's writes (now given up by the oracle, as the
/// operator did); 20261303 discarded a split brain's side (the same);
/// 20261275 stalled a resync for good: a resync write the target refused
/// stayed in flight (`engine/port.rs` now sends it again); 82494783 read
/// an acknowledged write of block 0 overwritten: both holders claimed its
/// granule for each other (one had handed it over as discarded while its
/// partner was away, then settled it in its own favour as unsure at the
/// meeting) and resynced it both ways for good, over the writes landing
/// meanwhile (`engine/port.rs` `resync_conflict`: one version wins).
#[test]
fn the_triaged_seeds_pass() {
    for seed in [20261263, 20261275, 20261303, 20261446, 82494783] {
        assert_schedule_holds(seed);
    }
}

/// Found by a round-2 hunt (`moneta san sim-protocol --seed 71930000 --ops
/// 3000 --runs 2000 --keep-going`, the 363rd schedule); not fixed. After
/// the final recovery two blocks of slice 1 (copies on n1 and n2) read
/// differently through the two holders ("copies differ": block 10 v66 on
/// n1, v67 on n2; block 15 v49 on n1, v50 on n2). v67 and v50 are writes
/// n0 issued 0.7-0.8 ms after n1 was cut off (2.3057 s), never
/// acknowledged (n0 killed at 2.841 s): n0 holds no copy of slice 1 and
/// sent each to both holders; n2 wrote it, n1 never got it. No holder's
/// activity log marks a write a non-holder sends it (only the writer's
/// own copies are marked, `activity_begin`), and the writer's "failed
/// write" mark died with it; when n1 and n2 met again (both outdated,
/// 4.302 s) each said "missed 0 granules" and nothing was resynced.
/// Either version is allowed, but the copies must not differ.
///
/// A real divergence, not the checker's: both copies serve reads, so a
/// client that reads v67 through n2 and then v66 through n1 sees the
/// block go back in time (the register's floor is the highest version
/// read: a stale read), and which version a read returns after the
/// recovery depends on the node asked, for good. The protocol rule it
/// breaks is DRBD's: every node that applies a replicated write keeps it
/// in its activity log until it knows every copy has it, on the
/// *receiving* side too (DRBD commit 6719fb036cea, "fix potential data
/// divergence after multiple failures": "we need to set out of sync and do
/// AL transactions … on the receiving side"; DRBD 9 also tells the
/// secondaries which writes every node has, its peer acknowledgements,
/// `P_PEER_ACK`), so the survivors of a writer that died mid-write know
/// which blocks may differ and resync them. Here only the writer's own copies are marked unsure
/// (`activity_begin`), and a writer that holds no copy marks nothing a
/// survivor can see. The fix (not made): a holder marks a non-holder's
/// mirrored write unsure with respect to its partner, durably, before it
/// reaches the copy; the writer tells both holders once both acknowledged
/// (a peer acknowledgement) and the mark is cleared; a mark left when the
/// holders meet again is settled as the unsure granules of a lost partner
/// are (`settle_unsure`).
///
/// Fixed (`engine/port.rs`, `PortState::remote`, `PEER_ACK_TAG`): the
/// holders keep a receiving-side activity log of a non-holder's writes,
/// durable before the bytes land; the writer's peer acknowledgement
/// forgets it (or, for a failed write, settles it), and a writer lost
/// before it said settles its granules with a partner that is up at once.
/// Its cost is a dirty-map fdatasync per newly marked granule on each
/// holder (an extent log would batch them).
#[test]
fn seed_71930362_copies_converge_after_failed_writes() {
    assert_schedule_holds_ops(71930362, 3000);
}

/// Found by a hunt (`moneta san sim-protocol --seed 39100000 --runs 400
/// --ops 20000 --keep-going`, the 231st schedule): a stale read of block 5
/// (slice 0, copies on n0 and n1) through n0 at 5.243 s, v229 where v230
/// was acknowledged. After a lossy link on n0 and a recovery, n0 and n1
/// judged each other lost and back every 20 ms, out of phase. At 5.2266 s
/// n0 had n1 back and their exchange made n1's copy a resync target with
/// nothing to receive; n1 lost n0 again (5.22659 s), and n0's `SYNC_DONE`
/// arrived after that (5.22664 s): n1's copy went up to date with its
/// partner lost, skipping the suspension and the tie-breaker, and n1's
/// held write of v230 was taken alone and acknowledged at 5.239 s while n0,
/// which counted n1 up, served its own copy (v229). The root cause: only
/// `MISSED_TAG` was taken from a partner that is up, not `SYNC_DONE_TAG`
/// (`engine/port.rs`: now both). Restricting the model's detour to take a
/// write alone only in place of a holder that is down had moved the
/// violation (v231 acknowledged, v230 read) instead of removing it.
#[test]
fn seed_39100230_a_copy_is_never_made_up_to_date_by_a_lost_partner() {
    assert_schedule_holds(39100230);
}

/// Replays a 20,000-operation schedule of `seed` and fails on any
/// violation or on a block left unread at the end.
fn assert_schedule_holds(seed: u64) {
    assert_schedule_holds_ops(seed, 20000);
}

fn assert_schedule_holds_ops(seed: u64, ops: u64) {
    let o = SimOptions::new(seed, ops, &dir(&format!("triaged-{seed}")));
    let r = san_sim::run(&o).unwrap();
    assert!(
        r.violations.is_empty(),
        "seed {seed}: {:#?}\nreplay: moneta san sim-protocol --seed {seed} --ops {ops} --trace",
        r.violations
    );
    assert!(r.final_reads >= 24 * 3, "seed {seed}: every block read");
}

/// Found by the first long run with operator-made split brains reaching
/// them (`moneta san sim-protocol --minutes 17 --max-ops 10000000 --jobs 2
/// --ops 20000 --keep-going --split-brains --seed 39300000`); not triaged.
/// Both pass without `--split-brains`. 39300064: both contested resolves
/// were decided once (slice 1 at 7.36 s, slice 0 at 10.89 s: n0's side
/// discarded, n1's wins), then a stale read of block 0 (slice 0) through
/// n2 and n1 at 12.005 s, v385 where v386 was acknowledged. 39300066:
/// copies of slice 0 differ after the final recovery (block 0 v246 on n0,
/// v244 on n1). Whether the protocol (a resync after a discard) or the
/// model's floors after a granted resolve are wrong is not known yet.
#[test]
#[ignore = "seeds 39300064, 39300066 with --split-brains: not triaged (a stale read after a \
            granted discard; copies that differ after the final recovery)"]
fn split_brain_seeds_of_the_first_long_run() {
    for seed in [39300064, 39300066] {
        let mut o = SimOptions::new(seed, 20000, &dir(&format!("split-{seed}")));
        o.split_brains = true;
        let r = san_sim::run(&o).unwrap();
        assert!(
            r.violations.is_empty(),
            "seed {seed}: {:#?}\nreplay: moneta san sim-protocol --seed {seed} --ops 20000 \
             --split-brains --trace",
            r.violations
        );
    }
}
