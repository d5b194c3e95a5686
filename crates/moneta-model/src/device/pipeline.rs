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
//! A request completes when all its segments are done; its completion
//! carries where its device time went (`breakdown`): the fixed pipeline and
//! protection time, then the chain of the segment that finished last (the
//! critical path): queue and buffer wait, DMA, ring, controller queue, array.
//!
//! The device is clock
//! agnostic: it is handed `now` and writes the events it wants delivered into
//! `outbox` and finished requests into `completions`; `driver::DeviceDriver`
//! delivers them, for the simulator's event loop and the emulator's polling
//! thread alike.

use super::buffers::{BufferPool, Segment, Striping};
use super::command::{self, CommandError, CommandFormat, CommandLimits};
use super::dma::Dma;
use super::memory::{ControllerActivity, MemoryTiming};
use super::moneta_controller::MonetaController;
use super::onyx_pcm::OnyxController;
use super::queues::{BarrierGate, RequestQueues};
use super::ring::Ring;
use crate::breakdown::{Component, DeviceParts};
use crate::config::{Config, ControllerKind};
use crate::units::{DeviceAddr, Ns, Op, PhysTag};
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

/// Events the device schedules for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceEvent {
    Enqueue(PhysTag),
    WriteDmaDone(u16),
    WriteToRing(u16),
    BufferFree(u16),
    SegmentDone(PhysTag),
    ReadDataReady(u16),
    ReadToHost(u16),
    ReadDmaDone(u16),
}

#[derive(Debug, Clone, Copy)]
struct RequestState {
    token: u64,
    op: Op,
    addr: u64,
    len_bytes: u64,
    barrier: bool,
    next_offset: u64,
    segments_total: u32,
    segments_done: u32,
    /// Where time goes: accepted at `submitted_ns`, past retag and
    /// protection at `queued_ns`; the chain of the segment that finishes
    /// last so far and when it finishes.
    submitted_ns: Ns,
    queued_ns: Ns,
    critical_chain: DeviceParts,
    critical_done_ns: Ns,
}

#[derive(Debug, Clone, Copy)]
struct SegmentState {
    tag: PhysTag,
    segment: Segment,
    /// This segment's time so far by component, accounted up to `mark_ns`.
    chain: DeviceParts,
    mark_ns: Ns,
    /// A read's wait in the controller's queue before its access.
    controller_wait_ns: Ns,
}

impl SegmentState {
    /// Account the time from the mark to `until_ns` to `component`.
    fn spend(&mut self, component: Component, until_ns: Ns) {
        self.chain.add(component, until_ns - self.mark_ns);
        self.mark_ns = until_ns;
    }

    /// A transfer from the mark to `until_ns` that takes `unloaded_ns` on
    /// an idle link or ring: the rest was `wait`.
    fn spend_transfer(
        &mut self,
        wait: Component,
        transfer: Component,
        until_ns: Ns,
        unloaded_ns: Ns,
    ) {
        let waited = (until_ns - self.mark_ns).saturating_sub(unloaded_ns);
        self.spend(wait, self.mark_ns + waited);
        self.spend(transfer, until_ns);
    }
}

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
    queues: RequestQueues,
    gate: BarrierGate,
    requests: Vec<Option<RequestState>>,
    segments: Vec<SegmentState>,
    /// Admitted (past the barrier gate) and not yet completed.
    outstanding: u32,
    busy_since_ns: Ns,
    counters: DeviceCounters,
    admitted: Vec<PhysTag>,
    write_buffer_until_ack: bool,
    /// Events to deliver back to `handle` at their time.
    pub outbox: Vec<(Ns, DeviceEvent)>,
    /// Requests finished since the driver last drained this.
    pub completions: Vec<Completion>,
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
            tag: PhysTag(0),
            segment: Segment {
                offset_bytes: 0,
                bytes: 0,
                controller: 0,
                local_addr: 0,
            },
            chain: DeviceParts::default(),
            mark_ns: 0,
            controller_wait_ns: 0,
        };
        Self {
            capacity_bytes: d.capacity_bytes,
            tags: d.tags,
            pipeline_ns: d.pipeline_ns,
            striping: Striping {
                stripe_bytes: m.stripe_bytes,
                controllers: m.controllers,
                segment_bytes: d.buffer_bytes,
            },
            dma: Dma::new(&config.link),
            ring: Ring::new(&config.ring, m.controllers + 1),
            controllers,
            buffers: BufferPool::new(d.transfer_buffers),
            queues: RequestQueues::new(d.queue_policy, d.tags),
            gate: BarrierGate::new(d.tags),
            requests: vec![None; d.tags as usize],
            segments: vec![empty_segment; d.transfer_buffers as usize],
            outstanding: 0,
            busy_since_ns: 0,
            counters: DeviceCounters::default(),
            admitted: Vec::with_capacity(d.tags as usize),
            write_buffer_until_ack: d.write_buffer_until_ack,
            outbox: Vec::with_capacity(64),
            completions: Vec::with_capacity(64),
        }
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
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
        if end.is_none_or(|e| e > self.capacity_bytes) {
            return Err(DeviceError::OutOfRange {
                addr: request.addr.0,
                len_bytes: request.len_bytes,
                capacity_bytes: self.capacity_bytes,
            });
        }
        self.requests[tag.0 as usize] = Some(RequestState {
            token: request.token,
            op: request.op,
            addr: request.addr.0,
            len_bytes: request.len_bytes,
            barrier: request.barrier,
            next_offset: 0,
            segments_total: self
                .striping
                .segment_count(request.addr.0, request.len_bytes),
            segments_done: 0,
            submitted_ns: now_ns,
            queued_ns: now_ns + self.pipeline_ns + request.protection_ns,
            critical_chain: DeviceParts::default(),
            critical_done_ns: 0,
        });
        self.outbox.push((
            now_ns + self.pipeline_ns + request.protection_ns,
            DeviceEvent::Enqueue(tag),
        ));
        Ok(())
    }

    /// Deliver one of the device's own events at its time.
    pub fn handle(&mut self, now_ns: Ns, event: DeviceEvent) {
        match event {
            DeviceEvent::Enqueue(tag) => {
                let barrier = self.request(tag).barrier;
                if self.gate.arrive(tag, barrier, self.outstanding) {
                    self.admit(now_ns, tag);
                }
                self.schedule_segments(now_ns);
            }
            DeviceEvent::WriteDmaDone(buffer) => {
                let s = self.segments[buffer as usize].segment;
                let unloaded = self.dma.host_to_device.unloaded_ns(s.bytes);
                self.segments[buffer as usize].spend_transfer(
                    Component::DmaWait,
                    Component::Dma,
                    now_ns,
                    unloaded,
                );
                let accept =
                    self.controllers[s.controller as usize].write_accept_ns(now_ns, s.bytes);
                if accept > now_ns {
                    self.outbox.push((accept, DeviceEvent::WriteToRing(buffer)));
                } else {
                    self.write_to_ring(now_ns, buffer);
                }
            }
            DeviceEvent::WriteToRing(buffer) => self.write_to_ring(now_ns, buffer),
            DeviceEvent::BufferFree(buffer) => {
                self.buffers.release(now_ns, buffer);
                self.schedule_segments(now_ns);
            }
            DeviceEvent::SegmentDone(tag) => self.segment_done(now_ns, tag),
            DeviceEvent::ReadDataReady(buffer) => {
                let state = &mut self.segments[buffer as usize];
                state.spend(
                    Component::ControllerQueue,
                    state.mark_ns + state.controller_wait_ns,
                );
                state.spend(Component::Array, now_ns);
                let bytes = self.segments[buffer as usize].segment.bytes;
                let t = self.ring.transfer(now_ns, bytes);
                self.outbox
                    .push((t.last_byte_ns, DeviceEvent::ReadToHost(buffer)));
            }
            DeviceEvent::ReadToHost(buffer) => {
                let bytes = self.segments[buffer as usize].segment.bytes;
                let unloaded = self.ring.unloaded_ns(bytes);
                self.segments[buffer as usize].spend_transfer(
                    Component::RingWait,
                    Component::Ring,
                    now_ns,
                    unloaded,
                );
                let end = self.dma.device_to_host.transfer(now_ns, bytes);
                self.outbox.push((end, DeviceEvent::ReadDmaDone(buffer)));
            }
            DeviceEvent::ReadDmaDone(buffer) => {
                let bytes = self.segments[buffer as usize].segment.bytes;
                let unloaded = self.dma.device_to_host.unloaded_ns(bytes);
                self.segments[buffer as usize].spend_transfer(
                    Component::DmaWait,
                    Component::Dma,
                    now_ns,
                    unloaded,
                );
                self.offer_critical(buffer, now_ns);
                let tag = self.segments[buffer as usize].tag;
                self.buffers.release(now_ns, buffer);
                self.segment_done(now_ns, tag);
                self.schedule_segments(now_ns);
            }
        }
    }

    fn request(&self, tag: PhysTag) -> &RequestState {
        self.requests[tag.0 as usize]
            .as_ref()
            .expect("event for a tag with no request")
    }

    fn admit(&mut self, now_ns: Ns, tag: PhysTag) {
        if self.outstanding == 0 {
            self.busy_since_ns = now_ns;
        }
        self.outstanding += 1;
        let op = self.request(tag).op;
        self.queues.push(tag, op);
    }

    /// Give free buffers to segments, in the order the queue policy picks.
    fn schedule_segments(&mut self, now_ns: Ns) {
        while self.buffers.has_free() {
            let Some(tag) = self.queues.peek() else { break };
            let req = self.requests[tag.0 as usize]
                .as_mut()
                .expect("queued tag has a request");
            let segment = self
                .striping
                .segment(req.addr, req.len_bytes, req.next_offset);
            req.next_offset += segment.bytes;
            let more = req.next_offset < req.len_bytes;
            let op = req.op;
            let queued_ns = req.queued_ns;
            self.queues.issued(more);
            let buffer = self.buffers.allocate(now_ns).expect("checked has_free");
            let mut state = SegmentState {
                tag,
                segment,
                chain: DeviceParts::default(),
                mark_ns: queued_ns,
                controller_wait_ns: 0,
            };
            // Barriers, the request queue and the wait for this buffer.
            state.spend(Component::DeviceQueue, now_ns);
            if op == Op::Read {
                // The read command's message to the controller.
                state.spend(Component::Ring, now_ns + self.ring.message_ns());
            }
            self.segments[buffer as usize] = state;
            match op {
                Op::Write => {
                    let end = self.dma.host_to_device.transfer(now_ns, segment.bytes);
                    self.outbox.push((end, DeviceEvent::WriteDmaDone(buffer)));
                }
                Op::Read => {
                    let arrive = now_ns + self.ring.message_ns();
                    let controller = &self.controllers[segment.controller as usize];
                    self.segments[buffer as usize].controller_wait_ns =
                        controller.read_wait_ns(arrive);
                    let ready = self.controllers[segment.controller as usize].read(
                        arrive,
                        segment.local_addr,
                        segment.bytes,
                    );
                    self.outbox
                        .push((ready, DeviceEvent::ReadDataReady(buffer)));
                }
            }
        }
    }

    fn write_to_ring(&mut self, now_ns: Ns, buffer: u16) {
        self.segments[buffer as usize].spend(Component::ControllerQueue, now_ns);
        let SegmentState { tag, segment, .. } = self.segments[buffer as usize];
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
        let state = &mut self.segments[buffer as usize];
        state.spend_transfer(
            Component::RingWait,
            Component::Ring,
            t.last_byte_ns,
            unloaded,
        );
        state.spend(Component::Array, done);
        self.offer_critical(buffer, done);
        // Onyx holds a write's buffer until the controller's completion
        // (`device.write_buffer_until_ack`, SPEC §5); Moneta frees it once
        // the data has left over the ring (SPEC §1.4).
        let free_ns = if self.write_buffer_until_ack {
            done
        } else {
            t.last_byte_ns
        };
        self.outbox.push((free_ns, DeviceEvent::BufferFree(buffer)));
        self.outbox.push((done, DeviceEvent::SegmentDone(tag)));
    }

    /// The segment in `buffer` finishes at `done_ns`: if no other segment of
    /// its request finishes later, its chain is the request's critical path.
    fn offer_critical(&mut self, buffer: u16, done_ns: Ns) {
        let state = &self.segments[buffer as usize];
        let req = self.requests[state.tag.0 as usize]
            .as_mut()
            .expect("segment of a live request");
        if done_ns >= req.critical_done_ns {
            req.critical_done_ns = done_ns;
            req.critical_chain = state.chain;
        }
    }

    fn segment_done(&mut self, now_ns: Ns, tag: PhysTag) {
        let req = self.requests[tag.0 as usize]
            .as_mut()
            .expect("segment of a live request");
        req.segments_done += 1;
        if req.segments_done < req.segments_total {
            return;
        }
        let req = self.requests[tag.0 as usize].take().expect("live request");
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
}

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
