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

/// Average device power (W) and energy per operation (nJ) of a run
/// (SPEC §1.9). The DDR ramdisk has no Moneta device: NaN.
pub fn power_of_run(
    config: &crate::config::Config,
    run: &crate::experiment::RunResult,
) -> (f64, f64) {
    if config.host.stack == crate::config::Stack::Ramdisk {
        return (f64::NAN, f64::NAN);
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
    let report = power::power_report(
        &config.power,
        config.device.capacity_bytes,
        &activity,
        run.ops,
    );
    (report.total_w, report.energy_nj_per_op)
}
