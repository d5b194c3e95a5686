//! A key-value store whose checkpoints are libnvmm's sync and whose aborted
//! transactions are rollbacks (issue 13 item 3): an open-addressing hash
//! table of 64-byte slots placed directly in a region 16× its DRAM budget.
//! Batches of puts commit (sync) or abort (rollback to the last commit);
//! then the process "crashes" with puts in flight, and the reopened store
//! must equal the model of committed batches exactly.

use nvmm::testkit::{fast_dir, seed_from_env, Rng, TempPath};
use nvmm::{Nvmm, Options};
use std::collections::BTreeMap;

const SLOT: u64 = 64;
const VALUE: usize = 48;

struct Kv<'a> {
    n: &'a Nvmm,
    slots: u64,
}

impl Kv<'_> {
    fn slot_of(&self, key: u64) -> u64 {
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 17) % self.slots
    }
    /// Slot layout: key+1 (0 = empty), length, value bytes.
    fn find(&self, key: u64) -> (u64, bool) {
        let mut s = self.slot_of(key);
        loop {
            let mut head = [0u8; 8];
            self.n.read(s * SLOT, &mut head).unwrap();
            let k = u64::from_le_bytes(head);
            if k == 0 {
                return (s, false);
            }
            if k == key + 1 {
                return (s, true);
            }
            s = (s + 1) % self.slots;
        }
    }
    fn put(&self, key: u64, value: &[u8]) {
        assert!(value.len() <= VALUE);
        let (s, _) = self.find(key);
        let mut slot = [0u8; SLOT as usize];
        slot[0..8].copy_from_slice(&(key + 1).to_le_bytes());
        slot[8..16].copy_from_slice(&(value.len() as u64).to_le_bytes());
        slot[16..16 + value.len()].copy_from_slice(value);
        self.n.write(s * SLOT, &slot).unwrap();
    }
    fn get(&self, key: u64) -> Option<Vec<u8>> {
        let (s, found) = self.find(key);
        if !found {
            return None;
        }
        let mut slot = [0u8; SLOT as usize];
        self.n.read(s * SLOT, &mut slot).unwrap();
        let len = u64::from_le_bytes(slot[8..16].try_into().unwrap()) as usize;
        Some(slot[16..16 + len].to_vec())
    }
}

#[test]
fn checkpoints_are_syncs_and_aborts_are_rollbacks() {
    let seed = seed_from_env("NVMM_TEST_SEED");
    println!("seed {seed}");
    let mut rng = Rng::new(seed);
    let file = TempPath::new(fast_dir(), "kv");
    let region = 8 << 20;
    let mut o = Options::new(512 << 10);
    o.ways = 8;
    let mut committed: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    {
        let n = Nvmm::open_with(file.path(), region, o).unwrap();
        let kv = Kv {
            n: &n,
            slots: region / SLOT,
        };
        let mut checkpoint = n.sync().unwrap();
        for batch in 0..60 {
            let mut pending = committed.clone();
            for _ in 0..100 {
                let key = rng.below(20_000);
                let value: Vec<u8> = (0..1 + rng.below(VALUE as u64))
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                kv.put(key, &value);
                pending.insert(key, value);
            }
            if batch % 5 == 4 {
                n.rollback(checkpoint).unwrap(); // abort
                checkpoint = n.last_token().unwrap();
            } else {
                checkpoint = n.sync().unwrap(); // commit
                committed = pending;
            }
        }
        for (k, v) in committed.iter().take(500) {
            assert_eq!(kv.get(*k).as_ref(), Some(v), "seed {seed}: key {k}");
        }
        // Puts after the last checkpoint, then a crash (drop, no close).
        for key in 0..300 {
            kv.put(key, b"in flight");
        }
        println!("{:?}", n.stats());
    }
    let n = Nvmm::open(file.path(), 0, 512 << 10).unwrap();
    let kv = Kv {
        n: &n,
        slots: region / SLOT,
    };
    for key in 0..20_000 {
        assert_eq!(
            kv.get(key),
            committed.get(&key).cloned(),
            "seed {seed}: key {key} after the crash"
        );
    }
    n.close().unwrap();
}
