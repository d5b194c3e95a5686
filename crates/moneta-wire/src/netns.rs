//! Two network namespaces joined by a veth pair: a two-host Ethernet
//! segment on one machine, for the packet-socket tests and benchmark
//! (issue 12: "over veth"). Made with iproute2 (`ip netns`, `ip link`);
//! removed when the guard drops, also when a test fails. Names carry the
//! process id and a counter, so parallel tests do not collide.

use crate::WireError;
use moneta_model::device::packet::Mac;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether this process may create namespaces and raw sockets.
pub fn is_root() -> bool {
    // SAFETY: plain system call.
    unsafe { libc::geteuid() == 0 }
}

fn ip(args: &[&str]) -> Result<(), WireError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| WireError::io("run ip (iproute2)", e))?;
    if !out.status.success() {
        return Err(WireError::Config(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Two namespaces, `namespaces[i]` holding interface `interfaces[i]`, the
/// two ends of one veth pair, up, with the given MTU and MAC addresses.
#[derive(Debug)]
pub struct VethPair {
    pub namespaces: [String; 2],
    pub interfaces: [String; 2],
}

impl VethPair {
    pub fn create(mtu: u32, macs: [Mac; 2]) -> Result<VethPair, WireError> {
        let id = format!(
            "{}x{}",
            std::process::id() % 1_000_000,
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let pair = VethPair {
            namespaces: [format!("mwire{id}a"), format!("mwire{id}b")],
            interfaces: [format!("mw{id}a"), format!("mw{id}b")],
        };
        // From here on, Drop removes whatever was made.
        for ns in &pair.namespaces {
            ip(&["netns", "add", ns])?;
        }
        let [na, nb] = &pair.namespaces;
        let [ia, ib] = &pair.interfaces;
        ip(&[
            "link", "add", ia, "netns", na, "type", "veth", "peer", "name", ib, "netns", nb,
        ])?;
        let mtu = mtu.to_string();
        for (i, mac) in macs.iter().enumerate() {
            let m = mac.0;
            let mac = format!(
                "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
                m[0], m[1], m[2], m[3], m[4], m[5]
            );
            let (ns, dev) = (&pair.namespaces[i], &pair.interfaces[i]);
            ip(&["-n", ns, "link", "set", dev, "mtu", &mtu, "address", &mac])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
        }
        Ok(pair)
    }

    /// Run `f` in namespace `side` (0 or 1), on a thread made for it (a
    /// thread that enters a namespace stays there). Sockets it opens stay
    /// in that namespace wherever they are used afterwards.
    pub fn in_namespace<R: Send + 'static>(
        &self,
        side: usize,
        f: impl FnOnce() -> Result<R, WireError> + Send + 'static,
    ) -> Result<R, WireError> {
        let ns = self.namespaces[side].clone();
        std::thread::spawn(move || {
            enter_netns(&ns)?;
            f()
        })
        .join()
        .map_err(|_| WireError::Config("the namespace thread panicked".into()))?
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and so the pair.
        for ns in &self.namespaces {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Move the calling thread into the named network namespace (`ip netns`).
pub fn enter_netns(name: &str) -> Result<(), WireError> {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).map_err(|e| WireError::io(format!("open {path}"), e))?;
    use std::os::fd::AsRawFd;
    // SAFETY: file is an open namespace file; setns affects this thread only.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(WireError::last_os(format!("setns {name}")));
    }
    Ok(())
}
