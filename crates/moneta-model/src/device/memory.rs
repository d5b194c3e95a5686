//! The interface between the scheduler/ring and a memory controller, and the
//! activity a controller reports for the power model (SPEC §1.6, §5).
//!
//! A controller is called in time order: the kernel invokes it at the
//! simulated instant a segment reaches it, so "busy until" state inside a
//! controller is an exact FIFO model of its bank(s) or ranks.

use crate::units::Ns;

/// Result of a write handed to a controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteTiming {
    /// When the controller's in-queue space used by this write is free again.
    pub queue_free_ns: Ns,
    /// When the data is in non-volatile cells.
    pub durable_ns: Ns,
    /// When the controller signals completion: `durable_ns` for late
    /// completion, earlier for Onyx's early completion (SPEC §5).
    pub ack_ns: Ns,
}

/// Counters a controller accumulates for the power model (SPEC §1.9).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ControllerActivity {
    /// Time the controller was busy moving or waiting on data.
    pub busy_ns: u64,
    /// Bytes read from / written to the memory array.
    pub array_bytes_read: u64,
    pub array_bytes_written: u64,
    /// Bytes moved through row buffers (or part buffers).
    pub row_buffer_bytes_read: u64,
    pub row_buffer_bytes_written: u64,
    /// Extra line writes made by wear leveling.
    pub wear_level_writes: u64,
    /// Requests served.
    pub reads: u64,
    pub writes: u64,
}

/// Timing model of one memory controller and the memory behind it.
pub trait MemoryTiming: Send {
    /// A read of `bytes` at controller-local byte address `local_addr`
    /// reaches the controller at `now_ns`. Returns when the data is in the
    /// controller's out-queue, ready to go onto the ring.
    fn read(&mut self, now_ns: Ns, local_addr: u64, bytes: u64) -> Ns;

    /// How long a read reaching the controller at `now_ns` would wait behind
    /// earlier work before its own access (where time goes: controller
    /// queue rather than array). A controller that does not say reports 0.
    fn read_wait_ns(&self, _now_ns: Ns) -> Ns {
        0
    }

    /// Earliest time at or after `now_ns` at which the in-queue has room for
    /// `bytes` (the scheduler's scoreboard check, SPEC §1.4).
    fn write_accept_ns(&self, now_ns: Ns, bytes: u64) -> Ns;

    /// A write's data streams into the controller from `first_byte_ns` to
    /// `last_byte_ns` (cut-through from the ring).
    fn write(
        &mut self,
        first_byte_ns: Ns,
        last_byte_ns: Ns,
        local_addr: u64,
        bytes: u64,
    ) -> WriteTiming;

    /// Activity so far.
    fn activity(&self) -> ControllerActivity;
}
