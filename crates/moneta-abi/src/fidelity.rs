//! The verdict on an emulator result (issue 21; README "moneta bench"):
//! whether the host kept the model's timing (DESIGN "One model, two
//! clocks": the simulator's timing with real bytes), and why not.
//!
//! A request is *behind* by the time from its model completion until it
//! was delivered (to its client for a benchmark; posted by the device for
//! the daemon's own counters). A result is faithful when requests are
//! behind, on average, by at most [`BEHIND_FRACTION`] of the modeled
//! latency or [`BEHIND_FLOOR_NS`], whichever is larger. Otherwise the
//! verdict names the likely reason: more runnable threads than cores (a
//! thread waited for one), or a host too slow for the model. One rule for
//! `moneta bench`, `moneta stats` and every benchmark that reports it.

/// The share of the modeled latency a request may be behind (the
/// project's fidelity target, issue 23: within 10%).
pub const BEHIND_FRACTION: f64 = 0.10;
/// Below this nothing is resolvable here: a few cross-core hops (120–600 ns
/// each on this machine's vCPUs).
pub const BEHIND_FLOOR_NS: f64 = 2_000.0;

/// The verdict: (faithful, text).
pub fn judge(behind_ns: f64, modeled_ns: f64, runnable: f64, cores: usize) -> (bool, String) {
    judge_of(
        "requests were, on average,",
        behind_ns,
        modeled_ns,
        runnable,
        cores,
    )
}

/// [`judge`] of a whole run rather than of its requests: `what` names it
/// in the text ("the sort was").
pub fn judge_of(
    what: &str,
    behind_ns: f64,
    modeled_ns: f64,
    runnable: f64,
    cores: usize,
) -> (bool, String) {
    let limit_ns = (modeled_ns * BEHIND_FRACTION).max(BEHIND_FLOOR_NS);
    if behind_ns <= limit_ns {
        return (true, "faithful".into());
    }
    let text = if runnable > cores as f64 {
        format!(
            "not faithful: {runnable:.1} runnable threads on {cores} cores on average, so \
             threads waited for a core; {what} {:.1} µs behind the model's time \
             (limit {:.1} µs)",
            behind_ns / 1e3,
            limit_ns / 1e3
        )
    } else {
        format!(
            "not faithful: {what} {:.1} µs behind the model's time (limit {:.1} µs: \
             {:.0}% of the modeled {:.1} µs); the host did not keep up",
            behind_ns / 1e3,
            limit_ns / 1e3,
            BEHIND_FRACTION * 100.0,
            modeled_ns / 1e3
        )
    };
    (false, text)
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Threads of the whole machine runnable now (`procs_running` of
/// /proc/stat), this one excluded.
pub fn runnable_now() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let n: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("procs_running "))?
        .trim()
        .parse()
        .ok()?;
    Some(n.saturating_sub(1) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_a_tenth_of_the_model_or_the_floor() {
        // 28 µs modeled: 2.8 µs behind is the limit.
        assert!(judge(2_500.0, 28_000.0, 1.0, 2).0);
        let (ok, why) = judge(3_000.0, 28_000.0, 0.5, 2);
        assert!(!ok && why.contains("did not keep up"), "{why}");
        let (ok, why) = judge(300_000.0, 28_000.0, 4.0, 2);
        assert!(!ok && why.contains("runnable threads"), "{why}");
        // A tiny model time: the floor (2 µs) applies.
        assert!(judge(1_900.0, 500.0, 1.0, 2).0);
        // A whole run is named as such.
        let (ok, why) = judge_of("the sort was", 60e6, 43e6, 3.5, 2);
        assert!(!ok && why.contains("the sort was 60000.0 µs"), "{why}");
    }
}
