//! GUPS and MMAP-style random reads in Rust, on libnvmm or on plain mmap(2)
//! of a file (issue 13 item 3; the twin of examples/nvmm/gups.c, same
//! arguments, same workload, same output line, so the checksums agree).
//!
//!   nvmm-gups nvmm|mmap|mmap-random FILE TABLE_BYTES DRAM_BYTES OPS SEED gups|randread

use moneta_model::kernel::rng::splitmix64 as splitmix;
use nvmm::Nvmm;
use std::ffi::CString;
use std::time::Instant;

enum Table {
    Nvmm(Nvmm),
    Mmap {
        ptr: *mut u64,
        len: usize,
        fd: libc::c_int,
    },
}

impl Table {
    fn ptr(&self) -> *mut u64 {
        match self {
            Table::Nvmm(n) => n.as_ptr().cast(),
            Table::Mmap { ptr, .. } => *ptr,
        }
    }
    fn sync(&self) -> Result<(), String> {
        match self {
            Table::Nvmm(n) => n.sync().map(|_| ()).map_err(|e| e.to_string()),
            Table::Mmap { ptr, len, .. } => {
                // SAFETY: msync of our own mapping.
                if unsafe { libc::msync(ptr.cast(), *len, libc::MS_SYNC) } != 0 {
                    return Err(format!("msync: {}", std::io::Error::last_os_error()));
                }
                Ok(())
            }
        }
    }
}

fn main() {
    if let Err(e) = run() {
        eprintln!("nvmm-gups: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), String> {
    let a: Vec<String> = std::env::args().collect();
    if a.len() != 8 {
        return Err("usage: nvmm-gups nvmm|mmap|mmap-random FILE TABLE_BYTES DRAM_BYTES OPS SEED gups|randread".into());
    }
    let num = |s: &str| s.parse::<u64>().map_err(|e| format!("{s}: {e}"));
    let (mode, path, kind) = (a[1].as_str(), a[2].as_str(), a[7].as_str());
    let (table_bytes, dram, ops, seed) = (num(&a[3])?, num(&a[4])?, num(&a[5])?, num(&a[6])?);
    let gups = kind == "gups";
    let table = if mode == "nvmm" {
        Table::Nvmm(Nvmm::open(path, table_bytes, dram).map_err(|e| e.to_string())?)
    } else {
        let c = CString::new(path).map_err(|e| e.to_string())?;
        // SAFETY: open/ftruncate/mmap with checked results; the mapping is ours.
        unsafe {
            let fd = libc::open(
                c.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC,
                0o600,
            );
            if fd < 0 || libc::ftruncate(fd, table_bytes as libc::off_t) != 0 {
                return Err(format!(
                    "open/ftruncate {path}: {}",
                    std::io::Error::last_os_error()
                ));
            }
            let p = libc::mmap(
                std::ptr::null_mut(),
                table_bytes as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            if p == libc::MAP_FAILED {
                return Err(format!("mmap: {}", std::io::Error::last_os_error()));
            }
            if mode == "mmap-random" {
                libc::madvise(p, table_bytes as usize, libc::MADV_RANDOM);
            }
            Table::Mmap {
                ptr: p.cast(),
                len: table_bytes as usize,
                fd,
            }
        }
    };
    let words = table_bytes / 8;
    let t = table.ptr();
    let t0 = Instant::now();
    for i in 0..words {
        // SAFETY: i < words, inside the mapping.
        unsafe { t.add(i as usize).write_volatile(i) };
    }
    table.sync()?;
    let t1 = Instant::now();
    let (mut s, mut sum) = (seed, 0u64);
    for _ in 0..ops {
        let r = splitmix(&mut s);
        // SAFETY: the index is reduced modulo the table's words.
        unsafe {
            let w = t.add(((r >> 3) % words) as usize);
            if gups {
                w.write_volatile(w.read_volatile() ^ r);
            } else {
                sum = sum.wrapping_add(w.read_volatile());
            }
        }
    }
    let t2 = Instant::now();
    if gups {
        table.sync()?;
    }
    let t3 = Instant::now();
    if gups {
        s = seed;
        for _ in 0..ops.min(2000) {
            // SAFETY: as above.
            sum ^= unsafe {
                t.add(((splitmix(&mut s) >> 3) % words) as usize)
                    .read_volatile()
            };
        }
    }
    println!(
        "program=rust mode={mode} kind={kind} table_bytes={table_bytes} dram_bytes={dram} ops={ops} init_s={:.4} ops_s={:.4} sync_s={:.4} ops_per_s={:.0} checksum={sum}",
        (t1 - t0).as_secs_f64(),
        (t2 - t1).as_secs_f64(),
        (t3 - t2).as_secs_f64(),
        ops as f64 / (t3 - t1).as_secs_f64()
    );
    match table {
        Table::Nvmm(n) => {
            n.close().map_err(|e| e.to_string())?;
        }
        Table::Mmap { ptr, len, fd } => {
            // SAFETY: unmapping our own mapping; closing our descriptor.
            unsafe {
                libc::munmap(ptr.cast(), len);
                libc::close(fd);
            }
        }
    }
    Ok(())
}
