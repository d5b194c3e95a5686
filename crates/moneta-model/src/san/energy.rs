//! Energy per operation of a SAN run (§5.4.7, SPEC §4.4): the hosts, the
//! SSDs and the switch, over the run's virtual time, per request.
//!
//! The paper measured the servers at the power supply and assumed 24 W per
//! QuickSAN SSD (the FusionIO ioDrive's maximum, constant under load) and
//! 150 W for the switch (it hardly varies with load); those two are its
//! figures. The paper gives no host figures; ours come from public sources
//! for the same class of machine (a dual-socket Xeon E5520 server, §5.4.1).
//!
//! - **Measured curve** (`san.host_power_w`, the preset's): a published
//!   SPECpower_ssj2008 result's average active power at active idle and at
//!   10 %, 20 %, … 100 % of the maximum load, interpolated linearly in the
//!   busy fraction of the host's cores ([`HostPower::curve_w`]). The
//!   preset's is the IBM System x3550 M3 with two Xeon X5670
//!   (Westmere-EP, the E5520's LGA1366 / Intel 5520 platform one step
//!   later), SPECpower_ssj2008 result
//!   `res2010q2/power_ssj2008-20100315-00239`: 66 W at active idle, 247 W
//!   at 100 %, as CloudSim ships it (`PowerModelSpecPowerIbmX3550XeonX5670`,
//!   Beloglazov and Buyya, CCPE 24(13), 2012). No SPECpower result of an
//!   E5520 pair was found in a citable form.
//! - **Without a curve** (an empty `san.host_power_w`, or `moneta san sim
//!   energy --host-idle-w/--host-busy-w`): power linear in the busy
//!   fraction (Fan, Weber and Barroso, "Power Provisioning for a
//!   Warehouse-sized Computer", ISCA 2007), the dynamic range the two
//!   sockets' thermal design power (Intel ARK, Xeon E5520: 80 W TDP, 4
//!   cores, 2.26 GHz), and an idle server at half its full power (Barroso
//!   and Hölzle, "The Case for Energy-Proportional Computing", IEEE
//!   Computer 40(12), 2007): [`HostPower::idle_w`] 160 W and
//!   [`HostPower::busy_w`] 320 W.
//!
//! The busy time is the model's: client software, spinning and interrupts,
//! and the iSCSI targets' software. Left out: NIC and HBA power, DRAM
//! activity beyond what the SPECpower configuration's own memory draws,
//! and the difference between SPECpower's load levels (fractions of the
//! maximum throughput, all hardware threads) and the cores' busy fraction.

use crate::config::InterfaceCosts;
use crate::san::experiments::{mix_key, topology_key, Progress, RunResult, Setup};
use crate::san::interfaces::Interface;
use crate::san::system::Topology;
use crate::workload::OpMix;
use serde::Serialize;

/// Power assumptions, in W.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostPower {
    /// A host with idle cores: half the busy power (Barroso and Hölzle,
    /// IEEE Computer 2007), 160 W.
    pub idle_w: f64,
    /// All cores busy: idle + the two sockets' TDP (Intel ARK, E5520: 80 W
    /// each), 320 W.
    pub busy_w: f64,
    /// Cores per host: 2 × 4 (E5520, hyper-threads not counted).
    pub cores: u32,
    /// Per QuickSAN SSD (§5.4.7): 24 W.
    pub ssd_w: f64,
    /// The switch (§5.4.7): 150 W.
    pub switch_w: f64,
    /// A measured power curve: the power at active idle and at 10 %, 20 %,
    /// … 100 % busy (SPECpower_ssj2008's 11 levels), interpolated linearly;
    /// when set it replaces `idle_w` and `busy_w`. Empty: the line from
    /// `idle_w` to `busy_w`.
    pub curve_w: Vec<f64>,
}

/// SPECpower_ssj2008 reports 11 load levels: active idle, 10 % … 100 %.
pub const SPECPOWER_LEVELS: usize = 11;

impl HostPower {
    /// The power model of `costs` (`san.host_power_w`): its curve, or
    /// without one the TDP-based line ([`HostPower::default`]).
    pub fn of_costs(costs: &InterfaceCosts) -> Result<HostPower, String> {
        let curve = &costs.host_power_w;
        if curve.is_empty() {
            return Ok(HostPower::default());
        }
        if curve.len() != SPECPOWER_LEVELS {
            return Err(format!(
                "san.host_power_w needs {SPECPOWER_LEVELS} values (active idle, 10 % … 100 %), has {}",
                curve.len()
            ));
        }
        if curve.iter().any(|w| !w.is_finite() || *w < 0.0) {
            return Err("san.host_power_w: every power must be a finite, non-negative W".into());
        }
        Ok(HostPower {
            idle_w: curve[0],
            busy_w: curve[SPECPOWER_LEVELS - 1],
            curve_w: curve.clone(),
            ..HostPower::default()
        })
    }

    /// One host's power with `utilization` (0–1) of its cores busy.
    pub fn host_w(&self, utilization: f64) -> f64 {
        let u = utilization.clamp(0.0, 1.0);
        if self.curve_w.len() < 2 {
            return self.idle_w + (self.busy_w - self.idle_w) * u;
        }
        let steps = (self.curve_w.len() - 1) as f64;
        let x = u * steps;
        let i = (x.floor() as usize).min(self.curve_w.len() - 2);
        let f = x - i as f64;
        self.curve_w[i] + (self.curve_w[i + 1] - self.curve_w[i]) * f
    }
}

impl Default for HostPower {
    fn default() -> Self {
        HostPower {
            idle_w: 160.0,
            busy_w: 320.0,
            cores: 8,
            ssd_w: 24.0,
            switch_w: 150.0,
            curve_w: Vec::new(),
        }
    }
}

/// Where a run's energy went, per request.
#[derive(Debug, Clone, Serialize)]
pub struct EnergyPerOp {
    pub joules_per_op: f64,
    pub host_joules_per_op: f64,
    pub ssd_joules_per_op: f64,
    pub switch_joules_per_op: f64,
    /// Mean busy fraction of the hosts' cores.
    pub host_cpu_utilization: f64,
}

/// Energy per request of `run` on `hosts` machines (all hosts of the SAN,
/// including a centralized server).
pub fn per_op(run: &RunResult, hosts: u16, power: &HostPower) -> Result<EnergyPerOp, String> {
    if run.ops == 0 || run.elapsed_ns == 0 {
        return Err("no requests completed: no energy per request".into());
    }
    if hosts == 0 || power.cores == 0 {
        return Err("energy needs at least one host with one core".into());
    }
    let seconds = run.elapsed_ns as f64 / 1e9;
    let core_seconds = hosts as f64 * power.cores as f64 * seconds;
    let busy_seconds = (run.client_cpu_ns + run.target_cpu_ns) as f64 / 1e9;
    let utilization = (busy_seconds / core_seconds).min(1.0);
    let host_w = hosts as f64 * power.host_w(utilization);
    let ops = run.ops as f64;
    let host = host_w * seconds / ops;
    let ssd = run.ssds as f64 * power.ssd_w * seconds / ops;
    let switch = power.switch_w * seconds / ops;
    Ok(EnergyPerOp {
        joules_per_op: host + ssd + switch,
        host_joules_per_op: host,
        ssd_joules_per_op: ssd,
        switch_joules_per_op: switch,
        host_cpu_utilization: utilization,
    })
}

// ---------------------------------------------------------------------------
// The experiment (`moneta san sim energy`).

/// One row of `moneta san sim energy` (§5.4.7, Figure 5.10).
#[derive(Debug, Clone, Serialize)]
pub struct EnergyRow {
    pub interface: Interface,
    pub topology: &'static str,
    pub op: &'static str,
    pub size_bytes: u64,
    pub iops: f64,
    #[serde(flatten)]
    pub energy: EnergyPerOp,
}

/// The energy per request of `rows`' row for one interface and op.
pub fn joules_per_op(rows: &[EnergyRow], i: Interface, op: &str) -> f64 {
    rows.iter()
        .find(|r| r.interface == i && r.op == op)
        .expect("a row per interface and op")
        .energy
        .joules_per_op
}

/// Energy per request under the bandwidth load.
pub fn energy(
    setup: &Setup,
    interfaces: &[Interface],
    topology: Topology,
    mixes: &[OpMix],
    size_bytes: u64,
    power: &HostPower,
    progress: Progress,
) -> Result<Vec<EnergyRow>, String> {
    let hosts = match topology {
        Topology::Distributed { nodes } => nodes,
        Topology::Centralized { clients, .. } => clients + 1,
    };
    let mut points = Vec::new();
    for &i in interfaces {
        for &m in mixes {
            points.push((i, m));
        }
    }
    let mut rows = Vec::new();
    for (k, &(interface, mix)) in points.iter().enumerate() {
        progress(
            k,
            points.len(),
            &format!("{} {}", interface.key(), mix_key(mix)),
        );
        let r = setup.loaded(setup.san(topology, false), interface, mix, size_bytes)?;
        rows.push(EnergyRow {
            interface,
            topology: topology_key(topology),
            op: mix_key(mix),
            size_bytes,
            iops: crate::experiment::rate(r.ops, r.elapsed_ns),
            energy: per_op(&r, hosts, power)?,
        });
    }
    progress(points.len(), points.len(), "done");
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breakdown::Breakdown;
    use crate::san::system::SanCounters;
    use crate::stats::LatencyHistogram;

    fn run(ops: u64, elapsed_ns: u64, cpu_ns: u64) -> RunResult {
        RunResult {
            elapsed_ns,
            ops,
            bytes: ops * 4096,
            latency: LatencyHistogram::new(),
            breakdown: Breakdown::default(),
            active_hosts: 4,
            local_bytes: 0,
            remote_bytes: 0,
            client_cpu_ns: cpu_ns,
            target_cpu_ns: 0,
            counters: SanCounters::default(),
            ssds: 4,
        }
    }

    #[test]
    fn idle_hosts_ssds_and_switch_over_the_run() {
        let p = HostPower::default();
        let e = per_op(&run(1000, 1_000_000_000, 0), 4, &p).unwrap();
        assert!((e.host_joules_per_op - 4.0 * p.idle_w / 1000.0).abs() < 1e-12);
        assert!((e.ssd_joules_per_op - 4.0 * 24.0 / 1000.0).abs() < 1e-12);
        assert!((e.switch_joules_per_op - 150.0 / 1000.0).abs() < 1e-12);
        // Busy cores cost more per request at the same rate.
        let busy = per_op(&run(1000, 1_000_000_000, 16_000_000_000), 4, &p).unwrap();
        assert!(busy.joules_per_op > e.joules_per_op);
        assert!((busy.host_cpu_utilization - 0.5).abs() < 1e-12);
        assert!(per_op(&run(0, 1, 0), 4, &p).is_err());
    }

    #[test]
    fn a_specpower_curve_is_interpolated_between_its_levels() {
        let mut costs = InterfaceCosts {
            host_power_w: vec![
                66.0, 107.0, 120.0, 131.0, 143.0, 156.0, 173.0, 191.0, 211.0, 229.0, 247.0,
            ],
            ..InterfaceCosts::default()
        };
        let p = HostPower::of_costs(&costs).unwrap();
        assert_eq!((p.idle_w, p.busy_w), (66.0, 247.0));
        assert_eq!(p.host_w(0.0), 66.0);
        assert_eq!(p.host_w(1.0), 247.0);
        assert!((p.host_w(0.25) - 125.5).abs() < 1e-9, "{}", p.host_w(0.25));
        assert!((p.host_w(0.05) - 86.5).abs() < 1e-9);
        assert_eq!(p.host_w(2.0), 247.0);
        // Idle hosts over a run draw the curve's active idle.
        let e = per_op(&run(1000, 1_000_000_000, 0), 4, &p).unwrap();
        assert!((e.host_joules_per_op - 4.0 * 66.0 / 1000.0).abs() < 1e-12);
        // Without a curve, the TDP line.
        costs.host_power_w.clear();
        let line = HostPower::of_costs(&costs).unwrap();
        assert_eq!(line, HostPower::default());
        assert_eq!(line.host_w(0.5), 240.0);
        costs.host_power_w = vec![1.0; 10];
        assert!(HostPower::of_costs(&costs).is_err());
        costs.host_power_w = vec![-1.0; 11];
        assert!(HostPower::of_costs(&costs).is_err());
    }
}
