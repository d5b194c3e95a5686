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

pub mod bench;
pub mod capi;
mod client;
pub mod file;

pub use client::{CompletionMode, Io, Moneta};
pub use file::MonetaFile;
pub use moneta_emu::channel::ResultCode;
pub use moneta_emu::control::DirectAccess;
pub use moneta_emu::{EmuError, ErrorKind};
