//! The emulator's commands: `moneta serve` (monetad) and `moneta bench`
//! (XDD through libmoneta, on an embedded device or a running daemon).

use crate::error::Error;
use crate::output::{self, Format};
use crate::{parse_op, LimitArgs, ModelArgs};
use clap::Args;
use moneta::bench::{self, BenchSpec, BenchSummary};
use moneta::{CompletionMode, Moneta};
use moneta_emu::control::ControlPlane;
use moneta_emu::daemon::Daemon;
use moneta_emu::dirty::DirtyMap;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_emu::reactor::Reactor;
use moneta_emu::replica_meta::ReplicaMeta;
use moneta_emu::san_file::SanFile;
use moneta_model::config::{Config, Stack};
use moneta_model::summary::workload_point;
use moneta_model::workload::{OpMix, RunLimit, Workload};
use moneta_nbd::{Export, Limits, Listen, NbdServer};
use moneta_wire::FaultHandle;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The socket `moneta serve` and `moneta bench --daemon` use unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/tmp/monetad.sock";

#[derive(Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Unix socket to listen on.
    #[arg(long, default_value = DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The control socket's permission bits, in octal: who may connect
    /// (connecting needs write permission). 0600: the daemon's owner only;
    /// 0660 with --socket-group: that group too; 0666: every local user
    /// (`moneta up` passes it: files on its mount are policed by the kernel).
    #[arg(long, default_value = "0600", value_parser = parse_mode)]
    socket_mode: u32,
    /// The control socket's group (a name or a gid).
    #[arg(long, value_parser = parse_group)]
    socket_group: Option<u32>,
    /// Channels one uid other than root and the daemon's owner may hold.
    #[arg(long, default_value_t = moneta_emu::control::ChannelLimits::default().per_uid)]
    channels_per_uid: usize,
    /// Channels only root and the daemon's owner may take.
    #[arg(long, default_value_t = moneta_emu::control::ChannelLimits::default().reserve)]
    root_channel_reserve: usize,
    /// Control connections at a time [default: the descriptor limit less 64].
    #[arg(long)]
    max_connections: Option<usize>,
    /// Control connections of one uid other than root and the owner.
    #[arg(long, default_value_t = moneta_emu::daemon::ConnectionLimits::default().per_uid)]
    connections_per_uid: usize,
    /// Keep the medium in this image file (created if missing; contents
    /// survive restarts). Default: anonymous memory.
    #[arg(long)]
    image: Option<PathBuf>,
    /// Spin this long without work before the device thread starts napping.
    #[arg(long, default_value_t = 2000)]
    idle_spin_us: u64,
    /// With --san: spin this long idle before napping (a frame or a client
    /// wakes the nap); longer is faster and takes a core per daemon.
    #[arg(long, default_value_t = moneta_emu::engine::SAN_IDLE_SPIN_NS / 1000)]
    san_idle_spin_us: u64,
    /// Fault in this many bytes of the medium at start (benchmarks then do
    /// not measure first-touch page faults).
    #[arg(long, default_value_t = 0, value_parser = moneta_model::units::parse_bytes)]
    populate_bytes: u64,
    /// Post completions up to this far ahead of their model time, so they
    /// reach the client's core by then; the library holds each until its
    /// due time (README "Fidelity"). 0: post at the model time.
    #[arg(long, default_value_t = moneta_emu::engine::DEFAULT_POST_AHEAD_NS)]
    post_ahead_ns: u64,
    /// Run the device thread under SCHED_FIFO, so that a busy host cannot
    /// make it wait for a core (needs root or CAP_SYS_NICE).
    /// While it spins (busy, or idle for --idle-spin-us) ordinary threads
    /// on its core get only what real-time throttling leaves: best with
    /// one daemon per core at most.
    #[arg(long)]
    realtime: bool,
    /// Watch the file system mounted at DIR (the one on this device's
    /// image) for layout changes by any process from the start (`moneta up`
    /// passes its mount).
    #[arg(long)]
    watch_fs: Option<PathBuf>,
    /// A file that carries this device's whole medium from byte 0 besides
    /// the image: the nbdfuse file over this daemon's own NBD export
    /// (`moneta up --kernel-path device` passes it). Files on a loop device
    /// over it are granted the direct path as over the image.
    #[arg(long)]
    image_alias: Option<PathBuf>,
    /// Also serve the device over NBD here: tcp://HOST:PORT or unix:PATH
    /// (repeatable). Clients reach it as nbd://HOST:PORT/NAME or
    /// nbd+unix:///NAME?socket=PATH.
    #[arg(long)]
    nbd: Vec<String>,
    /// An NBD export: NAME (the whole device), NAME:START:LEN (a range;
    /// sizes take K/M/G/T), with :ro for read-only (repeatable). Default:
    /// one export "moneta", the whole device; the empty name selects the
    /// first export.
    #[arg(long)]
    nbd_export: Vec<String>,
    /// How the device signals NBD requests' completions to the reactor
    /// that serves the connections (SPEC §3.5): dma (the status word, read
    /// in the reactor's loop), or forwarding / issue-sleep (the interrupt,
    /// forwarded by the kernel-role thread: one more hop per completion).
    #[arg(long, default_value = "dma")]
    nbd_completion: String,
    /// NBD connections at a time (each holds a device channel), at most
    /// 1007: 16 channels always stay with local clients. A client over the
    /// limit is refused at NBD_OPT_GO (NBD_REP_ERR_POLICY, with a message).
    #[arg(long, default_value_t = 64)]
    nbd_max_connections: usize,
    /// Seconds an NBD client has for its whole negotiation (to GO).
    #[arg(long, default_value_t = 30)]
    nbd_negotiation_timeout_s: u64,
    /// Close an NBD connection with no request (and none unanswered) for
    /// this many seconds (e.g. 300 for a server others reach); 0: never,
    /// the default, because `moneta up --kernel-path device` mounts over
    /// nbdfuse, whose one connection lives as long as the mount and is not
    /// made again.
    #[arg(long, default_value_t = 0)]
    nbd_idle_timeout_s: u64,
    /// Be one node of a QuickSAN: the SAN file lists every node and the
    /// global address map (`moneta san up` writes one; README "QuickSAN
    /// on this machine").
    #[arg(long, requires = "node")]
    san: Option<PathBuf>,
    /// This daemon's node in the SAN file: its name or index.
    #[arg(long, requires = "san")]
    node: Option<String>,
    /// Open the node's link and NBD listeners inside this network
    /// namespace (`ip netns`), wherever the daemon itself runs: how
    /// `moneta serve-group` (`moneta san up`) hosts every node of a
    /// machine in one process.
    #[arg(long)]
    netns: Option<String>,
}

/// `moneta serve-group`: several devices in one daemon, turned by shared
/// reactors (docs: the emulator guide, "Reactors").
#[derive(Args)]
pub struct ServeGroupArgs {
    /// Reactor threads (each turns its share of the devices, round robin).
    /// Default: the cores less one for the clients, at least 1, at most
    /// one per device.
    #[arg(long)]
    reactors: Option<usize>,
    /// Run the reactors under SCHED_FIFO (as `serve --realtime`).
    #[arg(long)]
    realtime: bool,
    /// Files of `moneta serve` arguments, one argument per line, one file
    /// per device (`moneta san up` writes `n<i>/serve.args`).
    #[arg(required = true, value_name = "ARGS_FILE")]
    devices: Vec<PathBuf>,
}

/// One device's `serve` arguments, as read from a file.
#[derive(clap::Parser)]
#[command(name = "serve", no_binary_name = true)]
struct ServeLine {
    #[command(flatten)]
    serve: ServeArgs,
}

fn read_serve_args(path: &Path) -> crate::error::Result<ServeArgs> {
    use clap::Parser;
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::failed_with(path.display().to_string(), e))?;
    let args: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    ServeLine::try_parse_from(args)
        .map(|l| l.serve)
        .map_err(|e| {
            Error::usage(format!(
                "{}: {}",
                path.display(),
                e.render().to_string().trim()
            ))
        })
}

/// Serve every device of `a` in this process; the first to fail stops all.
pub fn serve_group(a: ServeGroupArgs) -> crate::error::Result<()> {
    let devices = a
        .devices
        .iter()
        .map(|p| read_serve_args(p))
        .collect::<Result<Vec<_>, _>>()?;
    let count = match a.reactors {
        Some(0) => return Err(Error::usage("--reactors 0: at least one")),
        Some(n) => n.min(devices.len()),
        None => moneta_emu::reactor::default_count(devices.len()),
    };
    let reactors = (0..count)
        .map(|i| Reactor::start(&format!("moneta-reactor{i}"), a.realtime).map(Arc::new))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::failed_with("starting the reactors", e))?;
    eprintln!(
        "monetad: {} devices on {count} reactor(s) (cores: {})",
        devices.len(),
        moneta_abi::fidelity::cores()
    );
    let results: Vec<crate::error::Result<()>> = std::thread::scope(|scope| {
        let handles: Vec<_> = devices
            .into_iter()
            .enumerate()
            .map(|(i, args)| {
                let reactor = reactors[i % count].clone();
                let file = a.devices[i].display().to_string();
                std::thread::Builder::new()
                    .name(format!("moneta-serve{i}"))
                    .spawn_scoped(scope, move || {
                        let r = serve_on(args, Some(reactor)).map_err(|e| e.context(file));
                        // One device down (or failing to start) stops the group.
                        STOP.store(true, Ordering::Release);
                        r
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h {
                Ok(h) => h
                    .join()
                    .unwrap_or_else(|_| Err(Error::failed("a serving thread panicked"))),
                Err(e) => {
                    STOP.store(true, Ordering::Release);
                    Err(Error::io("starting a serving thread", e))
                }
            })
            .collect()
    });
    // The first failure is the error, its cause kept; the others are
    // named after it.
    let mut errors = results.into_iter().filter_map(Result::err);
    match errors.next() {
        None => Ok(()),
        Some(first) => {
            let others: Vec<String> = errors.map(|e| e.to_string()).collect();
            if others.is_empty() {
                Err(first)
            } else {
                let context = format!("also: {}", others.join("; "));
                Err(Error::with_source(first.kind(), "", first).context(context))
            }
        }
    }
}

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    limit: LimitArgs,
    /// read, write or mixed.
    #[arg(long, default_value = "read")]
    op: String,
    /// Fraction of reads when --op mixed.
    #[arg(long, default_value_t = 0.5)]
    read_fraction: f64,
    /// Request size in bytes (1 B … 1 MiB, any value).
    #[arg(long, default_value_t = 4096, value_parser = moneta_model::units::parse_size)]
    size: u64,
    /// Client threads, each with --qd requests in flight.
    #[arg(long, default_value_t = 1)]
    threads: u32,
    /// Requests each thread keeps in flight (also --queue-depth, as `sim`).
    #[arg(long, visible_alias = "queue-depth", default_value_t = 1)]
    qd: u32,
    /// Sequential instead of random offsets.
    #[arg(long)]
    sequential: bool,
    /// Bytes of the device the threads touch [default: 1 GiB or the whole device if smaller].
    #[arg(long, value_parser = moneta_model::units::parse_size)]
    region_bytes: Option<u64>,
    /// Where the region starts (bytes; on a SAN node, a global address:
    /// another node's slice makes every request remote).
    #[arg(long, default_value_t = 0, value_parser = moneta_model::units::parse_bytes)]
    region_offset: u64,
    /// dma, forwarding or issue-sleep (SPEC §3.5).
    #[arg(long, default_value = "dma")]
    completion: String,
    /// Use the monetad listening on this socket instead of an embedded device.
    #[arg(long)]
    daemon: Option<PathBuf>,
    /// Embedded device: keep the medium in this image file.
    #[arg(long, conflicts_with = "daemon")]
    image: Option<PathBuf>,
    /// Also simulate the same configuration (host stack `raw`: the device
    /// alone, threads × qd closed-loop requesters) and report it as `sim`.
    #[arg(long)]
    compare_sim: bool,
    /// Embedded device: post completions up to this far ahead of their
    /// model time (see `serve --post-ahead-ns`).
    #[arg(long, default_value_t = moneta_emu::engine::DEFAULT_POST_AHEAD_NS, conflicts_with = "daemon")]
    post_ahead_ns: u64,
    /// Run the client threads (and an embedded device's thread) under
    /// SCHED_FIFO, so that a busy host cannot make them wait for a core
    /// (needs root or CAP_SYS_NICE; while they spin, ordinary threads on
    /// their cores get only what the kernel's real-time throttling leaves).
    #[arg(long)]
    realtime: bool,
}

fn medium_for(config: &Config, image: Option<&Path>) -> crate::error::Result<Medium> {
    match image {
        Some(p) => Medium::image(p, config.device.capacity_bytes),
        None => Medium::anonymous(config.device.capacity_bytes),
    }
    .map_err(|e| Error::failed(e.to_string()))
}

static STOP: AtomicBool = AtomicBool::new(false);

/// How long `--watch-fs` waits for its directory to become a mount point.
const MOUNT_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// Whether `dir` is the root of a mounted file system (its device differs
/// from its parent's, or it is `/`).
fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return false;
    };
    match std::fs::metadata(dir.join("..")) {
        Ok(parent) => parent.dev() != meta.dev() || parent.ino() == meta.ino(),
        Err(_) => false,
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Release);
}

pub fn serve(a: ServeArgs) -> crate::error::Result<()> {
    serve_on(a, None)
}

/// Serve one device, on `reactor` or (None) its own.
fn serve_on(a: ServeArgs, reactor: Option<Arc<Reactor>>) -> crate::error::Result<()> {
    // Connections, channels and granted files are descriptors.
    moneta_emu::accept::raise_open_files_limit();
    if let Some(ns) = &a.netns {
        // This thread and those it starts open their sockets there.
        moneta_wire::netns::enter_netns(ns)
            .map_err(|e| Error::failed_with(format!("--netns {ns}"), e))?;
    }
    let config = a.model.device.config()?;
    let san = match (&a.san, &a.node) {
        (Some(path), Some(node)) => Some(san_node(path, node, &config)?),
        _ => None,
    };
    let medium = medium_for(&config, a.image.as_deref())?;
    let options = EngineOptions {
        seed: a.model.seed,
        idle_spin_ns: a.idle_spin_us.saturating_mul(1000),
        san_idle_spin_ns: a.san_idle_spin_us.saturating_mul(1000),
        populate_bytes: a.populate_bytes,
        post_ahead_ns: a.post_ahead_ns,
        realtime: a.realtime,
        ..EngineOptions::default()
    };
    let name = config.name.clone();
    let faults = FaultHandle::new();
    let engine = match &san {
        None => match &reactor {
            Some(r) => Engine::start_on(r, config, medium, options),
            None => Engine::start(config, medium, options),
        },
        Some((_, file, index)) => {
            // What failed mirrors missed is kept beside the image.
            let dirty = match &a.image {
                Some(image) => DirtyMap::load(&image.with_extension("dirty"))
                    .map_err(|e| Error::failed_with("the dirty map beside the image", e))?,
                None => DirtyMap::in_memory(),
            };
            // What the image says of the mirrored copies it holds.
            let slices = file.mirrored_slices(*index).map_err(Error::because)?;
            let meta = match &a.image {
                Some(image) => ReplicaMeta::load(
                    image,
                    config.device.capacity_bytes,
                    &file.name,
                    *index,
                    &slices,
                )
                .map_err(|e| Error::failed_with("the replica metadata on the image", e))?,
                None => ReplicaMeta::in_memory(&file.name, *index, &slices),
            };
            let path = a.san.as_deref().expect("a SAN node has its file");
            let secret = file.secret(path).map_err(Error::because)?;
            if secret.is_none() {
                eprintln!(
                    "monetad: {} names no secret_file: frames carry no MAC, and anyone on \
                     the segment can speak for a node (docs/src/guide/san-wire.md, \"Authenticated frames\")",
                    path.display()
                );
            }
            let port = file
                .open_port(*index, faults.clone(), dirty, meta, secret, 0)
                .map_err(Error::because)?;
            Engine::start_san(config, medium, options, port, reactor.as_ref())
        }
    };
    let engine = Arc::new(engine.map_err(Error::because)?);
    let capacity = engine.address_space_bytes();
    // SAFETY: geteuid has no preconditions.
    let owner = unsafe { libc::geteuid() };
    let plane = Arc::new(ControlPlane::new(engine, owner));
    if san.is_some() {
        plane.set_san_faults(faults);
    }
    if let Some(alias) = &a.image_alias {
        if a.image.is_none() {
            return Err("--image-alias needs --image (the medium it carries)".into());
        }
        plane.set_image_alias(alias.clone());
    }
    if let (Some(image), Some(_)) = (&a.image, &a.watch_fs) {
        // Pending growth ranges are recorded beside the image and settled
        // at the next start on it (crates/moneta-emu/src/growth.rs).
        let mut journal = image.clone().into_os_string();
        journal.push(".growth");
        plane.set_growth_journal(journal.into());
    }
    if let Some(dir) = &a.watch_fs {
        // With the kernel path through NBD (`moneta up --kernel-path
        // device`) the file system is mounted after the daemon starts:
        // watch it once it is there.
        let (plane, dir) = (plane.clone(), dir.clone());
        let watch = move || {
            let deadline = std::time::Instant::now() + MOUNT_WAIT;
            while !is_mount_point(&dir) && std::time::Instant::now() < deadline {
                if STOP.load(Ordering::Acquire) {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if let Err(e) = plane.file_table().watch_file_system(&dir) {
                eprintln!(
                    "monetad: watching {}: {e}; guarded by {} (docs/src/guide/direct-path.md)",
                    dir.display(),
                    plane.file_table().guard()
                );
            }
        };
        if is_mount_point(&a.watch_fs.clone().unwrap_or_default()) {
            watch();
        } else {
            std::thread::Builder::new()
                .name("moneta-watch-fs".into())
                .spawn(watch)
                .map_err(|e| Error::failed_with("starting the file-system watch", e))?;
        }
    }
    let nbd = if a.nbd.is_empty() {
        if !a.nbd_export.is_empty() {
            return Err("--nbd-export needs --nbd (where to listen)".into());
        }
        None
    } else {
        let listen = a
            .nbd
            .iter()
            .map(|l| Listen::parse(l))
            .collect::<Result<Vec<_>, _>>()?;
        let specs = if a.nbd_export.is_empty() {
            vec!["moneta".to_string()]
        } else {
            a.nbd_export.clone()
        };
        let exports = specs
            .iter()
            .map(|s| Export::parse(s, capacity))
            .collect::<Result<Vec<_>, _>>()?;
        let mut server = NbdServer::bind(plane.clone(), exports, &listen)?;
        server.completion = CompletionMode::parse(&a.nbd_completion).ok_or_else(|| {
            format!(
                "--nbd-completion {}: expected dma, forwarding or issue-sleep",
                a.nbd_completion
            )
        })?;
        server.set_limits(Limits {
            max_connections: a.nbd_max_connections,
            negotiation_deadline: Duration::from_secs(a.nbd_negotiation_timeout_s),
            idle_timeout: (a.nbd_idle_timeout_s > 0)
                .then(|| Duration::from_secs(a.nbd_idle_timeout_s)),
        })?;
        Some(server)
    };
    plane
        .set_channel_limits(moneta_emu::control::ChannelLimits {
            per_uid: a.channels_per_uid,
            reserve: a.root_channel_reserve,
        })
        .map_err(Error::because)?;
    let options = moneta_emu::daemon::DaemonOptions {
        socket_mode: a.socket_mode,
        socket_group: a.socket_group,
        limits: moneta_emu::daemon::ConnectionLimits {
            max_connections: a.max_connections,
            per_uid: a.connections_per_uid,
            ..Default::default()
        },
    };
    let daemon = Daemon::bind_with(&a.socket, plane, options).map_err(Error::because)?;
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    eprintln!(
        "monetad: preset {name}, {capacity} bytes on {}, serving {} (uid {owner} may take raw grants); Ctrl-C stops",
        a.image
            .as_deref()
            .map_or("anonymous memory".to_string(), |p| p.display().to_string()),
        daemon.path().display()
    );
    if let Some((role, _, _)) = &san {
        eprintln!("monetad: {role}");
    }
    let served = std::thread::scope(|scope| {
        if let Some(server) = &nbd {
            let l = server.limits();
            eprintln!(
                "monetad: NBD on {} (at most {} connections; negotiation within {:?}; idle ones closed after {})",
                a.nbd.join(", "),
                l.max_connections,
                l.negotiation_deadline,
                l.idle_timeout
                    .map_or("never".to_string(), |t| format!("{t:?}"))
            );
            scope.spawn(|| server.run(&STOP));
        }
        let r = daemon.run(&STOP).map_err(Error::because);
        // Whatever ended the daemon ends the NBD listener too.
        STOP.store(true, Ordering::Release);
        r
    });
    served?;
    eprintln!("monetad: stopping");
    Ok(())
}

/// Check this daemon's place in a SAN file and describe it.
fn san_node(
    path: &Path,
    node: &str,
    config: &Config,
) -> crate::error::Result<(String, SanFile, u16)> {
    let file = SanFile::load(path).map_err(Error::because)?;
    let index = file.node_index(node).map_err(Error::because)?;
    let has_memory = file.has_memory(index);
    if has_memory != config.network.has_memory {
        return Err(format!(
            "{}: node {node} {} an SSD in the SAN file, but preset {} has network.has_memory = {}",
            path.display(),
            if has_memory { "is" } else { "is not" },
            config.name,
            config.network.has_memory
        )
        .into());
    }
    if has_memory && config.device.capacity_bytes != file.device_capacity_bytes {
        return Err(format!(
            "{}: the SAN's SSDs hold {} bytes, this device {}",
            path.display(),
            file.device_capacity_bytes,
            config.device.capacity_bytes
        )
        .into());
    }
    let map = file.address_map().map_err(Error::because)?;
    let owned: Vec<String> = (0..map.capacity_bytes() / map.slice_bytes())
        .flat_map(|s| {
            let base = s * map.slice_bytes();
            let (p, _) = map.primary(base);
            let r = map.replica(base).map(|(r, _)| r);
            [
                (p == index).then(|| format!("primary of global slice {s}")),
                (r == Some(index)).then(|| format!("replica of global slice {s}")),
            ]
        })
        .flatten()
        .collect();
    let role = format!(
        "SAN node {index} ({}) of {}, {:?}{}, {:?} transport, global space {} bytes in slices of {}; holds: {}",
        file.nodes[index as usize].name,
        file.nodes.len(),
        file.topology,
        if file.mirror { ", mirrored" } else { "" },
        file.transport,
        map.capacity_bytes(),
        map.slice_bytes(),
        if owned.is_empty() {
            "nothing (a NIC)".to_string()
        } else {
            owned.join(", ")
        }
    );
    Ok((role, file, index))
}

pub fn run_bench(a: BenchArgs) -> crate::error::Result<()> {
    let mode = CompletionMode::parse(&a.completion).ok_or_else(|| {
        format!(
            "--completion {}: expected dma, forwarding or issue-sleep",
            a.completion
        )
    })?;
    let region = |capacity: u64| a.region_bytes.unwrap_or_else(|| capacity.min(1 << 30));
    let (m, config, target) = match &a.daemon {
        Some(socket) => {
            if a.model.device.given() {
                return Err("--preset, --config, --stack, --tech and --set describe an embedded device; a daemon has its own (moneta serve --preset …)".into());
            }
            let m = Moneta::connect(socket).map_err(Error::because)?;
            let config: Config = serde_json::from_value(m.info().config.clone())
                .map_err(|e| Error::failed_with("the daemon's configuration", e))?;
            (m, config, socket.display().to_string())
        }
        None => {
            let config = a.model.device.config()?;
            let medium = medium_for(&config, a.image.as_deref())?;
            let options = EngineOptions {
                seed: a.model.seed,
                populate_bytes: region(config.device.capacity_bytes),
                post_ahead_ns: a.post_ahead_ns,
                realtime: a.realtime,
                ..EngineOptions::default()
            };
            let m = moneta::embedded(config.clone(), medium, options).map_err(Error::because)?;
            (m, config, "embedded".to_string())
        }
    };
    let mix = match parse_op(&a.op)? {
        OpMix::Mixed(_) => OpMix::Mixed(a.read_fraction),
        other => other,
    };
    let region = region(m.capacity_bytes().saturating_sub(a.region_offset));
    // The limit is in real time here (or a request count).
    let limit = a.limit.limit(0)?;
    crate::warn_if_threads_exceed_ops(a.threads.into(), a.qd, limit);
    warn_if_threads_exceed_cores(a.threads);
    let (ops, duration_ns) = match limit {
        RunLimit::Ops(0) => (None, 2_000_000_000),
        RunLimit::Ops(n) => (Some(n), u64::MAX),
        RunLimit::DurationNs(ns) => (None, ns),
    };
    let mut workload = Workload::xdd(
        mix,
        a.size,
        a.threads,
        region,
        RunLimit::Ops(1),
        a.model.seed,
    );
    workload.groups[0].random = !a.sequential;
    workload.groups[0].region_offset_bytes = a.region_offset;
    let spec = BenchSpec {
        group: workload.groups[0].clone(),
        queue_depth: a.qd,
        ops,
        duration_ns,
        mode,
        seed: a.model.seed,
        realtime: a.realtime,
        // Ctrl-C ends the run early; what it measured is printed.
        cancelled: Some(moneta_supervisor::signals::signal_received),
    };
    moneta_supervisor::signals::catch_signals();
    m.grant_raw(a.region_offset, region, mix != OpMix::Read)
        .map_err(|e| format!("{e} (raw grants need the daemon's owner)"))?;
    let before = m.stats().map_err(Error::because)?;
    let result = bench::run(&m, &spec).map_err(Error::because)?;
    let device = m.stats().map_err(Error::because)?;
    let mut summary = BenchSummary::new(&config.name, &target, &spec, &result, &m, &before, device);
    if a.compare_sim {
        let mut sim_config = config.clone();
        sim_config.set_stack(Stack::Raw);
        let mut w = workload.clone();
        w.groups[0].threads = a.threads * a.qd;
        w.limit = RunLimit::Ops(result.ops.max(1));
        summary.compare_with(workload_point(&sim_config, &w)?);
    }
    if !summary.faithful
        && !a.realtime
        && summary.fidelity.runnable_threads_mean > summary.fidelity.cores as f64
    {
        eprintln!(
            "moneta: hint: --realtime runs the benchmark's threads under SCHED_FIFO, so that \
             the host's other threads cannot make them wait for a core"
        );
    }
    print_bench(&summary, a.model.format)?;
    if moneta_supervisor::signals::signal_received() {
        return Err(Error::interrupted(format!(
            "interrupted: stopped after {} requests; the results above are theirs",
            result.ops
        )));
    }
    Ok(())
}

/// Warn (stderr) when the client threads and the device thread (embedded,
/// or monetad's on this machine) outnumber the cores: a thread then waits
/// for a core, and the measured latencies include that wait.
fn warn_if_threads_exceed_cores(client_threads: u32) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if client_threads as usize + 1 > cores {
        eprintln!(
            "moneta: warning: {client_threads} client threads + 1 device thread > {cores} cores: \
             threads wait for a core, and the latencies include the wait"
        );
    }
}

/// An emulator run's provenance: its seed, requests and verdict.
fn bench_provenance(s: &BenchSummary) -> crate::provenance::Provenance {
    crate::provenance::Provenance::here()
        .seed(s.seed)
        .requests_per_point(s.ops)
        .verdict(&s.verdict)
}

fn print_bench(s: &BenchSummary, format: Format) -> crate::error::Result<()> {
    if !s.faithful {
        // On stderr whatever the format: the numbers are the host's, not
        // the modeled device's.
        eprintln!("moneta: warning: {}", s.verdict);
    }
    match format {
        Format::Json => Ok(output::print_result_json(s, &bench_provenance(s))?),
        Format::Csv => Ok(output::print_result_csv(
            std::slice::from_ref(s),
            &bench_provenance(s),
        )?),
        Format::Table => {
            println!(
                "emulator: preset {}  {}  {} {} B  threads {}  qd {}  completion {}  seed {}",
                s.preset,
                s.target,
                s.op,
                s.size_bytes,
                s.threads,
                s.queue_depth,
                s.completion,
                s.seed
            );
            println!(
                "{:<10} {:>10} {:>11} {:>9} {:>9} {:>9} {:>9} {:>9}",
                "", "MB/s", "IOPS", "mean µs", "p50 µs", "p99 µs", "p99.9 µs", "max µs"
            );
            let row = |label: &str, numbers: [f64; 7]| {
                let [bandwidth, iops, mean, p50, p99, p99_9, max] = numbers;
                println!(
                    "{label:<10} {bandwidth:>10.1} {iops:>11.0} {mean:>9.3} {p50:>9.3} {p99:>9.3} {p99_9:>9.3} {max:>9.3}"
                );
            };
            row(
                "measured",
                [
                    s.bandwidth_mb_per_s,
                    s.iops,
                    s.latency_us_mean,
                    s.latency_us_p50,
                    s.latency_us_p99,
                    s.latency_us_p99_9,
                    s.latency_us_max,
                ],
            );
            if let Some(p) = &s.sim {
                row(
                    "simulated",
                    [
                        p.bandwidth_mb_per_s,
                        p.iops,
                        p.latency_us_mean,
                        p.latency_us_p50,
                        p.latency_us_p99,
                        p.latency_us_p99_9,
                        p.latency_us_max,
                    ],
                );
            }
            let d = &s.device;
            println!(
                "{} requests in {:.2} s; completions posted {:.0} ns after their model time on average (p99 {:.0} ns); protection lookups {:.1} steps = {:.0} ns",
                s.ops,
                s.elapsed_ns as f64 / 1e9,
                d.lateness_ns_mean,
                d.lateness_ns_p99,
                d.lookup_steps_mean,
                d.lookup_ns_mean
            );
            println!("where time goes (mean µs; sums to the measured mean):");
            for (span, us) in &s.breakdown_us {
                println!("  {span:<36} {us:>9.3}");
            }
            let f = &s.fidelity;
            println!(
                "verdict: {} (seen {:.2} µs after the model time: mean, p50 {:.2}, p99 {:.2}; \
                 {:.1} runnable threads on {} cores)",
                s.verdict,
                f.behind_us_mean,
                f.behind_us_p50,
                f.behind_us_p99,
                f.runnable_threads_mean,
                f.cores
            );
            Ok(())
        }
    }
}

#[derive(Args)]
pub struct StatsArgs {
    /// The daemon's socket [default: the --mount's daemon, else /tmp/monetad.sock].
    #[arg(long, conflicts_with = "mount")]
    daemon: Option<PathBuf>,
    /// The daemon of the `moneta up` mount at this directory.
    #[arg(long)]
    mount: Option<PathBuf>,
    /// Also one run's clients' counters (`client`): the MONETA_RUN_ID their
    /// connections gave (`moneta run` prints its run id).
    #[arg(long, conflicts_with = "channel")]
    run: Option<String>,
    /// Also one open channel's counters (the daemon's owner: any channel).
    #[arg(long)]
    channel: Option<u16>,
    /// Every counter as JSON instead of the summary.
    #[arg(long)]
    json: bool,
}

/// `moneta stats`: a summary of the daemon's counters, its first line the
/// device's totals and verdict (so `moneta stats | head -1` says something);
/// `--json` prints every counter (with `client` for --run or --channel).
pub fn stats(a: StatsArgs) -> crate::error::Result<()> {
    let socket = match (&a.daemon, &a.mount) {
        (Some(d), _) => d.clone(),
        (None, Some(mount)) => crate::mount::running(mount)?.0,
        (None, None) => PathBuf::from(DEFAULT_SOCKET),
    };
    let m = Moneta::connect(&socket)
        .map_err(|e| Error::failed_with(socket.display().to_string(), e))?;
    let s = m
        .stats_of(a.run.as_deref(), a.channel)
        .map_err(Error::because)?;
    if a.json {
        crate::output::print_json(&s)?;
    } else {
        crate::output::print_text(&stats_summary(&socket, &s))?;
    }
    Ok(())
}

/// What `moneta stats` prints without `--json`: the totals and the verdict
/// on the first line, then what needs a look (refusals, stalls, a SAN
/// port, the client asked about).
fn stats_summary(socket: &Path, s: &moneta_abi::stats::EngineStats) -> String {
    use moneta_model::units::{format_size, IEC_UNITS};
    let bytes = |b: u64| format_size(b as f64, false, &IEC_UNITS);
    let verdict = if s.verdict.is_empty() {
        "no verdict before the first request".to_string()
    } else {
        s.verdict.clone()
    };
    let mut out = format!(
        "monetad {}: {} requests ({} read, {} written), {} channels open; {verdict}\n",
        socket.display(),
        s.requests_completed,
        bytes(s.bytes_read),
        bytes(s.bytes_written),
        s.channels_open,
    );
    let refused: u64 = s.errors.values().sum();
    if refused > 0 {
        let codes: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        out += &format!("refused: {refused} ({})\n", codes.join(", "));
    }
    out += &format!(
        "completions after their model time: mean {:.0} ns, p99 {:.0} ns, max {} ns\n",
        s.lateness_ns_mean, s.lateness_ns_p99, s.lateness_ns_max
    );
    out += &format!(
        "permission records in use: {}; files open: {}, inodes held: {}\n",
        s.permission_records_in_use, s.files.files_open, s.files.inodes_held
    );
    if s.retag_stalls + s.error_queue_stalls + s.held > 0 {
        out += &format!(
            "stalls: {} waiting for a tag, {} on an error queue, {} held for a failover\n",
            s.retag_stalls, s.error_queue_stalls, s.held
        );
    }
    if let Some(p) = &s.san {
        out += &format!(
            "SAN port of node {}: {} packets sent, {} received, {} dropped, {} peer failures\n",
            p.node, p.packets_sent, p.packets_received, p.packets_dropped, p.peer_failures
        );
    }
    if let Some(c) = &s.client {
        let t = c.total();
        out += &format!(
            "client{}: {} requests ({} read, {} written), {} refused, {} of {} connections open; {}\n",
            c.run.as_deref().map(|r| format!(" run {r}")).unwrap_or_default(),
            t.requests,
            bytes(c.read.bytes),
            bytes(c.write.bytes),
            c.refused,
            c.open,
            c.connections,
            c.verdict
        );
    }
    out + "(moneta stats --json: every counter)"
}

#[derive(Args)]
pub struct RunArgs {
    /// The Moneta mount (from `moneta up`).
    #[arg(long, default_value = "/mnt/moneta")]
    mount: PathBuf,
    /// Also write the run's report as JSON here.
    #[arg(long)]
    report: Option<PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    command: Vec<String>,
}

/// The child `moneta run` waits for: signals sent to `moneta run` by
/// another process are passed on to it.
static CHILD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn forward_signal(sig: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let code = unsafe { (*info).si_code };
    // A terminal's signal (SI_KERNEL) reached the child's process group
    // too: passing it on would deliver it twice.
    let child = CHILD.load(Ordering::Acquire);
    if code != libc::SI_KERNEL && child > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe { libc::kill(child, sig) };
    }
}

fn forward_signals() {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        // SAFETY: a zeroed sigaction with a handler that only calls
        // async-signal-safe functions.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = forward_signal as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
    }
}

/// A private directory for the shim's reports, removed on drop.
/// The shim reports' directory, and whether this run made it (and removes it).
struct ReportDir(PathBuf, bool);

impl ReportDir {
    fn create() -> crate::error::Result<ReportDir> {
        let template = std::env::temp_dir().join("moneta-run-XXXXXX");
        let mut bytes = std::ffi::CString::new(template.as_os_str().as_encoded_bytes())
            .map_err(|e| {
                Error::with_source(
                    crate::error::ErrorKind::Failed,
                    "the temporary directory's name",
                    e,
                )
            })?
            .into_bytes_with_nul();
        // SAFETY: mkdtemp rewrites the NUL-terminated template in place
        // (mode 0700).
        let made = unsafe { libc::mkdtemp(bytes.as_mut_ptr().cast()) };
        if made.is_null() {
            return Err(Error::io(
                "creating the report directory",
                std::io::Error::last_os_error(),
            ));
        }
        bytes.pop();
        Ok(ReportDir(
            PathBuf::from(String::from_utf8(bytes).map_err(|e| {
                Error::with_source(
                    crate::error::ErrorKind::Failed,
                    "the report directory's name",
                    e,
                )
            })?),
            true,
        ))
    }
}

impl Drop for ReportDir {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Flush the file system at `mount` (so the loop device's counters hold
/// what the kernel had cached).
fn syncfs(mount: &Path) {
    if let Ok(f) = std::fs::File::open(mount) {
        // SAFETY: syncfs(2) on a descriptor this function owns.
        unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&f)) };
    }
}

/// `moneta run -- CMD ARGS`: run CMD with the shim preloaded and pointed at
/// the mount's daemon (the shim sits next to this binary), pass signals on,
/// report what it did at its exit (crate::run_report) and exit with its
/// status (128 + the signal that killed it).
pub fn run_program(a: RunArgs) -> crate::error::Result<()> {
    use std::os::unix::process::ExitStatusExt;
    let (socket, mount) = crate::mount::running(&a.mount)?;
    let exe = std::env::current_exe().map_err(|e| Error::failed_with("locating moneta", e))?;
    let shim = exe.with_file_name("libmoneta_preload.so");
    if !shim.exists() {
        return Err(format!(
            "{} is missing (cargo build --release builds it)",
            shim.display()
        )
        .into());
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(other) if !other.is_empty() => format!("{}:{other}", shim.display()),
        _ => shim.display().to_string(),
    };
    let started = std::time::Instant::now();
    let run_id = format!(
        "run-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    // A caller's own MONETA_RUN_REPORT_DIR is kept (and read); else a
    // private one for this run.
    let dir = match std::env::var_os("MONETA_RUN_REPORT_DIR").filter(|d| !d.is_empty()) {
        Some(d) => ReportDir(PathBuf::from(d), false),
        None => ReportDir::create()?,
    };
    let loop_device = crate::mount::loop_device_of(&mount);
    // What monetad settles (growth grants written through the kernel)
    // shows on the loop device but is no IO of the program's.
    let settled = || {
        Moneta::connect(&socket)
            .and_then(|m| m.stats())
            .map(|s| s.files.growth_settled_bytes)
            .ok()
    };
    let settled_before = settled();
    syncfs(&mount);
    let block_before = loop_device
        .as_deref()
        .and_then(crate::run_report::BlockStat::read);
    forward_signals();
    let mut child = std::process::Command::new(&a.command[0])
        .args(&a.command[1..])
        .env("LD_PRELOAD", preload)
        .env("MONETA_SOCKET", &socket)
        .env("MONETA_MOUNT", &mount)
        .env(moneta::RUN_ID_ENV, &run_id)
        .env("MONETA_RUN_REPORT_DIR", &dir.0)
        .spawn()
        .map_err(|e| Error::failed_with(format!("running {}", a.command[0]), e))?;
    CHILD.store(child.id() as i32, Ordering::Release);
    let status = child
        .wait()
        .map_err(|e| Error::failed_with(format!("waiting for {}", a.command[0]), e))?;
    CHILD.store(0, Ordering::Release);
    let exit_status = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    let elapsed_s = started.elapsed().as_secs_f64();
    syncfs(&mount);
    let kernel_block = match (loop_device.as_deref(), block_before) {
        (Some(dev), Some(before)) => {
            crate::run_report::BlockStat::read(dev).map(|after| after.since(&before))
        }
        _ => None,
    };
    let settled_bytes = match (settled_before, settled()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let device = Moneta::connect(&socket)
        .and_then(|m| m.stats_of(Some(&run_id), None))
        .map(|s| s.client.unwrap_or_default());
    let (device, mut problems) = match device {
        Ok(d) => (d, Vec::new()),
        Err(e) => (
            moneta_abi::stats::ClientStats::default(),
            vec![format!("the daemon's counters for the run: {e}")],
        ),
    };
    let (reports, more) = crate::run_report::read_shim_reports(&dir.0);
    problems.extend(more);
    let report = crate::run_report::build(crate::run_report::Inputs {
        run_id: &run_id,
        command: &a.command,
        mount: &mount,
        exit_status,
        elapsed_s,
        child_pid: child.id(),
        device,
        reports,
        problems,
        loop_device,
        kernel_block,
        settled_bytes,
    });
    eprintln!("{}", crate::run_report::render(&report));
    if let Some(path) = &a.report {
        let text = crate::output::result_json(&report, &crate::provenance::Provenance::here())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| Error::failed_with(path.display().to_string(), e))?;
    }
    drop(dir);
    std::process::exit(exit_status);
}

/// `--socket-mode`: permission bits in octal (`0660`, `660`).
fn parse_mode(s: &str) -> crate::error::Result<u32> {
    u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .ok()
        .filter(|m| m & !0o777 == 0)
        .ok_or_else(|| {
            Error::usage(format!(
                "{s}: expected permission bits in octal, 0 ..= 0777"
            ))
        })
}

/// `--socket-group`: a group name or a numeric gid.
fn parse_group(s: &str) -> crate::error::Result<u32> {
    if let Ok(gid) = s.parse::<u32>() {
        return Ok(gid);
    }
    let name =
        std::ffi::CString::new(s).map_err(|_| Error::usage(format!("{s}: not a group name")))?;
    // SAFETY: a NUL-terminated name; the result is read at once, before
    // any other getgr* call on this thread.
    let group = unsafe { libc::getgrnam(name.as_ptr()) };
    if group.is_null() {
        return Err(Error::usage(format!("{s}: no such group")));
    }
    // SAFETY: getgrnam returned a valid entry.
    Ok(unsafe { (*group).gr_gid })
}
