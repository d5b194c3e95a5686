//! NBD speed against nbdkit, in one run (issue 11 item 5).
//!
//! fio's own nbd engine (libnbd, no shim) reads random 4 KiB blocks over a
//! Unix socket, at queue depth 1 and 16, from two servers of the same size:
//! monetad's NBD export of a `null` device (zero modeled latency: what is
//! left is the transport and the emulator's software) and nbdkit's `memory`
//! plugin (a RAM disk). The sides alternate over several rounds; the median
//! round of each is reported. Targets: lower mean latency at QD1 and more
//! IOPS at QD16 than nbdkit.
//!
//! `cargo bench -p moneta-nbd --bench nbd` (`-- --smoke` for the short CI
//! run, `-- --json PATH` to write the results, `-- --completion M` for the
//! device's completion signal: dma (the default), forwarding or issue-sleep).
//!
//! The device's verdict (`moneta_abi::fidelity`, issue 21) follows the
//! table: were completions posted on their model time over the whole run,
//! and if not, why; `faithful`/`verdict` in the JSON, a warning on stderr.

use moneta::bench::{verdict, BenchOptions};
use moneta::CompletionMode;
use moneta_emu::control::ControlPlane;
use moneta_emu::engine::{Engine, EngineOptions};
use moneta_emu::medium::Medium;
use moneta_model::config::Config;
use moneta_nbd::{Export, Listen, NbdServer};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SIZE: u64 = 256 << 20;

struct Kit(Child);
impl Drop for Kit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// (IOPS, mean latency µs) of fio random 4 KiB reads at `depth`.
fn fio(uri: &str, depth: u32, seconds: u32) -> Result<(f64, f64), String> {
    let out = Command::new("timeout")
        .arg(format!("{}", seconds + 60))
        .args([
            "fio",
            "--name=nbd",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randread",
            "--bs=4k",
            &format!("--size={SIZE}"),
            &format!("--iodepth={depth}"),
            "--time_based",
            &format!("--runtime={seconds}"),
            "--ramp_time=1",
            "--output-format=json",
        ])
        .output()
        .map_err(|e| format!("fio: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let start = text.find('{').ok_or_else(|| {
        format!(
            "fio printed no JSON: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    let v: serde_json::Value =
        serde_json::from_str(&text[start..]).map_err(|e| format!("fio JSON: {e}"))?;
    let read = &v["jobs"][0]["read"];
    if v["jobs"][0]["error"] != 0 {
        return Err(format!("fio error {}", v["jobs"][0]["error"]));
    }
    Ok((
        read["iops"].as_f64().unwrap_or(0.0),
        read["lat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1e3,
    ))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), String> {
    let options = BenchOptions::from_args();
    let args: Vec<String> = std::env::args().collect();
    let completion = args
        .iter()
        .position(|a| a == "--completion")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(CompletionMode::Dma), |m| {
            CompletionMode::parse(m)
                .ok_or(format!("--completion {m}: dma, forwarding or issue-sleep"))
        })?;
    let idle_spin_us: u64 = args
        .iter()
        .position(|a| a == "--idle-spin-us")
        .and_then(|i| args.get(i + 1))
        .map_or(Ok(2000), |v| {
            v.parse().map_err(|_| format!("--idle-spin-us {v}"))
        })?;
    let (rounds, seconds) = if options.smoke { (1, 1) } else { (3, 3) };
    let dir = std::env::temp_dir().join(format!("moneta-nbd-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let ours = dir.join("moneta.sock");
    let theirs = dir.join("nbdkit.sock");

    let mut config = Config::preset("null").map_err(|e| e.to_string())?;
    config.device.capacity_bytes = SIZE;
    let medium = Medium::anonymous(SIZE).map_err(|e| e.to_string())?;
    let engine = Arc::new(
        Engine::start(
            config,
            medium,
            EngineOptions {
                idle_spin_ns: idle_spin_us * 1000,
                ..EngineOptions::default()
            },
        )
        .map_err(|e| e.to_string())?,
    );
    // SAFETY: geteuid has no preconditions.
    let plane = Arc::new(ControlPlane::new(engine.clone(), unsafe {
        libc::geteuid()
    }));
    let export = Export::parse("moneta", SIZE)?;
    let mut server = NbdServer::bind(plane, vec![export], &[Listen::Unix(ours.clone())])?;
    server.completion = completion;
    let stop = Arc::new(AtomicBool::new(false));
    let kit = Kit(Command::new("nbdkit")
        .args(["-f", "--exit-with-parent", "--unix"])
        .arg(&theirs)
        .args(["memory", &format!("{SIZE}")])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("nbdkit: {e} (make setup installs it)"))?);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !theirs.exists() {
        if Instant::now() > deadline {
            return Err("nbdkit did not start".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let uris = [
        ("monetad null", moneta_nbd::unix_uri("moneta", &ours)),
        ("nbdkit memory", moneta_nbd::unix_uri("", &theirs)),
    ];
    let result = std::thread::scope(|scope| -> Result<serde_json::Value, String> {
        scope.spawn(|| server.run(&stop));
        let mut rows = Vec::new();
        for depth in [1u32, 16] {
            let mut iops = [Vec::new(), Vec::new()];
            let mut lat = [Vec::new(), Vec::new()];
            for round in 0..rounds {
                // Alternate which side goes first.
                for k in 0..2 {
                    let side = (k + round) % 2;
                    let (i, l) = fio(&uris[side].1, depth, seconds)?;
                    iops[side].push(i);
                    lat[side].push(l);
                }
            }
            let m = |v: &Vec<f64>| median(v.clone());
            rows.push((depth, m(&iops[0]), m(&lat[0]), m(&iops[1]), m(&lat[1])));
        }
        stop.store(true, Ordering::Release);
        println!(
            "NBD 4 KiB random reads over a Unix socket, fio --ioengine=nbd, median of {rounds} round(s) of {seconds} s; completions signalled by {}",
            completion.name()
        );
        println!(
            "{:>5} {:>14} {:>12} {:>14} {:>12}",
            "depth", "monetad IOPS", "mean µs", "nbdkit IOPS", "mean µs"
        );
        for &(d, i0, l0, i1, l1) in &rows {
            println!("{d:>5} {i0:>14.0} {l0:>12.1} {i1:>14.0} {l1:>12.1}");
        }
        let (_, _, qd1_ours, _, qd1_kit) = rows[0];
        let (_, qd16_ours, _, qd16_kit, _) = rows[1];
        println!(
            "QD1 latency: monetad {qd1_ours:.1} µs vs nbdkit {qd1_kit:.1} µs ({:.2}×): {}",
            qd1_ours / qd1_kit,
            verdict(qd1_ours < qd1_kit)
        );
        println!(
            "QD16 IOPS: monetad {qd16_ours:.0} vs nbdkit {qd16_kit:.0} ({:.2}×): {}",
            qd16_ours / qd16_kit,
            verdict(qd16_ours > qd16_kit)
        );
        // The device's verdict (moneta_abi::fidelity, issue 21): were its
        // completions posted on model time, over the whole run?
        let device = engine.stats().map_err(|e| e.to_string())?;
        println!("device: {}", device.verdict);
        if !device.faithful {
            eprintln!("nbd bench: warning: {}", device.verdict);
        }
        Ok(serde_json::json!({
            "faithful": device.faithful,
            "verdict": device.verdict,
            "lateness_ns_mean": device.lateness_ns_mean,
            "lateness_ns_p99": device.lateness_ns_p99,
            "accept_delay_ns_mean": device.accept_delay_ns_mean,
            "accept_delay_ns_p99": device.accept_delay_ns_p99,
            "completion": completion.name(),
            "rounds": rounds,
            "seconds": seconds,
            "points": rows.iter().map(|&(d, i0, l0, i1, l1)| serde_json::json!({
                "queue_depth": d,
                "monetad_iops": i0, "monetad_latency_us_mean": l0,
                "nbdkit_iops": i1, "nbdkit_latency_us_mean": l1,
            })).collect::<Vec<_>>(),
            "qd1_latency_met": qd1_ours < qd1_kit,
            "qd16_iops_met": qd16_ours > qd16_kit,
        }))
    });
    drop(kit);
    let _ = std::fs::remove_dir_all(&dir);
    let result = result?;
    if let Some(path) = &options.json {
        std::fs::write(path, serde_json::to_string_pretty(&result).expect("json"))
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}
