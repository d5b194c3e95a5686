//! monetad's NBD listener out of descriptors (issue 39 item 7): a server
//! at RLIMIT_NOFILE 256 flooded with 600 idle connections neither spins
//! (its CPU over 2 s while a new client knocks every 10 ms stays under a
//! quarter of a core) nor floods its log, and once the flood is gone a new
//! client negotiates and reads again. The server is a child of this test
//! binary (its own descriptor limit), killed and removed on any exit.

mod common;

use common::{null, Client, Server, MIB};
use moneta_nbd::{proto, Limits};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const ROLE_ENV: &str = "MONETA_NBD_EMFILE_ROLE";
const NOFILE: u64 = 256;
const IDLE: usize = 600;

/// The server (a child of the test below, at a low RLIMIT_NOFILE): says
/// where it listens, then serves until its stdin closes.
#[test]
fn limited_server_entry() {
    if std::env::var(ROLE_ENV).as_deref() != Ok("server") {
        return;
    }
    let limits = Limits {
        // More than its descriptors allow: the flood reaches EMFILE.
        max_connections: 1000,
        ..Limits::default()
    };
    let s = Server::start_limited(null(16 * MIB), &["moneta"], limits);
    println!("ready {}", s.socket.display());
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
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
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

struct ChildGuard(std::process::Child, PathBuf);
impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let _ = std::fs::remove_file(&self.1);
    }
}

#[test]
fn out_of_descriptors_the_nbd_listener_neither_spins_nor_stays_down() {
    let log_path =
        std::env::temp_dir().join(format!("moneta-nbd-emfile-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args([
            "--exact",
            "limited_server_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ROLE_ENV, "server")
        .stdin(Stdio::piped())
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
    let mut server = ChildGuard(command.spawn().unwrap(), log_path.clone());
    let stdout = server.0.stdout.take().unwrap();
    let socket = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.strip_prefix("ready ").map(PathBuf::from))
        .expect("the server did not start");
    // Served before the flood.
    drop(Client::connect(&socket, "moneta"));

    let mut idle = Vec::new();
    for _ in 0..IDLE {
        match UnixStream::connect(&socket) {
            Ok(s) => idle.push(s),
            Err(_) => break,
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let pid = server.0.id();
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    let mut knocks = Vec::new();
    while t0.elapsed() < Duration::from_secs(2) {
        if let Ok(s) = UnixStream::connect(&socket) {
            knocks.push(s);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let cpu = cpu_seconds(pid) - cpu0;
    let wall = t0.elapsed().as_secs_f64();
    let log_text = std::fs::read_to_string(&log_path).unwrap_or_default();
    eprintln!(
        "{} idle NBD connections at RLIMIT_NOFILE {NOFILE}: server CPU {cpu:.3} s in \
         {wall:.2} s, log {} bytes",
        idle.len(),
        log_text.len()
    );
    assert!(
        log_text.contains("Too many open files"),
        "the flood never reached the descriptor limit:\n{log_text}"
    );
    assert!(
        cpu < 0.25 * wall,
        "the listener spun: {cpu:.3} s of CPU in {wall:.2} s"
    );
    assert!(log_text.len() < 16 * 1024, "the log grew:\n{log_text}");

    // The flood leaves: a new client negotiates and reads.
    drop(idle);
    drop(knocks);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        let mut c = Client::hello(&socket);
        c.option(proto::OPT_STRUCTURED_REPLY, &[]);
        let (kind, message) = c.go("moneta");
        if kind == proto::REP_ACK {
            break c;
        }
        assert!(
            Instant::now() < deadline,
            "GO still refused after the flood: {}",
            String::from_utf8_lossy(&message)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    c.request(proto::CMD_READ, 0, 7, 0, 4096, &[]);
    let (handle, error, _) = c.reply();
    assert_eq!((handle, error), (7, 0), "a read after the flood");
    server.0.stdin.take().unwrap().write_all(b"\n").unwrap();
}
