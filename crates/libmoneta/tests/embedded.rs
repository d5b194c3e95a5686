//! The emulator end to end in one process: real bytes through channels,
//! every completion mode, misses, and refused requests.

use moneta::{CompletionMode, Moneta};
use moneta_emu::engine::EngineOptions;
use moneta_emu::medium::Medium;
use moneta_model::config::Config;
use moneta_model::units::Op;

fn device(preset: &str, sets: &[&str]) -> Moneta {
    let mut c = Config::preset(preset).unwrap();
    c.device.capacity_bytes = 64 << 20;
    for s in sets {
        c.set(s).unwrap();
    }
    let medium = Medium::anonymous(c.device.capacity_bytes).unwrap();
    moneta::embedded(c, medium, EngineOptions::default()).unwrap()
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn bytes_written_are_read_back_in_every_mode_and_size() {
    let m = device("null", &[]);
    m.grant_raw(0, m.capacity_bytes(), true).unwrap();
    for (i, mode) in [
        CompletionMode::Dma,
        CompletionMode::Forwarding,
        CompletionMode::IssueSleep,
    ]
    .into_iter()
    .enumerate()
    {
        for (j, len) in [1usize, 511, 512, 4096, 16385, 1 << 20, 3 << 20]
            .into_iter()
            .enumerate()
        {
            let addr = 7 + (i * 8 + j) as u64 * (4 << 20) / 3 % (60 << 20);
            let data = pattern(addr ^ len as u64, len);
            m.write_with(addr, &data, mode).unwrap();
            let mut back = vec![0u8; len];
            m.read_with(addr, &mut back, mode).unwrap();
            assert!(back == data, "{mode:?} {len} B at {addr}");
        }
    }
}

#[test]
fn a_write_is_seen_through_another_channel() {
    let a = device("onyx-late", &["device.capacity_bytes=67108864"]);
    a.grant_raw(0, a.capacity_bytes(), true).unwrap();
    a.write(4096, b"shared medium").unwrap();
    let mut b = [0u8; 13];
    a.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"shared medium");
}

#[test]
fn no_grant_means_no_access_and_read_only_means_no_writes() {
    let m = device("null", &[]);
    let mut b = [0u8; 512];
    let e = m.read(0, &mut b).unwrap_err();
    assert!(e.to_string().contains("no read grant"), "{e}");
    m.grant_raw(1 << 20, 1 << 20, false).unwrap();
    m.read(1 << 20, &mut b).unwrap();
    let e = m.write(1 << 20, &b).unwrap_err();
    assert!(e.to_string().contains("write grant"), "{e}");
    let e = m.read((2 << 20) - 1, &mut b).unwrap_err();
    assert!(e.to_string().contains("no read grant"), "{e}");
    assert_eq!(m.misses().0, 3, "each refusal was a soft miss first");
}

#[test]
fn evicted_records_are_hard_misses_that_recover() {
    // A table of 2 records and 8 disjoint grants: records are evicted all
    // the time, and every access still succeeds after re-installing.
    let m = device("null", &["direct.permission_records=2"]);
    for i in 0..8u64 {
        m.grant_raw(i * (4 << 20), 4096, true).unwrap();
    }
    for round in 0..3u64 {
        for i in 0..8u64 {
            let data = pattern(i * 31 + round, 4096);
            m.write(i * (4 << 20), &data).unwrap();
            let mut back = vec![0u8; 4096];
            m.read(i * (4 << 20), &mut back).unwrap();
            assert!(back == data);
        }
    }
    let (_, hard) = m.misses();
    assert!(hard > 0, "no hard misses with 2 records for 8 grants");
    let s = m.stats().unwrap();
    assert!(
        s.permission_evictions > 0 && s.permission_records_in_use <= 2,
        "{s:?}"
    );
}

#[test]
fn asynchronous_requests_overlap_and_use_zero_copy_buffers() {
    let m = device("onyx-late", &["device.capacity_bytes=67108864"]);
    m.grant_raw(0, m.capacity_bytes(), true).unwrap();
    let mut ios = Vec::new();
    for i in 0..32u64 {
        let mut io = m
            .prepare(Op::Write, i * 8192, 4096, CompletionMode::Dma)
            .unwrap();
        m.buffer_mut(&mut io).copy_from_slice(&pattern(i, 4096));
        m.submit(&mut io).unwrap();
        ios.push(io);
    }
    for mut io in ios.drain(..) {
        m.wait(&mut io).unwrap();
        m.release(io);
    }
    for i in 0..32u64 {
        let mut io = m
            .prepare(Op::Read, i * 8192, 4096, CompletionMode::Forwarding)
            .unwrap();
        m.submit(&mut io).unwrap();
        ios.push(io);
    }
    for (i, mut io) in ios.drain(..).enumerate() {
        m.wait(&mut io).unwrap();
        assert!(m.buffer(&io) == pattern(i as u64, 4096).as_slice());
        m.release(io);
    }
    let s = m.stats().unwrap();
    assert_eq!(s.requests_completed, 64);
    assert!(s.interrupts >= 32, "forwarded completions interrupt: {s:?}");
}

#[test]
fn threads_share_a_channel() {
    let m = device("null", &[]);
    m.grant_raw(0, m.capacity_bytes(), true).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let m = m.clone();
            s.spawn(move || {
                let mode = [
                    CompletionMode::Dma,
                    CompletionMode::Forwarding,
                    CompletionMode::IssueSleep,
                    CompletionMode::Dma,
                ][t as usize];
                for i in 0..500u64 {
                    let addr = (t * 1000 + i) * 4096;
                    let data = pattern(addr, 4096);
                    m.write_with(addr, &data, mode).unwrap();
                    let mut back = vec![0u8; 4096];
                    m.read_with(addr, &mut back, mode).unwrap();
                    assert!(back == data, "thread {t} op {i}");
                }
            });
        }
    });
}

#[test]
fn an_image_file_keeps_its_contents_across_restarts() {
    let path = std::env::temp_dir().join(format!("moneta-image-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut c = Config::preset("moneta").unwrap();
    c.device.capacity_bytes = 64 << 20;
    let data = pattern(77, 12345);
    {
        let medium = Medium::image(&path, c.device.capacity_bytes).unwrap();
        let m = moneta::embedded(c.clone(), medium, EngineOptions::default()).unwrap();
        m.grant_raw(0, m.capacity_bytes(), true).unwrap();
        m.write(999_999, &data).unwrap();
    }
    let medium = Medium::image(&path, c.device.capacity_bytes).unwrap();
    let m = moneta::embedded(c, medium, EngineOptions::default()).unwrap();
    m.grant_raw(0, m.capacity_bytes(), false).unwrap();
    let mut back = vec![0u8; data.len()];
    m.read(999_999, &mut back).unwrap();
    drop(m);
    std::fs::remove_file(&path).unwrap();
    assert!(back == data, "the image lost the data");
}

/// An idle device thread naps on the doorbell; a submission rings it, so
/// the request does not wait for the nap to run out (here 30 s: without the
/// ring the read would take that long). The request's stamp is when the
/// client issued it, so the nap is not device time: the next request, on a
/// device that is awake, takes about as long.
#[test]
fn a_napping_device_is_woken_by_the_client() {
    let mut c = Config::preset("moneta").unwrap();
    c.device.capacity_bytes = 64 << 20;
    let medium = Medium::anonymous(c.device.capacity_bytes).unwrap();
    let options = EngineOptions {
        idle_spin_ns: 1_000_000,
        max_nap_ns: 30_000_000_000,
        ..EngineOptions::default()
    };
    let m = moneta::embedded(c, medium, options).unwrap();
    m.grant_raw(0, 64 << 20, true).unwrap();
    let mut buf = vec![0u8; 4096];
    for round in 0..3 {
        // Let the device thread go to sleep.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let naps = m.stats().unwrap().naps;
        while m.stats().unwrap().naps == naps {
            assert!(
                std::time::Instant::now() < deadline,
                "the device never napped"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // Asking for statistics woke it: give it time to nap again.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let t0 = std::time::Instant::now();
        m.read(4096 * round, &mut buf).unwrap();
        let took = t0.elapsed();
        assert!(
            took < std::time::Duration::from_secs(10),
            "round {round}: the read waited {took:?} for the nap to end"
        );
    }
    let s = m.stats().unwrap();
    assert!(s.naps >= 3, "{s:?}");
    assert_eq!(s.requests_completed, 3);
}
