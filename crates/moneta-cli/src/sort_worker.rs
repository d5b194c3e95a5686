//! One host's part of the distributed sort (SPEC §4.4, dissertation
//! §5.4.6), as a real program: `moneta san sort-worker` (hidden; `moneta
//! san sort` starts one per host, inside the host's network namespace).
//!
//! The records, the partition and the sort kernels are the simulator's
//! (`moneta_model::san::sort`): the same 100-byte records with 10-byte
//! keys, generated from their index and the seed; the same destination
//! rule (the key's leading bits); the same in-memory sort. What this adds is
//! real storage under them:
//!
//! - Every host sees one *global space* of `nodes × slice_bytes`; host i's
//!   slice is `[i·slice_bytes, (i+1)·slice_bytes)`. Each slice holds, at the
//!   same offsets ([`Layout`]): the barrier blocks (used in slice 0 only),
//!   host i's input, a temporary part per sending host, and host i's output.
//! - Stage 1: read the input slice in `io_bytes` requests, partition each
//!   read by destination, append every destination's records to a write
//!   buffer of `io_bytes` and write each full buffer to that destination's
//!   temporary part for this sender (remote writes, except one part).
//! - Barrier; stage 2: read the temporary parts of this host's slice,
//!   split them by key into several smaller partitions (the key's next
//!   leading bits: [`split_by_key`]), and sort them one after another; a
//!   second thread writes each sorted partition to the output region while
//!   the next one is sorted (the model's overlap of IO and CPU within a
//!   stage, `moneta_model::san::sort`).
//! - Barriers go through the storage itself: every host writes its stage
//!   (and what it sent where) into its block in slice 0 and polls all the
//!   blocks with one bounded read, sleeping between polls, until all have
//!   reached the stage or the timeout fails the run cleanly. A block
//!   carries the run's id and a CRC32C, so stale or torn blocks never count.
//! - Two ways to the storage ([`Access`]): `direct`, libmoneta on the
//!   host's own daemon with global addresses (QuickSAN-D: the device
//!   forwards remote addresses over its network port); `nbd`, an NBD
//!   connection to each slice owner's server (the iSCSI-like path: target
//!   software on the owner host).
//!
//! `verify` reads a host's output back (after every sort worker exited)
//! and summarizes it ([`OutputSummary`]) for the orchestrator's checks.
//!
//! Left out: overlap of IO with CPU work in stage 1 and with stage 2's
//! reads (one request at a time, as the model's one requester per host),
//! key skew handling beyond a clean error when a temporary part overflows.

use clap::Args;
use moneta::{CompletionMode, Io, Moneta};
use moneta_emu::sys::{monotonic_ns, thread_cpu_ns};
use moneta_model::san::sort::{self, Record, KEY_BYTES, RECORD_BYTES};
use moneta_nbd::NbdClient;
use moneta_wire::crc32c::crc32c;
use serde::{Deserialize, Serialize};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Hosts one sort can span: each has a 4 KiB barrier block in slice 0.
pub(crate) const MAX_NODES: u16 = 64;
const BLOCK_BYTES: u64 = 4096;
const ALIGN_BYTES: u64 = 4096;
const BLOCK_MAGIC: u64 = u64::from_be_bytes(*b"MSORTBLK");
/// The fixed part of a barrier block: magic, run, stage, node, records out, nodes.
const BLOCK_HEAD_BYTES: usize = 48;
/// Longest sleep between two barrier polls.
const MAX_POLL_SLEEP: Duration = Duration::from_millis(10);

/// Barrier stages a host reports in its block.
const STAGE_INPUT_WRITTEN: u64 = 1;
const STAGE_PARTITIONED: u64 = 2;
const STAGE_SORTED: u64 = 3;

/// Where everything lives, as offsets inside every host's slice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct Layout {
    pub(crate) nodes: u16,
    pub(crate) slice_bytes: u64,
    /// Where the input starts: after the barrier blocks, `BLOCK_BYTES` per
    /// host (those of slice 0 are used).
    pub(crate) input_offset: u64,
    pub(crate) input_records_max: u64,
    pub(crate) temp_offset: u64,
    /// Records one sender may put in one destination's temporary part.
    pub(crate) pair_records_max: u64,
    pub(crate) pair_bytes: u64,
    pub(crate) output_offset: u64,
    pub(crate) output_records_max: u64,
    /// Bytes of each slice the sort uses.
    pub(crate) used_bytes: u64,
}

fn align(bytes: u64) -> u64 {
    bytes.div_ceil(ALIGN_BYTES) * ALIGN_BYTES
}

/// Records `[first, first + count)` of the input are host `node`'s.
pub(crate) fn node_records(records: u64, nodes: u16, node: u16) -> (u64, u64) {
    let at = |i: u16| (records as u128 * i as u128 / nodes as u128) as u64;
    (at(node), at(node + 1) - at(node))
}

impl Layout {
    /// Lay out `records` over `nodes` slices of `slice_bytes`. A sender's
    /// temporary part in each destination holds the expected share plus six
    /// standard deviations (uniform keys never come near it; a skewed input
    /// is a clean error in stage 1), at most the sender's whole input.
    pub(crate) fn new(records: u64, nodes: u16, slice_bytes: u64) -> Result<Layout, String> {
        if nodes == 0 || nodes > MAX_NODES {
            return Err(format!(
                "the sort runs on 1 to {MAX_NODES} nodes, not {nodes}"
            ));
        }
        if records == 0 {
            return Err("--records must be positive".into());
        }
        let n = nodes as u64;
        let per_node = records.div_ceil(n);
        let record = RECORD_BYTES as u64;
        let input_offset = align(n * BLOCK_BYTES);
        let temp_offset = input_offset + align(per_node * record);
        let expected = per_node as f64 / n as f64;
        let pair_records_max =
            ((expected + 6.0 * expected.sqrt()).ceil() as u64 + 64).min(per_node);
        let pair_bytes = align(pair_records_max * record);
        let output_offset = temp_offset + n * pair_bytes;
        let output_records_max = n * pair_records_max;
        let used_bytes = output_offset + align(output_records_max * record);
        if used_bytes > slice_bytes {
            return Err(format!(
                "{records} records ({}) on {nodes} nodes need {} per node (input, temporary \
                 and output regions); each node's slice holds {}: fewer --records, or a \
                 bigger device",
                crate::mount::human(records * record),
                crate::mount::human(used_bytes),
                crate::mount::human(slice_bytes),
            ));
        }
        Ok(Layout {
            nodes,
            slice_bytes,
            input_offset,
            input_records_max: per_node,
            temp_offset,
            pair_records_max,
            pair_bytes,
            output_offset,
            output_records_max,
            used_bytes,
        })
    }

    fn slice(&self, node: u16) -> u64 {
        node as u64 * self.slice_bytes
    }
    fn block(&self, node: u16) -> u64 {
        node as u64 * BLOCK_BYTES
    }
    fn input(&self, node: u16) -> u64 {
        self.slice(node) + self.input_offset
    }
    /// The temporary part in `dest`'s slice that `sender` appends to.
    fn temp(&self, dest: u16, sender: u16) -> u64 {
        self.slice(dest) + self.temp_offset + sender as u64 * self.pair_bytes
    }
    fn output(&self, node: u16) -> u64 {
        self.slice(node) + self.output_offset
    }
}

/// How one host reaches the global space.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum Access {
    /// libmoneta on this daemon, global addresses.
    Direct { socket: PathBuf, completion: String },
    /// Slice j through `targets[j]`: an NBD server (HOST:PORT), its export,
    /// and where slice j starts in that export.
    Nbd { targets: Vec<NbdTarget> },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NbdTarget {
    pub(crate) addr: String,
    pub(crate) export: String,
    pub(crate) base: u64,
}

/// Everything a worker needs, written by the orchestrator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Plan {
    /// Distinguishes this run's barrier blocks from any earlier run's.
    pub(crate) run_id: u64,
    pub(crate) seed: u64,
    pub(crate) records: u64,
    pub(crate) io_bytes: u64,
    pub(crate) layout: Layout,
    /// Per host.
    pub(crate) access: Vec<Access>,
    pub(crate) timeout_ms: u64,
    /// Print a line per phase on stderr.
    pub(crate) progress: bool,
}

impl Plan {
    /// Records per request and per write buffer.
    fn io_records(&self) -> usize {
        (self.io_bytes as usize / RECORD_BYTES).max(1)
    }
}

#[derive(Args)]
pub struct SortWorkerArgs {
    /// The plan the orchestrator wrote (JSON).
    #[arg(long)]
    plan: PathBuf,
    /// This host's index.
    #[arg(long)]
    node: u16,
    /// sort: generate, stage 1, stage 2; verify: read the output back.
    #[arg(long, default_value = "sort")]
    phase: String,
    /// verify only, for tests of the checker: damage the output first
    /// (swap: two records change places; duplicate: one record overwrites
    /// its neighbour).
    #[arg(long)]
    corrupt: Option<String>,
}

/// What a sort worker reports on stdout (one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct WorkerReport {
    pub(crate) node: u16,
    pub(crate) records_in: u64,
    pub(crate) records_out: u64,
    /// Records sent to each destination in stage 1.
    pub(crate) sent: Vec<u64>,
    pub(crate) generate_s: f64,
    pub(crate) stage1_s: f64,
    pub(crate) stage2_s: f64,
    /// Waiting at the barrier between the stages.
    pub(crate) barrier_s: f64,
    /// CPU kernels alone (inside the stage times): this thread's CPU time,
    /// not the wall time, so a wait for a core is not counted as work.
    pub(crate) partition_cpu_s: f64,
    pub(crate) sort_cpu_s: f64,
    /// The in-memory sort's wall time (more than its CPU time when the
    /// host's threads wait for a core).
    #[serde(default)]
    pub(crate) sort_wall_s: f64,
    /// Direct access: where each stage's requests spent their time.
    #[serde(default)]
    pub(crate) stage1_io: IoTimes,
    #[serde(default)]
    pub(crate) stage2_io: IoTimes,
}

/// A host's output as read back: what the orchestrator checks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct OutputSummary {
    pub(crate) node: u16,
    pub(crate) records: u64,
    /// Sum of CRC32C per record (like valsort's checksum): equal before and
    /// after whatever the order.
    pub(crate) checksum: u64,
    /// Hex keys of the first and last record.
    pub(crate) first_key: Option<String>,
    pub(crate) last_key: Option<String>,
    /// Adjacent pairs out of key order, and the index of the first.
    pub(crate) out_of_order: u64,
    pub(crate) first_out_of_order: Option<u64>,
    /// Records whose key belongs to another host's range.
    pub(crate) misplaced: u64,
    /// The key of the last record added.
    #[serde(skip)]
    last: Option<[u8; KEY_BYTES]>,
}

/// The checksum of one record.
pub(crate) fn record_checksum(r: &Record) -> u64 {
    crc32c(r) as u64
}

fn hex(key: &[u8]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

impl OutputSummary {
    fn new(node: u16) -> Self {
        OutputSummary {
            node,
            ..OutputSummary::default()
        }
    }

    /// Account the next records of the output, in order.
    pub(crate) fn add(&mut self, records: &[Record], nodes: u16) {
        for r in records {
            let key: [u8; KEY_BYTES] = r[..KEY_BYTES].try_into().expect("key");
            match self.last {
                Some(last) if key < last => {
                    self.out_of_order += 1;
                    self.first_out_of_order.get_or_insert(self.records);
                }
                None => self.first_key = Some(hex(&key)),
                _ => {}
            }
            self.last = Some(key);
            if sort::destination(r, nodes as usize) != self.node as usize {
                self.misplaced += 1;
            }
            self.checksum = self.checksum.wrapping_add(record_checksum(r));
            self.records += 1;
        }
        self.last_key = self.last.map(|k| hex(&k));
    }
}

/// The global space, however it is reached.
trait Storage: Send {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), String>;
    fn write(&mut self, addr: u64, buf: &[u8]) -> Result<(), String>;
    /// Make the writes so far durable (NBD: flush every connection).
    fn sync(&mut self) -> Result<(), String>;
    /// Where the requests so far spent their time (direct access only).
    fn times(&self) -> IoTimes {
        IoTimes::default()
    }
}

struct Direct {
    moneta: Moneta,
    mode: CompletionMode,
    times: IoTimes,
}

/// Where a direct host's requests spent their time (sums over requests).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub(crate) struct IoTimes {
    pub(crate) requests: u64,
    /// Submit to return (a read's copy out included).
    pub(crate) wall_s: f64,
    /// Submit stamp to the model's completion time.
    pub(crate) modeled_s: f64,
    /// The model's completion time to the call's return (copy out included).
    pub(crate) behind_s: f64,
}

impl IoTimes {
    fn since(&self, earlier: &IoTimes) -> IoTimes {
        IoTimes {
            requests: self.requests - earlier.requests,
            wall_s: self.wall_s - earlier.wall_s,
            modeled_s: self.modeled_s - earlier.modeled_s,
            behind_s: self.behind_s - earlier.behind_s,
        }
    }
}

/// Adds one completed request to `t`: submit to now, submit to the model's
/// completion, the model's completion to now.
fn account(t: &mut IoTimes, m: &Moneta, io: &Io) {
    let done = monotonic_ns();
    let (stamp, due) = (io.issued_at_ns(), m.due_ns(io));
    t.requests += 1;
    t.wall_s += done.saturating_sub(stamp) as f64 * 1e-9;
    t.modeled_s += due.saturating_sub(stamp) as f64 * 1e-9;
    t.behind_s += done.saturating_sub(due) as f64 * 1e-9;
}

impl Storage for Direct {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        let t = &mut self.times;
        self.moneta
            .read_each(addr, buf, self.mode, |m, io| account(t, m, io))
            .map_err(|e| e.to_string())
    }
    fn write(&mut self, addr: u64, buf: &[u8]) -> Result<(), String> {
        let t = &mut self.times;
        self.moneta
            .write_each(addr, buf, self.mode, |m, io| account(t, m, io))
            .map_err(|e| e.to_string())
    }
    fn sync(&mut self) -> Result<(), String> {
        Ok(())
    }
    fn times(&self) -> IoTimes {
        self.times
    }
}

struct Nbd {
    slice_bytes: u64,
    /// One connection per server and export.
    connections: Vec<NbdClient<TcpStream>>,
    /// Per slice: its connection, and where the slice starts in the export.
    slices: Vec<(usize, u64)>,
}

impl Nbd {
    /// Split `[addr, addr + len)` at slice boundaries: (slice, offset in
    /// the export, range of the buffer).
    fn pieces(&self, addr: u64, len: usize) -> Vec<(usize, u64, std::ops::Range<usize>)> {
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let at = addr + done as u64;
            let slice = (at / self.slice_bytes) as usize;
            let within = at % self.slice_bytes;
            let n = ((self.slice_bytes - within) as usize).min(len - done);
            let base = self.slices.get(slice).map_or(0, |s| s.1);
            out.push((slice, base + within, done..done + n));
            done += n;
        }
        out
    }

    fn conn(&mut self, slice: usize) -> Result<&mut NbdClient<TcpStream>, String> {
        let count = self.slices.len();
        let (c, _) = *self
            .slices
            .get(slice)
            .ok_or_else(|| format!("address in slice {slice}, beyond the {count} slices"))?;
        Ok(&mut self.connections[c])
    }
}

impl Storage for Nbd {
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        for (slice, offset, range) in self.pieces(addr, buf.len()) {
            self.conn(slice)?.read(offset, &mut buf[range])?;
        }
        Ok(())
    }
    fn write(&mut self, addr: u64, buf: &[u8]) -> Result<(), String> {
        for (slice, offset, range) in self.pieces(addr, buf.len()) {
            self.conn(slice)?.write(offset, &buf[range])?;
        }
        Ok(())
    }
    fn sync(&mut self) -> Result<(), String> {
        for c in &mut self.connections {
            c.flush()?;
        }
        Ok(())
    }
}

fn open(plan: &Plan, node: u16) -> Result<Box<dyn Storage>, String> {
    let layout = &plan.layout;
    let global = layout.nodes as u64 * layout.slice_bytes;
    let access = plan
        .access
        .get(node as usize)
        .ok_or_else(|| format!("the plan has no access for node {node}"))?;
    match access {
        Access::Direct { socket, completion } => {
            let moneta = Moneta::connect(socket)
                .map_err(|e| format!("connecting to {}: {e}", socket.display()))?;
            if moneta.capacity_bytes() < global {
                return Err(format!(
                    "{} addresses {} B, the sort's global space is {global} B: {}",
                    socket.display(),
                    moneta.capacity_bytes(),
                    REMOTE_NOT_SERVED
                ));
            }
            moneta
                .grant_raw(0, global, true)
                .map_err(|e| format!("raw grant of the global space: {e}"))?;
            let mode = CompletionMode::parse(completion)
                .ok_or_else(|| format!("completion mode '{completion}'"))?;
            Ok(Box::new(Direct {
                moneta,
                mode,
                times: IoTimes::default(),
            }))
        }
        Access::Nbd { targets } => {
            if targets.len() != layout.nodes as usize {
                return Err(format!(
                    "{} NBD targets for {} slices",
                    targets.len(),
                    layout.nodes
                ));
            }
            let timeout = Duration::from_millis(plan.timeout_ms.max(1000));
            // Slices served by the same server and export share a connection
            // (all of them, when one daemon holds the whole space).
            let mut opened: Vec<(&str, &str)> = Vec::new();
            let mut connections = Vec::new();
            let mut slices = Vec::new();
            for t in targets {
                let key = (t.addr.as_str(), t.export.as_str());
                let c = match opened.iter().position(|&k| k == key) {
                    Some(c) => c,
                    None => {
                        connections.push(NbdClient::connect_tcp(&t.addr, &t.export, timeout)?);
                        opened.push(key);
                        opened.len() - 1
                    }
                };
                let size = connections[c].size();
                if size < t.base + layout.used_bytes {
                    return Err(format!(
                        "nbd://{}/{} holds {size} B, the sort needs {} B from {}",
                        t.addr, t.export, layout.used_bytes, t.base
                    ));
                }
                slices.push((c, t.base));
            }
            Ok(Box::new(Nbd {
                slice_bytes: layout.slice_bytes,
                connections,
                slices,
            }))
        }
    }
}

/// What the orchestrator looks for to tell "no port wiring yet" from a failure.
pub(crate) const REMOTE_NOT_SERVED: &str =
    "remote addresses are not served (the daemons' QuickSAN ports are not wired yet)";

/// A host's barrier block.
#[derive(Debug, Clone, PartialEq)]
struct Block {
    run_id: u64,
    stage: u64,
    node: u16,
    records_out: u64,
    sent: Vec<u64>,
}

impl Block {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(BLOCK_BYTES as usize);
        for v in [
            BLOCK_MAGIC,
            self.run_id,
            self.stage,
            self.node as u64,
            self.records_out,
            self.sent.len() as u64,
        ] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in &self.sent {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.resize(BLOCK_BYTES as usize - 4, 0);
        let crc = crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    /// None unless the bytes are a whole, intact block.
    fn decode(b: &[u8]) -> Option<Block> {
        let n = BLOCK_BYTES as usize;
        if b.len() != n || crc32c(&b[..n - 4]).to_le_bytes() != b[n - 4..] {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().expect("8"));
        let nodes = word(5) as usize;
        if word(0) != BLOCK_MAGIC || nodes > MAX_NODES as usize {
            return None;
        }
        Some(Block {
            run_id: word(1),
            stage: word(2),
            node: word(3) as u16,
            records_out: word(4),
            sent: (0..nodes).map(|j| word(BLOCK_HEAD_BYTES / 8 + j)).collect(),
        })
    }
}

/// Publish `mine` and wait until every host's block of this run has
/// reached `mine.stage`; every block then. Bounded by the plan's timeout.
fn barrier(st: &mut dyn Storage, plan: &Plan, mine: &Block) -> Result<Vec<Block>, String> {
    let layout = &plan.layout;
    st.write(layout.block(mine.node), &mine.encode())?;
    st.sync()?;
    let nodes = layout.nodes;
    let mut all = vec![0u8; (nodes as u64 * BLOCK_BYTES) as usize];
    let deadline = Instant::now() + Duration::from_millis(plan.timeout_ms);
    let mut sleep = Duration::from_micros(200);
    loop {
        st.read(layout.block(0), &mut all)?;
        let blocks: Vec<Option<Block>> = all
            .chunks(BLOCK_BYTES as usize)
            .map(|b| Block::decode(b).filter(|b| b.run_id == plan.run_id))
            .collect();
        let missing: Vec<u16> = (0..nodes)
            .filter(|&i| {
                !blocks[i as usize]
                    .as_ref()
                    .is_some_and(|b| b.stage >= mine.stage && b.node == i)
            })
            .collect();
        if missing.is_empty() {
            return Ok(blocks.into_iter().flatten().collect());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "barrier {}: nodes {missing:?} did not arrive within {} s",
                mine.stage,
                plan.timeout_ms / 1000
            ));
        }
        std::thread::sleep(sleep);
        sleep = (sleep * 2).min(MAX_POLL_SLEEP);
    }
}

/// Read `count` records at `addr` into `out`, `io_records` per request.
/// Stage 2's partitions per host at most.
const MAX_SORT_PARTITIONS: usize = 16;

/// How many partitions stage 2 sorts `records` in: enough that the writes
/// of one overlap the sort of the next, each at least two requests long.
fn sort_partitions(records: usize, io_records: usize) -> usize {
    (records / (2 * io_records.max(1))).clamp(1, MAX_SORT_PARTITIONS)
}

/// Scatter `from` into `to` by partition of this host's key range, in key
/// order: a record's partition is its destination among `nodes × parts`
/// (the same rule on the key's leading bits as stage 1's, finer), less
/// this host's first. Returns each partition's length. A record outside
/// this host's range (it cannot come from stage 1) goes to the nearest
/// end, so every record is written once and the verification finds it.
fn split_by_key(
    from: &[Record],
    to: &mut [Record],
    (nodes, me): (usize, usize),
    parts: usize,
) -> Vec<usize> {
    let part = |r: &Record| {
        sort::destination(r, nodes * parts)
            .saturating_sub(me * parts)
            .min(parts - 1)
    };
    let mut lens = vec![0usize; parts];
    for r in from {
        lens[part(r)] += 1;
    }
    let mut next: Vec<usize> = lens
        .iter()
        .scan(0, |at, &len| {
            let start = *at;
            *at += len;
            Some(start)
        })
        .collect();
    for r in from {
        let p = part(r);
        to[next[p]] = *r;
        next[p] += 1;
    }
    lens
}

/// How much lower than the IO the sort runs (a nice value).
const SORT_NICE: i32 = 10;

/// Stage 2 after the reads: split `mine` by key into `split`, then sort
/// each partition on a second thread and hand it to this one, which
/// writes it to `output` (and syncs) while the next partition is sorted.
/// The sorting thread runs below the IO (nice +10): a write's completion
/// is taken when it comes, not when a sort yields the core, as the model
/// leaves the sort's CPU out of the IO stack's way. Returns the sorting
/// CPU and wall time (split and sorts; not the wait for the last writes).
fn sort_and_write(
    st: &mut dyn Storage,
    mine: &[Record],
    split: &mut [Record],
    host: (usize, usize),
    output: u64,
    io_records: usize,
) -> Result<(Duration, f64), String> {
    let (cpu, wall) = (thread_cpu_ns(), Instant::now());
    let lens = split_by_key(mine, split, host, sort_partitions(mine.len(), io_records));
    let split_cpu = Duration::from_nanos(thread_cpu_ns() - cpu);
    let split_wall = wall.elapsed();
    let (sort_cpu, sort_wall) = std::thread::scope(|scope| {
        let (to_writer, sorted) = std::sync::mpsc::channel::<(u64, &[Record])>();
        let sorter = scope.spawn(move || {
            // Raising one's own nice value needs no privilege; a refusal
            // leaves the sort at the IO's priority, only slower to yield.
            let _ = moneta_emu::sys::set_thread_nice(SORT_NICE);
            let (mut cpu, mut wall) = (Duration::ZERO, Duration::ZERO);
            let mut rest = split;
            let mut addr = output;
            for len in lens {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                let (c, w) = (thread_cpu_ns(), Instant::now());
                sort::sort_records(part);
                cpu += Duration::from_nanos(thread_cpu_ns() - c);
                wall += w.elapsed();
                if to_writer.send((addr, &*part)).is_err() {
                    // The writer stopped on an error, returned below.
                    break;
                }
                addr += (len * RECORD_BYTES) as u64;
            }
            (cpu, wall)
        });
        let written = sorted
            .iter()
            .try_for_each(|(addr, part)| write_records(st, addr, part, io_records))
            .and_then(|()| st.sync());
        // A failed write stops the sorter at its next hand-over.
        drop(sorted);
        let times = sorter
            .join()
            .map_err(|_| "stage 2's sorting thread panicked".to_string())?;
        written.map(|()| times)
    })?;
    Ok((split_cpu + sort_cpu, (split_wall + sort_wall).as_secs_f64()))
}

fn read_records(
    st: &mut dyn Storage,
    addr: u64,
    out: &mut [Record],
    io_records: usize,
) -> Result<(), String> {
    for (k, chunk) in out.chunks_mut(io_records).enumerate() {
        let at = addr + (k * io_records * RECORD_BYTES) as u64;
        st.read(at, chunk.as_flattened_mut())?;
    }
    Ok(())
}

fn write_records(
    st: &mut dyn Storage,
    addr: u64,
    records: &[Record],
    io_records: usize,
) -> Result<(), String> {
    for (k, chunk) in records.chunks(io_records).enumerate() {
        let at = addr + (k * io_records * RECORD_BYTES) as u64;
        st.write(at, chunk.as_flattened())?;
    }
    Ok(())
}

pub fn run(a: SortWorkerArgs) -> Result<(), String> {
    let text = std::fs::read(&a.plan).map_err(|e| format!("plan {}: {e}", a.plan.display()))?;
    let plan: Plan =
        serde_json::from_slice(&text).map_err(|e| format!("plan {}: {e}", a.plan.display()))?;
    if a.node >= plan.layout.nodes {
        return Err(format!(
            "--node {} of a {}-node sort",
            a.node, plan.layout.nodes
        ));
    }
    let json = match a.phase.as_str() {
        "sort" => serde_json::to_string(&sort_phase(&plan, a.node)?),
        "verify" => serde_json::to_string(&verify_phase(&plan, a.node, a.corrupt.as_deref())?),
        other => return Err(format!("--phase {other}: expected sort or verify")),
    }
    .map_err(|e| e.to_string())?;
    println!("{json}");
    Ok(())
}

fn sort_phase(plan: &Plan, me: u16) -> Result<WorkerReport, String> {
    let layout = &plan.layout;
    let nodes = layout.nodes;
    let n = nodes as usize;
    let io_records = plan.io_records();
    let progress = |what: &str| {
        if plan.progress {
            eprintln!("n{me}: {what}");
        }
    };
    let mut st = open(plan, me)?;
    let st = st.as_mut();
    let (first, count) = node_records(plan.records, nodes, me);

    // Input (not timed as a stage): this host's records of the data set.
    let started = Instant::now();
    let mut at = 0u64;
    while at < count {
        let k = (count - at).min(io_records as u64);
        let records = sort::generate_records_at(plan.seed, first + at, k as usize);
        st.write(
            layout.input(me) + at * RECORD_BYTES as u64,
            records.as_flattened(),
        )?;
        at += k;
    }
    st.sync()?;
    let generate_s = started.elapsed().as_secs_f64();
    progress(&format!(
        "{count} input records written in {generate_s:.2} s"
    ));
    let mut block = Block {
        run_id: plan.run_id,
        stage: STAGE_INPUT_WRITTEN,
        node: me,
        records_out: 0,
        sent: vec![0; n],
    };
    // Stage 2's buffer, allocated and touched before the timed stages, as
    // a sort program sets up its memory at start: its first-touch page
    // faults (10 MB per 100,000 records: 4–8 ms on this host with three
    // workers) are not the sort's work, and the model has none.
    let mut mine = vec![[1u8; RECORD_BYTES]; layout.output_records_max as usize];
    let mut split = vec![[1u8; RECORD_BYTES]; layout.output_records_max as usize];
    // Likewise stage 1's read buffer and write buffers.
    let mut input = vec![[1u8; RECORD_BYTES]; io_records];
    // Twice a request: a read's records are added before a full buffer is
    // written, so a buffer never grows.
    let mut buffers: Vec<Vec<Record>> = (0..n)
        .map(|_| {
            let mut b = vec![[1u8; RECORD_BYTES]; 2 * io_records];
            b.clear();
            b
        })
        .collect();
    barrier(st, plan, &block)?;

    // Stage 1: read, partition, append through a write buffer per destination.
    let before1 = st.times();
    let started = Instant::now();
    let mut partition_cpu = Duration::ZERO;
    let mut sent = vec![0u64; n];
    let mut append = |st: &mut dyn Storage, dest: usize, records: &[Record]| {
        if sent[dest] + records.len() as u64 > layout.pair_records_max {
            return Err(format!(
                "node {me}'s records for node {dest} overflow their temporary part \
                 ({} records): the keys are far from uniform",
                layout.pair_records_max
            ));
        }
        let addr = layout.temp(dest as u16, me) + sent[dest] * RECORD_BYTES as u64;
        st.write(addr, records.as_flattened())?;
        sent[dest] += records.len() as u64;
        Ok(())
    };
    let mut at = 0u64;
    while at < count {
        let k = (count - at).min(io_records as u64) as usize;
        let chunk = &mut input[..k];
        st.read(
            layout.input(me) + at * RECORD_BYTES as u64,
            chunk.as_flattened_mut(),
        )?;
        let cpu = thread_cpu_ns();
        sort::partition_into(chunk, &mut buffers);
        partition_cpu += Duration::from_nanos(thread_cpu_ns() - cpu);
        for (dest, buffer) in buffers.iter_mut().enumerate() {
            if buffer.len() >= io_records {
                append(st, dest, &buffer[..io_records])?;
                buffer.drain(..io_records);
            }
        }
        at += k as u64;
    }
    for (dest, buffer) in buffers.iter().enumerate() {
        if !buffer.is_empty() {
            append(st, dest, buffer)?;
        }
    }
    st.sync()?;
    let stage1_s = started.elapsed().as_secs_f64();
    let stage1_io = st.times().since(&before1);
    progress(&format!("stage 1 in {stage1_s:.2} s, sent {sent:?}"));

    block.stage = STAGE_PARTITIONED;
    block.sent = sent.clone();
    let waited = Instant::now();
    let blocks = barrier(st, plan, &block)?;
    let barrier_s = waited.elapsed().as_secs_f64();

    // Stage 2: read this slice's temporary parts, sort, write the output.
    let before2 = st.times();
    let started = Instant::now();
    let incoming: Vec<u64> = blocks.iter().map(|b| b.sent[me as usize]).collect();
    let total: u64 = incoming.iter().sum();
    if total > layout.output_records_max {
        return Err(format!(
            "node {me} received {total} records, its output region holds {}",
            layout.output_records_max
        ));
    }
    let mine = &mut mine[..total as usize];
    let mut filled = 0usize;
    for (sender, &k) in incoming.iter().enumerate() {
        let part = &mut mine[filled..filled + k as usize];
        read_records(st, layout.temp(me, sender as u16), part, io_records)?;
        filled += k as usize;
    }
    let (sort_cpu, sort_wall_s) = sort_and_write(
        st,
        mine,
        &mut split[..total as usize],
        (n, me as usize),
        layout.output(me),
        io_records,
    )?;
    let stage2_s = started.elapsed().as_secs_f64();
    let stage2_io = st.times().since(&before2);
    progress(&format!("stage 2 in {stage2_s:.2} s, {total} records out"));

    // Publish the output's size (verify reads it); nobody waits for this.
    block.stage = STAGE_SORTED;
    block.records_out = total;
    st.write(layout.block(me), &block.encode())?;
    st.sync()?;
    Ok(WorkerReport {
        node: me,
        records_in: count,
        records_out: total,
        sent,
        generate_s,
        stage1_s,
        stage2_s,
        barrier_s,
        partition_cpu_s: partition_cpu.as_secs_f64(),
        sort_cpu_s: sort_cpu.as_secs_f64(),
        sort_wall_s,
        stage1_io,
        stage2_io,
    })
}

fn verify_phase(plan: &Plan, me: u16, corrupt: Option<&str>) -> Result<OutputSummary, String> {
    let layout = &plan.layout;
    let mut st = open(plan, me)?;
    let st = st.as_mut();
    let mut raw = vec![0u8; BLOCK_BYTES as usize];
    st.read(layout.block(me), &mut raw)?;
    let block = Block::decode(&raw)
        .filter(|b| b.run_id == plan.run_id && b.stage >= STAGE_SORTED && b.node == me)
        .ok_or_else(|| format!("node {me} did not record a finished sort of this run"))?;
    let count = block.records_out;
    if count > layout.output_records_max {
        return Err(format!("node {me} claims {count} output records"));
    }
    let output = layout.output(me);
    if let Some(how) = corrupt {
        damage(st, output, count, how)?;
    }
    let io_records = plan.io_records();
    let mut summary = OutputSummary::new(me);
    let mut chunk = vec![[0u8; RECORD_BYTES]; io_records];
    let mut at = 0u64;
    while at < count {
        let k = (count - at).min(io_records as u64) as usize;
        st.read(
            output + at * RECORD_BYTES as u64,
            chunk[..k].as_flattened_mut(),
        )?;
        summary.add(&chunk[..k], layout.nodes);
        at += k as u64;
    }
    Ok(summary)
}

/// Damage the output on purpose (tests of the checker).
fn damage(st: &mut dyn Storage, output: u64, count: u64, how: &str) -> Result<(), String> {
    if count < 2 {
        return Err("--corrupt needs an output of at least two records".into());
    }
    let mut two = [[0u8; RECORD_BYTES]; 2];
    let last = output + (count - 1) * RECORD_BYTES as u64;
    st.read(output, two[0].as_mut_slice())?;
    st.read(last, two[1].as_mut_slice())?;
    match how {
        "swap" => {
            st.write(output, &two[1])?;
            st.write(last, &two[0])?;
        }
        "duplicate" => st.write(output + RECORD_BYTES as u64, &two[0])?,
        other => return Err(format!("--corrupt {other}: expected swap or duplicate")),
    }
    st.sync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_two_partitions_keep_every_record_once_in_key_order() {
        let (nodes, me) = (3usize, 1usize);
        let mine: Vec<Record> = sort::generate_records(30_000, 9)
            .into_iter()
            .filter(|r| sort::destination(r, nodes) == me)
            .collect();
        let parts = sort_partitions(mine.len(), 500);
        assert!(parts > 1 && parts <= MAX_SORT_PARTITIONS, "{parts}");
        assert_eq!(sort_partitions(10, 500), 1);
        assert_eq!(sort_partitions(1 << 30, 500), MAX_SORT_PARTITIONS);
        let mut split = vec![[0u8; RECORD_BYTES]; mine.len()];
        let lens = split_by_key(&mine, &mut split, (nodes, me), parts);
        assert_eq!(lens.len(), parts);
        assert_eq!(lens.iter().sum::<usize>(), mine.len());
        assert!(
            lens.iter().all(|&l| l > 0),
            "uniform keys fill every part: {lens:?}"
        );
        // Sorting each part in place sorts the whole: every key of a part
        // is below every key of the next.
        let mut at = 0;
        for len in &lens {
            sort::sort_records(&mut split[at..at + len]);
            at += len;
        }
        assert!(split
            .windows(2)
            .all(|w| w[0][..KEY_BYTES] <= w[1][..KEY_BYTES]));
        let mut a = mine.clone();
        let mut b = split.clone();
        a.sort_unstable();
        b.sort_unstable();
        assert_eq!(a, b, "the same records, each once");
        // A record from outside this host's range lands in an end part.
        let mut stray = mine[..4].to_vec();
        stray[0][..2].copy_from_slice(&[0, 0]);
        stray[1][..2].copy_from_slice(&[0xFF, 0xFF]);
        let mut out = vec![[0u8; RECORD_BYTES]; 4];
        let lens = split_by_key(&stray, &mut out, (nodes, me), 4);
        assert_eq!(lens.iter().sum::<usize>(), 4);
        assert!(lens[0] >= 1 && lens[3] >= 1, "{lens:?}");
    }

    #[test]
    fn regions_do_not_overlap_and_fit_the_slice() {
        let l = Layout::new(100_000, 3, 64 << 20).unwrap();
        assert!(l.input_offset >= 3 * BLOCK_BYTES);
        assert!(l.temp_offset >= l.input_offset + l.input_records_max * 100);
        assert!(l.output_offset >= l.temp(0, 2) + l.pair_records_max * 100);
        assert!(l.used_bytes <= l.slice_bytes);
        assert!(l.output_records_max >= l.input_records_max);
        // A sender's part holds its share and some: far below its whole input.
        assert!(l.pair_records_max > 100_000 / 9 && l.pair_records_max < 100_000 / 3);
        let e = Layout::new(10_000_000, 3, 64 << 20).unwrap_err();
        assert!(e.contains("fewer --records"), "{e}");
        assert!(Layout::new(0, 3, 64 << 20).is_err());
        assert!(Layout::new(10, 0, 64 << 20).is_err());
    }

    #[test]
    fn node_records_cover_the_input_once() {
        for (records, nodes) in [(10u64, 3u16), (1, 4), (1_000_003, 7)] {
            let mut next = 0;
            for i in 0..nodes {
                let (first, count) = node_records(records, nodes, i);
                assert_eq!(first, next);
                next += count;
            }
            assert_eq!(next, records);
        }
    }

    #[test]
    fn blocks_round_trip_and_damage_is_seen() {
        let b = Block {
            run_id: 7,
            stage: 2,
            node: 1,
            records_out: 99,
            sent: vec![1, 2, 3],
        };
        let mut bytes = b.encode();
        assert_eq!(bytes.len(), BLOCK_BYTES as usize);
        assert_eq!(Block::decode(&bytes), Some(b));
        bytes[20] ^= 1;
        assert_eq!(Block::decode(&bytes), None);
        assert_eq!(Block::decode(&[0u8; 4096]), None);
    }

    #[test]
    fn the_summary_sees_order_misplacement_and_content() {
        let records = sort::generate_records(1000, 3);
        let parts = sort::partition(&records, 2);
        let mut mine = parts[1].clone();
        sort::sort_records(&mut mine);
        let mut s = OutputSummary::new(1);
        s.add(&mine[..10], 2);
        s.add(&mine[10..], 2);
        assert_eq!(s.records, mine.len() as u64);
        assert_eq!((s.out_of_order, s.misplaced), (0, 0));
        let sum = mine
            .iter()
            .map(record_checksum)
            .fold(0u64, u64::wrapping_add);
        assert_eq!(s.checksum, sum);
        mine.swap(0, 5);
        let mut bad = OutputSummary::new(1);
        bad.add(&mine, 2);
        assert_eq!(bad.first_out_of_order, Some(1));
        assert_eq!(bad.checksum, sum);
        let mut wrong = OutputSummary::new(1);
        wrong.add(&parts[0][..3], 2);
        assert_eq!(wrong.misplaced, 3);
    }
}
