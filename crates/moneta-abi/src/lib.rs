//! The ABI between the Moneta daemon and its clients (DESIGN "Processes in
//! emulation", SPEC §3.1–3.4): everything the client (moneta-client, which
//! libmoneta re-exports), the shim and the `moneta` commands need to speak
//! to a device, and nothing of the device itself, so a client never links
//! the engine (STYLE 14: protocols stand apart). The daemon (`moneta_emu`)
//! depends on this crate too; only its `control` and `sys` modules still
//! re-export this crate's modules of those names beside their own items.
//!
//! - [`channel`]: a channel's shared pages (SPEC §3.1, Table 4.1): command
//!   slots, tag status, the doorbell, the DMA buffer, and the result codes
//!   a completion carries.
//! - [`control`]: the control protocol's messages (`hello`, grants, file
//!   grants, layout changes, stats) and their framing on the Unix socket.
//! - [`stats`]: what a device reports about itself (the `stats` reply).
//! - [`error`]: the one error type both sides use; it crosses the socket
//!   as the `error` reply.
//! - [`inode`]: a file's identity, the key of file grants (SPEC §3.4).
//! - [`sys`]: the system calls both sides make (shared mappings, futexes,
//!   descriptor passing, the monotonic clock of the channel's stamps, file
//!   I/O).
//! - [`fidelity`]: the verdict on a result (faithful or not) that the
//!   device's stats carry and clients' benchmarks apply to their own
//!   measurements by the same rule.
//!
//! What it leaves out: the device (retag, protection, pipeline, medium),
//! the control plane's policy, and the NBD and SAN wire formats
//! (`moneta-nbd`, `moneta-wire`).

pub mod channel;
pub mod control;
pub mod error;
pub mod fidelity;
pub mod inode;
pub mod stats;
pub mod sys;

pub use error::{EmuError, ErrorKind};
pub use inode::InodeId;
