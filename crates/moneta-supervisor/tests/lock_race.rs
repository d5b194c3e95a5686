//! The state directory's lock under contention: threads of this process
//! and other processes bring one instance up and down at once, on real
//! files, the way `moneta up`/`down` and `san up`/`down` do (take the
//! lock, look at the directory, write its records one by one or remove
//! them, let go). No two ever hold the lock together, every one of them
//! finds the directory whole (absent, or every record of one `up`), and the
//! transitions, logged under the lock, alternate up, down, up, ...
//!
//! The schedule (who sleeps how long between steps) is seeded:
//! `MONETA_LOCK_SEED=N` replays one, `=random` draws one from the clock.

use moneta_model::kernel::rng::{seed_fixed_unless_env, Rng};
use moneta_supervisor::state::StateDir;
use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const NAME: &str = "inst";
/// The records one `up` writes, in order, between the directory and `ready`.
const PARTS: usize = 3;
const THREADS: usize = 3;
const PROCESSES: usize = 2;
const ROUNDS: usize = 40;
const WORKER_ENV: &str = "MONETA_LOCK_RACE_WORKER";

#[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug, Clone)]
struct Record {
    owner: String,
    round: usize,
}

fn nap(rng: &mut Rng) {
    // Mostly nothing, sometimes up to 300 µs: windows for a race to open.
    if rng.below(3) == 0 {
        std::thread::sleep(Duration::from_micros(rng.below(300)));
    }
}

/// The directory is whole: absent, or `instance.json`, every part and
/// `ready.json`, all of one owner's one round, and nothing else (no
/// temporary file of a half-done write).
fn check_whole(sd: &StateDir) -> Result<(), String> {
    if !sd.dir.exists() {
        return Ok(());
    }
    let read = |f: &str| -> Result<Record, String> {
        sd.read_json::<Record>(f)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("{f} is missing from an instance that is up"))
    };
    let first = read("instance.json")?;
    let mut names = vec!["instance.json".to_string(), "ready.json".to_string()];
    for i in 0..PARTS {
        names.push(format!("part-{i}.json"));
    }
    for f in &names {
        let r = read(f)?;
        if r != first {
            return Err(format!(
                "{f} is {r:?}, instance.json {first:?}: two ups mixed"
            ));
        }
    }
    let mut found: Vec<String> = fs::read_dir(&sd.dir)
        .map_err(|e| e.to_string())?
        .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    found.sort();
    names.sort();
    if found != names {
        return Err(format!("the directory holds {found:?}, expected {names:?}"));
    }
    Ok(())
}

fn up(sd: &StateDir, me: &Record, rng: &mut Rng) -> Result<(), String> {
    fs::create_dir(&sd.dir).map_err(|e| format!("{}: creating the directory: {e}", me.owner))?;
    sd.write_json("instance.json", me)
        .map_err(|e| e.to_string())?;
    for i in 0..PARTS {
        nap(rng);
        sd.write_json(&format!("part-{i}.json"), me)
            .map_err(|e| e.to_string())?;
    }
    nap(rng);
    sd.write_json("ready.json", me).map_err(|e| e.to_string())
}

fn down(sd: &StateDir, rng: &mut Rng) -> Result<(), String> {
    let mut files = vec!["ready.json".to_string()];
    files.extend((0..PARTS).map(|i| format!("part-{i}.json")));
    files.push("instance.json".into());
    for f in files {
        fs::remove_file(sd.path(&f)).map_err(|e| format!("removing {f}: {e}"))?;
        nap(rng);
    }
    fs::remove_dir(&sd.dir).map_err(|e| format!("removing the directory: {e}"))
}

/// `rounds` times: lock, check, bring the instance up if it is down and
/// down if it is up, check again, log the transition, unlock.
fn worker(run: &Path, owner: &str, seed: u64, rounds: usize) -> Result<(), String> {
    let sd = StateDir::new(run, NAME);
    let stream = moneta_model::kernel::hash::fnv1a(owner.as_bytes());
    let mut rng = Rng::stream(seed, stream);
    let holder = run.join("holder");
    for round in 0..rounds {
        let lock = sd.lock("lock race").map_err(|e| e.to_string())?;
        // Only the lock's holder may create this: a second holder fails here.
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&holder)
            .map_err(|e| format!("{owner} round {round}: another holds the lock too ({e})"))?;
        check_whole(&sd).map_err(|e| format!("{owner} round {round}, on taking the lock: {e}"))?;
        let me = Record {
            owner: owner.to_string(),
            round,
        };
        let step = if sd.dir.exists() {
            down(&sd, &mut rng)?;
            "down"
        } else {
            up(&sd, &me, &mut rng)?;
            "up"
        };
        check_whole(&sd).map_err(|e| format!("{owner} round {round}, after {step}: {e}"))?;
        let mut log = OpenOptions::new()
            .append(true)
            .create(true)
            .open(run.join("log"))
            .map_err(|e| e.to_string())?;
        writeln!(log, "{step} {owner} {round}").map_err(|e| e.to_string())?;
        fs::remove_file(&holder).map_err(|e| e.to_string())?;
        drop(lock);
        nap(&mut rng);
    }
    Ok(())
}

fn scratch() -> PathBuf {
    let d = std::env::temp_dir().join(format!("moneta-lock-race-{}", std::process::id()));
    let _ = fs::remove_dir_all(&d);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Removes the scratch directory even when the test fails.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

#[test]
fn concurrent_ups_and_downs_never_corrupt_the_state_directory() {
    let seed = seed_fixed_unless_env("MONETA_LOCK_SEED", 20261203);
    let run = Scratch(scratch());
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..PROCESSES)
        .map(|p| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "lock_race_worker_process",
                    "--ignored",
                    "--nocapture",
                ])
                .env(
                    WORKER_ENV,
                    format!("{}|process-{p}|{seed}|{ROUNDS}", run.0.display()),
                )
                .output_in_background()
        })
        .collect();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let run = run.0.clone();
            std::thread::spawn(move || worker(&run, &format!("thread-{t}"), seed, ROUNDS))
        })
        .collect();
    let mut failures = Vec::new();
    for t in threads {
        if let Err(e) = t.join().unwrap() {
            failures.push(e);
        }
    }
    for c in children {
        let out = c.wait_with_output().unwrap();
        if !out.status.success() {
            failures.push(format!(
                "a worker process: {}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
    }
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
    let log = fs::read_to_string(run.0.join("log")).unwrap();
    let steps: Vec<&str> = log.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(steps.len(), (THREADS + PROCESSES) * ROUNDS, "seed {seed}");
    for (i, s) in steps.iter().enumerate() {
        let expected = if i % 2 == 0 { "up" } else { "down" };
        assert_eq!(*s, expected, "seed {seed}: transition {i} of\n{log}");
    }
    // Every process took part (the lock was contended across processes).
    for p in 0..PROCESSES {
        assert!(log.contains(&format!(" process-{p} ")), "seed {seed}");
    }
    check_whole(&StateDir::new(&run.0, NAME)).unwrap();
}

/// Not a test of its own: the body of the worker processes that
/// [`concurrent_ups_and_downs_never_corrupt_the_state_directory`] starts
/// (ignored, so a plain run never runs it).
#[test]
#[ignore = "run by concurrent_ups_and_downs_never_corrupt_the_state_directory"]
fn lock_race_worker_process() {
    let spec = std::env::var(WORKER_ENV).expect("started by the lock race test");
    let parts: Vec<&str> = spec.split('|').collect();
    let [run, owner, seed, rounds] = parts[..] else {
        panic!("{WORKER_ENV}={spec}: expected RUN|OWNER|SEED|ROUNDS");
    };
    if let Err(e) = worker(
        Path::new(run),
        owner,
        seed.parse().unwrap(),
        rounds.parse().unwrap(),
    ) {
        eprintln!("{e}");
        std::process::exit(1);
    }
}

trait Background {
    fn output_in_background(&mut self) -> std::process::Child;
}

impl Background for Command {
    fn output_in_background(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("starting a worker process")
    }
}
