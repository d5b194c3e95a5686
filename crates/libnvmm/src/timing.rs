//! Flash timing on the wall clock (SPEC §7 "flash subsystem"). The handler
//! asks a [`FlashTiming`] when a page read or program issued now would
//! complete, and resolves the fault (or finishes the sync) no earlier than
//! that, as the FPGA prototypes of the Moneta family inserted their
//! technology's latencies.
//!
//! PLACEHOLDER: [`FixedLatency`] is a constant per-operation latency (0 by
//! default: no added delay). The channel/die queue model of NVMM lives in
//! `moneta_model::nvmm` (branch nvmm-model); at merge its clock-agnostic
//! flash component implements [`FlashTiming`] and replaces this one, so the
//! mechanism exists once.

use std::time::{Duration, Instant};

/// When flash operations complete. `now_ns` and the results are nanoseconds
/// on the caller's clock (since the region was opened); `flash_page` is the
/// absolute flash page number of the log (SPEC §7's 34-bit mapping).
/// Stateful implementations queue operations per channel and die.
pub trait FlashTiming: Send {
    fn read_page(&mut self, now_ns: u64, flash_page: u64) -> u64;
    fn program_page(&mut self, now_ns: u64, flash_page: u64) -> u64;
}

/// PLACEHOLDER until the model's flash component is merged: every read
/// takes `read_ns`, every program `program_ns`, with unlimited parallelism.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedLatency {
    pub read_ns: u64,
    pub program_ns: u64,
}

impl FixedLatency {
    pub fn from_us(read_us: u64, program_us: u64) -> Self {
        FixedLatency {
            read_ns: read_us * 1000,
            program_ns: program_us * 1000,
        }
    }
}

impl FlashTiming for FixedLatency {
    fn read_page(&mut self, now_ns: u64, _flash_page: u64) -> u64 {
        now_ns + self.read_ns
    }
    fn program_page(&mut self, now_ns: u64, _flash_page: u64) -> u64 {
        now_ns + self.program_ns
    }
}

/// The wall clock the timing runs on: nanoseconds since `origin`.
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    origin: Instant,
}

/// Sleeping is left this long before the deadline; the rest is spun, since
/// a sleep overshoots by tens of microseconds.
const SPIN_NS: u64 = 80_000;

impl WallClock {
    pub fn new() -> Self {
        WallClock {
            origin: Instant::now(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Return no earlier than `deadline_ns`: sleep while far, spin when near.
    pub fn wait_until(&self, deadline_ns: u64) {
        loop {
            let now = self.now_ns();
            if now >= deadline_ns {
                return;
            }
            let left = deadline_ns - now;
            if left > SPIN_NS {
                std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_latency_adds_its_constant() {
        let mut t = FixedLatency::from_us(50, 1200);
        assert_eq!(t.read_page(1000, 7), 51_000);
        assert_eq!(t.program_page(0, 7), 1_200_000);
        let mut zero = FixedLatency::default();
        assert_eq!(zero.read_page(5, 0), 5);
    }

    #[test]
    fn wait_until_never_returns_early() {
        let clock = WallClock::new();
        let deadline = clock.now_ns() + 300_000;
        clock.wait_until(deadline);
        assert!(clock.now_ns() >= deadline);
    }
}
