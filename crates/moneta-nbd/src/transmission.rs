//! The transmission phase, inline on the device's reactor (issue 21 item 1):
//! after `NBD_OPT_GO` a connection's socket is handed to the reactor that
//! turns the export's device, and one poller per server ([`Transmission`],
//! `moneta_emu::reactor::Poller`) reads the requests from the non-blocking
//! sockets, submits them on the connection's channel, and writes the
//! replies when the device completes them, all in the reactor's loop: no
//! thread per connection, and no hop between threads for a request.
//!
//! The device side is the one every client uses: the connection's channel
//! (`moneta::Moneta`, its tags, its DMA buffer), the device's validation,
//! protection, data copy and model timing, and the library's completion
//! check, which reports a request only once its model time has come (the
//! due word), exactly as for any other client. The reactor turns the
//! device and then this poller, so a command submitted in one pass is taken
//! in the next, and its stamp (the submit time) keeps the loop's own
//! order out of its modeled time.
//!
//! Replies of one connection leave in the order its commands arrived (the
//! jobs queue, as the old completer thread did); `FLUSH` waits for every
//! command before it. What may block for long never runs on the reactor:
//! msync (FLUSH and FUA), a hard miss's re-install, and closing a
//! connection (its channel's close waits for the device, i.e. for this
//! very reactor) go to one helper thread per server, which rings the
//! doorbell when done. While the reactor naps, a watcher thread per server
//! sleeps in poll(2) on the epoll descriptor of the server's sockets and
//! rings the doorbell when one is ready (`reactor::watch_while_napping`,
//! the SAN wire's watcher); while it works, the watcher sleeps.

use crate::connection::{Export, Negotiated, ServerCounters, Slot, Stream};
use crate::proto::{self, ProtoError, RequestHeader};
use moneta::{CompletionMode, Io, Moneta};
use moneta_abi::channel::ResultCode;
use moneta_emu::control::ControlPlane;
use moneta_emu::reactor::{Pass, Poller, Wake};
use moneta_model::units::{Ns, Op};
use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// Largest channel request one NBD command is split into.
pub const PIECE: u64 = 128 << 10;

/// Bytes of requests read from a client per system call at most.
const INPUT_BYTES: usize = 256 << 10;

/// Commands parsed but not yet answered, per connection, beyond which the
/// server stops reading (a client that sends without reading replies).
const QUEUE_BOUND: usize = 1024;

/// Reply bytes not yet taken by a client beyond which its requests are no
/// longer read.
const OUTPUT_BOUND: usize = 4 << 20;

/// How often the idle clocks of connections with nothing to do are read.
const IDLE_SWEEP: Duration = Duration::from_millis(10);

/// Socket events taken per pass at most.
const EVENTS: usize = 64;

/// The longest nap this poller allows its reactor: idle timeouts are
/// checked at least this often.
const MAX_NAP_NS: u64 = 50_000_000;

/// A connection that finished negotiating, on its way to the reactor.
pub(crate) struct Handed {
    pub moneta: Moneta,
    pub export: Export,
    pub negotiated: Negotiated,
    pub mode: CompletionMode,
    pub stream: Stream,
    pub slot: Slot,
}

/// Connections the negotiation threads hand over, taken at the next pass.
#[derive(Default)]
pub(crate) struct Handoff {
    waiting: Mutex<Vec<Handed>>,
    pending: AtomicBool,
}

/// One server's transmission side: the poller on the reactor and the two
/// threads around it. Dropping it stops them (and closes every connection).
pub(crate) struct Inline {
    hand: Hand,
    stop: Arc<AtomicBool>,
    /// Set when the poller has left the reactor (its connections handed to
    /// the helper to close).
    left: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Inline {
    /// Put a poller for this server's connections on the reactor of
    /// `plane`'s device.
    pub fn start(
        plane: &Arc<ControlPlane>,
        counters: &Arc<ServerCounters>,
        idle_timeout: Option<Duration>,
    ) -> crate::error::Result<Inline> {
        // SAFETY: epoll_create1 has no preconditions; the result is checked.
        let epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epoll < 0 {
            return Err(crate::error::Error::io(
                "epoll_create1",
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: a fresh descriptor we own.
        let epoll = Arc::new(unsafe { OwnedFd::from_raw_fd(epoll) });
        let engine = plane.engine();
        let wake = engine.wake();
        let stop = Arc::new(AtomicBool::new(false));
        let left = Arc::new(AtomicBool::new(false));
        let handoff = Arc::new(Handoff::default());
        let helped = Arc::new(AtomicBool::new(false));
        let (tasks, queue) = mpsc::channel::<Task>();
        let mut threads = Vec::new();
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| crate::error::Error::io(format!("starting {name}"), e))
        };
        {
            let (plane, wake, helped) = (plane.clone(), wake.clone(), helped.clone());
            let counters = counters.clone();
            threads.push(spawn(
                "moneta-nbd-help",
                Box::new(move || help(&plane, &counters, &wake, &helped, queue)),
            )?);
        }
        {
            let (wake, stop, epoll) = (wake.clone(), stop.clone(), epoll.clone());
            threads.push(spawn(
                "moneta-nbd-watch",
                Box::new(move || {
                    moneta_emu::reactor::watch_while_napping(&wake, &stop, epoll.as_raw_fd())
                }),
            )?);
        }
        engine.add_poller(Box::new(Transmission {
            epoll,
            connections: Vec::new(),
            live: 0,
            handoff: handoff.clone(),
            tasks,
            helped,
            stop: stop.clone(),
            left: left.clone(),
            plane: plane.clone(),
            counters: counters.clone(),
            idle_timeout,
            swept: Instant::now(),
            events: vec![libc::epoll_event { events: 0, u64: 0 }; EVENTS],
        }));
        Ok(Inline {
            hand: Hand {
                handoff,
                wake,
                left: left.clone(),
            },
            stop,
            left,
            threads,
        })
    }

    /// What the negotiation threads hand connections over with.
    pub fn hand(&self) -> Hand {
        self.hand.clone()
    }
}

/// Where negotiated connections go (the negotiation threads keep one).
#[derive(Clone)]
pub(crate) struct Hand {
    handoff: Arc<Handoff>,
    wake: Arc<Wake>,
    left: Arc<AtomicBool>,
}

impl Hand {
    /// Hand a negotiated connection to the reactor. After the poller has
    /// left (the server stopped), it is closed here, on this thread (a
    /// channel's close waits for the reactor, so never on it).
    pub fn hand(&self, c: Handed) {
        self.handoff.waiting.lock().expect("handoff").push(c);
        self.handoff.pending.store(true, Ordering::SeqCst);
        self.wake.ring();
        // The poller sets `left` after its last take: either it took this
        // one, or this sees `left` and takes it back.
        if self.left.load(Ordering::SeqCst) {
            let late = std::mem::take(&mut *self.handoff.waiting.lock().expect("handoff"));
            drop(late);
        }
    }
}

impl Drop for Inline {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let wake = &self.hand.wake;
        wake.ring();
        let began = Instant::now();
        // The poller hands its connections to the helper and leaves.
        while !self.left.load(Ordering::Acquire) && began.elapsed() < Duration::from_secs(30) {
            wake.ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        wake.nudge_watchers();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Work that may block, done off the reactor.
enum Task {
    /// Make the medium durable; the result (0 or an NBD error) into the slot.
    Flush(Arc<Mutex<Option<u32>>>),
    /// A hard miss: re-install the record and run the request again
    /// (`Moneta::wait`'s recovery); the request and whether it succeeded
    /// come back in the slot.
    Recover {
        moneta: Moneta,
        io: Io,
        back: Arc<Mutex<Option<(Io, bool)>>>,
    },
    /// Wait for a connection's requests on the device, then close its
    /// channel and give its slot back.
    Close(Box<Connection>),
}

/// The helper thread: runs tasks in order until the poller is gone.
fn help(
    plane: &ControlPlane,
    counters: &ServerCounters,
    wake: &Wake,
    helped: &AtomicBool,
    queue: mpsc::Receiver<Task>,
) {
    while let Ok(task) = queue.recv() {
        match task {
            Task::Flush(slot) => {
                let error = match plane.engine().medium().flush() {
                    Ok(()) => 0,
                    Err(_) => proto::EIO,
                };
                *slot.lock().expect("flush") = Some(error);
            }
            Task::Recover {
                moneta,
                mut io,
                back,
            } => {
                let ok = moneta.wait(&mut io).is_ok();
                counters.recovered.fetch_add(1, Ordering::Relaxed);
                *back.lock().expect("recover") = Some((io, ok));
            }
            Task::Close(mut c) => {
                for job in c.jobs.drain(..) {
                    let Job::Command(command) = job else { continue };
                    for piece in command.pieces {
                        let io = match piece.state {
                            PieceState::Device(mut io) => {
                                let _ = c.moneta.wait(&mut io);
                                io
                            }
                            PieceState::Recovering(back) => loop {
                                if let Some((io, _)) = back.lock().expect("recover").take() {
                                    break io;
                                }
                                std::thread::sleep(Duration::from_micros(100));
                            },
                        };
                        c.moneta.release(io);
                    }
                }
                // The channel closes (the device applies it) and the
                // connection's slot is free.
                drop(c);
            }
        }
        helped.store(true, Ordering::SeqCst);
        wake.ring();
    }
}

/// The poller: every transmitting connection of one server.
struct Transmission {
    epoll: Arc<OwnedFd>,
    /// By the index registered with epoll.
    connections: Vec<Option<Box<Connection>>>,
    live: usize,
    handoff: Arc<Handoff>,
    tasks: mpsc::Sender<Task>,
    /// The helper finished a task since the last look.
    helped: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    left: Arc<AtomicBool>,
    plane: Arc<ControlPlane>,
    counters: Arc<ServerCounters>,
    idle_timeout: Option<Duration>,
    /// When quiet connections' idle clocks were last looked at.
    swept: Instant,
    events: Vec<libc::epoll_event>,
}

/// One connection in its transmission phase.
pub(crate) struct Connection {
    moneta: Moneta,
    export: Export,
    negotiated: Negotiated,
    mode: CompletionMode,
    stream: Stream,
    _slot: Slot,
    /// Bytes read and not yet parsed: `input[input_at..input_end]`.
    input: Vec<u8>,
    input_at: usize,
    input_end: usize,
    /// epoll said the socket has bytes (or its end) to read.
    readable: bool,
    /// The last write found the socket full: wait for EPOLLOUT.
    write_blocked: bool,
    /// Pieces on the device (issued, not yet seen complete).
    on_device: usize,
    /// Reply bytes not yet written: `output[output_at..]`.
    output: Vec<u8>,
    output_at: usize,
    /// Commands in arrival order, answered in it.
    jobs: VecDeque<Job>,
    /// Requests are still read (no DISC, no end of input, no broken request).
    reading: bool,
    /// The client is gone: nothing more is issued or answered.
    hung_up: bool,
    /// The epoll events asked for now.
    interest: u32,
    /// The last byte read or reply queued: the idle clock counts from it.
    last_activity: Instant,
}

enum Job {
    Command(Box<Command>),
    /// Make everything before durable, then answer.
    Flush {
        cookie: u64,
        done: Option<Arc<Mutex<Option<u32>>>>,
    },
    /// Bytes to send as they are (error and no-op replies).
    Reply(Vec<u8>),
}

/// A read, write or write-zeroes, split into pieces on the channel.
struct Command {
    header: RequestHeader,
    op: Op,
    /// A write's payload (empty: zeroes), or a read's data as it arrives.
    data: Vec<u8>,
    /// Bytes issued so far (all of them, or up to a failure).
    issued: u64,
    pieces: VecDeque<Piece>,
    /// First error of any piece (0: none).
    error: u32,
    /// FUA: the flush after the last piece, once asked for.
    fua: Option<Arc<Mutex<Option<u32>>>>,
}

struct Piece {
    /// Its offset in the command.
    at: u64,
    state: PieceState,
}

enum PieceState {
    Device(Io),
    /// A hard miss being recovered on the helper.
    Recovering(Arc<Mutex<Option<(Io, bool)>>>),
}

/// What one connection's turn found.
#[derive(Default)]
struct Turn {
    worked: bool,
    /// A request on the device: the reactor keeps spinning.
    busy: bool,
    /// Finished: close it.
    done: bool,
}

impl Poller for Transmission {
    fn poll(&mut self) -> Pass {
        if self.stop.load(Ordering::Acquire) || self.plane.engine().is_stopping() {
            self.leave();
            return Pass::Finished;
        }
        let mut worked = self.helped.swap(false, Ordering::AcqRel);
        if self.handoff.pending.load(Ordering::Acquire) {
            self.take_handed();
            worked = true;
        }
        if self.live == 0 {
            return if worked { Pass::Worked } else { Pass::Idle };
        }
        // SAFETY: `events` holds EVENTS entries; a zero timeout never blocks.
        let ready = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                self.events.as_mut_ptr(),
                EVENTS as i32,
                0,
            )
        };
        for e in &self.events[..ready.max(0) as usize] {
            let (index, events) = (e.u64 as usize, e.events);
            if let Some(c) = self.connections.get_mut(index).and_then(|c| c.as_mut()) {
                if events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 != 0 {
                    // Closed by the peer (not only its writing side).
                    c.hang_up(&self.counters);
                }
                c.readable |= events & (libc::EPOLLIN | libc::EPOLLRDHUP) as u32 != 0;
                if events & libc::EPOLLOUT as u32 != 0 {
                    c.write_blocked = false;
                }
            }
        }
        let now = Instant::now();
        // Quiet connections are looked at only for their idle clocks, and
        // only this often.
        let sweep = self.idle_timeout.is_some() && now.duration_since(self.swept) >= IDLE_SWEEP;
        if sweep {
            self.swept = now;
        }
        let mut busy = false;
        for index in 0..self.connections.len() {
            let Some(c) = self.connections[index].as_mut() else {
                continue;
            };
            if !sweep && c.quiet() {
                continue;
            }
            let turn = if c.hung_up {
                Turn {
                    done: true,
                    ..Turn::default()
                }
            } else {
                c.turn(now, &self.counters, self.idle_timeout, &self.tasks)
            };
            worked |= turn.worked;
            busy |= turn.busy;
            if turn.done {
                worked = true;
                self.close(index);
            } else {
                c_interest(
                    self.epoll.as_raw_fd(),
                    index,
                    self.connections[index].as_mut(),
                );
            }
        }
        if worked {
            Pass::Worked
        } else if busy {
            Pass::Busy
        } else {
            Pass::Idle
        }
    }

    fn prepare_nap(&mut self) -> bool {
        // Sockets wake the reactor through the watcher (level-triggered:
        // readiness from before the nap is seen at once); what the helper
        // finished and new connections are looked at here.
        self.helped.load(Ordering::SeqCst) || self.handoff.pending.load(Ordering::SeqCst)
    }

    fn end_nap(&mut self, _napped: bool) {}

    fn idle_spin_ns(&self) -> Ns {
        0
    }

    fn max_nap_ns(&self) -> u64 {
        MAX_NAP_NS
    }
}

/// Ask epoll for what the connection waits for now (if it changed).
fn c_interest(epoll: RawFd, index: usize, c: Option<&mut Box<Connection>>) {
    let Some(c) = c else { return };
    let want = c.wanted();
    if want != c.interest {
        c.interest = want;
        epoll_ctl(epoll, libc::EPOLL_CTL_MOD, c.stream.fd(), index, want);
    }
}

fn epoll_ctl(epoll: RawFd, op: i32, fd: RawFd, index: usize, events: u32) {
    let mut e = libc::epoll_event {
        events,
        u64: index as u64,
    };
    // SAFETY: a valid event for the call; errors (a closed descriptor) leave
    // nothing to undo.
    unsafe { libc::epoll_ctl(epoll, op, fd, &mut e) };
}

impl Transmission {
    fn take_handed(&mut self) {
        self.handoff.pending.store(false, Ordering::SeqCst);
        let handed = std::mem::take(&mut *self.handoff.waiting.lock().expect("handoff"));
        for h in handed {
            if h.stream.set_nonblocking().is_err() {
                let _ = self.tasks.send(Task::Close(Box::new(Connection::new(h))));
                continue;
            }
            let c = Box::new(Connection::new(h));
            let index = match self.connections.iter().position(|c| c.is_none()) {
                Some(i) => i,
                None => {
                    self.connections.push(None);
                    self.connections.len() - 1
                }
            };
            epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                c.stream.fd(),
                index,
                c.interest,
            );
            self.connections[index] = Some(c);
            self.live += 1;
        }
    }

    /// Off epoll, the socket shut, the rest (its requests on the device,
    /// its channel) to the helper.
    fn close(&mut self, index: usize) {
        let c = self.connections[index].take().expect("live");
        self.live -= 1;
        epoll_ctl(
            self.epoll.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            c.stream.fd(),
            index,
            0,
        );
        c.stream.shutdown();
        let _ = self.tasks.send(Task::Close(c));
    }

    /// The server or the device stops: every connection to the helper.
    fn leave(&mut self) {
        self.take_handed();
        for index in 0..self.connections.len() {
            if self.connections[index].is_some() {
                self.close(index);
            }
        }
        self.left.store(true, Ordering::SeqCst);
    }
}

impl Connection {
    fn new(h: Handed) -> Connection {
        Connection {
            moneta: h.moneta,
            export: h.export,
            negotiated: h.negotiated,
            mode: h.mode,
            stream: h.stream,
            _slot: h.slot,
            input: vec![0u8; INPUT_BYTES],
            input_at: 0,
            input_end: 0,
            // Requests may have come with the end of the negotiation.
            readable: true,
            write_blocked: false,
            on_device: 0,
            output: Vec::new(),
            output_at: 0,
            jobs: VecDeque::new(),
            reading: true,
            hung_up: false,
            interest: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            last_activity: Instant::now(),
        }
    }

    /// Nothing to read, parse, answer or write: only its idle clock may
    /// end it. Requests already read but not parsed count: a turn parses
    /// before it writes, so a turn whose write drained the replies that
    /// held parsing back (`OUTPUT_BOUND`) leaves them for the next one,
    /// and no socket event will come for bytes already read.
    fn quiet(&self) -> bool {
        !self.readable
            && !self.hung_up
            && self.reading
            && self.jobs.is_empty()
            && self.output_at == self.output.len()
            && !self.holds_request()
    }

    /// A whole request (header and a write's payload) is in the input.
    fn holds_request(&self) -> bool {
        let held = self.input_end - self.input_at;
        held >= proto::REQUEST_BYTES && held >= self.wanted_input()
    }

    fn hang_up(&mut self, counters: &ServerCounters) {
        if !self.hung_up && !self.jobs.is_empty() {
            counters.hung_up.fetch_add(1, Ordering::Relaxed);
        }
        self.hung_up = true;
    }

    /// New commands wait: too many unanswered, one not yet fully issued
    /// (its tags are busy), or replies the client has not taken.
    fn backlogged(&self) -> bool {
        self.jobs.len() >= QUEUE_BOUND
            || self.output.len() - self.output_at >= OUTPUT_BOUND
            || matches!(self.jobs.back(), Some(Job::Command(c)) if c.issued < c.header.length as u64 && c.error == 0)
    }

    fn wanted(&self) -> u32 {
        let mut want = 0;
        if self.reading && !self.backlogged() {
            want |= (libc::EPOLLIN | libc::EPOLLRDHUP) as u32;
        }
        if self.output_at < self.output.len() {
            want |= libc::EPOLLOUT as u32;
        }
        want
    }

    /// One look at the connection: read, parse, issue, complete, write.
    fn turn(
        &mut self,
        now: Instant,
        counters: &ServerCounters,
        idle_timeout: Option<Duration>,
        tasks: &mpsc::Sender<Task>,
    ) -> Turn {
        let mut t = Turn::default();
        if self.readable && self.reading && !self.backlogged() {
            t.worked |= self.read(counters);
            if self.hung_up {
                t.done = true;
                return t;
            }
            if t.worked {
                self.last_activity = now;
            }
        }
        t.worked |= self.issue();
        t.worked |= self.parse(counters);
        if self.complete(tasks) {
            t.worked = true;
            self.last_activity = now;
        }
        t.busy = self.on_device > 0;
        if !self.write_blocked {
            t.worked |= self.write(counters);
        }
        if self.hung_up {
            t.done = true;
            return t;
        }
        let quiet = self.jobs.is_empty() && self.output_at == self.output.len();
        if quiet && !self.reading {
            // DISC, the end of the client's input, or a broken request:
            // everything before it is answered.
            t.done = true;
        } else if let Some(idle) = idle_timeout {
            if quiet && now.duration_since(self.last_activity) >= idle {
                counters.idle_closed.fetch_add(1, Ordering::Relaxed);
                t.done = true;
            }
        }
        t
    }

    /// Read what the socket holds (up to the input buffer's end, which is
    /// grown to hold a large write's payload). Returns whether bytes came.
    fn read(&mut self, counters: &ServerCounters) -> bool {
        if self.input_at == self.input_end {
            self.input_at = 0;
            self.input_end = 0;
            if self.input.len() > INPUT_BYTES {
                // After a large write.
                self.input.truncate(INPUT_BYTES);
                self.input.shrink_to_fit();
            }
        }
        let need = self.wanted_input();
        if self.input_at > 0
            && (self.input.len() - self.input_at < need || self.input_at >= self.input.len() / 2)
        {
            self.input.copy_within(self.input_at..self.input_end, 0);
            self.input_end -= self.input_at;
            self.input_at = 0;
        }
        if need > self.input.len() {
            self.input.resize(need, 0);
        }
        let mut any = false;
        while self.input_end < self.input.len() {
            match self.stream.read(&mut self.input[self.input_end..]) {
                Ok(0) => {
                    // No DISC: a client that closed its socket is gone
                    // (epoll says so: HUP); one that only stopped writing
                    // still gets its replies.
                    self.reading = false;
                    self.readable = false;
                    return any;
                }
                Ok(n) => {
                    self.input_end += n;
                    any = true;
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => {
                        self.readable = false;
                        return any;
                    }
                    io::ErrorKind::Interrupted => {}
                    _ => {
                        self.hang_up(counters);
                        return any;
                    }
                },
            }
        }
        // The buffer is full: the rest is read once it is parsed.
        any
    }

    /// Bytes the next request needs in full (header and a write's payload).
    fn wanted_input(&self) -> usize {
        let held = &self.input[self.input_at..self.input_end];
        if held.len() < proto::REQUEST_BYTES {
            return proto::REQUEST_BYTES;
        }
        let kind = u16::from_be_bytes([held[6], held[7]]);
        let length = u32::from_be_bytes(held[24..28].try_into().expect("4"));
        if kind == proto::CMD_WRITE && length <= proto::MAX_PAYLOAD {
            proto::REQUEST_BYTES + length as usize
        } else {
            proto::REQUEST_BYTES
        }
    }

    /// Turn the complete requests held into jobs. Returns whether any.
    fn parse(&mut self, counters: &ServerCounters) -> bool {
        let mut any = false;
        while self.reading && !self.backlogged() {
            if !self.holds_request() {
                break;
            }
            any = true;
            let raw: &[u8; proto::REQUEST_BYTES] = self.input
                [self.input_at..self.input_at + proto::REQUEST_BYTES]
                .try_into()
                .expect("28");
            let h = match proto::parse_request(raw) {
                Ok(h) => h,
                Err(ProtoError(m)) => {
                    self.broken(&m);
                    break;
                }
            };
            counters.commands.fetch_add(1, Ordering::Relaxed);
            if h.kind == proto::CMD_WRITE && h.length > proto::MAX_PAYLOAD {
                // Its payload cannot be skipped safely: close.
                self.broken(&format!("write of {} bytes", h.length));
                break;
            }
            self.input_at += proto::REQUEST_BYTES;
            let mut payload = Vec::new();
            if h.kind == proto::CMD_WRITE {
                let end = self.input_at + h.length as usize;
                payload.extend_from_slice(&self.input[self.input_at..end]);
                self.input_at = end;
            }
            self.accept(h, payload);
            // Issued at once: the next request waits if its tags are busy.
            self.issue();
        }
        any
    }

    /// A request the protocol cannot go on from: answer what came before,
    /// read nothing more, close.
    fn broken(&mut self, why: &str) {
        if std::env::var_os("MONETA_NBD_DEBUG").is_some() {
            eprintln!("monetad: NBD connection: {why}");
        }
        self.reading = false;
    }

    /// Queue the job a parsed request asks for.
    fn accept(&mut self, h: RequestHeader, payload: Vec<u8>) {
        let structured = self.negotiated.structured;
        let checked = proto::check_request(
            &h,
            self.export.size,
            self.export.read_only,
            structured,
            self.negotiated.meta,
        );
        if let Err(error) = checked {
            self.jobs.push_back(Job::Reply(error_reply(
                structured, h.cookie, error, "refused",
            )));
            return;
        }
        let job = match h.kind {
            proto::CMD_DISC => {
                self.reading = false;
                return;
            }
            proto::CMD_READ => self.command(h, Op::Read, vec![0u8; h.length as usize]),
            proto::CMD_WRITE => self.command(h, Op::Write, payload),
            proto::CMD_WRITE_ZEROES => {
                if h.flags & proto::CMD_FLAG_FAST_ZERO != 0 {
                    // Zeroes cost the device as much as any write.
                    let m = "zeroing is not faster than writing";
                    Job::Reply(error_reply(structured, h.cookie, proto::ENOTSUP, m))
                } else {
                    self.command(h, Op::Write, Vec::new())
                }
            }
            proto::CMD_FLUSH => Job::Flush {
                cookie: h.cookie,
                done: None,
            },
            // Trim is advisory and the device keeps every byte; cache has
            // nothing to warm. A FUA trim is a write: it waits for a flush.
            proto::CMD_TRIM | proto::CMD_CACHE => {
                if h.kind == proto::CMD_TRIM && h.flags & proto::CMD_FLAG_FUA != 0 {
                    Job::Flush {
                        cookie: h.cookie,
                        done: None,
                    }
                } else {
                    Job::Reply(proto::simple_reply(0, h.cookie).to_vec())
                }
            }
            proto::CMD_BLOCK_STATUS => Job::Reply(proto::block_status_chunk(h.cookie, h.length)),
            _ => unreachable!("check_request lets known commands through only"),
        };
        self.jobs.push_back(job);
    }

    fn command(&self, header: RequestHeader, op: Op, data: Vec<u8>) -> Job {
        Job::Command(Box::new(Command {
            header,
            op,
            data,
            issued: 0,
            pieces: VecDeque::new(),
            error: 0,
            fua: None,
        }))
    }

    /// Issue the pieces of the last command while the channel has tags.
    fn issue(&mut self) -> bool {
        let Some(Job::Command(command)) = self.jobs.back_mut() else {
            return false;
        };
        let len = command.header.length as u64;
        let mut any = false;
        while command.issued < len && command.error == 0 {
            let at = command.issued;
            let n = PIECE.min(len - at);
            let addr = self.export.start + command.header.offset + at;
            let mut io = match self.moneta.try_prepare(command.op, addr, n, self.mode) {
                Ok(Some(io)) => io,
                // Every tag is busy: the next turn goes on.
                Ok(None) => break,
                Err(_) => {
                    command.error = proto::EIO;
                    break;
                }
            };
            if command.op == Op::Write {
                let buf = self.moneta.buffer_mut(&mut io);
                if command.data.is_empty() {
                    buf.fill(0);
                } else {
                    buf.copy_from_slice(&command.data[at as usize..(at + n) as usize]);
                }
            }
            if self.moneta.submit(&mut io).is_err() {
                self.moneta.release(io);
                command.error = proto::EIO;
                break;
            }
            command.pieces.push_back(Piece {
                at,
                state: PieceState::Device(io),
            });
            self.on_device += 1;
            command.issued += n;
            any = true;
        }
        any
    }

    /// Answer the jobs at the front that are finished. Returns whether any
    /// progress was made.
    fn complete(&mut self, tasks: &mpsc::Sender<Task>) -> bool {
        let structured = self.negotiated.structured;
        let mut any = false;
        while let Some(job) = self.jobs.front_mut() {
            match job {
                Job::Reply(bytes) => {
                    let bytes = std::mem::take(bytes);
                    self.output.extend_from_slice(&bytes);
                }
                Job::Flush { cookie, done } => {
                    let Some(error) = flushed(done, tasks) else {
                        return any;
                    };
                    let reply = reply_bytes(structured, *cookie, error);
                    self.output.extend_from_slice(&reply);
                }
                Job::Command(command) => {
                    let (moved, done) =
                        finish_pieces(&self.moneta, command, &mut self.on_device, tasks);
                    any |= moved;
                    if !done {
                        return any;
                    }
                    let h = command.header;
                    let mut error = command.error;
                    // FUA makes the command's own writes durable; a read
                    // has none (the protocol lets a server ignore the bit).
                    if error == 0 && h.kind != proto::CMD_READ && h.flags & proto::CMD_FLAG_FUA != 0
                    {
                        match flushed(&mut command.fua, tasks) {
                            Some(e) => error = e,
                            None => return any,
                        }
                    }
                    if h.kind == proto::CMD_READ && error == 0 {
                        if structured {
                            let header = proto::chunk_header(
                                proto::REPLY_FLAG_DONE,
                                proto::REPLY_TYPE_OFFSET_DATA,
                                h.cookie,
                                8 + h.length,
                            );
                            self.output.extend_from_slice(&header);
                            self.output.extend_from_slice(&h.offset.to_be_bytes());
                        } else {
                            self.output
                                .extend_from_slice(&proto::simple_reply(0, h.cookie));
                        }
                        self.output.extend_from_slice(&command.data);
                    } else if error != 0 {
                        let reply = error_reply(structured, h.cookie, error, "device error");
                        self.output.extend_from_slice(&reply);
                    } else {
                        self.output
                            .extend_from_slice(&reply_bytes(structured, h.cookie, 0));
                    }
                }
            }
            self.jobs.pop_front();
            any = true;
        }
        any
    }

    /// Write the replies held; a client that stopped reading keeps them
    /// until it can take them (its requests wait meanwhile).
    fn write(&mut self, counters: &ServerCounters) -> bool {
        let mut any = false;
        while self.output_at < self.output.len() {
            match self.stream.write(&self.output[self.output_at..]) {
                Ok(0) => break,
                Ok(n) => {
                    self.output_at += n;
                    any = true;
                }
                Err(e) => match e.kind() {
                    io::ErrorKind::WouldBlock => {
                        self.write_blocked = true;
                        break;
                    }
                    io::ErrorKind::Interrupted => {}
                    _ => {
                        // The peer reset the connection: it is gone.
                        self.hang_up(counters);
                        break;
                    }
                },
            }
        }
        if self.output_at == self.output.len() {
            self.output.clear();
            self.output_at = 0;
        }
        any
    }
}

/// Take the command's finished pieces, in order: a read's bytes into its
/// data, the tags back to the channel. A hard miss goes to the helper.
/// Returns whether any finished, and whether the command is done (every
/// piece it will issue issued and finished).
fn finish_pieces(
    moneta: &Moneta,
    command: &mut Command,
    on_device: &mut usize,
    tasks: &mpsc::Sender<Task>,
) -> (bool, bool) {
    let mut moved = false;
    while let Some(piece) = command.pieces.front_mut() {
        let (io, ok) = match &mut piece.state {
            PieceState::Device(io) => match moneta.try_finish(io) {
                None => return (moved, false),
                Some(code) => {
                    *on_device -= 1;
                    match code {
                        ResultCode::Ok => (None, true),
                        ResultCode::MissingRecord | ResultCode::PermissionDenied => {
                            // The record was evicted: re-installing it is a
                            // control-plane call, which waits for this reactor.
                            let back = Arc::new(Mutex::new(None));
                            let PieceState::Device(io) = std::mem::replace(
                                &mut piece.state,
                                PieceState::Recovering(back.clone()),
                            ) else {
                                unreachable!("matched above")
                            };
                            let _ = tasks.send(Task::Recover {
                                moneta: moneta.clone(),
                                io,
                                back,
                            });
                            return (moved, false);
                        }
                        _ => (None, false),
                    }
                }
            },
            PieceState::Recovering(back) => {
                let Some((io, ok)) = back.lock().expect("recover").take() else {
                    return (moved, false);
                };
                (Some(io), ok)
            }
        };
        let piece = command.pieces.pop_front().expect("front");
        let io = match (io, piece.state) {
            (Some(io), _) => io,
            (None, PieceState::Device(io)) => io,
            (None, PieceState::Recovering(_)) => {
                unreachable!("recovered pieces carry their request")
            }
        };
        if !ok {
            command.error = proto::EIO;
        } else if io.op() == Op::Read {
            let at = piece.at as usize;
            command.data[at..at + io.len() as usize].copy_from_slice(moneta.buffer(&io));
        }
        moneta.release(io);
        moved = true;
    }
    let issuing = command.issued < command.header.length as u64 && command.error == 0;
    (moved, !issuing)
}

/// The flush a job waits for: asked of the helper the first time, its
/// result once it has one.
fn flushed(done: &mut Option<Arc<Mutex<Option<u32>>>>, tasks: &mpsc::Sender<Task>) -> Option<u32> {
    match done {
        None => {
            let slot = Arc::new(Mutex::new(None));
            let _ = tasks.send(Task::Flush(slot.clone()));
            *done = Some(slot);
            None
        }
        Some(slot) => *slot.lock().expect("flush"),
    }
}

pub(crate) fn error_reply(structured: bool, cookie: u64, error: u32, message: &str) -> Vec<u8> {
    if structured {
        proto::error_chunk(cookie, error, message)
    } else {
        proto::simple_reply(error, cookie).to_vec()
    }
}

fn reply_bytes(structured: bool, cookie: u64, error: u32) -> Vec<u8> {
    if error == 0 {
        proto::simple_reply(0, cookie).to_vec()
    } else {
        error_reply(structured, cookie, error, "flush failed")
    }
}
