//! The control plane (DESIGN "Processes in emulation", SPEC §3.1–3.4): the
//! trusted side that creates channels, hands their shared memory to clients
//! and installs the permissions that policy grants. It decides nothing about
//! policy itself. Two kinds of grant exist: raw address ranges for the
//! daemon's owner (benchmarks), and files, whose policy is the kernel's: a
//! client opens a file on the file system on this device and passes the
//! descriptor with `open-file`; `map-file` (the soft miss) grants the
//! extents FIEMAP reports; `close-file` revokes them ([`crate::files`]).
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

use crate::channel::{ChannelMemory, CHANNEL_TAGS, DMA_BUFFER_BYTES, SLICE_BYTES};
use crate::engine::{raw_record, Engine, EngineStats};
use crate::error::{EmuError, ErrorKind};
use crate::file_table::{ChangeOwner, FileTable};
use crate::files::{GrantedFile, InodeId, MAX_OPEN_FILES};
use crate::protection::{READ, WRITE};
use crate::sys::{self, PeerCredentials};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub const PROTOCOL_VERSION: u32 = 3;
/// Largest frame either side accepts.
pub const MAX_FRAME_BYTES: usize = 64 << 10;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Open a channel for this connection (first message).
    Hello {
        version: u32,
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
    Stats {},
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
    pub fn from_perms(perms: u8) -> DirectAccess {
        match (perms & READ != 0, perms & WRITE != 0) {
            (false, false) => DirectAccess::None,
            (true, false) => DirectAccess::Read,
            (false, true) => DirectAccess::Write,
            (true, true) => DirectAccess::ReadWrite,
        }
    }

    /// The permission bits of its records.
    pub fn perms(self) -> u8 {
        match self {
            DirectAccess::None => 0,
            DirectAccess::Read => READ,
            DirectAccess::Write => WRITE,
            DirectAccess::ReadWrite => READ | WRITE,
        }
    }

    pub fn can_write(self) -> bool {
        self.perms() & WRITE != 0
    }

    pub fn can_read(self) -> bool {
        self.perms() & READ != 0
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
    /// [`sys::FIEMAP_BATCH`] extents: ask again from `end`.
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

/// Layout changes one session may announce at once.
pub const MAX_CHANGES_PER_SESSION: usize = 64;

/// One client connection's state on the trusted side.
pub struct Session {
    pub peer: PeerCredentials,
    pub channel: Option<u16>,
    /// Unique among the daemon's sessions.
    id: u64,
    /// Files granted to the channel (kept in the plane's [`FileTable`]).
    files: BTreeSet<u32>,
    last_file_id: u32,
    /// Layout changes this session announced and has not ended: token → inode.
    changes: BTreeMap<u64, InodeId>,
    last_token: u64,
}

impl Session {
    pub fn new(peer: PeerCredentials) -> Session {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Session {
            peer,
            channel: None,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            files: BTreeSet::new(),
            last_file_id: 0,
            changes: BTreeMap::new(),
            last_token: 0,
        }
    }
}

/// The trusted side: a device, who owns it, and what each channel was granted.
pub struct ControlPlane {
    engine: Arc<Engine>,
    owner_uid: u32,
    /// The OS's copy of each channel's grants (SPEC §3.3: the OS maintains
    /// the records; the device's table may evict them).
    grants: Mutex<HashMap<u16, Vec<Extent>>>,
    /// Every channel's file grants, by inode.
    files: Arc<FileTable>,
    /// A SAN node's fault injector (`moneta san fault`).
    san_faults: Mutex<Option<moneta_wire::FaultHandle>>,
    /// A file that serves the whole medium from its byte 0 besides the
    /// image (the nbdfuse file of `moneta up --kernel-path device`): a file
    /// system on a loop device over it is granted as one over the image.
    image_alias: Mutex<Option<std::path::PathBuf>>,
}

impl ControlPlane {
    pub fn new(engine: Arc<Engine>, owner_uid: u32) -> Self {
        ControlPlane {
            files: FileTable::new(engine.clone()),
            engine,
            owner_uid,
            grants: Mutex::new(HashMap::new()),
            san_faults: Mutex::new(None),
            image_alias: Mutex::new(None),
        }
    }

    /// Grant files on a loop device over `path` as over the image: the
    /// daemon's owner vouches that `path` serves this device's whole medium
    /// from byte 0 (`moneta up --kernel-path device` passes its nbdfuse
    /// file, which reads and writes the daemon's own NBD export).
    pub fn set_image_alias(&self, path: std::path::PathBuf) {
        *self.image_alias.lock().expect("alias") = Some(path);
    }

    /// (st_dev, st_ino) of every file whose loop devices carry the medium.
    fn medium_files(&self) -> Vec<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        let mut ids: Vec<(u64, u64)> = self.engine.medium().image_identity().into_iter().collect();
        if let Some(alias) = self.image_alias.lock().expect("alias").as_ref() {
            if let Ok(m) = std::fs::metadata(alias) {
                ids.push((m.dev(), m.ino()));
            }
        }
        ids
    }

    /// The handle of the faults this SAN node's link injects.
    pub fn set_san_faults(&self, handle: moneta_wire::FaultHandle) {
        *self.san_faults.lock().expect("faults") = Some(handle);
    }

    fn owner_only(&self, session: &Session, what: &str) -> Result<(), EmuError> {
        if session.peer.uid != self.owner_uid && session.peer.uid != 0 {
            return Err(EmuError::new(
                ErrorKind::Unauthorized,
                format!(
                    "{what} are for the daemon's owner (uid {}), not uid {}",
                    self.owner_uid, session.peer.uid
                ),
            ));
        }
        Ok(())
    }

    /// The table of granted files (layout-change watchers report to it).
    pub fn file_table(&self) -> &Arc<FileTable> {
        &self.files
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// Answer one request. A `hello` also returns the memory to send along.
    pub fn handle(
        &self,
        session: &mut Session,
        request: Request,
    ) -> (Response, Option<Arc<ChannelMemory>>) {
        self.handle_with_fd(session, request, None)
    }

    /// Answer one request that arrived with a descriptor (`open-file`
    /// needs one; the others ignore it, and it is closed).
    pub fn handle_with_fd(
        &self,
        session: &mut Session,
        request: Request,
        fd: Option<OwnedFd>,
    ) -> (Response, Option<Arc<ChannelMemory>>) {
        match self.try_handle(session, request, fd) {
            Ok(r) => r,
            Err(e) => (Response::error(e), None),
        }
    }

    fn try_handle(
        &self,
        session: &mut Session,
        request: Request,
        fd: Option<OwnedFd>,
    ) -> Result<(Response, Option<Arc<ChannelMemory>>), EmuError> {
        if let Request::Hello { version } = request {
            if version != PROTOCOL_VERSION {
                return Err(EmuError::new(
                    ErrorKind::Protocol,
                    format!("protocol version {version} is not supported (this daemon speaks {PROTOCOL_VERSION})"),
                ));
            }
            if session.channel.is_some() {
                return Err(EmuError::new(
                    ErrorKind::Protocol,
                    "this connection already has a channel",
                ));
            }
            let (channel, memory) = self.engine.create_channel()?;
            session.channel = Some(channel);
            self.files.session_started(session.id, session.peer.pid);
            let c = self.engine.config();
            let info = ChannelInfo {
                channel,
                capacity_bytes: self.engine.address_space_bytes(),
                tags: CHANNEL_TAGS as u32,
                slice_bytes: SLICE_BYTES as u64,
                dma_buffer_bytes: DMA_BUFFER_BYTES as u64,
                preset: c.name.clone(),
                config: c.to_json(),
            };
            return Ok((Response::Channel(info), Some(memory)));
        }
        let channel = session
            .channel
            .ok_or_else(|| EmuError::new(ErrorKind::Protocol, "send hello first"))?;
        match request {
            Request::Hello { .. } => unreachable!("handled above"),
            Request::SanFault { peer, faults } => {
                self.owner_only(session, "SAN faults")?;
                let parsed = moneta_wire::LinkFaults::parse(&faults)
                    .map_err(|e| EmuError::new(ErrorKind::Protocol, e.to_string()))?;
                let guard = self.san_faults.lock().expect("faults");
                let handle = guard.as_ref().ok_or_else(|| {
                    EmuError::new(ErrorKind::Protocol, "this daemon is not a SAN node")
                })?;
                match peer {
                    Some(p) => handle.set_link(p, parsed),
                    None => handle.set_all(parsed),
                }
                Ok((Response::Done {}, None))
            }
            Request::SanExplain { addr, len } => match self.engine.san_explain(addr, len)? {
                Some(text) => Ok((Response::Said { text }, None)),
                None => Err(EmuError::new(
                    ErrorKind::Protocol,
                    "this daemon is not a SAN node",
                )),
            },
            Request::SanDiscard { slice } => {
                self.owner_only(session, "SAN split-brain resolution")?;
                let text = self.engine.san_discard(slice.map(|s| s as usize))?;
                Ok((Response::Said { text }, None))
            }
            Request::SanForce { slice } => {
                self.owner_only(session, "forcing a SAN copy up to date")?;
                let text = self.engine.san_force(slice.map(|s| s as usize))?;
                Ok((Response::Said { text }, None))
            }
            Request::GrantRaw { start, len, write } => {
                self.owner_only(session, "raw grants")?;
                let capacity = self.engine.address_space_bytes();
                if len == 0 || start.checked_add(len).is_none_or(|end| end > capacity) {
                    return Err(EmuError::new(
                        ErrorKind::Protocol,
                        format!(
                            "range [{start}, +{len}) is not inside the device's {capacity} bytes"
                        ),
                    ));
                }
                let extent = Extent { start, len, write };
                self.install(channel, extent)?;
                self.grants
                    .lock()
                    .expect("grants")
                    .entry(channel)
                    .or_default()
                    .push(extent);
                Ok((Response::Granted(extent), None))
            }
            Request::Resolve { addr, len, write } => {
                let raw = self
                    .grants
                    .lock()
                    .expect("grants")
                    .get(&channel)
                    .and_then(|g| g.iter().rev().find(|e| e.covers(addr, len, write)).copied());
                if let Some(extent) = raw {
                    self.install(channel, extent)?;
                    return Ok((Response::Granted(extent), None));
                }
                let extent = self
                    .files
                    .resolve(channel, &session.files, addr, len, write)
                    .ok_or_else(|| {
                        EmuError::new(
                            ErrorKind::Unauthorized,
                            format!(
                                "channel {channel} has no {} grant covering [{addr}, +{len})",
                                if write { "write" } else { "read" }
                            ),
                        )
                    })?;
                Ok((Response::Granted(extent), None))
            }
            Request::Stats {} => {
                let mut stats = self.engine.stats()?;
                stats.files = self.files.stats();
                stats.guard = self.files.guard();
                Ok((Response::Stats(Box::new(stats)), None))
            }
            Request::OpenFile {} => {
                let fd = fd.ok_or_else(|| {
                    EmuError::new(
                        ErrorKind::Protocol,
                        "open-file needs the file's descriptor attached (SCM_RIGHTS)",
                    )
                })?;
                // A limit of the channel, not a bad request: refused, so a
                // lazy client (the shim) serves the file through the kernel.
                if session.files.len() >= MAX_OPEN_FILES {
                    return Err(EmuError::new(
                        ErrorKind::Unauthorized,
                        format!("this channel already has {MAX_OPEN_FILES} files open"),
                    ));
                }
                let file_id = session.last_file_id.checked_add(1).ok_or_else(|| {
                    EmuError::new(ErrorKind::Protocol, "this channel ran out of file ids")
                })?;
                let key = (u64::from(channel) << 32) | u64::from(file_id);
                let (file, opened) = GrantedFile::open(fd, key, &self.medium_files())?;
                session.last_file_id = file_id;
                self.files.open(channel, file_id, file);
                session.files.insert(file_id);
                Ok((
                    Response::FileOpened {
                        file_id,
                        size_bytes: opened.size_bytes,
                        block_bytes: opened.block_bytes,
                        access: opened.access,
                    },
                    None,
                ))
            }
            Request::MapFile {
                file_id,
                offset,
                len,
            } => {
                if !session.files.contains(&file_id) {
                    return Err(not_open(file_id));
                }
                let (end, extents) = self.files.map(channel, file_id, offset, len)?;
                Ok((Response::FileExtents { end, extents }, None))
            }
            Request::CloseFile { file_id } => {
                if !session.files.remove(&file_id) {
                    return Err(not_open(file_id));
                }
                self.files.close(channel, file_id)?;
                Ok((Response::FileClosed { file_id }, None))
            }
            Request::LayoutChange { from } => {
                let fd = needs_fd(fd, "layout-change")?;
                if session.changes.len() >= MAX_CHANGES_PER_SESSION {
                    return Err(EmuError::new(
                        ErrorKind::Protocol,
                        format!("this session already has {MAX_CHANGES_PER_SESSION} layout changes in progress"),
                    ));
                }
                let inode = writable_file(&fd)?;
                session.last_token += 1;
                let token = session.last_token;
                let owner = ChangeOwner::Session {
                    session: session.id,
                    token,
                };
                self.files.begin_change(inode, owner, from, None)?;
                session.changes.insert(token, inode);
                Ok((Response::ChangeBegun { token }, None))
            }
            Request::LayoutDone { token } => {
                let inode = session.changes.remove(&token).ok_or_else(|| {
                    EmuError::new(
                        ErrorKind::Protocol,
                        format!("no layout change {token} in progress on this connection"),
                    )
                })?;
                let owner = ChangeOwner::Session {
                    session: session.id,
                    token,
                };
                self.files.end_change(inode, owner);
                Ok((Response::Done {}, None))
            }
            Request::Mapped {} => {
                self.files.mapped(needs_fd(fd, "mapped")?)?;
                Ok((Response::Done {}, None))
            }
            Request::Unmapped {} => {
                self.files.unmapped(needs_fd(fd, "unmapped")?)?;
                Ok((Response::Done {}, None))
            }
        }
    }

    fn install(&self, channel: u16, e: Extent) -> Result<(), EmuError> {
        let perms = if e.write { READ | WRITE } else { READ };
        self.engine
            .update_permissions(vec![raw_record(channel, e.start, e.len, perms)])
    }

    /// The connection ended (or the client died): free its channel (and
    /// with it every record) and drop its files' descriptors.
    pub fn end(&self, session: &mut Session) {
        if let Some(channel) = session.channel.take() {
            self.files
                .end_session(channel, session.id, &std::mem::take(&mut session.files));
            self.grants.lock().expect("grants").remove(&channel);
            let _ = self.engine.close_channel(channel);
        }
        session.changes.clear();
    }
}

fn not_open(file_id: u32) -> EmuError {
    EmuError::new(
        ErrorKind::Protocol,
        format!("file {file_id} is not open on this channel"),
    )
}

fn needs_fd(fd: Option<OwnedFd>, op: &str) -> Result<OwnedFd, EmuError> {
    fd.ok_or_else(|| {
        EmuError::new(
            ErrorKind::Protocol,
            format!("{op} needs the file's descriptor attached (SCM_RIGHTS)"),
        )
    })
}

/// The inode of a regular file open for writing on `fd` (changing a
/// file's layout needs the right to write it).
fn writable_file(fd: &OwnedFd) -> Result<InodeId, EmuError> {
    let raw = std::os::fd::AsRawFd::as_raw_fd(fd);
    let st = sys::fstat(raw).map_err(|e| EmuError::io("fstat of the descriptor", e))?;
    let flags = sys::status_flags(raw).map_err(|e| EmuError::io("fcntl of the descriptor", e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG
        || flags & libc::O_PATH != 0
        || flags & libc::O_ACCMODE == libc::O_RDONLY
    {
        return Err(EmuError::new(
            ErrorKind::Unauthorized,
            "a layout change needs a regular file open for writing",
        ));
    }
    Ok(InodeId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
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
