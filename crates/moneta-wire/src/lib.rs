//! # moneta-wire
//!
//! QuickSAN's network port on a real wire (SPEC §4.2, issue 12): the frames
//! of Table A.3 carried between monetad processes on the wall clock, where
//! the simulator (`moneta_model::device::network`) carries them in virtual
//! time. The layers, from the link up:
//!
//! - [`transport`]: the trait every link implements (non-blocking send of a
//!   frame to a peer, busy-polled receive), and its three links:
//!   [`packet_socket`] (raw Ethernet frames over AF_PACKET, the paper's
//!   EtherType), [`udp`] (for networks that do not carry raw frames, hosts
//!   without root) and [`mem`] (a deterministic in-memory wire for tests).
//! - [`fault`]: drop, corrupt, duplicate, reorder, delay and partition per
//!   link, applied to any transport, set at run time through a handle.
//! - [`frame`]: what goes on the wire: the Table A.3 header (encoded by the
//!   model's codec, `moneta_model::device::packet`), a session header, the
//!   payload, a CRC32C ([`crc32c`]) of all of them and a tag; 802.3x pause
//!   frames.
//! - [`auth`]: the SAN's secret, the keyed MAC (BLAKE3) that tags every
//!   frame, and the per-peer replay window (issue 22 item 3).
//! - [`reliable`]: the per-peer session that makes the lossy link lossless
//!   in software: sequence numbers, acknowledgements, bounded retransmission,
//!   duplicate suppression, in-order delivery, incarnations (epochs).
//! - [`endpoint`]: what a daemon's device thread uses: one endpoint per
//!   daemon, busy-polled; the receive buffer with the model's pause gauge
//!   (1/4 on, 1/8 off); peer failures reported as events.
//! - [`link`]: a link and its peers as a command line names them
//!   (`udp:…`, `packet:…`), opened into a transport.
//! - [`netns`]: network namespaces joined by a veth pair, for the tests and
//!   the benchmark of the packet-socket transport.

pub mod auth;
pub mod crc32c;
pub mod endpoint;
pub mod fault;
pub mod frame;
pub mod link;
pub mod mem;
pub mod netns;
pub mod packet_socket;
pub mod reliable;
pub mod transport;
pub mod udp;

pub use endpoint::{Endpoint, WireConfig, WireEvent, WireStats};
pub use fault::{FaultHandle, Faulty, LinkFaults};
pub use transport::{PeerId, Transport};

use moneta_model::device::packet::PacketError;
use std::fmt;

/// Everything that can go wrong on the wire, as a value (STYLE rule 7).
#[derive(Debug)]
pub enum WireError {
    /// The peer was declared failed (silent past the bound, or out of
    /// retransmissions); requests to it fail until it is heard again.
    PeerFailed { peer: PeerId },
    /// The peer's send window is full: try again after polling.
    WindowFull { peer: PeerId },
    /// No such peer was configured.
    UnknownPeer { peer: PeerId },
    /// The frame does not fit the link's MTU (an 8 KB payload needs jumbo
    /// frames: MTU ≥ 8,260 bytes of frame, e.g. `ip link set … mtu 9000`).
    FrameTooLarge {
        frame_bytes: usize,
        mtu_bytes: usize,
    },
    /// The header cannot be encoded (Table A.3 field limits).
    Packet(PacketError),
    /// A payload that does not agree with the header.
    BadPayload {
        header_size: usize,
        payload_bytes: usize,
    },
    /// The transport cannot take the frame now (socket buffer full); the
    /// reliable layer treats it as a lost frame.
    WouldBlock,
    /// A system call failed.
    Io {
        context: String,
        source: std::io::Error,
    },
    /// A configuration that cannot work.
    Config(String),
}

impl WireError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> WireError {
        WireError::Io {
            context: context.into(),
            source,
        }
    }

    /// The last OS error, with context.
    pub(crate) fn last_os(context: impl Into<String>) -> WireError {
        WireError::io(context, std::io::Error::last_os_error())
    }
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireError::PeerFailed { peer } => write!(f, "peer {peer} has failed (silent)"),
            WireError::WindowFull { peer } => write!(f, "send window to peer {peer} is full"),
            WireError::UnknownPeer { peer } => write!(f, "peer {peer} is not configured"),
            WireError::FrameTooLarge {
                frame_bytes,
                mtu_bytes,
            } => write!(
                f,
                "a frame of {frame_bytes} bytes exceeds the link's {mtu_bytes}-byte frames \
                 (8 KB payloads need jumbo frames: MTU 9000)"
            ),
            WireError::Packet(e) => write!(f, "packet: {e}"),
            WireError::BadPayload {
                header_size,
                payload_bytes,
            } => write!(
                f,
                "header says {header_size} payload bytes, {payload_bytes} were given"
            ),
            WireError::WouldBlock => write!(f, "transport busy"),
            WireError::Io { context, source } => write!(f, "{context}: {source}"),
            WireError::Config(m) => write!(f, "configuration: {m}"),
        }
    }
}

impl std::error::Error for WireError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WireError::Io { source, .. } => Some(source),
            WireError::Packet(e) => Some(e),
            _ => None,
        }
    }
}

impl From<PacketError> for WireError {
    fn from(e: PacketError) -> Self {
        WireError::Packet(e)
    }
}
