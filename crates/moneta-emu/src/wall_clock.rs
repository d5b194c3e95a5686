//! The wall clock (DESIGN "One model, two clocks"): the model's one `Clock`
//! trait (`moneta_model::kernel::Clock`, which the simulator's virtual clock
//! implements too), but `now` is real elapsed time and
//! `advance_to` waits for real time to get there (a bounded busy-wait: the
//! emulator's device thread never sleeps through an event that is due).
//!
//! It reads CLOCK_MONOTONIC, which every process and core of the machine
//! shares, so a client's submit stamp ([`monotonic_ns`]) converts into the
//! device's model time ([`WallClock::model_time`]).

use moneta_model::kernel::Clock;
use moneta_model::units::Ns;

// The clock a channel's stamps are read on (part of the channel ABI).
use moneta_abi::sys::monotonic_ns;

/// Nanoseconds of real time since the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    /// CLOCK_MONOTONIC at time 0.
    start_ns: u64,
}

impl WallClock {
    pub fn new() -> Self {
        WallClock {
            start_ns: monotonic_ns(),
        }
    }

    /// This clock's time of a CLOCK_MONOTONIC reading (0 for readings before
    /// the clock started).
    pub fn model_time(&self, monotonic: u64) -> Ns {
        monotonic.saturating_sub(self.start_ns)
    }

    /// The CLOCK_MONOTONIC reading of this clock's time `t`.
    pub fn monotonic_of(&self, t: Ns) -> u64 {
        self.start_ns.saturating_add(t)
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for WallClock {
    #[inline]
    fn now(&self) -> Ns {
        self.model_time(monotonic_ns())
    }

    /// Spin until real time reaches `t`. Callers keep the wait short: the
    /// device thread only calls this for events at most a poll period away.
    fn advance_to(&self, t: Ns) {
        while self.now() < t {
            std::hint::spin_loop();
        }
    }

    fn model_time(&self, monotonic: u64) -> Ns {
        WallClock::model_time(self, monotonic)
    }

    fn monotonic_of(&self, t: Ns) -> u64 {
        WallClock::monotonic_of(self, t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_waits_for_real_time() {
        let c = WallClock::new();
        let t = c.now() + 200_000;
        c.advance_to(t);
        assert!(c.now() >= t);
        let before = std::time::Instant::now();
        c.advance_to(0); // the past: returns at once
        assert!(before.elapsed().as_millis() < 100);
    }

    #[test]
    fn monotonic_readings_convert_to_model_time() {
        let c = WallClock::new();
        let stamp = monotonic_ns();
        let t = c.model_time(stamp);
        assert!(t <= c.now());
        assert_eq!(c.model_time(0), 0, "before the start: time 0");
    }
}
