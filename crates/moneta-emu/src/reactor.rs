//! Reactors (issue 21; DESIGN "Processes in emulation"): one thread that
//! turns every poller registered with it, the software form of a core
//! owning several devices, after SPDK's reactor/poller model and Seastar's
//! shard per core.
//!
//! A poller is a device (`engine::DeviceThread`: its channels, its model
//! events, a SAN node's port) or an NBD server's connections (moneta-nbd's
//! `transmission.rs`: requests read from the sockets, submitted to the
//! device and answered in the same loop, `Engine::add_poller`). Each pass the reactor asks every poller for
//! one turn at the current wall time. While any of them worked or still has
//! work in flight (a request in its model, a frame on its wire), the reactor
//! goes round again at once; idle for the longest `idle_spin_ns` of its
//! pollers, it naps on its [`Wake`] doorbell for at most the shortest
//! `max_nap_ns`. Every device a reactor hosts shares that doorbell: clients
//! of any of them, the control planes and the SAN wire watchers ring it.
//!
//! Busy is not always a reason to spin: a device whose requests are all
//! inside its model (no frame on a wire, no peer's answer awaited) knows
//! when its next event is due (`busy_until`). When every busy poller can
//! say so and the earliest is further away than the reactor's wake-up
//! margin, the reactor naps on the doorbell until that time less the
//! margin and spins the rest (a doorbell ring ends the nap at once). This
//! gives the core back (issue 21) where the model is quiet for long (a
//! slow medium: an Onyx PCM write is ~130 µs); during a transfer the model
//! posts an event every few µs, so the reactor still spins through it.
//! The margin is learned: the reactor's timed sleeps
//! use a 1 ns timer slack, and each timed nap's overshoot (how late the
//! thread ran after its timeout) raises the margin at once and decays
//! slowly, so a loaded host naps less close to its deadlines.
//!
//! Before it naps, every poller arms its channels' NEED WAKEUP words and
//! takes a last look (`prepare_nap`): a client that submitted before the
//! look is seen, one that submits after it sees NEED WAKEUP and rings (the
//! same fence pairing as with one device, channel.rs).
//!
//! Why it matters here: with N devices each on its own spinning thread, a
//! SAN request needs the client's thread and two device threads to run in
//! turn on a machine with fewer cores than threads, and every hop waits for
//! the scheduler (issue 21 measured 17–23× the model). A reactor that turns
//! all of one machine's nodes moves a remote request through the real wire
//! and both devices without a context switch.
//!
//! A poller leaves its reactor when it says it is finished (its engine is
//! stopping); it is dropped on the reactor's thread, which is how the
//! engine learns it is gone.

use crate::sys;
use moneta_abi::channel::Doorbell;
use moneta_abi::error::EmuError;
use moneta_model::units::Ns;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// What one turn of a poller found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// It did something (took a command, delivered an event, moved a frame).
    Worked,
    /// Nothing this turn, but work is in flight: keep spinning.
    Busy,
    /// Nothing to do.
    Idle,
    /// Its engine is stopping: drop it.
    Finished,
}

/// Something a reactor turns (a device, an NBD server's connections).
pub trait Poller: Send {
    /// One turn at the wall clock's now.
    fn poll(&mut self) -> Pass;
    /// About to nap: arm the wake-ups, then take a last look. Returns
    /// whether that look found work (then the reactor does not nap).
    fn prepare_nap(&mut self) -> bool;
    /// The nap (if any) is over; `napped` says whether it slept.
    fn end_nap(&mut self, napped: bool);
    /// How long this poller wants the reactor to spin idle before napping.
    fn idle_spin_ns(&self) -> Ns;
    /// The longest nap it tolerates (a lost ring costs at most this).
    fn max_nap_ns(&self) -> u64;
    /// After a turn that found it `Busy`: the time (CLOCK_MONOTONIC ns)
    /// before which it surely has nothing to do unless rung (its next model
    /// event), or
    /// `None` when it cannot say (frames on a wire, a peer's answer): then
    /// the reactor keeps spinning.
    fn busy_until(&self) -> Option<Ns> {
        None
    }
}

/// The doorbell a reactor naps on, shared by every device it hosts, and
/// whether it naps (a SAN wire watcher sleeps on `nap_word` while the
/// reactor works and polls the wire while it naps).
pub struct Wake {
    pub(crate) doorbell: Doorbell,
    pub(crate) napping: AtomicBool,
    pub(crate) nap_word: AtomicU32,
}

impl Wake {
    pub(crate) fn new() -> Result<Arc<Wake>, EmuError> {
        Ok(Arc::new(Wake {
            doorbell: Doorbell::create().map_err(|e| EmuError::io("creating the doorbell", e))?,
            napping: AtomicBool::new(false),
            nap_word: AtomicU32::new(0),
        }))
    }

    /// Ring the doorbell: a napping reactor wakes and turns its pollers.
    pub fn ring(&self) {
        self.doorbell.ring();
    }

    /// Tell sleepers on `nap_word` (wire watchers) to look again.
    pub fn nudge_watchers(&self) {
        self.nap_word.fetch_add(1, Ordering::SeqCst);
        sys::futex_wake_all(&self.nap_word);
    }
}

struct Inner {
    wake: Arc<Wake>,
    incoming: Mutex<Vec<Box<dyn Poller>>>,
    incoming_pending: AtomicBool,
    stop: AtomicBool,
    /// Pollers it turns (for `devices`).
    hosted: AtomicUsize,
}

/// One event loop on its own thread. Dropping it stops the thread (after
/// the pollers it hosts have left; an engine leaves its reactor when it
/// is dropped).
pub struct Reactor {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Reactor {
    /// Start a reactor thread named `name`; under SCHED_FIFO if `realtime`
    /// (it stays an ordinary thread, with a warning, where that is refused).
    pub fn start(name: &str, realtime: bool) -> Result<Reactor, EmuError> {
        let inner = Arc::new(Inner {
            wake: Wake::new()?,
            incoming: Mutex::new(Vec::new()),
            incoming_pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            hosted: AtomicUsize::new(0),
        });
        let run = inner.clone();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Best effort: without it timed naps oversleep by up to
                // 50 µs, which the learned margin then absorbs.
                let _ = sys::set_timer_slack_ns(1);
                if realtime {
                    if let Err(e) = sys::set_realtime(sys::REALTIME_PRIORITY) {
                        eprintln!(
                            "moneta: the device thread stays an ordinary thread: SCHED_FIFO: {e}"
                        );
                    }
                }
                run_loop(&run)
            })
            .map_err(|e| EmuError::io("starting a reactor thread", e))?;
        Ok(Reactor {
            inner,
            thread: Some(thread),
        })
    }

    /// The doorbell every device on this reactor shares.
    pub fn wake(&self) -> Arc<Wake> {
        self.inner.wake.clone()
    }

    /// How many devices it turns now.
    pub fn devices(&self) -> usize {
        self.inner.hosted.load(Ordering::Acquire)
    }

    /// Hand it a poller; it starts turning it at its next pass.
    pub fn add(&self, poller: Box<dyn Poller>) {
        self.inner.hosted.fetch_add(1, Ordering::AcqRel);
        self.inner.incoming.lock().expect("incoming").push(poller);
        self.inner.incoming_pending.store(true, Ordering::SeqCst);
        self.inner.wake.ring();
    }
}

impl Drop for Reactor {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::SeqCst);
        self.inner.wake.ring();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// For pollers whose work arrives on descriptors (a SAN node's wire, an
/// NBD server's sockets behind one epoll descriptor): on a thread of its
/// own, while the reactor naps, wait in poll(2) for `fd` to be readable and
/// ring the doorbell; while it works, sleep until its next nap. Returns
/// when `stop` is set (checked at least every 100 ms).
pub fn watch_while_napping(wake: &Wake, stop: &AtomicBool, fd: std::os::fd::RawFd) {
    while !stop.load(Ordering::Acquire) {
        let seen = wake.nap_word.load(Ordering::SeqCst);
        if !wake.napping.load(Ordering::SeqCst) {
            sys::futex_wait(&wake.nap_word, seen, Some(100_000_000));
            continue;
        }
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; a bounded wait.
        let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
        if ready > 0 && wake.napping.load(Ordering::SeqCst) {
            wake.ring();
            // Until the nap it ends is over (or the next begins).
            sys::futex_wait(&wake.nap_word, seen, Some(10_000_000));
        }
    }
}

/// The default number of reactors for `devices` devices on this host:
/// the cores less one for the clients, at least one, at most one per device.
pub fn default_count(devices: usize) -> usize {
    let cores = moneta_abi::fidelity::cores().max(1);
    cores.saturating_sub(1).clamp(1, devices.max(1))
}

fn run_loop(inner: &Inner) {
    let clock = crate::wall_clock::WallClock::new();
    use moneta_model::kernel::Clock;
    let mut pollers: Vec<Box<dyn Poller>> = Vec::new();
    let mut last_work_ns = clock.now();
    let mut margin = Margin::new();
    loop {
        if inner.incoming_pending.load(Ordering::Acquire) {
            inner.incoming_pending.store(false, Ordering::SeqCst);
            pollers.append(&mut inner.incoming.lock().expect("incoming"));
        }
        if pollers.is_empty() && inner.stop.load(Ordering::Acquire) {
            return;
        }
        let mut worked = false;
        let mut busy = false;
        // The earliest `busy_until` of the busy pollers; None once one cannot say.
        let mut until = Some(Ns::MAX);
        let mut i = 0;
        while i < pollers.len() {
            match pollers[i].poll() {
                Pass::Worked => worked = true,
                Pass::Busy => {
                    busy = true;
                    until = until.zip(pollers[i].busy_until()).map(|(a, b)| a.min(b));
                }
                Pass::Idle => {}
                Pass::Finished => {
                    // Dropped here, on this thread: the engine waits for that.
                    drop(pollers.remove(i));
                    inner.hosted.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
            }
            i += 1;
        }
        let now = clock.now();
        if worked || busy {
            last_work_ns = now;
            if !worked && busy {
                if let Some(until) = until {
                    let mono = sys::monotonic_ns();
                    if until.saturating_sub(mono) > margin.nap_floor_ns() {
                        let target = until - margin.ns;
                        let limit = pollers.iter().map(|p| p.max_nap_ns()).min();
                        let timeout = (target - mono).min(limit.unwrap_or(u64::MAX));
                        if !nap(inner, &mut pollers, timeout) {
                            margin.learn(sys::monotonic_ns().saturating_sub(mono + timeout));
                        }
                        continue;
                    }
                }
            }
            // Go round again at once (no pause: it would add its ~50 ns
            // to every completion's lateness).
            continue;
        }
        let spin = pollers.iter().map(|p| p.idle_spin_ns()).max().unwrap_or(0);
        if now - last_work_ns <= spin {
            std::hint::spin_loop();
            continue;
        }
        let max_nap = pollers
            .iter()
            .map(|p| p.max_nap_ns())
            .min()
            .unwrap_or(100_000_000);
        if nap(inner, &mut pollers, max_nap) {
            last_work_ns = clock.now();
        }
    }
}

/// How early a reactor wakes from a timed nap before the event it waits
/// for (module header): the largest recent overshoot of its timed sleeps,
/// raised at once by a late wake-up and decaying by 1/64 per nap.
struct Margin {
    ns: Ns,
}

impl Margin {
    /// Never closer than this (the futex round trip itself).
    const MIN_NS: Ns = 5_000;
    /// Never further: past it the nap would save little (and a host this
    /// slow is judged not faithful anyway).
    const MAX_NS: Ns = 200_000;
    /// Naps shorter than this are not worth the system calls.
    const MIN_NAP_NS: Ns = 10_000;

    fn new() -> Margin {
        Margin { ns: 50_000 }
    }

    /// The wait beyond which a timed nap is taken.
    fn nap_floor_ns(&self) -> Ns {
        self.ns + Self::MIN_NAP_NS
    }

    /// A timed nap that ran to its timeout woke `overshoot` late.
    fn learn(&mut self, overshoot: Ns) {
        let decayed = self.ns - self.ns / 64;
        self.ns = (overshoot + Self::MIN_NS)
            .max(decayed)
            .clamp(Self::MIN_NS, Self::MAX_NS);
    }
}

/// Sleep on the doorbell until something rings it, for at most
/// `timeout_ns`. Returns whether work came while settling in (then it did
/// not sleep).
fn nap(inner: &Inner, pollers: &mut [Box<dyn Poller>], timeout_ns: u64) -> bool {
    let wake = &inner.wake;
    let rung = wake.doorbell.word().load(Ordering::SeqCst);
    let mut worked = false;
    for p in pollers.iter_mut() {
        worked |= p.prepare_nap();
    }
    worked |= inner.incoming_pending.load(Ordering::SeqCst) || inner.stop.load(Ordering::SeqCst);
    if !worked {
        wake.napping.store(true, Ordering::SeqCst);
        wake.nudge_watchers();
        sys::futex_wait(wake.doorbell.word(), rung, Some(timeout_ns));
        wake.napping.store(false, Ordering::SeqCst);
        wake.nap_word.fetch_add(1, Ordering::SeqCst);
    }
    for p in pollers.iter_mut() {
        p.end_nap(!worked);
    }
    worked
}

#[cfg(test)]
mod tests {
    use super::{Margin, Pass, Poller, Reactor};
    use crate::sys::monotonic_ns;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;

    /// Busy until `until` (CLOCK_MONOTONIC) and able to say so, then done.
    struct Waiting {
        until: u64,
        polls: Arc<AtomicU64>,
        done: Arc<AtomicBool>,
        late_ns: Arc<AtomicU64>,
    }

    impl Poller for Waiting {
        fn poll(&mut self) -> Pass {
            self.polls.fetch_add(1, Ordering::Relaxed);
            let now = monotonic_ns();
            if now >= self.until {
                self.late_ns.store(now - self.until, Ordering::Relaxed);
                self.done.store(true, Ordering::Release);
                Pass::Finished
            } else {
                Pass::Busy
            }
        }
        fn prepare_nap(&mut self) -> bool {
            false
        }
        fn end_nap(&mut self, _napped: bool) {}
        fn idle_spin_ns(&self) -> u64 {
            0
        }
        fn max_nap_ns(&self) -> u64 {
            100_000_000
        }
        fn busy_until(&self) -> Option<u64> {
            Some(self.until)
        }
    }

    #[test]
    fn a_reactor_naps_through_a_long_known_wait_instead_of_spinning() {
        let reactor = Reactor::start("moneta-test", false).unwrap();
        let (polls, done, late_ns) = (
            Arc::new(AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        reactor.add(Box::new(Waiting {
            until: monotonic_ns() + 30_000_000,
            polls: polls.clone(),
            done: done.clone(),
            late_ns: late_ns.clone(),
        }));
        let started = std::time::Instant::now();
        while !done.load(Ordering::Acquire) {
            assert!(
                started.elapsed().as_secs() < 10,
                "the poller never finished"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Spinning 30 ms is hundreds of thousands of turns; napping to
        // within the margin (≤ 200 µs) and spinning the rest, a few thousand.
        let polls = polls.load(Ordering::Relaxed);
        assert!(polls < 50_000, "{polls} turns in a 30 ms wait: it spun");
        eprintln!(
            "{polls} turns; finished {} ns after its time",
            late_ns.load(Ordering::Relaxed)
        );
    }

    #[test]
    fn the_wake_up_margin_rises_at_once_decays_slowly_and_stays_in_bounds() {
        let mut m = Margin::new();
        assert_eq!(m.ns, 50_000);
        // Punctual wake-ups: the margin decays by 1/64 a nap, to its floor.
        m.learn(0);
        assert_eq!(m.ns, 50_000 - 50_000 / 64);
        for _ in 0..1000 {
            m.learn(0);
        }
        assert_eq!(m.ns, Margin::MIN_NS);
        assert_eq!(m.nap_floor_ns(), Margin::MIN_NS + Margin::MIN_NAP_NS);
        // One late wake-up raises it at once (overshoot plus the floor)...
        m.learn(30_000);
        assert_eq!(m.ns, 35_000);
        // ...never past the ceiling...
        m.learn(10_000_000);
        assert_eq!(m.ns, Margin::MAX_NS);
        // ...and a smaller overshoot does not lower it faster than the decay.
        m.learn(1_000);
        assert_eq!(m.ns, Margin::MAX_NS - Margin::MAX_NS / 64);
    }
}
