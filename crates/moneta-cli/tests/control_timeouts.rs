//! Control-plane calls never hang (issue 8, item 7): `moneta stats` against
//! a socket that accepts and never answers, one that answers garbage and
//! one that hangs up at once each ends with a clear error within a bound.

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// A socket served by `behave` for every connection, in a thread that
/// lives as long as the test.
fn fake_daemon(name: &str, behave: fn(std::os::unix::net::UnixStream)) -> PathBuf {
    let path = std::env::temp_dir().join(format!("moneta-fake-{}-{name}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || behave(stream));
        }
    });
    path
}

/// Run `moneta stats` against `socket` with a 300 ms control timeout.
fn stats(socket: &PathBuf) -> (bool, String, Duration) {
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_moneta"))
        .args(["stats", "--daemon"])
        .arg(socket)
        .env("MONETA_CONTROL_TIMEOUT_MS", "300")
        .output()
        .unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
        t0.elapsed(),
    )
}

#[test]
fn a_daemon_that_never_answers_is_an_error_not_a_hang() {
    let socket = fake_daemon("silent", |stream| {
        std::thread::sleep(Duration::from_secs(30));
        drop(stream);
    });
    let (ok, err, took) = stats(&socket);
    assert!(!ok, "stats succeeded against a silent socket");
    assert!(err.contains("did not answer within 300 ms"), "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let _ = std::fs::remove_file(&socket);
}

#[test]
fn garbage_and_hang_ups_are_errors() {
    let garbage = fake_daemon("garbage", |mut stream| {
        let _ = stream.write_all(&[8, 0, 0, 0, b'{', b'x', 0xff, b'}', 1, 2, 3, 4]);
        std::thread::sleep(Duration::from_secs(5));
    });
    let (ok, err, took) = stats(&garbage);
    assert!(!ok, "stats accepted garbage");
    assert!(err.contains("malformed"), "{err}");
    assert!(took < Duration::from_secs(10), "took {took:?}");
    let hang_up = fake_daemon("hangup", drop);
    let (ok, err, _) = stats(&hang_up);
    assert!(!ok, "stats succeeded against a closed connection");
    assert!(
        err.contains("closed the connection") || err.contains("reset by peer"),
        "{err}"
    );
    for s in [garbage, hang_up] {
        let _ = std::fs::remove_file(&s);
    }
}
