//! `moneta san sort`: the distributed external sort of SPEC §4.4
//! (dissertation §5.4.6) run for real on an emulated SAN, next to the
//! simulator's prediction for the same input and node count.
//!
//! The orchestrator lays the global space out ([`Layout`]), writes a plan,
//! starts one worker per host (`moneta san sort-worker`, inside the host's
//! network namespace on a `moneta san up` SAN), waits for them within a
//! time limit (killing the rest when one fails), then starts a verifying
//! worker per host that reads the output back. It checks what valsort
//! checks: every host's output in key order, the hosts' outputs in order
//! after one another (each host holds one key range), the record count, and
//! the sum of CRC32C per record equal to the input's (computed here from
//! the generator, independently of the storage).
//!
//! Two ways to run:
//! - `--name NAME`: a SAN from `moneta san up`; worker i in namespace
//!   `moneta-NAME-n<i>`, on its own daemon (direct) or on every node's NBD
//!   server (`san up --nbd-port`). Direct needs the daemons' QuickSAN ports
//!   wired to the network (issue 12): until then a daemon addresses only its
//!   own SSD and the run stops with a clear error before it starts.
//! - `--socket PATH --nodes N`: N workers on one daemon whose device is
//!   the global space, cut into N slices (`--nbd HOST:PORT` for that
//!   daemon's NBD server). The same worker code; only the access differs.
//!
//! The prediction is `moneta_model::san::sort::run` with the same records,
//! nodes and request size, QuickSAN-D for direct and iSCSI for NBD, one
//! requester per host (the worker issues one request at a time) and the
//! CPU costs the workers measured on this machine, unscaled.

use crate::san_up::{load_state, NBD_EXPORT};
use crate::sort_worker::{
    record_checksum, Access, Layout, NbdTarget, OutputSummary, Plan, WorkerReport,
    REMOTE_NOT_SERVED,
};
use clap::{Args, ValueEnum};
use moneta::{CompletionMode, Moneta};
use moneta_emu::san_file::{SanFile, SanTopology};
use moneta_model::config::Config;
use moneta_model::san::experiments::topology;
use moneta_model::san::interfaces::Interface;
use moneta_model::san::sort::{self, CpuCosts, SortResult, SortSetup, RECORD_BYTES};
use moneta_model::san::system::SanConfig;
use serde::Serialize;
use std::io::{BufRead, BufReader, IsTerminal, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Via {
    /// libmoneta on each host's daemon, global addresses (QuickSAN-D).
    Direct,
    /// NBD over TCP to each slice owner's server (the iSCSI-like path).
    Nbd,
    Both,
}

#[derive(Args)]
pub struct SortRunArgs {
    /// The SAN (`moneta san up --name`): one worker per node, in its namespace.
    #[arg(long, conflicts_with_all = ["socket", "nodes", "nbd"], required_unless_present = "socket")]
    name: Option<String>,
    /// One daemon's socket: all workers on it, its device cut into --nodes slices.
    #[arg(long, requires = "nodes")]
    socket: Option<PathBuf>,
    /// Workers (hosts) on the one daemon of --socket.
    #[arg(long)]
    nodes: Option<u16>,
    /// That daemon's NBD server, [tcp://]HOST:PORT[/EXPORT] (export default "moneta").
    #[arg(long, requires = "socket")]
    nbd: Option<String>,
    /// Records of 100 B to sort (all hosts together).
    #[arg(long)]
    records: u64,
    #[arg(long, value_enum, default_value_t = Via::Direct)]
    via: Via,
    /// Size of each read and of each destination's write buffer.
    #[arg(long, default_value_t = 262_144, value_parser = moneta_model::units::parse_size)]
    io_bytes: u64,
    /// The data set: the same seed gives the same records.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Limit for each run (workers are killed after it), and for each barrier.
    #[arg(long, default_value_t = 600)]
    timeout_s: u64,
    /// How the direct path waits for completions: issue-sleep (kind to a
    /// loaded machine), dma or forwarding (SPEC §3.5).
    #[arg(long, default_value = "issue-sleep")]
    completion: String,
    /// The device preset of the simulator's prediction.
    #[arg(long, default_value = crate::san_up::DEVICE_PRESET)]
    preset: String,
    /// JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Tests of the checker: damage node 0's output before it is verified
    /// (swap or duplicate).
    #[arg(long, hide = true)]
    corrupt: Option<String>,
}

/// Where the workers run and how each reaches the storage.
struct Hosts {
    describe: String,
    nodes: u16,
    slice_bytes: u64,
    /// Worker i's namespace (None: this one).
    netns: Vec<Option<String>>,
    direct: Option<Vec<PathBuf>>,
    /// Slice j's NBD server, export and base in it (the same for every worker).
    nbd: Option<Vec<NbdTarget>>,
}

fn san_hosts(name: &str) -> Result<Hosts, String> {
    let state = load_state(name)?;
    let file = SanFile::load(&state.san_file).map_err(|e| e.to_string())?;
    if file.topology != SanTopology::Distributed {
        return Err(format!(
            "SAN '{name}' is centralized: the sort runs on a distributed SAN (one SSD per host)"
        ));
    }
    let map = file.address_map().map_err(|e| e.to_string())?;
    let nodes = state.nodes.len() as u16;
    if map.capacity_bytes() != nodes as u64 * map.slice_bytes() {
        return Err(format!(
            "SAN '{name}': {nodes} nodes but {} slices",
            map.capacity_bytes() / map.slice_bytes()
        ));
    }
    let nbd = state
        .nodes
        .iter()
        .map(|n| {
            n.nbd.as_ref().map(|addr| NbdTarget {
                addr: addr.clone(),
                export: NBD_EXPORT.into(),
                base: 0,
            })
        })
        .collect::<Option<Vec<_>>>();
    Ok(Hosts {
        describe: format!(
            "SAN '{name}' ({nodes} hosts{}, slices of {})",
            if file.mirror { ", mirrored" } else { "" },
            crate::mount::human(map.slice_bytes())
        ),
        nodes,
        slice_bytes: map.slice_bytes(),
        netns: state.nodes.iter().map(|n| Some(n.netns.clone())).collect(),
        direct: Some(state.nodes.iter().map(|n| n.socket.clone()).collect()),
        nbd,
    })
}

fn one_daemon_hosts(socket: &Path, nodes: u16, nbd: Option<&str>) -> Result<Hosts, String> {
    let m = Moneta::connect(socket)
        .map_err(|e| format!("no daemon at {}: {e} (moneta serve)", socket.display()))?;
    let capacity = m.capacity_bytes();
    drop(m);
    if nodes == 0 {
        return Err("--nodes must be at least 1".into());
    }
    let slice_bytes = capacity / nodes as u64 / 4096 * 4096;
    let nbd = nbd
        .map(|spec| {
            let spec = spec.strip_prefix("tcp://").unwrap_or(spec);
            let (addr, export) = spec.split_once('/').unwrap_or((spec, "moneta"));
            if !addr.contains(':') {
                return Err(format!("--nbd {spec}: expected HOST:PORT[/EXPORT]"));
            }
            Ok((0..nodes)
                .map(|j| NbdTarget {
                    addr: addr.to_string(),
                    export: export.to_string(),
                    base: j as u64 * slice_bytes,
                })
                .collect())
        })
        .transpose()?;
    Ok(Hosts {
        describe: format!(
            "one daemon at {} ({nodes} slices of {})",
            socket.display(),
            crate::mount::human(slice_bytes)
        ),
        nodes,
        slice_bytes,
        netns: vec![None; nodes as usize],
        direct: Some(vec![socket.to_path_buf(); nodes as usize]),
        nbd,
    })
}

/// The input's record count and checksum, from the generator.
fn input_checksum(seed: u64, records: u64) -> u64 {
    const BATCH: u64 = 100_000;
    let mut sum = 0u64;
    let mut at = 0;
    while at < records {
        let k = (records - at).min(BATCH);
        for r in sort::generate_records_at(seed, at, k as usize) {
            sum = sum.wrapping_add(record_checksum(&r));
        }
        at += k;
    }
    sum
}

/// What is wrong with the outputs, given the input's count and checksum.
pub(crate) fn validate(records: u64, checksum: u64, outputs: &[OutputSummary]) -> Vec<String> {
    let mut problems = Vec::new();
    for o in outputs {
        if o.out_of_order > 0 {
            problems.push(format!(
                "node {}: {} records out of key order (first at record {})",
                o.node,
                o.out_of_order,
                o.first_out_of_order.unwrap_or(0)
            ));
        }
        if o.misplaced > 0 {
            problems.push(format!(
                "node {}: {} records belong to another node's key range",
                o.node, o.misplaced
            ));
        }
    }
    let nonempty: Vec<&OutputSummary> = outputs.iter().filter(|o| o.records > 0).collect();
    for w in nonempty.windows(2) {
        if w[0].last_key > w[1].first_key {
            problems.push(format!(
                "node {}'s last key {} is above node {}'s first key {}",
                w[0].node,
                w[0].last_key.as_deref().unwrap_or("-"),
                w[1].node,
                w[1].first_key.as_deref().unwrap_or("-")
            ));
        }
    }
    let out: u64 = outputs.iter().map(|o| o.records).sum();
    if out != records {
        problems.push(format!("{out} records out, {records} in"));
    }
    let sum = outputs.iter().fold(0u64, |s, o| s.wrapping_add(o.checksum));
    if sum != checksum {
        problems.push(format!(
            "checksum of the output {sum:#x}, of the input {checksum:#x}"
        ));
    }
    problems
}

/// One run (one access path): measured, predicted, validated.
#[derive(Serialize)]
struct SortRun {
    via: &'static str,
    records: u64,
    bytes: u64,
    nodes: u16,
    io_bytes: u64,
    /// The slowest host's times (each stage starts at a barrier).
    generate_s: f64,
    stage1_s: f64,
    stage2_s: f64,
    total_s: f64,
    /// Bytes sorted per second of the two stages.
    mb_per_s: f64,
    /// Start of the workers to their end, input generation and barriers included.
    wall_s: f64,
    partition_ns_per_record: f64,
    sort_ns_per_record: f64,
    predicted_interface: &'static str,
    predicted_stage1_s: f64,
    predicted_stage2_s: f64,
    predicted_total_s: f64,
    /// The host's mean runnable threads during the sort (the daemons', the
    /// workers' and everything else's), against its cores.
    runnable_threads_mean: f64,
    cores: usize,
    /// `moneta_abi::fidelity`'s verdict on the run: behind = how much the
    /// measured total exceeds the prediction for the same records, hosts,
    /// requests and (measured) CPU per record.
    faithful: bool,
    verdict: String,
    valid: bool,
    problems: Vec<String>,
    prediction: SortResult,
    workers: Vec<WorkerReport>,
    outputs: Vec<OutputSummary>,
}

/// For a direct run: how the slowest host of each stage spent it, beside
/// the prediction (the workers time every request; NBD runs are not).
fn where_time_went(r: &SortRun) -> Vec<String> {
    let slowest = |stage: fn(&WorkerReport) -> f64| {
        r.workers
            .iter()
            .max_by(|a, b| stage(a).total_cmp(&stage(b)))
    };
    let mut lines = Vec::new();
    for (n, stage, predicted) in [
        (
            1,
            (|w: &WorkerReport| w.stage1_s) as fn(&WorkerReport) -> f64,
            &r.prediction.stage1,
        ),
        (2, |w: &WorkerReport| w.stage2_s, &r.prediction.stage2),
    ] {
        let Some(w) = slowest(stage) else { continue };
        let io = if n == 1 { &w.stage1_io } else { &w.stage2_io };
        if io.requests == 0 {
            continue;
        }
        let (cpu_what, cpu_s, cpu_wall) = if n == 1 {
            ("partition", w.partition_cpu_s, w.partition_cpu_s)
        } else {
            ("sort", w.sort_cpu_s, w.sort_wall_s)
        };
        // Stage 2 sorts while its writes go on: the sum of the two exceeds
        // the stage by what overlapped; else the rest is other work.
        let rest = stage(w) - io.wall_s - cpu_wall;
        let rest = if rest >= 0.0 {
            format!("+ other {rest:.4} s")
        } else {
            format!("- overlapped {:.4} s", -rest)
        };
        lines.push(format!(
            "stage {n} (slowest, n{}): {:.4} s = {} requests {:.4} s (the device model's time \
             {:.4} s, returned {:.4} s after it) + {cpu_what} {:.4} s ({:.4} s CPU) {rest}; \
             predicted {:.4} s (IO {:.4} s, CPU {:.4} s, overlapped)",
            w.node,
            stage(w),
            io.requests,
            io.wall_s,
            io.modeled_s,
            io.behind_s,
            cpu_wall,
            cpu_s,
            predicted.seconds,
            predicted.io_s,
            predicted.cpu_s,
        ));
    }
    lines
}

#[derive(Serialize)]
struct SortReport {
    hosts: String,
    seed: u64,
    records: u64,
    nodes: u16,
    slice_bytes: u64,
    input_checksum: String,
    layout: Layout,
    runs: Vec<SortRun>,
}

/// The plan file, removed when the run ends.
struct PlanFile(PathBuf);

impl Drop for PlanFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A worker process and the tail of its stderr.
struct Worker {
    node: u16,
    child: Child,
    stderr_tail: Arc<Mutex<Vec<String>>>,
    forward: Option<std::thread::JoinHandle<()>>,
}

const STDERR_TAIL_LINES: usize = 8;

fn spawn_worker(
    exe: &Path,
    netns: Option<&str>,
    plan: &Path,
    node: u16,
    phase: &str,
    corrupt: Option<&str>,
    progress: bool,
) -> Result<Worker, String> {
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.args(["san", "sort-worker", "--plan"]).arg(plan).args([
        "--node",
        &node.to_string(),
        "--phase",
        phase,
    ]);
    if let Some(c) = corrupt {
        cmd.args(["--corrupt", c]);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("starting the {phase} worker of node {node}: {e}"))?;
    let stderr_tail = Arc::new(Mutex::new(Vec::new()));
    let forward = child.stderr.take().map(|err| {
        let tail = stderr_tail.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if progress {
                    eprintln!("  {line}");
                }
                let mut t = tail.lock().expect("tail");
                if t.len() == STDERR_TAIL_LINES {
                    t.remove(0);
                }
                t.push(line);
            }
        })
    });
    Ok(Worker {
        node,
        child,
        stderr_tail,
        forward,
    })
}

impl Worker {
    fn finish(mut self) -> (String, String) {
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(f) = self.forward.take() {
            let _ = f.join();
        }
        let tail = self.stderr_tail.lock().expect("tail").join("\n");
        (out, tail)
    }
}

/// Start one worker per host for `phase` and wait for all, within
/// `deadline`; the first failure kills the others. Each one's stdout.
fn run_phase(
    exe: &Path,
    hosts: &Hosts,
    plan: &Path,
    phase: &str,
    corrupt: Option<&str>,
    deadline: Instant,
    progress: bool,
) -> crate::error::Result<Vec<String>> {
    let mut running = Vec::new();
    let kill_all = |running: &mut Vec<Worker>| {
        for w in running.iter_mut() {
            let _ = w.child.kill();
            let _ = w.child.wait();
        }
    };
    for node in 0..hosts.nodes {
        let c = if node == 0 { corrupt } else { None };
        match spawn_worker(
            exe,
            hosts.netns[node as usize].as_deref(),
            plan,
            node,
            phase,
            c,
            progress,
        ) {
            Ok(w) => running.push(w),
            Err(e) => {
                kill_all(&mut running);
                return Err(e.into());
            }
        }
    }
    let mut outputs: Vec<Option<String>> = vec![None; hosts.nodes as usize];
    while !running.is_empty() {
        let mut k = 0;
        while k < running.len() {
            match running[k].child.try_wait() {
                Ok(None) => k += 1,
                Ok(Some(status)) => {
                    let w = running.swap_remove(k);
                    let node = w.node;
                    let (out, tail) = w.finish();
                    if !status.success() {
                        kill_all(&mut running);
                        return Err(format!(
                            "the {phase} worker of node {node} failed ({status}): {tail}"
                        )
                        .into());
                    }
                    outputs[node as usize] = Some(out);
                }
                Err(e) => {
                    kill_all(&mut running);
                    return Err(format!("waiting for the {phase} workers: {e}").into());
                }
            }
        }
        if Instant::now() >= deadline && !running.is_empty() {
            let late: Vec<u16> = running.iter().map(|w| w.node).collect();
            kill_all(&mut running);
            return Err(format!(
                "the {phase} workers of nodes {late:?} did not finish in time (--timeout-s); killed"
            )
            .into());
        }
        moneta_supervisor::signals::interrupted().inspect_err(|_| kill_all(&mut running))?;
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(outputs.into_iter().map(Option::unwrap_or_default).collect())
}

fn parse_lines<T: serde::de::DeserializeOwned>(
    what: &str,
    outs: &[String],
) -> Result<Vec<T>, String> {
    outs.iter()
        .enumerate()
        .map(|(i, o)| {
            serde_json::from_str(o.trim())
                .map_err(|e| format!("node {i}'s {what} report '{}': {e}", o.trim()))
        })
        .collect()
}

fn predict(
    a: &SortRunArgs,
    nodes: u16,
    interface: Interface,
    workers: &[WorkerReport],
) -> Result<SortResult, String> {
    let records = a.records as f64;
    let ns = |s: f64| s * 1e9 / records;
    let cpu = CpuCosts {
        partition_ns_per_record: ns(workers.iter().map(|w| w.partition_cpu_s).sum()),
        sort_ns_per_record: ns(workers.iter().map(|w| w.sort_cpu_s).sum()),
        cores: 1,
        source: "measured in this run's workers (this machine, one core per host), unscaled".into(),
    };
    let device = Config::preset(&a.preset).map_err(|e| e.to_string())?;
    sort::run(&SortSetup {
        costs: device.san.clone(),
        san: SanConfig {
            device,
            topology: topology(false, nodes)?,
            mirroring: false,
        },
        interface,
        input_bytes: a.records * RECORD_BYTES as u64,
        io_bytes: a.io_bytes,
        threads_per_host: 1,
        cpu,
        seed: a.seed,
    })
}

#[allow(clippy::too_many_arguments)]
fn run_once(
    a: &SortRunArgs,
    hosts: &Hosts,
    layout: &Layout,
    via: Via,
    checksum: u64,
    exe: &Path,
    progress: bool,
) -> crate::error::Result<SortRun> {
    let access: Vec<Access> = match via {
        Via::Direct => hosts
            .direct
            .as_ref()
            .ok_or("no direct access to these hosts")?
            .iter()
            .map(|socket| Access::Direct {
                socket: socket.clone(),
                completion: a.completion.clone(),
            })
            .collect(),
        Via::Nbd => {
            let targets = hosts.nbd.clone().ok_or(
                "--via nbd needs NBD servers: `moneta san up --nbd-port PORT`, or --nbd \
                 HOST:PORT for the daemon of --socket (moneta serve --nbd tcp://HOST:PORT)",
            )?;
            vec![Access::Nbd { targets }; hosts.nodes as usize]
        }
        Via::Both => unreachable!("run_once takes one path"),
    };
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ ((std::process::id() as u64) << 32);
    let plan = Plan {
        run_id,
        seed: a.seed,
        records: a.records,
        io_bytes: a.io_bytes,
        layout: layout.clone(),
        access,
        timeout_ms: a.timeout_s * 1000,
        progress,
    };
    let path = PlanFile(std::env::temp_dir().join(format!(
        "moneta-sort-{}-{run_id:x}.json",
        std::process::id()
    )));
    std::fs::write(
        &path.0,
        serde_json::to_vec(&plan).map_err(|e| e.to_string())?,
    )
    .map_err(|e| format!("{}: {e}", path.0.display()))?;
    let name = match via {
        Via::Direct => "direct",
        _ => "nbd",
    };
    if progress {
        eprintln!("sort via {name}: {} workers", hosts.nodes);
    }
    let started = Instant::now();
    let deadline = started + Duration::from_secs(a.timeout_s);
    let load = moneta::bench::HostLoad::start();
    let outs = run_phase(exe, hosts, &path.0, "sort", None, deadline, progress);
    let runnable_threads_mean = load.stop();
    let outs = outs?;
    let wall_s = started.elapsed().as_secs_f64();
    let workers: Vec<WorkerReport> = parse_lines("sort", &outs)?;
    if progress {
        eprintln!("sort via {name}: verifying the output");
    }
    let deadline = Instant::now() + Duration::from_secs(a.timeout_s);
    let outs = run_phase(
        exe,
        hosts,
        &path.0,
        "verify",
        a.corrupt.as_deref(),
        deadline,
        progress,
    )?;
    let outputs: Vec<OutputSummary> = parse_lines("verify", &outs)?;
    let problems = validate(a.records, checksum, &outputs);
    let interface = match via {
        Via::Direct => Interface::QuicksanD,
        _ => Interface::Iscsi,
    };
    let prediction = predict(a, hosts.nodes, interface, &workers)?;
    let max = |f: fn(&WorkerReport) -> f64| workers.iter().map(f).fold(0.0, f64::max);
    let (stage1_s, stage2_s) = (max(|w| w.stage1_s), max(|w| w.stage2_s));
    let total_s = stage1_s + stage2_s;
    let bytes = a.records * RECORD_BYTES as u64;
    let per_record = |s: f64| s * 1e9 / a.records as f64;
    let cores = moneta_abi::fidelity::cores();
    let (faithful, verdict) = moneta_abi::fidelity::judge_of(
        "the sort was",
        (total_s - prediction.total_s).max(0.0) * 1e9,
        prediction.total_s * 1e9,
        runnable_threads_mean,
        cores,
    );
    Ok(SortRun {
        via: name,
        records: a.records,
        bytes,
        nodes: hosts.nodes,
        io_bytes: a.io_bytes,
        generate_s: max(|w| w.generate_s),
        stage1_s,
        stage2_s,
        total_s,
        mb_per_s: bytes as f64 / total_s.max(1e-9) / 1e6,
        wall_s,
        partition_ns_per_record: per_record(workers.iter().map(|w| w.partition_cpu_s).sum()),
        sort_ns_per_record: per_record(workers.iter().map(|w| w.sort_cpu_s).sum()),
        predicted_interface: interface.key(),
        predicted_stage1_s: prediction.stage1.seconds,
        predicted_stage2_s: prediction.stage2.seconds,
        predicted_total_s: prediction.total_s,
        runnable_threads_mean,
        cores,
        faithful,
        verdict,
        valid: problems.is_empty(),
        problems,
        prediction,
        workers,
        outputs,
    })
}

pub fn run(a: SortRunArgs) -> crate::error::Result<()> {
    if a.io_bytes < RECORD_BYTES as u64 {
        return Err(format!(
            "--io-bytes {} must hold at least one record ({RECORD_BYTES} B)",
            a.io_bytes
        )
        .into());
    }
    if CompletionMode::parse(&a.completion).is_none() {
        return Err(format!(
            "--completion {}: expected dma, forwarding or issue-sleep",
            a.completion
        )
        .into());
    }
    if a.timeout_s == 0 {
        return Err("--timeout-s must be at least 1".into());
    }
    let hosts = match (&a.name, &a.socket, a.nodes) {
        (Some(name), _, _) => {
            crate::mount::need_root("san sort --name (workers run in the SAN's namespaces)")?;
            san_hosts(name)?
        }
        (None, Some(socket), Some(nodes)) => one_daemon_hosts(socket, nodes, a.nbd.as_deref())?,
        _ => return Err("give --name NAME (a SAN) or --socket PATH --nodes N".into()),
    };
    let layout = Layout::new(a.records, hosts.nodes, hosts.slice_bytes)?;
    let vias = match a.via {
        Via::Both => vec![Via::Direct, Via::Nbd],
        v => vec![v],
    };
    // Refuse before starting anything what cannot work.
    for via in &vias {
        match via {
            Via::Direct => {
                if let Some(socket) = hosts.direct.as_ref().and_then(|d| d.first()) {
                    let m = Moneta::connect(socket)
                        .map_err(|e| format!("{}: {e}", socket.display()))?;
                    let global = hosts.nodes as u64 * hosts.slice_bytes;
                    if m.capacity_bytes() < global {
                        return Err(format!(
                            "{}: node 0's daemon addresses {} of the {} global space: {}",
                            hosts.describe,
                            crate::mount::human(m.capacity_bytes()),
                            crate::mount::human(global),
                            REMOTE_NOT_SERVED
                        )
                        .into());
                    }
                }
            }
            Via::Nbd if hosts.nbd.is_none() => {
                return Err(format!(
                    "--via nbd: {} has no NBD servers (moneta san up --nbd-port PORT; with \
                     --socket, --nbd HOST:PORT of that daemon's `serve --nbd`)",
                    hosts.describe
                )
                .into())
            }
            _ => {}
        }
    }
    let progress = std::io::stderr().is_terminal();
    if progress {
        eprintln!("sort: input checksum of {} records", a.records);
    }
    let checksum = input_checksum(a.seed, a.records);
    let exe = std::env::current_exe().map_err(|e| format!("finding the moneta binary: {e}"))?;
    moneta_supervisor::signals::catch_signals();
    let mut runs = Vec::new();
    for via in vias {
        runs.push(run_once(
            &a, &hosts, &layout, via, checksum, &exe, progress,
        )?);
    }
    let report = SortReport {
        hosts: hosts.describe.clone(),
        seed: a.seed,
        records: a.records,
        nodes: hosts.nodes,
        slice_bytes: hosts.slice_bytes,
        input_checksum: format!("{checksum:#x}"),
        layout,
        runs,
    };
    if a.json {
        crate::output::print_result_json(
            &report,
            &crate::provenance::Provenance::here().seed(a.seed),
        )?;
    } else {
        println!(
            "Distributed sort (SPEC §4.4): {} records ({}), {} hosts, {} B requests, seed {}; {}",
            a.records,
            crate::mount::human(a.records * RECORD_BYTES as u64),
            hosts.nodes,
            a.io_bytes,
            a.seed,
            hosts.describe
        );
        let (header, cells) = crate::output::table(
            &report.runs,
            &[
                "via",
                "generate_s",
                "stage1_s",
                "stage2_s",
                "total_s",
                "mb_per_s",
                "predicted_interface",
                "predicted_stage1_s",
                "predicted_stage2_s",
                "predicted_total_s",
                "faithful",
                "valid",
            ],
        )?;
        crate::output::print_aligned(&header, &cells);
        println!(
            "Stage times are the slowest host's; predicted: the simulator's SAN of {} hosts \
             ({} preset), one request at a time per host, CPU as measured here.",
            hosts.nodes, a.preset
        );
        for r in &report.runs {
            println!("verdict ({}): {}", r.via, r.verdict);
            for line in where_time_went(r) {
                println!("  {line}");
            }
        }
    }
    // Whatever the format: a result the host did not keep up with says so.
    for r in report.runs.iter().filter(|r| !r.faithful) {
        eprintln!("moneta: warning: the sort via {}: {}", r.via, r.verdict);
    }
    let bad: Vec<String> = report
        .runs
        .iter()
        .flat_map(|r| r.problems.iter().map(move |p| format!("{}: {p}", r.via)))
        .collect();
    if bad.is_empty() {
        Ok(())
    } else {
        Err(format!("validation failed: {}", bad.join("; ")).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sort_worker::node_records;

    fn summary(node: u16, records: u64, checksum: u64, first: &str, last: &str) -> OutputSummary {
        let s = serde_json::json!({
            "node": node, "records": records, "checksum": checksum,
            "first_key": first, "last_key": last,
            "out_of_order": 0, "first_out_of_order": null, "misplaced": 0,
        });
        serde_json::from_value(s).unwrap()
    }

    #[test]
    fn the_checker_passes_a_sorted_run_and_names_every_fault() {
        let good = vec![summary(0, 2, 10, "00", "40"), summary(1, 3, 5, "80", "ff")];
        assert!(validate(5, 15, &good).is_empty());
        // Count, checksum, order across nodes, order within a node.
        assert!(validate(6, 15, &good)[0].contains("5 records out, 6 in"));
        assert!(validate(5, 16, &good)[0].contains("checksum"));
        let mut crossed = good.clone();
        crossed[0].last_key = Some("90".into());
        assert!(validate(5, 15, &crossed)[0].contains("above node 1's first key"));
        let mut unsorted = good.clone();
        unsorted[1].out_of_order = 1;
        unsorted[1].first_out_of_order = Some(2);
        unsorted[1].misplaced = 1;
        let p = validate(5, 15, &unsorted);
        assert!(
            p[0].contains("out of key order") && p[1].contains("another node"),
            "{p:?}"
        );
        // An empty node in between does not hide a crossing.
        let gap = vec![
            summary(0, 2, 10, "00", "90"),
            OutputSummary::default(),
            summary(2, 3, 5, "80", "ff"),
        ];
        assert_eq!(validate(5, 15, &gap).len(), 1);
    }

    #[test]
    fn the_input_checksum_is_the_generators() {
        let direct: u64 = sort::generate_records(1234, 9)
            .iter()
            .map(record_checksum)
            .fold(0, u64::wrapping_add);
        assert_eq!(input_checksum(9, 1234), direct);
        assert_ne!(input_checksum(9, 1233), direct);
        let (first, count) = node_records(1234, 3, 2);
        assert_eq!(first + count, 1234);
    }
}
