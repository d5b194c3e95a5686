//! The deterministic twin (DESIGN "One model, two clocks"; STYLE rule 10):
//! the emulator's device logic (command slots in shared memory, decoding
//! and validation, retag, protection, the data copy, the model, the status
//! words) driven by a manual clock must complete a command stream at
//! exactly the model times the simulator's device path (the model's
//! `DeviceDriver` in virtual time) computes for the same stream.
//!
//! The stream is random from a printed seed (`MONETA_TWIN_SEED` replays
//! one): four channels, reads and writes of 512 B to 64 KiB, gaps and
//! bursts, some bursts larger than the 64 physical tags so the retag stage
//! stalls. Both sides see the same client: a command takes its channel's
//! lowest free virtual tag (or waits for one), and a tag is free again once
//! its completion is seen. At each instant both sides turn until idle, and
//! the retag stage takes waiting commands in the same order (channels round
//! robin, lowest tag first).

use super::*;
use moneta_model::device::driver::channel_token;
use moneta_model::device::protection::{RecordSpec, READ, WRITE};
use moneta_model::kernel::{Clock, Rng, VirtualClock};

const CHANNEL_IDS: [u16; 4] = [1, 2, 3, 4];
const CAPACITY_BYTES: u64 = 1 << 30;

#[derive(Debug, Clone, Copy)]
struct Command {
    time_ns: Ns,
    channel: u16,
    op: Op,
    addr: u64,
    len_bytes: u64,
}

fn config() -> Config {
    let mut c = Config::preset("moneta-d").unwrap();
    c.device.capacity_bytes = CAPACITY_BYTES;
    c.validate().unwrap();
    c
}

fn stream(seed: u64, commands: usize) -> Vec<Command> {
    let mut rng = Rng::new(seed);
    let mut time_ns = 0;
    let mut out = Vec::with_capacity(commands);
    while out.len() < commands {
        // Mostly single commands with small or large gaps; sometimes a burst
        // at one instant, up to twice the physical tags.
        let burst = if rng.below(10) == 0 {
            40 + rng.below(90) as usize
        } else {
            1
        };
        time_ns += match rng.below(3) {
            0 => 0,
            1 => 1 + rng.below(500),
            _ => 5_000 + rng.below(45_000),
        };
        for _ in 0..burst.min(commands - out.len()) {
            let channel = CHANNEL_IDS[rng.below(CHANNEL_IDS.len() as u64) as usize];
            let len_bytes = (1 + rng.below(128)) * 512;
            let mut addr = rng.below((CAPACITY_BYTES - len_bytes) / 512) * 512;
            // Stay inside one of the channel's records (a range across two
            // is a missing record, SPEC §3.3): end it at the boundary it
            // would cross (moving it past the boundary instead could carry
            // it beyond the device's end).
            let piece = piece_bytes(channel);
            if addr / piece != (addr + len_bytes - 1) / piece {
                addr = (addr + len_bytes - 1) / piece * piece - len_bytes;
            }
            out.push(Command {
                time_ns,
                channel,
                op: if rng.below(2) == 0 {
                    Op::Read
                } else {
                    Op::Write
                },
                addr,
                len_bytes,
            });
        }
    }
    out
}

/// Size of a channel's permission records (the last takes the rest).
fn piece_bytes(channel: u16) -> u64 {
    CAPACITY_BYTES / (8 + channel as u64 * 5) / 512 * 512
}

/// Permission records of a channel: the device cut into pieces of
/// alternating files (so they do not merge and the tree has depth).
fn records(channel: u16) -> Vec<Update> {
    let piece = piece_bytes(channel);
    let pieces = CAPACITY_BYTES / piece;
    (0..pieces)
        .map(|i| {
            let end = if i + 1 == pieces {
                CAPACITY_BYTES
            } else {
                (i + 1) * piece
            };
            Update::Install(RecordSpec {
                channel,
                file: i % 2,
                start: i * piece,
                len: end - i * piece,
                perms: READ | WRITE,
            })
        })
        .collect()
}

/// The device behind the channels, as the twin harness sees it.
trait TwinDevice {
    /// The client stores a command in (channel, virtual tag)'s slot.
    fn submit(&mut self, command: &Command, virtual_tag: u8, sequence: u16);
    /// One turn at `now`; whether the device did anything.
    fn turn(&mut self, now: Ns) -> bool;
    /// Completions seen since the last call, as (channel, virtual tag).
    fn completed(&mut self, out: &mut Vec<(u16, u8)>);
    fn next_event_time(&self) -> Option<Ns>;
}

/// A command of the stream may not reach past the DMA buffer from its
/// tag's slice (SPEC §3.1).
fn len_for_tag(command: &Command, virtual_tag: u8) -> u64 {
    let room = DMA_BUFFER_BYTES as u64 - virtual_tag as u64 * SLICE_BYTES as u64;
    command.len_bytes.min(room)
}

/// Run the stream; returns each command's completion time.
fn run(device: &mut dyn TwinDevice, commands: &[Command]) -> Vec<Ns> {
    let mut done_ns = vec![Ns::MAX; commands.len()];
    let mut next = 0;
    // Commands due but waiting for a free virtual tag, per channel, in order.
    let mut waiting: Vec<VecDeque<usize>> = vec![VecDeque::new(); CHANNELS];
    let mut holder: Vec<[Option<usize>; CHANNEL_TAGS]> = vec![[None; CHANNEL_TAGS]; CHANNELS];
    let mut sequence = vec![[0u16; CHANNEL_TAGS]; CHANNELS];
    let mut completed = Vec::new();
    loop {
        let due = commands.get(next).map(|c| c.time_ns);
        let now = match (due, device.next_event_time()) {
            (None, None) if waiting.iter().all(|w| w.is_empty()) => break,
            (None, None) => panic!("commands wait but nothing is in flight"),
            (a, b) => a.into_iter().chain(b).min().expect("one is some"),
        };
        while commands.get(next).is_some_and(|c| c.time_ns <= now) {
            waiting[commands[next].channel as usize].push_back(next);
            next += 1;
        }
        loop {
            let mut submitted = false;
            for &channel in &CHANNEL_IDS {
                let ch = channel as usize;
                while let Some(&i) = waiting[ch].front() {
                    let Some(tag) = holder[ch].iter().position(Option::is_none) else {
                        break;
                    };
                    waiting[ch].pop_front();
                    holder[ch][tag] = Some(i);
                    sequence[ch][tag] = sequence[ch][tag].wrapping_add(1);
                    device.submit(&commands[i], tag as u8, sequence[ch][tag]);
                    submitted = true;
                }
            }
            let worked = device.turn(now);
            device.completed(&mut completed);
            for (channel, tag) in completed.drain(..) {
                let i = holder[channel as usize][tag as usize]
                    .take()
                    .expect("a completion of a tag in flight");
                done_ns[i] = now;
            }
            if !worked && !submitted {
                break;
            }
        }
    }
    assert!(
        done_ns.iter().all(|&t| t != Ns::MAX),
        "every command completes"
    );
    done_ns
}

/// The emulator's device logic on a manual clock, reached through real
/// channel memory.
struct Emulated {
    core: DeviceThread<VirtualClock>,
    memories: Vec<Option<Arc<ChannelMemory>>>,
    in_flight: Vec<(u16, u8, u16)>,
}

impl Emulated {
    fn new(config: Config) -> Self {
        let medium = Medium::anonymous(config.device.capacity_bytes).unwrap();
        let capacity = config.device.capacity_bytes;
        let shared = Shared::new(
            config,
            medium,
            capacity,
            crate::reactor::Wake::new().unwrap(),
        )
        .unwrap();
        // Completions at their model time (the simulator has no cores to cross).
        let options = EngineOptions {
            post_ahead_ns: 0,
            ..EngineOptions::default()
        };
        let mut core = DeviceThread::new(shared.clone(), &options, VirtualClock::new(), None)
            .expect("a device thread without a port");
        let mut memories = vec![None; CHANNELS];
        for &id in &CHANNEL_IDS {
            let memory = Arc::new(ChannelMemory::create(id, &shared.wake.doorbell).unwrap());
            let (done, _rx) = mpsc::sync_channel(1);
            let (perms, _prx) = mpsc::sync_channel(1);
            shared.mailbox.lock().unwrap().extend([
                ControlOp::AddChannel {
                    id,
                    memory: memory.clone(),
                    done,
                },
                ControlOp::Permissions {
                    updates: records(id),
                    done: perms,
                },
            ]);
            core.apply_control();
            memories[id as usize] = Some(memory);
        }
        Emulated {
            core,
            memories,
            in_flight: Vec::new(),
        }
    }
}

impl TwinDevice for Emulated {
    fn submit(&mut self, c: &Command, virtual_tag: u8, sequence: u16) {
        let command = command::Command {
            tag: virtual_tag,
            op: c.op,
            addr: DeviceAddr(c.addr),
            len_bytes: len_for_tag(c, virtual_tag),
            host_dma_addr: None,
            barrier: false,
            dma_completion: true,
        };
        let words = command::encode_channel(&command, sequence).unwrap();
        let memory = self.memories[c.channel as usize].as_ref().unwrap();
        // Stamped when issued, as the library stamps it: at the command's
        // time, or later if it waited for a tag (the clock is there by then).
        let stamp = c.time_ns.max(self.core.clock.now());
        memory.submit(virtual_tag as usize, stamp, words[0], words[1]);
        self.in_flight.push((c.channel, virtual_tag, sequence));
    }

    fn turn(&mut self, now: Ns) -> bool {
        self.core.clock.advance_to(now);
        self.core.turn(now)
    }

    fn completed(&mut self, out: &mut Vec<(u16, u8)>) {
        let memories = &self.memories;
        self.in_flight.retain(|&(channel, tag, sequence)| {
            let memory = memories[channel as usize].as_ref().unwrap();
            let word = memory.tag_status(tag as usize).load(Ordering::Acquire);
            let done = word == channel::status_word(sequence, ResultCode::Ok);
            assert!(
                done || word & channel::STATUS_DONE == 0 || (word >> 32) as u16 != sequence,
                "channel {channel} tag {tag} failed: status {word:#x}"
            );
            if done {
                out.push((channel, tag));
            }
            !done
        });
    }

    fn next_event_time(&self) -> Option<Ns> {
        self.core.driver.next_event_time()
    }
}

/// The simulator's device path: the model's driver in virtual time, with
/// the command slots as plain bitmaps.
struct Simulated {
    driver: DeviceDriver,
    round_robin: RoundRobin,
    pending: Vec<u64>,
    requests: Vec<[Option<ChannelRequest>; CHANNEL_TAGS]>,
    finished: Vec<(u16, u8)>,
    stalls: u64,
}

impl Simulated {
    fn new(config: &Config) -> Self {
        let mut driver =
            DeviceDriver::with_channels(config, EngineOptions::default().seed, CHANNELS as u16);
        for &id in &CHANNEL_IDS {
            for u in records(id) {
                driver.protection_mut().apply(&u).unwrap();
            }
        }
        Simulated {
            driver,
            round_robin: RoundRobin::default(),
            pending: vec![0; CHANNELS],
            requests: vec![[None; CHANNEL_TAGS]; CHANNELS],
            finished: Vec::new(),
            stalls: 0,
        }
    }
}

impl TwinDevice for Simulated {
    fn submit(&mut self, c: &Command, virtual_tag: u8, _sequence: u16) {
        self.pending[c.channel as usize] |= 1 << virtual_tag;
        self.requests[c.channel as usize][virtual_tag as usize] = Some(ChannelRequest {
            op: c.op,
            addr: DeviceAddr(c.addr),
            len_bytes: len_for_tag(c, virtual_tag),
            barrier: false,
        });
    }

    fn turn(&mut self, now: Ns) -> bool {
        let mut worked = false;
        'channels: for i in self.round_robin.pass(CHANNEL_IDS.len()) {
            let channel = CHANNEL_IDS[i];
            let mut pending = self.pending[channel as usize];
            while pending != 0 {
                if !self.driver.retag_has_free() {
                    self.stalls += 1;
                    break 'channels;
                }
                let tag = pending.trailing_zeros() as u8;
                pending &= pending - 1;
                self.pending[channel as usize] &= !(1 << tag);
                let request = self.requests[channel as usize][tag as usize]
                    .take()
                    .unwrap();
                self.driver
                    .submit_channel(now, channel, tag, request, || true)
                    .unwrap();
                worked = true;
            }
        }
        let finished = &mut self.finished;
        worked |= self.driver.deliver_due(now, |f| {
            let (channel, tag) = f.channel_tag.unwrap();
            assert_eq!(f.completion.token, channel_token(channel, tag));
            finished.push((channel, tag));
        }) > 0;
        worked
    }

    fn completed(&mut self, out: &mut Vec<(u16, u8)>) {
        out.append(&mut self.finished);
    }

    fn next_event_time(&self) -> Option<Ns> {
        self.driver.next_event_time()
    }
}

fn seed() -> u64 {
    moneta_model::kernel::rng::seed_from_env("MONETA_TWIN_SEED")
}

#[test]
fn emulator_device_logic_completes_exactly_when_the_simulator_does() {
    let seed = seed();
    let commands = stream(seed, 1500);
    let mut emulated = Emulated::new(config());
    let emulated_ns = run(&mut emulated, &commands);
    let mut simulated = Simulated::new(&config());
    let simulated_ns = run(&mut simulated, &commands);
    assert!(
        simulated.stalls > 0 && emulated.core.stats.retag_stalls > 0,
        "the stream must exhaust the physical tags (seed {seed})"
    );
    assert!(emulated.core.driver.protection().stats().lookup_steps > commands.len() as u64);
    for (i, (e, s)) in emulated_ns.iter().zip(&simulated_ns).enumerate() {
        assert_eq!(e, s, "command {i} {:?} (seed {seed})", commands[i]);
    }
}

/// The comparison can fail: a simulator that forgot the protection time
/// (tree steps × 0 ns) completes earlier than the emulator.
#[test]
fn the_twin_sees_a_dropped_protection_time() {
    let seed = seed();
    let commands = stream(seed, 300);
    let emulated_ns = run(&mut Emulated::new(config()), &commands);
    let mut no_protection = config();
    no_protection.direct.tree_step_ns = 0;
    let simulated_ns = run(&mut Simulated::new(&no_protection), &commands);
    assert_ne!(emulated_ns, simulated_ns, "seed {seed}");
}
