//! The crate's one error type: what kind of failure (for callers that act
//! on it), what was being done (the context: "NBD on tcp://[::1]:10809",
//! "export 'a:0:0'"), and the cause, kept as the error's
//! [`source`](std::error::Error::source).
//!
//! Its text is the context followed by the cause's text ("NBD on
//! unix:/run/x.sock: Permission denied (os error 13)"), so a message
//! printed whole never loses why.

use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A specification or limit given to the server is not valid (an
    /// export, a listen address, a connection limit): the caller's input.
    Invalid,
    /// A socket or system call failed.
    Io,
    /// The peer broke the protocol (a bad magic, flag, cookie or length).
    Protocol,
    /// The peer or the server's policy said no: a server's error reply, an
    /// export that does not exist, a connection over the limit.
    Refused,
    /// The device could not serve a connection (no channel, no grant).
    Device,
}

#[derive(Debug, thiserror::Error)]
#[error("{}", text(.context, .source))]
pub struct Error {
    kind: ErrorKind,
    context: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

fn text(
    context: &str,
    source: &Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
) -> String {
    match source {
        Some(s) => format!("{context}: {s}"),
        None => context.to_string(),
    }
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

    /// A failed socket or system call: `context` says what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::with_source(ErrorKind::Io, context, source)
    }

    pub(crate) fn invalid(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Invalid, context)
    }

    pub(crate) fn protocol(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Protocol, context)
    }

    pub(crate) fn refused(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Refused, context)
    }

    /// The same error under an outer context ("NBD server HOST:PORT"):
    /// the kind stays, the error becomes the cause.
    pub fn context(self, context: impl Into<String>) -> Error {
        Error::with_source(self.kind, context, self)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What was being done, without the cause.
    pub fn what(&self) -> &str {
        &self.context
    }
}

impl From<crate::proto::ProtoError> for Error {
    fn from(e: crate::proto::ProtoError) -> Error {
        // A ProtoError is only its message: it becomes the context.
        Error::protocol(e.0)
    }
}

/// Callers that still speak in messages (the CLI's commands) get the whole
/// text, cause included.
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
    fn the_text_carries_the_cause_and_the_chain_is_kept() {
        let e = Error::io("NBD on unix:/x", io::Error::from_raw_os_error(libc::EACCES));
        assert_eq!(e.kind(), ErrorKind::Io);
        assert_eq!(e.what(), "NBD on unix:/x");
        assert!(
            e.to_string()
                .starts_with("NBD on unix:/x: Permission denied"),
            "{e}"
        );
        let outer = e.context("monetad");
        assert_eq!(outer.kind(), ErrorKind::Io);
        assert!(outer
            .to_string()
            .starts_with("monetad: NBD on unix:/x: Permission"));
        let inner = outer.source().unwrap().downcast_ref::<Error>().unwrap();
        let io = inner.source().unwrap().downcast_ref::<io::Error>().unwrap();
        assert_eq!(io.raw_os_error(), Some(libc::EACCES));
        let plain = Error::refused("no export 'x'");
        assert!(plain.source().is_none());
        assert_eq!(String::from(plain), "no export 'x'");
    }
}
