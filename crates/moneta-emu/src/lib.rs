//! The emulator (DESIGN "One model, two clocks", SPEC §1.2–1.4 and §3): the
//! same device components as the simulator, driven by the wall clock and
//! holding real bytes, reached through Moneta-D channels in shared memory.

pub mod protection;
