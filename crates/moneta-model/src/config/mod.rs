//! Configuration as data: every parameter of the model, loaded from TOML
//! presets shipped with the binary and overridable key by key.
//!
//! A preset names the published system it models; every calibrated constant
//! in `presets/*.toml` cites the table or section it comes from. A
//! configuration file (`--config FILE.toml`) has the same schema and goes
//! through the same loading (`layer.rs`): strict, so unknown keys, unknown
//! enum values and impossible values are errors that name the key
//! (DESIGN.md "Configuration as data").

pub(crate) mod layer;
mod presets;
mod technology;

pub use presets::{preset_names, preset_source, PRESETS};
pub(crate) use technology::names as technology_names;
pub use technology::{Technology, TECHNOLOGIES};

use crate::device::packet::{self, HEADER_BYTES};
use crate::units::{transfer_ns, Ns};
use serde::{Deserialize, Serialize};
use std::fmt;

/// A configuration error: which key, what is wrong with it, and what it
/// came from when something else failed first (the file that could not be
/// read), kept as its [`source`](std::error::Error::source). The model's
/// [`crate::Error`] carries it as the cause of an `ErrorKind::Config`.
#[derive(Debug, Clone)]
pub struct ConfigError {
    pub key: String,
    pub message: String,
    cause: Option<std::sync::Arc<dyn std::error::Error + Send + Sync + 'static>>,
}

impl ConfigError {
    /// `key` could not be read because of `cause` (its text is the message).
    pub(crate) fn caused(
        key: &str,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> ConfigError {
        ConfigError {
            key: key.to_string(),
            message: String::new(),
            cause: Some(std::sync::Arc::new(cause)),
        }
    }
}

/// Two errors are the same when they name the same key and say the same;
/// their causes are not compared.
impl PartialEq for ConfigError {
    fn eq(&self, other: &ConfigError) -> bool {
        self.key == other.key && self.message == other.message
    }
}

/// `key: message: cause`, each part only when there is one.
impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cause = self.cause.as_ref().map(|c| c.to_string());
        let parts = [
            Some(self.key.as_str()),
            Some(self.message.as_str()),
            cause.as_deref(),
        ];
        let mut first = true;
        for part in parts.into_iter().flatten().filter(|p| !p.is_empty()) {
            if !first {
                f.write_str(": ")?;
            }
            f.write_str(part)?;
            first = false;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause
            .as_deref()
            .map(|c| c as &(dyn std::error::Error + 'static))
    }
}

pub(crate) fn err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.to_string(),
        message: message.into(),
        cause: None,
    }
}

/// How the device's request queues order work (SPEC §1.4).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuePolicy {
    /// One queue, requests processed in arrival order (MICRO'10 baseline).
    Fifo,
    /// Separate read and write queues served alternately (Moneta+2Q).
    #[serde(rename = "2q")]
    TwoQueue,
    /// Two queues, round-robin between requests within a queue (Moneta+Balance).
    Balance,
}

/// Which memory controller model the array uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ControllerKind {
    /// DDR-style controller with row buffers and inserted latencies (SPEC §1.6).
    Moneta,
    /// Onyx's PCM controller driving P8P ranks (SPEC §5).
    OnyxPcm,
}

/// The host software stack driving the device (SPEC §2.2, §3.5, §6).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stack {
    Base,
    NoSched,
    Atomic,
    Spin,
    #[serde(rename = "2q")]
    TwoQueue,
    Balance,
    /// Moneta-D: user-space library, device-checked permissions (SPEC §3).
    Direct,
    /// DDR-attached NVM ramdisk: the CPU copies, no device (SPEC §6).
    Ramdisk,
    /// No host software at all: a request reaches the device when issued and
    /// is seen the moment the device completes it. The device's own time,
    /// for comparison with the emulator, whose software is real.
    Raw,
}

impl Stack {
    pub const ALL: [Stack; 9] = [
        Stack::Base,
        Stack::NoSched,
        Stack::Atomic,
        Stack::Spin,
        Stack::TwoQueue,
        Stack::Balance,
        Stack::Direct,
        Stack::Ramdisk,
        Stack::Raw,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stack::Base => "base",
            Stack::NoSched => "nosched",
            Stack::Atomic => "atomic",
            Stack::Spin => "spin",
            Stack::TwoQueue => "2q",
            Stack::Balance => "balance",
            Stack::Direct => "direct",
            Stack::Ramdisk => "ramdisk",
            Stack::Raw => "raw",
        }
    }

    pub fn parse(s: &str) -> Result<Stack, ConfigError> {
        Stack::ALL
            .iter()
            .copied()
            .find(|st| st.name() == s)
            .ok_or_else(|| {
                let names = Stack::ALL.iter().map(|st| st.name());
                err(
                    "host.stack",
                    format!(
                        "unknown stack '{s}'{} (expected one of {})",
                        crate::suggest::did_you_mean(s, names.clone()),
                        names.collect::<Vec<_>>().join(", ")
                    ),
                )
            })
    }

    /// The queue policy a kernel-stack step implies for the device, if any:
    /// Moneta+2Q and Moneta+Balance are hardware steps (SPEC §2.2).
    pub fn implied_queue_policy(self) -> Option<QueuePolicy> {
        match self {
            Stack::TwoQueue => Some(QueuePolicy::TwoQueue),
            Stack::Balance => Some(QueuePolicy::Balance),
            _ => None,
        }
    }
}

/// How much of a sleeping thread's wake-up runs on the core it gets
/// (`host.wake_on_core`); the rest is latency off the cores.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WakeOnCore {
    /// SPEC §2.2's context switch (`io_scheduler_switch_ns`, 2 µs) only.
    #[default]
    Switch,
    /// Table 3.1's whole wake-up (`wake_ns_read` / `wake_ns_write`, "thread
    /// sleep during hw" minus the hardware total, 4.3 / 3.6 µs): dissertation
    /// §3.3.3, "Responding to the interrupt ... requires a context switch to
    /// wake up the thread ... This process adds latency and limits
    /// performance".
    Whole,
    /// The wake-up split where Linux 2.6 runs it: the handler calls
    /// `wake_up_process` → `try_to_wake_up` for each request it completes,
    /// on the interrupt core, so Table 3.1's wake-up beyond SPEC §2.2's
    /// switch (4.3 − 2.0 = 2.3 µs for reads, 3.6 − 2.0 = 1.6 µs for
    /// writes) runs there, once per woken thread and one after another
    /// (the handler's loop over its completed tags); the 2 µs switch runs
    /// on the core the thread then gets. The CPU per request is
    /// [`WakeOnCore::Whole`]'s; a lone request's latency is the same.
    /// Source: Linux 2.6.18 kernel/sched.c (`try_to_wake_up` runs on the
    /// waker's CPU, takes the wakee's run-queue lock, enqueues it and
    /// sends a reschedule IPI when the wakee's CPU is another) and
    /// dissertation §3.3.3 ("Responding to the interrupt that signals the
    /// completion of an IO request requires a context switch to wake up
    /// the thread that issued the request").
    Handler,
}

/// Completion technique of the Moneta-D direct stack (SPEC §3.5).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Completion {
    /// The device DMA-writes the result into the tag's status word; the thread spins on it.
    Dma,
    /// The kernel's interrupt handler forwards completions into COMPLETIONCOUNT.
    Forwarding,
    /// Issue, then sleep in a system call until the interrupt.
    IssueSleep,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Preset name this configuration was built from.
    pub name: String,
    /// One line: which published system this models.
    pub description: String,
    pub device: DeviceConfig,
    pub link: LinkConfig,
    pub ring: RingConfig,
    pub memory: MemoryConfig,
    pub start_gap: StartGapConfig,
    pub onyx: OnyxConfig,
    pub host: HostConfig,
    pub direct: DirectConfig,
    pub ramdisk: RamdiskConfig,
    pub power: PowerConfig,
    pub network: NetworkConfig,
    /// QuickSAN hosts' interfaces (Table 5.1 and the kernel paths' mechanisms).
    pub san: InterfaceCosts,
}

/// Scheduler, tags, buffers (SPEC §1.2–1.4).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DeviceConfig {
    pub capacity_bytes: u64,
    pub tags: u32,
    pub transfer_buffers: u32,
    pub buffer_bytes: u64,
    pub queue_policy: QueuePolicy,
    /// Cycles from the command register through retag and protection into
    /// the queues, at the 250 MHz design clock.
    pub pipeline_ns: u64,
    /// A write segment keeps its transfer buffer until the memory controller
    /// signals its completion (Onyx: early or late), instead of releasing it
    /// once the data has crossed the ring (Moneta, MICRO'10 §III.A). SPEC §1.4, §5.
    #[serde(default)]
    pub write_buffer_until_ack: bool,
}

/// PCIe link and DMA engine (SPEC §1.1).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LinkConfig {
    /// Raw rate per direction (PCIe 1.1 ×8: 2 GB/s).
    pub bandwidth_bytes_per_s: f64,
    /// Negotiated max payload per TLP; DMA splits transfers to it.
    pub max_payload_bytes: u64,
    /// Per-TLP framing, header, sequence number and LCRC.
    pub tlp_overhead_bytes: u64,
    /// Host-to-device DMA: time for the host memory to answer the first read request.
    pub latency_ns_host_to_device: u64,
    /// Device-to-host DMA: time until the first posted write is in host memory.
    pub latency_ns_device_to_host: u64,
    /// Transfers from the host the DMA engine can track at once.
    pub max_outstanding_host_to_device: u32,
}

/// Token ring between the scheduler and the memory controllers (SPEC §1.5).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RingConfig {
    pub bandwidth_bytes_per_s: f64,
    /// Time for a flit to go once around the ring.
    pub round_trip_ns: u64,
    /// Largest packet a router sends before releasing the token.
    pub packet_bytes: u64,
}

/// Memory controllers and the memory technology (SPEC §1.6, §1.8).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MemoryConfig {
    pub controller: ControllerKind,
    pub controllers: u32,
    pub stripe_bytes: u64,
    /// Name of the technology whose latencies are below (SPEC §1.8).
    pub technology: String,
    /// Array read latency, paid once per row opened.
    pub latency_ns_read: u64,
    /// Array write latency (extended precharge), paid once per row written.
    pub latency_ns_write: u64,
    /// Virtual row (row buffer) size.
    pub row_bytes: u64,
    /// DDR transfer rate between row buffer and controller.
    pub ddr_bytes_per_s: f64,
    /// Controller pipeline: command decode and DDR command sequencing.
    pub controller_ns: u64,
    /// Size of each controller's in and out queue.
    pub queue_bytes: u64,
}

/// Start-gap wear leveling with address randomization (SPEC §1.7).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StartGapConfig {
    pub enabled: bool,
    pub line_bytes: u64,
    /// Writes between gap moves (G, ψ).
    pub gap_interval_writes: u64,
    pub randomize: bool,
    /// Track per-line write counts (memory: 8 B per line).
    pub track_wear: bool,
}

fn default_page_read_ns() -> u64 {
    25
}

/// Onyx's P8P PCM controller (SPEC §5).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OnyxConfig {
    pub ranks: u32,
    pub parts_per_rank: u32,
    /// Write buffer per part (64 B), filled then committed.
    pub write_buffer_bytes: u64,
    /// Time to commit one buffered write of random data.
    pub buffered_write_ns: u64,
    /// Read of 16 B from one part.
    pub read_ns_per_16_bytes: u64,
    /// The controller reads in increments of this many ns (125 MHz design).
    pub read_increment_ns: u64,
    /// One page-mode read of a 2 B word from a part's 16 B internal buffer
    /// (Onyx thesis §4.1.2: "25 ns per chunk of data").
    #[serde(default = "default_page_read_ns")]
    pub page_read_ns: u64,
    /// Clock period of the controller.
    pub clock_ns: u64,
    /// Cycles to send a write's command and metadata to a rank.
    pub write_setup_cycles: u64,
    /// Cycles of a status-register poll.
    pub status_poll_cycles: u64,
    /// Signal write completion when data leaves the scheduler FIFOs (true),
    /// or when it is in the PCM array (false).
    pub early_completion: bool,
}

/// Host CPU and kernel stack (SPEC §2).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HostConfig {
    pub stack: Stack,
    /// Physical cores.
    pub cores: u32,
    /// Hardware thread contexts per core (SMT; Intel Hyper-Threading). A
    /// thread holds a context while it computes, spins or polls; a core's
    /// contexts share its execution: one context's software runs while its
    /// sibling's waits, and a context that spins holds the context, not
    /// the core. 1 = no SMT.
    pub threads_per_core: u32,
    /// Spinning stacks spin for requests up to this size and sleep above it.
    pub spin_max_bytes: u64,
    /// Add the file-system cost to every request.
    pub file_system: bool,
    /// With `file_system`: a write holds its file's lock from the file
    /// system's entry until its completion is noticed, so one file's kernel writes run one
    /// at a time (POSIX write atomicity; `host::FileLock`). Direct access
    /// bypasses it (dissertation §4.4.2, §5.2.2).
    pub fs_write_atomicity: bool,
    /// Extra serialized section per request (HASTE's driver lock).
    pub driver_lock_ns: u64,
    /// The block queue's `max_sectors` (512 B sectors) for the Moneta
    /// kernel stacks (Base to Balance): a request larger than it reaches
    /// the driver as several device requests. Linux 2.6.18's
    /// `blk_queue_make_request` sets `SAFE_MAX_SECTORS` (255) unless the
    /// driver raises it with `blk_queue_max_sectors`, and `bio_add_page`
    /// stops a bio at `q->max_sectors`, whole 4 KB pages at a time for an
    /// O_DIRECT buffer ([`crate::host::request_pieces`]). 0 = no limit.
    #[serde(default)]
    pub max_sectors: u32,
    /// How much of a sleeping thread's wake-up is CPU time on the core it
    /// gets ([`WakeOnCore`]); its latency is the same either way.
    #[serde(default)]
    pub wake_on_core: WakeOnCore,
    /// Base only (its interrupt handler runs in the no-op scheduler's one
    /// context, `Server::IoScheduler`): the completion's wake-up of the
    /// sleeper beyond SPEC §2.2's switch (Table 3.1's wake-up less the
    /// 2 µs: 2.3 µs reads, 1.6 µs writes) runs in that context too, after
    /// the handler and before the context serves anything else; the switch
    /// runs on the core the thread gets. MICRO'10 §IV: "The no-op scheduler
    /// is single-threaded so it removes any parallelism in request
    /// handling"; Linux 2.6.18 wakes an O_DIRECT waiter from the request's
    /// completion (fs/direct-io.c `dio_bio_end_io` → `wake_up_process`),
    /// i.e. inside the request handling that context serializes. The CPU
    /// per request and a lone request's latency are `wake_on_core`'s.
    #[serde(default)]
    pub wake_in_scheduler: bool,
    /// With `threads_per_core` above 1: the share of its own speed a
    /// context's software runs at while a sibling context of its core holds
    /// a thread (computing, spinning or polling: a spin loop executes), in
    /// place of the FIFO in which the contexts take turns and a spinner
    /// takes none of the core. A step that starts beside a busy sibling
    /// takes its time ÷ this share (processor sharing, sampled at the
    /// step's start); on a core whose siblings are idle it runs at full
    /// speed. Absent = the FIFO. Source for the presets' value: VMware's
    /// vSphere 4.1 resource-management guide ("An application running on
    /// one logical processor of a busy core can expect slightly more than
    /// half of the throughput that it obtains while running alone on a
    /// non-hyperthreaded processor", Xeon 5500 named) and Intel's
    /// Hyper-Threading gain of "up to 30%" for two threads on one core
    /// (Marr et al., Intel Technology Journal 6(1), 2002): 1.3 / 2 = 0.65.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smt_sibling_share: Option<f64>,
    pub costs: KernelCosts,
}

impl HostConfig {
    /// Hardware thread contexts: what a running, spinning or polling thread holds.
    pub fn contexts(&self) -> u32 {
        self.cores * self.threads_per_core
    }
}

/// Table 3.1 software costs; `_read` / `_write` pairs in ns.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KernelCosts {
    pub syscall_entry_ns_read: u64,
    pub syscall_entry_ns_write: u64,
    pub block_layer_ns_read: u64,
    pub block_layer_ns_write: u64,
    /// Part of the block layer spent switching to the single scheduler thread.
    pub io_scheduler_switch_ns: u64,
    pub tag_ns_read: u64,
    pub tag_ns_write: u64,
    /// Copy from the DMA buffer (reads), per KB.
    pub copy_ns_per_kb_read: u64,
    /// Copy into the DMA buffer (writes), per KB.
    pub copy_ns_per_kb_write: u64,
    /// The baseline three-word PIO command.
    pub pio_ns_read: u64,
    pub pio_ns_write: u64,
    pub interrupt_ns_read: u64,
    pub interrupt_ns_write: u64,
    /// Wake-up of the sleeping thread beyond the hardware time.
    pub wake_ns_read: u64,
    pub wake_ns_write: u64,
    pub return_ns_read: u64,
    pub return_ns_write: u64,
    pub file_system_ns_read: u64,
    pub file_system_ns_write: u64,
}

/// Moneta-D direct stack (SPEC §3, Table 4.2); `_read` / `_write` pairs in ns.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DirectConfig {
    pub completion: Completion,
    /// Records in the device's shared permission table.
    pub permission_records: u32,
    /// Extents the workload's file has (each needs a permission record).
    pub file_extents: u64,
    /// Merge physically adjacent records of the same file and permission.
    pub merge_records: bool,
    /// Fraction of logically consecutive extents that the file system
    /// placed physically adjacent (mergeable).
    pub adjacent_fraction: f64,
    pub library_ns_read: u64,
    pub library_ns_write: u64,
    pub extent_lookup_ns_one: u64,
    pub extent_lookup_ns_many: u64,
    pub copy_ns_per_kb_read: u64,
    pub copy_ns_per_kb_write: u64,
    /// Cycle time of one permission-tree step in the device (3 cycles at 250 MHz).
    pub tree_step_ns: u64,
    pub soft_miss_ns_one: u64,
    pub soft_miss_ns_many: u64,
    pub permission_update_ns: u64,
    /// Added when the device rejects a request for a missing record.
    pub hard_miss_detect_ns: u64,
    /// Completion path, device done → thread running again (Table 4.2).
    pub completion_ns_read_dma: u64,
    pub completion_ns_write_dma: u64,
    pub completion_ns_read_forwarding: u64,
    pub completion_ns_write_forwarding: u64,
    pub completion_ns_read_issue_sleep: u64,
    pub completion_ns_write_issue_sleep: u64,
    /// Part of issue-sleep spent in the system call before sleeping.
    pub syscall_ns_read: u64,
    pub syscall_ns_write: u64,
    /// Bytes of the channel's DMA buffer each virtual tag owns: a request
    /// of more than one slice also occupies the slices after its tag's, so
    /// it holds `⌈bytes ÷ slice⌉` of its channel's tags (at most all of
    /// them) until it completes. Dissertation §4.3.2: "Each channel has a
    /// private 1 MB DMA buffer ... each tag corresponding to one 16 KB
    /// slice of the channel's DMA buffer. ... The access that uses the tag
    /// can be larger than 16 KB, but it is the software's responsibility
    /// to not issue requests that overlap in the buffer." 0 = a request
    /// holds one tag whatever its size.
    #[serde(default)]
    pub dma_slice_bytes: u64,
}

/// DDR-attached NVM ramdisk (SPEC §6).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RamdiskConfig {
    /// CPU copy rate of one thread through the cache hierarchy.
    pub copy_bytes_per_s: f64,
    /// Aggregate rate of the host memory channels.
    pub memory_bytes_per_s: f64,
    /// Granule at which the NVM delay is inserted.
    pub access_bytes: u64,
}

/// QuickSAN's network port and the Ethernet fabric (SPEC §4.2, Appendix
/// A.6). Used only when devices are joined into a SAN (`san::system`); a
/// lone Moneta ignores it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NetworkConfig {
    /// The device has memory (a QuickSAN SSD) or only the port (a NIC).
    pub has_memory: bool,
    /// Line rate of every link, per direction.
    pub link_bits_per_s: f64,
    /// Published minimum one-way latency through two NICs, two links and
    /// one switch, for a small packet; the fabric derives the per-element
    /// latencies from it and `extra_hop_ns` (`san::fabric`).
    pub min_one_way_ns: u64,
    /// Published extra one-way latency per additional switch hop.
    pub extra_hop_ns: u64,
    /// Switches on every path between two ports (1: one switch).
    pub switch_hops: u32,
    /// Receive packet buffer of a port.
    pub rx_buffer_bytes: u64,
    /// Occupancy at which the port sends 802.3x pause requests upstream.
    pub pause_on_bytes: u64,
    /// Occupancy below which it cancels them.
    pub pause_off_bytes: u64,
    /// Width of the packet buffer's write port, bytes per port clock.
    pub packet_buffer_bytes_per_cycle: u64,
    /// Port clock period (125 MHz).
    pub port_clock_ns: u64,
    /// Rate of the network "DMA" from the packet buffer into a transfer buffer.
    pub buffer_move_bytes_per_s: f64,
    /// Buffer a switch holds per input port before pausing that link.
    pub switch_port_buffer_bytes: u64,
    /// Host NICs (iSCSI's TCP traffic): payload per frame and the
    /// Ethernet/IP/TCP headers each frame carries.
    pub message_mtu_bytes: u64,
    pub message_header_bytes: u64,
}

/// How the kernel stack of QuickSAN-OS notices a completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KernelCompletion {
    /// Moneta+Spin (SPEC §2.2): spin for requests up to 4 KB.
    Spin,
    /// The interrupt the Moneta-D era's kernel driver takes for every
    /// request (Table 4.2, "baseline interrupts").
    Interrupt,
}

/// Host software costs of Table 5.1 (4 KB, µs read / write), the kernel
/// paths' mechanisms, and the transport assumptions of this model: the
/// `[san]` section of the presets (`quicksan-ssd` inherits the root's). All
/// times in ns.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceCosts {
    /// "OS entry/exit & block IO", QuickSAN kernel column: 3.8 / 3.4 µs.
    pub os_ns_read_quicksan: Ns,
    pub os_ns_write_quicksan: Ns,
    /// "OS entry/exit & block IO", existing interfaces (iSCSI, and Fibre
    /// Channel, one column in Table 5.1): 4.0 / 3.4 µs.
    pub os_ns_read_existing: Ns,
    pub os_ns_write_existing: Ns,
    /// GFS2 under QuickSAN kernel: 1.4 / 2.3 µs.
    pub gfs2_ns_read_quicksan: Ns,
    pub gfs2_ns_write_quicksan: Ns,
    /// GFS2 under iSCSI (and Fibre Channel): 0.1 / 1.5 µs.
    pub gfs2_ns_read_existing: Ns,
    pub gfs2_ns_write_existing: Ns,
    /// How QuickSAN-OS's kernel driver learns that a request finished.
    pub kernel_completion: KernelCompletion,
    /// With `interrupt`: the whole completion, interrupt handler to the
    /// woken thread, Table 4.2 "baseline interrupts" 5.82 / 5.87 µs.
    pub kernel_interrupt_completion_ns_read: Ns,
    pub kernel_interrupt_completion_ns_write: Ns,
    /// POSIX write atomicity through the kernel file system (§5.2.2
    /// "Userspace access", §5.4.3): a write holds its file's lock from the
    /// file system's entry until the device has answered, so a host's
    /// QuickSAN-OS writes run one at a time. QuickSAN-D relaxes it.
    pub fs_write_atomicity: bool,
    /// With `fs_write_atomicity`: iSCSI and Fibre Channel writes take the
    /// same lock (both run under GFS2, §5.1.1 "Both run under Linux and
    /// GFS2"; §5.4.1), held from the file system's entry to the response.
    #[serde(default)]
    pub fs_write_atomicity_existing: bool,
    /// iSCSI block transport at 4 KB: 284.0 / 207.7 µs, "the minimum
    /// latency for a remote storage access ... excluding the cost of the
    /// actual storage device" (§5.1.1), "the combination of software and
    /// interconnect latency" (§5.1). Split (`san::interfaces::transport_path`)
    /// into the CPU the two ends' software spends, itemized from the
    /// sources of the keys below, and the rest: interconnect latency (NIC,
    /// interrupts, the network stacks' scheduling) that holds no core and
    /// that a loopback access (initiator and target on one host) skips.
    /// The model adds the fabric's time and the target SSD's on top.
    pub iscsi_transport_ns_read: Ns,
    pub iscsi_transport_ns_write: Ns,
    /// Cores tgtd's PDU work runs on, per target host: 1, its one epoll
    /// event loop (tgt 1.0.14, the Linux SCSI target of CentOS 5:
    /// `usr/tgtd.c` `event_loop`, `usr/iscsi/iscsi_tcp.c`): every PDU is
    /// received, parsed and answered there.
    pub iscsi_target_cores: u32,
    /// tgt's backing-store worker threads per target (the `rdwr` store's
    /// `pread`/`pwrite`): `NR_WORKER_THREADS` = 4 (tgt 1.0.14
    /// `usr/bs_thread.h`, `usr/bs_rdwr.c`).
    pub iscsi_target_workers: u32,
    /// Payload per iSCSI PDU: MaxRecvDataSegmentLength, RFC 3720 §12.12's
    /// default 8192 B, tgt 1.0.14's too (`usr/iscsi/param.c`). A request's
    /// data goes in this many-byte PDUs; each PDU costs its own system
    /// calls at the target.
    pub iscsi_max_data_segment_bytes: u64,
    /// Thread hand-offs per request at the target, each a sleep and a
    /// wake-up (Table 3.1's thread-sleep CPU, `host.costs.wake_ns_*`): tgt
    /// 1.0.14's event loop → worker (`bs_thread_cmd_submit`,
    /// `pthread_cond_signal`), worker → completion thread
    /// (`bs_thread_worker_fn`: without signalfd, which kernel 2.6.18
    /// lacks, a condition variable), completion thread → event loop
    /// (`bs_thread_ack_fn`, a pipe the event loop polls): 3.
    pub iscsi_target_handoffs: u32,
    /// Thread hand-offs per request at the initiator: the SCSI command is
    /// queued to the connection's transmit work (Linux
    /// `drivers/scsi/libiscsi.c` `iscsi_queuecommand` →
    /// `scsi_queue_work(host, &conn->xmitwork)`), and the caller sleeping
    /// in its system call is woken at the completion: 2.
    pub iscsi_initiator_handoffs: u32,
    /// CPU per KB of payload that each end's TCP/IP and iSCSI processing
    /// spends (receive or send path, its copies included), where it exceeds
    /// the host's copy cost. Table 5.1's row is the 4 KB cost; a request of
    /// another size keeps the row's fixed part and pays this per KB at both
    /// ends. Source: Foong et al., "TCP Performance Re-Visited", ISPASS
    /// 2003: about 1 Hz of CPU per bit/s of TCP throughput, i.e. 8192 cycles
    /// per KB, 3.62 µs at the E5520's 2.27 GHz (dissertation §5.4). 0: only
    /// the host's copy (Table 3.1's 0.27 / 0.24 µs per KB).
    #[serde(default)]
    pub iscsi_tcp_ns_per_kb: Ns,
    /// iSCSI basic header segment (RFC 3720): 48 B per PDU.
    pub iscsi_header_bytes: u64,
    /// TCP/IP headers per segment (IPv4 20 B + TCP 20 B + timestamps 12 B)
    /// and the segment payload (1500 B MTU − 52 B): the TCP traffic's bytes.
    pub tcp_header_bytes: u64,
    pub tcp_segment_bytes: u64,
    /// Fibre Channel block transport at 4 KB: 86.0 / 85.9 µs (Table 5.1).
    pub fc_transport_ns_read: Ns,
    pub fc_transport_ns_write: Ns,
    /// The Fibre Channel link we assume: 8GFC, 800 MB/s of payload per
    /// direction (8.5 GBd, 8b/10b), the common HBA of 2012.
    pub fc_link_bytes_per_s: f64,
    /// A host's power at the supply, W, at SPECpower_ssj2008's 11 load
    /// levels (active idle, 10 % … 100 %), interpolated in the busy
    /// fraction of its cores (`san::energy::HostPower`). Empty: linear from
    /// 160 W idle to 320 W busy (TDP-based).
    #[serde(default)]
    pub host_power_w: Vec<f64>,
    /// A host's `host.cores` are shared: its block-transport clients'
    /// software and, distributed, the iSCSI target's software on the same
    /// host queue for them (`san::experiments`), and the sort's CPU shares
    /// them with the IO stack (`san::sort`). Off: each has its own.
    #[serde(default)]
    pub host_cores_shared: bool,
}

impl Default for InterfaceCosts {
    /// The `[san]` section of the QuickSAN SSD preset.
    fn default() -> Self {
        Config::preset("quicksan-ssd").expect("shipped preset").san
    }
}

/// Power model (SPEC §1.9, MICRO'10 Table I).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PowerConfig {
    pub scheduler_dma_w_idle: f64,
    pub scheduler_dma_w_peak: f64,
    pub ring_w_idle: f64,
    pub ring_w_peak: f64,
    pub scheduler_buffer_w_idle: f64,
    pub scheduler_buffer_w_peak: f64,
    pub controller_w_idle: f64,
    pub controller_w_peak: f64,
    pub controller_buffer_w_idle: f64,
    pub controller_buffer_w_peak: f64,
    pub pcie_w_idle: f64,
    pub pcie_w_peak: f64,
    pub array_write_pj_per_bit: f64,
    pub array_read_pj_per_bit: f64,
    pub row_buffer_write_pj_per_bit: f64,
    pub row_buffer_read_pj_per_bit: f64,
    /// Idle background power per die (clock off).
    pub background_w_per_die_idle: f64,
    /// Active background power per bit of open row buffer.
    pub background_w_per_bit_active: f64,
    /// Capacity of one memory die.
    pub die_bytes: u64,
}

impl Config {
    /// Load a preset by name, e.g. `moneta` or `onyx-late`.
    pub fn preset(name: &str) -> Result<Config, ConfigError> {
        layer::DEVICE.preset(name)
    }

    /// Load a configuration from TOML text in the presets' schema: either
    /// every key, or `inherits = "PRESET"` and the keys that differ. A text
    /// without `name` is named `default_name`.
    pub fn from_toml(text: &str, default_name: &str) -> Result<Config, ConfigError> {
        layer::DEVICE.load_toml(text, default_name)
    }

    /// Load a configuration file (see [`Config::from_toml`]); a file without
    /// `name` is named after the file (`my-array.toml` → `my-array`).
    pub fn from_file(path: &std::path::Path) -> Result<Config, ConfigError> {
        layer::DEVICE.load_file(path)
    }

    /// Every key as TOML, loadable by [`Config::from_toml`] (`moneta config dump`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).expect("config serializes")
    }

    /// Apply a `key=value` override such as `memory.controllers=4`. The value
    /// is parsed as TOML (numbers, booleans, strings; bare words are strings)
    /// and overlaid as a one-key layer, so `memory.technology=dram` also sets
    /// the DRAM latencies.
    pub fn set(&mut self, assignment: &str) -> Result<(), ConfigError> {
        *self = layer::DEVICE.set(self, assignment)?;
        Ok(())
    }

    /// Use a memory technology's read/write latencies (SPEC §1.8).
    pub fn set_technology(&mut self, name: &str) -> Result<(), ConfigError> {
        self.set(&format!(
            "memory.technology={}",
            toml::Value::String(name.into())
        ))
    }

    /// Select a host stack; the hardware steps (2q, balance) also set the
    /// device queue policy, as in SPEC §2.2.
    pub fn set_stack(&mut self, stack: Stack) {
        self.host.stack = stack;
        if let Some(policy) = stack.implied_queue_policy() {
            self.device.queue_policy = policy;
        }
    }

    /// The resolved configuration as a JSON value (for reports).
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("config serializes")
    }

    /// Reject impossible values, naming the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        layer::Layered::validate(self)
    }
}

impl layer::Layered for Config {
    fn validate(&self) -> Result<(), ConfigError> {
        let d = &self.device;
        positive("device.capacity_bytes", d.capacity_bytes)?;
        range("device.tags", d.tags as u64, 1, 256)?;
        range(
            "device.transfer_buffers",
            d.transfer_buffers as u64,
            1,
            1024,
        )?;
        range("device.buffer_bytes", d.buffer_bytes, 512, 1 << 20)?;
        power_of_two("device.buffer_bytes", d.buffer_bytes)?;
        let l = &self.link;
        positive_f("link.bandwidth_bytes_per_s", l.bandwidth_bytes_per_s)?;
        range("link.max_payload_bytes", l.max_payload_bytes, 16, 4096)?;
        range(
            "link.max_outstanding_host_to_device",
            l.max_outstanding_host_to_device as u64,
            1,
            1024,
        )?;
        let r = &self.ring;
        positive_f("ring.bandwidth_bytes_per_s", r.bandwidth_bytes_per_s)?;
        positive("ring.packet_bytes", r.packet_bytes)?;
        let m = &self.memory;
        range("memory.controllers", m.controllers as u64, 1, 16)?;
        range("memory.stripe_bytes", m.stripe_bytes, 512, 1 << 30)?;
        power_of_two("memory.stripe_bytes", m.stripe_bytes)?;
        range("memory.row_bytes", m.row_bytes, 64, 1 << 20)?;
        power_of_two("memory.row_bytes", m.row_bytes)?;
        positive_f("memory.ddr_bytes_per_s", m.ddr_bytes_per_s)?;
        range("memory.queue_bytes", m.queue_bytes, 512, 1 << 30)?;
        if Technology::find(&m.technology).is_none() {
            return Err(err(
                "memory.technology",
                format!(
                    "unknown technology '{}'{} (expected one of {})",
                    m.technology,
                    crate::suggest::did_you_mean(&m.technology, technology::names()),
                    technology::names().join(", ")
                ),
            ));
        }
        if m.latency_ns_read > 1_000_000_000 || m.latency_ns_write > 1_000_000_000 {
            return Err(err(
                "memory.latency_ns_read",
                "latencies above one second are not storage",
            ));
        }
        if !d
            .capacity_bytes
            .is_multiple_of(m.stripe_bytes * m.controllers as u64)
        {
            return Err(err(
                "device.capacity_bytes",
                "must be a multiple of memory.stripe_bytes × memory.controllers",
            ));
        }
        let s = &self.start_gap;
        if s.enabled {
            range("start_gap.line_bytes", s.line_bytes, 64, 1 << 20)?;
            power_of_two("start_gap.line_bytes", s.line_bytes)?;
            positive("start_gap.gap_interval_writes", s.gap_interval_writes)?;
            let per_controller = d.capacity_bytes / m.controllers as u64;
            if per_controller / s.line_bytes < 2 {
                return Err(err(
                    "start_gap.line_bytes",
                    "each controller needs at least two lines",
                ));
            }
            if s.track_wear && per_controller / s.line_bytes > (1 << 26) {
                return Err(err("start_gap.track_wear", "too many lines per controller to track wear (raise start_gap.line_bytes or lower device.capacity_bytes)"));
            }
        }
        if m.controller == ControllerKind::OnyxPcm {
            let o = &self.onyx;
            range("onyx.ranks", o.ranks as u64, 1, 64)?;
            range("onyx.parts_per_rank", o.parts_per_rank as u64, 1, 16)?;
            range("onyx.write_buffer_bytes", o.write_buffer_bytes, 16, 4096)?;
            positive("onyx.clock_ns", o.clock_ns)?;
            positive("onyx.read_increment_ns", o.read_increment_ns)?;
        }
        let h = &self.host;
        range("host.cores", h.cores as u64, 1, 1024)?;
        range("host.threads_per_core", h.threads_per_core as u64, 1, 8)?;
        if let Some(share) = h.smt_sibling_share {
            if !(share.is_finite() && share > 0.0 && share <= 1.0) {
                return Err(err(
                    "host.smt_sibling_share",
                    format!("{share} is out of range: a share in (0, 1]"),
                ));
            }
        }
        if h.max_sectors != 0 {
            // blk_queue_max_sectors raises anything below a page to a page.
            range(
                "host.max_sectors",
                h.max_sectors as u64,
                crate::units::PAGE_BYTES / 512,
                1 << 16,
            )?;
        }
        let x = &self.direct;
        range(
            "direct.permission_records",
            x.permission_records as u64,
            1,
            1 << 24,
        )?;
        positive("direct.file_extents", x.file_extents)?;
        if !(0.0..=1.0).contains(&x.adjacent_fraction) {
            return Err(err("direct.adjacent_fraction", "must be between 0 and 1"));
        }
        positive_f("ramdisk.copy_bytes_per_s", self.ramdisk.copy_bytes_per_s)?;
        positive_f(
            "ramdisk.memory_bytes_per_s",
            self.ramdisk.memory_bytes_per_s,
        )?;
        positive("ramdisk.access_bytes", self.ramdisk.access_bytes)?;
        self.network.validate()?;
        Ok(())
    }
}

impl NetworkConfig {
    /// The largest packet a port stores: header and one buffer of payload.
    pub fn max_stored_bytes(&self) -> u64 {
        crate::device::packet::HEADER_BYTES + crate::device::packet::MAX_PAYLOAD_BYTES
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let n = self;
        if !(n.link_bits_per_s.is_finite() && n.link_bits_per_s >= 1e6) {
            return Err(err("network.link_bits_per_s", "must be at least 1e6"));
        }
        positive_f("network.buffer_move_bytes_per_s", n.buffer_move_bytes_per_s)?;
        range("network.switch_hops", n.switch_hops as u64, 1, 64)?;
        range("network.port_clock_ns", n.port_clock_ns, 1, 1000)?;
        range(
            "network.packet_buffer_bytes_per_cycle",
            n.packet_buffer_bytes_per_cycle,
            1,
            1024,
        )?;
        range("network.rx_buffer_bytes", n.rx_buffer_bytes, 1024, 1 << 30)?;
        positive("network.pause_off_bytes", n.pause_off_bytes)?;
        if n.pause_off_bytes >= n.pause_on_bytes {
            return Err(err(
                "network.pause_off_bytes",
                "must be below network.pause_on_bytes",
            ));
        }
        let headroom = n.pause_headroom_bytes()?;
        if n.pause_on_bytes + headroom > n.rx_buffer_bytes {
            return Err(err(
                "network.pause_on_bytes",
                format!(
                    "leaves less than {headroom} bytes (two largest packets and what is in flight) above it in network.rx_buffer_bytes"
                ),
            ));
        }
        let switch_pause_on = n.switch_pause_on_bytes();
        if switch_pause_on == 0 || switch_pause_on + headroom > n.switch_port_buffer_bytes {
            return Err(err(
                "network.switch_port_buffer_bytes",
                format!("too small to pause in time: needs {headroom} bytes above the pause level"),
            ));
        }
        range("network.message_mtu_bytes", n.message_mtu_bytes, 64, 65536)?;
        range(
            "network.message_header_bytes",
            n.message_header_bytes,
            0,
            1024,
        )?;
        Ok(())
    }

    /// Room a buffer needs above its pause level so nothing is lost: after
    /// the pause is requested the upstream link may finish the packet it is
    /// sending and start one more before the request reaches it, and what
    /// was already sent but not yet counted still arrives.
    pub fn pause_headroom_bytes(&self) -> Result<u64, ConfigError> {
        let timing = FabricTiming::derive(self)?;
        let in_flight_bytes =
            (timing.pause_in_flight_ns() as f64 * self.link_bits_per_s / 8e9).ceil() as u64;
        Ok(2 * self.max_stored_bytes() + in_flight_bytes.next_multiple_of(8))
    }

    /// A switch input pauses at the same fraction of its buffer as a port.
    pub fn switch_pause_on_bytes(&self) -> u64 {
        scale(
            self.switch_port_buffer_bytes,
            self.pause_on_bytes,
            self.rx_buffer_bytes,
        )
    }

    pub fn switch_pause_off_bytes(&self) -> u64 {
        scale(
            self.switch_port_buffer_bytes,
            self.pause_off_bytes,
            self.rx_buffer_bytes,
        )
    }
}

/// Fixed latencies of the fabric's elements (derivation in the header of
/// `san::fabric`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricTiming {
    pub nic_tx_ns: Ns,
    pub nic_rx_ns: Ns,
    pub switch_ns: Ns,
    /// Fixed latency of the switches beyond the first on every path.
    pub extra_hops_ns: Ns,
    /// A pause request reaching the far transmitter (one minimum frame).
    pub pause_delay_ns: Ns,
    /// A minimum frame on a link until its last bit.
    pub min_frame_ns: Ns,
    /// Writing a header-only packet into the receive packet buffer.
    pub min_packet_buffer_ns: Ns,
}

impl FabricTiming {
    pub fn derive(n: &NetworkConfig) -> Result<FabricTiming, ConfigError> {
        let bytes_per_s = n.link_bits_per_s / 8.0;
        let min_frame_ns = transfer_ns(packet::arrival_bytes(HEADER_BYTES), bytes_per_s);
        let min_packet_buffer_ns = packet_buffer_tail_ns(n, HEADER_BYTES);
        let switch_ns = n.extra_hop_ns.checked_sub(min_frame_ns).ok_or_else(|| {
            err(
                "network.extra_hop_ns",
                format!(
                    "{} ns is less than a minimum frame on the link ({min_frame_ns} ns)",
                    n.extra_hop_ns
                ),
            )
        })?;
        let nics_ns = n
            .min_one_way_ns
            .checked_sub(2 * min_frame_ns + switch_ns + min_packet_buffer_ns)
            .ok_or_else(|| {
                err(
                    "network.min_one_way_ns",
                    format!(
                        "{} ns is less than two links, a switch and the packet buffer take ({} ns)",
                        n.min_one_way_ns,
                        2 * min_frame_ns + switch_ns + min_packet_buffer_ns
                    ),
                )
            })?;
        Ok(FabricTiming {
            nic_tx_ns: nics_ns.div_ceil(2),
            nic_rx_ns: nics_ns / 2,
            switch_ns,
            extra_hops_ns: u64::from(n.switch_hops - 1) * n.extra_hop_ns,
            pause_delay_ns: min_frame_ns,
            min_frame_ns,
            min_packet_buffer_ns,
        })
    }

    /// From a frame leaving its sender until a pause it provokes stops
    /// that sender: counted at the receiver (after the receiving NIC and
    /// any extra hops at a port; after the sending NIC and the switching
    /// at a switch input), then the pause frame back.
    pub fn pause_in_flight_ns(&self) -> Ns {
        self.pause_delay_ns
            + (self.nic_rx_ns + self.extra_hops_ns).max(self.nic_tx_ns + self.switch_ns)
    }

    /// One-way latency of a header-only packet on an idle fabric: what
    /// SPEC §4.2 publishes (1 µs, +450 ns per extra hop).
    pub fn min_one_way_ns(&self) -> Ns {
        self.nic_tx_ns
            + self.min_frame_ns
            + self.switch_ns
            + self.extra_hops_ns
            + self.min_frame_ns
            + self.nic_rx_ns
            + self.min_packet_buffer_ns
    }
}

/// How long after its last bit has arrived a packet of `frame_bytes`
/// (header and payload) is stored whole in an idle receive packet buffer:
/// the write (one word per cycle) starts with the first word on the link
/// and ends no sooner than one cycle after the last.
pub fn packet_buffer_tail_ns(n: &NetworkConfig, frame_bytes: u64) -> Ns {
    let write = frame_bytes.div_ceil(n.packet_buffer_bytes_per_cycle) * n.port_clock_ns;
    let on_link = transfer_ns(packet::arrival_bytes(frame_bytes), n.link_bits_per_s / 8.0);
    write.saturating_sub(on_link).max(n.port_clock_ns)
}

/// `value × numerator / denominator` without overflow.
fn scale(value: u64, numerator: u64, denominator: u64) -> u64 {
    (u128::from(value) * u128::from(numerator) / u128::from(denominator.max(1))) as u64
}

fn positive(key: &str, v: u64) -> Result<(), ConfigError> {
    if v == 0 {
        Err(err(key, "must be greater than zero"))
    } else {
        Ok(())
    }
}

fn positive_f(key: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(err(key, "must be a positive finite number"))
    }
}

fn range(key: &str, v: u64, lo: u64, hi: u64) -> Result<(), ConfigError> {
    if v < lo || v > hi {
        Err(err(key, format!("{v} is out of range {lo}..={hi}")))
    } else {
        Ok(())
    }
}

fn power_of_two(key: &str, v: u64) -> Result<(), ConfigError> {
    if v.is_power_of_two() {
        Ok(())
    } else {
        Err(err(key, format!("{v} must be a power of two")))
    }
}

pub(crate) fn parse_value(raw: &str) -> toml::Value {
    let wrapped = format!("v = {raw}");
    match wrapped.parse::<toml::Table>() {
        Ok(mut t) => t
            .remove("v")
            .unwrap_or_else(|| toml::Value::String(raw.to_string())),
        Err(_) => toml::Value::String(raw.to_string()),
    }
}

/// Integers are accepted where floats are expected (`link.bandwidth_bytes_per_s=1e9` or `=1000000000`).
/// An error names `key`.
pub(crate) fn coerce_like(
    key: &str,
    old: &toml::Value,
    new: toml::Value,
) -> Result<toml::Value, ConfigError> {
    match (old, new) {
        (toml::Value::Float(_), toml::Value::Integer(i)) => Ok(toml::Value::Float(i as f64)),
        (toml::Value::Integer(_), toml::Value::Float(f)) if f.fract() == 0.0 && f >= 0.0 => {
            Ok(toml::Value::Integer(f as i64))
        }
        (toml::Value::Table(_), _) => Err(err(key, "is a section, not a value")),
        (old, new) if std::mem::discriminant(old) == std::mem::discriminant(&new) => Ok(new),
        (old, new) => Err(err(
            key,
            format!(
                "expected {}, got {} '{}'",
                old.type_str(),
                new.type_str(),
                new
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_loads_and_validates() {
        for name in preset_names() {
            let c = Config::preset(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(c.name, name);
        }
    }

    #[test]
    fn set_overrides_and_rejects() {
        let mut c = Config::preset("moneta").unwrap();
        c.set("memory.controllers=4").unwrap();
        assert_eq!(c.memory.controllers, 4);
        c.set("link.bandwidth_bytes_per_s=1000000000").unwrap();
        assert_eq!(c.link.bandwidth_bytes_per_s, 1e9);
        c.set("device.queue_policy=balance").unwrap();
        assert_eq!(c.device.queue_policy, QueuePolicy::Balance);

        let e = c.set("memory.nonsense=3").unwrap_err();
        assert_eq!(e.key, "memory.nonsense");
        let e = c.set("memory.controllers=0").unwrap_err();
        assert_eq!(e.key, "memory.controllers");
        let e = c.set("memory.controllers=many").unwrap_err();
        assert_eq!(e.key, "memory.controllers");
        let e = c.set("device.queue_policy=lifo").unwrap_err();
        assert_eq!(e.key, "device.queue_policy");
        let e = c.set("memory").unwrap_err();
        assert_eq!(e.key, "memory");
        // A rejected override leaves the configuration unchanged.
        assert_eq!(c.memory.controllers, 4);
    }

    #[test]
    fn unknown_preset_and_technology_are_errors() {
        assert!(Config::preset("moneta-9000").is_err());
        let mut c = Config::preset("moneta").unwrap();
        assert!(c.set_technology("unobtainium").is_err());
        c.set_technology("stt-mram").unwrap();
        assert_eq!(c.memory.latency_ns_read, 30);
    }

    #[test]
    fn technology_is_a_checked_name_that_brings_its_latencies() {
        let mut c = Config::preset("moneta").unwrap();
        let e = c.set("memory.technology=nosuch").unwrap_err();
        assert_eq!(e.key, "memory.technology");
        assert!(e.message.contains("expected one of dram, pcm,"), "{e}");
        c.set("memory.technology=dram").unwrap();
        assert_eq!(
            (c.memory.latency_ns_read, c.memory.latency_ns_write),
            (25, 25)
        );
        // Every preset names a technology of the table.
        for name in preset_names() {
            let c = Config::preset(name).unwrap();
            assert!(Technology::find(&c.memory.technology).is_some(), "{name}");
        }
    }

    #[test]
    fn errors_name_the_key_and_list_what_is_allowed() {
        let mut c = Config::preset("moneta").unwrap();
        let e = c.set("memory.contollers=4").unwrap_err();
        assert_eq!(e.key, "memory.contollers");
        assert!(
            e.message
                .contains("controller, controller_ns, controllers,"),
            "{e}"
        );
        let e = c.set("device.queue_policy=lifo").unwrap_err();
        assert!(e.message.contains("`fifo`, `2q`, `balance`"), "{e}");
        let e = c.set("host.stack=turbo").unwrap_err();
        assert_eq!(e.key, "host.stack");
        assert!(e.message.contains("`ramdisk`"), "{e}");
    }

    #[test]
    fn files_have_the_presets_schema() {
        let c = Config::from_toml(
            "inherits = \"moneta\"\n[memory]\ncontrollers = 4\ntechnology = \"stt-mram\"\n",
            "mine",
        )
        .unwrap();
        assert_eq!(c.name, "mine");
        assert_eq!(c.memory.controllers, 4);
        assert_eq!(c.memory.latency_ns_read, 30);
        assert_eq!(c.device, Config::preset("moneta").unwrap().device);

        for (text, key, needle) in [
            (
                "inherits = \"moneta\"\n[memory]\ncontolers = 4",
                "memory.contolers",
                "unknown key (expected one of controller,",
            ),
            ("inherits = \"moneta\"\nbogus = 1", "bogus", "unknown key"),
            (
                "inherits = \"moneta\"\n[device]\nqueue_policy = \"lifo\"",
                "device.queue_policy",
                "expected one of `fifo`",
            ),
            (
                "inherits = \"moneta\"\n[memory]\ncontroller = \"ddr9\"",
                "memory.controller",
                "expected `moneta` or `onyx-pcm`",
            ),
            (
                "inherits = \"moneta\"\n[direct]\ncompletion = \"poll\"",
                "direct.completion",
                "`dma`, `forwarding`, `issue-sleep`",
            ),
            (
                "inherits = \"moneta\"\n[device]\ntags = \"many\"",
                "device.tags",
                "invalid type",
            ),
            (
                "inherits = \"moneta\"\ndevice = 3",
                "device",
                "is a section",
            ),
            ("inherits = \"nope\"", "inherits", "unknown preset 'nope'"),
            (
                "name = \"x\"\n[device]\ntags = 4",
                "device.buffer_bytes",
                "missing",
            ),
        ] {
            let e = Config::from_toml(text, "f").unwrap_err();
            assert_eq!(e.key, key, "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
        assert!(Config::from_toml("[memory", "f")
            .unwrap_err()
            .message
            .contains("not valid TOML"));
    }

    #[test]
    fn every_preset_round_trips_through_its_dump() {
        for name in preset_names() {
            let c = Config::preset(name).unwrap();
            assert_eq!(
                Config::from_toml(&c.to_toml(), "other").unwrap(),
                c,
                "{name}"
            );
        }
    }
}
