//! A time-ordered queue of events with deterministic tie-breaking (the
//! discrete-event kernel under every model: SPEC §1, DESIGN "One model, two
//! clocks").
//!
//! Events come out in (time, insertion sequence) order: simultaneous events
//! leave in the order they were scheduled, never in an order the data
//! structure's internals pick. The pair is packed into one 128-bit key (time
//! in the upper half), so a comparison is one integer compare.
//!
//! A 4-ary min-heap in one array, written for the event loop's pattern of a
//! few pushes and one pop per event. The SAN keeps a few hundred events
//! pending, so a pop walks about four levels instead of a binary heap's
//! eight, and picks the smallest of a node's four adjacent children without
//! branches. Each operation keeps the entry it places in a register and
//! moves a hole through the array, writing each slot it passes once; a pop
//! moves the hole to the bottom along the smallest children and lets the
//! last entry (usually one of the latest events) rise into it;
//! `replace_top` (pop the earliest and push its successor, NVMM's thread
//! loop) walks down once with the new entry. It runs
//! fewer instructions than `std`'s binary heap for the same events in the
//! same order (README, "Speed"). A radix heap (monotone keys) was tried and was
//! slower here: with nanosecond times spread over microseconds, events
//! move down its buckets several times each.

use crate::units::Ns;

/// Children per node.
const ARITY: usize = 4;

#[derive(Clone, Copy)]
struct Entry<E> {
    /// `time_ns << 64 | sequence`.
    key: u128,
    event: E,
}

/// Pending events, earliest first.
pub struct EventQueue<E> {
    heap: Vec<Entry<E>>,
    next_sequence: u64,
}

impl<E: Copy> Default for EventQueue<E> {
    fn default() -> Self {
        Self::new()
    }
}

/// The smallest child of `hole`, if it has any: of a full set of four, a
/// tournament without branches; of the last, partial set, a scan.
#[inline]
fn smallest_child<E: Copy>(heap: &[Entry<E>], hole: usize) -> Option<usize> {
    let first = hole * ARITY + 1;
    if let Some(children) = heap.get(first..first + ARITY) {
        let k = |i: usize| children[i].key;
        let a = usize::from(k(1) < k(0));
        let b = 2 + usize::from(k(3) < k(2));
        return Some(first + if k(b) < k(a) { b } else { a });
    }
    (first..heap.len()).min_by_key(|&c| heap[c].key)
}

impl<E: Copy> EventQueue<E> {
    pub fn new() -> Self {
        Self {
            heap: Vec::with_capacity(1024),
            next_sequence: 0,
        }
    }

    /// The entry of `event` at `time_ns`, with the next sequence number.
    #[inline]
    fn entry(&mut self, time_ns: Ns, event: E) -> Entry<E> {
        let sequence = self.next_sequence;
        self.next_sequence += 1;
        Entry {
            key: u128::from(time_ns) << 64 | u128::from(sequence),
            event,
        }
    }

    /// Schedule `event` at absolute time `time_ns`.
    #[inline]
    pub fn push(&mut self, time_ns: Ns, event: E) {
        let entry = self.entry(time_ns, event);
        let mut hole = self.heap.len();
        self.heap.push(entry);
        let heap = &mut self.heap[..];
        while hole > 0 {
            let parent = (hole - 1) / ARITY;
            if heap[parent].key <= entry.key {
                break;
            }
            heap[hole] = heap[parent];
            hole = parent;
        }
        heap[hole] = entry;
    }

    /// Remove and return the earliest event.
    #[inline]
    pub fn pop(&mut self) -> Option<(Ns, E)> {
        let last = self.heap.pop()?;
        let heap = &mut self.heap[..];
        let Some(&top) = heap.first() else {
            return Some(((last.key >> 64) as Ns, last.event));
        };
        let mut hole = 0;
        while let Some(child) = smallest_child(heap, hole) {
            heap[hole] = heap[child];
            hole = child;
        }
        while hole > 0 {
            let parent = (hole - 1) / ARITY;
            if heap[parent].key <= last.key {
                break;
            }
            heap[hole] = heap[parent];
            hole = parent;
        }
        heap[hole] = last;
        Some(((top.key >> 64) as Ns, top.event))
    }

    /// The earliest event, left in the queue.
    #[inline]
    pub fn peek(&self) -> Option<(Ns, E)> {
        self.heap.first().map(|e| ((e.key >> 64) as Ns, e.event))
    }

    /// Remove the earliest event and schedule `event` at `time_ns`: a
    /// [`pop`](Self::pop) then a [`push`](Self::push), as one walk down
    /// from the root (a loop whose handler schedules its source's next
    /// event, as NVMM's threads do, pays one sift instead of two). The
    /// queue must not be empty.
    #[inline]
    pub fn replace_top(&mut self, time_ns: Ns, event: E) {
        let entry = self.entry(time_ns, event);
        let heap = &mut self.heap[..];
        assert!(!heap.is_empty(), "replace_top on an empty queue");
        let mut hole = 0;
        while let Some(child) = smallest_child(heap, hole) {
            if heap[child].key >= entry.key {
                break;
            }
            heap[hole] = heap[child];
            hole = child;
        }
        heap[hole] = entry;
    }

    /// Time of the earliest event, if any.
    #[inline]
    pub fn peek_time(&self) -> Option<Ns> {
        self.heap.first().map(|e| (e.key >> 64) as Ns)
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
    use crate::kernel::Rng;
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;

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

    /// Against a plain sorted order by (time, sequence): random pushes,
    /// pops and replacements of the earliest, mostly in the future of the last pop as a model schedules
    /// them, sometimes in its past, with many equal times.
    #[test]
    fn same_order_as_sorting_by_time_then_sequence() {
        for seed in 1..=40u64 {
            eprintln!("seed {seed}");
            let mut rng = Rng::new(seed);
            let mut q = EventQueue::new();
            let mut reference = BinaryHeap::new();
            let mut sequence = 0u64;
            let mut now: Ns = 0;
            for _ in 0..20_000 {
                if rng.below(100) < 55 {
                    let time = match rng.below(20) {
                        0 => now.saturating_sub(rng.below(50)),
                        1..=5 => now,
                        6..=8 => now + rng.below(1 << 40),
                        _ => now + rng.below(300),
                    };
                    q.push(time, sequence);
                    reference.push(Reverse((time, sequence)));
                    sequence += 1;
                } else if rng.below(4) == 0 && !reference.is_empty() {
                    // The earliest event handled, its next one scheduled.
                    let Reverse(want) = reference.pop().unwrap();
                    assert_eq!(q.peek(), Some(want), "seed {seed}");
                    now = want.0;
                    let time = now + rng.below(300);
                    q.replace_top(time, sequence);
                    reference.push(Reverse((time, sequence)));
                    sequence += 1;
                } else {
                    let want = reference.pop().map(|Reverse(p)| p);
                    assert_eq!(q.peek_time(), want.map(|(t, _)| t));
                    let got = q.pop();
                    assert_eq!(got, want, "seed {seed}");
                    if let Some((t, _)) = got {
                        now = t;
                    }
                }
                assert_eq!(q.len(), reference.len());
            }
            while let Some(Reverse(want)) = reference.pop() {
                assert_eq!(q.pop(), Some(want), "seed {seed}");
            }
            assert!(q.is_empty());
            assert_eq!(q.pop(), None);
        }
    }
}
