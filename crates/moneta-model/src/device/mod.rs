//! The Moneta array: everything between the PCIe link and the memory cells
//! (SPEC §1, Appendix A). Each mechanism is its own component; `pipeline`
//! wires them together in the order of SPEC §1.4:
//! registers → retag → protection → request queues → transfer buffers &
//! scheduler → DMA / ring → memory controllers (start-gap) → medium.
//! `driver` delivers the device's events on whatever clock drives it.

pub mod buffers;
pub mod command;
pub mod dma;
pub mod driver;
pub mod memory;
pub mod moneta_controller;
pub mod network;
pub mod onyx_pcm;
pub mod packet;
pub mod pipeline;
pub mod power;
pub mod protection;
pub mod queues;
pub mod retag;
pub mod ring;
pub mod start_gap;
pub mod tags;
