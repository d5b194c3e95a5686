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

/// The device power report of a run (SPEC §1.9); `None` for the DDR
/// ramdisk, which has no Moneta device.
pub fn power_of_run(
    config: &crate::config::Config,
    run: &crate::experiment::RunResult,
) -> Option<power::PowerReport> {
    if config.host.stack == crate::config::Stack::Ramdisk {
        return None;
    }
    let c = &run.device;
    let activity = power::DeviceActivity {
        elapsed_ns: run.elapsed_ns,
        dma_busy_ns_host_to_device: c.dma_busy_ns_host_to_device,
        dma_busy_ns_device_to_host: c.dma_busy_ns_device_to_host,
        ring_busy_ns: c.ring_busy_ns,
        scheduler_busy_ns: c.scheduler_busy_ns,
        buffer_busy_ns: c.buffer_busy_ns,
        transfer_buffers: config.device.transfer_buffers,
        controllers: c.controllers.clone(),
    };
    Some(power::power_report(
        &config.power,
        config.device.capacity_bytes,
        &activity,
        run.ops,
    ))
}
