//! A time-ordered queue of events with deterministic tie-breaking.
//!
//! A binary min-heap keyed by (time, insertion sequence), packed into one
//! 128-bit key (time in the upper half) so a comparison is one integer
//! compare. The sequence number makes the order of simultaneous events a
//! function of the order in which they were scheduled, never of heap
//! internals.

use crate::units::Ns;
use std::cmp::Ordering;
use std::collections::BinaryHeap;

struct Entry<E> {
    /// `time_ns << 64 | sequence`.
    key: u128,
    event: E,
}

impl<E> Entry<E> {
    fn time_ns(&self) -> Ns {
        (self.key >> 64) as Ns
    }
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    fn cmp(&self, other: &Self) -> Ordering {
        // Reversed: BinaryHeap is a max-heap, we want the earliest first.
        other.key.cmp(&self.key)
    }
}

/// Pending events, earliest first.
pub struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    next_sequence: u64,
}

impl<E> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> EventQueue<E> {
    pub fn new() -> Self {
        Self {
            heap: BinaryHeap::with_capacity(1024),
            next_sequence: 0,
        }
    }

    /// Schedule `event` at absolute time `time_ns`.
    #[inline]
    pub fn push(&mut self, time_ns: Ns, event: E) {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        self.heap.push(Entry {
            key: u128::from(time_ns) << 64 | u128::from(sequence),
            event,
        });
    }

    /// Remove and return the earliest event.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ns, E)> {
        self.heap.pop().map(|e| (e.time_ns(), e.event))
    }

    /// Time of the earliest event, if any.
    pub fn peek_time(&self) -> Option<Ns> {
        self.heap.peek().map(Entry::time_ns)
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_ties_in_insertion_order() {
        let mut q = EventQueue::new();
        q.push(10, 'a');
        q.push(5, 'b');
        q.push(10, 'c');
        q.push(5, 'd');
        let order: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(order, vec![(5, 'b'), (5, 'd'), (10, 'a'), (10, 'c')]);
    }
}
