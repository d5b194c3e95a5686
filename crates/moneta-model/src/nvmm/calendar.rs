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

/// Up to this many live intervals, [`Calendar::fit`] scans instead of
/// searching.
const LINEAR_SCAN_MAX: usize = 16;

/// Where a reservation would go: its start, and the position in the list
/// that [`Calendar::book_at`] puts it at (found once, used twice).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Fit {
    pub start_ns: Ns,
    at: usize,
}

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
        self.prune(now_ns);
        let fit = self.fit(earliest_ns, duration_ns);
        self.book_at(fit, duration_ns);
        fit.start_ns
    }

    /// Drop intervals that ended by `now_ns`.
    #[inline]
    pub fn prune(&mut self, now_ns: Ns) {
        // Usually none has: the list is empty or its first interval is
        // still busy (the list is empty or starts at `head`).
        match self.busy.get(self.head) {
            Some(&(_, end)) if end <= now_ns => self.drop_ended(now_ns),
            _ => {}
        }
    }

    #[inline]
    fn drop_ended(&mut self, now_ns: Ns) {
        let len = self.busy.len();
        let mut head = self.head + 1;
        while head < len && self.busy[head].1 <= now_ns {
            head += 1;
        }
        if head == len {
            self.busy.clear();
            self.head = 0;
        } else if head >= 64 {
            self.busy.drain(..head);
            self.head = 0;
        } else {
            self.head = head;
        }
    }

    /// The start `reserve` would give, without booking it.
    #[inline]
    pub fn first_fit(&mut self, now_ns: Ns, earliest_ns: Ns, duration_ns: Ns) -> Ns {
        self.prune(now_ns);
        self.fit(earliest_ns, duration_ns).start_ns
    }

    /// The first gap of `duration_ns` at or after `earliest_ns` among the
    /// intervals left by the last [`prune`](Self::prune).
    #[inline]
    pub fn fit(&self, earliest_ns: Ns, duration_ns: Ns) -> Fit {
        let len = self.busy.len();
        // Common case: nothing booked after `earliest_ns`.
        if self.last_end() <= earliest_ns {
            return Fit {
                start_ns: earliest_ns,
                at: len,
            };
        }
        let live = &self.busy[self.head..];
        let mut start = earliest_ns;
        // Intervals do not overlap, so their ends are sorted too: the first
        // one still busy at `start`. The live list is short (the work in
        // flight), so a scan beats a binary search until it is not.
        let mut at = if live.len() <= LINEAR_SCAN_MAX {
            live.iter()
                .position(|&(_, end)| end > start)
                .unwrap_or(live.len())
        } else {
            live.partition_point(|&(_, end)| end <= start)
        };
        while at < live.len() {
            let (b_start, b_end) = live[at];
            if start + duration_ns <= b_start {
                break;
            }
            start = start.max(b_end);
            at += 1;
        }
        Fit {
            start_ns: start,
            at: self.head + at,
        }
    }

    /// Book `[start, start + duration)`, which must be free.
    #[inline]
    pub fn book(&mut self, start_ns: Ns, duration_ns: Ns) {
        if self.last_end() <= start_ns {
            return self.book_at(
                Fit {
                    start_ns,
                    at: self.busy.len(),
                },
                duration_ns,
            );
        }
        // Before the first interval that starts at or after `start_ns`;
        // bookings are made near the end, so scan from there.
        let mut at = self.busy.len();
        while at > self.head && self.busy[at - 1].0 >= start_ns {
            at -= 1;
        }
        self.book_at(Fit { start_ns, at }, duration_ns);
    }

    /// Book `duration_ns` where [`fit`](Self::fit) found room, with no
    /// booking or pruning since.
    #[inline(always)]
    pub fn book_at(&mut self, fit: Fit, duration_ns: Ns) {
        if duration_ns == 0 {
            return;
        }
        let interval = (fit.start_ns, fit.start_ns + duration_ns);
        let (len, at) = (self.busy.len(), fit.at);
        debug_assert!(self.head <= at && at <= len);
        debug_assert!(
            at == self.head || self.busy[at - 1].1 <= interval.0,
            "overlap"
        );
        debug_assert!(at == len || interval.1 <= self.busy[at].0, "overlap");
        if at == len {
            self.busy.push(interval);
        } else if self.head > 0 && at - self.head < len - at {
            // Move whichever side is shorter by one slot: the live
            // intervals before `at` down into the dropped slot below
            // `head`, or those after it up (a handful of moves, no call
            // into memmove).
            for i in self.head..at {
                self.busy[i - 1] = self.busy[i];
            }
            self.head -= 1;
            self.busy[at - 1] = interval;
        } else {
            self.busy.push(interval);
            let mut i = len;
            while i > at {
                self.busy[i] = self.busy[i - 1];
                i -= 1;
            }
            self.busy[at] = interval;
        }
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
