//! `moneta san chaos`: a randomized fault schedule against a mirrored SAN,
//! with a register checker (issue 22 item 6; Jepsen's register checker is
//! the model).
//!
//! It brings up its own SAN (`moneta san up --mirror`), runs client threads
//! that write and read checksummed, versioned 4 KB blocks through randomly
//! chosen nodes' daemons (libmoneta, as any program), and a nemesis thread
//! that follows a schedule drawn from the seed alone: `kill -9` of a
//! daemon, `san restart`, a node's partition or one link's, heal, loss,
//! corruption, reordering and duplicates on a link, and `san resolve
//! --discard` when a split brain is reported. What each step does depends on
//! the SAN's state when it comes (a node already down is not killed again),
//! and thread timing is not reproducible; the schedule is.
//!
//! Each block has one writer thread (its versions are 1, 2, 3, … in order);
//! any thread may read it. Per block the checker keeps the highest version
//! acknowledged, the highest version whose write was started (a write that
//! failed may or may not have landed: the usual register rule), and the
//! highest version a completed read returned. A read that began after
//! version `a` was acknowledged and after a read returned `r` must return a
//! version in `max(a, r) ..= started` or an error. It is a failure if it
//! returns an older version (**stale**), zeros where a version was
//! acknowledged (**lost**), or bytes that are not one whole version
//! (**mixed**: a bad checksum, two versions' bytes, another block's).
//! After the run every fault is healed and every node restarted, and each
//! block is read through every node: the same rule, and an error there is a
//! failure too (the SAN did not come back).
//!
//! A read that returns an older version than another read already returned
//! while the newer write was still in flight ("went back") is allowed by
//! that rule (the issue's), not by linearizability: it is counted and
//! shown, and a failure only with `--strict`.
//!
//! The SAN fences itself (README, "Replica states and split brain" and
//! "Leases and the tie-breaker for a cut link"): a node that reaches no
//! majority outdates its shared copies, and the two ends of a cut link
//! lose each other within a lease and let one copy go on. `--clients-on
//! any` (the default) tests that: clients use every node, the cut-off
//! ones and both ends of a cut link included. `--clients-on majority`
//! models fencing outside the SAN: no client uses a node while it is cut
//! off (from the moment the nemesis decides to cut it until it is healed),
//! nor either end of a cut link. `--max-cuts` bounds the partitions in
//! force at once (default 1); more than one at once is not what the
//! README's chaos results cover.

use crate::mount::need_root;
use clap::{Args, ValueEnum};
use moneta::{CompletionMode, Moneta};
use moneta_emu::register::{
    block_content, decode, judge, resolve_target, Floor, Verdict, BLOCK_BYTES,
};
use moneta_model::kernel::rng::Rng;
use moneta_model::units::Op;
use moneta_supervisor::daemon::is_our_daemon;
use moneta_supervisor::signals::{catch_signals, signal_received};
use serde::Serialize;
use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Events kept per block for a failure's report.
const HISTORY: usize = 40;
/// Failures reported in full (all are counted).
const MAX_REPORTED: usize = 20;
/// An operation with no answer after this long is given up (the write is
/// then ambiguous) and its connection dropped.
const OP_TIMEOUT: Duration = Duration::from_secs(30);
/// After the run: how long the healed SAN may take to serve every block.
const SETTLE: Duration = Duration::from_secs(90);

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientsOn {
    /// Clients use every node, the cut-off side of a partition included.
    Any,
    /// No client uses a node while it is partitioned (fencing).
    Majority,
}

#[derive(Args)]
pub struct SanChaosArgs {
    /// The SAN this run brings up and removes (1–8 of a-z, 0-9); it must
    /// not be up already.
    #[arg(long, default_value = "chaos")]
    name: String,
    /// Mirrored nodes (3 to 5).
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// The schedule's seed [default: from the clock]; printed.
    #[arg(long)]
    seed: Option<u64>,
    /// How long clients and nemesis run, in seconds (the recovery and the
    /// final reads come after).
    #[arg(long, default_value_t = 60)]
    duration_s: u64,
    /// At most this many client operations (reads and writes), all threads.
    #[arg(long, default_value_t = 10_000_000)]
    max_ops: u64,
    /// Client threads (1 to 8).
    #[arg(long, default_value_t = 3)]
    clients: u32,
    /// Blocks checked per slice of the global space (1 to 256).
    #[arg(long, default_value_t = 16)]
    blocks_per_slice: u64,
    /// Each SSD's capacity (a power of two).
    #[arg(long, default_value = "16M")]
    size: String,
    /// Mean time between nemesis steps, in milliseconds (≥ 100).
    #[arg(long, default_value_t = 2000)]
    step_ms: u64,
    /// Which nodes clients may use: any, or only those not cut off
    /// (majority: fencing).
    #[arg(long, value_enum, default_value_t = ClientsOn::Any)]
    clients_on: ClientsOn,
    /// At most this many partitions (of a node, or of one link) in force
    /// at once; a partition step beyond it is skipped (README's chaos
    /// results are for one).
    #[arg(long, default_value_t = 1)]
    max_cuts: usize,
    /// Also fail on reads that went back: an older version than another
    /// read already returned, while the newer write was still in flight
    /// (Jepsen's linearizability; the issue's rule allows them).
    #[arg(long)]
    strict: bool,
    /// Print the summary as JSON (progress still goes to stderr).
    #[arg(long)]
    json: bool,
    /// Copy each node's daemon log (every life of it: restarts append) and
    /// dirty map into this directory when the run ends [default: only when
    /// it fails, into $TMPDIR/moneta-san-chaos-NAME-SEED]. It is created,
    /// and must not exist already.
    #[arg(long)]
    keep_logs: Option<PathBuf>,
}

impl SanChaosArgs {
    fn check(&self) -> Result<(), String> {
        crate::san_up::check_name(&self.name)?;
        if !(3..=5).contains(&self.nodes) {
            return Err(format!("--nodes {}: 3 to 5", self.nodes));
        }
        if !(1..=8).contains(&self.clients) {
            return Err(format!("--clients {}: 1 to 8", self.clients));
        }
        if !(1..=256).contains(&self.blocks_per_slice) {
            return Err(format!(
                "--blocks-per-slice {}: 1 to 256",
                self.blocks_per_slice
            ));
        }
        if self.duration_s == 0 || self.duration_s > 7 * 24 * 3600 {
            return Err(format!(
                "--duration-s {}: 1 to 604800 (a week)",
                self.duration_s
            ));
        }
        if self.max_cuts > usize::from(self.nodes) {
            return Err(format!(
                "--max-cuts {}: at most --nodes ({})",
                self.max_cuts, self.nodes
            ));
        }
        if self.max_ops == 0 {
            return Err("--max-ops must be positive".into());
        }
        if self.step_ms < 100 {
            return Err(format!("--step-ms {}: at least 100", self.step_ms));
        }
        let size = crate::mount::parse_size(&self.size)?;
        if !size.is_power_of_two() || size < 1 << 20 {
            return Err(format!(
                "--size {}: a power of two of at least 1M",
                self.size
            ));
        }
        Ok(())
    }
}

// ---------------------------------------------------------------- checker

/// What the checker knows of one block.
#[derive(Default)]
struct BlockState {
    /// Highest version whose write was acknowledged.
    acked: u64,
    /// Highest version whose write was started (versions are sequential:
    /// one writer per block).
    started: u64,
    /// Highest version a completed read returned.
    read: u64,
    history: VecDeque<String>,
}

impl BlockState {
    fn note(&mut self, t: f64, what: String) {
        if self.history.len() == HISTORY {
            self.history.pop_front();
        }
        self.history.push_back(format!("{t:9.3} s  {what}"));
    }
}

// ---------------------------------------------------------------- shared state

#[derive(Default, Serialize, Clone)]
struct Counts {
    ops: u64,
    writes_ok: u64,
    writes_failed: u64,
    reads_checked: u64,
    reads_failed: u64,
    connect_failures: u64,
    /// Reads older than one another read returned, the newer write still
    /// in flight (failures only with `--strict`).
    went_back: u64,
    errors: BTreeMap<String, u64>,
    failures: BTreeMap<String, u64>,
}

struct Run {
    seed: u64,
    started: Instant,
    blocks: Vec<Mutex<BlockState>>,
    /// Global address of each block.
    addrs: Vec<u64>,
    sockets: Vec<PathBuf>,
    stop: AtomicBool,
    ops: AtomicU64,
    max_ops: u64,
    /// Whether a read that went back is a failure (`--strict`).
    strict: bool,
    counts: Mutex<Counts>,
    /// Full reports of the first failures.
    reports: Mutex<Vec<String>>,
    /// (seconds since start, what the nemesis did).
    nemesis_log: Mutex<Vec<(f64, String)>>,
    /// Fencing (`--clients-on majority`): a node clients must not use, and
    /// the operations in flight on each node.
    fenced: Vec<AtomicBool>,
    in_flight: Vec<AtomicU32>,
}

impl Run {
    fn now(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }

    fn count(&self, f: impl FnOnce(&mut Counts)) {
        f(&mut self.counts.lock().unwrap());
    }

    fn log(&self, what: String) {
        let t = self.now();
        eprintln!("[{t:8.2} s] nemesis: {what}");
        self.nemesis_log.lock().unwrap().push((t, what));
    }

    /// Judge a read of `block` through `node` and record it.
    fn check(&self, block: usize, node: usize, floor: Floor, got: &[u8], final_read: bool) {
        let strict = self.strict;
        let decoded = decode(self.seed, block as u64, got);
        let t = self.now();
        let mut st = self.blocks[block].lock().unwrap();
        let verdict = judge(floor, st.started, &decoded);
        let tag = if final_read { "final read" } else { "read" };
        match verdict {
            Verdict::Fine(v) => {
                st.read = st.read.max(v);
                st.note(t, format!("{tag} via n{node}: v{v}"));
                self.count(|c| c.reads_checked += 1);
            }
            Verdict::WentBack { got, read } if !strict => {
                // Allowed by the issue's rule (v`got` is acknowledged or may
                // have landed), not by linearizability: counted, shown.
                st.note(
                    t,
                    format!("{tag} via n{node}: v{got}, older than v{read} read before"),
                );
                let history: Vec<String> = st.history.iter().cloned().collect();
                drop(st);
                let mut c = self.counts.lock().unwrap();
                c.reads_checked += 1;
                c.went_back += 1;
                if c.went_back <= 3 {
                    eprintln!(
                        "went back (not a failure without --strict): block {block} via n{node} \
                         at {t:.3} s returned v{got} after a read returned v{read}\n    {}",
                        history.join("\n    ")
                    );
                }
            }
            ref bad => {
                st.note(t, format!("{tag} via n{node}: {bad:?}  <-- FAILURE"));
                let history: Vec<String> = st.history.iter().cloned().collect();
                drop(st);
                self.count(|c| {
                    c.reads_checked += 1;
                    *c.failures.entry(bad.kind().into()).or_default() += 1;
                });
                let around: Vec<String> = self
                    .nemesis_log
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(at, _)| (t - 30.0..=t).contains(at))
                    .map(|(at, w)| format!("{at:9.3} s  {w}"))
                    .collect();
                let report = format!(
                    "{} {tag} of block {block} (global {}) via n{node} at {t:.3} s, seed {}: \
                     {bad:?} (the read began with acknowledged v{}, read v{})\n  block history:\n    \
                     {}\n  nemesis in the 30 s before:\n    {}",
                    bad.kind().to_uppercase(),
                    self.addrs[block],
                    self.seed,
                    floor.acked,
                    floor.read,
                    history.join("\n    "),
                    if around.is_empty() {
                        "(none)".into()
                    } else {
                        around.join("\n    ")
                    },
                );
                let mut reports = self.reports.lock().unwrap();
                if reports.len() < MAX_REPORTED {
                    eprintln!("{report}");
                    reports.push(report);
                }
            }
        }
    }

    fn floor(&self, block: usize) -> Floor {
        let st = self.blocks[block].lock().unwrap();
        Floor {
            acked: st.acked,
            read: st.read,
        }
    }
}

/// A short name for an error: the device's result, or the library's kind.
fn error_kind(e: &moneta::EmuError) -> String {
    match e.kind {
        moneta::ErrorKind::Request => {
            let m = e.message.rsplit(": ").next().unwrap_or(&e.message);
            if m.contains("up-to-date") {
                "no up-to-date copy".into()
            } else {
                m.split(" (").next().unwrap_or(m).to_string()
            }
        }
        k => format!("{k:?}").to_lowercase(),
    }
}

/// One request of one block, waiting with short sleeps and checking now
/// and then that the daemon is still there (a killed daemon never answers).
fn one_request(m: &Moneta, op: Op, addr: u64, buf: &mut [u8]) -> Result<(), moneta::EmuError> {
    let mut io = m.prepare(op, addr, buf.len() as u64, CompletionMode::IssueSleep)?;
    if op == Op::Write {
        m.buffer_mut(&mut io).copy_from_slice(buf);
    }
    if let Err(e) = m.submit(&mut io) {
        m.release(io);
        return Err(e);
    }
    let started = Instant::now();
    let mut turns = 0u32;
    let result = loop {
        if let Some(r) = m.try_complete(&mut io) {
            break r;
        }
        turns += 1;
        if turns.is_multiple_of(64) {
            // A daemon gone: the tags stay taken, the connection is dropped.
            m.check_device()?;
            if started.elapsed() > OP_TIMEOUT {
                return Err(moneta::EmuError::new(
                    moneta::ErrorKind::Stopped,
                    format!("no answer in {} s", OP_TIMEOUT.as_secs()),
                ));
            }
        }
        std::thread::sleep(Duration::from_micros(if turns < 64 { 20 } else { 500 }));
    };
    if result.is_ok() && op == Op::Read {
        buf.copy_from_slice(m.buffer(&io));
    }
    m.release(io);
    result
}

fn connect(socket: &Path) -> Result<Moneta, moneta::EmuError> {
    let m = Moneta::connect(socket)?;
    m.grant_raw(0, m.capacity_bytes(), true)?;
    Ok(m)
}

/// A client thread: writes its own blocks (every `clients`-th), reads any.
fn client(run: &Run, thread: u32, clients: u32) {
    let nodes = run.sockets.len();
    let mut rng = Rng::stream(run.seed, 1000 + u64::from(thread));
    let mut conns: Vec<Option<Moneta>> = (0..nodes).map(|_| None).collect();
    let own: Vec<usize> = (0..run.blocks.len())
        .filter(|b| *b as u32 % clients == thread)
        .collect();
    let mut buf = vec![0u8; BLOCK_BYTES];
    while !run.stop.load(Ordering::Relaxed) {
        if run.ops.fetch_add(1, Ordering::Relaxed) >= run.max_ops {
            break;
        }
        let node = rng.below(nodes as u64) as usize;
        // Fencing: take the node only if it is not cut off, and let the
        // nemesis see the operation in flight.
        run.in_flight[node].fetch_add(1, Ordering::SeqCst);
        if run.fenced[node].load(Ordering::SeqCst) {
            run.in_flight[node].fetch_sub(1, Ordering::SeqCst);
            run.ops.fetch_sub(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let write = !own.is_empty() && rng.below(100) < 40;
        let block = if write {
            own[rng.below(own.len() as u64) as usize]
        } else {
            rng.below(run.blocks.len() as u64) as usize
        };
        if conns[node].is_none() {
            match connect(&run.sockets[node]) {
                Ok(m) => conns[node] = Some(m),
                Err(_) => {
                    run.in_flight[node].fetch_sub(1, Ordering::SeqCst);
                    run.count(|c| c.connect_failures += 1);
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
        }
        let m = conns[node].as_ref().unwrap();
        let addr = run.addrs[block];
        let result = if write {
            let version = {
                let mut st = run.blocks[block].lock().unwrap();
                st.started += 1;
                let v = st.started;
                st.note(run.now(), format!("write v{v} via n{node} begins"));
                v
            };
            buf.copy_from_slice(&block_content(run.seed, block as u64, version));
            let r = one_request(m, Op::Write, addr, &mut buf);
            let mut st = run.blocks[block].lock().unwrap();
            match &r {
                Ok(()) => {
                    st.acked = st.acked.max(version);
                    st.note(run.now(), format!("write v{version} acknowledged"));
                }
                Err(e) => st.note(
                    run.now(),
                    format!("write v{version} FAILED (may have landed): {e}"),
                ),
            }
            drop(st);
            run.count(|c| match r {
                Ok(()) => c.writes_ok += 1,
                Err(_) => c.writes_failed += 1,
            });
            r
        } else {
            let floor = run.floor(block);
            let r = one_request(m, Op::Read, addr, &mut buf);
            match &r {
                Ok(()) => run.check(block, node, floor, &buf, false),
                Err(_) => run.count(|c| c.reads_failed += 1),
            }
            r
        };
        run.in_flight[node].fetch_sub(1, Ordering::SeqCst);
        run.count(|c| c.ops += 1);
        if let Err(e) = result {
            let kind = error_kind(&e);
            run.count(|c| *c.errors.entry(kind).or_default() += 1);
            if e.kind != moneta::ErrorKind::Request || e.message.contains("device failure") {
                conns[node] = None;
            }
            // A failing node is not hammered.
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

// ---------------------------------------------------------------- nemesis

/// One step of the schedule: a pure function of the seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    Kill(usize),
    Restart(usize),
    /// Cut a node off from every peer.
    Partition(usize),
    /// Cut one link (both ends keep reaching the others).
    PartitionLink(usize, usize),
    Heal(usize),
    /// Loss, corruption, reordering, duplicates on a node's links.
    Lossy(usize, &'static str),
    /// `san resolve --discard` on the k-th node (mod their number) of
    /// those reporting a split brain, if any.
    Resolve(usize),
    /// Heal every link, restart every node, resolve every split brain.
    Recover(usize),
}

const LOSSY: [&str; 4] = [
    "drop=2%,corrupt=0.5%",
    "drop=1%,corrupt=0.1%,reorder=5%,reorder-us=50,duplicate=1%",
    "corrupt=2%",
    "drop=10%,delay-us=200,jitter-us=100",
];

/// The schedule of `seed` on `nodes` nodes: (pause before, step), endless.
pub(crate) fn schedule(seed: u64, nodes: usize, step_ms: u64) -> impl Iterator<Item = (u64, Step)> {
    let mut rng = Rng::stream(seed, 1);
    (0u64..).map(move |i| {
        // Always five draws, whatever the step: the stream stays aligned.
        let pause = step_ms / 2 + rng.below(step_ms);
        let kind = rng.below(100);
        let a = rng.below(nodes as u64) as usize;
        let b = (a + 1 + rng.below(nodes as u64 - 1) as usize) % nodes;
        let k = rng.below(64) as usize;
        let step = if i % 10 == 9 {
            Step::Recover(k)
        } else {
            match kind {
                0..15 => Step::Kill(a),
                15..32 => Step::Restart(a),
                32..45 => Step::Partition(a),
                45..55 => Step::PartitionLink(a, b),
                55..72 => Step::Heal(a),
                72..85 => Step::Lossy(a, LOSSY[k % LOSSY.len()]),
                _ => Step::Resolve(k),
            }
        };
        (pause, step)
    })
}

/// Runs `moneta san …` commands on the run's SAN.
struct Nemesis<'a> {
    run: &'a Run,
    exe: PathBuf,
    name: String,
    nodes: usize,
    clients_on: ClientsOn,
    max_cuts: usize,
    /// Nodes whose link faults are set (a killed daemon forgets them).
    faulted: Vec<bool>,
    /// Nodes cut off from every peer (a partition fault set on them).
    cut: Vec<bool>,
    /// Links cut (a partition fault set on the first toward the second).
    cut_links: Vec<(usize, usize)>,
    counts: BTreeMap<String, u64>,
}

impl Nemesis<'_> {
    fn moneta(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.exe)
            .arg("san")
            .args(args)
            .output()
            .map_err(|e| format!("running moneta: {e}"))?;
        let text = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
        if out.status.success() {
            Ok(text(&out.stdout))
        } else {
            Err(text(&out.stderr))
        }
    }

    fn status(&self) -> Result<serde_json::Value, String> {
        let out = self.moneta(&["status", "--name", &self.name, "--format", "json"])?;
        let v: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| format!("san status: {e}"))?;
        Ok(v[0].clone())
    }

    fn alive(&self) -> Vec<bool> {
        let st = self.status().unwrap_or_default();
        (0..self.nodes)
            .map(|i| st["nodes"][i]["daemon_alive"] == true)
            .collect()
    }

    fn did(&mut self, kind: &str, what: String) {
        *self.counts.entry(kind.into()).or_default() += 1;
        self.run.log(what);
    }

    fn node(i: usize) -> String {
        format!("n{i}")
    }

    /// Fencing: no client starts on `node`, and none is left on it.
    fn fence(&self, node: usize) {
        if self.clients_on == ClientsOn::Any {
            return;
        }
        self.run.fenced[node].store(true, Ordering::SeqCst);
        let deadline = Instant::now() + OP_TIMEOUT + Duration::from_secs(5);
        while self.run.in_flight[node].load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Lift the fence of every node no longer cut off: neither itself nor
    /// a link of it (both ends of a cut link are fenced: each would take
    /// writes of the slices the two share alone).
    fn unfence_healed(&self) {
        for (i, cut) in self.cut.iter().enumerate() {
            let on_cut_link = self.cut_links.iter().any(|&(a, b)| a == i || b == i);
            if !cut && !on_cut_link {
                self.run.fenced[i].store(false, Ordering::SeqCst);
            }
        }
    }

    fn fault(&mut self, node: usize, peer: Option<usize>, spec: &str) -> Result<String, String> {
        let n = Self::node(node);
        let mut args = vec!["fault", "--name", &self.name, "--node", &n];
        let p = peer.map(Self::node);
        if let Some(p) = &p {
            args.extend(["--peer", p]);
        }
        args.push(spec);
        self.moneta(&args)
    }

    fn heal(&mut self, node: usize) -> Result<String, String> {
        let r = self.fault(node, None, "none");
        if r.is_ok() {
            self.faulted[node] = false;
            // A link cut set on another node toward this one stays.
            self.recompute_cut();
        }
        r
    }

    /// Which nodes are cut off, from the faults in force.
    fn recompute_cut(&mut self) {
        for i in 0..self.nodes {
            if !self.faulted[i] {
                self.cut[i] = false;
            }
        }
        let faulted = self.faulted.clone();
        self.cut_links.retain(|&(a, _)| faulted[a]);
        self.unfence_healed();
    }

    /// Partitions in force (of a node, or of one link).
    fn cuts(&self) -> usize {
        self.cut.iter().filter(|c| **c).count() + self.cut_links.len()
    }

    fn split_brain_nodes(&self) -> Vec<usize> {
        let st = self.status().unwrap_or_default();
        (0..self.nodes)
            .filter(|&i| {
                st["nodes"][i]["slices"]
                    .as_array()
                    .is_some_and(|s| s.iter().any(|x| x["state"] == "split-brain"))
            })
            .collect()
    }

    fn resolve(&mut self, k: usize) {
        let Some(node) = resolve_target(&self.split_brain_nodes(), k) else {
            self.did("resolve-none", "resolve: no split brain".into());
            return;
        };
        let n = Self::node(node);
        match self.moneta(&["resolve", "--name", &self.name, "--discard", &n]) {
            Ok(out) => self.did("resolve", format!("resolve --discard {n}: {out}")),
            Err(e) => self.did(
                "resolve-failed",
                format!("resolve --discard {n} failed: {e}"),
            ),
        }
    }

    fn restart(&mut self, node: usize) -> Result<String, String> {
        let n = Self::node(node);
        self.moneta(&["restart", "--name", &self.name, "--node", &n])
    }

    fn step(&mut self, step: &Step) {
        let alive = self.alive();
        let down = alive.iter().filter(|a| !**a).count();
        // One node down at a time on 3 nodes, nodes − 2 on more: enough
        // for double failures in a row (kill, restart, kill the partner
        // before the resync ends) without stopping everything.
        let max_down = self.nodes.saturating_sub(2).max(1);
        match *step {
            Step::Kill(i) if !alive[i] => self.did("skipped", format!("kill n{i}: already down")),
            Step::Kill(i) if down >= max_down => {
                self.did("skipped", format!("kill n{i}: {down} node(s) down already"))
            }
            Step::Kill(i) => {
                let st = self.status().unwrap_or_default();
                let pid = st["nodes"][i]["pid"].as_u64().unwrap_or(0) as i32;
                let socket = st["nodes"][i]["socket"].as_str().unwrap_or_default();
                // Checked again right before the kill: a daemon that died
                // meanwhile leaves a pid another process may take (pids
                // wrap at 32,768 on a busy machine).
                if pid > 0 && is_our_daemon(pid, std::path::Path::new(socket)) {
                    moneta_supervisor::process::kill(pid);
                }
                self.faulted[i] = false;
                self.recompute_cut();
                self.did("kill", format!("kill -9 n{i} (pid {pid})"));
            }
            Step::Restart(i) if alive[i] => self.did("skipped", format!("restart n{i}: it runs")),
            Step::Restart(i) => match self.restart(i) {
                Ok(_) => self.did("restart", format!("restart n{i}")),
                Err(e) => self.did("restart-failed", format!("restart n{i} failed: {e}")),
            },
            Step::Partition(i) | Step::PartitionLink(i, _) if !alive[i] => {
                self.did("skipped", format!("partition n{i}: it is down"))
            }
            Step::Partition(i) | Step::PartitionLink(i, _) if self.cuts() >= self.max_cuts => self
                .did(
                    "skipped",
                    format!("partition at n{i}: {} cut(s) in force", self.cuts()),
                ),
            Step::Partition(i) => {
                self.fence(i);
                match self.fault(i, None, "partition") {
                    Ok(_) => {
                        self.faulted[i] = true;
                        self.cut[i] = true;
                        self.did("partition", format!("partition n{i} from every peer"));
                    }
                    Err(e) => self.did("fault-failed", format!("partition n{i} failed: {e}")),
                }
                self.unfence_healed();
            }
            Step::PartitionLink(a, b) => {
                self.fence(a);
                self.fence(b);
                match self.fault(a, Some(b), "partition") {
                    Ok(_) => {
                        self.faulted[a] = true;
                        self.cut_links.push((a, b));
                        self.did("partition-link", format!("partition the link n{a}–n{b}"));
                    }
                    Err(e) => self.did("fault-failed", format!("partition n{a}–n{b} failed: {e}")),
                }
                self.unfence_healed();
            }
            Step::Heal(i) => {
                // The node named, or the next one with faults.
                let Some(j) = (0..self.nodes)
                    .map(|d| (i + d) % self.nodes)
                    .find(|&j| self.faulted[j] && alive[j])
                else {
                    self.did("skipped", "heal: no link has faults".into());
                    return;
                };
                match self.heal(j) {
                    Ok(_) => self.did("heal", format!("heal every link of n{j}")),
                    Err(e) => self.did("fault-failed", format!("heal n{j} failed: {e}")),
                }
            }
            Step::Lossy(i, _) if !alive[i] => {
                self.did("skipped", format!("lossy link on n{i}: it is down"))
            }
            Step::Lossy(i, spec) => match self.fault(i, None, spec) {
                Ok(_) => {
                    // `san fault` replaces the node's faults: a partition
                    // set before is lifted.
                    self.faulted[i] = true;
                    self.cut[i] = false;
                    self.cut_links.retain(|&(a, _)| a != i);
                    self.unfence_healed();
                    self.did("lossy", format!("n{i}'s links: {spec}"));
                }
                Err(e) => self.did("fault-failed", format!("fault n{i} {spec} failed: {e}")),
            },
            Step::Resolve(k) => self.resolve(k),
            Step::Recover(k) => self.recover(k, &alive),
        }
    }

    /// Heal everything, restart every node, resolve split brains.
    fn recover(&mut self, k: usize, alive: &[bool]) {
        for (i, &up) in alive.iter().enumerate() {
            if up && self.faulted[i] {
                if let Err(e) = self.heal(i) {
                    self.did("fault-failed", format!("heal n{i} failed: {e}"));
                }
            }
        }
        for (i, up) in alive.iter().enumerate() {
            if !up {
                if let Err(e) = self.restart(i) {
                    self.did("restart-failed", format!("restart n{i} failed: {e}"));
                }
            }
        }
        self.did(
            "recover",
            "recover: every link healed, every node running".into(),
        );
        // The peers meet again within the silence bound; then a split
        // brain is known.
        std::thread::sleep(Duration::from_millis(1500));
        self.resolve(k);
    }
}

// ---------------------------------------------------------------- the run

/// `moneta san down --purge` when the run ends, however it ends.
struct SanGuard<'a> {
    exe: &'a Path,
    name: String,
}

impl Drop for SanGuard<'_> {
    fn drop(&mut self) {
        let out = Command::new(self.exe)
            .args(["san", "down", "--purge", "--name", &self.name])
            .output();
        match out {
            Ok(o) if o.status.success() => {}
            Ok(o) => eprintln!(
                "moneta san chaos: san down --name {} failed: {}",
                self.name,
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => eprintln!("moneta san chaos: san down: {e}"),
        }
    }
}

#[derive(Serialize)]
struct Summary {
    seed: u64,
    name: String,
    nodes: u16,
    clients: u32,
    clients_on: ClientsOn,
    max_cuts: usize,
    strict: bool,
    blocks: usize,
    duration_s: f64,
    #[serde(flatten)]
    counts: Counts,
    final_reads: u64,
    final_errors: u64,
    nemesis: BTreeMap<String, u64>,
    failures_reported: Vec<String>,
    final_error_examples: Vec<String>,
    /// Where the daemons' logs were copied, if they were.
    logs: Option<String>,
    verdict: String,
}

pub fn run(a: SanChaosArgs) -> Result<(), String> {
    a.check()?;
    need_root("san chaos")?;
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!(
        "moneta san chaos: seed {seed} (--seed {seed} replays the schedule), {} nodes, {} s",
        a.nodes, a.duration_s
    );
    let exe = std::env::current_exe().map_err(|e| format!("finding the moneta binary: {e}"))?;
    let status = Command::new(&exe)
        .args(["san", "status", "--name", &a.name, "--format", "json"])
        .output()
        .map_err(|e| format!("running moneta: {e}"))?;
    // A SAN of that name that does not exist at all is as good as one down.
    let absent = !status.status.success()
        && String::from_utf8_lossy(&status.stderr).contains("no SAN named");
    let st: serde_json::Value = if absent {
        serde_json::json!([{ "state": "down" }])
    } else {
        serde_json::from_slice(&status.stdout).map_err(|e| {
            format!(
                "san status: {e}: {}",
                String::from_utf8_lossy(&status.stderr)
            )
        })?
    };
    if st[0]["state"] != "down" {
        return Err(format!(
            "SAN '{}' is up already: the chaos run brings up its own (--name)",
            a.name
        ));
    }
    catch_signals();
    let guard = SanGuard {
        exe: &exe,
        name: a.name.clone(),
    };
    let out = Command::new(&exe)
        .args([
            "san", "up", "--mirror", "--name", &a.name, "--size", &a.size,
        ])
        // A node killed alone: each in its own daemon.
        .args(["--daemons", "per-node"])
        .arg("--nodes")
        .arg(a.nodes.to_string())
        .output()
        .map_err(|e| format!("running moneta: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "san up: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let dir = PathBuf::from(crate::mount::RUN_DIR).join(format!("san-{}", a.name));
    let sockets: Vec<PathBuf> = (0..a.nodes)
        .map(|i| dir.join(format!("n{i}/monetad.sock")))
        .collect();
    let global = connect(&sockets[0])
        .map_err(|e| format!("n0: {e}"))?
        .capacity_bytes();
    let slice = global / u64::from(a.nodes);
    // Blocks spread evenly over each slice, its first and last included.
    let (per, in_slice) = (a.blocks_per_slice, slice / BLOCK_BYTES as u64);
    let addrs: Vec<u64> = (0..u64::from(a.nodes))
        .flat_map(|s| {
            (0..per).map(move |k| {
                let within = if per > 1 {
                    k * (in_slice - 1) / (per - 1)
                } else {
                    0
                };
                s * slice + within * BLOCK_BYTES as u64
            })
        })
        .collect();
    let nodes = a.nodes as usize;
    let run = Run {
        seed,
        started: Instant::now(),
        blocks: addrs.iter().map(|_| Mutex::default()).collect(),
        addrs,
        sockets,
        stop: AtomicBool::new(false),
        ops: AtomicU64::new(0),
        max_ops: a.max_ops,
        strict: a.strict,
        counts: Mutex::default(),
        reports: Mutex::default(),
        nemesis_log: Mutex::default(),
        fenced: (0..nodes).map(|_| AtomicBool::new(false)).collect(),
        in_flight: (0..nodes).map(|_| AtomicU32::new(0)).collect(),
    };
    let mut nemesis = Nemesis {
        run: &run,
        exe: exe.clone(),
        name: a.name.clone(),
        nodes,
        clients_on: a.clients_on,
        max_cuts: a.max_cuts,
        faulted: vec![false; nodes],
        cut: vec![false; nodes],
        cut_links: Vec::new(),
        counts: BTreeMap::new(),
    };
    let deadline = run.started + Duration::from_secs(a.duration_s);
    let mut steps = 0u64;
    std::thread::scope(|s| {
        for t in 0..a.clients {
            let run = &run;
            s.spawn(move || client(run, t, a.clients));
        }
        let mut next_progress = Instant::now() + Duration::from_secs(10);
        for (pause, step) in schedule(seed, nodes, a.step_ms) {
            let wake = Instant::now() + Duration::from_millis(pause);
            while Instant::now() < wake.min(deadline) {
                if signal_received() || run.ops.load(Ordering::Relaxed) >= run.max_ops {
                    break;
                }
                if Instant::now() >= next_progress {
                    next_progress += Duration::from_secs(10);
                    let c = run.counts.lock().unwrap().clone();
                    eprintln!(
                        "[{:8.2} s] {} ops ({} writes acked, {} failed; {} reads checked, {} \
                         failed), nemesis steps {steps}, failures {:?}",
                        run.now(),
                        c.ops,
                        c.writes_ok,
                        c.writes_failed,
                        c.reads_checked,
                        c.reads_failed,
                        c.failures
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            if Instant::now() >= deadline
                || signal_received()
                || run.ops.load(Ordering::Relaxed) >= run.max_ops
            {
                break;
            }
            steps += 1;
            nemesis.step(&step);
        }
        run.stop.store(true, Ordering::Relaxed);
    });
    let elapsed = run.now();
    // Recovery, then every block through every node.
    let alive = nemesis.alive();
    nemesis.recover(0, &alive);
    for i in 0..nodes {
        run.fenced[i].store(false, Ordering::SeqCst);
    }
    let (final_reads, final_errors, examples) = final_reads(&run, &mut nemesis)?;
    let counts = run.counts.lock().unwrap().clone();
    let failed: u64 = counts.failures.values().sum();
    // The daemons' logs go with `san down --purge`: what a post-mortem
    // needs is copied first.
    let logs = match &a.keep_logs {
        Some(to) => Some(to.clone()),
        None if failed > 0 || final_errors > 0 => {
            Some(std::env::temp_dir().join(format!("moneta-san-chaos-{}-{seed}", a.name)))
        }
        None => None,
    };
    let logs = logs.map(|to| match keep_logs(&dir, nodes, &to) {
        Ok(()) => to.display().to_string(),
        Err(e) => format!("(not kept: {e})"),
    });
    drop(guard);
    let verdict = if failed > 0 {
        format!("FAIL: {failed} reads broke the register rule (seed {seed})")
    } else if final_errors > 0 {
        format!("FAIL: {final_errors} final reads failed after recovery (seed {seed})")
    } else if signal_received() {
        "interrupted".to_string()
    } else {
        "pass: every read returned an allowed version or an error".to_string()
    };
    let summary = Summary {
        seed,
        name: a.name.clone(),
        nodes: a.nodes,
        clients: a.clients,
        clients_on: a.clients_on,
        max_cuts: a.max_cuts,
        strict: a.strict,
        blocks: run.blocks.len(),
        duration_s: elapsed,
        counts,
        final_reads,
        final_errors,
        nemesis: nemesis.counts.clone(),
        failures_reported: run.reports.lock().unwrap().clone(),
        final_error_examples: examples,
        logs,
        verdict: verdict.clone(),
    };
    if a.json {
        crate::output::print_result_json(
            &summary,
            &crate::provenance::Provenance::here()
                .seed(summary.seed)
                .verdict(&verdict),
        )?;
    } else {
        print_summary(&summary);
    }
    if verdict.starts_with("pass") {
        Ok(())
    } else {
        Err(verdict)
    }
}

/// Copy what each node's directory holds besides its image and socket
/// (its daemon's log, its dirty map, its arguments) into `to`/n<i>/.
fn keep_logs(dir: &Path, nodes: usize, to: &Path) -> Result<(), String> {
    std::fs::create_dir(to).map_err(|e| format!("{}: {e}", to.display()))?;
    for i in 0..nodes {
        let (from, into) = (dir.join(format!("n{i}")), to.join(format!("n{i}")));
        std::fs::create_dir(&into).map_err(|e| format!("{}: {e}", into.display()))?;
        let entries = std::fs::read_dir(&from).map_err(|e| format!("{}: {e}", from.display()))?;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_file = entry.file_type().is_ok_and(|t| t.is_file());
            if !is_file || name == "device.img" {
                continue;
            }
            std::fs::copy(entry.path(), into.join(&name))
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
        }
    }
    Ok(())
}

/// After recovery: each block through each node, until every node serves
/// it (errors are retried until [`SETTLE`] runs out; a wrong version is a
/// failure at once).
fn final_reads(run: &Run, nemesis: &mut Nemesis) -> Result<(u64, u64, Vec<String>), String> {
    let nodes = run.sockets.len();
    let deadline = Instant::now() + SETTLE;
    let mut pending: Vec<(usize, usize)> = (0..nodes)
        .flat_map(|n| (0..run.blocks.len()).map(move |b| (n, b)))
        .collect();
    let mut reads = 0;
    let mut last_errors: BTreeMap<(usize, usize), String> = BTreeMap::new();
    let mut resolved_again = false;
    let mut buf = vec![0u8; BLOCK_BYTES];
    while !pending.is_empty() && Instant::now() < deadline && !signal_received() {
        let mut conns: Vec<Option<Moneta>> = run.sockets.iter().map(|s| connect(s).ok()).collect();
        let mut still = Vec::new();
        for &(n, b) in &pending {
            let Some(m) = conns[n].as_ref() else {
                last_errors.insert((n, b), "cannot connect".into());
                still.push((n, b));
                continue;
            };
            let floor = run.floor(b);
            match one_request(m, Op::Read, run.addrs[b], &mut buf) {
                Ok(()) => {
                    reads += 1;
                    run.check(b, n, floor, &buf, true);
                    last_errors.remove(&(n, b));
                }
                Err(e) => {
                    if e.kind != moneta::ErrorKind::Request {
                        conns[n] = None;
                    }
                    last_errors.insert((n, b), e.to_string());
                    still.push((n, b));
                }
            }
        }
        pending = still;
        if !pending.is_empty() {
            // A split brain that formed while recovering needs a resolve.
            if !resolved_again && !nemesis.split_brain_nodes().is_empty() {
                nemesis.resolve(0);
                resolved_again = true;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    let examples = last_errors
        .iter()
        .take(5)
        .map(|((n, b), e)| format!("block {b} via n{n}: {e}"))
        .collect();
    Ok((reads, pending.len() as u64, examples))
}

fn print_summary(s: &Summary) {
    let c = &s.counts;
    println!(
        "san chaos: seed {}, {} nodes, {} clients (on {:?}), {} blocks, {:.1} s",
        s.seed, s.nodes, s.clients, s.clients_on, s.blocks, s.duration_s
    );
    println!(
        "  operations {}: writes {} acknowledged, {} failed; reads {} checked, {} failed; \
         {} connections refused",
        c.ops, c.writes_ok, c.writes_failed, c.reads_checked, c.reads_failed, c.connect_failures
    );
    println!(
        "  reads that went back (an in-flight write seen, then the version before it): {}{}",
        c.went_back,
        if s.strict {
            ""
        } else {
            " (allowed without --strict)"
        }
    );
    for (k, n) in &c.errors {
        println!("  error {k}: {n}");
    }
    let nem: Vec<String> = s.nemesis.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("  nemesis: {}", nem.join(", "));
    println!(
        "  final reads after recovery: {} checked, {} failed",
        s.final_reads, s.final_errors
    );
    for e in &s.final_error_examples {
        println!("    {e}");
    }
    for (k, n) in &c.failures {
        println!("  FAILURES {k}: {n}");
    }
    for r in &s.failures_reported {
        println!("{r}");
    }
    if let Some(logs) = &s.logs {
        println!("  the daemons' logs and dirty maps: {logs}");
    }
    println!("  {}", s.verdict);
}

// ---------------------------------------------------------------- the simulator

/// `moneta san sim-protocol`: schedules of the deterministic simulator
/// (`moneta_emu::san_sim`), one after another from `--seed` (run k has
/// seed `seed + k`), until `--runs` or `--minutes`; a failing seed is
/// printed with the command that replays it (and, with `--shrink`, its
/// shortest failing schedule found).
#[derive(Args, Debug, Clone)]
pub struct SimProtocolArgs {
    /// The first schedule's seed [default: from the clock, printed].
    #[arg(long)]
    seed: Option<u64>,
    /// Schedules to run.
    #[arg(long, default_value_t = 1)]
    runs: u64,
    /// Run schedules for this long instead (wall clock), however many.
    #[arg(long)]
    minutes: Option<f64>,
    /// Start no schedule once this many operations (final reads
    /// included) were simulated; with `--minutes`, whichever comes first.
    #[arg(long)]
    max_ops: Option<u64>,
    /// Schedules run at once, one thread each (each schedule is one
    /// thread's run whatever the number: the same seed, the same trace).
    #[arg(long, default_value_t = 1)]
    jobs: usize,
    /// Client operations per schedule.
    #[arg(long, default_value_t = 2000)]
    ops: u64,
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// Blocks of the register model.
    #[arg(long, default_value_t = 24)]
    blocks: u64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: u64,
    /// Mean virtual milliseconds between nemesis steps (0: no nemesis).
    #[arg(long, default_value_t = 200)]
    step_ms: u64,
    /// Mean virtual microseconds a client waits between its operations.
    #[arg(long, default_value_t = 500)]
    think_us: u64,
    /// Nemesis steps to leave out, by index (a shrunk schedule's replay).
    #[arg(long, value_delimiter = ',')]
    skip_steps: Vec<u64>,
    /// Print each schedule's trace (and the nodes' log).
    #[arg(long)]
    trace: bool,
    /// Operator-made split brains: a force may take a copy whose partner
    /// is alive behind a cut, and both holders of a split brain are asked
    /// at once to discard their side (exactly one may be granted).
    #[arg(long)]
    split_brains: bool,
    /// On a failure, shrink it (at most this many more runs).
    #[arg(long, default_value_t = 0)]
    shrink: usize,
    /// Where the nodes' media live [default: /dev/shm/moneta-simproto-PID].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep going after a failing schedule.
    #[arg(long)]
    keep_going: bool,
}

pub fn sim_protocol(a: SimProtocolArgs) -> Result<(), String> {
    use moneta_emu::san_sim::{self, SimOptions};
    let seed = a.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let dir = a.dir.clone().unwrap_or_else(|| {
        PathBuf::from(format!("/dev/shm/moneta-simproto-{}", std::process::id()))
    });
    println!(
        "sim-protocol: seed {seed}, {} node(s), {} ops per schedule, step {} ms{}{}, {} job(s)",
        a.nodes,
        a.ops,
        a.step_ms,
        match (a.minutes, a.max_ops) {
            (Some(m), _) => format!(", for {m} min"),
            (None, Some(_)) => String::new(),
            (None, None) => format!(", {} schedule(s)", a.runs),
        },
        match a.max_ops {
            Some(n) => format!(", until {n} operations"),
            None => String::new(),
        },
        a.jobs
    );
    if a.jobs == 0 {
        return Err("--jobs must be at least 1".into());
    }
    let started = Instant::now();
    let deadline = a
        .minutes
        .map(|m| started + Duration::from_secs_f64(m * 60.0));
    let options = |k: u64, dir: &std::path::Path| {
        let mut o = SimOptions::new(seed.wrapping_add(k), a.ops, dir);
        o.nodes = a.nodes;
        o.blocks = a.blocks;
        o.clients = a.clients;
        o.step_ms = a.step_ms;
        o.think_us = a.think_us;
        o.skip_steps = a.skip_steps.iter().copied().collect();
        o.keep_trace = a.trace;
        o.split_brains = a.split_brains;
        o
    };
    // Workers take the next schedule's index while the budget lasts; the
    // main thread prints each report as it comes.
    let next = std::sync::atomic::AtomicU64::new(0);
    let simulated = std::sync::atomic::AtomicU64::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let budget_left = || {
        use std::sync::atomic::Ordering::Relaxed;
        !stop.load(Relaxed)
            && deadline.is_none_or(|d| Instant::now() < d)
            && a.max_ops.is_none_or(|m| simulated.load(Relaxed) < m)
    };
    let (mut runs, mut ops, mut failed) = (0u64, 0u64, 0u64);
    let mut steps: BTreeMap<String, u64> = BTreeMap::new();
    let mut virtual_ns = 0u64;
    let mut reads = 0u64;
    let mut error = None;
    std::thread::scope(|scope| {
        let (tx, rx) = std::sync::mpsc::channel();
        for j in 0..a.jobs {
            let tx = tx.clone();
            let (next, simulated, budget_left, options) =
                (&next, &simulated, &budget_left, &options);
            let dir = if a.jobs == 1 {
                dir.clone()
            } else {
                dir.join(format!("job{j}"))
            };
            scope.spawn(move || {
                use std::sync::atomic::Ordering::Relaxed;
                while budget_left() {
                    let k = next.fetch_add(1, Relaxed);
                    if deadline.is_none() && a.max_ops.is_none() && k >= a.runs {
                        break;
                    }
                    let o = options(k, &dir);
                    let r = san_sim::run(&o);
                    if let Ok(r) = &r {
                        simulated.fetch_add(r.ops + r.final_reads, Relaxed);
                    }
                    if tx.send((o, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(tx);
        for (o, r) in rx {
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    error = Some(e);
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    continue;
                }
            };
            runs += 1;
            ops += r.ops + r.final_reads;
            reads += r.reads_ok + r.final_reads;
            virtual_ns += r.virtual_ns;
            for (k, n) in &r.steps {
                *steps.entry(k.clone()).or_insert(0) += n;
            }
            for line in &r.trace {
                println!("{line}");
            }
            if r.violations.is_empty() {
                continue;
            }
            failed += 1;
            println!(
                "seed {}: {} violation(s); replay: moneta san sim-protocol --seed {} --ops {} \
                 --nodes {} --blocks {} --clients {} --step-ms {} --think-us {}{} --trace",
                o.seed,
                r.violations.len(),
                o.seed,
                o.ops,
                o.nodes,
                o.blocks,
                o.clients,
                o.step_ms,
                o.think_us,
                if o.split_brains {
                    " --split-brains"
                } else {
                    ""
                }
            );
            for v in r.violations.iter().take(10) {
                println!("  {v}");
            }
            if a.shrink > 0 {
                let mut so = o.clone();
                so.dir = dir.join("shrink");
                match san_sim::shrink(&so, a.shrink) {
                    Ok((s, sr)) => {
                        let skip: Vec<String> =
                            s.skip_steps.iter().map(|x| x.to_string()).collect();
                        println!(
                            "  shrunk: --ops {} --skip-steps {} ({} of {} steps left): {}",
                            s.ops,
                            if skip.is_empty() {
                                "''".into()
                            } else {
                                skip.join(",")
                            },
                            sr.steps_drawn.saturating_sub(s.skip_steps.len() as u64),
                            sr.steps_drawn,
                            sr.violations.first().cloned().unwrap_or_default()
                        );
                    }
                    Err(e) => println!("  shrink: {e}"),
                }
            }
            if !a.keep_going {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    });
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(e) = error {
        return Err(e);
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "sim-protocol: {runs} schedule(s) from seed {seed}, {failed} failing; {ops} operations \
         ({reads} reads checked), {:.1} s of virtual time, {:.1} s wall: {:.0} schedules/hour, \
         {:.0} operations/s",
        virtual_ns as f64 / 1e9,
        secs,
        runs as f64 / secs * 3600.0,
        ops as f64 / secs
    );
    let steps: Vec<String> = steps.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("nemesis: {}", steps.join(", "));
    if failed > 0 {
        return Err(format!("{failed} failing schedule(s)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_a_function_of_the_seed() {
        let a: Vec<_> = schedule(11, 3, 1000).take(200).collect();
        let b: Vec<_> = schedule(11, 3, 1000).take(200).collect();
        let c: Vec<_> = schedule(12, 3, 1000).take(200).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // Every kind of step comes, links are between two distinct nodes.
        for kind in [
            "Kill",
            "Restart",
            "Partition(",
            "PartitionLink",
            "Heal",
            "Lossy",
            "Resolve",
            "Recover",
        ] {
            assert!(
                a.iter().any(|(_, s)| format!("{s:?}").starts_with(kind)),
                "{kind}"
            );
        }
        for (pause, s) in &a {
            assert!((500..1500).contains(pause));
            if let Step::PartitionLink(x, y) = s {
                assert_ne!(x, y);
            }
        }
    }
}
