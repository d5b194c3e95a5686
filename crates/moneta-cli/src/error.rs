//! The command layer's one error type: what kind of failure (the exit code
//! follows it), what was being done (the context: "--config x.toml",
//! "moneta up /mnt/moneta"), and the cause, kept as the error's
//! [`source`](std::error::Error::source) (a `moneta_supervisor::Error`,
//! a `ConfigError`, an `io::Error`, ...).
//!
//! Its text is the context followed by the cause's text ("--config x.toml:
//! memory.contolers: unknown key"), so a message printed whole never loses
//! why. An error that only carries a cause (the context is empty) reads as
//! the cause.
//!
//! Commands not yet converted still return `Result<_, String>`: the two
//! `From` conversions below join them to this type (a message becomes a
//! [`ErrorKind::Failed`] error; an error handed to a message-returning
//! function becomes its whole text). The kinds that change the exit code
//! ([`ErrorKind::Interrupted`]) travel only through this type, never
//! through a message's wording.

use std::fmt;
use std::io;

pub type Result<T, E = Error> = std::result::Result<T, E>;

type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// What went wrong, for the exit code ([`ErrorKind::exit_code`]).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The command line asks for what cannot be: a value out of range,
    /// options that exclude each other, a missing privilege.
    Usage,
    /// A preset, configuration file or `--set` override that does not load
    /// or does not check.
    Config,
    /// The work itself failed: a device, a daemon, a file, a child program.
    Failed,
    /// SIGINT, SIGTERM or SIGHUP stopped the command between steps (what
    /// was done is printed, or undone).
    Interrupted,
}

impl ErrorKind {
    /// Every kind, in the order the reference page lists them.
    pub const ALL: [ErrorKind; 4] = [
        ErrorKind::Usage,
        ErrorKind::Config,
        ErrorKind::Failed,
        ErrorKind::Interrupted,
    ];

    /// The process's exit code for an error of this kind: 130, the shell's
    /// code for Ctrl-C, for an interrupted command; 2 for every other
    /// error (clap's code for a bad command line, which the kinds above it
    /// share: one code for "it did not work" keeps scripts simple).
    pub fn exit_code(self) -> u8 {
        match self {
            ErrorKind::Interrupted => 130,
            ErrorKind::Usage | ErrorKind::Config | ErrorKind::Failed => 2,
        }
    }

    /// What the kind means, for the reference page.
    pub fn meaning(self) -> &'static str {
        match self {
            ErrorKind::Usage => "a bad command line: a value out of range, options that exclude each other, a missing privilege",
            ErrorKind::Config => "a preset, configuration file or `--set` override that does not load or check",
            ErrorKind::Failed => "the command failed while running (a device, a daemon, a file, a child program)",
            ErrorKind::Interrupted => "SIGINT, SIGTERM or SIGHUP stopped it between steps; what was done is printed or undone",
        }
    }
}

#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    /// What was being done; empty when the error is only its cause.
    context: String,
    source: Option<Cause>,
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
        source: impl Into<Cause>,
    ) -> Error {
        Error {
            kind,
            context: context.into(),
            source: Some(source.into()),
        }
    }

    pub fn usage(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Usage, context)
    }

    pub fn failed(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Failed, context)
    }

    /// A failure of the work whose whole story is its cause (the cause's
    /// text is the message; the cause stays the source).
    pub fn because(source: impl Into<Cause>) -> Error {
        Error::with_source(ErrorKind::Failed, "", source)
    }

    /// A failure of the work while doing `context`, caused by `source`.
    pub fn failed_with(context: impl Into<String>, source: impl Into<Cause>) -> Error {
        Error::with_source(ErrorKind::Failed, context, source)
    }

    pub fn interrupted(context: impl Into<String>) -> Error {
        Error::new(ErrorKind::Interrupted, context)
    }

    /// A configuration that does not load: `context` says which ("--config
    /// FILE", "--set KEY=VALUE"), `source` what is wrong.
    pub fn config(context: impl Into<String>, source: impl Into<Cause>) -> Error {
        Error::with_source(ErrorKind::Config, context, source)
    }

    /// A failed file or system call: `context` says on what.
    pub fn io(context: impl Into<String>, source: io::Error) -> Error {
        Error::with_source(ErrorKind::Failed, context, source)
    }

    /// The same error under an outer context: the kind stays, the error
    /// becomes the cause.
    pub fn context(self, context: impl Into<String>) -> Error {
        Error::with_source(self.kind, context, self)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The exit code of the process this error ends.
    pub fn exit_code(&self) -> u8 {
        self.kind.exit_code()
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

/// A message from a command that still speaks in messages: a failure of
/// the work (its kind is not known; the exit code is the same).
impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::failed(message)
    }
}

impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::failed(message)
    }
}

/// For functions that still return a message: the whole text, cause
/// included (the kind is lost, so nothing on an interrupt's path does this).
impl From<Error> for String {
    fn from(e: Error) -> String {
        e.to_string()
    }
}

/// The lifecycle library's errors keep their kind where it decides the
/// exit code (an interrupt between steps).
impl From<moneta_supervisor::Error> for Error {
    fn from(e: moneta_supervisor::Error) -> Error {
        let kind = match e.kind() {
            moneta_supervisor::ErrorKind::Interrupted => ErrorKind::Interrupted,
            _ => ErrorKind::Failed,
        };
        Error::with_source(kind, "", e)
    }
}

/// The model's: a configuration that does not check is a config error, a
/// size, op or workload that does not parse or fit is the command line's,
/// a request the model refuses itself is a failure.
impl From<moneta_model::Error> for Error {
    fn from(e: moneta_model::Error) -> Error {
        let kind = match e.kind() {
            moneta_model::ErrorKind::Config => ErrorKind::Config,
            moneta_model::ErrorKind::Parse | moneta_model::ErrorKind::Workload => ErrorKind::Usage,
            moneta_model::ErrorKind::Model => ErrorKind::Failed,
        };
        Error::with_source(kind, "", e)
    }
}

/// The NBD server's: a bad export or address is the command line's fault.
impl From<moneta_nbd::Error> for Error {
    fn from(e: moneta_nbd::Error) -> Error {
        let kind = match e.kind() {
            moneta_nbd::ErrorKind::Invalid => ErrorKind::Usage,
            _ => ErrorKind::Failed,
        };
        Error::with_source(kind, "", e)
    }
}

/// The exit-status section of the command-line reference, from the kinds.
pub fn exit_status_markdown() -> String {
    let mut out = String::from(
        "## Exit status\n\n\
         `moneta` exits 0 when the command did what it was asked; on an error it prints \
         `moneta: ` and the error, cause included, on stderr and exits with the code of the \
         error's kind. `moneta vm run` exits with the guest command's own code.\n\n\
         | code | kind | when |\n|---|---|---|\n",
    );
    for k in ErrorKind::ALL {
        out.push_str(&format!(
            "| {} | {} | {} |\n",
            k.exit_code(),
            format!("{k:?}").to_lowercase(),
            k.meaning()
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn the_text_carries_the_cause_and_the_chain_is_kept() {
        let io = io::Error::from_raw_os_error(libc::EACCES);
        let e = Error::io("creating /x", io).context("moneta up /mnt/m");
        assert_eq!(e.kind(), ErrorKind::Failed);
        assert!(
            e.to_string()
                .starts_with("moneta up /mnt/m: creating /x: Permission denied"),
            "{e}"
        );
        let inner = e.source().and_then(|s| s.downcast_ref::<Error>()).unwrap();
        let os = inner
            .source()
            .and_then(|s| s.downcast_ref::<io::Error>())
            .unwrap();
        assert_eq!(os.raw_os_error(), Some(libc::EACCES));
        assert_eq!(String::from(Error::usage("--nodes 0")), "--nodes 0");
    }

    #[test]
    fn an_interrupt_from_the_supervisor_keeps_its_kind_and_text() {
        let sup = moneta_supervisor::Error::new(
            moneta_supervisor::ErrorKind::Interrupted,
            "interrupted by SIGINT",
        );
        let e = Error::from(sup);
        assert_eq!(e.kind(), ErrorKind::Interrupted);
        assert_eq!(e.exit_code(), 130);
        assert_eq!(e.to_string(), "interrupted by SIGINT");
        let timeout = moneta_supervisor::Error::new(moneta_supervisor::ErrorKind::Timeout, "late");
        assert_eq!(Error::from(timeout).exit_code(), 2);
        // A message's wording never decides the code.
        assert_eq!(Error::from("interrupted".to_string()).exit_code(), 2);
    }

    #[test]
    fn a_bad_configuration_is_a_config_error_with_its_cause() {
        let cause = moneta_model::config::Config::preset("nope").unwrap_err();
        let e = Error::config("--preset nope", cause);
        assert_eq!(e.kind(), ErrorKind::Config);
        assert_eq!(e.exit_code(), 2);
        assert!(e
            .source()
            .unwrap()
            .is::<moneta_model::config::ConfigError>());
        assert!(e.to_string().starts_with("--preset nope: "), "{e}");
    }

    #[test]
    fn the_models_errors_keep_their_kind_and_cause() {
        let c = moneta_model::config::Config::preset("moneta").unwrap();
        let mut w = moneta_model::workload::Workload::xdd(
            moneta_model::workload::OpMix::Read,
            4096,
            0,
            1 << 20,
            moneta_model::workload::RunLimit::Ops(1),
            1,
        );
        let e = Error::from(moneta_model::experiment::run(&c, &w).unwrap_err());
        assert_eq!(e.kind(), ErrorKind::Usage);
        assert_eq!(e.to_string(), "the workload has no threads");
        assert!(e.source().unwrap().is::<moneta_model::Error>());
        w.groups[0].threads = 1;
        let e = Error::from(moneta_model::units::parse_size("4GB").unwrap_err());
        assert_eq!(e.kind(), ErrorKind::Usage);
        let e = Error::from(moneta_model::Error::from(
            moneta_model::config::Config::preset("nope").unwrap_err(),
        ));
        assert_eq!(e.kind(), ErrorKind::Config);
    }

    #[test]
    fn the_reference_table_lists_every_kind_with_its_code() {
        let md = exit_status_markdown();
        for k in ErrorKind::ALL {
            let row = format!(
                "| {} | {} |",
                k.exit_code(),
                format!("{k:?}").to_lowercase()
            );
            assert!(md.contains(&row), "{row} in {md}");
        }
    }
}
