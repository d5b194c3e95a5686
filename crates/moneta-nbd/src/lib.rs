//! # moneta-nbd
//!
//! An NBD server for the emulated Moneta (issue "Standard clients"):
//! standard block clients (nbdinfo, nbdcopy, qemu-img, fio's nbd engine,
//! nbdfuse and through it the kernel) reach the device through the same
//! channels, device model and wall clock as the user-space library, so they
//! see the preset's timing and move real bytes.
//!
//! - [`proto`]: the wire protocol (NetworkBlockDevice/nbd `doc/proto.md`)
//!   as checked parsing and encoding.
//! - [`server`]: listeners, fixed newstyle negotiation, and the
//!   transmission phase on a channel per connection.
//! - [`client`]: a minimal client (GO, read, write, flush), the initiator
//!   of the distributed sort's iSCSI-like path.

pub mod client;
pub mod proto;
pub mod server;

pub use client::NbdClient;

pub use server::{negotiate, Export, Listen, NbdServer, Negotiated};
