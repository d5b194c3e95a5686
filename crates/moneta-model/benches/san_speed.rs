//! How fast the SAN simulates (issue 10, item 5): a 16-node distributed
//! QuickSAN (one SSD per host, one global space) where every device keeps
//! 32 random 4 KB requests (half reads, half writes) in flight to the other
//! nodes' memory. Target: at least 1 M remote requests simulated per
//! wall-clock second on one core.
//!
//! `cargo bench -p moneta-model --bench san_speed` (add `-- --smoke` for
//! the short CI run).

use moneta_model::config::Config;
use moneta_model::kernel::Rng;
use moneta_model::san::ids::DeviceId;
use moneta_model::san::system::{San, SanConfig, SanEvent, SanRequest, Topology};
use moneta_model::units::{Ns, Op};
use std::time::Instant;

const NODES: u16 = 16;
const DEPTH: u64 = 32;
const REQUEST_BYTES: u64 = 4096;
const TARGET_PER_S: f64 = 1e6;

/// A random 4 KB request from `device` to memory on another node.
fn remote_request(rng: &mut Rng, token: u64, device: u16, slice_bytes: u64) -> SanRequest {
    let other = (device + 1 + rng.below(u64::from(NODES) - 1) as u16) % NODES;
    let offset = rng.below(slice_bytes / REQUEST_BYTES) * REQUEST_BYTES;
    SanRequest {
        token,
        op: if rng.below(2) == 0 {
            Op::Read
        } else {
            Op::Write
        },
        addr: u64::from(other) * slice_bytes + offset,
        len_bytes: REQUEST_BYTES,
        protection_ns: 0,
    }
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--smoke");
    let total: u64 = if smoke { 300_000 } else { 3_000_000 };
    let seed = 1;
    let config = SanConfig {
        device: Config::preset("quicksan-ssd").expect("preset"),
        topology: Topology::Distributed { nodes: NODES },
        mirroring: false,
    };
    println!(
        "san_speed: {NODES} nodes distributed, {DEPTH} × 4 KB remote requests in flight per device, \
         50% reads, {total} requests, seed {seed}"
    );
    let mut san = San::new(&config, seed).expect("SAN");
    let slice_bytes = san.capacity_bytes() / u64::from(NODES);
    let mut rng = Rng::new(seed);
    let mut token = 0;
    for d in 0..NODES {
        for _ in 0..DEPTH {
            let r = remote_request(&mut rng, token, d, slice_bytes);
            san.submit(0, DeviceId(d), r).expect("valid request");
            token += 1;
        }
    }
    let mut finished: Vec<(DeviceId, Ns, u64)> = Vec::new();
    let mut completed = 0u64;
    let mut remote_bytes = 0u64;
    let mut events = 0u64;
    let mut last_ns = 0;
    let start = Instant::now();
    while completed < total {
        let Some(t) = san.next_event_time() else {
            break;
        };
        events += san.deliver_due(t, |e| {
            if let SanEvent::Completed {
                device,
                time_ns,
                remote_bytes,
                ..
            } = e
            {
                finished.push((device, time_ns, remote_bytes));
            }
        });
        for (device, time_ns, bytes) in finished.drain(..) {
            completed += 1;
            remote_bytes += bytes;
            last_ns = time_ns;
            let r = remote_request(&mut rng, token, device.0, slice_bytes);
            san.submit(time_ns, device, r).expect("valid request");
            token += 1;
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let per_s = completed as f64 / wall_s;
    let counters = san.counters(last_ns);
    println!(
        "simulated {completed} requests ({:.1} GB remote) in {:.3} ms of model time: \
         {:.2} M requests/s simulated, {:.0} k remote IOPS per node",
        remote_bytes as f64 / 1e9,
        last_ns as f64 / 1e6,
        completed as f64 / (last_ns as f64 * 1e-9) / 1e6,
        completed as f64 / (last_ns as f64 * 1e-9) / f64::from(NODES) / 1e3
    );
    println!(
        "{events} model events, {} packets, {} pauses, max receive buffer {} B",
        counters.packets, counters.pauses, counters.max_rx_buffer_bytes
    );
    println!(
        "speed: {:.2} M remote requests per wall-clock second ({:.0} ns each, {:.0} ns per event); \
         target {:.1} M: {}",
        per_s / 1e6,
        wall_s * 1e9 / completed as f64,
        wall_s * 1e9 / events as f64,
        TARGET_PER_S / 1e6,
        if per_s >= TARGET_PER_S { "met" } else { "NOT met" }
    );
}
