//! The crate's one error type: a kind a program can match on and a message
//! with the context a person needs.

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
}

impl EmuError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        EmuError {
            kind,
            message: message.into(),
        }
    }

    pub fn io(context: &str, e: impl fmt::Display) -> Self {
        EmuError::new(ErrorKind::Io, format!("{context}: {e}"))
    }
}

impl fmt::Display for EmuError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for EmuError {}
