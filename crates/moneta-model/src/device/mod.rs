//! The Moneta array: everything between the PCIe link and the memory cells
//! (SPEC §1, Appendix A). Each mechanism is its own component; `pipeline`
//! wires them together in the order of SPEC §1.4:
//! registers → retag → protection → request queues → transfer buffers &
//! scheduler → DMA / ring → memory controllers (start-gap) → medium.

pub mod buffers;
pub mod command;
pub mod dma;
pub mod memory;
pub mod moneta_controller;
pub mod onyx_pcm;
pub mod pipeline;
pub mod power;
pub mod queues;
pub mod ring;
pub mod start_gap;
pub mod tags;

/// Average power (W) and energy per operation (nJ) of a run.
/// Placeholder until the power model lands: NaN.
pub fn power_of_run(_config: &crate::config::Config, _run: &crate::experiment::RunResult) -> (f64, f64) {
    (f64::NAN, f64::NAN)
}
