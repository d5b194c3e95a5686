//! `moneta san sim …`: the QuickSAN experiments of §5.4 (SPEC §4.4) in
//! virtual time, on the SAN model (`moneta_model::san`): latency,
//! bandwidth, scaling, replication, the distributed sort and energy. Every
//! command prints a table, JSON or CSV (CSV: the JSON's fields as columns),
//! shows progress on stderr when it is a terminal, and writes an SVG plot
//! (`--plot`) and an HTML report (`--report`).
//!
//! The sort's CPU costs are measured here, on this machine (the model never
//! reads the wall clock), by timing the model's own partition and sort
//! kernels on generated records; `--partition-ns`/`--sort-ns` give them
//! instead, for reproducible output.

use crate::output::{print_result_csv, print_result_json, table, Format};
use crate::plot::{self, Chart, Report, ReportSection, Series, StackedBars};
use crate::provenance::Provenance;
use crate::DeviceArgs;
use clap::{Args, Subcommand};
use moneta_model::config::{Config, InterfaceCosts};
use moneta_model::san::energy::{self, HostPower};
use moneta_model::san::experiments::{self, topology, Progress, Setup};
use moneta_model::san::interfaces::Interface;
use moneta_model::san::sort::{self, CpuCosts, SortSetup};
use moneta_model::san::system::{SanConfig, Topology};
use moneta_model::workload::OpMix;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

use crate::san_up::DEVICE_PRESET;

#[derive(Subcommand)]
pub enum SanCommand {
    /// Simulate the QuickSAN experiments (§5.4) in virtual time.
    #[command(subcommand)]
    Sim(Box<SanSim>),
    /// Bring up an emulated SAN on this machine: a network namespace, a
    /// veth link into a bridge (the switch) and a monetad per host (root).
    Up(crate::san_up::SanUpArgs),
    /// Stop a SAN's daemons and remove its namespaces and links (keeps the images).
    Down(crate::san_up::SanDownArgs),
    /// Whether each node's namespace, link and daemon are there.
    Status(crate::san_up::SanStatusArgs),
    /// Start a node that died or was killed again, on its image; it
    /// resyncs from its mirror partners (root).
    Restart(crate::san_up::SanRestartArgs),
    /// Inject faults into a node's link at run time: drop, corrupt,
    /// duplicate, reorder, delay, partition; `none` heals.
    Fault(crate::san_up::SanFaultArgs),
    /// Resolve a split brain: NODE discards its writes in the split-brain
    /// slices it holds (all, or --slice), its partner's copy wins and
    /// resyncs it (DRBD's discard-my-data).
    Resolve(crate::san_up::SanResolveArgs),
    /// Local against remote access on a SAN that is up, through node 0's
    /// daemon, beside the simulator's prediction.
    Bench(crate::san_bench::SanBenchArgs),
    /// The distributed sort (SPEC §4.4) for real: one worker per host on a
    /// SAN (or N workers on one daemon), validated, timed, and next to the
    /// simulator's prediction.
    Sort(Box<crate::san_sort::SortRunArgs>),
    /// A randomized fault schedule (kill -9, restart, partitions, lossy
    /// links, resolve) against a mirrored SAN of its own, with a register
    /// checker on every read; the seed reproduces the schedule (root).
    Chaos(Box<crate::san_chaos::SanChaosArgs>),
    /// The deterministic simulator of the replica protocol: the daemons'
    /// own replica logic on one thread, a virtual clock and the in-memory
    /// wire, under a seeded nemesis, checked by the chaos checker's
    /// register model; a seed replays exactly.
    SimProtocol(crate::san_chaos::SimProtocolArgs),
    /// One host's sort worker (started by `moneta san sort`).
    #[command(hide = true)]
    SortWorker(crate::sort_worker::SortWorkerArgs),
}

#[derive(Subcommand)]
pub enum SanSim {
    /// One thread, serial requests: every interface × local/remote ×
    /// read/write, where time goes (Table 5.1 / 5.2).
    Latency(LatencyArgs),
    /// Mean per-host bandwidth of random requests, 512 B … 256 KB (Fig. 5.5).
    Bandwidth(BandwidthArgs),
    /// Aggregate local, network and total bandwidth over cluster sizes (Fig. 5.6).
    Scaling(ScalingArgs),
    /// Latency and bandwidth with and without mirroring (Fig. 5.7).
    Replication(ReplicationArgs),
    /// The two-stage distributed sort of 102.4 GB of 100-byte records (Fig. 5.9).
    Sort(SortArgs),
    /// Energy per 4 KB request: hosts, SSDs, switch (Fig. 5.10).
    Energy(EnergyArgs),
}

/// What every SAN command shares.
#[derive(Args, Clone)]
pub struct CommonArgs {
    /// The device preset or file [default preset: quicksan-ssd], with overrides.
    #[command(flatten)]
    device: DeviceArgs,
    /// Random seed: the same seed gives the same numbers.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Output format: a table, JSON, or CSV (every JSON field a column).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
    /// Requests per measured point (all threads together).
    #[arg(long)]
    ops: Option<u64>,
    /// Closed-loop threads per host for the loaded experiments (8: one per
    /// core of the paper's dual Xeon E5520 hosts).
    #[arg(long, default_value_t = 8)]
    threads: u32,
    /// Cores the iSCSI target software runs on per host [default: the
    /// preset's san.iscsi_target_cores, 1: tgtd's one event loop].
    #[arg(long)]
    target_cores: Option<u32>,
    /// Write an SVG plot.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    /// Write an HTML report (plot and table).
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
}

impl CommonArgs {
    fn device(&self) -> crate::error::Result<Config> {
        let mut d = self.device.clone();
        if !d.given_file() && d.preset.is_none() {
            d.preset = Some(DEVICE_PRESET.into());
        }
        d.config()
    }

    fn setup(&self, default_ops: u64) -> Result<Setup, String> {
        plot::check_outputs(self.plot.as_deref(), self.report.as_deref())?;
        let ops = self.ops.unwrap_or(default_ops);
        if ops == 0 {
            return Err("--ops must be positive".into());
        }
        if self.threads == 0 {
            return Err("--threads must be at least 1".into());
        }
        if self.target_cores == Some(0) {
            return Err("--target-cores must be at least 1".into());
        }
        let device = self.device()?;
        let costs = InterfaceCosts {
            iscsi_target_cores: self.target_cores.unwrap_or(device.san.iscsi_target_cores),
            ..device.san.clone()
        };
        Ok(Setup {
            device,
            costs,
            seed: self.seed,
            ops,
            threads_per_host: self.threads,
        })
    }
}

/// Which interfaces, on which SAN.
#[derive(Args, Clone)]
pub struct ScopeArgs {
    /// Interfaces, comma-separated (quicksan-d, quicksan-os, iscsi,
    /// fibre-channel), or all.
    #[arg(long, default_value = "all")]
    interfaces: String,
    /// distributed (one SSD per node: local and remote accesses) or
    /// centralized (the SSDs in one server, remote only).
    #[arg(long, default_value = "distributed")]
    topology: String,
    /// Nodes (distributed), or SSDs and clients (centralized).
    #[arg(long, default_value_t = 4)]
    nodes: u16,
}

impl ScopeArgs {
    fn parse(&self) -> Result<(Vec<Interface>, Topology), String> {
        Ok((
            Interface::parse_list(&self.interfaces)?,
            parse_topology(&self.topology, self.nodes)?,
        ))
    }
}

#[derive(Args)]
pub struct LatencyArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Request size in bytes.
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
}

#[derive(Args)]
pub struct BandwidthArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    scope: ScopeArgs,
    /// Comma-separated: read, write, mixed (50/50).
    #[arg(long, default_value = "read,write,mixed")]
    op: String,
    /// Comma-separated request sizes in bytes.
    #[arg(
        long,
        default_value = "512,1024,2048,4096,8192,16384,32768,65536,131072,262144"
    )]
    sizes: String,
    /// With mirroring (§5.4.5).
    #[arg(long)]
    mirroring: bool,
}

#[derive(Args)]
pub struct ScalingArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[arg(long, default_value = "quicksan-d")]
    interface: String,
    /// Comma-separated node counts.
    #[arg(long, default_value = "2,4,8,16")]
    nodes: String,
    /// read, write or mixed.
    #[arg(long, default_value = "mixed")]
    op: String,
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
}

#[derive(Args)]
pub struct ReplicationArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[arg(long, default_value = "quicksan-d,quicksan-os")]
    interfaces: String,
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    #[arg(long, default_value = "read,write,mixed")]
    op: String,
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
}

#[derive(Args)]
pub struct SortArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[arg(long, default_value = "iscsi,quicksan-os,quicksan-d")]
    interfaces: String,
    /// Comma-separated: distributed, centralized.
    #[arg(long, default_value = "distributed,centralized")]
    topology: String,
    #[arg(long, default_value_t = 4)]
    nodes: u16,
    /// Fraction of the paper's 102.4 GB input (e.g. 0.001 for a quick run).
    #[arg(long, default_value_t = 1.0)]
    scale: f64,
    /// Size of each read and buffered write.
    #[arg(long, default_value_t = 262_144, value_parser = moneta_model::units::parse_size)]
    io_bytes: u64,
    /// Records to generate, partition and sort here to measure the CPU cost.
    #[arg(long, default_value_t = 2_000_000)]
    measure_records: usize,
    /// Partitioning ns per record on the paper's host, instead of measuring.
    #[arg(long, requires = "sort_ns")]
    partition_ns: Option<f64>,
    /// Sorting ns per record on the paper's host, instead of measuring.
    #[arg(long, requires = "partition_ns")]
    sort_ns: Option<f64>,
    /// This machine's clock in MHz for the scaling [default: /proc/cpuinfo].
    #[arg(long)]
    here_mhz: Option<f64>,
}

#[derive(Args)]
pub struct EnergyArgs {
    #[command(flatten)]
    common: CommonArgs,
    #[command(flatten)]
    scope: ScopeArgs,
    #[arg(long, default_value = "read,write,mixed")]
    op: String,
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
    /// Host power with idle cores, W: with --host-busy-w, a line in place
    /// of the preset's measured curve (san.host_power_w, SPECpower_ssj2008).
    /// Without the curve the line's default is 160 W (half the busy power:
    /// Barroso and Hölzle, IEEE Computer 2007).
    #[arg(long)]
    host_idle_w: Option<f64>,
    /// Host power with every core busy, W (the line's default: idle + two
    /// E5520s' 80 W TDP, Intel ARK: 320 W).
    #[arg(long)]
    host_busy_w: Option<f64>,
}

pub fn dispatch(command: SanCommand) -> crate::error::Result<()> {
    match command {
        SanCommand::Sim(s) => match *s {
            SanSim::Latency(a) => latency(a)?,
            SanSim::Bandwidth(a) => bandwidth(a)?,
            SanSim::Scaling(a) => scaling(a)?,
            SanSim::Replication(a) => replication(a)?,
            SanSim::Sort(a) => sort_command(a)?,
            SanSim::Energy(a) => energy(a)?,
        },
        SanCommand::Up(a) => crate::san_up::up(a)?,
        SanCommand::Down(a) => crate::san_up::down(a)?,
        SanCommand::Status(a) => crate::san_up::status(a)?,
        SanCommand::Restart(a) => crate::san_up::restart(a)?,
        SanCommand::Fault(a) => crate::san_up::fault(a)?,
        SanCommand::Resolve(a) => crate::san_up::resolve(a)?,
        SanCommand::Bench(a) => crate::san_bench::run(a)?,
        SanCommand::Sort(a) => crate::san_sort::run(*a)?,
        SanCommand::Chaos(a) => crate::san_chaos::run(*a)?,
        SanCommand::SimProtocol(a) => crate::san_chaos::sim_protocol(a)?,
        SanCommand::SortWorker(a) => crate::sort_worker::run(a)?,
    }
    Ok(())
}

fn parse_topology(name: &str, nodes: u16) -> Result<Topology, String> {
    match name {
        "distributed" => topology(false, nodes),
        "centralized" => topology(true, nodes),
        other => Err(format!(
            "unknown topology '{other}' (expected distributed or centralized)"
        )),
    }
}

fn parse_mixes(list: &str) -> Result<Vec<OpMix>, String> {
    list.split(',')
        .map(|s| match s.trim() {
            "read" => Ok(OpMix::Read),
            "write" => Ok(OpMix::Write),
            "mixed" => Ok(OpMix::Mixed(0.5)),
            other => Err(format!(
                "unknown operation '{other}' (expected read, write or mixed)"
            )),
        })
        .collect()
}

fn parse_numbers<T: std::str::FromStr>(what: &str, list: &str) -> Result<Vec<T>, String> {
    list.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| format!("{what}: '{s}' is not a number"))
        })
        .collect()
}

fn positive_size(size: u64) -> Result<u64, String> {
    if size == 0 {
        Err("--size must be positive".into())
    } else {
        Ok(size)
    }
}

/// Progress on stderr, when it is a terminal.
pub(crate) struct Meter {
    on: bool,
    started: Instant,
}

impl Meter {
    pub(crate) fn new() -> Self {
        Meter {
            on: std::io::stderr().is_terminal(),
            started: Instant::now(),
        }
    }

    pub(crate) fn tick(&mut self, done: usize, all: usize, what: &str) {
        if !self.on {
            return;
        }
        if done == all {
            eprintln!(
                "\r{all} points in {:.1} s{:40}",
                self.started.elapsed().as_secs_f64(),
                ""
            );
        } else {
            eprint!(
                "\r[{}/{all}] {what} … {:.1} s{:20}",
                done + 1,
                self.started.elapsed().as_secs_f64(),
                ""
            );
        }
    }
}

/// A figure for `--plot` and the report.
enum Figure {
    Chart(Chart),
    Bars(StackedBars),
}

/// Stacked bars, one per (label, segments), in the given unit.
fn bars(title: String, y_label: &str, bars: Vec<(String, Vec<(String, f64)>)>) -> Figure {
    Figure::Bars(StackedBars {
        title,
        y_label: y_label.into(),
        bars,
        percent: false,
    })
}

/// Print `rows` as the format asks (the table shows `columns`, dotted paths
/// into each row's JSON), then write the plot and the report.
fn emit<T: Serialize>(
    common: &CommonArgs,
    title: &str,
    note: &str,
    rows: &[T],
    columns: &[&str],
    figure: Figure,
) -> Result<(), String> {
    let (header, cells) = table(rows, columns)?;
    match common.format {
        Format::Json => print_result_json(rows, &Provenance::here().seed(common.seed))?,
        Format::Csv => print_result_csv(rows, &Provenance::here().seed(common.seed))?,
        Format::Table => {
            println!("{title}  (seed {})", common.seed);
            crate::output::print_aligned(&header, &cells);
        }
    }
    if let Some(path) = &common.plot {
        let svg = match &figure {
            Figure::Chart(c) => c.to_svg(900, 480),
            Figure::Bars(b) => b.to_svg(900, 480),
        };
        plot::write_file(path, &svg).map_err(|e| e.to_string())?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &common.report {
        let report = Report {
            title: title.to_string(),
            sections: vec![
                ReportSection::Paragraph(format!("{note} Seed {}.", common.seed)),
                match figure {
                    Figure::Chart(c) => ReportSection::Chart(c),
                    Figure::Bars(b) => ReportSection::Bars(b),
                },
                ReportSection::Table {
                    header,
                    rows: cells,
                },
            ],
        };
        plot::write_file(path, &report.to_html()).map_err(|e| e.to_string())?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

fn latency(a: LatencyArgs) -> Result<(), String> {
    let setup = a.common.setup(2_000)?;
    let (interfaces, t) = a.scope.parse()?;
    let mut meter = Meter::new();
    let progress: Progress = &mut |d, n, w| meter.tick(d, n, w);
    let rows = experiments::latency(&setup, &interfaces, t, positive_size(a.size)?, progress)?;
    let bars = bars(
        format!("where time goes: {} B, one thread", a.size),
        "mean latency (µs)",
        rows.iter()
            .map(|r| {
                (
                    format!("{} {} {}", r.interface.key(), r.locality, r.op),
                    r.breakdown_us
                        .mean_us()
                        .into_iter()
                        .map(|(c, us)| (c.label().to_string(), us))
                        .collect(),
                )
            })
            .collect(),
    );
    emit(
        &a.common,
        &format!(
            "QuickSAN latency, {} B, one thread, {} {} nodes",
            a.size, a.scope.topology, a.scope.nodes
        ),
        "Mean µs per request (§5.4.2); Table 5.1 grouping beside Table 5.1's block transport.",
        &rows,
        &[
            "interface",
            "locality",
            "op",
            "latency_us_mean",
            "table_5_1.os_entry_exit_block_io_us",
            "table_5_1.file_system_us",
            "table_5_1.block_transport_us",
            "table_5_1.paper_block_transport_us",
            "table_5_1.media_us",
        ],
        bars,
    )
}

fn bandwidth(a: BandwidthArgs) -> Result<(), String> {
    let setup = a.common.setup(20_000)?;
    let (interfaces, t) = a.scope.parse()?;
    let mixes = parse_mixes(&a.op)?;
    let sizes = moneta_model::units::parse_size_list("--sizes", &a.sizes)?;
    for &s in &sizes {
        positive_size(s)?;
    }
    let mut meter = Meter::new();
    let progress: Progress = &mut |d, n, w| meter.tick(d, n, w);
    let rows = experiments::bandwidth(
        &setup,
        &interfaces,
        t,
        a.mirroring,
        &mixes,
        &sizes,
        progress,
    )?;
    let series = bandwidth_series(&rows, |r| format!("{} {}", r.interface.key(), r.op));
    let chart = Chart {
        title: format!(
            "per-host bandwidth, {} {} nodes",
            a.scope.topology, a.scope.nodes
        ),
        x_label: "request size (bytes)".into(),
        y_label: "MB/s per host".into(),
        x_log2: true,
        x_log10: false,
        y_log10: true,
        series,
    };
    emit(
        &a.common,
        &format!(
            "QuickSAN bandwidth, {} {} nodes, {} threads per host{}",
            a.scope.topology,
            a.scope.nodes,
            setup.threads_per_host,
            if a.mirroring { ", mirrored" } else { "" }
        ),
        "Mean per-host MB/s (10^6 B/s) of random requests over the global space (§5.4.3).",
        &rows,
        &[
            "interface",
            "op",
            "size_bytes",
            "mb_per_s_per_host",
            "latency_us_mean",
            "target_wait_us_mean",
        ],
        Figure::Chart(chart),
    )
}

fn scaling(a: ScalingArgs) -> Result<(), String> {
    let setup = a.common.setup(20_000)?;
    let interface = Interface::parse(&a.interface)?;
    let nodes: Vec<u16> = parse_numbers("--nodes", &a.nodes)?;
    if let Some(0) = nodes.iter().copied().find(|&n| n == 0) {
        return Err("--nodes: every node count must be at least 1".into());
    }
    let mix = match parse_mixes(&a.op)?.as_slice() {
        [m] => *m,
        _ => return Err("--op: one operation (read, write or mixed)".into()),
    };
    let mut meter = Meter::new();
    let progress: Progress = &mut |d, n, w| meter.tick(d, n, w);
    let rows = experiments::scaling(
        &setup,
        interface,
        &nodes,
        mix,
        positive_size(a.size)?,
        progress,
    )?;
    let line = |name: &str, f: &dyn Fn(&experiments::ScalingRow) -> f64| Series {
        name: name.into(),
        points: rows.iter().map(|r| (r.nodes as f64, f(r))).collect(),
    };
    let chart = Chart {
        title: format!("aggregate bandwidth, {} {} B {}", a.interface, a.size, a.op),
        x_label: "nodes".into(),
        y_label: "MB/s".into(),
        x_log2: false,
        x_log10: false,
        y_log10: false,
        series: vec![
            line("total", &|r| r.total_mb_per_s),
            line("network", &|r| r.network_mb_per_s),
            line("local", &|r| r.local_mb_per_s),
        ],
    };
    emit(
        &a.common,
        &format!("QuickSAN scaling, {} {} B {}", a.interface, a.size, a.op),
        "Aggregate MB/s, 16 GB per node, per-node load constant (§5.4.4).",
        &rows,
        &[
            "nodes",
            "local_mb_per_s",
            "network_mb_per_s",
            "total_mb_per_s",
        ],
        Figure::Chart(chart),
    )
}

fn replication(a: ReplicationArgs) -> Result<(), String> {
    let setup = a.common.setup(20_000)?;
    let interfaces = Interface::parse_list(&a.interfaces)?;
    let mixes = parse_mixes(&a.op)?;
    let mut meter = Meter::new();
    let progress: Progress = &mut |d, n, w| meter.tick(d, n, w);
    let rows = experiments::replication(
        &setup,
        &interfaces,
        a.nodes,
        &mixes,
        positive_size(a.size)?,
        progress,
    )?;
    let bars = bars(
        "per-host bandwidth with and without mirroring".into(),
        "MB/s per host",
        rows.iter()
            .map(|r| {
                (
                    format!(
                        "{} {} {}",
                        r.interface.key(),
                        r.op,
                        if r.mirroring { "mirrored" } else { "single" }
                    ),
                    vec![("bandwidth".to_string(), r.mb_per_s_per_host)],
                )
            })
            .collect(),
    );
    emit(
        &a.common,
        &format!(
            "QuickSAN replication, distributed {} nodes, {} B",
            a.nodes, a.size
        ),
        "One-thread latency and loaded per-host bandwidth, mirroring off and on (§5.4.5).",
        &rows,
        &[
            "interface",
            "op",
            "mirroring",
            "latency_us_mean",
            "mb_per_s_per_host",
        ],
        bars,
    )
}

/// This machine's clock, from /proc/cpuinfo.
fn here_mhz() -> Result<f64, String> {
    let text = std::fs::read_to_string("/proc/cpuinfo")
        .map_err(|e| format!("/proc/cpuinfo: {e} (give --here-mhz)"))?;
    text.lines()
        .find(|l| l.starts_with("cpu MHz"))
        .and_then(|l| l.split(':').nth(1))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "no 'cpu MHz' in /proc/cpuinfo (give --here-mhz)".into())
}

/// Time the sort's kernels on `records` generated records, here, scaled
/// to the paper's host.
fn measure_cpu(records: usize, nodes: usize, mhz: f64, seed: u64) -> Result<CpuCosts, String> {
    if records < 1000 {
        return Err("--measure-records must be at least 1000".into());
    }
    let data = sort::generate_records(records, seed);
    let started = Instant::now();
    let mut parts = sort::partition(&data, nodes);
    let partition_ns = started.elapsed().as_nanos() as f64 / records as f64;
    let started = Instant::now();
    for p in &mut parts {
        sort::sort_records(p);
    }
    let sort_ns = started.elapsed().as_nanos() as f64 / records as f64;
    // Keep the work observable so it cannot be optimized away.
    let check: usize = parts.iter().map(|p| p.len()).sum();
    if check != records {
        return Err("the partition lost records".into());
    }
    Ok(CpuCosts {
        partition_ns_per_record: sort::scale_to_paper_host(partition_ns, mhz),
        sort_ns_per_record: sort::scale_to_paper_host(sort_ns, mhz),
        cores: 8,
        source: format!(
            "measured here on {records} records ({partition_ns:.1} ns partition, {sort_ns:.1} ns sort per record at {mhz:.0} MHz), scaled by clock to 2270 MHz"
        ),
    })
}

fn sort_command(a: SortArgs) -> Result<(), String> {
    let setup = a.common.setup(1)?;
    let interfaces = Interface::parse_list(&a.interfaces)?;
    let topologies: Vec<Topology> = a
        .topology
        .split(',')
        .map(|t| parse_topology(t.trim(), a.nodes))
        .collect::<Result<_, _>>()?;
    if !(a.scale > 0.0 && a.scale <= 1.0) {
        return Err(format!("--scale {} must be within (0, 1]", a.scale));
    }
    let cpu = match (a.partition_ns, a.sort_ns) {
        (Some(p), Some(s)) if p >= 0.0 && s >= 0.0 => CpuCosts {
            partition_ns_per_record: p,
            sort_ns_per_record: s,
            cores: 8,
            source: "given (--partition-ns, --sort-ns)".into(),
        },
        (Some(_), Some(_)) => return Err("--partition-ns and --sort-ns must be ≥ 0".into()),
        _ => {
            let mhz = match a.here_mhz {
                Some(m) if m > 0.0 => m,
                Some(m) => return Err(format!("--here-mhz {m} must be positive")),
                None => here_mhz()?,
            };
            let c = measure_cpu(a.measure_records, a.nodes as usize, mhz, a.common.seed)?;
            eprintln!("sort CPU: {}", c.source);
            c
        }
    };
    let input_bytes = (sort::PAPER_INPUT_BYTES as f64 * a.scale) as u64;
    #[derive(Serialize)]
    struct Row {
        topology: &'static str,
        #[serde(flatten)]
        result: sort::SortResult,
        /// iSCSI's time over this one's, same topology.
        speedup_vs_iscsi: Option<f64>,
        cpu_source: String,
        partition_ns_per_record: f64,
        sort_ns_per_record: f64,
    }
    let mut points = Vec::new();
    for &t in &topologies {
        for &i in &interfaces {
            points.push((t, i));
        }
    }
    let mut meter = Meter::new();
    let mut rows: Vec<Row> = Vec::new();
    for (k, &(t, interface)) in points.iter().enumerate() {
        meter.tick(
            k,
            points.len(),
            &format!("{} {}", experiments::topology_key(t), interface.key()),
        );
        let result = sort::run(&SortSetup {
            san: SanConfig {
                device: setup.device.clone(),
                topology: t,
                mirroring: false,
            },
            costs: setup.costs.clone(),
            interface,
            input_bytes,
            io_bytes: a.io_bytes,
            threads_per_host: setup.threads_per_host,
            cpu: cpu.clone(),
            seed: setup.seed,
        })?;
        rows.push(Row {
            topology: experiments::topology_key(t),
            result,
            speedup_vs_iscsi: None,
            cpu_source: cpu.source.clone(),
            partition_ns_per_record: cpu.partition_ns_per_record,
            sort_ns_per_record: cpu.sort_ns_per_record,
        });
    }
    meter.tick(points.len(), points.len(), "done");
    let iscsi: Vec<(&'static str, f64)> = rows
        .iter()
        .filter(|r| r.result.interface == Interface::Iscsi)
        .map(|r| (r.topology, r.result.total_s))
        .collect();
    for r in &mut rows {
        r.speedup_vs_iscsi = iscsi
            .iter()
            .find(|(t, _)| *t == r.topology)
            .map(|(_, s)| s / r.result.total_s);
    }
    let bars = bars(
        format!("sort of {:.1} GB", input_bytes as f64 / 1e9),
        "seconds",
        rows.iter()
            .map(|r| {
                (
                    format!("{} {}", r.topology, r.result.interface.key()),
                    vec![
                        ("stage 1: partition".to_string(), r.result.stage1.seconds),
                        ("stage 2: sort".to_string(), r.result.stage2.seconds),
                    ],
                )
            })
            .collect(),
    );
    emit(
        &a.common,
        &format!(
            "Distributed sort, {:.1} GB, {} nodes, {} B IO",
            input_bytes as f64 / 1e9,
            a.nodes,
            a.io_bytes
        ),
        &format!(
            "Two stages (§5.4.6); each stage the longer of its IO and its CPU work. CPU: {}.",
            cpu.source
        ),
        &rows,
        &[
            "topology",
            "interface",
            "stage1.io_s",
            "stage1.cpu_s",
            "stage2.io_s",
            "stage2.cpu_s",
            "total_s",
            "speedup_vs_iscsi",
        ],
        bars,
    )
}

fn energy(a: EnergyArgs) -> Result<(), String> {
    let setup = a.common.setup(20_000)?;
    let (interfaces, t) = a.scope.parse()?;
    let mixes = parse_mixes(&a.op)?;
    let power = match (a.host_idle_w, a.host_busy_w) {
        (None, None) => HostPower::of_costs(&setup.costs)?,
        (idle, busy) => {
            let line = HostPower::default();
            let (idle_w, busy_w) = (idle.unwrap_or(line.idle_w), busy.unwrap_or(line.busy_w));
            if !(idle_w >= 0.0 && busy_w >= idle_w) {
                return Err("host power: need 0 ≤ --host-idle-w ≤ --host-busy-w".into());
            }
            HostPower {
                idle_w,
                busy_w,
                ..line
            }
        }
    };
    let mut meter = Meter::new();
    let progress: Progress = &mut |d, n, w| meter.tick(d, n, w);
    let rows = energy::energy(
        &setup,
        &interfaces,
        t,
        &mixes,
        positive_size(a.size)?,
        &power,
        progress,
    )?;
    let bars = bars(
        format!("energy per {} B request", a.size),
        "J per request",
        rows.iter()
            .map(|r| {
                (
                    format!("{} {}", r.interface.key(), r.op),
                    vec![
                        ("hosts".to_string(), r.energy.host_joules_per_op),
                        ("SSDs".to_string(), r.energy.ssd_joules_per_op),
                        ("switch".to_string(), r.energy.switch_joules_per_op),
                    ],
                )
            })
            .collect(),
    );
    emit(
        &a.common,
        &format!(
            "Energy per {} B request, {} {} nodes (hosts {}–{} W)",
            a.size, a.scope.topology, a.scope.nodes, power.idle_w, power.busy_w
        ),
        "SSD 24 W and switch 150 W are the paper's (§5.4.7); host power is linear in core utilization (Fan et al., ISCA 2007), idle at half of busy (Barroso and Hölzle, 2007), busy − idle = two E5520s' 80 W TDP (Intel ARK).",
        &rows,
        &[
            "interface",
            "op",
            "iops",
            "joules_per_op",
            "host_joules_per_op",
            "host_cpu_utilization",
        ],
        bars,
    )
}

/// Per-host bandwidth against request size, one series per `name` of a row.
pub(crate) fn bandwidth_series(
    rows: &[moneta_model::san::experiments::BandwidthRow],
    name: impl Fn(&moneta_model::san::experiments::BandwidthRow) -> String,
) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for r in rows {
        let n = name(r);
        let point = (r.size_bytes as f64, r.mb_per_s_per_host);
        match series.iter_mut().find(|s| s.name == n) {
            Some(s) => s.points.push(point),
            None => series.push(Series {
                name: n,
                points: vec![point],
            }),
        }
    }
    series
}

#[cfg(test)]
mod tests {
    use super::*;
    use moneta_model::san::experiments::mix_key;

    #[test]
    fn bad_lists_are_errors_naming_the_allowed_values() {
        assert!(parse_topology("ring", 4)
            .unwrap_err()
            .contains("distributed"));
        assert!(parse_topology("distributed", 0).is_err());
        assert!(parse_mixes("read,erase").unwrap_err().contains("mixed"));
        assert!(parse_numbers::<u64>("--sizes", "512,x").is_err());
        assert_eq!(mix_key(parse_mixes("mixed").unwrap()[0]), "mixed");
    }
}
