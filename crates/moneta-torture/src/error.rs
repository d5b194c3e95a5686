//! The harness's one error type: what kind of failure, what was being done
//! (the context: "scenario defragment", "/mnt/moneta/t/a"), and the cause,
//! kept as the error's [`source`](std::error::Error::source).
//!
//! A [`ErrorKind::Lost`] error is what the harness exists to find: bytes or
//! a result that differ from the oracle. The other kinds say the harness
//! could not check (a bad argument, a failed system call, a step or tool
//! that did not run). The text is the context followed by the cause's text,
//! so a message printed whole never loses why.

use std::fmt;
use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A bad command line.
    Usage,
    /// A file or system call failed.
    Io,
    /// Data or a call's result differs from what the oracle says.
    Lost,
    /// A step through the shim, a child or an admin tool failed.
    Failed,
}

#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<Cause>,
}

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    pub fn with_source(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl Into<Cause>,
    ) -> Error {
        Error {
            kind,
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// A failed file or system call: `context` says on what.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::with_source(ErrorKind::Io, context, source)
    }

    /// Bytes or a result that differ from the oracle.
    pub fn lost(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Lost, context)
    }

    pub fn usage(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Usage, context)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.source, self.context.is_empty()) {
            (Some(s), true) => write!(f, "{s}"),
            (Some(s), false) => write!(f, "{}: {s}", self.context),
            (None, _) => f.write_str(&self.context),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// A message from code that still speaks in messages (the descriptor
/// scenarios): a failure whose kind is not known.
impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::new(ErrorKind::Failed, message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::new(ErrorKind::Failed, message)
    }
}

/// For code that still returns a message: the whole text, cause included.
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

/// A bare system-call failure (its context added by the caller's message).
impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        Error::with_source(ErrorKind::Io, "", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn text_and_chain_carry_the_cause() {
        let e = Error::io("/m/a", io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.to_string().starts_with("/m/a: No space left"), "{e}");
        assert!(e.source().unwrap().is::<io::Error>());
        let lost = Error::lost("a: byte 7 is 0x01, want 0x02");
        assert_eq!(lost.kind(), ErrorKind::Lost);
        assert_eq!(String::from(lost), "a: byte 7 is 0x01, want 0x02");
    }
}
