//! The QuickSAN experiments of §5.4 (SPEC §4.4): closed-loop threads on the
//! hosts, each request through one host interface (`interfaces`) and the
//! SAN (`system::San`), on one event queue and one virtual clock.
//!
//! [`run`] is the one driver: every host that runs the workload (all nodes
//! when distributed; the clients when centralized) has `threads_per_host`
//! threads; each thread takes its next request from its host's
//! [`RequestSource`] (random addresses for latency, bandwidth, scaling and
//! replication; a script for the sort) and carries it through its
//! interface:
//!
//! - QuickSAN-D / QuickSAN-OS: software before the issue (`host::plan`),
//!   `San::submit` through the host's own device (global address), the
//!   completion path, software after.
//! - iSCSI: OS entry, GFS2 and initiator software; the command PDU as
//!   `San::send_message` to the target host, plus Table 5.1's interconnect
//!   latency each way (`TransportPath::interconnect_ns_each_way`; neither
//!   when the target is the host itself: TCP loopback, its CPU is in the
//!   software); the target's PDU work on tgtd's event loop and its block
//!   IO on tgt's workers (`interfaces::TargetCpu`, FIFO each);
//!   `San::submit_local` on the target SSD; the response PDU back; OS return.
//! - Fibre Channel: OS entry and GFS2; the payload on the 8GFC ports of
//!   the client and the target (FIFO each direction); the fixed transport
//!   latency; `San::submit_local`; the return.
//!
//! Every request's parts (host software, waits, network, the device's own
//! parts from the SAN) sum exactly to its latency: checked per request.
//! A QuickSAN thread holds its own core while it runs and spins (threads
//! per host ≤ the E5520 pair's 8 cores in every experiment here). With
//! `san.host_cores_shared` a host's `host.cores` are one FIFO pool that its
//! block-transport clients' software (before the issue, after the
//! response) and, distributed, the iSCSI target's software on the same
//! host share: a burst waits for a free core (`CoreWait`; the target's
//! event loop and workers wait for their own thread and a core). Off, the
//! target's threads and the clients never contend.
//!
//! On top of [`run`], one function per experiment returns its rows:
//! [`latency`] (§5.4.2, one thread; Table 5.1's grouping beside the
//! paper's block transport), [`bandwidth`] (§5.4.3), [`scaling`] (§5.4.4,
//! 16 GB per node), [`replication`] (§5.4.5); energy (§5.4.7) is `energy`, the sort
//! (§5.4.6) is `sort`. Left out: host core contention, the issue-sleep
//! completion's system call overlapping the device (it is counted after).

use crate::breakdown::{Breakdown, Component, Parts};
use crate::config::{Config, InterfaceCosts};
use crate::host::FileLock;
use crate::kernel::rng::Rng;
use crate::kernel::EventQueue;
use crate::san::ids::{DeviceId, HostId};
use crate::san::interfaces::{
    device_path, host_config, transport_path, DevicePath, FifoServers, Interface, TransportPath,
};
use crate::san::system::{DeviceKind, San, SanConfig, SanCounters, SanEvent, SanRequest, Topology};
use crate::stats::LatencyHistogram;
use crate::units::{transfer_ns, Ns, Op};
use crate::workload::{OpMix, RunLimit};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};

/// Which addresses a random source picks, relative to the requesting host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Locality {
    /// Uniform over the whole global space.
    Any,
    /// Only addresses whose primary copy is on the host's own SSD.
    Local,
    /// Only addresses with no copy on the host's own SSD (neither the
    /// primary nor, mirrored, the replica): every request crosses the wire.
    Remote,
}

impl Locality {
    pub fn key(self) -> &'static str {
        match self {
            Locality::Any => "any",
            Locality::Local => "local",
            Locality::Remote => "remote",
        }
    }
}

/// One scripted request (the sort's reads and writes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scripted {
    pub op: Op,
    /// Global address.
    pub addr: u64,
    pub len_bytes: u64,
}

/// Where a host's threads take their requests from.
#[derive(Debug, Clone)]
pub enum RequestSource {
    /// Random size-aligned requests (XDD-like), until the run's limit.
    Random {
        mix: OpMix,
        size_bytes: u64,
        locality: Locality,
    },
    /// These requests per host, in order, shared by the host's threads.
    Script(Vec<VecDeque<Scripted>>),
}

/// One experiment run.
#[derive(Debug, Clone)]
pub struct Experiment {
    pub san: SanConfig,
    pub costs: InterfaceCosts,
    pub interface: Interface,
    pub threads_per_host: u32,
    pub source: RequestSource,
    /// For random sources (scripts end by themselves).
    pub limit: RunLimit,
    pub seed: u64,
    /// Run the workload on the first this-many client hosts only (the
    /// single-thread latency test uses one); `None`: all of them.
    pub active_hosts: Option<u16>,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub elapsed_ns: Ns,
    pub ops: u64,
    pub bytes: u64,
    pub latency: LatencyHistogram,
    pub breakdown: Breakdown,
    /// Hosts that ran threads.
    pub active_hosts: u16,
    /// Bytes served by the requesting host's own SSD and by other SSDs
    /// (for iSCSI and Fibre Channel: the target on the same host or not).
    pub local_bytes: u64,
    pub remote_bytes: u64,
    /// CPU time on the clients (software, spinning, interrupts) and on the
    /// iSCSI targets.
    pub client_cpu_ns: u64,
    pub target_cpu_ns: u64,
    pub counters: SanCounters,
    pub ssds: u16,
}

impl RunResult {
    /// 10^6 bytes per second, per active host.
    pub fn mb_per_s_per_host(&self) -> f64 {
        crate::experiment::rate(self.bytes, self.elapsed_ns) / 1e6 / self.active_hosts.max(1) as f64
    }

    pub fn mb_per_s(&self, bytes: u64) -> f64 {
        crate::experiment::rate(bytes, self.elapsed_ns) / 1e6
    }
}

/// The hosts that run the workload under `topology`.
pub fn client_hosts(topology: Topology) -> Vec<HostId> {
    match topology {
        Topology::Distributed { nodes } => (0..nodes).map(HostId).collect(),
        Topology::Centralized { clients, .. } => (1..=clients).map(HostId).collect(),
    }
}

/// Run one experiment in virtual time.
pub fn run(experiment: &Experiment) -> Result<RunResult, String> {
    Engine::new(experiment)?.run()
}

#[derive(Debug, Clone, Copy)]
enum HostEvent {
    /// The thread starts its next request.
    Start(u32),
    /// Host software before the issue is done: hand the request on.
    Issue(u32),
    /// iSCSI / FC: the request reaches the target (loopback or wire).
    AtTarget(u32),
    /// The target submits to its SSD.
    TargetSubmit(u32),
    /// The request is back and its software done.
    Finish(u32),
    /// A QuickSAN-OS write enters the file system: it takes its host's
    /// file write lock (`san.fs_write_atomicity`, `host::FileLock`).
    Lock(u32),
    /// A host's file write lock is given back.
    Unlock(HostId),
}

#[derive(Debug, Clone, Copy)]
enum Path {
    Device(DevicePath),
    Transport(TransportPath),
}

struct Thread {
    host: HostId,
    rng: Rng,
    op: Op,
    addr: u64,
    bytes: u64,
    /// Where the request goes: the SSD and its local address (block
    /// transports) or the host's own device (QuickSAN).
    target: (DeviceId, u64),
    start_ns: Ns,
    /// Time up to which `parts` account for the request.
    cursor_ns: Ns,
    parts: Parts,
    path: Option<Path>,
    /// The SSD has answered the current request.
    device_done: bool,
    done: bool,
}

impl Thread {
    /// `component` took the time from the cursor to `until`.
    fn until(&mut self, component: Component, until: Ns) {
        self.parts.add(component, until - self.cursor_ns);
        self.cursor_ns = until;
    }
}

struct Engine<'a> {
    x: &'a Experiment,
    san: San,
    queue: EventQueue<HostEvent>,
    threads: Vec<Thread>,
    host_config: Config,
    paths: HashMap<(Op, u64), Path>,
    scripts: Vec<VecDeque<Scripted>>,
    target_cpu: Vec<FifoServers>,
    /// Per host: tgt's backing-store worker threads.
    target_workers: Vec<FifoServers>,
    /// Per host, with `san.host_cores_shared`: its cores, shared by the
    /// block-transport clients' software and the iSCSI target's.
    cores: Option<Vec<FifoServers>>,
    /// Fibre Channel ports per host: transmit and receive.
    fc_tx: Vec<FifoServers>,
    fc_rx: Vec<FifoServers>,
    issued: u64,
    result: RunResult,
    events: Vec<SanEvent>,
    /// Per host: the file write lock of POSIX write atomicity through the
    /// kernel file system.
    write_locks: Vec<FileLock>,
}

impl<'a> Engine<'a> {
    fn new(x: &'a Experiment) -> Result<Self, String> {
        if x.threads_per_host == 0 {
            return Err("threads per host must be at least 1".into());
        }
        let san = San::new(&x.san, x.seed).map_err(|e| e.to_string())?;
        let mut hosts = client_hosts(x.san.topology);
        if let Some(n) = x.active_hosts {
            if n == 0 || n as usize > hosts.len() {
                return Err(format!(
                    "{n} active hosts requested, the topology has {} client hosts",
                    hosts.len()
                ));
            }
            hosts.truncate(n as usize);
        }
        let host_config = host_config(&x.san.device, x.interface, &x.costs);
        let mut threads = Vec::new();
        for &host in &hosts {
            if san.devices_of(host).is_empty() {
                return Err(format!("host {} has no QuickSAN device", host.0));
            }
            for _ in 0..x.threads_per_host {
                let id = threads.len() as u64;
                threads.push(Thread {
                    host,
                    rng: Rng::stream(x.seed, id),
                    op: Op::Read,
                    addr: 0,
                    bytes: 0,
                    target: (DeviceId(0), 0),
                    start_ns: 0,
                    cursor_ns: 0,
                    parts: Parts::default(),
                    path: None,
                    device_done: false,
                    done: false,
                });
            }
        }
        let scripts = match &x.source {
            RequestSource::Script(s) => {
                if s.len() != hosts.len() {
                    return Err(format!(
                        "a script per active host: {} scripts for {} hosts",
                        s.len(),
                        hosts.len()
                    ));
                }
                s.clone()
            }
            RequestSource::Random {
                size_bytes,
                locality,
                ..
            } => {
                if *size_bytes == 0 || *size_bytes > san.capacity_bytes() {
                    return Err(format!(
                        "request size {size_bytes} B must be within 1 B … the SAN's {} B",
                        san.capacity_bytes()
                    ));
                }
                let ssds_elsewhere = |h: HostId| {
                    (0..san.hosts()).map(HostId).any(|o| {
                        o != h
                            && san
                                .devices_of(o)
                                .iter()
                                .any(|&d| san.kind(d) == DeviceKind::Ssd)
                    })
                };
                for &h in &hosts {
                    let own_ssd = san
                        .devices_of(h)
                        .iter()
                        .any(|&d| san.kind(d) == DeviceKind::Ssd);
                    match locality {
                        Locality::Local if !own_ssd => {
                            return Err(format!(
                                "host {} has no SSD of its own: no local accesses (use a distributed topology)",
                                h.0
                            ))
                        }
                        Locality::Remote if !ssds_elsewhere(h) => {
                            return Err(format!(
                                "host {} has no remote SSD to access (use at least 2 nodes)",
                                h.0
                            ))
                        }
                        _ => {}
                    }
                }
                Vec::new()
            }
        };
        let n = san.hosts() as usize;
        let target_cores = x.costs.iscsi_target_cores;
        let target_cpu = (0..n)
            .map(|_| FifoServers::new(target_cores))
            .collect::<Result<_, _>>()?;
        let target_workers = (0..n)
            .map(|_| FifoServers::new(x.costs.iscsi_target_workers))
            .collect::<Result<_, _>>()?;
        let ports = || {
            (0..n)
                .map(|_| FifoServers::new(1))
                .collect::<Result<Vec<_>, _>>()
        };
        let cores = if x.costs.host_cores_shared && !x.interface.uses_quicksan_network() {
            let per_host = x.san.device.host.cores;
            Some(
                (0..n)
                    .map(|_| FifoServers::new(per_host))
                    .collect::<Result<Vec<_>, _>>()?,
            )
        } else {
            None
        };
        let ssds = (0..san.hosts())
            .flat_map(|h| san.devices_of(HostId(h)).to_vec())
            .filter(|&d| san.kind(d) == DeviceKind::Ssd)
            .count() as u16;
        Ok(Engine {
            x,
            queue: EventQueue::new(),
            threads,
            host_config,
            paths: HashMap::new(),
            scripts,
            target_cpu,
            target_workers,
            cores,
            fc_tx: ports()?,
            fc_rx: ports()?,
            issued: 0,
            result: RunResult {
                elapsed_ns: 0,
                ops: 0,
                bytes: 0,
                latency: LatencyHistogram::new(),
                breakdown: Breakdown::default(),
                active_hosts: hosts.len() as u16,
                local_bytes: 0,
                remote_bytes: 0,
                client_cpu_ns: 0,
                target_cpu_ns: 0,
                counters: SanCounters::default(),
                ssds,
            },
            san,
            events: Vec::new(),
            write_locks: vec![FileLock::default(); n],
        })
    }

    fn run(mut self) -> Result<RunResult, String> {
        for t in 0..self.threads.len() as u32 {
            self.queue.push(0, HostEvent::Start(t));
        }
        loop {
            // The SAN's events go first at a tie with the hosts'.
            match (self.san.next_event_time(), self.queue.peek_time()) {
                (None, None) => break,
                (Some(s), h) if h.is_none_or(|h| s <= h) => {
                    let mut events = std::mem::take(&mut self.events);
                    self.san.deliver_due(s, |e| events.push(e));
                    for e in events.drain(..) {
                        self.san_event(e)?;
                    }
                    self.events = events;
                }
                _ => {
                    let (now, event) = self.queue.pop().expect("peeked");
                    self.host_event(now, event)?;
                }
            }
        }
        let pending = self.threads.iter().filter(|t| !t.done).count();
        if pending > 0 {
            let now = self.result.elapsed_ns;
            let c = self.san.counters(now);
            return Err(format!(
                "{pending} threads still wait for a request the SAN never completed (SAN stalled after {} requests at {now} ns: {} pause frames, {} packets, largest receive buffer {} B, {} packets dropped)",
                c.requests_completed,
                c.pauses,
                c.packets,
                c.max_rx_buffer_bytes,
                self.san.dropped_packets()
            ));
        }
        self.result.target_cpu_ns = self
            .target_cpu
            .iter()
            .chain(&self.target_workers)
            .map(|s| s.busy_ns())
            .sum();
        self.result.counters = self.san.counters(self.result.elapsed_ns);
        Ok(self.result)
    }

    fn path(&mut self, op: Op, bytes: u64) -> Result<Path, String> {
        if let Some(p) = self.paths.get(&(op, bytes)) {
            return Ok(*p);
        }
        let i = self.x.interface;
        let p = if i.uses_quicksan_network() {
            Path::Device(device_path(&self.host_config, op, bytes)?)
        } else {
            Path::Transport(transport_path(
                &self.host_config,
                i,
                &self.x.costs,
                op,
                bytes,
            )?)
        };
        self.paths.insert((op, bytes), p);
        Ok(p)
    }

    /// The thread's next request, or `None` when its source is exhausted.
    fn next_request(&mut self, now: Ns, t: u32) -> Result<Option<(Op, u64, u64)>, String> {
        let host = self.threads[t as usize].host;
        match &self.x.source {
            RequestSource::Script(_) => {
                let i = client_hosts(self.x.san.topology)
                    .iter()
                    .position(|&h| h == host)
                    .expect("a client");
                Ok(self.scripts[i]
                    .pop_front()
                    .map(|s| (s.op, s.addr, s.len_bytes)))
            }
            &RequestSource::Random {
                mix,
                size_bytes,
                locality,
            } => {
                let over = match self.x.limit {
                    RunLimit::Ops(n) => self.issued >= n,
                    RunLimit::DurationNs(d) => now >= d,
                };
                if over {
                    return Ok(None);
                }
                let slots = self.san.capacity_bytes() / size_bytes;
                let th = &mut self.threads[t as usize];
                let op = match mix {
                    OpMix::Read => Op::Read,
                    OpMix::Write => Op::Write,
                    OpMix::Mixed(reads) if th.rng.unit() < reads => Op::Read,
                    OpMix::Mixed(_) => Op::Write,
                };
                // Rejection sampling for locality: bounded, an error if the
                // map gives the host (almost) nothing of the wanted kind.
                for _ in 0..10_000 {
                    let addr = th.rng.below(slots) * size_bytes;
                    let (device, _) = self.san.primary(addr);
                    let local = self.san.host_of(device) == host;
                    // Mirrored, a read of a slice whose replica is here is
                    // served here: no copy on this host makes it remote.
                    let copy_here = local
                        || self
                            .san
                            .replica(addr)
                            .is_some_and(|(d, _)| self.san.host_of(d) == host);
                    let wanted = match locality {
                        Locality::Any => true,
                        Locality::Local => local,
                        Locality::Remote => !copy_here,
                    };
                    if wanted {
                        return Ok(Some((op, addr, size_bytes)));
                    }
                }
                Err(format!(
                    "no {} address for host {} in 10000 tries",
                    locality.key(),
                    host.0
                ))
            }
        }
    }

    fn host_event(&mut self, now: Ns, event: HostEvent) -> Result<(), String> {
        match event {
            HostEvent::Start(t) => self.start(now, t),
            HostEvent::Issue(t) => self.issue(now, t),
            HostEvent::AtTarget(t) => {
                self.at_target(now, t);
                Ok(())
            }
            HostEvent::TargetSubmit(t) => {
                let th = &mut self.threads[t as usize];
                let (device, addr) = th.target;
                let request = self.request(t, addr, 0);
                self.san
                    .submit_local(now, device, request)
                    .map_err(|e| e.to_string())
            }
            HostEvent::Finish(t) => self.finish(now, t),
            HostEvent::Lock(t) => {
                let host = self.threads[t as usize].host;
                if self.write_locks[host.0 as usize].acquire(t) {
                    self.proceed(now, t, 0);
                }
                Ok(())
            }
            HostEvent::Unlock(host) => {
                if let Some(next) = self.write_locks[host.0 as usize].release() {
                    // The waiter slept; handed the lock, it is woken and
                    // switches in holding it, as in the single-device
                    // model (`experiment.rs`, SPEC §2.2's 2 µs switch).
                    let switch = self.x.san.device.host.costs.io_scheduler_switch_ns;
                    self.proceed(now, next, switch);
                }
                Ok(())
            }
        }
    }

    /// Software time before thread `t`'s request takes its host's file
    /// write lock, if it takes it: a write through GFS2 when
    /// `san.fs_write_atomicity` is on — QuickSAN-OS (`host_config`), and
    /// with `san.fs_write_atomicity_existing` iSCSI and Fibre Channel
    /// (`transport_path`: §5.1.1 "Both run under Linux and GFS2"). §5.2.2:
    /// the direct path relaxes POSIX atomicity, the file system keeps it.
    fn lock_after_ns(&self, t: u32) -> Option<Ns> {
        match self.threads[t as usize].path {
            Some(Path::Device(p)) => p.file_lock_after_ns,
            Some(Path::Transport(p)) => p.file_lock_after_ns,
            None => None,
        }
    }

    /// The request's completion is noticed at its host: give the write lock
    /// back at `at`.
    fn unlock_at(&mut self, at: Ns, t: u32) {
        if self.lock_after_ns(t).is_some() {
            self.queue
                .push(at, HostEvent::Unlock(self.threads[t as usize].host));
        }
    }

    fn request(&self, t: u32, addr: u64, protection_ns: Ns) -> SanRequest {
        let th = &self.threads[t as usize];
        SanRequest {
            token: t as u64,
            op: th.op,
            addr,
            len_bytes: th.bytes,
            protection_ns,
        }
    }

    fn start(&mut self, now: Ns, t: u32) -> Result<(), String> {
        let Some((op, addr, bytes)) = self.next_request(now, t)? else {
            self.threads[t as usize].done = true;
            return Ok(());
        };
        self.issued += 1;
        let path = self.path(op, bytes)?;
        let (device, local) = self.san.primary(addr);
        let th = &mut self.threads[t as usize];
        th.op = op;
        th.addr = addr;
        th.bytes = bytes;
        th.target = (device, local);
        th.start_ns = now;
        th.path = Some(path);
        th.device_done = false;
        match self.lock_after_ns(t) {
            Some(entry) => self.queue.push(now + entry, HostEvent::Lock(t)),
            None => self.proceed(now, t, 0),
        }
        Ok(())
    }

    /// The thread may go on with its request (it holds the write lock if
    /// it needs one): after a context switch of `switch_ns` (a woken lock
    /// waiter's), software before the issue, from `now`.
    fn proceed(&mut self, now: Ns, t: u32, switch_ns: Ns) {
        let entry = self.lock_after_ns(t).unwrap_or(0);
        let th = &mut self.threads[t as usize];
        let path = th.path.expect("started");
        let before = match path {
            Path::Device(p) => {
                th.parts = p.software;
                self.result.client_cpu_ns += p.software.total_ns();
                p.before_ns
            }
            Path::Transport(p) => {
                th.parts = p.before;
                th.parts.add_parts(&p.after);
                self.result.client_cpu_ns += p.before_ns + p.after_ns;
                p.before_ns
            }
        };
        // The software before the lock ran from the start.
        th.parts.add(Component::LockWait, now - th.start_ns - entry);
        th.parts.add(Component::WakeUp, switch_ns);
        self.result.client_cpu_ns += switch_ns;
        let burst = switch_ns + before - entry;
        let start = match &mut self.cores {
            Some(cores) => cores[th.host.0 as usize].serve(now, burst).0,
            None => now,
        };
        th.parts.add(Component::CoreWait, start - now);
        th.cursor_ns = start + burst;
        self.queue.push(th.cursor_ns, HostEvent::Issue(t));
    }

    /// Thread `t`'s software after its response, ready at `now`: on a core
    /// of its host (waiting for one when they are shared), then `Finish`.
    fn return_after(&mut self, now: Ns, t: u32, after_ns: Ns) {
        let th = &mut self.threads[t as usize];
        let start = match &mut self.cores {
            Some(cores) => cores[th.host.0 as usize].serve(now, after_ns).0,
            None => now,
        };
        th.parts.add(Component::CoreWait, start - now);
        self.queue.push(start + after_ns, HostEvent::Finish(t));
    }

    /// `ns` of the iSCSI target's work at `now` on host `h`: on one of
    /// `threads` (its event loop or its workers) and, with shared cores, on
    /// a core of the host too. Returns (start, end).
    fn target_serve(&mut self, now: Ns, h: usize, workers: bool, ns: Ns) -> (Ns, Ns) {
        let threads = if workers {
            &mut self.target_workers[h]
        } else {
            &mut self.target_cpu[h]
        };
        match &mut self.cores {
            Some(cores) => {
                let ready = now
                    .max(threads.earliest_free_ns())
                    .max(cores[h].earliest_free_ns());
                threads.serve(ready, ns);
                cores[h].serve(ready, ns)
            }
            None => threads.serve(now, ns),
        }
    }

    fn issue(&mut self, now: Ns, t: u32) -> Result<(), String> {
        let th = &self.threads[t as usize];
        let host = th.host;
        let target_host = self.san.host_of(th.target.0);
        match th.path.expect("started") {
            Path::Device(p) => {
                let device = self.san.devices_of(host)[0];
                let request = self.request(t, th.addr, p.protection_ns);
                self.san
                    .submit(now, device, request)
                    .map_err(|e| e.to_string())
            }
            Path::Transport(p) if self.x.interface == Interface::Iscsi => {
                if target_host == host {
                    self.queue.push(now, HostEvent::AtTarget(t));
                    Ok(())
                } else {
                    self.san
                        .send_message(now, host, target_host, p.request_bytes, t as u64)
                        .map_err(|e| e.to_string())
                }
            }
            Path::Transport(p) => {
                let arrive = self.fc_wire(now, t, host, target_host, p.request_bytes);
                self.queue.push(arrive, HostEvent::AtTarget(t));
                Ok(())
            }
        }
    }

    /// `bytes` of Fibre Channel payload from `from` to `to` at `now`, on the
    /// sender's transmit and the receiver's receive port (one port when both
    /// are the same host); returns the arrival.
    fn fc_wire(&mut self, now: Ns, t: u32, from: HostId, to: HostId, bytes: u64) -> Ns {
        if bytes == 0 {
            return now;
        }
        let wire = transfer_ns(bytes, self.x.costs.fc_link_bytes_per_s);
        let (f, r) = (from.0 as usize, to.0 as usize);
        let start = if f == r {
            self.fc_tx[f].serve(now, wire).0
        } else {
            // Cut-through: the frames hold both ports at once.
            let ready = now
                .max(self.fc_tx[f].earliest_free_ns())
                .max(self.fc_rx[r].earliest_free_ns());
            self.fc_tx[f].serve(ready, wire);
            self.fc_rx[r].serve(ready, wire);
            ready
        };
        let th = &mut self.threads[t as usize];
        th.until(Component::NetworkWait, start);
        th.until(Component::Network, start + wire);
        start + wire
    }

    /// The request reached the target host (iSCSI) or target port (FC).
    fn at_target(&mut self, now: Ns, t: u32) {
        let target_host = self.san.host_of(self.threads[t as usize].target.0);
        let th = &mut self.threads[t as usize];
        let Some(Path::Transport(p)) = th.path else {
            unreachable!("only block transports reach a target")
        };
        // Time since the cursor was the PDU on the fabric (zero on loopback).
        th.until(Component::Network, now);
        let submit = if self.x.interface == Interface::Iscsi {
            // The event loop takes the PDU, then a worker the block IO.
            let h = target_host.0 as usize;
            let (start, end) = self.target_serve(now, h, false, p.target_ns);
            let th = &mut self.threads[t as usize];
            th.until(Component::TargetWait, start);
            th.until(Component::BlockTransport, end);
            let (start, end) = self.target_serve(end, h, true, p.target_worker_ns);
            let th = &mut self.threads[t as usize];
            th.until(Component::TargetWait, start);
            end
        } else {
            now + p.target_ns
        };
        let th = &mut self.threads[t as usize];
        th.until(Component::BlockTransport, submit);
        self.queue.push(submit, HostEvent::TargetSubmit(t));
    }

    fn san_event(&mut self, event: SanEvent) -> Result<(), String> {
        match event {
            SanEvent::Message { token, time_ns, .. } => {
                let t = token as u32;
                // The command PDU arrives at the target, or the response at
                // the initiator (once the SSD has answered).
                // Over the wire, each way also takes the interconnect
                // latency of Table 5.1's row (a loopback access has none).
                let th = &mut self.threads[t as usize];
                let Some(Path::Transport(p)) = th.path else {
                    unreachable!("messages are iSCSI's")
                };
                th.until(Component::Network, time_ns);
                let arrived = time_ns + p.interconnect_ns_each_way;
                th.until(Component::BlockTransport, arrived);
                if th.device_done {
                    self.return_after(arrived, t, p.after_ns);
                    self.unlock_at(arrived, t);
                } else {
                    self.queue.push(arrived, HostEvent::AtTarget(t));
                }
                Ok(())
            }
            SanEvent::Completed {
                token,
                time_ns,
                parts,
                local_bytes,
                remote_bytes,
                ..
            } => {
                let t = token as u32;
                let interface = self.x.interface;
                let th = &mut self.threads[t as usize];
                debug_assert_eq!(parts.total_ns(), time_ns - th.cursor_ns);
                let issued_at = th.cursor_ns;
                th.parts.add_device(&parts);
                th.cursor_ns = time_ns;
                th.device_done = true;
                let host = th.host;
                let target_host = self.san.host_of(th.target.0);
                if interface.uses_quicksan_network() {
                    self.result.local_bytes += local_bytes;
                    self.result.remote_bytes += remote_bytes;
                } else if host == target_host {
                    self.result.local_bytes += th.bytes;
                } else {
                    self.result.remote_bytes += th.bytes;
                }
                match th.path.expect("started") {
                    Path::Device(p) => {
                        th.parts.add_parts(&p.completion);
                        if p.spins {
                            // Spinning since the issue (the cursor before the device's parts).
                            self.result.client_cpu_ns += time_ns - issued_at;
                            self.result.client_cpu_ns += p.completion_ns;
                        } else {
                            self.result.client_cpu_ns += p.completion.get(Component::Interrupt);
                        }
                        th.cursor_ns += p.completion_ns;
                        self.queue
                            .push(time_ns + p.completion_ns + p.after_ns, HostEvent::Finish(t));
                        self.unlock_at(time_ns + p.completion_ns, t);
                    }
                    Path::Transport(p) if interface == Interface::Iscsi => {
                        if host == target_host {
                            self.return_after(time_ns, t, p.after_ns);
                            self.unlock_at(time_ns, t);
                        } else {
                            self.san
                                .send_message(time_ns, target_host, host, p.response_bytes, token)
                                .map_err(|e| e.to_string())?;
                        }
                    }
                    Path::Transport(p) => {
                        let back = self.fc_wire(time_ns, t, target_host, host, p.response_bytes);
                        self.return_after(back, t, p.after_ns);
                        self.unlock_at(back, t);
                    }
                }
                Ok(())
            }
        }
    }

    fn finish(&mut self, now: Ns, t: u32) -> Result<(), String> {
        let th = &mut self.threads[t as usize];
        // The return software was labelled at the start; it ran last.
        let latency = now - th.start_ns;
        if th.parts.total_ns() != latency {
            return Err(format!(
                "request of thread {t}: parts sum to {} ns, latency {latency} ns",
                th.parts.total_ns()
            ));
        }
        self.result.latency.record(latency);
        self.result.breakdown.record(&th.parts);
        self.result.ops += 1;
        self.result.bytes += th.bytes;
        self.result.elapsed_ns = self.result.elapsed_ns.max(now);
        th.path = None;
        self.queue.push(now, HostEvent::Start(t));
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// The §5.4 experiments as tables of rows (the CLI prints them).

/// What every experiment shares.
#[derive(Debug, Clone)]
pub struct Setup {
    /// The QuickSAN SSD preset (with its network parameters).
    pub device: Config,
    pub costs: InterfaceCosts,
    pub seed: u64,
    /// Requests per measured point (all threads together).
    pub ops: u64,
    /// Closed-loop threads per host for the bandwidth-type experiments: 8,
    /// one per core of the paper's dual E5520 hosts (our choice: §5.4 does
    /// not say).
    pub threads_per_host: u32,
}

/// Called before each point: (points done, points in all, what is next).
pub type Progress<'p> = &'p mut dyn FnMut(usize, usize, &str);

impl Setup {
    pub(crate) fn san(&self, topology: Topology, mirroring: bool) -> SanConfig {
        SanConfig {
            device: self.device.clone(),
            topology,
            mirroring,
        }
    }

    fn run_point(
        &self,
        san: SanConfig,
        interface: Interface,
        source: RequestSource,
        threads_per_host: u32,
        active_hosts: Option<u16>,
    ) -> Result<RunResult, String> {
        run(&Experiment {
            san,
            costs: self.costs.clone(),
            interface,
            threads_per_host,
            source,
            limit: RunLimit::Ops(self.ops),
            seed: self.seed,
            active_hosts,
        })
    }
}

impl Setup {
    /// `threads_per_host` threads on every client host, random `mix`
    /// requests of `size_bytes` over the whole global space: the load of
    /// the bandwidth, scaling, replication and energy experiments.
    pub(crate) fn loaded(
        &self,
        san: SanConfig,
        interface: Interface,
        mix: OpMix,
        size_bytes: u64,
    ) -> Result<RunResult, String> {
        self.run_point(
            san,
            interface,
            RequestSource::Random {
                mix,
                size_bytes,
                locality: Locality::Any,
            },
            self.threads_per_host,
            None,
        )
    }
}

/// The topologies of §5.4.1 with `nodes` machines: distributed, one SSD per
/// node; centralized, `nodes` SSDs in one server and `nodes` clients.
pub fn topology(centralized: bool, nodes: u16) -> Result<Topology, String> {
    if nodes == 0 {
        return Err("--nodes must be at least 1".into());
    }
    Ok(if centralized {
        Topology::Centralized {
            ssds: nodes,
            clients: nodes,
        }
    } else {
        Topology::Distributed { nodes }
    })
}

pub fn topology_key(t: Topology) -> &'static str {
    match t {
        Topology::Distributed { .. } => "distributed",
        Topology::Centralized { .. } => "centralized",
    }
}

fn op_key(op: Op) -> &'static str {
    op.as_str()
}

pub fn mix_key(mix: OpMix) -> &'static str {
    match mix {
        OpMix::Read => "read",
        OpMix::Write => "write",
        OpMix::Mixed(_) => "mixed",
    }
}

/// Mean µs per request grouped as the rows of Table 5.1.
#[derive(Debug, Clone, Serialize)]
pub struct Table51Rows {
    /// OS entry/exit, block layer, or Moneta-D's library.
    pub os_entry_exit_block_io_us: f64,
    /// GFS2.
    pub file_system_us: f64,
    /// Everything between the block interface and the media: driver,
    /// completion, transport software, network, device (not the array).
    pub block_transport_us: f64,
    /// The memory array itself (excluded from Table 5.1).
    pub media_us: f64,
    /// Table 5.1's block transport for this interface and operation (a
    /// remote 4 KB access), beside ours.
    pub paper_block_transport_us: f64,
}

fn table_5_1_rows(b: &Breakdown, interface: Interface, op: Op) -> Table51Rows {
    use Component as K;
    let us = |cs: &[Component]| cs.iter().map(|&c| b.mean_ns(c)).sum::<f64>() / 1e3;
    let os = us(&[
        K::SyscallEntry,
        K::Return,
        K::BlockLayer,
        K::Library,
        K::PermissionMiss,
    ]);
    let fs = us(&[K::FileSystem]);
    let media = us(&[K::Array]);
    let paper = match (interface, op) {
        (Interface::Iscsi, Op::Read) => 284.0,
        (Interface::Iscsi, Op::Write) => 207.7,
        (Interface::FibreChannel, Op::Read) => 86.0,
        (Interface::FibreChannel, Op::Write) => 85.9,
        (_, Op::Read) => 17.0,
        (_, Op::Write) => 16.9,
    };
    Table51Rows {
        os_entry_exit_block_io_us: os,
        file_system_us: fs,
        block_transport_us: b.total_mean_ns() / 1e3 - os - fs - media,
        media_us: media,
        paper_block_transport_us: paper,
    }
}

/// One row of `moneta san sim latency` (§5.4.2, Table 5.2's layout).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    pub interface: Interface,
    pub topology: &'static str,
    pub locality: &'static str,
    pub op: &'static str,
    pub size_bytes: u64,
    pub latency_us_mean: f64,
    pub latency_us_p99: f64,
    /// Mean µs per component; sums to the mean latency.
    pub breakdown_us: Breakdown,
    pub table_5_1: Table51Rows,
}

/// One thread issuing serially (§5.4.2), for every interface × {local,
/// remote} × {read, write}, distributed over `nodes` (centralized: remote
/// only).
pub fn latency(
    setup: &Setup,
    interfaces: &[Interface],
    topology: Topology,
    size_bytes: u64,
    progress: Progress,
) -> Result<Vec<LatencyRow>, String> {
    latency_of(setup, interfaces, topology, false, size_bytes, progress)
}

/// [`latency`] with every slice mirrored or not (`moneta san bench` on a
/// mirrored SAN predicts its writes with the replica's copy).
pub fn latency_of(
    setup: &Setup,
    interfaces: &[Interface],
    topology: Topology,
    mirroring: bool,
    size_bytes: u64,
    progress: Progress,
) -> Result<Vec<LatencyRow>, String> {
    let localities: &[Locality] = match topology {
        Topology::Distributed { nodes: 1 } => &[Locality::Local],
        Topology::Distributed { .. } => &[Locality::Local, Locality::Remote],
        Topology::Centralized { .. } => &[Locality::Remote],
    };
    let mut points = Vec::new();
    for &i in interfaces {
        for &l in localities {
            for op in [Op::Read, Op::Write] {
                points.push((i, l, op));
            }
        }
    }
    let mut rows = Vec::new();
    for (k, &(interface, locality, op)) in points.iter().enumerate() {
        progress(
            k,
            points.len(),
            &format!("{} {} {}", interface.key(), locality.key(), op_key(op)),
        );
        let mix = if op == Op::Read {
            OpMix::Read
        } else {
            OpMix::Write
        };
        let r = setup.run_point(
            setup.san(topology, mirroring),
            interface,
            RequestSource::Random {
                mix,
                size_bytes,
                locality,
            },
            1,
            Some(1),
        )?;
        rows.push(LatencyRow {
            interface,
            topology: topology_key(topology),
            locality: locality.key(),
            op: op_key(op),
            size_bytes,
            latency_us_mean: r.latency.mean_ns() / 1e3,
            latency_us_p99: r.latency.percentile_ns(0.99) / 1e3,
            table_5_1: table_5_1_rows(&r.breakdown, interface, op),
            breakdown_us: r.breakdown,
        });
    }
    progress(points.len(), points.len(), "done");
    Ok(rows)
}

/// One row of `moneta san sim bandwidth` (§5.4.3, Figure 5.5).
#[derive(Debug, Clone, Serialize)]
pub struct BandwidthRow {
    pub interface: Interface,
    pub topology: &'static str,
    pub nodes: u16,
    pub mirroring: bool,
    pub op: &'static str,
    pub size_bytes: u64,
    pub threads_per_host: u32,
    /// Mean per-host bandwidth, 10^6 B/s.
    pub mb_per_s_per_host: f64,
    pub latency_us_mean: f64,
    /// Mean µs the requests waited for an iSCSI target's CPU.
    pub target_wait_us_mean: f64,
}

/// The per-host bandwidth of `rows`' row for one interface, op and size
/// (the calibration checks and the orderings read the same rows).
pub fn mb_per_s_per_host(rows: &[BandwidthRow], i: Interface, op: &str, size: u64) -> f64 {
    rows.iter()
        .find(|r| r.interface == i && r.op == op && r.size_bytes == size)
        .expect("a row per interface, op and size")
        .mb_per_s_per_host
}

fn bandwidth_row(
    r: &RunResult,
    interface: Interface,
    topology: Topology,
    mirroring: bool,
    mix: OpMix,
    size_bytes: u64,
    threads_per_host: u32,
) -> BandwidthRow {
    BandwidthRow {
        interface,
        topology: topology_key(topology),
        nodes: r.active_hosts,
        mirroring,
        op: mix_key(mix),
        size_bytes,
        threads_per_host,
        mb_per_s_per_host: r.mb_per_s_per_host(),
        latency_us_mean: r.latency.mean_ns() / 1e3,
        target_wait_us_mean: r.breakdown.mean_ns(Component::TargetWait) / 1e3,
    }
}

/// Random requests over the whole global space from every client host.
pub fn bandwidth(
    setup: &Setup,
    interfaces: &[Interface],
    topology: Topology,
    mirroring: bool,
    mixes: &[OpMix],
    sizes: &[u64],
    progress: Progress,
) -> Result<Vec<BandwidthRow>, String> {
    let mut points = Vec::new();
    for &i in interfaces {
        for &m in mixes {
            for &s in sizes {
                points.push((i, m, s));
            }
        }
    }
    let mut rows = Vec::new();
    for (k, &(interface, mix, size_bytes)) in points.iter().enumerate() {
        progress(
            k,
            points.len(),
            &format!("{} {} {size_bytes} B", interface.key(), mix_key(mix)),
        );
        let r = setup.loaded(setup.san(topology, mirroring), interface, mix, size_bytes)?;
        rows.push(bandwidth_row(
            &r,
            interface,
            topology,
            mirroring,
            mix,
            size_bytes,
            setup.threads_per_host,
        ));
    }
    progress(points.len(), points.len(), "done");
    Ok(rows)
}

/// One row of `moneta san sim scaling` (§5.4.4, Figure 5.6).
#[derive(Debug, Clone, Serialize)]
pub struct ScalingRow {
    pub interface: Interface,
    pub nodes: u16,
    pub op: &'static str,
    pub size_bytes: u64,
    pub capacity_bytes_per_node: u64,
    /// Aggregate 10^6 B/s served by each requester's own SSD, by the
    /// network (other SSDs), and both.
    pub local_mb_per_s: f64,
    pub network_mb_per_s: f64,
    pub total_mb_per_s: f64,
}

/// 16 GB per node, as §5.4.4.
pub const SCALING_BYTES_PER_NODE: u64 = 16 << 30;

/// 4 KB random requests on 1…16 distributed nodes with 16 GB each.
pub fn scaling(
    setup: &Setup,
    interface: Interface,
    node_counts: &[u16],
    mix: OpMix,
    size_bytes: u64,
    progress: Progress,
) -> Result<Vec<ScalingRow>, String> {
    let mut small = setup.clone();
    small.device.device.capacity_bytes = SCALING_BYTES_PER_NODE;
    let mut rows = Vec::new();
    for (k, &nodes) in node_counts.iter().enumerate() {
        progress(k, node_counts.len(), &format!("{nodes} nodes"));
        let t = topology(false, nodes)?;
        // The same requests per node at every size of the cluster.
        let mut per_node = small.clone();
        per_node.ops = setup.ops * nodes as u64;
        let r = per_node.loaded(small.san(t, false), interface, mix, size_bytes)?;
        rows.push(ScalingRow {
            interface,
            nodes,
            op: mix_key(mix),
            size_bytes,
            capacity_bytes_per_node: SCALING_BYTES_PER_NODE,
            local_mb_per_s: r.mb_per_s(r.local_bytes),
            network_mb_per_s: r.mb_per_s(r.remote_bytes),
            total_mb_per_s: r.mb_per_s(r.bytes),
        });
    }
    progress(node_counts.len(), node_counts.len(), "done");
    Ok(rows)
}

/// One row of `moneta san sim replication` (§5.4.5, Figure 5.7).
#[derive(Debug, Clone, Serialize)]
pub struct ReplicationRow {
    pub interface: Interface,
    pub mirroring: bool,
    pub op: &'static str,
    pub size_bytes: u64,
    /// One thread, random addresses over the global space.
    pub latency_us_mean: f64,
    /// `threads_per_host` threads on every node.
    pub mb_per_s_per_host: f64,
}

/// Latency and bandwidth with and without mirroring, distributed.
pub fn replication(
    setup: &Setup,
    interfaces: &[Interface],
    nodes: u16,
    mixes: &[OpMix],
    size_bytes: u64,
    progress: Progress,
) -> Result<Vec<ReplicationRow>, String> {
    let t = topology(false, nodes)?;
    let mut points = Vec::new();
    for &i in interfaces {
        for &m in mixes {
            for mirroring in [false, true] {
                points.push((i, m, mirroring));
            }
        }
    }
    let mut rows = Vec::new();
    for (k, &(interface, mix, mirroring)) in points.iter().enumerate() {
        progress(
            k,
            points.len(),
            &format!(
                "{} {} mirroring {}",
                interface.key(),
                mix_key(mix),
                if mirroring { "on" } else { "off" }
            ),
        );
        let source = RequestSource::Random {
            mix,
            size_bytes,
            locality: Locality::Any,
        };
        let one = setup.run_point(setup.san(t, mirroring), interface, source, 1, Some(1))?;
        let all = setup.loaded(setup.san(t, mirroring), interface, mix, size_bytes)?;
        rows.push(ReplicationRow {
            interface,
            mirroring,
            op: mix_key(mix),
            size_bytes,
            latency_us_mean: one.latency.mean_ns() / 1e3,
            mb_per_s_per_host: all.mb_per_s_per_host(),
        });
    }
    progress(points.len(), points.len(), "done");
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(ops: u64) -> Setup {
        Setup {
            device: Config::preset("quicksan-ssd").unwrap(),
            costs: InterfaceCosts::default(),
            seed: 3,
            ops,
            threads_per_host: 4,
        }
    }

    fn random(mix: OpMix, size_bytes: u64, locality: Locality) -> RequestSource {
        RequestSource::Random {
            mix,
            size_bytes,
            locality,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-6 * b.abs().max(1.0)
    }

    /// A mirrored SAN's writes wait for the replica; its reads do not
    /// (`moneta san bench` printed the unmirrored prediction, issue 22).
    #[test]
    fn mirrored_latency_predicts_the_replicas_write() {
        let s = setup(300);
        let topology = Topology::Distributed { nodes: 3 };
        let run = |mirroring| {
            latency_of(
                &s,
                &[Interface::QuicksanD],
                topology,
                mirroring,
                4096,
                &mut |_, _, _| {},
            )
            .unwrap()
        };
        let (plain, mirrored) = (run(false), run(true));
        let mean = |rows: &[LatencyRow], locality: &str, op: &str| {
            rows.iter()
                .find(|r| r.locality == locality && r.op == op)
                .unwrap()
                .latency_us_mean
        };
        assert!(mean(&mirrored, "local", "write") > mean(&plain, "local", "write") * 1.5);
        assert!(close(
            mean(&mirrored, "local", "read"),
            mean(&plain, "local", "read")
        ));
    }

    /// Every request's parts sum to its latency (checked per request by the
    /// run, an error otherwise); here also the means, for every interface,
    /// both topologies, reads, writes and mixed, one thread and loaded.
    #[test]
    fn parts_sum_to_the_latency_for_every_interface() {
        let s = setup(600);
        for interface in Interface::ALL {
            for centralized in [false, true] {
                let t = topology(centralized, 3).unwrap();
                for (mix, threads) in [(OpMix::Read, 1), (OpMix::Write, 1), (OpMix::Mixed(0.5), 4)]
                {
                    let r = s
                        .run_point(
                            s.san(t, false),
                            interface,
                            random(mix, 4096, Locality::Any),
                            threads,
                            None,
                        )
                        .unwrap();
                    let what = format!("{interface:?} {t:?} {mix:?}");
                    assert_eq!(r.ops, 600, "{what}");
                    assert!(
                        close(r.breakdown.total_mean_ns(), r.latency.mean_ns()),
                        "{what}"
                    );
                    assert_eq!(r.local_bytes + r.remote_bytes, r.bytes, "{what}");
                }
            }
        }
    }

    #[test]
    fn local_requests_stay_off_the_network_and_remote_ones_pay_it() {
        let s = setup(200);
        let t = topology(false, 4).unwrap();
        for interface in [
            Interface::QuicksanD,
            Interface::QuicksanOs,
            Interface::Iscsi,
        ] {
            let run = |l| {
                s.run_point(
                    s.san(t, false),
                    interface,
                    random(OpMix::Read, 4096, l),
                    1,
                    Some(1),
                )
                .unwrap()
            };
            let (local, remote) = (run(Locality::Local), run(Locality::Remote));
            assert_eq!(local.remote_bytes, 0, "{interface:?}");
            assert_eq!(remote.local_bytes, 0, "{interface:?}");
            assert_eq!(local.breakdown.mean_ns(Component::Network), 0.0);
            assert!(remote.breakdown.mean_ns(Component::Network) > 0.0);
            assert!(remote.latency.mean_ns() > local.latency.mean_ns());
        }
    }

    #[test]
    fn the_iscsi_target_cpu_queues_under_load() {
        let s = setup(800);
        let t = topology(true, 4).unwrap();
        let wait = |threads, cores| {
            let mut s = s.clone();
            s.costs.iscsi_target_cores = cores;
            let r = s
                .run_point(
                    s.san(t, false),
                    Interface::Iscsi,
                    random(OpMix::Read, 4096, Locality::Any),
                    threads,
                    None,
                )
                .unwrap();
            (r.breakdown.mean_ns(Component::TargetWait), r)
        };
        let (one, _) = wait(1, 1);
        let (four, _) = wait(4, 1);
        let (eight, r8) = wait(8, 1);
        assert!(one < four && four < eight, "{one} {four} {eight}");
        // The one target core is the bottleneck: close to fully busy.
        assert!(r8.target_cpu_ns as f64 > 0.9 * r8.elapsed_ns as f64);
        // More target cores, less waiting.
        let (eight_on_four, _) = wait(8, 4);
        assert!(eight_on_four < eight);
        // More clients of the one target, one thread each: more waiting.
        let clients = |n| {
            let t = topology(true, n).unwrap();
            s.run_point(
                s.san(t, false),
                Interface::Iscsi,
                random(OpMix::Write, 4096, Locality::Any),
                1,
                None,
            )
            .unwrap()
            .breakdown
            .mean_ns(Component::TargetWait)
        };
        let (c1, c2, c4) = (clients(1), clients(2), clients(4));
        assert!(c1 == 0.0 && c1 < c2 && c2 < c4, "{c1} {c2} {c4}");
    }

    #[test]
    fn shared_host_cores_make_client_and_target_software_queue_for_a_core() {
        // Distributed, 4 nodes: each node's clients and (iSCSI) its target
        // share the node's cores when `san.host_cores_shared`.
        let run = |interface, shared: bool, cores: u32, threads| {
            let mut s = setup(1_600);
            s.costs.host_cores_shared = shared;
            s.device.host.cores = cores;
            let t = topology(false, 4).unwrap();
            let r = s
                .run_point(
                    s.san(t, false),
                    interface,
                    random(OpMix::Read, 4096, Locality::Any),
                    threads,
                    None,
                )
                .unwrap();
            (r.breakdown.mean_ns(Component::CoreWait), r)
        };
        let rate = |r: &RunResult| r.ops as f64 / r.elapsed_ns as f64;
        let (off, r_off) = run(Interface::Iscsi, false, 1, 8);
        assert_eq!(off, 0.0, "own cores: nobody waits for one");
        let (one, r_one) = run(Interface::Iscsi, true, 1, 8);
        let (eight, _) = run(Interface::Iscsi, true, 8, 8);
        assert!(one > 0.0 && eight < one, "{one} {eight}");
        // One shared core per node: fewer requests per second than with
        // the target's and the clients' software on cores of their own.
        assert!(rate(&r_one) < rate(&r_off));
        // QuickSAN-D threads keep their own cores: no pool.
        let (d, _) = run(Interface::QuicksanD, true, 1, 4);
        assert_eq!(d, 0.0);
    }

    #[test]
    fn same_seed_same_numbers_other_seed_other_numbers() {
        let s = setup(500);
        let t = topology(false, 4).unwrap();
        for interface in Interface::ALL {
            let run = |seed| {
                let mut s = s.clone();
                s.seed = seed;
                s.run_point(
                    s.san(t, false),
                    interface,
                    random(OpMix::Mixed(0.5), 4096, Locality::Any),
                    4,
                    None,
                )
                .unwrap()
            };
            let (a, b, c) = (run(1), run(1), run(2));
            assert_eq!(a.elapsed_ns, b.elapsed_ns, "{interface:?}");
            assert_eq!(a.breakdown, b.breakdown, "{interface:?}");
            assert_ne!(a.elapsed_ns, c.elapsed_ns, "{interface:?}");
        }
    }

    #[test]
    fn bad_input_is_an_error() {
        let s = setup(10);
        let central = topology(true, 2).unwrap();
        let point = |t, threads, active, source| {
            s.run_point(
                s.san(t, false),
                Interface::QuicksanD,
                source,
                threads,
                active,
            )
        };
        let any = random(OpMix::Read, 4096, Locality::Any);
        assert!(topology(false, 0).is_err());
        assert!(point(central, 0, None, any.clone()).is_err());
        assert!(point(central, 1, Some(0), any.clone()).is_err());
        assert!(point(central, 1, Some(3), any.clone()).is_err());
        let e = point(central, 1, None, random(OpMix::Read, 4096, Locality::Local)).unwrap_err();
        assert!(e.contains("no SSD of its own"), "{e}");
        let one = topology(false, 1).unwrap();
        assert!(point(one, 1, None, random(OpMix::Read, 4096, Locality::Remote)).is_err());
        assert!(point(central, 1, None, random(OpMix::Read, 0, Locality::Any)).is_err());
        let script = RequestSource::Script(vec![VecDeque::new()]);
        assert!(point(central, 1, None, script).is_err());
    }

    #[test]
    fn scaling_counts_local_and_network_bytes_and_grows_the_network_share() {
        let s = setup(300);
        let rows = scaling(
            &s,
            Interface::QuicksanD,
            &[1, 4],
            OpMix::Mixed(0.5),
            4096,
            &mut |_, _, _| {},
        )
        .unwrap();
        assert_eq!(rows[0].network_mb_per_s, 0.0, "one node: all local");
        assert!(rows[1].network_mb_per_s > rows[1].local_mb_per_s);
        for r in &rows {
            assert!(close(
                r.local_mb_per_s + r.network_mb_per_s,
                r.total_mb_per_s
            ));
        }
    }
}
