//! Clocks: the only source of "now" for the model.

use crate::units::Ns;

/// A clock the kernel advances to each event's time before dispatching it.
pub trait Clock {
    /// Current time in nanoseconds since the start of the run.
    fn now(&self) -> Ns;
    /// Advance to `t` (never backwards). A virtual clock jumps; a wall clock
    /// waits until real time reaches `t`.
    fn advance_to(&mut self, t: Ns);
}

/// Virtual time: jumps straight to the next event (simulation).
#[derive(Debug, Default, Clone)]
pub struct VirtualClock {
    now_ns: Ns,
}

impl VirtualClock {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Clock for VirtualClock {
    #[inline]
    fn now(&self) -> Ns {
        self.now_ns
    }

    #[inline]
    fn advance_to(&mut self, t: Ns) {
        debug_assert!(
            t >= self.now_ns,
            "time went backwards: {t} < {}",
            self.now_ns
        );
        self.now_ns = t;
    }
}
