//! What `moneta run` reports at the program's exit (README "moneta run",
//! DESIGN "Every run reports what reached the device and what the kernel
//! served, and why"): three independent views of the program's IO on the
//! mount, side by side.
//!
//! - **The device** (the daemon's counters for this run's connections,
//!   `moneta_abi::stats::ClientStats`: every process of the run says the
//!   run id at hello): requests and bytes per operation, the modeled device
//!   time and how late completions were posted, and the verdict on them.
//! - **The shim** (one JSON file per process in a private directory,
//!   `moneta-shim-report/1`, [`ShimReport`]): what each process sent to the
//!   device and to the kernel, and the kernel's reasons with counts.
//! - **The loop device** under the mount (`/sys/block/loopN/stat` before and
//!   after, the file system flushed both times): everything the kernel read
//!   or wrote on the mount, whoever asked.
//!
//! When most of the bytes went through the kernel the report says so
//! loudly: the device's numbers then describe a minority of the run.

use moneta_abi::stats::{ClientStats, OpStats};
use moneta_model::units::format_mib as mib;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The schema tag of the shim's per-process files.
pub const SHIM_SCHEMA: &str = "moneta-shim-report/1";

/// Above this share of the run's bytes served by the kernel, the report
/// warns that the device's figures are not the run's.
pub const BYPASS_WARN_FRACTION: f64 = 0.5;

/// Requests and bytes of one operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub bytes: u64,
}

impl Count {
    fn add(&mut self, o: &Count) {
        self.requests += o.requests;
        self.bytes += o.bytes;
    }
}

/// Per operation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ops {
    #[serde(default)]
    pub read: Count,
    #[serde(default)]
    pub write: Count,
    #[serde(default)]
    pub fsync: Count,
}

impl Ops {
    fn add(&mut self, o: &Ops) {
        self.read.add(&o.read);
        self.write.add(&o.write);
        self.fsync.add(&o.fsync);
    }

    /// Bytes read and written.
    pub fn bytes(&self) -> u64 {
        self.read.bytes + self.write.bytes
    }
}

/// Why the kernel served some of a process's requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reason {
    pub reason: String,
    pub op: String,
    #[serde(default)]
    pub requests: u64,
    #[serde(default)]
    pub bytes: u64,
}

/// One process's file (`shim-<pid>.json`, `shim-<pid>-<n>.json` for the
/// images before an exec).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShimReport {
    pub schema: String,
    pub pid: u32,
    #[serde(default)]
    pub exe: String,
    #[serde(default)]
    pub argv0: String,
    #[serde(default)]
    pub device: Ops,
    #[serde(default)]
    pub kernel: Ops,
    #[serde(default)]
    pub kernel_reasons: Vec<Reason>,
    #[serde(default)]
    pub notes: Vec<String>,
}

/// Parse one shim report; an error value names what is wrong.
pub fn parse_shim_report(text: &str) -> crate::error::Result<ShimReport> {
    use crate::error::Error;
    let r: ShimReport = serde_json::from_str(text).map_err(Error::because)?;
    if r.schema != SHIM_SCHEMA {
        return Err(Error::failed(format!(
            "schema '{}', expected '{SHIM_SCHEMA}'",
            r.schema
        )));
    }
    Ok(r)
}

/// Every `shim-*.json` in `dir`, and what could not be read (a temporary
/// file of an unfinished atomic write is not a report and is skipped).
pub fn read_shim_reports(dir: &Path) -> (Vec<ShimReport>, Vec<String>) {
    let (mut reports, mut problems) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (reports, problems);
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("shim-") && n.ends_with(".json"))
        })
        .collect();
    names.sort();
    for path in names {
        match std::fs::read_to_string(&path)
            .map_err(crate::error::Error::because)
            .and_then(|t| parse_shim_report(&t))
        {
            Ok(r) => reports.push(r),
            Err(e) => problems.push(format!("{}: {e}", path.display())),
        }
    }
    (reports, problems)
}

/// The counters of `/sys/block/<dev>/stat` this report uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BlockStat {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
}

impl BlockStat {
    /// Parse the stat file's fields (Documentation/block/stat.rst: reads
    /// completed, merged, sectors, ticks; writes …; flushes at field 15).
    pub fn parse(text: &str) -> Option<BlockStat> {
        let f: Vec<u64> = text
            .split_whitespace()
            .map(|w| w.parse().ok())
            .collect::<Option<_>>()?;
        if f.len() < 7 {
            return None;
        }
        Some(BlockStat {
            reads: f[0],
            read_bytes: f[2] * 512,
            writes: f[4],
            write_bytes: f[6] * 512,
            flushes: f.get(15).copied().unwrap_or(0),
        })
    }

    pub fn read(device: &Path) -> Option<BlockStat> {
        let name = device.file_name()?.to_str()?;
        let text = std::fs::read_to_string(format!("/sys/block/{name}/stat")).ok()?;
        BlockStat::parse(&text)
    }

    pub fn since(&self, before: &BlockStat) -> BlockStat {
        BlockStat {
            reads: self.reads.saturating_sub(before.reads),
            read_bytes: self.read_bytes.saturating_sub(before.read_bytes),
            writes: self.writes.saturating_sub(before.writes),
            write_bytes: self.write_bytes.saturating_sub(before.write_bytes),
            flushes: self.flushes.saturating_sub(before.flushes),
        }
    }
}

/// One process the report knows of.
#[derive(Debug, Clone, Serialize)]
pub struct Process {
    pub pid: u32,
    pub exe: String,
    /// Whether its shim wrote a report.
    pub reported: bool,
}

/// The whole report (`--report FILE` writes it as JSON).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    pub schema: &'static str,
    pub run_id: String,
    pub command: Vec<String>,
    pub mount: PathBuf,
    /// The program's exit code, or 128 + the signal that killed it.
    pub exit_status: i32,
    pub elapsed_s: f64,
    /// The daemon's counters for this run's connections.
    pub device: ClientStats,
    /// Summed over the shim's reports.
    pub shim_device: Ops,
    pub shim_kernel: Ops,
    /// (reason, op) → counts, summed over the processes.
    pub kernel_reasons: Vec<Reason>,
    pub processes: Vec<Process>,
    pub notes: Vec<String>,
    /// The loop device under the mount, over the run (None: not found).
    pub loop_device: Option<PathBuf>,
    pub kernel_block: Option<BlockStat>,
    /// Bytes monetad wrote through the kernel over the run to settle
    /// growth grants (direct writes into preallocated extents, made
    /// written data): on the loop device, but not the program's IO.
    pub settled_bytes: Option<u64>,
    /// Share of the run's bytes the kernel served (the larger of the
    /// shim's reports' and the loop device's counts), and whether that is
    /// most of them.
    pub kernel_share: Option<f64>,
    pub mostly_bypassed: bool,
    pub faithful: bool,
    pub verdict: String,
}

/// What the run did, put together.
pub struct Inputs<'a> {
    pub run_id: &'a str,
    pub command: &'a [String],
    pub mount: &'a Path,
    pub exit_status: i32,
    pub elapsed_s: f64,
    pub child_pid: u32,
    pub device: ClientStats,
    pub reports: Vec<ShimReport>,
    pub problems: Vec<String>,
    pub loop_device: Option<PathBuf>,
    pub kernel_block: Option<BlockStat>,
    pub settled_bytes: Option<u64>,
}

pub fn build(i: Inputs) -> RunReport {
    let (mut shim_device, mut shim_kernel) = (Ops::default(), Ops::default());
    let mut reasons: BTreeMap<(String, String), Count> = BTreeMap::new();
    let mut notes = i.problems;
    let mut processes = Vec::new();
    for r in &i.reports {
        shim_device.add(&r.device);
        shim_kernel.add(&r.kernel);
        for k in &r.kernel_reasons {
            reasons
                .entry((k.reason.clone(), k.op.clone()))
                .or_default()
                .add(&Count {
                    requests: k.requests,
                    bytes: k.bytes,
                });
        }
        notes.extend(r.notes.iter().map(|n| format!("pid {}: {n}", r.pid)));
        if !processes.iter().any(|p: &Process| p.pid == r.pid) {
            processes.push(Process {
                pid: r.pid,
                exe: r.exe.clone(),
                reported: true,
            });
        }
    }
    if !processes.iter().any(|p| p.pid == i.child_pid) {
        processes.insert(
            0,
            Process {
                pid: i.child_pid,
                exe: i.command[0].clone(),
                reported: false,
            },
        );
        notes.push(format!(
            "pid {} ({}) left no shim report: killed before its exit, not a shim process \
             (statically linked, or LD_PRELOAD cleared), or a shim without reports; the \
             kernel's share below comes from the loop device",
            i.child_pid, i.command[0]
        ));
    }
    let device_bytes = i.device.read.bytes + i.device.write.bytes;
    // The shim's reports see what its processes sent to the kernel; IO past
    // the shim (LD_PRELOAD cleared, a static binary) shows only on the loop
    // device, which also carries the shim's kernel writes back. The larger
    // of the two counts each byte once.
    let from_shim = (!i.reports.is_empty()).then_some(shim_kernel.bytes());
    let settled = i.settled_bytes.unwrap_or(0);
    let from_loop = i
        .kernel_block
        .map(|b| b.read_bytes + b.write_bytes.saturating_sub(settled));
    let kernel_bytes = match (from_shim, from_loop) {
        (Some(s), Some(l)) => Some(s.max(l)),
        (s, l) => s.or(l),
    };
    let kernel_share = kernel_bytes
        .filter(|k| k + device_bytes > 0)
        .map(|k| k as f64 / (k + device_bytes) as f64);
    let mostly_bypassed = kernel_share.is_some_and(|s| s > BYPASS_WARN_FRACTION);
    let (faithful, verdict) = if i.device.total().requests == 0 {
        (
            false,
            "no verdict: the device served none of this run's requests".to_string(),
        )
    } else if mostly_bypassed {
        (
            false,
            format!(
                "not faithful as a measurement of the device: most of the run's bytes were \
                 served by the kernel; the device's own requests: {}",
                i.device.verdict
            ),
        )
    } else {
        (i.device.faithful, i.device.verdict.clone())
    };
    RunReport {
        schema: "moneta-run-report/1",
        run_id: i.run_id.to_string(),
        command: i.command.to_vec(),
        mount: i.mount.to_path_buf(),
        exit_status: i.exit_status,
        elapsed_s: i.elapsed_s,
        device: i.device,
        shim_device,
        shim_kernel,
        kernel_reasons: reasons
            .into_iter()
            .map(|((reason, op), c)| Reason {
                reason,
                op,
                requests: c.requests,
                bytes: c.bytes,
            })
            .collect(),
        processes,
        notes,
        loop_device: i.loop_device,
        kernel_block: i.kernel_block,
        settled_bytes: i.settled_bytes,
        kernel_share,
        mostly_bypassed,
        faithful,
        verdict,
    }
}

fn op_line(label: &str, o: &OpStats) -> String {
    format!(
        "  {label:<6} {:>9} requests {:>12}   model device time mean {:.2} µs (max {:.2}); posted \
         {:.2} µs after it on average (max {:.2})",
        o.requests,
        mib(o.bytes),
        o.device_ns_mean() / 1e3,
        o.device_ns_max as f64 / 1e3,
        o.lateness_ns_mean() / 1e3,
        o.lateness_ns_max as f64 / 1e3
    )
}

/// The report as `moneta run` prints it on stderr.
pub fn render(r: &RunReport) -> String {
    let mut out = Vec::new();
    out.push(format!(
        "moneta run: {} exited with status {} after {:.2} s (run {})",
        r.command.join(" "),
        r.exit_status,
        r.elapsed_s,
        r.run_id
    ));
    if r.mostly_bypassed {
        out.push(format!(
            "moneta run: WARNING: MOST OF THIS RUN'S IO BYPASSED THE DEVICE: {:.0}% of its bytes \
             were served by the kernel; the device's figures below describe the rest",
            r.kernel_share.unwrap_or(0.0) * 100.0
        ));
    }
    let d = &r.device;
    out.push(format!(
        "device (monetad's counters for the run's {} connection(s)):",
        d.connections
    ));
    out.push(op_line("read", &d.read));
    out.push(op_line("write", &d.write));
    if d.refused > 0 {
        out.push(format!("  refused {}", d.refused));
    }
    let reported = r.processes.iter().filter(|p| p.reported).count();
    if reported == 0 {
        out.push("shim: no process wrote a report".to_string());
    } else {
        out.push(format!(
            "shim ({reported} process report(s)): device read {} / {}, write {} / {}, fsync {}; \
             kernel read {} / {}, write {} / {}, fsync {}",
            r.shim_device.read.requests,
            mib(r.shim_device.read.bytes),
            r.shim_device.write.requests,
            mib(r.shim_device.write.bytes),
            r.shim_device.fsync.requests,
            r.shim_kernel.read.requests,
            mib(r.shim_kernel.read.bytes),
            r.shim_kernel.write.requests,
            mib(r.shim_kernel.write.bytes),
            r.shim_kernel.fsync.requests
        ));
        for k in &r.kernel_reasons {
            out.push(format!(
                "  kernel {:<5} {:<22} {:>9} requests {:>12}",
                k.op,
                k.reason,
                k.requests,
                mib(k.bytes)
            ));
        }
    }
    match (&r.loop_device, &r.kernel_block) {
        (Some(dev), Some(b)) => out.push(format!(
            "kernel ({}, every process on the mount): {} reads {}, {} writes {}, {} flushes",
            dev.display(),
            b.reads,
            mib(b.read_bytes),
            b.writes,
            mib(b.write_bytes),
            b.flushes
        )),
        _ => out.push("kernel: the mount's loop device was not found".to_string()),
    }
    if let Some(b) = r.settled_bytes.filter(|&b| b > 0) {
        out.push(format!(
            "  settled: {} of the device's writes into preallocated (unwritten) extents \
             written through the kernel by monetad to make them written data \
             (counted on the loop device above, not in the kernel's share)",
            mib(b)
        ));
    }
    for n in &r.notes {
        out.push(format!("  note: {n}"));
    }
    out.push(format!("verdict: {}", r.verdict));
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"{"schema":"moneta-shim-report/1","pid":1234,"exe":"/usr/bin/fio","argv0":"fio",
      "device":{"read":{"requests":10,"bytes":40960},"write":{"requests":2,"bytes":8192},"fsync":{"requests":1,"bytes":0}},
      "kernel":{"read":{"requests":0,"bytes":0},"write":{"requests":300,"bytes":1228800},"fsync":{"requests":0,"bytes":0}},
      "kernel_reasons":[{"reason":"new-or-growing-file","op":"write","requests":299,"bytes":1224704},
                        {"reason":"io-uring","op":"write","requests":1,"bytes":4096}],
      "notes":["free text"]}"#;

    #[test]
    fn a_shim_report_in_the_schema_parses_and_a_wrong_one_is_an_error() {
        let r = parse_shim_report(FILE).unwrap();
        assert_eq!((r.pid, r.argv0.as_str()), (1234, "fio"));
        assert_eq!(
            r.device.read,
            Count {
                requests: 10,
                bytes: 40960
            }
        );
        assert_eq!(r.kernel.write.requests, 300);
        assert_eq!(r.kernel_reasons[1].reason, "io-uring");
        assert_eq!(r.notes, ["free text"]);
        let other = FILE.replace("moneta-shim-report/1", "moneta-shim-report/9");
        assert!(parse_shim_report(&other)
            .unwrap_err()
            .to_string()
            .contains("schema"));
        assert!(parse_shim_report("{\"pid\":").is_err());
        assert!(parse_shim_report("[]").is_err());
    }

    fn inputs(device: ClientStats, reports: Vec<ShimReport>) -> Inputs<'static> {
        static COMMAND: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
        Inputs {
            run_id: "run-1",
            command: COMMAND.get_or_init(|| vec!["fio".to_string()]),
            mount: Path::new("/mnt/moneta"),
            exit_status: 0,
            elapsed_s: 1.0,
            child_pid: 1234,
            device,
            reports,
            problems: Vec::new(),
            loop_device: Some("/dev/loop7".into()),
            kernel_block: Some(BlockStat {
                writes: 5,
                write_bytes: 1 << 20,
                ..BlockStat::default()
            }),
            settled_bytes: None,
        }
    }

    #[test]
    fn what_monetad_settled_is_not_the_kernels_share() {
        let mut device = ClientStats::default();
        device.write.requests = 256;
        device.write.bytes = 1 << 20;
        let mut i = inputs(device.clone(), Vec::new());
        let plain = build(inputs(device, Vec::new())).kernel_share.unwrap();
        assert!((plain - 0.5).abs() < 1e-9);
        i.settled_bytes = Some(1 << 20);
        let r = build(i);
        assert_eq!(r.kernel_share, Some(0.0));
        assert!(render(&r).contains("settled: 1.0 MiB"), "{}", render(&r));
    }

    #[test]
    fn a_run_mostly_through_the_kernel_says_so_loudly() {
        let mut device = ClientStats::default();
        device.read.record(40960, 4000, 100);
        device.judge(1.0, 2);
        let r = build(inputs(
            device.clone(),
            vec![parse_shim_report(FILE).unwrap()],
        ));
        // 1,228,800 kernel bytes against 40,960 device bytes.
        assert!(r.mostly_bypassed && !r.faithful, "{r:?}");
        assert!((r.kernel_share.unwrap() - 1_228_800.0 / 1_269_760.0).abs() < 1e-9);
        let text = render(&r);
        assert!(
            text.contains("MOST OF THIS RUN'S IO BYPASSED THE DEVICE"),
            "{text}"
        );
        assert!(text.contains("new-or-growing-file"), "{text}");
        assert!(text.contains("note: pid 1234: free text"), "{text}");
        // Without shim reports the loop device's bytes count (1 MiB).
        let r = build(inputs(device, Vec::new()));
        assert!(r.mostly_bypassed, "{r:?}");
        assert!(
            r.notes.iter().any(|n| n.contains("left no shim report")),
            "{r:?}"
        );
    }

    #[test]
    fn a_run_on_the_device_carries_the_devices_verdict() {
        let mut device = ClientStats::default();
        for _ in 0..1000 {
            device.write.record(1 << 20, 60_000, 500);
        }
        device.judge(1.0, 2);
        let r = build(inputs(device, Vec::new()));
        assert!(!r.mostly_bypassed && r.faithful, "{r:?}");
        assert_eq!(r.verdict, "faithful");
        assert!(render(&r).contains("verdict: faithful"));
    }

    #[test]
    fn the_block_stat_file_parses() {
        let text = "    4711        0    37688     1200    16430        0   131440   30234        0    20000    31434        0        0        0        0       12        3\n";
        let b = BlockStat::parse(text).unwrap();
        assert_eq!(
            b,
            BlockStat {
                reads: 4711,
                read_bytes: 37688 * 512,
                writes: 16430,
                write_bytes: 131440 * 512,
                flushes: 12
            }
        );
        assert!(BlockStat::parse("1 2 x").is_none());
    }
}
