//! The device: the request pipeline of SPEC §1.4 wired together.
//!
//! A command enters through the registers, passes retag and protection (a
//! fixed pipeline time plus the permission-tree walk that `driver` times),
//! waits behind barriers if any, and joins the request queues. The scheduler
//! gives each free transfer buffer to the next segment the queue policy picks:
//!
//! - write segment: DMA host → buffer; scoreboard check that the target
//!   controller's in-queue has room; ring → controller (the buffer is free
//!   once the data has left); the segment is done when the controller
//!   acknowledges (durable, or early for Onyx).
//! - read segment: command to the controller; memory access; ring →
//!   buffer; DMA buffer → host; buffer free; segment done.
//!
//! QuickSAN (SPEC §4.1–4.2, Appendix A.6; `Device::with_port`): the network
//! port (`network.rs`) stands beside the DMA engine and the ring. A request
//! submitted with a global address is routed segment by segment
//! (LOCALREQUESTMASK/TAG, then the MAC table); a segment whose memory is on
//! a peer uses the port instead of the ring and the controllers:
//!
//! - remote write: DMA host → buffer; a write-request packet carries the
//!   data (the buffer is free once the frame is on the wire); the segment
//!   is done when the peer's write completion arrives.
//! - remote read: the buffer is allocated *before* the read request leaves;
//!   the read completion's payload moves from the receive packet buffer
//!   into it, then DMA to the host.
//! - at the peer, a read request joins the request queues' network lane
//!   (no payload) and is read like a local segment, its data going back in
//!   a read completion; a write request waits in the receive packet buffer
//!   for a transfer buffer, the network "DMA" moves its data in, then ring
//!   → controller, then a write completion goes back. Peers are trusted: no
//!   permission check, only the memory's bounds (a malformed packet is
//!   dropped and counted, never a panic).
//! - a mirrored write issues every segment twice, once per copy (SPEC §4.3).
//!
//! Deadlock avoidance (SPEC §4.2): small packets (requests without payload,
//! completions) always have room; a remote read's buffer is taken before
//! it is sent; one transfer buffer is dedicated to incoming writes (which
//! are served first, as their data holds receive-buffer space); and, this
//! model's addition for the same rule, a device's outgoing remote reads may
//! hold all shared buffers but one, and peers' reads are served before the
//! host's queues, so a peer's read always finds a buffer even when every
//! device waits on its own remote reads.
//!
//! A request completes when all its segments are done; its completion
//! carries where its device time went (`breakdown`): the fixed pipeline and
//! protection time, then the chain of the segment that finished last (the
//! critical path): queue and buffer wait, DMA, ring, controller queue,
//! array, and for a remote segment the network, packet buffer and the
//! peer's own components, carried along in the packets.
//!
//! The device is clock
//! agnostic: it is handed `now` and writes the events it wants delivered into
//! `outbox` and finished requests into `completions` (and, with a port, the
//! frames and pause requests for the fabric into `port_out`);
//! `driver::DeviceDriver` delivers them, for the simulator's event loop and
//! the emulator's polling thread alike; `san::system` for a SAN.

use super::buffers::{BufferPool, Segment, Striping};
use super::command::{self, CommandError, CommandFormat, CommandLimits};
use super::dma::Dma;
use super::memory::{ControllerActivity, MemoryTiming};
use super::moneta_controller::MonetaController;
use super::network::{Chain, HeaderFields, NetworkPort, Packet, PortOutput, Started, Target};
use super::onyx_pcm::OnyxController;
use super::packet::{PacketHeader, PacketKind};
use super::queues::{BarrierGate, RequestQueues};
use super::ring::Ring;
use crate::breakdown::{Component, DeviceParts};
use crate::config::{Config, ControllerKind};
use crate::units::{DeviceAddr, Ns, Op, PhysTag};
use std::collections::VecDeque;
use std::fmt;

/// A request as the host stack hands it to the device (already decoded).
#[derive(Debug, Clone, Copy)]
pub struct DeviceRequest {
    /// Opaque to the device; returned in the completion.
    pub token: u64,
    pub op: Op,
    pub addr: DeviceAddr,
    pub len_bytes: u64,
    pub barrier: bool,
    /// Time of the protection check for this request (Moneta-D), 0 otherwise.
    pub protection_ns: Ns,
}

/// A finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    pub token: u64,
    pub tag: PhysTag,
    pub time_ns: Ns,
    /// The device's time from accepting the request to `time_ns`, by
    /// component, along the critical path (in virtual time the parts sum
    /// exactly to that interval).
    pub parts: DeviceParts,
    /// Bytes served by this device's own memory and by network peers
    /// (QuickSAN; a lone device serves everything locally).
    pub local_bytes: u64,
    pub remote_bytes: u64,
    /// A segment could not be served: its peer failed and no replica was up
    /// (QuickSAN on a real wire; never in the simulator).
    pub failed: bool,
    /// It failed because no up-to-date copy of a mirrored slice was
    /// reachable (issue 22: a copy that may have missed writes is never
    /// read; one in split brain is neither read nor written).
    pub refused: bool,
}

/// A mirrored write's copy that a failed peer missed (SPEC §4.3, degraded
/// mode): whoever drives the device records it for the resync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missed {
    pub node: u16,
    /// The global address and length of the copy.
    pub addr: u64,
    pub bytes: u64,
    /// This node's copy took it alone and the write was acknowledged;
    /// `false`: the write failed, and this node's copy may hold it while
    /// `node`'s does not (the driver settles which copy wins).
    pub alone: bool,
}

/// Where the payload of a packet leaving the port comes from (the
/// emulator attaches real bytes; the simulator carries none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PayloadSource {
    /// This device's memory at this device-local address (a read completion).
    Memory(u64),
    /// A host request's data (a remote write segment): the request's
    /// token and the segment's offset in it.
    Host { token: u64, offset: u64 },
}

/// The words a host wrote to the command registers (SPEC §1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandWords {
    /// Three PIO words: sector address, host DMA address, length/tag/command.
    Baseline([u64; 3]),
    /// One 64-bit word (Moneta+Atomic, Moneta-D).
    Atomic(u64),
}

/// Why the device refused a request. The device never panics on bad input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceError {
    /// The command words do not decode (SPEC §1.2).
    Command(CommandError),
    TagOutOfRange(u8),
    TagInFlight(u8),
    ZeroLength,
    OutOfRange {
        addr: u64,
        len_bytes: u64,
        capacity_bytes: u64,
    },
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Command(e) => write!(f, "bad command: {e}"),
            DeviceError::TagOutOfRange(t) => write!(f, "tag {t} is out of range"),
            DeviceError::TagInFlight(t) => write!(f, "tag {t} is already in flight"),
            DeviceError::ZeroLength => write!(f, "zero-length request"),
            DeviceError::OutOfRange {
                addr,
                len_bytes,
                capacity_bytes,
            } => {
                write!(
                    f,
                    "request [{addr}, +{len_bytes}) exceeds capacity {capacity_bytes}"
                )
            }
        }
    }
}

impl std::error::Error for DeviceError {}

/// Events the device schedules for itself. Segments are named by their
/// slot: the transfer buffer they hold, or (a remote write whose data has
/// left) a slot past the buffers; requests by their index (physical tags
/// first, then requests from network peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    Enqueue(PhysTag),
    WriteDmaDone(u16),
    WriteToRing(u16),
    BufferFree(u16),
    SegmentDone(u16),
    ReadDataReady(u16),
    ReadToHost(u16),
    ReadDmaDone(u16),
    /// The network port's frame on the wire has finished (QuickSAN).
    PortTxDone,
    /// A packet's payload has moved from the receive packet buffer into
    /// the segment's transfer buffer (QuickSAN).
    PacketDataIn(u16),
}

/// Who asked for a request.
#[derive(Debug, Clone, Copy)]
enum Origin {
    /// This device's host, under a physical tag.
    Host,
    /// A network peer: its request packet (for the reply) and the chain it
    /// carried (where the time went up to its arrival here).
    Peer { request: PacketHeader, from: u16 },
}

#[derive(Debug, Clone, Copy)]
struct RequestState {
    token: u64,
    op: Op,
    addr: u64,
    len_bytes: u64,
    barrier: bool,
    origin: Origin,
    /// The address is global: each segment is routed (QuickSAN's `submit`).
    routed: bool,
    /// 2 for a mirrored write (each segment issued to both copies).
    copies: u8,
    pass: u8,
    next_offset: u64,
    segments_total: u32,
    segments_done: u32,
    local_bytes: u64,
    remote_bytes: u64,
    failed: bool,
    /// Failed for want of an up-to-date copy (`Completion::refused`).
    refused: bool,
    /// Where time goes: accepted at `submitted_ns`, past retag and
    /// protection at `queued_ns`; the chain of the segment that finishes
    /// last so far and when it finishes. A peer's request starts with the
    /// chain its packet brought.
    submitted_ns: Ns,
    queued_ns: Ns,
    start_chain: Chain,
    critical_chain: DeviceParts,
    critical_done_ns: Ns,
}

/// A segment on its way through the device.
#[derive(Debug, Clone, Copy)]
struct SegmentState {
    request: u16,
    segment: Segment,
    target: Target,
    /// The transfer buffer it holds (a remote write's slot past the
    /// buffers keeps the number of the buffer its packet leaves from).
    buffer: u16,
    /// This segment's time so far by component.
    chain: Chain,
    /// A read's wait in the controller's queue before its access.
    controller_wait_ns: Ns,
    /// Bytes its packet holds in the receive packet buffer, if any.
    rx_stored_bytes: u64,
    /// Waiting for a peer's completion packet of this kind.
    awaiting: Option<PacketKind>,
    /// A mirrored write's copy sent to the other holder because its own
    /// holder failed: the packet says so (`CTRL_DEGRADED`), so that the
    /// holder records what its partner missed.
    degraded: bool,
    /// A read already sent to the other holder once after a refusal.
    retried: bool,
}

/// What becomes of a segment whose copy lives on a failed peer.
enum Detour {
    /// Write it to the other copy's holder instead (degraded).
    Elsewhere { node: u16, addr: u64 },
    /// Nothing more to send: the segment is done (degraded, with this
    /// device's own copy recorded as the only one) or failed.
    Done,
}

/// Table A.3's CTRL bit this model gives a degraded mirrored write: the
/// receiver holds the only live copy and records what its partner missed.
pub const CTRL_DEGRADED: u8 = 1;
/// This model's CTRL bit of a completion that refuses a request: the
/// holder's copy of the slice is not up to date, or in split brain (issue
/// 22). Sent as a write completion (no payload) for reads and writes alike.
pub const CTRL_REFUSED: u8 = 2;

/// Counters of the device's components, for reports and the power model.
#[derive(Debug, Clone, Default)]
pub struct DeviceCounters {
    pub requests_completed: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub dma_busy_ns_host_to_device: u64,
    pub dma_busy_ns_device_to_host: u64,
    pub ring_busy_ns: u64,
    pub scheduler_busy_ns: u64,
    pub buffer_busy_ns: u64,
    pub controllers: Vec<ControllerActivity>,
    /// Requests served for network peers (QuickSAN).
    pub peer_requests_served: u64,
}

pub struct Device {
    capacity_bytes: u64,
    tags: u32,
    pipeline_ns: Ns,
    striping: Striping,
    dma: Dma,
    ring: Ring,
    controllers: Vec<Box<dyn MemoryTiming>>,
    buffers: BufferPool,
    /// Transfer buffers only incoming network writes may take (SPEC §4.2:
    /// a dedicated buffer for incoming writes guarantees progress).
    reserved_buffers: usize,
    queues: RequestQueues<u16>,
    gate: BarrierGate,
    requests: Vec<Option<RequestState>>,
    free_peer_requests: Vec<u16>,
    segments: Vec<SegmentState>,
    free_remote_slots: Vec<u16>,
    /// Admitted (past the barrier gate) and not yet completed host requests.
    outstanding: u32,
    busy_since_ns: Ns,
    counters: DeviceCounters,
    admitted: Vec<PhysTag>,
    write_buffer_until_ack: bool,
    /// QuickSAN: the network port, and peers' write requests waiting for a
    /// transfer buffer (their data waits in the receive packet buffer).
    port: Option<NetworkPort>,
    incoming_writes: VecDeque<u16>,
    /// Peers' read requests: the request queue's lane for the network,
    /// served before the host's requests.
    incoming_reads: VecDeque<u16>,
    /// Buffers held by this device's remote reads (waiting on peers), and
    /// how many they may hold: all but one of the shared buffers, so a
    /// peer's read always finds one (no cycle of devices whose buffers all
    /// wait on each other).
    remote_reads_holding: usize,
    remote_read_buffer_limit: usize,
    /// Events to deliver back to `handle` at their time.
    pub outbox: Vec<(Ns, DeviceEvent)>,
    /// Requests finished since the driver last drained this.
    pub completions: Vec<Completion>,
    /// What the network port hands to the fabric (QuickSAN).
    pub port_out: Vec<(Ns, PortOutput)>,
    /// Mirrored copies a failed peer missed, since the driver last drained it.
    pub missed: Vec<Missed>,
}

impl Device {
    pub fn new(config: &Config, seed: u64) -> Self {
        let d = &config.device;
        let m = &config.memory;
        let controller_bytes = d.capacity_bytes / m.controllers as u64;
        let controllers: Vec<Box<dyn MemoryTiming>> = (0..m.controllers)
            .map(|i| -> Box<dyn MemoryTiming> {
                let controller_seed = seed ^ (0xC0_u64 << 32 | i as u64);
                match m.controller {
                    ControllerKind::Moneta => Box::new(MonetaController::new(
                        m,
                        &config.start_gap,
                        controller_bytes,
                        controller_seed,
                    )),
                    ControllerKind::OnyxPcm => Box::new(OnyxController::new(
                        &config.onyx,
                        &config.start_gap,
                        controller_bytes,
                        controller_seed,
                    )),
                }
            })
            .collect();
        let empty_segment = SegmentState {
            request: 0,
            segment: Segment {
                offset_bytes: 0,
                bytes: 0,
                controller: 0,
                local_addr: 0,
            },
            target: Target::Local(0),
            buffer: 0,
            chain: Chain::default(),
            controller_wait_ns: 0,
            rx_stored_bytes: 0,
            awaiting: None,
            degraded: false,
            retried: false,
        };
        Self {
            capacity_bytes: d.capacity_bytes,
            tags: d.tags,
            pipeline_ns: d.pipeline_ns,
            striping: Striping::new(m.stripe_bytes, m.controllers, d.buffer_bytes),
            dma: Dma::new(&config.link),
            ring: Ring::new(&config.ring, m.controllers + 1),
            controllers,
            buffers: BufferPool::new(d.transfer_buffers),
            reserved_buffers: 0,
            queues: RequestQueues::new(d.queue_policy, d.tags),
            gate: BarrierGate::new(d.tags),
            requests: vec![None; d.tags as usize],
            free_peer_requests: Vec::new(),
            segments: vec![empty_segment; d.transfer_buffers as usize],
            free_remote_slots: Vec::new(),
            outstanding: 0,
            busy_since_ns: 0,
            counters: DeviceCounters::default(),
            admitted: Vec::with_capacity(d.tags as usize),
            write_buffer_until_ack: d.write_buffer_until_ack,
            port: None,
            incoming_writes: VecDeque::new(),
            incoming_reads: VecDeque::new(),
            remote_reads_holding: 0,
            remote_read_buffer_limit: 0,
            outbox: Vec::with_capacity(64),
            completions: Vec::with_capacity(64),
            port_out: Vec::new(),
            missed: Vec::new(),
        }
    }

    /// A QuickSAN device: the array with its network port (SPEC §4.1). One
    /// more transfer buffer is dedicated to incoming network writes.
    pub fn with_port(config: &Config, seed: u64, port: NetworkPort) -> Self {
        let mut device = Self::new(config, seed);
        let buffers = config.device.transfer_buffers + 1;
        device.buffers = BufferPool::new(buffers);
        device.reserved_buffers = 1;
        device.remote_read_buffer_limit =
            (config.device.transfer_buffers as usize).saturating_sub(1);
        device.segments = vec![device.segments[0]; buffers as usize];
        device.port = Some(port);
        device
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    pub fn port(&self) -> Option<&NetworkPort> {
        self.port.as_ref()
    }

    /// The port's routing tables, for whoever drives a port on a real wire
    /// (which peers are synced, failed).
    pub fn routes_mut(&mut self) -> Option<&mut super::network::RouteTable> {
        self.port.as_mut().map(|p| &mut p.routes)
    }

    fn port_mut(&mut self) -> &mut NetworkPort {
        self.port.as_mut().expect("a QuickSAN device has a port")
    }

    /// Decode the command words the host wrote at `now_ns` and accept the
    /// request under the tag they carry.
    pub fn submit_command(
        &mut self,
        now_ns: Ns,
        words: CommandWords,
        token: u64,
        protection_ns: Ns,
    ) -> Result<PhysTag, DeviceError> {
        let command = match words {
            CommandWords::Baseline(w) => {
                let limits = CommandLimits::for_format(
                    CommandFormat::Baseline,
                    self.capacity_bytes,
                    self.tags,
                );
                command::decode_baseline(w, &limits)
            }
            CommandWords::Atomic(w) => {
                let limits = CommandLimits::for_format(
                    CommandFormat::Atomic,
                    self.capacity_bytes,
                    self.tags,
                );
                command::decode_atomic(w, &limits)
            }
        }
        .map_err(DeviceError::Command)?;
        let tag = PhysTag(command.tag);
        let request = DeviceRequest {
            token,
            op: command.op,
            addr: command.addr,
            len_bytes: command.len_bytes,
            barrier: command.barrier,
            protection_ns,
        };
        self.submit(now_ns, tag, request)?;
        Ok(tag)
    }

    /// Accept a decoded request at `now_ns` with physical tag `tag`.
    pub fn submit(
        &mut self,
        now_ns: Ns,
        tag: PhysTag,
        request: DeviceRequest,
    ) -> Result<(), DeviceError> {
        self.accept(now_ns, tag, request, self.capacity_bytes, false)
    }

    /// QuickSAN: accept a request whose address is global; each segment
    /// goes to this device's memory or over the port to the peer that owns
    /// it (both copies of a mirrored write).
    pub fn submit_global(
        &mut self,
        now_ns: Ns,
        tag: PhysTag,
        request: DeviceRequest,
    ) -> Result<(), DeviceError> {
        let global_bytes = self.port_mut().routes.global_bytes();
        self.accept(now_ns, tag, request, global_bytes, true)
    }

    fn accept(
        &mut self,
        now_ns: Ns,
        tag: PhysTag,
        request: DeviceRequest,
        capacity_bytes: u64,
        routed: bool,
    ) -> Result<(), DeviceError> {
        if tag.0 as u32 >= self.tags {
            return Err(DeviceError::TagOutOfRange(tag.0));
        }
        if self.requests[tag.0 as usize].is_some() {
            return Err(DeviceError::TagInFlight(tag.0));
        }
        if request.len_bytes == 0 {
            return Err(DeviceError::ZeroLength);
        }
        let end = request.addr.0.checked_add(request.len_bytes);
        if end.is_none_or(|e| e > capacity_bytes) {
            return Err(DeviceError::OutOfRange {
                addr: request.addr.0,
                len_bytes: request.len_bytes,
                capacity_bytes,
            });
        }
        let copies = match (routed, request.op) {
            (true, Op::Write) if self.port_mut().routes.mirrored() => 2,
            _ => 1,
        };
        let queued_ns = now_ns + self.pipeline_ns + request.protection_ns;
        self.requests[tag.0 as usize] = Some(RequestState {
            token: request.token,
            op: request.op,
            addr: request.addr.0,
            len_bytes: request.len_bytes,
            barrier: request.barrier,
            origin: Origin::Host,
            routed,
            copies,
            pass: 0,
            next_offset: 0,
            segments_total: self
                .striping
                .segment_count(request.addr.0, request.len_bytes)
                * copies as u32,
            segments_done: 0,
            local_bytes: 0,
            remote_bytes: 0,
            failed: false,
            refused: false,
            submitted_ns: now_ns,
            queued_ns,
            start_chain: Chain::starting(queued_ns),
            critical_chain: DeviceParts::default(),
            critical_done_ns: 0,
        });
        self.outbox.push((queued_ns, DeviceEvent::Enqueue(tag)));
        Ok(())
    }

    /// Deliver one of the device's own events at its time.
    pub fn handle(&mut self, now_ns: Ns, event: DeviceEvent) {
        match event {
            DeviceEvent::Enqueue(tag) => {
                let barrier = self.request(tag.0 as u16).barrier;
                if self.gate.arrive(tag, barrier, self.outstanding) {
                    self.admit(now_ns, tag);
                }
                self.schedule_segments(now_ns);
            }
            DeviceEvent::WriteDmaDone(slot) => {
                let s = self.segments[slot as usize].segment;
                let unloaded = self.dma.host_to_device.unloaded_ns(s.bytes);
                self.segments[slot as usize].chain.spend_transfer(
                    Component::DmaWait,
                    Component::Dma,
                    now_ns,
                    unloaded,
                );
                match self.segments[slot as usize].target {
                    Target::Local(_) => self.write_to_controller(now_ns, slot),
                    Target::Remote { .. } => self.send_remote_write(now_ns, slot),
                }
            }
            DeviceEvent::WriteToRing(slot) => self.write_to_ring(now_ns, slot),
            DeviceEvent::BufferFree(buffer) => {
                self.buffers.release(now_ns, buffer);
                self.schedule_segments(now_ns);
            }
            DeviceEvent::SegmentDone(request) => self.segment_done(now_ns, request),
            DeviceEvent::ReadDataReady(slot) => {
                let state = &mut self.segments[slot as usize];
                state.chain.spend(
                    Component::ControllerQueue,
                    state.chain.mark_ns + state.controller_wait_ns,
                );
                state.chain.spend(Component::Array, now_ns);
                let bytes = self.segments[slot as usize].segment.bytes;
                let t = self.ring.transfer(now_ns, bytes);
                self.outbox
                    .push((t.last_byte_ns, DeviceEvent::ReadToHost(slot)));
            }
            DeviceEvent::ReadToHost(slot) => {
                let bytes = self.segments[slot as usize].segment.bytes;
                let unloaded = self.ring.unloaded_ns(bytes);
                self.segments[slot as usize].chain.spend_transfer(
                    Component::RingWait,
                    Component::Ring,
                    now_ns,
                    unloaded,
                );
                let request = self.segments[slot as usize].request;
                match self.request(request).origin {
                    Origin::Host => self.dma_to_host(now_ns, slot),
                    Origin::Peer { .. } => self.send_read_completion(now_ns, slot),
                }
            }
            DeviceEvent::ReadDmaDone(buffer) => {
                let bytes = self.segments[buffer as usize].segment.bytes;
                let unloaded = self.dma.device_to_host.unloaded_ns(bytes);
                self.segments[buffer as usize].chain.spend_transfer(
                    Component::DmaWait,
                    Component::Dma,
                    now_ns,
                    unloaded,
                );
                self.offer_critical(buffer, now_ns);
                let request = self.segments[buffer as usize].request;
                if matches!(self.segments[buffer as usize].target, Target::Remote { .. }) {
                    self.remote_reads_holding -= 1;
                }
                self.buffers.release(now_ns, buffer);
                self.segment_done(now_ns, request);
                self.schedule_segments(now_ns);
            }
            DeviceEvent::PortTxDone => {
                let (sent, next) = self.port_mut().tx.done(now_ns);
                if let Some(next) = next {
                    self.frame_started(next);
                }
                if let Some(buffer) = sent.release_buffer {
                    self.buffers.release(now_ns, buffer);
                    self.schedule_segments(now_ns);
                }
            }
            DeviceEvent::PacketDataIn(slot) => {
                let state = &mut self.segments[slot as usize];
                state.chain.spend(Component::PacketBuffer, now_ns);
                let stored = std::mem::take(&mut state.rx_stored_bytes);
                let request = state.request;
                if let Some(pause) = self.port_mut().rx.gauge.drain(stored) {
                    self.port_out.push((now_ns, PortOutput::Pause(pause)));
                }
                match self.request(request).origin {
                    // A peer's write: on to the controller as a local write.
                    Origin::Peer { .. } => self.write_to_controller(now_ns, slot),
                    // A read completion's data: on to the host.
                    Origin::Host => self.dma_to_host(now_ns, slot),
                }
            }
        }
    }

    fn request(&self, request: u16) -> &RequestState {
        self.requests[request as usize]
            .as_ref()
            .expect("event for a request that is not live")
    }

    fn admit(&mut self, now_ns: Ns, tag: PhysTag) {
        if self.outstanding == 0 {
            self.busy_since_ns = now_ns;
        }
        self.outstanding += 1;
        let op = self.request(tag.0 as u16).op;
        self.queues.push(tag.0 as u16, op);
    }

    /// Give free buffers to segments: peers' writes first (their data holds
    /// receive buffer space; the dedicated buffer is theirs), then the
    /// queues in the order their policy picks.
    fn schedule_segments(&mut self, now_ns: Ns) {
        while let Some(&request) = self.incoming_writes.front() {
            let Some(buffer) = self.buffers.allocate(now_ns) else {
                break;
            };
            self.incoming_writes.pop_front();
            self.start_peer_segment(now_ns, request, buffer);
        }
        while self.buffers.free_count() > self.reserved_buffers {
            let Some(request) = self.incoming_reads.pop_front() else {
                break;
            };
            let buffer = self.buffers.allocate(now_ns).expect("checked free_count");
            self.start_peer_segment(now_ns, request, buffer);
        }
        while self.buffers.free_count() > self.reserved_buffers {
            let Some(request) = self.queues.peek() else {
                break;
            };
            let req = self.requests[request as usize]
                .as_ref()
                .expect("queued request is live");
            let piece = self
                .striping
                .segment(req.addr, req.len_bytes, req.next_offset);
            let (op, routed, copy) = (req.op, req.routed, req.pass);
            let at = req.addr + piece.offset_bytes;
            let target = match (routed, op) {
                (false, _) => Target::Local(at),
                (true, Op::Write) => self.port_mut().routes.route_write(at, copy),
                (true, Op::Read) => self.port_mut().routes.route_read(at),
            };
            if matches!((op, target), (Op::Read, Target::Remote { .. }))
                && self.remote_reads_holding >= self.remote_read_buffer_limit
            {
                // Deadlock rule: buffers waiting on peers never take the
                // last one, which serves peers' reads.
                break;
            }
            let req = self.requests[request as usize].as_mut().expect("live");
            req.next_offset += piece.bytes;
            if req.next_offset == req.len_bytes && req.pass + 1 < req.copies {
                req.pass += 1;
                req.next_offset = 0;
            }
            let more = req.next_offset < req.len_bytes;
            let start_chain = req.start_chain;
            self.queues.issued(more);
            let segment = match target {
                // Stripes of the device's own address space.
                Target::Local(local) if routed => Segment {
                    offset_bytes: piece.offset_bytes,
                    ..self.striping.segment(local, piece.bytes, 0)
                },
                _ => piece,
            };
            let mut target = target;
            let mut degraded = false;
            if let Target::Remote { node, .. } = target {
                if self.port_mut().routes.is_down(node) {
                    match self.detour(now_ns, request, op, at, segment.bytes, node) {
                        Detour::Done => continue,
                        Detour::Elsewhere { node, addr } => {
                            target = Target::Remote { node, addr };
                            degraded = true;
                        }
                    }
                }
            }
            let req = self.requests[request as usize].as_mut().expect("live");
            match target {
                Target::Local(_) => req.local_bytes += segment.bytes,
                Target::Remote { .. } => req.remote_bytes += segment.bytes,
            }
            let buffer = self.buffers.allocate(now_ns).expect("checked free_count");
            let mut state = SegmentState {
                request,
                segment,
                target,
                buffer,
                chain: start_chain,
                controller_wait_ns: 0,
                rx_stored_bytes: 0,
                awaiting: None,
                degraded,
                retried: false,
            };
            // Barriers, the request queue and the wait for this buffer.
            state.chain.spend(Component::DeviceQueue, now_ns);
            self.segments[buffer as usize] = state;
            match (op, target) {
                (Op::Write, _) => {
                    let end = self.dma.host_to_device.transfer(now_ns, segment.bytes);
                    self.outbox.push((end, DeviceEvent::WriteDmaDone(buffer)));
                }
                (Op::Read, Target::Local(_)) => self.read_from_controller(now_ns, buffer),
                (Op::Read, Target::Remote { node, addr }) => {
                    // The buffer is allocated before the request leaves
                    // (SPEC §4.2): the completion lands in it.
                    self.remote_reads_holding += 1;
                    self.send_read_request(now_ns, buffer, node, addr);
                }
            }
        }
    }

    /// A remote read segment in `buffer` asks `node` for its data at `addr`.
    fn send_read_request(&mut self, now_ns: Ns, buffer: u16, node: u16, addr: u64) {
        let state = &mut self.segments[buffer as usize];
        state.awaiting = Some(PacketKind::ReadCompletion);
        state.target = Target::Remote { node, addr };
        // A read asked again of the other holder (the first refused it, or
        // failed) leaves later than its chain was accounted: the time since
        // the first request left counts as network, as a completion's does
        // (`packet_from_wire`).
        state
            .chain
            .spend(Component::Network, now_ns.max(state.chain.mark_ns));
        let (request, bytes, chain) = (state.request, state.segment.bytes, state.chain);
        let header = self.port_mut().header(
            PacketKind::ReadRequest,
            node,
            HeaderFields {
                addr,
                cmd: CMD_READ,
                offsets: buffer,
                tag: request,
                size: bytes as u16,
            },
        );
        self.port_send(now_ns, header, node, chain, None);
    }

    /// A segment of `request` (global `addr`, `bytes`) whose copy lives on
    /// failed `node`. A mirrored write whose other copy is up goes on
    /// degraded (SPEC §4.3): to the other copy's holder, flagged, or, when
    /// that is this device, recorded as missed (its own copy is written by
    /// its own segment). Anything else fails the request.
    fn detour(
        &mut self,
        now_ns: Ns,
        request: u16,
        op: Op,
        addr: u64,
        bytes: u64,
        node: u16,
    ) -> Detour {
        let routes = &self.port.as_ref().expect("a port").routes;
        let other = (0..2)
            .filter_map(|copy| routes.holder(addr, copy))
            .find(|&(n, _)| n != node);
        let me = routes.node;
        let other_down = other.is_some_and(|(n, _)| routes.is_down(n));
        // This node's own copy takes a write alone only if up to date.
        let own_ok = routes.refusal(addr, 1).is_none()
            && routes.state(routes.slice_of(addr)) == super::network::ReplicaState::UpToDate;
        let mirrored = routes.mirrored();
        let req = self.requests[request as usize].as_mut().expect("live");
        let mirrored_write = op == Op::Write && req.copies == 2;
        match other {
            Some((n, _)) if mirrored_write && n == me && own_ok => {
                self.missed.push(Missed {
                    node,
                    addr,
                    bytes,
                    alone: true,
                });
            }
            Some((n, at)) if mirrored_write && n != me && !other_down => {
                return Detour::Elsewhere { node: n, addr: at };
            }
            other => {
                req.failed = true;
                // Mirrored: the copy that is left is down, or here and not
                // up to date.
                req.refused |= mirrored;
                if mirrored_write && other.is_some_and(|(n, _)| n == me) {
                    // This node's own segment may have written its copy.
                    self.missed.push(Missed {
                        node,
                        addr,
                        bytes,
                        alone: false,
                    });
                }
            }
        }
        self.outbox
            .push((now_ns, DeviceEvent::SegmentDone(request)));
        Detour::Done
    }

    /// The wire declared `node` failed (QuickSAN on a real wire): segments
    /// waiting on it are re-read from a replica, or go on degraded
    /// (mirrored writes), or fail; new segments avoid it.
    pub fn peer_failed(&mut self, now_ns: Ns, node: u16) {
        let Some(port) = self.port.as_mut() else {
            return;
        };
        port.routes.set_down(node, true);
        for slot in 0..self.segments.len() {
            let s = self.segments[slot];
            let waiting_on_node = matches!(s.target, Target::Remote { node: n, .. } if n == node);
            let Some(kind) = s.awaiting.filter(|_| waiting_on_node) else {
                continue;
            };
            let slot = slot as u16;
            self.segments[slot as usize].awaiting = None;
            let addr = self.request(s.request).addr + s.segment.offset_bytes;
            match kind {
                PacketKind::ReadCompletion => match self.port_mut().routes.route_read(addr) {
                    Target::Remote {
                        node: other,
                        addr: at,
                    } if !self.port_mut().routes.is_down(other) => {
                        self.send_read_request(now_ns, slot, other, at)
                    }
                    Target::Local(local) => self.read_here_instead(now_ns, slot, local),
                    Target::Remote { .. } => {
                        self.remote_reads_holding -= 1;
                        let mirrored = self.port_mut().routes.mirrored();
                        let req = self.requests[s.request as usize].as_mut().expect("live");
                        req.failed = true;
                        req.refused |= mirrored;
                        self.outbox.push((now_ns, DeviceEvent::BufferFree(slot)));
                        self.outbox
                            .push((now_ns, DeviceEvent::SegmentDone(s.request)));
                    }
                },
                _ => match self.detour(now_ns, s.request, Op::Write, addr, s.segment.bytes, node) {
                    Detour::Done => self.free_remote_slots.push(slot),
                    Detour::Elsewhere { node, addr } => {
                        self.write_degraded(now_ns, slot, node, addr)
                    }
                },
            }
        }
    }

    /// A mirrored write's segment `slot` goes to the slice's other holder
    /// `node` (its copy at `addr`) instead, flagged degraded, so that
    /// holder records what the first one missed. The data left its buffer:
    /// the packet goes again from the host's copy.
    fn write_degraded(&mut self, now_ns: Ns, slot: u16, node: u16, addr: u64) {
        let state = &mut self.segments[slot as usize];
        state.target = Target::Remote { node, addr };
        state.degraded = true;
        state.awaiting = Some(PacketKind::WriteCompletion);
        self.send_write_request(now_ns, slot, None);
    }

    /// A remote read's segment `slot` is served from this node's copy at
    /// local address `local` instead (the holder it waited on failed or
    /// refused it).
    fn read_here_instead(&mut self, now_ns: Ns, slot: u16, local: u64) {
        self.remote_reads_holding -= 1;
        let state = &mut self.segments[slot as usize];
        let (offset_bytes, bytes) = (state.segment.offset_bytes, state.segment.bytes);
        state.target = Target::Local(local);
        state.segment = Segment {
            offset_bytes,
            ..self.striping.segment(local, bytes, 0)
        };
        self.read_from_controller(now_ns, slot);
    }

    /// `from` refused the segment a completion flagged `CTRL_REFUSED`
    /// answers (its copy is not up to date, or in split brain): a read
    /// goes once to the slice's other holder if that one is up (here: if
    /// this node's copy is up to date), else the request fails, refused;
    /// a write fails, refused. Returns whether a segment was waiting.
    pub fn refused(&mut self, now_ns: Ns, from: u16, h: &PacketHeader) -> bool {
        let slot = h.offsets;
        let Some(s) = self.segments.get(slot as usize).copied() else {
            return false;
        };
        let waiting = s.request == h.tag
            && s.awaiting.is_some()
            && matches!(s.target, Target::Remote { node, .. } if node == from);
        if !waiting {
            return false;
        }
        self.segments[slot as usize].awaiting = None;
        let addr = self.request(s.request).addr + s.segment.offset_bytes;
        if s.awaiting == Some(PacketKind::ReadCompletion) {
            let routes = &self.port.as_ref().expect("a port").routes;
            let other = (0..2)
                .filter_map(|copy| routes.holder(addr, copy))
                .find(|&(n, _)| n != from);
            let local_ok = routes.refusal(addr, s.segment.bytes).is_none()
                && routes.state(routes.slice_of(addr)) == super::network::ReplicaState::UpToDate;
            match other {
                Some((n, at)) if !s.retried && n != routes.node && !routes.is_down(n) => {
                    self.segments[slot as usize].retried = true;
                    self.send_read_request(now_ns, slot, n, at);
                    return true;
                }
                Some((n, local)) if n == routes.node && local_ok => {
                    self.read_here_instead(now_ns, slot, local);
                    return true;
                }
                _ => {}
            }
            self.remote_reads_holding -= 1;
            self.outbox.push((now_ns, DeviceEvent::BufferFree(slot)));
        } else if !s.retried && self.request(s.request).copies == 2 {
            // A mirrored write's copy refused (that holder's copy is not up
            // to date, e.g. it yielded a cut link to its partner): once, the
            // copy goes degraded to the other holder, which records that the
            // refusing one missed it (or, when that is this node, is
            // recorded here); else the request fails.
            self.segments[slot as usize].retried = true;
            match self.detour(now_ns, s.request, Op::Write, addr, s.segment.bytes, from) {
                Detour::Done => self.free_remote_slots.push(slot),
                Detour::Elsewhere { node, addr } => self.write_degraded(now_ns, slot, node, addr),
            }
            return true;
        } else {
            self.free_remote_slots.push(slot);
        }
        let req = self.requests[s.request as usize].as_mut().expect("live");
        req.failed = true;
        req.refused = true;
        self.outbox
            .push((now_ns, DeviceEvent::SegmentDone(s.request)));
        true
    }

    /// The wire hears from `node` again: new segments may use it.
    pub fn peer_up(&mut self, node: u16) {
        if let Some(port) = self.port.as_mut() {
            port.routes.set_down(node, false);
        }
    }

    /// Where the payload of a packet leaving the port comes from, if it
    /// carries one and its segment is still waiting for it.
    pub fn payload_source(&self, header: &PacketHeader) -> Option<PayloadSource> {
        match header.kind {
            PacketKind::ReadCompletion => Some(PayloadSource::Memory(header.addr)),
            PacketKind::WriteRequest => {
                let s = self.segments.get(header.offsets as usize)?;
                if s.awaiting != Some(PacketKind::WriteCompletion) || s.request != header.tag {
                    return None;
                }
                let req = self.requests.get(s.request as usize)?.as_ref()?;
                Some(PayloadSource::Host {
                    token: req.token,
                    offset: s.segment.offset_bytes,
                })
            }
            _ => None,
        }
    }

    /// The segment slot an arriving completion from `from` belongs to, if
    /// one waits for it (a stale or malformed one matches nothing).
    fn live_remote_slot(&self, from: u16, h: &PacketHeader) -> Option<usize> {
        let slot = h.offsets as usize;
        self.segments
            .get(slot)
            .is_some_and(|s| {
                s.awaiting == Some(h.kind)
                    && s.request == h.tag
                    && matches!(s.target, Target::Remote { node, .. } if node == from)
                    && (h.kind == PacketKind::WriteCompletion
                        || u64::from(h.size) == s.segment.bytes)
            })
            .then_some(slot)
    }

    /// Where an arriving read completion's payload goes: the host
    /// request's token and the segment's offset in it.
    pub fn completion_destination(&self, from: u16, h: &PacketHeader) -> Option<(u64, u64)> {
        if h.kind != PacketKind::ReadCompletion {
            return None;
        }
        let s = &self.segments[self.live_remote_slot(from, h)?];
        let req = self.requests[s.request as usize].as_ref()?;
        Some((req.token, s.segment.offset_bytes))
    }

    /// A packet that came off a real wire from `from` at `now_ns`, as the
    /// port sees it: a completion continues its segment's chain (the time
    /// since its request left counts as network), a request starts one.
    pub fn packet_from_wire(&self, now_ns: Ns, from: u16, header: PacketHeader) -> Packet {
        let chain = match header.kind {
            PacketKind::ReadCompletion | PacketKind::WriteCompletion => {
                self.live_remote_slot(from, &header).map(|slot| {
                    let mut chain = self.segments[slot].chain;
                    chain.spend(Component::Network, now_ns.max(chain.mark_ns));
                    chain
                })
            }
            _ => None,
        };
        Packet {
            header,
            from_node: from,
            to_node: self.port.as_ref().map_or(0, |p| p.node()),
            chain: chain.unwrap_or(Chain::starting(now_ns)),
            release_buffer: None,
        }
    }

    /// A read segment's command crosses the ring to its controller.
    fn read_from_controller(&mut self, now_ns: Ns, slot: u16) {
        let arrive = now_ns + self.ring.message_ns();
        let state = &mut self.segments[slot as usize];
        // The read command's message to the controller.
        state.chain.spend(Component::Ring, arrive);
        let segment = state.segment;
        let controller = &self.controllers[segment.controller as usize];
        state.controller_wait_ns = controller.read_wait_ns(arrive);
        let ready = self.controllers[segment.controller as usize].read(
            arrive,
            segment.local_addr,
            segment.bytes,
        );
        self.outbox.push((ready, DeviceEvent::ReadDataReady(slot)));
    }

    /// A write segment's data is in its buffer: once the controller's
    /// in-queue has room (scoreboard), over the ring.
    fn write_to_controller(&mut self, now_ns: Ns, slot: u16) {
        let s = self.segments[slot as usize].segment;
        let accept = self.controllers[s.controller as usize].write_accept_ns(now_ns, s.bytes);
        if accept > now_ns {
            self.outbox.push((accept, DeviceEvent::WriteToRing(slot)));
        } else {
            self.write_to_ring(now_ns, slot);
        }
    }

    /// A read segment's data is in its buffer: DMA to the host.
    fn dma_to_host(&mut self, now_ns: Ns, slot: u16) {
        let bytes = self.segments[slot as usize].segment.bytes;
        let end = self.dma.device_to_host.transfer(now_ns, bytes);
        self.outbox.push((end, DeviceEvent::ReadDmaDone(slot)));
    }

    fn write_to_ring(&mut self, now_ns: Ns, slot: u16) {
        self.segments[slot as usize]
            .chain
            .spend(Component::ControllerQueue, now_ns);
        let SegmentState {
            request,
            segment,
            buffer,
            ..
        } = self.segments[slot as usize];
        let t = self.ring.transfer(now_ns, segment.bytes);
        let w = self.controllers[segment.controller as usize].write(
            t.first_byte_ns,
            t.last_byte_ns,
            segment.local_addr,
            segment.bytes,
        );
        let done = w.ack_ns.max(t.last_byte_ns);
        // The rest of a write's chain is known now (the buffer may be reused
        // before the segment is done).
        let unloaded = self.ring.unloaded_ns(segment.bytes);
        let state = &mut self.segments[slot as usize];
        state.chain.spend_transfer(
            Component::RingWait,
            Component::Ring,
            t.last_byte_ns,
            unloaded,
        );
        state.chain.spend(Component::Array, done);
        self.offer_critical(slot, done);
        // Onyx holds a write's buffer until the controller's completion
        // (`device.write_buffer_until_ack`, SPEC §5); Moneta frees it once
        // the data has left over the ring (SPEC §1.4).
        let free_ns = if self.write_buffer_until_ack {
            done
        } else {
            t.last_byte_ns
        };
        self.outbox.push((free_ns, DeviceEvent::BufferFree(buffer)));
        self.outbox.push((done, DeviceEvent::SegmentDone(request)));
    }

    /// The segment in `slot` finishes at `done_ns`: if no other segment of
    /// its request finishes later, its chain is the request's critical path.
    fn offer_critical(&mut self, slot: u16, done_ns: Ns) {
        let state = &self.segments[slot as usize];
        let req = self.requests[state.request as usize]
            .as_mut()
            .expect("segment of a live request");
        if done_ns >= req.critical_done_ns {
            req.critical_done_ns = done_ns;
            req.critical_chain = state.chain.parts;
        }
    }

    fn segment_done(&mut self, now_ns: Ns, request: u16) {
        let req = self.requests[request as usize]
            .as_mut()
            .expect("segment of a live request");
        req.segments_done += 1;
        if req.segments_done < req.segments_total {
            return;
        }
        let req = self.requests[request as usize]
            .take()
            .expect("live request");
        if let Origin::Peer {
            request: header,
            from,
        } = req.origin
        {
            self.peer_request_done(now_ns, request, &req, header, from);
            return;
        }
        let tag = PhysTag(request as u8);
        let mut parts = DeviceParts::default();
        parts.add(Component::Retag, self.pipeline_ns);
        parts.add(
            Component::Protection,
            req.queued_ns - req.submitted_ns - self.pipeline_ns,
        );
        parts.add_parts(&req.critical_chain);
        // A driver on the wall clock may deliver the last event late; the
        // delay counts as the last segment's array time.
        parts.add(
            Component::Array,
            now_ns.saturating_sub(req.critical_done_ns),
        );
        self.completions.push(Completion {
            token: req.token,
            tag,
            time_ns: now_ns,
            parts,
            local_bytes: req.local_bytes,
            remote_bytes: req.remote_bytes,
            failed: req.failed,
            refused: req.refused,
        });
        self.counters.requests_completed += 1;
        match req.op {
            Op::Read => self.counters.bytes_read += req.len_bytes,
            Op::Write => self.counters.bytes_written += req.len_bytes,
        }
        self.outstanding -= 1;
        if self.outstanding == 0 {
            self.counters.scheduler_busy_ns += now_ns - self.busy_since_ns;
        }
        let mut admitted = std::mem::take(&mut self.admitted);
        self.gate.complete(tag, self.outstanding, &mut admitted);
        for t in admitted.drain(..) {
            self.admit(now_ns, t);
        }
        self.admitted = admitted;
        self.schedule_segments(now_ns);
    }

    /// Counters so far (scheduler busy time counted up to `now_ns`).
    pub fn counters(&self, now_ns: Ns) -> DeviceCounters {
        let mut c = self.counters.clone();
        if self.outstanding > 0 {
            c.scheduler_busy_ns += now_ns - self.busy_since_ns;
        }
        c.dma_busy_ns_host_to_device = self.dma.host_to_device.busy_ns();
        c.dma_busy_ns_device_to_host = self.dma.device_to_host.busy_ns();
        c.ring_busy_ns = self.ring.busy_ns();
        c.buffer_busy_ns = self.buffers.busy_ns();
        c.controllers = self.controllers.iter().map(|m| m.activity()).collect();
        c
    }

    // ---- QuickSAN: the network port in the pipeline (SPEC §4.2, A.6) ----

    /// Queue a packet on the port; `chain` is its segment's chain up to now.
    fn port_send(
        &mut self,
        now_ns: Ns,
        header: PacketHeader,
        to_node: u16,
        chain: Chain,
        release_buffer: Option<u16>,
    ) {
        debug_assert_eq!(chain.mark_ns, now_ns);
        let port = self.port_mut();
        let packet = Packet {
            header,
            from_node: port.node(),
            to_node,
            chain,
            release_buffer,
        };
        if let Some(started) = port.tx.push(now_ns, packet, header.frame_bytes()) {
            self.frame_started(started);
        }
    }

    /// A frame went on the wire: account its wait and its trip to the
    /// switch, hand it to the fabric, and free the link after its gap.
    fn frame_started(&mut self, started: Started<Packet>) {
        let port = self.port.as_ref().expect("a port");
        let mut packet = started.item;
        packet.chain.spend(Component::NetworkWait, started.start_ns);
        let at_switch_ns = started.sent_ns + port.nic_tx_ns;
        packet.chain.spend(Component::Network, at_switch_ns);
        self.port_out
            .push((at_switch_ns, PortOutput::Packet(packet)));
        self.outbox.push((started.free_ns, DeviceEvent::PortTxDone));
    }

    /// The switch asks this port's transmitter to pause, or to resume.
    pub fn port_pause(&mut self, now_ns: Ns, paused: bool) {
        if let Some(started) = self.port_mut().tx.set_paused(now_ns, paused) {
            self.frame_started(started);
        }
    }

    /// A packet will arrive whole at the port at `arrival_ns` (its chain is
    /// accounted to its arrival; packets are announced in their order on
    /// the link): it is written into the receive packet buffer. Returns
    /// when it can be processed ([`Device::receive`]). A payload packet
    /// also takes its buffer space on arrival ([`Device::port_fill`]).
    pub fn port_expect(&mut self, arrival_ns: Ns, packet: &mut Packet) -> Ns {
        let ready_ns = self
            .port_mut()
            .rx
            .schedule_write(arrival_ns, &packet.header);
        packet.chain.spend(Component::PacketBuffer, ready_ns);
        ready_ns
    }

    /// A payload packet has arrived at `now_ns`: it takes its space in the
    /// receive packet buffer, and may make the port pause the link.
    pub fn port_fill(&mut self, now_ns: Ns, header: &PacketHeader) {
        if let Some(pause) = self.port_mut().rx.fill(header) {
            self.port_out.push((now_ns, PortOutput::Pause(pause)));
        }
    }

    /// A packet has arrived whole at `now_ns`: [`Device::port_expect`] and
    /// [`Device::port_fill`] at once.
    pub fn port_arrive(&mut self, now_ns: Ns, packet: &mut Packet) -> Ns {
        let ready_ns = self.port_expect(now_ns, packet);
        self.port_fill(now_ns, &packet.header);
        ready_ns
    }

    /// Process a packet from the receive packet buffer (A.6: four types).
    pub fn receive(&mut self, now_ns: Ns, packet: Packet) {
        let header = packet.header;
        let accepted = match header.kind {
            PacketKind::ReadRequest | PacketKind::WriteRequest => {
                self.receive_request(now_ns, packet)
            }
            PacketKind::ReadCompletion | PacketKind::WriteCompletion => {
                self.receive_completion(now_ns, packet)
            }
        };
        if !accepted {
            let port = self.port_mut();
            port.dropped_packets += 1;
            if header.kind.has_payload() {
                let stored = port.rx.stored_bytes(&header);
                if let Some(pause) = port.rx.gauge.drain(stored) {
                    self.port_out.push((now_ns, PortOutput::Pause(pause)));
                }
            }
        }
        self.schedule_segments(now_ns);
    }

    /// A peer's request: reads join the request queue (no payload), writes
    /// wait for a transfer buffer. Destinations trust their peers (SPEC
    /// §4.1): no permission check, only the bounds of the memory.
    fn receive_request(&mut self, now_ns: Ns, packet: Packet) -> bool {
        let h = packet.header;
        let bytes = u64::from(h.size);
        let in_memory = h
            .addr
            .checked_add(bytes)
            .is_some_and(|end| end <= self.capacity_bytes)
            && bytes > 0
            && self.striping.segment_count(h.addr, bytes) == 1;
        if !in_memory || !self.port_mut().routes_have_memory() {
            return false;
        }
        let op = match h.kind {
            PacketKind::ReadRequest => Op::Read,
            _ => Op::Write,
        };
        // Bounded by the peers' buffers and receive space.
        let request = free_or_new(&mut self.free_peer_requests, &mut self.requests, None);
        self.requests[request as usize] = Some(RequestState {
            token: 0,
            op,
            addr: h.addr,
            len_bytes: bytes,
            barrier: false,
            origin: Origin::Peer {
                request: h,
                from: packet.from_node,
            },
            routed: false,
            copies: 1,
            pass: 0,
            next_offset: 0,
            segments_total: 1,
            segments_done: 0,
            local_bytes: bytes,
            remote_bytes: 0,
            failed: false,
            refused: false,
            submitted_ns: now_ns,
            queued_ns: now_ns,
            start_chain: packet.chain,
            critical_chain: DeviceParts::default(),
            critical_done_ns: 0,
        });
        match op {
            Op::Read => self.incoming_reads.push_back(request),
            Op::Write => self.incoming_writes.push_back(request),
        }
        true
    }

    /// A peer's request got `buffer`. A read goes to its controller; a
    /// write's data first moves out of the packet buffer by the network
    /// "DMA" (A.6), then goes to the controller.
    fn start_peer_segment(&mut self, now_ns: Ns, request: u16, buffer: u16) {
        let req = self.requests[request as usize].as_mut().expect("live");
        req.next_offset = req.len_bytes;
        let Origin::Peer {
            request: header, ..
        } = req.origin
        else {
            unreachable!("incoming requests come from peers")
        };
        let segment = self.striping.segment(req.addr, req.len_bytes, 0);
        let (local_addr, op) = (req.addr, req.op);
        let mut chain = req.start_chain;
        chain.spend(Component::DeviceQueue, now_ns);
        self.segments[buffer as usize] = SegmentState {
            request,
            segment,
            target: Target::Local(local_addr),
            buffer,
            chain,
            controller_wait_ns: 0,
            rx_stored_bytes: 0,
            awaiting: None,
            degraded: false,
            retried: false,
        };
        match op {
            Op::Read => self.read_from_controller(now_ns, buffer),
            Op::Write => {
                let port = self.port_mut();
                let stored = port.rx.stored_bytes(&header);
                let end = port.move_to_buffer(now_ns, segment.bytes);
                self.segments[buffer as usize].rx_stored_bytes = stored;
                self.outbox.push((end, DeviceEvent::PacketDataIn(buffer)));
            }
        }
    }

    /// A write segment for a peer: its data is in the buffer; the write
    /// request packet carries it. The segment waits for the completion in
    /// a slot past the buffers; the buffer is free once the frame is sent.
    fn send_remote_write(&mut self, now_ns: Ns, buffer: u16) {
        let mut fill = self.segments[buffer as usize];
        if let Target::Remote { node, .. } = fill.target {
            if self.port_mut().routes.is_down(node) {
                let addr = self.request(fill.request).addr + fill.segment.offset_bytes;
                let bytes = fill.segment.bytes;
                match self.detour(now_ns, fill.request, Op::Write, addr, bytes, node) {
                    Detour::Done => {
                        self.outbox.push((now_ns, DeviceEvent::BufferFree(buffer)));
                        return;
                    }
                    Detour::Elsewhere { node, addr } => {
                        fill.target = Target::Remote { node, addr };
                        fill.degraded = true;
                    }
                }
            }
        }
        // Bounded by the tags and their requests' segments.
        let slot = free_or_new(&mut self.free_remote_slots, &mut self.segments, fill);
        fill.awaiting = Some(PacketKind::WriteCompletion);
        self.segments[slot as usize] = fill;
        self.send_write_request(now_ns, slot, Some(buffer));
    }

    /// The write request of the remote write segment in `slot`; its data
    /// leaves from `buffer` (freed once the frame is on the wire), or,
    /// sent again to another holder, from the host's copy.
    fn send_write_request(&mut self, now_ns: Ns, slot: u16, buffer: Option<u16>) {
        let state = self.segments[slot as usize];
        let Target::Remote { node, addr } = state.target else {
            unreachable!("a remote segment")
        };
        let mut header = self.port_mut().header(
            PacketKind::WriteRequest,
            node,
            HeaderFields {
                addr,
                cmd: CMD_WRITE,
                offsets: slot,
                tag: state.request,
                size: state.segment.bytes as u16,
            },
        );
        if state.degraded {
            header.ctrl |= CTRL_DEGRADED;
        }
        // A degraded copy sent again (the first holder failed or refused
        // it): the time since the first left counts as network, as for a
        // read asked again (`send_read_request`).
        let mut chain = state.chain;
        chain.spend(Component::Network, now_ns.max(chain.mark_ns));
        self.port_send(now_ns, header, node, chain, buffer);
    }

    /// A peer's read has its data in `slot`'s buffer: the completion packet
    /// carries it back; the buffer is free once the frame is sent.
    fn send_read_completion(&mut self, now_ns: Ns, slot: u16) {
        let state = self.segments[slot as usize];
        let Origin::Peer { request: h, from } = self.request(state.request).origin else {
            unreachable!("a peer's request")
        };
        self.send_completion(
            now_ns,
            PacketKind::ReadCompletion,
            (h, from),
            state.chain,
            Some(state.buffer),
        );
        self.offer_critical(slot, now_ns);
        self.segment_done(now_ns, state.request);
    }

    /// A peer's request is done here: a write's completion goes back (a
    /// read's went with its data).
    fn peer_request_done(
        &mut self,
        now_ns: Ns,
        request: u16,
        req: &RequestState,
        h: PacketHeader,
        from: u16,
    ) {
        self.counters.peer_requests_served += 1;
        self.free_peer_requests.push(request);
        if req.op == Op::Write {
            let mut chain = Chain {
                parts: req.critical_chain,
                mark_ns: req.critical_done_ns,
            };
            chain.spend(Component::Array, now_ns);
            self.send_completion(now_ns, PacketKind::WriteCompletion, (h, from), chain, None);
        }
    }

    /// Answer a peer's `request` (from node `from`): the completion
    /// returns its tag and slot (Table A.3), with the data for a read.
    fn send_completion(
        &mut self,
        now_ns: Ns,
        kind: PacketKind,
        (request, from): (PacketHeader, u16),
        chain: Chain,
        release_buffer: Option<u16>,
    ) {
        let header = self.port_mut().header(
            kind,
            from,
            HeaderFields {
                addr: request.addr,
                cmd: request.cmd,
                offsets: request.offsets,
                tag: request.tag,
                size: request.size,
            },
        );
        self.port_send(now_ns, header, from, chain, release_buffer);
    }

    /// A completion for one of this device's remote segments.
    fn receive_completion(&mut self, now_ns: Ns, packet: Packet) -> bool {
        let h = packet.header;
        let Some(slot) = self.live_remote_slot(packet.from_node, &h) else {
            return false;
        };
        let slot = slot as u16;
        let state = &mut self.segments[slot as usize];
        state.awaiting = None;
        state.chain = packet.chain;
        match h.kind {
            PacketKind::ReadCompletion => {
                // The payload goes straight into the buffer allocated when
                // the request left, then to the host.
                let stored = self.port_mut().rx.stored_bytes(&h);
                self.segments[slot as usize].rx_stored_bytes = stored;
                let end = self.port_mut().move_to_buffer(now_ns, u64::from(h.size));
                self.outbox.push((end, DeviceEvent::PacketDataIn(slot)));
            }
            _ => {
                self.offer_critical(slot, now_ns);
                let request = self.segments[slot as usize].request;
                self.free_remote_slots.push(slot);
                self.segment_done(now_ns, request);
            }
        }
        true
    }
}

/// A free index from `free`, or a new one at the end of `slots`.
fn free_or_new<T>(free: &mut Vec<u16>, slots: &mut Vec<T>, fill: T) -> u16 {
    free.pop().unwrap_or_else(|| {
        assert!(slots.len() < u16::MAX as usize, "more than 64K slots");
        slots.push(fill);
        (slots.len() - 1) as u16
    })
}

/// The command byte of SPEC §1.2 a packet carries (opcode bits).
pub const CMD_READ: u8 = 0b01;
pub const CMD_WRITE: u8 = 0b10;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::driver::DeviceDriver;

    /// Run the device alone on a virtual clock until idle.
    fn run(driver: &mut DeviceDriver) -> Vec<Completion> {
        let mut done = Vec::new();
        while let Some(t) = driver.next_event_time() {
            driver.deliver_due(t, |f| done.push(f.completion));
        }
        done
    }

    fn request(token: u64, op: Op, addr: u64, len: u64) -> DeviceRequest {
        DeviceRequest {
            token,
            op,
            addr: DeviceAddr(addr),
            len_bytes: len,
            barrier: false,
            protection_ns: 0,
        }
    }

    #[test]
    fn bad_requests_are_errors() {
        let c = Config::preset("moneta").unwrap();
        let mut d = DeviceDriver::new(&c, 1);
        assert_eq!(
            d.submit(0, PhysTag(64), request(0, Op::Read, 0, 512)),
            Err(DeviceError::TagOutOfRange(64))
        );
        assert_eq!(
            d.submit(0, PhysTag(0), request(0, Op::Read, 0, 0)),
            Err(DeviceError::ZeroLength)
        );
        assert!(matches!(
            d.submit(0, PhysTag(0), request(0, Op::Read, u64::MAX - 10, 512)),
            Err(DeviceError::OutOfRange { .. })
        ));
        d.submit(0, PhysTag(0), request(0, Op::Read, 0, 512))
            .unwrap();
        assert_eq!(
            d.submit(0, PhysTag(0), request(1, Op::Read, 0, 512)),
            Err(DeviceError::TagInFlight(0))
        );
    }

    #[test]
    fn command_words_are_decoded_and_bad_words_rejected() {
        let c = Config::preset("moneta").unwrap();
        let mut d = DeviceDriver::new(&c, 1);
        let cmd = command::Command {
            tag: 5,
            op: Op::Write,
            addr: DeviceAddr(1 << 20),
            len_bytes: 4096,
            host_dma_addr: None,
            barrier: false,
            dma_completion: true,
        };
        let word = command::encode_atomic(&cmd).unwrap();
        assert_eq!(
            d.submit_command(0, CommandWords::Atomic(word), 9),
            Ok(PhysTag(5))
        );
        let done = run(&mut d);
        assert_eq!(done[0].token, 9);
        // Garbage never panics: it is an error value, and the device stays usable.
        for word in [0u64, u64::MAX, 0xDEAD_BEEF_DEAD_BEEF] {
            assert!(matches!(
                d.submit_command(0, CommandWords::Atomic(word), 0),
                Err(DeviceError::Command(_))
            ));
        }
        let baseline = command::encode_baseline(&command::Command {
            host_dma_addr: Some(0x1000),
            ..cmd
        })
        .unwrap();
        assert_eq!(
            d.submit_command(0, CommandWords::Baseline(baseline), 1),
            Ok(PhysTag(5))
        );
    }

    #[test]
    fn lone_4kb_requests_take_less_than_table_3_1_hardware_time() {
        let c = Config::preset("moneta").unwrap();
        for (op, published_ns) in [(Op::Read, 8000.0), (Op::Write, 8200.0)] {
            let mut d = DeviceDriver::new(&c, 1);
            d.submit(0, PhysTag(0), request(7, op, 1 << 20, 4096))
                .unwrap();
            let done = run(&mut d);
            assert_eq!(done.len(), 1);
            assert_eq!(done[0].token, 7);
            let t = done[0].time_ns as f64;
            eprintln!("lone 4 KB {op:?}: {t} ns (Table 3.1 hardware total {published_ns} ns)");
            // The mechanisms (PCM 48/150 ns per row, 4 GB/s DDR, ring, DMA) give
            // about 4.8/5.0 µs, less than Table 3.1's measured 8.0/8.2 µs, whose
            // "4 KB PCM access" of 4.39/5.18 µs no published mechanism explains
            // (README, Calibration). Guard the range so a change is noticed.
            assert!(
                t > 0.5 * published_ns && t < 1.15 * published_ns,
                "{op:?}: {t} ns"
            );
        }
    }

    #[test]
    fn a_large_request_streams_at_the_link_rate() {
        let c = Config::preset("moneta").unwrap();
        let mut d = DeviceDriver::new(&c, 1);
        d.submit(0, PhysTag(0), request(0, Op::Read, 0, 1 << 20))
            .unwrap();
        let done = run(&mut d);
        let bandwidth = (1u64 << 20) as f64 / (done[0].time_ns as f64 * 1e-9);
        assert!(bandwidth > 1.6e9 && bandwidth < 1.75e9, "{bandwidth}");
    }

    #[test]
    fn onyx_write_holds_its_buffer_until_the_controller_completes() {
        // One transfer buffer, two 4 KB writes to different controllers.
        for (hold, min_ns, max_ns) in [(true, 240_000, 270_000), (false, 120_000, 150_000)] {
            let mut c = Config::preset("onyx-late").unwrap();
            c.device.transfer_buffers = 1;
            c.device.write_buffer_until_ack = hold;
            let mut d = DeviceDriver::new(&c, 1);
            d.submit(0, PhysTag(0), request(0, Op::Write, 0, 4096))
                .unwrap();
            d.submit(0, PhysTag(1), request(1, Op::Write, 4096, 4096))
                .unwrap();
            let done = run(&mut d);
            let last = done.iter().map(|c| c.time_ns).max().unwrap();
            assert!((min_ns..max_ns).contains(&last), "hold={hold}: {last} ns");
        }
    }

    #[test]
    fn barrier_orders_completions() {
        let c = Config::preset("moneta").unwrap();
        let mut d = DeviceDriver::new(&c, 1);
        d.submit(0, PhysTag(0), request(0, Op::Read, 0, 1 << 20))
            .unwrap();
        let mut b = request(1, Op::Write, 1 << 21, 512);
        b.barrier = true;
        d.submit(1, PhysTag(1), b).unwrap();
        d.submit(2, PhysTag(2), request(2, Op::Read, 1 << 22, 512))
            .unwrap();
        let done = run(&mut d);
        let order: Vec<u64> = done.iter().map(|c| c.token).collect();
        assert_eq!(order, vec![0, 1, 2]);
        // Without the barrier the small requests finish before the large read.
        let mut d = DeviceDriver::new(&c, 1);
        d.submit(0, PhysTag(0), request(0, Op::Read, 0, 1 << 20))
            .unwrap();
        d.submit(1, PhysTag(1), request(1, Op::Write, 1 << 21, 512))
            .unwrap();
        let done = run(&mut d);
        assert_eq!(done[0].token, 1);
    }
}
