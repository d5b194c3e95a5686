//! Host software stacks that drive the device (SPEC §2, §3, §6).
//!
//! A stack turns one IO request of a thread into a short program of steps:
//! software on the thread's core, serialized sections (locks, the single
//! no-op scheduler thread, the memory bus), issuing the command, and waiting
//! for the completion by spinning (the core stays busy) or sleeping (the core
//! is free; the interrupt handler and the wake-up follow the device). The
//! costs are Table 3.1 (kernel stacks) and Table 4.2 (Moneta-D); which steps
//! exist is what each optimization of SPEC §2.2 changed:
//!
//! | stack | block layer | scheduler thread | locks | command | completion |
//! |---|---|---|---|---|---|
//! | base | yes, all of it in one thread | single (+2 µs switch), also completes | (subsumed) | 3 PIO words | sleep |
//! | nosched | yes | none | hardware + data | 3 PIO words | sleep |
//! | atomic | yes | none | none | 1 atomic word | sleep |
//! | spin, 2q, balance | yes | none | none | 1 atomic word | spin ≤ 4 KB, else sleep |
//! | direct | no (library) | none | none | 1 word, channel | DMA / forwarding / issue-sleep |
//! | ramdisk | yes | none | none | CPU copies | synchronous |
//! | raw | no software at all (the device alone, to compare with the emulator) | | | 1 atomic word | seen at once |
//!
//! With a file system (`host.file_system`), every kernel stack also pays
//! Table 3.1's file-system time, and its writes hold the file's write lock
//! ([`FileLock`], `host.fs_write_atomicity`) from the file system's entry
//! until their completion is noticed (`Step::FileLock`, `Step::FileUnlock`).

pub mod extent_map;

use crate::breakdown::{Component, Parts};
use crate::config::{Completion, Config, Stack};
use crate::units::{Ns, Op, PAGE_BYTES};
use std::collections::VecDeque;

/// A file's write lock in a kernel file system (POSIX write atomicity): a
/// write takes it as it enters the file system and gives it back once its
/// completion is noticed; the others sleep in FIFO order, off their cores. Dissertation
/// §4.4.2 ("Adding a file system reduces performance for the original
/// Moneta system by up to 13×" for writes, at most 34% for reads) and §5.4.3
/// ("Some of that cost goes towards enforcing atomicity guarantees");
/// §5.2.2: the user-space path relaxes it. One lock per file: a thread
/// group's file in the simulator, a host's in the SAN (`san.fs_write_atomicity`).
#[derive(Debug, Clone, Default)]
pub struct FileLock {
    held: bool,
    /// Sleeping writers, by their thread number, in arrival order.
    waiters: VecDeque<u32>,
}

impl FileLock {
    /// Take the lock for thread `who`, or queue it behind the holder:
    /// `true` if `who` holds the lock now.
    pub fn acquire(&mut self, who: u32) -> bool {
        if self.held {
            self.waiters.push_back(who);
            false
        } else {
            self.held = true;
            true
        }
    }

    /// The holder gives the lock back: the waiter that holds it now, if any.
    pub fn release(&mut self) -> Option<u32> {
        debug_assert!(self.held, "released a free lock");
        let next = self.waiters.pop_front();
        self.held = next.is_some();
        next
    }
}

/// Whether an `op` request of a kernel stack on `config` holds its file's
/// write lock (`host.fs_write_atomicity`): writes through the file system.
/// Moneta-D's library and the raw device bypass the file system.
pub fn holds_file_write_lock(config: &Config, op: Op) -> bool {
    let h = &config.host;
    op == Op::Write
        && h.file_system
        && h.fs_write_atomicity
        && !matches!(h.stack, Stack::Direct | Stack::Raw)
}

/// Serialized resources shared by the threads of one host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// The no-op IO scheduler's single kernel thread (Base).
    IoScheduler,
    /// The lock around the multi-word PIO interface and tag status (Base, NoSched).
    HardwareLock,
    /// The lock around shared driver data, e.g. the tag pool (Base, NoSched).
    DataLock,
    /// HASTE's driver lock.
    DriverLock,
    /// Host memory channels (DDR ramdisk).
    MemoryBus,
}

pub const SERVERS: usize = 5;

impl Server {
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One step of a request's program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Software on the thread's core.
    Cpu(Ns),
    /// A serialized section; the thread keeps its core while it waits (spinlock).
    Serial(Server, Ns),
    /// Take a tag and hand the command to the device (for Moneta-D, the
    /// device's retag and protection stages time their own part).
    Issue,
    /// Spin on the core until the completion is seen, `detect_ns` after the device finished.
    Spin { detect_ns: Ns },
    /// Spin for a forwarded interrupt (Moneta-D, dissertation §4.3.4): the
    /// kernel's handler runs on the interrupt core and bumps the channel's
    /// COMPLETIONCOUNT; a spinning thread of the channel reads (and so
    /// clears) its TAGSTATUSREGISTER, one PIO word serving every tag set by
    /// then; the thread then spends `detect_ns` noticing its own tag.
    Forwarded(Forwarded),
    /// Sleep; the interrupt handler (under `lock` if any) and the wake-up run after the device finishes.
    Sleep {
        interrupt_ns: Ns,
        lock: Option<Server>,
        wake_ns: Ns,
    },
    /// Take the file's write lock as the file system is entered, sleeping
    /// off the core until it is handed over ([`FileLock`]).
    FileLock,
    /// Give the file's write lock back: the completion has been noticed.
    FileUnlock,
    /// A request split by the block queue's `max_sectors`
    /// ([`request_pieces`]): while pieces remain to be issued, go back to
    /// step `from` (the per-piece block layer, tag, PIO and issue).
    NextPiece { from: u8 },
}

/// How a kernel request of `bytes` reaches the Moneta driver: `(piece
/// bytes, pieces)`. Linux 2.6.18's `bio_add_page` refuses a page that
/// would take a bio past the queue's `max_sectors` (`__bio_add_page`), so
/// with `SAFE_MAX_SECTORS` = 255 (what `blk_queue_make_request` sets; the
/// seeds do not say Moneta's driver raised it) a bio holds 31 whole pages,
/// 124 KB, and direct IO submits each full bio before it builds the next
/// (`dio_bio_submit`), then waits for them all. A 512 KB O_DIRECT read
/// arrives as four 124 KB requests and one 16 KB one. Moneta-D's user-space
/// library, the raw device and the ramdisk are not split; nor is
/// `host.max_sectors = 0`.
pub fn request_pieces(config: &Config, bytes: u64) -> (u64, u32) {
    let h = &config.host;
    let kernel_moneta = matches!(
        h.stack,
        Stack::Base
            | Stack::NoSched
            | Stack::Atomic
            | Stack::Spin
            | Stack::TwoQueue
            | Stack::Balance
    );
    if !kernel_moneta || h.max_sectors == 0 {
        return (bytes, 1);
    }
    let piece = (u64::from(h.max_sectors) * 512 / PAGE_BYTES).max(1) * PAGE_BYTES;
    if bytes <= piece {
        return (bytes, 1);
    }
    (piece, bytes.div_ceil(piece) as u32)
}

/// A forwarded completion's costs (`Step::Forwarded`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forwarded {
    pub interrupt_ns: Ns,
    pub register_read_ns: Ns,
    pub detect_ns: Ns,
}

/// A request's program: at most `MAX_STEPS` steps, no allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    steps: [Step; Plan::MAX_STEPS],
    len: u8,
    /// Steps before this one are not merged into (the first step of a
    /// split request's per-piece part).
    barrier: u8,
    /// The fixed time of the `Cpu` and `Serial` steps, by component (where
    /// time goes, SPEC §2.1): their sum is the sum of those steps as run
    /// (a split request's per-piece steps once per piece).
    software: Parts,
}

impl Default for Plan {
    fn default() -> Self {
        Plan {
            steps: [Step::Cpu(0); Plan::MAX_STEPS],
            len: 0,
            barrier: 0,
            software: Parts::default(),
        }
    }
}

impl Plan {
    /// The longest program: NoSched with a driver lock, a file system and
    /// its write lock, split in pieces, takes 13 steps.
    pub const MAX_STEPS: usize = 14;

    fn push(&mut self, step: Step) {
        // Merge consecutive CPU work; drop empty work.
        let last = self
            .len
            .checked_sub(1)
            .filter(|&i| i >= self.barrier)
            .map(|i| &mut self.steps[i as usize]);
        match (step, last) {
            (Step::Cpu(0), _) | (Step::Serial(_, 0), _) => {}
            (Step::Cpu(b), Some(Step::Cpu(a))) => *a += b,
            (s, _) => {
                assert!((self.len as usize) < Self::MAX_STEPS, "plan too long");
                self.steps[self.len as usize] = s;
                self.len += 1;
            }
        }
    }

    pub fn get(&self, i: usize) -> Option<Step> {
        (i < self.len as usize).then(|| self.steps[i])
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps[..self.len as usize]
    }

    /// The fixed software time of the request, by component.
    pub fn software(&self) -> &Parts {
        &self.software
    }

    /// Label `ns` of the following `Cpu` or `Serial` step as `component`.
    fn cost(&mut self, component: Component, ns: Ns) -> Ns {
        self.software.add(component, ns)
    }

    /// Label `ns` of a step that runs once per piece of a request split in
    /// `pieces`; returns the one run's `ns`.
    fn cost_each(&mut self, component: Component, ns: Ns, pieces: u32) -> Ns {
        self.software.add(component, ns * u64::from(pieces));
        ns
    }

    /// The per-piece part of a split request starts with the next step.
    fn piece_start(&mut self) -> u8 {
        self.barrier = self.len;
        self.len
    }

    /// After the per-piece part: go back while pieces remain.
    fn piece_end(&mut self, from: u8, pieces: u32) {
        if pieces > 1 {
            self.push(Step::NextPiece { from });
            self.barrier = self.len;
        }
    }

    /// The time of the `Cpu` and `Serial` steps as a request of `pieces`
    /// runs them (the per-piece part once per piece).
    pub fn software_steps_ns(&self, pieces: u32) -> Ns {
        let ns = |steps: &[Step]| -> Ns {
            steps
                .iter()
                .map(|s| match *s {
                    Step::Cpu(ns) | Step::Serial(_, ns) => ns,
                    _ => 0,
                })
                .sum()
        };
        let mut total = ns(self.steps());
        for (i, s) in self.steps().iter().enumerate() {
            if let Step::NextPiece { from } = *s {
                let each = ns(&self.steps()[from as usize..i]);
                total += each * u64::from(pieces.saturating_sub(1));
            }
        }
        total
    }
}

/// What a direct-stack request met in the library's extent map (SPEC §3.2).
/// Hard misses are the device's answer at issue: see [`hard_miss_ns`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PermissionOutcome {
    pub soft_miss: bool,
}

/// The library's time for a hard miss (SPEC §3.2): the device took the
/// request through its pipeline and a table walk of `rejected_steps` steps,
/// rejected it for a missing record; the library notices the error,
/// re-installs the record and retries the issue.
pub fn hard_miss_ns(config: &Config, rejected_steps: u32) -> Ns {
    let d = &config.direct;
    config.device.pipeline_ns
        + rejected_steps as u64 * d.tree_step_ns
        + d.hard_miss_detect_ns
        + d.permission_update_ns
}

fn rw(op: Op, read: u64, write: u64) -> Ns {
    match op {
        Op::Read => read,
        Op::Write => write,
    }
}

fn per_kb(ns_per_kb: u64, bytes: u64) -> Ns {
    (ns_per_kb * bytes).div_ceil(1024)
}

/// (copy into the DMA buffer before issue, copy out of it after completion):
/// writes copy in, reads copy out.
fn copies(op: Op, bytes: u64, read_ns_per_kb: u64, write_ns_per_kb: u64) -> (Ns, Ns) {
    match op {
        Op::Write => (per_kb(write_ns_per_kb, bytes), 0),
        Op::Read => (0, per_kb(read_ns_per_kb, bytes)),
    }
}

/// The system call's entry, then (for a write through the file system)
/// the file's write lock as the file system is entered.
fn enter(p: &mut Plan, syscall_entry: Ns, locks: bool) {
    let entry = p.cost(Component::SyscallEntry, syscall_entry);
    p.push(Step::Cpu(entry));
    if locks {
        p.push(Step::FileLock);
    }
}

/// The completion is noticed: give the file's write lock back.
fn unlock(p: &mut Plan, locks: bool) {
    if locks {
        p.push(Step::FileUnlock);
    }
}

/// Build the program of one request.
pub fn plan(config: &Config, op: Op, bytes: u64, permissions: PermissionOutcome) -> Plan {
    use Component as K;
    let h = &config.host;
    let c = &h.costs;
    let mut p = Plan::default();
    let syscall_entry = rw(op, c.syscall_entry_ns_read, c.syscall_entry_ns_write);
    let file_system = if h.file_system {
        rw(op, c.file_system_ns_read, c.file_system_ns_write)
    } else {
        0
    };
    let block = rw(op, c.block_layer_ns_read, c.block_layer_ns_write)
        .saturating_sub(c.io_scheduler_switch_ns);
    let tag = rw(op, c.tag_ns_read, c.tag_ns_write);
    let (copy_in, copy_out) = copies(op, bytes, c.copy_ns_per_kb_read, c.copy_ns_per_kb_write);
    let pio = rw(op, c.pio_ns_read, c.pio_ns_write);
    // The atomic interface writes one of the baseline's three command words.
    let pio_word = pio / 3;
    let interrupt_ns = rw(op, c.interrupt_ns_read, c.interrupt_ns_write);
    let wake_ns = rw(op, c.wake_ns_read, c.wake_ns_write);
    let ret = rw(op, c.return_ns_read, c.return_ns_write);
    let issue = Step::Issue;
    let locks = holds_file_write_lock(config, op);
    // A request the block queue splits (`request_pieces`) pays the block
    // layer, the tag, the PIO and the driver lock once per piece, the copy
    // in equal shares, and the rest once.
    let (_, pieces) = request_pieces(config, bytes);
    let copy_in = copy_in / u64::from(pieces);
    // Each cost goes through `p.cost` with its Table 3.1 / 4.2 label, in
    // the order the request pays it.
    match h.stack {
        Stack::Base => {
            // "The no-op scheduler is single-threaded so it removes any
            // parallelism in request handling" (SPEC §2.2): the whole block
            // queue, the dispatch (tag, copy, PIO) and the completion run in
            // the one scheduler context, one request at a time.
            let full_block = rw(op, c.block_layer_ns_read, c.block_layer_ns_write);
            enter(&mut p, syscall_entry, locks);
            let fs = p.cost(K::FileSystem, file_system);
            p.push(Step::Cpu(fs));
            let from = if pieces > 1 { p.piece_start() } else { 0 };
            let dispatch = p.cost_each(K::BlockLayer, full_block, pieces)
                + p.cost_each(K::Tag, tag, pieces)
                + p.cost_each(K::CopyIn, copy_in, pieces)
                + p.cost_each(K::Pio, pio, pieces);
            p.push(Step::Serial(Server::IoScheduler, dispatch));
            let lock = p.cost_each(K::DriverLock, h.driver_lock_ns, pieces);
            p.push(Step::Serial(Server::DriverLock, lock));
            p.push(issue);
            p.piece_end(from, pieces);
            p.push(Step::Sleep {
                interrupt_ns,
                lock: Some(Server::IoScheduler),
                wake_ns,
            });
            unlock(&mut p, locks);
            let exit = p.cost(K::CopyOut, copy_out) + p.cost(K::Return, ret);
            p.push(Step::Cpu(exit));
        }
        Stack::NoSched => {
            // The calling thread issues: block layer without the scheduler
            // switch, the tag pool under the data lock, the multi-word PIO and
            // the tag status under the hardware lock.
            enter(&mut p, syscall_entry, locks);
            let fs = p.cost(K::FileSystem, file_system);
            p.push(Step::Cpu(fs));
            let from = if pieces > 1 { p.piece_start() } else { 0 };
            let block = p.cost_each(K::BlockLayer, block, pieces);
            p.push(Step::Cpu(block));
            let tag = p.cost_each(K::Tag, tag, pieces);
            p.push(Step::Serial(Server::DataLock, tag));
            let copy_in = p.cost_each(K::CopyIn, copy_in, pieces);
            p.push(Step::Cpu(copy_in));
            let pio = p.cost_each(K::Pio, pio, pieces);
            p.push(Step::Serial(Server::HardwareLock, pio));
            let lock = p.cost_each(K::DriverLock, h.driver_lock_ns, pieces);
            p.push(Step::Serial(Server::DriverLock, lock));
            p.push(issue);
            p.piece_end(from, pieces);
            p.push(Step::Sleep {
                interrupt_ns,
                lock: Some(Server::HardwareLock),
                wake_ns,
            });
            unlock(&mut p, locks);
            let exit = p.cost(K::CopyOut, copy_out) + p.cost(K::Return, ret);
            p.push(Step::Cpu(exit));
        }
        Stack::Atomic | Stack::Spin | Stack::TwoQueue | Stack::Balance => {
            enter(&mut p, syscall_entry, locks);
            let fs = p.cost(K::FileSystem, file_system);
            p.push(Step::Cpu(fs));
            let from = if pieces > 1 { p.piece_start() } else { 0 };
            let entry = p.cost_each(K::BlockLayer, block, pieces)
                + p.cost_each(K::Tag, tag, pieces)
                + p.cost_each(K::CopyIn, copy_in, pieces)
                + p.cost_each(K::Pio, pio_word, pieces);
            p.push(Step::Cpu(entry));
            let lock = p.cost_each(K::DriverLock, h.driver_lock_ns, pieces);
            p.push(Step::Serial(Server::DriverLock, lock));
            p.push(issue);
            p.piece_end(from, pieces);
            if h.stack != Stack::Atomic && bytes <= h.spin_max_bytes {
                // The spinning thread reads the tag status register: one PIO word.
                p.push(Step::Spin {
                    detect_ns: pio_word,
                });
            } else {
                p.push(Step::Sleep {
                    interrupt_ns,
                    lock: None,
                    wake_ns,
                });
            }
            unlock(&mut p, locks);
            let exit = p.cost(K::CopyOut, copy_out) + p.cost(K::Return, ret);
            p.push(Step::Cpu(exit));
        }
        Stack::Direct => {
            let d = &config.direct;
            let many = d.file_extents > 1;
            let lookup = if many {
                d.extent_lookup_ns_many
            } else {
                d.extent_lookup_ns_one
            };
            let mut software = p.cost(
                K::Library,
                rw(op, d.library_ns_read, d.library_ns_write) + lookup,
            );
            if permissions.soft_miss {
                let miss = if many {
                    d.soft_miss_ns_many
                } else {
                    d.soft_miss_ns_one
                } + d.permission_update_ns;
                software += p.cost(K::PermissionMiss, miss);
            }
            let (copy_in, copy_out) =
                copies(op, bytes, d.copy_ns_per_kb_read, d.copy_ns_per_kb_write);
            software += p.cost(K::CopyIn, copy_in);
            p.push(Step::Cpu(software));
            p.push(issue);
            match d.completion {
                Completion::Dma => p.push(Step::Spin {
                    detect_ns: rw(op, d.completion_ns_read_dma, d.completion_ns_write_dma),
                }),
                Completion::Forwarding => {
                    // Table 4.2's one-thread 2.71 / 2.36 µs is the interrupt
                    // message, the handler (Table 3.1's), the register read
                    // (one PIO word) and the thread's own rest.
                    let total = rw(
                        op,
                        d.completion_ns_read_forwarding,
                        d.completion_ns_write_forwarding,
                    );
                    let notify = config.link.latency_ns_device_to_host;
                    p.push(Step::Forwarded(Forwarded {
                        interrupt_ns,
                        register_read_ns: pio_word,
                        detect_ns: total.saturating_sub(notify + interrupt_ns + pio_word),
                    }));
                }
                Completion::IssueSleep => {
                    let syscall = rw(op, d.syscall_ns_read, d.syscall_ns_write);
                    let total = rw(
                        op,
                        d.completion_ns_read_issue_sleep,
                        d.completion_ns_write_issue_sleep,
                    );
                    let syscall = p.cost(K::SyscallEntry, syscall);
                    p.push(Step::Cpu(syscall));
                    // "When an interrupt arrives, the OS restarts the
                    // thread" (§4.3.4): the handler, then the wake-up.
                    p.push(Step::Sleep {
                        interrupt_ns,
                        lock: None,
                        wake_ns: total.saturating_sub(syscall + interrupt_ns),
                    });
                }
            }
            let copy_out = p.cost(K::CopyOut, copy_out);
            p.push(Step::Cpu(copy_out));
        }
        Stack::Raw => {
            p.push(issue);
            p.push(Step::Spin { detect_ns: 0 });
        }
        Stack::Ramdisk => {
            let r = &config.ramdisk;
            let granules = bytes.div_ceil(r.access_bytes);
            let nvm = granules
                * rw(
                    op,
                    config.memory.latency_ns_read,
                    config.memory.latency_ns_write,
                );
            // The CPU copies through the memory bus: into the ramdisk for
            // writes, out of it for reads.
            let copy = match op {
                Op::Write => K::CopyIn,
                Op::Read => K::CopyOut,
            };
            enter(&mut p, syscall_entry, locks);
            let entry = p.cost(K::FileSystem, file_system) + p.cost(K::BlockLayer, block);
            p.push(Step::Cpu(entry));
            let bus = p.cost(copy, crate::units::transfer_ns(bytes, r.memory_bytes_per_s));
            p.push(Step::Serial(Server::MemoryBus, bus));
            let rest = p.cost(copy, crate::units::transfer_ns(bytes, r.copy_bytes_per_s))
                + p.cost(K::Array, nvm);
            p.push(Step::Cpu(rest));
            unlock(&mut p, locks);
            let ret = p.cost(K::Return, ret);
            p.push(Step::Cpu(ret));
        }
    }
    debug_assert_eq!(
        p.software.total_ns(),
        p.software_steps_ns(pieces),
        "every software cost is labelled"
    );
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_block_queue_splits_at_max_sectors_in_whole_pages() {
        let mut c = Config::preset("moneta").unwrap();
        c.set_stack(Stack::Balance);
        // SAFE_MAX_SECTORS = 255: 31 pages, 124 KB.
        assert_eq!(request_pieces(&c, 512 << 10), (124 << 10, 5));
        assert_eq!(request_pieces(&c, 124 << 10), (124 << 10, 1));
        assert_eq!(request_pieces(&c, 1 << 20), (124 << 10, 9));
        c.host.max_sectors = 1024;
        assert_eq!(request_pieces(&c, 1 << 20), (512 << 10, 2));
        c.host.max_sectors = 0;
        assert_eq!(request_pieces(&c, 1 << 20), (1 << 20, 1));
        c.host.max_sectors = 255;
        c.set_stack(Stack::Direct);
        assert_eq!(request_pieces(&c, 1 << 20), (1 << 20, 1));
        c.host.max_sectors = 4;
        assert!(c.validate().is_err(), "below a page is refused");
        for stack in [Stack::Base, Stack::NoSched, Stack::Atomic, Stack::Balance] {
            let mut c = Config::preset("moneta").unwrap();
            c.set_stack(stack);
            let whole = plan(&c, Op::Write, 512 << 10, PermissionOutcome::default());
            c.host.max_sectors = 0;
            let one = plan(&c, Op::Write, 512 << 10, PermissionOutcome::default());
            assert!(
                whole
                    .steps()
                    .iter()
                    .any(|s| matches!(s, Step::NextPiece { .. })),
                "{stack:?}"
            );
            // Five block-layer passes, tags and PIOs; the copy once in all.
            let k = &c.host.costs;
            let each = k.tag_ns_write
                + match stack {
                    Stack::Base => k.block_layer_ns_write + k.pio_ns_write,
                    Stack::NoSched => {
                        k.block_layer_ns_write - k.io_scheduler_switch_ns + k.pio_ns_write
                    }
                    _ => k.block_layer_ns_write - k.io_scheduler_switch_ns + k.pio_ns_write / 3,
                };
            let copy = one.software().get(Component::CopyIn);
            assert_eq!(
                whole.software().total_ns(),
                one.software().total_ns() + 4 * each - copy + copy / 5 * 5,
                "{stack:?}"
            );
            assert_eq!(whole.software().total_ns(), whole.software_steps_ns(5));
        }
    }

    #[test]
    fn plans_follow_the_optimization_sequence() {
        let mut c = Config::preset("moneta").unwrap();
        let none = PermissionOutcome::default();
        c.set_stack(Stack::Base);
        let base = plan(&c, Op::Write, 4096, none);
        assert!(base
            .steps()
            .iter()
            .any(|s| matches!(s, Step::Serial(Server::IoScheduler, _))));
        c.set_stack(Stack::NoSched);
        let nosched = plan(&c, Op::Write, 4096, none);
        assert!(!nosched
            .steps()
            .iter()
            .any(|s| matches!(s, Step::Serial(Server::IoScheduler, _))));
        assert!(nosched
            .steps()
            .iter()
            .any(|s| matches!(s, Step::Serial(Server::HardwareLock, _))));
        c.set_stack(Stack::Atomic);
        let atomic = plan(&c, Op::Write, 4096, none);
        assert!(!atomic.steps().iter().any(|s| matches!(s, Step::Serial(..))));
        assert!(atomic
            .steps()
            .iter()
            .any(|s| matches!(s, Step::Sleep { .. })));
        c.set_stack(Stack::Spin);
        let spin = plan(&c, Op::Write, 4096, none);
        assert!(spin.steps().iter().any(|s| matches!(s, Step::Spin { .. })));
        let spin_large = plan(&c, Op::Write, 8192, none);
        assert!(spin_large
            .steps()
            .iter()
            .any(|s| matches!(s, Step::Sleep { .. })));
    }

    #[test]
    fn every_stack_plans_every_request_with_every_option() {
        // The longest programs fit `Plan::MAX_STEPS` (a panic otherwise).
        for preset in ["moneta", "haste", "moneta-d", "ddr-ramdisk"] {
            let mut c = Config::preset(preset).unwrap();
            c.host.driver_lock_ns = 5000;
            c.host.file_system = true;
            for stack in Stack::ALL {
                c.set_stack(stack);
                for completion in [
                    Completion::Dma,
                    Completion::Forwarding,
                    Completion::IssueSleep,
                ] {
                    c.direct.completion = completion;
                    for op in [Op::Read, Op::Write] {
                        for bytes in [512, 4096, 1 << 20] {
                            for soft_miss in [false, true] {
                                let p = plan(&c, op, bytes, PermissionOutcome { soft_miss });
                                assert!(!p.steps().is_empty(), "{preset} {stack:?} {op:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn file_lock_serves_writers_in_arrival_order() {
        let mut lock = FileLock::default();
        assert!(lock.acquire(3));
        assert!(!lock.acquire(1));
        assert!(!lock.acquire(2));
        assert_eq!(lock.release(), Some(1));
        assert!(!lock.acquire(0));
        assert_eq!(lock.release(), Some(2));
        assert_eq!(lock.release(), Some(0));
        assert_eq!(lock.release(), None);
        assert!(lock.acquire(4), "free again once nobody waits");
    }

    #[test]
    fn only_kernel_writes_through_a_file_system_take_the_file_lock() {
        let mut c = Config::preset("moneta").unwrap();
        assert!(!holds_file_write_lock(&c, Op::Write), "no file system");
        c.host.file_system = true;
        assert!(holds_file_write_lock(&c, Op::Write));
        assert!(!holds_file_write_lock(&c, Op::Read));
        c.host.fs_write_atomicity = false;
        assert!(!holds_file_write_lock(&c, Op::Write));
        c.host.fs_write_atomicity = true;
        c.set_stack(Stack::Direct);
        assert!(
            !holds_file_write_lock(&c, Op::Write),
            "Moneta-D bypasses it"
        );
    }

    #[test]
    fn the_file_lock_spans_the_file_system_entry_to_the_noticed_completion() {
        let mut c = Config::preset("moneta").unwrap();
        c.host.file_system = true;
        for (stack, bytes) in [
            (Stack::TwoQueue, 512),
            (Stack::TwoQueue, 65536),
            (Stack::Base, 4096),
        ] {
            c.set_stack(stack);
            let p = plan(&c, Op::Write, bytes, PermissionOutcome::default());
            let s = p.steps();
            let lock = s.iter().position(|s| *s == Step::FileLock).unwrap();
            let unlock = s.iter().position(|s| *s == Step::FileUnlock).unwrap();
            // Only the system call's entry runs before the lock.
            assert_eq!(s[..lock], [Step::Cpu(c.host.costs.syscall_entry_ns_write)]);
            assert!(matches!(
                s[unlock - 1],
                Step::Spin { .. } | Step::Sleep { .. }
            ));
            assert_eq!(s[unlock + 1..], [Step::Cpu(c.host.costs.return_ns_write)]);
            let reads = plan(&c, Op::Read, bytes, PermissionOutcome::default());
            assert!(!reads
                .steps()
                .iter()
                .any(|s| matches!(s, Step::FileLock | Step::FileUnlock)));
        }
    }

    #[test]
    fn direct_misses_cost_table_4_2_time() {
        let mut c = Config::preset("moneta-d").unwrap();
        let hit = PermissionOutcome { soft_miss: false };
        let soft = PermissionOutcome { soft_miss: true };
        let cpu = |p: Plan| {
            p.steps()
                .iter()
                .map(|s| if let Step::Cpu(n) = s { *n } else { 0 })
                .sum::<u64>()
        };
        let extra = cpu(plan(&c, Op::Read, 512, soft)) - cpu(plan(&c, Op::Read, 512, hit));
        assert_eq!(extra, 7280); // Table 4.2: soft miss 7.28 µs with 1 extent
        c.direct.completion = Completion::IssueSleep;
        assert!(plan(&c, Op::Read, 512, hit)
            .steps()
            .iter()
            .any(|s| matches!(s, Step::Sleep { .. })));
    }
}
