//! Flash timing on the wall clock (SPEC §7 "flash subsystem"). The handler
//! asks a [`FlashTiming`] when a page read or program issued now would
//! complete, and resolves the fault (or finishes the sync) no earlier than
//! that, as the FPGA prototypes of the Moneta family inserted their
//! technology's latencies.
//!
//! Two implementations:
//! - [`ModelTiming`]: the NVMM model's own flash subsystem
//!   (`moneta_model::nvmm::FlashTiming`: ONFI channels, FTL and die queues,
//!   planes with two registers), the same component the simulator runs in
//!   virtual time, so the mechanism exists once. `ModelTiming::preset`
//!   takes any NVMM preset (`moneta nvmm presets`).
//! - [`FixedLatency`]: a constant per operation; 0 (the default of
//!   [`crate::Options::new`]) adds no delay and measures the library's own
//!   cost.
//!
//! `NVMM_TIMING=<preset>` in the environment makes the C `nvmm_open` and
//! `nvmm_open_ex` use the model with that preset (see [`timing_from_env`]),
//! so C programs run at a technology's speed without a change.

use moneta_model::kernel::Clock;
use std::time::{Duration, Instant};

/// When flash operations complete. `now_ns` and the results are nanoseconds
/// on the caller's clock (since the region was opened); `flash_page` is the
/// absolute flash page number of the log (SPEC §7's 34-bit mapping).
/// Stateful implementations queue operations per channel and die.
pub trait FlashTiming: Send {
    fn read_page(&mut self, now_ns: u64, flash_page: u64) -> u64;
    fn program_page(&mut self, now_ns: u64, flash_page: u64) -> u64;
}

/// Every read takes `read_ns`, every program `program_ns`, with unlimited
/// parallelism (no queues): 0 measures the library alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FixedLatency {
    pub read_ns: u64,
    pub program_ns: u64,
}

impl FixedLatency {
    pub fn from_us(read_us: u64, program_us: u64) -> Self {
        FixedLatency {
            read_ns: read_us * 1000,
            program_ns: program_us * 1000,
        }
    }
}

impl FlashTiming for FixedLatency {
    fn read_page(&mut self, now_ns: u64, _flash_page: u64) -> u64 {
        now_ns + self.read_ns
    }
    fn program_page(&mut self, now_ns: u64, _flash_page: u64) -> u64 {
        now_ns + self.program_ns
    }
}

/// The model's flash subsystem on the wall clock: each page the log names
/// is placed on the model's geometry (modulo its size) and queues behind
/// the operations issued before it on its channel, die and plane.
pub struct ModelTiming {
    flash: moneta_model::nvmm::FlashTiming,
    preset: String,
}

impl ModelTiming {
    /// The flash of NVMM preset `name` (e.g. `nvmm-mlc`, `nvmm-slc`).
    pub fn preset(name: &str) -> Result<ModelTiming, String> {
        let config = moneta_model::nvmm::NvmmConfig::preset(name).map_err(|e| e.to_string())?;
        Ok(ModelTiming {
            flash: moneta_model::nvmm::FlashTiming::new(&config),
            preset: name.to_string(),
        })
    }

    /// The flash of a configuration already loaded (and maybe overridden).
    pub fn from_config(config: &moneta_model::nvmm::NvmmConfig) -> ModelTiming {
        ModelTiming {
            flash: moneta_model::nvmm::FlashTiming::new(config),
            preset: config.name.clone(),
        }
    }

    pub fn preset_name(&self) -> &str {
        &self.preset
    }

    /// A lone page read on an idle subsystem (the floor of a miss).
    pub fn idle_read_ns(&self) -> u64 {
        self.flash.idle_read_ns(crate::log::FLASH_PAGE_BYTES as u64)
    }
}

impl FlashTiming for ModelTiming {
    fn read_page(&mut self, now_ns: u64, flash_page: u64) -> u64 {
        self.flash
            .read_page(now_ns, flash_page, crate::log::FLASH_PAGE_BYTES as u64)
            .done_ns
    }
    fn program_page(&mut self, now_ns: u64, flash_page: u64) -> u64 {
        self.flash
            .program_page(now_ns, flash_page, crate::log::FLASH_PAGE_BYTES as u64)
    }
}

/// The timing `NVMM_TIMING` asks for: the model with that preset, or None
/// when it is unset or empty. A name that is not a preset is an error.
pub fn timing_from_env() -> Result<Option<ModelTiming>, String> {
    match std::env::var("NVMM_TIMING") {
        Ok(name) if !name.trim().is_empty() => ModelTiming::preset(name.trim())
            .map(Some)
            .map_err(|e| format!("NVMM_TIMING={name}: {e}")),
        _ => Ok(None),
    }
}

/// The clock flash completion times are on, shared by the region's threads:
/// a [`WallClock`] (the real face) or a `moneta_model::kernel::VirtualClock`
/// whose waits jump to the deadline (the model face, and the twin test).
pub type SharedClock = std::sync::Arc<dyn Clock + Send + Sync>;

impl Clock for WallClock {
    fn now(&self) -> u64 {
        WallClock::now_ns(self)
    }
    fn advance_to(&self, deadline_ns: u64) {
        WallClock::wait_until(self, deadline_ns)
    }
}

/// The wall clock the timing runs on: nanoseconds since `origin`. Unlike the
/// emulator's device thread, which spins through every wait, a waiter here
/// sleeps while the deadline is far (a flash program is ~1 ms away). The
/// other clock of the one `Clock` trait is `moneta_model::kernel::VirtualClock`
/// (the model face and the twin test).
#[derive(Clone, Copy, Debug)]
pub struct WallClock {
    origin: Instant,
}

/// Sleeping is left this long before the deadline; the rest is spun, since
/// a sleep overshoots by tens of microseconds.
const SPIN_NS: u64 = 80_000;

impl WallClock {
    pub fn new() -> Self {
        WallClock {
            origin: Instant::now(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Return no earlier than `deadline_ns`: sleep while far, spin when near.
    pub fn wait_until(&self, deadline_ns: u64) {
        loop {
            let now = self.now_ns();
            if now >= deadline_ns {
                return;
            }
            let left = deadline_ns - now;
            if left > SPIN_NS {
                std::thread::sleep(Duration::from_nanos(left - SPIN_NS));
            } else {
                std::hint::spin_loop();
            }
        }
    }
}

impl Default for WallClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_latency_adds_its_constant() {
        let mut t = FixedLatency::from_us(50, 1200);
        assert_eq!(t.read_page(1000, 7), 51_000);
        assert_eq!(t.program_page(0, 7), 1_200_000);
        let mut zero = FixedLatency::default();
        assert_eq!(zero.read_page(5, 0), 5);
    }

    #[test]
    fn wait_until_never_returns_early() {
        let clock = WallClock::new();
        let deadline = clock.now_ns() + 300_000;
        clock.wait_until(deadline);
        assert!(clock.now_ns() >= deadline);
    }
}
