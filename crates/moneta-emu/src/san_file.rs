//! The SAN file: which monetad processes form one QuickSAN and how the
//! global address space maps onto them (SPEC §4.1 "configuration utility",
//! §4.3 mirroring; issue 12 item 3).
//!
//! Every node of a SAN reads the same file, so every device installs the
//! same global map and the same MAC table, as the paper's configuration
//! utility programs identical tables into every device. The map itself is
//! the model's [`AddressMap`] (one slice per SSD, SSD i mirroring SSD i−1),
//! so the emulated SAN and the simulated one route an address alike.
//!
//! ```toml
//! topology = "distributed"     # or "centralized": node 0 is the server, the rest NICs
//! mirror = true
//! transport = "ethernet"       # raw frames; or "udp"
//! ethertype = 0x8870
//! device_capacity_bytes = 1073741824
//!
//! [[node]]
//! name = "n0"
//! mac = "02:4d:4f:00:00:00"
//! interface = "eth0"
//! udp = "10.77.0.1:7700"
//! socket = "/run/moneta/san-san/n0/monetad.sock"
//! ```
//!
//! A node's index is its position in the file (the INDEX field of Table
//! A.3). Parsing never panics; every error names the field and the allowed
//! values.

use crate::dirty::DirtyMap;
use crate::engine::SanPort;
use crate::replica_meta::ReplicaMeta;
use moneta_model::device::network::RouteTable;
use moneta_model::device::packet::Mac;
use moneta_model::san::address_map::AddressMap;
use moneta_wire::auth::Secret;
use moneta_wire::link::LinkSpec;
use moneta_wire::{Endpoint, FaultHandle, Faulty, WireConfig};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// The least retransmission timeout of a daemon's endpoint. A peer's
/// device thread may be napping (`engine::SAN_MAX_NAP_NS`) or waiting for
/// a core when a frame comes, so below about a millisecond most
/// retransmissions are spurious on a shared machine: two nodes, remote
/// 4 KB reads, 200 µs → 1 ms: retransmissions 4,348 → 898 per 6,000
/// requests, median 109 → 92 µs, 64 KB QD 8 130 → 240 MB/s (README).
pub const DAEMON_MIN_RTO_NS: u64 = 1_000_000;

/// QuickSAN's EtherType (Table A.3), the default for raw frames.
pub const DEFAULT_ETHERTYPE: u16 = 0x8870;
/// The INDEX field of Table A.3 has 12 bits.
pub const MAX_NODES: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SanTopology {
    /// Every node holds an SSD; together one global space.
    Distributed,
    /// Node 0 holds the SSD (the storage server); the others hold QuickSAN
    /// NICs (no memory) and reach it over the network.
    Centralized,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Raw Ethernet frames (AF_PACKET) with the SAN's EtherType.
    Ethernet,
    /// UDP datagrams, for networks that will not carry raw frames.
    Udp,
}

/// A node and the device address there: where one global byte lives.
pub type Holder = (u16, u64);

/// One monetad of the SAN.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SanNode {
    pub name: String,
    /// The MAC its frames carry, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// The interface its raw frames leave by (transport "ethernet").
    #[serde(default)]
    pub interface: Option<String>,
    /// Its UDP endpoint (transport "udp"; also where the others send).
    #[serde(default)]
    pub udp: Option<String>,
    /// Its control socket, where clients on its host attach.
    #[serde(default)]
    pub socket: Option<PathBuf>,
}

/// A parsed and checked SAN file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SanFile {
    /// The SAN's name (`moneta san up --name`): every copy's replica
    /// metadata names it (`replica_meta`), so an image of another SAN is
    /// foreign here.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub topology: SanTopology,
    #[serde(default)]
    pub mirror: bool,
    pub transport: Transport,
    #[serde(default = "default_ethertype")]
    pub ethertype: u16,
    /// Every SSD's capacity (a power of two: the routing registers select a
    /// slice by the upper address bits).
    pub device_capacity_bytes: u64,
    /// The SAN's shared secret (`moneta_wire::auth`): a file of 64 hex
    /// digits, readable by its owner only, on every host; a relative path
    /// is relative to the SAN file. Without it frames carry no MAC and
    /// anyone on the segment can speak for a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    #[serde(rename = "node", default)]
    pub nodes: Vec<SanNode>,
}

fn default_ethertype() -> u16 {
    DEFAULT_ETHERTYPE
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SanFileError(pub String);

impl fmt::Display for SanFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SanFileError {}

fn err<T>(msg: impl Into<String>) -> Result<T, SanFileError> {
    Err(SanFileError(msg.into()))
}

/// Parse `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Result<Mac, SanFileError> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return err(format!(
            "MAC '{s}': expected six hex bytes aa:bb:cc:dd:ee:ff"
        ));
    }
    let mut mac = [0u8; 6];
    for (byte, part) in mac.iter_mut().zip(&parts) {
        if part.len() != 2 {
            return err(format!(
                "MAC '{s}': expected six hex bytes aa:bb:cc:dd:ee:ff"
            ));
        }
        *byte = u8::from_str_radix(part, 16)
            .map_err(|_| SanFileError(format!("MAC '{s}': '{part}' is not a hex byte")))?;
    }
    Ok(Mac(mac))
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(mac: Mac) -> String {
    mac.0
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

impl SanFile {
    pub fn parse(text: &str) -> Result<SanFile, SanFileError> {
        let file: SanFile = toml::from_str(text).map_err(|e| {
            SanFileError(format!(
                "{} (topology: distributed|centralized; transport: ethernet|udp)",
                e.to_string().trim()
            ))
        })?;
        file.check()?;
        Ok(file)
    }

    pub fn load(path: &Path) -> Result<SanFile, SanFileError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| SanFileError(format!("{}: {e}", path.display())))?;
        SanFile::parse(&text).map_err(|e| SanFileError(format!("{}: {e}", path.display())))
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a SanFile serializes")
    }

    fn check(&self) -> Result<(), SanFileError> {
        let n = self.nodes.len();
        if n == 0 {
            return err("a SAN needs at least one [[node]]");
        }
        if n > MAX_NODES {
            return err(format!(
                "{n} nodes: the MAC table (Table A.3's INDEX) holds at most {MAX_NODES}"
            ));
        }
        if self.ethertype < 0x0600 {
            return err(format!(
                "ethertype {:#06x} is a length, not a type: use 0x0600 or more (default {DEFAULT_ETHERTYPE:#06x})",
                self.ethertype
            ));
        }
        let mut names = HashSet::new();
        let mut macs = HashSet::new();
        let mut udps = HashSet::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let at = format!("node {i} ('{}')", node.name);
            if node.name.is_empty() || !names.insert(node.name.as_str()) {
                return err(format!("{at}: names must be unique and non-empty"));
            }
            let mac = parse_mac(&node.mac).map_err(|e| SanFileError(format!("{at}: {e}")))?;
            if mac.0[0] & 1 == 1 {
                return err(format!("{at}: {} is a multicast MAC", node.mac));
            }
            if !macs.insert(mac.0) {
                return err(format!("{at}: MAC {} is used twice", node.mac));
            }
            match self.transport {
                Transport::Ethernet => {
                    if node.interface.as_deref().is_none_or(str::is_empty) {
                        return err(format!("{at}: transport ethernet needs interface = \"…\""));
                    }
                }
                Transport::Udp => {
                    let Some(udp) = &node.udp else {
                        return err(format!("{at}: transport udp needs udp = \"HOST:PORT\""));
                    };
                    let addr: SocketAddr = udp.parse().map_err(|_| {
                        SanFileError(format!("{at}: udp '{udp}' is not an IP:PORT address"))
                    })?;
                    if !udps.insert(addr) {
                        return err(format!("{at}: udp {udp} is used twice"));
                    }
                }
            }
        }
        self.address_map().map(drop)
    }

    /// The nodes that hold an SSD, in slice order.
    pub fn ssd_nodes(&self) -> Vec<u16> {
        match self.topology {
            SanTopology::Distributed => (0..self.nodes.len() as u16).collect(),
            SanTopology::Centralized => vec![0],
        }
    }

    pub fn has_memory(&self, node: u16) -> bool {
        self.ssd_nodes().contains(&node)
    }

    /// The global map every device installs.
    pub fn address_map(&self) -> Result<AddressMap, SanFileError> {
        AddressMap::new(&self.ssd_nodes(), self.device_capacity_bytes, self.mirror)
            .map_err(|e| SanFileError(e.to_string()))
    }

    /// Node `node`'s routing registers and replica choice.
    pub fn route_table(&self, node: u16) -> Result<RouteTable, SanFileError> {
        if node as usize >= self.nodes.len() {
            return err(format!(
                "node {node}: the SAN has nodes 0..={}",
                self.nodes.len() - 1
            ));
        }
        Ok(self.address_map()?.route_table(node, self.has_memory(node)))
    }

    /// The slices node `node` holds a mirrored copy of (primary or replica):
    /// the copies its replica metadata describes.
    pub fn mirrored_slices(&self, node: u16) -> Result<Vec<u32>, SanFileError> {
        let routes = self.route_table(node)?;
        Ok((0..routes.slice_count())
            .filter(|&s| routes.partner_of(s).is_some())
            .map(|s| s as u32)
            .collect())
    }

    /// The index of the node called `name`, or whose index `name` spells.
    pub fn node_index(&self, name: &str) -> Result<u16, SanFileError> {
        if let Some(i) = self.nodes.iter().position(|n| n.name == name) {
            return Ok(i as u16);
        }
        match name.parse::<usize>() {
            Ok(i) if i < self.nodes.len() => Ok(i as u16),
            _ => err(format!(
                "no node '{name}' in the SAN file (nodes: {})",
                self.nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// The link of node `node` to every other node, as the file names them.
    pub fn link(&self, node: u16) -> Result<LinkSpec, SanFileError> {
        let me = self
            .nodes
            .get(node as usize)
            .ok_or_else(|| SanFileError(format!("node {node}: no such node")))?;
        let others = (0..self.nodes.len() as u16).filter(|&j| j != node);
        Ok(match self.transport {
            Transport::Ethernet => LinkSpec::Packet {
                interface: me.interface.clone().unwrap_or_default(),
                ethertype: self.ethertype,
                peers: others
                    .map(|j| Ok((j, parse_mac(&self.nodes[j as usize].mac)?)))
                    .collect::<Result<_, SanFileError>>()?,
            },
            Transport::Udp => {
                let addr = |j: u16| -> Result<SocketAddr, SanFileError> {
                    let udp = self.nodes[j as usize].udp.as_deref().unwrap_or_default();
                    udp.parse()
                        .map_err(|_| SanFileError(format!("node {j}: udp '{udp}'")))
                };
                LinkSpec::Udp {
                    bind: addr(node)?,
                    peers: others
                        .map(|j| Ok((j, addr(j)?)))
                        .collect::<Result<_, SanFileError>>()?,
                }
            }
        })
    }

    /// The SAN's secret, if the file names one (`path`: the SAN file's,
    /// for a relative `secret_file`).
    pub fn secret(&self, path: &Path) -> Result<Option<Secret>, SanFileError> {
        let Some(f) = &self.secret_file else {
            return Ok(None);
        };
        let f = path.parent().unwrap_or(Path::new(".")).join(f);
        Secret::load(&f)
            .map(Some)
            .map_err(|e| SanFileError(format!("secret_file: {e}")))
    }

    /// Open node `node`'s port: its link (with `faults` injected, for
    /// `moneta san fault`), the endpoint on it (its frames tagged under
    /// `secret`), and the routing tables. `dirty` is where the node keeps
    /// what failed mirrors missed.
    pub fn open_port(
        &self,
        node: u16,
        faults: FaultHandle,
        dirty: DirtyMap,
        meta: ReplicaMeta,
        secret: Option<Secret>,
        now_ns: u64,
    ) -> Result<SanPort, SanFileError> {
        let link = self.link(node)?;
        let transport = link
            .open(node)
            .map_err(|e| SanFileError(format!("node {node}: opening its link: {e}")))?;
        let port = PortParts {
            dirty,
            meta,
            secret,
            epoch: None,
        };
        self.port_on(node, transport, faults, port, now_ns)
    }

    /// Node `node`'s port on `transport` (a real link: `open_port`; the
    /// in-memory wire: the replica protocol's simulator, `san_sim`), with
    /// `faults` injected, under `parts`'s secret and epoch.
    pub fn port_on(
        &self,
        node: u16,
        transport: Box<dyn moneta_wire::Transport + Send>,
        faults: FaultHandle,
        parts: PortParts,
        now_ns: u64,
    ) -> Result<SanPort, SanFileError> {
        let routes = self.route_table(node)?;
        let peers: Vec<u16> = (0..self.nodes.len() as u16)
            .filter(|&j| j != node)
            .collect();
        let transport: Box<dyn moneta_wire::Transport + Send> =
            Box::new(Faulty::new(transport, faults, 0x5A4E ^ u64::from(node)));
        let mut config = WireConfig::new(node, &peers);
        config.rto_ns = DAEMON_MIN_RTO_NS;
        config.secret = parts.secret;
        config.initial_epoch = parts.epoch;
        let endpoint = Endpoint::new(transport, config, now_ns)
            .map_err(|e| SanFileError(format!("node {node}: its endpoint: {e}")))?;
        Ok(SanPort {
            routes,
            endpoint,
            nodes: self.nodes.len() as u16,
            dirty: parts.dirty,
            meta: parts.meta,
        })
    }

    /// Who holds global byte `addr`: the primary and, if mirrored, the
    /// replica. None past the global space.
    pub fn owners(&self, addr: u64) -> Option<(Holder, Option<Holder>)> {
        let map = self.address_map().ok()?;
        (addr < map.capacity_bytes()).then(|| (map.primary(addr), map.replica(addr)))
    }
}

/// What a node's port is made of besides its link: the dirty map and
/// replica metadata of its medium, the SAN's secret, and the wire epoch of
/// this incarnation (None: from the real-time clock).
pub struct PortParts {
    pub dirty: DirtyMap,
    pub meta: ReplicaMeta,
    pub secret: Option<Secret>,
    pub epoch: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(nodes: usize, topology: &str, mirror: bool, transport: &str) -> String {
        let mut s = format!(
            "topology = \"{topology}\"\nmirror = {mirror}\ntransport = \"{transport}\"\n\
             device_capacity_bytes = 1048576\n"
        );
        for i in 0..nodes {
            s += &format!(
                "[[node]]\nname = \"n{i}\"\nmac = \"02:4d:4f:00:00:{i:02x}\"\n\
                 interface = \"eth0\"\nudp = \"10.77.0.{}:7700\"\n",
                i + 1
            );
        }
        s
    }

    #[test]
    fn a_mirrored_distributed_san_maps_every_byte_to_two_nodes() {
        let f = SanFile::parse(&file(3, "distributed", true, "ethernet")).unwrap();
        let map = f.address_map().unwrap();
        assert_eq!(map.capacity_bytes(), 3 * 512 * 1024);
        for addr in (0..map.capacity_bytes()).step_by(4096) {
            let ((p, _), r) = f.owners(addr).unwrap();
            let (r, _) = r.expect("mirrored");
            assert_ne!(p, r, "primary and replica of {addr} on one node");
        }
        assert!(f.owners(map.capacity_bytes()).is_none());
        assert_eq!(f.node_index("n2").unwrap(), 2);
        assert_eq!(f.node_index("1").unwrap(), 1);
        assert!(f.node_index("n9").is_err());
        // The file round-trips.
        assert_eq!(SanFile::parse(&f.to_toml()).unwrap(), f);
    }

    #[test]
    fn centralized_has_one_ssd_and_cannot_mirror() {
        let f = SanFile::parse(&file(3, "centralized", false, "udp")).unwrap();
        assert_eq!(f.ssd_nodes(), vec![0]);
        assert!(f.has_memory(0) && !f.has_memory(2));
        let e = SanFile::parse(&file(3, "centralized", true, "udp")).unwrap_err();
        assert!(e.0.contains("mirroring"), "{e}");
    }

    #[test]
    fn bad_files_are_errors_that_say_what_is_wrong() {
        let cases = [
            (file(0, "distributed", false, "udp"), "at least one"),
            (file(2, "ring", false, "udp"), "distributed|centralized"),
            (
                file(2, "distributed", false, "carrier-pigeon"),
                "ethernet|udp",
            ),
            (
                file(2, "distributed", false, "udp").replace("00:01", "00:00"),
                "used twice",
            ),
            (
                file(2, "distributed", false, "udp").replace("10.77.0.2:7700", "nowhere"),
                "IP:PORT",
            ),
            (
                file(2, "distributed", false, "udp").replace("1048576", "1000000"),
                "power of two",
            ),
            (
                file(2, "distributed", false, "udp").replace("\"02:4d", "\"03:4d"),
                "multicast",
            ),
            (
                file(2, "distributed", false, "udp").replace("02:4d:4f:00:00:01", "02:4d"),
                "six hex bytes",
            ),
            (
                file(2, "distributed", false, "udp") + "surprise = 1\n",
                "unknown field",
            ),
            (
                file(2, "distributed", false, "udp").replace("n1", "n0"),
                "unique",
            ),
            (
                "ethertype = 5\n".to_string() + &file(1, "distributed", false, "udp"),
                "length",
            ),
        ];
        for (text, want) in cases {
            let e = SanFile::parse(&text).expect_err(&text);
            assert!(e.0.contains(want), "want '{want}' in: {e}\n{text}");
        }
        // Garbage never panics.
        for text in ["", "[[node]]", "topology = 3", "\u{0}\u{1}", "node = []"] {
            assert!(SanFile::parse(text).is_err());
        }
    }
}
