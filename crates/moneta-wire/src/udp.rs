//! QuickSAN frames in UDP datagrams (issue 12 item 1): for networks that
//! will not carry raw Ethernet frames and hosts without root. Each datagram
//! holds one frame exactly as a packet socket would send it (Ethernet
//! addresses first: the nodes' `Mac::of_node` addresses, so the frame check
//! is the same); peers are told apart by their socket address.
//!
//! MTU: an 8 KB payload makes an 8,260-byte frame. Loopback carries it in
//! one IP packet (MTU 65,536); on a veth or Ethernet path with MTU 9000 it
//! fits too (8,260 + 28 bytes of IP and UDP headers); on a 1500-byte path
//! the kernel fragments it, and one lost fragment loses the frame. The
//! transport's frame limit is a parameter (default [`DEFAULT_MTU_BYTES`]).

use crate::transport::{set_buffers, PeerId, Transport, MAX_SKIPPED_PER_POLL, SOCKET_BUFFER_BYTES};
use crate::WireError;
use moneta_model::device::packet::Mac;
use std::io::ErrorKind;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;

/// Largest frame by default: what a 9000-byte IP MTU carries in one UDP
/// datagram.
pub const DEFAULT_MTU_BYTES: usize = 9000 - 28;

/// A UDP socket and the socket addresses of the peers.
pub struct UdpTransport {
    socket: UdpSocket,
    node: PeerId,
    peers: Vec<(PeerId, SocketAddr)>,
    mtu_bytes: usize,
}

impl UdpTransport {
    /// Bind `local` for node `node`; `peers` are the other nodes.
    pub fn bind(
        local: SocketAddr,
        node: PeerId,
        peers: &[(PeerId, SocketAddr)],
        mtu_bytes: usize,
    ) -> Result<UdpTransport, WireError> {
        let socket =
            UdpSocket::bind(local).map_err(|e| WireError::io(format!("bind UDP {local}"), e))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| WireError::io("UDP non-blocking", e))?;
        set_buffers(socket.as_raw_fd(), SOCKET_BUFFER_BYTES);
        Ok(UdpTransport {
            socket,
            node,
            peers: peers.to_vec(),
            mtu_bytes,
        })
    }

    /// The address the socket is bound to (to learn an ephemeral port).
    pub fn local_addr(&self) -> Result<SocketAddr, WireError> {
        self.socket
            .local_addr()
            .map_err(|e| WireError::io("UDP local address", e))
    }

    /// Learn or change a peer's address (peers that bind ephemeral ports).
    pub fn set_peer(&mut self, peer: PeerId, addr: SocketAddr) {
        match self.peers.iter_mut().find(|(p, _)| *p == peer) {
            Some(entry) => entry.1 = addr,
            None => self.peers.push((peer, addr)),
        }
    }
}

impl Transport for UdpTransport {
    fn mtu_bytes(&self) -> usize {
        self.mtu_bytes
    }
    fn wait_fd(&self) -> Option<std::os::fd::RawFd> {
        Some(self.socket.as_raw_fd())
    }

    fn local_mac(&self) -> Mac {
        Mac::of_node(self.node)
    }

    fn peer_mac(&self, peer: PeerId) -> Option<Mac> {
        self.peers
            .iter()
            .any(|(p, _)| *p == peer)
            .then(|| Mac::of_node(peer))
    }

    fn ethertype(&self) -> u16 {
        crate::frame::QUICKSAN_ETHERTYPE
    }

    fn send(&mut self, _now_ns: u64, peer: PeerId, frame: &[u8]) -> Result<(), WireError> {
        if frame.len() > self.mtu_bytes {
            return Err(WireError::FrameTooLarge {
                frame_bytes: frame.len(),
                mtu_bytes: self.mtu_bytes,
            });
        }
        let Some(&(_, addr)) = self.peers.iter().find(|(p, _)| *p == peer) else {
            return Err(WireError::UnknownPeer { peer });
        };
        match self.socket.send_to(frame, addr) {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::WouldBlock => Err(WireError::WouldBlock),
            // No one listens there (yet): the frame is lost, the peer may
            // come up later.
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::ENOBUFS) => Err(WireError::WouldBlock),
            Err(e) => Err(WireError::io(format!("UDP send to {addr}"), e)),
        }
    }

    fn poll_recv(
        &mut self,
        _now_ns: u64,
        buf: &mut [u8],
    ) -> Result<Option<(PeerId, usize)>, WireError> {
        for _ in 0..MAX_SKIPPED_PER_POLL {
            match self.socket.recv_from(buf) {
                Ok((len, from)) => {
                    if let Some(&(peer, _)) = self.peers.iter().find(|(_, a)| *a == from) {
                        return Ok(Some((peer, len)));
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                // An ICMP error from an earlier send: nothing to receive.
                Err(e) if e.kind() == ErrorKind::ConnectionRefused => {}
                Err(e) => return Err(WireError::io("UDP receive", e)),
            }
        }
        Ok(None)
    }
}
