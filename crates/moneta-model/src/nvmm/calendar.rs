//! Reservations of one resource (a flash channel, a DRAM bank or bus) as a
//! sorted list of busy intervals, for components that answer "when will
//! this finish" at the moment a request is made (SPEC §7 models, see
//! `flash.rs`, `dram.rs`).
//!
//! A request may be for the future (a fill after a flash read, data a plane
//! will return); a reservation fills the first gap at or after its earliest
//! start that is long enough, so a request that can go now is not held
//! behind one booked for later. Intervals that ended before the current
//! time are dropped, so the list is bounded by the work in flight.

use crate::units::Ns;

#[derive(Clone, Debug, Default)]
pub struct Calendar {
    /// Intervals from `head` on are live; those before it ended already
    /// and are dropped in batches (cheaper than shifting on every call).
    busy: Vec<(Ns, Ns)>,
    head: usize,
}

impl Calendar {
    /// Reserve `duration_ns` in the first gap at or after `earliest_ns`;
    /// `now_ns` (≤ every later request's start) lets old intervals go.
    /// Returns the reservation's start.
    #[inline]
    pub fn reserve(&mut self, now_ns: Ns, earliest_ns: Ns, duration_ns: Ns) -> Ns {
        let start = self.first_fit(now_ns, earliest_ns, duration_ns);
        self.book(start, duration_ns);
        start
    }

    /// Drop intervals that ended by `now_ns`.
    #[inline]
    pub fn prune(&mut self, now_ns: Ns) {
        while self.head < self.busy.len() && self.busy[self.head].1 <= now_ns {
            self.head += 1;
        }
        if self.head == self.busy.len() {
            self.busy.clear();
            self.head = 0;
        } else if self.head >= 64 {
            self.busy.drain(..self.head);
            self.head = 0;
        }
    }

    /// The start `reserve` would give, without booking it.
    #[inline]
    pub fn first_fit(&mut self, now_ns: Ns, earliest_ns: Ns, duration_ns: Ns) -> Ns {
        self.prune(now_ns);
        // Common case: nothing booked after `earliest_ns`.
        if self.last_end() <= earliest_ns {
            return earliest_ns;
        }
        let live = &self.busy[self.head..];
        let mut start = earliest_ns;
        let mut at = live.partition_point(|&(_, end)| end <= start);
        while at < live.len() {
            let (b_start, b_end) = live[at];
            if start + duration_ns <= b_start {
                break;
            }
            start = start.max(b_end);
            at += 1;
        }
        start
    }

    /// Book `[start, start + duration)`, which must be free.
    #[inline]
    pub fn book(&mut self, start_ns: Ns, duration_ns: Ns) {
        if duration_ns == 0 {
            return;
        }
        if self.last_end() <= start_ns {
            self.busy.push((start_ns, start_ns + duration_ns));
            return;
        }
        let at = self.head + self.busy[self.head..].partition_point(|&(s, _)| s < start_ns);
        debug_assert!(
            at == self.head || self.busy[at - 1].1 <= start_ns,
            "overlap"
        );
        debug_assert!(
            at == self.busy.len() || start_ns + duration_ns <= self.busy[at].0,
            "overlap"
        );
        self.busy.insert(at, (start_ns, start_ns + duration_ns));
    }

    /// When the last booked interval ends (0 if none).
    #[inline]
    pub fn last_end(&self) -> Ns {
        if self.head < self.busy.len() {
            self.busy[self.busy.len() - 1].1
        } else {
            0
        }
    }

    pub fn len(&self) -> usize {
        self.busy.len() - self.head
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_fill_gaps_before_future_work() {
        let mut cal = Calendar::default();
        assert_eq!(cal.reserve(0, 100, 50), 100);
        assert_eq!(cal.reserve(0, 0, 50), 0);
        assert_eq!(cal.reserve(0, 0, 80), 150);
        assert_eq!(cal.reserve(0, 60, 40), 60); // fits the gap 50..100
        assert_eq!(cal.reserve(0, 60, 40), 230);
        assert_eq!(cal.reserve(1000, 1000, 1), 1000);
        assert_eq!(cal.len(), 1);
    }
}
