//! Request queues, queue policies and barriers (SPEC §1.4, §2.2).
//!
//! - FIFO: one queue; the head request gets buffers for its segments in order
//!   until all have started, then the next request (MICRO'10 baseline).
//! - 2Q: a read queue and a write queue served alternately, so the DMA engine
//!   sees about half reads and half writes and uses both link directions.
//! - Balance: 2Q plus round-robin inside each queue: the head request gets one
//!   buffer, the rest of it goes back to the tail.
//!
//! Barriers ([`BarrierGate`]): a barrier request waits until everything
//! admitted before it has completed, and everything after it waits until the
//! barrier has completed. This is the strict form common to the three
//! policies (Balance's "all in-progress requests complete before anything
//! after the barrier enters the queues"; 2Q's synchronization of both
//! queues); with FIFO it also orders completion, not only issue.

use crate::config::QueuePolicy;
use crate::units::{Op, PhysTag};
use std::collections::VecDeque;
use std::fmt::Debug;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Read,
    Write,
}

/// The request queues in front of the scheduler.
/// `T` names a request: a physical tag, or the pipeline's request index
/// (which also covers requests from network peers).
#[derive(Debug, Clone)]
pub struct RequestQueues<T = PhysTag> {
    policy: QueuePolicy,
    read_lane: VecDeque<T>,
    write_lane: VecDeque<T>,
    last_served: Lane,
    /// Lane of the request returned by the last `peek`.
    peeked: Option<Lane>,
}

impl<T: Copy + PartialEq + Debug> RequestQueues<T> {
    pub fn new(policy: QueuePolicy, tags: u32) -> Self {
        Self {
            policy,
            read_lane: VecDeque::with_capacity(tags as usize),
            write_lane: VecDeque::with_capacity(tags as usize),
            last_served: Lane::Write,
            peeked: None,
        }
    }

    pub fn policy(&self) -> QueuePolicy {
        self.policy
    }

    pub fn push(&mut self, tag: T, op: Op) {
        debug_assert!(
            !self.read_lane.contains(&tag) && !self.write_lane.contains(&tag),
            "request {tag:?} queued twice"
        );
        match (self.policy, op) {
            (QueuePolicy::Fifo, _) | (_, Op::Read) => self.read_lane.push_back(tag),
            (_, Op::Write) => self.write_lane.push_back(tag),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.read_lane.is_empty() && self.write_lane.is_empty()
    }

    pub fn len(&self) -> usize {
        self.read_lane.len() + self.write_lane.len()
    }

    /// The request whose next segment should get the next free buffer.
    pub fn peek(&mut self) -> Option<T> {
        let lane = match (self.read_lane.is_empty(), self.write_lane.is_empty()) {
            (true, true) => return None,
            (false, true) => Lane::Read,
            (true, false) => Lane::Write,
            // Both waiting: alternate (2Q, Balance). FIFO never fills the write lane.
            (false, false) => match self.last_served {
                Lane::Read => Lane::Write,
                Lane::Write => Lane::Read,
            },
        };
        self.peeked = Some(lane);
        self.lane(lane).front().copied()
    }

    /// The peeked request received a buffer for one segment; `more` says
    /// whether it still has segments that have not started.
    pub fn issued(&mut self, more: bool) {
        let lane = self.peeked.take().expect("issued() without peek()");
        self.last_served = lane;
        let policy = self.policy;
        let q = self.lane(lane);
        match (policy, more) {
            (_, false) => {
                q.pop_front();
            }
            (QueuePolicy::Balance, true) => {
                let head = q.pop_front().expect("peeked request");
                q.push_back(head);
            }
            (_, true) => {}
        }
    }

    fn lane(&mut self, lane: Lane) -> &mut VecDeque<T> {
        match lane {
            Lane::Read => &mut self.read_lane,
            Lane::Write => &mut self.write_lane,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GateState {
    Open,
    /// A barrier waits at the head of `held` for the admitted requests to finish.
    Draining,
    /// The barrier request is admitted and running; nothing else is admitted.
    BarrierRunning(PhysTag),
}

/// Holds requests behind barriers; bounded by the tag count.
#[derive(Debug, Clone)]
pub struct BarrierGate {
    held: VecDeque<(PhysTag, bool)>,
    state: GateState,
    /// The tag count: no more requests than tags are ever held.
    tags: usize,
}

impl BarrierGate {
    pub fn new(tags: u32) -> Self {
        Self {
            held: VecDeque::with_capacity(tags as usize),
            state: GateState::Open,
            tags: tags as usize,
        }
    }

    /// Debug builds assert the gate's accounting after each change: at most
    /// one held request per tag, none of them the running barrier, and a
    /// draining gate has its barrier at the head of the held requests.
    #[inline]
    fn debug_check(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        assert!(
            self.held.len() <= self.tags,
            "{} requests held behind a barrier, more than the {} tags",
            self.held.len(),
            self.tags
        );
        for (i, (tag, _)) in self.held.iter().enumerate() {
            assert!(
                self.held.iter().skip(i + 1).all(|(t, _)| t != tag),
                "tag {} held twice",
                tag.0
            );
            assert!(
                self.state != GateState::BarrierRunning(*tag),
                "tag {} held while it runs as the barrier",
                tag.0
            );
        }
        if self.state == GateState::Draining {
            assert!(
                matches!(self.held.front(), Some((_, true))),
                "a draining gate without its barrier at the head"
            );
        }
    }

    /// A request arrives; `outstanding` counts admitted, uncompleted requests.
    /// Returns true if it is admitted now.
    pub fn arrive(&mut self, tag: PhysTag, barrier: bool, outstanding: u32) -> bool {
        let admitted = self.arrive_unchecked(tag, barrier, outstanding);
        self.debug_check();
        admitted
    }

    fn arrive_unchecked(&mut self, tag: PhysTag, barrier: bool, outstanding: u32) -> bool {
        if self.state != GateState::Open || !self.held.is_empty() {
            self.held.push_back((tag, barrier));
            return false;
        }
        if barrier {
            if outstanding == 0 {
                self.state = GateState::BarrierRunning(tag);
                return true;
            }
            self.state = GateState::Draining;
            self.held.push_back((tag, barrier));
            return false;
        }
        true
    }

    /// A request completed (`outstanding` already excludes it). Pushes newly
    /// admitted requests into `admitted`.
    pub fn complete(&mut self, tag: PhysTag, outstanding: u32, admitted: &mut Vec<PhysTag>) {
        self.complete_unchecked(tag, outstanding, admitted);
        self.debug_check();
    }

    fn complete_unchecked(&mut self, tag: PhysTag, outstanding: u32, admitted: &mut Vec<PhysTag>) {
        match self.state {
            GateState::BarrierRunning(b) if b == tag => self.state = GateState::Open,
            GateState::Draining if outstanding == 0 => self.state = GateState::Open,
            _ => return,
        }
        let mut outstanding = outstanding;
        while let Some(&(t, barrier)) = self.held.front() {
            if barrier {
                if outstanding == 0 {
                    self.held.pop_front();
                    self.state = GateState::BarrierRunning(t);
                    admitted.push(t);
                } else {
                    self.state = GateState::Draining;
                }
                return;
            }
            self.held.pop_front();
            admitted.push(t);
            outstanding += 1;
        }
    }

    pub fn held(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(q: &mut RequestQueues, segments: &mut [u32]) -> Vec<u8> {
        let mut order = Vec::new();
        while let Some(t) = q.peek() {
            order.push(t.0);
            segments[t.0 as usize] -= 1;
            q.issued(segments[t.0 as usize] > 0);
        }
        order
    }

    #[test]
    fn fifo_serves_whole_requests_in_order() {
        let mut q = RequestQueues::new(QueuePolicy::Fifo, 64);
        q.push(PhysTag(0), Op::Read);
        q.push(PhysTag(1), Op::Write);
        let mut segs = [2, 2];
        assert_eq!(drain(&mut q, &mut segs), vec![0, 0, 1, 1]);
    }

    #[test]
    fn two_queues_alternate_reads_and_writes() {
        let mut q = RequestQueues::new(QueuePolicy::TwoQueue, 64);
        q.push(PhysTag(0), Op::Read);
        q.push(PhysTag(1), Op::Read);
        q.push(PhysTag(2), Op::Write);
        let mut segs = [1, 1, 1];
        assert_eq!(drain(&mut q, &mut segs), vec![0, 2, 1]);
    }

    #[test]
    fn balance_round_robins_inside_a_queue() {
        let mut q = RequestQueues::new(QueuePolicy::Balance, 64);
        q.push(PhysTag(0), Op::Read); // large
        q.push(PhysTag(1), Op::Read); // small
        let mut segs = [3, 1];
        assert_eq!(drain(&mut q, &mut segs), vec![0, 1, 0, 0]);
        // 2Q without balance finishes the large one first.
        let mut q = RequestQueues::new(QueuePolicy::TwoQueue, 64);
        q.push(PhysTag(0), Op::Read);
        q.push(PhysTag(1), Op::Read);
        let mut segs = [3, 1];
        assert_eq!(drain(&mut q, &mut segs), vec![0, 0, 0, 1]);
    }

    #[test]
    fn barrier_waits_for_earlier_and_holds_later() {
        let mut g = BarrierGate::new(64);
        let mut out = Vec::new();
        assert!(g.arrive(PhysTag(0), false, 0));
        assert!(!g.arrive(PhysTag(1), true, 1)); // barrier: 0 outstanding
        assert!(!g.arrive(PhysTag(2), false, 1)); // after barrier
        g.complete(PhysTag(0), 0, &mut out);
        assert_eq!(out, vec![PhysTag(1)]); // barrier admitted alone
        out.clear();
        g.complete(PhysTag(1), 0, &mut out);
        assert_eq!(out, vec![PhysTag(2)]);
        assert_eq!(g.held(), 0);
        assert!(g.arrive(PhysTag(3), false, 1));
    }
}
