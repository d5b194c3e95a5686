//! The flash subsystem's timing (SPEC §7 "Flash subsystem"): 8-bit ONFI
//! channels shared by volumes (packages), dies, and planes with two
//! registers each; an FTL queue feeding per-die queues.
//!
//! [`FlashTiming`] is clock-agnostic: every call takes `now_ns` and returns
//! when things finish, in u64 nanoseconds on whatever clock the caller
//! runs (virtual time in the simulator, the wall clock in `libnvmm`). It
//! keeps the state of every channel, die, plane and register between calls,
//! so concurrent operations queue as they would in hardware. Calls should
//! come with non-decreasing `now_ns`; an earlier `now_ns` is treated as the
//! latest seen (a caller's threads may race by a few ns). The `*_at`
//! variants book a request that reaches the controller later than `now_ns`.
//!
//! What one operation does:
//!
//! 1. FTL queue (`ftl_queue_entries`): an arrival waits for a free entry;
//!    the FTL translates one command at a time (`ftl_ns`) and hands
//!    commands to die queues in order, so a command whose die queue is full
//!    (`die_queue_entries`) blocks every command behind it (head-of-line
//!    blocking, as the report describes). With `flash.queues = "split"`
//!    (the presets) reads have an FTL queue and per-die queues of their
//!    own, and programs and erases another pair, so a read is not held
//!    behind a program waiting for a full die queue: the authors' flash
//!    simulator (NVDIMMSim, which HybridSim drives as NVMM's backing
//!    store) keeps `readQueues` and `writeQueues` per package and die,
//!    with `FTL_READ_QUEUE_LENGTH` and `FTL_WRITE_QUEUE_LENGTH`, and
//!    sends a write only when no read waits (`CTRL_IDLE_WRITE`). One
//!    translation unit (`ftl_ns`) serves both. `"shared"`: one FTL queue
//!    and one queue per die for everything.
//! 2. Die queue: commands of a die (of one lane) are issued in order; one
//!    leaves the queue when it is issued to its plane. A read still waits
//!    for a program already booked on its plane (no program suspend).
//! 3. Channel: a command's cycles (`command_ns`) and each data transfer
//!    (bytes at the ONFI rate) reserve the channel. Reservations fill gaps:
//!    data a plane will return in the future does not hold back a command
//!    that can go now. With `command_priority = "interrupt"` (the presets)
//!    a command does not wait for return data at all, booked or under way:
//!    "The flash controller in NVMM accomplishes this by giving commands
//!    priority over return data on the package interface. This ensures
//!    that a plane can begin working on its next access while
//!    simultaneously sending back the data from its last access" (the
//!    report). Commands then book a calendar of their own, shared with
//!    write data going in (not return data: the report gives commands
//!    priority over return data only); data transfers book the channel's
//!    data calendar. The return data a command interrupts is not lengthened
//!    by its cycles (200 ns against 20 µs for an 8 KB page at 400 MB/s).
//!    With `"gaps"` every operation books one calendar per channel, and a
//!    command behind queued return data waits for all of it.
//! 4. Plane, two registers: a read runs in the array (`read_ns`) into the
//!    data register, moves to the cache register when that is free, and the
//!    array is then free for the next read while the cache register drains
//!    over the channel. A program's data streams into the cache register,
//!    moves to the data register when the array is free, and the cache
//!    register can take the next page during the program.
//!
//! A read's bytes leave in critical-word-first order: the controller starts
//! the transfer at the requested 64 B (ONFI's change-read-column), so the
//! CPU's line is available after its first 64 B.
//!
//! Left out: multi-plane commands, cache-read/cache-program command
//! variants beyond the two-register overlap, read retries and ECC time,
//! status polling cycles beyond `command_ns`.

use super::calendar::Calendar;
use super::config::{CommandPriority, Layout, NvmmConfig, Queues};
use crate::units::{transfer_ns, Ns};

/// Where a flash page lives.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FlashLocation {
    pub channel: u32,
    /// Die across the whole subsystem (channel, volume, die).
    pub die: u32,
    /// Plane across the whole subsystem.
    pub plane: u32,
    /// Block across the whole subsystem.
    pub block: u32,
    pub page_in_block: u32,
}

/// The flash subsystem's shape. Flash page numbers are plane-major:
/// `page = block * pages_per_block + page_in_block`, with block `b` on plane
/// `b / blocks_per_plane`; plane numbers go round the channels first, so
/// consecutive planes are on different channels. With the interleaved
/// layout, page j of a block is on the plane j after the block's (a stripe
/// over planes, as SSDs stripe superblocks over dies).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FlashGeometry {
    pub channels: u32,
    pub volumes_per_channel: u32,
    pub dies_per_volume: u32,
    pub planes_per_die: u32,
    pub blocks_per_plane: u32,
    pub pages_per_block: u32,
    pub page_bytes: u64,
    pub layout: Layout,
}

impl FlashGeometry {
    pub fn new(config: &NvmmConfig) -> Self {
        let f = &config.flash;
        FlashGeometry {
            channels: f.channels,
            volumes_per_channel: f.volumes_per_channel,
            dies_per_volume: f.dies_per_volume,
            planes_per_die: f.planes_per_die,
            blocks_per_plane: f.blocks_per_plane,
            pages_per_block: f.pages_per_block,
            page_bytes: f.page_bytes,
            layout: f.layout,
        }
    }

    pub fn dies(&self) -> u32 {
        self.channels * self.volumes_per_channel * self.dies_per_volume
    }

    pub fn planes(&self) -> u32 {
        self.dies() * self.planes_per_die
    }

    pub fn blocks(&self) -> u32 {
        self.planes() * self.blocks_per_plane
    }

    pub fn pages(&self) -> u64 {
        u64::from(self.blocks()) * u64::from(self.pages_per_block)
    }

    /// The channel, die, plane and block of a flash page.
    pub fn locate(&self, flash_page: u64) -> FlashLocation {
        Locator::new(*self).locate(flash_page)
    }

    /// A logical page number spread over the planes: consecutive numbers
    /// land on consecutive planes (so on different channels). For callers
    /// without their own placement (the SSD's LBAs, a library's pages).
    pub fn striped(&self, logical_page: u64) -> u64 {
        let logical = logical_page % self.pages();
        let planes = u64::from(self.planes());
        let plane = logical % planes;
        let within = logical / planes; // page index within the plane
        let per_plane = u64::from(self.blocks_per_plane) * u64::from(self.pages_per_block);
        plane * per_plane + within
    }
}

/// A divisor, as a shift and a mask when it is a power of two (every
/// preset's shape): `locate` runs on every flash operation, and a 64-bit
/// division costs tens of cycles.
#[derive(Copy, Clone, Debug)]
struct Divisor {
    value: u64,
    shift: Option<u32>,
}

impl Divisor {
    fn new(value: u64) -> Self {
        Divisor {
            value,
            shift: value.is_power_of_two().then(|| value.trailing_zeros()),
        }
    }
    #[inline]
    fn div(self, x: u64) -> u64 {
        match self.shift {
            Some(s) => x >> s,
            None => x / self.value,
        }
    }
    #[inline]
    fn rem(self, x: u64) -> u64 {
        match self.shift {
            Some(_) => x & (self.value - 1),
            None => x % self.value,
        }
    }
}

/// [`FlashGeometry::locate`] with its divisors prepared once.
#[derive(Copy, Clone, Debug)]
struct Locator {
    interleaved: bool,
    pages: Divisor,
    pages_per_block: Divisor,
    blocks_per_plane: Divisor,
    planes: Divisor,
    channels: Divisor,
    dies: Divisor,
}

impl Locator {
    fn new(g: FlashGeometry) -> Self {
        Locator {
            interleaved: g.layout == Layout::Interleaved,
            pages: Divisor::new(g.pages()),
            pages_per_block: Divisor::new(g.pages_per_block.into()),
            blocks_per_plane: Divisor::new(g.blocks_per_plane.into()),
            planes: Divisor::new(g.planes().into()),
            channels: Divisor::new(g.channels.into()),
            dies: Divisor::new(g.dies().into()),
        }
    }

    #[inline]
    fn locate(&self, flash_page: u64) -> FlashLocation {
        let page = self.pages.rem(flash_page);
        let block = self.pages_per_block.div(page);
        let page_in_block = self.pages_per_block.rem(page);
        let mut plane = self.blocks_per_plane.div(block);
        if self.interleaved {
            // Page j of a block on plane P is on plane P + j: a bijection
            // for each (block in plane, page) pair.
            plane = self.planes.rem(plane + page_in_block);
        }
        // Plane numbers: channel fastest, then volume, die, plane in die.
        FlashLocation {
            channel: self.channels.rem(plane) as u32,
            die: self.dies.rem(plane) as u32,
            plane: plane as u32,
            block: block as u32,
            page_in_block: page_in_block as u32,
        }
    }
}

/// When a read's data is available.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct FlashRead {
    /// The requested 64 B have crossed the channel.
    pub critical_ns: Ns,
    /// The whole transfer has crossed the channel.
    pub done_ns: Ns,
}

/// Counters for reports.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct FlashStats {
    pub reads: u64,
    pub programs: u64,
    pub erases: u64,
    pub bytes_read: u64,
    pub bytes_programmed: u64,
    /// Time operations spent waiting for the FTL queue, die queues, planes
    /// or the channel beyond their own service.
    pub queue_wait_ns: u64,
    pub channel_busy_ns: u64,
}

/// A fixed-size ring of the last `n` times (queue slots: an arrival may
/// enter when the one `n` places ahead has left).
#[derive(Clone, Debug)]
struct SlotRing {
    times: Vec<Ns>,
    next: usize,
}

impl SlotRing {
    fn new(n: u32) -> Self {
        SlotRing {
            times: vec![0; n as usize],
            next: 0,
        }
    }
    /// When a slot frees: the departure `n` entries ago.
    fn free_at(&self) -> Ns {
        self.times[self.next]
    }
    fn push(&mut self, t: Ns) {
        self.times[self.next] = t;
        self.next = (self.next + 1) % self.times.len();
    }
}

#[derive(Clone, Debug, Default)]
struct Plane {
    /// The array and data register are free (no operation, no data
    /// waiting to move to the cache register).
    array_free_ns: Ns,
    /// The cache register is free (its data has crossed the channel, or
    /// moved into the data register for a program).
    cache_register_free_ns: Ns,
}

/// A die's queue of one lane (see [`Lane`]).
#[derive(Clone, Debug)]
struct Die {
    last_issue_ns: Ns,
    queue: SlotRing,
}

/// Which queues an operation goes through: with `flash.queues = "split"`
/// reads have an FTL queue and die queues of their own, programs and
/// erases another; with `"shared"` every operation uses lane 0.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Lane {
    Read = 0,
    Write = 1,
}

/// One lane's FTL queue: its slots and its last departure (in order).
#[derive(Clone, Debug)]
struct FtlLane {
    last_departure_ns: Ns,
    queue: SlotRing,
}

/// The flash subsystem's timing; see the module header. One instance per
/// flash subsystem: the NVMM controller's, or the SSD's.
#[derive(Clone, Debug)]
pub struct FlashTiming {
    geometry: FlashGeometry,
    locator: Locator,
    read_ns: Ns,
    program_ns: Ns,
    erase_ns: Ns,
    command_ns: Ns,
    ftl_ns: Ns,
    channel_bytes_per_s: f64,
    /// A whole page and the critical 64 B on a channel, computed once.
    page_transfer_ns: Ns,
    critical_transfer_ns: Ns,
    latest_now_ns: Ns,
    ftl_free_ns: Ns,
    /// Lane 0 (every operation, or reads with split queues) and lane 1
    /// (programs and erases with split queues).
    ftl: [FtlLane; 2],
    split: bool,
    /// Per channel: its data transfers, and with `CommandPriority::Gaps`
    /// its commands too.
    channels: Vec<Calendar>,
    /// Per channel with `CommandPriority::Interrupt`: commands and write
    /// data going in (what a command waits for); empty with `Gaps`.
    commands: Vec<Calendar>,
    interrupt: bool,
    /// Per die, lane 0 then lane 1 (`die * 2 + lane`).
    dies: Vec<Die>,
    planes: Vec<Plane>,
    stats: FlashStats,
}

impl FlashTiming {
    /// From an NVMM configuration (`[flash]`).
    pub fn new(config: &NvmmConfig) -> Self {
        let f = &config.flash;
        let geometry = FlashGeometry::new(config);
        FlashTiming {
            geometry,
            locator: Locator::new(geometry),
            read_ns: f.read_ns,
            program_ns: f.program_ns,
            erase_ns: f.erase_ns,
            command_ns: f.command_ns,
            ftl_ns: f.ftl_ns,
            channel_bytes_per_s: f.onfi.bytes_per_s(),
            page_transfer_ns: transfer_ns(f.page_bytes, f.onfi.bytes_per_s()),
            critical_transfer_ns: transfer_ns(f.page_bytes.min(64), f.onfi.bytes_per_s()),
            latest_now_ns: 0,
            ftl_free_ns: 0,
            ftl: [
                FtlLane {
                    last_departure_ns: 0,
                    queue: SlotRing::new(f.ftl_queue_entries),
                },
                FtlLane {
                    last_departure_ns: 0,
                    queue: SlotRing::new(f.ftl_queue_entries),
                },
            ],
            split: f.queues == Queues::Split,
            channels: vec![Calendar::default(); geometry.channels as usize],
            commands: vec![Calendar::default(); geometry.channels as usize],
            interrupt: f.command_priority == CommandPriority::Interrupt,
            dies: vec![
                Die {
                    last_issue_ns: 0,
                    queue: SlotRing::new(f.die_queue_entries),
                };
                2 * geometry.dies() as usize
            ],
            planes: vec![Plane::default(); geometry.planes() as usize],
            stats: FlashStats::default(),
        }
    }

    pub fn geometry(&self) -> &FlashGeometry {
        &self.geometry
    }

    pub fn stats(&self) -> FlashStats {
        self.stats
    }

    /// A lone read of a whole page on an idle subsystem: command, array
    /// read, transfer (the hardware floor of a miss).
    pub fn idle_read_ns(&self, bytes: u64) -> Ns {
        self.ftl_ns + self.command_ns + self.read_ns + self.transfer_ns(bytes)
    }

    /// `bytes` (at most a page) on a channel.
    #[inline]
    fn transfer_ns(&self, bytes: u64) -> Ns {
        if bytes == self.geometry.page_bytes {
            self.page_transfer_ns
        } else if bytes == 64.min(self.geometry.page_bytes) {
            self.critical_transfer_ns
        } else {
            transfer_ns(bytes, self.channel_bytes_per_s)
        }
    }

    /// Read `bytes` (at most a page) of `flash_page`, the request arriving
    /// at `now_ns`.
    pub fn read_page(&mut self, now_ns: Ns, flash_page: u64, bytes: u64) -> FlashRead {
        self.read_page_at(now_ns, now_ns, flash_page, bytes)
    }

    /// [`read_page`](Self::read_page) for a request that reaches the flash
    /// controller at `arrival_ns` ≥ `now_ns` (the simulator books work
    /// ahead: a write-back after its DRAM read, a collection's programs
    /// after its reads).
    pub fn read_page_at(
        &mut self,
        now_ns: Ns,
        arrival_ns: Ns,
        flash_page: u64,
        bytes: u64,
    ) -> FlashRead {
        let now = self.arrive(now_ns, arrival_ns);
        let at = self.locator.locate(flash_page);
        let (depart, die) = self.through_ftl(now, at.die, Lane::Read);
        let plane = &self.planes[at.plane as usize];
        let ready = depart
            .max(self.dies[die].last_issue_ns)
            .max(plane.array_free_ns);
        let command_start = self.reserve_command(at.channel, ready);
        self.issue(die, command_start);
        let array_done = command_start + self.command_ns + self.read_ns;
        let plane = &mut self.planes[at.plane as usize];
        let to_cache_register = array_done.max(plane.cache_register_free_ns);
        plane.array_free_ns = to_cache_register;
        let bytes = bytes.clamp(1, self.geometry.page_bytes);
        let transfer = self.transfer_ns(bytes);
        let start = self.channels[at.channel as usize].reserve(
            self.latest_now_ns,
            to_cache_register,
            transfer,
        );
        let done = start + transfer;
        self.planes[at.plane as usize].cache_register_free_ns = done;
        self.stats.reads += 1;
        self.stats.bytes_read += bytes;
        self.stats.channel_busy_ns += transfer + self.command_ns;
        self.stats.queue_wait_ns +=
            (done - now).saturating_sub(self.ftl_ns + self.command_ns + self.read_ns + transfer);
        FlashRead {
            critical_ns: start + self.transfer_ns(bytes.min(64)),
            done_ns: done,
        }
    }

    /// Program `bytes` into `flash_page`, the request (with its data in the
    /// controller) arriving at `now_ns`. Returns when the page is durable.
    pub fn program_page(&mut self, now_ns: Ns, flash_page: u64, bytes: u64) -> Ns {
        self.program_page_at(now_ns, now_ns, flash_page, bytes)
    }

    /// [`program_page`](Self::program_page) arriving at `arrival_ns` ≥ `now_ns`.
    pub fn program_page_at(
        &mut self,
        now_ns: Ns,
        arrival_ns: Ns,
        flash_page: u64,
        bytes: u64,
    ) -> Ns {
        let now = self.arrive(now_ns, arrival_ns);
        let at = self.locator.locate(flash_page);
        let (depart, die) = self.through_ftl(now, at.die, Lane::Write);
        let plane = &self.planes[at.plane as usize];
        let ready = depart
            .max(self.dies[die].last_issue_ns)
            .max(plane.cache_register_free_ns);
        let bytes = bytes.clamp(1, self.geometry.page_bytes);
        let transfer = self.transfer_ns(bytes);
        let (start, in_cache_register) = if self.interrupt {
            // The command, then the write data at the first moment both
            // the data calendar and the command calendar are free (write
            // data does not yield to commands).
            let start = self.reserve_command(at.channel, ready);
            let data = self.reserve_write_data(at.channel, start + self.command_ns, transfer);
            (start, data + transfer)
        } else {
            let start = self.channels[at.channel as usize].reserve(
                self.latest_now_ns,
                ready,
                self.command_ns + transfer,
            );
            (start, start + self.command_ns + transfer)
        };
        self.issue(die, start);
        let plane = &mut self.planes[at.plane as usize];
        let program_start = in_cache_register.max(plane.array_free_ns);
        plane.cache_register_free_ns = program_start;
        plane.array_free_ns = program_start + self.program_ns;
        let done = plane.array_free_ns;
        self.stats.programs += 1;
        self.stats.bytes_programmed += bytes;
        self.stats.channel_busy_ns += transfer + self.command_ns;
        self.stats.queue_wait_ns +=
            (done - now).saturating_sub(self.ftl_ns + self.command_ns + transfer + self.program_ns);
        done
    }

    /// Erase the block holding `flash_page`; returns when it is erased.
    pub fn erase_block(&mut self, now_ns: Ns, flash_page: u64) -> Ns {
        self.erase_block_at(now_ns, now_ns, flash_page)
    }

    /// [`erase_block`](Self::erase_block) arriving at `arrival_ns` ≥ `now_ns`.
    pub fn erase_block_at(&mut self, now_ns: Ns, arrival_ns: Ns, flash_page: u64) -> Ns {
        let now = self.arrive(now_ns, arrival_ns);
        let at = self.locator.locate(flash_page);
        let (depart, die) = self.through_ftl(now, at.die, Lane::Write);
        let plane = &self.planes[at.plane as usize];
        let ready = depart
            .max(self.dies[die].last_issue_ns)
            .max(plane.array_free_ns);
        let start = self.reserve_command(at.channel, ready);
        self.issue(die, start);
        let done = start + self.command_ns + self.erase_ns;
        self.planes[at.plane as usize].array_free_ns = done;
        self.stats.erases += 1;
        self.stats.channel_busy_ns += self.command_ns;
        done
    }

    /// Book a command's cycles on `channel` at or after `ready_ns`; returns
    /// when it starts (see the module header, step 3).
    #[inline]
    fn reserve_command(&mut self, channel: u32, ready_ns: Ns) -> Ns {
        let calendars = if self.interrupt {
            &mut self.commands
        } else {
            &mut self.channels
        };
        calendars[channel as usize].reserve(self.latest_now_ns, ready_ns, self.command_ns)
    }

    /// With `CommandPriority::Interrupt`: book a program's write data where
    /// neither data nor a command is on `channel`; returns its start.
    fn reserve_write_data(&mut self, channel: u32, earliest_ns: Ns, duration_ns: Ns) -> Ns {
        let now = self.latest_now_ns;
        let (data, commands) = (
            &mut self.channels[channel as usize],
            &mut self.commands[channel as usize],
        );
        let mut start = earliest_ns;
        // Each step moves past a booked interval of one of the two lists,
        // so this ends within their lengths together.
        loop {
            let in_data = data.first_fit(now, start, duration_ns);
            let in_both = commands.first_fit(now, in_data, duration_ns);
            if in_both == in_data {
                start = in_both;
                break;
            }
            start = in_both;
        }
        data.book(start, duration_ns);
        commands.book(start, duration_ns);
        start
    }

    /// The current time (never earlier than a previous call's) and the
    /// request's arrival (never earlier than that).
    fn arrive(&mut self, now_ns: Ns, arrival_ns: Ns) -> Ns {
        self.latest_now_ns = self.latest_now_ns.max(now_ns);
        arrival_ns.max(self.latest_now_ns)
    }

    /// Through the lane's FTL queue into the die's queue of that lane
    /// (one translation unit serves both lanes): returns when the command
    /// enters its die queue, and that queue's index in `dies`.
    #[inline]
    fn through_ftl(&mut self, now: Ns, die: u32, lane: Lane) -> (Ns, usize) {
        let lane = if self.split { lane as usize } else { 0 };
        let queue = die as usize * 2 + lane;
        let ftl = &mut self.ftl[lane];
        let enter = now.max(ftl.queue.free_at());
        let translated = enter.max(self.ftl_free_ns) + self.ftl_ns;
        self.ftl_free_ns = translated;
        // In order, and only when the die queue has room: head-of-line.
        let depart = translated
            .max(ftl.last_departure_ns)
            .max(self.dies[queue].queue.free_at());
        ftl.last_departure_ns = depart;
        ftl.queue.push(depart);
        (depart, queue)
    }

    fn issue(&mut self, die: usize, at_ns: Ns) {
        let d = &mut self.dies[die];
        d.last_issue_ns = at_ns;
        d.queue.push(at_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> NvmmConfig {
        NvmmConfig::preset("nvmm-mlc").unwrap()
    }

    #[test]
    fn a_lone_read_costs_command_array_and_transfer() {
        let c = config();
        let mut f = FlashTiming::new(&c);
        let r = f.read_page(1000, 0, 8192);
        // 100 FTL + 200 command + 50 µs + 8192 B at 400 MB/s (20.48 µs).
        assert_eq!(r.done_ns, 1000 + 100 + 200 + 50_000 + 20_480);
        assert_eq!(r.critical_ns, 1000 + 100 + 200 + 50_000 + 160);
        assert_eq!(f.idle_read_ns(8192), r.done_ns - 1000);
    }

    #[test]
    fn two_registers_overlap_the_transfer_with_the_next_read() {
        let mut c = config();
        c.flash.layout = Layout::Block;
        let mut f = FlashTiming::new(&c);
        let a = f.read_page(0, 0, 8192);
        let b = f.read_page(0, 1, 8192); // same block, same plane
                                         // The second array read starts once the first data has moved to the
                                         // cache register, not after its transfer.
        let serial = 2 * f.idle_read_ns(8192);
        assert!(b.done_ns < serial, "{b:?} vs {serial}");
        assert!(b.done_ns >= a.done_ns + 20_480);
    }

    #[test]
    fn different_channels_run_in_parallel_and_one_channel_shares_its_bus() {
        let c = config();
        let g = FlashGeometry::new(&c);
        let mut f = FlashTiming::new(&c);
        let x = f.read_page(0, g.striped(0), 8192);
        let y = f.read_page(0, g.striped(1), 8192);
        assert!(y.done_ns < x.done_ns + 1000, "{x:?} {y:?}");
        // Two planes on the same channel: transfers serialize.
        let same_channel = g.striped(u64::from(g.channels));
        assert_eq!(
            g.locate(same_channel).channel,
            g.locate(g.striped(0)).channel
        );
        let z = f.read_page(0, same_channel, 8192);
        assert!(z.done_ns >= x.done_ns + 20_480, "{x:?} {z:?}");
    }

    /// Three reads on planes of one channel (different dies) whose data
    /// queues on the channel, then a read of a fourth plane there while
    /// the first transfer is under way and two wait.
    fn read_behind_queued_return_data(priority: CommandPriority) -> (FlashRead, FlashRead) {
        let mut c = config();
        c.flash.command_priority = priority;
        let g = FlashGeometry::new(&c);
        let channels = u64::from(g.channels);
        let mut f = FlashTiming::new(&c);
        let mut last = f.read_page(0, g.striped(0), 8192);
        for k in 1..3 {
            last = f.read_page(0, g.striped(k * channels), 8192);
        }
        let arrival = 51_000; // the first page's data is crossing the channel
        let late = f.read_page(arrival, g.striped(3 * channels), 8192);
        assert_eq!(g.locate(g.striped(3 * channels)).channel, 0);
        (last, late)
    }

    #[test]
    fn a_command_goes_before_return_data_waiting_on_its_channel() {
        let c = config();
        let (queued, late) = read_behind_queued_return_data(CommandPriority::Interrupt);
        // Its command goes at once: the array read ends 50 µs after it
        // arrived, and its data follows the three pages queued before.
        let command_at = 51_000 + c.flash.ftl_ns;
        assert_eq!(late.done_ns, queued.done_ns + 20_480, "{late:?} {queued:?}");
        assert!(command_at + c.flash.command_ns + c.flash.read_ns < queued.done_ns);
        // Waiting for the queued data (the rule before) costs the array
        // read's 50 µs on top.
        let (queued, late) = read_behind_queued_return_data(CommandPriority::Gaps);
        assert_eq!(
            late.done_ns,
            queued.done_ns + c.flash.command_ns + c.flash.read_ns + 20_480,
            "{late:?} {queued:?}"
        );
    }

    #[test]
    fn write_data_does_not_overlap_return_data_or_commands() {
        let c = config();
        let g = FlashGeometry::new(&c);
        let channels = u64::from(g.channels);
        let mut f = FlashTiming::new(&c);
        let r = f.read_page(0, g.striped(0), 8192);
        // A program on the same channel whose data would go in while the
        // read's data comes out: it waits for the channel's data.
        let p = f.program_page(r.critical_ns, g.striped(channels), 8192);
        assert!(p >= r.done_ns + 20_480 + c.flash.program_ns, "{p} {r:?}");
        // A read command arriving while that write data goes in waits for
        // it (commands have priority over return data only).
        let write_data_start = p - c.flash.program_ns - 20_480;
        let late = f.read_page(write_data_start + 1_000, g.striped(2 * channels), 8192);
        let command_at = p - c.flash.program_ns;
        assert!(
            late.done_ns >= command_at + c.flash.command_ns + c.flash.read_ns + 20_480,
            "{late:?} {p}"
        );
    }

    #[test]
    fn a_full_die_queue_blocks_the_ftl_queue_head_of_line() {
        let mut c = config();
        c.flash.die_queue_entries = 1;
        c.flash.queues = Queues::Shared;
        let g = FlashGeometry::new(&c);
        let mut f = FlashTiming::new(&c);
        // Programs to one plane queue up in its die queue (one entry): the
        // fourth waits in the FTL queue until the third is issued, and a
        // read for another die, behind it in the FTL queue, waits too.
        let die0 = g.striped(0);
        let mut last = 0;
        for _ in 0..4 {
            last = f.program_page(0, die0, 8192);
        }
        let other = f.read_page(0, g.striped(1), 8192);
        let mut g2 = FlashTiming::new(&c);
        let alone = g2.read_page(0, g.striped(1), 8192);
        assert!(other.done_ns > alone.done_ns + 1_000_000, "{other:?}");
        assert!(last > 3 * c.flash.program_ns);
    }

    #[test]
    fn with_split_queues_a_read_passes_programs_waiting_for_their_die() {
        let mut c = config();
        c.flash.die_queue_entries = 1;
        c.flash.queues = Queues::Split;
        let g = FlashGeometry::new(&c);
        let mut f = FlashTiming::new(&c);
        // As in the head-of-line test: four programs to one die, then a
        // read of another die, which now has its own FTL queue.
        for _ in 0..4 {
            f.program_page(0, g.striped(0), 8192);
        }
        let other = f.read_page(0, g.striped(1), 8192);
        let alone = FlashTiming::new(&c).read_page(0, g.striped(1), 8192);
        // It waits only for the one translation unit (four translations).
        assert!(
            other.done_ns <= alone.done_ns + 4 * c.flash.ftl_ns,
            "{other:?} {alone:?}"
        );
        // A read of the programs' own plane still waits for the array.
        let same = f.read_page(0, g.striped(0), 8192);
        assert!(same.done_ns > c.flash.program_ns, "{same:?}");
    }

    #[test]
    fn the_interleaved_layout_puts_a_blocks_pages_on_consecutive_planes() {
        let mut c = config();
        c.flash.blocks_per_plane = 4;
        c.flash.pages_per_block = 32;
        let g = FlashGeometry::new(&c);
        assert_eq!(g.layout, Layout::Interleaved);
        let planes: Vec<u32> = (0..4).map(|p| g.locate(p).plane).collect();
        assert_eq!(planes, [0, 1, 2, 3]);
        let mut seen = std::collections::HashSet::new();
        for p in 0..g.pages() {
            let l = g.locate(p);
            assert!(seen.insert((l.plane, l.block % c.flash.blocks_per_plane, l.page_in_block)));
        }
        c.flash.layout = Layout::Block;
        let g = FlashGeometry::new(&c);
        assert!((0..4).all(|p| g.locate(p).plane == 0));
    }

    #[test]
    fn striping_is_a_bijection_on_small_geometry() {
        let mut c = config();
        c.flash.blocks_per_plane = 8;
        let g = FlashGeometry::new(&c);
        let mut seen = vec![false; g.pages() as usize];
        for l in 0..g.pages() {
            let p = g.striped(l) as usize;
            assert!(!seen[p]);
            seen[p] = true;
        }
    }
}
