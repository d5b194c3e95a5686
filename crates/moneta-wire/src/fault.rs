//! Fault injection in the transport (issue 12 item 5; there is no netem on
//! this kernel): drop, corrupt, duplicate, reorder, delay and partition, per
//! link, changed at run time through a shared [`FaultHandle`] (what
//! `moneta san fault …` will set through monetad's control socket).
//!
//! [`Faulty`] wraps any transport. Faults act on frames this node sends to
//! a peer; a partition also drops what arrives from that peer, so one
//! node's handle can cut a link both ways. Delayed and reordered frames
//! wait in a bounded queue and leave when a later `send` or `poll_recv`
//! finds them due. The choices come from a seeded generator
//! (`moneta_model::kernel::Rng`): on the in-memory wire a seed reproduces a
//! run exactly.

use crate::transport::{PeerId, Transport};
use crate::WireError;
use moneta_model::device::packet::Mac;
use moneta_model::kernel::Rng;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Frames a `Faulty` holds back at most (delay, reorder); more are dropped.
pub const MAX_HELD_FRAMES: usize = 8192;

/// The faults of one link (probabilities per frame, times in ns).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LinkFaults {
    pub drop: f64,
    /// One byte of the frame gets a random nonzero XOR.
    pub corrupt: f64,
    /// The frame is sent twice (each copy meets the other faults on its own).
    pub duplicate: f64,
    /// The frame is held back up to `reorder_ns` extra, so later frames
    /// pass it.
    pub reorder: f64,
    pub reorder_ns: u64,
    /// Every frame waits this long, plus up to `jitter_ns` more.
    pub delay_ns: u64,
    pub jitter_ns: u64,
    /// Nothing crosses the link in either direction.
    pub partition: bool,
}

impl LinkFaults {
    /// No faults.
    pub const NONE: LinkFaults = LinkFaults {
        drop: 0.0,
        corrupt: 0.0,
        duplicate: 0.0,
        reorder: 0.0,
        reorder_ns: 0,
        delay_ns: 0,
        jitter_ns: 0,
        partition: false,
    };

    /// Parse `drop=0.01,corrupt=0.001,duplicate=0.01,reorder=0.05,
    /// reorder-us=50,delay-us=100,jitter-us=20,partition` (any subset; `none`
    /// or an empty string: no faults). Probabilities may be given as
    /// percentages (`drop=1%`).
    pub fn parse(spec: &str) -> Result<LinkFaults, WireError> {
        let mut f = LinkFaults::NONE;
        for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if item == "none" || item == "heal" {
                f = LinkFaults::NONE;
                continue;
            }
            if item == "partition" {
                f.partition = true;
                continue;
            }
            let Some((key, value)) = item.split_once('=') else {
                return Err(WireError::Config(format!(
                    "fault `{item}`: expected key=value or `partition`"
                )));
            };
            let prob = || -> Result<f64, WireError> {
                let (v, scale) = match value.strip_suffix('%') {
                    Some(v) => (v, 0.01),
                    None => (value, 1.0),
                };
                let p = v.parse::<f64>().ok().map(|p| p * scale);
                match p {
                    Some(p) if (0.0..=1.0).contains(&p) => Ok(p),
                    _ => Err(WireError::Config(format!(
                        "fault {key}={value}: a probability in [0, 1] (or 0%..100%)"
                    ))),
                }
            };
            let micros = || -> Result<u64, WireError> {
                value
                    .parse::<u64>()
                    .ok()
                    .and_then(|us| us.checked_mul(1000))
                    .ok_or_else(|| {
                        WireError::Config(format!("fault {key}={value}: whole microseconds"))
                    })
            };
            match key {
                "drop" | "loss" => f.drop = prob()?,
                "corrupt" => f.corrupt = prob()?,
                "duplicate" | "dup" => f.duplicate = prob()?,
                "reorder" => f.reorder = prob()?,
                "reorder-us" => f.reorder_ns = micros()?,
                "delay-us" => f.delay_ns = micros()?,
                "jitter-us" => f.jitter_ns = micros()?,
                "partition" => {
                    f.partition = match value {
                        "1" | "true" | "on" => true,
                        "0" | "false" | "off" => false,
                        _ => {
                            return Err(WireError::Config(format!(
                                "fault partition={value}: on or off"
                            )))
                        }
                    }
                }
                _ => {
                    return Err(WireError::Config(format!(
                        "unknown fault `{key}` (drop, corrupt, duplicate, reorder, reorder-us, \
                         delay-us, jitter-us, partition)"
                    )))
                }
            }
        }
        if f.reorder > 0.0 && f.reorder_ns == 0 {
            f.reorder_ns = 50_000;
        }
        Ok(f)
    }
}

#[derive(Debug, Default)]
struct FaultTable {
    all: LinkFaults,
    per_peer: Vec<(PeerId, LinkFaults)>,
}

impl FaultTable {
    fn of(&self, peer: PeerId) -> LinkFaults {
        self.per_peer
            .iter()
            .find(|(p, _)| *p == peer)
            .map_or(self.all, |(_, f)| *f)
    }
}

#[derive(Debug, Default)]
struct FaultShared {
    generation: AtomicU64,
    table: Mutex<FaultTable>,
}

/// The run-time control of one node's faults; clones share them, across
/// threads.
#[derive(Debug, Clone, Default)]
pub struct FaultHandle {
    shared: Arc<FaultShared>,
}

impl FaultHandle {
    pub fn new() -> FaultHandle {
        FaultHandle::default()
    }

    fn edit(&self, f: impl FnOnce(&mut FaultTable)) {
        let mut t = self.shared.table.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut t);
        self.shared.generation.fetch_add(1, Ordering::Release);
    }

    /// Faults of every link without its own setting.
    pub fn set_all(&self, faults: LinkFaults) {
        self.edit(|t| {
            t.all = faults;
            t.per_peer.clear();
        });
    }

    /// Faults of the link to `peer`.
    pub fn set_link(&self, peer: PeerId, faults: LinkFaults) {
        self.edit(|t| match t.per_peer.iter_mut().find(|(p, _)| *p == peer) {
            Some(entry) => entry.1 = faults,
            None => t.per_peer.push((peer, faults)),
        });
    }

    /// Cut (or heal) the link to `peer`, keeping its other faults.
    pub fn partition(&self, peer: PeerId, cut: bool) {
        self.edit(|t| {
            let mut f = t.of(peer);
            f.partition = cut;
            match t.per_peer.iter_mut().find(|(p, _)| *p == peer) {
                Some(entry) => entry.1 = f,
                None => t.per_peer.push((peer, f)),
            }
        });
    }

    /// No faults anywhere.
    pub fn clear(&self) {
        self.set_all(LinkFaults::NONE);
    }

    /// The faults of the link to `peer` now.
    pub fn link(&self, peer: PeerId) -> LinkFaults {
        self.shared
            .table
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .of(peer)
    }
}

/// What the injector did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub dropped: u64,
    pub corrupted: u64,
    pub duplicated: u64,
    pub reordered: u64,
    pub delayed: u64,
    pub partitioned_out: u64,
    pub partitioned_in: u64,
    pub held_overflow: u64,
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Held {
    release: Reverse<(u64, u64)>,
    peer: PeerId,
    frame: Vec<u8>,
}

/// A transport with faults.
pub struct Faulty<T> {
    inner: T,
    handle: FaultHandle,
    generation: u64,
    table: FaultTable,
    rng: Rng,
    held: BinaryHeap<Held>,
    held_order: u64,
    spare: Vec<Vec<u8>>,
    stats: FaultStats,
}

impl<T: Transport> Faulty<T> {
    /// `inner` with the faults `handle` sets, choices drawn from `seed`.
    pub fn new(inner: T, handle: FaultHandle, seed: u64) -> Faulty<T> {
        Faulty {
            inner,
            handle,
            generation: u64::MAX,
            table: FaultTable::default(),
            rng: Rng::new(seed),
            held: BinaryHeap::new(),
            held_order: 0,
            spare: Vec::new(),
            stats: FaultStats::default(),
        }
    }

    pub fn handle(&self) -> &FaultHandle {
        &self.handle
    }

    pub fn stats(&self) -> FaultStats {
        self.stats
    }

    pub fn inner(&self) -> &T {
        &self.inner
    }

    fn refresh(&mut self) {
        let g = self.handle.shared.generation.load(Ordering::Acquire);
        if g != self.generation {
            let t = self
                .handle
                .shared
                .table
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            self.table = FaultTable {
                all: t.all,
                per_peer: t.per_peer.clone(),
            };
            self.generation = g;
        }
    }

    /// Send the held frames that are due.
    fn release(&mut self, now_ns: u64) {
        while let Some(top) = self.held.peek() {
            if top.release.0 .0 > now_ns {
                break;
            }
            let h = self.held.pop().expect("peeked");
            // A frame the link cannot take now is lost, as any other.
            let _ = self.inner.send(now_ns, h.peer, &h.frame);
            self.spare.push(h.frame);
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.unit() < p
    }

    fn send_copy(
        &mut self,
        now_ns: u64,
        peer: PeerId,
        frame: &[u8],
        f: &LinkFaults,
    ) -> Result<(), WireError> {
        if self.chance(f.drop) {
            self.stats.dropped += 1;
            return Ok(());
        }
        let corrupt = self.chance(f.corrupt);
        let mut delay = f.delay_ns;
        if f.jitter_ns > 0 {
            delay += self.rng.below(f.jitter_ns + 1);
        }
        if delay > 0 {
            self.stats.delayed += 1;
        }
        if self.chance(f.reorder) {
            self.stats.reordered += 1;
            delay += 1 + self.rng.below(f.reorder_ns.max(1));
        }
        if !corrupt && delay == 0 {
            return self.inner.send(now_ns, peer, frame);
        }
        let mut copy = self.spare.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(frame);
        if corrupt && !copy.is_empty() {
            self.stats.corrupted += 1;
            let at = self.rng.below(copy.len() as u64) as usize;
            copy[at] ^= 1 + self.rng.below(255) as u8;
        }
        if delay == 0 {
            let r = self.inner.send(now_ns, peer, &copy);
            self.spare.push(copy);
            return r;
        }
        if self.held.len() >= MAX_HELD_FRAMES {
            self.stats.held_overflow += 1;
            self.spare.push(copy);
            return Ok(());
        }
        self.held_order += 1;
        self.held.push(Held {
            release: Reverse((now_ns + delay, self.held_order)),
            peer,
            frame: copy,
        });
        Ok(())
    }
}

impl<T: Transport> Transport for Faulty<T> {
    fn mtu_bytes(&self) -> usize {
        self.inner.mtu_bytes()
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        self.inner.wait_fd()
    }
    fn holds_frames(&self) -> bool {
        !self.held.is_empty() || self.inner.holds_frames()
    }

    fn local_mac(&self) -> Mac {
        self.inner.local_mac()
    }

    fn peer_mac(&self, peer: PeerId) -> Option<Mac> {
        self.inner.peer_mac(peer)
    }

    fn ethertype(&self) -> u16 {
        self.inner.ethertype()
    }

    fn send(&mut self, now_ns: u64, peer: PeerId, frame: &[u8]) -> Result<(), WireError> {
        self.refresh();
        self.release(now_ns);
        let f = self.table.of(peer);
        if f.partition {
            self.stats.partitioned_out += 1;
            return Ok(());
        }
        if f == LinkFaults::NONE {
            return self.inner.send(now_ns, peer, frame);
        }
        if self.chance(f.duplicate) {
            self.stats.duplicated += 1;
            self.send_copy(now_ns, peer, frame, &f)?;
        }
        self.send_copy(now_ns, peer, frame, &f)
    }

    fn poll_recv(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
    ) -> Result<Option<(PeerId, usize)>, WireError> {
        self.refresh();
        self.release(now_ns);
        for _ in 0..crate::transport::MAX_SKIPPED_PER_POLL {
            match self.inner.poll_recv(now_ns, buf)? {
                Some((peer, _)) if self.table.of(peer).partition => {
                    self.stats.partitioned_in += 1;
                }
                other => return Ok(other),
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_faults() {
        let f = LinkFaults::parse("drop=1%,corrupt=0.001,reorder=0.05,delay-us=100").unwrap();
        assert_eq!(f.drop, 0.01);
        assert_eq!(f.corrupt, 0.001);
        assert_eq!(f.reorder_ns, 50_000);
        assert_eq!(f.delay_ns, 100_000);
        assert!(LinkFaults::parse("partition").unwrap().partition);
        assert_eq!(LinkFaults::parse("none").unwrap(), LinkFaults::NONE);
        for bad in [
            "drop=2",
            "drop=x",
            "bogus=1",
            "delay-us=-3",
            "partition=maybe",
            "drop",
        ] {
            assert!(LinkFaults::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn handle_changes_reach_the_wrapper() {
        let wire = crate::mem::MemWire::new(2, 1000);
        let h = FaultHandle::new();
        let mut a = Faulty::new(wire.port(0, 9000), h.clone(), 7);
        let mut b = wire.port(1, 9000);
        let mut buf = [0u8; 64];
        a.send(0, 1, &[1; 64]).unwrap();
        assert!(b.poll_recv(1000, &mut buf).unwrap().is_some());
        h.partition(1, true);
        a.send(2000, 1, &[1; 64]).unwrap();
        b.send(2000, 0, &[2; 64]).unwrap();
        assert!(b.poll_recv(9000, &mut buf).unwrap().is_none());
        assert!(a.poll_recv(9000, &mut buf).unwrap().is_none());
        assert_eq!(a.stats().partitioned_out, 1);
        assert_eq!(a.stats().partitioned_in, 1);
        h.partition(1, false);
        a.send(10_000, 1, &[3; 64]).unwrap();
        assert_eq!(b.poll_recv(11_000, &mut buf).unwrap(), Some((0, 64)));
        assert_eq!(buf[0], 3);
        // Delay: the frame waits until the wrapper is polled after it is due.
        h.set_all(LinkFaults {
            delay_ns: 5000,
            ..LinkFaults::NONE
        });
        a.send(20_000, 1, &[4; 64]).unwrap();
        assert!(b.poll_recv(30_000, &mut buf).unwrap().is_none());
        assert!(a.poll_recv(30_000, &mut buf).unwrap().is_none());
        assert_eq!(b.poll_recv(31_000, &mut buf).unwrap(), Some((0, 64)));
    }
}
