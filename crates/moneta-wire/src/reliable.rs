//! Lossless delivery in software (issue 12 item 2): the per-peer session
//! that stands in for the lossless 802.3x Ethernet the paper relies on
//! (SPEC §4.2), because real and virtual links drop frames.
//!
//! Rules, per peer and direction:
//!
//! - Every QuickSAN packet is a DATA frame with a sequence number (32-bit,
//!   wrapping). At most `window` frames are unacknowledged; a full window
//!   makes `send` return `WindowFull` (bounded, never allocating).
//! - The receiver holds frames within `window` of the next expected one and
//!   delivers them in order, each exactly once: a frame already delivered
//!   or already held is a duplicate and is dropped (and acknowledged again).
//! - Acknowledgements are cumulative (the next sequence number expected)
//!   plus a 64-bit selective map of held frames; they ride on every frame
//!   and, when nothing goes the other way, on a session-only frame after a
//!   short delay (at once for duplicates and gaps).
//! - An unacknowledged frame is sent again after a timeout that doubles per
//!   retry up to a cap; after `max_retransmits` retries the peer is failed.
//! - A peer heard from by no valid frame for `peer_silence_ns` is failed
//!   (heartbeats keep idle sessions alive). A failed peer's unacknowledged
//!   packets are reported lost and `send` to it returns `PeerFailed` at once;
//!   probes go on, and the first frame heard brings it back.
//! - Epochs: each side numbers its incarnations of the session. A frame
//!   carries its sender's epoch and the receiver's epoch as the sender knows
//!   it. A newer sender epoch (the peer restarted, or failed us and started
//!   over) resets the session on this side; an older one is stale and
//!   dropped; data and acknowledgements count only if they name this side's
//!   current epoch. So no frame of an old session is ever delivered in a new
//!   one, and both ends restart at sequence 0 together.
//! - Newer epochs are accepted at most once per `epoch_change_min_ns` per
//!   peer (a flood of them, forged or replayed, cannot keep resetting the
//!   session). An epoch older than the peer's current one is stale; once
//!   this side has failed the peer, any epoch starts a new session (so a
//!   node restarted after its clock epoch wrapped still rejoins).
//! - Corrupt frames never get here: the CRC32C check drops them (`frame`);
//!   with a secret, so do forged and replayed ones (`auth`).
//!
//! This module holds the state and its arithmetic; `endpoint` drives it.

use crate::transport::PeerId;
use moneta_model::device::packet::{Mac, PacketHeader};

/// Largest send window: the selective acknowledgement has 64 bits.
pub const MAX_WINDOW_FRAMES: u32 = 64;

/// `a` comes before `b` in sequence space.
#[inline]
pub fn seq_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// Epoch `a` is newer than `b`.
#[inline]
pub fn epoch_newer(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The next epoch after `e` (0 means "unknown" on the wire, never used).
#[inline]
pub fn next_epoch(e: u32) -> u32 {
    match e.wrapping_add(1) {
        0 => 1,
        n => n,
    }
}

/// Where a peer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    /// Not heard from yet in this epoch: packets queue, probes go out.
    Connecting,
    /// Sessions agree on epochs: packets flow.
    Up,
    /// Silent past the bound or out of retransmissions: sends fail.
    Failed,
}

/// One sent, not yet acknowledged frame.
#[derive(Debug)]
pub struct TxSlot {
    pub frame: Box<[u8]>,
    pub len: usize,
    pub header: Option<PacketHeader>,
    /// When it went out last (None: not yet).
    pub sent_ns: Option<u64>,
    /// When it is due again.
    pub due_ns: u64,
    pub retries: u32,
    /// The peer holds it (selective acknowledgement).
    pub sacked: bool,
}

/// What the receive window says about an arriving sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RxVerdict {
    /// Delivered before, or held already.
    Duplicate,
    /// Too far ahead: the sender cannot have sent it in this window.
    OutOfWindow,
    /// Hold it in this slot.
    Slot(usize),
}

/// One peer's session.
#[derive(Debug)]
pub struct Session {
    pub peer: PeerId,
    pub mac: Mac,
    pub state: PeerState,
    pub local_epoch: u32,
    pub peer_epoch: Option<u32>,
    // Sending.
    pub next_seq: u32,
    pub next_unsent: u32,
    pub una: u32,
    pub tx: Vec<TxSlot>,
    /// No retransmission is due before this.
    pub next_timer_ns: u64,
    // Receiving.
    pub expected: u32,
    /// Pool index of the frame held for each slot of the receive window.
    pub held: Vec<Option<u32>>,
    /// A session-only frame (acknowledgement) should go out by then.
    pub ack_due_ns: Option<u64>,
    pub last_heard_ns: u64,
    pub last_sent_ns: u64,
    /// 802.3x: no DATA frame goes out before this.
    pub paused_until_ns: u64,
    /// Smoothed round-trip time and its mean deviation (RFC 6298), from
    /// frames acknowledged without a retransmission (Karn's rule).
    pub srtt_ns: u64,
    pub rttvar_ns: u64,
    /// The last epoch accepted from the peer (kept when this side fails it
    /// and forgets `peer_epoch`): the replay window belongs to it.
    pub last_peer_epoch: Option<u32>,
    /// When a newer peer epoch was last accepted (the rate limit).
    pub epoch_changed_ns: Option<u64>,
    /// Frame numbers seen in the peer's newest epoch (with a secret).
    pub replay: crate::auth::ReplayWindow,
}

impl Session {
    pub fn new(
        peer: PeerId,
        mac: Mac,
        epoch: u32,
        window: u32,
        frame_bytes: usize,
        now_ns: u64,
    ) -> Session {
        assert!((1..=MAX_WINDOW_FRAMES).contains(&window));
        Session {
            peer,
            mac,
            state: PeerState::Connecting,
            local_epoch: epoch,
            peer_epoch: None,
            next_seq: 0,
            next_unsent: 0,
            una: 0,
            tx: (0..window)
                .map(|_| TxSlot {
                    frame: vec![0u8; frame_bytes].into_boxed_slice(),
                    len: 0,
                    header: None,
                    sent_ns: None,
                    due_ns: 0,
                    retries: 0,
                    sacked: false,
                })
                .collect(),
            next_timer_ns: u64::MAX,
            expected: 0,
            held: vec![None; window as usize],
            ack_due_ns: None,
            last_heard_ns: now_ns,
            last_sent_ns: 0,
            paused_until_ns: 0,
            srtt_ns: 0,
            rttvar_ns: 0,
            last_peer_epoch: None,
            epoch_changed_ns: None,
            replay: Default::default(),
        }
    }

    /// The retransmission timeout: RFC 6298's SRTT + 4·RTTVAR, within
    /// `[min_ns, max_ns]` (`min_ns` alone until a round trip is measured).
    pub fn rto_ns(&self, min_ns: u64, max_ns: u64) -> u64 {
        (self.srtt_ns + 4 * self.rttvar_ns).clamp(min_ns, max_ns)
    }

    fn sample_rtt(&mut self, rtt_ns: u64) {
        if self.srtt_ns == 0 {
            self.srtt_ns = rtt_ns.max(1);
            self.rttvar_ns = rtt_ns / 2;
        } else {
            let err = self.srtt_ns.abs_diff(rtt_ns);
            self.rttvar_ns = (3 * self.rttvar_ns + err) / 4;
            self.srtt_ns = ((7 * self.srtt_ns + rtt_ns) / 8).max(1);
        }
    }

    pub fn window(&self) -> u32 {
        self.tx.len() as u32
    }

    /// Frames sent or queued and not yet acknowledged.
    pub fn in_flight(&self) -> u32 {
        self.next_seq.wrapping_sub(self.una)
    }

    pub fn slot_of(&self, seq: u32) -> usize {
        (seq % self.window()) as usize
    }

    /// The selective acknowledgement: bit i = frame expected+1+i is held.
    pub fn sack_bits(&self) -> u64 {
        let mut bits = 0u64;
        for i in 0..self.window().saturating_sub(1) {
            let seq = self.expected.wrapping_add(1 + i);
            if self.held[self.slot_of(seq)].is_some() {
                bits |= 1 << i;
            }
        }
        bits
    }

    /// The peer acknowledges everything before `ack` and holds the frames
    /// `sack` names. Returns how many frames left the window.
    pub fn on_ack(&mut self, ack: u32, sack: u64, now_ns: u64) -> u32 {
        // Only an acknowledgement within what was sent counts.
        if seq_before(self.next_unsent, ack) {
            return 0;
        }
        let mut freed = 0;
        while seq_before(self.una, ack) {
            let k = self.slot_of(self.una);
            if let (Some(sent), 0) = (self.tx[k].sent_ns, self.tx[k].retries) {
                if ack == self.una.wrapping_add(1) {
                    self.sample_rtt(now_ns.saturating_sub(sent));
                }
            }
            let slot = &mut self.tx[k];
            slot.header = None;
            slot.sent_ns = None;
            slot.sacked = false;
            slot.retries = 0;
            self.una = self.una.wrapping_add(1);
            freed += 1;
        }
        let mut bits = sack;
        while bits != 0 {
            let i = bits.trailing_zeros();
            bits &= bits - 1;
            let seq = ack.wrapping_add(1 + i);
            if seq_before(seq, self.next_unsent) && !seq_before(seq, self.una) {
                let k = self.slot_of(seq);
                self.tx[k].sacked = true;
            }
        }
        freed
    }

    /// Where an arriving frame `seq` goes.
    pub fn rx_verdict(&self, seq: u32) -> RxVerdict {
        if seq_before(seq, self.expected) {
            return RxVerdict::Duplicate;
        }
        if seq.wrapping_sub(self.expected) >= self.window() {
            return RxVerdict::OutOfWindow;
        }
        let k = self.slot_of(seq);
        if self.held[k].is_some() {
            RxVerdict::Duplicate
        } else {
            RxVerdict::Slot(k)
        }
    }

    /// The frames held in the receive window (for a reset to free them).
    pub fn take_held(&mut self) -> impl Iterator<Item = u32> + '_ {
        self.held.iter_mut().filter_map(Option::take)
    }

    /// Forget both directions (packets in the window are returned, lost),
    /// starting again at sequence 0.
    pub fn restart_sequences(&mut self, lost: &mut Vec<PacketHeader>) {
        let mut seq = self.una;
        while seq_before(seq, self.next_seq) {
            let k = self.slot_of(seq);
            if let Some(h) = self.tx[k].header.take() {
                lost.push(h);
            }
            self.tx[k].sent_ns = None;
            self.tx[k].sacked = false;
            self.tx[k].retries = 0;
            seq = seq.wrapping_add(1);
        }
        self.next_seq = 0;
        self.next_unsent = 0;
        self.una = 0;
        self.expected = 0;
        self.next_timer_ns = u64::MAX;
        self.ack_due_ns = None;
        self.paused_until_ns = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_and_epoch_arithmetic_wraps() {
        assert!(seq_before(u32::MAX, 0));
        assert!(!seq_before(0, u32::MAX));
        assert!(seq_before(5, 6));
        assert!(epoch_newer(1, u32::MAX));
        assert_eq!(next_epoch(u32::MAX), 1);
    }

    #[test]
    fn receive_window_verdicts_and_selective_acks() {
        let mut s = Session::new(1, Mac::of_node(1), 7, 8, 128, 0);
        s.expected = u32::MAX - 1;
        assert_eq!(s.rx_verdict(u32::MAX - 2), RxVerdict::Duplicate);
        assert!(matches!(s.rx_verdict(u32::MAX - 1), RxVerdict::Slot(_)));
        assert!(matches!(s.rx_verdict(5), RxVerdict::Slot(_)));
        assert_eq!(s.rx_verdict(6), RxVerdict::OutOfWindow);
        let k = s.slot_of(1);
        s.held[k] = Some(3);
        assert_eq!(s.rx_verdict(1), RxVerdict::Duplicate);
        // expected = MAX-1; frame 1 is expected+3: bit 2.
        assert_eq!(s.sack_bits(), 0b100);
    }

    #[test]
    fn acks_free_the_window_and_ignore_the_unsent() {
        let mut s = Session::new(1, Mac::of_node(1), 7, 8, 128, 0);
        s.next_seq = 5;
        s.next_unsent = 5;
        assert_eq!(s.on_ack(9, 0, 0), 0, "an ack past what was sent is bogus");
        assert_eq!(s.on_ack(2, 0b10, 0), 2);
        assert_eq!(s.una, 2);
        assert!(s.tx[s.slot_of(4)].sacked);
        assert!(!s.tx[s.slot_of(3)].sacked);
        assert_eq!(s.on_ack(1, 0, 0), 0, "old acks change nothing");
        assert_eq!(s.in_flight(), 3);
    }
}
