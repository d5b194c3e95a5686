//! Power and energy of the array over a run (SPEC §1.9, MICRO'10 §V.D and
//! Table I / dissertation §3.4.4 and Table 3.2).
//!
//! Inputs are the busy times the components accumulated during a run
//! ([`DeviceActivity`]); the output is each component's average power and
//! energy ([`PowerReport`]).
//!
//! - **Logic** (scheduler & DMA, ring, buffers, memory controllers, PCIe):
//!   `idle + (peak − idle) × utilization`, utilization being the component's
//!   busy fraction of the run.
//!   - Scheduler & DMA: fraction of time the scheduler had a request in flight.
//!   - Scheduler buffers: Table I's entry is taken per 8 KB transfer buffer
//!     (a Cacti SRAM of that size); utilization of the set is the summed
//!     allocation time over `transfer_buffers × elapsed`.
//!   - Memory controller buffers: the same entry per 8 KB queue, two queues
//!     (in and out) per controller (SPEC §1.6), busy while the controller is.
//!   - PCIe: the busier of the two directions. A link moving data one way
//!     carries ACK and flow-control packets the other way, so neither side can
//!     drop to a low-power state; Table I gives one figure for the link.
//! - **Memory array dynamic**: energy per bit from the controllers' counters:
//!   array write/read pJ/bit × bits written to/read from the array, plus row
//!   buffer write/read pJ/bit × bits moved through row buffers. Whether a
//!   small access writes a whole row (no selective writes, SPEC §1.9) is the
//!   controller's business: it reports the array bytes it really wrote.
//!   Wear-leveling copies are assumed to be included in those byte counts.
//! - **Memory background**: every die pays the idle background power (clock
//!   off but "on") for the whole run; dies = capacity ÷ `die_bytes`. While a
//!   controller is busy its memory is clocked: active background is
//!   `background_w_per_bit_active` × the 72 bits of the controller's DDR
//!   interface (64 data + 8 ECC, SPEC §1.6) × its busy fraction.
//!
//!   Why per interface bit and not per row-buffer bit: the paper says active
//!   background goes to "clocking the PCM's internal row buffers and other
//!   peripheral circuitry", which read per bit of an 8 KB row would be
//!   20 µW × 65,536 = 1.31 W for every busy controller. The published
//!   figures leave no room for that: 8 KB writes at full DDR speed are quoted
//!   at 0.6 W of memory power per controller, and "random 8 KB writes total
//!   3.47 W" is exactly 3.19 W of logic plus 0.28 W of array and row-buffer
//!   write energy at 2 GB/s. Per interface bit the term is ~1.4 mW per busy
//!   controller, consistent with every published number.
//!
//! Left out (as in the paper): power regulators and other board overheads,
//! the wake-up time from the power-down state, and the host.

use crate::config::PowerConfig;
use crate::device::memory::ControllerActivity;

/// Width of a controller's DDR interface to its memory modules: 64 data bits
/// plus 8 ECC bits (MICRO'10 §III, SPEC §1.6).
pub const DDR_INTERFACE_BITS: u64 = 72;

/// Transfer queues per memory controller: one in, one out (SPEC §1.6).
pub const QUEUES_PER_CONTROLLER: u32 = 2;

const PJ: f64 = 1e-12;
const NS: f64 = 1e-9;

/// What the device did during a run, as busy times (all in ns of the run).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceActivity {
    pub elapsed_ns: u64,
    pub dma_busy_ns_host_to_device: u64,
    pub dma_busy_ns_device_to_host: u64,
    pub ring_busy_ns: u64,
    /// Time during which the scheduler had at least one request in flight.
    pub scheduler_busy_ns: u64,
    /// Sum over transfer buffers of the time each was allocated.
    pub buffer_busy_ns: u64,
    pub transfer_buffers: u32,
    pub controllers: Vec<ControllerActivity>,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq)]
pub struct ComponentPower {
    pub name: &'static str,
    pub average_w: f64,
    pub energy_j: f64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PowerReport {
    pub components: Vec<ComponentPower>,
    pub total_w: f64,
    pub energy_j: f64,
    /// Energy per completed operation; 0 when no operation completed.
    pub energy_nj_per_op: f64,
}

impl PowerReport {
    /// Average power of the component called `name` (0 if absent).
    pub fn component_w(&self, name: &str) -> f64 {
        self.components
            .iter()
            .filter(|c| c.name == name)
            .map(|c| c.average_w)
            .sum()
    }

    /// Average power of everything but the memory itself (the paper's
    /// "array … excluding the memory", 3.19 W at peak).
    pub fn logic_w(&self) -> f64 {
        self.total_w - self.memory_w()
    }

    /// Average power of the memory: array dynamic plus background.
    pub fn memory_w(&self) -> f64 {
        self.component_w(MEMORY_DYNAMIC) + self.component_w(MEMORY_BACKGROUND)
    }
}

pub const SCHEDULER_DMA: &str = "scheduler & DMA";
pub const RING: &str = "ring";
pub const SCHEDULER_BUFFERS: &str = "scheduler buffers";
pub const MEMORY_CONTROLLERS: &str = "memory controllers";
pub const MEMORY_CONTROLLER_BUFFERS: &str = "memory controller buffers";
pub const PCIE: &str = "PCIe";
pub const MEMORY_DYNAMIC: &str = "memory array dynamic";
pub const MEMORY_BACKGROUND: &str = "memory background";

/// Busy fraction of `busy_ns` over `elapsed_ns`, in 0..=1 (0 for an empty run).
fn utilization(busy_ns: u64, elapsed_ns: u64) -> f64 {
    if elapsed_ns == 0 {
        return 0.0;
    }
    debug_assert!(
        busy_ns <= elapsed_ns,
        "busy {busy_ns} ns exceeds the run's {elapsed_ns} ns"
    );
    (busy_ns as f64 / elapsed_ns as f64).clamp(0.0, 1.0)
}

/// Power of a logic component between its idle and peak figures.
fn logic_w(idle_w: f64, peak_w: f64, utilization: f64) -> f64 {
    idle_w + (peak_w - idle_w) * utilization
}

/// Dynamic energy of one controller's memory array and row buffers.
pub fn memory_dynamic_energy_j(power: &PowerConfig, activity: &ControllerActivity) -> f64 {
    let bits = |bytes: u64| bytes as f64 * 8.0;
    (bits(activity.array_bytes_written) * power.array_write_pj_per_bit
        + bits(activity.array_bytes_read) * power.array_read_pj_per_bit
        + bits(activity.row_buffer_bytes_written) * power.row_buffer_write_pj_per_bit
        + bits(activity.row_buffer_bytes_read) * power.row_buffer_read_pj_per_bit)
        * PJ
}

/// Idle background power of all dies of a `capacity_bytes` array.
pub fn idle_background_w(power: &PowerConfig, capacity_bytes: u64) -> f64 {
    // A partial die is still a die; zero-sized dies mean no background figure.
    let dies = if power.die_bytes == 0 {
        0
    } else {
        capacity_bytes.div_ceil(power.die_bytes)
    };
    dies as f64 * power.background_w_per_die_idle
}

/// Average power and energy of each component over the run described by
/// `activity`, for an array of `capacity_bytes` that completed `ops` operations.
pub fn power_report(
    power: &PowerConfig,
    capacity_bytes: u64,
    activity: &DeviceActivity,
    ops: u64,
) -> PowerReport {
    let elapsed_ns = activity.elapsed_ns;
    let elapsed_s = elapsed_ns as f64 * NS;
    let busy = |busy_ns| utilization(busy_ns, elapsed_ns);

    let scheduler_w = logic_w(
        power.scheduler_dma_w_idle,
        power.scheduler_dma_w_peak,
        busy(activity.scheduler_busy_ns),
    );
    let ring_w = logic_w(
        power.ring_w_idle,
        power.ring_w_peak,
        busy(activity.ring_busy_ns),
    );
    let buffer_time_ns = elapsed_ns.saturating_mul(u64::from(activity.transfer_buffers));
    let scheduler_buffers_w = f64::from(activity.transfer_buffers)
        * logic_w(
            power.scheduler_buffer_w_idle,
            power.scheduler_buffer_w_peak,
            utilization(activity.buffer_busy_ns, buffer_time_ns),
        );
    let pcie_busy_ns = activity
        .dma_busy_ns_host_to_device
        .max(activity.dma_busy_ns_device_to_host);
    let pcie_w = logic_w(power.pcie_w_idle, power.pcie_w_peak, busy(pcie_busy_ns));

    let mut controllers_w = 0.0;
    let mut controller_buffers_w = 0.0;
    let mut active_background_w = 0.0;
    let mut dynamic_j = 0.0;
    for controller in &activity.controllers {
        let u = busy(controller.busy_ns);
        controllers_w += logic_w(power.controller_w_idle, power.controller_w_peak, u);
        controller_buffers_w += f64::from(QUEUES_PER_CONTROLLER)
            * logic_w(
                power.controller_buffer_w_idle,
                power.controller_buffer_w_peak,
                u,
            );
        active_background_w += power.background_w_per_bit_active * DDR_INTERFACE_BITS as f64 * u;
        dynamic_j += memory_dynamic_energy_j(power, controller);
    }
    let background_w = idle_background_w(power, capacity_bytes) + active_background_w;
    let dynamic_w = if elapsed_ns == 0 {
        0.0
    } else {
        dynamic_j / elapsed_s
    };

    let from_w = |name, average_w: f64| ComponentPower {
        name,
        average_w,
        energy_j: average_w * elapsed_s,
    };
    let components = vec![
        from_w(SCHEDULER_DMA, scheduler_w),
        from_w(RING, ring_w),
        from_w(SCHEDULER_BUFFERS, scheduler_buffers_w),
        from_w(MEMORY_CONTROLLERS, controllers_w),
        from_w(MEMORY_CONTROLLER_BUFFERS, controller_buffers_w),
        from_w(PCIE, pcie_w),
        // The dynamic energy is counted exactly, not through the average.
        ComponentPower {
            name: MEMORY_DYNAMIC,
            average_w: dynamic_w,
            energy_j: dynamic_j,
        },
        from_w(MEMORY_BACKGROUND, background_w),
    ];
    let total_w = components.iter().map(|c| c.average_w).sum();
    let energy_j: f64 = components.iter().map(|c| c.energy_j).sum();
    let energy_nj_per_op = if ops == 0 {
        0.0
    } else {
        energy_j * 1e9 / ops as f64
    };
    PowerReport {
        components,
        total_w,
        energy_j,
        energy_nj_per_op,
    }
}

#[cfg(test)]
mod tests {
    //! The published consequences of Table I (MICRO'10 §V.D), each rebuilt
    //! from the mechanism: a hand-made `DeviceActivity` of what the hardware
    //! does in that scenario, fed through `power_report`.
    //!
    //! Published vs computed (details in each test):
    //!
    //! | claim | published | computed | error |
    //! |---|---|---|---|
    //! | logic at peak, 4 controllers | 3.19 W | 3.164 W | −0.8% |
    //! | 8 KB writes, one controller, DDR-limited | 0.6 W | 0.571 W | −4.8% |
    //! | link-limited active memory (2 GB/s each way) | 0.4 W | 0.340 W | −15% (gap) |
    //! | idle memory, 64 GB | 0.13 W | 0.135 W | +4.0% |
    //! | random 8 KB writes, total, link-limited | 3.47 W | 3.201 W | −7.8% |
    //! | 512 B writes, one controller, DDR-limited | 8.34 W | 8.645 W | +3.7% |
    //! | 512 B writes, one controller, at 1.4 GB/s | 8.34 W | 3.026 W | −64% (gap) |
    //! | 512 B writes with selective writes | 0.6 W | 0.571 W | −4.8% |
    //! | 512 B reads at 2.6 GB/s, one controller | 2.5 W | 0.841 W | −66% (gap) |
    use super::*;
    use crate::config::Config;

    const KB: u64 = 1024;
    const GB: u64 = 1 << 30;
    /// The 2 GB/s per direction link and 4 GB/s DDR of SPEC §1.1, §1.6 (10^9 B/s).
    const LINK_BYTES_PER_S: f64 = 2e9;
    const DDR_BYTES_PER_S: f64 = 4e9;
    const PCM_WRITE_NS: u64 = 150;

    fn power() -> PowerConfig {
        Config::preset("moneta-micro10").unwrap().power
    }

    fn ns(bytes: u64, bytes_per_s: f64) -> u64 {
        crate::units::transfer_ns(bytes, bytes_per_s)
    }

    fn within(computed: f64, published: f64, tolerance: f64) -> bool {
        ((computed - published) / published).abs() <= tolerance
    }

    #[track_caller]
    fn assert_near(computed: f64, expected: f64, tolerance: f64) {
        assert!(
            within(computed, expected, tolerance),
            "computed {computed:.4} W, expected {expected:.4} W (±{:.0}%)",
            tolerance * 100.0
        );
    }

    /// A controller that moved `count` accesses of `access_bytes` over its
    /// DDR pins, each touching `array_bytes` of the array.
    fn controller(
        op: crate::units::Op,
        count: u64,
        access_bytes: u64,
        array_bytes: u64,
        busy_ns: u64,
    ) -> ControllerActivity {
        let mut c = ControllerActivity {
            busy_ns,
            ..Default::default()
        };
        match op {
            crate::units::Op::Write => {
                c.writes = count;
                c.array_bytes_written = count * array_bytes;
                c.row_buffer_bytes_written = count * access_bytes;
            }
            crate::units::Op::Read => {
                c.reads = count;
                c.array_bytes_read = count * array_bytes;
                c.row_buffer_bytes_read = count * access_bytes;
            }
        }
        c
    }

    /// "The baseline Moneta array with four memory controllers, but excluding
    /// the memory itself, consumes a maximum of 3.19 W." Every logic
    /// component busy the whole run, MICRO'10 configuration (2 transfer
    /// buffers, 4 controllers), no memory traffic. Computed: 1.3 + 0.06 +
    /// 2 × 4.37 mW + 4 × (0.34 + 2 × 4.37 mW) + 0.4 = 3.164 W (−0.8%).
    /// (3.19 W exactly would be 16 buffer entries of 4.37 mW; the paper's
    /// baseline has 2 scheduler buffers and 8 controller queues.)
    #[test]
    fn peak_logic_with_four_controllers() {
        let t = 1_000_000;
        let activity = DeviceActivity {
            elapsed_ns: t,
            dma_busy_ns_host_to_device: t,
            dma_busy_ns_device_to_host: t,
            ring_busy_ns: t,
            scheduler_busy_ns: t,
            buffer_busy_ns: 2 * t,
            transfer_buffers: 2,
            controllers: vec![
                ControllerActivity {
                    busy_ns: t,
                    ..Default::default()
                };
                4
            ],
        };
        let report = power_report(&power(), 64 * GB, &activity, 0);
        assert_near(report.logic_w(), 3.1637, 0.001);
        assert_near(report.logic_w(), 3.19, 0.10);
        assert_eq!(report.component_w(MEMORY_DYNAMIC), 0.0);
    }

    /// "For 8 KB transfers, the memory controller bandwidth limits memory
    /// power consumption to 0.6 W for writes, since transfer time over the
    /// DDR pins limits the frequency of array writes." One controller writing
    /// back-to-back 8 KB rows, each taking 8 KB / 4 GB/s = 2.048 µs on the
    /// pins: 65,536 bits × (16.82 + 1.02) pJ per 2.048 µs = 0.571 W (−4.8%).
    #[test]
    fn eight_kb_writes_are_limited_by_ddr_transfer_time() {
        let count = 1000;
        let t = count * ns(8 * KB, DDR_BYTES_PER_S);
        let activity = DeviceActivity {
            elapsed_ns: t,
            controllers: vec![controller(
                crate::units::Op::Write,
                count,
                8 * KB,
                8 * KB,
                t,
            )],
            ..Default::default()
        };
        let report = power_report(&power(), 16 * GB, &activity, count);
        let dynamic_w = report.component_w(MEMORY_DYNAMIC);
        assert_near(dynamic_w, 0.5712, 0.001);
        assert_near(dynamic_w, 0.6, 0.10);
    }

    /// "The PCIe link limits total array active memory power to 0.4 W (2 GB/s
    /// writes at 16.82 pJ/bit and 2 GB/s reads at 2.47 pJ/bit, plus row
    /// buffer power)." 4.096 ms of 8 KB segments at 2 GB/s each way: 1000
    /// writes and 1000 reads, spread evenly over 4 controllers, each busy
    /// 500 × 2.048 µs on its pins. Array 0.269 + 0.040 W, row buffers 0.016 +
    /// 0.015 W: 0.340 W, 15% under the published 0.4 W. The paper's own
    /// terms, at 2 × 10^9 B/s or at 2 GiB/s (0.365 W), do not reach 0.4 W;
    /// the published figure seems rounded up or to include a term it does not
    /// name, so the test asserts the computed value and no factor is added.
    #[test]
    fn link_limits_active_memory_power() {
        let segments = 1000;
        let t = segments * ns(8 * KB, LINK_BYTES_PER_S);
        let per_controller = segments / 4;
        let busy = 2 * per_controller * ns(8 * KB, DDR_BYTES_PER_S);
        let controllers = (0..4)
            .map(|_| {
                let mut c = controller(
                    crate::units::Op::Write,
                    per_controller,
                    8 * KB,
                    8 * KB,
                    busy,
                );
                let r = controller(crate::units::Op::Read, per_controller, 8 * KB, 8 * KB, 0);
                c.reads = r.reads;
                c.array_bytes_read = r.array_bytes_read;
                c.row_buffer_bytes_read = r.row_buffer_bytes_read;
                c
            })
            .collect();
        let activity = DeviceActivity {
            elapsed_ns: t,
            controllers,
            ..Default::default()
        };
        let report = power_report(&power(), 64 * GB, &activity, 2 * segments);
        let dynamic_w = report.component_w(MEMORY_DYNAMIC);
        assert_near(dynamic_w, 0.3398, 0.001);
        assert!(
            !within(dynamic_w, 0.4, 0.10),
            "the documented gap closed: {dynamic_w}"
        );
    }

    /// "Idle power for the array is also small – 0.13 W or 2 mW/GB." 64 GB
    /// of 1 Gb dies (512 dies) at 264 µW each: 0.135 W (+4.0%). Logic idles
    /// at its idle figures (scheduler 0.3 W …), which the claim excludes.
    #[test]
    fn idle_array() {
        let activity = DeviceActivity {
            elapsed_ns: 1_000_000,
            transfer_buffers: 2,
            controllers: vec![ControllerActivity::default(); 4],
            ..Default::default()
        };
        let report = power_report(&power(), 64 * GB, &activity, 0);
        let memory_w = report.memory_w();
        assert_near(memory_w, 0.1352, 0.001);
        assert_near(memory_w, 0.13, 0.10);
        assert_near(report.component_w(SCHEDULER_DMA), 0.3, 1e-9);
    }

    /// "Total power for random 8 KB writes is 3.47 W." Link-limited writes:
    /// 1000 × 8 KB over 4.096 ms (2 GB/s host→device, the other direction
    /// idle), the scheduler always busy, the ring busy 2.048 µs per segment
    /// (50%), each of the 2 buffers held for the DMA (4.096 µs) and the ring
    /// (2.048 µs) of its segment (75%), each controller 250 × (2.048 µs DDR +
    /// 150 ns PCM write). The published 3.47 W is 3.19 W (all logic at peak)
    /// plus 0.285 W of write energy, i.e. it charges the controllers at peak;
    /// the mechanism has them 13% busy, so the computed total is lower.
    #[test]
    fn random_8kb_writes_total() {
        let segments = 1000;
        let t = segments * ns(8 * KB, LINK_BYTES_PER_S);
        let per_controller = segments / 4;
        let controller_busy = per_controller * (ns(8 * KB, DDR_BYTES_PER_S) + PCM_WRITE_NS);
        let activity = DeviceActivity {
            elapsed_ns: t,
            dma_busy_ns_host_to_device: t,
            dma_busy_ns_device_to_host: 0,
            ring_busy_ns: segments * ns(8 * KB, DDR_BYTES_PER_S),
            scheduler_busy_ns: t,
            buffer_busy_ns: segments * (ns(8 * KB, LINK_BYTES_PER_S) + ns(8 * KB, DDR_BYTES_PER_S)),
            transfer_buffers: 2,
            controllers: vec![
                controller(
                    crate::units::Op::Write,
                    per_controller,
                    8 * KB,
                    8 * KB,
                    controller_busy
                );
                4
            ],
        };
        let report = power_report(&power(), 64 * GB, &activity, segments);
        // Logic: 1.3 + 0.045 + 0.0073 + 4 × (0.24 + 0.1 × 0.134 + 2 × 0.0036)
        // + 0.4 = 2.779 W; memory 0.285 dynamic + 0.136 background: 3.201 W
        // (−7.8%).
        let computed_w = report.total_w;
        assert_near(computed_w, 3.2006, 0.001);
        assert_near(computed_w, 3.47, 0.10);
        assert_near(report.component_w(MEMORY_DYNAMIC), 0.2854, 0.001);
        // The paper's decomposition: logic at peak plus write energy.
        assert_near(3.19 + report.component_w(MEMORY_DYNAMIC), 3.47, 0.01);
        assert_near(
            report.energy_nj_per_op,
            computed_w * t as f64 / segments as f64,
            1e-6,
        );
    }

    /// "For small writes (e.g., 512 bytes), power consumption for the memory
    /// at a single controller could potentially reach 8.34 W since the
    /// transfer time is smaller and the controller can issue writes more
    /// frequently. For these accesses, peak controller bandwidth is
    /// 1.4 GB/s." Without selective writes each 512 B write rewrites its
    /// whole 8 KB row in the array (65,536 bits × 16.82 pJ = 1.10 µJ) while
    /// only 512 B crosses the row buffer.
    ///
    /// - Limited by DDR transfer time, as the sentence reasons (one 512 B
    ///   write per 128 ns): 8.61 W array + 0.033 W buffer = 8.645 W (+3.7%).
    /// - At the quoted 1.4 GB/s (2.73 M writes/s): 3.03 W (−64%). The two
    ///   sentences cannot both hold with Table I's energies; 8.34 W needs a
    ///   row write every ~132 ns, i.e. the DDR-limited rate.
    #[test]
    fn small_writes_rewrite_whole_rows() {
        let count = 10_000;
        let ddr_t = count * ns(512, DDR_BYTES_PER_S);
        let activity = DeviceActivity {
            elapsed_ns: ddr_t,
            controllers: vec![controller(
                crate::units::Op::Write,
                count,
                512,
                8 * KB,
                ddr_t,
            )],
            ..Default::default()
        };
        let ddr_limited_w =
            power_report(&power(), 16 * GB, &activity, count).component_w(MEMORY_DYNAMIC);
        assert_near(ddr_limited_w, 8.645, 0.001);
        assert_near(ddr_limited_w, 8.34, 0.10);

        let quoted_t = (count as f64 * 512.0 / 1.4e9 * 1e9) as u64;
        let activity = DeviceActivity {
            elapsed_ns: quoted_t,
            ..activity
        };
        let activity = DeviceActivity {
            controllers: vec![ControllerActivity {
                busy_ns: quoted_t,
                ..activity.controllers[0]
            }],
            ..activity
        };
        let quoted_w =
            power_report(&power(), 16 * GB, &activity, count).component_w(MEMORY_DYNAMIC);
        assert_near(quoted_w, 3.026, 0.002);
        assert!(
            !within(quoted_w, 8.34, 0.10),
            "the documented gap closed: {quoted_w}"
        );
    }

    /// "Implementing selective writes resolves this problem and limits
    /// per-controller power consumption to 0.6 W regardless of access size."
    /// Same DDR-limited 512 B writes, but the array writes only the 512 B
    /// that changed: 0.571 W (−4.8%), the same as 8 KB writes.
    #[test]
    fn selective_writes_cap_small_write_power() {
        let count = 10_000;
        let t = count * ns(512, DDR_BYTES_PER_S);
        let activity = DeviceActivity {
            elapsed_ns: t,
            controllers: vec![controller(crate::units::Op::Write, count, 512, 512, t)],
            ..Default::default()
        };
        let dynamic_w =
            power_report(&power(), 16 * GB, &activity, count).component_w(MEMORY_DYNAMIC);
        assert_near(dynamic_w, 0.5712, 0.001);
        assert_near(dynamic_w, 0.6, 0.10);
    }

    /// "For reads, peak per-controller bandwidth and power are 2.6 GB/s and
    /// 2.5 W, respectively, for 512 byte accesses." Each 512 B read opens a
    /// whole 8 KB row (65,536 bits × 2.47 pJ = 162 nJ) and moves 512 B out of
    /// the row buffer: at 2.6 GB/s (5.08 M reads/s) 0.841 W, a third of the
    /// published figure. Even at the DDR-limited 7.8 M reads/s it is 1.29 W;
    /// Table I's read energies cannot produce 2.5 W, so the computed value is
    /// asserted and the gap documented.
    #[test]
    fn small_reads_gap() {
        let count = 10_000;
        let t = (count as f64 * 512.0 / 2.6e9 * 1e9) as u64;
        let activity = DeviceActivity {
            elapsed_ns: t,
            controllers: vec![controller(crate::units::Op::Read, count, 512, 8 * KB, t)],
            ..Default::default()
        };
        let dynamic_w =
            power_report(&power(), 16 * GB, &activity, count).component_w(MEMORY_DYNAMIC);
        assert_near(dynamic_w, 0.841, 0.002);
        assert!(
            !within(dynamic_w, 2.5, 0.10),
            "the documented gap closed: {dynamic_w}"
        );
    }

    #[test]
    fn energies_add_up_and_empty_runs_are_finite() {
        let report = power_report(&power(), 64 * GB, &DeviceActivity::default(), 0);
        assert!(report
            .components
            .iter()
            .all(|c| c.average_w.is_finite() && c.energy_j == 0.0));
        assert_eq!(report.energy_nj_per_op, 0.0);
        // Zero-sized dies must not divide by zero.
        let no_dies = PowerConfig {
            die_bytes: 0,
            ..power()
        };
        assert_eq!(idle_background_w(&no_dies, 64 * GB), 0.0);
        // A partial die counts as a die.
        assert_near(
            idle_background_w(&power(), 128 << 20 | 1),
            2.0 * 264e-6,
            1e-9,
        );

        let t = 2_000_000;
        let activity = DeviceActivity {
            elapsed_ns: t,
            scheduler_busy_ns: t / 2,
            controllers: vec![controller(
                crate::units::Op::Write,
                100,
                8 * KB,
                8 * KB,
                t / 4,
            )],
            ..Default::default()
        };
        let report = power_report(&power(), 16 * GB, &activity, 100);
        let sum: f64 = report.components.iter().map(|c| c.energy_j).sum();
        assert_near(report.energy_j, sum, 1e-12);
        assert_near(report.energy_j, report.total_w * t as f64 * 1e-9, 1e-9);
        assert_near(report.component_w(SCHEDULER_DMA), 0.8, 1e-9);
    }
}
