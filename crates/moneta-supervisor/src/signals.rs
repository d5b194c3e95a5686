//! Ctrl-C, SIGTERM or a closed terminal during a multi-step command (`up`,
//! `san up`, a sweep) end it between steps, through its rollback or with
//! what it has, instead of killing it halfway.

use crate::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicI32, Ordering};

/// The signal that asked the command to stop (0: none).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    INTERRUPTED.store(sig, Ordering::Release);
}

/// Catch SIGINT, SIGTERM and SIGHUP from now on: they set a flag that
/// [`interrupted`] and [`signal_received`] read.
pub fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Whether a signal [`catch_signals`] watches has come (`sim sweep` and
/// `calibrate` stop between points and print what they have).
pub fn signal_received() -> bool {
    INTERRUPTED.load(Ordering::Acquire) != 0
}

/// Between steps: an [`ErrorKind::Interrupted`] error once a signal came.
pub fn interrupted() -> Result<()> {
    match INTERRUPTED.load(Ordering::Acquire) {
        0 => Ok(()),
        sig => {
            let name = match sig {
                libc::SIGINT => "SIGINT",
                libc::SIGTERM => "SIGTERM",
                libc::SIGHUP => "SIGHUP",
                _ => "a signal",
            };
            Err(Error::new(
                ErrorKind::Interrupted,
                format!("interrupted by {name}; undid everything up had done"),
            ))
        }
    }
}
