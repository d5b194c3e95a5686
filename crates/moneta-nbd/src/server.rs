//! The NBD server: listeners, negotiation, and the transmission phase on
//! the emulated device.
//!
//! Each connection is a client of the device like any other process: it
//! opens its own channel on the control plane (`moneta::attach`) and takes
//! a raw grant for its export's range, so every read and write is timed by
//! the device model on the wall clock and moves real bytes. A connection
//! negotiates on a thread of its own; after `NBD_OPT_GO` its socket is
//! handed to the reactor that turns the device, where its requests run to
//! completion in the reactor's loop (transmission.rs: read from the
//! socket, submitted on the channel, answered when the device completes
//! them). `FLUSH` is answered after everything before it and makes the
//! medium durable (msync of an image); `FUA` writes do the same before
//! their reply. Exports are ranges of the one device, shared by all
//! connections (`NBD_FLAG_CAN_MULTI_CONN`: the device has no cache, and a
//! flush syncs the whole medium).
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

use crate::connection::{Export, Negotiated, ServerCounters, Slot, Stream};
use crate::error::{Error, ErrorKind, Result};
use crate::proto;
use crate::transmission::{Hand, Handed, Inline};
use moneta::{CompletionMode, Moneta};
use moneta_abi::channel::CHANNELS;
use moneta_emu::control::ControlPlane;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use crate::transmission::PIECE;

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
    fn check(&self) -> Result<()> {
        if self.max_connections == 0 || self.max_connections > MAX_CONNECTIONS_CAP {
            return Err(Error::invalid(format!(
                "NBD connection limit {}: expected 1..={MAX_CONNECTIONS_CAP} (the device has {CHANNELS} channels; channel 0 is the engine's and {LOCAL_CHANNEL_RESERVE} stay with local clients)",
                self.max_connections
            )));
        }
        if self.negotiation_deadline.is_zero() {
            return Err(Error::invalid(
                "NBD negotiation deadline: must be more than 0",
            ));
        }
        if self.idle_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::invalid(
                "NBD idle timeout: None (never) or more than 0",
            ));
        }
        Ok(())
    }
}

/// Where to listen: `tcp://HOST:PORT` or `unix:PATH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Tcp(String),
    Unix(PathBuf),
}

impl Listen {
    pub fn parse(s: &str) -> Result<Listen> {
        if let Some(addr) = s.strip_prefix("tcp://") {
            if addr.is_empty() {
                return Err(Error::invalid(format!("'{s}': tcp://HOST:PORT")));
            }
            Ok(Listen::Tcp(addr.to_string()))
        } else if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err(Error::invalid(format!("'{s}': unix:PATH")));
            }
            Ok(Listen::Unix(PathBuf::from(path)))
        } else {
            Err(Error::invalid(format!(
                "'{s}': expected tcp://HOST:PORT or unix:PATH (as nbd URIs nbd://HOST:PORT and nbd+unix:///?socket=PATH reach them)"
            )))
        }
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

/// What every connection's negotiation thread shares.
struct Shared {
    plane: Arc<ControlPlane>,
    exports: Arc<Vec<Export>>,
    counters: Arc<ServerCounters>,
    mode: CompletionMode,
    limits: Limits,
    /// Where connections go after GO: the device's reactor.
    hand: Hand,
}

impl NbdServer {
    pub fn bind(
        plane: Arc<ControlPlane>,
        exports: Vec<Export>,
        listen: &[Listen],
    ) -> Result<NbdServer> {
        if exports.is_empty() {
            return Err(Error::invalid("no NBD export"));
        }
        for (i, e) in exports.iter().enumerate() {
            if exports[..i].iter().any(|o| o.name == e.name) {
                return Err(Error::invalid(format!(
                    "export name '{}' given twice",
                    e.name
                )));
            }
        }
        let mut listeners = Vec::new();
        for l in listen {
            listeners.push(match l {
                Listen::Tcp(addr) => Listener::Tcp(
                    TcpListener::bind(addr)
                        .map_err(|e| Error::io(format!("NBD on tcp://{addr}"), e))?,
                ),
                Listen::Unix(path) => {
                    if let Ok(meta) = std::fs::symlink_metadata(path) {
                        use std::os::unix::fs::FileTypeExt;
                        if !meta.file_type().is_socket() || UnixStream::connect(path).is_ok() {
                            return Err(Error::invalid(format!(
                                "NBD on unix:{}: exists and is not a stale socket",
                                path.display()
                            )));
                        }
                        let _ = std::fs::remove_file(path);
                    }
                    let l = UnixListener::bind(path)
                        .map_err(|e| Error::io(format!("NBD on unix:{}", path.display()), e))?;
                    Listener::Unix(l, path.clone())
                }
            });
        }
        if listeners.is_empty() {
            return Err(Error::invalid("no NBD listener"));
        }
        Ok(NbdServer {
            plane,
            // The reactor looks at the status words itself: no interrupt.
            completion: CompletionMode::Dma,
            exports: Arc::new(exports),
            listeners,
            limits: Limits::default(),
            counters: Arc::default(),
        })
    }

    /// Serve with these limits from now on (checked: a limit of 0, or one
    /// that would take the local clients' channels, is an error).
    pub fn set_limits(&mut self, limits: Limits) -> Result<()> {
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
    /// connection negotiates on a thread of its own, then transmits on the
    /// device's reactor. A client over the connection limit is negotiated
    /// with only to be refused at GO. When it returns, every connection
    /// that reached transmission is closed.
    pub fn run(&self, stop: &AtomicBool) {
        let inline = match Inline::start(&self.plane, &self.counters, self.limits.idle_timeout) {
            Ok(inline) => inline,
            Err(e) => {
                eprintln!("monetad: NBD: {e}");
                return;
            }
        };
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
            hand: inline.hand(),
        });
        // Out of descriptors, a listener stays readable: the acceptor
        // closes the waiting client and pauses instead of spinning.
        let mut acceptor = moneta_emu::accept::Acceptor::new("NBD");
        while !stop.load(Ordering::Acquire) {
            if let Some(pause) = acceptor.paused_for() {
                std::thread::sleep(pause.min(Duration::from_millis(100)));
                continue;
            }
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
                let stream = match stream {
                    Ok(stream) => stream,
                    Err(e) => {
                        acceptor.failed(fd.fd, &e);
                        continue;
                    }
                };
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
                let spawned = std::thread::Builder::new()
                    .name("moneta-nbd-hello".into())
                    .spawn(move || {
                        if let Err(e) = serve(stream, &s, slot) {
                            if std::env::var_os("MONETA_NBD_DEBUG").is_some() {
                                eprintln!("monetad: NBD connection: {e}");
                            }
                        }
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

fn read_exact_or<S: Read>(s: &mut S, buf: &mut [u8]) -> Result<()> {
    s.read_exact(buf).map_err(|e| Error::io("reading", e))
}

fn send<S: Write>(s: &mut S, bytes: &[u8]) -> Result<()> {
    s.write_all(bytes).map_err(|e| Error::io("writing", e))
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
pub fn negotiate<S: Read + Write>(s: &mut S, exports: &[Export]) -> Result<Option<Negotiated>> {
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
    admit: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<Option<Negotiated>> {
    let mut hello = proto::NBDMAGIC.to_be_bytes().to_vec();
    hello.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES).to_be_bytes());
    send(s, &hello)?;
    let mut b4 = [0u8; 4];
    read_exact_or(s, &mut b4)?;
    let client_flags = u32::from_be_bytes(b4);
    if client_flags & !(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES) != 0 {
        return Err(Error::protocol(format!(
            "unknown client flags {client_flags:#x}"
        )));
    }
    let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
    let mut structured = false;
    let mut meta = false;
    loop {
        let mut h = [0u8; 16];
        read_exact_or(s, &mut h)?;
        let magic = u64::from_be_bytes(h[0..8].try_into().expect("8"));
        if magic != proto::IHAVEOPT {
            return Err(Error::protocol(format!("option magic {magic:#x}")));
        }
        let option = u32::from_be_bytes(h[8..12].try_into().expect("4"));
        let len = u32::from_be_bytes(h[12..16].try_into().expect("4"));
        if len > proto::MAX_OPTION_BYTES {
            return Err(Error::protocol(format!(
                "option {option} with {len} bytes of data"
            )));
        }
        let mut data = vec![0u8; len as usize];
        read_exact_or(s, &mut data)?;
        let reply = |kind: u32, d: &[u8]| proto::option_reply(option, kind, d);
        match option {
            proto::OPT_EXPORT_NAME => {
                let name = String::from_utf8(data)
                    .map_err(|_| Error::protocol("export name not UTF-8"))?;
                let Some(i) = find(exports, &name) else {
                    return Err(Error::refused(format!("no export '{name}'")));
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
                        send(s, &reply(proto::REP_ERR_POLICY, m.to_string().as_bytes()))?;
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

/// Negotiate; after GO, hand the connection to the device's reactor.
fn serve(mut stream: Stream, shared: &Shared, slot: Slot) -> Result<()> {
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
    let mut admit = |i: usize| -> Result<()> {
        if let Some(m) = &refusal {
            return Err(Error::refused(m.clone()));
        }
        let export = shared.exports[i].clone();
        let moneta = moneta::attach(plane, None).map_err(|e| {
            Error::with_source(
                ErrorKind::Device,
                "no device channel for this connection",
                e,
            )
        })?;
        moneta
            .grant_raw(export.start, export.size, !export.read_only)
            .map_err(|e| Error::with_source(ErrorKind::Device, "no grant of the export", e))?;
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
        return Err(Error::new(
            ErrorKind::Device,
            "negotiation ended without a channel",
        ));
    };
    shared.hand.hand(Handed {
        moneta,
        export,
        negotiated,
        mode: shared.mode,
        stream,
        slot,
    });
    Ok(())
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

    fn run(input: Vec<u8>) -> (Result<Option<Negotiated>>, Vec<u8>) {
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
            r.expect("negotiation succeeds"),
            Some(Negotiated {
                export: 1,
                structured: true,
                meta: true
            })
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
