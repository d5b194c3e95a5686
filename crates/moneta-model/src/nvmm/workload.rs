//! NVMM workloads (SPEC §7 "Evaluation"): the streams of main-memory
//! accesses (CPU last-level-cache misses) that threads issue.
//!
//! - GUPS: a table larger than the DRAM, random read-modify-write updates of
//!   one line each (the report: 5000 updates). The table was just written by
//!   its initialization, so the run starts with the table's tail in DRAM,
//!   dirty, and (SSD system) the rest swapped out: anonymous memory.
//! - MMAP: a file larger than the DRAM mapped and read at random lines (the
//!   report: 10,000 reads); starts cold; file-backed.
//! - Sequential: each thread streams through its own slice, line by line.
//! - Trace: a file of `R|W|U ADDRESS [THREAD]` lines (hex with 0x, or
//!   decimal; `#` comments): read, posted write, read-modify-write.
//!
//! A thread blocks on each read and update (one outstanding miss, an
//! in-order core); a write is posted.

use crate::kernel::Rng;
use serde::Serialize;
use std::sync::Arc;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AccessKind {
    Read,
    /// Read, then the line is written (GUPS).
    Update,
    /// A posted write of a line (an LLC write-back).
    Write,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Access {
    pub addr: u64,
    pub kind: AccessKind,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    Gups,
    Mmap,
    Sequential,
    Trace,
}

impl WorkloadKind {
    pub const ALL: [&'static str; 4] = ["gups", "mmap", "sequential", "trace"];

    pub fn parse(name: &str) -> Result<WorkloadKind, String> {
        match name {
            "gups" => Ok(WorkloadKind::Gups),
            "mmap" => Ok(WorkloadKind::Mmap),
            "sequential" | "seq" => Ok(WorkloadKind::Sequential),
            "trace" => Ok(WorkloadKind::Trace),
            other => Err(format!(
                "unknown workload '{other}' (expected one of {})",
                Self::ALL.join(", ")
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            WorkloadKind::Gups => "gups",
            WorkloadKind::Mmap => "mmap",
            WorkloadKind::Sequential => "sequential",
            WorkloadKind::Trace => "trace",
        }
    }
}

/// What the threads run.
#[derive(Clone, Debug)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub threads: u32,
    /// Accesses of all threads together.
    pub accesses: u64,
    pub footprint_bytes: u64,
    /// Anonymous memory (the SSD system swaps it) or a mapped file.
    pub anonymous: bool,
    /// Start with the footprint's tail resident and dirty (just written).
    pub warm: bool,
    pub line_bytes: u64,
    trace: Option<Arc<Vec<Vec<Access>>>>,
}

impl Workload {
    pub fn new(
        kind: WorkloadKind,
        threads: u32,
        accesses: u64,
        footprint_bytes: u64,
        line_bytes: u64,
    ) -> Result<Workload, String> {
        if kind == WorkloadKind::Trace {
            return Err("a trace workload comes from a file (Workload::from_trace)".into());
        }
        if threads == 0 || accesses == 0 {
            return Err("threads and accesses must be positive".into());
        }
        if footprint_bytes < line_bytes * u64::from(threads) {
            return Err("the footprint must hold a line per thread".into());
        }
        Ok(Workload {
            kind,
            threads,
            accesses,
            footprint_bytes,
            anonymous: kind == WorkloadKind::Gups,
            warm: kind == WorkloadKind::Gups,
            line_bytes,
            trace: None,
        })
    }

    /// Parse a trace; its threads are the largest thread number + 1.
    pub fn from_trace(text: &str, line_bytes: u64) -> Result<Workload, String> {
        let mut threads: Vec<Vec<Access>> = Vec::new();
        let mut max_addr = 0;
        for (n, line) in text.lines().enumerate() {
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let bad = |m: &str| format!("trace line {}: {m}: '{line}'", n + 1);
            let mut fields = line.split_whitespace();
            let kind = match fields.next() {
                Some("R" | "r") => AccessKind::Read,
                Some("W" | "w") => AccessKind::Write,
                Some("U" | "u") => AccessKind::Update,
                _ => return Err(bad("expected R, W or U")),
            };
            let addr = fields.next().ok_or_else(|| bad("missing address"))?;
            let addr = match addr.strip_prefix("0x").or_else(|| addr.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => addr.parse(),
            }
            .map_err(|_| bad("bad address"))?;
            let thread: usize = match fields.next() {
                Some(t) => t.parse().map_err(|_| bad("bad thread number"))?,
                None => 0,
            };
            if thread >= 1024 {
                return Err(bad("thread number above 1023"));
            }
            if fields.next().is_some() {
                return Err(bad("too many fields"));
            }
            if threads.len() <= thread {
                threads.resize_with(thread + 1, Vec::new);
            }
            max_addr = max_addr.max(addr);
            threads[thread].push(Access { addr, kind });
        }
        let accesses: usize = threads.iter().map(Vec::len).sum();
        if accesses == 0 {
            return Err("the trace has no accesses".into());
        }
        Ok(Workload {
            kind: WorkloadKind::Trace,
            threads: threads.len() as u32,
            accesses: accesses as u64,
            footprint_bytes: (max_addr / 65536 + 1) * 65536,
            anonymous: true,
            warm: false,
            line_bytes,
            trace: Some(Arc::new(threads)),
        })
    }

    /// One access stream per thread.
    pub fn streams(&self, seed: u64) -> Vec<Stream> {
        let lines = self.footprint_bytes / self.line_bytes;
        let threads = u64::from(self.threads);
        (0..threads)
            .map(|t| {
                let share = self.accesses / threads + u64::from(t < self.accesses % threads);
                let slice = lines / threads;
                Stream {
                    kind: self.kind,
                    rng: Rng::stream(seed, 0x5EED + t),
                    remaining: share,
                    lines,
                    line_bytes: self.line_bytes,
                    next_line: t * slice,
                    slice_end: (t + 1) * slice,
                    slice_start: t * slice,
                    trace: self.trace.clone(),
                    thread: t as usize,
                    at: 0,
                }
            })
            .collect()
    }
}

/// A thread's accesses, generated as they are needed.
pub struct Stream {
    kind: WorkloadKind,
    rng: Rng,
    remaining: u64,
    lines: u64,
    line_bytes: u64,
    next_line: u64,
    slice_start: u64,
    slice_end: u64,
    trace: Option<Arc<Vec<Vec<Access>>>>,
    thread: usize,
    at: usize,
}

impl Stream {
    #[inline]
    pub fn next_access(&mut self) -> Option<Access> {
        if let Some(trace) = &self.trace {
            let a = trace[self.thread].get(self.at).copied();
            self.at += 1;
            return a;
        }
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let (line, kind) = match self.kind {
            WorkloadKind::Gups => (self.rng.below(self.lines), AccessKind::Update),
            WorkloadKind::Mmap => (self.rng.below(self.lines), AccessKind::Read),
            WorkloadKind::Sequential | WorkloadKind::Trace => {
                let l = self.next_line;
                self.next_line += 1;
                if self.next_line >= self.slice_end {
                    self.next_line = self.slice_start;
                }
                (l, AccessKind::Read)
            }
        };
        Some(Access {
            addr: line * self.line_bytes,
            kind,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_parse_and_bad_lines_name_their_number() {
        let w = Workload::from_trace("# t\nR 0x40\nU 128 1\nW 0X1000 1\n", 64).unwrap();
        assert_eq!(w.threads, 2);
        assert_eq!(w.accesses, 3);
        let mut s = w.streams(1);
        assert_eq!(s[0].next_access().unwrap().addr, 0x40);
        assert_eq!(s[1].next_access().unwrap().kind, AccessKind::Update);
        let e = Workload::from_trace("R 1\nX 2\n", 64).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        assert!(Workload::from_trace("R zz", 64).is_err());
        assert!(Workload::from_trace("", 64).is_err());
    }

    #[test]
    fn generated_streams_stay_in_the_footprint_and_split_the_work() {
        let w = Workload::new(WorkloadKind::Gups, 3, 100, 1 << 20, 64).unwrap();
        let mut total = 0;
        for mut s in w.streams(9) {
            while let Some(a) = s.next_access() {
                assert!(a.addr < 1 << 20);
                total += 1;
            }
        }
        assert_eq!(total, 100);
        assert!(WorkloadKind::parse("gupz").unwrap_err().contains("mmap"));
    }
}
