//! A daemon's network port on the real wire (SPEC §4.1–4.2, A.6; issue 12
//! items 1–2): one [`Endpoint`] per daemon, owned by its busy-polling device
//! thread. It sends QuickSAN packets to peers, takes the packets that
//! arrive, keeps every peer's session lossless (`reliable`), and reports
//! peer failures as [`WireEvent`]s.
//!
//! The receive buffer: frames that arrived and wait for the device (held
//! for reordering or queued for delivery) live in a fixed pool; payload
//! packets count against the model's receive packet buffer
//! (`moneta_model::device::network::RxPacketBuffer`, 32 KB in the
//! quicksan presets), whose gauge decides the 802.3x pause frames: pause
//! when it reaches 1/4, resume below 1/8 (A.6). A pause is sent to every
//! peer that is up, refreshed while it lasts, and honored by the sender:
//! no DATA frame leaves for `quanta` × 512 bit times of the link rate, but
//! the oldest unacknowledged one when its timeout passes (the receiver keeps
//! room for the frame it expects; frames held after a hole could otherwise
//! keep the pause up forever). Session-only frames (acknowledgements,
//! heartbeats) are MAC-control-like and flow during a pause. A payload frame
//! that would overflow the buffer is dropped (and comes again), as an
//! overflowing port drops; one out of order must leave room for an expected
//! one.
//!
//! SPEC §4.2's deadlock rules, as they apply here: the endpoint always
//! drains the link and handles what arrives without having to send first
//! (acknowledgements are state, sent when the link takes them; a full pool
//! still reads frames into a scratch buffer for their acknowledgements and
//! pauses); small, non-payload packets have their own guaranteed space
//! (`small_frames_max` slots, not counted by the gauge); read requests
//! allocate their buffer at the source and incoming writes have a dedicated
//! buffer in the device, which the daemon keeps, not this layer.
//!
//! Time is a parameter of every call (`now_ns`, any monotonic clock in ns):
//! the daemon passes its wall clock, the tests a manual one. Nothing here
//! allocates on the data path: frames, windows and the pool are allocated
//! when the endpoint is made (events about failed peers allocate the list of
//! lost packets, which is rare).

use crate::auth::Secret;
use crate::frame::{self, Parsed, SessionHeader, FLAG_DATA, FLAG_HELLO, PAYLOAD_OFFSET};
use crate::reliable::{
    epoch_newer, next_epoch, seq_before, PeerState, RxVerdict, Session, MAX_WINDOW_FRAMES,
};
use crate::transport::{PeerId, Transport};
use crate::WireError;
use moneta_model::config::{Config, NetworkConfig};
use moneta_model::device::network::RxPacketBuffer;
use moneta_model::device::packet::{Mac, PacketHeader, MAX_NODES};
use std::collections::VecDeque;

/// Frames taken from the link in one `poll` at most.
pub const RX_BATCH: usize = 32;
/// Events kept for the daemon at most (older ones are dropped, counted).
pub const MAX_EVENTS: usize = 1024;

/// The software port's receive buffer (see [`WireConfig::new`]); the
/// hardware's is the preset's `network.rx_buffer_bytes` (32 KB), which a
/// configuration may set here too.
pub const SOFTWARE_RX_BUFFER_BYTES: u64 = 1 << 20;

/// How an endpoint behaves.
#[derive(Debug, Clone)]
pub struct WireConfig {
    /// This node's index in the MAC table.
    pub node: PeerId,
    /// The other nodes.
    pub peers: Vec<PeerId>,
    /// The port: receive buffer and pause thresholds, link rate (for pause
    /// quanta). Default: the `quicksan-ssd` preset's, with a 1 MiB buffer.
    pub network: NetworkConfig,
    /// Unacknowledged frames per peer (1..=64).
    pub window_frames: u32,
    /// Least retransmission timeout (the first, before a round trip is
    /// measured; then SRTT + 4·RTTVAR, RFC 6298); doubles per retry up to
    /// `rto_max_ns`.
    pub rto_ns: u64,
    pub rto_max_ns: u64,
    /// Retries of one frame before the peer is failed.
    pub max_retransmits: u32,
    /// A peer silent this long is failed.
    pub peer_silence_ns: u64,
    /// A session-only frame goes out at least this often (heartbeat; probe
    /// while a peer is failed; a connecting one is probed every `rto_ns`).
    pub heartbeat_ns: u64,
    /// An acknowledgement waits this long for a frame to ride on.
    pub ack_delay_ns: u64,
    /// Received frames the pool holds (reorder, delivery queue).
    pub rx_pool_frames: usize,
    /// Of which small (non-payload) packets at most.
    pub small_frames_max: usize,
    /// Pause time asked for, in quanta of 512 bit times (refreshed at a
    /// third of it while the buffer stays above 1/8).
    pub pause_quanta: u16,
    /// This incarnation's epoch (default: from the real-time clock, so a
    /// restarted daemon is newer than its previous self).
    pub initial_epoch: Option<u32>,
    /// The SAN's shared secret: every frame is tagged with it and every
    /// frame without a valid tag is dropped (`auth`). None: frames carry
    /// no MAC and anyone on the segment can speak for a node.
    pub secret: Option<Secret>,
    /// A peer's newer epoch (a restart, a session it started over) is
    /// accepted at most this often; frames of a newer one in between are
    /// dropped (counted `epoch_changes_limited`) and come again.
    pub epoch_change_min_ns: u64,
}

impl WireConfig {
    pub fn new(node: PeerId, peers: &[PeerId]) -> WireConfig {
        let mut network = Config::preset("quicksan-ssd")
            .expect("the built-in quicksan-ssd preset loads")
            .network;
        // The hardware's 32 KB buffer drains at line rate as frames come;
        // a software receiver drains in batches and can be descheduled for
        // milliseconds, and a sender's window (32 frames of up to 8 KB)
        // leaves in one burst. So the software port's buffer is larger, with
        // A.6's thresholds kept as fractions: pause at 1/4, resume below 1/8.
        network.rx_buffer_bytes = SOFTWARE_RX_BUFFER_BYTES;
        network.pause_on_bytes = SOFTWARE_RX_BUFFER_BYTES / 4;
        network.pause_off_bytes = SOFTWARE_RX_BUFFER_BYTES / 8;
        WireConfig {
            node,
            peers: peers.to_vec(),
            network,
            window_frames: 32,
            rto_ns: 200_000,
            rto_max_ns: 64_000_000,
            max_retransmits: 12,
            peer_silence_ns: 1_000_000_000,
            heartbeat_ns: 10_000_000,
            ack_delay_ns: 20_000,
            rx_pool_frames: 256,
            small_frames_max: 128,
            pause_quanta: 0xFFFF,
            initial_epoch: None,
            secret: None,
            epoch_change_min_ns: 1_000_000_000,
        }
    }

    fn check(&self) -> Result<(), WireError> {
        let bad = |m: String| Err(WireError::Config(m));
        if !(1..=MAX_WINDOW_FRAMES).contains(&self.window_frames) {
            return bad(format!(
                "window_frames {} not in 1..={MAX_WINDOW_FRAMES}",
                self.window_frames
            ));
        }
        if self.node >= MAX_NODES || self.peers.iter().any(|&p| p >= MAX_NODES) {
            return bad(format!("node indices must be below {MAX_NODES}"));
        }
        if self.peers.contains(&self.node) {
            return bad(format!("node {} lists itself as a peer", self.node));
        }
        let mut sorted = self.peers.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.peers.len() {
            return bad("a peer is listed twice".into());
        }
        if self.rto_ns == 0 || self.rto_max_ns < self.rto_ns {
            return bad("rto_ns must be > 0 and ≤ rto_max_ns".into());
        }
        if self.heartbeat_ns == 0 || self.peer_silence_ns <= self.heartbeat_ns {
            return bad("peer_silence_ns must exceed heartbeat_ns > 0".into());
        }
        if self.rx_pool_frames <= self.small_frames_max || self.small_frames_max == 0 {
            return bad("rx_pool_frames must exceed small_frames_max > 0".into());
        }
        let n = &self.network;
        if n.pause_off_bytes >= n.pause_on_bytes || n.pause_on_bytes > n.rx_buffer_bytes {
            return bad("network: pause_off < pause_on ≤ rx_buffer_bytes".into());
        }
        if n.link_bits_per_s <= 0.0 {
            return bad("network.link_bits_per_s must be positive".into());
        }
        Ok(())
    }
}

/// What happened to a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireEvent {
    /// The peer answers (first contact, or back after a failure).
    PeerUp { peer: PeerId },
    /// The peer is silent past the bound (or out of retransmissions): these
    /// packets sent to it were not acknowledged and are lost; requests to
    /// it must fail.
    PeerFailed {
        peer: PeerId,
        lost: Vec<PacketHeader>,
    },
    /// The peer started a new session (it restarted, or it had failed us):
    /// these packets of the old one were not acknowledged and are lost.
    PeerRestarted {
        peer: PeerId,
        lost: Vec<PacketHeader>,
    },
}

/// Counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireStats {
    pub frames_sent: u64,
    pub frames_received: u64,
    pub data_sent: u64,
    pub retransmits: u64,
    pub control_sent: u64,
    pub delivered: u64,
    pub duplicates: u64,
    pub out_of_window: u64,
    pub crc_errors: u64,
    pub malformed: u64,
    pub stale: u64,
    pub overflow_drops: u64,
    pub pauses_sent: u64,
    pub resumes_sent: u64,
    pub pauses_received: u64,
    pub would_block: u64,
    pub peer_failures: u64,
    pub events_dropped: u64,
    /// Frames dropped for their authentication: no valid tag under this
    /// node's secret, or a tag where it has none.
    pub unauthenticated: u64,
    /// Authentic frames dropped as replays (a frame number already seen,
    /// or below the window; a pause naming an old epoch).
    pub replayed: u64,
    /// Frames of a peer's newer epoch dropped by the rate limit.
    pub epoch_changes_limited: u64,
}

/// A frame's place in the receive pool.
#[derive(Debug, Clone, Copy)]
struct PoolEntry {
    header: Option<PacketHeader>,
    from: u16,
}

/// One daemon's port on the wire.
pub struct Endpoint<T: Transport> {
    transport: T,
    config: WireConfig,
    local_mac: Mac,
    ethertype: u16,
    mtu_bytes: usize,
    sessions: Vec<Session>,
    /// Node index → session index (u16::MAX: not a peer).
    session_of: Vec<u16>,
    pool: Vec<Box<[u8]>>,
    entries: Vec<PoolEntry>,
    free: Vec<u32>,
    scratch: Box<[u8]>,
    control: Box<[u8]>,
    deliveries: VecDeque<u32>,
    rx: RxPacketBuffer,
    small_held: usize,
    pausing: bool,
    resume_pending: bool,
    /// The buffer just reached 1/4: send the pause at once.
    pause_pending: bool,
    pause_sent_ns: u64,
    /// One pause quantum (512 bit times) at the link rate.
    ns_per_quantum: f64,
    /// The pause this side asks for.
    pause_ns: u64,
    events: VecDeque<WireEvent>,
    stats: WireStats,
    /// The number of the next frame this endpoint puts on the wire.
    next_counter: u64,
}

fn epoch_from_clock() -> u32 {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(1);
    match ms as u32 {
        0 => 1,
        e => e,
    }
}

impl<T: Transport> Endpoint<T> {
    /// An endpoint on `transport`; `now_ns` starts the peers' silence clocks.
    pub fn new(transport: T, config: WireConfig, now_ns: u64) -> Result<Self, WireError> {
        config.check()?;
        let local_mac = transport.local_mac();
        let mtu_bytes = transport.mtu_bytes();
        if mtu_bytes < frame::PAUSE_FRAME_BYTES.max(frame::OVERHEAD_BYTES) {
            return Err(WireError::FrameTooLarge {
                frame_bytes: frame::OVERHEAD_BYTES,
                mtu_bytes,
            });
        }
        let frame_bytes = frame::MAX_FRAME_BYTES.min(mtu_bytes);
        let epoch = config.initial_epoch.unwrap_or_else(epoch_from_clock).max(1);
        let mut session_of = vec![u16::MAX; MAX_NODES as usize];
        let mut sessions = Vec::with_capacity(config.peers.len());
        for (i, &peer) in config.peers.iter().enumerate() {
            let mac = transport
                .peer_mac(peer)
                .ok_or(WireError::UnknownPeer { peer })?;
            session_of[usize::from(peer)] = i as u16;
            sessions.push(Session::new(
                peer,
                mac,
                epoch,
                config.window_frames,
                frame_bytes,
                now_ns,
            ));
        }
        // The receive pool takes whatever arrives: full frames of the link.
        let rx_frame_bytes = frame::MAX_FRAME_BYTES.max(mtu_bytes.min(64 * 1024));
        let pool = (0..config.rx_pool_frames)
            .map(|_| vec![0u8; rx_frame_bytes].into_boxed_slice())
            .collect();
        let n = &config.network;
        let ns_per_quantum = 512.0 * 1e9 / n.link_bits_per_s;
        let pause_ns = (f64::from(config.pause_quanta) * ns_per_quantum).ceil() as u64;
        Ok(Endpoint {
            ethertype: transport.ethertype(),
            rx: RxPacketBuffer::new(n),
            transport,
            local_mac,
            mtu_bytes,
            sessions,
            session_of,
            pool,
            entries: vec![
                PoolEntry {
                    header: None,
                    from: 0
                };
                config.rx_pool_frames
            ],
            free: (0..config.rx_pool_frames as u32).rev().collect(),
            scratch: vec![0u8; rx_frame_bytes].into_boxed_slice(),
            control: vec![0u8; 128].into_boxed_slice(),
            deliveries: VecDeque::with_capacity(config.rx_pool_frames),
            small_held: 0,
            pausing: false,
            resume_pending: false,
            pause_pending: false,
            pause_sent_ns: 0,
            ns_per_quantum,
            pause_ns,
            events: VecDeque::new(),
            stats: WireStats::default(),
            next_counter: 1,
            config,
        })
    }

    /// The number of a frame about to go on the wire (each transmission its
    /// own: 2^48 frames last years at line rate).
    fn take_counter(&mut self) -> u64 {
        let n = self.next_counter;
        self.next_counter = (n + 1).min(crate::auth::MAX_COUNTER);
        n
    }

    fn session_index(&self, peer: PeerId) -> Result<usize, WireError> {
        match self.session_of.get(usize::from(peer)) {
            Some(&i) if i != u16::MAX => Ok(usize::from(i)),
            _ => Err(WireError::UnknownPeer { peer }),
        }
    }

    /// Queue a QuickSAN packet to `peer` and send it if the session allows.
    /// The endpoint fills the addresses (MACs, source index); `header.size`
    /// must be `payload.len()` for packets that carry data.
    pub fn send(
        &mut self,
        now_ns: u64,
        peer: PeerId,
        mut header: PacketHeader,
        payload: &[u8],
    ) -> Result<(), WireError> {
        let i = self.session_index(peer)?;
        let payload_expected = header.payload_bytes() as usize;
        if payload.len() != payload_expected {
            return Err(WireError::BadPayload {
                header_size: payload_expected,
                payload_bytes: payload.len(),
            });
        }
        let s = &mut self.sessions[i];
        if s.state == PeerState::Failed {
            return Err(WireError::PeerFailed { peer });
        }
        if s.in_flight() >= s.window() {
            return Err(WireError::WindowFull { peer });
        }
        header.dest = s.mac;
        header.src = self.local_mac;
        header.src_index = self.config.node;
        let frame_bytes = frame::data_frame_bytes(&header);
        let slot_bytes = s.tx[0].frame.len();
        if frame_bytes > self.mtu_bytes || frame_bytes > slot_bytes {
            return Err(WireError::FrameTooLarge {
                frame_bytes,
                mtu_bytes: self.mtu_bytes,
            });
        }
        let k = s.slot_of(s.next_seq);
        let slot = &mut s.tx[k];
        slot.len = frame::encode_data(&mut slot.frame, &header, self.ethertype, payload)?;
        slot.header = Some(header);
        slot.sent_ns = None;
        slot.retries = 0;
        slot.sacked = false;
        s.next_seq = s.next_seq.wrapping_add(1);
        self.transmit_new(i, now_ns)
    }

    /// Send the queued frames of session `i` that may go now.
    fn transmit_new(&mut self, i: usize, now_ns: u64) -> Result<(), WireError> {
        loop {
            let s = &self.sessions[i];
            if s.state != PeerState::Up
                || !seq_before(s.next_unsent, s.next_seq)
                || now_ns < s.paused_until_ns
            {
                return Ok(());
            }
            let seq = s.next_unsent;
            self.transmit_data(i, seq, now_ns)?;
            let s = &mut self.sessions[i];
            s.next_unsent = seq.wrapping_add(1);
        }
    }

    /// Put frame `seq` of session `i` on the link (first time or again),
    /// with the current acknowledgement.
    fn transmit_data(&mut self, i: usize, seq: u32, now_ns: u64) -> Result<(), WireError> {
        let counter = self.take_counter();
        let s = &mut self.sessions[i];
        let session = SessionHeader {
            flags: FLAG_DATA,
            src_epoch: s.local_epoch,
            dst_epoch: s.peer_epoch.unwrap_or(0),
            seq,
            ack: s.expected,
            sack: s.sack_bits(),
            counter,
        };
        let k = s.slot_of(seq);
        let backoff = {
            let rto = s.rto_ns(self.config.rto_ns, self.config.rto_max_ns);
            let shift = s.tx[k].retries.min(20);
            (rto << shift).min(self.config.rto_max_ns)
        };
        let slot = &mut s.tx[k];
        frame::seal(
            &mut slot.frame,
            slot.len,
            &session,
            self.config.secret.as_ref(),
        );
        let retransmit = slot.sent_ns.is_some();
        slot.sent_ns = Some(now_ns);
        slot.due_ns = now_ns + backoff;
        s.next_timer_ns = s.next_timer_ns.min(slot.due_ns);
        s.ack_due_ns = None;
        s.last_sent_ns = now_ns;
        let peer = s.peer;
        let r = self.transport.send(now_ns, peer, &slot.frame[..slot.len]);
        self.stats.frames_sent += 1;
        self.stats.data_sent += 1;
        if retransmit {
            self.stats.retransmits += 1;
        }
        self.count_send(r)
    }

    fn count_send(&mut self, r: Result<(), WireError>) -> Result<(), WireError> {
        match r {
            Err(WireError::WouldBlock) => {
                // Lost; the timers send it again.
                self.stats.would_block += 1;
                Ok(())
            }
            other => other,
        }
    }

    /// Send a session-only frame (acknowledgement, heartbeat, probe).
    fn send_control(&mut self, i: usize, now_ns: u64) -> Result<(), WireError> {
        let counter = self.take_counter();
        let s = &mut self.sessions[i];
        let session = SessionHeader {
            flags: if s.state == PeerState::Up {
                0
            } else {
                FLAG_HELLO
            },
            src_epoch: s.local_epoch,
            dst_epoch: s.peer_epoch.unwrap_or(0),
            seq: 0,
            ack: s.expected,
            sack: s.sack_bits(),
            counter,
        };
        let len = frame::encode_control(
            &mut self.control,
            s.mac,
            self.local_mac,
            self.config.node,
            self.ethertype,
            &session,
            self.config.secret.as_ref(),
        );
        s.ack_due_ns = None;
        s.last_sent_ns = now_ns;
        let peer = s.peer;
        let r = self.transport.send(now_ns, peer, &self.control[..len]);
        self.stats.frames_sent += 1;
        self.stats.control_sent += 1;
        self.count_send(r)
    }

    /// Send an 802.3x pause (`quanta` > 0) or resume (0) to every peer up.
    fn send_pause(&mut self, quanta: u16, now_ns: u64) -> Result<(), WireError> {
        for i in 0..self.sessions.len() {
            if self.sessions[i].state != PeerState::Up {
                continue;
            }
            let pause = frame::Pause {
                quanta,
                epoch: self.sessions[i].local_epoch,
                counter: self.take_counter(),
            };
            let s = &self.sessions[i];
            let len = frame::encode_pause(
                &mut self.control,
                s.mac,
                self.local_mac,
                &pause,
                self.config.secret.as_ref(),
            );
            let peer = s.peer;
            let r = self.transport.send(now_ns, peer, &self.control[..len]);
            self.stats.frames_sent += 1;
            self.count_send(r)?;
        }
        if quanta > 0 {
            self.stats.pauses_sent += 1;
            self.pause_sent_ns = now_ns;
        } else {
            self.stats.resumes_sent += 1;
        }
        Ok(())
    }

    /// Take frames from the link, run the timers (retransmission, failure,
    /// acknowledgements, heartbeats, pause refresh). Returns the frames
    /// taken. Call it in the device thread's loop.
    pub fn poll(&mut self, now_ns: u64) -> Result<usize, WireError> {
        let mut taken = 0;
        for _ in 0..RX_BATCH {
            let slot = self.free.pop();
            let mut buf = match slot {
                Some(k) => std::mem::take(&mut self.pool[k as usize]),
                None => std::mem::take(&mut self.scratch),
            };
            let got = self.transport.poll_recv(now_ns, &mut buf);
            let kept = match got {
                Ok(Some((from, len))) => {
                    taken += 1;
                    self.stats.frames_received += 1;
                    self.on_frame(now_ns, from, &mut buf, len, slot)
                }
                _ => false,
            };
            match slot {
                Some(k) => {
                    self.pool[k as usize] = buf;
                    if !kept {
                        self.free.push(k);
                    }
                }
                None => self.scratch = buf,
            }
            match got {
                Ok(Some(_)) => {}
                Ok(None) => break,
                Err(e) => return Err(e),
            }
        }
        self.run_timers(now_ns)?;
        Ok(taken)
    }

    /// Handle one arrived frame in `buf`; true if it is kept (pool slot).
    fn on_frame(
        &mut self,
        now_ns: u64,
        from: PeerId,
        buf: &mut [u8],
        len: usize,
        slot: Option<u32>,
    ) -> bool {
        let secret = self.config.secret.as_ref();
        let parsed = match frame::parse(&mut buf[..len], self.ethertype, self.local_mac, secret) {
            Ok(p) => p,
            Err(frame::FrameError::BadCrc) => {
                self.stats.crc_errors += 1;
                return false;
            }
            Err(frame::FrameError::Unauthenticated) => {
                self.stats.unauthenticated += 1;
                return false;
            }
            Err(_) => {
                self.stats.malformed += 1;
                return false;
            }
        };
        let Ok(i) = self.session_index(from) else {
            self.stats.malformed += 1;
            return false;
        };
        match parsed {
            Parsed::Pause { src, pause } => {
                let authenticated = self.config.secret.is_some();
                let s = &mut self.sessions[i];
                if src != s.mac {
                    self.stats.malformed += 1;
                    return false;
                }
                // An authentic pause counts only in the peer's current
                // session and once (a recorded one replayed would stop us).
                if authenticated
                    && (s.peer_epoch != Some(pause.epoch) || !s.replay.accept(pause.counter))
                {
                    self.stats.replayed += 1;
                    return false;
                }
                self.stats.pauses_received += 1;
                s.paused_until_ns = if pause.quanta == 0 {
                    0
                } else {
                    now_ns + (f64::from(pause.quanta) * self.ns_per_quantum).ceil() as u64
                };
                false
            }
            Parsed::Session {
                src,
                src_index,
                session,
                packet,
                ..
            } => {
                if src_index != from || src != self.sessions[i].mac {
                    self.stats.malformed += 1;
                    return false;
                }
                self.on_session_frame(now_ns, i, &session, packet, slot)
            }
        }
    }

    fn on_session_frame(
        &mut self,
        now_ns: u64,
        i: usize,
        h: &SessionHeader,
        packet: Option<PacketHeader>,
        slot: Option<u32>,
    ) -> bool {
        let authenticated = self.config.secret.is_some();
        let min_ns = self.config.epoch_change_min_ns;
        let s = &mut self.sessions[i];
        match s.last_peer_epoch {
            Some(e) if e == h.src_epoch => {
                if authenticated && !s.replay.accept(h.counter) {
                    self.stats.replayed += 1;
                    return false;
                }
                // Back after this side failed it: the same session.
                s.peer_epoch = Some(e);
            }
            // Stale while the session is live. Once this side has failed
            // the peer, any epoch starts a new session (rate-limited): a
            // node restarted after its clock epoch wrapped past the
            // newest seen (2^31 ms, ~24.8 days) must still rejoin; a
            // replayed old epoch then costs one reset at most.
            Some(e) if !epoch_newer(h.src_epoch, e) && s.peer_epoch.is_some() => {
                self.stats.stale += 1;
                return false;
            }
            Some(_) => {
                if s.epoch_changed_ns
                    .is_some_and(|t| now_ns < t.saturating_add(min_ns))
                {
                    self.stats.epoch_changes_limited += 1;
                    return false;
                }
                s.epoch_changed_ns = Some(now_ns);
                s.last_peer_epoch = Some(h.src_epoch);
                s.replay.restart(h.counter);
                if s.peer_epoch.is_some() {
                    // A new session from the peer: ours with its old self is over.
                    let lost = self.reset_session(i);
                    self.push_event(WireEvent::PeerRestarted {
                        peer: self.sessions[i].peer,
                        lost,
                    });
                }
                self.sessions[i].peer_epoch = Some(h.src_epoch);
            }
            None => {
                s.last_peer_epoch = Some(h.src_epoch);
                s.replay.restart(h.counter);
                s.peer_epoch = Some(h.src_epoch);
            }
        }
        let s = &mut self.sessions[i];
        s.last_heard_ns = now_ns;
        if s.state != PeerState::Up {
            s.state = PeerState::Up;
            let peer = s.peer;
            self.push_event(WireEvent::PeerUp { peer });
        }
        let s = &mut self.sessions[i];
        if h.dst_epoch != s.local_epoch {
            // It does not know this side's current session yet: tell it.
            s.ack_due_ns = Some(now_ns);
            return false;
        }
        s.on_ack(h.ack, h.sack, now_ns);
        if h.flags & FLAG_HELLO != 0 {
            s.ack_due_ns = Some(now_ns);
        }
        let Some(packet) = packet else {
            return false;
        };
        let k = match s.rx_verdict(h.seq) {
            RxVerdict::Slot(k) => k,
            RxVerdict::Duplicate => {
                self.stats.duplicates += 1;
                s.ack_due_ns = Some(now_ns);
                return false;
            }
            RxVerdict::OutOfWindow => {
                self.stats.out_of_window += 1;
                s.ack_due_ns = Some(now_ns);
                return false;
            }
        };
        // Space: payload packets in the buffer the gauge watches, small
        // ones in their own guaranteed slots.
        let Some(pool_slot) = slot else {
            self.stats.overflow_drops += 1;
            return false;
        };
        let payload = packet.kind.has_payload();
        // A frame out of order must leave room (bytes, a small slot, a pool
        // slot) for a frame that is expected, or a buffer full of frames
        // after holes would drop the frames that fill them, forever.
        let in_order = h.seq == s.expected;
        let fits = if payload {
            let reserve = if in_order {
                0
            } else {
                self.config.network.max_stored_bytes()
            };
            self.rx.gauge.occupancy_bytes() + self.rx.stored_bytes(&packet) + reserve
                <= self.config.network.rx_buffer_bytes
        } else {
            self.small_held + usize::from(!in_order) < self.config.small_frames_max
        } && (in_order || !self.free.is_empty());
        if !fits {
            self.stats.overflow_drops += 1;
            return false;
        }
        if payload {
            if self.rx.fill(&packet) == Some(true) {
                self.pausing = true;
                self.resume_pending = false;
                self.pause_pending = true;
            }
        } else {
            self.small_held += 1;
        }
        self.entries[pool_slot as usize] = PoolEntry {
            header: Some(packet),
            from: i as u16,
        };
        let s = &mut self.sessions[i];
        s.held[k] = Some(pool_slot);
        // Deliver what is now in order.
        loop {
            let k = s.slot_of(s.expected);
            let Some(p) = s.held[k].take() else { break };
            self.deliveries.push_back(p);
            s.expected = s.expected.wrapping_add(1);
        }
        let due = if in_order {
            now_ns + self.config.ack_delay_ns
        } else {
            now_ns
        };
        s.ack_due_ns = Some(s.ack_due_ns.map_or(due, |d| d.min(due)));
        true
    }

    /// Forget session `i`'s sequences: its unacknowledged packets (returned)
    /// and the frames held out of order (freed).
    fn reset_session(&mut self, i: usize) -> Vec<PacketHeader> {
        let mut lost = Vec::new();
        let s = &mut self.sessions[i];
        s.restart_sequences(&mut lost);
        let held: Vec<u32> = s.take_held().collect();
        for p in held {
            self.release_slot(p);
        }
        lost
    }

    /// Return pool slot `p` and its share of the receive buffer.
    fn release_slot(&mut self, p: u32) {
        if let Some(h) = self.entries[p as usize].header.take() {
            if h.kind.has_payload() {
                if self.rx.release(&h) == Some(false) {
                    self.pausing = false;
                    self.resume_pending = true;
                }
            } else {
                self.small_held -= 1;
            }
        }
        self.free.push(p);
    }

    fn fail(&mut self, i: usize) {
        let lost = self.reset_session(i);
        let s = &mut self.sessions[i];
        s.state = PeerState::Failed;
        s.local_epoch = next_epoch(s.local_epoch);
        s.peer_epoch = None;
        let peer = s.peer;
        self.stats.peer_failures += 1;
        self.push_event(WireEvent::PeerFailed { peer, lost });
    }

    fn push_event(&mut self, e: WireEvent) {
        if self.events.len() >= MAX_EVENTS {
            self.events.pop_front();
            self.stats.events_dropped += 1;
        }
        self.events.push_back(e);
    }

    fn run_timers(&mut self, now_ns: u64) -> Result<(), WireError> {
        for i in 0..self.sessions.len() {
            let s = &self.sessions[i];
            if s.state != PeerState::Failed
                && now_ns.saturating_sub(s.last_heard_ns) > self.config.peer_silence_ns
            {
                self.fail(i);
                continue;
            }
            if s.state == PeerState::Up
                && now_ns >= s.next_timer_ns
                && self.retransmit_due(i, now_ns)?
            {
                self.fail(i);
                continue;
            }
            self.transmit_new(i, now_ns)?;
            let s = &self.sessions[i];
            let ack_due = s.ack_due_ns.is_some_and(|d| d <= now_ns);
            // A session being set up probes at the retransmission pace; an
            // established or failed one at the heartbeat's.
            let interval = match s.state {
                PeerState::Connecting => self.config.rto_ns,
                _ => self.config.heartbeat_ns,
            };
            let idle = s.last_sent_ns == 0 || now_ns.saturating_sub(s.last_sent_ns) >= interval;
            if ack_due || idle {
                self.send_control(i, now_ns)?;
            }
        }
        if self.resume_pending {
            self.resume_pending = false;
            self.send_pause(0, now_ns)?;
        }
        if self.pausing
            && (self.pause_pending
                || now_ns.saturating_sub(self.pause_sent_ns) >= self.pause_ns / 3)
        {
            self.pause_pending = false;
            self.send_pause(self.config.pause_quanta, now_ns)?;
        }
        Ok(())
    }

    /// Send again the frames of session `i` whose timeout passed; true if
    /// one ran out of retries (the peer must be failed).
    fn retransmit_due(&mut self, i: usize, now_ns: u64) -> Result<bool, WireError> {
        let s = &mut self.sessions[i];
        s.next_timer_ns = u64::MAX;
        // Paused, only the oldest unacknowledged frame may go again: the
        // receiver keeps room for the frame it expects, and a pause that
        // frames held after a hole keep up would otherwise never end. A
        // peer that pauses is alive: its retries do not fail it.
        let paused = now_ns < s.paused_until_ns;
        if paused {
            s.next_timer_ns = s.paused_until_ns;
        }
        let mut seq = s.una;
        while seq_before(seq, self.sessions[i].next_unsent) {
            let s = &mut self.sessions[i];
            if paused && seq != s.una {
                break;
            }
            let k = s.slot_of(seq);
            let slot = &mut s.tx[k];
            if slot.sent_ns.is_some() && !slot.sacked {
                if slot.due_ns <= now_ns {
                    slot.retries += 1;
                    if slot.retries > self.config.max_retransmits && !paused {
                        return Ok(true);
                    }
                    self.transmit_data(i, seq, now_ns)?;
                } else {
                    s.next_timer_ns = s.next_timer_ns.min(slot.due_ns);
                }
            }
            seq = seq.wrapping_add(1);
        }
        Ok(false)
    }

    /// Hand the oldest delivered packet to `f` (its sender, header and
    /// payload), then free its place in the receive buffer. Packets of one
    /// peer come in the order it sent them, each once.
    pub fn recv<R>(&mut self, f: impl FnOnce(PeerId, &PacketHeader, &[u8]) -> R) -> Option<R> {
        let p = self.deliveries.pop_front()?;
        let entry = self.entries[p as usize];
        let header = entry.header.expect("a delivered frame has its header");
        let peer = self.sessions[usize::from(entry.from)].peer;
        let bytes = header.payload_bytes() as usize;
        let r = f(
            peer,
            &header,
            &self.pool[p as usize][PAYLOAD_OFFSET..PAYLOAD_OFFSET + bytes],
        );
        self.stats.delivered += 1;
        self.release_slot(p);
        Some(r)
    }

    /// The sender and header of the packet `recv` would hand over next,
    /// without taking it (a device whose buffer is full leaves it here, and
    /// the pause frames follow from this buffer filling).
    pub fn peek(&self) -> Option<(PeerId, PacketHeader)> {
        let &p = self.deliveries.front()?;
        let entry = self.entries[p as usize];
        Some((self.sessions[usize::from(entry.from)].peer, entry.header?))
    }

    /// The next peer event, if any.
    pub fn next_event(&mut self) -> Option<WireEvent> {
        self.events.pop_front()
    }

    pub fn peer_state(&self, peer: PeerId) -> Option<PeerState> {
        self.session_index(peer)
            .ok()
            .map(|i| self.sessions[i].state)
    }

    /// Packets sent or queued to `peer` and not yet acknowledged.
    pub fn in_flight(&self, peer: PeerId) -> Option<u32> {
        self.session_index(peer)
            .ok()
            .map(|i| self.sessions[i].in_flight())
    }

    /// Whether `peer` has paused this side's sending at `now_ns`.
    pub fn paused_by(&self, peer: PeerId, now_ns: u64) -> bool {
        self.session_index(peer)
            .is_ok_and(|i| now_ns < self.sessions[i].paused_until_ns)
    }

    /// Whether this side asks its peers to pause (buffer past 1/4).
    pub fn pausing(&self) -> bool {
        self.pausing
    }

    /// Bytes of payload packets held in the receive buffer.
    pub fn rx_occupancy_bytes(&self) -> u64 {
        self.rx.gauge.occupancy_bytes()
    }

    /// Packets delivered and not yet taken by `recv`.
    /// Nothing of the session layer waits on a timer shorter than the
    /// heartbeat: every frame sent is acknowledged and none waits to go, no
    /// acknowledgement is owed, no frame is held out of order or waits to
    /// be taken, no pause is to be refreshed or lifted, no session is
    /// being set up (its probes run at the retransmission pace), and the
    /// link holds nothing back. An owner that turns the endpoint can then
    /// wait longer between turns (the next heartbeat is milliseconds away).
    pub fn is_idle(&self) -> bool {
        !self.pausing
            && !self.resume_pending
            && self.deliveries.is_empty()
            && !self.transport.holds_frames()
            && self.sessions.iter().all(|s| {
                s.una == s.next_seq
                    && s.ack_due_ns.is_none()
                    && s.state != PeerState::Connecting
                    && s.held.iter().all(Option::is_none)
            })
    }

    pub fn pending_deliveries(&self) -> usize {
        self.deliveries.len()
    }

    pub fn stats(&self) -> WireStats {
        self.stats
    }

    pub fn config(&self) -> &WireConfig {
        &self.config
    }

    pub fn transport(&self) -> &T {
        &self.transport
    }

    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.transport
    }

    /// Largest payload a packet may carry on this link.
    pub fn max_payload_bytes(&self) -> usize {
        self.mtu_bytes
            .min(frame::MAX_FRAME_BYTES)
            .saturating_sub(frame::OVERHEAD_BYTES)
    }
}
