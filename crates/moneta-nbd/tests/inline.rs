//! NBD requests run to completion on the reactor that turns the export's
//! device (issue 21 item 1): however many connections transmit, the server
//! adds no thread per connection, and the bytes are the device's own: what
//! NBD clients write, a local client reads back through its channel, and
//! the other way round, while both write at once.
//!
//! Its own test binary, so the threads it counts are its server's only.
//! Random data from a printed seed (`MONETA_NBD_SEED` replays it).

mod common;

use common::*;
use moneta_nbd::proto;
use std::time::Duration;

/// This process's threads whose name starts with `prefix`.
fn threads_named(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

#[test]
fn nbd_requests_run_on_the_devices_reactor_and_share_its_bytes() {
    const CLIENTS: usize = 8;
    // Each NBD client owns a 1 MiB range; the local channel client the
    // range after them.
    const RANGE: u64 = MIB;
    let seed = seed();
    let s = Server::start(null(16 * MIB), &["moneta"]);
    let mut clients: Vec<Client> = (0..CLIENTS)
        .map(|_| Client::connect(&s.socket, "moneta"))
        .collect();
    // Negotiation threads end at GO. The kernel keeps 15 bytes of a
    // thread's name: "moneta-nbd-hello" reads back as "moneta-nbd-hell"
    // (waiting for the full name waited for nothing, and a negotiation
    // thread still on its way out was counted below).
    wait_until(Duration::from_secs(10), || {
        threads_named("moneta-nbd-hell").is_empty()
    })
    .expect("negotiation threads still running 10 s after GO");
    let nbd_threads = threads_named("moneta-nbd");
    eprintln!("{CLIENTS} connections transmitting; NBD threads: {nbd_threads:?}");
    // The helper and the watcher, however many connections.
    assert_eq!(nbd_threads.len(), 2, "{nbd_threads:?}");
    assert!(
        threads_named("moneta-device").len() == 1,
        "one reactor turns the device and the connections"
    );

    let local = moneta::attach(&s.plane, None).unwrap();
    let local_at = CLIENTS as u64 * RANGE;
    local.grant_raw(0, 16 * MIB, true).unwrap();
    let local_data = Rng((seed ^ 0x10ca1) | 1).bytes(RANGE as usize);
    let written: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let writers: Vec<_> = clients
            .iter_mut()
            .enumerate()
            .map(|(i, c)| {
                scope.spawn(move || {
                    let mut rng = Rng((seed ^ ((i as u64 + 1) << 32)) | 1);
                    let mut mine = vec![0u8; RANGE as usize];
                    // Pipelined writes of 4 KiB to 256 KiB (more than a
                    // piece), 16 at a time, replies matched by cookie.
                    let mut at = 0u64;
                    let mut cookie = 0u64;
                    while at < RANGE {
                        let mut out = Vec::new();
                        while out.len() < 16 && at < RANGE {
                            let len = ((rng.next() % 64 + 1) * 4096).min(RANGE - at);
                            let data = rng.bytes(len as usize);
                            mine[at as usize..(at + len) as usize].copy_from_slice(&data);
                            let offset = i as u64 * RANGE + at;
                            c.request(proto::CMD_WRITE, 0, cookie, offset, len as u32, &data);
                            out.push(cookie);
                            cookie += 1;
                            at += len;
                        }
                        for _ in 0..out.len() {
                            let (k, error, _) = c.reply();
                            assert_eq!(error, 0, "client {i}: write {k}");
                            out.retain(|&o| o != k);
                        }
                        assert!(out.is_empty(), "client {i}: unanswered {out:?}");
                    }
                    mine
                })
            })
            .collect();
        // Meanwhile a local client writes through its channel.
        local.write(local_at, &local_data).unwrap();
        writers.into_iter().map(|w| w.join().unwrap()).collect()
    });

    // What NBD wrote, read through the channel.
    for (i, mine) in written.iter().enumerate() {
        let mut back = vec![0u8; RANGE as usize];
        local.read(i as u64 * RANGE, &mut back).unwrap();
        assert!(back == *mine, "client {i}'s bytes through the channel");
    }
    // What the channel wrote, read over NBD by every client at once (one
    // 1 MiB read each: eight pieces in flight).
    std::thread::scope(|scope| {
        for (i, c) in clients.iter_mut().enumerate() {
            let local_data = &local_data;
            scope.spawn(move || {
                c.request(proto::CMD_READ, 0, 7, local_at, RANGE as u32, &[]);
                let (cookie, error, data) = c.reply();
                assert_eq!((cookie, error), (7, 0), "client {i}");
                assert!(
                    data == *local_data,
                    "client {i}: the channel's bytes over NBD"
                );
            });
        }
    });
    // And a client reads another's range (connections share the device).
    let (first, rest) = clients.split_at_mut(1);
    rest[0].request(proto::CMD_READ, 0, 8, 0, RANGE as u32, &[]);
    assert!(rest[0].reply().2 == written[0]);
    first[0].request(proto::CMD_DISC, 0, 9, 0, 0, &[]);
    eprintln!("seed {seed}: {CLIENTS} NBD clients and a channel client agree");
}
