//! What a device reports about itself: the body of the control protocol's
//! `stats` reply (`control::Response::Stats`; `moneta stats`, the
//! benchmarks' device counters). The daemon fills these in: the device
//! thread ([`EngineStats`]), the control plane's file grants
//! ([`FileTableStats`]) and a SAN node's port ([`PortStats`]); clients only
//! read them. [`ClientStats`] are one client's share (`moneta stats --run`,
//! `moneta run`'s report): the requests of the channels of one run.

use std::collections::BTreeMap;

/// What the device thread has done so far.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineStats {
    pub channels_open: u32,
    /// Turns of the device thread's polling loop (turns / time = how often
    /// it looks at the channels and the clock).
    pub polls: u64,
    pub requests_completed: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    /// Requests refused, by result code.
    pub errors: BTreeMap<String, u64>,
    /// Polls that left commands waiting because no physical tag was free.
    pub retag_stalls: u64,
    /// Polls that skipped a channel whose errors the kernel role has not yet
    /// forwarded (a client flooding the device with bad commands).
    pub error_queue_stalls: u64,
    /// Times a SAN node held a command (instead of failing it) while a
    /// failover was decided (`engine/liveness.rs`).
    #[serde(default)]
    pub held: u64,
    pub interrupts: u64,
    pub permission_records_in_use: u32,
    pub permission_installs: u64,
    pub permission_merges: u64,
    pub permission_evictions: u64,
    pub permission_lookups: u64,
    /// Mean tree steps per protection check, and its modeled time.
    pub lookup_steps_mean: f64,
    pub lookup_ns_mean: f64,
    pub lookup_steps_max: u32,
    /// How long after its model time each completion was posted.
    pub lateness_ns_mean: f64,
    pub lateness_ns_p99: f64,
    pub lateness_ns_max: u64,
    /// How long after its client stamped it each command was taken (the
    /// poll period, the hop between cores, a nap's wake-up): not device time.
    #[serde(default)]
    pub accept_delay_ns_mean: f64,
    #[serde(default)]
    pub accept_delay_ns_p99: f64,
    /// Commands whose stamp was clamped (in the future, or before time the
    /// device had already modeled).
    #[serde(default)]
    pub stamps_clamped: u64,
    /// Times the device thread napped on the doorbell.
    #[serde(default)]
    pub naps: u64,
    /// Where the device's time went (SPEC §2.1): requests completed and the
    /// mean modeled µs per component from accepting each to its model
    /// completion time (`moneta_model::breakdown`).
    #[serde(default)]
    pub device_time_requests: u64,
    #[serde(default)]
    pub device_time_us: Vec<(String, f64)>,
    /// Model time the device thread has reached (ns since the engine started).
    pub model_time_ns: u64,
    /// The control plane's file grants (filled in by the control plane).
    #[serde(default)]
    pub files: FileTableStats,
    /// Whether completions were posted at their model time ([`crate::fidelity`]:
    /// behind = posted after the model time, against the mean modeled
    /// device time); empty before the first request.
    #[serde(default)]
    pub faithful: bool,
    #[serde(default)]
    pub verdict: String,
    /// What guards the watched file system's granted blocks (README,
    /// "Direct-path contract"); empty before a file system is watched.
    #[serde(default)]
    pub guard: String,
    /// A SAN node's network port.
    #[serde(default)]
    pub san: Option<PortStats>,
    /// The client a `stats` request asked about (`run` or `channel`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<ClientStats>,
}

/// One operation's requests a client's channels completed on the device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OpStats {
    pub requests: u64,
    pub bytes: u64,
    /// Modeled device time (accepted until model completion), summed, and
    /// the largest.
    pub device_ns_sum: u64,
    pub device_ns_max: u64,
    /// Posted after the model time (the daemon side of the verdict).
    pub lateness_ns_sum: u64,
    pub lateness_ns_max: u64,
}

impl OpStats {
    pub fn record(&mut self, bytes: u64, device_ns: u64, lateness_ns: u64) {
        self.requests += 1;
        self.bytes += bytes;
        self.device_ns_sum = self.device_ns_sum.saturating_add(device_ns);
        self.device_ns_max = self.device_ns_max.max(device_ns);
        self.lateness_ns_sum = self.lateness_ns_sum.saturating_add(lateness_ns);
        self.lateness_ns_max = self.lateness_ns_max.max(lateness_ns);
    }

    pub fn merge(&mut self, o: &OpStats) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.device_ns_sum = self.device_ns_sum.saturating_add(o.device_ns_sum);
        self.device_ns_max = self.device_ns_max.max(o.device_ns_max);
        self.lateness_ns_sum = self.lateness_ns_sum.saturating_add(o.lateness_ns_sum);
        self.lateness_ns_max = self.lateness_ns_max.max(o.lateness_ns_max);
    }

    pub fn device_ns_mean(&self) -> f64 {
        self.device_ns_sum as f64 / self.requests.max(1) as f64
    }

    pub fn lateness_ns_mean(&self) -> f64 {
        self.lateness_ns_sum as f64 / self.requests.max(1) as f64
    }
}

/// What one client's channels did on the device: per channel while it is
/// open (the device thread keeps it), and per run (the control plane folds
/// in every channel of the run's connections as they end).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ClientStats {
    /// The run id the connections gave at hello (`MONETA_RUN_ID`), if any.
    #[serde(default)]
    pub run: Option<String>,
    /// Connections counted, and of them still open.
    pub connections: u64,
    pub open: u64,
    pub read: OpStats,
    pub write: OpStats,
    /// Requests the device refused (any result code but ok).
    pub refused: u64,
    /// The verdict on the device side (`fidelity::judge`: lateness against
    /// the modeled device time); empty before the first request.
    #[serde(default)]
    pub faithful: bool,
    #[serde(default)]
    pub verdict: String,
}

impl ClientStats {
    pub fn merge(&mut self, o: &ClientStats) {
        self.connections += o.connections;
        self.open += o.open;
        self.read.merge(&o.read);
        self.write.merge(&o.write);
        self.refused += o.refused;
    }

    /// Both operations together.
    pub fn total(&self) -> OpStats {
        let mut t = self.read;
        t.merge(&self.write);
        t
    }

    /// Fill in the verdict from the counters.
    pub fn judge(&mut self, runnable: f64, cores: usize) {
        let t = self.total();
        if t.requests == 0 {
            (self.faithful, self.verdict) = (true, String::new());
            return;
        }
        (self.faithful, self.verdict) =
            crate::fidelity::judge(t.lateness_ns_mean(), t.device_ns_mean(), runnable, cores);
    }
}

/// Statistics for `moneta stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileTableStats {
    pub files_open: u64,
    pub inodes_held: u64,
    pub inodes_mapped: u64,
    pub inodes_watched: u64,
    /// Whether the kernel reports layout changes (fanotify pre-content).
    pub layout_watch: bool,
    pub kernel_events: u64,
    pub kernel_event_handler_ns_max: u64,
    pub layout_changes: u64,
    pub revocations: u64,
    /// Opens for writing by processes outside the shim (or loop devices)
    /// that sent a held file to the kernel path.
    pub foreign_writers: u64,
    /// Inodes on the kernel path now because of such a writer.
    pub inodes_foreign_written: u64,
    /// Reads through the kernel of held files (each revokes what it may
    /// cache and drops stale cached pages first).
    pub kernel_reads: u64,
    /// Times stale clean pages of a held file were dropped before the
    /// kernel used its cache.
    pub cache_drops: u64,
    /// Soft misses that granted nothing because the page cache held pages
    /// of the range it could not drop (mapped, locked or dirtied meanwhile).
    pub grants_refused_cached: u64,
    /// Soft misses that made unwritten extents growth grants, and the
    /// bytes zeroed on the medium for them (moneta-emu `growth`).
    #[serde(default)]
    pub growth_grants: u64,
    #[serde(default)]
    pub growth_bytes: u64,
    /// Settlings of growth grants (their data written through the kernel,
    /// the extents made written), and the bytes settled.
    #[serde(default)]
    pub growth_settles: u64,
    #[serde(default)]
    pub growth_settled_bytes: u64,
    /// Holes the daemon had the file system allocate for a direct write
    /// (`allocate-file`), and the bytes asked for.
    #[serde(default)]
    pub growth_allocations: u64,
    #[serde(default)]
    pub growth_allocated_bytes: u64,
    /// Whether the file systems' block-free tracepoints guard the mount
    /// (free_watch.rs): every freed block is revoked before reuse.
    #[serde(default)]
    pub block_free_guard: bool,
    /// Block frees reported on watched file systems.
    #[serde(default)]
    pub block_frees: u64,
    /// Of them, frees of blocks some channel was granted (each revoked).
    #[serde(default)]
    pub block_free_revocations: u64,
    /// Device turns that took no command while a free was being applied.
    #[serde(default)]
    pub free_fence_stalls: u64,
    /// Passes over /proc (who else has a file open or mapped): at a file's
    /// first registration, and rechecks of a file sent to the kernel path
    /// by an outside opener; and their wall time.
    #[serde(default)]
    pub proc_scans: u64,
    #[serde(default)]
    pub proc_rechecks: u64,
    #[serde(default)]
    pub proc_scan_us: u64,
}

/// What the port has done (`EngineStats::san`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PortStats {
    pub node: u16,
    pub packets_sent: u64,
    pub packets_received: u64,
    pub payload_bytes_sent: u64,
    pub payload_bytes_received: u64,
    /// Packets the wire would not take (the peer failed) or whose segment
    /// had already given up on them.
    pub packets_dropped: u64,
    /// Turns a packet waited because its peer's window was full.
    pub window_waits: u64,
    /// Arrivals left on the wire for a turn because the receive packet
    /// buffer was full.
    pub rx_buffer_waits: u64,
    pub peer_failures: u64,
    /// Peers by node index: "up", "connecting" or "failed".
    pub peers: Vec<(u16, String)>,
    /// Bytes of mirrored copies waiting for a failed peer (resync).
    pub dirty_bytes: u64,
    /// Granules resynced to partners that came back.
    pub resync_granules: u64,
    /// Partners this node reads shared copies from until they say it is
    /// in sync (it started, or restarted).
    pub unsynced_partners: Vec<u16>,
    /// Saving the dirty map failed (the error), if it did.
    pub dirty_save_error: Option<String>,
    /// Mirror partners that missed writes here while this node missed
    /// writes there (both wrote degraded: a partition with writers on both
    /// sides). Neither side resyncs the other automatically.
    pub split_brain_peers: Vec<u16>,
    /// Per mirrored slice this node holds a copy of: its state (issue 22).
    #[serde(default)]
    pub slices: Vec<SliceStatus>,
    /// Requests refused for want of an up-to-date copy, and the last one
    /// (which slice, whose copy, why).
    #[serde(default)]
    pub refusals: u64,
    #[serde(default)]
    pub last_refusal: Option<String>,
    /// Durable appends of the dirty map (one fdatasync each) and their
    /// total time.
    #[serde(default)]
    pub dirty_flushes: u64,
    #[serde(default)]
    pub dirty_flush_ns: u64,
    pub retransmits: u64,
    pub crc_errors: u64,
    pub pauses_sent: u64,
    pub pauses_received: u64,
    /// Frames authenticated under the SAN's secret (`moneta_wire::auth`).
    #[serde(default)]
    pub authenticated: bool,
    /// Frames dropped: no valid tag; authentic but replayed; a peer's newer
    /// epoch past the rate limit.
    #[serde(default)]
    pub unauthenticated: u64,
    #[serde(default)]
    pub replayed: u64,
    #[serde(default)]
    pub epoch_changes_limited: u64,
}

/// The state of this node's copy of one mirrored slice (`moneta san status`).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SliceStatus {
    pub slice: u32,
    /// The other holder.
    pub partner: u16,
    /// `ReplicaState::as_str`: up-to-date, outdated, inconsistent, split-brain.
    pub state: String,
    /// The wire's session with the partner is up.
    pub partner_up: bool,
    /// Granules the partner misses here (this copy resyncs them to it).
    pub to_send: u64,
    /// As a resync target: granules the partner said this copy missed,
    /// and resync writes received since.
    pub to_receive: u64,
    pub received: u64,
}
