//! The emulated device's QuickSAN network port on a real wire (SPEC §4.1–4.3,
//! Appendix A.6; issue 12 items 4 and 6): the model's port (`moneta_model::
//! device::network`, driven through `DeviceDriver::with_port`) decides what
//! leaves and when, in model time; this module moves the real frames and
//! the real bytes, through a `moneta_wire::Endpoint` owned by the device
//! thread.
//!
//! Each turn of the device thread (`DeviceThread::port_turn`):
//!
//! 1. the endpoint takes frames off the link and runs its timers;
//! 2. peer events: a failed peer fails or re-routes the segments waiting on
//!    it (`Device::peer_failed`: reads go to the replica, mirrored writes go
//!    on degraded); a peer heard again is used again;
//! 3. arrivals, oldest first, while the model's receive packet buffer has
//!    room (otherwise they stay in the endpoint's buffer, whose pause frames
//!    then stop the senders: the back-pressure of A.6). The bytes move on
//!    arrival, as the device moves a local command's bytes when it accepts
//!    it: a peer's write goes into the medium, a read completion's payload
//!    into the requesting client's DMA buffer; then the packet enters the
//!    model at the time it came off the wire;
//! 4. packets the model sent leave once the wall clock reaches the time
//!    their last bit left the model's port, each with its payload: a read
//!    completion's from the medium, a remote write's from the client's DMA
//!    buffer (whose bounds the device checked when it accepted the command).
//!
//! The model's own pause requests are dropped: the endpoint's 802.3x frames
//! replace them on a real wire.
//!
//! Mirroring and failover (SPEC §4.3, with what a DRBD user expects):
//!
//! - a write is acknowledged when both copies have it; while one holder is
//!   failed, its copy goes to the other holder flagged `CTRL_DEGRADED`
//!   (or, when that is this node, stays here), and **the holder of the live
//!   copy** records what its partner missed in its dirty map (`dirty.rs`,
//!   kept in a file beside the image);
//! - when the partner is heard again, the holder resyncs exactly the dirty
//!   granules from its copy (write requests tagged `RESYNC_TAG`; a granule
//!   is clear once acknowledged, unless it was written again meanwhile,
//!   then it goes again), and then says so (`SYNC_DONE_TAG`);
//! - a node that starts (or restarts) reads the copies it shares with a
//!   partner from that partner until the partner says it is in sync (the
//!   direction of the resync: the partner that stayed up holds the newer
//!   copies, and says which). A partner that is down is not waited for.
//! - each time two partners meet, each first says how many granules the
//!   other missed here (`MISSED_TAG`, DRBD's generations reduced to what
//!   decides the direction): the side that wrote alone resyncs the other;
//!   if both did (a partition with writers on both sides), that is split
//!   brain: neither resyncs, and stats list the partner.

use super::{DeviceThread, SLICE_BYTES};
use crate::dirty::{DirtyMap, GRANULE_BYTES};
use crate::wall_clock::StampClock;
use moneta_model::device::network::HeaderFields;
use moneta_model::device::network::{Packet, PortOutput};
use moneta_model::device::packet::{PacketHeader, PacketKind};
use moneta_model::device::pipeline::{PayloadSource, CMD_WRITE, CTRL_DEGRADED};
use moneta_model::units::Ns;
use moneta_wire::reliable::PeerState;
use moneta_wire::{Endpoint, Transport, WireError, WireEvent};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The TAG of a resync write (never a request index: those are below the
/// device's tags plus its peers' requests).
pub const RESYNC_TAG: u16 = u16::MAX;
/// The TAG of a completion that tells a partner it is in sync with us.
pub const SYNC_DONE_TAG: u16 = u16::MAX - 1;
/// The TAG of a completion that tells a partner, each time it comes up,
/// how many granules it missed here (its ADDR field).
pub const MISSED_TAG: u16 = u16::MAX - 2;
/// Resync writes in flight per peer at most.
const RESYNC_WINDOW: usize = 16;
/// The dirty map is saved at most this often while it changes.
const SAVE_INTERVAL_NS: Ns = 10_000_000;

/// A daemon's port: its endpoint on the wire and what the engine needs
/// around it. Built by the daemon from the SAN file.
pub struct SanPort {
    /// The routing registers and MAC table of this node (the SAN file's
    /// address map).
    pub routes: moneta_model::device::network::RouteTable,
    pub endpoint: Endpoint<Box<dyn Transport + Send>>,
    /// The nodes of the SAN (this one included), for status.
    pub nodes: u16,
    /// Where the dirty map of mirrored copies failed peers missed is kept
    /// (a file beside the image), if anywhere.
    pub dirty: DirtyMap,
}

/// What the port has done (`EngineStats::san`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PortStats {
    pub node: u16,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub payload_bytes_sent: u64,
    pub payload_bytes_received: u64,
    /// Packets the wire would not take (the peer failed) or whose segment
    /// had already given up on them.
    pub packets_dropped: u64,
    /// Turns a packet waited because its peer's window was full.
    pub window_waits: u64,
    /// Arrivals left on the wire for a turn because the receive packet
    /// buffer was full.
    pub rx_buffer_waits: u64,
    pub peer_failures: u64,
    /// Peers by node index: "up", "connecting" or "failed".
    pub peers: Vec<(u16, String)>,
    /// Bytes of mirrored copies waiting for a failed peer (resync).
    pub dirty_bytes: u64,
    /// Granules resynced to partners that came back.
    pub resync_granules: u64,
    /// Partners this node reads shared copies from until they say it is
    /// in sync (it started, or restarted).
    pub unsynced_partners: Vec<u16>,
    /// Saving the dirty map failed (the error), if it did.
    pub dirty_save_error: Option<String>,
    /// Mirror partners that missed writes here while this node missed
    /// writes there (both wrote degraded: a partition with writers on both
    /// sides). Neither side resyncs the other automatically.
    pub split_brain_peers: Vec<u16>,
    pub retransmits: u64,
    pub crc_errors: u64,
    pub pauses_sent: u64,
    pub pauses_received: u64,
}

pub(super) struct PortState {
    port: SanPort,
    /// Packets the model sent, waiting for their wall-clock time.
    outgoing: VecDeque<(Ns, Packet)>,
    scratch: Vec<u8>,
    nic_tx_ns: Ns,
    stats: PortStats,
    /// Resync writes in flight: (peer, its device address) → global
    /// address, and whether the granule was written again meanwhile.
    resyncing: BTreeMap<(u16, u64), (u64, bool)>,
    /// Partners told they are in sync with us (since they were last up).
    announced: BTreeSet<u16>,
    /// Partners told how many granules they missed here, and what each
    /// said it holds for us, since they were last up.
    told: BTreeSet<u16>,
    heard: BTreeMap<u16, u64>,
    /// Partners that missed writes here while we missed writes there.
    split_brain: BTreeSet<u16>,
    last_save_ns: Ns,
}

impl PortState {
    pub(super) fn new(port: SanPort, nic_tx_ns: Ns) -> PortState {
        let node = port.endpoint.config().node;
        PortState {
            scratch: vec![0; port.endpoint.max_payload_bytes().max(1 << 16)],
            port,
            outgoing: VecDeque::new(),
            nic_tx_ns,
            stats: PortStats {
                node,
                ..PortStats::default()
            },
            resyncing: BTreeMap::new(),
            announced: BTreeSet::new(),
            told: BTreeSet::new(),
            heard: BTreeMap::new(),
            split_brain: BTreeSet::new(),
            last_save_ns: 0,
        }
    }

    /// A write to global `[addr, addr + len)` reached this node's copy: a
    /// granule being resynced goes again after its acknowledgement (the
    /// resync may have carried the data from before the write).
    pub(super) fn note_write(&mut self, addr: u64, len: u64) {
        if self.resyncing.is_empty() || len == 0 {
            return;
        }
        let (first, last) = (addr / GRANULE_BYTES, (addr + len - 1) / GRANULE_BYTES);
        for (global, again) in self.resyncing.values_mut() {
            if (first..=last).contains(&(*global / GRANULE_BYTES)) {
                *again = true;
            }
        }
    }

    pub(super) fn stats(&self) -> PortStats {
        let mut s = self.stats.clone();
        let e = &self.port.endpoint;
        s.peers = e
            .config()
            .peers
            .iter()
            .map(|&p| {
                let state = match e.peer_state(p) {
                    Some(PeerState::Up) => "up",
                    Some(PeerState::Failed) => "failed",
                    _ => "connecting",
                };
                (p, state.to_string())
            })
            .collect();
        s.dirty_bytes = self.port.dirty.bytes();
        s.split_brain_peers = self.split_brain.iter().copied().collect();
        let w = e.stats();
        s.retransmits = w.retransmits;
        s.crc_errors = w.crc_errors;
        s.pauses_sent = w.pauses_sent;
        s.pauses_received = w.pauses_received;
        s
    }

    /// Nothing waits to leave and nothing has arrived.
    pub(super) fn is_quiet(&self) -> bool {
        self.outgoing.is_empty() && self.port.endpoint.pending_deliveries() == 0
    }
}

impl<C: StampClock> DeviceThread<C> {
    /// One turn of the port at `now` (module header). Returns whether it
    /// did anything.
    pub(super) fn port_turn(&mut self, now: Ns) -> bool {
        let Some(mut state) = self.port.take() else {
            return false;
        };
        let mut worked = state.port.endpoint.poll(now).unwrap_or(0) > 0;
        while let Some(event) = state.port.endpoint.next_event() {
            worked = true;
            let peer = match event {
                WireEvent::PeerFailed { peer, .. } => {
                    state.stats.peer_failures += 1;
                    self.driver.peer_failed(now, peer);
                    peer
                }
                WireEvent::PeerRestarted { peer, .. } => {
                    // What was in flight to its old self is lost: the
                    // segments waiting on it go degraded, as on a failure.
                    self.driver.peer_failed(now, peer);
                    self.driver.peer_up(peer);
                    peer
                }
                WireEvent::PeerUp { peer } => {
                    self.driver.peer_up(peer);
                    peer
                }
            };
            state.announced.remove(&peer);
            state.told.remove(&peer);
            state.heard.remove(&peer);
            state.split_brain.remove(&peer);
            state.resyncing.retain(|&(p, _), _| p != peer);
        }
        worked |= self.take_arrivals(&mut state, now);
        self.collect_port_output(&mut state);
        worked |= self.send_due(&mut state, now);
        worked |= self.resync(&mut state, now);
        if state.port.dirty.is_changed()
            && (now >= state.last_save_ns + SAVE_INTERVAL_NS || state.port.dirty.bytes() == 0)
        {
            state.last_save_ns = now;
            state.stats.dirty_save_error = state.port.dirty.save().err().map(|e| e.to_string());
        }
        state.stats.unsynced_partners = self
            .driver
            .routes_mut()
            .map(|r| r.unsynced().to_vec())
            .unwrap_or_default();
        self.port = Some(state);
        worked
    }

    /// Resync partners that are up from the dirty map, and tell those in
    /// sync that they are (module header).
    fn resync(&mut self, state: &mut PortState, now: Ns) -> bool {
        let mut worked = false;
        let peers = state.port.endpoint.config().peers.clone();
        for peer in peers {
            if state.port.endpoint.peer_state(peer) != Some(PeerState::Up) {
                continue;
            }
            // Generations, DRBD-style: each side first says how much the
            // other missed here; the side that wrote alone is the source.
            if !state.told.contains(&peer) {
                let missed = state.port.dirty.granules(peer);
                let header =
                    self.header_to(peer, PacketKind::WriteCompletion, missed, MISSED_TAG, 0);
                if state.port.endpoint.send(now, peer, header, &[]).is_ok() {
                    worked = true;
                    state.told.insert(peer);
                }
                continue;
            }
            let Some(&theirs) = state.heard.get(&peer) else {
                continue;
            };
            if theirs > 0 && !state.port.dirty.is_clean(peer) {
                if state.split_brain.insert(peer) {
                    eprintln!(
                        "monetad: split brain with node {peer}: it missed {} granules here and \
                         this node missed {theirs} there; neither is resynced (moneta stats: san)",
                        state.port.dirty.granules(peer)
                    );
                }
                continue;
            }
            if state.port.dirty.is_clean(peer) {
                if state.resyncing.keys().any(|&(p, _)| p == peer)
                    || state.announced.contains(&peer)
                {
                    continue;
                }
                let header = self.header_to(peer, PacketKind::WriteCompletion, 0, SYNC_DONE_TAG, 0);
                if state.port.endpoint.send(now, peer, header, &[]).is_ok() {
                    worked = true;
                    state.announced.insert(peer);
                }
                continue;
            }
            let in_flight = state.resyncing.keys().filter(|&&(p, _)| p == peer).count();
            if in_flight >= RESYNC_WINDOW {
                continue;
            }
            let routes = self.driver.device().port().expect("a port").routes.clone();
            for global in state.port.dirty.pending(peer, RESYNC_WINDOW * 4) {
                if state.resyncing.len() >= RESYNC_WINDOW + in_flight {
                    break;
                }
                let there = (0..2)
                    .filter_map(|c| routes.holder(global, c))
                    .find(|&(n, _)| n == peer);
                let (Some((_, at)), Some(local)) = (there, routes.local_copy(global)) else {
                    // Not a copy we share (a stale map): nothing to send.
                    state.port.dirty.clear(peer, global);
                    continue;
                };
                if state.resyncing.contains_key(&(peer, at)) {
                    continue;
                }
                let bytes = GRANULE_BYTES as usize;
                // SAFETY: scratch holds at least a granule.
                let read = unsafe {
                    self.shared
                        .medium
                        .read_into(local, state.scratch.as_mut_ptr(), bytes)
                };
                if read.is_err() {
                    continue;
                }
                let header =
                    self.header_to(peer, PacketKind::WriteRequest, at, RESYNC_TAG, bytes as u16);
                if state
                    .port
                    .endpoint
                    .send(now, peer, header, &state.scratch[..bytes])
                    .is_ok()
                {
                    worked = true;
                    state.resyncing.insert((peer, at), (global, false));
                }
            }
        }
        worked
    }

    fn header_to(
        &self,
        peer: u16,
        kind: PacketKind,
        addr: u64,
        tag: u16,
        size: u16,
    ) -> PacketHeader {
        self.driver.device().port().expect("a port").header(
            kind,
            peer,
            HeaderFields {
                addr,
                cmd: CMD_WRITE,
                offsets: 0,
                tag,
                size,
            },
        )
    }

    /// Model output of the last events: packets to send, missed copies.
    pub(super) fn collect_port_output(&mut self, state: &mut PortState) {
        for (t, out) in self.driver.port_output().drain(..) {
            if let PortOutput::Packet(p) = out {
                state
                    .outgoing
                    .push_back((t.saturating_sub(state.nic_tx_ns), p));
            }
        }
        for m in self.driver.missed().drain(..) {
            state.port.dirty.mark(m.node, m.addr, m.bytes);
        }
    }

    fn take_arrivals(&mut self, state: &mut PortState, now: Ns) -> bool {
        let mut worked = false;
        while let Some((from, header)) = state.port.endpoint.peek() {
            if !self.driver.port_can_hold(&header) {
                // Larger than the whole receive buffer: malformed, dropped.
                state.port.endpoint.recv(|_, _, _| ());
                state.stats.packets_dropped += 1;
                worked = true;
                continue;
            }
            if !self.driver.port_has_room(&header) {
                state.stats.rx_buffer_waits += 1;
                break;
            }
            worked = true;
            let scratch = &mut state.scratch;
            let got = state.port.endpoint.recv(|_, h, payload| {
                let n = payload.len();
                scratch[..n].copy_from_slice(payload);
                (*h, n)
            });
            let Some((h, n)) = got else { break };
            debug_assert_eq!(h, header);
            state.stats.packets_received += 1;
            state.stats.payload_bytes_received += n as u64;
            if h.kind == PacketKind::WriteCompletion && h.tag == RESYNC_TAG {
                if let Some((global, again)) = state.resyncing.remove(&(from, h.addr)) {
                    if !again {
                        state.port.dirty.clear(from, global);
                        state.stats.resync_granules += 1;
                    }
                }
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == MISSED_TAG {
                state.heard.insert(from, h.addr);
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == SYNC_DONE_TAG {
                if let Some(routes) = self.driver.routes_mut() {
                    routes.set_synced(from);
                }
                continue;
            }
            self.arrival_data(state, from, &h, n);
            self.driver.receive_packet(now, from, h);
        }
        worked
    }

    /// Move an arriving packet's bytes (module header, step 3): its
    /// payload is the first `len` bytes of the scratch buffer.
    fn arrival_data(&mut self, state: &mut PortState, from: u16, h: &PacketHeader, len: usize) {
        let payload = &state.scratch[..len];
        match h.kind {
            PacketKind::WriteRequest => {
                // Peers are trusted (SPEC §4.1) but the bounds are checked;
                // the model drops what does not fit, and so does this.
                let fits = h
                    .addr
                    .checked_add(len as u64)
                    .is_some_and(|end| end <= self.shared.medium.capacity_bytes());
                if !fits || len != h.payload_bytes() as usize {
                    return;
                }
                // SAFETY: `payload` is `len` readable bytes of our own buffer.
                let _ = unsafe { self.shared.medium.write_from(h.addr, payload.as_ptr(), len) };
                let routes = &self.driver.device().port().expect("a port").routes;
                let Some(global) = routes.global_of(h.addr) else {
                    return;
                };
                state.note_write(global, len as u64);
                if h.ctrl & CTRL_DEGRADED != 0 {
                    // The only live copy: record what the partner missed.
                    if let Some((partner, _)) = routes.other_holder(global) {
                        state.port.dirty.mark(partner, global, len as u64);
                    }
                }
            }
            PacketKind::ReadCompletion => {
                let Some((token, offset)) = self.driver.device().completion_destination(from, h)
                else {
                    return;
                };
                if let Some(dst) = self.dma_of(token, offset, len) {
                    // SAFETY: `dst` covers `len` bytes of the client's DMA
                    // buffer (bounds checked by `dma_of`), a separate mapping.
                    unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), dst, len) };
                }
            }
            _ => {}
        }
    }

    /// The DMA buffer bytes of a channel request's `offset..offset+len`.
    fn dma_of(&self, token: u64, offset: u64, len: usize) -> Option<*mut u8> {
        let (channel, tag) = ((token >> 8) as usize, (token & 0xFF) as usize);
        let ch = self.channels.get(channel)?.as_ref()?;
        ch.memory
            .dma_ptr(tag * SLICE_BYTES + usize::try_from(offset).ok()?, len)
    }

    /// Send the packets whose time has come (module header, step 4).
    fn send_due(&mut self, state: &mut PortState, now: Ns) -> bool {
        let mut worked = false;
        while state.outgoing.front().is_some_and(|&(t, _)| t <= now) {
            worked = true;
            let (_, p) = state.outgoing.pop_front().expect("checked");
            let bytes = p.header.payload_bytes() as usize;
            let have = match self.driver.device().payload_source(&p.header) {
                _ if bytes == 0 => true,
                Some(PayloadSource::Memory(addr)) => {
                    // SAFETY: scratch holds at least a packet's payload.
                    unsafe {
                        self.shared
                            .medium
                            .read_into(addr, state.scratch.as_mut_ptr(), bytes)
                            .is_ok()
                    }
                }
                Some(PayloadSource::Host { token, offset }) => {
                    match self.dma_of(token, offset, bytes) {
                        Some(src) => {
                            // SAFETY: `src` covers `bytes` of a DMA buffer; the
                            // client may change them concurrently (its own race).
                            unsafe {
                                std::ptr::copy_nonoverlapping(
                                    src,
                                    state.scratch.as_mut_ptr(),
                                    bytes,
                                )
                            };
                            true
                        }
                        None => false,
                    }
                }
                None => false,
            };
            if !have {
                state.stats.packets_dropped += 1;
                continue;
            }
            match state
                .port
                .endpoint
                .send(now, p.to_node, p.header, &state.scratch[..bytes])
            {
                Ok(()) => {
                    state.stats.packets_sent += 1;
                    state.stats.payload_bytes_sent += bytes as u64;
                }
                Err(WireError::WindowFull { .. }) => {
                    // The session's window is full: the packet waits (the
                    // port's one link sends in order), taken again next turn.
                    state.stats.window_waits += 1;
                    state.outgoing.push_front((now, p));
                    break;
                }
                // A failed peer: the model fails or re-routes what waits on it.
                Err(_) => state.stats.packets_dropped += 1,
            }
        }
        worked
    }
}
