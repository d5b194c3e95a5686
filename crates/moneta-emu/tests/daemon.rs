//! monetad's control socket under malformed, unauthorized and hostile
//! messages: each gets a clear error and changes nothing; the daemon keeps
//! serving.

use moneta_emu::control::{self, ControlPlane, Request, Response, PROTOCOL_VERSION};
use moneta_emu::daemon::Daemon;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_emu::{sys, ErrorKind};
use moneta_model::config::Config;
use moneta_model::kernel::Rng;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An in-process daemon, stopped and its socket removed on drop.
struct Running {
    engine: Arc<Engine>,
    socket: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    fn start(name: &str, owner_uid: u32) -> Running {
        let mut c = Config::preset("null").unwrap();
        c.device.capacity_bytes = 64 << 20;
        let medium = Medium::anonymous(c.device.capacity_bytes).unwrap();
        let engine = Arc::new(Engine::start(c, medium, EngineOptions::default()).unwrap());
        let socket =
            std::env::temp_dir().join(format!("moneta-daemon-{}-{name}.sock", std::process::id()));
        let plane = Arc::new(ControlPlane::new(engine.clone(), owner_uid));
        let daemon = Daemon::bind(&socket, plane).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || daemon.run(&s).unwrap());
        Running {
            engine,
            socket,
            stop,
            thread: Some(thread),
        }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    fn channels_open(&self) -> u32 {
        self.engine.stats().unwrap().channels_open
    }

    fn wait_channels(&self, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.channels_open() != n {
            assert!(
                Instant::now() < deadline,
                "channels_open stuck at {}",
                self.channels_open()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn send_raw(s: &mut UnixStream, body: &[u8]) {
    s.write_all(&(body.len() as u32).to_le_bytes()).unwrap();
    s.write_all(body).unwrap();
}

/// The next reply and how many descriptors came with it.
fn reply(s: &UnixStream) -> (Response, usize) {
    let mut reader = control::FrameReader::new();
    let (body, fds) = reader.next(s.as_raw_fd()).unwrap().expect("a reply");
    (control::decode(&body).unwrap(), fds.len())
}

fn call(s: &mut UnixStream, r: &Request) -> (Response, usize) {
    sys::send_with_fds(s.as_raw_fd(), &control::encode(r), &[]).unwrap();
    reply(s)
}

fn error_kind(r: &Response) -> ErrorKind {
    match r {
        Response::Error { kind, .. } => *kind,
        other => panic!("expected an error, got {other:?}"),
    }
}

#[test]
fn malformed_messages_get_errors_and_change_nothing() {
    let d = Running::start("malformed", 0);
    let mut s = d.connect();
    send_raw(&mut s, b"{not json");
    assert_eq!(error_kind(&reply(&s).0), ErrorKind::Protocol);
    send_raw(
        &mut s,
        br#"{"op":"grant-raw","start":0,"len":4096,"write":true}"#,
    );
    let (r, _) = reply(&s);
    assert!(
        matches!(&r, Response::Error { message, .. } if message.contains("hello first")),
        "{r:?}"
    );
    let (r, _) = call(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION + 1,
            run: None,
        },
    );
    assert_eq!(error_kind(&r), ErrorKind::Protocol);
    assert_eq!(d.channels_open(), 0, "nothing was opened");

    let (r, fds) = call(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            run: None,
        },
    );
    assert!(matches!(r, Response::Channel(_)) && fds == 2, "{r:?}");
    let (r, _) = call(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            run: None,
        },
    );
    assert_eq!(
        error_kind(&r),
        ErrorKind::Protocol,
        "one channel per connection"
    );
    for bad in [
        Request::GrantRaw {
            start: 0,
            len: 0,
            write: true,
        },
        Request::GrantRaw {
            start: 60 << 20,
            len: 8 << 20,
            write: true,
        },
        Request::GrantRaw {
            start: u64::MAX,
            len: 2,
            write: false,
        },
    ] {
        assert_eq!(
            error_kind(&call(&mut s, &bad).0),
            ErrorKind::Protocol,
            "{bad:?}"
        );
    }
    let (r, _) = call(
        &mut s,
        &Request::Resolve {
            addr: 0,
            len: 512,
            write: false,
        },
    );
    assert_eq!(
        error_kind(&r),
        ErrorKind::Unauthorized,
        "nothing granted yet"
    );
    assert_eq!(d.engine.stats().unwrap().permission_records_in_use, 0);
    assert_eq!(d.channels_open(), 1);

    // An oversized frame desynchronizes the stream: an error, then hang-up.
    s.write_all(&(1u32 << 30).to_le_bytes()).unwrap();
    assert_eq!(error_kind(&reply(&s).0), ErrorKind::Protocol);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty(), "the daemon hung up");
    d.wait_channels(0);
}

#[test]
fn only_the_owner_takes_raw_grants() {
    // The socket path is covered end to end (another uid) by the CLI tests;
    // here the control plane is asked directly with a stranger's credentials.
    let d = Running::start("owner", 4242);
    let plane = ControlPlane::new(d.engine.clone(), 4242);
    let mut stranger = control::Session::new(sys::PeerCredentials {
        pid: 1,
        uid: 65534,
        gid: 65534,
    });
    let (r, memory) = plane.handle(
        &mut stranger,
        Request::Hello {
            version: PROTOCOL_VERSION,
            run: None,
        },
    );
    assert!(
        matches!(r, Response::Channel(_)) && memory.is_some(),
        "anyone may open a channel"
    );
    let (r, _) = plane.handle(
        &mut stranger,
        Request::GrantRaw {
            start: 0,
            len: 4096,
            write: true,
        },
    );
    assert!(
        matches!(&r, Response::Error { kind: ErrorKind::Unauthorized, message, .. } if message.contains("uid 65534")),
        "{r:?}"
    );
    assert_eq!(d.engine.stats().unwrap().permission_records_in_use, 0);
    let mut owner = control::Session::new(sys::PeerCredentials {
        pid: 1,
        uid: 4242,
        gid: 0,
    });
    plane.handle(
        &mut owner,
        Request::Hello {
            version: PROTOCOL_VERSION,
            run: None,
        },
    );
    let (r, _) = plane.handle(
        &mut owner,
        Request::GrantRaw {
            start: 0,
            len: 4096,
            write: true,
        },
    );
    assert!(matches!(r, Response::Granted(_)), "{r:?}");
    plane.end(&mut stranger);
    plane.end(&mut owner);
    d.wait_channels(0);
}

#[test]
fn random_byte_streams_do_not_hurt_the_daemon() {
    let d = Running::start("fuzz", 0);
    let mut rng = Rng::new(99);
    for round in 0..200 {
        let mut s = d.connect();
        let len = rng.below(300) as usize;
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
        if round % 3 == 0 && len >= 4 {
            // A plausible length prefix, so the body reaches the JSON decoder.
            let body = (len - 4) as u32;
            bytes[..4].copy_from_slice(&body.to_le_bytes());
        }
        let _ = s.write_all(&bytes);
        drop(s);
    }
    let mut s = d.connect();
    let (r, fds) = call(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            run: None,
        },
    );
    assert!(matches!(r, Response::Channel(_)) && fds == 2);
    let (r, _) = call(
        &mut s,
        &Request::GrantRaw {
            start: 0,
            len: 1 << 20,
            write: true,
        },
    );
    assert!(matches!(r, Response::Granted(_)), "{r:?}");
    drop(s);
    d.wait_channels(0);
}

#[test]
fn open_file_takes_the_attached_descriptor_and_checks_it() {
    let d = Running::start("open-file", 0);
    let mut s = d.connect();
    let (r, _) = call(
        &mut s,
        &Request::Hello {
            version: PROTOCOL_VERSION,
            run: None,
        },
    );
    assert!(matches!(r, Response::Channel(_)), "{r:?}");
    let (r, _) = call(&mut s, &Request::OpenFile {});
    assert!(
        matches!(&r, Response::Error { kind: ErrorKind::Protocol, message, .. } if message.contains("descriptor")),
        "{r:?}"
    );
    // The descriptor arrives (SCM_RIGHTS) and is checked: this device's
    // medium is anonymous memory, so no file can be on it.
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    sys::send_with_fds(
        s.as_raw_fd(),
        &control::encode(&Request::OpenFile {}),
        &[file.as_raw_fd()],
    )
    .unwrap();
    let (r, _) = reply(&s);
    assert!(
        matches!(&r, Response::Error { kind: ErrorKind::Unauthorized, message, .. } if message.contains("anonymous")),
        "{r:?}"
    );
    // Descriptors sent with other requests are ignored.
    sys::send_with_fds(
        s.as_raw_fd(),
        &control::encode(&Request::Stats {
            run: None,
            channel: None,
        }),
        &[file.as_raw_fd()],
    )
    .unwrap();
    assert!(matches!(reply(&s).0, Response::Stats(_)));
    for bad in [
        Request::MapFile {
            file_id: 1,
            offset: 0,
            len: 4096,
        },
        Request::CloseFile { file_id: 1 },
    ] {
        assert_eq!(
            error_kind(&call(&mut s, &bad).0),
            ErrorKind::Protocol,
            "{bad:?}"
        );
    }
    assert_eq!(d.engine.stats().unwrap().permission_records_in_use, 0);
}
