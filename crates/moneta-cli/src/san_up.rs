//! `moneta san up`, `moneta san status`, `moneta san down`: an emulated
//! QuickSAN of N hosts on this one machine (issue 12 item 3; SPEC §4.1).
//!
//! Each host is a network namespace with one interface, `eth0`, whose MAC
//! is the node's entry in the SAN's MAC table (Table A.3) and whose MTU
//! (9000) carries an 8 KB payload in one frame. A veth pair joins it to a
//! Linux bridge in the root namespace: the bridge is the SAN's switch.
//! Every node's device has its own image and is started with the SAN file
//! (`moneta_emu::san_file`) that lists every node, so every device installs
//! the same global address map. By default (`--daemons one`, issue 21) one
//! monetad (`moneta serve-group`) serves every node's device on shared
//! reactors, each node's link and NBD listener opened inside its namespace
//! (`serve --netns`); with `--daemons per-node` a monetad runs in every
//! namespace, so that one node can be killed alone.
//!
//! Everything of SAN `<name>` lives in `/run/moneta/san-<name>/`:
//! `san.toml` (the SAN file), `state.json` (what `up` made: written last,
//! removed by `down`), `n<i>/{device.img, monetad.sock, monetad.log,
//! serve.args}` per node, and the one daemon's `monetad.log`. Names:
//! namespaces `moneta-<name>-n<i>`, host links `ms-<name>-<i>`, the bridge
//! `msb-<name>`. `up` registers the undo of
//! every step (rollback on error, panic or Ctrl-C); `down` finds the pieces
//! by name, not only from `state.json`, so it also cleans up after a crash.
//! `down` keeps the images (a node brought back finds its data), unless
//! `--purge`. A lock file `/run/moneta/.lock-san-<name>` serializes `up`,
//! `down` and `restart` of one SAN, and every file of the state directory
//! is written through a temporary file and a rename (`moneta_supervisor`,
//! as for `moneta up`).
//!
//! Where the images live: the media are memory, and the emulator maps
//! them. When `/run/moneta` is not a tmpfs (on some machines `/run` is on
//! disk), the kernel writes their dirty pages back and write-protects them
//! again, so the daemons take page faults on the media mid-benchmark and
//! an NBD flush (`msync`) waits for the disk: the 3-host sort over NBD
//! measured 0.116–0.137 s with the images there against 0.076–0.093 s on
//! a tmpfs (direct: 0.075–0.087 against 0.069–0.088 s). So `up` then puts
//! each image in `/dev/shm/moneta-san-<name>/n<i>.img` (a tmpfs, when the
//! media fit in half of the memory available) and `n<i>/device.img` is a
//! symbolic link to it ([`media_dir`]); like `/run`, a tmpfs is emptied at
//! boot.

use crate::mount::{human, need_root, parse_size, RUN_DIR};
use clap::{Args, ValueEnum};
use moneta_emu::san_file::{
    format_mac, SanFile, SanNode, SanTopology, Transport, DEFAULT_ETHERTYPE,
};
use moneta_emu::sys;
use moneta_model::device::packet::Mac;
use moneta_supervisor::daemon::{daemon_sockets, daemons_under, start_daemon, stop_daemon};
use moneta_supervisor::signals::{catch_signals, interrupted};
use moneta_supervisor::state::{read_json, write_atomic, write_json, Lock, StateDir};
use moneta_supervisor::system::{mem_available, run};
use moneta_supervisor::Rollback;
use serde::{Deserialize, Serialize};
use std::fs;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The device preset of the SAN's SSDs (and, minus the memory, NICs).
pub const DEVICE_PRESET: &str = "quicksan-ssd";
/// Nodes on one machine: each is a namespace and a spinning device thread.
const MAX_LOCAL_NODES: u16 = 64;
/// Short enough for `ms-<name>-<i>` to fit the kernel's 15-byte link names.
const MAX_NAME: usize = 8;
/// The UDP port every node listens on (transport udp).
const UDP_PORT: u16 = 7700;
const MTU: u32 = 9000;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum TopologyArg {
    Distributed,
    Centralized,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum TransportArg {
    Ethernet,
    Udp,
}

/// How the nodes' devices are hosted.
#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum DaemonsArg {
    /// One monetad for every node, its devices turned by shared reactors:
    /// a remote request crosses the wire without waiting for
    /// the scheduler. A node cannot be killed alone.
    One,
    /// A monetad per node, each in its namespace: `kill -9` of one node
    /// is real (the chaos checker and the failure tests use it).
    PerNode,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum SanFormat {
    Table,
    Json,
}

#[derive(Args)]
pub struct SanUpArgs {
    /// Hosts in the SAN (each a network namespace with a monetad).
    #[arg(long, default_value_t = 3)]
    nodes: u16,
    /// distributed: every host holds an SSD; centralized: host 0 is the
    /// storage server, the others hold QuickSAN NICs.
    #[arg(long, value_enum, default_value_t = TopologyArg::Distributed)]
    topology: TopologyArg,
    /// Mirror every slice of the global space on a second SSD (SPEC §4.3).
    #[arg(long)]
    mirror: bool,
    /// ethernet: raw frames on the namespaces' veth links; udp: datagrams.
    #[arg(long, value_enum, default_value_t = TransportArg::Ethernet)]
    transport: TransportArg,
    /// Each SSD's capacity (a power of two), bytes or K/M/G/T.
    #[arg(long, default_value = "256M")]
    size: String,
    /// The SSDs' preset (NICs use quicksan-nic).
    #[arg(long, default_value = DEVICE_PRESET)]
    preset: String,
    /// Overrides for every node's preset, KEY=VALUE (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// The SAN's name (1–8 of a-z, 0-9), so several can run at once.
    #[arg(long, default_value = "san")]
    name: String,
    /// Also serve each SSD's own slice over NBD on this TCP port at the
    /// node's address: target software on every host, the iSCSI-like path
    /// of `moneta san sort --via nbd`.
    #[arg(long)]
    nbd_port: Option<u16>,
    /// How long each daemon's device thread spins idle before it naps (a
    /// frame or a client wakes it): on a machine with a core per daemon and
    /// client, a large value gives the lowest latency.
    #[arg(long, default_value_t = moneta_emu::engine::SAN_IDLE_SPIN_NS / 1000)]
    idle_spin_us: u64,
    /// Frames without a MAC: no secret is made, and anything on the
    /// segment can speak for a node (to measure what the MAC costs, or on
    /// a segment you trust). Default: a new secret in the state directory,
    /// named by the SAN file, and every frame tagged with it.
    #[arg(long)]
    insecure: bool,
    /// one: every node's device in one monetad, turned by shared reactors
    /// (README "Reactors"); per-node: a monetad per node, so that one can
    /// be killed alone.
    #[arg(long, value_enum, default_value_t = DaemonsArg::One)]
    daemons: DaemonsArg,
    /// With --daemons one: the reactor threads (default: the cores less
    /// one for the clients, at least 1).
    #[arg(long)]
    reactors: Option<usize>,
    /// Leave each SSD's memory to be faulted in by its first requests. By
    /// default every daemon faults in its whole medium at start (`serve
    /// --populate-bytes`), so that the first benchmark after `up` does not
    /// measure the host's first-touch page faults and block allocation
    /// (they made the first `san bench` 1.3–1.4× slower on remote
    /// requests); skipped, with a note, when the SAN's media would take
    /// more than half of the memory available.
    #[arg(long)]
    no_populate: bool,
}

impl SanUpArgs {
    fn topology(&self) -> SanTopology {
        match self.topology {
            TopologyArg::Distributed => SanTopology::Distributed,
            TopologyArg::Centralized => SanTopology::Centralized,
        }
    }

    fn transport(&self) -> Transport {
        match self.transport {
            TransportArg::Ethernet => Transport::Ethernet,
            TransportArg::Udp => Transport::Udp,
        }
    }
}

/// Whether node `n`'s daemon is the one up started (its pid still runs
/// with its socket).
fn daemon_alive(n: &NodeState) -> bool {
    daemon_sockets(n.pid as i32).contains(&n.socket)
}

#[derive(Args)]
pub struct SanDownArgs {
    #[arg(long, default_value = "san")]
    name: String,
    /// Also delete the nodes' images.
    #[arg(long)]
    purge: bool,
}

#[derive(Args)]
pub struct SanStatusArgs {
    /// One SAN; default: every SAN under /run/moneta.
    #[arg(long)]
    name: Option<String>,
    #[arg(long, value_enum, default_value_t = SanFormat::Table)]
    format: SanFormat,
}

#[derive(Args)]
pub struct SanRestartArgs {
    #[arg(long, default_value = "san")]
    name: String,
    /// The node to start again (its name, e.g. n1, or index); it must not
    /// be running. It keeps its image, and resyncs from its mirror partners.
    #[arg(long)]
    node: String,
}

#[derive(Args)]
pub struct SanFaultArgs {
    #[arg(long, default_value = "san")]
    name: String,
    /// The node whose link gets the faults (name or index).
    #[arg(long)]
    node: String,
    /// Only its link to this peer (name or index); default: every peer.
    #[arg(long)]
    peer: Option<String>,
    /// What to inject, e.g. `drop=1%,corrupt=0.1%,reorder=5%,reorder-us=50`,
    /// `duplicate=1%`, `delay-us=100,jitter-us=20`, `partition`; `none` heals.
    faults: String,
}

#[derive(Args)]
pub struct SanResolveArgs {
    #[arg(long, default_value = "san")]
    name: String,
    /// The node whose writes are discarded (name or index): the other
    /// holder of each slice wins, and resyncs this node's copy from its own.
    #[arg(long, required_unless_present = "force", conflicts_with = "force")]
    discard: Option<String>,
    /// The node whose outdated copies are forced up to date while their
    /// partner stays down (DRBD's forced promotion): they are read again,
    /// though they may lack writes the partner acknowledged before it went
    /// down. When the partner returns with such writes and this node wrote
    /// too, the slice is in split brain (resolve it with --discard).
    #[arg(long)]
    force: Option<String>,
    /// Only this slice (default: every slice the node holds in split
    /// brain, or outdated with --force).
    #[arg(long)]
    slice: Option<u64>,
}

/// What `up` made, for `status`, `down`, `restart` and `sort`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SanState {
    pub(crate) name: String,
    bridge: String,
    pub(crate) san_file: PathBuf,
    pub(crate) nodes: Vec<NodeState>,
    /// `up`'s --set and --size, so that `restart` starts a node alike.
    #[serde(default)]
    sets: Vec<String>,
    #[serde(default)]
    size: u64,
    #[serde(default = "default_idle_spin_us")]
    idle_spin_us: u64,
    /// Every node's device in one monetad (`--daemons one`).
    #[serde(default)]
    one_daemon: bool,
    /// Whether daemons fault their media in at start (`up` without
    /// `--no-populate`, memory allowing).
    #[serde(default)]
    populate: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct NodeState {
    pub(crate) name: String,
    pub(crate) netns: String,
    host_link: String,
    mac: String,
    pub(crate) ip: String,
    pub(crate) socket: PathBuf,
    image: PathBuf,
    log: PathBuf,
    pid: u32,
    pub(crate) preset: String,
    /// HOST:PORT of the node's NBD server (`up --nbd-port`), serving the
    /// export [`NBD_EXPORT`]: the node's primary slice.
    #[serde(default)]
    pub(crate) nbd: Option<String>,
}

/// The name of each node's NBD export (`up --nbd-port`).
pub(crate) const NBD_EXPORT: &str = "slice";

/// The state of SAN `name`, or an error saying it is not up.
pub(crate) fn load_state(name: &str) -> Result<SanState, String> {
    check_name(name)?;
    read_state(&san_dir(name))?.ok_or_else(|| {
        format!("no SAN '{name}' is up (moneta san up --name {name}; moneta san status)")
    })
}

pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "--name '{name}': 1 to {MAX_NAME} characters of a-z and 0-9 (it is part of \
             15-byte link names)"
        ));
    }
    Ok(())
}

fn san_dir(name: &str) -> PathBuf {
    san_state_dir(name).dir
}

/// SAN `name`'s state directory, `/run/moneta/san-<name>/`, and its lock.
fn san_state_dir(name: &str) -> StateDir {
    StateDir::new(Path::new(RUN_DIR), &format!("san-{name}"))
}

/// Serializes `san up`, `san down` and `san restart` of SAN `name`
/// (`/run/moneta/.lock-san-<name>`; made with `/run/moneta` if need be).
fn lock_san(name: &str) -> Result<Lock, String> {
    fs::create_dir_all(RUN_DIR).map_err(|e| format!("creating {RUN_DIR}: {e}"))?;
    Ok(san_state_dir(name).lock(&format!("moneta san up/down/restart of SAN '{name}'"))?)
}
fn netns_name(name: &str, i: u16) -> String {
    format!("moneta-{name}-n{i}")
}
fn host_link(name: &str, i: u16) -> String {
    format!("ms-{name}-{i}")
}
fn bridge_name(name: &str) -> String {
    format!("msb-{name}")
}
fn node_ip(i: u16) -> String {
    format!("10.77.{}.{}", (i + 1) / 256, (i + 1) % 256)
}

fn ip(args: &[&str]) -> Result<String, String> {
    Ok(run(Command::new("ip").args(args))?)
}

/// `ip` for a teardown: a piece that is already gone is not an error.
fn ip_gone(args: &[&str]) -> Result<(), String> {
    match ip(args) {
        Ok(_) => Ok(()),
        Err(e) if e.contains("Cannot find device") || e.contains("No such file") => Ok(()),
        Err(e) => Err(e),
    }
}

fn link_exists(link: &str) -> bool {
    Path::new("/sys/class/net").join(link).exists()
}
fn netns_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

fn read_state(dir: &Path) -> Result<Option<SanState>, String> {
    Ok(read_json(&dir.join("state.json"))?)
}

pub fn up(a: SanUpArgs) -> crate::error::Result<()> {
    need_root("san up")?;
    check_name(&a.name)?;
    if a.nodes == 0 || a.nodes > MAX_LOCAL_NODES {
        return Err(format!("--nodes {}: 1 to {MAX_LOCAL_NODES} on one machine", a.nodes).into());
    }
    match (a.reactors, a.daemons) {
        (Some(0), _) => return Err("--reactors 0: at least one".into()),
        (Some(_), DaemonsArg::PerNode) => {
            return Err(
                "--reactors needs --daemons one (a daemon per node turns its one device)".into(),
            )
        }
        _ => {}
    }
    let size = parse_size(&a.size)?;
    if !size.is_power_of_two() {
        return Err(format!(
            "--size {}: must be a power of two (the routing registers select a slice by \
             the upper address bits)",
            a.size
        )
        .into());
    }
    let dir = san_dir(&a.name);
    let _lock = lock_san(&a.name)?;
    if let Some(state) = read_state(&dir)? {
        return Ok(up_again(&a, size, &state)?);
    }
    // Leftovers of a crash that skipped the rollback go first.
    teardown(&a.name, None)?;
    catch_signals();
    let exe = std::env::current_exe().map_err(|e| format!("finding the moneta binary: {e}"))?;
    let populate = populate_media(&a, size);

    let (topology, transport) = (a.topology(), a.transport());
    let mut file = SanFile {
        name: a.name.clone(),
        topology,
        mirror: a.mirror,
        transport,
        ethertype: DEFAULT_ETHERTYPE,
        device_capacity_bytes: size,
        secret_file: (!a.insecure).then(|| dir.join("secret")),
        nodes: Vec::new(),
    };
    for i in 0..a.nodes {
        let node_dir = dir.join(format!("n{i}"));
        file.nodes.push(SanNode {
            name: format!("n{i}"),
            mac: format_mac(Mac::of_node(i)),
            interface: Some("eth0".into()),
            udp: Some(format!("{}:{UDP_PORT}", node_ip(i))),
            socket: Some(node_dir.join("monetad.sock")),
        });
    }
    // Checks the map (power of two, mirroring needs two SSDs, …) before
    // anything is made.
    let text = file.to_toml();
    SanFile::parse(&text).map_err(|e| e.to_string())?;
    let slice_bytes = file.address_map().map_err(|e| e.to_string())?.slice_bytes();

    let mut rb = Rollback::default();
    let created_dir = !dir.exists();
    fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if created_dir {
        let d = dir.clone();
        rb.push(format!("removed {}", dir.display()), move || {
            fs::remove_dir_all(&d).map_err(|e| e.to_string())
        });
    }
    let media = media_dir(&a.name, size.saturating_mul(u64::from(a.nodes)));
    if let Some(m) = &media {
        if make_media_dir(m)? {
            let d = m.clone();
            rb.push(format!("removed {}", m.display()), move || {
                fs::remove_dir_all(&d).map_err(|e| e.to_string())
            });
        }
    }
    if let Some(path) = &file.secret_file {
        // A new SAN, a new secret (one left by a crash is not reused).
        let _ = fs::remove_file(path);
        moneta_wire::auth::Secret::generate()
            .map_err(|e| format!("making the SAN's secret: {e}"))?
            .save_new(path)?;
    }
    let san_file = dir.join("san.toml");
    write_atomic(&san_file, text.as_bytes())?;

    let bridge = bridge_name(&a.name);
    ip(&["link", "add", &bridge, "type", "bridge"])?;
    {
        let b = bridge.clone();
        rb.push(format!("deleted bridge {bridge}"), move || {
            ip_gone(&["link", "del", &b])
        });
    }
    ip(&["link", "set", &bridge, "up"])?;

    // A SAN whose every image is new: its blank copies agree, and their
    // replica metadata says so (`replica_meta`, DRBD's new-current-uuid
    // --clear-bitmap). An image missing beside others that exist is a
    // replaced disk: no metadata, a full resync before it serves.
    let new_san = (0..a.nodes).all(|i| fs::metadata(dir.join(format!("n{i}/device.img"))).is_err());
    let mut nodes = Vec::new();
    for i in 0..a.nodes {
        interrupted()?;
        let ns = netns_name(&a.name, i);
        let link = host_link(&a.name, i);
        ip(&["netns", "add", &ns])?;
        {
            let n = ns.clone();
            rb.push(format!("deleted namespace {ns}"), move || {
                ip_gone(&["netns", "del", &n])
            });
        }
        ip(&[
            "link", "add", &link, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        {
            let l = link.clone();
            rb.push(format!("deleted link {link}"), move || {
                ip_gone(&["link", "del", &l])
            });
        }
        let mtu = MTU.to_string();
        ip(&["link", "set", &link, "mtu", &mtu, "master", &bridge, "up"])?;
        let mac = &file.nodes[i as usize].mac;
        ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        ip(&[
            "-n", &ns, "link", "set", "eth0", "address", mac, "mtu", &mtu, "up",
        ])?;
        let addr = format!("{}/16", node_ip(i));
        ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"])?;

        let node_dir = dir.join(format!("n{i}"));
        fs::create_dir_all(&node_dir).map_err(|e| format!("{}: {e}", node_dir.display()))?;
        let preset = if file.has_memory(i) {
            a.preset.clone()
        } else {
            "quicksan-nic".to_string()
        };
        let (socket, image, log) = (
            node_dir.join("monetad.sock"),
            node_image(&node_dir, media.as_deref(), i)?,
            node_dir.join("monetad.log"),
        );
        if new_san && file.has_memory(i) {
            let slices = file.mirrored_slices(i).map_err(|e| e.to_string())?;
            moneta_emu::replica_meta::ReplicaMeta::initialize(&image, size, &a.name, i, &slices)
                .map_err(|e| format!("{}: writing its replica metadata: {e}", image.display()))?;
        }
        let nbd = a
            .nbd_port
            .filter(|_| file.has_memory(i))
            .map(|port| format!("{}:{port}", node_ip(i)));
        let nbd_listen = nbd.as_ref().map(|addr| nbd_listen(addr, i, slice_bytes));
        let args = node_args(
            &preset,
            &daemon_args(&a.sets, a.idle_spin_us, populate.then_some(size)),
            size,
            &socket,
            &image,
            &san_file,
            i,
            nbd_listen.as_ref(),
        );
        let (pid, log) = if a.daemons == DaemonsArg::One {
            // Started below, once every node's namespace is there.
            let mut lines = args;
            lines.extend(["--netns".to_string(), ns.clone()]);
            write_atomic(
                &node_dir.join("serve.args"),
                (lines.join("\n") + "\n").as_bytes(),
            )?;
            (0, dir.join("monetad.log"))
        } else {
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &ns]).arg(&exe).arg("serve");
            cmd.args(&args);
            // `ip netns exec` execs the command: the pid is monetad's.
            let pid = start_daemon(
                &mut cmd,
                &format!("monetad in {ns}"),
                &log,
                "moneta san up",
                std::slice::from_ref(&socket),
                &mut rb,
            )?;
            (pid, log)
        };
        nodes.push(NodeState {
            name: format!("n{i}"),
            netns: ns,
            host_link: link,
            mac: mac.clone(),
            ip: node_ip(i),
            socket,
            image,
            log,
            pid,
            preset,
            nbd,
        });
    }
    if a.daemons == DaemonsArg::One {
        let mut cmd = Command::new(&exe);
        cmd.arg("serve-group");
        if let Some(r) = a.reactors {
            cmd.arg("--reactors").arg(r.to_string());
        }
        cmd.args((0..a.nodes).map(|i| dir.join(format!("n{i}/serve.args"))));
        let sockets: Vec<PathBuf> = nodes.iter().map(|n| n.socket.clone()).collect();
        let pid = start_daemon(
            &mut cmd,
            "the SAN's monetad",
            &dir.join("monetad.log"),
            "moneta san up",
            &sockets,
            &mut rb,
        )?;
        for n in &mut nodes {
            n.pid = pid;
        }
    }
    let state = SanState {
        name: a.name.clone(),
        bridge,
        san_file,
        nodes,
        sets: a.sets.clone(),
        size,
        idle_spin_us: a.idle_spin_us,
        one_daemon: a.daemons == DaemonsArg::One,
        populate,
    };
    write_json(&dir.join("state.json"), &state)?;
    interrupted()?;
    rb.commit();
    println!(
        "SAN '{}' up: {} nodes, {:?}{}, {} per SSD, {:?} transport; state in {}",
        a.name,
        a.nodes,
        topology,
        if a.mirror { ", mirrored" } else { "" },
        human(size),
        transport,
        dir.display()
    );
    if let Some(m) = &media {
        println!(
            "  images in {} ({RUN_DIR} is not a tmpfs: its writeback would fault the media \
             again)",
            m.display()
        );
    }
    for n in &state.nodes {
        println!(
            "  {}  ns {}  {}  {}  pid {}  socket {}{}",
            n.name,
            n.netns,
            n.ip,
            n.mac,
            n.pid,
            n.socket.display(),
            n.nbd
                .as_ref()
                .map_or(String::new(), |a| format!("  nbd://{a}/{NBD_EXPORT}"))
        );
    }
    Ok(())
}

/// Where a node's NBD server listens and what it exports.
struct NbdListen {
    addr: String,
    export: String,
}

/// Node `i`'s NBD server on `addr`: it exports its primary slice, which
/// is slice `i` of the global space its daemon addresses.
fn nbd_listen(addr: &str, i: u16, slice_bytes: u64) -> NbdListen {
    NbdListen {
        addr: addr.to_string(),
        export: format!("{NBD_EXPORT}:{}:{slice_bytes}", u64::from(i) * slice_bytes),
    }
}

fn default_idle_spin_us() -> u64 {
    moneta_emu::engine::SAN_IDLE_SPIN_NS / 1000
}

/// What a node's daemon is started with besides its place in the SAN:
/// the preset overrides, the idle spin and how much medium to fault in.
fn daemon_args(sets: &[String], idle_spin_us: u64, populate: Option<u64>) -> Vec<String> {
    let mut args: Vec<String> = sets
        .iter()
        .flat_map(|kv| ["--set".to_string(), kv.clone()])
        .collect();
    args.extend(["--san-idle-spin-us".to_string(), idle_spin_us.to_string()]);
    if let Some(bytes) = populate {
        args.extend(["--populate-bytes".to_string(), bytes.to_string()]);
    }
    args
}

/// Whether `up` has the daemons fault their media in (`--no-populate`):
/// not when the media would take more than half of the memory available
/// (then a note says so).
fn populate_media(a: &SanUpArgs, size: u64) -> bool {
    if a.no_populate {
        return false;
    }
    let media = size.saturating_mul(u64::from(a.nodes));
    match mem_available() {
        Some(avail) if media > avail / 2 => {
            eprintln!(
                "moneta: note: the media ({}) are not faulted in at start: more than half of \
                 the memory available ({}); the first requests to each page pay its page fault",
                human(media),
                human(avail)
            );
            false
        }
        _ => true,
    }
}

/// Where SAN `name`'s images go when `/run/moneta` is not a tmpfs (module
/// header): `/dev/shm/moneta-san-<name>`, if `/dev/shm` is a tmpfs and
/// `media` bytes fit in half of the memory available; else None (the
/// images stay in the node directories).
fn media_dir(name: &str, media: u64) -> Option<PathBuf> {
    let run = Path::new(RUN_DIR);
    let shm = Path::new("/dev/shm");
    if sys::on_tmpfs(run) || !sys::on_tmpfs(shm) {
        return None;
    }
    if mem_available().is_some_and(|avail| media > avail / 2) {
        return None;
    }
    Some(shm.join(format!("moneta-san-{name}")))
}

/// Make `dir` for the images, or take the one an earlier `up` made: a
/// real directory (not a link) of root's, mode 0700 — `/dev/shm` is
/// anyone's to write, so anything else there is refused. Returns whether
/// it was made now.
fn make_media_dir(dir: &Path) -> Result<bool, String> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("{}: {e}", dir.display())),
    }
    let meta = fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{} exists but is not a private directory of root's (a link, another \
             owner, or open to others): remove it, or run `moneta san up` elsewhere",
            dir.display()
        ));
    }
    Ok(false)
}

/// Node `node_dir`'s image path: `device.img` there, a link to
/// `media/n<i>.img` when the media go elsewhere (an image already in the
/// node directory from an earlier `up` stays where it is).
fn node_image(node_dir: &Path, media: Option<&Path>, i: u16) -> Result<PathBuf, String> {
    let image = node_dir.join("device.img");
    if let Some(media) = media {
        if fs::symlink_metadata(&image).is_err() {
            let target = media.join(format!("n{i}.img"));
            std::os::unix::fs::symlink(&target, &image)
                .map_err(|e| format!("{} → {}: {e}", image.display(), target.display()))?;
        }
    }
    Ok(image)
}

/// A node's `moneta serve` arguments (after `serve`).
#[allow(clippy::too_many_arguments)]
fn node_args(
    preset: &str,
    daemon_args: &[String],
    size: u64,
    socket: &Path,
    image: &Path,
    san_file: &Path,
    node: u16,
    nbd: Option<&NbdListen>,
) -> Vec<String> {
    let mut args = vec!["--preset".to_string(), preset.to_string()];
    args.extend(daemon_args.iter().cloned());
    args.extend([
        "--set".to_string(),
        format!("device.capacity_bytes={size}"),
        "--image".to_string(),
        image.display().to_string(),
        "--socket".to_string(),
        socket.display().to_string(),
        "--san".to_string(),
        san_file.display().to_string(),
        "--node".to_string(),
        node.to_string(),
    ]);
    if let Some(n) = nbd {
        args.extend([
            "--nbd".to_string(),
            format!("tcp://{}", n.addr),
            "--nbd-export".to_string(),
            n.export.clone(),
        ]);
    }
    args
}

/// Stop every daemon, namespace and link of SAN `name`, from its state and
/// by name (leftovers of a crash). Returns what it removed.
fn teardown(name: &str, state: Option<&SanState>) -> Result<Vec<String>, String> {
    let mut done = Vec::new();
    let mut errors = Vec::new();
    if let Some(s) = state {
        for n in &s.nodes {
            match stop_daemon(n.pid as i32, &n.socket) {
                Ok(true) => done.push(format!("stopped monetad of {} (pid {})", n.name, n.pid)),
                Ok(false) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
    }
    // Daemons not in the state (a crash between start and state.json) are
    // found by their socket under the SAN's directory.
    let dir = san_dir(name);
    for pid in daemons_under(&dir) {
        let socket = daemon_sockets(pid).into_iter().next().unwrap_or_default();
        match stop_daemon(pid, &socket) {
            Ok(true) => done.push(format!("stopped monetad (pid {pid})")),
            Ok(false) => {}
            Err(e) => errors.push(e.to_string()),
        }
    }
    let prefix = format!("moneta-{name}-n");
    if let Ok(entries) = fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            let ns = e.file_name().to_string_lossy().into_owned();
            if ns
                .strip_prefix(&prefix)
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            {
                match ip_gone(&["netns", "del", &ns]) {
                    Ok(()) => done.push(format!("deleted namespace {ns}")),
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    let link_prefix = format!("ms-{name}-");
    if let Ok(entries) = fs::read_dir("/sys/class/net") {
        for e in entries.flatten() {
            let link = e.file_name().to_string_lossy().into_owned();
            if link
                .strip_prefix(&link_prefix)
                .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()))
            {
                match ip_gone(&["link", "del", &link]) {
                    Ok(()) => done.push(format!("deleted link {link}")),
                    Err(e) => errors.push(e),
                }
            }
        }
    }
    let bridge = bridge_name(name);
    if link_exists(&bridge) {
        match ip_gone(&["link", "del", &bridge]) {
            Ok(()) => done.push(format!("deleted bridge {bridge}")),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() {
        Ok(done)
    } else {
        Err(errors.join("; "))
    }
}

pub fn down(a: SanDownArgs) -> Result<(), String> {
    need_root("san down")?;
    check_name(&a.name)?;
    let dir = san_dir(&a.name);
    // Without a state directory there is nothing of ours to lock; leftovers
    // are still found by name.
    let _lock = if dir.exists() {
        Some(lock_san(&a.name)?)
    } else {
        None
    };
    let state = read_state(&dir).unwrap_or_else(|e| {
        eprintln!("moneta: {e}; cleaning up by name");
        None
    });
    let done = teardown(&a.name, state.as_ref())?;
    let _ = fs::remove_file(dir.join("state.json"));
    if a.purge {
        let media = Path::new("/dev/shm").join(format!("moneta-san-{}", a.name));
        // Only a directory `up` could have made: root's, not a link.
        use std::os::unix::fs::MetadataExt;
        if fs::symlink_metadata(&media).is_ok_and(|m| m.is_dir() && m.uid() == 0) {
            fs::remove_dir_all(&media).map_err(|e| format!("{}: {e}", media.display()))?;
        }
    }
    if a.purge && dir.exists() {
        fs::remove_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    } else if let Ok(entries) = fs::read_dir(&dir) {
        // Keep the images; remove sockets left by killed daemons.
        for e in entries.flatten() {
            let _ = fs::remove_file(e.path().join("monetad.sock"));
        }
    }
    if done.is_empty() {
        println!("SAN '{}': nothing was running", a.name);
    } else {
        for d in &done {
            println!("{d}");
        }
        println!(
            "SAN '{}' down{}",
            a.name,
            if a.purge {
                ", images deleted"
            } else {
                "; images kept (--purge deletes them)"
            }
        );
    }
    Ok(())
}

/// The state of SAN `name` and the index of its node `node`.
fn find_node(name: &str, node: &str) -> Result<(SanState, usize), String> {
    check_name(name)?;
    let state = read_state(&san_dir(name))?
        .ok_or_else(|| format!("SAN '{name}' is not up (moneta san up --name {name})"))?;
    let i = state
        .nodes
        .iter()
        .position(|n| n.name == node)
        .or_else(|| {
            node.parse::<usize>()
                .ok()
                .filter(|&i| i < state.nodes.len())
        })
        .ok_or_else(|| {
            format!(
                "SAN '{name}' has no node '{node}' (nodes: {})",
                state
                    .nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
    Ok((state, i))
}

/// Start a node that died (or was killed) again, on its image.
pub fn restart(a: SanRestartArgs) -> Result<(), String> {
    need_root("san restart")?;
    check_name(&a.name)?;
    let _lock = lock_san(&a.name)?;
    let (mut state, i) = find_node(&a.name, &a.node)?;
    let n = state.nodes[i].clone();
    if daemon_alive(&n) {
        return Err(format!(
            "node {} of SAN '{}' is running (pid {})",
            n.name, a.name, n.pid
        ));
    }
    let _ = fs::remove_file(&n.socket);
    let exe = std::env::current_exe().map_err(|e| format!("finding the moneta binary: {e}"))?;
    let slice_bytes = SanFile::load(&state.san_file)
        .and_then(|f| f.address_map())
        .map_err(|e| e.to_string())?
        .slice_bytes();
    let nbd = n
        .nbd
        .as_ref()
        .map(|addr| nbd_listen(addr, i as u16, slice_bytes));
    let mut rb = Rollback::default();
    // A node started again runs in a daemon of its own, also on a SAN
    // brought up with one daemon (whose process is gone with every node).
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &n.netns]).arg(&exe).arg("serve");
    cmd.args(node_args(
        &n.preset,
        &daemon_args(
            &state.sets,
            state.idle_spin_us,
            state.populate.then_some(state.size),
        ),
        state.size,
        &n.socket,
        &n.image,
        &state.san_file,
        i as u16,
        nbd.as_ref(),
    ));
    let log = n.socket.with_file_name("monetad.log");
    let pid = start_daemon(
        &mut cmd,
        &format!("monetad in {}", n.netns),
        &log,
        "moneta san restart",
        std::slice::from_ref(&n.socket),
        &mut rb,
    )?;
    state.nodes[i].pid = pid;
    state.nodes[i].log = log;
    write_json(&san_dir(&a.name).join("state.json"), &state)?;
    rb.commit();
    println!(
        "node {} of SAN '{}' started again (pid {pid}); it reads the copies it shares          from its mirror partners until they have resynced it",
        n.name, a.name
    );
    Ok(())
}

/// Inject faults into a node's link (`moneta_wire::fault`), at run time.
pub fn fault(a: SanFaultArgs) -> Result<(), String> {
    let (state, i) = find_node(&a.name, &a.node)?;
    let peer = match &a.peer {
        Some(p) => Some(find_node(&a.name, p)?.1 as u16),
        None => None,
    };
    let m = moneta::Moneta::connect(&state.nodes[i].socket).map_err(|e| e.to_string())?;
    m.san_fault(peer, &a.faults).map_err(|e| e.to_string())?;
    println!(
        "node {}: link to {} now: {}",
        state.nodes[i].name,
        peer.map_or("every peer".to_string(), |p| state.nodes[p as usize]
            .name
            .clone()),
        a.faults
    );
    Ok(())
}

pub fn resolve(a: SanResolveArgs) -> Result<(), String> {
    let node = a.discard.as_deref().or(a.force.as_deref()).expect("clap");
    let (state, i) = find_node(&a.name, node)?;
    let m = moneta::Moneta::connect(&state.nodes[i].socket).map_err(|e| e.to_string())?;
    let text = if a.force.is_some() {
        m.san_force(a.slice)
    } else {
        m.san_discard(a.slice)
    }
    .map_err(|e| e.to_string())?;
    println!("node {}: {text}", state.nodes[i].name);
    Ok(())
}

/// `san up` on a SAN that is up: nothing to do if it runs with the same
/// options and every node is healthy (as `moneta up` twice); otherwise say
/// what differs or what is broken.
fn up_again(a: &SanUpArgs, size: u64, state: &SanState) -> Result<(), String> {
    let file = SanFile::load(&state.san_file).map_err(|e| e.to_string())?;
    let (topology, transport) = (a.topology(), a.transport());
    let nbd_port = |n: &NodeState| {
        n.nbd
            .as_deref()
            .and_then(|h| h.rsplit_once(':'))
            .and_then(|(_, p)| p.parse::<u16>().ok())
    };
    let differs = [
        ("--nodes", state.nodes.len() != a.nodes as usize),
        ("--topology", file.topology != topology),
        ("--mirror", file.mirror != a.mirror),
        ("--transport", file.transport != transport),
        ("--size", state.size != size),
        ("--set", state.sets != a.sets),
        ("--idle-spin-us", state.idle_spin_us != a.idle_spin_us),
        (
            "--daemons",
            state.one_daemon != (a.daemons == DaemonsArg::One),
        ),
        ("--insecure", file.secret_file.is_some() == a.insecure),
        (
            "--preset",
            !state.nodes.iter().any(|n| n.preset == a.preset),
        ),
        (
            "--nbd-port",
            state.nodes.first().and_then(nbd_port) != a.nbd_port,
        ),
    ]
    .into_iter()
    .filter(|(_, d)| *d)
    .map(|(flag, _)| flag)
    .collect::<Vec<_>>();
    if !differs.is_empty() {
        return Err(format!(
            "SAN '{}' is up with other options ({} differ): moneta san down --name {} first",
            a.name,
            differs.join(", "),
            a.name
        ));
    }
    let broken: Vec<&str> = state
        .nodes
        .iter()
        .filter(|n| {
            !(daemon_alive(n)
                && netns_exists(&n.netns)
                && link_exists(&n.host_link)
                && UnixStream::connect(&n.socket).is_ok())
        })
        .map(|n| n.name.as_str())
        .collect();
    if !broken.is_empty() {
        return Err(format!(
            "SAN '{}' is up with these options but node(s) {} are not healthy: moneta san \
             restart --name {} --node NODE, or moneta san down --name {}",
            a.name,
            broken.join(", "),
            a.name,
            a.name
        ));
    }
    println!(
        "SAN '{}' is up already with these options ({} nodes): nothing to do",
        a.name,
        state.nodes.len()
    );
    Ok(())
}

pub fn status(a: SanStatusArgs) -> Result<(), String> {
    let names: Vec<String> = match &a.name {
        Some(n) => {
            check_name(n)?;
            if !san_dir(n).exists() {
                return Err(format!(
                    "no SAN named '{n}' (none was brought up with `moneta san up --name {n}`; \
                     `moneta san status` lists every SAN)"
                ));
            }
            vec![n.clone()]
        }
        None => fs::read_dir(RUN_DIR)
            .map(|entries| {
                let mut v: Vec<String> = entries
                    .flatten()
                    .filter_map(|e| {
                        e.file_name()
                            .to_str()?
                            .strip_prefix("san-")
                            .map(String::from)
                    })
                    .collect();
                v.sort();
                v
            })
            .unwrap_or_default(),
    };
    let mut rows = Vec::new();
    for name in &names {
        let dir = san_dir(name);
        let state = read_state(&dir);
        let s = state.as_ref().ok().and_then(Option::as_ref);
        let nodes: Vec<serde_json::Value> = s
            .map(|s| {
                s.nodes
                    .iter()
                    .map(|n| {
                        let alive = daemon_alive(n);
                        let listening = UnixStream::connect(&n.socket).is_ok();
                        // What the node's port says of its peers (a cut
                        // link leaves every local piece alive).
                        let port = listening
                            .then(|| moneta::Moneta::connect(&n.socket).ok()?.stats().ok()?.san)
                            .flatten();
                        let name_of = |i: &u16| {
                            s.nodes
                                .get(*i as usize)
                                .map_or_else(|| format!("node {i}"), |p| p.name.clone())
                        };
                        let unreachable: Vec<String> = port
                            .iter()
                            .flat_map(|p| &p.peers)
                            .filter(|(_, st)| st != "up")
                            .map(|(i, st)| format!("{} ({st})", name_of(i)))
                            .collect();
                        let split_brain: Vec<String> = port
                            .iter()
                            .flat_map(|p| p.split_brain_peers.iter().map(name_of))
                            .collect();
                        let unsynced: Vec<String> = port
                            .iter()
                            .flat_map(|p| p.unsynced_partners.iter().map(name_of))
                            .collect();
                        // Per mirrored slice held here: what a read of
                        // this copy does (issue 22).
                        let slices: Vec<serde_json::Value> = port
                            .iter()
                            .flat_map(|p| &p.slices)
                            .map(|x| {
                                let partner = name_of(&x.partner);
                                let partner_alive =
                                    s.nodes.get(x.partner as usize).is_some_and(daemon_alive);
                                let word = match x.state.as_str() {
                                    "up-to-date" if !x.partner_up && partner_alive => "partitioned",
                                    "up-to-date" if !x.partner_up => "degraded",
                                    "up-to-date" if x.to_send > 0 => "resyncing",
                                    "up-to-date" => "up-to-date",
                                    "inconsistent" if x.partner_up => "resyncing",
                                    "inconsistent" => "inconsistent",
                                    "split-brain" => "split-brain",
                                    "suspended" => "suspended",
                                    _ => "outdated",
                                };
                                let detail = match word {
                                    "partitioned" => format!(
                                        "{partner} runs but cannot be reached; writes go on here \
                                         alone ({} granules to resync)",
                                        x.to_send
                                    ),
                                    "degraded" => format!(
                                        "{partner} unreachable; writes go on here alone ({} \
                                         granules to resync)",
                                        x.to_send
                                    ),
                                    "resyncing" if x.state == "up-to-date" => {
                                        format!("to {partner}: {} granules left", x.to_send)
                                    }
                                    "resyncing" => format!(
                                        "from {partner}: {} of {} granules",
                                        x.received, x.to_receive
                                    ),
                                    "outdated" => format!(
                                        "may have missed writes; not read until {partner} \
                                         (unreachable) resyncs it"
                                    ),
                                    "inconsistent" => format!(
                                        "not a whole generation (a resync into it did not \
                                         finish, or a blank disk); never read or forced until \
                                         {partner} (unreachable) resyncs it"
                                    ),
                                    "split-brain" => format!(
                                        "both {partner} and this copy took writes alone; not \
                                         read or written until `moneta san resolve`"
                                    ),
                                    "suspended" => format!(
                                        "{partner} was just lost; not read or written alone \
                                         until this node knows whether {partner} is alive \
                                         behind a cut link (the tie-breaker)"
                                    ),
                                    _ => format!("in sync with {partner}"),
                                };
                                serde_json::json!({
                                    "slice": x.slice,
                                    "partner": partner,
                                    "state": word,
                                    "replica_state": x.state,
                                    "readable": x.state == "up-to-date",
                                    "partner_reachable": x.partner_up,
                                    "to_send": x.to_send,
                                    "to_receive": x.to_receive,
                                    "received": x.received,
                                    "detail": detail,
                                })
                            })
                            .collect();
                        serde_json::json!({
                            "name": n.name,
                            "netns": n.netns,
                            "netns_exists": netns_exists(&n.netns),
                            "link_exists": link_exists(&n.host_link),
                            "ip": n.ip,
                            "mac": n.mac,
                            "preset": n.preset,
                            "pid": n.pid,
                            "daemon_alive": alive,
                            "listening": listening,
                            "socket": n.socket,
                            "image": n.image,
                            "log": n.log,
                            "nbd": n.nbd,
                            "peers_unreachable": unreachable,
                            "split_brain_with": split_brain,
                            "resyncing_from": unsynced,
                            "slices": slices,
                            "dirty_map_error": port.as_ref().and_then(|p| p.dirty_save_error.clone()),
                            "refusals": port.as_ref().map_or(0, |p| p.refusals),
                            "last_refusal": port.as_ref().and_then(|p| p.last_refusal.clone()),
                            "frames_unauthenticated": port.as_ref().map_or(0, |p| p.unauthenticated),
                            "frames_replayed": port.as_ref().map_or(0, |p| p.replayed),
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let healthy = |v: &serde_json::Value| {
            ["netns_exists", "link_exists", "daemon_alive", "listening"]
                .iter()
                .all(|k| v[*k] == true)
        };
        let any = |key: &str| {
            nodes
                .iter()
                .any(|n| n[key].as_array().is_some_and(|a| !a.is_empty()))
        };
        let word = match s {
            None => "down",
            Some(_) if any("split_brain_with") => "split-brain",
            Some(_) if nodes.iter().any(|n| !n["dirty_map_error"].is_null()) => "dirty-map-failing",
            Some(_) if !nodes.iter().all(healthy) => "degraded",
            Some(_) if any("peers_unreachable") => "partitioned",
            // A node resyncing from a partner is shown per node: right
            // after up every node waits for its partners' word once.
            Some(_) => "up",
        };
        let san = s.and_then(|s| SanFile::load(&s.san_file).ok());
        rows.push(serde_json::json!({
            "name": name,
            "state": word,
            "bridge": s.map(|s| &s.bridge),
            "bridge_exists": s.is_some_and(|s| link_exists(&s.bridge)),
            "topology": san.as_ref().map(|f| f.topology),
            "mirror": san.as_ref().map(|f| f.mirror),
            "transport": san.as_ref().map(|f| f.transport),
            "device_capacity_bytes": san.as_ref().map(|f| f.device_capacity_bytes),
            "global_bytes": san.as_ref().and_then(|f| f.address_map().ok()).map(|m| m.capacity_bytes()),
            "authenticated": san.as_ref().map(|f| f.secret_file.is_some()),
            "nodes": nodes,
            "error": state.err(),
        }));
    }
    match a.format {
        SanFormat::Json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&rows).map_err(|e| e.to_string())?
            );
        }
        SanFormat::Table => {
            if rows.is_empty() {
                println!("no SAN under {RUN_DIR}");
            }
            for r in &rows {
                println!(
                    "SAN {}: {} ({} {}{}, global {}{})",
                    r["name"].as_str().unwrap_or("?"),
                    r["state"].as_str().unwrap_or("?"),
                    r["topology"].as_str().unwrap_or("-"),
                    r["transport"].as_str().unwrap_or("-"),
                    if r["mirror"] == true {
                        ", mirrored"
                    } else {
                        ""
                    },
                    r["global_bytes"].as_u64().map_or("-".into(), human),
                    match r["authenticated"].as_bool() {
                        Some(true) => ", frames authenticated",
                        Some(false) => ", frames NOT authenticated (--insecure)",
                        None => "",
                    },
                );
                for n in r["nodes"].as_array().into_iter().flatten() {
                    let yes = |k: &str| if n[k] == true { "yes" } else { "NO" };
                    println!(
                        "  {:<4} {:<16} {:<12} pid {:<8} alive {:<3} listening {:<3} netns {:<3} link {}",
                        n["name"].as_str().unwrap_or("?"),
                        n["netns"].as_str().unwrap_or("?"),
                        n["ip"].as_str().unwrap_or("?"),
                        n["pid"],
                        yes("daemon_alive"),
                        yes("listening"),
                        yes("netns_exists"),
                        yes("link_exists"),
                    );
                    let list = |k: &str| {
                        n[k].as_array()
                            .map(|a| {
                                a.iter()
                                    .filter_map(|v| v.as_str())
                                    .collect::<Vec<_>>()
                                    .join(", ")
                            })
                            .unwrap_or_default()
                    };
                    for x in n["slices"].as_array().into_iter().flatten() {
                        println!(
                            "       slice {:<3} {:<11} {}",
                            x["slice"],
                            x["state"].as_str().unwrap_or("?"),
                            x["detail"].as_str().unwrap_or(""),
                        );
                    }
                    for (key, what) in [
                        ("peers_unreachable", "cannot reach"),
                        ("split_brain_with", "split brain with"),
                        ("resyncing_from", "resyncing from"),
                    ] {
                        let l = list(key);
                        if !l.is_empty() {
                            println!("       {what} {l}");
                        }
                    }
                    if let Some(e) = n["dirty_map_error"].as_str() {
                        println!(
                            "       dirty map cannot be made durable ({e}): writes taken here \
                             alone fail; reads, other writes and peers go on"
                        );
                    }
                    let (forged, replayed) = (
                        n["frames_unauthenticated"].as_u64().unwrap_or(0),
                        n["frames_replayed"].as_u64().unwrap_or(0),
                    );
                    if forged + replayed > 0 {
                        println!(
                            "       dropped {forged} frames without a valid tag, {replayed} replayed"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
