//! One SAN node's real device logic on a virtual clock, for the replica
//! protocol's deterministic simulator (`san_sim`, issue 39 item 6; SPEC
//! §4.3 and README "Replica states and split brain").
//!
//! A [`SimNode`] is the daemon's own `DeviceThread` (the same code: command
//! slots in shared memory, the model's driver, the port's liveness, leases,
//! resync, resolves, dirty map and replica metadata, `engine/port.rs`),
//! built on a `VirtualClock` instead of the wall clock and turned by the
//! caller instead of a reactor: the caller decides what time it is
//! (`turn(now)`), so many nodes run on one thread and a run is a function
//! of its inputs. Its one client channel is real channel memory, written
//! as libmoneta writes it (command words, DMA buffer, status words).
//! Killing a node is dropping it: nothing it held in memory survives, its
//! medium's files (image, replica metadata, dirty map) do.

use super::*;
use moneta_abi::stats::{PortStats, SliceStatus};
use moneta_model::kernel::VirtualClock;

/// The id of a simulated node's client channel.
const SIM_CHANNEL: u16 = 1;

/// A SAN node's device, turned by the caller on a virtual clock.
pub struct SimNode {
    core: DeviceThread<VirtualClock>,
    memory: Arc<ChannelMemory>,
    /// Each tag's last sequence number, and the tags in flight.
    sequence: [u16; CHANNEL_TAGS],
    busy: u64,
}

/// A request's outcome as the client sees it.
pub type SimResult = Result<(), ResultCode>;

impl SimNode {
    /// Start a node on `medium` with `port` (`SanFile::port_on` over the
    /// in-memory wire) at virtual time `now`.
    pub fn start(
        config: Config,
        medium: Medium,
        port: SanPort,
        seed: u64,
        now: Ns,
    ) -> Result<SimNode, EmuError> {
        check_device(&config, &medium)?;
        let global = port.routes.global_bytes();
        let shared = Shared::new(config, medium, global, Wake::new()?)?;
        let options = EngineOptions {
            seed,
            // Completions at their model time: no cores to cross.
            post_ahead_ns: 0,
            ..EngineOptions::default()
        };
        let clock = VirtualClock::new();
        clock.advance_to(now);
        let mut core = DeviceThread::new(shared.clone(), &options, clock, Some(port))?;
        let memory = Arc::new(
            ChannelMemory::create(SIM_CHANNEL, &shared.wake.doorbell)
                .map_err(|e| EmuError::io("the simulated client's channel", e))?,
        );
        let (done, _rx) = mpsc::sync_channel(1);
        let (perms, _prx) = mpsc::sync_channel(1);
        shared.mailbox.lock().expect("mailbox").extend([
            ControlOp::AddChannel {
                id: SIM_CHANNEL,
                memory: memory.clone(),
                done,
            },
            ControlOp::Permissions {
                updates: vec![raw_record(
                    SIM_CHANNEL,
                    0,
                    global,
                    protection::READ | protection::WRITE,
                )],
                done: perms,
            },
        ]);
        core.apply_control();
        Ok(SimNode {
            core,
            memory,
            sequence: [0; CHANNEL_TAGS],
            busy: 0,
        })
    }

    /// One turn at `now` (never earlier than the last): take the client's
    /// commands, deliver model events, move the port's frames, run its
    /// timers. Returns whether it did anything.
    pub fn turn(&mut self, now: Ns) -> bool {
        self.core.clock.advance_to(now);
        self.core.turn(now)
    }

    /// The earliest time this node has something due of its own: its
    /// model's next event, or a held command's retry (its port's timers
    /// apart). The simulator's clock does not jump past it.
    pub fn next_due(&self) -> Option<Ns> {
        let model = self.core.driver.next_event_time();
        let held = self.core.held.iter().map(|h| h.next).min();
        match (model, held) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A free tag of the client channel, if any.
    pub fn free_tag(&self) -> Option<u8> {
        let free = !self.busy;
        (free != 0).then(|| free.trailing_zeros() as u8)
    }

    /// Issue `op` on global `[addr, addr + data.len())` on `tag` (free:
    /// `free_tag`); a write's bytes are `data`. At most `SLICE_BYTES`.
    pub fn submit(&mut self, tag: u8, op: Op, addr: u64, data: &[u8]) -> Result<(), EmuError> {
        let t = tag as usize;
        if t >= CHANNEL_TAGS || self.busy & (1 << t) != 0 || data.len() > SLICE_BYTES {
            return Err(EmuError::new(
                ErrorKind::Protocol,
                "tag busy or request too big",
            ));
        }
        let command = command::Command {
            tag,
            op,
            addr: DeviceAddr(addr),
            len_bytes: data.len() as u64,
            host_dma_addr: None,
            barrier: false,
            dma_completion: true,
        };
        self.sequence[t] = self.sequence[t].wrapping_add(1);
        let words = command::encode_channel(&command, self.sequence[t])
            .map_err(|e| EmuError::new(ErrorKind::Protocol, e.to_string()))?;
        if op == Op::Write {
            let dst = self
                .memory
                .dma_ptr(t * SLICE_BYTES, data.len())
                .expect("a tag's slice is in the DMA buffer");
            // SAFETY: the tag's slice of the DMA buffer, which the device
            // reads only after the SUBMITTED bit below flips.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        }
        self.memory
            .tag_status(t)
            .store(0, std::sync::atomic::Ordering::Relaxed);
        let stamp = self.core.clock.now();
        self.memory.submit(t, stamp, words[0], words[1]);
        self.busy |= 1 << t;
        Ok(())
    }

    /// Requests finished since the last call: (tag, outcome). A read's
    /// bytes are in `read_data` until the tag is used again.
    pub fn completed(&mut self, out: &mut Vec<(u8, SimResult)>) {
        let mut busy = self.busy;
        while busy != 0 {
            let t = busy.trailing_zeros() as usize;
            busy &= busy - 1;
            let word = self
                .memory
                .tag_status(t)
                .load(std::sync::atomic::Ordering::Acquire);
            if word & channel::STATUS_DONE == 0 || (word >> 32) as u16 != self.sequence[t] {
                continue;
            }
            self.busy &= !(1 << t);
            let code = ResultCode::from_u32(word as u32);
            out.push((
                t as u8,
                if code == ResultCode::Ok {
                    Ok(())
                } else {
                    Err(code)
                },
            ));
        }
    }

    /// The bytes a read on `tag` returned.
    pub fn read_data(&self, tag: u8, buf: &mut [u8]) {
        let src = self
            .memory
            .dma_ptr(tag as usize * SLICE_BYTES, buf.len())
            .expect("a tag's slice is in the DMA buffer");
        // SAFETY: the tag's slice, which the device wrote before the status.
        unsafe { std::ptr::copy_nonoverlapping(src, buf.as_mut_ptr(), buf.len()) };
    }

    /// Tags in flight.
    pub fn in_flight(&self) -> u32 {
        self.busy.count_ones()
    }

    /// `moneta san resolve --discard` of this node's side (all its split
    /// brain slices, or `slice`): the answer comes on the returned
    /// receiver once the slices' primary holders decided.
    pub fn discard(&mut self, slice: Option<usize>) -> mpsc::Receiver<Result<String, String>> {
        let (done, rx) = mpsc::sync_channel(1);
        self.core.discard(slice, done);
        rx
    }

    /// `moneta san resolve --force` on this node.
    pub fn force(&mut self, slice: Option<usize>) -> Result<String, String> {
        self.core.force(slice)
    }

    /// This node's copies as `moneta san status` shows them.
    pub fn slices(&self) -> Vec<SliceStatus> {
        self.port_stats().map(|p| p.slices).unwrap_or_default()
    }

    /// Its port's counters and states (without the rest of the engine's
    /// snapshot: the simulator asks after every turn while it settles).
    pub fn port_stats(&self) -> Option<PortStats> {
        self.core.port_snapshot()
    }

    /// The disk of its dirty map refuses writes (`full`) or takes them.
    pub fn set_dirty_disk_full(&mut self, full: bool) {
        if let Some(p) = self.core.port.as_mut() {
            p.dirty_mut().set_full(full);
        }
    }
}

pub use super::port::{capture_log, take_log};
