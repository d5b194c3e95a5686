//! The user-space side of a channel (SPEC §3.2, §3.5): an untrusted library
//! that owns a channel's tags, builds commands, waits for completions in the
//! three ways Moneta-D offers, and recovers from permission misses.
//!
//! - Tags: a lock-free bitmap per channel; a request larger than one 16 KiB
//!   DMA slice takes a run of consecutive tags so its data fits without
//!   overlapping another request's slices (SPEC §3.1).
//! - Submission: the submit stamp and the address word, then the control
//!   word with one release store (the format is `command::encode_channel`),
//!   then a flip of the tag's SUBMITTED bit (channel.rs).
//! - Completion: DMA completion spins on the tag's TAGSTATUSTABLE word;
//!   forwarding spins on COMPLETIONCOUNT and, when it changes, reads and
//!   clears TAGSTATUSREGISTER and fills in the status words of every tag it
//!   found (for whichever thread owns them); issue-sleep does the same but
//!   sleeps on a futex between interrupts.
//! - Misses: before issuing, the library checks its own map of granted
//!   extents (no extent: a *soft miss*, ask the control plane); the device
//!   may still answer "no record" because its table evicted it (a *hard
//!   miss*): ask the control plane to re-install, then retry.
//! - A dead daemon: a request it never posted never completes, so every
//!   poll that finds a request unfinished looks (at most once a millisecond
//!   per channel) whether the daemon hung up the control connection; from
//!   then on every unfinished request completes with `DeviceFailure`. No
//!   way of waiting (`wait`, `poll`, `try_complete`, C `moneta_poll`) says
//!   "in flight" forever.
//! - Control: the control plane is a daemon behind a Unix socket, or one in
//!   this process behind [`LocalPlane`] (libmoneta's embedded mode); this
//!   crate never links the device itself.

use moneta_abi::channel::{
    self, ChannelMemory, ResultCode, CHANNEL_TAGS, SLICE_BYTES, STATUS_DONE,
};
use moneta_abi::control::{self, ChannelInfo, Extent, FrameReader, Request, Response};
use moneta_abi::stats::EngineStats;
use moneta_abi::sys::{self, monotonic_ns};
use moneta_abi::{EmuError, ErrorKind};
use moneta_model::device::command::{self, Command};
use moneta_model::units::{DeviceAddr, Op};
use std::any::Any;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

/// How a request's completion is noticed (SPEC §3.5), chosen per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CompletionMode {
    /// The device writes the tag's status word; the thread spins on it.
    Dma,
    /// The kernel role forwards the interrupt into COMPLETIONCOUNT; threads spin on it.
    Forwarding,
    /// Issue, then sleep until the interrupt is forwarded.
    IssueSleep,
}

impl CompletionMode {
    pub fn parse(s: &str) -> Option<CompletionMode> {
        match s {
            "dma" => Some(CompletionMode::Dma),
            "forwarding" => Some(CompletionMode::Forwarding),
            "issue-sleep" => Some(CompletionMode::IssueSleep),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CompletionMode::Dma => "dma",
            CompletionMode::Forwarding => "forwarding",
            CompletionMode::IssueSleep => "issue-sleep",
        }
    }
}

/// Hard-miss retries before a request is reported as failed.
const MISS_RETRIES: u32 = 4;

/// How often, at most, an unfinished poll looks whether the daemon died:
/// a poll(2) costs about a microsecond, a dead daemon is noticed within
/// about a millisecond.
const LIVENESS_CHECK_NS: u64 = 1_000_000;

/// How long a control-plane call may take before it is an error (the
/// default; `MONETA_CONTROL_TIMEOUT_MS` overrides it). Generous: open-file
/// flushes the file and map-file reads its extents.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// The library's own descriptors (the control socket, the channel's pages
/// and doorbell, a registered file's second descriptor) are numbered from
/// here up, close-on-exec: above the numbers programs use, so a program
/// that puts a file on a fixed number or closes what it did not open does
/// not name one of them by accident (issue 42).
pub const OWN_FD_FLOOR: RawFd = 512;

/// `fd` moved to [`OWN_FD_FLOOR`] or above, close-on-exec (kept where it is
/// if the descriptor limit leaves no room up there).
pub fn lift(fd: OwnedFd) -> OwnedFd {
    if fd.as_raw_fd() >= OWN_FD_FLOOR {
        return fd;
    }
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) on a descriptor we own.
    let high = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, OWN_FD_FLOOR) };
    if high < 0 {
        return fd;
    }
    // SAFETY: the descriptor fcntl just made is ours alone.
    unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(high) }
}

/// (st_dev, st_ino) of `fd`: what a descriptor the library relies on is
/// checked against before use.
pub(crate) fn identity(fd: RawFd) -> Option<(u64, u64)> {
    sys::fstat(fd).ok().map(|st| (st.st_dev, st.st_ino))
}

/// The control-call timeout in force.
pub fn control_timeout() -> Duration {
    std::env::var("MONETA_CONTROL_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map_or(CONTROL_TIMEOUT, Duration::from_millis)
}

/// A control plane in this process (SPEC §3.3's OS role without a daemon):
/// what a channel's control connection calls instead of writing to a
/// socket. libmoneta implements it for the engine's control plane (the
/// embedded mode); dropping it ends the session, as a daemon does when a
/// client's socket closes.
pub trait LocalPlane: Send {
    /// Handle `request` and return the reply and the descriptors sent with
    /// it (a hello's channel memory). `fd` is the plane's own copy of a
    /// descriptor the client attached, as SCM_RIGHTS would give it.
    fn call(
        &mut self,
        request: Request,
        fd: Option<OwnedFd>,
    ) -> Result<(Response, Vec<OwnedFd>), EmuError>;
}

/// The control connection: a daemon over a socket, or a control plane in
/// this process.
enum Control {
    Socket {
        stream: UnixStream,
        reader: FrameReader,
        socket: PathBuf,
        /// The socket's identity at connect: checked before every call, so
        /// a message of the library's never goes out on a descriptor the
        /// program put on the socket's number.
        identity: Option<(u64, u64)>,
        /// A call timed out or failed mid-frame: a late reply could be taken
        /// for the next call's, so no call is made on it again.
        broken: bool,
    },
    Local(Box<dyn LocalPlane>),
}

impl Control {
    /// Send a request (with `fd` attached, if any) and wait for the reply.
    fn call(&mut self, request: Request, fd: Option<RawFd>) -> Result<Response, EmuError> {
        self.call_with_fds(request, fd).map(|(r, _)| r)
    }

    /// [`Control::call`], also returning the descriptors sent with the reply.
    fn call_with_fds(
        &mut self,
        request: Request,
        fd: Option<RawFd>,
    ) -> Result<(Response, Vec<OwnedFd>), EmuError> {
        let (response, fds) = match self {
            Control::Socket {
                stream,
                reader,
                socket,
                identity: id,
                broken,
            } => {
                if !*broken && identity(stream.as_raw_fd()) != *id {
                    *broken = true;
                    return Err(EmuError::new(
                        ErrorKind::Stopped,
                        format!(
                            "the control socket to monetad at {} was closed or replaced under the library",
                            socket.display()
                        ),
                    ));
                }
                if *broken {
                    return Err(EmuError::new(
                        ErrorKind::Stopped,
                        format!(
                            "the connection to monetad at {} failed earlier",
                            socket.display()
                        ),
                    ));
                }
                let timed_out = |e: &EmuError| {
                    e.errno == Some(libc::EAGAIN) || e.errno == Some(libc::ETIMEDOUT)
                };
                // A descriptor to attach that is not open (EBADF) fails the
                // send before a byte leaves: that request fails, the
                // connection stays good.
                if let Some(f) = fd {
                    if sys::fstat(f).is_err() {
                        return Err(EmuError::new(
                            ErrorKind::Request,
                            format!("descriptor {f} to send to monetad is not open"),
                        )
                        .with_errno(Some(libc::EBADF)));
                    }
                }
                let exchange = (|| {
                    let fds: Vec<RawFd> = fd.into_iter().collect();
                    sys::send_with_fds(stream.as_raw_fd(), &control::encode(&request), &fds)
                        .map_err(|e| EmuError::io("writing to monetad", e))?;
                    reader.next(stream.as_raw_fd())?.ok_or_else(|| {
                        EmuError::new(ErrorKind::Stopped, "monetad closed the connection")
                    })
                })();
                match exchange {
                    Ok((body, fds)) => (
                        control::decode::<Response>(&body)?,
                        fds.into_iter().map(lift).collect(),
                    ),
                    Err(e) => {
                        *broken = true;
                        // The daemon is gone, silent or broke the protocol:
                        // to a program that is an I/O error (not EPIPE).
                        let why = if timed_out(&e) {
                            format!(
                                "did not answer within {} ms (MONETA_CONTROL_TIMEOUT_MS)",
                                control_timeout().as_millis()
                            )
                        } else {
                            e.message
                        };
                        return Err(EmuError::new(
                            ErrorKind::Stopped,
                            format!("monetad at {} {why}", socket.display()),
                        ));
                    }
                }
            }
            Control::Local(plane) => {
                // As SCM_RIGHTS would: the control plane gets its own descriptor.
                let fd = fd
                    .map(sys::dup)
                    .transpose()
                    .map_err(|e| EmuError::io("duplicating the descriptor", e))?;
                plane.call(request, fd)?
            }
        };
        match response {
            Response::Error {
                kind,
                message,
                errno,
            } => Err(EmuError::new(kind, message).with_errno(errno)),
            r => Ok((r, fds)),
        }
    }
}

struct Inner {
    memory: ChannelMemory,
    info: ChannelInfo,
    /// Free virtual tags (bit set = free).
    free_tags: AtomicU64,
    /// Sequence number of the request each tag carries now.
    sequences: [AtomicU16; CHANNEL_TAGS],
    /// The library's map of granted extents (SPEC §3.2's translation map).
    extents: RwLock<Vec<Extent>>,
    control: Mutex<Control>,
    soft_misses: AtomicU64,
    hard_misses: AtomicU64,
    /// COMPLETIONCOUNT as last seen by a forwarding thread.
    seen_count: AtomicU32,
    /// When an unfinished poll last looked whether the daemon hung up
    /// (CLOCK_MONOTONIC ns), and whether it had.
    liveness_checked_ns: AtomicU64,
    daemon_died: AtomicBool,
    /// Keeps an in-process device alive as long as the channel (embedded
    /// mode: libmoneta passes its `Arc<moneta_emu::engine::Engine>`).
    _keep_alive: Option<Arc<dyn Any + Send + Sync>>,
}

/// The environment variable that names a run (`moneta run` sets it): sent
/// at hello, so the daemon counts this process's requests under it.
pub const RUN_ID_ENV: &str = "MONETA_RUN_ID";

/// A channel to an emulated Moneta. Cheap to clone; thread-safe.
#[derive(Clone)]
pub struct Moneta {
    inner: Arc<Inner>,
}

/// An IO in preparation or in flight: it holds its tags until released.
#[derive(Debug)]
pub struct Io {
    tag: u8,
    tags: u8,
    op: Op,
    addr: u64,
    len: u64,
    mode: CompletionMode,
    sequence: u16,
    submitted: bool,
    /// Issued and its completion not yet seen by `wait` / `try_complete`.
    in_flight: bool,
    /// CLOCK_MONOTONIC when the command was last issued (its submit stamp).
    stamp_ns: u64,
}

impl Io {
    pub fn op(&self) -> Op {
        self.op
    }
    pub fn addr(&self) -> u64 {
        self.addr
    }
    pub fn len(&self) -> u64 {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn tag(&self) -> u8 {
        self.tag
    }
    /// When the request was last issued (CLOCK_MONOTONIC ns, the stamp the
    /// device times it from; [`moneta_abi::sys::monotonic_ns`] reads the
    /// same clock).
    pub fn issued_at_ns(&self) -> u64 {
        self.stamp_ns
    }
    /// Whether the request has been issued (poll and wait need that).
    pub fn is_submitted(&self) -> bool {
        self.submitted
    }
    /// Issued, and `wait` / `try_complete` have not yet seen it finish.
    pub fn is_in_flight(&self) -> bool {
        self.in_flight
    }
}

impl Moneta {
    /// Open a channel on the daemon listening at `socket`. Every call on
    /// it is bounded by [`control_timeout`].
    pub fn connect(socket: &Path) -> Result<Moneta, EmuError> {
        let where_ = || format!("connecting to monetad at {}", socket.display());
        let stream = UnixStream::connect(socket).map_err(|e| EmuError::io(&where_(), e))?;
        let stream = UnixStream::from(lift(OwnedFd::from(stream)));
        let timeout = Some(control_timeout());
        stream
            .set_read_timeout(timeout)
            .and_then(|()| stream.set_write_timeout(timeout))
            .map_err(|e| EmuError::io(&where_(), e))?;
        let control = Control::Socket {
            reader: FrameReader::new(),
            socket: socket.to_path_buf(),
            identity: identity(stream.as_raw_fd()),
            stream,
            broken: false,
        };
        Self::open(control, None)
    }

    /// Open a channel on a control plane in this process (the embedded
    /// mode: libmoneta's `embedded` and `attach` pass the engine's).
    /// `keep_alive` (the device, if this channel owns it) lives as long as
    /// the channel.
    pub fn local(
        plane: Box<dyn LocalPlane>,
        keep_alive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Moneta, EmuError> {
        Self::open(Control::Local(plane), keep_alive)
    }

    /// Say hello on `control` and map the channel it grants, if its layout
    /// is this library's.
    fn open(
        mut control: Control,
        keep_alive: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Result<Moneta, EmuError> {
        // `moneta run` names its run: the daemon keeps this connection's
        // counters under it (a malformed id is left out, not sent).
        let run = std::env::var(RUN_ID_ENV)
            .ok()
            .filter(|id| control::valid_run_id(id));
        let hello = Request::Hello {
            version: control::PROTOCOL_VERSION,
            run,
        };
        let (info, fds) = match control.call_with_fds(hello, None)? {
            (Response::Channel(info), fds) => (info, fds),
            (other, _) => {
                return Err(EmuError::new(
                    ErrorKind::Protocol,
                    format!("unexpected reply {other:?}"),
                ))
            }
        };
        if info.tags as usize != CHANNEL_TAGS || info.slice_bytes as usize != SLICE_BYTES {
            return Err(EmuError::new(
                ErrorKind::Protocol,
                "the daemon's channel layout differs from this library's",
            ));
        }
        let memory =
            ChannelMemory::map_fds(fds).map_err(|e| EmuError::io("mapping the channel", e))?;
        let seen = memory.completion_count().load(Ordering::Acquire);
        Ok(Moneta {
            inner: Arc::new(Inner {
                memory,
                info,
                free_tags: AtomicU64::new(u64::MAX),
                sequences: std::array::from_fn(|_| AtomicU16::new(0)),
                extents: RwLock::new(Vec::new()),
                control: Mutex::new(control),
                soft_misses: AtomicU64::new(0),
                hard_misses: AtomicU64::new(0),
                seen_count: AtomicU32::new(seen),
                liveness_checked_ns: AtomicU64::new(0),
                daemon_died: AtomicBool::new(false),
                _keep_alive: keep_alive,
            }),
        })
    }

    /// The LAYOUT EPOCH word of file `file_id` (bumped by the control
    /// plane when that file changed layout): cached maps older than it are
    /// stale.
    pub fn layout_epoch(&self, file_id: u32) -> u64 {
        self.inner
            .memory
            .layout_epoch(file_id)
            .load(Ordering::Acquire)
    }

    pub fn info(&self) -> &ChannelInfo {
        &self.inner.info
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.inner.info.capacity_bytes
    }

    /// Longest single request: the whole DMA buffer.
    pub fn max_request_bytes(&self) -> u64 {
        self.inner.info.dma_buffer_bytes
    }

    /// (soft misses, hard misses) this channel has met.
    pub fn misses(&self) -> (u64, u64) {
        (
            self.inner.soft_misses.load(Ordering::Relaxed),
            self.inner.hard_misses.load(Ordering::Relaxed),
        )
    }

    fn call(&self, request: Request) -> Result<Response, EmuError> {
        self.call_with_fd(request, None)
    }

    /// A control request with a descriptor attached (`open-file`).
    pub(crate) fn call_with_fd(
        &self,
        request: Request,
        fd: Option<RawFd>,
    ) -> Result<Response, EmuError> {
        self.inner
            .control
            .lock()
            .expect("control")
            .call(request, fd)
    }

    /// The descriptors this channel holds (its control socket, pages and
    /// doorbell): the shim keeps programs from closing or replacing them.
    pub fn own_fds(&self) -> Vec<RawFd> {
        let mut fds = vec![
            self.inner.memory.fd().as_raw_fd(),
            self.inner.memory.doorbell().fd().as_raw_fd(),
        ];
        if let Control::Socket { stream, .. } = &*self.inner.control.lock().expect("control") {
            fds.push(stream.as_raw_fd());
        }
        fds
    }

    /// Count a soft miss met by a file's own extent map (SPEC §3.2).
    pub(crate) fn count_soft_miss(&self) {
        self.inner.soft_misses.fetch_add(1, Ordering::Relaxed);
    }

    /// Ask for a raw range of the device (the daemon's owner only).
    pub fn grant_raw(&self, start: u64, len: u64, write: bool) -> Result<(), EmuError> {
        match self.call(Request::GrantRaw { start, len, write })? {
            Response::Granted(e) => {
                self.inner.extents.write().expect("extents").push(e);
                Ok(())
            }
            other => Err(EmuError::new(
                ErrorKind::Protocol,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// Have the control plane (re)install the record for a range.
    fn resolve(&self, addr: u64, len: u64, write: bool) -> Result<(), EmuError> {
        match self.call(Request::Resolve { addr, len, write })? {
            Response::Granted(e) => {
                let mut extents = self.inner.extents.write().expect("extents");
                if !extents.contains(&e) {
                    extents.push(e);
                }
                Ok(())
            }
            other => Err(EmuError::new(
                ErrorKind::Protocol,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// A SAN node's daemon: why a request on `[addr, addr + len)` may have
    /// found no copy, as that node sees it (the slice, its holders, who is
    /// unreachable, the node's own copy).
    pub fn san_explain(&self, addr: u64, len: u64) -> Result<String, EmuError> {
        self.said(Request::SanExplain { addr, len })
    }

    /// A failed request's error; when it found no reachable or up-to-date
    /// copy on a SAN, with the node's view of why (which slice, whose
    /// copy, who is unreachable), if the daemon can say.
    fn request_error(&self, io: &Io, code: ResultCode) -> EmuError {
        let mut e = request_error(io, code);
        if matches!(
            code,
            ResultCode::PeerUnreachable | ResultCode::NoUpToDateCopy
        ) {
            if let Ok(why) = self.san_explain(io.addr, io.len) {
                e.message = format!("{}; {why}", e.message);
            }
        }
        e
    }

    /// A SAN node's daemon: discard this node's writes in its split-brain
    /// slices (all, or `slice`), so that each partner's copy wins and
    /// resyncs this one (the daemon's owner only). Returns what it did.
    pub fn san_discard(&self, slice: Option<u64>) -> Result<String, EmuError> {
        self.said(Request::SanDiscard { slice })
    }

    /// A SAN node's daemon: force its outdated copies whose partner is
    /// unreachable (all, or `slice`) up to date, accepting that they may
    /// lack writes the partner acknowledged (the daemon's owner only).
    pub fn san_force(&self, slice: Option<u64>) -> Result<String, EmuError> {
        self.said(Request::SanForce { slice })
    }

    /// A request answered with text.
    fn said(&self, request: Request) -> Result<String, EmuError> {
        match self.call(request)? {
            Response::Said { text } => Ok(text),
            other => Err(EmuError::new(
                ErrorKind::Protocol,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// A SAN node's daemon: inject `faults` (`moneta_wire::LinkFaults`
    /// syntax; `none` heals) into its link to `peer`, or to every peer
    /// (the daemon's owner only).
    pub fn san_fault(&self, peer: Option<u16>, faults: &str) -> Result<(), EmuError> {
        match self.call(Request::SanFault {
            peer,
            faults: faults.to_string(),
        })? {
            Response::Done {} => Ok(()),
            other => Err(EmuError::new(
                ErrorKind::Protocol,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    pub fn stats(&self) -> Result<EngineStats, EmuError> {
        self.stats_of(None, None)
    }

    /// [`Moneta::stats`], with one run's clients' counters (`run`: the
    /// `MONETA_RUN_ID` their connections gave) or one open channel's in
    /// `client`.
    pub fn stats_of(
        &self,
        run: Option<&str>,
        channel: Option<u16>,
    ) -> Result<EngineStats, EmuError> {
        let request = Request::Stats {
            run: run.map(str::to_string),
            channel,
        };
        match self.call(request)? {
            Response::Stats(s) => Ok(*s),
            other => Err(EmuError::new(
                ErrorKind::Protocol,
                format!("unexpected reply {other:?}"),
            )),
        }
    }

    /// Reserve tags for a request of `len` bytes at `addr`, waiting for free
    /// tags if all are busy. Fill the DMA slice with [`Moneta::buffer_mut`]
    /// (writes), then [`Moneta::submit`].
    pub fn prepare(
        &self,
        op: Op,
        addr: u64,
        len: u64,
        mode: CompletionMode,
    ) -> Result<Io, EmuError> {
        loop {
            if let Some(io) = self.try_prepare(op, addr, len, mode)? {
                return Ok(io);
            }
            std::hint::spin_loop();
        }
    }

    /// As [`Moneta::prepare`], but Ok(None) instead of waiting for tags.
    pub fn try_prepare(
        &self,
        op: Op,
        addr: u64,
        len: u64,
        mode: CompletionMode,
    ) -> Result<Option<Io>, EmuError> {
        if len == 0 || len > self.max_request_bytes() {
            return Err(EmuError::new(
                ErrorKind::Request,
                format!(
                    "request length {len} is not in 1..={}",
                    self.max_request_bytes()
                ),
            ));
        }
        let tags = len.div_ceil(SLICE_BYTES as u64) as u32;
        let Some(tag) = self.take_tags(tags) else {
            return Ok(None);
        };
        Ok(Some(Io {
            tag,
            tags: tags as u8,
            op,
            addr,
            len,
            mode,
            sequence: 0,
            submitted: false,
            in_flight: false,
            stamp_ns: 0,
        }))
    }

    /// Take `count` consecutive free tags (lock-free).
    fn take_tags(&self, count: u32) -> Option<u8> {
        let run = if count >= 64 {
            u64::MAX
        } else {
            (1u64 << count) - 1
        };
        let free = &self.inner.free_tags;
        let mut current = free.load(Ordering::Acquire);
        loop {
            // The lowest free tag that starts a free run (a run starts at a
            // free tag, so only those are tried).
            let mut start = None;
            let mut candidates = current;
            while candidates != 0 {
                let at = candidates.trailing_zeros();
                if at + count > 64 {
                    break;
                }
                let mask = run << at;
                if current & mask == mask {
                    start = Some(at);
                    break;
                }
                candidates &= candidates - 1;
            }
            let at = start?;
            match free.compare_exchange_weak(
                current,
                current & !(run << at),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(at as u8),
                Err(now) => current = now,
            }
        }
    }

    /// Where the request's DMA slice(s) start in the shared buffer.
    fn slice_ptr(&self, io: &Io) -> *mut u8 {
        assert!(
            !io.in_flight,
            "the DMA buffer of a request in flight belongs to the device"
        );
        self.inner
            .memory
            .dma_ptr(io.tag as usize * SLICE_BYTES, io.len as usize)
            .expect("prepare kept the request inside the DMA buffer")
    }

    /// The request's DMA slice(s): data to write, or data read once complete.
    /// Not while the request is in flight (panics).
    pub fn buffer_mut<'a>(&'a self, io: &'a mut Io) -> &'a mut [u8] {
        let ptr = self.slice_ptr(io);
        // SAFETY: the tags (hence these slices) belong to `io`, borrowed
        // mutably, so no other request of this library uses them; the device
        // touches them only while the request is in flight, which it is not
        // (slice_ptr checked).
        unsafe { std::slice::from_raw_parts_mut(ptr, io.len as usize) }
    }

    pub fn buffer<'a>(&'a self, io: &'a Io) -> &'a [u8] {
        let ptr = self.slice_ptr(io);
        // SAFETY: as buffer_mut; shared borrow.
        unsafe { std::slice::from_raw_parts(ptr, io.len as usize) }
    }

    fn covered(&self, addr: u64, len: u64, write: bool) -> bool {
        self.inner
            .extents
            .read()
            .expect("extents")
            .iter()
            .any(|e| e.covers(addr, len, write))
    }

    /// Issue the request: one atomic store of the control word. A soft miss
    /// (no extent in the library's map) asks the control plane first.
    pub fn submit(&self, io: &mut Io) -> Result<(), EmuError> {
        let write = io.op == Op::Write;
        if !self.covered(io.addr, io.len, write) {
            self.inner.soft_misses.fetch_add(1, Ordering::Relaxed);
            self.resolve(io.addr, io.len, write)?;
        }
        self.issue(io)
    }

    /// Issue without the soft-miss check (a file's mapped blocks).
    pub(crate) fn issue(&self, io: &mut Io) -> Result<(), EmuError> {
        // The tag belongs to `io`, so no other thread updates its sequence.
        let slot = &self.inner.sequences[io.tag as usize];
        let sequence = slot.load(Ordering::Relaxed).wrapping_add(1);
        slot.store(sequence, Ordering::Relaxed);
        io.sequence = sequence;
        let command = Command {
            tag: io.tag,
            op: io.op,
            addr: DeviceAddr(io.addr),
            len_bytes: io.len,
            host_dma_addr: None,
            barrier: false,
            dma_completion: io.mode == CompletionMode::Dma,
        };
        let [addr_word, control_word] = command::encode_channel(&command, sequence)
            .map_err(|e| EmuError::new(ErrorKind::Request, e.to_string()))?;
        io.stamp_ns = monotonic_ns();
        CLOCK_SEEN.set(io.stamp_ns);
        self.inner
            .memory
            .submit(io.tag as usize, io.stamp_ns, addr_word, control_word);
        io.submitted = true;
        io.in_flight = true;
        Ok(())
    }

    /// When, in model time, `io`'s request finished (CLOCK_MONOTONIC ns, the
    /// tag's due word): valid once it completed, until the tags are reused.
    pub fn due_ns(&self, io: &Io) -> u64 {
        self.inner
            .memory
            .tag_due(io.tag as usize)
            .load(Ordering::Acquire)
    }

    /// The request's result if it has finished (never blocks). A request
    /// of a daemon that died finishes with `DeviceFailure`.
    pub fn poll(&self, io: &Io) -> Option<ResultCode> {
        match self.posted(io) {
            // Posted ahead of its model time: not finished until then.
            Some((code, due)) => clock_reached(due).then_some(code),
            None => self.daemon_died().then_some(ResultCode::DeviceFailure),
        }
    }

    /// Whether the daemon behind this channel died: looked up at most once
    /// per [`LIVENESS_CHECK_NS`] (a poll(2) of the control socket), then
    /// remembered.
    fn daemon_died(&self) -> bool {
        let inner = &self.inner;
        if inner.daemon_died.load(Ordering::Relaxed) {
            return true;
        }
        let now = monotonic_ns();
        let last = inner.liveness_checked_ns.load(Ordering::Relaxed);
        if now.saturating_sub(last) < LIVENESS_CHECK_NS
            || inner
                .liveness_checked_ns
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let died = self.device_gone();
        if died {
            inner.daemon_died.store(true, Ordering::Relaxed);
        }
        died
    }

    /// The request's result and its due time (CLOCK_MONOTONIC) once the
    /// device has posted it, whether or not that time has come.
    fn posted(&self, io: &Io) -> Option<(ResultCode, u64)> {
        assert!(io.submitted, "poll of an IO that was not submitted");
        if io.mode != CompletionMode::Dma {
            self.forward();
        }
        let status = self
            .inner
            .memory
            .tag_status(io.tag as usize)
            .load(Ordering::Acquire);
        let want = STATUS_DONE | (u64::from(io.sequence) << 32);
        if status & !0xffff_ffff != want {
            return None;
        }
        let due = self
            .inner
            .memory
            .tag_due(io.tag as usize)
            .load(Ordering::Acquire);
        Some((ResultCode::from_u32(status as u32), due))
    }

    /// Forwarding (SPEC §3.5): if COMPLETIONCOUNT moved, read and clear
    /// TAGSTATUSREGISTER and write the status words of the tags it names.
    fn forward(&self) {
        let m = &self.inner.memory;
        let count = m.completion_count().load(Ordering::Acquire);
        if count == self.inner.seen_count.load(Ordering::Relaxed) {
            return;
        }
        self.inner.seen_count.store(count, Ordering::Relaxed);
        let mut bits = m.tag_status_register().swap(0, Ordering::AcqRel);
        if bits == 0 {
            return;
        }
        while bits != 0 {
            let tag = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let code = ResultCode::from_u32(m.forwarded_error(tag).swap(0, Ordering::AcqRel));
            let sequence = self.inner.sequences[tag].load(Ordering::Relaxed);
            m.tag_status(tag)
                .store(channel::status_word(sequence, code), Ordering::Release);
        }
        // Statuses changed: wake any thread of ours sleeping for one.
        m.wake_word().fetch_add(1, Ordering::Release);
        if m.sleepers().load(Ordering::Acquire) > 0 {
            sys::futex_wake_all(m.wake_word());
        }
    }

    /// Wait for the request to finish, the way its mode says; a hard miss
    /// re-installs the record and retries. The tags stay with `io`.
    pub fn wait(&self, io: &mut Io) -> Result<(), EmuError> {
        let mut retries = 0;
        loop {
            let code = self.wait_once(io);
            io.in_flight = false;
            match code {
                ResultCode::Ok => return Ok(()),
                // A record without the needed bit may be another of this
                // channel's files over the same blocks (two descriptors of
                // one file, read-only and read-write: the newest grant
                // holds the range); the hard miss re-installs the grant
                // that allows it, if any.
                ResultCode::MissingRecord if retries < MISS_RETRIES => {
                    retries += 1;
                    self.inner.hard_misses.fetch_add(1, Ordering::Relaxed);
                    self.resolve(io.addr, io.len, io.op == Op::Write)?;
                    self.issue(io)?;
                }
                ResultCode::PermissionDenied if retries < MISS_RETRIES => {
                    retries += 1;
                    self.inner.hard_misses.fetch_add(1, Ordering::Relaxed);
                    // No grant of this channel allows it: the device's
                    // refusal stands.
                    if self.resolve(io.addr, io.len, io.op == Op::Write).is_err() {
                        return Err(self.request_error(io, code));
                    }
                    self.issue(io)?;
                }
                code => return Err(self.request_error(io, code)),
            }
        }
    }

    /// Non-blocking completion without miss recovery: Some(code) once the
    /// request finished (its DMA slice is the caller's again), None while
    /// in flight. For a caller that must not wait on the control plane (an
    /// NBD connection on the device's own reactor), which recovers a hard
    /// miss elsewhere with [`Moneta::wait`].
    pub fn try_finish(&self, io: &mut Io) -> Option<ResultCode> {
        let code = self.poll(io)?;
        io.in_flight = false;
        Some(code)
    }

    /// Non-blocking completion with miss recovery: Some(result) once the
    /// request finished; None while in flight (or just re-issued after a
    /// hard miss).
    pub fn try_complete(&self, io: &mut Io) -> Option<Result<(), EmuError>> {
        let code = self.try_finish(io)?;
        match code {
            ResultCode::Ok => Some(Ok(())),
            ResultCode::PermissionDenied => {
                self.inner.hard_misses.fetch_add(1, Ordering::Relaxed);
                match self.resolve(io.addr, io.len, io.op == Op::Write) {
                    Ok(()) => match self.issue(io) {
                        Ok(()) => None,
                        Err(e) => Some(Err(e)),
                    },
                    Err(_) => Some(Err(self.request_error(io, code))),
                }
            }
            ResultCode::MissingRecord => {
                self.inner.hard_misses.fetch_add(1, Ordering::Relaxed);
                match self
                    .resolve(io.addr, io.len, io.op == Op::Write)
                    .and_then(|_| self.issue(io))
                {
                    Ok(()) => None,
                    Err(e) => Some(Err(e)),
                }
            }
            code => Some(Err(self.request_error(io, code))),
        }
    }

    fn wait_once(&self, io: &Io) -> ResultCode {
        // `poll` also ends the wait when the daemon died (it looks every
        // millisecond; a sleeping turn lasts at most one).
        loop {
            if let Some(code) = self.poll(io) {
                return code;
            }
            if io.mode == CompletionMode::IssueSleep {
                let m = &self.inner.memory;
                let word = m.wake_word().load(Ordering::Acquire);
                m.sleepers().fetch_add(1, Ordering::AcqRel);
                // Posted but not yet due (the device posts at most
                // `post_ahead_ns` early): no wake-up will come, so spin to it.
                if self.posted(io).is_none() {
                    // Bounded sleep: a lost wake-up costs a millisecond, not a hang.
                    sys::futex_wait(m.wake_word(), word, Some(1_000_000));
                }
                m.sleepers().fetch_sub(1, Ordering::AcqRel);
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// An error if the daemon behind this channel is gone: callers that
    /// poll in a loop check this now and then, as `wait` does.
    pub fn check_device(&self) -> Result<(), EmuError> {
        if self.device_gone() {
            Err(EmuError::new(ErrorKind::Stopped, "monetad went away"))
        } else {
            Ok(())
        }
    }

    /// Whether the daemon hung up (never for an embedded device).
    fn device_gone(&self) -> bool {
        let Ok(control) = self.inner.control.try_lock() else {
            return false;
        };
        match &*control {
            Control::Socket { stream, .. } => {
                let mut pfd = libc::pollfd {
                    fd: stream.as_raw_fd(),
                    events: 0,
                    revents: 0,
                };
                // SAFETY: one valid pollfd; a zero timeout never blocks.
                let ready = unsafe { libc::poll(&mut pfd, 1, 0) };
                ready > 0 && pfd.revents & (libc::POLLHUP | libc::POLLERR) != 0
            }
            Control::Local(_) => false,
        }
    }

    /// Give the request's tags back.
    pub fn release(&self, io: Io) {
        let run = if io.tags >= 64 {
            u64::MAX
        } else {
            (1u64 << io.tags) - 1
        };
        let prev = self
            .inner
            .free_tags
            .fetch_or(run << io.tag, Ordering::AcqRel);
        debug_assert_eq!(prev & (run << io.tag), 0, "released free tags");
    }

    /// Read `buf.len()` bytes at `addr` (split into requests of at most the DMA buffer).
    pub fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), EmuError> {
        self.read_with(addr, buf, CompletionMode::Dma)
    }

    pub fn read_with(
        &self,
        addr: u64,
        buf: &mut [u8],
        mode: CompletionMode,
    ) -> Result<(), EmuError> {
        self.read_checked(addr, buf, mode, true, |_, _| {})
    }

    /// As [`Moneta::read_with`], calling `done` with each request once it
    /// completed (and its data was copied out), before its tags are
    /// released: a caller that times requests reads their submit stamp and
    /// due time there (`Io::issued_at_ns`, [`Moneta::due_ns`]).
    pub fn read_each(
        &self,
        addr: u64,
        buf: &mut [u8],
        mode: CompletionMode,
        done: impl FnMut(&Self, &Io),
    ) -> Result<(), EmuError> {
        self.read_checked(addr, buf, mode, true, done)
    }

    /// Read a range a file's extent map says was granted: the map already
    /// took the soft miss, so skip the library-wide one (hard misses still
    /// re-install through `resolve`).
    pub(crate) fn read_mapped(&self, addr: u64, buf: &mut [u8]) -> Result<(), EmuError> {
        self.read_checked(addr, buf, CompletionMode::Dma, false, |_, _| {})
    }

    fn read_checked(
        &self,
        addr: u64,
        buf: &mut [u8],
        mode: CompletionMode,
        soft_check: bool,
        mut done: impl FnMut(&Self, &Io),
    ) -> Result<(), EmuError> {
        let step = self.max_request_bytes() as usize;
        for (i, chunk) in buf.chunks_mut(step).enumerate() {
            let at = addr + (i * step) as u64;
            let mut io = self.prepare(Op::Read, at, chunk.len() as u64, mode)?;
            let result = self
                .start(&mut io, soft_check)
                .and_then(|_| self.wait(&mut io));
            if result.is_ok() {
                chunk.copy_from_slice(self.buffer(&io));
                done(self, &io);
            }
            self.release(io);
            result?;
        }
        Ok(())
    }

    /// Write `buf` at `addr`.
    pub fn write(&self, addr: u64, buf: &[u8]) -> Result<(), EmuError> {
        self.write_with(addr, buf, CompletionMode::Dma)
    }

    pub fn write_with(&self, addr: u64, buf: &[u8], mode: CompletionMode) -> Result<(), EmuError> {
        self.write_checked(addr, buf, mode, true, |_, _| {})
    }

    /// As [`Moneta::write_with`], calling `done` with each completed
    /// request (as [`Moneta::read_each`]).
    pub fn write_each(
        &self,
        addr: u64,
        buf: &[u8],
        mode: CompletionMode,
        done: impl FnMut(&Self, &Io),
    ) -> Result<(), EmuError> {
        self.write_checked(addr, buf, mode, true, done)
    }

    /// Write a range a file's extent map says was granted (as `read_mapped`).
    pub(crate) fn write_mapped(&self, addr: u64, buf: &[u8]) -> Result<(), EmuError> {
        self.write_checked(addr, buf, CompletionMode::Dma, false, |_, _| {})
    }

    fn write_checked(
        &self,
        addr: u64,
        buf: &[u8],
        mode: CompletionMode,
        soft_check: bool,
        mut done: impl FnMut(&Self, &Io),
    ) -> Result<(), EmuError> {
        let step = self.max_request_bytes() as usize;
        for (i, chunk) in buf.chunks(step).enumerate() {
            let at = addr + (i * step) as u64;
            let mut io = self.prepare(Op::Write, at, chunk.len() as u64, mode)?;
            self.buffer_mut(&mut io).copy_from_slice(chunk);
            let result = self
                .start(&mut io, soft_check)
                .and_then(|_| self.wait(&mut io));
            if result.is_ok() {
                done(self, &io);
            }
            self.release(io);
            result?;
        }
        Ok(())
    }

    fn start(&self, io: &mut Io, soft_check: bool) -> Result<(), EmuError> {
        if soft_check {
            self.submit(io)
        } else {
            self.issue(io)
        }
    }
}

thread_local! {
    /// The latest CLOCK_MONOTONIC reading this thread took in the library.
    static CLOCK_SEEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Whether CLOCK_MONOTONIC has reached `t`. The clock never goes back, so
/// a reading this thread already took answers for a due time in its past
/// (a completion seen late, as at high queue depths) without another read.
fn clock_reached(t: u64) -> bool {
    if t <= CLOCK_SEEN.get() {
        return true;
    }
    let now = monotonic_ns();
    CLOCK_SEEN.set(now);
    t <= now
}

fn request_error(io: &Io, code: ResultCode) -> EmuError {
    // A record the hard miss could not bring back means the grant is gone:
    // the file library asks the control plane again (or uses the kernel).
    let kind = match code {
        ResultCode::MissingRecord => ErrorKind::Unauthorized,
        _ => ErrorKind::Request,
    };
    let e = EmuError::new(
        kind,
        format!(
            "{} of {} B at {}: {}",
            io.op.as_str(),
            io.len,
            io.addr,
            code.as_str()
        ),
    );
    // The device's refusal of an access no grant of the channel allows:
    // EACCES, which the file library tells from a failed request (a grant
    // downgraded under a handle that may write is asked for again).
    e.with_errno((code == ResultCode::PermissionDenied).then_some(libc::EACCES))
}
