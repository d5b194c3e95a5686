//! The QuickSAN experiments of the calibration's set-up (dissertation
//! ch. 5: preset `quicksan-ssd`, distributed over 4 nodes, 8 closed-loop
//! threads per host), run once and read by both the calibration checks
//! (`calibration::quicksan`) and the published orderings
//! (`orderings::quicksan`), so that a process that wants both (`moneta
//! report`) does not simulate the same points twice.

use crate::config::Config;
use crate::san::energy::{energy, joules_per_op, EnergyRow, HostPower};
use crate::san::experiments::{
    bandwidth, latency, mb_per_s_per_host, topology, BandwidthRow, LatencyRow, Setup,
};
use crate::san::interfaces::Interface;
use crate::san::system::Topology;
use crate::workload::OpMix;

/// Requests per latency point (one thread).
pub const LATENCY_OPS: u64 = 2_000;
/// Requests per loaded point (bandwidth and energy).
pub const LOADED_OPS: u64 = 20_000;

/// The set-up of every QuickSAN calibration experiment: preset
/// `quicksan-ssd` with its own interface costs, 8 threads per host, `ops`
/// requests per point.
pub fn setup(seed: u64, ops: u64) -> Setup {
    let device = Config::preset("quicksan-ssd").expect("shipped preset");
    Setup {
        costs: device.san.clone(),
        device,
        seed,
        ops,
        threads_per_host: 8,
    }
}

/// Distributed, 4 nodes (§5.4.1).
pub fn distributed() -> Topology {
    topology(false, 4).expect("4 nodes")
}

/// What the calibration checks and the orderings read.
#[derive(Debug, Clone)]
pub struct QuicksanRuns {
    /// Table 5.1: one thread, 4 KB, local and remote reads and writes, for
    /// QuickSAN-D, QuickSAN-OS, iSCSI and Fibre Channel ([`LATENCY_OPS`]).
    pub latency: Vec<LatencyRow>,
    /// Chapter 5's bandwidth statements: QuickSAN-D and iSCSI, reads,
    /// writes and 50/50, 512 B and 4 KB ([`LOADED_OPS`]).
    pub bandwidth: Vec<BandwidthRow>,
    /// §5.4.7: energy per 4 KB request for QuickSAN-D, QuickSAN-OS and
    /// iSCSI, reads, writes and 50/50 ([`LOADED_OPS`]).
    pub energy: Vec<EnergyRow>,
}

/// QuickSAN-D, QuickSAN-OS and iSCSI: the stacks §5.4.7's energy and
/// Fig. 5.5's bandwidth compare.
pub const THREE_STACKS: [Interface; 3] = [
    Interface::QuicksanD,
    Interface::QuicksanOs,
    Interface::Iscsi,
];

impl QuicksanRuns {
    /// Run every experiment once with `seed`.
    pub fn run(seed: u64) -> QuicksanRuns {
        let all = [
            Interface::QuicksanD,
            Interface::QuicksanOs,
            Interface::Iscsi,
            Interface::FibreChannel,
        ];
        let mixes = [OpMix::Read, OpMix::Write, OpMix::Mixed(0.5)];
        let loaded = setup(seed, LOADED_OPS);
        QuicksanRuns {
            latency: latency(
                &setup(seed, LATENCY_OPS),
                &all,
                distributed(),
                4096,
                &mut |_, _, _| {},
            )
            .expect("latency runs"),
            bandwidth: bandwidth(
                &loaded,
                &[Interface::QuicksanD, Interface::Iscsi],
                distributed(),
                false,
                &mixes,
                &[512, 4096],
                &mut |_, _, _| {},
            )
            .expect("bandwidth runs"),
            energy: energy(
                &loaded,
                &THREE_STACKS,
                distributed(),
                &mixes,
                4096,
                &HostPower::of_costs(&loaded.costs).expect("the preset's host power"),
                &mut |_, _, _| {},
            )
            .expect("energy runs"),
        }
    }

    /// The remote 4 KB latency row of one interface and op ("read",
    /// "write").
    pub fn remote(&self, i: Interface, op: &str) -> &LatencyRow {
        self.latency
            .iter()
            .find(|r| r.interface == i && r.locality == "remote" && r.op == op)
            .expect("a remote row per interface and op")
    }

    /// Per-host bandwidth of one interface, op and size.
    pub fn mb_per_s_per_host(&self, i: Interface, op: &str, size: u64) -> f64 {
        mb_per_s_per_host(&self.bandwidth, i, op, size)
    }

    /// Energy per 4 KB request of one interface and op.
    pub fn joules_per_op(&self, i: Interface, op: &str) -> f64 {
        joules_per_op(&self.energy, i, op)
    }
}
