//! virtio-blk requests (VIRTIO 1.2, §5.2 "Block Device"), checked.
//!
//! A request is one descriptor chain the guest placed in its own memory:
//! a 16-byte header (`struct virtio_blk_req`: type, reserved, sector) in
//! the device-readable part, then a write's payload or the segments of a
//! discard / write-zeroes; in the device-writable part a read's data and,
//! as its last byte, the status. Nothing of it is trusted: every
//! descriptor's range is checked against guest memory before it is used,
//! the chain is bounded ([`MAX_DESCRIPTORS`], [`MAX_DATA_BYTES`]), its
//! readable part must come before its writable part (§2.7.4.2), lengths
//! must be whole sectors, and the sectors must lie on the device. A chain
//! that breaks a rule is answered with `VIRTIO_BLK_S_IOERR` (or, when it
//! has no writable byte for the status, used with length 0): an error for
//! that request, never a panic, never an access outside guest memory (all
//! accesses go through vm-memory's checked `read_slice`/`write_slice`).
//!
//! The bytes move through a [`Target`]: in monetad a channel of the
//! emulated device ([`crate::backend`]), in the fuzz test a vector.
//! Left out: `VIRTIO_BLK_T_SECURE_ERASE`, zoned commands, and more than
//! one discard / write-zeroes segment per request (`max_discard_seg` = 1).

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};

/// Bytes per sector: virtio-blk addresses in 512-byte units (§5.2.6).
pub const SECTOR_BYTES: u64 = 512;

pub const T_IN: u32 = 0;
pub const T_OUT: u32 = 1;
pub const T_FLUSH: u32 = 4;
pub const T_GET_ID: u32 = 8;
pub const T_DISCARD: u32 = 11;
pub const T_WRITE_ZEROES: u32 = 13;

pub const S_OK: u8 = 0;
pub const S_IOERR: u8 = 1;
pub const S_UNSUPP: u8 = 2;

/// Feature bits (§5.2.3).
pub const F_SIZE_MAX: u64 = 1 << 1;
pub const F_SEG_MAX: u64 = 1 << 2;
pub const F_RO: u64 = 1 << 5;
pub const F_BLK_SIZE: u64 = 1 << 6;
pub const F_FLUSH: u64 = 1 << 9;
pub const F_DISCARD: u64 = 1 << 13;
pub const F_WRITE_ZEROES: u64 = 1 << 14;
/// VIRTIO_RING_F_INDIRECT_DESC, VIRTIO_RING_F_EVENT_IDX, VIRTIO_F_VERSION_1 (§6).
pub const F_INDIRECT_DESC: u64 = 1 << 28;
pub const F_EVENT_IDX: u64 = 1 << 29;
pub const F_VERSION_1: u64 = 1 << 32;

/// The write-zeroes segment flag that lets the device unmap (§5.2.6).
const SEGMENT_UNMAP: u32 = 1;

/// Bytes of the request header (`le32 type; le32 reserved; le64 sector`).
pub const HEADER_BYTES: usize = 16;
/// Bytes of one discard / write-zeroes segment.
const SEGMENT_BYTES: usize = 16;
/// Bytes of the identity string `VIRTIO_BLK_T_GET_ID` returns.
const ID_BYTES: usize = 20;

/// Data segments per request the guest is told it may use (`seg_max`) and
/// the largest segment (`size_max`); a request moves at most their
/// product, which stays within [`MAX_DATA_BYTES`].
pub const SEG_MAX: u32 = 126;
pub const SIZE_MAX_BYTES: u32 = 8 << 10;
/// The most data one request may carry (the bounce buffer's size).
pub const MAX_DATA_BYTES: usize = 1 << 20;
/// Descriptors per chain at most: the data segments, the header and the
/// status, with room for a driver that splits them further; longer chains
/// are refused (virtio-queue bounds a walk by the queue size as well).
pub const MAX_DESCRIPTORS: usize = SEG_MAX as usize + 2;
/// The most sectors one discard or write-zeroes segment may name.
pub const MAX_RANGE_SECTORS: u32 = (64 << 20) / SECTOR_BYTES as u32;

/// What requests reach: the emulated device's channel in monetad.
pub trait Target {
    fn capacity_bytes(&self) -> u64;
    fn read_only(&self) -> bool;
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String>;
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), String>;
    /// Make every completed write durable.
    fn flush(&self) -> Result<(), String>;
}

/// Why a chain was refused (counted; the guest sees `S_IOERR` or length 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    TooManyDescriptors,
    /// A descriptor's range is not all in guest memory.
    OutsideMemory,
    /// A device-readable descriptor after a device-writable one.
    ReadableAfterWritable,
    NoHeader,
    NoStatus,
    /// Data not a whole number of sectors, or over [`MAX_DATA_BYTES`].
    BadLength,
    /// Sectors past the device's end.
    OutOfRange,
    /// Discard / write-zeroes segments not as `max_discard_seg` allows.
    BadSegments,
}

/// One request's result: the status written and the used length reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Served {
    /// None: the chain had no place for a status.
    pub status: Option<u8>,
    /// Bytes written into the guest's buffers (data and status).
    pub used_len: u32,
    /// The request kind, when the header could be read.
    pub kind: Option<u32>,
}

/// Descriptors of one chain, split into the device-readable and the
/// device-writable parts, each range checked against guest memory.
/// Reused from request to request (the data path does not allocate).
pub struct Scratch {
    readable: Vec<(GuestAddress, usize)>,
    writable: Vec<(GuestAddress, usize)>,
    data: Vec<u8>,
}

impl Default for Scratch {
    fn default() -> Scratch {
        Scratch {
            readable: Vec::with_capacity(MAX_DESCRIPTORS),
            writable: Vec::with_capacity(MAX_DESCRIPTORS),
            data: vec![0u8; MAX_DATA_BYTES],
        }
    }
}

/// Serve one descriptor chain (its descriptors as virtio-queue walked
/// them) on `target`; write the status into the guest and say what to
/// report as used.
pub fn serve(
    mem: &GuestMemoryMmap,
    descriptors: impl Iterator<Item = Descriptor>,
    target: &impl Target,
    scratch: &mut Scratch,
) -> (Served, Option<Malformed>) {
    let mut served = Served {
        status: None,
        used_len: 0,
        kind: None,
    };
    if let Err(m) = scratch.split(mem, descriptors) {
        return (served, Some(m));
    }
    // The status: the last byte of the last writable descriptor.
    let Some(status_at) = scratch.take_status_byte() else {
        return (served, Some(Malformed::NoStatus));
    };
    let (status, data_len, malformed) = match execute(mem, target, scratch, &mut served) {
        Ok((status, data_len)) => (status, data_len, None),
        Err(m) => (S_IOERR, 0, Some(m)),
    };
    if mem.write_obj(status, status_at).is_ok() {
        served.status = Some(status);
        served.used_len = data_len as u32 + 1;
    }
    (served, malformed)
}

/// Run the request the header names. Returns its status and the data
/// bytes written into the guest.
fn execute(
    mem: &GuestMemoryMmap,
    target: &impl Target,
    scratch: &mut Scratch,
    served: &mut Served,
) -> Result<(u8, usize), Malformed> {
    let mut header = [0u8; HEADER_BYTES];
    if gather(mem, &scratch.readable, 0, &mut header).is_err() {
        return Err(Malformed::NoHeader);
    }
    let kind = u32::from_le_bytes(header[0..4].try_into().expect("4"));
    let sector = u64::from_le_bytes(header[8..16].try_into().expect("8"));
    served.kind = Some(kind);
    let payload = total(&scratch.readable) - HEADER_BYTES;
    let room = total(&scratch.writable);
    let writes = matches!(kind, T_OUT | T_DISCARD | T_WRITE_ZEROES);
    if writes && target.read_only() {
        return Ok((S_IOERR, 0));
    }
    match kind {
        T_IN => {
            let addr = checked_range(target, sector, room)?;
            let data = &mut scratch.data[..room];
            if target.read(addr, data).is_err() {
                return Ok((S_IOERR, 0));
            }
            scatter(mem, &scratch.writable, data).map_err(|_| Malformed::OutsideMemory)?;
            Ok((S_OK, room))
        }
        T_OUT => {
            let addr = checked_range(target, sector, payload)?;
            let data = &mut scratch.data[..payload];
            gather(mem, &scratch.readable, HEADER_BYTES, data)
                .map_err(|_| Malformed::OutsideMemory)?;
            Ok((status_of(target.write(addr, data)), 0))
        }
        T_FLUSH => Ok((status_of(target.flush()), 0)),
        T_GET_ID => {
            let mut id = [0u8; ID_BYTES];
            let name = b"moneta-emulated";
            id[..name.len()].copy_from_slice(name);
            let n = room.min(ID_BYTES);
            scatter(mem, &scratch.writable, &id[..n]).map_err(|_| Malformed::OutsideMemory)?;
            Ok((S_OK, n))
        }
        T_DISCARD | T_WRITE_ZEROES => {
            if payload != SEGMENT_BYTES {
                return Err(Malformed::BadSegments);
            }
            let mut segment = [0u8; SEGMENT_BYTES];
            gather(mem, &scratch.readable, HEADER_BYTES, &mut segment)
                .map_err(|_| Malformed::OutsideMemory)?;
            let first = u64::from_le_bytes(segment[0..8].try_into().expect("8"));
            let sectors = u32::from_le_bytes(segment[8..12].try_into().expect("4"));
            let flags = u32::from_le_bytes(segment[12..16].try_into().expect("4"));
            let allowed = if kind == T_WRITE_ZEROES {
                SEGMENT_UNMAP
            } else {
                0
            };
            if flags & !allowed != 0 {
                return Ok((S_UNSUPP, 0));
            }
            if sectors > MAX_RANGE_SECTORS {
                return Err(Malformed::BadSegments);
            }
            let bytes = sectors as u64 * SECTOR_BYTES;
            let addr = device_range(target, first, bytes)?;
            if kind == T_DISCARD {
                // Discard is advisory (§5.2.6.1): the device keeps every
                // byte, as the NBD export's trim does.
                return Ok((S_OK, 0));
            }
            Ok((
                status_of(write_zeroes(target, addr, bytes, &mut scratch.data)),
                0,
            ))
        }
        _ => Ok((S_UNSUPP, 0)),
    }
}

fn status_of(r: Result<(), String>) -> u8 {
    if r.is_ok() {
        S_OK
    } else {
        S_IOERR
    }
}

/// The device address of `len` data bytes at `sector`: whole sectors,
/// within one request's bound and on the device.
fn checked_range(target: &impl Target, sector: u64, len: usize) -> Result<u64, Malformed> {
    if !(len as u64).is_multiple_of(SECTOR_BYTES) || len > MAX_DATA_BYTES {
        return Err(Malformed::BadLength);
    }
    device_range(target, sector, len as u64)
}

fn device_range(target: &impl Target, sector: u64, bytes: u64) -> Result<u64, Malformed> {
    let addr = sector
        .checked_mul(SECTOR_BYTES)
        .ok_or(Malformed::OutOfRange)?;
    match addr.checked_add(bytes) {
        Some(end) if end <= target.capacity_bytes() => Ok(addr),
        _ => Err(Malformed::OutOfRange),
    }
}

fn write_zeroes(
    target: &impl Target,
    addr: u64,
    bytes: u64,
    zeroes: &mut [u8],
) -> Result<(), String> {
    zeroes.fill(0);
    let mut done = 0u64;
    while done < bytes {
        let n = (bytes - done).min(zeroes.len() as u64) as usize;
        target.write(addr + done, &zeroes[..n])?;
        done += n as u64;
    }
    Ok(())
}

impl Scratch {
    /// Check every descriptor and sort it into the readable or the
    /// writable part.
    fn split(
        &mut self,
        mem: &GuestMemoryMmap,
        descriptors: impl Iterator<Item = Descriptor>,
    ) -> Result<(), Malformed> {
        self.readable.clear();
        self.writable.clear();
        for (i, d) in descriptors.enumerate() {
            if i >= MAX_DESCRIPTORS {
                return Err(Malformed::TooManyDescriptors);
            }
            let len = d.len() as usize;
            if len == 0 {
                continue;
            }
            if !mem.check_range(d.addr(), len) {
                return Err(Malformed::OutsideMemory);
            }
            if d.is_write_only() {
                self.writable.push((d.addr(), len));
            } else if self.writable.is_empty() {
                self.readable.push((d.addr(), len));
            } else {
                return Err(Malformed::ReadableAfterWritable);
            }
        }
        if total(&self.readable) < HEADER_BYTES {
            return Err(Malformed::NoHeader);
        }
        if total(&self.readable) - HEADER_BYTES > MAX_DATA_BYTES
            || total(&self.writable) > MAX_DATA_BYTES + 1
        {
            return Err(Malformed::BadLength);
        }
        Ok(())
    }

    /// Take the status byte off the end of the writable part.
    fn take_status_byte(&mut self) -> Option<GuestAddress> {
        let (addr, len) = self.writable.pop()?;
        // `len` >= 1: empty descriptors were skipped.
        let at = addr.0.checked_add(len as u64 - 1).map(GuestAddress)?;
        if len > 1 {
            self.writable.push((addr, len - 1));
        }
        Some(at)
    }
}

fn total(parts: &[(GuestAddress, usize)]) -> usize {
    // Bounded: at most MAX_DESCRIPTORS parts of at most u32::MAX bytes.
    parts.iter().map(|&(_, len)| len).sum()
}

/// Copy `out.len()` bytes from the parts' byte stream, from `skip` on.
fn gather(
    mem: &GuestMemoryMmap,
    parts: &[(GuestAddress, usize)],
    mut skip: usize,
    out: &mut [u8],
) -> Result<(), ()> {
    let mut at = 0;
    for &(addr, len) in parts {
        if at == out.len() {
            break;
        }
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(out.len() - at);
        let from = GuestAddress(addr.0 + skip as u64);
        mem.read_slice(&mut out[at..at + n], from).map_err(|_| ())?;
        at += n;
        skip = 0;
    }
    if at == out.len() {
        Ok(())
    } else {
        Err(())
    }
}

/// Copy `data` into the parts' byte stream from its start.
fn scatter(mem: &GuestMemoryMmap, parts: &[(GuestAddress, usize)], data: &[u8]) -> Result<(), ()> {
    let mut at = 0;
    for &(addr, len) in parts {
        if at == data.len() {
            break;
        }
        let n = len.min(data.len() - at);
        mem.write_slice(&data[at..at + n], addr).map_err(|_| ())?;
        at += n;
    }
    if at == data.len() {
        Ok(())
    } else {
        Err(())
    }
}

/// The device's configuration space (`struct virtio_blk_config`, §5.2.4),
/// little-endian, as far as the features offered use it.
pub fn config_space(capacity_bytes: u64) -> Vec<u8> {
    let mut c = vec![0u8; 60];
    c[0..8].copy_from_slice(&(capacity_bytes / SECTOR_BYTES).to_le_bytes());
    c[8..12].copy_from_slice(&SIZE_MAX_BYTES.to_le_bytes());
    c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes());
    // blk_size: the 512-byte sector (the device model's smallest request).
    c[20..24].copy_from_slice(&(SECTOR_BYTES as u32).to_le_bytes());
    // num_queues
    c[34..36].copy_from_slice(&1u16.to_le_bytes());
    // max_discard_sectors, max_discard_seg, discard_sector_alignment
    c[36..40].copy_from_slice(&MAX_RANGE_SECTORS.to_le_bytes());
    c[40..44].copy_from_slice(&1u32.to_le_bytes());
    c[44..48].copy_from_slice(&1u32.to_le_bytes());
    // max_write_zeroes_sectors, max_write_zeroes_seg, write_zeroes_may_unmap
    c[48..52].copy_from_slice(&MAX_RANGE_SECTORS.to_le_bytes());
    c[52..56].copy_from_slice(&1u32.to_le_bytes());
    c[56] = 0;
    c
}
