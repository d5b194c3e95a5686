//! Who is alive as this SAN node sees it, and which side of a cut link
//! writes alone (issue 22: leases and a tie-breaker; SPEC §4.3's failover
//! made safe against partitions, after DRBD 9's quorum with a tiebreaker
//! node and the leases of primary-backup systems).
//!
//! The wire (`moneta_wire::Endpoint`) declares a peer failed after a
//! second of silence, each end on its own. Two ends of one cut link each
//! keep a majority of a three-node SAN, so quorum alone let both write a
//! mirrored slice alone (a split brain, found by `moneta san chaos`), and a
//! copy went on serving reads until its own declaration while its partner,
//! which had declared first, already wrote alone. This module adds what
//! decides those cases:
//!
//! - **Views.** Every `view_every_ns` each node tells every peer whose wire
//!   session is up which peers it hears (a bitmap of those whose view
//!   reached it within the lease; `VIEW_TAG` completions), numbers the view
//!   (a sequence number per peer, kept with its send time), echoes the
//!   number of the newest view it has from that peer, and says whether it
//!   counts that peer up (its *promise*).
//! - **Lease.** A peer is *up* here while its session is up and its
//!   promise covers now: the promise in a view is anchored at *this*
//!   node's send time of the view it echoes, and lasts `lease_ns` from
//!   there. Anchoring at the send time, not at the arrival, keeps the lease
//!   honest when this node's thread was starved and reads its views late
//!   (a loaded host: the views queued meanwhile would otherwise renew it
//!   with the time they were read). A view that withdraws the promise
//!   loses the peer at once (a link cut one way: the end that stopped
//!   hearing tells the other within a view), unless it answers a view of
//!   this node's that promised nothing either (the peer has not yet seen
//!   this node take it back). A peer lost comes back on a view saying it
//!   hears this node, with one lease to make its promise.
//! - **Suspended, then alone.** A copy shared with a partner is read and
//!   written only while the partner is up; once lost the copy is
//!   *suspended* (no reads, no write alone). It may go on alone only
//!   [`Liveness::settle_ns`] after the loss: this node withdrew its promise
//!   when it lost the partner, so the partner's last promise from it,
//!   anchored at a view the partner sent before this node last echoed
//!   one, has expired by then, however late the partner's thread runs (a
//!   grace more for a turn of it that had already checked its leases).
//! - **Tie-breaker.** When the grace has passed, the copy decides
//!   ([`decide`]): a node without a majority outdates it (as before); else,
//!   if a third node (a witness) still hears the partner, the partner is
//!   alive and only the link between them is cut: the *winner* goes on
//!   alone and the other copy is outdated until the partner tells it what it
//!   missed. The winner is the copy its partner is behind (this node holds
//!   granules the partner missed), else the slice's primary. If no witness
//!   hears the partner either, it is dead or cut off from everyone (and
//!   then without a majority): this copy goes on alone, degraded, as before.
//!
//! A SAN of two has no witness and no majority to keep: both ends of a cut
//! link go on alone, and heal into a split brain (documented).

use moneta_model::units::Ns;
use std::collections::{BTreeMap, VecDeque};

/// The TAG of a completion carrying a view. ADDR: bit 63 set when the
/// sender hears the receiver; bit `i` (< 63) set when it hears node `i`.
/// What a witness says of a node ≥ 63 is not carried: such a partner,
/// lost, counts as alive behind a cut link (safe: only the winner goes on).
pub const VIEW_TAG: u16 = u16::MAX - 4;

/// In a view: the sender hears the receiver.
pub const HEARS_YOU: u64 = 1 << 63;
/// Nodes a view names (witness information).
const NAMED: u16 = 63;

/// What a node knows of one peer.
#[derive(Debug, Clone, Default)]
struct Peer {
    /// Its wire session is up.
    wire_up: bool,
    /// When its last view arrived, and what it said.
    view_ns: Option<Ns>,
    hears: u64,
    /// Whether its last view promised (it counts this node up).
    promised: bool,
    /// When a view of it last said it hears this node (it may come back).
    heard_me_ns: Option<Ns>,
    /// Where its promise is anchored: this node's send time of the newest
    /// view it echoed with a promise. Up while within the lease.
    lease_from_ns: Option<Ns>,
    /// Up as far as routing and copies go.
    up: bool,
    /// When this node last sent it a view.
    sent_ns: Option<Ns>,
    /// The views sent to it lately: sequence number, send time and
    /// whether the view promised.
    sent: VecDeque<(u16, Ns, bool)>,
    /// The next view's sequence number.
    next_seq: u16,
    /// The sequence number of its newest view, to echo.
    last_seq: Option<u16>,
    /// When it was last lost: it comes back only on a view since.
    lost_ns: Option<Ns>,
}

/// A view as it goes on the wire ([`Liveness::view_for`]): ADDR, the
/// sequence number (OFFSETS), the echo (SIZE: below `MAX_PAYLOAD_BYTES`,
/// which a completion carries no payload of) and the promise (CMD).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View {
    pub hears: u64,
    pub seq: u16,
    pub echo: u16,
    pub promise: bool,
}

/// Sequence numbers run modulo this (the echo travels in SIZE, at most
/// 8,192); [`NO_ECHO`] is none.
const SEQ_MOD: u16 = 8192;
pub const NO_ECHO: u16 = SEQ_MOD;
/// Views sent to a peer remembered for its echo: more than a lease holds.
const SENT_KEPT: usize = 128;

/// A change of a peer's liveness ([`Liveness::tick`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Lost(u16),
    Back(u16),
}

/// This node's view of its peers (module header).
#[derive(Debug, Clone)]
pub struct Liveness {
    lease_ns: Ns,
    grace_ns: Ns,
    view_every_ns: Ns,
    peers: BTreeMap<u16, Peer>,
    started: bool,
    /// When a peer's view last dropped a node it heard before (a failover
    /// may be in progress between other nodes).
    view_loss_ns: Option<Ns>,
}

impl Liveness {
    /// For a node whose wire fails a peer after `peer_silence_ns` and
    /// sends a heartbeat every `heartbeat_ns`: the lease is half the
    /// silence bound, the grace a quarter, a view goes out every two
    /// heartbeats.
    pub fn new(peers: &[u16], peer_silence_ns: Ns, heartbeat_ns: Ns) -> Liveness {
        Liveness {
            lease_ns: peer_silence_ns / 2,
            grace_ns: peer_silence_ns / 4,
            view_every_ns: (2 * heartbeat_ns).min(peer_silence_ns / 16).max(1),
            peers: peers
                .iter()
                .map(|&p| {
                    (
                        p,
                        Peer {
                            up: true,
                            ..Peer::default()
                        },
                    )
                })
                .collect(),
            started: false,
            view_loss_ns: None,
        }
    }

    pub fn grace_ns(&self) -> Ns {
        self.grace_ns
    }

    /// How long after losing a partner a copy shared with it may go on
    /// alone (module header): the partner's lease on this node has run
    /// out by then, with a grace for a turn of its thread in progress.
    pub fn settle_ns(&self) -> Ns {
        self.lease_ns + self.grace_ns
    }

    /// Whether `peer` is up (see the module header).
    pub fn is_up(&self, peer: u16) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.up)
    }

    /// Whether `peer`'s wire session is up.
    pub fn wire_up(&self, peer: u16) -> bool {
        self.peers.get(&peer).is_some_and(|p| p.wire_up)
    }

    /// The wire says `peer`'s session is up (`true`) or failed.
    pub fn set_wire(&mut self, peer: u16, up: bool) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.wire_up = up;
        }
    }

    /// `peer` restarted: what its old self said and was sent is forgotten
    /// (its new self numbers its views afresh and promised nothing yet).
    pub fn restarted(&mut self, peer: u16) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.promised = false;
            p.last_seq = None;
            p.hears = 0;
            p.view_ns = None;
        }
    }

    /// A view from `peer` arrived at `now`.
    pub fn view(&mut self, now: Ns, peer: u16, view: View) {
        let Some(p) = self.peers.get_mut(&peer) else {
            return;
        };
        if p.view_ns.is_some() && p.hears & !view.hears & !HEARS_YOU != 0 {
            self.view_loss_ns = Some(now);
        }
        p.view_ns = Some(now);
        p.hears = view.hears;
        p.last_seq = (view.seq < SEQ_MOD).then_some(view.seq);
        if view.hears & HEARS_YOU != 0 {
            p.heard_me_ns = Some(now);
        }
        if view.promise {
            // Anchored at the send time of the view it echoes (if still
            // known: an echo too old to be here renews nothing).
            let anchor = p
                .sent
                .iter()
                .rev()
                .find(|&&(seq, _, _)| seq == view.echo)
                .map(|&(_, at, _)| at);
            if let Some(at) = anchor {
                p.lease_from_ns = p.lease_from_ns.max(Some(at));
            }
        } else if p.promised {
            // It stopped counting this node up: lost at the next tick;
            // unless the view answers one of ours that promised nothing
            // either (sent while this node counted the peer lost): the
            // peer has not seen this node take it back yet, and that is
            // no withdrawal. Counted as one, two peers that lost each
            // other out of phase each came back on the other's view and
            // were lost on its next, every view (20 ms), for good: the
            // exchange never finished (seed 39100230). The lease still
            // ends without a promise (`tick`).
            let answered = p
                .sent
                .iter()
                .rev()
                .find(|&&(seq, _, _)| seq == view.echo)
                .map(|&(_, _, promised)| promised);
            if answered != Some(false) {
                p.lease_from_ns = None;
            }
        }
        p.promised = view.promise;
    }

    /// Whether some peer's view dropped a node within `within` of `now`.
    pub fn peer_lost_one(&self, now: Ns, within: Ns) -> bool {
        self.view_loss_ns
            .is_some_and(|t| now.saturating_sub(t) < within)
    }

    /// The view this node sends `to` at `now` (module header): the peers
    /// it hears, a new sequence number (kept with `now`), the echo of
    /// `to`'s newest view and the promise (`to` is up here).
    pub fn view_for(&mut self, to: u16, now: Ns) -> View {
        let hears = self
            .peers
            .iter()
            .filter(|(_, p)| self.fresh(p.view_ns, now))
            .fold(0, |v, (&n, _)| match n {
                n if n == to => v | HEARS_YOU,
                n if n < NAMED => v | 1 << n,
                _ => v,
            });
        let Some(p) = self.peers.get_mut(&to) else {
            return View {
                hears,
                seq: 0,
                echo: NO_ECHO,
                promise: false,
            };
        };
        let seq = p.next_seq;
        p.next_seq = (seq + 1) % SEQ_MOD;
        if p.sent.len() == SENT_KEPT {
            p.sent.pop_front();
        }
        p.sent.push_back((seq, now, p.up));
        View {
            hears,
            seq,
            echo: p.last_seq.unwrap_or(NO_ECHO),
            promise: p.up,
        }
    }

    /// Peers a view is due to at `now` (their session is up); marks them sent.
    pub fn views_due(&mut self, now: Ns) -> Vec<u16> {
        let every = self.view_every_ns;
        self.peers
            .iter_mut()
            .filter(|(_, p)| p.wire_up && p.sent_ns.is_none_or(|t| now >= t + every))
            .map(|(&n, p)| {
                p.sent_ns = Some(now);
                n
            })
            .collect()
    }

    /// A view to `peer` could not leave: it is due again next turn.
    pub fn unsent(&mut self, peer: u16) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.sent_ns = None;
        }
    }

    fn fresh(&self, at: Option<Ns>, now: Ns) -> bool {
        at.is_some_and(|t| now.saturating_sub(t) <= self.lease_ns)
    }

    /// Re-judge every peer at `now`: which were lost or came back. The
    /// first call starts every peer's lease (a peer never heard from is
    /// lost a lease after the node started).
    pub fn tick(&mut self, now: Ns) -> Vec<Change> {
        if !self.started {
            self.started = true;
            for p in self.peers.values_mut() {
                p.lease_from_ns = Some(now);
                p.heard_me_ns = Some(now);
            }
        }
        let lease = self.lease_ns;
        let within = |t: Option<Ns>| t.is_some_and(|t| now.saturating_sub(t) <= lease);
        let mut changes = Vec::new();
        for (&n, p) in self.peers.iter_mut() {
            // Up: while its promise covers now, its session up (the first
            // lease of a start counts as promised). Back: only on a view
            // that says it hears this node, since it was lost, its session
            // up; it then has a lease to promise.
            let should = if p.up {
                within(p.lease_from_ns) && (p.wire_up || p.view_ns.is_none())
            } else {
                within(p.heard_me_ns) && p.wire_up && p.heard_me_ns > p.lost_ns
            };
            if should != p.up {
                p.up = should;
                if should {
                    p.lease_from_ns = Some(now);
                } else {
                    p.lost_ns = Some(now);
                }
                changes.push(if should {
                    Change::Back(n)
                } else {
                    Change::Lost(n)
                });
            }
        }
        changes
    }

    /// Whether a witness (a peer other than `partner`, up, whose view
    /// arrived after `since`) hears `partner`: `Some(true)` if one does,
    /// `Some(false)` if every witness that is up has said it does not,
    /// `None` while one that is up has not spoken since `since`.
    pub fn witness_hears(&self, partner: u16, since: Ns) -> Option<bool> {
        if partner >= NAMED {
            return None;
        }
        let mut undecided = false;
        for (&n, p) in &self.peers {
            if n == partner || !p.up {
                continue;
            }
            match p.view_ns {
                Some(t) if t >= since => {
                    if p.hears & (1 << partner) != 0 {
                        return Some(true);
                    }
                }
                _ => undecided = true,
            }
        }
        (!undecided).then_some(false)
    }
}

/// What a copy suspended since its partner was lost becomes ([`Liveness`]'s
/// module header): `None` to stay suspended (the grace has not passed, or a
/// witness has not yet spoken), `Some(true)` up to date (this node goes on
/// alone), `Some(false)` outdated.
///
/// `quorum`: this node reaches a majority; `witness`: what
/// [`Liveness::witness_hears`] says of the partner; `wins`: this copy is the
/// winner of a cut link (its partner is behind it, or it is the primary);
/// `waited`: the grace has passed; `too_long`: the witnesses had four
/// graces to speak.
pub fn decide(
    quorum: bool,
    witness: Option<bool>,
    wins: bool,
    waited: bool,
    too_long: bool,
) -> Option<bool> {
    if !waited {
        return None;
    }
    if !quorum {
        return Some(false);
    }
    match witness {
        // Partner dead or cut off from everyone: go on alone.
        Some(false) => Some(true),
        // Partner alive, only the link is cut: the winner goes on.
        Some(true) => Some(wins),
        // A witness silent too long: as if it heard the partner.
        None if too_long => Some(wins),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Ns = 1_000_000;

    fn three(node: u16) -> Liveness {
        let peers: Vec<u16> = (0..3).filter(|&p| p != node).collect();
        Liveness::new(&peers, 1000 * MS, 10 * MS)
    }

    /// A view from a peer: what it hears, its number, the echo of ours
    /// and its promise.
    fn v(hears: u64, seq: u16, echo: u16, promise: bool) -> View {
        View {
            hears,
            seq,
            echo,
            promise,
        }
    }

    /// Node 0, whose peer 1 answered its first view (sent at 0) with a
    /// promise read at 10 ms; and that view.
    fn node_1_promised() -> (Liveness, View) {
        let mut l = three(0);
        l.set_wire(1, true);
        l.tick(0);
        let sent = l.view_for(1, 0);
        l.view(10 * MS, 1, v(HEARS_YOU, 1, sent.seq, true));
        (l, sent)
    }

    #[test]
    fn a_peer_is_up_while_its_promise_covers_now_and_lost_a_lease_after() {
        let mut l = three(0);
        l.set_wire(1, true);
        l.set_wire(2, true);
        assert!(
            l.tick(0).is_empty(),
            "a start's first lease counts as promised"
        );
        assert!(l.is_up(1) && l.is_up(2));
        // Node 1 promises, echoing each view of ours; node 2 never does.
        for (k, t) in (0..=600).step_by(20).enumerate() {
            let mine1 = l.view_for(1, t * MS);
            let mine2 = l.view_for(2, t * MS);
            l.view(t * MS, 1, v(HEARS_YOU, k as u16, mine1.seq, true));
            l.view(t * MS, 2, v(0b010, k as u16, mine2.seq, false));
        }
        assert_eq!(l.tick(600 * MS), vec![Change::Lost(2)]);
        assert!(l.is_up(1) && !l.is_up(2));
        assert!(
            !l.view_for(2, 610 * MS).promise,
            "no promise to a lost peer"
        );
        // Node 2 hears us again: back on the next view.
        l.view(620 * MS, 2, v(HEARS_YOU | 0b010, 40, NO_ECHO, false));
        assert_eq!(l.tick(620 * MS), vec![Change::Back(2)]);
        // Node 1 falls silent: lost once the lease (500 ms) from our send
        // time of the last view it echoed (600 ms) has passed.
        assert!(l.tick(1100 * MS).iter().all(|c| *c != Change::Lost(1)));
        assert!(l.tick(1101 * MS).contains(&Change::Lost(1)));
        // Its session up again is not enough: a view must say it hears us.
        assert!(l.tick(1200 * MS).iter().all(|c| *c != Change::Back(1)));
    }

    #[test]
    fn a_promise_counts_from_our_send_time_not_from_when_it_is_read() {
        let mut l = three(0);
        l.set_wire(1, true);
        l.tick(0);
        let sent = l.view_for(1, 10 * MS);
        // This node's thread was starved: the answer to the view it sent at
        // 10 ms is read at 600 ms. Counted from its arrival it would renew
        // the lease to 1,100 ms; the partner may go on alone from 760 ms.
        l.view(600 * MS, 1, v(HEARS_YOU, 7, sent.seq, true));
        assert!(l.tick(600 * MS).contains(&Change::Lost(1)));
        // An echo of a view this node never sent renews nothing.
        let mut l = three(0);
        l.set_wire(1, true);
        l.tick(0);
        l.view(400 * MS, 1, v(HEARS_YOU, 7, 4000, true));
        assert!(l.tick(501 * MS).contains(&Change::Lost(1)));
    }

    #[test]
    fn a_withdrawn_promise_loses_the_peer_at_once() {
        let (mut l, sent) = node_1_promised();
        assert!(l.tick(10 * MS).is_empty());
        // It still hears us, but no longer counts us up (a link cut one
        // way: our views reach it, its promises stopped reaching us).
        l.view(30 * MS, 1, v(HEARS_YOU, 2, sent.seq, false));
        assert_eq!(l.tick(30 * MS), vec![Change::Lost(1)]);
        // A restarted peer's first views promise nothing yet: not a loss.
        let (mut l, _) = node_1_promised();
        l.restarted(1);
        l.view(20 * MS, 1, v(0, 0, NO_ECHO, false));
        assert!(l.tick(20 * MS).is_empty());
        assert!(l.is_up(1));
    }

    /// Nodes 0 and 1 exchanging views every 20 ms for `turns` turns, each
    /// turn as the port's (`tick`, send, take what arrived; node 1's turn
    /// after node 0's), over a link that loses 80% of the views both ways
    /// for the first 40 turns (which, an LCG from `seed`). Returns the
    /// turns at which either saw the other lost or back.
    fn lossy_exchange(seed: u64, turns: usize) -> Vec<(usize, Change)> {
        let (mut a, mut b) = (three(0), three(1));
        a.set_wire(1, true);
        b.set_wire(0, true);
        let mut x = seed;
        let mut lost = move || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (x >> 33) % 100 < 80
        };
        let (mut to_a, mut to_b): (Vec<View>, Vec<View>) = (vec![], vec![]);
        let mut changes = Vec::new();
        for k in 0..turns {
            let t = k as Ns * 20 * MS;
            let (drop_a, drop_b) = if k < 40 {
                (lost(), lost())
            } else {
                (false, false)
            };
            for c in a
                .tick(t)
                .into_iter()
                .filter(|c| matches!(c, Change::Lost(1) | Change::Back(1)))
            {
                changes.push((k, c));
            }
            let view = a.view_for(1, t);
            if !drop_a {
                to_b.push(view);
            }
            for view in to_a.drain(..) {
                a.view(t, 1, view);
            }
            for c in b
                .tick(t)
                .into_iter()
                .filter(|c| matches!(c, Change::Lost(0) | Change::Back(0)))
            {
                changes.push((k, c));
            }
            let view = b.view_for(0, t);
            if !drop_b {
                to_a.push(view);
            }
            for view in to_b.drain(..) {
                b.view(t, 0, view);
            }
        }
        changes
    }

    #[test]
    fn two_peers_that_lost_each_other_come_back_and_stay() {
        // Counted as withdrawals, the views that answer a view promising
        // nothing kept 2 of these 32 loss patterns (seeds 26 and 29) lost
        // and back every turn, for good (seed 39100230 of the simulator).
        for seed in 0..32 {
            let changes = lossy_exchange(seed, 200);
            let late: Vec<_> = changes.iter().filter(|(k, _)| *k >= 60).collect();
            assert!(
                late.is_empty(),
                "seed {seed}: still lost and back 400 ms after the losses ended: {:?}",
                &late[..late.len().min(6)]
            );
            // Both up at the end.
            for peer in [0, 1] {
                let last = changes
                    .iter()
                    .rev()
                    .find(|(_, c)| matches!(c, Change::Lost(p) | Change::Back(p) if *p == peer));
                assert!(
                    last.is_none_or(|(_, c)| *c == Change::Back(peer)),
                    "seed {seed}: {last:?}"
                );
            }
        }
    }

    #[test]
    fn views_are_numbered_and_echo_the_peers_newest() {
        let mut l = three(0);
        l.set_wire(1, true);
        l.tick(0);
        let first = l.view_for(1, 0);
        assert_eq!((first.seq, first.echo), (0, NO_ECHO));
        assert!(first.promise);
        l.view(5 * MS, 1, v(HEARS_YOU, 41, first.seq, true));
        let second = l.view_for(1, 20 * MS);
        assert_eq!((second.seq, second.echo), (1, 41));
        // The numbers wrap below the echo's field limit.
        for t in 2..=SEQ_MOD as u64 {
            let view = l.view_for(1, t * MS);
            assert!(view.seq < SEQ_MOD);
        }
        assert_eq!(l.view_for(1, 9000 * MS).seq, 1);
    }

    #[test]
    fn a_failed_session_loses_the_peer_at_once() {
        let (mut l, _) = node_1_promised();
        l.set_wire(1, false);
        assert_eq!(l.tick(11 * MS), vec![Change::Lost(1)]);
    }

    #[test]
    fn the_view_lists_the_peers_heard_within_the_lease() {
        let mut l = three(1);
        l.view(0, 0, v(0, 0, NO_ECHO, false));
        l.view(300 * MS, 2, v(0, 0, NO_ECHO, false));
        assert_eq!(l.view_for(0, 400 * MS).hears, HEARS_YOU | 0b100);
        assert_eq!(l.view_for(2, 400 * MS).hears, HEARS_YOU | 0b001);
        assert_eq!(l.view_for(0, 600 * MS).hears, 0b100);
        l.set_wire(0, true);
        assert_eq!(l.views_due(600 * MS), vec![0]);
        assert!(l.views_due(610 * MS).is_empty());
        assert_eq!(l.views_due(620 * MS), vec![0]);
    }

    #[test]
    fn a_witness_tells_a_cut_link_from_a_dead_partner() {
        let mut l = three(0);
        l.set_wire(1, true);
        l.set_wire(2, true);
        l.tick(0);
        // Node 1 lost at 500 ms; node 2 has not spoken since: undecided.
        assert_eq!(l.witness_hears(1, 500 * MS), None);
        l.view(520 * MS, 2, v(HEARS_YOU | 0b010, 0, NO_ECHO, false));
        assert_eq!(l.witness_hears(1, 500 * MS), Some(true));
        assert!(!l.peer_lost_one(540 * MS, 1000 * MS));
        l.view(540 * MS, 2, v(HEARS_YOU, 1, NO_ECHO, false));
        assert_eq!(l.witness_hears(1, 500 * MS), Some(false));
        // Node 2 stopped hearing node 1: a failover may be under way.
        assert!(l.peer_lost_one(600 * MS, 1000 * MS));
        assert!(!l.peer_lost_one(1540 * MS, 1000 * MS));
        // Nodes past the view's bits: no witness can speak for them.
        assert_eq!(l.witness_hears(70, 500 * MS), None);
    }

    #[test]
    fn the_decision_table() {
        // The grace first.
        assert_eq!(decide(true, Some(false), false, false, false), None);
        // No majority: outdated, whoever would win.
        assert_eq!(decide(false, Some(false), true, true, false), Some(false));
        // Dead partner: go on alone, winner or not.
        assert_eq!(decide(true, Some(false), false, true, false), Some(true));
        // Cut link: the winner only.
        assert_eq!(decide(true, Some(true), true, true, false), Some(true));
        assert_eq!(decide(true, Some(true), false, true, false), Some(false));
        // Silent witness: wait, then as a cut link.
        assert_eq!(decide(true, None, false, true, false), None);
        assert_eq!(decide(true, None, false, true, true), Some(false));
        assert_eq!(decide(true, None, true, true, true), Some(true));
    }
}
