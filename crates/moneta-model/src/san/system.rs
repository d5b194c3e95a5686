//! The SAN as one simulated system (SPEC §4.1–4.3): hosts, the QuickSAN
//! devices in their PCIe slots, the Ethernet fabric between the devices'
//! ports (and between the hosts' own NICs, for iSCSI's TCP traffic), the
//! global address map (the "configuration utility") and mirroring, all on
//! one event queue and one virtual clock.
//!
//! This is the boundary the host interfaces (QuickSAN-D, QuickSAN-OS,
//! iSCSI, Fibre Channel) drive: they turn an application request into host
//! software time and calls here; the SAN returns when the device (and the
//! network behind it) finished, with the device-side breakdown.

use crate::breakdown::DeviceParts;
use crate::config::Config;
use crate::units::{Ns, Op};
use std::fmt;

/// A host (server or client machine).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostId(pub u16);

/// A QuickSAN device (SSD or NIC), one network port each.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeviceId(pub u16);

/// What a device is (SPEC §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// Moneta-D array plus network port: serves its host and remote peers.
    Ssd,
    /// The same device without memory: forwards every request.
    Nic,
}

/// How hosts and devices are arranged (SPEC §4.1, §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Host 0 is a server holding `ssds` SSDs (one shared block device);
    /// hosts 1..=`clients` each hold a QuickSAN NIC.
    Centralized { ssds: u16, clients: u16 },
    /// `nodes` hosts, each holding one SSD; together one global space.
    Distributed { nodes: u16 },
}

/// Everything that defines a SAN.
#[derive(Debug, Clone)]
pub struct SanConfig {
    /// The device preset every SSD uses (`quicksan-ssd`), with its network
    /// parameters; NICs use the same minus the memory (`quicksan-nic`).
    pub device: Config,
    pub topology: Topology,
    /// Half of each SSD mirrors another SSD's primary half (SPEC §4.3).
    pub mirroring: bool,
}

/// A block request as a host interface hands it to its device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SanRequest {
    /// Opaque; returned in the completion.
    pub token: u64,
    pub op: Op,
    /// Global address ([`San::submit`]) or device-local ([`San::submit_local`]).
    pub addr: u64,
    pub len_bytes: u64,
    /// Source-side permission check time (QuickSAN-D), 0 otherwise.
    pub protection_ns: Ns,
}

/// What the SAN reports as time passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SanEvent {
    /// A request submitted through `device` finished (for a mirrored write:
    /// both copies). `parts` sum exactly to `time_ns` minus the submit time.
    Completed {
        device: DeviceId,
        token: u64,
        time_ns: Ns,
        parts: DeviceParts,
        /// Bytes served by the submitting device's own memory and by peers.
        local_bytes: u64,
        remote_bytes: u64,
    },
    /// A host-to-host message ([`San::send_message`]) arrived whole.
    Message {
        from: HostId,
        to: HostId,
        token: u64,
        time_ns: Ns,
    },
}

/// Counters over the whole run, for reports and the energy model.
#[derive(Debug, Clone, Default)]
pub struct SanCounters {
    pub requests_completed: u64,
    pub local_bytes: u64,
    pub remote_bytes: u64,
    /// Bytes on the wire (headers, framing, payload) over all links.
    pub wire_bytes: u64,
    pub packets: u64,
    /// 802.3x pause frames sent, and the largest receive-buffer occupancy
    /// any port reached.
    pub pauses: u64,
    pub max_rx_buffer_bytes: u64,
}

/// Why the SAN refused a call. Never a panic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SanError {
    BadConfig(String),
    NoSuchHost(HostId),
    NoSuchDevice(DeviceId),
    /// The device has no memory of its own (a NIC) for `submit_local`.
    NotAnSsd(DeviceId),
    OutOfRange {
        addr: u64,
        len_bytes: u64,
        capacity_bytes: u64,
    },
    ZeroLength,
}

impl fmt::Display for SanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SanError::BadConfig(m) => write!(f, "bad SAN configuration: {m}"),
            SanError::NoSuchHost(h) => write!(f, "no host {}", h.0),
            SanError::NoSuchDevice(d) => write!(f, "no device {}", d.0),
            SanError::NotAnSsd(d) => write!(f, "device {} is a NIC, it has no memory", d.0),
            SanError::OutOfRange {
                addr,
                len_bytes,
                capacity_bytes,
            } => write!(
                f,
                "request [{addr}, +{len_bytes}) exceeds capacity {capacity_bytes}"
            ),
            SanError::ZeroLength => write!(f, "zero-length request"),
        }
    }
}

impl std::error::Error for SanError {}

/// The SAN. API contract (the host interfaces rely on it):
///
/// - `submit` takes any number of requests per device: beyond the device's
///   tags they wait in FIFO order (that wait is `DeviceQueue` time).
/// - Events come out of `deliver_due` in time order; same seed, same calls,
///   same events.
pub struct San {
    _private: (),
}

impl San {
    pub fn new(config: &SanConfig, seed: u64) -> Result<San, SanError> {
        let _ = (config, seed);
        todo!("san-core")
    }

    pub fn hosts(&self) -> u16 {
        todo!("san-core")
    }

    /// The devices in `host`'s PCIe slots.
    pub fn devices_of(&self, host: HostId) -> &[DeviceId] {
        let _ = host;
        todo!("san-core")
    }

    pub fn kind(&self, device: DeviceId) -> DeviceKind {
        let _ = device;
        todo!("san-core")
    }

    pub fn host_of(&self, device: DeviceId) -> HostId {
        let _ = device;
        todo!("san-core")
    }

    /// Size of the global address space (primary data; half the raw
    /// capacity when mirrored).
    pub fn capacity_bytes(&self) -> u64 {
        todo!("san-core")
    }

    /// The SSD holding the primary copy of global address `addr`, and the
    /// device-local address there.
    pub fn primary(&self, addr: u64) -> (DeviceId, u64) {
        let _ = addr;
        todo!("san-core")
    }

    /// Submit through `device` (QuickSAN-D or QuickSAN-OS): global address,
    /// routed by the device (local memory or peers over the network).
    pub fn submit(
        &mut self,
        now: Ns,
        device: DeviceId,
        request: SanRequest,
    ) -> Result<(), SanError> {
        let _ = (now, device, request);
        todo!("san-core")
    }

    /// Submit to `device`'s own memory with a device-local address, the
    /// network port unused: the SSD as a plain block device (iSCSI and
    /// Fibre Channel targets).
    pub fn submit_local(
        &mut self,
        now: Ns,
        device: DeviceId,
        request: SanRequest,
    ) -> Result<(), SanError> {
        let _ = (now, device, request);
        todo!("san-core")
    }

    /// A message of `bytes` payload from `from`'s own Ethernet NIC to
    /// `to`'s (iSCSI's TCP traffic), over the same kind of links and switch.
    pub fn send_message(
        &mut self,
        now: Ns,
        from: HostId,
        to: HostId,
        bytes: u64,
        token: u64,
    ) -> Result<(), SanError> {
        let _ = (now, from, to, bytes, token);
        todo!("san-core")
    }

    pub fn next_event_time(&self) -> Option<Ns> {
        todo!("san-core")
    }

    /// Deliver everything due at or before `now`, in time order.
    pub fn deliver_due(&mut self, now: Ns, on_event: impl FnMut(SanEvent)) -> u64 {
        let _ = (now, on_event);
        todo!("san-core")
    }

    pub fn counters(&self, now: Ns) -> SanCounters {
        let _ = now;
        todo!("san-core")
    }
}
