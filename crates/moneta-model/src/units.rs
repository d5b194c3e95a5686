//! Units and identifiers shared by every component.
//!
//! Time is an integer number of nanoseconds (`Ns`) on whatever clock drives
//! the model; names of variables say their unit (`latency_ns_read`,
//! `bandwidth_bytes_per_s`). Addresses, tags and channels are newtypes so they
//! cannot be mixed up (STYLE.md rule 4).

use serde::{Deserialize, Serialize};

/// A point in time or a duration, in nanoseconds.
pub type Ns = u64;

/// One 512-byte sector, the addressing unit of the command interface (SPEC §1.2).
pub const SECTOR_BYTES: u64 = 512;

/// A byte address in the device's internal (storage) address space.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct DeviceAddr(pub u64);

/// One of the device's physical tags (64 in flight device-wide, SPEC §1.4).
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct PhysTag(pub u8);

/// A channel: a virtual interface to the device (Moneta-D, SPEC §3.1).
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ChannelId(pub u16);

/// Direction of a request.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Read,
    Write,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// Time to move `bytes` at `bytes_per_s`, rounded up to the next nanosecond.
#[inline]
pub fn transfer_ns(bytes: u64, bytes_per_s: f64) -> Ns {
    if bytes == 0 {
        return 0;
    }
    (bytes as f64 * 1e9 / bytes_per_s).ceil() as Ns
}

/// Nanoseconds from microseconds given as in the papers' tables.
#[inline]
pub fn us(microseconds: f64) -> Ns {
    (microseconds * 1000.0).round() as Ns
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_rounds_up() {
        assert_eq!(transfer_ns(0, 2e9), 0);
        assert_eq!(transfer_ns(1, 2e9), 1);
        assert_eq!(transfer_ns(4096, 4e9), 1024);
        assert_eq!(us(1.98), 1980);
    }
}
