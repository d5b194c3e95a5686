//! # moneta-model
//!
//! The Moneta storage array family (SPEC.md) as a deterministic discrete-event
//! model: one model, driven by a virtual clock for simulation and (later) by
//! the wall clock for emulation (DESIGN.md "One model, two clocks").
//!
//! The modules follow the data path:
//!
//! - [`workload`]: XDD-like closed-loop generators (SPEC §2, §3.5).
//! - [`host`]: host software stacks: the Linux kernel stacks Base … Balance
//!   (SPEC §2), Moneta-D's user-space library (SPEC §3), the DDR ramdisk (§6).
//! - [`device`]: the array: command decoding, tags, Moneta-D retag and
//!   permission table, request queues, transfer buffers and scheduler, DMA
//!   over PCIe, ring, memory controllers, start-gap, the Onyx PCM
//!   controller, the power model (SPEC §1, §3.3, §5), and the driver that
//!   delivers its events on any clock.
//! - [`san`]: QuickSAN (SPEC §4): devices with a network port joined by an
//!   Ethernet fabric into one global address space, with mirroring; the
//!   port and its packets are device components (`device::network`,
//!   `device::packet`).
//! - [`nvmm`]: NVMM (SPEC §7): a DRAM-cached, journaled flash main memory,
//!   its SSD and all-DRAM baselines.
//! - [`kernel`]: the event kernel, clocks and seeded randomness.
//! - [`config`]: presets as data, overrides, validation.
//! - [`experiment`]: runs one configured experiment and reports its results.
//! - [`breakdown`]: where each request's time goes (Table 3.1 / 4.2).
//! - [`error`]: the crate's one error type (kind, context, cause).
//! - [`calibration`], [`orderings`]: the published numbers and the published
//!   "A beats B" orderings beside the model's; [`check`]: one such number.

pub mod breakdown;
pub mod calibration;
pub mod check;
pub mod config;
pub mod device;
pub mod error;
pub mod experiment;
pub mod host;
pub mod kernel;
pub mod nvmm;
pub mod orderings;
pub mod san;
pub mod stats;
pub mod suggest;
pub mod summary;
pub mod units;
pub mod workload;

pub use error::{Error, ErrorKind};
