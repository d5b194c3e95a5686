//! A deterministic in-memory wire (issue 12 item 1): the transport of the
//! tests. Every port's frames go into the destination's inbox and arrive
//! after a fixed latency of the caller's clock (a manual clock the test
//! advances): same calls, same seed for the fault injector, same run.
//! A test drives all its endpoints from one loop (the wire is behind a
//! mutex only so a port can be a daemon's `Box<dyn Transport + Send>`, as
//! the replica protocol's simulator needs, `moneta_emu::san_sim`). The
//! wire itself is perfect; `fault::Faulty` around a port makes it lossy.

use crate::transport::{PeerId, Transport};
use crate::WireError;
use moneta_model::device::packet::Mac;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

/// Frames one inbox holds before the wire drops more (a switch's buffer).
pub const INBOX_FRAMES: usize = 4096;

struct Inbox {
    /// (arrival time, sender, frame), in arrival order (one latency).
    frames: VecDeque<(u64, PeerId, Vec<u8>)>,
}

struct Shared {
    latency_ns: u64,
    inboxes: Vec<Inbox>,
    spare: Vec<Vec<u8>>,
    dropped_full: u64,
}

/// The wire: hands out one port per node.
#[derive(Clone)]
pub struct MemWire {
    shared: Arc<Mutex<Shared>>,
}

impl MemWire {
    /// A wire joining nodes `0..nodes` with `latency_ns` one way.
    pub fn new(nodes: u16, latency_ns: u64) -> MemWire {
        MemWire {
            shared: Arc::new(Mutex::new(Shared {
                latency_ns,
                inboxes: (0..nodes)
                    .map(|_| Inbox {
                        frames: VecDeque::new(),
                    })
                    .collect(),
                spare: Vec::new(),
                dropped_full: 0,
            })),
        }
    }

    /// Node `node`'s port, with frames of at most `mtu_bytes`.
    pub fn port(&self, node: PeerId, mtu_bytes: usize) -> MemPort {
        MemPort {
            shared: self.shared.clone(),
            node,
            mtu_bytes,
        }
    }

    /// Drop every frame on its way to `node` (it died: what was in flight
    /// to it is lost with its buffers).
    pub fn drop_inbox(&self, node: PeerId) {
        let mut s = lock(&self.shared);
        if let Some(inbox) = s.inboxes.get_mut(usize::from(node)) {
            let frames: Vec<_> = inbox.frames.drain(..).map(|(_, _, f)| f).collect();
            s.spare.extend(frames);
        }
    }

    /// Frames dropped because an inbox was full.
    pub fn dropped_full(&self) -> u64 {
        lock(&self.shared).dropped_full
    }

    /// Frames on the wire now.
    pub fn in_flight(&self) -> usize {
        lock(&self.shared)
            .inboxes
            .iter()
            .map(|i| i.frames.len())
            .sum()
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    // A panic while holding it leaves plain frames: still usable.
    shared.lock().unwrap_or_else(|p| p.into_inner())
}

/// One node's attachment to a [`MemWire`].
pub struct MemPort {
    shared: Arc<Mutex<Shared>>,
    node: PeerId,
    mtu_bytes: usize,
}

impl Transport for MemPort {
    fn mtu_bytes(&self) -> usize {
        self.mtu_bytes
    }

    fn local_mac(&self) -> Mac {
        Mac::of_node(self.node)
    }

    fn peer_mac(&self, peer: PeerId) -> Option<Mac> {
        let nodes = lock(&self.shared).inboxes.len();
        (usize::from(peer) < nodes).then(|| Mac::of_node(peer))
    }

    fn ethertype(&self) -> u16 {
        crate::frame::QUICKSAN_ETHERTYPE
    }

    fn send(&mut self, now_ns: u64, peer: PeerId, frame: &[u8]) -> Result<(), WireError> {
        if frame.len() > self.mtu_bytes {
            return Err(WireError::FrameTooLarge {
                frame_bytes: frame.len(),
                mtu_bytes: self.mtu_bytes,
            });
        }
        let mut s = lock(&self.shared);
        let at = now_ns + s.latency_ns;
        let mut copy = s.spare.pop().unwrap_or_default();
        copy.clear();
        copy.extend_from_slice(frame);
        let Some(inbox) = s.inboxes.get_mut(usize::from(peer)) else {
            return Err(WireError::UnknownPeer { peer });
        };
        if inbox.frames.len() >= INBOX_FRAMES {
            s.dropped_full += 1;
            return Ok(());
        }
        inbox.frames.push_back((at, self.node, copy));
        Ok(())
    }

    fn poll_recv(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
    ) -> Result<Option<(PeerId, usize)>, WireError> {
        let mut s = lock(&self.shared);
        let inbox = &mut s.inboxes[usize::from(self.node)];
        match inbox.frames.front() {
            Some((at, _, _)) if *at <= now_ns => {}
            _ => return Ok(None),
        }
        let (_, from, frame) = inbox.frames.pop_front().expect("checked above");
        let len = frame.len().min(buf.len());
        buf[..len].copy_from_slice(&frame[..len]);
        s.spare.push(frame);
        Ok(Some((from, len)))
    }
}
