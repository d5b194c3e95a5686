//! The QuickSAN network port (SPEC §4.1–4.2, Appendix A.6): the device
//! component that joins the pipeline to 10 Gb Ethernet.
//!
//! To the scheduler the port looks like the DMA engine and the ring (A.6):
//! a source of requests (packets from peers enter the request queues) and
//! a target of transfers (a segment whose address is not local leaves over
//! the port instead of the ring). The pipeline (`pipeline.rs`) drives the
//! state machines; this module holds the port's parts:
//!
//! - [`RouteTable`]: LOCALREQUESTMASK ANDed with the upper address bits,
//!   compared with LOCALREQUESTTAG, decides local or remote; the MAC table
//!   (here: the owner of each slice of the global space, as the
//!   configuration utility set it) names the peer. With mirroring each
//!   slice also has a replica on another node (SPEC §4.3).
//! - [`Transmitter`]: a link's sending side: a FIFO of frames at line rate,
//!   with the inter-frame gap, stopped between frames while the far end
//!   has paused it (IEEE 802.3x). The switch's output ports use it too.
//! - [`PauseGauge`]: buffer occupancy with the pause hysteresis (request
//!   pause at `on`, cancel below `off`), for the port's receive packet
//!   buffer and the switch's input buffers.
//! - [`RxPacketBuffer`]: the 32 KB receive packet buffer. A packet is
//!   written whole (8 B per 125 MHz cycle, A.6: an 8 KB packet +8192 ns)
//!   before it is processed. The words are written as they come off the
//!   link, so the write overlaps the packet's reception: A.6's 8192 ns are
//!   counted from the packet's first word, and since 8 B per 8 ns is
//!   slower than 10 Gb/s, a payload packet is stored some time after its
//!   last bit arrived
//!   ([`packet_buffer_tail_ns`](crate::config::packet_buffer_tail_ns)).
//!   Small (non-payload) packets have guaranteed space (SPEC §4.2
//!   deadlock rules) and do not count against it.
//!
//! Left out: frame checksum errors and drops (the model's links do not
//! corrupt), VLAN priorities (802.1Qbb).

use super::packet::{self, PacketHeader};
use crate::breakdown::{Component, DeviceParts};
use crate::config::NetworkConfig;
use crate::units::{transfer_ns, Ns};
use std::collections::VecDeque;

/// A packet in the simulation: the header that goes on the wire, and what
/// the simulator carries along with it (never encoded).
#[derive(Debug, Clone, Copy)]
pub struct Packet {
    pub header: PacketHeader,
    /// Node indices of the sending and receiving ports.
    pub from_node: u16,
    pub to_node: u16,
    /// The chain of the segment this packet serves, accounted up to its mark:
    /// a request and its completion carry it across the network so the
    /// source can report where the remote time went.
    pub chain: Chain,
    /// Sender side: the transfer buffer the payload leaves from, freed once
    /// the frame is on the wire.
    pub release_buffer: Option<u16>,
}

/// Device time by component, accounted up to `mark_ns`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Chain {
    pub parts: DeviceParts,
    pub mark_ns: Ns,
}

impl Chain {
    pub fn starting(mark_ns: Ns) -> Chain {
        Chain {
            parts: DeviceParts::default(),
            mark_ns,
        }
    }

    /// Account the time from the mark to `until_ns` to `component`.
    pub fn spend(&mut self, component: Component, until_ns: Ns) {
        debug_assert!(until_ns >= self.mark_ns, "time runs forward");
        self.parts.add(component, until_ns - self.mark_ns);
        self.mark_ns = until_ns;
    }

    /// A transfer from the mark to `until_ns` that takes `unloaded_ns` on
    /// an idle link or ring: the rest was `wait`.
    pub fn spend_transfer(
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

/// Where a segment's data lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// This device's memory, at this device-local byte address.
    Local(u64),
    /// A peer's memory: its node index and its device-local address.
    Remote { node: u16, addr: u64 },
}

/// Owners of one slice of the global space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SliceOwners {
    /// Node holding the primary copy, and the slice's base in its memory.
    pub primary: (u16, u64),
    /// Node holding the mirror copy (SPEC §4.3), and its base there.
    pub replica: Option<(u16, u64)>,
}

/// The state of this node's copy of a mirrored slice (DRBD's disk states,
/// issue 22): only an up-to-date copy serves reads or takes writes alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaState {
    /// Holds every acknowledged write (or its partner is the only one that
    /// may hold newer ones, and says it holds none).
    UpToDate,
    /// May have missed acknowledged writes: the node (re)started on an
    /// image that served before and has not yet heard from its partner
    /// what it missed, or was told it missed some and its resync has not
    /// begun. Never read; reads go to the partner or fail.
    Outdated,
    /// The target of a resync from its partner, in progress: some granules
    /// are old. Never read; reads go to the partner or fail.
    Inconsistent,
    /// Both copies took writes the other missed (a partition with writers
    /// on both sides). Neither is read or written until `moneta san
    /// resolve` discards one side.
    SplitBrain,
    /// Up to date when its partner was lost a moment ago: not read, no
    /// write alone, until this node knows whether the partner is alive
    /// behind a cut link or gone (the emulator's leases and tie-breaker,
    /// `moneta-emu`'s `engine::liveness`); then up to date or outdated.
    Suspended,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::UpToDate => "up-to-date",
            ReplicaState::Outdated => "outdated",
            ReplicaState::Inconsistent => "inconsistent",
            ReplicaState::SplitBrain => "split-brain",
            ReplicaState::Suspended => "suspended",
        }
    }
}

/// Why a request touching this node's copy of a slice is refused
/// ([`RouteTable::refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub slice: usize,
    pub state: ReplicaState,
    /// The other holder of the slice (down, or in split brain with us).
    pub partner: Option<u16>,
}

/// The port's routing registers and MAC table (SPEC §4.1).
#[derive(Debug, Clone)]
pub struct RouteTable {
    pub node: u16,
    /// LOCALREQUESTMASK / LOCALREQUESTTAG: a global address whose upper bits
    /// (masked) equal the tag has its primary copy here. A device without
    /// memory matches nothing (its tag has bits outside the mask).
    pub local_request_mask: u64,
    pub local_request_tag: u64,
    slice_shift: u32,
    slices: Vec<SliceOwners>,
    /// Round-robin position over replicas for remote reads.
    read_turn: u64,
    /// Peers declared failed (the emulator's wire reports them; the
    /// simulator's links never fail): reads avoid them while a replica is
    /// up, and mirrored writes skip them (degraded, SPEC §4.3).
    down: Vec<u16>,
    /// The state of this node's copy of each slice (slices it holds no
    /// copy of stay `UpToDate` and are never asked).
    states: Vec<ReplicaState>,
}

impl RouteTable {
    /// `slices[i]` owns global addresses `[i << slice_shift, (i+1) << slice_shift)`.
    pub fn new(node: u16, slice_shift: u32, slices: Vec<SliceOwners>, has_memory: bool) -> Self {
        let local_request_mask = !((1u64 << slice_shift) - 1);
        let own = slices.iter().position(|s| s.primary.0 == node);
        let local_request_tag = match (has_memory, own) {
            (true, Some(i)) => (i as u64) << slice_shift,
            // Bits outside the mask: no address ever matches.
            _ => 1,
        };
        RouteTable {
            node,
            local_request_mask,
            local_request_tag,
            slice_shift,
            read_turn: 0,
            down: Vec::new(),
            states: vec![ReplicaState::UpToDate; slices.len()],
            slices,
        }
    }

    /// The nodes holding the other copy of a slice this node holds.
    pub fn partners(&self) -> Vec<u16> {
        let mut partners: Vec<u16> = self
            .slices
            .iter()
            .filter_map(|s| {
                let (p, r) = (s.primary.0, s.replica?.0);
                match self.node {
                    n if n == p => Some(r),
                    n if n == r => Some(p),
                    _ => None,
                }
            })
            .collect();
        partners.sort_unstable();
        partners.dedup();
        partners
    }

    /// Every copy this node holds may have missed writes (it starts again
    /// on an image that served before): `Outdated` until each partner
    /// says what it missed.
    pub fn set_all_outdated(&mut self) {
        for slice in 0..self.slices.len() {
            if self.partner_of(slice).is_some() {
                self.states[slice] = ReplicaState::Outdated;
            }
        }
    }

    /// The state of this node's copy of `slice`.
    pub fn state(&self, slice: usize) -> ReplicaState {
        self.states
            .get(slice)
            .copied()
            .unwrap_or(ReplicaState::UpToDate)
    }

    pub fn set_state(&mut self, slice: usize, state: ReplicaState) {
        if let Some(s) = self.states.get_mut(slice) {
            *s = state;
        }
    }

    /// Number of slices of the global space.
    pub fn slice_count(&self) -> usize {
        self.slices.len()
    }

    pub fn slice_bytes(&self) -> u64 {
        1u64 << self.slice_shift
    }

    /// The slice global byte `addr` belongs to.
    pub fn slice_of(&self, addr: u64) -> usize {
        (addr >> self.slice_shift) as usize
    }

    /// The holders of `slice`'s two copies (primary first), if mirrored.
    pub fn holders(&self, slice: usize) -> Option<(u16, u16)> {
        let s = self.slices.get(slice)?;
        Some((s.primary.0, s.replica?.0))
    }

    /// The other holder of `slice`, if this node holds a mirrored copy of it.
    pub fn partner_of(&self, slice: usize) -> Option<u16> {
        let (p, r) = self.holders(slice)?;
        match self.node {
            n if n == p => Some(r),
            n if n == r => Some(p),
            _ => None,
        }
    }

    /// The slices this node and `partner` both hold a copy of.
    pub fn shared_slices(&self, partner: u16) -> Vec<usize> {
        (0..self.slices.len())
            .filter(|&s| self.partner_of(s) == Some(partner))
            .collect()
    }

    /// Partners holding a copy this node's copy is not up to date with
    /// (it reads from them while they are up).
    pub fn unsynced(&self) -> Vec<u16> {
        let mut v: Vec<u16> = (0..self.slices.len())
            .filter(|&s| self.states[s] != ReplicaState::UpToDate)
            .filter_map(|s| self.partner_of(s))
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Why a request on `[addr, addr + len)` may have found no copy, as
    /// this node sees it (a failed request's error names it, issue 22):
    /// each slice it touches, who holds the slice's copies, which of them
    /// this node counts as unreachable, and the state of its own copy.
    pub fn explain(&self, addr: u64, len: u64) -> String {
        let global = self.global_bytes();
        if addr >= global {
            return format!("byte {addr} is past the SAN's {global} bytes");
        }
        let last = addr.saturating_add(len.max(1) - 1).min(global - 1);
        let slice_bytes = self.slice_bytes();
        let mut parts = Vec::new();
        for slice in self.slice_of(addr)..=self.slice_of(last) {
            let Some(s) = self.slices.get(slice) else {
                continue;
            };
            let copies: Vec<String> = [Some(s.primary.0), s.replica.map(|r| r.0)]
                .into_iter()
                .flatten()
                .map(|n| match n {
                    n if n == self.node && s.replica.is_some() => {
                        format!(
                            "node {n} (this node; its copy is {})",
                            self.state(slice).as_str()
                        )
                    }
                    n if n == self.node => format!("node {n} (this node)"),
                    n if self.is_down(n) => format!("node {n} (unreachable)"),
                    n => format!("node {n} (up)"),
                })
                .collect();
            parts.push(format!(
                "slice {slice} (global bytes {}..{}) is held by {}",
                slice as u64 * slice_bytes,
                (slice as u64 + 1) * slice_bytes,
                copies.join(" and ")
            ));
        }
        let mut text = format!("seen from node {}: {}", self.node, parts.join("; "));
        if !self.has_quorum() {
            text += "; this node reaches no majority of the storage nodes (its copies \
                     whose partner it cannot reach are outdated)";
        }
        text
    }

    /// Whether a request on `[addr, addr + len)` must be refused because
    /// of this node's copies (issue 22): a copy in split brain is neither
    /// read nor written; a copy that is not up to date is not read, and
    /// takes no write alone, while its partner is down. (Reads of a copy
    /// that is not up to date go to the partner while it is up.)
    pub fn refusal(&self, addr: u64, len: u64) -> Option<Refusal> {
        if len == 0 || self.states.iter().all(|&s| s == ReplicaState::UpToDate) {
            return None;
        }
        let last = addr
            .saturating_add(len - 1)
            .min(self.global_bytes().saturating_sub(1));
        (self.slice_of(addr)..=self.slice_of(last)).find_map(|slice| {
            let partner = self.partner_of(slice)?;
            let state = self.states[slice];
            let refuse = match state {
                ReplicaState::UpToDate => false,
                ReplicaState::SplitBrain => true,
                _ => self.is_down(partner),
            };
            refuse.then_some(Refusal {
                slice,
                state,
                partner: Some(partner),
            })
        })
    }

    /// The global address of this node's device-local byte `local`, if it
    /// holds a copy there.
    pub fn global_of(&self, local: u64) -> Option<u64> {
        let slice_bytes = 1u64 << self.slice_shift;
        self.slices.iter().enumerate().find_map(|(i, s)| {
            [Some(s.primary), s.replica]
                .into_iter()
                .flatten()
                .find(|&(n, base)| n == self.node && (base..base + slice_bytes).contains(&local))
                .map(|(_, base)| ((i as u64) << self.slice_shift) + local - base)
        })
    }

    /// The holder of the copy of global `addr` that is not on this node.
    pub fn other_holder(&self, addr: u64) -> Option<(u16, u64)> {
        (0..2)
            .filter_map(|copy| self.holder(addr, copy))
            .find(|&(n, _)| n != self.node)
    }

    /// Mark `node` failed (`true`) or back (`false`).
    ///
    /// Quorum (found by `moneta san chaos`, issue 22 item 6): a node that
    /// reaches no more than half of the SAN's storage nodes, itself
    /// included, may be the cut-off side of a partition whose other side
    /// writes alone; so its up-to-date copies whose partner it cannot reach
    /// become `Outdated` (never read, no write alone) until that partner
    /// tells it what it missed. Without this a node healed from a partition
    /// served its old copy (to itself and to every peer that asked it)
    /// before it heard what its partner wrote meanwhile. A SAN of two has
    /// no majority to keep: the survivor goes on alone, as before.
    pub fn set_down(&mut self, node: u16, down: bool) {
        self.down.retain(|&n| n != node);
        if down {
            self.down.push(node);
        }
        if self.has_quorum() {
            return;
        }
        for slice in 0..self.slices.len() {
            let partner_down = self.partner_of(slice).is_some_and(|p| self.is_down(p));
            if partner_down && self.states[slice] == ReplicaState::UpToDate {
                self.states[slice] = ReplicaState::Outdated;
            }
        }
    }

    /// Whether this node reaches a strict majority of the storage nodes
    /// (those holding a copy of some slice), itself included; always in a
    /// SAN of fewer than three.
    pub fn has_quorum(&self) -> bool {
        let mut storage: Vec<u16> = self
            .slices
            .iter()
            .flat_map(|s| [Some(s.primary.0), s.replica.map(|r| r.0)])
            .flatten()
            .collect();
        storage.sort_unstable();
        storage.dedup();
        let n = storage.len();
        let down = storage.iter().filter(|&&x| self.is_down(x)).count();
        n < 3 || 2 * (n - down) > n
    }

    pub fn is_down(&self, node: u16) -> bool {
        self.down.contains(&node)
    }

    /// Where this node holds a copy of global byte `addr` (primary or
    /// replica), if it holds one: the device-local address.
    pub fn local_copy(&self, addr: u64) -> Option<u64> {
        if addr & self.local_request_mask == self.local_request_tag {
            return Some(addr & !self.local_request_mask);
        }
        let (owners, offset) = self.owners(addr);
        match owners.replica {
            Some((node, base)) if node == self.node => Some(base + offset),
            _ => None,
        }
    }

    /// The runs of `[addr, addr + len)` this node holds a copy of, in
    /// order: `f(offset in the range, device-local address, bytes)`. A
    /// run never crosses a slice (the copies of the next slice live
    /// elsewhere). The range must lie within the global space.
    pub fn local_runs(&self, addr: u64, len: u64, mut f: impl FnMut(u64, u64, u64)) {
        let slice_bytes = 1u64 << self.slice_shift;
        let mut offset = 0;
        while offset < len {
            let at = addr + offset;
            let bytes = (slice_bytes - (at & (slice_bytes - 1))).min(len - offset);
            if let Some(local) = self.local_copy(at) {
                f(offset, local, bytes);
            }
            offset += bytes;
        }
    }

    /// The node holding copy `copy` of global byte `addr` and its address
    /// there (this node's own included).
    pub fn holder(&self, addr: u64, copy: u8) -> Option<(u16, u64)> {
        let (owners, offset) = self.owners(addr);
        let (node, base) = match copy {
            0 => owners.primary,
            _ => owners.replica?,
        };
        Some((node, base + offset))
    }

    /// Size of the global space the table covers.
    pub fn global_bytes(&self) -> u64 {
        (self.slices.len() as u64) << self.slice_shift
    }

    pub fn mirrored(&self) -> bool {
        self.slices.first().is_some_and(|s| s.replica.is_some())
    }

    fn owners(&self, addr: u64) -> (SliceOwners, u64) {
        let slice = (addr >> self.slice_shift) as usize;
        let offset = addr & !self.local_request_mask;
        (self.slices[slice], offset)
    }

    fn target(&self, (node, base): (u16, u64), offset: u64) -> Target {
        if node == self.node {
            Target::Local(base + offset)
        } else {
            Target::Remote {
                node,
                addr: base + offset,
            }
        }
    }

    /// Copy `copy` (0: primary, 1: replica) of a write to `addr`.
    pub fn route_write(&self, addr: u64, copy: u8) -> Target {
        if copy == 0 && addr & self.local_request_mask == self.local_request_tag {
            return Target::Local(addr & !self.local_request_mask);
        }
        let (owners, offset) = self.owners(addr);
        match (copy, owners.replica) {
            (1, Some(replica)) => self.target(replica, offset),
            _ => self.target(owners.primary, offset),
        }
    }

    /// A read of `addr`: a local copy if there is one, else the replicas
    /// in turn (SPEC §4.3), skipping a failed one while the other is up.
    pub fn route_read(&mut self, addr: u64) -> Target {
        if let Some(local) = self.local_copy(addr) {
            // A copy that is not up to date is never read: its partner's
            // is, while up (the partner refuses if its own is not either);
            // a down partner fails the segment (`Device::detour`).
            return match self.other_holder(addr) {
                Some((node, at)) if self.states[self.slice_of(addr)] != ReplicaState::UpToDate => {
                    Target::Remote { node, addr: at }
                }
                _ => Target::Local(local),
            };
        }
        let (owners, offset) = self.owners(addr);
        let Some(replica) = owners.replica else {
            return self.target(owners.primary, offset);
        };
        match (self.is_down(owners.primary.0), self.is_down(replica.0)) {
            (true, false) => return self.target(replica, offset),
            (false, true) => return self.target(owners.primary, offset),
            _ => {}
        }
        self.read_turn += 1;
        if self.read_turn.is_multiple_of(2) {
            self.target(owners.primary, offset)
        } else {
            self.target(replica, offset)
        }
    }
}

/// A frame that started on a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Started<P> {
    pub item: P,
    pub start_ns: Ns,
    /// Its last bit has left the sender (preamble and frame, no gap).
    pub sent_ns: Ns,
    /// The link is free for the next frame (after the inter-frame gap).
    pub free_ns: Ns,
    pub wire_bytes: u64,
}

/// The sending side of a full-duplex link: frames in FIFO order at line
/// rate, paused between frames while the far end asks (802.3x). The owner
/// schedules a call to [`Transmitter::done`] at each started frame's
/// `free_ns`.
#[derive(Debug, Clone)]
pub struct Transmitter<P> {
    queue: VecDeque<(P, u64)>,
    /// The frame on the wire, if any.
    current: Option<P>,
    paused: bool,
    bytes_per_s: f64,
    wire_bytes_total: u64,
    frames: u64,
}

impl<P: Copy> Transmitter<P> {
    pub fn new(link_bits_per_s: f64) -> Self {
        Transmitter {
            queue: VecDeque::new(),
            current: None,
            paused: false,
            bytes_per_s: link_bits_per_s / 8.0,
            wire_bytes_total: 0,
            frames: 0,
        }
    }

    /// Queue a frame of `frame_bytes` (header and payload, without FCS).
    pub fn push(&mut self, now_ns: Ns, item: P, frame_bytes: u64) -> Option<Started<P>> {
        self.queue.push_back((item, frame_bytes));
        self.try_start(now_ns)
    }

    /// The frame on the wire has finished (its `free_ns`): returns it, and
    /// the next frame if one starts now.
    pub fn done(&mut self, now_ns: Ns) -> (P, Option<Started<P>>) {
        let finished = self.current.take().expect("a frame was on the wire");
        (finished, self.try_start(now_ns))
    }

    /// The far end requests (`true`) or cancels (`false`) a pause.
    pub fn set_paused(&mut self, now_ns: Ns, paused: bool) -> Option<Started<P>> {
        self.paused = paused;
        self.try_start(now_ns)
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Time of `frame_bytes` on this link until its last bit has left.
    pub fn arrival_ns(&self, frame_bytes: u64) -> Ns {
        transfer_ns(packet::arrival_bytes(frame_bytes), self.bytes_per_s)
    }

    fn try_start(&mut self, now_ns: Ns) -> Option<Started<P>> {
        if self.current.is_some() || self.paused {
            return None;
        }
        let (item, frame_bytes) = self.queue.pop_front()?;
        self.current = Some(item);
        let wire_bytes = packet::wire_bytes(frame_bytes);
        self.wire_bytes_total += wire_bytes;
        self.frames += 1;
        Some(Started {
            item,
            start_ns: now_ns,
            sent_ns: now_ns + self.arrival_ns(frame_bytes),
            free_ns: now_ns + transfer_ns(wire_bytes, self.bytes_per_s),
            wire_bytes,
        })
    }

    pub fn wire_bytes(&self) -> u64 {
        self.wire_bytes_total
    }

    pub fn frames(&self) -> u64 {
        self.frames
    }

    pub fn queued(&self) -> usize {
        self.queue.len() + usize::from(self.current.is_some())
    }
}

/// Buffer occupancy with pause hysteresis (A.6): request a pause when it
/// reaches `on_bytes`, cancel it below `off_bytes`.
#[derive(Debug, Clone)]
pub struct PauseGauge {
    capacity_bytes: u64,
    on_bytes: u64,
    off_bytes: u64,
    occupancy_bytes: u64,
    max_occupancy_bytes: u64,
    pausing: bool,
    pauses: u64,
}

impl PauseGauge {
    pub fn new(capacity_bytes: u64, on_bytes: u64, off_bytes: u64) -> Self {
        PauseGauge {
            capacity_bytes,
            on_bytes,
            off_bytes,
            occupancy_bytes: 0,
            max_occupancy_bytes: 0,
            pausing: false,
            pauses: 0,
        }
    }

    /// `bytes` enter; `Some(true)` when a pause must now be requested.
    pub fn fill(&mut self, bytes: u64) -> Option<bool> {
        self.occupancy_bytes += bytes;
        self.max_occupancy_bytes = self.max_occupancy_bytes.max(self.occupancy_bytes);
        assert!(
            self.occupancy_bytes <= self.capacity_bytes,
            "buffer overflow: {} of {} bytes (the pause thresholds leave too little room)",
            self.occupancy_bytes,
            self.capacity_bytes
        );
        if !self.pausing && self.occupancy_bytes >= self.on_bytes {
            self.pausing = true;
            self.pauses += 1;
            return Some(true);
        }
        None
    }

    /// `bytes` leave; `Some(false)` when the pause must now be cancelled.
    pub fn drain(&mut self, bytes: u64) -> Option<bool> {
        debug_assert!(bytes <= self.occupancy_bytes, "drained more than held");
        self.occupancy_bytes -= bytes;
        if self.pausing && self.occupancy_bytes < self.off_bytes {
            self.pausing = false;
            return Some(false);
        }
        None
    }

    pub fn occupancy_bytes(&self) -> u64 {
        self.occupancy_bytes
    }

    /// Whether `bytes` more fit (a receiver that must not overflow asks
    /// before it takes a packet off its link).
    pub fn has_room(&self, bytes: u64) -> bool {
        self.occupancy_bytes + bytes <= self.capacity_bytes
    }

    pub fn capacity_bytes(&self) -> u64 {
        self.capacity_bytes
    }

    pub fn max_occupancy_bytes(&self) -> u64 {
        self.max_occupancy_bytes
    }

    /// Pause requests sent so far.
    pub fn pauses(&self) -> u64 {
        self.pauses
    }
}

/// The port's receive packet buffer (A.6).
#[derive(Debug, Clone)]
pub struct RxPacketBuffer {
    pub gauge: PauseGauge,
    word_bytes: u64,
    cycle_ns: Ns,
    link_bytes_per_s: f64,
    /// The write port is busy storing an earlier packet until then.
    write_busy_until_ns: Ns,
}

impl RxPacketBuffer {
    pub fn new(n: &NetworkConfig) -> Self {
        RxPacketBuffer {
            gauge: PauseGauge::new(n.rx_buffer_bytes, n.pause_on_bytes, n.pause_off_bytes),
            word_bytes: n.packet_buffer_bytes_per_cycle,
            cycle_ns: n.port_clock_ns,
            link_bytes_per_s: n.link_bits_per_s / 8.0,
            write_busy_until_ns: 0,
        }
    }

    /// Bytes a packet occupies: whole words.
    pub fn stored_bytes(&self, header: &PacketHeader) -> u64 {
        header.frame_bytes().div_ceil(self.word_bytes) * self.word_bytes
    }

    /// Time to write a packet into the buffer, idle port.
    pub fn write_ns(&self, header: &PacketHeader) -> Ns {
        header.frame_bytes().div_ceil(self.word_bytes) * self.cycle_ns
    }

    /// A packet's last bit arrives at `arrival_ns` (the packets of the one
    /// link into the port are announced in their order on it): returns when
    /// it is written whole into the buffer and can be processed. The write
    /// started with its first word on the link (or once the write port
    /// finished the packet before), and ends no sooner than one cycle after
    /// the last word came.
    pub fn schedule_write(&mut self, arrival_ns: Ns, header: &PacketHeader) -> Ns {
        let on_link = transfer_ns(
            packet::arrival_bytes(header.frame_bytes()),
            self.link_bytes_per_s,
        );
        let start = arrival_ns
            .saturating_sub(on_link)
            .max(self.write_busy_until_ns);
        self.write_busy_until_ns = (start + self.write_ns(header)).max(arrival_ns + self.cycle_ns);
        self.write_busy_until_ns
    }

    /// The packet is here: a payload packet takes its space (small packets
    /// have their guaranteed space); `Some(true)` if that crossed the
    /// pause threshold.
    pub fn fill(&mut self, header: &PacketHeader) -> Option<bool> {
        if header.kind.has_payload() {
            self.gauge.fill(self.stored_bytes(header))
        } else {
            None
        }
    }

    /// A packet has arrived whole at `now_ns`: [`Self::schedule_write`]
    /// and [`Self::fill`] at once.
    pub fn arrive(&mut self, now_ns: Ns, header: &PacketHeader) -> (Ns, Option<bool>) {
        (self.schedule_write(now_ns, header), self.fill(header))
    }

    /// A payload packet's data has left the buffer.
    pub fn release(&mut self, header: &PacketHeader) -> Option<bool> {
        debug_assert!(header.kind.has_payload());
        self.gauge.drain(self.stored_bytes(header))
    }
}

/// Something the port hands to the fabric.
#[derive(Debug, Clone, Copy)]
pub enum PortOutput {
    /// A frame whose last bit reaches the switch at its time.
    Packet(Packet),
    /// The receive buffer requests (`true`) or cancels a pause of the link
    /// into this port, decided at its time.
    Pause(bool),
}

/// The port as the pipeline uses it: routing, the link's sending side, the
/// receive packet buffer and the network "DMA" out of it.
#[derive(Debug, Clone)]
pub struct NetworkPort {
    pub routes: RouteTable,
    pub tx: Transmitter<Packet>,
    pub rx: RxPacketBuffer,
    /// Fixed latency of the sending NIC (`san::fabric` derives it).
    pub nic_tx_ns: Ns,
    has_memory: bool,
    move_bytes_per_s: f64,
    move_busy_until_ns: Ns,
    /// Packets that did not make sense here (bad address, stale slot):
    /// dropped, as the hardware drops frames that fail its checks.
    pub dropped_packets: u64,
}

impl NetworkPort {
    pub fn new(n: &NetworkConfig, routes: RouteTable, nic_tx_ns: Ns) -> Self {
        NetworkPort {
            routes,
            tx: Transmitter::new(n.link_bits_per_s),
            rx: RxPacketBuffer::new(n),
            nic_tx_ns,
            has_memory: n.has_memory,
            move_bytes_per_s: n.buffer_move_bytes_per_s,
            move_busy_until_ns: 0,
            dropped_packets: 0,
        }
    }

    /// An SSD's port serves peers; a NIC's has no memory to serve from.
    pub fn routes_have_memory(&self) -> bool {
        self.has_memory
    }

    pub fn node(&self) -> u16 {
        self.routes.node
    }

    /// Move `bytes` from the packet buffer into a transfer buffer, starting
    /// at or after `now_ns` (one move at a time); returns when it is done.
    pub fn move_to_buffer(&mut self, now_ns: Ns, bytes: u64) -> Ns {
        let start = now_ns.max(self.move_busy_until_ns);
        self.move_busy_until_ns = start + transfer_ns(bytes, self.move_bytes_per_s);
        self.move_busy_until_ns
    }

    /// A header from this port to node `to`.
    pub fn header(&self, kind: packet::PacketKind, to: u16, fields: HeaderFields) -> PacketHeader {
        PacketHeader {
            kind,
            dest: packet::Mac::of_node(to),
            src: packet::Mac::of_node(self.node()),
            src_index: self.node(),
            addr: fields.addr,
            ctrl: 0,
            cmd: fields.cmd,
            offsets: fields.offsets,
            tag: fields.tag,
            size: fields.size,
        }
    }
}

/// The per-request fields of a header.
#[derive(Debug, Clone, Copy)]
pub struct HeaderFields {
    pub addr: u64,
    pub cmd: u8,
    pub offsets: u16,
    pub tag: u16,
    pub size: u16,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{packet_buffer_tail_ns, Config};

    #[test]
    fn transmitter_sends_in_order_and_stops_between_frames_while_paused() {
        let mut t: Transmitter<u32> = Transmitter::new(10e9);
        let a = t.push(0, 1, 32).unwrap();
        // 8 + 64 bytes until the last bit, +12 gap: 0.8 ns per byte.
        assert_eq!((a.sent_ns, a.free_ns), (58, 68));
        assert!(t.push(0, 2, 32 + 4096).is_none());
        // Paused mid-frame: the frame finishes, the next waits.
        assert!(t.set_paused(10, true).is_none());
        let (done, next) = t.done(68);
        assert_eq!((done, next), (1, None));
        let b = t.set_paused(500, false).unwrap();
        assert_eq!((b.item, b.start_ns), (2, 500));
        assert_eq!(t.frames(), 2);
    }

    #[test]
    fn gauge_pauses_at_a_quarter_and_releases_below_an_eighth() {
        let c = Config::preset("quicksan-ssd").unwrap();
        let mut rx = RxPacketBuffer::new(&c.network);
        let h = PacketHeader {
            kind: packet::PacketKind::WriteRequest,
            dest: packet::Mac::of_node(0),
            src: packet::Mac::of_node(1),
            src_index: 1,
            addr: 0,
            ctrl: 0,
            cmd: 2,
            offsets: 0,
            tag: 0,
            size: 4096,
        };
        // A.6: 8 B per 8 ns cycle: 4128 bytes → 516 cycles, from the first
        // word: the packet was 3312 ns on the link (4140 B at 10 Gb/s), so
        // it is stored 4128 − 3312 = 816 ns after its last bit.
        let (ready, pause) = rx.arrive(10_000, &h);
        assert_eq!((ready, pause), (10_816, None));
        assert_eq!(packet_buffer_tail_ns(&c.network, h.frame_bytes()), 816);
        // Back to back: the second packet's write waits for the first's.
        let (ready2, pause) = rx.arrive(10_000 + 3312, &h);
        assert_eq!((ready2, pause), (10_816 + 4128, Some(true)));
        assert_eq!(rx.release(&h), None);
        assert_eq!(rx.release(&h), Some(false));
        assert_eq!(rx.gauge.pauses(), 1);
        assert_eq!(rx.gauge.max_occupancy_bytes(), 2 * 4128);
    }

    #[test]
    fn routing_by_mask_and_tag_then_mac_table() {
        let slices = (0..4u16)
            .map(|i| SliceOwners {
                primary: (i, 0),
                replica: Some(((i + 1) % 4, 1 << 20)),
            })
            .collect();
        let mut t = RouteTable::new(2, 20, slices, true);
        assert_eq!(t.local_request_tag, 2 << 20);
        assert_eq!(t.route_write((2 << 20) + 5, 0), Target::Local(5));
        assert_eq!(
            t.route_write((2 << 20) + 5, 1),
            Target::Remote {
                node: 3,
                addr: (1 << 20) + 5
            }
        );
        // Slice 1's replica is here: reads of it stay local.
        assert_eq!(t.route_read((1 << 20) + 7), Target::Local((1 << 20) + 7));
        // Slice 0 (primary 0, replica 1): round robin.
        let a = t.route_read(9);
        let b = t.route_read(9);
        assert_ne!(a, b);
        let nic = RouteTable::new(9, 20, t.slices.clone(), false);
        assert_eq!(nic.local_request_tag, 1);
        assert_eq!(
            nic.route_write(2 << 20, 0),
            Target::Remote { node: 2, addr: 0 }
        );
    }

    /// A failed request's explanation names the slice, its holders, the
    /// unreachable one and this node's copy.
    #[test]
    fn explain_names_the_slice_its_holders_and_who_is_unreachable() {
        let slices: Vec<SliceOwners> = (0..3u16)
            .map(|i| SliceOwners {
                primary: (i, 0),
                replica: Some(((i + 1) % 3, 1 << 20)),
            })
            .collect();
        let mut t = RouteTable::new(1, 20, slices, true);
        t.set_down(2, true);
        t.set_down(0, true);
        let text = t.explain((1 << 20) + 4096, 4096);
        assert_eq!(
            text,
            "seen from node 1: slice 1 (global bytes 1048576..2097152) is held by node 1 \
             (this node; its copy is outdated) and node 2 (unreachable); this node reaches \
             no majority of the storage nodes (its copies whose partner it cannot reach are \
             outdated)"
        );
        // Across two slices; past the end.
        let text = t.explain((2 << 20) - 1, 2);
        assert!(text.contains("slice 1 ") && text.contains("slice 2 (global bytes 2097152..3145728) is held by node 2 (unreachable) and node 0 (unreachable)"), "{text}");
        assert_eq!(
            t.explain(3 << 20, 1),
            "byte 3145728 is past the SAN's 3145728 bytes"
        );
        assert!(t.explain(0, u64::MAX).contains("slice 2"));
    }

    /// Quorum: a node cut off from the majority stops trusting the copies
    /// whose partner it cannot reach; one failure among three does not.
    #[test]
    fn a_node_without_a_majority_outdates_the_copies_of_unreachable_partners() {
        let slices: Vec<SliceOwners> = (0..3u16)
            .map(|i| SliceOwners {
                primary: (i, 0),
                replica: Some(((i + 1) % 3, 1 << 20)),
            })
            .collect();
        // Node 1: primary of slice 1 (partner 2), replica of slice 0 (partner 0).
        let mut t = RouteTable::new(1, 20, slices.clone(), true);
        t.set_down(2, true);
        assert!(t.has_quorum());
        assert_eq!(t.state(1), ReplicaState::UpToDate, "one failure: degraded");
        t.set_down(0, true);
        assert!(!t.has_quorum());
        assert_eq!(t.state(1), ReplicaState::Outdated);
        assert_eq!(t.state(0), ReplicaState::Outdated);
        assert_eq!(
            t.state(2),
            ReplicaState::UpToDate,
            "no copy of slice 2 here"
        );
        // Partners back: still outdated until they say what was missed.
        t.set_down(0, false);
        t.set_down(2, false);
        assert_eq!(t.state(1), ReplicaState::Outdated);
        assert!(t.refusal(1 << 20, 4096).is_none(), "read from the partner");
        t.set_down(2, true);
        assert!(t.refusal(1 << 20, 4096).is_some(), "partner down: refused");
        // Two nodes: the survivor goes on.
        let two: Vec<SliceOwners> = (0..2u16)
            .map(|i| SliceOwners {
                primary: (i, 0),
                replica: Some(((i + 1) % 2, 1 << 20)),
            })
            .collect();
        let mut t = RouteTable::new(0, 20, two, true);
        t.set_down(1, true);
        assert!(t.has_quorum());
        assert_eq!(t.state(0), ReplicaState::UpToDate);
    }

    #[test]
    fn network_section_is_validated_naming_the_key() {
        let mut c = Config::preset("quicksan-ssd").unwrap();
        for (assignment, key) in [
            ("network.pause_off_bytes=8192", "network.pause_off_bytes"),
            ("network.rx_buffer_bytes=16384", "network.pause_on_bytes"),
            (
                "network.switch_port_buffer_bytes=16384",
                "network.switch_port_buffer_bytes",
            ),
            ("network.link_bits_per_s=0", "network.link_bits_per_s"),
            ("network.switch_hops=0", "network.switch_hops"),
            ("network.bogus=1", "network.bogus"),
        ] {
            let e = c.set(assignment).unwrap_err();
            assert_eq!(e.key, key, "{assignment}: {e}");
        }
        assert_eq!(c, Config::preset("quicksan-ssd").unwrap());
        let nic = Config::preset("quicksan-nic").unwrap();
        assert!(!nic.network.has_memory);
        assert_eq!(nic.device, c.device);
    }
}
