//! Banked, multi-channel DRAM timing (SPEC §7: the DRAM cache is "highly
//! banked, multi-channel"; the same DRAM is the SSD system's and the
//! all-DRAM system's main memory).
//!
//! The project's DRAM technology gives the access latency (`dram.technology`,
//! `config::TECHNOLOGIES`); each channel's data bus moves bytes at
//! `channel_bytes_per_s`. An access occupies its bank from its start until
//! its data has crossed the bus, and the bus for the data's time; both are
//! [`Calendar`]s, so a fill booked for when its flash data arrives does not
//! hold back accesses before it. Rows, refresh and command-bus limits are
//! left out (the report runs DRAMSim2).

use super::calendar::Calendar;
use super::config::NvmmConfig;
use crate::units::{transfer_ns, Ns};

#[derive(Clone, Debug)]
pub struct DramTiming {
    latency_ns_read: Ns,
    latency_ns_write: Ns,
    bytes_per_s: f64,
    channels: u64,
    banks_per_channel: u64,
    /// log2(channels) when both counts are powers of two.
    channel_shift: Option<u32>,
    banks: Vec<Calendar>,
    buses: Vec<Calendar>,
    latest_now_ns: Ns,
    line_bytes: u64,
    line_transfer_ns: Ns,
    /// A DRAM cache block (a flash page): fills and write-backs.
    block_bytes: u64,
    block_transfer_ns: Ns,
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
            channel_shift: (d.channels.is_power_of_two() && d.banks_per_channel.is_power_of_two())
                .then(|| d.channels.trailing_zeros()),
            banks: vec![Calendar::default(); banks],
            buses: vec![Calendar::default(); d.channels as usize],
            latest_now_ns: 0,
            line_bytes: d.line_bytes,
            line_transfer_ns: transfer_ns(d.line_bytes, d.channel_bytes_per_s),
            block_bytes: config.flash.page_bytes,
            block_transfer_ns: transfer_ns(config.flash.page_bytes, d.channel_bytes_per_s),
            bytes: 0,
        }
    }

    /// An unloaded 64 B read.
    pub fn idle_read_ns(&self, bytes: u64) -> Ns {
        self.latency_ns_read + transfer_ns(bytes, self.bytes_per_s)
    }

    /// Access `bytes` of the DRAM block `block` (consecutive blocks go to
    /// consecutive channels, then banks), the request made at `now_ns` for
    /// a start at or after `start_ns`; returns when the data has crossed
    /// the bus.
    #[inline]
    pub fn access(&mut self, now_ns: Ns, start_ns: Ns, block: u64, bytes: u64, write: bool) -> Ns {
        let (channel, bank_in_channel) = if let Some(shift) = self.channel_shift {
            // Shifts and masks: this runs several times per simulated access.
            (
                block & (self.channels - 1),
                (block >> shift) & (self.banks_per_channel - 1),
            )
        } else {
            (
                block % self.channels,
                (block / self.channels) % self.banks_per_channel,
            )
        };
        let channel = channel as usize;
        let bank = channel * self.banks_per_channel as usize + bank_in_channel as usize;
        let latency = if write {
            self.latency_ns_write
        } else {
            self.latency_ns_read
        };
        // The two sizes of every simulated access, computed once (no
        // floating point per access).
        let transfer = if bytes == self.line_bytes {
            self.line_transfer_ns
        } else if bytes == self.block_bytes {
            self.block_transfer_ns
        } else {
            transfer_ns(bytes, self.bytes_per_s)
        };
        self.latest_now_ns = self.latest_now_ns.max(now_ns);
        let now = self.latest_now_ns;
        let start = start_ns.max(now);
        let (bank, bus) = (&mut self.banks[bank], &mut self.buses[channel]);
        bank.prune(now);
        bus.prune(now);
        // The bank from `start`, the bus from `start + latency`: find a start
        // where both are free (at once when nothing is booked ahead).
        let mut bank_fit = bank.fit(start, latency + transfer);
        let mut bus_fit = bus.fit(bank_fit.start_ns + latency, transfer);
        let mut tries = 1;
        while bus_fit.start_ns != bank_fit.start_ns + latency {
            if tries == 8 {
                // Give up on gaps: after everything booked on both.
                let start = (bus_fit.start_ns - latency)
                    .max(bank.last_end())
                    .max(bus.last_end().saturating_sub(latency));
                bank_fit = bank.fit(start, latency + transfer);
                bus_fit = bus.fit(start + latency, transfer);
                debug_assert_eq!(bus_fit.start_ns, bank_fit.start_ns + latency);
                break;
            }
            tries += 1;
            bank_fit = bank.fit(bus_fit.start_ns - latency, latency + transfer);
            bus_fit = bus.fit(bank_fit.start_ns + latency, transfer);
        }
        bank.book_at(bank_fit, latency + transfer);
        bus.book_at(bus_fit, transfer);
        let start = bank_fit.start_ns;
        self.bytes += bytes;
        start + latency + transfer
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn banks_overlap_and_a_bank_serializes() {
        let c = NvmmConfig::preset("nvmm-mlc").unwrap();
        let mut d = DramTiming::new(&c);
        let one = d.access(0, 0, 0, 64, false);
        assert_eq!(one, d.idle_read_ns(64));
        let other_channel = d.access(0, 0, 1, 64, false);
        assert_eq!(other_channel, one);
        let same_bank = d.access(0, 0, 0, 64, false);
        assert_eq!(same_bank, 2 * one);
        // A fill booked for later does not hold back an access now.
        let later = d.access(0, 10_000, 2, 8192, true);
        assert!(later > 10_000);
        assert_eq!(d.access(0, 0, 2, 64, false), one);
    }
}
