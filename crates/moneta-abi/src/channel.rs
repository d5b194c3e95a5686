//! A channel's shared memory (SPEC §3.1, Table 4.1; DESIGN "Processes in
//! emulation"): the pages one client process and the device share. The
//! device creates them (a memfd), the control plane hands the descriptor to
//! the client over the Unix socket, and both map it. Layout, in 4 KiB pages:
//!
//! | offset | page | what | written by |
//! |---|---|---|---|
//! | 0x0000 | user registers | 64 command slots, one 64 B cache line per tag: | |
//! | +0x00 | | address word: COMMAND | client |
//! | +0x08 | | control word: COMMAND | client |
//! | +0x10 | | submit stamp (u64, CLOCK_MONOTONIC ns): when the client issued the command | client |
//! | +0x18 | | status word: the tag's TAGSTATUSTABLE entry | device (DMA completion), client (forwarding) |
//! | +0x20 | | due word (u64, CLOCK_MONOTONIC ns): when, in model time, the tag's request finished | device |
//! | 0x1000 | shared with the kernel | TAGSTATUSREGISTER: bit per tag, read-and-clear | kernel role sets, client clears |
//! | 0x1040 | shared with the kernel | SUBMITTED (u64): bit per tag, flipped for each new command in its slot | client flips, device reads |
//! | 0x1048 | shared with the kernel | NEED WAKEUP (u32): the device thread naps; ring the doorbell after submitting | device sets, client clears |
//! | 0x1200 | shared with the kernel | COMPLETIONCOUNT (u32) | kernel role |
//! | 0x1204 | shared with the kernel | wake word (u32 futex) and sleeper count (u32) | kernel role, client |
//! | 0x1210 | shared with the kernel | 60 LAYOUT EPOCH words (u64), file id mod 60: bumped whenever a file this channel holds changed layout or lost records | control plane |
//! | 0x1400 | shared with the kernel | forwarded error code per tag (u32) | kernel role sets, client clears |
//! | 0x2000 | DMA buffer | 1 MiB, tag k's 16 KiB slice at k × 16 KiB | both |
//!
//! **Cache lines.** Everything one request of a tag needs is in its slot's
//! line: the command and its stamp, which the device takes with one swap of
//! the control word, and the completion (status and due word), which the
//! client reads with one load each. So a request moves that line between
//! the cores and the SUBMITTED line, besides its data (protocol version 3;
//! version 2 spread them over five lines).
//!
//! Submitting a command is one atomic store: the client writes the submit
//! stamp and the address word, then stores the control word (SPEC §1.2's "one
//! 64-bit PIO write"; the format is `command::encode_channel`), and then
//! flips the tag's bit in SUBMITTED with a full barrier. The device only
//! reads SUBMITTED (one load per channel and poll, no write that would pull
//! the line back from the client) and takes the tags whose bit changed since
//! its last look, each with a swap of its control word: a nonzero control
//! word is a submitted command; a flip without one is ignored, and a client
//! that flips bits itself only hides or repeats its own commands. The stamp
//! says when the client issued it, so the request
//! enters the model at that time rather than when the device thread happened
//! to look (the device clamps it: never in the future, never before the
//! tag's previous completion, never before model time already passed).
//!
//! **The doorbell.** An idle device thread naps on a futex instead of
//! spinning. Before it does, it sets every open channel's NEED WAKEUP word;
//! a client that sees it set after submitting clears it and rings the
//! doorbell: a separate 4 KiB memfd shared by the device and every client,
//! whose first word is the futex the device sleeps on. A client scribbling
//! on the doorbell can only wake the device early (it naps again) or late
//! (each nap is bounded); the NEED WAKEUP words are per channel, so no
//! client can keep another's requests from waking the device.
//!
//! A status word is `DONE | sequence << 32 | result code`: the sequence
//! number the command carried, so a client never mistakes an old completion
//! of the same tag for the new one. Before it, the device writes the tag's
//! due word: the completion's model time. The device may post a completion
//! slightly ahead of that time so that it has crossed to the client's core
//! by then; the library reports it only once the due time has come. The device trusts nothing here: a client
//! can scribble over every byte, and that only ever affects its own requests.

use crate::sys::{self, Mapping};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

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
/// One cache line per tag (see the module header).
const SLOT_BYTES: usize = 64;
const SLOT_ADDR: usize = 0x00;
const SLOT_CONTROL: usize = 0x08;
const SLOT_STAMP: usize = 0x10;
const SLOT_STATUS: usize = 0x18;
const SLOT_DUE: usize = 0x20;
const TAG_STATUS_REGISTER_OFFSET: usize = PAGE_BYTES;
/// Not on TAGSTATUSREGISTER's line, which the kernel role writes.
const SUBMITTED_OFFSET: usize = PAGE_BYTES + 0x40;
/// On SUBMITTED's line: the client reads it right after flipping its bit.
const NEED_WAKEUP_OFFSET: usize = PAGE_BYTES + 0x48;
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
    assert!(SLOT_DUE + 8 <= SLOT_BYTES && SLOT_BYTES == 64);
    assert!(SLOTS_OFFSET + CHANNEL_TAGS * SLOT_BYTES <= TAG_STATUS_REGISTER_OFFSET);
    assert!(TAG_STATUS_REGISTER_OFFSET + 64 <= SUBMITTED_OFFSET);
    assert!(SUBMITTED_OFFSET + 8 <= NEED_WAKEUP_OFFSET);
    assert!(NEED_WAKEUP_OFFSET + 4 <= SUBMITTED_OFFSET + 64);
    assert!(SUBMITTED_OFFSET + 64 <= COMPLETION_COUNT_OFFSET);
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
    /// A QuickSAN peer holding the data failed and no replica is up.
    PeerUnreachable = 8,
    /// No up-to-date copy of a mirrored slice is reachable: the copies left
    /// may have missed acknowledged writes, or are in split brain (issue 22).
    NoUpToDateCopy = 9,
}

impl ResultCode {
    pub const ALL: [ResultCode; 10] = [
        ResultCode::Ok,
        ResultCode::MissingRecord,
        ResultCode::PermissionDenied,
        ResultCode::BadCommand,
        ResultCode::TagInFlight,
        ResultCode::OutsideDmaBuffer,
        ResultCode::OutOfRange,
        ResultCode::DeviceFailure,
        ResultCode::PeerUnreachable,
        ResultCode::NoUpToDateCopy,
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
            ResultCode::PeerUnreachable => "the SAN peer holding the data is unreachable",
            ResultCode::NoUpToDateCopy => {
                "no up-to-date copy of the mirrored slice is reachable (a copy that may have \
                 missed writes is never read; `moneta san status` names the slice's state and \
                 the missing peer)"
            }
        }
    }
}

/// Bytes of the device's doorbell memory.
pub const DOORBELL_BYTES: usize = 4096;

/// The device-wide doorbell (see the module header): one futex word the
/// napping device thread sleeps on, in memory every client maps.
pub struct Doorbell {
    fd: OwnedFd,
    map: Mapping,
}

impl Doorbell {
    /// A fresh doorbell (device side).
    pub fn create() -> io::Result<Doorbell> {
        let fd = sys::memfd("moneta-doorbell", DOORBELL_BYTES as u64)?;
        Self::map(fd)
    }

    /// Map a doorbell received from the control plane (client side).
    pub fn map(fd: OwnedFd) -> io::Result<Doorbell> {
        let map = map_checked(&fd, DOORBELL_BYTES, "doorbell")?;
        Ok(Doorbell { fd, map })
    }

    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The futex word: bumped by every ring.
    pub fn word(&self) -> &AtomicU32 {
        // SAFETY: the mapping is page-aligned and DOORBELL_BYTES long; every
        // access to the word (from any process) is atomic.
        unsafe { &*self.map.as_ptr().cast::<AtomicU32>() }
    }

    /// Wake the device thread.
    pub fn ring(&self) {
        self.word().fetch_add(1, Ordering::SeqCst);
        sys::futex_wake_all(self.word());
    }
}

/// Map exactly `len` bytes of `fd`, refusing a descriptor of another size
/// (so that a wrong descriptor cannot make us touch past its end).
fn map_checked(fd: &OwnedFd, len: usize, what: &str) -> io::Result<Mapping> {
    let actual = sys::file_len(fd.as_raw_fd())?;
    if actual != len as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{what} memory is {actual} bytes, expected {len}"),
        ));
    }
    Mapping::new(Some(fd.as_raw_fd()), len, false)
}

/// One channel's shared pages, and the device's doorbell, mapped in this process.
pub struct ChannelMemory {
    fd: OwnedFd,
    map: Mapping,
    doorbell: Doorbell,
}

impl ChannelMemory {
    /// Fresh, zeroed shared pages (device side), sharing `doorbell`.
    pub fn create(channel: u16, doorbell: &Doorbell) -> io::Result<ChannelMemory> {
        let fd = sys::memfd(&format!("moneta-channel-{channel}"), CHANNEL_BYTES as u64)?;
        let map = Mapping::new(Some(fd.as_raw_fd()), CHANNEL_BYTES, false)?;
        let doorbell = Doorbell::map(doorbell.fd().try_clone()?)?;
        Ok(ChannelMemory { fd, map, doorbell })
    }

    /// Map pages and the doorbell received from the control plane (client
    /// side). Sizes are checked.
    pub fn map(fd: OwnedFd, doorbell: OwnedFd) -> io::Result<ChannelMemory> {
        let map = map_checked(&fd, CHANNEL_BYTES, "channel")?;
        let doorbell = Doorbell::map(doorbell)?;
        Ok(ChannelMemory { fd, map, doorbell })
    }

    /// Map the descriptors a hello reply carries: the channel's, then the doorbell's.
    pub fn map_fds(fds: Vec<OwnedFd>) -> io::Result<ChannelMemory> {
        let [fd, doorbell]: [OwnedFd; 2] = fds.try_into().map_err(|fds: Vec<OwnedFd>| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "expected the channel memory and the doorbell, got {} descriptors",
                    fds.len()
                ),
            )
        })?;
        Self::map(fd, doorbell)
    }

    /// The channel's pages.
    pub fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// The descriptors to hand a client: the channel's pages, then the doorbell.
    pub fn fds(&self) -> [&OwnedFd; 2] {
        [&self.fd, self.doorbell.fd()]
    }

    pub fn doorbell(&self) -> &Doorbell {
        &self.doorbell
    }

    /// Set by the device before it naps (see the module header).
    pub fn need_wakeup(&self) -> &AtomicU32 {
        self.u32_at(NEED_WAKEUP_OFFSET)
    }

    /// Bit per tag, flipped for each new command in its slot (see the
    /// module header).
    pub fn submitted(&self) -> &AtomicU64 {
        self.u64_at(SUBMITTED_OFFSET)
    }

    /// When the client issued `tag`'s current command (CLOCK_MONOTONIC ns).
    pub fn slot_stamp(&self, tag: usize) -> &AtomicU64 {
        self.slot_word(tag, SLOT_STAMP)
    }

    /// Flip `tag`'s SUBMITTED bit (with a full barrier): its slot holds a
    /// new command.
    pub fn mark_submitted(&self, tag: usize) {
        assert!(tag < CHANNEL_TAGS);
        self.submitted().fetch_xor(1 << tag, Ordering::SeqCst);
    }

    /// Client side: submit `tag`'s command (stamp, address word, the
    /// control word, then its SUBMITTED bit with a full barrier) and ring the doorbell if the device
    /// naps.
    pub fn submit(&self, tag: usize, stamp_ns: u64, addr_word: u64, control_word: u64) {
        self.slot_stamp(tag).store(stamp_ns, Ordering::Relaxed);
        self.slot_addr(tag).store(addr_word, Ordering::Relaxed);
        self.slot_control(tag)
            .store(control_word, Ordering::Release);
        // A full barrier (a locked RMW): the device's NEED WAKEUP store and
        // this command cannot both go unseen (the device fences before its
        // last look).
        self.mark_submitted(tag);
        if self.need_wakeup().load(Ordering::SeqCst) != 0 {
            self.need_wakeup().store(0, Ordering::Relaxed);
            self.doorbell.ring();
        }
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

    /// Hint the CPU to fetch `tag`'s slot line (device side, before taking
    /// several commands: their lines then cross in parallel).
    pub fn prefetch_slot(&self, tag: usize) {
        sys::prefetch_line(self.slot_addr(tag) as *const AtomicU64 as *const u8);
    }

    /// Word `word_offset` of `tag`'s slot line.
    fn slot_word(&self, tag: usize, word_offset: usize) -> &AtomicU64 {
        assert!(tag < CHANNEL_TAGS);
        self.u64_at(SLOTS_OFFSET + tag * SLOT_BYTES + word_offset)
    }

    /// The address word of `tag`'s command slot.
    pub fn slot_addr(&self, tag: usize) -> &AtomicU64 {
        self.slot_word(tag, SLOT_ADDR)
    }

    /// The control word of `tag`'s command slot (nonzero = submitted).
    pub fn slot_control(&self, tag: usize) -> &AtomicU64 {
        self.slot_word(tag, SLOT_CONTROL)
    }

    pub fn tag_status_register(&self) -> &AtomicU64 {
        self.u64_at(TAG_STATUS_REGISTER_OFFSET)
    }

    /// `tag`'s TAGSTATUSTABLE entry.
    pub fn tag_status(&self, tag: usize) -> &AtomicU64 {
        self.slot_word(tag, SLOT_STATUS)
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

    /// When `tag`'s last request finished in model time (CLOCK_MONOTONIC
    /// ns), written before its status: the device may post a completion a
    /// little ahead, and the library does not report it before this.
    pub fn tag_due(&self, tag: usize) -> &AtomicU64 {
        self.slot_word(tag, SLOT_DUE)
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

    #[test]
    fn two_mappings_share_the_pages() {
        let doorbell = Doorbell::create().unwrap();
        let device = ChannelMemory::create(7, &doorbell).unwrap();
        let fds = device.fds().map(|fd| fd.try_clone().unwrap());
        let client = ChannelMemory::map_fds(fds.into()).unwrap();
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
        let doorbell = Doorbell::create().unwrap();
        let fd = sys::memfd("short", 4096).unwrap();
        assert!(ChannelMemory::map(fd, doorbell.fd().try_clone().unwrap()).is_err());
        let channel = sys::memfd("channel", CHANNEL_BYTES as u64).unwrap();
        let big = sys::memfd("big", 8192).unwrap();
        assert!(ChannelMemory::map(channel, big).is_err());
        assert!(ChannelMemory::map_fds(Vec::new()).is_err());
    }

    #[test]
    fn a_submission_rings_a_napping_device_once() {
        let doorbell = Doorbell::create().unwrap();
        let device = ChannelMemory::create(3, &doorbell).unwrap();
        let fds = device.fds().map(|fd| fd.try_clone().unwrap());
        let client = ChannelMemory::map_fds(fds.into()).unwrap();
        let before = doorbell.word().load(Ordering::SeqCst);
        client.submit(4, 123, 7, 9);
        assert_eq!(
            doorbell.word().load(Ordering::SeqCst),
            before,
            "awake: no ring"
        );
        assert_eq!(device.slot_stamp(4).load(Ordering::Relaxed), 123);
        assert_eq!(device.slot_control(4).load(Ordering::Acquire), 9);
        assert_eq!(device.submitted().load(Ordering::Acquire), 1 << 4);
        device.need_wakeup().store(1, Ordering::SeqCst);
        client.submit(5, 124, 7, 9);
        assert_eq!(doorbell.word().load(Ordering::SeqCst), before + 1);
        assert_eq!(device.need_wakeup().load(Ordering::SeqCst), 0);
        client.submit(6, 125, 7, 9);
        assert_eq!(doorbell.word().load(Ordering::SeqCst), before + 1);
        // Each submission flips its tag's bit: the device takes the tags
        // whose bit changed since it last looked.
        assert_eq!(device.submitted().load(Ordering::Acquire), 0b111 << 4);
        client.submit(4, 126, 7, 9);
        assert_eq!(device.submitted().load(Ordering::Acquire), 0b110 << 4);
    }

    #[test]
    fn a_tags_command_and_completion_share_one_cache_line() {
        let doorbell = Doorbell::create().unwrap();
        let m = ChannelMemory::create(1, &doorbell).unwrap();
        let line = |w: &AtomicU64| w as *const AtomicU64 as usize / 64;
        for tag in [0, 17, CHANNEL_TAGS - 1] {
            let words = [
                m.slot_addr(tag),
                m.slot_control(tag),
                m.slot_stamp(tag),
                m.tag_status(tag),
                m.tag_due(tag),
            ];
            assert!(words.iter().all(|w| line(w) == line(words[0])), "tag {tag}");
        }
        assert_ne!(line(m.tag_status(0)), line(m.tag_status(1)));
        let submitted = m.submitted() as *const AtomicU64 as usize / 64;
        let need_wakeup = m.need_wakeup() as *const AtomicU32 as usize / 64;
        assert_eq!(submitted, need_wakeup);
    }

    #[test]
    fn unknown_codes_are_failures() {
        assert_eq!(ResultCode::from_u32(2), ResultCode::PermissionDenied);
        assert_eq!(ResultCode::from_u32(999), ResultCode::DeviceFailure);
    }
}
