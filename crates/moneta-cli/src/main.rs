//! `moneta`: the command-line face of the model.
//!
//! - `moneta presets` lists the presets (and with `--verbose` their TOML);
//!   `moneta config dump` prints one, every key, to start a `--config` file.
//!   Every command that models a device takes `--preset` or `--config`.
//! - `moneta sim run` simulates one point; `moneta sim sweep` a grid of
//!   operations × request sizes, with sharding, progress, and SVG/HTML plots.
//! - `moneta sim fairness` runs SPEC §2.2's mixed-size workload.
//! - `moneta sim run --breakdown` shows where time goes (SPEC §2.1 Table 3.1);
//!   `moneta sim compare` puts several presets or stacks side by side.
//! - `moneta san sim latency|bandwidth|scaling|replication|sort|energy`:
//!   the QuickSAN experiments of §5.4 (SPEC §4.4) on the SAN model.
//! - `moneta sim speed` measures simulated requests per wall-clock second.
//! - `moneta serve` runs monetad; `moneta bench` runs XDD on the emulator.
//! - `moneta up`, `down`, `status`: the Moneta file system (an image, XFS or
//!   ext4 on a loop device, monetad on the same image).

mod docs;
mod emu;
mod error;
mod fio_sweep;
mod mount;
mod nvmm;
mod output;
mod plot;
mod provenance;
mod report;
mod run_report;
mod san;
mod san_bench;
mod san_chaos;
mod san_sort;
mod san_up;
mod sort_worker;
mod vm;

use clap::{Args, CommandFactory, Parser, Subcommand};
use error::{Error, Result};
use moneta_model::config::{preset_names, preset_source, Config, Stack, TECHNOLOGIES};
use moneta_model::experiment::{rate, run};
use moneta_model::summary::{default_region_bytes, workload_point};
use moneta_model::workload::{OpMix, RunLimit, Workload};
use output::Format;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

#[derive(Parser)]
#[command(
    name = "moneta",
    version,
    about = "Moneta in software: simulate and emulate the Moneta storage array family"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    figure: plot::FigureArgs,
}

#[derive(Subcommand)]
enum Command {
    /// List presets and technologies.
    Presets {
        /// Print each preset's full TOML (every key, with its source).
        #[arg(long)]
        verbose: bool,
    },
    /// Simulate in virtual time.
    #[command(subcommand)]
    Sim(Box<Sim>),
    /// Run monetad: the emulated device behind a Unix socket.
    Serve(Box<emu::ServeArgs>),
    /// A real guest kernel (QEMU) on the emulated device.
    #[command(subcommand)]
    Vm(Box<vm::Vm>),
    /// Several devices in one monetad, turned by shared reactor threads
    /// (`moneta san up` runs a SAN's nodes so).
    ServeGroup(emu::ServeGroupArgs),
    /// XDD on the emulator (real time, real bytes) through libmoneta.
    Bench(Box<emu::BenchArgs>),
    /// Bring up the Moneta file system: a device image, XFS or ext4 on a
    /// loop device over it, mounted, and monetad serving the same image.
    Up(Box<mount::UpArgs>),
    /// Stop what `up` started (the image and its files are kept).
    Down(mount::DownArgs),
    /// Every instance under /run/moneta and whether each piece is alive.
    Status(mount::StatusArgs),
    /// Run a program with its files on the Moneta mount going straight to
    /// the device (LD_PRELOAD libmoneta_preload.so).
    Run(emu::RunArgs),
    /// A running monetad's device counters (channels, requests, errors,
    /// protection lookups, timing precision) as JSON; with --run or
    /// --channel also one client's (`client`).
    Stats(emu::StatsArgs),
    /// fio through the Moneta ioengine at a sweep of queue depths, against the simulator's direct stack, with the verdict
    FioSweep(fio_sweep::FioSweepArgs),
    /// Configuration files: print one to start from.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// QuickSAN (SPEC §4): the SAN of Moneta SSDs with network ports.
    #[command(subcommand)]
    San(Box<san::SanCommand>),
    /// NVMM (SPEC §7): journaled flash main memory behind a DRAM cache.
    #[command(subcommand)]
    Nvmm(Box<nvmm::NvmmCommand>),
    /// One HTML page per system (Moneta, Moneta-D, Onyx, QuickSAN, NVMM):
    /// the papers' experiments, the published points beside them, the commands.
    Report(report::ReportArgs),
    /// Compare the model with the published numbers (SPEC §1.9–§7).
    Calibrate {
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
    },
    /// Write the documentation's reference pages (every command, every
    /// configuration key, the C ABI) from the code; --check fails if stale.
    Docs(docs::DocsArgs),
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print a configuration as TOML with every key (a preset, or a file,
    /// with --stack/--tech/--set applied): a --config file to start from.
    Dump(DeviceArgs),
}

#[derive(Subcommand)]
enum Sim {
    /// One point: bandwidth, IOPS, latency, power.
    Run(RunArgs),
    /// A grid of operations × request sizes.
    Sweep(SweepArgs),
    /// SPEC §2.2 fairness: small-request threads beside large-request threads.
    Fairness(FairnessArgs),
    /// Where time goes for several presets and/or stacks on one workload:
    /// a table and stacked bars (SPEC §2.1 Table 3.1).
    Compare(CompareArgs),
    /// Simulator speed: simulated requests per wall-clock second.
    Speed(SpeedArgs),
}

/// Which device to model: a preset or a configuration file, then overrides.
#[derive(Args, Clone)]
pub(crate) struct DeviceArgs {
    /// Preset (see `moneta presets`) [default: moneta; for `moneta san`: quicksan-ssd].
    #[arg(long)]
    pub(crate) preset: Option<String>,
    /// Configuration file in the presets' TOML schema: every key, or
    /// `inherits = "PRESET"` and the keys that differ (`moneta config dump`
    /// prints a preset to start from). Instead of --preset.
    #[arg(long, value_name = "FILE.toml", conflicts_with = "preset")]
    config: Option<PathBuf>,
    /// Host stack: base, nosched, atomic, spin, 2q, balance, direct, ramdisk, raw.
    #[arg(long)]
    pub(crate) stack: Option<String>,
    /// Memory technology (sets memory.latency_ns_read/write).
    #[arg(long)]
    tech: Option<String>,
    /// Override any key, e.g. --set memory.controllers=4 (repeatable;
    /// applied after --config, --stack and --tech).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

impl DeviceArgs {
    /// Whether any option describing the device was given.
    pub(crate) fn given(&self) -> bool {
        self.preset.is_some()
            || self.config.is_some()
            || self.stack.is_some()
            || self.tech.is_some()
            || !self.set.is_empty()
    }

    /// Whether a configuration file was given (instead of a preset).
    pub(crate) fn given_file(&self) -> bool {
        self.config.is_some()
    }

    /// These options with one preset and one stack of their lists.
    fn with(&self, preset: &Option<String>, stack: &Option<String>) -> DeviceArgs {
        DeviceArgs {
            preset: preset.clone(),
            stack: stack.clone(),
            ..self.clone()
        }
    }

    pub(crate) fn config(&self) -> Result<Config> {
        let mut c = match &self.config {
            Some(path) => config_file(path)?,
            None => Config::preset(self.preset.as_deref().unwrap_or("moneta"))
                .map_err(|e| Error::config("", e))?,
        };
        if let Some(t) = &self.tech {
            c.set_technology(t).map_err(|e| Error::config("", e))?;
        }
        if let Some(s) = &self.stack {
            c.set_stack(Stack::parse(s).map_err(|e| Error::config("", e))?);
        }
        for kv in &self.set {
            c.set(kv)
                .map_err(|e| Error::config(format!("--set {kv}"), e))?;
        }
        Ok(c)
    }
}

/// Load `--config FILE`; errors name the file.
pub(crate) fn config_file(path: &std::path::Path) -> Result<Config> {
    Config::from_file(path).map_err(|e| Error::config(format!("--config {}", path.display()), e))
}

/// Which columns CSV output has.
#[derive(Args, Clone)]
struct ColumnArgs {
    /// CSV columns: comma-separated field names of the JSON output, a
    /// dotted field's prefix for all of it (breakdown_us, config.memory),
    /// or all (about 200) [default: what ran and the table's numbers].
    #[arg(long, value_name = "NAMES")]
    columns: Option<String>,
}

/// The device, the seed and the output format of a run.
#[derive(Args, Clone)]
pub(crate) struct ModelArgs {
    #[command(flatten)]
    pub(crate) device: DeviceArgs,
    /// Random seed: the same seed gives the same numbers.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Output format: a table, JSON, or CSV (every JSON field a column).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
}

#[derive(Args, Clone)]
pub(crate) struct LimitArgs {
    /// Requests to simulate (all threads together).
    #[arg(long, conflicts_with = "duration_ms")]
    ops: Option<u64>,
    /// Simulated time to run instead of a request count.
    #[arg(long)]
    duration_ms: Option<f64>,
}

impl LimitArgs {
    pub(crate) fn limit(&self, default_ops: u64) -> Result<RunLimit> {
        match (self.ops, self.duration_ms) {
            (Some(0), _) => Err(Error::usage("--ops must be positive")),
            (Some(n), _) => Ok(RunLimit::Ops(n)),
            (None, Some(ms)) if ms.is_finite() && ms > 0.0 => {
                Ok(RunLimit::DurationNs((ms * 1e6) as u64))
            }
            (None, Some(ms)) => Err(Error::usage(format!(
                "--duration-ms {ms} must be a positive number"
            ))),
            (None, None) => Ok(RunLimit::Ops(default_ops)),
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Pattern {
    Random,
    Sequential,
}

/// How each XDD thread chooses its requests.
#[derive(Args, Clone)]
struct PatternArgs {
    /// Fraction of reads when --op mixed.
    #[arg(long, default_value_t = 0.5)]
    read_fraction: f64,
    /// Random (size-aligned) or sequential offsets.
    #[arg(long, value_enum, default_value_t = Pattern::Random)]
    pattern: Pattern,
    /// Bytes of the device the threads touch [default: the whole device, at most 16 GiB].
    #[arg(long, value_parser = moneta_model::units::parse_size)]
    region_bytes: Option<u64>,
    /// Requests each thread keeps in flight: 1 is synchronous (XDD); up to
    /// 64 (a channel's tags) is Moneta-D's asynchronous IO, with --stack
    /// direct and DMA completion only. `sim sweep` takes a comma-separated
    /// list (1,8,32) and draws every depth on one chart.
    #[arg(long, visible_alias = "qd", default_value = "1", value_delimiter = ',')]
    queue_depth: Vec<u32>,
}

impl PatternArgs {
    /// The one queue depth of a command that runs one depth.
    fn depth(&self) -> Result<u32> {
        match self.queue_depth[..] {
            [d] => Ok(d),
            _ => Err(Error::usage(
                "--queue-depth takes one number here (lists are for `sim sweep`)",
            )),
        }
    }

    /// These arguments with queue depth `depth` alone.
    fn at_depth(&self, depth: u32) -> PatternArgs {
        PatternArgs {
            queue_depth: vec![depth],
            ..self.clone()
        }
    }

    fn workload(
        &self,
        config: &Config,
        op: &str,
        size: u64,
        threads: u32,
        limit: RunLimit,
        seed: u64,
    ) -> Result<Workload> {
        let mix = match parse_op(op)? {
            OpMix::Mixed(_) => OpMix::Mixed(self.read_fraction),
            other => other,
        };
        let region = self
            .region_bytes
            .unwrap_or_else(|| default_region_bytes(config));
        let mut w = Workload::xdd(mix, size, threads, region, limit, seed);
        w.groups[0].random = self.pattern == Pattern::Random;
        w.groups[0].queue_depth = self.depth()?;
        w.validate(config.device.capacity_bytes)?;
        Ok(w)
    }
}

#[derive(Args)]
struct RunArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    limit: LimitArgs,
    #[command(flatten)]
    pattern: PatternArgs,
    /// read, write or mixed (50/50).
    #[arg(long, default_value = "read")]
    op: String,
    /// Request size: bytes or with K/M/G, a multiple of 512 (4k).
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
    /// Closed-loop threads.
    #[arg(long, default_value_t = 16)]
    threads: u32,
    /// Also print where time goes: mean µs per component (Table 3.1 style).
    #[arg(long)]
    breakdown: bool,
    #[command(flatten)]
    csv: ColumnArgs,
}

#[derive(Args)]
struct CompareArgs {
    /// Presets and stacks are comma-separated lists here; every preset runs
    /// with every stack.
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    limit: LimitArgs,
    #[command(flatten)]
    pattern: PatternArgs,
    /// read, write or mixed (50/50).
    #[arg(long, default_value = "read")]
    op: String,
    /// Request size: bytes or with K/M/G, a multiple of 512 (4k).
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
    /// Closed-loop threads [default: 1, an unloaded request as in Table 3.1].
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Write the stacked bars as SVG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write an HTML report (bars, latency CDFs, the table).
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Args)]
struct SweepArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    limit: LimitArgs,
    #[command(flatten)]
    pattern: PatternArgs,
    /// Comma-separated operations.
    #[arg(long, default_value = "read,write,mixed")]
    op: String,
    /// Comma-separated request sizes: bytes, or with K/M/G (512,4k,1M).
    #[arg(
        long,
        default_value = "512,1024,2048,4096,8192,16384,32768,65536,131072,262144,524288,1048576"
    )]
    sizes: String,
    /// Closed-loop threads (XDD's 16 in every paper's sweep); a
    /// comma-separated list (1,16) draws every count on one chart, as
    /// lists of --preset, --stack and --queue-depth do.
    #[arg(long, default_value = "16", value_delimiter = ',')]
    threads: Vec<u32>,
    /// Run only points i, i+n, i+2n, … (0-based), for cluster job arrays.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    #[command(flatten)]
    csv: ColumnArgs,
    /// Write an SVG plot of bandwidth vs request size.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write an HTML report (plots and the table).
    #[arg(long)]
    report: Option<PathBuf>,
}

#[derive(Args)]
struct FairnessArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    limit: LimitArgs,
    /// Threads issuing small requests (SPEC §2.2: four 4 KB readers).
    #[arg(long, default_value_t = 4)]
    small_threads: u32,
    /// Size of the small requests (bytes, or with K/M/G).
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    small_size: u64,
    /// Threads issuing large requests (SPEC §2.2: four 512 KB readers).
    #[arg(long, default_value_t = 4)]
    large_threads: u32,
    /// Size of the large requests (bytes, or with K/M/G).
    #[arg(long, default_value_t = 524288, value_parser = moneta_model::units::parse_size)]
    large_size: u64,
}

#[derive(Args)]
struct SpeedArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 2_000_000)]
    ops: u64,
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
    #[arg(long, default_value_t = 16)]
    threads: u32,
    #[arg(long, default_value = "read")]
    op: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("moneta: {e}");
            // The kind's code (docs: reference/cli.md, "Exit status"): the
            // shell's 130 after an interrupt, with the partial results.
            ExitCode::from(e.exit_code())
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    plot::set_figure(cli.figure).map_err(Error::usage)?;
    if matches!(
        cli.command,
        Command::Presets { .. }
            | Command::Sim(_)
            | Command::San(_)
            | Command::Nvmm(_)
            | Command::Config(_)
            | Command::Calibrate { .. }
    ) {
        quiet_on_closed_stdout();
    }
    match cli.command {
        Command::Presets { verbose } => presets(verbose)?,
        Command::Sim(sim) => match *sim {
            Sim::Run(a) => sim_run(a)?,
            Sim::Sweep(a) => sim_sweep(a)?,
            Sim::Fairness(a) => sim_fairness(a)?,
            Sim::Compare(a) => sim_compare(a)?,
            Sim::Speed(a) => sim_speed(a)?,
        },
        Command::Serve(a) => emu::serve(*a)?,
        Command::Vm(v) => vm::vm(*v)?,
        Command::ServeGroup(a) => emu::serve_group(a)?,
        Command::Bench(a) => emu::run_bench(*a)?,
        Command::Stats(a) => emu::stats(a)?,
        Command::FioSweep(a) => fio_sweep::fio_sweep(a)?,
        Command::Up(a) => mount::up(*a)?,
        Command::Down(a) => mount::down(a)?,
        Command::Status(a) => mount::status(a)?,
        Command::Run(a) => emu::run_program(a)?,
        Command::Calibrate { format } => calibrate(format)?,
        Command::Docs(a) => docs::run(a, &Cli::command())?,
        Command::Report(a) => report::report(a)?,
        Command::San(c) => san::dispatch(*c)?,
        Command::Nvmm(c) => nvmm::dispatch(*c)?,
        Command::Config(ConfigCommand::Dump(a)) => config_dump(&a)?,
    }
    Ok(())
}

/// A closed stdout (`moneta sim sweep … | head -1`) ends the process
/// quietly, as it ends cat: the default action of SIGPIPE, which Rust's
/// runtime sets to "ignore" (so that `println!` would panic on EPIPE). Only
/// for commands that compute and print: the daemon and the clients of its
/// socket must see EPIPE on the socket as an error instead.
fn quiet_on_closed_stdout() {
    // SAFETY: restoring a signal's default action has no preconditions; no
    // handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Warn (stderr) when a request count leaves some requesters (threads,
/// or with a queue depth their in-flight slots) nothing to do.
pub(crate) fn warn_if_threads_exceed_ops(threads: u64, depth: u32, limit: RunLimit) {
    let slots = threads * u64::from(depth);
    if let RunLimit::Ops(ops @ 1..) = limit {
        if slots <= ops {
            return;
        }
        let who = match depth {
            1 => format!("{threads} threads"),
            _ => format!("{threads} threads × {depth} requests in flight"),
        };
        eprintln!(
            "moneta: warning: {who} for {ops} requests: {} of them issue none",
            slots - ops
        );
    }
}

fn config_dump(a: &DeviceArgs) -> Result<()> {
    let c = a.config()?;
    println!(
        "# Moneta configuration \"{}\": every key, as `moneta config dump` resolved it.\n\
         # Load it with `--config FILE`, or keep `inherits = \"PRESET\"` and only the\n\
         # keys you change. Units are in the key names; docs/src/guide/commands.md, \"Configuration files\".\n",
        c.name
    );
    print!("{}", c.to_toml());
    Ok(())
}

fn presets(verbose: bool) -> Result<()> {
    for name in preset_names() {
        let c = Config::preset(name).map_err(|e| Error::config(format!("preset {name}"), e))?;
        if verbose {
            println!("# ---- {name} ----");
            println!("{}", preset_source(name).unwrap_or_default());
        } else {
            println!(
                "{name:<15} {:<8} ctl={:<2} buf={:<2} {:<8} {:<8} {}",
                c.host.stack.name(),
                c.memory.controllers,
                c.device.transfer_buffers,
                format!("{:?}", c.device.queue_policy).to_lowercase(),
                c.memory.technology,
                c.description
            );
        }
    }
    println!("\ntechnologies (--tech):");
    for t in TECHNOLOGIES {
        println!(
            "  {:<15} read {:>8} ns  write {:>8} ns  ({})",
            t.name, t.latency_ns_read, t.latency_ns_write, t.source
        );
    }
    Ok(())
}

pub(crate) fn parse_op(s: &str) -> Result<OpMix> {
    Ok(OpMix::parse(s.trim())?)
}

fn sim_run(a: RunArgs) -> Result<()> {
    let config = a.model.device.config()?;
    let limit = a.limit.limit(200_000)?;
    warn_if_threads_exceed_ops(a.threads.into(), a.pattern.depth()?, limit);
    let w = a
        .pattern
        .workload(&config, &a.op, a.size, a.threads, limit, a.model.seed)?;
    let point = workload_point(&config, &w)?;
    let provenance = sim_provenance(a.model.seed, limit);
    output::print_points(
        std::slice::from_ref(&point),
        a.model.format,
        false,
        a.csv.columns.as_deref(),
        &provenance,
    )?;
    if a.breakdown && a.model.format == Format::Table {
        output::print_breakdown(&point);
    }
    Ok(())
}

/// `moneta sim compare`: the same workload on every (preset, stack) pair.
fn sim_compare(a: CompareArgs) -> Result<()> {
    plot::check_outputs(a.plot.as_deref(), a.report.as_deref())?;
    let limit = a.limit.limit(20_000)?;
    let mut points = Vec::new();
    let mut labels = Vec::new();
    let (presets, stacks) = (
        comma_list(&a.model.device.preset),
        comma_list(&a.model.device.stack),
    );
    for preset in &presets {
        for stack in &stacks {
            let config = a.model.device.with(preset, stack).config()?;
            let w = a
                .pattern
                .workload(&config, &a.op, a.size, a.threads, limit, a.model.seed)?;
            let label = match (presets.len() > 1, stacks.len() > 1) {
                (true, true) => format!("{}/{}", config.name, config.host.stack.name()),
                (true, false) => config.name.clone(),
                _ => config.host.stack.name().to_string(),
            };
            points.push(workload_point(&config, &w)?);
            labels.push(label);
        }
    }
    let provenance = sim_provenance(a.model.seed, limit);
    output::print_comparison(&points, &labels, a.model.format, &provenance)?;
    let report = output::compare_report(&points, &labels);
    if let Some(path) = &a.plot {
        let svg = output::compare_bars(&points, &labels).to_svg(900, 520);
        plot::write_file_from(path, &svg, &provenance).map_err(Error::because)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &a.report {
        plot::write_file_from(path, &report.to_html(), &provenance).map_err(Error::because)?;
        eprintln!("wrote {}", path.display());
    }
    Ok(())
}

/// A comma-separated list of `--preset` or `--stack` values: `[None]`
/// when the option was not given (the default).
fn comma_list(s: &Option<String>) -> Vec<Option<String>> {
    match s {
        None => vec![None],
        Some(s) => s.split(',').map(|x| Some(x.trim().to_string())).collect(),
    }
}

/// A simulation's provenance: its seed and, when the run is bounded by a
/// count, the requests per point.
fn sim_provenance(seed: u64, limit: RunLimit) -> provenance::Provenance {
    let p = provenance::Provenance::here().seed(seed);
    match limit {
        RunLimit::Ops(n) => p.requests_per_point(n),
        _ => p,
    }
}

/// `i/n` with i < n.
fn parse_shard(s: &str) -> Result<(usize, usize)> {
    let bad = || Error::usage(format!("--shard {s}: expected I/N with 0 <= I < N"));
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let i: usize = i.trim().parse().map_err(|_| bad())?;
    let n: usize = n.trim().parse().map_err(|_| bad())?;
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

fn sim_sweep(a: SweepArgs) -> Result<()> {
    plot::check_outputs(a.plot.as_deref(), a.report.as_deref())?;
    // Every (preset, stack) of the lists, each checked before any runs.
    let mut configs = Vec::new();
    for preset in &comma_list(&a.model.device.preset) {
        for stack in &comma_list(&a.model.device.stack) {
            configs.push(a.model.device.with(preset, stack).config()?);
        }
    }
    let ops: Vec<&str> = a.op.split(',').map(str::trim).collect();
    let sizes = moneta_model::units::parse_size_list("--sizes", &a.sizes)?;
    let (shard, shards) = a
        .shard
        .as_deref()
        .map(parse_shard)
        .transpose()?
        .unwrap_or((0, 1));
    let limit = a.limit.limit(100_000)?;
    for &threads in &a.threads {
        for &depth in &a.pattern.queue_depth {
            warn_if_threads_exceed_ops(threads.into(), depth, limit);
        }
    }
    // Build (and so validate) every workload before running any: one per
    // configuration × threads × depth × operation × size.
    let mut grid = Vec::new();
    for (c, config) in configs.iter().enumerate() {
        for &threads in &a.threads {
            for &depth in &a.pattern.queue_depth {
                let pattern = a.pattern.at_depth(depth);
                for op in &ops {
                    for &size in &sizes {
                        let w = pattern.workload(config, op, size, threads, limit, a.model.seed)?;
                        grid.push((c, w));
                    }
                }
            }
        }
    }
    let mine: Vec<(usize, Workload)> = grid
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % shards == shard)
        .map(|(_, w)| w)
        .collect();
    let progress = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut points = Vec::with_capacity(mine.len());
    moneta_supervisor::signals::catch_signals();
    for (k, (c, w)) in mine.iter().enumerate() {
        if moneta_supervisor::signals::signal_received() {
            break;
        }
        let (op, size) = (w.groups[0].op, w.groups[0].size_bytes);
        if progress {
            let which = if configs.len() > 1 {
                format!("{}/{} ", configs[*c].name, configs[*c].host.stack.name())
            } else {
                String::new()
            };
            eprint!(
                "\r[{}/{}] {which}{} {} B … {:.1} s   ",
                k + 1,
                mine.len(),
                op.name(),
                size,
                started.elapsed().as_secs_f64()
            );
        }
        points.push(workload_point(&configs[*c], w)?);
        if k == 0 {
            // A --columns typo fails after one point, not after the sweep.
            output::check_point_columns(a.csv.columns.as_deref(), &points[0])?;
        }
    }
    if progress {
        eprintln!(
            "\r{} points in {:.1} s{:20}",
            mine.len(),
            started.elapsed().as_secs_f64(),
            ""
        );
    }
    let partial = (points.len() < mine.len()).then_some((points.len(), mine.len()));
    let provenance = sim_provenance(a.model.seed, limit).partial(partial.is_some());
    output::print_points(
        &points,
        a.model.format,
        true,
        a.csv.columns.as_deref(),
        &provenance,
    )?;
    if let Some(path) = &a.plot {
        let mut chart = output::bandwidth_chart(&configs, &points);
        output::mark_partial(&mut chart.title, partial);
        plot::write_file_from(path, &chart.to_svg(900, 480), &provenance)
            .map_err(Error::because)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &a.report {
        let mut report = output::sweep_report(&configs, &points);
        output::mark_partial(&mut report.title, partial);
        plot::write_file_from(path, &report.to_html(), &provenance).map_err(Error::because)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some((done, all)) = partial {
        return Err(Error::interrupted(format!(
            "interrupted: {done} of {all} points done, printed above"
        )));
    }
    Ok(())
}

fn sim_fairness(a: FairnessArgs) -> Result<()> {
    let config = a.model.device.config()?;
    let limit = a.limit.limit(100_000)?;
    warn_if_threads_exceed_ops(
        u64::from(a.small_threads) + u64::from(a.large_threads),
        1,
        limit,
    );
    let w = Workload::fairness(
        a.small_threads,
        a.small_size,
        a.large_threads,
        a.large_size,
        default_region_bytes(&config),
        limit,
        a.model.seed,
    );
    let r = run(&config, &w)?;
    let rows: Vec<serde_json::Value> = r
        .groups
        .iter()
        .map(|g| {
            serde_json::json!({
                "group": g.name, "threads": g.threads, "size_bytes": g.size_bytes, "ops": g.ops,
                "bandwidth_mb_per_s": rate(g.bytes, r.elapsed_ns) / 1e6,
                "latency_us_mean": g.latency.mean_ns() / 1e3,
                "latency_us_p50": g.latency.percentile_ns(0.5) / 1e3,
                "latency_us_p99": g.latency.percentile_ns(0.99) / 1e3,
                "latency_us_p99_9": g.latency.percentile_ns(0.999) / 1e3,
                "latency_us_max": g.latency.max_ns() as f64 / 1e3,
                "breakdown_us": g.breakdown,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "preset": config.name, "stack": config.host.stack.name(), "seed": a.model.seed,
        "aggregate_mb_per_s": r.bandwidth_mb_per_s(), "groups": rows,
    });
    let provenance = sim_provenance(a.model.seed, limit);
    match a.model.format {
        Format::Json => output::print_result_json(&doc, &provenance)?,
        Format::Csv => output::print_result_csv(&[doc], &provenance)?,
        Format::Table => {
            println!(
                "{} / {}  seed {}  aggregate {:.1} MB/s",
                config.name,
                config.host.stack.name(),
                a.model.seed,
                r.bandwidth_mb_per_s()
            );
            for g in &r.groups {
                println!(
                    "  {:<6} {:>2} threads × {:>7} B: {:>9.1} MB/s  mean {:>9.1} µs  p99.9 {:>9.1} µs  max {:>9.1} µs",
                    g.name,
                    g.threads,
                    g.size_bytes,
                    rate(g.bytes, r.elapsed_ns) / 1e6,
                    g.latency.mean_ns() / 1e3,
                    g.latency.percentile_ns(0.999) / 1e3,
                    g.latency.max_ns() as f64 / 1e3
                );
            }
        }
    }
    Ok(())
}

fn sim_speed(a: SpeedArgs) -> Result<()> {
    let config = a.model.device.config()?;
    let op = parse_op(&a.op)?;
    warn_if_threads_exceed_ops(a.threads.into(), 1, RunLimit::Ops(a.ops));
    let w = Workload::xdd(
        op,
        a.size,
        a.threads,
        default_region_bytes(&config),
        RunLimit::Ops(a.ops),
        a.model.seed,
    );
    let started = Instant::now();
    let r = run(&config, &w)?;
    let wall_s = started.elapsed().as_secs_f64();
    let per_s = r.ops as f64 / wall_s;
    let doc = serde_json::json!({
        "preset": config.name, "stack": config.host.stack.name(), "op": op.name(), "size_bytes": a.size,
        "threads": a.threads, "simulated_requests": r.ops, "events": r.events, "wall_s": wall_s,
        "simulated_requests_per_s": per_s, "events_per_s": r.events as f64 / wall_s,
    });
    let provenance = sim_provenance(a.model.seed, RunLimit::Ops(a.ops));
    match a.model.format {
        Format::Json => output::print_result_json(&doc, &provenance)?,
        Format::Csv => output::print_result_csv(&[doc], &provenance)?,
        Format::Table => println!(
            "{} simulated {} B {} requests in {:.3} s wall: {:.2} M requests/s ({:.1} M events/s)",
            r.ops,
            a.size,
            op.name(),
            wall_s,
            per_s / 1e6,
            r.events as f64 / wall_s / 1e6
        ),
    }
    Ok(())
}

fn calibrate(format: Format) -> Result<()> {
    moneta_supervisor::signals::catch_signals();
    let groups = moneta_model::calibration::groups();
    let finished = run_check_groups(&groups);
    let done = finished.iter().filter(|g| g.is_some()).count();
    if std::io::stderr().is_terminal() {
        eprint!("\r{:60}\r", "");
    }
    // README order whatever order the groups finished in.
    let checks: Vec<_> = finished.into_iter().flatten().flatten().collect();
    let provenance = provenance::Provenance::here().partial(done < groups.len());
    match format {
        Format::Json => output::print_result_json(&checks, &provenance)?,
        Format::Csv => output::print_result_csv(&checks, &provenance)?,
        Format::Table => print!("{}", moneta_model::calibration::markdown(&checks)),
    }
    let missed = checks.iter().filter(|c| !c.within()).count();
    eprintln!(
        "{} checks, {} within tolerance, {} missed",
        checks.len(),
        checks.len() - missed,
        missed
    );
    if done < groups.len() {
        return Err(Error::interrupted(format!(
            "interrupted: {done} of {} groups of checks done, printed above",
            groups.len()
        )));
    }
    Ok(())
}

/// Runs the calibration's groups of checks on one worker per core (each
/// group is independent: its own presets, seeds and virtual clocks, so the
/// checks are the same whichever worker runs it and in whatever order).
/// Workers take the groups in order; after a signal no group is started.
/// Returns each group's checks in the groups' order, `None` for a group not
/// run.
fn run_check_groups(
    groups: &[(&'static str, moneta_model::calibration::CheckGroup)],
) -> Vec<Option<Vec<moneta_model::check::Check>>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(groups.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let finished: Mutex<Vec<Option<Vec<_>>>> =
        Mutex::new((0..groups.len()).map(|_| None).collect());
    let terminal = std::io::stderr().is_terminal();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                if moneta_supervisor::signals::signal_received() {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((what, run)) = groups.get(i) else {
                    break;
                };
                let checks = run();
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if terminal {
                    eprint!("\r[{n}/{}] {what} done{:20}", groups.len(), "");
                }
                finished.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(checks);
            });
        }
    });
    finished.into_inner().unwrap_or_else(|e| e.into_inner())
}
