//! The backend's request path on descriptor chains a guest could place:
//! well-formed ones move the right bytes; random, malformed tables (bad
//! addresses, lengths, flags, loops, indirect tables, headers) never
//! panic, never reach past the device or guest memory, and are answered
//! with an error status or a zero used length.

use moneta_vhost::blk::{self, Malformed, Scratch, Target};
use std::cell::RefCell;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const NEXT: u16 = 1;
const WRITE: u16 = 2;
const INDIRECT: u16 = 4;

/// A device of `bytes.len()` bytes that fails the test if a request
/// reaches past its end.
struct VecTarget {
    bytes: RefCell<Vec<u8>>,
    read_only: bool,
}

impl VecTarget {
    fn new(len: usize) -> VecTarget {
        VecTarget {
            bytes: RefCell::new(vec![0u8; len]),
            read_only: false,
        }
    }
}

impl Target for VecTarget {
    fn capacity_bytes(&self) -> u64 {
        self.bytes.borrow().len() as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        let b = self.bytes.borrow();
        let end = addr as usize + buf.len();
        assert!(end <= b.len(), "read past the device: {addr}+{}", buf.len());
        buf.copy_from_slice(&b[addr as usize..end]);
        Ok(())
    }
    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), String> {
        assert!(!self.read_only, "a write reached a read-only device");
        let mut b = self.bytes.borrow_mut();
        let end = addr as usize + buf.len();
        assert!(
            end <= b.len(),
            "write past the device: {addr}+{}",
            buf.len()
        );
        b[addr as usize..end].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Guest memory with a hole: [0, 512 KiB) and [1 MiB, 1.5 MiB).
fn memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[
        (GuestAddress(0), 0x8_0000),
        (GuestAddress(0x10_0000), 0x8_0000),
    ])
    .expect("guest memory")
}

fn header(mem: &GuestMemoryMmap, at: u64, kind: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&kind.to_le_bytes());
    h[8..16].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(at)).expect("header");
}

fn d(addr: u64, len: u32, flags: u16) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, flags, 0))
}

/// Serve one chain built of `descs` (NEXT links set by the mock).
fn serve_one(
    mem: &GuestMemoryMmap,
    target: &VecTarget,
    descs: &[RawDescriptor],
) -> (blk::Served, Option<Malformed>) {
    let queue = MockSplitQueue::new(mem, 16);
    let chain = queue.build_desc_chain(descs).expect("chain");
    blk::serve(mem, chain, target, &mut Scratch::default())
}

fn status(mem: &GuestMemoryMmap, at: u64) -> u8 {
    mem.read_obj::<u8>(GuestAddress(at)).expect("status")
}

#[test]
fn a_write_then_a_read_move_the_same_bytes() {
    let mem = memory();
    let target = VecTarget::new(1 << 20);
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 3) as u8).collect();
    mem.write_slice(&data, GuestAddress(0x2_0000)).unwrap();
    header(&mem, 0x1000, blk::T_OUT, 8);
    let (served, bad) = serve_one(
        &mem,
        &target,
        &[
            d(0x1000, 16, 0),
            d(0x2_0000, 4096, 0),
            // The payload may be split anywhere, across the memory hole too.
            d(0x2_1000, 4096, 0),
            d(0x1100, 1, WRITE),
        ],
    );
    assert_eq!(bad, None);
    assert_eq!(served.status, Some(blk::S_OK));
    assert_eq!(served.used_len, 1);
    assert_eq!(status(&mem, 0x1100), blk::S_OK);
    assert_eq!(&target.bytes.borrow()[4096..4096 + 8192], &data[..]);

    header(&mem, 0x1200, blk::T_IN, 8);
    let (served, bad) = serve_one(
        &mem,
        &target,
        &[
            d(0x1200, 16, 0),
            d(0x7_f000, 4096, WRITE),
            d(0x10_0000, 4097, WRITE),
        ],
    );
    assert_eq!(bad, None);
    assert_eq!(served.used_len, 8193);
    let mut back = vec![0u8; 8192];
    mem.read_slice(&mut back[..4096], GuestAddress(0x7_f000))
        .unwrap();
    mem.read_slice(&mut back[4096..], GuestAddress(0x10_0000))
        .unwrap();
    assert_eq!(back, data);
    assert_eq!(status(&mem, 0x10_1000), blk::S_OK);
}

#[test]
fn write_zeroes_discard_flush_and_read_only_follow_the_spec() {
    let mem = memory();
    let target = VecTarget::new(1 << 20);
    target.bytes.borrow_mut().fill(0xAB);
    // Write zeroes: one segment of 8 sectors at sector 2.
    header(&mem, 0x1000, blk::T_WRITE_ZEROES, 0);
    let mut seg = [0u8; 16];
    seg[0..8].copy_from_slice(&2u64.to_le_bytes());
    seg[8..12].copy_from_slice(&8u32.to_le_bytes());
    mem.write_slice(&seg, GuestAddress(0x1010)).unwrap();
    let (served, bad) = serve_one(&mem, &target, &[d(0x1000, 32, 0), d(0x1100, 1, WRITE)]);
    assert_eq!((served.status, bad), (Some(blk::S_OK), None));
    let b = target.bytes.borrow().clone();
    assert!(b[1024..1024 + 4096].iter().all(|&x| x == 0));
    assert_eq!(b[1023], 0xAB);
    assert_eq!(b[1024 + 4096], 0xAB);
    // A discard past the end is an error; unknown segment flags unsupported.
    seg[0..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
    mem.write_slice(&seg, GuestAddress(0x1010)).unwrap();
    header(&mem, 0x1000, blk::T_DISCARD, 0);
    let (served, bad) = serve_one(&mem, &target, &[d(0x1000, 32, 0), d(0x1100, 1, WRITE)]);
    assert_eq!(
        (served.status, bad),
        (Some(blk::S_IOERR), Some(Malformed::OutOfRange))
    );
    seg[0..8].copy_from_slice(&0u64.to_le_bytes());
    seg[12..16].copy_from_slice(&1u32.to_le_bytes());
    mem.write_slice(&seg, GuestAddress(0x1010)).unwrap();
    let (served, _) = serve_one(&mem, &target, &[d(0x1000, 32, 0), d(0x1100, 1, WRITE)]);
    assert_eq!(served.status, Some(blk::S_UNSUPP));
    header(&mem, 0x1000, blk::T_FLUSH, 0);
    let (served, _) = serve_one(&mem, &target, &[d(0x1000, 16, 0), d(0x1100, 1, WRITE)]);
    assert_eq!(served.status, Some(blk::S_OK));
    // Read-only: a write is refused before it reaches the device.
    let ro = VecTarget {
        bytes: RefCell::new(vec![0u8; 1 << 20]),
        read_only: true,
    };
    header(&mem, 0x1000, blk::T_OUT, 0);
    let (served, _) = serve_one(
        &mem,
        &ro,
        &[d(0x1000, 16, 0), d(0x2000, 512, 0), d(0x1100, 1, WRITE)],
    );
    assert_eq!(served.status, Some(blk::S_IOERR));
}

#[test]
fn malformed_chains_are_errors_for_their_request() {
    let mem = memory();
    let target = VecTarget::new(1 << 20);
    let cases: Vec<(Vec<RawDescriptor>, Malformed)> = vec![
        // Readable after writable.
        (
            vec![
                d(0x1000, 16, 0),
                d(0x2000, 512, WRITE),
                d(0x3000, 512, 0),
                d(0x1100, 1, WRITE),
            ],
            Malformed::ReadableAfterWritable,
        ),
        // A buffer in the memory hole.
        (
            vec![
                d(0x1000, 16, 0),
                d(0x9_0000, 512, WRITE),
                d(0x1100, 1, WRITE),
            ],
            Malformed::OutsideMemory,
        ),
        // A buffer running off the end of a region.
        (
            vec![
                d(0x1000, 16, 0),
                d(0x7_ff00, 512, WRITE),
                d(0x1100, 1, WRITE),
            ],
            Malformed::OutsideMemory,
        ),
        // A short header.
        (
            vec![d(0x1000, 8, 0), d(0x1100, 1, WRITE)],
            Malformed::NoHeader,
        ),
        // A read of part of a sector.
        (
            vec![d(0x1000, 16, 0), d(0x2000, 100, WRITE), d(0x1100, 1, WRITE)],
            Malformed::BadLength,
        ),
    ];
    header(&mem, 0x1000, blk::T_IN, 0);
    for (descs, why) in cases {
        let (served, bad) = serve_one(&mem, &target, &descs);
        assert_eq!(bad, Some(why.clone()), "{why:?}");
        if served.status.is_some() {
            assert_eq!(served.status, Some(blk::S_IOERR));
            assert_eq!(served.used_len, 1);
        }
    }
    // No writable byte: nowhere to put a status; used with length 0.
    let (served, bad) = serve_one(&mem, &target, &[d(0x1000, 16, 0)]);
    assert_eq!((served.status, served.used_len), (None, 0));
    assert_eq!(bad, Some(Malformed::NoStatus));
    // Past the device's end.
    header(&mem, 0x1000, blk::T_IN, (1 << 20) / 512);
    let (_, bad) = serve_one(
        &mem,
        &target,
        &[d(0x1000, 16, 0), d(0x2000, 512, WRITE), d(0x1100, 1, WRITE)],
    );
    assert_eq!(bad, Some(Malformed::OutOfRange));
}

/// The fuzz's seeded generator: the model's one SplitMix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        moneta_model::kernel::rng::splitmix64(&mut self.0)
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[(self.next() % xs.len() as u64) as usize]
    }
}

#[test]
fn random_descriptor_tables_never_panic_or_reach_outside() {
    let seed = std::env::var("MONETA_VHOST_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20261202u64);
    let rounds: u64 = std::env::var("MONETA_VHOST_FUZZ_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3000);
    eprintln!("fuzz seed {seed}, {rounds} rounds");
    let mut rng = Rng(seed);
    let (mut malformed, mut ok, mut served_chains) = (0u64, 0u64, 0u64);
    let addrs = [
        0x1000u64,
        0x2000,
        0x4_0000,
        0x7_fff0,
        0x7_ffff,
        0x8_0000,
        0x9_0000,
        0x10_0000,
        0x17_ff00,
        0x18_0000,
        u64::MAX - 8,
        1 << 40,
    ];
    let lens = [
        0u32,
        1,
        8,
        15,
        16,
        17,
        32,
        511,
        512,
        4096,
        8192,
        1 << 20,
        (1 << 20) + 512,
        u32::MAX,
    ];
    let kinds = [
        blk::T_IN,
        blk::T_OUT,
        blk::T_FLUSH,
        blk::T_GET_ID,
        blk::T_DISCARD,
        blk::T_WRITE_ZEROES,
        99,
        u32::MAX,
    ];
    let target = VecTarget::new(256 << 10);
    let mut scratch = Scratch::default();
    for _ in 0..rounds {
        let mem = memory();
        let size = 16u16;
        let mock = MockSplitQueue::new(&mem, size);
        // Random headers and segments where buffers may point.
        for &a in &addrs[..4] {
            let any = rng.next();
            let sector = rng.pick(&[0u64, 1, 511, 512, u64::MAX / 512, any]);
            header(&mem, a, rng.pick(&kinds), sector);
            let mut seg = [0u8; 16];
            seg[0..8].copy_from_slice(&rng.pick(&[0u64, 7, 1 << 33, u64::MAX]).to_le_bytes());
            seg[8..12].copy_from_slice(&rng.pick(&[0u32, 1, 8, u32::MAX]).to_le_bytes());
            seg[12..16].copy_from_slice(&rng.pick(&[0u32, 1, 2]).to_le_bytes());
            let _ = mem.write_slice(&seg, GuestAddress(a + 16));
        }
        // A random descriptor table: links, loops, indirect flags.
        for i in 0..size {
            let flags = (rng.next() as u16) & (NEXT | WRITE | INDIRECT);
            let next = rng.pick(&[i + 1, i, 0, size - 1, size, u16::MAX]);
            let desc = Descriptor::new(rng.pick(&addrs), rng.pick(&lens), flags, next);
            mock.desc_table()
                .store(i, RawDescriptor::from(desc))
                .unwrap();
        }
        // Some rounds: a well-formed chain at the head of the table.
        if rng.next().is_multiple_of(3) {
            header(&mem, 0x1000, blk::T_OUT, 0);
            for (i, desc) in [
                Descriptor::new(0x1000, 16, NEXT, 1),
                Descriptor::new(0x2000, 512, NEXT, 2),
                Descriptor::new(0x3000, 1, WRITE, 0),
            ]
            .into_iter()
            .enumerate()
            {
                mock.desc_table()
                    .store(i as u16, RawDescriptor::from(desc))
                    .unwrap();
            }
        }
        let heads = 1 + rng.next() % 8;
        for j in 0..heads {
            let head = rng.pick(&[0u16, 1, 5, 15, 16, u16::MAX]);
            mock.avail().ring().ref_at(j as usize).unwrap().store(head);
        }
        mock.avail().idx().store(heads as u16);
        let mut queue: Queue = mock.create_queue().expect("queue");
        while let Some(chain) = queue.pop_descriptor_chain(&mem) {
            let head = chain.head_index();
            let (served, bad) = blk::serve(&mem, chain, &target, &mut scratch);
            served_chains += 1;
            match bad {
                Some(_) => {
                    malformed += 1;
                    assert_ne!(
                        served.status,
                        Some(blk::S_OK),
                        "a malformed chain answered OK"
                    );
                }
                None if served.status == Some(blk::S_OK) => ok += 1,
                None => {}
            }
            // A head outside the table has no used entry (the backend drops it).
            let used = queue.add_used(&mem, head, served.used_len);
            assert_eq!(used.is_ok(), head < size, "head {head}");
        }
    }
    eprintln!("{served_chains} chains: {ok} OK, {malformed} malformed");
    // The fuzz reached both sides of the checks.
    assert!(malformed > rounds / 4, "only {malformed} malformed chains");
    assert!(ok > rounds / 10, "only {ok} well-formed chains served");
}
