//! The ring network between the scheduler and the memory controllers
//! (SPEC §1.5, Appendix A.4).
//!
//! A 128-bit token ring: one router transmits at a time (the token holder),
//! releasing the token at the end of each packet. Modelled as one shared
//! server at the ring's bandwidth; each packet also pays the token's trip to
//! the next router (one hop), and data reaches its destination after half a
//! round trip on average. Left out: the YPNC back-pressure flag (receivers
//! here always have room: the scheduler's scoreboard only sends writes to a
//! controller with queue space, and reads land in an allocated buffer).

use crate::config::RingConfig;
use crate::units::{transfer_ns, Ns};

#[derive(Debug, Clone)]
pub struct Ring {
    bandwidth_bytes_per_s: f64,
    hop_ns: Ns,
    half_round_trip_ns: Ns,
    packet_bytes: u64,
    busy_until_ns: Ns,
    busy_ns_total: u64,
}

/// When a transfer's data starts and finishes arriving at its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingTransfer {
    pub first_byte_ns: Ns,
    pub last_byte_ns: Ns,
}

impl Ring {
    /// `routers` is the number of stations: the scheduler plus the controllers.
    pub fn new(ring: &RingConfig, routers: u32) -> Self {
        Self {
            bandwidth_bytes_per_s: ring.bandwidth_bytes_per_s,
            hop_ns: ring.round_trip_ns / routers.max(1) as u64,
            half_round_trip_ns: ring.round_trip_ns / 2,
            packet_bytes: ring.packet_bytes,
            busy_until_ns: 0,
            busy_ns_total: 0,
        }
    }

    /// Ring time `bytes` occupy: a token hop per packet and the data.
    fn occupancy_ns(&self, bytes: u64) -> Ns {
        let packets = bytes.div_ceil(self.packet_bytes).max(1);
        packets * self.hop_ns + transfer_ns(bytes, self.bandwidth_bytes_per_s)
    }

    /// From sending `bytes` on an idle ring to their last byte arriving;
    /// anything beyond it was waiting for the token (where time goes).
    pub fn unloaded_ns(&self, bytes: u64) -> Ns {
        self.occupancy_ns(bytes) + self.half_round_trip_ns
    }

    /// Send `bytes` as soon as possible at or after `now_ns` (time order).
    pub fn transfer(&mut self, now_ns: Ns, bytes: u64) -> RingTransfer {
        let start = now_ns.max(self.busy_until_ns);
        let occupancy = self.occupancy_ns(bytes);
        self.busy_until_ns = start + occupancy;
        self.busy_ns_total += occupancy;
        RingTransfer {
            first_byte_ns: start + self.hop_ns + self.half_round_trip_ns,
            last_byte_ns: self.busy_until_ns + self.half_round_trip_ns,
        }
    }

    /// A single-flit control message (a read command): latency only, it
    /// travels between data packets.
    pub fn message_ns(&self) -> Ns {
        self.hop_ns + self.half_round_trip_ns
    }

    pub fn busy_ns(&self) -> u64 {
        self.busy_ns_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn ring_moves_4_gb_per_s_and_serializes_senders() {
        let c = Config::preset("moneta").unwrap();
        let mut r = Ring::new(&c.ring, 9);
        let a = r.transfer(0, 8192);
        let b = r.transfer(0, 8192);
        assert_eq!(a.last_byte_ns - a.first_byte_ns, 2048);
        assert_eq!(b.last_byte_ns - a.last_byte_ns, 2048 + r.hop_ns);
    }
}
