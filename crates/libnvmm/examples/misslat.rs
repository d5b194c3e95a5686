use nvmm::{Nvmm, Options};
use std::time::Instant;
fn main() {
    let dir = std::env::args().nth(1).unwrap_or("/tmp".into());
    let region: u64 = std::env::args()
        .nth(2)
        .map_or(64 << 20, |s| s.parse().unwrap());
    let dram: u64 = std::env::args()
        .nth(3)
        .map_or(1 << 20, |s| s.parse().unwrap());
    let ways: usize = std::env::args().nth(4).map_or(16, |s| s.parse().unwrap());
    let t = nvmm::testkit::TempPath::new(&dir, "misslat");
    let mut o = Options::new(dram);
    o.ways = ways;
    let n = Nvmm::open_with(t.path(), region, o).unwrap();
    let p = n.as_ptr();
    let mut rng = nvmm::testkit::Rng::new(1);
    for phase in 0..3 {
        let mut lat = vec![];
        let t1 = Instant::now();
        for _ in 0..4000u64 {
            let off = rng.below(region / 8) * 8;
            let t0 = Instant::now();
            unsafe { std::ptr::write_volatile(p.add(off as usize) as *mut u64, 5) };
            lat.push(t0.elapsed().as_nanos() as u64);
        }
        let total = t1.elapsed();
        lat.sort();
        println!(
            "phase {phase}: total {:?} median {} p90 {} p99 {} max {}",
            total, lat[2000], lat[3600], lat[3960], lat[3999]
        );
    }
    println!("{:?}", n.stats());
}
