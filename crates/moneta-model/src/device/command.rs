//! The host → device command formats and their decoding (SPEC §1.2, with the
//! completion-method bit of §3.5 and the barrier flag of §1.4).
//!
//! Two formats exist:
//!
//! - **Baseline** (MICRO'10): three 64-bit PIO words.
//!
//!   | word | bits    | field |
//!   |------|---------|-------|
//!   | 0    | 63..0   | sector address (512 B units) |
//!   | 1    | 63..0   | host DMA address (bytes) |
//!   | 2    | 31..0   | length in bytes (a multiple of 512) |
//!   | 2    | 39..32  | tag |
//!   | 2    | 47..40  | command byte (below) |
//!   | 2    | 63..48  | reserved, must be zero |
//!
//! - **Atomic** (Moneta+Atomic, also Moneta-D's COMMAND register): one 64-bit
//!   word, fields in the order the papers list them, most significant first:
//!
//!   | bits    | field |
//!   |---------|-------|
//!   | 63..56  | tag |
//!   | 55..48  | command byte (below) |
//!   | 47..32  | length in 512 B sectors, 1..=65535 (0 is invalid, not 65536) |
//!   | 31..0   | internal address in 512 B sectors |
//!
//!   There is no DMA address: the tag selects a buffer pre-registered by the
//!   driver (SPEC §1.2), so [`Command::host_dma_addr`] is `None`.
//!
//! - **Channel** (Moneta-D, Appendix A's 16-byte command: LENGTH/INTADDR and
//!   CMD/TAG/DMA): what a user-space channel writes into the command slot of
//!   a tag. Byte-granular, because Moneta-D supports "arbitrarily sized and
//!   aligned reads and writes" (SPEC §3.1). The control word is written last
//!   with one atomic store, which is what submits the command; a zero control
//!   word is an empty slot.
//!
//!   | word | bits    | field |
//!   |------|---------|-------|
//!   | 0    | 63..0   | internal address in bytes |
//!   | 1    | 63..48  | sequence number, echoed in the completion status |
//!   | 1    | 47..40  | tag (the channel's virtual tag) |
//!   | 1    | 39..32  | command byte (below) |
//!   | 1    | 31..0   | length in bytes |
//!
//! The command byte is shared by all formats:
//!
//! | bits | field |
//! |------|-------|
//! | 1..0 | opcode: `01` read, `10` write; `00` and `11` are rejected |
//! | 2    | barrier (SPEC §1.4): later requests wait for this one |
//! | 3    | completion method (SPEC §3.5): 1 = DMA completion, 0 = interrupt |
//! | 7..4 | reserved, must be zero |
//!
//! An all-zero word therefore never decodes to a valid command. The exact bit
//! positions are this model's choice: the papers give the field widths, not
//! their placement.
//!
//! Decoding never panics: a malformed word from an untrusted client is an
//! error value ([`CommandError`]) carrying the tag so the device can report it
//! against that tag (SPEC §3.5). Left out: the Appendix A register map beyond
//! the command words (status, protection and SAN registers), and
//! channel/permission checks, which happen later in the pipeline.

use crate::units::{DeviceAddr, Op, SECTOR_BYTES};
use std::fmt;

/// Which of the two command layouts a word (or word triple) uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommandFormat {
    /// Three PIO words (MICRO'10 baseline).
    Baseline,
    /// One PIO word (Moneta+Atomic, Moneta-D).
    Atomic,
    /// A channel's two-word, byte-granular command slot (Moneta-D).
    Channel,
}

impl CommandFormat {
    pub fn as_str(self) -> &'static str {
        match self {
            CommandFormat::Baseline => "baseline",
            CommandFormat::Atomic => "atomic",
            CommandFormat::Channel => "channel",
        }
    }

    /// Longest request the format's length field can express.
    pub fn max_len_bytes(self) -> u64 {
        match self {
            // 32-bit byte length, rounded down to whole sectors.
            CommandFormat::Baseline => u64::from(u32::MAX) / SECTOR_BYTES * SECTOR_BYTES,
            CommandFormat::Atomic => ATOMIC_LEN_SECTORS_MAX * SECTOR_BYTES,
            CommandFormat::Channel => u64::from(u32::MAX),
        }
    }
}

/// A decoded request, independent of the format it arrived in.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct Command {
    /// The tag as the host wrote it (a virtual tag under Moneta-D, SPEC §1.4).
    pub tag: u8,
    pub op: Op,
    /// Start of the access in the device's internal address space.
    pub addr: DeviceAddr,
    pub len_bytes: u64,
    /// Where in host memory the data goes or comes from (baseline only).
    pub host_dma_addr: Option<u64>,
    /// Requests after this one wait until it completes (SPEC §1.4).
    pub barrier: bool,
    /// Complete by DMA-writing the status word instead of interrupting (SPEC §3.5).
    pub dma_completion: bool,
}

/// What the device accepts; checked by the decoders.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CommandLimits {
    pub capacity_bytes: u64,
    /// Tags per channel (`TAGCOUNT`, 64 in every Moneta, SPEC §1.2).
    pub tags: u32,
    /// Longest request the device accepts.
    pub max_len_bytes: u64,
}

impl CommandLimits {
    /// The limits of a device of `capacity_bytes` with `tags` tags, accepting
    /// any length the format can express.
    pub fn for_format(format: CommandFormat, capacity_bytes: u64, tags: u32) -> CommandLimits {
        CommandLimits {
            capacity_bytes,
            tags,
            max_len_bytes: format.max_len_bytes(),
        }
    }
}

/// Why a command was rejected.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum CommandErrorKind {
    /// The opcode field is neither read nor write.
    BadOpcode,
    ZeroLength,
    /// The tag is not below the device's tag count.
    TagOutOfRange,
    /// The access extends beyond the device's capacity (or the address space).
    OutOfRange,
    /// A byte length that is not a whole number of sectors.
    Misaligned,
    ReservedBitsSet,
    /// Longer than the device accepts or the format can express.
    TooLong,
    /// Encoding only: a baseline command needs a host DMA address and an
    /// atomic command cannot carry one.
    HostDmaAddress,
}

impl CommandErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CommandErrorKind::BadOpcode => "bad opcode",
            CommandErrorKind::ZeroLength => "zero length",
            CommandErrorKind::TagOutOfRange => "tag out of range",
            CommandErrorKind::OutOfRange => "access beyond capacity",
            CommandErrorKind::Misaligned => "length not a multiple of 512 B",
            CommandErrorKind::ReservedBitsSet => "reserved bits set",
            CommandErrorKind::TooLong => "request too long",
            CommandErrorKind::HostDmaAddress => "host DMA address does not fit the format",
        }
    }
}

/// A rejected command: the kind, the format, the tag it carried (so the
/// error can be reported against it), and the offending value with the limit
/// it broke (both 0 where they do not apply). No allocation: the device
/// returns these on the data path.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct CommandError {
    pub kind: CommandErrorKind,
    pub format: CommandFormat,
    pub tag: u8,
    pub value: u64,
    pub limit: u64,
}

impl fmt::Display for CommandError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} command, tag {}: {}",
            self.format.as_str(),
            self.tag,
            self.kind.as_str()
        )?;
        match self.kind {
            CommandErrorKind::BadOpcode => write!(f, " (opcode {:#04b})", self.value),
            CommandErrorKind::ReservedBitsSet => write!(f, " ({:#x})", self.value),
            CommandErrorKind::TagOutOfRange => write!(f, " ({} ≥ {} tags)", self.value, self.limit),
            CommandErrorKind::OutOfRange => {
                write!(f, " (end {} B > capacity {} B)", self.value, self.limit)
            }
            CommandErrorKind::Misaligned => write!(f, " ({} B)", self.value),
            CommandErrorKind::TooLong => write!(f, " ({} B > {} B)", self.value, self.limit),
            CommandErrorKind::ZeroLength | CommandErrorKind::HostDmaAddress => Ok(()),
        }
    }
}

impl std::error::Error for CommandError {}

// Command byte.
const OPCODE_MASK: u8 = 0b11;
const OPCODE_READ: u8 = 0b01;
const OPCODE_WRITE: u8 = 0b10;
const BARRIER_BIT: u8 = 1 << 2;
const DMA_COMPLETION_BIT: u8 = 1 << 3;
const COMMAND_RESERVED_MASK: u8 = 0xf0;

// Baseline word 2.
const BASELINE_TAG_SHIFT: u32 = 32;
const BASELINE_COMMAND_SHIFT: u32 = 40;
const BASELINE_RESERVED_MASK: u64 = 0xffff_0000_0000_0000;

// Atomic word.
const ATOMIC_TAG_SHIFT: u32 = 56;
const ATOMIC_COMMAND_SHIFT: u32 = 48;
const ATOMIC_LEN_SHIFT: u32 = 32;
const ATOMIC_LEN_SECTORS_MAX: u64 = 0xffff;
const ATOMIC_ADDR_SECTORS_MAX: u64 = 0xffff_ffff;

// Channel control word.
const CHANNEL_SEQUENCE_SHIFT: u32 = 48;
const CHANNEL_TAG_SHIFT: u32 = 40;
const CHANNEL_COMMAND_SHIFT: u32 = 32;

/// The fields of a command byte, before the other fields are checked.
struct CommandByte {
    op: Op,
    barrier: bool,
    dma_completion: bool,
}

fn decode_command_byte(
    byte: u8,
    error: impl Fn(CommandErrorKind, u64, u64) -> CommandError,
) -> Result<CommandByte, CommandError> {
    if byte & COMMAND_RESERVED_MASK != 0 {
        return Err(error(
            CommandErrorKind::ReservedBitsSet,
            u64::from(byte & COMMAND_RESERVED_MASK),
            0,
        ));
    }
    let op = match byte & OPCODE_MASK {
        OPCODE_READ => Op::Read,
        OPCODE_WRITE => Op::Write,
        other => return Err(error(CommandErrorKind::BadOpcode, u64::from(other), 0)),
    };
    Ok(CommandByte {
        op,
        barrier: byte & BARRIER_BIT != 0,
        dma_completion: byte & DMA_COMPLETION_BIT != 0,
    })
}

fn encode_command_byte(command: &Command) -> u8 {
    let opcode = match command.op {
        Op::Read => OPCODE_READ,
        Op::Write => OPCODE_WRITE,
    };
    let barrier = if command.barrier { BARRIER_BIT } else { 0 };
    let dma_completion = if command.dma_completion {
        DMA_COMPLETION_BIT
    } else {
        0
    };
    opcode | barrier | dma_completion
}

/// The checks both formats share, on a byte address and length already
/// extracted from the fields (in this order: tag, zero length, too long,
/// capacity).
fn check_limits(
    format: CommandFormat,
    tag: u8,
    addr_bytes: u64,
    len_bytes: u64,
    limits: &CommandLimits,
) -> Result<(), CommandError> {
    let error = |kind, value, limit| CommandError {
        kind,
        format,
        tag,
        value,
        limit,
    };
    if u32::from(tag) >= limits.tags {
        return Err(error(
            CommandErrorKind::TagOutOfRange,
            u64::from(tag),
            u64::from(limits.tags),
        ));
    }
    if len_bytes == 0 {
        return Err(error(CommandErrorKind::ZeroLength, 0, 0));
    }
    if len_bytes > limits.max_len_bytes {
        return Err(error(
            CommandErrorKind::TooLong,
            len_bytes,
            limits.max_len_bytes,
        ));
    }
    match addr_bytes.checked_add(len_bytes) {
        Some(end) if end <= limits.capacity_bytes => Ok(()),
        Some(end) => Err(error(
            CommandErrorKind::OutOfRange,
            end,
            limits.capacity_bytes,
        )),
        None => Err(error(
            CommandErrorKind::OutOfRange,
            u64::MAX,
            limits.capacity_bytes,
        )),
    }
}

/// Decode the three baseline PIO words (sector address, host DMA address,
/// length/tag/command).
pub fn decode_baseline(words: [u64; 3], limits: &CommandLimits) -> Result<Command, CommandError> {
    let format = CommandFormat::Baseline;
    let [sector, host_dma_addr, control] = words;
    let tag = (control >> BASELINE_TAG_SHIFT) as u8;
    let error = |kind, value, limit| CommandError {
        kind,
        format,
        tag,
        value,
        limit,
    };
    if control & BASELINE_RESERVED_MASK != 0 {
        return Err(error(
            CommandErrorKind::ReservedBitsSet,
            control & BASELINE_RESERVED_MASK,
            0,
        ));
    }
    let byte = decode_command_byte((control >> BASELINE_COMMAND_SHIFT) as u8, error)?;
    let len_bytes = control & u64::from(u32::MAX);
    if !len_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(error(CommandErrorKind::Misaligned, len_bytes, SECTOR_BYTES));
    }
    // A sector address whose byte address overflows is beyond any capacity.
    let addr_bytes = sector.checked_mul(SECTOR_BYTES).ok_or_else(|| {
        error(
            CommandErrorKind::OutOfRange,
            u64::MAX,
            limits.capacity_bytes,
        )
    })?;
    check_limits(format, tag, addr_bytes, len_bytes, limits)?;
    Ok(Command {
        tag,
        op: byte.op,
        addr: DeviceAddr(addr_bytes),
        len_bytes,
        host_dma_addr: Some(host_dma_addr),
        barrier: byte.barrier,
        dma_completion: byte.dma_completion,
    })
}

/// Decode one atomic command word.
pub fn decode_atomic(word: u64, limits: &CommandLimits) -> Result<Command, CommandError> {
    let format = CommandFormat::Atomic;
    let tag = (word >> ATOMIC_TAG_SHIFT) as u8;
    let error = |kind, value, limit| CommandError {
        kind,
        format,
        tag,
        value,
        limit,
    };
    let byte = decode_command_byte((word >> ATOMIC_COMMAND_SHIFT) as u8, error)?;
    let len_sectors = (word >> ATOMIC_LEN_SHIFT) & ATOMIC_LEN_SECTORS_MAX;
    let addr_sectors = word & ATOMIC_ADDR_SECTORS_MAX;
    // Both fit comfortably: 16 + 9 and 32 + 9 bits.
    let len_bytes = len_sectors * SECTOR_BYTES;
    let addr_bytes = addr_sectors * SECTOR_BYTES;
    check_limits(format, tag, addr_bytes, len_bytes, limits)?;
    Ok(Command {
        tag,
        op: byte.op,
        addr: DeviceAddr(addr_bytes),
        len_bytes,
        host_dma_addr: None,
        barrier: byte.barrier,
        dma_completion: byte.dma_completion,
    })
}

/// Decode a channel's command slot (address word, control word). Returns the
/// command and the sequence number the completion must echo.
pub fn decode_channel(
    words: [u64; 2],
    limits: &CommandLimits,
) -> Result<(Command, u16), CommandError> {
    let format = CommandFormat::Channel;
    let [addr_bytes, control] = words;
    let tag = (control >> CHANNEL_TAG_SHIFT) as u8;
    let error = |kind, value, limit| CommandError {
        kind,
        format,
        tag,
        value,
        limit,
    };
    let byte = decode_command_byte((control >> CHANNEL_COMMAND_SHIFT) as u8, error)?;
    let len_bytes = control & u64::from(u32::MAX);
    check_limits(format, tag, addr_bytes, len_bytes, limits)?;
    let command = Command {
        tag,
        op: byte.op,
        addr: DeviceAddr(addr_bytes),
        len_bytes,
        host_dma_addr: None,
        barrier: byte.barrier,
        dma_completion: byte.dma_completion,
    };
    Ok((command, (control >> CHANNEL_SEQUENCE_SHIFT) as u16))
}

/// The fields a device needs to report on a channel command that may not
/// decode: (sequence number, whether DMA completion was asked for).
pub fn channel_reply_fields(control: u64) -> (u16, bool) {
    let byte = (control >> CHANNEL_COMMAND_SHIFT) as u8;
    (
        (control >> CHANNEL_SEQUENCE_SHIFT) as u16,
        byte & DMA_COMPLETION_BIT != 0,
    )
}

/// Encode `command` for a channel's command slot, with the sequence number
/// the completion will echo. Any byte address and length up to 4 GiB − 1.
pub fn encode_channel(command: &Command, sequence: u16) -> Result<[u64; 2], CommandError> {
    let format = CommandFormat::Channel;
    let error = |kind, value, limit| CommandError {
        kind,
        format,
        tag: command.tag,
        value,
        limit,
    };
    if command.len_bytes == 0 {
        return Err(error(CommandErrorKind::ZeroLength, 0, 0));
    }
    if command.len_bytes > format.max_len_bytes() {
        return Err(error(
            CommandErrorKind::TooLong,
            command.len_bytes,
            format.max_len_bytes(),
        ));
    }
    if command.host_dma_addr.is_some() {
        return Err(error(CommandErrorKind::HostDmaAddress, 0, 0));
    }
    let control = (u64::from(sequence) << CHANNEL_SEQUENCE_SHIFT)
        | (u64::from(command.tag) << CHANNEL_TAG_SHIFT)
        | (u64::from(encode_command_byte(command)) << CHANNEL_COMMAND_SHIFT)
        | command.len_bytes;
    Ok([command.addr.0, control])
}

/// Checks that `command`'s address and length can be written in sectors and
/// fit the format's length field and an address field of `addr_sectors_max`.
fn check_representable(
    format: CommandFormat,
    command: &Command,
    addr_sectors_max: u64,
) -> Result<(), CommandError> {
    let error = |kind, value, limit| CommandError {
        kind,
        format,
        tag: command.tag,
        value,
        limit,
    };
    if command.len_bytes == 0 {
        return Err(error(CommandErrorKind::ZeroLength, 0, 0));
    }
    if !command.len_bytes.is_multiple_of(SECTOR_BYTES) {
        return Err(error(
            CommandErrorKind::Misaligned,
            command.len_bytes,
            SECTOR_BYTES,
        ));
    }
    if !command.addr.0.is_multiple_of(SECTOR_BYTES) {
        return Err(error(
            CommandErrorKind::Misaligned,
            command.addr.0,
            SECTOR_BYTES,
        ));
    }
    if command.len_bytes > format.max_len_bytes() {
        return Err(error(
            CommandErrorKind::TooLong,
            command.len_bytes,
            format.max_len_bytes(),
        ));
    }
    if command.addr.0 / SECTOR_BYTES > addr_sectors_max {
        return Err(error(
            CommandErrorKind::OutOfRange,
            command.addr.0,
            addr_sectors_max.saturating_mul(SECTOR_BYTES),
        ));
    }
    Ok(())
}

/// Encode `command` as the three baseline words. Fails if the command cannot
/// be expressed in the format (no host DMA address, unaligned address or
/// length, length beyond 32 bits); device limits are the decoder's business.
pub fn encode_baseline(command: &Command) -> Result<[u64; 3], CommandError> {
    let format = CommandFormat::Baseline;
    check_representable(format, command, u64::MAX / SECTOR_BYTES)?;
    let host_dma_addr = command.host_dma_addr.ok_or(CommandError {
        kind: CommandErrorKind::HostDmaAddress,
        format,
        tag: command.tag,
        value: 0,
        limit: 0,
    })?;
    let control = command.len_bytes
        | (u64::from(command.tag) << BASELINE_TAG_SHIFT)
        | (u64::from(encode_command_byte(command)) << BASELINE_COMMAND_SHIFT);
    Ok([command.addr.0 / SECTOR_BYTES, host_dma_addr, control])
}

/// Encode `command` as one atomic word. Fails if it carries a host DMA
/// address or does not fit the 16-bit length / 32-bit address fields.
pub fn encode_atomic(command: &Command) -> Result<u64, CommandError> {
    let format = CommandFormat::Atomic;
    check_representable(format, command, ATOMIC_ADDR_SECTORS_MAX)?;
    if command.host_dma_addr.is_some() {
        return Err(CommandError {
            kind: CommandErrorKind::HostDmaAddress,
            format,
            tag: command.tag,
            value: 0,
            limit: 0,
        });
    }
    Ok((u64::from(command.tag) << ATOMIC_TAG_SHIFT)
        | (u64::from(encode_command_byte(command)) << ATOMIC_COMMAND_SHIFT)
        | ((command.len_bytes / SECTOR_BYTES) << ATOMIC_LEN_SHIFT)
        | (command.addr.0 / SECTOR_BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GB: u64 = 1 << 30;

    fn limits(format: CommandFormat) -> CommandLimits {
        CommandLimits::for_format(format, 64 * GB, 64)
    }

    fn write_4k(tag: u8) -> Command {
        Command {
            tag,
            op: Op::Write,
            addr: DeviceAddr(1 << 20),
            len_bytes: 4096,
            host_dma_addr: None,
            barrier: false,
            dma_completion: true,
        }
    }

    fn baseline(command: Command) -> Command {
        Command {
            host_dma_addr: Some(0x1234_5000),
            ..command
        }
    }

    fn atomic_word(tag: u8, command_byte: u8, len_sectors: u64, addr_sectors: u64) -> u64 {
        (u64::from(tag) << 56)
            | (u64::from(command_byte) << 48)
            | (len_sectors << 32)
            | addr_sectors
    }

    fn kind_atomic(word: u64) -> CommandErrorKind {
        decode_atomic(word, &limits(CommandFormat::Atomic))
            .unwrap_err()
            .kind
    }

    fn kind_baseline(words: [u64; 3]) -> CommandErrorKind {
        decode_baseline(words, &limits(CommandFormat::Baseline))
            .unwrap_err()
            .kind
    }

    #[test]
    fn atomic_layout_matches_the_documented_bits() {
        // Tag 5, write with barrier and DMA completion, 8 sectors at sector 2048.
        let word = atomic_word(5, 0b1110, 8, 2048);
        let command = decode_atomic(word, &limits(CommandFormat::Atomic)).unwrap();
        assert_eq!(
            command,
            Command {
                tag: 5,
                op: Op::Write,
                addr: DeviceAddr(2048 * 512),
                len_bytes: 4096,
                host_dma_addr: None,
                barrier: true,
                dma_completion: true
            }
        );
        assert_eq!(encode_atomic(&command).unwrap(), word);
    }

    #[test]
    fn baseline_layout_matches_the_documented_bits() {
        let words = [2048, 0xdead_b000, 4096 | (7 << 32) | (0b0001 << 40)];
        let command = decode_baseline(words, &limits(CommandFormat::Baseline)).unwrap();
        assert_eq!(command.tag, 7);
        assert_eq!(command.op, Op::Read);
        assert_eq!(command.addr, DeviceAddr(2048 * 512));
        assert_eq!(command.len_bytes, 4096);
        assert_eq!(command.host_dma_addr, Some(0xdead_b000));
        assert!(!command.barrier && !command.dma_completion);
        assert_eq!(encode_baseline(&command).unwrap(), words);
    }

    #[test]
    fn round_trips() {
        for tag in [0, 1, 63] {
            for op in [Op::Read, Op::Write] {
                for (barrier, dma_completion) in
                    [(false, false), (true, false), (false, true), (true, true)]
                {
                    let command = Command {
                        op,
                        barrier,
                        dma_completion,
                        ..write_4k(tag)
                    };
                    let word = encode_atomic(&command).unwrap();
                    assert_eq!(
                        decode_atomic(word, &limits(CommandFormat::Atomic)),
                        Ok(command)
                    );
                    let command = baseline(command);
                    let words = encode_baseline(&command).unwrap();
                    assert_eq!(
                        decode_baseline(words, &limits(CommandFormat::Baseline)),
                        Ok(command)
                    );
                }
            }
        }
        // The extremes of the atomic fields: the last 65535 sectors of a 2 TB space.
        let huge = CommandLimits {
            capacity_bytes: 1 << 41,
            ..limits(CommandFormat::Atomic)
        };
        let last = Command {
            addr: DeviceAddr((1 << 41) - 0xffff * 512),
            len_bytes: 0xffff * 512,
            ..write_4k(0)
        };
        assert_eq!(
            decode_atomic(encode_atomic(&last).unwrap(), &huge),
            Ok(last)
        );
    }

    #[test]
    fn bad_opcode() {
        assert_eq!(
            kind_atomic(atomic_word(0, 0b00, 8, 0)),
            CommandErrorKind::BadOpcode
        );
        assert_eq!(
            kind_atomic(atomic_word(0, 0b11, 8, 0)),
            CommandErrorKind::BadOpcode
        );
        assert_eq!(kind_atomic(0), CommandErrorKind::BadOpcode);
        assert_eq!(kind_baseline([0, 0, 4096]), CommandErrorKind::BadOpcode);
    }

    #[test]
    fn reserved_bits() {
        assert_eq!(
            kind_atomic(atomic_word(0, 0x11, 8, 0)),
            CommandErrorKind::ReservedBitsSet
        );
        assert_eq!(
            kind_baseline([0, 0, 4096 | (1 << 40) | (1 << 63)]),
            CommandErrorKind::ReservedBitsSet
        );
        assert_eq!(
            kind_baseline([0, 0, 4096 | (0x81 << 40)]),
            CommandErrorKind::ReservedBitsSet
        );
    }

    #[test]
    fn zero_length() {
        assert_eq!(
            kind_atomic(atomic_word(0, 1, 0, 0)),
            CommandErrorKind::ZeroLength
        );
        assert_eq!(kind_baseline([0, 0, 1 << 40]), CommandErrorKind::ZeroLength);
        assert_eq!(
            encode_atomic(&Command {
                len_bytes: 0,
                ..write_4k(0)
            })
            .unwrap_err()
            .kind,
            CommandErrorKind::ZeroLength
        );
    }

    #[test]
    fn tag_out_of_range() {
        let e =
            decode_atomic(atomic_word(64, 1, 8, 0), &limits(CommandFormat::Atomic)).unwrap_err();
        assert_eq!(
            (e.kind, e.tag, e.value, e.limit),
            (CommandErrorKind::TagOutOfRange, 64, 64, 64)
        );
        assert_eq!(
            kind_baseline([0, 0, 4096 | (200 << 32) | (1 << 40)]),
            CommandErrorKind::TagOutOfRange
        );
    }

    #[test]
    fn out_of_range_is_overflow_safe() {
        // Last sector of the device is fine; one more is not.
        let l = limits(CommandFormat::Atomic);
        let last_sector = 64 * GB / 512 - 1;
        assert!(decode_atomic(atomic_word(0, 1, 1, last_sector), &l).is_ok());
        assert_eq!(
            kind_atomic(atomic_word(0, 1, 2, last_sector)),
            CommandErrorKind::OutOfRange
        );
        // Baseline sector addresses near u64::MAX overflow in bytes and in addr + len.
        assert_eq!(
            kind_baseline([u64::MAX, 0, 4096 | (1 << 40)]),
            CommandErrorKind::OutOfRange
        );
        assert_eq!(
            kind_baseline([u64::MAX / 512, 0, 4096 | (1 << 40)]),
            CommandErrorKind::OutOfRange
        );
        let e = decode_atomic(atomic_word(0, 1, 8, 0xffff_ffff), &l).unwrap_err();
        assert_eq!(e.limit, 64 * GB);
        // Encoding an address beyond 32 bits of sectors is rejected, not truncated.
        let far = Command {
            addr: DeviceAddr(1 << 42),
            ..write_4k(0)
        };
        assert_eq!(
            encode_atomic(&far).unwrap_err().kind,
            CommandErrorKind::OutOfRange
        );
    }

    #[test]
    fn misaligned() {
        assert_eq!(
            kind_baseline([0, 0, 4000 | (1 << 40)]),
            CommandErrorKind::Misaligned
        );
        let odd = Command {
            addr: DeviceAddr(100),
            ..write_4k(0)
        };
        assert_eq!(
            encode_atomic(&odd).unwrap_err().kind,
            CommandErrorKind::Misaligned
        );
        let odd = Command {
            len_bytes: 1000,
            ..baseline(write_4k(0))
        };
        assert_eq!(
            encode_baseline(&odd).unwrap_err().kind,
            CommandErrorKind::Misaligned
        );
    }

    #[test]
    fn too_long() {
        let small = CommandLimits {
            max_len_bytes: 8192,
            ..limits(CommandFormat::Atomic)
        };
        let e = decode_atomic(atomic_word(0, 1, 17, 0), &small).unwrap_err();
        assert_eq!(
            (e.kind, e.value, e.limit),
            (CommandErrorKind::TooLong, 17 * 512, 8192)
        );
        let long = Command {
            len_bytes: 65536 * 512,
            ..write_4k(0)
        };
        assert_eq!(
            encode_atomic(&long).unwrap_err().kind,
            CommandErrorKind::TooLong
        );
        let long = Command {
            len_bytes: 1 << 32,
            ..baseline(write_4k(0))
        };
        assert_eq!(
            encode_baseline(&long).unwrap_err().kind,
            CommandErrorKind::TooLong
        );
    }

    #[test]
    fn host_dma_address_must_match_the_format() {
        assert_eq!(
            encode_baseline(&write_4k(0)).unwrap_err().kind,
            CommandErrorKind::HostDmaAddress
        );
        assert_eq!(
            encode_atomic(&baseline(write_4k(0))).unwrap_err().kind,
            CommandErrorKind::HostDmaAddress
        );
    }

    #[test]
    fn errors_display_their_context() {
        let e = decode_atomic(
            atomic_word(9, 1, 2, 64 * GB / 512 - 1),
            &limits(CommandFormat::Atomic),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("atomic") && text.contains("tag 9") && text.contains("capacity"),
            "{text}"
        );
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert!(!boxed.to_string().is_empty());
    }

    fn arb_command(format: CommandFormat) -> impl Strategy<Value = Command> {
        let capacity_sectors = 64 * GB / 512;
        let max_len_sectors = format.max_len_bytes() / 512;
        (
            0u8..64,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            1..=max_len_sectors.min(capacity_sectors),
            any::<u64>(),
            any::<u64>(),
        )
            .prop_map(
                move |(
                    tag,
                    write,
                    barrier,
                    dma_completion,
                    len_sectors,
                    addr_seed,
                    host_dma_addr,
                )| Command {
                    tag,
                    op: if write { Op::Write } else { Op::Read },
                    addr: DeviceAddr(addr_seed % (capacity_sectors - len_sectors + 1) * 512),
                    len_bytes: len_sectors * 512,
                    host_dma_addr: match format {
                        CommandFormat::Baseline => Some(host_dma_addr),
                        CommandFormat::Atomic | CommandFormat::Channel => None,
                    },
                    barrier,
                    dma_completion,
                },
            )
    }

    proptest! {
        #[test]
        fn decode_atomic_never_panics(word in any::<u64>(), capacity in any::<u64>(), tags in any::<u32>(), max_len in any::<u64>()) {
            let limits = CommandLimits { capacity_bytes: capacity, tags, max_len_bytes: max_len };
            if let Ok(c) = decode_atomic(word, &limits) {
                prop_assert!(c.addr.0 + c.len_bytes <= capacity);
                prop_assert!(c.len_bytes > 0 && c.len_bytes <= max_len);
                prop_assert!(u32::from(c.tag) < tags);
            }
        }

        #[test]
        fn decode_baseline_never_panics(words in any::<[u64; 3]>(), capacity in any::<u64>(), tags in any::<u32>(), max_len in any::<u64>()) {
            let limits = CommandLimits { capacity_bytes: capacity, tags, max_len_bytes: max_len };
            if let Ok(c) = decode_baseline(words, &limits) {
                prop_assert!(c.addr.0.checked_add(c.len_bytes).is_some_and(|end| end <= capacity));
                prop_assert!(c.len_bytes > 0 && c.len_bytes <= max_len && c.len_bytes % 512 == 0);
            }
        }

        #[test]
        fn atomic_encode_then_decode_is_identity(command in arb_command(CommandFormat::Atomic)) {
            let word = encode_atomic(&command).unwrap();
            prop_assert_eq!(decode_atomic(word, &limits(CommandFormat::Atomic)), Ok(command));
        }

        #[test]
        fn baseline_encode_then_decode_is_identity(command in arb_command(CommandFormat::Baseline)) {
            let words = encode_baseline(&command).unwrap();
            prop_assert_eq!(decode_baseline(words, &limits(CommandFormat::Baseline)), Ok(command));
        }

        #[test]
        fn decode_channel_never_panics(words in any::<[u64; 2]>(), capacity in any::<u64>(), tags in any::<u32>(), max_len in any::<u64>()) {
            let limits = CommandLimits { capacity_bytes: capacity, tags, max_len_bytes: max_len };
            if let Ok((c, sequence)) = decode_channel(words, &limits) {
                prop_assert!(c.addr.0.checked_add(c.len_bytes).is_some_and(|end| end <= capacity));
                prop_assert!(c.len_bytes > 0 && c.len_bytes <= max_len);
                prop_assert!(u32::from(c.tag) < tags);
                prop_assert_eq!(encode_channel(&c, sequence), Ok(words));
            }
        }

        #[test]
        fn channel_encode_then_decode_is_identity(command in arb_command(CommandFormat::Channel), sequence in any::<u16>(), skew in 0u64..512) {
            // Byte-granular: shift the address and trim the length off sector boundaries.
            let command = Command { addr: DeviceAddr(command.addr.0 + skew.min(command.len_bytes - 1)), len_bytes: command.len_bytes - skew.min(command.len_bytes - 1), ..command };
            let words = encode_channel(&command, sequence).unwrap();
            prop_assert_eq!(decode_channel(words, &limits(CommandFormat::Channel)), Ok((command, sequence)));
        }

        #[test]
        fn decode_then_encode_is_identity(word in any::<u64>()) {
            if let Ok(c) = decode_atomic(word, &limits(CommandFormat::Atomic)) {
                prop_assert_eq!(encode_atomic(&c), Ok(word));
            }
        }
    }
}
