//! The one error type of the daemon and its clients: a kind a program can
//! match on and a message with the context a person needs. It crosses the
//! control socket as the `error` reply (`control::Response::Error`), so a
//! client sees the kind, message and errno the daemon had; `moneta_emu`
//! uses it as its own error type.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// Bad configuration or arguments.
    Config,
    /// A system call failed.
    Io,
    /// A malformed control message.
    Protocol,
    /// The peer may not do this (not the daemon's owner, no such grant).
    Unauthorized,
    /// All 1024 channels are in use.
    NoChannel,
    /// The device (or daemon) is stopping or gone.
    Stopped,
    /// A request failed on the device (the result code says why).
    Request,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EmuError {
    pub kind: ErrorKind,
    pub message: String,
    /// The operating system's error number behind it, when a system call
    /// failed (ENOSPC, EACCES, …): kept end to end so a program behind the
    /// shim sees the errno the kernel gave, not a generic EIO.
    pub errno: Option<i32>,
}

impl EmuError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EmuError {
            kind,
            message: message.into(),
            errno: None,
        }
    }

    /// A failed system call (or anything displayable); an `io::Error`'s
    /// errno is kept.
    pub fn io(context: &str, e: impl fmt::Display + AsOsError) -> Self {
        EmuError {
            errno: e.os_error(),
            ..EmuError::new(ErrorKind::Io, format!("{context}: {e}"))
        }
    }

    pub fn with_errno(mut self, errno: Option<i32>) -> Self {
        self.errno = errno;
        self
    }

    /// The errno a POSIX caller should see: the kernel's when there was
    /// one, else the closest meaning of the kind.
    pub fn posix_errno(&self) -> i32 {
        self.errno.unwrap_or(match self.kind {
            ErrorKind::Unauthorized => libc::EACCES,
            ErrorKind::NoChannel => libc::EAGAIN,
            ErrorKind::Config => libc::EINVAL,
            ErrorKind::Io | ErrorKind::Protocol | ErrorKind::Stopped | ErrorKind::Request => {
                libc::EIO
            }
        })
    }
}

/// What may carry an operating-system error number.
pub trait AsOsError {
    fn os_error(&self) -> Option<i32> {
        None
    }
}

impl AsOsError for std::io::Error {
    fn os_error(&self) -> Option<i32> {
        self.raw_os_error()
    }
}

impl AsOsError for &std::io::Error {
    fn os_error(&self) -> Option<i32> {
        self.raw_os_error()
    }
}

impl AsOsError for String {}
impl AsOsError for &str {}
impl AsOsError for EmuError {
    fn os_error(&self) -> Option<i32> {
        self.errno
    }
}
impl AsOsError for serde_json::Error {}
impl AsOsError for std::num::ParseIntError {}

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EmuError {}
