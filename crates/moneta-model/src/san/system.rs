//! The SAN as one simulated system (SPEC §4.1–4.3): hosts, the QuickSAN
//! devices in their PCIe slots, the Ethernet fabric between the devices'
//! ports (and between the hosts' own NICs, for iSCSI's TCP traffic), the
//! global address map (the "configuration utility") and mirroring, all on
//! one event queue and one virtual clock.
//!
//! This is the boundary the host interfaces (QuickSAN-D, QuickSAN-OS,
//! iSCSI, Fibre Channel) drive: they turn an application request into host
//! software time and calls here; the SAN returns when the device (and the
//! network behind it) finished, with the device-side breakdown.
//!
//! Devices are numbered (their `DeviceId` is also their index in every
//! device's MAC table): distributed, device i is host i's SSD; centralized,
//! devices 0..k are the server's SSDs (host 0) and then one NIC per client
//! host. The switch has one port per device and one per host NIC.
//!
//! Everything runs on one [`EventQueue`] (ties broken by insertion order),
//! so the same seed and the same calls give the same events. A call at a
//! time later than pending events first runs the model up to it (their
//! `SanEvent`s wait for the next `deliver_due`); a call in the model's past
//! is taken at the model's current time.

use super::address_map::AddressMap;
use super::error::SanError;
use super::fabric::{Switch, SwitchAction, SwitchFrame};
use super::ids::{DeviceId, HostId};
use crate::breakdown::{Component, DeviceParts};
use crate::config::{Config, FabricTiming, NetworkConfig};
use crate::device::network::{NetworkPort, Packet, PortOutput, Started, Transmitter};
use crate::device::packet::MAX_NODES;
use crate::device::pipeline::{Device, DeviceEvent, DeviceRequest};
use crate::kernel::EventQueue;
use crate::units::{DeviceAddr, Ns, Op, PhysTag};
use std::collections::VecDeque;

/// What a device is (SPEC §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Moneta-D array plus network port: serves its host and remote peers.
    Ssd,
    /// The same device without memory: forwards every request.
    Nic,
}

/// How hosts and devices are arranged (SPEC §4.1, §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Host 0 is a server holding `ssds` SSDs (one shared block device);
    /// hosts 1..=`clients` each hold a QuickSAN NIC.
    Centralized { ssds: u16, clients: u16 },
    /// `nodes` hosts, each holding one SSD; together one global space.
    Distributed { nodes: u16 },
}

/// Everything that defines a SAN.
#[derive(Debug, Clone)]
pub struct SanConfig {
    /// The device preset every SSD uses (`quicksan-ssd`), with its network
    /// parameters; NICs use the same minus the memory (`quicksan-nic`).
    pub device: Config,
    pub topology: Topology,
    /// Half of each SSD mirrors another SSD's primary half (SPEC §4.3).
    pub mirroring: bool,
}

/// A block request as a host interface hands it to its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SanRequest {
    /// Opaque; returned in the completion.
    pub token: u64,
    pub op: Op,
    /// Global address ([`San::submit`]) or device-local ([`San::submit_local`]).
    pub addr: u64,
    pub len_bytes: u64,
    /// Source-side permission check time (QuickSAN-D), 0 otherwise.
    pub protection_ns: Ns,
}

/// What the SAN reports as time passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanEvent {
    /// A request submitted through `device` finished (for a mirrored write:
    /// both copies). `parts` sum exactly to `time_ns` minus the submit time.
    Completed {
        device: DeviceId,
        token: u64,
        time_ns: Ns,
        parts: DeviceParts,
        /// Bytes served by the submitting device's own memory and by peers.
        local_bytes: u64,
        remote_bytes: u64,
    },
    /// A host-to-host message ([`San::send_message`]) arrived whole.
    Message {
        from: HostId,
        to: HostId,
        token: u64,
        time_ns: Ns,
    },
}

/// Counters over the whole run, for reports and the energy model.
#[derive(Debug, Clone, Default)]
pub struct SanCounters {
    pub requests_completed: u64,
    pub local_bytes: u64,
    pub remote_bytes: u64,
    /// Bytes on the wire (headers, framing, payload) over all links.
    pub wire_bytes: u64,
    pub packets: u64,
    /// 802.3x pause requests sent by ports and switch inputs (each later
    /// cancelled by a zero-time pause frame; both frames are in
    /// `wire_bytes`), and the largest receive-buffer occupancy any port
    /// reached.
    pub pauses: u64,
    pub max_rx_buffer_bytes: u64,
}

/// The SAN. API contract (the host interfaces rely on it):
///
/// - `submit` takes any number of requests per device: beyond the device's
///   tags they wait in FIFO order (that wait is `DeviceQueue` time).
/// - Events come out of `deliver_due` in time order; same seed, same calls,
///   same events.
pub struct San {
    devices: Vec<SanDevice>,
    hosts: Vec<Vec<DeviceId>>,
    map: AddressMap,
    switch: Switch,
    timing: FabricTiming,
    network: NetworkConfig,
    host_nics: Vec<Transmitter<u32>>,
    queue: EventQueue<Ev>,
    frames: Vec<Option<Frame>>,
    free_frames: Vec<u32>,
    actions: Vec<SwitchAction>,
    /// SAN events produced while running the model inside a call other than
    /// `deliver_due`; delivered first by the next `deliver_due`.
    ready: VecDeque<SanEvent>,
    model_time_ns: Ns,
    requests_completed: u64,
    local_bytes: u64,
    remote_bytes: u64,
    pause_frames: u64,
    message_frames: u64,
}

struct SanDevice {
    device: Device,
    host: HostId,
    kind: DeviceKind,
    free_tags: Vec<u8>,
    in_flight: Vec<TagUse>,
    waiting: VecDeque<Waiting>,
}

#[derive(Debug, Clone, Copy, Default)]
struct TagUse {
    token: u64,
    submitted_ns: Ns,
    device_submitted_ns: Ns,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    request: SanRequest,
    submitted_ns: Ns,
    global: bool,
}

/// Something on the fabric: a QuickSAN packet, or a frame of a host message.
#[derive(Debug, Clone, Copy)]
enum Frame {
    Packet(Packet),
    Message {
        from: HostId,
        to: HostId,
        token: u64,
        frame_bytes: u64,
        last: bool,
    },
}

/// The SAN's events: the devices' own, and the fabric's.
#[derive(Debug, Clone, Copy)]
enum Ev {
    Device(u16, DeviceEvent),
    /// A frame has been switched and joins its output queue.
    Switched(u32),
    SwitchTxDone(u16),
    /// The device (or host NIC) behind switch port `port` pauses that link.
    SwitchOutputPause {
        port: u16,
        paused: bool,
    },
    /// The switch pauses the transmitter of the device or host NIC at `port`.
    SenderPause {
        port: u16,
        paused: bool,
    },
    /// A payload packet has arrived whole at its device's port.
    PortArrive(u32),
    /// A packet is in the receive packet buffer, ready to be processed.
    RxReady(u32),
    HostTxDone(u16),
    HostArrive(u32),
}

impl San {
    pub fn new(config: &SanConfig, seed: u64) -> Result<San, SanError> {
        let device_config = &config.device;
        device_config
            .validate()
            .map_err(|e| SanError::BadConfig(e.to_string()))?;
        if !device_config.network.has_memory {
            return Err(SanError::BadConfig(format!(
                "SanConfig.device must be an SSD preset (network.has_memory = true), not '{}'",
                device_config.name
            )));
        }
        let d = &device_config.device;
        if d.transfer_buffers < 2 {
            return Err(SanError::BadConfig(
                "device.transfer_buffers must be at least 2 in a SAN: remote reads may hold all but one"
                    .into(),
            ));
        }
        if d.buffer_bytes > crate::device::packet::MAX_PAYLOAD_BYTES {
            return Err(SanError::BadConfig(format!(
                "device.buffer_bytes {} exceeds the {}-byte payload a packet carries",
                d.buffer_bytes,
                crate::device::packet::MAX_PAYLOAD_BYTES
            )));
        }
        let (ssds, nics, host_count) = match config.topology {
            Topology::Centralized { ssds, clients } => (ssds, clients, 1 + clients as u32),
            Topology::Distributed { nodes } => (nodes, 0, nodes as u32),
        };
        let device_count = ssds as u32 + nics as u32;
        if ssds == 0 {
            return Err(SanError::BadConfig("a SAN needs at least one SSD".into()));
        }
        if device_count + host_count > u32::from(MAX_NODES) {
            return Err(SanError::BadConfig(format!(
                "{device_count} devices and {host_count} hosts exceed the {MAX_NODES}-entry MAC table"
            )));
        }
        let ssd_ids: Vec<u16> = (0..ssds).collect();
        let map = AddressMap::new(
            &ssd_ids,
            device_config.device.capacity_bytes,
            config.mirroring,
        )?;
        let timing = FabricTiming::derive(&device_config.network)
            .map_err(|e| SanError::BadConfig(e.to_string()))?;
        let mut nic_config = device_config.clone();
        nic_config.network.has_memory = false;
        let mut hosts = vec![Vec::new(); host_count as usize];
        let tags = device_config.device.tags;
        let devices = (0..device_count as u16)
            .map(|id| {
                let (kind, host, c) = match config.topology {
                    Topology::Distributed { .. } => (DeviceKind::Ssd, id, device_config),
                    Topology::Centralized { ssds, .. } if id < ssds => {
                        (DeviceKind::Ssd, 0, device_config)
                    }
                    Topology::Centralized { ssds, .. } => {
                        (DeviceKind::Nic, 1 + id - ssds, &nic_config)
                    }
                };
                hosts[host as usize].push(DeviceId(id));
                let port = NetworkPort::new(
                    &c.network,
                    map.route_table(id, kind == DeviceKind::Ssd),
                    timing.nic_tx_ns,
                );
                let device_seed = seed ^ (0x5A4E_u64 << 48 | u64::from(id) << 16);
                SanDevice {
                    device: Device::with_port(c, device_seed, port),
                    host: HostId(host),
                    kind,
                    free_tags: (0..tags).rev().map(|t| t as u8).collect(),
                    in_flight: vec![TagUse::default(); tags as usize],
                    waiting: VecDeque::new(),
                }
            })
            .collect();
        let n = &device_config.network;
        Ok(San {
            devices,
            hosts,
            map,
            switch: Switch::new(n, timing, (device_count + host_count) as u16),
            timing,
            network: n.clone(),
            host_nics: (0..host_count)
                .map(|_| Transmitter::new(n.link_bits_per_s))
                .collect(),
            queue: EventQueue::new(),
            frames: Vec::new(),
            free_frames: Vec::new(),
            actions: Vec::new(),
            ready: VecDeque::new(),
            model_time_ns: 0,
            requests_completed: 0,
            local_bytes: 0,
            remote_bytes: 0,
            pause_frames: 0,
            message_frames: 0,
        })
    }

    pub fn hosts(&self) -> u16 {
        self.hosts.len() as u16
    }

    /// The devices in `host`'s PCIe slots (none for a host that does not exist).
    pub fn devices_of(&self, host: HostId) -> &[DeviceId] {
        self.hosts
            .get(host.0 as usize)
            .map_or(&[], |d| d.as_slice())
    }

    /// Every device, in id order.
    pub fn devices(&self) -> impl Iterator<Item = DeviceId> + '_ {
        (0..self.devices.len() as u16).map(DeviceId)
    }

    /// Panics on a device that does not exist (ids come from `devices_of`).
    pub fn kind(&self, device: DeviceId) -> DeviceKind {
        self.devices[device.0 as usize].kind
    }

    /// Panics on a device that does not exist (ids come from `devices_of`).
    pub fn host_of(&self, device: DeviceId) -> HostId {
        self.devices[device.0 as usize].host
    }

    /// Size of the global address space (primary data; half the raw
    /// capacity when mirrored).
    pub fn capacity_bytes(&self) -> u64 {
        self.map.capacity_bytes()
    }

    /// The SSD holding the primary copy of global address `addr`, and the
    /// device-local address there. `addr` must be below `capacity_bytes`.
    pub fn primary(&self, addr: u64) -> (DeviceId, u64) {
        let (node, local) = self.map.primary(addr);
        (DeviceId(node), local)
    }

    /// The SSD holding the mirror copy of `addr`, when mirrored.
    pub fn replica(&self, addr: u64) -> Option<(DeviceId, u64)> {
        self.map.replica(addr).map(|(n, a)| (DeviceId(n), a))
    }

    /// The fabric's fixed latencies, derived from the published numbers.
    pub fn fabric_timing(&self) -> FabricTiming {
        self.timing
    }

    /// Submit through `device` (QuickSAN-D or QuickSAN-OS): global address,
    /// routed by the device (local memory or peers over the network).
    pub fn submit(
        &mut self,
        now: Ns,
        device: DeviceId,
        request: SanRequest,
    ) -> Result<(), SanError> {
        self.check(device, &request, self.map.capacity_bytes())?;
        self.enqueue(now, device, request, true);
        Ok(())
    }

    /// Submit to `device`'s own memory with a device-local address, the
    /// network port unused: the SSD as a plain block device (iSCSI and
    /// Fibre Channel targets).
    pub fn submit_local(
        &mut self,
        now: Ns,
        device: DeviceId,
        request: SanRequest,
    ) -> Result<(), SanError> {
        let d = self
            .devices
            .get(device.0 as usize)
            .ok_or(SanError::NoSuchDevice(device))?;
        if d.kind != DeviceKind::Ssd {
            return Err(SanError::NotAnSsd(device));
        }
        self.check(device, &request, d.device.capacity_bytes())?;
        self.enqueue(now, device, request, false);
        Ok(())
    }

    fn check(&self, device: DeviceId, r: &SanRequest, capacity_bytes: u64) -> Result<(), SanError> {
        if device.0 as usize >= self.devices.len() {
            return Err(SanError::NoSuchDevice(device));
        }
        if r.len_bytes == 0 {
            return Err(SanError::ZeroLength);
        }
        if r.addr
            .checked_add(r.len_bytes)
            .is_none_or(|end| end > capacity_bytes)
        {
            return Err(SanError::OutOfRange {
                addr: r.addr,
                len_bytes: r.len_bytes,
                capacity_bytes,
            });
        }
        Ok(())
    }

    fn enqueue(&mut self, now: Ns, device: DeviceId, request: SanRequest, global: bool) {
        let now = self.catch_up(now);
        let d = &mut self.devices[device.0 as usize];
        d.waiting.push_back(Waiting {
            request,
            submitted_ns: now,
            global,
        });
        self.start_waiting(now, device.0);
    }

    /// Give free tags to waiting requests, in FIFO order.
    fn start_waiting(&mut self, now: Ns, device: u16) {
        let d = &mut self.devices[device as usize];
        while !d.waiting.is_empty() {
            let Some(tag) = d.free_tags.pop() else { break };
            let w = d.waiting.pop_front().expect("checked non-empty");
            d.in_flight[tag as usize] = TagUse {
                token: w.request.token,
                submitted_ns: w.submitted_ns,
                device_submitted_ns: now,
            };
            let request = DeviceRequest {
                token: w.request.token,
                op: w.request.op,
                addr: DeviceAddr(w.request.addr),
                len_bytes: w.request.len_bytes,
                barrier: false,
                protection_ns: w.request.protection_ns,
            };
            let result = if w.global {
                d.device.submit_global(now, PhysTag(tag), request)
            } else {
                d.device.submit(now, PhysTag(tag), request)
            };
            result.expect("the SAN checked the request and owns the tags");
        }
        self.collect(now, device);
    }

    /// A message of `bytes` payload from `from`'s own Ethernet NIC to
    /// `to`'s (iSCSI's TCP traffic), over the same kind of links and switch.
    pub fn send_message(
        &mut self,
        now: Ns,
        from: HostId,
        to: HostId,
        bytes: u64,
        token: u64,
    ) -> Result<(), SanError> {
        for h in [from, to] {
            if h.0 as usize >= self.hosts.len() {
                return Err(SanError::NoSuchHost(h));
            }
        }
        let now = self.catch_up(now);
        if from == to {
            // Loopback: never on the wire.
            self.ready.push_back(SanEvent::Message {
                from,
                to,
                token,
                time_ns: now,
            });
            return Ok(());
        }
        let mtu = self.network.message_mtu_bytes;
        let frames = bytes.div_ceil(mtu).max(1);
        for i in 0..frames {
            let payload = (bytes - i * mtu).min(mtu);
            let frame_bytes = self.network.message_header_bytes + payload;
            let id = self.new_frame(Frame::Message {
                from,
                to,
                token,
                frame_bytes,
                last: i + 1 == frames,
            });
            if let Some(started) = self.host_nics[from.0 as usize].push(now, id, frame_bytes) {
                self.host_frame_started(from.0, started);
            }
        }
        self.message_frames += frames;
        Ok(())
    }

    pub fn next_event_time(&self) -> Option<Ns> {
        if !self.ready.is_empty() {
            return Some(self.model_time_ns);
        }
        self.queue.peek_time()
    }

    /// Deliver everything due at or before `now`, in time order. Returns
    /// the number of model events run.
    pub fn deliver_due(&mut self, now: Ns, mut on_event: impl FnMut(SanEvent)) -> u64 {
        let mut delivered = 0;
        loop {
            while let Some(e) = self.ready.pop_front() {
                on_event(e);
            }
            if self.queue.peek_time().is_none_or(|t| t > now) {
                break;
            }
            let (t, event) = self.queue.pop().expect("peeked");
            self.run(t, event);
            delivered += 1;
        }
        delivered
    }

    /// Run the model's events before `now` (their SAN events wait in
    /// `ready`); returns the time a call at `now` takes effect.
    fn catch_up(&mut self, now: Ns) -> Ns {
        while self.queue.peek_time().is_some_and(|t| t < now) {
            let (t, event) = self.queue.pop().expect("peeked");
            self.run(t, event);
        }
        now.max(self.model_time_ns)
    }

    pub fn counters(&self, now: Ns) -> SanCounters {
        let _ = now;
        let ports = self.devices.iter().filter_map(|d| d.device.port());
        let mut wire_bytes = self.switch.wire_bytes()
            + self.host_nics.iter().map(|t| t.wire_bytes()).sum::<u64>()
            + self.pause_frames
                * crate::device::packet::wire_bytes(crate::device::packet::HEADER_BYTES);
        let mut packets = 0;
        let mut pauses = self.switch.pauses();
        let mut max_rx = 0;
        for p in ports {
            wire_bytes += p.tx.wire_bytes();
            packets += p.tx.frames();
            pauses += p.rx.gauge.pauses();
            max_rx = max_rx.max(p.rx.gauge.max_occupancy_bytes());
        }
        SanCounters {
            requests_completed: self.requests_completed,
            local_bytes: self.local_bytes,
            remote_bytes: self.remote_bytes,
            wire_bytes,
            packets: packets + self.message_frames,
            pauses,
            max_rx_buffer_bytes: max_rx,
        }
    }

    /// One device's component counters (DMA, ring, controllers, buffers,
    /// peers served), for the energy model.
    pub fn device_counters(
        &self,
        device: DeviceId,
        now: Ns,
    ) -> Result<crate::device::pipeline::DeviceCounters, SanError> {
        self.devices
            .get(device.0 as usize)
            .map(|d| d.device.counters(now))
            .ok_or(SanError::NoSuchDevice(device))
    }

    /// Largest occupancy any switch input buffer reached.
    pub fn max_switch_buffer_bytes(&self) -> u64 {
        self.switch.max_ingress_bytes()
    }

    /// Packets the devices dropped as malformed or stale (0 in a healthy run).
    pub fn dropped_packets(&self) -> u64 {
        self.devices
            .iter()
            .filter_map(|d| d.device.port())
            .map(|p| p.dropped_packets)
            .sum()
    }

    fn new_frame(&mut self, frame: Frame) -> u32 {
        match self.free_frames.pop() {
            Some(id) => {
                self.frames[id as usize] = Some(frame);
                id
            }
            None => {
                self.frames.push(Some(frame));
                (self.frames.len() - 1) as u32
            }
        }
    }

    fn take_frame(&mut self, id: u32) -> Frame {
        self.free_frames.push(id);
        self.frames[id as usize].take().expect("a live frame")
    }

    /// Switch port of a host's NIC.
    fn host_port(&self, host: HostId) -> u16 {
        (self.devices.len() + host.0 as usize) as u16
    }

    fn run(&mut self, t: Ns, event: Ev) {
        debug_assert!(t >= self.model_time_ns, "events run in time order");
        self.model_time_ns = t;
        match event {
            Ev::Device(d, e) => {
                self.devices[d as usize].device.handle(t, e);
                self.collect(t, d);
            }
            Ev::Switched(id) => {
                let (in_port, out_port, frame_bytes) = match self.frames[id as usize] {
                    Some(Frame::Packet(ref mut p)) => {
                        p.chain.spend(Component::Network, t);
                        (p.from_node, p.to_node, p.header.frame_bytes())
                    }
                    Some(Frame::Message {
                        from,
                        to,
                        frame_bytes,
                        ..
                    }) => (self.host_port(from), self.host_port(to), frame_bytes),
                    None => unreachable!("switched frame {id} is live"),
                };
                let frame = SwitchFrame {
                    id,
                    in_port,
                    stored_bytes: frame_bytes,
                };
                let mut actions = std::mem::take(&mut self.actions);
                self.switch
                    .forward(t, frame, frame_bytes, out_port, &mut actions);
                self.switch_actions(&mut actions);
                self.actions = actions;
            }
            Ev::SwitchTxDone(port) => {
                let mut actions = std::mem::take(&mut self.actions);
                self.switch.tx_done(t, port, &mut actions);
                self.switch_actions(&mut actions);
                self.actions = actions;
            }
            Ev::SwitchOutputPause { port, paused } => {
                self.pause_frames += 1;
                let mut actions = std::mem::take(&mut self.actions);
                self.switch.set_paused(t, port, paused, &mut actions);
                self.switch_actions(&mut actions);
                self.actions = actions;
            }
            Ev::SenderPause { port, paused } => {
                self.pause_frames += 1;
                if (port as usize) < self.devices.len() {
                    self.devices[port as usize].device.port_pause(t, paused);
                    self.collect(t, port);
                } else {
                    let host = port - self.devices.len() as u16;
                    if let Some(started) = self.host_nics[host as usize].set_paused(t, paused) {
                        self.host_frame_started(host, started);
                    }
                }
            }
            Ev::PortArrive(id) => {
                let packet = packet_of(&mut self.frames, id);
                let (d, header) = (packet.to_node, packet.header);
                self.devices[d as usize].device.port_fill(t, &header);
                self.collect(t, d);
            }
            Ev::RxReady(id) => {
                let Frame::Packet(packet) = self.take_frame(id) else {
                    unreachable!("a device packet")
                };
                let d = packet.to_node;
                self.devices[d as usize].device.receive(t, packet);
                self.collect(t, d);
            }
            Ev::HostTxDone(host) => {
                let (_, next) = self.host_nics[host as usize].done(t);
                if let Some(started) = next {
                    self.host_frame_started(host, started);
                }
            }
            Ev::HostArrive(id) => {
                let Frame::Message {
                    from,
                    to,
                    token,
                    last,
                    ..
                } = self.take_frame(id)
                else {
                    unreachable!("a host message frame")
                };
                if last {
                    self.ready.push_back(SanEvent::Message {
                        from,
                        to,
                        token,
                        time_ns: t,
                    });
                }
            }
        }
    }

    fn host_frame_started(&mut self, host: u16, started: Started<u32>) {
        self.queue.push(started.free_ns, Ev::HostTxDone(host));
        self.queue.push(
            started.sent_ns + self.timing.nic_tx_ns + self.timing.switch_ns,
            Ev::Switched(started.item),
        );
    }

    fn switch_actions(&mut self, actions: &mut Vec<SwitchAction>) {
        for action in actions.drain(..) {
            match action {
                SwitchAction::Started { port, started } => {
                    self.queue.push(started.free_ns, Ev::SwitchTxDone(port));
                    let arrive =
                        started.sent_ns + self.timing.extra_hops_ns + self.timing.nic_rx_ns;
                    let id = started.item.id;
                    if (port as usize) < self.devices.len() {
                        let packet = packet_of(&mut self.frames, id);
                        packet.chain.spend(Component::NetworkWait, started.start_ns);
                        packet.chain.spend(Component::Network, arrive);
                        let device = &mut self.devices[port as usize].device;
                        let ready = device.port_expect(arrive, packet);
                        // Only a payload packet takes buffer space when it
                        // arrives; a small one is simply ready later.
                        if packet.header.kind.has_payload() {
                            self.queue.push(arrive, Ev::PortArrive(id));
                        }
                        self.queue.push(ready, Ev::RxReady(id));
                    } else {
                        self.queue.push(arrive, Ev::HostArrive(id));
                    }
                }
                SwitchAction::Pause {
                    port,
                    at_ns,
                    paused,
                } => self.queue.push(at_ns, Ev::SenderPause { port, paused }),
            }
        }
    }

    /// Move what device `d` produced into the SAN: its events, its port's
    /// frames and pause requests, its completions.
    fn collect(&mut self, now: Ns, d: u16) {
        let dev = &mut self.devices[d as usize];
        for (t, e) in dev.device.outbox.drain(..) {
            self.queue.push(t, Ev::Device(d, e));
        }
        if dev.device.port_out.is_empty() && dev.device.completions.is_empty() {
            return;
        }
        let mut port_out = std::mem::take(&mut dev.device.port_out);
        for (t, out) in port_out.drain(..) {
            match out {
                PortOutput::Packet(packet) => {
                    let id = self.new_frame(Frame::Packet(packet));
                    self.queue.push(t + self.timing.switch_ns, Ev::Switched(id));
                }
                PortOutput::Pause(paused) => self.queue.push(
                    t + self.timing.pause_delay_ns,
                    Ev::SwitchOutputPause { port: d, paused },
                ),
            }
        }
        let dev = &mut self.devices[d as usize];
        dev.device.port_out = port_out;
        if dev.device.completions.is_empty() {
            return;
        }
        let mut freed = false;
        for c in dev.device.completions.drain(..) {
            let tag = c.tag.0;
            let used = dev.in_flight[tag as usize];
            dev.free_tags.push(tag);
            freed = true;
            let mut parts = c.parts;
            parts.add(
                Component::DeviceQueue,
                used.device_submitted_ns - used.submitted_ns,
            );
            debug_assert_eq!(parts.total_ns(), c.time_ns - used.submitted_ns);
            self.requests_completed += 1;
            self.local_bytes += c.local_bytes;
            self.remote_bytes += c.remote_bytes;
            self.ready.push_back(SanEvent::Completed {
                device: DeviceId(d),
                token: used.token,
                time_ns: c.time_ns,
                parts,
                local_bytes: c.local_bytes,
                remote_bytes: c.remote_bytes,
            });
        }
        if freed {
            self.start_waiting(now, d);
        }
    }
}

/// The device packet in frame `id`.
fn packet_of(frames: &mut [Option<Frame>], id: u32) -> &mut Packet {
    match frames[id as usize].as_mut() {
        Some(Frame::Packet(p)) => p,
        _ => unreachable!("frame {id} is a device packet"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn san(topology: Topology, mirroring: bool, seed: u64) -> San {
        let config = SanConfig {
            device: Config::preset("quicksan-ssd").unwrap(),
            topology,
            mirroring,
        };
        San::new(&config, seed).unwrap()
    }

    fn request(token: u64, op: Op, addr: u64, len_bytes: u64) -> SanRequest {
        SanRequest {
            token,
            op,
            addr,
            len_bytes,
            protection_ns: 0,
        }
    }

    /// Run until idle; every event, in order.
    fn drain(s: &mut San) -> Vec<SanEvent> {
        let mut events = Vec::new();
        while let Some(t) = s.next_event_time() {
            s.deliver_due(t, |e| events.push(e));
        }
        events
    }

    fn print_parts(label: &str, parts: &DeviceParts) {
        let mut line = format!("{label}:");
        for c in Component::ALL {
            if c.is_device() && parts.get(c) > 0 {
                line += &format!(" {}={}", c.key(), parts.get(c));
            }
        }
        eprintln!("{line} total={}", parts.total_ns());
    }

    #[test]
    fn a_lone_remote_4kb_request_decomposes_exactly() {
        for op in [Op::Read, Op::Write] {
            let mut s = san(Topology::Distributed { nodes: 2 }, false, 1);
            let remote = s.capacity_bytes() / 2 + (1 << 20);
            assert_eq!(s.primary(remote).0, DeviceId(1));
            s.submit(1000, DeviceId(0), request(7, op, remote, 4096))
                .unwrap();
            let mut local = san(Topology::Distributed { nodes: 2 }, false, 1);
            local
                .submit(1000, DeviceId(0), request(8, op, 1 << 20, 4096))
                .unwrap();
            let events = drain(&mut s);
            let local_events = drain(&mut local);
            let [SanEvent::Completed {
                token: 7,
                time_ns,
                parts,
                local_bytes: 0,
                remote_bytes: 4096,
                ..
            }] = events[..]
            else {
                panic!("{events:?}")
            };
            assert_eq!(parts.total_ns(), time_ns - 1000);
            print_parts(&format!("remote 4 KB {}", op.as_str()), &parts);
            let SanEvent::Completed {
                time_ns: local_ns,
                parts: local_parts,
                ..
            } = local_events[0]
            else {
                panic!()
            };
            print_parts(&format!("local 4 KB {}", op.as_str()), &local_parts);
            // The network adds two one-way trips (≥ 2 µs) and the packet
            // buffer's store of the 4 KB payload (516 cycles of 8 ns from its
            // first word: 816 ns after its last bit).
            let tail = crate::config::packet_buffer_tail_ns(&s.network, 4128);
            assert_eq!(tail, 816);
            let added = time_ns - local_ns;
            eprintln!("network adds {added} ns");
            assert!(added >= 2000 + tail, "{added}");
            assert!(parts.get(Component::Network) >= 2 * (1000 - 8 - 64));
            assert!(parts.get(Component::PacketBuffer) >= tail);
            assert_eq!(s.counters(time_ns).packets, 2);
            assert_eq!(s.dropped_packets(), 0);
        }
    }

    /// Random 4 KB-ish requests from every device to every other, many
    /// outstanding per device (beyond its tags).
    fn all_to_all(s: &mut San, per_device: u64, seed: u64) -> Vec<SanEvent> {
        let mut rng = crate::kernel::Rng::new(seed);
        let devices: Vec<DeviceId> = s.devices().collect();
        let capacity = s.capacity_bytes();
        let mut token = 0;
        for round in 0..per_device {
            for &d in &devices {
                let op = if rng.below(2) == 0 {
                    Op::Read
                } else {
                    Op::Write
                };
                let len = [512, 4096, 8192, 16384][rng.below(4) as usize];
                let addr = rng.below(capacity - len) / 512 * 512;
                s.submit(round * 10, d, request(token, op, addr, len))
                    .unwrap();
                token += 1;
            }
        }
        drain(s)
    }

    #[test]
    fn saturated_all_to_all_completes_with_bounded_buffers_and_pauses() {
        let mut c = Config::preset("quicksan-ssd").unwrap();
        // The smallest receive buffer the validation accepts with A.6's
        // pause level: room above it for two largest packets (one on the
        // wire, one started before the pause arrives) and what is in flight.
        let smallest = c.network.pause_on_bytes + c.network.pause_headroom_bytes().unwrap();
        eprintln!("smallest receive buffer {smallest} bytes");
        assert!(c
            .set(&format!("network.rx_buffer_bytes={}", smallest - 8))
            .is_err());
        c.set(&format!("network.rx_buffer_bytes={smallest}"))
            .unwrap();
        // Switch inputs as small, at the same pause level.
        c.network.switch_port_buffer_bytes = smallest;
        c.validate().unwrap();
        let config = SanConfig {
            device: c.clone(),
            topology: Topology::Distributed { nodes: 16 },
            mirroring: false,
        };
        let mut s = San::new(&config, 11).unwrap();
        let per_device = 300;
        let events = all_to_all(&mut s, per_device, 0x5a7);
        let done = events
            .iter()
            .filter(|e| matches!(e, SanEvent::Completed { .. }))
            .count() as u64;
        assert_eq!(
            done,
            16 * per_device,
            "every request completes (no deadlock)"
        );
        let counters = s.counters(0);
        eprintln!(
            "{counters:?} max switch buffer {}",
            s.max_switch_buffer_bytes()
        );
        assert!(counters.max_rx_buffer_bytes <= c.network.rx_buffer_bytes);
        assert!(counters.max_rx_buffer_bytes >= c.network.pause_on_bytes);
        assert!(s.max_switch_buffer_bytes() <= c.network.switch_port_buffer_bytes);
        assert!(counters.pauses > 0, "saturation engages 802.3x pause");
        assert_eq!(s.dropped_packets(), 0);
        // Every pause was released: the run ended with nothing held.
        for d in &s.devices {
            let p = d.device.port().unwrap();
            assert_eq!(p.rx.gauge.occupancy_bytes(), 0);
            assert!(!p.tx.is_paused());
        }
    }

    #[test]
    fn same_seed_same_events() {
        let run = |seed| {
            let mut s = san(Topology::Distributed { nodes: 4 }, true, seed);
            let events = all_to_all(&mut s, 50, 3);
            // Mirrored, saturated: everything completes too.
            assert_eq!(events.len(), 4 * 50);
            format!("{events:?}")
        };
        assert_eq!(run(5), run(5));
    }

    #[test]
    fn one_way_minimum_of_a_small_packet_is_the_published_microsecond() {
        // A lone remote 4 KB read: the request is header-only (the minimum
        // packet), the completion carries 4 KB. Their network and packet
        // buffer times, on an idle fabric, follow the derivation.
        let mut s = san(Topology::Distributed { nodes: 2 }, false, 1);
        let t = s.fabric_timing();
        let remote = s.capacity_bytes() / 2;
        s.submit(0, DeviceId(0), request(1, Op::Read, remote, 4096))
            .unwrap();
        let [SanEvent::Completed { parts, .. }] = drain(&mut s)[..] else {
            panic!()
        };
        let link: Transmitter<()> = Transmitter::new(10e9);
        let data_frame_ns = link.arrival_ns(32 + 4096);
        let completion_network = t.nic_tx_ns + 2 * data_frame_ns + t.switch_ns + t.nic_rx_ns;
        let request_network = parts.get(Component::Network) - completion_network;
        let tail = crate::config::packet_buffer_tail_ns(&s.network, 4128);
        let request_packet_buffer = parts.get(Component::PacketBuffer) - tail - 1024;
        eprintln!(
            "small packet one way: network {request_network} ns + packet buffer {request_packet_buffer} ns"
        );
        assert_eq!(request_network + request_packet_buffer, 1000);
        assert_eq!(request_packet_buffer, t.min_packet_buffer_ns);
        assert_eq!(parts.get(Component::NetworkWait), 0);
    }

    #[test]
    fn mirrored_writes_go_to_both_copies_and_reads_prefer_a_local_replica() {
        let mut s = san(Topology::Distributed { nodes: 4 }, true, 2);
        let slice = s.capacity_bytes() / 4;
        assert_eq!(s.capacity_bytes(), 4 * (64 << 30) / 2);
        // Slice 0: primary on device 0, replica on device 1.
        let addr = 4096 * 3;
        assert_eq!(s.primary(addr), (DeviceId(0), addr));
        assert_eq!(s.replica(addr), Some((DeviceId(1), slice + addr)));
        let completed = |s: &mut San, device, op| {
            s.submit(0, DeviceId(device), request(0, op, addr, 4096))
                .unwrap();
            match drain(s)[..] {
                [SanEvent::Completed {
                    local_bytes,
                    remote_bytes,
                    time_ns,
                    ..
                }] => (local_bytes, remote_bytes, time_ns),
                ref e => panic!("{e:?}"),
            }
        };
        // From the primary: one local copy, one remote; done when both are.
        assert_eq!(completed(&mut s, 0, Op::Write).0, 4096);
        assert_eq!(completed(&mut s, 0, Op::Write).1, 4096);
        // From a third node: both copies remote.
        assert_eq!(completed(&mut s, 2, Op::Write).1, 2 * 4096);
        // The replica's node reads its own copy; others go remote.
        assert_eq!(completed(&mut s, 1, Op::Read).0, 4096);
        assert_eq!(completed(&mut s, 3, Op::Read).1, 4096);
        // Reads from a node without a copy alternate between the replicas.
        let before: Vec<u64> = s
            .devices
            .iter()
            .map(|d| d.device.counters(0).peer_requests_served)
            .collect();
        completed(&mut s, 3, Op::Read);
        completed(&mut s, 3, Op::Read);
        let served: Vec<u64> = s
            .devices
            .iter()
            .zip(before)
            .map(|(d, b)| d.device.counters(0).peer_requests_served - b)
            .collect();
        assert_eq!(served, vec![1, 1, 0, 0]);
    }

    #[test]
    fn centralized_clients_reach_the_servers_ssds_through_their_nics() {
        let mut s = san(
            Topology::Centralized {
                ssds: 4,
                clients: 4,
            },
            false,
            3,
        );
        assert_eq!(s.hosts(), 5);
        assert_eq!(s.devices_of(HostId(0)).len(), 4);
        let nic = s.devices_of(HostId(2))[0];
        assert_eq!(s.kind(nic), DeviceKind::Nic);
        assert_eq!(s.host_of(nic), HostId(2));
        assert_eq!(s.capacity_bytes(), 4 * (64 << 30));
        assert_eq!(
            s.submit_local(0, nic, request(0, Op::Read, 0, 512)),
            Err(SanError::NotAnSsd(nic))
        );
        // 80 requests through one NIC: beyond its 64 tags they wait, FIFO.
        for i in 0..80 {
            let addr = (i % 4) * (64 << 30) + i * 8192;
            s.submit(0, nic, request(i, Op::Write, addr, 4096)).unwrap();
        }
        let events = drain(&mut s);
        assert_eq!(events.len(), 80);
        for e in &events {
            let SanEvent::Completed {
                token,
                parts,
                time_ns,
                local_bytes,
                ..
            } = *e
            else {
                panic!()
            };
            assert_eq!(local_bytes, 0, "a NIC has no memory");
            assert_eq!(parts.total_ns(), time_ns);
            if token >= 64 {
                assert!(parts.get(Component::DeviceQueue) > 0);
            }
        }
        // The server's SSD as a plain block device: no network.
        let ssd = s.devices_of(HostId(0))[0];
        let packets = s.counters(0).packets;
        s.submit_local(0, ssd, request(9, Op::Read, 0, 4096))
            .unwrap();
        let [SanEvent::Completed {
            remote_bytes: 0, ..
        }] = drain(&mut s)[..]
        else {
            panic!()
        };
        assert_eq!(s.counters(0).packets, packets);
    }

    #[test]
    fn host_messages_cross_the_fabric_whole() {
        let mut s = san(Topology::Distributed { nodes: 3 }, false, 4);
        s.send_message(0, HostId(0), HostId(2), 9000, 77).unwrap();
        s.send_message(0, HostId(1), HostId(2), 0, 78).unwrap();
        let events = drain(&mut s);
        let times: Vec<(u64, Ns)> = events
            .iter()
            .map(|e| match *e {
                SanEvent::Message {
                    token,
                    time_ns,
                    to: HostId(2),
                    ..
                } => (token, time_ns),
                _ => panic!("{e:?}"),
            })
            .collect();
        // The empty message is one minimum frame: the published one-way
        // minimum minus the packet buffer a host NIC does not have.
        let t = s.fabric_timing();
        assert_eq!(times[0], (78, 1000 - t.min_packet_buffer_ns));
        // 9000 bytes: six 1500-byte frames, pipelined.
        assert_eq!(times[1].0, 77);
        assert!(times[1].1 > 6 * 1500 * 8 / 10, "{times:?}");
        assert_eq!(s.counters(0).packets, 7);
    }

    #[test]
    fn bad_calls_are_errors() {
        let mut s = san(Topology::Distributed { nodes: 2 }, false, 5);
        let cap = s.capacity_bytes();
        assert_eq!(
            s.submit(0, DeviceId(2), request(0, Op::Read, 0, 512)),
            Err(SanError::NoSuchDevice(DeviceId(2)))
        );
        assert_eq!(
            s.submit(0, DeviceId(0), request(0, Op::Read, 0, 0)),
            Err(SanError::ZeroLength)
        );
        assert!(matches!(
            s.submit(0, DeviceId(0), request(0, Op::Read, cap - 256, 512)),
            Err(SanError::OutOfRange { .. })
        ));
        assert!(matches!(
            s.submit(0, DeviceId(0), request(0, Op::Read, u64::MAX, 2)),
            Err(SanError::OutOfRange { .. })
        ));
        assert!(matches!(
            s.submit_local(0, DeviceId(1), request(0, Op::Read, cap / 2, 512)),
            Err(SanError::OutOfRange { .. })
        ));
        assert_eq!(
            s.send_message(0, HostId(0), HostId(5), 1, 0),
            Err(SanError::NoSuchHost(HostId(5)))
        );
        assert!(s.devices_of(HostId(9)).is_empty());
        let bad = |topology, mirroring, preset: &str| {
            San::new(
                &SanConfig {
                    device: Config::preset(preset).unwrap(),
                    topology,
                    mirroring,
                },
                1,
            )
            .err()
        };
        assert!(matches!(
            bad(Topology::Distributed { nodes: 0 }, false, "quicksan-ssd"),
            Some(SanError::BadConfig(_))
        ));
        assert!(matches!(
            bad(Topology::Distributed { nodes: 1 }, true, "quicksan-ssd"),
            Some(SanError::BadConfig(_))
        ));
        assert!(matches!(
            bad(Topology::Distributed { nodes: 2 }, false, "quicksan-nic"),
            Some(SanError::BadConfig(_))
        ));
        for (key, value) in [("transfer_buffers", 1), ("buffer_bytes", 16384)] {
            let mut c = Config::preset("quicksan-ssd").unwrap();
            c.set(&format!("device.{key}={value}")).unwrap();
            let config = SanConfig {
                device: c,
                topology: Topology::Distributed { nodes: 2 },
                mirroring: false,
            };
            assert!(
                matches!(San::new(&config, 1), Err(SanError::BadConfig(ref m)) if m.contains(key)),
                "{key}"
            );
        }
        // Nothing was submitted by the refused calls.
        assert!(drain(&mut s).is_empty());
    }

    #[test]
    fn garbage_packets_are_dropped_not_panics() {
        use crate::device::network::Chain;
        use crate::device::packet::{Mac, PacketHeader, PacketKind};
        let mut s = san(Topology::Distributed { nodes: 2 }, false, 6);
        let mut rng = crate::kernel::Rng::new(0xBAD);
        for i in 0..2000u32 {
            // Every 10 µs, or later if the last one's drain ran past that:
            // the system's events run in time order.
            let at = (u64::from(i) * 10_000).max(s.model_time_ns);
            let kinds = [
                PacketKind::ReadRequest,
                PacketKind::WriteRequest,
                PacketKind::ReadCompletion,
                PacketKind::WriteCompletion,
            ];
            let header = PacketHeader {
                kind: kinds[rng.below(4) as usize],
                dest: Mac::of_node(0),
                src: Mac::of_node(1),
                src_index: 1,
                // Half in the device's memory, half anywhere.
                addr: if rng.below(2) == 0 {
                    rng.below(64 << 30)
                } else {
                    rng.next_u64()
                },
                ctrl: 0,
                cmd: 0,
                offsets: rng.below(70) as u16,
                tag: rng.below(70) as u16,
                size: rng.below(8193) as u16,
            };
            let mut packet = Packet {
                header,
                from_node: 1,
                to_node: 0,
                chain: Chain::starting(at),
                release_buffer: None,
            };
            let device = &mut s.devices[0].device;
            let ready = device.port_arrive(at, &mut packet);
            device.receive(ready, packet);
            s.collect(ready, 0);
            drain(&mut s);
        }
        let dropped = s.devices[0].device.port().unwrap().dropped_packets;
        let served = s.devices[0].device.counters(0).peer_requests_served;
        eprintln!("of 2000 random packets: {dropped} dropped, {served} served");
        // Peers are trusted, so requests in range are served; the rest,
        // and completions no segment waits for, are dropped (and the
        // sender drops the completions of requests it never sent).
        assert_eq!(dropped + served, 2000);
        assert!(dropped > 1000 && served > 100);
        assert_eq!(s.dropped_packets(), 2000);
        // The device still works.
        s.submit(
            30_000_000,
            DeviceId(0),
            request(5, Op::Write, s.capacity_bytes() / 2, 4096),
        )
        .unwrap();
        assert!(matches!(
            drain(&mut s)[..],
            [SanEvent::Completed { token: 5, .. }, ..]
        ));
    }
}
