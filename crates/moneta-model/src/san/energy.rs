//! Energy per operation of a SAN run (§5.4.7, SPEC §4.4): the hosts, the
//! SSDs and the switch, over the run's virtual time, per request.
//!
//! The paper measured the servers at the power supply and assumed 24 W per
//! QuickSAN SSD (the FusionIO ioDrive's maximum, constant under load) and
//! 150 W for the switch (it hardly varies with load); those two are its
//! figures. The paper gives no host figures; ours come from public sources
//! for the same class of machine (a dual Xeon E5520 server, §5.4.1):
//! power linear in the busy fraction of the cores (Fan, Weber and Barroso,
//! "Power Provisioning for a Warehouse-sized Computer", ISCA 2007: a
//! server's power follows CPU utilization linearly), the dynamic range the
//! two sockets' thermal design power (Intel ARK, Xeon E5520: 80 W TDP, 4
//! cores, 2.26 GHz), and an idle server at half its full power (Barroso
//! and Hölzle, "The Case for Energy-Proportional Computing", IEEE Computer
//! 40(12), 2007: servers "consume about half their full power when doing
//! virtually no work"): busy − idle = 2 × 80 W and idle = busy / 2, so
//! [`HostPower::idle_w`] 160 W and [`HostPower::busy_w`] 320 W. The busy
//! time is the model's: client software, spinning and interrupts, and the
//! iSCSI targets' software.
//!
//! Left out: NIC and HBA power, DRAM activity, the power the PSU loses.

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
}

impl Default for HostPower {
    fn default() -> Self {
        HostPower {
            idle_w: 160.0,
            busy_w: 320.0,
            cores: 8,
            ssd_w: 24.0,
            switch_w: 150.0,
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
    let host_w = hosts as f64 * (power.idle_w + (power.busy_w - power.idle_w) * utilization);
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
}
