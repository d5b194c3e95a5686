//! The deterministic simulator of the SAN's replica protocol (issue 39
//! item 6, after TigerBeetle's VOPR and FoundationDB's simulator; SPEC
//! §4.3, README "Replica states and split brain", "Leases and the
//! tie-breaker for a cut link").
//!
//! Every node is the daemon's own device logic with its port
//! (`engine::sim::SimNode`: liveness, leases, resync, resolves, the dirty
//! map and the replica metadata, the code `monetad` runs), on one thread,
//! over the in-memory wire (`moneta_wire::mem`) with the daemon's fault
//! injector (`moneta_wire::Faulty`) on every port, on a virtual clock the
//! simulator advances. Nothing else decides what happens: the seed draws
//! the clients' operations and the nemesis's schedule, so a run is a
//! function of (seed, options), and its trace (every operation, its outcome,
//! every nemesis step) hashes to the same value each time (`SimReport::
//! trace_hash`).
//!
//! The nemesis (one step every `step_ms/2 .. 3 step_ms/2` of virtual time,
//! each tenth a recovery): kill (drop the node: what it held in memory is
//! gone, its image, replica metadata and dirty map stay), restart, replace
//! the disk (kill, then remove the image and dirty map: the node comes
//! back blank), cut a node off or one link, heal, a lossy link, fill the
//! dirty map's disk (ENOSPC) and empty it, `resolve --discard` of a split
//! brain side, `resolve --force` of a node's outdated copies. What a step
//! does depends on the SAN's state when it comes (at most one node down on
//! three; a disk is replaced only while every copy is in sync, so the
//! other copy holds everything: otherwise the data is gone for real).
//!
//! The oracle is the chaos checker's register model (`register`): every
//! block has one writer; a read must return one whole version between the
//! floor it began at and the newest started. A `--force` that succeeds
//! is an operator accepting the loss of what the forced copy missed: the
//! blocks of the forced slices start again from no floor (a read of them
//! must still be one whole version). After the run every fault is healed,
//! every node restarted and every split brain resolved, and each block is
//! read through every node: the same rule, and a read that still fails
//! after `SETTLE_NS` is a violation (the SAN did not come back), as is any
//! request that stays unanswered for `HUNG_NS` on a live node.
//!
//! A failing seed replays exactly; `shrink` then drops nemesis steps and
//! operations while the run still fails, to the shortest schedule.

use crate::dirty::DirtyMap;
use crate::engine::sim::{self, SimNode, SimResult};
use crate::medium::Medium;
use crate::register::{block_content, decode, judge, resolve_target, Floor, Verdict, BLOCK_BYTES};
use crate::replica_meta::ReplicaMeta;
use crate::san_file::{PortParts, SanFile};
use moneta_model::config::Config;
use moneta_model::kernel::hash::{fnv1a_extend, FNV1A_OFFSET};
use moneta_model::kernel::rng::Rng;
use moneta_model::units::{Ns, Op};
use moneta_wire::mem::MemWire;
use moneta_wire::{FaultHandle, LinkFaults};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

/// Each SSD's capacity.
const DEVICE_BYTES: u64 = 1 << 20;
/// One way on the in-memory wire.
const WIRE_LATENCY_NS: Ns = 5_000;
const MTU_BYTES: usize = 9000;
/// Virtual time per turn of every node after a turn in which any node
/// worked or while a frame is on the wire (it arrives `WIRE_LATENCY_NS`
/// later). After a turn in which none worked, the next step doubles, up
/// to `QUIET_TICK_NS` (the ports' timers run at ≥ 1 ms, retransmission,
/// and 10 ms, heartbeats: a timer fires at most that late, as on a busy
/// host), and never past the next thing due that the simulator knows of
/// (a node's model event or held command, a client's next operation, the
/// nemesis's next step, a final read's retry). So a request that waits
/// out the 1 s silence bound costs thousands of turns, not 100,000.
const TICK_NS: Ns = 10_000;
const QUIET_TICK_NS: Ns = 1_000_000;
/// A request unanswered this long on a node that stayed up hangs.
const HUNG_NS: Ns = 20_000_000_000;
/// After the run: how long the healed SAN may take to serve every block.
const SETTLE_NS: Ns = 60_000_000_000;
/// A failed final read is tried again after this long.
const FINAL_RETRY_NS: Ns = 50_000_000;
/// After a recovery, the resolve comes this much later (the peers meet
/// again within the silence bound; then a split brain is known).
const RECOVER_RESOLVE_NS: Ns = 1_500_000_000;
/// An operator making a split brain (`SimOptions::split_brains`) cuts a
/// node off and forces its copies this much later: past the lease (half
/// the wire's 1 s silence bound) and the tie-breaker's grace, when the cut
/// node's copies are outdated (it reaches no majority) and its partners'
/// go on alone.
const SPLIT_FORCE_NS: Ns = 1_500_000_000;
/// And then leaves both sides writing this long before anything heals,
/// kills or fills a disk (a kill of a third node would take the majority
/// from the partner's side, which then writes nothing: no split brain).
const SPLIT_WRITE_NS: Ns = 1_000_000_000;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub seed: u64,
    pub nodes: u16,
    /// Client operations to issue (reads and writes), final reads apart.
    pub ops: u64,
    /// Blocks of the register model, spread over the global space.
    pub blocks: u64,
    /// Clients, each with at most one operation in flight.
    pub clients: u64,
    /// Mean virtual time between nemesis steps; 0: no nemesis.
    pub step_ms: u64,
    /// Mean virtual time a client waits between its operations.
    pub think_us: u64,
    /// Nemesis steps (by index) replaced by nothing (the shrinker's).
    pub skip_steps: BTreeSet<u64>,
    /// Where the nodes' media live (a directory this run owns: removed
    /// and made again).
    pub dir: PathBuf,
    /// Keep the trace's lines (and the ports' log) in the report.
    pub keep_trace: bool,
    /// Operator-made split brains: a `Force` step may also force an
    /// outdated copy whose partner is alive behind a cut (both sides then
    /// write), and a `Resolve` step on a slice in split brain on both
    /// holders sends both contradicting `resolve --discard`s at once (one
    /// must be granted, the other refused). Off, the schedules of a seed
    /// are the ones found before this existed.
    pub split_brains: bool,
}

impl SimOptions {
    pub fn new(seed: u64, ops: u64, dir: &Path) -> SimOptions {
        SimOptions {
            seed,
            nodes: 3,
            ops,
            blocks: 24,
            clients: 4,
            step_ms: 200,
            think_us: 500,
            skip_steps: BTreeSet::new(),
            dir: dir.to_path_buf(),
            keep_trace: false,
            split_brains: false,
        }
    }
}

/// What a run did and found.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    pub seed: u64,
    pub ops: u64,
    pub writes_ok: u64,
    pub writes_failed: u64,
    pub reads_ok: u64,
    pub reads_failed: u64,
    /// Operations of a node killed under them (no answer, by design).
    pub ops_lost_with_node: u64,
    pub went_back: u64,
    pub final_reads: u64,
    /// Nemesis steps taken, by kind.
    pub steps: BTreeMap<String, u64>,
    /// Nemesis steps drawn (the shrinker's indices run below this).
    pub steps_drawn: u64,
    pub violations: Vec<String>,
    pub virtual_ns: Ns,
    /// Turns of every node (steps of the virtual clock).
    pub turns: u64,
    /// FNV-1a of every trace line: equal for equal (seed, options).
    pub trace_hash: u64,
    pub trace: Vec<String>,
}

/// One step of the schedule: a function of the seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Kill(u16),
    Restart(u16),
    /// Kill, and replace its disk: image and dirty map removed.
    ReplaceDisk(u16),
    /// Cut a node off from every peer.
    Partition(u16),
    /// Cut one link.
    PartitionLink(u16, u16),
    Heal(u16),
    Lossy(u16, usize),
    /// The dirty map's disk refuses writes (ENOSPC) / takes them again.
    DiskFull(u16),
    DiskOk(u16),
    /// `resolve --discard` on the k-th node reporting a split brain.
    Resolve(usize),
    /// `resolve --force` on a node.
    Force(u16),
    /// Heal everything, restart every node, then resolve split brains.
    Recover(usize),
}

const LOSSY: [&str; 4] = [
    "drop=2%,corrupt=0.5%",
    "drop=1%,corrupt=0.1%,reorder=5%,reorder-us=50,duplicate=1%",
    "corrupt=2%",
    "drop=10%,delay-us=200,jitter-us=100",
];

/// The schedule of `seed` on `nodes` nodes: (pause before, step), endless.
pub fn schedule(seed: u64, nodes: u16, step_ms: u64) -> impl Iterator<Item = (Ns, Step)> {
    let mut rng = Rng::stream(seed, 1);
    let n = u64::from(nodes);
    (0u64..).map(move |i| {
        // Always five draws, whatever the step: the stream stays aligned.
        let pause = (step_ms / 2 + rng.below(step_ms.max(1))) * 1_000_000;
        let kind = rng.below(100);
        let a = rng.below(n) as u16;
        let b = ((u64::from(a) + 1 + rng.below(n - 1)) % n) as u16;
        let k = rng.below(64) as usize;
        let step = if i % 10 == 9 {
            Step::Recover(k)
        } else {
            match kind {
                0..13 => Step::Kill(a),
                13..28 => Step::Restart(a),
                28..33 => Step::ReplaceDisk(a),
                33..43 => Step::Partition(a),
                43..51 => Step::PartitionLink(a, b),
                51..65 => Step::Heal(a),
                65..73 => Step::Lossy(a, k % LOSSY.len()),
                73..78 => Step::DiskFull(a),
                78..84 => Step::DiskOk(a),
                84..94 => Step::Resolve(k),
                _ => Step::Force(a),
            }
        };
        (pause, step)
    })
}

/// What the checker knows of one block.
#[derive(Default, Clone, Copy)]
struct Block {
    acked: u64,
    started: u64,
    read: u64,
    /// Bumped by each `--force` of its slice (a read that began before
    /// has no floor).
    forced: u64,
    /// Two sides write it (an operator forced a copy whose partner was
    /// alive): no single history, no floor, until a resolve is granted.
    split: bool,
    /// The version the first final read returned, and through which node:
    /// after the final recovery both copies are one (every other final
    /// read must return it).
    settled: Option<(u64, u16)>,
}

/// A client's operation in flight.
#[derive(Clone, Copy)]
struct Pending {
    client: u64,
    block: u64,
    op: Op,
    version: u64,
    floor: Floor,
    forced: u64,
    since: Ns,
    /// A final read (after the run).
    final_read: bool,
}

/// A `resolve --discard`'s answer, when it comes.
type ResolveAnswer = mpsc::Receiver<Result<String, String>>;

struct Node {
    sim: Option<SimNode>,
    faults: FaultHandle,
    image: PathBuf,
    dirty: PathBuf,
    /// Initialized once (`moneta san up`); a replaced disk is not.
    initialized: bool,
    disk_full: bool,
    epoch: u32,
    /// Tag → operation.
    pending: BTreeMap<u8, Pending>,
    /// Faults on its links (for heal).
    faulted: bool,
    /// `resolve --discard` answers awaited, with the slices in split
    /// brain here when it was asked, and the contest it belongs to.
    resolves: Vec<(ResolveAnswer, Vec<u32>, Option<usize>)>,
}

struct Sim<'a> {
    o: &'a SimOptions,
    file: SanFile,
    config: Config,
    wire: MemWire,
    nodes: Vec<Node>,
    now: Ns,
    rng: Rng,
    blocks: Vec<Block>,
    addr: Vec<u64>,
    slice_bytes: u64,
    /// Which clients have an operation in flight, and when each may
    /// issue its next.
    client_busy: Vec<bool>,
    client_next: Vec<Ns>,
    issued: u64,
    report: SimReport,
    buf: Vec<u8>,
    done: Vec<(u8, SimResult)>,
    /// Cut links in force (for the one-cut bound).
    cuts: BTreeSet<(u16, u16)>,
    /// Final reads still owed (block, node), tried again at `final_retry`.
    final_pending: Vec<(u64, u16)>,
    final_retry: Ns,
    /// A recovery's resolve, due then.
    recover_resolve: Option<(Ns, usize)>,
    /// Contradicting resolves sent at once: the slice and each side's
    /// answer (granted or not) as it comes.
    contests: Vec<(u32, [Option<bool>; 2])>,
    /// The nemesis's next step, due then (`u64::MAX`: none).
    step_at: Ns,
    /// The last step of the virtual clock (`advance`).
    step_ns: Ns,
    /// An operator making a split brain: the node cut off, and when its
    /// outdated copies are forced (`SPLIT_FORCE_NS`). Until then nothing
    /// heals it.
    split_plan: Option<(Ns, u16)>,
    /// After its force, until when the split brain's two sides write.
    split_hold: Ns,
}

fn san_text(nodes: u16) -> String {
    let mut s = format!(
        "name = \"replsimx\"\ntopology = \"distributed\"\nmirror = true\ntransport = \"udp\"\n\
         device_capacity_bytes = {DEVICE_BYTES}\n"
    );
    for i in 0..nodes {
        s += &format!(
            "[[node]]\nname = \"n{i}\"\nmac = \"02:4d:4f:00:00:{i:02x}\"\n\
             udp = \"127.0.0.1:{}\"\n",
            17700 + i
        );
    }
    s
}

impl<'a> Sim<'a> {
    fn new(o: &'a SimOptions) -> Result<Sim<'a>, String> {
        if o.nodes < 3 {
            return Err("the simulator needs at least 3 nodes (a majority)".into());
        }
        let file = SanFile::parse(&san_text(o.nodes)).map_err(|e| e.to_string())?;
        let mut config = Config::preset("quicksan-ssd").map_err(|e| e.to_string())?;
        config.device.capacity_bytes = DEVICE_BYTES;
        config.validate().map_err(|e| e.to_string())?;
        let map = file.address_map().map_err(|e| e.to_string())?;
        let global = map.capacity_bytes();
        let stride = (global / o.blocks.max(1)) / BLOCK_BYTES as u64 * BLOCK_BYTES as u64;
        if stride == 0 {
            return Err(format!("{} blocks do not fit {global} bytes", o.blocks));
        }
        let _ = std::fs::remove_dir_all(&o.dir);
        std::fs::create_dir_all(&o.dir).map_err(|e| format!("{}: {e}", o.dir.display()))?;
        let nodes = (0..o.nodes)
            .map(|i| Node {
                sim: None,
                faults: FaultHandle::new(),
                image: o.dir.join(format!("n{i}.img")),
                dirty: o.dir.join(format!("n{i}.dirty")),
                initialized: false,
                disk_full: false,
                epoch: 0,
                pending: BTreeMap::new(),
                faulted: false,
                resolves: Vec::new(),
            })
            .collect();
        Ok(Sim {
            o,
            slice_bytes: map.slice_bytes(),
            file,
            config,
            wire: MemWire::new(o.nodes, WIRE_LATENCY_NS),
            nodes,
            now: 0,
            rng: Rng::stream(o.seed, 2),
            blocks: vec![Block::default(); o.blocks as usize],
            addr: (0..o.blocks).map(|b| b * stride).collect(),
            client_busy: vec![false; o.clients as usize],
            client_next: vec![0; o.clients as usize],
            issued: 0,
            report: SimReport {
                seed: o.seed,
                trace_hash: FNV1A_OFFSET,
                ..SimReport::default()
            },
            buf: vec![0; BLOCK_BYTES],
            done: Vec::new(),
            cuts: BTreeSet::new(),
            final_pending: Vec::new(),
            final_retry: 0,
            recover_resolve: None,
            contests: Vec::new(),
            step_at: u64::MAX,
            step_ns: TICK_NS,
            split_plan: None,
            split_hold: 0,
        })
    }

    fn trace(&mut self, line: String) {
        let line = format!("{:>14} {line}", self.now);
        self.report.trace_hash = fnv1a_extend(self.report.trace_hash, line.as_bytes());
        self.report.trace_hash = fnv1a_extend(self.report.trace_hash, b"\n");
        if self.o.keep_trace {
            self.report.trace.push(line);
        }
    }

    fn violation(&mut self, what: String) {
        self.trace(format!("VIOLATION {what}"));
        let t = self.now;
        self.report
            .violations
            .push(format!("t={:.6} s: {what}", t as f64 / 1e9));
    }

    fn alive(&self, i: u16) -> bool {
        self.nodes[i as usize].sim.is_some()
    }

    fn down(&self) -> usize {
        self.nodes.iter().filter(|n| n.sim.is_none()).count()
    }

    /// Start node `i` on its files (`san up` the first time, `san restart`
    /// after).
    fn start(&mut self, i: u16) -> Result<(), String> {
        let n = &mut self.nodes[i as usize];
        let slices = self.file.mirrored_slices(i).map_err(|e| e.to_string())?;
        if !n.initialized {
            ReplicaMeta::initialize(&n.image, DEVICE_BYTES, &self.file.name, i, &slices)
                .map_err(|e| format!("n{i}: {e}"))?;
            n.initialized = true;
        }
        let medium = Medium::image(&n.image, DEVICE_BYTES).map_err(|e| format!("n{i}: {e}"))?;
        let meta = ReplicaMeta::load(&n.image, DEVICE_BYTES, &self.file.name, i, &slices)
            .map_err(|e| format!("n{i}: {e}"))?;
        let mut dirty = DirtyMap::load(&n.dirty).map_err(|e| format!("n{i}: {e}"))?;
        dirty.set_full(n.disk_full);
        // A newer incarnation has a newer epoch (the daemon's is its
        // start's wall-clock millisecond).
        n.epoch = n.epoch.max((self.now / 1_000_000) as u32).saturating_add(1);
        self.wire.drop_inbox(i);
        let parts = PortParts {
            dirty,
            meta,
            secret: None,
            epoch: Some(n.epoch),
        };
        let port = self
            .file
            .port_on(
                i,
                Box::new(self.wire.port(i, MTU_BYTES)),
                n.faults.clone(),
                parts,
                self.now,
            )
            .map_err(|e| e.to_string())?;
        let mut node = SimNode::start(
            self.config.clone(),
            medium,
            port,
            self.o.seed ^ u64::from(i),
            self.now,
        )
        .map_err(|e| format!("n{i}: {e}"))?;
        node.set_dirty_disk_full(n.disk_full);
        n.sim = Some(node);
        self.trace(format!(
            "start n{i} (epoch {})",
            self.nodes[i as usize].epoch
        ));
        Ok(())
    }

    /// Kill node `i`: its operations in flight get no answer.
    fn kill(&mut self, i: u16) {
        let n = &mut self.nodes[i as usize];
        n.sim = None;
        n.resolves.clear();
        let lost: Vec<Pending> = std::mem::take(&mut n.pending).into_values().collect();
        self.wire.drop_inbox(i);
        for p in lost {
            self.report.ops_lost_with_node += 1;
            if !p.final_read {
                self.client_free(p.client);
            }
            if p.final_read {
                self.final_pending.push((p.block, i));
            }
        }
    }
}

impl Sim<'_> {
    fn client_free(&mut self, c: u64) {
        self.client_busy[c as usize] = false;
        let think = self.rng.below(2 * self.o.think_us * 1000 + 1);
        self.client_next[c as usize] = self.now + think;
    }

    /// Issue client operations while clients are free and ops remain.
    fn issue(&mut self) {
        for c in 0..self.o.clients {
            if self.client_busy[c as usize]
                || self.issued >= self.o.ops
                || self.now < self.client_next[c as usize]
            {
                continue;
            }
            let alive: Vec<u16> = (0..self.o.nodes).filter(|&i| self.alive(i)).collect();
            let node = alive[self.rng.below(alive.len() as u64) as usize];
            // The client writes its own blocks (one writer per block) and
            // reads any.
            let write = self.rng.below(2) == 0;
            let block = if write {
                let own = (self.o.blocks - c).div_ceil(self.o.clients);
                c + self.rng.below(own.max(1)) * self.o.clients
            } else {
                self.rng.below(self.o.blocks)
            };
            if block >= self.o.blocks {
                continue;
            }
            self.issue_one(c, node, block, write, false);
        }
    }

    fn issue_one(&mut self, client: u64, node: u16, block: u64, write: bool, final_read: bool) {
        let st = self.blocks[block as usize];
        let addr = self.addr[block as usize];
        let n = &mut self.nodes[node as usize];
        let sim = n.sim.as_mut().expect("an alive node");
        let Some(tag) = sim.free_tag() else {
            return;
        };
        let (op, version) = if write {
            let v = st.started + 1;
            self.buf = block_content(self.o.seed, block, v);
            (Op::Write, v)
        } else {
            self.buf.iter_mut().for_each(|b| *b = 0);
            (Op::Read, 0)
        };
        if let Err(e) = sim.submit(tag, op, addr, &self.buf) {
            let msg = format!("n{node}: a client's submit failed: {e}");
            self.violation(msg);
            return;
        }
        n.pending.insert(
            tag,
            Pending {
                client,
                block,
                op,
                version,
                floor: Floor {
                    acked: st.acked,
                    read: st.read,
                },
                forced: st.forced,
                since: self.now,
                final_read,
            },
        );
        if write {
            self.blocks[block as usize].started = version;
        }
        if !final_read {
            self.client_busy[client as usize] = true;
            self.issued += 1;
            self.report.ops += 1;
        }
        self.trace(format!(
            "n{node} issue {} block {block}{}",
            if write { "write" } else { "read" },
            if write {
                format!(" v{version}")
            } else {
                String::new()
            }
        ));
    }

    /// Turn every live node once; returns whether any worked.
    fn turn_all(&mut self) -> bool {
        let mut worked = false;
        for i in 0..self.o.nodes {
            let Some(sim) = self.nodes[i as usize].sim.as_mut() else {
                continue;
            };
            worked |= sim.turn(self.now);
            let mut done = std::mem::take(&mut self.done);
            sim.completed(&mut done);
            for (tag, result) in done.drain(..) {
                self.complete(i, tag, result);
            }
            self.done = done;
        }
        worked
    }

    fn complete(&mut self, node: u16, tag: u8, result: SimResult) {
        let Some(p) = self.nodes[node as usize].pending.remove(&tag) else {
            return;
        };
        if !p.final_read {
            self.client_free(p.client);
        }
        let b = p.block as usize;
        match (p.op, result) {
            (Op::Write, Ok(())) => {
                self.report.writes_ok += 1;
                let st = &mut self.blocks[b];
                st.acked = st.acked.max(p.version);
                self.trace(format!("n{node} write block {} v{} ok", p.block, p.version));
            }
            (Op::Write, Err(code)) => {
                self.report.writes_failed += 1;
                self.trace(format!(
                    "n{node} write block {} v{} failed: {code:?}",
                    p.block, p.version
                ));
            }
            (Op::Read, Err(code)) => {
                self.trace(format!("n{node} read block {} failed: {code:?}", p.block));
                if p.final_read {
                    self.final_pending.push((p.block, node));
                } else {
                    self.report.reads_failed += 1;
                }
            }
            (Op::Read, Ok(())) => {
                let mut got = vec![0u8; BLOCK_BYTES];
                self.nodes[node as usize]
                    .sim
                    .as_ref()
                    .expect("alive")
                    .read_data(tag, &mut got);
                let st = self.blocks[b];
                let floor = if p.forced == st.forced && !st.split {
                    p.floor
                } else {
                    Floor { acked: 0, read: 0 }
                };
                let decoded = decode(self.o.seed, p.block, &got);
                let verdict = judge(floor, st.started, &decoded);
                self.trace(format!("n{node} read block {} → {verdict:?}", p.block));
                if p.final_read {
                    self.report.final_reads += 1;
                } else {
                    self.report.reads_ok += 1;
                }
                if let (true, Verdict::Fine(v) | Verdict::WentBack { got: v, .. }) =
                    (p.final_read, &verdict)
                {
                    self.settle(p.block, *v, node);
                }
                match verdict {
                    Verdict::Fine(v) => {
                        let st = &mut self.blocks[b];
                        st.read = st.read.max(v);
                    }
                    Verdict::WentBack { .. } => self.report.went_back += 1,
                    v => self.violation(format!(
                        "{} read of block {} (global {:#x}) through n{node}: {v:?} \
                         (floor acked {} read {}, started {})",
                        v.kind(),
                        p.block,
                        self.addr[b],
                        floor.acked,
                        floor.read,
                        st.started
                    )),
                }
            }
        }
    }

    /// After the final recovery both copies are one: every final read of
    /// `block` returns the version the first returned.
    fn settle(&mut self, block: u64, v: u64, node: u16) {
        match self.blocks[block as usize].settled {
            None => self.blocks[block as usize].settled = Some((v, node)),
            Some((w, first)) if w != v => self.violation(format!(
                "copies differ after the final recovery: block {block} reads v{w} through \
                 n{first} and v{v} through n{node}"
            )),
            Some(_) => {}
        }
    }

    fn hung(&mut self) {
        for i in 0..self.o.nodes {
            let old: Vec<(u8, Pending)> = self.nodes[i as usize]
                .pending
                .iter()
                .filter(|(_, p)| self.now.saturating_sub(p.since) > HUNG_NS)
                .map(|(&t, &p)| (t, p))
                .collect();
            for (tag, p) in old {
                // Reported once: its clock starts again.
                if let Some(q) = self.nodes[i as usize].pending.get_mut(&tag) {
                    q.since = self.now;
                }
                self.violation(format!(
                    "n{i}: a {:?} of block {} unanswered for {} s",
                    p.op,
                    p.block,
                    HUNG_NS / 1_000_000_000
                ));
            }
        }
    }
}

impl Sim<'_> {
    /// The next time something the simulator knows of is due.
    fn next_due(&self) -> Ns {
        let mut due = self.step_at;
        for n in &self.nodes {
            if let Some(t) = n.sim.as_ref().and_then(SimNode::next_due) {
                due = due.min(t);
            }
        }
        if self.issued < self.o.ops {
            for (c, &busy) in self.client_busy.iter().enumerate() {
                if !busy {
                    due = due.min(self.client_next[c]);
                }
            }
        }
        if !self.final_pending.is_empty() {
            due = due.min(self.final_retry);
        }
        if let Some((t, _)) = self.recover_resolve {
            due = due.min(t);
        }
        if let Some((t, _)) = self.split_plan {
            due = due.min(t);
        }
        due
    }

    /// Move the virtual clock on (`TICK_NS`).
    fn advance(&mut self, worked: bool) {
        self.report.turns += 1;
        self.step_ns = if worked || self.wire.in_flight() > 0 {
            TICK_NS
        } else {
            (self.step_ns * 2).min(QUIET_TICK_NS)
        };
        let due = self.next_due().max(self.now + TICK_NS);
        self.now = (self.now + self.step_ns).min(due);
    }

    fn resolves(&mut self) {
        for i in 0..self.o.nodes {
            type Answer = (Result<String, String>, Vec<u32>, Option<usize>);
            let answers: Vec<Answer> = {
                let n = &mut self.nodes[i as usize];
                let mut got = Vec::new();
                n.resolves
                    .retain(|(rx, slices, contest)| match rx.try_recv() {
                        Ok(a) => {
                            got.push((a, slices.clone(), *contest));
                            false
                        }
                        Err(mpsc::TryRecvError::Empty) => true,
                        Err(mpsc::TryRecvError::Disconnected) => false,
                    });
                got
            };
            for (a, slices, contest) in answers {
                // A granted `--discard` gives up what this side wrote alone
                // on its split-brain slices (DRBD's discard-my-data): the
                // other side's copy is resynced over it.
                if a.is_ok() {
                    self.give_up(&slices);
                    self.unsplit(&slices);
                }
                self.trace(format!("n{i} resolve answered: {a:?} (slices {slices:?})"));
                if let Some(c) = contest {
                    self.contest_answer(c, a.is_ok());
                }
            }
        }
    }

    fn split_brain_nodes(&self) -> Vec<u16> {
        (0..self.o.nodes)
            .filter(|&i| {
                self.nodes[i as usize]
                    .sim
                    .as_ref()
                    .is_some_and(|s| s.slices().iter().any(|x| x.state == "split-brain"))
            })
            .collect()
    }

    /// One side's answer in contest `c` (`resolve_contested`): once both
    /// have answered, two grants are a violation (the first's winner would
    /// lose its acknowledged writes to the second).
    fn contest_answer(&mut self, c: usize, granted: bool) {
        let Some((slice, answers)) = self.contests.get_mut(c) else {
            return;
        };
        let slice = *slice;
        // Each holder answers once per contest: the first answer, then
        // the second.
        let side = usize::from(answers[0].is_some());
        answers[side] = Some(granted);
        if let [Some(a), Some(b)] = *answers {
            match (a, b) {
                (true, true) => self.violation(format!(
                    "two contradicting resolves of slice {slice}'s split brain were both granted"
                )),
                (true, false) | (false, true) => self.did(
                    "resolve-decided",
                    format!("slice {slice}: one resolve granted"),
                ),
                (false, false) => self.did(
                    "resolve-both-refused",
                    format!("slice {slice}: both contradicting resolves refused"),
                ),
            }
        }
    }

    /// The node an operator making split brains forces, from `i` on: the
    /// first live one with an outdated copy (`i` if none has).
    fn force_target(&self, i: u16) -> u16 {
        (0..self.o.nodes)
            .map(|k| (i + k) % self.o.nodes)
            .find(|&j| !self.slices_in(j, "outdated").is_empty())
            .unwrap_or(i)
    }

    /// The blocks of `slices` have one history again (a granted resolve).
    fn unsplit(&mut self, slices: &[u32]) {
        for b in 0..self.o.blocks as usize {
            if slices.contains(&((self.addr[b] / self.slice_bytes) as u32)) {
                self.blocks[b].split = false;
            }
        }
    }

    /// Both holders of a slice in split brain on both are asked at once to
    /// discard their own side (`SimOptions::split_brains`). Returns whether
    /// there was such a slice.
    fn resolve_contested(&mut self, k: usize) -> bool {
        let mut both: Vec<(u32, [u16; 2])> = Vec::new();
        for i in 0..self.o.nodes {
            let Some(sim) = self.nodes[i as usize].sim.as_ref() else {
                continue;
            };
            for x in sim.slices() {
                if x.state == "split-brain"
                    && i < x.partner
                    && self.slices_in(x.partner, "split-brain").contains(&x.slice)
                {
                    both.push((x.slice, [i, x.partner]));
                }
            }
        }
        if both.is_empty() {
            return false;
        }
        let (slice, holders) = both[k % both.len()];
        let c = self.contests.len();
        self.contests.push((slice, [None, None]));
        // The order the two requests are made in comes from the seed too.
        let order = if (k / both.len()).is_multiple_of(2) {
            [0, 1]
        } else {
            [1, 0]
        };
        for side in order {
            let node = holders[side];
            let n = &mut self.nodes[node as usize];
            let rx = n.sim.as_mut().expect("alive").discard(Some(slice as usize));
            n.resolves.push((rx, vec![slice], Some(c)));
        }
        self.did(
            "resolve-contested",
            format!(
                "resolve --discard n{} and --discard n{} --slice {slice} at once",
                holders[order[0]], holders[order[1]]
            ),
        );
        true
    }

    fn resolve(&mut self, k: usize) {
        if self.o.split_brains && self.resolve_contested(k) {
            return;
        }
        let Some(node) = resolve_target(&self.split_brain_nodes(), k) else {
            self.did("resolve-none", "resolve: no split brain".into());
            return;
        };
        let slices = self.slices_in(node, "split-brain");
        let n = &mut self.nodes[node as usize];
        let rx = n.sim.as_mut().expect("alive").discard(None);
        n.resolves.push((rx, slices, None));
        self.did("resolve", format!("resolve --discard n{node}"));
    }

    fn all_in_sync(&self) -> bool {
        self.nodes.iter().all(|n| {
            n.sim.as_ref().is_some_and(|s| {
                s.slices()
                    .iter()
                    .all(|x| x.state == "up-to-date" && x.partner_up && x.to_send == 0)
            })
        })
    }

    fn did(&mut self, kind: &str, what: String) {
        *self.report.steps.entry(kind.to_string()).or_insert(0) += 1;
        self.trace(format!("nemesis {what}"));
    }

    fn set_partition(&mut self, i: u16, peer: Option<u16>) {
        let h = self.nodes[i as usize].faults.clone();
        match peer {
            Some(p) => {
                h.partition(p, true);
                self.cuts.insert((i, p));
            }
            None => {
                for p in (0..self.o.nodes).filter(|&p| p != i) {
                    h.partition(p, true);
                    self.cuts.insert((i, p));
                }
            }
        }
        self.nodes[i as usize].faulted = true;
    }

    fn heal(&mut self, i: u16) {
        self.nodes[i as usize].faults.clear();
        self.nodes[i as usize].faulted = false;
        self.cuts.retain(|&(a, _)| a != i);
    }

    /// The slices of node `i` in `state`.
    fn slices_in(&self, i: u16, state: &str) -> Vec<u32> {
        self.nodes[i as usize]
            .sim
            .as_ref()
            .map(|s| {
                s.slices()
                    .iter()
                    .filter(|x| x.state == state)
                    .map(|x| x.slice)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The operator gave up what the copies of `slices` held that the
    /// copy now serving them lacks (`--force`, a granted `--discard`): the
    /// blocks of those slices start again from no floor; a read that began
    /// before has none either.
    fn give_up(&mut self, slices: &[u32]) {
        for b in 0..self.o.blocks as usize {
            if slices.contains(&((self.addr[b] / self.slice_bytes) as u32)) {
                let st = &mut self.blocks[b];
                st.acked = 0;
                st.read = 0;
                st.forced += 1;
            }
        }
    }

    /// `resolve --force` on node `i` (with operator-made split brains, on
    /// the first live node from `i` on with an outdated copy).
    fn force_step(&mut self, i: u16) -> Result<(), String> {
        let i = if self.o.split_brains {
            self.force_target(i)
        } else {
            i
        };
        // The operator forces a copy whose partner is down (the
        // force's contract: "it may lack writes the partner
        // acknowledged before it went down"). A partner that is
        // alive behind a cut would go on writing too: two sides
        // taking writes, a split brain by the operator's choice,
        // which no single history of a block describes.
        let outdated: Vec<(u32, u16)> = self.nodes[i as usize]
            .sim
            .as_ref()
            .expect("alive")
            .slices()
            .iter()
            .filter(|x| x.state == "outdated")
            .map(|x| (x.slice, x.partner))
            .collect();
        let mut partner_down: Vec<u32> = outdated
            .iter()
            .filter(|&&(_, p)| !self.alive(p))
            .map(|&(s, _)| s)
            .collect();
        // With operator-made split brains, a partner alive behind
        // a cut too: the force's own check (the partner is
        // unreachable from here) is all that stops it.
        let mut split = Vec::new();
        if self.o.split_brains && partner_down.is_empty() {
            split = outdated.iter().map(|&(s, _)| s).collect();
            partner_down.clone_from(&split);
        }
        if partner_down.is_empty() {
            self.did(
                "skipped",
                format!("force n{i}: no outdated copy whose partner is down"),
            );
            return Ok(());
        }
        let sim = self.nodes[i as usize].sim.as_mut().expect("alive");
        let r: Vec<Result<String, String>> = partner_down
            .iter()
            .map(|&s| sim.force(Some(s as usize)))
            .collect();
        let after: BTreeSet<u32> = self.slices_in(i, "up-to-date").into_iter().collect();
        let forced: Vec<u32> = partner_down
            .into_iter()
            .filter(|s| after.contains(s))
            .collect();
        // The operator accepted the loss of what those copies missed.
        self.give_up(&forced);
        // And, the partner alive, two sides now write those slices.
        for b in 0..self.o.blocks as usize {
            let slice = (self.addr[b] / self.slice_bytes) as u32;
            if split.contains(&slice) && forced.contains(&slice) {
                self.blocks[b].split = true;
            }
        }
        self.did(
            if forced.is_empty() {
                "force-refused"
            } else {
                "force"
            },
            format!("resolve --force n{i}: {r:?} (forced slices {forced:?})"),
        );
        Ok(())
    }

    /// Whether any live node holds an outdated copy.
    fn any_outdated(&self) -> bool {
        (0..self.o.nodes).any(|j| !self.slices_in(j, "outdated").is_empty())
    }

    /// A split brain's force, when due (`split_plan`): the cut node's
    /// outdated copies are forced while their partners, alive behind the
    /// cut, go on alone.
    fn split_due(&mut self) -> Result<(), String> {
        let Some((t, i)) = self.split_plan else {
            return Ok(());
        };
        if self.now < t {
            return Ok(());
        }
        self.split_plan = None;
        self.split_hold = self.now + SPLIT_WRITE_NS;
        if !self.alive(i) || !self.cuts.iter().any(|&(a, _)| a == i) {
            self.did(
                "skipped",
                format!("split brain at n{i}: it is down or no longer cut off"),
            );
            return Ok(());
        }
        self.force_step(i)
    }

    fn step(&mut self, step: Step) -> Result<(), String> {
        let max_down = (self.o.nodes as usize).saturating_sub(2).max(1);
        let down = self.down();
        match step {
            Step::Heal(_)
            | Step::Recover(_)
            | Step::Lossy(..)
            | Step::Kill(_)
            | Step::ReplaceDisk(_)
            | Step::DiskFull(_)
                if self.split_plan.is_some() || self.now < self.split_hold =>
            {
                self.did(
                    "skipped",
                    format!("{step:?}: a split brain is being made (nothing heals it)"),
                )
            }
            Step::Kill(i) if !self.alive(i) => {
                self.did("skipped", format!("kill n{i}: already down"))
            }
            Step::Kill(i) if down >= max_down => {
                self.did("skipped", format!("kill n{i}: {down} node(s) down"))
            }
            Step::Kill(i) => {
                self.kill(i);
                self.heal(i);
                self.did("kill", format!("kill -9 n{i}"));
            }
            Step::ReplaceDisk(i) => {
                // Only while every copy is in sync everywhere: the other
                // copy then holds every acknowledged write.
                if down > 0 || !self.all_in_sync() {
                    self.did("skipped", format!("replace n{i}'s disk: not all in sync"));
                } else {
                    self.kill(i);
                    self.heal(i);
                    let n = &self.nodes[i as usize];
                    let _ = std::fs::remove_file(&n.image);
                    let _ = std::fs::remove_file(&n.dirty);
                    self.did("replace-disk", format!("kill -9 n{i}, its disk replaced"));
                }
            }
            Step::Restart(i) if self.alive(i) => {
                self.did("skipped", format!("restart n{i}: it runs"))
            }
            Step::Restart(i) => {
                self.start(i)?;
                self.did("restart", format!("restart n{i}"));
            }
            Step::Partition(i) | Step::PartitionLink(i, _) if !self.alive(i) => {
                self.did("skipped", format!("partition n{i}: it is down"))
            }
            Step::Partition(i) | Step::PartitionLink(i, _) if !self.cuts.is_empty() => {
                self.did("skipped", format!("partition at n{i}: a cut is in force"))
            }
            Step::Partition(i) => {
                self.set_partition(i, None);
                self.did("partition", format!("partition n{i} from every peer"));
            }
            Step::PartitionLink(a, b) => {
                self.set_partition(a, Some(b));
                self.did("partition-link", format!("partition the link n{a}–n{b}"));
            }
            Step::Heal(i) => {
                let n = self.o.nodes;
                match (0..n)
                    .map(|d| (i + d) % n)
                    .find(|&j| self.nodes[j as usize].faulted)
                {
                    Some(j) => {
                        self.heal(j);
                        self.did("heal", format!("heal every link of n{j}"));
                    }
                    None => self.did("skipped", "heal: no link has faults".into()),
                }
            }
            Step::Lossy(i, _) if !self.alive(i) => {
                self.did("skipped", format!("lossy n{i}: it is down"))
            }
            Step::Lossy(i, k) => {
                let f = LinkFaults::parse(LOSSY[k]).map_err(|e| e.to_string())?;
                // Replaces the node's faults: a partition set before is lifted.
                self.heal(i);
                self.nodes[i as usize].faults.set_all(f);
                self.nodes[i as usize].faulted = true;
                self.did("lossy", format!("n{i}'s links: {}", LOSSY[k]));
            }
            Step::DiskFull(i) => {
                let n = &mut self.nodes[i as usize];
                n.disk_full = true;
                if let Some(s) = n.sim.as_mut() {
                    s.set_dirty_disk_full(true);
                }
                self.did("disk-full", format!("n{i}'s dirty-map disk full"));
            }
            Step::DiskOk(i) => {
                let n = &mut self.nodes[i as usize];
                n.disk_full = false;
                if let Some(s) = n.sim.as_mut() {
                    s.set_dirty_disk_full(false);
                }
                self.did("disk-ok", format!("n{i}'s dirty-map disk has room"));
            }
            Step::Resolve(k) => self.resolve(k),
            Step::Force(i) if !self.alive(i) => {
                self.did("skipped", format!("force n{i}: it is down"))
            }
            Step::Force(i)
                if self.o.split_brains
                    && self.split_plan.is_none()
                    && self.cuts.is_empty()
                    && self.down() == 0
                    && !self.any_outdated() =>
            {
                // No copy to force: the operator makes one, cutting the
                // node off (its copies go outdated, its partners' on
                // alone), and forces it once they are.
                self.set_partition(i, None);
                self.split_plan = Some((self.now + SPLIT_FORCE_NS, i));
                self.did(
                    "split-cut",
                    format!("partition n{i} from every peer, to force its copies later"),
                );
            }
            Step::Force(i) => self.force_step(i)?,
            Step::Recover(k) => {
                for i in 0..self.o.nodes {
                    self.heal(i);
                    let n = &mut self.nodes[i as usize];
                    n.disk_full = false;
                    if let Some(s) = n.sim.as_mut() {
                        s.set_dirty_disk_full(false);
                    }
                }
                for i in 0..self.o.nodes {
                    if !self.alive(i) {
                        self.start(i)?;
                    }
                }
                self.did(
                    "recover",
                    "recover: every link healed, every node running".into(),
                );
                self.recover_resolve = Some((self.now + RECOVER_RESOLVE_NS, k));
            }
        }
        Ok(())
    }
}

impl Sim<'_> {
    /// One instant: the port logs, the resolves' answers, hung requests.
    fn tick(&mut self) {
        let worked = self.turn_all();
        let log = sim::take_log();
        if self.o.keep_trace {
            let t = self.now;
            self.report
                .trace
                .extend(log.into_iter().map(|l| format!("{t:>14} log {l}")));
        }
        self.resolves();
        self.hung();
        self.advance(worked);
    }

    /// Heal everything, restart every node, let the copies meet and
    /// resync (resolving split brains), then read every block through
    /// every node.
    fn finish(&mut self) -> Result<(), String> {
        self.trace("final: heal, restart, resolve, read everything".into());
        self.split_plan = None;
        self.split_hold = 0;
        self.step(Step::Recover(0))?;
        self.recover_resolve = None;
        self.step_at = u64::MAX;
        let deadline = self.now + SETTLE_NS;
        let mut next_resolve = self.now + RECOVER_RESOLVE_NS;
        while self.now < deadline && !self.all_in_sync() {
            if self.now >= next_resolve {
                self.resolve(0);
                next_resolve = self.now + RECOVER_RESOLVE_NS;
            }
            self.tick();
        }
        if !self.all_in_sync() {
            let behind: Vec<String> = (0..self.o.nodes)
                .flat_map(|i| {
                    self.nodes[i as usize]
                        .sim
                        .as_ref()
                        .map(|s| s.slices())
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|x| !(x.state == "up-to-date" && x.partner_up && x.to_send == 0))
                        .map(move |x| {
                            format!(
                                "n{i} slice {} {} (partner n{} {}, {} to send, {} of {} received)",
                                x.slice,
                                x.state,
                                x.partner,
                                if x.partner_up { "up" } else { "unreachable" },
                                x.to_send,
                                x.received,
                                x.to_receive
                            )
                        })
                })
                .collect();
            self.violation(format!(
                "the copies are not in sync {} s after the SAN was healed: {}",
                SETTLE_NS / 1_000_000_000,
                behind.join("; ")
            ));
        }
        // The reads have their own window: a SAN out of sync may still
        // serve every block.
        let deadline = self.now + SETTLE_NS;
        self.final_pending = (0..self.o.blocks)
            .flat_map(|b| (0..self.o.nodes).map(move |i| (b, i)))
            .collect();
        self.final_retry = self.now;
        loop {
            let owed = !self.final_pending.is_empty();
            let in_flight = self.nodes.iter().any(|n| !n.pending.is_empty());
            if !owed && !in_flight {
                break;
            }
            if self.now >= deadline {
                let left = std::mem::take(&mut self.final_pending);
                for (b, i) in left {
                    self.violation(format!(
                        "block {b} cannot be read through n{i} {} s after the SAN was \
                         healed (it did not come back)",
                        SETTLE_NS / 1_000_000_000
                    ));
                }
                for i in 0..self.o.nodes {
                    self.nodes[i as usize].pending.clear();
                }
                break;
            }
            if owed && self.now >= self.final_retry {
                if self.now >= next_resolve {
                    self.resolve(0);
                    next_resolve = self.now + RECOVER_RESOLVE_NS;
                }
                let mut owed = std::mem::take(&mut self.final_pending);
                owed.retain(|&(b, i)| {
                    let free = self.nodes[i as usize]
                        .sim
                        .as_ref()
                        .and_then(|s| s.free_tag())
                        .is_some();
                    if free {
                        self.issue_one(0, i, b, false, true);
                    }
                    !free
                });
                self.final_pending.extend(owed);
                self.final_retry = self.now + FINAL_RETRY_NS;
            }
            self.tick();
        }
        Ok(())
    }
}

/// Run one simulation. Its media live under `o.dir`, removed after.
pub fn run(o: &SimOptions) -> Result<SimReport, String> {
    sim::capture_log(true);
    let r = run_in(o);
    sim::capture_log(false);
    let _ = std::fs::remove_dir_all(&o.dir);
    r
}

fn run_in(o: &SimOptions) -> Result<SimReport, String> {
    let mut s = Sim::new(o)?;
    for i in 0..o.nodes {
        s.start(i)?;
    }
    let mut schedule = schedule(o.seed, o.nodes, o.step_ms);
    let mut index = 0u64;
    let (pause, mut step) = schedule.next().expect("endless");
    if o.step_ms > 0 {
        s.step_at = pause;
    }
    loop {
        if s.now >= s.step_at {
            if o.skip_steps.contains(&index) {
                s.trace(format!("nemesis step {index} skipped (shrunk)"));
            } else {
                s.step(step)?;
            }
            index += 1;
            let (pause, next) = schedule.next().expect("endless");
            step = next;
            s.step_at = s.now + pause;
        }
        s.split_due()?;
        if let Some((t, k)) = s.recover_resolve {
            if s.now >= t {
                s.recover_resolve = None;
                s.resolve(k);
            }
        }
        s.issue();
        if s.issued >= o.ops && !s.client_busy.iter().any(|&b| b) {
            break;
        }
        s.tick();
    }
    s.finish()?;
    s.report.steps_drawn = index;
    s.report.virtual_ns = s.now;
    Ok(s.report)
}

/// Make a failing run shorter: fewer operations, then fewer nemesis steps
/// (each tried away in halving chunks), while it still fails, in at most
/// `max_runs` runs. Returns the options of the shortest failing run found
/// and its report.
pub fn shrink(o: &SimOptions, max_runs: usize) -> Result<(SimOptions, SimReport), String> {
    let mut best = o.clone();
    let mut report = run(&best)?;
    if report.violations.is_empty() {
        return Err(format!("seed {} does not fail: nothing to shrink", o.seed));
    }
    let mut runs = 1;
    let try_run = |c: &SimOptions, runs: &mut usize| -> Result<Option<SimReport>, String> {
        *runs += 1;
        let r = run(c)?;
        Ok((!r.violations.is_empty()).then_some(r))
    };
    // Operations: halve while it fails.
    while runs < max_runs && best.ops > 1 {
        let mut c = best.clone();
        c.ops = best.ops / 2;
        match try_run(&c, &mut runs)? {
            Some(r) => {
                best = c;
                report = r;
            }
            None => break,
        }
    }
    // Steps: drop chunks of them.
    let mut chunk = (report.steps_drawn / 2).max(1);
    loop {
        let mut start = 0;
        while start < report.steps_drawn && runs < max_runs {
            let mut c = best.clone();
            c.skip_steps.extend(start..start + chunk);
            if c.skip_steps.len() == best.skip_steps.len() {
                start += chunk;
                continue;
            }
            match try_run(&c, &mut runs)? {
                Some(r) => {
                    best = c;
                    report = r;
                }
                None => start += chunk,
            }
        }
        if chunk == 1 || runs >= max_runs {
            break;
        }
        chunk /= 2;
    }
    Ok((best, report))
}
