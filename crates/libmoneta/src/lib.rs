//! libmoneta: the client side of the emulated Moneta-D (SPEC §3.2, §3.5).
//!
//! A [`Moneta`] is one channel: to a `monetad` over its Unix socket
//! ([`Moneta::connect`]) or to a device started in this process
//! ([`Moneta::embedded`]). Synchronous [`Moneta::read`] / [`Moneta::write`],
//! asynchronous [`Moneta::prepare`] → [`Moneta::submit`] →
//! [`Moneta::poll`] / [`Moneta::wait`] → [`Moneta::release`], and zero-copy
//! access to a request's DMA slice ([`Moneta::buffer_mut`]). Files on the
//! file system that lives on the device: [`Moneta::open_file`] →
//! [`MonetaFile`] ([`file`]). The C ABI
//! (`include/moneta.h`, `libmoneta.so`) wraps the same calls ([`capi`]).
//!
//! It speaks to the daemon through `moneta_abi` (the channel layout and
//! the control protocol); only the embedded mode needs the device itself
//! (`moneta_emu`), behind the default feature `embedded`.

pub mod bench;
pub mod capi;
mod client;
pub mod file;

pub use client::{CompletionMode, Io, Moneta};
pub use file::MonetaFile;
pub use moneta_abi::channel::ResultCode;
pub use moneta_abi::control::DirectAccess;
pub use moneta_abi::{EmuError, ErrorKind};
