//! libmoneta: the client side of the emulated Moneta-D (SPEC §3.2, §3.5),
//! with the device at hand.
//!
//! The channel itself is moneta-client's, re-exported here: a [`Moneta`] is
//! one channel, to a `monetad` over its Unix socket ([`Moneta::connect`])
//! or to a device started in this process ([`embedded()`], [`attach`]).
//! Synchronous [`Moneta::read`] / [`Moneta::write`], asynchronous
//! [`Moneta::prepare`] → [`Moneta::submit`] → [`Moneta::poll`] /
//! [`Moneta::wait`] → [`Moneta::release`], and zero-copy access to a
//! request's DMA slice ([`Moneta::buffer_mut`]). Files on the file system
//! that lives on the device: [`Moneta::open_file`] → [`MonetaFile`]
//! ([`file`](mod@file)). The C ABI (`include/moneta.h`, `libmoneta.so`)
//! wraps the same calls ([`capi`]); [`bench`](mod@bench) measures them.
//!
//! libmoneta always links the engine (`moneta_emu`) for the embedded mode;
//! a client that must not (the shim) depends on moneta-client instead.

pub mod bench;
pub mod capi;
mod embedded;

pub use embedded::{attach, embedded};
pub use moneta_client::{
    file, CompletionMode, DirectAccess, EmuError, ErrorKind, Io, LocalPlane, Moneta, MonetaFile,
    ResultCode, RUN_ID_ENV,
};
