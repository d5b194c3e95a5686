//! The wall clock (DESIGN "One model, two clocks"): the same `Clock` trait the
//! simulator's virtual clock implements, but `now` is real elapsed time and
//! `advance_to` waits for real time to get there (a bounded busy-wait: the
//! emulator's device thread never sleeps through an event that is due).

use moneta_model::kernel::Clock;
use moneta_model::units::Ns;
use std::time::Instant;

/// Nanoseconds of real time since the clock was made.
#[derive(Debug, Clone, Copy)]
pub struct WallClock {
    start: Instant,
}

impl WallClock {
    pub fn new() -> Self {
        WallClock {
            start: Instant::now(),
        }
    }

    /// The instant this clock calls time 0.
    pub fn start(&self) -> Instant {
        self.start
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
        self.start.elapsed().as_nanos() as Ns
    }

    /// Spin until real time reaches `t`. Callers keep the wait short: the
    /// device thread only calls this for events at most a poll period away.
    fn advance_to(&mut self, t: Ns) {
        while self.now() < t {
            std::hint::spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advance_waits_for_real_time() {
        let mut c = WallClock::new();
        let t = c.now() + 200_000;
        c.advance_to(t);
        assert!(c.now() >= t);
        let before = Instant::now();
        c.advance_to(0); // the past: returns at once
        assert!(before.elapsed().as_millis() < 100);
    }
}
