//! A connection's parts, shared by negotiation and the listeners
//! (server.rs) and the transmission phase (transmission.rs): the exports
//! it may ask for, the stream it came on, what negotiation settled, and
//! its place in the server's connection limits and counters.

use crate::error::{Error, Result};
use crate::proto;
use moneta_model::units::parse_bytes;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A named range of the device served over NBD.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub start: u64,
    pub size: u64,
    pub read_only: bool,
}

impl Export {
    /// Parse `NAME[:START:LEN][:ro]` (sizes in bytes or with K/M/G/T
    /// suffixes) against a device of `capacity` bytes.
    pub fn parse(spec: &str, capacity: u64) -> Result<Export> {
        let bytes =
            |s: &str| parse_bytes(s).map_err(|e| Error::invalid(format!("export '{spec}': {e}")));
        let mut parts: Vec<&str> = spec.split(':').collect();
        let read_only = parts.last() == Some(&"ro");
        if read_only {
            parts.pop();
        }
        let (name, start, size) = match parts.as_slice() {
            [name] => (*name, 0, capacity),
            [name, start, len] => (*name, bytes(start)?, bytes(len)?),
            _ => {
                return Err(Error::invalid(format!(
                    "export '{spec}': expected NAME, NAME:ro, NAME:START:LEN or NAME:START:LEN:ro"
                )))
            }
        };
        if name.is_empty() || name.len() > proto::MAX_STRING {
            return Err(Error::invalid(format!(
                "export '{spec}': the name must be 1..=4096 bytes"
            )));
        }
        if size == 0 || start.checked_add(size).is_none_or(|e| e > capacity) {
            return Err(Error::invalid(format!(
                "export '{spec}': [{start}, +{size}) is empty or outside the device's {capacity} bytes"
            )));
        }
        Ok(Export {
            name: name.to_string(),
            description: format!("emulated Moneta, bytes [{start}, {})", start + size),
            start,
            size,
            read_only,
        })
    }

    pub(crate) fn transmission_flags(&self, structured: bool) -> u16 {
        let mut f = proto::FLAG_HAS_FLAGS
            | proto::FLAG_SEND_FLUSH
            | proto::FLAG_SEND_FUA
            | proto::FLAG_SEND_TRIM
            | proto::FLAG_SEND_WRITE_ZEROES
            | proto::FLAG_SEND_FAST_ZERO
            | proto::FLAG_CAN_MULTI_CONN
            | proto::FLAG_SEND_CACHE;
        if structured {
            f |= proto::FLAG_SEND_DF;
        }
        if self.read_only {
            f |= proto::FLAG_READ_ONLY;
        }
        f
    }
}

/// What negotiation settled on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub export: usize,
    pub structured: bool,
    pub meta: bool,
}

/// A connected client, over TCP or a Unix socket.
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    pub(crate) fn set_nonblocking(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(true),
            Stream::Unix(s) => s.set_nonblocking(true),
        }
    }
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(t),
            Stream::Unix(s) => s.set_read_timeout(t),
        }
    }
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(t),
            Stream::Unix(s) => s.set_write_timeout(t),
        }
    }
    pub(crate) fn fd(&self) -> std::os::fd::RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
    pub(crate) fn shutdown(&self) {
        let _ = match self {
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Counters over the server's life (for tests and the log).
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub connections: AtomicUsize,
    /// Connections not served: no thread, or over the connection limit.
    pub refused: AtomicUsize,
    pub commands: AtomicUsize,
    /// Connections now holding a slot of the limit (and, after GO, a channel).
    pub open: AtomicUsize,
    /// Over-limit clients now being told so.
    pub refusing: AtomicUsize,
    /// Negotiations ended by the deadline.
    pub negotiation_timeouts: AtomicUsize,
    /// Connections closed for being idle.
    pub idle_closed: AtomicUsize,
    /// Connections whose client hung up with requests unanswered.
    pub hung_up: AtomicUsize,
    /// Requests run again after a hard miss (the device had evicted the
    /// connection's permission record), off the reactor.
    pub recovered: AtomicUsize,
}

/// One place in a gauge of [`ServerCounters`] (`open` or `refusing`),
/// given back when the connection ends (after its channel closed).
pub(crate) struct Slot {
    counters: Arc<ServerCounters>,
    pub(crate) refusing: bool,
}

impl Slot {
    fn gauge(counters: &ServerCounters, refusing: bool) -> &AtomicUsize {
        if refusing {
            &counters.refusing
        } else {
            &counters.open
        }
    }

    pub(crate) fn take(counters: &Arc<ServerCounters>, refusing: bool, max: usize) -> Option<Slot> {
        Slot::gauge(counters, refusing)
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(Slot {
            counters: counters.clone(),
            refusing,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        Slot::gauge(&self.counters, self.refusing).fetch_sub(1, Ordering::AcqRel);
    }
}
