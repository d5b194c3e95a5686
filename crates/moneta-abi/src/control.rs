//! The control protocol (DESIGN "Processes in emulation", SPEC §3.1–3.4):
//! the messages a client (moneta-client, the shim, `moneta` commands) and the
//! daemon's control plane (`moneta_emu::control`) exchange, and their
//! framing. The control plane creates channels, hands their shared memory
//! to clients and installs the permissions that policy grants; this module
//! only says what goes over the socket.
//!
//! The protocol, on a Unix stream socket, is a sequence of frames: a 4-byte
//! little-endian length, then that many bytes of one JSON object. A request
//! is `{"op": ...}`, a reply `{"reply": ...}`. The reply to `hello` carries
//! the channel's memory descriptor (SCM_RIGHTS); an `open-file` request
//! carries the file's. The daemon keeps the channel as long as the
//! connection is open: a client that exits or is killed closes it, and its
//! channel, tags, records and files are freed.
//!
//! Every message is untrusted: a frame longer than [`MAX_FRAME_BYTES`], bad
//! JSON, an unknown operation or field, a request before `hello`, or one the
//! peer may not make gets an `error` reply and changes nothing.

use crate::error::{EmuError, ErrorKind};
use crate::stats::EngineStats;
use crate::sys;
use serde::{Deserialize, Serialize};
use std::os::fd::{OwnedFd, RawFd};

pub const PROTOCOL_VERSION: u32 = 3;
/// Longest run id a hello may carry.
pub const MAX_RUN_ID_BYTES: usize = 64;

/// Whether `id` is a run id a hello may carry.
pub fn valid_run_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_RUN_ID_BYTES
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// Largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Open a channel for this connection (first message).
    Hello {
        version: u32,
        /// The run this client belongs to (`moneta run` sets
        /// `MONETA_RUN_ID`): its counters are kept under it after the
        /// connection ends (`stats` with `run`). At most
        /// [`MAX_RUN_ID_BYTES`] of `A-Za-z0-9._-`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
    },
    /// Grant a raw device range to this channel (daemon owner only).
    GrantRaw {
        start: u64,
        len: u64,
        write: bool,
    },
    /// A soft or hard miss (SPEC §3.2): (re)install the record covering
    /// `[addr, addr + len)` if this channel was granted it.
    Resolve {
        addr: u64,
        len: u64,
        write: bool,
    },
    /// The device's statistics; with `run`, also that run's clients'
    /// counters (connections of the asker's uid; the owner sees every
    /// run), with `channel`, one open channel's.
    Stats {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        run: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        channel: Option<u16>,
    },
    /// Grant the file whose descriptor is attached (SCM_RIGHTS) to this
    /// channel (SPEC §3.4); the descriptor's access mode decides the bits.
    OpenFile {},
    /// A soft miss on an open file (SPEC §3.2): its extents over
    /// `[offset, offset + len)`, installing records for the written ones.
    MapFile {
        file_id: u32,
        offset: u64,
        len: u64,
    },
    /// A write about to fill holes of an open file (all of
    /// `[offset, offset + len)` inside the file's size): the daemon has the
    /// file system allocate them as unwritten extents (the kernel
    /// allocates and says which blocks, SPEC §3.4), then answers as
    /// `map-file`, with growth grants there. Refused (unauthorized) where
    /// the daemon makes no such grants.
    AllocateFile {
        file_id: u32,
        offset: u64,
        len: u64,
    },
    /// Revoke an open file: its records go, the daemon drops its descriptor.
    CloseFile {
        file_id: u32,
    },
    /// The file whose (writable) descriptor is attached is about to change
    /// layout from byte `from` on (truncate, fallocate): every channel's
    /// grants there are revoked before the reply, and soft misses on the
    /// file wait until `layout-done` with the returned token (or the end of
    /// this connection).
    LayoutChange {
        from: u64,
    },
    LayoutDone {
        token: u64,
    },
    /// This process is about to map the file whose descriptor is attached:
    /// every channel goes to the kernel for it while anyone maps it.
    Mapped {},
    /// This process unmapped the file whose descriptor is attached.
    Unmapped {},
    /// A SAN node: inject faults into its link to `peer` (every peer when
    /// absent): `moneta_wire::LinkFaults::parse` syntax, e.g.
    /// `drop=1%,corrupt=0.1%`, `partition`, `none` (daemon owner only).
    SanFault {
        #[serde(default)]
        peer: Option<u16>,
        faults: String,
    },
    /// A SAN node discards its writes in its split-brain slices (all, or
    /// `slice`): the partner's copy wins (`moneta san resolve --discard`;
    /// daemon owner only).
    SanDiscard {
        #[serde(default)]
        slice: Option<u64>,
    },
    /// A SAN node forces its outdated copies whose partner is unreachable
    /// (all, or `slice`) up to date (`moneta san resolve --force`; daemon
    /// owner only).
    SanForce {
        #[serde(default)]
        slice: Option<u64>,
    },
    /// A SAN node: why a request on `[addr, addr + len)` may have found no
    /// copy, as this node sees it (the slice, its holders, who is
    /// unreachable, this node's copy). libmoneta asks after a request
    /// failed for want of a reachable or up-to-date copy.
    SanExplain {
        addr: u64,
        len: u64,
    },
}

/// What a client learns about its channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChannelInfo {
    pub channel: u16,
    pub capacity_bytes: u64,
    pub tags: u32,
    pub slice_bytes: u64,
    pub dma_buffer_bytes: u64,
    pub preset: String,
    /// The device's whole configuration (a `Config` as JSON).
    pub config: serde_json::Value,
    /// Whether the daemon makes growth grants (direct writes into
    /// preallocated, unwritten extents): a client serves a file
    /// preallocated while new directly only then.
    #[serde(default)]
    pub growth: bool,
    /// Whether the daemon also allocates holes inside a file for a direct
    /// write (`allocate-file`; moneta-emu `growth`, "Growth into holes").
    #[serde(default)]
    pub growth_holes: bool,
}

/// A range this channel may access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    pub start: u64,
    pub len: u64,
    pub write: bool,
}

impl Extent {
    pub fn covers(&self, addr: u64, len: u64, write: bool) -> bool {
        (!write || self.write)
            && addr >= self.start
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.start + self.len)
    }
}

/// What the device lets a channel do to an extent of a file directly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DirectAccess {
    /// No record: use the kernel (pread/pwrite) for this range.
    None,
    Read,
    Write,
    ReadWrite,
}

impl DirectAccess {
    pub fn can_write(self) -> bool {
        matches!(self, DirectAccess::Write | DirectAccess::ReadWrite)
    }

    pub fn can_read(self) -> bool {
        matches!(self, DirectAccess::Read | DirectAccess::ReadWrite)
    }
}

/// One extent of a file (a `map-file` answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileExtent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Device address of byte `logical`.
    pub physical: u64,
    pub len: u64,
    /// Allocated but never written: reads as zeros, and the file system
    /// would not see data written here directly, so a writer allocates
    /// through the kernel first (SPEC §3.4).
    pub unwritten: bool,
    /// What the installed record allows: `none` for unwritten extents and
    /// for data the device cannot serve (not on the medium, not yet
    /// allocated, inline, encoded or encrypted); `read` for a writable
    /// file's extents shared with another file (writes go through the
    /// kernel, which copies on write).
    pub direct: DirectAccess,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Response {
    Channel(ChannelInfo),
    Granted(Extent),
    Stats(Box<EngineStats>),
    FileOpened {
        file_id: u32,
        size_bytes: u64,
        block_bytes: u64,
        /// What the descriptor's access mode allows.
        access: DirectAccess,
    },
    /// The extents overlapping `[offset, end)` of the request, in logical
    /// order (they may extend past it); ranges without one are holes. `end`
    /// is short of the requested end when the answer was cut at
    /// the daemon's FIEMAP batch (128)
    /// extents: ask again from `end`.
    FileExtents {
        end: u64,
        extents: Vec<FileExtent>,
    },
    FileClosed {
        file_id: u32,
    },
    ChangeBegun {
        token: u64,
    },
    Done {},
    /// What a request did, in words.
    Said {
        text: String,
    },
    Error {
        kind: ErrorKind,
        message: String,
        /// The kernel's error number, when a system call failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        errno: Option<i32>,
    },
}

impl Response {
    pub fn error(e: EmuError) -> Response {
        Response::Error {
            kind: e.kind,
            message: e.message,
            errno: e.errno,
        }
    }
}

/// Encode one message as a frame.
pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    let body = serde_json::to_vec(message).expect("control messages serialize");
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// Decode a frame body.
pub fn decode<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, EmuError> {
    serde_json::from_slice(body).map_err(|e| {
        EmuError::new(
            ErrorKind::Protocol,
            format!("malformed control message: {e}"),
        )
    })
}

/// A frame body and the descriptors that arrived with it.
pub type Frame = (Vec<u8>, Vec<OwnedFd>);

/// Reads frames (and the descriptors sent with them) from a stream socket.
pub struct FrameReader {
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
}

impl Default for FrameReader {
    fn default() -> Self {
        Self::new()
    }
}

impl FrameReader {
    pub fn new() -> Self {
        FrameReader {
            buf: Vec::new(),
            fds: Vec::new(),
        }
    }

    /// The next frame body and any descriptors received with it; Ok(None)
    /// when the peer closed the connection between frames.
    pub fn next(&mut self, socket: RawFd) -> Result<Option<Frame>, EmuError> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
                if len > MAX_FRAME_BYTES {
                    return Err(EmuError::new(
                        ErrorKind::Protocol,
                        format!("frame of {len} bytes exceeds the {MAX_FRAME_BYTES}-byte limit"),
                    ));
                }
                if self.buf.len() >= 4 + len {
                    let body = self.buf[4..4 + len].to_vec();
                    self.buf.drain(..4 + len);
                    return Ok(Some((body, std::mem::take(&mut self.fds))));
                }
            }
            let mut chunk = [0u8; 8192];
            let (n, fds) = sys::recv_with_fds(socket, &mut chunk)
                .map_err(|e| EmuError::io("reading the control socket", e))?;
            self.fds.extend(fds);
            if self.fds.len() > sys::MAX_FDS_PER_MESSAGE {
                return Err(EmuError::new(ErrorKind::Protocol, "too many descriptors"));
            }
            if n == 0 {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(EmuError::new(
                        ErrorKind::Protocol,
                        "connection closed mid-frame",
                    ))
                };
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn requests_round_trip_and_strangers_are_refused() {
        let r = Request::GrantRaw {
            start: 4096,
            len: 1 << 20,
            write: true,
        };
        let frame = encode(&r);
        assert_eq!(
            u32::from_le_bytes(frame[..4].try_into().unwrap()) as usize,
            frame.len() - 4
        );
        assert_eq!(decode::<Request>(&frame[4..]).unwrap(), r);
        for r in [
            Request::OpenFile {},
            Request::MapFile {
                file_id: 3,
                offset: 1 << 40,
                len: 4096,
            },
            Request::AllocateFile {
                file_id: 3,
                offset: 8192,
                len: 4096,
            },
            Request::CloseFile { file_id: 3 },
        ] {
            assert_eq!(decode::<Request>(&encode(&r)[4..]).unwrap(), r);
        }
        let extents = Response::FileExtents {
            end: 8192,
            extents: vec![FileExtent {
                logical: 0,
                physical: 1 << 20,
                len: 4096,
                unwritten: false,
                direct: DirectAccess::ReadWrite,
            }],
        };
        let body = serde_json::to_string(&extents).unwrap();
        assert!(body.contains(r#""reply":"file-extents""#), "{body}");
        assert!(body.contains(r#""direct":"read-write""#), "{body}");
        assert_eq!(decode::<Response>(body.as_bytes()).unwrap(), extents);
        for bad in [
            &br#"{"op":"grant-raw","start":1}"#[..],
            br#"{"op":"format-disk"}"#,
            br#"{"op":"stats","extra":1}"#,
            br#"{"op":"map-file","file_id":1,"offset":0}"#,
            br#"{"op":"close-file","file_id":-1}"#,
            br#"{"op":"grant-raw","start":-1,"len":1,"write":true}"#,
            b"\xff\xfe",
            b"",
        ] {
            let e = decode::<Request>(bad).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Protocol, "{bad:?}");
        }
    }

    #[test]
    fn extents_cover_only_inside_and_with_the_right_access() {
        let e = Extent {
            start: 100,
            len: 50,
            write: false,
        };
        assert!(e.covers(100, 50, false));
        assert!(!e.covers(99, 2, false));
        assert!(!e.covers(140, 11, false));
        assert!(!e.covers(100, 1, true));
        assert!(!e.covers(120, u64::MAX, false));
    }

    proptest! {
        /// The control protocol's decoder never panics on arbitrary bytes,
        /// and anything it accepts re-encodes to something it accepts again.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(r) = decode::<Request>(&body) {
                let again = encode(&r);
                prop_assert_eq!(decode::<Request>(&again[4..]).unwrap(), r);
            }
            let _ = decode::<Response>(&body);
        }

        #[test]
        fn decoding_mutated_requests_never_panics(start in any::<u64>(), len in any::<u64>(), write in any::<bool>(), flip in 0usize..64, byte in any::<u8>()) {
            let mut frame = encode(&Request::Resolve { addr: start, len, write });
            let i = 4 + flip % (frame.len() - 4);
            frame[i] = byte;
            let _ = decode::<Request>(&frame[4..]);
        }
    }
}
