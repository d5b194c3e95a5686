//! What the NBD integration tests share: a device and its server in this
//! process, a minimal NBD client, seeded random bytes, client tools.
// Each test binary uses a part of it.
#![allow(dead_code)]

use moneta_emu::control::ControlPlane;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_model::config::Config;
use moneta_nbd::connection::ServerCounters;
use moneta_nbd::proto;
use moneta_nbd::{Export, Limits, Listen, NbdServer};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;

pub fn seed() -> u64 {
    moneta_model::kernel::rng::seed_from_env("MONETA_NBD_SEED")
}

pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(n);
        v
    }
}

/// A device and its NBD server on a Unix socket in a private directory;
/// everything stops and is removed on drop, pass or fail.
pub struct Server {
    pub dir: PathBuf,
    pub socket: PathBuf,
    pub plane: Arc<ControlPlane>,
    pub counters: Arc<ServerCounters>,
    pub stop: Arc<AtomicBool>,
    pub thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(config: Config, exports: &[&str]) -> Server {
        Server::start_on(config, exports, false, Limits::default())
    }

    pub fn start_limited(config: Config, exports: &[&str], limits: Limits) -> Server {
        Server::start_on(config, exports, false, limits)
    }

    /// With `image`, the medium is the file `device.img` in the server's
    /// directory.
    pub fn start_on(config: Config, exports: &[&str], image: bool, limits: Limits) -> Server {
        let capacity = config.device.capacity_bytes;
        let dir = std::env::temp_dir().join(format!(
            "moneta-nbd-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let socket = dir.join("nbd.sock");
        let medium = if image {
            Medium::image(&dir.join("device.img"), capacity).unwrap()
        } else {
            Medium::anonymous(capacity).unwrap()
        };
        let engine = Arc::new(Engine::start(config, medium, EngineOptions::default()).unwrap());
        // SAFETY: geteuid has no preconditions.
        let plane = Arc::new(ControlPlane::new(engine, unsafe { libc::geteuid() }));
        let exports = exports
            .iter()
            .map(|s| Export::parse(s, capacity).unwrap())
            .collect();
        let mut server =
            NbdServer::bind(plane.clone(), exports, &[Listen::Unix(socket.clone())]).unwrap();
        server.set_limits(limits).unwrap();
        let counters = server.counters.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || server.run(&flag));
        Server {
            dir,
            socket,
            plane,
            counters,
            stop,
            thread: Some(thread),
        }
    }

    pub fn uri(&self, export: &str) -> String {
        moneta_nbd::unix_uri(export, &self.socket)
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Distinct per server of this process.
pub fn rand_suffix() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

pub fn null(capacity: u64) -> Config {
    let mut c = Config::preset("null").unwrap();
    c.device.capacity_bytes = capacity;
    c
}

/// Run a client tool with a time limit; its output, or a panic with it.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new("timeout")
        .arg("120")
        .arg(program)
        .args(args)
        // Tools that drop files in their working directory (fio's verify
        // state) drop them in /tmp, not in the source tree.
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e} (make setup installs it)"));
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\n{}",
        text,
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

pub fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
}

/// A minimal client: fixed newstyle, structured replies, GO.
pub struct Client {
    pub s: UnixStream,
}

impl Client {
    pub fn connect(socket: &Path, export: &str) -> Client {
        let mut c = Client::hello(socket);
        c.option(proto::OPT_STRUCTURED_REPLY, &[]);
        let (kind, message) = c.go(export);
        assert_eq!(
            kind,
            proto::REP_ACK,
            "GO refused: {}",
            String::from_utf8_lossy(&message)
        );
        c
    }

    /// Connected, the server's greeting read and the client's flags sent.
    pub fn hello(socket: &Path) -> Client {
        let mut s = UnixStream::connect(socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        s.write_all(&3u32.to_be_bytes()).unwrap();
        Client { s }
    }

    /// NBD_OPT_GO: the final reply's type and data.
    pub fn go(&mut self, export: &str) -> (u32, Vec<u8>) {
        let mut go = proto::length_prefixed(None, export);
        go.extend_from_slice(&0u16.to_be_bytes());
        self.option_data(proto::OPT_GO, &go)
    }

    /// Send an option and read replies up to the final one; its type.
    pub fn option(&mut self, option: u32, data: &[u8]) -> u32 {
        self.option_data(option, data).0
    }

    /// As `option`, with the final reply's data.
    pub fn option_data(&mut self, option: u32, data: &[u8]) -> (u32, Vec<u8>) {
        self.s
            .write_all(&proto::option_request(option, data))
            .unwrap();
        loop {
            let mut h = [0u8; 20];
            self.s.read_exact(&mut h).unwrap();
            let (_, kind, len) = proto::parse_option_reply(&h).unwrap();
            let mut d = vec![0u8; len as usize];
            self.s.read_exact(&mut d).unwrap();
            if kind != proto::REP_INFO
                && kind != proto::REP_SERVER
                && kind != proto::REP_META_CONTEXT
            {
                return (kind, d);
            }
        }
    }

    pub fn request(
        &mut self,
        kind: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) {
        let mut m = proto::encode_request(&proto::RequestHeader {
            flags,
            kind,
            cookie,
            offset,
            length,
        })
        .to_vec();
        m.extend_from_slice(payload);
        self.s.write_all(&m).unwrap();
    }

    /// Read one reply: (cookie, error, data).
    pub fn reply(&mut self) -> (u64, u32, Vec<u8>) {
        let mut magic = [0u8; 4];
        self.s.read_exact(&mut magic).unwrap();
        match u32::from_be_bytes(magic) {
            proto::SIMPLE_REPLY_MAGIC => {
                let mut r = [0u8; 12];
                self.s.read_exact(&mut r).unwrap();
                let error = u32::from_be_bytes(r[0..4].try_into().unwrap());
                (
                    u64::from_be_bytes(r[4..12].try_into().unwrap()),
                    error,
                    Vec::new(),
                )
            }
            proto::STRUCTURED_REPLY_MAGIC => {
                let mut r = [0u8; 16];
                self.s.read_exact(&mut r).unwrap();
                let kind = u16::from_be_bytes(r[2..4].try_into().unwrap());
                let cookie = u64::from_be_bytes(r[4..12].try_into().unwrap());
                let len = u32::from_be_bytes(r[12..16].try_into().unwrap());
                let mut d = vec![0u8; len as usize];
                self.s.read_exact(&mut d).unwrap();
                match kind {
                    proto::REPLY_TYPE_OFFSET_DATA => (cookie, 0, d[8..].to_vec()),
                    proto::REPLY_TYPE_ERROR => (
                        cookie,
                        u32::from_be_bytes(d[0..4].try_into().unwrap()),
                        Vec::new(),
                    ),
                    _ => (cookie, 0, d),
                }
            }
            m => panic!("reply magic {m:#x}"),
        }
    }
}

/// Look every 10 ms, for at most `bound`, until `done`; how long it took.
pub fn wait_until(bound: Duration, mut done: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < bound {
        if done() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    done().then(|| t.elapsed())
}
