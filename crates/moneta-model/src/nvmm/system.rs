//! One simulated run: threads issuing a workload's accesses to one of the
//! three memory systems (NVMM, DRAM + SSD, all-DRAM), on the discrete-event
//! kernel (SPEC §7 "Evaluation").
//!
//! Each thread is an in-order core: it issues an access, waits for it (or
//! not, for a posted write), computes for `cpu.think_ns`, and issues the
//! next. The event queue orders the threads' steps in virtual time; the
//! memory systems answer by reservation (`controller.rs`, `baseline.rs`).
//! The result is the time until the last thread finishes: the report's
//! IPC comparisons become ratios of these times for the same work.

use super::baseline::{AllDram, SsdStats, SsdSystem};
use super::config::NvmmConfig;
use super::controller::{ControllerStats, HybridController};
use super::flash::FlashStats;
use super::journal::JournalStats;
use super::workload::{Access, Workload};
use super::NvmmError;
use crate::kernel::EventQueue;
use crate::units::Ns;
use serde::Serialize;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SystemKind {
    Nvmm,
    Ssd,
    AllDram,
}

impl SystemKind {
    pub const ALL: [&'static str; 3] = ["nvmm", "ssd", "all-dram"];

    pub fn parse(name: &str) -> Result<SystemKind, String> {
        match name {
            "nvmm" => Ok(SystemKind::Nvmm),
            "ssd" => Ok(SystemKind::Ssd),
            "all-dram" | "dram" => Ok(SystemKind::AllDram),
            other => Err(format!(
                "unknown system '{other}' (expected one of {})",
                Self::ALL.join(", ")
            )),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SystemKind::Nvmm => "nvmm",
            SystemKind::Ssd => "ssd",
            SystemKind::AllDram => "all-dram",
        }
    }
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunResult {
    pub system: &'static str,
    pub preset: String,
    pub workload: &'static str,
    pub threads: u32,
    pub accesses: u64,
    pub footprint_bytes: u64,
    pub backing_read_ns: u64,
    pub prefetch_pages: u32,
    /// Virtual time until the last thread finished.
    pub elapsed_ns: u64,
    pub accesses_per_s: f64,
    pub latency_ns_mean: f64,
    /// Accesses served from DRAM without a flash/SSD read.
    pub hit_rate: f64,
    pub flash_reads: u64,
    pub flash_programs: u64,
    pub flash_erases: u64,
    pub flash_queue_wait_ns: u64,
    pub nvmm: Option<ControllerStats>,
    pub journal: Option<JournalStats>,
    pub ssd: Option<SsdStats>,
    pub seed: u64,
}

enum Machine {
    Nvmm(Box<HybridController>),
    Ssd(Box<SsdSystem>),
    Dram(AllDram),
}

impl Machine {
    #[inline]
    fn access(&mut self, now: Ns, a: Access) -> Result<Ns, NvmmError> {
        match self {
            Machine::Nvmm(c) => c.access(now, a).map_err(NvmmError::Flash),
            Machine::Ssd(s) => Ok(s.access(now, a)),
            Machine::Dram(d) => Ok(d.access(now, a)),
        }
    }
}

/// Run `workload` on `system`; the same inputs give the same result.
pub fn run(
    config: &NvmmConfig,
    system: SystemKind,
    workload: &Workload,
    seed: u64,
) -> Result<RunResult, NvmmError> {
    if workload.threads > config.cpu.cores {
        return Err(NvmmError::Workload(format!(
            "{} threads on {} cores (cpu.cores): one thread per core",
            workload.threads, config.cpu.cores
        )));
    }
    if workload.line_bytes != config.dram.line_bytes {
        return Err(NvmmError::Workload(
            "the workload's line size differs from dram.line_bytes".into(),
        ));
    }
    let mut machine = match system {
        SystemKind::Nvmm => {
            let mut c = HybridController::new(config, workload.footprint_bytes, seed)
                .map_err(NvmmError::Flash)?;
            if workload.warm {
                c.warm();
            }
            Machine::Nvmm(Box::new(c))
        }
        SystemKind::Ssd => {
            let mut s = SsdSystem::new(config, workload.footprint_bytes, workload.anonymous);
            if workload.warm {
                s.warm();
            }
            Machine::Ssd(Box::new(s))
        }
        SystemKind::AllDram => Machine::Dram(AllDram::new(config)),
    };
    let mut streams = workload.streams(seed);
    let mut queue: EventQueue<u32> = EventQueue::new();
    for t in 0..workload.threads {
        queue.push(0, t);
    }
    let think = config.cpu.think_ns;
    let (mut finished, mut accesses, mut latency_sum) = (0, 0u64, 0u128);
    while let Some((now, thread)) = queue.peek() {
        match streams[thread as usize].next_access() {
            None => {
                finished = finished.max(now);
                queue.pop();
            }
            Some(a) => {
                let done = machine.access(now, a)?;
                accesses += 1;
                latency_sum += u128::from(done - now);
                queue.replace_top(done + think, thread);
            }
        }
    }
    let elapsed_ns = finished.max(1);
    let (hits, flash, nvmm, journal, ssd) = match &machine {
        Machine::Nvmm(c) => (
            c.stats().hits - c.stats().hits_in_flight,
            c.flash_stats(),
            Some(c.stats()),
            Some(c.journal_stats()),
            None,
        ),
        Machine::Ssd(s) => (s.stats().hits, s.flash_stats(), None, None, Some(s.stats())),
        Machine::Dram(_) => (accesses, FlashStats::default(), None, None, None),
    };
    Ok(RunResult {
        system: system.name(),
        preset: config.name.clone(),
        workload: workload.kind.name(),
        threads: workload.threads,
        accesses,
        footprint_bytes: workload.footprint_bytes,
        backing_read_ns: config.flash.read_ns,
        prefetch_pages: config.controller.prefetch_pages,
        elapsed_ns,
        accesses_per_s: accesses as f64 * 1e9 / elapsed_ns as f64,
        latency_ns_mean: latency_sum as f64 / accesses.max(1) as f64,
        hit_rate: hits as f64 / accesses.max(1) as f64,
        flash_reads: flash.reads,
        flash_programs: flash.programs,
        flash_erases: flash.erases,
        flash_queue_wait_ns: flash.queue_wait_ns,
        nvmm,
        journal,
        ssd,
        seed,
    })
}
