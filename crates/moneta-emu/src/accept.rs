//! Accepting connections when the process runs out of descriptors
//! (EMFILE, ENFILE): the listener stays readable, so a loop that polls it
//! and fails to accept spins a core (issue 39 measured a busy core and a
//! log growing at ~23 MB/s). The usual answer (libuv, nginx): keep one
//! spare descriptor; when accept fails for lack of descriptors, give the
//! spare up, accept the waiting client and close it at once (it sees the
//! connection end instead of hanging), take the spare back, and leave the
//! listener alone for [`PAUSE`]. monetad's control socket and its NBD
//! listeners both accept through an [`Acceptor`].

use crate::log_limit::LogLimit;
use std::fs::File;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// How long a listener is left alone after descriptors ran out.
pub const PAUSE: Duration = Duration::from_millis(100);

pub struct Acceptor {
    /// What the log calls this listener ("control socket", "NBD").
    name: &'static str,
    spare: Option<File>,
    paused_until: Option<Instant>,
    log: LogLimit,
}

fn out_of_descriptors(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

impl Acceptor {
    pub fn new(name: &'static str) -> Acceptor {
        Acceptor {
            name,
            spare: File::open("/dev/null").ok(),
            paused_until: None,
            log: LogLimit::new(),
        }
    }

    /// Whether the listener should be left out of the next poll (and how
    /// long for, at most).
    pub fn paused_for(&mut self) -> Option<Duration> {
        let until = self.paused_until?;
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.paused_until = None;
            return None;
        }
        Some(left)
    }

    /// An accept on `listener` failed with `e`. Returns whether to stop
    /// accepting for now (the listener is then paused).
    pub fn failed(&mut self, listener: RawFd, e: &io::Error) -> bool {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
                return e.kind() == io::ErrorKind::WouldBlock
            }
            io::ErrorKind::ConnectionAborted => return false,
            _ => {}
        }
        if !out_of_descriptors(e) {
            self.log
                .log(|| format!("monetad: {}: accept: {e}", self.name));
            return false;
        }
        // Give the spare up to take the waiting client off the queue.
        self.spare = None;
        // SAFETY: accept4 on a listening socket we own; a descriptor it
        // returns is closed at once.
        let fd = unsafe {
            libc::accept4(
                listener,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd >= 0 {
            // SAFETY: the descriptor accept4 just returned, ours alone.
            unsafe { libc::close(fd) };
        }
        self.spare = File::open("/dev/null").ok();
        self.paused_until = Some(Instant::now() + PAUSE);
        let limit = open_files_limit();
        self.log.log(|| {
            format!(
                "monetad: {}: accept: {e} (descriptor limit {limit}): a client was closed \
                 unheard; accepting again in {} ms",
                self.name,
                PAUSE.as_millis()
            )
        });
        true
    }
}

/// The process's soft RLIMIT_NOFILE.
pub fn open_files_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct that lives here.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    r.rlim_cur
}

/// Raise the soft RLIMIT_NOFILE to the hard one (the common soft default,
/// 1,024, is less than a daemon of 1,024 channels needs); returns the soft
/// limit in force.
pub fn raise_open_files_limit() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on a struct that lives here.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: r.rlim_max,
                rlim_max: r.rlim_max,
            };
            libc::setrlimit(libc::RLIMIT_NOFILE, &raised);
        }
    }
    open_files_limit()
}
