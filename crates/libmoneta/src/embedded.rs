//! The embedded mode: the whole device (moneta-emu's engine and control
//! plane, SPEC §3.3) in this process, reached through the same channel
//! code as a daemon (moneta-client's [`LocalPlane`]). `moneta bench`, the
//! NBD server's connections, the C ABI's `moneta_embedded` and most tests
//! use it. Left out: descriptor passing over a socket (each call hands the
//! plane its own duplicate instead) and peer credentials beyond this
//! process's uid.

use moneta_abi::control::{Request, Response};
use moneta_abi::sys::{self, PeerCredentials};
use moneta_abi::EmuError;
use moneta_client::{LocalPlane, Moneta};
use moneta_emu::{
    control::{ControlPlane, Session},
    engine::{Engine, EngineOptions},
    medium::Medium,
};
use moneta_model::config::Config;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// One client's session on an in-process control plane; dropping it ends
/// the session (closes its channel), as a daemon does when a socket closes.
struct EmbeddedPlane {
    plane: Arc<ControlPlane>,
    session: Session,
}

impl LocalPlane for EmbeddedPlane {
    fn call(
        &mut self,
        request: Request,
        fd: Option<OwnedFd>,
    ) -> Result<(Response, Vec<OwnedFd>), EmuError> {
        let (response, memory) = self.plane.handle_with_fd(&mut self.session, request, fd);
        // As SCM_RIGHTS would: the client gets its own descriptors.
        let fds = match memory {
            Some(m) => m
                .fds()
                .iter()
                .map(|fd| sys::dup(fd.as_raw_fd()))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| EmuError::io("duplicating the channel memory", e))?,
            None => Vec::new(),
        };
        Ok((response, fds))
    }
}

impl Drop for EmbeddedPlane {
    fn drop(&mut self) {
        self.plane.end(&mut self.session);
    }
}

/// Start a device in this process on `medium` and open a channel on it;
/// the channel keeps the device alive until its last clone is dropped.
pub fn embedded(
    config: Config,
    medium: Medium,
    options: EngineOptions,
) -> Result<Moneta, EmuError> {
    let engine = Arc::new(Engine::start(config, medium, options)?);
    let plane = Arc::new(ControlPlane::new(engine.clone(), own_uid()));
    attach(&plane, Some(engine))
}

/// Open another channel on an in-process control plane, as a client of it
/// with this process's credentials; `engine`, if given, lives as long as
/// the channel.
pub fn attach(plane: &Arc<ControlPlane>, engine: Option<Arc<Engine>>) -> Result<Moneta, EmuError> {
    let session = Session::new(PeerCredentials {
        pid: std::process::id() as i32,
        uid: own_uid(),
        gid: 0,
    });
    let local = EmbeddedPlane {
        plane: plane.clone(),
        session,
    };
    Moneta::local(Box::new(local), engine.map(|e| e as _))
}

fn own_uid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}
