//! No local user can starve monetad (issue 39, case 7). Needs root: the
//! flooding user is `nobody` (uid 65534), a child process of this test
//! binary; the test fails, never skips, without root.
//!
//! - `nobody` opening 1,100 connections with a `hello` on each gets at most
//!   its per-uid share of channels and connections; root's `hello` and
//!   `stats` still succeed, and the daemon serves the flood on a fixed
//!   handful of threads, not one per connection.
//! - At a descriptor limit of 256 (a daemon configured for more
//!   connections than that), 600 idle connections run it out of
//!   descriptors: it neither spins (CPU time measured over 2 s) nor fills
//!   its log, and serves root again once the flood ends.
//!
//! Every child is killed and every socket removed when the test ends, also
//! when it fails.

use moneta_emu::control::{self, ControlPlane, FrameReader, Request, Response, PROTOCOL_VERSION};
use moneta_emu::daemon::{ConnectionLimits, Daemon, DaemonOptions};
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_emu::sys;
use moneta_model::config::Config;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;
/// The flooder's connections.
const FLOOD: usize = 1100;
const ROLE_ENV: &str = "MONETA_STARVATION_ROLE";
const SOCKET_ENV: &str = "MONETA_STARVATION_SOCKET";

fn need_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test needs root (the flooding client runs as nobody)"
    );
}

fn engine() -> Arc<Engine> {
    let mut c = Config::preset("null").unwrap();
    c.device.capacity_bytes = 64 << 20;
    let medium = Medium::anonymous(c.device.capacity_bytes).unwrap();
    Arc::new(Engine::start(c, medium, EngineOptions::default()).unwrap())
}

fn socket_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("daemon-starve-{name}-{}.sock", std::process::id()))
}

/// A connection that said hello: the reply.
fn hello(socket: &Path) -> std::io::Result<(UnixStream, Response)> {
    let s = UnixStream::connect(socket)?;
    s.set_read_timeout(Some(Duration::from_secs(20)))?;
    let frame = control::encode(&Request::Hello {
        version: PROTOCOL_VERSION,
        run: None,
    });
    sys::send_with_fds(s.as_raw_fd(), &frame, &[])?;
    let mut reader = FrameReader::new();
    // The channel's descriptors (if any) are closed as they drop: the
    // channel lives as long as the connection.
    let (body, _fds) = reader
        .next(s.as_raw_fd())
        .map_err(|e| std::io::Error::other(e.to_string()))?
        .ok_or_else(|| std::io::Error::other("closed"))?;
    let r = control::decode(&body).map_err(|e| std::io::Error::other(e.to_string()))?;
    Ok((s, r))
}

fn call(s: &UnixStream, r: &Request) -> Response {
    sys::send_with_fds(s.as_raw_fd(), &control::encode(r), &[]).unwrap();
    let mut reader = FrameReader::new();
    let (body, _) = reader.next(s.as_raw_fd()).unwrap().expect("a reply");
    control::decode(&body).unwrap()
}

/// Root's `moneta stats`: a channel and a stats request.
fn root_stats(socket: &Path) -> Result<u32, String> {
    let (s, r) = hello(socket).map_err(|e| e.to_string())?;
    if !matches!(r, Response::Channel(_)) {
        return Err(format!("hello: {r:?}"));
    }
    match call(
        &s,
        &Request::Stats {
            run: None,
            channel: None,
        },
    ) {
        Response::Stats(stats) => Ok(stats.channels_open),
        r => Err(format!("stats: {r:?}")),
    }
}

/// The flooding client (a child of this test binary, as nobody): FLOOD
/// connections, each with a hello; prints what it got, then holds them
/// until its stdin closes.
#[test]
fn flooder_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("flooder") {
        return;
    }
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).unwrap());
    let (mut held, mut channels, mut refused) = (Vec::new(), 0, 0);
    for _ in 0..FLOOD {
        match hello(&socket) {
            Ok((s, Response::Channel(_))) => {
                channels += 1;
                held.push(s);
            }
            Ok((s, _)) => {
                refused += 1;
                held.push(s);
            }
            Err(_) => refused += 1,
        }
    }
    println!("flooded channels={channels} refused={refused}");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    drop(held);
}

/// A child process, killed when dropped.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The daemon on a thread of this process, stopped when dropped.
struct Serving {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn threads_of_this_process() -> usize {
    std::fs::read_dir("/proc/self/task").unwrap().count()
}

#[test]
fn a_user_flooding_connections_cannot_starve_root() {
    need_root();
    let socket = socket_path("flood");
    let plane = Arc::new(ControlPlane::new(engine(), 0));
    // Open to every user, as `moneta up` makes it: the limits are what protect root.
    let options = DaemonOptions {
        socket_mode: 0o666,
        ..DaemonOptions::default()
    };
    let daemon = Daemon::bind_with(&socket, plane, options).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let _serving = Serving {
        socket: socket.clone(),
        stop,
        thread: Some(std::thread::spawn(move || daemon.run(&flag).unwrap())),
    };
    let threads_before = threads_of_this_process();
    let mut flooder = ChildGuard(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "flooder_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE_ENV, "flooder")
            .env(SOCKET_ENV, &socket)
            .uid(NOBODY)
            .gid(NOBODY)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let stdout = flooder.0.stdout.take().unwrap();
    let report = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        // libtest may print "test flooder_entry ... " before it on the line.
        .find_map(|l| l.find("flooded").map(|at| l[at..].to_string()))
        .expect("the flooder reports what it got");
    eprintln!("nobody: {report}");
    let field = |name: &str| -> usize {
        report
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
            .unwrap()
            .parse()
            .unwrap()
    };
    let limit = ConnectionLimits::default().per_uid;
    assert!(
        field("channels") > 0,
        "nobody got no channel at all: {report}"
    );
    assert!(
        field("channels") <= limit,
        "nobody holds more than its share: {report}"
    );
    // While the flood holds its connections, root is served, several times over.
    for _ in 0..8 {
        let open = root_stats(&socket).expect("root's stats during the flood");
        assert!(open as usize <= limit + 4, "channels open {open}");
    }
    let mut roots: Vec<UnixStream> = Vec::new();
    for i in 0..16 {
        let (s, r) = hello(&socket).unwrap();
        assert!(
            matches!(r, Response::Channel(_)),
            "root's channel {i}: {r:?}"
        );
        roots.push(s);
    }
    let threads = threads_of_this_process();
    eprintln!("threads: {threads_before} before the flood, {threads} during it");
    assert!(
        threads < threads_before + 16,
        "the daemon grew from {threads_before} to {threads} threads under {FLOOD} connections"
    );
    drop(roots);
    flooder.0.stdin.take().unwrap().write_all(b"\n").unwrap();
}

/// The daemon of the descriptor-limit test (a child of this test binary,
/// started at a low RLIMIT_NOFILE with its stderr in a file).
#[test]
fn limited_daemon_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("daemon") {
        return;
    }
    let socket = PathBuf::from(std::env::var_os(SOCKET_ENV).unwrap());
    let plane = Arc::new(ControlPlane::new(engine(), 0));
    let options = DaemonOptions {
        limits: ConnectionLimits {
            // More than its descriptors allow: the flood reaches EMFILE.
            max_connections: Some(4096),
            ..ConnectionLimits::default()
        },
        ..DaemonOptions::default()
    };
    let daemon = Daemon::bind_with(&socket, plane, options).unwrap();
    println!("ready");
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(120));
        flag.store(true, Ordering::Release);
    });
    daemon.run(&stop).unwrap();
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // After the command name: state is field 3, utime 14 and stime 15.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[test]
fn at_the_descriptor_limit_the_daemon_neither_spins_nor_floods_its_log() {
    need_root();
    const NOFILE: u64 = 256;
    const IDLE: usize = 600;
    let socket = socket_path("emfile");
    let log_path = socket.with_extension("log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "limited_daemon_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, "daemon")
        .env(SOCKET_ENV, &socket)
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child.
    unsafe {
        command.pre_exec(|| {
            let r = libc::rlimit {
                rlim_cur: NOFILE,
                rlim_max: NOFILE,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    let mut daemon = ChildGuard(command.spawn().unwrap());
    struct Cleanup(PathBuf, PathBuf);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
            let _ = std::fs::remove_file(&self.1);
        }
    }
    let _cleanup = Cleanup(socket.clone(), log_path.clone());
    let stdout = daemon.0.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains("ready"));
    assert!(ready, "the daemon did not start");
    root_stats(&socket).expect("root's stats before the flood");

    // Idle connections (no hello): the daemon runs out of descriptors.
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        match UnixStream::connect(&socket) {
            Ok(s) => idle.push(s),
            Err(_) => break,
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = daemon.0.id();
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    // Keep knocking while measuring: a new client every 10 ms.
    let mut knocks = Vec::new();
    while t0.elapsed() < Duration::from_secs(2) {
        if let Ok(s) = UnixStream::connect(&socket) {
            knocks.push(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let cpu = cpu_seconds(pid) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let log_bytes = std::fs::metadata(&log_path).unwrap().len();
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    eprintln!(
        "{} idle connections at RLIMIT_NOFILE {NOFILE}: daemon CPU {cpu:.3} s in {wall:.2} s, log {log_bytes} bytes",
        idle.len()
    );
    assert!(
        log_text.contains("Too many open files"),
        "the flood never reached the descriptor limit:\n{log_text}"
    );
    assert!(
        cpu < 0.25 * wall,
        "the daemon spun: {cpu:.3} s of CPU in {wall:.2} s"
    );
    assert!(
        log_bytes < 16 * 1024,
        "log grew to {log_bytes} bytes:\n{log_text}"
    );
    drop(idle);
    drop(knocks);
    // Once the flood is gone, root is served again.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match root_stats(&socket) {
            Ok(_) => break,
            Err(e) => {
                assert!(Instant::now() < deadline, "root after the flood: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
