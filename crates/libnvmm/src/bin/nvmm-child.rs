//! Helper program of libnvmm's tests (SPEC §7 crash consistency and
//! permissions), run as a child process so that it can be SIGKILLed or die
//! of SIGSEGV:
//!
//! - `nvmm-child crash PATH SEED`: open the crash-test region, then forever
//!   apply iteration k = last token + 1 of the seeded workload, sync, and
//!   print "k" (the completed token) on stdout before going on.
//! - `nvmm-child store-readonly PATH`: store into page 0, which the test
//!   made read-only; the MMU must kill this process with SIGSEGV.

use nvmm::testkit::{crash_iteration, CRASH_DRAM_BYTES, CRASH_REGION_BYTES, CRASH_WAYS};
use nvmm::{Nvmm, Options};
use std::io::Write;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let result = match args.get(1).map(String::as_str) {
        Some("crash") if args.len() == 4 => crash(&args[2], args[3].parse().unwrap_or(0)),
        Some("store-readonly") if args.len() == 3 => store_readonly(&args[2]),
        _ => Err("usage: nvmm-child crash PATH SEED | store-readonly PATH".to_string()),
    };
    if let Err(e) = result {
        eprintln!("nvmm-child: {e}");
        std::process::exit(2);
    }
}

fn crash(path: &str, seed: u64) -> Result<(), String> {
    let mut o = Options::new(CRASH_DRAM_BYTES);
    o.ways = CRASH_WAYS;
    let n = Nvmm::open_with(path, CRASH_REGION_BYTES, o).map_err(|e| e.to_string())?;
    let mut k = n.last_token().map_err(|e| e.to_string())?;
    let stdout = std::io::stdout();
    loop {
        k += 1;
        for (off, bytes) in crash_iteration(seed, k) {
            n.write(off, &bytes).map_err(|e| e.to_string())?;
        }
        let token = n.sync().map_err(|e| e.to_string())?;
        if token != k {
            return Err(format!("sync returned token {token}, expected {k}"));
        }
        let mut out = stdout.lock();
        writeln!(out, "{k}").map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
    }
}

fn store_readonly(path: &str) -> Result<(), String> {
    let n = Nvmm::open(path, 0, 1 << 20).map_err(|e| e.to_string())?;
    let mut b = [0u8; 1];
    n.read(0, &mut b).map_err(|e| e.to_string())?;
    println!("read {} from the read-only page", b[0]);
    std::io::stdout().flush().ok();
    // The store that must fault.
    n.write(0, &[b[0].wrapping_add(1)])
        .map_err(|e| e.to_string())?;
    Err("a store to a read-only page succeeded".into())
}
