//! Every published "A beats B" of the seeds (`moneta_model::orderings`):
//! stack order, completion techniques, synchronous against asynchronous IO,
//! Moneta-D against Moneta + FS, QuickSAN-D against iSCSI at every size,
//! NVMM's prefetch on and off, NVMM against its SSD baseline. Each must
//! hold, except the documented inversions, which must still be inverted
//! (so README's list cannot go stale). Seed 1, as `moneta calibrate`.

use moneta_model::orderings::{all, known_inversion, KNOWN_INVERSIONS};

#[test]
fn published_orderings_hold_or_are_documented_inversions() {
    let orderings = all();
    for (name, _) in KNOWN_INVERSIONS {
        assert!(
            orderings.iter().any(|o| o.name == *name),
            "known inversion '{name}' names no ordering"
        );
    }
    let mut problems = Vec::new();
    for o in &orderings {
        let known = known_inversion(&o.name).is_some();
        let verdict = match (o.holds(), known) {
            (true, false) => "holds",
            (false, true) => "KNOWN INVERSION",
            (false, false) => "INVERTED",
            (true, true) => "NOW HOLDS (remove it from KNOWN_INVERSIONS)",
        };
        println!(
            "{:<70} winner {:>12.2} loser {:>12.2} {:<12} {:>6.2}×  {verdict}",
            o.name,
            o.winner,
            o.loser,
            o.unit,
            o.ratio()
        );
        if o.holds() == known {
            problems.push(format!("{}: {verdict}", o.name));
        }
    }
    let inverted = orderings.iter().filter(|o| !o.holds()).count();
    println!(
        "{} published orderings, {} hold, {inverted} inverted",
        orderings.len(),
        orderings.len() - inverted
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
