//! The Moneta memory controller (SPEC §1.6, Appendix A.5).
//!
//! One controller manages an independent bank and accesses one bank at a
//! time (no inter-bank parallelism: the paper names it as a possible
//! improvement). A whole row is opened into the row buffer, paying the
//! technology's array latency once per row (so a 4 KB access inside an 8 KB
//! row pays it once), and data moves between row buffer and controller at
//! the DDR rate (250 MHz DDR × 8 B = 4 GB/s). Rows are closed after every
//! access: a write is complete only when it is in the non-volatile cells, so
//! writes pay the array write latency after the data transfer (no write
//! coalescing). Writes stream from the ring into the DDR transfer
//! (cut-through through the 8 KB in-queue); the scheduler's scoreboard only
//! sends a write when the in-queue has room. Start-gap (SPEC §1.7) remaps
//! lines and, every G writes, costs one extra line read and write.

use super::memory::{ControllerActivity, MemoryTiming, WriteTiming};
use super::start_gap::StartGap;
use crate::config::{MemoryConfig, StartGapConfig};
use crate::units::{transfer_ns, Divisor, Ns};
use std::collections::VecDeque;

pub struct MonetaController {
    latency_ns_read: Ns,
    latency_ns_write: Ns,
    row_bytes: u64,
    /// `row_bytes` and `line_bytes` as divisors (address arithmetic per line).
    row: Divisor,
    line: Divisor,
    ddr_bytes_per_s: f64,
    controller_ns: Ns,
    queue_bytes: u64,
    bank_free_ns: Ns,
    /// Writes whose data still occupies the in-queue: (free at, bytes), FIFO.
    in_queue: VecDeque<(Ns, u64)>,
    start_gap: Option<StartGap>,
    line_bytes: u64,
    activity: ControllerActivity,
}

impl MonetaController {
    pub fn new(
        memory: &MemoryConfig,
        start_gap: &StartGapConfig,
        controller_bytes: u64,
        seed: u64,
    ) -> Self {
        let leveling = start_gap.enabled.then(|| {
            let lines = (controller_bytes / start_gap.line_bytes).next_power_of_two();
            StartGap::new(
                lines,
                start_gap.gap_interval_writes,
                start_gap.randomize,
                seed,
                start_gap.track_wear,
            )
        });
        Self {
            latency_ns_read: memory.latency_ns_read,
            latency_ns_write: memory.latency_ns_write,
            row_bytes: memory.row_bytes,
            row: Divisor::new(memory.row_bytes),
            // (Only used with start-gap, whose line size is validated.)
            line: Divisor::new(start_gap.line_bytes.max(1)),
            ddr_bytes_per_s: memory.ddr_bytes_per_s,
            controller_ns: memory.controller_ns,
            queue_bytes: memory.queue_bytes,
            bank_free_ns: 0,
            in_queue: VecDeque::with_capacity((memory.queue_bytes / 512) as usize + 1),
            start_gap: leveling,
            line_bytes: start_gap.line_bytes,
            activity: ControllerActivity::default(),
        }
    }

    /// Rows opened by an access, after start-gap's line remapping.
    fn rows_touched(&self, local_addr: u64, bytes: u64) -> u64 {
        let Some(sg) = &self.start_gap else {
            return self.row.quotient_of(local_addr + bytes - 1) - self.row.quotient_of(local_addr)
                + 1;
        };
        let logical_lines = Divisor::new(sg.logical_lines());
        let mut rows = 0;
        let mut last_row = u64::MAX;
        let mut at = local_addr;
        let end = local_addr + bytes;
        while at < end {
            let line = self.line.quotient_of(at);
            let in_line_end = ((line + 1) * self.line_bytes).min(end);
            let physical = sg.translate(logical_lines.remainder_of(line)) * self.line_bytes
                + self.line.remainder_of(at);
            let physical_end = physical + (in_line_end - at) - 1;
            for row in self.row.quotient_of(physical)..=self.row.quotient_of(physical_end) {
                if row != last_row {
                    rows += 1;
                    last_row = row;
                }
            }
            at = in_line_end;
        }
        rows
    }

    /// Wear leveling: count the write per line and charge gap moves.
    fn level_wear(&mut self, local_addr: u64, bytes: u64) -> Ns {
        let Some(sg) = self.start_gap.as_mut() else {
            return 0;
        };
        let mut extra_ns = 0;
        let first = local_addr / self.line_bytes;
        let last = (local_addr + bytes - 1) / self.line_bytes;
        for line in first..=last {
            if sg.record_write(line % sg.logical_lines()).is_some() {
                // Copy the line below the gap into the gap: read it, write it.
                extra_ns += self.latency_ns_read
                    + self.latency_ns_write
                    + 2 * transfer_ns(self.line_bytes, self.ddr_bytes_per_s);
                self.activity.wear_level_writes += 1;
                self.activity.array_bytes_read += self.line_bytes;
                self.activity.array_bytes_written += self.line_bytes;
            }
        }
        extra_ns
    }

    pub fn start_gap(&self) -> Option<&StartGap> {
        self.start_gap.as_ref()
    }
}

impl MemoryTiming for MonetaController {
    fn read(&mut self, now_ns: Ns, local_addr: u64, bytes: u64) -> Ns {
        let start = (now_ns + self.controller_ns).max(self.bank_free_ns);
        let rows = self.rows_touched(local_addr, bytes);
        let occupancy = rows * self.latency_ns_read + transfer_ns(bytes, self.ddr_bytes_per_s);
        self.bank_free_ns = start + occupancy;
        self.activity.busy_ns += occupancy;
        self.activity.reads += 1;
        self.activity.array_bytes_read += rows * self.row_bytes;
        self.activity.row_buffer_bytes_read += bytes;
        self.bank_free_ns
    }

    fn read_wait_ns(&self, now_ns: Ns) -> Ns {
        self.bank_free_ns
            .saturating_sub(now_ns + self.controller_ns)
    }

    fn write_accept_ns(&self, now_ns: Ns, bytes: u64) -> Ns {
        let mut queued: u64 = self
            .in_queue
            .iter()
            .filter(|(free, _)| *free > now_ns)
            .map(|(_, b)| b)
            .sum();
        if queued + bytes <= self.queue_bytes {
            return now_ns;
        }
        for &(free, b) in self.in_queue.iter().filter(|(free, _)| *free > now_ns) {
            queued -= b;
            if queued + bytes <= self.queue_bytes {
                return free;
            }
        }
        now_ns
    }

    fn write(
        &mut self,
        first_byte_ns: Ns,
        last_byte_ns: Ns,
        local_addr: u64,
        bytes: u64,
    ) -> WriteTiming {
        while self
            .in_queue
            .front()
            .is_some_and(|(free, _)| *free <= first_byte_ns)
        {
            self.in_queue.pop_front();
        }
        let start = (first_byte_ns + self.controller_ns).max(self.bank_free_ns);
        let ddr_end = (start + transfer_ns(bytes, self.ddr_bytes_per_s)).max(last_byte_ns);
        let rows = self.rows_touched(local_addr, bytes);
        let durable_ns = ddr_end + rows * self.latency_ns_write;
        let leveling_ns = self.level_wear(local_addr, bytes);
        self.bank_free_ns = durable_ns + leveling_ns;
        self.activity.busy_ns += self.bank_free_ns - start;
        self.activity.writes += 1;
        self.activity.array_bytes_written += bytes;
        self.activity.row_buffer_bytes_written += bytes;
        self.in_queue.push_back((ddr_end, bytes));
        WriteTiming {
            queue_free_ns: ddr_end,
            durable_ns,
            ack_ns: durable_ns,
        }
    }

    fn activity(&self) -> ControllerActivity {
        self.activity
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn controller(start_gap: bool) -> MonetaController {
        let mut c = Config::preset("moneta").unwrap();
        c.start_gap.enabled = start_gap;
        MonetaController::new(&c.memory, &c.start_gap, 8 << 30, 1)
    }

    #[test]
    fn a_4kb_read_pays_array_latency_once_plus_ddr_transfer() {
        let mut m = controller(false);
        // 20 ns controller + 48 ns row open + 4096 B at 4 GB/s.
        assert_eq!(m.read(0, 0, 4096), 20 + 48 + 1024);
        // An 8 KB access straddling two rows opens both.
        let t = m.read(10_000, 4096, 8192);
        assert_eq!(t, 10_000 + 20 + 2 * 48 + 2048);
    }

    #[test]
    fn one_bank_at_a_time() {
        let mut m = controller(false);
        let a = m.read(0, 0, 8192);
        let b = m.read(0, 1 << 20, 8192);
        assert_eq!(b, a + 48 + 2048);
    }

    #[test]
    fn write_is_durable_after_transfer_and_array_write() {
        let mut m = controller(false);
        let w = m.write(0, 1024, 0, 4096);
        assert_eq!(w.durable_ns, 20 + 1024 + 150);
        assert_eq!(w.ack_ns, w.durable_ns);
        // The in-queue holds 8 KB: a second 8 KB write waits for the first to drain.
        let w2 = m.write(0, 0, 8192, 4096);
        assert!(m.write_accept_ns(0, 8192) >= w.queue_free_ns.min(w2.queue_free_ns));
    }
}
