//! The emulated device (DESIGN "One model, two clocks", SPEC §1.2–1.4, §3):
//! the simulator's `Device` driven by the wall clock, holding real bytes,
//! reached through channels in shared memory.
//!
//! One **device thread** polls. Each turn it
//!
//! 1. applies control-plane operations (new and closed channels, permission
//!    updates: the OS edits, the device applies them between commands, so
//!    protection checks are suspended while it does, SPEC §3.3);
//! 2. delivers every model event whose time has come, handing it its own
//!    model time (so the model computes exactly what the simulator would),
//!    and posts each finished request: DMA completion writes the tag's status
//!    word; interrupt completion sets the tag's bit and interrupts the kernel
//!    role (SPEC §3.5);
//! 3. takes new commands from the channels' command slots, validating every
//!    field (the device trusts nothing in shared memory): decode, tag, DMA
//!    buffer bounds, capacity; then retag (stall if no physical tag is free),
//!    protection (the channel's permission tree; the walk's steps × 12 ns
//!    become part of the request's modeled time), the data copy between the
//!    channel's DMA buffer and the medium, and submission to the model at the
//!    current wall time.
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
//! Timing precision: a completion is posted at the first poll at or after its
//! model time; [`EngineStats::lateness_ns_mean`] and friends report how late
//! (typically well under a microsecond with the device thread on its own
//! core). Idle for `idle_spin_ns`, the device thread naps 50 µs at a time
//! instead of spinning, so an idle daemon does not burn a core; the first
//! request after a nap waits for the nap to end.

use crate::channel::{
    self, ChannelMemory, ResultCode, CHANNELS, CHANNEL_TAGS, DMA_BUFFER_BYTES, SLICE_BYTES,
};
use crate::error::{EmuError, ErrorKind};
use crate::medium::Medium;
use crate::protection::{self, Access, CheckOutcome, PermissionTable, Update};
use crate::retag::Retag;
use crate::sys;
use crate::wall_clock::WallClock;
use moneta_model::breakdown::{Breakdown, Parts};
use moneta_model::config::Config;
use moneta_model::device::command::{self, CommandFormat, CommandLimits};
use moneta_model::device::pipeline::{Device, DeviceEvent, DeviceRequest};
use moneta_model::kernel::{Clock, EventQueue};
use moneta_model::stats::LatencyHistogram;
use moneta_model::units::{DeviceAddr, Ns, Op};
use std::collections::{BTreeMap, VecDeque};
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

#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Seed for the model's randomized parts (start-gap address randomization).
    pub seed: u64,
    /// After this long without work the device thread naps instead of spinning.
    pub idle_spin_ns: u64,
    /// Fault in the first this-many bytes of the medium before starting, so
    /// that benchmarks do not measure the kernel's first-touch page faults.
    pub populate_bytes: u64,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            seed: 1,
            idle_spin_ns: 2_000_000,
            populate_bytes: 0,
        }
    }
}

/// What the device thread has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineStats {
    pub channels_open: u32,
    /// Turns of the device thread's polling loop (turns / time = how often
    /// it looks at the channels and the clock).
    pub polls: u64,
    pub requests_completed: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests refused, by result code.
    pub errors: BTreeMap<String, u64>,
    /// Polls that left commands waiting because no physical tag was free.
    pub retag_stalls: u64,
    /// Polls that skipped a channel whose errors the kernel role has not yet
    /// forwarded (a client flooding the device with bad commands).
    pub error_queue_stalls: u64,
    pub interrupts: u64,
    pub permission_records_in_use: u32,
    pub permission_installs: u64,
    pub permission_merges: u64,
    pub permission_evictions: u64,
    pub permission_lookups: u64,
    /// Mean tree steps per protection check, and its modeled time.
    pub lookup_steps_mean: f64,
    pub lookup_ns_mean: f64,
    pub lookup_steps_max: u32,
    /// How long after its model time each completion was posted.
    pub lateness_ns_mean: f64,
    pub lateness_ns_p99: f64,
    pub lateness_ns_max: u64,
    /// Where the device's time went (SPEC §2.1): requests completed and the
    /// mean modeled µs per component from accepting each to its model
    /// completion time (`moneta_model::breakdown`).
    #[serde(default)]
    pub device_time_requests: u64,
    #[serde(default)]
    pub device_time_us: Vec<(String, f64)>,
    /// Model time the device thread has reached (ns since the engine started).
    pub model_time_ns: u64,
    /// The control plane's file grants (filled in by the control plane).
    #[serde(default)]
    pub files: crate::file_table::FileTableStats,
}

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
        done: mpsc::SyncSender<()>,
    },
    Permissions {
        updates: Vec<Update>,
        done: mpsc::SyncSender<Result<(), String>>,
    },
    Stats {
        done: mpsc::SyncSender<EngineStats>,
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
}

/// A running emulated device. Dropping it stops its threads.
pub struct Engine {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl Engine {
    /// Start the device on `medium` (whose size must be the configured capacity).
    pub fn start(
        config: Config,
        medium: Medium,
        options: EngineOptions,
    ) -> Result<Engine, EmuError> {
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
        medium
            .populate(0, options.populate_bytes)
            .map_err(|e| EmuError::io("populating the medium", e))?;
        let mut allocated = vec![false; CHANNELS];
        allocated[0] = true;
        let shared = Arc::new(Shared {
            config,
            medium,
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
        });
        let device = DeviceThread::new(shared.clone(), &options);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.into())
                .spawn(f)
                .map_err(|e| EmuError::io("starting a device thread", e))
        };
        let mut threads = vec![spawn("moneta-device", Box::new(move || device.run()))?];
        let kernel_shared = shared.clone();
        threads.push(spawn(
            "moneta-interrupt",
            Box::new(move || kernel_role(&kernel_shared)),
        )?);
        Ok(Engine { shared, threads })
    }

    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    pub fn medium(&self) -> &Medium {
        &self.shared.medium
    }

    fn send(&self, op: ControlOp) -> Result<(), EmuError> {
        if self.shared.stop.load(Ordering::Acquire) {
            return Err(EmuError::new(ErrorKind::Stopped, "the device is stopping"));
        }
        self.shared.mailbox.lock().expect("mailbox").push(op);
        self.shared.mailbox_pending.store(true, Ordering::Release);
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
        let memory = match ChannelMemory::create(id) {
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
    pub fn close_channel(&self, id: u16) -> Result<(), EmuError> {
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
        Self::wait(rx, "close the channel")?;
        self.shared.channels.write().expect("channels")[id as usize] = None;
        self.shared.allocated.lock().expect("allocated")[id as usize] = false;
        Ok(())
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
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.interrupt_word.fetch_add(1, Ordering::Release);
        sys::futex_wake_all(&self.shared.interrupt_word);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let _ = self.shared.medium.flush();
    }
}

/// A request the device accepted, by virtual tag.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    sequence: u16,
    dma_completion: bool,
}

struct OpenChannel {
    memory: Arc<ChannelMemory>,
    in_flight: [Option<InFlight>; CHANNEL_TAGS],
    in_flight_count: u32,
    /// Set when the control plane closed it: no new commands; freed when idle.
    closing: Option<mpsc::SyncSender<()>>,
}

struct DeviceThread {
    shared: Arc<Shared>,
    clock: WallClock,
    device: Device,
    queue: EventQueue<DeviceEvent>,
    retag: Retag,
    protection: PermissionTable,
    tree_step_ns: Ns,
    limits: CommandLimits,
    channels: Vec<Option<OpenChannel>>,
    /// Open channel ids, in the order the poller visits them.
    active: Vec<u16>,
    next_channel: usize,
    idle_spin_ns: Ns,
    stats: EngineStats,
    lateness: LatencyHistogram,
    device_time: Breakdown,
}

impl DeviceThread {
    fn new(shared: Arc<Shared>, options: &EngineOptions) -> Self {
        let config = &shared.config;
        let limits = CommandLimits {
            capacity_bytes: config.device.capacity_bytes,
            tags: CHANNEL_TAGS as u32,
            max_len_bytes: DMA_BUFFER_BYTES as u64,
        };
        debug_assert!(CommandFormat::Channel.max_len_bytes() >= limits.max_len_bytes);
        DeviceThread {
            device: Device::new(config, options.seed),
            queue: EventQueue::new(),
            retag: Retag::new(config.device.tags),
            protection: PermissionTable::new(config.direct.permission_records, CHANNELS as u16),
            tree_step_ns: config.direct.tree_step_ns,
            limits,
            channels: (0..CHANNELS).map(|_| None).collect(),
            active: Vec::new(),
            next_channel: 0,
            idle_spin_ns: options.idle_spin_ns,
            stats: EngineStats::default(),
            lateness: LatencyHistogram::new(),
            device_time: Breakdown::default(),
            clock: WallClock::new(),
            shared,
        }
    }

    fn run(mut self) {
        let mut last_work_ns = self.clock.now();
        while !self.shared.stop.load(Ordering::Relaxed) {
            if self.shared.mailbox_pending.load(Ordering::Acquire) {
                self.apply_control();
            }
            let now = self.clock.now();
            self.stats.polls += 1;
            // Take commands first, so that work the model finishes at once
            // (the null device) completes in the same turn.
            let mut worked = self.poll_channels(now);
            worked |= self.deliver_due_events(now);
            if worked || !self.queue.is_empty() {
                // Busy: go round again at once (no pause: it would add its
                // ~50 ns to every completion's lateness).
                last_work_ns = now;
            } else if now - last_work_ns > self.idle_spin_ns {
                std::thread::sleep(Duration::from_micros(50));
            } else {
                std::hint::spin_loop();
            }
        }
    }

    fn apply_control(&mut self) {
        self.shared.mailbox_pending.store(false, Ordering::Release);
        let ops = std::mem::take(&mut *self.shared.mailbox.lock().expect("mailbox"));
        for op in ops {
            match op {
                ControlOp::AddChannel { id, memory, done } => {
                    self.channels[id as usize] = Some(OpenChannel {
                        memory,
                        in_flight: [None; CHANNEL_TAGS],
                        in_flight_count: 0,
                        closing: None,
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
                            let _ = done.send(());
                        }
                    }
                }
                ControlOp::Permissions { updates, done } => {
                    let result = updates
                        .iter()
                        .try_for_each(|u| self.protection.apply(u))
                        .map_err(|e| e.to_string());
                    let _ = done.send(result);
                }
                ControlOp::Stats { done } => {
                    let _ = done.send(self.snapshot());
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
        self.protection
            .apply(&Update::ClearChannel(id))
            .expect("the channel id is in range");
        self.stats.channels_open -= 1;
        if let Some(done) = ch.closing {
            let _ = done.send(());
        }
    }

    fn snapshot(&self) -> EngineStats {
        let mut s = self.stats.clone();
        let p = self.protection.stats();
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
        s.device_time_requests = self.device_time.count();
        s.device_time_us = self
            .device_time
            .mean_us()
            .into_iter()
            .map(|(c, us)| (c.key().to_string(), us))
            .collect();
        s
    }

    /// Run every model event due by `now`, each at its own model time.
    fn deliver_due_events(&mut self, now: Ns) -> bool {
        let mut worked = false;
        // Lateness is measured once per pass (a clock read per completion
        // would itself add to it).
        let mut posted_at: Option<Ns> = None;
        while self.queue.peek_time().is_some_and(|t| t <= now) {
            let (t, event) = self.queue.pop().expect("peeked");
            self.stats.model_time_ns = t;
            self.device.handle(t, event);
            for (t, e) in self.device.outbox.drain(..) {
                self.queue.push(t, e);
            }
            let mut completions = std::mem::take(&mut self.device.completions);
            for c in completions.drain(..) {
                let posted = *posted_at.get_or_insert_with(|| self.clock.now());
                self.lateness.record(posted.saturating_sub(c.time_ns));
                self.device_time.record(&Parts::from_device(&c.parts));
                let (channel, tag) = self.retag.release(c.tag);
                debug_assert_eq!(c.token, token(channel, tag));
                self.finish(channel, tag, ResultCode::Ok);
            }
            self.device.completions = completions;
            worked = true;
        }
        worked
    }

    /// A request of (channel, tag) finished with `code`.
    fn finish(&mut self, channel: u16, tag: u8, code: ResultCode) {
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
        );
    }

    /// Report a result to the client: DMA completion writes the status word;
    /// interrupt completion goes through the kernel role (errors via the
    /// error queue, SPEC §3.5).
    fn post(
        &mut self,
        channel: u16,
        memory: &ChannelMemory,
        tag: u8,
        sequence: u16,
        dma_completion: bool,
        code: ResultCode,
    ) {
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
        if self.shared.kernel_sleeping.load(Ordering::Acquire) {
            sys::futex_wake_all(&self.shared.interrupt_word);
        }
    }

    /// Take new commands from the channels' slots, round robin over channels.
    fn poll_channels(&mut self, now: Ns) -> bool {
        let n = self.active.len();
        let mut worked = false;
        for i in 0..n {
            if !self.retag.has_free() {
                self.stats.retag_stalls += 1;
                break;
            }
            let id = self.active[(self.next_channel + i) % n];
            if self.shared.errors_queued[id as usize].load(Ordering::Acquire) >= ERRORS_PER_CHANNEL
            {
                self.stats.error_queue_stalls += 1;
                continue;
            }
            let channel = self.channels[id as usize].as_ref().expect("active");
            let mut submitted = 0u64;
            for tag in 0..CHANNEL_TAGS {
                if channel.memory.slot_control(tag).load(Ordering::Relaxed) != 0 {
                    submitted |= 1 << tag;
                }
            }
            if submitted == 0 {
                continue;
            }
            let memory = channel.memory.clone();
            while submitted != 0 {
                let tag = submitted.trailing_zeros() as usize;
                submitted &= submitted - 1;
                if !self.retag.has_free() {
                    self.stats.retag_stalls += 1;
                    break;
                }
                if self.shared.errors_queued[id as usize].load(Ordering::Acquire)
                    >= ERRORS_PER_CHANNEL
                {
                    self.stats.error_queue_stalls += 1;
                    break;
                }
                let control = memory.slot_control(tag).swap(0, Ordering::Acquire);
                let addr = memory.slot_addr(tag).load(Ordering::Relaxed);
                self.accept(now, id, &memory, tag as u8, [addr, control]);
                worked = true;
            }
        }
        if n > 0 {
            self.next_channel = (self.next_channel + 1) % n;
        }
        worked
    }

    /// Validate one command from `tag`'s slot and start it, or report why not.
    fn accept(&mut self, now: Ns, channel: u16, memory: &ChannelMemory, tag: u8, words: [u64; 2]) {
        // Until the words decode, report with what the control word claims.
        let (sequence, claimed_dma) = command::channel_reply_fields(words[1]);
        let fail = |me: &mut Self, code| me.post(channel, memory, tag, sequence, claimed_dma, code);
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
        let access = match cmd.op {
            Op::Read => Access::Read,
            Op::Write => Access::Write,
        };
        let check = self
            .protection
            .check(channel, cmd.addr.0, cmd.len_bytes, access);
        match check.outcome {
            CheckOutcome::Allowed => {}
            CheckOutcome::Missing => return fail(self, ResultCode::MissingRecord),
            CheckOutcome::Denied => return fail(self, ResultCode::PermissionDenied),
        }
        // SAFETY: `dma` covers `len` bytes inside the channel's DMA buffer
        // (dma_ptr checked), which is a separate mapping from the medium. The
        // client may change those bytes concurrently; we copy whatever is there.
        let moved = unsafe {
            match cmd.op {
                Op::Write => self.shared.medium.write_from(cmd.addr.0, dma, len),
                Op::Read => self.shared.medium.read_into(cmd.addr.0, dma, len),
            }
        };
        if moved.is_err() {
            return fail(self, ResultCode::DeviceFailure);
        }
        let ptag = self
            .retag
            .map(channel, tag)
            .expect("caller checked a tag is free");
        let request = DeviceRequest {
            token: token(channel, tag),
            op: cmd.op,
            addr: DeviceAddr(cmd.addr.0),
            len_bytes: cmd.len_bytes,
            barrier: cmd.barrier,
            protection_ns: check.steps as Ns * self.tree_step_ns,
        };
        if self.device.submit(now, ptag, request).is_err() {
            self.retag.release(ptag);
            return fail(self, ResultCode::DeviceFailure);
        }
        for (t, e) in self.device.outbox.drain(..) {
            self.queue.push(t, e);
        }
        match cmd.op {
            Op::Read => self.stats.bytes_read += cmd.len_bytes,
            Op::Write => self.stats.bytes_written += cmd.len_bytes,
        }
        let ch = self.channels[channel as usize].as_mut().expect("open");
        ch.in_flight[tag as usize] = Some(InFlight {
            sequence,
            dma_completion: cmd.dma_completion,
        });
        ch.in_flight_count += 1;
    }
}

fn token(channel: u16, tag: u8) -> u64 {
    (u64::from(channel) << 8) | u64::from(tag)
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
        forward_interrupts(shared);
    }
}

fn forward_interrupts(shared: &Shared) {
    let channels = shared.channels.read().expect("channels");
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
