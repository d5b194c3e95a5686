//! Clocks: the only source of "now" for the model, and the one `Clock`
//! trait of the workspace (DESIGN "One model, two clocks"). The simulator's
//! kernel, the emulator's device thread (`moneta_emu::wall_clock`) and
//! libnvmm's flash timing (`nvmm::timing`) all run on it; only what they
//! pass in differs: this [`VirtualClock`], or a wall clock outside the model.

use crate::units::Ns;
use std::sync::atomic::{AtomicU64, Ordering};

/// A clock the kernel advances to each event's time before dispatching it.
///
/// Methods take `&self` so that one clock can be shared by threads (libnvmm's
/// region and its fault handler read one): a virtual clock's time is an
/// atomic, a wall clock's is the machine's.
pub trait Clock {
    /// Current time in nanoseconds since the start of the run.
    fn now(&self) -> Ns;
    /// Return no earlier than `t` on this clock. A virtual clock jumps (it
    /// never goes backwards); a wall clock waits until real time reaches
    /// `t`. A `t` in the past returns at once.
    fn advance_to(&self, t: Ns);
    /// This clock's time of a CLOCK_MONOTONIC reading another process
    /// stamped (0 for readings before the clock started). A virtual clock's
    /// stamps are its own time.
    fn model_time(&self, monotonic: u64) -> Ns {
        monotonic
    }
    /// The CLOCK_MONOTONIC reading of this clock's time `t` (a virtual
    /// clock: `t` itself).
    fn monotonic_of(&self, t: Ns) -> u64 {
        t
    }
}

/// Virtual time: jumps straight to the next event (simulation), or to the
/// deadline a waiter gives (libnvmm's model face and twin test).
#[derive(Debug, Default)]
pub struct VirtualClock {
    now_ns: AtomicU64,
}

impl VirtualClock {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Clone for VirtualClock {
    fn clone(&self) -> Self {
        VirtualClock {
            now_ns: AtomicU64::new(self.now()),
        }
    }
}

impl Clock for VirtualClock {
    #[inline]
    fn now(&self) -> Ns {
        self.now_ns.load(Ordering::Acquire)
    }

    /// Callers that share one clock between threads serialize their
    /// advances (libnvmm's waits run under the region's state lock): a
    /// plain load and store, no read-modify-write, since the simulator
    /// advances it at every event (a `fetch_max` there cost 8% of `moneta
    /// sim speed`).
    #[inline]
    fn advance_to(&self, t: Ns) {
        if t > self.now_ns.load(Ordering::Relaxed) {
            self.now_ns.store(t, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_time_jumps_forward_and_never_back() {
        let c = VirtualClock::new();
        assert_eq!(c.now(), 0);
        c.advance_to(500);
        assert_eq!(c.now(), 500);
        c.advance_to(100);
        assert_eq!(c.now(), 500, "a deadline in the past returns at once");
        assert_eq!(c.clone().now(), 500);
        assert_eq!((c.model_time(42), c.monotonic_of(42)), (42, 42));
    }

    #[test]
    fn serialized_waiters_on_one_virtual_clock_leave_it_at_the_latest_deadline() {
        let c = std::sync::Arc::new(VirtualClock::new());
        let lock = std::sync::Arc::new(std::sync::Mutex::new(()));
        let threads: Vec<_> = (1..=8u64)
            .map(|k| {
                let (c, lock) = (c.clone(), lock.clone());
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        let _held = lock.lock().unwrap();
                        c.advance_to(k * 1000 + i);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(c.now(), 8 * 1000 + 999);
    }
}
