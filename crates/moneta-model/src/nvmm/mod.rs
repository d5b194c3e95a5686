//! NVMM: journaled NAND flash as main memory behind a DRAM cache (SPEC §7,
//! the UMD technical report in `seeds/003_…`), as a model in virtual time.
//!
//! The data path, one module each:
//!
//! - [`workload`]: threads' main-memory accesses (GUPS, MMAP, sequential,
//!   address traces).
//! - [`controller`]: the hybrid controller: DRAM cache of flash-page-sized
//!   blocks ([`cache`], tags in DRAM, [`dram`] timing), miss path,
//!   prefetch, early write-back.
//! - [`journal`]: the journal on physical flash: sub-page placement,
//!   garbage collection of blocks, wear and retirement, over
//!   [`page_table`] (16-byte entries of [`entry`], version chains, the
//!   longest-first victim order), which libnvmm uses too (issue 24).
//! - [`flash`]: ONFI channels, volumes, dies, planes with two registers,
//!   FTL and die queues.
//! - [`baseline`]: the all-DRAM upper bound and the DRAM + NVMe SSD system
//!   with the OS's paging, readahead and measured software time.
//! - [`system`]: one run on the event kernel; [`experiments`]: the report's
//!   latency sweep and the wear estimate; [`config`]: presets.
//!
//! ## The timing interface for `libnvmm`
//!
//! [`FlashTiming`] is the flash subsystem's timing, clock-agnostic, and the
//! one the simulator itself uses (the controller and the SSD baseline both
//! call it):
//!
//! ```
//! use moneta_model::nvmm::{FlashTiming, NvmmConfig};
//! let config = NvmmConfig::preset("nvmm-slc").unwrap();
//! let mut flash = FlashTiming::new(&config);
//! let page = flash.geometry().striped(42); // a logical page, spread over planes
//! let read = flash.read_page(1_000, page, config.flash.page_bytes);
//! assert!(read.critical_ns < read.done_ns); // the missed 64 B arrive first
//! let durable_ns = flash.program_page(read.done_ns, page, config.flash.page_bytes);
//! assert!(durable_ns >= read.done_ns + config.flash.program_ns);
//! ```
//!
//! `read_page(now_ns, flash_page, bytes) -> FlashRead { critical_ns,
//! done_ns }`, `program_page(now_ns, flash_page, bytes) -> done_ns` and
//! `erase_block(now_ns, flash_page) -> done_ns` take and return u64
//! nanoseconds on the caller's clock and keep channel, die, plane and
//! register state between calls, so concurrent misses queue as in the
//! simulator. Calls should come in non-decreasing `now_ns`.

pub mod baseline;
pub mod cache;
pub mod calendar;
pub mod calibration;
pub mod config;
pub mod controller;
pub mod dram;
pub mod entry;
pub mod experiments;
pub mod flash;
pub mod journal;
pub mod miss_path;
pub mod page_table;
pub mod system;
pub mod workload;

pub use config::{nvmm_preset_names, NvmmConfig, NVMM_PRESETS};
pub use flash::{FlashGeometry, FlashRead, FlashTiming};
pub use journal::OutOfSpace;

use crate::config::ConfigError;
use std::fmt;

/// What can go wrong in an NVMM run.
#[derive(Clone, Debug, PartialEq)]
pub enum NvmmError {
    Config(ConfigError),
    /// The journal ran out of flash (worn out, or too full).
    Flash(OutOfSpace),
    /// A workload that cannot run (bad sizes, too many threads, bad trace).
    Workload(String),
}

impl fmt::Display for NvmmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NvmmError::Config(e) => write!(f, "{e}"),
            NvmmError::Flash(e) => write!(f, "{e}"),
            NvmmError::Workload(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for NvmmError {}

impl From<ConfigError> for NvmmError {
    fn from(e: ConfigError) -> Self {
        NvmmError::Config(e)
    }
}
