//! `monetad` (`moneta serve`): the device and its control plane behind a Unix
//! socket (DESIGN "Processes in emulation"). One thread per connection; a
//! connection owns at most one channel, freed when the connection ends for
//! any reason, including the client being killed mid-request.

use crate::control::{self, ControlPlane, FrameReader, Request, Response, Session};
use crate::sys;
use moneta_abi::error::{EmuError, ErrorKind};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A listening daemon. `run` serves until `stop` is set.
pub struct Daemon {
    listener: UnixListener,
    path: PathBuf,
    plane: Arc<ControlPlane>,
}

impl Daemon {
    /// Listen on `path`. A leftover socket file nobody listens on is
    /// replaced; a live one is an error (another daemon serves there).
    pub fn bind(path: &Path, plane: Arc<ControlPlane>) -> Result<Daemon, EmuError> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(EmuError::new(
                    ErrorKind::Config,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(EmuError::new(
                    ErrorKind::Config,
                    format!("a daemon is already serving on {}", path.display()),
                ));
            }
            std::fs::remove_file(path).map_err(|e| EmuError::io("removing a stale socket", e))?;
        }
        let listener = UnixListener::bind(path)
            .map_err(|e| EmuError::io(&format!("listening on {}", path.display()), e))?;
        // Anyone may open a channel; what a channel may touch is granted per
        // request (raw ranges only to the owner).
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
            .map_err(|e| EmuError::io("setting the socket's mode", e))?;
        Ok(Daemon {
            listener,
            path: path.to_path_buf(),
            plane,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accept connections until `stop` is set (checked every 100 ms).
    pub fn run(&self, stop: &AtomicBool) -> Result<(), EmuError> {
        let fd = self.listener.as_raw_fd();
        while !stop.load(Ordering::Acquire) {
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let ready = unsafe { libc::poll(&mut pfd, 1, 100) };
            if ready <= 0 {
                continue;
            }
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let plane = self.plane.clone();
                    let spawned = std::thread::Builder::new()
                        .name("moneta-client".into())
                        .spawn(move || serve_connection(&plane, stream));
                    if let Err(e) = spawned {
                        eprintln!("monetad: cannot start a connection thread: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => eprintln!("monetad: accept: {e}"),
            }
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A control request slower than this is logged.
const SLOW_REQUEST: std::time::Duration = std::time::Duration::from_secs(1);

/// The name of a request's kind (its JSON `op`), for the log.
fn request_kind(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("op")?.as_str().map(str::to_string))
        .unwrap_or_else(|| "malformed".into())
}

fn reply(stream: &UnixStream, response: &Response, fds: &[i32]) -> io::Result<()> {
    sys::send_with_fds(stream.as_raw_fd(), &control::encode(response), fds)
}

/// Serve one client until it disconnects, then free its channel.
fn serve_connection(plane: &ControlPlane, stream: UnixStream) {
    let fd = stream.as_raw_fd();
    let peer = match sys::peer_credentials(fd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("monetad: no peer credentials: {e}");
            return;
        }
    };
    let mut session = Session::new(peer);
    let mut reader = FrameReader::new();
    loop {
        let (body, fds) = match reader.next(fd) {
            Ok(Some(frame)) => frame,
            Ok(None) => break,
            Err(e) => {
                // The stream is out of step (or gone): say why and hang up.
                let _ = reply(&stream, &Response::error(e), &[]);
                break;
            }
        };
        // Only open-file carries a descriptor (the first); any others are
        // closed when they drop.
        let fd = fds.into_iter().next();
        let started = std::time::Instant::now();
        let (response, memory) = match control::decode::<Request>(&body) {
            Ok(request) => plane.handle_with_fd(&mut session, request, fd),
            Err(e) => (Response::error(e), None),
        };
        let took = started.elapsed();
        if took >= SLOW_REQUEST {
            // A client gives up after MONETA_CONTROL_TIMEOUT_MS (30 s): the
            // log says which request kept it waiting.
            eprintln!(
                "monetad: a {} request from pid {} took {:.1} s",
                request_kind(&body),
                peer.pid,
                took.as_secs_f64()
            );
        }
        let attach: Vec<i32> = memory
            .iter()
            .flat_map(|m| m.fds().map(|fd| fd.as_raw_fd()))
            .collect();
        if reply(&stream, &response, &attach).is_err() {
            break;
        }
    }
    plane.end(&mut session);
}
