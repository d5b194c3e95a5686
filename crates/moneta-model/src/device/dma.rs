//! The DMA engine on the full-duplex PCIe link (SPEC §1.1).
//!
//! Each direction is its own server, so reads (device → host) and writes
//! (host → device) move at the same time. A transfer is split into TLPs of at
//! most `max_payload_bytes`, each paying `tlp_overhead_bytes` of framing, so
//! the payload rate is `bandwidth × payload / (payload + overhead)`. Latency
//! (the host memory answering read requests, the posted writes landing) is
//! pipelined: it delays a transfer's first byte but does not occupy the link,
//! so back-to-back transfers hide it. The engine tracks at most
//! `max_outstanding_host_to_device` transfers from the host (8, SPEC §1.1);
//! a further one starts when the oldest has finished. Transfers to the host
//! are unlimited. Left out: flow-control credits and DLLP traffic beyond the
//! per-TLP overhead.

use crate::config::LinkConfig;
use crate::units::{transfer_ns, Ns};

/// One direction of the link.
#[derive(Debug, Clone)]
pub struct LinkDirection {
    latency_ns: Ns,
    bandwidth_bytes_per_s: f64,
    max_payload_bytes: u64,
    tlp_overhead_bytes: u64,
    busy_until_ns: Ns,
    busy_ns_total: u64,
    /// End times of the transfers in flight, oldest first (bounded).
    in_flight_end_ns: std::collections::VecDeque<Ns>,
    max_outstanding: usize,
}

impl LinkDirection {
    fn new(link: &LinkConfig, latency_ns: Ns, max_outstanding: usize) -> Self {
        Self {
            latency_ns,
            bandwidth_bytes_per_s: link.bandwidth_bytes_per_s,
            max_payload_bytes: link.max_payload_bytes,
            tlp_overhead_bytes: link.tlp_overhead_bytes,
            busy_until_ns: 0,
            busy_ns_total: 0,
            in_flight_end_ns: std::collections::VecDeque::with_capacity(max_outstanding.min(64)),
            max_outstanding,
        }
    }

    /// Bytes on the wire for `bytes` of payload.
    pub fn wire_bytes(&self, bytes: u64) -> u64 {
        let packets = bytes.div_ceil(self.max_payload_bytes);
        bytes + packets * self.tlp_overhead_bytes
    }

    /// Payload bandwidth of this direction when streaming.
    pub fn payload_bytes_per_s(&self) -> f64 {
        let p = self.max_payload_bytes as f64;
        self.bandwidth_bytes_per_s * p / (p + self.tlp_overhead_bytes as f64)
    }

    fn wire_ns(&self, bytes: u64) -> Ns {
        transfer_ns(self.wire_bytes(bytes), self.bandwidth_bytes_per_s)
    }

    /// Time of a transfer of `bytes` on an idle link: latency and wire time.
    /// Anything beyond it was waiting for the link (where time goes).
    pub fn unloaded_ns(&self, bytes: u64) -> Ns {
        self.latency_ns + self.wire_ns(bytes)
    }

    /// Move `bytes` starting no earlier than `now_ns`; returns when the last
    /// byte has arrived. Must be called in time order.
    pub fn transfer(&mut self, now_ns: Ns, bytes: u64) -> Ns {
        while self
            .in_flight_end_ns
            .front()
            .is_some_and(|&end| end <= now_ns)
        {
            self.in_flight_end_ns.pop_front();
        }
        // With every tracking slot busy, issue when the oldest transfer ends.
        let issue_ns = if self.in_flight_end_ns.len() >= self.max_outstanding {
            self.in_flight_end_ns
                .pop_front()
                .expect("non-empty")
                .max(now_ns)
        } else {
            now_ns
        };
        let start = (issue_ns + self.latency_ns).max(self.busy_until_ns);
        let wire_ns = self.wire_ns(bytes);
        self.busy_until_ns = start + wire_ns;
        self.busy_ns_total += wire_ns;
        if self.max_outstanding != usize::MAX {
            self.in_flight_end_ns.push_back(self.busy_until_ns);
        }
        self.busy_until_ns
    }

    pub fn busy_ns(&self) -> u64 {
        self.busy_ns_total
    }
}

/// The full-duplex link: host → device carries write data, device → host read data.
#[derive(Debug, Clone)]
pub struct Dma {
    pub host_to_device: LinkDirection,
    pub device_to_host: LinkDirection,
}

impl Dma {
    pub fn new(link: &LinkConfig) -> Self {
        Self {
            host_to_device: LinkDirection::new(
                link,
                link.latency_ns_host_to_device,
                link.max_outstanding_host_to_device as usize,
            ),
            device_to_host: LinkDirection::new(link, link.latency_ns_device_to_host, usize::MAX),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn at_most_eight_transfers_from_the_host_at_once() {
        let mut c = Config::preset("moneta").unwrap();
        c.link.max_outstanding_host_to_device = 2;
        let mut d = Dma::new(&c.link);
        let first = d.host_to_device.transfer(0, 512);
        let _second = d.host_to_device.transfer(0, 512);
        // The third waits for the first to finish, then pays the latency again.
        let third = d.host_to_device.transfer(0, 512);
        assert_eq!(
            third,
            first
                + c.link.latency_ns_host_to_device
                + transfer_ns(d.host_to_device.wire_bytes(512), 2e9)
        );
    }

    #[test]
    fn payload_rate_reflects_tlp_overhead() {
        let c = Config::preset("moneta").unwrap();
        let d = Dma::new(&c.link);
        // 2 GB/s × 128 / 148.
        let rate = d.device_to_host.payload_bytes_per_s();
        assert!((rate - 1.7297e9).abs() < 1e6, "{rate}");
    }

    #[test]
    fn table_3_1_dma_times_for_4kb() {
        let c = Config::preset("moneta").unwrap();
        let mut d = Dma::new(&c.link);
        // Table 3.1: 0.93 µs/KB host→device, 0.65 µs/KB device→host.
        let h2d = d.host_to_device.transfer(0, 4096);
        let d2h = d.device_to_host.transfer(0, 4096);
        assert!((h2d as f64 - 3720.0).abs() < 40.0, "{h2d}");
        assert!((d2h as f64 - 2600.0).abs() < 40.0, "{d2h}");
    }

    #[test]
    fn directions_are_independent_and_latency_is_pipelined() {
        let c = Config::preset("moneta").unwrap();
        let mut d = Dma::new(&c.link);
        let a = d.host_to_device.transfer(0, 8192);
        let b = d.host_to_device.transfer(0, 8192);
        // The second transfer's latency hides behind the first one's data.
        let wire = transfer_ns(d.host_to_device.wire_bytes(8192), 2e9);
        assert_eq!(b, a + wire);
        let r = d.device_to_host.transfer(0, 8192);
        assert!(r < b);
    }
}
