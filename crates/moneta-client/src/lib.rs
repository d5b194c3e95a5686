//! moneta-client: the client side of the emulated Moneta-D (SPEC §3.2,
//! §3.5), without the device.
//!
//! A [`Moneta`] is one channel: to a `monetad` over its Unix socket
//! ([`Moneta::connect`]) or to a control plane in this process
//! ([`Moneta::local`] with a [`LocalPlane`]; libmoneta's embedded mode
//! passes one). Synchronous [`Moneta::read`] / [`Moneta::write`],
//! asynchronous [`Moneta::prepare`] → [`Moneta::submit`] →
//! [`Moneta::poll`] / [`Moneta::wait`] → [`Moneta::release`], and zero-copy
//! access to a request's DMA slice ([`Moneta::buffer_mut`]). Files on the
//! file system that lives on the device: [`Moneta::open_file`] →
//! [`MonetaFile`] ([`file`](mod@file)).
//!
//! It speaks to the daemon through `moneta_abi` (the channel layout and
//! the control protocol) and builds commands with `moneta_model`'s format;
//! it never depends on the engine (`moneta_emu`), so nothing can link the
//! engine into what links it: the shim (libmoneta_preload.so) does.
//! libmoneta adds the embedded device, the benchmark and the C ABI.

mod client;
pub mod file;

pub use client::{CompletionMode, Io, LocalPlane, Moneta, OWN_FD_FLOOR, RUN_ID_ENV};
pub use file::MonetaFile;
pub use moneta_abi::channel::ResultCode;
pub use moneta_abi::control::DirectAccess;
pub use moneta_abi::{EmuError, ErrorKind};
