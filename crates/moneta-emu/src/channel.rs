//! A channel's shared memory (SPEC §3.1, Table 4.1; DESIGN "Processes in
//! emulation"): the pages one client process and the device share. The
//! device creates them (a memfd), the control plane hands the descriptor to
//! the client over the Unix socket, and both map it. Layout, in 4 KiB pages:
//!
//! | offset | page | what | written by |
//! |---|---|---|---|
//! | 0x0000 | user registers | 64 command slots of 16 B (address word, control word): COMMAND | client |
//! | 0x0400 | user registers | TAGSTATUSREGISTER: bit per tag, read-and-clear | kernel role sets, client clears |
//! | 0x1000 | shared with the kernel | TAGSTATUSTABLE: 64 status words | device (DMA completion), client (forwarding) |
//! | 0x1200 | shared with the kernel | COMPLETIONCOUNT (u32) | kernel role |
//! | 0x1204 | shared with the kernel | wake word (u32 futex) and sleeper count (u32) | kernel role, client |
//! | 0x1210 | shared with the kernel | 60 LAYOUT EPOCH words (u64), file id mod 60: bumped whenever a file this channel holds changed layout or lost records | control plane |
//! | 0x1400 | shared with the kernel | forwarded error code per tag (u32) | kernel role sets, client clears |
//! | 0x2000 | DMA buffer | 1 MiB, tag k's 16 KiB slice at k × 16 KiB | both |
//!
//! Submitting a command is one atomic store: the client writes the address
//! word, then stores the control word (SPEC §1.2's "one 64-bit PIO write";
//! the format is `command::encode_channel`) with release ordering. A nonzero
//! control word is a submitted command; the device takes it with a swap.
//!
//! A status word is `DONE | sequence << 32 | result code`: the sequence
//! number the command carried, so a client never mistakes an old completion
//! of the same tag for the new one. The device trusts nothing here: a client
//! can scribble over every byte, and that only ever affects its own requests.

use crate::sys::{self, Mapping};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64};

/// Channels of one device, including the trusted channel 0 (SPEC §3.1).
pub const CHANNELS: usize = 1024;
/// Virtual tags per channel (SPEC §1.4: 64 per channel).
pub const CHANNEL_TAGS: usize = 64;
/// Per-channel DMA buffer (SPEC §3.1: 1 MB, pinned, contiguous).
pub const DMA_BUFFER_BYTES: usize = 1 << 20;
/// Tag k uses the k-th 16 KiB slice of the DMA buffer (SPEC §3.1).
pub const SLICE_BYTES: usize = 16 << 10;

const PAGE_BYTES: usize = 4096;
const SLOTS_OFFSET: usize = 0;
const SLOT_BYTES: usize = 16;
const TAG_STATUS_REGISTER_OFFSET: usize = 0x400;
const TAG_STATUS_TABLE_OFFSET: usize = PAGE_BYTES;
const COMPLETION_COUNT_OFFSET: usize = PAGE_BYTES + 0x200;
const WAKE_WORD_OFFSET: usize = PAGE_BYTES + 0x204;
const SLEEPERS_OFFSET: usize = PAGE_BYTES + 0x208;
const LAYOUT_EPOCH_OFFSET: usize = PAGE_BYTES + 0x210;
/// Layout epoch words per channel (a file uses word `file id % this`).
pub const LAYOUT_EPOCH_SLOTS: usize = 60;
const FORWARDED_ERROR_OFFSET: usize = PAGE_BYTES + 0x400;
const DMA_BUFFER_OFFSET: usize = 2 * PAGE_BYTES;
/// Bytes of one channel's shared memory.
pub const CHANNEL_BYTES: usize = DMA_BUFFER_OFFSET + DMA_BUFFER_BYTES;

// The layout's regions do not overlap (checked at compile time).
const _: () = {
    assert!(SLOTS_OFFSET + CHANNEL_TAGS * SLOT_BYTES <= TAG_STATUS_REGISTER_OFFSET);
    assert!(TAG_STATUS_TABLE_OFFSET + CHANNEL_TAGS * 8 <= COMPLETION_COUNT_OFFSET);
    assert!(SLEEPERS_OFFSET + 4 <= LAYOUT_EPOCH_OFFSET);
    assert!(LAYOUT_EPOCH_OFFSET + 8 * LAYOUT_EPOCH_SLOTS <= FORWARDED_ERROR_OFFSET);
    assert!(FORWARDED_ERROR_OFFSET + CHANNEL_TAGS * 4 <= DMA_BUFFER_OFFSET);
    assert!(CHANNEL_TAGS * SLICE_BYTES == DMA_BUFFER_BYTES);
};

/// Status word bit: the request with the sequence number in bits 47..32 is done.
pub const STATUS_DONE: u64 = 1 << 63;

/// The status word for a finished request.
pub fn status_word(sequence: u16, code: ResultCode) -> u64 {
    STATUS_DONE | (u64::from(sequence) << 32) | u64::from(code as u32)
}

/// Result codes the device reports per request (SPEC §3.5 errors, §3.3
/// failure kinds).
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResultCode {
    Ok = 0,
    /// No permission record covers the range: a miss (SPEC §3.3); the
    /// library installs the record and retries.
    MissingRecord = 1,
    /// A record covers the range but lacks the needed bit (SPEC §3.3).
    PermissionDenied = 2,
    /// The command words do not decode (bad opcode, reserved bits, zero length, …).
    BadCommand = 3,
    /// The tag already has a request in flight.
    TagInFlight = 4,
    /// The request does not fit in the DMA buffer from its tag's slice.
    OutsideDmaBuffer = 5,
    /// The access extends beyond the device's capacity.
    OutOfRange = 6,
    /// The device could not complete the request (medium failure).
    DeviceFailure = 7,
}

impl ResultCode {
    pub const ALL: [ResultCode; 8] = [
        ResultCode::Ok,
        ResultCode::MissingRecord,
        ResultCode::PermissionDenied,
        ResultCode::BadCommand,
        ResultCode::TagInFlight,
        ResultCode::OutsideDmaBuffer,
        ResultCode::OutOfRange,
        ResultCode::DeviceFailure,
    ];

    /// Decode a code read from shared memory; unknown values are failures.
    pub fn from_u32(v: u32) -> ResultCode {
        ResultCode::ALL
            .get(v as usize)
            .copied()
            .unwrap_or(ResultCode::DeviceFailure)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ResultCode::Ok => "ok",
            ResultCode::MissingRecord => "no permission record covers the range",
            ResultCode::PermissionDenied => "permission denied",
            ResultCode::BadCommand => "malformed command",
            ResultCode::TagInFlight => "tag already in flight",
            ResultCode::OutsideDmaBuffer => "request does not fit the DMA buffer",
            ResultCode::OutOfRange => "access beyond the device's capacity",
            ResultCode::DeviceFailure => "device failure",
        }
    }
}

/// One channel's shared pages, mapped in this process.
pub struct ChannelMemory {
    fd: OwnedFd,
    map: Mapping,
}

impl ChannelMemory {
    /// Fresh, zeroed shared pages (device side).
    pub fn create(channel: u16) -> io::Result<ChannelMemory> {
        let fd = sys::memfd(&format!("moneta-channel-{channel}"), CHANNEL_BYTES as u64)?;
        let map = Mapping::new(Some(fd.as_raw_fd()), CHANNEL_BYTES, false)?;
        Ok(ChannelMemory { fd, map })
    }

    /// Map pages received from the control plane (client side). The size is
    /// checked so that a wrong descriptor cannot make us touch past its end.
    pub fn map(fd: OwnedFd) -> io::Result<ChannelMemory> {
        let len = sys::file_len(fd.as_raw_fd())?;
        if len != CHANNEL_BYTES as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("channel memory is {len} bytes, expected {CHANNEL_BYTES}"),
            ));
        }
        let map = Mapping::new(Some(fd.as_raw_fd()), CHANNEL_BYTES, false)?;
        Ok(ChannelMemory { fd, map })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= DMA_BUFFER_OFFSET);
        // SAFETY: the mapping is page-aligned and at least DMA_BUFFER_OFFSET
        // long, so offset is in bounds and 8-aligned; the memory lives as long
        // as `self`; every access to these words (from any process) is atomic.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU64>() }
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= DMA_BUFFER_OFFSET);
        // SAFETY: as u64_at, 4-aligned.
        unsafe { &*self.map.as_ptr().add(offset).cast::<AtomicU32>() }
    }

    /// The address word of `tag`'s command slot.
    pub fn slot_addr(&self, tag: usize) -> &AtomicU64 {
        assert!(tag < CHANNEL_TAGS);
        self.u64_at(SLOTS_OFFSET + tag * SLOT_BYTES)
    }

    /// The control word of `tag`'s command slot (nonzero = submitted).
    pub fn slot_control(&self, tag: usize) -> &AtomicU64 {
        assert!(tag < CHANNEL_TAGS);
        self.u64_at(SLOTS_OFFSET + tag * SLOT_BYTES + 8)
    }

    pub fn tag_status_register(&self) -> &AtomicU64 {
        self.u64_at(TAG_STATUS_REGISTER_OFFSET)
    }

    /// `tag`'s TAGSTATUSTABLE entry.
    pub fn tag_status(&self, tag: usize) -> &AtomicU64 {
        assert!(tag < CHANNEL_TAGS);
        self.u64_at(TAG_STATUS_TABLE_OFFSET + tag * 8)
    }

    pub fn completion_count(&self) -> &AtomicU32 {
        self.u32_at(COMPLETION_COUNT_OFFSET)
    }

    /// Bumped whenever a sleeping thread may have something to see (futex word).
    pub fn wake_word(&self) -> &AtomicU32 {
        self.u32_at(WAKE_WORD_OFFSET)
    }

    /// Threads of the client sleeping on the wake word (so that wakers skip
    /// the system call when nobody sleeps).
    pub fn sleepers(&self) -> &AtomicU32 {
        self.u32_at(SLEEPERS_OFFSET)
    }

    /// The error code the kernel role forwarded for `tag` (0 = none).
    /// Bumped by the control plane whenever file `file_id` of this channel
    /// (or another sharing its word) changed layout (truncation, hole
    /// punching, a mapping…) or lost records: the library forgets its
    /// cached translation map of the file when it sees a new value.
    /// Coherency only: protection is the device's.
    pub fn layout_epoch(&self, file_id: u32) -> &AtomicU64 {
        self.u64_at(LAYOUT_EPOCH_OFFSET + 8 * (file_id as usize % LAYOUT_EPOCH_SLOTS))
    }

    pub fn forwarded_error(&self, tag: usize) -> &AtomicU32 {
        assert!(tag < CHANNEL_TAGS);
        self.u32_at(FORWARDED_ERROR_OFFSET + tag * 4)
    }

    /// Raw pointer to `len` bytes of the DMA buffer at `offset`, or None if
    /// the range leaves the buffer. Raw because the other side may write the
    /// bytes at any time.
    pub fn dma_ptr(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let end = offset.checked_add(len)?;
        (end <= DMA_BUFFER_BYTES).then(|| {
            // SAFETY: DMA_BUFFER_OFFSET + end ≤ CHANNEL_BYTES = the mapping's length.
            unsafe { self.map.as_ptr().add(DMA_BUFFER_OFFSET + offset) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn two_mappings_share_the_pages() {
        let device = ChannelMemory::create(7).unwrap();
        let dup = device.fd().try_clone().unwrap();
        let client = ChannelMemory::map(dup).unwrap();
        client.slot_control(5).store(42, Ordering::Release);
        assert_eq!(device.slot_control(5).load(Ordering::Acquire), 42);
        device
            .tag_status(63)
            .store(status_word(9, ResultCode::Ok), Ordering::Release);
        assert_eq!(
            client.tag_status(63).load(Ordering::Acquire),
            STATUS_DONE | 9 << 32
        );
        let p = client.dma_ptr(DMA_BUFFER_BYTES - 4, 4).unwrap();
        // SAFETY: 4 bytes inside the DMA buffer.
        unsafe { p.copy_from_nonoverlapping(b"tail".as_ptr(), 4) };
        let q = device.dma_ptr(DMA_BUFFER_BYTES - 4, 4).unwrap();
        let mut b = [0u8; 4];
        // SAFETY: as above.
        unsafe { q.copy_to_nonoverlapping(b.as_mut_ptr(), 4) };
        assert_eq!(&b, b"tail");
        assert!(device.dma_ptr(DMA_BUFFER_BYTES - 4, 5).is_none());
        assert!(device.dma_ptr(usize::MAX, 2).is_none());
    }

    #[test]
    fn wrong_sized_memory_is_refused() {
        let fd = sys::memfd("short", 4096).unwrap();
        assert!(ChannelMemory::map(fd).is_err());
    }

    #[test]
    fn unknown_codes_are_failures() {
        assert_eq!(ResultCode::from_u32(2), ResultCode::PermissionDenied);
        assert_eq!(ResultCode::from_u32(999), ResultCode::DeviceFailure);
    }
}
