//! The model's one error type at its boundary: what kind of failure, what
//! was being done (the context: "preset 'moneta'", "group 0"), and the
//! cause, kept as the error's [`source`](std::error::Error::source).
//!
//! The layers below keep their own precise causes — a [`ConfigError`]
//! names the key that is wrong, a device's `CommandError` the field that
//! does not fit — and this type carries them: what crosses the crate's
//! boundary from running a configured experiment
//! ([`crate::experiment::run`], [`crate::summary`]), parsing a size or an
//! op mix ([`crate::units`], [`crate::workload`]) or calibrating is an
//! [`Error`], never a bare message.
//!
//! Its text is the context followed by the cause's text ("group 0: size 100
//! must be a positive multiple of 512 B"), so a message printed whole never
//! loses why; an error that only carries a cause (the context is empty)
//! reads as the cause.

use crate::config::ConfigError;
use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, for callers that act on it (an exit code, a message).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A preset, configuration file or override that does not load or
    /// check (the cause is a [`ConfigError`] naming the key).
    Config,
    /// A workload the configuration cannot run: no threads, a size or
    /// region that does not fit the device, a queue depth the stack has no
    /// way to keep.
    Workload,
    /// A value as a person types it (a size, an op) that does not parse.
    Parse,
    /// The model refused a request its own host built (a device that
    /// rejects a command, a command that cannot be encoded): a fault of the
    /// model, not of what it was asked.
    Model,
}

#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    /// What was being done, or the whole message of a leaf error; empty
    /// when the error is only its cause.
    context: String,
    source: Option<Cause>,
}

impl Error {
    /// An error with no underlying cause: `message` says it all.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Error {
        Error {
            kind,
            context: message.into(),
            source: None,
        }
    }

    /// An error caused by `source`; `context` says what was being done.
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

    pub fn workload(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Workload, message)
    }

    pub fn parse(message: impl Into<String>) -> Error {
        Error::new(ErrorKind::Parse, message)
    }

    /// The model refused its own request: `context` says which, `source` why.
    pub fn model(context: impl Into<String>, source: impl Into<Cause>) -> Error {
        Error::with_source(ErrorKind::Model, context, source)
    }

    /// The same error under an outer context: the kind stays, the error
    /// becomes the cause.
    pub fn context(self, context: impl Into<String>) -> Error {
        Error::with_source(self.kind, context, self)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The key a configuration error names, if the cause is one.
    pub fn config_error(&self) -> Option<&ConfigError> {
        let mut cause = self.source.as_deref().map(|s| s as &dyn std::error::Error);
        while let Some(c) = cause {
            if let Some(e) = c.downcast_ref::<ConfigError>() {
                return Some(e);
            }
            cause = c.source();
        }
        None
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

/// A configuration that does not check is a [`ErrorKind::Config`] error
/// whose cause names the key.
impl From<ConfigError> for Error {
    fn from(e: ConfigError) -> Error {
        Error::with_source(ErrorKind::Config, "", e)
    }
}

/// For callers that still speak in messages (outside this crate): the
/// whole text, cause included.
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
        let mut c = crate::config::Config::preset("moneta").unwrap();
        let bad = c.set("device.queue_policy=lifo").unwrap_err();
        let e = Error::from(bad).context("--set device.queue_policy=lifo");
        assert_eq!(e.kind(), ErrorKind::Config);
        assert!(
            e.to_string()
                .starts_with("--set device.queue_policy=lifo: device.queue_policy: "),
            "{e}"
        );
        assert_eq!(e.config_error().unwrap().key, "device.queue_policy");
        let inner = e.source().and_then(|s| s.downcast_ref::<Error>()).unwrap();
        assert!(inner.source().unwrap().is::<ConfigError>());
        let plain = Error::workload("the workload has no threads");
        assert!(plain.source().is_none());
        assert!(plain.config_error().is_none());
        assert_eq!(String::from(plain), "the workload has no threads");
    }

    #[test]
    fn a_file_that_cannot_be_read_keeps_the_system_error() {
        let missing = std::path::Path::new("/nonexistent/moneta-array.toml");
        let e = Error::from(crate::config::Config::from_file(missing).unwrap_err());
        assert_eq!(e.kind(), ErrorKind::Config);
        let io = e
            .source()
            .and_then(|config| config.source())
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the io::Error under the ConfigError");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        // The text is the system's, as before the cause was kept.
        assert_eq!(e.to_string(), io.to_string());
    }

    #[test]
    fn a_workload_that_does_not_fit_is_a_workload_error() {
        let c = crate::config::Config::preset("moneta").unwrap();
        let mut w = crate::workload::Workload::xdd(
            crate::workload::OpMix::Read,
            4096,
            1,
            1 << 20,
            crate::workload::RunLimit::Ops(10),
            1,
        );
        w.groups[0].size_bytes = 100;
        let e = crate::experiment::run(&c, &w).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Workload, "{e}");
        assert!(e.to_string().contains("multiple of 512"), "{e}");
        assert_eq!(
            crate::units::parse_size("0").unwrap_err().kind(),
            ErrorKind::Parse
        );
        assert_eq!(
            crate::workload::OpMix::parse("reed").unwrap_err().kind(),
            ErrorKind::Parse
        );
    }
}
