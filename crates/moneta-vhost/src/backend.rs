//! The vhost-user-blk backend: rust-vmm's `vhost-user-backend` speaks the
//! vhost-user protocol with QEMU (memory table, vrings, kick and call
//! eventfds); each request of the one virtqueue is checked ([`crate::blk`])
//! and runs on a channel of the emulated device, the same path the NBD
//! export takes (`moneta::attach` on the control plane and a raw grant of
//! the export's range), so the device model times it and the library
//! holds its completion until its model time.
//!
//! Guest memory is the memfd QEMU shares (`memory-backend-memfd,share=on`),
//! mapped once by vhost-user-backend at `SET_MEM_TABLE`; every access to
//! it is a checked vm-memory call.
//!
//! Left out (issue 44 item 1): the virtqueue is served by
//! vhost-user-backend's worker thread woken by the guest's kick, not by a
//! poller on the device's reactor, and requests run one at a time (the
//! guest's queue depth reaches the device as depth 1); guest polling
//! (virtio-blk poll queues) is not offered.

use crate::blk::{self, Malformed, Scratch, Target};
use moneta::{CompletionMode, Io, Moneta};
use moneta_abi::sys::monotonic_ns;
use moneta_emu::control::ControlPlane;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::Listener;
use vhost_user_backend::{VhostUserBackendMut, VringRwLock, VringT};
use virtio_queue::QueueT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// Descriptors per virtqueue the guest may use at most.
pub const QUEUE_SIZE: usize = 256;

/// What the backend counted, read while it runs.
#[derive(Default, Debug)]
pub struct Stats {
    pub requests: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub flushes: AtomicU64,
    /// Chains refused as malformed (answered IOERR or used with length 0).
    pub malformed: AtomicU64,
    /// Requests answered with a status other than OK.
    pub errors: AtomicU64,
    /// Device requests (pieces of the channel's size) and their model
    /// latency, wall latency and delay behind the model's time, summed.
    pub device_requests: AtomicU64,
    pub modeled_ns: AtomicU64,
    pub wall_ns: AtomicU64,
    pub behind_ns: AtomicU64,
}

/// A snapshot of [`Stats`] with the means the verdict needs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsSnapshot {
    pub requests: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub malformed: u64,
    pub errors: u64,
    pub device_requests: u64,
    pub modeled_ns_mean: f64,
    pub wall_ns_mean: f64,
    pub behind_ns_mean: f64,
}

impl Stats {
    pub fn snapshot(&self) -> StatsSnapshot {
        let n = self.device_requests.load(Ordering::Relaxed);
        let mean = |a: &AtomicU64| {
            if n == 0 {
                0.0
            } else {
                a.load(Ordering::Relaxed) as f64 / n as f64
            }
        };
        StatsSnapshot {
            requests: self.requests.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            writes: self.writes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            malformed: self.malformed.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            device_requests: n,
            modeled_ns_mean: mean(&self.modeled_ns),
            wall_ns_mean: mean(&self.wall_ns),
            behind_ns_mean: mean(&self.behind_ns),
        }
    }

    fn record(&self, m: &Moneta, io: &Io) {
        let seen = monotonic_ns();
        let issued = io.issued_at_ns();
        let due = m.due_ns(io);
        self.device_requests.fetch_add(1, Ordering::Relaxed);
        self.modeled_ns
            .fetch_add(due.saturating_sub(issued), Ordering::Relaxed);
        self.wall_ns
            .fetch_add(seen.saturating_sub(issued), Ordering::Relaxed);
        self.behind_ns
            .fetch_add(seen.saturating_sub(due), Ordering::Relaxed);
    }
}

/// A channel of the emulated device granted `[start, start + size)`.
pub struct ChannelTarget {
    moneta: Moneta,
    plane: Arc<ControlPlane>,
    start: u64,
    size: u64,
    read_only: bool,
    stats: Arc<Stats>,
}

impl ChannelTarget {
    /// Open a channel on `plane` for the export `[start, start + size)`.
    pub fn open(
        plane: &Arc<ControlPlane>,
        start: u64,
        size: u64,
        read_only: bool,
        stats: Arc<Stats>,
    ) -> Result<ChannelTarget, String> {
        if size == 0 || !size.is_multiple_of(blk::SECTOR_BYTES) {
            return Err(format!(
                "export size {size}: must be a positive multiple of {} bytes",
                blk::SECTOR_BYTES
            ));
        }
        let moneta = moneta::attach(plane, None).map_err(|e| format!("no device channel: {e}"))?;
        if start
            .checked_add(size)
            .is_none_or(|end| end > moneta.capacity_bytes())
        {
            return Err(format!(
                "export [{start}, +{size}) is outside the device's {} bytes",
                moneta.capacity_bytes()
            ));
        }
        moneta
            .grant_raw(start, size, !read_only)
            .map_err(|e| format!("no grant of the export: {e}"))?;
        Ok(ChannelTarget {
            moneta,
            plane: plane.clone(),
            start,
            size,
            read_only,
            stats,
        })
    }
}

impl Target for ChannelTarget {
    fn capacity_bytes(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        let stats = &self.stats;
        self.moneta
            .read_each(self.start + addr, buf, CompletionMode::Dma, |m, io| {
                stats.record(m, io)
            })
            .map_err(|e| e.to_string())
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), String> {
        let stats = &self.stats;
        self.moneta
            .write_each(self.start + addr, buf, CompletionMode::Dma, |m, io| {
                stats.record(m, io)
            })
            .map_err(|e| e.to_string())
    }

    fn flush(&self) -> Result<(), String> {
        self.plane
            .engine()
            .medium()
            .flush()
            .map_err(|e| e.to_string())
    }
}

/// The virtio-blk device one QEMU connects to.
pub struct BlkBackend {
    target: ChannelTarget,
    mem: Option<GuestMemoryAtomic<GuestMemoryMmap>>,
    event_idx: bool,
    scratch: Scratch,
    stats: Arc<Stats>,
    exit: (EventConsumer, EventNotifier),
}

impl BlkBackend {
    pub fn new(target: ChannelTarget) -> io::Result<BlkBackend> {
        let stats = target.stats.clone();
        Ok(BlkBackend {
            target,
            mem: None,
            event_idx: false,
            scratch: Scratch::default(),
            stats,
            exit: new_event_consumer_and_notifier(EventFlag::NONBLOCK)?,
        })
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// Serve every available chain of `vring`; with EVENT_IDX, until the
    /// guest added none between the last pop and re-enabling kicks.
    fn process(&mut self, vring: &VringRwLock) -> io::Result<()> {
        let Some(atomic) = &self.mem else {
            return Ok(());
        };
        let mem = atomic.memory();
        loop {
            if self.event_idx {
                vring.disable_notification().map_err(queue_error)?;
            }
            loop {
                let chain = vring.get_mut().get_queue_mut().pop_descriptor_chain(&*mem);
                let Some(chain) = chain else { break };
                let head = chain.head_index();
                let (served, malformed) = blk::serve(&mem, chain, &self.target, &mut self.scratch);
                self.count(&served, malformed);
                if vring.add_used(head, served.used_len).is_err() {
                    // A head outside the descriptor table: there is no
                    // used entry to give it; the chain is dropped.
                    self.stats.malformed.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                if !self.event_idx || vring.needs_notification().map_err(queue_error)? {
                    vring.signal_used_queue()?;
                }
            }
            if !self.event_idx || !vring.enable_notification().map_err(queue_error)? {
                return Ok(());
            }
        }
    }

    fn count(&self, served: &blk::Served, malformed: Option<Malformed>) {
        let s = &self.stats;
        s.requests.fetch_add(1, Ordering::Relaxed);
        match served.kind {
            Some(blk::T_IN) => s.reads.fetch_add(1, Ordering::Relaxed),
            Some(blk::T_OUT) | Some(blk::T_WRITE_ZEROES) => {
                s.writes.fetch_add(1, Ordering::Relaxed)
            }
            Some(blk::T_FLUSH) => s.flushes.fetch_add(1, Ordering::Relaxed),
            _ => 0,
        };
        if malformed.is_some() {
            s.malformed.fetch_add(1, Ordering::Relaxed);
            if std::env::var_os("MONETA_VHOST_DEBUG").is_some() {
                eprintln!("moneta-vhost: malformed chain: {malformed:?}");
            }
        }
        if served.status != Some(blk::S_OK) {
            s.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn queue_error(e: virtio_queue::Error) -> io::Error {
    io::Error::other(format!("virtqueue: {e}"))
}

impl VhostUserBackendMut for BlkBackend {
    type Bitmap = ();
    type Vring = VringRwLock;

    fn num_queues(&self) -> usize {
        1
    }

    fn max_queue_size(&self) -> usize {
        QUEUE_SIZE
    }

    fn features(&self) -> u64 {
        let mut f = blk::F_SIZE_MAX
            | blk::F_SEG_MAX
            | blk::F_BLK_SIZE
            | blk::F_FLUSH
            | blk::F_DISCARD
            | blk::F_WRITE_ZEROES
            | blk::F_INDIRECT_DESC
            | blk::F_EVENT_IDX
            | blk::F_VERSION_1
            | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
        if self.target.read_only {
            f |= blk::F_RO;
        }
        f
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ
    }

    fn set_event_idx(&mut self, enabled: bool) {
        self.event_idx = enabled;
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let config = blk::config_space(self.target.size);
        let (offset, size) = (offset as usize, size as usize);
        match offset.checked_add(size) {
            Some(end) if end <= config.len() => config[offset..end].to_vec(),
            _ => Vec::new(),
        }
    }

    fn update_memory(&mut self, mem: GuestMemoryAtomic<GuestMemoryMmap>) -> io::Result<()> {
        self.mem = Some(mem);
        Ok(())
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        let consumer = self.exit.0.try_clone().ok()?;
        let notifier = self.exit.1.try_clone().ok()?;
        Some((consumer, notifier))
    }

    fn handle_event(
        &mut self,
        device_event: u16,
        evset: EventSet,
        vrings: &[VringRwLock],
        _thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event set {evset:?}")));
        }
        match vrings.get(device_event as usize) {
            Some(vring) => self.process(vring),
            None => Err(io::Error::other(format!("no virtqueue {device_event}"))),
        }
    }
}

/// A vhost-user socket bound for one QEMU (the front end connects to it).
pub struct VhostServer {
    listener: Listener,
    backend: Arc<RwLock<BlkBackend>>,
    exit: EventNotifier,
    socket: PathBuf,
}

impl VhostServer {
    /// Bind `socket` (an old socket file there is replaced): QEMU may
    /// connect once this returns.
    pub fn bind(socket: &Path, backend: BlkBackend) -> Result<VhostServer, String> {
        let listener = Listener::new(socket, true)
            .map_err(|e| format!("vhost-user socket {}: {e}", socket.display()))?;
        let exit = backend
            .exit
            .1
            .try_clone()
            .map_err(|e| format!("vhost-user exit event: {e}"))?;
        Ok(VhostServer {
            listener,
            backend: Arc::new(RwLock::new(backend)),
            exit,
            socket: socket.to_path_buf(),
        })
    }

    /// Serve the first front end that connects until it disconnects, then
    /// stop the worker threads. A front end that never comes leaves this
    /// waiting in accept: [`VhostServer::unblock`] ends that.
    pub fn run(mut self) -> Result<(), String> {
        let mut daemon = vhost_user_backend::VhostUserDaemon::new(
            "moneta-vhost".into(),
            self.backend.clone(),
            GuestMemoryAtomic::new(GuestMemoryMmap::new()),
        )
        .map_err(|e| format!("vhost-user daemon: {e}"))?;
        let started = daemon
            .start(&mut self.listener)
            .map_err(|e| format!("vhost-user on {}: {e}", self.socket.display()));
        let result = started.and_then(|()| match daemon.wait() {
            // QEMU exiting after the guest powered off.
            Ok(())
            | Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => Ok(()),
            Err(e) => Err(format!("vhost-user on {}: {e}", self.socket.display())),
        });
        let _ = self.exit.notify();
        result
    }

    /// Connect to `socket` and hang up at once: a server still waiting in
    /// accept takes it and ends.
    pub fn unblock(socket: &Path) {
        let _ = std::os::unix::net::UnixStream::connect(socket);
    }
}
