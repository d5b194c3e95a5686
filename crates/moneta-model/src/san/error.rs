//! Why the SAN (system.rs) and its address map refuse a call.

use super::ids::{DeviceId, HostId};
use std::fmt;

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
