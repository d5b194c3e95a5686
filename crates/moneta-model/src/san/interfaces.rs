//! The four host interfaces of the QuickSAN evaluation (SPEC §4.1, §4.4;
//! dissertation §5.1, Table 5.1, §5.4.1) as host-stack models: what runs on
//! the client's cores before a request reaches storage and after it comes
//! back, and, for iSCSI and Fibre Channel, the block transport between the
//! client and the target.
//!
//! - **QuickSAN-D**: Moneta-D's user-space library (`host::plan` with the
//!   `direct` stack and the `direct` costs of the device preset: library,
//!   extent lookup, copy, DMA completion); the permission check runs at the
//!   *source* device (`SanRequest::protection_ns`, the mean tree walk of
//!   Table 4.2), the destination trusts its peers (§5.2.2).
//! - **QuickSAN-OS**: the kernel block stack (`host::plan` with the Moneta
//!   driver, [`KERNEL_STACK`]) whose OS entry/exit and block-layer time is
//!   Table 5.1's "QuickSAN kernel" row, plus GFS2 (Table 5.1).
//! - **iSCSI**: the same OS entry/exit (Table 5.1 "iSCSI") and GFS2, then
//!   Table 5.1's block transport split into the two ends' software CPU,
//!   itemized from public sources ([`IscsiCpu`]: TCP per KB, PDUs of
//!   RFC 3720's 8 KB, tgt 1.0.14's system calls and thread hand-offs), and
//!   interconnect latency (the rest of the row, no CPU, skipped by a
//!   loopback access); the TCP traffic as `San::send_message` over the
//!   fabric; the target's PDU work on tgtd's event loop and its block IO
//!   on tgt's worker threads, FIFO servers ([`TargetCpu`]); the target's
//!   SSD as a plain block device (`San::submit_local`).
//! - **Fibre Channel**: OS entry/exit and GFS2 as iSCSI (Table 5.1 gives the
//!   two interfaces one column there), then a hardware transport: Table 5.1's
//!   86.0/85.9 µs split into a fixed HBA/switch/target-controller latency and
//!   the 4 KB wire time on an 8 Gb Fibre Channel link, whose ports are FIFO
//!   servers per direction; the target is an SSD reached with `submit_local`.
//!
//! Table 5.1's last transport row (QuickSAN 17.0/16.9 µs) is *not* an input:
//! our device and network produce it (see `experiments::latency`).
//!
//! Left out: the initiator's own serialization (open-iscsi's per-session
//! transmit thread), TCP windows and retransmission, R2T exchanges, GFS2's
//! lock traffic between nodes, the target's block-layer and driver costs
//! beyond what Table 5.1's transport row contains, and the order of the
//! target's work (all of its event-loop work is served before the block
//! IO, the response PDU's included).

use crate::breakdown::{Component, Parts};
use crate::config::{Config, InterfaceCosts, KernelCompletion, Stack};
use crate::host::{plan, PermissionOutcome, Step};
use crate::units::{transfer_ns, Ns, Op};
use serde::Serialize;

/// A host interface of §5.4.1 (plus Fibre Channel, Table 5.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Interface {
    QuicksanD,
    QuicksanOs,
    Iscsi,
    FibreChannel,
}

impl Interface {
    pub const ALL: [Interface; 4] = [
        Interface::QuicksanD,
        Interface::QuicksanOs,
        Interface::Iscsi,
        Interface::FibreChannel,
    ];

    pub fn key(self) -> &'static str {
        match self {
            Interface::QuicksanD => "quicksan-d",
            Interface::QuicksanOs => "quicksan-os",
            Interface::Iscsi => "iscsi",
            Interface::FibreChannel => "fibre-channel",
        }
    }

    pub fn parse(name: &str) -> Result<Interface, String> {
        Interface::ALL
            .into_iter()
            .find(|i| i.key() == name)
            .ok_or_else(|| {
                let names: Vec<_> = Interface::ALL.iter().map(|i| i.key()).collect();
                format!(
                    "unknown interface '{name}' (expected one of {})",
                    names.join(", ")
                )
            })
    }

    /// A comma-separated list, or `all`.
    pub fn parse_list(list: &str) -> Result<Vec<Interface>, String> {
        if list == "all" {
            return Ok(Interface::ALL.to_vec());
        }
        list.split(',')
            .map(|s| Interface::parse(s.trim()))
            .collect()
    }

    /// Whether the QuickSAN devices route the request (global addresses,
    /// `San::submit`); otherwise a block transport reaches a target SSD.
    pub fn uses_quicksan_network(self) -> bool {
        matches!(self, Interface::QuicksanD | Interface::QuicksanOs)
    }
}

/// The kernel driver QuickSAN-OS uses on its NIC or SSD: the Moneta driver
/// with the software optimizations of SPEC §2.2 (one atomic command word,
/// no scheduler); the QuickSAN devices share Moneta-D's host interface
/// (§5.2.2). How it completes is `san.kernel_completion`: `spin` (the
/// default: Table 5.1 gives the kernel column the direct column's block
/// transport row) or `interrupt` (Table 4.2's Moneta-D-era baseline: it
/// sleeps like Moneta+Atomic).
pub const KERNEL_STACK: Stack = Stack::Spin;

fn rw(op: Op, read: Ns, write: Ns) -> Ns {
    match op {
        Op::Read => read,
        Op::Write => write,
    }
}

/// The request size Table 5.1 measured.
pub const TABLE_5_1_BYTES: u64 = 4096;

/// A request through a QuickSAN device (QuickSAN-D or QuickSAN-OS): host
/// software before the issue, the device, the completion path, software
/// after. Parts of the host side come from `host::plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DevicePath {
    /// Every host software cost of the request, labelled.
    pub software: Parts,
    /// Software time on the client's core before the issue.
    pub before_ns: Ns,
    /// After the device finished: noticing the completion (spin detect, or
    /// notification + interrupt handler + wake-up), labelled, and its sum.
    pub completion: Parts,
    pub completion_ns: Ns,
    /// Software after the completion was noticed (copy out, OS return).
    pub after_ns: Ns,
    /// Whether the thread holds its core while the device works (spin).
    pub spins: bool,
    /// Source-side permission check (QuickSAN-D), for `SanRequest`.
    pub protection_ns: Ns,
    /// A write through the kernel file system takes its host's file write
    /// lock (`host::FileLock`) after this much of `before_ns`, and gives it
    /// back once its completion is noticed.
    pub file_lock_after_ns: Option<Ns>,
}

/// The configuration a QuickSAN interface's host runs: the device preset
/// with the interface's stack; for QuickSAN-OS, Table 5.1's OS entry/exit
/// and block IO (split evenly between entry and return: the table gives
/// their sum) and GFS2 as the file system.
pub fn host_config(device: &Config, interface: Interface, costs: &InterfaceCosts) -> Config {
    let mut c = device.clone();
    // One request per access on the SAN path (`device_path`): Linux
    // 2.6.18's request splitting (host.max_sectors) is not modelled here.
    c.host.max_sectors = 0;
    match interface {
        // QuickSAN-D's library is Moneta-D's (`direct`); a device preset
        // set to `raw` keeps the device alone: the host software is not
        // modeled, as when the emulator runs the real library in its
        // place (`moneta san bench`'s prediction).
        Interface::QuicksanD if c.host.stack == Stack::Raw => {}
        Interface::QuicksanD => c.set_stack(Stack::Direct),
        _ => {
            c.set_stack(KERNEL_STACK);
            let k = &mut c.host.costs;
            let (os_read, os_write, fs_read, fs_write) = match interface {
                Interface::QuicksanOs => (
                    costs.os_ns_read_quicksan,
                    costs.os_ns_write_quicksan,
                    costs.gfs2_ns_read_quicksan,
                    costs.gfs2_ns_write_quicksan,
                ),
                _ => (
                    costs.os_ns_read_existing,
                    costs.os_ns_write_existing,
                    costs.gfs2_ns_read_existing,
                    costs.gfs2_ns_write_existing,
                ),
            };
            k.syscall_entry_ns_read = os_read / 2;
            k.return_ns_read = os_read - os_read / 2;
            k.syscall_entry_ns_write = os_write / 2;
            k.return_ns_write = os_write - os_write / 2;
            k.block_layer_ns_read = 0;
            k.block_layer_ns_write = 0;
            k.io_scheduler_switch_ns = 0;
            k.file_system_ns_read = fs_read;
            k.file_system_ns_write = fs_write;
            c.host.file_system = true;
            // Every stack through GFS2 keeps POSIX write atomicity; the
            // existing interfaces take the lock in `transport_path`.
            c.host.fs_write_atomicity =
                interface == Interface::QuicksanOs && costs.fs_write_atomicity;
            if interface == Interface::QuicksanOs
                && costs.kernel_completion == KernelCompletion::Interrupt
            {
                // Sleep for every size: the interrupt handler (Table 3.1)
                // and the wake-up make up Table 4.2's whole completion.
                c.set_stack(Stack::Atomic);
                let k = &mut c.host.costs;
                k.wake_ns_read = costs
                    .kernel_interrupt_completion_ns_read
                    .saturating_sub(k.interrupt_ns_read);
                k.wake_ns_write = costs
                    .kernel_interrupt_completion_ns_write
                    .saturating_sub(k.interrupt_ns_write);
            }
        }
    }
    c
}

/// The host path of one QuickSAN-D or QuickSAN-OS request of `bytes`, from
/// `host::plan` on `host` (see [`host_config`]). Stacks with serialized
/// sections (Base, NoSched, the ramdisk) are not SAN host stacks: an error.
pub fn device_path(host: &Config, op: Op, bytes: u64) -> Result<DevicePath, String> {
    let p = plan(host, op, bytes, PermissionOutcome::default());
    let mut path = DevicePath {
        software: *p.software(),
        before_ns: 0,
        completion: Parts::default(),
        completion_ns: 0,
        after_ns: 0,
        spins: false,
        protection_ns: 0,
        file_lock_after_ns: None,
    };
    let mut issued = false;
    for step in p.steps() {
        match *step {
            Step::Cpu(ns) if issued => path.after_ns += ns,
            Step::Cpu(ns) => path.before_ns += ns,
            Step::Issue => issued = true,
            Step::Spin { detect_ns } => {
                path.spins = true;
                path.completion_ns += path.completion.add(Component::SpinDetect, detect_ns);
            }
            Step::Forwarded(f) => {
                path.spins = true;
                let c = &mut path.completion;
                path.completion_ns += c.add(Component::Notify, host.link.latency_ns_device_to_host)
                    + c.add(Component::Interrupt, f.interrupt_ns)
                    + c.add(Component::Pio, f.register_read_ns)
                    + c.add(Component::SpinDetect, f.detect_ns);
            }
            Step::Sleep {
                interrupt_ns,
                lock: None,
                wake_ns,
            } => {
                let c = &mut path.completion;
                path.completion_ns += c.add(Component::Notify, host.link.latency_ns_device_to_host)
                    + c.add(Component::Interrupt, interrupt_ns)
                    + c.add(Component::WakeUp, wake_ns);
            }
            Step::FileLock => {
                debug_assert!(!issued, "the file lock is taken before the issue");
                path.file_lock_after_ns = Some(path.before_ns);
            }
            Step::FileUnlock => debug_assert!(issued, "and given back after the completion"),
            Step::NextPiece { .. } => {
                return Err(format!(
                    "a {bytes} B request is split by host.max_sectors; the SAN path models one request per access"
                ))
            }
            Step::Serial(..) | Step::Sleep { .. } => {
                return Err(format!(
                "stack {:?} has serialized sections; the SAN hosts run the optimized stacks only",
                host.host.stack
            ))
            }
        }
    }
    if host.host.stack == Stack::Direct {
        // Checked at the source device (§5.2.2): the mean walk of Table 4.2
        // for one extent is the tree step of a one-record tree.
        path.protection_ns = host.direct.tree_step_ns;
    }
    debug_assert_eq!(
        path.software.total_ns(),
        path.before_ns + path.after_ns,
        "plan software is the CPU steps"
    );
    Ok(path)
}

/// A request through a block transport (iSCSI or Fibre Channel): the
/// client's software around it and the transport's own pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportPath {
    /// OS entry and GFS2, then (iSCSI) the initiator's software, labelled.
    pub before: Parts,
    pub before_ns: Ns,
    /// iSCSI: the target's PDU work (its TCP, the PDUs' system calls, the
    /// event loop's wake-up), served on tgtd's event loop.
    /// Fibre Channel: the fixed HBA/fabric/target latency (no CPU).
    pub target_ns: Ns,
    /// iSCSI: the target's backing-store work (the `pread`/`pwrite` system
    /// call and the worker's and completion thread's wake-ups), served on
    /// tgt's worker threads. Fibre Channel: 0.
    pub target_worker_ns: Ns,
    /// iSCSI: the rest of Table 5.1's row, interconnect latency that holds
    /// no core, each way (command and response); a loopback access skips
    /// it. Fibre Channel: 0.
    pub interconnect_ns_each_way: Ns,
    /// Bytes each way (iSCSI: TCP payload and headers; FC: the payload).
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// After the response: the OS return, labelled.
    pub after: Parts,
    pub after_ns: Ns,
    /// A write through GFS2 takes its host's file write lock
    /// (`host::FileLock`, `san.fs_write_atomicity`) after this much of
    /// `before_ns` (the OS entry), and gives it back once the response is in.
    pub file_lock_after_ns: Option<Ns>,
}

/// The iSCSI or Fibre Channel path of one request of `bytes`.
///
/// iSCSI's Table 5.1 row is "the combination of software and interconnect
/// latency" (§5.1). The software's CPU is itemized from public sources
/// ([`IscsiCpu`]); what the row holds beyond the 4 KB CPU is
/// interconnect latency, fixed per request, half each way.
pub fn transport_path(
    host: &Config,
    interface: Interface,
    costs: &InterfaceCosts,
    op: Op,
    bytes: u64,
) -> Result<TransportPath, String> {
    let os = rw(op, costs.os_ns_read_existing, costs.os_ns_write_existing);
    let fs = rw(
        op,
        costs.gfs2_ns_read_existing,
        costs.gfs2_ns_write_existing,
    );
    let entry = os / 2;
    let mut before = Parts::default();
    let mut before_ns =
        before.add(Component::SyscallEntry, entry) + before.add(Component::FileSystem, fs);
    let mut after = Parts::default();
    let after_ns = after.add(Component::Return, os - entry);
    let payload_out = if op == Op::Write { bytes } else { 0 };
    let payload_in = bytes - payload_out;
    // Both existing interfaces run under GFS2 (§5.1.1: "Both run under
    // Linux and GFS2"; §5.4.1: "In experiments that include a file system,
    // we use GFS2"; Table 5.1's GFS2 row for iSCSI), and GFS2 gives every
    // access through it POSIX atomicity (§5.2.2): with
    // `san.fs_write_atomicity_existing` the same write lock as
    // QuickSAN-OS's, from the file system's entry to the response.
    let file_lock_after_ns =
        (op == Op::Write && costs.fs_write_atomicity && costs.fs_write_atomicity_existing)
            .then_some(entry);
    match interface {
        Interface::Iscsi => {
            let row = rw(
                op,
                costs.iscsi_transport_ns_read,
                costs.iscsi_transport_ns_write,
            );
            let at_4_kb = IscsiCpu::of(host, costs, op, TABLE_5_1_BYTES)?;
            let interconnect = row.checked_sub(at_4_kb.total_ns()).ok_or_else(|| {
                format!(
                    "iSCSI transport row ({row} ns) is smaller than the software's CPU at 4 KB ({} ns)",
                    at_4_kb.total_ns()
                )
            })?;
            let cpu = IscsiCpu::of(host, costs, op, bytes)?;
            before_ns += before.add(Component::BlockTransport, cpu.initiator_ns);
            // Each PDU: the basic header segment and its data segment, on
            // TCP segments with their headers.
            let tcp = |payload: u64, pdus: u64| {
                let pdu = pdus * costs.iscsi_header_bytes + payload;
                pdu + pdu.div_ceil(costs.tcp_segment_bytes.max(1)) * costs.tcp_header_bytes
            };
            let (out_pdus, in_pdus) = match op {
                Op::Write => (cpu.data_pdus, 1),
                Op::Read => (1, cpu.data_pdus),
            };
            Ok(TransportPath {
                before,
                before_ns,
                target_ns: cpu.target_loop_ns,
                target_worker_ns: cpu.target_worker_ns,
                interconnect_ns_each_way: interconnect / 2,
                request_bytes: tcp(payload_out, out_pdus),
                response_bytes: tcp(payload_in, in_pdus),
                after,
                after_ns,
                file_lock_after_ns,
            })
        }
        Interface::FibreChannel => {
            let row = rw(op, costs.fc_transport_ns_read, costs.fc_transport_ns_write);
            let wire = transfer_ns(TABLE_5_1_BYTES, costs.fc_link_bytes_per_s);
            Ok(TransportPath {
                before,
                before_ns,
                target_ns: row.saturating_sub(wire),
                target_worker_ns: 0,
                interconnect_ns_each_way: 0,
                request_bytes: payload_out,
                response_bytes: payload_in,
                after,
                after_ns,
                file_lock_after_ns,
            })
        }
        _ => Err(format!("{} has no block transport", interface.key())),
    }
}

/// The CPU one iSCSI request's software spends, itemized (4 KB: 66.5 /
/// 60.6 µs of Table 5.1's 284.0 / 207.7):
///
/// - each end, TCP/IP and iSCSI processing per KB of payload
///   (`san.iscsi_tcp_ns_per_kb`, at least the host's copy);
/// - the initiator, `san.iscsi_initiator_handoffs` sleeps and wake-ups
///   (Table 3.1's thread-sleep CPU, `host.costs.wake_ns_*`);
/// - the target's event loop, one system call per PDU segment (tgt 1.0.14
///   `usr/iscsi/iscsi_tcp.c` reads and writes the header and the data
///   segment of a PDU with their own `read`/`write`, each at the host's
///   system call entry and return: for the iSCSI host Table 5.1's OS
///   entry/exit, 4.0 / 3.4 µs), and the wake-up of the hand-off back to it;
/// - the target's workers, the backing store's `pread`/`pwrite` (a system
///   call) and the other `san.iscsi_target_handoffs` − 1 wake-ups.
///
/// PDUs: the data in `san.iscsi_max_data_segment_bytes` pieces (at least
/// one PDU with data), plus the request's one PDU without data (a read's
/// command, a write's response). Left out: a write's R2T exchanges beyond
/// the immediate data, header and data digests (off by default).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IscsiCpu {
    pub initiator_ns: Ns,
    pub target_loop_ns: Ns,
    pub target_worker_ns: Ns,
    /// PDUs that carry the request's data.
    pub data_pdus: u64,
}

impl IscsiCpu {
    pub fn of(host: &Config, costs: &InterfaceCosts, op: Op, bytes: u64) -> Result<Self, String> {
        if costs.iscsi_max_data_segment_bytes == 0 {
            return Err("san.iscsi_max_data_segment_bytes must be at least 1".into());
        }
        if costs.iscsi_target_handoffs == 0 {
            return Err(
                "san.iscsi_target_handoffs must be at least 1 (back to the event loop)".into(),
            );
        }
        let k = &host.host.costs;
        let per_kb =
            rw(op, k.copy_ns_per_kb_read, k.copy_ns_per_kb_write).max(costs.iscsi_tcp_ns_per_kb);
        let tcp = (per_kb * bytes).div_ceil(1024);
        let wake = rw(op, k.wake_ns_read, k.wake_ns_write);
        let syscall = rw(op, k.syscall_entry_ns_read, k.syscall_entry_ns_write)
            + rw(op, k.return_ns_read, k.return_ns_write);
        let data_pdus = bytes.div_ceil(costs.iscsi_max_data_segment_bytes).max(1);
        // A data PDU: header and data segment; the other PDU: its header.
        let pdu_syscalls = 2 * data_pdus + 1;
        Ok(IscsiCpu {
            initiator_ns: tcp + costs.iscsi_initiator_handoffs as Ns * wake,
            target_loop_ns: tcp + pdu_syscalls * syscall + wake,
            target_worker_ns: syscall + (costs.iscsi_target_handoffs as Ns - 1) * wake,
            data_pdus,
        })
    }

    pub fn total_ns(&self) -> Ns {
        self.initiator_ns + self.target_loop_ns + self.target_worker_ns
    }
}

/// FIFO servers: `cores` identical ones, each request to the one free first.
/// The iSCSI target's CPU, and the Fibre Channel ports (one per direction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FifoServers {
    free_at_ns: Vec<Ns>,
    busy_ns: u64,
}

impl FifoServers {
    pub fn new(servers: u32) -> Result<Self, String> {
        if servers == 0 {
            return Err("a FIFO resource needs at least one server".into());
        }
        Ok(FifoServers {
            free_at_ns: vec![0; servers as usize],
            busy_ns: 0,
        })
    }

    /// Serve `ns` of work arriving at `now`: (start, end). Requests start
    /// in arrival order (callers arrive in time order).
    pub fn serve(&mut self, now: Ns, ns: Ns) -> (Ns, Ns) {
        let (i, free) = self
            .free_at_ns
            .iter()
            .enumerate()
            .min_by_key(|&(i, &f)| (f, i))
            .map(|(i, &f)| (i, f))
            .expect("at least one server");
        let start = now.max(free);
        self.free_at_ns[i] = start + ns;
        self.busy_ns += ns;
        (start, start + ns)
    }

    /// When the first server becomes free.
    pub fn earliest_free_ns(&self) -> Ns {
        self.free_at_ns.iter().copied().min().unwrap_or(0)
    }

    /// Total work served.
    pub fn busy_ns(&self) -> u64 {
        self.busy_ns
    }
}

/// Alias for the iSCSI target host's CPU: [`InterfaceCosts::iscsi_target_cores`] servers.
pub type TargetCpu = FifoServers;

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> Config {
        Config::preset("moneta-d").unwrap()
    }

    #[test]
    fn interface_names_round_trip_and_unknown_ones_list_the_allowed() {
        for i in Interface::ALL {
            assert_eq!(Interface::parse(i.key()).unwrap(), i);
        }
        let e = Interface::parse("nfs").unwrap_err();
        assert!(
            e.contains("quicksan-d") && e.contains("fibre-channel"),
            "{e}"
        );
        assert_eq!(Interface::parse_list("all").unwrap().len(), 4);
        assert!(Interface::parse_list("iscsi,bogus").is_err());
    }

    #[test]
    fn quicksan_os_pays_table_5_1_os_and_gfs2_and_direct_pays_neither() {
        let costs = InterfaceCosts::default();
        for op in [Op::Read, Op::Write] {
            let os = host_config(&device(), Interface::QuicksanOs, &costs);
            let p = device_path(&os, op, 4096).unwrap();
            let sw = &p.software;
            assert_eq!(
                sw.get(Component::SyscallEntry) + sw.get(Component::Return),
                rw(op, 3_800, 3_400)
            );
            assert_eq!(sw.get(Component::FileSystem), rw(op, 1_400, 2_300));
            assert_eq!(sw.get(Component::BlockLayer), 0);
            assert!(
                p.spins,
                "Table 5.1's kernel path spins for 4 KB (Moneta+Spin)"
            );
            let mut interrupt = costs.clone();
            interrupt.kernel_completion = KernelCompletion::Interrupt;
            let p = device_path(
                &host_config(&device(), Interface::QuicksanOs, &interrupt),
                op,
                4096,
            )
            .unwrap();
            assert!(!p.spins, "with interrupt the kernel path sleeps for it");
            assert_eq!(
                p.completion.get(Component::Interrupt) + p.completion.get(Component::WakeUp),
                rw(op, 5_820, 5_870),
                "Table 4.2 baseline interrupts"
            );
            let d = host_config(&device(), Interface::QuicksanD, &costs);
            let p = device_path(&d, op, 4096).unwrap();
            assert_eq!(p.software.get(Component::SyscallEntry), 0);
            assert_eq!(p.software.get(Component::FileSystem), 0);
            assert!(p.software.get(Component::Library) > 0);
            assert!(p.protection_ns > 0);
            assert_eq!(p.before_ns + p.after_ns, p.software.total_ns());
        }
    }

    #[test]
    fn kernel_stacks_with_serialized_sections_are_refused() {
        let mut c = host_config(&device(), Interface::QuicksanOs, &InterfaceCosts::default());
        c.set_stack(Stack::Base);
        assert!(device_path(&c, Op::Read, 4096).is_err());
    }

    #[test]
    fn iscsi_cpu_plus_interconnect_is_table_5_1_at_4_kb_and_cpu_grows_with_the_payload() {
        let costs = InterfaceCosts::default();
        let host = host_config(&device(), Interface::Iscsi, &costs);
        for op in [Op::Read, Op::Write] {
            let p = transport_path(&host, Interface::Iscsi, &costs, op, 4096).unwrap();
            let cpu = p.before.get(Component::BlockTransport) + p.target_ns + p.target_worker_ns;
            let row = rw(op, 284_000, 207_700);
            assert!(cpu < row / 2, "most of the row is not CPU: {cpu} of {row}");
            assert!(row - (cpu + 2 * p.interconnect_ns_each_way) <= 1);
            assert_eq!(p.before_ns, p.before.total_ns());
            assert_eq!(p.after_ns, p.after.total_ns());
            // 256 KB: 32 data PDUs of 8 KB where 4 KB had one.
            let big = transport_path(&host, Interface::Iscsi, &costs, op, 262_144).unwrap();
            assert_eq!(big.interconnect_ns_each_way, p.interconnect_ns_each_way);
            assert_eq!(big.target_worker_ns, p.target_worker_ns);
            let per_kb = costs.iscsi_tcp_ns_per_kb.max(rw(op, 270, 240));
            let k = &host.host.costs;
            let syscall = rw(op, k.syscall_entry_ns_read, k.syscall_entry_ns_write)
                + rw(op, k.return_ns_read, k.return_ns_write);
            let grown_loop = big.target_ns - p.target_ns;
            assert_eq!(grown_loop, per_kb * 252 + 2 * 31 * syscall);
            let grown_initiator =
                big.before.get(Component::BlockTransport) - p.before.get(Component::BlockTransport);
            assert_eq!(grown_initiator, per_kb * 252);
            // The data goes one way in 32 PDUs; one header PDU the other.
            let (data, header) = match op {
                Op::Write => (big.request_bytes, big.response_bytes),
                Op::Read => (big.response_bytes, big.request_bytes),
            };
            assert!(data > 262_144 + 32 * 48 && header < 200, "{data} {header}");
        }
        let mut bad = costs.clone();
        bad.iscsi_max_data_segment_bytes = 0;
        assert!(transport_path(&host, Interface::Iscsi, &bad, Op::Read, 4096).is_err());
        bad = costs.clone();
        bad.iscsi_transport_ns_read = 10_000;
        let e = transport_path(&host, Interface::Iscsi, &bad, Op::Read, 4096).unwrap_err();
        assert!(e.contains("smaller than the software's CPU"), "{e}");
    }

    #[test]
    fn fibre_channel_fixed_part_plus_4_kb_wire_is_the_row() {
        let costs = InterfaceCosts::default();
        let host = host_config(&device(), Interface::FibreChannel, &costs);
        let p = transport_path(&host, Interface::FibreChannel, &costs, Op::Read, 4096).unwrap();
        assert_eq!(p.target_ns + transfer_ns(4096, 800e6), 86_000);
        assert_eq!(p.response_bytes, 4096);
        assert_eq!(p.request_bytes, 0);
    }

    #[test]
    fn fifo_servers_queue_in_arrival_order() {
        let mut one = FifoServers::new(1).unwrap();
        assert_eq!(one.serve(0, 10), (0, 10));
        assert_eq!(one.serve(5, 10), (10, 20));
        assert_eq!(one.serve(30, 10), (30, 40));
        let mut two = FifoServers::new(2).unwrap();
        assert_eq!(two.serve(0, 10), (0, 10));
        assert_eq!(two.serve(0, 10), (0, 10));
        assert_eq!(two.serve(0, 10), (10, 20));
        assert_eq!(two.busy_ns(), 30);
        assert!(FifoServers::new(0).is_err());
    }
}
