//! # moneta-nbd
//!
//! An NBD server for the emulated Moneta (issue "Standard clients"):
//! standard block clients (nbdinfo, nbdcopy, qemu-img, fio's nbd engine,
//! nbdfuse and through it the kernel) reach the device through the same
//! channels, device model and wall clock as the user-space library, so they
//! see the preset's timing and move real bytes.
//!
//! - [`proto`]: the wire protocol (NetworkBlockDevice/nbd `doc/proto.md`)
//!   as checked parsing and encoding.
//! - [`server`]: listeners, fixed newstyle negotiation, limits.
//! - `transmission`: the transmission phase, inline on the reactor that
//!   turns the device (each connection's requests read, submitted on its
//!   channel and answered in the reactor's loop; no thread per connection).
//! - [`error`]: the crate's error type (kind, context, cause).
//! - [`client`]: a minimal client (GO, read, write, flush), the initiator
//!   of the distributed sort's iSCSI-like path.

pub mod client;
pub mod connection;
pub mod error;
pub mod proto;
pub mod server;
mod transmission;

pub use client::NbdClient;

pub use connection::{Export, Negotiated};
pub use error::{Error, ErrorKind};
pub use server::{
    negotiate, negotiate_with, Limits, Listen, NbdServer, LOCAL_CHANNEL_RESERVE,
    MAX_CONNECTIONS_CAP,
};

/// The NBD URI of export `export` on the Unix socket `socket`
/// (`nbd+unix:///EXPORT?socket=PATH`, NetworkBlockDevice/nbd
/// `doc/uri.md`), with every byte outside RFC 3986's unreserved set and
/// `/` percent-encoded: a path holding `%`, `_`-escapes, spaces, `&` or
/// `#` reaches the tools as the same path.
pub fn unix_uri(export: &str, socket: &std::path::Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    fn escape(bytes: &[u8]) -> String {
        let mut out = String::with_capacity(bytes.len());
        for &b in bytes {
            if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
        out
    }
    format!(
        "nbd+unix:///{}?socket={}",
        escape(export.as_bytes()),
        escape(socket.as_os_str().as_bytes())
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn unix_uris_escape_what_a_uri_would_misread() {
        let uri = super::unix_uri("moneta", std::path::Path::new("/run/a b/_x%5Fy&z#/s.sock"));
        assert_eq!(
            uri,
            "nbd+unix:///moneta?socket=/run/a%20b/_x%255Fy%26z%23/s.sock"
        );
    }
}
