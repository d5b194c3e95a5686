//! QuickSAN (SPEC §4, dissertation ch. 5, Appendix A.6): Moneta devices with
//! a network port, joined by 10 Gb Ethernet switches into one global
//! storage address space, and the host interfaces that use them.
//!
//! - [`fabric`]: links, the switch and 802.3x pause between the ports,
//!   with the per-element latencies derived from the published ones.
//! - [`ids`] and [`error`]: the names of the SAN's hosts and devices, and
//!   why it refuses a call.
//! - [`address_map`]: the configuration utility: the global space on the
//!   SSDs, mirroring, and the routing registers it programs.
//! - [`system`]: the SAN as the simulator drives it: hosts, their devices
//!   (QuickSAN SSDs and NICs, each the `device::pipeline` with its network
//!   port), the switch fabric, the global address map and mirroring, on one
//!   event queue. Its API is the boundary the host interfaces use.
//! - [`interfaces`]: the host interfaces of §5.4 (QuickSAN-D, QuickSAN-OS,
//!   iSCSI, Fibre Channel) as host-stack models on top of `system`.
//! - [`experiments`]: the §5.4 experiments: closed-loop threads on the
//!   SAN's event queue (latency, bandwidth, scaling, replication, energy).
//! - [`sort`]: the two-stage distributed sort of §5.4.6 (SPEC §4.4).
//! - [`energy`]: energy per operation (§5.4.7).
//! - [`calibration_runs`]: the experiments of the calibration's set-up,
//!   run once for the calibration checks and the orderings.
//!
//! The device's network port and packets are device components
//! (`device::network`, `device::packet`): the simulator and, later, the
//! emulator on real frames share them.

pub mod address_map;
pub mod calibration_runs;
pub mod energy;
pub mod error;
pub mod experiments;
pub mod fabric;
pub mod ids;
pub mod interfaces;
pub mod sort;
pub mod system;
