//! Hostile clients (SPEC §3.1, §3.3, §3.5): the device trusts nothing a
//! client writes into its channel's shared pages.
//!
//! - An attacker that stores random and crafted command words (bad tags,
//!   out-of-range addresses and lengths, overlapping DMA slices, tags reused
//!   while in flight) and scribbles over every byte of its mapping never
//!   reads or writes outside its grants and never disturbs the honest
//!   channels working next to it, whose data is checked byte for byte.
//! - A deterministic probe of each kind of bad command gets the right code.
//! - Channels flooding the shared hardware error queue with refusals do not
//!   cost another channel its error reports.
//! - A client killed with requests in flight gives back its channel and every
//!   virtual and physical tag.
//!
//! Timing is real (threads, wall clock), so a seed reproduces the attacker's
//! choices, not the interleaving.

use moneta::{CompletionMode, Io, Moneta, ResultCode};
use moneta_abi::channel::{
    ChannelMemory, CHANNEL_BYTES, CHANNEL_TAGS, DMA_BUFFER_BYTES, SLICE_BYTES, STATUS_DONE,
};
use moneta_abi::stats::EngineStats;
use moneta_emu::control::{ControlPlane, Request, Response, Session, PROTOCOL_VERSION};
use moneta_emu::daemon::Daemon;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_emu::sys::{Mapping, PeerCredentials};
use moneta_model::config::Config;
use moneta_model::device::command::{self, Command};
use moneta_model::units::{DeviceAddr, Op};
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const CAPACITY_BYTES: u64 = 64 * MIB;
/// The honest channels' extents. The first two touch, and the second ends
/// where the attacker's grant begins, so an off-by-one at a channel boundary
/// would show.
const HONEST: [Span; 3] = [
    Span::new(4 * MIB, 2 * MIB),
    Span::new(6 * MIB, 2 * MIB),
    Span::new(24 * MIB, 2 * MIB),
];
const ATTACKER_RW: Span = Span::new(8 * MIB, 2 * MIB);
/// Adjacent to the read-write grant with other permissions: no one record
/// covers a write that spans both.
const ATTACKER_RO: Span = Span::new(10 * MIB, 2 * MIB);
/// Starts every 4 KiB page the attacker may not read, and every honest
/// write: if it ever shows up in the attacker's pages, data leaked.
const SECRET: [u8; 64] = *b"<<moneta hostile-test secret: no read grant, no bytes. 0x5ec4e7>";
/// How long the attacker attacks (per preset).
const CHAOS: Duration = Duration::from_millis(1500);
/// A request that has not completed after this long was lost.
const COMPLETION_DEADLINE: Duration = Duration::from_secs(10);
const MODES: [CompletionMode; 3] = [
    CompletionMode::Dma,
    CompletionMode::Forwarding,
    CompletionMode::IssueSleep,
];

// The channel command byte and control word (`command::encode_channel`),
// spelled out so that the attacker can also write what the encoder refuses.
const OP_READ: u8 = 0b01;
const OP_WRITE: u8 = 0b10;
const BARRIER: u8 = 0b100;
const DMA_COMPLETION: u8 = 0b1000;

fn control_word(sequence: u16, tag_field: u8, command_byte: u8, len: u32) -> u64 {
    (u64::from(sequence) << 48)
        | (u64::from(tag_field) << 40)
        | (u64::from(command_byte) << 32)
        | u64::from(len)
}

/// Bytes of the DMA buffer from `tag`'s slice to its end: the longest
/// request the tag may carry.
fn room(tag: usize) -> u64 {
    (DMA_BUFFER_BYTES - tag * SLICE_BYTES) as u64
}

#[derive(Debug, Clone, Copy)]
struct Span {
    start: u64,
    len: u64,
}

impl Span {
    const fn new(start: u64, len: u64) -> Span {
        Span { start, len }
    }

    fn end(self) -> u64 {
        self.start + self.len
    }

    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end() as usize
    }
}

/// xorshift64: small and seeded.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

fn contains_secret(bytes: &[u8]) -> bool {
    bytes
        .windows(SECRET.len())
        .any(|w| w[0] == SECRET[0] && w == SECRET)
}

fn uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn start_engine(preset: &str) -> Arc<Engine> {
    let mut config = Config::preset(preset).unwrap();
    config.device.capacity_bytes = CAPACITY_BYTES;
    let medium = Medium::anonymous(CAPACITY_BYTES).unwrap();
    Arc::new(Engine::start(config, medium, EngineOptions::default()).unwrap())
}

/// Fill the medium with random bytes, SECRET at the start of every page
/// except in the attacker's own extents (which it may read legitimately).
/// Returns the contents.
fn fill_medium(engine: &Engine, rng: &mut Rng) -> Vec<u8> {
    let mut image = vec![0u8; CAPACITY_BYTES as usize];
    rng.fill(&mut image);
    for page in image.chunks_mut(4096) {
        page[..SECRET.len()].copy_from_slice(&SECRET);
    }
    for span in [ATTACKER_RW, ATTACKER_RO] {
        rng.fill(&mut image[span.range()]);
    }
    engine.medium().write(0, &image).unwrap();
    image
}

fn medium_contents(engine: &Engine) -> Vec<u8> {
    let mut image = vec![0u8; CAPACITY_BYTES as usize];
    engine.medium().read(0, &mut image).unwrap();
    image
}

/// Aborts the test process if the test runs longer than `limit`: a lost
/// completion makes the library wait forever, and a hang must be a failure
/// with a reason, not a stuck run. Disarmed when dropped.
struct Watchdog {
    _disarm: mpsc::Sender<()>,
}

impl Watchdog {
    fn arm(what: &'static str, limit: Duration) -> Watchdog {
        let (disarm, armed) = mpsc::channel::<()>();
        std::thread::spawn(move || {
            if armed.recv_timeout(limit) == Err(mpsc::RecvTimeoutError::Timeout) {
                eprintln!(
                    "{what}: still running after {limit:?}: a request or a channel close hangs"
                );
                std::process::abort();
            }
        });
        Watchdog { _disarm: disarm }
    }
}

/// Sets the flag when dropped, so that worker threads end however the
/// code holding it is left.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A channel driven by hand through its shared pages, bypassing the library:
/// what a hostile process can do with the memory it was given.
struct RawChannel {
    plane: Arc<ControlPlane>,
    session: Session,
    memory: Arc<ChannelMemory>,
    /// A second mapping of the same pages, to write any byte of them.
    view: Mapping,
}

/// The user-register and kernel-shared pages in front of the DMA buffer.
const REGISTER_BYTES: usize = CHANNEL_BYTES - DMA_BUFFER_BYTES;

impl RawChannel {
    fn open(plane: &Arc<ControlPlane>) -> RawChannel {
        let mut session = Session::new(PeerCredentials {
            pid: std::process::id() as i32,
            uid: uid(),
            gid: 0,
        });
        let (response, memory) = plane.handle(
            &mut session,
            Request::Hello {
                version: PROTOCOL_VERSION,
                run: None,
            },
        );
        assert!(matches!(response, Response::Channel(_)), "{response:?}");
        let memory = memory.expect("hello returns the channel's memory");
        let view = Mapping::new(Some(memory.fd().as_raw_fd()), CHANNEL_BYTES, false).unwrap();
        RawChannel {
            plane: plane.clone(),
            session,
            memory,
            view,
        }
    }

    fn grant(&mut self, span: Span, write: bool) {
        let (response, _) = self.plane.handle(
            &mut self.session,
            Request::GrantRaw {
                start: span.start,
                len: span.len,
                write,
            },
        );
        assert!(matches!(response, Response::Granted(_)), "{response:?}");
    }

    /// Store a command into `tag`'s slot the way the library does: submit
    /// stamp, address word, the control word with release ordering, then
    /// flip the tag's SUBMITTED bit.
    /// (The attack scribbles on the stamps like on every other register.)
    fn submit(&self, tag: usize, addr: u64, control: u64) {
        self.submit_stamped(tag, moneta_abi::sys::monotonic_ns(), addr, control);
    }

    fn submit_stamped(&self, tag: usize, stamp: u64, addr: u64, control: u64) {
        self.memory.slot_stamp(tag).store(stamp, Ordering::Relaxed);
        self.memory.slot_addr(tag).store(addr, Ordering::Relaxed);
        self.memory
            .slot_control(tag)
            .store(control, Ordering::Release);
        self.memory.mark_submitted(tag);
    }

    /// The `index`-th 8-byte word of the register pages.
    fn register_word(&self, index: usize) -> &AtomicU64 {
        assert!(index < REGISTER_BYTES / 8);
        // SAFETY: the mapping is page-aligned and CHANNEL_BYTES long, so the
        // word is in bounds and aligned, and lives as long as `self`; the
        // device and the kernel role access these pages only atomically
        // (some words as two u32s: a mixed-size store, which is what a
        // hostile process does anyway).
        unsafe { &*self.view.as_ptr().add(index * 8).cast::<AtomicU64>() }
    }

    fn dma_write(&self, at: usize, bytes: &[u8]) {
        let p = self
            .memory
            .dma_ptr(at, bytes.len())
            .expect("inside the DMA buffer");
        // SAFETY: dma_ptr checked the range; the device may copy these bytes
        // concurrently and then gets whatever is there.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, bytes.len()) };
    }

    fn dma_read(&self, at: usize, len: usize) -> Vec<u8> {
        let p = self.memory.dma_ptr(at, len).expect("inside the DMA buffer");
        let mut bytes = vec![0u8; len];
        // SAFETY: as dma_write.
        unsafe { std::ptr::copy_nonoverlapping(p, bytes.as_mut_ptr(), len) };
        bytes
    }

    /// A copy of every byte of the channel's pages.
    fn snapshot(&self) -> Vec<u8> {
        let mut bytes = vec![0u8; CHANNEL_BYTES];
        // SAFETY: the mapping is CHANNEL_BYTES long; the device may write
        // concurrently and we copy whatever is there.
        unsafe {
            std::ptr::copy_nonoverlapping(self.view.as_ptr(), bytes.as_mut_ptr(), CHANNEL_BYTES)
        };
        bytes
    }

    /// Free the channel (as when the connection ends).
    fn close(&mut self) {
        self.plane.end(&mut self.session);
    }
}

impl Drop for RawChannel {
    fn drop(&mut self) {
        self.close();
    }
}

/// An address aimed at something: the attacker's grants, the honest
/// extents, unallocated space, the edges between them, the end of the
/// device, or nowhere.
fn hostile_addr(rng: &mut Rng) -> u64 {
    let spans = [HONEST[0], HONEST[1], HONEST[2], ATTACKER_RW, ATTACKER_RO];
    match rng.below(10) {
        0 | 1 => ATTACKER_RW.start + rng.below(ATTACKER_RW.len),
        2 => ATTACKER_RO.start + rng.below(ATTACKER_RO.len),
        3 | 4 => {
            let span = HONEST[rng.below(HONEST.len() as u64) as usize];
            span.start + rng.below(span.len)
        }
        5 => rng.below(CAPACITY_BYTES),
        6 => {
            let span = spans[rng.below(spans.len() as u64) as usize];
            let edge = if rng.chance(50) {
                span.start
            } else {
                span.end()
            };
            edge.saturating_sub(rng.below(64))
        }
        7 => CAPACITY_BYTES - rng.below(64),
        8 => u64::MAX - rng.below(64),
        _ => rng.next(),
    }
}

/// A length for a request on `tag`: one slice, several slices (overlapping
/// later tags' slices), more than fits from this slice, the field's maximum,
/// zero, anything.
fn hostile_len(rng: &mut Rng, tag: usize) -> u32 {
    let room = room(tag);
    let len = match rng.below(8) {
        0..=2 => 1 + rng.below(SLICE_BYTES as u64),
        3 => 1 + rng.below(room),
        4 => room + 1 + rng.below(DMA_BUFFER_BYTES as u64),
        5 => u64::from(u32::MAX),
        6 => 0,
        _ => rng.next(),
    };
    len as u32
}

/// Mostly reads and writes, sometimes invalid opcodes; either completion
/// method, barriers, sometimes reserved bits.
fn hostile_command_byte(rng: &mut Rng) -> u8 {
    let mut byte = [OP_READ, OP_WRITE, OP_READ, OP_WRITE, 0b00, 0b11][rng.below(6) as usize];
    if rng.chance(50) {
        byte |= DMA_COMPLETION;
    }
    if rng.chance(10) {
        byte |= BARRIER;
    }
    if rng.chance(5) {
        byte |= rng.next() as u8 & 0xf0;
    }
    byte
}

/// A command for `tag`'s slot that looks valid more often than not.
fn crafted(rng: &mut Rng, tag: usize) -> (u64, u64) {
    let tag_field = if rng.chance(90) {
        tag as u8
    } else {
        rng.next() as u8
    };
    let byte = hostile_command_byte(rng);
    let len = hostile_len(rng, tag);
    (
        hostile_addr(rng),
        control_word(rng.next() as u16, tag_field, byte, len),
    )
}

/// A legal request of up to `max_len` bytes (at least 1) inside `span`.
fn legal(rng: &mut Rng, span: Span, max_len: u64) -> (u64, u32) {
    let len = 1 + rng.below(max_len.min(span.len));
    (span.start + rng.below(span.len - len + 1), len as u32)
}

/// What the attacker did, for the log.
#[derive(Debug, Default)]
struct AttackCounts {
    random_words: u64,
    crafted: u64,
    tag_reuses: u64,
    overlaps: u64,
    register_scribbles: u64,
    dma_scribbles: u64,
    secret_scans: u64,
}

/// Attack until `until`. Panics if the secret ever appears in the attacker's
/// pages (checked every few thousand actions: a leak read into the DMA
/// buffer may be scribbled over later, so the end alone is not enough).
fn attack(ch: &RawChannel, rng: &mut Rng, until: Instant) -> AttackCounts {
    let mut counts = AttackCounts::default();
    let mut scratch = vec![0u8; SLICE_BYTES];
    let mut actions = 0u64;
    while Instant::now() < until {
        let tag = rng.below(CHANNEL_TAGS as u64) as usize;
        match rng.below(20) {
            0..=2 => {
                ch.submit(tag, rng.next(), rng.next());
                counts.random_words += 1;
            }
            3..=10 => {
                let (addr, control) = crafted(rng, tag);
                ch.submit(tag, addr, control);
                counts.crafted += 1;
            }
            11..=12 => {
                // A legal write that keeps the tag busy, then another command
                // on the same tag once the device has taken the first (or
                // over it in the slot, if the device is slow to come: a brief
                // spin, as yielding would hand the CPU to the other spinners
                // for a whole time slice).
                let (addr, len) = legal(rng, ATTACKER_RW, room(tag));
                let control = control_word(rng.next() as u16, tag as u8, OP_WRITE, len);
                ch.submit(tag, addr, control);
                for _ in 0..1000 {
                    if ch.memory.slot_control(tag).load(Ordering::Acquire) == 0 {
                        break;
                    }
                    std::hint::spin_loop();
                }
                let (addr, control) = if rng.chance(50) {
                    (addr, control)
                } else {
                    crafted(rng, tag)
                };
                ch.submit(tag, addr, control);
                counts.tag_reuses += 1;
            }
            13..=14 => {
                // Overlapping DMA ranges: a read into the buffer from one
                // tag's slice on, often over later tags' slices, and a write
                // out of a later tag's slice, which that read may cover.
                let first = tag.min(CHANNEL_TAGS - 2);
                let (addr, len) = legal(rng, ATTACKER_RO, room(first));
                let byte = OP_READ | if rng.chance(50) { DMA_COMPLETION } else { 0 };
                ch.submit(
                    first,
                    addr,
                    control_word(rng.next() as u16, first as u8, byte, len),
                );
                let second = first + 1 + rng.below((CHANNEL_TAGS - first - 1) as u64) as usize;
                let (addr, len) = legal(rng, ATTACKER_RW, room(second));
                let control = control_word(rng.next() as u16, second as u8, OP_WRITE, len);
                ch.submit(second, addr, control);
                counts.overlaps += 1;
            }
            15..=16 => {
                for _ in 0..1 + rng.below(16) {
                    let word = rng.below((REGISTER_BYTES / 8) as u64) as usize;
                    ch.register_word(word).store(rng.next(), Ordering::Relaxed);
                }
                counts.register_scribbles += 1;
            }
            _ => {
                let len = 1 + rng.below(scratch.len() as u64) as usize;
                let at = rng.below((DMA_BUFFER_BYTES - len + 1) as u64) as usize;
                rng.fill(&mut scratch[..len]);
                ch.dma_write(at, &scratch[..len]);
                counts.dma_scribbles += 1;
            }
        }
        actions += 1;
        if actions.is_multiple_of(4096) {
            assert!(
                !contains_secret(&ch.snapshot()),
                "data the attacker may not read reached its pages (after {actions} actions)"
            );
            counts.secret_scans += 1;
        }
    }
    // Withdraw the commands the device has not taken yet, so that the
    // attack is over when this returns (requests in flight still finish).
    for tag in 0..CHANNEL_TAGS {
        ch.memory.slot_control(tag).store(0, Ordering::Release);
    }
    counts
}

/// An honest client: writes random data (starting with SECRET, which the
/// attacker would love to read) at random places of its extent and reads
/// random places back, each checked byte for byte against its own copy of
/// the extent, cycling through the completion modes. Returns the copy and
/// the rounds done.
fn honest_client(
    m: &Moneta,
    span: Span,
    mut expected: Vec<u8>,
    seed: u64,
    stop: &AtomicBool,
) -> (Vec<u8>, u64) {
    let mut rng = Rng::new(seed);
    let mut rounds = 0u64;
    while !stop.load(Ordering::Acquire) {
        let mode = MODES[rounds as usize % MODES.len()];
        let (addr, len) = legal(&mut rng, span, 32 << 10);
        let at = (addr - span.start) as usize;
        let mut data = vec![0u8; len as usize];
        rng.fill(&mut data);
        let n = data.len().min(SECRET.len());
        data[..n].copy_from_slice(&SECRET[..n]);
        m.write_with(addr, &data, mode).unwrap_or_else(|e| {
            panic!("honest channel {span:?}, round {rounds}: write {len} B at {addr}: {e}")
        });
        expected[at..at + data.len()].copy_from_slice(&data);
        let (addr, len) = legal(&mut rng, span, 32 << 10);
        let at = (addr - span.start) as usize;
        let mut back = vec![0u8; len as usize];
        m.read_with(addr, &mut back, mode).unwrap_or_else(|e| {
            panic!("honest channel {span:?}, round {rounds}: read {len} B at {addr}: {e}")
        });
        assert!(
            back == expected[at..at + back.len()],
            "honest channel {span:?}, round {rounds}: read {len} B at {addr} returned wrong data"
        );
        rounds += 1;
    }
    (expected, rounds)
}

/// One command of the probe and the result it must get.
struct Probe {
    what: &'static str,
    slot: usize,
    addr: u64,
    tag_field: u8,
    command_byte: u8,
    len: u32,
    expect: ResultCode,
}

/// Issues single commands on a quiet channel and waits for each result.
struct Prober {
    ch: RawChannel,
    sequence: u16,
}

/// Fills a probe's DMA slice first, so that a refused request provably moved
/// no data.
const MARK: u8 = 0xa5;

impl Prober {
    /// Submit one command on `slot` and wait (bounded) for its result, by the
    /// completion method its command byte asks for: the status word (DMA
    /// completion), or the tag's TAGSTATUSREGISTER bit and forwarded error
    /// (interrupt, forwarded by the kernel role). None: no result within
    /// COMPLETION_DEADLINE.
    fn run(&self, slot: usize, addr: u64, control: u64) -> Option<ResultCode> {
        let m = &self.ch.memory;
        let sequence = (control >> 48) as u16;
        let dma_completion = control & (u64::from(DMA_COMPLETION) << 32) != 0;
        if dma_completion {
            m.tag_status(slot).store(0, Ordering::Release);
        }
        self.ch.submit(slot, addr, control);
        let deadline = Instant::now() + COMPLETION_DEADLINE;
        loop {
            if dma_completion {
                let status = m.tag_status(slot).load(Ordering::Acquire);
                if status & STATUS_DONE != 0 && (status >> 32) as u16 == sequence {
                    return Some(ResultCode::from_u32(status as u32));
                }
            } else if m.tag_status_register().load(Ordering::Acquire) & (1 << slot) != 0 {
                m.tag_status_register()
                    .fetch_and(!(1 << slot), Ordering::AcqRel);
                return Some(ResultCode::from_u32(
                    m.forwarded_error(slot).swap(0, Ordering::AcqRel),
                ));
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::yield_now();
        }
    }

    fn next_sequence(&mut self) -> u16 {
        self.sequence = self.sequence.wrapping_add(1);
        self.sequence
    }

    fn check(&mut self, p: &Probe, medium: &Medium) {
        let mark_len = SLICE_BYTES.min(room(p.slot) as usize);
        self.ch
            .dma_write(p.slot * SLICE_BYTES, &vec![MARK; mark_len]);
        let sequence = self.next_sequence();
        let control = control_word(sequence, p.tag_field, p.command_byte, p.len);
        let code = self.run(p.slot, p.addr, control);
        assert_eq!(code, Some(p.expect), "{}", p.what);
        let slice = self.ch.dma_read(p.slot * SLICE_BYTES, mark_len);
        let shown = (p.len as usize).min(mark_len);
        match (p.expect, p.command_byte & 0b11) {
            (ResultCode::Ok, OP_READ) => {
                let mut extent = vec![0u8; shown];
                medium.read(p.addr, &mut extent).unwrap();
                assert!(
                    slice[..shown] == extent[..],
                    "{}: the read did not bring the extent's bytes",
                    p.what
                );
            }
            (ResultCode::Ok, _) => {
                let mut written = vec![0u8; shown];
                medium.read(p.addr, &mut written).unwrap();
                assert!(
                    written.iter().all(|&b| b == MARK),
                    "{}: the write did not land",
                    p.what
                );
            }
            _ => assert!(
                slice.iter().all(|&b| b == MARK),
                "{}: a refused request changed the DMA buffer",
                p.what
            ),
        }
    }

    /// A request on a tag whose request is still in flight is refused, and
    /// the request in flight still completes. Needs a device slow enough to
    /// keep a 1 MiB write in flight while the second command arrives.
    fn tag_in_flight(&mut self) {
        for _attempt in 0..5 {
            let first = self.next_sequence();
            let m = &self.ch.memory;
            m.tag_status(0).store(0, Ordering::Release);
            // A stamp in the future is clamped to the moment the device takes
            // the command, so the write's ~4 ms start then, however long the
            // device thread was kept from polling on a loaded machine.
            self.ch.submit_stamped(
                0,
                u64::MAX,
                ATTACKER_RW.start,
                control_word(first, 0, OP_WRITE | DMA_COMPLETION, DMA_BUFFER_BYTES as u32),
            );
            let deadline = Instant::now() + COMPLETION_DEADLINE;
            while m.slot_control(0).load(Ordering::Acquire) != 0 {
                assert!(Instant::now() < deadline, "the device never took the write");
                std::thread::yield_now();
            }
            let done = |status: u64| status & STATUS_DONE != 0 && (status >> 32) as u16 == first;
            if done(m.tag_status(0).load(Ordering::Acquire)) {
                // Finished before the second command could meet it: proves nothing.
                continue;
            }
            let second = self.next_sequence();
            let code = self.run(0, ATTACKER_RO.start, control_word(second, 0, OP_READ, 512));
            if code == Some(ResultCode::Ok) {
                // This thread was kept off the CPU until the write was over
                // (a loaded machine). A device that never refuses a busy tag
                // ends up here every time and fails below.
                continue;
            }
            assert_eq!(
                code,
                Some(ResultCode::TagInFlight),
                "a second command on a busy tag"
            );
            let m = &self.ch.memory;
            while !done(m.tag_status(0).load(Ordering::Acquire)) {
                assert!(
                    Instant::now() < deadline,
                    "the write in flight never completed"
                );
                std::thread::yield_now();
            }
            assert_eq!(
                ResultCode::from_u32(m.tag_status(0).load(Ordering::Acquire) as u32),
                ResultCode::Ok
            );
            return;
        }
        panic!("a 1 MiB write never stayed in flight long enough to probe TagInFlight");
    }
}

/// Every kind of bad command, one at a time on a fresh channel with the
/// attacker's grants, each with the code it must get; returns the codes.
fn probe_every_refusal(plane: &Arc<ControlPlane>, slow_device: bool) -> Vec<ResultCode> {
    // The spelled-out layout is the library's.
    let c = Command {
        tag: 7,
        op: Op::Write,
        addr: DeviceAddr(12345),
        len_bytes: 4097,
        host_dma_addr: None,
        barrier: true,
        dma_completion: true,
    };
    assert_eq!(
        command::encode_channel(&c, 0xbeef).unwrap(),
        [
            12345,
            control_word(0xbeef, 7, OP_WRITE | BARRIER | DMA_COMPLETION, 4097)
        ]
    );
    let mut prober = Prober {
        ch: RawChannel::open(plane),
        sequence: 0,
    };
    prober.ch.grant(ATTACKER_RW, true);
    prober.ch.grant(ATTACKER_RO, false);
    let medium = plane.engine().medium();
    let (rw, ro, honest) = (ATTACKER_RW.start, ATTACKER_RO.start, HONEST[0].start);
    let (read, write) = (OP_READ | DMA_COMPLETION, OP_WRITE | DMA_COMPLETION);
    let dma_len = DMA_BUFFER_BYTES as u32;
    let slice_len = SLICE_BYTES as u32;
    use ResultCode::{
        BadCommand, MissingRecord, OutOfRange, OutsideDmaBuffer, PermissionDenied, TagInFlight,
    };
    // (what, slot, tag field, address, command byte, length, expected code)
    #[rustfmt::skip]
    let table = [
        ("reserved command bits", 1, 1, rw, write | 0x40, 512, BadCommand),
        ("opcode 00", 2, 2, rw, DMA_COMPLETION, 512, BadCommand),
        ("opcode 11", 3, 3, rw, 0b11 | DMA_COMPLETION, 512, BadCommand),
        ("zero length", 4, 4, rw, write, 0, BadCommand),
        ("tag field names another slot", 5, 6, rw, write, 512, BadCommand),
        ("tag field beyond the 64 tags", 6, 200, rw, write, 512, BadCommand),
        ("longer than the DMA buffer", 0, 0, rw, write, dma_len + 1, BadCommand),
        ("length u32::MAX", 7, 7, rw, read, u32::MAX, BadCommand),
        ("overflows the buffer from the last slice", 63, 63, rw, write, slice_len + 1, OutsideDmaBuffer),
        ("whole buffer from tag 1", 1, 1, ro, read, dma_len, OutsideDmaBuffer),
        ("at the capacity", 8, 8, CAPACITY_BYTES, read, 1, OutOfRange),
        ("straddles the end of the device", 9, 9, CAPACITY_BYTES - 10, write, 11, OutOfRange),
        ("address + length overflows", 10, 10, u64::MAX - 5, read, 100, OutOfRange),
        ("read an honest extent", 11, 11, honest, read, 4096, MissingRecord),
        ("write an honest extent", 12, 12, honest, write, 4096, MissingRecord),
        ("read across into the honest extent below", 13, 13, rw - 1, read, 2, MissingRecord),
        ("read unallocated space", 14, 14, 0, read, 4096, MissingRecord),
        ("write the read-only grant", 15, 15, ro, write, 4096, PermissionDenied),
        ("write across read-write and read-only", 16, 16, ro - 100, write, 200, MissingRecord),
        ("read past the end of the grants", 17, 17, ATTACKER_RO.end() - 1, read, 2, MissingRecord),
        ("read the read-only grant", 18, 18, ro + 3, read, 5000, ResultCode::Ok),
        ("read the read-write grant, several slices", 19, 19, rw + 1, read, 3 * slice_len, ResultCode::Ok),
        ("write the read-write grant", 20, 20, rw + 7, write, 777, ResultCode::Ok),
        ("write refused, interrupt completion", 21, 21, ro, OP_WRITE, 512, PermissionDenied),
        ("read refused, interrupt completion", 22, 22, honest, OP_READ, 512, MissingRecord),
        ("bad command, interrupt completion", 23, 23, rw, 0b11, 512, BadCommand),
        ("read, interrupt completion", 24, 24, ro, OP_READ, 512, ResultCode::Ok),
    ];
    let probes: Vec<Probe> = table
        .into_iter()
        .map(
            |(what, slot, tag_field, addr, command_byte, len, expect)| Probe {
                what,
                slot,
                addr,
                tag_field,
                command_byte,
                len,
                expect,
            },
        )
        .collect();
    for probe in &probes {
        prober.check(probe, medium);
    }
    let mut codes: Vec<ResultCode> = probes.iter().map(|p| p.expect).collect();
    if slow_device {
        prober.tag_in_flight();
        codes.extend([TagInFlight, ResultCode::Ok]);
    }
    codes
}

fn error_count(stats: &EngineStats, code: ResultCode) -> u64 {
    stats.errors.get(code.as_str()).copied().unwrap_or(0)
}

/// Which region of the layout `addr` is in, for messages.
fn region(addr: u64) -> &'static str {
    let named = [
        ("honest extent 0", HONEST[0]),
        ("honest extent 1", HONEST[1]),
        ("honest extent 2", HONEST[2]),
        ("the attacker's read-write grant", ATTACKER_RW),
        ("the attacker's read-only grant", ATTACKER_RO),
    ];
    named
        .iter()
        .find(|(_, s)| (s.start..s.end()).contains(&addr))
        .map_or("unallocated space", |&(name, _)| name)
}

/// The whole scenario on one preset. `slow_device`: requests stay in flight
/// for milliseconds, so tags are reused while busy.
fn hostile_channel_stays_inside_its_grants(preset: &'static str, seed: u64, slow_device: bool) {
    let _watchdog = Watchdog::arm(preset, Duration::from_secs(120));
    let engine = start_engine(preset);
    let plane = Arc::new(ControlPlane::new(engine.clone(), uid()));
    let mut rng = Rng::new(seed);
    let before = fill_medium(&engine, &mut rng);
    let honest: Vec<Moneta> = HONEST
        .iter()
        .map(|span| {
            let m = moneta::attach(&plane, None).unwrap();
            m.grant_raw(span.start, span.len, true).unwrap();
            m
        })
        .collect();
    let mut attacker = RawChannel::open(&plane);
    attacker.grant(ATTACKER_RW, true);
    attacker.grant(ATTACKER_RO, false);

    let stop = AtomicBool::new(false);
    let (honest_results, counts, chaos_stats, probe_codes) = std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let workers: Vec<_> = honest
            .iter()
            .zip(HONEST)
            .enumerate()
            .map(|(i, (m, span))| {
                let expected = before[span.range()].to_vec();
                let stop = &stop;
                s.spawn(move || honest_client(m, span, expected, seed + 1 + i as u64, stop))
            })
            .collect();
        let counts = attack(&attacker, &mut rng, Instant::now() + CHAOS);
        let chaos_stats = engine.stats().unwrap();
        let probe_codes = probe_every_refusal(&plane, slow_device);
        stop.store(true, Ordering::Release);
        let results: Vec<(Vec<u8>, u64)> = workers
            .into_iter()
            .map(|w| w.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect();
        (results, counts, chaos_stats, probe_codes)
    });
    let stats = engine.stats().unwrap();
    let rounds: Vec<u64> = honest_results.iter().map(|(_, r)| *r).collect();
    eprintln!(
        "{preset} (seed {seed:#x}): attacker {counts:?}; honest rounds {rounds:?}; {stats:?}"
    );

    // The honest channels worked throughout and the device never refused
    // them anything (a refusal would have been a hard miss, retried quietly).
    for ((m, (expected, rounds)), span) in honest.iter().zip(&honest_results).zip(HONEST) {
        assert!(*rounds > 0, "honest channel {span:?} did no work");
        assert_eq!(m.misses(), (0, 0), "honest channel {span:?} met misses");
        let mut back = vec![0u8; span.len as usize];
        m.read(span.start, &mut back).unwrap();
        assert!(
            back == *expected,
            "honest channel {span:?} reads back wrong data"
        );
    }

    // On the medium: honest extents hold exactly what their owners wrote;
    // everything else except the attacker's read-write grant is untouched.
    let after = medium_contents(&engine);
    let mut allowed = before.clone();
    for ((expected, _), span) in honest_results.iter().zip(HONEST) {
        assert!(
            after[span.range()] == expected[..],
            "the medium under honest extent {span:?} differs from what its channel wrote"
        );
        allowed[span.range()].copy_from_slice(expected);
    }
    allowed[ATTACKER_RW.range()].copy_from_slice(&after[ATTACKER_RW.range()]);
    if let Some(at) = after.iter().zip(&allowed).position(|(a, b)| a != b) {
        panic!(
            "byte {at:#x} ({}) changed, which no channel may write",
            region(at as u64)
        );
    }
    assert!(
        !contains_secret(&after[ATTACKER_RW.range()]),
        "secret data reached the attacker's read-write grant"
    );

    // The refusals were counted, and the device is still whole.
    let mut kinds = vec![
        ResultCode::BadCommand,
        ResultCode::OutsideDmaBuffer,
        ResultCode::OutOfRange,
        ResultCode::MissingRecord,
        ResultCode::PermissionDenied,
    ];
    if slow_device {
        kinds.push(ResultCode::TagInFlight);
    }
    for code in kinds {
        assert!(
            error_count(&chaos_stats, code) > 0,
            "the attack produced no '{}' refusals: {chaos_stats:?}",
            code.as_str()
        );
        let probed = probe_codes.iter().filter(|&&c| c == code).count() as u64;
        assert!(
            error_count(&stats, code) >= error_count(&chaos_stats, code) + probed,
            "'{}' refusals of the probe were not all counted: {stats:?}",
            code.as_str()
        );
    }
    attacker.close();
    assert_eq!(engine.stats().unwrap().channels_open, HONEST.len() as u32);
    assert!(
        !contains_secret(&attacker.snapshot()),
        "data the attacker may not read reached its pages"
    );
    for (m, span) in honest.iter().zip(HONEST) {
        m.write(span.start, b"still served").unwrap();
        let mut back = [0u8; 12];
        m.read(span.start, &mut back).unwrap();
        assert_eq!(&back, b"still served");
    }
}

#[test]
fn a_hostile_channel_stays_inside_its_grants_on_the_null_device() {
    hostile_channel_stays_inside_its_grants("null", 0x5eed_0001, false);
}

#[test]
fn a_hostile_channel_stays_inside_its_grants_with_requests_in_flight() {
    hostile_channel_stays_inside_its_grants("onyx-late", 0x5eed_0002, true);
}

/// The child of `a_killed_client_frees_its_channel_and_tags` finds the
/// daemon's socket here; without it, `child_entry` does nothing.
const CHILD_ENV: &str = "MONETA_HOSTILE_CHILD_SOCKET";
/// 64 slices: one request per tag.
const CHILD_SPAN: Span = Span::new(32 * MIB, CHANNEL_TAGS as u64 * SLICE_BYTES as u64);

/// The killed client (run as a child process of the test binary): keeps all
/// 64 tags busy with writes until killed, in every completion mode.
#[test]
fn child_entry() {
    let Some(socket) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let m = Moneta::connect(Path::new(&socket)).unwrap();
    m.grant_raw(CHILD_SPAN.start, CHILD_SPAN.len, true).unwrap();
    let mut ios: Vec<Io> = (0..CHANNEL_TAGS)
        .map(|i| {
            let addr = CHILD_SPAN.start + (i * SLICE_BYTES) as u64;
            let mode = MODES[i % MODES.len()];
            let mut io = m
                .try_prepare(Op::Write, addr, SLICE_BYTES as u64, mode)
                .unwrap()
                .expect("a fresh channel has 64 free tags");
            m.buffer_mut(&mut io).fill(i as u8);
            m.submit(&mut io).unwrap();
            io
        })
        .collect();
    println!("ready {}", m.info().channel);
    // Bounded, so that a child whose parent died first does not linger.
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        for io in &mut ios {
            if let Some(result) = m.try_complete(io) {
                result.unwrap();
                m.submit(io).unwrap();
            }
        }
        std::thread::yield_now();
    }
}

/// monetad on its own thread, stopped when dropped (also when the test fails).
struct Serving {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Serving {
    fn start(daemon: Daemon) -> Serving {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || daemon.run(&flag).expect("monetad serves"));
        Serving {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child process, killed when dropped (also when the test fails).
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Submit every request, then wait for all of them at once (bounded: a
/// request that never completes means a leaked tag).
fn run_all_at_once(m: &Moneta, ios: &mut [Io]) {
    for io in ios.iter_mut() {
        m.submit(io).unwrap();
    }
    let mut pending: Vec<usize> = (0..ios.len()).collect();
    let deadline = Instant::now() + COMPLETION_DEADLINE;
    while !pending.is_empty() {
        pending.retain(|&i| match m.try_complete(&mut ios[i]) {
            Some(result) => {
                result.unwrap();
                false
            }
            None => true,
        });
        assert!(
            Instant::now() < deadline,
            "{} of {} requests never completed: tags leaked",
            pending.len(),
            ios.len()
        );
        std::thread::yield_now();
    }
}

/// A client process killed (SIGKILL) while its 64 tags are busy: the daemon
/// sees the connection end, the device finishes what was in flight and frees
/// the channel, and the same channel id then serves 64 requests at once.
#[test]
fn a_killed_client_frees_its_channel_and_tags() {
    let _watchdog = Watchdog::arm("killed client", Duration::from_secs(60));
    let engine = start_engine("onyx-late");
    let plane = Arc::new(ControlPlane::new(engine.clone(), uid()));
    let socket = std::env::temp_dir().join(format!("moneta-hostile-{}.sock", std::process::id()));
    let _daemon = Serving::start(Daemon::bind(&socket, plane).unwrap());
    let open_before = engine.stats().unwrap().channels_open;

    let mut child = ChildGuard(
        std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_entry", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, &socket)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Kept open until the end: a child writing to a closed pipe would die
    // of that instead of our SIGKILL.
    let mut lines = BufReader::new(child.0.stdout.take().expect("piped")).lines();
    let channel: u16 = lines
        .by_ref()
        .map(|line| line.unwrap())
        // The harness may have started the line with the test's name.
        .find_map(|line| line.split_once("ready ").map(|(_, id)| id.parse().unwrap()))
        .expect("the child exited before it was ready");
    assert_eq!(engine.stats().unwrap().channels_open, open_before + 1);
    // The device has taken the child's first 64 writes (the child keeps
    // resubmitting, so requests are in flight when it dies).
    wait_until("the child's writes never reached the device", || {
        engine.stats().unwrap().bytes_written >= CHILD_SPAN.len
    });

    child.0.kill().unwrap();
    let status = child.0.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    wait_until("the killed client's channel was never freed", || {
        engine.stats().unwrap().channels_open == open_before
    });

    // The same channel id, handed out again, starts with every tag free.
    let deadline = Instant::now() + Duration::from_secs(5);
    let m = loop {
        let m = Moneta::connect(&socket).unwrap();
        if m.info().channel == channel {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "channel {channel} was never handed out again"
        );
        drop(m);
        std::thread::sleep(Duration::from_millis(1));
    };
    m.grant_raw(CHILD_SPAN.start, CHILD_SPAN.len, true).unwrap();
    // 64 requests at once hold every virtual tag of the channel and every
    // physical tag of the device: one leaked by the killed client stalls one.
    let block = 4096u64;
    let mut writes: Vec<Io> = (0..CHANNEL_TAGS as u64)
        .map(|i| {
            let mode = MODES[i as usize % MODES.len()];
            let addr = CHILD_SPAN.start + i * block;
            let mut io = m
                .try_prepare(Op::Write, addr, block, mode)
                .unwrap()
                .expect("64 free tags");
            m.buffer_mut(&mut io).fill(0x80 | i as u8);
            io
        })
        .collect();
    run_all_at_once(&m, &mut writes);
    for io in writes {
        m.release(io);
    }
    let mut reads: Vec<Io> = (0..CHANNEL_TAGS as u64)
        .map(|i| {
            let mode = MODES[i as usize % MODES.len()];
            m.try_prepare(Op::Read, CHILD_SPAN.start + i * block, block, mode)
                .unwrap()
                .expect("64 free tags")
        })
        .collect();
    run_all_at_once(&m, &mut reads);
    for (i, io) in reads.into_iter().enumerate() {
        assert!(
            m.buffer(&io).iter().all(|&b| b == 0x80 | i as u8),
            "block {i} reads back wrong data"
        );
        m.release(io);
    }
    let stats = engine.stats().unwrap();
    assert!(stats.errors.is_empty(), "{stats:?}");
    drop(m);
    wait_until("a closed channel was never freed", || {
        engine.stats().unwrap().channels_open == open_before
    });
}

/// Keeps every slot of `ch` full of malformed commands that ask for
/// interrupt completion, so that each refusal goes through the shared
/// hardware error queue.
fn flood_error_queue(ch: &RawChannel, stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        for tag in 0..CHANNEL_TAGS {
            let bad = control_word(0, tag as u8, 0b11, 512);
            ch.memory.slot_control(tag).store(bad, Ordering::Release);
            ch.memory.mark_submitted(tag);
        }
    }
}

/// The hardware error queue is shared by all channels (SPEC §3.5): one
/// channel flooding it with refusals must not cost another channel its
/// error reports (a lost report leaves that channel waiting forever; a
/// rewritten one turns its hard miss into a failure).
#[test]
fn a_flood_of_refusals_does_not_lose_another_channels_error_reports() {
    let _watchdog = Watchdog::arm("error queue flood", Duration::from_secs(60));
    let engine = start_engine("null");
    let plane = Arc::new(ControlPlane::new(engine.clone(), uid()));
    let flooders: Vec<RawChannel> = (0..2).map(|_| RawChannel::open(&plane)).collect();
    let mut victim = Prober {
        ch: RawChannel::open(&plane),
        sequence: 0,
    };
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        for ch in &flooders {
            let stop = &stop;
            s.spawn(move || flood_error_queue(ch, stop));
        }
        let until = Instant::now() + Duration::from_secs(1);
        let mut reports = 0u64;
        while Instant::now() < until {
            let slot = reports as usize % CHANNEL_TAGS;
            let sequence = victim.next_sequence();
            let code = victim.run(slot, 0, control_word(sequence, slot as u8, OP_READ, 4096));
            let code = code.unwrap_or_else(|| {
                panic!("report {reports} never arrived: lost from the shared error queue")
            });
            assert_eq!(code, ResultCode::MissingRecord, "report {reports}");
            reports += 1;
        }
        eprintln!(
            "{reports} error reports arrived during the flood; refusals: {:?}",
            engine.stats().unwrap().errors
        );
    });
}
