//! SQLite in an NVMM region, SIGKILLed (issue 24): a child process runs
//! transactions on a database that lives in a libnvmm region (see
//! `common/sqlite.rs`), syncing the region after each COMMIT and reporting
//! the transaction through a pipe; the parent kills it at a random moment,
//! reopens the region and requires `PRAGMA integrity_check` = ok and the
//! database to hold exactly the transactions up to the last reported one
//! (or the next, if the kill fell between its sync and its report).
//! The region (32 MB) is four times its DRAM budget, so SQLite's pages
//! miss and are written back throughout.

mod common;

use common::sqlite::{checkpoint, open_in, transaction, verify, SCHEMA};
use nvmm::testkit::{fast_dir, seed_from_env, Rng, TempPath};
use nvmm::Nvmm;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const REGION: u64 = 32 << 20;
const DRAM: u64 = 8 << 20;

/// The child's body: runs only when spawned by the test below.
#[test]
fn sqlite_child() {
    let Ok(path) = std::env::var("NVMM_SQLITE_CHILD") else {
        return;
    };
    let region = Nvmm::open(&path, REGION, DRAM).unwrap();
    let c = open_in(&region);
    c.execute_batch(SCHEMA).unwrap();
    let mut txn = common::sqlite::verify(&c);
    let mut out = std::io::stdout().lock();
    loop {
        txn += 1;
        transaction(&c, txn);
        checkpoint(&region, &c);
        writeln!(out, "{txn}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn sqlite_survives_sigkill_at_random_points() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed} (NVMM_TEST_SEED reproduces the kill times)");
    let mut rng = Rng::new(seed);
    let file = TempPath::new(fast_dir(), "sqlite");
    let started = Instant::now();
    let mut last_reported = 0u64;
    let rounds = 12;
    for round in 0..rounds {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "sqlite_child", "--nocapture", "--test-threads=1"])
            .env("NVMM_SQLITE_CHILD", file.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Ok(t) = line.trim().parse::<u64>() {
                    let _ = tx.send(t);
                }
            }
        });
        let run = Duration::from_millis(200 + rng.below(1300));
        let deadline = Instant::now() + run;
        while let Ok(t) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            last_reported = last_reported.max(t);
            if Instant::now() >= deadline {
                break;
            }
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        while let Ok(t) = rx.try_recv() {
            last_reported = last_reported.max(t);
        }
        let region = Nvmm::open(file.path(), 0, DRAM).unwrap();
        let found = {
            let c = open_in(&region);
            let found = verify(&c);
            drop(c);
            found
        };
        println!("round {round}: killed after {run:?}; last reported {last_reported}, reopened at {found}");
        assert!(
            found == last_reported || found == last_reported + 1,
            "seed {seed} round {round}: reopened at transaction {found}, last reported {last_reported}"
        );
        last_reported = found;
        drop(region); // the next child reopens it
    }
    assert!(
        last_reported > rounds,
        "transactions made progress: {last_reported}"
    );
    println!("{rounds} kills in {:?}", started.elapsed());
}
