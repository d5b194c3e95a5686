//! Banked, multi-channel DRAM timing (SPEC §7: the DRAM cache is "highly
//! banked, multi-channel"; the same DRAM is the SSD system's and the
//! all-DRAM system's main memory).
//!
//! The project's DRAM technology gives the access latency (`dram.technology`,
//! `config::TECHNOLOGIES`); each channel's data bus moves bytes at
//! `channel_bytes_per_s`. An access occupies its bank from its start until
//! its data has crossed the bus, and the bus for the data's time. Rows,
//! refresh and command-bus limits are left out (the report runs DRAMSim2).

use super::config::NvmmConfig;
use crate::units::{transfer_ns, Ns};

#[derive(Clone, Debug)]
pub struct DramTiming {
    latency_ns_read: Ns,
    latency_ns_write: Ns,
    bytes_per_s: f64,
    channels: u64,
    banks_per_channel: u64,
    bank_free_ns: Vec<Ns>,
    bus_free_ns: Vec<Ns>,
    /// Bytes moved, for reports.
    pub bytes: u64,
}

impl DramTiming {
    pub fn new(config: &NvmmConfig) -> Self {
        let d = &config.dram;
        let banks = (d.channels * d.banks_per_channel) as usize;
        DramTiming {
            latency_ns_read: d.latency_ns_read,
            latency_ns_write: d.latency_ns_write,
            bytes_per_s: d.channel_bytes_per_s,
            channels: d.channels.into(),
            banks_per_channel: d.banks_per_channel.into(),
            bank_free_ns: vec![0; banks],
            bus_free_ns: vec![0; d.channels as usize],
            bytes: 0,
        }
    }

    /// An unloaded 64 B read.
    pub fn idle_read_ns(&self, bytes: u64) -> Ns {
        self.latency_ns_read + transfer_ns(bytes, self.bytes_per_s)
    }

    /// Access `bytes` of the DRAM block `block` (consecutive blocks go to
    /// consecutive channels, then banks) starting at `now_ns`; returns when
    /// the data has crossed the bus.
    #[inline]
    pub fn access(&mut self, now_ns: Ns, block: u64, bytes: u64, write: bool) -> Ns {
        let channel = (block % self.channels) as usize;
        let bank = channel * self.banks_per_channel as usize
            + ((block / self.channels) % self.banks_per_channel) as usize;
        let latency = if write {
            self.latency_ns_write
        } else {
            self.latency_ns_read
        };
        let start = now_ns.max(self.bank_free_ns[bank]);
        let data_start = (start + latency).max(self.bus_free_ns[channel]);
        let done = data_start + transfer_ns(bytes, self.bytes_per_s);
        self.bus_free_ns[channel] = done;
        self.bank_free_ns[bank] = done;
        self.bytes += bytes;
        done
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banks_overlap_and_a_bank_serializes() {
        let c = NvmmConfig::preset("nvmm-mlc").unwrap();
        let mut d = DramTiming::new(&c);
        let one = d.access(0, 0, 64, false);
        assert_eq!(one, d.idle_read_ns(64));
        let other_channel = d.access(0, 1, 64, false);
        assert_eq!(other_channel, one);
        let same_bank = d.access(0, 0, 64, false);
        assert_eq!(same_bank, 2 * one);
    }
}
