//! The NBD server: listeners, negotiation, and the transmission phase on
//! the emulated device.
//!
//! Each connection is a client of the device like any other process: it
//! opens its own channel on the control plane (`Moneta::attach`), takes a
//! raw grant for its export's range, and turns NBD commands into channel
//! requests, so every read and write is timed by the device model on the
//! wall clock and moves real bytes. A reader thread parses requests and
//! submits them (a command is split into pieces of at most [`PIECE`] so
//! many are in flight); a completer thread waits for the pieces in
//! submission order and writes the replies, so replies of one connection
//! have a single writer. `FLUSH` is queued behind everything submitted
//! before it and makes the medium durable (msync of an image); `FUA`
//! writes do the same before their reply. Exports are ranges of the one
//! device, shared by all connections (`NBD_FLAG_CAN_MULTI_CONN`: the
//! device has no cache, and a flush syncs the whole medium).
//!
//! Limits ([`Limits`]) keep hostile or forgetful clients from taking the
//! device from everyone else: at most `max_connections` connections at a
//! time, never more than [`MAX_CONNECTIONS_CAP`] so that
//! [`LOCAL_CHANNEL_RESERVE`] channels always stay with local clients
//! (`moneta stats`, `moneta bench --daemon`, the shim); a client over the
//! limit is refused at `NBD_OPT_GO` with `NBD_REP_ERR_POLICY` and a message
//! naming the limit. Negotiation has one deadline for all of it, not one
//! per read; a connection with no request for `idle_timeout` is closed; and
//! a client that hangs up has the requests it queued dropped instead of
//! run (only those already on the device finish, at most a channel's tags).

use crate::proto::{self, ProtoError, RequestHeader};
use moneta::{CompletionMode, Io, Moneta};
use moneta_emu::channel::CHANNELS;
use moneta_emu::control::ControlPlane;
use moneta_model::units::{parse_bytes, Op};
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest channel request one NBD command is split into.
pub const PIECE: u64 = 128 << 10;

/// Bytes of requests read from a client per system call at most.
const INPUT_BYTES: usize = 256 << 10;

/// Channels NBD connections never take: local clients of the daemon
/// (`moneta stats`, `moneta bench --daemon`, the shim) always find one.
pub const LOCAL_CHANNEL_RESERVE: usize = 16;

/// The most connections a server may be configured for: every channel but
/// the engine's own (channel 0) and the local reserve. Each connection
/// holds one channel.
pub const MAX_CONNECTIONS_CAP: usize = CHANNELS - 1 - LOCAL_CHANNEL_RESERVE;

/// Clients over the connection limit being told so at the same time, at
/// most; beyond this a new client is closed without a word (a flood).
const REFUSING_MAX: usize = 16;

/// How often at most the reply writer probes a quiet socket for a hang-up.
const HANG_UP_PROBE: Duration = Duration::from_millis(50);

/// What a server lets one client hold, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections at a time (negotiating or transmitting), 1..=[`MAX_CONNECTIONS_CAP`].
    pub max_connections: usize,
    /// The whole negotiation, from accept to the end of `NBD_OPT_GO`.
    pub negotiation_deadline: Duration,
    /// After GO, a connection with no request for this long (and none
    /// unanswered) is closed. None: never.
    pub idle_timeout: Option<Duration>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_connections: 64,
            negotiation_deadline: Duration::from_secs(30),
            // A mount over nbdfuse holds its one connection however long
            // it stays quiet (monetad's --nbd-idle-timeout-s sets one).
            idle_timeout: None,
        }
    }
}

impl Limits {
    fn check(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.max_connections > MAX_CONNECTIONS_CAP {
            return Err(format!(
                "NBD connection limit {}: expected 1..={MAX_CONNECTIONS_CAP} (the device has {CHANNELS} channels; channel 0 is the engine's and {LOCAL_CHANNEL_RESERVE} stay with local clients)",
                self.max_connections
            ));
        }
        if self.negotiation_deadline.is_zero() {
            return Err("NBD negotiation deadline: must be more than 0".into());
        }
        if self.idle_timeout.is_some_and(|t| t.is_zero()) {
            return Err("NBD idle timeout: None (never) or more than 0".into());
        }
        Ok(())
    }
}

/// Commands parsed but not yet answered, per connection, beyond which the
/// reader waits (a client that sends without reading replies).
const QUEUE_BOUND: usize = 1024;

/// A named range of the device served over NBD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub start: u64,
    pub size: u64,
    pub read_only: bool,
}

impl Export {
    /// Parse `NAME[:START:LEN][:ro]` (sizes in bytes or with K/M/G/T
    /// suffixes) against a device of `capacity` bytes.
    pub fn parse(spec: &str, capacity: u64) -> Result<Export, String> {
        let mut parts: Vec<&str> = spec.split(':').collect();
        let read_only = parts.last() == Some(&"ro");
        if read_only {
            parts.pop();
        }
        let (name, start, size) = match parts.as_slice() {
            [name] => (*name, 0, capacity),
            [name, start, len] => (*name, parse_bytes(start)?, parse_bytes(len)?),
            _ => {
                return Err(format!(
                    "export '{spec}': expected NAME, NAME:ro, NAME:START:LEN or NAME:START:LEN:ro"
                ))
            }
        };
        if name.is_empty() || name.len() > proto::MAX_STRING {
            return Err(format!("export '{spec}': the name must be 1..=4096 bytes"));
        }
        if size == 0 || start.checked_add(size).is_none_or(|e| e > capacity) {
            return Err(format!(
                "export '{spec}': [{start}, +{size}) is empty or outside the device's {capacity} bytes"
            ));
        }
        Ok(Export {
            name: name.to_string(),
            description: format!("emulated Moneta, bytes [{start}, {})", start + size),
            start,
            size,
            read_only,
        })
    }

    fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = proto::FLAG_HAS_FLAGS
            | proto::FLAG_SEND_FLUSH
            | proto::FLAG_SEND_FUA
            | proto::FLAG_SEND_TRIM
            | proto::FLAG_SEND_WRITE_ZEROES
            | proto::FLAG_SEND_FAST_ZERO
            | proto::FLAG_CAN_MULTI_CONN
            | proto::FLAG_SEND_CACHE;
        if structured {
            f |= proto::FLAG_SEND_DF;
        }
        if self.read_only {
            f |= proto::FLAG_READ_ONLY;
        }
        f
    }
}

/// Where to listen: `tcp://HOST:PORT` or `unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(String),
    Unix(PathBuf),
}

impl Listen {
    pub fn parse(s: &str) -> Result<Listen, String> {
        if let Some(addr) = s.strip_prefix("tcp://") {
            if addr.is_empty() {
                return Err(format!("'{s}': tcp://HOST:PORT"));
            }
            Ok(Listen::Tcp(addr.to_string()))
        } else if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(format!("'{s}': unix:PATH"));
            }
            Ok(Listen::Unix(PathBuf::from(path)))
        } else {
            Err(format!(
                "'{s}': expected tcp://HOST:PORT or unix:PATH (as nbd URIs nbd://HOST:PORT and nbd+unix:///?socket=PATH reach them)"
            ))
        }
    }
}

/// A connected client, over TCP or a Unix socket.
enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
        })
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
    fn fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
    fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Wait up to `timeout` for any of `events` on `fd`; the events seen
/// (empty on timeout; an interrupted wait counts as a timeout).
fn poll_fd(fd: std::os::fd::RawFd, events: libc::c_short, timeout: Duration) -> libc::c_short {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `p` is one valid pollfd for the call.
    let ready = unsafe { libc::poll(&mut p, 1, ms) };
    if ready > 0 {
        p.revents
    } else {
        0
    }
}

/// A stream whose every read and write ends by one instant: negotiation
/// as a whole has a deadline, not each message.
struct Deadline<'a> {
    stream: &'a mut Stream,
    at: Instant,
}

impl Deadline<'_> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the negotiation deadline passed",
            ));
        }
        Ok(left)
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

impl Write for Deadline<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.left()?;
        self.stream.set_write_timeout(Some(left))?;
        self.stream.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// Counters over the server's life (for tests and the log).
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub connections: AtomicUsize,
    /// Connections not served: no thread, or over the connection limit.
    pub refused: AtomicUsize,
    pub commands: AtomicUsize,
    /// Connections now holding a slot of the limit (and, after GO, a channel).
    pub open: AtomicUsize,
    /// Over-limit clients now being told so.
    pub refusing: AtomicUsize,
    /// Negotiations ended by the deadline.
    pub negotiation_timeouts: AtomicUsize,
    /// Connections closed for being idle.
    pub idle_closed: AtomicUsize,
    /// Connections whose client hung up with requests unanswered.
    pub hung_up: AtomicUsize,
}

/// One place in a gauge of [`ServerCounters`] (`open` or `refusing`),
/// given back when the connection's thread ends (after its channel closed).
struct Slot {
    counters: Arc<ServerCounters>,
    refusing: bool,
}

impl Slot {
    fn gauge(counters: &ServerCounters, refusing: bool) -> &AtomicUsize {
        if refusing {
            &counters.refusing
        } else {
            &counters.open
        }
    }

    fn take(counters: &Arc<ServerCounters>, refusing: bool, max: usize) -> Option<Slot> {
        Slot::gauge(counters, refusing)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Slot {
            counters: counters.clone(),
            refusing,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        Slot::gauge(&self.counters, self.refusing).fetch_sub(1, Ordering::AcqRel);
    }
}

/// An NBD server bound to its listeners; `run` serves until `stop`.
pub struct NbdServer {
    plane: Arc<ControlPlane>,
    /// How connections wait for their device requests (SPEC §3.5).
    pub completion: CompletionMode,
    exports: Arc<Vec<Export>>,
    listeners: Vec<Listener>,
    limits: Limits,
    pub counters: Arc<ServerCounters>,
}

/// What every connection's threads share.
struct Shared {
    plane: Arc<ControlPlane>,
    exports: Arc<Vec<Export>>,
    counters: Arc<ServerCounters>,
    mode: CompletionMode,
    limits: Limits,
}

impl NbdServer {
    pub fn bind(
        plane: Arc<ControlPlane>,
        exports: Vec<Export>,
        listen: &[Listen],
    ) -> Result<NbdServer, String> {
        if exports.is_empty() {
            return Err("no NBD export".into());
        }
        for (i, e) in exports.iter().enumerate() {
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(format!("export name '{}' given twice", e.name));
            }
        }
        let mut listeners = Vec::new();
        for l in listen {
            listeners.push(match l {
                Listen::Tcp(addr) => Listener::Tcp(
                    TcpListener::bind(addr).map_err(|e| format!("NBD on tcp://{addr}: {e}"))?,
                ),
                Listen::Unix(path) => {
                    if let Ok(meta) = std::fs::symlink_metadata(path) {
                        use std::os::unix::fs::FileTypeExt;
                        if !meta.file_type().is_socket() || UnixStream::connect(path).is_ok() {
                            return Err(format!(
                                "NBD on unix:{}: exists and is not a stale socket",
                                path.display()
                            ));
                        }
                        let _ = std::fs::remove_file(path);
                    }
                    let l = UnixListener::bind(path)
                        .map_err(|e| format!("NBD on unix:{}: {e}", path.display()))?;
                    Listener::Unix(l, path.clone())
                }
            });
        }
        if listeners.is_empty() {
            return Err("no NBD listener".into());
        }
        Ok(NbdServer {
            plane,
            completion: CompletionMode::IssueSleep,
            exports: Arc::new(exports),
            listeners,
            limits: Limits::default(),
            counters: Arc::default(),
        })
    }

    /// Serve with these limits from now on (checked: a limit of 0, or one
    /// that would take the local clients' channels, is an error).
    pub fn set_limits(&mut self, limits: Limits) -> Result<(), String> {
        limits.check()?;
        self.limits = limits;
        Ok(())
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The TCP ports actually bound (port 0 asks for any).
    pub fn tcp_ports(&self) -> Vec<u16> {
        self.listeners
            .iter()
            .filter_map(|l| match l {
                Listener::Tcp(t) => t.local_addr().ok().map(|a| a.port()),
                Listener::Unix(..) => None,
            })
            .collect()
    }

    /// Accept connections until `stop` is set (checked every 100 ms); each
    /// connection runs on its own threads. A client over the connection
    /// limit is negotiated with only to be refused at GO.
    pub fn run(&self, stop: &AtomicBool) {
        let mut fds: Vec<libc::pollfd> = self
            .listeners
            .iter()
            .map(|l| libc::pollfd {
                fd: match l {
                    Listener::Tcp(t) => t.as_raw_fd(),
                    Listener::Unix(u, _) => u.as_raw_fd(),
                },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let shared = Arc::new(Shared {
            plane: self.plane.clone(),
            exports: self.exports.clone(),
            counters: self.counters.clone(),
            mode: self.completion,
            limits: self.limits,
        });
        while !stop.load(Ordering::Acquire) {
            // SAFETY: `fds` is a valid array of pollfd for the call.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 100) };
            if ready <= 0 {
                continue;
            }
            for (i, fd) in fds.iter_mut().enumerate() {
                if fd.revents & libc::POLLIN == 0 {
                    continue;
                }
                fd.revents = 0;
                let stream = match &self.listeners[i] {
                    Listener::Tcp(t) => t.accept().map(|(s, _)| {
                        let _ = s.set_nodelay(true);
                        Stream::Tcp(s)
                    }),
                    Listener::Unix(u, _) => u.accept().map(|(s, _)| Stream::Unix(s)),
                };
                let Ok(stream) = stream else { continue };
                self.counters.connections.fetch_add(1, Ordering::Relaxed);
                let max = shared.limits.max_connections;
                let slot = match Slot::take(&self.counters, false, max) {
                    Some(slot) => slot,
                    None => {
                        self.counters.refused.fetch_add(1, Ordering::Relaxed);
                        match Slot::take(&self.counters, true, REFUSING_MAX) {
                            Some(slot) => slot,
                            // A flood: closed unheard.
                            None => continue,
                        }
                    }
                };
                let s = shared.clone();
                let spawned =
                    std::thread::Builder::new()
                        .name("moneta-nbd".into())
                        .spawn(move || {
                            if let Err(e) = serve(stream, &s, &slot) {
                                if std::env::var_os("MONETA_NBD_DEBUG").is_some() {
                                    eprintln!("monetad: NBD connection: {e}");
                                }
                            }
                            drop(slot);
                        });
                if spawned.is_err() {
                    self.counters.refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        for l in &self.listeners {
            if let Listener::Unix(_, path) = l {
                let _ = std::fs::remove_file(path);
            }
        }
    }
}

/// What negotiation settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub export: usize,
    pub structured: bool,
    pub meta: bool,
}

fn read_exact_or<S: Read>(s: &mut S, buf: &mut [u8]) -> Result<(), String> {
    s.read_exact(buf).map_err(|e| format!("reading: {e}"))
}

fn send<S: Write>(s: &mut S, bytes: &[u8]) -> Result<(), String> {
    s.write_all(bytes).map_err(|e| format!("writing: {e}"))
}

fn find(exports: &[Export], name: &str) -> Option<usize> {
    if name.is_empty() {
        Some(0)
    } else {
        exports.iter().position(|e| e.name == name)
    }
}

/// Fixed newstyle negotiation (proto.md "Fixed newstyle negotiation").
/// Ok(None): the client aborted; Err: it broke the protocol (close).
pub fn negotiate<S: Read + Write>(
    s: &mut S,
    exports: &[Export],
) -> Result<Option<Negotiated>, String> {
    negotiate_with(s, exports, &mut |_| Ok(()))
}

/// As [`negotiate`], with `admit` asked before an export is granted (what
/// a connection needs to be served, its channel, is taken there, so a
/// client is never told GO and then closed): its error answers
/// `NBD_OPT_GO` with `NBD_REP_ERR_POLICY` and the message (the client may
/// still list and ask about exports, retry, or abort), and ends an
/// `NBD_OPT_EXPORT_NAME`, which has no error reply, in a close.
pub fn negotiate_with<S: Read + Write>(
    s: &mut S,
    exports: &[Export],
    admit: &mut dyn FnMut(usize) -> Result<(), String>,
) -> Result<Option<Negotiated>, String> {
    let mut hello = proto::NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    send(s, &hello)?;
    let mut b4 = [0u8; 4];
    read_exact_or(s, &mut b4)?;
    let client_flags = u32::from_be_bytes(b4);
    if client_flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
        return Err(format!("unknown client flags {client_flags:#x}"));
    }
    let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    let mut meta = false;
    loop {
        let mut h = [0u8; 16];
        read_exact_or(s, &mut h)?;
        let magic = u64::from_be_bytes(h[0..8].try_into().expect("8"));
        if magic != proto::IHAVEOPT {
            return Err(format!("option magic {magic:#x}"));
        }
        let option = u32::from_be_bytes(h[8..12].try_into().expect("4"));
        let len = u32::from_be_bytes(h[12..16].try_into().expect("4"));
        if len > proto::MAX_OPTION_BYTES {
            return Err(format!("option {option} with {len} bytes of data"));
        }
        let mut data = vec![0u8; len as usize];
        read_exact_or(s, &mut data)?;
        let reply = |kind: u32, d: &[u8]| proto::option_reply(option, kind, d);
        match option {
            proto::OPT_EXPORT_NAME => {
                let name = String::from_utf8(data).map_err(|_| "export name not UTF-8")?;
                let Some(i) = find(exports, &name) else {
                    return Err(format!("no export '{name}'"));
                };
                admit(i)?;
                let e = &exports[i];
                let mut out = e.size.to_be_bytes().to_vec();
                out.extend_from_slice(&e.transmission_flags(structured).to_be_bytes());
                if !no_zeroes {
                    out.extend_from_slice(&[0u8; 124]);
                }
                send(s, &out)?;
                return Ok(Some(Negotiated {
                    export: i,
                    structured,
                    meta,
                }));
            }
            proto::OPT_ABORT => {
                let _ = send(s, &reply(proto::REP_ACK, &[]));
                return Ok(None);
            }
            proto::OPT_LIST => {
                if !data.is_empty() {
                    send(s, &reply(proto::REP_ERR_INVALID, b"LIST takes no data"))?;
                    continue;
                }
                for e in exports {
                    send(
                        s,
                        &reply(proto::REP_SERVER, &proto::length_prefixed(None, &e.name)),
                    )?;
                }
                send(s, &reply(proto::REP_ACK, &[]))?;
            }
            proto::OPT_INFO | proto::OPT_GO => {
                let request = match proto::parse_info(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        send(s, &reply(proto::REP_ERR_INVALID, e.0.as_bytes()))?;
                        continue;
                    }
                };
                let Some(i) = find(exports, &request.name) else {
                    let m = format!("no export '{}'", request.name);
                    send(s, &reply(proto::REP_ERR_UNKNOWN, m.as_bytes()))?;
                    continue;
                };
                if option == proto::OPT_GO {
                    if let Err(m) = admit(i) {
                        send(s, &reply(proto::REP_ERR_POLICY, m.as_bytes()))?;
                        continue;
                    }
                }
                let e = &exports[i];
                let flags = e.transmission_flags(structured);
                send(
                    s,
                    &reply(proto::REP_INFO, &proto::info_export(e.size, flags)),
                )?;
                send(s, &reply(proto::REP_INFO, &proto::info_block_size()))?;
                if request.requests.contains(&proto::INFO_NAME) {
                    let d = proto::info_string(proto::INFO_NAME, &e.name);
                    send(s, &reply(proto::REP_INFO, &d))?;
                }
                if request.requests.contains(&proto::INFO_DESCRIPTION) {
                    let d = proto::info_string(proto::INFO_DESCRIPTION, &e.description);
                    send(s, &reply(proto::REP_INFO, &d))?;
                }
                send(s, &reply(proto::REP_ACK, &[]))?;
                if option == proto::OPT_GO {
                    return Ok(Some(Negotiated {
                        export: i,
                        structured,
                        meta,
                    }));
                }
            }
            proto::OPT_STRUCTURED_REPLY => {
                if !data.is_empty() || structured {
                    send(
                        s,
                        &reply(proto::REP_ERR_INVALID, b"structured replies: no data, once"),
                    )?;
                    continue;
                }
                structured = true;
                send(s, &reply(proto::REP_ACK, &[]))?;
            }
            proto::OPT_LIST_META_CONTEXT | proto::OPT_SET_META_CONTEXT => {
                let setting = option == proto::OPT_SET_META_CONTEXT;
                if setting && !structured {
                    send(
                        s,
                        &reply(
                            proto::REP_ERR_INVALID,
                            b"negotiate structured replies first",
                        ),
                    )?;
                    continue;
                }
                let request = match proto::parse_meta(&data) {
                    Ok(r) => r,
                    Err(e) => {
                        send(s, &reply(proto::REP_ERR_INVALID, e.0.as_bytes()))?;
                        continue;
                    }
                };
                if find(exports, &request.export).is_none() {
                    let m = format!("no export '{}'", request.export);
                    send(s, &reply(proto::REP_ERR_UNKNOWN, m.as_bytes()))?;
                    continue;
                }
                let matched = proto::meta_matches(&request.queries, !setting);
                if matched {
                    let d = proto::length_prefixed(
                        Some(proto::BASE_ALLOCATION_ID),
                        proto::BASE_ALLOCATION,
                    );
                    send(s, &reply(proto::REP_META_CONTEXT, &d))?;
                }
                if setting {
                    meta = matched;
                }
                send(s, &reply(proto::REP_ACK, &[]))?;
            }
            proto::OPT_STARTTLS => {
                send(s, &reply(proto::REP_ERR_UNSUP, b"TLS is not offered"))?;
            }
            _ => {
                send(s, &reply(proto::REP_ERR_UNSUP, b"unknown option"))?;
            }
        }
    }
}

/// One command as the completer finishes it.
struct Command {
    header: RequestHeader,
    /// Pieces not yet complete.
    remaining: AtomicUsize,
    /// First error of any piece (0: none).
    error: AtomicU32,
    /// A read's data, filled piece by piece.
    data: Mutex<Vec<u8>>,
}

enum Job {
    /// A piece in flight: `at` is its offset in the command.
    Piece {
        command: Arc<Command>,
        io: Io,
        at: usize,
    },
    /// A command whose pieces could not all be issued: answered once the
    /// ones before it are done.
    Failed(Arc<Command>),
    /// Make everything before durable, then answer.
    Flush(RequestHeader),
    /// Bytes to send as they are (error and no-op replies).
    Reply(Vec<u8>),
}

struct Connection {
    moneta: Moneta,
    plane: Arc<ControlPlane>,
    export: Export,
    negotiated: Negotiated,
    mode: CompletionMode,
    /// The client's socket (for polls; the streams own it).
    fd: std::os::fd::RawFd,
    /// The client is gone: nothing more is issued, nothing answered.
    hung_up: AtomicBool,
    /// Commands read and not yet answered.
    outstanding: AtomicUsize,
    /// The connection's clock: `idle_since_ns` counts from here.
    born: Instant,
    /// When the last unanswered command was answered.
    idle_since_ns: AtomicU64,
}

impl Connection {
    fn clock_ns(&self) -> u64 {
        self.born.elapsed().as_nanos() as u64
    }

    /// One command answered (or dropped).
    fn answered(&self) {
        if self.outstanding.load(Ordering::Acquire) == 1 {
            // Before the count reaches 0, so whoever sees 0 sees this too.
            self.idle_since_ns.store(self.clock_ns(), Ordering::Release);
        }
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }

    /// Whether the peer closed the socket (a zero-time poll: POLLHUP on a
    /// Unix socket the peer closed, or POLLERR once a TCP peer reset it).
    fn probe_hang_up(&self) -> bool {
        let seen = poll_fd(self.fd, 0, Duration::ZERO);
        if seen & (libc::POLLHUP | libc::POLLERR) != 0 {
            self.hung_up.store(true, Ordering::Release);
        }
        self.hung_up.load(Ordering::Acquire)
    }

    /// Wait for the next request's first byte; false when the connection
    /// has been idle (nothing unanswered, nothing sent) for `idle`.
    fn wait_for_request(&self, idle: Duration) -> bool {
        let began = self.clock_ns();
        let idle_ns = idle.as_nanos() as u64;
        // While commands are unanswered the clock has not started; look
        // again at this pace.
        let step = (idle / 4).max(Duration::from_millis(10));
        loop {
            let since = began.max(self.idle_since_ns.load(Ordering::Acquire));
            let left = Duration::from_nanos((since + idle_ns).saturating_sub(self.clock_ns()));
            if left.is_zero() && self.outstanding.load(Ordering::Acquire) == 0 {
                return false;
            }
            let wait = if left.is_zero() { step } else { left.min(step) };
            if poll_fd(self.fd, libc::POLLIN, wait) != 0 {
                return true;
            }
        }
    }
}

fn serve(mut stream: Stream, shared: &Shared, slot: &Slot) -> Result<(), String> {
    let counters = &*shared.counters;
    let limits = shared.limits;
    let deadline = Instant::now() + limits.negotiation_deadline;
    let refusal = slot.refusing.then(|| {
        format!(
            "the server is at its limit of {} connections (monetad --nbd-max-connections); try again later",
            limits.max_connections
        )
    });
    let plane = &shared.plane;
    // The channel is taken at GO, before the client is told yes.
    let mut attached: Option<(Moneta, Export)> = None;
    let mut admit = |i: usize| -> Result<(), String> {
        if let Some(m) = &refusal {
            return Err(m.clone());
        }
        let export = shared.exports[i].clone();
        let moneta = Moneta::attach(plane, None)
            .map_err(|e| format!("no device channel for this connection: {e}"))?;
        moneta
            .grant_raw(export.start, export.size, !export.read_only)
            .map_err(|e| format!("no grant of the export: {e}"))?;
        attached = Some((moneta, export));
        Ok(())
    };
    let negotiated = negotiate_with(
        &mut Deadline {
            stream: &mut stream,
            at: deadline,
        },
        &shared.exports,
        &mut admit,
    );
    let negotiated = match negotiated {
        Ok(Some(n)) => n,
        Ok(None) => return Ok(()),
        Err(e) => {
            if Instant::now() >= deadline {
                counters
                    .negotiation_timeouts
                    .fetch_add(1, Ordering::Relaxed);
            }
            return Err(e);
        }
    };
    let Some((moneta, export)) = attached else {
        return Err("negotiation ended without a channel".into());
    };
    stream.set_write_timeout(None).map_err(|e| e.to_string())?;
    // Mid-request, a client that stops sending for the idle time is idle too.
    stream
        .set_read_timeout(limits.idle_timeout)
        .map_err(|e| e.to_string())?;
    let connection = Arc::new(Connection {
        moneta,
        plane: plane.clone(),
        export,
        negotiated,
        mode: shared.mode,
        fd: stream.fd(),
        hung_up: AtomicBool::new(false),
        outstanding: AtomicUsize::new(0),
        born: Instant::now(),
        idle_since_ns: AtomicU64::new(0),
    });
    let writer = stream.try_clone().map_err(|e| e.to_string())?;
    let (jobs, queue) = mpsc::sync_channel::<Job>(QUEUE_BOUND);
    let completer = {
        let c = connection.clone();
        std::thread::Builder::new()
            .name("moneta-nbd-done".into())
            .spawn(move || complete(&c, queue, writer))
            .map_err(|e| e.to_string())?
    };
    let mut reader =
        io::BufReader::with_capacity(INPUT_BYTES, stream.try_clone().map_err(|e| e.to_string())?);
    let result = transmit(
        &connection,
        &mut reader,
        &jobs,
        counters,
        limits.idle_timeout,
    );
    drop(jobs);
    let _ = completer.join();
    if connection.hung_up.load(Ordering::Acquire)
        && connection.outstanding.load(Ordering::Acquire) > 0
    {
        counters.hung_up.fetch_add(1, Ordering::Relaxed);
    }
    stream.shutdown();
    result
}

/// The reader side of the transmission phase.
fn transmit(
    c: &Connection,
    stream: &mut io::BufReader<Stream>,
    jobs: &SyncSender<Job>,
    counters: &ServerCounters,
    idle_timeout: Option<Duration>,
) -> Result<(), String> {
    let structured = c.negotiated.structured;
    let queue = |job: Job| {
        jobs.send(job)
            .map_err(|_| "the reply writer stopped".to_string())
    };
    loop {
        if c.hung_up.load(Ordering::Acquire) {
            return Err("the client hung up".into());
        }
        if let Some(idle) = idle_timeout {
            if stream.buffer().is_empty() && !c.wait_for_request(idle) {
                counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                return Err(format!("idle for {idle:?}: closed"));
            }
        }
        let mut raw = [0u8; proto::REQUEST_BYTES];
        match stream.read_exact(&mut raw) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                // No DISC: a client that closed its socket is not waiting
                // for the rest; one that only stopped writing still is.
                c.probe_hang_up();
                return Ok(());
            }
            Err(e) => return Err(format!("reading a request: {e}")),
        }
        let h = proto::parse_request(&raw).map_err(|ProtoError(m)| m)?;
        counters.commands.fetch_add(1, Ordering::Relaxed);
        if h.kind == proto::CMD_WRITE && h.length > proto::MAX_PAYLOAD {
            // Its payload cannot be skipped safely: close.
            return Err(format!("write of {} bytes", h.length));
        }
        let mut payload = Vec::new();
        if h.kind == proto::CMD_WRITE {
            payload = vec![0u8; h.length as usize];
            stream
                .read_exact(&mut payload)
                .map_err(|e| format!("reading a write's data: {e}"))?;
        }
        let checked = proto::check_request(
            &h,
            c.export.size,
            c.export.read_only,
            structured,
            c.negotiated.meta,
        );
        if checked.is_err() || h.kind != proto::CMD_DISC {
            // Every command but DISC gets one answer.
            c.outstanding.fetch_add(1, Ordering::AcqRel);
        }
        if let Err(error) = checked {
            queue(Job::Reply(error_reply(
                structured, h.cookie, error, "refused",
            )))?;
            continue;
        }
        match h.kind {
            proto::CMD_DISC => return Ok(()),
            proto::CMD_READ => issue(c, h, Op::Read, None, &queue)?,
            proto::CMD_WRITE => issue(c, h, Op::Write, Some(&payload), &queue)?,
            proto::CMD_WRITE_ZEROES => {
                if h.flags & proto::CMD_FLAG_FAST_ZERO != 0 {
                    // Zeroes cost the device as much as any write.
                    let m = "zeroing is not faster than writing";
                    queue(Job::Reply(error_reply(
                        structured,
                        h.cookie,
                        proto::ENOTSUP,
                        m,
                    )))?;
                } else {
                    issue(c, h, Op::Write, None, &queue)?;
                }
            }
            proto::CMD_FLUSH => queue(Job::Flush(h))?,
            // Trim is advisory and the device keeps every byte; cache has
            // nothing to warm.
            proto::CMD_TRIM | proto::CMD_CACHE => {
                if h.flags & proto::CMD_FLAG_FUA != 0 {
                    queue(Job::Flush(h))?;
                } else {
                    queue(Job::Reply(proto::simple_reply(0, h.cookie).to_vec()))?;
                }
            }
            proto::CMD_BLOCK_STATUS => {
                queue(Job::Reply(proto::block_status_chunk(h.cookie, h.length)))?;
            }
            _ => unreachable!("check_request lets known commands through only"),
        }
    }
}

fn error_reply(structured: bool, cookie: u64, error: u32, message: &str) -> Vec<u8> {
    if structured {
        proto::error_chunk(cookie, error, message)
    } else {
        proto::simple_reply(error, cookie).to_vec()
    }
}

/// Split a read, write or write-zeroes into pieces and issue them. With
/// `data` None a write writes zeroes.
fn issue(
    c: &Connection,
    h: RequestHeader,
    op: Op,
    data: Option<&[u8]>,
    queue: &dyn Fn(Job) -> Result<(), String>,
) -> Result<(), String> {
    let len = h.length as u64;
    let pieces = len.div_ceil(PIECE) as usize;
    let command = Arc::new(Command {
        header: h,
        remaining: AtomicUsize::new(pieces),
        error: AtomicU32::new(0),
        data: Mutex::new(if op == Op::Read {
            vec![0u8; len as usize]
        } else {
            Vec::new()
        }),
    });
    let mut at = 0u64;
    while at < len {
        if c.hung_up.load(Ordering::Acquire) {
            // Nobody to answer: the rest is never issued.
            return Err("the client hung up".into());
        }
        let n = PIECE.min(len - at);
        let addr = c.export.start + h.offset + at;
        let mut io = match c.moneta.prepare(op, addr, n, c.mode) {
            Ok(io) => io,
            Err(_) => {
                command.error.store(proto::EIO, Ordering::Relaxed);
                break;
            }
        };
        if op == Op::Write {
            let buf = c.moneta.buffer_mut(&mut io);
            match data {
                Some(d) => buf.copy_from_slice(&d[at as usize..(at + n) as usize]),
                None => buf.fill(0),
            }
        }
        if c.moneta.submit(&mut io).is_err() {
            c.moneta.release(io);
            command.error.store(proto::EIO, Ordering::Relaxed);
            break;
        }
        queue(Job::Piece {
            command: command.clone(),
            io,
            at: at as usize,
        })?;
        at += n;
    }
    if at < len {
        // The pieces never issued count as done (failed).
        let missing = (len - at).div_ceil(PIECE) as usize;
        if command.remaining.fetch_sub(missing, Ordering::AcqRel) == missing {
            queue(Job::Failed(command))?;
        }
    }
    Ok(())
}

/// The completer: waits for pieces in order, answers commands.
fn complete(c: &Connection, queue: Receiver<Job>, writer: Stream) {
    let structured = c.negotiated.structured;
    // Replies gather here while more work is ready, and go out in one
    // write before the completer would wait for anything.
    let mut out = Output {
        writer,
        buffer: Vec::with_capacity(OUTPUT_BYTES),
        broken: false,
    };
    let mut probed = Instant::now();
    loop {
        let job = match queue.try_recv() {
            Ok(job) => job,
            Err(TryRecvError::Empty) => {
                out.flush();
                match queue.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            }
            Err(TryRecvError::Disconnected) => break,
        };
        if out.broken {
            c.hung_up.store(true, Ordering::Release);
        }
        // With the client gone, pieces already on the device are waited
        // for (their tags come back) and nothing is answered.
        let gone = c.hung_up.load(Ordering::Acquire);
        let finished = match job {
            Job::Reply(bytes) => {
                if !gone {
                    out.send(&bytes);
                }
                c.answered();
                continue;
            }
            Job::Flush(h) => {
                if !gone {
                    out.flush();
                    let error = match c.plane.engine().medium().flush() {
                        Ok(()) => 0,
                        Err(_) => proto::EIO,
                    };
                    out.send(&reply_bytes(structured, h.cookie, error));
                }
                c.answered();
                continue;
            }
            Job::Failed(command) => command,
            Job::Piece {
                command,
                mut io,
                at,
            } => {
                if c.moneta.poll(&io).is_none() {
                    out.flush();
                    // The reader may be stuck issuing: whether the client
                    // is still there is found out here.
                    if !gone && probed.elapsed() >= HANG_UP_PROBE {
                        probed = Instant::now();
                        c.probe_hang_up();
                    }
                }
                let ok = c.moneta.wait(&mut io).is_ok();
                if !ok {
                    command.error.store(proto::EIO, Ordering::Relaxed);
                } else if io.op() == Op::Read && !gone {
                    let mut data = command.data.lock().expect("data");
                    data[at..at + io.len() as usize].copy_from_slice(c.moneta.buffer(&io));
                }
                c.moneta.release(io);
                if command.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
                    continue;
                }
                command
            }
        };
        c.answered();
        if c.hung_up.load(Ordering::Acquire) {
            continue;
        }
        let h = finished.header;
        let mut error = finished.error.load(Ordering::Relaxed);
        if error == 0 && h.flags & proto::CMD_FLAG_FUA != 0 {
            out.flush();
            if c.plane.engine().medium().flush().is_err() {
                error = proto::EIO;
            }
        }
        if h.kind == proto::CMD_READ && error == 0 {
            let data = finished.data.lock().expect("data");
            if structured {
                let header = proto::chunk_header(
                    proto::REPLY_FLAG_DONE,
                    proto::REPLY_TYPE_OFFSET_DATA,
                    h.cookie,
                    8 + h.length,
                );
                out.send(&header);
                out.send(&h.offset.to_be_bytes());
            } else {
                out.send(&proto::simple_reply(0, h.cookie));
            }
            out.send(&data);
        } else if error != 0 {
            out.send(&error_reply(structured, h.cookie, error, "device error"));
        } else {
            out.send(&reply_bytes(structured, h.cookie, 0));
        }
    }
    out.flush();
}

/// Bytes gathered before one write to the client.
const OUTPUT_BYTES: usize = 256 << 10;

struct Output {
    writer: Stream,
    buffer: Vec<u8>,
    /// The client stopped reading: later replies are dropped.
    broken: bool,
}

impl Output {
    fn send(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= OUTPUT_BYTES {
            self.flush();
        }
    }

    fn flush(&mut self) {
        if !self.broken && !self.buffer.is_empty() && self.writer.write_all(&self.buffer).is_err() {
            self.broken = true;
            self.writer.shutdown();
        }
        self.buffer.clear();
    }
}

fn reply_bytes(structured: bool, cookie: u64, error: u32) -> Vec<u8> {
    if error == 0 {
        proto::simple_reply(0, cookie).to_vec()
    } else {
        error_reply(structured, cookie, error, "flush failed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A client's bytes in, the server's bytes out.
    struct Duplex {
        input: Cursor<Vec<u8>>,
        output: Vec<u8>,
    }

    impl Read for Duplex {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.input.read(buf)
        }
    }

    impl Write for Duplex {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn exports() -> Vec<Export> {
        vec![
            Export::parse("moneta", 1 << 20).unwrap(),
            Export::parse("half:512K:512K:ro", 1 << 20).unwrap(),
        ]
    }

    fn option(kind: u32, data: &[u8]) -> Vec<u8> {
        proto::option_request(kind, data)
    }

    fn go(name: &str) -> Vec<u8> {
        let mut d = proto::length_prefixed(None, name);
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&proto::INFO_BLOCK_SIZE.to_be_bytes());
        option(proto::OPT_GO, &d)
    }

    fn run(input: Vec<u8>) -> (Result<Option<Negotiated>, String>, Vec<u8>) {
        let mut d = Duplex {
            input: Cursor::new(input),
            output: Vec::new(),
        };
        let r = negotiate(&mut d, &exports());
        (r, d.output)
    }

    #[test]
    fn a_well_behaved_client_reaches_its_export() {
        let mut input = 3u32.to_be_bytes().to_vec();
        input.extend(option(proto::OPT_STRUCTURED_REPLY, &[]));
        let mut meta = proto::length_prefixed(None, "half");
        meta.extend_from_slice(&1u32.to_be_bytes());
        meta.extend(proto::length_prefixed(None, proto::BASE_ALLOCATION));
        input.extend(option(proto::OPT_SET_META_CONTEXT, &meta));
        input.extend(option(99, b"unknown"));
        input.extend(go("nosuch"));
        input.extend(go("half"));
        let (r, out) = run(input);
        assert_eq!(
            r,
            Ok(Some(Negotiated {
                export: 1,
                structured: true,
                meta: true
            }))
        );
        let has = |kind: u32| out.windows(4).any(|w| w == kind.to_be_bytes());
        assert!(
            has(proto::REP_ERR_UNSUP)
                && has(proto::REP_ERR_UNKNOWN)
                && has(proto::REP_META_CONTEXT)
        );
        // The old way: EXPORT_NAME, size and flags and (without NO_ZEROES) 124 zeroes.
        let mut input = 1u32.to_be_bytes().to_vec();
        input.extend(option(proto::OPT_EXPORT_NAME, b"moneta"));
        let (r, out) = run(input);
        assert_eq!(r.unwrap().unwrap().export, 0);
        assert_eq!(out.len(), 18 + 8 + 2 + 124);
    }

    #[test]
    fn broken_negotiations_are_errors_not_panics() {
        let seed = std::env::var("MONETA_NBD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x0bad_5eed_u64 ^ std::process::id() as u64);
        eprintln!("negotiation garbage seed {seed} (MONETA_NBD_SEED replays it)");
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let valid = [
            option(proto::OPT_STRUCTURED_REPLY, &[]),
            option(proto::OPT_LIST, &[]),
            go("moneta"),
            option(proto::OPT_LIST_META_CONTEXT, &[0, 0, 0, 0, 0, 0, 0, 0]),
            option(proto::OPT_STARTTLS, &[]),
            option(proto::OPT_ABORT, &[]),
        ];
        for _ in 0..5000 {
            let mut input = (next() as u32 & 3).to_be_bytes().to_vec();
            for _ in 0..next() % 4 {
                let mut m = valid[(next() % valid.len() as u64) as usize].clone();
                // Corrupt some of them: a byte, or a cut.
                match next() % 4 {
                    0 => {
                        let i = (next() % m.len() as u64) as usize;
                        m[i] ^= next() as u8 | 1;
                    }
                    1 => m.truncate((next() % m.len() as u64) as usize),
                    _ => {}
                }
                input.extend(m);
            }
            let garbage: Vec<u8> = (0..next() % 40).map(|_| next() as u8).collect();
            input.extend(garbage);
            let (r, out) = run(input);
            // Whatever happened, the server said a bounded amount and ended.
            assert!(out.len() < 1 << 16, "{} bytes out", out.len());
            if let Ok(Some(n)) = r {
                assert!(n.export < 2);
            }
        }
    }
}
