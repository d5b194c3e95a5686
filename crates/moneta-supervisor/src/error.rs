//! The crate's one error type: what kind of failure, what was being done
//! (the context, e.g. "creating /run/moneta/x"), and the cause.
//!
//! Its text is the context followed by the cause's text ("creating
//! /run/moneta/x: Permission denied (os error 13)"), so that a message
//! printed whole never loses why; [`std::error::Error::source`] gives the
//! cause itself.

use std::fmt;
use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong, for callers that act on it (an exit code, a retry).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A file or directory operation failed.
    Io,
    /// A record in a state directory is not what it should be.
    Corrupt,
    /// An external command could not be run or failed.
    Command,
    /// An external command is not installed.
    ToolMissing,
    /// A process exited before it was ready.
    Exited,
    /// A process was not ready in time.
    Timeout,
    /// A process, a mount or a loop device would not go.
    Stuck,
    /// A mount point is in use.
    Busy,
    /// SIGINT, SIGTERM or SIGHUP arrived (see [`crate::signals`]).
    Interrupted,
}

#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    /// An error with no underlying cause.
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    /// An error caused by `source`.
    pub fn with_source(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        Error {
            kind,
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// A failed file operation: `context` says on what.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::with_source(ErrorKind::Io, context, source)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What was being done, without the cause.
    pub fn context(&self) -> &str {
        &self.context
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)?;
        if let Some(s) = &self.source {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// The CLI's commands still speak in messages: the whole text, cause
/// included.
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn the_text_carries_the_cause_and_the_source_is_kept() {
        let e = Error::io("creating /x", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.context(), "creating /x");
        assert!(
            e.to_string().starts_with("creating /x: Permission denied"),
            "{e}"
        );
        let io = e
            .source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .unwrap();
        assert_eq!(io.raw_os_error(), Some(libc::EACCES));
        let outer = Error::with_source(ErrorKind::Command, "up", e);
        assert!(outer.to_string().starts_with("up: creating /x: Permission"));
        assert_eq!(
            outer
                .source()
                .unwrap()
                .downcast_ref::<Error>()
                .unwrap()
                .kind(),
            ErrorKind::Io
        );
        let plain = Error::new(ErrorKind::Timeout, "late");
        assert!(plain.source().is_none());
        assert_eq!(String::from(plain), "late");
    }
}
