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
//!   reached it within the lease; `VIEW_TAG` completions). A peer is *up*
//!   here only while its session is up and a view of it that says it hears
//!   this node arrived within `lease_ns`. So a peer that stopped hearing
//!   this node (a link cut one way) is lost at both ends within a view, and
//!   a silent one within the lease.
//! - **Lease.** A copy shared with a partner is read and written only while
//!   the partner is up; once lost the copy is *suspended* (no reads, no
//!   write alone) for `grace_ns`. A node that loses a partner stops serving
//!   their copies at the same moment (± a view interval) as the partner
//!   loses it, and neither writes alone before the grace has passed: by
//!   then the other end has stopped too.
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
use std::collections::BTreeMap;

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
#[derive(Debug, Clone, Copy, Default)]
struct Peer {
    /// Its wire session is up.
    wire_up: bool,
    /// When its last view arrived, and what it said.
    view_ns: Option<Ns>,
    hears: u64,
    /// When a view of it last said it hears this node.
    seen_me_ns: Option<Ns>,
    /// Up as far as routing and copies go.
    up: bool,
    /// When this node last sent it a view.
    sent_ns: Option<Ns>,
    /// When it was last lost: it comes back only on a view since.
    lost_ns: Option<Ns>,
}

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

    /// A view from `peer` arrived at `now`.
    pub fn view(&mut self, now: Ns, peer: u16, hears: u64) {
        if let Some(p) = self.peers.get_mut(&peer) {
            if p.view_ns.is_some() && p.hears & !hears & !HEARS_YOU != 0 {
                self.view_loss_ns = Some(now);
            }
            p.view_ns = Some(now);
            p.hears = hears;
            if hears & HEARS_YOU != 0 {
                p.seen_me_ns = Some(now);
            }
        }
    }

    /// Whether some peer's view dropped a node within `within` of `now`.
    pub fn peer_lost_one(&self, now: Ns, within: Ns) -> bool {
        self.view_loss_ns
            .is_some_and(|t| now.saturating_sub(t) < within)
    }

    /// The view this node sends `to` at `now`: the peers it hears.
    pub fn view_for(&self, to: u16, now: Ns) -> u64 {
        self.peers
            .iter()
            .filter(|(_, p)| self.fresh(p.view_ns, now))
            .fold(0, |v, (&n, _)| match n {
                n if n == to => v | HEARS_YOU,
                n if n < NAMED => v | 1 << n,
                _ => v,
            })
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
                p.seen_me_ns = Some(now);
            }
        }
        let lease = self.lease_ns;
        let mut changes = Vec::new();
        for (&n, p) in self.peers.iter_mut() {
            let seen = p.seen_me_ns.is_some_and(|t| now.saturating_sub(t) <= lease);
            // Up: while seen within the lease, its session up (the first
            // lease of a start counts as seen). Back: only on a view that
            // says so, since it was lost, its session up.
            let should = if p.up {
                seen && (p.wire_up || p.view_ns.is_none())
            } else {
                seen && p.wire_up && p.seen_me_ns > p.lost_ns
            };
            if should != p.up {
                p.up = should;
                if !should {
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

    #[test]
    fn a_peer_is_up_while_it_says_it_hears_us_and_lost_a_lease_after() {
        let mut l = three(0);
        l.set_wire(1, true);
        l.set_wire(2, true);
        assert!(
            l.tick(0).is_empty(),
            "a start's first lease counts as heard"
        );
        assert!(l.is_up(1) && l.is_up(2));
        // Node 1 hears us; node 2 never says so.
        for t in (0..=600).step_by(20) {
            l.view(t * MS, 1, HEARS_YOU);
            l.view(t * MS, 2, 0b010);
        }
        assert_eq!(l.tick(600 * MS), vec![Change::Lost(2)]);
        assert!(l.is_up(1) && !l.is_up(2));
        // Node 2 hears us again: back on the next view.
        l.view(620 * MS, 2, HEARS_YOU | 0b010);
        assert_eq!(l.tick(620 * MS), vec![Change::Back(2)]);
        // Node 1 falls silent: lost once the lease (500 ms) has passed.
        assert!(l.tick(1100 * MS).iter().all(|c| *c != Change::Lost(1)));
        assert!(l.tick(1101 * MS).contains(&Change::Lost(1)));
        // Its session up again is not enough: a view must say so.
        assert!(l.tick(1200 * MS).iter().all(|c| *c != Change::Back(1)));
    }

    #[test]
    fn a_failed_session_loses_the_peer_at_once() {
        let mut l = three(0);
        l.set_wire(1, true);
        l.tick(0);
        l.view(10 * MS, 1, HEARS_YOU);
        l.set_wire(1, false);
        assert_eq!(l.tick(11 * MS), vec![Change::Lost(1)]);
    }

    #[test]
    fn the_view_lists_the_peers_heard_within_the_lease() {
        let mut l = three(1);
        l.view(0, 0, 0);
        l.view(300 * MS, 2, 0);
        assert_eq!(l.view_for(0, 400 * MS), HEARS_YOU | 0b100);
        assert_eq!(l.view_for(2, 400 * MS), HEARS_YOU | 0b001);
        assert_eq!(l.view_for(0, 600 * MS), 0b100);
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
        l.view(520 * MS, 2, HEARS_YOU | 0b010);
        assert_eq!(l.witness_hears(1, 500 * MS), Some(true));
        assert!(!l.peer_lost_one(540 * MS, 1000 * MS));
        l.view(540 * MS, 2, HEARS_YOU);
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
