//! Where time goes: each request's latency split into the components of the
//! papers' latency breakdowns (SPEC §2.1 Table 3.1, §3.5 Table 4.2).
//!
//! Every simulated request carries [`Parts`]: integer nanoseconds per
//! [`Component`] that sum *exactly* to its latency. They come from three
//! places:
//!
//! - the host stack's plan: the fixed software costs of its steps, labelled
//!   as Table 3.1/4.2 name them (`host::plan`);
//! - the thread's own timeline in the simulator: waits for locks and servers,
//!   tags, and a core, and the completion path (notification, interrupt
//!   handler, wake-up, spin detection) (`experiment`);
//! - the device: the time between accepting a command and completing it,
//!   split along the critical path, the chain of the request's last segment
//!   (`device::pipeline`).
//!
//! Where host software runs after the command was issued (issue-sleep's
//! system call) it overlaps the device; the thread's timeline is the critical
//! path, so the hidden part of the device's time is taken off the front of
//! the device's chain ([`Parts::trim_front`]). Link and ring time beyond an
//! idle transfer's is their wait; a read's wait behind earlier accesses in a
//! controller is controller queue when the controller says
//! (`MemoryTiming::read_wait_ns`: the Moneta controller does, Onyx's does
//! not yet). Left out: a write's wait inside the controller (it counts as
//! memory array).

use crate::units::Ns;
use serde::ser::{Serialize, SerializeMap, Serializer};

/// One component of a request's latency, in the order of Table 3.1: host
/// entry, issue, device (in the order of its chain), completion, return.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Component {
    /// OS entry and user-space overhead (also issue-sleep's system call).
    SyscallEntry,
    /// File system (XFS) on top of the block device, when configured.
    FileSystem,
    /// Moneta-D's user-space library: request setup and extent lookup.
    Library,
    /// Moneta-D: soft and hard permission misses and record updates.
    PermissionMiss,
    /// Linux block queue and (no-op) scheduler.
    BlockLayer,
    /// SAN block transport in host software: the iSCSI initiator and target
    /// stacks (TCP included), or the Fibre Channel HBA path (SPEC §4.2,
    /// Table 5.1 "block transport").
    BlockTransport,
    /// Waiting for the remote target host's CPU (iSCSI target threads
    /// serving other clients).
    TargetWait,
    /// Get the request from the queue, assign a tag.
    Tag,
    /// Copy into the DMA buffer (writes).
    CopyIn,
    /// PIO command writes: the doorbell (three words, or one atomic word).
    Pio,
    /// HASTE's driver lock section.
    DriverLock,
    /// Waiting for a lock or a serialized server (the scheduler thread, the
    /// memory bus), including the interrupt handler's lock.
    LockWait,
    /// Waiting for a free tag before issuing.
    TagWait,
    /// Device: command registers and retag (fixed pipeline time).
    Retag,
    /// Device: the permission check (Moneta-D's tree walk).
    Protection,
    /// Device: barriers, request queues and waiting for a transfer buffer.
    DeviceQueue,
    /// Device (QuickSAN): waiting for the network port: packets ahead in
    /// its transmit queue, or the link paused by 802.3x flow control.
    NetworkWait,
    /// Device (QuickSAN): NICs, links and switches: fixed latency and wire
    /// time of the packets on the request's path (SPEC §4.2).
    Network,
    /// Device (QuickSAN): writing a packet whole into the receive packet
    /// buffer before it is processed (A.6: 8 B per 125 MHz cycle).
    PacketBuffer,
    /// Device: waiting for the host link (other transfers in its direction).
    DmaWait,
    /// Device: DMA over the host link (latency and wire time).
    Dma,
    /// Device: waiting for the ring's token (other packets).
    RingWait,
    /// Device: the ring between the scheduler and the controllers.
    Ring,
    /// Device: waiting for room in the controller's in-queue (scoreboard,
    /// writes) or behind earlier accesses in the controller (reads).
    ControllerQueue,
    /// Device: the memory controller and array access.
    Array,
    /// The completion crossing the link to the host (interrupt message).
    Notify,
    /// Interrupt handler.
    Interrupt,
    /// Waking the sleeping thread (Moneta-D issue-sleep: its completion path).
    WakeUp,
    /// Spinning thread noticing the completion (reading the status).
    SpinDetect,
    /// Runnable thread waiting for a core.
    CoreWait,
    /// Work of the thread pushed back by interrupt handlers that ran on its
    /// core (`experiment`: the interrupt core takes them from whatever runs there).
    Preempted,
    /// Copy from the DMA buffer (reads).
    CopyOut,
    /// OS return and user-space overhead.
    Return,
}

impl Component {
    pub const COUNT: usize = 33;

    pub const ALL: [Component; Component::COUNT] = [
        Component::SyscallEntry,
        Component::FileSystem,
        Component::Library,
        Component::PermissionMiss,
        Component::BlockLayer,
        Component::BlockTransport,
        Component::TargetWait,
        Component::Tag,
        Component::CopyIn,
        Component::Pio,
        Component::DriverLock,
        Component::LockWait,
        Component::TagWait,
        Component::Retag,
        Component::Protection,
        Component::DeviceQueue,
        Component::NetworkWait,
        Component::Network,
        Component::PacketBuffer,
        Component::DmaWait,
        Component::Dma,
        Component::RingWait,
        Component::Ring,
        Component::ControllerQueue,
        Component::Array,
        Component::Notify,
        Component::Interrupt,
        Component::WakeUp,
        Component::SpinDetect,
        Component::CoreWait,
        Component::Preempted,
        Component::CopyOut,
        Component::Return,
    ];

    /// Short machine name (JSON keys, CSV columns).
    pub fn key(self) -> &'static str {
        match self {
            Component::SyscallEntry => "syscall_entry",
            Component::FileSystem => "file_system",
            Component::Library => "library",
            Component::PermissionMiss => "permission_miss",
            Component::BlockLayer => "block_layer",
            Component::BlockTransport => "block_transport",
            Component::TargetWait => "target_wait",
            Component::Tag => "tag",
            Component::CopyIn => "copy_in",
            Component::Pio => "pio",
            Component::DriverLock => "driver_lock",
            Component::LockWait => "lock_wait",
            Component::TagWait => "tag_wait",
            Component::Retag => "retag",
            Component::Protection => "protection",
            Component::DeviceQueue => "device_queue",
            Component::NetworkWait => "network_wait",
            Component::Network => "network",
            Component::PacketBuffer => "packet_buffer",
            Component::DmaWait => "dma_wait",
            Component::Dma => "dma",
            Component::RingWait => "ring_wait",
            Component::Ring => "ring",
            Component::ControllerQueue => "controller_queue",
            Component::Array => "array",
            Component::Notify => "notify",
            Component::Interrupt => "interrupt",
            Component::WakeUp => "wake_up",
            Component::SpinDetect => "spin_detect",
            Component::CoreWait => "core_wait",
            Component::Preempted => "preempted",
            Component::CopyOut => "copy_out",
            Component::Return => "return",
        }
    }

    /// The row label, worded as Table 3.1 / 4.2.
    pub fn label(self) -> &'static str {
        match self {
            Component::SyscallEntry => "OS entry / system call",
            Component::FileSystem => "file system",
            Component::Library => "user-space library",
            Component::PermissionMiss => "permission miss",
            Component::BlockLayer => "block queue + scheduler",
            Component::BlockTransport => "block transport (iSCSI / FC)",
            Component::TargetWait => "wait for the target's CPU",
            Component::Tag => "get request, assign tag",
            Component::CopyIn => "copy into DMA buffer",
            Component::Pio => "PIO command writes",
            Component::DriverLock => "driver lock",
            Component::LockWait => "lock / server wait",
            Component::TagWait => "tag wait",
            Component::Retag => "registers + retag",
            Component::Protection => "protection check",
            Component::DeviceQueue => "device queue / buffer wait",
            Component::NetworkWait => "network: wait for the port",
            Component::Network => "network: NICs, links, switch",
            Component::PacketBuffer => "network: whole-packet receive",
            Component::DmaWait => "DMA: wait for the link",
            Component::Dma => "DMA",
            Component::RingWait => "ring: wait for the token",
            Component::Ring => "ring",
            Component::ControllerQueue => "controller queue",
            Component::Array => "memory array access",
            Component::Notify => "completion notification",
            Component::Interrupt => "interrupt handler",
            Component::WakeUp => "wake-up",
            Component::SpinDetect => "spin: notice completion",
            Component::CoreWait => "wait for a core",
            Component::Preempted => "preempted by an interrupt",
            Component::CopyOut => "copy from DMA buffer",
            Component::Return => "OS return",
        }
    }

    /// Whether the device (rather than host software) spends this time.
    pub fn is_device(self) -> bool {
        matches!(
            self,
            Component::Retag
                | Component::Protection
                | Component::DeviceQueue
                | Component::NetworkWait
                | Component::Network
                | Component::PacketBuffer
                | Component::DmaWait
                | Component::Dma
                | Component::RingWait
                | Component::Ring
                | Component::ControllerQueue
                | Component::Array
        )
    }
}

/// Nanoseconds per component of one request (or of a sum of requests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parts([Ns; Component::COUNT]);

impl Default for Parts {
    fn default() -> Self {
        Parts([0; Component::COUNT])
    }
}

impl Parts {
    /// Add `ns` to `component`; returns `ns` so costs can be labelled inline.
    pub fn add(&mut self, component: Component, ns: Ns) -> Ns {
        self.0[component as usize] += ns;
        ns
    }

    pub fn get(&self, component: Component) -> Ns {
        self.0[component as usize]
    }

    pub fn add_parts(&mut self, other: &Parts) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }

    pub fn total_ns(&self) -> Ns {
        self.0.iter().sum()
    }

    pub fn iter(&self) -> impl Iterator<Item = (Component, Ns)> + '_ {
        Component::ALL.iter().map(|&c| (c, self.get(c)))
    }

    /// The device's parts alone.
    pub fn from_device(device: &DeviceParts) -> Parts {
        let mut p = Parts::default();
        p.add_device(device);
        p
    }

    /// Add the device's parts.
    pub fn add_device(&mut self, device: &DeviceParts) {
        let first = DeviceParts::FIRST as usize;
        for (a, b) in self.0[first..first + DeviceParts::COUNT]
            .iter_mut()
            .zip(device.0.iter())
        {
            *a += b;
        }
    }
}

/// The device's components only (contiguous in [`Component`], from
/// `Retag` to `Array`): what the device carries per segment and request,
/// kept small because it is copied along the data path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceParts([Ns; DeviceParts::COUNT]);

impl DeviceParts {
    const FIRST: Component = Component::Retag;
    pub const COUNT: usize = Component::Array as usize - Component::Retag as usize + 1;

    pub fn add(&mut self, component: Component, ns: Ns) {
        debug_assert!(component.is_device(), "{component:?} is not the device's");
        self.0[component as usize - Self::FIRST as usize] += ns;
    }

    pub fn get(&self, component: Component) -> Ns {
        self.0[component as usize - Self::FIRST as usize]
    }

    pub fn add_parts(&mut self, other: &DeviceParts) {
        for (a, b) in self.0.iter_mut().zip(other.0.iter()) {
            *a += b;
        }
    }

    pub fn total_ns(&self) -> Ns {
        self.0.iter().sum()
    }

    /// Remove `ns` from the front of the chain (components in their order):
    /// the part of the device's time hidden under host work that ran after
    /// the issue. Returns the parts of the rest.
    pub fn trim_front(mut self, mut ns: Ns) -> DeviceParts {
        for v in self.0.iter_mut() {
            let cut = ns.min(*v);
            *v -= cut;
            ns -= cut;
            if ns == 0 {
                break;
            }
        }
        self
    }
}

/// Sum of the parts of many requests, for means per group and per run.
#[derive(Debug, Clone, PartialEq)]
pub struct Breakdown {
    /// u64 holds 584 years of summed latency per component.
    sum_ns: [u64; Component::COUNT],
    count: u64,
}

impl Default for Breakdown {
    fn default() -> Self {
        Breakdown {
            sum_ns: [0; Component::COUNT],
            count: 0,
        }
    }
}

impl Breakdown {
    pub fn record(&mut self, parts: &Parts) {
        for (s, &v) in self.sum_ns.iter_mut().zip(parts.0.iter()) {
            *s += v;
        }
        self.count += 1;
    }

    /// Record a request whose time is the device's alone: the same as
    /// `record(&Parts::from_device(device))`, touching only the device's
    /// components (the emulator records one per completion).
    pub fn record_device(&mut self, device: &DeviceParts) {
        let first = DeviceParts::FIRST as usize;
        for (s, &v) in self.sum_ns[first..first + DeviceParts::COUNT]
            .iter_mut()
            .zip(device.0.iter())
        {
            *s += v;
        }
        self.count += 1;
    }

    pub fn merge(&mut self, other: &Breakdown) {
        for (s, v) in self.sum_ns.iter_mut().zip(other.sum_ns.iter()) {
            *s += v;
        }
        self.count += other.count;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// Mean nanoseconds per request of one component.
    pub fn mean_ns(&self, component: Component) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns[component as usize] as f64 / self.count as f64
        }
    }

    /// Mean latency: the sum of all components' means.
    pub fn total_mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns.iter().map(|&s| s as u128).sum::<u128>() as f64 / self.count as f64
        }
    }

    /// (component, mean µs) of the components that took any time, in order.
    pub fn mean_us(&self) -> Vec<(Component, f64)> {
        Component::ALL
            .iter()
            .filter(|&&c| self.sum_ns[c as usize] > 0)
            .map(|&c| (c, self.mean_ns(c) / 1e3))
            .collect()
    }
}

/// Serializes as `{component key: mean µs}`, in component order, without
/// the components that took no time.
impl Serialize for Breakdown {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let parts = self.mean_us();
        let mut map = serializer.serialize_map(Some(parts.len()))?;
        for (c, us) in parts {
            map.serialize_entry(c.key(), &us)?;
        }
        map.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_component_once_in_order() {
        for (i, c) in Component::ALL.iter().enumerate() {
            assert_eq!(*c as usize, i);
        }
    }

    #[test]
    fn trimming_takes_from_the_front_and_keeps_the_sum() {
        let mut p = DeviceParts::default();
        p.add(Component::Retag, 100);
        p.add(Component::Dma, 300);
        p.add(Component::Array, 50);
        let t = p.trim_front(250);
        assert_eq!(t.get(Component::Retag), 0);
        assert_eq!(t.get(Component::Dma), 150);
        assert_eq!(t.total_ns(), 200);
        assert_eq!(p.trim_front(1000).total_ns(), 0);
        let mut all = Parts::default();
        all.add_device(&t);
        assert_eq!(all.get(Component::Dma), 150);
        assert_eq!(all.get(Component::Array), 50);
        assert_eq!(all.total_ns(), 200);
    }

    #[test]
    fn means_sum_to_the_mean_total() {
        let mut b = Breakdown::default();
        let mut p = Parts::default();
        p.add(Component::Pio, 7);
        p.add(Component::Array, 5);
        b.record(&p);
        b.record(&Parts::default());
        assert_eq!(b.total_mean_ns(), 6.0);
        // A device-only record is the record of its full parts.
        let mut d = DeviceParts::default();
        d.add(Component::Retag, 3);
        d.add(Component::Array, 11);
        let (mut by_parts, mut by_device) = (b.clone(), b.clone());
        by_parts.record(&Parts::from_device(&d));
        by_device.record_device(&d);
        assert_eq!(by_parts, by_device);
        assert_eq!(by_device.count(), 3);
        let sum: f64 = b.mean_us().iter().map(|(_, us)| us).sum();
        assert!((sum * 1e3 - 6.0).abs() < 1e-9);
    }
}
