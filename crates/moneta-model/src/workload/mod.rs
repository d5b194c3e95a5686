//! Workloads: XDD-like closed loops (SPEC §2: "XDD benchmark; 16 threads
//! unless stated; random accesses") and the mixed-size fairness workload of
//! SPEC §2.2 (Moneta+Balance).
//!
//! A workload is a list of thread groups; every thread issues one request,
//! waits for it, and issues the next (closed loop), until the run's op count
//! or simulated duration is reached. Each thread draws addresses from its
//! own seeded stream, so adding a thread never changes another's addresses.
//! A group may instead keep `queue_depth` requests in flight per thread
//! (Moneta-D's asynchronous interface, SPEC §3.2, dissertation §4.4.4):
//! each in-flight slot draws from its own stream.

use crate::kernel::Rng;
use crate::units::Op;
use serde::{Deserialize, Serialize};

/// Operation mix of a thread group.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpMix {
    Read,
    Write,
    /// Reads with this probability, otherwise writes (XDD's 50/50 is 0.5).
    Mixed(f64),
}

impl OpMix {
    /// Fraction of requests that are reads.
    pub fn read_fraction(self) -> f64 {
        match self {
            OpMix::Read => 1.0,
            OpMix::Write => 0.0,
            OpMix::Mixed(p) => p,
        }
    }

    pub fn parse(s: &str) -> crate::error::Result<OpMix> {
        match s {
            "read" => Ok(OpMix::Read),
            "write" => Ok(OpMix::Write),
            "mixed" => Ok(OpMix::Mixed(0.5)),
            _ => Err(crate::error::Error::parse(format!(
                "unknown op '{s}'{} (expected read, write or mixed)",
                crate::suggest::did_you_mean(s, ["read", "write", "mixed"])
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OpMix::Read => "read",
            OpMix::Write => "write",
            OpMix::Mixed(_) => "mixed",
        }
    }

    #[inline]
    pub fn draw(self, rng: &mut Rng) -> Op {
        match self {
            OpMix::Read => Op::Read,
            OpMix::Write => Op::Write,
            OpMix::Mixed(p) => {
                if rng.unit() < p {
                    Op::Read
                } else {
                    Op::Write
                }
            }
        }
    }
}

/// Threads that share a request size, mix and access pattern.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThreadGroup {
    pub name: String,
    pub threads: u32,
    pub op: OpMix,
    pub size_bytes: u64,
    pub random: bool,
    /// The group's accesses fall in [region_offset_bytes, + region_bytes).
    pub region_offset_bytes: u64,
    pub region_bytes: u64,
    /// Requests each thread keeps in flight: 1 is synchronous (XDD's
    /// threads); more is Moneta-D's asynchronous pread/pwrite (SPEC §3.2).
    #[serde(default = "synchronous")]
    pub queue_depth: u32,
}

fn synchronous() -> u32 {
    1
}

/// Requesters (threads × queue depth) one run may simulate: far beyond any
/// host of the papers (16 to 32 threads), and each costs memory.
pub const MAX_REQUESTERS: u64 = 65_536;

/// Virtual tags of a Moneta-D channel (SPEC §3.1): no thread can keep more
/// requests in flight on its channel.
pub const CHANNEL_TAGS: u32 = 64;

/// When a run stops.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunLimit {
    /// Total requests across all threads.
    Ops(u64),
    /// Simulated time.
    DurationNs(u64),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub groups: Vec<ThreadGroup>,
    pub limit: RunLimit,
    pub seed: u64,
}

impl Workload {
    /// XDD: `threads` threads of one size and mix over the whole device.
    pub fn xdd(
        op: OpMix,
        size_bytes: u64,
        threads: u32,
        region_bytes: u64,
        limit: RunLimit,
        seed: u64,
    ) -> Workload {
        Workload {
            groups: vec![ThreadGroup {
                name: format!("{}-{}", op.name(), size_bytes),
                threads,
                op,
                size_bytes,
                random: true,
                region_offset_bytes: 0,
                region_bytes,
                queue_depth: 1,
            }],
            limit,
            seed,
        }
    }

    /// SPEC §2.2: `small_threads` threads of `small_bytes` reads beside
    /// `large_threads` threads of `large_bytes` reads, in disjoint halves.
    pub fn fairness(
        small_threads: u32,
        small_bytes: u64,
        large_threads: u32,
        large_bytes: u64,
        region_bytes: u64,
        limit: RunLimit,
        seed: u64,
    ) -> Workload {
        let half = region_bytes / 2;
        let group = |name: &str, threads, size_bytes, region_offset_bytes| ThreadGroup {
            name: name.to_string(),
            threads,
            op: OpMix::Read,
            size_bytes,
            random: true,
            region_offset_bytes,
            region_bytes: half,
            queue_depth: 1,
        };
        Workload {
            groups: vec![
                group("small", small_threads, small_bytes, 0),
                group("large", large_threads, large_bytes, half),
            ],
            limit,
            seed,
        }
    }

    pub fn threads(&self) -> u32 {
        self.groups.iter().map(|g| g.threads).sum()
    }

    pub fn validate(&self, capacity_bytes: u64) -> crate::error::Result<()> {
        if self.groups.is_empty() || self.groups.iter().all(|g| g.threads == 0) {
            return Err(crate::error::Error::workload("the workload has no threads"));
        }
        let requesters: u64 = self
            .groups
            .iter()
            .map(|g| u64::from(g.threads) * u64::from(g.queue_depth.max(1)))
            .sum();
        if requesters > MAX_REQUESTERS {
            return Err(crate::error::Error::workload(format!(
                "{requesters} requesters (threads × queue depth) in one run: at most {MAX_REQUESTERS}"
            )));
        }
        for g in &self.groups {
            if g.size_bytes == 0 || g.size_bytes % 512 != 0 {
                return Err(crate::error::Error::workload(format!(
                    "{}: size {} must be a positive multiple of 512 B",
                    g.name, g.size_bytes
                )));
            }
            if g.region_bytes < g.size_bytes {
                return Err(crate::error::Error::workload(format!(
                    "{}: region smaller than one request",
                    g.name
                )));
            }
            if g.region_offset_bytes.saturating_add(g.region_bytes) > capacity_bytes {
                return Err(crate::error::Error::workload(format!(
                    "{}: region exceeds the device capacity {capacity_bytes}",
                    g.name
                )));
            }
            if !(1..=CHANNEL_TAGS).contains(&g.queue_depth) {
                return Err(crate::error::Error::workload(format!(
                    "{}: queue depth {} must be 1 (synchronous) to {CHANNEL_TAGS} (a channel's tags)",
                    g.name, g.queue_depth
                )));
            }
            if let OpMix::Mixed(p) = g.op {
                if !(0.0..=1.0).contains(&p) {
                    return Err(crate::error::Error::workload(format!(
                        "{}: read fraction {p} outside 0..1",
                        g.name
                    )));
                }
            }
        }
        match self.limit {
            RunLimit::Ops(0) | RunLimit::DurationNs(0) => Err(crate::error::Error::workload(
                "the run limit must be positive",
            )),
            _ => Ok(()),
        }
    }
}

/// Address generator of one thread.
#[derive(Debug, Clone)]
pub struct AddressStream {
    rng: Rng,
    random: bool,
    base: u64,
    slots: u64,
    size_bytes: u64,
    next_slot: u64,
}

impl AddressStream {
    pub fn new(group: &ThreadGroup, seed: u64, thread: u64) -> Self {
        let mut rng = Rng::stream(seed, thread + 1);
        let slots = group.region_bytes / group.size_bytes;
        let next_slot = rng.below(slots);
        Self {
            rng,
            random: group.random,
            base: group.region_offset_bytes,
            slots,
            size_bytes: group.size_bytes,
            next_slot,
        }
    }

    /// Next request: size-aligned random (or sequential) offset, and the op.
    #[inline]
    pub fn next(&mut self, mix: OpMix) -> (Op, u64) {
        let slot = if self.random {
            self.rng.below(self.slots)
        } else {
            let s = self.next_slot;
            self.next_slot = (s + 1) % self.slots;
            s
        };
        let op = mix.draw(&mut self.rng);
        (op, self.base + slot * self.size_bytes)
    }
}
