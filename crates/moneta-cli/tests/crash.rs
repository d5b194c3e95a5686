//! Crash behaviour of the direct path (issue 8): monetad killed (SIGKILL)
//! under SQLite and under fio — the programs get an error within a bound,
//! never hang; after `moneta up` every committed transaction is there,
//! SQLite's integrity check passes and xfs_repair finds the file system
//! clean. A client killed mid-write changes nothing outside its own file.
//! Needs root and loop devices; mounts are torn down even on failure.

mod common;

use common::{moneta, ok, Mounted};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Wait for `child` to end within `bound`; kill it and fail if it does not.
fn ends_within(child: &mut Child, bound: Duration, what: &str) {
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > bound {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} still running {bound:?} after monetad died");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

const COMMITTER: &str = r#"
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA journal_mode=" + sys.argv[2])
db.execute("CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v BLOB)")
i = 0
try:
    while True:
        i += 1
        db.execute("BEGIN")
        db.execute("INSERT INTO t VALUES(?, randomblob(3000))", (i,))
        db.execute("COMMIT")
        print(i, flush=True)
except Exception as e:
    print("error", e, flush=True)
    sys.exit(3)
"#;

#[test]
fn monetad_killed_under_sqlite_and_fio_loses_nothing_committed() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("crash", "xfs", "512M");
    // Two SQLite programs (rollback journal and WAL) and fio, all through
    // the shim, when the device dies.
    let mut committers = Vec::new();
    for mode in ["DELETE", "WAL"] {
        let db = m.path(&format!("{mode}.db"));
        let mut c = m
            .run("python3", &["-c", COMMITTER, db.to_str().unwrap(), mode])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let lines = BufReader::new(c.stdout.take().unwrap()).lines();
        committers.push((mode, db, c, lines));
    }
    let fio_file = format!("--filename={}", m.path("fio.dat").display());
    let mut fio = m
        .run(
            "fio",
            &[
                "--name=crash",
                &fio_file,
                "--ioengine=psync",
                "--rw=randwrite",
                "--bs=4k",
                "--size=32m",
                // Written before it runs: writes into unwritten extents go
                // through the kernel (which outlives monetad); overwrites
                // are what the shim serves, and what must fail.
                "--overwrite=1",
                "--time_based",
                "--runtime=120",
                "--fsync=16",
            ],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Let each commit a few hundred transactions.
    let mut committed = Vec::new();
    for (_, _, _, lines) in &mut committers {
        let mut last = 0u64;
        for line in lines.by_ref().take(300) {
            last = line.unwrap().trim().parse().unwrap();
        }
        committed.push(last);
    }
    // A program stuck in the kernel would block the reads below forever
    // (CI once hung here 20 minutes): a watchdog kills the programs (our
    // own unreaped children) if they are not all done within a minute.
    let pids: Vec<i32> = committers
        .iter()
        .map(|c| c.2.id() as i32)
        .chain([fio.id() as i32])
        .collect();
    let (done, watched) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let hung = watched.recv_timeout(Duration::from_secs(60)).is_err();
        if hung {
            // Where each still-running program waits, for the failure.
            for &pid in &pids {
                for task in std::fs::read_dir(format!("/proc/{pid}/task"))
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    let read =
                        |f: &str| std::fs::read_to_string(task.path().join(f)).unwrap_or_default();
                    eprintln!(
                        "still running: pid {pid} task {:?} ({}) in {}; stack:\n{}",
                        task.file_name(),
                        read("comm").trim(),
                        read("wchan"),
                        read("stack")
                    );
                }
            }
            for pid in pids {
                // SAFETY: kill(2) of a child of this test, not yet reaped.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        hung
    });
    m.kill_daemon();
    for (i, (mode, _, child, lines)) in committers.iter_mut().enumerate() {
        // Whatever it printed before failing was committed too.
        for line in lines.by_ref() {
            match line.unwrap().trim().parse::<u64>() {
                Ok(n) => committed[i] = n,
                Err(_) => break,
            }
        }
        ends_within(child, Duration::from_secs(30), &format!("sqlite ({mode})"));
    }
    ends_within(&mut fio, Duration::from_secs(30), "fio");
    let _ = done.send(());
    assert!(
        !watchdog.join().unwrap(),
        "a program through the shim was still running 60 s after monetad died \
         (killed by the watchdog)"
    );
    assert!(
        !fio.wait().unwrap().success(),
        "fio did not notice the device die"
    );
    // The device comes back; everything committed is there.
    ok(
        moneta()
            .args(["up", "--mount"])
            .arg(&m.mount)
            .output()
            .unwrap(),
        "moneta up after the crash",
    );
    for (i, (mode, db, _, _)) in committers.iter().enumerate() {
        let out = ok(
            Command::new("sqlite3")
                .arg(db)
                .arg("PRAGMA integrity_check; SELECT max(id) FROM t;")
                .output()
                .unwrap(),
            "sqlite3 after the crash",
        );
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some("ok"), "{mode}: integrity check: {out}");
        let max: u64 = lines.next().unwrap().trim().parse().unwrap();
        assert!(
            max >= committed[i],
            "{mode}: {} transactions committed before the crash, {max} after",
            committed[i]
        );
    }
    // The file system itself: unmount, then xfs_repair -n on the image.
    ok(
        moneta()
            .args(["down", "--mount"])
            .arg(&m.mount)
            .output()
            .unwrap(),
        "moneta down",
    );
    let image = format!(
        "/run/moneta/{}/device.img",
        m.mount.to_string_lossy().replace('/', "_")
    );
    let repair = Command::new("xfs_repair")
        .args(["-n", &image])
        .output()
        .unwrap();
    assert!(
        repair.status.success(),
        "xfs_repair -n: {}{}",
        String::from_utf8_lossy(&repair.stdout),
        String::from_utf8_lossy(&repair.stderr)
    );
}

#[test]
fn a_client_killed_mid_write_changes_nothing_outside_its_own_file() {
    if !moneta_testkit::require_root("it mounts a file system and runs monetad") {
        return;
    }
    let m = Mounted::up("killed-client", "xfs", "512M");
    let reference = m.path("reference");
    let data: Vec<u8> = (0..(8u32 << 20)).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&reference, &data).unwrap();
    let writer = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 8 << 20)
os.fsync(fd)
print("go", flush=True)
i = 0
while True:
    i += 1
    os.pwrite(fd, (b"W%07d" % (i % 10_000_000)) * 8192, (i * 65536) % (8 << 20))
"#;
    let own = m.path("own");
    for round in 0..5 {
        let mut w = m
            .run("python3", &["-c", writer, own.to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(w.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "go", "round {round}");
        std::thread::sleep(Duration::from_millis(50 + 70 * round));
        w.kill().unwrap();
        w.wait().unwrap();
    }
    ok(Command::new("sync").output().unwrap(), "sync");
    std::fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
    assert!(
        std::fs::read(&reference).unwrap() == data,
        "the reference file changed"
    );
    let own_data = std::fs::read(&own).unwrap();
    for (i, chunk) in own_data.chunks(8).enumerate() {
        assert!(
            chunk.iter().all(|&b| b == 0)
                || (chunk[0] == b'W' && chunk[1..].iter().all(u8::is_ascii_digit)),
            "the writer's file holds foreign bytes at {}: {chunk:?}",
            i * 8
        );
    }
}

/// Whether every thread of `pid` has exited (a killed process's leader
/// is a zombie while its last thread still runs its exit).
fn exited(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|t| {
        std::fs::read_to_string(t.path().join("stat")).map_or(true, |s| {
            s.rsplit_once(')')
                .is_none_or(|(_, rest)| matches!(rest.trim_start().chars().next(), Some('Z' | 'X')))
        })
    })
}

/// Where the threads of `pid` wait in the kernel (for a failure message).
fn kernel_waits(pid: i32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return String::from("gone");
    };
    tasks
        .flatten()
        .map(|t| std::fs::read_to_string(t.path().join("wchan")).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(",")
}

/// A process outside the shim, stopped by the kernel until monetad answers
/// its permission event, goes on when monetad is killed (SIGKILL), and
/// monetad's exit ends. Found in CI: monetad's exit hung in
/// `fsnotify_destroy_group` on its coverage group (which waits for every
/// reader of the kernel's mark SRCU) while the writer held that SRCU,
/// waiting for an answer from monetad's watcher group, not yet released —
/// both stayed in D state until the writer was killed by hand.
#[test]
fn a_writer_waiting_on_monetad_goes_on_when_monetad_is_killed() {
    if !moneta_testkit::require_root("fanotify pre-content events and loop devices") {
        return;
    }
    let m = Mounted::up("perm-kill", "xfs", "320M");
    let file = m.path("held");
    // Written before the shim opens it: the shim serves overwrites.
    std::fs::write(&file, vec![b'h'; 1 << 20]).unwrap();
    // A shim process holds a granted file (so the watcher marks it).
    let holder = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, b"H" * 4096, 8192)
os.fsync(fd)
print("go", flush=True)
sys.stdin.read()
"#;
    let start_holder = || {
        let mut h = m
            .run("python3", &["-c", holder, file.to_str().unwrap()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(h.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "go");
        h
    };
    let mut rounds = Vec::new();
    // The hang depended on the order the kernel released the daemon's
    // groups in: stop and kill it with a writer waiting, six times. A round
    // whose writer was not stopped tests nothing and is run again, at most
    // six more rounds in all (seen once in CI: round 4 of 6, the writer done
    // at once; why the kernel let it through was not established).
    const ROUNDS: usize = 6;
    let mut round = 0;
    while rounds
        .iter()
        .filter(|r: &&(usize, bool, _, _, _, _)| r.1)
        .count()
        < ROUNDS
        && round < 2 * ROUNDS
    {
        round += 1;
        if round > 1 {
            // A new daemon (`moneta up` repairs after the crash).
            m.up_again();
        }
        let mut holder = start_holder();
        let daemon = m.daemon_pid();
        // SAFETY: kill(2) of this mount's daemon, found by its socket.
        unsafe { libc::kill(daemon, libc::SIGSTOP) };
        let mut writer = Command::new("dd")
            .args(["if=/dev/zero", "bs=4096", "count=1", "conv=notrunc"])
            .arg(format!("of={}", file.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let waiting = writer.try_wait().unwrap().is_none();
        // SAFETY: as above.
        unsafe { libc::kill(daemon, libc::SIGKILL) };
        let t0 = Instant::now();
        let mut writer_done = None;
        let mut daemon_gone = None;
        while t0.elapsed() < Duration::from_secs(10)
            && (writer_done.is_none() || daemon_gone.is_none())
        {
            if writer_done.is_none() && writer.try_wait().unwrap().is_some() {
                writer_done = Some(t0.elapsed());
            }
            if daemon_gone.is_none() && exited(daemon) {
                daemon_gone = Some(t0.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let daemon_state = kernel_waits(daemon);
        let writer_state = kernel_waits(writer.id() as i32);
        if writer_done.is_none() {
            // Killing the writer ends its wait (and so the daemon's exit).
            let _ = writer.kill();
            let _ = writer.wait();
        }
        let _ = holder.kill();
        let _ = holder.wait();
        rounds.push((
            round,
            waiting,
            writer_done,
            daemon_gone,
            daemon_state,
            writer_state,
        ));
    }
    eprintln!("(round, writer waited, writer done after, monetad gone after, …): {rounds:?}");
    let waited = rounds.iter().filter(|r| r.1).count();
    assert_eq!(
        waited,
        ROUNDS,
        "the writer was stopped by the stopped daemon's watcher in {waited} of {} rounds \
         (a round without it tests nothing): {rounds:?}",
        rounds.len()
    );
    for (round, _, writer_done, daemon_gone, daemon_state, writer_state) in &rounds {
        assert!(
            writer_done.is_some() && daemon_gone.is_some(),
            "round {round}: 10 s after SIGKILL of monetad: writer done {writer_done:?}, \
             monetad gone {daemon_gone:?} (its threads wait in {daemon_state}, writer in {writer_state}); all rounds: {rounds:?}"
        );
    }
}
