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
//! - replica states (issue 22, after DRBD): each node keeps, per mirrored
//!   slice it holds, the state of its copy (`ReplicaState` in the model's
//!   route table): up-to-date, outdated (it started again on an image that
//!   served before and has not yet heard from its partner what it missed),
//!   inconsistent (the target of a resync in progress) or split brain. Only
//!   an up-to-date copy is read, and only an up-to-date copy takes a write
//!   alone (degraded). A holder refuses a peer's read of a copy that is
//!   not up to date with a write completion flagged `CTRL_REFUSED`; the
//!   requester then asks the other holder once, or fails the request
//!   (`ResultCode::NoUpToDateCopy`). Reads of this node's own copy that is
//!   not up to date go to the partner while it is up, else fail;
//! - each time two partners meet, each first says, per slice they share,
//!   the state of its copy and how many granules the other missed here
//!   (`MISSED_TAG`, DRBD's generations reduced to what decides the
//!   direction; only *strong* claims count, acknowledged writes the other
//!   missed: the granules of failed writes that one side resyncs only so
//!   the copies converge are *weak*, `dirty::WEAK`, resynced by a source
//!   and handed to the partner by a target): the side that wrote alone is
//!   the source and the other
//!   becomes inconsistent until the source says the slice is in sync
//!   (`SYNC_DONE_TAG`); if neither missed anything both are up to date;
//!   if both did (a partition with writers on both sides), the slice is in
//!   split brain on both: neither resyncs, neither serves it, until `moneta
//!   san resolve --discard NODE` on one side: that side sends the granules
//!   it wrote alone to the other (`DISCARD_TAG`, so the resync covers the
//!   union of both sides' writes, as DRBD merges the bitmaps), forgets
//!   them, becomes outdated and asks to be told again (`MISSED_TAG` with
//!   `RETELL`): the other side is then the source of an ordinary resync.
//! - the dirty map is durable before a degraded write is acknowledged
//!   (`dirty.rs`: the granules a turn marked are appended and fdatasynced
//!   before any completion of that turn leaves); when it cannot be made
//!   durable, each write on a granule not yet recorded fails (a client's
//!   with `DeviceFailure`, a peer's is refused) and the rest goes on.
//! - replica identity (issue 39, `replica_meta.rs`): each copy's state and
//!   generation are recorded on the image; a copy with no or foreign
//!   metadata starts inconsistent and asks for everything (`FULL` in its
//!   `MISSED_TAG` word); inconsistent is recorded before the first resync
//!   write lands and ends only with `SYNC_DONE_TAG` (which carries the
//!   source's generation), so it survives restarts and is never forced.
//! - a resolve of a split brain is decided once, by the slice's primary
//!   holder (`RESOLVE_TAG`): the other holder asks it and acts on its
//!   answer; a contradicting request is refused naming the decision.

use super::liveness::{self, Change, Liveness, VIEW_TAG};
use super::{DeviceThread, SLICE_BYTES};
use crate::dirty::{unsure, weak, DirtyMap, GRANULE_BYTES, UNSURE, WEAK};
use crate::replica_meta::{CopyMeta, ReplicaMeta, Stored};
use moneta_model::device::network::HeaderFields;
use moneta_model::device::network::{Packet, PortOutput};
use moneta_model::device::network::{ReplicaState, RouteTable};
use moneta_model::device::packet::{PacketHeader, PacketKind};
use moneta_model::device::pipeline::{PayloadSource, CMD_WRITE, CTRL_DEGRADED, CTRL_REFUSED};
use moneta_model::kernel::Clock;
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
/// per slice they share, the state of this copy and how many granules it
/// missed here (ADDR: slice << 48 | RETELL | state << 40 | count).
pub const MISSED_TAG: u16 = u16::MAX - 2;
/// The TAG of a completion that hands a partner a granule (global ADDR)
/// this node wrote alone and discards (`moneta san resolve`): the
/// partner resyncs it too.
pub const DISCARD_TAG: u16 = u16::MAX - 3;
/// The TAG of a completion about a resolve of a split brain (`moneta san
/// resolve --discard`), between a slice's two holders: its primary holder
/// decides, once per split brain (ADDR: the slice; OFFSETS: `ASK`,
/// `GRANTED` or `REFUSED`; SIZE: the node whose writes are discarded).
pub const RESOLVE_TAG: u16 = u16::MAX - 5;
/// The TAG of a completion a writer that holds no copy of a slice sends
/// both holders once its mirrored write there is finished (a peer
/// acknowledgement, DRBD 9's `P_PEER_ACK`; ADDR: the first granule's
/// global address; SIZE: how many granules; OFFSETS: `PEER_ACK_OK` if
/// both copies took it, else 0): the holders' receiving-side activity log
/// (`PortState::remote`) forgets the granules, or settles them if the
/// write failed.
pub const PEER_ACK_TAG: u16 = u16::MAX - 6;
const PEER_ACK_OK: u16 = 1;
const ASK: u16 = 1;
const GRANTED: u16 = 2;
const REFUSED: u16 = 3;
/// The primary decided on its own side's request: the partner learns it.
const DECIDED: u16 = 4;
/// SIZE of a `REFUSED` with no decision taken (the decider's copy is not
/// in split brain).
const NO_DECISION: u16 = u16::MAX;
/// How long a resolve waits for the deciding holder's answer.
const ASK_TIMEOUT_NS: Ns = 5_000_000_000;
/// In a `MISSED_TAG` ADDR: tell me again (this side discarded its writes).
const RETELL: u64 = 1 << 47;
/// In a `MISSED_TAG` ADDR: this copy is blank (no or foreign replica
/// metadata, or a full resync into it did not finish): send it everything.
const FULL: u64 = 1 << 46;
/// The copy's state in a `MISSED_TAG` ADDR (bits 40..46).
const STATE_MASK: u64 = 0x3f;
const COUNT_MASK: u64 = (1 << 40) - 1;
/// In a resync write's OFFSETS: the sender's claim on the granule is
/// strong (an acknowledged write the target missed), not weak.
const RESYNC_STRONG: u16 = 1;
/// Resync writes in flight per peer at most.
const RESYNC_WINDOW: usize = 16;
/// The dirty map is saved at most this often while it changes.
const SAVE_INTERVAL_NS: Ns = 10_000_000;
/// How often a dirty map that could not be made durable is tried again.
const DIRTY_RETRY_NS: Ns = 1_000_000;

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
    /// What the medium says of each mirrored copy held here (`replica_meta`).
    pub meta: ReplicaMeta,
}

/// The states this node's copies start in, from the medium's replica
/// metadata (`replica_meta`): a new SAN's blank copy up to date (and
/// recorded so), one that was up to date outdated (it may have missed
/// writes while this node was away) until its partner says what it missed,
/// one that was not a whole generation (or has no or foreign metadata)
/// inconsistent until a resync from its partner finishes.
pub(super) fn initial_states(san: &mut SanPort, routes: &mut RouteTable) {
    let node = routes.node;
    if (0..routes.slice_count()).any(|s| routes.partner_of(s).is_some()) {
        port_log(node, &san.meta.found);
    }
    for slice in 0..routes.slice_count() {
        let Some(partner) = routes.partner_of(slice) else {
            continue;
        };
        let c = san.meta.copy(slice);
        let state = match c.state {
            Stored::New => {
                let up = CopyMeta {
                    state: Stored::UpToDate,
                    ..c
                };
                match san.meta.set(slice, up) {
                    Ok(()) => ReplicaState::UpToDate,
                    Err(e) => {
                        port_log(
                            node,
                            &format!("slice {slice}: the replica metadata cannot be written: {e}"),
                        );
                        ReplicaState::Outdated
                    }
                }
            }
            Stored::UpToDate => ReplicaState::Outdated,
            Stored::Inconsistent => ReplicaState::Inconsistent,
        };
        routes.set_state(slice, state);
        port_log(
            node,
            &format!(
                "slice {slice} (partner node {partner}): recorded {:?}{}, generation {}: the \
                 copy starts {}",
                c.state,
                if c.full { " (needs every granule)" } else { "" },
                c.generation,
                state.as_str()
            ),
        );
    }
}

use moneta_abi::stats::{PortStats, SliceStatus};

/// Where a resolve's answer goes (the control plane waits on it).
pub(super) type Reply = std::sync::mpsc::SyncSender<Result<String, String>>;

/// A `moneta san resolve --discard` on this node waiting for the primary
/// holders of its slices to decide (`RESOLVE_TAG`).
pub(super) struct Ask {
    /// Slices asked about (or still to ask: `unsent`), and their decider.
    waiting: BTreeMap<usize, u16>,
    unsent: Vec<usize>,
    /// What was done so far, and the first refusal.
    done: Vec<String>,
    refused: Option<String>,
    reply: Reply,
    deadline: Ns,
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
    /// (Partner, slice) told the slice is in sync with us (since the
    /// partner was last up).
    announced: BTreeSet<(u16, usize)>,
    /// (Partner, slice) told how many granules it missed here, and what
    /// each said (its state, what we missed there), since it was last up.
    told: BTreeSet<(u16, usize)>,
    heard: BTreeMap<(u16, usize), (ReplicaState, u64)>,
    /// Slices whose next `MISSED_TAG` asks to be told again.
    retell: BTreeSet<(u16, usize)>,
    /// Granules this node discarded, to hand to the partner first.
    discards: BTreeMap<u16, VecDeque<u64>>,
    /// As a resync target, per slice: granules to come, and come.
    incoming: BTreeMap<usize, (u64, u64)>,
    /// Refusals to send (the window was full).
    refusals_out: VecDeque<(u16, PacketHeader)>,
    last_save_ns: Ns,
    /// A failed flush of the dirty map is tried again at this time.
    dirty_retry_ns: Ns,
    /// Why the last flush of new marks failed, until one succeeds (or a
    /// save writes a map with granules in it): a save of an empty map
    /// takes no space, so it says nothing of whether marks can be made
    /// durable, and `save_dirty` must not clear the stats' error with it.
    flush_error: Option<String>,
    /// Who is up as this node sees it (views, leases: `liveness.rs`).
    liveness: Liveness,
    /// Per slice, how many times its copy here entered split brain (a
    /// decision belongs to one of them).
    episodes: BTreeMap<usize, u64>,
    /// Per slice, the resolve decided for its current split brain: whose
    /// writes are discarded, and in which episode (taken here as the
    /// slice's primary holder, or learned from it).
    decisions: BTreeMap<usize, (u16, u64)>,
    /// Resolves waiting for the deciding holder's answer.
    asks: Vec<Ask>,
    /// Answers to the partner's asks the window held back: (peer, slice,
    /// verdict, loser).
    verdicts_out: VecDeque<(u16, usize, u16, u16)>,
    /// Partners lost, and when: their shared copies suspended here wait
    /// for the tie-breaker (`liveness::decide`).
    deciding: BTreeMap<u16, Ns>,
    /// Until when refused commands are held rather than failed (a failover
    /// is being decided here or at the other holders: `holds`).
    hold_until: Ns,
    /// Granules marked missed by a partner this node counts up, by why,
    /// since the last log line of that kind (`mark`).
    marked_up: BTreeMap<&'static str, (u64, Option<std::time::Instant>)>,
    /// The activity log (DRBD's): (partner, granule) of this node's
    /// clients' mirrored writes in flight here, with how many and whether
    /// one failed. Each is marked `unsure(partner)` in the dirty map, made
    /// durable before its bytes reach this copy (`activity_begin`), and
    /// forgotten when the last write on it is acknowledged: a node killed
    /// with a write on its copy that its partner never got brings the
    /// granule back as unsure, settled at the next meeting (`settle_unsure`).
    active: BTreeMap<(u16, u64), (u32, bool)>,
    /// The receiving side's activity log (DRBD commit 6719fb036cea, "we
    /// need to set out of sync and do AL transactions … on the receiving
    /// side"): (partner, granule) of mirrored writes in flight here from a
    /// writer that holds no copy of the slice, with the writers and
    /// whether the granule is to stay unsure (one of its writes failed, or
    /// it was unsure before). Marked `unsure(partner)` durably before the
    /// bytes land (`remote_begin`); forgotten on the writer's peer
    /// acknowledgement (`PEER_ACK_TAG`) of a write both copies took; a
    /// write that failed, or whose writer was lost before it said
    /// (`forget_exchange`), leaves the granule unsure and settles it at
    /// once with a partner that is up (else when they meet): a writer that
    /// died mid-write no longer leaves the two copies different for good
    /// (seed 71930362).
    remote: BTreeMap<(u16, u64), (BTreeSet<u16>, bool)>,
    /// Peer acknowledgements to send (the window was full).
    peer_acks_out: VecDeque<(u16, PacketHeader)>,
}

fn state_code(s: ReplicaState) -> u64 {
    match s {
        ReplicaState::UpToDate => 0,
        ReplicaState::Outdated => 1,
        ReplicaState::Inconsistent => 2,
        ReplicaState::SplitBrain => 3,
        ReplicaState::Suspended => 4,
    }
}

fn state_of_code(c: u64) -> ReplicaState {
    match c {
        0 => ReplicaState::UpToDate,
        2 => ReplicaState::Inconsistent,
        3 => ReplicaState::SplitBrain,
        4 => ReplicaState::Suspended,
        _ => ReplicaState::Outdated,
    }
}

/// Global `[lo, hi)` of `slice`.
fn slice_range(routes: &RouteTable, slice: usize) -> (u64, u64) {
    let b = routes.slice_bytes();
    (slice as u64 * b, (slice as u64 + 1) * b)
}

thread_local! {
    /// Log lines of the ports this thread turns, when captured (the replica
    /// protocol's simulator keeps them with its trace instead of stderr).
    static LOG_CAPTURE: std::cell::RefCell<Option<Vec<String>>> =
        const { std::cell::RefCell::new(None) };
}

/// From now on, this thread's ports log into a buffer (`take_log`), not
/// stderr (`on`), or to stderr again.
pub fn capture_log(on: bool) {
    LOG_CAPTURE.with(|c| *c.borrow_mut() = on.then(Vec::new));
}

/// The lines captured since the last call.
pub fn take_log() -> Vec<String> {
    LOG_CAPTURE.with(|c| {
        c.borrow_mut()
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    })
}

/// A line of this node's log: which node says it (one daemon may serve
/// several: `moneta san up`) and when (UTC, to the millisecond, to line it
/// up with a chaos run's schedule).
fn port_log(node: u16, what: &str) {
    let captured = LOG_CAPTURE.with(|c| {
        let mut c = c.borrow_mut();
        match c.as_mut() {
            Some(lines) => {
                lines.push(format!("node {node}: {what}"));
                true
            }
            None => false,
        }
    });
    if captured {
        return;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let ms = now.as_millis() % 86_400_000;
    eprintln!(
        "monetad node {node} {:02}:{:02}:{:02}.{:03}: {what}",
        ms / 3_600_000,
        ms / 60_000 % 60,
        ms / 1000 % 60,
        ms % 1000
    );
}

impl PortState {
    pub(super) fn new(port: SanPort, nic_tx_ns: Ns) -> PortState {
        let config = port.endpoint.config();
        let node = config.node;
        let liveness = Liveness::new(&config.peers, config.peer_silence_ns, config.heartbeat_ns);
        PortState {
            liveness,
            deciding: BTreeMap::new(),
            episodes: BTreeMap::new(),
            decisions: BTreeMap::new(),
            asks: Vec::new(),
            verdicts_out: VecDeque::new(),
            hold_until: 0,
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
            retell: BTreeSet::new(),
            discards: BTreeMap::new(),
            incoming: BTreeMap::new(),
            refusals_out: VecDeque::new(),
            last_save_ns: 0,
            dirty_retry_ns: 0,
            flush_error: None,
            active: BTreeMap::new(),
            remote: BTreeMap::new(),
            peer_acks_out: VecDeque::new(),
            marked_up: BTreeMap::new(),
        }
    }

    /// The dirty map of this node's medium (the simulator fills its disk).
    pub(super) fn dirty_mut(&mut self) -> &mut DirtyMap {
        &mut self.port.dirty
    }

    /// Record that `partner` missed global `[addr, addr + bytes)` (a key of
    /// the dirty map: a node, `weak(node)` or `unsure(node)`). A strong
    /// claim on a partner this node counts up (it was told what it missed
    /// and may be up to date) is what a restart of this node brings back,
    /// so it is logged (at most once a second per kind, with a count).
    fn mark(&mut self, key: u16, addr: u64, bytes: u64, why: &'static str) {
        self.port.dirty.mark(key, addr, bytes);
        if key & (UNSURE | WEAK) != 0 || !self.liveness.is_up(key) {
            return;
        }
        let now = std::time::Instant::now();
        let entry = self.marked_up.entry(why).or_insert((0, None));
        entry.0 += 1;
        if entry
            .1
            .is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(1))
        {
            let n = entry.0;
            *entry = (0, Some(now));
            port_log(
                self.stats.node,
                &format!(
                    "marked missed by node {key}, which is up: global {addr} ({bytes} B; {why}; \
                     {n} such marks since the last line)"
                ),
            );
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

    /// Writes on `granules` (the activity log's) finished: each granule
    /// whose last write is done leaves the log, and is forgotten as unsure
    /// unless one of its writes failed.
    fn activity_done(&mut self, granules: &[(u16, u64)], ok: bool) {
        for &(partner, g) in granules {
            let Some(e) = self.active.get_mut(&(partner, g)) else {
                continue;
            };
            e.0 = e.0.saturating_sub(1);
            e.1 |= !ok;
            if e.0 == 0 {
                let failed = e.1;
                self.active.remove(&(partner, g));
                match self.remote.get_mut(&(partner, g)) {
                    // A peer's write in flight on it still decides, and
                    // this one's failure stays with it.
                    Some(r) => r.1 |= failed,
                    None if !failed => self.port.dirty.forget_unsure(partner, g * GRANULE_BYTES),
                    None => {}
                }
            }
        }
    }

    /// Mark granule `g` unsure with respect to `partner` (an activity log's).
    fn mark_unsure(&mut self, partner: u16, g: u64) {
        self.port
            .dirty
            .mark(unsure(partner), g * GRANULE_BYTES, GRANULE_BYTES);
    }

    /// `writer`'s mirrored write on granule `g` (with respect to
    /// `partner`) finished here: both copies took it (`ok`), or it failed
    /// or its outcome is unknown (the writer was lost). The last write on
    /// it leaves the receiving side's log (`remote`), and the granule is
    /// forgotten as unsure unless one failed (or it was unsure before).
    fn remote_done(&mut self, partner: u16, g: u64, writer: u16, ok: bool) {
        let Some(e) = self.remote.get_mut(&(partner, g)) else {
            return;
        };
        if !e.0.remove(&writer) {
            return;
        }
        e.1 |= !ok;
        if !e.0.is_empty() {
            return;
        }
        let failed = e.1;
        self.remote.remove(&(partner, g));
        match self.active.get_mut(&(partner, g)) {
            Some(a) => a.1 |= failed,
            None if !failed => self.port.dirty.forget_unsure(partner, g * GRANULE_BYTES),
            None => {}
        }
    }

    /// A request was refused for want of an up-to-date copy: count it,
    /// keep and log why.
    pub(super) fn refusal(&mut self, why: String) {
        self.stats.refusals += 1;
        if self.stats.refusals <= 20 || self.stats.refusals.is_power_of_two() {
            port_log(
                self.stats.node,
                &format!("refused ({} so far): {why}", self.stats.refusals),
            );
        }
        self.stats.last_refusal = Some(why);
    }

    /// Make every granule marked so far durable (before an acknowledgement).
    /// Returns whether they are: if not (a full disk, an I/O error), no
    /// write on a granule not yet durable is acknowledged: each such write
    /// fails (a client's with `DeviceFailure`, a peer's is refused), while
    /// reads, other writes and the peers' traffic go on (`unrecorded`); the
    /// file is tried again every `DIRTY_RETRY_NS`, and the error is in the
    /// stats (`dirty_save_error`, `moneta san status`).
    pub(super) fn flush_dirty(&mut self, now: Ns) -> bool {
        if !self.port.dirty.needs_flush() {
            return true;
        }
        if now < self.dirty_retry_ns {
            return false;
        }
        match self.port.dirty.flush() {
            Ok(()) => {
                self.flush_error = None;
                if self.stats.dirty_save_error.take().is_some() {
                    port_log(
                        self.stats.node,
                        "the dirty map is durable again: held acknowledgements go",
                    );
                }
                true
            }
            Err(e) => {
                self.dirty_retry_ns = now + DIRTY_RETRY_NS;
                if self.stats.dirty_save_error.is_none() {
                    port_log(
                        self.stats.node,
                        &format!(
                            "the dirty map cannot be made durable ({e}): writes this copy \
                             takes alone fail until it can"
                        ),
                    );
                }
                self.stats.dirty_save_error = Some(e.to_string());
                self.flush_error = Some(e.to_string());
                false
            }
        }
    }

    /// Whether the medium says this node's copy of `slice` is a whole
    /// generation (not `Inconsistent`: `replica_meta`).
    fn whole(&self, slice: usize) -> bool {
        self.port.meta.copy(slice).state != Stored::Inconsistent
    }

    /// Record on the medium what `change` makes of the copy of `slice`'s
    /// metadata, durably, before the copy acts on it (`replica_meta`'s
    /// update order). Returns whether it is recorded (an error is logged).
    fn record(&mut self, slice: usize, change: impl FnOnce(CopyMeta) -> CopyMeta) -> bool {
        let c = change(self.port.meta.copy(slice));
        match self.port.meta.set(slice, c) {
            Ok(()) => true,
            Err(e) => {
                port_log(
                    self.stats.node,
                    &format!(
                        "slice {slice}: the replica metadata cannot be written ({e}): the copy \
                         stays as it was recorded"
                    ),
                );
                false
            }
        }
    }

    /// Record the copy of `slice` as not a whole generation (before a
    /// resync write or a discard changes it).
    fn record_inconsistent(&mut self, slice: usize) -> bool {
        if !self.whole(slice) {
            return true;
        }
        self.record(slice, |c| CopyMeta {
            state: Stored::Inconsistent,
            ..c
        })
    }

    /// Whether a write on global `[addr, addr + len)` may not be
    /// acknowledged: a granule it marked missed by a partner is not durable
    /// yet (`flush_dirty` failed).
    pub(super) fn unrecorded(&self, addr: u64, len: u64) -> bool {
        self.port.dirty.unsaved_in(addr, len)
    }

    /// A client's write on `channel` fails: the granules it marked are not
    /// durable (`unrecorded`). Counted and kept as a refusal.
    pub(super) fn unrecorded_write(&mut self, channel: u16) {
        let why = format!(
            "a write on channel {channel} taken by this copy alone: the dirty map cannot be made \
             durable ({}), so it is not acknowledged",
            self.stats.dirty_save_error.clone().unwrap_or_default()
        );
        self.refusal(why);
    }

    /// Rewrite the dirty map's file now if granules were cleared since it
    /// was last written. Returns whether the file holds no more than the
    /// map (false: the save failed, recorded in the stats).
    fn save_dirty(&mut self, now: Ns) -> bool {
        if !self.port.dirty.is_changed() {
            return true;
        }
        self.last_save_ns = now;
        match self.port.dirty.save() {
            Ok(()) => {
                if !self.port.dirty.is_empty() {
                    self.flush_error = None;
                }
                self.stats.dirty_save_error = self.flush_error.clone();
                true
            }
            Err(e) => {
                self.stats.dirty_save_error = Some(e.to_string());
                false
            }
        }
    }

    pub(super) fn stats_with(&self, routes: &RouteTable) -> PortStats {
        let mut s = self.stats();
        s.slices = (0..routes.slice_count())
            .filter_map(|slice| {
                let partner = routes.partner_of(slice)?;
                let (lo, hi) = slice_range(routes, slice);
                let (to_receive, received) = self.incoming.get(&slice).copied().unwrap_or_default();
                Some(SliceStatus {
                    slice: slice as u32,
                    partner,
                    state: routes.state(slice).as_str().to_string(),
                    partner_up: self.liveness.is_up(partner),
                    to_send: self.port.dirty.granules_in(partner, lo, hi),
                    to_receive,
                    received: received.min(to_receive),
                })
            })
            .collect();
        s.split_brain_peers = s
            .slices
            .iter()
            .filter(|x| x.state == ReplicaState::SplitBrain.as_str())
            .map(|x| x.partner)
            .collect();
        s.split_brain_peers.dedup();
        s.unsynced_partners = routes.unsynced();
        s.dirty_flushes = self.port.dirty.flushes;
        s.dirty_flush_ns = self.port.dirty.flush_ns;
        s
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
                    _ if self.liveness.is_up(p) => "up",
                    // Its session is up but it does not say it hears us
                    // (a link cut one way, or silent past the lease).
                    Some(PeerState::Up) => "unheard",
                    Some(PeerState::Failed) => "failed",
                    _ => "connecting",
                };
                (p, state.to_string())
            })
            .collect();
        s.dirty_bytes = self.port.dirty.bytes();
        let w = e.stats();
        s.retransmits = w.retransmits;
        s.crc_errors = w.crc_errors;
        s.pauses_sent = w.pauses_sent;
        s.pauses_received = w.pauses_received;
        s.authenticated = e.config().secret.is_some();
        s.unauthenticated = w.unauthenticated;
        s.replayed = w.replayed;
        s.epoch_changes_limited = w.epoch_changes_limited;
        s
    }

    /// Whether a command refused for want of an up-to-date copy is held
    /// at `now` rather than failed: a peer was lost here within five graces
    /// (the tie-breaker decides within four, here and at the other holders,
    /// which lose it within a view of this node), a decision is pending,
    /// or a peer's view dropped a node within five graces (two other nodes
    /// lost each other: their copies are suspended while they decide).
    pub(super) fn holds(&self, now: Ns) -> bool {
        let window = 5 * self.liveness.grace_ns();
        now < self.hold_until
            || !self.deciding.is_empty()
            || self.liveness.peer_lost_one(now, window)
    }

    /// Nothing waits to leave and nothing has arrived.
    pub(super) fn is_quiet(&self) -> bool {
        self.outgoing.is_empty() && self.port.endpoint.pending_deliveries() == 0
    }

    /// Quiet, and nothing waits on a timer shorter than the views'
    /// (milliseconds): the wire is idle (`Endpoint::is_idle`), no refusal,
    /// resync, discard, retelling or failover decision is under way, and
    /// the dirty map is durable. The device thread may then nap longer
    /// (`SAN_IDLE_NAP_NS`): frames and clients still wake it at once.
    pub(super) fn is_idle(&self) -> bool {
        self.is_quiet()
            && self.port.endpoint.is_idle()
            && self.refusals_out.is_empty()
            && self.peer_acks_out.is_empty()
            && self.resyncing.is_empty()
            && self.incoming.is_empty()
            && self.retell.is_empty()
            && self.discards.values().all(VecDeque::is_empty)
            && self.deciding.is_empty()
            && self.asks.is_empty()
            && self.verdicts_out.is_empty()
            && !self.port.dirty.needs_flush()
    }
}

impl<C: Clock> DeviceThread<C> {
    /// One turn of the port at `now` (module header). Returns whether it
    /// did anything.
    pub(super) fn port_turn(&mut self, now: Ns) -> bool {
        let Some(mut state) = self.port.take() else {
            return false;
        };
        let mut worked = state.port.endpoint.poll(now).unwrap_or(0) > 0;
        while let Some(event) = state.port.endpoint.next_event() {
            worked = true;
            match event {
                WireEvent::PeerFailed { peer, .. } => {
                    state.stats.peer_failures += 1;
                    state.liveness.set_wire(peer, false);
                }
                WireEvent::PeerRestarted { peer, .. } => {
                    // What was in flight to its old self is lost: the
                    // segments waiting on it go degraded, as on a failure
                    // (its new self starts with its copies outdated), and
                    // the exchange starts over.
                    port_log(
                        state.stats.node,
                        &format!("node {peer} restarted: what was in flight to it goes degraded"),
                    );
                    state.liveness.set_wire(peer, true);
                    state.liveness.restarted(peer);
                    self.driver.peer_failed(now, peer);
                    if state.liveness.is_up(peer) {
                        self.driver.peer_up(peer);
                    }
                    self.forget_exchange(&mut state, peer);
                }
                WireEvent::PeerUp { peer } => state.liveness.set_wire(peer, true),
            }
        }
        worked |= self.judge_peers(&mut state, now);
        worked |= self.send_views(&mut state, now);
        worked |= self.take_arrivals(&mut state, now);
        worked |= self.decide(&mut state, now);
        self.collect_port_output(&mut state);
        // Granules marked this turn are durable before an acknowledgement
        // of a write on them leaves; if they cannot be, those writes are
        // refused and everything else goes (`send_due`).
        let durable = state.flush_dirty(now);
        worked |= self.send_due(&mut state, now, durable);
        worked |= self.send_refusals(&mut state, now);
        worked |= self.send_peer_acks(&mut state, now);
        worked |= self.send_asks(&mut state, now);
        worked |= self.resync(&mut state, now);
        if now >= state.last_save_ns + SAVE_INTERVAL_NS || state.port.dirty.is_empty() {
            state.save_dirty(now);
        }
        self.port = Some(state);
        worked
    }

    /// The leases at `now`, before the turn takes commands (a thread that
    /// was starved past a partner's lease must not serve its copy first).
    /// Returns whether a peer was lost or came back.
    pub(super) fn port_leases(&mut self, now: Ns) -> bool {
        let Some(mut state) = self.port.take() else {
            return false;
        };
        let worked = self.judge_peers(&mut state, now);
        self.port = Some(state);
        worked
    }

    /// Peers lost or back at `now` (`Liveness::tick`).
    fn judge_peers(&mut self, state: &mut PortState, now: Ns) -> bool {
        let mut worked = false;
        for change in state.liveness.tick(now) {
            worked = true;
            match change {
                Change::Lost(peer) => self.lose(state, now, peer),
                Change::Back(peer) => self.regain(state, peer),
            }
        }
        worked
    }

    /// What was said with `peer` in the exchange starts over (it was lost,
    /// came back, or restarted).
    fn forget_exchange(&mut self, state: &mut PortState, peer: u16) {
        state.announced.retain(|&(p, _)| p != peer);
        state.told.retain(|&(p, _)| p != peer);
        state.heard.retain(|&(p, _), _| p != peer);
        state.retell.retain(|&(p, _)| p != peer);
        state.resyncing.retain(|&(p, _), _| p != peer);
        let routes = &self.driver.device().port().expect("a port").routes;
        for slice in routes.shared_slices(peer) {
            state.incoming.remove(&slice);
        }
        self.orphan_writes(state, peer);
    }

    /// The mirrored writes of `writer` in flight here (the receiving
    /// side's log, `PortState::remote`) will never be acknowledged to us:
    /// the writer was lost, came back or restarted (its peer
    /// acknowledgements are gone with the session). Their granules stay
    /// unsure and are settled now with each partner that is up (with a
    /// partner that is not, when they meet): the writer may have died with
    /// the write on this copy and not on the partner's.
    fn orphan_writes(&mut self, state: &mut PortState, writer: u16) {
        let orphaned: Vec<(u16, u64)> = state
            .remote
            .iter()
            .filter(|(_, e)| e.0.contains(&writer))
            .map(|(&k, _)| k)
            .collect();
        if orphaned.is_empty() {
            return;
        }
        for &(partner, g) in &orphaned {
            state.remote_done(partner, g, writer, false);
        }
        self.settle_failed(state, writer, &orphaned);
    }

    /// Settle the unsure granules of the slices of `granules` ((partner,
    /// granule) of failed or orphaned writes of `writer`) with each
    /// partner that is up, as at a meeting.
    fn settle_failed(&mut self, state: &mut PortState, writer: u16, granules: &[(u16, u64)]) {
        let routes = &self.driver.device().port().expect("a port").routes;
        let slices: BTreeSet<(u16, usize)> = granules
            .iter()
            .filter(|&&(p, _)| p != writer && state.liveness.is_up(p))
            .map(|&(p, g)| (p, routes.slice_of(g * GRANULE_BYTES)))
            .collect();
        for (partner, slice) in slices {
            let wins = self.copy_wins(state, partner, slice);
            self.settle_unsure(state, partner, slice, wins);
        }
    }

    /// The unsure granules of `slice` with respect to `partner` (a failed
    /// write this copy may hold and the partner's may not): if this copy
    /// `wins` they are marked missed by the partner (the resync sends them
    /// there), else handed to the partner like discarded ones (it marks
    /// them missed here and resyncs its own version over them).
    fn settle_unsure(&mut self, state: &mut PortState, partner: u16, slice: usize, wins: bool) {
        let routes = &self.driver.device().port().expect("a port").routes;
        let (lo, hi) = slice_range(routes, slice);
        let mut granules = state.port.dirty.take_in(unsure(partner), lo, hi);
        // A write still in flight here keeps its granules unsure: its own
        // outcome settles them (`activity_end`); handed over now, the
        // partner's older version could come over an acknowledged write.
        granules.retain(|&g| {
            let key = (partner, g / GRANULE_BYTES);
            let busy = state.active.contains_key(&key) || state.remote.contains_key(&key);
            if busy {
                state.port.dirty.mark(unsure(partner), g, GRANULE_BYTES);
            }
            !busy
        });
        if granules.is_empty() {
            return;
        }
        if wins {
            for g in granules {
                state.mark(
                    weak(partner),
                    g,
                    GRANULE_BYTES,
                    "unsure granules settled: this copy wins",
                );
            }
        } else {
            state.discards.entry(partner).or_default().extend(granules);
        }
    }

    /// Whether this node's copy of `slice` wins against `partner`'s when
    /// both may have diverged (a cut link, a brief loss): its partner is
    /// behind it (this node holds granules the partner missed: whatever
    /// its own state, e.g. outdated by a lost majority, it is the source
    /// the exchange will choose, and handing granules over would make a
    /// split brain), or it is the primary and up to date (or suspended from
    /// up to date).
    fn copy_wins(&self, state: &PortState, partner: u16, slice: usize) -> bool {
        let routes = &self.driver.device().port().expect("a port").routes;
        let (lo, hi) = slice_range(routes, slice);
        copy_wins_in(routes, &state.port.dirty, partner, slice, lo, hi)
    }

    /// `peer` is lost (`liveness.rs`): the copies shared with it that are
    /// up to date are suspended (before the segments waiting on it are
    /// re-routed, so none is acknowledged alone), and wait for the
    /// tie-breaker.
    fn lose(&mut self, state: &mut PortState, now: Ns, peer: u16) {
        port_log(
            state.stats.node,
            &format!("node {peer} lost (no view of it saying it hears this node within the lease)"),
        );
        if let Some(routes) = self.driver.routes_mut() {
            for slice in routes.shared_slices(peer) {
                if routes.state(slice) == ReplicaState::UpToDate {
                    routes.set_state(slice, ReplicaState::Suspended);
                }
            }
        }
        state.deciding.insert(peer, now);
        state.hold_until = now + 5 * state.liveness.grace_ns();
        self.driver.peer_failed(now, peer);
        self.forget_exchange(state, peer);
    }

    /// `peer` is back: used again; each copy shared with it learns its
    /// state from the exchange, which both sides tell again.
    fn regain(&mut self, state: &mut PortState, peer: u16) {
        port_log(state.stats.node, &format!("node {peer} back"));
        state.deciding.remove(&peer);
        self.driver.peer_up(peer);
        self.forget_exchange(state, peer);
        let slices = self
            .driver
            .device()
            .port()
            .expect("a port")
            .routes
            .shared_slices(peer);
        for slice in slices {
            let wins = self.copy_wins(state, peer, slice);
            self.settle_unsure(state, peer, slice, wins);
            state.retell.insert((peer, slice));
        }
    }

    /// Send each peer whose view is due the peers this node hears.
    fn send_views(&mut self, state: &mut PortState, now: Ns) -> bool {
        let mut worked = false;
        for peer in state.liveness.views_due(now) {
            let view = state.liveness.view_for(peer, now);
            let mut header =
                self.header_to(peer, PacketKind::WriteCompletion, view.hears, VIEW_TAG, 0);
            // A completion carries no payload: OFFSETS, SIZE and CMD are free.
            header.offsets = view.seq;
            header.size = view.echo;
            header.cmd = u8::from(view.promise);
            if state.port.endpoint.send(now, peer, header, &[]).is_ok() {
                worked = true;
            } else {
                state.liveness.unsent(peer);
            }
        }
        worked
    }

    /// The tie-breaker (`liveness::decide`) for the copies suspended since
    /// a partner was lost.
    fn decide(&mut self, state: &mut PortState, now: Ns) -> bool {
        if state.deciding.is_empty() {
            return false;
        }
        let grace = state.liveness.grace_ns();
        let mut worked = false;
        let deciding: Vec<(u16, Ns)> = state.deciding.iter().map(|(&p, &t)| (p, t)).collect();
        for (partner, lost) in deciding {
            let witness = state.liveness.witness_hears(partner, lost + grace / 2);
            let routes = &self.driver.device().port().expect("a port").routes;
            let quorum = routes.has_quorum();
            let mut left = 0;
            for slice in routes.shared_slices(partner) {
                let routes = &self.driver.device().port().expect("a port").routes;
                if routes.state(slice) != ReplicaState::Suspended {
                    continue;
                }
                let (lo, hi) = slice_range(routes, slice);
                let behind = state.port.dirty.granules_in(partner, lo, hi) > 0;
                let wins = self.copy_wins(state, partner, slice);
                let verdict = liveness::decide(
                    quorum,
                    witness,
                    wins,
                    now >= lost + state.liveness.settle_ns(),
                    now >= lost + 4 * grace,
                );
                let Some(alone) = verdict else {
                    left += 1;
                    continue;
                };
                worked = true;
                // The failed writes' granules go with the verdict.
                self.settle_unsure(state, partner, slice, alone);
                let Some(routes) = self.driver.routes_mut() else {
                    return worked;
                };
                routes.set_state(
                    slice,
                    if alone {
                        ReplicaState::UpToDate
                    } else {
                        ReplicaState::Outdated
                    },
                );
                port_log(
                    state.stats.node,
                    &format!(
                        "slice {slice}: node {partner} lost; {}",
                        match (alone, quorum, witness) {
                            (true, _, Some(false)) => "no peer hears it either: this copy goes on \
                                                   alone (degraded)"
                                .to_string(),
                            (true, _, _) => format!(
                                "it is alive behind a cut link, and this copy wins (it is {}): it \
                             goes on alone",
                                if behind { "ahead of it" } else { "the primary" }
                            ),
                            (false, false, _) => "this node reaches no majority: this copy is \
                                              outdated"
                                .to_string(),
                            (false, _, _) =>
                                "it is alive behind a cut link and its copy wins: this \
                                          copy is outdated until it resyncs"
                                    .to_string(),
                        }
                    ),
                );
            }
            if left == 0 {
                state.deciding.remove(&partner);
            }
        }
        worked
    }

    /// Send the refusals the window held back.
    fn send_refusals(&mut self, state: &mut PortState, now: Ns) -> bool {
        send_queued(&mut state.port.endpoint, &mut state.refusals_out, now)
    }

    /// `moneta san resolve --discard` on this node: its writes in the
    /// split-brain slices it holds (all, or `slice`) are discarded and its
    /// partner's copy wins (module header). Returns what it did.
    ///
    /// Serialized and decided once per split brain (issue 39): the slice's
    /// primary holder decides. On it the request is decided at once; on the
    /// other holder it asks the primary (`RESOLVE_TAG`) and acts on its
    /// answer, which `reply` gets. A request that agrees with the decision
    /// taken says so; one that contradicts it is refused, naming it.
    pub(super) fn discard(&mut self, slice: Option<usize>, reply: Reply) {
        let Some(mut state) = self.port.take() else {
            let _ = reply.send(Err("this daemon is not a SAN node".into()));
            return;
        };
        let now = self.clock.now();
        self.discard_begin(&mut state, slice, reply, now);
        self.port = Some(state);
    }

    /// The decision taken for `slice`'s current split brain, if any.
    fn decision(&self, state: &PortState, slice: usize) -> Option<u16> {
        let episode = state.episodes.get(&slice).copied().unwrap_or(0);
        state
            .decisions
            .get(&slice)
            .filter(|&&(_, e)| e == episode)
            .map(|&(loser, _)| loser)
    }

    /// What a request that `node` discards in `slice` meets when `loser`'s
    /// writes were already chosen for discarding.
    fn decided(&self, slice: usize, loser: u16, node: u16) -> Result<String, String> {
        let routes = &self.driver.device().port().expect("a port").routes;
        let winner = routes
            .holders(slice)
            .map(|(p, r)| if p == loser { r } else { p })
            .unwrap_or(u16::MAX);
        if loser == node {
            Ok(format!(
                "slice {slice}: already resolved so: node {loser}'s writes are discarded, node \
                 {winner}'s copy wins"
            ))
        } else {
            Err(format!(
                "slice {slice}: the split brain was already resolved the other way: node \
                 {loser}'s writes are discarded and node {winner}'s copy wins; this contradicting \
                 resolve is refused"
            ))
        }
    }

    fn discard_begin(
        &mut self,
        state: &mut PortState,
        slice: Option<usize>,
        reply: Reply,
        now: Ns,
    ) {
        let me = self.driver.device().port().expect("a port").routes.node;
        let routes = self.driver.device().port().expect("a port").routes.clone();
        // A slice named whose split brain was decided: answered from the
        // decision, whatever its copy's state now.
        if let Some(s) = slice {
            if let Some(loser) = self.decision(state, s) {
                let _ = reply.send(self.decided(s, loser, me));
                return;
            }
        }
        let candidates = match copies_in(&routes, slice, ReplicaState::SplitBrain) {
            Ok(c) => c,
            Err(e) => {
                // No split brain left here: a decision taken on one is
                // the answer (the resolve raced with another).
                let answers: Vec<Result<String, String>> = (0..routes.slice_count())
                    .filter_map(|s| Some(self.decided(s, self.decision(state, s)?, me)))
                    .collect();
                let r = match answers.iter().find(|a| a.is_err()) {
                    _ if answers.is_empty() => Err(e),
                    Some(refused) => refused.clone(),
                    None => answers
                        .into_iter()
                        .collect::<Result<Vec<_>, _>>()
                        .map(|v| v.join("; ")),
                };
                let _ = reply.send(r);
                return;
            }
        };
        let mut ask = Ask {
            waiting: BTreeMap::new(),
            unsent: Vec::new(),
            done: Vec::new(),
            refused: None,
            reply,
            deadline: now + ASK_TIMEOUT_NS,
        };
        for s in candidates {
            let partner = routes.partner_of(s).expect("checked");
            let primary = routes.holders(s).map(|(p, _)| p);
            if primary == Some(me) {
                // This node decides: the first request wins.
                let r = match self.decision(state, s) {
                    Some(loser) => self.decided(s, loser, me),
                    None => {
                        let episode = state.episodes.get(&s).copied().unwrap_or(0);
                        let r = self.discard_in(state, Some(s));
                        if r.is_ok() {
                            state.decisions.insert(s, (me, episode));
                            // The partner learns it before this side's
                            // discarded granules and its new word.
                            state.verdicts_out.push_back((partner, s, DECIDED, me));
                        }
                        r
                    }
                };
                match r {
                    Ok(t) => ask.done.push(t),
                    Err(e) => {
                        ask.refused.get_or_insert(e);
                    }
                }
            } else if !state.liveness.is_up(partner) {
                ask.refused.get_or_insert(format!(
                    "slice {s}: its partner node {partner}, which decides its resolve, is not \
                     reachable; resolve once it is"
                ));
            } else {
                ask.waiting.insert(s, partner);
                ask.unsent.push(s);
            }
        }
        if ask.waiting.is_empty() || ask.refused.is_some() {
            self.answer(ask);
        } else {
            state.asks.push(ask);
            self.send_asks(state, now);
        }
    }

    /// Send a finished resolve's answer.
    fn answer(&self, ask: Ask) {
        let r = match ask.refused {
            Some(e) if ask.done.is_empty() => Err(e),
            Some(e) => Err(format!("{e} (done before: {})", ask.done.join("; "))),
            None => Ok(ask.done.join("; ")),
        };
        let _ = ask.reply.send(r);
    }

    /// Send the asks and answers the window held back; time out the asks
    /// whose decider did not answer.
    fn send_asks(&mut self, state: &mut PortState, now: Ns) -> bool {
        let mut worked = false;
        while let Some(&(peer, slice, verdict, loser)) = state.verdicts_out.front() {
            let mut h = self.header_to(
                peer,
                PacketKind::WriteCompletion,
                slice as u64,
                RESOLVE_TAG,
                0,
            );
            (h.offsets, h.size) = (verdict, loser);
            if matches!(
                state.port.endpoint.send(now, peer, h, &[]),
                Err(WireError::WindowFull { .. })
            ) {
                break;
            }
            worked = true;
            state.verdicts_out.pop_front();
        }
        let me = self.driver.device().port().expect("a port").routes.node;
        let mut i = 0;
        while i < state.asks.len() {
            let ask = &mut state.asks[i];
            let mut unsent = std::mem::take(&mut ask.unsent);
            unsent.retain(|&s| {
                let peer = ask.waiting[&s];
                let mut h =
                    self.header_to(peer, PacketKind::WriteCompletion, s as u64, RESOLVE_TAG, 0);
                (h.offsets, h.size) = (ASK, me);
                let sent = state.port.endpoint.send(now, peer, h, &[]).is_ok();
                worked |= sent;
                !sent
            });
            ask.unsent = unsent;
            if now >= ask.deadline {
                let ask = state.asks.remove(i);
                let late: Vec<String> = ask
                    .waiting
                    .iter()
                    .map(|(s, p)| format!("slice {s} (node {p})"))
                    .collect();
                let mut ask = ask;
                ask.refused.get_or_insert(format!(
                    "no answer in {} s from the primary holders deciding {}",
                    ASK_TIMEOUT_NS / 1_000_000_000,
                    late.join(", ")
                ));
                self.answer(ask);
                worked = true;
                continue;
            }
            i += 1;
        }
        worked
    }

    /// A `RESOLVE_TAG` completion from `from` (`discard`).
    fn heard_resolve(&mut self, state: &mut PortState, from: u16, h: &PacketHeader) {
        let slice = h.addr as usize;
        let routes = &self.driver.device().port().expect("a port").routes;
        let me = routes.node;
        if slice >= routes.slice_count() || routes.partner_of(slice) != Some(from) {
            return;
        }
        let primary = routes.holders(slice).map(|(p, _)| p);
        let st = routes.state(slice);
        match h.offsets {
            ASK if primary == Some(me) => {
                // The partner would discard its side: decided here, once.
                let episode = state.episodes.get(&slice).copied().unwrap_or(0);
                let (verdict, loser) = match self.decision(state, slice) {
                    Some(loser) if loser == from => (GRANTED, loser),
                    Some(loser) => (REFUSED, loser),
                    None if st == ReplicaState::SplitBrain => {
                        state.decisions.insert(slice, (from, episode));
                        port_log(
                            me,
                            &format!(
                                "slice {slice}: resolve decided: node {from}'s writes are \
                                 discarded, this node's copy wins"
                            ),
                        );
                        (GRANTED, from)
                    }
                    None => (REFUSED, NO_DECISION),
                };
                state.verdicts_out.push_back((from, slice, verdict, loser));
            }
            DECIDED if primary == Some(from) => {
                let episode = state.episodes.get(&slice).copied().unwrap_or(0);
                state.decisions.insert(slice, (h.size, episode));
            }
            GRANTED | REFUSED if primary == Some(from) => {
                let Some(i) = state
                    .asks
                    .iter()
                    .position(|a| a.waiting.get(&slice) == Some(&from))
                else {
                    return;
                };
                state.asks[i].waiting.remove(&slice);
                let result = if h.offsets == GRANTED {
                    let episode = state.episodes.get(&slice).copied().unwrap_or(0);
                    state.decisions.insert(slice, (me, episode));
                    if st == ReplicaState::SplitBrain {
                        self.discard_in(state, Some(slice))
                    } else {
                        self.decided(slice, me, me)
                    }
                } else if h.size == NO_DECISION {
                    Err(format!(
                        "slice {slice}: node {from}, which decides its resolve, does not hold it \
                         in split brain (moneta san status)"
                    ))
                } else {
                    let episode = state.episodes.get(&slice).copied().unwrap_or(0);
                    state.decisions.insert(slice, (h.size, episode));
                    self.decided(slice, h.size, me)
                };
                let ask = &mut state.asks[i];
                match result {
                    Ok(t) => ask.done.push(t),
                    Err(e) => {
                        ask.refused.get_or_insert(e);
                    }
                }
                if ask.waiting.is_empty() {
                    let ask = state.asks.remove(i);
                    self.answer(ask);
                }
            }
            _ => {}
        }
    }

    fn discard_in(
        &mut self,
        state: &mut PortState,
        slice: Option<usize>,
    ) -> Result<String, String> {
        let routes = self.driver.device().port().expect("a port").routes.clone();
        let candidates = copies_in(&routes, slice, ReplicaState::SplitBrain)?;
        let mut done = Vec::new();
        for s in candidates {
            let partner = routes.partner_of(s).expect("checked");
            if !state.liveness.is_up(partner) {
                return Err(format!(
                    "slice {s}: its partner node {partner} is not reachable; resolve once it is \
                     (it must take the discarded granules)"
                ));
            }
            // Its copy mixes both sides from now on: not a whole generation
            // (recorded first), until the winner's resync is done.
            if !state.record_inconsistent(s) {
                return Err(format!(
                    "slice {s}: the replica metadata on this node's image cannot be written"
                ));
            }
            let (lo, hi) = slice_range(&routes, s);
            let granules = state.port.dirty.take_in(partner, lo, hi);
            let n = granules.len();
            state.discards.entry(partner).or_default().extend(granules);
            // Failed writes this copy may hold go the same way.
            self.settle_unsure(state, partner, s, false);
            if let Some(r) = self.driver.routes_mut() {
                r.set_state(s, ReplicaState::Outdated);
            }
            state.told.remove(&(partner, s));
            state.heard.remove(&(partner, s));
            state.announced.remove(&(partner, s));
            state.retell.insert((partner, s));
            port_log(
                state.stats.node,
                &format!(
                    "slice {s}: discarded this node's {n} granules written alone; node \
                 {partner}'s copy wins and resyncs them here"
                ),
            );
            done.push(format!(
                "slice {s}: {n} granules written here discarded, node {partner}'s copy wins"
            ));
        }
        // The discarded granules leave the file now.
        state.port.dirty.save().map_err(|e| e.to_string())?;
        Ok(done.join("; "))
    }

    /// `moneta san resolve --force` on this node (DRBD's forced promotion):
    /// its outdated copies whose partner is unreachable (all, or `slice`)
    /// are declared up to date, so they are read and take writes alone
    /// again, though they may lack writes the partner acknowledged before
    /// it went down (that is what forcing accepts). Inconsistent copies (a
    /// resync cut short: a mix of old and new granules) and split-brain
    /// ones are refused. When the partner returns, the ordinary exchange
    /// decides: if only one side wrote meanwhile it is the source; if both
    /// did, the slice is in split brain until `resolve --discard`.
    pub(super) fn force(&mut self, slice: Option<usize>) -> Result<String, String> {
        let Some(mut state) = self.port.take() else {
            return Err("this daemon is not a SAN node".into());
        };
        let result = self.force_in(&mut state, slice);
        self.port = Some(state);
        result
    }

    fn force_in(&mut self, state: &mut PortState, slice: Option<usize>) -> Result<String, String> {
        let routes = self.driver.device().port().expect("a port").routes.clone();
        let candidates = copies_in(&routes, slice, ReplicaState::Outdated)?;
        for &s in &candidates {
            if !state.whole(s) {
                return Err(format!(
                    "slice {s}: this copy is not a whole generation (its replica metadata says \
                     inconsistent: a resync into it did not finish, or it discarded its \
                     writes): it is never forced; only its partner's resync makes it up to date"
                ));
            }
        }
        for &s in &candidates {
            let partner = routes.partner_of(s).expect("checked");
            if state.liveness.is_up(partner) {
                return Err(format!(
                    "slice {s}: its partner node {partner} is reachable: it tells this copy what \
                     it missed (wait for the resync; `moneta san status` shows it)"
                ));
            }
        }
        let mut done = Vec::new();
        for s in candidates {
            let partner = routes.partner_of(s).expect("checked");
            // A forced copy starts a generation of its own (recorded first).
            if !state.record(s, |c| CopyMeta {
                state: Stored::UpToDate,
                full: false,
                generation: c.generation + 1,
            }) {
                return Err(format!(
                    "slice {s}: the replica metadata on this node's image cannot be written"
                ));
            }
            if let Some(r) = self.driver.routes_mut() {
                r.set_state(s, ReplicaState::UpToDate);
            }
            port_log(
                state.stats.node,
                &format!(
                    "slice {s}: this outdated copy forced up to date (node {partner} \
                 unreachable); it may lack writes node {partner} acknowledged"
                ),
            );
            done.push(format!(
                "slice {s}: forced up to date (it may lack writes node {partner} acknowledged \
                 before it went down)"
            ));
        }
        Ok(done.join("; "))
    }

    /// Per partner that is up: hand over discarded granules, tell it
    /// per shared slice what it missed here, resync the slices this copy
    /// is the source of, and say when each is in sync (module header).
    fn resync(&mut self, state: &mut PortState, now: Ns) -> bool {
        if self.resync_idle(state) {
            return false;
        }
        let mut worked = false;
        let peers = state.port.endpoint.config().peers.clone();
        let routes = self.driver.device().port().expect("a port").routes.clone();
        for peer in peers {
            if !state.liveness.is_up(peer) || !state.liveness.wire_up(peer) {
                continue;
            }
            // Discarded granules first: the partner must hold them as
            // missed before it hears this side's new word.
            if let Some(queue) = state.discards.get_mut(&peer) {
                while let Some(&global) = queue.front() {
                    let header =
                        self.header_to(peer, PacketKind::WriteCompletion, global, DISCARD_TAG, 0);
                    if state.port.endpoint.send(now, peer, header, &[]).is_err() {
                        break;
                    }
                    worked = true;
                    queue.pop_front();
                }
                if !queue.is_empty() {
                    continue;
                }
                state.discards.remove(&peer);
            }
            for slice in routes.shared_slices(peer) {
                let (lo, hi) = slice_range(&routes, slice);
                let key = (peer, slice);
                // Generations, DRBD-style: each side first says how much
                // the other missed here; the side that wrote alone is the
                // source.
                if !state.told.contains(&key) {
                    // What the partner is told it missed is what a restart
                    // of this node would claim: the clears are in the file
                    // first (else a node killed now comes back claiming
                    // granules the partner already has, and the partner,
                    // which then wrote alone, looks like a split brain).
                    if !state.save_dirty(now) {
                        continue;
                    }
                    // Strong claims only: weak ones are resynced, but do
                    // not make this side the source (`dirty::WEAK`).
                    let missed = state.port.dirty.strong_in(peer, lo, hi).min(COUNT_MASK);
                    let mut word =
                        (slice as u64) << 48 | state_code(routes.state(slice)) << 40 | missed;
                    if state.retell.contains(&key) {
                        word |= RETELL;
                    }
                    if state.port.meta.copy(slice).full && !state.whole(slice) {
                        word |= FULL;
                    }
                    let header =
                        self.header_to(peer, PacketKind::WriteCompletion, word, MISSED_TAG, 0);
                    if state.port.endpoint.send(now, peer, header, &[]).is_ok() {
                        worked = true;
                        state.told.insert(key);
                        state.retell.remove(&key);
                    }
                    continue;
                }
                if !state.heard.contains_key(&key) || routes.state(slice) != ReplicaState::UpToDate
                {
                    continue;
                }
                let in_flight = state
                    .resyncing
                    .iter()
                    .filter(|(&(p, _), &(g, _))| p == peer && routes.slice_of(g) == slice)
                    .count();
                if state.port.dirty.granules_in(peer, lo, hi) == 0 {
                    if in_flight > 0 || state.announced.contains(&key) {
                        continue;
                    }
                    // The partner goes up to date (and may then write
                    // alone) on this word: the file must no longer say it
                    // missed anything here (as for `MISSED_TAG` above).
                    if !state.save_dirty(now) {
                        continue;
                    }
                    let mut header = self.header_to(
                        peer,
                        PacketKind::WriteCompletion,
                        slice as u64,
                        SYNC_DONE_TAG,
                        0,
                    );
                    // The generation the partner now holds (a completion
                    // carries no payload: OFFSETS and SIZE are free).
                    let generation = state.port.meta.copy(slice).generation;
                    header.offsets = generation as u16;
                    header.size = (generation >> 16) as u16;
                    if state.port.endpoint.send(now, peer, header, &[]).is_ok() {
                        worked = true;
                        state.announced.insert(key);
                    }
                    continue;
                }
                let peer_in_flight = state.resyncing.keys().filter(|&&(p, _)| p == peer).count();
                if peer_in_flight >= RESYNC_WINDOW {
                    continue;
                }
                for global in state.port.dirty.pending_in(peer, lo, hi, RESYNC_WINDOW * 4) {
                    if state.resyncing.keys().filter(|&&(p, _)| p == peer).count() >= RESYNC_WINDOW
                    {
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
                    let mut header = self.header_to(
                        peer,
                        PacketKind::WriteRequest,
                        at,
                        RESYNC_TAG,
                        bytes as u16,
                    );
                    // Whether this copy's version must win the granule
                    // (strong) or only converge (weak): the target settles
                    // a granule both sides claim (`resync_conflict`).
                    if state.port.dirty.claim_on(peer, global) == Some(true) {
                        header.offsets = RESYNC_STRONG;
                    }
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
        }
        worked
    }

    /// Whether `resync` has nothing to send this turn, judged without
    /// copying the route table (most turns: a fifth of the simulator's
    /// CPU went to that copy and to a loop that found nothing): nothing in
    /// flight, discarded or marked, and every up partner told, and told
    /// its resync is done where this copy is its source.
    fn resync_idle(&self, state: &PortState) -> bool {
        if !state.resyncing.is_empty()
            || !state.port.dirty.is_empty()
            || state.discards.values().any(|q| !q.is_empty())
        {
            return false;
        }
        let routes = &self.driver.device().port().expect("a port").routes;
        state
            .port
            .endpoint
            .config()
            .peers
            .iter()
            .filter(|&&p| state.liveness.is_up(p) && state.liveness.wire_up(p))
            .all(|&peer| {
                routes.shared_slices(peer).into_iter().all(|slice| {
                    let key = (peer, slice);
                    state.told.contains(&key)
                        && (!state.heard.contains_key(&key)
                            || routes.state(slice) != ReplicaState::UpToDate
                            || state.announced.contains(&key))
                })
            })
    }

    /// `from` says, for `slice`, the state of its copy and how many
    /// granules this copy missed there: decide this copy's state (module
    /// header).
    fn heard_missed(&mut self, state: &mut PortState, from: u16, word: u64) {
        let slice = (word >> 48) as usize;
        // Unsure granules this copy came up with (a node killed with
        // writes in flight: the activity log) are settled as at a regain.
        let routes = &self.driver.device().port().expect("a port").routes;
        if routes.partner_of(slice) == Some(from) {
            let wins = self.copy_wins(state, from, slice);
            self.settle_unsure(state, from, slice, wins);
        }
        let theirs_state = state_of_code((word >> 40) & STATE_MASK);
        let theirs = word & COUNT_MASK;
        let key = (from, slice);
        if word & RETELL != 0 {
            // It discarded its side: tell it again (it is now the target).
            state.told.remove(&key);
            state.announced.remove(&key);
        }
        state.heard.insert(key, (theirs_state, theirs));
        let Some(routes) = self.driver.routes_mut() else {
            return;
        };
        if routes.partner_of(slice) != Some(from) {
            return;
        }
        let (lo, hi) = slice_range(routes, slice);
        let before = routes.state(slice);
        if word & FULL != 0 && state.whole(slice) && before != ReplicaState::SplitBrain {
            // The partner's copy is blank: every granule goes to it (strong
            // claims: this copy is its source).
            state.mark(
                from,
                lo,
                hi - lo,
                "the partner's copy is blank: a full resync",
            );
        }
        let mine = state.port.dirty.strong_in(from, lo, hi);
        let mut after = match (mine > 0, theirs > 0) {
            (true, true) => ReplicaState::SplitBrain,
            (false, true) => ReplicaState::Inconsistent,
            // Not a whole generation: only the partner's word that the
            // resync is done makes it up to date (`SYNC_DONE_TAG`).
            _ if !state.whole(slice) => ReplicaState::Inconsistent,
            // The source, or neither missed anything: the copies agree on
            // every acknowledged write (the dirty maps are durable).
            _ => ReplicaState::UpToDate,
        };
        // A resync target is recorded inconsistent before its first resync
        // write (`replica_meta`'s update order); if that cannot be
        // recorded, the copy stays unreadable and takes no resync write.
        if after == ReplicaState::Inconsistent && !state.record_inconsistent(slice) {
            after = ReplicaState::Outdated;
        }
        routes.set_state(slice, after);
        match after {
            ReplicaState::Inconsistent => {
                state.incoming.insert(slice, (theirs, 0));
                // The partner wrote alone: its version wins the granules
                // this copy only meant to converge (`dirty::WEAK`); they go
                // to it like discarded ones, and it resyncs them here.
                let handed = state.port.dirty.take_weak_in(from, lo, hi);
                if !handed.is_empty() {
                    state.discards.entry(from).or_default().extend(handed);
                }
            }
            _ => {
                state.incoming.remove(&slice);
            }
        }
        if (mine > 0 || theirs > 0 || before != after) && after != ReplicaState::SplitBrain {
            // Rare (each time two partners meet), and what a post-mortem
            // of a resync needs.
            port_log(
                state.stats.node,
                &format!(
                    "slice {slice} with node {from}: it missed {mine} granules here, this node \
                     missed {theirs} there (its copy {}); this copy {} -> {}",
                    theirs_state.as_str(),
                    before.as_str(),
                    after.as_str()
                ),
            );
        }
        if after == ReplicaState::SplitBrain && before != after {
            *state.episodes.entry(slice).or_default() += 1;
            port_log(
                state.stats.node,
                &format!(
                    "split brain with node {from} on slice {slice}: it missed {mine} \
                 granules here and this node missed {theirs} there; neither copy is read or \
                 written until `moneta san resolve --discard NODE --slice {slice}`"
                ),
            );
        }
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

    /// The activity log before a client's write of global `[addr, addr +
    /// len)` reaches this node's copies (DRBD's activity log; `PortState::
    /// active`): each granule of a mirrored copy held here is marked
    /// unsure with respect to its partner, durably. Returns false when the
    /// marks cannot be made durable (a full disk): the write then fails
    /// before it touches the copy, or a kill could leave this copy holding
    /// a write its partner never got, unrecorded.
    pub(super) fn activity_begin(&mut self, now: Ns, addr: u64, len: u64) -> bool {
        let Some(state) = self.port.as_mut() else {
            return true;
        };
        let routes = &self.driver.device().port().expect("a port").routes;
        let granules = active_granules(routes, addr, len);
        if granules.is_empty() {
            return true;
        }
        // The granules unsure already, by an earlier write that failed and
        // is no longer in flight: they stay unsure whatever this one does.
        let (was_unsure, granules): (Vec<_>, Vec<_>) =
            granules.into_iter().partition(|&(partner, g)| {
                !state.active.contains_key(&(partner, g))
                    && state.port.dirty.is_unsure(partner, g * GRANULE_BYTES)
            });
        for &(partner, g) in was_unsure.iter().chain(&granules) {
            state.active.entry((partner, g)).or_insert((0, false)).0 += 1;
            state.mark_unsure(partner, g);
        }
        if state.flush_dirty(now) {
            return true;
        }
        // The write fails before it touches this copy: it leaves nothing
        // unsure of its own (kept, its granules would be settled later in
        // this copy's favour as a failed write's, a claim on granules
        // nothing was written to). Another write in flight on a granule
        // still decides it (`activity_done`).
        state.activity_done(&was_unsure, false);
        state.activity_done(&granules, true);
        false
    }

    /// A client's write of global `[addr, addr + len)` begun with
    /// `activity_begin` finished: acknowledged (`ok`: both copies have it,
    /// or this one alone with the partner's miss recorded) or not (its
    /// granules stay unsure until the partners meet or one is lost).
    pub(super) fn activity_end(&mut self, addr: u64, len: u64, ok: bool) {
        let Some(state) = self.port.as_mut() else {
            return;
        };
        if state.active.is_empty() {
            return;
        }
        let routes = &self.driver.device().port().expect("a port").routes;
        let granules = active_granules(routes, addr, len);
        state.activity_done(&granules, ok);
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
            let key = if m.alone { m.node } else { unsure(m.node) };
            state.mark(
                key,
                m.addr,
                m.bytes,
                if m.alone {
                    "a write acknowledged alone"
                } else {
                    "a failed write"
                },
            );
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
            if h.kind == PacketKind::WriteCompletion && h.ctrl & CTRL_REFUSED != 0 {
                if h.tag == RESYNC_TAG {
                    // The target could not take it now: the granule stays
                    // missed and goes again (held in flight, it would stall
                    // the slice's resync for good).
                    state.resyncing.remove(&(from, h.addr));
                    continue;
                }
                if self.driver.refused(now, from, &h) {
                    state.refusal(format!(
                        "node {from} refused a request on its copy (its device address {}): \
                         not up to date, or in split brain (moneta san status)",
                        h.addr
                    ));
                }
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == RESYNC_TAG {
                if let Some((global, again)) = state.resyncing.remove(&(from, h.addr)) {
                    if !again {
                        state.port.dirty.clear(from, global);
                        state.stats.resync_granules += 1;
                    }
                }
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == VIEW_TAG {
                let view = liveness::View {
                    hears: h.addr,
                    seq: h.offsets,
                    echo: h.size,
                    promise: h.cmd == 1,
                };
                state.liveness.view(now, from, view);
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == MISSED_TAG {
                // Said while it counted us up; if it is lost here since,
                // it says it again once back (`regain` asks for that).
                if state.liveness.is_up(from) {
                    self.heard_missed(state, from, h.addr);
                }
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == RESOLVE_TAG {
                self.heard_resolve(state, from, &h);
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == PEER_ACK_TAG {
                self.heard_peer_ack(state, from, &h);
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == DISCARD_TAG {
                // The partner discarded its write of this granule: ours goes
                // to it in the resync.
                state.mark(
                    weak(from),
                    h.addr,
                    GRANULE_BYTES,
                    "the partner discarded it",
                );
                continue;
            }
            if h.kind == PacketKind::WriteCompletion && h.tag == SYNC_DONE_TAG {
                // Only from a partner that is up here, like `MISSED_TAG`:
                // a copy made up to date while its partner is lost would
                // skip the suspension and the tie-breaker (`lose`,
                // `decide`) and take writes alone at once, while the
                // partner, which counts this node up, serves its own copy
                // (seed 39100230: a write acknowledged alone here 13 ms
                // after the loss, then read stale there). Once back, the
                // exchange starts over and the partner says it again.
                let up = state.liveness.is_up(from);
                if let Some(routes) = self.driver.routes_mut().filter(|_| up) {
                    let slice = h.addr as usize;
                    let generation = u64::from(h.offsets) | u64::from(h.size) << 16;
                    if routes.partner_of(slice) == Some(from)
                        && matches!(
                            routes.state(slice),
                            ReplicaState::Inconsistent | ReplicaState::Outdated
                        )
                        // A whole generation again: recorded before it serves.
                        && state.record(slice, |_| CopyMeta {
                            state: Stored::UpToDate,
                            full: false,
                            generation,
                        })
                    {
                        routes.set_state(slice, ReplicaState::UpToDate);
                        state.incoming.remove(&slice);
                        port_log(
                            state.stats.node,
                            &format!(
                                "slice {slice}: node {from} says the resync is done: up to date"
                            ),
                        );
                    }
                }
                continue;
            }
            if matches!(h.kind, PacketKind::ReadRequest | PacketKind::WriteRequest)
                && self.refuse_request(state, from, &h)
            {
                continue;
            }
            if h.kind == PacketKind::WriteRequest && !self.remote_begin(state, now, from, &h, n) {
                // Its receiving-side log cannot be made durable: the write
                // does not land, and is refused (the writer fails it).
                let mut header =
                    self.header_to(from, PacketKind::WriteCompletion, h.addr, h.tag, 0);
                header.offsets = h.offsets;
                header.ctrl |= CTRL_REFUSED;
                state.refusals_out.push_back((from, header));
                state.refusal(format!(
                    "a write from node {from} at its device address {}: the dirty map cannot be \
                     made durable ({})",
                    h.addr,
                    state.stats.dirty_save_error.clone().unwrap_or_default()
                ));
                continue;
            }
            self.arrival_data(state, from, &h, n);
            self.driver.receive_packet(now, from, h);
        }
        worked
    }

    /// The receiving side's activity log (`PortState::remote`) before a
    /// mirrored write of `from`, a writer that holds no copy of the slice,
    /// lands on this copy: each granule is marked unsure with respect to
    /// the partner, durably. Resync and degraded writes are not (a resync
    /// comes from the partner; a degraded copy records the partner's miss
    /// itself), nor a holder's write (its own activity log marks it).
    /// Returns false when the marks cannot be made durable (they are then
    /// taken back): the write must not land.
    fn remote_begin(
        &mut self,
        state: &mut PortState,
        now: Ns,
        from: u16,
        h: &PacketHeader,
        len: usize,
    ) -> bool {
        if h.tag == RESYNC_TAG || h.ctrl & CTRL_DEGRADED != 0 || len == 0 {
            return true;
        }
        let routes = &self.driver.device().port().expect("a port").routes;
        let Some(global) = routes.global_of(h.addr) else {
            return true;
        };
        let slice = routes.slice_of(global);
        if routes
            .holders(slice)
            .is_none_or(|(a, b)| a == from || b == from)
        {
            return true;
        }
        let granules = active_granules(routes, global, len as u64);
        let mut new = Vec::new();
        for &(partner, g) in &granules {
            let key = (partner, g);
            let fresh = !state.active.contains_key(&key) && !state.remote.contains_key(&key);
            // Unsure already by an earlier failed write: it stays so.
            let was = fresh && state.port.dirty.is_unsure(partner, g * GRANULE_BYTES);
            let e = state
                .remote
                .entry(key)
                .or_insert_with(|| (BTreeSet::new(), was));
            if e.0.insert(from) {
                new.push(key);
            }
            state.mark_unsure(partner, g);
        }
        if state.flush_dirty(now) {
            return true;
        }
        for (partner, g) in new {
            state.remote_done(partner, g, from, true);
        }
        false
    }

    /// A writer's peer acknowledgement (`PEER_ACK_TAG`): its write on the
    /// granules leaves the receiving side's log; a failed one settles them
    /// with the partner if it is up.
    fn heard_peer_ack(&mut self, state: &mut PortState, from: u16, h: &PacketHeader) {
        let routes = &self.driver.device().port().expect("a port").routes;
        let slice = routes.slice_of(h.addr);
        let Some(partner) = routes.partner_of(slice) else {
            return;
        };
        let ok = h.offsets & PEER_ACK_OK != 0;
        let first = h.addr / GRANULE_BYTES;
        let granules: Vec<(u16, u64)> = (first..first + u64::from(h.size))
            .map(|g| (partner, g))
            .collect();
        for &(p, g) in &granules {
            state.remote_done(p, g, from, ok);
        }
        if !ok {
            self.settle_failed(state, from, &granules);
        }
    }

    /// A client's mirrored write of global `[addr, addr + len)` finished
    /// (`ok`: acknowledged): for each slice it touched that this node
    /// holds no copy of, both holders are told (a peer acknowledgement,
    /// `PEER_ACK_TAG`), so their receiving-side logs forget or settle it.
    pub(super) fn peer_ack(&mut self, now: Ns, addr: u64, len: u64, ok: bool) {
        let Some(mut state) = self.port.take() else {
            return;
        };
        let routes = &self.driver.device().port().expect("a port").routes;
        let end = addr.saturating_add(len);
        let mut at = addr;
        let mut acks = Vec::new();
        while at < end && routes.mirrored() {
            let slice = routes.slice_of(at);
            let stop = slice_range(routes, slice).1.min(end);
            if stop <= at {
                break;
            }
            if let (Some((a, b)), None) = (routes.holders(slice), routes.partner_of(slice)) {
                let (first, last) = (at / GRANULE_BYTES, (stop - 1) / GRANULE_BYTES);
                let mut g = first;
                while g <= last {
                    let n = (last - g + 1).min(u64::from(u16::MAX));
                    for holder in [a, b] {
                        acks.push((holder, g * GRANULE_BYTES, n as u16));
                    }
                    g += n;
                }
            }
            at = stop;
        }
        for (holder, global, n) in acks {
            let mut header =
                self.header_to(holder, PacketKind::WriteCompletion, global, PEER_ACK_TAG, n);
            if ok {
                header.offsets = PEER_ACK_OK;
            }
            state.peer_acks_out.push_back((holder, header));
        }
        self.send_peer_acks(&mut state, now);
        self.port = Some(state);
    }

    /// Send the peer acknowledgements the window held back. One that
    /// cannot go to a failed peer is dropped: it orphans the write there
    /// when it loses this node (`orphan_writes`).
    fn send_peer_acks(&mut self, state: &mut PortState, now: Ns) -> bool {
        send_queued(&mut state.port.endpoint, &mut state.peer_acks_out, now)
    }

    /// A peer's request on this node's copy of a slice whose state forbids
    /// it (module header): answered with a refusal, not served. Returns
    /// whether it was refused. Counts resync writes as they come.
    fn refuse_request(&mut self, state: &mut PortState, from: u16, h: &PacketHeader) -> bool {
        let routes = &self.driver.device().port().expect("a port").routes;
        let Some(global) = routes.global_of(h.addr) else {
            return false;
        };
        let slice = routes.slice_of(global);
        if routes.partner_of(slice).is_none() {
            return false;
        }
        let st = routes.state(slice);
        if h.kind == PacketKind::WriteRequest && h.tag == RESYNC_TAG {
            let primary = routes.holders(slice).is_some_and(|(p, _)| p == routes.node);
            if resync_conflict(&mut state.port.dirty, from, global, h.offsets, primary) {
                let mut header =
                    self.header_to(from, PacketKind::WriteCompletion, h.addr, h.tag, 0);
                header.ctrl |= CTRL_REFUSED;
                state.refusals_out.push_back((from, header));
                return true;
            }
            // A copy that is not up to date is no longer a whole generation
            // once a resync write lands: recorded first, or the write is
            // dropped (the resync stalls; the log says why).
            if st != ReplicaState::UpToDate && !state.record_inconsistent(slice) {
                return true;
            }
            if let Some((_, got)) = state.incoming.get_mut(&slice) {
                *got += 1;
            }
            return false;
        }
        // A degraded copy is the only live one only if this node cannot
        // reach its partner either: the sender lost the partner, but while
        // this node still counts it up the partner serves its own copy,
        // which would miss the write (a cut link between the sender and
        // the partner; found by `moneta san chaos --clients-on any`).
        let partner_up = routes.partner_of(slice).is_some_and(|p| !routes.is_down(p));
        let refuse = match h.kind {
            PacketKind::ReadRequest => st != ReplicaState::UpToDate,
            _ => {
                st == ReplicaState::SplitBrain
                    || (h.ctrl & CTRL_DEGRADED != 0 && (st != ReplicaState::UpToDate || partner_up))
                    || routes.refusal(global, u64::from(h.size)).is_some()
            }
        };
        if !refuse {
            return false;
        }
        let partner = routes.partner_of(slice).expect("checked");
        if h.kind == PacketKind::WriteRequest
            && h.ctrl & CTRL_DEGRADED != 0
            && partner_up
            && st == ReplicaState::UpToDate
        {
            // The same write's ordinary copy may have landed here: one
            // side's version of those granules wins, so the two copies do
            // not stay different. This one's only if it is already ahead
            // of the partner (resynced to it); being the primary is not
            // enough here: outside the tie-breaker the partner may be
            // ahead, and marking this side ahead too would split the
            // brain. Else the granules are handed over like discarded
            // ones (the partner's version wins).
            let (lo, hi) = slice_range(routes, slice);
            let size = u64::from(h.size).max(1);
            if state.port.dirty.granules_in(partner, lo, hi) > 0 {
                state.mark(
                    weak(partner),
                    global,
                    size,
                    "a refused degraded write, this copy ahead",
                );
            } else {
                let granules = (global / GRANULE_BYTES..(global + size).div_ceil(GRANULE_BYTES))
                    .map(|g| g * GRANULE_BYTES);
                state.discards.entry(partner).or_default().extend(granules);
            }
        }
        let mut header = self.header_to(from, PacketKind::WriteCompletion, h.addr, h.tag, 0);
        header.offsets = h.offsets;
        header.ctrl |= CTRL_REFUSED;
        state.refusals_out.push_back((from, header));
        state.refusal(format!(
            "a {} from node {from} on slice {slice}: this node's copy is {} (node {partner} holds \
             the other{})",
            if h.kind == PacketKind::ReadRequest {
                "read"
            } else {
                "write"
            },
            st.as_str(),
            if routes.is_down(partner) {
                ", unreachable"
            } else if h.ctrl & CTRL_DEGRADED != 0 {
                ", reachable from here: a degraded copy would leave it behind"
            } else {
                ""
            }
        ));
        true
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
                        state.mark(partner, global, len as u64, "a degraded write taken");
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
    /// Unless the dirty map is `durable`, the acknowledgement of a peer's
    /// write on a granule not yet recorded leaves as a refusal instead.
    fn send_due(&mut self, state: &mut PortState, now: Ns, durable: bool) -> bool {
        let mut worked = false;
        while state.outgoing.front().is_some_and(|&(t, _)| t <= now) {
            worked = true;
            let (_, mut p) = state.outgoing.pop_front().expect("checked");
            if !durable && p.header.kind == PacketKind::WriteCompletion {
                let routes = &self.driver.device().port().expect("a port").routes;
                let span = state.port.endpoint.max_payload_bytes() as u64;
                if routes
                    .global_of(p.header.addr)
                    .is_some_and(|g| state.unrecorded(g, span))
                {
                    p.header.ctrl |= CTRL_REFUSED;
                    let why = format!(
                        "a write from node {} at its device address {}: the dirty map cannot be \
                         made durable ({})",
                        p.to_node,
                        p.header.addr,
                        state.stats.dirty_save_error.clone().unwrap_or_default()
                    );
                    state.refusal(why);
                }
            }
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

/// Send the payload-less completions of `queue` while the window takes
/// them (one to a failed peer is dropped). Returns whether any went.
fn send_queued(
    endpoint: &mut Endpoint<Box<dyn Transport + Send>>,
    queue: &mut VecDeque<(u16, PacketHeader)>,
    now: Ns,
) -> bool {
    let mut worked = false;
    while let Some(&(peer, header)) = queue.front() {
        match endpoint.send(now, peer, header, &[]) {
            Err(WireError::WindowFull { .. }) => break,
            _ => {
                worked = true;
                queue.pop_front();
            }
        }
    }
    worked
}

/// The (partner, granule) pairs of the mirrored copies held here that a
/// write of global `[addr, addr + len)` touches (the activity log).
fn active_granules(routes: &RouteTable, addr: u64, len: u64) -> Vec<(u16, u64)> {
    let mut out = Vec::new();
    if !routes.mirrored() || len == 0 {
        return out;
    }
    let end = addr.saturating_add(len);
    let mut at = addr;
    while at < end {
        let slice = routes.slice_of(at);
        let stop = slice_range(routes, slice).1.min(end);
        if stop <= at {
            break;
        }
        if let Some(partner) = routes.partner_of(slice) {
            out.extend((at / GRANULE_BYTES..=(stop - 1) / GRANULE_BYTES).map(|g| (partner, g)));
        }
        at = stop;
    }
    out
}

/// A resync write from `from` of the granule at global `global` (its
/// OFFSETS: `RESYNC_STRONG` or not) meets this copy's own claim on `from`
/// for that granule: both sides would send their version, each landing
/// would make the other's go again, and the two copies would swap versions
/// for as long as they both claim it, over the writes that land meanwhile
/// (seed 82494783: a granule this node handed over as discarded while its
/// partner was away, then settled in its own favour as unsure at the
/// meeting, resynced both ways 5,000 times in 65 ms until a read found an
/// acknowledged write overwritten). One version wins: a strong claim over a
/// weak one (`dirty::WEAK`), and between two weak ones the slice's primary
/// holder's. Returns whether the write is refused (this copy's version
/// wins: the sender keeps its claim and sends again, until this copy's
/// version lands there and it drops it); when the sender's wins, this
/// copy's weak claim is dropped and the write lands. Two strong claims are
/// a split brain, which the exchange stops before any resync.
fn resync_conflict(
    dirty: &mut DirtyMap,
    from: u16,
    global: u64,
    offsets: u16,
    primary: bool,
) -> bool {
    let theirs_strong = offsets & RESYNC_STRONG != 0;
    match dirty.claim_on(from, global) {
        Some(true) => !theirs_strong,
        Some(false) if !theirs_strong && primary => true,
        Some(false) => {
            dirty.drop_weak(from, global);
            false
        }
        None => false,
    }
}

/// `DeviceThread::copy_wins` on a route table and dirty map.
fn copy_wins_in(
    routes: &RouteTable,
    dirty: &DirtyMap,
    partner: u16,
    slice: usize,
    lo: u64,
    hi: u64,
) -> bool {
    let fit = matches!(
        routes.state(slice),
        ReplicaState::UpToDate | ReplicaState::Suspended
    );
    let behind = dirty.granules_in(partner, lo, hi) > 0;
    let primary = routes.holders(slice).is_some_and(|(p, _)| p == routes.node);
    behind || (fit && primary)
}

/// The mirrored slices whose copy here is in state `want`: `slice`
/// (checked: it exists, this node holds a mirrored copy, in that state),
/// or all of them; an error if none (`moneta san resolve`).
fn copies_in(
    routes: &RouteTable,
    slice: Option<usize>,
    want: ReplicaState,
) -> Result<Vec<usize>, String> {
    let candidates: Vec<usize> = match slice {
        Some(s) if s >= routes.slice_count() => {
            return Err(format!(
                "slice {s} does not exist (the SAN has {})",
                routes.slice_count()
            ))
        }
        Some(s) if routes.partner_of(s).is_none() => {
            return Err(format!("this node holds no mirrored copy of slice {s}"))
        }
        Some(s) if routes.state(s) != want => {
            return Err(format!(
                "slice {s}: this node's copy is {}, not {}",
                routes.state(s).as_str(),
                want.as_str()
            ))
        }
        Some(s) => vec![s],
        None => (0..routes.slice_count())
            .filter(|&s| routes.partner_of(s).is_some() && routes.state(s) == want)
            .collect(),
    };
    if candidates.is_empty() {
        return Err(format!(
            "no mirrored copy this node holds is {}",
            want.as_str()
        ));
    }
    Ok(candidates)
}
