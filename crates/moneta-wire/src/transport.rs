//! The link under QuickSAN's network port (SPEC §4.2; issue 12 item 1): one
//! trait, three implementations (`packet_socket`, `udp`, `mem`), and the
//! fault-injecting wrapper (`fault`) that fits any of them.
//!
//! A transport moves whole frames (as `frame` lays them out, the Ethernet
//! addresses first) between this node and configured peers, best effort:
//! frames may be lost, corrupted, duplicated or reordered, and the reliable
//! layer above (`reliable`, `endpoint`) makes up for it. Both directions are
//! non-blocking: the device thread busy-polls (SPEC's port never sleeps; a
//! blocking receive costs ~70 µs per round trip here against ~7 µs polled).
//! Time comes in as a parameter (STYLE rule 2): only the in-memory wire and
//! the fault injector use it.

use crate::WireError;
use moneta_model::device::packet::Mac;

/// A node: its index in the shared MAC table (Table A.3's INDEX, 12 bits).
pub type PeerId = u16;

/// A best-effort link between this node and its peers.
pub trait Transport {
    /// The largest frame the link carries, Ethernet header included (an
    /// Ethernet interface's MTU + 14).
    fn mtu_bytes(&self) -> usize;
    /// This node's address (the source MAC of its frames).
    fn local_mac(&self) -> Mac;
    /// A peer's address, if the peer is configured.
    fn peer_mac(&self, peer: PeerId) -> Option<Mac>;
    /// The EtherType QuickSAN frames carry on this link.
    fn ethertype(&self) -> u16;
    /// Send one frame to `peer` without blocking. `WireError::WouldBlock`
    /// when the link cannot take it now (the frame is lost).
    fn send(&mut self, now_ns: u64, peer: PeerId, frame: &[u8]) -> Result<(), WireError>;
    /// Take one received frame into `buf` without blocking: the peer it
    /// came from and its length (frames longer than `buf` are cut, and so
    /// fail their CRC). Frames from unknown sources are skipped.
    fn poll_recv(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
    ) -> Result<Option<(PeerId, usize)>, WireError>;
    /// A descriptor that polls readable when a frame may be waiting, for a
    /// receiver that sleeps while idle (poll(2) on it); None if there is none.
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }
    /// Whether the link holds frames back to send later (a fault
    /// injector's delays): then its owner must turn it again soon.
    fn holds_frames(&self) -> bool {
        false
    }
}

impl<T: Transport + ?Sized> Transport for Box<T> {
    fn mtu_bytes(&self) -> usize {
        (**self).mtu_bytes()
    }
    fn local_mac(&self) -> Mac {
        (**self).local_mac()
    }
    fn peer_mac(&self, peer: PeerId) -> Option<Mac> {
        (**self).peer_mac(peer)
    }
    fn ethertype(&self) -> u16 {
        (**self).ethertype()
    }
    fn send(&mut self, now_ns: u64, peer: PeerId, frame: &[u8]) -> Result<(), WireError> {
        (**self).send(now_ns, peer, frame)
    }
    fn poll_recv(
        &mut self,
        now_ns: u64,
        buf: &mut [u8],
    ) -> Result<Option<(PeerId, usize)>, WireError> {
        (**self).poll_recv(now_ns, buf)
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).wait_fd()
    }
    fn holds_frames(&self) -> bool {
        (**self).holds_frames()
    }
}

/// At most this many unknown-source frames are skipped in one `poll_recv`
/// (a bound on the loop; the rest wait for the next call).
pub const MAX_SKIPPED_PER_POLL: usize = 64;

// What the two socket transports (`packet_socket`, `udp`) share.

/// Socket buffers asked for (the kernel may cap them without root).
pub const SOCKET_BUFFER_BYTES: usize = 4 << 20;

// Linux UAPI values the libc crate does not carry for this target.
const SO_SNDBUFFORCE: libc::c_int = 32;
const SO_RCVBUFFORCE: libc::c_int = 33;

/// Ask for socket buffers of `bytes` (forced past the sysctl cap when the
/// process may; best effort).
pub(crate) fn set_buffers(fd: std::os::fd::RawFd, bytes: usize) {
    let v = bytes as libc::c_int;
    for (force, plain) in [
        (SO_SNDBUFFORCE, libc::SO_SNDBUF),
        (SO_RCVBUFFORCE, libc::SO_RCVBUF),
    ] {
        // SAFETY: fd is an open socket; v outlives the calls.
        unsafe {
            let p = &v as *const libc::c_int as *const libc::c_void;
            let len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            if libc::setsockopt(fd, libc::SOL_SOCKET, force, p, len) != 0 {
                libc::setsockopt(fd, libc::SOL_SOCKET, plain, p, len);
            }
        }
    }
}
