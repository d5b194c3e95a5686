//! The device driver loop: the one place that hands the device its requests
//! and delivers its timed events (DESIGN "One model, two clocks"; SPEC §1.4).
//!
//! [`DeviceDriver`] owns the [`Device`] and the queue of its own future
//! events. Whoever drives it passes `now` from its clock: the simulator's
//! virtual clock jumps to [`DeviceDriver::next_event_time`], the emulator's
//! wall clock polls. Every event is delivered at its own model time, so both
//! compute the same completion times for the same requests.
//!
//! For the Moneta-D stacks the driver also holds the two pipeline stages in
//! front of the request queues (SPEC §1.4, §3.3): [`Retag`] (a (channel,
//! virtual tag) pair takes one of the device's physical tags; none free is a
//! stall the caller waits out) and the [`PermissionTable`] (the channel's
//! tree walk; its steps × `direct.tree_step_ns` are the request's protection
//! time). The kernel stacks bring their own physical tags and skip both.
//!
//! With a QuickSAN port on a real wire (the emulator's SAN, SPEC §4.2;
//! [`DeviceDriver::with_port`]) channel addresses are global, and the
//! driver takes the packets that arrive off the wire: each is written into
//! the port's receive packet buffer and processed when it is stored whole,
//! an event in the same queue as the device's own.

use super::network::{NetworkPort, Packet, PortOutput};
use super::packet::PacketHeader;
use super::pipeline::{
    CommandWords, Completion, Device, DeviceCounters, DeviceError, DeviceEvent, DeviceRequest,
    Missed,
};
use super::protection::{Access, CheckOutcome, PermissionTable};
use super::retag::Retag;
use crate::config::Config;
use crate::kernel::EventQueue;
use crate::units::{DeviceAddr, Ns, Op, PhysTag};

/// The Moneta-D stages in front of the queues: retag, then protection.
struct ChannelFront {
    retag: Retag,
    protection: PermissionTable,
    tree_step_ns: Ns,
}

/// A request a channel issued, as the device decoded it (SPEC §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelRequest {
    pub op: Op,
    pub addr: DeviceAddr,
    pub len_bytes: u64,
    pub barrier: bool,
}

/// Why a channel's request did not enter the queues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelRefusal {
    /// No physical tag is free: the retag stage stalls (SPEC §1.4).
    Stalled,
    /// No record covers the range: a hard miss for the library (SPEC §3.3).
    MissingRecord {
        steps: u32,
    },
    /// A record covers it but lacks the needed bit (SPEC §3.3).
    PermissionDenied {
        steps: u32,
    },
    /// The caller's data movement failed after the check passed.
    DataMovement,
    Device(DeviceError),
}

/// A finished request, with the channel and virtual tag it came from when
/// the retag stage mapped it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Finished {
    pub completion: Completion,
    pub channel_tag: Option<(u16, u8)>,
}

/// What the driver's queue delivers: the device's own events, and packets
/// from a real wire once stored whole in the receive packet buffer.
#[derive(Debug, Clone, Copy)]
enum Due {
    Device(DeviceEvent),
    Packet(u32),
}

pub struct DeviceDriver {
    device: Device,
    queue: EventQueue<Due>,
    front: Option<ChannelFront>,
    completions: Vec<Completion>,
    /// Time of the last event delivered.
    model_time_ns: Ns,
    /// Channel requests carry global addresses (a QuickSAN port).
    routed: bool,
    /// Packets from the wire waiting in the receive packet buffer.
    arrivals: Vec<Option<Packet>>,
    free_arrivals: Vec<u32>,
}

impl DeviceDriver {
    /// The device alone: callers bring physical tags (the kernel stacks).
    pub fn new(config: &Config, seed: u64) -> Self {
        DeviceDriver {
            device: Device::new(config, seed),
            queue: EventQueue::new(),
            front: None,
            completions: Vec::with_capacity(config.device.tags as usize),
            model_time_ns: 0,
            routed: false,
            arrivals: Vec::new(),
            free_arrivals: Vec::new(),
        }
    }

    /// A QuickSAN device behind `channels` channels whose port is on a
    /// real wire: channel requests address the global space (QuickSAN-D:
    /// permissions are checked here, at the source), segments on peers
    /// leave through [`Self::port_output`], and packets from peers come in
    /// through [`Self::receive_packet`].
    pub fn with_port(config: &Config, seed: u64, channels: u16, port: NetworkPort) -> Self {
        let mut driver = Self::with_channels(config, seed, channels);
        driver.device = Device::with_port(config, seed, port);
        driver.routed = true;
        driver
    }

    /// Packets (and the port's pause requests, which a real wire's own
    /// flow control replaces) the port produced, with their model times:
    /// the caller takes them out.
    pub fn port_output(&mut self) -> &mut Vec<(Ns, PortOutput)> {
        &mut self.device.port_out
    }

    /// Mirrored copies that failed peers missed: the caller takes them out
    /// and records them for the resync.
    pub fn missed(&mut self) -> &mut Vec<Missed> {
        &mut self.device.missed
    }

    /// Whether a packet with `header` fits in the receive packet buffer
    /// now; a caller that must not overflow leaves it on the wire (whose
    /// flow control then pauses the sender) until it does.
    pub fn port_has_room(&self, header: &PacketHeader) -> bool {
        let Some(port) = self.device.port() else {
            return false;
        };
        !header.kind.has_payload() || port.rx.gauge.has_room(port.rx.stored_bytes(header))
    }

    /// Whether a packet with `header` could ever fit in the receive packet
    /// buffer (one that cannot is malformed: the caller drops it rather
    /// than wait for room forever).
    pub fn port_can_hold(&self, header: &PacketHeader) -> bool {
        self.device.port().is_some_and(|port| {
            !header.kind.has_payload()
                || port.rx.stored_bytes(header) <= port.rx.gauge.capacity_bytes()
        })
    }

    /// A packet from node `from` came off the wire at `now_ns`: it is
    /// stored in the receive packet buffer and processed when whole.
    /// Returns its model arrival time (never before model time reached).
    pub fn receive_packet(&mut self, now_ns: Ns, from: u16, header: PacketHeader) -> Ns {
        let now_ns = now_ns.max(self.model_time_ns);
        let mut packet = self.device.packet_from_wire(now_ns, from, header);
        let arrive = packet.chain.mark_ns;
        let ready = self.device.port_arrive(arrive, &mut packet);
        let id = match self.free_arrivals.pop() {
            Some(id) => {
                self.arrivals[id as usize] = Some(packet);
                id
            }
            None => {
                self.arrivals.push(Some(packet));
                (self.arrivals.len() - 1) as u32
            }
        };
        self.queue.push(ready, Due::Packet(id));
        self.collect_scheduled();
        arrive
    }

    /// The wire declared `node` failed at `now_ns`.
    pub fn peer_failed(&mut self, now_ns: Ns, node: u16) {
        self.device
            .peer_failed(now_ns.max(self.model_time_ns), node);
        self.collect_scheduled();
    }

    /// `from` refused a segment (a completion flagged `CTRL_REFUSED`, issue
    /// 22): `Device::refused`.
    pub fn refused(&mut self, now_ns: Ns, from: u16, header: &PacketHeader) -> bool {
        let waited = self
            .device
            .refused(now_ns.max(self.model_time_ns), from, header);
        self.collect_scheduled();
        waited
    }

    /// The port's routing tables (a device with a port).
    pub fn routes_mut(&mut self) -> Option<&mut super::network::RouteTable> {
        self.device.routes_mut()
    }

    /// The wire hears from `node` again.
    pub fn peer_up(&mut self, node: u16) {
        self.device.peer_up(node);
    }

    /// The device behind `channels` Moneta-D channels: retag onto its
    /// physical tags and the shared permission table of
    /// `direct.permission_records` records.
    pub fn with_channels(config: &Config, seed: u64, channels: u16) -> Self {
        let mut driver = Self::new(config, seed);
        driver.front = Some(ChannelFront {
            retag: Retag::new(config.device.tags),
            protection: PermissionTable::new(config.direct.permission_records, channels)
                .with_merging(config.direct.merge_records),
            tree_step_ns: config.direct.tree_step_ns,
        });
        driver
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn counters(&self, now_ns: Ns) -> DeviceCounters {
        self.device.counters(now_ns)
    }

    /// Time of the device's earliest pending event.
    pub fn next_event_time(&self) -> Option<Ns> {
        self.queue.peek_time()
    }

    /// Time of the last event delivered: how far the model has got.
    pub fn model_time_ns(&self) -> Ns {
        self.model_time_ns
    }

    /// No event pending: the device has nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    fn front(&self) -> &ChannelFront {
        self.front.as_ref().expect("a driver built with_channels")
    }

    fn front_mut(&mut self) -> &mut ChannelFront {
        self.front.as_mut().expect("a driver built with_channels")
    }

    /// The channels' permission table (the control plane edits it between commands).
    pub fn protection(&self) -> &PermissionTable {
        &self.front().protection
    }

    pub fn protection_mut(&mut self) -> &mut PermissionTable {
        &mut self.front_mut().protection
    }

    /// A physical tag is free: the retag stage can take a command.
    pub fn retag_has_free(&self) -> bool {
        self.front().retag.has_free()
    }

    /// Move the events the device just scheduled into the queue.
    fn collect_scheduled(&mut self) {
        for (t, e) in self.device.outbox.drain(..) {
            self.queue.push(t, Due::Device(e));
        }
    }

    /// Command words from a kernel stack, under the tag they carry (SPEC
    /// §1.2); no retag or protection stage.
    pub fn submit_command(
        &mut self,
        now_ns: Ns,
        words: CommandWords,
        token: u64,
    ) -> Result<PhysTag, DeviceError> {
        let tag = self.device.submit_command(now_ns, words, token, 0)?;
        self.collect_scheduled();
        Ok(tag)
    }

    /// A decoded request under physical tag `tag` (no retag or protection).
    pub fn submit(
        &mut self,
        now_ns: Ns,
        tag: PhysTag,
        request: DeviceRequest,
    ) -> Result<(), DeviceError> {
        self.device.submit(now_ns, tag, request)?;
        self.collect_scheduled();
        Ok(())
    }

    /// A request of `channel`'s virtual tag through retag and protection
    /// (SPEC §1.4). `move_data` runs once the check allowed the access and
    /// before the request enters the queues (the emulator copies the bytes
    /// there); `false` from it refuses the request. The token of the
    /// completion is [`channel_token`].
    pub fn submit_channel(
        &mut self,
        now_ns: Ns,
        channel: u16,
        virtual_tag: u8,
        request: ChannelRequest,
        move_data: impl FnOnce() -> bool,
    ) -> Result<PhysTag, ChannelRefusal> {
        let front = self.front_mut();
        if !front.retag.has_free() {
            return Err(ChannelRefusal::Stalled);
        }
        let access = match request.op {
            Op::Read => Access::Read,
            Op::Write => Access::Write,
        };
        let check = front
            .protection
            .check(channel, request.addr.0, request.len_bytes, access);
        match check.outcome {
            CheckOutcome::Allowed => {}
            CheckOutcome::Missing => {
                return Err(ChannelRefusal::MissingRecord { steps: check.steps })
            }
            CheckOutcome::Denied => {
                return Err(ChannelRefusal::PermissionDenied { steps: check.steps })
            }
        }
        if !move_data() {
            return Err(ChannelRefusal::DataMovement);
        }
        let front = self.front_mut();
        let tag = front
            .retag
            .map(channel, virtual_tag)
            .expect("checked a physical tag is free");
        let device_request = DeviceRequest {
            token: channel_token(channel, virtual_tag),
            op: request.op,
            addr: request.addr,
            len_bytes: request.len_bytes,
            barrier: request.barrier,
            protection_ns: check.steps as Ns * front.tree_step_ns,
        };
        let submitted = if self.routed {
            self.device.submit_global(now_ns, tag, device_request)
        } else {
            self.device.submit(now_ns, tag, device_request)
        };
        if let Err(e) = submitted {
            self.front_mut().retag.release(tag);
            return Err(ChannelRefusal::Device(e));
        }
        self.collect_scheduled();
        Ok(tag)
    }

    /// Deliver every event due by `now_ns`, each at its own model time, and
    /// hand each finished request to `on_finished` (its physical tag already
    /// released by the retag stage). Returns the number of events delivered.
    pub fn deliver_due(&mut self, now_ns: Ns, mut on_finished: impl FnMut(Finished)) -> u64 {
        let mut delivered = 0;
        while self.queue.peek_time().is_some_and(|t| t <= now_ns) {
            let (t, due) = self.queue.pop().expect("peeked");
            self.model_time_ns = t;
            match due {
                Due::Device(event) => self.device.handle(t, event),
                Due::Packet(id) => {
                    let packet = self.arrivals[id as usize].take().expect("a stored packet");
                    self.free_arrivals.push(id);
                    self.device.receive(t, packet);
                }
            }
            self.collect_scheduled();
            std::mem::swap(&mut self.completions, &mut self.device.completions);
            for i in 0..self.completions.len() {
                let completion = self.completions[i];
                let channel_tag = self.front.as_mut().map(|f| {
                    let (channel, tag) = f.retag.release(completion.tag);
                    debug_assert_eq!(completion.token, channel_token(channel, tag));
                    (channel, tag)
                });
                on_finished(Finished {
                    completion,
                    channel_tag,
                });
            }
            self.completions.clear();
            delivered += 1;
        }
        delivered
    }
}

/// The completion token of a channel's request: (channel, virtual tag).
pub fn channel_token(channel: u16, virtual_tag: u8) -> u64 {
    (u64::from(channel) << 8) | u64::from(virtual_tag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::protection::{RecordSpec, Update, READ};

    fn request(op: Op, addr: u64, len_bytes: u64) -> ChannelRequest {
        ChannelRequest {
            op,
            addr: DeviceAddr(addr),
            len_bytes,
            barrier: false,
        }
    }

    #[test]
    fn a_port_driver_takes_wire_packets_and_refuses_ones_that_cannot_fit() {
        use crate::device::network::{HeaderFields, NetworkPort};
        use crate::device::packet::PacketKind;
        use crate::san::address_map::AddressMap;
        let c = Config::preset("quicksan-ssd").unwrap();
        let map = AddressMap::new(&[0, 1], c.device.capacity_bytes, false).unwrap();
        let port = NetworkPort::new(&c.network, map.route_table(0, true), 500);
        let mut d = DeviceDriver::with_port(&c, 1, 4, port);
        let header = |kind, size| {
            d.device().port().unwrap().header(
                kind,
                1,
                HeaderFields {
                    addr: 0,
                    cmd: 0,
                    offsets: 0,
                    tag: 0,
                    size,
                },
            )
        };
        let big = header(PacketKind::WriteRequest, 60_000);
        let small = header(PacketKind::WriteRequest, 4096);
        let read = header(PacketKind::ReadRequest, 4096);
        assert!(!d.port_can_hold(&big), "60 KB > the 32 KB receive buffer");
        assert!(d.port_can_hold(&small) && d.port_has_room(&small));
        // A peer's 4 KB read is served: its completion leaves the port.
        d.receive_packet(0, 1, read);
        while let Some(t) = d.next_event_time() {
            d.deliver_due(t, |_| {});
        }
        let sent: Vec<_> = d.port_output().drain(..).collect();
        assert!(
            sent.iter().any(|(_, o)| matches!(o, PortOutput::Packet(p)
                if p.header.kind == PacketKind::ReadCompletion && p.to_node == 1)),
            "{sent:?}"
        );
    }

    #[test]
    fn channel_requests_pass_retag_and_protection_and_stall_without_tags() {
        let mut c = Config::preset("moneta-d").unwrap();
        c.device.tags = 2;
        let mut d = DeviceDriver::with_channels(&c, 1, 4);
        d.protection_mut()
            .apply(&Update::Install(RecordSpec {
                channel: 1,
                file: 0,
                start: 0,
                len: 1 << 20,
                perms: READ,
            }))
            .unwrap();
        assert_eq!(
            d.submit_channel(0, 1, 9, request(Op::Write, 0, 512), || true),
            Err(ChannelRefusal::PermissionDenied { steps: 1 })
        );
        assert_eq!(
            d.submit_channel(0, 2, 0, request(Op::Read, 0, 512), || true),
            Err(ChannelRefusal::MissingRecord { steps: 0 })
        );
        d.submit_channel(0, 1, 9, request(Op::Read, 0, 512), || true)
            .unwrap();
        d.submit_channel(0, 1, 10, request(Op::Read, 4096, 512), || true)
            .unwrap();
        assert_eq!(
            d.submit_channel(0, 1, 11, request(Op::Read, 8192, 512), || true),
            Err(ChannelRefusal::Stalled)
        );
        let mut done = Vec::new();
        while let Some(t) = d.next_event_time() {
            d.deliver_due(t, |f| done.push(f));
        }
        let owners: Vec<_> = done.iter().map(|f| f.channel_tag).collect();
        assert_eq!(owners, vec![Some((1, 9)), Some((1, 10))]);
        assert!(d.retag_has_free());
    }
}
