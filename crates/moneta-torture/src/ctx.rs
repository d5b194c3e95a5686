//! What a scripted schedule runs with (`scenario`, `fd_scenarios`): the
//! Moneta mount, the `moneta` binary, the schedule's scratch directory,
//! and how a step runs through the shim (`moneta run -- moneta-torture
//! step ARGS`).

use crate::error::Result;
use std::path::PathBuf;
use std::process::Command;

pub struct Ctx {
    pub mount: PathBuf,
    pub moneta: PathBuf,
    pub dir: PathBuf,
}

impl Ctx {
    /// `moneta-torture step ARGS` through the shim.
    pub fn shim(&self, args: &[&str]) -> Result<String> {
        let me = std::env::current_exe().map_err(|e| e.to_string())?;
        let o = Command::new(&self.moneta)
            .arg("run")
            .arg("--mount")
            .arg(&self.mount)
            .arg("--")
            .arg(me)
            .arg("step")
            .args(args)
            .env_remove("LD_PRELOAD")
            .output()
            .map_err(|e| format!("moneta run: {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        if o.status.success() {
            Ok(text)
        } else {
            Err(format!("shim step {args:?} failed ({}): {text}", o.status).into())
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn spawn_shim(&self, args: &[&str]) -> std::io::Result<std::process::Child> {
        Command::new(&self.moneta)
            .arg("run")
            .arg("--mount")
            .arg(&self.mount)
            .arg("--")
            .arg(std::env::current_exe()?)
            .arg("step")
            .args(args)
            .env_remove("LD_PRELOAD")
            .spawn()
    }
}
