//! A second owner of the layout watcher's coverage groups, so that monetad
//! killed (SIGKILL) never hangs in its own exit, and a writer with it
//! (issue 20; DESIGN "a layout change of a granted file revokes the old
//! blocks"; found by `tests/crash.rs` in CI).
//!
//! Releasing any fanotify group waits for every reader of the kernel's mark
//! SRCU (`fsnotify_destroy_group` → `fsnotify_wait_marks_destroyed`), and a
//! process stopped in a permission event holds that SRCU until the group
//! that stopped it answers. When monetad dies, its last thread releases its
//! groups one after another. Measured on this kernel (6.18, XFS): in 3 of 6
//! kills with a writer waiting, the coverage group was released first; its
//! release waited for the writer, the writer for the watcher group queued
//! behind it, and both stayed in D state until the writer was killed by
//! hand (`tests/crash.rs: a_writer_waiting_on_monetad_goes_on_when_monetad_is_killed`).
//!
//! So a child process, `moneta-cover`, holds a duplicate of every coverage
//! group. monetad's death then drops only monetad's references to them and
//! releases the watcher group, which allows every pending event; the keeper
//! sees its socket close and exits, and its release of the coverage groups
//! waits for no one who waits for monetad. monetad keeps its own references
//! too, so a keeper killed by hand costs no coverage (every file opened
//! meanwhile still reports its accesses); the watcher starts another within
//! about 100 ms. Only a kill of both within that window (keeper first)
//! leaves the old order.
//!
//! The keeper is forked without exec: after the fork it makes only raw
//! system calls (no allocation, no locks: monetad has many threads). It
//! ignores the terminal's and polite signals (SIGINT, SIGTERM, SIGHUP, …),
//! so it lives exactly as long as monetad's end of the socket.

use crate::sys;
use moneta_abi::error::EmuError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// The keeper's name in `ps` (comm) and its whole command line.
const TITLE: &[u8] = b"moneta-cover\0";

/// The descriptor the keeper keeps its end of the socket on.
const KEEPER_SOCKET: RawFd = 3;

/// The keeper's first message: it closed every descriptor it inherited.
const READY: u8 = b'r';

/// How long monetad waits for that message.
const READY_TIMEOUT_MS: i32 = 10_000;

/// A running keeper: its pid and monetad's end of its socket.
pub(crate) struct CoverKeeper {
    socket: Option<OwnedFd>,
    pid: libc::pid_t,
}

impl CoverKeeper {
    /// Fork a keeper and hand it a duplicate of each of `groups`.
    pub(crate) fn spawn(groups: &[RawFd]) -> Result<CoverKeeper, EmuError> {
        // Everything the child needs is computed before the fork.
        let title = own_command_line_area();
        let mut pair = [-1; 2];
        // SAFETY: plain syscall writing two descriptors into `pair`.
        if unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                pair.as_mut_ptr(),
            )
        } != 0
        {
            return Err(EmuError::io(
                "starting the coverage keeper (socketpair)",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: both descriptors are new and ours.
        let (ours, theirs) =
            unsafe { (OwnedFd::from_raw_fd(pair[0]), OwnedFd::from_raw_fd(pair[1])) };
        let mut helpers = sys::own_helpers();
        // SAFETY: fork; the child runs only `keeper_main`, which makes raw
        // system calls and never returns.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: in the freshly forked child, as `keeper_main` requires.
            unsafe { keeper_main(theirs.as_raw_fd(), title) }
        }
        if pid < 0 {
            return Err(EmuError::io(
                "starting the coverage keeper (fork)",
                std::io::Error::last_os_error(),
            ));
        }
        // Until it closes them the keeper holds every descriptor of this
        // process (a file a client has open would look open elsewhere) and
        // for its life this process's mappings: the passes over /proc
        // count it as this process, and spawn returns once it is clean.
        helpers.push(pid);
        drop(helpers);
        drop(theirs);
        let keeper = CoverKeeper {
            socket: Some(ours),
            pid,
        };
        keeper.await_ready()?;
        for &group in groups {
            keeper.give(group)?;
        }
        Ok(keeper)
    }

    /// Hand the keeper a duplicate of `group` (SCM_RIGHTS).
    pub(crate) fn give(&self, group: RawFd) -> Result<(), EmuError> {
        let socket = self.socket.as_ref().expect("socket").as_raw_fd();
        sys::send_with_fds(socket, b"g", &[group])
            .map_err(|e| EmuError::io("handing a coverage group to its keeper", e))
    }

    /// Wait for the keeper's word that it closed what it inherited.
    fn await_ready(&self) -> Result<(), EmuError> {
        let socket = self.socket.as_ref().expect("socket").as_raw_fd();
        let mut poll = libc::pollfd {
            fd: socket,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on one descriptor of ours.
        let ready = unsafe { libc::poll(&mut poll, 1, READY_TIMEOUT_MS) };
        if ready <= 0 {
            // Slow to be scheduled (a loaded host): it is counted as this
            // process meanwhile, so going on is safe.
            eprintln!(
                "monetad: the coverage keeper (pid {}) has not started within {READY_TIMEOUT_MS} ms",
                self.pid
            );
            return Ok(());
        }
        let mut byte = [0u8; 1];
        // SAFETY: reads at most one byte into `byte`.
        let n = unsafe { libc::recv(socket, byte.as_mut_ptr().cast(), 1, 0) };
        if n == 1 && byte[0] == READY {
            Ok(())
        } else {
            Err(EmuError::io(
                "starting the coverage keeper (it exited before it was ready)",
                std::io::Error::last_os_error(),
            ))
        }
    }

    pub(crate) fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Whether the keeper still runs (reaps it if not).
    pub(crate) fn alive(&self) -> bool {
        let mut status = 0;
        // SAFETY: waitpid on our own child, without blocking.
        let alive = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) == 0 };
        if !alive {
            sys::forget_own_helper(self.pid);
        }
        alive
    }
}

impl Drop for CoverKeeper {
    fn drop(&mut self) {
        // Closing the socket ends the keeper; reap it (its release of the
        // coverage groups may wait briefly for readers of the mark SRCU).
        drop(self.socket.take());
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(2) {
            let mut status = 0;
            // SAFETY: waitpid on our own child, without blocking.
            if unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) } != 0 {
                sys::forget_own_helper(self.pid);
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Where this process's command line lies in its memory (`arg_start`,
/// `arg_end` of /proc/self/stat, fields 48 and 49), so the keeper can
/// overwrite it: `pgrep -f`, `moneta down` and the tests find monetad by
/// its command line, and the keeper must not look like it.
fn own_command_line_area() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    // The text after ')' starts at field 3.
    let start: usize = fields.nth(48 - 3)?.parse().ok()?;
    let end: usize = fields.next()?.parse().ok()?;
    (end > start && end - start <= 1 << 20).then_some((start, end))
}

/// The keeper: keep every descriptor received until the socket closes.
///
/// # Safety
/// Call only in a child just forked, with `socket` its end of the pair:
/// it closes every other descriptor and never returns.
unsafe fn keeper_main(socket: RawFd, title: Option<(usize, usize)>) -> ! {
    // SAFETY (whole body): raw system calls on our own descriptors and
    // stack buffers, and writes to our own (copied) command-line memory.
    unsafe {
        if socket != KEEPER_SOCKET && libc::dup2(socket, KEEPER_SOCKET) < 0 {
            libc::_exit(1);
        }
        libc::syscall(
            libc::SYS_close_range,
            KEEPER_SOCKET as libc::c_uint + 1,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            for std in 0..3 {
                libc::dup2(null, std);
            }
            if null > KEEPER_SOCKET {
                libc::close(null);
            }
        }
        if libc::write(KEEPER_SOCKET, [READY].as_ptr().cast(), 1) != 1 {
            libc::_exit(1);
        }
        libc::prctl(libc::PR_SET_NAME, TITLE.as_ptr());
        if let Some((start, end)) = title {
            let area = start as *mut u8;
            std::ptr::write_bytes(area, 0, end - start);
            let n = TITLE.len().min(end - start);
            std::ptr::copy_nonoverlapping(TITLE.as_ptr(), area, n);
            *area.add(end - start - 1) = 0;
        }
        for signal in [
            libc::SIGINT,
            libc::SIGTERM,
            libc::SIGHUP,
            libc::SIGQUIT,
            libc::SIGPIPE,
            libc::SIGUSR1,
            libc::SIGUSR2,
        ] {
            libc::signal(signal, libc::SIG_IGN);
        }
        loop {
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut control = [0u64; 16];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&control);
            let n = libc::recvmsg(KEEPER_SOCKET, &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n == 0 {
                libc::_exit(0);
            }
            if n < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
            // The descriptors received stay open: holding them is the point.
        }
    }
}
