//! The lifecycle of moneta's instances, shared by `moneta up`/`down`
//! (a file system over a loop device with monetad), `moneta san up`/`down`/
//! `restart` (a SAN of namespaces with their daemons) and the SAN chaos
//! checker: one copy of each mechanism.
//!
//! - [`process`]: start a process detached, logging to a file; wait until
//!   it is ready (or exited, or late); stop it (a signal, a grace period,
//!   SIGKILL); reap it.
//! - [`daemon`]: recognise a monetad by its command line (`moneta serve
//!   --socket S`, or `moneta serve-group` and its argument files), find
//!   and stop it.
//! - [`state`]: a state directory's JSON records, written atomically, and
//!   the lock that serializes `up` and `down` of one instance.
//! - [`rollback`]: the undo of every step taken so far, run on an error, a
//!   panic or an interrupt.
//! - [`signals`]: Ctrl-C, SIGTERM and SIGHUP turned into an error between
//!   steps.
//! - [`system`]: the one layer over /proc, /sys and the mount table, loop
//!   devices and external commands.
//! - [`error`]: the crate's error (a kind, a context, the cause).

pub mod daemon;
pub mod error;
pub mod process;
pub mod rollback;
pub mod signals;
pub mod state;
pub mod system;

pub use error::{Error, ErrorKind, Result};
pub use rollback::Rollback;

use std::time::Duration;

/// How long a stopped process has to go after its first signal before it
/// is killed (and a detached loop device to disappear).
pub const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a started daemon has to become ready.
pub const READY_WAIT: Duration = Duration::from_secs(10);
