//! A minimal NBD client (NetworkBlockDevice/nbd `doc/proto.md`): fixed
//! newstyle negotiation with `NBD_OPT_GO`, then simple replies to read,
//! write and flush, one request at a time. It is the initiator of the
//! iSCSI-like path of the distributed sort (SPEC §4.4: a host reaches
//! another host's storage through target software on that host), not a
//! general client: no structured replies, no TLS, no pipelining.
//!
//! Every reply is checked (magic, cookie, lengths); a server error is an
//! error value naming the request.

use crate::error::{Error, ErrorKind, Result};
use crate::proto::{self, RequestHeader};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// One negotiated connection to one export.
pub struct NbdClient<S: Read + Write> {
    stream: S,
    size: u64,
    transmission_flags: u16,
    next_cookie: u64,
}

fn io_error(what: &str, e: std::io::Error) -> Error {
    Error::io(format!("NBD {what}"), e)
}

impl NbdClient<TcpStream> {
    /// Connect to `addr` (HOST:PORT) and open `export`. `timeout` bounds
    /// the connect and every later read and write.
    pub fn connect_tcp(addr: &str, export: &str, timeout: Duration) -> Result<Self> {
        let socket = addr
            .to_socket_addrs()
            .map_err(|e| Error::io(format!("NBD server {addr}"), e))?
            .next()
            .ok_or_else(|| Error::invalid(format!("NBD server {addr}: no address")))?;
        let stream = TcpStream::connect_timeout(&socket, timeout)
            .map_err(|e| Error::io(format!("connecting to NBD server {addr}"), e))?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|_| stream.set_write_timeout(Some(timeout)))
            .and_then(|_| stream.set_nodelay(true))
            .map_err(|e| Error::io(format!("NBD server {addr}"), e))?;
        Self::negotiate(stream, export).map_err(|e| e.context(format!("NBD server {addr}")))
    }
}

impl<S: Read + Write> NbdClient<S> {
    /// Fixed newstyle handshake and `NBD_OPT_GO` for `export`.
    pub fn negotiate(mut stream: S, export: &str) -> Result<Self> {
        let mut hello = [0u8; 18];
        stream
            .read_exact(&mut hello)
            .map_err(|e| io_error("handshake", e))?;
        let magic = u64::from_be_bytes(hello[0..8].try_into().expect("8"));
        let opt = u64::from_be_bytes(hello[8..16].try_into().expect("8"));
        let flags = u16::from_be_bytes(hello[16..18].try_into().expect("2"));
        if magic != proto::NBDMAGIC || opt != proto::IHAVEOPT {
            return Err(Error::protocol(format!(
                "not a newstyle NBD server (magic {magic:#x} {opt:#x})"
            )));
        }
        if flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
            return Err(Error::protocol("the server does not speak fixed newstyle"));
        }
        let mut client_flags = proto::FLAG_C_FIXED_NEWSTYLE;
        if flags & proto::FLAG_NO_ZEROES != 0 {
            client_flags |= proto::FLAG_C_NO_ZEROES;
        }
        let mut go = proto::length_prefixed(None, export);
        go.extend_from_slice(&0u16.to_be_bytes());
        let mut hello = client_flags.to_be_bytes().to_vec();
        hello.extend(proto::option_request(proto::OPT_GO, &go));
        stream
            .write_all(&hello)
            .map_err(|e| io_error("handshake", e))?;
        let mut export_info = None;
        // Bounded: the server sends a few INFO replies, then ACK or an error.
        for _ in 0..64 {
            let mut h = [0u8; 20];
            stream
                .read_exact(&mut h)
                .map_err(|e| io_error("option reply", e))?;
            let (option, kind, len) = proto::parse_option_reply(&h)?;
            if option != proto::OPT_GO || len > proto::MAX_OPTION_BYTES {
                return Err(Error::protocol(format!(
                    "unexpected option reply (option {option}, {len} B)"
                )));
            }
            let mut data = vec![0u8; len as usize];
            stream
                .read_exact(&mut data)
                .map_err(|e| io_error("option reply", e))?;
            match kind {
                proto::REP_INFO
                    if data.len() == 12
                        && u16::from_be_bytes([data[0], data[1]]) == proto::INFO_EXPORT =>
                {
                    export_info = Some((
                        u64::from_be_bytes(data[2..10].try_into().expect("8")),
                        u16::from_be_bytes([data[10], data[11]]),
                    ));
                }
                proto::REP_ACK => {
                    let (size, transmission_flags) = export_info.ok_or_else(|| {
                        Error::protocol("the server acknowledged GO without the export's size")
                    })?;
                    return Ok(NbdClient {
                        stream,
                        size,
                        transmission_flags,
                        next_cookie: 1,
                    });
                }
                k if k & (1 << 31) != 0 => {
                    let text = String::from_utf8_lossy(&data);
                    return Err(Error::refused(format!(
                        "export '{export}' refused (reply {k:#x}): {text}"
                    )));
                }
                _ => {}
            }
        }
        Err(Error::protocol("the server sent too many option replies"))
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn read_only(&self) -> bool {
        self.transmission_flags & proto::FLAG_READ_ONLY != 0
    }

    /// Send one request and wait for its simple reply; reads fill `data`.
    fn exchange(&mut self, kind: u16, offset: u64, payload: Payload<'_>) -> Result<()> {
        let length = match &payload {
            Payload::None => 0,
            Payload::Out(b) => b.len(),
            Payload::In(b) => b.len(),
        };
        let length = u32::try_from(length)
            .ok()
            .filter(|&l| l <= proto::MAX_PAYLOAD)
            .ok_or_else(|| {
                Error::invalid(format!(
                    "NBD request of {length} B exceeds the protocol's limit"
                ))
            })?;
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let header = proto::encode_request(&RequestHeader {
            flags: 0,
            kind,
            cookie,
            offset,
            length,
        });
        let what = |e| io_error(&format!("request {kind} of {length} B at {offset}"), e);
        self.stream.write_all(&header).map_err(what)?;
        if let Payload::Out(b) = &payload {
            self.stream.write_all(b).map_err(what)?;
        }
        let mut reply = [0u8; 16];
        self.stream.read_exact(&mut reply).map_err(what)?;
        let (error, got) = proto::parse_simple_reply(&reply)?;
        if got != cookie {
            return Err(Error::protocol(format!(
                "NBD reply for cookie {got}, expected {cookie}"
            )));
        }
        if error != 0 {
            return Err(Error::new(
                ErrorKind::Refused,
                format!("NBD server error {error} for request {kind} of {length} B at {offset}"),
            ));
        }
        if let Payload::In(b) = payload {
            self.stream.read_exact(b).map_err(what)?;
        }
        Ok(())
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.exchange(proto::CMD_READ, offset, Payload::In(buf))
    }

    pub fn write(&mut self, offset: u64, buf: &[u8]) -> Result<()> {
        self.exchange(proto::CMD_WRITE, offset, Payload::Out(buf))
    }

    pub fn flush(&mut self) -> Result<()> {
        self.exchange(proto::CMD_FLUSH, 0, Payload::None)
    }

    /// Say goodbye (`NBD_CMD_DISC` has no reply).
    pub fn disconnect(mut self) {
        let header = proto::encode_request(&RequestHeader {
            flags: 0,
            kind: proto::CMD_DISC,
            cookie: self.next_cookie,
            offset: 0,
            length: 0,
        });
        let _ = self.stream.write_all(&header);
    }
}

enum Payload<'a> {
    None,
    Out(&'a [u8]),
    In(&'a mut [u8]),
}
