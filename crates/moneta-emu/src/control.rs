//! The control plane (DESIGN "Processes in emulation", SPEC §3.1–3.4): the
//! trusted side that creates channels, hands their shared memory to clients
//! and installs the permissions that policy grants. It decides nothing about
//! policy itself. Two kinds of grant exist: raw address ranges for the
//! daemon's owner (benchmarks), and files, whose policy is the kernel's: a
//! client opens a file on the file system on this device and passes the
//! descriptor with `open-file`; `map-file` (the soft miss) grants the
//! extents FIEMAP reports; `close-file` revokes them ([`crate::files`]).
//!
//! The protocol itself (messages and framing) is `moneta_abi::control`,
//! which clients depend on without the engine; it is re-exported here.
//! Every message is untrusted: a malformed frame, a request before `hello`,
//! or one the peer may not make gets an `error` reply and changes nothing.
//!
//! Per client (README "monetad and the control protocol", `moneta stats
//! --run`): the device thread counts each channel's requests
//! (`moneta_abi::stats::ClientStats`); a connection that named a run at
//! hello (`MONETA_RUN_ID`, set by `moneta run`) has them folded into that
//! run's record when it ends, so the run's report outlives its processes.
//! At most [`MAX_RUNS`] runs are kept (the oldest goes first); a peer sees
//! the runs of its own uid, the daemon's owner every run.

use crate::engine::{raw_record, Engine};
use crate::file_table::{ChangeOwner, FileTable};
use crate::files::{GrantedFile, MAX_OPEN_FILES};
use crate::protection::{READ, WRITE};
use crate::sys::{self, PeerCredentials};
use moneta_abi::channel::{ChannelMemory, CHANNEL_TAGS, DMA_BUFFER_BYTES, SLICE_BYTES};
pub use moneta_abi::control::*;
use moneta_abi::error::{EmuError, ErrorKind};
use moneta_abi::InodeId;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Runs whose counters the plane keeps after their connections ended.
pub const MAX_RUNS: usize = 256;

/// Layout changes one session may announce at once.
pub const MAX_CHANGES_PER_SESSION: usize = 64;

/// How many channels local users may hold (issue 39: one user's `hello`s
/// once took all 1,024 and root's `moneta stats` failed). Root and the
/// daemon's owner are bounded only by the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelLimits {
    /// Channels of one uid other than root's and the owner's.
    pub per_uid: usize,
    /// Channels only root and the owner may take (NBD connections are the
    /// owner's).
    pub reserve: usize,
}

impl Default for ChannelLimits {
    fn default() -> Self {
        ChannelLimits {
            per_uid: 256,
            reserve: 64,
        }
    }
}

impl ChannelLimits {
    pub fn check(&self) -> Result<(), EmuError> {
        let most = moneta_abi::channel::CHANNELS - 1;
        if self.per_uid == 0 || self.reserve >= most {
            return Err(EmuError::new(
                ErrorKind::Config,
                format!(
                    "channel limits: per uid {} must be at least 1 and the reserve {} below {most}",
                    self.per_uid, self.reserve
                ),
            ));
        }
        Ok(())
    }
}

/// Channels held, by uid, against [`ChannelLimits`].
#[derive(Default)]
struct ChannelAccounts {
    limits: ChannelLimits,
    by_uid: HashMap<u32, usize>,
    /// Held by uids other than root and the owner, together.
    unprivileged: usize,
}

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
    /// The run its hello named, if any.
    run: Option<String>,
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
            run: None,
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
    /// Per run: its open channels, and what its ended connections did.
    runs: Mutex<Runs>,
    accounts: Mutex<ChannelAccounts>,
}

/// The runs the plane counts, by (uid, run id), oldest first.
#[derive(Default)]
struct Runs {
    order: std::collections::VecDeque<(u32, String)>,
    by_run: HashMap<(u32, String), RunRecord>,
}

#[derive(Default)]
struct RunRecord {
    open_channels: BTreeSet<u16>,
    ended: moneta_abi::stats::ClientStats,
}

impl Runs {
    fn record(&mut self, key: (u32, String)) -> &mut RunRecord {
        if !self.by_run.contains_key(&key) {
            if self.order.len() >= MAX_RUNS {
                // The oldest run without open channels goes; if every kept
                // run is live, the oldest.
                let at = (0..self.order.len())
                    .find(|&i| self.by_run[&self.order[i]].open_channels.is_empty())
                    .unwrap_or(0);
                if let Some(old) = self.order.remove(at) {
                    self.by_run.remove(&old);
                }
            }
            self.order.push_back(key.clone());
        }
        self.by_run.entry(key).or_default()
    }
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
            runs: Mutex::new(Runs::default()),
            accounts: Mutex::new(ChannelAccounts::default()),
        }
    }

    /// The uid that may take raw grants (and, with root, is never bounded
    /// per uid).
    pub fn owner_uid(&self) -> u32 {
        self.owner_uid
    }

    /// Bound the channels of local users (default [`ChannelLimits::default`]).
    pub fn set_channel_limits(&self, limits: ChannelLimits) -> Result<(), EmuError> {
        limits.check()?;
        self.accounts.lock().expect("accounts").limits = limits;
        Ok(())
    }

    fn privileged(&self, uid: u32) -> bool {
        uid == 0 || uid == self.owner_uid
    }

    /// Count a channel for `uid`, or refuse it with the bound it hit.
    fn take_channel(&self, uid: u32) -> Result<(), EmuError> {
        let mut a = self.accounts.lock().expect("accounts");
        let held = a.by_uid.get(&uid).copied().unwrap_or(0);
        if !self.privileged(uid) {
            if held >= a.limits.per_uid {
                return Err(EmuError::new(
                    ErrorKind::NoChannel,
                    format!(
                        "uid {uid} already holds {held} channels, the most one user may (monetad --channels-per-uid)"
                    ),
                ));
            }
            let most = moneta_abi::channel::CHANNELS - 1 - a.limits.reserve;
            if a.unprivileged >= most {
                return Err(EmuError::new(
                    ErrorKind::NoChannel,
                    format!(
                        "local users hold {most} channels; the other {} are kept for root and the daemon's owner",
                        a.limits.reserve
                    ),
                ));
            }
            a.unprivileged += 1;
        }
        *a.by_uid.entry(uid).or_default() += 1;
        Ok(())
    }

    fn give_channel(&self, uid: u32) {
        let mut a = self.accounts.lock().expect("accounts");
        if let Some(n) = a.by_uid.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                a.by_uid.remove(&uid);
            }
            if !self.privileged(uid) {
                a.unprivileged -= 1;
            }
        }
    }

    /// Grant files on a loop device over `path` as over the image: the
    /// daemon's owner vouches that `path` serves this device's whole medium
    /// from byte 0 (`moneta up --kernel-path device` passes its nbdfuse
    /// file, which reads and writes the daemon's own NBD export).
    pub fn set_image_alias(&self, path: std::path::PathBuf) {
        *self.image_alias.lock().expect("alias") = Some(path);
    }

    /// Keep the growth journal at `path` (next to the image): pending
    /// growth ranges are recorded there and settled at the next start
    /// ([`crate::growth`]). Call after [`ControlPlane::set_image_alias`].
    pub fn set_growth_journal(&self, path: std::path::PathBuf) {
        self.files.set_growth_journal(path, self.medium_files());
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
        if let Request::Hello { version, run } = request {
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
            if let Some(id) = &run {
                if !valid_run_id(id) {
                    return Err(EmuError::new(
                        ErrorKind::Protocol,
                        format!("a run id is 1 to {MAX_RUN_ID_BYTES} characters of A-Za-z0-9._-"),
                    ));
                }
            }
            self.take_channel(session.peer.uid)?;
            let (channel, memory) = match self.engine.create_channel() {
                Ok(created) => created,
                Err(e) => {
                    self.give_channel(session.peer.uid);
                    return Err(e);
                }
            };
            session.channel = Some(channel);
            if let Some(id) = &run {
                let key = (session.peer.uid, id.clone());
                self.runs
                    .lock()
                    .expect("runs")
                    .record(key)
                    .open_channels
                    .insert(channel);
            }
            session.run = run;
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
                growth: self.files.growth_on(),
                growth_holes: self.files.growth_holes_on(),
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
            Request::Stats { run, channel } => {
                let mut stats = self.engine.stats()?;
                stats.files = self.files.stats();
                stats.guard = self.files.guard();
                stats.client = match (run, channel) {
                    (Some(run), _) => Some(self.run_stats(session, &run)?),
                    (None, Some(c)) => Some(self.channel_stats(session, c)?),
                    (None, None) => None,
                };
                if let Some(c) = stats.client.as_mut() {
                    let runnable = moneta_abi::fidelity::runnable_now().unwrap_or(0.0);
                    c.judge(runnable, moneta_abi::fidelity::cores());
                }
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
            Request::AllocateFile {
                file_id,
                offset,
                len,
            } => {
                if !session.files.contains(&file_id) {
                    return Err(not_open(file_id));
                }
                let (end, extents) = self.files.allocate(channel, file_id, offset, len)?;
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

    /// A run's counters: its ended connections' and its open channels' so
    /// far. Runs of the asker's uid; the owner (or root) may name any uid's.
    fn run_stats(
        &self,
        session: &Session,
        run: &str,
    ) -> Result<moneta_abi::stats::ClientStats, EmuError> {
        let owner = session.peer.uid == self.owner_uid || session.peer.uid == 0;
        let (mut total, open): (moneta_abi::stats::ClientStats, Vec<u16>) = {
            let runs = self.runs.lock().expect("runs");
            let mut total = moneta_abi::stats::ClientStats::default();
            let mut open = Vec::new();
            let mine = runs
                .by_run
                .iter()
                .filter(|((uid, id), _)| id == run && (owner || *uid == session.peer.uid));
            for (_, r) in mine {
                total.merge(&r.ended);
                open.extend(r.open_channels.iter().copied());
            }
            (total, open)
        };
        for c in open {
            if let Some(live) = self.engine.client_stats(c)? {
                total.merge(&live);
            }
        }
        total.run = Some(run.to_string());
        Ok(total)
    }

    /// One open channel's counters: the asker's own, or any for the owner.
    fn channel_stats(
        &self,
        session: &Session,
        channel: u16,
    ) -> Result<moneta_abi::stats::ClientStats, EmuError> {
        let owner = session.peer.uid == self.owner_uid || session.peer.uid == 0;
        if !owner && session.channel != Some(channel) {
            return Err(EmuError::new(
                ErrorKind::Unauthorized,
                "another channel's counters are for the daemon's owner",
            ));
        }
        self.engine.client_stats(channel)?.ok_or_else(|| {
            EmuError::new(
                ErrorKind::Protocol,
                format!("channel {channel} is not open"),
            )
        })
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
            let client = self.engine.close_channel(channel);
            if let Some(run) = session.run.take() {
                let mut runs = self.runs.lock().expect("runs");
                let record = runs.record((session.peer.uid, run));
                record.open_channels.remove(&channel);
                if let Ok(c) = client {
                    record.ended.merge(&c);
                }
            }
            self.give_channel(session.peer.uid);
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
