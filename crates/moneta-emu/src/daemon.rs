//! `monetad` (`moneta serve`): the device and its control plane behind a Unix
//! socket (DESIGN "Processes in emulation"). A connection owns at most one
//! channel, freed when the connection ends for any reason, including the
//! client being killed mid-request.
//!
//! No local user can starve the others (issue 39):
//! - The socket's mode and group are the operator's choice
//!   ([`DaemonOptions`]); the default is owner-only (0600). `moneta up`
//!   opens it to every local user (0666), whose files the kernel polices.
//! - Control connections are bounded: in total, per uid, and with a share
//!   only root and the daemon's owner may use ([`ConnectionLimits`]). A
//!   connection over a bound gets one error frame naming it and is closed.
//!   Channels are bounded per uid the same way (`ControlPlane`).
//! - Connections are not threads: one thread polls the listener and every
//!   connection (non-blocking sockets) and hands each complete request to a
//!   small pool of [`WORKERS`] (a request may take seconds: `open-file`
//!   flushes the file). A uid other than root's and the owner's has at most
//!   [`WORKERS_PER_UID`] of them at a time, so a slow flood never holds them
//!   all.
//! - Running out of descriptors pauses the listener instead of spinning
//!   ([`crate::accept`]); lines a client can cause are rate-limited
//!   ([`crate::log_limit`]).

use crate::accept::{open_files_limit, Acceptor};
use crate::control::{self, ControlPlane, FrameReader, Request, Response, Session};
use crate::log_limit::LogLimit;
use crate::sys::{self, PeerCredentials};
use moneta_abi::error::{EmuError, ErrorKind};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

/// Threads that answer requests.
pub const WORKERS: usize = 4;
/// Of which one uid other than root and the owner may hold at a time.
pub const WORKERS_PER_UID: usize = 2;
/// Descriptors kept out of the connections' reach (the device, granted
/// files, NBD, logs).
const DESCRIPTOR_MARGIN: u64 = 64;
/// A reply the client does not take within this is its hang-up.
const REPLY_TIMEOUT_MS: i32 = 5_000;

/// How many control connections the daemon holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// All connections; None: the descriptor limit less a margin.
    pub max_connections: Option<usize>,
    /// Connections of one uid other than root's and the owner's.
    pub per_uid: usize,
    /// Connections only root and the owner may take.
    pub reserve: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            max_connections: None,
            per_uid: 256,
            reserve: 32,
        }
    }
}

/// How the daemon's socket is made and what it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonOptions {
    /// The socket file's mode (connecting needs write permission).
    pub socket_mode: u32,
    /// Its group (None: the daemon's).
    pub socket_group: Option<u32>,
    pub limits: ConnectionLimits,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        DaemonOptions {
            socket_mode: 0o600,
            socket_group: None,
            limits: ConnectionLimits::default(),
        }
    }
}

/// A listening daemon. `run` serves until `stop` is set.
pub struct Daemon {
    listener: UnixListener,
    path: PathBuf,
    plane: Arc<ControlPlane>,
    limits: ConnectionLimits,
}

impl Daemon {
    /// Listen on `path`, owner-only (0600), with the default limits.
    pub fn bind(path: &Path, plane: Arc<ControlPlane>) -> Result<Daemon, EmuError> {
        Self::bind_with(path, plane, DaemonOptions::default())
    }

    /// Listen on `path`. A leftover socket file nobody listens on is
    /// replaced; a live one is an error (another daemon serves there).
    pub fn bind_with(
        path: &Path,
        plane: Arc<ControlPlane>,
        options: DaemonOptions,
    ) -> Result<Daemon, EmuError> {
        if options.socket_mode & !0o777 != 0 {
            return Err(EmuError::new(
                ErrorKind::Config,
                format!(
                    "socket mode {:o}: expected permission bits (0 ..= 0777)",
                    options.socket_mode
                ),
            ));
        }
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(EmuError::new(
                    ErrorKind::Config,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(EmuError::new(
                    ErrorKind::Config,
                    format!("a daemon is already serving on {}", path.display()),
                ));
            }
            std::fs::remove_file(path).map_err(|e| EmuError::io("removing a stale socket", e))?;
        }
        // Bound under a temporary name, given its group and mode, then
        // renamed into place: nobody connects before the mode holds.
        static BOUND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = BOUND.fetch_add(1, Ordering::Relaxed);
        let temporary = path.with_file_name(format!(".monetad-{}-{n}.sock", std::process::id()));
        let _ = std::fs::remove_file(&temporary);
        let listener = UnixListener::bind(&temporary)
            .map_err(|e| EmuError::io(&format!("listening on {}", temporary.display()), e))?;
        let made = (|| {
            if let Some(gid) = options.socket_group {
                std::os::unix::fs::chown(&temporary, None, Some(gid))
                    .map_err(|e| EmuError::io("setting the socket's group", e))?;
            }
            std::fs::set_permissions(
                &temporary,
                std::fs::Permissions::from_mode(options.socket_mode),
            )
            .map_err(|e| EmuError::io("setting the socket's mode", e))?;
            listener
                .set_nonblocking(true)
                .map_err(|e| EmuError::io("making the socket non-blocking", e))?;
            std::fs::rename(&temporary, path)
                .map_err(|e| EmuError::io(&format!("moving the socket to {}", path.display()), e))
        })();
        if let Err(e) = made {
            let _ = std::fs::remove_file(&temporary);
            return Err(e);
        }
        Ok(Daemon {
            listener,
            path: path.to_path_buf(),
            plane,
            limits: options.limits,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serve until `stop` is set (checked every 100 ms).
    pub fn run(&self, stop: &AtomicBool) -> Result<(), EmuError> {
        let wake = Wake::new()?;
        let (done_tx, done_rx) = mpsc::channel::<Done>();
        let (job_tx, job_rx) = mpsc::channel::<Job>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let mut workers = Vec::with_capacity(WORKERS);
        for _ in 0..WORKERS {
            let (plane, jobs, done, wake) = (
                self.plane.clone(),
                job_rx.clone(),
                done_tx.clone(),
                wake.clone(),
            );
            let spawned = std::thread::Builder::new()
                .name("moneta-control".into())
                .spawn(move || work(&plane, &jobs, &done, &wake))
                .map_err(|e| EmuError::io("starting a control worker", e))?;
            workers.push(spawned);
        }
        let mut server = Server {
            plane: &self.plane,
            owner_uid: self.plane.owner_uid(),
            limits: self.limits,
            max_connections: self.limits.max_connections.unwrap_or_else(|| {
                open_files_limit().saturating_sub(DESCRIPTOR_MARGIN).max(8) as usize
            }),
            connections: HashMap::new(),
            next_id: 0,
            busy: HashMap::new(),
            per_uid: HashMap::new(),
            jobs: job_tx,
            acceptor: Acceptor::new("control socket"),
            refusals: LogLimit::new(),
        };
        while !stop.load(Ordering::Acquire) {
            server.turn(&self.listener, &wake, &done_rx);
        }
        // Workers end when the job queue closes; each connection's channel
        // is freed as it is dropped.
        drop(server.jobs);
        for w in workers {
            let _ = w.join();
        }
        while let Ok(done) = done_rx.try_recv() {
            let mut session = done.session;
            self.plane.end(&mut session);
        }
        for (_, mut c) in server.connections.drain() {
            if let Some(mut session) = c.session.take() {
                self.plane.end(&mut session);
            }
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The workers' doorbell to the polling thread (an eventfd).
struct Wake(OwnedFd);

impl Wake {
    fn new() -> Result<Arc<Wake>, EmuError> {
        // SAFETY: eventfd returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(EmuError::io("eventfd", io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor nothing else owns.
        Ok(Arc::new(Wake(unsafe {
            std::os::fd::FromRawFd::from_raw_fd(fd)
        })))
    }

    fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    fn drain(&self) {
        let mut n: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from our non-blocking eventfd.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

/// One client connection, polled by the serving thread.
struct Connection {
    stream: Arc<UnixStream>,
    reader: FrameReader,
    peer: PeerCredentials,
    /// None while a worker answers its request.
    session: Option<Session>,
    /// A request read while its uid had all its workers.
    waiting: Option<(Vec<u8>, Vec<OwnedFd>)>,
}

/// A request handed to a worker.
struct Job {
    id: u64,
    stream: Arc<UnixStream>,
    session: Session,
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
}

/// A worker's answer: the session back, and whether the connection lives.
struct Done {
    id: u64,
    session: Session,
    keep: bool,
}

/// The serving thread's state.
struct Server<'a> {
    plane: &'a ControlPlane,
    owner_uid: u32,
    limits: ConnectionLimits,
    max_connections: usize,
    connections: HashMap<u64, Connection>,
    next_id: u64,
    /// Workers held, by uid.
    busy: HashMap<u32, usize>,
    /// Connections, by uid.
    per_uid: HashMap<u32, usize>,
    jobs: mpsc::Sender<Job>,
    acceptor: Acceptor,
    refusals: LogLimit,
}

impl Server<'_> {
    fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner_uid
    }

    /// One poll of the listener, the doorbell and every idle connection.
    fn turn(&mut self, listener: &UnixListener, wake: &Wake, done: &mpsc::Receiver<Done>) {
        let paused = self.acceptor.paused_for();
        let mut fds = vec![libc::pollfd {
            fd: wake.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let listening = paused.is_none();
        if listening {
            fds.push(pollin(listener.as_raw_fd()));
        }
        let first_connection = fds.len();
        let mut ids = Vec::with_capacity(self.connections.len());
        for (&id, c) in &self.connections {
            if c.session.is_some() && c.waiting.is_none() {
                fds.push(pollin(c.stream.as_raw_fd()));
                ids.push(id);
            }
        }
        let timeout = paused.map_or(100, |d| (d.as_millis() as i32).clamp(1, 100));
        // SAFETY: `fds` is a valid array of pollfd for the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if ready <= 0 {
            return;
        }
        if fds[0].revents != 0 {
            wake.drain();
        }
        while let Ok(d) = done.try_recv() {
            self.finished(d);
        }
        if listening && fds[1].revents != 0 {
            self.accept(listener);
        }
        for (pfd, id) in fds[first_connection..].iter().zip(ids) {
            if pfd.revents != 0 {
                self.read(id);
            }
        }
    }

    fn accept(&mut self, listener: &UnixListener) {
        loop {
            match listener.accept() {
                Ok((stream, _)) => self.admit(stream),
                Err(e) => {
                    if self.acceptor.failed(listener.as_raw_fd(), &e) {
                        return;
                    }
                    if e.kind() != io::ErrorKind::Interrupted
                        && e.kind() != io::ErrorKind::ConnectionAborted
                    {
                        return;
                    }
                }
            }
        }
    }

    /// Take a new connection, or tell it which bound it hit and close it.
    fn admit(&mut self, stream: UnixStream) {
        let peer = match sys::peer_credentials(stream.as_raw_fd()) {
            Ok(p) => p,
            Err(e) => {
                self.refusals
                    .log(|| format!("monetad: no peer credentials: {e}"));
                return;
            }
        };
        let uid_count = self.per_uid.get(&peer.uid).copied().unwrap_or(0);
        let unprivileged: usize = self
            .per_uid
            .iter()
            .filter(|(&u, _)| !self.privileged(u))
            .map(|(_, &n)| n)
            .sum();
        let total = self.connections.len();
        let refused = if total >= self.max_connections {
            Some(format!(
                "monetad holds its limit of {} control connections",
                self.max_connections
            ))
        } else if !self.privileged(peer.uid) {
            if uid_count >= self.limits.per_uid {
                Some(format!(
                    "uid {} already has {} control connections, the most one user may hold",
                    peer.uid, self.limits.per_uid
                ))
            } else if unprivileged + self.limits.reserve >= self.max_connections {
                Some(format!(
                    "the other users hold every control connection but the {} kept for root and the daemon's owner",
                    self.limits.reserve
                ))
            } else {
                None
            }
        } else {
            None
        };
        if let Some(why) = refused {
            self.refusals.log(|| {
                format!(
                    "monetad: refused a connection from pid {} (uid {}): {why}",
                    peer.pid, peer.uid
                )
            });
            let e = EmuError::new(ErrorKind::NoChannel, why);
            // Best effort: a client that does not read is closed all the same.
            let _ = stream.set_nonblocking(true);
            let _ = sys::send_with_fds(
                stream.as_raw_fd(),
                &control::encode(&Response::error(e)),
                &[],
            );
            return;
        }
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        self.next_id += 1;
        *self.per_uid.entry(peer.uid).or_default() += 1;
        self.connections.insert(
            self.next_id,
            Connection {
                stream: Arc::new(stream),
                reader: FrameReader::new(),
                peer,
                session: Some(Session::new(peer)),
                waiting: None,
            },
        );
    }

    /// Read what a connection sent: a request goes to a worker.
    fn read(&mut self, id: u64) {
        let Some(c) = self.connections.get_mut(&id) else {
            return;
        };
        let read = c.reader.next(c.stream.as_raw_fd());
        match read {
            Ok(Some(frame)) => self.dispatch(id, frame),
            Ok(None) => self.close(id),
            Err(e) if e.errno == Some(libc::EAGAIN) => {}
            Err(e) => {
                // The stream is out of step (or gone): say why and hang up.
                let _ = reply(&c.stream, &Response::error(e), &[]);
                self.close(id);
            }
        }
    }

    fn dispatch(&mut self, id: u64, frame: (Vec<u8>, Vec<OwnedFd>)) {
        let Some(c) = self.connections.get_mut(&id) else {
            return;
        };
        let uid = c.peer.uid;
        let busy = self.busy.get(&uid).copied().unwrap_or(0);
        if uid != 0 && uid != self.owner_uid && busy >= WORKERS_PER_UID {
            c.waiting = Some(frame);
            return;
        }
        let Some(session) = c.session.take() else {
            c.waiting = Some(frame);
            return;
        };
        *self.busy.entry(uid).or_default() += 1;
        let (body, fds) = frame;
        let job = Job {
            id,
            stream: c.stream.clone(),
            session,
            body,
            fds,
        };
        if let Err(mpsc::SendError(job)) = self.jobs.send(job) {
            let mut session = job.session;
            self.plane.end(&mut session);
        }
    }

    /// A worker answered: the connection waits for its next request, or
    /// ends; a request another of its uid's connections read meanwhile
    /// may now go.
    fn finished(&mut self, d: Done) {
        let Some(c) = self.connections.get_mut(&d.id) else {
            let mut session = d.session;
            self.plane.end(&mut session);
            return;
        };
        let uid = c.peer.uid;
        if let Some(n) = self.busy.get_mut(&uid) {
            *n = n.saturating_sub(1);
        }
        c.session = Some(d.session);
        if !d.keep {
            self.close(d.id);
        } else {
            // Requests may already sit in the reader's buffer.
            self.read(d.id);
        }
        let waiting: Vec<u64> = self
            .connections
            .iter()
            .filter(|(_, c)| c.peer.uid == uid && c.waiting.is_some() && c.session.is_some())
            .map(|(&id, _)| id)
            .collect();
        for id in waiting {
            if let Some(frame) = self.connections.get_mut(&id).and_then(|c| c.waiting.take()) {
                self.dispatch(id, frame);
            }
        }
    }

    fn close(&mut self, id: u64) {
        let Some(mut c) = self.connections.remove(&id) else {
            return;
        };
        if let Some(n) = self.per_uid.get_mut(&c.peer.uid) {
            *n -= 1;
            if *n == 0 {
                self.per_uid.remove(&c.peer.uid);
            }
        }
        if let Some(mut session) = c.session.take() {
            self.plane.end(&mut session);
        }
    }
}

fn pollin(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// A control request slower than this is logged.
const SLOW_REQUEST: Duration = Duration::from_secs(1);

/// The name of a request's kind (its JSON `op`), for the log.
fn request_kind(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("op")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "malformed".into())
}

/// Send a reply on a non-blocking socket, waiting (bounded) for room.
fn reply(stream: &UnixStream, response: &Response, fds: &[i32]) -> io::Result<()> {
    let fd = stream.as_raw_fd();
    let frame = control::encode(response);
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLOUT,
        revents: 0,
    };
    // A reply fits the socket's buffer unless the client stopped reading.
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut pfd, 1, REPLY_TIMEOUT_MS) };
    if ready <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client does not take its replies",
        ));
    }
    sys::send_with_fds(fd, &frame, fds)
}

/// A worker: answer requests until the queue closes.
fn work(
    plane: &ControlPlane,
    jobs: &Mutex<mpsc::Receiver<Job>>,
    done: &mpsc::Sender<Done>,
    wake: &Wake,
) {
    static SLOW: LogLimit = LogLimit::new();
    loop {
        let job = {
            let Ok(rx) = jobs.lock() else { return };
            match rx.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let Job {
            id,
            stream,
            mut session,
            body,
            fds,
        } = job;
        // Only open-file carries a descriptor (the first); any others are
        // closed when they drop.
        let fd = fds.into_iter().next();
        let started = std::time::Instant::now();
        let (response, memory) = match control::decode::<Request>(&body) {
            Ok(request) => plane.handle_with_fd(&mut session, request, fd),
            Err(e) => (Response::error(e), None),
        };
        let took = started.elapsed();
        if took >= SLOW_REQUEST {
            // A client gives up after MONETA_CONTROL_TIMEOUT_MS (30 s): the
            // log says which request kept it waiting.
            SLOW.log(|| {
                format!(
                    "monetad: a {} request from pid {} took {:.1} s",
                    request_kind(&body),
                    session.peer.pid,
                    took.as_secs_f64()
                )
            });
        }
        let attach: Vec<i32> = memory
            .iter()
            .flat_map(|m| m.fds().map(|fd| fd.as_raw_fd()))
            .collect();
        let keep = reply(&stream, &response, &attach).is_ok();
        if done.send(Done { id, session, keep }).is_err() {
            return;
        }
        wake.ring();
    }
}
