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
use std::collections::VecDeque;

#[derive(Clone, Debug, Default)]
pub struct Calendar {
    busy: VecDeque<(Ns, Ns)>,
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

    /// The start `reserve` would give, without booking it.
    #[inline]
    pub fn first_fit(&mut self, now_ns: Ns, earliest_ns: Ns, duration_ns: Ns) -> Ns {
        while self.busy.front().is_some_and(|&(_, end)| end <= now_ns) {
            self.busy.pop_front();
        }
        // Common case: nothing booked after `earliest_ns`.
        if self.last_end() <= earliest_ns {
            return earliest_ns;
        }
        let mut start = earliest_ns;
        let mut at = self.busy.partition_point(|&(_, end)| end <= start);
        while at < self.busy.len() {
            let (b_start, b_end) = self.busy[at];
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
            self.busy.push_back((start_ns, start_ns + duration_ns));
            return;
        }
        let at = self.busy.partition_point(|&(s, _)| s < start_ns);
        debug_assert!(at == 0 || self.busy[at - 1].1 <= start_ns, "overlap");
        debug_assert!(
            at == self.busy.len() || start_ns + duration_ns <= self.busy[at].0,
            "overlap"
        );
        self.busy.insert(at, (start_ns, start_ns + duration_ns));
    }

    /// When the last booked interval ends (0 if none).
    pub fn last_end(&self) -> Ns {
        self.busy.back().map_or(0, |&(_, end)| end)
    }

    pub fn len(&self) -> usize {
        self.busy.len()
    }

    pub fn is_empty(&self) -> bool {
        self.busy.is_empty()
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
