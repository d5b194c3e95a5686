//! Crash consistency (SPEC §7, issue 13): a child process applies a seeded
//! workload and syncs in a loop, reporting each completed token through a
//! pipe; it is SIGKILLed at a random moment, many times over the same file.
//! Each reopen must show exactly the state of the last completed sync: the
//! last token the child reported, or the next one if the kill landed after
//! the sync finished but before the report was written.

use nvmm::testkit::{
    crash_iteration, fast_dir, seed_from_env, Rng, TempPath, CRASH_DRAM_BYTES, CRASH_REGION_BYTES,
};
use nvmm::{Nvmm, Options};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Kills and reaps the child if the test fails before it does.
struct KillOnDrop(Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rounds() -> u64 {
    std::env::var("NVMM_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40)
}

#[test]
fn kill_9_at_random_points_leaves_the_last_completed_sync() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed} (NVMM_TEST_SEED reproduces the workload and kill times)");
    let mut rng = Rng::new(seed);
    let file = TempPath::new(fast_dir(), "crash");
    let mut shadow = vec![0u8; CRASH_REGION_BYTES as usize];
    let mut applied = 0u64; // iterations folded into `shadow`
    let mut after_report = 0;
    let mut max_token = 0;
    for round in 0..rounds() {
        let child = Command::new(env!("CARGO_BIN_EXE_nvmm-child"))
            .arg("crash")
            .arg(file.path())
            .arg(seed.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn nvmm-child");
        let mut child = KillOnDrop(child);
        let stdout = child.0.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Let it run a random while (sometimes not even past open).
        std::thread::sleep(Duration::from_micros(rng.below(40_000)));
        child.0.kill().expect("SIGKILL the child");
        let status = child.0.wait().expect("reap the child");
        reader.join().expect("reader thread");
        let reported: Vec<u64> = rx.try_iter().map(|l| l.parse().expect("a token")).collect();
        assert!(
            status.code().is_none(),
            "seed {seed} round {round}: the child exited by itself: {status:?}: {}",
            {
                let mut s = String::new();
                if let Some(mut e) = child.0.stderr.take() {
                    use std::io::Read;
                    let _ = e.read_to_string(&mut s);
                }
                s
            }
        );
        let last_reported = reported.last().copied().unwrap_or(applied);
        let n = Nvmm::open_with(
            file.path(),
            CRASH_REGION_BYTES,
            Options::new(CRASH_DRAM_BYTES),
        )
        .unwrap_or_else(|e| panic!("seed {seed} round {round}: reopen: {e}"));
        let token = n.last_token().unwrap();
        assert!(
            token == last_reported || token == last_reported + 1,
            "seed {seed} round {round}: reopened at token {token}, the child last reported {last_reported}"
        );
        if token > last_reported {
            after_report += 1;
        }
        while applied < token {
            applied += 1;
            for (off, bytes) in crash_iteration(seed, applied) {
                shadow[off as usize..off as usize + bytes.len()].copy_from_slice(&bytes);
            }
        }
        let mut got = vec![0u8; CRASH_REGION_BYTES as usize];
        n.read(0, &mut got).unwrap();
        if got != shadow {
            let first = got.iter().zip(&shadow).position(|(a, b)| a != b).unwrap();
            panic!("seed {seed} round {round}: token {token}: region differs from the synced state first at byte {first}");
        }
        // Dropped, not closed: a close would sync and add a token.
        drop(n);
        max_token = token;
    }
    println!(
        "{} rounds, {max_token} syncs survived in all; {after_report} kills landed between a sync and its report",
        rounds()
    );
    assert!(
        max_token > rounds(),
        "the child synced too rarely to test anything ({max_token} syncs)"
    );
}
