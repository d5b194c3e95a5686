//! The discrete-event kernel: a clock, a time-ordered event queue and seeded
//! randomness (DESIGN.md "One model, two clocks"), and the one FNV-1a hash
//! of the workspace ([`hash`]).
//!
//! Components never read time or randomness from anywhere else. The kernel
//! hands them `now` and an [`Rng`]; the clock decides what "advancing to the
//! next event" means: a [`VirtualClock`] jumps (simulation), a wall clock
//! spins until the event is due (emulation, a later issue). Ties between
//! events at the same instant are broken by insertion order, so a run is a
//! pure function of its configuration and seed.

pub mod clock;
pub mod event_queue;
pub mod hash;
pub mod rng;

pub use clock::{Clock, VirtualClock};
pub use event_queue::EventQueue;
pub use rng::Rng;
