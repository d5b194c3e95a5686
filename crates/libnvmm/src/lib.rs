//! libnvmm: NVMM's journaled, DRAM-cached flash main memory for real
//! programs (SPEC §7; DESIGN "Plus NVMM"). A process maps a region far
//! larger than its DRAM budget ([`Nvmm::open`]); resident 8 KB blocks are
//! the DRAM cache, the backing file is the flash, kept log-structured with
//! the report's page table and version chains; [`Nvmm::sync`] returns a
//! Lamport token and [`Nvmm::rollback`] restores the region as of one;
//! alloc / delete / setperms / temporary pages follow SPEC §7's API.
//!
//! Where things are: [`uffd`] (the kernel boundary), [`region`] (miss path,
//! sync, rollback), [`cache`] (sets and recency), [`table`] and [`entry`]
//! (page table, 16-byte entries: the model crate's, shared with the simulator), [`log`] (the backing file, checkpoints),
//! [`gc`] (chain consolidation; the victim order is the model's), [`tokens`] (liveness of sync tokens),
//! [`timing`] (flash completion times: the NVMM model's flash, or a fixed latency),
//! [`capi`] (the C ABI of `include/nvmm.h`).

pub mod cache;
pub mod capi;
/// The page-table entry codec and status bits, shared with the simulator.
pub use moneta_model::nvmm::entry;
pub mod error;
pub mod gc;
pub mod log;
pub mod region;
pub mod table;
pub mod testkit;
pub mod timing;
pub mod tokens;
pub mod uffd;

pub use error::{ErrorKind, NvmmError, Result};
pub use log::{FLASH_PAGE_BYTES, PAGE_BYTES};
pub use region::{perms, Face, Nvmm, Options, Replay, Stats};
pub use timing::{timing_from_env, FixedLatency, FlashTiming, ModelTiming, SharedClock};
