//! The NBD wire protocol (NetworkBlockDevice/nbd `doc/proto.md`): fixed
//! newstyle negotiation and the transmission phase's messages, as plain
//! parsing and encoding functions over bytes. Nothing here trusts its input:
//! every length is checked before it is used, and anything malformed is an
//! error value (the connection is then answered with an error or closed).

use std::fmt;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1;
pub const FLAG_C_NO_ZEROES: u32 = 2;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

// Information types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands and their flags.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunks.
pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;

// Errors.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// The one metadata context served: every byte is allocated data.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Size constraints advertised in `NBD_INFO_BLOCK_SIZE` and enforced.
pub const MIN_BLOCK: u32 = 1;
pub const PREFERRED_BLOCK: u32 = 4096;
pub const MAX_PAYLOAD: u32 = 32 << 20;

/// Longest option payload accepted; longer ones close the connection (no
/// legitimate option comes near it, and reading it would let a client make
/// the server allocate at will).
pub const MAX_OPTION_BYTES: u32 = 64 << 10;

/// Longest export name or metadata query (the protocol's string limit).
pub const MAX_STRING: usize = 4096;

/// A malformed message. The caller answers with an error reply where the
/// protocol allows one, else closes the connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtoError(pub String);

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ProtoError {}

fn bad(message: impl Into<String>) -> ProtoError {
    ProtoError(message.into())
}

/// A cursor over untrusted bytes: every read is bounds-checked.
struct Take<'a> {
    bytes: &'a [u8],
}

impl<'a> Take<'a> {
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if n > self.bytes.len() {
            return Err(bad(format!(
                "{n} bytes wanted, {} left in the message",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(n);
        self.bytes = rest;
        Ok(head)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_be_bytes(self.bytes(2)?.try_into().expect("2")))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_be_bytes(self.bytes(4)?.try_into().expect("4")))
    }
    fn string(&mut self) -> Result<String, ProtoError> {
        let len = self.u32()? as usize;
        if len > MAX_STRING {
            return Err(bad(format!("string of {len} bytes (limit {MAX_STRING})")));
        }
        let raw = self.bytes(len)?;
        String::from_utf8(raw.to_vec()).map_err(|_| bad("string is not UTF-8"))
    }
    fn end(&self) -> Result<(), ProtoError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(bad(format!("{} trailing bytes", self.bytes.len())))
        }
    }
}

/// The data of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

pub fn parse_info(data: &[u8]) -> Result<InfoRequest, ProtoError> {
    let mut t = Take { bytes: data };
    let name = t.string()?;
    let count = t.u16()? as usize;
    let mut requests = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        requests.push(t.u16()?);
    }
    t.end()?;
    Ok(InfoRequest { name, requests })
}

/// The data of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaRequest {
    pub export: String,
    pub queries: Vec<String>,
}

pub fn parse_meta(data: &[u8]) -> Result<MetaRequest, ProtoError> {
    let mut t = Take { bytes: data };
    let export = t.string()?;
    let count = t.u32()? as usize;
    let mut queries = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        queries.push(t.string()?);
    }
    t.end()?;
    Ok(MetaRequest { export, queries })
}

/// Which of our contexts a query selects: `base:allocation` by its name,
/// or (listing only) by the namespace `base:` or an empty list.
pub fn meta_matches(queries: &[String], listing: bool) -> bool {
    if queries.is_empty() {
        return listing;
    }
    queries
        .iter()
        .any(|q| q == BASE_ALLOCATION || (listing && q == "base:"))
}

/// One transmission-phase request header (28 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

pub const REQUEST_BYTES: usize = 28;

pub fn parse_request(b: &[u8; REQUEST_BYTES]) -> Result<RequestHeader, ProtoError> {
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4"));
    if magic != REQUEST_MAGIC {
        return Err(bad(format!("request magic {magic:#x}")));
    }
    Ok(RequestHeader {
        flags: u16::from_be_bytes(b[4..6].try_into().expect("2")),
        kind: u16::from_be_bytes(b[6..8].try_into().expect("2")),
        cookie: u64::from_be_bytes(b[8..16].try_into().expect("8")),
        offset: u64::from_be_bytes(b[16..24].try_into().expect("8")),
        length: u32::from_be_bytes(b[24..28].try_into().expect("4")),
    })
}

/// A request header's 28 bytes (the client's side of [`parse_request`]).
pub fn encode_request(h: &RequestHeader) -> [u8; REQUEST_BYTES] {
    let mut b = [0u8; REQUEST_BYTES];
    b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    b[4..6].copy_from_slice(&h.flags.to_be_bytes());
    b[6..8].copy_from_slice(&h.kind.to_be_bytes());
    b[8..16].copy_from_slice(&h.cookie.to_be_bytes());
    b[16..24].copy_from_slice(&h.offset.to_be_bytes());
    b[24..28].copy_from_slice(&h.length.to_be_bytes());
    b
}

/// A client's option: `IHAVEOPT`, the option, its data's length and data.
pub fn option_request(option: u32, data: &[u8]) -> Vec<u8> {
    let mut m = IHAVEOPT.to_be_bytes().to_vec();
    m.extend_from_slice(&option.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    m
}

/// An option reply's 20-byte header: (option, reply type, data length).
pub fn parse_option_reply(b: &[u8; 20]) -> Result<(u32, u32, u32), ProtoError> {
    let magic = u64::from_be_bytes(b[0..8].try_into().expect("8"));
    if magic != REPLY_MAGIC {
        return Err(bad(format!("option reply magic {magic:#x}")));
    }
    Ok((
        u32::from_be_bytes(b[8..12].try_into().expect("4")),
        u32::from_be_bytes(b[12..16].try_into().expect("4")),
        u32::from_be_bytes(b[16..20].try_into().expect("4")),
    ))
}

/// A simple reply's 16 bytes: (error, cookie).
pub fn parse_simple_reply(b: &[u8; 16]) -> Result<(u32, u64), ProtoError> {
    let magic = u32::from_be_bytes(b[0..4].try_into().expect("4"));
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(bad(format!("simple reply magic {magic:#x}")));
    }
    Ok((
        u32::from_be_bytes(b[4..8].try_into().expect("4")),
        u64::from_be_bytes(b[8..16].try_into().expect("8")),
    ))
}

/// What to do with a request whose header parsed: either serve it, or
/// answer it with an error right away (the payload of a write, if any, has
/// to be read and dropped first). `size` is the export's, `read_only` its
/// mode, `structured` whether structured replies were negotiated.
///
/// `FUA` is accepted on every command: the server always advertises
/// `NBD_FLAG_SEND_FUA`, and the protocol (doc/proto.md, "Command flags")
/// says a server that did MUST accept the bit on all commands, even by
/// ignoring it. It matters only where the command writes (the reply then
/// waits for the flush); on READ, FLUSH, CACHE, BLOCK_STATUS and DISC there
/// is no write of the command's own to make durable.
pub fn check_request(
    h: &RequestHeader,
    size: u64,
    read_only: bool,
    structured: bool,
    meta: bool,
) -> Result<(), u32> {
    let allowed = CMD_FLAG_FUA
        | match h.kind {
            CMD_READ => {
                if structured {
                    CMD_FLAG_DF
                } else {
                    0
                }
            }
            CMD_WRITE | CMD_TRIM => 0,
            CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_FLUSH | CMD_CACHE | CMD_DISC => 0,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => return Err(EINVAL),
        };
    if h.flags & !allowed != 0 {
        return Err(EINVAL);
    }
    if h.kind == CMD_BLOCK_STATUS && !meta {
        return Err(EINVAL);
    }
    let writes = matches!(h.kind, CMD_WRITE | CMD_WRITE_ZEROES | CMD_TRIM);
    if writes && read_only {
        return Err(EPERM);
    }
    if matches!(h.kind, CMD_FLUSH | CMD_DISC) {
        return if h.offset == 0 && h.length == 0 {
            Ok(())
        } else {
            Err(EINVAL)
        };
    }
    if matches!(h.kind, CMD_READ | CMD_WRITE) && h.length > MAX_PAYLOAD {
        return Err(if h.kind == CMD_READ {
            EOVERFLOW
        } else {
            EINVAL
        });
    }
    if h.length == 0 && h.kind != CMD_CACHE {
        return Err(EINVAL);
    }
    let end = h.offset.checked_add(h.length as u64);
    if end.is_none_or(|e| e > size) {
        return Err(if matches!(h.kind, CMD_WRITE | CMD_WRITE_ZEROES) {
            ENOSPC
        } else {
            EINVAL
        });
    }
    Ok(())
}

/// An option reply header plus its data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

pub fn info_export(size: u64, flags: u16) -> Vec<u8> {
    let mut d = INFO_EXPORT.to_be_bytes().to_vec();
    d.extend_from_slice(&size.to_be_bytes());
    d.extend_from_slice(&flags.to_be_bytes());
    d
}

pub fn info_block_size() -> Vec<u8> {
    let mut d = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for v in [MIN_BLOCK, PREFERRED_BLOCK, MAX_PAYLOAD] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    d
}

pub fn info_string(kind: u16, s: &str) -> Vec<u8> {
    let mut d = kind.to_be_bytes().to_vec();
    d.extend_from_slice(s.as_bytes());
    d
}

pub fn length_prefixed(id: Option<u32>, s: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(8 + s.len());
    match id {
        Some(id) => d.extend_from_slice(&id.to_be_bytes()),
        None => d.extend_from_slice(&(s.len() as u32).to_be_bytes()),
    }
    d.extend_from_slice(s.as_bytes());
    d
}

pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out
}

/// A structured reply chunk's 20-byte header (its payload follows).
pub fn chunk_header(flags: u16, kind: u16, cookie: u64, length: u32) -> [u8; 20] {
    let mut out = [0u8; 20];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&length.to_be_bytes());
    out
}

/// A final error chunk with a message for people.
pub fn error_chunk(cookie: u64, error: u32, message: &str) -> Vec<u8> {
    let message = &message.as_bytes()[..message.len().min(1024)];
    let mut out = chunk_header(
        REPLY_FLAG_DONE,
        REPLY_TYPE_ERROR,
        cookie,
        6 + message.len() as u32,
    )
    .to_vec();
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// The block-status answer: one extent of allocated data (status 0)
/// covering the request (the device has no holes to report).
pub fn block_status_chunk(cookie: u64, length: u32) -> Vec<u8> {
    let mut out = chunk_header(REPLY_FLAG_DONE, REPLY_TYPE_BLOCK_STATUS, cookie, 12).to_vec();
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    out.extend_from_slice(&length.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn string(s: &str) -> Vec<u8> {
        length_prefixed(None, s)
    }

    #[test]
    fn info_and_meta_parse_and_reject_truncation() {
        let mut d = string("moneta");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        let i = parse_info(&d).unwrap();
        assert_eq!(i.name, "moneta");
        assert_eq!(i.requests, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        for cut in 0..d.len() {
            assert!(parse_info(&d[..cut]).is_err(), "cut at {cut}");
        }
        let mut m = string("");
        m.extend_from_slice(&1u32.to_be_bytes());
        m.extend_from_slice(&string(BASE_ALLOCATION));
        let p = parse_meta(&m).unwrap();
        assert!(meta_matches(&p.queries, false));
        assert!(!meta_matches(&["qemu:dirty-bitmap:x".into()], false));
        assert!(meta_matches(&[], true) && !meta_matches(&[], false));
        // A count far beyond the data is an error, not an allocation.
        let mut huge = string("x");
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta(&huge).is_err());
    }

    #[test]
    fn requests_are_checked_against_the_export() {
        let h = |kind, flags, offset, length| RequestHeader {
            flags,
            kind,
            cookie: 7,
            offset,
            length,
        };
        let size = 1 << 20;
        assert_eq!(
            check_request(&h(CMD_READ, 0, 0, 4096), size, false, true, false),
            Ok(())
        );
        assert_eq!(
            check_request(&h(CMD_READ, 0, size - 1, 2), size, false, true, false),
            Err(EINVAL)
        );
        assert_eq!(
            check_request(&h(CMD_WRITE, 0, size, 1), size, false, true, false),
            Err(ENOSPC)
        );
        assert_eq!(
            check_request(&h(CMD_WRITE, 0, 0, 1), size, true, true, false),
            Err(EPERM)
        );
        assert_eq!(
            check_request(&h(CMD_READ, 0, u64::MAX, 1), size, false, true, false),
            Err(EINVAL)
        );
        // FUA is advertised, so every command accepts it (even CACHE and
        // BLOCK_STATUS); other unknown bits are still refused.
        for kind in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_BLOCK_STATUS] {
            assert_eq!(
                check_request(&h(kind, CMD_FLAG_FUA, 0, 1), size, false, true, true),
                Ok(()),
                "command {kind}"
            );
        }
        for kind in [CMD_FLUSH, CMD_DISC] {
            assert_eq!(
                check_request(&h(kind, CMD_FLAG_FUA, 0, 0), size, false, true, true),
                Ok(()),
                "command {kind}"
            );
        }
        assert_eq!(
            check_request(&h(CMD_READ, 1 << 9, 0, 1), size, false, true, false),
            Err(EINVAL)
        );
        assert_eq!(
            check_request(&h(99, 0, 0, 1), size, false, true, false),
            Err(EINVAL)
        );
        assert_eq!(
            check_request(&h(CMD_BLOCK_STATUS, 0, 0, 1), size, false, true, false),
            Err(EINVAL)
        );
        assert_eq!(
            check_request(
                &h(CMD_READ, 0, 0, MAX_PAYLOAD + 1),
                u64::MAX,
                false,
                true,
                false
            ),
            Err(EOVERFLOW)
        );
    }

    #[test]
    fn client_encodings_round_trip_through_the_server_parsers() {
        let h = RequestHeader {
            flags: CMD_FLAG_FUA,
            kind: CMD_WRITE,
            cookie: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(parse_request(&encode_request(&h)), Ok(h));
        let reply: [u8; 16] = simple_reply(EIO, 9);
        assert_eq!(parse_simple_reply(&reply), Ok((EIO, 9)));
        let opt = option_reply(OPT_GO, REP_ACK, &[]);
        assert_eq!(
            parse_option_reply(&opt[..20].try_into().unwrap()),
            Ok((OPT_GO, REP_ACK, 0))
        );
        let o = option_request(OPT_GO, b"xy");
        assert_eq!(o.len(), 16 + 2);
        assert_eq!(&o[..8], &IHAVEOPT.to_be_bytes());
    }

    #[test]
    fn garbage_never_panics() {
        let seed = std::env::var("MONETA_NBD_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_u64 ^ std::process::id() as u64);
        eprintln!("proto garbage seed {seed} (MONETA_NBD_SEED replays it)");
        let mut x = seed | 1;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = parse_info(&bytes);
            let _ = parse_meta(&bytes);
            let mut header = [0u8; REQUEST_BYTES];
            header.iter_mut().for_each(|b| *b = next() as u8);
            if next() % 2 == 0 {
                header[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
            }
            if let Ok(h) = parse_request(&header) {
                let _ = check_request(&h, next(), next() % 2 == 0, true, true);
            }
        }
    }
}
