//! End-to-end tests of `moneta san up`, `status` and `down`: real network
//! namespaces, veth links, a bridge and a monetad per node. They need root
//! (CI has it). Each test uses its own SAN name and removes everything in a
//! guard, even when it fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn moneta(args: &[&str]) -> Output {
    common::moneta().args(args).output().expect("moneta runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[track_caller]
fn ok(o: &Output) -> String {
    common::ok(o.clone(), "moneta")
}

#[track_caller]
fn refused(o: &Output, needle: &str) {
    let err = text(&o.stderr);
    assert!(!o.status.success(), "accepted: {}", text(&o.stdout));
    assert!(err.contains(needle), "expected '{needle}' in: {err}");
}

use common::root;

/// A SAN name unique to this test and process; `down --purge` on drop.
struct San(String);

impl San {
    fn new(tag: &str) -> San {
        San(format!("{tag}{}", std::process::id() % 100_000))
    }
    fn dir(&self) -> PathBuf {
        PathBuf::from(format!("/run/moneta/san-{}", self.0))
    }
    fn status(&self) -> serde_json::Value {
        let out = ok(&moneta(&[
            "san", "status", "--name", &self.0, "--format", "json",
        ]));
        let rows: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
        rows[0].clone()
    }
    fn socket(&self, node: u16) -> String {
        self.dir()
            .join(format!("n{node}/monetad.sock"))
            .display()
            .to_string()
    }
    fn netns(&self, node: u16) -> String {
        format!("moneta-{}-n{node}", self.0)
    }
    /// Nothing of this SAN is left in the kernel or in /proc.
    #[track_caller]
    fn assert_gone(&self) {
        for i in 0..8 {
            assert!(
                !Path::new("/run/netns").join(self.netns(i)).exists(),
                "namespace {} left",
                self.netns(i)
            );
            let link = format!("/sys/class/net/ms-{}-{i}", self.0);
            assert!(!Path::new(&link).exists(), "{link} left");
        }
        let bridge = format!("/sys/class/net/msb-{}", self.0);
        assert!(!Path::new(&bridge).exists(), "{bridge} left");
        let dir = self.dir().display().to_string();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
                let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                assert!(
                    !(cmd.contains(" serve ") && cmd.contains(&dir)),
                    "a daemon of the SAN is still running: {cmd}"
                );
            }
        }
    }
}

impl Drop for San {
    fn drop(&mut self) {
        let _ = moneta(&["san", "down", "--name", &self.0, "--purge"]);
    }
}

/// Send `bytes` over UDP from node `from` to node `to` (inside their
/// namespaces, through the bridge) and return what arrived.
fn udp_across(san: &San, from: u16, to: u16, bytes: usize) -> String {
    let to_ip = format!("10.77.0.{}", to + 1);
    let receiver = Command::new("ip")
        .args([
            "netns",
            "exec",
            &san.netns(to),
            "timeout",
            "10",
            "python3",
            "-c",
        ])
        .arg(format!(
            "import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.bind(('{to_ip}',7799))\nprint('ready',flush=True)\n\
             d,a=s.recvfrom(65536)\nprint(len(d),a[0])"
        ))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 in the namespace");
    std::thread::sleep(std::time::Duration::from_millis(500));
    let send = Command::new("ip")
        .args(["netns", "exec", &san.netns(from), "python3", "-c"])
        .arg(format!(
            "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
             s.sendto(b'q'*{bytes},('{to_ip}',7799))"
        ))
        .output()
        .expect("python3 sends");
    assert!(send.status.success(), "{}", text(&send.stderr));
    let out = receiver.wait_with_output().unwrap();
    text(&out.stdout)
}

#[test]
fn a_mirrored_san_of_three_comes_up_serves_each_host_and_goes_away() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let san = San::new("a");
    let out = ok(&moneta(&[
        "san", "up", "--nodes", "3", "--mirror", "--size", "64M", "--name", &san.0,
    ]));
    assert!(out.contains("3 nodes"), "{out}");
    let s = san.status();
    assert_eq!(s["state"], "up", "{s:#}");
    assert_eq!(s["mirror"], true);
    // Three 64 MiB SSDs, each half primary, half replica: 96 MiB global.
    assert_eq!(s["global_bytes"], 96u64 << 20);
    assert_eq!(s["nodes"].as_array().unwrap().len(), 3);
    // The SAN file every daemon read is the one up wrote.
    let file = std::fs::read_to_string(san.dir().join("san.toml")).unwrap();
    assert_eq!(file.matches("[[node]]").count(), 3, "{file}");
    let log = std::fs::read_to_string(san.dir().join("n1/monetad.log")).unwrap();
    assert!(
        log.contains("SAN node 1 (n1) of 3") && log.contains("primary of global slice 1"),
        "{log}"
    );

    // The switch carries a jumbo frame between two hosts' namespaces.
    let got = udp_across(&san, 0, 2, 8300);
    assert!(got.contains("8300 10.77.0.1"), "{got}");

    // Each host's daemon serves its own device.
    let bench = ok(&moneta(&[
        "bench",
        "--daemon",
        &san.socket(1),
        "--op",
        "write",
        "--size",
        "4096",
        "--duration-ms",
        "200",
        "--format",
        "json",
    ]));
    let b: serde_json::Value = serde_json::from_str(&bench).unwrap();
    assert!(b["ops"].as_u64().unwrap_or(0) > 0, "{b:#}");

    // A node's daemon dies: status says so.
    let pid = s["nodes"][2]["pid"].as_u64().unwrap() as i32;
    // SAFETY: kill(2) of the daemon this test's SAN started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    std::thread::sleep(std::time::Duration::from_millis(300));
    let s = san.status();
    assert_eq!(s["state"], "degraded", "{s:#}");
    assert_eq!(s["nodes"][2]["daemon_alive"], false);
    assert_eq!(s["nodes"][0]["daemon_alive"], true);

    // A second up of the same name is refused while it is up.
    refused(
        &moneta(&[
            "san", "up", "--nodes", "2", "--size", "64M", "--name", &san.0,
        ]),
        "up already",
    );

    let out = ok(&moneta(&["san", "down", "--name", &san.0]));
    assert!(out.contains("images kept"), "{out}");
    san.assert_gone();
    assert!(san.dir().join("n0/device.img").exists());
    assert_eq!(san.status()["state"], "down");

    // Up again on the kept images, then down with --purge.
    ok(&moneta(&[
        "san", "up", "--nodes", "3", "--mirror", "--size", "64M", "--name", &san.0,
    ]));
    assert_eq!(san.status()["state"], "up");
    ok(&moneta(&["san", "down", "--name", &san.0, "--purge"]));
    san.assert_gone();
    assert!(!san.dir().exists());
    let out = ok(&moneta(&["san", "down", "--name", &san.0]));
    assert!(out.contains("nothing was running"), "{out}");
}

#[test]
fn down_cleans_up_after_a_crash_that_lost_the_state() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let san = San::new("b");
    ok(&moneta(&[
        "san",
        "up",
        "--nodes",
        "2",
        "--transport",
        "udp",
        "--size",
        "32M",
        "--name",
        &san.0,
    ]));
    // As if up had crashed before writing its state.
    std::fs::remove_file(san.dir().join("state.json")).unwrap();
    ok(&moneta(&["san", "down", "--name", &san.0]));
    san.assert_gone();
    // And up finds such leftovers itself.
    ok(&moneta(&[
        "san", "up", "--nodes", "2", "--size", "32M", "--name", &san.0,
    ]));
    std::fs::remove_file(san.dir().join("state.json")).unwrap();
    ok(&moneta(&[
        "san", "up", "--nodes", "2", "--size", "32M", "--name", &san.0,
    ]));
    assert_eq!(san.status()["state"], "up");
    ok(&moneta(&["san", "down", "--name", &san.0, "--purge"]));
    san.assert_gone();
}

#[test]
fn bad_requests_are_refused_and_leave_nothing() {
    if !root() {
        eprintln!("skipped: needs root");
        return;
    }
    let san = San::new("c");
    let cases: [(&[&str], &str); 5] = [
        (&["--size", "100M"], "power of two"),
        (&["--size", "32M", "--nodes", "0"], "--nodes 0"),
        (
            &["--size", "32M", "--topology", "centralized", "--mirror"],
            "mirroring",
        ),
        (&["--size", "32M", "--preset", "nosuch"], "nosuch"),
        (
            &["--size", "32M", "--set", "memory.technology=nosuch"],
            "nosuch",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["san", "up", "--name", &san.0];
        args.extend_from_slice(extra);
        refused(&moneta(&args), needle);
        san.assert_gone();
        assert!(
            !san.dir().join("state.json").exists(),
            "state left after {extra:?}"
        );
    }
    refused(&moneta(&["san", "up", "--name", "Bad_Name"]), "a-z and 0-9");
    refused(&moneta(&["san", "down", "--name", "x/../y"]), "a-z and 0-9");
}
