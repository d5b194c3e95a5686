//! The emulated device (DESIGN "One model, two clocks", SPEC §1.2–1.4, §3):
//! the simulator's `Device` driven by the wall clock, holding real bytes,
//! reached through channels in shared memory.
//!
//! A **reactor** (reactor.rs) turns the device: its own thread
//! (`moneta-device`), or one it shares with other devices (a SAN's nodes in
//! one daemon). Below, "the device thread" is whichever reactor turns it.
//! Each turn it
//!
//! 1. applies control-plane operations (new and closed channels, permission
//!    updates: the OS edits, the device applies them between commands, so
//!    protection checks are suspended while it does, SPEC §3.3);
//! 2. takes new commands from the channels' command slots (those whose
//!    SUBMITTED bits flipped since the last look), validating every
//!    field (the device trusts nothing in shared memory): decode, tag, DMA
//!    buffer bounds, capacity; then retag (stall if no physical tag is free),
//!    protection (the channel's permission tree; the walk's steps × 12 ns
//!    become part of the request's modeled time), the data copy between the
//!    channel's DMA buffer and the medium, and submission to the model at the
//!    time the client stamped on the command (see below);
//! 3. delivers every model event whose time has come, handing it its own
//!    model time (so the model computes exactly what the simulator would);
//! 4. posts every request that finished during the turn, all at once (one
//!    clock read): DMA completion writes the tag's status word; interrupt
//!    completion sets the tag's bit and interrupts the kernel role (SPEC §3.5).
//!
//! Steps 2 and 3 after validation are the model's `DeviceDriver` (retag,
//! protection, the event queue), the same code the simulator runs; the
//! device thread only adds the shared-memory side. Its logic takes `now` as
//! a parameter (`DeviceThread::turn`), so a test can drive it on a manual
//! clock and compare it with the simulator (`engine/twin.rs`).
//!
//! Data moves at submission: the device copies write data into the medium
//! and read data into the DMA buffer when it accepts the command. The client
//! may look only after the completion, which the model times. Reads and
//! writes are therefore linearized in the order the device accepts them (as
//! with one FIFO queue); a client that wants ordering waits for completions.
//!
//! A **kernel-role thread** plays the interrupt handler of SPEC §3.5: it
//! sleeps until the device interrupts, pops the error queue and forwards each
//! code into the channel (error word, then the tag's TAGSTATUSREGISTER bit),
//! reads and clears CHANNELSTATUS, and bumps each signalled channel's
//! COMPLETIONCOUNT, waking the channel's sleeping threads (issue-sleep).
//!
//! Timing precision: a request enters the model at the time its client
//! stamped on it (clamped: not in the future, not before the tag's previous
//! completion was posted, not before model time the device already passed),
//! so the poll period and the hop between cores do not count as device time.
//! A completion is posted at the first poll at or after its model time, or
//! up to `post_ahead_ns` before it while it is the only request in flight
//! (its due word tells the library when it may report it);
//! [`EngineStats::lateness_ns_mean`] and friends report how late (typically
//! well under a microsecond with the device thread on its own core), and
//! [`EngineStats::accept_delay_ns_mean`] how long commands waited to be seen.
//! Idle for `idle_spin_ns`, the device thread naps on the doorbell futex
//! instead of spinning, so an idle daemon does not burn a core; a client that
//! submits while it naps rings the doorbell (channel.rs), and the stamp
//! keeps the wake-up out of the request's modeled time.
//!
//! A SAN node ([`Engine::start_san`], QuickSAN, SPEC §4) has the model's
//! network port on a real wire (`engine/port.rs`): channel addresses are
//! global, and each turn also moves the port's frames and bytes. Idle, the
//! device thread of a SAN node spins only `SAN_IDLE_SPIN_NS` before it naps
//! (several daemons share this machine's cores), and a watcher thread
//! sleeping in poll(2) on the link rings the doorbell when a frame comes
//! while it naps.

use crate::medium::Medium;
use crate::reactor::{Pass, Poller, Reactor, Wake};
use crate::sys;
use crate::wall_clock::WallClock;
use moneta_abi::channel::{
    self, ChannelMemory, ResultCode, CHANNELS, CHANNEL_TAGS, DMA_BUFFER_BYTES, SLICE_BYTES,
};
use moneta_abi::error::{EmuError, ErrorKind};
use moneta_model::breakdown::Breakdown;
use moneta_model::config::Config;
use moneta_model::device::command::{self, CommandFormat, CommandLimits};
use moneta_model::device::driver::{ChannelRefusal, ChannelRequest, DeviceDriver, Finished};
use moneta_model::device::network::{NetworkPort, RouteTable};
use moneta_model::device::protection::{self, Update};
use moneta_model::device::retag::RoundRobin;
use moneta_model::kernel::Clock;
use moneta_model::stats::LatencyHistogram;
use moneta_model::units::{DeviceAddr, Ns, Op};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Duration;

/// Errors of one channel that may wait in the hardware error queue (SPEC
/// §3.5) for the kernel role. A channel at this limit is not polled until
/// they are forwarded, so a client flooding the device with bad commands
/// stalls only itself, and the queue (at most this × 1024 entries, allocated
/// once) never drops an entry.
const ERRORS_PER_CHANNEL: u32 = 64;
/// How long control operations wait for the device thread to act on them.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// The default of [`EngineOptions::post_ahead_ns`]: more than a cross-core
/// cache-line transfer plus a poll on the machines measured (300 ns still
/// left completions late here; README "Fidelity").
pub const DEFAULT_POST_AHEAD_NS: u64 = 1000;

/// The longest nap of a SAN node's idle device thread (frames usually wake
/// it at once through the watcher; those a fault injector holds back wait
/// for the end of the nap).
pub const SAN_MAX_NAP_NS: u64 = 200_000;
/// The longest nap of a SAN node's device thread whose port is idle (no
/// frame unacknowledged or held, no acknowledgement owed, no resync or
/// failover under way: `PortState::is_idle`): its next timers are the
/// views and heartbeats, milliseconds away.
pub const SAN_IDLE_NAP_NS: u64 = 2_000_000;
/// How long a SAN node's device thread spins idle before it naps, by
/// default (`EngineOptions::san_idle_spin_ns`).
pub const SAN_IDLE_SPIN_NS: u64 = 50_000;

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Seed for the model's randomized parts (start-gap address randomization).
    pub seed: u64,
    /// After this long without work the device thread naps instead of spinning.
    pub idle_spin_ns: u64,
    /// The longest nap: bounds what a lost or scribbled-away doorbell ring
    /// costs (a ring ends a nap at once).
    pub max_nap_ns: u64,
    /// While a single request is in flight in the device, deliver model
    /// events up to this far ahead of the wall clock, so that its completion
    /// reaches the client's core by its due time (the library holds it until
    /// then): it hides the hop between cores and the poll. A command that
    /// arrives meanwhile from another client enters the model no earlier
    /// than the time already delivered, so it may be held back by up to
    /// this much. With more requests in flight, completions are posted at
    /// their model time. 0 = always at the model time.
    pub post_ahead_ns: u64,
    /// Fault in the first this-many bytes of the medium before starting, so
    /// that benchmarks do not measure the kernel's first-touch page faults.
    pub populate_bytes: u64,
    /// A SAN node's `idle_spin_ns` (several daemons share the cores).
    pub san_idle_spin_ns: u64,
    /// Run the device thread under SCHED_FIFO ([`moneta_abi::sys::REALTIME_PRIORITY`]): on a
    /// host with more runnable threads than cores it is not made to wait
    /// for one (issue 21). Off by default: spinning real-time threads
    /// starve everything else on their core while they spin.
    pub realtime: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            seed: 1,
            idle_spin_ns: 2_000_000,
            max_nap_ns: 100_000_000,
            post_ahead_ns: DEFAULT_POST_AHEAD_NS,
            populate_bytes: 0,
            san_idle_spin_ns: SAN_IDLE_SPIN_NS,
            realtime: false,
        }
    }
}

use moneta_abi::stats::ClientStats;
// What the device thread has done so far (the `stats` reply, so it is
// defined with the protocol).
use moneta_abi::stats::EngineStats;

enum ControlOp {
    AddChannel {
        id: u16,
        memory: Arc<ChannelMemory>,
        done: mpsc::SyncSender<()>,
    },
    /// Stop taking commands, finish what is in flight, drop the channel's
    /// permissions and free it.
    RemoveChannel {
        id: u16,
        done: mpsc::SyncSender<ClientStats>,
    },
    /// One open channel's counters (None: not open).
    ClientStats {
        id: u16,
        done: mpsc::SyncSender<Option<ClientStats>>,
    },
    Permissions {
        updates: Vec<Update>,
        done: mpsc::SyncSender<Result<(), String>>,
    },
    Stats {
        done: mpsc::SyncSender<EngineStats>,
    },
    /// A SAN node's view of why a request on a range found no copy.
    SanExplain {
        addr: u64,
        len: u64,
        done: mpsc::SyncSender<Option<String>>,
    },
    /// A SAN node discards its writes in split-brain slices (all, or one).
    SanDiscard {
        slice: Option<usize>,
        done: mpsc::SyncSender<Result<String, String>>,
    },
    /// A SAN node forces its outdated copies up to date (all, or one).
    SanForce {
        slice: Option<usize>,
        done: mpsc::SyncSender<Result<String, String>>,
    },
}

/// One entry of the hardware error queue (SPEC §3.5).
#[derive(Debug, Clone, Copy)]
struct ErrorEntry {
    channel: u16,
    tag: u8,
    code: ResultCode,
}

/// State shared by the device thread, the kernel-role thread and the control plane.
struct Shared {
    config: Config,
    medium: Medium,
    address_space_bytes: u64,
    stop: AtomicBool,
    mailbox: Mutex<Vec<ControlOp>>,
    mailbox_pending: AtomicBool,
    /// Channel ids in use (index 0 is the trusted channel, never handed out).
    allocated: Mutex<Vec<bool>>,
    /// Mappings the kernel role needs to forward completions.
    channels: RwLock<Vec<Option<Arc<ChannelMemory>>>>,
    /// CHANNELSTATUS: a bit per channel with completions or errors (read and clear).
    channel_status: Vec<AtomicU64>,
    error_queue: Mutex<VecDeque<ErrorEntry>>,
    /// Entries of each channel in `error_queue`.
    errors_queued: Vec<AtomicU32>,
    /// Interrupt line: bumped by the device, the kernel role sleeps on it.
    interrupt_word: AtomicU32,
    kernel_sleeping: AtomicBool,
    /// The doorbell of the reactor that turns this device (shared with the
    /// other devices it hosts): clients and the control plane ring it; the
    /// wire watcher sleeps on its nap word.
    wake: Arc<Wake>,
    /// Set by the device's poller when it has left its reactor.
    left: Mutex<bool>,
    left_cv: std::sync::Condvar,
    /// Block frees the file systems reported and the control plane has not
    /// applied yet: no command is taken meanwhile (issue 20, free_watch.rs).
    free_fence: std::sync::OnceLock<Arc<crate::free_watch::FreeFence>>,
}

impl Shared {
    /// Fresh device state on `medium`: no channels but the trusted one.
    fn new(
        config: Config,
        medium: Medium,
        address_space_bytes: u64,
        wake: Arc<Wake>,
    ) -> Result<Arc<Shared>, EmuError> {
        let mut allocated = vec![false; CHANNELS];
        allocated[0] = true;
        Ok(Arc::new(Shared {
            config,
            medium,
            address_space_bytes,
            stop: AtomicBool::new(false),
            mailbox: Mutex::new(Vec::new()),
            mailbox_pending: AtomicBool::new(false),
            allocated: Mutex::new(allocated),
            channels: RwLock::new((0..CHANNELS).map(|_| None).collect()),
            channel_status: (0..CHANNELS / 64).map(|_| AtomicU64::new(0)).collect(),
            error_queue: Mutex::new(VecDeque::with_capacity(
                CHANNELS * ERRORS_PER_CHANNEL as usize,
            )),
            errors_queued: (0..CHANNELS).map(|_| AtomicU32::new(0)).collect(),
            interrupt_word: AtomicU32::new(0),
            kernel_sleeping: AtomicBool::new(false),
            wake,
            left: Mutex::new(false),
            left_cv: std::sync::Condvar::new(),
            free_fence: std::sync::OnceLock::new(),
        }))
    }
}

/// A running emulated device. Dropping it stops its threads.
pub struct Engine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    /// The reactor that turns this device (its own, or one it shares).
    reactor: Option<Arc<Reactor>>,
}

impl Engine {
    /// Start the device on `medium` (whose size must be the configured capacity).
    /// It gets its own reactor thread, `moneta-device`.
    pub fn start(
        config: Config,
        medium: Medium,
        options: EngineOptions,
    ) -> Result<Engine, EmuError> {
        let reactor = Arc::new(Reactor::start("moneta-device", options.realtime)?);
        Self::start_with(config, medium, options, None, reactor)
    }

    /// Start the device on `reactor`, beside the devices it already turns
    /// (`options.realtime` is the reactor's, not the device's).
    pub fn start_on(
        reactor: &Arc<Reactor>,
        config: Config,
        medium: Medium,
        options: EngineOptions,
    ) -> Result<Engine, EmuError> {
        Self::start_with(config, medium, options, None, reactor.clone())
    }

    /// Start a SAN node: the device with its network port on `port`'s
    /// wire; channels address the global space of `port.routes`.
    /// On its own reactor, or on `reactor` beside other nodes' devices.
    pub fn start_san(
        config: Config,
        medium: Medium,
        options: EngineOptions,
        port: SanPort,
        reactor: Option<&Arc<Reactor>>,
    ) -> Result<Engine, EmuError> {
        if !config.network.has_memory && port.routes.global_bytes() == 0 {
            return Err(EmuError::new(ErrorKind::Config, "an empty global space"));
        }
        let reactor = match reactor {
            Some(r) => r.clone(),
            None => Arc::new(Reactor::start("moneta-device", options.realtime)?),
        };
        Self::start_with(config, medium, options, Some(port), reactor)
    }

    fn start_with(
        config: Config,
        medium: Medium,
        options: EngineOptions,
        port: Option<SanPort>,
        reactor: Arc<Reactor>,
    ) -> Result<Engine, EmuError> {
        check_device(&config, &medium)?;
        medium
            .populate(0, options.populate_bytes)
            .map_err(|e| EmuError::io("populating the medium", e))?;
        let address_space_bytes = port
            .as_ref()
            .map_or(config.device.capacity_bytes, |p| p.routes.global_bytes());
        let shared = Shared::new(config, medium, address_space_bytes, reactor.wake())?;
        // The watcher polls its own descriptor of the link.
        let wire_fd = match port.as_ref().and_then(|p| p.endpoint.transport().wait_fd()) {
            // SAFETY: dup(2) of a descriptor the endpoint holds open.
            Some(fd) => match unsafe { libc::dup(fd) } {
                -1 => {
                    return Err(EmuError::io(
                        "dup of the link's descriptor",
                        std::io::Error::last_os_error(),
                    ))
                }
                // SAFETY: a fresh descriptor we own.
                d => Some(unsafe {
                    <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(d)
                }),
            },
            None => None,
        };
        let device = DeviceThread::new(shared.clone(), &options, WallClock::new(), port)?;
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| EmuError::io("starting a device thread", e))
        };
        reactor.add(Box::new(device));
        let mut engine = Engine {
            shared: shared.clone(),
            threads: Vec::new(),
            reactor: Some(reactor),
        };
        let kernel_shared = shared.clone();
        engine.threads.push(spawn(
            "moneta-interrupt",
            Box::new(move || kernel_role(&kernel_shared)),
        )?);
        if let Some(fd) = wire_fd {
            let watcher_shared = shared.clone();
            engine.threads.push(spawn(
                "moneta-wire-watch",
                Box::new(move || wire_watcher(&watcher_shared, &fd)),
            )?);
        }
        Ok(engine)
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Hand `poller` to the reactor that turns this device, so it runs in
    /// the same loop as the device (an NBD server's connections: requests
    /// submitted and answered without a hop between threads). It must
    /// finish when [`Engine::is_stopping`] says so: the reactor's thread
    /// ends only when every poller it hosts has.
    pub fn add_poller(&self, poller: Box<dyn Poller>) {
        if let Some(r) = &self.reactor {
            r.add(poller);
        }
    }

    /// The doorbell of this device's reactor.
    pub fn wake(&self) -> Arc<Wake> {
        self.shared.wake.clone()
    }

    /// The device is stopping (its pollers and its helpers should end).
    pub fn is_stopping(&self) -> bool {
        self.shared.stop.load(Ordering::Acquire)
    }

    pub fn medium(&self) -> &Medium {
        &self.shared.medium
    }

    /// The bytes channels address: the device's capacity, or a SAN's
    /// global space.
    pub fn address_space_bytes(&self) -> u64 {
        self.shared.address_space_bytes
    }

    fn send(&self, op: ControlOp) -> Result<(), EmuError> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(EmuError::new(ErrorKind::Stopped, "the device is stopping"));
        }
        self.shared.mailbox.lock().expect("mailbox").push(op);
        self.shared.mailbox_pending.store(true, Ordering::SeqCst);
        self.shared.wake.ring();
        Ok(())
    }

    fn wait<T>(rx: mpsc::Receiver<T>, what: &str) -> Result<T, EmuError> {
        rx.recv_timeout(CONTROL_TIMEOUT).map_err(|_| {
            EmuError::new(
                ErrorKind::Stopped,
                format!("the device thread did not {what}"),
            )
        })
    }

    /// Allocate a channel: fresh shared pages with no permissions (SPEC §3.1).
    pub fn create_channel(&self) -> Result<(u16, Arc<ChannelMemory>), EmuError> {
        let id = {
            let mut allocated = self.shared.allocated.lock().expect("allocated");
            let id = allocated.iter().position(|used| !used).ok_or_else(|| {
                EmuError::new(
                    ErrorKind::NoChannel,
                    format!("all {CHANNELS} channels are in use"),
                )
            })?;
            allocated[id] = true;
            id as u16
        };
        let memory = match ChannelMemory::create(id, &self.shared.wake.doorbell) {
            Ok(m) => Arc::new(m),
            Err(e) => {
                self.shared.allocated.lock().expect("allocated")[id as usize] = false;
                return Err(EmuError::io("creating channel memory", e));
            }
        };
        self.shared.channels.write().expect("channels")[id as usize] = Some(memory.clone());
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::AddChannel {
            id,
            memory: memory.clone(),
            done,
        })?;
        Self::wait(rx, "open the channel")?;
        Ok((id, memory))
    }

    /// The shared pages of an open channel.
    pub fn channel_memory(&self, id: u16) -> Option<Arc<ChannelMemory>> {
        self.shared
            .channels
            .read()
            .expect("channels")
            .get(id as usize)?
            .clone()
    }

    /// Free a channel: requests in flight finish (their results are
    /// discarded), its permission records go, its tags return to the pool.
    /// Close channel `id` once its requests are done; returns what its
    /// client did ([`ClientStats`]).
    pub fn close_channel(&self, id: u16) -> Result<ClientStats, EmuError> {
        if id == 0
            || id as usize >= CHANNELS
            || !self.shared.allocated.lock().expect("allocated")[id as usize]
        {
            return Err(EmuError::new(
                ErrorKind::Protocol,
                format!("channel {id} is not open"),
            ));
        }
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::RemoveChannel { id, done })?;
        let client = Self::wait(rx, "close the channel")?;
        self.shared.channels.write().expect("channels")[id as usize] = None;
        self.shared.allocated.lock().expect("allocated")[id as usize] = false;
        Ok(client)
    }

    /// What open channel `id`'s client did so far (None: not open).
    pub fn client_stats(&self, id: u16) -> Result<Option<ClientStats>, EmuError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::ClientStats { id, done })?;
        Self::wait(rx, "report a client's statistics")
    }

    /// From now on take no command while `fence` says a block free is
    /// pending (the first fence set stays).
    pub fn set_free_fence(&self, fence: Arc<crate::free_watch::FreeFence>) {
        let _ = self.shared.free_fence.set(fence);
    }

    /// Apply permission-table edits (the update protocol of SPEC §3.3). All
    /// of them are applied, in order, before the device checks another command.
    pub fn update_permissions(&self, updates: Vec<Update>) -> Result<(), EmuError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::Permissions { updates, done })?;
        Self::wait(rx, "apply the permission update")?
            .map_err(|e| EmuError::new(ErrorKind::Protocol, e))
    }

    pub fn stats(&self) -> Result<EngineStats, EmuError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::Stats { done })?;
        Self::wait(rx, "report statistics")
    }

    /// A SAN node: why a request on `[addr, addr + len)` may have found
    /// no copy, as this node sees it (None: not a SAN node).
    pub fn san_explain(&self, addr: u64, len: u64) -> Result<Option<String>, EmuError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::SanExplain { addr, len, done })?;
        Self::wait(rx, "explain a SAN request")
    }

    /// A SAN node: discard this node's writes in its split-brain slices
    /// (all, or `slice`): the partner's copy wins and resyncs this one
    /// (`moneta san resolve --discard`). Returns what was done.
    pub fn san_discard(&self, slice: Option<usize>) -> Result<String, EmuError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::SanDiscard { slice, done })?;
        Self::wait(rx, "discard a split brain side")?
            .map_err(|e| EmuError::new(ErrorKind::Protocol, e))
    }

    /// A SAN node: force this node's outdated copies whose partner is
    /// unreachable (all, or `slice`) up to date (`moneta san resolve
    /// --force`; engine/port.rs). Returns what was done.
    pub fn san_force(&self, slice: Option<usize>) -> Result<String, EmuError> {
        let (done, rx) = mpsc::sync_channel(1);
        self.send(ControlOp::SanForce { slice, done })?;
        Self::wait(rx, "force a copy up to date")?
            .map_err(|e| EmuError::new(ErrorKind::Protocol, e))
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.ring();
        self.shared.wake.nudge_watchers();
        self.shared.interrupt_word.fetch_add(1, Ordering::Release);
        sys::futex_wake_all(&self.shared.interrupt_word);
        // The device leaves its reactor at the reactor's next pass.
        let mut left = self.shared.left.lock().expect("left");
        while !*left {
            let (l, timeout) = self
                .shared
                .left_cv
                .wait_timeout(left, CONTROL_TIMEOUT)
                .expect("left");
            left = l;
            if timeout.timed_out() {
                eprintln!(
                    "moneta: the device did not leave its reactor within {CONTROL_TIMEOUT:?}"
                );
                break;
            }
        }
        drop(left);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The last engine on a reactor stops its thread.
        self.reactor = None;
        let _ = self.shared.medium.flush();
    }
}

/// A request the device accepted, by virtual tag (with its command's words
/// and stamp: a SAN failover may take it again, `Held`).
#[derive(Debug, Clone, Copy)]
struct InFlight {
    sequence: u16,
    dma_completion: bool,
    words: [u64; 2],
    stamp: u64,
    /// Since when a SAN failover has held it, if it has (the hold's bound
    /// counts from the first time).
    held_since: Option<Ns>,
}

/// A command a SAN node holds instead of failing it while a failover is
/// decided (a copy suspended, `engine/liveness.rs`; `PortState::holds`):
/// its tag stays in flight, and it is taken again from `next` on, until it
/// is served or the hold has passed (then it fails as it would have).
#[derive(Debug, Clone, Copy)]
struct Held {
    channel: u16,
    tag: u8,
    words: [u64; 2],
    stamp: u64,
    since: Ns,
    next: Ns,
}

/// A held command is taken again this often.
const HOLD_RETRY_NS: Ns = 20_000_000;
/// ... and held at most this long in all.
const HOLD_MAX_NS: Ns = 3_000_000_000;

struct OpenChannel {
    memory: Arc<ChannelMemory>,
    in_flight: [Option<InFlight>; CHANNEL_TAGS],
    in_flight_count: u32,
    /// SUBMITTED as the device last read it (a flipped bit is a new command).
    submitted_seen: u64,
    /// Tags whose SUBMITTED bit flipped and whose commands wait for a
    /// physical tag or for the error queue to drain.
    pending: u64,
    /// When each tag's last completion was posted: its next command cannot
    /// have been issued earlier.
    free_at: [Ns; CHANNEL_TAGS],
    /// Set when the control plane closed it: no new commands; freed when
    /// idle, and its counters handed back then.
    closing: Option<mpsc::SyncSender<ClientStats>>,
    /// What this channel's client did (`moneta stats --run`).
    client: ClientStats,
}

/// The device's logic, generic over the clock that drives it: the wall
/// clock in the engine, a manual clock in tests that compare it with the
/// simulator (both go through the model's `DeviceDriver`).
struct DeviceThread<C: Clock = WallClock> {
    shared: Arc<Shared>,
    clock: C,
    driver: DeviceDriver,
    /// Requests the model finished during a turn, posted at its end
    /// (`post_finished`).
    finished: Vec<Finished>,
    tree_step_ns: Ns,
    limits: CommandLimits,
    channels: Vec<Option<OpenChannel>>,
    /// Open channel ids, in the order the poller visits them.
    active: Vec<u16>,
    /// The retag stage's turn order over `active`.
    round_robin: RoundRobin,
    idle_spin_ns: Ns,
    max_nap_ns: u64,
    post_ahead_ns: Ns,
    /// Requests in the model (accepted, not yet finished), all channels.
    in_flight_total: u32,
    /// Commands a SAN failover holds (`Held`).
    held: Vec<Held>,
    stats: EngineStats,
    lateness: LatencyHistogram,
    accept_delay: LatencyHistogram,
    /// Model time already reached (events delivered, commands submitted):
    /// a new command may not enter before it.
    model_floor: Ns,
    device_time: Breakdown,
    /// A SAN node's network port on its wire.
    /// Boxed: the turn moves it out and back (`self.port.take()`), and
    /// the state with its endpoint is kilobytes, which every turn would copy.
    port: Option<Box<port::PortState>>,
    /// The (offset, device address, bytes) runs of the command being
    /// accepted that this device holds (kept to avoid an allocation).
    runs: Vec<(u64, u64, u64)>,
}

impl<C: Clock> DeviceThread<C> {
    fn new(
        shared: Arc<Shared>,
        options: &EngineOptions,
        clock: C,
        san: Option<SanPort>,
    ) -> Result<Self, EmuError> {
        let config = &shared.config;
        let limits = CommandLimits {
            capacity_bytes: shared.address_space_bytes,
            tags: CHANNEL_TAGS as u32,
            max_len_bytes: DMA_BUFFER_BYTES as u64,
        };
        debug_assert!(CommandFormat::Channel.max_len_bytes() >= limits.max_len_bytes);
        let (driver, port, max_nap_ns, idle_spin_ns) = match san {
            None => (
                DeviceDriver::with_channels(config, options.seed, CHANNELS as u16),
                None,
                options.max_nap_ns,
                options.idle_spin_ns,
            ),
            Some(san) => {
                let timing = moneta_model::config::FabricTiming::derive(&config.network)
                    .map_err(|e| EmuError::new(ErrorKind::Config, e.to_string()))?;
                let mut san = san;
                let mut routes: RouteTable = san.routes.clone();
                // What the medium's replica metadata says of each copy
                // (engine/port.rs, `replica_meta`).
                port::initial_states(&mut san, &mut routes);
                let network = NetworkPort::new(&config.network, routes, timing.nic_tx_ns);
                let driver =
                    DeviceDriver::with_port(config, options.seed, CHANNELS as u16, network);
                (
                    driver,
                    Some(Box::new(port::PortState::new(san, timing.nic_tx_ns))),
                    options.max_nap_ns.min(SAN_MAX_NAP_NS),
                    options.san_idle_spin_ns,
                )
            }
        };
        Ok(DeviceThread {
            driver,
            port,
            runs: Vec::with_capacity(4),
            // A turn may finish each physical tag more than once.
            finished: Vec::with_capacity(4 * config.device.tags as usize),
            tree_step_ns: config.direct.tree_step_ns,
            limits,
            channels: (0..CHANNELS).map(|_| None).collect(),
            active: Vec::new(),
            round_robin: RoundRobin::default(),
            idle_spin_ns,
            max_nap_ns,
            post_ahead_ns: options.post_ahead_ns,
            in_flight_total: 0,
            held: Vec::new(),
            stats: EngineStats::default(),
            lateness: LatencyHistogram::new(),
            accept_delay: LatencyHistogram::new(),
            model_floor: 0,
            device_time: Breakdown::default(),
            clock,
            shared,
        })
    }
}

/// The device as a reactor's poller (reactor.rs): the wall-clock side
/// around [`DeviceThread::turn`].
impl Poller for DeviceThread<WallClock> {
    fn poll(&mut self) -> Pass {
        if self.shared.stop.load(Ordering::Relaxed) {
            return Pass::Finished;
        }
        if self.shared.mailbox_pending.load(Ordering::Acquire) {
            self.apply_control();
        }
        let now = self.clock.now();
        if self.turn(now) {
            return Pass::Worked;
        }
        // A SAN node waits for its peers' answers spinning.
        let port_busy = self
            .port
            .as_ref()
            .is_some_and(|p| !p.is_quiet() || self.in_flight_total > 0 || !self.held.is_empty());
        if port_busy || !self.driver.is_idle() {
            Pass::Busy
        } else {
            Pass::Idle
        }
    }

    /// Arm NEED WAKEUP on every channel, then look once more.
    fn prepare_nap(&mut self) -> bool {
        for &id in &self.active {
            let ch = self.channels[id as usize].as_ref().expect("active");
            ch.memory.need_wakeup().store(1, Ordering::SeqCst);
        }
        // Pairs with the client's flip of its SUBMITTED bit: either this
        // last look sees its command, or the client sees NEED WAKEUP and rings.
        std::sync::atomic::fence(Ordering::SeqCst);
        let now = self.clock.now();
        let pending = self.shared.mailbox_pending.load(Ordering::SeqCst)
            || self.shared.stop.load(Ordering::SeqCst);
        let worked = pending || self.poll_channels(now);
        self.post_finished();
        worked
    }

    fn end_nap(&mut self, napped: bool) {
        if napped {
            self.stats.naps += 1;
        }
        for &id in &self.active {
            let ch = self.channels[id as usize].as_ref().expect("active");
            ch.memory.need_wakeup().store(0, Ordering::Relaxed);
        }
    }

    fn idle_spin_ns(&self) -> Ns {
        self.idle_spin_ns
    }

    /// A SAN node naps at most `SAN_MAX_NAP_NS` (its wire's timers run
    /// at the retransmission pace, 200 µs), or `SAN_IDLE_NAP_NS` while
    /// nothing is in flight and its port is idle: an idle 3-node SAN took
    /// 10% of a core waking every 200 µs.
    fn max_nap_ns(&self) -> u64 {
        match self.port.as_ref() {
            // (A shorter maximum asked for stays.)
            Some(p)
                if self.max_nap_ns >= SAN_MAX_NAP_NS
                    && self.in_flight_total == 0
                    && self.held.is_empty()
                    && p.is_idle() =>
            {
                SAN_IDLE_NAP_NS
            }
            _ => self.max_nap_ns,
        }
    }

    /// Its next model event (less the early posting `turn` allows, as
    /// CLOCK_MONOTONIC), when every request in flight is inside the
    /// model. A SAN node with frames
    /// to move or requests held spins; so does one whose requests wait for
    /// a peer with no local event due (the answer comes on the wire).
    fn busy_until(&self) -> Option<Ns> {
        if let Some(p) = self.port.as_ref() {
            if !p.is_quiet() || !self.held.is_empty() {
                return None;
            }
        }
        let next = self.driver.next_event_time()?;
        let ahead = if self.in_flight_total == 1 {
            self.post_ahead_ns
        } else {
            0
        };
        // Each device's model time starts with the device: the reactor
        // compares CLOCK_MONOTONIC.
        Some(self.clock.monotonic_of(next.saturating_sub(ahead)))
    }
}

impl<C: Clock> Drop for DeviceThread<C> {
    /// Tell the engine its device has left the reactor.
    fn drop(&mut self) {
        *self.shared.left.lock().expect("left") = true;
        self.shared.left_cv.notify_all();
    }
}

impl<C: Clock> DeviceThread<C> {
    /// One turn of the device at `now`: take new commands, then deliver
    /// the model events due. Returns whether it did anything.
    fn turn(&mut self, now: Ns) -> bool {
        self.stats.polls += 1;
        // Take commands first, so that work the model finishes at once
        // (the null device) completes in the same turn.
        let leased = self.port_leases(now);
        let worked = self.retry_held(now) | self.poll_channels(now) | leased;
        // Ahead only when one request is in flight in the whole device: then
        // no other request's events move ahead with it, and a command that
        // arrives meanwhile (from another client) is the only one that can
        // be held back, by at most `post_ahead_ns`.
        let ahead = if self.in_flight_total == 1 {
            self.post_ahead_ns
        } else {
            0
        };
        let delivered = self.deliver_due_events(now + ahead);
        let ported = self.port_turn(now);
        self.post_finished();
        delivered || worked || ported
    }

    fn apply_control(&mut self) {
        self.shared.mailbox_pending.store(false, Ordering::Release);
        let ops = std::mem::take(&mut *self.shared.mailbox.lock().expect("mailbox"));
        for op in ops {
            match op {
                ControlOp::AddChannel { id, memory, done } => {
                    let memory_submitted = memory.submitted().load(Ordering::Acquire);
                    self.channels[id as usize] = Some(OpenChannel {
                        memory,
                        in_flight: [None; CHANNEL_TAGS],
                        in_flight_count: 0,
                        submitted_seen: memory_submitted,
                        pending: 0,
                        // No command of this channel was issued before it existed.
                        free_at: [self.clock.now(); CHANNEL_TAGS],
                        closing: None,
                        client: ClientStats {
                            connections: 1,
                            open: 1,
                            ..ClientStats::default()
                        },
                    });
                    self.active.push(id);
                    self.stats.channels_open += 1;
                    let _ = done.send(());
                }
                ControlOp::RemoveChannel { id, done } => {
                    match self.channels[id as usize].as_mut() {
                        Some(ch) => {
                            ch.closing = Some(done);
                            self.active.retain(|&c| c != id);
                            self.free_channel_if_idle(id);
                        }
                        None => {
                            let _ = done.send(ClientStats::default());
                        }
                    }
                }
                ControlOp::ClientStats { id, done } => {
                    let client = self
                        .channels
                        .get(id as usize)
                        .and_then(|c| c.as_ref())
                        .map(|c| c.client.clone());
                    let _ = done.send(client);
                }
                ControlOp::Permissions { updates, done } => {
                    let result = updates
                        .iter()
                        .try_for_each(|u| self.driver.protection_mut().apply(u))
                        .map_err(|e| e.to_string());
                    let _ = done.send(result);
                }
                ControlOp::Stats { done } => {
                    let _ = done.send(self.snapshot());
                }
                ControlOp::SanDiscard { slice, done } => self.discard(slice, done),
                ControlOp::SanForce { slice, done } => {
                    let _ = done.send(self.force(slice));
                }
                ControlOp::SanExplain { addr, len, done } => {
                    let port = self.driver.device().port();
                    let _ = done.send(port.map(|p| p.routes.explain(addr, len)));
                }
            }
        }
    }

    fn free_channel_if_idle(&mut self, id: u16) {
        let Some(ch) = self.channels[id as usize].as_ref() else {
            return;
        };
        if ch.closing.is_none() || ch.in_flight_count > 0 {
            return;
        }
        let ch = self.channels[id as usize].take().expect("checked");
        self.driver
            .protection_mut()
            .apply(&Update::ClearChannel(id))
            .expect("the channel id is in range");
        self.stats.channels_open -= 1;
        if let Some(done) = ch.closing {
            let _ = done.send(ClientStats {
                open: 0,
                ..ch.client
            });
        }
    }

    /// The port's counters and its copies' states (`moneta san status`).
    fn port_snapshot(&self) -> Option<moneta_abi::stats::PortStats> {
        match (self.port.as_ref(), self.driver.device().port()) {
            (Some(p), Some(np)) => Some(p.stats_with(&np.routes)),
            (Some(p), None) => Some(p.stats()),
            _ => None,
        }
    }

    fn snapshot(&self) -> EngineStats {
        let mut s = self.stats.clone();
        let p = self.driver.protection().stats();
        s.permission_records_in_use = p.records_in_use;
        s.permission_installs = p.installs;
        s.permission_merges = p.merges;
        s.permission_evictions = p.evictions;
        s.permission_lookups = p.lookups;
        if p.lookups > 0 {
            s.lookup_steps_mean = p.lookup_steps as f64 / p.lookups as f64;
            s.lookup_ns_mean = s.lookup_steps_mean * self.tree_step_ns as f64;
        }
        s.lookup_steps_max = p.max_lookup_steps;
        s.lateness_ns_mean = self.lateness.mean_ns();
        s.lateness_ns_p99 = self.lateness.percentile_ns(0.99);
        s.lateness_ns_max = self.lateness.max_ns();
        s.accept_delay_ns_mean = self.accept_delay.mean_ns();
        s.accept_delay_ns_p99 = self.accept_delay.percentile_ns(0.99);
        s.device_time_requests = self.device_time.count();
        s.san = self.port_snapshot();
        s.device_time_us = self
            .device_time
            .mean_us()
            .into_iter()
            .map(|(c, us)| (c.key().to_string(), us))
            .collect();
        if s.device_time_requests > 0 {
            let modeled_ns = s.device_time_us.iter().map(|(_, us)| us).sum::<f64>() * 1e3;
            let runnable = moneta_abi::fidelity::runnable_now().unwrap_or(0.0);
            (s.faithful, s.verdict) = moneta_abi::fidelity::judge(
                s.lateness_ns_mean,
                modeled_ns,
                runnable,
                moneta_abi::fidelity::cores(),
            );
        }
        s
    }

    /// Run every model event due by `now`, each at its own model time; the
    /// requests that finish wait in `finished` for [`Self::post_finished`].
    fn deliver_due_events(&mut self, now: Ns) -> bool {
        let finished = &mut self.finished;
        let before = finished.len();
        let delivered = self.driver.deliver_due(now, |f| finished.push(f));
        if delivered > 0 {
            self.stats.model_time_ns = self.driver.model_time_ns();
            self.model_floor = self.model_floor.max(self.stats.model_time_ns);
            self.in_flight_total -= (finished.len() - before) as u32;
        }
        delivered > 0
    }

    /// Post every request finished since the last call, all at once at the
    /// end of a turn: a batch of completions costs one clock read (for the
    /// lateness and the clamp), and commands taken in the same turn are not
    /// held up by posting.
    fn post_finished(&mut self) {
        if self.finished.is_empty() {
            return;
        }
        // What degraded writes marked is durable before they are
        // acknowledged (dirty.rs); a write whose record is not fails.
        let mut durable = true;
        if let Some(mut state) = self.port.take() {
            self.collect_port_output(&mut state);
            durable = state.flush_dirty(self.clock.now());
            self.port = Some(state);
        }
        // After the flush: its fdatasync is part of how late they are.
        let posted = self.clock.now();
        let mut finished = std::mem::take(&mut self.finished);
        for f in finished.drain(..) {
            let due = f.completion.time_ns;
            self.lateness.record(posted.saturating_sub(due));
            let (channel, tag) = f.channel_tag.expect("channel requests are retagged");
            if let Some(ch) = self.channels[channel as usize].as_mut() {
                // The client sees it at its due time at the earliest.
                ch.free_at[tag as usize] = posted.max(due);
            }
            self.device_time.record_device(&f.completion.parts);
            let write = self.write_of(channel, tag);
            if f.completion.refused && self.hold_again(posted, channel, tag) {
                if let Some((addr, len)) = write {
                    // Taken again later: its activity begins again then.
                    self.activity_end(addr, len, false);
                }
                continue;
            }
            let code = if f.completion.refused {
                ResultCode::NoUpToDateCopy
            } else if f.completion.failed {
                ResultCode::PeerUnreachable
            } else if !durable && self.write_unrecorded(channel, tag) {
                if let Some(p) = self.port.as_mut() {
                    p.unrecorded_write(channel);
                }
                ResultCode::DeviceFailure
            } else {
                ResultCode::Ok
            };
            if let Some((addr, len)) = write {
                self.activity_end(addr, len, code == ResultCode::Ok);
                self.peer_ack(posted, addr, len, code == ResultCode::Ok);
            }
            self.count_for_client(channel, tag, code, &f, posted);
            self.finish(channel, tag, code, due);
        }
        self.finished = finished;
    }

    /// Whether the request in flight on (channel, tag) is a write on a
    /// granule the dirty map has not made durable (it may not be
    /// acknowledged: `PortState::flush_dirty`).
    fn write_unrecorded(&self, channel: u16, tag: u8) -> bool {
        let (Some(port), Some(ch)) = (self.port.as_ref(), self.channels[channel as usize].as_ref())
        else {
            return false;
        };
        let Some(flight) = ch.in_flight[tag as usize].as_ref() else {
            return false;
        };
        match command::decode_channel(flight.words, &self.limits) {
            Ok((cmd, _)) => cmd.op == Op::Write && port.unrecorded(cmd.addr.0, cmd.len_bytes),
            Err(_) => false,
        }
    }

    /// The global range of the write in flight on (channel, tag) of a SAN
    /// node, if it is one (its activity log entry, engine/port.rs).
    fn write_of(&self, channel: u16, tag: u8) -> Option<(u64, u64)> {
        self.port.as_ref()?;
        let flight = self.channels[channel as usize].as_ref()?.in_flight[tag as usize].as_ref()?;
        match command::decode_channel(flight.words, &self.limits) {
            Ok((cmd, _)) if cmd.op == Op::Write => Some((cmd.addr.0, cmd.len_bytes)),
            _ => None,
        }
    }

    /// Count a finished request in its channel's [`ClientStats`]: its
    /// operation and bytes (from its command words), modeled device time
    /// and how late it was posted.
    fn count_for_client(
        &mut self,
        channel: u16,
        tag: u8,
        code: ResultCode,
        f: &Finished,
        posted: Ns,
    ) {
        let Some(ch) = self.channels[channel as usize].as_mut() else {
            return;
        };
        let Some(flight) = ch.in_flight[tag as usize].as_ref() else {
            return;
        };
        let decoded = command::decode_channel(flight.words, &self.limits);
        match (code, decoded) {
            (ResultCode::Ok, Ok((cmd, _))) => {
                let counters = match cmd.op {
                    Op::Read => &mut ch.client.read,
                    Op::Write => &mut ch.client.write,
                };
                counters.record(
                    cmd.len_bytes,
                    f.completion.parts.total_ns(),
                    posted.saturating_sub(f.completion.time_ns),
                );
            }
            _ => ch.client.refused += 1,
        }
    }

    /// A request of (channel, tag) finished with `code` at model time `due`.
    fn finish(&mut self, channel: u16, tag: u8, code: ResultCode, due: Ns) {
        let ch = self.channels[channel as usize]
            .as_mut()
            .expect("completion for an open channel");
        let flight = ch.in_flight[tag as usize]
            .take()
            .expect("completion for a tag in flight");
        ch.in_flight_count -= 1;
        if ch.closing.is_some() {
            self.free_channel_if_idle(channel);
            return;
        }
        let memory = ch.memory.clone();
        self.post(
            channel,
            &memory,
            tag,
            flight.sequence,
            flight.dma_completion,
            code,
            due,
        );
    }

    /// Report a result to the client: DMA completion writes the status word;
    /// interrupt completion goes through the kernel role (errors via the
    /// error queue, SPEC §3.5). Either way the tag's due word says when, in
    /// model time, the request finished: a completion posted ahead of it
    /// (`post_ahead_ns`) is not seen by the library before then.
    #[allow(clippy::too_many_arguments)]
    fn post(
        &mut self,
        channel: u16,
        memory: &ChannelMemory,
        tag: u8,
        sequence: u16,
        dma_completion: bool,
        code: ResultCode,
        due: Ns,
    ) {
        memory
            .tag_due(tag as usize)
            .store(self.clock.monotonic_of(due), Ordering::Relaxed);
        if code != ResultCode::Ok {
            *self
                .stats
                .errors
                .entry(code.as_str().to_string())
                .or_insert(0) += 1;
        } else {
            self.stats.requests_completed += 1;
        }
        if dma_completion {
            memory
                .tag_status(tag as usize)
                .store(channel::status_word(sequence, code), Ordering::Release);
            return;
        }
        if code == ResultCode::Ok {
            memory
                .tag_status_register()
                .fetch_or(1 << tag, Ordering::Release);
        } else {
            // Room is guaranteed: errors only arise when a command is taken,
            // and poll_channels takes none from a channel that already has
            // ERRORS_PER_CHANNEL errors queued.
            self.shared.errors_queued[channel as usize].fetch_add(1, Ordering::AcqRel);
            self.shared
                .error_queue
                .lock()
                .expect("error queue")
                .push_back(ErrorEntry { channel, tag, code });
        }
        self.shared.channel_status[channel as usize / 64]
            .fetch_or(1 << (channel % 64), Ordering::Release);
        self.stats.interrupts += 1;
        self.shared.interrupt_word.fetch_add(1, Ordering::Release);
        // The handler runs at once, on this thread: an interrupt preempts
        // whatever the core was doing, and a hop to a sleeping thread adds
        // a wake-up (and a thread wanting a core) the hardware does not
        // have. The kernel role's thread takes over only while the channel
        // table is being changed (the control plane holds it).
        if !forward_interrupts(&self.shared, false)
            && self.shared.kernel_sleeping.load(Ordering::Acquire)
        {
            sys::futex_wake_all(&self.shared.interrupt_word);
        }
    }

    /// Hold `h` (its copy refused at admission) while a failover is
    /// decided; false when there is none, or it was held long enough.
    fn hold(&mut self, now: Ns, h: Held, sequence: u16, dma_completion: bool) -> bool {
        let holds = self.port.as_ref().is_some_and(|p| p.holds(now));
        if !holds || now.saturating_sub(h.since) >= HOLD_MAX_NS {
            return false;
        }
        let Some(ch) = self.channels[h.channel as usize].as_mut() else {
            return false;
        };
        ch.in_flight[h.tag as usize] = Some(InFlight {
            sequence,
            dma_completion,
            words: h.words,
            stamp: h.stamp,
            held_since: Some(h.since),
        });
        ch.in_flight_count += 1;
        self.held.push(h);
        self.stats.held += 1;
        true
    }

    /// A request of (channel, tag) the model refused (no up-to-date copy
    /// reachable) while a failover is decided: held, to be taken again,
    /// instead of failed. Returns whether it was.
    fn hold_again(&mut self, now: Ns, channel: u16, tag: u8) -> bool {
        if !self.port.as_ref().is_some_and(|p| p.holds(now)) {
            return false;
        }
        let Some(f) = self.channels[channel as usize]
            .as_ref()
            .and_then(|ch| ch.in_flight[tag as usize])
        else {
            return false;
        };
        let since = f.held_since.unwrap_or(now);
        if now.saturating_sub(since) >= HOLD_MAX_NS {
            return false;
        }
        self.held.push(Held {
            channel,
            tag,
            words: f.words,
            stamp: f.stamp,
            since,
            next: now + HOLD_RETRY_NS,
        });
        self.stats.held += 1;
        true
    }

    /// Take the held commands whose time has come again.
    fn retry_held(&mut self, now: Ns) -> bool {
        if self.held.iter().all(|h| h.next > now) {
            return false;
        }
        let (due, wait): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|h| h.next <= now);
        self.held = wait;
        for h in due {
            let Some(ch) = self.channels[h.channel as usize].as_mut() else {
                continue;
            };
            if ch.in_flight[h.tag as usize].take().is_none() {
                continue;
            }
            ch.in_flight_count -= 1;
            if ch.closing.is_some() {
                self.free_channel_if_idle(h.channel);
                continue;
            }
            let memory = ch.memory.clone();
            self.accept(
                now,
                h.channel,
                &memory,
                h.tag,
                h.words,
                h.stamp,
                Some(h.since),
            );
        }
        true
    }

    /// Take new commands from the channels' slots, round robin over channels.
    fn poll_channels(&mut self, now: Ns) -> bool {
        if self.shared.free_fence.get().is_some_and(|f| f.pending()) {
            // Busy, not idle: the watcher applies it within microseconds.
            return true;
        }
        let n = self.active.len();
        let mut worked = false;
        for i in self.round_robin.pass(n) {
            if !self.driver.retag_has_free() {
                self.stats.retag_stalls += 1;
                break;
            }
            let id = self.active[i];
            if self.shared.errors_queued[id as usize].load(Ordering::Acquire) >= ERRORS_PER_CHANNEL
            {
                self.stats.error_queue_stalls += 1;
                continue;
            }
            let channel = self.channels[id as usize].as_mut().expect("active");
            // One load per channel and poll, and no store: the tags whose
            // bit flipped since the last look have new commands.
            let bits = channel.memory.submitted().load(Ordering::Acquire);
            channel.pending |= bits ^ channel.submitted_seen;
            channel.submitted_seen = bits;
            let mut submitted = std::mem::take(&mut channel.pending);
            if submitted == 0 {
                continue;
            }
            let memory = channel.memory.clone();
            // Several commands: fetch their slot lines together, and each
            // command's data one command ahead (below), so that their
            // misses overlap instead of queueing one after another.
            let several = submitted & (submitted - 1) != 0;
            if several {
                let mut bits = submitted;
                while bits != 0 {
                    memory.prefetch_slot(bits.trailing_zeros() as usize);
                    bits &= bits - 1;
                }
            }
            while submitted != 0 {
                let tag = submitted.trailing_zeros() as usize;
                let next = submitted & (submitted - 1);
                if several && next != 0 {
                    // A hint only: the next slot may change before it is taken.
                    let next_tag = next.trailing_zeros() as usize;
                    let control = memory.slot_control(next_tag).load(Ordering::Relaxed);
                    let addr = memory.slot_addr(next_tag).load(Ordering::Relaxed);
                    // The length is the control word's low 32 bits.
                    let len = u64::from(control as u32);
                    self.shared.medium.prefetch(addr, len);
                }
                if !self.driver.retag_has_free() {
                    self.stats.retag_stalls += 1;
                    break;
                }
                if self.shared.errors_queued[id as usize].load(Ordering::Acquire)
                    >= ERRORS_PER_CHANNEL
                {
                    self.stats.error_queue_stalls += 1;
                    break;
                }
                submitted &= submitted - 1;
                let control = memory.slot_control(tag).swap(0, Ordering::Acquire);
                if control == 0 {
                    // A bit without a command (a client scribbling): nothing to take.
                    continue;
                }
                let addr = memory.slot_addr(tag).load(Ordering::Relaxed);
                let stamp = memory.slot_stamp(tag).load(Ordering::Relaxed);
                self.accept(now, id, &memory, tag as u8, [addr, control], stamp, None);
                worked = true;
            }
            // What a stall left for a later poll.
            if let Some(ch) = self.channels[id as usize].as_mut() {
                ch.pending |= submitted;
            }
        }
        worked
    }

    /// When a command stamped `stamp` (CLOCK_MONOTONIC) by its client enters
    /// the model: its stamp, but never later than `now` (a stamp in the
    /// future), before the tag's previous completion was seen (the client
    /// could not have issued it yet), or before model time already reached
    /// (the model never runs backwards, so a late or lying stamp delays only
    /// its own request; with completions posted ahead, model time may be up
    /// to `post_ahead_ns` past `now`).
    fn entry_time(&mut self, now: Ns, channel: u16, tag: u8, stamp: u64) -> Ns {
        let free_at = self.channels[channel as usize]
            .as_ref()
            .map_or(0, |ch| ch.free_at[tag as usize]);
        let stamped = self.clock.model_time(stamp);
        let at = stamped.min(now).max(free_at).max(self.model_floor);
        if at != stamped {
            self.stats.stamps_clamped += 1;
        }
        self.accept_delay.record(now.saturating_sub(at));
        at
    }

    /// Validate one command from `tag`'s slot and start it, or report why not.
    #[allow(clippy::too_many_arguments)]
    fn accept(
        &mut self,
        now: Ns,
        channel: u16,
        memory: &ChannelMemory,
        tag: u8,
        words: [u64; 2],
        stamp: u64,
        held_since: Option<Ns>,
    ) {
        // Until the words decode, report with what the control word claims.
        let (sequence, claimed_dma) = command::channel_reply_fields(words[1]);
        let fail = |me: &mut Self, code| {
            if let Some(ch) = me.channels[channel as usize].as_mut() {
                ch.free_at[tag as usize] = now;
            }
            me.post(channel, memory, tag, sequence, claimed_dma, code, now)
        };
        let (cmd, sequence) = match command::decode_channel(words, &self.limits) {
            Ok(c) => c,
            Err(e) => {
                let code = match e.kind {
                    command::CommandErrorKind::OutOfRange => ResultCode::OutOfRange,
                    _ => ResultCode::BadCommand,
                };
                return fail(self, code);
            }
        };
        if cmd.tag != tag {
            return fail(self, ResultCode::BadCommand);
        }
        let slice = tag as usize * SLICE_BYTES;
        let len = cmd.len_bytes as usize;
        let Some(dma) = memory.dma_ptr(slice, len) else {
            return fail(self, ResultCode::OutsideDmaBuffer);
        };
        let ch = self.channels[channel as usize]
            .as_ref()
            .expect("polled an open channel");
        if ch.in_flight[tag as usize].is_some() {
            return fail(self, ResultCode::TagInFlight);
        }
        // Events due before the request entered happen first.
        let at = self.entry_time(now, channel, tag, stamp);
        self.deliver_due_events(at);
        self.model_floor = at;
        // A SAN node's own copies: one that may have missed writes is not
        // read, nor written alone; one in split brain neither (issue 22).
        let refused = self
            .driver
            .device()
            .port()
            .and_then(|p| Some((p.routes.refusal(cmd.addr.0, cmd.len_bytes)?, p.routes.node)));
        if let Some((r, node)) = refused {
            let held = Held {
                channel,
                tag,
                words,
                stamp,
                since: held_since.unwrap_or(now),
                next: now + HOLD_RETRY_NS,
            };
            if self.hold(now, held, sequence, cmd.dma_completion) {
                return;
            }
            let why = format!(
                "a {} of {} B at global {} on node {node}: slice {}'s copy here is {}{}",
                cmd.op.as_str(),
                cmd.len_bytes,
                cmd.addr.0,
                r.slice,
                r.state.as_str(),
                match r.partner {
                    Some(p)
                        if r.state == moneta_model::device::network::ReplicaState::SplitBrain =>
                        format!(", in split brain with node {p}: moneta san resolve"),
                    Some(p) => format!(" and node {p}, which holds the other copy, is unreachable"),
                    None => String::new(),
                }
            );
            if let Some(p) = self.port.as_mut() {
                p.refusal(why);
            }
            return fail(self, ResultCode::NoUpToDateCopy);
        }
        // The activity log is durable before the bytes reach this node's
        // copies (engine/port.rs, `activity_begin`).
        if cmd.op == Op::Write && !self.activity_begin(now, cmd.addr.0, cmd.len_bytes) {
            if let Some(p) = self.port.as_mut() {
                p.unrecorded_write(channel);
            }
            return fail(self, ResultCode::DeviceFailure);
        }
        let request = ChannelRequest {
            op: cmd.op,
            addr: DeviceAddr(cmd.addr.0),
            len_bytes: cmd.len_bytes,
            barrier: cmd.barrier,
        };
        let medium = &self.shared.medium;
        // The runs of the request this device holds: all of it, or on a
        // SAN node the parts of the global range with a copy here (the
        // rest moves through the port, `engine/port.rs`).
        let mut runs = std::mem::take(&mut self.runs);
        runs.clear();
        match self.driver.device().port() {
            Some(port) => port
                .routes
                .local_runs(cmd.addr.0, cmd.len_bytes, |o, l, b| runs.push((o, l, b))),
            None => runs.push((0, cmd.addr.0, cmd.len_bytes)),
        }
        // Retag → protection → (the data copy) → the model's queues.
        let accepted = self.driver.submit_channel(at, channel, tag, request, || {
            runs.iter().all(|&(offset, local, bytes)| {
                // SAFETY: `dma` covers `len` bytes inside the channel's DMA
                // buffer (dma_ptr checked) and each run lies within them; it is
                // a separate mapping from the medium. The client may change
                // those bytes concurrently; we copy whatever is there.
                let moved = unsafe {
                    let at = dma.add(offset as usize);
                    match cmd.op {
                        Op::Write => medium.write_from(local, at, bytes as usize),
                        Op::Read => medium.read_into(local, at, bytes as usize),
                    }
                };
                moved.is_ok()
            })
        });
        self.runs = runs;
        if let Err(refusal) = accepted {
            if cmd.op == Op::Write {
                self.activity_end(cmd.addr.0, cmd.len_bytes, false);
            }
            let code = match refusal {
                ChannelRefusal::MissingRecord { .. } => ResultCode::MissingRecord,
                ChannelRefusal::PermissionDenied { .. } => ResultCode::PermissionDenied,
                ChannelRefusal::Stalled
                | ChannelRefusal::DataMovement
                | ChannelRefusal::Device(_) => ResultCode::DeviceFailure,
            };
            return fail(self, code);
        }
        match cmd.op {
            Op::Read => self.stats.bytes_read += cmd.len_bytes,
            Op::Write => self.stats.bytes_written += cmd.len_bytes,
        }
        if let (Some(port), Op::Write) = (self.port.as_mut(), cmd.op) {
            port.note_write(cmd.addr.0, cmd.len_bytes);
        }
        let ch = self.channels[channel as usize].as_mut().expect("open");
        ch.in_flight[tag as usize] = Some(InFlight {
            sequence,
            dma_completion: cmd.dma_completion,
            words,
            stamp,
            held_since,
        });
        ch.in_flight_count += 1;
        self.in_flight_total += 1;
    }
}

/// Whether `config` is valid and `medium` is its device's capacity (an
/// engine's and a simulated node's start).
fn check_device(config: &Config, medium: &Medium) -> Result<(), EmuError> {
    config
        .validate()
        .map_err(|e| EmuError::new(ErrorKind::Config, e.to_string()))?;
    if medium.capacity_bytes() != config.device.capacity_bytes {
        return Err(EmuError::new(
            ErrorKind::Config,
            format!(
                "medium holds {} bytes, device.capacity_bytes is {}",
                medium.capacity_bytes(),
                config.device.capacity_bytes
            ),
        ));
    }
    Ok(())
}

/// A SAN node's wire watcher: rings the doorbell when a frame comes
/// while the device thread naps (reactor.rs).
fn wire_watcher(shared: &Shared, fd: &std::os::fd::OwnedFd) {
    use std::os::fd::AsRawFd;
    crate::reactor::watch_while_napping(&shared.wake, &shared.stop, fd.as_raw_fd());
}

/// The kernel's interrupt handler (SPEC §3.5), on its own thread.
fn kernel_role(shared: &Shared) {
    let mut seen = shared.interrupt_word.load(Ordering::Acquire);
    loop {
        shared.kernel_sleeping.store(true, Ordering::Release);
        // Re-check after announcing the sleep, so a concurrent interrupt
        // either sees the flag (and wakes us) or changed the word (no sleep).
        if shared.interrupt_word.load(Ordering::Acquire) == seen {
            sys::futex_wait(&shared.interrupt_word, seen, Some(100_000_000));
        }
        shared.kernel_sleeping.store(false, Ordering::Release);
        if shared.stop.load(Ordering::Acquire) {
            return;
        }
        seen = shared.interrupt_word.load(Ordering::Acquire);
        forward_interrupts(shared, true);
    }
}

/// Forward what the device posted (the handler of SPEC §3.5): error queue
/// entries and completion counts into their channels, waking the threads
/// that sleep on them. Without `block`, returns false instead of waiting
/// for the channel table (the device's own thread must not wait for the
/// control plane); then nothing was forwarded.
fn forward_interrupts(shared: &Shared, block: bool) -> bool {
    let channels = if block {
        shared.channels.read().expect("channels")
    } else {
        match shared.channels.try_read() {
            Ok(c) => c,
            Err(std::sync::TryLockError::WouldBlock) => return false,
            Err(std::sync::TryLockError::Poisoned(e)) => panic!("channels: {e}"),
        }
    };
    // ERRORQUEUE: read until empty, forward each code into its channel.
    let errors: Vec<ErrorEntry> = shared
        .error_queue
        .lock()
        .expect("error queue")
        .drain(..)
        .collect();
    for e in errors {
        shared.errors_queued[e.channel as usize].fetch_sub(1, Ordering::AcqRel);
        if let Some(m) = &channels[e.channel as usize] {
            m.forwarded_error(e.tag as usize)
                .store(e.code as u32, Ordering::Relaxed);
            m.tag_status_register()
                .fetch_or(1 << e.tag, Ordering::Release);
        }
    }
    // CHANNELSTATUS: read and clear; count completions into each channel.
    for (word_index, word) in shared.channel_status.iter().enumerate() {
        // A load first: the device's thread runs this per completion, and
        // most of the 16 words are empty (a swap is a locked instruction).
        if word.load(Ordering::Relaxed) == 0 {
            continue;
        }
        let mut bits = word.swap(0, Ordering::AcqRel);
        while bits != 0 {
            let bit = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if let Some(m) = &channels[word_index * 64 + bit] {
                m.completion_count().fetch_add(1, Ordering::Release);
                m.wake_word().fetch_add(1, Ordering::Release);
                if m.sleepers().load(Ordering::Acquire) > 0 {
                    sys::futex_wake_all(m.wake_word());
                }
            }
        }
    }
    true
}

/// Install a permission record granting `perms` on a raw range to `channel`
/// (used by the control plane for the daemon owner's raw grants).
pub fn raw_record(channel: u16, start: u64, len: u64, perms: u8) -> Update {
    Update::Install(protection::RecordSpec {
        channel,
        file: 0,
        start,
        len,
        perms,
    })
}

mod liveness;
mod port;
pub mod sim;
pub use port::SanPort;

#[cfg(test)]
mod twin;
