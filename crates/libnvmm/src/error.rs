//! The one error type of libnvmm: a kind (what went wrong, for callers to
//! match on) and a context sentence (where, with the numbers). Failures that
//! can happen — a missing kernel feature, a corrupt or foreign backing file,
//! a token that garbage collection already discarded, a full version area —
//! are values of this type; only broken invariants panic (SPEC §7). A
//! region whose backing file failed it (a refused write-back, a changed
//! file) keeps answering with the first such error.

use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The kernel lacks something libnvmm needs (userfaultfd, write-protect).
    Unsupported,
    /// A system call failed.
    Io,
    /// The backing file is not an NVMM log, or its geometry differs.
    BadFile,
    /// An argument is out of range (address outside the region, bad size).
    InvalidArgument,
    /// A token that was never issued, was rolled back, or was discarded by
    /// garbage collection.
    StaleToken,
    /// No free page, version entry or Lamport time is left.
    Exhausted,
    /// Another process has the backing file open.
    Busy,
    /// A fork child called into its parent's region, which it does not
    /// inherit (the region is the process's that opened it).
    Forked,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvmmError {
    pub kind: ErrorKind,
    pub context: String,
}

impl NvmmError {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        NvmmError {
            kind,
            context: context.into(),
        }
    }

    /// An `Io` error from the calling thread's errno, naming the call.
    pub fn last_os(what: impl fmt::Display) -> Self {
        Self::os(what, std::io::Error::last_os_error())
    }

    pub fn os(what: impl fmt::Display, e: std::io::Error) -> Self {
        let kind = match e.raw_os_error() {
            Some(libc::EBUSY) | Some(libc::EWOULDBLOCK) => ErrorKind::Busy,
            _ => ErrorKind::Io,
        };
        NvmmError::new(kind, format!("{what}: {e}"))
    }
}

impl fmt::Display for NvmmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.context)
    }
}

impl std::error::Error for NvmmError {}

pub type Result<T> = std::result::Result<T, NvmmError>;
