//! The emulator (DESIGN "One model, two clocks", SPEC §1.2–1.4 and §3): the
//! same device components as the simulator, driven by the wall clock and
//! holding real bytes, reached through Moneta-D channels in shared memory.
//!
//! Along the data path:
//!
//! - [`moneta_abi::channel`]: a channel's shared pages (command slots, tag
//!   status, DMA buffer); with the control protocol's messages, the error
//!   type and the stats, it is the ABI clients share with the daemon, used
//!   from `moneta_abi` under its own paths.
//! - [`engine`]: the device (retag → protection → the model's pipeline →
//!   medium) and the kernel role that forwards interrupts.
//! - [`reactor`]: the event loops that turn devices, several per thread
//!   (issue 21).
//! - [`protection`]: the model's permission table, re-exported for the control plane.
//! - [`medium`]: anonymous memory or a memory-mapped image file.
//! - [`control`], [`daemon`]: the trusted control plane and `monetad`;
//!   [`accept`] and [`log_limit`]: its listeners at the descriptor limit
//!   and its rate-limited log (shared with the NBD server).
//! - [`files`]: file grants from the kernel (descriptor checks, FIEMAP).
//! - [`layout_watch`], [`free_watch`]: what the kernel says of held files
//!   (fanotify) and of freed blocks (the file systems' tracepoints, BPF).
//! - [`wall_clock`]: the clock that makes it an emulator.

pub mod accept;
pub mod control;
mod cover_keeper;
pub mod daemon;
pub mod dirty;
pub mod engine;
pub mod file_table;
pub mod files;
pub mod free_watch;
pub mod growth;
pub mod layout_watch;
pub mod log_limit;
pub mod medium;
pub mod reactor;
pub mod register;
pub mod replica_meta;
pub mod san_file;
pub mod san_sim;
pub mod sys;
pub mod wall_clock;

pub use moneta_abi::error::{EmuError, ErrorKind};
/// The device's permission table lives in the model (SPEC §3.3); re-exported
/// for the control plane's callers.
pub use moneta_model::device::protection;
