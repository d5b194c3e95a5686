//! Asynchronous requests of a file (SPEC §3.2's per-descriptor translation
//! with §4.4.4's asynchronous interface): a request whose whole range the
//! translation map sends to the device, with the access it needs, is one
//! device request on the channel's tags, submitted now and completed later
//! ([`MonetaFile::prepare_async`], [`MonetaFile::submit_async`],
//! [`MonetaFile::try_complete_async`]). Everything else (growth, holes,
//! unwritten extents, this handle's kernel pages, ranges over several
//! extents, data the device does not serve) is [`Prepared::Synchronous`]:
//! the caller serves it with [`MonetaFile::read_at`] / [`MonetaFile::write_at`],
//! which know those cases. One copy of each rule: the map, the retries and
//! the route counts are the synchronous path's.
//!
//! A request the control plane revoked under it (another process changed
//! the file's layout) or whose map changed while it was in flight is done
//! again synchronously into (or from) its own DMA slice before it counts
//! as complete, so the caller never sees bytes of blocks that were no
//! longer the file's.

use super::{revoked, Kind, MonetaFile, RouteOp, ROUTES};
use crate::client::{CompletionMode, Io, Moneta};
use moneta_abi::EmuError;
use moneta_model::units::Op;
use std::sync::atomic::Ordering;

/// A file request on the device: its tags, where it is in the file, and
/// the layout epoch it was mapped under.
#[derive(Debug)]
pub struct FileIo {
    io: Io,
    offset: u64,
    epoch: Option<u64>,
}

impl FileIo {
    pub fn io(&self) -> &Io {
        &self.io
    }
    pub fn io_mut(&mut self) -> &mut Io {
        &mut self.io
    }
    /// The tags, to give back with [`Moneta::release`] once it finished.
    pub fn into_io(self) -> Io {
        self.io
    }
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

/// What [`MonetaFile::prepare_async`] made of a request.
#[derive(Debug)]
pub enum Prepared {
    /// One device request: fill its slice (writes), submit it.
    Device(FileIo),
    /// The channel has no free run of tags for it now: complete and
    /// release a request, then ask again.
    Busy,
    /// Not one device request: serve it with read_at / write_at.
    Synchronous,
}

impl MonetaFile {
    /// Map `[offset, offset + len)` for one asynchronous `op` on the
    /// device, or say why not. Reads past the end of the file and writes
    /// that grow it are [`Prepared::Synchronous`] (short reads and growth
    /// are the synchronous path's).
    pub fn prepare_async(
        &self,
        m: &Moneta,
        op: Op,
        offset: u64,
        len: u64,
        mode: CompletionMode,
    ) -> Result<Prepared, EmuError> {
        self.check_channel(m)?;
        let Some(end) = offset.checked_add(len) else {
            return Ok(Prepared::Synchronous);
        };
        if len == 0 || len > m.max_request_bytes() || end > self.len()? {
            return Ok(Prepared::Synchronous);
        }
        self.follow_epoch(m);
        let epoch = self.id().map(|id| m.layout_epoch(id));
        let segments = self.plan(m, offset, end, false)?;
        let [s] = segments.as_slice() else {
            return Ok(Prepared::Synchronous);
        };
        let allowed = match (s.kind, op) {
            (Kind::Direct(a), Op::Read) => a.can_read(),
            // As write_at: a read-only grant goes to the device too, which
            // enforces the permission (and refuses).
            (Kind::Direct(a), Op::Write) => a.can_write() || !self.access.can_write(),
            _ => false,
        };
        if !allowed {
            return Ok(Prepared::Synchronous);
        }
        Ok(match m.try_prepare(op, s.physical, len, mode)? {
            Some(io) => Prepared::Device(FileIo { io, offset, epoch }),
            None => Prepared::Busy,
        })
    }

    /// Issue a prepared request (its slice filled, for a write).
    pub fn submit_async(&self, m: &Moneta, fio: &mut FileIo) -> Result<(), EmuError> {
        self.check_channel(m)?;
        if fio.io.op() == Op::Write {
            self.wrote_directly.store(true, Ordering::Release);
        }
        m.issue(&mut fio.io)
    }

    /// Some(result) once the request finished, its slice holding the data
    /// read; None while in flight. A request revoked under it, or whose
    /// file changed layout while it was in flight, is done again through
    /// [`MonetaFile::read_at`] / [`MonetaFile::write_at`] first.
    pub fn try_complete_async(&self, m: &Moneta, fio: &mut FileIo) -> Option<Result<(), EmuError>> {
        let result = m.try_complete(&mut fio.io)?;
        let write = fio.io.op() == Op::Write;
        let may = if write {
            self.access.can_write()
        } else {
            self.access.can_read()
        };
        let moved = self.id().map(|id| m.layout_epoch(id)) != fio.epoch;
        Some(match result {
            Ok(()) if !moved || write => {
                let op = if write { RouteOp::Write } else { RouteOp::Read };
                ROUTES.device(op, fio.io.len());
                Ok(())
            }
            Err(e) if !revoked(&e, may) => Err(e),
            // Revoked, or a read that may have seen blocks no longer the
            // file's: the synchronous path maps again and retries.
            _ => self.redo(m, fio),
        })
    }

    fn redo(&self, m: &Moneta, fio: &mut FileIo) -> Result<(), EmuError> {
        let offset = fio.offset;
        let len = fio.io.len();
        let write = fio.io.op() == Op::Write;
        self.invalidate(offset, offset + len);
        let buf = m.buffer_mut(&mut fio.io);
        if write {
            let data = buf.to_vec();
            self.write_at(m, &data, offset).map(|_| ())
        } else {
            let got = self.read_at(m, buf, offset)?;
            // The file shrank under the read: what is past its end reads
            // as nothing, never as stale bytes.
            m.buffer_mut(&mut fio.io)[got..].fill(0);
            Ok(())
        }
    }
}
